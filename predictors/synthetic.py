"""Synthetic loss curves with known ground truth, for tests and benchmarks.

Two generators:

- `synthetic_curves`: curves drawn from a known `Surrogate` (``TRUE_SURROGATE`` by default) times a final
  loss, with multiplicative Gaussian noise. Calibration on them should recover the surrogate's constants.
- `nqm_curve`: the noisy quadratic model of METHOD.md §5 (the paper's App. B), integrated exactly over t̂:
  a sum of quadratic modes whose weights are an EMA of noisy updates with timescale τ/η(t̂), plus an
  irreducible loss. Its shape depends on τ and the schedule, and a decaying LR gives the late drop of a
  decay-to-zero curve.

Every curve carries its truth in ``curve.meta``: ``true_final_loss`` (noise-free L(1)) and the generating
parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from collapse_hpo.predictors.curves import Curve
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import Surrogate

# The ground truth used by default: plausible magnitudes (ℓ̂(0.2) ≈ 1.1–1.3 on linear decay to zero).
TRUE_SURROGATE = Surrogate(b_c=0.5, b_e=0.3, q_c=1.0, q_e=0.1)


def synthetic_curves(
    surrogate: Surrogate | None = None,
    *,
    taus: Sequence[float | None] = (0.05, 0.1, 0.2),
    tpps: Sequence[float | None] = (20.0, 80.0),
    schedule: Schedule | None = None,
    n_points: int = 200,
    t_start: float = 0.01,
    noise: float = 0.002,
    final_loss: float = 3.0,
    seeds: int = 1,
    seed: int = 0,
) -> list[Curve]:
    """Curves L(t̂) = final_loss · ℓ̂(t̂; schedule, τ, TPP) · (1 + noise · N(0, 1)), one per (τ, TPP, seed).

    Args:
        surrogate: the truth (default ``TRUE_SURROGATE``).
        taus: AdamW timescales (None: no weight decay, needs a constant τ law).
        tpps: tokens per parameter (None: not defined, e.g. fine-tuning; needs a constant TPP law).
        schedule: LR schedule shape (default linear decay to zero).
        n_points: points per curve, evenly spaced in t̂ over [t_start, 1].
        noise: relative std of the multiplicative noise on each point (the final point included).
        final_loss: noise-free L(1) (varied by ±10% across runs so that scale is not shared).
        seeds: noise draws per (τ, TPP).
        seed: random seed.
    """
    truth = surrogate or TRUE_SURROGATE
    sched = schedule or Schedule()
    rng = np.random.default_rng(seed)
    t = np.linspace(t_start, 1.0, n_points)
    eta = np.asarray(sched(t), dtype=float)
    curves = []
    for tau in taus:
        for tpp in tpps:
            shape = truth.normalized(t, sched, tau, tpp)
            for s in range(seeds):
                lf = final_loss * float(rng.uniform(0.9, 1.1))
                loss = lf * shape * (1.0 + noise * rng.standard_normal(n_points))
                name = f"tau{tau}_tpp{'none' if tpp is None else format(tpp, 'g')}_s{s}"
                curves.append(Curve(run=name, t_hat=t.copy(), loss=loss, lr=eta.copy(), schedule=sched,
                                    tau=tau, tpp=None if tpp is None else float(tpp),
                                    meta={"true_final_loss": lf, "seed": s, "generator": "surrogate"}))
    return curves


def nqm_curve(
    tau: float | None,
    *,
    schedule: Schedule | None = None,
    tpp: float = 20.0,
    n_points: int = 400,
    n_modes: int = 32,
    irreducible: float = 2.0,
    noise: float = 0.0,
    seed: int = 0,
    run: str | None = None,
    substeps: int = 20,
) -> Curve:
    """A noisy-quadratic-model curve (METHOD.md §5) over t̂ ∈ (0, 1].

    Mode k has curvature h_k (a power-law spectrum) and variance v_k. Over normalized time t̂ the weights are
    an EMA with rate η(t̂)·(a_k + 1/τ), a_k ∝ h_k · TPP the mode's own learning speed, driven by gradient noise
    of strength η(t̂)²·s_k (s_k ∝ h_k); so dv_k/dt̂ = −2η(a_k + 1/τ) v_k + η² s_k, integrated exactly for
    piecewise-constant η.
    L(t̂) = irreducible + Σ h_k v_k / 2, times (1 + noise · N(0, 1)) per point. ``meta['true_final_loss']`` is
    the noise-free L(1).
    """
    sched = schedule or Schedule()
    rng = np.random.default_rng(seed)
    k = np.arange(1, n_modes + 1, dtype=float)
    h = k ** -1.5
    a = 30.0 * h * tpp / 20.0
    s = 100.0 * h
    v = np.ones(n_modes) * 4.0 / n_modes / h  # initial loss Σ h v/2 = 2 above the irreducible
    inv_tau = 0.0 if tau is None or not math.isfinite(tau) else 1.0 / tau
    grid = np.linspace(0.0, 1.0, n_points * substeps + 1)
    out_t = grid[substeps::substeps]
    out = np.empty(out_t.size)
    etas = np.asarray(sched(0.5 * (grid[1:] + grid[:-1])), dtype=float)[:, None]
    dt = np.diff(grid)[:, None]
    rate = 2.0 * etas * (a + inv_tau)
    # a_k > 0, so rate > 0 unless η = 0, where nothing is injected and v stays put (v_inf = 0, decay 1).
    v_inf = np.where(rate > 0, etas * etas * s / np.where(rate > 0, rate, 1.0), 0.0)
    decay = np.exp(-rate * dt)
    for i in range(grid.size - 1):
        v = v_inf[i] + (v - v_inf[i]) * decay[i]
        if (i + 1) % substeps == 0:
            out[(i + 1) // substeps - 1] = irreducible + 0.5 * float(np.dot(h, v))
    true_final = float(out[-1])
    loss = out * (1.0 + noise * rng.standard_normal(out.size))
    name = run or f"nqm_tau{tau}_tpp{tpp:g}"
    return Curve(run=name, t_hat=out_t, loss=loss, lr=np.asarray(sched(out_t), dtype=float), schedule=sched,
                 tau=None if tau is None or not math.isfinite(tau) else float(tau), tpp=float(tpp),
                 meta={"true_final_loss": true_final, "seed": seed, "generator": "nqm"})
