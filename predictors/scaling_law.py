"""A scaling law of the final loss, L(N, D) = E + A/N^α + B/D^β (Chinchilla's form), with bootstrap intervals.

N is the model size in parameters, D the training length in tokens. The law is stored with N and D divided by
reference scales n0 and d0 (the geometric means of the fit set), so its constants stay O(loss):

    L(N, D) = e + a · (N/n0)^(−α) + b · (D/d0)^(−β)        (Chinchilla's A = a · n0^α, B = b · d0^β)

Fitting (`fit_scaling_law`): for fixed (α, β) the law is linear in (e, a, b), so a grid over the exponents
with non-negative least squares finds a start, and lmfit refines all five constants on log residuals
log L_obs − log L(N, D). Runs of one size share their size effect, so sizes are the independent units:

- at least 3 distinct sizes are needed (2 when α is fixed by the caller), else `InputError`;
- when D/N spans less than ``min_tpp_range`` over the fit set, D and N are collinear and the D term cannot be
  told apart from the N term: the law becomes L = e + a · (N/n0)^(−α) (``kind == "n_only"``), valid only near
  the reference TPP, and `predict` refuses a TPP outside that range;
- the interval is a bootstrap prediction interval: refits on resampled sizes (≥ 5 sizes) or on resampled
  residuals (fewer), each replicate's law combined with every fit residual (a new run scatters like the
  reference runs did, e.g. by seed);
- an extrapolation check: the law refitted without the largest reference size predicts that size; the miss
  |log(actual/predicted)| (``extrapolation_error``) widens the interval on both sides for a forecast beyond
  the reference sizes, where the bootstrap alone does not see the law's bias (qiu mlp, BENCHMARKS.md §7).

The law models whatever final losses it is given; `calibrate` gives it L(1) divided by the surrogate's raw(1),
so one law serves several schedule shapes (see ``target``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from collapse_hpo.predictors.errors import InputError

KINDS = ("full", "n_only")
TARGETS = ("final_loss", "final_over_raw1")
MIN_TPP_RANGE = 1.2
N_BOOT = 200
_ALPHA_GRID = np.linspace(0.02, 1.5, 38)
_BETA_GRID = np.linspace(0.02, 1.5, 38)


@dataclass
class ScalingLaw:
    """A fitted final-loss law with its bootstrap replicates (see the module docstring for the form).

    Attributes:
        e, a, alpha, b, beta: the constants (b = 0 and beta = 0 when ``kind`` is "n_only").
        n0: parameter scale (parameters); d0: token scale (tokens).
        kind: "full" (N and D terms) or "n_only" (one TPP: the D term is absorbed into the N term).
        target: what the law predicts: "final_loss" (L(1) itself) or "final_over_raw1" (L(1) / raw(1), the
            surrogate's unnormalized end value for the run's schedule, τ and TPP; multiply back to get L(1)).
        n_range, tpp_range: [min, max] of N (parameters) and D/N (tokens per parameter) in the fit set.
        n_sizes, n_points: distinct sizes and final losses behind the fit.
        fixed: names of constants the caller fixed (e.g. ["alpha"]) with their values in the fields above.
        residuals: log(L_obs / L_fit) of the fit set.
        samples: bootstrap replicates [e, a, alpha, b, beta].
        bootstrap: "sizes" or "residuals" (what was resampled).
        extrapolation_error: |mean log(actual/predicted)| of the largest size predicted by a refit without it;
            None when too few sizes are left for that refit.
    """

    e: float
    a: float
    alpha: float
    b: float
    beta: float
    n0: float
    d0: float
    kind: str = "full"
    target: str = "final_loss"
    n_range: list[float] = field(default_factory=list)
    tpp_range: list[float] = field(default_factory=list)
    n_sizes: int = 0
    n_points: int = 0
    fixed: list[str] = field(default_factory=list)
    residuals: list[float] = field(default_factory=list)
    samples: list[list[float]] = field(default_factory=list)
    bootstrap: str = "sizes"
    extrapolation_error: float | None = None

    def __post_init__(self) -> None:
        for name in ("e", "a", "alpha", "b", "beta", "n0", "d0"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise InputError(f"scaling law: field {name!r} must be a finite number, got {v!r}")
            setattr(self, name, float(v))
        if self.n0 <= 0 or self.d0 <= 0:
            raise InputError("scaling law: n0 and d0 must be positive")
        if self.kind not in KINDS:
            raise InputError(f"scaling law: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.target not in TARGETS:
            raise InputError(f"scaling law: target must be one of {', '.join(TARGETS)}, got {self.target!r}")
        for name in ("n_range", "tpp_range"):
            v = getattr(self, name)
            if not (isinstance(v, list) and len(v) == 2 and all(_finite(x) and x > 0 for x in v)):
                raise InputError(f"scaling law: field {name!r} must be [min, max] of positive numbers")
        if not all(_finite(r) for r in self.residuals):
            raise InputError("scaling law: residuals must be finite numbers")
        ext = self.extrapolation_error
        if ext is not None and not (_finite(ext) and ext >= 0):
            raise InputError("scaling law: extrapolation_error must be a non-negative number or null")
        for i, s in enumerate(self.samples):
            if not (isinstance(s, list) and len(s) == 5 and all(_finite(x) for x in s)):
                raise InputError(f"scaling law: samples[{i}] must be 5 finite numbers [e, a, alpha, b, beta]")

    # ------------------------------------------------------------------ evaluation
    def _check(self, params: float, tokens: float) -> None:
        for name, v in (("params", params), ("tokens", tokens)):
            if not _finite(v) or v <= 0:
                raise InputError(f"scaling law: {name} must be a positive number, got {v!r}")
        if self.kind == "n_only":
            tpp = tokens / params
            lo, hi = self.tpp_range[0] / MIN_TPP_RANGE, self.tpp_range[1] * MIN_TPP_RANGE
            if not lo <= tpp <= hi:
                raise InputError(
                    f"scaling law: fitted at one TPP ({self.tpp_range[0]:.4g} to {self.tpp_range[1]:.4g} "
                    f"tokens per parameter), so it cannot forecast TPP {tpp:.4g}; calibrate on references "
                    "with several TPPs"
                )

    def _value(self, c: np.ndarray, params: float, tokens: float) -> np.ndarray:
        """The law at (params, tokens) for constant rows c = [e, a, alpha, b, beta] (shape (K, 5))."""
        x, y = params / self.n0, tokens / self.d0
        with np.errstate(over="ignore", invalid="ignore"):  # an inf is refused by the caller (`forecast`)
            return c[:, 0] + c[:, 1] * x ** (-c[:, 2]) + c[:, 3] * y ** (-c[:, 4])

    def predict(self, params: float, tokens: float) -> float:
        """The law's value at N = ``params`` (parameters) and D = ``tokens`` (tokens)."""
        self._check(params, tokens)
        return float(self._value(np.array([self.constants]), params, tokens)[0])

    def interval(self, params: float, tokens: float, confidence: float = 0.9) -> tuple[float, float]:
        """A ``confidence`` prediction interval (low, high) for one new run's value at (params, tokens).

        Every bootstrap replicate's law value is combined with every fit residual (multiplicatively, in log
        space); the interval is the central quantiles of that set. Without replicates (a fit with
        ``n_boot=0``) only the residuals widen it. Beyond the reference sizes both ends move out by the
        extrapolation check's miss (``extrapolation_error``).
        """
        self._check(params, tokens)
        if not 0.0 < confidence < 1.0:
            raise InputError(f"scaling law: confidence must be in (0, 1), got {confidence}")
        rows = np.array(self.samples if self.samples else [self.constants], dtype=float)
        vals = self._value(rows, params, tokens)
        vals = vals[np.isfinite(vals) & (vals > 0)]
        if vals.size == 0:
            vals = np.array([self.predict(params, tokens)])
        res = np.asarray(self.residuals if self.residuals else [0.0], dtype=float)
        dist = (np.log(vals)[:, None] + res[None, :]).ravel()
        q = (1.0 - confidence) / 2.0
        lo, hi = np.quantile(dist, [q, 1.0 - q])
        if self.extrapolation_error is not None and not self.n_range[0] <= params <= self.n_range[1]:
            lo, hi = lo - self.extrapolation_error, hi + self.extrapolation_error
        return float(math.exp(lo)), float(math.exp(hi))

    @property
    def constants(self) -> list[float]:
        """[e, a, alpha, b, beta]."""
        return [self.e, self.a, self.alpha, self.b, self.beta]

    def describe(self) -> str:
        """One line: the law in Chinchilla's units (A, B for raw N and D) and its fit set."""
        big_a = self.a * self.n0**self.alpha
        if self.kind == "n_only":
            law = f"L = {self.e:.4g} + {big_a:.4g}/N^{self.alpha:.3g} (D term absorbed: one TPP)"
        else:
            big_b = self.b * self.d0**self.beta
            law = f"L = {self.e:.4g} + {big_a:.4g}/N^{self.alpha:.3g} + {big_b:.4g}/D^{self.beta:.3g}"
        fixed = f"; fixed: {', '.join(self.fixed)}" if self.fixed else ""
        if self.extrapolation_error is not None:
            fixed += f"; largest size from the others missed by {100 * self.extrapolation_error:.2f}%"
        else:
            fixed += "; too few sizes to check the law on a held-out size (intervals may be too narrow)"
        return (
            f"scaling law {law}; {self.n_points} final losses, {self.n_sizes} sizes "
            f"({self.n_range[0]:.3g} to {self.n_range[1]:.3g} parameters), residual sd "
            f"{100 * float(np.std(self.residuals)) if self.residuals else 0.0:.2f}%, {len(self.samples)} "
            f"bootstrap refits over {self.bootstrap}{fixed}"
        )

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (`from_dict` inverts it)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any, source: str = "scaling law") -> ScalingLaw:
        """Inverse of `to_dict`; raises InputError naming ``source`` and the field on anything malformed."""
        if not isinstance(d, dict):
            raise InputError(f"{source}: field 'scaling_law' must be an object")
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise InputError(f"{source}: scaling_law has unknown field(s) {', '.join(sorted(unknown))}")
        missing = [k for k in ("e", "a", "alpha", "b", "beta", "n0", "d0") if k not in d]
        if missing:
            raise InputError(f"{source}: scaling_law is missing {', '.join(missing)}; recalibrate")
        try:
            return cls(**d)
        except InputError as err:
            raise InputError(f"{source}: {err}") from None
        except TypeError as err:
            raise InputError(f"{source}: malformed scaling_law ({err})") from None


