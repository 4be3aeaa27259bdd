"""AdamW with CompleteP parameter groups, and the LR schedule applied per optimizer step.

Groups (METHOD.md §7; η = ``TrainConfig.lr``, λ = the hidden matrices' weight decay, m_N, m_L multipliers):

==========  ======================================  ============  ============  ===============
group       parameters                              peak LR       weight decay  Adam ε
==========  ======================================  ============  ============  ===============
hidden      attention and MLP matrices              η             λ             ε/(m_N·m_L)
embedding   token embedding, unembedding            η·m_N         λ/m_N         ε
no_decay    LayerNorm gains and biases              η·m_N         0             ε
==========  ======================================  ============  ============  ===============

Every decayed group has the same η·λ, so τ = B/(ηλD) describes all of them. PyTorch's AdamW decays by
lr·weight_decay per step with the group's *scheduled* LR, as the τ definition assumes.

The LR of optimizer step k (0-based) is the schedule at the middle of the step's tokens,
``schedule.lr(k·B + B/2, D, peak)``: it is never 0 in the first warmup step or at the very end of a decay to
zero, and it is the same for every batch size at the same t̂.
"""

from __future__ import annotations

import torch

from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.trainers.config import Plan, TrainConfig
from collapse_hpo.trainers.model import GPT

#: (lr multiplier relative to η, weight-decay multiplier relative to λ, ε multiplier) as functions of m_N,
# m_L.
GROUP_ORDER = ("hidden", "embedding", "no_decay")


def group_multipliers(m_n: float, m_l: float) -> dict[str, dict[str, float]]:
    """Per-group multipliers of the peak LR η, the hidden weight decay λ and the base Adam ε."""
    return {
        "hidden": {"lr": 1.0, "weight_decay": 1.0, "eps": 1.0 / (m_n * m_l)},
        "embedding": {"lr": m_n, "weight_decay": 1.0 / m_n, "eps": 1.0},
        "no_decay": {"lr": m_n, "weight_decay": 0.0, "eps": 1.0},
    }


def build_optimizer(model: GPT, config: TrainConfig, plan: Plan) -> torch.optim.AdamW:
    """AdamW over the model's CompleteP groups (see the module table). Each group keeps its multipliers in
    ``group["lr_multiplier"]`` so `set_lr` can apply the schedule."""
    mult = group_multipliers(plan.m_n, plan.m_l)
    params = model.parameter_groups()
    groups = []
    for name in GROUP_ORDER:
        if not params[name]:
            continue
        m = mult[name]
        groups.append(
            {
                "name": name,
                "params": params[name],
                "lr": config.lr * m["lr"],
                "lr_multiplier": m["lr"],
                "weight_decay": plan.weight_decay * m["weight_decay"],
                "eps": config.adam_eps * m["eps"],
            }
        )
    kwargs = {"betas": (config.adam_beta1, config.adam_beta2)}
    if config.device.startswith("cuda"):
        kwargs["fused"] = True
    else:
        kwargs["foreach"] = True
    return torch.optim.AdamW(groups, **kwargs)


def step_lr(schedule: Schedule, step: int, batch_tokens: int, total_tokens: int, peak_lr: float) -> float:
    """LR of optimizer step ``step`` (0-based): the schedule at the step's middle token, k·B + B/2."""
    return schedule.lr(step * batch_tokens + batch_tokens / 2, total_tokens, peak_lr)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every group's LR to ``lr`` (the hidden matrices' LR) times the group's multiplier."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_multiplier"]
