"""Benchmark (issue 20; BENCHMARKS §40–§41): how often a winners' lead learned on a small reference cuts the
next sweep's best.

A reference's winners' lead (``Surrogate.lead_bands``, ``calibrate.lead_bands_of``) is the largest lead a run
that ended worse had over one of the reference's best runs: the largest of many leads, read off a few runs.
A reference whose few best runs all started fast carries a lead far below the next sweep's crossings, and
``collapse`` then cuts that sweep's best. This script draws references at random from one sweep (the *pool*)
and replays another sweep with each:

- pools: ``random_s1->random_s0`` and ``random_s0->random_s1`` (our random-config sweeps, 48 runs each; each
  the other's reference, as ``frontier.py``) and ``surestop_earlier->later`` (surestop_lora's earlier nights,
  90 runs, as references of its later nights' 107, as ``frontier.py``);
- per pool and size n (``--sizes``), ``--draws`` subsets of n runs (``numpy.random.default_rng(--seed)``,
  drawn in the order pool, size, draw, without replacement; a size at or above the pool's is the whole pool,
  drawn once), each calibrated once (``calibrate`` at its defaults);
- for each ``--top-min`` k, the subset's lead is read off its best max(k, 5%) runs (``lead_bands_of(...,
  top_min=k)``) and ``collapse`` replays the other sweep over ``--orders`` trial orders on 4 workers. The
  replay applies the rule's own gate: below ``decision.LEAD_MIN_RUNS`` runs the lead is not used.

A row per (pool, size, k): references that cut the best in any order, with the orders cut and the worst
regret, and the compute (mean and range over references). ``--out`` writes every reference's row as CSV.
``--min-runs N`` moves the rule's gate (``decision.LEAD_MIN_RUNS``, 40) to N runs for this run
(``lead_gate``), to ask whether a smaller reference's lead is safe (BENCHMARKS §42).

``--online`` asks the same of an online reference, whose lead is read off the sweep's own completed trials
(a fit of 28 of them at gate 20, of 42 at the rule's 40): surestop_lora's later nights, earlier nights and
all 197 runs are replayed with ``collapse-online`` on each of ``--workers`` (comma-separated), a row each.

    nice .venv/bin/python studies/bench/lead_references.py --sizes 40,50 --draws 12 --seed 23 --top-min 3,5
    nice .venv/bin/python studies/bench/lead_references.py --sizes 28,30 --draws 12 --seed 43 --top-min 5 \
        --min-runs 20
    nice .venv/bin/python studies/bench/lead_references.py --online --workers 2,4,8 [--min-runs 20]

About 2 s per replay of 10 orders on the 2-core machine (the command above: 96 references × 2 replays,
about 6 minutes); ``--online --workers 2,4,8``: 9 replays of collapse-online, about 10 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from frontier import REPORTS  # noqa: E402  (the random-config sweeps' report points, as frontier.py)
from surestop_lora import read_surestop_lora, split_nights  # noqa: E402

from collapse_hpo.hpo.replays import peers  # noqa: E402
from collapse_hpo.hpo.replays.replay import Sweep, make_sweep, replay  # noqa: E402
from collapse_hpo.hpo.rule import decision  # noqa: E402
from collapse_hpo.predictors.calibrate import LEAD_FRACTIONS, calibrate, lead_bands_of  # noqa: E402
from collapse_hpo.predictors.curves import Curve, read_curves_csv  # noqa: E402

ART = HERE / "artifacts"
POOLS = ("random_s1->random_s0", "random_s0->random_s1", "surestop_earlier->later")


@dataclass
class Outcome:
    """One reference's replay of the other sweep."""

    pool: str
    size: int
    draw: int
    top_min: int
    compute: float
    orders: int  # trial orders replayed
    orders_cut: int  # orders in which the sweep's best trial was pruned
    max_regret: float  # worst relative regret over the orders


def load_pool(name: str) -> tuple[list[Curve], Sweep]:
    """The reference pool's curves and the sweep its references judge."""
    if name.startswith("random"):
        ref_seed, sweep_seed = (1, 0) if name == "random_s1->random_s0" else (0, 1)
        pool = read_curves_csv(ART / f"curves_random_s{ref_seed}.csv")
        other = read_curves_csv(ART / f"curves_random_s{sweep_seed}.csv")
        return pool, make_sweep(other, n_reports=REPORTS, name=f"random_s{sweep_seed}")
    earlier, later = split_nights(read_surestop_lora())
    return earlier, make_sweep(later, name="surestop_lora_later")


