"""optuna-dashboard review: what `publish` writes, and the real dashboard rendered in headless Chromium.

The study is a small finished sweep with the real CollapsePruner on synthetic curves (the surrogate's own
shape times a final loss that depends on lr), so some trials are pruned with a recorded predicted final loss.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile

import optuna
import pytest
from browser_util import chromium, need_chromium, served

from collapse_hpo.hpo.cli import main
from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner, set_trial_controls
from collapse_hpo.hpo.outputs import dashboard
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import ErrorBand, Surrogate

SURROGATE = Surrogate(b_c=0.5, b_e=0.3, q_c=1.0, q_e=0.1,
                      error_bands=[ErrorBand(fraction=0.1, n=20, bias=0.0, scale=0.01, max_abs=0.03)])
TOTAL, TAU, TPP = 1_000_000, 0.1, 20.0


def objective(trial: optuna.Trial) -> float:
    """A plain Optuna objective reporting a synthetic curve at 12 points (step = tokens seen)."""
    lr = trial.suggest_float("lr", 1e-3, 1e-1, log=True)
    set_trial_controls(trial, total_tokens=TOTAL, schedule=Schedule(), tau=TAU, tpp=TPP)
    final = 3.0 + 0.8 * (math.log10(lr) + 2.0) ** 2
    loss = math.nan
    for tokens in range(TOTAL // 12, TOTAL + 1, TOTAL // 12):
        loss = final * float(SURROGATE.normalized(tokens / TOTAL, Schedule(), TAU, TPP)[0])
        trial.report(loss, step=tokens)
        if trial.should_prune():
            trial.set_user_attr("tokens_trained", tokens)
            raise optuna.TrialPruned()
    trial.set_user_attr("tokens_trained", TOTAL)
    return loss


def make_study(url: str, name: str = "review") -> optuna.Study:
    """A finished sweep of 6 trials in SQLite at ``url``, the known-good lr first so that bad ones are pruned.

    It runs in memory and is then copied (``optuna.copy_study``): SQLite commits are slow on a shared disk.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    memory = optuna.storages.InMemoryStorage()
    pruner = CollapsePruner(reference=SURROGATE, min_fraction=0.2)
    study = optuna.create_study(storage=memory, study_name=name, pruner=pruner,
                                sampler=optuna.samplers.RandomSampler(seed=3))
    study.enqueue_trial({"lr": 0.01})
    study.optimize(objective, n_trials=6)
    optuna.copy_study(from_study_name=name, from_storage=memory, to_storage=url)
    return optuna.load_study(study_name=name, storage=url)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    shm = "/dev/shm"
    base = tempfile.mkdtemp(prefix="collapse-hpo-dash-", dir=shm if os.access(shm, os.W_OK) else None)
    try:
        url = f"sqlite:///{base}/study.db"
        study = make_study(url)
        pruned = study.get_trials(states=[optuna.trial.TrialState.PRUNED])
        assert pruned, "the synthetic sweep must prune something"
        yield {"url": url, "study": study}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_publish_writes_the_figure_and_notes(finished):
    study = optuna.load_study(study_name="review", storage=finished["url"])
    result = dashboard.publish(study, reference=SURROGATE)
    assert result.figure_id == dashboard.FIGURE_ID and result.reference == "surrogate"
    assert result.trial_notes == len(study.trials)
    # The figure is stored as the dashboard's plot data: its traces are the curves plus the reference.
    attrs = study._storage.get_study_system_attrs(study._study_id)
    from optuna_dashboard._custom_plot_data import get_plotly_graph_objects

    fig = json.loads(get_plotly_graph_objects(attrs)[dashboard.FIGURE_ID])
    names = [t.get("name") for t in fig["data"]]
    assert any(n and n.startswith("reference ℓ̂ (linear, τ=0.1, TPP=20)") for n in names)
    # A pruned trial's curve is divided by its predicted final loss: it ends near the reference, not at 1.
    pruned = study.get_trials(states=[optuna.trial.TrialState.PRUNED])[0]
    trace = next(t for t in fig["data"] if t.get("name") == f"trial {pruned.number} (pruned)")
    expected = SURROGATE.normalized(trace["x"][-1], Schedule(), TAU, TPP)[0]
    assert trace["y"][-1] == pytest.approx(expected, rel=0.01)
    assert trace["line"]["dash"] == "dash"
    best = study.best_trial
    solid = next(t for t in fig["data"] if t.get("name") == f"trial {best.number} (complete)")
    assert solid["y"][-1] == pytest.approx(1.0)
    # Notes: the pruned trial's prediction, the study summary.
    from optuna_dashboard import get_note

    note = get_note(optuna.trial.Trial(study, pruned._trial_id))
    assert f"**{pruned.user_attrs['predicted_final_loss']:.4f}**" in note
    assert "decided at" in note and "PRUNED" in note
    summary = get_note(study)
    n_pruned = len(study.get_trials(states=[optuna.trial.TrialState.PRUNED]))
    assert f"{n_pruned} pruned" in summary and f"Best: trial {best.number}" in summary
    # Unchanged notes are not rewritten.
    assert dashboard.publish(study, reference=SURROGATE).trial_notes == 0


