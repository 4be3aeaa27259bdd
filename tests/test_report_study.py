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


# ------------------------------------------------------------------------------------- units and params
# A new user ran the README's plain-Optuna example (params lr, weight_decay, warmup; controls in optimizer
# steps; a validation loss per step) and got a table column "tokens", results.csv with `tokens_trained` and
# an empty `total_tokens`, empty `weight_decay` and `warmup` columns (λ "-"), and a figure whose axes said
# "tokens seen / total tokens" and "training loss"; an empty study wrote files and "compute: 0 of 0 tokens".

def _searched_study(url: str, name: str, *, units: str, total: int | None) -> optuna.Study:
    """A finished plain-Optuna study like the README's example: lr, weight_decay and warmup searched, each
    trial's controls in ``units`` (``total`` long; "fraction": step = round(t̂ · FRACTION_STEPS))."""
    from collapse_hpo.hpo.rule.record import FRACTION_STEPS

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=url, study_name=name,
                                pruner=CollapsePruner(reference=TRUE_SURROGATE, min_fraction=0.2))
    for k, lr in enumerate(LRS):
        study.enqueue_trial({"lr": lr, "weight_decay": 0.01 * (k + 1), "warmup": 0.02 * k})
    length = FRACTION_STEPS if units == "fraction" else total

    def objective(trial: optuna.Trial) -> float:
        lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
        trial.suggest_float("weight_decay", 1e-3, 1.0, log=True)
        trial.suggest_float("warmup", 0.0, 0.3)
        set_trial_controls(trial, units=units, total=total, schedule="linear", tau=TAU, tpp=TPP)
        loss = math.nan
        for i in range(1, 11):
            loss = _loss(lr, i / 10)
            trial.report(loss, step=length * i // 10)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return loss

    study.optimize(objective, n_trials=len(LRS))
    return study


def _axis_labels(monkeypatch) -> list[tuple[str, str]]:
    """(x label, y label) of the loss-curve axes of every curves figure drawn from now on (not written)."""
    from collapse_hpo.hpo.outputs import report

    seen: list[tuple[str, str]] = []

    def fake_save(fig, path, *, dpi):
        seen.append((fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel()))
        report.pyplot().close(fig)

    monkeypatch.setattr(report, "save_png", fake_save)
    return seen


@pytest.mark.parametrize("units, total, heading, x_words", [
    ("steps", 200, "steps", "optimizer steps / total steps"),
    ("tokens", 100_000_000, "tokens", "tokens seen / total tokens"),
    ("fraction", None, "t̂", "fraction of training"),
])
def test_report_labels_progress_in_the_units_the_trials_recorded(tmp_path, monkeypatch, capsys, units, total,
                                                                  heading, x_words):
    """The table's progress column, results.csv and the figure's x-axis say the study's own units, the total
    is the controls' ``total``, and a trial counted in tokens keeps `tokens_trained`/`total_tokens`."""
    url = f"sqlite:///{tmp_path / 'sweep.db'}"
    study = _searched_study(url, "char-mlp", units=units, total=total)
    labels = _axis_labels(monkeypatch)
    code, out, err = _report(monkeypatch, tmp_path, capsys, "--storage", url, "--study", "char-mlp")
    assert code == 0, err
    head = out.splitlines()[0].split()
    assert heading in head and ("tokens" in head) == (units == "tokens"), head
    rows = _rows(tmp_path / "results" / "char-mlp" / "results.csv")
    for row, trial in zip(rows, study.trials, strict=True):
        last = max(trial.intermediate_values)
        assert row["units"] == units
        if units == "fraction":  # progress as t̂ itself, not in millionths
            assert float(row["total"]) == 1 and float(row["trained"]) == pytest.approx(last / 1_000_000)
        else:
            assert int(row["total"]) == total and int(row["trained"]) == last
        tokens = units == "tokens"
        assert row["total_tokens"] == (str(total) if tokens else "")
        assert row["tokens_trained"] == (str(last) if tokens else "")
    assert labels and x_words in labels[0][0] and labels[0][1] == "loss (as reported)", labels


def test_report_shows_the_studys_own_searched_params(tmp_path, monkeypatch, capsys):
    """weight_decay and warmup are the study's own params: results.csv and the table's λ and warmup
    columns show them."""
    url = f"sqlite:///{tmp_path / 'sweep.db'}"
    study = _searched_study(url, "char-mlp", units="steps", total=200)
    code, out, err = _report(monkeypatch, tmp_path, capsys, "--storage", url)
    assert code == 0, err
    rows = _rows(tmp_path / "results" / "char-mlp" / "results.csv")
    for row, trial in zip(rows, study.trials, strict=True):
        for name in ("lr", "weight_decay", "warmup"):
            assert float(row[name]) == pytest.approx(trial.params[name]), name
    table = out.splitlines()
    head = table[0].split()
    assert "λ" in head and "warmup" in head
    cells = table[1 + study.trials[2].number].split()  # not the best trial: no leading "*"
    assert cells[head.index("λ")] == "0.03" and cells[head.index("warmup")] == "0.04"


def test_results_csv_gives_other_searched_params_a_column_each():
    """A param without a column of its own gets one, after weight_decay, by its name (``param_`` before a
    name another column has); the sweep runner's derived λ (a user attr) stays ahead of a param."""
    from collapse_hpo.hpo.outputs.report import COLUMNS, results_columns

    rows = [{"params": {"lr": 1e-3, "dropout": 0.1, "state": "x"}}, {"params": {"act": "gelu"}}]
    columns = results_columns(rows)
    i = list(columns).index("weight_decay")
    assert list(columns)[i + 1: i + 4] == ["dropout", "param_state", "act"]
    assert columns["param_state"] == "state" and columns["dropout"] == "dropout" and columns["lr"] is None
    assert [c for c in columns if columns[c] is None] == list(COLUMNS)
    assert list(results_columns([{"params": {"lr": 1e-3}}])) == list(COLUMNS)  # the sweep's own: unchanged


def _stored_study(trials: list[dict]) -> optuna.Study:
    """An in-memory study of finished trials made with ``optuna.trial.create_trial`` keywords."""
    from optuna.distributions import FloatDistribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    for kw in trials:
        study.add_trial(optuna.trial.create_trial(
            params={"lr": 1e-3, "weight_decay": 0.1}, distributions={
                "lr": FloatDistribution(1e-4, 1e-1), "weight_decay": FloatDistribution(1e-3, 1.0)}, **kw))
    return study


def test_the_sweep_runners_rows_keep_their_tokens_and_derived_lambda(tmp_path, monkeypatch):
    """A sweep trial (total_tokens and tokens_trained as the runner writes them, λ derived as a user attr)
    reads as before: tokens, λ from the attr, not the param; a sweep's figure says its training loss."""
    from collapse_hpo.hpo.outputs.report import compute, format_table, trial_rows, write_report

    study = _stored_study([{"state": optuna.trial.TrialState.COMPLETE, "value": 2.0,
                            "intermediate_values": {500: 2.5, 1000: 2.0},
                            "user_attrs": {"total_tokens": 1000, "tokens_trained": 1000, "weight_decay": 0.05,
                                           "draw": 0, "seed": 0, "batch_tokens": 64}}])
    (row,) = trial_rows(study)
    assert (row["units"], row["total"], row["trained"]) == ("tokens", 1000, 1000)
    assert (row["total_tokens"], row["tokens_trained"], row["weight_decay"]) == (1000, 1000, 0.05)
    assert compute(study, 1000.0).fraction == 1.0
    assert format_table([row]).splitlines()[0].split()[8] == "tokens"
    labels = _axis_labels(monkeypatch)
    write_report(study, tmp_path, 1000.0)  # as hpo/sweep/finish.py calls it
    assert labels == [("t̂ (tokens seen / total tokens)", "training loss")]


def test_the_pruners_sampler_point_is_no_training_and_mixed_units_say_their_own():
    """A pruned trial's sampler point (``report_prediction``: the predicted final loss at the last step) is
    not progress; a study whose trials count differently names each cell's units and counts t̂."""
    from collapse_hpo.hpo.outputs.report import compute, format_table, study_unpruned, trial_rows
    from collapse_hpo.hpo.rule.record import SAMPLER_STEP_ATTR

    study = _stored_study([
        {"state": optuna.trial.TrialState.PRUNED, "intermediate_values": {10: 3.0, 20: 2.8, 100: 2.5},
         "user_attrs": {"units": "steps", "total": 100, SAMPLER_STEP_ATTR: 100}},
        {"state": optuna.trial.TrialState.COMPLETE, "value": 2.0,
         "intermediate_values": {500: 2.1, 1000: 2.0}, "user_attrs": {"units": "tokens", "total": 1000}},
    ])
    rows = trial_rows(study)
    assert [r["trained"] for r in rows] == [20, 1000]
    unpruned, units = study_unpruned(study)
    assert (unpruned, units) == (2.0, "mixed units")
    assert compute(study, unpruned, units).fraction == pytest.approx((0.2 + 1.0) / 2)
    table = format_table(rows)
    assert table.splitlines()[0].split()[8] == "trained"
    assert "20 steps" in table and "1.0K tokens" in table


@pytest.mark.parametrize("enqueued", [0, 2])
def test_a_study_with_no_trials_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, enqueued):
    """Nothing to report is an input error (exit 2, one line naming the study), as a storage with no study
    is; before, it printed "compute: 0 of 0 tokens (... 100.0% saved)" and wrote the files."""
    url = f"sqlite:///{tmp_path / 'sweep.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=url, study_name="char-mlp")
    for k in range(enqueued):
        study.enqueue_trial({"lr": 1e-3 * (k + 1)})
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = _report(monkeypatch, tmp_path, capsys, "--storage", url, "--study", "char-mlp")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (out, err)
    assert "study 'char-mlp' in " in err and "no trials yet" in err
    assert ("2 enqueued, none started" in err) == bool(enqueued)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no results folder


