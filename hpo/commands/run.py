"""`collapse-hpo run SWEEP.yaml`: run a sweep on Ray; print the results table and the compute saved."""

from __future__ import annotations

import argparse

from collapse_hpo.hpo.extras import require

# the end of a sweep, shared with `resume`, `report` and stages (hpo/sweep/finish.py)
from collapse_hpo.hpo.sweep.finish import finish, publish_dashboard  # noqa: F401
from collapse_hpo.hpo.sweep.stop import STOP

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
    return run_sweep_file(args, resume=False)


def run_sweep_file(args: argparse.Namespace, *, resume: bool) -> int:
    """`run` (``resume=False``) and `resume` (``resume=True``) of ``args.sweep``: check the extras, load the
    file, run its trials (both stages of a file with ``stages:``), then finish (table, compute saved, report).

    ``resume`` is handed to the runner: it opens the existing study, fails trials whose heartbeat went stale
    and requeues their slots (hpo/sweep/runner.py ``run_sweep``)."""
    from collapse_hpo.hpo.sweep.config import load_sweep  # deferred: pulls pydantic; --help stays fast

    require("a sweep", "ray", "torch")  # the driver runs trials on Ray; each trains with torch
    from collapse_hpo.hpo.sweep.runner import locate, run_sweep  # deferred: pulls pydantic; --help stays fast

    sweep = load_sweep(args.sweep)
    if sweep.stages:
        return run_staged(sweep, args, resume=resume)

    loc = locate(sweep, args.results, no_prune=args.no_prune)
    study = run_sweep(sweep, loc, resume=resume)
    return finish(study, sweep, loc, stop_signal=STOP.signum)


def run_staged(sweep, args: argparse.Namespace, *, resume: bool) -> int:
    """`run` / `resume` of a sweep with ``stages:`` (hpo/sweep/stages.py): both stages, then their report."""
    from collapse_hpo.hpo.sweep.stages import (  # deferred: pulls pydantic; --help stays fast
        finish_stages,
        run_stages,
        stage_locations,
    )

    locs = stage_locations(sweep, args.results, no_prune=args.no_prune)
    studies = run_stages(sweep, args.results, no_prune=args.no_prune, resume=resume)
    return finish_stages(sweep, locs, list(studies))