def _finite(x: Any) -> bool:
    return not isinstance(x, bool) and isinstance(x, int | float) and math.isfinite(x)


def _design(x: np.ndarray, y: np.ndarray, alpha: float, beta: float, full: bool) -> np.ndarray:
    cols = [np.ones_like(x), x ** (-alpha)]
    if full:
        cols.append(y ** (-beta))
    return np.column_stack(cols)


def _start(
    x: np.ndarray, y: np.ndarray, L: np.ndarray, full: bool, alpha: float | None
) -> list[float]:
    """Grid over the exponents with non-negative least squares for (e, a, b), relative residuals."""
    from scipy.optimize import nnls

    best, best_c = math.inf, None
    alphas = [alpha] if alpha is not None else _ALPHA_GRID
    betas = _BETA_GRID if full else [0.0]
    w = 1.0 / L
    for al in alphas:
        for be in betas:
            X = _design(x, y, al, be, full)
            coef, _ = nnls(X * w[:, None], np.ones_like(L))
            r = float(np.sum((X @ coef * w - 1.0) ** 2))
            if r < best:
                best = r
                best_c = [coef[0], coef[1], al, coef[2] if full else 0.0, be]
    assert best_c is not None
    return [float(v) for v in best_c]


def _refine(
    x: np.ndarray, y: np.ndarray, L: np.ndarray, start: Sequence[float], full: bool, alpha: float | None
) -> list[float]:
    """lmfit least squares on log residuals from ``start``; bounds keep every term non-negative."""
    import lmfit

    lmin = float(np.min(L))
    p = lmfit.Parameters()
    p.add("e", value=min(max(start[0], 0.0), 0.999 * lmin), min=0.0, max=lmin)
    p.add("a", value=max(start[1], 1e-9), min=0.0)
    p.add("alpha", value=start[2], min=0.005, max=3.0, vary=alpha is None)
    p.add("b", value=max(start[3], 1e-9) if full else 0.0, min=0.0, vary=full)
    p.add("beta", value=start[4] if full else 0.0, min=0.0 if not full else 0.005, max=3.0, vary=full)
    logL = np.log(L)

    def resid(pp: lmfit.Parameters) -> np.ndarray:
        v = pp.valuesdict()
        pred = v["e"] + v["a"] * x ** (-v["alpha"]) + v["b"] * y ** (-v["beta"])
        return logL - np.log(np.maximum(pred, 1e-12))

    res = lmfit.minimize(resid, p, method="least_squares")
    v = res.params.valuesdict()
    out = [v["e"], v["a"], v["alpha"], v["b"], v["beta"]]

    def sse(c: Sequence[float]) -> float:
        pred = c[0] + c[1] * x ** (-c[2]) + c[3] * y ** (-c[4])
        return float(np.sum((logL - np.log(np.maximum(pred, 1e-12))) ** 2))

    return [float(c) for c in (out if sse(out) <= sse(start) else start)]


