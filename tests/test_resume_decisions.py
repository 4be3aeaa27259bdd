"""A resumed sweep decides like the uninterrupted one (issue 12): every decision is a function of the plan and
the recorded curves, not of when the driver died.

With one worker, a pruned sweep is run once uninterrupted, and once with its driver SIGKILLed at three points
(early in a trial, late in a trial, and at the moment a trial has reported its last point but is not yet
marked complete, as near as polling gets) and resumed after each kill. Every draw must end with the same
prune/keep decision at the same step. With two workers the timing of the two trials decides which
competitors a judgement sees, so only the best trial must be the same. The queue served in plan order
(`runner.plan_order_study`) is what makes this hold: before, an interrupted draw was rerun after every
draw that had not started, so later judgements saw other competitors.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from sweep_util import frozen, read_trials, tiny_sweep

from collapse_hpo.hpo.sweep.runner import plan_key, plan_order_study

CLI = [sys.executable, "-m", "collapse_hpo.hpo.cli"]
DRAWS = 6
TS = optuna.trial.TrialState


def test_the_queue_is_served_in_plan_order() -> None:
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, study_name="q")
    x = optuna.distributions.FloatDistribution(0.0, 1.0)
    for draw in (1, 2):
        study.enqueue_trial({"x": draw / 10}, user_attrs={"draw": draw, "seed": 0, "attempt": 0})
    study.enqueue_trial({"x": 0.0}, user_attrs={"draw": 0, "seed": 0, "attempt": 1})  # a rerun, queued last
    ordered = plan_order_study(study, storage)
    asked = [ordered.ask({"x": x}) for _ in range(3)]
    # Optuna's own ask() would give draws 1, 2, 0 (enqueue order); this fails if ask() stops taking the next
    # queued trial from Study._pop_waiting_trial_id (the private method plan_order_study overrides).
    assert [t.user_attrs["draw"] for t in asked] == [0, 1, 2]
    assert [t.params["x"] for t in asked] == [0.0, 0.1, 0.2]
    assert ordered.ask({"x": x}).user_attrs == {}  # an empty queue: a fresh trial, as ask() does


def _outcome(trials: list[optuna.trial.FrozenTrial]) -> dict[int, tuple[str, int]]:
    """Each draw's final state and last step, from the trial that ended it (COMPLETE or PRUNED)."""
    out = {}
    for t in sorted(trials, key=plan_key):
        if t.state in (TS.COMPLETE, TS.PRUNED):
            assert t.user_attrs["draw"] not in out, f"draw {t.user_attrs['draw']} ended twice"
            out[t.user_attrs["draw"]] = (t.state.name, max(t.intermediate_values))
    return out


def _run_until(path: Path, url: str, name: str, cmd: str, cwd: Path,
               kill_when: Callable[[list[optuna.trial.FrozenTrial]], bool] | None) -> bool:
    """Run `collapse-hpo CMD sweep`; with ``kill_when``, SIGKILL the driver (and its Ray) once it holds.

    Returns True when the driver was killed, False when it ended by itself (exit 0 asserted)."""
    log = open(cwd / f"{cmd}.log", "a")  # noqa: SIM115 (the driver writes to it until it ends)
    driver = subprocess.Popen([*CLI, cmd, str(path)], stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while driver.poll() is None:
            assert time.monotonic() < deadline, (cwd / f"{cmd}.log").read_text()[-3000:]
            if kill_when is not None:
                # The driver and its Ray processes are frozen while the study is read and killed still
                # frozen: what is read is what the kill leaves, and the sweep advances only between reads,
                # so a kill point a tiny trial passes in a fraction of a second is still seen.
                with frozen(driver.pid) as kill:
                    try:
                        trials = read_trials(url, name, timeout=0.5)
                    except Exception:  # the tables are being created, or a frozen writer holds the lock
                        trials = []
                    hit = bool(trials) and kill_when(trials)
                    if hit:
                        kill()
                if hit:
                    driver.wait(timeout=30)
                    return True
            time.sleep(0.05)
        assert driver.returncode == 0, (cwd / f"{cmd}.log").read_text()[-3000:]
        return False
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=30)
        log.close()


def _running(trials: list[optuna.trial.FrozenTrial], draw: int) -> optuna.trial.FrozenTrial | None:
    live = [t for t in trials if t.state == TS.RUNNING and t.user_attrs.get("draw") == draw]
    return live[0] if live else None


def _running_past(draw: int, step: float) -> Callable[[list[optuna.trial.FrozenTrial]], bool]:
    """Holds while ``draw`` runs (not yet ended) with a report at or past ``step`` tokens."""
    def check(trials: list[optuna.trial.FrozenTrial]) -> bool:
        t = _running(trials, draw)
        return t is not None and bool(t.intermediate_values) and max(t.intermediate_values) >= step
    return check


