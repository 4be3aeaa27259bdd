"""`CollapseScheduler`: the collapse pruning rule as a Ray Tune ``TrialScheduler`` for existing Tune jobs.

The rule is told once, in hpo/rule/decision.py's module docstring, and applied by the judge that the Optuna
``CollapsePruner`` shares (hpo/rule/judge.py). This module only translates for Ray Tune: each result becomes
a point of the trial's record and the judge's view of it, each verdict STOP or CONTINUE, a line of the state
journal (hpo/ray_side/scheduler_state.py) and, when a study is given, an Optuna trial (the mirror, written
through hpo/optuna_side/store.py). How to use it, and what it stores where: the class docstring; README.md
("In an existing Ray Tune job") walks through a job.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collapse_hpo.hpo.sweep.preflight import check_storage
from collapse_hpo.hpo.sweep.trial import storage_url

try:
    from ray.tune.schedulers.trial_scheduler import FIFOScheduler, TrialScheduler
except ModuleNotFoundError as err:  # a core install: Ray Tune comes with the `ray` extra
    if err.name != "ray":
        raise
    raise ModuleNotFoundError("CollapseScheduler needs Ray Tune, which is not installed: "
                              "pip install 'collapse-hpo[ray]'", name="ray") from err

from collapse_hpo.hpo.optuna_side import store
from collapse_hpo.hpo.ray_side.scheduler_state import (
    STATE_FILE,
    STATE_FORMAT,
    STATE_VERSION,
    STATUSES,
    T_HAT_STEPS,
    SchedulerState,
    StateNote,
    StateWriter,
    TrialRecord,
    apply,
    journal_path,
    read_state,
    step_of,
    write_snapshot,
)
from collapse_hpo.hpo.rule.curve import CurveView
from collapse_hpo.hpo.rule.decision import PruneSettings, settings_of
from collapse_hpo.hpo.rule.judge import (
    DEFAULT_JUDGE_EVERY,
    Judge,
    JudgeWarning,
    TrialView,
    Verdict,
    add_warning,
    emit,
)
from collapse_hpo.hpo.rule.record import (
    COMPLETE_T_HAT,
    PRUNE_REASON_ATTR,
    RAY_CONFIG_ATTR,
    RAY_TRIAL_ATTR,
    DecisionEntry,
    TrialControls,
    check_units,
    sampler_value,
)
from collapse_hpo.hpo.rule.reference import OnlineReference, make_reference
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import Surrogate

if TYPE_CHECKING:
    import optuna
    from ray.tune.experiment import Trial

__all__ = [
    "MIRROR_SHARED_WARNING", "MISSING_KEY_WARNING", "PRUNED_KEY", "REASON_KEY", "STATE_FILE", "STATE_FORMAT",
    "STATE_VERSION",
    "STATUSES", "T_HAT_STEPS", "CollapseScheduler", "StateNote", "TrialRecord",
]

#: Keys this scheduler adds to each trial's last result (``ResultGrid``'s ``Result.metrics``, Tune's table).
PRUNED_KEY = "collapse_pruned"
REASON_KEY = "collapse_reason"
#: The warning key (``JudgeWarning.key``) of results that carry no ``time_attr`` or no metric: said once.
MISSING_KEY_WARNING = "result_key_missing"
#: The warning key of a mirror study that already holds trials of another Tune run (a rerun in one folder).
MIRROR_SHARED_WARNING = "mirror_holds_other_runs"

ControlsFn = Callable[[Mapping[str, Any]], Mapping[str, Any]]


class CollapseScheduler(FIFOScheduler):
    """Stop Ray Tune trials whose predicted final loss will confidently not win (FIFO order otherwise).

    Add it to any ``Tuner(...)`` (any search algorithm); the trainable reports the training loss and its
    progress with ``ray.tune.report``. From ``min_fraction`` of training on, a trial is stopped when
    ``keep_top_k`` of the others lead it by more than the margin at a common fraction of training (the rule:
    hpo/rule/decision.py's module docstring). Only trials that Tune adds in this session compete (completed
    ones by their final loss, running ones by their latest logged prediction), so a fresh run in an old
    experiment directory ignores stale trials.

    State and restores: Ray Tune does not save a scheduler's state (``Tuner.restore`` unpickles it as it was
    before ``fit``), so this one keeps its own: every trial's curve, latest prediction, judgements and
    outcome, in the experiment directory (``collapse_scheduler_state.json``, or ``state_path``) as a snapshot
    plus an append-only journal beside it (``collapse_scheduler_state.journal.json``; format, durability and
    compaction: hpo/ray_side/scheduler_state.py). Each result appends one journal line (the report and the
    decision it caused) before Tune is answered, so a result costs the same at any curve length and number of
    trials; the snapshot is rewritten only when the journal has outgrown it, at ``save`` and when a scheduler
    loads the state. Read it with ``CollapseScheduler.load_state(experiment_path)`` (the snapshot alone is not
    the whole state; a restored ``Tuner`` gives no scheduler object) and ``load_warnings``. On a local
    filesystem the state lives at the storage path, and the copies Tune's restore puts into its driver
    staging directory are removed, so Tune's sync of that directory cannot overwrite it; on a remote one it is
    written into the staging directory, which Tune syncs up. A restored run reloads it: a trial pruned before
    the interruption is stopped again at once, completed trials keep counting, and replayed results (a trial
    restarted from its checkpoint or from scratch re-reports t̂ it already reported) are answered from the
    record instead of being judged again, so the decisions after a restore are the ones the uninterrupted
    run would have made. Between two judgements a result only appends its point to the record, to a
    per-trial cache of what the judge reads and to the journal; nothing is re-read, re-sorted or
    re-serialized.

    Outcome in the results: Tune shows a pruned trial as TERMINATED, like any stopped trial, and has no hook
    to change a result before it is recorded; so when a trial ends (``on_trial_complete``,
    ``on_trial_error``) the scheduler adds ``collapse_pruned`` (bool) and ``collapse_reason`` (one line) to
    the trial's last result, ``Trial.last_result``, in place. Tune prints that result's table and saves it
    with the experiment state, so ``ResultGrid``'s ``Result.metrics`` has both keys, also after
    ``Tuner.restore``; the trial's result.json and progress.csv were written before, so
    ``ResultGrid.get_dataframe()`` and ``Result.metrics_dataframe`` do not.

    Args:
        reference: where the surrogate comes from: a ``Surrogate``, a surrogate JSON path, ``"online"`` (the
            mirrored study's own completed trials; needs ``storage``), a mapping as in the sweep YAML, or None
            (no prediction: only NaN/inf/non-positive losses are stopped).
        metric: result key of the training loss (default: TuneConfig's metric, else "loss"). Lower is better.
        mode: "min" (the only mode that makes sense for a loss; default from TuneConfig, else "min").
            Give ``metric``/``mode`` here or to ``TuneConfig``, not both: Ray Tune refuses both with a
            ValueError ("... the scheduler you are using was already instantiated with their own `metric` and
            `mode` parameters").
        time_attr: result key of the training progress, in ``units``; default "t_hat". A result without it
            (or without the metric) is not judged, and the first such result is said once (a
            ``CollapseWarning``): a trainable written for ASHA reports ``training_iteration`` only.
        units: what ``time_attr`` counts: "fraction" (t̂ = tokens seen / total tokens itself; the default
            without a total), "tokens" (tokens seen; the default with a total) or "steps" (optimizer steps).
            t̂ = ``result[time_attr]`` / ``total`` unless it is "fraction".
        total: the training length in ``units`` (tokens D, or optimizer steps), or the name of a result or
            config key holding each trial's; None with ``units="fraction"``.
        total_tokens: the same as ``total`` with ``units="tokens"``, in tokens (give one of the two).
        schedule, tau, tpp: the trials' controls, used when ``controls`` gives none: the LR schedule shape
            (a ``Schedule``, kind name or dict; None = linear decay to zero); the AdamW timescale
            τ = B/(η·λ·D), a fraction of training (None = no weight decay; 1/(η·λ·steps) for a run counted in
            steps); tokens per parameter D/N (None = not defined, e.g. fine-tuning).
        controls: optional ``controls(config) -> mapping`` with any of ``schedule``, ``tau``, ``tpp``,
            ``total`` (in ``units``), ``total_tokens`` for one trial (e.g. ``lambda c: {"tau": c["tau"]}``).
        settings: a ``PruneSettings`` (hpo/rule/decision.py), the same object the Optuna ``CollapsePruner``
            takes; None = built from the shortcuts below.
        min_fraction, confidence, keep_top_k, comparison, margin: shortcuts for the ``PruneSettings`` fields
            of those names, as the pruner's (None = the field's default; with ``settings`` given, a shortcut
            that differs from its value there is an error): ``min_fraction``, the fraction of training t̂
            before which nothing is judged; ``confidence`` of the predicted interval; ``keep_top_k``;
            ``comparison``; ``margin``, a log-ratio of losses (0.04 = 4%).
        judge_every: judge at most once per this fraction of training t̂, in [0, 1) (0 = at every result;
            default 0.02), as the pruner's option of that name.
        state_path: where to keep the state's snapshot (its journal goes beside it, see
            ``scheduler_state.journal_path``); default: ``collapse_scheduler_state.json`` in the experiment
            directory (on a remote storage filesystem: in the driver's staging copy that Tune syncs up).
        storage, study_name: Optuna storage URL and study to mirror trials into (both or neither). Each Tune
            trial becomes an Optuna trial with honest states: RUNNING while it trains, its reports as
            intermediate values (step = the progress in ``units``, the pruner's convention, with the user
            attrs ``units`` and ``total``; when only t̂ is known, step = round(t̂ · T_HAT_STEPS), ``units``
            "fraction" and ``total`` T_HAT_STEPS); PRUNED with the pruner's user attrs when this scheduler
            stops it; COMPLETE with its final loss when it trains to the end; PRUNED with a ``prune_reason``
            saying so when something else stopped it early; FAIL when it errored. The numeric config values
            Tune's search drew (``Trial.evaluated_params``) become trial params; the whole config is kept in
            the user attr ``ray_config``. The URL is checked here as ``collapse-hpo run`` checks a sweep's
            storage (preflight.py ``check_storage``): InputError, one line naming the URL with its password
            masked, when it is no sqlite, postgresql or mysql URL, a SQLite file's folder does not exist, or
            a server does not answer within ``CONNECT_TIMEOUT_S``. ``${NAME}`` reads the URL from the
            environment variable NAME.
        param_distributions: Optuna distributions of config keys, for the mirrored trial params (default: a
            one-point distribution at the value; constants of the param space are not params).
        complete_fraction: a trial that ends at t̂ ≥ this (a fraction of training, in (0, 1]) is COMPLETE (its
            last loss is the final loss).
        report_prediction: as the pruner's option of that name: a mirrored PRUNED trial gets its predicted
            final loss as an intermediate value at its final step (``sampler_value_step``), so its value is
            the prediction (default: its last reported loss, Optuna's convention). A sampler reading the
            study then ranks pruned trials by their prediction, so a bad prediction steers it. Needs a mirror.

    Raises:
        InputError: on a bad argument (the message names it).

    Example: a scheduler for a Tune job whose trainable reports tokens seen out of 2M:

        >>> from ray import tune
        >>> from collapse_hpo.hpo.ray_side.scheduler import CollapseScheduler
        >>> from collapse_hpo.hpo.rule.decision import PruneSettings
        >>> def train_fn(config):  # stands in for training
        ...     for tokens in range(100_000, 2_000_001, 100_000):
        ...         tune.report({"loss": 3.0 + config["lr"] * 2_000_000 / tokens, "tokens": tokens})
        >>> scheduler = CollapseScheduler(
        ...     reference=None,  # normally a surrogate JSON of `collapse-hpo calibrate`, or "online"
        ...     metric="loss", time_attr="tokens", units="tokens", total_tokens=2_000_000,
        ...     schedule="linear", tau=0.2, tpp=20.0, settings=PruneSettings(margin=0.04))
        >>> scheduler.units, scheduler.total, scheduler.settings.min_fraction
        ('tokens', 2000000, 0.1)
        >>> tuner = tune.Tuner(train_fn, param_space={"lr": tune.loguniform(1e-3, 1e-1)},
        ...                    tune_config=tune.TuneConfig(scheduler=scheduler, num_samples=8))
        >>> results = tuner.fit()  # doctest: +SKIP
    """

    def __init__(
        self,
        reference: Any = None,
        *,
        metric: str | None = None,
        mode: str | None = None,
        time_attr: str = "t_hat",
        units: str | None = None,
        total: float | str | None = None,
        total_tokens: float | str | None = None,
        schedule: Schedule | str | Mapping[str, Any] | None = None,
        tau: float | None = None,
        tpp: float | None = None,
        controls: ControlsFn | None = None,
        settings: PruneSettings | None = None,
        min_fraction: float | None = None,
        confidence: float | None = None,
        keep_top_k: int | None = None,
        comparison: str | None = None,
        margin: float | None = None,
        state_path: str | os.PathLike[str] | None = None,
        storage: str | None = None,
        study_name: str | None = None,
        param_distributions: Mapping[str, Any] | None = None,
        complete_fraction: float = COMPLETE_T_HAT,
        report_prediction: bool = False,
        judge_every: float = DEFAULT_JUDGE_EVERY,
    ) -> None:
        super().__init__()
        if mode is not None and mode != "min":
            raise InputError(f"CollapseScheduler: mode must be 'min' (the metric is a loss), got {mode!r}")
        if not isinstance(time_attr, str) or not time_attr:
            raise InputError(f"CollapseScheduler: time_attr must be a result key, got {time_attr!r}")
        self.units, self.total = _progress_units(units, total, total_tokens)
        if (storage is None) != (study_name is None):
            raise InputError(
                "CollapseScheduler: give both storage and study_name to mirror into Optuna, or neither"
            )
        if storage is not None:
            _check_storage(storage)
        if not 0.0 < complete_fraction <= 1.0:
            raise InputError(
                f"CollapseScheduler: complete_fraction must be in (0, 1], got {complete_fraction}"
            )
        if isinstance(reference, str) and reference.strip().lower() == "online" and storage is None:
            raise InputError(
                "CollapseScheduler: reference='online' needs storage and study_name (the mirror)"
            )
        self._metric = metric
        self._mode = mode
        self.time_attr = time_attr
        self.defaults = TrialControls.check(schedule=schedule, tau=tau, tpp=tpp, where="CollapseScheduler")
        self.controls = controls
        try:
            rule = settings_of(settings, min_fraction=min_fraction, confidence=confidence,
                               keep_top_k=keep_top_k, comparison=comparison, margin=margin)
            self.judge = Judge(rule, judge_every=judge_every)
        except InputError as err:
            raise InputError(f"CollapseScheduler: {err}") from None
        self.settings = self.judge.settings
        self.state_path = None if state_path is None else str(state_path)
        self.storage = storage
        self.study_name = study_name
        self.param_distributions = dict(param_distributions or {})
        self.complete_fraction = float(complete_fraction)
        if not isinstance(report_prediction, bool):
            raise InputError(
                f"CollapseScheduler: report_prediction must be true or false, got {report_prediction!r}"
            )
        if report_prediction and storage is None:
            raise InputError(
                "CollapseScheduler: report_prediction gives the prediction to an Optuna sampler through the "
                "mirror; give storage and study_name too"
            )
        self.report_prediction = report_prediction
        # A surrogate file is read now, so that a bad path fails before the Tune run starts.
        self._reference_spec = reference
        self._reference = None if reference is None else make_reference(reference)
        if isinstance(self._reference, OnlineReference) and storage is None:
            raise InputError(
                "CollapseScheduler: an online reference needs storage and study_name (the mirror)"
            )
        self._state = SchedulerState()  # records, warnings said (state key: collapse_warnings), seq
        self._records: dict[str, TrialRecord] = self._state.records
        self._writer: StateWriter | None = None  # keeps _state on disk (hpo/ray_side/scheduler_state.py)
        self._views: dict[str, _ViewCache] = {}
        self._active: set[str] = set()
        self._loaded_from: str | None = None
        self._study: optuna.study.Study | None = None

    # ------------------------------------------------------------------ pickling (Tune pickles the scheduler)
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_study"] = None  # a live storage connection does not pickle
        state["_reference"] = None  # references hold locks; rebuilt from the spec
        state["_state"] = SchedulerState()
        state["_records"] = state["_state"].records
        state["_writer"] = None  # an open journal does not pickle; the state is read again on first use
        state["_views"] = {}
        state["_active"] = set()
        state["_loaded_from"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        spec = self._reference_spec
        self._reference = None if spec is None else make_reference(spec)

    # ------------------------------------------------------------------ Tune API
    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        """Take metric and mode from TuneConfig unless given here (both set = conflict, as in Tune)."""
        if (self._metric and metric) or (self._mode and mode):
            return False
        if metric:
            self._metric = metric
        if mode:
            if mode != "min":
                raise InputError(f"CollapseScheduler: mode must be 'min' (a loss), got {mode!r}")
            self._mode = mode
        if self._metric is None:
            self._metric = "loss"
        if self._mode is None:
            self._mode = "min"
        return True

    @property
    def loss_key(self) -> str:
        """The result key of the training loss."""
        return self._metric or "loss"

    @property
    def metric(self) -> None:
        """None to Ray Tune, on purpose: with a scheduler metric set, Tune's strict metric check fails the
        whole ``Tuner.fit`` on a result without that key before the scheduler sees it. Such a result is this
        scheduler's to judge (it records the reason and goes on). The loss key is ``loss_key``."""
        return None

    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        """Register the trial (a restored one finds its record in the state file)."""
        self._ensure_loaded(trial)
        rec = self._records.get(trial.trial_id)
        if rec is None:
            rec = self._new_record(trial)
            if trial.status in ("TERMINATED", "ERROR"):  # restored as finished, but not in the state file
                rec.status = "stopped"
                rec.decision = {"prune_reason": "finished before this scheduler kept state; outcome unknown"}
            self._change(["trial", trial.trial_id, asdict(rec)], durable=True)
        elif rec.status == "error":  # restored with resume/restart_errored: it runs again
            # its FAIL stays in the mirror; the rerun is a new Optuna trial
            self._set(rec, durable=True, status="running", optuna_trial_id=None)
        self._commit()
        self._active.add(trial.trial_id)

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict[str, Any]) -> str:
        """Record the report and decide: CONTINUE or STOP."""
        self._ensure_loaded(trial)
        rec = self._records.get(trial.trial_id)
        if rec is None:
            self.on_trial_add(tune_controller, trial)
            rec = self._records[trial.trial_id]
        if rec.status == "pruned":
            return TrialScheduler.STOP  # pruned before a restore: stop the rerun at once
        point = self._point(rec, trial, result)
        if point is None:
            self._warn_missing_keys(trial, result)
            return TrialScheduler.CONTINUE
        t, y, tokens = point
        if rec.t_hat and t <= rec.t_hat[-1]:
            # A replay (restored trial re-reporting) or an out-of-order/repeated report: already judged.
            self._set(rec, replayed=rec.replayed + 1)
            self._commit()
            return TrialScheduler.CONTINUE
        if rec.status in ("stopped", "complete"):
            # resumed past where it had ended: a new mirrored Optuna trial
            self._set(rec, status="running", optuna_trial_id=None)
        self._mirror_trial(rec)  # its number names the trial in the others' logs
        self._change(["report", rec.trial_id, t, y, tokens])
        verdict = self._judge(rec)
        reason_before = (rec.decision or {}).get(PRUNE_REASON_ATTR)
        self._apply(rec, verdict)
        self._warn(verdict.warnings)
        self._commit()  # one journal line: the report and what it caused, written before Tune is answered
        self._mirror_report(rec, verdict, reason_before)
        return TrialScheduler.STOP if verdict.prune else TrialScheduler.CONTINUE

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict[str, Any]) -> None:
        """A trial ended (trained to its end, or stopped): record COMPLETE or how it stopped."""
        self._ensure_loaded(trial)
        rec = self._records.get(trial.trial_id)
        if rec is None:
            return
        if rec.status == "running":
            self._finish(rec)
            self._commit()
        _mark_last_result(trial, rec)
        self._mirror_finish(rec)

    def on_trial_error(self, tune_controller: Any, trial: Trial) -> None:
        """A trial errored; FAIL in the mirror unless Tune is about to retry it."""
        rec = self._records.get(trial.trial_id)
        if rec is None:
            return
        retry = trial.status == "RUNNING" and trial.should_recover()
        if rec.status == "running" and not retry:
            self._set(rec, durable=True, status="error",
                      decision={**(rec.decision or {}), "error": _error_text(trial)})
            self._commit()
            _mark_last_result(trial, rec)
            self._mirror_finish(rec)

    def on_trial_remove(self, tune_controller: Any, trial: Trial) -> None:
        """A pending or paused trial was removed (e.g. a pruned trial stopped before it reran)."""
        rec = self._records.get(trial.trial_id)
        if rec is not None and rec.status == "running" and rec.t_hat:
            self._finish(rec)
            self._commit()
            self._mirror_finish(rec)
        if rec is not None and rec.status != "running":
            _mark_last_result(trial, rec)

    def debug_string(self) -> str:
        """One line for Tune's status table."""
        counts = {s: 0 for s in STATUSES}
        for tid in self._active:
            counts[self._records[tid].status] += 1
        best = self.best_final_loss()
        best_s = "none yet" if best is None else f"{best:.4g}"
        return (
            f"CollapseScheduler: {counts['running']} running, {counts['pruned']} pruned, "
            f"{counts['complete']} complete (best final {self.loss_key} {best_s})"
        )

    def save(self, checkpoint_path: str) -> None:
        """Write the whole state to ``checkpoint_path`` as one snapshot (no journal; Tune's scheduler
        checkpoint hook), and compact the scheduler's own state file."""
        if self._writer is not None:
            self._writer.compact()
            if _same_file(checkpoint_path, self._writer.path):
                return
        write_snapshot(os.fspath(checkpoint_path), self._state, self.loss_key, self.time_attr)

    def restore(self, checkpoint_path: str) -> None:
        """Read the state written by ``save`` or kept in the experiment directory (snapshot and journal) and
        keep it there from now on."""
        path = os.fspath(checkpoint_path)
        if os.path.isdir(path):
            path = os.path.join(path, STATE_FILE)
        self._install(read_state(path), path)

    # ------------------------------------------------------------------ queries
    @staticmethod
    def load_state(path: str | os.PathLike[str]) -> dict[str, TrialRecord]:
        """Every trial record kept in an experiment's state, by Tune trial id (no scheduler object needed).

        ``path`` is the experiment directory (``ResultGrid.experiment_path``, the path given to
        ``Tuner.restore``; a ``scheme://`` URI is read through pyarrow), or the state file itself (the
        ``state_path`` given to the scheduler). The state (snapshot and journal) holds the trials of every
        session run in that directory; ``load_warnings`` gives the warnings said. Raises InputError naming
        the path when there is no state or it is unreadable; a last journal line cut short by a crash is
        ignored with a ``StateNote`` warning. Reads only: nothing is written.
        """
        return read_state(path).records

    @staticmethod
    def load_warnings(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
        """The study-level warnings kept in an experiment's state ({key, message, trial}; ``path`` as for
        ``load_state``)."""
        return read_state(path).warnings

    @property
    def records(self) -> dict[str, TrialRecord]:
        """Every trial record of this session, by Tune trial id."""
        return {tid: self._records[tid] for tid in self._active if tid in self._records}

    @property
    def state_file(self) -> str | None:
        """The state's snapshot file in use (None before the first trial is added); its journal is
        ``scheduler_state.journal_path(state_file)``."""
        return self._loaded_from

    def best_final_loss(self) -> float | None:
        """The lowest final loss of the completed trials of this session, or None."""
        finals = [r.final_loss for r in self.records.values() if r.status == "complete"]
        finals = [f for f in finals if f is not None and math.isfinite(f)]
        return min(finals) if finals else None

    # ------------------------------------------------------------------ internals
    def _ensure_loaded(self, trial: Trial) -> None:
        if self._writer is not None:
            return
        if self.state_path is not None:
            path, stale = self.state_path, []
        else:
            path, stale = _default_state_paths(trial)
        for copy in stale:  # so that Tune's sync of its staging copy cannot overwrite the state
            for name in (copy, journal_path(copy)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name)
        self._install(read_state(path) if os.path.exists(path) else SchedulerState(), path)

    def _install(self, state: SchedulerState, path: str) -> None:
        """Use ``state``, kept at ``path`` from now on (compacted there at once)."""
        if self._writer is not None:
            self._writer.close()
        self._state, self._records, self._views = state, state.records, {}
        self._writer = StateWriter(path, state, self.loss_key, self.time_attr)
        self._loaded_from = path

    def _change(self, op: list[Any], *, durable: bool = False) -> None:
        """Change the state by one journal op (hpo/ray_side/scheduler_state.py); written at the next
        ``_commit``."""
        if self._writer is not None:
            self._writer.change(op, durable=durable)
        else:
            apply(self._state, op)

    def _set(self, rec: TrialRecord, *, durable: bool = False, **values: Any) -> None:
        """Set fields of a record (an op); ``durable``: fsync the journal line that holds it."""
        self._change(["set", rec.trial_id, values], durable=durable)

    def _commit(self) -> None:
        """Write the changes made since the last commit as one journal line."""
        if self._writer is not None:
            self._writer.commit()

    def _new_record(self, trial: Trial) -> TrialRecord:
        config = _json_safe(dict(trial.config or {}))
        c = dict(self.controls(trial.config) if self.controls is not None else {})
        unknown = set(c) - {"schedule", "tau", "tpp", "total", "total_tokens"}
        if unknown:
            raise InputError(
                f"CollapseScheduler: controls() returned unknown key(s) {', '.join(sorted(unknown))}; "
                "allowed: schedule, tau, tpp, total, total_tokens"
            )
        units, total, total_tokens = self.units, c.get("total"), c.get("total_tokens")
        if total_tokens is not None and units == "fraction":
            units = "tokens"  # t̂ reported, tokens known per trial: the mirror's steps are tokens
        if total is None and total_tokens is None and isinstance(self.total, int | float):
            total = float(self.total)
        elif total is None and total_tokens is None and isinstance(self.total, str):
            total = (trial.config or {}).get(self.total)
        ctl = TrialControls.check(
            total=total, units=units, total_tokens=total_tokens,
            schedule=c.get("schedule", self.defaults.schedule),
            tau=c.get("tau", self.defaults.tau),
            tpp=c.get("tpp", self.defaults.tpp),
            where=f"CollapseScheduler trial {trial.trial_id}",
        )
        return TrialRecord(
            trial_id=trial.trial_id,
            schedule=ctl.schedule.to_dict(),
            tau=ctl.tau,
            tpp=ctl.tpp,
            total=ctl.total,
            units=ctl.units,
            config=config,
            searched=_searched(trial),
        )

    def _point(
        self, rec: TrialRecord, trial: Trial, result: Mapping[str, Any]
    ) -> tuple[float, float, float | None] | None:
        """(t̂, loss, progress in the record's units) of a result, or None when the result carries no progress
        or no metric."""
        progress = result.get(self.time_attr)
        y = result.get(self.loss_key)
        if progress is None or y is None or isinstance(progress, bool):
            return None
        try:
            progress = float(progress)
            y = float(y)
        except (TypeError, ValueError):
            return None
        if not math.isfinite(progress):
            return None
        if self.units == "fraction":
            return progress, y, (progress * rec.total if rec.total else None)
        total = rec.total
        if isinstance(self.total, str) and self.total in result:
            total = float(result[self.total])
            if total != rec.total:
                self._set(rec, total=total)
        if not total or total <= 0:
            raise InputError(
                f"CollapseScheduler: trial {trial.trial_id}: total key {self.total!r} ({self.units}) is in "
                "neither the result nor the config; report it or pass a number"
            )
        return progress / total, y, progress

    def _surrogate(self) -> tuple[Surrogate | None, str]:
        if self._reference is None:
            return None, "no reference"
        return self._reference.get(self._mirror_study(), self.defaults)

    def _view(self, rec: TrialRecord) -> TrialView:
        """The judge's view of a record (hpo/rule/judge.py), without copying its curve: what the record gained
        since the last view (reports, log entries) is added to a per-trial cache, so a view costs the same
        at any curve length."""
        c = self._views.get(rec.trial_id)
        if c is None or c.rec is not rec:
            c = self._views[rec.trial_id] = _ViewCache(rec)
        c.catch_up()
        state = {"running": "running", "complete": "complete", "pruned": "pruned"}.get(rec.status, "other")
        number: int | str = rec.optuna_number if rec.optuna_number is not None else rec.trial_id
        # An unchanged record gives the same view object, so the judge reuses the competitor it built from
        # it (hpo/rule/judge.py, `competitors`): a judgement then costs nothing for the trials that did not
        # move.
        curve = c.curve
        key = (len(curve), c.logged, state, rec.final_loss, number, id(c.controls))
        if c.view is not None and c.view_key == key:
            return c.view
        c.view = TrialView(number, state, curve.steps, curve.t_hat, curve.loss, c.controls, rec.final_loss,
                           c.log, reports=curve.summary.reports())
        c.view_key = key
        return c.view

    def _judge(self, rec: TrialRecord) -> Verdict:
        """The judge's verdict on the record's latest report against this session's other trials."""
        def others() -> list[TrialView]:  # in the order the trials were added
            return [self._view(r) for tid, r in self._records.items()
                    if tid in self._active and tid != rec.trial_id]

        return self.judge.judge(self._view(rec), others, self._surrogate)

    def _apply(self, rec: TrialRecord, verdict: Verdict) -> None:
        entry = verdict.entry
        if entry is not None:
            self._change(["log", rec.trial_id, entry.to_dict()], durable=entry.prune)
            self._set(rec, decision={**(rec.decision or {}), **entry.latest_attrs()})
        elif verdict.reason is not None and verdict.reason != (rec.decision or {}).get(PRUNE_REASON_ATTR):
            self._set(rec, decision={**(rec.decision or {}), PRUNE_REASON_ATTR: verdict.reason})
        if verdict.prune:
            self._set(rec, durable=True, status="pruned")

    def _warn(self, found: tuple[JudgeWarning, ...]) -> None:
        """Say each study-level condition once: a ``CollapseWarning`` on the driver's console, an entry in
        the state file's ``collapse_warnings`` and, with a mirror, in that study user attr."""
        for w in found:
            if add_warning(self._state.warnings, w) is None:
                continue
            self._change(["warn", w.to_dict()], durable=True)
            emit(w)
            study = self._mirror_study()
            if study is not None:
                store.record_warning(study, w)

    @property
    def warnings(self) -> list[dict[str, Any]]:
        """The study-level warnings said so far ({key, message, trial}; also in the state file)."""
        return [dict(w) for w in self._state.warnings]

    def _warn_missing_keys(self, trial: Trial, result: Mapping[str, Any]) -> None:
        """Say once that results lack the progress or the metric key: the rule then judges nothing, and a
        trainable written for another scheduler (Tune adds ``training_iteration``, not ``t_hat``) would
        otherwise run every trial to its end without a word."""
        missing = [f"{k!r} ({what})" for k, what in ((self.time_attr, "time_attr"), (self.loss_key, "metric"))
                   if k not in result]
        if not missing:
            return
        self._warn((JudgeWarning(
            MISSING_KEY_WARNING,
            f"CollapseScheduler: trial {trial.trial_id}'s result has no {' and no '.join(missing)}, so the "
            f"collapse rule cannot judge it; report {'them' if len(missing) > 1 else 'it'} in every result "
            "(ray.tune.report; t_hat = tokens seen / total tokens), or name the progress key you do report: "
            "time_attr='training_iteration', units='steps', total=<iterations per trial> (or "
            "time_attr='tokens', total_tokens=...)",
            trial.trial_id,
        ),))
        self._commit()  # writes nothing once the warning is recorded (``_warn`` says each key once)

    def _finish(self, rec: TrialRecord) -> None:
        if rec.t_hat and rec.t_hat[-1] >= self.complete_fraction and math.isfinite(rec.loss[-1]):
            self._set(rec, durable=True, status="complete", final_loss=rec.loss[-1])
        elif not rec.t_hat:
            self._set(rec, durable=True, status="stopped", decision={
                **(rec.decision or {}),
                "prune_reason": (
                    "ended before any result the collapse rule could read (each needs "
                    f"{self.time_attr!r} and {self.loss_key!r}): never judged"
                ),
            })
        else:
            last = f"{rec.t_hat[-1]:.4g}"
            self._set(rec, durable=True, status="stopped", decision={
                **(rec.decision or {}),
                "prune_reason": (
                    f"stopped by Ray Tune at t_hat={last}, before the end of training "
                    "(not by the collapse rule)"
                ),
            })

    # ------------------------------------------------------------------ Optuna mirror
    def _mirror_study(self) -> optuna.study.Study | None:
        if self.storage is None:
            return None
        if self._study is None:
            import optuna

            self._study = optuna.create_study(
                storage=storage_url(self.storage), study_name=self.study_name, direction="minimize",
                load_if_exists=True,
            )
            self._warn_other_runs(self._study)
        return self._study

    def _warn_other_runs(self, study: optuna.study.Study) -> None:
        """Say once that the mirror already holds trials this session's Tune did not add (another Tune run:
        the same script run twice in one folder, whose state file also keeps the first run's records):
        Optuna loads the study without a word, and their completed curves then feed this run's online
        reference and its report. A restored run re-adds its trials (``on_trial_add``) before their results
        come."""
        known = self._active
        others = [t for t in study.get_trials(deepcopy=False)
                  if t.user_attrs.get(RAY_TRIAL_ATTR) not in known]
        if not others:
            return
        online = isinstance(self._reference, OnlineReference)
        feeds = "serve this run's online reference and appear in" if online else "appear in"
        self._warn((JudgeWarning(
            MIRROR_SHARED_WARNING,
            f"CollapseScheduler: the mirror study {self.study_name!r} already holds {len(others)} trial(s) "
            f"from earlier runs; their completed curves {feeds} its report and dashboard beside this run's; "
            "for a sweep of its own give a new study_name (or delete that study first)",
            None,
        ),))

    def _mirror_trial(self, rec: TrialRecord) -> int | None:
        """The mirrored Optuna trial id, created (RUNNING, with params and controls) on first use."""
        study = self._mirror_study()
        if study is None:
            return None
        if rec.optuna_trial_id is not None:
            return rec.optuna_trial_id
        import optuna

        params, dists = _params(rec.config, self.param_distributions, rec.searched)
        attrs: dict[str, Any] = {
            RAY_TRIAL_ATTR: rec.trial_id,
            RAY_CONFIG_ATTR: rec.config,
            "units": rec.units if rec.total else "fraction",
            "total": rec.total if rec.total else T_HAT_STEPS,
            "schedule": rec.schedule,
            "tau": rec.tau,
            "tpp": rec.tpp,
        }
        attrs["mirror_key"] = key = f"{rec.trial_id}:{len(rec.log)}:{len(rec.t_hat)}:{os.getpid()}"
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.RUNNING, params=params, distributions=dists, user_attrs=attrs
        ))
        added = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("mirror_key") == key]
        self._set(rec, durable=True, optuna_trial_id=store.trial_id_of(added[-1]),
                  optuna_number=added[-1].number)
        self._commit()  # at once: a restore must find this trial, not mirror it again
        return rec.optuna_trial_id

    def _mirror_report(self, rec: TrialRecord, verdict: Verdict, reason_before: str | None = None) -> None:
        """Mirror the latest report and its verdict. Between judgements this is one storage write (the
        intermediate value); the stored trial is read only to write a decision entry or a new reason."""
        tid = self._mirror_trial(rec)
        if tid is None:
            return
        storage = store.storage_of(self._study)
        step = step_of(rec.t_hat[-1], rec.progress[-1])
        store.write_report(storage, tid, step, rec.loss[-1])
        if rec.total and isinstance(self.total, str):
            store.write_total(storage, tid, rec.total)
        if verdict.entry is None and (verdict.reason is None or verdict.reason == reason_before):
            if verdict.prune:
                self._mirror_finish(rec)
            return
        stored = storage.get_trial(tid)
        # Through the store, as the pruner writes; unlike the pruner, a recalled entry's latest attrs are not
        # rewritten here (hpo/optuna_side/store.py, "Known drift").
        if verdict.entry is not None:
            store.append_entry(storage, tid, stored.user_attrs, verdict.entry)
        elif verdict.reason is not None:
            store.write_reason(storage, tid, stored.user_attrs, verdict.reason)
        if verdict.prune:
            self._mirror_finish(rec)

    def _mirror_finish(self, rec: TrialRecord) -> None:
        """Give the mirrored trial its final state (idempotent: a finished Optuna trial is left alone)."""
        if self.storage is None or rec.status == "running":
            return
        tid = self._mirror_trial(rec)
        storage = store.storage_of(self._study)
        stored = storage.get_trial(tid)
        if stored.state.is_finished():
            return
        if rec.status == "complete":
            store.complete(storage, tid, rec.final_loss)
        elif rec.status in ("pruned", "stopped"):
            if rec.status == "stopped" and rec.decision is not None:
                store.write_reason(storage, tid, {}, rec.decision[PRUNE_REASON_ATTR])  # always written
            last = rec.loss[-1] if rec.loss else None
            values = [last] if last is not None and math.isfinite(last) else None
            log = rec.entries()
            point = sampler_value(log[-1], rec.total or T_HAT_STEPS) if log else None
            # The sampler point when the trial finishes as pruned (the pruner writes it at the pruning
            # judgement, skipping an already reported step: hpo/optuna_side/store.py, "Known drift").
            if self.report_prediction and rec.status == "pruned" and point is not None:
                store.write_sampler_point(storage, tid, point)
                values = [point[1]]  # Optuna's convention: a pruned trial's value is its last step's
            store.prune(storage, tid, values)
        else:
            why = str((rec.decision or {}).get("error", "error"))
            store.fail(storage, tid, {store.FAIL_REASON_ATTR: why})


