"""`collapse-hpo monitor RUN.csv`: check a logged or live run against a reference curve; alarm on deviation.

The reference is a complete run at the same controls (``--reference``, e.g. a smaller model's curve;
normalized by its final loss) or a calibrated surrogate (``--surrogate``; ℓ̂ at the run's own schedule, τ and
TPP). The rule is ``predictors.residuals``: early-align divisor on ``--align``, residual r(t̂) = L/c − ℓ_ref,
alarm when r > ``--threshold`` for ``--persistence`` reports. The raw-loss rule (smoothed loss above its
running minimum by ``--raw-margin``) is printed beside it. A run whose loss turns NaN or inf (or beyond any
training loss) raises the alarm at that point: "diverged". Exit status 1 when an alarm fired, 0 when not,
2 on bad input, 3 when ``--follow`` stopped at its ``--timeout`` or ``--idle`` limit before the runs ended.

With ``--follow`` it reads the rows the run appends (`hpo.outputs.follow.FollowedCurves`: a half-written last
row is waited for, a truncated or rotated file is followed like ``tail -F``, a missing one is waited for)
every ``--interval`` seconds until every run has reached t̂ = 1 (its last row, with or without a loss) or
diverged, an alarm fired, ``--timeout`` seconds passed, or no new row came for ``--idle`` seconds (default
3600).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

from collapse_hpo.hpo.commands._common import check_outputs, print_notes, stderr_progress
from collapse_hpo.predictors import spreadsheet
from collapse_hpo.predictors.atomic import atomic_write
from collapse_hpo.predictors.errors import InputError

IDLE_S = 3600.0
#: Exit status when --follow stopped at its --timeout or --idle limit before every run ended.
EXIT_STOPPED = 3
HELP = "check a logged or live run against a reference curve and raise an alarm on deviation from collapse"


#: The exit statuses, as `--help` states them (cli.main gives 2 for bad input and 128 + N on signal N).
EXIT_STATUSES = (
    "exit status: 0 no alarm; 1 an alarm fired (a run deviated or diverged); 2 bad input (one line on "
    "stderr, nothing written); 3 --follow stopped at its --timeout or --idle limit before the run(s) ended, "
    "with no alarm; 130 interrupted (Ctrl-C)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `collapse-hpo monitor`, and its exit statuses in the epilog of `--help`."""
    parser.epilog = EXIT_STATUSES
    parser.add_argument("curves", help="curve CSV of the run(s) to check (run, t_hat, loss, lr, tau, tpp)")
    parser.add_argument("--run", action="append", default=None, help="check only this run (repeatable)")
    ref = parser.add_mutually_exclusive_group(required=True)
    ref.add_argument("--reference", help="curve CSV with a complete reference run at the same controls")
    ref.add_argument("--surrogate", help="calibrated surrogate JSON (reference ℓ̂ at the run's controls)")
    parser.add_argument("--reference-run", default=None,
                        help="the run in --reference to use (default: its only run)")
    parser.add_argument("--align", type=float, nargs=2, default=(0.1, 0.3), metavar=("START", "END"),
                        help="t_hat window of the early-align divisor (default 0.1 0.3)")
    parser.add_argument("--threshold", type=float, default=0.01,
                        help="residual threshold in normalized-loss units (default 0.01 = 1%% of final loss)")
    parser.add_argument("--persistence", type=int, default=3,
                        help="consecutive deviating reports (default 3)")
    parser.add_argument("--smooth", type=float, default=0.02,
                        help="trailing moving-average width, fraction of training (default 0.02)")
    parser.add_argument("--two-sided", action="store_true",
                        help="also alarm when the run is below the reference")
    parser.add_argument("--raw-margin", type=float, default=0.01,
                        help="raw-loss rule: relative rise above the running minimum (default 0.01)")
    parser.add_argument("--follow", action="store_true",
                        help="live: read the rows the run appends every --interval seconds (a half-written "
                        "last row is waited for; a truncated, rotated or missing file is followed like "
                        "tail -F) until every run ends or an alarm fires, or the --timeout or --idle limit "
                        "(then exit 3)")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between re-reads with --follow")
    parser.add_argument("--timeout", type=float, default=None,
                        help="with --follow: stop after this many seconds in all (default: no limit)")
    parser.add_argument("--idle", type=float, default=IDLE_S,
                        help=f"with --follow: stop when no new row came for this many seconds (default "
                        f"{IDLE_S:g}: a run that stopped logging)")
    parser.add_argument("--csv", default=None, help="write t_hat, residual per run as CSV here")


