"""How far a partial curve is from collapsing, and the interval shown for a prediction that does not collapse.

A prediction aligns a partial curve onto the surrogate's shape ℓ̂ (predictors/predict.py). Its alignment
residual r_i = L_i/c − ℓ̂_i says how well the curve follows that shape; averaged within each of ``BINS``
equal stretches of the window, its mean absolute value is the prediction's ``fit_residual``: the systematic
part of the misfit, without the batch-to-batch noise of the losses. Calibration keeps, per
training fraction p, what it was on the reference's own held-out curves truncated at p
(``ErrorBand.fit_residual``, the ``MISFIT_QUANTILE`` quantile). The **misfit** of a prediction is the ratio:

    misfit = Prediction.fit_residual / ErrorBand.fit_residual(p)

A misfit above ``MISFIT_LIMIT`` means the curve *does not collapse* onto the reference shape: the learned
error band was measured on curves that do, and does not hold for it. The interval shown for such a
prediction is widened (``shown_interval``): its learned margins are raised to the power k = misfit /
MISFIT_LIMIT and applied around every level the curve may end at: the prediction, the curve's current loss
(its mean loss over the window's last stretch) and the lowest loss it reported so far. The rule and its
threshold were chosen on our development curves, never on external data (BENCHMARKS.md, "Shown intervals").

The decision rule (hpo/rule/decision.py) is untouched by all of this: it uses the learned band, as before.
Only what is shown on screen changes. The wording of the flag lives here, once (``NOT_COLLAPSING``,
``misfit_note``, ``prediction_text``).
"""

from __future__ import annotations

import math

import numpy as np

#: The quantile of the reference's held-out alignment residuals a misfit is measured against.
MISFIT_QUANTILE = 0.9
#: The alignment window is cut into this many equal stretches; the residual is averaged within each.
BINS = 8
#: A prediction whose misfit exceeds this does not collapse (its interval is widened, its note says so).
#: Chosen on the development curves (studies/bench/shown_intervals.py, "choice"): the smallest of 1.5, 2,
#: 2.5, 3 that flags at most 1% of the predictions on our collapsing CPU sweeps (1.5 flagged 1.4%).
MISFIT_LIMIT = 2.0
#: The flag, as every screen shows it.
NOT_COLLAPSING = "does not collapse"


def stretches(t_hat: np.ndarray) -> np.ndarray:
    """The index (0 .. ``BINS`` − 1) of each point's stretch of the window [t̂_first, t̂_last], equal widths
    (points sorted by t̂); a caller of both ``systematic_residual`` and ``current_loss`` on the same points
    passes it to both."""
    t = np.asarray(t_hat, dtype=float)
    span = float(t[-1] - t[0])
    if not span > 0:
        return np.zeros(t.size, dtype=np.intp)
    return np.minimum(((t - t[0]) * (BINS / span)).astype(np.intp), BINS - 1)


def systematic_residual(
    t_hat: np.ndarray, residual: np.ndarray, weights: np.ndarray, bins: np.ndarray | None = None
) -> float:
    """The systematic part of an alignment residual r (normalized-loss units): r averaged within each of
    ``BINS`` equal stretches of the window (``weights``: the points' spacing weights), then the weighted mean
    of the absolute stretch means. Batch-to-batch noise averages out within a stretch; a curve whose shape
    departs from ℓ̂ keeps its departure. O(n). Points sorted by t̂. ``bins``: ``stretches(t_hat)`` when the
    caller has it already (a prediction asks for it twice)."""
    b = stretches(t_hat) if bins is None else bins
    w = np.asarray(weights, dtype=float)
    wb = np.bincount(b, weights=w, minlength=BINS)
    rb = np.bincount(b, weights=w * np.asarray(residual, dtype=float), minlength=BINS)
    have = wb > 0
    return float(np.abs(rb[have]).sum() / wb[have].sum())