# ---------------------------------------------------------------------- helpers
def _check_storage(storage: str) -> None:
    """Raise InputError (one line, password masked) when the mirror's storage URL cannot be used: the checks
    of ``collapse-hpo run`` (hpo/sweep/preflight.py ``check_storage``: scheme, a database, a SQLite file in an
    existing folder, a server that answers within ``CONNECT_TIMEOUT_S``). Creates nothing."""
    from types import SimpleNamespace

    if not isinstance(storage, str) or not storage.strip():
        raise InputError(f"CollapseScheduler: storage must be an Optuna storage URL, got {storage!r}")
    # check_storage names the sweep file as ``<source>: field 'storage'``; here the source is this class.
    check_storage(SimpleNamespace(source="CollapseScheduler"), storage)  # type: ignore[arg-type]


def _mark_last_result(trial: Trial, rec: TrialRecord) -> None:
    """Add ``collapse_pruned`` and ``collapse_reason`` to the trial's last result, in place.

    Ray Tune gives a scheduler only a flattened copy of each result (``on_trial_result``), so nothing it
    writes there is recorded. ``on_trial_complete`` comes after Tune stored the last result
    (``Trial.last_result``) and before Tune's callbacks print the trial's final table and the experiment
    state is saved, so keys added to that dict reach the table, ``ResultGrid`` (``Result.metrics``,
    ``get_dataframe()``) and a restored experiment. They are not in the trial's result.json/progress.csv
    (``Result.metrics_dataframe``), which Tune wrote before.
    """
    last = getattr(trial, "last_result", None)
    if not isinstance(last, dict):
        return
    last[PRUNED_KEY] = rec.status == "pruned"
    last[REASON_KEY] = _outcome_text(rec)


