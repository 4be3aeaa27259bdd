"""A plain training loop's helper: ``TrainingWatch.report(step, loss)`` says whether to stop.

It does the two things the collapse method offers during training, for any loop (and is what the Hugging
Face and Lightning callbacks of this package call):

- the Optuna pruner: with a ``trial``, it writes the run's controls to the trial once (``set_trial_controls``:
  units, total, schedule, τ, TPP), reports each loss with its step in those units and asks
  ``trial.should_prune()``; ``pruned`` then says to raise ``optuna.TrialPruned``;
- the deviation alarm (hpo/integrations/alarm.py): at each report; when it fires it warns
  (``CollapseAlarmWarning``), writes the alarm to the trial (user attr ``collapse_alarm``) or, without a
  trial, to the ``logging`` logger ``collapse_hpo``, and, with ``stop_on_alarm``, says to stop.

No Optuna import here: the trial is any object with ``number``, ``report``, ``should_prune`` and
``set_user_attr``.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from collapse_hpo.hpo.integrations.alarm import CollapseAlarmWarning, DeviationAlarm, alarm_attrs
from collapse_hpo.hpo.rule.record import (
    ALARM_ATTR,
    FRACTION_STEPS,
    NOTES_ATTR,
    TrialControls,
    controls_notes,
    set_trial_controls,
)
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.residuals import Alarm, AlarmRule
from collapse_hpo.predictors.schedules import Schedule

LOGGER = logging.getLogger("collapse_hpo")
#: Points at which ``sampled_schedule`` reads a trainer's LR multiplier.
SCHEDULE_SAMPLES = 200


def sampled_schedule(multiplier: Callable[[int], float], steps: int) -> Schedule:
    """The schedule shape of a trainer's own LR rule ``multiplier(step)`` (e.g. a ``LambdaLR``'s lambda), read
    at ``SCHEDULE_SAMPLES`` + 1 steps from 0 to ``steps`` and scaled to peak 1 (kind "data")."""
    grid = sorted({round(steps * i / SCHEDULE_SAMPLES) for i in range(SCHEDULE_SAMPLES + 1)})
    values = [float(multiplier(s)) for s in grid]
    peak = max(values)
    if not (math.isfinite(peak) and peak > 0):
        raise InputError(f"the LR schedule's peak multiplier is {peak}: cannot read its shape")
    return Schedule(kind="data", points=tuple((s / steps, max(v, 0.0) / peak) for s, v in zip(grid, values)))


class TrainingWatch:
    """Watch one training run: report (step, loss), get "stop" when the trial is pruned or the alarm fires.

    Args:
        trial: the Optuna trial of the run (None: no pruning, the alarm only).
        total: the run's training length in ``units`` (e.g. the number of optimizer steps).
        units: what ``step`` counts: "steps" (optimizer steps, the default), "tokens" or "fraction" (t̂).
        schedule, tau, tpp: the run's controls (LR schedule shape; AdamW timescale, for a run counted in steps
            1/(η·λ·steps), ``predictors.timescale.step_tau``, None = no weight decay; tokens per parameter,
            None = not defined: said in a note, never guessed).
        alarm: a ``DeviationAlarm``, or its reference (a ``Surrogate`` or surrogate JSON path: ℓ̂ at these
            controls), or None (no alarm).
        alarm_rule: the ``AlarmRule`` for an alarm built here (default: ``collapse-hpo monitor``'s).
        stop_on_alarm: say "stop" when the alarm fires (default: warn and record only).
        report: report the losses to the trial (False where the trainer reports them itself, as Hugging
            Face's hyperparameter search does with its objective).

    Raises:
        InputError: on bad controls or a bad alarm reference (nothing is written to the trial then).
    """

    def __init__(
        self,
        trial: Any = None,
        *,
        total: float | None = None,
        units: str = "steps",
        schedule: Schedule | str | Mapping[str, Any] | None = None,
        tau: float | None = None,
        tpp: float | None = None,
        alarm: Any = None,
        alarm_rule: AlarmRule | None = None,
        stop_on_alarm: bool = False,
        report: bool = True,
    ) -> None:
        self.controls = TrialControls.check(total=total, units=units, schedule=schedule, tau=tau, tpp=tpp,
                                            where="TrainingWatch")
        if self.controls.total is None:
            raise InputError(f"TrainingWatch: give total (the training length in {units})")
        if alarm is not None and not isinstance(alarm, DeviationAlarm):
            alarm = DeviationAlarm(alarm, controls=self.controls, rule=alarm_rule)
        self.trial = trial
        self.deviation = alarm
        self.stop_on_alarm = bool(stop_on_alarm)
        self.report_losses = bool(report)
        self.notes = controls_notes(self.controls)
        self.pruned = False
        self.alarm: Alarm | None = None
        self.stop_reason: str | None = None
        self._t: list[float] = []
        self._y: list[float] = []
        for note in self.notes:
            LOGGER.info("collapse-hpo: %s", note)
        if trial is not None:
            c = self.controls
            set_trial_controls(trial, total=c.total, units=c.units, schedule=c.schedule, tau=c.tau, tpp=c.tpp)
            if self.notes:
                trial.set_user_attr(NOTES_ATTR, list(self.notes))

    def t_hat(self, step: float) -> float:
        """The fraction of training of a step in ``units``."""
        return float(step) / float(self.controls.total)  # type: ignore[arg-type]

    def report(self, step: float, loss: float) -> bool:
        """Take one report (step in ``units``, training or validation loss); True when training should stop:
        the trial was pruned (``pruned``; raise ``optuna.TrialPruned``) or the alarm fired with
        ``stop_on_alarm`` (``alarm``). ``stop_reason`` says which."""
        if self.stop_reason is not None:
            return True
        loss = float(loss)
        t = self.t_hat(step)
        self._t.append(t)
        self._y.append(loss)
        if self.deviation is not None:
            fired = self.deviation.update(t, loss)
            if fired is not None:
                self._raise_alarm(fired, step)
                if self.stop_on_alarm:
                    self.stop_reason = f"deviation alarm: {fired.reason}"
                    return True
        if self.trial is not None and self.report_losses:
            self.trial.report(loss, step=self.optuna_step(step))
            if self.trial.should_prune():
                self.pruned = True
                self.stop_reason = f"pruned by the collapse rule at t_hat={t:.3f}"
                return True
        return False

    @property
    def curve(self) -> tuple[list[float], list[float]]:
        """The reports so far as (t̂ values, losses): a clean run's curve is a reference for the next run's
        alarm (``alarm=watch.curve``)."""
        return list(self._t), list(self._y)

    def optuna_step(self, step: float) -> int:
        """The integer step Optuna stores for a step in ``units`` (t̂ · FRACTION_STEPS for a fraction)."""
        if self.controls.units == "fraction":
            return round(float(step) * FRACTION_STEPS)
        return round(float(step))

    def _raise_alarm(self, alarm: Alarm, step: float) -> None:
        self.alarm = alarm
        where = f"trial {self.trial.number}" if self.trial is not None else "run"
        message = f"collapse-hpo: {where}: {alarm.reason}"
        warnings.warn(message, CollapseAlarmWarning, stacklevel=3)
        LOGGER.warning(message)
        if self.trial is not None:
            value = float(step)
            self.trial.set_user_attr(
                ALARM_ATTR, alarm_attrs(alarm, value if math.isfinite(value) else None, self.controls.units)
            )


@dataclass(frozen=True)
class WatchOptions:
    """What a trainer callback (hpo/integrations/huggingface.py, lightning.py) gives the ``TrainingWatch`` it
    starts for each run: the alarm (``alarm``, ``alarm_rule``, ``stop_on_alarm``, as ``TrainingWatch``'s) and
    what the trainer cannot tell (``tokens_per_sample`` for TPP, ``schedule`` for an LR rule of no known
    shape)."""

    alarm: Any = None
    alarm_rule: AlarmRule | None = None
    stop_on_alarm: bool = False
    tokens_per_sample: int | None = None
    schedule: Schedule | str | Mapping[str, Any] | None = None

    def start(self, trial: Any, controls: Mapping[str, Any], *, report: bool) -> TrainingWatch:
        """A ``TrainingWatch`` for one run with the trainer's ``controls``."""
        return TrainingWatch(trial, **controls, alarm=self.alarm, alarm_rule=self.alarm_rule,
                             stop_on_alarm=self.stop_on_alarm, report=report)
