"""Fused linear + cross-entropy: the loss of a language-model head without the full [tokens × vocab] logits.

``fused_linear_cross_entropy(hidden [T, d], weight [V, d], targets [T])`` equals
``F.cross_entropy(logit_scale * hidden @ weight.T, targets, ignore_index=..., reduction=...)`` but walks
the tokens in chunks of ``chunk_tokens`` rows. For each chunk it forms the chunk's logits [C, V], computes the
loss and, in the same pass, the gradient of the logits (softmax - one-hot, times ``logit_scale`` and the
reduction's weight), which it contracts straight away into the gradients of ``hidden`` (rows of the chunk) and
``weight`` (accumulated in fp32). The chunk's logits are then dropped, so peak memory is
O(C·V + T·d + V·d) instead of O(T·V). Because forward already holds the gradients, backward only scales them
by the incoming gradient (the same scheme as Liger-Kernel's fused linear cross-entropy).

Backends (the ``backend`` keyword is internal, for tests and benchmarks):
- ``"triton"`` (default on CUDA): chunk matmuls with torch (cuBLAS), and a Triton kernel that computes, per
  token row, the online log-sum-exp over the vocabulary in blocks, the loss, and writes the logits' gradient
  in place over the chunk's logits buffer. Under ``TRITON_INTERPRET=1`` it also runs on CPU tensors (tests).
- ``"torch"`` (default on CPU): the same chunk loop with the per-chunk softmax done by torch in fp32;
  the constant factor of the gradient is applied to the small [C, d] and [V, d] products, not to [C, V].
- ``reference_linear_cross_entropy``: the plain, fully materialized torch computation that tests compare to.

Precision: fp32, fp16 and bf16 inputs. The soft-max, loss and the across-chunk gradient sums are fp32; the
returned gradients have the inputs' dtypes. Tokens whose target equals ``ignore_index`` contribute neither
loss nor gradient; ``reduction="mean"`` divides by the number of valid tokens, and gives 0 (with zero
gradients) when every token is ignored, where ``F.cross_entropy`` would give NaN.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Literal

import torch
from torch.autograd.function import once_differentiable

try:  # Triton is a Linux-only dependency; elsewhere only the torch path exists.
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None
    HAS_TRITON = False

Reduction = Literal["mean", "sum"]
Backend = Literal["torch", "triton"]

#: Default budget for one chunk's logits, in elements (fp32: 4 bytes each, so 128 MiB): a chunk's logits
#: take about as much memory as ``hidden`` itself, but at least this many elements (wide GEMMs; on 2 CPU
#: cores 512-token chunks of a 50,304 vocabulary beat unchunked F.cross_entropy, 64-token ones are slower).
CHUNK_ELEMENTS = 1 << 25


def triton_interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in {"1", "true", "on", "yes"}


def default_chunk_tokens(tokens: int, width: int, vocab: int) -> int:
    """Tokens per chunk so that one chunk's logits ([C, vocab]) hold about max(tokens·width, 32 Mi) elements.

    Rounded down to a power of two (at least 1, at most ``tokens``).
    """
    budget = max(tokens * width, CHUNK_ELEMENTS)
    rows = max(1, budget // max(vocab, 1))
    rows = 1 << (rows.bit_length() - 1)
    return max(1, min(tokens, rows))


# ----------------------------------------------------------------------------------------------------------
# Torch reference (materializes the full logits; for tests and benchmarks only).
# ----------------------------------------------------------------------------------------------------------
def reference_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    ignore_index: int = -100,
    logit_scale: float = 1.0,
    reduction: Reduction = "mean",
) -> torch.Tensor:
    """Plain torch: fp32 logits ``logit_scale * hidden @ weight.T`` [T, V] and ``F.cross_entropy``.

    Same conventions as :func:`fused_linear_cross_entropy` (mean over valid tokens, 0 when none is valid).
    Returns an fp32 scalar.
    """
    _check_reduction(reduction)
    logits = (hidden.float() @ weight.float().T) * logit_scale
    total = torch.nn.functional.cross_entropy(logits, targets, ignore_index=ignore_index, reduction="sum")
    if reduction == "sum":
        return total
    valid = (targets != ignore_index).sum()
    return total / valid.clamp(min=1)


# ----------------------------------------------------------------------------------------------------------
# Per-chunk cross-entropy on a logits buffer: loss per row, gradient written in place.
# ----------------------------------------------------------------------------------------------------------
def _chunk_ce_torch(
    logits: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int,
    logit_scale: float,
    grad_scale: float,
    need_grad: bool,
    all_valid: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, float]:
    """Loss per row [C] (fp32, 0 for ignored rows), the logits' gradient up to a factor, and that factor.

    ``logits`` are the unscaled chunk logits [C, V]; the caller passes its only reference, so they can be
    freed (or overwritten) here. The gradient d(grad_scale · Σ loss)/d(logits) is ``factor · grad``, with
    ``grad`` = softmax - one-hot (zero rows for ignored tokens), [C, V] fp32; the caller applies ``factor`` to
    the much smaller [C, d] and [V, d] matmul outputs instead of to the [C, V] buffer.
    ``all_valid``: no token of the whole call is ignored (skips the masking).
    """
    z = logits.float()
    del logits
    if logit_scale != 1.0:
        z.mul_(logit_scale)
    if all_valid:
        safe_targets = targets
    else:
        valid = targets != ignore_index
        safe_targets = torch.where(valid, targets, torch.zeros_like(targets))
    # loss = logsumexp - target logit (bit for bit the formula of trainers/fault.py's deliberately faulty
    # kernel, whose forward value must equal this one).
    lse = torch.logsumexp(z, dim=-1)
    loss = lse - z.gather(1, safe_targets.unsqueeze(1)).squeeze(1)
    if not all_valid:
        loss = torch.where(valid, loss, torch.zeros_like(loss))
    if not need_grad:
        return loss, None, 1.0
    grad = z.sub_(lse.unsqueeze(1)).exp_()  # softmax, in place over the logits
    grad.scatter_add_(1, safe_targets.unsqueeze(1), torch.full_like(loss, -1.0).unsqueeze(1))
    if not all_valid:
        grad.mul_(valid.unsqueeze(1).to(grad.dtype))
    return loss, grad, grad_scale * logit_scale


if HAS_TRITON:

    @triton.jit
    def _ce_rows_kernel(
        logits_ptr,
        logits_row_stride,
        targets_ptr,
        loss_ptr,
        n_cols,
        ignore_index,
        logit_scale,
        grad_scale,
        NEED_GRAD: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        """One program per token row: online log-sum-exp over the vocabulary in BLOCK columns, the row's
        loss, and (NEED_GRAD) the gradient grad_scale·logit_scale·(softmax - one-hot) over the logits row."""
        row = tl.program_id(0).to(tl.int64)
        row_ptr = logits_ptr + row * logits_row_stride
        target = tl.load(targets_ptr + row).to(tl.int64)
        valid = target != ignore_index
        safe_target = tl.where(valid, target, 0)
        cols = tl.arange(0, BLOCK)
        # Pass 1: running max m and running sum d of exp(z - m), z = logit_scale * logits (fp32). Branch-free:
        # an ignored row is computed like the others and zeroed by `valid`.
        m = -float("inf")
        d = 0.0
        for start in range(0, n_cols, BLOCK):
            offs = start + cols
            mask = offs < n_cols
            z = tl.load(row_ptr + offs, mask=mask, other=-float("inf")).to(tl.float32) * logit_scale
            m_new = tl.maximum(m, tl.max(z, axis=0))
            d = d * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), axis=0)
            m = m_new
        lse = m + tl.log(d)
        z_target = tl.load(row_ptr + safe_target).to(tl.float32) * logit_scale
        tl.store(loss_ptr + row, tl.where(valid, lse - z_target, 0.0))
        if NEED_GRAD:
            # Pass 2: scale·(softmax - one-hot) over the logits row (each block is read before it is written).
            scale = tl.where(valid, grad_scale * logit_scale, 0.0)
            for start in range(0, n_cols, BLOCK):
                offs = start + cols
                mask = offs < n_cols
                z = tl.load(row_ptr + offs, mask=mask, other=0.0).to(tl.float32) * logit_scale
                g = tl.exp(z - lse)
                g = tl.where(offs == safe_target, g - 1.0, g) * scale
                tl.store(row_ptr + offs, g.to(logits_ptr.dtype.element_ty), mask=mask)


def launch_config(vocab: int, interpreting: bool) -> tuple[int, int]:
    """(BLOCK columns, num_warps) of `_ce_rows_kernel` for a vocabulary of ``vocab`` entries.

    On a GPU a block pass covers up to 16,384 columns (64 KiB of fp32; 122 registers per thread at 16 warps,
    no spills on sm_90); in the interpreter blocks stay at 1,024 columns so each numpy step is small.
    """
    block = 1 << max(0, (vocab - 1).bit_length())  # next power of two
    block = min(block, 1024 if interpreting else 16384)
    return block, 4 if block <= 4096 else (8 if block <= 8192 else 16)


def _chunk_ce_triton(
    logits: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int,
    logit_scale: float,
    grad_scale: float,
    need_grad: bool,
    all_valid: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, float]:
    """Triton version of :func:`_chunk_ce_torch`: the whole gradient (factor 1) overwrites ``logits``."""
    if not HAS_TRITON:
        raise RuntimeError("backend='triton' needs the triton package (Linux); use backend='torch'")
    rows, cols = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    targets = targets.contiguous()
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows == 0:
        return loss, (logits if need_grad else None), 1.0
    block, num_warps = launch_config(cols, triton_interpreting())
    # Triton launches on the current CUDA device: make it the tensors' one (e.g. device="cuda:1").
    with torch.cuda.device(logits.device) if logits.is_cuda else contextlib.nullcontext():
        _ce_rows_kernel[(rows,)](
            logits,
            logits.stride(0),
            targets,
            loss,
            cols,
            ignore_index,
            float(logit_scale),
            float(grad_scale),
            NEED_GRAD=need_grad,
            BLOCK=block,
            num_warps=num_warps,
        )
    return loss, (logits if need_grad else None), 1.0


# ----------------------------------------------------------------------------------------------------------
# The chunk loop and the autograd function.
# ----------------------------------------------------------------------------------------------------------
def _fused_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int,
    logit_scale: float,
    reduction: Reduction,
    chunk_tokens: int,
    backend: Backend,
    valid_count: int,
    need_hidden_grad: bool,
    need_weight_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Loss (fp32 scalar) and the gradients of the summed/mean loss w.r.t. hidden and weight (or None).

    ``valid_count``: number of targets different from ``ignore_index`` (the "mean" divisor).
    """
    tokens = hidden.shape[0]
    need_grad = need_hidden_grad or need_weight_grad
    grad_scale = 1.0 / max(valid_count, 1) if reduction == "mean" else 1.0
    all_valid = valid_count == tokens

    if backend == "torch":
        # CPU path: matmuls in fp32 (reduced-precision matmuls on CPU are slow and lossy).
        compute_dtype = torch.float32
        chunk_ce = _chunk_ce_torch
    else:
        # Triton path: matmuls in the input dtype (tensor cores, fp32 accumulation inside cuBLAS).
        compute_dtype = hidden.dtype
        chunk_ce = _chunk_ce_triton
    w = weight if weight.dtype == compute_dtype else weight.to(compute_dtype)

    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    grad_hidden = (
        torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device) if need_hidden_grad else None
    )
    grad_weight = (
        torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight_grad else None
    )

    for start in range(0, tokens, chunk_tokens):
        stop = min(start + chunk_tokens, tokens)
        h = hidden[start:stop]
        if h.dtype != compute_dtype:
            h = h.to(compute_dtype)
        # The chunk's logits [C, V] (the only vocabulary-sized buffer) go straight into chunk_ce, which holds
        # the only reference and turns them into the gradient buffer.
        loss_rows, grad_logits, factor = chunk_ce(
            h @ w.T, targets[start:stop], ignore_index, logit_scale, grad_scale, need_grad, all_valid
        )
        total += loss_rows.sum()
        if grad_logits is None:
            continue
        if grad_logits.dtype != compute_dtype:
            grad_logits = grad_logits.to(compute_dtype)
        if grad_hidden is not None:
            rows = grad_hidden[start:stop]
            if grad_hidden.dtype == compute_dtype:
                torch.matmul(grad_logits, w, out=rows)
            else:
                rows.copy_(grad_logits @ w)
            if factor != 1.0:
                rows.mul_(factor)
        if grad_weight is not None:
            if h.dtype == grad_weight.dtype:
                grad_weight.addmm_(grad_logits.T, h, alpha=factor)  # fp32 in place, no [V, d] temporary
            else:
                # Reduced precision (Triton path): one chunk's product in the input dtype (fp32-accumulated
                # inside the GEMM), summed across chunks in fp32.
                grad_weight.add_(grad_logits.T @ h, alpha=factor)
        del grad_logits

    loss = total / max(valid_count, 1) if reduction == "mean" else total
    grad_weight_out = grad_weight.to(weight.dtype) if grad_weight is not None else None
    return loss, grad_hidden, grad_weight_out