def _outcome_text(rec: TrialRecord) -> str:
    """One line on how the trial ended, for its last result."""
    decision = rec.decision or {}
    if rec.status == "complete":
        return "trained to the end (not pruned)"
    if rec.status == "error":
        return f"errored: {decision.get('error', 'see the trial error file')}"
    reason = str(decision.get(PRUNE_REASON_ATTR) or "no judgement was made")
    if rec.status == "pruned":
        last = f"{rec.t_hat[-1]:.4g}" if rec.t_hat else "?"
        # Tune's table shows the end of a long string: the outcome goes last.
        return f"{reason}; pruned by the collapse rule at t_hat={last}"
    return reason

def _error_text(trial: Trial) -> str:
    """The first line of the trial's error file (its path when unreadable), for the FAIL reason."""
    path = getattr(trial, "error_file", None)
    if not path:
        return "the Ray Tune trial raised (no error file)"
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        lines = [ln for ln in text.splitlines() if ln.strip()]
    except OSError:
        return f"the Ray Tune trial raised; see {path}"
    return (lines[-1] if lines else "the Ray Tune trial raised")[:500] + f" (see {path})"


def _default_state_paths(trial: Trial) -> tuple[str, list[str]]:
    """The state file in the experiment directory, and stale copies of it to remove.

    Tune keeps a driver-side staging copy of the experiment directory that it syncs *up* over the storage
    path at every experiment checkpoint (and, on restore, fills from the storage path with its ``*.json``
    files: our snapshot and journal too). On a local filesystem the state lives at the storage path, which
    is what a restore reads; the copies in the staging directory are removed when the state is loaded, so
    that no sync can put an old copy over it (a sync copies files, it never deletes one). On a remote
    filesystem only the staging copy can be written, and Tune syncs it up with its experiment state.
    """
    # Ray Tune internals (Trial.storage, a ray.train._internal StorageContext), on purpose: Tune has no public
    # way for a scheduler to keep state next to the experiment, and a file written beside the staging copy
    # is overwritten by Tune's sync. tests/test_private_apis.py fails loudly when Ray renames these.
    import pyarrow.fs

    storage = trial.storage
    staging = os.path.join(storage.experiment_driver_staging_path, STATE_FILE)
    os.makedirs(os.path.dirname(staging), exist_ok=True)
    if not isinstance(storage.storage_filesystem, pyarrow.fs.LocalFileSystem):
        return staging, []
    base = storage.experiment_fs_path
    os.makedirs(base, exist_ok=True)
    primary = os.path.join(base, STATE_FILE)
    same = os.path.realpath(primary) == os.path.realpath(staging)
    return primary, [] if same else [staging]


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    return os.path.realpath(os.fspath(a)) == os.path.realpath(os.fspath(b))


