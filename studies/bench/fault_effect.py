"""What the injected loss-normalization fault does to a ~100K-parameter, 20-TPP run (not a test).

Trains clean runs (seeds) and faulty runs (fault on from t̂ = 0.4), then prints, at several t̂, the normalized
residual of each run against the clean reference run and the raw loss's rise above its running minimum:

- residual r(t̂) = L_run(t̂)/c − L_ref(t̂)/L_ref(1), with c the early-align divisor fitted on t̂ ∈ [0.2, 0.4]
  (before the fault) so that L_run/c matches the reference's normalized curve there (METHOD.md §4, §6);
- raw rise(t̂) = L_run(t̂) − min_{t' ≤ t̂} L_run(t'), both on a 5-point moving average of the reported loss.

    .venv/bin/python studies/bench/fault_effect.py --cache /tmp/fault_runs --strengths 0.03 0.1 0.3

Each run's curve is cached as ``<cache>/<name>.csv`` (curve format) and reused when present; ``--workers``
runs train in parallel processes (one torch thread each).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from collapse_hpo.predictors.curves import read_curves_csv, write_curves_csv
from collapse_hpo.trainers.config import FAULT_ACKNOWLEDGEMENT, FaultConfig, TrainConfig
from collapse_hpo.trainers.train import train


def smooth(y: np.ndarray, k: int = 5) -> np.ndarray:
    """Trailing moving average over k points (shorter at the start)."""
    c = np.cumsum(np.insert(y, 0, 0.0))
    out = np.empty_like(y)
    for i in range(len(y)):
        lo = max(0, i + 1 - k)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out


def _run(job: tuple[str, TrainConfig, str]) -> tuple[str, float, float]:
    name, config, cache = job
    t0 = time.perf_counter()
    result = train(config)
    write_curves_csv(Path(cache) / f"{name}.csv", [result.to_curve(name)])
    return name, result.final_loss, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--tpp", type=float, default=20.0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--tau", type=float, default=0.175)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="clean runs (first = reference)")
    ap.add_argument("--fault-seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--strengths", type=float, nargs="+", default=[0.1])
    ap.add_argument("--rows-fraction", type=float, default=0.5)
    ap.add_argument("--start", type=float, default=0.4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache", default="/tmp/fault_runs")
    args = ap.parse_args()

    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    base = TrainConfig(width=args.width, depth=args.depth, heads=4, tpp=args.tpp, lr=args.lr, tau=args.tau,
                       threads=1, report_every_tokens=4096 * 4)
    jobs: list[tuple[str, TrainConfig, str]] = []
    for seed in args.seeds:
        jobs.append((f"clean_s{seed}", replace(base, seed=seed), str(cache)))
    for s in args.strengths:
        for seed in args.fault_seeds:
            fault = FaultConfig(acknowledge=FAULT_ACKNOWLEDGEMENT, start_t_hat=args.start, strength=s,
                                rows_fraction=args.rows_fraction)
            jobs.append((f"fault{s:g}_s{seed}", replace(base, seed=seed, fault=fault), str(cache)))
    todo = [j for j in jobs if not (cache / f"{j[0]}.csv").exists()]
    with mp.get_context("spawn").Pool(max(1, args.workers)) as pool:
        for name, final, seconds in pool.imap_unordered(_run, todo):
            print(f"{name}: final {final:.4f} ({seconds:.0f} s)", flush=True)

    curves = {j[0]: read_curves_csv(cache / f"{j[0]}.csv")[0] for j in jobs}
    ref = curves[jobs[0][0]]
    t = ref.t_hat
    ref_l = smooth(ref.loss)
    ref_n = ref_l / ref_l[-1]
    window = (t >= 0.2) & (t <= args.start)
    grid = [0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    print(f"\nnormalized residual r(t̂) vs {jobs[0][0]} (align window 0.2-{args.start}) | raw rise above "
          f"running min (nats)")
    print(f"{'run':>16} {'final':>7} " + " ".join(f"r@{g:.1f}".rjust(8) for g in grid) + " | "
          + " ".join(f"rise@{g:.1f}".rjust(9) for g in grid))
    for name, c in curves.items():
        loss = smooth(c.loss)
        u = np.sum(loss[window] * ref_n[window]) / np.sum(loss[window] ** 2)
        resid = loss * u - ref_n
        rise = loss - np.minimum.accumulate(loss)
        idx = [int(np.argmin(np.abs(t - g))) for g in grid]
        print(f"{name:>16} {c.loss[-1]:7.4f} " + " ".join(f"{resid[i]:8.4f}" for i in idx) + " | "
              + " ".join(f"{rise[i]:9.4f}" for i in idx), flush=True)


if __name__ == "__main__":
    main()
