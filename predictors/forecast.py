"""Forecast a whole run before training: L(t̂) = L(1) · ℓ̂(t̂), with L(1) from the reference family's law.

The surrogate's unnormalized curve is raw(t̂) = ((1+ε1)/(t̂+ε1))^m + b(τ)·(η(t̂)+ε2)^q(TPP) (METHOD.md §3), and
ℓ̂ = raw/raw(1). Runs that differ only in their schedule share the early part of their curves, so their final
losses differ by the ratio of their raw(1). The law is therefore fitted on L(1)/raw(1) of the reference runs
(one law serves every schedule shape) and a forecast is

    L(1) = law(N, D) · raw(1; schedule, τ, D/N),        L(t̂) = L(1) · ℓ̂(t̂; schedule, τ, D/N),

with the law's bootstrap prediction interval on L(1) carried along the curve (low · ℓ̂, high · ℓ̂). The band is
the uncertainty of L(1) only: the surrogate's shape error at a new size (0.3–1.3% of L(1) on held-out sizes,
BENCHMARKS.md §7) is not in it, so before t̂ = 1 the band can be narrower than the real miss.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from collapse_hpo.predictors.curves import Curve
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.scaling_law import N_BOOT, ScalingLaw, fit_scaling_law
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import EXTRAPOLATION_SLACK, Surrogate, beyond_reference

T_HAT_GRID = np.linspace(0.01, 1.0, 100)


def raw_end(surrogate: Surrogate, schedule: Schedule, tau: float | None, tpp: float | None) -> float:
    """raw(1) = 1 + b(τ)·(η(1) + ε2)^q(TPP): the surrogate's unnormalized end value for these controls (TPP
    None: not defined, for a surrogate with a constant q)."""
    eta1 = float(schedule(1.0))
    return 1.0 + surrogate.b(tau) * (eta1 + surrogate.eps2) ** surrogate.q(tpp)


def _unused_tau(surrogate: Surrogate, tau: float | None) -> str | None:
    """A note when the forecast's τ differs from the references' but cannot change the forecast: a surrogate
    calibrated on a single τ (or without weight decay) has a constant b, so every τ gives the same curve."""
    if surrogate.tau_law != "constant" or tau is None:
        return None
    rng = surrogate.reference.get("tau")
    if rng is not None and rng[0] * (1 - EXTRAPOLATION_SLACK) <= tau <= rng[1] * (1 + EXTRAPOLATION_SLACK):
        return None
    seen = "without weight decay" if rng is None else f"at tau {rng[0]:.4g}-{rng[1]:.4g}"
    return (f"tau {tau:.4g} does not change this forecast: the surrogate was calibrated {seen}, so its "
            "b(tau) is a constant; calibrate on references with several tau to forecast the effect of tau")


def reference_params(curves: Sequence[Curve], params: Sequence[float] | Mapping[str, float]) -> np.ndarray:
    """Model size N (parameters) of each curve, from a list in curve order or a mapping run name -> N."""
    if isinstance(params, Mapping):
        missing = [c.run for c in curves if c.run not in params]
        if missing:
            raise InputError(f"calibrate: no model size (params) for run(s) {', '.join(missing[:5])}")
        values = [params[c.run] for c in curves]
    else:
        values = list(params)
        if len(values) != len(curves):
            raise InputError(f"calibrate: params has {len(values)} sizes for {len(curves)} curves")
    try:
        arr = np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise InputError("calibrate: params must be numbers (model sizes in parameters)") from None
    if not (np.all(np.isfinite(arr)) and np.all(arr > 0)):
        raise InputError("calibrate: every model size (params) must be a positive number of parameters")
    return arr


def reference_law(
    surrogate: Surrogate,
    curves: Sequence[Curve],
    params: Sequence[float] | Mapping[str, float],
    *,
    alpha: float | None = None,
    n_boot: int = N_BOOT,
) -> tuple[ScalingLaw | None, str]:
    """Fit the law on the reference curves' L(1)/raw(1); D = TPP · N tokens per run.

    Returns (law, note); the law is None when it cannot be fitted (too few sizes, or runs whose TPP is not
    defined: without it a run has no D), and the note says why and what to give.
    """
    N = reference_params(curves, params)
    undefined = [c.run for c in curves if c.tpp is None]
    if undefined:
        runs = ", ".join(undefined[:5]) + (", ..." if len(undefined) > 5 else "")
        return None, (
            f"no scaling law: tpp not defined for {len(undefined)} run(s) ({runs}); the law L(N, D) needs "
            "each run's training tokens D = tpp * N: give tpp (training tokens / params) to fit it; "
            "`forecast` cannot be used"
        )
    D = np.array([c.tpp for c in curves], dtype=float) * N
    y = np.array([c.final_loss / raw_end(surrogate, c.schedule, c.tau, c.tpp) for c in curves])
    try:
        law = fit_scaling_law(N, D, y, alpha=alpha, target="final_over_raw1", n_boot=n_boot)
    except InputError as err:
        return None, f"no scaling law ({str(err).removeprefix('scaling law: ')}): `forecast` cannot be used"
    return law, law.describe()


@dataclass(frozen=True)
class Forecast:
    """A forecast of one run before training (losses in the reference curves' units).

    Attributes:
        params, tokens: N (parameters) and D (tokens); tpp = D/N.
        tau: AdamW timescale (None: no weight decay).
        confidence: of the interval low..high.
        final_loss, low, high: L(1) and its prediction interval.
        t_hat: fractions of training tokens; loss, loss_low, loss_high: L(t̂) and its band.
        notes: what the forecast assumed or extrapolated.
    """

    params: float
    tokens: float
    tpp: float
    tau: float | None
    schedule: Schedule
    confidence: float
    final_loss: float
    low: float
    high: float
    t_hat: np.ndarray
    loss: np.ndarray
    loss_low: np.ndarray
    loss_high: np.ndarray
    notes: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The final loss and its interval as a JSON-ready dict (what `forecast --json` prints)."""
        return {
            "final_loss": self.final_loss,
            "low": self.low,
            "high": self.high,
            "confidence": self.confidence,
            "params": self.params,
            "tokens": self.tokens,
            "tpp": self.tpp,
            "tau": self.tau,
            "schedule": self.schedule.kind,
            "notes": list(self.notes),
        }

    def curve(self) -> Curve:
        """The forecast as a Curve (run "forecast"; lr = η(t̂), peak 1), e.g. for `write_curves_csv`."""
        return Curve(
            run="forecast",
            t_hat=self.t_hat,
            loss=self.loss,
            lr=np.asarray(self.schedule(self.t_hat), dtype=float),
            schedule=self.schedule,
            tau=self.tau,
            tpp=self.tpp,
        )


def forecast(
    surrogate: Surrogate,
    params: float,
    tokens: float,
    *,
    schedule: Schedule | str | None = None,
    tau: float | None = None,
    confidence: float = 0.9,
    t_hat: Sequence[float] | np.ndarray | None = None,
) -> Forecast:
    """Forecast the loss curve of a run of ``params`` parameters trained on ``tokens`` tokens.

    Args:
        surrogate: a calibrated surrogate with a ``scaling_law`` (calibrate with model sizes, ≥ 3 sizes).
        params: model size N (parameters); tokens: training length D (tokens).
        schedule: LR schedule shape (a Schedule or a kind name; default linear decay to zero).
        tau: AdamW timescale B/(ηλD); None for no weight decay (a surrogate with a τ law needs one).
        confidence: of the final-loss interval and the band.
        t_hat: where to evaluate the curve (default 100 points from 0.01 to 1).

    Raises InputError when the surrogate has no law, or an input is out of range.
    """
    law = surrogate.scaling_law
    if law is None:
        raise InputError(
            "the surrogate has no scaling law; calibrate it with model sizes (a params column, 3 or more "
            "sizes) and each run's tpp (the law needs training tokens D = tpp * N; a run whose tpp is empty "
            "has none) to forecast"
        )
    for name, v in (("params", params), ("tokens", tokens)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
            raise InputError(f"{name} must be a positive number, got {v!r}")
    if tau is not None and not (math.isfinite(tau) and tau > 0):
        raise InputError(f"tau must be a positive number (or none for no weight decay), got {tau!r}")
    if not 0.0 < confidence < 1.0:
        raise InputError(f"confidence must be in (0, 1), got {confidence}")
    sched = Schedule.parse(schedule)
    tpp = float(tokens) / float(params)
    ranges = {"params": law.n_range, "tpp": law.tpp_range, "tau": surrogate.reference.get("tau")}
    too_far = beyond_reference(ranges, {"params": float(params), "tpp": tpp, "tau": tau})
    if too_far is not None:
        raise InputError(f"cannot forecast: {too_far}")
    notes = []
    n_lo, n_hi = law.n_range
    if not n_lo <= params <= n_hi:
        notes.append(
            f"N = {params:.4g} is outside the reference sizes {n_lo:.4g} to {n_hi:.4g}: the law extrapolates"
        )
    if law.extrapolation_error is None:
        notes.append(
            f"the law was fitted on {law.n_sizes} sizes, too few to check it on a held-out size: the "
            "interval is the fit's scatter only and can be far too narrow (BENCHMARKS.md §7)"
        )
    t_lo, t_hi = law.tpp_range
    if law.kind == "full" and not t_lo <= tpp <= t_hi:
        notes.append(f"TPP {tpp:.4g} is outside the reference TPPs {t_lo:.4g} to {t_hi:.4g}: the law "
                     "extrapolates")
    tau_note = _unused_tau(surrogate, tau)
    if tau_note is not None:
        notes.append(tau_note)
    scale = raw_end(surrogate, sched, tau, tpp) if law.target == "final_over_raw1" else 1.0
    final = law.predict(params, tokens) * scale
    lo, hi = law.interval(params, tokens, confidence)
    lo, hi = min(lo * scale, final), max(hi * scale, final)
    t = T_HAT_GRID if t_hat is None else np.asarray(t_hat, dtype=float)
    if t.ndim != 1 or t.size == 0 or not np.all((t > 0) & (t <= 1)):
        raise InputError("t_hat must be fractions of training tokens in (0, 1]")
    shape = surrogate.normalized(t, sched, tau, tpp)
    values = np.concatenate([[final, lo, hi], final * shape, lo * shape, hi * shape])
    if not (np.all(np.isfinite(values)) and np.all(values > 0)):
        raise InputError(f"the forecast for N = {params:.4g}, D = {tokens:.4g} is not a finite positive loss "
                         "(the law or the surrogate cannot be evaluated there); nothing written")
    return Forecast(
        params=float(params),
        tokens=float(tokens),
        tpp=tpp,
        tau=tau,
        schedule=sched,
        confidence=confidence,
        final_loss=final,
        low=lo,
        high=hi,
        t_hat=t,
        loss=final * shape,
        loss_low=lo * shape,
        loss_high=hi * shape,
        notes=notes,
    )

