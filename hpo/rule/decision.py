"""The pruning decision rule shared by the Optuna pruner and the Ray Tune scheduler, told once: here.

This docstring is the rule's one description. ``CollapsePruner`` (hpo/optuna_side/pruner.py),
``CollapseScheduler`` (hpo/ray_side/scheduler.py), the judge around the rule (hpo/rule/judge.py: which
reports count, when a judgement is due, who competes) and README.md summarize it and point here. METHOD.md
has the formulas and their sources; each constant below says how its value was chosen (BENCHMARKS.md).

Stable signature (keep it; callers in hpo/optuna_side/pruner.py and hpo/ray_side/scheduler.py depend on it)::

    decide(t_hat, loss, *, surrogate, schedule, tau, tpp, competitors, settings) -> Decision

    t_hat:       1-D sequence of training fractions (tokens seen / total_tokens) of the trial's reports.
    loss:        1-D sequence of training losses at those fractions (same length). NaN or inf means the
                 loss diverged (the trial is pruned at once); a caller with a *missing* loss drops that point.
    surrogate:   a calibrated ``predictors.surrogate.Surrogate``, or None when no reference is available yet
                 (then only the non-finite / invalid-loss checks can prune).
    schedule:    ``predictors.schedules.Schedule`` of the trial (peak 1).
    tau:         AdamW timescale B/(ηλD) of the trial; None = no weight decay.
    tpp:         tokens per parameter D/N of the trial; None = not defined (e.g. fine-tuning).
    competitors: the other trials: a float is a completed trial's final loss; a ``Prediction`` is another
                 trial's prediction (its ``high``, the pessimistic bound, is what counts); a ``Competitor``
                 also carries the trial's curve and controls, for the paired comparison.
    settings:    ``PruneSettings``.

The rule, in words: below ``min_fraction`` of training nothing is judged. From then on the trial's final
loss is predicted with an interval [low, high] at ``confidence`` (``predict_final_loss``). Each
competitor contributes a pessimistic final loss (a completed trial: its final loss; a running one: its
predicted ``high``; pruned trials do not compete, since they will never finish). The trial is pruned
when its *optimistic* bound ``low`` is worse (larger)
than the ``keep_top_k``-th best pessimistic competitor: then at least ``keep_top_k`` other trials are,
with the stated confidence, going to end better, and this one cannot be among the best ``keep_top_k``.
With a surrogate, a trial whose final loss cannot be predicted (for example fewer than 3 reports in the
alignment window [t̂/2, t̂]: with a loss every 5% of training, before t̂ 0.2) is kept, whatever the loss
ratios below would say: a prune always carries its prediction (BENCHMARKS §20 measured judging such trials
earlier).

The paired comparison (``comparison="paired"``, the default) compares two trials' predictions *made at
the same fraction*: the reference's error is mostly a bias shared by every trial of a sweep (a size or data
mismatch), and it cancels in the ratio of two predictions. For a competitor with logged predictions
(``Competitor.history``) the latest one at or before this trial's fraction p is taken, at fraction f, and
this trial's prediction at f is made from its curve up to f. The competitor beats the trial when
log(pred_trial(f) / pred_competitor(f)) > h = t · scale_pair(f) · √(1 + 1/n) (the surrogate's ``pair_bands``:
the learned error of a predicted ratio; t the Student-t quantile at ``confidence``, as for the interval).
Each competitor's bar, in the trial's predicted final-loss units, is pred_trial(p) · pred_competitor(f) /
pred_trial(f) · e^h;
the trial is pruned when its prediction exceeds the ``keep_top_k``-th lowest bar. A competitor without a
curve (a float, a Prediction), or a surrogate without ``pair_bands``, is compared unpaired
as above, translated to a bar the same way (bar = pessimistic · pred/low); when no competitor can be
paired the decision is the interval rule's, with a note saying why.

Two trials with *equal controls* (schedule, τ, TPP: every trial of a τ-held sweep) lie on one normalized
curve, so their loss ratio at a common fraction f, averaged over the window [f/2, f], is the ratio of their
final losses up to how far the curves still cross: they are compared by it with ``margin`` as the whole
margin, no reference needed. But only from the *collapse onset* t̂ = τ (``collapse_onset``; AdamW's timescale
as a fraction of training, at most ``ONSET_CAP``; none without weight decay), and the window starts there:
before it the weights still hold the initialization and a larger LR leads runs that end better (METHOD.md
§4–5; BENCHMARKS §19), so before the onset such a pair does not compete at all.

During a trial's first judgements (its t̂ ≤ ``EARLY_JUDGEMENT`` × ``min_fraction``) every competitor with
*other* controls that has reached ``min_fraction`` is compared by the loss ratio at the common fraction,
with ``margin`` as the whole margin: early in a random search the eventual best is close to the leader,
later the curves of different controls cross by far more than any affordable margin (BENCHMARKS §13). A
trial that runs ahead of its competitors is compared at their latest fraction f (the common one), and with a
surrogate the comparison is moved by what the trial showed since: how far its predicted final loss moved from
f to its own fraction, less the mean move of the trials that reached its fraction (the collapse shape's own
error between the two fractions, which the competitor will see too; ``_ahead_drift``, ``AHEAD_WITNESSES``), so
the decision is made now rather than when the competitor catches up. The reason says both fractions: where
they were compared and where the decision was made, and the drift counted. Between other controls the
margin is ``sweep_margin``: ``margin``, capped at ``MARGIN_CAP`` × the reference's paired error at its latest
fraction (a fine-tuning sweep whose runs end within 1% of each other needs no 4% lead). The reason states
the trial's predicted final loss, the competitor's on the same scale, its lead and the margin.

A competitor with a *shorter* AdamW timescale than the trial (smaller τ; a trial without weight decay has
the longest) forgets the initialization sooner, so early on it leads by more than it will end ahead (on LR and
batch sweeps at fixed λ the eventual best trailed such a run by 4–10% at t̂ 0.1 and by 0–3% at 0.15;
BENCHMARKS §30). Two things follow. The early loss ratio against it is read where its trend leads when the
trial is catching up: off the line through the log-ratio over the window, at ``EARLY_PROJECTION`` × f, never
above the window's mean (a gap that widens is judged by its mean, as against any other competitor). And
while it is still in the early window (f ≤ ``EARLY_JUDGEMENT`` × ``min_fraction``) it does not compete with a
trial ahead of it by paired predictions: from t̂ 0.11 the reference over-rated such runs by 9–11%; it competes
once past the window.

Paired predictions need paired errors learned on such pairs: two trials whose LR decays lie further apart
(``schedules.decay_distance``) than any pair the surrogate's paired errors were learned on
(``info["pair_decay_distance"]``) are compared unpaired (``paired_decays``; BENCHMARKS §34).

A competitor whose LR has decayed further than the trial's at the common fraction (another schedule: a decay
from the start against a WSD run's stable phase) leads by its lower LR alone by as much as the surrogate's LR
term says, a lead the trial gets at its own decay: the early loss ratio discounts it (``decayed_lead``; on
qiu's MLP schedule sweeps the early loss ratio cut the WSD best so, BENCHMARKS §33).

After a trial's first judgements, a competitor with other controls is compared by the loss ratio instead of
the paired predictions where the reference's *winners' lead* allows it (``lead_margin``): the
reference's ``lead_bands`` say how far, at each fraction, a run that ended worse ever led one of its best
runs; where twice that lead is below the paired margin, the loss ratio with twice the lead as the margin is
the finer test (on fine-tuning runs it shrinks from 1.6% at t̂ 0.1 to 0.3% at 0.5, while the paired margin
stays at the floor). An online reference learns them from the sweep's own completed trials once
``LEAD_MIN_RUNS`` have completed.

While a trial's LR is still warming up (t̂ before its schedule's ``warmup_end``) it is not compared with
competitors of other controls by paired predictions (nor, in their place, unpaired): aligned on a ramp, its
prediction says
how far the ramp has got, not where the run ends; the loss ratios above still apply. The README's Optuna
example cut its best trial (warm-up 23% of training) at t̂ 0.2 that way (BENCHMARKS §20).

``comparison="interval"`` is the unpaired rule for every competitor. A NaN, inf or non-positive loss prunes
at once. A surrogate without an error model gives no interval: then
low = high = the point prediction (no confidence margin; the reason says so). Points past t̂ = 1 are
ignored (and said so in the reason). The function never raises on a curve; every outcome has a reason.

Example: at 15% of training a trial 9% behind a competitor with the same controls (schedule, τ, TPP) is
pruned by the loss ratio, which needs no reference surrogate; one within the 4% margin is kept:

    >>> from collapse_hpo.hpo.rule.decision import Competitor, PruneSettings, decide
    >>> from collapse_hpo.predictors.schedules import Schedule
    >>> t_hat = [0.05, 0.10, 0.15]  # tokens seen / total tokens at each report
    >>> controls = {"schedule": Schedule(), "tau": 0.1, "tpp": 20.0}  # linear decay, τ = B/(ηλD), D/N
    >>> leader = Competitor.from_reports(t_hat, [3.6, 3.3, 3.1], **controls)
    >>> settings = PruneSettings(min_fraction=0.1, margin=0.04)  # margin: a log-ratio of losses (4%)
    >>> behind = decide(t_hat, [3.9, 3.6, 3.4], surrogate=None, competitors=[leader], settings=settings,
    ...                 **controls)
    >>> behind.prune, behind.fraction
    (True, 0.15)
    >>> print(behind.reason)  # doctest: +ELLIPSIS
    current loss 3.499; the best competitor's 3.198 is 8.97% ahead (loss ratio at t_hat=0.15, ...
    >>> close = decide(t_hat, [3.62, 3.31, 3.12], surrogate=None, competitors=[leader], settings=settings,
    ...                **controls)
    >>> close.prune
    False
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from collapse_hpo.hpo.rule.reports import (  # re-exported: the cleaning's names were here before
    T_HAT_END,
    CleanReports,
    clean,
)
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.predict import (
    align_partial,
    final_loss_of,
    predict_final_loss,
    seen_tau_edge,
    shape_key,
    t_quantile,
)
from collapse_hpo.predictors.schedules import LR_ROUNDING, decay_distance, warmup_end
from collapse_hpo.predictors.schedules import on_grid as _on_grid

if TYPE_CHECKING:
    from collapse_hpo.predictors.predict import Prediction
    from collapse_hpo.predictors.schedules import Schedule
    from collapse_hpo.predictors.surrogate import Surrogate

COMPARISONS = ("paired", "interval")

#: Default ``PruneSettings.margin``: chosen on the development sweeps (25K-parameter LR and batch sweeps
#: with τ held, commit 8a43079's curves) as the smallest of 0.02/0.03/0.04/0.05 that never cut the best trial
#: in 20 orders of any of them; every sweep in BENCHMARKS.md §5 is out of sample for it.
DEFAULT_MARGIN = 0.04

#: A trial's first judgements, t̂ ≤ EARLY_JUDGEMENT × min_fraction (0.15 at the default 0.1), compare it with
#: every competitor by their loss ratio at a common fraction, whatever the controls, with ``margin`` as the
#: whole margin. In random searches (τ, warm-up, schedule drawn per trial) the eventual best trial was never
#: more than 0.03 behind the leader at t̂ ≈ 0.1, while the curves cross by 0.1–0.3 later (BENCHMARKS §11, §13):
#: the early ranking is the reliable one, and the learned all-pairs paired error (≈0.45 at 10%) let almost
#: nothing be pruned there. 1.5 was chosen on random_s0 (1.2 and 1.5 tried: 0.235 and 0.217 of the compute,
#: best kept in 20 of 20 orders); random_s1, the λ-fixed, τ-held and surestop sweeps are out of sample.
EARLY_JUDGEMENT = 1.5

#: The margin never exceeds MARGIN_CAP times the reference's paired error at its latest fraction (the
#: smallest error of a predicted ratio of two of its runs' final losses, ``Surrogate.pair_bands[-1]``), when
#: at least MARGIN_CAP_RUNS runs stand behind that error (a few similar completed trials of an online fit do
#: not shrink it): a sweep whose runs end within 1% of each other needs no 4% lead to tell them apart, and
#: its reference says so. 2 was chosen on surestop_lora's earlier nights (reference: the later nights) as the
#: smallest of 1.5, 2 and 2.5 that kept the best run in 20 of 20 orders (1.5: 0.328 of the compute, best cut
#: in 11 of 20; 2: 0.425; 2.5: 0.498); the later nights are out of sample (BENCHMARKS §13). Our pre-training
#: references cap above 0.04 (2 × 0.027 for the 99K family, the builtin prior; 2 × 0.09 for a random search),
#: so those sweeps keep ``margin``.
MARGIN_CAP = 2.0
MARGIN_CAP_RUNS = 10

#: A trial that runs ahead of a competitor (the competitor's latest report at f < the trial's fraction p) is
#: compared at f, and the comparison is moved by the trial's *drift* since f: how far its predicted final loss
#: moved from f to p (the collapse shape relates the two fractions), less the mean drift over f → p of the
#: trials that have reached p (the trial itself and up to AHEAD_WITNESSES other competitors: completed ones
#: and running ones ahead of it). The mean drift is what the shape's own error moves every prediction by, so
#: what is left is this trial's own news since f (``_ahead_drift``). With no other trial past p the mean
#: drift is the trial's own and the comparison is the one at f unchanged. AHEAD_WITNESSES bounds the cost
#: only (two memoized predictions per witness and fraction); it was set before any measurement, never tuned.
AHEAD_WITNESSES = 8

#: The early loss ratio against a competitor with a *shorter* AdamW timescale (smaller τ = B/(ηλD): a larger
#: LR or a smaller batch at the same λ) is read where its trend leads when the trial is catching up: the line
#: through the log-ratio over the window [f/2, f], at EARLY_PROJECTION × f, whenever that is below the
#: window's mean (``_window_gap``, ``_closing_projection``). Such a competitor forgets the
#: initialization sooner (its share of the loss decays as e^(−2t̂/τ), METHOD.md §5), so it leads early by
#: more than it ends ahead, and its lead shrinks while the slower trial's initialization fades: on LR and
#: batch sweeps at fixed λ the eventual best trailed a faster competitor by 4–10% at t̂ 0.1 and by 0–3% at
#: 0.15 (BENCHMARKS §30). 1.5 was chosen on the 25K development set's λ-fixed sweeps as the smallest of 1.0,
#: 1.25 and 1.5 that kept every best in 20 orders at both report densities; the 99K λ-fixed, random-config,
#: τ-held, quickstart and surestop_lora sweeps are out of sample.
EARLY_PROJECTION = 1.5


def sweep_margin(settings: PruneSettings, surrogate: Surrogate | None) -> float:
    """The margin used for this sweep between trials with *other* controls: ``settings.margin``, capped at
    ``MARGIN_CAP`` × the surrogate's paired error at its latest fraction when that error stands on at least
    ``MARGIN_CAP_RUNS`` runs. Trials with equal controls are compared with ``settings.margin`` itself: the
    cap bounds the error of a predicted ratio, not how far two curves of equal controls cross later (with
    it, the 25K development LR sweep of BENCHMARKS §6 lost its best in 11 of 20 orders at a 2.8% cap)."""
    if surrogate is None or not surrogate.pair_bands or surrogate.pair_bands[-1].n < MARGIN_CAP_RUNS:
        return settings.margin
    return min(settings.margin, MARGIN_CAP * surrogate.pair_bands[-1].scale)



@dataclass(frozen=True)
class PruneSettings:
    """Settings of the decision rule.

    Attributes:
        min_fraction: fraction of training tokens (t̂) before which no trial is judged (0 < min_fraction < 1).
        confidence: two-sided confidence of the predicted interval [low, high] (0 < confidence < 1); higher
            confidence = wider intervals = fewer prunes.
        keep_top_k: a trial is kept while it could still be among the ``keep_top_k`` best (integer ≥ 1).
        comparison: "paired" (default: predictions at the same fraction, the shared bias cancels) or
            "interval" (each trial's own interval against each competitor's pessimistic bound).
        margin: the pruner's one knob: the lead a competitor must have over the trial, as a log-ratio of
            losses at a common fraction of training (0.04 = 4%; ``DEFAULT_MARGIN``), to cut it. Smaller
            prunes more and risks the winner more; larger keeps more. It is the whole margin between trials
            with equal controls (from the collapse onset t̂ = τ on, their loss ratio at equal t̂ estimates the
            ratio of final losses; the margin covers the curves crossing later), between any two trials
            with other controls during a trial's first judgements (t̂ ≤ ``EARLY_JUDGEMENT`` ×
            ``min_fraction``: the early loss ratio, see the module docstring); later it is a floor under the
            surrogate's learned paired margin between trials whose controls differ (where the reference's
            winners' lead is the finer test, ``lead_margin``, that lead decides). Between other controls, a
            reference whose runs are told apart more finely caps it (``sweep_margin``: at most
            ``MARGIN_CAP`` × its paired error). ``FRONTIER_KNOBS["collapse"]`` in hpo/replays/peers.py
            sweeps it. Raise it where curves of different controls still cross by more than 4% at t̂ 0.1
            (the README's 200-step MLP, reporting every 2%: 0.16 keeps its best trial, 0.04 does not;
            BENCHMARKS §21).
    """

    min_fraction: float = 0.1
    confidence: float = 0.9
    keep_top_k: int = 1
    comparison: str = "paired"
    margin: float = DEFAULT_MARGIN

    def __post_init__(self) -> None:
        for name in ("min_fraction", "confidence"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise SettingError(name, f"must be a finite number, got {value!r}")
        if not 0.0 < self.min_fraction < 1.0:
            raise SettingError(
                "min_fraction", f"must be a fraction of training in (0, 1), got {self.min_fraction}"
            )
        if not 0.0 < self.confidence < 1.0:
            raise SettingError("confidence", f"must be in (0, 1), got {self.confidence}")
        if isinstance(self.keep_top_k, bool) or not isinstance(self.keep_top_k, int) or self.keep_top_k < 1:
            raise SettingError("keep_top_k", f"must be an integer >= 1, got {self.keep_top_k!r}")
        if (
            isinstance(self.margin, bool) or not isinstance(self.margin, int | float)
            or not math.isfinite(self.margin) or not 0.0 <= self.margin < 1.0
        ):
            raise SettingError(
                "margin", f"must be a log-ratio in [0, 1) (0.04 = 4% of the loss), got {self.margin!r}"
            )
        if self.comparison not in COMPARISONS:
            raise SettingError(
                "comparison", f"must be one of {', '.join(COMPARISONS)}, got {self.comparison!r}"
            )


#: The fields of ``PruneSettings``: the keyword shortcuts both adapters take beside ``settings=``.
SETTING_NAMES = ("min_fraction", "confidence", "keep_top_k", "comparison", "margin")


class SettingError(InputError):
    """A bad value of one of the rule's settings (a ``PruneSettings`` field, or the judge's ``judge_every``):
    the one check of each, whoever asks (an adapter, the sweep file's ``PrunerSpec``).

    Attributes:
        name: the setting, e.g. "min_fraction".
        problem: what is wrong and what is allowed, e.g. "must be in (0, 1), got 1.5"; the message is
            "pruner setting '<name>' <problem>".
    """

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(f"pruner setting {name!r} {problem}")
        self.name = name
        self.problem = problem

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.name, self.problem)


def settings_of(settings: PruneSettings | None = None, **shortcuts: Any) -> PruneSettings:
    """The rule's settings of an adapter (``CollapsePruner``, ``CollapseScheduler``): ``settings``, or the
    ``PruneSettings`` its keyword shortcuts (``SETTING_NAMES``; None = not given, the default) build. Either
    way the same object, checked once, by ``PruneSettings``.

    Raises:
        SettingError: on a bad value, or a shortcut given with ``settings`` whose value differs there.
        InputError: when ``settings`` is no PruneSettings.
    """
    unknown = sorted(set(shortcuts) - set(SETTING_NAMES))
    if unknown:
        raise TypeError(f"settings_of: unknown setting(s) {', '.join(unknown)}")
    given = {k: v for k, v in shortcuts.items() if v is not None}
    if settings is None:
        return PruneSettings(**given)
    if not isinstance(settings, PruneSettings):
        raise InputError(f"settings must be a PruneSettings, got {type(settings).__name__}")
    for name, value in given.items():
        if getattr(settings, name) != value:
            there = getattr(settings, name)
            raise SettingError(name, f"is given twice: {value!r} as a keyword, {there!r} in settings=; give "
                               "it in one place")
    return settings


@dataclass(frozen=True)
class Competitor:
    """Another trial of the sweep, with its curve for the paired comparison.

    Attributes:
        final_loss: its final loss when it completed, else None.
        latest: its latest successful prediction when running (None when completed or not predicted yet).
        t_hat, loss: its reports so far (tokens seen / total_tokens; training loss), valid points only.
        schedule, tau, tpp: its controls (the surrogate predicts its curve with them).
    """

    final_loss: float | None = None
    latest: Prediction | None = None
    t_hat: tuple[float, ...] = ()
    loss: tuple[float, ...] = ()
    schedule: Schedule | None = None
    tau: float | None = None
    tpp: float | None = None
    _arrays: tuple[np.ndarray, np.ndarray] | None = field(
        default=None, init=False, repr=False, compare=False, hash=False
    )
    _log_loss: np.ndarray | None = field(default=None, init=False, repr=False, compare=False, hash=False)
    # The paired comparison's predictions of this competitor from its points up to a fraction, by
    # (surrogate id, fraction, min_fraction) -> (surrogate, value): its points never change, so one
    # prediction serves every trial judged against it at that fraction (``_paired``).
    _predicted: dict[tuple[int, float, float], tuple[Any, float | None]] | None = field(
        default=None, init=False, repr=False, compare=False, hash=False
    )
    # Their alignments, by (the surrogate's shape_key, fraction, min_fraction, confidence): an online fit is
    # tested anew as the sweep's curves move on (a new surrogate, new bands, the same shape), and its copies
    # share the alignment; only the error-model step is redone (``_paired``).
    _aligned: dict[tuple[Any, ...], Any] | None = field(
        default=None, init=False, repr=False, compare=False, hash=False
    )
    _sorted: bool | None = field(default=None, init=False, repr=False, compare=False, hash=False)

    @classmethod
    def from_reports(
        cls,
        t_hat: Sequence[float] | np.ndarray,
        loss: Sequence[float] | np.ndarray,
        *,
        final_loss: float | None = None,
        latest: Prediction | None = None,
        schedule: Schedule | None = None,
        tau: float | None = None,
        tpp: float | None = None,
    ) -> Competitor:
        """A Competitor keeping the reports a prediction can use: t̂ ≤ 1 and a finite, positive loss."""
        t = np.asarray(t_hat, dtype=float).ravel()
        y = np.asarray(loss, dtype=float).ravel()
        ok = np.isfinite(t) & np.isfinite(y) & (y > 0) & (t <= T_HAT_END)
        kept_t, kept_y = t[ok], y[ok]  # new arrays (boolean indexing copies), read-only: shared by judgements
        kept_t.flags.writeable = kept_y.flags.writeable = False
        made = cls(
            final_loss=final_loss, latest=latest, t_hat=tuple(kept_t.tolist()), loss=tuple(kept_y.tolist()),
            schedule=schedule, tau=tau, tpp=tpp,
        )
        object.__setattr__(made, "_arrays", (kept_t, kept_y))
        return made

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``t_hat`` and ``loss`` as float arrays (made once per competitor)."""
        if self._arrays is None:
            t, y = np.array(self.t_hat, dtype=float), np.array(self.loss, dtype=float)
            t.flags.writeable = y.flags.writeable = False
            object.__setattr__(self, "_arrays", (t, y))
        assert self._arrays is not None
        return self._arrays

    def log_loss(self) -> np.ndarray:
        """log(``loss``) as a float array (made once per competitor; the paired comparison's unit)."""
        if self._log_loss is None:
            out = np.log(self.arrays()[1])
            out.flags.writeable = False
            object.__setattr__(self, "_log_loss", out)
        assert self._log_loss is not None
        return self._log_loss

    def last_at(self, fraction: float) -> float | None:
        """The largest t̂ of the competitor's points at or before ``fraction`` (within 1e-9), or None."""
        if self._sorted is None:
            t = self.t_hat
            object.__setattr__(self, "_sorted", all(a <= b for a, b in itertools.pairwise(t)))
        if self._sorted:
            j = bisect.bisect_right(self.t_hat, fraction + 1e-9)
            return float(self.t_hat[j - 1]) if j else None
        t = self.arrays()[0]
        earlier = t[t <= fraction + 1e-9]
        return float(earlier.max()) if earlier.size else None

    def memo(self) -> dict[tuple[int, float, float], tuple[Any, float | None]]:
        """The competitor's own memo of paired predictions (made on first use)."""
        if self._predicted is None:
            object.__setattr__(self, "_predicted", {})
        assert self._predicted is not None
        return self._predicted

    def alignments(self) -> dict[tuple[Any, ...], Any]:
        """The competitor's own memo of the alignments behind them, by shape (made on first use)."""
        if self._aligned is None:
            object.__setattr__(self, "_aligned", {})
        assert self._aligned is not None
        return self._aligned


@dataclass(frozen=True)
class Decision:
    """The outcome of one judgement of one trial.

    Attributes:
        prune: True to stop the trial.
        reason: one line saying why (always set).
        fraction: t̂ of the latest valid report used (tokens seen / total_tokens, at most 1); NaN without one.
        prediction: the final-loss prediction, when one was made (also when it failed: then ``ok`` is False).
        threshold: what the trial was compared with, when a comparison was made: the ``keep_top_k``-th best
            pessimistic competitor final loss ("interval"), or the ``keep_top_k``-th lowest bar ("paired").
        threshold_index: position in ``competitors`` of the competitor the threshold came from.
        notes: what was ignored in the reports (repeated, invalid or past-the-end points); also in ``reason``.
    """

    prune: bool
    reason: str
    fraction: float
    prediction: Prediction | None = None
    threshold: float | None = None
    notes: tuple[str, ...] = ()
    threshold_index: int | None = None

    def user_attrs(self) -> dict[str, Any]:
        """The decision as the user attrs written to a trial (JSON values; None where unknown).

        Keys: ``predicted_final_loss``, ``predicted_low``, ``predicted_high`` (losses), ``decision_fraction``
        (t̂), ``prune_reason`` (str). The prediction keys are only filled when the prediction succeeded.
        """
        p = self.prediction
        good = p is not None and p.ok
        return {
            "predicted_final_loss": _json_float(p.final_loss) if good else None,
            "predicted_low": _json_float(p.low) if good else None,
            "predicted_high": _json_float(p.high) if good else None,
            "decision_fraction": _json_float(self.fraction),
            "prune_reason": self.reason,
        }


def _json_float(x: float | None) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


def pessimistic(competitor: float | Prediction | Competitor) -> float:
    """A competitor's pessimistic final loss: a float as is; a Prediction's ``high`` (else its final_loss).

    A Competitor: its final loss when completed, else its latest prediction's. Returns NaN when the
    competitor has no usable value (a failed prediction, a non-finite loss).
    """
    if isinstance(competitor, Competitor):
        if competitor.final_loss is not None:
            return pessimistic(competitor.final_loss)
        return math.nan if competitor.latest is None else pessimistic(competitor.latest)
    if isinstance(competitor, int | float):
        value = float(competitor)
    else:
        if not getattr(competitor, "ok", False):
            return math.nan
        value = competitor.high if competitor.high is not None else competitor.final_loss
        value = math.nan if value is None else float(value)
    return value if math.isfinite(value) else math.nan


def not_judged_yet(fraction: float, settings: PruneSettings, notes: Sequence[str] = ()) -> Decision:
    """The decision for a trial whose latest valid report is at t̂ = ``fraction`` < ``min_fraction`` (what
    ``decide`` returns then; the judge builds it from its report summary without the curve). The reason does
    not repeat t̂, so it stays the same from report to report (an adapter writes it once)."""
    kept = list(notes)
    reason = _join(f"t_hat < min_fraction={settings.min_fraction:g}: not judged yet", kept)
    return Decision(False, reason, fraction, notes=tuple(kept))


def decide(
    t_hat: Sequence[float] | np.ndarray,
    loss: Sequence[float] | np.ndarray,
    *,
    surrogate: Surrogate | None,
    schedule: Schedule,
    tau: float | None,
    tpp: float | None,
    competitors: Iterable[float | Prediction | Competitor],
    settings: PruneSettings,
) -> Decision:
    """Judge one trial from its reports so far (see the module docstring for the rule).

    Args:
        t_hat: training fractions of the reports (tokens seen / total_tokens), any order.
        loss: training losses at those fractions; NaN/inf = diverged.
        surrogate: calibrated surrogate, or None (no reference yet).
        schedule: the trial's LR schedule shape.
        tau: AdamW timescale; None = no weight decay.
        tpp: tokens per parameter; None = not defined (a surrogate with a TPP law cannot predict it).
        competitors: completed trials' final losses (float), other trials' predictions (Prediction), or
            either with its curve and controls (Competitor).
        settings: PruneSettings.

    Returns:
        A Decision. Raises ValueError only when ``t_hat`` and ``loss`` differ in length (a caller bug).
    """
    t = np.asarray(t_hat, dtype=float).ravel()
    y = np.asarray(loss, dtype=float).ravel()
    if t.shape != y.shape:
        raise ValueError(f"decide: t_hat has {t.size} points but loss has {y.size}")
    return decide_cleaned(clean(t, y), surrogate=surrogate, schedule=schedule, tau=tau, tpp=tpp,
                          competitors=competitors, settings=settings)


def decide_cleaned(
    reports: CleanReports,
    *,
    surrogate: Surrogate | None,
    schedule: Schedule,
    tau: float | None,
    tpp: float | None,
    competitors: Iterable[float | Prediction | Competitor],
    settings: PruneSettings,
) -> Decision:
    """``decide`` on reports cleaned already (``reports.clean``: the judge cleans a trial's reports once and
    hands them here); the same Decision as ``decide`` on the raw reports."""
    notes = list(reports.summary.notes)
    d = _decide(reports, surrogate, schedule, tau, tpp, competitors, settings, notes)
    return replace(d, notes=tuple(notes)) if notes else d


def _decide(
    reports: CleanReports,
    surrogate: Surrogate | None,
    schedule: Schedule,
    tau: float | None,
    tpp: float | None,
    competitors: Iterable[float | Prediction | Competitor],
    settings: PruneSettings,
    notes: list[str],
) -> Decision:
    t, y = reports.t_hat, reports.loss
    if not reports.valid:
        return Decision(False, _join("no loss reported yet: nothing to judge", notes), math.nan)

    # Divergence is judged on every report, also those past t̂ = 1: a NaN is a NaN.
    if reports.bad is not None:
        bad_t, bad_y = reports.bad
        if not math.isfinite(bad_y):
            why = f"loss is {bad_y} at t_hat={bad_t:.4g}: the run diverged; pruned at once"
        else:
            why = (f"loss is {bad_y:.6g} at t_hat={bad_t:.4g}: a training loss must be positive (a bug in "
                   "the loss or the logging); pruned at once")
        return Decision(True, _join(why, notes), float(min(bad_t, 1.0)))

    if t.size == 0:  # every report past t̂ = 1 (noted in ``notes``)
        return Decision(False, _join("no report at t_hat <= 1: nothing to judge", notes), math.nan)
    fraction = float(min(t[-1], 1.0))

    if fraction < settings.min_fraction:
        return not_judged_yet(fraction, settings, notes)
    paired = settings.comparison == "paired"
    if surrogate is None and not paired:
        return Decision(False, _join("no reference surrogate: cannot predict, kept", notes), fraction)

    prediction: Prediction | None = None
    if surrogate is not None:
        prediction = predict_final_loss(
            t,
            y,
            surrogate=surrogate,
            schedule=schedule,
            tau=tau,
            tpp=tpp,
            min_fraction=settings.min_fraction,
            confidence=settings.confidence,
        )
        if not prediction.ok:
            return Decision(
                False, _join(f"no prediction ({prediction.reason}): kept", notes), fraction, prediction
            )

    comps = list(competitors)
    if paired:
        return _paired(t, y, prediction, comps, surrogate, schedule, tau, tpp, settings, fraction, notes)
    assert prediction is not None  # the interval rule returned above without a surrogate
    return _interval(prediction, comps, settings, fraction, notes)


def _interval(
    prediction: Prediction,
    comps: list[float | Prediction | Competitor],
    settings: PruneSettings,
    fraction: float,
    notes: list[str],
) -> Decision:
    """The unpaired rule: this trial's optimistic bound against the competitors' pessimistic final losses."""
    scored = sorted((v, i) for i, v in enumerate(pessimistic(c) for c in comps) if math.isfinite(v))
    k = settings.keep_top_k
    pred = float(prediction.final_loss)
    low = float(prediction.low) if prediction.low is not None else pred
    conf = "no error model: point prediction"
    if prediction.low is not None:
        conf = f"at {settings.confidence:.0%}"
    if len(scored) < k:
        few = (f"only {len(scored)} competitor(s) with a final loss or prediction, keep_top_k={k}" if scored
               else "no competitor with a final loss or prediction yet")
        return Decision(
            False,
            _join(f"predicted final loss {pred:.4g} (low {low:.4g} {conf}); {few}: kept", notes),
            fraction,
            prediction,
        )
    threshold, index = scored[k - 1]
    if low > threshold:
        reason = (
            f"optimistic final loss {low:.4g} ({conf}; predicted {pred:.4g}) > {threshold:.4g}, the "
            f"pessimistic final loss of the {_ordinal(k)} best competitor: pruned at t_hat={fraction:.3g}"
        )
        return Decision(True, _join(reason, notes), fraction, prediction, threshold, threshold_index=index)
    reason = (
        f"optimistic final loss {low:.4g} ({conf}; predicted {pred:.4g}) <= {threshold:.4g}, the "
        f"pessimistic final loss of the {_ordinal(k)} best competitor: kept"
    )
    return Decision(False, _join(reason, notes), fraction, prediction, threshold, threshold_index=index)


#: Relative difference of τ or TPP below which two trials' controls count as equal: training tokens rounded to
#: whole batches move the TPP of a batch-size sweep by ~0.2%, which changes the collapsed shape by far less.
CONTROL_TOLERANCE = 0.01
#: Two schedule shapes are the same when their mean absolute difference over t̂ ∈ [0, 1] is below this (in
#: units of the peak LR): linear and cosine decay differ by about 0.1, warm-ups of 5% and 10% by 0.03.
SCHEDULE_TOLERANCE = 0.01


@functools.lru_cache(maxsize=1 << 16)  # exact: Schedules are frozen and hashed by their fields
def same_schedule(a: Schedule, b: Schedule) -> bool:
    """Whether two LR schedule shapes agree: mean |a(t̂) − b(t̂)| < ``SCHEDULE_TOLERANCE`` on a grid of t̂.

    Schedules read from logged LRs (kind ``data``) differ in float noise and in where they were logged (a
    coarse log clips the warm-up's peak); compared on average as functions of t̂ they are equal.
    """
    if a == b:
        return True
    diff = np.abs(_on_grid(a) - _on_grid(b))
    return bool(np.mean(diff) < SCHEDULE_TOLERANCE)




def _same_value(a: float | None, b: float | None) -> bool:
    """Whether two per-run controls agree: both None (no weight decay / TPP not defined), or both numbers
    within ``CONTROL_TOLERANCE`` (relative). None and a number differ."""
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=CONTROL_TOLERANCE)