def test_trial_note_of_a_complete_trial_reports_the_prediction_error():
    t = optuna.trial.create_trial(
        value=3.0, params={}, distributions={},
        user_attrs={"predicted_final_loss": 3.03, "predicted_low": 2.98, "predicted_high": 3.08,
                    "decision_fraction": 0.3, "prune_reason": "kept | fine"},
    )
    note = dashboard.trial_note(t)
    assert "**3.0300** (interval 2.9800 to 3.0800)" in note
    assert "+1.00%" in note and "t̂ = 0.300" in note
    assert "kept / fine" in note  # a '|' would break the Markdown table


def test_dashboard_cli_rejects_bad_input(tmp_path, capsys):
    assert main(["dashboard"]) == 2
    assert "give a sweep file or --storage" in capsys.readouterr().err
    missing = tmp_path / "nope.db"
    assert main(["dashboard", "--storage", f"sqlite:///{missing}"]) == 2
    assert "no such SQLite file" in capsys.readouterr().err
    assert not missing.exists()


def test_dashboard_cli_publishes_into_a_sweeps_study(finished, tmp_path, capsys):
    """`collapse-hpo dashboard SWEEP.yaml --publish-only` uses the sweep's storage, study and reference."""
    SURROGATE.save(tmp_path / "surrogate.json")
    sweep = tmp_path / "review.yaml"
    sweep.write_text(
        "name: review\n"
        "model: {width: 48, depth: 2, heads: 2, context: 128}\n"
        "tpp: 20\n"
        "tau: 0.1\n"
        "fixed: {batch_tokens: 2048}\n"
        "space: {lr: {type: float, low: 1.0e-3, high: 1.0e-1, log: true}}\n"
        "trials: 6\n"
        "pruner: {reference: {surrogate: surrogate.json}}\n"
        f"storage: {finished['url']}\n"
    )
    assert main(["dashboard", str(sweep), "--publish-only"]) == 0
    out = capsys.readouterr().out
    assert "published to study 'review'" in out and "reference: file:surrogate.json" in out
    missing = tmp_path / "elsewhere.yaml"
    missing.write_text(sweep.read_text().replace(finished["url"], f"sqlite:///{tmp_path / 'none.db'}"))
    assert main(["dashboard", str(missing), "--publish-only"]) == 2
    assert "run `collapse-hpo run" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()


def test_real_dashboard_in_headless_chromium_shows_the_prediction(finished, tmp_path):
    """`collapse-hpo dashboard --storage URL` serves the study; Chromium shows a pruned trial's prediction."""
    need_chromium()
    study = optuna.load_study(study_name="review", storage=finished["url"])
    pruned = study.get_trials(states=[optuna.trial.TrialState.PRUNED])[0]
    predicted = pruned.user_attrs["predicted_final_loss"]

    with served(finished["url"]) as (url, lines):
        assert url.endswith("/dashboard/")
        assert any("published to study 'review'" in x for x in lines)

        page = f"{url}studies/{study._study_id}/trials?numbers={pruned.number}"
        dom = chromium(["--virtual-time-budget=20000", "--dump-dom", page], str(tmp_path / "profile1"))
        html = dom.stdout.decode("utf-8", "replace")
        assert f"Trial {pruned.number}" in html, dom.stderr.decode()[-2000:]
        assert "Pruned" in html
        assert f"{predicted:.4f}" in html  # the note: predicted final loss (4 decimals)
        assert "predicted_final_loss" in html and repr(predicted) in html  # the user attrs table

        shot = tmp_path / "dashboard_pruned_trial.png"
        chromium(["--virtual-time-budget=20000", "--window-size=1400,1000", f"--screenshot={shot}", page],
                 str(tmp_path / "profile2"))
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a rendered page, not a blank one

        top = chromium(["--virtual-time-budget=20000", "--dump-dom", f"{url}studies/{study._study_id}"],
                       str(tmp_path / "profile3"))
        assert "Collapsed curves" in top.stdout.decode("utf-8", "replace")  # the study figure is rendered
