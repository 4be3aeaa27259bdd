"""`collapse-hpo calibrate CURVES.csv -o surrogate.json`: fit the collapse surrogate on reference curves."""

from __future__ import annotations

import argparse

from collapse_hpo.hpo.commands._common import check_outputs, print_notes, stderr_progress
from collapse_hpo.predictors.errors import InputError

HELP = "fit the collapse surrogate (b, q laws and error model) on complete reference curves from a CSV"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `calibrate`."""
    parser.add_argument(
        "curves",
        metavar="CURVES.csv",
        help="curve CSV: columns run, t_hat, loss, lr, tau (empty: no weight decay), tpp (empty: not "
        "defined, e.g. fine-tuning; q(TPP) is then a constant), optional params (model parameter count N: "
        "calibration then learns how its error moves with size, and fits the final-loss law for `forecast`); "
        "one row per logged point",
    )
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="SURROGATE.json",
        help="where to write the calibrated surrogate (JSON, written atomically)",
    )
    parser.add_argument(
        "--fit-start",
        type=float,
        default=0.2,
        help="fit the curves on t_hat in [FIT_START, 1] (default 0.2, as the paper)",
    )
    parser.add_argument(
        "--predict-weight",
        type=float,
        default=1.0,
        help="weight of the early-prediction error in the fit objective (0 = the paper's MAE "
        "only; default 1, see BENCHMARKS.md, section 1)",
    )
    parser.add_argument(
        "--align",
        choices=("sq", "mae", "log"),
        default="sq",
        help="alignment loss used by predictions (default sq)",
    )
    parser.add_argument(
        "--align-start",
        type=float,
        default=0.5,
        help="a prediction at fraction p aligns on t_hat in [ALIGN_START*p, p] (default 0.5)",
    )
    parser.add_argument(
        "--free-m",
        choices=("no", "yes", "auto"),
        default="auto",
        help="fit the exponent m too (default auto: only if that lowers the held-out MAE by > 2%%)",
    )
    parser.add_argument(
        "--smooth",
        type=float,
        default=0.0,
        metavar="WIDTH",
        help="local-linear smoothing half-width in t_hat before normalizing (default 0: none)",
    )
    parser.add_argument(
        "--folds",
        type=int,
        default=5,
        help="held-out folds (over groups of equal tau and tpp) for the error model (default 5)",
    )


def _check(args: argparse.Namespace) -> None:
    if not 0.0 <= args.fit_start < 0.95:
        raise InputError(f"--fit-start must be in [0, 0.95), got {args.fit_start}")
    if not args.predict_weight >= 0.0:
        raise InputError(f"--predict-weight must be >= 0, got {args.predict_weight}")
    if not 0.0 <= args.align_start < 1.0:
        raise InputError(f"--align-start must be in [0, 1), got {args.align_start}")
    if not 0.0 <= args.smooth < 0.5:
        raise InputError(f"--smooth must be in [0, 0.5), got {args.smooth}")
    if args.folds < 2:
        raise InputError(f"--folds must be at least 2, got {args.folds}")


def run(args: argparse.Namespace) -> int:
    """Read the curves, calibrate, print the fit table and write the surrogate."""
    from pathlib import Path

    from collapse_hpo.hpo.rule.decision import lead_summary  # deferred: pulls numpy; --help stays fast
    from collapse_hpo.predictors.calibrate import (  # deferred: pulls numpy; --help stays fast
        calibrate,
        refuse_diverged,
    )
    from collapse_hpo.predictors.curves import read_curves_csv  # deferred: pulls numpy; --help stays fast

    _check(args)
    out = Path(args.output)
    if not out.parent.is_dir():
        raise InputError(f"{out}: folder {out.parent} does not exist; create it or choose another -o path")
    check_outputs(args.output, what="surrogate")
    curves = read_curves_csv(args.curves, progress=stderr_progress("calibrate"))
    try:
        refuse_diverged(curves)  # before the reader's notes: a refusal is one line
        print_notes("calibrate", curves)
        cal = calibrate(
            curves,
            fit_start=args.fit_start,
            predict_weight=args.predict_weight,
            align=args.align,
            align_start=args.align_start,
            free_m={"no": False, "yes": True, "auto": "auto"}[args.free_m],
            smooth_width=args.smooth,
            folds=args.folds,
        )
    except InputError as err:
        raise InputError(f"{args.curves}: {str(err).removeprefix('calibrate: ')}") from None
    print(cal.format_table())
    print(lead_summary(cal.surrogate))
    cal.surrogate.save(out)
    print(f"wrote {out}")
    return 0
