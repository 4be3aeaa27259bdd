"""The Optuna pruner that stops trials whose predicted final loss will not win (collapse early-align).

``CollapsePruner`` is Optuna glue over the judge (hpo/rule/judge.py): it builds plain trial views from the
study's stored trials, asks the judge, and writes the judge's decision entry to the trial's user attrs
(names in hpo/rule/record.py). The rule is told once, in hpo/rule/decision.py's module docstring; the
reference surrogate is hpo/rule/reference.py's.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

import optuna
from optuna.pruners import BasePruner
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from collapse_hpo.hpo.optuna_side import store
from collapse_hpo.hpo.rule.curve import CurveView
from collapse_hpo.hpo.rule.decision import PruneSettings, settings_of
from collapse_hpo.hpo.rule.judge import (
    DEFAULT_JUDGE_EVERY,
    STARTUP_WARNING,
    Judge,
    JudgeWarning,
    TrialView,
    Verdict,
    emit,
)
from collapse_hpo.hpo.rule.record import (
    CONTROL_ATTRS,
    CONTROL_READ_ATTRS,
    SAMPLER_STEP_ATTR,
    USED_REFERENCE_ATTR,
    ControlsMemo,
    DecisionEntry,
    TrialControls,
    read_log,
    sampler_value,
    set_trial_controls,
    trial_points,
)
from collapse_hpo.hpo.rule.reference import Reference, StoredVersion, make_reference
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.schedules import Schedule

__all__ = ["CollapsePruner", "set_trial_controls", "trial_decisions"]


class CollapsePruner(BasePruner):
    """Prune Optuna trials whose final loss, predicted from the curve so far, will not be among the best.

    The rule is told once, in hpo/rule/decision.py's module docstring; in short, from ``min_fraction`` of
    training on, a trial is pruned when ``keep_top_k`` completed or running trials lead it by more than the
    margin at a common fraction of training, and a NaN, inf or non-positive loss prunes at once. This class
    only translates for Optuna: it builds the judge's views (hpo/rule/judge.py, shared with the Ray
    ``CollapseScheduler``) from the stored trials and writes the verdict to the trial (optuna_side/store.py).
    The study must minimize the loss.

    Steps: the objective reports ``trial.report(loss, step=progress)`` with progress in ``units``, and
    t̂ = step / ``total``. A trial's controls come from its user attrs (``set_trial_controls``: ``units``,
    ``total``, ``schedule``, ``tau``, ``tpp``; an older trial's ``total_tokens`` counts as a total in
    tokens), else from this pruner's defaults below. Missing controls or a malformed attr keep the trial,
    with the reason; Optuna keeps the first of repeated steps.

    State: everything lives in the study's storage, never only in this object (Optuna does not persist
    pruners), so several workers and a restarted driver see the same state. Each judged trial gets the user
    attrs ``predicted_final_loss``, ``predicted_low``, ``predicted_high`` (losses), ``predicted_misfit``,
    ``decision_fraction`` (t̂), ``prune_reason`` (one line: why pruned, kept or not judged) and
    ``collapse_decisions`` (the log of judgements, one entry per judged step); names and keys in
    hpo/rule/record.py. A step is judged once (asking again returns the logged answer) and a pruned trial
    stays pruned. A judgement reads the stored trial and the study's other trials; between judgements
    ``should_prune()`` reads nothing from the storage (it answers from what this process knows of the trial,
    in a time independent of the curve's length and the number of trials) and writes only a changed
    ``prune_reason``, which assumes one process reports and judges a trial (Optuna's model: one worker runs a
    trial).

    Args:
        reference: the reference surrogate: a ``Surrogate``, a surrogate JSON path (``collapse-hpo
            calibrate``), ``"online"`` (fitted on the study's own completed trials), a reference object from
            hpo/rule/reference.py, or a mapping spec (see ``make_reference``).
        settings: a ``PruneSettings`` (hpo/rule/decision.py), the same object the Ray ``CollapseScheduler``
            takes; None = built from the five keywords below, shortcuts for its fields of those names (one
            left None takes the field's default; with ``settings`` given, one that differs from its value
            there is an error).
        min_fraction: fraction of training t̂ (tokens seen / total tokens) before which no trial is judged,
            in (0, 1); default 0.1.
        confidence: two-sided confidence of the predicted interval [low, high], in (0, 1); default 0.9.
        keep_top_k: never prune a trial that could still be among the ``keep_top_k`` best (integer ≥ 1).
        comparison: "paired" (default: two trials compared at the same fraction of training) or "interval"
            (a trial's optimistic bound against the others' pessimistic final losses).
        margin: the pruner's one knob: the lead a competitor must have to cut a trial, as a log-ratio of
            losses at a common fraction of training, in [0, 1) (0.04 = 4%, the default; smaller prunes more
            and risks the winner more; ``PruneSettings.margin``).
        total: default training length in ``units`` (positive: tokens or optimizer steps), for trials
            without that attr.
        units: what a reported step counts: "tokens" (tokens seen; default), "steps" (optimizer steps, e.g.
            Hugging Face's ``global_step``) or "fraction" (round(t̂ · ``FRACTION_STEPS``)).
        total_tokens: the same as ``total`` with ``units="tokens"``, in tokens (give one of the two).
        schedule: default LR schedule shape (a ``Schedule``, kind name or dict; None = linear decay to zero).
        tau: default AdamW timescale τ = B/(η·λ·D), a fraction of training (positive; None = no weight decay;
            a run counted in optimizer steps has τ = 1/(η·λ·steps), ``predictors.timescale.step_tau``).
        tpp: default tokens per parameter D/N (positive; None = not defined, e.g. fine-tuning: a surrogate
            with a TPP law cannot judge such trials, and says so; an online reference holds q(TPP) constant).
        report_prediction: on pruning, also report the predicted final loss as an intermediate value at the
            trial's final step (user attr ``sampler_value_step``), so that the pruned trial's value, and
            TPE's ranking of pruned trials, is its prediction rather than its last loss (Optuna ranks a trial
            pruned early below one pruned late, whatever its loss would have been). The trial stays PRUNED
            (``study.best_trial`` ignores it); the stored curve gains a point the run never reached (readers
            in hpo/rule/reference.py skip it; plots must too) and a bad prediction steers the sampler.
            Default False.
        judge_every: judge at most once per this fraction of training t̂, in [0, 1) (the first judgement at
            ``min_fraction``, the next when t̂ enters the next interval; 0 = at every report; default 0.02).
            Between judgements ``should_prune()`` answers the last decision (False) and writes nothing;
            NaN/inf checks still run at every report. Bounds the storage writes and the decision log's length
            when a trainer reports often.

    Raises:
        InputError: on a bad argument (the message names it).

    Example: twelve trials of a learning-rate search whose curves share one shape; the ones more than 4%
    behind at 10% of training are pruned. The objective raises ``optuna.TrialPruned`` as soon as
    ``should_prune()`` returns True:

        >>> import math
        >>> import optuna
        >>> from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner
        >>> from collapse_hpo.predictors.schedules import Schedule
        >>> from collapse_hpo.predictors.surrogate import ErrorBand, Surrogate
        >>> optuna.logging.set_verbosity(optuna.logging.WARNING)
        >>> # A calibrated surrogate; normally Surrogate.load(PATH) of `collapse-hpo calibrate`'s JSON.
        >>> surrogate = Surrogate(b_c=0.5, b_e=0.3, q_c=1.0, q_e=0.1, error_bands=[
        ...     ErrorBand(fraction=0.1, n=20, bias=0.0, scale=0.01, max_abs=0.03)])
        >>> total_tokens, schedule, tau, tpp = 1_000_000, Schedule(), 0.1, 20.0
        >>> def objective(trial):
        ...     lr = trial.suggest_float("lr", 1e-3, 1e-1, log=True)
        ...     final = 3.0 + (math.log10(lr) + 2.0) ** 2  # stands in for training: best lr is 1e-2
        ...     for tokens in range(total_tokens // 50, total_tokens + 1, total_tokens // 50):
        ...         loss = final * float(surrogate.normalized(tokens / total_tokens, schedule, tau, tpp)[0])
        ...         trial.report(loss, step=tokens)  # step = tokens seen
        ...         if trial.should_prune():
        ...             raise optuna.TrialPruned()
        ...     return loss
        >>> pruner = CollapsePruner(reference=surrogate, total_tokens=total_tokens, schedule=schedule,
        ...                         tau=tau, tpp=tpp)
        >>> study = optuna.create_study(pruner=pruner, sampler=optuna.samplers.RandomSampler(seed=0))
        >>> study.optimize(objective, n_trials=12)
        >>> [t.number for t in study.get_trials(states=[optuna.trial.TrialState.PRUNED])]
        [1, 7, 8, 10]
        >>> print(study.trials[1].user_attrs["prune_reason"])  # doctest: +ELLIPSIS
        predicted final loss 3.185; the best competitor's 3.01 is 5.67% ahead (loss ratio at t_hat=0.1, ...
    """

    def __init__(
        self,
        *,
        reference: Any,
        settings: PruneSettings | None = None,
        min_fraction: float | None = None,
        confidence: float | None = None,
        keep_top_k: int | None = None,
        comparison: str | None = None,
        margin: float | None = None,
        total: float | None = None,
        units: str = "tokens",
        total_tokens: float | None = None,
        schedule: Schedule | str | Mapping[str, Any] | None = None,
        tau: float | None = None,
        tpp: float | None = None,
        report_prediction: bool = False,
        judge_every: float = DEFAULT_JUDGE_EVERY,
    ) -> None:
        try:
            rule = settings_of(settings, min_fraction=min_fraction, confidence=confidence,
                               keep_top_k=keep_top_k, comparison=comparison, margin=margin)
            self._judge = Judge(rule, judge_every=judge_every)
        except InputError as err:
            raise InputError(f"CollapsePruner: {err}") from None
        self._defaults = TrialControls.check(
            total=total, units=units, total_tokens=total_tokens, schedule=schedule, tau=tau, tpp=tpp,
            where="CollapsePruner",
        )
        if not isinstance(report_prediction, bool):
            raise InputError(
                f"CollapsePruner: 'report_prediction' must be true or false, got {report_prediction!r}"
            )
        self._report_prediction = report_prediction
        self._reference: Reference = make_reference(reference)
        self._lock = threading.Lock()
        self._warned: set[str] = set()  # warning keys said by this process (the study records them all)
        self._recorded_label: str | None = None
        # What this process knows of each running trial it judged, by (storage, trial id): see ``prune``.
        self._known: dict[tuple[int, int], _Known] = {}
        # The latest view built of each stored trial (by storage id), with the stored version it was built
        # from: reused while that version holds the trial read (``StoredVersion.holds``).
        self._views: dict[int, tuple[StoredVersion, TrialView]] = {}
        self._entries: dict[int, tuple[Any, DecisionEntry | None]] = {}  # read_log's memo of parsed entries
        # The controls merged from a trial's control attrs, by the identity of those attr values
        self._controls = ControlsMemo(self._defaults)

    # The keyword arguments, for from_config and its error messages.
    _OPTIONS = (
        "reference", "min_fraction", "confidence", "keep_top_k", "comparison", "margin",
        "total", "units", "total_tokens", "schedule", "tau", "tpp", "report_prediction", "judge_every",
    )

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, where: str = "pruner") -> CollapsePruner:
        """A pruner from a mapping of its keyword arguments (e.g. JSON handed to a worker).

        Unknown keys raise InputError naming ``where`` and the key; values are checked by ``__init__``.
        """
        if not isinstance(config, Mapping):
            raise InputError(f"{where}: expected a mapping of pruner settings, got {type(config).__name__}")
        unknown = sorted(set(config) - set(cls._OPTIONS))
        if unknown:
            raise InputError(
                f"{where}: unknown setting(s) {', '.join(unknown)}; allowed: {', '.join(cls._OPTIONS)}"
            )
        if "reference" not in config:
            raise InputError(f"{where}: missing 'reference' (a surrogate JSON path, 'online', or a mapping)")
        try:
            return cls(**dict(config))
        except InputError as err:
            raise InputError(f"{where}: {err}") from None

    @property
    def settings(self) -> PruneSettings:
        """The decision-rule settings."""
        return self._judge.settings

    @property
    def judge_every(self) -> float:
        """Judge at most once per this fraction of training."""
        return self._judge.judge_every

    @property
    def defaults(self) -> TrialControls:
        """The default trial controls (used where a trial has no control attrs)."""
        return self._defaults

    @property
    def reference(self) -> Reference:
        """The reference the surrogate comes from."""
        return self._reference

    # ------------------------------------------------------------------ the Optuna hook
    def prune(self, study: optuna.study.Study, trial: FrozenTrial) -> bool:
        """Judge ``trial`` from its stored reports (see the class docstring); writes the decision."""
        if study.direction != StudyDirection.MINIMIZE:
            raise InputError(
                "CollapsePruner: the study must minimize the loss (create_study(direction='minimize'))"
            )
        storage, trial_id = store.storage_of(study), store.trial_id_of(trial)
        key = (id(storage), trial_id)
        known = self._known.get(key) if trial.state == TrialState.RUNNING else None
        if known is not None:
            # Between judgements: the reports from the trial handed in, the attrs as this process knows them
            # (read at the last judgement, plus its own writes); no storage read.
            view = known.view(trial, self._defaults)
            if len(view.steps) == 0:
                return False
            quick = self._judge.quick(view)
            if quick is not None and quick.entry is None:
                self._write(_Recording(storage, known.stored.user_attrs), trial_id, known.stored, quick)
                self._warn(study, quick.warnings)
                return quick.prune
        stored = storage.get_trial(trial_id)  # a judgement (or the first call): the stored trial, as it is
        view = self._view(stored)
        if len(view.steps) == 0:
            self._known.pop(key, None)
            return False
        trials: list[FrozenTrial] | None = None

        def reference() -> tuple[Any, str]:
            nonlocal trials
            trials = study.get_trials(deepcopy=False)
            with self._lock:
                surrogate, label = self._reference.get(study, self._defaults, trials)
                self._record_reference(study, surrogate, label)
                return surrogate, label

        def others() -> list[TrialView]:
            return self._views_of(trials or study.get_trials(deepcopy=False))

        verdict = self._judge.judge(view, others, reference)
        if stored.state == TrialState.RUNNING:
            written: dict[str, Any] = {}
            self._write(_Recording(storage, written), trial_id, stored, verdict)
            if verdict.prune:
                self._known.pop(key, None)
            else:
                self._known[key] = _Known(stored, written, self._defaults, self._entries, self._merged)
        else:
            self._known.pop(key, None)
        self._warn(study, verdict.warnings)
        return verdict.prune

    def _warn(self, study: optuna.study.Study, found: tuple[JudgeWarning, ...]) -> None:
        """Say each study-level condition once: a ``CollapseWarning`` and an entry in the study user attr
        ``collapse_warnings`` (a list of {key, message, trial}); a key already recorded (by this or another
        worker) is not said again."""
        with self._lock:
            for w in found:
                if w.key in self._warned:
                    continue
                self._warned.add(w.key)
                if store.record_warning(study, w):
                    emit(w)

    # ------------------------------------------------------------------ internals
    def _views_of(self, trials: list[FrozenTrial]) -> list[TrialView]:
        """``_view`` of each trial, built once per stored version of a trial (``StoredVersion``): building
        every trial's view anew at every judgement (its reports, controls and decision log parsed) made a
        sweep's judgements O(trials²) in parsing alone."""
        cache = self._views
        out: list[TrialView] = []
        append = out.append
        for t in trials:
            trial_id = store.trial_id_of(t)
            hit = cache.get(trial_id)
            # ``StoredVersion.holds``, its first test inlined: the object read finished (most trials)
            if hit is not None and (((v := hit[0]).trial is t and v.finished) or v.holds(t)):
                append(hit[1])
                continue
            view = self._view(t)
            # One dict store: atomic under the GIL (an Optuna study's workers in threads).
            cache[trial_id] = (StoredVersion.of(t), view)
            append(view)
        return out

    def _view(self, t: FrozenTrial) -> TrialView:
        """The judge's view of a stored trial (controls from its user attrs, else this pruner's defaults)."""
        steps, values = trial_points(t)
        state = {TrialState.RUNNING: "running", TrialState.PRUNED: "pruned"}.get(t.state, "other")
        final = None
        if t.state == TrialState.COMPLETE and t.user_attrs.get(SAMPLER_STEP_ATTR) is None:
            state, final = "complete", t.value
        log = tuple(read_log(t.user_attrs, self._entries))
        try:
            controls = self._merged(t.user_attrs, f"trial {t.number} user attrs")
        except InputError as err:
            return TrialView(t.number, state, steps, steps, values, None, final, log, problem=str(err))
        if controls.total is None:
            return TrialView(t.number, state, steps, steps, values, controls, final, log,
                             problem=_no_total(controls))
        return TrialView(t.number, state, steps, steps / controls.total, values, controls, final, log)

    def _merged(self, attrs: Mapping[str, Any], where: str) -> TrialControls:
        """``self._defaults.merged(attrs, where)``, parsed once per set of control attr objects
        (``record.ControlsMemo``)."""
        return self._controls.merged(attrs, where)

    def _write(self, storage: Any, trial_id: int, stored: FrozenTrial, verdict: Verdict) -> None:
        """Write the verdict to the running trial (through hpo/optuna_side/store.py): a new entry to its log,
        the five latest attrs, the sampler point when the entry prunes (at this judgement, and not when its
        step was already reported: the mirror writes it when its trial finishes, see the store's "Known
        drift"); a recalled entry's latest attrs; else a changed ``prune_reason``."""
        if verdict.entry is not None:
            self._write_controls(storage, trial_id, stored)
            store.append_entry(storage, trial_id, stored.user_attrs, verdict.entry)
            if verdict.entry.prune and self._report_prediction:
                self._report_to_sampler(storage, trial_id, stored, verdict.entry)
        elif verdict.recalled is not None:
            store.write_latest(storage, trial_id, stored.user_attrs, verdict.recalled)
        elif verdict.reason is not None:
            store.write_reason(storage, trial_id, stored.user_attrs, verdict.reason)

    def _write_controls(self, storage: Any, trial_id: int, stored: FrozenTrial) -> None:
        """Record the controls the trial was judged with (this pruner's defaults where the trial set none),
        so that readers without the pruner (the dashboard, ``report``) see them."""
        if all(k in stored.user_attrs for k in CONTROL_ATTRS) or self._defaults.total is None:
            return
        try:
            controls = self._defaults.merged(stored.user_attrs, f"trial {stored.number} user attrs")
        except InputError:
            return
        for key, value in controls.attrs().items():
            if key not in stored.user_attrs:
                storage.set_trial_user_attr(trial_id, key, value)

    def _record_reference(self, study: optuna.study.Study, surrogate: Any, label: str) -> None:
        """Store a fixed reference surrogate in the study once (the decision logs name it by its label)."""
        if surrogate is None or label.startswith("online:") or self._recorded_label == label:
            return
        stored = study.user_attrs.get(USED_REFERENCE_ATTR)
        if not (isinstance(stored, dict) and stored.get("label") == label):
            study.set_user_attr(USED_REFERENCE_ATTR, {"label": label, "surrogate": surrogate.to_dict()})
        self._recorded_label = label

    def _report_to_sampler(
        self, storage: Any, trial_id: int, stored: FrozenTrial, entry: DecisionEntry
    ) -> None:
        controls = self._defaults.merged(stored.user_attrs, f"trial {stored.number} user attrs")
        point = sampler_value(entry, controls.total)
        if point is None or point[0] in stored.intermediate_values:
            return
        store.write_sampler_point(storage, trial_id, point)


class _Recording:
    """A storage stand-in for ``CollapsePruner._write`` that passes writes on and records the user attrs
    written (``written``), so that the pruner knows the trial's attrs without reading them back."""

    def __init__(self, storage: Any, written: dict[str, Any]) -> None:
        self._target, self._written = storage, written

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._target.set_trial_user_attr(trial_id, key, value)
        self._written[key] = value

    def set_trial_intermediate_value(self, trial_id: int, step: int, value: float) -> None:
        self._target.set_trial_intermediate_value(trial_id, step, value)


class _Known:
    """What the pruner knows of one running trial between two judgements, so that a ``should_prune()`` that
    is not a judgement costs the same at any curve length and reads nothing from the storage.

    Built from the stored trial read at a judgement (its user attrs plus the attrs the pruner wrote then);
    each later call adds the reports the handed-in trial gained (Optuna's ``Trial`` keeps its reports up to
    date in the ``FrozenTrial`` it hands to the pruner) to the sorted curve and its cleaned-report summary
    (``curve``: hpo/rule/curve.py, as the Ray scheduler's cache keeps it);
    ``stored`` stands for the stored trial in the pruner's writes (its ``user_attrs`` follow them). The
    reports come from the process that runs the trial, the one that calls ``should_prune`` for it; at the
    next judgement the stored trial is read again, so every decision is made on the stored state.
    """

    def __init__(
        self, stored: FrozenTrial, written: Mapping[str, Any], defaults: TrialControls,
        entries: dict[int, tuple[Any, DecisionEntry | None]] | None = None,
        merge: Callable[[Mapping[str, Any], str], TrialControls] | None = None,
    ) -> None:
        """``entries``, ``merge``: the pruner's memo of parsed log entries and its memoized controls parser
        (``CollapsePruner._merged``); without them the log and controls are parsed afresh."""
        attrs = {**stored.user_attrs, **written}
        self.number = stored.number
        self.stored = SimpleNamespace(user_attrs=attrs, number=stored.number)
        self._merge = merge
        self.log = read_log(attrs, entries)
        self._skip = attrs.get(SAMPLER_STEP_ATTR)
        self._controls_from(attrs, {}, defaults)
        self._reset(stored.intermediate_values)

    def _controls_from(
        self, attrs: Mapping[str, Any], given: Mapping[str, Any], defaults: TrialControls
    ) -> None:
        """The controls as ``CollapsePruner._view`` reads them (``given``: control attrs of the trial handed
        in, over the known ``attrs``)."""
        self._key = tuple(given.get(k, attrs.get(k)) for k in CONTROL_READ_ATTRS)
        self.controls: TrialControls | None = None
        self.problem: str | None = None
        try:
            both = {**attrs, **given}
            where = f"trial {self.number} user attrs"
            merge = self._merge if self._merge is not None else defaults.merged
            self.controls = merge(both, where)
        except InputError as err:
            self.problem = str(err)
        if self.controls is not None and self.controls.total is None:
            self.problem = _no_total(self.controls)
        self._total = self.controls.total if self.problem is None and self.controls else None

    def _reset(self, values: Mapping[int, float]) -> None:
        self.seen: set[int] = set()
        self.curve = CurveView()
        self._absorb(values.items())

    def _absorb(self, items: Any) -> None:
        """Add reports (step, value); the curve stays sorted by step, as ``trial_points`` sorts it."""
        for s, v in items:
            step = int(s)
            if step == self._skip:
                continue
            self.seen.add(step)
            x, y = float(step), float(v)
            self.curve.add(x, x / self._total if self._total is not None else x, y)

    def view(self, trial: FrozenTrial, defaults: TrialControls) -> TrialView:
        """The judge's view with the reports ``trial`` holds (O(reports added since the last call))."""
        attrs = self.stored.user_attrs
        given = {k: trial.user_attrs[k] for k in CONTROL_READ_ATTRS if k in trial.user_attrs}
        values = trial.intermediate_values
        if tuple(given.get(k, attrs.get(k)) for k in CONTROL_READ_ATTRS) != self._key:
            self._controls_from(attrs, given, defaults)
            self._reset(values)
        else:
            new = len(values) - len(self.seen) - (1 if self._skip in values else 0)
            fresh = list(itertools.islice(reversed(values.items()), new))[::-1] if new > 0 else []
            if new < 0 or any(int(s) in self.seen or int(s) == self._skip for s, _ in fresh):
                self._reset(values)  # a trial from elsewhere, its reports in another order: read it whole
            else:
                self._absorb(fresh)
        c = self.curve
        return TrialView(self.number, "running", c.steps, c.t_hat, c.loss, self.controls, None, self.log,
                         problem=self.problem, reports=c.summary.reports())


def trial_decisions(trial: FrozenTrial) -> list[dict[str, Any]]:
    """The CollapsePruner's decision log of a trial (oldest first; empty when never judged)."""
    return [e.to_dict() for e in read_log(trial.user_attrs)]


def tpe_startup_warning(sampler: Any, n_trials: int) -> JudgeWarning | None:
    """The warning for a TPE sampler that will never leave its random start-up (``n_startup_trials`` ≥ the
    trials the study will run), else None."""
    if not isinstance(sampler, optuna.samplers.TPESampler):
        return None
    startup = int(getattr(sampler, "_n_startup_trials", 10))  # private; TPESampler(n_startup_trials=10)
    if n_trials > startup:
        return None
    return JudgeWarning(STARTUP_WARNING, (
        f"the TPE sampler draws its first n_startup_trials={startup} trials at random, and this study runs "
        f"{n_trials}: every draw is random (use more trials, a smaller n_startup_trials, or sampler "
        "random/qmc)"
    ))


def _no_total(controls: TrialControls) -> str:
    """Why a trial without a training length cannot be judged, and what to give."""
    return (f"total unknown (the training length in {controls.units}): call set_trial_controls(trial, "
            f"total=..., units={controls.units!r}) or give CollapsePruner(total=..., "
            f"units={controls.units!r})")
