"""Issue 12, "One driver per sweep", "an error that every trial will hit", and "never persist a password",
with real drivers: `collapse-hpo` subprocesses and the in-process CLI on real SQLite and PostgreSQL storages,
a real Ray sweep.

- A second `run` or `resume` of a sweep whose driver is alive is refused in one line naming the driver and
  its age; two `run` on a fresh storage started at once never crash with a traceback.
- A lease whose driver died (its process is gone, or its heartbeat lapsed) is taken over.
- A sweep whose first two trials raise the same error stops with exit 2 and one line; a sweep in which every
  trial FAILed does not exit 0.
- A password in the storage URL reaches no file under results/ (Ray's experiment state, tuner.pkl) nor the
  Ray session folder, nor the study's ``sweep_config`` attr.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy
from sweep_util import tiny_sweep

from collapse_hpo.hpo import cli
from collapse_hpo.hpo.sweep.config import load_sweep
from collapse_hpo.hpo.sweep.lease import TABLE, SweepLease
from collapse_hpo.hpo.sweep.runner import SWEEP_ATTR, create_study, locate
from collapse_hpo.hpo.sweep.trial import run_trial, trial_config

POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"


def _storage(kind: str, tmp: Path) -> str:
    return f"sqlite:///{tmp}/shared.db" if kind == "sqlite" else POSTGRES


@contextlib.contextmanager
def _fresh_database() -> Any:
    """A new, empty PostgreSQL database (dropped afterwards): a fresh storage with no Optuna table."""
    name = f"rel_{uuid.uuid4().hex[:10]}"
    admin = sqlalchemy.create_engine(POSTGRES, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    try:
        yield POSTGRES.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


def _cleanup(url: str, name: str) -> None:
    for study in (name, name + "-noprune"):
        with contextlib.suppress(KeyError):
            optuna.delete_study(study_name=study, storage=url)
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.begin() as conn:
            if sqlalchemy.inspect(conn).has_table(TABLE):
                conn.execute(sqlalchemy.text(f"DELETE FROM {TABLE} WHERE sweep = :s"), {"s": name})
    finally:
        engine.dispose()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_second_driver_is_refused_naming_the_holder(kind: str, tmp_path: Path, capsys: Any) -> None:
    name = f"lease-{uuid.uuid4().hex[:8]}"
    url = _storage(kind, tmp_path)
    path = tiny_sweep(tmp_path, name, trials=2, storage=url)
    sweep = load_sweep(path)
    loc = locate(sweep)
    loc.results.mkdir(parents=True)
    try:
        create_study(sweep, loc)
        holder = SweepLease(url, name, interval=1, expiry=4, where="test")
        holder.acquire()
        try:
            time.sleep(1.1)
            for command in ("resume", "run"):
                code = cli.main([command, str(path)])
                err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
                assert code == 2 and len(err) == 1, err
                assert f"already run by driver {socket.gethostname()}:{os.getpid()}" in err[0]
                assert "s ago" in err[0] and "Traceback" not in err[0]
        finally:
            holder.release()
        # The lease is gone with its holder: the next driver gets it.
        again = SweepLease(url, name, interval=1, expiry=4, where="test")
        again.acquire()
        again.release()
    finally:
        _cleanup(url, name)


def test_a_lapsed_lease_is_taken_over(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l.db"
    first = SweepLease(url, "s", interval=1, expiry=2, where="test")
    first.acquire()
    first._stop.set()  # a driver that died without releasing: its row stays
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:  # ... run by a process that no longer exists on this host
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout.strip()
        conn.execute(sqlalchemy.text(f"UPDATE {TABLE} SET holder = :h"),
                     {"h": f"{socket.gethostname()}:{dead}"})
    second = SweepLease(url, "s", interval=1, expiry=60, where="test")
    second.acquire()  # at once: its holder's process is gone
    second._stop.set()
    with engine.begin() as conn:  # ... and on another host, silent for longer than the expiry
        conn.execute(sqlalchemy.text(f"UPDATE {TABLE} SET holder = 'elsewhere:1', heartbeat = :b"),
                     {"b": time.time() - 10})
    third = SweepLease(url, "s", interval=1, expiry=2, where="test")
    third.acquire()
    with engine.connect() as conn:
        holder = conn.execute(sqlalchemy.text(f"SELECT holder FROM {TABLE}")).scalar()
    assert holder == third.holder
    third.release()
    engine.dispose()


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_two_runs_at_once_on_a_fresh_storage(kind: str, tmp_path: Path) -> None:
    name = f"twin-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as stack:
        url = _storage(kind, tmp_path) if kind == "sqlite" else stack.enter_context(_fresh_database())
        _two_runs(tmp_path, name, url)


def _two_runs(tmp_path: Path, name: str, url: str) -> None:
    path = tiny_sweep(tmp_path, name, trials=1, storage=url, tpp=5, executor={"num_cpus": 1})
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    cmd = [sys.executable, "-c", "import sys; from collapse_hpo.hpo.cli import main; sys.exit(main())",
           "run", str(path)]
    try:
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for _ in range(2)]
        outs = [p.communicate(timeout=360) for p in procs]
        codes = sorted(p.returncode for p in procs)
        for _out, err in outs:
            assert "Traceback" not in err, err
        assert codes == [0, 2], (codes, [o[1][-2000:] for o in outs])
        refused = next(err for p, (_o, err) in zip(procs, outs) if p.returncode == 2)
        lines = [ln for ln in refused.splitlines() if ln.strip()]
        assert len(lines) == 1 and ("already run by driver" in lines[0] or "already exists" in lines[0])
    finally:
        _cleanup(url, name)


def test_drivers_of_different_sweeps_start_at_once_on_a_fresh_database(tmp_path: Path) -> None:
    """Four drivers create their studies at the same moment on an empty PostgreSQL database: Optuna's
    tables are created once, by one of them; the others retry instead of crashing (UniqueViolation)."""
    with _fresh_database() as url:
        sweeps = []
        for i in range(4):
            sweep = load_sweep(tiny_sweep(tmp_path, f"fresh{i}", trials=1, storage=url))
            loc = locate(sweep)
            loc.results.mkdir(parents=True)
            sweeps.append((sweep, loc))
        barrier = threading.Barrier(len(sweeps))
        errors: list[BaseException] = []

        def start(sweep: Any, loc: Any) -> None:
            barrier.wait()
            try:
                create_study(sweep, loc)
            except BaseException as err:  # recorded: the test shows it
                errors.append(err)

        threads = [threading.Thread(target=start, args=s) for s in sweeps]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        names = {s.study_name for s in optuna.get_all_study_summaries(storage=url)}
        assert names == {f"fresh{i}" for i in range(4)}


def test_a_sweep_whose_every_trial_failed_does_not_exit_0(tmp_path: Path, capsys: Any) -> None:
    path = tiny_sweep(tmp_path, "allfail", trials=1, tpp=5,
                      faults=[{"kind": "exception", "draws": [0], "start_t_hat": 0.2}])
    sweep = load_sweep(path)
    loc = locate(sweep)
    loc.results.mkdir(parents=True)
    study = create_study(sweep, loc)
    trial = study.ask({k: d.to_optuna() for k, d in sweep.space.items()})
    run_trial(trial_config(sweep, loc.storage_url, loc.study_name, trial.number, loc.prune, loc.results))
    code = cli.main(["report", str(path)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 1
    assert err[-1].startswith("collapse-hpo: error:") and "every trial failed (1 of 1)" in err[-1]


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("where", ["userinfo", "query"])
def test_a_common_error_stops_the_sweep_and_no_password_is_written(where: str, tmp_path: Path, capsys: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    secret = f"pw{uuid.uuid4().hex[:10]}"
    name = f"common-{uuid.uuid4().hex[:8]}"
    # trust auth: any password is accepted. In the query string (issue 23): password, sslpassword, passfile.
    url = (f"postgresql://postgres:{secret}@127.0.0.1:5432/test" if where == "userinfo" else
           f"postgresql://postgres@127.0.0.1:5432/test?password={secret}&sslpassword={secret}&passfile=/{secret}")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    # A reference study (checked before anything runs) in the same storage, with the password in its URL.
    optuna.create_study(study_name=f"{name}-family", storage=POSTGRES)
    path = tiny_sweep(tmp_path, name, trials=4, tpp=5, storage=url,
                      train={"report_every_tokens": 2048, "threads": 1, "corpus": str(empty)},
                      pruner={"enabled": True, "reference": {"study": f"{name}-family", "storage": url}})
    try:
        code = cli.main(["run", str(path)])
        cap = capsys.readouterr()
        err = [ln for ln in cap.err.splitlines() if ln.strip()]
        assert code == 2 and len(err) == 1, cap.err[-3000:]
        assert "failed with the same error" in err[0] and "no tokens" in err[0], err[0]
        study = optuna.load_study(study_name=name, storage=POSTGRES)
        states = sorted(t.state.name for t in study.get_trials())
        # Stopped after the first two: the trial already started with them ends too, the rest never start.
        assert 2 <= states.count("FAIL") <= 3 and "WAITING" in states and "COMPLETE" not in states
        assert secret not in repr(study.user_attrs[SWEEP_ATTR])
        for where in (tmp_path / "results", Path("/tmp/ray/session_latest")):
            for f in where.rglob("*") if where.exists() else []:
                if f.is_file() and f.stat().st_size < 50_000_000:
                    assert secret.encode() not in f.read_bytes(), f
        assert secret not in cap.out
    finally:
        _cleanup(POSTGRES, name)
        _cleanup(POSTGRES, f"{name}-family")
