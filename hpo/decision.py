"""The pruning decision rule shared by the Optuna pruner and the Ray Tune scheduler.

Stable signature (keep it; callers in hpo/pruner.py and hpo/scheduler.py depend on it)::

    decide(t_hat, loss, *, surrogate, schedule, tau, tpp, competitors, settings) -> Decision

    t_hat:       1-D sequence of training fractions (tokens seen / total_tokens) of the trial's reports.
    loss:        1-D sequence of training losses at those fractions (same length). NaN or inf means the
                 loss diverged (the trial is pruned at once); a caller with a *missing* loss drops that point.
    surrogate:   a calibrated ``predictors.surrogate.Surrogate``, or None when no reference is available yet
                 (then only the non-finite / invalid-loss checks can prune).
    schedule:    ``predictors.schedules.Schedule`` of the trial (peak 1).
    tau:         AdamW timescale B/(ηλD) of the trial; None = no weight decay.
    tpp:         tokens per parameter D/N of the trial.
    competitors: the other trials: a float is a completed trial's final loss; a ``Prediction`` is another
                 trial's prediction (its ``high``, the pessimistic bound, is what counts).
    settings:    ``PruneSettings``.

The rule, in words: below ``min_fraction`` of training nothing is judged. From then on the trial's final
loss is predicted with an interval [low, high] at ``confidence`` (``predict_final_loss``). Each
competitor contributes a pessimistic final loss (a completed trial: its final loss; a running one: its
predicted ``high``; pruned trials do not compete, since they will never finish). The trial is pruned
when its *optimistic* bound ``low`` is worse (larger)
than the ``keep_top_k``-th best pessimistic competitor: then at least ``keep_top_k`` other trials are,
with the stated confidence, going to end better, and this one cannot be among the best ``keep_top_k``. A
NaN, inf or non-positive loss prunes at once. A surrogate without an error model gives no interval: then
low = high = the point prediction (no confidence margin; the reason says so). Points past t̂ = 1 are
ignored (and said so in the reason). The function never raises on a curve; every outcome has a reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from collapse_hpo.predictors.errors import InputError

if TYPE_CHECKING:
    from collapse_hpo.predictors.predict import Prediction
    from collapse_hpo.predictors.schedules import Schedule
    from collapse_hpo.predictors.surrogate import Surrogate

# Tolerance on t̂ = 1: a report at exactly total_tokens (or a rounding hair past it) is the end of training.
_T_HAT_END = 1.0 + 1e-9


@dataclass(frozen=True)
class PruneSettings:
    """Settings of the decision rule.

    Attributes:
        min_fraction: fraction of training tokens (t̂) before which no trial is judged (0 < min_fraction < 1).
        confidence: two-sided confidence of the predicted interval [low, high] (0 < confidence < 1); higher
            confidence = wider intervals = fewer prunes.
        keep_top_k: a trial is kept while it could still be among the ``keep_top_k`` best (integer ≥ 1).
    """

    min_fraction: float = 0.1
    confidence: float = 0.9
    keep_top_k: int = 1

    def __post_init__(self) -> None:
        for name in ("min_fraction", "confidence"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise InputError(f"pruner setting {name!r} must be a finite number, got {value!r}")
        if not 0.0 < self.min_fraction < 1.0:
            raise InputError(
                f"pruner setting 'min_fraction' must be a fraction of training in (0, 1), "
                f"got {self.min_fraction}"
            )
        if not 0.0 < self.confidence < 1.0:
            raise InputError(f"pruner setting 'confidence' must be in (0, 1), got {self.confidence}")
        if isinstance(self.keep_top_k, bool) or not isinstance(self.keep_top_k, int) or self.keep_top_k < 1:
            raise InputError(f"pruner setting 'keep_top_k' must be an integer >= 1, got {self.keep_top_k!r}")


@dataclass(frozen=True)
class Decision:
    """The outcome of one judgement of one trial.

    Attributes:
        prune: True to stop the trial.
        reason: one line saying why (always set).
        fraction: t̂ of the latest valid report used (tokens seen / total_tokens, at most 1); NaN without one.
        prediction: the final-loss prediction, when one was made (also when it failed: then ``ok`` is False).
        threshold: the ``keep_top_k``-th best pessimistic competitor final loss the trial was compared with,
            when a comparison was made.
        notes: what was ignored in the reports (repeated, invalid or past-the-end points); also in ``reason``.
    """

    prune: bool
    reason: str
    fraction: float
    prediction: Prediction | None = None
    threshold: float | None = None
    notes: tuple[str, ...] = ()

    def user_attrs(self) -> dict[str, Any]:
        """The decision as the user attrs written to a trial (JSON values; None where unknown).

        Keys: ``predicted_final_loss``, ``predicted_low``, ``predicted_high`` (losses), ``decision_fraction``
        (t̂), ``prune_reason`` (str). The prediction keys are only filled when the prediction succeeded.
        """
        p = self.prediction
        good = p is not None and p.ok
        return {
            "predicted_final_loss": _json_float(p.final_loss) if good else None,
            "predicted_low": _json_float(p.low) if good else None,
            "predicted_high": _json_float(p.high) if good else None,
            "decision_fraction": _json_float(self.fraction),
            "prune_reason": self.reason,
        }


def _json_float(x: float | None) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


def pessimistic(competitor: float | Prediction) -> float:
    """A competitor's pessimistic final loss: a float as is; a Prediction's ``high`` (else its final_loss).

    Returns NaN when the competitor has no usable value (a failed prediction, a non-finite loss).
    """
    if isinstance(competitor, int | float):
        value = float(competitor)
    else:
        if not getattr(competitor, "ok", False):
            return math.nan
        value = competitor.high if competitor.high is not None else competitor.final_loss
        value = math.nan if value is None else float(value)
    return value if math.isfinite(value) else math.nan


def decide(
    t_hat: Sequence[float] | np.ndarray,
    loss: Sequence[float] | np.ndarray,
    *,
    surrogate: Surrogate | None,
    schedule: Schedule,
    tau: float | None,
    tpp: float,
    competitors: Iterable[float | Prediction],
    settings: PruneSettings,
) -> Decision:
    """Judge one trial from its reports so far (see the module docstring for the rule).

    Args:
        t_hat: training fractions of the reports (tokens seen / total_tokens), any order.
        loss: training losses at those fractions; NaN/inf = diverged.
        surrogate: calibrated surrogate, or None (no reference yet).
        schedule: the trial's LR schedule shape.
        tau: AdamW timescale; None = no weight decay.
        tpp: tokens per parameter.
        competitors: completed trials' final losses (float) and other trials' predictions (Prediction).
        settings: PruneSettings.

    Returns:
        A Decision. Raises ValueError only when ``t_hat`` and ``loss`` differ in length (a caller bug).
    """
    t = np.asarray(t_hat, dtype=float).ravel()
    y = np.asarray(loss, dtype=float).ravel()
    if t.shape != y.shape:
        raise ValueError(f"decide: t_hat has {t.size} points but loss has {y.size}")
    notes: list[str] = []
    d = _decide(t, y, surrogate, schedule, tau, tpp, competitors, settings, notes)
    return replace(d, notes=tuple(notes)) if notes else d


def _decide(
    t: np.ndarray,
    y: np.ndarray,
    surrogate: Surrogate | None,
    schedule: Schedule,
    tau: float | None,
    tpp: float,
    competitors: Iterable[float | Prediction],
    settings: PruneSettings,
    notes: list[str],
) -> Decision:

    bad_t = ~np.isfinite(t) | (t < 0)
    if bad_t.any():
        notes.append(f"{int(bad_t.sum())} report(s) with an invalid t_hat ignored")
        t, y = t[~bad_t], y[~bad_t]
    if t.size == 0:
        return Decision(False, _join("no loss reported yet: nothing to judge", notes), math.nan)

    order = np.argsort(t, kind="stable")
    t, y = t[order], y[order]
    dup = np.concatenate([[False], np.diff(t) == 0])
    if dup.any():
        notes.append(f"{int(dup.sum())} repeated report(s) at the same t_hat ignored (first kept)")
        t, y = t[~dup], y[~dup]

    # Divergence is judged on every report, also those past t̂ = 1: a NaN is a NaN.
    nonfinite = ~np.isfinite(y)
    if nonfinite.any():
        i = int(np.flatnonzero(nonfinite)[0])
        return Decision(
            True,
            _join(f"loss is {y[i]} at t_hat={t[i]:.4g}: the run diverged; pruned at once", notes),
            float(min(t[i], 1.0)),
        )
    nonpositive = y <= 0
    if nonpositive.any():
        i = int(np.flatnonzero(nonpositive)[0])
        return Decision(
            True,
            _join(
                f"loss is {y[i]:.6g} at t_hat={t[i]:.4g}: a training loss must be positive (a bug in the "
                "loss or the logging); pruned at once",
                notes,
            ),
            float(min(t[i], 1.0)),
        )

    past = t > _T_HAT_END
    if past.any():
        notes.append(
            f"{int(past.sum())} report(s) past t_hat=1 (up to {t.max():.4g}) ignored: check total_tokens"
        )
        t, y = t[~past], y[~past]
        if t.size == 0:
            return Decision(False, _join("no report at t_hat <= 1: nothing to judge", notes), math.nan)
    fraction = float(min(t[-1], 1.0))

    if fraction < settings.min_fraction:
        return Decision(
            False,
            _join(f"t_hat={fraction:.4g} < min_fraction={settings.min_fraction:g}: not judged yet", notes),
            fraction,
        )
    if surrogate is None:
        return Decision(False, _join("no reference surrogate: cannot predict, kept", notes), fraction)

    from collapse_hpo.predictors.predict import predict_final_loss

    prediction = predict_final_loss(
        t,
        y,
        surrogate=surrogate,
        schedule=schedule,
        tau=tau,
        tpp=tpp,
        min_fraction=settings.min_fraction,
        confidence=settings.confidence,
    )
    if not prediction.ok:
        return Decision(
            False, _join(f"no prediction ({prediction.reason}): kept", notes), fraction, prediction
        )

    pessimists = sorted(v for v in (pessimistic(c) for c in competitors) if math.isfinite(v))
    k = settings.keep_top_k
    pred = float(prediction.final_loss)
    low = float(prediction.low) if prediction.low is not None else pred
    conf = "no error model: point prediction"
    if prediction.low is not None:
        conf = f"at {settings.confidence:.0%}"
    if len(pessimists) < k:
        return Decision(
            False,
            _join(
                f"predicted final loss {pred:.4g} (low {low:.4g} {conf}); only {len(pessimists)} "
                f"competitor(s) with a final loss or prediction, keep_top_k={k}: kept",
                notes,
            ),
            fraction,
            prediction,
        )
    threshold = pessimists[k - 1]
    if low > threshold:
        reason = (
            f"optimistic final loss {low:.4g} ({conf}; predicted {pred:.4g}) > {threshold:.4g}, the "
            f"pessimistic final loss of the {_ordinal(k)} best competitor: pruned at t_hat={fraction:.3g}"
        )
        return Decision(True, _join(reason, notes), fraction, prediction, threshold)
    reason = (
        f"optimistic final loss {low:.4g} ({conf}; predicted {pred:.4g}) <= {threshold:.4g}, the "
        f"pessimistic final loss of the {_ordinal(k)} best competitor: kept"
    )
    return Decision(False, _join(reason, notes), fraction, prediction, threshold)


def _join(reason: str, notes: list[str]) -> str:
    return reason if not notes else f"{reason} ({'; '.join(notes)})"
