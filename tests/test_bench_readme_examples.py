"""studies/bench/readme_examples.py --write-curves: the README's plain-Optuna example trained with no pruning
and written as a curve CSV that ``collapse-hpo replay`` reads (BENCHMARKS §36): one run per draw, its losses
at the example's reports, the LR of the example's own schedule at each, and τ from its ``step_tau``."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "studies" / "bench"
sys.path.insert(0, str(BENCH))

import readme_examples as rx  # noqa: E402

from collapse_hpo.predictors.curves import read_curves_csv  # noqa: E402


def test_write_curves_writes_the_examples_draws_as_a_replayable_curve_file(tmp_path, capsys):
    rx.main(["--write-curves", str(tmp_path), "--seeds", "1", "--trials", "2", "--eval-every", "20"])
    out = tmp_path / "curves_readme_every20_s0.csv"
    assert out.name in capsys.readouterr().out
    curves = read_curves_csv(out)
    assert [c.run for c in curves] == ["readme_s0_t0", "readme_s0_t1"]
    ns = rx.example("optuna", 20)
    steps = ns["STEPS"]
    for c in curves:
        assert c.t_hat == pytest.approx(np.arange(20, steps + 1, 20) / steps)
        assert np.all(np.isfinite(c.loss)) and c.tau > 0
        assert c.schedule.kind == "data"  # read from the LRs written: warm-up then cosine to zero
        assert c.schedule(1.0) == pytest.approx(0.0, abs=1e-9)
    # the draws are the sampler's: the same seed, the same first trial's τ as the example computes it
    import optuna

    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    lr = trial.suggest_float("lr", 1e-3, 1e-1, log=True)
    wd = trial.suggest_float("weight_decay", 1e-3, 1.0, log=True)
    assert math.isclose(curves[0].tau, ns["step_tau"](lr, wd, steps), rel_tol=1e-12)


def test_write_curves_needs_an_existing_directory(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        rx.main(["--write-curves", str(tmp_path / "missing")])
    assert stop.value.code == 2 and "missing: no such directory" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()
