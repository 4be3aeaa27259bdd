"""The ``CollapseScheduler``'s state on disk: a snapshot and an append-only journal (state format version 3).

Two files side by side (hpo/ray_side/scheduler.py says where: the experiment directory by default):

- the **snapshot** ``collapse_scheduler_state.json`` (or the ``state_path`` given): one JSON object
  ``{"format": "collapse-hpo-scheduler-state", "version": 3, "metric", "time_attr", "seq",
  "collapse_warnings": [...], "trials": {trial_id: TrialRecord fields}}``; ``seq`` is the number of the last
  journal line it includes;
- the **journal** ``collapse_scheduler_state.journal.json`` (the snapshot's name with ``.journal`` before
  ``.json``; JSON lines despite the suffix: Ray Tune's restore copies only ``*.json``/``*.pkl`` files down
  from remote storage): one line per change, ``{"seq": n, "ops": [op, ...]}`` with ``seq`` counting up by
  one. An op is one of ``["trial", id, record]`` (a new or replaced record), ``["report", id, t_hat, loss,
  progress]`` (a point appended to the curve), ``["set", id, {field: value}]``, ``["log", id, entry]`` (a
  decision entry appended to the log), ``["warn", warning]``. The scheduler writes one line per callback
  (a result, a trial added or ended), so a result and the decision it caused are one line: both or neither.

Cost. A result appends one line (about 100–300 bytes, more at a judgement): the cost does not grow with the
curve or the number of trials. Each line is written to the operating system at once (``os.write`` on a
descriptor opened with ``O_APPEND``: a crash of the process loses nothing written). It is fsynced when it
holds a prune, a trial added or ended, a mirrored Optuna trial created or a warning (what a restore must
never lose or repeat), and otherwise with the first line written ``FSYNC_EVERY_S`` or more after the oldest
unsynced one (else the OS writes it back by itself within its dirty-page interval). Only a machine crash or
power loss can lose unsynced lines: reports and kept judgements of the last seconds, which the restored
trials report again (a trial restarted from a checkpoint or from scratch re-reports its points; t̂ beyond
the record is new to the scheduler, so they are taken and judged again). An fsync per result would cost
more than the rest of the result.

Compaction. When the journal outgrows ``max(COMPACT_MIN_BYTES, size of the last snapshot)``, at ``save``,
and whenever a scheduler loads the state, the whole state is written as a new snapshot (``atomic_write``:
temporary file, fsync, rename, fsync of the folder) and the journal is then emptied. A crash between the two
leaves journal lines the snapshot already holds: their ``seq`` is ≤ the snapshot's, and loading skips them.
Growing the bound with the snapshot keeps the amortized cost per result constant.

Loading (``read_state``: ``CollapseScheduler.load_state``, ``restore``, a restored Tune run): the snapshot,
then every journal line with a larger ``seq``, in order, through the same ``apply`` the writer uses, so the
loaded state is the state the writer had. A last line that is cut short (the process died while writing it)
is ignored with a ``StateNote`` warning saying so; any other bad line, or a gap in ``seq``, is an InputError
naming the file and the line. Version 1 and 2 files (one whole JSON object, no journal) are still read.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import time
import warnings
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from collapse_hpo.hpo.rule.record import (
    DECISIONS_ATTR,
    FRACTION_STEPS,
    UNITS,
    DecisionEntry,
    TrialControls,
    read_log,
)
from collapse_hpo.hpo.sweep.urls import mask_url
from collapse_hpo.predictors.atomic import atomic_write, describe_os_error
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.schedules import Schedule

STATE_FILE = "collapse_scheduler_state.json"
STATE_FORMAT = "collapse-hpo-scheduler-state"
#: 3: snapshot + journal. 2: one JSON object, ``log`` holds DecisionEntry dicts. 1: ``log`` holds
#: [t̂, prune, prediction] lists. All three are read.
STATE_VERSION = 3
WARNINGS_KEY = "collapse_warnings"  # = hpo.rule.record.WARNINGS_ATTR (the same list in the study)
#: Optuna steps per unit t̂ when the trainable reports t̂ (units "fraction"; the mirror's total then).
T_HAT_STEPS = FRACTION_STEPS
#: Record statuses. "stopped": ended before t̂ = COMPLETE_T_HAT, not by this scheduler.
STATUSES = ("running", "pruned", "complete", "stopped", "error")
#: The journal is compacted once it is larger than this and than the last snapshot (bytes).
COMPACT_MIN_BYTES = 1 << 20
#: A journal line that needs no fsync of its own is fsynced at most this long after it was written (s).
FSYNC_EVERY_S = 5.0


class StateNote(UserWarning):
    """Something loading the scheduler state noticed and worked around (a last journal line cut short)."""


@dataclass
class TrialRecord:
    """What the scheduler knows about one Tune trial (the state holds one per trial).

    Attributes:
        trial_id: Ray Tune trial id (stable across ``Tuner.restore``).
        status: one of STATUSES.
        t_hat: training fractions of the accepted reports (strictly increasing).
        loss: the metric at those fractions (NaN kept: it means divergence).
        progress: the progress reported at those reports, in ``units`` (or None when only t̂ is known).
        units: what ``progress`` and ``total`` count: "tokens", "steps" or "fraction" (hpo/rule/record.py
        UNITS). schedule, tau, tpp, total: the trial's controls (schedule as ``Schedule.to_dict()``; ``total``
        the
            training length in ``units``). State files before ``units`` existed hold ``tokens`` and
            ``total_tokens`` (read as these, in tokens).
        decision: the latest decision's user attrs (``prune_reason`` always; ``error`` after a failure).
        final_loss: the loss at the last report when the trial completed.
        replayed: reports received again after a restore (t̂ not beyond the last accepted one).
        log: every judgement, oldest first, as ``record.DecisionEntry`` dicts (the pruner's log entries).
        optuna_trial_id: the mirrored Optuna trial (storage trial id), when mirroring.
        config: the trial config, JSON-safe, for the mirror and for people reading the file.
        searched: the config keys Tune's search drew (``Trial.evaluated_params``, "/"-joined); the other
            keys are constants of the param space and are not mirrored as Optuna params. None: unknown.
    """

    trial_id: str
    status: str = "running"
    t_hat: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    progress: list[float | None] = field(default_factory=list)
    schedule: dict[str, Any] = field(default_factory=lambda: Schedule().to_dict())
    tau: float | None = None
    tpp: float | None = None
    total: float | None = None
    units: str = "tokens"
    decision: dict[str, Any] | None = None
    final_loss: float | None = None
    replayed: int = 0
    log: list[dict[str, Any]] = field(default_factory=list)
    optuna_trial_id: int | None = None
    optuna_number: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    searched: list[str] | None = None

    def steps(self) -> list[int]:
        """The reports' steps: the progress when known, else round(t̂ · T_HAT_STEPS) (the mirror's steps)."""
        return [step_of(t, k) for t, k in zip(self.t_hat, self.progress)]

    def controls(self) -> TrialControls:
        """The trial's controls as hpo/rule/record.py's ``TrialControls`` (what the judge and the pruner
        read); the record keeps them as the file's fields (schedule as a dict)."""
        return TrialControls(total=self.total, units=self.units, schedule=Schedule.from_dict(self.schedule),
                             tau=self.tau, tpp=self.tpp)

    def entries(self, start: int = 0) -> list[DecisionEntry]:
        """The decision log from entry ``start`` on as hpo/rule/record.py's ``DecisionEntry`` (``read_log``:
        a malformed entry is skipped); the record keeps the file's dicts."""
        return read_log({DECISIONS_ATTR: self.log[start:]})


