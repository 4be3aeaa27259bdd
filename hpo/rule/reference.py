"""Where the CollapsePruner gets its reference surrogate, and how a trial's curve and controls are read.

Three kinds of reference (``make_reference`` builds one from a YAML-style spec):

- ``SurrogateReference``: a calibrated surrogate JSON file (``collapse-hpo calibrate``) or a ``Surrogate``.
- ``StudyReference``: another Optuna study (a calibration family: e.g. several model sizes at one TPP) in a
  storage; its completed trials' curves are calibrated once, on first use.
- ``OnlineReference``: the sweep's own completed trials. Before ``min_trials`` trials have completed there
  is no surrogate (no pruning; the reason says so); afterwards the surrogate is refitted each time the count
  of completed trials reaches the next point of a geometric schedule (3, 4, 6, 9, 13, 19, ...:
  ``REFIT_GROWTH``), on the trials that completed first. Each fit is stored in the study's user attrs
  (``collapse_reference``) so that other workers and a restarted driver reuse it instead of refitting. Its
  prior (the builtin one by default) speaks before the first fit, and until a fit's error model stands on
  ``decision.MARGIN_CAP_RUNS`` held-out runs (``_thin_fit``); while the prior can serve, no fit is made on
  fewer completed trials than that (such a fit is thin by construction).

A reference answers ``get(study, defaults, trials=None) -> (surrogate or None, label)``. ``study`` is the
sweep's Optuna study, or None where there is none (a Ray scheduler without a mirror): only an online
reference needs it. ``trials``: the study's trials when the caller has them already. The label names the
surrogate used (recorded with every decision, e.g. ``online:0,1,2``) or says why there is none.

Trial conventions (the pruner's step convention): the objective reports ``trial.report(loss, step=progress)``
and sets the run's controls as trial user attrs ``units`` (what a step counts: tokens, optimizer steps or a
fraction) and ``total`` (the training length in those units; an older record's ``total_tokens`` counts as a
total in tokens), ``schedule`` (a dict as written by ``Schedule.to_dict()``, or a kind name), ``tau`` (AdamW
timescale, None = no weight decay) and ``tpp`` (tokens per parameter, None = not defined);
``set_trial_controls`` in hpo/rule/record.py writes them (names and readers of the trial record live there).
Missing ones fall back to the pruner's defaults.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from collapse_hpo.hpo.rule.decision import MARGIN_CAP_RUNS
from collapse_hpo.hpo.rule.record import (
    COMPLETE_T_HAT,
    SAMPLER_STEP_ATTR,
    STUDY_REFERENCE_ATTR,
    ControlsMemo,
    TrialControls,
    curve_of,
    trial_curve,
)
from collapse_hpo.predictors.calibrate import calibrate
from collapse_hpo.predictors.curves import Curve
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.prior import (
    BUILTIN,
    MAX_TESTED,
    MIN_REACH,
    load_prior,
    prior_for_sweep,
    reaching_curves,
    rounded_reach,
)
from collapse_hpo.predictors.surrogate import Surrogate

if TYPE_CHECKING:
    import optuna

class TrialMemo:
    """Each trial's controls and curve, read once per stored version of the trial.

    An online reference reads every trial at every judgement (the completed ones for its fit, all of them to
    test it); parsing their controls and building their curves anew each time was a third of a
    ``collapse-online`` replay. An entry is reused while its ``StoredVersion`` holds the trial read (as
    hpo/optuna_side/pruner.py's views are). Keyed by the storage's trial id and the defaults.
    """

    def __init__(self) -> None:
        # by defaults: the entries by trial id, and the controls parsed with those defaults
        self._entries: dict[TrialControls, tuple[dict[Any, _MemoEntry], ControlsMemo]] = {}
        # the tables of the defaults asked last, found by identity: the online reference asks with one
        # defaults object for every trial at every judgement, and hashing it each time was ~15% of the memo
        self._last: tuple[TrialControls, tuple[dict[Any, _MemoEntry], ControlsMemo]] | None = None

    def _tables(self, defaults: TrialControls) -> tuple[dict[Any, _MemoEntry], ControlsMemo]:
        """The entries read with ``defaults`` (by trial id) and the controls parsed with them (a new version
        of a running trial, whose reports changed, mostly holds the same control attrs)."""
        last = self._last
        if last is not None and last[0] is defaults:
            return last[1]
        tables = self._entries.get(defaults)
        if tables is None:
            tables = self._entries[defaults] = ({}, ControlsMemo(defaults))
        self._last = (defaults, tables)
        return tables

    def _entry(self, t: optuna.trial.FrozenTrial, defaults: TrialControls) -> _MemoEntry:
        trial_id = getattr(t, "_trial_id", None)
        table, parsed = self._tables(defaults)
        hit = table.get(trial_id) if trial_id is not None else None
        # ``StoredVersion.holds``, its first test inlined: the object read finished (most trials, every read)
        if hit is not None and (((v := hit.version).trial is t and v.finished) or v.holds(t)):
            return hit
        try:
            controls: TrialControls | InputError = parsed.merged(t.user_attrs, f"trial {t.number}")
        except InputError as err:
            controls = err
        entry = _MemoEntry(StoredVersion.of(t), controls)
        if trial_id is not None:
            if len(table) >= 100_000:
                table.clear()
            table[trial_id] = entry
        return entry

    def controls(self, t: optuna.trial.FrozenTrial, defaults: TrialControls) -> TrialControls:
        """``defaults.merged(t.user_attrs)``; raises its InputError."""
        controls = self._entry(t, defaults).controls
        if isinstance(controls, InputError):
            raise controls
        return controls

    def curve(self, t: optuna.trial.FrozenTrial, defaults: TrialControls) -> Curve | None:
        """``trial_curve(t, defaults)``; raises its InputError."""
        entry = self._entry(t, defaults)
        if entry.curve is _UNSET:  # trial_curve(t, defaults), from the controls the entry parsed
            controls = entry.controls
            entry.curve = controls if isinstance(controls, InputError) else curve_of(t, controls)
        if isinstance(entry.curve, InputError):
            raise entry.curve
        return entry.curve

    def last_step(self, t: optuna.trial.FrozenTrial, defaults: TrialControls) -> float | None:
        """The trial's last reported step (the pruner's sampler point left out); None without one."""
        entry = self._entry(t, defaults)
        if entry.last_step is _UNSET:
            skip = t.user_attrs.get(SAMPLER_STEP_ATTR)
            entry.last_step = max((s for s in t.intermediate_values if s != skip), default=None)
        return entry.last_step

    def reach(
        self, t: optuna.trial.FrozenTrial, defaults: TrialControls
    ) -> tuple[TrialControls | InputError, float | None]:
        """The trial's controls (or why they do not parse) and ``trial_reach`` of its reports (None when its
        controls do not parse), with one lookup: an online reference asks this of every trial at every
        judgement (``_reaching``), and the reach depends only on what the entry holds (the controls, the
        count of reports and the last step)."""
        entry = self._entry(t, defaults)
        if entry.reach is _UNSET:
            controls = entry.controls
            entry.reach = None if isinstance(controls, InputError) else trial_reach(
                len(t.intermediate_values), self.last_step(t, defaults), controls.total)
        return entry.controls, entry.reach

    def reaching(self, t: optuna.trial.FrozenTrial, defaults: TrialControls) -> list[tuple[Curve, float]]:
        """``predictors.prior.reaching_curves([curve])`` of the trial's curve ([] when it has none or its
        controls or curve do not parse): a function of the curve, which the entry holds."""
        entry = self._entry(t, defaults)
        if entry.reaching is _UNSET:
            try:
                c = self.curve(t, defaults)
            except InputError:
                c = None
            entry.reaching = [] if c is None else reaching_curves([c])
        return entry.reaching


_UNSET: Any = object()  # an entry's field not read yet (None is a value: "no last step", "no reach")


@dataclass(slots=True)
class StoredVersion:
    """One stored version of a trial, as read: the FrozenTrial, its fingerprint (number, state, count of
    reports and of user attrs, value) and whether it had finished. What is built from it (``TrialMemo``'s
    entries, hpo/optuna_side/pruner.py's views) is reused while the version ``holds`` the trial read again.

    Optuna's storages never change a FrozenTrial they handed out: every write replaces the trial's object
    (copy-on-write in memory and in the journal, fresh objects read back from a database). So the same object
    with the same fingerprint is the same version; and a finished trial never changes at all (Optuna refuses
    writes to it), so a new object of it with the same fingerprint is too, and the object read when it had
    finished need not even be fingerprinted again (most trials of a sweep, at every judgement).
    """

    trial: Any
    fingerprint: tuple[Any, ...]
    finished: bool

    @classmethod
    def of(cls, t: optuna.trial.FrozenTrial) -> StoredVersion:
        """The version of ``t``."""
        return cls(t, _fingerprint(t), t.state.is_finished())

    def holds(self, t: optuna.trial.FrozenTrial) -> bool:
        """Whether ``t`` (the same trial, read again) is this version; a finished trial read anew as a new
        object is kept as the version's object, so that its next read takes the fast path."""
        if self.trial is t and self.finished:
            return True
        if self.fingerprint != _fingerprint(t):
            return False
        if self.trial is not t:
            if not self.finished:  # the fingerprint holds the state: ``t`` is as finished as this version
                return False
            self.trial = t  # one attribute store: atomic for the threads of an Optuna study's workers
        return True


def _fingerprint(t: optuna.trial.FrozenTrial) -> tuple[Any, ...]:
    return (t.number, t.state, len(t.intermediate_values), len(t.user_attrs), t.value)


@dataclass(slots=True)
class _MemoEntry:
    """What ``TrialMemo`` holds of one stored version of a trial: the version (what tells a stale entry), its
    controls (or why they do not parse), and four reads made when first asked
    (``_UNSET`` until then): its curve (or the InputError building it raised), its last reported step, its
    reach and its reaching curves."""

    version: StoredVersion
    controls: Any
    curve: Any = _UNSET
    last_step: Any = _UNSET
    reach: Any = _UNSET
    reaching: Any = _UNSET


def trial_reach(n_reports: int, last: float | None, total: float | None) -> float | None:
    """How far a trial has run, in t̂ rounded down to ``REACH_STEP`` (at most 1), from its count of reports,
    its last reported step and its training length (same units); None with fewer than 3 reports, no
    report or no length."""
    if n_reports < 3 or last is None or not total:
        return None
    return rounded_reach(last / total)


def reference_curves(
    trials: list[optuna.trial.FrozenTrial], defaults: TrialControls, memo: TrialMemo | None = None
) -> tuple[list[Curve], list[int]]:
    """Complete, clean curves of COMPLETE trials (final loss known, every loss finite and positive, t̂ ≤ 1).

    Returns the curves and their trial numbers (ascending). Trials whose curves do not qualify are skipped.
    ``memo``: read each trial's curve through it (the same curves, built once per trial).
    """
    import optuna

    curves: list[Curve] = []
    numbers: list[int] = []
    for t in sorted(trials, key=lambda tr: tr.number):
        if t.state != optuna.trial.TrialState.COMPLETE or t.user_attrs.get(SAMPLER_STEP_ATTR) is not None:
            continue
        try:
            c = trial_curve(t, defaults) if memo is None else memo.curve(t, defaults)
        except InputError:
            continue
        if c is None or c.t_hat.size < 3:
            continue
        if not np.all(np.isfinite(c.loss)) or np.any(c.loss <= 0) or c.t_hat[-1] > 1.0 + 1e-9:
            continue
        if c.t_hat[-1] < COMPLETE_T_HAT:
            continue
        curves.append(c)
        numbers.append(t.number)
    return curves, numbers


class FitCache:
    """Memo of ``fit_surrogate``: the same curves give the same surrogate, calibrated once.

    Exact by construction: the key is everything the fit reads of the curves, in order (name, t̂ and loss
    as float64 bytes, schedule, τ, TPP, params). Used by the replay harness (hpo/replays/replay.py) across
    trial orders; install it with ``fit_caching(cache)``. A cached surrogate is shared: callers must not
    change it. Counts ``hits``, ``misses``, and ``set_repeats``: misses whose set of curves (ignoring names
    and order) was fitted before, i.e. what a key by the set of completed trials would have added.
    """

    def __init__(self) -> None:
        self.entries: dict[tuple[Any, ...], Surrogate] = {}
        self.sets: set[frozenset[Any]] = set()
        self.hits = 0
        self.misses = 0
        self.set_repeats = 0

    @staticmethod
    def parts(curves: list[Curve]) -> list[tuple[Any, ...]]:
        """Each curve's content as the fit reads it (without its name)."""
        def raw(a: Any) -> bytes:
            return np.asarray(a, dtype=np.float64).tobytes()

        return [(raw(c.t_hat), raw(c.loss), c.schedule, c.tau, c.tpp, c.params) for c in curves]


_FIT_CACHE: FitCache | None = None


@contextmanager
def fit_caching(cache: FitCache | None) -> Iterator[FitCache | None]:
    """Within the block, ``fit_surrogate`` answers from ``cache`` (None: no cache). For one thread's work
    (the replay harness), not for a live sweep's workers."""
    global _FIT_CACHE
    before = _FIT_CACHE
    _FIT_CACHE = cache
    try:
        yield cache
    finally:
        _FIT_CACHE = before


def fit_surrogate(curves: list[Curve]) -> Surrogate:
    """Calibrate a surrogate on reference curves (``predictors.calibrate``); deterministic for given curves.

    When every curve shares one (τ, TPP), each curve is its own held-out group, so the learned error model
    is out-of-sample across runs (calibrate's default groups by (τ, TPP) would leave a single group).

    The held-out folds hold at least two groups each (``online_folds``): the paired error model
    (``pair_bands``) is learned from two curves predicted by one fold's surrogate, and a sweep whose trials
    all differ in τ (per-trial controls: a random search over lr, λ, batch) has one group per trial, so with
    one group per fold it would have no pair_bands until 6 trials completed, and the paired comparison of
    trials with other controls would not work before.

    Answers from the active ``FitCache`` when one is installed (``fit_caching``).
    """
    cache = _FIT_CACHE
    if cache is None:
        return _fit(curves)
    parts = cache.parts(curves)
    key = tuple((c.run, *part) for c, part in zip(curves, parts))
    hit = cache.entries.get(key)
    if hit is not None:
        cache.hits += 1
        return hit
    surrogate = _fit(curves)  # a failed fit raises and is not cached: the caller says why, every time
    cache.misses += 1
    group = frozenset(parts)
    if group in cache.sets:
        cache.set_repeats += 1
    cache.sets.add(group)
    cache.entries[key] = surrogate
    return surrogate


def _fit(curves: list[Curve]) -> Surrogate:
    single = len({(c.tau, c.tpp) for c in curves}) == 1
    groups = [c.run for c in curves] if single else [(c.tau, c.tpp) for c in curves]
    return calibrate(curves, groups=groups, folds=online_folds(len(set(groups)))).surrogate


#: At most this many held-out folds in an online fit (calibrate's default).
MAX_ONLINE_FOLDS = 5


def online_folds(n_groups: int) -> int:
    """Held-out folds for an online fit of ``n_groups`` curve groups: as many as keep two groups in every
    fold (at least 2 folds, at most ``MAX_ONLINE_FOLDS``), so that every fold can give paired errors."""
    return max(2, min(MAX_ONLINE_FOLDS, n_groups // 2))


class SurrogateReference:
    """A fixed surrogate: a calibrated JSON file (loaded once, on construction) or a ``Surrogate`` object."""

    def __init__(self, surrogate: Surrogate | str | os.PathLike[str]) -> None:
        if isinstance(surrogate, Surrogate):
            self.surrogate = surrogate
            self.label = "surrogate"
        else:
            self.surrogate = Surrogate.load(surrogate)
            self.label = f"file:{Path(surrogate).name}"

    def get(
        self,
        study: optuna.study.Study | None,
        defaults: TrialControls,
        trials: list[optuna.trial.FrozenTrial] | None = None,
    ) -> tuple[Surrogate | None, str]:
        """The surrogate and its label."""
        return self.surrogate, self.label

    def __repr__(self) -> str:
        return f"SurrogateReference({self.label})"


class StudyReference:
    """A calibration family: the completed trials of another study, calibrated once on first use.

    Args:
        study_name: name of the reference study.
        storage: its storage URL (or an Optuna storage object).
        min_trials: completed, clean curves needed (at least 2).
    """

    def __init__(self, study_name: str, storage: Any, *, min_trials: int = 2) -> None:
        if not isinstance(study_name, str) or not study_name:
            raise InputError(f"reference: 'study' must be a study name, got {study_name!r}")
        if isinstance(min_trials, bool) or not isinstance(min_trials, int) or min_trials < 2:
            raise InputError(f"reference: 'min_trials' must be an integer >= 2, got {min_trials!r}")
        self.study_name = study_name
        self.storage = storage
        self.min_trials = min_trials
        self._lock = threading.Lock()
        self._result: tuple[Surrogate | None, str] | None = None

    def get(
        self,
        study: optuna.study.Study | None,
        defaults: TrialControls,
        trials: list[optuna.trial.FrozenTrial] | None = None,
    ) -> tuple[Surrogate | None, str]:
        """The calibrated surrogate (fitted on the first call) and its label, or (None, why not)."""
        with self._lock:
            if self._result is None or self._result[0] is None:
                self._result = self._load(defaults)
            return self._result

    def _load(self, defaults: TrialControls) -> tuple[Surrogate | None, str]:
        import optuna

        try:
            ref = optuna.load_study(study_name=self.study_name, storage=self.storage)
        except KeyError:
            raise InputError(
                f"reference: study {self.study_name!r} not found in the storage; give an existing study name"
            ) from None
        curves, _ = reference_curves(ref.get_trials(deepcopy=False), defaults)
        if len(curves) < self.min_trials:
            return None, (
                f"reference study {self.study_name!r} has {len(curves)} complete curve(s), "
                f"need {self.min_trials}"
            )
        try:
            return fit_surrogate(curves), f"study:{self.study_name}({len(curves)} trials)"
        except InputError as err:
            raise InputError(f"reference study {self.study_name!r}: calibration failed: {err}") from None

    def __repr__(self) -> str:
        return f"StudyReference({self.study_name!r}, min_trials={self.min_trials})"


#: How an online reference refits (``OnlineReference(refit=...)``).
REFITS = ("background", "inline")
#: The online reference refits when the count of completed trials reaches the next point of the schedule
#: n_0 = min_trials, n_(k+1) = max(n_k + 1, floor(REFIT_GROWTH · n_k)): 3, 4, 6, 9, 13, 19, 28, 42, 63, 94,
#: 141, ... (``refit_points``). A fit costs seconds and grows with the curves it fits; one refit per completed
#: trial made ``collapse-online``'s replay of 197 LoRA runs take ~60 CPU s per order (BENCHMARKS §16), almost
#: all of it fits. With the schedule n completed trials make ~1 + log(n/3)/log(1.5) fits, and the curves
#: fitted sum to ~3n instead of ~n²/2. 1.5 was fixed before any measurement (each fit on 50% more curves
#: than the last: early fits follow the first completions closely, later ones thin out); it was then checked,
#: not tuned, against 1 (a refit per completion) on the development sweeps (§5's τ-held and λ-fixed, the
#: random-config sweeps) and measured on surestop_lora, out of sample (BENCHMARKS §16, §17). 1 restores a
#: refit per completion.
REFIT_GROWTH = 1.5
#: The ``prior`` of an online reference that has none.
NO_PRIOR = "none"


def refit_points(min_trials: int, growth: float, up_to: int) -> list[int]:
    """The counts of completed trials at which an online reference refits, up to ``up_to`` (ascending):
    n_0 = ``min_trials``, n_(k+1) = max(n_k + 1, floor(``growth`` · n_k)). ``growth`` 1 gives every count."""
    points: list[int] = []
    n = min_trials
    while n <= up_to:
        points.append(n)
        n = max(n + 1, math.floor(growth * n + 1e-9))
    return points


def scheduled_count(n_completed: int, min_trials: int, growth: float, max_trials: int | None = None) -> int:
    """How many completed trials the online fit uses when ``n_completed`` have completed: the last point of
    ``refit_points`` reached (0 before ``min_trials``), capped by ``max_trials``."""
    points = refit_points(min_trials, growth, n_completed)
    n = points[-1] if points else 0
    return n if max_trials is None else min(n, max_trials)


def completion_order(trials: list[optuna.trial.FrozenTrial], numbers: list[int]) -> list[int]:
    """``numbers`` (trial numbers) in the order their trials completed (``datetime_complete``; ties and trials
    without one after, by number). The same in every worker and after a restart: it is in the storage."""
    wanted = set(numbers)
    done = {t.number: t.datetime_complete for t in trials if t.number in wanted}

    def key(n: int) -> tuple[bool, Any, int]:
        dt = done.get(n)
        return (dt is None, dt.timestamp() if dt is not None else 0.0, n)

    return sorted(numbers, key=key)


def _tested_label(label: str, tested: tuple[tuple[str, float], ...]) -> str:
    """A reference label with the trials a surrogate was tested on and how far each had run
    (``label;3@0.5,7@0.4``): the decision log names what a prediction was checked against."""
    if not tested:
        return label
    return label + ";" + ",".join(f"{run.removeprefix('trial')}@{reach:g}" for run, reach in tested)


class OnlineReference:
    """Online calibration on the sweep's own completed trials, refitted on a geometric schedule of their
    count; before the first fit, a prior tested on the sweep's partial curves.

    Args:
        min_trials: completed, clean curves needed before the first fit (at least 2).
        max_trials: use at most this many completed trials (the first to complete); None = all. Bounds the
            refit cost in long sweeps.
        refit_growth: the refit schedule's growth factor (None: ``REFIT_GROWTH``, 1.5; at least 1): with
            ``min_trials`` 3 the fits use the first 3, 4, 6, 9, 13, 19, 28, 42, ... completed trials; 1 refits
            on every completion.
        prior: the surrogate that speaks until the first online fit is ready, and after it while the fit's
            held-out error model stands on fewer than ``decision.MARGIN_CAP_RUNS`` (10) runs (``_thin_fit``:
            a fit on a few trials can learn an error far too small; while the prior can serve, no fit is made
            on fewer than 10 completed trials): ``"builtin"`` (default:
            predictors/prior.py's ``BUILTIN_PRIOR``), a surrogate JSON path, a ``Surrogate``, or
            ``"none"``/None (no prediction before the first fit, which then serves from ``min_trials`` on; the
            equal-controls loss ratio needs none). It is tested on the sweep's own curves
            (``predictors.prior.prior_for_sweep``): its interval widens by how far the sweep's curves stray
            from its shape. A trial without weight decay gets its τ law's limit τ → ∞ (``Surrogate.
            no_decay_limit``). Label ``prior:NAME`` (untested) or ``prior:NAME;N@R,...`` (tested on trial N
            up to t̂ = R, ...).
        refit: ``"background"`` (default, live sweeps) or ``"inline"`` (replays).

    The refit schedule. A fit of a few more curves barely moves the collapse shape, but costs seconds (more
    with more curves), and each new fit makes every prediction anew. So the fit does not follow every
    completed trial: when n clean curves of COMPLETE trials exist, it uses the first ``scheduled_count(n)``
    of them in completion order (``completion_order``: the storage's ``datetime_complete``, so every worker
    and a restarted driver agree), the last point of ``refit_points`` reached: 3, 4, 6, 9, 13, 19, 28, 42,
    63, 94, 141, ... for ``min_trials`` 3. A sweep of n completed trials thus makes about 1 + ln(n/3)/ln(1.5)
    fits (10 for 100, 11 for 200), in live sweeps (fewer background fits, less CPU) and in replays alike.
    The trials that completed after the last point are not fitted on; they test the fit (below) instead.

    Refits and determinism. A refit (``fit_surrogate``: seconds) never runs inside ``get`` with
    ``refit="background"``: ``get`` hands the new set of completed trials to a background thread and
    answers with the latest surrogate finished before this call (the newest fit this process has, or the
    one stored in the study by any worker, else the tested prior); the thread stores its fit in the study's
    user attrs (``collapse_reference``), where every worker and a restarted driver find it. Which fit a
    decision uses then depends on timing, like the reports of other workers do; the label in each decision
    log entry names it, so a decision is reproducible from the log. With ``refit="inline"`` (the replay
    harness, hpo/replays/replay.py) the fit runs in ``get`` as soon as the scheduled set changes: a decision
    depends on the trials only, and a replay is deterministic. The tested prior is computed inline in both
    modes (milliseconds) and depends on the trials only.
    """

    def __init__(
        self, *, min_trials: int = 3, max_trials: int | None = None, prior: Any = BUILTIN,
        refit: str = "background", refit_growth: float | None = None,
    ) -> None:
        if isinstance(min_trials, bool) or not isinstance(min_trials, int) or min_trials < 2:
            raise InputError(f"reference: 'min_trials' must be an integer >= 2, got {min_trials!r}")
        if max_trials is not None and (
            isinstance(max_trials, bool) or not isinstance(max_trials, int) or max_trials < min_trials
        ):
            raise InputError(f"reference: 'max_trials' must be an integer >= min_trials, got {max_trials!r}")
        if refit not in REFITS:
            raise InputError(f"reference: 'refit' must be one of {', '.join(REFITS)}, got {refit!r}")
        if refit_growth is None:
            refit_growth = REFIT_GROWTH
        if (isinstance(refit_growth, bool) or not isinstance(refit_growth, int | float)
                or not math.isfinite(refit_growth) or refit_growth < 1):
            raise InputError(f"reference: 'refit_growth' must be a number >= 1, got {refit_growth!r}")
        self.min_trials = min_trials
        self.refit_growth = float(refit_growth)
        self.max_trials = max_trials
        self.refit = refit
        self._prior: tuple[Surrogate, str] | None = None
        if prior is not None and not (isinstance(prior, str) and prior.strip().lower() == NO_PRIOR):
            if not isinstance(prior, str | os.PathLike | Surrogate):
                raise InputError(
                    f"reference: 'prior' must be 'builtin', 'none' or a surrogate JSON path, got {prior!r}"
                )
            # A trial without weight decay gets the prior's τ law at its limit τ → ∞ (b → 0) instead of no
            # prediction: the prior is tested on the sweep's own curves as they reach MIN_REACH
            # (prior_for_sweep), which widens its intervals by its misses there (BENCHMARKS §22).
            surrogate, name = load_prior(prior)
            self._prior = (replace(surrogate, no_decay_limit=True), name)
        self._lock = threading.Lock()
        self._cache: dict[tuple[int, ...], Surrogate] = {}
        self._failed: dict[tuple[int, ...], str] = {}
        self._latest: tuple[Surrogate, str] | None = None  # the newest online fit this process has
        self._tested: tuple[tuple[Any, ...], tuple[Surrogate, str]] | None = None
        self._tested_fit: tuple[tuple[Any, ...], tuple[Surrogate, str]] | None = None
        # the online fit last tested and its shape misses by what they read of a curve (``prior_for_sweep``'s
        # memo)
        self._misses: tuple[Surrogate, dict[tuple, Any]] | None = None
        self._prior_misses: dict[tuple, Any] = {}  # the prior's shape misses (the prior never changes)
        self._refitter = _Refitter() if refit == "background" else None
        self._memo = TrialMemo()
        # the complete trials' ids at the last ``get``, their reference curves (a finished trial never
        # changes, so the same ids give the same curves) and the first n of them to complete, by n
        self._complete: tuple[tuple[Any, ...], tuple[list[Curve], list[int]],
                              dict[int, tuple[list[Curve], list[int]]]] | None = None

    @property
    def prior(self) -> str | None:
        """The prior's name (None without one)."""
        return None if self._prior is None else self._prior[1]

    def get(
        self,
        study: optuna.study.Study | None,
        defaults: TrialControls,
        trials: list[optuna.trial.FrozenTrial] | None = None,
    ) -> tuple[Surrogate | None, str]:
        """The surrogate fitted on the study's completed trials (or, until it is ready, the latest fit
        finished, else the tested prior), or (None, why not)."""
        import optuna

        if study is None:
            return None, "online calibration needs the sweep's Optuna study (none given)"
        if trials is None:
            trials = study.get_trials(deepcopy=False)
        done = optuna.trial.TrialState.COMPLETE
        complete = (defaults, *(getattr(t, "_trial_id", None) for t in trials if t.state == done))
        last = self._complete
        if last is not None and last[0] == complete and None not in complete:
            curves, numbers = last[1]
            firsts = last[2]
        else:
            curves, numbers = reference_curves(trials, defaults, self._memo)
            firsts = {}
            self._complete = (complete, (curves, numbers), firsts)
        n = scheduled_count(len(curves), self.min_trials, self.refit_growth, self.max_trials)
        if self.min_trials <= n < len(curves):  # the first n to complete, kept in trial-number order
            chosen = firsts.get(n)  # finished trials never change: the same set gives the same choice
            if chosen is None:
                first = set(completion_order(trials, numbers)[:n])
                kept = [(c, k) for c, k in zip(curves, numbers) if k in first]
                chosen = firsts[n] = ([c for c, _ in kept], [k for _, k in kept])
            curves, numbers = chosen
        if len(curves) < self.min_trials:
            why = (
                f"online calibration: {len(curves)} completed trial(s), need {self.min_trials} "
                "before pruning starts (counted: COMPLETE, with a total and a clean full curve)"
            )
        elif self._prior is not None and len(curves) < MARGIN_CAP_RUNS and (
            served := self._tested_prior(trials, defaults, f"online calibration: {len(curves)} trials")
        )[0] is not None:
            # A fit on fewer than MARGIN_CAP_RUNS curves is thin by construction (its error bands stand on
            # at most that many held-out runs), so the prior it would wait for serves: no fit is made. The
            # same decisions as fitting and setting the fit aside, without seconds of CPU per fit.
            return served
        else:
            surrogate, why = self._online(study, curves, tuple(numbers))
            if surrogate is None:
                with self._lock:
                    latest = self._latest or _stored_fit(study)
                if latest is not None:
                    surrogate, why = latest
            if surrogate is not None:
                if self._prior is not None and _thin_fit(surrogate):
                    served = self._tested_prior(trials, defaults, why)
                    if served[0] is not None:
                        return served
                return self._tested_online(surrogate, why, trials, defaults)
        if self._prior is None:
            return None, why
        return self._tested_prior(trials, defaults, why)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the background refit (if any) is idle; True when it is. For tests and benchmarks."""
        return True if self._refitter is None else self._refitter.wait(timeout)

    def _online(
        self, study: optuna.study.Study, curves: list[Curve], key: tuple[int, ...]
    ) -> tuple[Surrogate | None, str]:
        """The fit of ``key``'s curves: (surrogate, label), or (None, why) when it failed or is not ready."""
        label = "online:" + ",".join(str(n) for n in key)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                return cached, label
            stored = study.user_attrs.get(STUDY_REFERENCE_ATTR)
            surrogate = _parse_fit(stored, key)
            if surrogate is None:
                failed = self._failed.get(key)
                if failed is not None:
                    return None, failed
                if self._refitter is not None:
                    done = self._refitter.result(key)
                    if done is None:
                        self._refitter.submit(key, curves, study)
                        return None, f"online calibration on trials {label[7:]} running in the background"
                    surrogate, why = done
                    if surrogate is None:
                        self._failed = {key: why}
                        return None, why
                else:
                    try:
                        surrogate = fit_surrogate(curves)
                    except Exception as err:  # a failed fit must not crash the sweep: no pruning, the reason
                        why = _fit_failed(key, err)
                        self._failed = {key: why}
                        return None, why
                    study.set_user_attr(
                        STUDY_REFERENCE_ATTR, {"trials": list(key), "surrogate": surrogate.to_dict()}
                    )
            self._cache = {key: surrogate}
            if self._latest is None or _trials_of(self._latest[1]) <= len(key):
                self._latest = (surrogate, label)
            return surrogate, label

    def _tested_online(
        self, fit: Surrogate, label: str, trials: list[optuna.trial.FrozenTrial], defaults: TrialControls
    ) -> tuple[Surrogate, str]:
        """An online fit tested, as the prior is, on the sweep's curves it was not fitted on (running and
        pruned trials that reached ``MIN_REACH``): its interval widens by their misses (its held-out error
        model comes from few completed trials and was overconfident: BENCHMARKS §9). Its paired errors are
        kept, so no paired decision moves. Label ``online:N,...;M@R,...`` (fitted on N, ...; tested on M up to
        t̂ = R, ...)."""
        fitted = {int(n) for n in label.split(":", 1)[1].split(",")}
        candidates, _ = _reaching([t for t in trials if t.number not in fitted], defaults, None, self._memo)
        key = (label, tuple((number, reach) for number, reach, _ in candidates))
        with self._lock:
            if self._tested_fit is not None and self._tested_fit[0] == key:
                return self._tested_fit[1]
        if not candidates:
            return fit, label
        with self._lock:  # the shape misses of this fit's tests so far: one curve moves on at a time
            if self._misses is None or self._misses[0] is not fit:
                self._misses = (fit, {})
            misses = self._misses[1]
        tested = prior_for_sweep(fit, [curve for _, _, curve in candidates], own=True, memo=misses)
        out = (tested.surrogate, _tested_label(label, tested.tested))
        with self._lock:
            self._tested_fit = (key, out)
        return out

    def _tested_prior(
        self, trials: list[optuna.trial.FrozenTrial], defaults: TrialControls, why: str
    ) -> tuple[Surrogate | None, str]:
        """The prior tested on the sweep's curves that reached ``MIN_REACH`` (cached while they did not move
        past another ``REACH_STEP``); (None, ``why`` and the reason) when the prior cannot predict one of the
        sweep's trials (e.g. a τ law that rises with τ and a trial without weight decay, or a TPP law and a
        trial without a TPP): a surrogate that fails on a trial would keep it where the loss ratio of
        equal-controls trials, which needs none, could judge it."""
        assert self._prior is not None
        prior, name = self._prior
        candidates, unserved = _reaching(trials, defaults, prior, self._memo)
        if unserved is not None:
            return None, f"{why}; the prior {name!r} cannot predict {unserved}"
        key = tuple((number, reach) for number, reach, _ in candidates)
        with self._lock:
            if self._tested is not None and self._tested[0] == key:
                return self._tested[1]
        tested = prior_for_sweep(prior, [curve for _, _, curve in candidates], memo=self._prior_misses)
        out = (tested.surrogate, _tested_label(f"prior:{name}", tested.tested))
        with self._lock:
            self._tested = (key, out)
        return out

    def __repr__(self) -> str:
        return (f"OnlineReference(min_trials={self.min_trials}, max_trials={self.max_trials}, "
                f"prior={self.prior!r}, refit={self.refit!r}, refit_growth={self.refit_growth:g})")


def _thin_fit(fit: Surrogate) -> bool:
    """Whether an online fit waits while a prior can serve: its held-out error model stands on fewer than
    ``decision.MARGIN_CAP_RUNS`` runs at some fraction (or it has none).

    A band's scale learned from a handful of held-out runs can be far too small: on the random-config sweep
    random_s0 a fit on 3 completed trials put the paired error at t̂ 0.4 at 0.6% where a fit on 6 others gave
    10%, and fits on 3 and 6 trials cut the sweep's best trial (7–8% behind at t̂ 0.2–0.3, the best at the end)
    in 2 of 10 orders (BENCHMARKS §23). The Student-t quantile widens a band for its count on average, not for
    a scale that happens to come out small. The tested prior, whose scale stands on its own calibration
    family and is widened by its misses on this sweep's curves, serves until then (when it cannot serve the
    sweep, the fit does): the same count after which a reference's paired error may cap the margin
    (``MARGIN_CAP_RUNS``, set before any measurement)."""
    return min((b.n for b in fit.error_bands), default=0) < MARGIN_CAP_RUNS


def _fit_failed(key: tuple[int, ...], err: Exception) -> str:
    return (f"online calibration on trials {','.join(map(str, key))} failed "
            f"({type(err).__name__}: {err})")


def _trials_of(label: str) -> int:
    """How many trials an ``online:`` label names."""
    return len(label.split(":", 1)[1].split(","))


def _parse_fit(stored: Any, key: tuple[int, ...] | None) -> Surrogate | None:
    """The surrogate of a stored fit (study attr ``collapse_reference``) when it is of ``key``'s trials (any
    trials when ``key`` is None); None otherwise or when it does not parse."""
    if not isinstance(stored, dict) or (key is not None and stored.get("trials") != list(key)):
        return None
    try:
        return Surrogate.from_dict(stored.get("surrogate"), source=f"study attr {STUDY_REFERENCE_ATTR}")
    except InputError:
        return None


def _stored_fit(study: optuna.study.Study) -> tuple[Surrogate, str] | None:
    """The online fit stored in the study by any worker (the latest finished), with its label."""
    stored = study.user_attrs.get(STUDY_REFERENCE_ATTR)
    surrogate = _parse_fit(stored, None)
    if surrogate is None:
        return None
    trials = stored.get("trials")
    if not isinstance(trials, list) or not trials:
        return None
    return surrogate, "online:" + ",".join(str(n) for n in trials)


def _reaching(
    trials: list[optuna.trial.FrozenTrial], defaults: TrialControls, prior: Surrogate | None,
    memo: TrialMemo | None = None,
) -> tuple[list[tuple[int, float, Curve]], str | None]:
    """Trials whose curves can test the prior (``predictors.prior.reaching_curves``): (number, reach, curve),
    the furthest-reaching first; and which trial the prior cannot predict, with why (None when it can predict
    every trial with reports). Reads each trial's last report and controls; builds curves for those kept.
    ``memo``: the reads kept between calls (None: read every trial anew, through a memo of this call)."""
    if memo is None:
        memo = TrialMemo()
    reach: list[tuple[float, int, Any]] = []
    served: dict[tuple[bool, bool], str | None] = {}
    for t in trials:
        if not t.intermediate_values:
            continue
        controls, r = memo.reach(t, defaults)
        if isinstance(controls, InputError):
            continue
        kind = (controls.tau is None, controls.tpp is None)  # what a law can refuse
        if prior is not None and kind not in served:
            try:
                prior.b(controls.tau), prior.q(controls.tpp)
                served[kind] = None
            except (InputError, ValueError) as err:
                served[kind] = str(err)
        if served.get(kind) is not None:
            return [], f"trial {t.number} ({served[kind]})"
        if r is not None and r >= MIN_REACH - 1e-9:
            reach.append((-r, t.number, t))
    reach.sort(key=lambda x: (x[0], x[1]))
    out: list[tuple[int, float, Curve]] = []
    for _, number, t in reach[:MAX_TESTED]:
        out.extend((number, r, curve) for curve, r in memo.reaching(t, defaults))
    return out, None


class _Refitter:
    """One background thread that fits the newest set of completed trials handed to it (``submit``); an older
    set still waiting is dropped for a newer one. It stores each fit in the study (``collapse_reference``) and
    keeps the latest result for ``result``. The thread is a daemon and ends after ``IDLE_S`` without work."""

    IDLE_S = 30.0

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: tuple[tuple[int, ...], list[Curve], Any] | None = None
        self._running: tuple[int, ...] | None = None
        self._results: dict[tuple[int, ...], tuple[Surrogate | None, str]] = {}
        self._thread: threading.Thread | None = None

    def result(self, key: tuple[int, ...]) -> tuple[Surrogate | None, str] | None:
        """The finished fit of ``key`` ((surrogate, label) or (None, why it failed)); None when not done."""
        with self._cond:
            return self._results.get(key)

    def submit(self, key: tuple[int, ...], curves: list[Curve], study: Any) -> None:
        """Fit ``curves`` (the completed trials ``key``) in the background, unless it is running or done."""
        with self._cond:
            if key in self._results or key == self._running:
                return
            self._pending = (key, curves, study)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="collapse-hpo-refit", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def wait(self, timeout: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._pending is None and self._running is None, timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda: self._pending is not None, self.IDLE_S):
                    self._thread = None
                    return
                assert self._pending is not None
                key, curves, study = self._pending
                self._pending, self._running = None, key
            label = "online:" + ",".join(str(n) for n in key)
            out: tuple[Surrogate | None, str]
            try:
                surrogate = fit_surrogate(curves)
                out = (surrogate, label)
                with contextlib.suppress(Exception):  # where every worker and a restarted driver find it
                    study.set_user_attr(
                        STUDY_REFERENCE_ATTR, {"trials": list(key), "surrogate": surrogate.to_dict()}
                    )
            except Exception as err:  # a failed fit must not crash the sweep: no pruning, with the reason
                out = (None, _fit_failed(key, err))
            with self._cond:
                self._results = {key: out}
                self._running = None
                self._cond.notify_all()


Reference = SurrogateReference | StudyReference | OnlineReference


def near_online(spec: str) -> bool:
    """``spec`` reads as a misspelling of ``"online"`` ("onlne", "Onlin", "'online'"), not as a file name."""
    import difflib

    return bool(difflib.get_close_matches(spec.strip().strip("'\"").lower(), ["online"], n=1, cutoff=0.8))


def make_reference(spec: Any) -> Reference:
    """A reference from a YAML-style spec.

    Accepted: a reference object; a ``Surrogate``; a path (str or PathLike) to a surrogate JSON; ``"online"``;
    or a mapping with exactly one of ``surrogate: PATH``, ``study: NAME`` (with ``storage: URL`` and optional
    ``min_trials``) or ``online: true`` (with optional ``min_trials``, ``max_trials``, ``prior``, ``refit``,
    ``refit_growth``).
    Raises InputError naming the field on anything else, and suggests ``"online"`` for a string that is no
    file and reads as its misspelling ("onlne").
    """
    if isinstance(spec, SurrogateReference | StudyReference | OnlineReference):
        return spec
    if isinstance(spec, Surrogate):
        return SurrogateReference(spec)
    if isinstance(spec, str) and spec.strip().lower() == "online":
        return OnlineReference()
    if isinstance(spec, str | os.PathLike):
        if isinstance(spec, str) and not Path(spec).is_file() and near_online(spec):
            raise InputError(f"{spec}: no such surrogate file; did you mean 'online' (calibrate on the "
                             "study's own completed trials)? Else make one with `collapse-hpo calibrate`")
        return SurrogateReference(spec)
    if isinstance(spec, Mapping):
        kinds = [k for k in ("surrogate", "study", "online") if k in spec]
        if len(kinds) != 1:
            raise InputError(
                "reference: give exactly one of 'surrogate' (a JSON path), 'study' (a study name, with "
                f"'storage') or 'online: true'; got keys {sorted(spec)}"
            )
        kind = kinds[0]
        allowed = {
            "surrogate": {"surrogate"},
            "study": {"study", "storage", "min_trials"},
            "online": {"online", "min_trials", "max_trials", "prior", "refit", "refit_growth"},
        }[kind]
        unknown = set(spec) - allowed
        if unknown:
            raise InputError(
                f"reference: unknown field(s) {', '.join(sorted(unknown))} for a {kind!r} reference; "
                f"allowed: {', '.join(sorted(allowed))}"
            )
        if kind == "surrogate":
            return SurrogateReference(spec["surrogate"])
        if kind == "study":
            if "storage" not in spec:
                raise InputError("reference: a 'study' reference needs 'storage' (the storage URL)")
            return StudyReference(spec["study"], spec["storage"], min_trials=spec.get("min_trials", 2))
        if spec["online"] is not True:
            raise InputError(f"reference: field 'online' must be true, got {spec['online']!r}")
        return OnlineReference(min_trials=spec.get("min_trials", 3), max_trials=spec.get("max_trials"),
                               prior=spec.get("prior", BUILTIN), refit=spec.get("refit", "background"),
                               refit_growth=spec.get("refit_growth"))
    raise InputError(
        f"reference: expected a surrogate JSON path, 'online', or a mapping, got {type(spec).__name__}"
    )
