"""`collapse-hpo forecast` run in-process: the README example as it is, --json, files, and bad input."""

import json
import os
import re
import shlex
import stat
from pathlib import Path

import numpy as np
import pytest

from collapse_hpo.hpo.cli import main
from collapse_hpo.predictors.curves import read_curves_csv
from collapse_hpo.predictors.surrogate import Surrogate

README = Path(__file__).parents[1] / "README.md"


def _section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("## Forecast a run before training")
    return text[start : text.index("\n## ", start + 10)]


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """Runs the README section: its Python blocks and `collapse-hpo` lines, in order, in a fresh folder."""
    d = tmp_path_factory.mktemp("forecast")
    section = _section()
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    lines = [ln.strip() for ln in section.splitlines() if ln.startswith("    collapse-hpo ")]
    assert len(blocks) == 2 and len(lines) == 3
    outputs = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(d)
        exec(compile(blocks[0], "README.md", "exec"), {})
        for line in lines:
            code = main(shlex.split(line)[1:])
            assert code == 0, line
        ns: dict = {}
        exec(compile(blocks[1], "README.md", "exec"), ns)
        outputs["python"] = ns["fc"]
    return d, outputs


def test_readme_example_writes_surrogate_with_law_csv_and_plot(example):
    d, out = example
    s = Surrogate.load(d / "surrogate.json")
    assert s.scaling_law is not None and s.scaling_law.n_sizes == 3
    assert (d / "forecast.png").stat().st_size > 1000
    [curve] = read_curves_csv(d / "forecast.csv")
    fc = out["python"]
    np.testing.assert_allclose(curve.loss, fc.loss, rtol=1e-12)
    assert curve.tau == pytest.approx(0.1) and curve.tpp == pytest.approx(40.0)
    # the example's final losses follow Chinchilla's law exactly: the forecast at 3x the largest size hits it
    truth = 1.69 + 406.4 / 5e8**0.34 + 410.7 / 2e10**0.28
    assert fc.final_loss == pytest.approx(truth, rel=0.005)
    assert fc.low < fc.final_loss < fc.high
    assert fc.final_loss == pytest.approx(curve.loss[-1])


