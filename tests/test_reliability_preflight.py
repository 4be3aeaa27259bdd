"""Issue 12, "Everything checked before anything is written": each bad sweep goes through the real command
line (`collapse_hpo.hpo.cli.main`) and must give exit status 2, exactly one line on stderr naming the file
and the field, and create nothing (no results folder, no study.db, no table on the PostgreSQL server).

Every case here passed validation on main (b188769) and then wrote, ran or hung.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
import yaml

from collapse_hpo.hpo import cli
from collapse_hpo.hpo.sweep import preflight

POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"


def _doc(tmp: Path, **changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "pf",
        "model": {"width": 16, "depth": 1, "heads": 2, "context": 64},
        "tpp": 10,
        "fixed": {"batch_tokens": 512},
        "space": {"lr": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}},
        "trials": 2,
        "executor": {"num_cpus": 2},
        "results": str(tmp / "results"),
    }
    doc.update(changes)
    return doc


def _write(tmp: Path, doc: dict[str, Any] | str) -> Path:
    p = tmp / "sweep.yaml"
    p.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return p


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _refused(tmp: Path, doc: dict[str, Any] | str, field: str, phrase: str, capsys: Any,
             command: str = "run") -> str:
    """Run ``command`` on the sweep; assert exit 2, one stderr line naming the file, ``field`` and ``phrase``,
    and that nothing new exists under ``tmp``. Returns the line."""
    path = _write(tmp, doc)
    before = _tree(tmp)
    code = cli.main([command, str(path)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(err) == 1, err
    assert str(path) in err[0] and field in err[0] and phrase in err[0], err[0]
    assert _tree(tmp) == before, "something was written"
    return err[0]


CASES: dict[str, tuple[Any, str, str]] = {
    "name ..": ({"name": ".."}, "field 'name'", "folder reference"),
    "name of 300 characters": ({"name": "a" * 300}, "field 'name'", "at most 100"),
    "in-memory sqlite": ({"storage": "sqlite://"}, "field 'storage'", "in-memory"),
    "in-memory sqlite file": ({"storage": "sqlite:///:memory:"}, "field 'storage'", "in-memory"),
    "postgresql without a database": ({"storage": "postgresql://"}, "field 'storage'", "names no database"),
    "postgresql server without a database": ({"storage": "postgresql://postgres@127.0.0.1:5432"},
                                             "field 'storage'", "names no database"),
    "missing corpus": ({"train": {"corpus": "no/such/corpus"}}, "field 'train.corpus'", "does not exist"),
    "trials 1e21": ({"trials": 1e21}, "field 'trials'", "integer"),
    "trials 200000": ({"trials": 200_000}, "field 'trials'", "100000"),
    "batch_tokens above the training tokens": ({"fixed": {"batch_tokens": 100_000_000}},
                                               "field 'fixed.batch_tokens'", "more than the"),
    "a trial larger than the node's memory": (
        {"model": {"width": 4096, "depth": 64, "heads": 32, "context": 64},
         "fixed": {"batch_tokens": 1 << 24}, "space": {"lr": {"type": "float", "low": 1e-3, "high": 1e-2}}},
        "field 'train.micro_batch_tokens'", "GiB"),
    "cuda device with no GPU asked": ({"train": {"device": "cuda"}}, "field 'resources.gpu'", "no GPU"),
    "password in the file for a remote cluster": (
        {"storage": "postgresql://postgres:secretpw@127.0.0.1:5432/test", "executor": {"address": "auto"}},
        "field 'storage'", "holds a password"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_sweep_is_refused_before_anything_is_written(case: str, tmp_path: Path, capsys: Any) -> None:
    changes, field, phrase = CASES[case]
    line = _refused(tmp_path, _doc(tmp_path, **changes), field, phrase, capsys)
    assert "secretpw" not in line


def test_tpp_1e400_is_one_line(tmp_path: Path, capsys: Any) -> None:
    text = yaml.safe_dump(_doc(tmp_path), sort_keys=False).replace("tpp: 10", "tpp: 1e400")
    _refused(tmp_path, text, "field 'tpp'", "finite", capsys)


def test_duplicated_key_is_refused_with_both_lines(tmp_path: Path, capsys: Any) -> None:
    text = yaml.safe_dump(_doc(tmp_path, pruner={"enabled": True}), sort_keys=False)
    text += "pruner:\n  enabled: false\n"  # a second block that would silently turn pruning off
    line = _refused(tmp_path, text, "key 'pruner' is given twice", "first at line", capsys)
    assert "line " in line


def test_cuda_device_on_a_machine_without_cuda(tmp_path: Path, capsys: Any) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    _refused(tmp_path, _doc(tmp_path, train={"device": "cuda"}, resources={"cpu": 1, "gpu": 1},
                            executor={"num_cpus": 2, "num_gpus": 1}),
             "field 'train.device'", "no usable CUDA", capsys)


def test_a_gpu_per_trial_on_a_local_ray_without_gpus(tmp_path: Path, capsys: Any) -> None:
    """`resources: {gpu: 1}` with the local Ray's GPUs left to Ray to count: only a started Ray can tell that
    none fits. It used to print the sweep's header, create results/ and a study of waiting trials, and then
    refuse, so the mended file was refused in turn ("study already exists")."""
    import ray
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    try:
        _refused(tmp_path, _doc(tmp_path, resources={"cpu": 1, "gpu": 1}), "field 'resources'",
                 "0.0 GPU; lower the resources per trial", capsys)
    finally:
        ray.shutdown()  # the check started a local Ray in this process


def test_sqlite_path_that_is_a_folder_or_another_file(tmp_path: Path, capsys: Any) -> None:
    folder = tmp_path / "db"
    folder.mkdir()
    _refused(tmp_path, _doc(tmp_path, storage=f"sqlite:///{folder}"), "field 'storage'", "is a folder",
             capsys)
    _refused(tmp_path, _doc(tmp_path, storage="sqlite:////etc/passwd"), "field 'storage'",
             "not a SQLite database", capsys)


def test_missing_reference_study_is_refused(tmp_path: Path, capsys: Any) -> None:
    name = f"no-such-study-{uuid.uuid4().hex[:8]}"
    pruner = {"reference": {"study": name, "storage": POSTGRES}}
    _refused(tmp_path, _doc(tmp_path, pruner=pruner), "field 'pruner.reference.study'", "no study", capsys)
    missing_file = {"reference": {"study": "x", "storage": f"sqlite:///{tmp_path}/none.db"}}
    _refused(tmp_path, _doc(tmp_path, pruner=missing_file), "field 'pruner.reference.storage'",
             "does not exist", capsys)


@contextlib.contextmanager
def _silent_server() -> Any:
    """A TCP server that accepts connections and never answers (a hung database)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(srv.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for c in held:
            c.close()
        srv.close()


@pytest.mark.timeout(60)
def test_a_storage_that_never_answers_is_refused_within_the_connect_timeout(
        tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preflight, "CONNECT_TIMEOUT_S", 2)
    with _silent_server() as port:
        url = f"postgresql://postgres@127.0.0.1:{port}/test"
        started = time.monotonic()
        line = _refused(tmp_path, _doc(tmp_path, pruner={"reference": {"study": "s", "storage": url}}),
                        "field 'pruner.reference.storage'", "within 2 s", capsys)
        assert time.monotonic() - started < 20, line
        started = time.monotonic()
        _refused(tmp_path, _doc(tmp_path, storage=url), "field 'storage'", "within 2 s", capsys)
        assert time.monotonic() - started < 20


def test_results_folder_under_sys_is_refused(tmp_path: Path, capsys: Any) -> None:
    if not Path("/sys/kernel").is_dir():
        pytest.skip("no /sys")
    _refused(tmp_path, _doc(tmp_path, results="/sys/kernel/collapse-hpo-results"), "results folder",
             "cannot write", capsys)


@contextlib.contextmanager
def _tmpfs(path: Path, size: str = "64k", readonly: bool = False) -> Any:
    path.mkdir()
    opts = f"size={size}" + (",ro" if readonly else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def test_read_only_and_full_results_folders_are_refused(tmp_path: Path, capsys: Any) -> None:
    with _tmpfs(tmp_path / "ro", readonly=True) as ro:
        _refused(tmp_path, _doc(tmp_path, results=str(ro / "r")), "results folder", "read-only", capsys)
        _refused(tmp_path, _doc(tmp_path, results=str(ro / "r")), "results folder", "read-only", capsys,
                 command="resume")
        _refused(tmp_path, _doc(tmp_path, results=str(ro / "r")), "results folder", "read-only", capsys,
                 command="report")
    with _tmpfs(tmp_path / "full", size="4k") as full:
        (full / "filler").write_bytes(b"x" * 4096)
        _refused(tmp_path, _doc(tmp_path, results=str(full / "r")), "results folder", "disk is full", capsys)


def test_preflight_creates_no_table_on_postgresql(tmp_path: Path, capsys: Any) -> None:
    """A bad sweep on a real server: the server's tables are the same after the refusal."""
    engine = sqlalchemy.create_engine(POSTGRES)
    try:
        with engine.connect() as conn:
            before = sorted(sqlalchemy.inspect(conn).get_table_names())
        name = f"pf-{uuid.uuid4().hex[:8]}"
        _refused(tmp_path, _doc(tmp_path, name=name, storage=POSTGRES, train={"corpus": "missing"}),
                 "field 'train.corpus'", "does not exist", capsys)
        with engine.connect() as conn:
            assert sorted(sqlalchemy.inspect(conn).get_table_names()) == before
    finally:
        engine.dispose()
