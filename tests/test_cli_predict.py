"""`collapse-hpo calibrate` and `collapse-hpo predict`, run in-process: exit codes, output, files, errors."""

import json

import numpy as np
import pytest

from collapse_hpo.hpo.cli import main
from collapse_hpo.predictors.curves import write_curves_csv
from collapse_hpo.predictors.surrogate import Surrogate
from collapse_hpo.predictors.synthetic import synthetic_curves


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    ref = synthetic_curves(taus=(0.05, 0.2), tpps=(20.0, 80.0), noise=0.001, seed=5)
    new = synthetic_curves(taus=(0.1,), tpps=(40.0,), noise=0.001, seed=6, seeds=2)
    write_curves_csv(d / "ref.csv", ref)
    write_curves_csv(d / "new.csv", new)
    partial = [c.truncated(0.3) for c in new]
    for c in partial:  # lr-only rows for the rest of the run: the schedule is known in advance
        t = np.linspace(0.31, 1.0, 20)
        c.t_hat = np.r_[c.t_hat, t]
        c.loss = np.r_[c.loss, np.full(t.size, np.nan)]
        c.lr = np.r_[c.lr, c.schedule(t)]
    write_curves_csv(d / "partial.csv", partial)
    code = main(["calibrate", str(d / "ref.csv"), "-o", str(d / "s.json"), "--free-m", "no", "--folds", "2"])
    assert code == 0
    return d, new


def test_calibrate_writes_surrogate_and_prints_table(files, capsys):
    d, _ = files
    s = Surrogate.load(d / "s.json")
    assert s.tau_law == "power" and s.error_bands
    code = main(["calibrate", str(d / "ref.csv"), "-o", str(d / "s2.json"), "--predict-weight", "0",
                 "--folds", "2", "--free-m", "yes"])
    out = capsys.readouterr().out
    assert code == 0 and "mean MAE" in out and "tau0.05_tpp20_s0" in out and "wrote" in out
    # 4 reference runs: their winners' lead is printed, and said not to be used
    assert "winners' lead: " in out and "over 4 runs: not used" in out
    s2 = Surrogate.load(d / "s2.json")
    assert s2.info["predict_weight"] == 0.0 and s2.info["free_m"] is True


def test_predict_json_on_complete_curves_has_actual_and_error(files, capsys):
    d, new = files
    code = main(["predict", str(d / "new.csv"), "--surrogate", str(d / "s.json"), "--fraction", "0.2",
                 "--json"])
    assert code == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["run"] for r in rows] == [c.run for c in new]
    for r, c in zip(rows, new):
        assert r["fraction"] <= 0.2 and r["reason"] is None
        assert r["low"] < r["predicted_final_loss"] < r["high"]
        assert r["actual_final_loss"] == pytest.approx(c.final_loss)
        assert r["error"] == pytest.approx(r["predicted_final_loss"] / r["actual_final_loss"] - 1)
        assert abs(r["error"]) < 0.01


def test_predict_partial_file_without_the_rest_has_no_actual(files, capsys):
    d, _ = files
    code = main(["predict", str(d / "partial.csv"), "--surrogate", str(d / "s.json"), "--fraction", "0.3",
                 "--json"])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0 and len(rows) == 2
    assert all("actual_final_loss" not in r and r["predicted_final_loss"] > 0 for r in rows)


def test_predict_table_and_reasons(files, capsys):
    d, _ = files
    code = main(["predict", str(d / "new.csv"), "--surrogate", str(d / "s.json"), "--fraction", "0.2"])
    out = capsys.readouterr().out
    assert code == 0 and "predicted" in out and "2 of 2 runs predicted" in out
    code = main(["predict", str(d / "new.csv"), "--surrogate", str(d / "s.json"), "--fraction", "0.05",
                 "--min-fraction", "0.1"])
    out = capsys.readouterr().out
    assert code == 0 and "below min_fraction" in out and "0 of 2 runs predicted" in out


