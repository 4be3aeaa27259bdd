"""CollapsePruner in a plain Optuna study, one process: pruning, state in storage, references, robustness."""

from __future__ import annotations

import doctest
import json
import math

import numpy as np
import optuna
import pytest

from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner, set_trial_controls, trial_decisions
from collapse_hpo.hpo.rule.decision import PruneSettings, decide
from collapse_hpo.hpo.rule.record import (
    DECISIONS_ATTR,
    SAMPLER_STEP_ATTR,
    STUDY_REFERENCE_ATTR,
    TrialControls,
    trial_points,
)
from collapse_hpo.hpo.rule.reference import (
    REFIT_GROWTH,
    OnlineReference,
    StudyReference,
    SurrogateReference,
    fit_surrogate,
    make_reference,
    reference_curves,
    scheduled_count,
)
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import Surrogate
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE, synthetic_curves

optuna.logging.set_verbosity(optuna.logging.WARNING)

TOTAL = 400_000  # tokens per trial
REPORTS = 40  # one report every 2.5% of training
SCHEDULE = Schedule()
TAU, TPP = 0.1, 20.0
PRUNED, COMPLETE = optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.COMPLETE



@pytest.fixture(scope="module")
def surrogate() -> Surrogate:
    """A surrogate calibrated on a synthetic family (3 τ at 20 TPP, two noise draws each, the sweeps' noise).
    Two runs per setting give it ``pair_bands``, so the default (paired) comparison is what the
    tests below exercise, not its unpaired fallback."""
    family = synthetic_curves(taus=(0.05, 0.1, 0.2), tpps=(20.0,), n_points=REPORTS, t_start=1.0 / REPORTS,
                              seeds=2, seed=1)
    fitted = fit_surrogate(family)
    assert fitted.pair_bands, "the paired comparison needs pair_bands"
    return fitted


def true_final(x: float) -> float:
    """The noise-free final loss of a trial with parameter x (best at x = 0.3)."""
    return 3.0 + 2.0 * (x - 0.3) ** 2


def objective(
    trial: optuna.trial.Trial, *, noise: float = 0.002, controls: bool = True, distortion: float = 0.0
) -> float:
    """A stand-in for training: the true surrogate's collapse curve times the final loss, with noise.

    ``distortion`` lifts the early curve by that fraction (1 + distortion · (1 − t̂)), for every trial alike.
    """
    x = trial.suggest_float("x", 0.0, 1.0)
    if controls:
        set_trial_controls(trial, total_tokens=TOTAL, schedule=SCHEDULE, tau=TAU, tpp=TPP)
    rng = np.random.default_rng(trial.number)
    final = true_final(x)
    loss = math.nan
    for i in range(1, REPORTS + 1):
        tokens = TOTAL * i // REPORTS
        shape = float(TRUE_SURROGATE.normalized(tokens / TOTAL, SCHEDULE, TAU, TPP)[0])
        shape *= 1.0 + distortion * (1.0 - tokens / TOTAL)
        loss = final * shape * (1.0 + noise * float(rng.standard_normal()))
        trial.report(loss, step=tokens)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return loss


def run_study(pruner: CollapsePruner, n_trials: int, *, storage=None, name=None, seed=0, **kw):
    study = optuna.create_study(storage=storage, study_name=name, pruner=pruner,
                                sampler=optuna.samplers.RandomSampler(seed=seed))
    study.optimize(lambda t: objective(t, **kw), n_trials=n_trials)
    return study


def test_docstring_example_prunes_only_trials_predicted_worse_than_the_best():
    # tests/test_docstring_examples.py runs the example as a doctest; here its study is checked further.
    examples = doctest.DocTestParser().get_examples(CollapsePruner.__doc__)
    namespace: dict = {}
    for example in examples:
        exec(compile(example.source, "CollapsePruner example", "exec"), namespace)
    pruned = namespace["study"].get_trials(states=[PRUNED])
    assert pruned, "the example is meant to show pruning"
    for t in pruned:
        assert t.user_attrs["predicted_final_loss"] > namespace["study"].best_value