def subsets(n_pool: int, sizes: list[int], draws: int, seed: int) -> Iterator[tuple[int, int, np.ndarray]]:
    """The references drawn from a pool of ``n_pool`` runs: (size, draw, run indices) for ``draws`` subsets
    of each size in turn, without replacement, from one ``numpy.random.default_rng(seed)``; a size at or
    above the pool's is the whole pool, once (it takes nothing from the generator)."""
    rng = np.random.default_rng(seed)
    for size in sizes:
        if size >= n_pool:
            yield n_pool, 0, np.arange(n_pool)
            continue
        for draw in range(draws):
            yield size, draw, rng.choice(n_pool, size, replace=False)


@contextlib.contextmanager
def lead_gate(min_runs: int | None) -> Iterator[None]:
    """Within the block the rule uses a winners' lead from ``min_runs`` reference runs on (None: the rule's
    own ``decision.LEAD_MIN_RUNS``). A benchmark-only override of the module constant ``lead_margin`` reads
    at each call (the replays' forked workers inherit it); restored on exit."""
    if min_runs is None:
        yield
        return
    before = decision.LEAD_MIN_RUNS
    decision.LEAD_MIN_RUNS = min_runs
    try:
        yield
    finally:
        decision.LEAD_MIN_RUNS = before


def replayed(sweep: Sweep, factory: peers.PrunerFactory, orders: int, workers: int,
             jobs: int) -> tuple[float, int, float]:
    """One pruner's replay of ``sweep``, from its ``Summary``: the compute, the orders in which the best
    was cut and the worst relative regret."""
    summary = replay(sweep, [factory], orders=orders, workers=workers, jobs=jobs)[0][0]
    return summary.compute, round(summary.best_pruned_rate * summary.orders), summary.max_relative_regret


def judge(sweep: Sweep, curves: list[Curve], top_mins: list[int], orders: int, jobs: int,
          pool: str, size: int, draw: int) -> list[Outcome]:
    """Calibrate ``curves`` once; replay ``sweep`` with its lead read off each ``top_min``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        surrogate = calibrate(curves).surrogate
    out = []
    for k in top_mins:
        bands = lead_bands_of(curves, LEAD_FRACTIONS, surrogate.align_start, top_min=k)
        ref = replace(surrogate, lead_bands=bands)
        compute, cut, regret = replayed(sweep, peers.factory("collapse", surrogate=ref), orders, 4, jobs)
        out.append(Outcome(pool, size, draw, k, compute, orders, cut, regret))
    return out


ONLINE_SWEEPS = ("surestop_later", "surestop_earlier", "surestop_all")


@dataclass
class OnlineOutcome:
    """One sweep's replay with ``collapse-online`` at one gate and worker count."""

    sweep: str
    workers: int
    min_runs: int
    compute: float
    orders: int
    orders_cut: int
    max_regret: float


def online_sweeps() -> list[Sweep]:
    """surestop_lora's later nights, earlier nights and all 197 runs (``ONLINE_SWEEPS``), each a sweep."""
    runs = read_surestop_lora()
    earlier, later = split_nights(runs)
    return [make_sweep(c, name=n) for c, n in zip((later, earlier, runs), ONLINE_SWEEPS, strict=True)]


def judge_online(sweep: Sweep, workers: int, orders: int, jobs: int) -> OnlineOutcome:
    """Replay ``sweep`` with ``collapse-online`` (as ``collapse-hpo replay``) at the gate now in force."""
    compute, cut, regret = replayed(sweep, peers.factory("collapse-online"), orders, workers, jobs)
    return OnlineOutcome(sweep.name, workers, decision.LEAD_MIN_RUNS, compute, orders, cut, regret)


def online_row(o: OnlineOutcome) -> str:
    """One markdown row of ``online_table``."""
    return (f"| {o.sweep} | {o.workers} | {o.min_runs} | {o.compute:.3f} | {o.orders_cut} of "
            f"{o.orders}{f' ({o.max_regret:.3%})' if o.orders_cut else ''} |")