def step_of(t_hat: float, progress: float | None) -> int:
    """One report's step: the progress in the trial's units when known, else round(t̂ · T_HAT_STEPS)."""
    return round(progress) if progress is not None else round(t_hat * T_HAT_STEPS)


#: The record fields a "set" op may change (the others change through "report" and "log").
SETTABLE = frozenset(f.name for f in fields(TrialRecord)) - {"trial_id", "t_hat", "loss", "progress", "log"}
_KNOWN = frozenset(f.name for f in fields(TrialRecord))
#: Record keys of state files written before ``units`` existed, and their names now (both were in tokens).
_LEGACY = {"tokens": "progress", "total_tokens": "total"}


@dataclass
class SchedulerState:
    """The whole state: every trial's record (by Tune trial id, in the order added), the warnings said
    (``{key, message, trial}``), and ``seq``, the number of the last change applied."""

    records: dict[str, TrialRecord] = field(default_factory=dict)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    seq: int = 0


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    return _is_number(value) and math.isfinite(value)


def _check_schedule(value: Any) -> bool:
    try:
        Schedule.from_dict(value)
    except (InputError, TypeError, ValueError):
        return False
    return True


# What each record field must hold (JSON types), and how the check says it. NaN/inf are kept in losses:
# they mean divergence. The file is trusted only once every field passed.
_FIELD_RULES: dict[str, tuple[Any, str]] = {
    "trial_id": (lambda v: isinstance(v, str), "a string"),
    "status": (lambda v: v in STATUSES, "one of " + ", ".join(STATUSES)),
    "t_hat": (lambda v: isinstance(v, list) and all(_finite(x) and x >= 0 for x in v),
              "a list of finite numbers >= 0"),
    "loss": (lambda v: isinstance(v, list) and all(_is_number(x) for x in v), "a list of numbers"),
    "progress": (lambda v: isinstance(v, list) and all(x is None or (_finite(x) and x >= 0) for x in v),
                 "a list of finite numbers >= 0 or nulls"),
    "schedule": (_check_schedule, "a schedule object (kind, warmup, decay, final, points)"),
    "tau": (lambda v: v is None or (_finite(v) and v > 0), "a finite number > 0 or null"),
    "tpp": (lambda v: v is None or (_finite(v) and v > 0), "a finite number > 0 or null"),
    "total": (lambda v: v is None or (_finite(v) and v > 0), "a finite number > 0 or null"),
    "units": (lambda v: v in UNITS, "one of " + ", ".join(UNITS)),
    "decision": (lambda v: v is None or isinstance(v, dict), "an object or null"),
    "final_loss": (lambda v: v is None or _is_number(v), "a number or null"),
    "replayed": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a whole number >= 0"),
    "log": (lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v), "a list of objects"),
    "optuna_trial_id": (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
                        "a whole number or null"),
    "optuna_number": (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
                      "a whole number or null"),
    "config": (lambda v: isinstance(v, dict), "an object"),
    "searched": (lambda v: v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
                 "a list of strings or null"),
}