@pytest.mark.parametrize("argv,expect", [
    (["predict", "{d}/new.csv", "--surrogate", "{d}/bad.json", "--fraction", "0.2"], "not valid JSON"),
    (["predict", "{d}/new.csv", "--surrogate", "{d}/none.json", "--fraction", "0.2"], "no such surrogate"),
    (["predict", "{d}/badcol.csv", "--surrogate", "{d}/s.json", "--fraction", "0.2"], "column(s) tpp"),
    (["predict", "{d}/badval.csv", "--surrogate", "{d}/s.json", "--fraction", "0.2"], "column 'loss'"),
    (["predict", "{d}/new.csv", "--surrogate", "{d}/s.json", "--fraction", "1.5"], "--fraction"),
    (["calibrate", "{d}/badval.csv", "-o", "{d}/out.json"], "line 3: column 'loss'"),
    (["calibrate", "{d}/partial.csv", "-o", "{d}/out.json"], "must be complete"),
    (["calibrate", "{d}/ref.csv", "-o", "{d}/nodir/out.json"], "does not exist"),
    (["calibrate", "{d}/ref.csv", "-o", "{d}/out.json", "--fit-start", "2"], "--fit-start"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(files, capsys, argv, expect):
    d, _ = files
    (d / "bad.json").write_text('{"format": "collapse-hpo-surrogate", "vers')
    (d / "badcol.csv").write_text("run,t_hat,loss,lr,tau\nr,0.1,1,1,0.1\n")
    (d / "badval.csv").write_text("run,t_hat,loss,lr,tau,tpp\nr,0.1,1,1,0.1,20\nr,0.2,1..2,1,0.1,20\n")
    before = sorted(p.name for p in d.iterdir())
    code = main([a.format(d=d) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert expect in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in d.iterdir()) == before


def test_sizes_in_the_csv_give_a_size_trend_and_predict_says_when_it_extrapolates(tmp_path, capsys):
    from dataclasses import replace

    ref = []
    for k, n in enumerate((1e6, 2e6, 4e6, 8e6)):
        truth = Surrogate(b_c=0.5 * (n / 4e6) ** 0.05, b_e=0.0, q_c=1.0, q_e=0.0, tau_law="constant",
                          tpp_law="constant")
        ref += [replace(c, run=f"n{k}_{c.run}", params=n)
                for c in synthetic_curves(truth, taus=(None,), tpps=(20.0,), noise=0.0005, seed=k, seeds=2)]
    write_curves_csv(tmp_path / "ref.csv", ref)
    big = [replace(c, run="big", params=64e6) for c in ref[:1]]
    write_curves_csv(tmp_path / "big.csv", big)
    code = main(["calibrate", str(tmp_path / "ref.csv"), "-o", str(tmp_path / "s.json"), "--free-m", "no"])
    assert code == 0
    out = capsys.readouterr().out
    assert "size error at p=0.2" in out
    s = Surrogate.load(tmp_path / "s.json")
    assert s.reference["params"] == [1e6, 8e6] and s.size_trend
    assert main(["predict", str(tmp_path / "big.csv"), "--surrogate", str(tmp_path / "s.json"),
                 "--fraction", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "extrapolates: big: params 6.4e+07 is x8 above the reference range 1e+06-8e+06" in out
    assert main(["predict", str(tmp_path / "big.csv"), "--surrogate", str(tmp_path / "s.json"),
                 "--fraction", "0.2", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["params"] == 64e6 and row["size_correction"] is not None and "x8 above" in row["extrapolation"]


@pytest.mark.parametrize("diverged_at", [0.5, 0.995])
def test_a_diverged_reference_run_is_refused_alike_by_calibrate_and_replay(files, tmp_path, capsys,
                                                                           diverged_at):
    """`collapse-hpo calibrate` refused a diverged reference run; `replay --reference` calibrated on the same
    file and failed later with another message (or, diverged after t̂ 0.99, used the run)."""
    d, _ = files
    lines = (d / "ref.csv").read_text().splitlines()
    head, rows = lines[0], lines[1:]
    cols = head.split(",")
    first = rows[0].split(",")[cols.index("run")]
    bad = []
    for row in rows:
        f = row.split(",")
        if f[cols.index("run")] == first and float(f[cols.index("t_hat")]) >= diverged_at:
            f[cols.index("loss")] = "nan"
        bad.append(",".join(f))
    ref = tmp_path / "ref_diverged.csv"
    ref.write_text("\n".join([head, *bad]) + "\n")
    expect = f"{ref}: 1 of "
    assert main(["calibrate", str(ref), "-o", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err
    assert expect in err and f"reference runs diverged (a NaN, inf or huge loss): '{first}'" in err
    assert "drop those runs from the file" in err and not (tmp_path / "s.json").exists()
    sweep = tmp_path / "sweep.csv"
    write_curves_csv(sweep, synthetic_curves(taus=(0.1,), tpps=(40.0,), noise=0.001, seed=7, seeds=3))
    assert main(["replay", str(sweep), "--reference", str(ref), "--pruner", "collapse", "--orders", "1"]) == 2
    err = capsys.readouterr().err
    assert expect in err and f"reference runs diverged (a NaN, inf or huge loss): '{first}'" in err