def same_controls(schedule: Schedule, tau: float | None, tpp: float | None, other: Competitor) -> bool:
    """Whether a competitor trains with the same controls (schedule shape, τ, TPP) as the trial.

    Equal controls mean equal normalized curves (the collapse), so the two trials' losses at equal t̂ are in
    the ratio of their final losses, up to how much the curves cross later. τ and TPP count as equal within
    ``CONTROL_TOLERANCE`` (relative), schedules as in ``same_schedule``. None (τ: no weight decay; TPP: not
    defined) equals None only: a run without a TPP and a run with one are different controls.
    """
    if other.schedule is None:
        return False
    # The cheap checks first (in a random search τ differs in nearly every pair): the same answer.
    if not (_same_value(tau, other.tau) and _same_value(tpp, other.tpp)):
        return False
    return same_schedule(schedule, other.schedule)


def _mean(x: np.ndarray) -> float:
    """``float(np.mean(x))`` of a non-empty 1-D float64 array, to the bit (numpy's mean is this sum over the
    count) without its per-call dispatch: the paired comparison takes a few means per competitor, tens of
    thousands per replay. tests/test_decision.py checks the bits against ``np.mean``."""
    return float(np.add.reduce(x)) / x.size


def loss_log_ratio(
    t: np.ndarray, y: np.ndarray, ct: np.ndarray, cy: np.ndarray, f: float, align_start: float, *,
    log_y: np.ndarray | None = None, log_cy: np.ndarray | None = None, onset: float = 0.0,
) -> float | None:
    """Mean log(loss_trial / loss_competitor) over the window t̂ ∈ [max(align_start · f, onset), f].

    Both curves are sorted by t̂ and hold valid points only; the competitor's log-loss is interpolated at the
    trial's points in the window (the window is clipped to where both curves have points). Returns None when
    the curves share no point of the window. ``log_y``/``log_cy``: log(y) and log(cy) when the caller has
    them already (one judgement compares one trial with every competitor).
    """
    window = _window_gap(t, y, ct, cy, f, align_start, log_y=log_y, log_cy=log_cy, onset=onset)
    return None if window is None else _mean(window[1])