def test_prunes_the_bad_trials_and_keeps_the_true_best(surrogate):
    study = run_study(CollapsePruner(reference=surrogate), n_trials=20)
    trials = study.get_trials()
    finals = {t.number: true_final(t.params["x"]) for t in trials}
    best = min(finals, key=finals.get)
    assert study.trials[best].state == COMPLETE and study.best_trial.number == best
    pruned = [t for t in trials if t.state == PRUNED]
    assert len(pruned) >= 8
    for t in trials:
        # Every trial clearly worse (>5%: past the 4% margin) than the best trial completed before it started
        # was pruned.
        earlier = [finals[u.number] for u in trials[: t.number] if u.state == COMPLETE]
        if earlier and finals[t.number] > 1.05 * min(earlier):
            assert t.state == PRUNED, (t.number, finals[t.number], min(earlier))
    for t in pruned:
        a = t.user_attrs
        assert a["predicted_final_loss"] == pytest.approx(finals[t.number], rel=0.01)
        assert a["predicted_low"] < a["predicted_final_loss"] < a["predicted_high"]
        assert 0.1 <= a["decision_fraction"] < 1.0 and "loss ratio at t_hat=" in a["prune_reason"]
        log = trial_decisions(t)
        assert log[-1]["prune"] and log[-1]["step"] == t.last_step
        assert all(not e["prune"] for e in log[:-1])
    for t in trials:
        if t.state == COMPLETE:
            assert all(not e["prune"] for e in trial_decisions(t))


def test_a_decision_is_made_once_and_survives_a_restarted_pruner(surrogate, db_dir):
    storage = f"sqlite:///{db_dir / 's.db'}"
    study = run_study(CollapsePruner(reference=surrogate), n_trials=3, storage=storage, name="s")
    # A clearly bad trial, driven by hand: judged at t̂ = 0.3.
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0.0, 1.0)})
    set_trial_controls(trial, total_tokens=TOTAL, tau=TAU, tpp=TPP)
    final = 4.0
    for i in range(1, 13):
        tok = TOTAL * i // REPORTS
        trial.report(final * float(TRUE_SURROGATE.normalized(tok / TOTAL, SCHEDULE, TAU, TPP)[0]), step=tok)
    assert trial.should_prune() is True
    first = study._storage.get_trial(trial._trial_id).user_attrs
    assert trial.should_prune() is True
    # A new pruner object (a restarted driver) and a new Study object read the same answer from storage.
    again = optuna.load_study(study_name="s", storage=storage, pruner=CollapsePruner(reference=surrogate))
    assert optuna.trial.Trial(again, trial._trial_id).should_prune() is True
    after = again._storage.get_trial(trial._trial_id).user_attrs
    assert after == first and len(after[DECISIONS_ATTR]) == 1
    # Once pruned, a later report does not revive it.
    trial.report(1.0, step=TOTAL // 2)
    assert trial.should_prune() is True
    assert len(again._storage.get_trial(trial._trial_id).user_attrs[DECISIONS_ATTR]) == 1
    study.tell(trial, state=PRUNED)


def test_surrogate_file_reference_from_config(surrogate, tmp_path):
    path = tmp_path / "surrogate.json"
    surrogate.save(path)
    pruner = CollapsePruner.from_config({"reference": str(path), "min_fraction": 0.2, "keep_top_k": 2,
                                         "total_tokens": TOTAL, "tau": TAU, "tpp": TPP})
    assert pruner.settings == PruneSettings(min_fraction=0.2, keep_top_k=2)
    assert isinstance(pruner.reference, SurrogateReference)
    study = run_study(pruner, n_trials=12, controls=False)  # controls from the pruner's defaults
    pruned = study.get_trials(states=[PRUNED])
    assert pruned and all(t.user_attrs["decision_fraction"] >= 0.2 for t in pruned)
    assert all(e["reference"] == "file:surrogate.json" for t in pruned for e in trial_decisions(t))


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"reference": "x.json", "patience": 3}, r"unknown setting.*patience"),
        ({"min_fraction": 0.1}, "missing 'reference'"),
        ({"reference": "online", "min_fraction": 1.5}, "min_fraction"),
        ({"reference": "online", "total_tokens": -5}, "total_tokens"),
        ({"reference": "online", "schedule": "zigzag"}, "schedule"),
        ({"reference": "online", "report_prediction": "yes"}, "report_prediction"),
        ({"reference": "online", "judge_every": 1.0}, "judge_every"),
        ({"reference": {"online": True, "min_trials": 1}}, "min_trials"),
        ({"reference": {"surrogate": "a.json", "study": "b"}}, "exactly one"),
        ({"reference": {"study": "b"}}, "storage"),
        ({"reference": {"online": True, "patience": 2}}, "unknown field"),
        ({"reference": {"online": True, "refit": 2}}, "'refit' must be one of"),
        ({"reference": {"online": True, "prior": 2}}, "'prior' must be"),
        ({"reference": 42}, "expected a surrogate JSON path"),
        ({"reference": "/nonexistent/surrogate.json"}, "no such surrogate file"),
        ({"reference": "onlne"}, "onlne: no such surrogate file; did you mean 'online'"),
    ],
)
def test_bad_settings_raise_one_line_input_errors(config, match):
    with pytest.raises(InputError, match=match) as err:
        CollapsePruner.from_config(config)
    assert "\n" not in str(err.value) and str(err.value).startswith("pruner:")


