"""GPU check (not a test), for when a CUDA GPU is lent: one run, under 5 minutes, one table.

1. kernel tests compiled for real: ``pytest tests/test_kernels_cross_entropy.py`` with TRITON_INTERPRET=0, so
   the Triton tests run the compiled kernel on CUDA tensors (the torch-path tests still run on CPU);
2. the loss step (forward + backward) of fused_linear_cross_entropy (Triton) vs
   ``F.cross_entropy(hidden @ weight.T)`` at 8,192 tokens × 50,304 vocab × width 768 in bf16: median time of
   10 steps after 3 warm-up steps, peak CUDA memory of one step (torch.cuda.max_memory_allocated above what
   was allocated before it), and the fused result's error against the fp32 reference (loss, gradients);
3. training throughput of a ~124M-parameter GPT (width 768, depth 12, 12 heads, context 1024, vocab 50,304,
   untied; bf16 autocast) through the trainer's API (`collapse_hpo.trainers.train`): tokens/s between the
   reports after the first two optimizer steps (each report syncs: it reads the loss), and MFU =
   tokens/s · FLOPs/token / peak, with FLOPs/token = 6·(N_non_embedding + V·d) + 12·L·d·context (the PaLM
   convention: matmuls forward and backward, attention scores and values without a causal discount; the
   embedding lookup costs nothing). Peak dense bf16 FLOP/s by device name (H100/H200 SXM 989 TFLOP/s, H100
   PCIe 756, A100 312) or ``--peak-tflops``. Data: uniform random token ids written to a temporary nanoGPT
   .bin file (throughput does not depend on the text).

``--dry-run`` runs the same code paths on CPU at tiny shapes (interpreted Triton tests, a selection of them;
fp32; a 2-layer model), to check the script itself without a GPU (tests/test_kernels_gpu_check.py).

Run on a GPU machine:  .venv/bin/python studies/bench/gpu_check.py            (about 2–3 minutes)
Dry run on CPU:        .venv/bin/python studies/bench/gpu_check.py --dry-run  (about 20 s)
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: Dense bf16 peak FLOP/s by a substring of torch.cuda.get_device_name() (first match wins).
PEAK_BF16_FLOPS = (("H100 PCIe", 756e12), ("H200", 989e12), ("H100", 989e12), ("A100", 312e12))


@dataclass(frozen=True)
class Shapes:
    """Every size the check uses (full on a GPU, tiny for --dry-run)."""

    tokens: int
    vocab: int
    width: int
    loss_dtype: str
    model_width: int
    model_depth: int
    model_heads: int
    context: int
    batch_tokens: int
    micro_batch_tokens: int
    train_steps: int
    train_dtype: str
    pytest_select: str | None


FULL = Shapes(8192, 50304, 768, "bfloat16", 768, 12, 12, 1024, 131072, 32768, 24, "bfloat16", None)
TINY = Shapes(96, 300, 16, "float32", 32, 2, 2, 32, 256, 128, 6, "float32", "all_tokens_ignored or chunk")


Row = tuple[str, str, str]  # check, result, detail


def run_kernel_tests(shapes: Shapes, dry_run: bool) -> list[Row]:
    """The kernel tests in a subprocess: compiled Triton on CUDA (or interpreted, for --dry-run)."""
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "1" if dry_run else "0"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += ["tests/test_kernels_cross_entropy.py"]
    if shapes.pytest_select:
        cmd += ["-k", shapes.pytest_select]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    seconds = time.perf_counter() - start
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip()[-200:]
    counts = dict((k, int(n)) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error|errors)", summary))
    ok = proc.returncode == 0 and counts.get("passed", 0) > 0
    mode = "interpreted, CPU" if dry_run else "compiled, CUDA"
    result = "PASS" if ok else "FAIL"
    detail = f"{summary.strip('= ')} in {seconds:.0f} s"
    rows = [(f"kernel tests ({mode})", result, detail)]
    if not ok:
        failed = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
        rows += [("  failure", "", line[:150]) for line in failed[:5]]
    return rows


def _peak_reset(device) -> int:
    """Resets the peak-memory counter; returns the bytes in use now."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    Path("/proc/self/clear_refs").write_text("5")  # Linux: resets VmHWM (peak resident set)
    return _status_bytes("VmRSS")


