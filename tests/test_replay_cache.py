"""Replay speed-ups are exact: the caches shared across trial orders, the pruner's reuse of unchanged trial
views, and the worker processes (``jobs``) change no decision (issue 15, replay speed)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from collapse_hpo.hpo.optuna_side import pruner
from collapse_hpo.hpo.replays import peers
from collapse_hpo.hpo.replays.replay import ReplayCaches, make_sweep, random_orders, replay, simulate
from collapse_hpo.hpo.rule import decision, judge, record, reference
from collapse_hpo.predictors import calibrate, predict, prior, schedules
from collapse_hpo.predictors.curves import Curve
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import ErrorBand
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE

BANDS = [ErrorBand(f, 12, 0.0, 0.004, 0.01) for f in (0.1, 0.3, 0.6)]
#: A calibrated-looking reference: error bands and paired bands, so trials with other controls are paired.
SURROGATE = dataclasses.replace(TRUE_SURROGATE, error_bands=BANDS, pair_bands=BANDS)


def tau_sweep(n: int = 10, points: int = 25, seed: int = 0) -> list[Curve]:
    """A random-search-like sweep: every trial has its own τ and warm-up (cosine decay), so the collapse rule
    compares trials through predictions, not loss ratios."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.04, 1.0, points)
    curves = []
    for i in range(n):
        tau = float(10 ** rng.uniform(-1.3, -0.3))
        sched = Schedule(kind="cosine", warmup=float(round(rng.uniform(0.0, 0.05), 3)))
        final = 3.0 * (1.0 + 0.04 * rng.standard_normal())
        noise = 1.0 + 0.002 * rng.standard_normal(points)
        loss = final * TRUE_SURROGATE.normalized(t, sched, tau, 20.0) * noise
        curves.append(Curve(run=f"r{i}", t_hat=t.copy(), loss=loss, schedule=sched, tau=tau, tpp=20.0))
    return curves


def quick_fit(curves: list[Curve]) -> object:
    """A stand-in for calibration (seconds each) that still depends on exactly the curves fitted."""
    mean_final = float(np.mean([c.loss[-1] for c in curves]))
    return dataclasses.replace(SURROGATE, b_c=0.4 + 0.05 * (mean_final % 1.0) + 0.01 * len(curves))


@pytest.fixture
def quick_online(monkeypatch):
    monkeypatch.setattr(reference, "_fit", quick_fit)


def disable_caches(m: pytest.MonkeyPatch) -> None:
    """Every cache of the replay path off: views rebuilt at each judgement, logs re-read, competitors rebuilt,
    schedules compared anew (as before the caches existed)."""
    m.setattr(pruner.CollapsePruner, "_views_of", lambda self, trials: [self._view(t) for t in trials])
    m.setattr(pruner, "read_log", lambda attrs, memo=None: record.read_log(attrs))
    original = judge.Judge.competitors

    def competitors(self, trial, others):
        self._competitors.clear()
        return original(self, trial, others)

    m.setattr(judge.Judge, "competitors", competitors)
    m.setattr(decision, "same_schedule", decision.same_schedule.__wrapped__)
    m.setattr(decision, "_on_grid", decision._on_grid.__wrapped__)
    # Issue 20 (replay speed): controls parsed at every read, competitors' paired predictions made anew
    # (no memo per competitor, none of their alignments shared), the last point before a fraction by a mask,
    # controls compared schedule first (the order of the checks before).
    m.setattr(pruner.CollapsePruner, "_merged",
              lambda self, attrs, where: self._defaults.merged(attrs, where))
    m.setattr(decision.Competitor, "memo", lambda self: None)
    m.setattr(decision.Competitor, "alignments", lambda self: None)
    m.setattr(decision, "_PAIRED_ALIGNMENTS", _NoStore())  # every alignment made anew, per surrogate

    def last_at(self, fraction):
        t = self.arrays()[0]
        earlier = t[t <= fraction + 1e-9]
        return float(earlier.max()) if earlier.size else None

    m.setattr(decision.Competitor, "last_at", last_at)

    def same_controls(schedule, tau, tpp, other):
        if other.schedule is None or not decision.same_schedule(schedule, other.schedule):
            return False
        return decision._same_value(tau, other.tau) and decision._same_value(tpp, other.tpp)

    m.setattr(decision, "same_controls", same_controls)
    # Issue 20 (replay speed, BENCHMARKS §37): schedules evaluated anew at every call, numpy's own means.
    m.setattr(schedules, "MEMO_POINTS", -1)
    m.setattr(decision, "_mean", lambda x: float(np.mean(x)))
    # Issue 20 (replay speed, BENCHMARKS §45): controls parsed at every new trial version, a competitor's
    # predicted final loss read off the whole finished Prediction, shape misses computed anew, the
    # objective's predict term summed over whole grid rows.
    m.setattr(record.ControlsMemo, "merged", lambda self, attrs, where: self.defaults.merged(attrs, where))

    def final_loss_of(aligned, surrogate, *, tau, tpp, confidence=0.9):
        if isinstance(aligned, predict.Prediction):
            return float(aligned.final_loss) if aligned.ok else None
        try:
            p = predict._finish(aligned, surrogate, tau, tpp, confidence, None)
        except Exception:
            return None
        return float(p.final_loss) if p.ok else None

    m.setattr(decision, "final_loss_of", final_loss_of)
    m.setattr(prior, "_memoized_miss", lambda memo, pr, curve, reach: prior.shape_miss(pr, curve, reach))
    m.setattr(calibrate, "_pairwise_span", lambda n, lo, hi: None)


