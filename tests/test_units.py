"""Progress units (issue 21): a run's progress in tokens, optimizer steps or a fraction, with one name and
meaning in ``CollapsePruner``, ``set_trial_controls``, ``CollapseScheduler`` and the stored trial record.

The decisions must not depend on the unit: the same curves reported in optimizer steps (``units="steps"``,
``total`` = the number of steps, as a Hugging Face run has ``max_steps``), in tokens or as a fraction are
judged at the same t̂ with the same outcome.
"""

from __future__ import annotations

import math

import optuna
import pytest
from test_scheduler_unit import SURROGATE, TAU, TPP, FakeTrial, loss_at, make

from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner, set_trial_controls
from collapse_hpo.hpo.ray_side.scheduler import CollapseScheduler
from collapse_hpo.hpo.ray_side.scheduler_state import record_from_dict
from collapse_hpo.hpo.rule.decision import PruneSettings
from collapse_hpo.hpo.rule.record import (
    FRACTION_STEPS,
    ControlsMemo,
    TrialControls,
    stored_total,
    trial_curve,
    trial_points,
)
from collapse_hpo.predictors.errors import InputError

optuna.logging.set_verbosity(optuna.logging.WARNING)

STEPS, BATCH = 200, 4096  # optimizer steps of every run and tokens per step
FINALS = (3.0, 3.6, 3.2, 4.0, 3.1)  # final losses of the five trials, in order
REPORTS = 20


def _study(units: str) -> optuna.Study:
    """Five trials whose curves have the reference shape, reported in ``units``; the pruner told so once per
    trial with set_trial_controls (tokens: the old ``total_tokens`` spelling, kept working)."""
    study = optuna.create_study(pruner=CollapsePruner(reference=SURROGATE, min_fraction=0.2, judge_every=0.0))
    for final in FINALS:
        trial = study.ask()
        if units == "tokens":
            set_trial_controls(trial, total_tokens=STEPS * BATCH, tau=TAU, tpp=TPP)
        else:
            total = None if units == "fraction" else STEPS
            set_trial_controls(trial, units=units, total=total, tau=TAU, tpp=TPP)
        pruned = False
        for i in range(1, REPORTS + 1):
            step = STEPS * i // REPORTS
            progress = {"tokens": step * BATCH, "steps": step,
                        "fraction": round(step / STEPS * FRACTION_STEPS)}
            trial.report(loss_at(final, step / STEPS), step=progress[units])
            if i < REPORTS and trial.should_prune():
                pruned = True
                break
        study.tell(trial, state=optuna.trial.TrialState.PRUNED) if pruned else study.tell(trial, final)
    return study


def _outcome(study: optuna.Study) -> list[tuple[str, float | None]]:
    return [(t.state.name, t.user_attrs.get("decision_fraction")) for t in study.trials]


def test_the_pruner_decides_the_same_in_tokens_steps_and_fractions():
    tokens, steps, fraction = (_outcome(_study(u)) for u in ("tokens", "steps", "fraction"))
    assert any(state == "PRUNED" for state, _ in tokens)  # the test has something to compare
    assert steps == tokens and fraction == tokens
    trial = _study("steps").trials[0]
    assert trial.user_attrs["units"] == "steps" and trial.user_attrs["total"] == STEPS
    assert max(trial.intermediate_values) == STEPS  # steps stored as the user reported them
    assert trial_curve(trial, TrialControls()).t_hat[-1] == pytest.approx(1.0)
    assert stored_total(trial.user_attrs) == (STEPS, "steps")


def test_pruner_defaults_in_steps_and_the_old_total_tokens_spelling():
    pruner = CollapsePruner(reference=SURROGATE, units="steps", total=STEPS, tau=TAU, tpp=TPP)
    assert (pruner.defaults.units, pruner.defaults.total) == ("steps", STEPS)
    legacy = CollapsePruner(reference=SURROGATE, total_tokens=1e9)
    assert (legacy.defaults.units, legacy.defaults.total) == ("tokens", 1e9)
    config = {"reference": "online", "units": "steps", "total": 10}
    assert CollapsePruner.from_config(config).defaults.total == 10
    # A stored trial from before units existed: total_tokens is a total in tokens.
    assert stored_total({"total_tokens": 5e8, "tau": 0.1}) == (5e8, "tokens")
    c = TrialControls(total=STEPS, units="steps").merged({"total_tokens": 5e8}, "t")
    assert (c.units, c.total) == ("tokens", 5e8)
    # A trial that says its units takes the pruner's total only in the same units.
    assert TrialControls(total=STEPS, units="steps").merged({"units": "steps"}, "t").total == STEPS
    assert TrialControls(total=1e9).merged({"units": "steps"}, "t").total is None


