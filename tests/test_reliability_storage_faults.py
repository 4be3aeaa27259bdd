"""Issue 23, item 3: a damaged study database and a full disk, through the real command line.

- A study.db truncated to half its size, or with one page overwritten by garbage: `report`, `resume`,
  `dashboard` and `run` say so in one line naming the file ("damaged database ... restore it from a copy"),
  exit 2, no traceback, and leave the file as it was (on main they exited 1 with 53–93 lines of traceback).
- SQLite's own "database or disk is full" (a real SQLITE_FULL, from a page limit) is one `StorageFault`
  naming the file, not Optuna's "exceeding max length".
- A disk that fills up mid-sweep (a real tmpfs holding the results, filled while a trial trains): the driver
  stops with one line naming study.db and "disk full", exit 2; the running trials are FAIL ``interrupted``
  (no retry charged: with ``retries: 0`` `resume` still trains every draw), the lease row is gone and every
  point stored before is kept. On main: exit 1 with 65–229 lines of traceback, trials FAIL with
  "StorageInternalError … e.g. exceeding max length" using up their retries, the lease row left behind.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy
from sweep_util import lease_rows, read_trials, tiny_sweep, wait_until_training

from collapse_hpo.hpo import cli
from collapse_hpo.hpo.sweep import storage_errors
from collapse_hpo.hpo.sweep.config import load_sweep
from collapse_hpo.hpo.sweep.runner import create_study, locate
from collapse_hpo.hpo.sweep.trial import run_trial, trial_config


def _cli(argv: list[str], capsys: Any) -> tuple[int, list[str]]:
    code = cli.main(argv)
    return code, [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


@pytest.fixture(scope="module")
def stored_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sweep file whose study.db holds one trained trial (run in-process by `run_trial`, no Ray)."""
    tmp = tmp_path_factory.mktemp("stored")
    path = tiny_sweep(tmp, "stored", trials=2)
    sweep = load_sweep(path)
    loc = locate(sweep)
    loc.results.mkdir(parents=True)
    study = create_study(sweep, loc)
    trial = study.ask({k: d.to_optuna() for k, d in sweep.space.items()})
    assert run_trial(trial_config(sweep, loc.storage_url, loc.study_name, trial.number, False,
                                  loc.results)) == "COMPLETE"
    return path


def _damage(db: Path, how: str) -> None:
    size = db.stat().st_size
    if how == "truncated":
        with db.open("r+b") as fh:
            fh.truncate(size // 2)
    else:  # one 4 KiB page of garbage (page 3: one of Optuna's tables), the header intact
        assert size >= 4 * 4096
        with db.open("r+b") as fh:
            fh.seek(3 * 4096)
            fh.write(bytes(range(256)) * 16)


@pytest.mark.parametrize("how", ["truncated", "garbage-page"])
def test_a_damaged_study_db_is_one_line_naming_the_file(how: str, stored_sweep: Path, tmp_path: Path,
                                                        capsys: Any) -> None:
    import shutil

    shutil.copytree(stored_sweep.parent, tmp_path / "copy")
    path = tmp_path / "copy" / stored_sweep.name
    sweep_text = path.read_text().replace(str(stored_sweep.parent), str(tmp_path / "copy"))
    path.write_text(sweep_text)
    db = tmp_path / "copy" / "results" / "stored" / "study.db"
    _damage(db, how)
    damaged = db.read_bytes()
    for argv in (["report", str(path)], ["resume", str(path)], ["dashboard", str(path), "--publish-only"],
                 ["dashboard", "--storage", f"sqlite:///{db}", "--publish-only"], ["run", str(path)]):
        code, err = _cli(argv, capsys)
        assert code == 2 and len(err) == 1, (argv, err)
        assert f"{db}: damaged database (" in err[0] and "restore it from a copy" in err[0], (argv, err)
        assert "Traceback" not in err[0] and "StorageInternalError" not in err[0]
        assert db.read_bytes() == damaged, argv  # nothing written into the damaged file


def test_sqlite_disk_full_is_a_storage_fault_naming_the_file(tmp_path: Path) -> None:
    """A real SQLITE_FULL ("database or disk is full": SQLite's page limit, reached as a full disk is) in an
    Optuna write is a `StorageFault` of kind "full" naming the file, where Optuna raised its
    StorageInternalError ("e.g. exceeding max length")."""
    storage_errors.watch()
    db = tmp_path / "full.db"
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
    study = optuna.create_study(storage=storage)
    trial = study.ask()
    pages = db.stat().st_size // 4096

    @sqlalchemy.event.listens_for(storage.engine, "connect")
    def _limit(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.execute(f"PRAGMA max_page_count = {pages}")

    storage.engine.dispose()  # new connections get the limit
    with pytest.raises(storage_errors.StorageFault) as info:
        for i in range(10_000):
            trial.set_user_attr(f"attr_{i}", "x" * 500)
    assert info.value.kind == "full"
    assert str(info.value).startswith(f"{db}: disk full (database or disk is full)")
    assert "\n" not in str(info.value)
    storage.engine.dispose()


def _fill(path: Path) -> None:
    """Write ``path`` until the disk is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"x" * 65536)
    except OSError as err:
        assert err.errno == errno.ENOSPC, err
    finally:
        os.close(fd)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_full_disk_mid_sweep_stops_it_in_one_line_and_resume_finishes_it(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(results)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    cli_cmd = [sys.executable, "-m", "collapse_hpo.hpo.cli"]
    try:
        path = tiny_sweep(tmp_path, "full", trials=4, tpp=30)  # retries: 0
        db = results / "full" / "study.db"
        url = f"sqlite:///{db}"
        with (tmp_path / "run.out").open("w") as out, (tmp_path / "run.err").open("w") as err:
            driver = subprocess.Popen([*cli_cmd, "run", str(path)], stdout=out, stderr=err, cwd=tmp_path)
            try:
                before = wait_until_training(driver, url, "full")
                _fill(results / "filler")
                code = driver.wait(timeout=300)
            finally:
                if driver.poll() is None:
                    driver.kill()
        (results / "filler").unlink()
        lines = [ln for ln in (tmp_path / "run.err").read_text().splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1, lines
        assert f"{db}: disk full (" in lines[0] and "marked interrupted" in lines[0], lines
        after = {t.number: t for t in read_trials(url, "full")}
        assert not [t.number for t in after.values() if t.state.name == "RUNNING"]
        for t in before:  # nothing stored before the disk filled is lost
            kept = after[t.number]
            assert t.intermediate_values.items() <= kept.intermediate_values.items(), t.number
            if t.state.name == "COMPLETE":
                assert kept.state.name == "COMPLETE" and kept.value == t.value
        failed = [t for t in after.values() if t.state.name == "FAIL"]
        assert failed, "a trial was training when the disk filled"
        for t in failed:
            assert t.user_attrs.get("interrupted") is True, t.user_attrs
            error = t.user_attrs["error"]
            assert error.startswith("storage fault: ") and "disk full" in error, error
        assert lease_rows(url) == []
        assert not list((results / "full").glob(".*.reserve"))

        done = subprocess.run([*cli_cmd, "resume", str(path)], capture_output=True, text=True, cwd=tmp_path,
                              timeout=400)
        assert done.returncode == 0, done.stdout + done.stderr
        trials = read_trials(url, "full")
        assert sorted(int(t.user_attrs["draw"]) for t in trials if t.state.name == "COMPLETE") == [0, 1, 2, 3]
        assert lease_rows(url) == []
    finally:
        subprocess.run(["umount", "-l", str(results)], check=False)