class _ViewCache:
    """What the judge's view of one record needs beyond the record itself, kept up to date incrementally:
    the curve and its cleaned-report summary (``curve``: hpo/rule/curve.py, as the Optuna pruner keeps it),
    the parsed decision log and the controls."""

    def __init__(self, rec: TrialRecord) -> None:
        self.rec = rec
        self.curve = CurveView()  # the record's reports, its steps by ``step_of``
        self.log: list[DecisionEntry] = []
        self.logged = 0  # entries of rec.log read so far (a malformed one is skipped, as read_log does)
        self.key: tuple[Any, ...] | None = None
        self.controls: TrialControls | None = None
        self.view: TrialView | None = None  # the last view made (`CollapseScheduler._view`) and its key
        self.view_key: tuple[Any, ...] | None = None

    def catch_up(self) -> None:
        """Take what the record gained since the last call (O(new items))."""
        rec = self.rec
        for i in range(len(self.curve), len(rec.t_hat)):
            self.curve.append(step_of(rec.t_hat[i], rec.progress[i]), rec.t_hat[i], rec.loss[i])
        if self.logged < len(rec.log):
            self.log.extend(rec.entries(self.logged))
            self.logged = len(rec.log)
        key = (rec.total, rec.units, rec.tau, rec.tpp, rec.schedule)
        if key != self.key:
            self.key = key
            self.controls = rec.controls()


