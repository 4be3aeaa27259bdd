"""Review a sweep in optuna-dashboard: a study figure of the collapsed curves, and a note per trial.

``publish(study)`` writes into the study's storage (so any optuna-dashboard on that storage shows them):

- a study-level plotly figure (``optuna_dashboard.save_plotly_graph_object``, id ``collapse-curves``): every
  trial's normalized curve ℓ(t̂) = L(t̂)/L(1), divided by its final loss when it completed and by its
  *predicted* final loss when it was pruned or is running (dashed; a marker where the pruner decided), with
  the reference surrogate's ℓ̂(t̂) for the trials' controls (thick grey, under the curves). On a τ-held sweep
  with a good reference the curves collapse onto the grey line; a pruned curve that does not was judged on a
  poor fit.
- a study note (``optuna_dashboard.save_note``) with the counts, the best trial and the compute used;
- a note per trial with its prediction: predicted final loss and interval, the fraction of training at the
  decision, the reason, and (completed trials) the final loss against what was predicted for it.

The user attrs the pruner and the Ray scheduler write (``predicted_final_loss``, ``predicted_low``,
``predicted_high``, ``decision_fraction``, ``prune_reason``) are shown by the dashboard as they are.

Serving it (``collapse-hpo dashboard``: who may reach it, read-only, threads) is
hpo/outputs/dashboard_server.py.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from collapse_hpo.hpo.rule.record import (
    SAMPLER_STEP_ATTR,
    STUDY_REFERENCE_ATTR,
    USED_REFERENCE_ATTR,
    TrialControls,
    read_log,
    stored_total,
    trial_curve,
)
from collapse_hpo.hpo.rule.reference import make_reference
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.misfit import NOT_COLLAPSING, collapses, prediction_text
from collapse_hpo.predictors.surrogate import Surrogate

if TYPE_CHECKING:
    import optuna
    import plotly.graph_objects as go

FIGURE_ID = "collapse-curves"
_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")


@dataclass(frozen=True)
class Published:
    """What ``publish`` wrote: the figure id, how many trial notes, and the reference label (or why none)."""

    figure_id: str
    trial_notes: int
    reference: str


@dataclass(frozen=True)
class _TrialView:
    number: int
    state: str
    t_hat: np.ndarray
    loss: np.ndarray
    divisor: float | None  # final loss (complete) or predicted final loss (otherwise)
    predicted: bool
    controls: TrialControls
    collapses: bool = True  # False: the predicted divisor comes from a curve that does not collapse


def find_reference(study: optuna.Study, reference: Any = None) -> tuple[Surrogate | None, str]:
    """The surrogate to draw as the reference curve, and its label (or why there is none).

    In order: ``reference`` (anything ``make_reference`` takes); the reference the decision logs name (the
    latest judgement's ``reference``): the study's online fit (user attr ``collapse_reference``) or the fixed
    surrogate the pruner recorded (user attr ``collapse_reference_used``); the surrogate file named by the
    sweep (user attr ``sweep_config``), if it exists.
    """
    problem = ""
    if reference is not None:
        try:
            return make_reference(reference).get(study, TrialControls())
        except InputError as err:  # e.g. a moved surrogate file: fall back to what the study recorded
            problem = f"{err}; "
    logged = _logged_reference(study)
    stored = study.user_attrs.get(STUDY_REFERENCE_ATTR)
    if (logged is None or logged.startswith("online:")) and isinstance(stored, dict) \
            and isinstance(stored.get("surrogate"), dict):
        try:
            trials = ",".join(str(n) for n in stored.get("trials") or [])
            return Surrogate.from_dict(stored["surrogate"], source="study attr collapse_reference"), (
                f"{problem}online:{trials}"
            )
        except InputError:
            pass
    used = study.user_attrs.get(USED_REFERENCE_ATTR)
    if isinstance(used, dict) and isinstance(used.get("surrogate"), dict) and (
        logged is None or used.get("label") == logged
    ):
        try:
            surrogate = Surrogate.from_dict(used["surrogate"], source=f"study attr {USED_REFERENCE_ATTR}")
            return surrogate, f"{problem}{used.get('label')}"
        except InputError:
            pass
    sweep = study.user_attrs.get("sweep_config")
    ref = (((sweep or {}).get("pruner") or {}).get("reference") or {}) if isinstance(sweep, dict) else {}
    path = ref.get("surrogate") if isinstance(ref, dict) else None
    if isinstance(path, str) and Path(os.path.expanduser(path)).is_file():
        try:
            return Surrogate.load(os.path.expanduser(path)), f"{problem}file:{Path(path).name}"
        except InputError as err:
            return None, f"{problem}{err}"
    if logged is not None:
        return None, f"{problem}the decision logs name {logged!r}, but its surrogate is not in the study"
    return None, f"{problem}no trial was judged yet, so no reference is recorded"


def _logged_reference(study: optuna.Study) -> str | None:
    """The reference label of the latest judgement in the trials' decision logs (None without any)."""
    for t in reversed(study.get_trials(deepcopy=False)):
        for entry in reversed(read_log(t.user_attrs)):
            if entry.reference:
                return entry.reference
    return None


def _views(study: optuna.Study, defaults: TrialControls) -> list[_TrialView]:
    import optuna

    TS = optuna.trial.TrialState
    views = []
    for t in study.get_trials(deepcopy=False):
        if t.state not in (TS.COMPLETE, TS.PRUNED, TS.RUNNING) or not t.intermediate_values:
            continue
        try:
            curve = trial_curve(t, defaults)
            controls = defaults.merged(t.user_attrs, f"trial {t.number}")
        except InputError:
            continue
        if curve is None:
            continue
        divisor: float | None
        if t.state == TS.COMPLETE and t.user_attrs.get(SAMPLER_STEP_ATTR) is None and _finite(t.value):
            divisor, predicted = float(t.value), False
        else:
            p = t.user_attrs.get("predicted_final_loss")
            divisor, predicted = (float(p) if _finite(p) else None), True
        mis = t.user_attrs.get("predicted_misfit")
        trusted = not predicted or collapses(float(mis) if _finite(mis) else None)
        views.append(
            _TrialView(t.number, t.state.name, curve.t_hat, curve.loss, divisor, predicted, controls, trusted)
        )
    return views


def curves_figure(study: optuna.Study, surrogate: Surrogate | None = None, label: str = "",
                  defaults: TrialControls | None = None) -> go.Figure:
    """The study figure: normalized curves (solid: complete, dashed: pruned/running) and the reference ℓ̂.

    A trial without a final or predicted final loss has no divisor and is left out (the legend says so).
    """
    import plotly.graph_objects as go

    defaults = defaults or TrialControls()
    fig = go.Figure()
    views = _views(study, defaults)
    left_out = [v.number for v in views if v.divisor is None or v.divisor <= 0]
    # the reference first, so that the trials' curves are drawn on top of it
    if surrogate is not None:
        # one reference curve per legend label: controls that print alike (τ from B/(ηλD) differs in its
        # last digits from trial to trial) draw the same curve
        groups: dict[str, TrialControls] = {}
        for v in views:
            groups.setdefault(_reference_name(v.controls), v.controls)
        grid = np.linspace(0.02, 1.0, 200)
        for j, (name, c) in enumerate(list(groups.items())[:5]):
            try:
                shape = surrogate.normalized(grid, c.schedule, c.tau, c.tpp)
            except (InputError, ValueError):
                continue
            fig.add_trace(go.Scatter(
                x=grid.tolist(), y=np.asarray(shape).tolist(), mode="lines",
                name=name,
                line={"color": "#444444", "width": 5 if j == 0 else 3, "dash": "solid" if j == 0 else "dot"},
                opacity=0.5,
            ))
    for i, v in enumerate(v for v in views if v.divisor is not None and v.divisor > 0):
        color = _COLORS[i % len(_COLORS)]
        ok = np.isfinite(v.loss)
        how = "÷ predicted final" if v.predicted else "÷ final"
        flag = "" if v.collapses else f", {NOT_COLLAPSING}"
        if not v.collapses:
            how += f" ({NOT_COLLAPSING}: unreliable)"
        fig.add_trace(go.Scatter(
            x=v.t_hat[ok].tolist(), y=(v.loss[ok] / v.divisor).tolist(), mode="lines",
            name=f"trial {v.number} ({v.state.lower()}{flag})",
            line={"color": color, "dash": ("dash" if v.collapses else "dot") if v.predicted else "solid",
                  "width": 1.5},
            hovertemplate=(
                f"trial {v.number} {how} {v.divisor:.4g}<br>t̂=%{{x:.3f}} ℓ=%{{y:.4f}}<extra></extra>"
            ),
        ))
        if v.predicted and v.t_hat[ok].size:
            fig.add_trace(go.Scatter(
                x=[v.t_hat[ok][-1]], y=[v.loss[ok][-1] / v.divisor], mode="markers", showlegend=False,
                marker={"color": color, "symbol": "x", "size": 9},
                hovertemplate=f"trial {v.number}: decision at t̂=%{{x:.3f}}<extra></extra>",
            ))
    title = "Collapsed curves: loss / final loss (dashed: ÷ predicted final loss)"
    sub = f"reference: {label}" if label else ""
    if left_out:
        sub += ("; " if sub else "") + f"no final or predicted loss: trials {', '.join(map(str, left_out))}"
    fig.update_layout(
        title={"text": title + (f"<br><sup>{sub}</sup>" if sub else "")},
        xaxis_title="t̂ (tokens seen / total tokens)", yaxis_title="ℓ = L(t̂) / L(1)",
        template="plotly_white",
        # outside the plot, right of it (plotly widens the right margin for it): with 20 trials and 5
        # reference curves it is taller than the plot and scrolls, and never covers a curve; a click on an
        # entry hides that curve, a double click shows it alone
        legend={"font": {"size": 10}, "x": 1.02, "xanchor": "left", "y": 1.0, "yanchor": "top",
                "itemclick": "toggle", "itemdoubleclick": "toggleothers"},
    )
    fig.update_yaxes(range=[0.95, 1.6])
    return fig


def _reference_name(c: TrialControls) -> str:
    """The legend label of the reference curve for controls ``c``."""
    tau = "no decay" if c.tau is None else f"τ={c.tau:.3g}"
    tpp = "" if c.tpp is None else f", TPP={c.tpp:.3g}"
    return f"reference ℓ̂ ({c.schedule.kind}, {tau}{tpp})"


def trial_note(trial: optuna.trial.FrozenTrial) -> str:
    """The Markdown note of one trial: its prediction, decision and outcome (from its user attrs)."""
    a = trial.user_attrs
    rows: list[tuple[str, str]] = [("state", trial.state.name)]
    pred = a.get("predicted_final_loss")
    if _finite(pred):
        lo, hi = a.get("predicted_low"), a.get("predicted_high")
        interval = f" (interval {lo:.4f} to {hi:.4f})" if _finite(lo) and _finite(hi) else ""
        mis = a.get("predicted_misfit")
        if collapses(float(mis) if _finite(mis) else None):
            rows.append(("predicted final loss", f"**{pred:.4f}**{interval}"))
        else:  # never a bold, confident number for a curve that does not collapse
            rows.append(("predicted final loss", prediction_text(
                pred, lo if _finite(lo) else None, hi if _finite(hi) else None, float(mis))))
    else:
        rows.append(("predicted final loss", "none"))
    frac = a.get("decision_fraction")
    if _finite(frac):
        rows.append(("decided at", f"t̂ = {frac:.3f} (fraction of training)"))
    if trial.state.name == "COMPLETE" and _finite(trial.value):
        text = f"{trial.value:.4f}"
        if _finite(pred):
            text += f" (prediction error {100.0 * (pred - trial.value) / trial.value:+.2f}%)"
        rows.append(("final loss", text))
    total, units = stored_total(a)  # the training length in the trial's units
    done = a.get("tokens_trained") if units == "tokens" else None
    if not _finite(done) and units != "fraction":
        steps = [s for s in trial.intermediate_values if s != a.get(SAMPLER_STEP_ATTR)]
        done = max(steps) if steps else None
    if _finite(done) and _finite(total) and total > 0:
        rows.append((f"{units} trained", f"{done:,.0f} of {total:,.0f} ({100.0 * done / total:.0f}%)"))
    reason = a.get("prune_reason")
    if reason:
        rows.append(("reason", str(reason).replace("|", "/")))
    lines = [f"### Collapse prediction, trial {trial.number}", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines) + "\n"


def study_note(study: optuna.Study, label: str) -> str:
    """The Markdown study note: counts, the best trial, compute used, and where the figure is."""
    import optuna

    trials = study.get_trials(deepcopy=False)
    TS = optuna.trial.TrialState
    count = {s: sum(t.state == s for t in trials) for s in (TS.COMPLETE, TS.PRUNED, TS.RUNNING, TS.FAIL)}
    lines = [f"## {study.study_name}: collapse-based pruning", ""]
    lines.append(f"{count[TS.COMPLETE]} complete, {count[TS.PRUNED]} pruned, {count[TS.RUNNING]} running, "
                 f"{count[TS.FAIL]} failed.")
    done = [t for t in trials if t.state == TS.COMPLETE and _finite(t.value)]
    if done:
        best = min(done, key=lambda t: t.value)
        lines.append(f"Best: trial {best.number}, final loss {best.value:.4f}.")
    used = total = 0.0
    for t in trials:
        tt, units = stored_total(t.user_attrs)  # the training length in the trial's units
        tok = t.user_attrs.get("tokens_trained") if units == "tokens" else None
        if not _finite(tt) or t.state not in (TS.COMPLETE, TS.PRUNED):
            continue
        if not _finite(tok):
            steps = [s for s in t.intermediate_values if s != t.user_attrs.get(SAMPLER_STEP_ATTR)]
            tok = max(steps) if steps else 0
        used, total = used + min(float(tok), float(tt)), total + float(tt)
    if total > 0:
        lines.append(f"Compute: {100.0 * used / total:.0f}% of the training of every finished trial to the "
                     "end.")
    lines += ["", f"Reference curve: {label}.", "The figure *Collapsed curves* on this study's page shows "
              "every normalized curve with the reference; each trial's note has its prediction."]
    return "\n".join(lines) + "\n"


def publish(
    study: optuna.Study, *, reference: Any = None, defaults: TrialControls | None = None
) -> Published:
    """Write the study figure, the study note and a note per judged or finished trial into the storage.

    Args:
        study: the sweep's study (any storage optuna-dashboard can open).
        reference: the reference surrogate (anything ``make_reference`` takes); default: what the study
            recorded (see ``find_reference``).
        defaults: trial controls for trials without control attrs.

    Notes are rewritten only when their text changed. Returns what was written.
    """
    from optuna_dashboard import get_note, save_note, save_plotly_graph_object

    surrogate, label = find_reference(study, reference)
    fig = curves_figure(study, surrogate, label, defaults)
    save_plotly_graph_object(study, fig, graph_object_id=FIGURE_ID)
    _save_if_changed(study, study_note(study, label), get_note, save_note)
    n = 0
    import optuna

    for t in study.get_trials(deepcopy=False):
        if t.state == optuna.trial.TrialState.WAITING:
            continue
        if not t.state.is_finished() and "prune_reason" not in t.user_attrs:
            continue
        # FrozenTrial._trial_id (private Optuna API): optuna-dashboard's save_note takes a Trial, and a Trial
        # is built from the storage id only. tests/test_private_apis.py fails loudly if Optuna renames it.
        handle = optuna.trial.Trial(study, t._trial_id)
        if _save_if_changed(handle, trial_note(t), get_note, save_note):
            n += 1
    return Published(FIGURE_ID, n, label)


def _save_if_changed(
    target: Any, body: str, get_note: Callable[..., str], save_note: Callable[..., None]
) -> bool:
    try:
        if get_note(target) == body:
            return False
    except (KeyError, ValueError):
        pass
    save_note(target, body)
    return True


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
