"""The parametric surrogate of the collapsed loss curve (paper Eq. 4–5, METHOD.md §3).

    raw(t̂) = ((1 + ε1) / (t̂ + ε1))^m  +  b · (η(t̂) + ε2)^q,      ℓ̂(t̂) = raw(t̂) / raw(1)

with b = b_c · τ^b_e (AdamW timescale τ) and q = q_c · TPP^q_e (tokens per parameter). When the reference set
had one τ only (or no weight decay), the τ law is the constant b = b_c (``tau_law == "constant"``); likewise
``tpp_law == "constant"`` gives q = q_c. A surrogate also carries how to align a partial curve onto ℓ̂
(``align``, ``align_start``) and the learned error model of final-loss predictions by training fraction.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.schedules import Schedule

FORMAT = "collapse-hpo-surrogate"
FORMAT_VERSION = 1
ALIGN_LOSSES = ("sq", "mae", "log")
LAWS = ("power", "constant")


@dataclass(frozen=True)
class ErrorBand:
    """How far final-loss predictions from the first ``fraction`` of reference curves missed.

    The residual is r = log(actual final loss / predicted final loss) over held-out reference curves; ``n``
    counts the independent units behind it (curve groups, e.g. sizes, since seeds of one group miss together;
    curves when the error model is in-sample). ``bias`` is the mean of r, ``scale`` its standard deviation
    (ddof = 1, floored), ``max_abs`` the largest |r|.
    """

    fraction: float
    n: int
    bias: float
    scale: float
    max_abs: float


@dataclass
class Surrogate:
    """The collapsed-curve model ℓ̂(t̂; schedule, τ, TPP) and how predictions use it.

    Attributes:
        b_c, b_e: b = b_c · τ^b_e (b = b_c when ``tau_law`` is "constant").
        q_c, q_e: q = q_c · TPP^q_e (q = q_c when ``tpp_law`` is "constant").
        eps1, eps2, m: the paper's fixed constants (0.001, 0.1, 0.05) unless calibration freed m.
        tau_law, tpp_law: "power" or "constant" (a degenerate reference set: single τ / no decay, single TPP).
        align: the early-align loss, "sq" (squared error, closed form), "mae" or "log".
        align_start: a prediction at fraction p aligns on the points with t̂ ≥ align_start · p.
        error_bands: learned prediction errors by fraction (sorted by fraction); empty when not calibrated.
        pair_bands: learned errors of the *difference* of two runs' predictions made at the same fraction
            (r = log(actual_A/actual_B) − log(predicted_A/predicted_B) over pairs of held-out runs of one
            fold; bias 0 by symmetry). A bias common to the runs of one sweep (the reference's size or data
            mismatch) cancels in the difference, so these are narrower than ``error_bands``; the pruner's
            paired comparison uses them. Empty when not calibrated or when no fold held two runs.
        info: free-form notes from calibration (fit region, weighting, fit MAE, ...), kept in the JSON.
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
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("b_c", "b_e", "q_c", "q_e", "eps1", "eps2", "m", "align_start"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise InputError(f"surrogate: field {name!r} must be a finite number, got {v!r}")
            setattr(self, name, float(v))
        if self.eps1 <= 0 or self.eps2 <= 0:
            raise InputError("surrogate: eps1 and eps2 must be positive")
        if self.tau_law not in LAWS or self.tpp_law not in LAWS:
            raise InputError(f"surrogate: tau_law and tpp_law must be one of {', '.join(LAWS)}")
        if self.align not in ALIGN_LOSSES:
            raise InputError(f"surrogate: align must be one of {', '.join(ALIGN_LOSSES)}, got {self.align!r}")
        if not 0.0 <= self.align_start < 1.0:
            raise InputError(f"surrogate: align_start must be in [0, 1), got {self.align_start}")
        self.error_bands = sorted(self.error_bands, key=lambda e: e.fraction)
        self.pair_bands = sorted(self.pair_bands, key=lambda e: e.fraction)

    # ------------------------------------------------------------------ the laws
    def b(self, tau: float | None) -> float:
        """b(τ). Raises InputError when the τ law is a power law and the run has no weight decay (τ None)."""
        if self.tau_law == "constant":
            return self.b_c
        if tau is None or not math.isfinite(tau):
            raise InputError("surrogate: b depends on τ (calibrated with weight decay) but this run has no "
                             "weight decay (tau empty); calibrate on runs without weight decay")
        if tau <= 0:
            raise InputError(f"surrogate: tau must be positive, got {tau}")
        return self.b_c * tau**self.b_e

    def q(self, tpp: float) -> float:
        """q(TPP)."""
        if self.tpp_law == "constant":
            return self.q_c
        if tpp is None or not math.isfinite(tpp) or tpp <= 0:
            raise InputError(f"surrogate: tpp must be a positive number, got {tpp}")
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
        self, t_hat: float | np.ndarray, schedule: Schedule, tau: float | None, tpp: float
    ) -> np.ndarray:
        """ℓ̂(t̂) = L(t̂)/L(1) predicted for a run with this schedule, τ (None: no decay) and TPP; 1 at t̂ = 1."""
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

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with the format name and version."""
        d = asdict(self)
        d["error_bands"] = [asdict(e) for e in self.error_bands]
        d["pair_bands"] = [asdict(e) for e in self.pair_bands]
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
        parsed = {
            name: _parse_bands(kwargs.pop(name, []), name, source) for name in ("error_bands", "pair_bands")
        }
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
        """Write the surrogate as JSON, atomically (temp file + os.replace)."""
        p = Path(path)
        text = json.dumps(self.to_dict(), indent=2, sort_keys=False, allow_nan=False)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=str(p.parent))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
            os.replace(tmp, p)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

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
        return cls.from_dict(d, source=str(p))


def _interpolate(bands: list[ErrorBand], fraction: float) -> ErrorBand | None:
    """The band at ``fraction``, linearly interpolated; the first or last band outside their range."""
    if not bands:
        return None
    fr = np.array([b.fraction for b in bands])
    if fraction <= fr[0]:
        return bands[0]
    if fraction >= fr[-1]:
        return bands[-1]
    j = int(np.searchsorted(fr, fraction))
    lo, hi = bands[j - 1], bands[j]
    w = (fraction - lo.fraction) / (hi.fraction - lo.fraction)
    return ErrorBand(
        fraction=float(fraction),
        n=min(lo.n, hi.n),
        bias=lo.bias + w * (hi.bias - lo.bias),
        scale=lo.scale + w * (hi.scale - lo.scale),
        max_abs=lo.max_abs + w * (hi.max_abs - lo.max_abs),
    )


def _parse_bands(bands: Any, name: str, source: str) -> list[ErrorBand]:
    """The ErrorBands of JSON field ``name``; InputError naming ``source`` and the entry when malformed."""
    if not isinstance(bands, list):
        raise InputError(f"{source}: field {name!r} must be a list")
    parsed = []
    for i, e in enumerate(bands):
        try:
            band = ErrorBand(fraction=float(e["fraction"]), n=int(e["n"]), bias=float(e["bias"]),
                             scale=float(e["scale"]), max_abs=float(e["max_abs"]))
        except (KeyError, TypeError, ValueError) as err:
            raise InputError(f"{source}: {name}[{i}] is malformed ({err!r}); recalibrate") from None
        vals = (band.fraction, band.bias, band.scale, band.max_abs)
        bad = band.n < 1 or band.scale < 0 or not 0 < band.fraction <= 1
        if bad or not all(math.isfinite(v) for v in vals):
            raise InputError(f"{source}: {name}[{i}] has out-of-range values; recalibrate")
        parsed.append(band)
    return parsed