def _check_field(tid: str, name: str, value: Any) -> None:
    ok, wanted = _FIELD_RULES[name]
    if not ok(value):
        raise ValueError(f"trial {tid!r}: field {name!r} must be {wanted}, got {_shown(value)}")


def check_record(rec: TrialRecord) -> None:
    """Raise ValueError naming the trial and the field when ``rec`` (read from a file) breaks the schema."""
    for f in fields(TrialRecord):
        _check_field(rec.trial_id, f.name, getattr(rec, f.name))
    if not len(rec.t_hat) == len(rec.loss) == len(rec.progress):
        raise ValueError(f"trial {rec.trial_id!r}: fields 't_hat', 'loss' and 'progress' differ in length "
                         f"({len(rec.t_hat)}, {len(rec.loss)}, {len(rec.progress)})")


_OP_LENGTHS = {"report": 5, "set": 3, "log": 3, "trial": 3, "warn": 2}


def apply(state: SchedulerState, op: list[Any]) -> None:
    """Apply one journal op to ``state`` (the writer and the reader both go through here). A malformed op
    (wrong shape, unknown trial, a value of the wrong type) raises ValueError naming the field, and leaves
    the state unchanged."""
    if not isinstance(op, list) or not op or op[0] not in _OP_LENGTHS:
        raise ValueError(f"unknown op {_shown(op)}")
    kind = op[0]
    if len(op) != _OP_LENGTHS[kind]:
        raise ValueError(f"op {kind!r} must have {_OP_LENGTHS[kind]} items, got {len(op)}")
    if kind == "warn":
        if not isinstance(op[1], dict):
            raise ValueError(f"a warning must be an object, got {_shown(op[1])}")
        state.warnings.append(dict(op[1]))
        return
    tid = op[1]
    if not isinstance(tid, str):
        raise ValueError(f"a trial id must be a string, got {_shown(tid)}")
    if kind == "trial":
        state.records[tid] = record_from_dict(copy.deepcopy(op[2]), tid)
        return
    if tid not in state.records:
        raise ValueError(f"op {kind!r} names trial {tid!r}, which has no record")
    rec = state.records[tid]
    if kind == "report":
        _check_field(tid, "t_hat", [op[2]])
        _check_field(tid, "loss", [op[3]])
        _check_field(tid, "progress", [op[4]])
        rec.t_hat.append(op[2])
        rec.loss.append(op[3])
        rec.progress.append(op[4])
    elif kind == "set":
        if not isinstance(op[2], dict):
            raise ValueError(f"op 'set' of trial {tid!r} must hold an object of fields, got {_shown(op[2])}")
        values = {_LEGACY.get(name, name): value for name, value in op[2].items()}
        for name, value in values.items():
            if name not in SETTABLE:
                raise ValueError(f"field {name!r} cannot be set")
            _check_field(tid, name, value)
        for name, value in values.items():
            setattr(rec, name, copy.deepcopy(value))  # the op is written later: the record must not share it
    else:  # "log"
        if not isinstance(op[2], dict):
            raise ValueError(f"trial {tid!r}: a log entry must be an object, got {_shown(op[2])}")
        rec.log.append(op[2])


