"""Random-configuration CPU sweeps: every trial draws its own controls (issue 15, "per-trial controls").

A random search as users run it: each trial draws its peak LR, AdamW weight decay λ (not τ: τ = B/(ηλD)
moves with every draw), batch size, warm-up fraction, schedule shape (linear or cosine decay to zero) and
seed at random. Every trial trains the same model for the same tokens (``TPP`` tokens per parameter), so t̂
and compute are comparable across trials, but τ, warm-up and schedule differ per trial: nothing can be
compared by equal controls, the case the paired rule's surrogate branch serves.

``sample_configs(n, sweep_seed)`` is the config sampler (pure: a sweep seed fixes every draw). Training
reuses the evidence benchmark's cached, parallel runner (studies/bench/evidence_train.py): every finished run
is written to ``--cache`` as ``<name>.csv|json`` the moment it ends and is never retrained, so a crash or a
kill loses only the runs in flight; rerun the same command to go on. The sweeps are then written as one curve
CSV per sweep seed to ``--out`` (``curves_random_s<seed>.csv``, with ``params``) with a runs table
(``runs_random.csv``: every draw) and ``curves_random.COMMAND.txt`` (the command that made them).

Sizes (2 busy CPU cores, 1 torch thread per process, 2 processes): width 32, depth 2, 24,896 non-embedding
parameters, context 128, 12 TPP = 299K tokens a trial (a few seconds alone; 30-60 s on a machine loaded 7x).

Usage::

    .venv/bin/python studies/bench/random_configs.py                       # 48 trials x sweep seeds 0, 1
    .venv/bin/python studies/bench/random_configs.py --trials 8 --seeds 0  # a smaller sweep
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

from evidence_train import RunSpec, load_family, run_plan  # noqa: E402

from collapse_hpo.predictors import spreadsheet  # noqa: E402
from collapse_hpo.predictors.curves import write_curves_csv  # noqa: E402

FAMILY = "random"
WIDTH = 32
DEPTH = 2
BASE_WIDTH = 32
CONTEXT = 128
TPP = 12.0
#: Hidden-matrix peak LR at the base width (× BASE_WIDTH / WIDTH at the trained width), log-uniform.
LR_RANGE = (2e-3, 1.2e-1)
#: AdamW weight decay λ of the hidden matrices, log-uniform (τ = B/(ηλD) then spans ~0.005-20).
WEIGHT_DECAY_RANGE = (0.2, 5.0)
BATCH_TOKENS = (512, 1024, 2048, 4096)
WARMUP_RANGE = (0.0, 0.25)
SCHEDULE_KINDS = ("linear", "cosine")


def run_name(sweep_seed: int, i: int) -> str:
    """The name of draw ``i`` of sweep seed ``sweep_seed`` (``random_s<seed>_<i>``)."""
    return f"{FAMILY}_s{sweep_seed}_{i:02d}"


def sample_configs(n: int, sweep_seed: int, *, width: int = WIDTH, depth: int = DEPTH,
                   base_width: int = BASE_WIDTH, context: int = CONTEXT, tpp: float = TPP) -> list[RunSpec]:
    """``n`` random trial configurations of one sweep; the same ``sweep_seed`` gives the same draws.

    Each draw: peak LR log-uniform in ``LR_RANGE`` (× base_width / width), λ log-uniform in
    ``WEIGHT_DECAY_RANGE``, batch tokens from ``BATCH_TOKENS``, warm-up uniform in ``WARMUP_RANGE``
    (fraction of the trial's tokens), schedule kind from ``SCHEDULE_KINDS`` (decay to zero), and a
    model/data seed. The trial's tokens are ``tpp`` · N rounded to whole batches. ``meta`` holds the draw
    (lr, weight_decay, batch_tokens, warmup, schedule, seed, sweep_seed).
    """
    from collapse_hpo.predictors.errors import InputError
    from collapse_hpo.predictors.schedules import Schedule

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InputError(f"random_configs: the number of trials must be a positive integer, got {n!r}")
    rng = np.random.default_rng([sweep_seed, 1515])
    lr_lo, lr_hi = (v * base_width / width for v in LR_RANGE)
    out: list[RunSpec] = []
    for i in range(n):
        lr = float(np.exp(rng.uniform(math.log(lr_lo), math.log(lr_hi))))
        wd = float(np.exp(rng.uniform(*np.log(WEIGHT_DECAY_RANGE))))
        batch = int(rng.choice(BATCH_TOKENS))
        warmup = float(rng.uniform(*WARMUP_RANGE))
        kind = str(rng.choice(SCHEDULE_KINDS))
        seed = int(rng.integers(0, 2**31 - 1))
        schedule = Schedule(kind=kind, warmup=round(warmup, 4))
        config: dict[str, Any] = {
            "width": width, "depth": depth, "heads": max(1, width // 16), "base_width": base_width,
            "base_depth": depth, "context": context, "tpp": tpp, "batch_tokens": batch, "lr": lr,
            "weight_decay": wd, "schedule": schedule, "seed": seed, "data_seed": seed, "threads": 1,
            "val_fractions": (),
        }
        meta = {"lr": lr, "weight_decay": wd, "batch_tokens": batch, "warmup": schedule.warmup,
                "schedule": kind, "seed": seed, "sweep_seed": sweep_seed}
        out.append(RunSpec(FAMILY, run_name(sweep_seed, i), config, meta=meta))
    return out


def export(cache: Path, out: Path, specs: list[RunSpec], seeds: list[int], command: str) -> list[Path]:
    """Write ``curves_random_s<seed>.csv`` per sweep seed, ``runs_random.csv`` and the COMMAND file."""
    from collapse_hpo.predictors.atomic import atomic_write

    out.mkdir(parents=True, exist_ok=True)
    curves = {c.run: c for c in load_family(cache, FAMILY)}
    written = []
    for s in seeds:
        sel = [curves[r.name] for r in specs if r.meta["sweep_seed"] == s and r.name in curves]
        for c in sel:
            c.params = float(c.meta["params_non_embedding"])
        if sel:
            path = out / f"curves_{FAMILY}_s{s}.csv"
            write_curves_csv(path, sel)
            written.append(path)
    with atomic_write(out / f"runs_{FAMILY}.csv", "w", newline="") as fh:
        w = spreadsheet.writer(fh)
        w.writerow(["run", "sweep_seed", "lr", "weight_decay", "batch_tokens", "warmup", "schedule", "seed",
                    "tau", "total_tokens", "params_non_embedding", "final_loss"])
        for r in specs:
            js = cache / f"{r.name}.json"
            if not js.exists():
                continue
            md = json.loads(js.read_text())["metadata"]
            c = curves.get(r.name)
            m = r.meta
            final = "" if c is None else f"{float(c.loss[-1]):.6g}"
            w.writerow([r.name, m["sweep_seed"], f"{m['lr']:.6g}", f"{m['weight_decay']:.6g}",
                        m["batch_tokens"], f"{m['warmup']:.4g}", m["schedule"], m["seed"], f"{md['tau']:.6g}",
                        md["total_tokens"], md["params_non_embedding"], final])
    with atomic_write(out / f"curves_{FAMILY}.COMMAND.txt", "w") as fh:
        fh.write(f"{command}\n# curves_{FAMILY}_s<seed>.csv: one complete run per trial, run names "
                 f"{FAMILY}_s<sweep seed>_<draw>; the draws in runs_{FAMILY}.csv "
                 "(studies/bench/random_configs.py, sample_configs).\n")
    return written


def main(argv: list[str] | None = None) -> int:
    """Train the sweeps not cached yet, then export them."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=48, help="trials per sweep (default 48)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="sweep seeds (default 0 1)")
    ap.add_argument("--workers", type=int, default=2, help="training processes, 1 thread each (default 2)")
    ap.add_argument("--cache", default=str(REPO / "results" / "random_configs"),
                    help="per-run cache (resumable; default results/random_configs)")
    ap.add_argument("--out", default=str(HERE / "artifacts"), help="folder for the curve CSVs")
    args = ap.parse_args(argv)
    given = " ".join(argv if argv is not None else sys.argv[1:])
    command = f"python studies/bench/random_configs.py {given}".strip()
    specs = [r for s in args.seeds for r in sample_configs(args.trials, s)]
    # interleave the seeds so that an early stop leaves both sweeps partly trained rather than one missing
    order = [r for pair in zip(*[[r for r in specs if r.meta["sweep_seed"] == s] for s in args.seeds])
             for r in pair]
    t0 = time.time()
    failed = run_plan(order, args.cache, workers=args.workers, log=lambda s: print(s, flush=True))
    paths = export(Path(args.cache), Path(args.out), specs, list(args.seeds), command)
    print(f"trained in {time.time() - t0:.0f} s; wrote {', '.join(p.name for p in paths)}", flush=True)
    if failed:
        print(f"failed: {failed} (rerun the same command to retry them)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
