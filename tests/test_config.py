"""Sweep YAML validation: one-line errors naming the file and field, nothing written; the τ-held space."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from collapse_hpo.hpo import cli
from collapse_hpo.hpo.sweep.config import load_sweep, parse_sweep
from collapse_hpo.hpo.sweep.runner import plan_draws
from collapse_hpo.hpo.sweep.space import TauHeldSpace, space_for_sweep, sweep_tau
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.timescale import adamw_tau, optimal_tau

BASE: dict[str, Any] = {
    "name": "t",
    "model": {"width": 16, "depth": 1, "heads": 2, "context": 64},
    "tpp": 20,
    "fixed": {"batch_tokens": 512},
    "space": {"lr": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}},
    "trials": 4,
}


def _with(**changes: Any) -> dict[str, Any]:
    return {**BASE, **changes}


# (document, field named in the message, a phrase of what is allowed / what is wrong)
BAD = {
    "unknown top-level key": (_with(trails=3), "trails", "allowed: name, model"),
    "unknown nested key": (_with(pruner={"min_fracton": 0.2}), "pruner.min_fracton", "allowed: enabled"),
    "unknown distribution key": (
        _with(space={"lr": {"type": "float", "low": 1e-3, "high": 1e-2, "lg": True}}), "space.lr.lg",
        "allowed"),
    "unknown hyperparameter": (
        _with(space={**BASE["space"], "momentum": {"type": "float", "low": 0.8, "high": 0.9}}),
        "space.momentum", "allowed: lr, batch_tokens"),
    "wrong type": (_with(trials="many"), "trials", "valid integer"),
    "wrong type nested": (_with(model={"width": "wide", "depth": 1, "heads": 2}), "model.width", "integer"),
    "out of range": (_with(pruner={"min_fraction": 1.5}), "pruner.min_fraction", "in (0, 1), got 1.5"),
    "negative retries": (_with(retries=-1), "retries", "greater than or equal to 0"),
    "tau not a number": (_with(tau="best"), "tau", "'optimal'"),
    "tau negative": (_with(tau=-0.1), "tau", "positive number"),
    "lambda and tau": (_with(tau=0.1, fixed={"batch_tokens": 512, "weight_decay": 0.1}), "fixed.weight_decay",
                       "both set"),
    "lambda and tau searched": (
        _with(space={**BASE["space"], "tau": {"type": "float", "low": 0.05, "high": 0.5}},
              fixed={"batch_tokens": 512, "weight_decay": 0.1}), "fixed.weight_decay", "both set"),
    "low above high": (_with(space={"lr": {"type": "float", "low": 0.1, "high": 0.01}}), "space.lr",
                       "low <= high"),
    "log with zero low": (_with(space={"lr": {"type": "float", "low": 0.0, "high": 0.1, "log": True}}),
                          "space.lr", "low > 0"),
    "lr missing": (_with(space={}), "lr", "is needed"),
    "tpp and total_tokens": (_with(total_tokens=10_000), "tpp", "exactly one"),
    "neither tpp nor total_tokens": ({k: v for k, v in BASE.items() if k != "tpp"}, "tpp", "exactly one"),
    "total_tokens with tau optimal by default": (
        {**{k: v for k, v in BASE.items() if k != "tpp"}, "total_tokens": 10_000}, "tau",
        "'optimal' (the default) is optimal_tau(tpp) and needs a TPP, but this sweep gives total_tokens"),
    "total_tokens with tau optimal": (
        {**{k: v for k, v in BASE.items() if k != "tpp"}, "total_tokens": 10_000, "tau": "optimal"}, "tau",
        "give tau as a number (fraction of training), null (no weight decay), or weight_decay"),
    "bad schedule": (_with(schedule="cosinee"), "schedule", "linear, cosine"),
    "bad sampler": (_with(sampler={"name": "cmaes"}), "sampler.name", "'random', 'qmc'"),
    "bad reference": (_with(pruner={"reference": {"online": True, "surrogate": "s.json"}}),
                      "pruner.reference", "exactly one"),
    "bad refit": (_with(pruner={"reference": {"online": True, "refit": "later"}}), "pruner.reference.refit",
                  "'background' or 'inline'"),
    "refit of a surrogate": (_with(pruner={"reference": {"surrogate": "s.json", "refit": "inline"}}),
                             "pruner.reference", "'refit' belongs to an 'online: true' reference"),
    "refit growth below 1": (_with(pruner={"reference": {"online": True, "refit_growth": 0.5}}),
                             "pruner.reference.refit_growth", "greater than or equal to 1"),
    "bad storage scheme": (_with(storage="redis://localhost"), "storage", "sqlite:///, postgresql://"),
    "heads do not divide width": (_with(model={"width": 15, "depth": 1, "heads": 2}), "model",
                                  "multiple of heads"),
    "grid over floats": (_with(sampler={"name": "grid"}), "space.lr", "grid sampler"),
    # a misspelled key comes with the required field it was meant to be: the unknown key is named first
    "misspelled nested key of a required field": (
        _with(model={"widht": 16, "depth": 1, "heads": 2, "context": 64}), "model.widht",
        "unknown key; allowed: width, depth, heads"),
    "misspelled top-level key of a required field": (
        {**{k: v for k, v in BASE.items() if k != "model"}, "modle": BASE["model"]}, "modle",
        "unknown key; allowed: name, model"),
    "reference as a string": (_with(pruner={"reference": "onlne"}), "pruner.reference",
                              "write it as a mapping: {online: true}, {surrogate: PATH} or {study: NAME, "
                              "storage: URL}, got 'onlne'; did you mean {online: true}?"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_field_gives_one_line_naming_file_and_field(case: str) -> None:
    doc, field, phrase = BAD[case]
    with pytest.raises(InputError) as info:
        parse_sweep(doc, "studies/x.yaml")
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("studies/x.yaml: field ")
    assert f"'{field}'" in msg
    assert phrase in msg


def test_defaults_and_derived_quantities() -> None:
    sweep = parse_sweep(BASE, "x.yaml")
    assert sweep.tau == "optimal" and sweep.pruner.enabled and sweep.sampler.name == "qmc"
    assert sweep.n_trials == 4 and sweep.planned
    assert sweep.storage_url(Path("/r")) == "sqlite:////r/study.db"
    assert sweep.pruner.reference.kind == "online"
    # λ given with tau: null holds λ, not τ.
    fixed_lambda = parse_sweep(_with(tau=None, fixed={"batch_tokens": 512, "weight_decay": 0.1}), "x.yaml")
    assert sweep_tau(fixed_lambda, 20.0) is None


def test_total_tokens_sweep_has_no_tpp() -> None:
    """A fine-tuning-style sweep gives total_tokens: its TPP is not defined, so τ is a number or not held."""
    from collapse_hpo.hpo.sweep.space import sweep_total_tokens
    from collapse_hpo.hpo.sweep.trial import train_config

    no_tpp = {k: v for k, v in BASE.items() if k != "tpp"}
    for extra, tau in (({"tau": 0.2}, 0.2), ({"tau": None}, None),
                       ({"fixed": {"batch_tokens": 512, "weight_decay": 0.1}}, None)):
        sweep = parse_sweep({**no_tpp, "total_tokens": 20_480, **extra}, "x.yaml")
        total, tpp, _n = sweep_total_tokens(sweep)
        assert (total, tpp) == (20_480, None)
        assert space_for_sweep(sweep).tau == tau
        _config, derived = train_config(sweep, {"lr": 0.01}, seed=0)
        assert derived["tpp"] is None and derived["total_tokens"] == 20_480
        if tau is not None:
            assert derived["tau"] == pytest.approx(tau)
    with pytest.raises(InputError, match="needs a TPP"):
        sweep_tau(parse_sweep({**no_tpp, "total_tokens": 20_480, "tau": 0.2}, "x.yaml").model_copy(
            update={"tau": "optimal"}), None)
    # A sweep with tpp records the trainer's D/N, as before.
    _config, derived = train_config(parse_sweep(BASE, "x.yaml"), {"lr": 0.01}, seed=0)
    assert derived["tpp"] == pytest.approx(20, rel=0.05)


def test_grid_sampler_counts_points() -> None:
    sweep = parse_sweep(_with(sampler={"name": "grid"}, trials=None, space={
        "lr": {"type": "categorical", "choices": [0.01, 0.02, 0.04]},
        "batch_tokens": {"type": "categorical", "choices": [512, 1024]}}, fixed={}), "x.yaml")
    assert sweep.n_draws == 6
    draws = plan_draws(sweep)
    assert len(draws) == 6 and {d["batch_tokens"] for d in draws} == {512, 1024}
    with pytest.raises(InputError, match="'trials': the grid has 6 points"):
        parse_sweep(_with(sampler={"name": "grid"}, trials=5, space={
            "lr": {"type": "categorical", "choices": [0.01, 0.02, 0.04]},
            "batch_tokens": {"type": "categorical", "choices": [512, 1024]}}, fixed={}), "x.yaml")


def test_plan_is_seeded_and_reproducible() -> None:
    a = plan_draws(parse_sweep(_with(trials=6), "x.yaml"))
    b = plan_draws(parse_sweep(_with(trials=6), "x.yaml"))
    c = plan_draws(parse_sweep(_with(trials=6, sampler={"name": "qmc", "seed": 1}), "x.yaml"))
    assert a == b and a != c
    assert len({d["lr"] for d in a}) == 6 and all(1e-3 <= d["lr"] <= 1e-1 for d in a)


def test_space_holds_tau_for_every_draw() -> None:
    batch = {"type": "categorical", "choices": [512, 1024]}
    sweep = parse_sweep(_with(space={"lr": BASE["space"]["lr"], "batch_tokens": batch}, fixed={}), "x.yaml")
    space = space_for_sweep(sweep)
    assert space.tau is not None
    taus = []
    for lr in (1e-3, 1e-2, 1e-1):
        for b in (512, 1024):
            hp = space.derive({"lr": lr, "batch_tokens": b})
            taus.append(adamw_tau(b, lr, hp["weight_decay"], space.total_tokens))
    assert max(taus) == pytest.approx(min(taus)) == pytest.approx(space.tau)


def test_space_in_a_plain_optuna_objective() -> None:
    space = TauHeldSpace({"lr": optuna.distributions.FloatDistribution(1e-3, 1e-1, log=True)},
                         fixed={"batch_tokens": 2048}, tau=optimal_tau(20.0), total_tokens=1_000_000)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: space.suggest(t)["weight_decay"], n_trials=5)
    for t in study.trials:
        tau = adamw_tau(2048, t.params["lr"], t.user_attrs["weight_decay"], 1_000_000)
        assert tau == pytest.approx(optimal_tau(20.0))
        assert t.user_attrs["tau"] == pytest.approx(tau)
    with pytest.raises(InputError, match="both set"):
        TauHeldSpace({}, fixed={"lr": 0.01, "batch_tokens": 512, "weight_decay": 0.1}, tau=0.1,
                     total_tokens=10)


def test_no_tau_means_fixed_lambda_and_its_timescale() -> None:
    space = TauHeldSpace({}, fixed={"lr": 0.01, "batch_tokens": 512, "weight_decay": 0.0}, tau=None,
                         total_tokens=10_000)
    assert space.derive({})["tau"] is None
    space = TauHeldSpace({}, fixed={"lr": 0.01, "batch_tokens": 512, "weight_decay": 0.5}, tau=None,
                         total_tokens=10_000)
    assert space.derive({})["tau"] == pytest.approx(512 / (0.01 * 0.5 * 10_000))
    assert math.isfinite(space.derive({})["tau"])


def test_load_sweep_file_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="sweep file not found"):
        load_sweep(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(InputError, match=r"bad.yaml: not valid YAML at line \d+"):
        load_sweep(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(InputError, match="empty"):
        load_sweep(empty)
    ok = tmp_path / "ok.yaml"
    ok.write_text(yaml.safe_dump(BASE))
    assert load_sweep(ok).source == str(ok)


def _run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(argv)
    err = capsys.readouterr().err
    return code, err


def _write(tmp: Path, doc: dict[str, Any]) -> Path:
    p = tmp / "sweep.yaml"
    p.write_text(yaml.safe_dump({**doc, "results": str(tmp / "results")}))
    return p


@pytest.mark.parametrize("command", ["run", "resume", "report"])
def test_cli_bad_file_exits_2_with_one_line_and_writes_nothing(tmp_path: Path, command: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    cases = {
        "unknown key": (_with(trails=3), "field 'trails'"),
        "wrong type": (_with(trials="many"), "field 'trials'"),
        "out of range": (_with(pruner={"confidence": 2.0}), "field 'pruner.confidence'"),
        "unknown comparison": (_with(pruner={"comparison": "pairs"}), "field 'pruner.comparison'"),
        "lambda and tau": (_with(tau=0.1, fixed={"batch_tokens": 512, "weight_decay": 0.1}),
                           "field 'fixed.weight_decay'"),
        "unreachable storage": (_with(storage="postgresql://postgres@127.0.0.1:9/none"), "field 'storage'"),
        "sqlite folder missing": (_with(storage=f"sqlite:///{tmp_path}/nope/x.db"), "field 'storage'"),
        "missing surrogate": (_with(pruner={"reference": {"surrogate": "nope.json"}}),
                              "field 'pruner.reference'"),
        "misspelled model key": (_with(model={"widht": 16, "depth": 1, "heads": 2, "context": 64}),
                                 "field 'model.widht': unknown key; allowed: width"),
    }
    if command == "report":  # report trains nothing: the pruner's reference is not needed to read results
        del cases["missing surrogate"]
    for name, (doc, field) in cases.items():
        path = _write(tmp_path, doc)
        code, err = _run_cli([command, str(path)], capsys)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert code == 2, name
        assert len(lines) == 1, (name, err)
        assert str(path) in lines[0] and field in lines[0], (name, lines[0])
        assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.yaml"], name
    code, err = _run_cli([command, str(tmp_path / "missing.yaml")], capsys)
    assert code == 2 and "missing.yaml: sweep file not found" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.yaml"]


def test_pruner_comparison_reaches_the_pruner() -> None:
    from collapse_hpo.hpo.sweep.trial import build_pruner

    assert parse_sweep(BASE).pruner.comparison == "paired"
    sweep = parse_sweep(_with(pruner={"comparison": "interval", "reference": {"online": True}}))
    assert build_pruner(sweep, prune=True).settings.comparison == "interval"


def test_the_refit_mode_reaches_the_online_reference() -> None:
    from collapse_hpo.hpo.rule.reference import OnlineReference
    from collapse_hpo.hpo.sweep.trial import build_pruner

    for written, expected in ((None, "background"), ("inline", "inline"), ("background", "background")):
        ref = {"online": True} if written is None else {"online": True, "refit": written}
        pruner = build_pruner(parse_sweep(_with(pruner={"reference": ref})), prune=True)
        assert isinstance(pruner.reference, OnlineReference) and pruner.reference.refit == expected


def test_the_refit_schedule_reaches_the_online_reference() -> None:
    from collapse_hpo.hpo.rule.reference import REFIT_GROWTH, OnlineReference
    from collapse_hpo.hpo.sweep.trial import build_pruner

    for written, expected in ((None, REFIT_GROWTH), (1, 1.0), (2.5, 2.5)):
        ref = {"online": True} if written is None else {"online": True, "refit_growth": written}
        pruner = build_pruner(parse_sweep(_with(pruner={"reference": ref})), prune=True)
        assert isinstance(pruner.reference, OnlineReference) and pruner.reference.refit_growth == expected


STUDIES = sorted((Path(__file__).resolve().parents[1] / "studies").glob("*.yaml"))


@pytest.mark.parametrize("path", STUDIES, ids=[p.name for p in STUDIES])
def test_every_sweep_file_in_studies_is_valid_and_plans_its_draws(path: Path) -> None:
    """The shipped sweep files are what users copy: each must pass the schema as the schema changes, and
    give as many draws as it says (only the quickstart and stages.yaml are run by other tests)."""
    sweep = load_sweep(path)
    draws = plan_draws(sweep)
    assert sweep.n_draws > 0 and len(draws) == sweep.n_draws
    assert all(set(d) == set(sweep.space) for d in draws)
