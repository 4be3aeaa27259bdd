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

Fault drills reach the training loop only through one hook: `step_hook(fault, total_tokens, micro)` gives
the loop a `StepHook` whose `before_step(tokens_before)` says how the next optimizer step runs (micro-batch
size and the summed loss function) and raises the drills' exceptions; without a fault it is `CLEAN`. The
sweep's "kill the worker" drill is a reporter hook, `KillWorker`.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from collapse_hpo.kernels.cross_entropy import fused_linear_cross_entropy
from collapse_hpo.trainers.config import FaultConfig, InjectedFault

#: ``loss_sum(hidden, weight, targets, logit_scale) -> summed cross-entropy (nats)`` of one micro-batch.
LossSum = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


def clean_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                   logit_scale: float) -> torch.Tensor:
    """The correct summed cross-entropy (the fused kernel)."""
    return fused_linear_cross_entropy(hidden, weight, targets, logit_scale=logit_scale, reduction="sum")


@dataclass(frozen=True)
class StepPlan:
    """How one optimizer step runs: ``micro_batch_tokens`` per micro-batch and the summed loss function."""

    micro_batch_tokens: int
    loss_sum: LossSum


class StepHook:
    """What the training loop asks before each optimizer step (no fault: the run's own plan, unchanged).

    Args:
        fault: the injected fault, or None.
        total_tokens: D of the run (t̂ = tokens / D).
        micro_batch_tokens: the run's micro-batch size.
    """

    def __init__(self, fault: FaultConfig | None, total_tokens: int, micro_batch_tokens: int) -> None:
        self.fault, self.total_tokens, self.micro = fault, total_tokens, micro_batch_tokens
        self._clean = StepPlan(micro_batch_tokens, clean_loss_sum)

    def before_step(self, tokens_before: int) -> StepPlan:
        """The plan of the step that starts after ``tokens_before`` tokens; raises an injected exception
        (``exception``: `InjectedFault`; ``out_of_memory``: ``torch.OutOfMemoryError``) at its t̂."""
        f, d = self.fault, self.total_tokens
        if f is None or tokens_before < f.start_t_hat * d:
            return self._clean
        if f.kind == "exception":
            raise InjectedFault(f"injected fault at t_hat {tokens_before / d:.4f} ({tokens_before} tokens)")
        if f.kind == "out_of_memory":
            raise torch.OutOfMemoryError(f"injected out-of-memory at t_hat {tokens_before / d:.4f}")
        if f.kind == "nan_loss":
            return StepPlan(self.micro, lambda h, w, y, s: clean_loss_sum(h, w, y, s) * float("nan"))
        micro = f.micro_batch_tokens or self.micro  # the "restart on new hardware" runs at the faulty size
        if not fault_applies(f, tokens_before, d, micro, self.micro):
            return StepPlan(micro, clean_loss_sum)

        def faulty(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor, s: float) -> torch.Tensor:
            return misnormalized_linear_cross_entropy(h, w, y, f, logit_scale=s, reduction="sum")

        return StepPlan(micro, faulty)


class KillWorker:
    """The sweep's "worker dies" drill, as a reporter hook: SIGKILL this process at the first report at or
    past ``start_t_hat`` (fraction of training tokens)."""

    def __init__(self, start_t_hat: float) -> None:
        self.start_t_hat = start_t_hat

    def __call__(self, report: Any) -> None:
        if report.t_hat >= self.start_t_hat:
            os.kill(os.getpid(), signal.SIGKILL)

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
