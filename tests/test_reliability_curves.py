"""Issue 12, "Curve files" and "monitor", and issue 10's lr that ends at −5e-7: real CSV files through the
real command line (`collapse_hpo.hpo.cli.main`). Each case failed on main (b188769)."""

from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from collapse_hpo.hpo import cli
from collapse_hpo.hpo.replays.replay import make_sweep, simulate
from collapse_hpo.predictors.curves import Curve, read_curves_csv, write_curves_csv
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE, synthetic_curves

HEADER = "run,t_hat,loss,lr,tau,tpp\n"


def _curves(n: int = 4) -> list[Curve]:
    return synthetic_curves(taus=(0.2,), tpps=(20.0,), seeds=n, n_points=50, noise=0.002, seed=2)


def _rows(curves: list[Curve], edit: Any = None) -> str:
    """The curves as CSV text; ``edit(run_index, point_index, fields)`` may change a row's fields."""
    out = [HEADER.strip()]
    for i, c in enumerate(curves):
        for j, (t, y, lr) in enumerate(zip(c.t_hat, c.loss, c.lr)):
            f = [c.run, repr(float(t)), repr(float(y)), repr(float(lr)), repr(c.tau), repr(c.tpp)]
            if edit is not None:
                edit(i, j, f)
            out.append(",".join(f))
    return "\n".join(out) + "\n"


def _cli(argv: list[str], capsys: Any) -> tuple[int, str, list[str]]:
    code = cli.main(argv)
    cap = capsys.readouterr()
    return code, cap.out, [ln for ln in cap.err.splitlines() if ln.strip()]


@pytest.fixture
def surrogate(tmp_path: Path) -> Path:
    p = tmp_path / "s.json"
    TRUE_SURROGATE.save(p)
    return p


def test_a_bom_before_the_header_is_read(tmp_path: Path) -> None:
    p = tmp_path / "bom.csv"
    p.write_text(_rows(_curves(2)), encoding="utf-8-sig")
    assert [c.run for c in read_curves_csv(p)] == [c.run for c in _curves(2)]


def _diverge(kind: str, at: int = 30):
    def edit(i: int, j: int, f: list[str]) -> None:
        if i == 0 and j >= at:
            f[2] = kind
    return edit


@pytest.mark.parametrize("kind", ["nan", "inf", "1e400"])
def test_a_diverged_run_is_never_dropped(kind: str, tmp_path: Path, surrogate: Path, capsys: Any) -> None:
    curves = _curves()
    p = tmp_path / "div.csv"
    p.write_text(_rows(curves, _diverge(kind)))
    at = float(curves[0].t_hat[30])
    # predict: the run has a reason, no prediction, and a note says where it diverged.
    code, out, err = _cli(["predict", str(p), "--surrogate", str(surrogate), "--fraction", "0.8", "--json"],
                          capsys)
    assert code == 0
    rows = {r["run"]: r for r in map(json.loads, out.splitlines())}
    first = rows[curves[0].run]
    assert first["predicted_final_loss"] is None and "diverged" in first["reason"]
    assert "actual_final_loss" not in first
    assert any("diverged" in ln for ln in err)
    # calibrate: a reference run with it is refused in one line, nothing written.
    out_json = tmp_path / "o.json"
    code, _, err = _cli(["calibrate", str(p), "-o", str(out_json)], capsys)
    assert code == 2 and len(err) == 1 and "diverged" in err[0] and not out_json.exists()
    # replay: the trial is stopped at its divergence (pruned), whatever the pruner.
    sweep = make_sweep(read_curves_csv(p))
    from collapse_hpo.hpo.replays.peers import factory

    result = simulate(sweep, factory("none")(), order=list(range(4)), workers=2)
    assert bool(result.pruned[0]) and not result.pruned[1:].any()
    assert sweep.grid[result.stopped_at[0]] == pytest.approx(at, abs=0.03)


@pytest.mark.parametrize("value", ["-2.5", "0", "0.0"])
@pytest.mark.parametrize("command", ["predict", "calibrate", "replay", "monitor"])
def test_a_negative_or_zero_loss_is_refused_by_every_command(value: str, command: str, tmp_path: Path,
                                                             surrogate: Path, capsys: Any) -> None:
    p = tmp_path / "neg.csv"
    p.write_text(_rows(_curves(), lambda i, j, f: f.__setitem__(2, value) if i == 1 and j == 5 else None))
    argv = {"predict": ["--surrogate", str(surrogate), "--fraction", "0.3"],
            "calibrate": ["-o", str(tmp_path / "o.json")],
            "replay": ["--orders", "1", "--pruner", "none"],
            "monitor": ["--surrogate", str(surrogate)]}[command]
    code, _, err = _cli([command, str(p), *argv], capsys)
    assert code == 2 and len(err) == 1
    assert "line 57" in err[0] and "must be positive" in err[0]