def test_json_is_one_object_and_matches_python(example, capsys):
    d, out = example
    code = main(["forecast", "--surrogate", str(d / "surrogate.json"), "--params", "5e8", "--tokens", "2e10",
                 "--tau", "0.1", "--json"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and len(lines) == 1
    obj = json.loads(lines[0])
    fc = out["python"]
    assert {"final_loss", "low", "high"} <= set(obj)
    assert obj["final_loss"] == pytest.approx(fc.final_loss, rel=1e-12)
    assert obj["low"] == pytest.approx(fc.low, rel=1e-12) and obj["high"] == pytest.approx(fc.high, rel=1e-12)
    # the same run described by lr, batch and weight decay (tau = B/(eta lambda D) = 0.1)
    code = main(["forecast", "--surrogate", str(d / "surrogate.json"), "--params", "5e8", "--tokens", "2e10",
                 "--lr", "3e-3", "--batch-tokens", "5e5", "--weight-decay", str(5e5 / (3e-3 * 0.1 * 2e10)),
                 "--json"])
    obj2 = json.loads(capsys.readouterr().out)
    assert code == 0 and obj2["final_loss"] == pytest.approx(obj["final_loss"], rel=1e-9)
    # a different schedule shape changes L(1) through the surrogate's raw(1); same law
    code = main(["forecast", "--surrogate", str(d / "surrogate.json"), "--params", "5e8", "--tokens", "2e10",
                 "--tau", "0.1", "--schedule", "constant", "--json"])
    const = json.loads(capsys.readouterr().out)
    assert code == 0 and const["final_loss"] > obj["final_loss"] and const["schedule"] == "constant"


def test_text_output(example, capsys):
    d, _ = example
    code = main(["forecast", "--surrogate", str(d / "surrogate.json"), "--params", "5e8", "--tokens", "2e10",
                 "--tau", "0.1"])
    out = capsys.readouterr().out
    assert code == 0 and "final loss" in out and "90% interval" in out
    assert "outside the reference sizes" in out and "too few to check it" in out


@pytest.mark.parametrize("extra, expect", [
    (["--tau", "0.1", "--lr", "1e-3"], "either --tau"),
    (["--lr", "1e-3", "--batch-tokens", "5e5"], "go together"),
    (["--tau", "-1"], "--tau must be positive"),
    (["--tau", "abc"], "--tau must be a number"),
    (["--tau", "0.1", "--schedule", "zigzag"], "--schedule"),
    (["--tau", "0.1", "--tokens", "0"], "tokens must be a positive"),
    (["--tau", "0.1", "--csv", "{d}/nodir/f.csv"], "does not exist"),
    (["--tau", "0.1", "--surrogate", "{d}/old.json"], "no scaling law"),
    (["--tau", "0.1", "--surrogate", "{d}/missing.json"], "no such surrogate"),
    (["--tau", "0.1", "--params", "-5"], "params must be a positive"),
    (["--tau", "0.1", "--params", "nan"], "params must be a positive"),
    (["--tau", "0.1", "--csv", "{d}"], "is a folder"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(example, capsys, extra, expect):
    d, _ = example
    Surrogate(b_c=0.5, b_e=0.3, q_c=1.0, q_e=0.1).save(d / "old.json")  # a file without a law
    base = ["forecast", "--surrogate", str(d / "surrogate.json"), "--params", "5e8", "--tokens", "2e10",
            "--csv", str(d / "bad.csv"), "--plot", str(d / "bad.png")]
    argv = base + [a.format(d=d) for a in extra]
    before = sorted(p.name for p in d.rglob("*"))
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert expect in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in d.rglob("*")) == before


def test_calibrate_reports_when_it_cannot_fit_a_law(example, capsys, tmp_path):
    d, _ = example
    lines = (d / "refs.csv").read_text().splitlines()
    head, rows = lines[0], lines[1:]
    two = [r for r in rows if not r.startswith("2e+07")]
    (tmp_path / "two.csv").write_text("\n".join([head, *two]) + "\n")
    code = main(["calibrate", str(tmp_path / "two.csv"), "-o", str(tmp_path / "s.json"), "--folds", "2",
                 "--free-m", "no"])
    out = capsys.readouterr().out
    assert code == 0 and "no scaling law" in out and "3 or more model sizes" in out
    assert Surrogate.load(tmp_path / "s.json").scaling_law is None
    forecast_err = main(["forecast", "--surrogate", str(tmp_path / "s.json"), "--params", "5e8", "--tokens",
                         "2e10", "--tau", "0.1"])
    assert forecast_err == 2 and "calibrate it with model sizes" in capsys.readouterr().err


def test_forecast_files_keep_the_umask_and_a_bad_plot_path_leaves_no_csv(example, capsys):
    """Issue 23 item 2: the files get 0666 less the umask (they were 0600), and every output is checked
    before any is written (a --plot onto a FIFO used to leave the --csv written, and replace the FIFO)."""
    d, _ = example
    base = ["forecast", "--surrogate", str(d / "surrogate.json"), "--params", "5e8", "--tokens", "2e10",
            "--tau", "0.1"]
    mask = os.umask(0o022)
    try:
        assert main([*base, "--csv", str(d / "m.csv"), "--plot", str(d / "m.png")]) == 0
    finally:
        os.umask(mask)
    assert stat.S_IMODE((d / "m.csv").stat().st_mode) == 0o644 == stat.S_IMODE((d / "m.png").stat().st_mode)
    fifo = d / "plot.fifo"
    os.mkfifo(fifo)
    capsys.readouterr()
    assert main([*base, "--csv", str(d / "first.csv"), "--plot", str(fifo)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a FIFO" in err[0], err
    assert not (d / "first.csv").exists() and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    fifo.unlink()


def test_leaving_out_tau_is_said_in_help_and_in_a_note(example, capsys):
    """Without --tau (and --lr/--batch-tokens/--weight-decay) the forecast is for no weight decay: --help says
    so, and the text and JSON carry a note saying what was assumed and how to give τ (it was silent: the same
    numbers as --tau 0.1, since the README's surrogate has a constant b(τ))."""
    d, _ = example
    base = ["forecast", "--surrogate", str(d / "surrogate.json"), "--params", "5e8", "--tokens", "2e10"]
    assert main(base) == 0
    out = capsys.readouterr().out
    assert "note: no --tau given: forecast for a run without weight decay (as --tau none)" in out
    assert "b(tau) is a constant" in out and "give the run's tau with --tau" in out
    assert main([*base, "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["tau"] is None and obj["notes"][0].startswith("no --tau given")
    for given in (["--tau", "0.1"], ["--tau", "none"]):
        assert main([*base, *given]) == 0
        assert "no --tau given" not in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["forecast", "--help"])
    assert "With none of these: no weight decay (as --tau none)" in " ".join(capsys.readouterr().out.split())


def test_leaving_out_tau_with_a_tau_law_names_tau_or_says_the_limit(example, capsys):
    """A surrogate whose b(τ) is a power law cannot forecast a run without weight decay: leaving out --tau is
    refused in one line that says to give it; with ``no_decay_limit`` the note names the limit used."""
    d, _ = example
    raw = json.loads((d / "surrogate.json").read_text())
    power = {**raw, "tau_law": "power", "b_e": -0.5}
    (d / "power.json").write_text(json.dumps(power))
    (d / "limit.json").write_text(json.dumps({**power, "no_decay_limit": True}))
    base = ["--params", "5e8", "--tokens", "2e10", "--csv", str(d / "notau.csv")]
    assert main(["forecast", "--surrogate", str(d / "power.json"), *base]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no --tau given" in err and "give the run's tau with --tau" in err
    assert not (d / "notau.csv").exists()
    assert main(["forecast", "--surrogate", str(d / "limit.json"), *base]) == 0
    out = capsys.readouterr().out
    assert "no --tau given: forecast for a run without weight decay" in out and "limit b = 0" in out
