"""Issue 6.6, bad input through the real command line (`collapse_hpo.hpo.cli.main`), no mocks.

Each case: exit status 2, exactly one line on stderr naming the offending file and its field (or line and
column), and nothing written: no new file or folder, and on a real PostgreSQL server no study created.
Complements tests/test_config.py (YAML fields through run/resume/report) with what it does not reach: a
corrupted surrogate JSON named by a sweep file, bad curve CSVs given to `predict`/`calibrate`, and bad input
while the storage is a real PostgreSQL (which must not receive a study).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from collapse_hpo.hpo import cli
from collapse_hpo.predictors.curves import write_curves_csv
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE, synthetic_curves

POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
HEADER = "run,t_hat,loss,lr,tau,tpp\n"
# A surrogate JSON cut in the middle of a field: what a full disk or a killed writer leaves.
TRUNCATED_SURROGATE = '{"format": "collapse-hpo-surrogate", "version": 1, "b_c": 0.5, "b_e": '


def _sweep_doc(tmp: Path, name: str, **changes: Any) -> dict[str, Any]:
    """A valid tiny sweep (the shape of tests/sweep_util.py's), with ``changes`` applied."""
    doc: dict[str, Any] = {
        "name": name,
        "model": {"width": 16, "depth": 1, "heads": 2, "context": 64},
        "tpp": 10,
        "fixed": {"batch_tokens": 512},
        "space": {"lr": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}},
        "trials": 2,
        "results": str(tmp / "results"),
    }
    doc.update(changes)
    return doc


def _write_sweep(tmp: Path, doc: dict[str, Any]) -> Path:
    path = tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _tree(folder: Path) -> list[str]:
    """Every path under ``folder`` (relative), to show that nothing was written."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = cli.main(argv)
    err = capsys.readouterr().err
    return code, [ln for ln in err.splitlines() if ln.strip()]


def _postgres_or_skip() -> None:
    try:
        import psycopg

        psycopg.connect(POSTGRES, connect_timeout=3).close()
    except Exception as err:  # the server is part of the test set-up (contract): say so when it is absent
        pytest.skip(f"PostgreSQL not reachable at {POSTGRES}: {err}")


def _pg_study_names() -> set[str]:
    from collapse_hpo.hpo.sweep.trial import storage_url

    storage = optuna.storages.RDBStorage(storage_url(POSTGRES))
    try:
        return {s.study_name for s in optuna.get_all_study_summaries(storage)}
    finally:
        storage.remove_session()
        storage.engine.dispose()


# ------------------------------------------------------------------ a corrupted surrogate JSON in a sweep
@pytest.mark.parametrize("command", ["run", "resume"])
def test_sweep_with_a_corrupted_surrogate_json_exits_2_naming_both_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    surrogate = tmp_path / "surrogate.json"
    surrogate.write_text(TRUNCATED_SURROGATE)
    path = _write_sweep(tmp_path, _sweep_doc(tmp_path, "corrupt", pruner={"reference": {
        "surrogate": "surrogate.json"}}))
    before = _tree(tmp_path)
    code, lines = _cli([command, str(path)], capsys)
    assert code == 2
    assert len(lines) == 1, lines
    assert str(path) in lines[0] and "field 'pruner.reference'" in lines[0], lines[0]
    assert str(surrogate) in lines[0] and "not valid JSON" in lines[0], lines[0]
    assert _tree(tmp_path) == before  # no results folder, no study.db


def test_predict_with_a_corrupted_surrogate_json_names_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    curves = tmp_path / "curves.csv"
    write_curves_csv(curves, synthetic_curves(taus=(0.1,), tpps=(20.0,), n_points=20, seed=0))
    bad = tmp_path / "s.json"
    wrong_type = {"format": "collapse-hpo-surrogate", "version": 1, "b_c": "x", "b_e": 0, "q_c": 1, "q_e": 0}
    for text in (TRUNCATED_SURROGATE, json.dumps(wrong_type), "", "\x00\x01 not json"):
        bad.write_text(text)
        before = _tree(tmp_path)
        code, lines = _cli(["predict", str(curves), "--surrogate", str(bad), "--fraction", "0.3"], capsys)
        assert code == 2 and len(lines) == 1, lines
        assert str(bad) in lines[0], lines[0]
        assert _tree(tmp_path) == before


# ------------------------------------------------------------------ curve CSVs: missing column, bad number
def _good_csv(tmp: Path) -> Path:
    path = tmp / "ref.csv"
    write_curves_csv(path, synthetic_curves(taus=(0.05, 0.2), tpps=(20.0,), n_points=20, seed=3))
    return path


@pytest.mark.parametrize(("text", "names"), [
    pytest.param("run,t_hat,loss,lr,tpp\nr,0.1,3.0,1.0,20\n", ["line 1", "tau"], id="missing-column-tau"),
    pytest.param("run,t_hat,lr,tau,tpp\nr,0.1,1.0,0.1,20\n", ["line 1", "loss"], id="missing-column-loss"),
    pytest.param(HEADER + "r,0.1,3.0,1.0,0.1,20\nr,0.2,2.9.1,1.0,0.1,20\n",
                 ["line 3", "column 'loss'", "2.9.1"], id="malformed-loss"),
    pytest.param(HEADER + "r,0.1,3.0,1.0,0.1,20\nr,zero point two,2.9,1.0,0.1,20\n",
                 ["line 3", "column 't_hat'"], id="malformed-t_hat"),
    pytest.param(HEADER + "r,0.1,3.0,1.0,0.1,2O\n", ["line 2", "column 'tpp'", "2O"], id="malformed-tpp"),
])
@pytest.mark.parametrize("command", ["predict", "calibrate"])
def test_bad_curve_csv_exits_2_naming_file_line_and_column(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, text: str,
        names: list[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(text)
    out = tmp_path / "out.json"
    if command == "predict":
        surrogate = tmp_path / "s.json"
        TRUE_SURROGATE.save(surrogate)
        argv = ["predict", str(bad), "--surrogate", str(surrogate), "--fraction", "0.3"]
    else:
        argv = ["calibrate", str(bad), "-o", str(out)]
    before = _tree(tmp_path)
    code, lines = _cli(argv, capsys)
    assert code == 2 and len(lines) == 1, lines
    assert str(bad) in lines[0], lines[0]
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert _tree(tmp_path) == before and not out.exists()


@pytest.mark.parametrize("command", ["predict", "calibrate"])
def test_missing_curve_file_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               command: str) -> None:
    missing = tmp_path / "nope.csv"
    surrogate = tmp_path / "s.json"
    TRUE_SURROGATE.save(surrogate)
    if command == "predict":
        argv = ["predict", str(missing), "--surrogate", str(surrogate), "--fraction", "0.3"]
    else:
        argv = ["calibrate", str(missing), "-o", str(tmp_path / "out.json")]
    before = _tree(tmp_path)
    code, lines = _cli(argv, capsys)
    assert code == 2 and len(lines) == 1 and str(missing) in lines[0], lines
    assert _tree(tmp_path) == before


def test_calibrate_into_an_existing_file_keeps_it_on_bad_input(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A bad CSV must not truncate or replace a surrogate that is already there (atomic writes)."""
    out = tmp_path / "s.json"
    TRUE_SURROGATE.save(out)
    kept = out.read_bytes()
    bad = tmp_path / "bad.csv"
    good = _good_csv(tmp_path)
    bad.write_text(good.read_text().replace("\n", "\nr,0.5,nan?,1,0.1,20\n", 1).replace("nan?", "1e"))
    code, lines = _cli(["calibrate", str(bad), "-o", str(out)], capsys)
    assert code == 2 and len(lines) == 1 and str(bad) in lines[0] and "column 'loss'" in lines[0], lines
    assert out.read_bytes() == kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv", "ref.csv", "s.json"]


