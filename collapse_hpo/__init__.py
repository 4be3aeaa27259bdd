"""collapse-hpo: hyperparameter optimization for LLM training with collapse-based early stopping.

The public face: the names a user needs, importable from the top (``from collapse_hpo import
CollapsePruner``). Each is loaded on first use, so ``import collapse_hpo`` imports nothing heavy and the
core install (no Ray) can import everything but `CollapseScheduler`, which needs ``collapse-hpo[ray]``.
Where each name lives: ARCHITECTURE.md.

    from collapse_hpo import CollapsePruner, set_trial_controls

    study = optuna.create_study(direction="minimize", pruner=CollapsePruner(reference="online"))
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public name -> the module that defines it.
_WHERE: dict[str, str] = {
    # the Optuna pruner and the Ray Tune scheduler (the same rule: hpo/rule)
    "CollapsePruner": "collapse_hpo.hpo.optuna_side.pruner",
    "CollapseScheduler": "collapse_hpo.hpo.ray_side.scheduler",
    # what a trial tells the rule, and the rule's settings
    "set_trial_controls": "collapse_hpo.hpo.rule.record",
    "TrialControls": "collapse_hpo.hpo.rule.record",
    "PruneSettings": "collapse_hpo.hpo.rule.decision",
    "CollapseWarning": "collapse_hpo.hpo.rule.judge",
    # a training loop's watch and the trainer callbacks (each imports its trainer only when used)
    "TrainingWatch": "collapse_hpo.hpo.integrations.loop",
    # the predictors: calibrate a reference, predict a final loss, forecast a run before training
    "calibrate": "collapse_hpo.predictors.calibrate",
    "predict_final_loss": "collapse_hpo.predictors.predict",
    "forecast": "collapse_hpo.predictors.forecast",
    "Surrogate": "collapse_hpo.predictors.surrogate",
    "Curve": "collapse_hpo.predictors.curves",
    "read_curves_csv": "collapse_hpo.predictors.curves",
    "write_curves_csv": "collapse_hpo.predictors.curves",
    "Schedule": "collapse_hpo.predictors.schedules",
    "step_tau": "collapse_hpo.predictors.timescale",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """Load a public name on first use (PEP 562); `CollapseScheduler` says which extra it needs."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'collapse_hpo' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as err:
        if err.name == "ray" or (err.name or "").startswith("ray."):
            raise ImportError(f"collapse_hpo.{name} needs Ray Tune: pip install 'collapse-hpo[ray]'") from err
        raise
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})  # a loaded name is in both: listed once
