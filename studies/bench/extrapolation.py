"""Benchmark: predicting a model size outside the reference range (a script, not a test; issue 10, part 1).

    .venv/bin/python studies/bench/extrapolation.py [--extdata ../shared/extdata] [--families chess,mlp,...]
        [--ends largest,smallest] [--folds K]

The case a user has: calibrate on the smaller sizes, predict the largest from the first 10/20/30% of its
curve. For each family it holds out the largest size (and, by default, separately the smallest: ``--ends``),
calibrates on every run of the other sizes, and predicts the held-out runs' final losses three ways:

- ``trend``: with the run's size (``params``): the surrogate's size trend corrects the point and sets the
  interval (the new behaviour);
- ``plain``: without the size, as before the size trend (raw alignment divisor, interval from error bands);
- ``naive``: the loss at that fraction.

Families: qiu_supercollapse chess and mlp (8 widths × 5 seeds), mpl_luo2025 (25M/100M/400M; fit on its 3 fit
schedules, tested on the 6 others of the held-out size, as in BENCHMARKS.md §1), and the project's own trained
collapse family (``ours``: studies/bench/artifacts/curves_collapse_tau_full.csv, widths 32–128 × 2 seeds, and
``ours25k``: the earlier widths 24–64 set, read from --ours25k when present). Sizes: qiu ``P``, mpl
25e6/100e6/400e6, ours the non-embedding count of `trainers.config.count_parameters` at depth 2. Reads
../shared/extdata in place (never copies it).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from predictor import MPL_FIT, REPO, Run, load_family

from collapse_hpo.predictors.calibrate import calibrate
from collapse_hpo.predictors.curves import read_curves_csv
from collapse_hpo.predictors.predict import predict_final_loss

FRACTIONS = (0.1, 0.2, 0.3)
OURS = REPO / "studies" / "bench" / "artifacts" / "curves_collapse_tau_full.csv"
OURS_25K = Path("/work/dev8a/curves_collapse_tau_full.csv")


def load_ours(path: Path) -> list[Run]:
    """Our trained collapse family: run names collapse_tau_w<width>_s<seed>; N from the model's shape."""
    from dataclasses import replace

    from collapse_hpo.trainers.config import count_parameters

    out = []
    for c in read_curves_csv(path):
        m = re.search(r"_w(\d+)_s(\d+)", c.run)
        if not m:
            continue
        width, seed = int(m.group(1)), int(m.group(2))
        n, _ = count_parameters(width, 2, max(1, width // 16))
        out.append(Run(curve=replace(c, params=float(n)), size=str(width), seed=seed, schedule="linear"))
    return out


def predict_runs(surrogate, runs: list[Run], use_size: bool) -> list[dict]:
    """Per run and fraction: signed error predicted/actual − 1, naive error, and whether the 90% interval held
    the actual final loss; ``use_size`` passes the run's params (size trend) or not (plain)."""
    rows = []
    for r in runs:
        c = r.curve
        ok = np.isfinite(c.loss)
        t, y = c.t_hat[ok], c.loss[ok]
        final = float(y[-1])
        row = {"run": c.run}
        for p in FRACTIONS:
            keep = t <= p + 1e-9
            pred = predict_final_loss(
                t[keep], y[keep], surrogate=surrogate, schedule=c.schedule, tau=c.tau, tpp=c.tpp,
                min_fraction=0.5 * p, params=c.params if use_size else None,
            )
            row[f"err{p}"] = pred.final_loss / final - 1 if pred.ok else math.nan
            row[f"naive{p}"] = abs(y[keep][-1] / final - 1) if keep.any() else math.nan
            row[f"in{p}"] = (pred.low <= final <= pred.high) if pred.ok and pred.low is not None else math.nan
            row[f"extrap{p}"] = pred.extrapolation
            has = pred.ok and pred.low is not None
            row[f"width{p}"] = 0.5 * (pred.high - pred.low) / pred.final_loss if has else math.nan
        rows.append(row)
    return rows


def held_out(runs: list[Run], family: str, held: str, folds: int | None) -> dict:
    """Calibrate on the sizes other than ``held`` and predict ``held`` with and without its size."""
    fit = [r for r in runs if r.size != held and (family != "mpl" or r.schedule in MPL_FIT)]
    test = [r for r in runs if r.size == held and (family != "mpl" or r.schedule not in MPL_FIT)]
    t0 = time.perf_counter()
    n_sizes = len({r.size for r in fit})
    kw = {} if folds is None else {"folds": n_sizes if folds == 0 else folds}
    cal = calibrate([r.curve for r in fit], groups=[r.size for r in fit], **kw)
    secs = time.perf_counter() - t0
    return {
        "family": family,
        "held": held,
        "n_fit_sizes": n_sizes,
        "n_test": len(test),
        "seconds": secs,
        "trend": predict_runs(cal.surrogate, test, True),
        "plain": predict_runs(cal.surrogate, test, False),
        "kinds": sorted({t.kind for t in cal.surrogate.size_trend}),
        "rule20": next((t.k for t in cal.surrogate.size_trend if abs(t.fraction - 0.2) < 1e-9), None),
    }


def _nanmean(xs) -> float:
    a = np.asarray([x for x in xs if x is not None], dtype=float)
    a = a[np.isfinite(a)]
    return float(a.mean()) if a.size else math.nan


def summarize(res: dict) -> dict:
    """Mean |error| (trend, plain, naive), mean signed error and coverage per fraction."""
    out = {}
    for p in FRACTIONS:
        for way in ("trend", "plain"):
            rows = res[way]
            out[f"{way}{p}"] = _nanmean(abs(r[f"err{p}"]) for r in rows)
            out[f"{way}_signed{p}"] = _nanmean(r[f"err{p}"] for r in rows)
            out[f"{way}_cov{p}"] = _nanmean(r[f"in{p}"] for r in rows)
            out[f"{way}_width{p}"] = _nanmean(r[f"width{p}"] for r in rows)
        out[f"naive{p}"] = _nanmean(r[f"naive{p}"] for r in res["plain"])
    return out


def _pct(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{100 * x:.2f}"


TARGETS = {"chess": 0.005, "mlp": 0.005, "mpl": 0.015}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extdata", default=str(REPO.parent / "shared" / "extdata"))
    parser.add_argument("--families", default="chess,mlp,mpl,ours,ours25k")
    parser.add_argument(
        "--ends", default="largest,smallest",
        help="which sizes to hold out, one at a time: largest, smallest, or all (every size, interior too)",
    )
    parser.add_argument("--ours25k", default=str(OURS_25K), help="the earlier 25K collapse curves (optional)")
    parser.add_argument(
        "--folds", type=int, default=None,
        help="calibration folds (default: calibrate()'s default; 0 = one fold per size)",
    )
    args = parser.parse_args(argv)
    ext = Path(args.extdata)
    fams = [f.strip() for f in args.families.split(",") if f.strip()]
    data: dict[str, list[Run]] = {}
    for f in fams:
        if f in ("chess", "mlp", "mpl"):
            if not (ext / ("mpl_luo2025" if f == "mpl" else "qiu_supercollapse")).is_dir():
                print(f"extrapolation: {f}: external data not found under {ext}; skipped", file=sys.stderr)
                continue
            data[f] = load_family(ext, f)
        elif f == "ours":
            data[f] = load_ours(OURS)
        elif f == "ours25k":
            if Path(args.ours25k).is_file():
                data[f] = load_ours(Path(args.ours25k))
            else:
                print(f"extrapolation: ours25k: {args.ours25k} not found; skipped", file=sys.stderr)
        else:
            print(f"extrapolation: unknown family {f!r}", file=sys.stderr)
            return 2
    ends = [e.strip() for e in args.ends.split(",") if e.strip()]
    print(f"data: {ext}; folds: {'default' if args.folds is None else args.folds or 'one per size'}")
    print("err = mean |predicted/actual - 1| of the final loss over the held-out runs (signed mean in "
          "brackets); cov = share of held-out finals inside the 90% interval; trend = with the run's size "
          "(size trend), plain = without (as before), naive = the loss at that fraction")
    head = (f"{'family':<8} {'held':>6} {'fit':>3} {'n':>3} {'kind':>8} "
            + " ".join(f"{'trend@' + format(p, 'g'):>16} {'plain':>15} {'naive':>6} {'cov t/p':>9}"
                       for p in FRACTIONS) + f" {'s':>5}")
    print(head)
    all_rows = []
    for f, runs in data.items():
        sizes = sorted({r.size for r in runs}, key=float)
        todo = [(e, sizes[-1] if e == "largest" else sizes[0]) for e in ends if e != "all"]
        if "all" in ends:
            where = {sizes[-1]: "largest", sizes[0]: "smallest"}
            todo = [(where.get(z, "interior"), z) for z in sizes]
        for end, held in todo:
            res = held_out(runs, f, held, args.folds)
            m = summarize(res)
            all_rows.append((f, end, res, m))
            cells = []
            for p in FRACTIONS:
                cells.append(
                    f"{_pct(m[f'trend{p}']):>6} ({_pct(m[f'trend_signed{p}']):>6}) "
                    f"{_pct(m[f'plain{p}']):>5} ({_pct(m[f'plain_signed{p}']):>6}) {_pct(m[f'naive{p}']):>6} "
                    f"{m[f'trend_cov{p}']:>4.2f}/{m[f'plain_cov{p}']:<4.2f}"
                )
            kind = (",".join(res["kinds"]) or "none") + ("" if res["rule20"] is None else f":{res['rule20']}")
            print(f"{f:<8} {held:>6} {res['n_fit_sizes']:>3} {res['n_test']:>3} {kind:>8} "
                  + " ".join(cells) + f" {res['seconds']:>5.0f}")
            sys.stdout.flush()
    print("\n# targets (issue 10): largest size held out, at 20%: mean |err| <= 0.5 x naive and <= 0.5% "
          "(chess, mlp), <= 1.5% (mpl); 90% interval covers >= 80% of held-out finals at the end sizes")
    for f, end, res, m in all_rows:
        if end == "interior":
            continue
        extrap = next((r["extrap0.2"] for r in res["trend"] if r["extrap0.2"]), None)
        line = f"{f:<8} {end:<8} @20%: {_pct(m['trend0.2'])}% = {m['trend0.2'] / m['naive0.2']:.2f} x naive"
        if f in TARGETS and end == "largest":
            ok = m["trend0.2"] <= min(0.5 * m["naive0.2"], TARGETS[f])
            line += f" (target <= {100 * TARGETS[f]:g}%: {'met' if ok else 'MISSED'})"
        line += f"; coverage {m['trend_cov0.2']:.2f} ({'met' if m['trend_cov0.2'] >= 0.8 else 'MISSED'})"
        line += f", half-width {_pct(m['trend_width0.2'])}% (plain {_pct(m['plain_width0.2'])}%)"
        line += f"; predict says: {extrap}"
        print(line)
    if any(end == "interior" for _, end, _, _ in all_rows):
        print("\n# mean over every held-out size (interior included), at 20%: |err| trend / plain / naive, "
              "coverage trend / plain")
        for f in data:
            ms = [m for g, _, _, m in all_rows if g == f]
            if not ms:
                continue
            mean = {k: _nanmean(m[k] for m in ms) for k in ms[0]}
            print(f"{f:<8} {_pct(mean['trend0.2'])} / {_pct(mean['plain0.2'])} / {_pct(mean['naive0.2'])}, "
                  f"coverage {mean['trend_cov0.2']:.2f} / {mean['plain_cov0.2']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
