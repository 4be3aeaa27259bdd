"""Benchmark of the collapse predictor on real curves (a script, not a test).

    .venv/bin/python studies/bench/predictor.py [--extdata ../shared/extdata] [--quick]

For each family (qiu_supercollapse chess and mlp, mpl_luo2025) it leaves one model size out, calibrates the
surrogate on the other sizes, and prints, for the held-out size, the normalized-curve MAE over t̂ ∈ [0.2, 1]
and the final-loss error when predicting from the first 10%, 20% and 30% of training, next to the naive
prediction (the loss at that fraction) and the paper's figures. It also times a prediction from a 1,000-point
partial curve and a calibration on 100 curves. Data: ../shared/extdata relative to the repository (see its
FORMATS.md); the script reads it in place and says so when it is absent.
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from collapse_hpo.predictors.calibrate import calibrate
from collapse_hpo.predictors.curves import Curve
from collapse_hpo.predictors.predict import predict_final_loss
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import Surrogate
from collapse_hpo.predictors.synthetic import synthetic_curves

REPO = Path(__file__).resolve().parents[2]
FRACTIONS = (0.1, 0.2, 0.3)
PAPER = (
    "paper (Bergsma et al.): curve MAE 1.37% at 111M (fit set), 0.75% 266M, 1.07% 610M, 0.66% 1.7B, "
    "0.54% 3.3B; per-curve best fit 0.50%"
)
# mpl_luo2025 does not give the batch size; TPP = steps · B / N with an assumed B. A common factor on TPP is
# absorbed by q_c, so the choice does not change any prediction.
MPL_BATCH_TOKENS = 0.5e6
MPL_FIT = ("cosine_24000", "constant_24000", "wsdcon_9")


@dataclass
class Run:
    """A reference curve with the labels the benchmark needs."""

    curve: Curve
    size: str
    seed: int
    schedule: str


def _mean(values) -> float:
    """Mean over the finite values (NaN when there are none, e.g. no prediction possible at 10%)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmean(np.asarray(list(values), dtype=float)))


def load_qiu(root: Path, task: str) -> list[Run]:
    """qiu_supercollapse ``task`` (chess or mlp): one Run per (width, seed); duplicates dropped."""
    import pandas as pd

    runs = pd.read_csv(root / f"{task}_runs.csv").drop_duplicates(subset=["D", "seed"])
    curves = pd.read_csv(root / f"{task}_curves.csv.gz")
    out = []
    for r in runs.itertuples():
        g = curves[curves.run_id == r.run_id].sort_values("step")
        t = (g.compute / r.opt_C).to_numpy()
        loss = g.test_loss.to_numpy(dtype=float)
        lr = g.lr.to_numpy(dtype=float)
        c = Curve(
            run=f"{task}_D{r.D}_s{r.seed}",
            t_hat=np.clip(t, 0, 1),
            loss=loss,
            lr=lr,
            schedule=Schedule.from_data(np.clip(t, 0, 1), lr),
            tau=None,
            tpp=float(r.tpp_final),
            params=float(r.P),
        )
        out.append(Run(curve=c, size=str(r.D), seed=int(r.seed), schedule="linear"))
    return out


def load_mpl(root: Path) -> list[Run]:
    """mpl_luo2025: one Run per (size, schedule); t̂ = step / last step; τ unknown but equal across sizes."""
    import pandas as pd

    out = []
    sizes = {"25": 25e6, "100": 100e6, "400": 400e6}
    for f in sorted(glob.glob(str(root / "csv_*" / "*.csv"))):
        size = f.split("csv_")[1].split(os.sep)[0]
        sched = os.path.basename(f)[:-4]
        g = pd.read_csv(f).sort_values("step")
        total = float(g.step.iloc[-1])
        t = g.step.to_numpy(dtype=float) / total
        lr = g.lr.to_numpy(dtype=float)
        # The files start after warmup: add the schedule's known start (lr at peak) so η(t̂) covers t̂ < t[0].
        ts, lrs = np.concatenate(([0.0], t)), np.concatenate(([lr[0]], lr))
        c = Curve(
            run=f"mpl{size}M_{sched}",
            t_hat=t,
            loss=g.loss.to_numpy(dtype=float),
            lr=lr,
            schedule=Schedule.from_data(ts, lrs),
            tau=None,
            tpp=total * MPL_BATCH_TOKENS / sizes[size],
            params=sizes[size],
        )
        out.append(Run(curve=c, size=size, seed=0, schedule=sched))
    return out