def _progress_units(
    units: Any, total: Any, total_tokens: Any
) -> tuple[str, float | str | None]:
    """The scheduler's (units, total), checked: ``total_tokens`` is ``total`` in tokens; without a total the
    trainables report t̂ ("fraction"). Raises InputError naming the argument."""
    if total_tokens is not None:
        if total is not None:
            raise InputError("CollapseScheduler: give total (in units) or total_tokens (tokens), not both")
        if units not in (None, "tokens"):
            raise InputError(f"CollapseScheduler: total_tokens counts tokens but units is {units!r}: give "
                             "total=<training length in those units>")
        units, total, name = "tokens", total_tokens, "total_tokens"
    else:
        name = "total"
    u = check_units(units if units is not None else ("fraction" if total is None else "tokens"),
                    "CollapseScheduler")
    if u == "fraction":
        if total is not None:
            raise InputError(f"CollapseScheduler: with units 'fraction' time_attr is t_hat itself: give no "
                             f"total, got {total!r}")
        return u, None
    if total is None:
        raise InputError(f"CollapseScheduler: units {u!r} needs total (the training length in {u}, or the "
                         "result/config key holding it)")
    if not isinstance(total, str) and (
        isinstance(total, bool) or not isinstance(total, int | float)
        or not (math.isfinite(total) and total > 0)
    ):
        raise InputError(f"CollapseScheduler: {name} must be a positive number of {u} or a result/config "
                         f"key, got {total!r}")
    return u, total