class _NoStore(dict):
    """A memo that keeps nothing (``disable_caches``)."""

    def __setitem__(self, key: object, value: object) -> None:
        pass


def decisions(details: dict, name: str) -> list[tuple[list[int], list[bool]]]:
    return [(r.stopped_at.tolist(), r.pruned.tolist()) for r in details[name]]


def run(names: list[str], *, cache: bool, jobs: int = 1, orders: int = 2) -> dict:
    sweep = make_sweep(tau_sweep())
    factories = [peers.factory(n, surrogate=SURROGATE) for n in names]
    _, details = replay(sweep, factories, orders=orders, workers=3, cache=cache, jobs=jobs)
    return details


@pytest.mark.usefixtures("quick_online")
def test_cached_replay_makes_the_same_decisions_as_the_uncached_path(monkeypatch):
    names = ["collapse", "collapse-online"]
    cached = run(names, cache=True)
    with monkeypatch.context() as m:
        disable_caches(m)
        plain = run(names, cache=False)
    for name in names:
        assert decisions(cached, name) == decisions(plain, name), name
        pruned = [p for _, ps in decisions(cached, name) for p in ps]
        assert 0 < sum(pruned) < len(pruned), f"{name}: the sweep must exercise the rule"


@pytest.mark.usefixtures("quick_online")
def test_the_online_references_trial_memo_reads_what_reading_anew_reads(monkeypatch):
    """The online reference's test of its fit (``_reaching``) through the TrialMemo (each trial's reach and
    reaching curves kept per stored version) gives what reading every trial anew gives, at every judgement
    of a collapse-online replay whose running trials move on between judgements."""
    real = reference._reaching
    seen = {"calls": 0, "kept": 0}

    def plain(out):
        found, why = out
        return [(n, r, c.run, c.t_hat.tolist(), c.loss.tolist()) for n, r, c in found], why

    def both(trials, defaults, prior, memo=None):
        got = real(trials, defaults, prior, memo)
        assert memo is not None and plain(got) == plain(real(trials, defaults, prior, None))
        seen["calls"] += 1
        seen["kept"] += len(got[0])
        return got

    monkeypatch.setattr(reference, "_reaching", both)
    run(["collapse-online"], cache=True)
    assert seen["calls"] > 10 and seen["kept"] > 10


def test_predictions_are_computed_once_across_orders(monkeypatch):
    """The prediction of a trial from its first k reports is the same in every order: replaying one order
    twice with shared caches computes no prediction the second time, and decides the same."""
    calls = {"n": 0}
    real = predict._predict

    def counting(*args):
        calls["n"] += 1
        return real(*args)

    monkeypatch.setattr(predict, "_predict", counting)
    sweep = make_sweep(tau_sweep())
    order = random_orders(sweep.n_trials, 1, seed=5)[0]
    make = peers.factory("collapse", surrogate=SURROGATE)
    caches = ReplayCaches.new()
    with caches.active():
        first = simulate(sweep, make(), order, workers=3)
    once = calls["n"]
    assert once > 0 and caches.predictions.misses == once
    with caches.active():
        second = simulate(sweep, make(), order, workers=3)
    assert calls["n"] == once  # every prediction of the second replay came from the cache
    assert caches.predictions.hits >= once
    assert second.stopped_at.tolist() == first.stopped_at.tolist()
    # Without the cache the same two replays compute every prediction twice.
    calls["n"] = 0
    simulate(sweep, make(), order, workers=3)
    simulate(sweep, make(), order, workers=3)
    assert calls["n"] > 2 * caches.predictions.misses - 1


@pytest.mark.usefixtures("quick_online")
def test_online_fits_are_shared_across_replays_of_the_same_completions(monkeypatch):
    fits = {"n": 0}

    def counting(curves):
        fits["n"] += 1
        return quick_fit(curves)

    monkeypatch.setattr(reference, "_fit", counting)
    sweep = make_sweep(tau_sweep())
    order = random_orders(sweep.n_trials, 1, seed=2)[0]
    # no prior: with one, a fit on fewer than 10 completed trials is never made (the prior serves)
    make = peers.collapse_factory("collapse-online", {**peers.ONLINE_REPLAY, "prior": "none"})
    caches = ReplayCaches.new()
    with caches.active():
        first = simulate(sweep, make(), order, workers=3)
        n_first = fits["n"]
        second = simulate(sweep, make(), order, workers=3)
    assert n_first >= 1 and fits["n"] == n_first  # the second replay refitted nothing
    assert caches.fits.hits == n_first and caches.fits.misses == n_first
    assert second.stopped_at.tolist() == first.stopped_at.tolist()


