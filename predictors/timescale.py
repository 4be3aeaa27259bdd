"""The AdamW timescale τ = B/(η λ D) and the helpers around it (METHOD.md §2).

Units: ``batch_tokens`` B and ``total_tokens`` D are in tokens, ``lr`` η is the peak LR actually applied to
the hidden weight matrices, ``weight_decay`` λ is AdamW's decoupled decay. τ is a fraction of the training
run.
"""

from __future__ import annotations

import math

from collapse_hpo.predictors.errors import InputError

# τ_opt = c · TPP^m, a log-log fit of the Celerity settings (0.175 @ 20, 0.087 @ 80, 0.051 @ 234 TPP).
TAU_OPT_COEFFICIENT = 0.785
TAU_OPT_EXPONENT = -0.5


def _positive(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError) as err:
        raise InputError(f"{name} must be a number, got {value!r}") from err
    if not math.isfinite(v) or v <= 0.0:
        raise InputError(f"{name} must be a positive finite number, got {value!r}")
    return v


def adamw_tau(batch_tokens: float, lr: float, weight_decay: float, total_tokens: float) -> float:
    """τ = B / (η λ D) as a fraction of training; ``math.inf`` when ``weight_decay`` is 0 (no decay)."""
    b = _positive("batch_tokens", batch_tokens)
    eta = _positive("lr", lr)
    d = _positive("total_tokens", total_tokens)
    lam = float(weight_decay)
    if not math.isfinite(lam) or lam < 0.0:
        raise InputError(f"weight_decay must be a non-negative finite number, got {weight_decay!r}")
    if lam == 0.0:
        return math.inf
    return b / (eta * lam * d)


def weight_decay_for_tau(batch_tokens: float, lr: float, tau: float, total_tokens: float) -> float:
    """λ = B / (η τ D): the AdamW weight decay that gives timescale ``tau`` (``tau`` = inf gives 0)."""
    b = _positive("batch_tokens", batch_tokens)
    eta = _positive("lr", lr)
    d = _positive("total_tokens", total_tokens)
    t = float(tau)
    if t == math.inf:
        return 0.0
    t = _positive("tau", t)
    return b / (eta * t * d)


def tokens_per_parameter(total_tokens: float, params: float) -> float:
    """TPP = D / N: training tokens per (non-embedding) parameter."""
    return _positive("total_tokens", total_tokens) / _positive("params", params)


def optimal_tau(
    tpp: float, coefficient: float = TAU_OPT_COEFFICIENT, exponent: float = TAU_OPT_EXPONENT
) -> float:
    """τ_opt(TPP) = coefficient · TPP^exponent (defaults: METHOD.md §2 fit of the Celerity settings)."""
    return _positive("coefficient", coefficient) * _positive("tpp", tpp) ** float(exponent)