def test_an_unfinished_sweep_reports_what_it_spent_so_far_and_no_saving(tmp_path):
    """A sweep stopped by a signal (a trial interrupted, others not started) printed "88.2% saved": the share
    it did not train yet is no saving. A finished one still says what it saved."""
    from collapse_hpo.hpo.outputs.report import write_report

    done = {"state": optuna.trial.TrialState.COMPLETE, "value": 2.0,
            "intermediate_values": {500: 2.5, 1000: 2.0},
            "user_attrs": {"total_tokens": 1000, "tokens_trained": 1000, "draw": 0, "seed": 0}}
    stopped = {"state": optuna.trial.TrialState.FAIL, "intermediate_values": {200: 3.0},
               "user_attrs": {"total_tokens": 1000, "tokens_trained": 200, "draw": 1, "seed": 0,
                              "interrupted": True}}
    _, lines = write_report(_stored_study([done]), tmp_path / "a", 2000.0)
    assert "compute: 1.0K of 2.0K tokens (50.0% of the unpruned sweep; 50.0% saved)" in lines
    _, lines = write_report(_stored_study([done, stopped]), tmp_path / "b", 2000.0)
    compute_line = next(line for line in lines if line.startswith("compute:"))
    assert "saved)" not in compute_line
    assert compute_line.endswith("(60.0% of the unpruned sweep so far; not finished, so nothing saved yet)")
    assert any(line.startswith("the sweep is not finished (0 planned trials not started, 1 interrupted)")
               for line in lines)


def test_a_hugging_face_learning_rate_fills_the_lr_column():
    """`hyperparameter_search` names the peak LR `learning_rate`: the lr column stayed empty beside a
    `learning_rate` column of its own."""
    from optuna.distributions import FloatDistribution

    from collapse_hpo.hpo.outputs.report import format_table, results_columns, trial_rows

    study = optuna.create_study()
    study.add_trial(optuna.trial.create_trial(
        params={"learning_rate": 3e-4, "dropout": 0.1},
        distributions={"learning_rate": FloatDistribution(1e-5, 1e-2), "dropout": FloatDistribution(0, 0.5)},
        state=optuna.trial.TrialState.COMPLETE, value=2.0, intermediate_values={10: 2.5, 20: 2.0},
        user_attrs={"units": "steps", "total": 20}))
    rows = trial_rows(study)
    assert rows[0]["lr"] == 3e-4
    assert list(results_columns(rows)).count("learning_rate") == 0 and "dropout" in results_columns(rows)
    head = format_table(rows).splitlines()[0].split()
    assert "lr" in head and "learning_rate" not in head and "dropout" in head
