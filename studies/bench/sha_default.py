"""Issue 20's second zero-regret target: "At ≤ 0.3% mean regret, compute is at most half of SHA's at its
default", per sweep family.

SHA at its default is Optuna's ``SuccessiveHalvingPruner()`` (the replay peer ``sha``: reduction factor 4,
``min_resource="auto"``, rungs from 1% of training), which the frontier grid (``peers.FRONTIER_KNOBS["sha"]``)
does not hold. It is replayed here on every family of ``frontier.py`` (same sweeps, 10 orders, 4 workers, the
same trial orders); ours are read from ``frontier.csv`` (the cheapest setting of ``collapse`` and of
``collapse-online`` at a mean regret ≤ 0.3%, each averaged over the family's sweeps as in frontier.md). Prints
a markdown table. About 1 minute on the 2-core machine.

    nice -n 5 .venv/bin/python studies/bench/sha_default.py [--family lora ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import frontier  # noqa: E402

from collapse_hpo.hpo.replays import peers  # noqa: E402
from collapse_hpo.hpo.replays.replay import replay  # noqa: E402

LEVEL = 0.003  # the target's mean regret (relative: 0.3%)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--orders", type=int, default=10)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--points", default=str(frontier.ART / "frontier.csv"), help="frontier.csv of ours")
    frontier.add_family_arguments(ap)
    args = ap.parse_args(argv)
    points = frontier.read_points(Path(args.points), args.orders)
    print("| sweep family | SHA default: compute / mean regret / best cut | half of it | ours at ≤ 0.3%: "
          "collapse | collapse-online | target |")
    print("|---|---|---:|---|---|---|")
    for fam in frontier.load_families(args):
        rows = [replay(s, [peers.factory("sha")], orders=args.orders, workers=args.workers)[0][0]
                for s in fam.sweeps]
        compute = sum(r.compute for r in rows) / len(rows)
        regret = sum(r.relative_regret for r in rows) / len(rows)
        cut = sum(r.best_pruned_rate for r in rows) / len(rows)
        cells = []
        met = []
        for ours in peers.FRONTIER_OURS:
            per_sweep = [[p for p in points if p.sweep == s.name and p.family == ours] for s in fam.sweeps]
            if not all(per_sweep):
                cells.append("-")
                continue
            best = frontier.cheapest(frontier.averaged(fam.name, per_sweep), ours, LEVEL)
            if best is None:
                cells.append("none")
                met.append(False)
                continue
            cells.append(f"{best.compute:.3f} ({best.setting.split('[', 1)[-1].rstrip(']')}; regret "
                         f"{100 * best.regret:.3f}%, best cut {best.best_cut:.2f})")
            met.append(best.compute <= 0.5 * compute)
        verdict = "met" if met and all(met) else ("met by collapse only" if met and met[0] else "missed")
        print(f"| {fam.name} | {compute:.3f} / {100 * regret:.2f}% / {cut:.2f} | {0.5 * compute:.3f} | "
              f"{cells[0]} | {cells[1]} | {verdict} |", flush=True)


if __name__ == "__main__":
    main()
