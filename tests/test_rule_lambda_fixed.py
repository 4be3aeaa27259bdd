"""The collapse rule on LR and batch-size sweeps at fixed λ, at their own report density (BENCHMARKS §29–30).

With λ fixed, τ = B/(ηλD) differs per trial: a larger LR or a smaller batch forgets the initialization sooner
and leads at t̂ 0.1 by 4–10% while ending worse. The committed 25K development sweeps
(studies/bench/artifacts/dev25k, a loss about every 1% of training) are replayed as a live sweep would judge
them, at every report, with the calibrated reference of ``pruning_rule.py`` and with the online one. Before
``decision.EARLY_PROJECTION`` and the early window's wait for faster competitors, the default cut the best of
bs_lambda_s0 in 20 and 13 of 20 orders and of lr_lambda_s1 in 20 and 19 of 20; the target is at most 1 of 20.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "studies" / "bench"
sys.path.insert(0, str(BENCH))

import pruning_rule  # noqa: E402

from collapse_hpo.hpo.replays import peers  # noqa: E402
from collapse_hpo.hpo.replays.replay import make_sweep, replay  # noqa: E402

ORDERS = 20  # pruning_rule.py's orders


@pytest.fixture(scope="module")
def reference():
    return pruning_rule.reference(pruning_rule.DEV)[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("family", "seed"), [("bs_lambda", "s0"), ("lr_lambda", "s1")])
def test_a_lambda_fixed_sweep_keeps_its_best_at_its_own_report_density(reference, family, seed):
    resampled = next(s for s in pruning_rule.sweeps(pruning_rule.DEV, family) if s.name.endswith(seed))
    sweep = make_sweep(resampled.curves, name=resampled.name)  # the median report count: ~90 per trial
    assert sweep.grid.size > 80
    calibrated, online = replay(
        sweep, [peers.factory("collapse", surrogate=reference), peers.factory("collapse-online")],
        orders=ORDERS, workers=4, seed=0,
    )[0]
    for summary in (calibrated, online):
        assert summary.best_pruned_rate <= 1 / ORDERS, (summary.pruner, summary.best_pruned_rate)
        assert summary.relative_regret <= 0.001, (summary.pruner, summary.relative_regret)
        assert summary.compute < 0.8, (summary.pruner, summary.compute)  # it still prunes
