"""Loss curves and their CSV format.

A curve file has one row per logged point with the columns ``run``, ``t_hat`` (fraction of training tokens),
``loss`` (empty where only the LR is known), ``lr`` (LR at that point; a run's schedule is lr/max(lr) over its
rows), ``tau`` (AdamW timescale, a per-run constant; empty means no weight decay) and ``tpp`` (tokens per
parameter D/N, a per-run constant; empty means not defined, e.g. a fine-tuning run: the surrogate's q(TPP)
is then a constant). An optional column ``params`` (the model's non-embedding parameter count N, a
per-run constant; empty when unknown) lets calibration learn how its error moves with model size. Other extra
columns are ignored. Rows are numbered as lines of the file (the
header is line 1). Every problem raises InputError naming the file, the line and the column.

Reading rules (one line each, never a traceback):

- A UTF-8 byte-order mark before the header is skipped; a column named twice in the header is refused.
- A loss must be positive: zero or negative is refused (a bug in the loss or the logging). A NaN, ±inf, or
  a loss above `MAX_LOSS` (1e400 reads as inf) means the run diverged there: it is never dropped silently;
  the curve records ``diverged_at`` (t̂ of the first such point) and the points from there on are NaN.
- Two rows of one run at the same t̂ with different losses are refused, naming both lines (an identical
  repeat, or a repeat without a loss, is read once).
- An lr below zero by less than `LR_ROUNDING` of the run's peak is float rounding of a decay to zero (a
  linear decay logged in float32 ends at −4.8e-7): it is read as 0 and a note says so (``Curve.notes``).
- t̂ below `MIN_T_HAT` is read as 0 (nothing is trained in 1e-12 of the tokens; keeps the arithmetic
  finite).
"""

from __future__ import annotations

import csv
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from collapse_hpo.predictors import spreadsheet
from collapse_hpo.predictors.atomic import atomic_write
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.schedules import LR_ROUNDING, Schedule

REQUIRED_COLUMNS = ("run", "t_hat", "loss", "lr", "tau", "tpp")
_COLS = ", ".join(REQUIRED_COLUMNS)
#: A finite loss above this is a diverged run, not a training loss (and keeps every ratio finite).
MAX_LOSS = 1e30
# A negative lr within LR_ROUNDING of the run's peak is read as 0 (predictors.schedules.LR_ROUNDING).
#: t̂ below this is read as 0.
MIN_T_HAT = 1e-12
#: tpp and tau above these are beyond any run (and keep every power law finite).
MAX_TPP = 1e9
MAX_TAU = 1e9


