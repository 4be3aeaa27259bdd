"""The judge: everything around the decision rule, once, for every backend (Optuna pruner, Ray scheduler).

``Judge.judge(trial, others, reference)`` takes plain views of trials (``TrialView``: reports, controls,
state, decision log) and returns a ``Verdict``. In order, it

1. answers from the log when the trial was judged already (``recall``: a pruned trial stays pruned; a step
   is judged once);
2. cleans the reports once (``reports.clean``: invalid t̂, repeats, past-the-end points, divergence);
3. decides whether a judgement is due (from ``min_fraction`` on, at most once per ``judge_every`` of
   training; a diverged loss is judged at once);
4. chooses the competitors (``competitors``: the one place that says who competes);
5. calls ``hpo.rule.decision.decide`` (the rule itself, told in that module's docstring; never re-implemented
   here);
6. emits the one decision entry (``record.DecisionEntry``) when the decision is a judgement.

The adapters only translate: hpo/optuna_side/pruner.py builds views from Optuna trials and writes the entry
to the trial's user attrs; hpo/ray_side/scheduler.py builds them from its Tune records and writes the entry to
its state file and Optuna mirror. Nothing here imports Optuna or Ray.

Example:

    >>> from collapse_hpo.hpo.rule.decision import PruneSettings
    >>> from collapse_hpo.hpo.rule.judge import Judge, TrialView
    >>> from collapse_hpo.hpo.rule.record import TrialControls
    >>> judge = Judge(PruneSettings(min_fraction=0.2))
    >>> view = TrialView(number=0, state="running", steps=(100, 200), t_hat=(0.1, 0.2),
    ...                  loss=(4.0, float("nan")), controls=TrialControls(total=1000))
    >>> verdict = judge.judge(view, others=list, reference=lambda: (None, "none"))
    >>> verdict.entry.prune, verdict.entry.reason.startswith("loss is nan")
    (True, True)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from collapse_hpo.hpo.rule.decision import (
    Competitor,
    Decision,
    PruneSettings,
    SettingError,
    decide_cleaned,
    not_judged_yet,
)
from collapse_hpo.hpo.rule.record import WARNINGS_ATTR, DecisionEntry, TrialControls, latest_prediction
from collapse_hpo.hpo.rule.reports import (  # the cleaning lives in hpo/rule/reports.py; re-exported here
    T_HAT_END,
    CleanReports,
    Reports,
    ReportSummary,
    clean,
    clean_reports,
)
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.surrogate import Surrogate

#: Trial states a view may have. Only "complete" and "running" trials compete.
STATES = ("running", "complete", "pruned", "other")

#: Keys of the study-level warnings (``JudgeWarning.key``): each is said once per study.
PAST_END_WARNING = "progress_past_total"
UNJUDGEABLE_WARNING = "trial_never_judged"
STARTUP_WARNING = "tpe_startup"
#: The default ``judge_every`` (fraction of training) of the judge and of both adapters.
DEFAULT_JUDGE_EVERY = 0.02
#: ``Judge._early``'s answer when a judgement is due.
_DUE = object()
_TPP_UNKNOWN = (
    "tpp not defined, and the reference surrogate's q depends on TPP: give the trial's tpp "
    "(set_trial_controls, or tpp=... to the pruner or scheduler), or use a reference calibrated on runs "
    "without a tpp; kept"
)


class CollapseWarning(UserWarning):
    """A condition that silently turns pruning off (or makes it pointless); said once per study."""


@dataclass(frozen=True)
class JudgeWarning:
    """A study-level warning the judge found at a result (the adapters say it once and record it).

    Attributes:
        key: which condition (``PAST_END_WARNING``, ``UNJUDGEABLE_WARNING``, ``STARTUP_WARNING``; the Ray
            scheduler adds ``MISSING_KEY_WARNING``); a study is warned once per key.
        message: one line for the console and the study record.
        trial: the trial it was first seen on (None for a study-wide condition).
    """

    key: str
    message: str
    trial: int | str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "message": self.message, "trial": self.trial}


__all__ = ["WARNINGS_ATTR", "ReportSummary", "Reports", "clean_reports"]  # re-exported for the adapters


def add_warning(
    recorded: Sequence[Mapping[str, Any]] | None, warning: JudgeWarning
) -> list[dict[str, Any]] | None:
    """The study's warning list with ``warning`` appended, or None when its key is recorded already."""
    items = [dict(w) for w in (recorded or []) if isinstance(w, Mapping)]
    if any(w.get("key") == warning.key for w in items):
        return None
    return [*items, warning.to_dict()]


