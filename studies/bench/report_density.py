"""Our defaults on the frontier's sweeps at their own report density, not resampled to 50 reports.

``frontier.py`` resamples every sweep to 50 report points per trial (``frontier.REPORTS``, as §6 and §11 did),
so that sweeps whose trials logged at different steps share one grid. The trained curves hold 73–100 points
each (a loss about every 1% of training), and a live sweep judges a trial at every report: the early loss
ratio's window and the number of judgements both follow the density. This replays ``collapse`` (with the
reference ``frontier.py`` gives each sweep) and ``collapse-online`` at their defaults on each sweep twice —
resampled to 50 reports and at the sweep's median report count (``make_sweep``'s default) — over the same 10
orders with 4 workers, and prints compute / mean regret / share of orders with the best cut. surestop_lora is
left out: its native grid is the 50 evaluations the frontier uses. ``--family dev`` replays the 25K
development sweeps of ``pruning_rule.py`` (τ-held and λ-fixed, LR and batch, two seeds each: where §6 chose
the margin) with that script's reference, calibrated on the development set's collapse family, 20 orders as
there. About 1 minute per part on the 2-core machine.

    nice -n 5 .venv/bin/python studies/bench/report_density.py [--family lambda ...] [--family dev]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import frontier

from collapse_hpo.hpo.replays import peers
from collapse_hpo.hpo.replays.replay import make_sweep, replay

FAMILIES = ("tau", "lambda", "random", "quickstart")
DEV_ORDERS = 20  # pruning_rule.py's orders


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--orders", type=int, default=10)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=2)
    frontier.add_family_arguments(ap, FAMILIES, extra=("dev",))
    args = ap.parse_args(argv)
    args.family = args.family or list(FAMILIES)
    print("| family | sweep | reports | collapse: compute / mean regret / best cut | collapse-online |")
    print("|---|---|---:|---|---|")
    groups = [(fam.name, fam.sweeps, fam.surrogates, args.orders)
              for fam in (frontier.load_families(args) if set(args.family) - {"dev"} else [])]
    if "dev" in args.family:
        import pruning_rule

        reference, _ = pruning_rule.reference(pruning_rule.DEV)
        sweeps = [s for f in pruning_rule.FAMILIES for s in pruning_rule.sweeps(pruning_rule.DEV, f)]
        groups.append(("development (25K)", sweeps, [reference] * len(sweeps), DEV_ORDERS))
    for name, resampled_sweeps, references, orders in groups:
        for resampled, reference in zip(resampled_sweeps, references):
            ours = (peers.factory("collapse", surrogate=reference), peers.factory("collapse-online"))
            for sweep in (resampled, make_sweep(resampled.curves, name=resampled.name)):
                cells = []
                for factory in ours:
                    s = replay(sweep, [factory], orders=orders, workers=args.workers, jobs=args.jobs)[0][0]
                    cells.append(f"{s.compute:.3f} / {100 * s.relative_regret:.2f}% / "
                                 f"{s.best_pruned_rate:.2f}")
                print(f"| {name} | {sweep.name} | {sweep.grid.size} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    main()
