"""Issue 13, item 2: conditions that silently turn pruning off are said once, on the console and in the study.

(a) a progress key that runs past its total (t̂ > 1): a real Ray Tune run with
    ``time_attr="training_iteration"`` and no matching total, and a plain Optuna study whose
    ``total_tokens`` is too small;
(b) a trial that can never be judged (no total_tokens; a tpp the surrogate needs but nobody gives);
(c) a sweep whose TPE sampler never leaves its random start-up (``make_sampler``, ``create_study``).

Each condition must give exactly one ``CollapseWarning`` (the filter is "always", so only the adapters' own
once-per-study bookkeeping keeps it to one) and one entry in the study record (``collapse_warnings``).
"""

from __future__ import annotations

import math
import os
import sys
import warnings

import optuna
import pytest
from sweep_util import tiny_sweep

from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner
from collapse_hpo.hpo.rule.judge import (
    PAST_END_WARNING,
    STARTUP_WARNING,
    UNJUDGEABLE_WARNING,
    CollapseWarning,
)
from collapse_hpo.hpo.rule.record import WARNINGS_ATTR, set_trial_controls
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import ErrorBand, Surrogate

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
optuna.logging.set_verbosity(optuna.logging.WARNING)

SURROGATE = Surrogate(
    b_c=0.5, b_e=0.3, q_c=1.0, q_e=0.1,
    error_bands=[ErrorBand(fraction=0.1, n=20, bias=0.0, scale=0.01, max_abs=0.03)],
)
SCHEDULE = Schedule()
TAU, TPP = 0.1, 20.0
TOTAL = 1_000_000
REPORTS = 20


def _collapse_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, CollapseWarning)]


def _objective(trial: optuna.trial.Trial, *, tokens_per_report: int, controls: dict | None) -> float:
    x = trial.suggest_float("x", 0.0, 1.0)
    if controls is not None:
        set_trial_controls(trial, **controls)
    final = 3.0 + 2.0 * (x - 0.3) ** 2
    loss = math.nan
    for i in range(1, REPORTS + 1):
        t = i / REPORTS
        loss = final * float(SURROGATE.normalized(t, SCHEDULE, TAU, TPP)[0])
        trial.report(loss, step=tokens_per_report * i)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return loss


