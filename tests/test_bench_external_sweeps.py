"""studies/bench/external_sweeps.py: third-party sweeps written as curve CSVs that ``collapse-hpo replay``
reads, outside the repository only (the data must not be copied into it). Synthetic files in the sources'
formats stand in for ../shared/extdata."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parents[1] / "studies" / "bench"
sys.path.insert(0, str(BENCH))

import external_sweeps as xs  # noqa: E402

from collapse_hpo.predictors.curves import read_curves_csv  # noqa: E402


def _run(sweep: str, extdata: Path, out: Path) -> int:
    return xs.main(["--sweep", sweep, "--extdata", str(extdata), "--out", str(out)])


def _gemstones(extdata: Path) -> None:
    folder = extdata / "gemstones_mcleish2025"
    folder.mkdir(parents=True)
    rows = []
    for name, params, scale in (("small", 1e8, 1.1), ("big", 4e8, 1.0)):
        for k in range(1, 6):
            rows.append({"run_name": name, "params_active_precise": params, "step": 477 * k,
                         "tokens": 2e9 * k, "final_loss": scale * (2.5 + 2.0 / k)})
    text = "\n".join(json.dumps(r) for r in reversed(rows)) + "\n"  # any order: sorted by step when read
    (folder / xs.GEMSTONES["gemstones-hot"]).write_text(text)


def test_a_gemstones_file_becomes_one_curve_per_shape_with_its_tokens_per_parameter(tmp_path, capsys):
    _gemstones(tmp_path / "extdata")
    out = tmp_path / "hot.csv"
    assert _run("gemstones-hot", tmp_path / "extdata", out) == 0
    curves = {c.run: c for c in read_curves_csv(out)}
    assert set(curves) == {"small", "big"}
    big = curves["big"]
    np.testing.assert_allclose(big.t_hat, [0.2, 0.4, 0.6, 0.8, 1.0])
    np.testing.assert_allclose(big.loss, [2.5 + 2.0 / k for k in range(1, 6)])
    assert big.tpp == 1e10 / 4e8 and big.tau is None
    assert "best big 2.9000" in capsys.readouterr().out


def test_it_refuses_an_output_inside_the_repository_and_a_missing_source(tmp_path, capsys):
    _gemstones(tmp_path / "extdata")
    inside = BENCH / "artifacts" / "gemstones_copy.csv"
    assert _run("gemstones-hot", tmp_path / "extdata", inside) == 2
    assert not inside.exists() and "inside the repository" in capsys.readouterr().err
    assert _run("qiu-mlp-schedules", tmp_path / "extdata", tmp_path / "q.csv") == 2
    assert "not found" in capsys.readouterr().err and not (tmp_path / "q.csv").exists()


def test_the_qiu_schedule_group_keeps_each_runs_logged_schedule(tmp_path):
    root = tmp_path / "extdata" / "qiu_supercollapse"
    root.mkdir(parents=True)
    width, evaluations = xs.QIU_GROUP
    runs = ["run_id,D,n_points,schedule,decay_frac,tpp_final",
            f"r_001,{width},{evaluations},linear,0.2,95.3", f"r_002,{width},{evaluations},const,1.0,95.3",
            f"r_003,{width},{evaluations + 1},const,1.0,95.3"]  # another group: left out
    (root / "mlp_schedules_runs.csv").write_text("\n".join(runs) + "\n")
    lines = ["run_id,step,compute,test_loss,lr"]
    for run in ("r_001", "r_002", "r_003"):
        for step in range(11):
            lr = 1e-3 if run != "r_001" or step <= 8 else 1e-3 * (10 - step) / 2
            lines.append(f"{run},{step},{step * 0.5},{0.05 / (1 + step)},{lr}")
    with gzip.open(root / "mlp_schedules_curves.csv.gz", "wt") as fh:
        fh.write("\n".join(lines) + "\n")
    out = tmp_path / "q.csv"
    assert _run("qiu-mlp-schedules", tmp_path / "extdata", out) == 0
    curves = {c.run: c for c in read_curves_csv(out)}
    assert set(curves) == {"linear_decay0.2_001", "const_decay1_002"}
    wsd = curves["linear_decay0.2_001"]
    np.testing.assert_allclose(wsd.t_hat, np.arange(1, 11) / 10)  # compute 0 dropped; t̂ = compute / last
    assert wsd.schedule(0.5) == 1.0 and wsd.schedule(1.0) == 0.0
    assert curves["const_decay1_002"].schedule(1.0) == 1.0