def test_a_corrupted_surrogate_file_names_the_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"format": "collapse-hpo-surrogate", "version": 1, "b_c": ')
    with pytest.raises(InputError, match=r"bad\.json"):
        CollapsePruner(reference=path)
    path.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(InputError, match="not a collapse-hpo surrogate"):
        make_reference({"surrogate": str(path)})


def test_paired_rule_prunes_before_any_trial_completes_the_reference(db_dir):
    # Every trial has equal controls: the paired rule compares their losses at equal t̂, no surrogate needed.
    # Until 3 trials complete, the prediction shown comes from the builtin prior, tested on the sweep's
    # curves.
    storage = f"sqlite:///{db_dir / 'early.db'}"
    pruner = CollapsePruner(reference={"online": True, "min_trials": 3, "max_trials": 3})
    study = run_study(pruner, n_trials=10, storage=storage, name="early")
    trials = study.get_trials()
    finals = {t.number: true_final(t.params["x"]) for t in trials}
    assert trials[min(finals, key=finals.get)].state == COMPLETE
    before = [t for t in trials if t.state == PRUNED
              and sum(u.state == COMPLETE for u in trials[: t.number]) < 3]
    assert before, "some trial is pruned while the online reference still waits for 3 completed trials"
    for t in before:
        entry = trial_decisions(t)[-1]
        assert entry["reason"].startswith("predicted final loss")
        assert "loss ratio at t_hat=" in entry["reason"]
        assert entry["reference"].startswith("prior:builtin;")  # tested on the trials that ran furthest
        assert entry["predicted_low"] <= entry["predicted_final_loss"] <= entry["predicted_high"]
        assert finals[entry["threshold_trial"]] < finals[t.number]
    pruner.reference.wait(60)


def test_online_reference_waits_for_completed_trials_then_prunes(db_dir):
    storage = f"sqlite:///{db_dir / 'online.db'}"
    # The interval rule needs a surrogate, so it waits for the online reference (the paired rule does not:
    # see test_paired_rule_prunes_before_any_trial_completes).
    pruner = CollapsePruner(reference={"online": True, "min_trials": 3, "prior": "none", "refit": "inline"},
                            comparison="interval")
    study = run_study(pruner, n_trials=10, storage=storage, name="online")
    trials = study.get_trials()
    first_three = [t for t in trials if t.state == COMPLETE][:3]
    assert all(t.number < 3 for t in first_three)
    for t in trials[:3]:
        assert t.state == COMPLETE
        assert "online calibration: " in t.user_attrs["prune_reason"]
        assert "need 3 before pruning starts" in t.user_attrs["prune_reason"]
    pruned = study.get_trials(states=[PRUNED])
    assert pruned
    labels = {e["reference"] for t in pruned for e in trial_decisions(t)}
    assert all(label.startswith("online:0,1,2") for label in labels)
    completed = [t.number for t in trials if t.state == COMPLETE]
    # The last fit stored is of the trials completed by the last judgement.
    assert set(study.user_attrs[STUDY_REFERENCE_ATTR]["trials"]) <= set(completed)
    # A fresh reference (another worker, a restarted driver) fits the first completed trials up to the last
    # point of the refit schedule reached (3, 4, 6, 9, ...; one worker: they completed in number order) and
    # stores the fit ...
    fresh, label = OnlineReference(min_trials=3, prior="none", refit="inline").get(study, TrialControls())
    first = completed[: scheduled_count(len(completed), 3, REFIT_GROWTH)]
    assert label.split(";")[0] == "online:" + ",".join(map(str, first))
    curves, numbers = reference_curves([t for t in trials if t.number in first], TrialControls())
    assert numbers == first
    stored = study.user_attrs[STUDY_REFERENCE_ATTR]
    assert stored["trials"] == first
    assert Surrogate.from_dict(stored["surrogate"]).to_dict() == fit_surrogate(curves).to_dict()
    # ... which the next one reuses as it is.
    again, again_label = OnlineReference(min_trials=3, prior="none", refit="inline").get(study,
                                                                                        TrialControls())
    assert again_label == label and again.to_dict() == fresh.to_dict()


