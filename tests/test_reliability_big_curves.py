"""Big curve files (issue 23, item 6): a run of many rows is resampled while it is read, so memory is bounded
by the kept points, not the file's rows; a long read shows progress; a normal run is read whole, unchanged."""

from __future__ import annotations

import math
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from collapse_hpo.predictors.curves import DOWNSAMPLE_BINS, MAX_RUN_ROWS, read_curves_csv
from collapse_hpo.predictors.errors import InputError

sys.path.insert(0, str(Path(__file__).parents[1] / "studies" / "bench"))
from big_curves import PEAK_RSS_CHILD, write_big_curves


def _rows(n: int, run: str = "a") -> list[str]:
    """``n`` rows of one run: t̂ = i/n, a loss that falls, lr with a peak at t̂ = 0.0123 and a float32-like
    decay that ends a hair below zero."""
    out = []
    for i in range(1, n + 1):
        t = i / n
        lr = 3e-3 * (1.0 - t) - 1e-10 if abs(t - 0.0123) > 0.5 / n else 3.1e-3
        out.append(f"{run},{t!r},{3.0 + t ** -0.2 - 1:.6f},{lr!r},0.1,20")
    return out


def _write(path: Path, rows: list[str]) -> Path:
    path.write_text("run,t_hat,loss,lr,tau,tpp\n" + "\n".join(rows) + "\n")
    return path


def test_a_run_of_at_most_max_run_rows_is_read_whole(tmp_path: Path) -> None:
    rows = _rows(MAX_RUN_ROWS)
    [c] = read_curves_csv(_write(tmp_path / "c.csv", rows))
    assert c.t_hat.size == MAX_RUN_ROWS and not any("resampled" in n for n in c.notes)
    expect = np.array([float(r.split(",")[2]) for r in rows])
    assert np.array_equal(c.loss, expect)


def test_a_longer_run_is_resampled_keeping_what_the_predictors_need(tmp_path: Path) -> None:
    n = 3 * MAX_RUN_ROWS
    rows = _rows(n)
    rows.append("a,1.0,,0.0,0.1,20")  # an lr-only last row, as a logger writes at the end
    shuffled = rows[:]
    random.Random(0).shuffle(shuffled)  # the kept points do not depend on the order of the rows
    [c] = read_curves_csv(_write(tmp_path / "c.csv", rows))
    [s] = read_curves_csv(_write(tmp_path / "s.csv", shuffled))
    assert np.array_equal(c.t_hat, s.t_hat) and np.array_equal(c.loss, s.loss, equal_nan=True)
    assert c.final_loss == float(rows[-2].split(",")[2])
    k = int(0.95 * n)  # the run diverges there (rows in t̂ order, as logged)
    fields = rows[k].split(",")
    rows[k] = ",".join([fields[0], fields[1], "nan", *fields[3:]])
    [c] = read_curves_csv(_write(tmp_path / "c.csv", rows))
    assert c.t_hat.size <= 2 * DOWNSAMPLE_BINS + 1
    assert any(f"{n + 1:,} rows resampled to {c.t_hat.size:,} points" in note for note in c.notes), c.notes
    # divergence at the whole run's first NaN; the points before it keep their losses
    t_div = float(fields[1])
    assert c.diverged_at == t_div and np.all(np.isnan(c.loss[c.t_hat >= t_div]))
    # the last loss before the divergence, the peak lr (one row), the lr-only end and the lr rounding rule
    before = [r for r in rows if float(r.split(",")[1]) < t_div]
    assert c.final_loss == float(before[-1].split(",")[2])
    assert c.lr is not None and c.lr.max() == 3.1e-3 and c.t_hat[-1] == 1.0
    assert c.schedule(0.0123) == pytest.approx(1.0) and c.schedule(1.0) == 0.0
    assert any("read as 0" in note for note in c.notes)
    # a point in every bin: two neighbours are less than two bins apart
    assert np.max(np.diff(c.t_hat[c.t_hat < t_div])) <= 2.0 / DOWNSAMPLE_BINS


def test_a_conflicting_repeat_of_a_kept_point_is_still_refused(tmp_path: Path) -> None:
    rows = _rows(MAX_RUN_ROWS + 10)
    rows.append(rows[-1].replace(rows[-1].split(",")[2], "8.5"))
    with pytest.raises(InputError, match=r"line 20012: run 'a' has a second row at t_hat=1 with loss 8\.5 "
                                         r"\(line 20011 has 3\)"):
        read_curves_csv(_write(tmp_path / "c.csv", rows))


PEAK_RSS_MIB = 200  # about 110 MiB after the change; the whole file read into lists took 330 MiB and more


def test_a_big_file_is_predicted_in_bounded_memory_with_progress(tmp_path: Path) -> None:
    path = tmp_path / "big.csv"
    write_big_curves(path, rows=600_000, runs=12)  # 25 MB
    refs = tmp_path / "refs.csv"
    from collapse_hpo.predictors.curves import write_curves_csv
    from collapse_hpo.predictors.synthetic import synthetic_curves

    write_curves_csv(refs, synthetic_curves(taus=(0.05, 0.1, 0.2, 0.4), tpps=(20.0, 80.0), seed=0))
    from collapse_hpo.hpo.cli import main

    assert main(["calibrate", str(refs), "-o", str(tmp_path / "s.json"), "--folds", "2"]) == 0
    code = PEAK_RSS_CHILD
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, "predict", str(path), "--surrogate",
                           str(tmp_path / "s.json"), "--fraction", "0.3", "--json"],
                          capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-2000:]
    peak_mib = int(proc.stderr.split("PEAK_KB")[-1].split()[0]) / 1024
    assert peak_mib < PEAK_RSS_MIB, (peak_mib, wall)
    rows = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 12 and all('"predicted_final_loss": null' not in r for r in rows)
    assert all(math.isfinite(float(r.split('"predicted_final_loss": ')[1].split(",")[0])) for r in rows)


def test_a_long_read_reports_its_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Progress lines come once a read has taken PROGRESS_AFTER_S; set to 0 here so that the test does not
    depend on how fast this machine reads (an idle machine read the 600K-row file above in under 2 s)."""
    from collapse_hpo.predictors import curves as curves_module

    path = tmp_path / "big.csv"
    write_big_curves(path, rows=200_000, runs=4)
    monkeypatch.setattr(curves_module, "PROGRESS_AFTER_S", 0.0)
    lines: list[str] = []
    read = curves_module.read_curves_csv(path, progress=lines.append)
    assert len(read) == 4
    assert lines and all(line.startswith(f"reading {path}: ") and " rows (" in line for line in lines), lines
