"""Issue 23, item 4: a sweep's driver stopped by SIGTERM, SIGHUP or Ctrl-C (SIGINT), then resumed.

One tiny sweep, three stops: `run` gets SIGTERM (how schedulers, systemd and Kubernetes stop a job), the
first `resume` SIGHUP twice (the second one stops at once), the second `resume` SIGINT sent to its process
group (a terminal's Ctrl-C), each while a trial is training; the last `resume` finishes the sweep. After
each stop: exit status 128 + the signal (143, 129, 130), no trial left RUNNING (the running ones are FAIL
``interrupted``), the lease row gone, one line on stderr and no stack dump. On main, SIGTERM ended the
driver by SIGABRT with Ray's C++ stack dump leaving trials RUNNING, and Ctrl-C exited 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sweep_util import lease_rows, read_trials, tiny_sweep, wait_until_training

CLI = [sys.executable, "-m", "collapse_hpo.hpo.cli"]


def _stop_while_training(command: str, path: Path, url: str, name: str, sig: signal.Signals, times: int,
                         tmp: Path) -> tuple[int, list[str], list[int]]:
    """Start ``collapse-hpo COMMAND`` in its own session, send ``sig`` ``times`` times (0.3 s apart) once a
    trial has reported, wait for the driver; returns its exit status, its stderr lines and the numbers of
    the trials seen training."""
    log = tmp / f"{command}-{sig.name}.out"
    with log.open("w") as out, (tmp / f"{command}-{sig.name}.err").open("w") as err:
        driver = subprocess.Popen([*CLI, command, str(path)], stdout=out, stderr=err, cwd=tmp,
                                  start_new_session=True)
        try:
            trials = wait_until_training(driver, url, name)
            training = [t.number for t in trials if t.state.name == "RUNNING" and t.intermediate_values]
            for i in range(times):
                if i:
                    time.sleep(0.3)
                if sig == signal.SIGINT:
                    os.killpg(driver.pid, sig)  # Ctrl-C: the terminal signals the whole foreground group
                else:
                    os.kill(driver.pid, sig)
            code = driver.wait(timeout=180)
        finally:
            if driver.poll() is None:
                driver.kill()
    lines = [ln for ln in (tmp / f"{command}-{sig.name}.err").read_text().splitlines() if ln.strip()]
    return code, lines, training


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigterm_sighup_and_ctrl_c_stop_the_sweep_cleanly_and_resume_finishes_it(tmp_path: Path) -> None:
    name = "signals"
    path = tiny_sweep(tmp_path, name, trials=6, tpp=30)  # trials of ~3 s: still training when the stop lands
    url = f"sqlite:///{tmp_path / 'results' / name / 'study.db'}"
    interrupted: set[int] = set()
    stops = (("run", signal.SIGTERM, 1), ("resume", signal.SIGHUP, 2), ("resume", signal.SIGINT, 1))
    for command, sig, times in stops:  # SIGHUP twice: the second one stops at once
        code, err, training = _stop_while_training(command, path, url, name, sig, times, tmp_path)
        assert code == 128 + sig, (command, sig.name, code, err)
        assert len(err) == 1, err  # one line, no traceback, no Ray stack dump
        if times == 1:
            assert f"stopped by {sig.name}" in err[0] and f"collapse-hpo resume {path}" in err[0]
        else:
            assert err[0] == f"collapse-hpo {command}: interrupted by {sig.name}", err
        trials = {t.number: t for t in read_trials(url, name)}
        assert not [n for n, t in trials.items() if t.state.name == "RUNNING"], (command, sig.name)
        failed = {n for n, t in trials.items() if t.state.name == "FAIL"}
        assert all(trials[n].user_attrs.get("interrupted") is True for n in failed), command
        for number in training:  # the trials seen training were stopped with it, or finished before
            assert trials[number].state.name in ("COMPLETE", "FAIL"), (number, trials[number].state.name)
        assert failed - interrupted, (command, sig.name, "no trial was interrupted")
        if times == 1:  # stopped by the driver: what a trial reported stays counted as trained
            for n in failed - interrupted:
                if trials[n].intermediate_values:
                    assert trials[n].user_attrs.get("tokens_trained", 0) > 0, (command, sig.name, n)
        interrupted |= failed
        assert lease_rows(url) == [], (command, sig.name)

    done = subprocess.run([*CLI, "resume", str(path)], capture_output=True, text=True, cwd=tmp_path,
                          timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    trials = read_trials(url, name)
    complete = sorted(int(t.user_attrs["draw"]) for t in trials if t.state.name == "COMPLETE")
    assert complete == list(range(6))  # every draw trained to the end once; no retry was used up
    failed = [t for t in trials if t.state.name == "FAIL"]
    assert {t.number for t in failed} == interrupted
    assert all(t.user_attrs.get("interrupted") is True for t in failed)
    assert lease_rows(url) == []