def test_study_reference_calibrates_on_another_study(db_dir):
    storage = f"sqlite:///{db_dir / 'family.db'}"
    family = optuna.create_study(storage=storage, study_name="family")
    for c in synthetic_curves(taus=(0.05, 0.1, 0.2), tpps=(20.0,), n_points=REPORTS, t_start=1.0 / REPORTS):
        t = family.ask()
        set_trial_controls(t, total_tokens=TOTAL, schedule=c.schedule, tau=c.tau, tpp=c.tpp)
        for th, y in zip(c.t_hat, c.loss):
            t.report(float(y), step=round(th * TOTAL))
        family.tell(t, float(c.loss[-1]))
    incomplete = family.ask()  # a running trial is not a reference curve
    incomplete.report(3.0, step=1000)
    ref = make_reference({"study": "family", "storage": storage})
    assert isinstance(ref, StudyReference)
    study = run_study(CollapsePruner(reference=ref), n_trials=12)
    pruned = study.get_trials(states=[PRUNED])
    assert pruned
    assert {e["reference"] for t in pruned for e in trial_decisions(t)} == {"study:family(3 trials)"}
    with pytest.raises(InputError, match="not found"):
        StudyReference("nope", storage).get(study, TrialControls())
    small = StudyReference("family", storage, min_trials=5)
    surrogate, why = small.get(study, TrialControls())
    assert surrogate is None and "need 5" in why


def test_report_prediction_gives_the_sampler_the_predicted_final_loss(surrogate):
    study = run_study(CollapsePruner(reference=surrogate, report_prediction=True), n_trials=14)
    pruned = study.get_trials(states=[PRUNED])
    assert pruned
    for t in pruned:
        pred = t.user_attrs["predicted_final_loss"]
        assert t.user_attrs[SAMPLER_STEP_ATTR] == TOTAL and t.last_step == TOTAL
        assert t.intermediate_values[TOTAL] == pred and t.value == pred
        # The curve readers leave the sampler point out: the stored curve ends where the trial stopped.
        steps, _ = trial_points(t)
        assert steps[-1] == trial_decisions(t)[-1]["step"] < TOTAL
    # TPE ranks pruned trials by (-last step, value): with one last step for all, by the prediction.
    assert study.best_trial.state == COMPLETE
    assert all(t.value > study.best_value for t in pruned)


class _Curve:
    """Objectives with one defect each, for the robustness tests."""

    @staticmethod
    def values(final: float = 3.5) -> list[tuple[int, float]]:
        out = []
        for i in range(1, REPORTS + 1):
            tok = TOTAL * i // REPORTS
            out.append((tok, final * float(TRUE_SURROGATE.normalized(tok / TOTAL, SCHEDULE, TAU, TPP)[0])))
        return out


def _drive(study: optuna.Study, points, *, controls: dict | None = None):
    """Report ``points`` (step, loss) in the given order, asking should_prune after each; stop when pruned."""
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0.0, 1.0)})
    if controls is None:
        set_trial_controls(trial, total_tokens=TOTAL, tau=TAU, tpp=TPP)
    else:
        for k, v in controls.items():
            trial.set_user_attr(k, v)
    pruned = False
    for step, loss in points:
        trial.report(loss, step=step)
        if trial.should_prune():
            pruned = True
            break
    study.tell(trial, state=PRUNED) if pruned else study.tell(trial, points[-1][1])
    return study.trials[trial.number], pruned


