"""The Optuna pruner that stops trials whose predicted final loss will not win (collapse early-align).

``CollapsePruner`` is the only class here; ``set_trial_controls`` and ``trial_decisions`` are its
helpers. The decision rule itself lives in hpo/decision.py (shared with the Ray Tune scheduler), the
reference surrogate in hpo/reference.py.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.pruners import BasePruner
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from collapse_hpo.hpo.decision import DEFAULT_MARGIN, Competitor, Decision, PruneSettings, decide
from collapse_hpo.hpo.reference import (
    SAMPLER_STEP_ATTR,
    Reference,
    TrialControls,
    make_reference,
    trial_curve,
    trial_points,
)
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.predict import Prediction
from collapse_hpo.predictors.schedules import Schedule

# The user attrs the pruner writes (the dashboard shows them; other workers read them).
DECISION_ATTRS = (
    "predicted_final_loss", "predicted_low", "predicted_high", "decision_fraction", "prune_reason",
)
# The log of every judgement made from min_fraction on (and every prune): one dict per decision step.
DECISIONS_ATTR = "collapse_decisions"


class CollapsePruner(BasePruner):
    """Prune trials whose final loss, predicted from the early part of the curve, will not be among the best.

    From ``min_fraction`` of training on, each ``trial.should_prune()`` predicts the trial's final loss
    with an interval [low, high] at ``confidence`` by aligning the curve so far onto the reference
    surrogate's collapsed curve (hpo/decision.py, predictors/predict.py). It is compared with the other
    trials that can still finish: completed and running ones (pruned trials never finish, so they do not
    compete). With ``comparison="paired"`` (the default) both trials' predictions are made from their curves
    up to the same fraction, so the reference's bias, shared by the sweep, cancels; the margin is the
    surrogate's learned paired error (``pair_bands``). With ``"interval"`` the trial's optimistic bound
    ``low`` is compared with each competitor's pessimistic final loss (a completed trial's value, a running
    trial's predicted ``high``). Either way the trial is pruned when ``keep_top_k`` competitors are
    confidently going to end better. A NaN, inf or non-positive loss prunes at once. The study must
    minimize the loss.

    Step convention: the objective reports ``trial.report(loss, step=tokens_seen)`` (tokens, not
    optimizer steps); t̂ = tokens_seen / total_tokens. The run's controls come from the trial's user
    attrs ``total_tokens``, ``schedule`` (dict or kind name), ``tau`` and ``tpp`` (write them with
    ``set_trial_controls``), else from this pruner's defaults (a plain objective where every trial
    shares them).

    State: everything lives in the study's storage, never only in this object (Optuna does not persist
    pruners), so several workers and a restarted driver see the same state. Each trial gets the user
    attrs ``predicted_final_loss``, ``predicted_low``, ``predicted_high`` (losses of the latest
    successful prediction; a pruned trial keeps its predicted final loss), ``decision_fraction`` (t̂ of
    the latest decision), ``prune_reason`` (one line: why pruned, kept or not judged), and
    ``collapse_decisions``: the log of judgements, one dict per step (keys ``step`` (tokens), ``t_hat``,
    ``n`` (points used), ``prune``, ``predicted_final_loss``, ``predicted_low``, ``predicted_high``,
    ``threshold`` (the competitor bound compared with), ``threshold_trial`` (whose it was),
    ``reference`` (the surrogate's label), ``reason``). A decision at a step is made once: asking again
    at that step returns the logged answer, and a pruned trial stays pruned. The curve a decision used
    is the stored one (steps ≤ ``step``). Judgements happen at most once per ``judge_every`` of
    training.

    Robustness: NaN/inf/non-positive losses prune with the reason; reports past t̂ = 1 are ignored
    (said in the reason); repeated steps are ignored by Optuna (first value kept); reports that arrive
    out of order are used from the next decision on (the reason counts them); missing controls or a
    malformed attr keep the trial, with the reason. No curve makes ``prune`` raise.

    Giving the prediction to the sampler (``report_prediction``): Optuna gives a pruned trial the value of its
    last intermediate value, and TPE ranks pruned trials after every completed trial, by (latest step, then
    that value): a trial pruned early ranks below one pruned late, whatever its loss would have been. With
    ``report_prediction=True``, on pruning the pruner also writes the predicted final loss as an intermediate
    value at step ``total_tokens`` (recorded in user attr ``sampler_value_step``): the pruned trial's value
    becomes its predicted final loss and TPE ranks pruned trials among themselves by that prediction. The
    trial stays PRUNED, so it never counts as a completed result (``study.best_trial`` ignores it). Trade-off:
    the stored curve gains a point the run never reached (readers in hpo/reference.py skip it; plots must
    too), and a bad prediction now steers the sampler. Off by default. The objective must raise
    ``optuna.TrialPruned`` right after ``should_prune()`` returns True (as usual).

    Example:

        .. code-block:: python

            import math

            import optuna

            from collapse_hpo.hpo.pruner import CollapsePruner
            from collapse_hpo.predictors.schedules import Schedule
            from collapse_hpo.predictors.surrogate import ErrorBand, Surrogate

            # A calibrated surrogate; normally Surrogate.load(PATH) of `collapse-hpo calibrate`'s JSON.
            surrogate = Surrogate(b_c=0.5, b_e=0.3, q_c=1.0, q_e=0.1, error_bands=[
                ErrorBand(fraction=0.1, n=20, bias=0.0, scale=0.01, max_abs=0.03)])
            total_tokens, schedule, tau, tpp = 1_000_000, Schedule(), 0.1, 20.0


            def objective(trial):
                lr = trial.suggest_float("lr", 1e-3, 1e-1, log=True)
                final = 3.0 + (math.log10(lr) + 2.0) ** 2  # stands in for training: best lr is 1e-2
                for tokens in range(total_tokens // 50, total_tokens + 1, total_tokens // 50):
                    shape = surrogate.normalized(tokens / total_tokens, schedule, tau, tpp)[0]
                    loss = final * float(shape)
                    trial.report(loss, step=tokens)  # step = tokens seen
                    if trial.should_prune():
                        raise optuna.TrialPruned()
                return loss


            pruner = CollapsePruner(
                reference=surrogate, total_tokens=total_tokens, schedule=schedule, tau=tau, tpp=tpp
            )
            study = optuna.create_study(pruner=pruner, sampler=optuna.samplers.RandomSampler(seed=0))
            study.optimize(objective, n_trials=12)
            pruned = study.get_trials(states=[optuna.trial.TrialState.PRUNED])
            print(len(pruned), "pruned; e.g.", pruned[0].user_attrs["prune_reason"])

    Args:
        reference: the reference surrogate: a ``Surrogate``, a surrogate JSON path, ``"online"``, a reference
            object from hpo/reference.py, or a mapping spec (see ``make_reference``).
        min_fraction: t̂ before which no trial is judged, in (0, 1).
        confidence: confidence of the predicted interval, in (0, 1).
        keep_top_k: never prune a trial that could still be among the ``keep_top_k`` best (integer ≥ 1).
        comparison: "paired" (default) or "interval" (see above and hpo/decision.py).
        margin: log-ratio by which a competitor must lead at a common fraction to beat a trial (0.04 = 4%;
            see ``PruneSettings.margin``), in [0, 1).
        total_tokens: default training tokens per trial (positive), for trials without that attr.
        schedule: default LR schedule (a ``Schedule``, kind name or dict; None = linear decay to zero).
        tau: default AdamW timescale (positive; None = no weight decay).
        tpp: default tokens per parameter (positive).
        report_prediction: on pruning, report the predicted final loss as the final-step intermediate value,
            so the sampler ranks pruned trials by it (see above).
        judge_every: judge at most once per this fraction of training (the first judgement at
            ``min_fraction``, the next when t̂ enters the next interval); 0 = at every report. Between
            judgements ``should_prune()`` answers the last decision (False) and writes nothing; NaN/inf
            checks still run at every report. Bounds the storage writes and the decision log's length
            when a trainer reports often.

    Raises:
        InputError: on a bad argument (the message names it).
    """

    def __init__(
        self,
        *,
        reference: Any,
        min_fraction: float = 0.1,
        confidence: float = 0.9,
        keep_top_k: int = 1,
        comparison: str = "paired",
        margin: float = DEFAULT_MARGIN,
        total_tokens: float | None = None,
        schedule: Schedule | str | Mapping[str, Any] | None = None,
        tau: float | None = None,
        tpp: float | None = None,
        report_prediction: bool = False,
        judge_every: float = 0.02,
    ) -> None:
        self._settings = PruneSettings(
            min_fraction=min_fraction, confidence=confidence, keep_top_k=keep_top_k, comparison=comparison,
            margin=margin,
        )
        self._defaults = TrialControls.check(
            total_tokens=total_tokens,
            schedule=dict(schedule) if isinstance(schedule, Mapping) else schedule,
            tau=tau,
            tpp=tpp,
            where="CollapsePruner",
        )
        if not isinstance(report_prediction, bool):
            raise InputError(
                f"CollapsePruner: 'report_prediction' must be true or false, got {report_prediction!r}"
            )
        self._report_prediction = report_prediction
        if (
            isinstance(judge_every, bool)
            or not isinstance(judge_every, int | float)
            or not 0.0 <= judge_every < 1.0
        ):
            raise InputError(
                f"CollapsePruner: 'judge_every' must be a fraction of training in [0, 1), got {judge_every!r}"
            )
        self._judge_every = float(judge_every)
        self._reference: Reference = make_reference(reference)
        self._lock = threading.Lock()

    # The keyword arguments, for from_config and error messages.
    _OPTIONS = (
        "reference", "min_fraction", "confidence", "keep_top_k", "comparison", "margin",
        "total_tokens", "schedule", "tau", "tpp", "report_prediction", "judge_every",
    )

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, where: str = "pruner") -> CollapsePruner:
        """A pruner from a mapping (e.g. the ``pruner`` section of a sweep YAML).

        Unknown keys raise InputError naming ``where`` and the key; values are validated as in ``__init__``.
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
        return self._settings

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
        storage = study._storage
        stored = storage.get_trial(trial._trial_id)
        steps, values = trial_points(stored)
        if steps.size == 0:
            return False
        step = int(steps[-1])
        log: list[dict[str, Any]] = list(stored.user_attrs.get(DECISIONS_ATTR) or [])

        for entry in log:
            if entry.get("prune"):
                self._write_latest(study, stored, entry)
                return True
        for entry in reversed(log):
            if entry.get("step") == step:
                self._write_latest(study, stored, entry)
                return bool(entry.get("prune"))

        decision, label, source = self._judge(study, stored, steps, values, log[-1] if log else None)
        if decision is None:  # between two judgements (judge_every): the last answer stands
            return False
        judged = decision.prune or (
            math.isfinite(decision.fraction) and decision.fraction >= self._settings.min_fraction
        )
        if judged:
            entry = _entry(step, int(steps.size), decision, label, source)
            late = _late_reports(log, steps)
            if late:
                entry["reason"] += f" ({late} report(s) arrived after a later step was judged; used now)"
            if stored.state == TrialState.RUNNING:
                storage.set_trial_user_attr(stored._trial_id, DECISIONS_ATTR, [*log, entry])
                self._write_latest(study, stored, entry)
                if decision.prune and self._report_prediction:
                    self._report_to_sampler(study, stored, step, decision)
        elif stored.state == TrialState.RUNNING and stored.user_attrs.get("prune_reason") != decision.reason:
            storage.set_trial_user_attr(stored._trial_id, "prune_reason", decision.reason)
        return decision.prune

    # ------------------------------------------------------------------ internals
    def _judge(
        self,
        study: optuna.study.Study,
        trial: FrozenTrial,
        steps: Any,
        values: Any,
        last: Mapping[str, Any] | None,
    ) -> tuple[Decision | None, str | None, int | None]:
        """The decision at the latest step, the reference label and the trial the threshold came from.

        The decision is None when no judgement is due (judge_every).
        """
        try:
            controls = self._defaults.merged(trial.user_attrs, f"trial {trial.number} user attrs")
        except InputError as err:
            return Decision(False, f"{err}: kept", math.nan), None, None
        if controls.total_tokens is None:
            return Decision(
                False,
                "total_tokens unknown: call set_trial_controls(trial, total_tokens=...) or give "
                "CollapsePruner(total_tokens=...); kept",
                math.nan,
            ), None, None
        t_hat = steps / controls.total_tokens
        common: dict[str, Any] = {
            "schedule": controls.schedule,
            "tau": controls.tau,
            "tpp": controls.tpp,
            "settings": self._settings,
        }
        first = decide(t_hat, values, surrogate=None, competitors=(), **common)
        if first.prune or not math.isfinite(first.fraction) or first.fraction < self._settings.min_fraction:
            return first, None, None
        if last is not None and self._bucket(first.fraction) <= self._bucket(last.get("t_hat")):
            if not first.notes:
                return None, None, None
            # Not due, but something in the reports was ignored: say so (prune_reason only, no log entry).
            why = (
                f"not judged again until the next judge_every={self._judge_every:g} of training "
                f"({'; '.join(first.notes)}); last decision: {last.get('reason')}"
            )
            return Decision(False, why, math.nan), None, None
        trials = study.get_trials(deepcopy=False)
        with self._lock:
            surrogate, label = self._reference.get(study, self._defaults, trials)
        if surrogate is None and self._settings.comparison != "paired":
            return Decision(False, f"no reference yet ({label}): kept", first.fraction), None, None
        if surrogate is not None and controls.tpp is None and surrogate.tpp_law != "constant":
            return Decision(
                False,
                "tpp unknown: call set_trial_controls(trial, tpp=...) or give CollapsePruner(tpp=...); kept",
                first.fraction,
            ), label, None
        competitors, numbers = _competitors(trials, trial.number, self._defaults)
        decision = decide(t_hat, values, surrogate=surrogate, competitors=competitors, **common)
        source = None if decision.threshold_index is None else numbers[decision.threshold_index]
        return decision, label, source

    def _bucket(self, fraction: Any) -> int:
        """Index of the judgement interval holding t̂ = ``fraction`` (each report its own when 0)."""
        if not isinstance(fraction, int | float) or not math.isfinite(fraction):
            return -1
        if self._judge_every == 0.0:
            return round(fraction * 1e12)
        return math.floor((fraction - self._settings.min_fraction) / self._judge_every + 1e-9)

    def _write_latest(self, study: optuna.study.Study, trial: FrozenTrial, entry: Mapping[str, Any]) -> None:
        """Make the five decision attrs match a log entry (prediction attrs only when it has a prediction)."""
        if trial.state != TrialState.RUNNING:
            return
        attrs: dict[str, Any] = {}
        if entry.get("predicted_final_loss") is not None:
            # Bounds before the point prediction: a reader between two writes never pairs a new
            # predicted_final_loss with a missing or stale predicted_high.
            for key in ("predicted_high", "predicted_low", "predicted_final_loss"):
                attrs[key] = entry.get(key)
        attrs["decision_fraction"] = entry.get("t_hat")
        attrs["prune_reason"] = entry.get("reason")
        for key, value in attrs.items():
            if trial.user_attrs.get(key, object()) != value:
                study._storage.set_trial_user_attr(trial._trial_id, key, value)

    def _report_to_sampler(
        self, study: optuna.study.Study, trial: FrozenTrial, step: int, decision: Decision
    ) -> None:
        p = decision.prediction
        controls = self._defaults.merged(trial.user_attrs, f"trial {trial.number} user attrs")
        if p is None or not p.ok or controls.total_tokens is None:
            return
        final_step = round(controls.total_tokens)
        if final_step <= step or final_step in trial.intermediate_values:
            return
        study._storage.set_trial_user_attr(trial._trial_id, SAMPLER_STEP_ATTR, final_step)
        study._storage.set_trial_intermediate_value(trial._trial_id, final_step, float(p.final_loss))


def _entry(step: int, n: int, decision: Decision, label: str | None, source: int | None) -> dict[str, Any]:
    attrs = decision.user_attrs()
    return {
        "step": step,
        "t_hat": attrs["decision_fraction"],
        "n": n,
        "prune": bool(decision.prune),
        "predicted_final_loss": attrs["predicted_final_loss"],
        "predicted_low": attrs["predicted_low"],
        "predicted_high": attrs["predicted_high"],
        "threshold": decision.threshold,
        "threshold_trial": source,
        "reference": label,
        "reason": decision.reason,
    }


def _late_reports(log: list[dict[str, Any]], steps: Any) -> int:
    """Reports at or below the last logged step that were not there when that step was judged."""
    if not log:
        return 0
    last = log[-1]
    now = int((steps <= last["step"]).sum())
    return max(0, now - int(last.get("n", now)))


def _competitors(
    trials: list[FrozenTrial], number: int, defaults: TrialControls
) -> tuple[list[Competitor], list[int]]:
    """The other trials that compete: completed ones (final loss) and running ones (curve, latest prediction).

    Each comes with its curve and controls, for the paired comparison (hpo/decision.py). Pruned trials do not
    compete: a pruned trial will never finish, so its (possibly stale, or pre-divergence) prediction must not
    prune anybody. With them counted, a replayed sweep could prune every trial and keep no result. Returns
    the competitors and, in the same order, their trial numbers.
    """
    out: list[Competitor] = []
    numbers: list[int] = []
    for t in trials:
        if t.number == number:
            continue
        final: float | None = None
        latest: Prediction | None = None
        if t.state == TrialState.COMPLETE and t.user_attrs.get(SAMPLER_STEP_ATTR) is None:
            if t.value is None or not math.isfinite(t.value):
                continue
            final = float(t.value)
        elif t.state == TrialState.RUNNING:
            # A running trial competes through its curve (paired at a common fraction) even before it has a
            # prediction of its own: with equal controls no prediction is needed.
            latest = _latest_prediction(t)
        else:
            continue
        out.append(_with_curve(t, defaults, final, latest))
        numbers.append(t.number)
    return out, numbers


def _latest_prediction(t: FrozenTrial) -> Prediction | None:
    """A running trial's latest prediction, read from its decision log (one attr, so written atomically:
    the five separate attrs can be caught half-updated by another worker)."""
    source: Mapping[str, Any] = t.user_attrs
    for entry in reversed(t.user_attrs.get(DECISIONS_ATTR) or []):
        if isinstance(entry, Mapping) and entry.get("predicted_final_loss") is not None:
            source = entry
            break
    pred = source.get("predicted_final_loss")
    if not isinstance(pred, int | float) or not math.isfinite(pred):
        return None
    low, high = source.get("predicted_low"), source.get("predicted_high")
    fraction = source.get("t_hat", source.get("decision_fraction"))
    return Prediction(
        final_loss=float(pred),
        low=float(low) if isinstance(low, int | float) else None,
        high=float(high) if isinstance(high, int | float) else None,
        fraction=float(fraction) if isinstance(fraction, int | float) else 0.0,
    )


def _with_curve(
    t: FrozenTrial, defaults: TrialControls, final: float | None, latest: Prediction | None
) -> Competitor:
    """The competitor with its curve and controls (``trial_curve``); without them when they are unknown."""
    try:
        curve = trial_curve(t, defaults)
    except InputError:
        curve = None
    if curve is None:
        return Competitor(final_loss=final, latest=latest)
    return Competitor.from_reports(
        curve.t_hat, curve.loss, final_loss=final, latest=latest, schedule=curve.schedule, tau=curve.tau,
        tpp=None if math.isnan(curve.tpp) else curve.tpp,
    )


def set_trial_controls(
    trial: optuna.trial.Trial,
    *,
    total_tokens: float,
    schedule: Schedule | str | Mapping[str, Any] | None = None,
    tau: float | None = None,
    tpp: float | None = None,
) -> None:
    """Write a run's controls as trial user attrs for the CollapsePruner (call before the first report).

    Args:
        trial: the running Optuna trial.
        total_tokens: training tokens of the run (t̂ = step / total_tokens; report steps in tokens).
        schedule: LR schedule shape (Schedule, kind name or dict; None = linear decay to zero).
        tau: AdamW timescale B/(ηλD); None = no weight decay.
        tpp: tokens per parameter D/N.

    Raises:
        InputError: on a bad value (nothing is written then).
    """
    controls = TrialControls.check(
        total_tokens=total_tokens,
        schedule=dict(schedule) if isinstance(schedule, Mapping) else schedule,
        tau=tau,
        tpp=tpp,
        where=f"trial {trial.number} controls",
    )
    trial.set_user_attr("total_tokens", controls.total_tokens)
    trial.set_user_attr("schedule", controls.schedule.to_dict())
    trial.set_user_attr("tau", controls.tau)
    trial.set_user_attr("tpp", controls.tpp)


def trial_decisions(trial: FrozenTrial) -> list[dict[str, Any]]:
    """The CollapsePruner's decision log of a trial (oldest first; empty when never judged)."""
    return list(trial.user_attrs.get(DECISIONS_ATTR) or [])
