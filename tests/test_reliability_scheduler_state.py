"""Issue 23 item 9: a hand-crafted CollapseScheduler state file (snapshot or journal) is validated as
strictly as a curve CSV: each bad field is one InputError line naming the file and the field, never a
ValueError/AttributeError from inside, and never loaded silently."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from collapse_hpo.hpo.ray_side.scheduler import CollapseScheduler
from collapse_hpo.hpo.ray_side.scheduler_state import (
    STATE_FILE,
    SchedulerState,
    TrialRecord,
    journal_path,
    read_state,
    snapshot_dict,
)
from collapse_hpo.predictors.errors import InputError


def _snapshot() -> dict[str, Any]:
    rec = TrialRecord("t1", t_hat=[0.1, 0.2], loss=[3.0, float("nan")], progress=[100.0, None], tau=0.1,
                      tpp=20.0, total=1000.0)
    return snapshot_dict(SchedulerState(records={"t1": rec}, seq=1), "loss", "t_hat")


def _write(tmp: Path, snap: dict[str, Any], journal: list[Any] | None = None) -> Path:
    path = tmp / STATE_FILE
    path.write_text(json.dumps(snap))
    if journal is not None:
        Path(journal_path(str(path))).write_text("".join(json.dumps(x) + "\n" for x in journal))
    return path


def _trial(**change: Any) -> dict[str, Any]:
    snap = _snapshot()
    snap["trials"]["t1"].update(change)
    return snap


BAD_SNAPSHOTS = {
    "seq-string": ({**_snapshot(), "seq": "x"}, "'seq'"),
    "seq-negative": ({**_snapshot(), "seq": -1}, "'seq'"),
    "trials-string": ({**_snapshot(), "trials": "abc"}, "'trials'"),
    "trials-list": ({**_snapshot(), "trials": [1, 2]}, "'trials'"),
    "warnings-string": ({**_snapshot(), "collapse_warnings": "w"}, "'collapse_warnings'"),
    "record-string": ({**_snapshot(), "trials": {"t1": "abc"}}, "trial 't1'"),
    "t_hat-string": (_trial(t_hat="abc"), "'t_hat'"),
    "t_hat-item-string": (_trial(t_hat=[0.1, "abc"]), "'t_hat'"),
    "loss-strings": (_trial(loss=["3.0", "2.9"]), "'loss'"),
    "progress-string": (_trial(progress=[100.0, "x"]), "'progress'"),
    "units-unknown": (_trial(units="epochs"), "'units'"),
    "lengths": (_trial(loss=[3.0]), "'loss'"),
    "tau-string": (_trial(tau="0.1"), "'tau'"),
    "final_loss-string": (_trial(final_loss="2.5"), "'final_loss'"),
    "replayed-float": (_trial(replayed=1.5), "'replayed'"),
    "decision-string": (_trial(decision="x"), "'decision'"),
    "log-strings": (_trial(log=["x"]), "'log'"),
    "schedule-string": (_trial(schedule="cosine"), "'schedule'"),
    "config-list": (_trial(config=[1]), "'config'"),
    "searched-string": (_trial(searched="lr"), "'searched'"),
    "unknown-field": (_trial(bogus=1), "'bogus'"),
    "trial_id-other": (_trial(trial_id="t2"), "'trial_id'"),
}


@pytest.mark.parametrize("case", list(BAD_SNAPSHOTS))
def test_a_bad_snapshot_field_is_one_line_naming_file_and_field(case: str, tmp_path: Path) -> None:
    snap, field = BAD_SNAPSHOTS[case]
    path = _write(tmp_path, snap)
    with pytest.raises(InputError) as info:
        CollapseScheduler.load_state(tmp_path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path)) and field in message, message


BAD_OPS = {
    "set-string": (["set", "t1", "x"], "'set'"),
    "set-t_hat": (["set", "t1", {"final_loss": "abc"}], "'final_loss'"),
    "set-status": (["set", "t1", {"status": "gone"}], "'status'"),
    "report-string-loss": (["report", "t1", 0.3, "2.9", 300.0], "'loss'"),
    "report-string-t_hat": (["report", "t1", "abc", 2.9, 300.0], "'t_hat'"),
    "report-short": (["report", "t1", 0.3], "'report'"),
    "report-unknown-trial": (["report", "t9", 0.3, 2.9, 300.0], "'t9'"),
    "trial-bad-record": (["trial", "t2", {"status": "running", "t_hat": "abc"}], "'t_hat'"),
    "log-string": (["log", "t1", "x"], "log entry"),
    "warn-string": (["warn", "x"], "warning"),
    "unknown-op": (["drop", "t1"], "unknown op"),
    "op-not-a-list": ("set", "unknown op"),
    "id-number": (["set", 5, {}], "trial id"),
}


@pytest.mark.parametrize("case", list(BAD_OPS))
def test_a_bad_journal_op_is_one_line_naming_the_journal_line_and_field(case: str, tmp_path: Path) -> None:
    op, field = BAD_OPS[case]
    good = {"seq": 2, "ops": [["report", "t1", 0.25, 2.95, 250.0]]}
    path = _write(tmp_path, _snapshot(), [good, {"seq": 3, "ops": [op]}, {"seq": 4, "ops": []}])
    with pytest.raises(InputError) as info:
        read_state(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(journal_path(str(path)) + ": line 2"), message
    assert field in message, message


def test_a_valid_state_still_loads_with_its_nan_losses(tmp_path: Path) -> None:
    path = _write(tmp_path, _snapshot(), [{"seq": 2, "ops": [["report", "t1", 0.25, float("inf"), None],
                                                             ["set", "t1", {"final_loss": 2.9}]]}])
    rec = read_state(path).records["t1"]
    assert rec.t_hat == [0.1, 0.2, 0.25] and rec.progress == [100.0, None, None] and rec.final_loss == 2.9
    assert asdict(rec)["loss"][2] == float("inf")
