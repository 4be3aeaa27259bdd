"""The review figure for a plain Optuna study that follows the README (controls given to the pruner only).

Issue 13, item 4: the pruner records the controls it judged with, the figure takes its reference from the
decision logs, the study note says where the figure is, the legend names each reference once, the Ray
mirror keeps constant config keys out of the trial params, and `report`'s raw-loss panel shows pruned curves.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import optuna
import pytest
from browser_util import chromium, need_chromium, served, trial_pixels

from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner
from collapse_hpo.hpo.outputs import dashboard
from collapse_hpo.hpo.rule.record import CONTROL_ATTRS, TrialControls, trial_curve
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import ErrorBand, Surrogate

SURROGATE = Surrogate(b_c=0.5, b_e=0.3, q_c=1.0, q_e=0.1,
                      error_bands=[ErrorBand(fraction=0.1, n=20, bias=0.0, scale=0.01, max_abs=0.03)])
TOTAL, TAU, TPP = 1_000_000, 0.1, 20.0


def objective(trial: optuna.Trial) -> float:
    """The README's plain objective: report (loss, tokens seen), no set_trial_controls."""
    lr = trial.suggest_float("lr", 1e-3, 1e-1, log=True)
    final = 3.0 + 0.8 * (math.log10(lr) + 2.0) ** 2
    loss = math.nan
    for tokens in range(TOTAL // 12, TOTAL + 1, TOTAL // 12):
        loss = final * float(SURROGATE.normalized(tokens / TOTAL, Schedule(), TAU, TPP)[0])
        trial.report(loss, step=tokens)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return loss


def readme_study(url: str, name: str = "plain") -> optuna.Study:
    """A finished 6-trial study whose controls were given to the pruner only (README, "In a plain Optuna
    objective"); run in memory, then copied to ``url``."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    memory = optuna.storages.InMemoryStorage()
    pruner = CollapsePruner(reference=SURROGATE, min_fraction=0.2, total_tokens=TOTAL, schedule="linear",
                            tau=TAU, tpp=TPP)
    study = optuna.create_study(storage=memory, study_name=name, pruner=pruner,
                                sampler=optuna.samplers.RandomSampler(seed=3))
    study.enqueue_trial({"lr": 0.01})
    study.optimize(objective, n_trials=6)
    optuna.copy_study(from_study_name=name, from_storage=memory, to_storage=url)
    return optuna.load_study(study_name=name, storage=url)


@pytest.fixture(scope="module")
def plain():
    shm = "/dev/shm"
    base = tempfile.mkdtemp(prefix="collapse-hpo-plain-", dir=shm if os.access(shm, os.W_OK) else None)
    try:
        url = f"sqlite:///{base}/study.db"
        study = readme_study(url)
        assert study.get_trials(states=[optuna.trial.TrialState.PRUNED]), "the sweep must prune something"
        yield {"url": url, "study": study}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _figure(study: optuna.Study) -> dict:
    from optuna_dashboard._custom_plot_data import get_plotly_graph_objects

    attrs = study._storage.get_study_system_attrs(study._study_id)
    return json.loads(get_plotly_graph_objects(attrs)[dashboard.FIGURE_ID])


def test_pruner_records_the_controls_it_judged_with(plain):
    study = optuna.load_study(study_name="plain", storage=plain["url"])
    for t in study.trials:
        assert t.user_attrs.get("collapse_decisions"), f"trial {t.number} was judged"
        assert {k: t.user_attrs[k] for k in CONTROL_ATTRS} == TrialControls.check(
            total_tokens=TOTAL, schedule="linear", tau=TAU, tpp=TPP, where="test").attrs()
        curve = trial_curve(t, TrialControls())  # what the dashboard reads, without the pruner's defaults
        assert curve is not None and curve.t_hat[-1] <= 1.0


def test_pruner_keeps_controls_a_trial_set_itself():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = CollapsePruner(reference=SURROGATE, min_fraction=0.2, total_tokens=TOTAL, tau=TAU, tpp=TPP)
    study = optuna.create_study(pruner=pruner)

    def obj(trial: optuna.Trial) -> float:
        trial.set_user_attr("tau", 0.2)
        for tokens in (300_000, 600_000):
            trial.report(3.0 * float(SURROGATE.normalized(tokens / TOTAL, Schedule(), 0.2, TPP)[0]),
                         step=tokens)
            trial.should_prune()
        return 3.0

    study.optimize(obj, n_trials=1)
    a = study.trials[0].user_attrs
    assert a["tau"] == 0.2 and (a["units"], a["total"]) == ("tokens", TOTAL) and a["tpp"] == TPP


def test_pruner_reads_tau_none_as_no_weight_decay_beside_a_trial_with_no_control_attrs():
    """A trial that sets only ``tau`` None (no weight decay) is read without weight decay, also after a trial
    with no control attr at all was read with the pruner's defaults: the pruner's memo of parsed controls
    keyed both alike before (every attr's id was None's), and gave the second one the default τ."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = CollapsePruner(reference=SURROGATE, min_fraction=0.2, total_tokens=TOTAL, tau=TAU, tpp=TPP)
    study = optuna.create_study(pruner=pruner)
    for attrs in ({}, {"tau": None}, {"total_tokens": 2 * TOTAL}):
        study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, user_attrs=attrs,
                                                  intermediate_values={100_000: 3.0, 200_000: 2.8}))
    bare, no_decay, legacy = (view.controls for view in pruner._views_of(study.get_trials(deepcopy=False)))
    assert bare.tau == TAU and bare.total == TOTAL
    assert no_decay.tau is None and no_decay.total == TOTAL
    assert legacy.total == 2 * TOTAL and legacy.tau == TAU


