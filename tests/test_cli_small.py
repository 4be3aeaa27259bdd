"""Small command-line fixes of issue 13 (item 6): honest `--no-prune` help, `replay --pruner list` without a
curves file, and `report --results <missing dir>` that creates nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from sweep_util import tiny_sweep

from collapse_hpo.hpo import cli
from collapse_hpo.hpo.sweep.config import load_sweep
from collapse_hpo.hpo.sweep.runner import create_study, locate


def _help(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    """The `--help` text of a sub-command, with its line wrapping undone."""
    with pytest.raises(SystemExit) as stop:
        cli.main([command, "--help"])
    assert stop.value.code == 0
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(("command", "says"), [
    ("run", "train every trial to the end"),
    ("resume", "continue the unpruned sweep that `run --no-prune` started"),
    ("report", "report the unpruned sweep that `run --no-prune` trained"),
])
def test_no_prune_help_says_what_the_flag_does_for_each_command(command: str, says: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(command, capsys)
    flag = text[text.index("--no-prune ", text.index("options:")):]
    assert flag.startswith(f"--no-prune {says}")
    assert "-noprune" in flag
    if command != "run":  # neither trains a new sweep from the start
        assert "train every trial to the end" not in text


def test_replay_pruner_list_needs_no_curves_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["replay", "--pruner", "list"]) == 0
    out = capsys.readouterr().out
    assert "collapse-online" in out and len(out.splitlines()) >= 3


def test_replay_without_curves_file_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["replay", "--orders", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no curve CSV given" in err[0] and "--pruner list" in err[0]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_report_with_a_missing_results_folder_creates_nothing(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # A real study in a storage outside the results folder (as with PostgreSQL): `report` can open it, so
    # before the fix it went on and created the missing folder with results.csv in it.
    (tmp_path / "db").mkdir()
    path = tiny_sweep(tmp_path, "small", trials=2, storage=f"sqlite:///{tmp_path / 'db' / 'study.db'}")
    sweep = load_sweep(str(path))
    create_study(sweep, locate(sweep))
    capsys.readouterr()  # Optuna's "study created" log line
    before = _tree(tmp_path)
    missing = tmp_path / "elsewhere" / "report"
    assert cli.main(["report", str(path), "--results", str(missing)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and f"--results {missing}: no such folder" in err[0], captured.err
    assert not (tmp_path / "elsewhere").exists()
    assert _tree(tmp_path) == before  # the study file is untouched too (no dashboard notes published)


@pytest.mark.parametrize("command", ["report", "dashboard"])
def test_no_results_yet_says_where_results_are_looked_for(command: str, tmp_path: Path, monkeypatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A new user ran the sweep in its own folder and `report` from its parent: "no sweep results in
    /tmp/results/mini: run `collapse-hpo run` first" named neither the file nor why that folder."""
    import yaml

    path = tiny_sweep(tmp_path, "elsewhere")
    doc = yaml.safe_load(path.read_text())
    del doc["results"]  # the default: results/<name> under the working directory
    path.write_text(yaml.safe_dump(doc))
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "other")
    assert cli.main([command, str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert str(tmp_path / "other" / "results" / "elsewhere") in err and "under the working directory" in err
    assert f"run `collapse-hpo run {path}` first" in err and "give --results DIR" in err
    assert list((tmp_path / "other").iterdir()) == []  # nothing made
