"""The CollapseScheduler's state on disk: snapshot + append-only journal (hpo/ray_side/scheduler_state.py).

A result appends one journal line instead of rewriting the whole state (issue 13, item 1), so the bytes
written per result do not grow with the curve; the journal reads back to the very state the scheduler held;
a last line cut short by a crash loads with a note; compaction (also an interrupted one) keeps the state;
version-2 files (one whole JSON object) still load and are carried on.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import asdict
from pathlib import Path

import pytest
import ray.cloudpickle as cloudpickle
from ray.tune.schedulers import TrialScheduler

import collapse_hpo.hpo.ray_side.scheduler_state as scheduler_state
from collapse_hpo.hpo.ray_side.scheduler import CollapseScheduler, StateNote
from collapse_hpo.hpo.ray_side.scheduler_state import journal_path
from collapse_hpo.hpo.rule.decision import PruneSettings
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import ErrorBand, Surrogate

SURROGATE = Surrogate(b_c=0.5, b_e=0.3, q_c=1.0, q_e=0.1,
                      error_bands=[ErrorBand(fraction=0.1, n=20, bias=0.0, scale=0.01, max_abs=0.03)])
TAU, TPP = 0.1, 20.0
STOP = TrialScheduler.STOP


class FakeTrial:
    """The parts of ray.tune.experiment.Trial the scheduler uses."""

    def __init__(self, trial_id: str, config: dict | None = None, max_failures: int = 0) -> None:
        self.trial_id, self.config, self.status = trial_id, config or {}, "RUNNING"
        self.max_failures, self.failures = max_failures, 0

    def should_recover(self) -> bool:
        return self.failures <= self.max_failures


def loss_at(final: float, t: float) -> float:
    return final * float(SURROGATE.normalized(t, Schedule(), TAU, TPP)[0])


def make(state: Path, **kw) -> CollapseScheduler:
    kw.setdefault("settings", PruneSettings(min_fraction=0.2))
    s = CollapseScheduler(reference=SURROGATE, tau=TAU, tpp=TPP, state_path=state, **kw)
    assert s.set_search_properties(None, None)
    return s


def run(s: CollapseScheduler, trial: FakeTrial, final: float, steps: int = 20, stop_at: float = 2.0) -> None:
    """Report a curve of ``steps`` points until STOP or ``stop_at``; then end the trial."""
    s.on_trial_add(None, trial)
    result: dict = {}
    for i in range(1, steps + 1):
        result = {"loss": loss_at(final, i / steps), "t_hat": i / steps}
        if s.on_trial_result(None, trial, result) == STOP or i / steps >= stop_at:
            break
    s.on_trial_complete(None, trial, result)


def as_dicts(records: dict) -> dict:
    return {tid: asdict(r) for tid, r in records.items()}


def same(a: object, b: object) -> bool:
    """Equality of JSON-like values with NaN equal to NaN (the state keeps NaN losses)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def a_sweep(state: Path) -> CollapseScheduler:
    """A scheduler that saw every kind of change: completes, prunes, a stop, a divergence, replays, an error
    with a retry, and a warning (a progress key past its total)."""
    s = make(state)
    run(s, FakeTrial("best", {"lr": 0.01}), 3.0)
    run(s, FakeTrial("bad", {"lr": 0.1}), 3.6)
    run(s, FakeTrial("mid", {"lr": 0.02}), 3.3, stop_at=0.1)
    nan = FakeTrial("nan", {"lr": 1.0})
    s.on_trial_add(None, nan)
    s.on_trial_result(None, nan, {"loss": 4.0, "t_hat": 0.05})
    s.on_trial_result(None, nan, {"loss": 4.0, "t_hat": 0.05})  # a replay
    s.on_trial_result(None, nan, {"loss": math.nan, "t_hat": 0.1})
    err = FakeTrial("err", max_failures=1)
    s.on_trial_add(None, err)
    s.on_trial_result(None, err, {"loss": 4.0, "t_hat": 0.3})
    err.failures = 2
    s.on_trial_error(None, err)
    past = FakeTrial("past")
    s.on_trial_add(None, past)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s.on_trial_result(None, past, {"loss": 3.0, "t_hat": 1.5})
    return s


def test_the_journal_reads_back_to_the_state_the_scheduler_held(tmp_path):
    state = tmp_path / "state.json"
    s = a_sweep(state)
    held = as_dicts(s._records)
    assert {r["status"] for r in held.values()} == {"complete", "pruned", "stopped", "error", "running"}
    assert Path(journal_path(str(state))).stat().st_size > 0  # the changes are in the journal
    assert same(as_dicts(CollapseScheduler.load_state(state)), held)
    assert same(CollapseScheduler.load_state(tmp_path / "state.json")["nan"].loss, [4.0, math.nan])
    assert [w["key"] for w in CollapseScheduler.load_warnings(state)] == [w["key"] for w in s.warnings] != []
    # a restored scheduler (what Tuner.restore unpickles) reads the same state and compacts it
    again = cloudpickle.loads(cloudpickle.dumps(make(state)))
    again.on_trial_add(None, FakeTrial("best"))
    assert same(as_dicts(again._records), held)
    assert Path(journal_path(str(state))).stat().st_size == 0
    snapshot = json.loads(state.read_text())
    assert snapshot["version"] == 3 and same(snapshot["trials"], held)
    # Tune's scheduler checkpoint hooks: a standalone snapshot, read back whole
    s.save(str(tmp_path / "checkpoint.json"))
    other = make(tmp_path / "unused.json")
    other.restore(str(tmp_path / "checkpoint.json"))
    assert same(as_dicts(other._records), held) and other.warnings == s.warnings


