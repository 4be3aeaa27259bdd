"""Calibration of the surrogate's constants (b_c, b_e, q_c, q_e[, m]) from reference curves.

The paper's recipe (METHOD.md §3): normalize each curve by its final loss, then minimize the MAE between ℓ
and ℓ̂ over t̂ ∈ [0.2, 1] by an alternating grid search (the b pair with q fixed, then the q pair with b fixed,
until nothing changes). We refine the grid optimum by Nelder–Mead on the same objective (bounded as lmfit
bounds). Every curve counts equally, and within a curve every t̂ counts equally (trapezoid weights on a
common grid), however densely it was logged.

Two additions serve early prediction (the "gap" of the paper's recipe: a fit good on [0.2, 1] can still
predict the final loss badly from 10–20%):

- ``fit_start`` sets the fit region [fit_start, 1] (the paper: 0.2);
- ``predict_weight`` adds to the objective the mean |log(c_p / L(1))| of the early-align predictions c_p made
  from the first p ∈ ``predict_fractions`` of each reference curve, so the constants are chosen for what they
  are used for. 0 gives the paper's objective.

After the fit, the error model: each curve group (runs with equal controls, e.g. seeds of one size) is held
out in turn (at most ``folds`` folds), the surrogate is refit on the rest, and the held-out curves' final
losses are predicted from their first p of training (the real `predict_final_loss` on the truncated raw
curve). The residuals log(actual/predicted) by p become the surrogate's ``error_bands``. With a single group
the residuals are in-sample, and the calibration notes say so. Differences of the residuals of two curves
held out together (one fold's surrogate) become ``pair_bands``: the error of a predicted ratio of two final
losses, in which a bias shared by the fold cancels (the pruner's paired comparison).

When the curves carry model sizes (``Curve.params``, N), the same held-out residuals also give the
``size_trend``: per fraction p, a least-squares line of the per-size mean residual in ln N (3 or more sizes;
every size is held out in some fold, the smallest and largest included), so that a prediction for a size
outside the reference range carries the bias the line extrapolates and an interval that widens with the
distance (see `SizeTrend`). With 2 sizes the line cannot be checked, and the trend only widens the interval
outside the range. The calibrated ranges of N, TPP and τ are recorded in ``Surrogate.reference``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from collapse_hpo.predictors.collapse import smooth as smooth_curve
from collapse_hpo.predictors.curves import Curve, some_runs
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.misfit import MISFIT_QUANTILE
from collapse_hpo.predictors.predict import predict_final_loss
from collapse_hpo.predictors.schedules import decay_distance
from collapse_hpo.predictors.surrogate import ErrorBand, SizeTrend, Surrogate, extrapolate_bias

ERROR_FRACTIONS = (0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5)
PREDICT_FRACTIONS = (0.1, 0.2, 0.3)
GRID = np.linspace(0.005, 1.0, 200)
# A law whose control varies by less than this ratio over the reference set is not identifiable: constant.
MIN_LAW_RANGE = 1.2
SCALE_FLOOR = 1e-4
# A size correction is used only when its mean squared miss on the end-size tests is at most this share of the
# miss of no correction (chosen a priori, not fitted: on qiu chess, the development family, every correction
# beats none by far more; with few, noisy sizes a small edge on 2 tests is chance).
RULE_MARGIN = 0.5


@dataclass(frozen=True)
class CurveFit:
    """One row of the fit table: how well the calibrated ℓ̂ matches one reference curve.

    ``mae`` is the mean |ℓ − ℓ̂| over t̂ ∈ [fit_start, 1]; ``mae_paper`` over [0.2, 1] (the paper's measure);
    ``pred_error`` maps a fraction p to the held-out relative error predicted/actual − 1 of the final loss.
    """

    run: str
    tau: float | None
    tpp: float | None
    b: float
    q: float
    mae: float
    mae_paper: float
    pred_error: dict[float, float | None]


@dataclass
class Calibration:
    """A calibrated surrogate with its fit table and notes (degenerate laws, the m check, fit settings)."""

    surrogate: Surrogate
    table: list[CurveFit]
    mean_mae: float
    mean_mae_paper: float
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def format_table(self) -> str:
        """The fit table as aligned text: one row per curve, then the means and the notes."""
        fr = [p for p in (0.1, 0.2, 0.3) if any(p in r.pred_error for r in self.table)]
        head = f"{'run':<28} {'tau':>8} {'tpp':>9} {'b':>8} {'q':>7} {'MAE%':>7} {'MAE%[.2,1]':>10}"
        head += "".join(f" {'err@' + format(p, 'g'):>9}" for p in fr)
        lines = [head, "-" * len(head)]
        for r in self.table:
            tau = "none" if r.tau is None else f"{r.tau:.4g}"
            tpp = "-" if r.tpp is None else f"{r.tpp:.4g}"
            row = (
                f"{r.run[:28]:<28} {tau:>8} {tpp:>9} {r.b:>8.4g} {r.q:>7.4g} {100 * r.mae:>7.3f} "
                f"{100 * r.mae_paper:>10.3f}"
            )
            for p in fr:
                e = r.pred_error.get(p)
                row += f" {'-' if e is None else format(100 * e, '+.2f') + '%':>9}"
            lines.append(row)
        lines.append("-" * len(head))
        lines.append(
            f"mean MAE {100 * self.mean_mae:.3f}% over the fit region, {100 * self.mean_mae_paper:.3f}% "
            f"over t_hat [0.2, 1]; {len(self.table)} curves; {self.seconds:.1f} s"
        )
        s = self.surrogate
        lines.append(
            f"b = {s.b_c:.5g} * tau^{s.b_e:.4g} ({s.tau_law})   q = {s.q_c:.5g} * tpp^{s.q_e:.4g} "
            f"({s.tpp_law})   m = {s.m:.4g}   align = {s.align}, window t_hat >= {s.align_start:g}*p"
        )
        for band in s.error_bands:
            lines.append(
                f"error model at p={band.fraction:g}: bias {100 * band.bias:+.2f}%, "
                f"scale {100 * band.scale:.2f}%, max |err| {100 * band.max_abs:.2f}% (n={band.n})"
            )
        for t in s.size_trend:
            per_size = ", ".join(f"{math.exp(x):.3g}: {100 * r:+.2f}%" for x, r in zip(t.xs, t.rs))
            rule = {-1: "none", 0: "mean", 1: "nearest size"}.get(t.k, f"line through {t.k} nearest sizes")
            what = f"rule {rule}" if t.kind == "trend" else "2 sizes: widen only"
            lines.append(
                f"size error at p={t.fraction:g} (log actual/predicted by N: {per_size}); {what}, "
                f"end-size miss {100 * t.ext_error:.2f}% per {t.step:.2g} in ln N"
            )
        for band in s.pair_bands:
            lines.append(
                f"paired error at p={band.fraction:g}: scale {100 * band.scale:.2f}%, "
                f"max |err| {100 * band.max_abs:.2f}% ({band.n} curves)"
            )
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


@dataclass
class _Data:
    """Reference curves on the common grid, as arrays (C curves × G grid points)."""

    ell: np.ndarray  # normalized loss ℓ = L/L(1)
    eta: np.ndarray  # η(t̂)/peak
    eta1: np.ndarray  # η(1) per curve
    valid: np.ndarray  # grid point inside the curve's observed range
    w_fit: np.ndarray  # trapezoid weights over [fit_start, 1], each curve's row sums to 1
    w_paper: np.ndarray  # the same over [0.2, 1]
    w_pred: list[np.ndarray]  # per predict fraction: weights of the align window (rows sum to 1 or 0)
    has_pred: np.ndarray  # (P, C): curve has an align window at that fraction
    log_tau: np.ndarray  # log(τ/τ0), 0 for a constant law
    log_tpp: np.ndarray  # log(TPP/TPP0), 0 for a constant law
    log_r: np.ndarray  # log((1+ε1)/(t̂+ε1)) on the grid
    #: what the objective needs that does not depend on the parameters (log(η + ε2), Σ w ℓ² per window),
    #: made at the first evaluation: a fit evaluates the objective thousands of times on the same curves
    cache: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)


#: The error model reuses the m check's fold fits with m fixed when m stays fixed (``calibrate``): they are
#: the same calls. False runs them again (tests/test_predictors_calibrate.py: the same surrogate either way).
REUSE_M_CHECK_FITS = True
#: When the m check frees m, the error model's fold fits are the m check's free-m ones too (``calibrate``):
#: fits of the same rows with the same settings, started at the fixed-m optimum of all curves instead of the
#: free-m one, so equal up to Nelder–Mead's tolerance (held-out bands within ~1e-5 of each other). Five
#: refinements fewer per online fit of five folds: a quarter of its time (BENCHMARKS §43). False refits them.
REUSE_FREE_M_FITS = True


def _subset(d: _Data, idx: np.ndarray) -> _Data:
    """The curves ``idx`` of ``d`` as their own _Data (a fit on a fold evaluates on these rows only)."""
    return _Data(
        ell=d.ell[idx], eta=d.eta[idx], eta1=d.eta1[idx], valid=d.valid[idx], w_fit=d.w_fit[idx],
        w_paper=d.w_paper[idx], w_pred=[w[idx] for w in d.w_pred], has_pred=d.has_pred[:, idx],
        log_tau=d.log_tau[idx], log_tpp=d.log_tpp[idx], log_r=d.log_r,
    )


def _trapezoid(grid: np.ndarray, mask: np.ndarray) -> np.ndarray:
    w = np.zeros_like(grid)
    idx = np.flatnonzero(mask)
    if idx.size >= 2:
        t = grid[idx]
        ww = np.empty(idx.size)
        ww[1:-1] = 0.5 * (t[2:] - t[:-2])
        ww[0] = 0.5 * (t[1] - t[0])
        ww[-1] = 0.5 * (t[-1] - t[-2])
        w[idx] = ww / ww.sum()
    elif idx.size == 1:
        w[idx] = 1.0
    return w


def _laws(curves: Sequence[Curve], min_range: float) -> tuple[str, str, float, float, list[str]]:
    notes = []
    taus = [c.tau for c in curves]
    none = [t is None for t in taus]
    if any(none) and not all(none):
        runs = ", ".join(c.run for c in curves if c.tau is None)[:200]
        raise InputError(
            f"calibrate: some runs have no weight decay (tau empty: {runs}) and others have a tau; "
            "calibrate them separately"
        )
    if all(none):
        tau_law, tau0 = "constant", 1.0
        notes.append("no run has weight decay (tau empty): b(tau) degenerates to the constant b = b_c")
    else:
        tv = np.array(taus, dtype=float)
        tau0 = float(np.exp(np.mean(np.log(tv))))
        if tv.max() / tv.min() < min_range:
            tau_law = "constant"
            what = (
                "a single tau"
                if np.allclose(tv, tv[0], rtol=1e-9)
                else f"tau values spanning only {tv.min():.4g} to {tv.max():.4g} (< x{min_range:g})"
            )
            notes.append(
                f"the reference set has {what}: b(tau) degenerates to the constant b = b_c (b_e = 0)"
            )
        else:
            tau_law = "power"
    undefined = [c.run for c in curves if c.tpp is None]
    if undefined and len(undefined) < len(curves):
        runs = ", ".join(undefined)[:200]
        raise InputError(
            f"calibrate: {len(undefined)} of {len(curves)} runs have no tpp (empty: not defined, e.g. "
            f"fine-tuning: {runs}) and the others have one; q(TPP) cannot be fitted on both: calibrate them "
            "separately, or leave tpp empty for every run (q is then a constant)"
        )
    if undefined:
        notes.append(f"tpp not defined for {len(undefined)} runs: q(TPP) held constant (q = q_c)")
        return tau_law, "constant", tau0, 1.0, notes
    pv = np.array([c.tpp for c in curves], dtype=float)
    tpp0 = float(np.exp(np.mean(np.log(pv))))
    if pv.max() / pv.min() < min_range:
        tpp_law = "constant"
        what = (
            "a single tpp"
            if np.allclose(pv, pv[0], rtol=1e-9)
            else f"tpp values spanning only {pv.min():.4g} to {pv.max():.4g} (< x{min_range:g})"
        )
        notes.append(f"the reference set has {what}: q(tpp) degenerates to the constant q = q_c (q_e = 0)")
    else:
        tpp_law = "power"
    return tau_law, tpp_law, tau0, tpp0, notes


def _prepare(
    curves: Sequence[Curve],
    fit_start: float,
    align_start: float,
    predict_fractions: Sequence[float],
    smooth_width: float,
    tau0: float,
    tpp0: float,
    tau_law: str,
    tpp_law: str,
    eps1: float,
) -> _Data:
    C, G = len(curves), GRID.size
    ell = np.ones((C, G))
    eta = np.zeros((C, G))
    eta1 = np.zeros(C)
    valid = np.zeros((C, G), dtype=bool)
    for i, c in enumerate(curves):
        ok = np.isfinite(c.loss) & np.isfinite(c.t_hat)
        t, y = c.t_hat[ok], c.loss[ok]
        order = np.argsort(t, kind="stable")
        t, y = t[order], y[order]
        if smooth_width > 0:
            y = smooth_curve(t, y, smooth_width)
        final = float(y[-1])
        inside = (t[0] - 1e-12 <= GRID) & (t[-1] + 1e-12 >= GRID)
        valid[i] = inside
        ell[i] = np.interp(GRID, t, y) / final
        eta[i] = np.asarray(c.schedule(GRID), dtype=float)
        eta1[i] = float(c.schedule(1.0))
    w_fit = np.vstack([_trapezoid(GRID, valid[i] & (fit_start <= GRID)) for i in range(C)])
    w_paper = np.vstack([_trapezoid(GRID, valid[i] & (GRID >= 0.2)) for i in range(C)])
    w_pred, has = [], []
    for p in predict_fractions:
        rows = [
            _trapezoid(GRID, valid[i] & (align_start * p <= GRID) & (p + 1e-12 >= GRID)) for i in range(C)
        ]
        m = np.vstack(rows)
        w_pred.append(m)
        has.append(np.count_nonzero(m, axis=1) >= 3)
    log_tau = (
        np.zeros(C) if tau_law == "constant" else np.log(np.array([c.tau for c in curves], float) / tau0)
    )
    log_tpp = (
        np.zeros(C) if tpp_law == "constant" else np.log(np.array([c.tpp for c in curves], float) / tpp0)
    )
    return _Data(
        ell=ell,
        eta=eta,
        eta1=eta1,
        valid=valid,
        w_fit=w_fit,
        w_paper=w_paper,
        w_pred=w_pred,
        has_pred=np.array(has).reshape(len(predict_fractions), C),
        log_tau=log_tau,
        log_tpp=log_tpp,
        log_r=np.log((1.0 + eps1) / (GRID + eps1)),
    )


def _q_terms(d: _Data, q: np.ndarray, eps2: float) -> tuple[np.ndarray, np.ndarray]:
    """(η + ε2)^q on the grid (..., C, G) and at t̂ = 1 (..., C), for q of shape (..., C)."""
    le, le1 = _log_eta(d, eps2)  # (C, G), (C,)
    return np.exp(q[..., None] * le), np.exp(q * le1)


def _shapes(
    d: _Data, b: np.ndarray, q: np.ndarray, m: float, eps2: float,
    q_terms: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """ℓ̂ for parameter sets: b, q of shape (K, C) → (K, C, G). ``q_terms``: ``_q_terms`` of one q (C,) that
    every set shares, made once by a grid search that holds q fixed (the same values as each set's own: an
    exponential of the same products)."""
    p, p1 = _q_terms(d, q, eps2) if q_terms is None else q_terms
    return (_first(d, m) + b[:, :, None] * p) / (1.0 + b * p1)[:, :, None]


def _objective(d: _Data, shapes: np.ndarray, predict_weight: float) -> np.ndarray:
    """Objective per parameter set (K,): mean over curves of the fit MAE, plus predict_weight times the mean
    |log c_p/L(1)| of the early-align predictions."""
    ell = d.ell
    # np.add.reduce is what np.sum and ndarray.mean run, without their wrappers' per-call cost (a fit
    # evaluates this thousands of times on small arrays); the same numbers, bit for bit.
    work = np.subtract(ell, shapes)  # (K, C, G), reused for every product below
    np.abs(work, out=work)
    np.multiply(work, d.w_fit, out=work)
    mae = np.add.reduce(work, axis=2)  # (K, C)
    obj = np.add.reduce(mae, axis=1) / mae.shape[1]
    terms = _predict_terms(d) if predict_weight > 0 else None
    if terms is not None:  # every predict fraction: (P', K, C), each number as one fraction alone
        wl, den, has = terms
        num = np.empty((wl.shape[0], *shapes.shape[:2]))
        part = shapes[:, :, d.cache["span"]]
        work = work[:, :, : wl.shape[2]]  # (K, C, S): each row contiguous, as the sums want
        for k in range(wl.shape[0]):  # one fraction at a time: a (K, C, S) product, not a (P', K, C, S) one
            np.multiply(wl[k], part, out=work)
            np.add.reduce(work, axis=2, out=num[k])  # Σ w ℓ ℓ̂ (the span's sum is the whole row's)
        with np.errstate(divide="ignore", invalid="ignore"):
            err = np.abs(np.log(np.where(num > 0, num, np.nan) / den[:, None]))
        errs = _nanmean(np.where(has[:, None], err, np.nan), axis=2)  # (P', K)
        obj = obj + predict_weight * _nanmean(errs, axis=0)
    return obj


def _predict_terms(d: _Data) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The predict fractions with an align window on some curve, stacked (P', C, ...): w ℓ (P', C, S) over the
    grid columns ``_pairwise_span`` keeps (S of them: the windows lie early, the other columns' weights are
    0), Σ w ℓ² with NaN where not > 0 (P', C), has_pred (P', C); None when no fraction has one. They do not
    depend on the parameters, so they are made once per _Data; the kept columns are ``d.cache["span"]``."""
    key = "predict_terms"
    if key not in d.cache:
        rows = []
        for w, has in zip(d.w_pred, d.has_pred, strict=True):
            if not has.any():
                continue
            den = np.sum(w * d.ell * d.ell, axis=1)  # Σ w ℓ²
            rows.append((w * d.ell, np.where(den > 0, den, np.nan), has))
        terms = tuple(np.stack(parts) for parts in zip(*rows, strict=True)) if rows else None
        span = slice(None)
        if terms is not None:
            cols = np.flatnonzero(np.any(terms[0] != 0.0, axis=(0, 1)))
            got = _pairwise_span(terms[0].shape[2], int(cols[0]), int(cols[-1]) + 1) if cols.size else None
            if got is not None:
                span = slice(*got)
                terms = (np.ascontiguousarray(terms[0][:, :, span]), terms[1], terms[2])
        d.cache["span"] = span
        d.cache[key] = terms
    return d.cache[key]


#: numpy's pairwise summation (``np.add.reduce`` along a contiguous row, numpy's ``pairwise_sum``): a row of
#: more than this many numbers is summed as two halves, split at half its length rounded down to a multiple
#: of 8; a shorter one in 8 interleaved partial sums, combined as ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)), then
#: the last (length mod 8) numbers one by one.
PAIRWISE_BLOCK = 128


def _pairwise_span(n: int, lo: int, hi: int) -> tuple[int, int] | None:
    """Columns [a, b) holding [lo, hi) whose sum numpy makes with the same additions in the same order as
    the sum of the whole row of ``n`` when the row is 0 outside [lo, hi): inside one unsplit block, starting
    at a multiple of 8 from the block's start and ending before its last (length mod 8) numbers, a multiple
    of 8 long. Each partial sum then adds the same numbers in the same order (a partial sum that starts at 0
    and adds x is x; adding 0 changes nothing), and the other half of each split adds 0. None when [lo, hi)
    crosses a split (then the whole row is summed). tests/test_predictors_calibrate.py checks the bits
    against the whole row's sum."""
    start = 0
    while n > PAIRWISE_BLOCK:
        half = n // 2
        half -= half % 8
        if hi <= start + half:
            n = half
        elif lo >= start + half:
            start, n = start + half, n - half
        else:
            return None
    a = start + (lo - start) // 8 * 8
    b = a + -(-(hi - a) // 8) * 8
    return (a, b) if b <= start + n - n % 8 else None


def _pred_valid(d: _Data) -> np.ndarray:
    """(P', C): the curve has an align window at the fraction and a positive Σ w ℓ² there
    (``_predict_terms``); made once per ``_Data``."""
    got = d.cache.get("pred_valid")
    if got is None:
        _, den, has = _predict_terms(d)
        got = d.cache["pred_valid"] = has & ~np.isnan(den)
    return got


def _nanmean(a: np.ndarray, axis: int) -> np.ndarray:
    """np.nanmean without the warning on all-NaN slices (they give NaN; the grid search skips them).

    The same arithmetic as np.nanmean (NaN set to 0, summed, divided by the count of the others), so the
    same bits, without its per-call overhead: the objective calls it ~4 times per evaluation."""
    nan = np.isnan(a)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.add.reduce(np.where(nan, 0.0, a), axis=axis) / np.add.reduce(~nan, axis=axis, dtype=np.intp)


@dataclass
class _Params:
    lb0: float = 0.0  # log b0
    b_e: float = 0.0
    lq0: float = 0.0  # log q0
    q_e: float = 0.0
    m: float = 0.05


def _bq(d: _Data, pr: _Params) -> tuple[np.ndarray, np.ndarray]:
    b = np.exp(pr.lb0 + pr.b_e * d.log_tau)
    q = np.exp(pr.lq0 + pr.q_e * d.log_tpp)
    return b, q


def _eval(d: _Data, pr: _Params, eps2: float, predict_weight: float) -> float:
    """The objective (a mean absolute error in units of ℓ, plus ``predict_weight`` times a mean |log|
    ratio) at one parameter set: ``_objective(d, _shapes(d, b[None], q[None], pr.m, eps2),
    predict_weight)[0]`` to the bit, by ``_shape_one`` and ``_objective_one``. A Nelder–Mead refinement
    calls it ~650 times per run on a few to a few dozen curves, where numpy's per-call cost, not the
    arithmetic, was most of its time; tests/test_predictors_calibrate.py checks the bits against the
    batched pair."""
    b, q = _bq(d, pr)
    return _objective_one(d, _shape_one(d, b, q, pr.m, eps2), predict_weight)


def _log_eta(d: _Data, eps2: float) -> tuple[np.ndarray, np.ndarray]:
    """log(η + ε2) on the grid (C, G) and at t̂ = 1 (C,); made once per ``_Data`` and ε2."""
    logs = d.cache.get(("log_eta", eps2))
    if logs is None:
        logs = d.cache[("log_eta", eps2)] = (np.log(d.eta + eps2), np.log(d.eta1 + eps2))
    return logs


def _first(d: _Data, m: float) -> np.ndarray:
    """((1 + ε1)/(t̂ + ε1))^m on the grid (G,), kept for the last m asked (fixed while m is not fitted)."""
    last = d.cache.get("first")
    if last is None or last[0] != m:
        last = d.cache["first"] = (m, np.exp(m * d.log_r))
    return last[1]


def _shape_one(d: _Data, b: np.ndarray, q: np.ndarray, m: float, eps2: float) -> np.ndarray:
    """ℓ̂ (C, G) for one parameter set (b, q of shape (C,)): ``_shapes(d, b[None], q[None], m, eps2)[0]``, the
    same elementwise operations on the same values (arithmetic in place where the batched form makes a new
    array)."""
    le, le1 = _log_eta(d, eps2)
    p = np.exp(q[:, None] * le)  # exp and log into new arrays, as the batched form: the same loops
    np.multiply(b[:, None], p, out=p)
    np.add(_first(d, m), p, out=p)  # first + b·p (an IEEE sum does not depend on the operands' order)
    den = np.exp(q * le1)
    np.multiply(b, den, out=den)
    np.add(1.0, den, out=den)
    np.divide(p, den[:, None], out=p)
    return p


def _objective_one(d: _Data, shapes: np.ndarray, predict_weight: float) -> float:
    """``_objective`` for one parameter set (``shapes``: (C, G)), as a float: the same reductions along the
    same contiguous axes (numpy sums a row the same way whether or not the array has a leading axis of 1),
    the NaN-skipping means inlined; the last mean, over the few predict fractions, left to right in Python,
    as numpy sums fewer than 8 numbers."""
    diff = np.subtract(d.ell, shapes)
    np.abs(diff, out=diff)
    np.multiply(diff, d.w_fit, out=diff)
    mae = np.add.reduce(diff, axis=1)  # (C,)
    obj = np.add.reduce(mae) / mae.shape[0]
    terms = _predict_terms(d) if predict_weight > 0 else None
    if terms is None:
        return float(obj)
    wl, den, _ = terms  # (P', C, S), (P', C), (P', C)
    num = np.add.reduce(wl * shapes[:, d.cache["span"]], axis=2)  # Σ w ℓ ℓ̂, (P', C), over the span
    # The batched form's error is NaN exactly where this is False (a positive num over a positive den has
    # a log, possibly ±inf, never NaN), so the means skip the same entries; the errors kept are the same.
    with np.errstate(divide="ignore", invalid="ignore"):
        ok = num > 0
        ok &= _pred_valid(d)
        err = np.log(num / den)
        np.abs(err, out=err)
        err = np.where(ok, err, 0.0)
        errs = np.add.reduce(err, axis=1) / np.add.reduce(ok, axis=1, dtype=np.intp)  # (P',)
    if errs.size >= 8:  # numpy's pairwise sum: not a left-to-right one
        return float(obj + predict_weight * _nanmean(errs[:, None], axis=0)[0])
    total, count = 0.0, 0
    for e in errs.tolist():
        if e == e:  # not NaN
            total += e
            count += 1
    mean = total / count if count else math.nan
    return float(obj + predict_weight * mean)


def _best_pair(
    d: _Data,
    c_grid: np.ndarray,
    e_grid: np.ndarray,
    log_x: np.ndarray,
    other: np.ndarray,
    vary_b: bool,
    m: float,
    eps2: float,
    predict_weight: float,
) -> tuple[float, float]:
    """One half-step of the alternating search: the grid point (log c, e) of one law, value = exp(log c + e ·
    log_x) per curve (log_x: log τ for b, log TPP for q), that minimizes the objective with the other law held
    at ``other`` (per curve). ``vary_b``: the varied law is b (else q), and q's terms are made once.

    Scored in blocks of ``GRID_BLOCK`` grid points; a point's score does not depend on its block (the same
    elementwise operations and row sums), so the block size only sets the arrays' size."""
    C, E = np.meshgrid(c_grid, e_grid, indexing="ij")
    C, E = C.ravel(), E.ravel()
    scores = np.empty(C.size)
    q_terms = _q_terms(d, other, eps2) if vary_b else None
    for s in range(0, C.size, GRID_BLOCK):
        law = np.exp(C[s : s + GRID_BLOCK, None] + E[s : s + GRID_BLOCK, None] * log_x[None])
        fixed = np.broadcast_to(other[None], law.shape)
        bb, qq = (law, fixed) if vary_b else (fixed, law)
        scores[s : s + GRID_BLOCK] = _objective(d, _shapes(d, bb, qq, m, eps2, q_terms), predict_weight)
    k = int(np.nanargmin(scores))
    return float(C[k]), float(E[k])


#: Grid points scored at once by ``_best_pair``: (block, curves, ``GRID``) arrays of at most 1.3 MB for 50
#: curves, which stay in a core's cache; blocks of 64 made arrays four times that (and the predict term a
#: product twelve times that), and were slower.
GRID_BLOCK = 16


def _grid_search(
    d: _Data,
    pr: _Params,
    eps2: float,
    predict_weight: float,
    tau_power: bool,
    tpp_power: bool,
    max_rounds: int = 8,
) -> _Params:
    """The paper's alternating grid search: the b pair with q fixed, then the q pair with b fixed."""
    lb_grid = np.linspace(math.log(1e-3), math.log(1e2), 47)
    be_grid = np.linspace(-2.0, 2.0, 21) if tau_power else np.zeros(1)
    lq_grid = np.linspace(math.log(1e-2), math.log(2e1), 47)
    qe_grid = np.linspace(-1.5, 1.5, 21) if tpp_power else np.zeros(1)
    best = replace(pr)
    prev = None
    for _ in range(max_rounds):
        _, q = _bq(d, best)
        best.lb0, best.b_e = _best_pair(d, lb_grid, be_grid, d.log_tau, q, True, best.m, eps2, predict_weight)
        b, _ = _bq(d, best)
        best.lq0, best.q_e = _best_pair(
            d, lq_grid, qe_grid, d.log_tpp, b, False, best.m, eps2, predict_weight
        )
        key = (best.lb0, best.b_e, best.lq0, best.q_e)
        if key == prev:
            break
        prev = key
    return best


def _refine(
    d: _Data,
    start: _Params,
    eps2: float,
    predict_weight: float,
    tau_power: bool,
    tpp_power: bool,
    free_m: bool,
) -> _Params:
    """Nelder–Mead refinement of the grid optimum on the same objective, bounded as lmfit bounds (see
    ``_bounded_nelder_mead``)."""
    bounds = {"lb0": (math.log(1e-5), math.log(1e3)), "b_e": (-4.0, 4.0),
              "lq0": (math.log(1e-3), math.log(1e2)), "q_e": (-3.0, 3.0), "m": (1e-3, 0.6)}
    vary = {"lb0": True, "b_e": tau_power, "lq0": True, "q_e": tpp_power, "m": free_m}

    def fun(v: dict[str, float]) -> float:
        x = _eval(d, _Params(v["lb0"], v["b_e"], v["lq0"], v["q_e"], v["m"]), eps2, predict_weight)
        return x if math.isfinite(x) else 1e9

    start_values = {"lb0": start.lb0, "b_e": start.b_e, "lq0": start.lq0, "q_e": start.q_e, "m": start.m}
    v = _bounded_nelder_mead(fun, start_values, bounds, vary,
                             {"xatol": 1e-6, "fatol": 1e-9, "maxiter": 4000})
    out = _Params(v["lb0"], v["b_e"], v["lq0"], v["q_e"], v["m"])
    return (
        out
        if _eval(d, out, eps2, predict_weight) <= _eval(d, start, eps2, predict_weight)
        else start
    )


class _Abort(Exception):
    """More evaluations than lmfit allows (``_bounded_nelder_mead``)."""


def _nelder_mead(
    f: Callable[[list[float]], float], x0: list[float], xatol: float, fatol: float, maxiter: int
) -> list[float]:
    """``scipy.optimize.minimize(f, x0, method="Nelder-Mead", options={"xatol": xatol, "fatol": fatol,
    "maxiter": maxiter}).x`` to the bit (scipy 1.17's ``_minimize_neldermead``, no bounds, not adaptive; the
    evaluations unbounded, as there with ``maxiter`` given): the same simplex, steps, tests and order of
    evaluations, the same IEEE operations in the same order on Python floats instead of numpy arrays of 3–5
    numbers, whose per-call cost was ~40% of a refinement beside the objective. The simplex is sorted by
    numpy's argsort, as there (the order of equal values is numpy's). ``f`` gets each point as a new list.
    tests/test_predictors_calibrate.py checks it against scipy and lmfit."""
    n = len(x0)
    sim = [list(x0)]
    for k in range(n):
        y = list(x0)
        y[k] = (1 + 0.05) * y[k] if y[k] != 0 else 0.00025
        sim.append(y)
    fsim = [math.inf] * (n + 1)
    try:
        for k in range(n + 1):
            fsim[k] = f(list(sim[k]))
    finally:
        sim, fsim = _nm_sort(sim, fsim)
    sim, fsim = _nm_sort(sim, fsim)  # scipy sorts twice here (a second sort may move equal values)
    iterations = 1
    while iterations < maxiter:
        best, fbest = sim[0], fsim[0]
        if (all(abs(v - b) <= xatol for row in sim[1:] for v, b in zip(row, best))
                and all(abs(fbest - g) <= fatol for g in fsim[1:])):
            break
        xbar = list(sim[0])
        for row in sim[1:-1]:  # numpy's sum of rows: left to right
            xbar = [a + v for a, v in zip(xbar, row)]
        xbar = [a / n for a in xbar]
        worst = sim[-1]
        xr = [2 * a - 1 * w for a, w in zip(xbar, worst)]  # (1 + ρ) x̄ − ρ x_worst, ρ = 1
        fxr = f(xr)
        shrink = False
        if fxr < fsim[0]:
            xe = [3 * a - 2 * w for a, w in zip(xbar, worst)]  # expansion, χ = 2
            fxe = f(xe)
            sim[-1], fsim[-1] = (xe, fxe) if fxe < fxr else (xr, fxr)
        elif fxr < fsim[-2]:
            sim[-1], fsim[-1] = xr, fxr
        elif fxr < fsim[-1]:
            xc = [1.5 * a - 0.5 * w for a, w in zip(xbar, worst)]  # outside contraction, ψ = 0.5
            fxc = f(xc)
            if fxc <= fxr:
                sim[-1], fsim[-1] = xc, fxc
            else:
                shrink = True
        else:
            xcc = [0.5 * a + 0.5 * w for a, w in zip(xbar, worst)]  # inside contraction
            fxcc = f(xcc)
            if fxcc < fsim[-1]:
                sim[-1], fsim[-1] = xcc, fxcc
            else:
                shrink = True
        if shrink:  # σ = 0.5
            for j in range(1, n + 1):
                sim[j] = [b + 0.5 * (v - b) for b, v in zip(sim[0], sim[j])]
                fsim[j] = f(list(sim[j]))
        iterations += 1
        sim, fsim = _nm_sort(sim, fsim)
    return sim[0]


def _nm_sort(sim: list[list[float]], fsim: list[float]) -> tuple[list[list[float]], list[float]]:
    """The simplex and its values ordered by ``np.argsort`` of the values (scipy's order, ties included).
    Distinct values that are not NaN have one ascending order, which Python's sort finds without numpy's
    per-call cost; equal values (-0.0 and 0.0 too) or a NaN go through numpy, whose order of ties is its
    own."""
    if len(set(fsim)) == len(fsim) and all(v == v for v in fsim):
        order = sorted(range(len(fsim)), key=fsim.__getitem__)
    else:
        order = np.argsort(np.array(fsim, dtype=float)).tolist()
    return [sim[i] for i in order], [fsim[i] for i in order]


def _bounded_nelder_mead(
    fun: Any, start: dict[str, float], bounds: dict[str, tuple[float, float]], vary: dict[str, bool],
    options: dict[str, Any],
) -> dict[str, float]:
    """``lmfit.minimize(fun, params, method="nelder", options=options)`` for finite (min, max) bounds, without
    lmfit's per-evaluation bookkeeping (it was ~40% of a calibration's time): the same Minuit-style
    transform (external = min + (sin(x) + 1)(max − min)/2, start x = arcsin(2(v − min)/(max − min) − 1)), the
    same values clipped to the bounds, the same scipy call and lmfit's cap of 2000·(varied + 1) evaluations
    (past it, the last point tried). The same arithmetic in the same order: the results are lmfit's to the
    bit (tests/test_predictors_calibrate.py checks it against lmfit). ``fun`` takes {name: value}; returns
    the same."""
    from scipy.optimize import minimize

    names = [n for n in start if vary[n]]
    values = {n: min(max(float(start[n]), bounds[n][0]), bounds[n][1]) for n in start}

    spans = [(n, *bounds[n], bounds[n][1] - bounds[n][0]) for n in names]

    def set_external(xs: Any) -> None:
        """``values`` of the varied parameters at the internal point ``xs``, clipped to their bounds."""
        for (n, lo, hi, span), x in zip(spans, xs):
            # numpy's sin (math.sin may differ in the last bit); the rest in Python floats, the same IEEE
            # operations in the same order as on numpy scalars, at a fraction of their cost per evaluation
            val = lo + (float(np.sin(x)) + 1) * span / 2.0
            values[n] = min(max(val, lo), hi)

    x0 = []
    for n in names:
        lo, hi = bounds[n]
        x = np.arcsin(2 * (values[n] - lo) / (hi - lo) - 1)
        x0.append(0.0 if abs(x) < 1.0e-15 else float(x))
    max_nfev = 2000 * (len(names) + 1)
    state = {"nfev": 0, "last": None}

    def penalty(xs: list[float]) -> float:
        state["nfev"] += 1
        state["last"] = xs
        if state["nfev"] > max_nfev:
            raise _Abort
        set_external(xs)
        return fun(values)

    try:
        if set(options) <= {"xatol", "fatol", "maxiter"} and "maxiter" in options:
            best = _nelder_mead(penalty, x0, float(options.get("xatol", 1e-4)),
                                float(options.get("fatol", 1e-4)), int(options["maxiter"]))
        else:
            best = minimize(lambda xs: penalty(xs.tolist()), x0, method="Nelder-Mead",
                            options=dict(options)).x
    except _Abort:
        best = state["last"]
    set_external(np.atleast_1d(best))
    return dict(values)


def _to_surrogate(
    pr: _Params,
    tau0: float,
    tpp0: float,
    tau_law: str,
    tpp_law: str,
    eps1: float,
    eps2: float,
    align: str,
    align_start: float,
) -> Surrogate:
    b_e = pr.b_e if tau_law == "power" else 0.0
    q_e = pr.q_e if tpp_law == "power" else 0.0
    return Surrogate(
        b_c=math.exp(pr.lb0) * tau0 ** (-b_e),
        b_e=b_e,
        q_c=math.exp(pr.lq0) * tpp0 ** (-q_e),
        q_e=q_e,
        eps1=eps1,
        eps2=eps2,
        m=pr.m,
        tau_law=tau_law,
        tpp_law=tpp_law,
        align=align,
        align_start=align_start,
    )


def _folds(groups: Sequence[Any], n_folds: int) -> list[np.ndarray]:
    labels = list(dict.fromkeys(groups))
    k = min(n_folds, len(labels))
    out = []
    for f in range(k):
        held = {lab for j, lab in enumerate(labels) if j % k == f}
        out.append(np.array([g in held for g in groups]))
    return out


def _group_key(c: Curve) -> tuple:
    tau = None if c.tau is None else float(f"{c.tau:.3g}")
    tpp = None if c.tpp is None else float(f"{c.tpp:.3g}")
    size = None if c.params is None else float(f"{c.params:.4g}")
    return (tau, tpp, size)


def _sizes(curves: Sequence[Curve]) -> tuple[np.ndarray | None, str | None]:
    """ln N per curve (None when not every curve has ``params``) and a note when sizes are partial/absent."""
    have = [c.params is not None for c in curves]
    if all(have):
        return np.log(np.array([float(f"{c.params:.4g}") for c in curves])), None
    if any(have):
        missing = ", ".join(c.run for c in curves if c.params is None)[:200]
        return None, f"some runs have no params (model size): {missing}; no size trend was learned"
    return None, "the curves have no params (model size): no size trend, no check of extrapolation in size"


def _end_tests(n: int) -> list[tuple[np.ndarray, int]]:
    """Extrapolation tests on n sizes (ascending): (indices of the sizes used, index of the size predicted).

    Each end size is predicted from the sizes beyond it held out: from all other sizes (one step out) and,
    with 5 or more sizes, also with its neighbour dropped (two steps out)."""
    idx = np.arange(n)
    tests = [(idx[:-1], n - 1), (idx[1:], 0)]
    if n >= 5:
        tests += [(idx[:-2], n - 1), (idx[2:], 0)]
    return tests


def _choose_rule(xs: np.ndarray, rs: np.ndarray, counts: np.ndarray) -> tuple[int, float, float, int]:
    """The rule k (see `SizeTrend`) that best predicted the end sizes' residuals from the other sizes.

    Candidates: −1 (no correction), 0 (mean), 1 (nearest size), 2 … n (line through the k nearest; n = all);
    on a tie the simpler (smaller k) wins. Returns (k, RMS of its misses per unit ln-N distance × step,
    step = mean ln-N distance of the tests, number of tests)."""
    tests = _end_tests(xs.size)
    dist = np.array([np.min(np.abs(xs[used] - xs[j])) for used, j in tests])
    best = None
    for k in range(-1, xs.size + 1):
        miss = np.array(
            [
                extrapolate_bias(xs[used], rs[used], counts[used], float(xs[j]), k)[0] - rs[j]
                for used, j in tests
            ]
        )
        score = float(np.mean(miss**2))
        if k >= 0:  # a correction must earn its place: clearly better than none on the end tests
            score /= RULE_MARGIN
        if best is None or score < best[0] - 1e-15:
            best = (score, k, miss)
    assert best is not None
    _, k, miss = best
    step = float(np.mean(dist))
    per_unit = float(np.sqrt(np.mean((miss / dist) ** 2)))
    return k, max(per_unit * step, SCALE_FLOOR), step, len(tests)


def _size_trend(
    residuals: dict[int, dict], log_n: np.ndarray, fractions: Sequence[float]
) -> list[SizeTrend]:
    """The error model as a function of x = ln N, per fraction (see `SizeTrend`).

    ``residuals`` maps a curve index to {p: log(actual/predicted) or None} from held-out folds; ``log_n`` is
    ln N per curve. Each size's runs are averaged (seeds count once per size). 3 or more sizes: a rule is
    chosen by end-size tests ("trend"); 2 sizes: the interval only widens outside them ("widen"); 1: none.
    """
    out = []
    for p in fractions:
        have = [i for i in sorted(residuals) if residuals[i].get(p) is not None]
        if not have:
            continue
        r = np.array([residuals[i][p] for i in have], dtype=float)
        x = log_n[have]
        xs = np.unique(x)
        if xs.size < 2:
            continue
        rs = np.array([r[x == v].mean() for v in xs])
        counts = np.array([int(np.count_nonzero(x == v)) for v in xs])
        dev = r - rs[np.searchsorted(xs, x)]
        dof = int(r.size - xs.size)
        scale = float(np.sqrt(np.sum(dev**2) / dof)) if dof > 0 else 0.0
        if xs.size >= 3:
            k, ext, step, tests = _choose_rule(xs, rs, counts)
            kind = "trend"
        else:
            k, ext, step, kind = 0, max(abs(float(rs[1] - rs[0])), SCALE_FLOOR), float(xs[1] - xs[0]), "widen"
            tests = 1
        if k <= 0:  # no size dependence modelled: the differences between sizes are spread, too
            center = 0.0 if k < 0 else float(r.mean())
            scale = float(np.sqrt(np.sum((r - center) ** 2) / max(r.size - 1, 1)))
        out.append(
            SizeTrend(
                fraction=float(p), kind=kind, n=int(xs.size), k=k, xs=tuple(float(v) for v in xs),
                rs=tuple(float(v) for v in rs), counts=tuple(int(c) for c in counts),
                scale=max(scale, SCALE_FLOOR), ext_error=ext, step=step, tests=tests,
            )
        )
    return out


def _reference_ranges(curves: Sequence[Curve]) -> dict[str, list[float]]:
    """The [min, max] of params, TPP and τ over the reference curves (a control is left out when unknown or
    not defined)."""
    ref: dict[str, list[float]] = {}
    if all(c.tpp is not None for c in curves):
        ref["tpp"] = [min(c.tpp for c in curves), max(c.tpp for c in curves)]
    if all(c.params is not None for c in curves):
        ref["params"] = [min(c.params for c in curves), max(c.params for c in curves)]
    if all(c.tau is not None for c in curves):
        ref["tau"] = [min(c.tau for c in curves), max(c.tau for c in curves)]
    return {k: [float(v[0]), float(v[1])] for k, v in ref.items()}


def _predict_errors(
    s: Surrogate, curves: Sequence[Curve], fractions: Sequence[float]
) -> tuple[dict[int, dict], dict[int, dict]]:
    """Per curve index and fraction: log(actual/predicted), and the prediction's alignment residual
    ``fit_residual`` (what a collapsing curve's misfit looks like; None where no prediction could be made)."""
    out: dict[int, dict] = {}
    maes: dict[int, dict] = {}
    s = replace(s, error_bands=[])  # raw alignment: no bias correction from an earlier model
    for i, c in enumerate(curves):
        actual = c.final_loss
        row: dict[float, float | None] = {}
        mrow: dict[float, float | None] = {}
        ok = np.isfinite(c.loss)
        t, y = c.t_hat[ok], c.loss[ok]
        for p in fractions:
            keep = t <= p + 1e-9
            pred = predict_final_loss(
                t[keep], y[keep], surrogate=s, schedule=c.schedule, tau=c.tau, tpp=c.tpp, min_fraction=0.5 * p
            )
            good = pred.ok and actual > 0
            row[p] = math.log(actual / pred.final_loss) if good else None
            mrow[p] = pred.fit_residual if good else None
        out[i] = row
        maes[i] = mrow
    return out, maes


def _misfit_reference(values: Sequence[float | None]) -> float | None:
    """The ``MISFIT_QUANTILE`` quantile of held-out alignment residuals (floored at ``SCALE_FLOOR``, so that
    a ratio to it stays finite); None without one."""
    v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if v.size == 0:
        return None
    return max(float(np.quantile(v, MISFIT_QUANTILE)), SCALE_FLOOR)


def _pair_bands(
    residuals: dict[int, dict], fold_of: dict[int, int], fractions: Sequence[float]
) -> list[ErrorBand]:
    """Errors of paired predictions: d = r_i − r_j over pairs of curves predicted by one fold's surrogate.

    r = log(actual/predicted), so d = log(actual_i/actual_j) − log(predicted_i/predicted_j): how far the
    predicted *ratio* of two runs' final losses missed. A bias shared by the runs of one fold cancels. Both
    orders of a pair count, so the mean is 0; ``scale`` is the root mean square of d, ``n`` the number of
    curves behind it (pairs share curves, so pairs are not independent units).
    """
    bands = []
    for p in fractions:
        diffs: list[float] = []
        used: set[int] = set()
        for i, j in _fold_pairs(residuals, fold_of, lambda r, p=p: r.get(p) is not None):
            diffs.append(residuals[i][p] - residuals[j][p])
            used.update((i, j))
        if not diffs:
            continue
        d = np.array(diffs, dtype=float)
        bands.append(
            ErrorBand(
                fraction=float(p),
                n=len(used),
                bias=0.0,
                scale=max(float(np.sqrt(np.mean(d**2))), SCALE_FLOOR),
                max_abs=float(np.max(np.abs(d))),
            )
        )
    return bands


def pair_decay_distance(
    curves: Sequence[Curve], residuals: dict[int, dict], fold_of: dict[int, int]
) -> float | None:
    """The largest ``decay_distance`` between the schedules of two curves held out in one fold: how far apart
    the decays of the pairs behind ``pair_bands`` lay (None when no fold held two curves). A paired
    comparison of two trials whose decays lie further apart has no learned error behind it."""
    worst: float | None = None
    for i, j in _fold_pairs(residuals, fold_of, lambda r: any(v is not None for v in r.values())):
        d = decay_distance(curves[i].schedule, curves[j].schedule)
        worst = d if worst is None else max(worst, d)
    return worst


def _fold_pairs(
    residuals: dict[int, dict], fold_of: dict[int, int], has: Callable[[dict], bool]
) -> Iterator[tuple[int, int]]:
    """Every pair (i, j), i < j, of curves held out in one fold whose residuals (by fraction) pass ``has``:
    the pairs behind ``_pair_bands`` (at one fraction) and ``pair_decay_distance`` (at any), fold by fold in
    one order."""
    for f in set(fold_of.values()):
        have = [i for i in sorted(residuals) if fold_of.get(i) == f and has(residuals[i])]
        for a in range(len(have)):
            for b in range(a + 1, len(have)):
                yield have[a], have[b]


#: ``Surrogate.lead_bands`` measure how far a worse run led the reference's best LEAD_TOP_SHARE of its runs
#: (by final loss; at least LEAD_TOP_MIN), at LEAD_FRACTIONS. 0.05 was chosen on surestop_lora's earlier
#: nights (reference: the later nights) and random_s0 (reference: random_s1), 20 orders at the default
#: margin, as the smallest of 0.025, 0.05 and 0.1 that kept the best in every order of both (0.025 cut
#: random_s0's best in 13 of 20; compute 0.05: 0.275 and 0.208, 0.1: 0.339 and 0.209); every other sweep in
#: BENCHMARKS §15 is out of sample for it (random_s1, surestop_lora's later nights, the τ-held and λ-fixed
#: sweeps).
LEAD_TOP_SHARE = 0.05
#: ... and at least this many of them. The lead is the largest of many leads read off a few best runs; a
#: reference whose few best runs all started fast carries a lead far below the next sweep's. Two were too few
#: on 40-run references drawn from random_s1 (BENCHMARKS §40). Three (§40's choice) then cut the next sweep's
#: best with 4 of 42 new references of 40–50 runs drawn from surestop_lora's earlier nights and random_s0/s1
#: (up to 0.81% regret), four with 2 of 42, five with none; of 48 more references drawn afterwards to check
#: the choice, three cut 4 (up to 6.7% regret), five none (BENCHMARKS §41). Five binds up to 100 runs.
LEAD_TOP_MIN = 5
LEAD_FRACTIONS = (0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def lead_bands_of(curves: Sequence[Curve], fractions: Sequence[float], align_start: float, *,
                top_min: int = LEAD_TOP_MIN) -> list[ErrorBand]:
    """How far a worse run ever led one of the reference's best runs at each fraction, by loss ratio.

    For each of the best ``LEAD_TOP_SHARE`` of the curves (by final loss; at least ``top_min``, by default
    ``LEAD_TOP_MIN``; studies/bench/lead_references.py compares other values), i, and
    every curve o that ended worse: lead = log L_i(p) − log L_o(p), where log L(p) is a curve's mean log-loss
    over t̂ ∈ [align_start · p, p] (the window the pruner compares on). ``scale`` = ``max_abs`` = the largest
    lead at p or at any later fraction (at least ``SCALE_FLOOR``; with a handful of best runs the lead at one
    fraction is noisy, and a winner must survive every later judgement too), ``n`` the number of curves
    compared. In-sample: the loss ratio fits nothing."""
    finals = [c.final_loss for c in curves]
    ranked = sorted(range(len(curves)), key=lambda i: (finals[i], i))
    top = ranked[: max(top_min, math.ceil(LEAD_TOP_SHARE * len(curves)))]
    bands = []
    for p in fractions:
        level: dict[int, float] = {}
        for i, c in enumerate(curves):
            window = (c.t_hat >= align_start * p - 1e-9) & (c.t_hat <= p + 1e-9)
            ok = np.isfinite(c.loss) & (c.loss > 0) & window
            if ok.any():
                level[i] = float(np.mean(np.log(c.loss[ok])))
        leads = [level[i] - level[o] for i in top if i in level for o in level if finals[o] > finals[i]]
        if not leads:
            continue
        lead = max(max(leads), SCALE_FLOOR)
        bands.append(ErrorBand(fraction=float(p), n=len(level), bias=0.0, scale=lead, max_abs=lead))
    for k in range(len(bands) - 2, -1, -1):  # the envelope: never below a later fraction's lead
        if bands[k + 1].scale > bands[k].scale:
            bands[k] = replace(bands[k], scale=bands[k + 1].scale, max_abs=bands[k + 1].scale)
    return bands


def refuse_diverged(curves: Sequence[Curve]) -> None:
    """Raise InputError naming the runs of a reference file that diverged (a NaN, inf or huge loss read from
    the file, even after t̂ 0.99): a reference run must be clean. `collapse-hpo calibrate` and `replay
    --reference` check their files with it before calibrating."""
    bad = [f"{c.run!r} (at t_hat={c.diverged_at:.3g})" for c in curves if c.diverged_at is not None]
    if bad:
        raise InputError(
            f"calibrate: {len(bad)} of {len(curves)} reference runs diverged (a NaN, inf or huge loss): "
            f"{some_runs(bad)}; a reference run must be clean: drop those runs from the file"
        )


def calibrate(
    curves: Sequence[Curve],
    *,
    fit_start: float = 0.2,
    predict_weight: float = 1.0,
    predict_fractions: Sequence[float] = PREDICT_FRACTIONS,
    align: str = "sq",
    align_start: float = 0.5,
    free_m: bool | str = "auto",
    eps1: float = 1e-3,
    eps2: float = 0.1,
    m: float = 0.05,
    smooth_width: float = 0.0,
    groups: Sequence[Any] | None = None,
    folds: int = 5,
    error_fractions: Sequence[float] = ERROR_FRACTIONS,
    min_law_range: float = MIN_LAW_RANGE,
    params: Sequence[float] | Mapping[str, float] | None = None,
    law_alpha: float | None = None,
) -> Calibration:
    """Fit the surrogate's constants to reference curves and learn its prediction error model.

    Args:
        curves: complete reference curves (a finite loss at t̂ ≥ 0.99, ≥ 5 points in the fit region).
        fit_start: the fit region is t̂ ∈ [fit_start, 1] (the paper: 0.2).
        predict_weight: weight of the early-prediction term in the objective (0: the paper's MAE only).
        predict_fractions: the fractions p of that term.
        align, align_start: how predictions align (stored in the surrogate; see `predict_final_loss`).
        free_m: False keeps m fixed; True frees it; "auto" (default) frees it only if that lowers the MAE
            on held-out curve groups by more than 2%.
        eps1, eps2, m: the paper's constants (m is the start value when freed).
        smooth_width: local-linear smoothing half-width in t̂ applied before normalizing (0: none).
        groups: a label per curve for the held-out folds (default: equal (τ, TPP) = one group).
        folds: at most this many held-out folds for the error model and the m check.
        error_fractions: the fractions p of the learned error model.
        min_law_range: a control spanning less than this ratio gets a constant law.
        params: model size N (parameters) of each curve, as a list in curve order or a mapping run -> N
            (default: the curves' own ``params`` when every curve has one). With sizes, the final-loss scaling
            law L(N, D) (D = TPP · N tokens) is fitted too and kept in the surrogate (``scaling_law``, for
            `forecast`); with fewer than 3 sizes the notes say it cannot be.
        law_alpha: fix the law's N exponent α (a prior); then 2 sizes suffice.

    Curves whose ``tpp`` is None (not defined, e.g. fine-tuning) get a constant q law, and the notes say so.

    Raises InputError when fewer than 1 usable curve is given, a curve is incomplete, or runs with and without
    weight decay, or with and without a tpp, are mixed.
    """
    t0 = time.perf_counter()
    curves = list(curves)
    if not curves:
        raise InputError("calibrate: no curves given")
    if free_m not in (True, False, "auto"):
        raise InputError(f"calibrate: free_m must be true, false or 'auto', got {free_m!r}")
    unfit = [f"{c.run!r} (diverged at t_hat={c.diverged_at:.3g})" if c.diverged_at is not None
             else f"{c.run!r} (ends at t_hat={c.last_t_hat:.3g})" for c in curves if not c.complete]
    if unfit:
        raise InputError(
            f"calibrate: {len(unfit)} of {len(curves)} reference runs are not complete: {some_runs(unfit)}; "
            "reference curves must be complete (a finite loss at t_hat >= 0.99): drop those runs from the "
            "file"
        )
    for c in curves:
        ok = np.isfinite(c.loss)
        if np.any(c.loss[ok] <= 0):
            raise InputError(f"calibrate: run {c.run!r} has a non-positive loss")
        if np.count_nonzero(ok & (c.t_hat >= fit_start)) < 5:
            raise InputError(f"calibrate: run {c.run!r} has fewer than 5 points in t_hat [{fit_start:g}, 1]")
    tau_law, tpp_law, tau0, tpp0, notes = _laws(curves, min_law_range)
    tau_power, tpp_power = tau_law == "power", tpp_law == "power"
    d = _prepare(
        curves, fit_start, align_start, predict_fractions, smooth_width, tau0, tpp0, tau_law, tpp_law, eps1
    )
    labels = list(groups) if groups is not None else [_group_key(c) for c in curves]
    if len(labels) != len(curves):
        raise InputError("calibrate: groups must have one label per curve")

    def fit(idx: np.ndarray | None, free: bool, start: _Params | None = None) -> _Params:
        dd = d if idx is None else _subset(d, idx)  # a fold's own rows (and cache), not indexed per call
        if start is None:
            start = _grid_search(dd, _Params(m=m), eps2, predict_weight, tau_power, tpp_power)
        return _refine(dd, start, eps2, predict_weight, tau_power, tpp_power, free)

    base = fit(None, False)
    fold_masks = _folds(labels, folds) if len(set(labels)) >= 2 else []
    # The m check's fits with m fixed, by fold: fit(train, False, start=base) is the very call the error
    # model makes for that fold when m stays fixed (best is base): a refinement is a function of its rows,
    # start and settings, so it is not run twice (a third of the refinements of a calibration that keeps m).
    # Its fits with m free serve the error model when m is freed (``REUSE_FREE_M_FITS``).
    fixed_fits: dict[int, _Params] = {}
    free_fits: dict[int, _Params] = {}
    chosen_free = free_m is True
    if free_m == "auto":
        if not fold_masks:
            notes.append(
                "free_m='auto' needs 2 or more curve groups to check on held-out curves; m kept fixed"
            )
        else:
            held = {False: [], True: []}
            for f, mask in enumerate(fold_masks):
                train, test = np.flatnonzero(~mask), np.flatnonzero(mask)
                for free in (False, True):
                    pr = fit(train, free, start=base)
                    held[free].append(_eval(_subset(d, test), pr, eps2, 0.0))
                    (free_fits if free else fixed_fits)[f] = pr
            fixed_mae, free_mae = float(np.mean(held[False])), float(np.mean(held[True]))
            chosen_free = free_mae < 0.98 * fixed_mae
            notes.append(
                f"m check on held-out groups: MAE {100 * fixed_mae:.3f}% with m fixed at {m:g}, "
                f"{100 * free_mae:.3f}% with m free; m {'freed' if chosen_free else 'kept fixed'}"
            )
    best = fit(None, True, start=base) if chosen_free else base
    surrogate = _to_surrogate(best, tau0, tpp0, tau_law, tpp_law, eps1, eps2, align, align_start)

    # Error model: held-out predictions from truncated curves.
    residuals: dict[int, dict] = {}
    maes: dict[int, dict] = {}  # the held-out predictions' alignment residuals (the misfit reference)
    fold_of: dict[int, int] = {}  # which fold's surrogate predicted each curve (pairs are formed within one)
    if fold_masks:
        for f, mask in enumerate(fold_masks):
            train, test = np.flatnonzero(~mask), np.flatnonzero(mask)
            if best is base and not chosen_free and f in fixed_fits and REUSE_M_CHECK_FITS:
                pr = fixed_fits[f]  # the m check made this very call: fit(train, False, start=base)
            elif chosen_free and f in free_fits and REUSE_FREE_M_FITS:
                pr = free_fits[f]  # the m check's fit(train, True, start=base): the same fit, another start
            else:
                pr = fit(train, chosen_free, start=best)
            s_fold = _to_surrogate(pr, tau0, tpp0, tau_law, tpp_law, eps1, eps2, align, align_start)
            errs, fold_maes = _predict_errors(s_fold, [curves[i] for i in test], error_fractions)
            for j, i in enumerate(test):
                residuals[int(i)] = errs[j]
                maes[int(i)] = fold_maes[j]
                fold_of[int(i)] = f
        kind = f"held out by group ({len(fold_masks)} folds over {len(set(labels))} groups)"
    else:
        residuals, maes = _predict_errors(surrogate, curves, error_fractions)
        fold_of = dict.fromkeys(residuals, 0)
        kind = "in-sample (a single curve group: no held-out check possible; intervals are optimistic)"
        notes.append(f"error model is {kind}")
    bands = []
    for p in error_fractions:
        have = [i for i in residuals if residuals[i].get(p) is not None]
        r = np.array([residuals[i][p] for i in have], dtype=float)
        if r.size == 0:
            continue
        scale = float(np.std(r, ddof=1)) if r.size >= 2 else float(abs(r[0]))
        # Runs of one group (seeds) miss together: the interval's t quantile counts groups, not runs.
        n_groups = len({labels[i] for i in have})
        bands.append(
            ErrorBand(
                fraction=float(p),
                n=max(n_groups, 1) if fold_masks else int(r.size),
                bias=float(np.mean(r)),
                scale=max(scale, SCALE_FLOOR),
                max_abs=float(np.max(np.abs(r))),
                fit_residual=_misfit_reference([maes[i][p] for i in have]),
            )
        )
    surrogate.error_bands = bands
    log_n, size_note = _sizes(curves)
    if size_note:
        notes.append(size_note)
    if log_n is not None and fold_masks:
        surrogate.size_trend = _size_trend(residuals, log_n, error_fractions)
        kinds = {t.kind for t in surrogate.size_trend}
        if "widen" in kinds:
            notes.append("only 2 sizes: no size trend; intervals widen outside the reference sizes")
        elif not kinds:
            notes.append("a single size: no size trend; predictions for other sizes carry no size correction")
    surrogate.reference = _reference_ranges(curves)
    surrogate.pair_bands = _pair_bands(residuals, fold_of, error_fractions)
    surrogate.lead_bands = lead_bands_of(curves, LEAD_FRACTIONS, align_start)
    if not surrogate.pair_bands:
        notes.append("no fold held two curves: no paired error model (the pruner compares unpaired)")

    b_all, q_all = _bq(d, best)
    shapes = _shapes(d, b_all[None], q_all[None], best.m, eps2)[0]
    table = []
    for i, c in enumerate(curves):
        err = np.abs(d.ell[i] - shapes[i])
        pe = {
            p: (None if residuals.get(i, {}).get(p) is None else math.exp(-residuals[i][p]) - 1.0)
            for p in error_fractions
        }
        table.append(
            CurveFit(
                run=c.run,
                tau=c.tau,
                tpp=c.tpp,
                b=float(b_all[i]),
                q=float(q_all[i]),
                mae=float(np.sum(err * d.w_fit[i])),
                mae_paper=float(np.sum(err * d.w_paper[i])),
                pred_error=pe,
            )
        )
    surrogate.info = {
        "fit_start": fit_start,
        "predict_weight": predict_weight,
        "predict_fractions": list(predict_fractions),
        "smooth_width": smooth_width,
        "free_m": chosen_free,
        "n_curves": len(curves),
        "mean_mae": float(np.mean([r.mae for r in table])),
        "mean_mae_paper": float(np.mean([r.mae_paper for r in table])),
        "error_model": kind,
        "notes": list(notes),
    }
    spread = pair_decay_distance(curves, residuals, fold_of) if surrogate.pair_bands else None
    if spread is not None:
        surrogate.info["pair_decay_distance"] = spread
    if params is None and all(c.params is not None for c in curves):
        params = [float(c.params) for c in curves if c.params is not None]
    elif params is None and any(c.params is not None for c in curves):
        notes.append("no scaling law: some runs have no params (model size); `forecast` cannot be used")
        surrogate.info["notes"] = list(notes)
    if params is not None:
        from collapse_hpo.predictors.forecast import reference_law

        surrogate.scaling_law, law_note = reference_law(surrogate, curves, params, alpha=law_alpha)
        notes.append(law_note)
        surrogate.info["notes"] = list(notes)
    return Calibration(
        surrogate=surrogate,
        table=table,
        mean_mae=surrogate.info["mean_mae"],
        mean_mae_paper=surrogate.info["mean_mae_paper"],
        notes=notes,
        seconds=time.perf_counter() - t0,
    )