@dataclass
class Curve:
    """One training run's loss curve over t̂.

    Attributes:
        run: the run's name.
        t_hat: training fractions (tokens seen / total tokens), sorted ascending.
        loss: training loss at each t̂; NaN where only the LR is known.
        lr: the LR at each t̂ (any units), or None.
        schedule: the LR schedule shape (peak 1).
        tau: AdamW timescale B/(ηλD); None when the run has no weight decay.
        tpp: tokens per parameter D/N; None when not defined (e.g. fine-tuning: the pre-trained model's
            tokens are not this run's), which needs a surrogate whose q(TPP) is a constant.
        meta: free-form extras (e.g. synthetic ground truth); not written to CSV.
        params: non-embedding parameter count N of the model, or None when unknown.
        diverged_at: t̂ of the first NaN/inf/huge loss read from a file (the run diverged there; the points
            from there on are NaN), or None.
        notes: what the reader changed and why (e.g. a −4.8e-7 lr read as 0), one line each.
    """

    run: str
    t_hat: np.ndarray
    loss: np.ndarray
    lr: np.ndarray | None = None
    schedule: Schedule = field(default_factory=Schedule)
    tau: float | None = None
    tpp: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    diverged_at: float | None = None
    notes: list[str] = field(default_factory=list)
    params: float | None = None

    def __post_init__(self) -> None:
        self.t_hat = np.asarray(self.t_hat, dtype=float)
        self.loss = np.asarray(self.loss, dtype=float)
        if self.lr is not None:
            self.lr = np.asarray(self.lr, dtype=float)
        if self.t_hat.shape != self.loss.shape or self.t_hat.ndim != 1:
            raise InputError(f"curve {self.run!r}: t_hat and loss must be 1-D arrays of the same length")
        if self.lr is not None and self.lr.shape != self.t_hat.shape:
            raise InputError(f"curve {self.run!r}: lr must have the same length as t_hat")
        if self.tpp is not None and not (math.isfinite(self.tpp) and self.tpp > 0):
            raise InputError(f"curve {self.run!r}: tpp must be a positive number or None (not defined), "
                             f"got {self.tpp!r}")
        if self.params is not None and not (math.isfinite(self.params) and self.params > 0):
            raise InputError(f"curve {self.run!r}: params must be a positive number, got {self.params!r}")

    @property
    def observed(self) -> np.ndarray:
        """Boolean mask of points with a finite loss."""
        return np.isfinite(self.loss)

    @property
    def final_loss(self) -> float:
        """The last finite loss of the curve (NaN when it has none)."""
        idx = np.flatnonzero(self.observed)
        return float(self.loss[idx[-1]]) if idx.size else math.nan

    @property
    def last_t_hat(self) -> float:
        """t̂ of the last finite loss (NaN when it has none)."""
        idx = np.flatnonzero(self.observed)
        return float(self.t_hat[idx[-1]]) if idx.size else math.nan

    @property
    def complete(self) -> bool:
        """True when the curve has a finite loss at t̂ ≥ 0.99 (its final loss is known)."""
        last = self.last_t_hat
        return bool(math.isfinite(last) and last >= 0.99)

    def truncated(self, fraction: float) -> Curve:
        """The same run with only the points at t̂ ≤ ``fraction`` (schedule and constants kept)."""
        keep = self.t_hat <= fraction + 1e-12
        return Curve(
            run=self.run,
            t_hat=self.t_hat[keep],
            loss=self.loss[keep],
            lr=None if self.lr is None else self.lr[keep],
            schedule=self.schedule,
            tau=self.tau,
            tpp=self.tpp,
            meta=dict(self.meta),
            diverged_at=self.diverged_at if self.diverged_at is not None and self.diverged_at <= fraction
            else None,
            notes=list(self.notes),
            params=self.params,
        )


def some_runs(labels: list[str], most: int = 5) -> str:
    """``labels`` (one per run) for a message: the first ``most``, then how many more."""
    shown = ", ".join(labels[:most])
    return shown + (f" and {len(labels) - most} more" if len(labels) > most else "")


def _parse_float(text: str, where: str, column: str, *, allow_empty: bool) -> float | None:
    s = text.strip()
    if s == "":
        if allow_empty:
            return None
        raise InputError(f"{where}: column {column!r} is empty; give a number")
    try:
        return float(s)
    except ValueError:
        raise InputError(f"{where}: column {column!r} has {s!r}, which is not a number") from None


def _header(p: Path, header: list[str]) -> dict[str, int]:
    names = [h.strip() for h in header]
    twice = sorted({n for n in names if n and names.count(n) > 1})
    if twice:
        raise InputError(f"{p}: line 1: column {twice[0]!r} is named twice in the header; keep one")
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        may_be_empty = [c for c in missing if c in ("tau", "tpp")]
        hint = (f" ({' and '.join(may_be_empty)} may be empty: a header with empty values says "
                "'no weight decay' for tau and 'not defined' for tpp)" if may_be_empty else "")
        raise InputError(f"{p}: line 1: missing column(s) {', '.join(missing)}; required: {_COLS}{hint}")
    col = {c: names.index(c) for c in REQUIRED_COLUMNS}
    if "params" in names:
        col["params"] = names.index("params")
    return col


def _loss_value(loss: float | None, where: str) -> tuple[float, str | None]:
    """(the loss to keep, why the run diverged here or None); InputError for a zero or negative loss."""
    if loss is None:
        return math.nan, None
    if math.isnan(loss) or math.isinf(loss) or abs(loss) > MAX_LOSS:
        return math.nan, f"loss {loss:g}"
    if loss <= 0.0:
        raise InputError(f"{where}: column 'loss' is {loss:g}; a training loss must be positive (a bug in "
                         "the loss or the logging)")
    return loss, None


