"""What the commands share: printing the reader's notes and progress, checking output paths before
any work, and the error of a sweep with no results yet."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

from collapse_hpo.predictors.atomic import check_writable_file
from collapse_hpo.predictors.errors import InputError


def print_notes(command: str, curves: Iterable[Any]) -> None:
    """Print each curve's reader notes (``Curve.notes``: a value read differently, a diverged run) to stderr,
    one line each, as ``collapse-hpo COMMAND: note: ...``."""
    for c in curves:
        for note in getattr(c, "notes", []):
            print(f"collapse-hpo {command}: note: {note}", file=sys.stderr)


def stderr_progress(command: str) -> Callable[[str], None]:
    """A progress callback for a long read (`read_curves_csv`'s ``progress``): one line on stderr each, as
    ``collapse-hpo COMMAND: reading FILE: N rows (P% of M MB, S s)``."""
    return lambda line: print(f"collapse-hpo {command}: {line}", file=sys.stderr, flush=True)


def check_outputs(*paths: str | None, what: str = "output") -> None:
    """Check, before any work, that each given output path can be written (its folder exists and is
    writable; it is not a folder). InputError (one line) otherwise."""
    for p in paths:
        if p:
            check_writable_file(p, what)


def no_sweep_results(source: Any, results: Any) -> InputError:
    """The one-line error of `report` and `dashboard` on a sweep file with no results yet in ``results``,
    saying where results are looked for (they go under the working directory unless the file's ``results:``
    or ``--results`` says otherwise) and the three ways on."""
    return InputError(f"{source}: no sweep results in {results} (results/<name> under the working directory, "
                      f"unless the file's results: or --results says where): run `collapse-hpo run {source}` "
                      "first, or run this from the folder it ran in, or give --results DIR")