# ------------------------------------------------------------------ a real PostgreSQL storage
def test_bad_input_with_a_postgresql_storage_creates_no_study(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    _postgres_or_skip()
    name = f"reliability-bad-{uuid.uuid4().hex[:10]}"
    surrogate = tmp_path / "surrogate.json"
    surrogate.write_text(TRUNCATED_SURROGATE)
    cases = {
        "unknown key": (_sweep_doc(tmp_path, name, storage=POSTGRES, trails=3), ["field 'trails'"]),
        "wrong type": (_sweep_doc(tmp_path, name, storage=POSTGRES, trials="two"), ["field 'trials'"]),
        "out of range": (_sweep_doc(tmp_path, name, storage=POSTGRES, pruner={"min_fraction": 0.0}),
                         ["field 'pruner.min_fraction'"]),
        "lambda and tau": (_sweep_doc(tmp_path, name, storage=POSTGRES, tau=0.2,
                                      fixed={"batch_tokens": 512, "weight_decay": 0.1}),
                           ["field 'fixed.weight_decay'"]),
        "corrupted surrogate": (_sweep_doc(tmp_path, name, storage=POSTGRES, pruner={"reference": {
            "surrogate": str(surrogate)}}), ["field 'pruner.reference'", str(surrogate)]),
        # The server answers but the database does not exist: unreachable in the sense of the issue.
        "no such database": (_sweep_doc(tmp_path, name, storage=POSTGRES.rsplit("/", 1)[0] + "/no_such_db_x"),
                             ["field 'storage'", "no_such_db_x"]),
        "closed port": (_sweep_doc(tmp_path, name, storage="postgresql://postgres@127.0.0.1:1/test"),
                        ["field 'storage'", "127.0.0.1:1"]),
    }
    for case, (doc, names) in cases.items():
        path = _write_sweep(tmp_path, doc)
        before = _tree(tmp_path)
        code, lines = _cli(["run", str(path)], capsys)
        assert code == 2, case
        assert len(lines) == 1, (case, lines)
        assert str(path) in lines[0], (case, lines[0])
        for n in names:
            assert n in lines[0], (case, n, lines[0])
        assert _tree(tmp_path) == before, case
        assert name not in _pg_study_names(), case
