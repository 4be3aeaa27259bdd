"""Launch a sweep on Ray Tune with the Optuna study as the single source of truth.

Architecture (why it is shaped like this):

- **Trials are asked in the driver.** `StudySearcher` is a small ``ray.tune.search.Searcher`` wrapping the
  study: each ``suggest`` calls ``study.ask`` in the driver process, so the sampler runs once, seeded, in one
  place. (Ray's ``OptunaSearch`` is not used: it hard-codes a NopPruner and records trials stopped by a
  scheduler as COMPLETE.) For samplers whose draws do not depend on results (random, qmc, grid) the whole plan
  is drawn up front and stored in the study as WAITING trials (``enqueue_trial``), so a pruned sweep, an
  unpruned sweep and an interrupted-then-resumed sweep train exactly the same hyperparameters. TPE asks live.
- **Each Ray trial is one Optuna trial.** The Tune config names the storage, the study and the trial number;
  the worker (`collapse_hpo.hpo.sweep.trial.trial_function`) opens the trial there, trains, reports to Optuna
  and Tune, and ends the trial itself (COMPLETE / PRUNED / FAIL). Everything a restart needs is in the
  storage: curves (intermediate values, step = tokens), controls and pruner decisions (user attrs),
  heartbeats.
- **Failures.** A trial that raises ends FAIL with its error recorded by the worker; a worker that dies
  (killed, out of memory) is failed by the driver with Ray's error. Either way the sweep goes on, and the
  trial's slot (draw, seed) is tried again while it has retries left (``retries`` in the YAML): a new Optuna
  trial with the same params and ``attempt`` + 1.
- **Resume.** ``resume`` opens the same study, waits until trials left RUNNING by a dead driver have a stale
  Optuna heartbeat (older than ``heartbeat.grace`` s), marks them FAIL (``interrupted``: not counted as an
  attempt) and reruns their slots from the start; completed and pruned trials are kept as they are.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collapse_hpo.hpo.optuna_side import store
from collapse_hpo.hpo.optuna_side.store import record_warning
from collapse_hpo.hpo.outputs.progress import Progress, human_tokens
from collapse_hpo.hpo.rule.judge import emit
from collapse_hpo.hpo.sweep.config import SweepConfig
from collapse_hpo.hpo.sweep.lease import SweepLease, retry_races
from collapse_hpo.hpo.sweep.preflight import preflight, slots
from collapse_hpo.hpo.sweep.space import sweep_total_tokens
from collapse_hpo.hpo.sweep.stop import STOP
from collapse_hpo.hpo.sweep.storage_errors import SpaceReserve, StorageFault, find_fault
from collapse_hpo.hpo.sweep.trial import (
    STORAGE_FAULT_KEY,
    open_storage,
    train_config,
    trial_config,
    trial_function,
)
from collapse_hpo.hpo.sweep.urls import hide_url, mask_text, mask_url, resolve_url, sqlite_file
from collapse_hpo.predictors.atomic import clean_stale_tmp, describe_os_error
from collapse_hpo.predictors.errors import InputError

if TYPE_CHECKING:
    import optuna

# Fields of the sweep file that may change between `run` and `resume` (they do not change what is trained).
RUNTIME_FIELDS = ("executor", "resources", "retries", "results", "source", "storage", "heartbeat")
# Study user attrs written by the runner.
SWEEP_ATTR = "sweep_config"
PRUNE_ATTR = "prune"
WALL_ATTR = "wall_time"  # list of {command, started (UTC), wall_s}: one per run / resume of the driver


@dataclass(frozen=True)
class SweepLocation:
    """Where a sweep lives: results folder, Optuna storage URL, study name, and whether it prunes."""

    results: Path
    storage_url: str
    study_name: str
    prune: bool


def locate(sweep: SweepConfig, results: str | os.PathLike[str] | None = None, *,
           no_prune: bool = False) -> SweepLocation:
    """The location of ``sweep``. With ``no_prune`` (and a pruner enabled in the file) the sweep is a separate
    one: study ``<name>-noprune`` in ``<results>-noprune`` (unless ``results`` is given)."""
    prune = sweep.pruner.enabled and not no_prune
    suffix = "-noprune" if (no_prune and sweep.pruner.enabled) else ""
    folder = sweep.results_dir(results)
    if suffix and results is None:
        folder = folder.with_name(folder.name + suffix)
    return SweepLocation(folder, sweep.storage_url(folder), sweep.name + suffix, prune)


def _sqlite_parent(url: str) -> Path | None:
    path = sqlite_file(url)
    return None if path is None else path.parent


def make_sampler(sweep: SweepConfig, *, warn: bool = False) -> optuna.samplers.BaseSampler:
    """The Optuna sampler named in the file, seeded.

    With ``warn``, a TPE sampler that would never leave its random start-up (``n_startup_trials`` ≥ the
    sweep's draws) is said once (``CollapseWarning``), before the sweep starts; ``create_study`` records it
    in the study user attr ``collapse_warnings``.
    """
    import optuna

    s = sweep.sampler
    if s.name == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    if s.name == "qmc":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.QMCSampler(seed=s.seed, scramble=True, warn_independent_sampling=False)
    if s.name == "grid":
        return optuna.samplers.GridSampler({k: d.values() for k, d in sweep.space.items()}, seed=s.seed)
    from collapse_hpo.hpo.optuna_side.pruner import (
        tpe_startup_warning,  # deferred: pulls optuna; this module loads it only when used
    )

    sampler = optuna.samplers.TPESampler(seed=s.seed)
    startup = tpe_startup_warning(sampler, sweep.n_draws)
    if warn and startup is not None:
        emit(startup)
    return sampler


def plan_draws(sweep: SweepConfig) -> list[dict[str, Any]]:
    """The hyperparameter draws of a sweep whose sampler does not depend on results, in order.

    Drawn with the seeded sampler in a scratch in-memory study, so the same file always gives the same plan.
    Grid draws follow the order of the values in the file (first key slowest).
    """
    import optuna

    if sweep.sampler.name == "grid":
        keys = list(sweep.space)
        grid = itertools.product(*(sweep.space[k].values() for k in keys))
        return [dict(zip(keys, combo)) for combo in grid]
    dists = {k: d.to_optuna() for k, d in sweep.space.items()}
    scratch = optuna.create_study(sampler=make_sampler(sweep))
    draws = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(sweep.n_draws):
            t = scratch.ask(dists)
            draws.append(dict(t.params))
            scratch.tell(t, 0.0)
    return draws


def _sweep_fingerprint(sweep: SweepConfig) -> dict[str, Any]:
    """The fields that define what a sweep trains (stored in the study; passwords masked)."""
    d = masked_sweep(sweep)
    for key in RUNTIME_FIELDS:
        d.pop(key, None)
    if d.get("stages") is None:  # a sweep without stages keeps the fingerprint it had before they existed
        d.pop("stages", None)
    return d


def masked_sweep(sweep: SweepConfig) -> dict[str, Any]:
    """``sweep.to_jsonable()`` with the password of every storage URL replaced by ``***`` (for display and
    for the study's ``sweep_config`` attr, which optuna-dashboard shows)."""
    d = sweep.to_jsonable()
    if d.get("storage"):
        d["storage"] = mask_url(d["storage"])
    ref = (d.get("pruner") or {}).get("reference") or {}
    if ref.get("storage"):
        ref["storage"] = mask_url(ref["storage"])
    return d


def shippable_sweep(sweep: SweepConfig) -> SweepConfig:
    """``sweep`` as it may be handed to Ray (which writes its trial configs to disk): a storage URL with a
    password becomes ``${VAR}`` of a variable set in this process, inherited by a local Ray's workers."""
    ref = sweep.pruner.reference
    update: dict[str, Any] = {}
    if sweep.storage:
        update["storage"] = hide_url(sweep.storage)
    if ref.storage:
        new_ref = ref.model_copy(update={"storage": hide_url(ref.storage)})
        update["pruner"] = sweep.pruner.model_copy(update={"reference": new_ref})
    return sweep.model_copy(update=update) if update else sweep


def plan_key(t: optuna.trial.FrozenTrial) -> tuple[int, int, int]:
    """A trial's place in the plan: (draw, seed, number). Retries and reruns of a draw keep its place."""
    return (int(t.user_attrs.get("draw", t.number)), int(t.user_attrs.get("seed", 0)), t.number)


def plan_order_study(study: optuna.Study, storage: Any) -> optuna.Study:
    """The same study, whose queue of WAITING trials is served in plan order (`plan_key`), not enqueue order.

    Why: a resumed sweep re-queues its interrupted and failed slots after the draws that had not started. In
    enqueue order it would then train them last, so every later decision would see other competitors than in
    the uninterrupted sweep. In plan order a sweep with one worker trains the same trials in the same order
    however often it is interrupted, and every decision is a function of the plan and the recorded curves.

    Private API: Optuna's ``Study.ask`` takes the next queued trial from ``Study._pop_waiting_trial_id``; this
    overrides it (same claim, other order). No public API chooses which queued trial ``ask`` returns.
    tests/test_private_apis.py fails if ``ask`` stops calling it.
    """
    import optuna
    from optuna.exceptions import UpdateFinishedTrialError

    waiting_state = optuna.trial.TrialState.WAITING
    running_state = optuna.trial.TrialState.RUNNING

    class PlanOrderStudy(optuna.Study):
        def _pop_waiting_trial_id(self) -> int | None:
            storage = store.storage_of(self)
            waiting = storage.get_all_trials(store.study_id_of(self), deepcopy=False, states=(waiting_state,))
            for trial in sorted(waiting, key=plan_key):
                trial_id = store.trial_id_of(trial)
                try:  # another process may claim or finish it first: then try the next one
                    if not storage.set_trial_state_values(trial_id, state=running_state):
                        continue
                except UpdateFinishedTrialError:
                    continue
                return trial_id
            return None

    return PlanOrderStudy(study_name=study.study_name, storage=storage, sampler=study.sampler,
                          pruner=study.pruner)


def create_study(sweep: SweepConfig, loc: SweepLocation, plan: list[dict[str, Any]] | None = None,
                 attrs: dict[str, Any] | None = None) -> optuna.Study:
    """Create the sweep's study (refusing to overwrite one) and store the plan as WAITING trials.

    ``plan``: the draws to train instead of the sampler's (`plan_draws`), e.g. stage 2 of a sweep with stages
    (hpo/sweep/stages.py); ``attrs``: more study user attrs, written before the plan is queued."""
    import optuna

    storage = retry_races(lambda: open_storage(loc.storage_url, sweep))
    try:
        study = optuna.create_study(study_name=loc.study_name, storage=storage, direction="minimize",
                                    sampler=make_sampler(sweep, warn=True), load_if_exists=False)
    except optuna.exceptions.DuplicatedStudyError:
        raise InputError(
            f"{sweep.source}: study {loc.study_name!r} already exists in {mask_url(loc.storage_url)}: "
            "continue it "
            f"with `collapse-hpo resume {sweep.source}`, or give --results DIR for a new sweep") from None
    study.set_user_attr(SWEEP_ATTR, _sweep_fingerprint(sweep))
    study.set_user_attr(PRUNE_ATTR, loc.prune)
    for key, value in (attrs or {}).items():
        study.set_user_attr(key, value)
    from collapse_hpo.hpo.optuna_side.pruner import (
        tpe_startup_warning,  # deferred: pulls optuna; this module loads it only when used
    )

    startup = tpe_startup_warning(study.sampler, sweep.n_draws)
    if startup is not None:
        record_warning(study, startup)
    if plan is not None or sweep.planned:
        for draw, params in enumerate(plan if plan is not None else plan_draws(sweep)):
            for seed in sweep.seeds:
                study.enqueue_trial(params, user_attrs={"draw": draw, "seed": seed, "attempt": 0})
    return plan_order_study(study, storage)


def open_study(sweep: SweepConfig, loc: SweepLocation) -> optuna.Study:
    """Open an existing sweep study (`resume`, `report`); InputError if there is none or the file changed."""
    import optuna

    storage = retry_races(lambda: open_storage(loc.storage_url, sweep))
    try:
        study = optuna.load_study(study_name=loc.study_name, storage=storage, sampler=make_sampler(sweep))
    except KeyError:
        raise InputError(f"{sweep.source}: no sweep {loc.study_name!r} in {mask_url(loc.storage_url)} yet: "
                         "start it "
                         f"with `collapse-hpo run {sweep.source}`") from None
    stored = study.user_attrs.get(SWEEP_ATTR)
    now = _sweep_fingerprint(sweep)
    if isinstance(stored, dict) and stored != now:
        changed = sorted(k for k in set(stored) | set(now) if stored.get(k) != now.get(k))
        raise InputError(f"{sweep.source}: field '{changed[0]}': changed since the sweep started (was "
                         f"{json.dumps(stored.get(changed[0]))}); restore it, or start a new sweep with "
                         "--results")
    return plan_order_study(study, storage)


# ---------------------------------------------------------------------------------------------- slots
def _slot(t: optuna.trial.FrozenTrial) -> tuple[int, int]:
    return int(t.user_attrs.get("draw", t.number)), int(t.user_attrs.get("seed", 0))


def reconcile(study: optuna.Study, sweep: SweepConfig, progress: Progress | None = None) -> int:
    """Enqueue the slots (draw, seed) whose every trial failed, while they have retries left.

    A failure marked ``interrupted`` (stale heartbeat after a driver died) does not count as an attempt.
    Returns the number of trials enqueued.
    """
    import optuna

    TS = optuna.trial.TrialState
    by_slot: dict[tuple[int, int], list[optuna.trial.FrozenTrial]] = {}
    for t in study.get_trials(deepcopy=False):
        by_slot.setdefault(_slot(t), []).append(t)
    added = 0
    for slot, trials in sorted(by_slot.items()):
        if any(t.state != TS.FAIL for t in trials):
            continue
        attempts = sum(1 for t in trials if not t.user_attrs.get("interrupted"))
        last = max(trials, key=lambda t: t.number)
        if attempts > sweep.retries:
            continue
        study.enqueue_trial(dict(last.params), user_attrs={
            "draw": slot[0], "seed": slot[1], "attempt": attempts, "retry_of": last.number})
        added += 1
        if progress is not None:
            why = f"retry {attempts}/{sweep.retries}"
            if last.user_attrs.get("interrupted"):
                why = "rerun (interrupted)"
            progress.note(f"trial {last.number} (draw {slot[0]}, seed {slot[1]}) queued again: {why}")
    return added


def fail_stale_trials(study: optuna.Study, sweep: SweepConfig, progress: Progress | None = None,
                      sleep: Callable[[float], None] = time.sleep) -> list[int]:
    """Mark the trials left RUNNING by a dead driver FAIL (``interrupted``), once their heartbeat is stale.

    The caller holds the sweep's lease, so no other driver runs it; a trial that still beats belongs to a
    worker of the dead driver that Ray has not stopped yet (seconds after a SIGKILL, longer on a loaded
    machine). Such a worker is given ``heartbeat.grace`` seconds to stop, and its trial another ``grace`` +
    2 · ``interval`` to go stale: the wait is at most 2 · ``grace`` + 2 · ``interval`` seconds. Raises
    InputError if some trial still beats after that (a process outside this sweep's drivers records it).
    Returns the numbers of the trials marked FAIL.
    """
    import optuna

    storage, study_id = store.storage_of(study), store.study_id_of(study)
    hb = sweep.heartbeat
    wait = 2 * hb.grace + 2 * hb.interval
    deadline = time.monotonic() + wait
    failed: list[int] = []
    announced = False
    while True:
        for trial_id, age in store.heartbeat_ages(storage, study_id).items():
            if age is not None and age <= hb.grace:
                continue
            number = storage.get_trial(trial_id).number
            try:
                storage.set_trial_user_attr(trial_id, "interrupted", True)
                storage.set_trial_user_attr(
                    trial_id, "error", f"stale: no heartbeat for {age or 0:.0f} s (> grace {hb.grace} s); "
                    "its driver or worker died, rerun from the start")
                if storage.set_trial_state_values(trial_id, state=optuna.trial.TrialState.FAIL):
                    failed.append(number)
            except optuna.exceptions.UpdateFinishedTrialError:
                pass
        remaining = store.heartbeat_ages(storage, study_id)
        if not remaining:
            return failed
        if time.monotonic() > deadline:
            numbers = sorted(storage.get_trial(tid).number for tid in remaining)
            raise InputError(f"{sweep.source}: trials {numbers} of study {study.study_name!r} still record "
                             f"heartbeats {wait} s after resume started: another "
                             "process is running them (a driver of this sweep without its lease, or a Ray "
                             "worker of the dead driver that did not stop); stop it before resuming")
        if progress is not None and not announced:
            progress.note(f"waiting up to {wait} s for the heartbeats of {len(remaining)} trial(s) left "
                          "running by the previous driver to go stale")
            announced = True
        sleep(hb.interval)


# ---------------------------------------------------------------------------------------------- searcher
# The driver's open studies, by key: a searcher reaches its study through `_driver_study` (pickled by
# reference), never through its closure or globals, because Ray Tune pickles the searcher (by value: it is a
# local class) into tuner.pkl, and the study's storage holds the URL with its password.
_DRIVER_STUDIES: dict[int, optuna.Study] = {}


def _driver_study(key: int) -> optuna.Study:
    """The open study registered under ``key`` by `make_searcher`."""
    return _DRIVER_STUDIES[key]


def make_searcher(study_obj: optuna.Study, sweep_file: SweepConfig, location: SweepLocation,
                  progress: Progress, max_concurrent: int, error_dir: Path) -> Any:
    """A `StudySearcher` (defined lazily: Ray is imported only when a sweep runs).

    What the searcher holds is written to disk by Ray Tune (tuner.pkl): only the password-free sweep
    (`shippable_sweep`) and storage URL, and a key to the open study (`_DRIVER_STUDIES`)."""
    import optuna
    from ray.tune.search import Searcher

    TS = optuna.trial.TrialState

    # Set before Ray starts (`launch`): a local Ray's workers inherit the variables `hide_url` sets.
    sweep = shippable_sweep(sweep_file)
    loc = SweepLocation(location.results, hide_url(location.storage_url), location.study_name, location.prune)
    study_key = id(study_obj)
    _DRIVER_STUDIES[study_key] = study_obj

    class StudySearcher(Searcher):
        """A Ray Tune searcher that asks the Optuna study in the driver and reports back to it."""

        def __init__(self) -> None:
            super().__init__(metric="loss", mode="min")
            self.dists = {k: d.to_optuna() for k, d in sweep.space.items()}
            self.live: dict[str, int] = {}
            self.first_finished: list[optuna.trial.FrozenTrial] = []
            self.pids: dict[int, int] = {}  # trial number -> process id of its worker (from its results)
            self.fatal: str | None = None
            self.stopped: list[int] = []  # trials Ray Tune stopped with the sweep (a signal, a storage fault)

        def set_search_properties(self, metric: str | None, mode: str | None, config: dict,
                                  **spec: Any) -> bool:
            return True

        def _draws(self, trials: list[optuna.trial.FrozenTrial]) -> int:
            return len({int(t.user_attrs["draw"]) for t in trials if "draw" in t.user_attrs})

        def _storage_fault(self, err: Exception) -> None:
            """Stop the sweep on a storage fault (a full disk, a damaged database) met in a callback; any
            other error is re-raised. Ray Tune would log a callback's exception and go on."""
            fault = find_fault(err)
            if fault is None:
                raise err
            if STOP.fault is None:
                STOP.fault = str(fault)

        def suggest(self, trial_id: str) -> dict | str | None:
            try:
                return self._suggest(trial_id)
            except Exception as err:
                self._storage_fault(err)
                return None if self.live else Searcher.FINISHED

        def on_trial_result(self, trial_id: str, result: dict) -> None:
            if isinstance(result.get(STORAGE_FAULT_KEY), str) and STOP.fault is None:
                STOP.fault = result[STORAGE_FAULT_KEY]  # the trial's worker met it: no attempt is charged
            try:
                self._on_trial_result(trial_id, result)
            except Exception as err:
                self._storage_fault(err)

        def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
            if result and isinstance(result.get(STORAGE_FAULT_KEY), str) and STOP.fault is None:
                STOP.fault = result[STORAGE_FAULT_KEY]
            try:
                self._on_trial_complete(trial_id, result, error)
            except Exception as err:
                self._storage_fault(err)

        def _suggest(self, trial_id: str) -> dict | str | None:
            if self.fatal is not None or STOP.stopping:
                return None if self.live else Searcher.FINISHED
            if len(self.live) >= max_concurrent:
                return None
            study = _driver_study(study_key)
            trials = study.get_trials(deepcopy=False)
            waiting = any(t.state == TS.WAITING for t in trials)
            new_draw = not waiting and not sweep.planned and self._draws(trials) < sweep.n_draws
            if not waiting and not new_draw:
                return None if self.live else Searcher.FINISHED
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trial = study.ask(self.dists)
            store.record_heartbeat(study, trial)
            if new_draw:
                draw = self._draws(trials)
                trial.set_user_attr("draw", draw)
                trial.set_user_attr("seed", sweep.seeds[0])
                trial.set_user_attr("attempt", 0)
                for seed in sweep.seeds[1:]:
                    attrs0 = {"draw": draw, "seed": seed, "attempt": 0}
                    study.enqueue_trial(dict(trial.params), user_attrs=attrs0)
            self.live[trial_id] = trial.number
            attrs = store.storage_of(study).get_trial(store.trial_id_of(trial)).user_attrs
            note = f" (seed {attrs.get('seed', 0)}"
            note += f", attempt {attrs['attempt']})" if attrs.get("attempt") else ")"
            progress.started(trial.number, dict(trial.params), note if len(sweep.seeds) > 1 or
                             attrs.get("attempt") else "")
            return trial_config(sweep, loc.storage_url, loc.study_name, trial.number, loc.prune, loc.results)

        def _on_trial_result(self, trial_id: str, result: dict) -> None:
            number = self.live.get(trial_id)
            if number is not None and isinstance(result.get("pid"), int):
                self.pids[number] = int(result["pid"])
            if number is not None and "tokens" in result:
                progress.result(number, float(result["tokens"]))

        def _on_trial_complete(self, trial_id: str, result: dict | None, error: bool) -> None:
            number = self.live.pop(trial_id, None)
            if number is None:
                return
            study = _driver_study(study_key)
            tid = store.trial_id_by_number(study, number)
            frozen = store.storage_of(study).get_trial(tid)
            if frozen.state == TS.RUNNING and STOP.stopping and not error:
                self.stopped.append(number)  # stopped with the sweep: `launch` marks it interrupted
                return
            if frozen.state == TS.RUNNING:
                self._fail_dead_worker(tid, number, error)
                frozen = store.storage_of(study).get_trial(tid)
            progress.finished(frozen)
            self._watch_for_a_common_error(frozen)
            if frozen.state == TS.FAIL and self.fatal is None and not STOP.stopping:
                reconcile(study, sweep, progress)

        def _watch_for_a_common_error(self, frozen: optuna.trial.FrozenTrial) -> None:
            """Stop the sweep when its first two finished trials raised the same error (every trial will)."""
            if frozen.user_attrs.get("interrupted") or len(self.first_finished) >= 2:
                return
            self.first_finished.append(frozen)
            if len(self.first_finished) < 2:
                return
            a, b = self.first_finished
            self.fatal = common_error(a, b)
            if self.fatal is not None:
                progress.note(f"stopping: {self.fatal}")

        def _fail_dead_worker(self, tid: int, number: int, error: bool) -> None:
            text = "the Ray worker ended without finishing the trial (killed, out of memory or crashed)"
            err_file = error_dir / f"trial_{number}" / "error.txt"
            if err_file.is_file():
                lines = [ln.strip() for ln in err_file.read_text(errors="replace").splitlines() if ln.strip()]
                useful = [ln for ln in lines if not ln.startswith(("Failure #", "Traceback", "File "))]
                if useful:
                    text += f": {useful[-1][:300]}"
            s = store.storage_of(_driver_study(study_key))
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # it finished meanwhile
                store.fail(s, tid, {"error": mask_text(text),
                                    "tokens_trained": int(progress.running.get(number, 0.0))})

    return StudySearcher()


# ---------------------------------------------------------------------------------------------- launch
def unpruned_tokens(sweep: SweepConfig, study: optuna.Study | None = None) -> float:
    """Tokens of the planned trials each trained to the end (the compute of the sweep without pruning).

    Each slot (draw, seed) counts once with the trainer's exact token budget for its params (D is a whole
    number of steps of its batch_tokens); draws not made yet (TPE) count with the budget before rounding.
    """
    approx, _tpp, _n = sweep_total_tokens(sweep)
    slots: dict[tuple[int, int], float] = {}
    if study is not None:
        for t in study.get_trials(deepcopy=False):
            if _slot(t) in slots:
                continue
            total = t.user_attrs.get("total_tokens")
            if not isinstance(total, int | float):
                try:
                    total = train_config(sweep, dict(t.params), _slot(t)[1])[1]["total_tokens"]
                except (InputError, KeyError):
                    total = approx
            slots[_slot(t)] = float(total)
    missing = max(0, sweep.n_trials - len(slots))
    return float(sum(slots.values())) + missing * float(approx)


def _init_ray(sweep: SweepConfig) -> None:
    import logging

    import ray

    # Ray's own output off: the old output engine honours verbose=0 (the new one always prints a banner).
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("TUNE_MAX_PENDING_TRIALS_PG", "1")
    # Ctrl-C is handled like SIGTERM and SIGHUP (hpo/sweep/stop.py): Ray Tune's own SIGINT handler would let
    # the driver exit 0 from a stopped sweep.
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    ex = sweep.executor
    common: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False,
                              "ignore_reinit_error": True}
    if ex.address:
        ray.init(address=ex.address, **common)
    else:
        ray.init(num_cpus=ex.num_cpus or os.cpu_count() or 1, num_gpus=ex.num_gpus,
                 include_dashboard=False, **common)
    for name in ("ray", "ray.tune", "ray.train", "ray.air"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # Tune's experiment state is never restored from (the study is the source of truth): a failed save of it
    # (a full disk) is no error of the sweep's, and its traceback would bury the one line that says so.
    logging.getLogger("ray.tune.execution.experiment_state").setLevel(logging.CRITICAL)
    STOP.install()  # ray.init replaced the SIGTERM handler with one that ends in Ray's C++ abort


def _capacity(sweep: SweepConfig) -> int:
    import ray

    res = ray.cluster_resources()
    return slots(sweep, float(res.get("CPU", 1.0)), float(res.get("GPU", 0.0)))


def cluster_unknown(sweep: SweepConfig) -> bool:
    """Whether only a running Ray can tell if a trial fits: a cluster at an address, or a local Ray whose GPUs
    the file does not count (``executor.num_gpus`` unset) for trials that need one. Otherwise preflight's
    `check_local_resources` has checked it from the file."""
    return bool(sweep.executor.address) or (sweep.resources.gpu > 0 and sweep.executor.num_gpus is None)


def _start_cluster(sweep: SweepConfig, loc: SweepLocation) -> None:
    """Start (or join) Ray as `launch` does and check that a trial fits, before any file of the sweep is
    made: a refusal (InputError) then leaves no results folder and no study behind. `launch` finds it
    started (``ignore_reinit_error``)."""
    shippable_sweep(sweep)  # password-holding URLs into this process's environment before Ray starts
    hide_url(loc.storage_url)
    _init_ray(sweep)
    _capacity(sweep)


def common_error(a: optuna.trial.FrozenTrial, b: optuna.trial.FrozenTrial) -> str | None:
    """The error every trial will hit, when trials ``a`` and ``b`` both FAILed raising the same error (type
    and message) that no injected fault explains; else None. A worker killed from outside (no traceback) is
    not such an error: its slot is retried."""
    import optuna

    errors = []
    for t in (a, b):
        attrs = t.user_attrs
        if t.state != optuna.trial.TrialState.FAIL or "traceback" not in attrs or "fault" in attrs:
            return None
        errors.append(str(t.user_attrs.get("error", "")))
    if not errors[0] or errors[0] != errors[1]:
        return None
    return mask_text(f"trials {a.number} and {b.number} failed with the same error, which every trial will "
                     f"hit: {errors[0].splitlines()[0][:300]}; fix the cause, then `collapse-hpo resume` it")


@dataclass(frozen=True)
class LaunchResult:
    """How a `launch` ended: ``fatal`` is the error that stopped the sweep (`common_error`) or None;
    ``memory_kill`` is Ray's message when its memory monitor killed a trial's worker (Ray Tune then stops
    the whole run: `launch` marks the trials and the driver starts Ray again for the rest)."""

    fatal: str | None = None
    memory_kill: str | None = None


def _ray_memory_kill(err: BaseException) -> str | None:
    """Ray's out-of-memory message when ``err`` (what `Tuner.fit` raised) comes from its memory monitor
    killing a worker, else None. Ray Tune 2.x does not expect that error from an actor task and raises a
    RuntimeError from it, ending the whole Tune run."""
    import ray.exceptions

    for e in (err, err.__cause__, err.__context__):
        if isinstance(e, ray.exceptions.OutOfMemoryError):
            return str(e)
    return None


def _killed_pids(message: str) -> set[int]:
    """Process ids of the workers Ray's memory monitor says it killed (``Selected to kill: (...pid=N)``)."""
    return {int(p) for p in re.findall(r"Selected to kill:[^\n]*?\bpid=(\d+)", message)}


def launch(study: optuna.Study, sweep: SweepConfig, loc: SweepLocation, progress: Progress) -> LaunchResult:
    """Run the study's remaining trials on Ray Tune until every slot is done (or out of retries), or until
    the sweep is stopped (a signal: hpo/sweep/stop.py; `common_error`; a worker killed by Ray's memory
    monitor). Raises `StorageFault` when the storage failed (a full disk), leaving the running trials to the
    caller."""
    import optuna
    import ray
    from ray import tune

    shippable_sweep(sweep)  # password-holding URLs into this process's environment before Ray starts
    hide_url(loc.storage_url)
    _init_ray(sweep)
    searcher = None
    memory_kill = None
    forced: KeyboardInterrupt | None = None
    try:
        capacity = _capacity(sweep)
        run_name = f"{loc.study_name}-{time.strftime('%Y%m%d-%H%M%S')}"
        ray_dir = loc.results / "ray"
        searcher = make_searcher(study, sweep, loc, progress, capacity, ray_dir / run_name)
        resources = {"cpu": sweep.resources.cpu, "gpu": sweep.resources.gpu}
        trainable = tune.with_resources(trial_function, resources)
        tuner = tune.Tuner(
            trainable,
            tune_config=tune.TuneConfig(
                search_alg=searcher, num_samples=-1, max_concurrent_trials=capacity, reuse_actors=True,
                trial_name_creator=lambda t: f"trial_{t.config.get('number', t.trial_id)}",
                trial_dirname_creator=lambda t: f"trial_{t.config.get('number', t.trial_id)}",
            ),
            run_config=tune.RunConfig(
                name=run_name, storage_path=str(ray_dir), verbose=0, stop=STOP.stopper(progress.note),
                failure_config=tune.FailureConfig(max_failures=0),
            ),
        )
        try:
            tuner.fit()
        except RuntimeError as err:
            memory_kill = _ray_memory_kill(err)
            if memory_kill is None:
                raise
    except Exception as err:  # Ray Tune's own files on a full disk (its experiment state), ...
        fault = find_fault(err)
        if fault is None:
            raise
        STOP.fault = STOP.fault or str(fault)
    except KeyboardInterrupt as err:  # a second signal (hpo/sweep/stop.py): stop at once, but mark the trials
        forced = err
    finally:
        ray.shutdown()
        _DRIVER_STUDIES.pop(id(study), None)
    # Trials still RUNNING in the study were stopped with the cluster. After a signal (Ctrl-C, SIGTERM,
    # SIGHUP: hpo/sweep/stop.py) they are marked interrupted (resume reruns them without waiting for their
    # heartbeats to go stale). After a memory kill, the killed ones (by process id; a trial that never
    # reported counts as killed) are FAIL with that reason and count as an attempt; the others are
    # interrupted and rerun.
    if STOP.fault is not None:  # the storage failed: `_run_locked` frees room and marks the trials
        raise StorageFault(STOP.fault, "storage")
    killed = _killed_pids(memory_kill) if memory_kill is not None else set()
    summary = " ".join((memory_kill or "").split("\n")[0].split())[:240]
    left = sorted([*searcher.live.values(), *searcher.stopped]) if searcher is not None else []
    for number in left:
        storage = store.storage_of(study)
        tid = store.trial_id_by_number(study, number)
        stored = storage.get_trial(tid)
        if stored.state != optuna.trial.TrialState.RUNNING:
            continue
        pid = searcher.pids.get(number) if searcher is not None else None
        out_of_memory = memory_kill is not None and (pid is None or pid in killed)
        # what it trained: its last report in storage (a worker's report can be ahead of the driver's view)
        trained = int(max(progress.running.get(number, 0.0), max(stored.intermediate_values, default=0)))
        try:
            if out_of_memory:
                store.fail(storage, tid, {
                    "error": f"out of memory: Ray's memory monitor killed the trial's worker ({summary}); "
                             "lower train.micro_batch_tokens or run fewer trials at once",
                    "out_of_memory": True,
                    "tokens_trained": trained,
                })
            else:
                store.fail(storage, tid, {
                    "interrupted": True,
                    "error": "interrupted: the sweep was stopped while it ran; `collapse-hpo resume` reruns "
                             "it",
                    "tokens_trained": trained,
                })
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        if out_of_memory:
            progress.finished(storage.get_trial(tid))
        else:  # rerun by `resume`, so not counted as failed; its tokens stay spent
            progress.running.pop(number, None)
            progress.spent_before += trained
            progress.note(f"trial {number} was running when the sweep stopped: marked FAIL (interrupted)")
    if forced is not None:
        raise forced
    if memory_kill is not None:
        reconcile(study, sweep, progress)
    return LaunchResult(searcher.fatal if searcher is not None else None, memory_kill)


def run_sweep(sweep: SweepConfig, loc: SweepLocation, *, resume: bool = False, out: Any = None,
              plan: list[dict[str, Any]] | None = None, attrs: dict[str, Any] | None = None) -> optuna.Study:
    """Create (``run``) or continue (``resume``) the sweep at ``loc`` and run it to the end.

    ``plan`` and ``attrs`` go to `create_study` (a new sweep only).

    Nothing is created when the file, the reference, the storage or the results folder is bad (InputError
    from `collapse_hpo.hpo.sweep.preflight`). One driver per sweep: the lease
    (`collapse_hpo.hpo.sweep.lease`) is held
    while it runs, and a second driver is refused. Prints one line per event and returns the study; raises
    InputError when the first two trials failed with the same error (`common_error`).
    """

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    preflight(sweep, loc.results, loc.storage_url, loc.prune)
    if cluster_unknown(sweep):
        with STOP.handling():  # our signal handlers only while Ray starts (launch installs them again)
            _start_cluster(sweep, loc)
    parent = _sqlite_parent(loc.storage_url)
    default_db = parent is not None and parent == loc.results
    if resume and default_db and not (parent / "study.db").exists():  # type: ignore[operator]
        raise InputError(f"{sweep.source}: no sweep to resume in {loc.results}: start it with "
                         f"`collapse-hpo run {sweep.source}`")
    try:
        loc.results.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"{sweep.source}: {describe_os_error(loc.results, err)}") from None
    clean_stale_tmp(loc.results)
    url = resolve_url(loc.storage_url, f"{sweep.source}: field 'storage'")
    lease = SweepLease(url, loc.study_name, interval=sweep.heartbeat.interval, expiry=sweep.heartbeat.grace,
                       where=str(sweep.source))
    reserve = SpaceReserve(url, loc.study_name)
    with STOP.handling():
        try:
            reserve.keep()
            lease.acquire(on_wait=lambda line: print(line, file=out or sys.stdout, flush=True))
            with STOP.deferred():
                return _run_locked(sweep, loc, resume=resume, out=out, plan=plan, attrs=attrs,
                                   reserve=reserve)
        finally:
            reserve.free()  # before the lease: on a full disk its room is what the release needs
            lease.release()


def _run_locked(sweep: SweepConfig, loc: SweepLocation, *, resume: bool, out: Any,
                plan: list[dict[str, Any]] | None = None, attrs: dict[str, Any] | None = None,
                reserve: SpaceReserve | None = None) -> optuna.Study:
    if resume:
        study = open_study(sweep, loc)
        loc = SweepLocation(loc.results, loc.storage_url, loc.study_name,
                            bool(study.user_attrs.get(PRUNE_ATTR, loc.prune)))
    else:
        study = create_study(sweep, loc, plan, attrs)
    progress = Progress(unpruned_tokens(sweep, study), out=out)
    if resume:
        finished = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
        progress.seed_from([t for t in finished if not t.user_attrs.get("interrupted")])
        progress.seed_spent([t for t in finished if t.user_attrs.get("interrupted")])
        stale = fail_stale_trials(study, sweep, progress)
        progress.seed_spent([t for t in study.get_trials(deepcopy=False) if t.number in stale])
        if stale:
            progress.note(f"trials {stale} were running when the driver stopped: marked FAIL (interrupted)")
        reconcile(study, sweep, progress)
    mode = "pruning on" if loc.prune else "pruning off"
    per_trial = human_tokens(progress.unpruned_tokens / max(1, sweep.n_trials))
    progress.note(f"sweep {loc.study_name!r}: {sweep.n_trials} trials of {per_trial} tokens, {mode}, "
                  f"storage {mask_url(loc.storage_url)}")
    started = time.time()
    fatal = None
    if not _work_left(study, sweep):
        progress.note("nothing left to run: every trial of the sweep has finished")
    rounds = 0
    while not STOP.stopping and _work_left(study, sweep):
        try:
            result = launch(study, sweep, loc, progress)
        except StorageFault as fault:
            if reserve is not None:
                reserve.free()  # room for the last writes below and the lease's release
            raise StorageFault(f"{fault}; {_interrupt_running(study, progress, str(fault))}", "storage") \
                from None
        fatal = result.fatal
        if fatal is not None or result.memory_kill is None or STOP.stopping:
            break
        rounds += 1
        if rounds > 2 * sweep.n_trials * (sweep.retries + 1):
            fatal = ("Ray's memory monitor keeps killing the trials' workers; lower train.micro_batch_tokens "
                     "or run fewer trials at once (executor.num_cpus / resources.cpu)")
            break
        progress.note("Ray's memory monitor killed a trial's worker, which stops Ray Tune: starting it again "
                      "for the remaining trials")
    segments = list(study.user_attrs.get(WALL_ATTR) or [])
    segments.append({"command": "resume" if resume else "run", "started": time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "wall_s": round(time.time() - started, 1)})
    study.set_user_attr(WALL_ATTR, segments)
    if fatal is not None:
        raise InputError(f"{sweep.source}: {fatal}")
    return study


def _interrupt_running(study: optuna.Study, progress: Progress, why: str) -> str:
    """Mark every trial of the study still RUNNING (the driver holds the lease and Ray is stopped: each was
    one of this driver's) FAIL ``interrupted`` after a storage fault; returns what happened to them, for the
    one-line error (`resume` reruns them without using a retry)."""
    import optuna

    storage = store.storage_of(study)
    marked: list[int] = []
    try:
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            try:
                store.fail(storage, store.trial_id_of(t), {"interrupted": True,
                                                           "error": f"storage fault: {why}"[:500]})
            except optuna.exceptions.UpdateFinishedTrialError:
                continue
            marked.append(t.number)
            progress.running.pop(t.number, None)
    except StorageFault:
        return ("the trials that were running could not be marked (the storage still fails): `collapse-hpo "
                "resume` finds them stale and reruns them, no retry used")
    if not marked:
        return "no trial was running"
    return (f"trials {marked} were running: marked interrupted, `collapse-hpo resume` reruns them (no retry "
            "used)")


def all_failed(study: optuna.Study) -> str | None:
    """When no trial of the study COMPLETEd or was PRUNED and at least one FAILed: one line with the count
    and the first error; else None. A sweep like that must not look successful (its exit status is not 0)."""
    import optuna

    TS = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    if any(t.state in (TS.COMPLETE, TS.PRUNED) for t in trials):
        return None
    failed = [t for t in trials if t.state == TS.FAIL]
    if not failed:
        return None
    first = str(failed[0].user_attrs.get("error", "no error recorded")).splitlines()[0][:300]
    return mask_text(f"every trial failed ({len(failed)} of {len(trials)}); trial {failed[0].number}: "
                     f"{first}")


def _work_left(study: optuna.Study, sweep: SweepConfig) -> bool:
    import optuna

    trials = study.get_trials(deepcopy=False)
    if any(t.state in (optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING) for t in trials):
        return True
    draws = {t.user_attrs.get("draw") for t in trials}
    return not sweep.planned and len(draws - {None}) < sweep.n_draws