def test_trial_points_sorts_by_step_and_leaves_the_sampler_point_out():
    """``trial_points``: the reports as (step, loss) arrays in step order, whatever order the storage holds
    them in, without the pruner's sampler point; NaN kept; none gives empty arrays."""
    from types import SimpleNamespace

    def trial(values, skip=None):
        attrs = {} if skip is None else {"sampler_value_step": skip}
        return SimpleNamespace(intermediate_values=values, user_attrs=attrs, number=0)

    steps, losses = trial_points(trial({30: 2.0, 10: 3.0, 20: float("nan"), 1000: 1.5}, skip=1000))
    assert steps.tolist() == [10.0, 20.0, 30.0] and losses[[0, 2]].tolist() == [3.0, 2.0]
    assert math.isnan(losses[1]) and steps.dtype == float and losses.dtype == float
    in_order = trial_points(trial({1: 4.0, 2: 3.0, 5: 2.5}, skip=7))
    assert [a.tolist() for a in in_order] == [[1.0, 2.0, 5.0], [4.0, 3.0, 2.5]]
    assert [a.size for a in trial_points(trial({3: 1.0}, skip=3))] == [0, 0]


def test_the_controls_memo_parses_each_set_of_attr_objects_once_and_tells_absent_from_none():
    """``ControlsMemo`` (the pruner's views and the online reference's trial memo) keys the parse by the
    control attrs' objects: the same objects give the same parse; an attr set to None (``tau`` None: no
    weight decay) is not an absent one (the default), and the legacy ``total_tokens`` is read too. The
    pruner's memo before it keyed an absent attr and a None one alike, and left ``total_tokens`` out."""
    memo = ControlsMemo(TrialControls(total=STEPS, units="steps", tau=0.5))
    assert memo.merged({}, "t").tau == 0.5
    assert memo.merged({"tau": None}, "t").tau is None  # no weight decay, not the default's 0.5
    legacy = memo.merged({"total_tokens": 5e8}, "t")
    assert (legacy.units, legacy.total) == ("tokens", 5e8)
    attrs = {"tau": 0.2, "schedule": {"kind": "cosine", "warmup": 0.1}}
    first = memo.merged(attrs, "t")
    assert memo.merged(dict(attrs), "t") is first  # the same value objects: parsed once
    again = memo.merged({"tau": 0.2, "schedule": {"kind": "cosine", "warmup": 0.1}}, "t")
    assert again == first and again is not first  # equal values in new objects: parsed anew, alike
    with pytest.raises(InputError, match="tau"):
        memo.merged({"tau": -1.0}, "trial 3")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"units": "epochs", "total": 3}, "units.*tokens, steps, fraction"),
    ({"units": "steps", "total_tokens": 1e9}, "total_tokens' counts tokens but units is 'steps'"),
    ({"total": 10, "total_tokens": 10}, "not both"),
    ({"units": "fraction", "total": 100}, "with units 'fraction'"),
    ({"units": "steps", "total": -1}, "'total' must be a positive"),
])
def test_bad_units_are_one_line_naming_the_field(kwargs, match):
    with pytest.raises(InputError, match=match):
        CollapsePruner(reference="online", **kwargs)
    study = optuna.create_study()
    trial = study.ask()
    with pytest.raises(InputError, match=match):
        set_trial_controls(trial, **{"total": 1.0, **kwargs} if "total_tokens" not in kwargs else kwargs)
    assert study.trials[0].user_attrs == {}  # nothing written


