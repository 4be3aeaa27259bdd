"""The plain-loop helper (hpo/integrations/loop.py) and the deviation alarm during training (issue 21).

The README's example runs as it is. A curve with an injected fault (the loss steps up by 5% at t̂ = 0.5, as
after a bad data shard or a broken update) raises the alarm while the loop runs: it warns, writes the alarm to
the trial, and with ``stop_on_alarm`` stops the loop at once; a clean curve never raises it.
"""

from __future__ import annotations

import logging
import math
import subprocess
import sys
import warnings

import optuna
import pytest
from readme_util import run_readme_block

from collapse_hpo.hpo.integrations.alarm import CollapseAlarmWarning, DeviationAlarm
from collapse_hpo.hpo.integrations.loop import TrainingWatch, sampled_schedule
from collapse_hpo.hpo.rule.record import ALARM_ATTR, NOTES_ATTR, TPP_NOTE
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.residuals import AlarmRule
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE

optuna.logging.set_verbosity(optuna.logging.WARNING)
STEPS, TAU, TPP, FAULT = 400, 0.2, 20.0, 0.5


def loss_at(step: int, fault: bool) -> float:
    t = step / STEPS
    base = 3.0 * float(TRUE_SURROGATE.normalized(t, Schedule(), TAU, TPP)[0])
    return base * (1.05 if fault and t >= FAULT else 1.0)


def _loop(watch: TrainingWatch, fault: bool) -> int:
    """Train (stand-in) until the watch says stop; the last step done."""
    step = 0
    for step in range(4, STEPS + 1, 4):
        if watch.report(step, loss_at(step, fault)):
            break
    return step


def test_readme_plain_loop_example_runs(capsys):
    ns = run_readme_block("### A plain loop: `TrainingWatch`")
    pruned = ns["pruned"]
    assert pruned and all(t.user_attrs["units"] == "steps" and t.user_attrs["total"] == 1000 for t in pruned)
    assert abs(math.log10(ns["study"].best_params["lr"] / 3e-3)) < 0.5
    assert "pruned" in capsys.readouterr().out


def test_an_injected_fault_raises_the_alarm_during_training_and_stops_it():
    trial = optuna.create_study().ask()
    watch = TrainingWatch(trial, units="steps", total=STEPS, tau=TAU, tpp=TPP, alarm=TRUE_SURROGATE,
                          stop_on_alarm=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        last = _loop(watch, fault=True)
    assert watch.alarm is not None and FAULT <= watch.alarm.t_hat <= FAULT + 0.1
    assert last == round(watch.alarm.t_hat * STEPS) < STEPS  # stopped at the alarm, mid-training
    assert watch.stop_reason.startswith("deviation alarm") and not watch.pruned
    said = [w for w in caught if issubclass(w.category, CollapseAlarmWarning)]
    assert len(said) == 1 and "alarm at t_hat" in str(said[0].message)
    stored = trial.study.trials[0].user_attrs[ALARM_ATTR]
    assert stored["t_hat"] == watch.alarm.t_hat and stored["step"] == last and stored["units"] == "steps"


def test_a_clean_run_raises_nothing_and_without_a_trial_the_alarm_goes_to_the_log(caplog):
    clean = TrainingWatch(None, total=STEPS, tau=TAU, tpp=TPP, alarm=TRUE_SURROGATE, stop_on_alarm=True)
    assert _loop(clean, fault=False) == STEPS and clean.alarm is None
    faulty = TrainingWatch(None, total=STEPS, tau=TAU, tpp=TPP, alarm=TRUE_SURROGATE)  # warn, keep going
    with caplog.at_level(logging.WARNING, logger="collapse_hpo"), pytest.warns(CollapseAlarmWarning):
        assert _loop(faulty, fault=True) == STEPS
    assert faulty.alarm is not None and any("alarm at t_hat" in r.message for r in caplog.records)


def test_a_diverged_loss_fires_at_once_and_a_clean_reference_run_works_as_reference():
    ref_t = [s / STEPS for s in range(4, STEPS + 1, 4)]
    ref_y = [loss_at(s, False) * 1.3 for s in range(4, STEPS + 1, 4)]  # another size: same shape
    alarm = DeviationAlarm((ref_t, ref_y), rule=AlarmRule(threshold=0.01))
    fired = [alarm.update(s / STEPS, loss_at(s, True)) for s in range(4, STEPS + 1, 4)]
    assert next(a for a in fired if a is not None).t_hat >= FAULT
    nan = DeviationAlarm(TRUE_SURROGATE, controls=TrainingWatch(None, total=1, tau=TAU, tpp=TPP).controls)
    assert nan.update(0.05, 3.0) is None
    assert nan.update(0.06, float("nan")).reason.startswith("diverged")


def test_tpp_left_out_is_a_note_never_a_guess():
    trial = optuna.create_study().ask()
    TrainingWatch(trial, total=STEPS, tau=TAU)
    attrs = trial.study.trials[0].user_attrs
    assert attrs["tpp"] is None and attrs[NOTES_ATTR] == [TPP_NOTE]
    with pytest.raises(InputError, match="q depends on TPP"):  # such a surrogate cannot be this alarm
        TrainingWatch(None, total=STEPS, tau=TAU, alarm=TRUE_SURROGATE)


def test_a_trainers_own_lr_rule_is_read_as_a_schedule_shape():
    warm = 20
    sched = sampled_schedule(lambda s: min(1.0, s / warm) * (1.0 - s / STEPS) * 0.5, STEPS)
    assert sched.kind == "data" and float(sched(0.5)) == pytest.approx(0.5 / (1 - warm / STEPS), rel=0.02)
    with pytest.raises(InputError, match="peak"):
        sampled_schedule(lambda s: 0.0, STEPS)


def test_the_loop_helper_and_the_alarm_import_no_trainer(tmp_path):
    """Heavy imports stay in the trainer modules: the package, the plain loop and the alarm load none."""
    code = ("import sys; import collapse_hpo.hpo.integrations, collapse_hpo.hpo.integrations.loop, "
            "collapse_hpo.hpo.integrations.alarm; "
            "print(sorted(m for m in ('torch', 'transformers', 'lightning', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
