"""The parametric surrogate of the collapsed loss curve (paper Eq. 4–5, METHOD.md §3).

    raw(t̂) = ((1 + ε1) / (t̂ + ε1))^m  +  b · (η(t̂) + ε2)^q,      ℓ̂(t̂) = raw(t̂) / raw(1)

with b = b_c · τ^b_e (AdamW timescale τ) and q = q_c · TPP^q_e (tokens per parameter). When the reference set
had one τ only (or no weight decay), the τ law is the constant b = b_c (``tau_law == "constant"``); likewise
``tpp_law == "constant"`` gives q = q_c (a single TPP, or runs whose TPP is not defined, e.g. fine-tuning).
A run without a TPP (``tpp`` None) can be served only by a constant q law, as a run without weight decay
only by a constant τ law. A surrogate also carries how to align a partial curve onto ℓ̂
(``align``, ``align_start``) and the learned error model of final-loss predictions by training fraction.

The error model has two parts. ``error_bands`` (bias and spread of log(actual/predicted) over held-out
reference groups) serve a run whose size is unknown. ``size_trend`` models how that error moves with the model
size N (non-embedding parameters), from the held-out residuals of every reference size, the end sizes
included, with an extrapolation rule chosen by how well it predicted the end sizes: a prediction for a size
outside the reference range carries the bias the rule extrapolates and an interval that widens with the
distance from the reference sizes. ``reference`` records the ranges of N, TPP and τ the surrogate was
calibrated on, so a prediction can say when it extrapolates.
"""

from __future__ import annotations

import bisect
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.scaling_law import ScalingLaw
from collapse_hpo.predictors.schedules import Schedule

FORMAT = "collapse-hpo-surrogate"
FORMAT_VERSION = 1
ALIGN_LOSSES = ("sq", "mae", "log")
LAWS = ("power", "constant")
TREND_KINDS = ("trend", "widen")
# Valid ranges of the surrogate's numbers. Calibration stays far inside them (b_e in [-4, 4], q_e in [-3, 3],
# m in [0.001, 0.6]); a file outside them was edited or corrupted, and is refused when loaded.
MAX_COEFF = 1e30  # b_c, q_c in (0, MAX_COEFF]
MAX_EXPONENT = 10.0  # |b_e|, |q_e| <= MAX_EXPONENT
MAX_M = 2.0  # m in (0, MAX_M]
MAX_LOG_ERROR = 50.0  # |bias|, scale, max_abs of error bands and size trends, log units (e^50: no real miss)
REFERENCE_KEYS = ("params", "tpp", "tau")
EXTRAPOLATION_SLACK = 0.05  # TPP or τ within 5% of the reference range is not reported as extrapolation
# A control (N, TPP or τ) more than this factor outside the reference range is beyond any evidence the
# surrogate or its law has: `forecast` refuses it (a TPP of 2e-290 or a loss of 514 is not a forecast).
MAX_EXTRAPOLATION = 100.0


@dataclass(frozen=True)
class ErrorBand:
    """How far final-loss predictions from the first ``fraction`` of reference curves missed.

    The residual is r = log(actual final loss / predicted final loss) over held-out reference curves; ``n``
    counts the independent units behind it (curve groups, e.g. sizes, since seeds of one group miss together;
    curves when the error model is in-sample). ``bias`` is the mean of r, ``scale`` its standard deviation
    (ddof = 1, floored), ``max_abs`` the largest |r|.

    ``fit_residual`` is what a collapsing curve's alignment residual looks like at this fraction: the
    ``MISFIT_QUANTILE`` quantile, over the same held-out reference curves truncated at ``fraction``, of
    ``Prediction.fit_residual`` (normalized-loss units). A prediction's misfit is its own ``fit_residual``
    over this (predictors/misfit.py). None when not learned (paired bands, and surrogates calibrated before
    it existed).
    """

    fraction: float
    n: int
    bias: float
    scale: float
    max_abs: float
    fit_residual: float | None = None