def load_family(extdata: Path, name: str) -> list[Run]:
    if name in ("chess", "mlp"):
        return load_qiu(extdata / "qiu_supercollapse", name)
    return load_mpl(extdata / "mpl_luo2025")


def held_out_errors(s: Surrogate, runs: list[Run]) -> dict:
    """Curve MAE on [0.2, 1] and final-loss errors (surrogate and naive) at each fraction, per run."""
    rows = []
    for r in runs:
        c = r.curve
        ok = np.isfinite(c.loss)
        t, y = c.t_hat[ok], c.loss[ok]
        final = float(y[-1])
        sel = t >= 0.2
        shape = s.normalized(t[sel], c.schedule, c.tau, c.tpp)
        mae = float(np.mean(np.abs(y[sel] / final - shape)))
        row = {"run": c.run, "mae": mae}
        for p in FRACTIONS:
            keep = t <= p + 1e-9
            pred = predict_final_loss(
                t[keep], y[keep], surrogate=s, schedule=c.schedule, tau=c.tau, tpp=c.tpp, min_fraction=0.5 * p
            )
            row[f"err{p}"] = abs(pred.final_loss / final - 1) if pred.ok else math.nan
            row[f"naive{p}"] = abs(y[keep][-1] / final - 1) if keep.any() else math.nan
            row[f"in{p}"] = pred.ok and pred.low is not None and pred.low <= final <= pred.high
        rows.append(row)
    return {"rows": rows}


ALIGN_VARIANTS = tuple((a, s) for a in ("sq", "mae", "log") for s in (0.25, 0.5, 0.75))


def evaluate(
    runs: list[Run],
    family: str,
    settings: dict,
    fit_filter=None,
    test_filter=None,
    align_variants: tuple = (),
) -> list[dict]:
    """Leave one size out: calibrate on the other sizes (optionally only runs passing ``fit_filter``).

    ``align_variants`` (alignment loss, window start) re-predict the held-out runs with the same calibrated
    constants and another alignment; their errors are stored as ``align:<loss>:<start>:err<p>``.
    """
    sizes = sorted({r.size for r in runs}, key=lambda x: float(x))
    out = []
    for held in sizes:
        train = [r for r in runs if r.size != held and (fit_filter is None or fit_filter(r))]
        test = [r for r in runs if r.size == held and (test_filter is None or test_filter(r))]
        if not train or not test:
            continue
        t0 = time.perf_counter()
        cal = calibrate([r.curve for r in train], groups=[r.size for r in train], **settings)
        secs = time.perf_counter() - t0
        res = held_out_errors(cal.surrogate, test)["rows"]
        summary = {
            "family": family,
            "held_out": held,
            "n_train": len(train),
            "n_test": len(test),
            "fit_mae": cal.mean_mae_paper,
            "seconds": secs,
            "mae": float(np.mean([r["mae"] for r in res])),
        }
        for p in FRACTIONS:
            summary[f"err{p}"] = _mean(r[f"err{p}"] for r in res)
            summary[f"naive{p}"] = _mean(r[f"naive{p}"] for r in res)
            summary[f"n{p}"] = int(np.sum(np.isfinite([r[f"err{p}"] for r in res])))
            summary[f"cover{p}"] = float(np.mean([r[f"in{p}"] for r in res]))
        for align, start in align_variants:
            alt = held_out_errors(replace(cal.surrogate, align=align, align_start=start), test)["rows"]
            for p in FRACTIONS:
                summary[f"align:{align}:{start}:err{p}"] = _mean(r[f"err{p}"] for r in alt)
        out.append(summary)
    return out


