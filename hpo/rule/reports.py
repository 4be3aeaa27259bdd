"""The one cleaning of a trial's reports, for the rule (``decision.decide``) and the judge around it.

A trial reports ``(t̂, loss)`` pairs in any order. Cleaned, they are: reports with an invalid t̂ (NaN, inf,
negative) dropped; the rest sorted by t̂, the first of repeated t̂ kept; a NaN, inf or non-positive loss
marks the run diverged (judged at once, on every report, past the end included); reports past t̂ = 1
(``T_HAT_END``) dropped. Each kind of dropped report is noted, in the words a decision's reason uses.

Three forms, one code path (``_summary`` words the notes and the summary for all of them):

- ``clean(t_hat, loss)`` → ``CleanReports``: the kept curve and its summary; ``decide`` judges it, and the
  judge hands ``decide_cleaned`` the one it made (issue 22, "one cleaning");
- ``clean_reports(t_hat, loss)`` → ``Reports``: the summary alone (fraction, diverged, notes);
- ``ReportSummary``: the same summary kept up to date one report at a time (O(1) per report), for the
  adapters' curve caches (hpo/rule/curve.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "T_HAT_END", "CleanReports", "ReportSummary", "Reports", "clean", "clean_reports", "invalid_note",
    "past_end_note", "past_note", "repeat_note", "sort_reports",
]

# Tolerance on t̂ = 1: a report at exactly total_tokens (or a rounding hair past it) is the end of training.
T_HAT_END = 1.0 + 1e-9


@dataclass(frozen=True)
class Reports:
    """A trial's reports cleaned as ``decide`` reads them, in summary (the judge needs the same fraction).

    Attributes:
        fraction: t̂ of the latest valid report (at most 1); NaN without one, and NaN when diverged.
        diverged: a NaN, inf or non-positive loss was reported (``decide`` prunes at once).
        notes: what was ignored (invalid t̂, repeats, past-the-end points), worded as ``decide`` words it.
    """

    fraction: float
    diverged: bool
    notes: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class CleanReports:
    """A trial's reports cleaned once (``clean``): what ``decide_cleaned`` judges.

    Attributes:
        t_hat: the kept reports' t̂, ascending and distinct (invalid t̂ and repeats dropped; past-the-end
            reports dropped too, unless the run diverged).
        loss: their losses, same length.
        summary: the ``Reports`` summary (fraction, diverged, notes).
        valid: how many reports had a valid t̂ (repeats dropped), past-the-end ones included; 0: none.
        bad: (t̂, loss) of the report that shows the divergence when ``summary.diverged`` (the first
            non-finite loss by t̂, else the first non-positive one), else None.
    """

    t_hat: np.ndarray
    loss: np.ndarray
    summary: Reports
    valid: int
    bad: tuple[float, float] | None = None


def sort_reports(t: np.ndarray, y: np.ndarray, notes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Reports with an invalid t̂ dropped, the rest sorted by t̂, the first of repeated t̂ kept; each kind of
    dropped report noted in ``notes``."""
    bad_t = ~np.isfinite(t) | (t < 0)
    if bad_t.any():
        notes.append(invalid_note(int(bad_t.sum())))
        t, y = t[~bad_t], y[~bad_t]
    if t.size == 0:
        return t, y
    order = np.argsort(t, kind="stable")
    t, y = t[order], y[order]
    dup = np.concatenate([[False], np.diff(t) == 0])
    if dup.any():
        notes.append(repeat_note(int(dup.sum())))
        t, y = t[~dup], y[~dup]
    return t, y


def invalid_note(count: int) -> str:
    """The note for ``count`` reports with an invalid t̂ (NaN, inf or negative)."""
    return f"{count} report(s) with an invalid t_hat ignored"


def repeat_note(count: int) -> str:
    """The note for ``count`` reports at a t̂ reported before (the first is kept)."""
    return f"{count} repeated report(s) at the same t_hat ignored (first kept)"


def past_end_note(t: np.ndarray, past: np.ndarray) -> str:
    """The note for reports past t̂ = 1 (``past`` marks them in ``t``)."""
    return past_note(int(past.sum()), float(t.max()))


def past_note(count: int, largest: float) -> str:
    """The note for ``count`` reports past t̂ = 1, the largest t̂ reported being ``largest``."""
    return f"{count} report(s) past t_hat=1 (up to {largest:.4g}) ignored: check total_tokens"