@pytest.fixture
def study_with_best(surrogate):
    study = optuna.create_study(pruner=CollapsePruner(reference=surrogate))
    _drive(study, _Curve.values(3.0))
    return study


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_loss_prunes_at_once_with_the_reason(study_with_best, bad):
    points = _Curve.values(3.0)
    points[1] = (points[1][0], bad)
    t, pruned = _drive(study_with_best, points)
    assert pruned and t.last_step == points[1][0]
    assert "diverged" in t.user_attrs["prune_reason"] and trial_decisions(t)[-1]["prune"]


def test_negative_loss_prunes_with_the_reason(study_with_best):
    points = _Curve.values(3.0)
    points[15] = (points[15][0], -0.5)
    t, pruned = _drive(study_with_best, points)
    assert pruned and "must be positive" in t.user_attrs["prune_reason"]


def test_out_of_order_and_repeated_steps_never_crash(study_with_best):
    points = _Curve.values(3.0)
    shuffled = [*points[:8], points[9], points[8], *points[10:12], points[11], *points[12:]]
    with pytest.warns(UserWarning, match="already reported"):
        t, pruned = _drive(study_with_best, shuffled)
    assert not pruned and t.state == COMPLETE
    log = trial_decisions(t)
    steps = [e["step"] for e in log]
    assert steps == sorted(set(steps))
    assert any("arrived after a later step was judged" in e["reason"] for e in log)


def test_reports_past_the_end_are_ignored_with_the_reason(study_with_best):
    points = [*_Curve.values(3.0), (TOTAL + 10_000, 2.9)]
    t, pruned = _drive(study_with_best, points)
    assert not pruned and "past t_hat=1" in t.user_attrs["prune_reason"]


@pytest.mark.parametrize(
    ("controls", "match"),
    [
        ({}, "total unknown"),
        ({"total_tokens": TOTAL, "schedule": "zigzag", "tau": TAU, "tpp": TPP}, "schedule"),
        ({"total_tokens": "many", "tau": TAU, "tpp": TPP}, "total_tokens"),
        ({"total_tokens": TOTAL, "tau": None, "tpp": TPP}, "weight decay"),
    ],
)
def test_missing_or_malformed_controls_keep_the_trial_with_the_reason(study_with_best, controls, match):
    t, pruned = _drive(study_with_best, _Curve.values(5.0), controls=controls)
    assert not pruned and t.state == COMPLETE
    assert match in t.user_attrs["prune_reason"]


def test_a_trial_without_reports_is_not_judged(surrogate):
    study = optuna.create_study(pruner=CollapsePruner(reference=surrogate))
    trial = study.ask()
    assert trial.should_prune() is False
    assert study._storage.get_trial(trial._trial_id).user_attrs == {}


def test_a_maximizing_study_is_refused(surrogate):
    study = optuna.create_study(direction="maximize", pruner=CollapsePruner(reference=surrogate))
    trial = study.ask()
    trial.report(3.0, step=1)
    with pytest.raises(InputError, match="minimize"):
        trial.should_prune()


def test_set_trial_controls_validates_before_writing():
    study = optuna.create_study()
    trial = study.ask()
    with pytest.raises(InputError, match="total_tokens"):
        set_trial_controls(trial, total_tokens=0)
    with pytest.raises(InputError, match="tpp"):
        set_trial_controls(trial, total_tokens=TOTAL, tpp=math.nan)
    assert study.trials[0].user_attrs == {}
    set_trial_controls(trial, total_tokens=TOTAL, schedule="cosine", tau=math.inf, tpp=TPP)
    attrs = study.trials[0].user_attrs
    assert attrs == {"units": "tokens", "total": TOTAL, "schedule": Schedule(kind="cosine").to_dict(),
                     "tau": None, "tpp": TPP}
    assert TrialControls().merged(attrs, "t").schedule == Schedule(kind="cosine")


def test_logged_predictions_match_the_stored_curve(surrogate):
    study = run_study(CollapsePruner(reference=surrogate), n_trials=10)
    n_checked = 0
    for t in study.get_trials():
        steps, values = trial_points(t)
        for e in trial_decisions(t):
            used = steps <= e["step"]
            assert int(used.sum()) == e["n"]
            d = decide(steps[used] / TOTAL, values[used], surrogate=surrogate, schedule=SCHEDULE, tau=TAU,
                       tpp=TPP, competitors=[], settings=PruneSettings())
            assert d.prediction.final_loss == pytest.approx(e["predicted_final_loss"], rel=1e-12)
            n_checked += 1
    assert n_checked > 20