def _window_gap(
    t: np.ndarray, y: np.ndarray, ct: np.ndarray, cy: np.ndarray, f: float, align_start: float, *,
    log_y: np.ndarray | None = None, log_cy: np.ndarray | None = None, onset: float = 0.0,
) -> tuple[np.ndarray, np.ndarray] | None:
    """The trial's points in ``loss_log_ratio``'s window and its log loss ratio over the competitor at each
    (None when the curves share no point of the window): the mean is ``loss_log_ratio``; the early loss ratio
    against a faster competitor also reads its line (``_closing_projection``)."""
    lo = max(align_start * f, onset, float(ct[0]), float(t[0]))
    # t is sorted: the window is the slice [i0, i1) (t >= lo and t <= f, each within 1e-12).
    i0 = int(t.searchsorted(lo - 1e-12, "left"))  # the methods: np.searchsorted's wrapper costs as much
    i1 = int(t.searchsorted(f + 1e-12, "right"))
    if i1 <= i0:  # no trial point in the window: its last point at t̂ <= f, if the competitor reaches it
        if i1 == 0 or t[i1 - 1] < ct[0] - 1e-12:
            return None
        i0 = i1 - 1
    theirs = np.interp(t[i0:i1], ct, np.log(cy) if log_cy is None else log_cy)
    mine = np.log(y[i0:i1]) if log_y is None else log_y[i0:i1]
    return t[i0:i1], mine - theirs