def _final_report(draw: int, attempt: int, total: int) -> Callable[[list[optuna.trial.FrozenTrial]], bool]:
    """Holds once ``draw``'s attempt has reported its last point: still RUNNING if polling caught it (the
    driver dies between the last report and marking the trial complete), else just completed."""
    def check(trials: list[optuna.trial.FrozenTrial]) -> bool:
        mine = [t for t in trials if t.user_attrs.get("draw") == draw and t.intermediate_values
                and t.user_attrs.get("attempt") == attempt]
        return any(max(t.intermediate_values) >= total for t in mine)
    return check


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_one_worker_resumed_three_times_makes_every_decision_of_the_uninterrupted_sweep(tmp_path: Path):
    # Refits inline: with background refits (the default) which online fit a judgement uses depends on
    # whether the thread has finished, on timing (OnlineReference docstring); a tiny trial lasts about a
    # second, shorter than a fit, so a run could judge with the new fit and its rerun with the previous one
    # (CI at 6b77d2d: draw 2 PRUNED at 8192 tokens in one run, COMPLETE in the other).
    one = {"executor": {"num_cpus": 1},
           "pruner": {"enabled": True, "min_fraction": 0.2,
                      "reference": {"online": True, "min_trials": 2, "refit": "inline"}}}
    clean = tiny_sweep(tmp_path, "clean", trials=DRAWS, prune=True, tpp=5, **one)
    _run_until(clean, f"sqlite:///{tmp_path / 'results' / 'clean' / 'study.db'}", "clean", "run", tmp_path,
               None)
    reference = read_trials(f"sqlite:///{tmp_path / 'results' / 'clean' / 'study.db'}", "clean")
    expected = _outcome(reference)
    assert sorted(expected) == list(range(DRAWS))
    pruned = [d for d, (state, _) in expected.items() if state == "PRUNED"]
    assert pruned and len(pruned) < DRAWS, expected  # the sweep has decisions of both kinds to keep
    total = int(reference[0].user_attrs["total_tokens"])

    path = tiny_sweep(tmp_path, "killed", trials=DRAWS, prune=True, tpp=5, **one)
    url = f"sqlite:///{tmp_path / 'results' / 'killed' / 'study.db'}"
    # Kill points, in the order the sweep reaches them: a draw that runs to the end (c1), early in its
    # training; its rerun (served first, in plan order) at its last report; a later complete draw (c2) late.
    complete = [d for d, (state, _) in expected.items() if state == "COMPLETE" and d >= 1]
    assert len(complete) >= 2, expected
    c1, c2 = complete[:2]
    points = [
        (c1, _running_past(c1, 1)),
        (c1, _final_report(c1, 0, total)),  # the rerun keeps attempt 0: an interrupted try is no attempt
        (c2, _running_past(c2, 0.6 * total)),
    ]
    cmd = "run"
    for draw, when in points:
        killed = _run_until(path, url, "killed", cmd, tmp_path, when)
        assert killed, f"the sweep ended before draw {draw}'s kill point"
        cmd = "resume"
    assert not _run_until(path, url, "killed", "resume", tmp_path, None)
    trials = read_trials(url, "killed")
    assert _outcome(trials) == expected
    interrupted = [t for t in trials if t.state == TS.FAIL]
    assert len(interrupted) >= 2 and all(t.user_attrs.get("interrupted") for t in interrupted)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_workers_resumed_pick_the_same_best_trial(tmp_path: Path):
    # A 10% margin: on this 3K-parameter model trained for 16K tokens the curves cross by more than the
    # default 4%, and the uninterrupted sweep would sometimes cut its own best (timing decides which
    # competitor a judgement sees); with the winner safe in both runs, the test is about the resume.
    safe = {"pruner": {"enabled": True, "min_fraction": 0.2, "margin": 0.1,
                       "reference": {"online": True, "min_trials": 2}}}
    clean = tiny_sweep(tmp_path, "clean2", trials=DRAWS, prune=True, tpp=5, **safe)
    clean_url = f"sqlite:///{tmp_path / 'results' / 'clean2' / 'study.db'}"
    _run_until(clean, clean_url, "clean2", "run", tmp_path, None)
    best = optuna.load_study(study_name="clean2", storage=clean_url).best_trial.user_attrs["draw"]

    path = tiny_sweep(tmp_path, "killed2", trials=DRAWS, prune=True, tpp=5, **safe)
    url = f"sqlite:///{tmp_path / 'results' / 'killed2' / 'study.db'}"

    def two_running(trials: list[optuna.trial.FrozenTrial]) -> bool:
        return sum(t.state == TS.RUNNING and bool(t.intermediate_values) for t in trials) == 2 and \
            sum(t.state.is_finished() for t in trials) >= 2

    assert _run_until(path, url, "killed2", "run", tmp_path, two_running)
    assert not _run_until(path, url, "killed2", "resume", tmp_path, None)
    study = optuna.load_study(study_name="killed2", storage=url)
    assert study.best_trial.user_attrs["draw"] == best
    assert sorted(_outcome(study.get_trials())) == list(range(DRAWS))