def record_from_dict(d: Any, tid: str, version: int = STATE_VERSION) -> TrialRecord:
    """A TrialRecord from its JSON dict (``version`` 1 logs are converted); ValueError naming the trial and
    the field when it breaks the schema (`check_record`)."""
    if not isinstance(d, dict):
        raise ValueError(f"trial {tid!r}: its record must be an object, got {_shown(d)}")
    d = {_LEGACY.get(k, k): v for k, v in d.items()}
    if d.get("status") not in STATUSES:
        raise ValueError(f"trial {tid!r}: field 'status' must be one of {', '.join(STATUSES)}, "
                         f"got {_shown(d.get('status'))}")
    unknown = sorted(set(d) - _KNOWN)
    if unknown and version == STATE_VERSION:  # older versions' extra fields are dropped
        raise ValueError(f"trial {tid!r}: unknown field(s) {', '.join(map(repr, unknown))}")
    rec = TrialRecord(**{k: v for k, v in d.items() if k in _KNOWN}, **({} if "trial_id" in d else
                                                                         {"trial_id": tid}))
    if rec.trial_id != tid:
        raise ValueError(f"trial {tid!r}: field 'trial_id' is {_shown(rec.trial_id)}, not the record's key")
    if version == 1:  # version 1 logged [t̂, prune, prediction]: the entry type holds the same facts
        _check_field(tid, "total", rec.total)
        if not isinstance(rec.log, list) or not all(isinstance(x, list | tuple) for x in rec.log):
            raise ValueError(f"trial {tid!r}: field 'log' must be a list of [t_hat, prune, prediction]")
        rec.log = [_v1_entry(item, rec) for item in rec.log]
    check_record(rec)
    return rec


def _v1_entry(item: Any, rec: TrialRecord) -> dict[str, Any]:
    t, prune, pred = [*list(item), None, None, None][:3]
    return DecisionEntry(
        step=round(float(t) * (rec.total or T_HAT_STEPS)), t_hat=t, n=0, prune=bool(prune),
        predicted_final_loss=pred, predicted_low=None, predicted_high=None, threshold=None,
        threshold_trial=None, reference=None, reason="(from a version-1 state file)",
    ).to_dict()


def journal_path(state_path: str) -> str:
    """The journal beside a snapshot: ``x.json`` -> ``x.journal.json`` (else ``x`` -> ``x.journal.json``)."""
    base = state_path[: -len(".json")] if state_path.endswith(".json") else state_path
    return base + ".journal.json"


# ---------------------------------------------------------------------------------------------- reading
def _dumps(value: Any) -> str:
    return json.dumps(value, allow_nan=True, separators=(",", ":"))


def parse_state(snapshot: str, journal: str | None, where: str) -> tuple[SchedulerState, list[str]]:
    """The state held by a snapshot's text and its journal's text (None: no journal), and the notes on what
    was worked around. ``where`` names the snapshot in errors. Raises InputError on a damaged state."""
    try:
        data = json.loads(snapshot)
    except json.JSONDecodeError as err:
        raise InputError(
            f"{where}: unreadable CollapseScheduler state ({type(err).__name__}); delete it to start the "
            "scheduler afresh (its decisions so far are then forgotten)"
        ) from None
    version = data.get("version") if isinstance(data, dict) and data.get("format") == STATE_FORMAT else None
    if version not in (1, 2, STATE_VERSION):
        raise InputError(f"{where}: not a CollapseScheduler state file (format/version); delete or move it")
    seq = data.get("seq", 0) if version == STATE_VERSION else 0
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise InputError(f"{where}: field 'seq' must be a whole number >= 0, got {_shown(seq)}; the state is "
                         "damaged: delete the file to start afresh")
    trials = data.get("trials", {})
    if not isinstance(trials, dict):
        raise InputError(f"{where}: field 'trials' must be an object of trial records, got {_shown(trials)}; "
                         "the state is damaged: delete the file to start afresh")
    found = data.get(WARNINGS_KEY, [])
    if not isinstance(found, list) or not all(isinstance(w, dict) for w in found):
        raise InputError(f"{where}: field {WARNINGS_KEY!r} must be a list of objects, got {_shown(found)}; "
                         "the state is damaged: delete the file to start afresh")
    state = SchedulerState(seq=seq, warnings=[dict(w) for w in found])
    try:
        for tid, d in trials.items():
            state.records[tid] = record_from_dict(d, tid, version)
    except (TypeError, ValueError) as err:
        raise InputError(f"{where}: {err}; the state is damaged: delete the file to start afresh") from None
    notes: list[str] = []
    if version == STATE_VERSION and journal:
        _replay(state, journal, journal_path(where), notes)
    return state, notes