@pytest.mark.usefixtures("quick_online")
def test_worker_processes_give_the_same_results_and_counts():
    names = ["collapse", "collapse-online", "asha"]
    one = run(names, cache=True, jobs=1, orders=3)
    two = run(names, cache=True, jobs=2, orders=3)
    for name in names:
        assert decisions(one, name) == decisions(two, name), name
        assert [r.order for r in one[name]] == [r.order for r in two[name]]


def test_cache_counts_are_reported_and_jobs_are_checked():
    sweep = make_sweep(tau_sweep(6))
    stats: dict = {}
    replay(sweep, [peers.factory("collapse", surrogate=SURROGATE)], orders=2, workers=2, stats=stats)
    counts = stats["collapse"]
    assert counts["prediction_misses"] > 0 and counts["prediction_hits"] > 0
    from collapse_hpo.predictors.errors import InputError

    with pytest.raises(InputError, match="jobs"):
        replay(sweep, [peers.factory("none")], orders=1, jobs=0)


@pytest.mark.parametrize("name", ["median-stopping", "median-stopping-tuned"])
def test_memoized_median_stopping_decides_like_rays_rule(name):
    from ray.tune.schedulers import MedianStoppingRule

    settings = {"median-stopping": {},
                "median-stopping-tuned": {"grace_period": 250, "min_samples_required": 4}}
    plain = peers.RayAdapter(name, lambda sweep: MedianStoppingRule(
        time_attr="t_permille", metric="loss", mode="min", **settings[name]))
    sweep = make_sweep(tau_sweep(12))
    stopped = 0
    for k, order in enumerate(random_orders(sweep.n_trials, 3, seed=1)):
        ours = simulate(sweep, peers.PEERS[name](), order, workers=3, seed=k)
        ray = simulate(sweep, plain, order, workers=3, seed=k)
        assert ours.stopped_at.tolist() == ray.stopped_at.tolist()
        stopped += int(ours.pruned.sum())
    assert stopped > 0  # the rule stopped trials: the comparison means something
    assert type(peers.PEERS[name]().make_scheduler(sweep)).__mro__[1] is MedianStoppingRule


def test_cli_replay_shows_progress_and_takes_jobs(tmp_path, capsys, monkeypatch):
    from collapse_hpo.hpo.cli import main
    from collapse_hpo.hpo.replays import replay as replay_module
    from collapse_hpo.predictors.curves import write_curves_csv

    path = tmp_path / "sweep.csv"
    write_curves_csv(path, tau_sweep(6))
    assert main(["replay", str(path), "--pruner", "none", "--jobs", "0"]) == 2
    assert "--jobs must be at least 1" in capsys.readouterr().err
    monkeypatch.setattr(replay_module, "PROGRESS_EVERY", 0.0)  # a line after every order
    for jobs in ("1", "2"):
        rc = main(["replay", str(path), "--pruner", "none", "--pruner", "top-k-10", "--orders", "3",
                   "--jobs", jobs])
        assert rc == 0
        err = capsys.readouterr().err
        assert f"{jobs} job(s)" in err
        assert "top-k-10: 1/3 orders done" in err and "top-k-10: 2/3 orders done" in err


def test_prediction_cache_answers_equal_inputs_and_drops_old_surrogates():
    curve = tau_sweep(1)[0]
    other = dataclasses.replace(SURROGATE, b_c=0.6)
    args = {"schedule": curve.schedule, "tau": curve.tau, "tpp": curve.tpp}
    plain = predict.predict_final_loss(curve.t_hat[:10], curve.loss[:10], surrogate=SURROGATE, **args)
    cache = predict.PredictionCache(max_surrogates=1)
    with predict.caching(cache):
        a = predict.predict_final_loss(curve.t_hat[:10], curve.loss[:10], surrogate=SURROGATE, **args)
        b = predict.predict_final_loss(list(curve.t_hat[:10]), list(curve.loss[:10]), surrogate=SURROGATE,
                                       **args)
        assert (cache.hits, cache.misses) == (1, 1) and a is b and a == plain
        c = predict.predict_final_loss(curve.t_hat[:10], curve.loss[:10], surrogate=other, **args)
        assert c.final_loss != a.final_loss and cache.size == 1  # the first surrogate's entries dropped
        predict.predict_final_loss(curve.t_hat[:10], curve.loss[:10], surrogate=SURROGATE, **args)
        assert cache.misses == 3
    predict.predict_final_loss(curve.t_hat[:10], curve.loss[:10], surrogate=SURROGATE, **args)
    assert cache.misses == 3  # outside the block nothing is cached
