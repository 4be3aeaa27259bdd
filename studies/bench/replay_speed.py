"""Replay speed at fine-tuning scale: 400 trials × 50 evaluations × 20 orders × every pruner (issue 15).

The sweep resembles a fine-tuning random search (LoRA or full SFT): every trial draws its own peak LR
(log-uniform over 1e-5 … 1e-3), weight decay λ (log-uniform over 0.01 … 0.3, so the AdamW timescale
τ = 1/(η λ S), S = 20,000 steps, differs per trial: 0.2 … 450 runs) and warm-up (0 … 10% of training),
with a cosine decay to 10% of the peak; the loss is evaluated 50 times per trial (every 2% of training).
Curve shapes come from the noisy quadratic model of predictors/synthetic.py (``nqm_curve``: the shape
depends on τ and the schedule, as for real runs), scaled by a final loss that is U-shaped in log LR, with
0.3% evaluation noise. TPP is not defined for fine-tuning; every trial gets ``tpp = 1`` for now (issue 15's
first bullet makes it optional). The collapse pruners that need a reference get one calibrated on 24 other
curves of the same generator (another seed); calibration is not timed.

Timed: ``replay`` (hpo/replays/replay.py) of the sweep in ``--orders`` random orders with 4 concurrent
workers, for each pruner of ``collapse-hpo replay --pruner list`` (conformal needs the optional ``surestop``
package), with ``--jobs`` processes where the code has them. Wall and CPU seconds (this process and its
workers) per pruner and in total.

``--compare DIR`` also times the code of another checkout (e.g. ``/work/main``: read only, imported through
a temporary folder of links) on the first ``--before-orders`` of the same orders, one process, and checks
that both make the same decisions in those orders; its time for ``--orders`` orders is then extrapolated
(per-order time × orders, marked ≈). Writes ``replay_speed.md`` to ``--out`` and prints it.

``--sweep lora`` replays the real fine-tuning sweep instead (issue 20 item 5: ``collapse`` and
``collapse-online`` on 200 trials × 50 reports in ≤ 5 s per order on one core): all 197 runs of
../shared/extdata/surestop_lora (studies/bench/surestop_lora.py), ``collapse`` with a surrogate calibrated on
the earlier nights' runs (calibration not timed); it prints seconds per order (wall and CPU) and writes
``replay_speed_lora.md``. Run it with ``--jobs 1`` for the one-core figure.

Usage::

    .venv/bin/python studies/bench/replay_speed.py --compare /work/main          # before and after (table)
    .venv/bin/python studies/bench/replay_speed.py                              # after only
    .venv/bin/python studies/bench/replay_speed.py --trials 100 --orders 2 --pruner collapse-online
    .venv/bin/python studies/bench/replay_speed.py --sweep lora --jobs 1 --orders 4 \
        --pruner collapse --pruner collapse-online [--compare OTHER_CHECKOUT --before-orders 1]
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from collapse_hpo.predictors.curves import Curve
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.synthetic import nqm_curve

HERE = Path(__file__).resolve().parent
STEPS = 20_000  # optimizer steps of one fine-tuning run (sets τ = 1/(η λ S) in units of the run)
TPP = 1.0  # not defined for fine-tuning; a placeholder until tpp is optional
LR_OPT = 2e-4  # the LR with the lowest final loss
TARGET_S = 300.0  # issue 15: 400 trials × 20 orders × all pruners in ≤ 5 minutes on 2 cores
PACKAGES = ("hpo", "predictors", "trainers", "kernels")


def finetune_curves(n_trials: int = 400, n_evals: int = 50, seed: int = 0, prefix: str = "ft") -> list[Curve]:
    """``n_trials`` fine-tuning-like curves with per-trial LR, weight decay and warm-up; cosine decay.

    Each curve has ``n_evals`` evaluations at t̂ = k/n_evals (k = 1 … n_evals). ``meta`` holds lr, wd and
    warmup.
    """
    rng = np.random.default_rng(seed)
    curves = []
    for i in range(n_trials):
        lr = 10 ** rng.uniform(-5, -3)
        wd = 10 ** rng.uniform(-2, math.log10(0.3))
        warmup = float(rng.uniform(0.0, 0.1))
        tau = 1.0 / (lr * wd * STEPS)
        sched = Schedule(kind="cosine", warmup=round(warmup, 4), final=0.1)
        # nqm's own tpp sets how fast its modes learn: 200 gives a fine-tuning-like quick early drop.
        base = nqm_curve(tau, schedule=sched, tpp=200.0, n_points=n_evals, substeps=8,
                         seed=seed * 100_003 + i)
        scale = 1.0 + 0.04 * (math.log10(lr / LR_OPT)) ** 2 + 0.01 * rng.standard_normal()
        loss = base.loss * scale * (1.0 + 0.003 * rng.standard_normal(base.loss.size))
        curves.append(Curve(run=f"{prefix}{i:03d}", t_hat=base.t_hat, loss=loss, schedule=sched,
                            tau=tau, tpp=TPP, meta={"lr": lr, "wd": wd, "warmup": warmup}))
    return curves


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def time_pruners(args: argparse.Namespace, orders: int, jobs: int) -> dict[str, dict]:
    """Replay the sweep through each pruner; per pruner: wall and CPU seconds, summary row, decisions."""
    from collapse_hpo.hpo.replays import peers
    from collapse_hpo.hpo.replays.replay import format_row, make_sweep, replay
    from collapse_hpo.predictors.calibrate import calibrate

    if args.sweep == "lora":
        sys.path.insert(0, str(HERE))
        from surestop_lora import read_surestop_lora, split_nights

        runs = read_surestop_lora()
        sweep = make_sweep(runs, name="surestop_lora")
        surrogate = calibrate(split_nights(runs)[0]).surrogate
    else:
        sweep = make_sweep(finetune_curves(args.trials, args.evals, seed=0), name="finetune")
        surrogate = calibrate(finetune_curves(24, args.evals, seed=1, prefix="ref")).surrogate
    names = [n for n in (args.pruner or peers.available_names()) if n not in args.skip]
    for name in list(peers.unavailable(names)):
        print(f"{name} skipped: its library is not installed", file=sys.stderr)
        names.remove(name)
    has_jobs = "jobs" in inspect.signature(replay).parameters
    out: dict[str, dict] = {}
    for name in names:
        stats: dict[str, dict[str, int]] = {}
        extra = {"jobs": jobs, "stats": stats} if has_jobs else {}
        w0, c0 = time.perf_counter(), _cpu()
        (s,), details = replay(sweep, [peers.factory(name, surrogate=surrogate)], orders=orders,
                               workers=args.workers, **extra)
        wall, cpu = time.perf_counter() - w0, _cpu() - c0
        print(f"{wall:8.1f} s wall {cpu:8.1f} s CPU  {format_row(s)}", file=sys.stderr, flush=True)
        counts = stats.get(name, {})
        if counts.get("prediction_misses") or counts.get("fit_misses"):
            print(f"           caches: {counts}", file=sys.stderr, flush=True)
        out[name] = {"wall": wall, "cpu": cpu, "orders": orders, "jobs": jobs if has_jobs else 1,
                     "compute": s.compute, "pruned_rate": s.pruned_rate, "caches": counts,
                     "stopped_at": [r.stopped_at.tolist() for r in details[name]]}
    return out


def _shim(code: Path, into: Path) -> None:
    """A folder whose ``collapse_hpo`` package is ``code``'s (links to its top-level folders and its
    ``collapse_hpo/__init__.py``). A regular package, not a namespace one: Python prefers a regular
    ``collapse_hpo`` anywhere later on the path (this checkout's, e.g. through the current directory) to a
    namespace package, which made the "before" code this checkout's own."""
    pkg = into / "collapse_hpo"
    pkg.mkdir()
    init = code / "collapse_hpo" / "__init__.py"
    if init.is_file():
        (pkg / "__init__.py").symlink_to(init)
    else:
        (pkg / "__init__.py").write_text("")
    for name in PACKAGES:
        if (code / name).is_dir():
            (pkg / name).symlink_to(code / name)


def run_other(code: Path, args: argparse.Namespace, orders: int) -> dict[str, dict]:
    """Time the pruners with another checkout's code, in a child process (one job)."""
    with tempfile.TemporaryDirectory() as tmp:
        _shim(code.resolve(), Path(tmp))
        result = Path(tmp) / "result.json"
        cmd = [sys.executable, __file__, "--sweep", args.sweep, "--trials", str(args.trials),
               "--evals", str(args.evals),
               "--orders", str(orders), "--workers", str(args.workers), "--jobs", "1",
               "--worker-out", str(result)]
        for p in args.pruner or []:
            cmd += ["--pruner", p]
        for p in args.skip:
            cmd += ["--skip", p]
        # no empty entry after the shim: an empty PYTHONPATH entry is the current directory, whose
        # collapse_hpo (this checkout's, run from its root) would come next
        paths = (tmp, os.environ.get("PYTHONPATH"))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
        check = [sys.executable, "-c", "import collapse_hpo.hpo as h; print(h.__path__[0])"]
        where = subprocess.run(check, check=True, env=env, cwd=tmp, capture_output=True,
                               text=True).stdout.strip()
        if Path(where).resolve() != (code / "hpo").resolve():
            raise SystemExit(f"--compare: the other code would import {where}, not {code / 'hpo'}")
        subprocess.run(cmd, check=True, env=env)
        return json.loads(result.read_text())


#: Issue 20 item 5: replaying collapse or collapse-online on 200 trials × 50 reports, seconds per order.
TARGET_PER_ORDER_S = 5.0


def per_order_table(after: dict[str, dict], before: dict[str, dict] | None, workers: int) -> str:
    """Seconds per order of each pruner on the real fine-tuning sweep (``--sweep lora``)."""
    lines = [f"Replay of surestop_lora (197 real LoRA runs × 50 evaluations), {workers} concurrent workers; "
             "seconds per order (the first order of a pruner fills the caches that later orders share).", ""]
    head = "| pruner | orders | jobs | wall / order | CPU / order |"
    rule = "|---|---:|---:|---:|---:|"
    if before:
        head += " before: wall / order | before: CPU / order | same decisions |"
        rule += "---:|---:|---|"
    lines += [head, rule]
    for name, a in after.items():
        row = (f"| {name} | {a['orders']} | {a['jobs']} | {a['wall'] / a['orders']:.1f} | "
               f"{a['cpu'] / a['orders']:.1f} |")
        if before and name in before:
            b, k = before[name], before[name]["orders"]
            same = "yes" if a["stopped_at"][:k] == b["stopped_at"][:k] else "NO"
            row += f" {b['wall'] / k:.1f} | {b['cpu'] / k:.1f} | {same} (first {k} orders) |"
        lines.append(row)
    for name in ("collapse", "collapse-online"):
        if name in after:
            a = after[name]
            per = a["cpu"] / a["orders"]
            lines.append(f"\n{name}: {per:.1f} CPU s per order; target ≤ {TARGET_PER_ORDER_S:g} s per order "
                         f"on one core: {'met' if per <= TARGET_PER_ORDER_S else 'missed'}.")
    return "\n".join(lines)


def table(after: dict[str, dict], before: dict[str, dict] | None, args: argparse.Namespace) -> str:
    """The Markdown table of the timings (and the comparison with ``before``)."""
    lines = [
        f"Replay of a {args.trials}-trial fine-tuning-like sweep ({args.evals} evaluations per trial), "
        f"{args.orders} orders, {args.workers} concurrent workers; seconds.",
        "",
    ]
    if before:
        head = "| pruner | before: wall | after: wall | after: CPU | speed-up | same decisions |"
        lines += [head, "|---|---:|---:|---:|---:|---|"]
    else:
        lines += ["| pruner | wall | CPU | pruned |", "|---|---:|---:|---:|"]
    tot_b = tot_a = tot_c = 0.0
    for name, a in after.items():
        tot_a += a["wall"]
        tot_c += a["cpu"]
        if before and name in before:
            b = before[name]
            est = b["wall"] * args.orders / b["orders"]
            tot_b += est
            mark = "" if b["orders"] == args.orders else "≈"
            k = b["orders"]
            same = "yes" if a["stopped_at"][:k] == b["stopped_at"][:k] else "NO"
            speed = f"{est / a['wall']:.1f}×" if a["wall"] > 0 else "-"
            lines.append(f"| {name} | {mark}{est:.1f} | {a['wall']:.1f} | {a['cpu']:.1f} | {speed} | "
                         f"{same} (first {k} orders) |")
        else:
            lines.append(f"| {name} | {a['wall']:.1f} | {a['cpu']:.1f} | {a['pruned_rate']:.2f} |")
    if before:
        lines.append(f"| **total** | ≈{tot_b:.0f} | {tot_a:.0f} | {tot_c:.0f} | {tot_b / tot_a:.1f}× | |")
    else:
        lines.append(f"| **total** | {tot_a:.0f} | {tot_c:.0f} | |")
    for name, a in after.items():
        c = a.get("caches") or {}
        if c.get("fit_misses"):
            lines.append("")
            lines.append(
                f"{name}: {c['fit_misses']} online fits in {a['orders']} orders, {c['fit_hits']} answered "
                f"by the cache (the same completed trials in the same order); {c['fit_set_repeats']} more "
                "would have been with a key by the set of completed trials alone.")
    jobs = max(a["jobs"] for a in after.values())
    lines += ["", f"After: {jobs} job(s). Target ≤ {TARGET_S:.0f} s wall on 2 cores: "
              f"{'met' if tot_a <= TARGET_S else 'missed'} ({tot_a:.0f} s)."]
    if before:
        k = min(b["orders"] for b in before.values())
        lines.append(f"Before: measured on the first {k} order(s) in one process, extrapolated to "
                     f"{args.orders} (≈).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sweep", choices=("finetune", "lora"), default="finetune",
                    help="finetune: the synthetic sweep (--trials); lora: the 197 real surestop_lora runs")
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--evals", type=int, default=50)
    ap.add_argument("--orders", type=int, default=20)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=2, help="processes (where the code has them; default 2)")
    ap.add_argument("--pruner", action="append", default=None, help="repeatable; default: all")
    ap.add_argument("--skip", action="append", default=[], help="a pruner to leave out (repeatable)")
    ap.add_argument("--compare", default=None, help="another checkout to time first (e.g. /work/main)")
    ap.add_argument("--before-orders", type=int, default=2, help="orders timed with --compare's code")
    ap.add_argument("--out", default=str(HERE / "artifacts"))
    ap.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker_out:
        Path(args.worker_out).write_text(json.dumps(time_pruners(args, args.orders, args.jobs)))
        return 0
    before = None
    if args.compare:
        print(f"before: the code of {args.compare}, {args.before_orders} order(s)", file=sys.stderr)
        before = run_other(Path(args.compare), args, min(args.before_orders, args.orders))
    print(f"after: this checkout, {args.orders} orders, {args.jobs} job(s)", file=sys.stderr)
    after = time_pruners(args, args.orders, args.jobs)
    lora = args.sweep == "lora"
    text = per_order_table(after, before, args.workers) if lora else table(after, before, args)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from collapse_hpo.predictors.atomic import atomic_write

    name = "replay_speed_lora.md" if args.sweep == "lora" else "replay_speed.md"
    with atomic_write(out / name, "w") as fh:
        fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
