"""Failing trials: an exception, a simulated out-of-memory and a killed Ray worker end FAIL with the error
recorded, the sweep goes on, and retries follow the YAML."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from sweep_util import tiny_sweep

from collapse_hpo.hpo import cli


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_failures_are_recorded_and_retried(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    faults = [
        {"kind": "exception", "draws": [1], "attempts": [0, 1], "start_t_hat": 0.3},
        {"kind": "kill_worker", "draws": [2], "attempts": [0], "start_t_hat": 0.3},
        {"kind": "out_of_memory", "draws": [3], "attempts": [0], "start_t_hat": 0.5},
    ]
    path = tiny_sweep(tmp_path, "faults", trials=4, retries=1, faults=faults)
    assert cli.main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    study = optuna.load_study(study_name="faults",
                              storage=f"sqlite:///{tmp_path / 'results' / 'faults' / 'study.db'}")
    by_draw: dict[int, list[optuna.trial.FrozenTrial]] = {}
    for t in sorted(study.get_trials(), key=lambda t: t.number):
        by_draw.setdefault(t.user_attrs["draw"], []).append(t)
    states = {d: [t.state.name for t in ts] for d, ts in by_draw.items()}
    # draw 0: clean; 1: raises twice, no retries left; 2 (worker killed) and 3 (OOM): the retry completes.
    assert states == {0: ["COMPLETE"], 1: ["FAIL", "FAIL"], 2: ["FAIL", "COMPLETE"], 3: ["FAIL", "COMPLETE"]}
    first = {d: ts[0] for d, ts in by_draw.items()}
    for t in by_draw[1]:
        assert t.user_attrs["error"].startswith("InjectedFault") and "traceback" in t.user_attrs
    assert "OutOfMemoryError" in first[3].user_attrs["error"]
    assert "Ray worker ended without finishing the trial" in first[2].user_attrs["error"]
    assert first[2].user_attrs["fault"] == "kill_worker"
    # Failed trials keep the curve they reported, stopped near their fault.
    assert 0.25 <= max(first[1].intermediate_values) / first[1].user_attrs["total_tokens"] < 0.5
    for d in (2, 3):
        retry = by_draw[d][1]
        assert retry.user_attrs["attempt"] == 1 and retry.user_attrs["retry_of"] == first[d].number
        assert retry.params == first[d].params and "fault" not in retry.user_attrs
    assert out.count("queued again: retry 1/1") == 3 and "failed 4" in out
    assert "3 complete, 4 fail" in out
