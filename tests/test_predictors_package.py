"""The predictors package stays light (no torch, ray or optuna) and the benchmark script fails clearly."""

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_importing_every_predictors_module_loads_nothing_heavy_and_nothing_else_of_ours():
    # Every module of the package (found, not listed), imported in a fresh interpreter. The source-level rule
    # (numpy, scipy, lmfit only) is tests/test_layering.py; this checks what actually gets loaded.
    code = (
        "import importlib, pkgutil, sys\n"
        "import collapse_hpo.predictors as p\n"
        "names = [m.name for m in pkgutil.iter_modules(p.__path__)]\n"
        "for n in names: importlib.import_module('collapse_hpo.predictors.' + n)\n"
        "heavy = ('torch', 'ray', 'optuna', 'triton', 'pandas', 'matplotlib', 'pydantic', 'sqlalchemy')\n"
        "ours = ('collapse_hpo.hpo', 'collapse_hpo.trainers', 'collapse_hpo.kernels')\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in heavy or m.startswith(ours)]\n"
        "print(len(names), sorted(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    count, bad = out.stdout.strip().split(" ", 1)
    assert int(count) >= 10 and bad == "[]", out.stdout


def test_benchmark_says_clearly_when_the_data_is_absent(tmp_path, capsys, monkeypatch):
    path = REPO / "studies" / "bench" / "predictor.py"
    spec = importlib.util.spec_from_file_location("bench_predictor", path)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_predictor", mod)  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    assert mod.main(["--extdata", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "external data not found" in err and "--extdata" in err