def _json_safe(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value
    try:
        import numpy as np

        if isinstance(value, np.generic):
            return value.item()
    except ImportError:  # pragma: no cover
        pass
    return repr(value)


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "/"))
        else:
            out[key] = v
    return out


def _searched(trial: Trial) -> list[str] | None:
    """The "/"-joined config keys Tune's search drew for a trial (``Trial.evaluated_params``), or None."""
    drawn = getattr(trial, "evaluated_params", None)
    return sorted(_flatten(drawn)) if isinstance(drawn, Mapping) else None


def _params(config: Mapping[str, Any], dists: Mapping[str, Any],
            searched: list[str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Optuna params of a Tune config: values of given distributions, and numbers Tune's search drew (all
    numbers when ``searched`` is None); constants of the param space stay in ray_config only."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    params: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for key, value in _flatten(config).items():
        given = dists.get(key)
        if given is None and searched is not None and key not in searched:
            continue
        if given is not None:
            try:
                given.to_internal_repr(value)
                if isinstance(given, CategoricalDistribution) and value not in given.choices:
                    continue
            except (ValueError, TypeError):
                continue
            params[key], out[key] = value, given
        elif isinstance(value, bool):
            params[key], out[key] = value, CategoricalDistribution((False, True))
        elif isinstance(value, int):
            params[key], out[key] = value, IntDistribution(value, value)
        elif isinstance(value, float) and math.isfinite(value):
            params[key], out[key] = value, FloatDistribution(value, value)
    return params, out
