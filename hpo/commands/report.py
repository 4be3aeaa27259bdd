"""`collapse-hpo report SWEEP.yaml`: the results table (printed and CSV), curves CSV, plots, compute saved."""

from __future__ import annotations

import argparse

from collapse_hpo.hpo.commands.run import add_arguments as _add_arguments

HELP = "print a sweep's results table and compute saved; write results.csv, curves.csv, curves.png"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Same arguments as `run` (they locate the sweep)."""
    _add_arguments(parser, no_prune_help="report the unpruned sweep that `run --no-prune` trained (study "
                   "'<name>-noprune' in '<results>-noprune' unless --results is given); trains nothing")


def run(args: argparse.Namespace) -> int:
    """Read the study (finished, running or interrupted) and write the report; trains nothing."""
    import optuna

    from collapse_hpo.hpo.commands.run import finish
    from collapse_hpo.hpo.config import load_sweep
    from collapse_hpo.hpo.preflight import check_for_report
    from collapse_hpo.hpo.runner import locate, open_study
    from collapse_hpo.predictors.atomic import clean_stale_tmp

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sweep = load_sweep(args.sweep)
    _check_results_folder(args.results)
    loc = locate(sweep, args.results, no_prune=args.no_prune)
    check_for_report(sweep, loc.results, loc.storage_url)
    if sweep.stages:
        return _report_staged(sweep, loc, args)
    if loc.storage_url.startswith("sqlite") and not (loc.results / "study.db").exists() and not sweep.storage:
        from collapse_hpo.predictors.errors import InputError

        raise InputError(f"{sweep.source}: no sweep results in {loc.results}: run `collapse-hpo run` first")
    study = open_study(sweep, loc)
    clean_stale_tmp(loc.results)
    return finish(study, sweep, loc)


def _report_staged(sweep, loc, args: argparse.Namespace) -> int:
    """`report` of a sweep with ``stages:``: both stages' tables, the transfer and the rank agreement."""
    from collapse_hpo.hpo.stages import finish_stages, open_stages, stage_locations
    from collapse_hpo.predictors.atomic import clean_stale_tmp

    if loc.storage_url.startswith("sqlite") and not (loc.results / "study.db").exists() and not sweep.storage:
        from collapse_hpo.predictors.errors import InputError

        raise InputError(f"{sweep.source}: no sweep results in {loc.results}: run `collapse-hpo run` first")
    locs = stage_locations(sweep, args.results, no_prune=args.no_prune)
    studies = open_stages(sweep, locs)
    clean_stale_tmp(loc.results)
    return finish_stages(sweep, locs, studies)


def _check_results_folder(results: str | None) -> None:
    """A ``--results`` folder must exist already: `report` only reads a sweep, it never creates one."""
    from pathlib import Path

    from collapse_hpo.predictors.errors import InputError

    if results is not None and not Path(results).is_dir():
        raise InputError(f"--results {results}: no such folder; give the folder the sweep wrote its "
                         "results to (or leave --results out for the one in the sweep file)")
