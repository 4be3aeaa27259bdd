"""Learning-rate schedules as functions of the training fraction t̂ = tokens seen / total tokens, peak 1.

One `Schedule` object serves both sides of the project: a trainer asks for the LR at a token count
(`Schedule.lr(tokens, total_tokens, peak_lr)`), and the surrogate asks for η(t̂)/η_peak (`schedule(t_hat)`).
Kinds:

- ``linear`` (the default): linear warmup from 0 to 1 over the first ``warmup`` fraction of tokens, then
  linear decay to ``final`` (0 by default) at t̂ = 1.
- ``cosine``: warmup, then a half cosine from 1 to ``final``.
- ``wsd``: warmup, stable at 1, then linear decay to ``final`` over the last ``decay`` fraction of tokens.
- ``constant``: warmup, then 1.
- ``data``: sampled points (t̂, lr/peak), linearly interpolated (held constant outside the sampled range).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from collapse_hpo.predictors.errors import InputError, clip, excerpt

KINDS = ("linear", "cosine", "wsd", "constant", "data")
#: Relative size (of the peak lr) of a negative lr sample read as 0: float32 rounding at the end of a decay
#: to zero (a linear decay logged in float32 ends at −4.8e-7 of a peak of 1).
LR_ROUNDING = 1e-6


#: ``Schedule.__call__`` memoizes 1-D arrays of at most this many points (a window of reports), at most
#: ``MEMO_SIZE`` of them per schedule (then it starts over).
MEMO_POINTS = 64
MEMO_SIZE = 256


@dataclass(frozen=True)
class Schedule:
    """An LR schedule shape over t̂ ∈ [0, 1], scaled to peak 1.

    Attributes:
        kind: one of ``linear``, ``cosine``, ``wsd``, ``constant``, ``data``.
        warmup: warmup length as a fraction of total tokens (0 ≤ warmup < 1).
        decay: for ``wsd``, the fraction of total tokens spent in the final decay (0 < decay ≤ 1 − warmup).
        final: LR at t̂ = 1 as a fraction of the peak (0 ≤ final ≤ 1).
        points: for ``data``, tuples (t̂, lr/peak) sorted by t̂; empty for the other kinds.
    """

    kind: str = "linear"
    warmup: float = 0.0
    decay: float = 0.2
    final: float = 0.0
    points: tuple[tuple[float, float], ...] = ()
    _x: np.ndarray | None = field(default=None, init=False, repr=False, compare=False, hash=False)
    _y: np.ndarray | None = field(default=None, init=False, repr=False, compare=False, hash=False)
    _end: float | None = field(default=None, init=False, repr=False, compare=False, hash=False)
    # η/η_peak at short arrays of t̂ asked before (``__call__``), by their bytes: a pruner reads a competitor's
    # LR over the same report points for every trial judged at a fraction (BENCHMARKS §37)
    _memo: dict[bytes, np.ndarray] | None = field(default=None, init=False, repr=False, compare=False,
                                                   hash=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"schedule: unknown kind {excerpt(self.kind)}; use one of {', '.join(KINDS)}")
        for name in ("warmup", "decay", "final"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value):
                raise InputError(f"schedule: field {name!r} must be a finite number, got {excerpt(value)}")
        if not 0.0 <= self.warmup < 1.0:
            raise InputError(f"schedule: warmup must be a fraction of tokens in [0, 1), got {self.warmup}")
        if not 0.0 <= self.final <= 1.0:
            raise InputError(f"schedule: final must be in [0, 1] (end LR / peak), got {self.final}")
        if self.kind == "wsd" and not 0.0 < self.decay <= 1.0 - self.warmup:
            raise InputError(
                f"schedule: wsd decay must be in (0, 1 - warmup] = (0, {1 - self.warmup:g}], got {self.decay}"
            )
        if self.kind == "data":
            if len(self.points) < 1:
                raise InputError("schedule: kind 'data' needs at least one (t_hat, lr) point")
            arr = np.asarray(self.points, dtype=float)
            if arr.ndim != 2 or arr.shape[1] != 2 or not np.all(np.isfinite(arr)):
                raise InputError("schedule: data points must be finite (t_hat, lr/peak) pairs")
            if np.any(np.diff(arr[:, 0]) < 0):
                raise InputError("schedule: data points must be sorted by t_hat")
            object.__setattr__(self, "_x", arr[:, 0].copy())
            object.__setattr__(self, "_y", arr[:, 1].copy())
        elif self.points:
            raise InputError(f"schedule: points are only used by kind 'data', not {excerpt(self.kind)}")

    # ------------------------------------------------------------------ evaluation
    def __call__(self, t_hat: float | np.ndarray) -> float | np.ndarray:
        """η(t̂)/η_peak in [0, 1] at the training fraction(s) ``t_hat`` (clipped to [0, 1]); an array in, a
        new array out (a 1-D one of at most ``MEMO_POINTS`` points is read from the memo of earlier calls)."""
        if np.ndim(t_hat) == 0:
            return float(self._at(np.asarray(t_hat, dtype=float).clip(0.0, 1.0)))
        arr = np.asarray(t_hat, dtype=float)
        if arr.ndim != 1 or arr.size > MEMO_POINTS:
            return self._at(arr.clip(0.0, 1.0))
        key = arr.tobytes()
        memo = getattr(self, "_memo", None)  # absent in a schedule pickled before the memo existed
        if memo is None:
            memo = {}
            object.__setattr__(self, "_memo", memo)
        hit = memo.get(key)
        if hit is None:
            hit = self._at(arr.clip(0.0, 1.0))
            if len(memo) >= MEMO_SIZE:
                memo.clear()
            memo[key] = hit
        return hit.copy()

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without its memo (a schedule sent to a worker process or a Ray actor stays small)."""
        return {**self.__dict__, "_memo": None}

    def _at(self, t: np.ndarray) -> np.ndarray:
        """η(t̂)/η_peak at ``t`` (within [0, 1])."""
        if self.kind == "data":
            assert self._x is not None and self._y is not None
            return np.interp(t, self._x, self._y)
        return self._shape(t)

    def end(self) -> float:
        """η(1)/η_peak: ``self(1.0)``, computed once per schedule (every prediction divides by it)."""
        if self._end is None:
            object.__setattr__(self, "_end", float(self(1.0)))
        assert self._end is not None
        return self._end

    def _shape(self, t: np.ndarray) -> np.ndarray:
        w, f = self.warmup, self.final
        if self.kind == "constant":
            main = np.ones_like(t)
        elif self.kind == "linear":
            span = 1.0 - w
            main = 1.0 - (1.0 - f) * np.clip((t - w) / span, 0.0, 1.0)
        elif self.kind == "cosine":
            span = 1.0 - w
            x = np.clip((t - w) / span, 0.0, 1.0)
            main = f + (1.0 - f) * 0.5 * (1.0 + np.cos(np.pi * x))
        else:  # wsd
            start = 1.0 - self.decay
            main = 1.0 - (1.0 - f) * np.clip((t - start) / self.decay, 0.0, 1.0)
        if w > 0.0:
            main = np.where(t < w, t / w, main)
        return main

    def lr(self, tokens: float, total_tokens: float, peak_lr: float) -> float:
        """LR to apply after ``tokens`` tokens of a run of ``total_tokens`` tokens with peak LR ``peak_lr``.

        During warmup the LR is 0 at tokens = 0; a trainer that wants a non-zero first step passes the token
        count at the end of the step.
        """
        if total_tokens <= 0:
            raise InputError(f"schedule: total_tokens must be positive, got {total_tokens}")
        return float(peak_lr) * float(self(float(tokens) / float(total_tokens)))

    # ------------------------------------------------------------------ construction and serialization
    @classmethod
    def from_data(cls, t_hat: np.ndarray | list[float], lr: np.ndarray | list[float]) -> Schedule:
        """A ``data`` schedule from sampled LRs (any units): lr/max(lr) over t̂, interpolated.

        Non-finite samples are dropped; repeated t̂ keep their last sample. A sample below zero by less
        than `LR_ROUNDING` of the peak is float rounding of a decay to zero and is read as 0. Raises
        InputError when no positive finite LR remains, or for a clearly negative one.
        """
        t = np.asarray(t_hat, dtype=float).ravel()
        y = np.asarray(lr, dtype=float).ravel()
        if t.shape != y.shape:
            raise InputError(f"schedule: t_hat and lr have different lengths ({t.size} and {y.size})")
        ok = np.isfinite(t) & np.isfinite(y)
        t, y = t[ok], y[ok]
        if t.size == 0 or np.max(y) <= 0.0:
            raise InputError("schedule: no positive finite lr values to build a schedule from")
        y = np.where((y < 0) & (y >= -LR_ROUNDING * np.max(y)), 0.0, y)
        if np.any(y < 0):
            raise InputError(f"schedule: lr values must be non-negative, got {float(np.min(y)):g} (only "
                             f"values within {LR_ROUNDING:g} of the peak below zero are read as 0)")
        order = np.argsort(t, kind="stable")
        t, y = t[order], y[order]
        # Keep the last sample of each repeated t̂.
        keep = np.append(t[1:] != t[:-1], True)
        t, y = t[keep], y[keep] / np.max(y)
        return cls(kind="data", points=tuple(zip(t.tolist(), y.tolist())))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; ``Schedule.from_dict`` inverts it."""
        d: dict[str, Any] = {"kind": self.kind, "warmup": self.warmup, "final": self.final}
        if self.kind == "wsd":
            d["decay"] = self.decay
        if self.kind == "data":
            d["points"] = [list(p) for p in self.points]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Schedule:
        """Build from a dict with ``kind`` and optional ``warmup``, ``decay``, ``final``, ``points``."""
        if not isinstance(d, dict):
            raise InputError(f"schedule: expected a mapping, got {type(d).__name__}")
        unknown = set(d) - {"kind", "warmup", "decay", "final", "points"}
        if unknown:
            raise InputError(
                f"schedule: unknown field(s) {clip(', '.join(sorted(map(str, unknown))), 200)}; "
                "use kind, warmup, decay, final, points"
            )
        kwargs: dict[str, Any] = {"kind": d.get("kind", "linear")}
        for name in ("warmup", "decay", "final"):
            if name in d:
                value = d[name]
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise InputError(f"schedule: field {name!r} must be a number, got {excerpt(value)}")
                kwargs[name] = float(value)
        if "points" in d:
            try:
                kwargs["points"] = tuple((float(a), float(b)) for a, b in d["points"])
            except (TypeError, ValueError) as err:
                raise InputError("schedule: points must be a list of [t_hat, lr/peak] pairs") from err
        return cls(**kwargs)

    @classmethod
    def parse(cls, spec: str | dict[str, Any] | Schedule | None) -> Schedule:
        """A schedule from a kind name (``"linear"``, ``"cosine"``, ...), a dict, a Schedule, or None."""
        if spec is None:
            return cls()
        if isinstance(spec, Schedule):
            return spec
        if isinstance(spec, str):
            kind = spec.strip().lower()
            if kind == "data":
                raise InputError("schedule: kind 'data' needs points; give a dict with 'points'")
            return cls(kind=kind)
        return cls.from_dict(spec)


#: Schedules are compared as functions of t̂ on this grid (steps of 0.005).
GRID = np.linspace(0.0, 1.0, 201)
#: ``warmup_end``: the LR counts as at its peak from this share of it on (a schedule read from logged LRs
#: may never reach its nominal peak exactly).
WARMUP_PEAK = 0.99


@lru_cache(maxsize=1 << 14)  # exact: Schedules are frozen and hashed by their fields
def on_grid(schedule: Schedule) -> np.ndarray:
    """The schedule on ``GRID`` (read-only; computed once per schedule)."""
    out = np.asarray(schedule(GRID), dtype=float)
    out.setflags(write=False)
    return out


@lru_cache(maxsize=1 << 14)
def warmup_end(schedule: Schedule) -> float:
    """The end of a schedule's warm-up: the first t̂ where the LR reaches ``WARMUP_PEAK`` of its peak (0 for
    a schedule that starts at its peak), on ``GRID`` (steps of 0.005)."""
    lr = on_grid(schedule)
    peak = float(np.max(lr))
    if peak <= 0:
        return 0.0
    return float(GRID[int(np.argmax(lr >= WARMUP_PEAK * peak))])


@lru_cache(maxsize=1 << 16)
def decay_distance(a: Schedule, b: Schedule) -> float:
    """How far two schedules' decays differ, their warm-ups aside: the mean |a(t̂) − b(t̂)| (units of the peak
    LR) over the ``GRID`` points past both warm-ups; 0 for equal schedules. From a 5% warm-up: linear and
    cosine decay lie 0.068 apart, a linear decay and a WSD decay over the last 20% 0.39, a linear decay and a
    constant LR 0.5; linear decays after warm-ups of 5% and 10%, 0.026."""
    if a == b:
        return 0.0
    past = max(warmup_end(a), warmup_end(b)) - 1e-12 <= GRID
    return float(np.mean(np.abs(on_grid(a)[past] - on_grid(b)[past])))
