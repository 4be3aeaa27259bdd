"""The judge (hpo/rule/judge.py): one place around `decide`, the same decisions through both adapters.

The equivalence test feeds the same real training curves (studies/bench/artifacts, a τ-held LR sweep) to the
Optuna ``CollapsePruner`` and to the Ray ``CollapseScheduler`` (driven through its Tune callbacks, with an
Optuna mirror) and asserts that both write the identical decision log, trial by trial. The surrogate is
calibrated on other runs (the collapse family), has ``pair_bands``, so the default paired comparison is the
path exercised, and predicts curves it was not drawn from.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import optuna
import pytest
from ray.tune.schedulers import TrialScheduler

from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner, set_trial_controls, trial_decisions
from collapse_hpo.hpo.ray_side.scheduler import CollapseScheduler
from collapse_hpo.hpo.rule.decision import PruneSettings, decide
from collapse_hpo.hpo.rule.judge import Judge, TrialView, clean_reports
from collapse_hpo.hpo.rule.record import DECISIONS_ATTR, DecisionEntry, TrialControls
from collapse_hpo.predictors.calibrate import calibrate
from collapse_hpo.predictors.curves import read_curves_csv
from collapse_hpo.predictors.errors import InputError

ARTIFACTS = Path(__file__).resolve().parents[1] / "studies" / "bench" / "artifacts"
TOTAL = 1_000_000  # tokens per trial: step = round(t̂ · TOTAL)
# The best LR first, then worse and near-best ones: some are pruned, some finish.
RUNS = ("lr_tau_s0_10", "lr_tau_s0_00", "lr_tau_s0_09", "lr_tau_s0_04", "lr_tau_s0_14", "lr_tau_s0_06")


@pytest.fixture(scope="module")
def sweep():
    """The first runs of the LR sweep (real curves) and a surrogate calibrated on the collapse family."""
    by_run = {c.run: c for c in read_curves_csv(ARTIFACTS / "curves_lr_tau_full.csv")}
    curves = [by_run[r] for r in RUNS]
    surrogate = calibrate(read_curves_csv(ARTIFACTS / "curves_collapse_tau_full.csv")).surrogate
    assert surrogate.pair_bands, "the paired path needs a surrogate with pair_bands"
    return curves, surrogate


class FakeTrial:
    """The parts of ray.tune.experiment.Trial the scheduler uses."""

    def __init__(self, trial_id: str, config: dict) -> None:
        self.trial_id, self.config, self.status = trial_id, config, "RUNNING"

    def should_recover(self) -> bool:
        return False


def _points(curve):
    ok = np.isfinite(curve.loss)
    points = [(round(t * TOTAL), float(y)) for t, y in zip(curve.t_hat[ok], curve.loss[ok])]
    return points[1::2] if len(points) % 2 == 0 else points[::2]  # every other report; the last one kept


def _through_pruner(curves, surrogate, settings):
    pruner = CollapsePruner(reference=surrogate, min_fraction=settings.min_fraction,
                            confidence=settings.confidence, keep_top_k=settings.keep_top_k,
                            comparison=settings.comparison)
    study = optuna.create_study(pruner=pruner, storage=optuna.storages.InMemoryStorage())
    for c in curves:
        trial = study.ask()
        set_trial_controls(trial, total_tokens=TOTAL, schedule=c.schedule, tau=c.tau, tpp=c.tpp)
        pruned = False
        for step, loss in _points(c):
            trial.report(loss, step)
            if trial.should_prune():
                pruned = True
                break
        if pruned:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, loss)
    return [trial_decisions(t) for t in study.get_trials()]


def _through_scheduler(curves, surrogate, settings, tmp_path):
    by_run = {c.run: c for c in curves}
    url = f"sqlite:///{tmp_path / 'mirror.db'}"
    s = CollapseScheduler(reference=surrogate, metric="loss", time_attr="tokens", total_tokens=TOTAL,
                          controls=lambda config: {"schedule": by_run[config["run"]].schedule,
                                                   "tau": by_run[config["run"]].tau,
                                                   "tpp": by_run[config["run"]].tpp},
                          settings=settings, state_path=tmp_path / "state.json", storage=url,
                          study_name="mirror")
    assert s.set_search_properties(None, None)
    for i, c in enumerate(curves):
        trial = FakeTrial(f"t{i:02d}", {"run": c.run})
        s.on_trial_add(None, trial)
        for step, loss in _points(c):
            result = {"loss": loss, "tokens": step}
            if s.on_trial_result(None, trial, result) == TrialScheduler.STOP:
                break
        s.on_trial_complete(None, trial, result)
    study = optuna.load_study(study_name="mirror", storage=url)
    mirror = [t.user_attrs.get(DECISIONS_ATTR) or [] for t in study.get_trials()]
    state = [s.records[f"t{i:02d}"].log for i in range(len(curves))]
    return mirror, state


@pytest.mark.parametrize("comparison", ["paired", "interval"])
def test_pruner_and_scheduler_write_identical_decision_logs(sweep, tmp_path, comparison):
    curves, surrogate = sweep
    settings = PruneSettings(min_fraction=0.2, confidence=0.7, comparison=comparison)
    optuna_logs = _through_pruner(curves, surrogate, settings)
    mirror_logs, state_logs = _through_scheduler(curves, surrogate, settings, tmp_path)
    assert optuna_logs == mirror_logs == state_logs
    entries = [e for log in optuna_logs for e in log]
    assert any(e["prune"] for e in entries), "the sweep must prune something, or the test shows little"
    assert any(not log[-1]["prune"] for log in optuna_logs if log)
    if comparison == "paired":
        assert any("loss ratio at t_hat=" in e["reason"] for e in entries)  # τ held: equal controls
    pruned = [e for e in entries if e["prune"]]
    assert all(e["threshold_trial"] is not None for e in pruned)


def test_clean_reports_gives_decides_fraction():
    """The judge's cleaning reads reports exactly as `decide` does (the fraction it judges at)."""
    rng = np.random.default_rng(0)
    settings = PruneSettings(min_fraction=0.01)
    for _ in range(200):
        n = int(rng.integers(1, 8))
        t = rng.choice([0.1, 0.2, 0.3, 0.5, 1.0, 1.2, -0.1, math.nan], size=n)
        y = rng.choice([3.0, 2.5, 2.0, math.nan, -1.0], size=n, p=[0.3, 0.3, 0.3, 0.05, 0.05])
        r = clean_reports(t, y)
        d = decide(t, y, surrogate=None, schedule=TrialControls().schedule, tau=None, tpp=20.0,
                   competitors=(), settings=settings)
        assert r.diverged == d.prune
        if not d.prune:
            assert (math.isnan(r.fraction) and math.isnan(d.fraction)) or r.fraction == d.fraction
            assert r.notes == d.notes


