"""CSV cells that a spreadsheet opens as text, never as a formula (CSV injection).

A spreadsheet runs a cell that begins with ``=``, ``+``, ``-`` or ``@`` as a formula, and strips or
interprets a leading tab or carriage return; a run name such as ``=HYPERLINK(...)`` in a curve file would
otherwise reach every CSV this package writes (results.csv, curves.csv, transfer.csv, replay, frontier, and
monitor CSVs). Every CSV writer here goes through `writer` / `DictWriter`, which write such a text cell with a
leading apostrophe (``'=x``): what spreadsheets show as the text ``=x``. Numbers are never changed: a cell
that reads as a number (``-0.5``, ``1e-3``, ``-inf``) is written as it is, so negative values stay numbers.

A text cell that itself begins with an apostrophe gets a second one, so `unescape` (used by the curve reader
on the ``run`` column) is the exact inverse: ``'=x`` reads back as ``=x`` and ``''x`` as ``'x``, and a curve
file written by this package reads back with the names it was given.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

from collapse_hpo.predictors.atomic import atomic_write

#: First characters that make a spreadsheet read a cell as a formula (or mangle it).
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
#: What is put before such a cell (and before a cell that already begins with it).
ESCAPE = "'"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def escape(value: Any) -> Any:
    """``value`` as it may go into a CSV cell: a text that a spreadsheet would read as a formula (or that
    begins with `ESCAPE`) gets `ESCAPE` in front; numbers, number-like text and other values unchanged."""
    if not isinstance(value, str) or not value:
        return value
    if value.startswith(ESCAPE) or (value.startswith(FORMULA_PREFIXES) and not _is_number(value)):
        return ESCAPE + value
    return value


def unescape(text: str) -> str:
    """The text `escape` was given: one leading `ESCAPE` removed when what follows it would have been
    escaped (a formula prefix or another apostrophe); any other text unchanged."""
    if text.startswith(ESCAPE) and text[1:2] and (text[1] == ESCAPE or text[1:].startswith(FORMULA_PREFIXES)):
        return text[1:]
    return text


class _Writer:
    """`csv.writer` whose every cell goes through `escape`."""

    def __init__(self, fh: IO[str], **kwargs: Any) -> None:
        self._w = csv.writer(fh, **kwargs)

    def writerow(self, row: Iterable[Any]) -> Any:
        return self._w.writerow([escape(v) for v in row])

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for row in rows:
            self.writerow(row)


def writer(fh: IO[str], **kwargs: Any) -> _Writer:
    """A `csv.writer` on ``fh`` that escapes formula-like text cells (the one way this package writes CSV
    rows)."""
    return _Writer(fh, **kwargs)


class DictWriter(csv.DictWriter):
    """`csv.DictWriter` whose every value goes through `escape` (the field names are this package's own)."""

    def writerow(self, rowdict: Mapping[str, Any]) -> Any:
        return super().writerow({k: escape(v) for k, v in rowdict.items()})


def write_csv(
    path: str | os.PathLike[str], columns: Sequence[str], rows: Iterable[Mapping[str, Any]]
) -> None:
    """Write ``rows`` (mappings of exactly ``columns``) under a header of ``columns`` to ``path``, atomically
    (`atomic_write`: the old file is kept on any error), every text cell escaped (`DictWriter`)."""
    with atomic_write(path, "w", newline="") as fh:
        w = DictWriter(fh, fieldnames=list(columns))
        w.writeheader()
        for row in rows:
            w.writerow(row)
