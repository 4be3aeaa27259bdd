"""Fused linear + cross-entropy (kernels/cross_entropy.py) against the plain torch reference.

The Triton backend runs on CPU tensors in the Triton interpreter (tests/conftest.py sets
TRITON_INTERPRET=1 before triton is imported); with TRITON_INTERPRET=0 and a GPU present
(studies/bench/gpu_check.py) the same tests run the compiled kernel on CUDA.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from collapse_hpo.kernels.cross_entropy import (
    CHUNK_ELEMENTS,
    HAS_TRITON,
    default_chunk_tokens,
    fused_linear_cross_entropy,
    reference_linear_cross_entropy,
    triton_interpreting,
)

IGNORE = -100

TRITON_DEVICE = "cuda" if torch.cuda.is_available() and not triton_interpreting() else "cpu"

needs_triton = pytest.mark.skipif(
    not HAS_TRITON or (TRITON_DEVICE == "cpu" and not triton_interpreting()),
    reason="needs triton with a CUDA GPU or TRITON_INTERPRET=1",
)

# Tolerances per input dtype (absolute on the loss in nats, relative-to-max on gradients).
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def make_inputs(tokens, width, vocab, dtype, device="cpu", ignored=(), seed=0, spread=1.0):
    gen = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(tokens, width, generator=gen) * spread).to(device=device, dtype=dtype)
    weight = (torch.randn(vocab, width, generator=gen) / width**0.5).to(device=device, dtype=dtype)
    targets = torch.randint(0, vocab, (tokens,), generator=gen)
    for i in ignored:
        targets[i] = IGNORE
    return hidden.requires_grad_(), weight.requires_grad_(), targets.to(device)


def loss_and_grads(fn, hidden, weight, targets, **kwargs):
    hidden.grad = None
    weight.grad = None
    loss = fn(hidden, weight, targets, **kwargs)
    loss.backward()
    return loss.detach().float(), hidden.grad.detach().float().clone(), weight.grad.detach().float().clone()


def assert_matches(ours, ref, dtype):
    (loss, gh, gw), (rloss, rgh, rgw) = ours, ref
    tol = TOL[dtype]
    assert torch.isfinite(loss)
    assert abs(loss.item() - rloss.item()) <= tol * max(1.0, abs(rloss.item())), (loss, rloss)
    for got, want in ((gh, rgh), (gw, rgw)):
        scale = max(want.abs().max().item(), 1e-12)
        err = (got.cpu() - want.cpu()).abs().max().item()
        assert err <= 5 * tol * scale, (err, scale)


CASES = [
    # tokens, width, vocab, chunk_tokens, ignored token indices
    (1, 8, 5, None, ()),
    (37, 16, 203, 8, (0, 5, 36)),  # ragged: 37 tokens in chunks of 8; vocab prime
    (64, 24, 1500, 17, tuple(range(0, 64, 3))),  # vocab not a multiple of the 1024-column block
    (19, 8, 33, 64, ()),  # one chunk larger than the tokens
]


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"T{c[0]}-d{c[1]}-V{c[2]}-C{c[3]}")
def test_matches_reference(backend, dtype, case):
    tokens, width, vocab, chunk, ignored = case
    device = TRITON_DEVICE if backend == "triton" else "cpu"
    hidden, weight, targets = make_inputs(tokens, width, vocab, dtype, device, ignored)
    ours = loss_and_grads(
        fused_linear_cross_entropy, hidden, weight, targets, chunk_tokens=chunk, backend=backend
    )
    ref = loss_and_grads(reference_linear_cross_entropy, hidden, weight, targets)
    assert_matches(ours, ref, dtype)
    assert hidden.grad.dtype == dtype and weight.grad.dtype == dtype


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("logit_scale", [1.0, 0.25, 3.0])
def test_reduction_and_logit_scale(backend, reduction, logit_scale):
    device = TRITON_DEVICE if backend == "triton" else "cpu"
    hidden, weight, targets = make_inputs(29, 16, 311, torch.float32, device, ignored=(2, 3, 28), spread=2.0)
    kwargs = {"reduction": reduction, "logit_scale": logit_scale}
    ours = loss_and_grads(
        fused_linear_cross_entropy, hidden, weight, targets, chunk_tokens=6, backend=backend, **kwargs
    )
    ref = loss_and_grads(reference_linear_cross_entropy, hidden, weight, targets, **kwargs)
    assert_matches(ours, ref, torch.float32)
    # The reference itself agrees with F.cross_entropy on the scaled logits (both reductions).
    logits = logit_scale * hidden.detach() @ weight.detach().T
    plain = torch.nn.functional.cross_entropy(logits, targets, ignore_index=IGNORE, reduction=reduction)
    assert torch.allclose(ref[0], plain.cpu().float(), atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_all_tokens_ignored_gives_zero_loss_and_gradients(backend, reduction):
    device = TRITON_DEVICE if backend == "triton" else "cpu"
    hidden, weight, targets = make_inputs(13, 8, 70, torch.float32, device, ignored=range(13))
    kwargs = {"chunk_tokens": 4, "backend": backend, "reduction": reduction}
    loss, gh, gw = loss_and_grads(fused_linear_cross_entropy, hidden, weight, targets, **kwargs)
    assert loss.item() == 0.0
    assert torch.count_nonzero(gh) == 0 and torch.count_nonzero(gw) == 0


def test_bf16_torch_path_matches_reference():
    hidden, weight, targets = make_inputs(45, 32, 517, torch.bfloat16, ignored=(1, 44))
    ours = loss_and_grads(fused_linear_cross_entropy, hidden, weight, targets, chunk_tokens=16)
    ref = loss_and_grads(reference_linear_cross_entropy, hidden, weight, targets)
    assert_matches(ours, ref, torch.bfloat16)
    assert hidden.grad.dtype == torch.bfloat16


def test_mixed_dtypes_and_autocast_follow_the_compute_dtype():
    hidden, weight, targets = make_inputs(24, 16, 130, torch.bfloat16, ignored=(0,))
    weight32 = weight.detach().float().requires_grad_()
    # bf16 hidden states with an fp32 unembedding: promoted to fp32; each input gets a gradient in its dtype.
    ours = loss_and_grads(fused_linear_cross_entropy, hidden, weight32, targets, chunk_tokens=7)
    ref = loss_and_grads(reference_linear_cross_entropy, hidden, weight32, targets)
    assert abs(ours[0].item() - ref[0].item()) <= TOL[torch.float32] * ref[0].item()  # fp32 compute
    assert_matches(ours, ref, torch.bfloat16)  # hidden's gradient is rounded to bf16
    assert torch.allclose(ours[2], ref[2], rtol=1e-4, atol=1e-6)  # weight's stays fp32
    assert hidden.grad.dtype == torch.bfloat16 and weight32.grad.dtype == torch.float32
    # Under bf16 autocast the same inputs are computed in bf16 (as F.linear would be).
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = loss_and_grads(fused_linear_cross_entropy, hidden, weight32, targets, chunk_tokens=7)
    bf16 = loss_and_grads(reference_linear_cross_entropy, hidden, weight.detach().requires_grad_(), targets)
    assert_matches(auto, bf16, torch.bfloat16)
    assert weight32.grad.dtype == torch.float32


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
def test_upstream_gradient_and_partial_requires_grad(backend):
    device = TRITON_DEVICE if backend == "triton" else "cpu"
    hidden, weight, targets = make_inputs(21, 8, 97, torch.float32, device, ignored=(4,))
    # loss * 3.5: gradients scale with the incoming gradient.
    (3.5 * fused_linear_cross_entropy(hidden, weight, targets, chunk_tokens=5, backend=backend)).backward()
    gh, gw = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    (3.5 * reference_linear_cross_entropy(hidden, weight, targets)).backward()
    assert torch.allclose(gh, hidden.grad, atol=1e-6, rtol=1e-4)
    assert torch.allclose(gw, weight.grad, atol=1e-6, rtol=1e-4)
    # Frozen head: only hidden gets a gradient; under no_grad nothing is tracked but the value is the same.
    frozen = weight.detach()
    hidden.grad = None
    fused_linear_cross_entropy(hidden, frozen, targets, chunk_tokens=5, backend=backend).backward()
    assert torch.allclose(hidden.grad, gh / 3.5, atol=1e-6, rtol=1e-4)
    with torch.no_grad():
        value = fused_linear_cross_entropy(hidden, weight, targets, chunk_tokens=5, backend=backend)
    assert not value.requires_grad
    assert torch.allclose(value.cpu(), reference_linear_cross_entropy(hidden, weight, targets).detach().cpu())


def test_chunk_size_does_not_change_the_result():
    hidden, weight, targets = make_inputs(50, 16, 257, torch.float32, ignored=(7, 8))
    results = [
        loss_and_grads(fused_linear_cross_entropy, hidden, weight, targets, chunk_tokens=chunk)
        for chunk in (1, 7, 50)
    ]
    for other in results[1:]:
        assert_matches(other, results[0], torch.float32)


class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_full_logits_are_never_materialized():
    tokens, width, vocab, chunk = 96, 8, 600, 16
    hidden, weight, targets = make_inputs(tokens, width, vocab, torch.float32, ignored=(3,))
    with _LargestTensor() as probe:
        fused_linear_cross_entropy(hidden, weight, targets, chunk_tokens=chunk).backward()
    assert probe.largest <= chunk * vocab < tokens * vocab
    with _LargestTensor() as ref_probe:
        reference_linear_cross_entropy(hidden, weight, targets).backward()
    assert ref_probe.largest >= tokens * vocab  # the probe does see a full-logits tensor when one exists


def test_default_chunk_keeps_logits_near_hidden_size():
    chunk = default_chunk_tokens(8192, 768, 50304)
    assert chunk & (chunk - 1) == 0 and 1 <= chunk <= 8192
    assert chunk * 50304 <= max(8192 * 768, CHUNK_ELEMENTS) < 2 * chunk * 50304
    assert default_chunk_tokens(3, 8, 10) == 3


@pytest.mark.parametrize(
    ("kwargs", "shapes", "message"),
    [
        ({"reduction": "none"}, ((4, 8), (10, 8), (4,)), "reduction must be"),
        ({}, ((4, 8), (10, 7), (4,)), "shape mismatch"),
        ({}, ((4, 8), (10, 8), (5,)), "shape mismatch"),
        # without its own check a zero chunk still fails (range() with step 0), so the message is what tells
        ({"chunk_tokens": 0}, ((4, 8), (10, 8), (4,)), "chunk_tokens must be >= 1"),
    ],
)
def test_bad_arguments_raise(kwargs, shapes, message):
    (t, d), (v, dw), (n,) = shapes
    with pytest.raises(ValueError, match=message):
        targets = torch.zeros(n, dtype=torch.long)
        fused_linear_cross_entropy(torch.randn(t, d), torch.randn(v, dw), targets, **kwargs)


def test_out_of_range_target_raises():
    with pytest.raises(ValueError, match="targets must lie"):
        fused_linear_cross_entropy(torch.randn(3, 4), torch.randn(5, 4), torch.tensor([0, 5, IGNORE]))


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
def test_non_contiguous_inputs_and_int32_targets(backend):
    device = TRITON_DEVICE if backend == "triton" else "cpu"
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(30, 24, generator=gen).to(device)
    hidden = wide[:, ::2].detach().requires_grad_()  # [30, 12], row stride 24
    weight = torch.randn(12, 77, generator=gen).to(device).T.detach().requires_grad_()  # [77, 12], transposed
    targets = torch.randint(0, 77, (30,), generator=gen, dtype=torch.int32).to(device)
    assert not hidden.is_contiguous() and not weight.is_contiguous()
    kwargs = {"chunk_tokens": 8, "backend": backend}
    ours = loss_and_grads(fused_linear_cross_entropy, hidden, weight, targets, **kwargs)
    ref = loss_and_grads(reference_linear_cross_entropy, hidden, weight, targets.long())
    assert_matches(ours, ref, torch.float32)