def _replay(state: SchedulerState, text: str, where: str, notes: list[str]) -> None:
    lines = text.split("\n")
    last = len(lines) - 1
    while last >= 0 and not lines[last].strip():
        last -= 1
    for number, line in enumerate(lines[: last + 1], start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            seq, ops = item["seq"], item["ops"]
            if not isinstance(seq, int) or not isinstance(ops, list):
                raise TypeError("seq must be an integer and ops a list")
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            if number == last + 1:
                notes.append(
                    f"{where}: line {number}, the last, is incomplete (the scheduler stopped while writing "
                    "it); ignored: the result it held is taken again when the restored trial re-reports it"
                )
                return
            raise InputError(
                f"{where}: line {number} is not a journal entry ({type(err).__name__}); the state is "
                "damaged: move the journal away to go back to the last snapshot (later decisions are then "
                "forgotten)"
            ) from None
        if seq <= state.seq:
            continue  # already in the snapshot (a compaction was interrupted after the snapshot was written)
        if seq != state.seq + 1:
            raise InputError(
                f"{where}: line {number} has seq {seq} after {state.seq}: journal lines are missing; move "
                "the journal away to go back to the last snapshot (later decisions are then forgotten)"
            )
        try:
            for op in ops:
                apply(state, op)
        except (IndexError, KeyError, TypeError, ValueError) as err:
            raise InputError(
                f"{where}: line {number} cannot be applied ({err}); move the journal away to go back to the "
                "last snapshot (later decisions are then forgotten)"
            ) from None
        state.seq = seq


def read_state(path: str | os.PathLike[str]) -> SchedulerState:
    """The state at ``path``: an experiment directory, a snapshot file, or a ``scheme://`` URI of either
    (read through pyarrow). Notes on what was worked around are said as ``StateNote`` warnings. Raises
    InputError naming the path when there is no state or it is unreadable."""
    snapshot, journal, where = _read_texts(os.fspath(path))
    state, notes = parse_state(snapshot, journal, where)
    for note in notes:
        warnings.warn(note, StateNote, stacklevel=2)
    return state


def _read_texts(path: str) -> tuple[str, str | None, str]:
    """The snapshot's text, the journal's text (None when there is none) and the snapshot's name."""
    if "://" in path:
        import pyarrow.fs

        try:
            fs, inner = pyarrow.fs.FileSystem.from_uri(path)
            if fs.get_file_info(inner).type == pyarrow.fs.FileType.Directory:
                inner, path = f"{inner.rstrip('/')}/{STATE_FILE}", f"{path.rstrip('/')}/{STATE_FILE}"
            with fs.open_input_stream(inner) as fh:
                snapshot = fh.read().decode("utf-8")
            journal = None
            if fs.get_file_info(journal_path(inner)).type == pyarrow.fs.FileType.File:
                with fs.open_input_stream(journal_path(inner)) as fh:
                    journal = fh.read().decode("utf-8", errors="replace")
            return snapshot, journal, path
        except (OSError, UnicodeDecodeError, pyarrow.ArrowException) as err:
            raise InputError(f"{mask_url(path)}: cannot read a CollapseScheduler state ({err}); give the "
                             "experiment directory of a run that used CollapseScheduler") from None
    file = Path(path) / STATE_FILE if Path(path).is_dir() else Path(path)
    if not file.is_file():
        raise InputError(
            f"{file}: no CollapseScheduler state here; give the experiment directory of a run that used "
            "CollapseScheduler (ResultGrid.experiment_path), or the state_path it was given"
        )
    return _read_local(str(file))


def _read_local(path: str) -> tuple[str, str | None, str]:
    try:
        snapshot = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(
            f"{path}: unreadable CollapseScheduler state ({type(err).__name__}); delete it to start the "
            "scheduler afresh (its decisions so far are then forgotten)"
        ) from None
    try:
        # errors="replace": a last line cut inside a multi-byte character is still only the last line.
        journal: str | None = Path(journal_path(path)).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        journal = None
    except OSError as err:
        raise InputError(
            f"{journal_path(path)}: unreadable CollapseScheduler journal ({err.strerror})"
        ) from None
    return snapshot, journal, path


# ---------------------------------------------------------------------------------------------- writing
def snapshot_dict(state: SchedulerState, metric: str, time_attr: str) -> dict[str, Any]:
    """The snapshot of ``state`` as a JSON object (version 3)."""
    return {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "metric": metric,
        "time_attr": time_attr,
        "seq": state.seq,
        WARNINGS_KEY: state.warnings,
        "trials": {tid: asdict(r) for tid, r in state.records.items()},
    }


def write_snapshot(path: str, state: SchedulerState, metric: str, time_attr: str) -> int:
    """Write ``state`` as the snapshot at ``path`` (atomically, durably) and remove any journal beside it;
    returns the snapshot's size in bytes. A standalone copy (``CollapseScheduler.save``)."""
    text = _dumps(snapshot_dict(state, metric, time_attr))
    with atomic_write(path) as fh:
        fh.write(text)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(journal_path(path))
    return len(text)


class StateWriter:
    """Keeps one scheduler state on disk as it changes: ``change`` ops now, ``commit`` them as one journal
    line; compacts as the module docstring says.

    Args:
        path: the snapshot's path (the journal is ``journal_path(path)``).
        state: the state as loaded (it is compacted at once: a fresh snapshot and an empty journal).
        metric, time_attr: recorded in the snapshot for people reading it.
    """

    def __init__(self, path: str, state: SchedulerState, metric: str, time_attr: str) -> None:
        self.path, self.journal = path, journal_path(path)
        self.state, self.metric, self.time_attr = state, metric, time_attr
        self._ops: list[list[Any]] = []
        self._durable = False
        self._fd: int | None = None
        self._journal_bytes = 0
        self._snapshot_bytes = 0
        self._unsynced_since: float | None = None
        self.compact()

    def change(self, op: list[Any], *, durable: bool = False) -> None:
        """Apply one op to the state now; it is written at the next ``commit`` (fsynced there when
        ``durable``)."""
        apply(self.state, op)
        self._ops.append(op)
        self._durable = self._durable or durable

    def commit(self) -> None:
        """Write the pending ops as one journal line (nothing when there are none), then compact when the
        journal has outgrown its bound."""
        if not self._ops:
            return
        self.state.seq += 1
        line = (_dumps({"seq": self.state.seq, "ops": self._ops}) + "\n").encode("utf-8")
        durable, self._ops, self._durable = self._durable, [], False
        fd = self._open()
        try:
            os.write(fd, line)
            now = time.monotonic()
            if self._unsynced_since is None:
                self._unsynced_since = now
            if durable or now - self._unsynced_since >= FSYNC_EVERY_S:
                os.fsync(fd)
                self._unsynced_since = None
        except OSError as err:
            raise InputError(describe_os_error(self.journal, err)) from None
        self._journal_bytes += len(line)
        if self._journal_bytes > max(COMPACT_MIN_BYTES, self._snapshot_bytes):
            self.compact()

    def compact(self) -> None:
        """Write the whole state as a new snapshot, then empty the journal (pending ops are committed
        first)."""
        if self._ops:
            self.commit()  # compacts itself when due; compacting once more below is harmless
        text = _dumps(snapshot_dict(self.state, self.metric, self.time_attr))
        with atomic_write(self.path) as fh:
            fh.write(text)
        self._snapshot_bytes = len(text)
        fd = self._open()
        os.ftruncate(fd, 0)
        os.fsync(fd)
        self._journal_bytes = 0
        self._unsynced_since = None

    def close(self) -> None:
        """Fsync and close the journal (the state stays readable; a later ``commit`` reopens it)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None

    def _open(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            except OSError as err:
                raise InputError(describe_os_error(self.journal, err)) from None
        return self._fd

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown
            self.close()

