"""Curve CSV: round trip, per-run constants, lr-only rows, one-line errors naming file, line and column."""

import numpy as np
import pytest

from collapse_hpo.predictors.curves import Curve, read_curves_csv, write_curves_csv
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.schedules import Schedule

HEADER = "run,t_hat,loss,lr,tau,tpp,extra\n"


def _write(tmp_path, text, name="c.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_round_trip_keeps_points_constants_and_schedule(tmp_path):
    t = np.linspace(0.0, 1.0, 11)
    loss = 3.0 + 1.0 - t
    loss[-3:] = np.nan  # the tail only has the LR (schedule known in advance)
    a = Curve("a", t, loss, lr=3e-3 * Schedule()(t), tau=0.1, tpp=20.0)
    b = Curve("b", t, 2.0 + 0 * t, lr=1e-3 * np.ones_like(t), tau=None, tpp=80.0)
    path = tmp_path / "curves.csv"
    write_curves_csv(path, [a, b])
    back = read_curves_csv(path)
    assert [c.run for c in back] == ["a", "b"]
    np.testing.assert_allclose(back[0].t_hat, t)
    np.testing.assert_array_equal(np.isnan(back[0].loss), np.isnan(loss))
    assert back[0].tau == 0.1 and back[1].tau is None and back[1].tpp == 80.0
    assert back[0].schedule(0.5) == pytest.approx(0.5)
    assert back[0].final_loss == pytest.approx(loss[7]) and not back[0].complete
    assert back[1].complete and back[1].final_loss == 2.0


def test_rows_sorted_extra_columns_ignored_inf_tau_means_no_decay(tmp_path):
    p = _write(tmp_path, HEADER + "r,0.5,2.0,1,inf,20,x\nr,0.0,4.0,1,inf,20,y\nr,1.0,1.0,0.5,inf,20,z\n")
    (c,) = read_curves_csv(p)
    np.testing.assert_allclose(c.t_hat, [0.0, 0.5, 1.0])
    np.testing.assert_allclose(c.loss, [4.0, 2.0, 1.0])
    assert c.tau is None


@pytest.mark.parametrize("text,expect", [
    ("run,t_hat,loss,lr,tpp\nr,0,1,1,20\n", r"line 1: missing column\(s\) tau; .*\(tau may be empty: "),
    ("run,t_hat,lr,tau,tpp\nr,0,1,1,20\n", r"line 1: missing column\(s\) loss; required: [^(]*$"),
    (HEADER + "r,0.1,abc,1,0.1,20,\n", r"line 2: column 'loss' has 'abc'"),
    (HEADER + "r,0.1,1,1,0.1,20,\nr,x,1,1,0.1,20,\n", r"line 3: column 't_hat' has 'x'"),
    (HEADER + "r,1.5,1,1,0.1,20,\n", r"line 2: column 't_hat' is 1.5"),
    (HEADER + "r,0.1,1,1,-2,20,\n", r"line 2: column 'tau' is -2"),
    (HEADER + "r,0.1,1,1,0.1,0,\n", r"line 2: column 'tpp' is 0.0; give a positive number"),
    (HEADER + "r,0.1,1,1,0.1,20,\nr,0.2,1,1,0.2,20,\n", r"line 3: column 'tau' changes within run 'r'"),
    (HEADER + "r,0.1,1,1,0.1,20,\nr,0.2,1,1,0.1,40,\n", r"line 3: column 'tpp' changes within run 'r'"),
    (HEADER + "r,0.1,1,,0.1,20,\n", r"run 'r' has no positive value in column 'lr'"),
    (HEADER + "r,0.1,1\n", r"line 2: row has 3 fields"),
    (HEADER, r"no data rows"),
    ("", r"the file is empty"),
    (HEADER + ",0.1,1,1,0.1,20,\n", r"line 2: column 'run' is empty"),
])
def test_bad_files_give_one_line_error_naming_file_line_column(tmp_path, text, expect):
    p = _write(tmp_path, text)
    with pytest.raises(InputError, match=expect) as info:
        read_curves_csv(p)
    msg = str(info.value)
    assert "\n" not in msg and str(p) in msg


def test_missing_and_binary_files(tmp_path):
    with pytest.raises(InputError, match="no such curve file"):
        read_curves_csv(tmp_path / "nope.csv")
    p = tmp_path / "bin.csv"
    p.write_bytes(b"\xff\xfe\x00\x01garbage")
    with pytest.raises(InputError, match="UTF-8"):
        read_curves_csv(p)


def test_truncated_curve_and_shape_checks():
    c = Curve("a", np.linspace(0, 1, 11), np.linspace(3, 2, 11), tau=0.1, tpp=20)
    tc = c.truncated(0.3)
    assert tc.t_hat.max() == pytest.approx(0.3) and tc.tau == 0.1 and tc.schedule == c.schedule
    with pytest.raises(InputError):
        Curve("bad", np.zeros(3), np.zeros(4))


@pytest.mark.parametrize("command", ["calibrate", "predict", "replay"])
def test_a_folder_given_as_the_curve_file_is_named_a_folder(tmp_path, capsys, command):
    """`calibrate adir -o x.json` said "no such curve file" of a folder that exists; every command reads its
    curve CSV through `read_curves_csv`, so each now says it is a folder (monitor: tests/test_monitor.py)."""
    from collapse_hpo.hpo.cli import main
    from collapse_hpo.predictors.synthetic import TRUE_SURROGATE

    folder = tmp_path / "adir"
    folder.mkdir()
    with pytest.raises(InputError, match="adir: is a folder, not a curve file; give the path of a CSV"):
        read_curves_csv(folder)
    TRUE_SURROGATE.save(tmp_path / "s.json")
    extra = {"calibrate": ["-o", str(tmp_path / "x.json")],
             "predict": ["--surrogate", str(tmp_path / "s.json"), "--fraction", "0.5"], "replay": []}[command]
    assert main([command, str(folder), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "adir: is a folder, not a curve file" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "s.json"]
