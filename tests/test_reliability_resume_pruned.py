"""Issue 6.1 with pruning on: the driver of a pruned sweep is SIGKILLed (a real subprocess) with its Ray
processes, as when its machine dies, after the CollapsePruner has made decisions; then `collapse-hpo resume`
finishes it. The processes are frozen (SIGSTOP) while the test reads the study and killed while still frozen:
these tiny trials last about a second, so a trial seen running could otherwise end before the kill lands, or
in a worker that outlives its driver, and leave no interrupted trial (tests/test_resume.py kills the driver
alone, and covers that orphaned worker).

tests/test_resume.py covers the kill with pruning off (and the completed set against an uninterrupted sweep).
Here the decisions are the point: every trial finished before the kill (COMPLETE or PRUNED) keeps its curve,
its value and its decision log unchanged; the trials left running become FAIL (interrupted) with their
decisions kept as evidence, their slots rerun; no step of any trial is decided twice; every planned draw ends
COMPLETE or PRUNED; every pruned trial's last logged decision is the prune that ended it; and an interrupted
trial holds at most one prune, its last entry (the kill landed between the prune's log entry and the state).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from sweep_util import frozen, read_trials, tiny_sweep

from collapse_hpo.hpo.optuna_side.pruner import trial_decisions

CLI = [sys.executable, "-m", "collapse_hpo.hpo.cli"]
# Enough trials that one is still running, with reports, once 3 have finished: with 7 the tiny sweep's last
# two trials could be pruned within a second of the third finish, and a CI run's poll missed that window.
TRIALS = 10


def _judged(t: optuna.trial.FrozenTrial) -> bool:
    """The trial has a decision made with a reference (a prediction, not 'no reference yet')."""
    return any(e.get("reference") for e in trial_decisions(t))


def _settled(url: str, name: str, quiet_s: float = 6.0,
             limit_s: float = 90.0) -> list[optuna.trial.FrozenTrial]:
    """The study once nothing has written to it for ``quiet_s`` seconds: a Ray worker can outlive its killed
    driver for a moment and store one more report (or finish its trial) before it exits."""
    def key(trials: list[optuna.trial.FrozenTrial]) -> list[tuple]:
        return [(t.number, t.state.name, len(t.intermediate_values), len(trial_decisions(t))) for t in trials]

    trials = read_trials(url, name)
    quiet_since = start = time.monotonic()
    while time.monotonic() - quiet_since < quiet_s:
        assert time.monotonic() - start < limit_s, "the study was still being written long after the kill"
        time.sleep(0.5)
        now = read_trials(url, name)
        if key(now) != key(trials):
            trials, quiet_since = now, time.monotonic()
    return trials


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_resume_of_a_pruned_sweep_keeps_every_decision(tmp_path: Path) -> None:
    path = tiny_sweep(tmp_path, "rp", trials=TRIALS, prune=True, tpp=5)  # 16K tokens per trial
    db = tmp_path / "results" / "rp" / "study.db"
    url = f"sqlite:///{db}"
    log = open(tmp_path / "run.log", "w")  # noqa: SIM115 (the driver writes to it until it is killed)
    driver = subprocess.Popen([*CLI, "run", str(path)], stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    trials: list[optuna.trial.FrozenTrial] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert driver.poll() is None, (tmp_path / "run.log").read_text()
            # Frozen while the study is read, so that what is read is what the kill leaves: a trial seen
            # running cannot end between the read and the kill (these tiny trials last about a second).
            with frozen(driver.pid) as kill:
                try:  # a short lock timeout: a frozen writer may hold SQLite's lock (then: try again)
                    trials = read_trials(url, "rp", timeout=0.5) if db.exists() else []
                except Exception:  # tables not created yet, or locked
                    trials = []
                finished = [t for t in trials if t.state.is_finished()]
                running = [t for t in trials if t.state.name == "RUNNING" and t.intermediate_values]
                if len(finished) >= 3 and any(_judged(t) for t in finished) and running:
                    kill()
                    break
            time.sleep(0.2)
        else:
            pytest.fail("the sweep did not reach 3 finished trials, one judged, and a running one in time")
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
        log.close()

    before = {t.number: t for t in _settled(url, "rp")}
    done_before = {n: t for n, t in before.items() if t.state.is_finished()}
    running_before = sorted(n for n, t in before.items() if t.state.name == "RUNNING")
    def states(ts: Any) -> list[tuple[int, str, int]]:
        return [(t.number, t.state.name, len(t.intermediate_values)) for t in ts]

    assert running_before, (f"no trial was left running by the kill: at the kill {states(trials)}, "
                            f"after {states(before.values())}")
    assert any(_judged(t) for t in done_before.values())

    resumed = subprocess.run([*CLI, "resume", str(path)], capture_output=True, text=True, cwd=tmp_path,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    after = {t.number: t for t in read_trials(url, "rp")}

    # Finished before the kill: exactly as they were (state, value, curve, every user attr incl. decisions).
    for n, t in done_before.items():
        a = after[n]
        assert (a.state, a.value, a.intermediate_values) == (t.state, t.value, t.intermediate_values), n
        assert a.user_attrs == t.user_attrs and trial_decisions(a) == trial_decisions(t), n
    # Left running: FAIL (interrupted), their curve and decisions up to the kill kept, their slot rerun.
    for n in running_before:
        a, b = after[n], before[n]
        assert a.state.name == "FAIL" and a.user_attrs["interrupted"] is True, n
        assert a.intermediate_values == b.intermediate_values, n
        assert trial_decisions(a) == trial_decisions(b), n
    # Every planned draw ends COMPLETE or PRUNED exactly once; only interrupted trials failed.
    final = [t for t in after.values() if t.state.name in ("COMPLETE", "PRUNED")]
    assert sorted(t.user_attrs["draw"] for t in final) == list(range(TRIALS))
    assert all(t.user_attrs.get("interrupted") for t in after.values() if t.state.name == "FAIL")
    for t in after.values():
        log_ = trial_decisions(t)
        steps = [e["step"] for e in log_]
        assert steps == sorted(set(steps)), f"trial {t.number}: a step was decided twice"
        prunes = [e for e in log_ if e["prune"]]
        if t.state.name == "PRUNED":
            assert len(prunes) == 1 and log_[-1]["prune"], t.number
            assert t.user_attrs["prune_reason"] == log_[-1]["reason"], t.number
            assert max(t.intermediate_values) == log_[-1]["step"], t.number  # nothing reported after it
        elif t.state.name == "FAIL":
            # Interrupted: the kill may land between a prune's log entry and the PRUNED state the driver
            # writes after it (its slot is rerun like any interrupted trial's); then that prune is the log's
            # last entry, at its last report, and the only one.
            assert len(prunes) <= 1, t.number
            if prunes:
                assert log_[-1]["prune"] and max(t.intermediate_values) == log_[-1]["step"], t.number
        else:
            assert not prunes, t.number
