"""Issue 23, item 3: a damaged study database and a full disk, through the real command line.

- A study.db truncated to half its size, or with one page overwritten by garbage: `report`, `resume`,
  `dashboard` and `run` say so in one line naming the file ("damaged database ... restore it from a copy"),
  exit 2, no traceback, and leave the file as it was (on main they exited 1 with 53–93 lines of traceback).
- SQLite's own "database or disk is full" (a real SQLITE_FULL, from a page limit) is one `StorageFault`
  naming the file, not Optuna's "exceeding max length".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy
from sweep_util import tiny_sweep

from collapse_hpo.hpo import cli, storage_errors
from collapse_hpo.hpo.config import load_sweep
from collapse_hpo.hpo.runner import create_study, locate
from collapse_hpo.hpo.trial import run_trial, trial_config


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
