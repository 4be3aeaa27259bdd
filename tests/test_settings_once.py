"""Validate once (issue 22): the rule's settings have one checker (``PruneSettings``, the judge's
``judge_every``), both adapters take the same ``settings=`` (the keyword shortcuts build the same object), and
"tau and weight_decay both given" is refused by one function at every boundary."""

from __future__ import annotations

import argparse

import optuna
import pytest
from synthetic_trial_util import REPORTS, TAU, TPP, synthetic_objective

from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner, trial_decisions
from collapse_hpo.hpo.ray_side.scheduler import CollapseScheduler
from collapse_hpo.hpo.rule.decision import PruneSettings, SettingError
from collapse_hpo.hpo.sweep.config import parse_sweep
from collapse_hpo.hpo.sweep.space import TauHeldSpace
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE
from collapse_hpo.predictors.timescale import check_one_decay, derive_decay

SHORTCUTS = {"min_fraction": 0.2, "confidence": 0.8, "keep_top_k": 2, "comparison": "interval",
             "margin": 0.03}
BASE = {"name": "s", "model": {"width": 32, "depth": 1, "heads": 2}, "tpp": 20,
        "space": {"lr": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}},
        "fixed": {"batch_tokens": 512}, "trials": 2}


def test_the_keyword_shortcuts_build_the_same_settings_for_both_adapters() -> None:
    settings = PruneSettings(**SHORTCUTS)
    by_keywords = CollapsePruner(reference=TRUE_SURROGATE, **SHORTCUTS).settings
    by_object = CollapsePruner(reference=TRUE_SURROGATE, settings=settings).settings
    scheduler_keywords = CollapseScheduler(reference=TRUE_SURROGATE, **SHORTCUTS).settings
    scheduler_object = CollapseScheduler(reference=TRUE_SURROGATE, settings=settings).settings
    assert by_keywords == by_object == scheduler_keywords == scheduler_object == settings
    assert CollapsePruner(reference=TRUE_SURROGATE).settings == PruneSettings()
    assert CollapseScheduler(reference=TRUE_SURROGATE).settings == PruneSettings()
    # A shortcut equal to the settings' value says the same thing twice: allowed.
    assert CollapsePruner(reference=TRUE_SURROGATE, settings=settings, margin=0.03).settings == settings


@pytest.mark.parametrize("adapter", [CollapsePruner, CollapseScheduler])
def test_settings_and_a_conflicting_shortcut_are_refused(adapter) -> None:
    with pytest.raises(InputError, match=r"'min_fraction' is given twice.*settings=") as err:
        adapter(reference=TRUE_SURROGATE, settings=PruneSettings(min_fraction=0.2), min_fraction=0.3)
    assert str(err.value).startswith(f"{adapter.__name__}: ")
    with pytest.raises(InputError, match="must be a PruneSettings"):
        adapter(reference=TRUE_SURROGATE, settings={"min_fraction": 0.2})


BAD = [("min_fraction", 1.5), ("confidence", 0.0), ("keep_top_k", 0), ("comparison", "pairs"),
       ("margin", -0.1), ("judge_every", 1.0)]


@pytest.mark.parametrize(("name", "value"), BAD)
def test_a_bad_value_gives_one_input_error_naming_the_setting_everywhere(name, value, tmp_path) -> None:
    """The pruner, the scheduler, PruneSettings itself and the sweep file say the same problem once."""
    messages = []
    for build in (lambda: CollapsePruner(reference=TRUE_SURROGATE, **{name: value}),
                  lambda: CollapseScheduler(reference=TRUE_SURROGATE, **{name: value})):
        with pytest.raises(InputError) as err:
            build()
        messages.append(str(err.value))
    if name != "judge_every":
        with pytest.raises(SettingError) as direct:
            PruneSettings(**{name: value})
        assert direct.value.name == name
        messages.append(str(direct.value))
    problems = {m.split(f"pruner setting '{name}' ", 1)[1] for m in messages}
    assert len(problems) == 1, messages  # one checker: one wording
    assert all("\n" not in m for m in messages)
    with pytest.raises(InputError) as yaml_err:
        parse_sweep({**BASE, "pruner": {name: value}}, "x.yaml")
    assert str(yaml_err.value) == f"x.yaml: field 'pruner.{name}': {problems.pop()}"


