"""The one trial record: what collapse-hpo stores about a trial, under which names, and how it is read back.

Everything the pruner, the Ray scheduler's Optuna mirror, the dashboard and ``report`` persist on a trial is
named here, once:

- the run's controls (``CONTROL_ATTRS``: ``units``, what a reported step counts (``UNITS``: tokens seen,
  optimizer steps, or the fraction of training in millionths), ``total``, the training length in those units
  (t̂ = step / total), ``schedule`` as ``Schedule.to_dict()``, ``tau`` and ``tpp``) as a ``TrialControls``.
  Trials written before ``units`` existed hold ``total_tokens`` instead, read as ``units`` "tokens"; the
  sweep's own trials also keep ``total_tokens`` (the trainer's D, in tokens) beside the controls.
  "No weight decay" has one encoding at every boundary: ``tau``
  None (``None`` in Python, ``null`` in JSON and YAML); ``predictors.timescale.no_decay_tau`` turns the
  legacy encodings (``inf``, ``"inf"``) into None where old records are read. "TPP not defined" (e.g. a
  fine-tuning run) likewise has one: ``tpp`` None (``null``; empty in a curve CSV);
- the decision log (``DECISIONS_ATTR``: a list of ``DecisionEntry.to_dict()``, oldest first) and the five
  attrs that mirror its latest entry (``DECISION_ATTRS``);
- the pruner's sampler point (``SAMPLER_STEP_ATTR``), the online reference fit (``STUDY_REFERENCE_ATTR``)
  and the fixed reference surrogate the pruner judged with (``USED_REFERENCE_ATTR``);
- the trainer's outcome attrs (``tokens_trained``, ``final_loss``, ...).

Readers of a stored Optuna trial (``trial_points``, ``trial_curve``) live here too; they need only a
``FrozenTrial``-like object (``number``, ``user_attrs``, ``intermediate_values``), so this module imports
no Optuna. A step counts ``units``; t̂ = step / total.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from collapse_hpo.predictors.curves import Curve
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.misfit import misfit_note
from collapse_hpo.predictors.predict import Prediction
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.timescale import no_decay_tau

if TYPE_CHECKING:
    from collapse_hpo.hpo.rule.decision import Decision

# ---------------------------------------------------------------------------------------------- attr names
#: What a reported step counts: tokens seen, optimizer steps, or the fraction of training t̂ (which Optuna,
#: whose steps are integers, stores as round(t̂ · FRACTION_STEPS)).
UNITS = ("tokens", "steps", "fraction")
#: The ``total`` of a run counted in ``units`` "fraction": a step is t̂ in millionths of training.
FRACTION_STEPS = 1_000_000
#: Trial user attrs that carry a run's controls.
CONTROL_ATTRS = ("units", "total", "schedule", "tau", "tpp")
#: The attr older records (and the sweep trainer's config) hold the training tokens D in: read as ``total``
#: with ``units`` "tokens" where a trial has no ``total``.
TOTAL_TOKENS_ATTR = "total_tokens"
#: Every attr ``TrialControls.merged`` reads.
CONTROL_READ_ATTRS = (*CONTROL_ATTRS, TOTAL_TOKENS_ATTR)
#: The log of every judgement (a list of DecisionEntry dicts, oldest first).
DECISIONS_ATTR = "collapse_decisions"
#: The attrs that repeat the latest judgement (the dashboard shows them; ``report`` tabulates them).
DECISION_ATTRS = (
    "predicted_final_loss", "predicted_low", "predicted_high", "predicted_misfit", "decision_fraction",
    "prune_reason",
)
PRUNE_REASON_ATTR = "prune_reason"
#: With ``report_prediction``, the step (tokens) of the extra intermediate value holding a pruned trial's
#: predicted final loss; curve readers leave that point out.
SAMPLER_STEP_ATTR = "sampler_value_step"
#: Study user attr holding the latest online reference fit.
STUDY_REFERENCE_ATTR = "collapse_reference"
#: Study user attr (Optuna) and state-file key (Ray scheduler): the study-level warnings said so far, a
#: list of {key, message, trial} (hpo/rule/judge.py ``JudgeWarning``), one per key.
WARNINGS_ATTR = "collapse_warnings"
#: Study user attr holding a fixed reference surrogate the pruner judged with: ``{"label", "surrogate"}``
#: (the label is the decision logs' ``reference``).
USED_REFERENCE_ATTR = "collapse_reference_used"
#: The deviation alarm raised during training (hpo/integrations/alarm.py ``alarm_attrs``: t_hat, step, units,
#: value, reason), written once, when it fires.
ALARM_ATTR = "collapse_alarm"
#: Plain notes on a trial's controls (a list of lines), e.g. that its TPP is not defined and why that is so.
NOTES_ATTR = "collapse_notes"
#: Outcome attrs written by the sweep's trial function.
TOKENS_TRAINED_ATTR = "tokens_trained"
FINAL_LOSS_ATTR = "final_loss"
ERROR_ATTR = "error"
#: The Ray scheduler's mirror: the Tune trial id and config of a mirrored Optuna trial.
RAY_TRIAL_ATTR = "ray_trial_id"
RAY_CONFIG_ATTR = "ray_config"

#: A curve counts as complete (its final loss is known) from this t̂ on.
COMPLETE_T_HAT = 0.99


# ---------------------------------------------------------------------------------------------- controls
@dataclass(frozen=True)
class TrialControls:
    """The controls of one run that the surrogate needs (trusted: build it with ``check``).

    Attributes:
        total: the run's training length in ``units`` (t̂ = step / total); None when unknown. With ``units``
            "fraction" it is ``FRACTION_STEPS``.
        units: what a reported step counts, one of ``UNITS``: "tokens" (tokens seen), "steps" (optimizer
            steps) or "fraction" (t̂ · FRACTION_STEPS).
        schedule: LR schedule shape (peak 1).
        tau: AdamW timescale B/(ηλD); None = no weight decay.
        tpp: tokens per parameter D/N; None when not defined (e.g. fine-tuning, or a model that is no LLM;
            a surrogate with a TPP law cannot predict such a run).
    """

    total: float | None = None
    units: str = "tokens"
    schedule: Schedule = field(default_factory=Schedule)
    tau: float | None = None
    tpp: float | None = None

    @staticmethod
    def check(
        *, total: Any = None, units: Any = None, total_tokens: Any = None, schedule: Any = None,
        tau: Any = None, tpp: Any = None, where: str
    ) -> TrialControls:
        """Validated controls; raises InputError naming ``where`` and the field on a bad value.

        ``total`` is the training length in ``units`` (default "tokens"); ``total_tokens`` is the same with
        ``units`` "tokens" (give one of the two). ``units`` "fraction" needs no total (it is
        ``FRACTION_STEPS``). ``schedule`` may be a Schedule, a kind name or a dict; ``tau`` None (or a legacy
        ``inf``) means no weight decay.
        """
        u = check_units(units, where)
        if total_tokens is not None:
            if total is not None:
                raise InputError(f"{where}: give 'total' (in units) or 'total_tokens' (tokens), not both")
            if u != "tokens":
                raise InputError(f"{where}: 'total_tokens' counts tokens but units is {u!r}: give "
                                 f"total=<training length in {u}>")
            total = total_tokens
        name = "total_tokens" if total_tokens is not None else "total"
        tt = _positive(total, name, where)
        if u == "fraction":
            if tt is not None and tt != FRACTION_STEPS:
                raise InputError(f"{where}: with units 'fraction' a step is t_hat * {FRACTION_STEPS}, so "
                                 f"'total' is {FRACTION_STEPS} or not given, got {total!r}")
            tt = float(FRACTION_STEPS)
        try:
            sched = Schedule.parse(dict(schedule) if isinstance(schedule, Mapping) else schedule)
        except InputError as err:
            raise InputError(f"{where}: field 'schedule': {str(err).removeprefix('schedule: ')}") from None
        t = _positive(no_decay_tau(tau), "tau", where)
        tp = _positive(tpp, "tpp", where)
        return TrialControls(total=tt, units=u, schedule=sched, tau=t, tpp=tp)

    def merged(self, user_attrs: Mapping[str, Any], where: str) -> TrialControls:
        """These controls overridden by the ones present in a trial's ``user_attrs``.

        A trial with ``units`` or ``total`` gives its length with them; one with only ``total_tokens`` (older
        records, the sweep's trials) gives it in tokens. Raises InputError naming ``where`` and the attr when
        a present attr is malformed.
        """
        if not any(k in user_attrs for k in CONTROL_READ_ATTRS):
            return self
        if "units" in user_attrs or "total" in user_attrs:
            units = user_attrs.get("units", self.units)
            total = user_attrs.get("total", self.total if units == self.units else None)
            legacy = None
        elif TOTAL_TOKENS_ATTR in user_attrs:
            units, total, legacy = "tokens", None, user_attrs[TOTAL_TOKENS_ATTR]
        else:
            units, total, legacy = self.units, self.total, None
        return TrialControls.check(
            total=total, units=units, total_tokens=legacy,
            schedule=user_attrs.get("schedule", self.schedule),
            tau=user_attrs.get("tau", self.tau),
            tpp=user_attrs.get("tpp", self.tpp),
            where=where,
        )

    def attrs(self) -> dict[str, Any]:
        """The controls as trial user attrs (JSON values; ``tau`` None = no weight decay)."""
        return {"units": self.units, "total": self.total, "schedule": self.schedule.to_dict(),
                "tau": self.tau, "tpp": self.tpp}

    def describe_total(self) -> str:
        """The training length in words, e.g. "1,000 steps", "2e+09 tokens" or "t_hat (fraction)"."""
        if self.units == "fraction":
            return "t_hat (fraction of training)"
        if self.total is None:
            return f"unknown {self.units}"
        return f"{self.total:,.0f} {self.units}" if self.total < 1e7 else f"{self.total:.3g} {self.units}"


#: The note a run without a TPP gets (said, never guessed).
TPP_NOTE = (
    "tpp not given: this run's tokens per parameter is not defined (fine-tuning, or a model that is no LLM) "
    "and is not guessed; trials with equal controls are still compared by their loss ratio, which needs no "
    "TPP, and a reference surrogate must be calibrated on runs without a tpp (q(TPP) held constant): one "
    "with a TPP law cannot predict this run"
)


_ABSENT: Any = object()  # an attr a trial does not hold (None is a value: ``tau`` None is no weight decay)


class ControlsMemo:
    """``defaults.merged(attrs, where)``, parsed once per set of control attr objects.

    A judgement reads every trial's controls; parsing them (the schedule dict above all) at every one was a
    fifth of a replay's time. The result depends on the values of ``CONTROL_READ_ATTRS`` only (an absent
    attr is a value too: it takes the default), and a storage hands the same value objects back until an
    attr is written again (a write stores a new object), so the identities of the values, checked against
    the values kept in the entry (which keeps them alive), key it exactly. Errors are not memoized (they
    name ``where``). Shared by the pruner's views and the online reference's memo of trials.

    >>> memo = ControlsMemo(TrialControls(total=1000.0))
    >>> attrs = {"tau": 0.5}
    >>> memo.merged(attrs, "trial 0") is memo.merged(attrs, "trial 0")
    True
    """

    #: Entries kept before the table is emptied (a sweep's trials times their attr writes stay far below).
    LIMIT = 100_000

    def __init__(self, defaults: TrialControls) -> None:
        self.defaults = defaults
        self._table: dict[tuple[int, ...], tuple[tuple[Any, ...], TrialControls]] = {}

    def merged(self, attrs: Mapping[str, Any], where: str) -> TrialControls:
        """``self.defaults.merged(attrs, where)``; raises its InputError."""
        values = tuple(attrs.get(k, _ABSENT) for k in CONTROL_READ_ATTRS)
        key = tuple(map(id, values))
        hit = self._table.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], values)):
            return hit[1]
        controls = self.defaults.merged(attrs, where)
        if len(self._table) >= self.LIMIT:
            self._table.clear()
        self._table[key] = (values, controls)  # one dict store: atomic for an Optuna study's worker threads
        return controls


def controls_notes(controls: TrialControls) -> list[str]:
    """Plain notes on what the controls leave undefined (for the trial's ``collapse_notes`` and the log)."""
    return [TPP_NOTE] if controls.tpp is None else []


def check_units(units: Any, where: str) -> str:
    """``units`` validated (None = "tokens"); raises InputError naming ``where`` and the choices."""
    if units is None:
        return "tokens"
    if not isinstance(units, str) or units not in UNITS:
        raise InputError(f"{where}: field 'units' must be one of {', '.join(UNITS)}, got {units!r}")
    return units


def stored_total(user_attrs: Mapping[str, Any]) -> tuple[float | None, str]:
    """A stored trial's (training length, units): ``total`` in ``units``, else an older record's
    ``total_tokens`` in tokens; (None, units) when it has none or a malformed one (t̂ = step / total)."""
    try:
        c = TrialControls().merged(user_attrs, "trial")
    except InputError:
        return None, str(user_attrs.get("units") or "tokens")
    return c.total, c.units


def _positive(value: Any, name: str, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{where}: field {name!r} must be a positive number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise InputError(f"{where}: field {name!r} must be a positive finite number, got {value!r}")
    return v


def set_trial_controls(
    trial: Any,
    *,
    total: float | None = None,
    units: str = "tokens",
    total_tokens: float | None = None,
    schedule: Schedule | str | Mapping[str, Any] | None = None,
    tau: float | None = None,
    tpp: float | None = None,
) -> None:
    """Write a run's controls as trial user attrs for the CollapsePruner (call before the first report).

    Args:
        trial: the running Optuna trial (anything with ``number`` and ``set_user_attr``).
        total: the run's training length in ``units`` (t̂ = step / total): tokens of training, or the
            optimizer steps (e.g. Hugging Face ``max_steps``); not needed with ``units="fraction"``.
        units: what the steps given to ``trial.report`` count: "tokens", "steps" or "fraction" (then
            step = round(t̂ · ``FRACTION_STEPS``), Optuna's steps being integers).
        total_tokens: the same as ``total`` with ``units="tokens"`` (give one of the two).
        schedule: LR schedule shape (Schedule, kind name or dict; None = linear decay to zero).
        tau: AdamW timescale B/(ηλD) (counted in steps: 1/(η·λ·steps), ``predictors.timescale.step_tau``);
            None = no weight decay.
        tpp: tokens per parameter D/N; None = not defined (fine-tuning, or a model that is no LLM).

    Raises:
        InputError: on a bad value (nothing is written then).
    """
    controls = TrialControls.check(
        total=total, units=units, total_tokens=total_tokens, schedule=schedule, tau=tau, tpp=tpp,
        where=f"trial {trial.number} controls",
    )
    if controls.total is None:
        raise InputError(f"trial {trial.number} controls: give total (the training length in {units}) "
                         "or total_tokens")
    for key, value in controls.attrs().items():
        trial.set_user_attr(key, value)


# ---------------------------------------------------------------------------------------------- decisions
@dataclass(frozen=True)
class DecisionEntry:
    """One judgement of one trial: the one entry type of every decision log (pruner and scheduler alike).

    Attributes:
        step: the report step judged (tokens seen; a scheduler without tokens uses round(t̂ · its scale)).
        t_hat: fraction of training of the latest valid report used (None when unknown).
        n: reports stored up to and including ``step`` when it was judged.
        prune: whether the trial was stopped.
        predicted_final_loss, predicted_low, predicted_high: the prediction and the interval *shown* for it
            (losses; None without one): the learned interval when the curve collapses onto the reference
            shape, a wider one when it does not (``predictors.misfit.shown_interval``).
        threshold: what the trial was compared with (a loss), when a comparison was made.
        threshold_trial: the competitor the threshold came from (its Optuna trial number, or the Tune
            trial id when the scheduler has no mirror).
        reference: the label of the surrogate used (``file:...``, ``online:0,1,2``), None without one.
        reason: one line saying why (with ``misfit_note`` appended when the curve does not collapse).
        misfit: the prediction's alignment residual over the reference's (``Prediction.misfit``); above
            ``predictors.misfit.MISFIT_LIMIT`` the curve does not collapse. None when unknown.
        rule_low, rule_high: the interval the decision rule used (the learned error band; equal to the shown
            one when the curve collapses). Competitors read these, so the shown interval never moves a
            decision. Entries written before they existed read them from ``predicted_low/high``.
    """

    step: int
    t_hat: float | None
    n: int
    prune: bool
    predicted_final_loss: float | None
    predicted_low: float | None
    predicted_high: float | None
    threshold: float | None
    threshold_trial: int | str | None
    reference: str | None
    reason: str
    misfit: float | None = None
    rule_low: float | None = None
    rule_high: float | None = None

    @classmethod
    def of(
        cls,
        decision: Decision,
        *,
        step: int,
        n: int,
        reference: str | None,
        threshold_trial: int | str | None,
    ) -> DecisionEntry:
        """The entry of a ``Decision`` judged at ``step`` with ``n`` reports stored."""
        attrs = decision.user_attrs()
        p = decision.prediction
        low, high = attrs["predicted_low"], attrs["predicted_high"]
        misfit = None
        reason = decision.reason
        if p is not None and p.ok:
            misfit = _finite_or_none(p.misfit)
            if not p.collapses or p.high_at_current:  # the shown interval differs from the rule's
                low, high = (_finite_or_none(v) for v in p.shown)
            if not p.collapses:
                reason = f"{reason}; {misfit_note(float(p.misfit), p.fraction)}"  # type: ignore[arg-type]
        return cls(
            step=int(step), t_hat=attrs["decision_fraction"], n=int(n), prune=bool(decision.prune),
            predicted_final_loss=attrs["predicted_final_loss"], predicted_low=low, predicted_high=high,
            threshold=decision.threshold, threshold_trial=threshold_trial, reference=reference, reason=reason,
            misfit=misfit, rule_low=attrs["predicted_low"], rule_high=attrs["predicted_high"],
        )

    def to_dict(self) -> dict[str, Any]:
        """The entry as stored (JSON values; key order fixed)."""
        return {
            "step": self.step, "t_hat": self.t_hat, "n": self.n, "prune": self.prune,
            "predicted_final_loss": self.predicted_final_loss, "predicted_low": self.predicted_low,
            "predicted_high": self.predicted_high, "threshold": self.threshold,
            "threshold_trial": self.threshold_trial, "reference": self.reference, "reason": self.reason,
            "misfit": self.misfit, "rule_low": self.rule_low, "rule_high": self.rule_high,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DecisionEntry:
        """An entry read back from storage (missing keys are None; a malformed one raises InputError)."""
        if not isinstance(d, Mapping) or not isinstance(d.get("step"), int | float):
            raise InputError(f"decision log: malformed entry {d!r}")

        def num(key: str) -> float | None:
            v = d.get(key)
            return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

        return cls(
            step=int(d["step"]), t_hat=num("t_hat"), n=int(d.get("n") or 0), prune=bool(d.get("prune")),
            predicted_final_loss=num("predicted_final_loss"), predicted_low=num("predicted_low"),
            predicted_high=num("predicted_high"), threshold=num("threshold"),
            threshold_trial=d.get("threshold_trial"), reference=d.get("reference"),
            reason=str(d.get("reason") or ""), misfit=num("misfit"),
            rule_low=num("rule_low") if "rule_low" in d else num("predicted_low"),
            rule_high=num("rule_high") if "rule_high" in d else num("predicted_high"),
        )

    def latest_attrs(self) -> dict[str, Any]:
        """The ``DECISION_ATTRS`` this entry sets; the prediction keys only when it has a prediction (a trial
        keeps showing its latest successful prediction). Bounds and misfit come before the point prediction,
        so a reader between two writes never pairs a new ``predicted_final_loss`` with a stale bound."""
        attrs: dict[str, Any] = {}
        if self.predicted_final_loss is not None:
            attrs["predicted_misfit"] = self.misfit
            attrs["predicted_high"] = self.predicted_high
            attrs["predicted_low"] = self.predicted_low
            attrs["predicted_final_loss"] = self.predicted_final_loss
        attrs["decision_fraction"] = self.t_hat
        attrs[PRUNE_REASON_ATTR] = self.reason
        return attrs

    def prediction(self) -> Prediction | None:
        """The entry's prediction as a ``Prediction`` with the interval the decision rule used (``rule_low``,
        ``rule_high``), so a competitor's logged prediction counts as it did before any widening (None when
        it has none)."""
        pred = self.predicted_final_loss
        if pred is None or not math.isfinite(pred):
            return None
        return Prediction(final_loss=pred, low=self.rule_low, high=self.rule_high,
                          fraction=self.t_hat if self.t_hat is not None else 0.0, misfit=self.misfit)


def _finite_or_none(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def read_log(
    user_attrs: Mapping[str, Any], memo: dict[int, tuple[Any, DecisionEntry | None]] | None = None
) -> list[DecisionEntry]:
    """A trial's decision log (oldest first; empty when never judged); malformed entries are skipped.

    ``memo`` (optional, the caller's): entries already read, by the identity of their stored dict (kept
    alive in the memo). A storage hands the same dict objects back while a log grows by appending (in
    memory, the journal), so each entry is parsed once; the stored dicts are never changed in place.
    """
    out: list[DecisionEntry] = []
    for d in user_attrs.get(DECISIONS_ATTR) or []:
        if memo is not None:
            hit = memo.get(id(d))
            if hit is not None and hit[0] is d:
                if hit[1] is not None:
                    out.append(hit[1])
                continue
        try:
            entry: DecisionEntry | None = DecisionEntry.from_dict(d)
        except InputError:
            entry = None
        if memo is not None:
            memo[id(d)] = (d, entry)
        if entry is not None:
            out.append(entry)
    return out


def latest_prediction(log: list[DecisionEntry]) -> Prediction | None:
    """The latest successful prediction of a decision log (one attr, written atomically: the five separate
    attrs can be caught half-updated by another worker), or None."""
    for entry in reversed(log):
        p = entry.prediction()
        if p is not None:
            return p
    return None


def sampler_value(entry: DecisionEntry, total: float | None) -> tuple[int, float] | None:
    """``report_prediction``: the (step, value) that makes a pruned trial's value its predicted final loss:
    the prediction at the final step round(total) (in the trial's units). None when there is no prediction,
    no known final step, or the trial was judged at its final step already."""
    if entry.predicted_final_loss is None or total is None:
        return None
    final_step = round(total)
    if final_step <= entry.step:
        return None
    return final_step, float(entry.predicted_final_loss)


# ---------------------------------------------------------------------------------------------- curves
def trial_points(trial: Any) -> tuple[np.ndarray, np.ndarray]:
    """A trial's reported (step, loss) pairs sorted by step, without the pruner's sampler point (if any).

    Steps count the trial's ``units``. Values may be NaN or inf (diverged runs): callers decide what that
    means. Read by every judgement for each trial version it has not seen (the pruner's views, the online
    reference's curves), so built without a Python tuple per report: Optuna's steps are distinct integers,
    so the order by step alone is the order by (step, value), and reports come in step order in most trials
    (then no sort is made).
    """
    values = trial.intermediate_values
    skip = trial.user_attrs.get(SAMPLER_STEP_ATTR)
    if skip is not None and skip in values:
        values = {s: v for s, v in values.items() if s != skip}
    n = len(values)
    if not n:
        return np.zeros(0), np.zeros(0)
    steps = np.fromiter(map(int, values), dtype=float, count=n)
    losses = np.fromiter(map(float, values.values()), dtype=float, count=n)
    if n > 1 and not bool((steps[1:] > steps[:-1]).all()):
        order = np.argsort(steps, kind="stable")
        steps, losses = steps[order], losses[order]
    return steps, losses


def trial_curve(trial: Any, defaults: TrialControls) -> Curve | None:
    """The trial's curve as a predictors ``Curve`` (t̂ = step / total), or None without a total.

    Raises InputError when the trial's control attrs are malformed.
    """
    return curve_of(trial, defaults.merged(trial.user_attrs, f"trial {trial.number}"))


def curve_of(trial: Any, controls: TrialControls) -> Curve | None:
    """``trial_curve`` with the trial's controls already read (``controls``), or None without a total."""
    if controls.total is None:
        return None
    steps, values = trial_points(trial)
    return Curve(
        run=f"trial{trial.number}",
        t_hat=steps / controls.total,
        loss=values,
        schedule=controls.schedule,
        tau=controls.tau,
        tpp=controls.tpp,
        meta={"trial": trial.number},
    )
