"""Real sweeps no one here trained, as curve CSVs for ``collapse-hpo replay`` (out-of-sample checks).

``gemstones-hot`` / ``gemstones-ablation``: ../shared/extdata/gemstones_mcleish2025 (McLeish et al.,
"Gemstones", MIT; its PROVENANCE.txt) holds the training loss of 20–22 model shapes (width × depth, 50M–2B
parameters), each trained at a constant LR to a fixed token budget, an evaluation every 477 steps: ``hot``
(the ``hot_100b+`` file: 22 shapes to 350B tokens, 175 evaluations) and ``ablation`` (``lr_ablation_hot``: 20
shapes, another LR, to 100B tokens, 50 evaluations). Choosing the shape with the lowest loss at the budget is
the sweep. As curves: t̂ = tokens / the run's last tokens, lr 1 (constant), τ empty (not recorded), TPP =
tokens / active parameters.

``qiu-mlp-schedules``: ../shared/extdata/qiu_supercollapse (Qiu et al., arXiv 2507.02119; research use)
holds a schedule study of an MLP on a synthetic task; its largest group (width 1024, 886 evaluations) is a
sweep of 9 LR schedules at one LR and budget: constant, and linear, cosine, multi-cosine and quadratic decays
over the whole run or its last 20% (WSD). As curves: t̂ = compute / the run's last compute, the logged lr,
τ empty, TPP as recorded.

The CSV is written outside the repository (the data are not copied into it); replay it as a user would:

    .venv/bin/python studies/bench/external_sweeps.py --sweep gemstones-hot --out /tmp/gem_hot.csv
    .venv/bin/collapse-hpo replay /tmp/gem_hot.csv --pruner collapse-online --orders 20
    .venv/bin/collapse-hpo replay /tmp/gem_hot.csv --frontier --orders 10
    .venv/bin/python studies/bench/external_sweeps.py --sweep qiu-mlp-schedules --out /tmp/qiu_sched.csv
    .venv/bin/collapse-hpo replay /tmp/qiu_sched.csv --orders 20 --reports 100 --markdown

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
GEMSTONES = {
    "gemstones-hot": "wandb_df_for_fitting_hot_100b+_477.jsonl",
    "gemstones-ablation": "wandb_df_for_fitting_lr_ablation_hot_477.jsonl",
}
SWEEPS = (*GEMSTONES, "qiu-mlp-schedules")
QIU_GROUP = (1024, 886)  # (width, evaluations) of the qiu schedule sweep


def write_gemstones(source: Path, out: Path) -> list[tuple[float, str]]:
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


def write_qiu_schedules(root: Path, out: Path) -> list[tuple[float, str]]:
    """Write the qiu MLP schedule sweep (``QIU_GROUP``) as a curve CSV at ``out``; return (final loss, run)
    sorted."""
    import numpy as np
    import pandas as pd

    from collapse_hpo.predictors.curves import Curve, write_curves_csv
    from collapse_hpo.predictors.schedules import Schedule

    runs = pd.read_csv(root / "mlp_schedules_runs.csv")
    width, evaluations = QIU_GROUP
    runs = runs[(runs["D"] == width) & (runs["n_points"] == evaluations)]
    columns = ["run_id", "step", "compute", "test_loss", "lr"]
    points = pd.read_csv(root / "mlp_schedules_curves.csv.gz", usecols=columns)
    curves = []
    for r in runs.itertuples():
        g = points[points.run_id == r.run_id].sort_values("step")
        g = g[g.compute > 0]
        t = g.compute.to_numpy(float) / float(g.compute.max())
        lr = g.lr.to_numpy(float)
        curves.append(Curve(run=f"{r.schedule}_decay{r.decay_frac:g}_{r.run_id[-3:]}", t_hat=t,
                            loss=g.test_loss.to_numpy(float), lr=lr,
                            schedule=Schedule.from_data(t, lr / lr.max()), tau=None, tpp=float(r.tpp_final)))
    write_curves_csv(out, curves)
    return sorted((float(np.asarray(c.loss)[-1]), c.run) for c in curves)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sweep", choices=SWEEPS, required=True)
    ap.add_argument("--extdata", type=Path, default=EXTDATA, help="the shared extdata folder")
    ap.add_argument("--out", type=Path, required=True, help="curve CSV to write (outside the repository)")
    args = ap.parse_args(argv)
    if args.sweep in GEMSTONES:
        source = args.extdata / "gemstones_mcleish2025" / GEMSTONES[args.sweep]
    else:
        source = args.extdata / "qiu_supercollapse" / "mlp_schedules_runs.csv"
    if not source.is_file():
        print(f"external_sweeps: {source} not found; give --extdata (the shared extdata folder)",
              file=sys.stderr)
        return 2
    if HERE.parents[1] in args.out.resolve().parents:
        print(f"external_sweeps: --out {args.out} is inside the repository; the data must not be copied "
              "into it: write it under /tmp", file=sys.stderr)
        return 2
    if args.sweep in GEMSTONES:
        finals = write_gemstones(source, args.out)
    else:
        finals = write_qiu_schedules(source.parent, args.out)
    print(f"{args.out}: {len(finals)} runs; best {finals[0][1]} {finals[0][0]:.4f}, then "
          + ", ".join(f"{r} +{100 * (v / finals[0][0] - 1):.2f}%" for v, r in finals[1:3]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
