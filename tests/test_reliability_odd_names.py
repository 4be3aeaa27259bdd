"""Issue 23 item 11: odd paths and names.

- A results folder whose name holds URL characters (``res?x=1``, ``a#b``, ``p%41q``) keeps its study.db
  inside: the default SQLite URL percent-encodes the path (it went in raw, and ``?x=1`` became the URL's
  query, so the database was the file ``res``, outside the folder).
- Run names that a spreadsheet reads as formulas (``=``, ``+``, ``-``, ``@``, tab, CR) are written with a
  leading apostrophe in every CSV (predictors/spreadsheet.py); numbers are unchanged, and a curve file reads
  back with the names it was given.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import yaml

from collapse_hpo.hpo import cli
from collapse_hpo.hpo.sweep.config import parse_sweep
from collapse_hpo.hpo.sweep.runner import create_study, locate
from collapse_hpo.hpo.sweep.urls import sqlite_file, sqlite_url
from collapse_hpo.predictors.curves import read_curves_csv, write_curves_csv
from collapse_hpo.predictors.spreadsheet import FORMULA_PREFIXES
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE, synthetic_curves


@pytest.mark.parametrize("name", ["res?x=1", "a#b", "p%41q", "sp ace"])
def test_a_results_folder_with_url_characters_keeps_its_study_inside(name: str, tmp_path: Path,
                                                                    capsys: Any) -> None:
    doc = {"name": "odd", "model": {"width": 16, "depth": 1, "heads": 2, "context": 64}, "tpp": 10,
           "fixed": {"batch_tokens": 512, "lr": 0.01}, "trials": 1}
    sweep_file = tmp_path / "odd.yaml"
    sweep_file.write_text(yaml.safe_dump(doc))
    results = tmp_path / name
    sweep = parse_sweep(doc, str(sweep_file))
    loc = locate(sweep, str(results))
    assert sqlite_file(loc.storage_url) == results / "study.db"
    results.mkdir()
    create_study(sweep, loc)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["odd.yaml", name])
    assert (results / "study.db").is_file()
    capsys.readouterr()
    cli.main(["report", str(sweep_file), "--results", str(results)])  # finds the study it made
    assert "no sweep" not in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["odd.yaml", name])
    assert sqlite_file(sqlite_url("rel/a?b#c%d")) == Path("rel/a?b#c%d")


NAMES = ["=HYPERLINK(\"http://x\",\"y\")", "+1+2", "-2-3", "@SUM(A1)", "\tTAB", "'=quoted", "plain", "-7"]


def _formula_cells(path: Path) -> list[str]:
    with path.open(newline="") as fh:
        return [cell for row in csv.reader(fh) for cell in row if cell.startswith(FORMULA_PREFIXES)
                and not _number(cell)]


def _number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def test_run_names_that_look_like_formulas_are_neutralized_in_every_csv(tmp_path: Path, capsys: Any) -> None:
    curves = synthetic_curves(taus=(0.2,), tpps=(20.0,), seeds=len(NAMES), n_points=30, noise=0.002, seed=3)
    for c, name in zip(curves, NAMES):
        c.run = name
    path = tmp_path / "curves.csv"
    write_curves_csv(path, curves)
    assert _formula_cells(path) == []
    # A spreadsheet shows "'=x" as the text =x; our reader gives back the names as they were (tab stripped).
    assert [c.run for c in read_curves_csv(path)] == [n.strip() for n in NAMES]
    surrogate = tmp_path / "s.json"
    TRUE_SURROGATE.save(surrogate)
    out = tmp_path / "monitor.csv"
    cli.main(["monitor", str(path), "--surrogate", str(surrogate), "--csv", str(out)])
    capsys.readouterr()
    assert _formula_cells(out) == []
    with out.open(newline="") as fh:
        rows = list(csv.reader(fh))[1:]
    assert {r[0] for r in rows} >= {"'=HYPERLINK(\"http://x\",\"y\")", "'-2-3", "-7", "plain", "''=quoted"}
    assert any(float(r[2]) < 0 for r in rows if r[2])  # negative residuals stay numbers
    replayed = tmp_path / "replay.csv"
    cli.main(["replay", str(path), "--orders", "2", "--csv", str(replayed)])
    capsys.readouterr()
    assert replayed.is_file() and _formula_cells(replayed) == []