def _closing_projection(t: np.ndarray, gap: np.ndarray, at: float) -> float:
    """The log loss ratio ``gap`` (trial over competitor, at the trial's points ``t``) read at t̂ = ``at`` off
    its least-squares line when the line falls (the trial catching up), else its mean: never above the mean,
    so a trial falling further behind is judged as by the mean. Fewer than 3 points: the mean."""
    mean = _mean(gap)
    if gap.size < 3:
        return mean
    t_mean = _mean(t)
    tc = t - t_mean
    spread = float(np.dot(tc, tc))
    if spread <= 0.0:
        return mean
    slope = float(np.dot(tc, gap - mean)) / spread
    return mean + min(slope, 0.0) * (at - t_mean)


def paired_decays(surrogate: Surrogate, a: Schedule, b: Schedule) -> bool:
    """Whether ``surrogate``'s paired errors cover two trials on schedules ``a`` and ``b``: their decays lie
    no further apart (``schedules.decay_distance``) than those of the pairs the errors were learned on
    (``info["pair_decay_distance"]``, written by calibration; at least ``SCHEDULE_TOLERANCE``, below which
    schedules are one). A surrogate that does not record it (written before it) pairs any two trials.

    The builtin prior learned its paired errors on runs of one linear decay: a WSD or constant-LR trial
    paired with a linear one got its errors, and on a schedule sweep of our own trainer a WSD run predicted
    14% below its end cut the linear best (BENCHMARKS §34)."""
    learned = surrogate.info.get("pair_decay_distance")
    if isinstance(learned, bool) or not isinstance(learned, int | float) or not math.isfinite(learned):
        return True
    return decay_distance(a, b) <= max(float(learned), SCHEDULE_TOLERANCE) + 1e-12


