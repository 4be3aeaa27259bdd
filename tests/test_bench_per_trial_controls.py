"""The per-trial-controls benchmark (studies/bench/per_trial_controls.py): its direct replay of our judge
stops every trial where the real CollapsePruner does, and its target is read as stated."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "studies" / "bench"
sys.path.insert(0, str(BENCH))

import per_trial_controls as ptc  # noqa: E402
import pruning_rule  # noqa: E402

from collapse_hpo.hpo.replays import peers  # noqa: E402
from collapse_hpo.hpo.replays.replay import Summary, random_orders, simulate  # noqa: E402


@pytest.mark.timeout(300)
def test_the_direct_replay_stops_every_trial_where_the_collapse_pruner_does():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        surrogate, _ = pruning_rule.reference(pruning_rule.DEV)
    sweep = pruning_rule.sweeps(pruning_rule.DEV, "bs_lambda")[0]  # λ fixed: τ differs, the surrogate pairs
    pruned_any = False
    for order in random_orders(sweep.n_trials, 1, seed=3):
        real = simulate(sweep, peers.collapse_factory("collapse", surrogate)(), order, workers=4)
        direct = simulate(sweep, ptc.direct_factory("collapse", surrogate)(), order, workers=4)
        assert direct.stopped_at.tolist() == real.stopped_at.tolist()
        pruned_any |= bool(real.pruned.any())
    assert pruned_any  # the comparison covered prunes, not only trials run to the end


def _summary(name: str, compute: float, best_cut: float) -> Summary:
    nan = float("nan")
    return Summary(name, "s", 20, compute, 0.0, 0.0, 0.0, best_cut, 0.5, nan, nan, nan)


def test_the_target_is_less_compute_than_every_peer_that_keeps_the_best():
    peers_ = [_summary("a", 0.30, 0.05), _summary("b", 0.50, 0.0), _summary("c", 0.45, 0.0)]
    assert ptc.verdict(_summary("ours", 0.40, 0.0), peers_) == ("c 0.450", "met")
    cheap, met = ptc.verdict(_summary("ours", 0.46, 0.0), peers_)
    assert cheap == "c 0.450" and met.startswith("MISSED (c keeps")
    assert ptc.verdict(_summary("ours", 0.10, 0.05), peers_)[1].startswith("MISSED (best cut")
