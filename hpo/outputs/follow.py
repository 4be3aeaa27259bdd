"""A curve CSV that a live run is still writing, read the way ``tail -F`` reads a log (`collapse-hpo monitor
--follow`).

Each `FollowedCurves.poll` reads the bytes appended since the last one and hands every complete line (ended
by a newline) to a `CurveReader`; a last line without its newline is kept until the rest arrives (what a
block-buffered logger leaves between two flushes). The file is followed by name:

- truncated (smaller than what was read, e.g. ``copytruncate`` rotation or a logger that restarts the file):
  read again from its start; the rows read before are kept;
- rotated (the name now points to another file, e.g. renamed to ``run.csv.1`` and a new ``run.csv``
  created): the old file is read to its end, then the new one from its start;
- missing (between a rename and the new file, or not created yet): waited for, while the old file (if one
  was open) is still read: a logger writes its last buffered rows there before it opens the new one.

A new file's first line is its header: the same header again is skipped, a different one is refused (the
columns would be read under the wrong names). Line numbers in messages are the current file's.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import BinaryIO

from collapse_hpo.predictors.curves import Curve, CurveReader
from collapse_hpo.predictors.errors import InputError, excerpt


class FollowedCurves:
    """The curves of a live curve CSV at ``path`` (see the module docstring); ``events`` collects what
    happened to the file (truncated, rotated, missing), one line each, for the caller to print."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.reader = CurveReader(self.path)
        self.header: list[str] | None = None
        self.events: list[str] = []
        self._fh: BinaryIO | None = None
        self._ident: tuple[int, int] | None = None
        self._offset = 0
        self._partial = b""
        self._line = 0
        self._missing_said = False

    def poll(self) -> int:
        """Read what was appended (following truncation and rotation); the number of new complete lines."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if st is None:  # renamed or removed, no new file yet: the old one may still receive the last rows
            if not self._missing_said:
                self.events.append(f"{self.path}: no such file yet; waiting for it")
                self._missing_said = True
            return self._read() if self._fh is not None else 0
        self._missing_said = False
        new = 0
        if self._fh is not None and (st.st_dev, st.st_ino) != self._ident:
            new += self._read()  # rotated: what the old file still holds, then the new one
            if self._partial:
                self.events.append(f"{self.path}: rotated; the old file's last line was never completed "
                                   f"({len(self._partial)} bytes), left out")
            else:
                self.events.append(f"{self.path}: rotated (a new file has the name); reading the new file")
            self._close()
        if self._fh is None:
            if not self.path.is_file():
                raise InputError(f"{self.path}: not a regular file; give the curve CSV the run writes")
            self._fh = open(self.path, "rb")  # noqa: SIM115 (kept open between polls, closed in _close)
            fst = os.fstat(self._fh.fileno())
            self._ident = (fst.st_dev, fst.st_ino)
            self._offset, self._partial, self._line = 0, b"", 0
        elif os.fstat(self._fh.fileno()).st_size < self._offset:
            self.events.append(f"{self.path}: truncated; reading it again from its start (the rows read "
                               "before are kept)")
            self._offset, self._partial, self._line = 0, b"", 0
        return new + self._read()

    def curves(self) -> list[Curve] | None:
        """The curves of the complete rows read so far, or None while there are none."""
        if not self.reader.runs:
            return None
        return self.reader.curves()

    def close(self) -> None:
        """Close the file (a later `poll` opens it again)."""
        self._close()

    def _close(self) -> None:
        if self._fh is not None:
            self._fh.close()
        self._fh, self._ident = None, None

    def _read(self) -> int:
        assert self._fh is not None
        self._fh.seek(self._offset)
        data = self._fh.read()
        self._offset += len(data)
        if not data:
            return 0
        *lines, self._partial = (self._partial + data).split(b"\n")
        for raw in lines:
            self._line += 1
            self._take(raw, self._line)
        return len(lines)

    def _take(self, raw: bytes, line_no: int) -> None:
        try:
            text = raw.decode("utf-8-sig" if line_no == 1 else "utf-8").rstrip("\r")
        except UnicodeDecodeError as err:
            raise InputError(f"{self.path}: line {line_no}: not UTF-8 text ({err.reason})") from None
        try:
            row = next(csv.reader([text]), [])
        except csv.Error as err:
            raise InputError(f"{self.path}: line {line_no}: malformed CSV ({err})") from None
        if line_no == 1:
            if self.header is None:
                self.reader.header(row)
                self.header = row
                return
            if row == self.header:
                return
            if [c.strip() for c in row][:1] == [self.header[0].strip()]:
                raise InputError(f"{self.path}: line 1: the header changed to {excerpt(','.join(row))} "
                                 f"(it was {excerpt(','.join(self.header))}); monitor one file layout")
        if self.header is None:
            raise InputError(f"{self.path}: line {line_no}: no header line before the data")
        self.reader.add(row, line_no)
