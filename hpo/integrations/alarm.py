"""The deviation-from-collapse alarm during training (``collapse-hpo monitor``'s rule, live).

``DeviationAlarm`` feeds each report (t̂, loss) to ``predictors.residuals.Monitor``: the run's divisor is
fitted once on the early window (``AlarmRule.align``), then the residual r(t̂) = L/c − ℓ_ref(t̂) is tracked and
the alarm fires when r > ``threshold`` for ``persistence`` reports. A loss that is NaN, inf or not positive
fires at once ("diverged"). The reference ℓ_ref is the surrogate's ℓ̂ at the run's controls (schedule, τ,
TPP) or a clean reference run's normalized curve. It fires once; ``fired`` holds the ``Alarm``.

The integrations (hpo/integrations/loop.py, huggingface.py, lightning.py) call it at every report and, when it
fires, warn (``CollapseAlarmWarning``), write ``alarm_attrs`` to the trial (user attr ``collapse_alarm``,
hpo/rule/record.py ``ALARM_ATTR``) or log them, and stop training when asked. numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from collapse_hpo.hpo.rule.record import TrialControls
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.residuals import Alarm, AlarmRule, Monitor, normalized_reference
from collapse_hpo.predictors.surrogate import Surrogate

#: Points of the surrogate's ℓ̂ the alarm interpolates (t̂ from 0 to 1).
REFERENCE_POINTS = 1001


class CollapseAlarmWarning(UserWarning):
    """The run deviates from the collapsed reference curve (or diverged) during training."""


class DeviationAlarm:
    """Deviation-from-collapse alarm, fed one report at a time during training.

    Args:
        reference: a ``Surrogate`` or the path of a surrogate JSON (``collapse-hpo calibrate``): ℓ̂ at
            ``controls``; or a complete clean reference run as a pair (t̂ values, losses) at the same
            controls (normalized by its final loss).
        controls: the run's controls (schedule, τ, TPP) for a surrogate reference (ignored for a run).
        rule: the ``AlarmRule`` (align window, threshold in normalized-loss units, persistence, smoothing);
            default: ``collapse-hpo monitor``'s defaults.

    Raises:
        InputError: on a bad reference (the message names it), e.g. a surrogate with a TPP law and controls
            whose TPP is not defined.
    """

    def __init__(
        self,
        reference: Surrogate | str | tuple[Sequence[float], Sequence[float]],
        *,
        controls: TrialControls | None = None,
        rule: AlarmRule | None = None,
    ) -> None:
        controls = controls or TrialControls()
        if isinstance(reference, str):
            reference = Surrogate.load(reference)
        if isinstance(reference, Surrogate):
            grid = np.linspace(0.0, 1.0, REFERENCE_POINTS)
            ell = reference.normalized(grid, controls.schedule, controls.tau, controls.tpp)
            ref_t, ref_l = grid, np.asarray(ell, dtype=float)
        elif isinstance(reference, tuple | list) and len(reference) == 2:
            ref_t, ref_l = normalized_reference(reference[0], reference[1],
                                                smooth=(rule or AlarmRule()).smooth)
        else:
            raise InputError(f"DeviationAlarm: reference must be a Surrogate, a surrogate JSON path or a "
                             f"(t_hat, loss) pair of a clean run, got {type(reference).__name__}")
        self._monitor = Monitor(ref_t, ref_l, rule)
        self.rule = self._monitor.rule
        self.fired: Alarm | None = None

    def update(self, t_hat: float, loss: float) -> Alarm | None:
        """Add one report (t̂ = fraction of training, training loss); the ``Alarm`` when it fires at this
        report (once), else None. A non-finite or non-positive loss fires at once ("diverged")."""
        if self.fired is not None:
            return None
        t, y = float(t_hat), float(loss)
        if not math.isfinite(y) or y <= 0.0:
            self.fired = Alarm(True, t, y, f"diverged: the loss is {y} at t_hat={t:.3f}: alarm")
            return self.fired
        alarm = self._monitor.update(t, y)
        if alarm is not None:
            self.fired = alarm
        return alarm

    @property
    def divisor(self) -> float:
        """The run's early-align divisor c (its predicted final loss), NaN before the align window ends."""
        return float(self._monitor.divisor)

    @property
    def residual(self) -> float:
        """The latest residual r(t̂) (normalized-loss units), NaN before the align window ends."""
        return float(self._monitor.last_residual)


def alarm_attrs(alarm: Alarm, step: float, units: str) -> dict[str, Any]:
    """The alarm as the trial user attr ``collapse_alarm`` (JSON values): where it fired and why."""
    value = alarm.value if alarm.value is not None and math.isfinite(alarm.value) else None
    return {"t_hat": alarm.t_hat, "step": step, "units": units, "value": value, "reason": alarm.reason}