def test_conflicting_rows_and_duplicate_columns_are_refused(tmp_path: Path) -> None:
    p = tmp_path / "dup.csv"
    p.write_text(HEADER + "r,0.1,3.0,1,0.2,20\nr,0.2,2.9,1,0.2,20\nr,0.1,3.5,1,0.2,20\n")
    with pytest.raises(InputError, match=r"line 4: run 'r' has a second row at t_hat=0.1 .*line 2 has 3"):
        read_curves_csv(p)
    p.write_text(HEADER + "r,0.1,3.0,1,0.2,20\nr,0.1,3.0,1,0.2,20\nr,0.2,2.9,,0.2,20\n")
    (c,) = read_curves_csv(p)  # an identical repeat is one point
    assert c.t_hat.tolist() == [0.1, 0.2]
    p.write_text("run,t_hat,loss,loss,lr,tau,tpp\nr,0.1,3,4,1,0.2,20\n")
    with pytest.raises(InputError, match="line 1: column 'loss' is named twice"):
        read_curves_csv(p)


def test_values_near_the_float_limits_give_one_line_and_no_warnings(tmp_path: Path, surrogate: Path,
                                                                    capsys: Any) -> None:
    def edit(i: int, j: int, f: list[str]) -> None:
        if j == 0:
            f[1] = "1e-300"
        if i == 2 and j == 5:
            f[2] = "1e308"
    p = tmp_path / "lim.csv"
    p.write_text(_rows(_curves(), edit))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning fails the test
        for argv in (["predict", str(p), "--surrogate", str(surrogate), "--fraction", "0.3"],
                     ["replay", str(p), "--orders", "1", "--pruner", "none"],
                     ["monitor", str(p), "--surrogate", str(surrogate)]):
            code, _, err = _cli(argv, capsys)
            assert code in (0, 1), err
            # at most: the reader's note, replay's header line, its table header and its one row
            assert len(err) <= 4 and not any("Warning" in ln for ln in err), err


def test_lr_that_ends_a_hair_below_zero_is_read_as_zero_with_a_note(tmp_path: Path, capsys: Any) -> None:
    """Issue 10: a linear decay to zero logged in float32 ends at −4.77e-7; calibrate refused the file."""
    p = tmp_path / "lr.csv"
    p.write_text(_rows(_curves(), lambda i, j, f: f.__setitem__(3, "-5e-7") if j == 49 else None))
    out = tmp_path / "s.json"
    code, _, err = _cli(["calibrate", str(p), "-o", str(out)], capsys)
    assert code == 0 and out.exists()
    notes = [ln for ln in err if "read as 0" in ln]
    assert len(notes) == 4 and "-5e-07" in notes[0]
    (c, *_) = read_curves_csv(p)
    assert c.lr[-1] == 0.0
    # Far below zero (a sign error) is still refused, naming the line.
    p.write_text(_rows(_curves(), lambda i, j, f: f.__setitem__(3, "-0.01") if j == 49 else None))
    with pytest.raises(InputError, match=r"line 51: column 'lr' is -0.01"):
        read_curves_csv(p)


def test_monitor_alarms_when_the_loss_turns_nan(tmp_path: Path, surrogate: Path, capsys: Any) -> None:
    curves = _curves(2)
    p = tmp_path / "run.csv"
    idx = int(np.searchsorted(curves[0].t_hat, 0.6))
    p.write_text(_rows(curves[:1], _diverge("nan", idx)))
    code, out, _ = _cli(["monitor", str(p), "--surrogate", str(surrogate)], capsys)
    assert code == 1 and "diverged" in out


@pytest.mark.timeout(60)
def test_monitor_follow_ends_on_a_finished_file(tmp_path: Path, surrogate: Path, capsys: Any) -> None:
    curves = _curves(2)
    p = tmp_path / "run.csv"
    # A finished run whose last rows carry the lr only (t̂ reaches 1, the loss ends at 0.594).
    late = curves[0].t_hat > 0.6
    p.write_text(_rows(curves[:1], lambda i, j, f: f.__setitem__(2, "") if late[j] else None))
    code, _, _ = _cli(["monitor", str(p), "--surrogate", str(surrogate), "--follow", "--interval", "0.05"],
                      capsys)
    assert code in (0, 1)


def test_monitor_csv_quotes_fields(tmp_path: Path, surrogate: Path, capsys: Any) -> None:
    c = _curves(1)[0]
    c.run = "lr=1e-3, seed 0"
    write_curves_csv(tmp_path / "run.csv", [c])
    out = tmp_path / "res.csv"
    _cli(["monitor", str(tmp_path / "run.csv"), "--surrogate", str(surrogate), "--csv", str(out)], capsys)
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["run", "t_hat", "residual"]
    assert all(len(r) == 3 and r[0] == "lr=1e-3, seed 0" for r in rows[1:])


def test_the_schedule_reads_a_rounding_negative_lr_as_zero() -> None:
    """The same sign rule where a Curve is built in Python (no CSV): a float32 decay to zero."""
    from collapse_hpo.predictors.schedules import Schedule

    t = np.linspace(0.0, 1.0, 11)
    lr = (1.0 - t).astype(np.float32) * np.float32(3e-3)
    lr[-1] = np.float32(-4.7683716e-07) * np.float32(3e-3)
    s = Schedule.from_data(t, lr)
    assert s(1.0) == 0.0 and s(0.5) == pytest.approx(0.5, rel=1e-6)
    with pytest.raises(InputError, match=r"must be non-negative, got -0\.0001"):
        Schedule.from_data(t, np.append(lr[:-1], -1e-4))