def decayed_lead(
    surrogate: Surrogate | None, t: np.ndarray, schedule: Schedule, tau: float | None, tpp: float | None,
    c: Competitor,
) -> float:
    """How far (log loss) a competitor whose LR has decayed further than the trial's leads over the window's
    points ``t`` by its lower LR alone, by the surrogate's LR term b·(η + ε₂)^q (METHOD.md: the loss falls
    with the LR and the trial's will fall as its own LR decays); 0 when its LR is not lower on average.

    Counted where both runs are past their warm-ups (on a ramp a lower LR is a slower run, not a lead), with
    the larger of the two runs' b (τ empty: at the largest τ the surrogate saw, ``seen_tau_edge``, when it
    serves such a run at its τ law's limit) and the trial's q. 0 without a surrogate or where it cannot serve
    these controls. Between runs of one schedule it is 0: a rule for schedule sweeps (BENCHMARKS §33).
    """
    if surrogate is None or c.schedule is None:
        return 0.0
    past = t >= max(warmup_end(schedule), warmup_end(c.schedule)) - 1e-9
    if not past.any():
        return 0.0
    tp = t[past]
    eta, eta_c = np.asarray(schedule(tp), dtype=float), np.asarray(c.schedule(tp), dtype=float)
    # LRs read from logs differ in their last digits (float32): only a lower LR by more than that counts.
    eta_c = np.where(eta - eta_c > LR_ROUNDING, eta_c, eta)
    if not (eta_c < eta).any():
        return 0.0
    try:
        b = max(surrogate.b(seen_tau_edge(surrogate, tau) or tau),
                surrogate.b(seen_tau_edge(surrogate, c.tau) or c.tau))
        q = surrogate.q(tpp)
    except (InputError, ValueError):
        return 0.0
    # ℓ̂ of both runs with one b, q and end LR: its normalization cancels, the LR term's difference is left.
    shape = surrogate.normalized_bq
    lead = np.log(shape(tp, eta, 0.0, b, q)) - np.log(shape(tp, eta_c, 0.0, b, q))
    return max(0.0, _mean(lead))