def test_set_trial_controls_needs_a_length_except_in_fractions():
    trial = optuna.create_study().ask()
    with pytest.raises(InputError, match="give total"):
        set_trial_controls(trial, units="steps")
    set_trial_controls(trial, units="fraction")
    assert trial.user_attrs["total"] == FRACTION_STEPS


def _scheduler_run(tmp_path, name: str, progress_key: str, **kw) -> dict[str, float | None]:
    """Three trials through a CollapseScheduler whose trainables report ``progress_key``; t̂ of each STOP."""
    s = make(tmp_path / f"{name}.json", time_attr=progress_key, **kw)
    stops: dict[str, float | None] = {}
    for tid, final in zip("abc", (3.0, 3.8, 3.1)):
        trial = FakeTrial(tid, {})
        s.on_trial_add(None, trial)
        stops[tid] = None
        for i in range(1, REPORTS + 1):
            step = STEPS * i // REPORTS
            value = {"t_hat": step / STEPS, "step": step, "tokens": step * BATCH}[progress_key]
            result = {"loss": loss_at(final, step / STEPS), progress_key: value}
            if s.on_trial_result(None, trial, result) == "STOP":
                stops[tid] = step / STEPS
                break
        s.on_trial_complete(None, trial, result)
    return stops


def test_the_scheduler_decides_the_same_in_tokens_steps_and_fractions(tmp_path):
    by_fraction = _scheduler_run(tmp_path, "f", "t_hat")  # units default to "fraction" without a total
    assert by_fraction["b"] is not None and by_fraction["a"] is None
    assert _scheduler_run(tmp_path, "s", "step", units="steps", total=STEPS) == by_fraction
    assert _scheduler_run(tmp_path, "t", "tokens", total_tokens=STEPS * BATCH) == by_fraction
    assert _scheduler_run(tmp_path, "u", "tokens", units="tokens", total=STEPS * BATCH) == by_fraction


def test_the_scheduler_mirror_records_units_and_total(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.db'}"
    _scheduler_run(tmp_path, "m", "step", units="steps", total=STEPS, storage=url, study_name="m")
    trials = optuna.load_study(study_name="m", storage=url).trials
    assert {(t.user_attrs["units"], t.user_attrs["total"]) for t in trials} == {("steps", STEPS)}
    assert max(trials[0].intermediate_values) == STEPS
    url2 = f"sqlite:///{tmp_path / 'f.db'}"
    _scheduler_run(tmp_path, "f2", "t_hat", storage=url2, study_name="f")
    t0 = optuna.load_study(study_name="f", storage=url2).trials[0]
    assert (t0.user_attrs["units"], t0.user_attrs["total"]) == ("fraction", FRACTION_STEPS)
    assert max(t0.intermediate_values) == FRACTION_STEPS


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"units": "steps"}, "units 'steps' needs total"),
    ({"units": "fraction", "total": 10}, "give no total"),
    ({"units": "steps", "total_tokens": 10}, "total_tokens counts tokens"),
    ({"units": "furlongs", "total": 10}, "units"),
    ({"units": "steps", "total": math.nan}, "positive number of steps"),
])
def test_scheduler_bad_units(kwargs, match):
    with pytest.raises(InputError, match=match):
        CollapseScheduler(reference=SURROGATE, settings=PruneSettings(), **kwargs)


def test_a_state_file_from_before_units_reads_its_tokens():
    rec = record_from_dict({"trial_id": "a", "status": "running", "t_hat": [0.5], "loss": [3.0],
                            "tokens": [500.0], "total_tokens": 1000.0}, "a")
    assert rec.progress == [500.0] and rec.total == 1000.0 and rec.units == "tokens"


def test_the_dashboard_note_says_how_far_a_trial_trained_in_its_units():
    from collapse_hpo.hpo.outputs.dashboard import trial_note

    pruned = next(t for t in _study("steps").trials if t.state.name == "PRUNED")
    last = max(pruned.intermediate_values)
    assert f"| steps trained | {last:,} of {STEPS:,} ({100 * last / STEPS:.0f}%) |" in trial_note(pruned)
    tokens = next(t for t in _study("tokens").trials if t.state.name == "PRUNED")
    assert f"| tokens trained | {last * BATCH:,} of {STEPS * BATCH:,} " in trial_note(tokens)