class FusedLinearCrossEntropyFunction(torch.autograd.Function):
    """Autograd function: forward computes loss and both gradients chunk by chunk; backward scales them."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        ignore_index: int,
        logit_scale: float,
        reduction: Reduction,
        chunk_tokens: int,
        backend: Backend,
        valid_count: int,
    ) -> torch.Tensor:
        with torch.autocast(hidden.device.type, enabled=False):  # dtypes are chosen by the caller
            loss, grad_hidden, grad_weight = _fused_forward(
                hidden,
                weight,
                targets,
                ignore_index,
                logit_scale,
                reduction,
                chunk_tokens,
                backend,
                valid_count,
                need_hidden_grad=ctx.needs_input_grad[0],
                need_weight_grad=ctx.needs_input_grad[1],
            )
        ctx.save_for_backward(grad_hidden, grad_weight)
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: torch.Tensor):  # type: ignore[override]
        grad_hidden, grad_weight = ctx.saved_tensors
        # The loss is a scalar; a unit incoming gradient (the usual loss.backward()) needs no extra pass.
        unit = bool(torch.equal(grad_output, torch.ones_like(grad_output)))
        if grad_hidden is not None and not unit:
            grad_hidden = grad_hidden * grad_output.to(grad_hidden.dtype)
        if grad_weight is not None and not unit:
            grad_weight = grad_weight * grad_output.to(grad_weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, None, None


def _check_reduction(reduction: str) -> None:
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    ignore_index: int = -100,
    logit_scale: float = 1.0,
    reduction: Reduction = "mean",
    chunk_tokens: int | None = None,
    backend: Backend | None = None,
) -> torch.Tensor:
    """Cross-entropy of ``logit_scale * hidden @ weight.T`` against ``targets``, never forming all the logits.

    Args:
        hidden: [T, d] final hidden states (T tokens), fp32, fp16 or bf16.
        weight: [V, d] output embedding (V vocabulary entries). With dtypes differing from ``hidden``'s the
            computation runs in the autocast dtype when autocast is on, else in the promoted dtype.
        targets: [T] integer token ids in [0, V) or ``ignore_index``.
        ignore_index: target value whose tokens carry neither loss nor gradient.
        logit_scale: multiplier on the logits (CompleteP's 1/m_N output multiplier).
        reduction: "mean" (over valid tokens; 0 when none is valid) or "sum" (nats summed over tokens).
        chunk_tokens: tokens per chunk (rows of logits alive at once); default from
            :func:`default_chunk_tokens`.
        backend: internal; "triton" (default on CUDA) or "torch" (default elsewhere). Tests pass "triton" with
            CPU tensors under ``TRITON_INTERPRET=1``.

    Returns:
        A scalar fp32 tensor (nats per valid token for "mean"), differentiable w.r.t. hidden and weight.
    """
    _check_reduction(reduction)
    if hidden.dim() != 2 or weight.dim() != 2 or targets.dim() != 1:
        raise ValueError(
            f"expected hidden [T, d], weight [V, d], targets [T]; got {tuple(hidden.shape)}, "
            f"{tuple(weight.shape)}, {tuple(targets.shape)}"
        )
    if hidden.shape[1] != weight.shape[1] or hidden.shape[0] != targets.shape[0]:
        raise ValueError(
            f"shape mismatch: hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)}, "
            f"targets {tuple(targets.shape)}"
        )
    for name, tensor in (("hidden", hidden), ("weight", weight)):
        if tensor.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"{name} dtype must be float32, float16 or bfloat16, got {tensor.dtype}")
    # Under autocast (e.g. bf16 on CUDA: bf16 hidden states, an fp32 unembedding parameter) compute in the
    # autocast dtype, as F.linear would; otherwise in the promoted dtype. The casts happen outside the
    # autograd function, so the gradients flow back in each input's own dtype.
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        compute = torch.get_autocast_dtype(device_type)
    else:
        compute = torch.promote_types(hidden.dtype, weight.dtype)
    hidden = hidden if hidden.dtype == compute else hidden.to(compute)
    weight = weight if weight.dtype == compute else weight.to(compute)
    if targets.dtype.is_floating_point:
        raise ValueError(f"targets must be integer token ids, got {targets.dtype}")
    if not math.isfinite(logit_scale):
        raise ValueError(f"logit_scale must be finite, got {logit_scale}")
    tokens, width = hidden.shape
    vocab = weight.shape[0]
    if chunk_tokens is None:
        chunk_tokens = default_chunk_tokens(tokens, width, vocab)
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if backend is None:
        backend = "triton" if (hidden.is_cuda and HAS_TRITON) else "torch"
    if backend not in ("torch", "triton"):
        raise ValueError(f"backend must be 'torch' or 'triton', got {backend!r}")
    targets = targets.to(torch.int64) if targets.dtype != torch.int64 else targets
    if targets.device != hidden.device:
        raise ValueError(f"targets are on {targets.device}, hidden on {hidden.device}")
    valid = targets != ignore_index
    out_of_range = valid & ((targets < 0) | (targets >= vocab))
    valid_count, bad_count = (int(x) for x in torch.stack([valid.sum(), out_of_range.sum()]).tolist())
    if bad_count:
        raise ValueError(f"targets must lie in [0, {vocab}) or equal ignore_index={ignore_index}")
    return FusedLinearCrossEntropyFunction.apply(
        hidden, weight, targets, ignore_index, float(logit_scale), reduction, int(chunk_tokens), backend,
        valid_count,
    )
