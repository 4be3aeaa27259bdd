"""Collapse metrics: normalize curves, resample them on a t̂ grid, and measure how well a family collapses.

- `smooth`: local-linear smoothing in t̂ (a box window of half-width ``width``; unbiased on linear trends, so
  the final value of a decaying curve is not pulled up as a moving average would).
- `normalize`: ℓ(t̂) = L(t̂)/L(1), optionally smoothed first (METHOD.md §1).
- `resample`: values on a common t̂ grid (NaN outside a curve's range).
- `spread`: Δ(t̂) = std across runs of ℓ(t̂) on the grid; mean and max over t̂ ∈ [0.2, 1].
- `seed_noise` / `supercollapse`: σ(t̂), the seed-to-seed std within groups of repeated runs, and Δ/σ.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from collapse_hpo.predictors.curves import Curve
from collapse_hpo.predictors.errors import InputError

DEFAULT_GRID = np.linspace(0.2, 1.0, 81)


def smooth(t_hat: np.ndarray, loss: np.ndarray, width: float) -> np.ndarray:
    """Local-linear smoothing of ``loss`` over t̂ with a box window of half-width ``width`` (t̂ units).

    Each point gets the value at its t̂ of the least-squares line through the points within ±width. O(n).
    Points must be sorted by t̂ and finite; ``width`` ≤ 0 returns a copy.
    """
    t = np.asarray(t_hat, dtype=float)
    y = np.asarray(loss, dtype=float)
    if width <= 0 or t.size < 3:
        return y.copy()
    lo = np.searchsorted(t, t - width, side="left")
    hi = np.searchsorted(t, t + width, side="right")
    tc = t - t.mean()

    def csum(a: np.ndarray) -> np.ndarray:
        return np.concatenate(([0.0], np.cumsum(a)))

    s0 = (hi - lo).astype(float)
    s1 = csum(tc)[hi] - csum(tc)[lo]
    s2 = csum(tc * tc)[hi] - csum(tc * tc)[lo]
    sy = csum(y)[hi] - csum(y)[lo]
    sty = csum(tc * y)[hi] - csum(tc * y)[lo]
    den = s0 * s2 - s1 * s1
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(den > 1e-300, (s0 * sty - s1 * sy) / den, 0.0)
        mean_y = sy / s0
        mean_t = s1 / s0
    return mean_y + slope * (tc - mean_t)


def normalize(curve: Curve, smooth_width: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(t̂, ℓ) of a curve's finite points with ℓ = L / L(1); L(1) is the (smoothed) last point.

    Raises InputError when the curve has fewer than 2 finite positive points.
    """
    ok = np.isfinite(curve.loss) & np.isfinite(curve.t_hat)
    t, y = curve.t_hat[ok], curve.loss[ok]
    if t.size < 2 or np.any(y <= 0):
        raise InputError(f"curve {curve.run!r}: needs at least 2 finite, positive losses to normalize")
    ys = smooth(t, y, smooth_width) if smooth_width > 0 else y
    final = float(ys[-1])
    if not final > 0:
        raise InputError(f"curve {curve.run!r}: smoothed final loss is not positive")
    return t, ys / final