def _reference_fn(args: argparse.Namespace):
    """A function curve -> (ref_t_hat, ref_ell) for the chosen reference."""
    import numpy as np

    from collapse_hpo.predictors.curves import read_curves_csv  # deferred: pulls numpy; --help stays fast
    from collapse_hpo.predictors.residuals import (
        normalized_reference,  # deferred: pulls numpy; --help stays fast
    )

    if args.surrogate:
        from collapse_hpo.predictors.surrogate import Surrogate  # deferred: pulls numpy; --help stays fast

        sur = Surrogate.load(args.surrogate)
        grid = np.linspace(0.0, 1.0, 1001)
        return lambda c: (grid, sur.normalized(grid, c.schedule, c.tau, c.tpp))
    refs = read_curves_csv(args.reference, progress=stderr_progress("monitor"))
    if args.reference_run is not None:
        refs = [c for c in refs if c.run == args.reference_run]
        if not refs:
            raise InputError(f"{args.reference}: no run named {args.reference_run!r}; check --reference-run")
    elif len(refs) != 1:
        raise InputError(f"{args.reference}: holds {len(refs)} runs; pick one with --reference-run")
    if refs[0].diverged_at is not None:
        raise InputError(f"{args.reference}: reference run {refs[0].run!r} diverged at "
                         f"t_hat={refs[0].diverged_at:g}; give a clean, complete run")
    try:
        ref = normalized_reference(refs[0].t_hat, refs[0].loss, smooth=args.smooth)
    except InputError as err:
        raise InputError(f"{args.reference}: run {refs[0].run!r}: {err}") from None
    if not all(math.isfinite(v) for v in ref[1]):
        raise InputError(f"{args.reference}: run {refs[0].run!r} has non-finite losses")
    return lambda c: ref


def _check_all(args: argparse.Namespace, rule, ref_of, curves: list) -> list[tuple]:
    from collapse_hpo.predictors.residuals import (  # deferred: pulls numpy; --help stays fast
        raw_loss_alarm,
        residuals,
    )

    if args.run:
        missing = [r for r in args.run if r not in {c.run for c in curves}]
        if missing and not args.follow:  # a live file may not have reached that run yet
            raise InputError(f"{args.curves}: no run named {missing[0]!r}; check --run")
        curves = [c for c in curves if c.run in args.run]
    out = []
    for c in curves:
        try:
            rt, rl = ref_of(c)
        except InputError as err:  # e.g. a surrogate with a TPP law and a run whose tpp is not defined
            why = str(err).removeprefix("surrogate: ")
            raise InputError(f"{args.curves}: run {c.run!r}: {why}") from None
        res = residuals(c.t_hat, c.loss, rt, rl, rule)
        raw = raw_loss_alarm(c.t_hat, c.loss, margin=args.raw_margin, persistence=args.persistence,
                             smooth=args.smooth)
        out.append((c, res, raw))
    return out


