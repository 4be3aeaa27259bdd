"""Benchmark (not a test): peak memory and time of one loss step, fused linear + cross-entropy vs plain torch.

A loss step is forward + backward of the language-model head's loss for ``--tokens`` tokens, hidden width
``--width`` and vocabulary ``--vocab`` (default 8,192 × 768 × 50,304, fp32, on this CPU):

- ``reference``: ``F.cross_entropy(hidden @ weight.T, targets)`` (the full [tokens × vocab] logits exist);
- ``fused``: ``collapse_hpo.kernels.cross_entropy.fused_linear_cross_entropy`` (chunked; torch path on CPU).

Memory method: each variant runs in a fresh subprocess. After the inputs are built, the process's peak
resident set (VmHWM) is reset by writing "5" to /proc/self/clear_refs; after the step, the figure is VmHWM
minus the resident set just before the step (VmRSS). So it counts every byte the step touched, including the
parameter gradients, but not the inputs or the interpreter (torch's CPU allocator returns large blocks to the
OS, so freed logits do not linger). Where clear_refs is unavailable it falls back to the lifetime peak
(ru_maxrss) minus that VmRSS, which is exact when the step is the process's largest moment.
Time: wall clock of the first (measured) step, and the median wall clock and CPU time (user + system, all
threads) of ``--repeats`` further steps; CPU time is the fairer comparison when other processes load the
machine.

Run:  .venv/bin/python studies/bench/loss_memory.py            (about 2 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    return _status_kib("VmHWM") is not None


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child(args: argparse.Namespace) -> dict:
    """Runs one variant in this process; returns its figures (bytes, seconds)."""
    import torch
    import torch.nn.functional as F

    from collapse_hpo.kernels.cross_entropy import fused_linear_cross_entropy

    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    hidden = torch.randn(args.tokens, args.width, dtype=dtype).requires_grad_()
    weight = (torch.randn(args.vocab, args.width) / args.width**0.5).to(dtype).requires_grad_()
    targets = torch.randint(0, args.vocab, (args.tokens,))

    def step() -> float:
        hidden.grad = None
        weight.grad = None
        if args.child == "reference":
            loss = F.cross_entropy(hidden @ weight.T, targets)
        else:
            loss = fused_linear_cross_entropy(hidden, weight, targets, chunk_tokens=args.chunk_tokens)
        loss.backward()
        return float(loss)

    rss_before = _status_kib("VmRSS") or 0
    exact = _reset_peak()
    start = time.perf_counter()
    loss = step()
    first_s = time.perf_counter() - start
    peak_kib = (_status_kib("VmHWM") or 0) if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times, cpu_times = [], []
    for _ in range(args.repeats):
        start, cpu_start = time.perf_counter(), _cpu_seconds()
        step()
        times.append(time.perf_counter() - start)
        cpu_times.append(_cpu_seconds() - cpu_start)
    return {
        "variant": args.child,
        "loss": loss,
        "peak_bytes": (peak_kib - rss_before) * 1024,
        "method": "VmHWM reset via clear_refs" if exact else "ru_maxrss",
        "first_step_s": first_s,
        "median_step_s": statistics.median(times) if times else first_s,
        "median_step_cpu_s": statistics.median(cpu_times) if cpu_times else float("nan"),
        "threads": torch.get_num_threads(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--chunk-tokens", type=int, default=None, help="fused: tokens per chunk (auto)")
    parser.add_argument("--repeats", type=int, default=1, help="timed steps after the measured one")
    parser.add_argument("--child", choices=["reference", "fused"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0

    load_before = os.getloadavg()[0]
    rows = []
    for variant in ("reference", "fused"):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", variant, "--tokens", str(args.tokens)]
        cmd += ["--vocab", str(args.vocab), "--width", str(args.width), "--dtype", args.dtype]
        cmd += ["--repeats", str(args.repeats)]
        if args.chunk_tokens:
            cmd += ["--chunk-tokens", str(args.chunk_tokens)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))

    ref, fused = rows
    logits_mib = args.tokens * args.vocab * 4 / 2**20
    print(
        f"loss step (forward+backward), {args.tokens} tokens × {args.vocab} vocab, width {args.width}, "
        f"{args.dtype}, CPU, {ref['threads']} threads; one fp32 [T×V] logits tensor = {logits_mib:.0f} MiB"
    )
    print(f"peak memory: {ref['method']} (fresh subprocess per variant); machine load average "
          f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after (other processes share the cores)\n")
    print("| variant | peak memory of the step (MiB) | first step (s) | median step (s) "
          "| median step CPU (s) | loss |")
    print("|---|---|---|---|---|---|")
    names = {"reference": "F.cross_entropy(hidden @ weight.T)", "fused": "fused_linear_cross_entropy"}
    for row in rows:
        print(
            f"| {names[row['variant']]} | {row['peak_bytes'] / 2**20:.0f} | {row['first_step_s']:.2f} | "
            f"{row['median_step_s']:.2f} | {row['median_step_cpu_s']:.2f} | {row['loss']:.5f} |"
        )
    ratio = fused["peak_bytes"] / max(ref["peak_bytes"], 1)
    verdict = "met" if ratio <= 0.25 else "NOT met"
    print(f"\nfused / reference peak memory: {ratio:.3f} (target ≤ 0.25: {verdict})")
    print(f"fused / reference median step time: wall {fused['median_step_s'] / ref['median_step_s']:.2f}, "
          f"CPU {fused['median_step_cpu_s'] / ref['median_step_cpu_s']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