def _peak_bytes(device) -> int:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    return _status_bytes("VmHWM")


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def loss_step_rows(shapes: Shapes, device) -> list[Row]:
    """Fused vs plain torch loss step: time, peak memory, and each result's error vs an fp32 reference."""
    import torch
    import torch.nn.functional as F

    from collapse_hpo.kernels.cross_entropy import fused_linear_cross_entropy, reference_linear_cross_entropy

    dtype = getattr(torch, shapes.loss_dtype)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(shapes.tokens, shapes.width, generator=gen).to(device, dtype).requires_grad_()
    weight = (torch.randn(shapes.vocab, shapes.width, generator=gen) / shapes.width**0.5).to(device, dtype)
    weight.requires_grad_()
    targets = torch.randint(0, shapes.vocab, (shapes.tokens,), generator=gen).to(device)
    targets[::17] = -100

    variants = {
        "F.cross_entropy(hidden @ weight.T)": lambda: F.cross_entropy(hidden @ weight.T, targets),
        "fused_linear_cross_entropy": lambda: fused_linear_cross_entropy(hidden, weight, targets),
    }
    results = {}
    for name, fn in variants.items():

        def step(fn=fn):
            hidden.grad = None
            weight.grad = None
            loss = fn()
            loss.backward()
            return loss

        for _ in range(3):
            step()
        hidden.grad = weight.grad = None  # so that `before` holds the inputs only, as in the first step
        before = _peak_reset(device)
        loss = step()
        peak = _peak_bytes(device) - before
        grads = (loss.item(), hidden.grad.detach().float().clone(), weight.grad.detach().float().clone())
        times = []
        for _ in range(10):
            _sync(device)
            start = time.perf_counter()
            step()
            _sync(device)
            times.append(time.perf_counter() - start)
        results[name] = (statistics.median(times), peak, grads)

    hidden.grad = weight.grad = None
    ref32 = reference_linear_cross_entropy(hidden.float(), weight.float(), targets)
    ref32.backward()
    want = (ref32.item(), hidden.grad.float(), weight.grad.float())

    def err(got) -> str:
        loss_err = abs(got[0] - want[0])
        gh = (got[1] - want[1]).abs().max().item() / max(want[1].abs().max().item(), 1e-30)
        gw = (got[2] - want[2]).abs().max().item() / max(want[2].abs().max().item(), 1e-30)
        return f"vs fp32: Δloss {loss_err:.1e}, grad max rel err hidden {gh:.1e}, weight {gw:.1e}"

    label = f"{shapes.tokens}×{shapes.vocab}×{shapes.width} {shapes.loss_dtype}"
    rows = []
    for name, (seconds, peak, grads) in results.items():
        rows.append((f"loss step {label}: {name}", f"{seconds * 1e3:.2f} ms", f"peak {peak / 2**20:.0f} MiB; "
                     + err(grads)))
    (t_ref, m_ref, _), (t_fused, m_fused, _) = results.values()
    ratio = f"{m_fused / m_ref:.3f}×" if m_ref >= 2**20 else "n/a (reference under 1 MiB)"
    speed = f"time {t_fused / t_ref:.2f}×"
    rows.append(("loss step fused / torch", speed, f"peak memory {ratio} (target ≤ 0.25)"))
    return rows


def flops_per_token(non_embedding: int, vocab: int, width: int, depth: int, context: int) -> float:
    """Training FLOPs per token (PaLM convention, see the module docstring)."""
    return 6.0 * (non_embedding + vocab * width) + 12.0 * depth * width * context


def peak_flops(device_name: str, override_tflops: float | None) -> float | None:
    if override_tflops:
        return override_tflops * 1e12
    for key, value in PEAK_BF16_FLOPS:
        if key in device_name:
            return value
    return None