#: A run of at most this many rows is kept whole (every row, as logged). Real curve files hold a few thousand
#: rows per run (the largest external set, qiu's mlp curves: about 6 300 rows in all).
MAX_RUN_ROWS = 20_000
#: A run of more rows is resampled while it is read, on a grid of this many equal bins of t̂: each bin keeps
#: its row of largest t̂ with a finite loss and its row of largest t̂ (an lr-only row), and the run keeps its
#: first row of peak lr, so at most 2 · DOWNSAMPLE_BINS + 1 points. 1/4000 of training is 4x finer than the
#: finest report grid (`hpo.replays.replay.STEP_SCALE`: 1/1000), and the last loss, the peak lr, the
#: divergence point and the lr rounding rule (computed over every row) are those of the whole run.
DOWNSAMPLE_BINS = 4000
#: A read that takes longer than this (seconds) reports its progress every PROGRESS_EVERY_S seconds.
PROGRESS_AFTER_S = 2.0
PROGRESS_EVERY_S = 5.0


class _Run:
    """The rows of one run read so far: every row while there are at most `MAX_RUN_ROWS`, then one or two
    per bin of `DOWNSAMPLE_BINS` (see there). A point is [t̂, loss (NaN: none or diverged), lr (NaN: none),
    line]."""

    def __init__(self, tau: float | None, tpp: float | None, params: float | None, line: int) -> None:
        self.tau, self.tpp, self.params, self.line = tau, tpp, params, line
        self.raw: tuple[str, str, str | None] | None = None  # the text of tau, tpp, params in its first row
        self.points: list[list[float]] = []
        self.at: dict[float, list[float]] = {}  # t̂ -> its point (whole runs: every point; binned: the kept)
        self.bins: dict[int, list[list[float] | None]] | None = None  # bin -> [loss point, last point]
        self.rows = 0
        self.diverged: tuple[float, str, int] | None = None  # the first (t̂, what, line) of a diverged loss
        self.peak: list[float] | None = None  # the first point of the largest lr
        self.lowest: tuple[float, int] | None = None  # the most negative lr and its line
        self.negative = 0  # rows with an lr below zero

    def add(self, where: str, run: str, t: float, value: float, lr: float | None, line: int) -> None:
        """One row (``value`` NaN: no loss, or a diverged one); InputError for a conflicting repeat."""
        self.rows += 1
        if lr is not None and lr < 0.0:
            self.negative += 1
            if self.lowest is None or lr < self.lowest[0]:
                self.lowest = (lr, line)
        prev = self.at.get(t)
        if prev is not None:
            old = prev[1]
            has_old, has_new = not math.isnan(old), not math.isnan(value)
            if has_old and has_new and old != value:
                raise InputError(f"{where}: run {run!r} has a second row at t_hat={t:g} with loss "
                                 f"{value:g} (line {int(prev[3])} has {old:g}); keep one row per point")
            if has_new and not has_old:
                prev[1] = value
                if self.bins is not None:
                    self._bin(prev)
            if lr is not None and math.isnan(prev[2]):
                prev[2] = lr
                self._peak(prev)
            return
        point = [t, value, math.nan if lr is None else lr, float(line)]
        self._peak(point)
        if self.bins is None:
            self.points.append(point)
            self.at[t] = point
            if len(self.points) > MAX_RUN_ROWS:
                self.bins = {}
                self.at = {}
                for kept in self.points:
                    self._bin(kept)
                self.points = []
        else:
            self._bin(point)

    def _peak(self, point: list[float]) -> None:
        if not math.isnan(point[2]) and (self.peak is None or point[2] > self.peak[2]):
            self.peak = point

    def _bin(self, point: list[float]) -> None:
        """Keep ``point`` in its bin if it is the bin's latest point with a loss, or its latest point."""
        assert self.bins is not None
        t = point[0]
        b = int(t * DOWNSAMPLE_BINS)
        if b >= DOWNSAMPLE_BINS:
            b = DOWNSAMPLE_BINS - 1
        # A loss at or after the first divergence read so far is not a loss (it is NaN in the curve): the
        # bin keeps the last finite loss before it (exact for rows in t̂ order, as a logger writes them).
        lossy = not math.isnan(point[1]) and (self.diverged is None or t < self.diverged[0])
        slot = self.bins.get(b)
        if slot is None:
            self.bins[b] = [point if lossy else None, point]
            self.at[t] = point
            return
        loss_pt, last_pt = slot
        if lossy and (loss_pt is None or t > loss_pt[0] or loss_pt is point):
            slot[0] = point
        if t > last_pt[0]:  # type: ignore[index]
            slot[1] = point
        for old in (loss_pt, last_pt):
            if old is not None and old is not slot[0] and old is not slot[1]:
                self.at.pop(old[0], None)
        if point is slot[0] or point is slot[1]:
            self.at[t] = point

    def kept(self) -> list[list[float]]:
        """The points kept (every row's, or the bins' and the peak lr's), in the order they were read."""
        if self.bins is None:
            return self.points
        points = sorted({id(p): p for slot in self.bins.values() for p in slot if p is not None}.values(),
                        key=lambda p: p[3])
        if self.peak is not None and all(p[0] != self.peak[0] for p in points):
            points.append(self.peak)  # dropped from its bin (sharing its t̂ with a bin's point: not needed)
        return points


