"""`collapse-hpo replay CURVES.csv`: what each pruner would have done on a sweep's finished curves."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from collapse_hpo.hpo.commands._common import check_outputs, print_notes, stderr_progress
from collapse_hpo.hpo.extras import require
from collapse_hpo.predictors.errors import InputError

HELP = "replay finished curves through pruners in random trial orders: compute used, regret, best pruned"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `collapse-hpo replay`."""
    parser.add_argument("curves", nargs="?", default=None,
                        help="curve CSV (run, t_hat, loss, lr, tau, tpp; tau and tpp may be empty): one "
                             "complete run per trial "
                             "(not needed with --pruner list)")
    parser.add_argument("--pruner", action="append", default=None, metavar="NAME",
                        help="pruner to replay (repeatable; default: all). 'list' prints the names")
    parser.add_argument("--orders", type=int, default=20, help="random trial orders to replay (default 20)")
    parser.add_argument("--workers", type=int, default=4,
                        help="concurrent trials, as in a live sweep (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the trial orders (default 0)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="processes to replay orders in parallel (default: the CPU cores, at most 4; "
                             "results are the same for any number)")
    parser.add_argument("--reports", type=int, default=None,
                        help="report points per trial when t_hat grids differ (default: median count)")
    ref = parser.add_mutually_exclusive_group()
    ref.add_argument("--surrogate", default=None, help="calibrated surrogate JSON for the collapse pruner")
    ref.add_argument("--reference", default=None,
                     help="reference curve CSV to calibrate the collapse surrogate on (not the sweep)")
    parser.add_argument("--csv", default=None, help="write the summary table as CSV here")
    parser.add_argument("--plot", default=None, help="write the compute-vs-regret plot (PNG) here")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--frontier", action="store_true",
                        help="sweep each pruner family's own knobs (peers.FRONTIER_KNOBS) and print every "
                             "setting's compute, mean regret and best-cut rate, with each family's Pareto "
                             "frontier marked; --csv and --plot then write the frontier table and plot")
    parser.add_argument("--family", action="append", default=None, metavar="NAME",
                        help="with --frontier: a family to sweep (repeatable; default: all). 'list' prints "
                             "the families and their knobs")


def default_jobs() -> int:
    """The default ``--jobs``: the CPU cores this process may use, at most 4 (1 where fork is missing)."""
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