def _fmt_pct(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{100 * x:.2f}"


def print_family(rows: list[dict], label: str) -> dict:
    """Print the leave-one-size-out rows of one family and return the mean row."""
    print(f"\n## {label}")
    head = f"{'held-out':>9} {'n':>3} {'fitMAE%':>8} {'MAE%':>6} " + " ".join(
        f"{'err@' + format(p, 'g'):>8} {'naive':>6} {'cov':>4}" for p in FRACTIONS
    )
    print(head)
    for r in rows:
        print(
            f"{r['held_out']:>9} {r['n_test']:>3} {_fmt_pct(r['fit_mae']):>8} {_fmt_pct(r['mae']):>6} "
            + " ".join(
                f"{_fmt_pct(r[f'err{p}']):>8} {_fmt_pct(r[f'naive{p}']):>6} {r[f'cover{p}']:>4.2f}"
                for p in FRACTIONS
            )
        )
    mean = {k: _mean(r[k] for r in rows) for k in rows[0] if k not in ("family", "held_out")}
    print(
        f"{'mean':>9} {'':>3} {_fmt_pct(mean['fit_mae']):>8} {_fmt_pct(mean['mae']):>6} "
        + " ".join(
            f"{_fmt_pct(mean[f'err{p}']):>8} {_fmt_pct(mean[f'naive{p}']):>6} {mean[f'cover{p}']:>4.2f}"
            for p in FRACTIONS
        )
    )
    return mean


def time_prediction(runs: list[Run]) -> float:
    """Median seconds of one prediction from a 1,000-point partial curve (t̂ ≤ 0.2 of a real curve)."""
    c = runs[0].curve
    cal = calibrate([r.curve for r in runs[:10]])
    t = np.linspace(0.001, 0.2, 1000)
    y = np.interp(t, c.t_hat, c.loss)
    predict_final_loss(t, y, surrogate=cal.surrogate, schedule=c.schedule, tau=c.tau, tpp=c.tpp)
    times = []
    for _ in range(300):
        t0 = time.perf_counter()
        pred = predict_final_loss(t, y, surrogate=cal.surrogate, schedule=c.schedule, tau=c.tau, tpp=c.tpp)
        times.append(time.perf_counter() - t0)
    assert pred.ok, pred.reason
    return float(np.median(times))


def time_calibration_100() -> tuple[float, float]:
    """Seconds (wall, CPU) to calibrate on 100 synthetic curves of 500 points (5 τ × 5 TPP × 4 seeds)."""
    curves = synthetic_curves(
        taus=(0.03, 0.06, 0.1, 0.2, 0.4),
        tpps=(10.0, 20.0, 50.0, 100.0, 250.0),
        seeds=4,
        n_points=500,
        noise=0.003,
    )
    assert len(curves) == 100
    w0, c0 = time.perf_counter(), time.process_time()
    calibrate(curves)
    return time.perf_counter() - w0, time.process_time() - c0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--extdata",
        default=str(REPO.parent / "shared" / "extdata"),
        help="folder with qiu_supercollapse/ and mpl_luo2025/ (default ../shared/extdata)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="only the chosen settings (skip the paper's recipe)"
    )
    args = parser.parse_args(argv)
    ext = Path(args.extdata)
    missing = [d for d in ("qiu_supercollapse", "mpl_luo2025") if not (ext / d).is_dir()]
    if missing:
        print(
            f"predictor benchmark: external data not found: {', '.join(str(ext / d) for d in missing)}; "
            "pass --extdata PATH (see shared/extdata/README.md)",
            file=sys.stderr,
        )
        return 2
    print(
        f"data: {ext}\n{PAPER}\nerrors are mean |predicted/actual - 1| of the final loss over held-out runs; "
        "naive = the loss at that fraction; cov = share of held-out finals inside the 90% interval"
    )
    variants = {"chosen: defaults (predict_weight=1, free_m=auto, fit [0.2, 1], sq align on [p/2, p])": {}}
    if not args.quick:
        variants["predict_weight=1, m fixed at 0.05"] = {"free_m": False}
        variants["paper recipe: MAE on [0.2, 1] only (predict_weight=0), m fixed"] = {
            "predict_weight": 0.0,
            "free_m": False,
        }
        variants["MAE on [0.05, 1] (predict_weight=0), m fixed"] = {
            "fit_start": 0.05,
            "predict_weight": 0.0,
            "free_m": False,
        }
    fams = {f: load_family(ext, f) for f in ("chess", "mlp", "mpl")}
    summary = []

    def fit_sched(r: Run) -> bool:
        return r.schedule in MPL_FIT

    def test_sched(r: Run) -> bool:
        return r.schedule not in MPL_FIT

    align_rows: dict[str, list[dict]] = {}
    for k, (vname, st) in enumerate(variants.items()):
        av = ALIGN_VARIANTS if k == 0 and not args.quick else ()
        print(f"\n# settings: {vname}")
        for f in ("chess", "mlp"):
            rows = evaluate(fams[f], f, st, align_variants=av)
            m = print_family(
                rows, f"qiu_supercollapse {f}: leave one width out ({len(fams[f])} runs, 5 seeds per width)"
            )
            summary.append((vname, f, m))
            align_rows[f] = rows
        rows = evaluate(
            fams["mpl"], "mpl", st, fit_filter=fit_sched, test_filter=test_sched, align_variants=av
        )
        m = print_family(
            rows,
            "mpl_luo2025: leave one size out; fit on cosine_24000, constant_24000, wsdcon_9 "
            "of the other sizes; test on the 6 other schedules of the held-out size",
        )
        summary.append((vname, "mpl (test schedules)", m))
        align_rows["mpl (test schedules)"] = rows
        m = print_family(
            evaluate(fams["mpl"], "mpl", st, fit_filter=fit_sched, test_filter=fit_sched),
            "mpl_luo2025: as above, tested on the held-out size's 3 fit-split schedules",
        )
        summary.append((vname, "mpl (fit schedules)", m))
        if av:
            print(
                "\n# alignment study (chosen constants; mean final-loss error % at 10/20/30%, by alignment "
                "loss and window [start*p, p])"
            )
            print(f"{'align':>5} {'start':>5} " + " ".join(f"{f:>24}" for f in align_rows))
            for align, st0 in av:
                cells = []
                for rows in align_rows.values():
                    vals = [_mean(r[f"align:{align}:{st0}:err{p}"] for r in rows) for p in FRACTIONS]
                    cells.append("/".join(_fmt_pct(v) for v in vals))
                print(f"{align:>5} {st0:>5} " + " ".join(f"{c:>24}" for c in cells))
    print("\n# summary: mean over held-out sizes (final-loss error %, ours / naive, at 10%, 20%, 30%)")
    for vname, f, m in summary:
        ratio = m["err0.2"] / m["naive0.2"]
        print(
            f"{vname[:22]:<22} {f:<22} MAE {_fmt_pct(m['mae'])}  "
            + "  ".join(f"{_fmt_pct(m[f'err{p}'])}/{_fmt_pct(m[f'naive{p}'])}" for p in FRACTIONS)
            + f"  @20%: {ratio:.2f} of naive ({'met' if ratio <= 0.5 else 'NOT met'})"
        )
    print("\n# m check (free_m='auto', all sizes of each family)")
    for f in ("chess", "mlp"):
        cal = calibrate([r.curve for r in fams[f]], groups=[r.size for r in fams[f]], free_m="auto")
        print(f"{f}: {next(n for n in cal.notes if n.startswith('m check'))}; m = {cal.surrogate.m:.4g}")
    fit = [r for r in fams["mpl"] if r.schedule in MPL_FIT]
    cal = calibrate([r.curve for r in fit], groups=[r.size for r in fit], free_m="auto")
    print(f"mpl: {next(n for n in cal.notes if n.startswith('m check'))}; m = {cal.surrogate.m:.4g}")
    print("\n# speed")
    secs = time_prediction(fams["chess"])
    print(
        f"prediction from a 1,000-point partial curve: {1e3 * secs:.3f} ms (median of 300; target < 5 ms: "
        f"{'met' if secs < 5e-3 else 'NOT met'})"
    )
    wall, cpu = time_calibration_100()
    print(
        f"calibration on 100 curves x 500 points (grid search + lmfit + 5-fold error model): {wall:.1f} s "
        f"wall, "
        f"{cpu:.1f} s CPU (target < 60 s: {'met' if wall < 60 else 'NOT met'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