class CurveReader:
    """Curve CSV rows read one at a time into `Curve` objects: a whole file (`read_curves_csv`) or the rows of
    a live log as they arrive (`collapse-hpo monitor --follow`). Memory is bounded by the rows kept per run
    (`MAX_RUN_ROWS`, then `DOWNSAMPLE_BINS`), not by the rows of the file.

    ``source`` names the file in every message; `header` takes the header row, `add` each data row with its
    line number, `curves` builds the curves read so far (and can be called again after more rows).
    """

    def __init__(self, source: str | os.PathLike[str]) -> None:
        self.source = Path(source)
        self.col: dict[str, int] | None = None
        self.width = 0
        self.runs: dict[str, _Run] = {}
        self.rows = 0
        self._prefix = f"{self.source}: line "

    def header(self, header: list[str]) -> None:
        """The header row (line 1); InputError for a column named twice or a required column missing."""
        self.col = _header(self.source, header)
        self.width = max(v for k, v in self.col.items() if k != "params") + 1

    def add(self, row: list[str], line_no: int) -> None:
        """One data row (an empty row is skipped); InputError naming the line and column when it is bad."""
        col = self.col
        assert col is not None, "header() first"
        if not row:
            return
        if (len(row) < self.width or not row[col["run"]].strip()) and all(not c.strip() for c in row):
            return
        where = f"{self._prefix}{line_no}"
        if len(row) < self.width:
            short = [c for c in REQUIRED_COLUMNS if col[c] >= len(row)]
            raise InputError(f"{where}: row has {len(row)} fields; column(s) {', '.join(short)} missing")
        run = spreadsheet.unescape(row[col["run"]].strip()).strip()
        if not run:
            raise InputError(f"{where}: column 'run' is empty; give the run's name")
        t = _parse_float(row[col["t_hat"]], where, "t_hat", allow_empty=False)
        assert t is not None
        if not math.isfinite(t) or t < 0.0 or t > 1.0 + 1e-9:
            raise InputError(f"{where}: column 't_hat' is {t}; it must be a fraction of tokens in [0, 1]")
        t = 0.0 if t < MIN_T_HAT else t
        loss, diverged = _loss_value(_parse_float(row[col["loss"]], where, "loss", allow_empty=True), where)
        lr = _parse_float(row[col["lr"]], where, "lr", allow_empty=True)
        if lr is not None and not math.isfinite(lr):
            raise InputError(f"{where}: column 'lr' is {lr}; it must be a non-negative finite number")
        has_params = "params" in col and col["params"] < len(row)
        raw = (row[col["tau"]], row[col["tpp"]], row[col["params"]] if has_params else None)
        r = self.runs.get(run)
        if r is None or raw != r.raw:  # the constants' text of the run's first row was read and checked once
            r = self._constants(row, raw, run, r, where, line_no)
        if diverged is not None and (r.diverged is None or (t, line_no) < (r.diverged[0], r.diverged[2])):
            r.diverged = (t, diverged, line_no)
        self.rows += 1
        r.add(where, run, t, math.nan if diverged is not None else loss, lr, line_no)

    def _constants(self, row: list[str], raw: tuple[str, str, str | None], run: str, r: _Run | None,
                   where: str, line_no: int) -> _Run:
        """Read and check the per-run constants (tau, tpp, params) of a row: a new run's, or text that differs
        from its first row's; InputError when a value is bad or changes within the run."""
        col = self.col
        assert col is not None
        tau = _parse_float(row[col["tau"]], where, "tau", allow_empty=True)
        if tau is not None and tau == math.inf:
            tau = None
        if tau is not None and (not math.isfinite(tau) or tau <= 0.0 or tau > MAX_TAU):
            raise InputError(f"{where}: column 'tau' is {tau}; give a positive number up to "
                             f"{MAX_TAU:g}, or leave it empty for no weight decay")
        tpp = _parse_float(row[col["tpp"]], where, "tpp", allow_empty=True)
        if tpp is not None and (not math.isfinite(tpp) or tpp <= 0.0 or tpp > MAX_TPP):
            raise InputError(f"{where}: column 'tpp' is {tpp}; give a positive number up to "
                             f"{MAX_TPP:g}, or leave it empty when the run has no TPP (fine-tuning)")
        params = None
        if raw[2] is not None:
            params = _parse_float(row[col["params"]], where, "params", allow_empty=True)
            if params is not None and (not math.isfinite(params) or params <= 0.0):
                raise InputError(f"{where}: column 'params' is {params}; give the model's parameter "
                                 "count N (a positive number), or leave it empty")
        if r is None:
            r = self.runs[run] = _Run(tau, tpp, params, line_no)
            r.raw = raw
        else:
            if r.params != params:
                raise InputError(f"{where}: column 'params' changes within run {run!r} "
                                 f"(line {r.line} has {r.params}); it is a per-run constant")
            if r.tau != tau:
                raise InputError(f"{where}: column 'tau' changes within run {run!r} "
                                 f"(line {r.line} has {r.tau}); it is a per-run constant")
            if (r.tpp is None) != (tpp is None) or (
                tpp is not None and not math.isclose(r.tpp, tpp, rel_tol=1e-9)  # type: ignore[arg-type]
            ):
                was = "it empty" if r.tpp is None else r.tpp
                raise InputError(f"{where}: column 'tpp' changes within run {run!r} "
                                 f"(line {r.line} has {was}); it is a per-run constant")
        return r

    def curves(self) -> list[Curve]:
        """The curves of the rows read so far, in order of each run's first row; InputError when there are
        none, or for a run without a positive lr."""
        if not self.runs:
            raise InputError(f"{self.source}: no data rows; expected one row per logged point")
        return [_build_curve(self.source, run, r) for run, r in self.runs.items()]


