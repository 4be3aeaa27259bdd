"""Sweeps with ``stages:`` (hpo/sweep/stages.py), without training: validation, the transfer, stage 2's pruner
and reference, the stages report (transfer table, ρ, compute). The end-to-end runs are in
test_cli_stages.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from collapse_hpo.hpo import cli
from collapse_hpo.hpo.rule.reference import StudyReference
from collapse_hpo.hpo.sweep.config import parse_sweep
from collapse_hpo.hpo.sweep.stages import (
    STAGE_PLAN_ATTR,
    lr_factor,
    stage_locations,
    stage_sweep,
    stages_summary,
    top_settings,
    transfer,
    transfer_rows,
)
from collapse_hpo.hpo.sweep.trial import build_pruner, train_config
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.timescale import adamw_tau, optimal_tau
from collapse_hpo.trainers.config import plan

BASE: dict[str, Any] = {
    "name": "st",
    "model": {"width": 64, "depth": 2, "heads": 2, "context": 64},
    "tpp": 20,
    "fixed": {"batch_tokens": 512},
    "space": {"lr": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}},
    "trials": 6,
    "stages": [{"width": 16}, {"top_k": 3}],
}


def _with(**changes: Any) -> dict[str, Any]:
    return {**BASE, **changes}


BAD = {
    "one stage": (_with(stages=[{"width": 16}]), "stages", "exactly 2 stages"),
    "total_tokens with tau optimal": (_with(stages=[{"width": 16}, {"top_k": 2, "total_tokens": 400_000}]),
                                      "stages.1.total_tokens", "needs a TPP"),
    "three stages": (_with(stages=[{"width": 16}, {"width": 32}, {"top_k": 2}]), "stages", "exactly 2"),
    "stage 1 without width": (_with(stages=[{}, {"top_k": 2}]), "stages.0.width", "is needed"),
    "top_k on stage 1": (_with(stages=[{"width": 16, "top_k": 2}, {"top_k": 2}]), "stages.0.top_k",
                         "belongs to stage 2"),
    "width on stage 2": (_with(stages=[{"width": 16}, {"width": 64, "top_k": 2}]), "stages.1.width",
                         "set model.width"),
    "top_k missing": (_with(stages=[{"width": 16}, {}]), "stages.1.top_k", "is needed"),
    "top_k above trials": (_with(stages=[{"width": 16}, {"top_k": 7}]), "stages.1.top_k",
                           "more than the 6 settings"),
    "width not a multiple of heads": (_with(stages=[{"width": 15}, {"top_k": 2}]), "stages.0.width",
                                      "multiple of 2 × model.heads"),
    "stage 1 not smaller": (_with(stages=[{"width": 128}, {"top_k": 2}]), "stages.0.width",
                            "must be smaller"),
    "width searched": (_with(space={**BASE["space"], "width": {"type": "int", "low": 16, "high": 32}}),
                       "space.width", "cannot be set in a sweep with stages"),
    "unknown stage key": (_with(stages=[{"width": 16, "widht": 3}, {"top_k": 2}]), "stages.0.widht",
                          "allowed: width, depth, top_k"),
    "both budgets": (_with(stages=[{"width": 16, "tpp": 5, "total_tokens": 1000}, {"top_k": 2}]), "stages.0",
                     "at most one of 'tpp' and 'total_tokens'"),
    "negative top_k": (_with(stages=[{"width": 16}, {"top_k": 0}]), "stages.1.top_k", "greater than"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_stages_give_one_line_naming_the_field(case: str) -> None:
    doc, field, phrase = BAD[case]
    with pytest.raises(InputError) as info:
        parse_sweep(doc, "studies/x.yaml")
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("studies/x.yaml: field ")
    assert f"'{field}'" in msg, msg
    assert phrase in msg, msg


@pytest.mark.parametrize("command", ["run", "resume", "report"])
def test_cli_bad_stages_exit_2_and_create_nothing(tmp_path: Path, command: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(_with(stages=[{"width": 16}, {}], results=str(tmp_path / "res"))))
    assert cli.main([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert len([ln for ln in err.splitlines() if ln.strip()]) == 1 and "field 'stages.1.top_k'" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.yaml"]


def test_a_bad_target_shape_is_refused_before_stage_1_runs(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # Stage 1 is valid; the target budget (256 tokens) is less than one step: refused before stage 1 runs.
    doc = _with(stages=[{"width": 16, "tpp": 40}, {"top_k": 2, "total_tokens": 256}], tau=0.2,
                results=str(tmp_path / "res"))
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert cli.main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "fixed.batch_tokens" in err and "512 tokens per step is more than the 256" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.yaml"]


def test_stage_sweeps_share_the_base_shape() -> None:
    sweep = parse_sweep(BASE, "x.yaml")
    one, two = stage_sweep(sweep, 0), stage_sweep(sweep, 1)
    assert (one.model.width, two.model.width) == (16, 64)
    assert one.model.base_width == two.model.base_width == 16  # stage 1's shape, when model gives none
    assert one.name == "st-stage1" and two.name == "st-stage2" and one.stages is None
    assert one.pruner.keep_top_k == 3  # stage 1 keeps at least top_k trials to the end
    assert two.n_draws == 3 and two.sampler.name == "random"
    given = parse_sweep(_with(model={**BASE["model"], "base_width": 32}), "x.yaml")
    assert stage_sweep(given, 0).model.base_width == stage_sweep(given, 1).model.base_width == 32


def test_transfer_carries_the_base_lr_and_holds_tau_at_the_new_tpp() -> None:
    sweep = parse_sweep(_with(tau=0.2), "x.yaml")
    assert lr_factor(sweep) == pytest.approx(16 / 64)
    tr = transfer(sweep, {"lr": 0.02})
    a, b = tr["stage1"], tr["stage2"]
    # The hidden LR moves by width₁/width₂; the base LR (embeddings, LayerNorm: η·m_N) is carried as is.
    assert b["lr"] == pytest.approx(0.02 * 16 / 64)
    base = []
    for i, params in ((0, {"lr": 0.02}), (1, {"lr": b["lr"]})):
        config, _ = train_config(stage_sweep(sweep, i), params, 0)
        base.append(plan(config).base_lr)
    assert base[0] == pytest.approx(base[1]) == pytest.approx(0.02)
    # λ re-derived at stage 2's D so that τ = B/(ηλD) is held (τ given: the same at both stages).
    assert a["tau"] == b["tau"] == pytest.approx(0.2)
    for s in (a, b):
        held = adamw_tau(s["batch_tokens"], s["lr"], s["weight_decay"], s["total_tokens"])
        assert held == pytest.approx(0.2)
    assert b["total_tokens"] > 10 * a["total_tokens"]
    assert b["weight_decay"] != pytest.approx(a["weight_decay"])


def test_tau_optimal_is_taken_at_the_target_tpp() -> None:
    # The small stage trains longer per parameter than the target, so τ_opt(TPP) is larger at the target.
    doc = _with(stages=[{"width": 16, "tpp": 200}, {"top_k": 3, "tpp": 10}])
    sweep = parse_sweep(doc, "x.yaml")
    tr = transfer(sweep, {"lr": 0.02})
    a, b = tr["stage1"], tr["stage2"]
    assert a["tpp"] > 10 * b["tpp"]
    assert b["tau"] == pytest.approx(optimal_tau(b["total_tokens"] / b["params_non_embedding"]), rel=1e-2)
    assert a["tau"] == pytest.approx(optimal_tau(a["tpp"]), rel=1e-2) and b["tau"] > 2 * a["tau"]
    held = adamw_tau(b["batch_tokens"], b["lr"], b["weight_decay"], b["total_tokens"])
    assert held == pytest.approx(b["tau"])
    # A stage's own budget: stage 2 at 5 TPP, stage 1 at 20.
    own = parse_sweep(_with(stages=[{"width": 16}, {"top_k": 2, "tpp": 5}]), "x.yaml")
    b2 = transfer(own, {"lr": 0.02})["stage2"]
    assert b2["tpp"] == pytest.approx(5, rel=0.05)
    assert b2["tau"] == pytest.approx(optimal_tau(5), rel=0.05)


def test_stage_2_prunes_with_stage_1_study_as_reference(tmp_path: Path) -> None:
    sweep = parse_sweep(_with(results=str(tmp_path / "r")), "x.yaml")
    locs = stage_locations(sweep)
    two = stage_sweep(sweep, 1, reference=locs[0])
    ref = two.pruner.reference
    assert ref.kind == "study" and ref.study == "st-stage1" and ref.storage == locs[0].storage_url
    assert locs[0].storage_url == locs[1].storage_url == f"sqlite:///{tmp_path / 'r' / 'study.db'}"
    pruner = build_pruner(two, True)
    assert isinstance(pruner.reference, StudyReference) and pruner.reference.study_name == "st-stage1"
    # --no-prune: the studies are '<name>-noprune-stage1/2' in '<results>-noprune'.
    off = stage_locations(sweep, no_prune=True)
    assert [loc.study_name for loc in off] == ["st-noprune-stage1", "st-noprune-stage2"]
    assert not off[0].prune


def _study(name: str, losses: list[float | None], lrs: list[float], extra: dict[str, Any] | None = None,
           ) -> optuna.Study:
    """An in-memory study of finished trials (None: PRUNED with a predicted final loss of 9)."""
    study = optuna.create_study(study_name=name)
    for draw, (loss, lr) in enumerate(zip(losses, lrs)):
        attrs = {"draw": draw, "seed": 0, "params_non_embedding": 1000, "tokens_trained": 100}
        if loss is None:
            attrs["predicted_final_loss"] = 9.0
        t = optuna.trial.create_trial(
            params={"lr": lr}, distributions={"lr": optuna.distributions.FloatDistribution(1e-4, 1.0)},
            value=loss, user_attrs=attrs,
            state=optuna.trial.TrialState.COMPLETE if loss is not None else optuna.trial.TrialState.PRUNED)
        study.add_trial(t)
    for k, v in (extra or {}).items():
        study.set_user_attr(k, v)
    return study


def test_top_settings_rank_by_final_or_predicted_loss() -> None:
    study = _study("s1", [3.0, 2.0, None, 2.5, 4.0, 3.5], [0.01, 0.02, 0.03, 0.04, 0.05, 0.06])
    best = top_settings(study, 3)
    assert [b["stage1_draw"] for b in best] == [1, 3, 0]
    assert best[0]["stage1_params"] == {"lr": 0.02}


def test_a_draw_has_a_final_loss_only_when_every_seed_ended() -> None:
    from collapse_hpo.hpo.sweep.stages import draw_scores

    study = optuna.create_study()
    dist = {"lr": optuna.distributions.FloatDistribution(1e-4, 1.0)}
    for draw, seed, loss in ((0, 0, 1.5), (0, 1, 2.0), (1, 0, 2.2), (1, 1, None)):
        attrs: dict[str, Any] = {"draw": draw, "seed": seed}
        if loss is None:
            attrs["predicted_final_loss"] = 3.0
        study.add_trial(optuna.trial.create_trial(
            params={"lr": 0.01 * (draw + 1)}, distributions=dist, value=loss, user_attrs=attrs,
            state=optuna.trial.TrialState.PRUNED if loss is None else optuna.trial.TrialState.COMPLETE))
    scores = draw_scores(study)
    assert scores[0]["final_loss"] == pytest.approx(1.75) and scores[0]["complete_seeds"] == 2
    # Draw 1: seed 0 ended at 2.2, seed 1 was pruned: no final loss (one seed is not the mean of two).
    assert scores[1]["final_loss"] is None and scores[1]["score"] == pytest.approx(2.6)


def test_report_shows_the_transfer_and_the_rank_agreement() -> None:
    sweep = parse_sweep(BASE, "x.yaml")
    s1 = _study("st-stage1", [3.0, 2.0, None, 2.5, 4.0, 3.5], [0.01, 0.02, 0.03, 0.04, 0.05, 0.06])
    plan1 = [{"stage1_draw": d, "stage1_score": s, "stage1_params": {"lr": lr}, "params": {"lr": lr / 4}}
             for d, s, lr in ((1, 2.0, 0.02), (3, 2.5, 0.04), (0, 3.0, 0.01))]
    # Stage 2 ranks the three settings in the reverse order: ρ = -1.
    s2 = _study("st-stage2", [2.9, 2.1, 1.5], [0.005, 0.01, 0.0025], {STAGE_PLAN_ATTR: plan1})
    rows = transfer_rows(sweep, s1, s2)
    assert [r["stage1_draw"] for r in rows] == [1, 3, 0]
    assert rows[0]["lr_2"] == pytest.approx(0.005) and rows[0]["tau_1"] == pytest.approx(rows[0]["tau_2"])
    assert rows[0]["final_loss_1"] == 2.0 and rows[0]["final_loss_2"] == 2.9
    text = "\n".join(stages_summary(sweep, s1, s2))
    assert "stage 1 (width 16) → stage 2 (width 64): lr × 0.25" in text
    assert "0.02 → 0.005" in text
    assert "Spearman ρ = -1.00" in text and "of the 3 settings" in text
    assert "stage-2 winner: stage-1 draw 0" in text
    assert "% of a full sweep of stage 1's 6 settings at width 64" in text
    # Two settings trained to the end in both stages: ρ is not given, and the report says why.
    s2b = _study("st-stage2", [2.9, None, 1.5], [0.005, 0.01, 0.0025], {STAGE_PLAN_ATTR: plan1})
    assert "ρ needs 3 settings trained to the end (every seed) in both stages; 2 were" in "\n".join(
        stages_summary(sweep, s1, s2b))