def run(args: argparse.Namespace) -> int:
    """Replay the sweep and print the table. Bad input raises InputError (exit 2), nothing written."""
    from collapse_hpo.hpo.replays import peers  # deferred: pulls numpy; --help stays fast
    from collapse_hpo.hpo.replays.replay import (  # deferred: pulls numpy; --help stays fast
        LATE_FRACTION,
        format_header,
        format_table,
        markdown_table,
        plot_compute_regret,
        replay,
        write_summary_csv,
    )

    if args.family is not None and not args.frontier:
        raise InputError("replay: --family needs --frontier (use --pruner to choose pruners otherwise)")
    if args.frontier and args.family and "list" in args.family:
        for family, grid in peers.FRONTIER_KNOBS.items():
            print(f"{family:<16} " + "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in grid.items()))
        return 0
    if args.frontier and args.pruner:
        raise InputError("replay: --frontier sweeps families (--family), not single pruners (--pruner)")
    names = peers.available_names()
    if args.pruner and "list" in args.pruner:
        for n in names:
            print(f"{n:<24} {peers.DESCRIPTIONS.get(n, '')}")
        return 0
    if args.plot:
        require("--plot", "matplotlib")
    if args.curves is None:
        raise InputError("replay: no curve CSV given; name the sweep's curves file (e.g. results/<name>/"
                         "curves.csv), or use --pruner list to see the pruners")
    if args.orders < 1:
        raise InputError(f"replay: --orders must be at least 1, got {args.orders}")
    if args.workers < 1:
        raise InputError(f"replay: --workers must be at least 1, got {args.workers}")
    if args.jobs is not None and args.jobs < 1:
        raise InputError(f"replay: --jobs must be at least 1, got {args.jobs}")
    jobs = args.jobs if args.jobs is not None else default_jobs()
    if args.frontier:
        return _frontier(args, jobs)
    chosen = args.pruner or names
    unknown = [n for n in chosen if n not in names]
    if unknown:
        raise InputError(f"replay: unknown pruner {unknown[0]!r}; choose from {', '.join(names)}")
    sweep = _read_sweep(args)  # a bad file is said before any note on the pruners
    for name, why in peers.unavailable(chosen).items():  # a peer's library is a dev extra, not a dependency
        print(f"replay: {name} skipped: {why}", file=sys.stderr)
        chosen = [n for n in chosen if n != name]
    surrogate = None
    needs = [n for n in chosen if n in peers.REFERENCE_PRUNERS]
    if needs:
        surrogate = peers.load_surrogate(surrogate=args.surrogate, reference=args.reference)
        if surrogate is None:
            print(f"replay: {', '.join(needs)} skipped: give --surrogate or --reference (a calibration set "
                  "other than the sweep itself); collapse-online needs neither", file=sys.stderr)
            chosen = [n for n in chosen if n not in needs]
    if not chosen:
        raise InputError("replay: no pruner left to replay (see the notes above)")
    factories = [peers.factory(n, surrogate=surrogate) for n in chosen]
    print(f"replay {args.curves}: {sweep.n_trials} trials, {_reports(sweep)}, "
          f"{args.orders} orders, {args.workers} workers, {len(factories)} pruner(s), {jobs} job(s); each "
          "pruner's row as its orders finish, then the table:", file=sys.stderr)
    print(format_header(), file=sys.stderr)
    summaries, _ = replay(sweep, factories, orders=args.orders, workers=args.workers, seed=args.seed,
                          jobs=jobs, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(markdown_table(summaries) if args.markdown else format_table(summaries))
    if not args.markdown:
        print(f"late: share of the unpruned sweep's tokens spent on trials pruned after t_hat "
              f"{LATE_FRACTION:g}")
    if args.csv:
        write_summary_csv(args.csv, summaries)
    if args.plot:
        plot_compute_regret(args.plot, summaries, title=f"replay of {os.path.basename(args.curves)}")
    return 0


def _reports(sweep: Any) -> str:
    """The report count of ``sweep`` for the header, naming the points left out as too close together."""
    from collapse_hpo.hpo.replays.replay import STEP_SCALE  # deferred: pulls numpy; --help stays fast

    if not sweep.merged:
        return f"{sweep.grid.size} reports each"
    return (f"{sweep.grid.size} reports each ({sweep.merged} points closer than 1/{STEP_SCALE} of training "
            "to the one before left out)")


def _read_sweep(args: argparse.Namespace):
    """Check the output paths, read the curves (a long read's progress and the reader's notes on stderr) and
    put them on the report grid (`hpo.replays.replay.make_sweep`)."""
    from collapse_hpo.hpo.replays.replay import make_sweep  # deferred: pulls numpy; --help stays fast
    from collapse_hpo.predictors.curves import read_curves_csv  # deferred: pulls numpy; --help stays fast

    for out in (args.csv, args.plot):
        if out and not os.path.isdir(os.path.dirname(os.path.abspath(out))):
            raise InputError(f"replay: output folder of {out} does not exist; create it first")
    check_outputs(args.csv, args.plot, what="replay output")
    curves = read_curves_csv(args.curves, progress=stderr_progress("replay"))
    print_notes("replay", curves)
    return make_sweep(curves, n_reports=args.reports,
                      name=os.path.splitext(os.path.basename(args.curves))[0], source=args.curves)


def _frontier(args: argparse.Namespace, jobs: int) -> int:
    """`replay --frontier`: every setting of each family's knob grid, the table and the coverage lines."""
    from collapse_hpo.hpo.replays import frontier as fr  # deferred: pulls numpy; --help stays fast
    from collapse_hpo.hpo.replays import peers  # deferred: pulls numpy; --help stays fast

    families = list(dict.fromkeys(args.family or peers.FRONTIER_KNOBS))
    unknown = [f for f in families if f not in peers.FRONTIER_KNOBS]
    if unknown:
        raise InputError(f"replay: unknown family {unknown[0]!r}; choose from "
                         f"{', '.join(peers.FRONTIER_KNOBS)} (--family list shows their knobs)")
    if args.markdown:
        raise InputError("replay: --markdown is for the pruner table; --frontier prints its own table")
    sweep = _read_sweep(args)
    for family, module in peers.FRONTIER_OPTIONAL.items():
        if family in families and peers.unavailable_module(module):
            print(f"replay: family {family} skipped: {peers.missing_library_note(module)}", file=sys.stderr)
            families.remove(family)
    surrogate = None
    if "collapse" in families:
        surrogate = peers.load_surrogate(surrogate=args.surrogate, reference=args.reference)
        if surrogate is None:
            print("replay: family collapse skipped: give --surrogate or --reference (a calibration set other "
                  "than the sweep itself); collapse-online needs neither", file=sys.stderr)
            families.remove("collapse")
    if not families:
        raise InputError("replay: no family left to sweep (see the notes above)")
    print(f"replay --frontier {args.curves}: {sweep.n_trials} trials, {_reports(sweep)}, "
          f"{args.orders} orders, {args.workers} workers, families {', '.join(families)}, {jobs} job(s)",
          file=sys.stderr)
    points = fr.frontier(sweep, families, surrogate=surrogate, orders=args.orders, workers=args.workers,
                         seed=args.seed, jobs=jobs,
                         progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(fr.format_frontier(points))
    ours = [f for f in families if f in peers.FRONTIER_OURS]
    for mine in ours:
        for peer in (f for f in families if f not in peers.FRONTIER_OURS):
            c = fr.coverage(points, mine, peer)
            print(f"{mine} vs {peer}: {c.covered}/{c.total} frontier points at no more compute and mean "
                  "regret" + (f" (missed: {', '.join(c.missed)})" if c.missed else ""))
    if args.csv:
        fr.write_frontier_csv(args.csv, points)
    if args.plot:
        fr.plot_frontier(args.plot, points, title=f"frontiers of {os.path.basename(args.curves)} "
                                                  f"({args.orders} orders)")
    return 0
