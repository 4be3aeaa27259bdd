"""Final-loss prediction from a partial curve by early alignment (METHOD.md §4).

Given a run's loss up to a training fraction p and its controls (schedule, τ, TPP), find the divisor c ≈ L(1)
that maps the observed window onto the surrogate's ℓ̂. Three alignment losses, all closed form in u = 1/c:

- ``sq``:  minimize Σ (L_i u − ℓ̂_i)²  →  u = Σ L_i ℓ̂_i / Σ L_i²  (the paper's formulation);
- ``mae``: minimize Σ |L_i u − ℓ̂_i|   →  u = weighted median of ℓ̂_i / L_i with weights L_i;
- ``log``: minimize Σ (log L_i − log c − log ℓ̂_i)²  →  log c = mean(log L_i − log ℓ̂_i).

Each point is weighted by its share of t̂ (trapezoid weights), so the result does not depend on the logging
density. The interval comes from the surrogate's learned error model at that fraction. When the run's model
size N (``params``) is given and the surrogate learned a size trend, the prediction is corrected by the bias
the trend gives at ln N, and the interval is the trend's (wider the farther N lies from the reference sizes);
a prediction whose N, TPP or τ lies outside the reference ranges says so in ``extrapolation``.
`predict_final_loss` never raises on a curve: when no prediction can be made it returns a Prediction whose
``reason`` says why.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from collapse_hpo.predictors.misfit import (
    collapses,
    current_loss,
    misfit_ratio,
    shown_interval,
    stretches,
    systematic_residual,
)
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import ErrorBand, Surrogate

MIN_POINTS = 3
_T_CACHE: dict[tuple[float, int], float] = {}


@dataclass(frozen=True)
class Prediction:
    """A final-loss prediction (loss units of the input curve).

    Attributes:
        final_loss: predicted final loss L(1), or None when no prediction could be made.
        low, high: the interval at the requested confidence, or None (no error model, or no prediction).
        fraction: training fraction t̂ of the last point used.
        reason: why no prediction was made (None when ``final_loss`` is set).
        n_points: points in the alignment window.
        align_mae: mean |L_i/c − ℓ̂_i| over the window (how well the partial curve matches the surrogate).
        size_bias: the log correction from the size trend applied to the alignment divisor (final_loss =
            divisor · exp(size_bias)); None when none was applied (no ``params`` or no size trend).
        extrapolation: a note when the run's params, TPP or τ lie outside the surrogate's reference ranges.
        fit_residual: the systematic part of the alignment residual L_i/c − ℓ̂_i, averaged within stretches
            of the window (``misfit.systematic_residual``), so that batch-to-batch noise does not count as
            misfit (normalized-loss units).
        misfit: ``fit_residual`` over the reference's held-out ``fit_residual`` at this fraction
            (predictors/misfit.py; above ``MISFIT_LIMIT`` the curve does not collapse); None when the
            surrogate stored no reference residual.
        high_at_current: the shown interval's upper end is at least ``current_loss`` (a surrogate whose
            ``info["shown_high_at_current"]`` is set: a prior, predictors/prior.py, which cannot tell a run
            that stalls from one that follows its shape).
        current_loss: the curve's loss at its latest reports (``misfit.current_loss``), and lowest_loss: the
            lowest loss it reported: levels a widened interval reaches (``misfit.shown_interval``).
    """

    final_loss: float | None
    low: float | None
    high: float | None
    fraction: float
    reason: str | None = None
    n_points: int = 0
    align_mae: float | None = None
    size_bias: float | None = None
    extrapolation: str | None = None
    fit_residual: float | None = None
    misfit: float | None = None
    current_loss: float | None = None
    lowest_loss: float | None = None
    high_at_current: bool = False

    @property
    def ok(self) -> bool:
        """True when a prediction was made."""
        return self.final_loss is not None and self.reason is None

    @property
    def collapses(self) -> bool:
        """Whether the partial curve collapses onto the reference shape (True when the misfit is unknown)."""
        return collapses(self.misfit)

    @property
    def shown(self) -> tuple[float | None, float | None]:
        """The interval to show (``misfit.shown_interval``): ``(low, high)`` when the curve collapses, wider
        when it does not. The decision rule uses ``low`` and ``high``; screens use this."""
        if self.final_loss is None:
            return self.low, self.high
        low, high = shown_interval(self.final_loss, self.low, self.high, self.misfit, self.current_loss,
                                   self.lowest_loss)
        if self.high_at_current and high is not None and self.current_loss is not None:
            high = max(high, self.current_loss)
        return low, high


def _fail(reason: str, fraction: float = 0.0, n: int = 0) -> Prediction:
    return Prediction(final_loss=None, low=None, high=None, fraction=fraction, reason=reason, n_points=n)


def spacing_weights(t_hat: np.ndarray) -> np.ndarray:
    """Trapezoid weights of sorted t̂ samples (half the distance to the neighbours), so that an alignment is an
    integral over t̂ and does not depend on how densely a trainer logged; uniform when all t̂ coincide."""
    t = np.asarray(t_hat, dtype=float)
    if t.size < 2:
        return np.ones_like(t)
    w = np.empty_like(t)
    w[1:-1] = 0.5 * (t[2:] - t[:-2])
    w[0] = 0.5 * (t[1] - t[0])
    w[-1] = 0.5 * (t[-1] - t[-2])
    total = w.sum()
    return w / total if total > 0 else np.ones_like(t)


def align_divisor(loss: np.ndarray, shape: np.ndarray, method: str = "sq", weights: np.ndarray | None = None
                  ) -> float:
    """The divisor c with loss/c ≈ shape (ℓ̂) under the alignment loss ``method``; NaN when degenerate.

    ``weights`` (default uniform) weight each point's term in the loss.
    """
    w = np.ones_like(loss) if weights is None else weights
    if method == "sq":
        den = float(np.dot(w * loss, loss))
        num = float(np.dot(w * loss, shape))
        return den / num if num > 0 else math.nan
    if method == "log":
        return float(np.exp(np.dot(w, np.log(loss) - np.log(shape)) / np.sum(w)))
    if method == "mae":
        ratio = shape / loss
        order = np.argsort(ratio)
        cw = np.cumsum((w * loss)[order])
        j = int(np.searchsorted(cw, 0.5 * cw[-1]))
        u = float(ratio[order][min(j, ratio.size - 1)])
        return 1.0 / u if u > 0 else math.nan
    raise ValueError(f"unknown alignment loss {method!r}")


def t_quantile(confidence: float, n: int) -> float:
    """The two-sided Student-t quantile t_{(1+confidence)/2, n−1} (n−1 at least 1) of the intervals."""
    v = _T_CACHE.get((confidence, n))  # the exact arguments first: no rounding on the hot path
    if v is not None:
        return v
    key = (round(confidence, 6), n)
    v = _T_CACHE.get(key)
    if v is None:
        v = _t_ppf(0.5 + 0.5 * confidence, max(n - 1, 1))
        _T_CACHE[key] = v
    _T_CACHE[(confidence, n)] = v
    return v


def _t_ppf(q: float, df: float) -> float:
    """``scipy.stats.t.ppf(q, df=df)``, to the bit. For 0 < q < 1 and df >= 1 that is scipy's own
    ``special.stdtrit(df, q) * scale + loc`` with scale 1 and loc 0 (``rv_continuous.ppf``, ``t_gen._ppf``),
    done here without importing scipy.stats: its import was ~0.25 CPU s of the first judgement of a process
    (scipy.special comes with scipy.optimize, which calibration imports anyway). Other arguments go to
    scipy.stats. tests/test_predictors_predict.py checks the bits against scipy.stats."""
    if 0.0 < q < 1.0 and df >= 1:
        from scipy import special

        return float(special.stdtrit(df, q)) * 1.0 + 0.0
    from scipy import stats

    return float(stats.t.ppf(q, df=df))


def interval(
    final_loss: float, band: ErrorBand | None, confidence: float
) -> tuple[float | None, float | None]:
    """The (low, high) interval around a predicted final loss from an error band (None, None without one).

    With r = log(actual/predicted) ~ bias ± scale, the interval is a Student-t prediction interval for one new
    run: final_loss · exp(bias ± t_{(1+confidence)/2, n−1} · scale · sqrt(1 + 1/n)).
    """
    if band is None:
        return None, None
    half = t_quantile(confidence, band.n) * band.scale * math.sqrt(1.0 + 1.0 / band.n)
    return final_loss * math.exp(band.bias - half), final_loss * math.exp(band.bias + half)


def predict_final_loss(
    t_hat: np.ndarray | list[float],
    loss: np.ndarray | list[float],
    *,
    surrogate: Surrogate,
    schedule: Schedule,
    tau: float | None,
    tpp: float | None,
    min_fraction: float = 0.1,
    confidence: float = 0.9,
    params: float | None = None,
) -> Prediction:
    """Predict the final loss of a run from its partial curve (t̂ = tokens seen / total tokens, loss).

    Points may come in any order (repeats allowed). The prediction uses the points with t̂ in
    [surrogate.align_start · p, p], p the last t̂. ``params`` (the model's non-embedding parameter count N,
    optional) lets the surrogate's size trend correct the point and set the interval. Returns a Prediction
    with a ``reason`` instead of raising
    when:
    the inputs are not 1-D arrays of equal length, a value is NaN/inf, a loss is ≤ 0, a t̂ lies outside
    [0, 1], p < ``min_fraction``, fewer than 3 points are in the window, or the surrogate cannot serve these
    controls (e.g. a τ law calibrated with weight decay and a run without, or a TPP law and a run whose
    ``tpp`` is None: not defined).
    """
    cache = _ACTIVE_CACHE
    bucket = cache.bucket(surrogate) if cache is not None else None
    key = _key(t_hat, loss, schedule, tau, tpp, min_fraction, confidence, params) \
        if bucket is not None else None
    if key is not None:
        hit = bucket.get(key)
        if hit is not None:
            cache.hits += 1
            return hit
    try:
        out = _predict(t_hat, loss, surrogate, schedule, tau, tpp, min_fraction, confidence, params)
    except Exception as err:  # a curve must never crash a sweep: report the failure as a reason
        out = _fail(f"prediction failed: {type(err).__name__}: {err}")
    if key is not None:
        cache.misses += 1
        bucket[key] = out
    return out


def _key(t_hat: Any, loss: Any, schedule: Schedule, tau: Any, tpp: Any, min_fraction: Any, confidence: Any,
         params: Any) -> tuple[Any, ...] | None:
    """The memo key of one call within one surrogate's bucket; None when the inputs are not plain numbers
    (then the call is not cached)."""
    try:
        t = np.asarray(t_hat, dtype=np.float64)
        y = np.asarray(loss, dtype=np.float64)
        key = (t.shape, t.tobytes(), y.shape, y.tobytes(), schedule, tau, tpp, min_fraction, confidence,
               params)
        hash(key)
    except (TypeError, ValueError):
        return None
    return key


class PredictionCache:
    """Memo of ``predict_final_loss``: the same inputs give the same (immutable) Prediction, computed once.

    Exact by construction: per surrogate object (by identity; the cache holds a reference, so an identity
    is never reused while its entries exist), the key is the inputs themselves (t̂ and loss as float64
    bytes, the schedule, τ, TPP, min_fraction, confidence, params). A surrogate must not be changed while
    the cache is in use. Entries are kept for the ``max_surrogates`` surrogates used most recently (an
    online reference fits a new one whenever the completed trials change; older fits are not asked again).
    Used by the replay harness (hpo/replays/replay.py), where the prediction of one trial from its first k
    reports against one surrogate recurs in every trial order; install it with ``caching(cache)``.
    Counts ``hits`` and ``misses``.

    A miss still reuses the alignment (``_Aligned``) of a surrogate with the same ``shape_key``: an online
    reference's fit, tested on the sweep's curves as they advance (hpo/rule/reference.py), is a new surrogate
    object whose bands widen whenever a tested curve moves on, but whose shape is the fit's; only the cheap
    error-model step is redone (exact: the same arithmetic on the same alignment).
    """

    def __init__(self, max_surrogates: int = 8) -> None:
        self.max_surrogates = max_surrogates
        self.hits = 0
        self.misses = 0
        self._buckets: dict[int, tuple[Surrogate, dict[tuple[Any, ...], Prediction]]] = {}
        self._shapes: dict[tuple[Any, ...], dict[tuple[Any, ...], Prediction | _Aligned]] = {}

    def alignments(self, surrogate: Surrogate) -> dict[tuple[Any, ...], Prediction | _Aligned]:
        """The alignments of surrogates with ``surrogate``'s shape (made most recent; the least recent shape
        beyond ``max_surrogates`` is dropped)."""
        key = shape_key(surrogate)
        got = self._shapes.pop(key, None)
        if got is None:
            got = {}
        self._shapes[key] = got
        while len(self._shapes) > self.max_surrogates:
            del self._shapes[next(iter(self._shapes))]
        return got

    def bucket(self, surrogate: Surrogate) -> dict[tuple[Any, ...], Prediction]:
        """The entries of one surrogate (made most recent; the least recent bucket beyond
        ``max_surrogates`` is dropped with its reference)."""
        sid = id(surrogate)
        got = self._buckets.pop(sid, None)
        if got is None or got[0] is not surrogate:
            got = (surrogate, {})
        self._buckets[sid] = got  # re-inserted: the dict's order is the order of use
        while len(self._buckets) > self.max_surrogates:
            del self._buckets[next(iter(self._buckets))]
        return got[1]

    @property
    def size(self) -> int:
        """Predictions held."""
        return sum(len(b) for _, b in self._buckets.values())


_ACTIVE_CACHE: PredictionCache | None = None


@contextmanager
def caching(cache: PredictionCache | None) -> Iterator[PredictionCache | None]:
    """Within the block, ``predict_final_loss`` answers from ``cache`` (None: no cache). Not thread-safe:
    for one thread's work (the replay harness), not for a live sweep's workers."""
    global _ACTIVE_CACHE
    before = _ACTIVE_CACHE
    _ACTIVE_CACHE = cache
    try:
        yield cache
    finally:
        _ACTIVE_CACHE = before


def align_partial(
    t_hat: np.ndarray, loss: np.ndarray, *, surrogate: Surrogate, schedule: Schedule, tau: float | None,
    tpp: float | None, min_fraction: float = 0.1, confidence: float = 0.9,
) -> Prediction | _Aligned:
    """The first step of ``predict_final_loss`` (without ``params``): the partial curve aligned onto the
    surrogate's shape, which every surrogate with the same ``shape_key`` gives alike, or the failed
    Prediction saying why none can be made. Never raises (a failure is a failed Prediction, as there).
    ``final_loss_of`` finishes it for one surrogate: the paired comparison predicts each competitor from
    its points up to a fraction for every tested copy of a fit, and aligns it once per shape
    (hpo/rule/decision.py)."""
    try:
        return _aligned_cached(t_hat, loss, surrogate, schedule, tau, tpp, min_fraction, confidence)
    except Exception as err:  # as predict_final_loss: a curve must never crash a sweep
        return _fail(f"prediction failed: {type(err).__name__}: {err}")


def final_loss_of(
    aligned: Prediction | _Aligned, surrogate: Surrogate, *, tau: float | None, tpp: float | None,
    confidence: float = 0.9,
) -> float | None:
    """The predicted final loss (loss units) of ``predict_final_loss`` without ``params`` when it succeeds,
    else None, from its alignment (``align_partial`` of the same curve, controls, min_fraction and
    confidence, with a surrogate of ``surrogate``'s ``shape_key``): the same second step, ``_finish``, with
    ``surrogate``'s error model (whose failure fails the prediction there too)."""
    if isinstance(aligned, Prediction):
        return float(aligned.final_loss) if aligned.ok else None
    # Without ``params`` ``_finish``'s point is the alignment divisor c, and its Prediction is ok. Of what it
    # computes besides, only the interval can fail on a validated surrogate and controls ``_align`` took (its
    # exp overflows for a band of absurd width): that is computed; the fit summary, the extrapolation note
    # and the Prediction itself are not (a paired comparison asks this of every competitor at every
    # judgement). tests/test_predictors_predict.py checks it against ``_finish``.
    try:
        interval(aligned.c, surrogate.error_band(aligned.p), confidence)
    except Exception:  # predict_final_loss's failed Prediction
        return None
    return float(aligned.c)


def _predict(t_hat, loss, surrogate, schedule, tau, tpp, min_fraction, confidence, params) -> Prediction:
    aligned = _aligned_cached(t_hat, loss, surrogate, schedule, tau, tpp, min_fraction, confidence)
    if isinstance(aligned, Prediction):
        return aligned
    out = _finish(aligned, surrogate, tau, tpp, confidence, params)
    edge = seen_tau_edge(surrogate, tau)
    if edge is None or out.low is None or out.high is None:
        return out
    # A run without weight decay is served at the τ law's limit (b = 0: no LR term, so no drop from an LR
    # decay still ahead). The limit is an extrapolation past every τ the surrogate saw: the interval also
    # holds the prediction at the largest τ it saw, as the size trend's interval holds the uncorrected
    # prediction beyond the reference sizes. The point stays the limit's.
    at_edge = _aligned_cached(t_hat, loss, surrogate, schedule, edge, tpp, min_fraction, confidence)
    if isinstance(at_edge, Prediction):
        return out
    other = _finish(at_edge, surrogate, edge, tpp, confidence, params)
    if other.low is None or other.high is None:
        return out
    return replace(out, low=min(out.low, other.low), high=max(out.high, other.high))


def seen_tau_edge(surrogate: Surrogate, tau: float | None) -> float | None:
    """The largest τ of ``surrogate``'s reference runs when ``tau`` (a run without weight decay: None or
    inf) is served at its τ law's limit (``Surrogate.no_decay_limit``); None otherwise."""
    if tau is not None and tau != math.inf:
        return None
    if not surrogate.no_decay_limit or surrogate.tau_law != "power" or surrogate.b_e >= 0:
        return None
    seen = surrogate.reference.get("tau")
    return float(seen[1]) if seen else None


@dataclass(frozen=True)
class _Aligned:
    """What an alignment gives, before the error model: it depends on the surrogate's shape only
    (``shape_key``), not on its error bands, paired errors or size trend."""

    p: float
    n: int
    c: float
    mae: float
    resid: float
    current: float
    lowest: float


def shape_key(surrogate: Surrogate) -> tuple[Any, ...]:
    """Every field of ``surrogate`` that an alignment reads (ℓ̂'s constants and laws, the align loss and
    window): two surrogates with equal keys align every curve alike (an online fit and the same fit tested on
    the sweep's curves, which only widens its bands)."""
    s = surrogate
    return (s.b_c, s.b_e, s.q_c, s.q_e, s.eps1, s.eps2, s.m, s.tau_law, s.tpp_law, s.align, s.align_start,
            s.no_decay_limit)


def _aligned_cached(
    t_hat, loss, surrogate, schedule, tau, tpp, min_fraction, confidence
) -> Prediction | _Aligned:
    """``_align``, answered from the active cache's alignments of surrogates with the same ``shape_key``."""
    cache = _ACTIVE_CACHE
    key = _key(t_hat, loss, schedule, tau, tpp, min_fraction, confidence, None) if cache is not None else None
    if key is None:
        return _align(t_hat, loss, surrogate, schedule, tau, tpp, min_fraction, confidence)
    memo = cache.alignments(surrogate)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _align(t_hat, loss, surrogate, schedule, tau, tpp, min_fraction, confidence)
    return hit


def _align(t_hat, loss, surrogate, schedule, tau, tpp, min_fraction, confidence) -> Prediction | _Aligned:
    """The alignment of the partial curve onto the surrogate's ℓ̂ (no error model yet), or the failed
    Prediction that says why none can be made."""
    try:
        t = np.asarray(t_hat, dtype=float)
        y = np.asarray(loss, dtype=float)
    except (TypeError, ValueError):
        return _fail("t_hat and loss must be numeric sequences")
    if t.ndim != 1 or y.ndim != 1 or t.shape != y.shape:
        return _fail(f"t_hat and loss must be 1-D of equal length (got shapes {t.shape} and {y.shape})")
    if t.size == 0:
        return _fail("no points yet")
    # The array methods (``t.max()``, ``.all()``) are numpy's functions without their dispatch: a prediction
    # is ~25 points, where the per-call cost is the cost.
    if not np.isfinite(t).all():
        return _fail("t_hat has NaN/inf values")
    p = float(t.max())
    if t.min() < 0.0 or p > 1.0 + 1e-9:
        return _fail(f"t_hat outside [0, 1] (range {t.min():.4g} to {p:.4g}): a run reported past its end",
                     fraction=min(p, 1.0))
    if not np.isfinite(y).all():
        bad = float(t[np.flatnonzero(~np.isfinite(y))[0]])
        return _fail(f"loss is NaN/inf at t_hat={bad:.4g} (the run diverged or logged a bad value)",
                     fraction=p)
    if (y <= 0.0).any():
        bad = float(t[np.flatnonzero(y <= 0.0)[0]])
        return _fail(f"loss is not positive at t_hat={bad:.4g}", fraction=p)
    if not 0.0 < confidence < 1.0:
        return _fail(f"confidence must be in (0, 1), got {confidence}", fraction=p)
    if p < min_fraction:
        return _fail(f"fraction {p:.4g} is below min_fraction {min_fraction:g}", fraction=p)
    window = t >= surrogate.align_start * p
    n = int(np.count_nonzero(window))
    t_in = t[window]
    order = t_in.argsort(kind="stable")
    tw, yw = t_in[order], y[window][order]
    # Distinct t̂ counted on the sorted window as np.unique counts them (neighbours that differ; no NaN here).
    distinct = 1 + int(np.count_nonzero(tw[1:] != tw[:-1])) if tw.size else 0
    if distinct < MIN_POINTS:
        return _fail(f"too few points to align: {distinct} distinct t_hat in "
                     f"[{surrogate.align_start * p:.3g}, {p:.3g}], need {MIN_POINTS}", fraction=p, n=n)
    try:
        b, q = surrogate.b(tau), surrogate.q(tpp)
    except ValueError as err:
        return _fail(str(err), fraction=p, n=n)
    eta_end = schedule.end() if isinstance(schedule, Schedule) else float(schedule(1.0))
    shape = surrogate.normalized_bq(tw, np.asarray(schedule(tw), dtype=float), eta_end, b, q)
    if not np.isfinite(shape).all() or (shape <= 0).any():
        return _fail("the surrogate gives a non-finite or non-positive shape for these controls",
                     fraction=p, n=n)
    w = spacing_weights(tw)
    c = align_divisor(yw, shape, surrogate.align, w)
    if not math.isfinite(c) or c <= 0:
        return _fail("alignment failed (degenerate window)", fraction=p, n=n)
    r = yw / c - shape  # the alignment residual
    mae = float(np.dot(w, np.abs(r)) / w.sum())
    bins = stretches(tw)
    return _Aligned(p=p, n=n, c=c, mae=mae, resid=systematic_residual(tw, r, w, bins),
                    current=current_loss(tw, yw, w, bins), lowest=float(y.min()))


def _finish(
    a: _Aligned, surrogate: Surrogate, tau: Any, tpp: Any, confidence: float, params: Any
) -> Prediction:
    """The Prediction from an alignment and the surrogate's error model (bands, size trend)."""
    p, n, c, mae, resid = a.p, a.n, a.c, a.mae, a.resid
    band = surrogate.error_band(p)
    fit = {"fit_residual": resid, "current_loss": a.current, "lowest_loss": a.lowest,
           "high_at_current": bool(surrogate.info.get("shown_high_at_current")),
           "misfit": misfit_ratio(resid, band.fit_residual if band is not None else None)}
    # The point is the raw alignment divisor; the interval carries the error model's learned mean miss (bias),
    # so with a strongly biased error model the point can lie outside its own interval. Shifting the point by
    # the bias was tried and rejected: an error model learned from very few groups (e.g. 2 sizes of mpl) can
    # have a bias of e^17, which leaves the interval merely uninformative but the point absurd.
    extrap = surrogate.extrapolation(params, tpp, tau)
    sized = surrogate.size_band(p, params, confidence) if params is not None else None
    if sized is not None:
        # The size trend's rule was chosen by how well it predicted held-out end sizes from the others, with a
        # margin over no correction, so its bias is checked against sizes it did not see. With 2 sizes
        # ("widen") the point stays the raw divisor and only the interval widens.
        bias, half, kind = sized
        point = c * math.exp(bias) if kind == "trend" else c
        center = point if kind == "trend" else c * math.exp(bias)
        low, high = center * math.exp(-half), center * math.exp(half)
        if kind == "trend" and surrogate.outside_sizes(params) > 0:
            # Beyond the reference sizes the correction is itself an extrapolation: the interval keeps the
            # uncorrected prediction inside, so it holds whether or not the trend goes on.
            low, high = min(low, c), max(high, c)
        return Prediction(final_loss=point, low=low, high=high, fraction=p, reason=None, n_points=n,
                          align_mae=mae, size_bias=bias if kind == "trend" else None, extrapolation=extrap,
                          **fit)
    low, high = interval(c, band, confidence)
    return Prediction(final_loss=c, low=low, high=high, fraction=p, reason=None, n_points=n, align_mae=mae,
                      extrapolation=extrap, **fit)