def test_bytes_written_per_result_do_not_grow_with_the_curve(tmp_path):
    io = Path("/proc/self/io")
    if not io.is_file():
        pytest.skip("needs /proc/self/io (Linux) to count the bytes written")

    def written() -> int:
        return next(int(ln.split()[1]) for ln in io.read_text().splitlines() if ln.startswith("wchar:"))

    s = make(tmp_path / "state.json")
    trial = FakeTrial("long")
    s.on_trial_add(None, trial)
    n, window = 2000, 200
    per_result = {}
    start = written()
    for i in range(1, n + 1):
        if i in (201, n - window + 1):
            start = written()
        s.on_trial_result(None, trial, {"loss": loss_at(3.0, i / n), "t_hat": i / n})
        if i in (200 + window, n):
            per_result[i] = (written() - start) / window
    early, late = per_result[200 + window], per_result[n]
    # One line per result (about 100 bytes; a judgement's entry every 40 results adds ~1 KB): the same at
    # t̂ = 0.1 and at t̂ = 1. Rewriting the whole state wrote the whole curve (~50 KB by the end) per result.
    assert late < 1.5 * early + 100, (early, late)
    assert late < 1000, late


def test_a_last_line_cut_short_by_a_crash_loads_with_a_note(tmp_path):
    state = tmp_path / "state.json"
    s = make(state)
    trial = FakeTrial("t")
    run(s, trial, 3.0, steps=20, stop_at=0.5)  # ended: its record is final
    s.on_trial_add(None, FakeTrial("u"))
    s.on_trial_result(None, FakeTrial("u"), {"loss": 4.0, "t_hat": 0.05})
    before_last = as_dicts(s._records)
    s.on_trial_result(None, FakeTrial("u"), {"loss": 3.9, "t_hat": 0.1})
    journal = Path(journal_path(str(state)))
    text = journal.read_bytes()
    lines = text.rstrip(b"\n").split(b"\n")
    journal.write_bytes(b"\n".join(lines[:-1]) + b"\n" + lines[-1][: len(lines[-1]) // 2])  # torn mid-line
    with pytest.warns(StateNote, match=r"line \d+, the last, is incomplete"):
        loaded = CollapseScheduler.load_state(state)
    assert same(as_dicts(loaded), before_last)  # everything but the torn result
    # a restored scheduler takes it again when the trial re-reports it, and compacts the torn line away
    again = make(state)
    with pytest.warns(StateNote):
        again.on_trial_add(None, FakeTrial("u"))
    assert journal.stat().st_size == 0
    again.on_trial_result(None, FakeTrial("u"), {"loss": 3.9, "t_hat": 0.1})
    assert again._records["u"].t_hat == [0.05, 0.1] and again._records["u"].replayed == 0
    # a bad line that is not the last one is damage, not a crash: refused, naming the file and the line
    journal.write_text('{"seq": 1, "ops": []}\nnot json\n{"seq": 3, "ops": []}\n')
    with pytest.raises(InputError, match=r"journal\.json: line 2 is not a journal entry"):
        CollapseScheduler.load_state(state)


def test_compaction_keeps_the_state_also_when_interrupted(tmp_path, monkeypatch):
    monkeypatch.setattr(scheduler_state, "COMPACT_MIN_BYTES", 4000)
    state = tmp_path / "state.json"
    s = a_sweep(state)
    journal = Path(journal_path(str(state)))
    snapshot = json.loads(state.read_text())
    assert snapshot["seq"] > 0  # compacted during the sweep
    assert journal.stat().st_size <= max(4000, state.stat().st_size) + 2000  # bounded
    held = as_dicts(s._records)
    assert same(as_dicts(CollapseScheduler.load_state(state)), held)
    # A compaction interrupted after the new snapshot was written, before the journal was emptied: the
    # journal's lines are all in the snapshot (seq ≤ its seq) and are skipped.
    run(s, FakeTrial("late"), 3.1, steps=10, stop_at=0.3)
    kept = journal.read_bytes()
    assert kept
    s._writer.compact()
    journal.write_bytes(kept)
    assert same(as_dicts(CollapseScheduler.load_state(state)), as_dicts(s._records))
    # a gap in the journal (lines lost) is refused
    lines = kept.rstrip(b"\n").split(b"\n")
    if len(lines) >= 3:
        state.write_text(json.dumps({**json.loads(state.read_text()), "seq": 0}))
        journal.write_bytes(lines[0] + b"\n" + lines[2] + b"\n")
        with pytest.raises(InputError, match="journal lines are missing"):
            CollapseScheduler.load_state(state)


def test_a_version_2_state_file_is_read_and_carried_on(tmp_path):
    s = a_sweep(tmp_path / "new.json")
    held = as_dicts(s._records)
    old = tmp_path / "old.json"  # what the scheduler wrote before the journal: one JSON object
    old.write_text(json.dumps({"format": "collapse-hpo-scheduler-state", "version": 2, "metric": "loss",
                               "time_attr": "t_hat", "collapse_warnings": s.warnings, "trials": held},
                              indent=1))
    assert same(as_dicts(CollapseScheduler.load_state(old)), held)
    carried = make(old)
    carried.on_trial_add(None, FakeTrial("next"))
    assert json.loads(old.read_text())["version"] == 3
    assert same({k: v for k, v in as_dicts(carried._records).items() if k != "next"}, held)
    assert carried.warnings == s.warnings