def _view(number, state, losses, *, log=(), final=None):
    t = np.arange(1, len(losses) + 1) / 10
    return TrialView(number, state, (t * 1000).astype(int), t, np.asarray(losses, dtype=float),
                     TrialControls(total=1000, tau=0.2, tpp=20.0), final, tuple(log))


def _entry(step, prune=False, pred=3.0):
    return DecisionEntry(step=step, t_hat=step / 1000, n=1, prune=prune, predicted_final_loss=pred,
                         predicted_low=pred - 0.1, predicted_high=pred + 0.1, threshold=None,
                         threshold_trial=None, reference="r", reason="because")


def test_competitors_are_complete_and_running_trials_only():
    judge = Judge(PruneSettings())
    me = _view(0, "running", [4.0, 3.5])
    others = [
        _view(1, "complete", [4.0, 3.0], final=3.0),
        _view(2, "running", [4.0, 3.2], log=[_entry(200)]),
        _view(3, "running", [4.0]),  # no prediction yet
        _view(4, "pruned", [4.0, 3.9], log=[_entry(200, prune=True)]),
        _view(5, "other", [4.0, 3.9], final=2.0),  # failed or stopped
        _view(6, "complete", [4.0, math.nan], final=math.nan),
    ]
    comps, numbers = judge.competitors(me, [me, *others])
    assert numbers == [1, 2, 3]  # a running trial competes through its curve before its first prediction
    assert comps[0].final_loss == 3.0 and comps[1].latest.final_loss == 3.0
    assert comps[2].latest is None and comps[2].t_hat == (0.1,)
    assert comps[0].t_hat == (0.1, 0.2) and comps[0].tau == 0.2


def test_judge_every_and_recall():
    judge = Judge(PruneSettings(min_fraction=0.2), judge_every=0.25)
    reference = lambda: (None, "no reference")  # noqa: E731
    early = judge.judge(_view(0, "running", [4.0]), list, reference)
    assert early.entry is None and "not judged yet" in early.reason
    first = judge.judge(_view(0, "running", [4.0, 3.5]), list, reference)
    assert first.entry is not None and first.entry.step == 200
    assert "no reference surrogate, and no competitor with equal controls" in first.entry.reason
    interval = Judge(PruneSettings(min_fraction=0.2, comparison="interval"), judge_every=0.25)
    assert "no reference yet" in interval.judge(_view(0, "running", [4.0, 3.5]), list, reference).reason
    not_due = judge.judge(_view(0, "running", [4.0, 3.5, 3.4], log=[first.entry]), list, reference)
    assert not_due.decision is None and not_due.entry is None and not not_due.prune
    pruned = _view(0, "running", [4.0, 3.5, 3.4, 3.3], log=[_entry(200, prune=True)])
    assert judge.judge(pruned, list, reference).prune
    diverged = judge.judge(_view(0, "running", [4.0, 3.5, math.nan], log=[first.entry]), list, reference)
    assert diverged.prune and diverged.entry.step == 300


def test_bad_judge_every_is_refused_by_both_adapters(sweep):
    _, surrogate = sweep
    with pytest.raises(InputError, match="judge_every"):
        CollapsePruner(reference=surrogate, judge_every=1.5)
    with pytest.raises(InputError, match="judge_every"):
        CollapseScheduler(reference=surrogate, judge_every=-0.1)


def test_the_report_summary_equals_cleaning_the_whole_curve():
    """``ReportSummary`` (one report at a time, O(1) each) gives what ``clean_reports`` gives for the whole
    curve: the fraction, divergence and the notes, for curves with invalid, repeated and past-the-end t̂."""
    from collapse_hpo.hpo.rule.judge import ReportSummary

    rng = np.random.default_rng(3)
    for case in range(300):
        n = int(rng.integers(0, 12))
        t = np.round(rng.uniform(-0.2, 1.3, n), 1)
        t[rng.uniform(size=n) < 0.1] = np.nan
        y = rng.uniform(2.0, 4.0, n)
        if case % 5 == 0 and n:
            y[rng.integers(n)] = [np.nan, np.inf, -1.0, 0.0][case % 4]
        summary = ReportSummary()
        for a, b in zip(t, y):
            summary.add(a, b)
        got, want = summary.reports(), clean_reports(t, y)
        assert got.diverged == want.diverged and got.notes == want.notes, (t, y)
        assert got.fraction == want.fraction or (math.isnan(got.fraction) and math.isnan(want.fraction))
