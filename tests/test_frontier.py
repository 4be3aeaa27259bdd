"""`collapse-hpo replay --frontier` (hpo/replays/frontier.py): each family's knobs swept, frontiers marked
(issue 20)."""

from __future__ import annotations

import csv
import dataclasses

import pytest
from test_replay import parallel_sweep  # tests/ is on sys.path (rootdir conftest)

from collapse_hpo.hpo.cli import main
from collapse_hpo.hpo.replays import peers
from collapse_hpo.hpo.replays.frontier import FrontierPoint, coverage, mark_frontiers, pareto, settings
from collapse_hpo.hpo.replays.replay import make_sweep, replay
from collapse_hpo.hpo.rule.decision import DEFAULT_MARGIN, PruneSettings
from collapse_hpo.predictors.curves import write_curves_csv
from collapse_hpo.predictors.surrogate import ErrorBand
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE

#: Small grids, so that the end-to-end test takes seconds (the real grids are peers.FRONTIER_KNOBS).
SMALL = {
    "top-k": {"k": (1, 3), "fraction": (0.1, 0.5)},
    "sha": {"reduction_factor": (2, 4), "min_resource": (50, 250)},
    "collapse": {"margin": (0.01, 0.04)},
}


def test_pareto_marks_the_points_no_other_beats():
    # (compute, regret): b beats a (less compute, same regret); c and d tie exactly, both stay; e trades off.
    points = [(0.5, 0.01), (0.4, 0.01), (0.3, 0.02), (0.3, 0.02), (0.9, 0.0)]
    assert pareto(points) == [False, True, True, True, True]
    assert pareto([(0.2, 0.1), (0.2, 0.05)]) == [False, True]


def test_coverage_counts_peer_frontier_points_ours_matches():
    def pt(family: str, compute: float, regret: float) -> FrontierPoint:
        return FrontierPoint("s", family, f"{family}@{compute}", compute, regret, 0.0, 1)

    points = [pt("collapse", 0.3, 0.0), pt("collapse", 0.2, 0.01),
              pt("sha", 0.25, 0.005), pt("sha", 0.35, 0.0), pt("sha", 0.1, 0.02), pt("sha", 0.5, 0.0)]
    mark_frontiers(points)
    assert [p.on_regret_frontier for p in points[2:]] == [True, True, True, False]
    c = coverage(points, "collapse", "sha")
    # sha@0.35 (0 regret) is matched by collapse@0.3; sha@0.25 (0.5%) by nothing at <= 0.25 and <= 0.5%;
    # sha@0.1 by nothing at <= 0.1 compute.
    assert (c.covered, c.total) == (1, 3) and not c.hit
    assert sorted(c.missed) == ["sha@0.1", "sha@0.25"]


def test_settings_are_every_combination_of_the_family_knobs():
    grid = settings("sha", SMALL)
    assert [s.label for s in grid] == [
        "sha[reduction_factor=2,min_resource=50]", "sha[reduction_factor=2,min_resource=250]",
        "sha[reduction_factor=4,min_resource=50]", "sha[reduction_factor=4,min_resource=250]",
    ]
    assert settings("collapse", SMALL)[0].label == "collapse[margin=0.01]"
    # One home for the grids: every family the CLI knows has one; ours share one grid: the pruner's one knob
    # and, as the peers' first rung, where it starts judging; every value is a CollapsePruner setting.
    assert set(peers.FRONTIER_OURS) <= set(peers.FRONTIER_KNOBS)
    assert set(peers.FRONTIER_KNOBS["collapse"]) == {"margin", "min_fraction"}
    assert peers.FRONTIER_KNOBS["collapse-online"] == peers.FRONTIER_KNOBS["collapse"]
    assert PruneSettings().min_fraction in peers.FRONTIER_KNOBS["collapse"]["min_fraction"]
    assert DEFAULT_MARGIN in peers.FRONTIER_KNOBS["collapse"]["margin"]


def test_every_collapse_setting_of_the_grid_builds_a_pruner_with_those_settings():
    # The labels name what the replay ran: each grid point's pruner carries exactly its margin and
    # min_fraction (a knob silently dropped on the way to CollapsePruner would replay the default).
    sweep = make_sweep(parallel_sweep(4))
    grid = settings("collapse")
    assert len(grid) == len(peers.FRONTIER_KNOBS["collapse"]["margin"]) * len(
        peers.FRONTIER_KNOBS["collapse"]["min_fraction"])
    for s in (grid[0], grid[-1]):
        knobs = dict(s.knobs)
        adapter = peers.frontier_factory("collapse", s.label, knobs, surrogate=TRUE_SURROGATE)()
        rule = adapter.make_pruner(sweep).settings
        assert (rule.margin, rule.min_fraction) == (knobs["margin"], knobs["min_fraction"])
    assert grid[0].label == "collapse[margin=0,min_fraction=0.06]"


