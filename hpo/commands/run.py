"""`collapse-hpo run SWEEP.yaml`: run a sweep on Ray; print the results table and the compute saved."""

from __future__ import annotations

import argparse

HELP = "run a sweep file: Ray Tune trials with τ held, pruned by the collapse predictor"


NO_PRUNE_HELP = ("train every trial to the end (a separate study '<name>-noprune' in '<results>-noprune' "
                 "unless --results is given)")


def add_arguments(parser: argparse.ArgumentParser, no_prune_help: str = NO_PRUNE_HELP, *,
                  sweep_optional: bool = False) -> None:
    """Arguments of `run` (shared by `resume` and `report`, which say what ``--no-prune`` means for them;
    `report` may name a study with ``--storage`` instead of a sweep file: ``sweep_optional``)."""
    if sweep_optional:
        parser.add_argument("sweep", nargs="?", default=None,
                            help="the sweep YAML file (e.g. studies/quickstart.yaml); or give --storage")
    else:
        parser.add_argument("sweep", help="the sweep YAML file (e.g. studies/quickstart.yaml)")
    parser.add_argument("--no-prune", action="store_true", help=no_prune_help)
    parser.add_argument("--results", metavar="DIR", default=None,
                        help="results folder (default: 'results' in the file, else results/<name>)")


def run(args: argparse.Namespace) -> int:
    """Validate the file, create the study, run every trial, print the table and the compute saved."""
    from collapse_hpo.hpo.config import load_sweep
    from collapse_hpo.hpo.extras import require

    require("a sweep", "ray", "torch")  # the driver runs trials on Ray; each trains with torch
    from collapse_hpo.hpo.runner import locate, run_sweep

    sweep = load_sweep(args.sweep)
    if sweep.stages:
        return run_staged(sweep, args, resume=False)
    from collapse_hpo.hpo.stop import STOP

    loc = locate(sweep, args.results, no_prune=args.no_prune)
    study = run_sweep(sweep, loc, resume=False)
    return finish(study, sweep, loc, stop_signal=STOP.signum)


def run_staged(sweep, args: argparse.Namespace, *, resume: bool) -> int:
    """`run` / `resume` of a sweep with ``stages:`` (hpo/stages.py): both stages, then their report."""
    from collapse_hpo.hpo.stages import finish_stages, run_stages, stage_locations

    locs = stage_locations(sweep, args.results, no_prune=args.no_prune)
    studies = run_stages(sweep, args.results, no_prune=args.no_prune, resume=resume)
    return finish_stages(sweep, locs, list(studies))


def finish(study, sweep, loc, stop_signal: int | None = None) -> int:
    """Write the report files, publish the dashboard figure and notes, print the table and the summary.

    Returns the exit status: 0; 128 + ``stop_signal`` when a signal stopped the sweep (Ctrl-C 130, SIGTERM
    143, SIGHUP 129: hpo/stop.py), with one line on stderr saying so; or 1 when every trial of the sweep
    FAILed (one line): such a sweep found nothing and must not look like a success to a script or CI."""
    import sys

    from collapse_hpo.hpo.report import write_report
    from collapse_hpo.hpo.runner import all_failed, unpruned_tokens

    table, lines = write_report(study, loc.results, unpruned_tokens(sweep, study), sweep.reference_path(),
                                title=loc.study_name)
    print(table)
    for line in lines:
        print(line)
    note = publish_dashboard(study, sweep, loc)
    if note:
        print(note)
    if stop_signal is not None:
        from collapse_hpo.hpo.stop import stopped_line

        print(f"collapse-hpo: {sweep.source}: {stopped_line(stop_signal, sweep.source)}", file=sys.stderr)
        return 128 + stop_signal
    failed = all_failed(study)
    if failed is not None:
        print(f"collapse-hpo: error: {sweep.source}: {failed}", file=sys.stderr)
        return 1
    return 0


def publish_dashboard(study, sweep, loc) -> str:
    """Publish the study figure and per-trial notes to optuna-dashboard (hpo/dashboard.py), if present."""
    import importlib.util

    if importlib.util.find_spec("collapse_hpo.hpo.dashboard") is None:
        return ""
    from collapse_hpo.hpo.extras import missing_note

    absent = missing_note("the dashboard", "optuna_dashboard", "plotly")
    if absent is not None:
        return f"dashboard: not published ({absent})"
    from collapse_hpo.hpo import dashboard

    fn = getattr(dashboard, "publish", None)
    if fn is None:
        return ""
    try:
        fn(study, reference=sweep.pruner.reference.spec(sweep.base_dir()))
    except Exception as err:  # the results are written already; a dashboard problem must not fail the sweep
        return f"dashboard: not published ({type(err).__name__}: {err})"
    flag = " --no-prune" if loc.study_name.endswith("-noprune") else ""
    return f"dashboard: figure and notes published; review with `collapse-hpo dashboard {sweep.source}{flag}`"
