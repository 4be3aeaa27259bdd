"""studies/bench/compute_spend.py: a replay's compute split by how each trial ended, and the floor."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "studies" / "bench"
sys.path.insert(0, str(BENCH))

import compute_spend as cs  # noqa: E402

from collapse_hpo.hpo.replays import peers  # noqa: E402
from collapse_hpo.hpo.replays.replay import make_sweep, random_orders, simulate  # noqa: E402
from collapse_hpo.predictors.curves import read_curves_csv  # noqa: E402
from collapse_hpo.predictors.prior import load_prior  # noqa: E402

QUICKSTART = BENCH / "artifacts" / "curves_quickstart.csv"


@pytest.fixture(scope="module")
def sweep():
    return make_sweep(read_curves_csv(QUICKSTART), n_reports=50, name="quickstart")


@pytest.mark.parametrize("pruner", ["collapse", "collapse-online"])
def test_the_parts_add_up_to_the_replays_compute(sweep, pruner):
    surrogate = load_prior("builtin")[0] if pruner == "collapse" else None
    got = cs.spend(sweep, pruner, surrogate, orders=2)
    results = [simulate(sweep, peers.factory(pruner, surrogate=surrogate)(), o, workers=4)
               for o in random_orders(sweep.n_trials, 2, seed=0)]
    assert got.total == pytest.approx(np.mean([r.compute for r in results]), abs=1e-12)
    assert got.total == pytest.approx(got.early + got.later + got.completed_prior + got.completed_fit)
    assert got.n_early + got.n_later + got.n_prior + got.n_fit == pytest.approx(sweep.n_trials)
    pruned = np.mean([r.pruned.sum() for r in results])
    assert got.n_early + got.n_later == pytest.approx(pruned) and pruned > 0
    assert got.best_cut == sum(r.best_pruned for r in results)
    # the floor: the first judgements' prunes and the prior phase's completions as they were, the best to
    # the end, every other trial pruned at t̂ 0.1 (here every completion is the prior's with collapse-online,
    # none with collapse)
    w = np.asarray(sweep.weights, dtype=float) / np.sum(sweep.weights)
    floors = []
    for r in results:
        reached = sweep.grid[r.stopped_at] / sweep.grid[-1]
        kept = (r.pruned & (reached <= cs.EARLY_END + 1e-9)) | (~r.pruned & (pruner == "collapse-online"))
        kept[sweep.best] = True
        floors.append(np.sum(w * np.where(kept, reached, cs.MIN_FRACTION)))
    assert got.floor == pytest.approx(np.mean(floors), abs=1e-12) and got.floor < got.total
    if pruner == "collapse-online":  # 12 trials never reach the 13 a fit needs: the prior serves throughout
        assert got.completed_fit == 0 and got.completed_prior > 0 and not got.fit_gaps
    else:  # a reference before the sweep: no prior phase, every completed trial's gap counted
        assert got.completed_prior == 0 and len(got.fit_gaps) == 2 * got.n_fit
        assert min(got.fit_gaps) == 0.0  # the best completes


def test_the_table_has_a_row_per_replay(sweep):
    row = cs.spend(sweep, "collapse", load_prior("builtin")[0], orders=1)
    table = cs.markdown([row, row]).splitlines()
    assert len(table) == 4 and table[2].startswith("| quickstart | collapse | ")
    assert f"{row.total:.3f}" in table[2] and f"{row.floor:.3f}" in table[2]
