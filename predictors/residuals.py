"""Deviation-from-collapse monitor and its alarm rule (METHOD.md §6), numpy only.

A run is compared with a reference normalized curve ℓ_ref(t̂) (a smaller model's L(t̂)/L(1) at the same
controls,
or the surrogate's ℓ̂). The run's divisor c (its predicted final loss) is fitted once on an early window of t̂
(``AlarmRule.align``, the early-align of METHOD.md §4, squared error, closed form); from then on the residual

    r(t̂) = s(t̂)/c − ℓ_ref(t̂)

is tracked, s the run's loss smoothed by a trailing (causal) moving average over ``smooth`` of training.
r is in
units of the normalized loss: r = 0.01 means the run is 1% of its final loss above where the reference says it
should be. The alarm fires at the first report after the window at which r exceeds ``threshold`` (|r| when
``two_sided``) for ``persistence`` consecutive reports; the reported t̂ is that of the last of those reports,
when a live monitor would raise it.

The baseline it is measured against (``raw_loss_alarm``): the smoothed loss rises above its running
minimum by a
relative ``margin`` for ``persistence`` consecutive reports. ``choose_threshold`` picks a rule's threshold on
calibration runs (the smallest value without a false alarm on the clean runs, times a safety factor), so that
false-alarm and detection rates are then measured on other runs.

All t̂ are fractions of the run's training tokens; all losses are in the run's own units.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from collapse_hpo.predictors.errors import InputError


@dataclass(frozen=True)
class AlarmRule:
    """Settings of the deviation alarm.

    Attributes:
        align: (start, end) t̂ window on which the divisor c is fitted; must end before the deviation to catch.
        threshold: residual (normalized-loss units) above which a report counts as deviating.
        persistence: consecutive deviating reports needed to fire (≥ 1).
        smooth: width of the trailing moving average of the loss, as a fraction of training (0: none).
        two_sided: also count r < −threshold (a run better than the reference) as deviating.
    """

    align: tuple[float, float] = (0.1, 0.3)
    threshold: float = 0.01
    persistence: int = 3
    smooth: float = 0.02
    two_sided: bool = False

    def __post_init__(self) -> None:
        a0, a1 = (float(v) for v in self.align)
        if not 0.0 <= a0 < a1 <= 1.0:
            raise InputError(f"alarm rule: align window must satisfy 0 <= start < end <= 1, got {self.align}")
        if not math.isfinite(self.threshold) or self.threshold <= 0:
            raise InputError(f"alarm rule: threshold must be a positive number, got {self.threshold}")
        p = self.persistence
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise InputError(f"alarm rule: persistence must be an integer >= 1, got {self.persistence!r}")
        if not math.isfinite(self.smooth) or not 0.0 <= self.smooth < 1.0:
            raise InputError(f"alarm rule: smooth must be a training fraction in [0, 1), got {self.smooth}")


@dataclass(frozen=True)
class Alarm:
    """Outcome of a check of one run.

    Attributes:
        fired: whether the alarm fired.
        t_hat: t̂ at which it fired (the last of the ``persistence`` deviating reports), else None.
        value: the statistic at that report (residual, or relative rise above the running minimum).
        reason: one line: why it fired, or why not.
    """

    fired: bool
    t_hat: float | None
    value: float | None
    reason: str


@dataclass(frozen=True)
class MonitorResult:
    """Residual series of one run and the alarm decision.

    Attributes:
        t_hat: the run's report points (sorted, finite losses only).
        residual: r(t̂) at each point (NaN before the end of the align window and outside the reference's
        range).
        divisor: the early-align divisor c (predicted final loss; NaN when the window had too few points).
        alarm: the Alarm.
    """

    t_hat: np.ndarray
    residual: np.ndarray
    divisor: float
    alarm: Alarm


def _clean(t_hat: Sequence[float] | np.ndarray, loss: Sequence[float] | np.ndarray, what: str
           ) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(t_hat, dtype=float).ravel()
    y = np.asarray(loss, dtype=float).ravel()
    if t.shape != y.shape:
        raise InputError(f"{what}: t_hat has {t.size} points but loss has {y.size}")
    ok = np.isfinite(t) & np.isfinite(y)
    t, y = t[ok], y[ok]
    order = np.argsort(t, kind="stable")
    return t[order], y[order]


def smooth_trailing(t_hat: np.ndarray, loss: np.ndarray, width: float) -> np.ndarray:
    """Causal moving average: the mean of the losses at t̂ in (t − width, t] (the point itself when width
    is 0)."""
    t = np.asarray(t_hat, dtype=float)
    y = np.asarray(loss, dtype=float)
    if width <= 0 or y.size == 0:
        return y.copy()
    c = np.concatenate([[0.0], np.cumsum(y)])
    lo = np.searchsorted(t, t - width, side="right")
    hi = np.arange(1, y.size + 1)
    lo = np.minimum(lo, hi - 1)
    return (c[hi] - c[lo]) / (hi - lo)


def early_align_divisor(loss: np.ndarray, reference: np.ndarray) -> float:
    """c minimizing Σ (L_i/c − ℓ_i)², closed form: c = Σ L_i² / Σ L_i ℓ_i (NaN when degenerate)."""
    num = float(np.dot(loss, reference))
    return float(np.dot(loss, loss)) / num if num > 0 else math.nan


def normalized_reference(t_hat: Sequence[float] | np.ndarray, loss: Sequence[float] | np.ndarray, *,
                         smooth: float = 0.02) -> tuple[np.ndarray, np.ndarray]:
    """A reference ℓ_ref from a complete reference run: its smoothed loss divided by its final smoothed loss.

    Raises InputError when the run does not reach t̂ ≥ 0.99 or has fewer than 3 finite points.
    """
    t, y = _clean(t_hat, loss, "reference")
    if t.size < 3 or t[-1] < 0.99:
        raise InputError("reference: needs a complete run (at least 3 finite points, last at t_hat >= 0.99)")
    s = smooth_trailing(t, y, smooth)
    return t, s / s[-1]


def residuals(
    t_hat: Sequence[float] | np.ndarray,
    loss: Sequence[float] | np.ndarray,
    ref_t_hat: Sequence[float] | np.ndarray,
    ref_ell: Sequence[float] | np.ndarray,
    rule: AlarmRule | None = None,
) -> MonitorResult:
    """Residuals r(t̂) of a (partial or complete) run against ℓ_ref, and the deviation alarm on them.

    ``ref_t_hat``/``ref_ell`` is the reference normalized curve, linearly interpolated onto the run's points
    (NaN outside its range). Reports up to the end of the align window only fit the divisor; an alarm can fire
    from the first report after it. Never raises on a curve's values (bad points are dropped).
    """
    rule = rule or AlarmRule()
    t, y = _clean(t_hat, loss, "run")
    rt, rl = _clean(ref_t_hat, ref_ell, "reference")
    if rt.size < 2:
        raise InputError("reference: needs at least 2 finite points")
    s = smooth_trailing(t, y, rule.smooth)
    ref = np.interp(t, rt, rl, left=np.nan, right=np.nan)
    a0, a1 = rule.align
    win = (t >= a0) & (t <= a1 + 1e-12) & np.isfinite(ref)
    if int(win.sum()) < 3:
        alarm = Alarm(False, None, None, f"fewer than 3 reports in the align window t_hat [{a0:g}, {a1:g}]: "
                      "no divisor yet")
        return MonitorResult(t, np.full(t.size, np.nan), math.nan, alarm)
    c = early_align_divisor(s[win], ref[win])
    r = np.where(t > a1 + 1e-12, s / c - ref, np.nan)
    stat = np.abs(r) if rule.two_sided else r
    return MonitorResult(t, r, c, _persistent(t, stat, rule.threshold, rule.persistence, "residual"))


def _persistent(t: np.ndarray, stat: np.ndarray, threshold: float, persistence: int, what: str) -> Alarm:
    run = 0
    peak = -math.inf
    for i, v in enumerate(stat):
        if np.isfinite(v):
            peak = max(peak, float(v))
        if np.isfinite(v) and v > threshold:
            run += 1
            if run >= persistence:
                return Alarm(True, float(t[i]), float(v),
                             f"{what} {v:.4g} > {threshold:.4g} for {persistence} reports: alarm at "
                             f"t_hat={t[i]:.3f}")
        else:
            run = 0
    top = "no report judged" if peak == -math.inf else f"largest {what} {peak:.4g}"
    return Alarm(False, None, None, f"{top} (threshold {threshold:.4g}, persistence {persistence}): no alarm")


def raw_loss_alarm(
    t_hat: Sequence[float] | np.ndarray,
    loss: Sequence[float] | np.ndarray,
    *,
    margin: float = 0.01,
    persistence: int = 3,
    smooth: float = 0.02,
    start: float = 0.05,
) -> Alarm:
    """The raw-loss baseline: the smoothed loss rises above its running minimum by ``margin`` (relative).

    From t̂ ≥ ``start`` on, a report deviates when s(t̂) > (1 + margin) · min_{t' ≤ t̂} s(t'); the alarm
    fires after
    ``persistence`` consecutive deviating reports (t̂ of the last one).
    """
    if not math.isfinite(margin) or margin <= 0:
        raise InputError(f"raw-loss rule: margin must be a positive number, got {margin}")
    if isinstance(persistence, bool) or not isinstance(persistence, int) or persistence < 1:
        raise InputError(f"raw-loss rule: persistence must be an integer >= 1, got {persistence!r}")
    t, y = _clean(t_hat, loss, "run")
    s = smooth_trailing(t, y, smooth)
    runmin = np.minimum.accumulate(s) if s.size else s
    rise = np.where(t >= start, s / runmin - 1.0, np.nan)
    return _persistent(t, rise, margin, persistence, "rise above running minimum")


def choose_threshold(
    clean_peaks: Sequence[float],
    *,
    safety: float = 1.25,
    floor: float = 1e-4,
) -> float:
    """A threshold from calibration clean runs: ``safety`` × the largest statistic any clean run reached.

    ``clean_peaks`` holds, per clean calibration run, the largest value of the persistent statistic (see
    ``persistent_peak``). With it no calibration run would have raised an alarm, with a margin of ``safety``.
    """
    peaks = np.asarray([p for p in clean_peaks if np.isfinite(p)], dtype=float)
    if peaks.size == 0:
        raise InputError("choose_threshold: no clean calibration run with a finite statistic")
    return float(max(floor, safety * float(peaks.max())))


def persistent_peak(stat: Sequence[float] | np.ndarray, persistence: int) -> float:
    """The largest threshold that ``stat`` exceeds for ``persistence`` consecutive reports (−inf if none).

    That is the max over windows of ``persistence`` consecutive finite values of the window's minimum: an
    alarm with persistence p fires at a threshold x exactly when x is below this value.
    """
    v = np.asarray(stat, dtype=float)
    best = -math.inf
    for i in range(v.size - persistence + 1):
        w = v[i: i + persistence]
        if np.all(np.isfinite(w)):
            best = max(best, float(w.min()))
    return best


def rise_series(t_hat: Sequence[float] | np.ndarray, loss: Sequence[float] | np.ndarray, *,
                smooth: float = 0.02, start: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """(t̂, relative rise of the smoothed loss above its running minimum) — the raw-loss rule's statistic."""
    t, y = _clean(t_hat, loss, "run")
    s = smooth_trailing(t, y, smooth)
    runmin = np.minimum.accumulate(s) if s.size else s
    return t, np.where(t >= start, s / runmin - 1.0, np.nan)


