"""Benchmark (issue 20): where a collapse pruner's compute goes on a sweep, and the least it could spend.

Each sweep of ``frontier.py``'s families (``--family``; the same curves, grids and ``collapse`` references) is
replayed with ``collapse`` (its family's reference) and ``collapse-online`` (no reference: the builtin prior,
then fits on the sweep's completed trials) over ``--orders`` trial orders on 4 workers, and each trial's
tokens are put in one part, by how the trial ended and by its last decision's reference label:

- pruned by t̂ ``EARLY_END`` (the first judgements, at the default ``min_fraction``), or pruned later;
- completed while the prior served (the label starts ``prior:``), or completed under a fit or a calibrated
  reference (the final gap of these to the sweep's best is printed: a near-tie a zero-regret rule keeps).

The parts add up to the replay's compute (a share of the unpruned sweep's tokens). ``floor`` is what the
same replay would have spent had every trial that was not pruned by t̂ ``EARLY_END`` and did not complete
while the prior served been pruned at its first judgement (``MIN_FRACTION``), bar the best trial, which
completes: the least a sharper rule after the prior phase could spend at the same judging start and the same
prior phase. A target below it cannot be met by tuning the margins of judgements made under a fit or a
reference; only by judging earlier or by a shorter prior phase.

    nice -n 5 .venv/bin/python studies/bench/compute_spend.py --family lora [--orders 10]

About 1 minute for the lora family (10 orders) on the 2-core machine; every family: about 6 minutes.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import frontier  # noqa: E402

from collapse_hpo.hpo.replays import peers  # noqa: E402
from collapse_hpo.hpo.replays.replay import Sweep, random_orders, simulate  # noqa: E402
from collapse_hpo.hpo.rule.decision import EARLY_JUDGEMENT, PruneSettings  # noqa: E402
from collapse_hpo.hpo.rule.record import read_log  # noqa: E402

#: The default ``min_fraction``: where judging starts.
MIN_FRACTION = PruneSettings().min_fraction
#: A prune at or before this t̂ is one of the first judgements (``EARLY_JUDGEMENT`` × ``MIN_FRACTION``).
EARLY_END = EARLY_JUDGEMENT * MIN_FRACTION
PRIOR_LABEL = "prior:"


@dataclass
class Spend:
    """One pruner on one sweep, averaged over orders: compute by part (shares of the unpruned tokens), trials
    per order by part, the final gaps to the best of the trials completed under a fit or a reference, the
    best-cut count and the floor (module docstring)."""

    sweep: str
    pruner: str
    orders: int
    total: float
    early: float
    later: float
    completed_prior: float
    completed_fit: float
    n_early: float
    n_later: float
    n_prior: float
    n_fit: float
    fit_gaps: list[float]
    best_cut: int
    floor: float


def spend(sweep: Sweep, pruner: str, surrogate: Any, orders: int, workers: int = 4) -> Spend:
    """Replay ``pruner`` (``collapse`` with ``surrogate``, or ``collapse-online``) on ``sweep`` and split
    its compute (module docstring)."""
    make = peers.factory(pruner, surrogate=surrogate)
    w = np.asarray(sweep.weights, dtype=float) / float(np.sum(sweep.weights))
    best_final = float(np.min(sweep.finals))
    index = {c.run: i for i, c in enumerate(sweep.curves)}
    parts = np.zeros(4)
    counts = np.zeros(4)
    gaps: list[float] = []
    cut = 0
    floor = 0.0
    for order in random_orders(sweep.n_trials, orders, seed=0):
        adapter = make()
        result = simulate(sweep, adapter, order, workers=workers)
        cut += int(result.best_pruned)
        for t in adapter.study.get_trials(deepcopy=False):
            i = index[t.user_attrs["run"]]
            reached = float(sweep.grid[result.stopped_at[i]] / sweep.grid[-1])
            share = reached * w[i]
            if result.pruned[i]:
                part = 0 if reached <= EARLY_END + 1e-9 else 1
            else:
                log = read_log(t.user_attrs)
                label = (log[-1].reference or "") if log else ""
                part = 2 if label.startswith(PRIOR_LABEL) else 3
                if part == 3:
                    gaps.append(float(sweep.finals[i]) / best_final - 1.0)
            parts[part] += share
            counts[part] += 1
            # as it was: pruned at the first judgements, completed in the prior phase; the best completes
            kept = part in (0, 2) or i == sweep.best
            floor += share if kept else MIN_FRACTION * w[i]
    parts /= orders
    counts /= orders
    return Spend(sweep.name, pruner, orders, float(parts.sum()), *map(float, parts), *map(float, counts),
                 gaps, cut, floor / orders)


def _gaps(gaps: list[float]) -> str:
    if not gaps:
        return "–"
    g = 100 * np.asarray(gaps)
    return f"{np.median(g):.2f}% / {np.quantile(g, 0.9):.2f}%"


def markdown(rows: list[Spend]) -> str:
    """The table of ``rows``."""
    out = [
        f"| sweep | pruner | compute | pruned by t̂ {EARLY_END:.3g} | pruned later | completed, prior | "
        "completed, fit or reference | their final gap to the best (median / 90th pct) | best cut | floor |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r.sweep} | {r.pruner} | {r.total:.3f} | {r.early:.3f} ({r.n_early:.1f}) | "
            f"{r.later:.3f} ({r.n_later:.1f}) | {r.completed_prior:.3f} ({r.n_prior:.1f}) | "
            f"{r.completed_fit:.3f} ({r.n_fit:.1f}) | {_gaps(r.fit_gaps)} | {r.best_cut} of {r.orders} | "
            f"{r.floor:.3f} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--orders", type=int, default=10)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--pruner", action="append", choices=("collapse", "collapse-online"),
                    help="repeatable (default: both)")
    frontier.add_family_arguments(ap)
    args = ap.parse_args(argv)
    if args.orders < 1 or args.workers < 1:
        ap.error("--orders and --workers must be at least 1")
    rows = []
    for fam in frontier.load_families(args):
        for sweep, surrogate in zip(fam.sweeps, fam.surrogates, strict=True):
            for name in args.pruner or ("collapse", "collapse-online"):
                if name == "collapse" and surrogate is None:
                    continue
                frontier.log(f"{fam.name}: {sweep.name}, {name}")
                rows.append(spend(sweep, name, surrogate if name == "collapse" else None, args.orders,
                                  args.workers))
    print("Trials per order in brackets; compute as a share of the unpruned sweep's tokens.\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