def faster_timescale(tau: float | None, other: float | None) -> bool:
    """Whether a competitor's AdamW timescale ``other`` is shorter than the trial's ``tau`` (None: no weight
    decay, an infinite timescale). A faster competitor leads early by more than it ends ahead
    (``EARLY_PROJECTION``)."""
    return (math.inf if other is None else other) < (math.inf if tau is None else tau)


#: The alignments behind the paired comparison's predictions from a curve's points up to a fraction,
#: memoized: one judgement predicts every competitor, the same competitor at the same fraction is predicted
#: again for every trial judged there, and for every tested copy of an online fit (the same shape). The key
#: is the surrogate's ``shape_key``, the schedule *object* (kept in the entry and checked by identity, so a
#: reused id never hits), τ, TPP, min_fraction, confidence and the points' bytes; an alignment is a pure
#: function of these (``predict.align_partial``). Cleared when full.
_PAIRED_ALIGNMENTS: dict[tuple[Any, ...], tuple[Any, Any]] = {}
_PAIRED_CACHE_SIZE = 100_000


def _paired(
    t: np.ndarray,
    y: np.ndarray,
    prediction: Prediction | None,
    comps: list[float | Prediction | Competitor],
    surrogate: Surrogate | None,
    schedule: Schedule,
    tau: float | None,
    tpp: float | None,
    settings: PruneSettings,
    fraction: float,
    notes: list[str],
) -> Decision:
    """The paired comparison (module docstring): each competitor's bar in this trial's prediction units.

    Without a surrogate (``prediction`` None) only competitors with equal controls can be compared; the bars
    are then in units of the trial's current loss.
    """
    align_start = surrogate.align_start if surrogate is not None else 0.5
    floor = sweep_margin(settings, surrogate)
    if prediction is not None:
        value = float(prediction.final_loss)
        low = float(prediction.low) if prediction.low is not None else value
        what = "predicted final loss"
    else:
        value = float(np.exp(np.mean(np.log(y[t >= align_start * fraction - 1e-12]))))
        low = value
        what = "current loss"
    own: dict[float, float | None] = {fraction: value}  # this trial's prediction at each fraction used

    shape = shape_key(surrogate) if surrogate is not None else None  # what an alignment depends on

    def at(
        f: float, tt: np.ndarray, yy: np.ndarray, sched: Schedule, ta: float | None, tp: float | None,
        comp: Competitor | None = None,
    ) -> float | None:
        """A prediction from the points at t̂ <= f of one curve (None when it fails): ``predict_final_loss``'s
        value, memoized (``comp``: the competitor whose curve and controls these are, with its own memos)."""
        assert surrogate is not None
        memo = comp.memo() if comp is not None else None
        if memo is None:  # this trial's own points (memoized per judgement in ``own``), or memos off
            return final_loss_of(aligned_at(f, tt, yy, sched, ta, tp), surrogate, tau=ta, tpp=tp,
                                 confidence=settings.confidence)
        mkey = (id(surrogate), f, settings.min_fraction)
        mine = memo.get(mkey)
        if mine is not None and mine[0] is surrogate:
            return mine[1]
        assert comp is not None  # it has a memo
        aligned = comp.alignments()
        akey = (shape, f, settings.min_fraction, settings.confidence)
        if akey not in aligned:
            aligned[akey] = aligned_at(f, tt, yy, sched, ta, tp)
        value = final_loss_of(aligned[akey], surrogate, tau=ta, tpp=tp, confidence=settings.confidence)
        memo[mkey] = (surrogate, value)
        return value

    def aligned_at(
        f: float, tt: np.ndarray, yy: np.ndarray, sched: Schedule, ta: float | None, tp: float | None
    ) -> Any:
        """The alignment of the points at t̂ <= f of one curve (``align_partial``), memoized by shape."""
        assert surrogate is not None
        keep = tt <= f + 1e-12
        tk, yk = np.ascontiguousarray(tt[keep]), np.ascontiguousarray(yy[keep])
        key = (shape, id(sched), ta, tp, settings.min_fraction, settings.confidence, tk.tobytes(),
               yk.tobytes())
        hit = _PAIRED_ALIGNMENTS.get(key)
        if hit is not None and hit[0] is sched:
            return hit[1]
        aligned = align_partial(tk, yk, surrogate=surrogate, schedule=sched, tau=ta, tpp=tp,
                                min_fraction=settings.min_fraction, confidence=settings.confidence)
        if len(_PAIRED_ALIGNMENTS) >= _PAIRED_CACHE_SIZE:
            _PAIRED_ALIGNMENTS.clear()
        _PAIRED_ALIGNMENTS[key] = (sched, aligned)
        return aligned

    # (bar, competitor index, how compared, the competitor's final loss in this trial's units, margin used)
    bars: list[tuple[float, int, str, float, float]] = []
    theirs_final, used_margin = math.nan, 0.0
    n_paired = 0
    log_y: np.ndarray | None = None  # log(y), made at the first competitor with equal controls
    early_end = EARLY_JUDGEMENT * settings.min_fraction + 1e-9
    early = fraction <= early_end  # this trial's first judgements
    warm_up = warmup_end(schedule)
    ramping = fraction < warm_up - 1e-9  # its LR still warming up: other controls wait
    # Per common fraction f: the paired margin and its wording (the same for every competitor at f).
    paired_at: dict[float, tuple[float, str] | None] = {}
    lead_at: dict[float, float | None] = {}  # per f: the winners'-lead margin, or None (``lead_margin``)

    def lead_for(f: float) -> float | None:
        if f not in lead_at:
            lead_at[f] = lead_margin(surrogate, f, settings, floor)
        return lead_at[f]

    # Per common fraction f behind this trial's: its drift since f relative to the witnesses' (_ahead_drift).
    drift_at: dict[float, tuple[float, str] | None] = {}
    onset = collapse_onset(tau)  # equal controls: loss ratios from here on (``collapse_onset``)
    skipped: set[int] = set()  # equal-controls competitors before the onset: they do not compete here
    warming: set[int] = set()  # other controls while this trial warms up: they do not compete either
    fresh: set[int] = set()  # faster competitors in the early window, this trial ahead: they wait
    unlike: set[int] = set()  # decays further apart than the paired errors were learned on: unpaired
    for i, c in enumerate(comps):
        bar = math.nan
        how = "unpaired"
        if isinstance(c, Competitor) and len(c.t_hat) and c.schedule is not None:
            ct, cy = c.arrays()
            last = c.last_at(fraction)
            if last is not None and last >= settings.min_fraction:
                f = last
                log_ratio: float | None = None
                margin = floor
                if same_controls(schedule, tau, tpp, c):
                    if f >= onset - 1e-9:
                        if log_y is None:
                            log_y = np.log(y)
                        log_ratio = loss_log_ratio(t, y, ct, cy, f, align_start, log_y=log_y,
                                                   log_cy=c.log_loss(), onset=onset)
                        # The whole margin: sweep_margin's cap bounds the reference's predicted-ratio
                        # error, not how far curves of equal controls cross (MARGIN_CAP).
                        margin = settings.margin
                        how = f"loss ratio at t_hat={f:.3g}, equal controls"
                    else:  # before the collapse onset: not compared at all (not even unpaired)
                        skipped.add(i)
                        continue
                elif early:
                    if log_y is None:
                        log_y = np.log(y)
                    window = _window_gap(t, y, ct, cy, f, align_start, log_y=log_y, log_cy=c.log_loss())
                    how = f"early loss ratio at t_hat={f:.3g}"
                    if window is not None:
                        log_ratio = _mean(window[1])
                        if faster_timescale(tau, c.tau):
                            at_t = EARLY_PROJECTION * f
                            closing = _closing_projection(*window, at_t)
                            # The reason says which reading decided: the line only where the gap closes.
                            if closing < log_ratio:
                                log_ratio = closing
                                how += f", a faster tau: a closing gap read at t_hat={at_t:.3g}"
                            else:
                                how += ", a faster tau: the gap not closing, its window mean"
                        lower_lr = decayed_lead(surrogate, window[0], schedule, tau, tpp, c)
                        if lower_lr > 0.0:
                            log_ratio -= lower_lr
                            how += f", less its lower LR's lead {100 * math.expm1(lower_lr):.2g}%"
                elif (lead := lead_for(f)) is not None:
                    if log_y is None:
                        log_y = np.log(y)
                    log_ratio = loss_log_ratio(t, y, ct, cy, f, align_start, log_y=log_y,
                                               log_cy=c.log_loss())
                    margin = lead
                    how = f"loss ratio at t_hat={f:.3g}, the reference's winners' lead"
                elif ramping:  # during its warm-up: no paired prediction with other controls
                    warming.add(i)
                    continue
                elif f <= early_end and faster_timescale(tau, c.tau):
                    # A faster competitor still in the early window, this trial ahead of it: its paired
                    # prediction from there over-rates it (module docstring); it competes once past it.
                    fresh.add(i)
                    continue
                elif surrogate is not None and surrogate.pair_bands and not paired_decays(
                        surrogate, schedule, c.schedule):
                    unlike.add(i)  # compared unpaired below: no learned error behind such a pair
                elif surrogate is not None and surrogate.pair_bands:
                    if f not in paired_at:
                        paired_at[f] = paired_margin(surrogate, f, settings, floor)
                    if f not in own:
                        own[f] = at(f, t, y, schedule, tau, tpp)
                    mine = own[f]
                    theirs = at(f, ct, cy, c.schedule, c.tau, c.tpp, c)
                    paired = paired_at[f]
                    if mine is not None and theirs is not None and paired is not None:
                        margin, how = paired
                        log_ratio = math.log(mine / theirs)
                if log_ratio is not None and f < fraction - 1e-9 and prediction is not None:
                    if f not in drift_at:
                        if f not in own:
                            own[f] = at(f, t, y, schedule, tau, tpp)
                        drift_at[f] = _ahead_drift(f, fraction, value, own[f], comps, at, schedule, surrogate)
                    drift = drift_at[f]
                    if drift is not None:
                        log_ratio += drift[0]
                        how += drift[1]
                if log_ratio is not None:
                    bar = value * math.exp(margin - log_ratio)
                    theirs_final, used_margin = value * math.exp(-log_ratio), margin
                    n_paired += 1
                else:
                    how = "unpaired"
        if not math.isfinite(bar) and prediction is not None:
            v = pessimistic(c)
            bar = v * value / low if math.isfinite(v) and low > 0 else math.nan
            # Unpaired: its pessimistic final loss against this trial's optimistic one (no margin).
            theirs_final, used_margin = bar, 0.0
            how = "unpaired: its pessimistic final loss against this trial's optimistic one"
        if math.isfinite(bar):
            bars.append((bar, i, how, theirs_final, used_margin))
    waiting = (f"; {len(skipped)} with equal controls not compared before the collapse onset "
               f"t_hat={onset:.3g} (tau)") if skipped else ""
    if warming:
        waiting += (f"; {len(warming)} with other controls not compared before this trial's warm-up ends at "
                    f"t_hat={warm_up:.3g}")
    if fresh:
        waiting += (f"; {len(fresh)} with a shorter timescale (tau) not compared by predictions before "
                    f"t_hat={early_end:.3g}")
    if unlike:
        waiting += (f"; {len(unlike)} with an LR decay further from this trial's than the pairs its paired "
                    "errors were learned on: compared unpaired")
    if n_paired == 0:  # nothing could be paired: the bars are the interval rule's, so is the decision
        if prediction is None:
            return Decision(
                False,
                _join(
                    "no reference surrogate, and no competitor with equal controls at a common fraction "
                    f"of training{waiting}: kept",
                    notes,
                ),
                fraction,
            )
        out = skipped | warming | fresh
        rest = [math.nan if i in out else c for i, c in enumerate(comps)]  # same indices, skipped out
        if not any(math.isfinite(pessimistic(c)) for c in rest):  # no one to compare with: why, not how
            said = [waiting[2:]] if waiting else []  # those not compared yet, without the leading "; "
            return _interval(prediction, rest, settings, fraction, [*notes, *said])
        why = f"no competitor could be paired{waiting}"
        if surrogate is not None and not surrogate.pair_bands:
            why += " (the surrogate has no pair_bands for competitors with other controls)"
        return _interval(prediction, rest, settings, fraction, [*notes, f"{why}: compared unpaired"])
    bars.sort()
    k = settings.keep_top_k
    summary = f"{n_paired} of {len(bars)} competitor(s) paired{waiting}"
    if len(bars) < k:
        return Decision(
            False,
            _join(
                f"{what} {value:.4g}; only {len(bars)} competitor(s) to compare with, keep_top_k={k}: kept",
                notes,
            ),
            fraction,
            prediction,
        )
    threshold, index, how, theirs_final, used_margin = bars[k - 1]
    reason = paired_reason(what, value, theirs_final, used_margin, k, f"{how}; {summary}", fraction,
                           prune=value > threshold)
    return Decision(
        value > threshold, _join(reason, notes), fraction, prediction, threshold, threshold_index=index
    )


