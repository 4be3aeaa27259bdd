"""The AdamW timescale τ = B/(η λ D) and the helpers around it (METHOD.md §2).

Units: ``batch_tokens`` B and ``total_tokens`` D are in tokens, ``lr`` η is the peak LR actually applied to
the hidden weight matrices, ``weight_decay`` λ is AdamW's decoupled decay. τ is a fraction of the training
run. A run counted in optimizer steps S (every step one batch: D = B·S) has τ = B/(ηλ·B·S) = 1/(η·λ·S)
(``step_tau``), which needs no token count: the form for a Hugging Face or Lightning run, or any model that
is no LLM.
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
    denominator = eta * lam * d
    tau = b / denominator if denominator > 0.0 else math.inf
    if not (math.isfinite(tau) and tau > 0.0):  # 1e-300 * 1e-300 is 0; 1e300 / 1e-300 is inf
        raise InputError(f"tau = B/(eta lambda D) = {b:g}/({eta:g} * {lam:g} * {d:g}) is not a representable "
                         "positive number; check batch_tokens, lr, weight_decay and the training tokens")
    return tau


def step_tau(lr: float, weight_decay: float, steps: float) -> float:
    """τ = 1 / (η λ S) for a run of ``steps`` optimizer steps S (B/D = 1/S); ``math.inf`` when
    ``weight_decay`` is 0 (no decay). The same τ as ``adamw_tau`` when every step sees B tokens."""
    return adamw_tau(1.0, lr, weight_decay, _positive("steps", steps))


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


def no_decay_tau(tau: object) -> object:
    """``tau`` with the legacy "no weight decay" encodings (``inf``, ``"inf"``) turned into None, the one
    encoding of "no weight decay" at every boundary; any other value is returned as is (for the caller's
    validation)."""
    if isinstance(tau, str) and tau.strip().lower() == "inf":
        return None
    if isinstance(tau, float) and math.isinf(tau) and tau > 0:
        return None
    return tau


def check_one_decay(
    tau_given: bool, weight_decay_given: bool, *, where: str = "", tau: str = "tau",
    weight_decay: str = "weight_decay",
) -> None:
    """Refuse a held τ and a weight decay λ given together: λ is derived from τ (``derive_decay``), so only
    one of them may be given. The one refusal of every boundary that takes both (the sweep file and its
    search space, ``TrainConfig``, ``derive_decay``, the ``train`` and ``forecast`` commands).

    Args:
        tau_given, weight_decay_given: whether each was given (the caller says what "given" means there).
        where: what the message starts with (e.g. "search space"); "" = nothing.
        tau, weight_decay: the names the user wrote them with (e.g. "--tau", "--weight-decay").

    Raises:
        InputError: "<where>: <tau> and <weight_decay> are both set; give one of them, not both (the weight
            decay λ is derived from τ)" when both were given.
    """
    if tau_given and weight_decay_given:
        prefix = f"{where}: " if where else ""
        raise InputError(f"{prefix}{tau} and {weight_decay} are both set; give one of them, not both (the "
                         "weight decay λ is derived from τ)")


def derive_decay(
    batch_tokens: float,
    lr: float,
    total_tokens: float,
    *,
    tau: float | None = None,
    weight_decay: float | None = None,
) -> tuple[float, float | None]:
    """The run's AdamW decay: (λ, τ), the one place λ is derived from a held τ.

    With ``tau`` (held): λ = B / (η τ D). With ``weight_decay``: τ = B / (η λ D). Neither, or λ = 0: no weight
    decay, returned as (0.0, None). Units: B and D in tokens, η the peak LR of the hidden matrices; D must be
    the tokens the run actually trains (after any rounding to whole steps). Raises InputError when both are
    given or a value is out of range.
    """
    check_one_decay(tau is not None, weight_decay is not None)
    if tau is not None:
        t = _positive("tau", tau)
        return weight_decay_for_tau(batch_tokens, lr, t, total_tokens), t
    lam = 0.0 if weight_decay is None else float(weight_decay)
    t_ = adamw_tau(batch_tokens, lr, lam, total_tokens)
    return lam, None if math.isinf(t_) else t_
