"""`collapse-hpo resume SWEEP.yaml`: continue an interrupted sweep from its Optuna storage."""

from __future__ import annotations

import argparse

from collapse_hpo.hpo.commands.run import add_arguments as _add_arguments
from collapse_hpo.hpo.commands.run import run_sweep_file

HELP = "continue an interrupted sweep: finished trials are kept, stale running ones rerun"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Same arguments as `run` (they locate the sweep)."""
    _add_arguments(parser, no_prune_help="continue the unpruned sweep that `run --no-prune` started (study "
                   "'<name>-noprune' in '<results>-noprune' unless --results is given)")


def run(args: argparse.Namespace) -> int:
    """Open the study, fail trials whose heartbeat went stale, requeue their slots, run the rest, report."""
    return run_sweep_file(args, resume=True)
