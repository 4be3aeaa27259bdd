"""`collapse-hpo monitor`: a logged run checked against a reference run or a surrogate."""

from __future__ import annotations

import numpy as np

from collapse_hpo.hpo.cli import main
from collapse_hpo.predictors.curves import Curve, write_curves_csv
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE, synthetic_curves


def _curves():
    c0, c1 = synthetic_curves(taus=(0.2,), tpps=(20.0,), seeds=2, n_points=100, noise=0.002, seed=2)
    bad = c1.loss * np.where(c1.t_hat > 0.4, 1 + 0.1 * (c1.t_hat - 0.4), 1)
    kw = dict(t_hat=c1.t_hat, lr=c1.lr, schedule=c1.schedule, tau=c1.tau, tpp=c1.tpp)
    return c0, Curve(run="clean", loss=c1.loss, **kw), Curve(run="faulty", loss=bad, **kw)


def test_monitor_alarms_on_the_faulty_run_only(tmp_path, capsys):
    ref, clean, faulty = _curves()
    write_curves_csv(tmp_path / "ref.csv", [ref])
    write_curves_csv(tmp_path / "runs.csv", [clean, faulty])
    out = tmp_path / "res.csv"
    rc = main(["monitor", str(tmp_path / "runs.csv"), "--reference", str(tmp_path / "ref.csv"),
               "--csv", str(out)])
    assert rc == 1
    text = capsys.readouterr().out
    lines = {ln.split()[0]: ln for ln in text.splitlines() if ln.startswith(("clean", "faulty"))}
    assert lines["clean"].split()[4] == "-"  # no alarm column
    assert 0.4 < float(lines["faulty"].split()[4]) < 0.65
    rows = out.read_text().splitlines()
    assert rows[0] == "run,t_hat,residual" and len(rows) == 1 + 200
    assert main(["monitor", str(tmp_path / "runs.csv"), "--run", "clean", "--reference",
                 str(tmp_path / "ref.csv")]) == 0


def test_monitor_against_the_surrogate(tmp_path):
    _, clean, faulty = _curves()
    sur = tmp_path / "s.json"
    TRUE_SURROGATE.save(sur)
    write_curves_csv(tmp_path / "runs.csv", [clean, faulty])
    assert main(["monitor", str(tmp_path / "runs.csv"), "--surrogate", str(sur), "--run", "clean"]) == 0
    assert main(["monitor", str(tmp_path / "runs.csv"), "--surrogate", str(sur), "--run", "faulty"]) == 1


def test_monitor_bad_input_exits_2_without_output(tmp_path, capsys):
    ref, clean, faulty = _curves()
    write_curves_csv(tmp_path / "ref.csv", [ref, clean])
    write_curves_csv(tmp_path / "runs.csv", [faulty])
    out = tmp_path / "res.csv"
    assert main(["monitor", str(tmp_path / "runs.csv"), "--reference", str(tmp_path / "ref.csv"),
                 "--csv", str(out)]) == 2
    assert "--reference-run" in capsys.readouterr().err and not out.exists()
    assert main(["monitor", str(tmp_path / "runs.csv"), "--reference", str(tmp_path / "ref.csv"),
                 "--reference-run", "x"]) == 2
    assert main(["monitor", str(tmp_path / "runs.csv"), "--reference", str(tmp_path / "ref.csv"),
                 "--reference-run", "clean", "--threshold", "-1"]) == 2


def test_monitor_help_states_every_exit_status(capsys):
    """The exit statuses (1 on an alarm: a script's `monitor || ...` fires on it) are in `--help`, not only in
    RELIABILITY.md."""
    import pytest

    with pytest.raises(SystemExit):
        main(["monitor", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert ("exit status: 0 no alarm; 1 an alarm fired (a run deviated or diverged); 2 bad input" in text
            and "3 --follow stopped at its --timeout or --idle limit" in text), text


def test_a_folder_given_as_the_curve_file_is_named_a_folder(tmp_path, capsys):
    """`monitor DIR` (or `--reference DIR`) said "no such curve file" of a folder that exists."""
    ref, _, _ = _curves()
    write_curves_csv(tmp_path / "ref.csv", [ref])
    (tmp_path / "adir").mkdir()
    for argv in ([str(tmp_path / "adir"), "--reference", str(tmp_path / "ref.csv")],
                 [str(tmp_path / "ref.csv"), "--reference", str(tmp_path / "adir")]):
        assert main(["monitor", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "adir: is a folder, not a curve file" in err, err
