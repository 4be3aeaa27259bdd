"""`collapse-hpo report SWEEP.yaml` (or `--storage URL --study NAME`): the results table (printed and CSV),
curves CSV, plots, compute saved.

With ``--storage`` the study may come from anywhere: a plain Optuna objective with the CollapsePruner, Ray
Tune's mirror (``CollapseScheduler(storage=..., study_name=...)``) or Hugging Face's
``hyperparameter_search``; each trial's training length and units are the ones its pruner recorded."""

from __future__ import annotations

import argparse

from collapse_hpo.hpo.commands._common import no_sweep_results
from collapse_hpo.hpo.commands._study import load_named_study, storage_for
from collapse_hpo.hpo.commands.run import add_arguments as _add_arguments
from collapse_hpo.hpo.sweep.finish import finish
from collapse_hpo.hpo.sweep.urls import mask_url
from collapse_hpo.predictors.atomic import check_writable_dir, clean_stale_tmp
from collapse_hpo.predictors.errors import InputError

HELP = ("print a sweep's or any study's results table and compute saved; write results.csv, curves.csv, "
        "curves.png")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of `run` (they locate the sweep), or ``--storage URL --study NAME`` for any study."""
    _add_arguments(parser, no_prune_help="report the unpruned sweep that `run --no-prune` trained (study "
                   "'<name>-noprune' in '<results>-noprune' unless --results is given); trains nothing",
                   sweep_optional=True)
    parser.add_argument("--storage", metavar="URL", default=None,
                        help="an Optuna storage URL instead of a sweep file (e.g. sqlite:///sweep.db): a "
                             "study made by plain Optuna, Ray Tune's mirror or Hugging Face")
    parser.add_argument("--study", metavar="NAME", default=None,
                        help="with --storage: the study's name (default: the storage's only study); files go "
                             "to --results, default results/<NAME>")


def run(args: argparse.Namespace) -> int:
    """Read the study (finished, running or interrupted) and write the report; trains nothing."""
    import optuna

    if (args.sweep is None) == (args.storage is None):
        raise InputError("report: give a sweep file or --storage URL (one of them)")
    if args.storage is not None:
        return _report_study(args)
    if args.study is not None:
        raise InputError("report: --study names a study in --storage; a sweep file names its own")

    from collapse_hpo.hpo.sweep.config import load_sweep  # deferred: pulls pydantic; --help stays fast
    from collapse_hpo.hpo.sweep.preflight import (
        check_for_report,  # deferred: pulls pydantic; --help stays fast
    )
    from collapse_hpo.hpo.sweep.runner import (  # deferred: pulls pydantic; --help stays fast
        locate,
        open_study,
    )

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sweep = load_sweep(args.sweep)
    _check_results_folder(args.results)
    loc = locate(sweep, args.results, no_prune=args.no_prune)
    check_for_report(sweep, loc.results, loc.storage_url)
    if sweep.stages:
        return _report_staged(sweep, loc, args)
    if loc.storage_url.startswith("sqlite") and not (loc.results / "study.db").exists() and not sweep.storage:
        raise no_sweep_results(sweep.source, loc.results)
    study = open_study(sweep, loc)
    clean_stale_tmp(loc.results)
    return finish(study, sweep, loc)


def _report_staged(sweep, loc, args: argparse.Namespace) -> int:
    """`report` of a sweep with ``stages:``: both stages' tables, the transfer and the rank agreement."""
    from collapse_hpo.hpo.sweep.stages import (  # deferred: pulls pydantic; --help stays fast
        finish_stages,
        open_stages,
        stage_locations,
    )

    if loc.storage_url.startswith("sqlite") and not (loc.results / "study.db").exists() and not sweep.storage:
        raise no_sweep_results(sweep.source, loc.results)
    locs = stage_locations(sweep, args.results, no_prune=args.no_prune)
    studies = open_stages(sweep, locs)
    clean_stale_tmp(loc.results)
    return finish_stages(sweep, locs, studies)


def _report_study(args: argparse.Namespace) -> int:
    """`report --storage URL [--study NAME]`: the same table and files for a study made outside a sweep file.
    Exit status 1 when every trial FAILed, as for a sweep."""
    import re
    import sys
    from pathlib import Path

    import optuna

    from collapse_hpo.hpo.outputs.report import (  # deferred: pulls numpy; --help stays fast
        check_report_outputs,
        study_unpruned,
        write_report,
    )
    from collapse_hpo.hpo.sweep.runner import all_failed  # deferred: pulls pydantic; --help stays fast

    if args.no_prune:
        raise InputError("report: --no-prune names a sweep file's unpruned run; with --storage, name the "
                         "study with --study")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = storage_for(args.storage)
    study = load_named_study(url, args.study)
    _check_started(study, args.storage)
    # a study name may hold any character: the default folder keeps letters, digits, '.', '_' and '-'
    folder = re.sub(r"[^A-Za-z0-9._-]+", "_", study.study_name).strip("._") or "study"
    out = Path(args.results) if args.results is not None else Path("results") / folder
    parent = out.parent if str(out.parent) else Path(".")
    if out.is_dir():
        check_report_outputs(out)
    elif args.results is None:  # the default folder: results/ is made in a writable current folder
        check_writable_dir(parent if parent.is_dir() else Path("."), "report")
    elif not parent.is_dir():
        raise InputError(f"--results {out}: folder {parent} does not exist; create it first")
    else:
        check_writable_dir(parent, "report")
    unpruned, units = study_unpruned(study)
    table, lines = write_report(study, out, unpruned, None, title=study.study_name, units=units, sweep=False)
    print(table)
    for line in lines:
        print(line)
    print(f"review it in optuna-dashboard: collapse-hpo dashboard --storage {mask_url(args.storage)}")
    failed = all_failed(study)
    if failed is not None:
        print(f"collapse-hpo: error: study {study.study_name!r}: {failed}", file=sys.stderr)
        return 1
    return 0


def _check_started(study, storage: str) -> None:
    """A study with no trial begun yet (none, or only enqueued WAITING ones) has nothing to report: one
    InputError line naming it (exit status 2, nothing written), as for a storage that holds no study."""
    import optuna

    trials = study.get_trials(deepcopy=False)
    waiting = sum(t.state == optuna.trial.TrialState.WAITING for t in trials)
    if len(trials) == waiting:
        queued = f" ({waiting} enqueued, none started)" if waiting else ""
        raise InputError(f"study {study.study_name!r} in {mask_url(storage)}: no trials yet{queued}, so "
                         "nothing to report (no files written); run its objective first")


def _check_results_folder(results: str | None) -> None:
    """A ``--results`` folder must exist already: `report` only reads a sweep, it never creates one."""
    from pathlib import Path

    if results is not None and not Path(results).is_dir():
        raise InputError(f"--results {results}: no such folder; give the folder the sweep wrote its "
                         "results to (or leave --results out for the one in the sweep file)")
