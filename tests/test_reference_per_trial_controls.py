"""The online reference when every trial has its own controls (τ, warm-up, schedule): issue 15."""

from __future__ import annotations

import numpy as np
import pytest

from collapse_hpo.hpo.rule.decision import Competitor, PruneSettings, decide
from collapse_hpo.hpo.rule.reference import MAX_ONLINE_FOLDS, fit_surrogate, online_folds
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.synthetic import synthetic_curves


def completed_trials() -> list:
    """Four completed trials of a random search: every one at its own τ and warm-up (4 curve groups)."""
    out = []
    for i, (tau, warmup) in enumerate(((0.05, 0.02), (0.1, 0.1), (0.2, 0.05), (0.4, 0.2))):
        (c,) = synthetic_curves(taus=(tau,), tpps=(20.0,), schedule=Schedule(warmup=warmup), n_points=60,
                                final_loss=3.0 + 0.1 * i, seed=i)
        c.run = f"trial{i}"
        out.append(c)
    return out


def test_online_folds_keep_two_groups_in_every_fold():
    assert [online_folds(n) for n in (2, 3, 4, 5, 9, 10, 40)] == [2, 2, 2, 2, 4, 5, MAX_ONLINE_FOLDS]


@pytest.mark.timeout(120)
def test_an_online_fit_on_trials_with_their_own_controls_pairs_them():
    curves = completed_trials()
    surrogate = fit_surrogate(curves)
    # before: one curve group per fold, so no fold held two curves and there was no paired error model
    assert surrogate.pair_bands, surrogate.info["notes"]
    # a running trial at yet another τ and warm-up is paired through the surrogate with each completed one
    # whose LR decay lies no further from its own than the fit's pairs did (BENCHMARKS §34), each predicted
    # with its own controls; the one on a decay further apart (warm-up 2% against 15%) is compared unpaired
    (run,) = synthetic_curves(taus=(0.15,), tpps=(20.0,), schedule=Schedule(warmup=0.15), n_points=60,
                              final_loss=4.5, seed=9)
    keep = run.t_hat <= 0.4
    comps = [Competitor.from_reports(c.t_hat, c.loss, final_loss=float(c.loss[-1]), schedule=c.schedule,
                                     tau=c.tau, tpp=c.tpp) for c in curves]
    d = decide(run.t_hat[keep], run.loss[keep], surrogate=surrogate, schedule=run.schedule, tau=run.tau,
               tpp=run.tpp, competitors=comps, settings=PruneSettings())
    from collapse_hpo.predictors.schedules import decay_distance

    learned = surrogate.info["pair_decay_distance"]
    far = [decay_distance(run.schedule, c.schedule) > learned for c in curves]
    assert far == [True, False, False, False]
    assert "3 of 4 competitor(s) paired" in d.reason  # the best competitor, trial0, decides unpaired
    assert "1 with an LR decay further from this trial's than the pairs its paired errors were learned on" \
        in d.reason
    assert d.prune  # 50% worse than the best completed trial
    assert d.prediction.final_loss == pytest.approx(float(run.loss[-1]), rel=0.03)
    assert np.isfinite(d.threshold)
