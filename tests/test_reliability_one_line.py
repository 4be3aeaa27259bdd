"""Issue 12, "One line, never a traceback": inputs and output paths that gave a traceback (exit 1) on main
(b188769), through the real command line. Output paths are checked before the work starts; a full disk says
so and keeps the old file."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from collapse_hpo.hpo import cli
from collapse_hpo.predictors.curves import write_curves_csv
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE, synthetic_curves


def _cli(argv: list[str], capsys: Any) -> tuple[int, str, list[str]]:
    code = cli.main(argv)
    cap = capsys.readouterr()
    return code, cap.out, [ln for ln in cap.err.splitlines() if ln.strip()]


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    curves = synthetic_curves(taus=(0.2,), tpps=(20.0,), seeds=3, n_points=40, noise=0.002, seed=1)
    write_curves_csv(tmp_path / "c.csv", curves)
    TRUE_SURROGATE.save(tmp_path / "s.json")
    return tmp_path / "c.csv", tmp_path / "s.json"


def test_surrogate_json_nested_100000_deep(tmp_path: Path, files: tuple[Path, Path], capsys: Any) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    code, _, err = _cli(["predict", str(files[0]), "--surrogate", str(deep), "--fraction", "0.3"], capsys)
    assert code == 2 and len(err) == 1 and "nested too deeply" in err[0]


def test_calibrate_into_a_folder_fails_before_the_work(tmp_path: Path, files: tuple[Path, Path],
                                                      capsys: Any) -> None:
    code, out, err = _cli(["calibrate", str(files[0]), "-o", str(tmp_path)], capsys)
    assert code == 2 and len(err) == 1 and "is a folder" in err[0]
    assert out == ""  # the fit table is not printed: nothing was fitted


def test_train_into_a_folder_fails_before_training(tmp_path: Path, capsys: Any) -> None:
    code, _, err = _cli(["train", "--width", "16", "--depth", "1", "--heads", "2", "--context", "64",
                         "--batch-tokens", "512", "--tpp", "5", "-o", str(tmp_path)], capsys)
    assert code == 2 and len(err) == 1 and "is a folder" in err[0]
    assert not any("t_hat" in ln for ln in err)


def test_predict_json_with_a_tiny_final_loss_is_valid_json(tmp_path: Path, files: tuple[Path, Path],
                                                          capsys: Any) -> None:
    text = files[0].read_text().splitlines()
    last = text[-1].split(",")
    last[2] = "1e-320"
    (tmp_path / "tiny.csv").write_text("\n".join([*text[:-1], ",".join(last)]) + "\n")
    code, out, err = _cli(["predict", str(tmp_path / "tiny.csv"), "--surrogate", str(files[1]),
                           "--fraction", "0.3", "--json"], capsys)
    assert code == 0, err
    rows = [json.loads(ln) for ln in out.splitlines()]
    assert len(rows) == 3


@pytest.mark.parametrize("command", ["calibrate", "monitor", "replay"])
def test_outputs_under_sys_are_one_line_before_the_work(command: str, files: tuple[Path, Path],
                                                        capsys: Any) -> None:
    if not Path("/sys/kernel").is_dir():
        pytest.skip("no /sys")
    target = "/sys/kernel/collapse-hpo-out.csv"
    argv = {"calibrate": ["calibrate", str(files[0]), "-o", target],
            "monitor": ["monitor", str(files[0]), "--surrogate", str(files[1]), "--csv", target],
            "replay": ["replay", str(files[0]), "--orders", "1", "--pruner", "none", "--csv", target],
            }[command]
    code, out, err = _cli(argv, capsys)
    assert code == 2 and len(err) == 1 and "cannot write" in err[0], err
    assert out == ""


def test_a_full_disk_says_so_and_keeps_the_old_file(tmp_path: Path, files: tuple[Path, Path],
                                                    capsys: Any) -> None:
    from collapse_hpo.predictors.atomic import atomic_write
    from collapse_hpo.predictors.errors import InputError

    mnt = tmp_path / "full"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        old = mnt / "results.csv"
        old.write_text("old contents\n")
        os.chmod(old, 0o644)
        with pytest.raises(InputError, match="disk is full") as info, atomic_write(old) as fh:
            fh.write("x" * 200_000)
        assert "\n" not in str(info.value)
        assert old.read_text() == "old contents\n"
        assert [p.name for p in mnt.iterdir()] == ["results.csv"]  # no temporary file left behind
        # Through a command: replay's summary CSV on the full disk.
        (mnt / "filler").write_bytes(b"x" * (60 * 1024))
        code, _, err = _cli(["replay", str(files[0]), "--orders", "1", "--pruner", "none",
                             "--csv", str(mnt / "summary.csv")], capsys)
        assert code == 2 and len(err) == 1 and "disk is full" in err[0]
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
