"""`collapse-hpo predict CURVES.csv --surrogate S.json --fraction 0.2`: final losses from partial curves."""

from __future__ import annotations

import argparse

from collapse_hpo.hpo.commands._common import print_notes, stderr_progress
from collapse_hpo.predictors.errors import InputError

HELP = "predict each run's final loss from the first FRACTION of its curve (early alignment to the surrogate)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `predict`."""
    parser.add_argument(
        "curves",
        metavar="CURVES.csv",
        help="curve CSV: columns run, t_hat, loss, lr, tau, tpp (may be empty: not defined), optional params "
        "(the model's parameter count N; with it the surrogate's size trend corrects the prediction); one "
        "row per logged point",
    )
    parser.add_argument(
        "--surrogate",
        required=True,
        metavar="SURROGATE.json",
        help="a surrogate written by `collapse-hpo calibrate`",
    )
    parser.add_argument(
        "--fraction",
        type=float,
        required=True,
        help="use the points with t_hat <= FRACTION (fraction of training tokens, e.g. 0.2)",
    )
    parser.add_argument(
        "--confidence", type=float, default=0.9, help="confidence of the interval low..high (default 0.9)"
    )
    parser.add_argument(
        "--min-fraction",
        type=float,
        default=None,
        help="refuse predictions from less than this fraction (default min(0.1, 0.9*FRACTION))",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per run (JSON Lines) instead of a table"
    )


def run(args: argparse.Namespace) -> int:
    """Predict every run of the file and print a table or JSON Lines."""
    import json
    import math

    import numpy as np

    from collapse_hpo.predictors.curves import read_curves_csv  # deferred: pulls numpy; --help stays fast
    from collapse_hpo.predictors.predict import (  # deferred: pulls numpy; --help stays fast
        Prediction,
        predict_final_loss,
    )
    from collapse_hpo.predictors.surrogate import Surrogate  # deferred: pulls numpy; --help stays fast

    if not (0.0 < args.fraction <= 1.0):
        raise InputError(f"--fraction must be in (0, 1] (a fraction of training tokens), got {args.fraction}")
    if not (0.0 < args.confidence < 1.0):
        raise InputError(f"--confidence must be in (0, 1), got {args.confidence}")
    min_fraction = args.min_fraction if args.min_fraction is not None else min(0.1, 0.9 * args.fraction)
    if not (0.0 <= min_fraction <= 1.0):
        raise InputError(f"--min-fraction must be in [0, 1], got {args.min_fraction}")
    surrogate = Surrogate.load(args.surrogate)
    from collapse_hpo.predictors.misfit import (  # deferred: pulls numpy; --help stays fast
        collapses,
        misfit_note,
    )

    curves = read_curves_csv(args.curves, progress=stderr_progress("predict"))
    print_notes("predict", curves)
    results = []
    for c in curves:
        ok = np.isfinite(c.loss)
        keep = ok & (c.t_hat <= args.fraction + 1e-9)
        pred = predict_final_loss(
            c.t_hat[keep],
            c.loss[keep],
            surrogate=surrogate,
            schedule=c.schedule,
            tau=c.tau,
            tpp=c.tpp,
            min_fraction=min_fraction,
            confidence=args.confidence,
            params=c.params,
        )
        diverged = c.diverged_at is not None and c.diverged_at <= args.fraction + 1e-9
        if diverged:  # never predicted from the points before: the run is lost
            pred = Prediction(final_loss=None, low=None, high=None, fraction=float(c.diverged_at), n_points=0,
                              reason=f"the run diverged at t_hat={c.diverged_at:g} (a NaN, inf or huge loss)")
        # The shape's controls (TPP, τ) far beyond the references: the shape there is no evidence (the size
        # only moves the size correction, whose own interval widens beyond the reference sizes).
        too_far = surrogate.too_far(None, c.tpp, c.tau)
        if too_far is not None and not diverged:
            pred = Prediction(final_loss=None, low=None, high=None, fraction=pred.fraction, n_points=0,
                              reason=f"not predicted: {too_far}", extrapolation=pred.extrapolation)
        low, high = pred.shown  # widened when the curve does not collapse onto the reference shape
        row: dict = {
            "run": c.run,
            "fraction": pred.fraction,
            "predicted_final_loss": pred.final_loss,
            "low": low,
            "high": high,
            "misfit": pred.misfit,
            "reason": pred.reason,
            "params": c.params,
            "size_correction": pred.size_bias,
            "extrapolation": pred.extrapolation,
        }
        if c.complete and c.diverged_at is None:
            actual = c.final_loss
            row["actual_final_loss"] = actual
            row["error"] = (pred.final_loss / actual - 1.0) if pred.ok and actual > 0 else None
        results.append({k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                        for k, v in row.items()})
    if args.json:
        for row in results:
            print(json.dumps(row, allow_nan=False))
        return 0

    def f(x: float | None, spec: str = ".5g") -> str:
        return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)

    width = max(12, *(len(r["run"]) for r in results))
    print(
        f"{'run':<{width}} {'t_hat':>6} {'predicted':>10} {'low':>10} {'high':>10} {'actual':>10} "
        f"{'error':>8} {'extrap':>6}"
    )
    for r in results:
        err = r.get("error")
        line = (
            f"{r['run']:<{width}} {f(r['fraction'], '.3f'):>6} {f(r['predicted_final_loss']):>10} "
            f"{f(r['low']):>10} {f(r['high']):>10} {f(r.get('actual_final_loss')):>10} "
            f"{'-' if err is None else format(100 * err, '+.2f') + '%':>8} "
            f"{'yes' if r['extrapolation'] else '-':>6}"
        )
        if r["reason"]:
            line += f"  ({r['reason']})"
        elif not collapses(r["misfit"]):
            line += f"  ({misfit_note(r['misfit'], r['fraction'])})"
        print(line)
    for r in results:
        if r["extrapolation"]:
            print(f"extrapolates: {r['run']}: {r['extrapolation']}")
    if surrogate.size_trend and any(r["params"] is None for r in results):
        print("note: runs without a value in column params get no size correction (the surrogate has one)")
    elif not surrogate.size_trend and any(r["params"] is not None for r in results):
        print("note: the surrogate has no size trend (its reference had no sizes, or one): not corrected")
    n_ok = sum(r["predicted_final_loss"] is not None for r in results)
    print(
        f"{n_ok} of {len(results)} runs predicted from t_hat <= {args.fraction:g} "
        f"(interval: {100 * args.confidence:g}% confidence)"
    )
    return 0
