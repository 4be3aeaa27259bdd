"""Issue 23 item 10: the dashboard has no authentication, so a host reachable from other machines is refused
unless ``--allow-remote`` is given, and is then read-only (DELETE/POST/PUT refused) with a loud warning; and
the server answers clients concurrently (one idle TCP connection blocked every other client for 8 s and
more). The real `collapse-hpo dashboard` in a subprocess, a real SQLite study, raw sockets and HTTP."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import optuna
import pytest

from collapse_hpo.hpo.cli import main
from collapse_hpo.hpo.outputs.dashboard_server import is_loopback


@pytest.fixture
def storage(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="shared", storage=url)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    return url


def test_a_host_reachable_from_other_machines_is_refused_without_allow_remote(storage: str,
                                                                             capsys: Any) -> None:
    before = Path(storage.split(":///", 1)[1]).read_bytes()
    for host in ("0.0.0.0", "::"):
        assert main(["dashboard", "--storage", storage, "--host", host, "--port", "0"]) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and "--allow-remote" in err[0] and "ssh -L" in err[0], err
    # Refused before anything was published into the study.
    assert Path(storage.split(":///", 1)[1]).read_bytes() == before
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("192.0.2.1")


def _start(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "collapse_hpo.hpo.cli", "dashboard", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, lines = time.monotonic() + 60, []
    while True:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line or proc.poll() is None, "dashboard exited: " + "".join(lines) + proc.stderr.read()
        assert time.monotonic() < deadline, "no URL printed: " + "".join(lines)
        lines.append(line)
        if "http://" in line:
            port = int(line.split("http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
            return proc, f"http://127.0.0.1:{port}"


def _request(url: str, method: str = "GET", timeout: float = 5.0) -> tuple[int, bytes, float]:
    start = time.monotonic()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=timeout) as r:
            return r.status, r.read(), time.monotonic() - start
    except urllib.error.HTTPError as err:
        return err.code, err.read(), time.monotonic() - start


@pytest.mark.timeout(120)
def test_a_remote_dashboard_is_read_only_warns_and_serves_clients_concurrently(storage: str) -> None:
    proc, base = _start(["--storage", storage, "--host", "0.0.0.0", "--allow-remote", "--port", "0",
                         "--no-publish"])
    idle = socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])))  # connects, sends nothing
    try:
        status, body, took = _request(f"{base}/api/studies")
        assert status == 200 and "shared" in json.loads(body)["study_summaries"][0]["study_name"], body
        assert took < 1.0, f"a request behind an idle connection took {took:.1f} s"
        study_id = optuna.load_study(study_name="shared", storage=storage)._study_id
        for method, path in (("DELETE", f"/api/studies/{study_id}"), ("POST", "/api/studies"),
                             ("PUT", f"/api/studies/{study_id}/note")):
            status, body, _ = _request(base + path, method)
            assert status == 403 and b"read-only" in body, (method, status, body)
        assert optuna.get_all_study_names(storage) == ["shared"]  # the DELETE did not reach the storage
    finally:
        idle.close()
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "WARNING" in err and "0.0.0.0" in err and "read-only" in err, err


@pytest.mark.timeout(120)
def test_read_only_on_loopback_refuses_delete_and_writable_by_default(storage: str) -> None:
    proc, base = _start(["--storage", storage, "--port", "0", "--no-publish", "--read-only"])
    try:
        study_id = optuna.load_study(study_name="shared", storage=storage)._study_id
        status, _, _ = _request(f"{base}/api/studies/{study_id}", "DELETE")
        assert status == 403 and optuna.get_all_study_names(storage) == ["shared"]
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "WARNING" not in err
