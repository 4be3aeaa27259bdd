"""`collapse-hpo report --storage URL --study NAME`: the sweep report for studies made outside a sweep file.

Three real studies on SQLite, each made the way its user makes it: a plain Optuna objective with the
CollapsePruner (tokens), the same with the controls a Hugging Face search sets (optimizer steps, as
``hpo/integrations`` records them), and Ray Tune's mirror (``CollapseScheduler(storage=...)``, driven through
the scheduler's own hooks with stand-in Tune trials, no cluster). Each is reported through the real CLI.
"""

from __future__ import annotations

import csv
import math

import optuna
import pytest

from collapse_hpo.hpo import cli
from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner
from collapse_hpo.hpo.rule.decision import PruneSettings
from collapse_hpo.hpo.rule.record import set_trial_controls
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE

TAU, TPP = 0.2, 20.0
LRS = (3e-3, 1e-3, 3e-2, 6e-3, 3e-4, 1e-1)


def _loss(lr: float, t_hat: float) -> float:
    """The reference shape times a final loss that is best at lr = 3e-3."""
    return (3.0 + 0.5 * math.log10(lr / 3e-3) ** 2) * float(
        TRUE_SURROGATE.normalized(t_hat, Schedule(), TAU, TPP)[0])


def _optuna_study(url: str, name: str, *, units: str, total: int) -> optuna.Study:
    """A finished study of the plain objective: steps in ``units`` (tokens, or optimizer steps as Hugging
    Face counts them, with the controls set per trial as its integration does)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = CollapsePruner(reference=TRUE_SURROGATE, min_fraction=0.2,
                            total=total, units=units, schedule="linear", tau=TAU, tpp=TPP)
    study = optuna.create_study(storage=url, study_name=name, pruner=pruner)
    for lr in LRS:
        study.enqueue_trial({"learning_rate": lr})

    def objective(trial: optuna.Trial) -> float:
        lr = trial.suggest_float("learning_rate", 1e-4, 1e-1, log=True)
        if units == "steps":
            set_trial_controls(trial, total=total, units="steps", schedule="linear", tau=TAU, tpp=TPP)
        loss = math.nan
        for i in range(1, 11):
            step = total * i // 10
            loss = _loss(lr, step / total)
            trial.report(loss, step=step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return loss

    study.optimize(objective, n_trials=len(LRS))
    return study


def _report(monkeypatch, tmp_path, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.chdir(tmp_path)
    code = cli.main(["report", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _rows(path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _check_files(folder, study: optuna.Study) -> None:
    rows = _rows(folder / "results.csv")
    assert [int(r["number"]) for r in rows] == [t.number for t in study.trials]
    assert [r["state"] for r in rows] == [t.state.name for t in study.trials]
    runs = {r["run"] for r in _rows(folder / "curves.csv")}
    assert runs == {f"trial{t.number}" for t in study.trials}
    t_hats = [float(r["t_hat"]) for r in _rows(folder / "curves.csv")]
    assert min(t_hats) > 0 and max(t_hats) == pytest.approx(1.0)  # t̂ = step / total, in the trial's units
    assert (folder / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_of_a_plain_optuna_study(tmp_path, monkeypatch, capsys):
    url = f"sqlite:///{tmp_path / 'plain.db'}"
    study = _optuna_study(url, "plain", units="tokens", total=100_000_000)
    pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned, "the sweep must prune something"
    code, out, err = _report(monkeypatch, tmp_path, capsys, "--storage", url, "--study", "plain")
    assert code == 0, err
    _check_files(tmp_path / "results" / "plain", study)
    assert f"{len(LRS) - len(pruned)} complete, {len(pruned)} pruned" in out
    assert "best: trial 0 learning_rate=0.003 final_loss=3.0000" in out  # its own parameter, by its name
    spent = sum(max(t.intermediate_values) for t in study.trials)
    assert f"({100 * spent / (len(LRS) * 100_000_000):.1f}% of the unpruned sweep" in out
    assert "M of 600.0M tokens" in out
    assert "collapse-hpo resume" not in out  # a sweep's hint, not this study's


def test_report_of_a_study_counted_in_optimizer_steps(tmp_path, monkeypatch, capsys):
    """A Hugging Face search reports optimizer steps (``units="steps"``, ``total`` = max_steps)."""
    url = f"sqlite:///{tmp_path / 'hf.db'}"
    study = _optuna_study(url, "hf-search", units="steps", total=200)
    code, out, err = _report(monkeypatch, tmp_path, capsys, "--storage", url, "--results", "out")
    assert code == 0, err  # the storage's only study needs no --study
    _check_files(tmp_path / "out", study)
    assert " of 1200 steps (" in out


class _TuneTrial:
    """The parts of ray.tune.experiment.Trial the scheduler uses."""

    def __init__(self, trial_id: str, config: dict) -> None:
        self.trial_id, self.config, self.status = trial_id, config, "RUNNING"
        self.evaluated_params = dict(config)
        self.max_failures, self.failures = 0, 0

    def should_recover(self) -> bool:
        return False


def test_report_of_a_ray_tune_mirror(tmp_path, monkeypatch, capsys):
    from collapse_hpo.hpo.ray_side.scheduler import CollapseScheduler

    url = f"sqlite:///{tmp_path / 'tune.db'}"
    total = 1_000_000
    s = CollapseScheduler(reference=TRUE_SURROGATE, metric="loss", time_attr="tokens", total_tokens=total,
                          tau=TAU, tpp=TPP, settings=PruneSettings(min_fraction=0.2),
                          state_path=tmp_path / "state.json", storage=url, study_name="lr-sweep")
    for i, lr in enumerate(LRS):  # one at a time, as a Tuner with one concurrent trial
        trial = _TuneTrial(f"t{i}", {"lr": lr})
        s.on_trial_add(None, trial)
        result: dict = {}
        for k in range(1, 11):
            result = {"loss": _loss(lr, k / 10), "tokens": total * k // 10}
            if s.on_trial_result(None, trial, result) == "STOP":
                break
        trial.status = "TERMINATED"
        s.on_trial_complete(None, trial, result)
    study = optuna.load_study(study_name="lr-sweep", storage=url)
    states = {t.state.name for t in study.trials}
    assert states == {"COMPLETE", "PRUNED"}, states
    code, out, err = _report(monkeypatch, tmp_path, capsys, "--storage", url, "--study", "lr-sweep")
    assert code == 0, err
    _check_files(tmp_path / "results" / "lr-sweep", study)
    assert "best: trial 0 lr=0.003 final_loss=3.0000" in out


def test_a_missing_study_is_one_line_listing_the_studies_and_writes_nothing(tmp_path, monkeypatch, capsys):
    url = f"sqlite:///{tmp_path / 'two.db'}"
    for name in ("alpha", "beta"):
        optuna.create_study(storage=url, study_name=name)
    before = sorted(p.name for p in tmp_path.iterdir())
    for args, words in ((["--study", "gamma"], "--study 'gamma': no such study in"),
                        ([], "holds 2 studies ('alpha', 'beta'); choose one with --study")):
        code, out, err = _report(monkeypatch, tmp_path, capsys, "--storage", url, *args)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
        assert words in err and "'alpha', 'beta'" in err
    code, _, err = _report(monkeypatch, tmp_path, capsys, "--storage", f"sqlite:///{tmp_path / 'no.db'}")
    assert code == 2 and "no such SQLite file" in err
    code, _, err = _report(monkeypatch, tmp_path, capsys, "studies/quickstart.yaml", "--storage", url)
    assert code == 2 and "one of them" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no results folder, no new database


def test_the_tables_note_drops_the_predicted_loss_and_never_cuts_a_number():
    """The note cell cut the reason at 60 characters: "the best competitor's 1.852 is 4" (of 4.21%), after
    repeating the predicted loss the table's own column shows."""
    from collapse_hpo.hpo.outputs.report import NOTE_WIDTH, format_table, short_note

    reason = ("predicted final loss 1.932; the best competitor's 1.852 is 4.21% ahead (loss ratio at "
              "t_hat=0.341, equal controls), more than the 4.00% margin: pruned at t_hat=0.606")
    note = short_note(reason)
    assert note.startswith("the best competitor's 1.852 is 4.21% ahead") and note.endswith("…")
    assert len(note) <= NOTE_WIDTH and "1.932" not in note
    assert short_note("kept: no competitor yet") == "kept: no competitor yet"
    row = {"number": 0, "state": "PRUNED", "draw": 0, "seed": 0, "lr": 0.025, "batch_tokens": 2048,
           "weight_decay": 0.4, "tau": 0.18, "tokens_trained": 700_000, "final_loss": None, "error": None,
           "prune_reason": reason, "predicted_final_loss": 1.932, "predicted_low": 1.71,
           "predicted_high": 2.24, "predicted_misfit": 0.5, "decision_fraction": 0.606}
    assert note in format_table([row])
