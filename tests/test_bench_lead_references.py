"""studies/bench/lead_references.py: references drawn at random, their winners' lead, the table."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "studies" / "bench"
sys.path.insert(0, str(BENCH))

import lead_references as lr  # noqa: E402

from collapse_hpo.hpo.replays import peers  # noqa: E402
from collapse_hpo.hpo.replays.replay import replay  # noqa: E402
from collapse_hpo.predictors.calibrate import LEAD_FRACTIONS, calibrate, lead_bands_of  # noqa: E402


def test_subsets_are_drawn_without_replacement_in_order_and_the_whole_pool_once():
    got = list(lr.subsets(48, [20, 40, 60], draws=3, seed=23))
    assert [(size, draw) for size, draw, _ in got] == [(20, 0), (20, 1), (20, 2), (40, 0), (40, 1), (40, 2),
                                                      (48, 0)]
    for size, _, idx in got:
        assert len(idx) == len(set(idx.tolist())) == size and idx.min() >= 0 and idx.max() < 48
    assert got[-1][2].tolist() == list(range(48))
    again = list(lr.subsets(48, [20, 40, 60], draws=3, seed=23))
    assert all(np.array_equal(a[2], b[2]) for a, b in zip(got, again, strict=True))
    assert not np.array_equal(got[0][2], next(lr.subsets(48, [20], draws=1, seed=24))[2])
    # the whole pool takes nothing from the generator: the draws after it are those of a run without it
    tail = [idx for _, _, idx in lr.subsets(48, [60, 20], draws=2, seed=23)][1:]
    assert all(np.array_equal(a, b[2]) for a, b in zip(tail, got[:2], strict=True))


@pytest.fixture(scope="module")
def reference():
    pool, sweep = lr.load_pool("random_s1->random_s0")
    idx = next(lr.subsets(len(pool), [40], draws=1, seed=23))[2]
    return [pool[i] for i in idx], sweep


def test_more_best_runs_never_lower_the_lead_and_judge_replays_with_that_lead(reference):
    curves, sweep = reference
    three = {b.fraction: b.scale for b in lead_bands_of(curves, LEAD_FRACTIONS, 0.5, top_min=3)}
    five = {b.fraction: b.scale for b in lead_bands_of(curves, LEAD_FRACTIONS, 0.5, top_min=5)}
    assert three.keys() == five.keys() and all(five[p] >= three[p] for p in three)
    got = lr.judge(sweep, curves, [3, 5], orders=2, jobs=1, pool="p", size=40, draw=0)
    assert [(o.pool, o.size, o.draw, o.top_min, o.orders) for o in got] == [("p", 40, 0, 3, 2),
                                                                              ("p", 40, 0, 5, 2)]
    # each the same as a replay with the calibrated surrogate, its lead read off that many best runs
    from dataclasses import replace

    surrogate = calibrate(curves).surrogate
    for outcome, k in zip(got, (3, 5), strict=True):
        bands = lead_bands_of(curves, LEAD_FRACTIONS, surrogate.align_start, top_min=k)
        ref = replace(surrogate, lead_bands=bands)
        summaries, results = replay(sweep, [peers.factory("collapse", surrogate=ref)], orders=2, workers=4)
        runs = next(iter(results.values()))
        assert outcome.compute == pytest.approx(summaries[0].compute, abs=1e-12)
        assert outcome.orders_cut == sum(r.best_pruned for r in runs)
        assert outcome.max_regret == pytest.approx(max(r.relative_regret for r in runs), abs=1e-15)
    assert got[0].compute != got[1].compute  # the two leads differ here, and so do their replays


def test_the_table_counts_the_references_that_cut_the_best():
    rows = [lr.Outcome("a->b", 40, d, 5, c, 10, cut, reg)
            for d, (c, cut, reg) in enumerate([(0.2, 0, 0.0), (0.3, 6, 0.0668), (0.4, 0, 0.0)])]
    rows.append(lr.Outcome("a->b", 40, 0, 3, 0.1, 10, 0, 0.0))
    lines = lr.table(rows).splitlines()
    assert len(lines) == 4
    assert lines[2] == "| a->b | 40 | 5 | 1 of 3 (6/10 at 6.68%) | 0.300 (0.200–0.400) |"
    assert lines[3] == "| a->b | 40 | 3 | 0 of 1 | 0.100 (0.100–0.100) |"


def test_bad_arguments_stop_before_any_work(capsys):
    for argv in (["--sizes", "1"], ["--top-min", "0"], ["--draws", "0"], ["--pool", "nowhere"],
                 ["--min-runs", "1"], ["--online", "--workers", "0"]):
        with pytest.raises(SystemExit) as stop:
            lr.main(argv)
        assert stop.value.code == 2, argv
        assert "usage" in capsys.readouterr().err, argv


def test_a_list_argument_that_is_not_numbers_is_a_usage_error_not_a_traceback(capsys):
    for argv in (["--sizes", "40,x"], ["--top-min", "five"], ["--online", "--workers", "4,"]):
        with pytest.raises(SystemExit) as stop:
            lr.main(argv)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert "usage" in err and "expected whole numbers separated by commas" in err


def test_the_lead_gate_is_set_for_the_block_and_restored():
    rule = lr.decision.LEAD_MIN_RUNS
    with lr.lead_gate(None):
        assert rule == lr.decision.LEAD_MIN_RUNS
    with lr.lead_gate(20):
        assert lr.decision.LEAD_MIN_RUNS == 20
    assert rule == lr.decision.LEAD_MIN_RUNS
    with pytest.raises(RuntimeError), lr.lead_gate(7):
        raise RuntimeError("a replay failed")
    assert rule == lr.decision.LEAD_MIN_RUNS


def test_a_reference_under_the_rules_gate_has_its_lead_used_only_below_a_moved_gate():
    pool, sweep = lr.load_pool("random_s1->random_s0")
    idx = list(lr.subsets(len(pool), [20], draws=4, seed=31))[3][2]  # §42: its lead cuts the best at gate 20
    curves = [pool[i] for i in idx]
    assert len(curves) < lr.decision.LEAD_MIN_RUNS
    ruled = lr.judge(sweep, curves, [5], orders=2, jobs=1, pool="p", size=20, draw=0)[0]
    with lr.lead_gate(20):
        moved = lr.judge(sweep, curves, [5], orders=2, jobs=2, pool="p", size=20, draw=0)[0]
    # the lead now decides some comparisons the paired predictions decided (in the forked workers too)
    assert moved.compute != ruled.compute
    assert moved.orders_cut > ruled.orders_cut == 0  # §42: this 20-run reference's lead cuts random_s0's best
    # and a gate above the reference's size is the rule's own outcome
    with lr.lead_gate(21):
        above = lr.judge(sweep, curves, [5], orders=2, jobs=1, pool="p", size=20, draw=0)[0]
    assert above == ruled


def test_the_online_table_has_a_row_per_sweep_and_workers():
    rows = [lr.OnlineOutcome("surestop_all", 4, 40, 0.3241, 10, 2, 0.000043),
            lr.OnlineOutcome("surestop_all", 8, 20, 0.309, 10, 0, 0.0)]
    lines = lr.online_table(rows).splitlines()
    assert lines[2] == "| surestop_all | 4 | 40 | 0.324 | 2 of 10 (0.004%) |"
    assert lines[3] == "| surestop_all | 8 | 20 | 0.309 | 0 of 10 |"
    later, earlier, every = lr.online_sweeps()
    assert (later.name, earlier.name, every.name) == ("surestop_later", "surestop_earlier", "surestop_all")
    # the two halves split the 197 runs by night, none in both, the earlier nights holding about 45%
    assert every.n_trials == 197 and later.n_trials + earlier.n_trials == 197
    assert not {c.run for c in later.curves} & {c.run for c in earlier.curves}
    assert max(c.meta["night_seed"] for c in earlier.curves) < min(c.meta["night_seed"] for c in later.curves)
    assert 0.35 < earlier.n_trials / 197 < 0.55