def _decisions(pruner: CollapsePruner) -> list[tuple]:
    study = optuna.create_study(pruner=pruner, sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(synthetic_objective, n_trials=10)
    return [(t.number, t.state, [e for e in trial_decisions(t)]) for t in study.trials]


def test_both_forms_decide_the_same_on_a_small_synthetic_study() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    keywords = {"min_fraction": 0.2, "margin": 0.02}
    by_keywords = _decisions(CollapsePruner(reference=TRUE_SURROGATE, **keywords))
    by_object = _decisions(CollapsePruner(reference=TRUE_SURROGATE, settings=PruneSettings(**keywords)))
    assert by_keywords == by_object
    assert any(state == optuna.trial.TrialState.PRUNED for _, state, _ in by_keywords)


def _scheduler_stops(scheduler: CollapseScheduler) -> list[float | None]:
    from ray.tune.schedulers import TrialScheduler

    class Trial:
        def __init__(self, trial_id: str) -> None:
            self.trial_id, self.config, self.status = trial_id, {}, "RUNNING"
            self.max_failures, self.failures = 0, 0

    assert scheduler.set_search_properties(None, None)
    stops: list[float | None] = []
    for i, final in enumerate((3.0, 3.5, 3.02, 4.0)):
        trial, stopped = Trial(f"t{i}"), None
        scheduler.on_trial_add(None, trial)
        for k in range(1, REPORTS + 1):
            t = k / REPORTS
            shape = float(TRUE_SURROGATE.normalized(t, Schedule(), TAU, TPP)[0])
            result = {"loss": final * shape, "t_hat": t}
            if scheduler.on_trial_result(None, trial, result) == TrialScheduler.STOP:
                stopped = t
                break
        scheduler.on_trial_complete(None, trial, result)
        stops.append(stopped)
    return stops


def test_the_scheduler_decides_the_same_with_either_form(tmp_path) -> None:
    keywords = {"min_fraction": 0.2, "margin": 0.02}
    by_keywords = _scheduler_stops(CollapseScheduler(reference=TRUE_SURROGATE, tau=TAU, tpp=TPP,
                                                     state_path=tmp_path / "a.json", **keywords))
    by_object = _scheduler_stops(CollapseScheduler(reference=TRUE_SURROGATE, tau=TAU, tpp=TPP,
                                                   state_path=tmp_path / "b.json",
                                                   settings=PruneSettings(**keywords)))
    assert by_keywords == by_object
    assert any(s is not None for s in by_keywords)


# ---------------------------------------------------------------------------------------------- tau and λ
def _core(message: str) -> str:
    return message[message.index("are both set"):]


def test_tau_and_weight_decay_are_refused_by_one_function_at_every_boundary(tmp_path) -> None:
    from collapse_hpo.hpo.commands.forecast import _tau
    from collapse_hpo.hpo.commands.train import build_config
    from collapse_hpo.trainers.config import TrainConfig

    with pytest.raises(InputError) as one:
        check_one_decay(True, True)
    core = _core(str(one.value))
    seen = {}
    with pytest.raises(InputError) as err:
        parse_sweep({**BASE, "tau": 0.1, "fixed": {"batch_tokens": 512, "weight_decay": 0.1}}, "x.yaml")
    assert str(err.value).startswith("x.yaml: field 'fixed.weight_decay': tau and weight_decay are both set")
    seen["yaml"] = str(err.value)
    with pytest.raises(InputError) as err:
        TauHeldSpace({}, fixed={"lr": 0.01, "batch_tokens": 512, "weight_decay": 0.1}, tau=0.1,
                     total_tokens=10)
    seen["space"] = str(err.value)
    with pytest.raises(InputError) as err:
        derive_decay(512, 0.01, 10_000, tau=0.1, weight_decay=0.1)
    seen["derive_decay"] = str(err.value)
    with pytest.raises(InputError) as err:
        TrainConfig(tau=0.1, weight_decay=0.1)
    seen["TrainConfig"] = str(err.value)
    with pytest.raises(InputError) as err:
        build_config(argparse.Namespace(tau=0.1, weight_decay=0.1))
    assert str(err.value).startswith("--tau and --weight-decay are both set")
    seen["train CLI"] = str(err.value)
    with pytest.raises(InputError) as err:
        _tau(argparse.Namespace(tau="0.1", lr=0.01, batch_tokens=512, weight_decay=0.1, tokens=1e6))
    seen["forecast CLI"] = str(err.value)
    for where, message in seen.items():
        assert _core(message) == core, where
        assert "\n" not in message