def training_rows(shapes: Shapes, device, peak: float | None, compile_model: bool) -> list[Row]:
    """Tokens/s and MFU of one short training run through the trainer's public API."""
    import numpy as np

    from collapse_hpo.trainers import train as train_module

    # Twice the run (no repeated data after the 2% held-out split) and enough for the split's chunking.
    tokens_needed = max(2 * shapes.train_steps * shapes.batch_tokens, 200 * shapes.context)
    reports: list[tuple[float, int]] = []

    def reporter(report) -> None:
        reports.append((time.perf_counter(), report.tokens))

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "random_tokens.bin"
        rng = np.random.default_rng(0)
        rng.integers(0, shapes.vocab, size=tokens_needed, dtype=np.uint16).tofile(corpus)
        config = train_module.TrainConfig(
            width=shapes.model_width,
            depth=shapes.model_depth,
            heads=shapes.model_heads,
            base_width=shapes.model_width,
            base_depth=shapes.model_depth,
            context=shapes.context,
            vocab_size=shapes.vocab,
            total_tokens=shapes.train_steps * shapes.batch_tokens,
            batch_tokens=shapes.batch_tokens,
            micro_batch_tokens=shapes.micro_batch_tokens,
            device=str(device),
            dtype=shapes.train_dtype,
            compile=compile_model,
            corpus=str(corpus),
            val_tokens=4 * shapes.context,
            val_fractions=(),
            report_every_tokens=shapes.batch_tokens,
        )
        result = train_module.train(config, reporter=reporter)

    non_embedding = result.metadata["params_non_embedding"]
    total = result.metadata["params_total"]
    (t0, k0), (t1, k1) = reports[min(2, len(reports) - 2)], reports[-1]
    tokens_per_s = (k1 - k0) / (t1 - t0)
    fpt = flops_per_token(non_embedding, shapes.vocab, shapes.model_width, shapes.model_depth, shapes.context)
    achieved = tokens_per_s * fpt
    mfu = f"MFU {100 * achieved / peak:.1f}% of {peak / 1e12:.0f} TFLOP/s" if peak else "MFU n/a (no peak)"
    shape = (f"{shapes.model_width}×{shapes.model_depth}, ctx {shapes.context}, N {non_embedding / 1e6:.2f}M "
             f"non-emb / {total / 1e6:.2f}M total")
    return [
        (f"training {shapes.train_dtype}{' compiled' if compile_model else ''} ({shape})",
         f"{tokens_per_s:,.0f} tokens/s",
         f"{mfu}; {achieved / 1e12:.1f} TFLOP/s; final loss {result.final_loss:.3f} over "
         f"{result.metadata['total_tokens']:,} tokens"),
    ]


def print_table(rows: list[Row], header: str) -> None:
    print(header)
    print("| check | result | detail |")
    print("|---|---|---|")
    for check, result, detail in rows:
        print(f"| {check} | {result} | {detail} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU (checks the script)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="peak dense bf16 TFLOP/s for MFU")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model for the training row")
    parser.add_argument("--skip-tests", action="store_true", help="leave out the kernel tests")
    args = parser.parse_args()

    import torch

    if args.dry_run:
        device, shapes = torch.device("cpu"), TINY
        name = "CPU (dry run)"
    else:
        if not torch.cuda.is_available():
            print("gpu_check: no CUDA device; use --dry-run to check the script on CPU", file=sys.stderr)
            return 2
        device, shapes = torch.device("cuda"), FULL
        name = torch.cuda.get_device_name()
    peak = peak_flops(name, args.peak_tflops)

    started = time.perf_counter()
    rows: list[Row] = []
    sections = [
        ("kernel tests", lambda: [] if args.skip_tests else run_kernel_tests(shapes, args.dry_run)),
        ("loss step", lambda: loss_step_rows(shapes, device)),
        ("training", lambda: training_rows(shapes, device, peak, args.compile)),
    ]
    failed = False
    for section, fn in sections:
        try:
            rows += fn()
        except Exception as exc:  # one broken section must not hide the others' figures
            failed = True
            rows.append((section, "ERROR", f"{type(exc).__name__}: {str(exc)[:200]}"))
            traceback.print_exc(file=sys.stderr)
    failed = failed or any(result == "FAIL" for _, result, _ in rows)
    dry = " (DRY RUN: tiny shapes, figures meaningless)" if args.dry_run else ""
    seconds = time.perf_counter() - started
    header = f"gpu_check on {name}; torch {torch.__version__}; {seconds:.0f} s in all{dry}"
    print_table(rows, header)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
