"""Issue 23 item 2: an output path that is not a regular file or a new path (a character device made with
mknod, a FIFO, a symbolic link to /proc/self/fd/1) is refused naming what it is, and left as it is: the
atomic writer's rename used to replace the node with a regular file (as root, ``-o /dev/null`` would have
replaced the system's). A link to a regular file is written through, the link kept. Real nodes, the real
CLI (in a subprocess where fd 1 must be a pipe)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from collapse_hpo.hpo import cli
from collapse_hpo.predictors.atomic import atomic_write, check_writable_file
from collapse_hpo.predictors.curves import write_curves_csv
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE, synthetic_curves


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    curves = synthetic_curves(taus=(0.2,), tpps=(20.0,), seeds=3, n_points=40, noise=0.002, seed=1)
    write_curves_csv(tmp_path / "c.csv", curves)
    TRUE_SURROGATE.save(tmp_path / "s.json")
    return tmp_path / "c.csv", tmp_path / "s.json"


def _char_device(folder: Path) -> Path:
    """A character device in ``folder``: made with mknod (the null device's numbers) where allowed (root),
    else a symbolic link to /dev/null (the same node kind reached through a link)."""
    node = folder / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        node.symlink_to("/dev/null")
    return node


def test_devices_and_fifos_are_refused_naming_what_they_are_and_kept(tmp_path: Path) -> None:
    dev = _char_device(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, kind in ((dev, "a character device"), (fifo, "a FIFO")):
        before = os.lstat(path)
        for attempt in (lambda p=path: check_writable_file(p), lambda p=path: atomic_write(p).__enter__()):
            with pytest.raises(InputError) as info:
                attempt()
            assert kind in str(info.value) and str(path) in str(info.value), str(info.value)
        after = os.lstat(path)
        assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "null"]  # no temporary file left


def test_a_link_to_a_regular_file_is_written_through_and_kept(tmp_path: Path) -> None:
    target = tmp_path / "real.csv"
    target.write_text("old")
    os.chmod(target, 0o640)
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    with atomic_write(link) as fh:
        fh.write("new")
    assert link.is_symlink() and target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640
    dangling = tmp_path / "later.csv"
    dangling.symlink_to(tmp_path / "made.csv")
    with atomic_write(dangling) as fh:
        fh.write("x")
    assert dangling.is_symlink() and (tmp_path / "made.csv").read_text() == "x"


def test_calibrate_into_a_device_is_refused_and_the_device_kept(tmp_path: Path, files: tuple[Path, Path],
                                                                 capsys: Any) -> None:
    curves, _ = files
    dev = _char_device(tmp_path)
    before = os.lstat(dev)
    assert cli.main(["calibrate", str(curves), "-o", str(dev)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "a character device" in err[0], err
    after = os.lstat(dev)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)


@pytest.mark.parametrize("command", ["monitor", "calibrate"])
def test_a_link_to_proc_self_fd_1_is_refused(command: str, tmp_path: Path, files: tuple[Path, Path]) -> None:
    curves, surrogate = files
    link = tmp_path / "out.csv"
    link.symlink_to("/proc/self/fd/1")
    argv = (["monitor", str(curves), "--surrogate", str(surrogate), "--csv", str(link)]
            if command == "monitor" else ["calibrate", str(curves), "-o", str(link)])
    proc = subprocess.run([sys.executable, "-m", "collapse_hpo.hpo.cli", *argv], capture_output=True,
                          text=True, timeout=120)  # stdout is a pipe: the link reaches a FIFO
    assert proc.returncode == 2 and "a FIFO" in proc.stderr and "symbolic link" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == ""
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"


def test_report_checks_all_its_files_before_writing_any(tmp_path: Path, capsys: Any) -> None:
    import yaml

    from collapse_hpo.hpo.sweep.config import parse_sweep
    from collapse_hpo.hpo.sweep.runner import create_study, locate

    results = tmp_path / "results"
    doc = {"name": "rp", "model": {"width": 16, "depth": 1, "heads": 2, "context": 64}, "tpp": 10,
           "fixed": {"batch_tokens": 512, "lr": 0.01}, "trials": 1, "results": str(results)}
    sweep_file = tmp_path / "rp.yaml"
    sweep_file.write_text(yaml.safe_dump(doc))
    sweep = parse_sweep(doc, str(sweep_file))
    loc = locate(sweep)
    loc.results.mkdir(parents=True)
    create_study(sweep, loc)
    capsys.readouterr()
    os.mkfifo(loc.results / "curves.png")  # the last file the report writes
    assert cli.main(["report", str(sweep_file)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "curves.png" in err[0] and "a FIFO" in err[0], err
    assert not (loc.results / "results.csv").exists()
    assert stat.S_ISFIFO(os.lstat(loc.results / "curves.png").st_mode)
    # `run` and `resume` refuse it before the sweep starts (the report is written at their end).
    for command in ("run", "resume"):
        assert cli.main([command, str(sweep_file)]) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and "curves.png" in err[0] and "a FIFO" in err[0], err