@dataclass(frozen=True)
class SizeTrend:
    """How the held-out prediction error r = log(actual/predicted) at ``fraction`` moves with x = ln N.

    ``xs`` are the reference sizes (ln N, ascending), ``rs`` the mean held-out residual of each size (every
    size is held out in some fold, the smallest and largest included), ``counts`` the runs behind each mean.
    The bias at a size x follows the rule ``k`` (see `extrapolate_bias`): −1 none (the raw prediction), 0 the
    mean of ``rs``, 1 the nearest size's residual (interpolated inside), k ≥ 2 the least-squares line through
    the k sizes nearest x (k = n: through all). Calibration chooses ``k`` by how well each rule predicted the
    end sizes' residuals from the other sizes, which tests extrapolation as interior folds never do.
    ``ext_error`` is the root mean square of the chosen rule's misses there (log units, scaled to the mean
    ln-N distance ``step`` of the tests); ``tests`` counts them. ``kind`` "trend" (3 or more sizes) corrects
    the point by the bias; "widen" (2 sizes: nothing to test a rule on) keeps the raw point and only widens
    the interval, ``ext_error`` then being the difference of the two sizes' residuals.

    Interval of r at x: bias(x) ± t_{(1+confidence)/2, tests} · sqrt(scale² · (1 + 1/m) + (ext_error · d /
    step)²), with ``scale`` the pooled within-size spread of the run residuals (seeds; for k ≤ 0, which model
    no size dependence, the spread of all run residuals about the bias), m the runs behind the bias and d the
    ln-N distance from x to the nearest reference size: it widens with the distance from the reference sizes,
    outside their range above all.
    """

    fraction: float
    kind: str
    n: int
    k: int
    xs: tuple[float, ...]
    rs: tuple[float, ...]
    counts: tuple[int, ...]
    scale: float
    ext_error: float
    step: float
    tests: int = 2

    @property
    def lo(self) -> float:
        """ln N of the smallest reference size."""
        return self.xs[0]

    @property
    def hi(self) -> float:
        """ln N of the largest reference size."""
        return self.xs[-1]

    def bias(self, x: float) -> tuple[float, int]:
        """(bias of r at x = ln N by rule ``k``, the number of runs behind it)."""
        return extrapolate_bias(np.asarray(self.xs), np.asarray(self.rs), np.asarray(self.counts), x, self.k)

    def band(self, x: float, confidence: float) -> tuple[float, float]:
        """(bias, half-width) of r = log(actual/predicted) at x = ln N: the interval is bias ± half-width."""
        from scipy import stats

        bias, m = self.bias(x) if self.kind == "trend" else (float(np.mean(self.rs)), int(sum(self.counts)))
        d = float(np.min(np.abs(np.asarray(self.xs) - x)))
        var = self.scale**2 * (1.0 + 1.0 / max(m, 1)) + (self.ext_error * d / self.step) ** 2
        tq = float(stats.t.ppf(0.5 + 0.5 * confidence, df=self.tests))
        return bias, tq * math.sqrt(var)


def beyond_reference(ranges: dict[str, list[float]], values: dict[str, float | None],
                     limit: float = MAX_EXTRAPOLATION) -> str | None:
    """The first control of ``values`` (params, tpp, tau; None: not given) that lies more than ``limit``
    times outside its [lo, hi] in ``ranges`` (a key without a range is not checked), as a one-line reason
    naming the value, the range and the limit; None when every one is within."""
    for key, v in values.items():
        rng = ranges.get(key)
        if rng is None or v is None:
            continue
        lo, hi = rng
        factor = max(v / hi, lo / v) if v > 0 else math.inf
        if factor > limit:
            side = "above" if v > hi else "below"
            return (f"{key} {v:.4g} is x{factor:.3g} {side} the reference range {lo:.4g}-{hi:.4g}, beyond "
                    f"the x{limit:g} the references can speak for; calibrate on references nearer to it")
    return None