def test_cli_frontier_table_csv_plot_and_marks(tmp_path, capsys, monkeypatch):
    for family, grid in SMALL.items():
        monkeypatch.setitem(peers.FRONTIER_KNOBS, family, grid)
    curves = parallel_sweep(8)
    path, sur_path = tmp_path / "sweep.csv", tmp_path / "sur.json"
    write_curves_csv(path, curves)
    sur = dataclasses.replace(
        TRUE_SURROGATE, error_bands=[ErrorBand(f, 20, 0.0, 0.003, 0.01) for f in (0.1, 0.3, 0.6)]
    )
    sur.save(sur_path)
    out_csv, out_png = tmp_path / "f.csv", tmp_path / "f.png"
    rc = main(["replay", str(path), "--frontier", "--family", "top-k", "--family", "sha",
               "--family", "collapse", "--surrogate", str(sur_path), "--orders", "3", "--workers", "2",
               "--jobs", "1",
               "--csv", str(out_csv), "--plot", str(out_png)])
    out = capsys.readouterr()
    assert rc == 0
    assert "[10/10]" in out.err  # progress: one numbered line per setting
    rows = list(csv.DictReader(out_csv.open()))
    labels = [s.label for f in ("top-k", "sha", "collapse") for s in settings(f)]
    assert [r["setting"] for r in rows] == labels
    assert out_png.read_bytes()[:4] == b"\x89PNG"

    # The CSV's numbers are the replays' own: top-k[k=1,fraction=0.1] replayed directly, same orders.
    sweep = make_sweep(curves)
    (direct,), _ = replay(sweep, [lambda: peers.TopKAtFraction("x", fraction=0.1, k=1)], orders=3, workers=2)
    topk = next(r for r in rows if r["setting"] == "top-k[k=1,fraction=0.1]")
    assert float(topk["compute"]) == pytest.approx(direct.compute)
    assert float(topk["regret"]) == pytest.approx(direct.relative_regret)
    assert float(topk["best_cut"]) == pytest.approx(direct.best_pruned_rate)
    assert float(topk["late"]) == pytest.approx(direct.late_compute)  # spent on trials cut after t̂ 0.3

    # The marks are the Pareto fronts of the printed numbers, family by family, and the table shows them.
    for family in ("top-k", "sha", "collapse"):
        mine = [r for r in rows if r["family"] == family]
        for key, flag in (("regret", "on_regret_frontier"), ("best_cut", "on_best_cut_frontier")):
            pts = [(float(r["compute"]), float(r[key])) for r in mine]
            expected = [not any(c2 <= c and v2 <= v and (c2, v2) != (c, v) for c2, v2 in pts) for c, v in pts]
            assert [r[flag] == "True" for r in mine] == expected
    for r in rows:
        line = next(ln for ln in out.out.splitlines() if ln.startswith(r["setting"] + " "))
        marks = ("R" if r["on_regret_frontier"] == "True" else "-") + (
            "B" if r["on_best_cut_frontier"] == "True" else "-")
        assert line.split()[1] == f"{float(r['compute']):.3f}" and line.endswith(marks)
        assert line.split()[4] == f"{float(r['late']):.3f}"
    # On curves that never cross, top-k with k=1 keeps the winner at the least compute of its family.
    assert float(topk["regret"]) == 0.0 and topk["on_regret_frontier"] == "True"
    assert "collapse vs top-k:" in out.out and "collapse vs sha:" in out.out


def test_cli_frontier_bad_input_exits_2_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "sweep.csv"
    write_curves_csv(path, parallel_sweep(4))
    out_csv = tmp_path / "f.csv"
    assert main(["replay", str(path), "--frontier", "--family", "nope", "--csv", str(out_csv)]) == 2
    assert "unknown family 'nope'" in capsys.readouterr().err
    assert main(["replay", str(path), "--family", "sha"]) == 2
    assert "--family needs --frontier" in capsys.readouterr().err
    assert main(["replay", str(path), "--frontier", "--pruner", "sha"]) == 2
    assert not out_csv.exists()
    assert main(["replay", "--frontier", "--family", "list"]) == 0
    assert "top-k" in capsys.readouterr().out
