"""The predictors package stays light (no torch, ray or optuna) and the benchmark script fails clearly."""

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_importing_predictors_never_imports_torch_ray_or_optuna():
    code = (
        "import sys\n"
        "from collapse_hpo.predictors import calibrate, collapse, curves, predict, schedules, surrogate\n"
        "from collapse_hpo.predictors import synthetic, timescale\n"
        "bad = [m for m in ('torch', 'ray', 'optuna') if m in sys.modules]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_benchmark_says_clearly_when_the_data_is_absent(tmp_path, capsys, monkeypatch):
    path = REPO / "studies" / "bench" / "predictor.py"
    spec = importlib.util.spec_from_file_location("bench_predictor", path)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_predictor", mod)  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    assert mod.main(["--extdata", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "external data not found" in err and "--extdata" in err