def fit_scaling_law(
    params: Sequence[float],
    tokens: Sequence[float],
    final_loss: Sequence[float],
    *,
    alpha: float | None = None,
    target: str = "final_loss",
    n_boot: int = N_BOOT,
    min_tpp_range: float = MIN_TPP_RANGE,
    seed: int = 0,
) -> ScalingLaw:
    """Fit L(N, D) = E + A/N^α + B/D^β to final losses, with bootstrap replicates for intervals.

    Args:
        params: model size N of each run (parameters).
        tokens: training length D of each run (tokens).
        final_loss: each run's final loss (positive).
        alpha: fix α at this value (a prior, e.g. Chinchilla's 0.34) instead of fitting it; then 2 sizes
            suffice.
        target: recorded in the law: what ``final_loss`` holds ("final_loss" or "final_over_raw1").
        n_boot: bootstrap refits (0: none; the interval then reflects only the residual scatter).
        min_tpp_range: D/N spanning less than this ratio makes the law "n_only".
        seed: seed of the bootstrap resampling (the fit itself is deterministic).

    Raises InputError on non-positive or non-finite inputs, mismatched lengths, or too few sizes.
    """
    N = np.asarray(params, dtype=float)
    D = np.asarray(tokens, dtype=float)
    L = np.asarray(final_loss, dtype=float)
    if not (N.shape == D.shape == L.shape) or N.ndim != 1:
        raise InputError("scaling law: params, tokens and final_loss must be lists of the same length")
    for name, arr in (("params", N), ("tokens", D), ("final_loss", L)):
        if arr.size and not (np.all(np.isfinite(arr)) and np.all(arr > 0)):
            bad = int(np.flatnonzero(~(np.isfinite(arr) & (arr > 0)))[0])
            what = {
                "params": "the model size N in parameters",
                "tokens": "the training tokens D (tpp * N; a run whose TPP is not defined has no D: pass its "
                          "training tokens, or leave it out of the fit)",
                "final_loss": "the final loss",
            }[name]
            raise InputError(f"scaling law: every {name} value must be a positive finite number, got "
                             f"{float(arr[bad])!r} at run {bad}; give {what}")
    if alpha is not None and not (_finite(alpha) and 0 < alpha <= 3):
        raise InputError(f"scaling law: a fixed alpha must be in (0, 3], got {alpha!r}")
    if target not in TARGETS:
        raise InputError(f"scaling law: target must be one of {', '.join(TARGETS)}, got {target!r}")
    if n_boot < 0:
        raise InputError(f"scaling law: n_boot must be >= 0, got {n_boot}")
    sizes = np.unique(np.round(np.log(N), 6)) if N.size else np.array([])
    need = 2 if alpha is not None else 3
    if sizes.size < need:
        raise InputError(
            f"scaling law: needs final losses at {need} or more model sizes"
            f"{'' if alpha is not None else ' (2 with a fixed alpha)'}, got {sizes.size}"
        )
    tpp = D / N
    full = float(tpp.max() / tpp.min()) >= min_tpp_range
    n0 = float(np.exp(np.mean(np.log(N))))
    d0 = float(np.exp(np.mean(np.log(D))))
    x, y = N / n0, D / d0

    def fit(idx: np.ndarray, start: Sequence[float] | None = None) -> list[float]:
        s = _start(x[idx], y[idx], L[idx], full, alpha) if start is None else start
        return _refine(x[idx], y[idx], L[idx], s, full, alpha)

    all_idx = np.arange(L.size)
    c = fit(all_idx)
    pred = c[0] + c[1] * x ** (-c[2]) + c[3] * y ** (-c[4])
    resid = np.log(L / pred)
    size_of = np.round(np.log(N), 6)
    rng = np.random.default_rng(seed)
    samples: list[list[float]] = []
    by_sizes = sizes.size >= 5
    groups = [np.flatnonzero(size_of == s) for s in sizes]
    for _ in range(n_boot):
        if by_sizes:
            pick = rng.integers(0, sizes.size, sizes.size)
            if np.unique(pick).size < need:
                continue
            idx = np.concatenate([groups[k] for k in pick])
            samples.append(fit(idx, start=c))
        else:
            y_star = pred * np.exp(rng.choice(resid, resid.size, replace=True))
            s = _refine(x, y, y_star, c, full, alpha)
            samples.append(s)
    extrapolation = None
    rest = size_of < sizes[-1]
    if np.unique(size_of[rest]).size >= need:
        s_rest = _start(x[rest], y[rest], L[rest], full, alpha)
        c_rest = _refine(x[rest], y[rest], L[rest], s_rest, full, alpha)
        top = ~rest
        pred_top = c_rest[0] + c_rest[1] * x[top] ** (-c_rest[2]) + c_rest[3] * y[top] ** (-c_rest[4])
        extrapolation = float(abs(np.mean(np.log(L[top] / pred_top))))
    return ScalingLaw(
        e=c[0],
        a=c[1],
        alpha=c[2],
        b=c[3],
        beta=c[4],
        n0=n0,
        d0=d0,
        kind="full" if full else "n_only",
        target=target,
        n_range=[float(N.min()), float(N.max())],
        tpp_range=[float(tpp.min()), float(tpp.max())],
        n_sizes=int(sizes.size),
        n_points=int(L.size),
        fixed=["alpha"] if alpha is not None else [],
        residuals=[float(r) for r in resid],
        samples=samples,
        bootstrap="sizes" if by_sizes else "residuals",
        extrapolation_error=extrapolation,
    )