def extrapolate_bias(
    xs: np.ndarray, rs: np.ndarray, counts: np.ndarray, x: float, k: int
) -> tuple[float, int]:
    """The residual at x = ln N from per-size residuals ``rs`` at sizes ``xs`` by rule k (see `SizeTrend`).

    Returns (value, runs behind it). k = −1: 0 (no correction); k = 0: the mean of rs; k = 1: the nearest
    size's (outside the sizes; inside, linear interpolation between the two sizes around x); k ≥ 2: the
    least-squares line through the k sizes nearest x (ties towards smaller sizes), at x.
    """
    if k < 0:
        return 0.0, int(np.sum(counts))
    if k == 0:
        return float(np.mean(rs)), int(np.sum(counts))
    if k == 1 and xs[0] < x < xs[-1]:  # inside the sizes "nearest" interpolates between the two around x
        j = int(np.searchsorted(xs, x))
        w = (x - xs[j - 1]) / (xs[j] - xs[j - 1])
        return float(rs[j - 1] + w * (rs[j] - rs[j - 1])), int(counts[j - 1] + counts[j])
    order = np.argsort(np.abs(xs - x), kind="stable")[: min(k, xs.size)]
    if order.size == 1:
        return float(rs[order[0]]), int(counts[order[0]])
    xx, rr = xs[order], rs[order]
    c = xx.mean()
    sxx = float(np.sum((xx - c) ** 2))
    slope = float(np.sum((xx - c) * (rr - rr.mean())) / sxx) if sxx > 0 else 0.0
    return float(rr.mean() + slope * (x - c)), int(np.sum(counts[order]))


