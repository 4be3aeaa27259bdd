"""`collapse-hpo resume SWEEP.yaml`: continue an interrupted sweep from its Optuna storage."""

from __future__ import annotations

import argparse

from collapse_hpo.hpo.commands.run import add_arguments as _add_arguments

HELP = "continue an interrupted sweep: finished trials are kept, stale running ones rerun"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Same arguments as `run` (they locate the sweep)."""
    _add_arguments(parser, no_prune_help="continue the unpruned sweep that `run --no-prune` started (study "
                   "'<name>-noprune' in '<results>-noprune' unless --results is given)")


def run(args: argparse.Namespace) -> int:
    """Open the study, fail trials whose heartbeat went stale, requeue their slots, run the rest, report."""
    from collapse_hpo.hpo.extras import require
    from collapse_hpo.hpo.sweep.config import load_sweep
    from collapse_hpo.hpo.sweep.finish import finish
    from collapse_hpo.hpo.sweep.runner import locate, run_sweep

    require("a sweep", "ray", "torch")  # the driver runs trials on Ray; each trains with torch

    sweep = load_sweep(args.sweep)
    if sweep.stages:
        from collapse_hpo.hpo.commands.run import run_staged

        return run_staged(sweep, args, resume=True)
    from collapse_hpo.hpo.sweep.stop import STOP

    loc = locate(sweep, args.results, no_prune=args.no_prune)
    study = run_sweep(sweep, loc, resume=True)
    return finish(study, sweep, loc, stop_signal=STOP.signum)