def _summary(
    *, invalid: int, valid: int, repeated: int, diverged: bool, past: int, largest: float, latest: float
) -> Reports:
    """The summary of cleaned reports from their counts (``clean`` and ``ReportSummary`` both end here).

    ``invalid``/``repeated``/``past``: reports dropped for an invalid t̂, a repeated t̂, a t̂ past the end;
    ``valid``: reports kept before the past-the-end drop; ``largest``: their largest t̂; ``latest``: their
    largest t̂ ≤ ``T_HAT_END`` (NaN without one).
    """
    notes: list[str] = []
    if invalid:
        notes.append(invalid_note(invalid))
    if not valid:
        return Reports(math.nan, False, tuple(notes))
    if repeated:
        notes.append(repeat_note(repeated))
    if diverged:
        return Reports(math.nan, True, tuple(notes))
    if past:
        notes.append(past_note(past, largest))
        if math.isnan(latest):
            return Reports(math.nan, False, tuple(notes))
    return Reports(float(min(latest, 1.0)), False, tuple(notes))


def clean(t_hat: Sequence[float] | np.ndarray, loss: Sequence[float] | np.ndarray) -> CleanReports:
    """Clean a trial's reports once (see the module docstring). Raises ValueError when ``t_hat`` and ``loss``
    differ in length (a caller bug)."""
    t = np.asarray(t_hat, dtype=float).ravel()
    y = np.asarray(loss, dtype=float).ravel()
    if t.shape != y.shape:
        raise ValueError(f"clean: t_hat has {t.size} points but loss has {y.size}")
    n = t.size
    bad_t = ~np.isfinite(t) | (t < 0)
    invalid = int(bad_t.sum())
    t, y = sort_reports(t, y, [])
    valid = int(t.size)
    repeated = n - invalid - valid
    if valid == 0:
        return CleanReports(t, y, _summary(invalid=invalid, valid=0, repeated=0, diverged=False, past=0,
                                           largest=math.nan, latest=math.nan), 0)
    # Divergence is judged on every report, also those past t̂ = 1: a NaN is a NaN.
    nonfinite = ~np.isfinite(y)
    shown = nonfinite if nonfinite.any() else y <= 0
    if shown.any():
        i = int(np.flatnonzero(shown)[0])
        summary = _summary(invalid=invalid, valid=valid, repeated=repeated, diverged=True, past=0,
                           largest=math.nan, latest=math.nan)
        return CleanReports(t, y, summary, valid, (float(t[i]), float(y[i])))
    past = t > T_HAT_END
    largest = float(t.max())
    if past.any():
        t, y = t[~past], y[~past]
    latest = float(t[-1]) if t.size else math.nan
    summary = _summary(invalid=invalid, valid=valid, repeated=repeated, diverged=False, past=int(past.sum()),
                       largest=largest, latest=latest)
    return CleanReports(t, y, summary, valid)


def clean_reports(t_hat: Sequence[float] | np.ndarray, loss: Sequence[float] | np.ndarray) -> Reports:
    """The summary of ``clean(t_hat, loss)``: drop invalid t̂, keep the first of repeated t̂, flag divergence,
    drop t̂ > 1."""
    return clean(t_hat, loss).summary


class ReportSummary:
    """``clean_reports`` of a trial's reports, kept up to date one report at a time (O(1) per report).

    Feed the reports in the order of the sequences the judge would clean (``add``); ``reports()`` then equals
    ``clean_reports(t_hat, loss)`` of all of them. Memory: the set of t̂ seen (to find repeats).
    """

    def __init__(self) -> None:
        self._seen: set[float] = set()
        self._invalid = 0
        self._repeated = 0
        self._past = 0
        self._largest = -math.inf  # largest kept t̂ (past the end included)
        self._latest = math.nan  # largest kept t̂ ≤ T_HAT_END
        self._diverged = False
        self.count = 0  # reports added

    def add(self, t_hat: float, loss: float) -> None:
        """Take one more report (t̂, loss)."""
        self.count += 1
        t, y = float(t_hat), float(loss)
        if not math.isfinite(t) or t < 0:
            self._invalid += 1
            return
        if t in self._seen:
            self._repeated += 1
            return
        self._seen.add(t)
        if not (math.isfinite(y) and y > 0):
            self._diverged = True
        self._largest = max(self._largest, t)
        if t > T_HAT_END:
            self._past += 1
        elif not t <= self._latest:  # NaN at first
            self._latest = t

    def reports(self) -> Reports:
        """What ``clean_reports`` gives for the reports added so far."""
        return _summary(invalid=self._invalid, valid=len(self._seen), repeated=self._repeated,
                        diverged=self._diverged, past=self._past, largest=self._largest, latest=self._latest)
