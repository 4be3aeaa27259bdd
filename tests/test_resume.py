"""The driver is SIGKILLed mid-sweep (a real subprocess), then `collapse-hpo resume` finishes the sweep.

Completed trials keep their curves and user attrs, the trials that were running are found stale by their
Optuna heartbeat, marked FAIL (interrupted) and rerun, and the completed set equals an uninterrupted sweep's.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from sweep_util import by_state, frozen, read_trials, tiny_sweep

CLI = [sys.executable, "-m", "collapse_hpo.hpo.cli"]


def _states(url: str, name: str) -> dict[str, list[optuna.trial.FrozenTrial]]:
    """The study's trials by state, read only (never creating tables while a driver may create them)."""
    return by_state(read_trials(url, name))


def _by_draw(trials: list[optuna.trial.FrozenTrial]) -> dict[int, optuna.trial.FrozenTrial]:
    return {t.user_attrs["draw"]: t for t in trials}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_resume_after_driver_sigkill(tmp_path: Path) -> None:
    path = tiny_sweep(tmp_path, "resume", trials=4)
    db = tmp_path / "results" / "resume" / "study.db"
    url = f"sqlite:///{db}"
    log = open(tmp_path / "run.log", "w")  # noqa: SIM115 (the driver writes to it until it is killed)
    driver = subprocess.Popen([*CLI, "run", str(path)], stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            assert driver.poll() is None, (tmp_path / "run.log").read_text()
            # Frozen while the study is read and SIGKILLed still frozen: a trial seen running cannot finish
            # between the read and the kill (a CI run once saw one finish in that gap and had none left).
            with frozen(driver.pid) as kill:
                try:  # a short lock timeout: a frozen writer may hold SQLite's lock (then: try again)
                    s = by_state(read_trials(url, "resume", timeout=0.5)) if db.exists() else {}
                except Exception:  # tables not created yet, or locked
                    s = {}
                running = [t for t in s.get("RUNNING", []) if t.intermediate_values]
                if len(s.get("COMPLETE", [])) >= 2 and running:
                    kill()
                    break
            time.sleep(0.2)
        else:
            pytest.fail("the sweep did not reach 2 complete trials and a running one in time")
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
        log.close()
    before = _states(url, "resume")
    done_before = {t.number: t for t in before["COMPLETE"]}
    running_before = sorted(t.number for t in before.get("RUNNING", []))
    assert running_before, "a trial was running when the driver was killed"

    resumed = subprocess.run([*CLI, "resume", str(path)], capture_output=True, text=True, cwd=tmp_path,
                             timeout=400)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "marked FAIL (interrupted)" in resumed.stdout
    assert "queued again: rerun (interrupted)" in resumed.stdout
    after = _states(url, "resume")
    assert set(after) <= {"COMPLETE", "FAIL"}
    # Completed trials are kept as they were: value, curve, controls and decisions.
    by_number = {t.number: t for t in after["COMPLETE"]}
    for number, t in done_before.items():
        assert by_number[number].value == t.value
        assert by_number[number].intermediate_values == t.intermediate_values
        assert by_number[number].user_attrs == t.user_attrs
    # The trials left running were found stale, failed as interrupted, and their slots rerun to completion.
    failed = {t.number: t for t in after.get("FAIL", [])}
    assert sorted(failed) == running_before
    for t in failed.values():
        assert t.user_attrs["interrupted"] is True and t.user_attrs["error"].startswith("stale: no heartbeat")
    assert len(after["COMPLETE"]) == 4

    # The same sweep, never interrupted: the same completed set (draw -> params and final loss). It runs the
    # same trial function in this process, one trial after the other (no Ray start-up: the test stays short).
    ref = _uninterrupted(tiny_sweep(tmp_path, "reference", trials=4))
    got = _by_draw(after["COMPLETE"])
    assert sorted(got) == sorted(ref) == list(range(4))
    for draw, t in got.items():
        assert t.params == ref[draw].params
        assert t.value == pytest.approx(ref[draw].value, rel=1e-6)


def _uninterrupted(path: Path) -> dict[int, optuna.trial.FrozenTrial]:
    """Run every planned trial of the sweep file to the end with `run_trial` (the Ray trainable's body)."""
    from collapse_hpo.hpo.sweep.config import load_sweep
    from collapse_hpo.hpo.sweep.runner import create_study, locate
    from collapse_hpo.hpo.sweep.trial import run_trial, trial_config

    sweep = load_sweep(path)
    loc = locate(sweep)
    loc.results.mkdir(parents=True)
    study = create_study(sweep, loc)
    dists = {k: d.to_optuna() for k, d in sweep.space.items()}
    while study.get_trials(states=(optuna.trial.TrialState.WAITING,)):
        trial = study.ask(dists)
        config = trial_config(sweep, loc.storage_url, loc.study_name, trial.number, loc.prune, loc.results)
        state = run_trial(config)
        assert state == "COMPLETE"
    return _by_draw(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)))