def online_table(outcomes: list[OnlineOutcome]) -> str:
    """A markdown row per (sweep, workers, gate)."""
    lines = ["| sweep | workers | lead from (completed trials) | compute | best cut (max regret) |",
             "|---|---:|---:|---:|---|"]
    return "\n".join(lines + [online_row(o) for o in outcomes])


def table(outcomes: list[Outcome]) -> str:
    """A markdown row per (pool, size, top_min)."""
    lines = ["| pool → sweep | runs | best runs (at least) | references cutting the best (orders cut, max "
             "regret) | compute mean (range) |", "|---|---:|---:|---|---|"]
    keys = dict.fromkeys((o.pool, o.size, o.top_min) for o in outcomes)
    for pool, size, k in keys:
        rows = [o for o in outcomes if (o.pool, o.size, o.top_min) == (pool, size, k)]
        cut = [o for o in rows if o.orders_cut]
        what = ", ".join(f"{o.orders_cut}/{o.orders} at {o.max_regret:.2%}" for o in cut)
        c = [o.compute for o in rows]
        lines.append(f"| {pool} | {size} | {k} | {len(cut)} of {len(rows)}{' (' + what + ')' if cut else ''} "
                     f"| {np.mean(c):.3f} ({min(c):.3f}–{max(c):.3f}) |")
    return "\n".join(lines)


def int_list(text: str) -> list[int]:
    """A comma-separated list of whole numbers (an argparse type: a bad one is a usage error)."""
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected whole numbers separated by commas, got {text!r}") from None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", action="append", choices=POOLS,
                    help="reference pool (repeatable; default: all)")
    ap.add_argument("--sizes", type=int_list, default="40,50", help="reference sizes, comma-separated (runs)")
    ap.add_argument("--draws", type=int, default=6, help="references drawn per pool and size")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--top-min", type=int_list, default="3,5",
                    help="values of LEAD_TOP_MIN to compare, comma-separated")
    ap.add_argument("--orders", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=2, help="processes per replay")
    ap.add_argument("--out", default=None, help="CSV of every reference's outcome")
    ap.add_argument("--online", action="store_true",
                    help="replay surestop_lora with collapse-online instead (module docstring)")
    ap.add_argument("--workers", type=int_list, default="4",
                    help="--online: concurrent trials, comma-separated")
    ap.add_argument("--min-runs", type=int, default=None,
                    help=f"the lead serves from this many reference runs on (rule: {decision.LEAD_MIN_RUNS})")
    args = ap.parse_args(argv)
    sizes, top_mins = args.sizes, args.top_min
    if min(sizes) < 2 or min(top_mins) < 1 or args.draws < 1 or args.orders < 1:
        ap.error("--sizes must be at least 2 runs, --top-min, --draws and --orders at least 1")
    if args.min_runs is not None and args.min_runs < 2:
        ap.error("--min-runs must be at least 2 runs")
    workers = args.workers
    if min(workers) < 1:
        ap.error("--workers must be at least 1")
    if args.online:
        rows = []
        with lead_gate(args.min_runs):
            for sweep in online_sweeps():
                for w in workers:
                    rows.append(judge_online(sweep, w, args.orders, args.jobs))
                    print(online_row(rows[-1]), file=sys.stderr, flush=True)
        print(online_table(rows))
        return
    outcomes: list[Outcome] = []
    with lead_gate(args.min_runs):
        for pool_name in args.pool or POOLS:
            pool, sweep = load_pool(pool_name)
            for size, draw, idx in subsets(len(pool), sizes, args.draws, args.seed):
                got = judge(sweep, [pool[i] for i in idx], top_mins, args.orders, args.jobs, pool_name, size,
                            draw)
                for o in got:
                    print(f"  {o.pool} n={o.size} draw {o.draw} top_min {o.top_min}: "
                          f"compute {o.compute:.3f}, best cut in {o.orders_cut} of {o.orders}, "
                          f"max regret {o.max_regret:.3%}", file=sys.stderr, flush=True)
                outcomes += got
    print(table(outcomes))
    if args.out:
        with open(args.out, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["pool", "size", "draw", "top_min", "compute", "orders_cut", "max_regret"])
            for o in outcomes:
                w.writerow([o.pool, o.size, o.draw, o.top_min, f"{o.compute:.6f}", o.orders_cut,
                            f"{o.max_regret:.6g}"])


if __name__ == "__main__":
    main()
