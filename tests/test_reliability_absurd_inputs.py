"""Absurd inputs to `forecast` and `predict` (issue 23, item 8): controls far beyond the references are
refused in one line (forecast) or not predicted with the reason (predict), τ that cannot matter says so, an
underflowing τ = B/(ηλD) is one line, and a non-finite forecast is never written."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from collapse_hpo.hpo.cli import main
from collapse_hpo.predictors.curves import write_curves_csv
from collapse_hpo.predictors.surrogate import MAX_EXTRAPOLATION
from collapse_hpo.predictors.synthetic import synthetic_curves


@pytest.fixture(scope="module")
def surrogates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A surrogate with a scaling law (3 sizes, TPP 20-80, one τ = 0.1: b(τ) constant), as in the README, and
    one calibrated on two τ (0.05, 0.2: b(τ) a power law) without sizes."""
    d = tmp_path_factory.mktemp("absurd")
    curves = []
    for n in (2e7, 6e7, 1.8e8):
        for c in synthetic_curves(taus=(0.1,), tpps=(20.0, 80.0), seed=len(curves)):
            c.run, c.params = f"{n:.0e}_{c.run}", n
            c.loss *= (1.69 + 406.4 / n**0.34 + 410.7 / (c.tpp * n) ** 0.28) / c.final_loss
            curves.append(c)
    write_curves_csv(d / "refs.csv", curves)
    assert main(["calibrate", str(d / "refs.csv"), "-o", str(d / "law.json"), "--folds", "2"]) == 0
    write_curves_csv(d / "taus.csv", synthetic_curves(taus=(0.05, 0.2), tpps=(20.0, 80.0), seed=0))
    assert main(["calibrate", str(d / "taus.csv"), "-o", str(d / "taus.json"), "--folds", "2"]) == 0
    return d


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


FAR = {
    "params 1e300": (["--params", "1e300", "--tokens", "2e10"], "params 1e+300 is x5.56e+291 above"),
    "tokens 1": (["--params", "5e8", "--tokens", "1"], "tpp 2e-09 is x1e+10 below"),
    "tokens 1e300": (["--params", "1e9", "--tokens", "1e300"], "tpp 1e+291 is x1.25e+289 above"),
    "params 1e12": (["--params", "1e12", "--tokens", "1e300"], "params 1e+12 is x5.56e+03 above"),
    "tau 1e-300": (["--params", "5e8", "--tokens", "2e10", "--tau", "1e-300"], "tau 1e-300 is x1e+299 below"),
    "tau 1e300": (["--params", "5e8", "--tokens", "2e10", "--tau", "1e300"], "tau 1e+300 is x1e+301 above"),
}


@pytest.mark.parametrize("case", sorted(FAR))
def test_forecast_far_beyond_the_references_is_refused_and_writes_nothing(
        surrogates: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    args, phrase = FAR[case]
    files = ["--csv", str(tmp_path / "f.csv"), "--plot", str(tmp_path / "f.png")]
    code, out, err = _run(["forecast", "--surrogate", str(surrogates / "law.json"), *args, *files], capsys)
    lines = err.splitlines()
    assert code == 2 and out == "" and len(lines) == 1, (code, out, err)
    assert phrase in lines[0] and f"beyond the x{MAX_EXTRAPOLATION:g}" in lines[0], lines[0]
    assert list(tmp_path.iterdir()) == []


def test_an_underflowing_tau_is_one_line(surrogates: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["forecast", "--surrogate", str(surrogates / "law.json"), "--params", "5e8",
                           "--tokens", "2e10", "--lr", "1e-300", "--weight-decay", "1e-300", "--batch-tokens",
                           "1e300", "--csv", str(tmp_path / "f.csv")], capsys)
    lines = err.splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert "tau = B/(eta lambda D)" in lines[0] and "not a representable positive number" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_a_tau_that_cannot_change_the_forecast_says_so(surrogates: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    base = ["forecast", "--surrogate", str(surrogates / "law.json"), "--params", "5e8", "--tokens", "2e10",
            "--json"]
    results = {}
    for tau in ("0.1", "1", "0.002"):
        code, out, _err = _run([*base, "--tau", tau], capsys)
        assert code == 0
        results[tau] = json.loads(out)
    assert results["0.1"]["final_loss"] == results["1"]["final_loss"] == results["0.002"]["final_loss"]
    assert not any("does not change this forecast" in n for n in results["0.1"]["notes"])
    for tau in ("1", "0.002"):
        assert any(f"tau {tau} does not change this forecast" in n and "b(tau) is a constant" in n
                   for n in results[tau]["notes"]), results[tau]["notes"]


def test_a_non_finite_forecast_is_never_written(surrogates: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads((surrogates / "law.json").read_text())
    doc["scaling_law"]["e"] = doc["scaling_law"]["a"] = 1e308  # finite constants whose sum is inf
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(doc))
    out_csv = tmp_path / "f.csv"
    code, out, err = _run(["forecast", "--surrogate", str(path), "--params", "5e7", "--tokens", "2e9",
                           "--csv", str(out_csv), "--plot", str(tmp_path / "f.png")], capsys)
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert "not a finite positive loss" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.json"]


def test_predict_does_not_predict_a_run_far_beyond_the_references(surrogates: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    base = synthetic_curves(taus=(0.1,), tpps=(40.0,), seed=3)[0]
    runs = []
    for tau, tpp in ((1e-300, 40.0), (1e9, 40.0), (0.1, 1e9), (0.1, 1e-300), (0.1, 40.0), (0.5, 40.0)):
        c = copy.deepcopy(base)
        c.run, c.tau, c.tpp = f"tau{tau:g}_tpp{tpp:g}", tau, tpp
        runs.append(c)
    write_curves_csv(tmp_path / "runs.csv", runs)
    code, out, err = _run(["predict", str(tmp_path / "runs.csv"), "--surrogate",
                           str(surrogates / "taus.json"), "--fraction", "0.3", "--json"], capsys)
    assert code == 0, err
    rows = {r["run"]: r for r in map(json.loads, out.splitlines())}
    for run in ("tau1e-300_tpp40", "tau1e+09_tpp40", "tau0.1_tpp1e+09", "tau0.1_tpp1e-300"):
        r = rows[run]
        assert r["predicted_final_loss"] is None and r["low"] is None and r["high"] is None, r
        assert r["reason"].startswith("not predicted: ") and "beyond the x100" in r["reason"], r
        assert r["extrapolation"], r
    inside = rows["tau0.1_tpp40"]
    assert inside["predicted_final_loss"] is not None and inside["extrapolation"] is None
    # within the factor: predicted, with the extrapolation note
    assert rows["tau0.5_tpp40"]["predicted_final_loss"] is not None
    assert "tau 0.5 is x2.5 above" in rows["tau0.5_tpp40"]["extrapolation"]