def run(args: argparse.Namespace) -> int:
    """Check every run; print one line per run. Exit 1 when any alarm fired, 3 when --follow stopped at a
    limit first."""
    import numpy as np

    from collapse_hpo.predictors.residuals import AlarmRule  # deferred: pulls numpy; --help stays fast

    rule = AlarmRule(align=tuple(args.align), threshold=args.threshold, persistence=args.persistence,
                     smooth=args.smooth, two_sided=args.two_sided)
    for name, value in (("--interval", args.interval), ("--timeout", args.timeout), ("--idle", args.idle)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise InputError(f"monitor: {name} must be a positive number of seconds, got {value}")
    if args.csv and not os.path.isdir(os.path.dirname(os.path.abspath(args.csv))):
        raise InputError(f"monitor: output folder of {args.csv} does not exist; create it first")

    check_outputs(args.csv, what="residual CSV")
    ref_of = _reference_fn(args)
    if args.follow:
        results, stopped = _follow(args, rule, ref_of)
    else:
        from collapse_hpo.predictors.curves import read_curves_csv  # deferred: pulls numpy; --help stays fast

        curves = read_curves_csv(args.curves, progress=stderr_progress("monitor"))
        print_notes("monitor", curves)
        results, stopped = _check_all(args, rule, ref_of, curves), None
    fired = any(res.alarm.fired or c.diverged_at is not None for c, res, _ in results)
    print(f"{'run':<28} {'t_hat':>6} {'divisor':>9} {'max r':>8} {'alarm t̂':>8} {'raw-loss t̂':>10}")
    for c, res, raw in results:
        r = res.residual[np.isfinite(res.residual)]
        rmax = f"{r.max():.4f}" if r.size else "-"
        at = f"{res.alarm.t_hat:.3f}" if res.alarm.fired else "-"
        if c.diverged_at is not None and not (res.alarm.fired and res.alarm.t_hat <= c.diverged_at):
            at = f"{c.diverged_at:.3f}"
        rw = f"{raw.t_hat:.3f}" if raw.fired else "-"
        div = f"{res.divisor:.4f}" if math.isfinite(res.divisor) else "-"
        print(f"{c.run:<28} {c.last_t_hat:>6.3f} {div:>9} {rmax:>8} {at:>8} {rw:>10}")
        if c.diverged_at is not None:
            print(f"  diverged: the loss is not finite from t_hat={c.diverged_at:.3f} on: alarm")
        print(f"  collapse: {res.alarm.reason}")
        print(f"  raw loss: {raw.reason}")
    if args.csv:
        with atomic_write(args.csv, "w", newline="") as fh:
            w = spreadsheet.writer(fh)
            w.writerow(["run", "t_hat", "residual"])
            for c, res, _ in results:
                for t, v in zip(res.t_hat, res.residual):
                    w.writerow([c.run, f"{t:.6g}", "" if not math.isfinite(v) else f"{v:.6g}"])
    if stopped is not None and not fired:
        print(f"monitor: {stopped}", file=sys.stderr)
        return EXIT_STOPPED
    return 1 if fired else 0


def _follow(args: argparse.Namespace, rule, ref_of) -> tuple[list[tuple], str | None]:
    """`--follow`: poll the live file until every run ended or an alarm fired (None), or a limit stopped it
    (the reason); the results of the last check."""
    from collapse_hpo.hpo.outputs.follow import FollowedCurves  # deferred: pulls numpy; --help stays fast

    live = FollowedCurves(args.curves)
    started = last_row = time.monotonic()
    noted: set[str] = set()
    results: list[tuple] = []
    try:
        while True:
            if live.poll():
                last_row = time.monotonic()
            for event in live.events:
                print(f"monitor: {event}", file=sys.stderr)
            live.events.clear()
            curves = live.curves()
            if curves is not None:
                for c in curves:  # each note once, not at every check
                    for note in c.notes:
                        if note not in noted and "resampled" not in note:
                            noted.add(note)
                            print(f"collapse-hpo monitor: note: {note}", file=sys.stderr)
                results = _check_all(args, rule, ref_of, curves)
                wanted = set(args.run or ()) - {c.run for c, _, _ in results}
                done = bool(results) and not wanted and all(_ended(c) for c, _, _ in results)
                if done or any(res.alarm.fired or c.diverged_at is not None for c, res, _ in results):
                    return results, None
            now = time.monotonic()
            if args.timeout is not None and now - started >= args.timeout:
                return results, (f"stopped after --timeout {args.timeout:g} s before the run(s) ended "
                                 f"({_where(results)})")
            if now - last_row >= args.idle:
                return results, (f"stopped: no new row in {args.curves} for --idle {args.idle:g} s "
                                 f"({_where(results)})")
            print(f"monitor: {_where(results)}, no alarm yet; next check in {args.interval:g} s",
                  file=sys.stderr)
            time.sleep(args.interval)
    finally:
        live.close()


def _where(results: list[tuple]) -> str:
    last = max((c.last_t_hat for c, _, _ in results), default=float("nan"))
    return "no rows yet" if not results else f"t_hat={last:.3f}"


def _ended(c) -> bool:
    """The run has nothing more to log: a loss at t̂ ≥ 0.99, a last row at t̂ ≥ 0.99, or it diverged."""
    reached = bool(c.t_hat.size) and float(c.t_hat.max()) >= 0.99
    return c.complete or reached or c.diverged_at is not None