def current_loss(
    t_hat: np.ndarray, loss: np.ndarray, weights: np.ndarray, bins: np.ndarray | None = None
) -> float:
    """The curve's loss at its latest reports: the weighted mean loss over the last of the ``BINS`` stretches
    of the window (``weights``: the points' spacing weights). Points sorted by t̂. ``bins``: as in
    ``systematic_residual``."""
    last = (stretches(t_hat) if bins is None else bins) == BINS - 1
    w = np.asarray(weights, dtype=float)[last]
    y = np.asarray(loss, dtype=float)[last]
    total = w.sum()
    return float(np.dot(w, y) / total) if total > 0 else float(y[-1])


def misfit_ratio(residual: float | None, reference: float | None) -> float | None:
    """A prediction's ``fit_residual`` over the reference's at the same fraction; None when either is
    unknown (a surrogate calibrated before the reference residual was stored)."""
    if residual is None or reference is None or not reference > 0 or not math.isfinite(residual):
        return None
    return float(residual) / float(reference)


#: The widened interval's bounds stay within e^±LOG_CAP (finite floats).
LOG_CAP = 700.0


def collapses(misfit: float | None, limit: float = MISFIT_LIMIT) -> bool:
    """Whether a prediction's curve collapses onto the reference shape: misfit <= ``limit`` (True when the
    misfit is unknown)."""
    return misfit is None or not math.isfinite(misfit) or misfit <= limit


def shown_interval(
    final_loss: float, low: float | None, high: float | None, misfit: float | None,
    current_loss: float | None = None, lowest_loss: float | None = None, limit: float = MISFIT_LIMIT,
) -> tuple[float | None, float | None]:
    """The interval to show for a prediction: (low, high) as learned when the curve collapses, else widened.

    Widened, with k = misfit / ``limit`` > 1: the learned margins low/final_loss and high/final_loss are
    raised to the power k, and applied around every level the curve may end at: ``final_loss`` (the shape
    holds after all), ``current_loss`` (the curve stops improving, or gets worse from here) and
    ``lowest_loss``, the lowest loss it reported so far (it recovers, as a run that blew up does when its
    LR decays). Low = the lowest level × (low/final_loss)^k, high = the highest × (high/final_loss)^k.
    Losses in the curve's units; (None, None) stays as it is; a level that is None is left out.
    """
    if low is None or high is None or collapses(misfit, limit) or not final_loss > 0 or not (low > 0 < high):
        return low, high
    assert misfit is not None
    k = misfit / limit
    levels = [v for v in (final_loss, current_loss, lowest_loss)
              if v is not None and math.isfinite(v) and v > 0]
    # In logs, capped: a misfit of hundreds (a curve far off the reference's shape) raises the margins to a
    # power that overflows a float; the interval is then (near 0, huge), still a number to show.
    lo = math.log(min(levels)) + k * math.log(low / final_loss)
    hi = math.log(max(levels)) + k * math.log(high / final_loss)
    return math.exp(max(lo, -LOG_CAP)), math.exp(min(hi, LOG_CAP))


def misfit_note(misfit: float, fraction: float | None = None) -> str:
    """The one line that says a curve does not collapse, and what that does to the shown prediction."""
    at = "" if fraction is None or not math.isfinite(fraction) else f" at t_hat={fraction:.3g}"
    return (
        f"{NOT_COLLAPSING} onto the reference shape (alignment residual {misfit:.1f}x the reference's{at}): "
        "the predicted final loss is unreliable, its interval is widened"
    )


def prediction_text(
    final_loss: float, low: float | None, high: float | None, misfit: float | None
) -> str:
    """A shown prediction in words, for every screen (progress lines, notes, figures): "predicted 2.4170
    [2.300, 2.550]" when the curve collapses; otherwise the flag first, then the point with its widened
    interval, so a number is never shown alone as if it could be trusted. ``low``/``high`` are the shown
    interval (``shown_interval``)."""
    band = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
    if collapses(misfit):
        return f"predicted {final_loss:.4f}{band}"
    assert misfit is not None
    return (f"{NOT_COLLAPSING} (alignment residual {misfit:.1f}x the reference's): predicted "
            f"{final_loss:.4f} is unreliable, interval{band or ' unknown'}")
