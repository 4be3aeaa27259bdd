"""`collapse-hpo monitor --follow` on a live log (issue 23, item 7): a half-written last row, a truncated
file and a rotated file are followed like `tail -F` (a writer thread changes the file while the real CLI
follows it), and a run that never ends stops at --idle or --timeout with exit 3."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from collapse_hpo.hpo import cli
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE, synthetic_curves

HEADER = b"run,t_hat,loss,lr,tau,tpp\n"
PAUSE = 0.4  # seconds the writer holds each state: several polls of --interval 0.05


def _lines() -> list[bytes]:
    [c] = synthetic_curves(taus=(0.2,), tpps=(20.0,), seeds=1, n_points=50, noise=0.002, seed=2)
    return [f"{c.run},{float(t)!r},{float(y)!r},{float(lr)!r},{c.tau!r},{c.tpp!r}\n".encode()
            for t, y, lr in zip(c.t_hat, c.loss, c.lr)]


@pytest.fixture
def surrogate(tmp_path: Path) -> Path:
    p = tmp_path / "s.json"
    TRUE_SURROGATE.save(p)
    return p


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as fh:
        fh.write(data)


def _follow_while(write: Callable[[], None], argv: list[str], capsys: Any) -> tuple[int, str, str]:
    """Run `collapse-hpo monitor ARGV` (in this thread) while ``write`` changes the file in another. The
    modules it needs are imported first, so that its first poll comes before the writer's first change."""
    whole = Path(argv[1]).with_name("warm.csv")
    whole.write_bytes(HEADER + b"".join(_lines()))
    cli.main(["monitor", str(whole), "--surrogate", argv[3]])
    whole.unlink()
    capsys.readouterr()
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    code = cli.main(argv)
    writer.join(timeout=30)
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _static(path: Path, surrogate: Path, capsys: Any) -> tuple[int, str]:
    code = cli.main(["monitor", str(path), "--surrogate", str(surrogate)])
    return code, capsys.readouterr().out


def _argv(path: Path, surrogate: Path, *extra: str) -> list[str]:
    return ["monitor", str(path), "--surrogate", str(surrogate), "--follow", "--interval", "0.05", *extra]


@pytest.mark.timeout(120)
def test_a_half_written_last_row_is_waited_for(tmp_path: Path, surrogate: Path, capsys: Any) -> None:
    lines = _lines()
    path = tmp_path / "run.csv"
    path.write_bytes(HEADER + b"".join(lines[:30]) + lines[30][:9])  # a block-buffered logger's flush

    def write() -> None:
        time.sleep(PAUSE)
        _append(path, lines[30][9:-1])  # still no newline: the row may go on
        time.sleep(PAUSE)
        _append(path, b"\n" + b"".join(lines[31:]))

    code, out, err = _follow_while(write, _argv(path, surrogate), capsys)
    assert code in (0, 1) and "error" not in err, err
    assert (code, out) == _static(path, surrogate, capsys)
    assert "  1.000 " in out.splitlines()[1]


@pytest.mark.timeout(120)
def test_a_truncated_file_is_read_again_from_its_start(tmp_path: Path, surrogate: Path, capsys: Any) -> None:
    lines = _lines()
    path = tmp_path / "run.csv"
    path.write_bytes(HEADER + b"".join(lines[:25]))

    def write() -> None:  # copytruncate: the rows so far go elsewhere, the log starts again
        time.sleep(PAUSE)
        with open(path, "r+b") as fh:
            fh.truncate(0)
        time.sleep(PAUSE)
        _append(path, HEADER + b"".join(lines[25:40]))
        time.sleep(PAUSE)
        _append(path, b"".join(lines[40:]))

    code, out, err = _follow_while(write, _argv(path, surrogate), capsys)
    assert "truncated; reading it again from its start" in err and "error" not in err, err
    whole = tmp_path / "whole.csv"
    whole.write_bytes(HEADER + b"".join(lines))
    assert (code, out.replace(str(path), "")) == _static(whole, surrogate, capsys)


@pytest.mark.timeout(120)
def test_a_rotated_file_is_followed_by_name(tmp_path: Path, surrogate: Path, capsys: Any) -> None:
    lines = _lines()
    path = tmp_path / "run.csv"
    path.write_bytes(HEADER + b"".join(lines[:20]))

    def write() -> None:  # the logger's file is renamed, it writes its buffer there, then opens a new one
        time.sleep(PAUSE)
        with open(path, "ab") as old:
            os.rename(path, tmp_path / "run.csv.1")
            time.sleep(PAUSE)  # no file under the name for a while
            old.write(b"".join(lines[20:30]))
        time.sleep(PAUSE)
        path.write_bytes(HEADER + b"".join(lines[30:45]))
        time.sleep(PAUSE)
        _append(path, b"".join(lines[45:]))

    code, out, err = _follow_while(write, _argv(path, surrogate), capsys)
    assert "rotated" in err and "no such file yet; waiting" in err and "error" not in err, err
    whole = tmp_path / "whole.csv"
    whole.write_bytes(HEADER + b"".join(lines))
    assert (code, out) == _static(whole, surrogate, capsys)


@pytest.mark.timeout(120)
def test_a_run_that_never_ends_stops_at_the_idle_or_timeout_limit(tmp_path: Path, surrogate: Path,
                                                                  capsys: Any) -> None:
    lines = _lines()
    path = tmp_path / "run.csv"
    path.write_bytes(HEADER + b"".join(lines[:25]))
    t0 = time.monotonic()
    code, out, err = _follow_while(lambda: None, _argv(path, surrogate, "--idle", "0.5"), capsys)
    assert code == 3 and time.monotonic() - t0 < 30
    assert f"stopped: no new row in {path} for --idle 0.5 s" in err.splitlines()[-1]
    assert out.splitlines()[1].split()[1] == f"{float(lines[24].split(b',')[1]):.3f}"  # the table so far

    stop = threading.Event()

    def trickle() -> None:  # a new row every 0.1 s: never idle, never done
        for line in lines[25:]:
            if stop.wait(0.1):
                return
            _append(path, line)

    code, out, err = _follow_while(trickle, _argv(path, surrogate, "--timeout", "0.6", "--idle", "5"), capsys)
    stop.set()
    assert code == 3 and "stopped after --timeout 0.6 s before the run(s) ended" in err.splitlines()[-1], err
    helptext = cli.build_parser()._subparsers._group_actions[0].choices["monitor"].format_help()
    assert "--timeout" in helptext and "--idle" in helptext and "exit 3" in helptext


def test_a_changed_header_is_refused(tmp_path: Path, surrogate: Path, capsys: Any) -> None:
    lines = _lines()
    path = tmp_path / "run.csv"
    path.write_bytes(HEADER + b"".join(lines[:20]))

    def write() -> None:
        time.sleep(PAUSE)
        os.rename(path, tmp_path / "run.csv.1")
        path.write_bytes(b"run,loss,t_hat,lr,tau,tpp\n" + b"".join(lines[20:]))

    code, _out, err = _follow_while(write, _argv(path, surrogate), capsys)
    assert code == 2 and "line 1: the header changed" in err.splitlines()[-1], err