class Monitor:
    """Online form of ``residuals``: feed reports one at a time, get the alarm as soon as it fires.

    The divisor is fitted once, at the first report past the align window, on the reports inside it (as a live
    monitor must: it never revises the divisor with later, possibly faulty, reports).
    """

    def __init__(self, ref_t_hat: Sequence[float] | np.ndarray, ref_ell: Sequence[float] | np.ndarray,
                 rule: AlarmRule | None = None) -> None:
        self.rule = rule or AlarmRule()
        self.ref_t, self.ref_l = _clean(ref_t_hat, ref_ell, "reference")
        if self.ref_t.size < 2:
            raise InputError("reference: needs at least 2 finite points")
        self.t: list[float] = []
        self.y: list[float] = []
        self.divisor = math.nan
        self.run = 0
        self.alarm: Alarm | None = None
        self.last_residual = math.nan

    def update(self, t_hat: float, loss: float) -> Alarm | None:
        """Add one report (t̂, loss); return the Alarm when it fires at this report (once), else None."""
        if not (math.isfinite(t_hat) and math.isfinite(loss)):
            return None
        if self.t and t_hat <= self.t[-1]:
            return None
        self.t.append(float(t_hat))
        self.y.append(float(loss))
        if self.alarm is not None:
            return None
        a0, a1 = self.rule.align
        if t_hat <= a1 + 1e-12:
            return None
        t = np.asarray(self.t)
        w = self.rule.smooth
        lo = int(np.searchsorted(t, t_hat - w, side="right")) if w > 0 else len(t) - 1
        s_now = float(np.mean(self.y[min(lo, len(t) - 1):]))
        if not math.isfinite(self.divisor):
            s = smooth_trailing(t, np.asarray(self.y), w)
            ref = np.interp(t, self.ref_t, self.ref_l, left=np.nan, right=np.nan)
            win = (t >= a0) & (t <= a1 + 1e-12) & np.isfinite(ref)
            if int(win.sum()) < 3:
                return None
            self.divisor = early_align_divisor(s[win], ref[win])
        ref_now = float(np.interp(t_hat, self.ref_t, self.ref_l, left=np.nan, right=np.nan))
        r = s_now / self.divisor - ref_now
        self.last_residual = r
        v = abs(r) if self.rule.two_sided else r
        if math.isfinite(v) and v > self.rule.threshold:
            self.run += 1
            if self.run >= self.rule.persistence:
                self.alarm = Alarm(True, float(t_hat), float(v),
                                   f"residual {v:.4g} > {self.rule.threshold:.4g} for "
                                   f"{self.rule.persistence} reports: alarm at t_hat={t_hat:.3f}")
                return self.alarm
        else:
            self.run = 0
        return None
