"""The evidence benchmark's small size end to end: tiny runs trained and replayed; collapse and alarm."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "studies" / "bench"
sys.path.insert(0, str(BENCH))

import evidence  # noqa: E402
from evidence_train import plan  # noqa: E402

from collapse_hpo.hpo.replays import peers  # noqa: E402
from collapse_hpo.predictors.curves import read_curves_csv  # noqa: E402


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_small_evidence_end_to_end(tmp_path):
    cache, out = tmp_path / "cache", tmp_path / "out"
    rc = evidence.main(["--size", "small", "--cache", str(cache), "--out", str(out), "--orders", "2",
                        "--parts", "train,replay,collapse,alarm"])
    assert rc == 0
    res = json.loads((out / "evidence_small.json").read_text())
    runs = plan("small")
    assert res["training"]["runs_cached"] == len(runs) and res["training"]["failed"] == []
    # every trained family is an artefact with every planned run, complete
    for fam in {r.family for r in runs}:
        curves = read_curves_csv(out / f"curves_{fam}_small.csv")
        assert sorted(c.run for c in curves) == sorted(r.name for r in runs if r.family == fam)
        assert all(c.complete for c in curves)
    # replay: every pruner on both sweeps; no pruning costs 1 and loses nothing
    expected = set(peers.available_names()) - {"collapse-online"}
    for sweep in ("lr_tau_s0", "lr_lambda_s0"):
        rows = {r["pruner"]: r for r in res["replay"][sweep]}
        assert set(rows) == expected
        assert rows["none"]["compute"] == 1.0 and rows["none"]["regret"] == 0.0
        for r in rows.values():
            assert 0.0 < r["compute"] <= 1.0 and r["regret"] >= 0.0 and 0.0 <= r["best_pruned_rate"] <= 1.0
        rho = res["ordering"][sweep]["current"]
        assert all(-1.0 <= v <= 1.0 for v in rho.values() if v is not None)
    # collapse: both families measured, held-out MAE finite
    col = res["collapse"]
    assert col["collapse_tau"]["widths"] == [12, 16, 24]
    assert math.isfinite(col["collapse_tau"]["delta_mean"])
    assert math.isfinite(col["collapse_lambda"]["delta_mean"])
    taus = col["collapse_lambda"]["tau"]
    assert taus["24"] < taus["16"] < taus["12"]  # λ fixed: τ falls with width
    assert 0.0 < col["held_out"]["mae"] < 0.5
    # alarm: rules chosen on calibration runs, rates on the others
    al = res["alarm"]
    assert al["n_clean"] == 1 and al["n_fault"] == 1
    assert al["rule"]["threshold"] > 0 and al["raw_rule"]["margin"] > 0
    assert set(al["calibration"]["clean"]).isdisjoint(r["run"] for r in al["test_clean"])
    for name in ("replay_lr_tau_small.png", "collapse_small.png", "alarm_small.png", "sweeps_lr_small.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    md = (out / "evidence_small.md").read_text()
    assert "## Replay of the sweeps" in md and "## Collapse" in md and "## Bug alarm" in md
    # a second run trains nothing (cache) and gives the same replay numbers
    rc = evidence.main(["--size", "small", "--cache", str(cache), "--out", str(out), "--orders", "2",
                        "--parts", "train,replay"])
    again = json.loads((out / "evidence_small.json").read_text())
    assert again["replay"]["lr_tau_s0"] == res["replay"]["lr_tau_s0"]


def test_external_converters_read_real_curves():
    # The data lives outside the repository: ../shared/extdata, or COLLAPSE_HPO_EXTDATA. A developer's clone
    # without it skips; CI (CI set) has it, so there a missing folder is a failure, never a silent skip.
    default = Path(evidence.main.__globals__["REPO"]).parent / "shared" / "extdata"
    root = Path(os.environ.get("COLLAPSE_HPO_EXTDATA", default))
    if not (root / "mpl_luo2025").is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"external data not found at {root} (set COLLAPSE_HPO_EXTDATA)")
        pytest.skip(f"external data not found at {root}")
    curves = evidence.mpl_curves(root / "mpl_luo2025", 400)
    assert len(curves) == 4
    for c in curves:
        assert c.complete and c.t_hat[0] > 0.05 and c.schedule.kind == "data"
        assert float(c.schedule(1.0)) < float(c.schedule(0.5)) or "constant" in c.run
