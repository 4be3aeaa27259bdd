"""Early-stopping rules to compare against, as ``ReplayPruner`` adapters for the replay harness.

Every adapter drives the real object of its library: an Optuna pruner inside a real in-memory Optuna study
(``study.ask``, ``trial.report``, ``trial.should_prune``, ``study.tell``), a Ray Tune scheduler through its
``on_trial_add`` / ``on_trial_result`` / ``on_trial_complete`` callbacks with stub ``Trial`` objects (no Ray
cluster: the schedulers only need the trial ids), surestop's ConformalPruner as an Optuna pruner, and
our CollapsePruner likewise. Progress is reported to Optuna and Ray as ``t_permille`` = round(1000 t̂), so that
resource settings (warmup steps, grace periods, rungs) are in thousandths of training, the same for every
sweep.

``PEERS`` maps a name to a factory. Each rule appears with its library defaults (only the progress unit
and the
maximum resource set) and with one tuned setting, chosen before seeing any replay: no decision before 25% of
training (the point from which the paper reports τ-held orderings to be stable), or the nearest equivalent.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from collapse_hpo.hpo.extras import EXTRA_OF, install_hint
from collapse_hpo.hpo.replays.replay import STEP_SCALE, ReplayPruner, Sweep
from collapse_hpo.hpo.rule.record import set_trial_controls
from collapse_hpo.predictors.calibrate import calibrate, refuse_diverged
from collapse_hpo.predictors.curves import read_curves_csv
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.surrogate import Surrogate

PrunerFactory = Callable[[], ReplayPruner]


class NoPruning:
    """Every trial runs to the end (the reference: compute 1, regret 0)."""

    name = "none"

    def new_sweep(self, sweep: Sweep, seed: int) -> None:
        """Nothing to reset."""

    def start(self, trial: int) -> None:
        """Nothing to do."""

    def report(self, trial: int, index: int) -> bool:
        """Never stop."""
        return False

    def finish(self, trial: int, pruned: bool) -> None:
        """Nothing to do."""


class TopKAtFraction:
    """Train every trial to ``fraction`` of its tokens; continue only those among the best ``k`` there.

    Online, as a live sweep must: when a trial reaches the first report at t̂ ≥ ``fraction``, it
    continues if its
    loss there ranks within the ``k`` lowest of the losses at that point of every trial that has reached
    it so far
    (itself included), else it stops. ``k`` may be a callable of the number of trials.
    """

    def __init__(self, name: str, fraction: float = 0.1, k: int | Callable[[int], int] = 3) -> None:
        self.name, self.fraction, self.k = name, fraction, k

    def new_sweep(self, sweep: Sweep, seed: int) -> None:
        """Find the decision point on the grid and clear the losses seen there."""
        self.sweep = sweep
        idx = np.flatnonzero(sweep.grid >= self.fraction - 1e-12)
        self.index = int(idx[0]) if idx.size else sweep.grid.size - 1
        self.seen: list[float] = []
        self.keep = self.k(sweep.n_trials) if callable(self.k) else int(self.k)

    def start(self, trial: int) -> None:
        """Nothing to do."""

    def report(self, trial: int, index: int) -> bool:
        """At the decision point: stop unless the loss ranks in the best k seen there."""
        if index != self.index:
            return False
        loss = float(self.sweep.losses[trial, index])
        self.seen.append(loss)
        rank = sum(1 for v in self.seen if v < loss)
        return rank >= self.keep

    def finish(self, trial: int, pruned: bool) -> None:
        """Nothing to do."""


class OptunaAdapter:
    """Drive an Optuna pruner inside a real in-memory study; one study per replay.

    ``make_pruner(sweep)`` builds the pruner; ``setup_trial(trial, curve)`` (optional) sets user attributes a
    pruner needs about a trial (e.g. its schedule, τ, TPP) right after ``study.ask()``.
    """

    def __init__(self, name: str, make_pruner: Callable[[Sweep], Any],
                 setup_trial: Callable[[Any, Any], None] | None = None) -> None:
        self.name, self.make_pruner, self.setup_trial = name, make_pruner, setup_trial

    def new_sweep(self, sweep: Sweep, seed: int) -> None:
        """A fresh in-memory study with a RandomSampler (the order of trials is the replay's order)."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.sweep = sweep
        self.steps = sweep.steps
        self.study = optuna.create_study(
            study_name=f"replay-{self.name}-{seed}",  # HyperbandPruner hashes the name into brackets
            direction="minimize",
            sampler=optuna.samplers.RandomSampler(seed=seed),
            pruner=self.make_pruner(sweep),
            storage=optuna.storages.InMemoryStorage(),
        )
        self.trials: dict[int, Any] = {}

    def start(self, trial: int) -> None:
        """``study.ask()`` a trial and attach the run's identity (and the pruner's per-trial settings)."""
        t = self.study.ask()
        curve = self.sweep.curves[trial]
        t.set_user_attr("run", curve.run)
        if self.setup_trial is not None:
            self.setup_trial(t, curve)
        self.trials[trial] = t

    def report(self, trial: int, index: int) -> bool:
        """``trial.report(loss, t_permille)`` then ``trial.should_prune()``."""
        t = self.trials[trial]
        t.report(float(self.sweep.losses[trial, index]), int(self.steps[index]))
        return bool(t.should_prune())

    def finish(self, trial: int, pruned: bool) -> None:
        """``study.tell`` the trial PRUNED, or COMPLETE with its final loss."""
        import optuna

        t = self.trials.pop(trial)
        if pruned:
            self.study.tell(t, state=optuna.trial.TrialState.PRUNED)
        else:
            self.study.tell(t, float(self.sweep.finals[trial]))


class _Controller:
    """The part of Ray Tune's TuneController the schedulers call here: no other live trials waiting."""

    def get_live_trials(self) -> list[Any]:
        return []

    def get_trials(self) -> list[Any]:
        return []


class RayAdapter:
    """Drive a Ray Tune TrialScheduler with stub Trial objects and result dicts, as Tune's controller would.

    Results carry ``loss``, ``t_permille`` (round(1000 t̂)) and ``training_iteration`` (1-based report count).
    STOP ends the trial; PAUSE (only possible with soft stopping) is treated as continue.
    """

    def __init__(self, name: str, make_scheduler: Callable[[Sweep], Any]) -> None:
        self.name, self.make_scheduler = name, make_scheduler

    def new_sweep(self, sweep: Sweep, seed: int) -> None:
        """A fresh scheduler; Ray's bracket choice uses numpy's global RNG, seeded here (reproducible)."""
        np.random.seed(seed)
        self.sweep = sweep
        self.steps = sweep.steps
        self.scheduler = self.make_scheduler(sweep)
        self.controller = _Controller()
        self.trials: dict[int, Any] = {}
        self.last: dict[int, dict[str, float]] = {}

    def start(self, trial: int) -> None:
        """A stub Trial, announced with ``on_trial_add``."""
        from ray.tune.experiment import Trial

        t = Trial("replay", trial_id=f"{trial:05d}", stub=True)
        self.trials[trial] = t
        self.scheduler.on_trial_add(self.controller, t)

    def report(self, trial: int, index: int) -> bool:
        """``on_trial_result``; True on STOP."""
        from ray.tune.schedulers import TrialScheduler

        result = {
            "loss": float(self.sweep.losses[trial, index]),
            "t_permille": int(self.steps[index]),
            "training_iteration": index + 1,
        }
        self.last[trial] = result
        action = self.scheduler.on_trial_result(self.controller, self.trials[trial], result)
        return action == TrialScheduler.STOP

    def finish(self, trial: int, pruned: bool) -> None:
        """``on_trial_complete`` for trials that reached the end (Tune does not call it for stopped ones)."""
        t = self.trials.pop(trial)
        if not pruned:
            self.scheduler.on_trial_complete(self.controller, t, self.last[trial])


# ---------------------------------------------------------------------------------------------- the registry
def _first_index(sweep: Sweep, fraction: float) -> int:
    idx = np.flatnonzero(sweep.grid >= fraction - 1e-12)
    return int(idx[0]) if idx.size else sweep.grid.size - 1


def _optuna(name: str, build: Callable[[Sweep], Any]) -> PrunerFactory:
    return lambda: OptunaAdapter(name, build)


def _median(sweep: Sweep) -> Any:
    import optuna

    return optuna.pruners.MedianPruner()


def _median_tuned(sweep: Sweep) -> Any:
    import optuna

    return optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=250)