def test_figure_takes_the_reference_from_the_decision_logs(plain):
    study = optuna.load_study(study_name="plain", storage=plain["url"])
    assert {e["reference"] for t in study.trials for e in t.user_attrs["collapse_decisions"]} == {"surrogate"}
    result = dashboard.publish(study)  # no reference=...: what `collapse-hpo dashboard --storage` does
    assert result.reference == "surrogate"
    fig = _figure(study)
    names = [t.get("name") for t in fig["data"]]
    assert names.count("reference ℓ̂ (linear, τ=0.1, TPP=20)") == 1
    assert sum(1 for n in names if n and n.startswith("trial ")) == len(study.trials)
    assert "pass reference" not in fig["layout"]["title"]["text"]
    # the reference drawn is the pruner's surrogate
    ref = next(t for t in fig["data"] if t.get("name", "").startswith("reference"))
    expected = SURROGATE.normalized(np.asarray(ref["x"]), Schedule(), TAU, TPP)
    assert np.allclose(ref["y"], expected)


def test_without_any_judgement_the_figure_says_so():
    study = optuna.create_study()
    surrogate, label = dashboard.find_reference(study)
    assert surrogate is None and "pass reference" not in label and "judged" in label


def test_study_note_points_to_the_study_page(plain):
    study = optuna.load_study(study_name="plain", storage=plain["url"])
    note = dashboard.study_note(study, "surrogate")
    assert "Analytics" not in note and "on this study's page" in note


def test_legend_names_one_reference_once():
    """τ = B/(ηλD) differs in its last digits between trials: one reference curve, one legend entry."""
    study = optuna.create_study()
    for i, tau in enumerate((0.1, 0.1 * (1 + 1e-12), 0.1 * (1 - 1e-12))):
        steps = {s: 3.0 * float(SURROGATE.normalized(s / TOTAL, Schedule(), TAU, TPP)[0])
                 for s in range(100_000, TOTAL + 1, 100_000)}
        study.add_trial(optuna.trial.create_trial(
            value=steps[TOTAL] + i, params={}, distributions={}, intermediate_values=steps,
            user_attrs=TrialControls.check(total_tokens=TOTAL, tau=tau, tpp=TPP, where="t").attrs(),
        ))
    fig = dashboard.curves_figure(study, SURROGATE, "surrogate")
    names = [t.name for t in fig.data if t.name and t.name.startswith("reference")]
    assert names == ["reference ℓ̂ (linear, τ=0.1, TPP=20)"]


class _TuneTrial:
    """The parts of ray.tune.experiment.Trial the scheduler uses, with the search's drawn values."""

    def __init__(self, trial_id: str, config: dict, evaluated: dict) -> None:
        self.trial_id, self.config, self.status = trial_id, config, "RUNNING"
        self.evaluated_params = evaluated
        self.max_failures, self.failures = 0, 0

    def should_recover(self) -> bool:
        return False


