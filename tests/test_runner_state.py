"""The runner's bookkeeping on a real SQLite study (no Ray): the stored plan, retries, stale heartbeats,
the progress line and the report of a study."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import optuna
import pytest
from sweep_util import tiny_sweep

from collapse_hpo.hpo.outputs.progress import Progress
from collapse_hpo.hpo.outputs.report import compute, format_table, trial_rows
from collapse_hpo.hpo.sweep.config import load_sweep
from collapse_hpo.hpo.sweep.runner import create_study, fail_stale_trials, locate, open_study, reconcile
from collapse_hpo.predictors.errors import InputError

TS = optuna.trial.TrialState


def _study(tmp_path: Path, **kw):
    sweep = load_sweep(tiny_sweep(tmp_path, "state", **kw))
    loc = locate(sweep)
    loc.results.mkdir(parents=True)
    return sweep, loc, create_study(sweep, loc)


def test_plan_is_stored_as_waiting_trials_and_run_refuses_to_overwrite(tmp_path: Path) -> None:
    sweep, loc, study = _study(tmp_path, trials=3, seeds=[0, 1])
    waiting = study.get_trials(states=(TS.WAITING,))
    assert [(t.user_attrs["draw"], t.user_attrs["seed"]) for t in waiting] == [
        (0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    # ask() hands out the plan in order, with the planned params.
    dists = {k: d.to_optuna() for k, d in sweep.space.items()}
    first = study.ask(dists)
    assert first.params == waiting[0].system_attrs["fixed_params"]
    with pytest.raises(InputError, match=r"already exists.*collapse-hpo resume"):
        create_study(sweep, loc)
    assert open_study(sweep, loc).study_name == "state"


def test_resume_refuses_a_changed_sweep_file(tmp_path: Path) -> None:
    _sweep, loc, _ = _study(tmp_path, trials=3)
    changed = load_sweep(tiny_sweep(tmp_path, "state", trials=5))
    with pytest.raises(InputError, match="field 'trials': changed since the sweep started"):
        open_study(changed, loc)
    # Runtime fields (retries, executor, resources, heartbeat) may change.
    assert open_study(load_sweep(tiny_sweep(tmp_path, "state", trials=3, retries=3)), loc)


def _fail(study: optuna.Study, dists: dict, *, error: str, interrupted: bool = False) -> optuna.trial.Trial:
    t = study.ask(dists)
    t.set_user_attr("error", error)
    if interrupted:
        t.set_user_attr("interrupted", True)
    study.tell(t, state=TS.FAIL)
    return t


def test_reconcile_retries_failed_slots_up_to_the_limit(tmp_path: Path) -> None:
    sweep, _loc, study = _study(tmp_path, trials=2, retries=1)
    dists = {k: d.to_optuna() for k, d in sweep.space.items()}
    t0 = _fail(study, dists, error="boom")              # draw 0, attempt 0
    out = io.StringIO()
    progress = Progress(1.0, out=out)
    assert reconcile(study, sweep, progress) == 1
    assert "queued again: retry 1/1" in out.getvalue()
    assert reconcile(study, sweep) == 0                 # a queued retry is not queued twice
    retry = study.ask(dists)                            # the retry of draw 0: served in plan order,
    assert retry.user_attrs["draw"] == 0                # before draw 1 (which was queued first)
    assert retry.params == t0.params and retry.user_attrs["attempt"] == 1
    assert study.ask(dists).user_attrs["draw"] == 1
    assert retry.user_attrs["retry_of"] == t0.number
    retry.set_user_attr("error", "boom again")
    study.tell(retry, state=TS.FAIL)
    assert reconcile(study, sweep) == 0                 # out of retries


def test_interrupted_trials_are_rerun_without_using_a_retry(tmp_path: Path) -> None:
    sweep, _loc, study = _study(tmp_path, trials=1, retries=0)
    dists = {k: d.to_optuna() for k, d in sweep.space.items()}
    _fail(study, dists, error="stale", interrupted=True)
    assert reconcile(study, sweep) == 1
    _fail(study, dists, error="stale", interrupted=True)
    assert reconcile(study, sweep) == 1
    _fail(study, dists, error="a real failure")
    assert reconcile(study, sweep) == 0


def test_stale_heartbeats_are_failed_fresh_ones_block_resume(tmp_path: Path) -> None:
    sweep, _loc, study = _study(tmp_path, trials=2)      # heartbeat interval 1 s, grace 4 s
    dists = {k: d.to_optuna() for k, d in sweep.space.items()}
    dead = study.ask(dists)
    study._storage.record_heartbeat(dead._trial_id)
    alive = study.ask(dists)
    study._storage.record_heartbeat(alive._trial_id)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.5):
            study._storage.record_heartbeat(alive._trial_id)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(InputError, match=r"trials \[1\] .* still record heartbeats"):
            fail_stale_trials(study, sweep)
    finally:
        stop.set()
        thread.join()
    assert time.monotonic() - t0 >= sweep.heartbeat.grace
    frozen = study._storage.get_trial(dead._trial_id)
    assert frozen.state == TS.FAIL and frozen.user_attrs["interrupted"] is True
    assert frozen.user_attrs["error"].startswith("stale: no heartbeat")
    # Once the other trial stops beating it goes stale too.
    assert fail_stale_trials(study, sweep) == [alive.number]


def test_a_worker_of_the_dead_driver_that_beats_on_for_a_while_does_not_block_resume(tmp_path: Path) -> None:
    """After a driver's SIGKILL, Ray stops its workers seconds later (longer on a loaded machine): a trial
    still beats when `resume` starts. Resume holds the lease, so it waits for that worker, not refusing."""
    sweep, _loc, study = _study(tmp_path, trials=1)      # heartbeat interval 1 s, grace 4 s
    dists = {k: d.to_optuna() for k, d in sweep.space.items()}
    orphan = study.ask(dists)
    study._storage.record_heartbeat(orphan._trial_id)
    stop = threading.Event()

    def beat_then_die() -> None:   # the orphaned worker beats for 2.5 s more, then Ray stops it
        end = time.monotonic() + 2.5
        while time.monotonic() < end and not stop.wait(0.25):
            study._storage.record_heartbeat(orphan._trial_id)

    thread = threading.Thread(target=beat_then_die, daemon=True)
    thread.start()
    t0 = time.monotonic()
    try:
        assert fail_stale_trials(study, sweep) == [orphan.number]
    finally:
        stop.set()
        thread.join()
    # It went stale `grace` s after its last beat, not before.
    assert time.monotonic() - t0 >= 2.5 + sweep.heartbeat.grace
    frozen = study._storage.get_trial(orphan._trial_id)
    assert frozen.state == TS.FAIL and frozen.user_attrs["interrupted"] is True


def test_progress_line_and_report_table(tmp_path: Path) -> None:
    sweep, _loc, study = _study(tmp_path, trials=3)
    dists = {k: d.to_optuna() for k, d in sweep.space.items()}
    ticks = iter(range(0, 1000, 5))
    out = io.StringIO()
    progress = Progress(3000.0, out=out, clock=lambda: float(next(ticks)))
    a = study.ask(dists)
    progress.started(a.number, a.params)
    progress.result(a.number, 400)
    for step in (250, 500, 1000):
        a.report(3.0 - step / 1000, step)
    a.set_user_attr("tokens_trained", 1000)
    a.set_user_attr("total_tokens", 1000)
    study.tell(a, 2.0)
    progress.finished(study.trials[a.number])
    b = study.ask(dists)
    progress.started(b.number, b.params)
    b.report(3.1, 250)
    for key, value in {"tokens_trained": 250, "total_tokens": 1000, "predicted_final_loss": 2.5,
                       "predicted_low": 2.4, "predicted_high": 2.6, "decision_fraction": 0.25,
                       "prune_reason": "optimistic final loss 2.4 > 2.0"}.items():
        b.set_user_attr(key, value)
    study.tell(b, state=TS.PRUNED)
    progress.finished(study.trials[b.number])
    lines = out.getvalue().splitlines()
    assert lines[1].startswith("[00:10] trial 0 complete final_loss=2.0000 | running 0 pruned 0 complete 1")
    assert "trial 1 pruned at t_hat=0.25 (predicted 2.5000 [2.400, 2.600])" in lines[3]
    assert lines[3].endswith("best 2.0000 (#0) | tokens 1.2K / 3.0K (42%)")
    rows = trial_rows(study)
    assert [r["state"] for r in rows] == ["COMPLETE", "PRUNED"]      # the WAITING draw is not a row
    assert compute(study, 3000.0).fraction == pytest.approx(1250 / 3000)
    table = format_table(rows).splitlines()
    assert table[1].startswith("*  0") and "PRUNED" in table[2] and "2.5000" in table[2]


PG_URL = "postgresql://postgres@127.0.0.1:5432/test"


def test_trial_function_trains_and_records_on_postgresql(tmp_path: Path) -> None:
    """The trial function (the Ray trainable's body) on a PostgreSQL study: controls, curve and state."""
    import uuid

    from collapse_hpo.hpo.sweep.trial import run_trial, storage_url, trial_config
    from collapse_hpo.predictors.timescale import adamw_tau

    name = f"pg-{uuid.uuid4().hex[:12]}"
    sweep = load_sweep(tiny_sweep(tmp_path, name, trials=1, storage=PG_URL))
    loc = locate(sweep)
    study = create_study(sweep, loc)
    try:
        trial = study.ask({k: d.to_optuna() for k, d in sweep.space.items()})
        config = trial_config(sweep, loc.storage_url, loc.study_name, trial.number, False, loc.results)
        assert run_trial(config) == "COMPLETE"
        t = optuna.load_study(study_name=name, storage=storage_url(PG_URL)).trials[0]
        a = t.user_attrs
        assert t.state == TS.COMPLETE and t.value == pytest.approx(a["final_loss"])
        assert adamw_tau(a["batch_tokens"], t.params["lr"], a["weight_decay"], a["total_tokens"]) == (
            pytest.approx(a["tau"]))
        assert max(t.intermediate_values) == a["total_tokens"] == a["tokens_trained"]
        # Running it again is a no-op: the trial is finished.
        assert run_trial(config) == "COMPLETE"
    finally:
        optuna.delete_study(study_name=name, storage=storage_url(PG_URL))


def test_tokens_an_interrupted_trial_trained_stay_counted_in_progress() -> None:
    """A stopped sweep's progress line counted down (251.9K → 92.2K → 0) as its running trials were marked
    FAIL without a token count, and the resumed sweep's progress left them out (80%) where its compute line
    counted them (92%). What a trial reported stays spent; a resumed run counts its interrupted trials'
    tokens, not as failures."""
    from types import SimpleNamespace

    progress = Progress(4000.0, out=io.StringIO())
    progress.started(0, {})
    progress.result(0, 500.0)
    assert progress.spent == 500.0
    progress.finished(SimpleNamespace(number=0, state=TS.FAIL, value=None,
                                      user_attrs={"interrupted": True, "error": "interrupted"}))
    assert progress.spent == 500.0 and progress.counts["FAIL"] == 1
    resumed = Progress(4000.0, out=io.StringIO())
    stopped = SimpleNamespace(number=0, state=TS.FAIL, value=None, intermediate_values={250: 3.0, 500: 2.9},
                              user_attrs={"interrupted": True})
    counted = SimpleNamespace(number=1, state=TS.FAIL, value=None, intermediate_values={},
                              user_attrs={"interrupted": True, "tokens_trained": 300})
    resumed.seed_spent([stopped, counted])
    assert resumed.spent == 800.0 and resumed.counts["FAIL"] == 0