def test_competitors_are_read_from_their_atomic_log_not_half_written_attrs(surrogate):
    """Another worker may be between writing a competitor's predicted_final_loss and its predicted_high."""
    study = optuna.create_study(pruner=CollapsePruner(reference=surrogate))
    other = study.ask()
    entry = {"step": 100_000, "t_hat": 0.25, "n": 10, "prune": False, "predicted_final_loss": 3.0,
             "predicted_low": 2.95, "predicted_high": 3.05, "threshold": None, "threshold_trial": None,
             "reference": "surrogate", "reason": "kept"}
    other.set_user_attr(DECISIONS_ATTR, [entry])
    other.set_user_attr("predicted_final_loss", 3.0)  # the bounds not written yet
    t, pruned = _drive(study, _Curve.values(4.0))
    assert pruned
    last = trial_decisions(t)[-1]
    assert last["threshold"] == 3.05 and last["threshold_trial"] == other.number


def test_paired_comparison_is_immune_to_a_reference_miss_the_whole_sweep_shares():
    # The sweep's curves sit 8% above (or below) the reference shape early on, all trials alike: a reference
    # from another setting. The unpaired rule compares biased predictions with real final losses: with +8%
    # it prunes the true best, with -8% it prunes less. The paired rule compares predictions made at the
    # same fraction, where the shared miss cancels: the same trials are pruned with or without it.
    family = synthetic_curves(taus=(0.05, 0.1, 0.2), tpps=(20.0,), n_points=REPORTS, t_start=1.0 / REPORTS,
                              seeds=2, seed=1)
    reference = fit_surrogate(family)
    assert [b.n for b in reference.pair_bands] == [6] * len(reference.error_bands)

    def run(comparison: str, distortion: float) -> tuple[set[int], float, bool]:
        study = optuna.create_study(pruner=CollapsePruner(reference=reference, comparison=comparison),
                                    sampler=optuna.samplers.RandomSampler(seed=0))
        study.optimize(lambda t: objective(t, distortion=distortion), n_trials=16)
        finals = {t.number: true_final(t.params["x"]) for t in study.trials}
        best = min(finals, key=finals.get)
        pruned = {t.number for t in study.trials if t.state == PRUNED}
        compute = sum(max(t.intermediate_values) for t in study.trials) / (16 * TOTAL)
        if comparison == "paired" and distortion:
            reasons = [study.trials[n].user_attrs["prune_reason"] for n in pruned]
            assert any("loss ratio at t_hat=" in r for r in reasons)
            for n in pruned:
                source = trial_decisions(study.trials[n])[-1]["threshold_trial"]
                assert source not in (None, n) and finals[source] < finals[n]
        return pruned, compute, best in pruned

    clean = run("paired", 0.0)
    assert clean[0] and not clean[2]
    assert run("paired", 0.08) == clean and run("paired", -0.08) == clean
    high, low = run("interval", 0.08), run("interval", -0.08)
    assert high[2]  # the unpaired rule cuts the true best when the reference flatters the competitors
    assert low[1] > clean[1] + 0.05 and not low[2]  # and spends more when it flatters the trial


def test_a_misspelled_online_reference_suggests_online(tmp_path, monkeypatch):
    """`CollapsePruner(reference='onlne')` said only "no such surrogate file"; a string that is not a file and
    reads as 'online' now suggests it (make_reference, shared by the pruner and CollapseScheduler), a file of
    that name is still read, and a path far from 'online' gets no such hint."""
    monkeypatch.chdir(tmp_path)
    for spec in ("onlne", "Onlin", "'online'", "onilne"):
        with pytest.raises(InputError, match=f"^{spec}: no such surrogate file; did you mean 'online'"):
            CollapsePruner(reference=spec)
    with pytest.raises(InputError) as err:
        CollapsePruner(reference="surrogate.json")
    assert "did you mean" not in str(err.value)
    TRUE_SURROGATE.save(tmp_path / "onlne")
    assert isinstance(make_reference("onlne"), SurrogateReference)