def _percentile(sweep: Sweep) -> Any:
    import optuna

    return optuna.pruners.PercentilePruner(25.0)


def _percentile_tuned(sweep: Sweep) -> Any:
    import optuna

    return optuna.pruners.PercentilePruner(25.0, n_startup_trials=4, n_warmup_steps=250)


def _sha(sweep: Sweep) -> Any:
    import optuna

    return optuna.pruners.SuccessiveHalvingPruner()


def _sha_tuned(sweep: Sweep) -> Any:
    import optuna

    return optuna.pruners.SuccessiveHalvingPruner(min_resource=250, reduction_factor=2)


def _hyperband(sweep: Sweep) -> Any:
    import optuna

    return optuna.pruners.HyperbandPruner(max_resource=STEP_SCALE)


def _hyperband_tuned(sweep: Sweep) -> Any:
    import optuna

    return optuna.pruners.HyperbandPruner(min_resource=250, max_resource=STEP_SCALE, reduction_factor=2)


def _patient_pruner(wrapped: Any, patience: int) -> Any:
    """Optuna's PatientPruner around ``wrapped``, without its ExperimentalWarning: a peer replayed as it
    is, whose warning repeated once per order in replay's table."""
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.pruners.PatientPruner(wrapped, patience=patience)


def _patient(sweep: Sweep) -> Any:
    import optuna

    return _patient_pruner(optuna.pruners.MedianPruner(), patience=1)