def read_curves_csv(path: str | os.PathLike[str],
                    progress: Callable[[str], None] | None = None) -> list[Curve]:
    """Read a curve CSV (see the module docstring) into curves, in order of first appearance of each run.

    Rows are read one at a time (`CurveReader`): memory is bounded by the points kept per run, and a run of
    more than `MAX_RUN_ROWS` rows is resampled while it is read (see `DOWNSAMPLE_BINS`; its curve's notes
    say so). ``progress``, when given, receives a line (rows read, share of the file) every
    `PROGRESS_EVERY_S` seconds once the read has taken `PROGRESS_AFTER_S`.

    Raises InputError (one line, naming file, line and column) for a missing file or column, a malformed or
    out of range value, per-run constants that change between rows, conflicting rows, or a run without any
    positive lr.
    """
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{p}: is a folder, not a curve file; give the path of a CSV with columns {_COLS}")
    if not p.is_file():
        raise InputError(f"{p}: no such curve file; give the path of a CSV with columns {_COLS}")
    reader = CurveReader(p)
    size = max(p.stat().st_size, 1)
    started = time.monotonic()
    next_report = started + PROGRESS_AFTER_S
    try:
        with p.open(newline="", encoding="utf-8-sig") as fh:
            rows = csv.reader(fh)
            try:
                header = next(rows)
            except StopIteration:
                raise InputError(f"{p}: the file is empty; expected a header with {_COLS}") from None
            reader.header(header)
            for line_no, row in enumerate(rows, start=2):
                reader.add(row, line_no)
                if progress is not None and not line_no & 0xFFFF and time.monotonic() >= next_report:
                    share = min(fh.buffer.tell() / size, 1.0)
                    progress(f"reading {p}: {line_no - 1:,} rows ({share:.0%} of "
                             f"{size / 1e6:.0f} MB, {time.monotonic() - started:.0f} s)")
                    next_report = time.monotonic() + PROGRESS_EVERY_S
    except UnicodeDecodeError as err:
        raise InputError(f"{p}: not a UTF-8 text CSV file ({err.reason})") from None
    except csv.Error as err:
        raise InputError(f"{p}: malformed CSV ({err})") from None
    return reader.curves()


