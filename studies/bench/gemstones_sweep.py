"""A real architecture sweep no one here trained, as a curve CSV for ``collapse-hpo replay``.

../shared/extdata/gemstones_mcleish2025 (McLeish et al., "Gemstones", MIT; see its PROVENANCE.txt) holds the
training loss of 20–22 model shapes (width × depth, 50M–2B parameters), each trained at a constant LR to a
fixed token budget, an evaluation every 477 steps: ``hot`` (the ``hot_100b+`` file: 22 shapes to 350B tokens,
175 evaluations) and ``ablation`` (``lr_ablation_hot``: 20 shapes, another LR, to 100B tokens, 50
evaluations). Choosing the shape with the lowest loss at the budget is the sweep. As curves: t̂ = tokens /
the run's last tokens, lr 1 (constant), τ empty (not recorded), TPP = tokens / active parameters.

The CSV is written outside the repository (the data are not copied into it); replay it as a user would:

    .venv/bin/python studies/bench/gemstones_sweep.py --which hot --out /tmp/gem_hot.csv
    .venv/bin/collapse-hpo replay /tmp/gem_hot.csv --pruner collapse-online --orders 20
    .venv/bin/collapse-hpo replay /tmp/gem_hot.csv --frontier --orders 10

BENCHMARKS.md §31.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXTDATA = HERE.parents[2] / "shared" / "extdata"
FILES = {
    "hot": "wandb_df_for_fitting_hot_100b+_477.jsonl",
    "ablation": "wandb_df_for_fitting_lr_ablation_hot_477.jsonl",
}


def write_sweep(source: Path, out: Path) -> list[tuple[float, str]]:
    """Write ``source`` (a gemstones jsonl) as a curve CSV at ``out``; return (final loss, run) sorted."""
    runs: dict[str, list[dict]] = defaultdict(list)
    with source.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                runs[row["run_name"]].append(row)
    finals = []
    with out.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["run", "t_hat", "loss", "lr", "tau", "tpp"])
        for run, rows in runs.items():
            rows.sort(key=lambda r: r["step"])
            tokens, params = float(rows[-1]["tokens"]), float(rows[0]["params_active_precise"])
            for r in rows:  # the column "final_loss" is the training loss at that evaluation
                w.writerow([run, float(r["tokens"]) / tokens, r["final_loss"], 1.0, "", tokens / params])
            finals.append((float(rows[-1]["final_loss"]), run))
    return sorted(finals)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--which", choices=sorted(FILES), default="hot")
    ap.add_argument("--extdata", type=Path, default=EXTDATA, help="the shared extdata folder")
    ap.add_argument("--out", type=Path, required=True, help="curve CSV to write (outside the repository)")
    args = ap.parse_args(argv)
    source = args.extdata / "gemstones_mcleish2025" / FILES[args.which]
    if not source.is_file():
        print(f"gemstones_sweep: {source} not found; give --extdata (the folder holding "
              "gemstones_mcleish2025/)", file=sys.stderr)
        return 2
    if HERE.parents[1] in args.out.resolve().parents:
        print(f"gemstones_sweep: --out {args.out} is inside the repository; the data must not be copied "
              "into it: write it under /tmp", file=sys.stderr)
        return 2
    finals = write_sweep(source, args.out)
    print(f"{args.out}: {len(finals)} runs; best {finals[0][1]} {finals[0][0]:.4f}, then "
          + ", ".join(f"{r} +{100 * (v / finals[0][0] - 1):.2f}%" for v, r in finals[1:3]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