def collapse_onset(tau: float | None) -> float:
    """The collapse onset: the fraction of training t̂ from which two trials with equal controls are compared
    by their loss ratio, and where the ratio's window starts (``ONSET_CAP`` at most; 0 without weight decay).

    It is τ = B/(ηλD), AdamW's timescale as a fraction of training: until about τ the weights still hold
    much of their initialization (its share of the loss decays as e^(−2t̂/τ), METHOD.md §5), and a larger LR
    has moved further from it, so runs of equal τ are not yet on one normalized curve and a too-high LR leads
    runs that end better. The paper orders τ-held runs only from about 25% of training (METHOD.md §4,
    its Fig. 7). Measured here: a run 15% ahead at t̂ 0.13 that ends 11% worse (the two-worker tiny sweep of
    issue 23, τ 0.25), and 30% ahead at t̂ 0.09 while ending 4% worse (the 99K τ-held LR sweep, τ 0.18).
    Without weight decay (``tau`` None) τ is infinite and has no such role: 0, the rule as before.
    """
    if tau is None or not math.isfinite(tau) or tau <= 0:
        return 0.0
    return min(float(tau), ONSET_CAP)


#: The collapse onset is at most this fraction of training (a priori, not tuned): with a very long AdamW
#: timescale (weak weight decay) equal-controls trials are still compared over the second half of training.
ONSET_CAP = 0.5


def lead_margin(surrogate: Surrogate | None, f: float, settings: PruneSettings, floor: float) -> float | None:
    """The margin of comparing a trial with a competitor of *other* controls by their loss ratio at the
    common fraction ``f``, after the trial's first judgements; None to compare them by paired predictions.

    The reference's ``lead_bands`` say how far, at ``f``, a run that ended worse ever led one of its best runs
    (by loss ratio). Where ``MARGIN_CAP`` × that lead is below the paired comparison's margin at ``f``
    (``paired_margin``), the plain loss ratio separates the runs that can win more finely than the paired
    predictions do: the trial is compared by the loss ratio with ``MARGIN_CAP`` × the lead as the margin.
    It shrinks as training goes on and the curves stop crossing (surestop_lora: 1.6% at t̂ 0.1, 0.3% at
    0.5), where the paired margin stays at the sweep's floor. Needs ``LEAD_MIN_RUNS`` reference runs behind
    the lead (an online fit on a few completed trials has none). BENCHMARKS §15, "the winners' lead".
    """
    lead = surrogate.lead_band(f) if surrogate is not None and surrogate.lead_bands else None
    if lead is None or lead.n < LEAD_MIN_RUNS:
        return None
    paired = paired_margin(surrogate, f, settings, floor)
    if paired is None or MARGIN_CAP * lead.scale >= paired[0]:
        return None
    return MARGIN_CAP * lead.scale