def _build_curve(p: Path, run: str, r: _Run) -> Curve:
    """One run's points as a Curve: sorted by t̂, divergence applied, a rounding-negative lr read as 0."""
    kept = r.kept()
    pts = np.asarray(kept, dtype=float).reshape(-1, 4)
    t, loss, lr, lines = pts[:, 0], pts[:, 1].copy(), pts[:, 2].copy(), pts[:, 3].astype(np.int64)
    order = np.argsort(t, kind="stable")
    t, loss, lr, lines = t[order], loss[order], lr[order], lines[order]
    notes: list[str] = []
    if r.bins is not None:
        notes.append(f"{p}: run {run!r}: {r.rows:,} rows resampled to {t.size:,} points while read (more "
                     f"than {MAX_RUN_ROWS:,} rows: per 1/{DOWNSAMPLE_BINS} of training its last row with a "
                     "loss and its last row; the last loss, peak lr and divergence are the whole run's)")
    finite_lr = lr[np.isfinite(lr)]
    peak = float(finite_lr.max()) if finite_lr.size else 0.0
    if finite_lr.size == 0 or peak <= 0.0:
        raise InputError(f"{p}: line {r.line}: run {run!r} has no positive value in column 'lr'; "
                         "give the LR at its points (its schedule is lr/max(lr))")
    if r.negative:
        low, low_line = r.lowest  # type: ignore[misc]
        if low < -LR_ROUNDING * peak:
            raise InputError(f"{p}: line {low_line}: column 'lr' is {low:g}; it must be "
                             f"non-negative (values above -{LR_ROUNDING:g} of the run's peak {peak:g} are "
                             "read as 0)")
        notes.append(f"{p}: run {run!r}: {r.negative} lr value(s) down to {low:.8g} (line "
                     f"{low_line}) read as 0: within {LR_ROUNDING:g} of the peak {peak:g}, float "
                     "rounding of a decay to zero")
        lr[np.isfinite(lr) & (lr < 0.0)] = 0.0
    diverged_at = None
    if r.diverged is not None:
        first_t, what, line = r.diverged
        diverged_at = float(first_t)
        loss[t >= first_t] = math.nan
        notes.append(f"{p}: line {line}: run {run!r} diverged at t_hat={first_t:g} ({what}); its points from "
                     "there on are not used")
    return Curve(run=run, t_hat=t, loss=loss, lr=lr, schedule=Schedule.from_data(t, lr), tau=r.tau,
                 tpp=r.tpp, diverged_at=diverged_at, notes=notes, params=r.params)


def _fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return repr(float(x))


def write_curves_csv(path: str | os.PathLike[str], curves: list[Curve]) -> None:
    """Write curves in the CSV format above with `collapse_hpo.predictors.atomic.atomic_write` (atomic,
    fsynced, the old file's mode kept; InputError naming the path when it cannot be written).

    A curve without an ``lr`` array gets its schedule's η(t̂) (peak 1) in the lr column. The optional
    ``params`` column is written when any curve has a parameter count.
    """
    sizes = any(c.params is not None for c in curves)
    with atomic_write(path, "w", newline="") as fh:
        w = spreadsheet.writer(fh)  # a run name such as "=x" is written "'=x" (read back as "=x")
        w.writerow(REQUIRED_COLUMNS + (("params",) if sizes else ()))
        for c in curves:
            lr = c.lr if c.lr is not None else np.asarray(c.schedule(c.t_hat), dtype=float)
            extra = [_fmt(c.params)] if sizes else []
            for t, loss, l_r in zip(c.t_hat, c.loss, lr):
                w.writerow([c.run, _fmt(t), _fmt(loss), _fmt(l_r), _fmt(c.tau), _fmt(c.tpp), *extra])
