"""CollapseScheduler driven through its Tune callbacks without a Ray cluster (stand-in Trial objects).

What a real Tune run cannot cheaply reach: tokens + total_tokens progress, divergence, replayed and
out-of-order results, errors with and without a retry, trials stopped by something else, a restored scheduler
reading its state file, pickling, and bad settings.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import optuna
import pytest
import ray.cloudpickle as cloudpickle
from ray.tune.schedulers import TrialScheduler

from collapse_hpo.hpo.ray_side.scheduler import STATE_FORMAT, CollapseScheduler
from collapse_hpo.hpo.rule.decision import PruneSettings
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import ErrorBand, Surrogate

SURROGATE = Surrogate(b_c=0.5, b_e=0.3, q_c=1.0, q_e=0.1,
                      error_bands=[ErrorBand(fraction=0.1, n=20, bias=0.0, scale=0.01, max_abs=0.03)])
TAU, TPP, TOTAL = 0.1, 20.0, 1_000_000
STOP, CONTINUE = TrialScheduler.STOP, TrialScheduler.CONTINUE


class FakeTrial:
    """The parts of ray.tune.experiment.Trial the scheduler uses."""

    def __init__(self, trial_id: str, config: dict, max_failures: int = 0) -> None:
        self.trial_id, self.config, self.status = trial_id, config, "RUNNING"
        self.max_failures, self.failures = max_failures, 0

    def should_recover(self) -> bool:
        return self.failures <= self.max_failures


def loss_at(final: float, t: float) -> float:
    return final * float(SURROGATE.normalized(t, Schedule(), TAU, TPP)[0])


@pytest.fixture
def fast(tmp_path):
    shm = "/dev/shm"
    base = tempfile.mkdtemp(prefix="collapse-hpo-unit-", dir=shm if os.access(shm, os.W_OK) else None)
    yield Path(base)
    shutil.rmtree(base, ignore_errors=True)


def make(state: Path, **kw) -> CollapseScheduler:
    kw.setdefault("settings", PruneSettings(min_fraction=0.2))
    s = CollapseScheduler(reference=SURROGATE, tau=TAU, tpp=TPP, state_path=state, **kw)
    assert s.set_search_properties(None, None)
    return s


def run_trial(s, trial, final, steps=20, tokens=False, stop_at=None):
    """Report a curve of ``steps`` points; return the t̂ at which the scheduler said STOP (None: never)."""
    s.on_trial_add(None, trial)
    for i in range(1, steps + 1):
        t = i / steps
        result = {"loss": loss_at(final, t), ("tokens" if tokens else "t_hat"): t * TOTAL if tokens else t}
        if s.on_trial_result(None, trial, result) == STOP:
            s.on_trial_complete(None, trial, result)
            return t
        if stop_at is not None and t >= stop_at:
            s.on_trial_complete(None, trial, result)
            return None
    s.on_trial_complete(None, trial, result)
    return None


def test_tokens_progress_and_optuna_mirror(tmp_path, fast):
    url = f"sqlite:///{fast / 'm.db'}"
    s = make(tmp_path / "state.json", time_attr="tokens", total_tokens=TOTAL, storage=url, study_name="u",
             param_distributions={"lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)},
             report_prediction=True)
    a_trial = FakeTrial("a", {"lr": 0.01, "opt": {"beta": 0.9}, "name": "x"})
    assert run_trial(s, a_trial, 3.0, tokens=True, steps=10) is None
    t_stop = run_trial(s, FakeTrial("b", {"lr": 0.05, "opt": {"beta": 0.9}, "name": "y"}), 3.5, tokens=True,
                       steps=10)
    assert t_stop is not None and 0.2 <= t_stop < 1.0
    recs = s.records
    assert recs["a"].status == "complete" and recs["a"].final_loss == pytest.approx(3.0)
    assert recs["b"].status == "pruned" and recs["b"].t_hat[-1] == pytest.approx(t_stop)
    trials = {t.user_attrs["ray_trial_id"]: t for t in optuna.load_study(study_name="u", storage=url).trials}
    a, b = trials["a"], trials["b"]
    assert a.state.name == "COMPLETE" and a.value == pytest.approx(3.0)
    assert max(a.intermediate_values) == TOTAL and a.user_attrs["total"] == TOTAL  # step = tokens
    assert a.user_attrs["units"] == "tokens"
    assert a.params == {"lr": 0.01, "opt/beta": 0.9}  # numbers become params, strings stay in ray_config
    assert a.distributions["lr"].log and a.user_attrs["ray_config"]["name"] == "x"
    assert b.state.name == "PRUNED"
    assert b.user_attrs["predicted_final_loss"] == pytest.approx(3.5, rel=0.01)
    assert b.value == b.user_attrs["predicted_final_loss"]  # report_prediction: the value is the prediction
    assert b.user_attrs["decision_fraction"] == pytest.approx(t_stop)
    assert b.user_attrs["collapse_decisions"][-1]["prune"] is True
    assert "CollapseScheduler: 0 running, 1 pruned, 1 complete" in s.debug_string()


def test_divergence_replays_and_out_of_order_results(tmp_path):
    s = make(tmp_path / "state.json")
    good, bad = FakeTrial("g", {}), FakeTrial("n", {})
    s.on_trial_add(None, bad)
    assert s.on_trial_result(None, bad, {"loss": 4.0, "t_hat": 0.05}) == CONTINUE
    assert s.on_trial_result(None, bad, {"loss": math.nan, "t_hat": 0.1}) == STOP  # before min_fraction
    assert "diverged" in s.records["n"].decision["prune_reason"]
    s.on_trial_add(None, good)
    for t in (0.1, 0.2, 0.3):
        assert s.on_trial_result(None, good, {"loss": loss_at(3.0, t), "t_hat": t}) == CONTINUE
    n = len(s.records["g"].t_hat)
    # a repeated and an out-of-order report, and results without the metric or progress: ignored
    assert s.on_trial_result(None, good, {"loss": 9.9, "t_hat": 0.3}) == CONTINUE
    assert s.on_trial_result(None, good, {"loss": 9.9, "t_hat": 0.15}) == CONTINUE
    assert s.on_trial_result(None, good, {"loss": 9.9}) == CONTINUE
    assert s.on_trial_result(None, good, {"t_hat": 0.4}) == CONTINUE
    rec = s.records["g"]
    assert len(rec.t_hat) == n and rec.replayed == 2 and 9.9 not in rec.loss
    # once pruned, every later result of that trial is STOP
    assert s.on_trial_result(None, bad, {"loss": 3.0, "t_hat": 0.5}) == STOP


def test_a_restored_scheduler_continues_from_its_state_file(tmp_path):
    state = tmp_path / "state.json"
    blank = cloudpickle.dumps(make(state))  # what Tuner.restore unpickles: the scheduler before fit
    first = cloudpickle.loads(blank)
    assert run_trial(first, FakeTrial("best", {}), 3.0) is None
    t_bad = run_trial(first, FakeTrial("bad", {}), 3.6)
    assert t_bad is not None
    mid = FakeTrial("mid", {})
    run_trial(first, mid, 3.3, stop_at=0.1)  # interrupted at t̂ = 0.1 (before any judgement)
    assert first.records["mid"].status == "stopped"

    second = cloudpickle.loads(blank)
    for tid in ("best", "bad", "mid"):
        second.on_trial_add(None, FakeTrial(tid, {}))
    bad_again, mid_again = FakeTrial("bad", {}), FakeTrial("mid", {})
    assert second.on_trial_result(None, bad_again, {"loss": 4.0, "t_hat": 0.1}) == STOP  # pruned before
    # the interrupted trial reruns from scratch: replayed points are answered, then it is judged against
    # the completed trial the scheduler remembers, and pruned
    for t in (0.05, 0.1, 0.15):
        assert second.on_trial_result(None, mid_again, {"loss": loss_at(3.3, t), "t_hat": t}) == CONTINUE
    assert second.records["mid"].replayed == 2
    assert second.on_trial_result(None, mid_again, {"loss": loss_at(3.3, 0.2), "t_hat": 0.2}) == STOP
    # without the file the same report is kept: nothing to compare with
    fresh = make(tmp_path / "other.json")
    fresh.on_trial_add(None, FakeTrial("mid", {}))
    for t in (0.05, 0.1, 0.15, 0.2):
        verdict = fresh.on_trial_result(None, FakeTrial("mid", {}), {"loss": loss_at(3.3, t), "t_hat": t})
    assert verdict == CONTINUE
    # trials of an old run that this session never adds are not competitors
    stale = cloudpickle.loads(blank)
    stale.on_trial_add(None, FakeTrial("new", {}))
    assert set(stale.records) == {"new"}


def test_errors_retries_and_trials_stopped_by_something_else(tmp_path, fast):
    url = f"sqlite:///{fast / 'm.db'}"
    s = make(tmp_path / "state.json", storage=url, study_name="e")
    retried = FakeTrial("r", {"lr": 0.1}, max_failures=1)
    s.on_trial_add(None, retried)
    s.on_trial_result(None, retried, {"loss": 4.0, "t_hat": 0.1})
    retried.failures = 1
    s.on_trial_error(None, retried)  # Tune retries it: not final
    assert s.records["r"].status == "running"
    s.on_trial_add(None, retried)
    retried.failures = 2
    s.on_trial_error(None, retried)  # out of retries: final
    assert s.records["r"].status == "error"
    early = FakeTrial("s", {"lr": 0.2})
    run_trial(s, early, 3.0, stop_at=0.5, steps=10)
    assert s.records["s"].status == "stopped"
    trials = {t.user_attrs["ray_trial_id"]: t for t in optuna.load_study(study_name="e", storage=url).trials}
    assert trials["r"].state.name == "FAIL" and trials["r"].user_attrs["fail_reason"]
    assert trials["s"].state.name == "PRUNED"
    assert "stopped by Ray Tune at t_hat=0.5" in trials["s"].user_attrs["prune_reason"]


def test_bad_settings_and_a_corrupted_state_file(tmp_path):
    with pytest.raises(InputError, match="mode must be 'min'"):
        CollapseScheduler(SURROGATE, mode="max")
    with pytest.raises(InputError, match="both storage and study_name"):
        CollapseScheduler(SURROGATE, storage="sqlite:///x.db")
    with pytest.raises(InputError, match="total_tokens must be a positive"):
        CollapseScheduler(SURROGATE, total_tokens=-5)
    with pytest.raises(InputError, match="needs storage"):
        CollapseScheduler("online")
    with pytest.raises(InputError, match="no such surrogate file"):
        CollapseScheduler(tmp_path / "missing.json")
    with pytest.raises(InputError, match="onlne: no such surrogate file; did you mean 'online'"):
        CollapseScheduler("onlne")
    with pytest.raises(InputError, match="mode must be 'min'"):
        CollapseScheduler(SURROGATE).set_search_properties("loss", "max")
    s = make(tmp_path / "s.json", controls=lambda c: {"lambda": 0.1})
    with pytest.raises(InputError, match="unknown key"):
        s.on_trial_add(None, FakeTrial("a", {}))
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "' + STATE_FORMAT + '", "version": 1, "trials": {"a": {"status": 3')
    with pytest.raises(InputError, match=r"bad\.json: unreadable CollapseScheduler state"):
        make(bad).on_trial_add(None, FakeTrial("a", {}))
    other = tmp_path / "other.json"
    other.write_text('{"format": "something-else"}')
    with pytest.raises(InputError, match="not a CollapseScheduler state file"):
        make(other).on_trial_add(None, FakeTrial("a", {}))


def test_per_trial_controls_from_the_config(tmp_path):
    s = make(tmp_path / "s.json", controls=lambda c: {"tau": c["tau"], "schedule": "cosine"},
             time_attr="tokens", total_tokens="budget")
    trial = FakeTrial("a", {"tau": 0.3, "budget": 2_000_000})
    s.on_trial_add(None, trial)
    s.on_trial_result(None, trial, {"loss": 4.0, "tokens": 500_000})
    rec = s.records["a"]
    assert rec.tau == 0.3 and rec.schedule["kind"] == "cosine" and rec.t_hat == [0.25]


def test_paired_comparison_reads_the_other_trials_curves_from_the_state(tmp_path):
    # A wide single-run error model (10%): a 6.7% worse trial is stopped only because the scheduler hands
    # the completed trial's curve to the paired comparison (equal controls: their loss ratio).
    wide = Surrogate(b_c=0.5, b_e=0.3, q_c=1.0, q_e=0.1,
                     error_bands=[ErrorBand(fraction=0.1, n=20, bias=0.0, scale=0.1, max_abs=0.3)],
                     pair_bands=[ErrorBand(fraction=0.1, n=20, bias=0.0, scale=0.005, max_abs=0.015)])
    outcomes = {}
    for comparison in ("paired", "interval"):
        s = CollapseScheduler(reference=wide, tau=TAU, tpp=TPP, state_path=tmp_path / f"{comparison}.json",
                              settings=PruneSettings(min_fraction=0.2, comparison=comparison))
        assert s.set_search_properties(None, None)
        assert run_trial(s, FakeTrial("a", {}), 3.0) is None
        outcomes[comparison] = run_trial(s, FakeTrial("b", {}), 3.2)
        if comparison == "paired":
            reason = s.records["b"].decision["prune_reason"]
            assert "loss ratio at t_hat=0.2" in reason and "pruned" in reason
    assert outcomes["paired"] == pytest.approx(0.2) and outcomes["interval"] is None


def test_a_judgement_rebuilds_only_the_competitors_that_moved(tmp_path, monkeypatch):
    # The scheduler hands the judge the same view object for a record that did not change, so the judge's
    # competitor cache answers for it; a running trial with a new report gets a new view (and competitor).
    from collapse_hpo.hpo.rule.judge import Judge

    built: list[object] = []
    original = Judge._competitor

    def counting(self, o):
        built.append(o.number)
        return original(self, o)

    monkeypatch.setattr(Judge, "_competitor", counting)
    s = make(tmp_path / "s.json", settings=PruneSettings(min_fraction=0.2), judge_every=0.0)
    for name in ("a", "b"):  # two completed trials
        assert run_trial(s, FakeTrial(name, {}), 3.0 + 0.01 * len(name)) is None
    c, d = FakeTrial("c", {}), FakeTrial("d", {})
    s.on_trial_add(None, c)
    s.on_trial_add(None, d)
    built.clear()
    for i in range(1, 11):  # c reports every step, d only at the first: a and b, then d, never change
        t = i / 20
        if i == 1:
            assert s.on_trial_result(None, d, {"loss": loss_at(3.0, t), "t_hat": t}) == CONTINUE
        assert s.on_trial_result(None, c, {"loss": loss_at(3.0, t), "t_hat": t}) == CONTINUE
    # c was judged at every report from t̂ 0.2 (judge_every 0): 7 entries in its log, one per t̂ 0.2 ... 0.5
    assert [e["t_hat"] for e in s.records["c"].log] == [i / 20 for i in range(4, 11)]
    by_number = {n: built.count(n) for n in set(built)}
    # Each other trial built at most once over all of c's judgements (a was already built at b's), d once.
    assert by_number.get("d") == 1 and set(by_number) <= {"a", "b", "d"}, by_number
    assert max(by_number.values()) == 1, by_number
    rec = s.records["d"]
    assert s._view(rec) is s._view(rec)
    before = s._view(s.records["c"])
    s.on_trial_result(None, c, {"loss": loss_at(3.0, 0.6), "t_hat": 0.6})
    assert s._view(s.records["c"]) is not before


def test_results_without_the_progress_key_are_said_once_and_the_trial_is_not_called_stopped_at_0(tmp_path):
    """A trainable written for another scheduler reports ``loss`` (Tune adds ``training_iteration``) but no
    ``t_hat``: every trial ran to its end, unjudged, without a word, and each was recorded as "stopped by Ray
    Tune at t_hat=0, before the end of training"."""
    import warnings

    from collapse_hpo.hpo.rule.judge import CollapseWarning

    s = make(tmp_path / "state.json")
    trials = [FakeTrial(f"w{k}", {"lr": 0.1 * (k + 1)}) for k in range(2)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for trial in trials:
            s.on_trial_add(None, trial)
            for i in range(1, 11):
                result = {"loss": 3.0 - i / 10, "training_iteration": i}
                assert s.on_trial_result(None, trial, result) == CONTINUE
            s.on_trial_complete(None, trial, result)
    said = [str(w.message) for w in caught if issubclass(w.category, CollapseWarning)]
    assert len(said) == 1, said
    assert "trial w0's result has no 't_hat' (time_attr)" in said[0]
    assert "time_attr='training_iteration'" in said[0]
    assert [w["key"] for w in s.warnings] == ["result_key_missing"]
    for trial in trials:
        rec = s.records[trial.trial_id]
        assert rec.status == "stopped"
        reason = rec.decision["prune_reason"]
        assert "never judged" in reason and "'t_hat'" in reason and "t_hat=0" not in reason


def test_a_second_run_into_the_same_mirror_is_said_once_and_a_restore_is_not(tmp_path, fast):
    """The same script run twice in one folder: Optuna loads the existing mirror study without a word, and the
    first run's completed trials join the second's online reference and report (the state file in that
    folder keeps the first run's records too). The second run says so, once; the first does not, nor does
    the first run restored (Tune re-adds its trials before their results come)."""
    import warnings

    from collapse_hpo.hpo.ray_side.scheduler import MIRROR_SHARED_WARNING
    from collapse_hpo.hpo.rule.judge import CollapseWarning

    url = f"sqlite:///{fast / 'mirror.db'}"
    blank = cloudpickle.dumps(make(tmp_path / "state.json", storage=url, study_name="m"))

    def run(names: tuple[str, ...], readd: tuple[str, ...] = ()) -> tuple[CollapseScheduler, list[str]]:
        s = cloudpickle.loads(blank)  # every run in the same folder: the same state file and mirror
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for name in readd:
                s.on_trial_add(None, FakeTrial(name, {}))
            for k, name in enumerate(names):
                run_trial(s, FakeTrial(name, {"lr": 0.1 * (k + 1)}), 3.0 + 0.1 * k)
        return s, [str(w.message) for w in caught if issubclass(w.category, CollapseWarning)]

    first, said = run(("a0", "a1"))
    assert not [m for m in said if "already holds" in m] and not first.warnings
    _, said = run(("a0",), readd=("a0", "a1"))  # the first run restored: its trials re-added, a0 rerun
    assert not [m for m in said if "already holds" in m]
    second, said = run(("b0", "b1"))  # run again in the same folder
    shared = [m for m in said if "already holds" in m]
    assert len(shared) == 1, said
    assert "mirror study 'm' already holds 2 trial(s) from earlier runs" in shared[0]
    assert "give a new study_name" in shared[0]
    assert [w["key"] for w in second.warnings] == [MIRROR_SHARED_WARNING]