def lead_summary(surrogate: Surrogate) -> str:
    """One line on a reference's winners' lead (``Surrogate.lead_bands``) for ``collapse-hpo calibrate``: the
    lead at its first and last fraction (log loss ratio, in %), how many runs stand behind it, and whether
    the pruner uses it (``lead_margin``: from ``LEAD_MIN_RUNS`` runs on)."""
    bands = surrogate.lead_bands
    if not bands:
        return ("winners' lead: none (no run ended worse than a best run, or a surrogate written before it); "
                "trials of other controls are compared by their paired predictions")
    first, last = bands[0], bands[-1]
    counts = sorted({b.n for b in bands})
    runs = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    what = (f"winners' lead: {100 * first.scale:.2f}% at t_hat={first.fraction:g} to "
            f"{100 * last.scale:.2f}% at t_hat={last.fraction:g}, over {runs} runs")
    if counts[-1] < LEAD_MIN_RUNS:
        return (f"{what}: not used (fewer than the {LEAD_MIN_RUNS} runs it needs; a small reference's lead "
                "can be smaller than the next sweep's crossings): trials of other controls are compared by "
                "their paired predictions")
    if counts[0] < LEAD_MIN_RUNS:
        what += f" (used only at the fractions {LEAD_MIN_RUNS} or more runs reached)"
    return f"{what}: used where {MARGIN_CAP:g} x the lead is below the paired margin"


#: The winners' lead (``lead_margin``) is used only when at least this many reference runs stand behind it.
#: It is the largest of many leads, read off a few best runs: a small reference can carry one far below the
#: next sweep's. Was 20 (a priori); 40 was chosen on references drawn from our random-config sweeps and
#: surestop_lora's earlier nights (6 random subsets each of 20, 30 and 40 runs, replaying the other sweep, 10
#: orders): with 20–30 runs the lead cut the best in 1–4 of 6 subsets per pool (up to 6.7% regret), with 40
#: runs and three best runs in none of those (other draws did: ``calibrate.LEAD_TOP_MIN`` is 5 since §41);
#: the README example's seeds (20 runs each, two of 12 pairs cut before) are out of sample for it (BENCHMARKS
#: §40). An online reference has it from 42 completed trials on (its refit schedule), where it had it from 28.
LEAD_MIN_RUNS = 40


def paired_margin(
    surrogate: Surrogate, f: float, settings: PruneSettings, floor: float
) -> tuple[float, str] | None:
    """The margin (log-ratio) of the paired comparison at the common fraction ``f`` between trials whose
    controls differ, after the trial's first judgements, and its wording; None without a paired error model.

    The margin is t · scale · √(1 + 1/n) of the surrogate's learned paired error (``pair_bands``; t the
    Student-t quantile at ``settings.confidence``), never below ``floor`` (``sweep_margin``).
    """
    band = surrogate.pair_band(f)
    if band is None:
        return None
    learned = t_quantile(settings.confidence, band.n) * band.scale * math.sqrt(1 + 1 / band.n)
    return max(floor, learned), f"paired at t_hat={f:.3g}, at {settings.confidence:.0%}"


def _ahead_drift(
    f: float,
    fraction: float,
    value: float,
    mine_at_f: float | None,
    comps: list[float | Prediction | Competitor],
    at: Any,
    schedule: Schedule,
    surrogate: Surrogate | None,
) -> tuple[float, str] | None:
    """How far this trial's news since fraction ``f`` moves its comparison with a competitor last seen at f.

    The trial is at ``fraction`` = p > f. Its drift D = log(pred(p) / pred(f)) is how much its predicted final
    loss moved from its points up to f to all its points (the surrogate's collapse shape relates the two
    fractions). Part of D is the shape's error between f and p, shared by the sweep's trials, which the
    competitor, still at f, will see too; the rest is news about this trial. The shared part is estimated by
    the mean drift over f → p of the *witnesses*: the trial itself and up to ``AHEAD_WITNESSES`` competitors
    whose curves reach p on an LR decay the surrogate's paired errors cover for the trial's ``schedule``
    (``paired_decays``; without a surrogate the same schedule) (completed trials, running ones ahead of it;
    the last ones in ``comps``: the shape's error between two fractions moves with the LR schedule, and on a
    schedule sweep the drifts of WSD and constant-LR runs cut a linear best, BENCHMARKS §34). The shift
    returned is D − mean(D), in log units, added to the log-ratio compared at f, with the margin used at f:
    its error, ε_T(p) − ε_C(f) plus the mean of the witnesses' ε(f) − ε(p) (ε each prediction's own miss), has
    about the variance of the paired error at f it replaces. With no witness but the trial the shift is 0.

    ``at(f, t, y, schedule, tau, tpp, competitor)`` is ``_paired``'s memoized prediction from the points at
    t̂ <= f.
    Returns (shift, the reason's wording), or None when the trial's prediction at f failed.
    """
    if mine_at_f is None or mine_at_f <= 0 or value <= 0:
        return None
    own_drift = math.log(value / mine_at_f)
    drifts = [own_drift]
    witnesses = [
        c for c in comps
        if isinstance(c, Competitor) and c.schedule is not None and len(c.t_hat)
        and c.last_at(fraction) is not None and c.last_at(fraction) >= fraction - 1e-9
        and (paired_decays(surrogate, schedule, c.schedule) if surrogate is not None
             else same_schedule(schedule, c.schedule))
    ]
    witnesses = witnesses[max(0, len(witnesses) - AHEAD_WITNESSES):]
    for c in witnesses:
        ct, cy = c.arrays()
        then = at(f, ct, cy, c.schedule, c.tau, c.tpp, c)
        now = at(fraction, ct, cy, c.schedule, c.tau, c.tpp, c)
        if then is not None and now is not None and then > 0 and now > 0:
            drifts.append(math.log(now / then))
    shift = own_drift - float(np.mean(drifts))
    if len(drifts) == 1:
        return 0.0, (f"; this trial ran ahead to t_hat={fraction:.3g}: no other trial reached it, so its "
                     f"{100 * own_drift:+.2f}% predicted drift since is not told from the shape's")
    return shift, (f"; this trial ran ahead to t_hat={fraction:.3g}: its predicted final loss moved "
                   f"{100 * own_drift:+.2f}% since, the {len(drifts) - 1} other trial(s) that reached it "
                   f"{100 * float(np.mean(drifts[1:])):+.2f}% on average: {100 * shift:+.2f}% counted")


def paired_reason(
    what: str, value: float, theirs: float, margin: float, k: int, how: str, fraction: float, *, prune: bool
) -> str:
    """The paired rule's reason, in the user's terms: this trial's predicted (or current) final loss, the
    ``k``-th best competitor's on the same scale, how far ahead it is against the margin, how and at which
    fraction they were compared, and the fraction the decision was made at (this trial's latest report)."""
    lead = math.log(value / theirs) if value > 0 and theirs > 0 else math.nan
    who = "the best competitor" if k == 1 else f"the {_ordinal(k)} best competitor"
    ahead = f"{100 * lead:.2f}% ahead" if lead >= 0 else f"{100 * -lead:.2f}% behind"
    head = f"{what} {value:.4g}; {who}'s {theirs:.4g} is {ahead} ({how})"
    if prune:
        return f"{head}, more than the {100 * margin:.2f}% margin: pruned at t_hat={fraction:.3g}"
    if not lead >= 0:  # this trial leads: no margin to be within
        return f"{head}: kept at t_hat={fraction:.3g}"
    return f"{head}, within the {100 * margin:.2f}% margin: kept at t_hat={fraction:.3g}"


def _join(reason: str, notes: list[str]) -> str:
    return reason if not notes else f"{reason} ({'; '.join(notes)})"