def _run(pruner: CollapsePruner, n_trials: int, **kw) -> tuple[optuna.Study, list[str]]:
    study = optuna.create_study(pruner=pruner, sampler=optuna.samplers.RandomSampler(seed=0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        study.optimize(lambda t: _objective(t, **kw), n_trials=n_trials)
    return study, _collapse_warnings(caught)


# ---------------------------------------------------------------------------------------------- (a)
def test_optuna_total_tokens_too_small_warns_once_and_records_it():
    # The trials train 4x the tokens the pruner is told: t̂ reaches 4, every report past 1 is ignored.
    pruner = CollapsePruner(reference=SURROGATE, total_tokens=TOTAL / 4, schedule=SCHEDULE, tau=TAU, tpp=TPP,
                            min_fraction=0.2)
    study, said = _run(pruner, 4, tokens_per_report=TOTAL // REPORTS, controls=None)
    assert len(said) == 1, said
    assert "past its total" in said[0] and "units and total" in said[0]
    recorded = study.user_attrs[WARNINGS_ATTR]
    assert [w["key"] for w in recorded] == [PAST_END_WARNING]
    assert recorded[0]["trial"] == 0  # the first trial, at its first report past the end
    assert "collapse-hpo: " + recorded[0]["message"] == said[0]


def test_optuna_correct_total_says_nothing():
    pruner = CollapsePruner(reference=SURROGATE, total_tokens=TOTAL, schedule=SCHEDULE, tau=TAU, tpp=TPP,
                            min_fraction=0.2)
    study, said = _run(pruner, 4, tokens_per_report=TOTAL // REPORTS, controls=None)
    assert said == []
    assert WARNINGS_ATTR not in study.user_attrs


def test_second_pruner_on_the_same_study_does_not_repeat_a_recorded_warning(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    kw = {"reference": SURROGATE, "total_tokens": TOTAL / 4, "schedule": SCHEDULE, "tau": TAU, "tpp": TPP}
    first = optuna.create_study(storage=url, study_name="s", pruner=CollapsePruner(**kw),
                                sampler=optuna.samplers.RandomSampler(seed=0))
    second = optuna.load_study(storage=url, study_name="s", pruner=CollapsePruner(**kw),
                               sampler=optuna.samplers.RandomSampler(seed=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for study in (first, second):  # two workers (two pruner objects) on one study
            study.optimize(lambda t: _objective(t, tokens_per_report=TOTAL // REPORTS, controls=None),
                           n_trials=2)
    assert len(_collapse_warnings(caught)) == 1
    assert len(optuna.load_study(storage=url, study_name="s").user_attrs[WARNINGS_ATTR]) == 1


# ---------------------------------------------------------------------------------------------- (b)
def test_optuna_trial_without_total_tokens_is_said_to_be_never_judged():
    pruner = CollapsePruner(reference=SURROGATE, schedule=SCHEDULE, tau=TAU, tpp=TPP)  # no total_tokens
    study, said = _run(pruner, 3, tokens_per_report=TOTAL // REPORTS, controls=None)
    assert len(said) == 1, said
    assert "can never be judged" in said[0] and "set_trial_controls(trial, total=" in said[0]
    assert [w["key"] for w in study.user_attrs[WARNINGS_ATTR]] == [UNJUDGEABLE_WARNING]


def test_optuna_tpp_the_surrogate_needs_but_nobody_gives_is_said():
    assert SURROGATE.tpp_law != "constant"
    pruner = CollapsePruner(reference=SURROGATE, total_tokens=TOTAL, schedule=SCHEDULE, tau=TAU,
                            min_fraction=0.2)  # no tpp
    study, said = _run(pruner, 3, tokens_per_report=TOTAL // REPORTS, controls=None)
    assert len(said) == 1, said
    assert "tpp is not defined" in said[0]
    assert [w["key"] for w in study.user_attrs[WARNINGS_ATTR]] == [UNJUDGEABLE_WARNING]


# ---------------------------------------------------------------------------------------------- (c)
@pytest.mark.parametrize("trials", [4, 10])
def test_sweep_tpe_with_no_more_trials_than_its_startup_warns_before_the_sweep(tmp_path, trials):
    from collapse_hpo.hpo.sweep.config import load_sweep
    from collapse_hpo.hpo.sweep.runner import create_study, locate

    sweep = load_sweep(tiny_sweep(tmp_path, trials=trials, sampler={"name": "tpe", "seed": 0}))
    loc = locate(sweep)
    loc.results.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        study = create_study(sweep, loc)  # before any trial runs
    said = _collapse_warnings(caught)
    assert len(said) == 1, said
    assert "n_startup_trials=10" in said[0] and f"runs {trials}" in said[0]
    assert [w["key"] for w in study.user_attrs[WARNINGS_ATTR]] == [STARTUP_WARNING]


@pytest.mark.parametrize("sampler", [{"name": "tpe", "seed": 0}, {"name": "random", "seed": 0}])
def test_sweep_with_enough_trials_or_another_sampler_says_nothing(tmp_path, sampler):
    from collapse_hpo.hpo.sweep.config import load_sweep
    from collapse_hpo.hpo.sweep.runner import create_study, locate

    sweep = load_sweep(tiny_sweep(tmp_path, trials=11 if sampler["name"] == "tpe" else 4, sampler=sampler))
    loc = locate(sweep)
    loc.results.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        study = create_study(sweep, loc)
    assert _collapse_warnings(caught) == []
    assert WARNINGS_ATTR not in study.user_attrs


# ---------------------------------------------------------------------------------------------- Ray Tune
def _iteration_trainable(config: dict) -> None:
    from ray import tune

    for i in range(1, REPORTS + 1):
        t = i / REPORTS
        loss = config["final"] * float(SURROGATE.normalized(t, SCHEDULE, TAU, TPP)[0])
        tune.report({"loss": loss})  # Tune adds training_iteration = 1, 2, ..., REPORTS


@pytest.mark.slow
def test_tune_training_iteration_without_total_warns_once_and_records_it(tmp_path):
    import ray
    import ray.cloudpickle
    from ray import tune

    from collapse_hpo.hpo.ray_side.scheduler import CollapseScheduler
    from collapse_hpo.hpo.rule.decision import PruneSettings

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    url = f"sqlite:///{tmp_path / 'mirror.db'}"
    # The user's mistake: training_iteration is taken for t̂ (no total_tokens), so t̂ runs 1, 2, ..., 20.
    scheduler = CollapseScheduler(
        reference=SURROGATE, metric="loss", time_attr="training_iteration", schedule=SCHEDULE, tau=TAU,
        tpp=TPP, settings=PruneSettings(min_fraction=0.2), storage=url, study_name="mirror",
    )
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        tuner = tune.Tuner(
            _iteration_trainable,
            param_space={"final": tune.grid_search([3.0, 4.5, 3.5])},
            tune_config=tune.TuneConfig(scheduler=scheduler, max_concurrent_trials=1),
            run_config=tune.RunConfig(storage_path=str(tmp_path / "ray"), name="exp", verbose=0),
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            grid = tuner.fit()
    finally:
        ray.shutdown()
    said = _collapse_warnings(caught)
    assert len(said) == 1, said
    assert "past its total" in said[0] and "time_attr" in said[0]
    from collapse_hpo.hpo.ray_side.scheduler import CollapseScheduler

    said_there = CollapseScheduler.load_warnings(grid.experiment_path)  # snapshot and journal
    assert [w["key"] for w in said_there] == [PAST_END_WARNING]
    mirrored = optuna.load_study(storage=url, study_name="mirror").user_attrs[WARNINGS_ATTR]
    assert [w["key"] for w in mirrored] == [PAST_END_WARNING]
    # And nothing was pruned: the warning is the only sign of it.
    records = CollapseScheduler.load_state(grid.experiment_path)
    assert len(records) == 3 and all(r.status != "pruned" for r in records.values())