def emit(warning: JudgeWarning) -> None:
    """Say a warning on the console (Python ``warnings``, category ``CollapseWarning``)."""
    warnings.warn(f"collapse-hpo: {warning.message}", CollapseWarning, stacklevel=3)


#: ``reference()`` gives the surrogate (None when there is none yet) and its label (or why there is none).
ReferenceFn = Callable[[], tuple[Surrogate | None, str]]
#: ``others()`` gives the views of the sweep's other trials (the trial itself may be among them).
OthersFn = Callable[[], Sequence["TrialView"]]


@dataclass(frozen=True)
class TrialView:
    """What the judge needs to know of one trial (built by an adapter; trusted inside).

    Attributes:
        number: the trial's name in decision logs (Optuna trial number; a Tune trial id without a mirror).
        state: one of ``STATES``.
        steps: report steps (tokens seen, or the backend's scale), ascending; the last is judged.
        t_hat: the reports' fractions of training (tokens seen / total_tokens), same length.
        loss: the reported training losses (NaN/inf = diverged), same length.
        controls: the run's controls (schedule, τ with None = no weight decay, TPP); None when unknown.
        final_loss: the final loss of a complete trial (None otherwise).
        log: the trial's decision log so far (oldest first).
        problem: why the trial cannot be judged (malformed controls, no total_tokens); None when it can.
        reports: the reports cleaned (``clean_reports(t_hat, loss)``), when the adapter keeps them up to date
            (``ReportSummary``): the judge then reads the curve only at a judgement, so a report between two
            judgements costs the same at any curve length. None: the judge cleans ``t_hat``/``loss`` itself.

    The sequences are read, never changed or kept: an adapter may pass its own growing lists (no copy).
    """

    number: int | str
    state: str
    steps: Sequence[float] | np.ndarray
    t_hat: Sequence[float] | np.ndarray
    loss: Sequence[float] | np.ndarray
    controls: TrialControls | None = None
    final_loss: float | None = None
    log: Sequence[DecisionEntry] = field(default_factory=tuple)
    problem: str | None = None
    reports: Reports | None = None


@dataclass(frozen=True)
class Verdict:
    """The judge's answer.

    Attributes:
        prune: stop the trial.
        decision: the Decision made now; None when nothing was decided (not due, or answered from the log).
        entry: the decision entry to append to the trial's log (a judgement); None when not a judgement.
        recalled: the logged entry this answer comes from (``recall``), else None.
        reason: the trial's ``prune_reason`` now (None: leave it as it is).
        warnings: study-level conditions seen at this result (``JudgeWarning``; the adapter says each key
            once per study and records it there).
    """

    prune: bool
    decision: Decision | None = None
    entry: DecisionEntry | None = None
    recalled: DecisionEntry | None = None
    reason: str | None = None
    warnings: tuple[JudgeWarning, ...] = ()