def test_ray_mirror_keeps_constant_config_keys_out_of_the_params(tmp_path):
    from collapse_hpo.hpo.ray_side.scheduler import CollapseScheduler
    from collapse_hpo.hpo.rule.decision import PruneSettings

    url = f"sqlite:///{tmp_path / 'm.db'}"
    s = CollapseScheduler(reference=SURROGATE, tau=TAU, tpp=TPP, state_path=tmp_path / "state.json",
                          settings=PruneSettings(min_fraction=0.2), storage=url, study_name="m")
    assert s.set_search_properties(None, None)
    for i, lr in enumerate((0.01, 0.03)):
        trial = _TuneTrial(f"t{i}", {"lr": lr, "report_every": 10, "opt": {"beta": 0.9, "eps": 1e-8}},
                           {"lr": lr, "opt/beta": 0.9})
        s.on_trial_add(None, trial)
        for t in (0.1, 0.2):
            s.on_trial_result(None, trial, {"loss": 3.0 * (1 + i) * float(
                SURROGATE.normalized(t, Schedule(), TAU, TPP)[0]), "t_hat": t})
    mirrored = optuna.load_study(study_name="m", storage=url).trials
    assert [t.params for t in mirrored] == [{"lr": 0.01, "opt/beta": 0.9}, {"lr": 0.03, "opt/beta": 0.9}]
    assert mirrored[0].user_attrs["ray_config"]["report_every"] == 10  # kept, but not a parameter


def test_report_shows_pruned_curves_above_the_old_range(tmp_path, monkeypatch):
    """The raw-loss panel reached only 1.6× the lowest loss: pruned curves that end higher were cut off."""
    import matplotlib
    import matplotlib.figure

    from collapse_hpo.hpo.outputs import report

    matplotlib.use("Agg")
    study = optuna.create_study()
    for i, final in enumerate((2.0, 3.6)):
        steps = {s: final * float(SURROGATE.normalized(s / TOTAL, Schedule(), TAU, TPP)[0])
                 for s in range(100_000, (TOTAL if i == 0 else 400_000) + 1, 100_000)}
        attrs = TrialControls.check(total_tokens=TOTAL, tau=TAU, tpp=TPP, where="t").attrs()
        if i == 1:
            attrs.update(predicted_final_loss=3.6, predicted_low=3.5, predicted_high=3.7,
                         decision_fraction=0.4)
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.COMPLETE if i == 0 else optuna.trial.TrialState.PRUNED,
            value=steps[max(steps)] if i == 0 else None, params={}, distributions={},
            intermediate_values=steps, user_attrs=attrs,
        ))
    pruned_last = study.trials[1].intermediate_values[400_000]
    seen: list[tuple[float, float]] = []
    save = matplotlib.figure.Figure.savefig

    def spy(self, *args, **kw):
        seen.append(self.axes[0].get_ylim())
        return save(self, *args, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    report.plot_curves(tmp_path / "curves.png", study)
    low, high = seen[0]
    assert pruned_last > 2.0 * 1.6 and high >= max(pruned_last, 3.7)
    assert low < 2.0


@pytest.mark.slow
def test_screenshot_shows_the_collapse_figure_of_a_plain_optuna_study(plain, tmp_path):
    """`collapse-hpo dashboard --storage URL` on the README's plain study: the study page shows the curves."""
    need_chromium()
    study = optuna.load_study(study_name="plain", storage=plain["url"])
    with served(plain["url"]) as (url, lines):
        page = f"{url}studies/{study._study_id}"
        shot = Path(os.environ.get("COLLAPSE_HPO_SHOT_DIR", tmp_path)) / "dashboard_plain_optuna.png"
        chromium(["--virtual-time-budget=20000", "--window-size=1400,2400", f"--screenshot={shot}", page],
                 str(tmp_path / "p2"))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        # left of x = 480 at 1400 px: the collapse figure's curves (first on the page,
        # hpo/outputs/dashboard_page.py);
        # the other plots use plotly's own palette, not the figure's colours. An empty figure leaves none.
        pixels = trial_pixels(shot, (0, 0, 480, 2400))
        assert pixels >= 200, pixels  # the curves are drawn, not an empty frame
        assert any("reference: surrogate" in x for x in lines), lines

        dom = chromium(["--virtual-time-budget=20000", "--dump-dom", page], str(tmp_path / "p1"))
        html = dom.stdout.decode("utf-8", "replace")
        assert "Collapsed curves" in html, dom.stderr.decode()[-2000:]
        assert "reference: surrogate" in html and "pass reference" not in html
        assert html.count("trace scatter") >= len(study.trials) + 1  # every trial's curve and the reference