@dataclass
class Surrogate:
    """The collapsed-curve model ℓ̂(t̂; schedule, τ, TPP) and how predictions use it.

    Attributes:
        b_c, b_e: b = b_c · τ^b_e (b = b_c when ``tau_law`` is "constant").
        q_c, q_e: q = q_c · TPP^q_e (q = q_c when ``tpp_law`` is "constant").
        eps1, eps2, m: the paper's fixed constants (0.001, 0.1, 0.05) unless calibration freed m.
        tau_law, tpp_law: "power" or "constant" (a degenerate reference set: single τ / no decay, single TPP /
            TPP not defined).
        align: the early-align loss, "sq" (squared error, closed form), "mae" or "log".
        align_start: a prediction at fraction p aligns on the points with t̂ ≥ align_start · p.
        error_bands: learned prediction errors by fraction (sorted by fraction); empty when not calibrated.
        pair_bands: learned errors of the *difference* of two runs' predictions made at the same fraction
            (r = log(actual_A/actual_B) − log(predicted_A/predicted_B) over pairs of held-out runs of one
            fold; bias 0 by symmetry). A bias common to the runs of one sweep (the reference's size or data
            mismatch) cancels in the difference, so these are narrower than ``error_bands``; the pruner's
            paired comparison uses them. Empty when not calibrated or when no fold held two runs.
        lead_bands: by fraction, the largest lead (log loss ratio at that fraction) that a run which ended
            worse had over one of the reference's best runs (``calibrate.LEAD_TOP_SHARE``, at least
            ``LEAD_TOP_MIN``): the margin its winners needed. The pruner compares trials of other controls by
            their loss ratio where twice this is below the paired margin (``decision.lead_margin``). Empty in
            files written before it.
        size_trend: the error model as a function of the model size (see `SizeTrend`), one per learned
            fraction; empty when the reference curves had no sizes (``params``) or a single size.
        reference: the ranges the surrogate was calibrated on, {"params": [lo, hi], "tpp": [lo, hi],
            "tau": [lo, hi]} (a key is absent when unknown: no sizes, no weight decay, TPP not defined); see
            `extrapolation`.
        info: free-form notes from calibration (fit region, weighting, fit MAE, ...), kept in the JSON.
        scaling_law: the final-loss law L(N, D) fitted on the same reference runs (`collapse-hpo forecast`),
            or None (fewer than 3 sizes, no sizes given, or a file written before the law existed).
        no_decay_limit: serve a run without weight decay (τ None: AdamW's timescale is infinite) with the τ
            power law's limit τ → ∞, b = 0, when b_e < 0 (b falls as τ grows). False (the default): such a
            run is refused unless the law is constant. Only a use that checks the shape on the run's own
            curves should set it: the online reference's prior, tested on the sweep (predictors/prior.py).
    """

    b_c: float
    b_e: float
    q_c: float
    q_e: float
    eps1: float = 1e-3
    eps2: float = 0.1
    m: float = 0.05
    tau_law: str = "power"
    tpp_law: str = "power"
    align: str = "sq"
    align_start: float = 0.5
    error_bands: list[ErrorBand] = field(default_factory=list)
    pair_bands: list[ErrorBand] = field(default_factory=list)
    lead_bands: list[ErrorBand] = field(default_factory=list)
    size_trend: list[SizeTrend] = field(default_factory=list)
    reference: dict[str, list[float]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    scaling_law: ScalingLaw | None = None
    no_decay_limit: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.no_decay_limit, bool):
            raise InputError(f"surrogate: field 'no_decay_limit' must be true or false, got "
                             f"{self.no_decay_limit!r}")
        for name in ("b_c", "b_e", "q_c", "q_e", "eps1", "eps2", "m", "align_start"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise InputError(f"surrogate: field {name!r} must be a finite number, got {v!r}")
            setattr(self, name, float(v))
        for name in ("b_c", "q_c"):
            if not 0.0 < getattr(self, name) <= MAX_COEFF:
                raise InputError(f"surrogate: field {name!r} must be in (0, {MAX_COEFF:g}], "
                                 f"got {getattr(self, name)!r}")
        for name in ("b_e", "q_e"):
            if abs(getattr(self, name)) > MAX_EXPONENT:
                raise InputError(f"surrogate: field {name!r} must be in [-{MAX_EXPONENT:g}, "
                                 f"{MAX_EXPONENT:g}], got {getattr(self, name)!r}")
        if not 0.0 < self.m <= MAX_M:
            raise InputError(f"surrogate: field 'm' must be in (0, {MAX_M:g}], got {self.m!r}")
        if not 0.0 < self.eps1 <= 1.0:
            raise InputError(f"surrogate: field 'eps1' must be in (0, 1], got {self.eps1!r}")
        if not 0.0 < self.eps2 <= 10.0:
            raise InputError(f"surrogate: field 'eps2' must be in (0, 10], got {self.eps2!r}")
        self.reference = _check_reference(self.reference)
        if self.tau_law not in LAWS or self.tpp_law not in LAWS:
            raise InputError(f"surrogate: tau_law and tpp_law must be one of {', '.join(LAWS)}")
        if self.align not in ALIGN_LOSSES:
            raise InputError(f"surrogate: align must be one of {', '.join(ALIGN_LOSSES)}, got {self.align!r}")
        if not 0.0 <= self.align_start < 1.0:
            raise InputError(f"surrogate: align_start must be in [0, 1), got {self.align_start}")
        self.error_bands = sorted(self.error_bands, key=lambda e: e.fraction)
        self.pair_bands = sorted(self.pair_bands, key=lambda e: e.fraction)
        self.lead_bands = sorted(self.lead_bands, key=lambda e: e.fraction)
        self.size_trend = sorted(self.size_trend, key=lambda e: e.fraction)

    # ------------------------------------------------------------------ the laws
    def b(self, tau: float | None) -> float:
        """b(τ). A run without weight decay (τ None) under a power law gets the law's limit τ → ∞, 0, when
        ``no_decay_limit`` is set and b_e < 0; otherwise it raises InputError."""
        if self.tau_law == "constant":
            return self.b_c
        if (tau is None or tau == math.inf) and self.no_decay_limit and self.b_e < 0:
            return 0.0
        if tau is None or not math.isfinite(tau):
            raise InputError("surrogate: b depends on τ (calibrated with weight decay) but this run has no "
                             "weight decay (tau empty); calibrate on runs without weight decay")
        if tau <= 0:
            raise InputError(f"surrogate: tau must be positive, got {tau}")
        return self.b_c * tau**self.b_e

    def q(self, tpp: float | None) -> float:
        """q(TPP). Raises InputError when the TPP law is a power law and the run's TPP is not defined
        (None)."""
        if self.tpp_law == "constant":
            return self.q_c
        if tpp is None:
            raise InputError("surrogate: q depends on TPP (calibrated on runs with a tpp) but this run's tpp "
                             "is not defined (tpp empty); give the run's tokens per parameter, or calibrate "
                             "on runs without a tpp (q is then a constant)")
        if not math.isfinite(tpp) or tpp <= 0:
            raise InputError(f"surrogate: tpp must be a positive number (or empty: not defined), got {tpp}")
        return self.q_c * tpp**self.q_e

    def normalized_bq(
        self, t_hat: np.ndarray, eta: np.ndarray, eta_end: float, b: float, q: float
    ) -> np.ndarray:
        """ℓ̂ at t̂ for given b, q and η(t̂) samples ``eta`` (peak 1), with η(1) = ``eta_end``."""
        t = np.asarray(t_hat, dtype=float)
        e1 = self.eps1
        raw = ((1.0 + e1) / (np.maximum(t, 0.0) + e1)) ** self.m + b * (np.asarray(eta) + self.eps2) ** q
        raw1 = 1.0 + b * (eta_end + self.eps2) ** q
        return raw / raw1

    def normalized(
        self, t_hat: float | np.ndarray, schedule: Schedule, tau: float | None, tpp: float | None
    ) -> np.ndarray:
        """ℓ̂(t̂) = L(t̂)/L(1) predicted for a run with this schedule, τ (None: no decay) and TPP (None: not
        defined); 1 at t̂ = 1."""
        t = np.atleast_1d(np.asarray(t_hat, dtype=float))
        eta = np.asarray(schedule(t), dtype=float)
        return self.normalized_bq(t, eta, float(schedule(1.0)), self.b(tau), self.q(tpp))

    # ------------------------------------------------------------------ error model
    def error_band(self, fraction: float) -> ErrorBand | None:
        """The error band at ``fraction``, linearly interpolated between learned fractions.

        Beyond the last learned fraction the last band is used (errors shrink with more data, so this is
        conservative); below the first, the first. None when no error model was learned.
        """
        return _interpolate(self.error_bands, fraction)

    def pair_band(self, fraction: float) -> ErrorBand | None:
        """The paired-difference error band at ``fraction`` (interpolated as ``error_band``); None if none."""
        return _interpolate(self.pair_bands, fraction)

    def lead_band(self, fraction: float) -> ErrorBand | None:
        """The reference's largest lead over its best runs at ``fraction`` (``lead_bands``, interpolated as
        ``error_band``); None when the surrogate has none."""
        return _interpolate(self.lead_bands, fraction)

    def size_band(self, fraction: float, params: float, confidence: float) -> tuple[float, float, str] | None:
        """(bias, half-width, kind) of r = log(actual/predicted) for a run of ``params`` parameters predicted
        from the first ``fraction`` of training, from the size trend (linearly interpolated between learned
        fractions, clamped outside them). The interval is predicted · exp(bias ± half-width). None without a
        size trend or a usable ``params``."""
        if not self.size_trend or params is None or not math.isfinite(params) or params <= 0:
            return None
        x = math.log(params)
        fr = [t.fraction for t in self.size_trend]
        if fraction <= fr[0] or fraction >= fr[-1]:
            t = self.size_trend[0] if fraction <= fr[0] else self.size_trend[-1]
            return (*t.band(x, confidence), t.kind)
        j = int(np.searchsorted(fr, fraction))
        lo, hi = self.size_trend[j - 1], self.size_trend[j]
        w = (fraction - lo.fraction) / (hi.fraction - lo.fraction)
        (b0, h0), (b1, h1) = lo.band(x, confidence), hi.band(x, confidence)
        return b0 + w * (b1 - b0), h0 + w * (h1 - h0), hi.kind

    def outside_sizes(self, params: float | None) -> float:
        """How far ``params`` lies outside the size trend's reference sizes, in ln N (0 inside or unknown)."""
        if not self.size_trend or params is None or not math.isfinite(params) or params <= 0:
            return 0.0
        x = math.log(params)
        t = self.size_trend[0]
        return max(0.0, t.lo - x, x - t.hi)

    def extrapolation(self, params: float | None, tpp: float | None, tau: float | None) -> str | None:
        """A one-line note when a run's controls lie outside the reference ranges, else None.

        ``params`` (parameters N), ``tpp`` and ``tau`` (None: unknown / not defined / no weight decay) are
        compared with
        ``reference``; a control the reference did not record is not checked. The ratio says how far out.
        Any size outside the reference sizes counts; TPP and τ count when more than ``EXTRAPOLATION_SLACK``
        (5%) outside (runs of one family differ slightly in TPP, e.g. 244–257 on qiu chess).
        """
        out = []
        for key, v in (("params", params), ("tpp", tpp), ("tau", tau)):
            rng = self.reference.get(key)
            if rng is None or v is None or not math.isfinite(v) or v <= 0:
                continue
            lo, hi = rng
            slack = 1e-9 if key == "params" else EXTRAPOLATION_SLACK
            if v > hi * (1 + slack):
                out.append(f"{key} {v:.4g} is x{v / hi:.3g} above the reference range {lo:.4g}-{hi:.4g}")
            elif v < lo * (1 - slack):
                out.append(f"{key} {v:.4g} is x{lo / v:.3g} below the reference range {lo:.4g}-{hi:.4g}")
        return "; ".join(out) if out else None

    def too_far(self, params: float | None, tpp: float | None, tau: float | None,
                limit: float = MAX_EXTRAPOLATION) -> str | None:
        """A one-line reason when ``params``, ``tpp`` or ``tau`` lies more than ``limit`` times outside the
        reference range (see `beyond_reference`), else None."""
        return beyond_reference(self.reference, {"params": params, "tpp": tpp, "tau": tau}, limit)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with the format name and version."""
        d = asdict(self)
        d["error_bands"] = [_band_dict(e) for e in self.error_bands]
        d["pair_bands"] = [_band_dict(e) for e in self.pair_bands]
        d["lead_bands"] = [_band_dict(e) for e in self.lead_bands]
        d["size_trend"] = [asdict(e) for e in self.size_trend]
        d["reference"] = {k: list(v) for k, v in self.reference.items()}
        if self.scaling_law is None:
            d.pop("scaling_law")  # optional field: files without a law stay as they were
        if not self.no_decay_limit:
            d.pop("no_decay_limit")  # likewise: only a prior served to a sweep sets it
        return {"format": FORMAT, "version": FORMAT_VERSION, **d}

    @classmethod
    def from_dict(cls, d: Any, source: str = "surrogate") -> Surrogate:
        """Inverse of ``to_dict``; raises InputError naming ``source`` and the field on anything malformed."""
        if not isinstance(d, dict):
            raise InputError(f"{source}: expected a JSON object, got {type(d).__name__}")
        if d.get("format") != FORMAT:
            raise InputError(f"{source}: not a collapse-hpo surrogate (field 'format' is "
                             f"{d.get('format')!r}); make one with `collapse-hpo calibrate`")
        if d.get("version") != FORMAT_VERSION:
            raise InputError(f"{source}: surrogate format version {d.get('version')!r} is not supported "
                             f"(this version reads {FORMAT_VERSION}); recalibrate")
        for name in ("b_c", "b_e", "q_c", "q_e"):
            if name not in d:
                raise InputError(f"{source}: missing field {name!r}; recalibrate (`collapse-hpo calibrate`)")
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known - {"format", "version"}
        if unknown:
            raise InputError(f"{source}: unknown field(s) {', '.join(sorted(unknown))}")
        kwargs = {k: v for k, v in d.items() if k in known}
        parsed: dict[str, Any] = {
            name: _parse_bands(kwargs.pop(name, []), name, source)
            for name in ("error_bands", "pair_bands", "lead_bands")
        }
        parsed["size_trend"] = _parse_trend(kwargs.pop("size_trend", []), source)
        if kwargs.get("scaling_law") is not None:
            kwargs["scaling_law"] = ScalingLaw.from_dict(kwargs["scaling_law"], source)
        if "info" in kwargs and not isinstance(kwargs["info"], dict):
            raise InputError(f"{source}: field 'info' must be an object")
        for name in ("tau_law", "tpp_law", "align"):
            if name in kwargs and not isinstance(kwargs[name], str):
                raise InputError(f"{source}: field {name!r} must be a string")
        try:
            s = cls(**parsed, **kwargs)
        except InputError as err:
            raise InputError(f"{source}: {str(err).removeprefix('surrogate: ')}") from None
        except TypeError as err:
            raise InputError(f"{source}: malformed surrogate ({err})") from None
        return s

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the surrogate as JSON with `collapse_hpo.predictors.atomic.atomic_write` (atomic, fsynced,
        the old file's mode kept; InputError naming the path when it cannot be written)."""
        from collapse_hpo.predictors.atomic import atomic_write

        text = json.dumps(self.to_dict(), indent=2, sort_keys=False, allow_nan=False)
        with atomic_write(path, "w") as fh:
            fh.write(text + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Surrogate:
        """Read a surrogate JSON; a missing, unreadable or malformed file raises a one-line InputError."""
        p = Path(path)
        if not p.is_file():
            raise InputError(f"{p}: no such surrogate file; make one with `collapse-hpo calibrate`")
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise InputError(f"{p}: not a UTF-8 JSON file; make one with `collapse-hpo calibrate`") from None
        except json.JSONDecodeError as err:
            raise InputError(f"{p}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}); "
                             "recreate it with `collapse-hpo calibrate`") from None
        except RecursionError:
            raise InputError(f"{p}: JSON nested too deeply to be a surrogate; recreate it with "
                             "`collapse-hpo calibrate`") from None
        try:
            return cls.from_dict(d, source=str(p))
        except RecursionError:
            raise InputError(f"{p}: field 'info' is nested too deeply; recreate it with "
                             "`collapse-hpo calibrate`") from None


def _band_dict(band: ErrorBand) -> dict[str, Any]:
    """An ErrorBand as JSON; ``fit_residual`` only when learned (files without it stay as they were)."""
    d = asdict(band)
    if d["fit_residual"] is None:
        d.pop("fit_residual")
    return d


def _interpolate(bands: list[ErrorBand], fraction: float) -> ErrorBand | None:
    """The band at ``fraction``, linearly interpolated; the first or last band outside their range."""
    if not bands:
        return None
    fr = [b.fraction for b in bands]
    if fraction <= fr[0]:
        return bands[0]
    if fraction >= fr[-1]:
        return bands[-1]
    # bisect_left is np.searchsorted's binary search (side "left") step for step, without building an array
    # (a prediction asks this ~3 times); numpy orders a NaN last and bisect does not, so a NaN keeps numpy
    j = bisect.bisect_left(fr, fraction) if fraction == fraction and all(f == f for f in fr) else int(
        np.searchsorted(np.array(fr), fraction))
    lo, hi = bands[j - 1], bands[j]
    w = (fraction - lo.fraction) / (hi.fraction - lo.fraction)
    mae = None
    if lo.fit_residual is not None and hi.fit_residual is not None:
        mae = lo.fit_residual + w * (hi.fit_residual - lo.fit_residual)
    return ErrorBand(
        fraction=float(fraction),
        n=min(lo.n, hi.n),
        bias=lo.bias + w * (hi.bias - lo.bias),
        scale=lo.scale + w * (hi.scale - lo.scale),
        max_abs=lo.max_abs + w * (hi.max_abs - lo.max_abs),
        fit_residual=mae,
    )


def _parse_bands(bands: Any, name: str, source: str) -> list[ErrorBand]:
    """The ErrorBands of JSON field ``name``; InputError naming ``source`` and the entry when malformed."""
    if not isinstance(bands, list):
        raise InputError(f"{source}: field {name!r} must be a list")
    parsed = []
    for i, e in enumerate(bands):
        try:
            mae = e.get("fit_residual")
            band = ErrorBand(fraction=float(e["fraction"]), n=int(e["n"]), bias=float(e["bias"]),
                             scale=float(e["scale"]), max_abs=float(e["max_abs"]),
                             fit_residual=None if mae is None else float(mae))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise InputError(f"{source}: {name}[{i}] is malformed ({err!r}); recalibrate") from None
        vals = (band.fraction, band.bias, band.scale, band.max_abs)
        if band.fit_residual is not None:
            vals += (band.fit_residual,)
        bad = band.n < 1 or band.scale < 0 or not 0 < band.fraction <= 1
        bad = bad or (band.fit_residual is not None and not 0 < band.fit_residual <= MAX_LOG_ERROR)
        if bad or not all(math.isfinite(v) for v in vals):
            raise InputError(f"{source}: {name}[{i}] has out-of-range values; recalibrate")
        for key in ("bias", "scale", "max_abs"):
            if abs(getattr(band, key)) > MAX_LOG_ERROR:
                raise InputError(f"{source}: field {name}[{i}].{key} is {getattr(band, key)!r}, beyond "
                                 f"{MAX_LOG_ERROR:g} (log units); recalibrate")
        parsed.append(band)
    return parsed


def _parse_trend(trend: Any, source: str) -> list[SizeTrend]:
    """The SizeTrends of JSON field ``size_trend``; InputError naming ``source`` and the bad field."""
    if not isinstance(trend, list):
        raise InputError(f"{source}: field 'size_trend' must be a list")
    out = []
    for i, e in enumerate(trend):
        where = f"{source}: field size_trend[{i}]"
        if not isinstance(e, dict):
            raise InputError(f"{where} must be an object")
        try:
            t = SizeTrend(
                fraction=float(e["fraction"]), kind=str(e["kind"]), n=int(e["n"]), k=int(e["k"]),
                xs=tuple(float(v) for v in e["xs"]), rs=tuple(float(v) for v in e["rs"]),
                counts=tuple(int(v) for v in e["counts"]), scale=float(e["scale"]),
                ext_error=float(e["ext_error"]), step=float(e["step"]), tests=int(e.get("tests", 2)),
            )
        except (KeyError, TypeError, ValueError, OverflowError) as err:
            raise InputError(f"{where} is malformed ({err!r}); recalibrate") from None
        bad = _trend_problem(t)
        if bad is not None:
            raise InputError(f"{where}.{bad} is out of range ({getattr(t, bad)!r}); recalibrate")
        out.append(t)
    return out


def _trend_problem(t: SizeTrend) -> str | None:
    """The name of the first out-of-range field of a SizeTrend, or None when it is valid."""
    nums = {"fraction": [t.fraction], "xs": t.xs, "rs": t.rs, "scale": [t.scale], "ext_error": [t.ext_error],
            "step": [t.step]}
    for name, vals in nums.items():
        if not all(math.isfinite(v) for v in vals):
            return name
    checks = (
        ("kind", t.kind in TREND_KINDS),
        ("fraction", 0 < t.fraction <= 1),
        ("n", t.n >= 2 and t.n == len(t.xs) and (t.kind == "widen" or t.n >= 3)),
        ("xs", len(t.xs) >= 2 and all(b > a for a, b in zip(t.xs, t.xs[1:])) and max(map(abs, t.xs)) < 1e3),
        ("rs", len(t.rs) == len(t.xs) and all(abs(v) <= MAX_LOG_ERROR for v in t.rs)),
        ("counts", len(t.counts) == len(t.xs) and all(c >= 1 for c in t.counts)),
        ("k", -1 <= t.k <= t.n),
        ("tests", t.tests >= 1),
        ("scale", 0 <= t.scale <= MAX_LOG_ERROR),
        ("ext_error", 0 <= t.ext_error <= MAX_LOG_ERROR),
        ("step", 0 < t.step < 1e3),
    )
    return next((name for name, ok in checks if not ok), None)


def _check_reference(ref: Any) -> dict[str, list[float]]:
    """The ``reference`` ranges, validated: a dict of REFERENCE_KEYS → [lo, hi] with 0 < lo <= hi < inf."""
    if not isinstance(ref, dict):
        raise InputError("surrogate: field 'reference' must be an object")
    out = {}
    for key, rng in ref.items():
        if key not in REFERENCE_KEYS:
            known = ", ".join(REFERENCE_KEYS)
            raise InputError(f"surrogate: field reference.{key} is unknown (known: {known})")
        ok = isinstance(rng, list | tuple) and len(rng) == 2
        ok = ok and all(not isinstance(v, bool) and isinstance(v, int | float) for v in rng)
        if not ok or not all(math.isfinite(v) for v in rng) or not 0 < rng[0] <= rng[1]:
            raise InputError(f"surrogate: field reference.{key} must be [lo, hi] with 0 < lo <= hi, "
                             f"got {rng!r}")
        out[key] = [float(rng[0]), float(rng[1])]
    return out
