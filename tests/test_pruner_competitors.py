"""Who competes in a CollapsePruner decision: completed and running trials, never pruned ones."""

from __future__ import annotations

import math

import numpy as np
import optuna

from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner, set_trial_controls
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE

optuna.logging.set_verbosity(optuna.logging.WARNING)

TOTAL, REPORTS, TAU, TPP = 400_000, 40, 0.1, 20.0
SCHEDULE = Schedule()


def _report_until(study: optuna.Study, trial: optuna.trial.Trial, final: float, upto: int) -> bool:
    """Report the collapse curve scaled to ``final`` for report points 1..upto; True when pruned."""
    for i in range(1, upto + 1):
        tokens = TOTAL * i // REPORTS
        shape = float(TRUE_SURROGATE.normalized(tokens / TOTAL, SCHEDULE, TAU, TPP)[0])
        trial.report(final * shape, step=tokens)
        if trial.should_prune():
            return True
    return False


def test_a_pruned_trials_stale_prediction_prunes_nobody():
    """Trial A predicts 2.5 at 30%, then diverges (NaN) and is pruned. Trial B, predicted 3.0, must not be
    pruned by A's pre-divergence prediction: A will never finish, so it is no competitor. With pruned trials
    counted, a sweep can prune every trial and keep no result."""
    pruner = CollapsePruner(reference=TRUE_SURROGATE, min_fraction=0.1, keep_top_k=1,
                            total_tokens=TOTAL, schedule=SCHEDULE, tau=TAU, tpp=TPP, judge_every=0.0)
    study = optuna.create_study(pruner=pruner)
    a = study.ask()
    set_trial_controls(a, total_tokens=TOTAL, schedule=SCHEDULE, tau=TAU, tpp=TPP)
    assert not _report_until(study, a, 2.5, 12)
    assert math.isclose(study.trials[a.number].user_attrs["predicted_final_loss"], 2.5, rel_tol=1e-3)
    a.report(math.nan, step=TOTAL * 13 // REPORTS)
    assert a.should_prune()
    study.tell(a, state=optuna.trial.TrialState.PRUNED)

    b = study.ask()
    set_trial_controls(b, total_tokens=TOTAL, schedule=SCHEDULE, tau=TAU, tpp=TPP)
    assert not _report_until(study, b, 3.0, REPORTS), study.trials[b.number].user_attrs.get("prune_reason")
    study.tell(b, 3.0)

    # A running trial's prediction does compete: C (predicted 3.5) is pruned against running D (2.8)...
    d = study.ask()
    set_trial_controls(d, total_tokens=TOTAL, schedule=SCHEDULE, tau=TAU, tpp=TPP)
    assert not _report_until(study, d, 2.8, 12)
    c = study.ask()
    set_trial_controls(c, total_tokens=TOTAL, schedule=SCHEDULE, tau=TAU, tpp=TPP)
    assert _report_until(study, c, 3.5, REPORTS)
    # ... and the decision names a live competitor, never the pruned A.
    log = study.trials[c.number].user_attrs["collapse_decisions"]
    assert log[-1]["prune"] and log[-1]["threshold_trial"] in (b.number, d.number)
    assert np.isfinite(log[-1]["threshold"])
