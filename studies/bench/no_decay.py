"""Sweeps without weight decay: what ``collapse-online`` decides before its first fit, and what it shows.

A trial trained without weight decay has no AdamW timescale (τ infinite, ``tau`` None). The builtin prior's b
follows a τ power law, b = b_c · τ^b_e, fitted on runs with weight decay; this script replays real sweeps
without weight decay through ``collapse-online`` (the builtin prior until 3 trials complete, then fits on the
completed trials) and counts, per sweep: the compute (share of the unpruned sweep's FLOPs), the regret, the
share of orders whose best trial was cut, the prunes, the share of prunes that show a predicted final loss
and an interval, and how many of the shown intervals hold the pruned trial's true final loss.

Data (out of sample: ../shared/extdata, never used to choose anything but checked here): qiu_supercollapse
**chess**, one sweep per seed (5 seeds × 8 widths, linear decay to 0, no weight decay; t̂ = compute / final
compute; trials weighted by their compute), studies/bench/evidence.py's ``qiu_chess_curves``.

Also printed: the prior's shape miss on those curves (``predictors.prior.shape_miss``, RMS per unit of ln t̂,
each curve predicted from its first half) with b at several stand-in timescales and at the law's limit
τ → ∞, beside its miss on its own family's τ-held LR sweep.

Usage::

    .venv/bin/python studies/bench/no_decay.py [--orders 10] [--extdata ../shared/extdata] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from evidence import mpl_curves, qiu_chess_curves  # noqa: E402
from shown_intervals import replay_prunes  # noqa: E402

from collapse_hpo.hpo.replays import peers  # noqa: E402
from collapse_hpo.hpo.replays.replay import make_sweep, random_orders, simulate, summarize  # noqa: E402
from collapse_hpo.predictors.curves import read_curves_csv  # noqa: E402
from collapse_hpo.predictors.prior import load_prior, reaching_curves, shape_miss  # noqa: E402

ART = HERE / "artifacts"
EXTDATA = HERE.parents[2] / "shared" / "extdata"
SEEDS = (0, 1, 2, 3, 4)
WORKERS = 4


def log(msg: str) -> None:
    print(msg, flush=True)


def rms_miss(prior, curves) -> tuple[float, int]:
    us = [shape_miss(prior, c, r) for c, r in reaching_curves(curves)]
    us = [u for u in us if u is not None]
    return (float(math.sqrt(np.mean(np.square(us)))) if us else math.nan), len(us)


def part_shape(md: list[str], extdata: Path) -> None:
    prior, _ = load_prior("builtin")
    chess = [c for s in SEEDS for c in qiu_chess_curves(extdata / "qiu_supercollapse", s)[0]]
    md += ["## The builtin prior's shape on qiu chess (no weight decay)", "",
           f"b = b_c · τ^b_e with b_c = {prior.b_c:.4g}, b_e = {prior.b_e:.4g}; RMS shape miss per unit of "
           "ln t̂ (each curve reaching R predicted from R/2), over the curves that test it (the "
           "furthest-reaching 16, `MAX_TESTED`, of the 5 seeds' 40).", "",
           "| b from | b | RMS miss | curves |", "|---|---:|---:|---:|"]
    for label, tau in (("τ = 0.18 (the prior's largest)", 0.18), ("τ = 1", 1.0), ("τ = 10³", 1e3),
                       ("τ = 10⁶", 1e6), ("τ = 10¹²", 1e12)):
        b = prior.b_c * tau**prior.b_e
        miss, n = rms_miss(replace(prior, tau_law="constant", b_c=b, b_e=0.0), chess)
        md.append(f"| {label} | {b:.4f} | {miss:.4f} | {n} |")
    if prior.b_e < 0:
        miss, n = rms_miss(replace(prior, no_decay_limit=True), chess)
        md.append(f"| τ → ∞ (the law's limit, what the online reference now serves) | 0 | {miss:.4f} | {n} |")
    own, n = rms_miss(prior, read_curves_csv(ART / "curves_lr_tau_full.csv"))
    md += [f"| (its own family: the 99K τ-held LR sweep, with τ) | – | {own:.4f} | {n} |", ""]
    log("\n".join(md[-10:]))


def sweeps(extdata: Path) -> list:
    """qiu chess, one sweep per seed (trials weighted by their FLOPs), then mpl_luo2025's 4 schedules ending
    at 24,000 steps per size (τ not recorded: served as runs without weight decay)."""
    out = []
    for seed in SEEDS:
        curves, weights = qiu_chess_curves(extdata / "qiu_supercollapse", seed)
        sweep = make_sweep(curves, n_reports=50, name=f"qiu_chess_s{seed}")
        sweep.weights = np.asarray(weights, dtype=float) / max(weights)
        out.append(sweep)
    if (extdata / "mpl_luo2025").is_dir():
        out += [make_sweep(mpl_curves(extdata / "mpl_luo2025", s), n_reports=50, name=f"mpl_{s}M")
                for s in (25, 100, 400)]
    return out


def part_replay(md: list[str], extdata: Path, orders: int) -> None:
    md += ["## collapse-online on sweeps without weight decay", "",
           f"{orders} random orders per sweep, {WORKERS} workers, 50 reports; qiu chess: one sweep per seed, "
           "compute weighted by each trial's FLOPs; mpl_luo2025: 4 schedules per size, τ not recorded.", "",
           "| sweep | compute | mean regret | best cut | prunes | with a prediction | shown interval holds "
           "the final |", "|---|---:|---:|---:|---:|---:|---:|"]
    tot = np.zeros(3)  # prunes, shown, held over every sweep
    for sweep in sweeps(extdata):
        t0 = time.perf_counter()
        results = []
        prunes = shown = held = 0
        for k, order in enumerate(random_orders(sweep.n_trials, orders, seed=0)):
            adapter = peers.factory("collapse-online")()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results.append(simulate(sweep, adapter, order, workers=WORKERS, seed=k))
            # shown: a predicted interval; held: it holds the final loss (online_reference.py's counts)
            entries = replay_prunes(sweep, adapter, all_prunes=True)
            prunes += len(entries)
            shown_ones = [e for e in entries if e["after"][0] is not None]
            shown += len(shown_ones)
            held += sum(e["after"][0] <= e["final"] <= e["after"][1] for e in shown_ones)
        tot += (prunes, shown, held)
        s = summarize(sweep, results)
        cov = f"{held / shown:.2f}" if shown else "–"
        share = f"{shown / prunes:.2f}" if prunes else "–"
        md.append(f"| {sweep.name} | {s.compute:.3f} | {100 * s.relative_regret:.3f}% | "
                  f"{s.best_pruned_rate:.2f} | {prunes} | {share} | {cov} |")
        log(f"{md[-1]}   ({time.perf_counter() - t0:.0f} s)")
    p, s, h = tot
    md += [f"| **all** | | | | {int(p)} | {s / p if p else math.nan:.2f} | "
           f"{h / s if s else math.nan:.2f} |", ""]
    log(md[-2])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orders", type=int, default=10)
    ap.add_argument("--extdata", type=Path, default=EXTDATA)
    ap.add_argument("--skip-shape", action="store_true")
    ap.add_argument("--out", type=Path, default=ART / "no_decay.md")
    args = ap.parse_args(argv)
    if not (args.extdata / "qiu_supercollapse" / "chess_curves.csv.gz").exists():
        raise SystemExit(f"no_decay: {args.extdata}/qiu_supercollapse/chess_curves.csv.gz not found; give "
                         "--extdata (the folder holding ../shared/extdata's data)")
    md = ["# Sweeps without weight decay (studies/bench/no_decay.py)", ""]
    if not args.skip_shape:
        part_shape(md, args.extdata)
    part_replay(md, args.extdata, args.orders)
    args.out.write_text("\n".join(md) + "\n")
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