class Judge:
    """Judge trials with the collapse rule (``hpo.rule.decision.decide``), backend-free.

    Args:
        settings: the rule's settings (``PruneSettings``: min_fraction, confidence, keep_top_k, comparison,
            margin).
        judge_every: judge at most once per this fraction of training (the first judgement at
            ``min_fraction``, the next when t̂ enters the next interval); 0 = at every report. Between
            judgements the last answer stands and nothing is written; a diverged loss is judged at once.

    Raises:
        InputError: on a bad ``judge_every`` (``PruneSettings`` checks the rest).
    """

    def __init__(self, settings: PruneSettings, *, judge_every: float = DEFAULT_JUDGE_EVERY) -> None:
        if not isinstance(settings, PruneSettings):
            raise InputError(f"Judge: settings must be a PruneSettings, got {type(settings).__name__}")
        if (
            isinstance(judge_every, bool)
            or not isinstance(judge_every, int | float)
            or not 0.0 <= judge_every < 1.0
        ):
            raise SettingError(
                "judge_every", f"must be a fraction of training in [0, 1), got {judge_every!r}"
            )
        self.settings = settings
        self.judge_every = float(judge_every)
        # The Competitor built of each other trial's latest view (by trial number), reused while an adapter
        # hands in the same view object (hpo/optuna_side/pruner.py reuses the views of unchanged stored
        # trials).
        self._competitors: dict[int | str, tuple[TrialView, Competitor | None]] = {}
        self._complete: dict[int | str, tuple[tuple[Any, ...], Competitor]] = {}  # see _finished
        # The last view cleaned and its ``CleanReports``: a judgement cleans once (``_clean``).
        self._cleaned: tuple[TrialView, CleanReports] | None = None

    # ------------------------------------------------------------------ the steps
    def recall(self, trial: TrialView) -> DecisionEntry | None:
        """The logged answer for the trial's latest step: its prune entry when it was pruned (a pruned trial
        stays pruned), else an entry at exactly ``steps[-1]`` (a step is judged once), else None."""
        for entry in trial.log:
            if entry.prune:
                return entry
        if len(trial.steps):
            step = int(trial.steps[-1])
            for entry in reversed(trial.log):
                if entry.step == step:
                    return entry
        return None

    def competitors(
        self, trial: TrialView, others: Sequence[TrialView]
    ) -> tuple[list[Competitor], list[int | str]]:
        """Who competes with ``trial``: the one place that says so.

        Completed trials with a finite final loss, and running trials (with their latest logged prediction,
        when they have one). Pruned, failed and stopped trials do not compete: they will never finish, so
        their (possibly stale, or pre-divergence) predictions must not prune anybody; with them counted, a
        replayed sweep could prune every trial and keep no result. Each competitor carries its curve and
        controls for the paired comparison (without them when its controls are unknown). Returns the
        competitors and, in the same order, their numbers.
        """
        out: list[Competitor] = []
        numbers: list[int | str] = []
        for o in others:
            if o.number == trial.number:
                continue
            hit = self._competitors.get(o.number)
            if hit is not None and hit[0] is o:  # the same view (an adapter reuses unchanged ones)
                if hit[1] is not None:
                    out.append(hit[1])
                    numbers.append(o.number)
                continue
            comp = self._competitor(o)
            self._competitors[o.number] = (o, comp)
            if comp is not None:
                out.append(comp)
                numbers.append(o.number)
        return out, numbers

    def _competitor(self, o: TrialView) -> Competitor | None:
        """The Competitor of one other trial's view, or None when it does not compete."""
        final = latest = None
        if o.state == "complete":
            if o.final_loss is None or not math.isfinite(o.final_loss):
                return None
            final = float(o.final_loss)
        elif o.state == "running":
            # A running trial competes through its curve even before its first prediction: between
            # trials with equal controls no prediction is needed (hpo/rule/decision.py, the loss ratio).
            latest = latest_prediction(list(o.log))
        else:
            return None
        c = o.controls
        if c is None or o.problem is not None:
            return Competitor(final_loss=final, latest=latest)
        if o.state == "complete":
            assert final is not None
            return self._finished(o, final, c)
        return Competitor.from_reports(
            o.t_hat, o.loss, final_loss=final, latest=latest, schedule=c.schedule, tau=c.tau, tpp=c.tpp,
        )

    def _finished(self, o: TrialView, final: float, c: TrialControls) -> Competitor:
        """A completed trial as a competitor, built once: its curve no longer changes, so later judgements
        reuse it (checked on its length, end points, final loss and controls)."""
        n = len(o.t_hat)
        key = (n, final, c, float(o.t_hat[0]), float(o.t_hat[-1]), float(o.loss[0]), float(o.loss[-1])) \
            if n else (0, final, c)
        cached = self._complete.get(o.number)
        if cached is not None and cached[0] == key:
            return cached[1]
        made = Competitor.from_reports(o.t_hat, o.loss, final_loss=final, schedule=c.schedule, tau=c.tau,
                                       tpp=c.tpp)
        self._complete[o.number] = (key, made)
        return made

    def is_judgement(self, decision: Decision) -> bool:
        """Whether a decision is a judgement (logged): a prune, or a decision from ``min_fraction`` on."""
        return decision.prune or (
            math.isfinite(decision.fraction) and decision.fraction >= self.settings.min_fraction
        )

    # ------------------------------------------------------------------ the whole
    def judge(self, trial: TrialView, others: OthersFn, reference: ReferenceFn) -> Verdict:
        """Judge ``trial`` at its latest report against the other trials (see the module docstring).

        ``reference`` and then ``others`` are called only when a judgement is due (most reports are not), so
        an adapter fetches the study only then. The verdict's ``entry`` is the one decision entry to append
        to the trial's log; the adapters write it where their backend keeps state.
        """
        quick = self.quick(trial)
        if quick is not None:
            return quick
        found = self.warnings_of(trial)
        decision, label, source = self._judgement(trial, others, reference)
        if decision.reason == _TPP_UNKNOWN:
            found += (JudgeWarning(UNJUDGEABLE_WARNING, (
                f"trial {trial.number} can never be judged: its tpp is not defined and the reference "
                "surrogate's q depends on TPP (give tpp=... to the pruner or scheduler, or "
                "set_trial_controls; or use a reference calibrated on runs without a tpp, whose q is a "
                "constant); pruning is off for such trials"), trial.number),)
        return self._verdict(trial, decision, label, source, found)

    def quick(self, trial: TrialView) -> Verdict | None:
        """The verdict when it needs neither the other trials nor the reference: answered from the log, not
        judged yet (before ``min_fraction``), between two judgements, diverged, or a trial that cannot be
        judged. None when a judgement is due (``judge`` then reads the others and the reference).

        With the view's ``reports`` given, this reads only the latest report and the log, so it costs the same
        at any curve length; an adapter may call it first and fetch a fresh view only when it returns None.
        """
        recalled = self.recall(trial)
        if recalled is not None:
            return Verdict(recalled.prune, recalled=recalled, reason=recalled.reason)
        early = self._early(trial)
        if early is _DUE:
            return None
        return self._verdict(trial, early, None, None, self.warnings_of(trial))  # type: ignore[arg-type]

    def _verdict(
        self, trial: TrialView, decision: Decision | None, label: str | None, source: int | str | None,
        found: tuple[JudgeWarning, ...],
    ) -> Verdict:
        if decision is None:  # between two judgements (judge_every): the last answer stands
            return Verdict(False, warnings=found)
        if not self.is_judgement(decision):
            return Verdict(decision.prune, decision, reason=decision.reason, warnings=found)
        entry = DecisionEntry.of(
            decision, step=int(trial.steps[-1]), n=len(trial.steps), reference=label, threshold_trial=source
        )
        late = self._late_reports(trial)
        if late:
            entry = _with_reason(
                entry, f"{entry.reason} ({late} report(s) arrived after a later step was judged; used now)"
            )
        return Verdict(decision.prune, decision, entry, reason=entry.reason, warnings=found)

    @staticmethod
    def warnings_of(trial: TrialView) -> tuple[JudgeWarning, ...]:
        """The study-level conditions visible at the trial's latest report (O(1): only that report is read).

        A progress key past its total (t̂ > 1: every later report is ignored, so pruning is off), and a trial
        that can never be judged (malformed or unknown controls, no total_tokens).
        """
        found: list[JudgeWarning] = []
        if trial.problem is not None or trial.controls is None:
            why = trial.problem or "its controls are unknown"
            found.append(JudgeWarning(UNJUDGEABLE_WARNING, (
                f"trial {trial.number} can never be judged ({why}); pruning is off for such trials"
            ), trial.number))
        elif len(trial.t_hat):
            t = float(trial.t_hat[-1])
            if math.isfinite(t) and t > T_HAT_END:
                found.append(JudgeWarning(PAST_END_WARNING, (
                    f"trial {trial.number} reported t_hat={t:.4g} > 1: its progress key runs past its total "
                    "(check time_attr, units and total: t_hat = progress / total); reports past "
                    "t_hat=1 are ignored, so pruning is effectively off"
                ), trial.number))
        return tuple(found)

    def _early(self, trial: TrialView) -> Decision | object | None:
        """The decision when no judgement is due (None between two judgements with nothing to say), else
        ``_DUE``."""
        if trial.problem is not None or trial.controls is None:
            return Decision(False, f"{trial.problem or 'controls unknown'}: kept", math.nan)
        s = self.settings
        reports = self._reports(trial)
        if not reports.diverged and reports.fraction < s.min_fraction:
            return not_judged_yet(reports.fraction, s, reports.notes)  # what decide would answer
        if reports.diverged or not math.isfinite(reports.fraction):
            # Nothing to predict: decide's own checks (divergence, nothing reported) give the answer.
            c = trial.controls
            return decide_cleaned(self._clean(trial), surrogate=None, competitors=(), schedule=c.schedule,
                                  tau=c.tau, tpp=c.tpp, settings=s)
        last = trial.log[-1] if trial.log else None
        if last is not None and self._bucket(reports.fraction) <= self._bucket(last.t_hat):
            if not reports.notes:
                return None
            # Not due, but something in the reports was ignored: say so (prune_reason only, no log entry).
            why = (
                f"not judged again until the next judge_every={self.judge_every:g} of training "
                f"({'; '.join(reports.notes)}); last decision: {last.reason}"
            )
            return Decision(False, why, math.nan)
        return _DUE

    def _reports(self, trial: TrialView) -> Reports:
        """The summary of the trial's cleaned reports: the adapter's (``TrialView.reports``), else
        ``_clean``'s."""
        return trial.reports if trial.reports is not None else self._clean(trial).summary

    def _clean(self, trial: TrialView) -> CleanReports:
        """The trial's reports cleaned (``reports.clean``), once per view: ``_early`` and ``_judgement`` share
        it, and ``decide_cleaned`` judges it without cleaning again."""
        last = self._cleaned
        if last is not None and last[0] is trial:
            return last[1]
        cleaned = clean(trial.t_hat, trial.loss)
        self._cleaned = (trial, cleaned)
        return cleaned

    def _judgement(
        self, trial: TrialView, others: OthersFn, reference: ReferenceFn
    ) -> tuple[Decision, str | None, int | str | None]:
        """A judgement that ``_early`` found due: the decision, the reference label, the threshold's trial."""
        controls = trial.controls
        assert controls is not None  # _early answered otherwise
        s = self.settings
        fraction = self._reports(trial).fraction
        surrogate, label = reference()
        if surrogate is None and s.comparison != "paired":
            return Decision(False, f"no reference yet ({label}): kept", fraction), None, None
        # Without a surrogate the paired rule still compares trials with equal controls (their loss ratio).
        if surrogate is not None and controls.tpp is None and surrogate.tpp_law != "constant":
            return Decision(False, _TPP_UNKNOWN, fraction), label, None
        competitors, numbers = self.competitors(trial, others())
        d = decide_cleaned(self._clean(trial), surrogate=surrogate, competitors=competitors,
                           schedule=controls.schedule, tau=controls.tau, tpp=controls.tpp, settings=s)
        source = None if d.threshold_index is None else numbers[d.threshold_index]
        return d, label, source

    def _bucket(self, fraction: float | None) -> int:
        """Index of the judgement interval holding t̂ = ``fraction`` (each report its own when 0)."""
        if fraction is None or not math.isfinite(fraction):
            return -1
        if self.judge_every == 0.0:
            return round(fraction * 1e12)
        return math.floor((fraction - self.settings.min_fraction) / self.judge_every + 1e-9)

    @staticmethod
    def _late_reports(trial: TrialView) -> int:
        """Reports at or below the last logged step that were not there when that step was judged."""
        if not trial.log:
            return 0
        last = trial.log[-1]
        now = int((np.asarray(trial.steps) <= last.step).sum())
        return max(0, now - (last.n or now))


def _with_reason(entry: DecisionEntry, reason: str) -> DecisionEntry:
    from dataclasses import replace

    return replace(entry, reason=reason)