def _patient_tuned(sweep: Sweep) -> Any:
    import optuna

    return _patient_pruner(optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=250), patience=3)


def _conformal(sweep: Sweep) -> Any:
    from surestop import ConformalPruner

    return ConformalPruner()


def _conformal_tuned(sweep: Sweep) -> Any:
    """Calibrate on the first quarter of the trials (at least 5) at α = 1/n_cal; decisions from 25%."""
    from surestop import ConformalPruner

    n_cal = max(5, math.ceil(sweep.n_trials / 4))
    return ConformalPruner(n_calibration=n_cal, alpha=1.0 / n_cal, min_peek=_first_index(sweep, 0.25))


def _asha(sweep: Sweep) -> Any:
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(time_attr="t_permille", metric="loss", mode="min", max_t=STEP_SCALE)


def _asha_tuned(sweep: Sweep) -> Any:
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(time_attr="t_permille", metric="loss", mode="min", max_t=STEP_SCALE,
                         grace_period=250, reduction_factor=2)


def _memo_median_stopping(**kwargs: Any) -> Any:
    """Ray's MedianStoppingRule with its running means memoized: the same rule, decision for decision.

    At every result the rule takes, for each other trial, the mean of its results from the grace period
    up to the current time: O(trials × reports) per result, O(trials² × reports²) per sweep (half of a
    400-trial replay's time). A trial's results only grow by appending, so (trial, time, number of its
    results) fixes that mean; it is computed once. ``tests/test_replay_cache.py`` checks equal decisions.
    """
    from ray.tune.schedulers import MedianStoppingRule

    class MemoMedianStoppingRule(MedianStoppingRule):
        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)
            self._means: dict[tuple[Any, float, int], Any] = {}

        def _running_mean(self, trial: Any, time: float) -> Any:
            key = (trial, time, len(self._results[trial]))
            mean = self._means.get(key)
            if mean is None:
                mean = self._means[key] = super()._running_mean(trial, time)
            return mean

    return MemoMedianStoppingRule(**kwargs)


def _median_stopping(sweep: Sweep) -> Any:
    return _memo_median_stopping(time_attr="t_permille", metric="loss", mode="min")


def _median_stopping_tuned(sweep: Sweep) -> Any:
    return _memo_median_stopping(time_attr="t_permille", metric="loss", mode="min", grace_period=250,
                                 min_samples_required=4)


