"""studies/bench/equal_controls_envelope.py: the equal-controls envelope by peak LR (``--by-lr``)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "studies" / "bench"
sys.path.insert(0, str(BENCH))

import equal_controls_envelope as env  # noqa: E402

from collapse_hpo.predictors.curves import Curve  # noqa: E402

T = np.linspace(0.01, 1.0, 100)
BASE = 3.0 * (1.0 + 2.0 * np.exp(-5.0 * T))


def _curve(run: str, ratio: np.ndarray, peak: float) -> Curve:
    return Curve(run=run, t_hat=T, loss=BASE * ratio, lr=peak * np.minimum(1.0, T / 0.05), tau=0.1, tpp=20.0)


def _crossing(peak_better: float, peak_worse: float) -> list[Curve]:
    """'better' trails 'worse' by 1/0.95 until t̂ 0.8, then ends 5% ahead of it; a third ends far behind."""
    ahead = np.where(T < 0.8, 0.95, 1.05)
    return [_curve("better", np.ones_like(T), peak_better), _curve("worse", ahead, peak_worse),
            _curve("far", np.full_like(T, 1.3), peak_worse)]


def test_a_crossing_is_counted_on_the_side_of_the_trailing_trials_peak_lr():
    lead = -math.log(0.95)  # how far 'worse' leads 'better' over the window [0.25, 0.5]
    higher = env.envelope_by_lr(_crossing(2e-3, 1e-3), env.peak_lrs(_crossing(2e-3, 1e-3)), 0.5)
    assert np.allclose(higher[:2], lead) and all(math.isnan(v) for v in higher[2:])
    lower = env.envelope_by_lr(_crossing(1e-3, 2e-3), env.peak_lrs(_crossing(1e-3, 2e-3)), 0.5)
    assert np.allclose(lower[2:], lead) and all(math.isnan(v) for v in lower[:2])
    # before the collapse onset (t̂ = τ = 0.1) nothing is compared
    assert all(math.isnan(v) for v in env.envelope_by_lr(_crossing(2e-3, 1e-3), env.peak_lrs(
        _crossing(2e-3, 1e-3)), 0.05))


def test_a_file_holding_the_schedule_only_has_no_peak_lrs():
    assert env.peak_lrs(_crossing(1.0, 1.0)) is None
    no_lr = [Curve(run=c.run, t_hat=c.t_hat, loss=c.loss, tau=c.tau, tpp=c.tpp)
             for c in _crossing(2e-3, 1e-3)]
    assert env.peak_lrs(no_lr) is None
    assert env.peak_lrs(_crossing(2e-3, 1e-3)) == {"better": 2e-3, "worse": 1e-3, "far": 1e-3}


def test_the_by_lr_table_covers_the_sweeps_whose_files_hold_lrs():
    lines = env.by_lr_table()
    rows = [line for line in lines if line.startswith("| 99K LR s0 |")]
    assert [r.split(" | ")[1] for r in rows] == ["higher LR, all", "higher LR, best", "lower LR, all",
                                                 "lower LR, best"]
    # a cell is envelope_by_lr's value at its fraction, in %
    curves = dict(env.sweeps())["99K LR s0"]
    want = env.envelope_by_lr(curves, env.peak_lrs(curves), 0.5)[0]
    assert rows[0].split(" | ")[2 + env.FRACTIONS.index(0.5)] == f"{100 * want:.1f}"
    assert not any(line.startswith("| quickstart |") for line in lines)  # its file holds the schedule only


def test_the_bests_leaders_are_ranked_and_the_first_is_the_envelope_over_the_best():
    # 'best' trails 'a' by 1/0.95 and 'b' by 1/0.98 until t̂ 0.8 and ends ahead of both; 'c' never leads it
    curves = [_curve("best", np.ones_like(T), 1e-3), _curve("a", np.where(T < 0.8, 0.95, 1.05), 1e-3),
              _curve("b", np.where(T < 0.8, 0.98, 1.02), 1e-3), _curve("c", np.full_like(T, 1.1), 1e-3)]
    first, second, third = env.best_leads(curves, 0.5)
    assert np.isclose(first, -math.log(0.95)) and np.isclose(second, -math.log(0.98))
    assert np.isclose(third, -math.log(1.1))  # negative: the best leads it
    assert first == env.envelope(curves, 0.5)[1]
    assert all(math.isnan(v) for v in env.best_leads(curves, 0.05))  # before the collapse onset
    assert math.isnan(env.best_leads(curves[:2], 0.5)[1])  # one other trial: no second leader


def test_the_kth_table_has_three_ranks_per_sweep_and_one_table_is_asked_for(capsys):
    rows = [line for line in env.kth_table() if line.startswith("| 99K LR s0 |")]
    assert [r.split(" | ")[1] for r in rows] == ["1st", "2nd", "3rd"]
    curves = dict(env.sweeps())["99K LR s0"]
    second = env.best_leads(curves, 0.3)[1]
    assert rows[1].split(" | ")[2 + env.FRACTIONS.index(0.3)] == f"{100 * second:.1f}"
    with pytest.raises(SystemExit):
        env.main(["--kth", "--by-lr"])
    assert "ask for one" in capsys.readouterr().err