def resample(t_hat: np.ndarray, values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Linear interpolation of ``values`` onto ``grid``; NaN where the grid lies outside the sampled t̂."""
    t = np.asarray(t_hat, dtype=float)
    v = np.asarray(values, dtype=float)
    g = np.asarray(grid, dtype=float)
    out = np.interp(g, t, v)
    out[(g < t[0] - 1e-12) | (g > t[-1] + 1e-12)] = np.nan
    return out


@dataclass(frozen=True)
class Spread:
    """Spread of normalized curves on a t̂ grid: Δ(t̂) and its mean and max over t̂ ∈ [lo, hi]."""

    grid: np.ndarray
    delta: np.ndarray
    mean: float
    max: float


def _on_grid(curves: Sequence[Curve], grid: np.ndarray, smooth_width: float) -> np.ndarray:
    rows = []
    for c in curves:
        t, ell = normalize(c, smooth_width)
        rows.append(resample(t, ell, grid))
    return np.vstack(rows)


def spread(
    curves: Sequence[Curve], grid: np.ndarray | None = None, smooth_width: float = 0.0,
    window: tuple[float, float] = (0.2, 1.0),
) -> Spread:
    """Δ(t̂) = std (ddof = 0) across ``curves`` of ℓ(t̂) on ``grid``; mean and max over ``window``.

    Needs at least 2 curves. Grid points that fewer than 2 curves cover are NaN and left out of the summary.
    """
    if len(curves) < 2:
        raise InputError("spread: needs at least 2 curves")
    g = DEFAULT_GRID if grid is None else np.asarray(grid, dtype=float)
    vals = _on_grid(curves, g, smooth_width)
    count = np.sum(np.isfinite(vals), axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        delta = np.where(count >= 2, np.nanstd(vals, axis=0), np.nan)
    sel = (g >= window[0]) & (g <= window[1]) & np.isfinite(delta)
    mean = float(np.mean(delta[sel])) if sel.any() else math.nan
    mx = float(np.max(delta[sel])) if sel.any() else math.nan
    return Spread(grid=g, delta=delta, mean=mean, max=mx)


def seed_noise(
    groups: Sequence[Sequence[Curve]], grid: np.ndarray | None = None, smooth_width: float = 0.0,
    window: tuple[float, float] = (0.2, 1.0),
) -> Spread:
    """σ(t̂): the seed-to-seed std of ℓ(t̂) within each group of repeated runs, averaged (RMS) over groups.

    Groups with fewer than 2 curves are skipped; raises InputError when none has 2.
    """
    g = DEFAULT_GRID if grid is None else np.asarray(grid, dtype=float)
    vars_ = []
    for grp in groups:
        if len(grp) >= 2:
            vars_.append(spread(grp, g, smooth_width, window).delta ** 2)
    if not vars_:
        raise InputError("seed_noise: needs at least one group with 2 or more seeds")
    sigma = np.sqrt(np.nanmean(np.vstack(vars_), axis=0))
    sel = (g >= window[0]) & (g <= window[1]) & np.isfinite(sigma)
    return Spread(grid=g, delta=sigma, mean=float(np.mean(sigma[sel])), max=float(np.max(sigma[sel])))


@dataclass(frozen=True)
class Supercollapse:
    """Δ across sizes (of seed-averaged curves) against the seed noise σ; ratio < 1 is supercollapse."""

    spread: Spread
    noise: Spread
    ratio_mean: float
    ratio: np.ndarray


def supercollapse(
    groups: Sequence[Sequence[Curve]], grid: np.ndarray | None = None, smooth_width: float = 0.0,
    window: tuple[float, float] = (0.2, 1.0),
) -> Supercollapse:
    """Δ/σ for groups of seeds (one group per size): Δ(t̂) is the std across groups of each group's mean ℓ(t̂),
    σ(t̂) the RMS seed std within groups; ``ratio_mean`` = mean Δ / mean σ over ``window``.
    """
    g = DEFAULT_GRID if grid is None else np.asarray(grid, dtype=float)
    if len(groups) < 2:
        raise InputError("supercollapse: needs at least 2 groups (sizes)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        means = np.vstack([np.nanmean(_on_grid(grp, g, smooth_width), axis=0) for grp in groups])
        count = np.sum(np.isfinite(means), axis=0)
        delta = np.where(count >= 2, np.nanstd(means, axis=0), np.nan)
    sel = (g >= window[0]) & (g <= window[1]) & np.isfinite(delta)
    sp = Spread(grid=g, delta=delta, mean=float(np.mean(delta[sel])), max=float(np.max(delta[sel])))
    noise = seed_noise(groups, g, smooth_width, window)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = delta / noise.delta
    return Supercollapse(spread=sp, noise=noise, ratio_mean=sp.mean / noise.mean, ratio=ratio)
