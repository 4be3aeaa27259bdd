"""The replay harness: live-sweep simulation, metrics, peers adapters, and the `collapse-hpo replay` CLI."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest

from collapse_hpo.hpo.cli import main
from collapse_hpo.hpo.replays import peers
from collapse_hpo.hpo.replays.replay import (
    Sweep,
    format_table,
    make_sweep,
    markdown_table,
    random_orders,
    replay,
    simulate,
    spearman,
    summarize,
)
from collapse_hpo.predictors.curves import Curve, write_curves_csv
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.surrogate import ErrorBand
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE, synthetic_curves


def parallel_sweep(n: int = 8, points: int = 40, seed: int = 0, tau: float = 0.2) -> list[Curve]:
    """Curves of one shape, different final losses 3 + 0.05 k (shuffled): no crossings."""
    base = synthetic_curves(taus=(tau,), tpps=(20.0,), seeds=1, n_points=points, noise=0.0)[0]
    shape = base.loss / base.loss[-1]
    rng = np.random.default_rng(seed)
    finals = 3.0 + 0.05 * rng.permutation(n)
    return [Curve(run=f"r{i}", t_hat=base.t_hat.copy(), loss=f * shape, schedule=base.schedule, tau=tau,
                  tpp=20.0) for i, f in enumerate(finals)]


class Recorder:
    """A pruner that stops the trials in ``kill`` at their first report and records the calls."""

    name = "recorder"

    def __init__(self, kill: set[int]) -> None:
        self.kill = kill

    def new_sweep(self, sweep: Sweep, seed: int) -> None:
        self.events: list[tuple[str, int]] = []
        self.live: set[int] = set()
        self.max_live = 0

    def start(self, trial: int) -> None:
        self.events.append(("start", trial))
        self.live.add(trial)
        self.max_live = max(self.max_live, len(self.live))

    def report(self, trial: int, index: int) -> bool:
        return trial in self.kill

    def finish(self, trial: int, pruned: bool) -> None:
        self.events.append(("pruned" if pruned else "done", trial))
        self.live.discard(trial)


def test_make_sweep_rejects_bad_input():
    curves = parallel_sweep(3)
    with pytest.raises(InputError, match="at least 2 runs"):
        make_sweep(curves[:1])
    with pytest.raises(InputError, match="unique"):
        make_sweep([curves[0], dataclasses.replace(curves[1], run="r0")])
    short = curves[0].truncated(0.5)
    with pytest.raises(InputError, match="complete curves"):
        make_sweep([short, curves[1]], source="x.csv")
    many = parallel_sweep(8)
    with pytest.raises(InputError, match=r"x.csv: 7 of 8 runs stop before the end: "
                                         r"'r1' \(ends at t_hat=0.49.*and 2 more; .*remove those runs' rows"):
        make_sweep([many[0]] + [c.truncated(0.5) for c in many[1:]], source="x.csv")


def test_make_sweep_resamples_different_grids():
    a, b = parallel_sweep(2, points=40)
    t = np.linspace(0.05, 1.0, 25)
    b = Curve(run="b", t_hat=t, loss=np.interp(t, b.t_hat, b.loss))
    sw = make_sweep([a, b], n_reports=30)
    assert sw.grid.size == 30 and sw.losses.shape == (2, 30)
    assert sw.grid[0] == pytest.approx(max(a.t_hat[0], 0.05)) and sw.grid[-1] == pytest.approx(1.0)
    assert sw.finals[1] == pytest.approx(b.loss[-1])


def per_step_sweep(n: int = 4) -> list[Curve]:
    """Curves logged at each of 2,000 steps (closer than the replay's 1/1000 of training), one shared grid."""
    t = np.arange(1, 2001) / 2000
    shape = 1.0 + 2.0 * np.exp(-8.0 * t)
    return [Curve(run=f"s{i}", t_hat=t, loss=(3.0 + 0.1 * i) * shape) for i in range(n)]


def test_make_sweep_leaves_out_report_points_closer_than_a_step_and_keeps_the_reported_ones():
    curves = per_step_sweep()
    sw = make_sweep(curves)
    steps = sw.steps
    assert np.all(np.diff(steps) > 0), "every kept report is at least one integer step past the one before"
    assert sw.grid.size + sw.merged == 2000 and 999 <= sw.grid.size <= 1001, "one report per step is kept"
    assert sw.grid[-1] == 1.0 and sw.finals[0] == pytest.approx(curves[0].loss[-1])
    assert np.all(np.isin(sw.grid, curves[0].t_hat)), "the kept points are the reported ones, not resampled"
    i = np.searchsorted(curves[1].t_hat, sw.grid[7])
    assert sw.losses[1, 7] == curves[1].loss[i]
    r = simulate(sw, peers.NoPruning(), list(range(4)), workers=2)
    assert r.compute == pytest.approx(1.0)
    # A grid that does not need it is left as reported.
    assert make_sweep(parallel_sweep(3)).merged == 0


def test_make_sweep_keeps_the_last_report_when_it_shares_a_step_with_the_one_before():
    t = np.array([0.1, 0.2, 0.3, 0.9996, 1.0])
    curves = [Curve(run=f"r{i}", t_hat=t, loss=np.array([4.0, 3.5, 3.2, 3.0, 2.9 + 0.1 * i]))
              for i in range(2)]
    sw = make_sweep(curves)
    assert list(sw.grid) == [0.1, 0.2, 0.3, 1.0] and sw.merged == 1
    assert list(sw.losses[1]) == [4.0, 3.5, 3.2, 3.0]


def test_no_pruning_costs_everything_and_has_no_regret():
    sw = make_sweep(parallel_sweep(6))
    r = simulate(sw, peers.NoPruning(), list(range(6)), workers=3)
    assert r.compute == pytest.approx(1.0)
    assert r.regret == 0.0 and not r.best_pruned and not r.pruned.any()


def test_metrics_of_a_known_pruning_pattern():
    sw = make_sweep(parallel_sweep(6))
    best = sw.best
    keep = (best + 1) % 6  # keep one trial that is not the best
    rec = Recorder(kill=set(range(6)) - {keep})
    r = simulate(sw, rec, random_orders(6, 1, seed=3)[0], workers=2)
    first = sw.grid[0] / sw.grid[-1]
    assert r.compute == pytest.approx((1.0 + 5 * first) / 6)
    assert r.best_pruned
    assert r.regret == pytest.approx(sw.finals[keep] - sw.finals[best])
    assert r.relative_regret == pytest.approx(r.regret / sw.finals[best])
    assert r.decision_fractions == pytest.approx([first] * 5)


class StopAt:
    """A pruner that stops each trial of ``stops`` at its first report at or past its t̂ there."""

    name = "stop-at"

    def __init__(self, stops: dict[int, float]) -> None:
        self.stops = stops

    def new_sweep(self, sweep: Sweep, seed: int) -> None:
        self.grid = sweep.grid / sweep.grid[-1]

    def start(self, trial: int) -> None:
        pass

    def report(self, trial: int, index: int) -> bool:
        return trial in self.stops and self.grid[index] >= self.stops[trial] - 1e-12

    def finish(self, trial: int, pruned: bool) -> None:
        pass


def test_late_compute_counts_only_the_trials_pruned_after_three_tenths():
    # Trial 0 cut at t̂ 0.6 and trial 1 at 0.75 count (1.35 of a trial's tokens, over 6 trials); trial 2, cut
    # at 0.2, does not; nor do the completed trials.
    sw = make_sweep(parallel_sweep(6, points=20))
    grid = sw.grid / sw.grid[-1]
    r = simulate(sw, StopAt({0: 0.6, 1: 0.75, 2: 0.2}), list(range(6)), workers=2)
    at = {k: float(grid[np.searchsorted(grid, f - 1e-12)]) for k, f in {0: 0.6, 1: 0.75, 2: 0.2}.items()}
    assert at[0] > 0.3 and at[1] > 0.3 and at[2] < 0.3
    assert r.late_compute == pytest.approx((at[0] + at[1]) / 6)
    assert r.compute == pytest.approx((3 + at[0] + at[1] + at[2]) / 6)
    s = summarize(sw, [r, simulate(sw, peers.NoPruning(), list(range(6)), workers=2)])
    assert s.late_compute == pytest.approx(r.late_compute / 2)
    assert "late" in format_table([s]).splitlines()[0]
    assert f"| {s.late_compute:.3f} |" in markdown_table([s])


@pytest.mark.parametrize("workers", [1, 3])
def test_workers_bound_concurrency_and_follow_the_order(workers):
    sw = make_sweep(parallel_sweep(7))
    order = random_orders(7, 1, seed=1)[0]
    rec = Recorder(kill=set())
    simulate(sw, rec, order, workers=workers)
    assert [t for e, t in rec.events if e == "start"] == order
    assert rec.max_live == workers
    if workers == 1:  # sequential: every trial ends before the next starts
        assert rec.events == [ev for t in order for ev in (("start", t), ("done", t))]


def test_top_k_keeps_only_the_best_seen_at_the_fraction():
    sw = make_sweep(parallel_sweep(8))
    order = list(np.argsort(sw.finals)[::-1])  # worst first: every new trial is the best so far
    r = simulate(sw, peers.TopKAtFraction("t", fraction=0.1, k=2), order, workers=1)
    assert not r.pruned.any()
    r = simulate(sw, peers.TopKAtFraction("t", fraction=0.1, k=2), order[::-1], workers=1)  # best first
    assert r.pruned.sum() == 6 and not r.best_pruned  # only the first two continue
    assert set(r.decision_fractions) == {float(sw.grid[np.flatnonzero(sw.grid >= 0.1)[0]])}


def test_optuna_median_pruner_in_a_real_study_saves_compute_without_losing_the_best():
    sw = make_sweep(parallel_sweep(10))
    summaries, details = replay(sw, [peers.PEERS["median"], peers.PEERS["none"]], orders=4, workers=2)
    med, none = summaries
    assert none.compute == pytest.approx(1.0) and none.pruned_rate == 0.0
    assert med.compute < 0.9 and med.pruned_rate > 0.2
    assert med.best_pruned_rate == 0.0 and med.regret == 0.0  # no crossings: the median never cuts the best
    assert len(details["median"]) == 4


def test_conformal_pruner_with_defaults_never_calibrates_on_a_small_sweep():
    sw = make_sweep(parallel_sweep(8))
    (s,), _ = replay(sw, [peers.PEERS["conformal"]], orders=2)
    assert s.pruned_rate == 0.0  # 60 calibration trials needed, 8 available
    # the same peer does prune once its 60 calibration trials have finished (the adapter is not inert)
    (big,), _ = replay(make_sweep(parallel_sweep(70)), [peers.PEERS["conformal"]], orders=1)
    assert big.pruned_rate > 0.0 and big.compute < 1.0


def test_collapse_pruner_on_a_collapsed_sweep_keeps_the_best():
    sur = dataclasses.replace(
        TRUE_SURROGATE, error_bands=[ErrorBand(f, 20, 0.0, 0.003, 0.01) for f in (0.1, 0.3, 0.6)]
    )
    # τ 0.05: the collapse onset (decision.collapse_onset) is before min_fraction, so the loss ratio judges
    # from the first judgement on. The final losses are 1.7% apart: a 1% margin separates neighbours (the
    # default 4% keeps them).
    sw = make_sweep(parallel_sweep(8, tau=0.05))
    (s,), _ = replay(sw, [peers.collapse_factory("collapse", sur, margin=0.01)], orders=3, workers=2)
    assert s.best_pruned_rate == 0.0 and s.regret == 0.0
    assert s.compute < 0.5
    (wide,), _ = replay(sw, [peers.factory("collapse", surrogate=sur)], orders=3, workers=2)
    assert wide.best_pruned_rate == 0.0 and s.compute < wide.compute
    assert 0.1 <= s.decision_median < 0.3


@pytest.mark.slow
def test_ray_schedulers_driven_without_a_cluster():
    sw = make_sweep(parallel_sweep(12))
    pair = [peers.PEERS["asha"], peers.PEERS["median-stopping-tuned"]]
    summaries, _ = replay(sw, pair, orders=2, workers=3)
    asha, msr = summaries
    assert asha.compute < 0.7 and asha.pruned_rate > 0.3
    assert msr.pruned_rate > 0 and msr.decision_p10 >= 0.25  # grace period 250/1000


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 2], [1, 2]))
    assert spearman([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)


def test_cli_replay_writes_table_csv_and_plot(tmp_path, capsys):
    path = tmp_path / "sweep.csv"
    write_curves_csv(path, parallel_sweep(6))
    out_csv, out_png = tmp_path / "s.csv", tmp_path / "p.png"
    rc = main(["replay", str(path), "--pruner", "none", "--pruner", "top-k-10", "--orders", "3",
               "--csv", str(out_csv), "--plot", str(out_png)])
    assert rc == 0
    table = capsys.readouterr().out
    assert "top-k-10" in table and "none" in table
    assert out_csv.read_text().splitlines()[0].startswith("pruner,sweep,orders,compute")
    assert out_png.read_bytes()[:4] == b"\x89PNG"


def test_cli_replay_of_per_step_logs_runs_and_says_what_it_left_out(tmp_path, capsys):
    path = tmp_path / "steps.csv"
    write_curves_csv(path, per_step_sweep())
    assert main(["replay", str(path), "--pruner", "none", "--orders", "2"]) == 0
    err = capsys.readouterr().err
    assert "1001 reports each (999 points closer than 1/1000 of training to the one before left out)" in err


def test_cli_replay_bad_input_exits_2_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "sweep.csv"
    write_curves_csv(path, parallel_sweep(3))
    out_csv = tmp_path / "s.csv"
    assert main(["replay", str(path), "--pruner", "nope", "--csv", str(out_csv)]) == 2
    assert "unknown pruner 'nope'" in capsys.readouterr().err
    assert not out_csv.exists()
    write_curves_csv(path, [c.truncated(0.5) for c in parallel_sweep(3)])
    assert main(["replay", str(path), "--pruner", "none", "--csv", str(out_csv)]) == 2
    assert "complete curves" in capsys.readouterr().err
    assert not out_csv.exists()


def test_cli_replay_skips_a_peer_whose_library_is_absent(tmp_path, capsys, monkeypatch):
    """surestop is a dev extra: on a plain install the conformal peers are skipped with a note."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "surestop" else real(name, *a))
    path = tmp_path / "sweep.csv"
    write_curves_csv(path, parallel_sweep(4))
    rc = main(["replay", str(path), "--pruner", "none", "--pruner", "conformal", "--orders", "1"])
    out = capsys.readouterr()
    assert rc == 0
    assert "conformal skipped: needs the 'surestop' package" in out.err
    assert "none" in out.out and "conformal" not in out.out


def test_cli_replay_with_every_chosen_pruner_skipped_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    """Every pruner asked for skipped (collapse without a reference, a peer without its library): one line,
    exit 2, instead of a process pool of size 0's traceback."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "surestop" else real(name, *a))
    path = tmp_path / "sweep.csv"
    write_curves_csv(path, parallel_sweep(4))
    for pruners in (["collapse"], ["conformal", "collapse"]):
        argv = ["replay", str(path), "--orders", "2", "--jobs", "2"]
        assert main(argv + [a for p in pruners for a in ("--pruner", p)]) == 2
        err = capsys.readouterr().err
        assert "no pruner left to replay (see the notes above)" in err and "Traceback" not in err
        assert "collapse skipped: give --surrogate or --reference" in err
    with pytest.raises(InputError, match="no pruners to replay"):
        replay(make_sweep(parallel_sweep(4)), [], orders=2, jobs=2)


def test_cli_replay_says_a_missing_file_before_any_note_on_the_pruners(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "surestop" else real(name, *a))
    assert main(["replay", str(tmp_path / "missing.csv"), "--orders", "2"]) == 2
    err = capsys.readouterr().err
    assert "no such curve file" in err and "skipped" not in err


def test_cli_replay_prints_the_header_before_the_rows_and_no_experimental_warning(tmp_path, capsys):
    path = tmp_path / "sweep.csv"
    write_curves_csv(path, parallel_sweep(4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Optuna's ExperimentalWarning for PatientPruner would raise here
        assert main(["replay", str(path), "--pruner", "patient", "--pruner", "patient-tuned", "--orders", "2",
                     "--jobs", "1"]) == 0
    out = capsys.readouterr()
    rows = out.err.splitlines()
    header = next(i for i, line in enumerate(rows) if line.startswith("pruner ") and "compute" in line)
    assert rows[header + 1].startswith("patient ") and rows[header + 2].startswith("patient-tuned")
    assert out.out.splitlines()[0] == rows[header]  # the same header as the table's
