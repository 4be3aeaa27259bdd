"""A plain-Optuna objective on the synthetic collapse family, shared by the tests that drive a CollapsePruner
through `study.optimize`: each trial's curve is the true surrogate's shape times a final loss that depends on
its one parameter x (best at 0.3), with 0.2% noise, reported in tokens."""

from __future__ import annotations

import math

import numpy as np
import optuna

from collapse_hpo.hpo.optuna_side.pruner import set_trial_controls
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE

#: Training tokens per trial, reports per trial, τ and TPP of every trial.
TOTAL, REPORTS, TAU, TPP = 200_000, 20, 0.1, 20.0


def synthetic_objective(trial: optuna.trial.Trial) -> float:
    """Report the trial's synthetic curve in tokens, raising TrialPruned when the pruner says so."""
    x = trial.suggest_float("x", 0.0, 1.0)
    set_trial_controls(trial, total_tokens=TOTAL, schedule=Schedule(), tau=TAU, tpp=TPP)
    rng = np.random.default_rng(trial.number)
    final = 3.0 + 2.0 * (x - 0.3) ** 2
    loss = math.nan
    for i in range(1, REPORTS + 1):
        tokens = TOTAL * i // REPORTS
        shape = float(TRUE_SURROGATE.normalized(tokens / TOTAL, Schedule(), TAU, TPP)[0])
        loss = final * shape * (1.0 + 0.002 * float(rng.standard_normal()))
        trial.report(loss, step=tokens)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return loss