PEERS: dict[str, PrunerFactory] = {
    "none": NoPruning,
    "median": _optuna("median", _median),
    "median-tuned": _optuna("median-tuned", _median_tuned),
    "percentile25": _optuna("percentile25", _percentile),
    "percentile25-tuned": _optuna("percentile25-tuned", _percentile_tuned),
    "sha": _optuna("sha", _sha),
    "sha-tuned": _optuna("sha-tuned", _sha_tuned),
    "hyperband": _optuna("hyperband", _hyperband),
    "hyperband-tuned": _optuna("hyperband-tuned", _hyperband_tuned),
    "patient": _optuna("patient", _patient),
    "patient-tuned": _optuna("patient-tuned", _patient_tuned),
    "asha": lambda: RayAdapter("asha", _asha),
    "asha-tuned": lambda: RayAdapter("asha-tuned", _asha_tuned),
    "median-stopping": lambda: RayAdapter("median-stopping", _median_stopping),
    "median-stopping-tuned": lambda: RayAdapter("median-stopping-tuned", _median_stopping_tuned),
    "top-k-10": lambda: TopKAtFraction("top-k-10", fraction=0.1, k=3),
    "top-k-10-tuned": lambda: TopKAtFraction("top-k-10-tuned", fraction=0.25, k=lambda n: max(2, n // 4)),
    "conformal": _optuna("conformal", _conformal),
    "conformal-tuned": _optuna("conformal-tuned", _conformal_tuned),
}

#: Settings used in the tables, for the record (name -> what it is).
DESCRIPTIONS: dict[str, str] = {
    "none": "no pruning",
    "median": "optuna MedianPruner() defaults",
    "median-tuned": "MedianPruner(n_startup_trials=4, n_warmup_steps=250)",
    "percentile25": "optuna PercentilePruner(25) defaults",
    "percentile25-tuned": "PercentilePruner(25, n_startup_trials=4, n_warmup_steps=250)",
    "sha": "optuna SuccessiveHalvingPruner() defaults",
    "sha-tuned": "SuccessiveHalvingPruner(min_resource=250, reduction_factor=2)",
    "hyperband": "optuna HyperbandPruner(max_resource=1000)",
    "hyperband-tuned": "HyperbandPruner(min_resource=250, max_resource=1000, reduction_factor=2)",
    "patient": "PatientPruner(MedianPruner(), patience=1)",
    "patient-tuned": "PatientPruner(MedianPruner(n_startup_trials=4, n_warmup_steps=250), patience=3)",
    "asha": "ray ASHAScheduler(max_t=1000) defaults (grace_period=1, reduction_factor=4)",
    "asha-tuned": "ASHAScheduler(max_t=1000, grace_period=250, reduction_factor=2)",
    "median-stopping": "ray MedianStoppingRule defaults (grace_period=60, min_samples_required=3)",
    "median-stopping-tuned": "MedianStoppingRule(grace_period=250, min_samples_required=4)",
    "top-k-10": "train to 10%, continue the best 3 seen there",
    "top-k-10-tuned": "train to 25%, continue the best max(2, n/4) seen there",
    "conformal": "surestop ConformalPruner() defaults (n_calibration=60, alpha=0.05)",
    "conformal-tuned": "ConformalPruner(n_calibration=max(5, n/4), alpha=1/n_calibration, min_peek at 25%)",
}


#: Peers whose library is not in collapse-hpo's core: name -> the module they need (surestop is a dev
#: extra; ray comes with the ``ray`` extra). ``collapse-hpo replay`` skips them with a note when it is absent.
OPTIONAL_LIBRARY: dict[str, str] = {
    "conformal": "surestop", "conformal-tuned": "surestop",
    "asha": "ray", "asha-tuned": "ray", "median-stopping": "ray", "median-stopping-tuned": "ray",
}


def unavailable_module(module: str) -> bool:
    """Whether the optional library ``module`` is not installed."""
    import importlib.util

    return importlib.util.find_spec(module) is None


def missing_library_note(module: str) -> str:
    """Why a peer of the optional library ``module`` is skipped, with the pip command that installs it."""
    how = install_hint([module]) if module in EXTRA_OF else f"pip install {module}"
    return f"needs the {module!r} package, which is not installed ({how})"


def unavailable(names: list[str]) -> dict[str, str]:
    """The peers among ``names`` whose library is not installed, each with a one-line note saying so."""
    out: dict[str, str] = {}
    for name in names:
        module = OPTIONAL_LIBRARY.get(name)
        if module is not None and unavailable_module(module):
            out[name] = missing_library_note(module)
    return out


# ---------------------------------------------------------------------------------------------- our pruner
COLLAPSE_NAMES = ("collapse", "collapse-tuned", "collapse-interval", "collapse-online")
#: Ours that need a reference surrogate (collapse-online fits its own on the sweep).
REFERENCE_PRUNERS = ("collapse", "collapse-tuned", "collapse-interval")


def available_names() -> list[str]:
    """Every pruner name the replay knows: ours first, then the peers (``none`` first among them)."""
    return [*COLLAPSE_NAMES, *PEERS]


def load_surrogate(*, surrogate: str | None = None, reference: str | None = None) -> Any:
    """The collapse pruner's surrogate: a calibrated JSON file, or calibrated on a reference curve CSV.

    Returns None when neither is given. Raises InputError on a bad file (it names the file).
    """
    if surrogate:
        return Surrogate.load(surrogate)
    if reference:
        curves = read_curves_csv(reference)
        try:
            refuse_diverged(curves)
            return calibrate(curves).surrogate
        except InputError as err:  # name the file, as `collapse-hpo calibrate` does
            raise InputError(f"{reference}: {str(err).removeprefix('calibrate: ')}") from None
    return None


def _set_controls(trial: Any, curve: Any) -> None:
    """The trial's controls as the CollapsePruner reads them: a step is t̂ in STEP_SCALE-ths of training."""
    set_trial_controls(trial, units="steps", total=STEP_SCALE, schedule=curve.schedule, tau=curve.tau,
                       tpp=curve.tpp)


def collapse_factory(name: str, reference: Any, **settings: Any) -> PrunerFactory:
    """Our CollapsePruner (hpo/optuna_side/pruner.py) with ``reference`` (a Surrogate, or "online") and its
    settings."""

    def build(sweep: Sweep) -> Any:
        from collapse_hpo.hpo.optuna_side.pruner import (
            CollapsePruner,  # deferred: pulls optuna; this module loads it only when used
        )

        return CollapsePruner(reference=reference, **settings)

    return lambda: OptunaAdapter(name, build, setup_trial=_set_controls)


#: Settings of our pruner in the tables: defaults (paired comparison, confidence 0.9); the tuned one
#: (confidence 0.7: the lowest of 0.5/0.7/0.8/0.9 that kept the winner in every order of all four τ-held
#: sweeps of the earlier 25K-parameter benchmark, commit 8a43079's artefacts; every sweep replayed now is
#: out of sample for it); the unpaired rule of earlier versions (comparison "interval", for the
#: ablation); and the online reference (calibrated on the sweep's own completed trials, no reference
#: needed).
COLLAPSE_SETTINGS: dict[str, dict[str, Any]] = {
    "collapse": {},
    "collapse-tuned": {"confidence": 0.7},
    "collapse-interval": {"comparison": "interval"},
    "collapse-online": {},
}
DESCRIPTIONS["collapse"] = (
    "CollapsePruner(reference surrogate), defaults (paired comparison, min_fraction 0.1, confidence 0.9)"
)
DESCRIPTIONS["collapse-tuned"] = "CollapsePruner(reference surrogate, confidence=0.7), paired"
DESCRIPTIONS["collapse-interval"] = (
    "CollapsePruner(reference surrogate, comparison='interval'): own interval vs pessimistic competitors"
)
DESCRIPTIONS["collapse-online"] = (
    "CollapsePruner(reference='online'): fitted on the sweep's completed trials (the builtin prior, tested "
    "on the sweep's curves, until then)"
)
#: The replay's online reference: refitted inline, so a replay is deterministic (hpo/rule/reference.py).
ONLINE_REPLAY = {"online": True, "refit": "inline"}


def factory(name: str, *, surrogate: Any = None) -> PrunerFactory:
    """The factory for ``name`` (see ``available_names``); collapse pruners need ``surrogate``."""
    if name == "collapse-online":
        return collapse_factory(name, ONLINE_REPLAY, **COLLAPSE_SETTINGS[name])
    if name in COLLAPSE_SETTINGS:
        if surrogate is None:
            raise ValueError(f"pruner {name!r} needs a surrogate")
        return collapse_factory(name, surrogate, **COLLAPSE_SETTINGS[name])
    return PEERS[name]


# ---------------------------------------------------------------------------------------------- frontiers
#: Each pruner family's own knobs, swept by ``collapse-hpo replay --frontier`` (hpo/replays/frontier.py):
#: family -> knob -> the values tried; a family's settings are every combination. The one place these grids
#: live. Resources (min_resource, grace_period, n_warmup_steps) are in thousandths of training (t_permille),
#: the same for every sweep. The grids were set before any frontier was drawn: each spans its library's
#: default or the setting of ``PEERS`` to both sides, no value was chosen on a replay.
#:
#: - sha / hyperband (Optuna) and asha (Ray): reduction factor and grace (the first rung);
#: - percentile (Optuna PercentilePruner; percentile 50 is MedianPruner): percentile and warm-up (4 startup
#:   trials, as the tuned peers);
#: - top-k: k (trials continued) and the fraction of training where they are chosen;
#: - conformal (surestop ConformalPruner): α, calibrated on the first max(5, n/4, ⌈1/α⌉) trials (fewer than
#:   1/α − 1 calibration runs cannot certify any threshold at α);
#: - collapse, collapse-online (ours): the pruner's one knob (``margin``) and, as the peers' first rung, the
#:   fraction of training where it starts judging (``min_fraction``; both ``CollapsePruner`` settings, the
#:   keys their names; collapse-online shares collapse's grid). ``min_fraction`` was added after the first
#:   frontiers (BENCHMARKS §25): 0.02 and 0.05 were tried first on random_s0 and never let the early loss
#:   ratio act (a prune carries a prediction, which needs 3 reports in [t̂/2, t̂]: on that sweep's grid of a
#:   report every 2% from t̂ 0.014 the first is at t̂ 0.094, past the early window 1.5 × min_fraction), so the
#:   grid starts at 0.06 (still past it there, not on denser grids or surestop_lora's).
FRONTIER_KNOBS: dict[str, dict[str, tuple[Any, ...]]] = {
    "sha": {"reduction_factor": (2, 3, 4), "min_resource": (20, 50, 100, 250)},
    "asha": {"reduction_factor": (2, 3, 4), "grace_period": (20, 50, 100, 250)},
    "hyperband": {"reduction_factor": (2, 3, 4), "min_resource": (20, 50, 100, 250)},
    "percentile": {"percentile": (10.0, 25.0, 50.0, 75.0), "n_warmup_steps": (0, 100, 250, 500)},
    "top-k": {"k": (1, 2, 3, 5, 10), "fraction": (0.05, 0.1, 0.25, 0.5)},
    "conformal": {"alpha": (0.02, 0.05, 0.1, 0.2, 0.3)},
    "collapse": {
        "margin": (0.0, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16),
        "min_fraction": (0.06, 0.08, 0.1),
    },
}
FRONTIER_KNOBS["collapse-online"] = FRONTIER_KNOBS["collapse"]

#: Frontier families whose library is optional (see ``OPTIONAL_LIBRARY``) and ours that need a surrogate.
FRONTIER_OPTIONAL: dict[str, str] = {"conformal": "surestop", "asha": "ray"}
FRONTIER_OURS = ("collapse", "collapse-online")


def _frontier_build(family: str, knobs: dict[str, Any]) -> Callable[[Sweep], Any]:
    """The pruner (Optuna) or scheduler (Ray) of a peer ``family`` at the setting ``knobs``."""

    def build(sweep: Sweep) -> Any:
        if family in ("sha", "hyperband", "percentile"):
            import optuna

            if family == "sha":
                return optuna.pruners.SuccessiveHalvingPruner(**knobs)
            if family == "hyperband":
                return optuna.pruners.HyperbandPruner(max_resource=STEP_SCALE, **knobs)
            return optuna.pruners.PercentilePruner(n_startup_trials=4, **knobs)
        if family == "asha":
            from ray.tune.schedulers import ASHAScheduler

            return ASHAScheduler(time_attr="t_permille", metric="loss", mode="min", max_t=STEP_SCALE, **knobs)
        if family == "conformal":
            from surestop import ConformalPruner

            n_cal = max(5, math.ceil(sweep.n_trials / 4), math.ceil(1.0 / float(knobs["alpha"])))
            return ConformalPruner(n_calibration=n_cal, **knobs)
        raise ValueError(f"no frontier builder for family {family!r}")

    return build


def frontier_factory(
    family: str, label: str, knobs: dict[str, Any], *, surrogate: Any = None
) -> PrunerFactory:
    """A factory of ``family``'s pruner at the setting ``knobs`` (one combination of ``FRONTIER_KNOBS``),
    named ``label`` in the tables. Ours need ``surrogate`` (collapse) or nothing (collapse-online)."""
    if family not in FRONTIER_KNOBS:
        raise ValueError(f"unknown frontier family {family!r}; choose from {', '.join(FRONTIER_KNOBS)}")
    if family == "collapse-online":
        return collapse_factory(label, ONLINE_REPLAY, **knobs)
    if family == "collapse":
        if surrogate is None:
            raise ValueError("frontier family 'collapse' needs a surrogate")
        return collapse_factory(label, surrogate, **knobs)
    if family == "top-k":
        return lambda: TopKAtFraction(label, fraction=float(knobs["fraction"]), k=int(knobs["k"]))
    build = _frontier_build(family, knobs)
    if family == "asha":
        return lambda: RayAdapter(label, build)
    return lambda: OptunaAdapter(label, build)
