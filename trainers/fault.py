"""The injected loss-kernel fault: a linear + cross-entropy whose backward mis-normalizes part of the rows.

Modelled on the paper's 1.8B incident (a loss kernel wrong at specific micro-batch sizes after a restart on
new hardware; METHOD.md §6). A pure rescale of the gradient would do almost nothing under Adam, so the fault
biases the update instead: for the last ``rows_fraction`` of the micro-batch's token rows, the softmax used
in the backward is divided by a denominator that is too small by ``1 + strength`` (as when a kernel's row
reduction misses part of the sum). The logits' gradient of those rows becomes ``(1 + s)·softmax − onehot``
instead of ``softmax − onehot``: the extra ``s·softmax`` is the gradient of ``s·logsumexp``, which pushes
the likely logits down (flattening the predictions, like label smoothing) and keeps dragging the hidden
states along the unembedding's mean row. The effect accumulates over the weights' EMA timescale, so the loss
leaves its collapse curve slowly, not with a jump. The forward value is computed correctly, so the reported
loss is the true loss.

`misnormalized_linear_cross_entropy` is chunked over rows like the fused kernel (no full [T, V] logits) and
supports reduction "sum" and "mean". `fault_applies` says whether the fault hits a given micro-batch.
"""

from __future__ import annotations

import torch

from collapse_hpo.trainers.config import FaultConfig

_CHUNK_ROWS = 2048


def fault_applies(
    fault: FaultConfig | None,
    tokens_before_step: int,
    total_tokens: int,
    micro_batch_tokens: int,
    run_micro_batch_tokens: int,
) -> bool:
    """True when a ``loss_normalization`` fault corrupts a micro-batch of ``micro_batch_tokens`` tokens in the
    step that starts after ``tokens_before_step`` tokens: t̂ ≥ start_t_hat and the size is the faulty one
    (``fault.micro_batch_tokens``, or the run's own micro-batch size when that is None)."""
    if fault is None or fault.kind != "loss_normalization":
        return False
    if tokens_before_step < fault.start_t_hat * total_tokens:
        return False
    faulty_size = fault.micro_batch_tokens or run_micro_batch_tokens
    return micro_batch_tokens == faulty_size


class _MisnormalizedCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, logit_scale, ignore_index, strength, first_bad_row, divisor):  # type: ignore[override]
        dt = torch.promote_types(hidden.dtype, torch.float32)  # fp32 at least
        total = torch.zeros((), dtype=dt, device=hidden.device)
        w = weight.to(dt)
        for s in range(0, hidden.shape[0], _CHUNK_ROWS):
            z = logit_scale * (hidden[s : s + _CHUNK_ROWS].to(dt) @ w.T)
            y = targets[s : s + _CHUNK_ROWS]
            valid = y != ignore_index
            lse = torch.logsumexp(z, dim=-1)
            picked = z.gather(1, y.clamp(min=0)[:, None])[:, 0]
            total = total + torch.where(valid, lse - picked, torch.zeros_like(lse)).sum()
        ctx.save_for_backward(hidden, weight, targets)
        ctx.params = (logit_scale, ignore_index, strength, first_bad_row, divisor)
        return total / divisor

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        hidden, weight, targets = ctx.saved_tensors
        logit_scale, ignore_index, strength, first_bad_row, divisor = ctx.params
        dt = torch.promote_types(hidden.dtype, torch.float32)
        w = weight.to(dt)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(w)
        g = grad_output.to(dt) / divisor * logit_scale
        for s in range(0, hidden.shape[0], _CHUNK_ROWS):
            h = hidden[s : s + _CHUNK_ROWS].to(dt)
            y = targets[s : s + _CHUNK_ROWS]
            p = torch.softmax(logit_scale * (h @ w.T), dim=-1)
            rows = torch.arange(s, s + h.shape[0], device=h.device)
            # The bug: the softmax of the faulty rows is normalized by a denominator (1 + strength) too small.
            p = p * torch.where(rows >= first_bad_row, 1.0 + strength, 1.0)[:, None]
            valid = y != ignore_index
            p.scatter_add_(1, y.clamp(min=0)[:, None], -torch.ones_like(p[:, :1]))
            dz = p * valid[:, None] * g
            grad_hidden[s : s + h.shape[0]] = (dz @ w).to(hidden.dtype)
            grad_weight += dz.T @ h
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None, None, None, None


def misnormalized_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    fault: FaultConfig,
    *,
    ignore_index: int = -100,
    logit_scale: float = 1.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """Cross-entropy of ``logit_scale · hidden @ weight.T`` (correct value) with the faulty backward above.

    Args:
        hidden [T, d], weight [V, d], targets [T]: as `kernels.cross_entropy.fused_linear_cross_entropy`.
        fault: the FaultConfig (``strength``, ``rows_fraction``); rows T·(1 − rows_fraction) .. T − 1 are
            mis-normalized.
        reduction: "sum" (nats) or "mean" (nats per valid token).
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    t = hidden.shape[0]
    first_bad = t - round(fault.rows_fraction * t)
    divisor = 1.0 if reduction == "sum" else max(1, int((targets != ignore_index).sum()))
    return _MisnormalizedCE.apply(
        hidden,
        weight,
        targets.long(),
        float(logit_scale),
        ignore_index,
        float(fault.strength),
        int(first_bad),
        float(divisor),
    )
