"""Search spaces with the AdamW timescale τ held: λ is derived, never searched (METHOD.md §2).

`TauHeldSpace` turns sampled hyperparameters (``lr``, ``batch_tokens``, ``warmup``, ...) into the settings a
trial trains with, with ``weight_decay`` λ = B / (η τ D) so that τ = B/(η λ D) is the same for every trial.
It works in a plain Optuna objective as well as in the sweep runner::

    >>> import optuna
    >>> from optuna.distributions import FloatDistribution
    >>> from collapse_hpo.hpo.sweep.space import TauHeldSpace
    >>> space = TauHeldSpace({"lr": FloatDistribution(1e-3, 1e-1, log=True)},
    ...                      fixed={"batch_tokens": 2048}, tau=0.175, total_tokens=1_000_000)
    >>> def objective(trial):
    ...     hp = space.suggest(trial)           # lr sampled; weight_decay derived; user attrs set
    ...     return hp["lr"] * hp["weight_decay"]  # stand-in for a training run
    >>> study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    >>> study.optimize(objective, n_trials=3)
    >>> t = study.trials[0]
    >>> round(2048 / (t.params["lr"] * t.user_attrs["weight_decay"] * 1_000_000), 6)
    0.175
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.timescale import check_one_decay, derive_decay, optimal_tau

if TYPE_CHECKING:
    import optuna

    from collapse_hpo.hpo.sweep.config import SweepConfig


class TauHeldSpace:
    """Hyperparameters for a trial with τ held (or, with ``tau=None``, λ fixed or searched directly).

    Args:
        distributions: name -> optuna distribution of the searched hyperparameters.
        fixed: name -> value of the hyperparameters every trial shares.
        tau: the AdamW timescale to hold (fraction of training), or None to use ``weight_decay`` as given
            (searched or fixed; 0 when absent = no weight decay). ``tau`` may also be searched (in
            ``distributions``): then λ is derived from each trial's τ.
        total_tokens: D, the training tokens of every trial.
    """

    def __init__(self, distributions: Mapping[str, Any], fixed: Mapping[str, Any] | None = None, *,
                 tau: float | None, total_tokens: int) -> None:
        self.distributions = dict(distributions)
        self.fixed = dict(fixed or {})
        names = set(self.distributions) | set(self.fixed)
        check_one_decay(tau is not None or "tau" in names, "weight_decay" in names, where="search space")
        for key in ("lr", "batch_tokens"):
            if key not in names:
                raise InputError(f"search space: {key!r} is needed, fixed or searched")
        if tau is not None and not (math.isfinite(tau) and tau > 0):
            raise InputError(f"search space: tau must be a positive number, got {tau}")
        if total_tokens <= 0:
            raise InputError(f"search space: total_tokens must be positive, got {total_tokens}")
        self.tau = tau
        self.total_tokens = int(total_tokens)

    def derive(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The full hyperparameters of a trial from its sampled ``params``: fixed and sampled values,
        ``weight_decay`` (λ, derived when τ is held) and ``tau`` (held or resulting τ; None = no decay)."""
        hp: dict[str, Any] = {**self.fixed, **params}
        hp["batch_tokens"] = int(hp["batch_tokens"])
        hp["lr"] = float(hp["lr"])
        for key in ("width", "depth"):
            if key in hp:
                hp[key] = int(hp[key])
        tau = hp.pop("tau", None)
        tau = self.tau if tau is None else float(tau)
        lam = None if tau is not None else float(hp.get("weight_decay", 0.0))
        hp["weight_decay"], hp["tau"] = derive_decay(
            hp["batch_tokens"], hp["lr"], self.total_tokens, tau=tau, weight_decay=lam
        )
        return hp

    def suggest(self, trial: optuna.trial.BaseTrial) -> dict[str, Any]:
        """Sample the searched hyperparameters on ``trial`` (with the stored distributions), derive λ, and
        record ``weight_decay``, ``tau`` and ``total_tokens`` as user attrs. Returns `derive`.

        λ is derived for D = ``total_tokens`` of this space: a trainer that rounds D to whole steps (as
        ``trainers.config.plan`` does) should be given that D here, or record its own λ (the sweep runner
        records the trainer's, from the same ``predictors.timescale.derive_decay``)."""
        params = {name: suggest(trial, name, dist) for name, dist in self.distributions.items()}
        hp = self.derive(params)
        trial.set_user_attr("weight_decay", hp["weight_decay"])
        trial.set_user_attr("tau", hp["tau"])
        trial.set_user_attr("total_tokens", self.total_tokens)
        return hp


def suggest(trial: optuna.trial.BaseTrial, name: str, dist: Any) -> Any:
    """Sample ``name`` from an Optuna distribution through the trial's public ``suggest_*`` methods."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    raise InputError(f"search space: {name!r} has an unsupported distribution {type(dist).__name__}")


def sweep_total_tokens(sweep: SweepConfig) -> tuple[int, float | None, int]:
    """(total_tokens D, tpp D/N, non-embedding params N) of ``sweep`` before rounding D to whole steps.

    N comes from the trainer's ``count_parameters`` for the model shape; D = tpp · N when ``tpp`` is given.
    A sweep that gives ``total_tokens`` instead has no TPP (None: not defined, as in fine-tuning). The trainer
    rounds D to whole steps of each trial's batch_tokens (see ``trainers.config.plan``).
    """
    from collapse_hpo.trainers.config import (
        count_parameters,  # deferred: pulls numpy; this module loads it only when used
    )

    m = sweep.model
    n_params, _total = count_parameters(m.width, m.depth, m.heads)
    if sweep.total_tokens is not None:
        return int(sweep.total_tokens), None, int(n_params)
    total = round(float(sweep.tpp or 0.0) * n_params)
    return total, total / n_params, int(n_params)


def sweep_tau(sweep: SweepConfig, tpp: float | None) -> float | None:
    """The τ the sweep holds: the number given, ``optimal_tau(tpp)`` for "optimal", None when not held
    (``tau: null``, ``weight_decay`` given, or ``tau`` searched). InputError for "optimal" without a TPP
    (`load_sweep` refuses that file first)."""
    given = set(sweep.fixed) | set(sweep.space)
    if "weight_decay" in given or "tau" in given:
        return None
    if sweep.tau == "optimal":
        if tpp is None:
            raise InputError("sweep: tau 'optimal' is optimal_tau(tpp) and needs a TPP; this sweep gives "
                             "total_tokens (TPP not defined): give tau as a number or null")
        return optimal_tau(tpp)
    return None if sweep.tau is None else float(sweep.tau)


def space_for_sweep(sweep: SweepConfig) -> TauHeldSpace:
    """The `TauHeldSpace` of a sweep file (imports optuna and the trainer's parameter count)."""
    total, tpp, _n = sweep_total_tokens(sweep)
    dists = {name: d.to_optuna() for name, d in sweep.space.items()}
    return TauHeldSpace(dists, sweep.fixed, tau=sweep_tau(sweep, tpp), total_tokens=total)
