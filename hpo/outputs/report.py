"""Results of a sweep: the trial table (printed and CSV), the curves CSV, plots and the compute saved.

Everything is read from the Optuna study (the storage), so a report works on a finished, a running or an
interrupted sweep alike. Files (written atomically):

- ``results.csv``: one row per trial (columns `COLUMNS`, then one per searched parameter of the study that
  has no column of its own: `results_columns`). Progress is in the units the trial's pruner recorded:
  ``units`` (tokens, steps or fraction), ``total`` (the training length in them; 1 for a fraction) and
  ``trained`` (how far the trial got; t̂ for a fraction); ``total_tokens`` and ``tokens_trained`` repeat the
  two for a trial counted in tokens (the sweep runner's) and stay empty for one counted otherwise.
- ``curves.csv``: every trial's curve in the predictors CSV format (run, t_hat, loss, lr, tau, tpp; tpp empty
  when not defined, as in a ``total_tokens`` sweep).
- ``curves.png``: left, the loss curves over t̂ with each pruned trial's decision point, and its predicted
  final loss and interval in a column of its own just past t̂ = 1; right, the normalized curves ℓ = L / L(1)
  (L(1): the final loss, or the predicted one for a pruned trial) with the reference surrogate's
  collapsed curve when one is known.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collapse_hpo.hpo.extras import missing_note
from collapse_hpo.hpo.figures import pyplot, save_png
from collapse_hpo.hpo.outputs.dashboard import find_reference
from collapse_hpo.hpo.outputs.progress import human_tokens
from collapse_hpo.hpo.rule.record import (
    DECISION_ATTRS,
    ERROR_ATTR,
    FRACTION_STEPS,
    SAMPLER_STEP_ATTR,
    STUDY_REFERENCE_ATTR,
    TOKENS_TRAINED_ATTR,
    stored_total,
)
from collapse_hpo.predictors import spreadsheet
from collapse_hpo.predictors.atomic import check_writable_file
from collapse_hpo.predictors.curves import Curve, write_curves_csv
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.misfit import NOT_COLLAPSING, collapses
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import Surrogate

if TYPE_CHECKING:
    import optuna

#: The hyperparameter columns: a trial's user attr of that name (the sweep runner's derived values), else its
#: Optuna param of that name (a plain Optuna study searching ``weight_decay`` fills the λ column).
HYPERPARAMETER_COLUMNS = ("seed", "lr", "batch_tokens", "warmup", "weight_decay", "tau", "tpp")
COLUMNS = ("number", "state", "draw", "seed", "attempt", "lr", "batch_tokens", "warmup", "weight_decay",
           "tau", "tpp", "units", "total", "trained", "total_tokens", TOKENS_TRAINED_ATTR, "final_loss",
           *DECISION_ATTRS, ERROR_ATTR)
#: Where the searched parameters without a column of their own go in results.csv: after this column.
_PARAMS_AFTER = "weight_decay"
#: The table's heading of the progress column, per unit (a study of mixed units: "trained").
UNIT_HEADINGS = {"tokens": "tokens", "steps": "steps", "fraction": "t̂"}
#: The curves figure's x-axis label, per unit of the study.
UNIT_AXIS_LABELS = {
    "tokens": "t̂ (tokens seen / total tokens)",
    "steps": "t̂ (optimizer steps / total steps)",
    "fraction": "t̂ (fraction of training, as reported)",
    "mixed units": "t̂ (progress / training length, in each trial's own units)",
}
#: The curves figure's y-axis label where the study does not say which loss its trials reported (a plain
#: Optuna objective may report a validation loss); a sweep's trainer reports its training loss.
LOSS_LABEL = "loss (as reported)"
SWEEP_LOSS_LABEL = "training loss"


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(float(x)) else None


def _positive(x: Any) -> float | None:
    """A positive finite number, else None (e.g. ``tpp``: None = not defined)."""
    v = _num(x)
    return v if v is not None and v > 0 else None


@dataclass(frozen=True)
class Compute:
    """Compute of a sweep in its units (tokens for a sweep file's; `study_unpruned`): ``spent`` (all trials,
    failed attempts included) against ``unpruned`` (every planned trial trained to its end)."""

    spent: float
    unpruned: float

    @property
    def fraction(self) -> float:
        """spent / unpruned (0 when nothing is planned)."""
        return self.spent / self.unpruned if self.unpruned > 0 else 0.0

    @property
    def saved(self) -> float:
        """1 − fraction: the share of the unpruned compute not spent."""
        return 1.0 - self.fraction


def _trial_length(attrs: Any) -> tuple[float | None, str, bool]:
    """(training length, units, whether the trial recorded its units) of a stored trial: its ``total`` in its
    ``units`` (`stored_total`), except 1 for units "fraction", whose progress is shown as t̂ itself."""
    length, units = stored_total(attrs)
    if units == "fraction" and length is not None:
        length = 1.0
    return length, units, length is not None or "units" in attrs


def _common_units(units: set[str]) -> str:
    """The one unit of a study's trials; "tokens" when none recorded one, "mixed units" when they differ."""
    return next(iter(units)) if len(units) == 1 else "tokens" if not units else "mixed units"


def _count(x: Any) -> Any:
    """A count as an int when it is a whole number (200.0 → 200, for the CSV), else as it is."""
    v = _num(x)
    return int(v) if v is not None and v.is_integer() and abs(v) < 2**53 else x


def _trained(trial: Any, units: str) -> Any:
    """How far ``trial`` trained, in ``units`` (t̂ for "fraction"): the sweep trainer's ``tokens_trained`` for
    a trial counted in tokens, else its last reported step (the pruner's sampler point, which stands at the
    end of training, left out); None before its first report."""
    a = trial.user_attrs
    if units == "tokens" and _num(a.get(TOKENS_TRAINED_ATTR)) is not None:
        return a[TOKENS_TRAINED_ATTR]
    steps = [int(s) for s in trial.intermediate_values if s != a.get(SAMPLER_STEP_ATTR)]
    if not steps:
        return None
    return max(steps) / FRACTION_STEPS if units == "fraction" else max(steps)


#: Other names a study may search a column's hyperparameter under (Hugging Face's ``hyperparameter_search``
#: names the peak LR ``learning_rate``): the column shows it, and it gets no column of its own.
PARAM_ALIASES = {"lr": ("learning_rate",)}


def _hyperparameter(attrs: Any, params: dict[str, Any], name: str) -> Any:
    """A trial's value of ``name``: its user attr (the sweep runner's derived λ, τ, ...), else its param of
    that name or of an alias (`PARAM_ALIASES`)."""
    value = attrs.get(name)
    if value is not None:
        return value
    return next((params[n] for n in (name, *PARAM_ALIASES.get(name, ())) if n in params), None)


def trial_rows(study: optuna.Study) -> list[dict[str, Any]]:
    """One dict per trial (keys `COLUMNS`, and ``params``: the trial's Optuna params), by trial number;
    WAITING trials are left out. Progress (``units``, ``total``, ``trained``) is in the units the trial's
    pruner recorded; a trial that recorded none (e.g. one that failed before its first judgement) takes the
    study's."""
    import optuna

    trials = [t for t in sorted(study.get_trials(deepcopy=False), key=lambda tr: tr.number)
              if t.state != optuna.trial.TrialState.WAITING]
    lengths = {t.number: _trial_length(t.user_attrs) for t in trials}
    common = _common_units({u for length, u, _ in lengths.values() if length is not None})
    rows = []
    for t in trials:
        a, params = t.user_attrs, dict(t.params)
        length, units, recorded = lengths[t.number]
        if not recorded and common in UNIT_HEADINGS:
            units = common
        trained = _trained(t, units)
        tokens = a.get(TOKENS_TRAINED_ATTR, trained if units == "tokens" else None)
        total_tokens = a.get("total_tokens", length if units == "tokens" else None)
        row = {
            "number": t.number, "state": t.state.name, "draw": a.get("draw"), "attempt": a.get("attempt"),
            **{k: _hyperparameter(a, params, k) for k in HYPERPARAMETER_COLUMNS},
            "units": units, "total": _count(length), "trained": _count(trained),
            "total_tokens": _count(total_tokens), "tokens_trained": _count(tokens),
            "final_loss": t.value if t.state == optuna.trial.TrialState.COMPLETE else None,
            **{k: a.get(k) for k in (*DECISION_ATTRS, ERROR_ATTR)},
            "params": params,  # not a CSV column: those without a column get one (results_columns)
        }
        rows.append(row)
    return rows


def compute(study: optuna.Study, unpruned: float, units: str = "tokens") -> Compute:
    """Progress trained by every trial of the study against ``unpruned``, both in ``units`` (`study_unpruned`;
    tokens for a sweep). With "mixed units" each trial counts its share of its own training (t̂)."""
    rows = trial_rows(study)
    if units == "mixed units":
        spent = sum(float(r["trained"] or 0) / float(r["total"]) for r in rows if _positive(r["total"]))
    else:
        spent = sum(float(r["trained"] or 0) for r in rows)
    return Compute(spent, float(unpruned))


def best_row(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The COMPLETE trial with the lowest final loss (None without one)."""
    done = [r for r in rows if r["state"] == "COMPLETE" and _num(r["final_loss"]) is not None]
    return min(done, key=lambda r: r["final_loss"]) if done else None


def _fmt(x: Any, spec: str = ".4g") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


#: The params the table's own columns show (seed, lr, batch, λ, τ); each other searched param gets a column.
TABLE_PARAMS = ("draw", "seed", "lr", "batch_tokens", "weight_decay", "tau")


def searched_params(rows: list[dict[str, Any]], shown: tuple[str, ...]) -> list[str]:
    """The names of the trials' Optuna params (``row["params"]``) that no column in ``shown`` holds, in the
    order the trials first give them."""
    covered = {*shown, *(alias for name in shown for alias in PARAM_ALIASES.get(name, ()))}
    names: dict[str, None] = {}
    for r in rows:
        names.update(dict.fromkeys(k for k in (r.get("params") or {}) if k not in covered))
    return list(names)


def _progress_heading(rows: list[dict[str, Any]]) -> str:
    """The table's progress heading: the study's units ("tokens", "steps", "t̂"), or "trained" when its
    trials count in different units (each cell then names its own)."""
    units = {r.get("units") or "tokens" for r in rows}
    return UNIT_HEADINGS.get(units.pop(), "trained") if len(units) == 1 else "trained"


def _progress_cell(row: dict[str, Any], mixed: bool) -> str:
    """How far the trial trained, in its units: 1.2M (tokens), 40 (steps), 0.25 (t̂); with the unit named
    when the table mixes units."""
    units = row.get("units") or "tokens"
    x = _num(row.get("trained", row.get(TOKENS_TRAINED_ATTR)))
    if x is None:
        return "-"
    if units == "fraction":
        return f"t̂ {x:.2f}" if mixed else f"{x:.2f}"
    return f"{human_tokens(x)} {units}" if mixed else human_tokens(x)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The results table as text: one line per trial, the best marked with ``*``; a column per searched
    param that the table's own columns do not show, and the progress column in the study's units."""
    best = best_row(rows)
    extra = searched_params(rows, TABLE_PARAMS)
    progress = _progress_heading(rows)
    head = ["", "trial", "state", "draw", "seed", "lr", "batch", "λ", *extra, "τ", progress, "final",
            "predicted", "interval", "at t̂", "note"]
    lines = []
    for r in rows:
        note = r["error"] if r["state"] == "FAIL" else (r["prune_reason"] if r["state"] == "PRUNED" else "")
        params = r.get("params") or {}
        lines.append([
            "*" if best is not None and r["number"] == best["number"] else "", str(r["number"]), r["state"],
            _fmt(r["draw"]), _fmt(r["seed"]), _fmt(r["lr"], ".3g"), _fmt(r["batch_tokens"]),
            _fmt(r["weight_decay"], ".3g"), *(_fmt(params.get(k), ".3g") for k in extra),
            _fmt(r["tau"], ".3g"), _progress_cell(r, progress == "trained"), _fmt(r["final_loss"], ".4f"),
            *_prediction_cells(r),
            _fmt(r["decision_fraction"], ".2f"), short_note(str(note or "")),
        ])
    widths = [max(len(h), *(len(x[i]) for x in lines)) if lines else len(h) for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    out += ["  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip() for x in lines]
    return "\n".join(out)


#: Characters of the table's "note" cell; results.csv has the whole reason.
NOTE_WIDTH = 60
_PREDICTED_LEAD = re.compile(r"^predicted final loss \S+; ")


def short_note(text: str, width: int = NOTE_WIDTH) -> str:
    """A pruned trial's reason (or a failed one's error) for the table's note cell: without the leading
    "predicted final loss X; " (the table's own columns hold it), cut at a word boundary with "…" when longer
    than ``width``, so that no number is cut in half."""
    text = _PREDICTED_LEAD.sub("", text.strip())
    if len(text) <= width:
        return text
    cut = text[: width - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > width // 2 else cut).rstrip(" ,;(") + "…"


def _prediction_cells(row: dict[str, Any]) -> tuple[str, str]:
    """The table's "predicted" and "interval" cells: the point and its shown interval; for a curve that does
    not collapse onto the reference shape, the flag instead of the point (the interval is the widened one)."""
    pred, lo, hi = (_num(row.get(k)) for k in ("predicted_final_loss", "predicted_low", "predicted_high"))
    interval = f"{lo:.3f}-{hi:.3f}" if lo is not None and hi is not None else "-"
    if pred is None:
        return "-", interval
    return (f"{pred:.4f}" if collapses(_num(row.get("predicted_misfit"))) else NOT_COLLAPSING), interval


def summary_lines(rows: list[dict[str, Any]], comp: Compute, units: str = "tokens", *,
                  finished: bool = True) -> list[str]:
    """The best trial and the compute saved, as printed at the end of a sweep. ``units``: what ``comp``
    counts (a study made outside a sweep may count optimizer steps or fractions of training). A sweep not
    ``finished`` (stopped, trials still to run) shows what it spent so far and no saving: the share not
    trained is not saved yet."""
    best = best_row(rows)
    counts = {s: sum(1 for r in rows if r["state"] == s) for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING")}
    lines = [", ".join(f"{v} {k.lower()}" for k, v in counts.items() if v) or "no trials"]
    if best is not None and best["draw"] is not None and _num(best["lr"]) is not None:  # a sweep's trial
        lines.append(f"best: trial {best['number']} (draw {best['draw']}, seed {best['seed']}) "
                     f"lr={best['lr']:.4g} "
                     f"batch_tokens={best['batch_tokens']} final_loss={best['final_loss']:.4f}")
    elif best is not None:  # a study made outside a sweep: its own parameters
        params = " ".join(f"{k}={_fmt(v)}" for k, v in (best.get("params") or {}).items())
        lines.append(f"best: trial {best['number']} {params} final_loss={best['final_loss']:.4f}".replace(
            "  ", " "))

    share = f"{100 * comp.fraction:.1f}% of the unpruned sweep"
    share += f"; {100 * comp.saved:.1f}% saved" if finished else " so far; not finished, so nothing saved yet"
    if units == "tokens":
        lines.append(f"compute: {human_tokens(comp.spent)} of {human_tokens(comp.unpruned)} tokens ({share})")
    elif units in ("fraction", "mixed units"):  # no common unit to count in: the share only
        lines.append(f"compute: {share}")
    else:
        lines.append(f"compute: {comp.spent:.4g} of {comp.unpruned:.4g} {units} ({share})")
    return lines


def study_unpruned(study: optuna.Study) -> tuple[float, str]:
    """(length of training every trial to its end, its units) for a study made outside a sweep file: the
    sum of the trials' stored training lengths (``total``/``units``, or ``total_tokens``, as the pruner and
    the Ray scheduler's mirror record them). Units are ``"tokens"``, ``"steps"`` or ``"fraction"`` (each
    trial's length 1: its progress is t̂), or ``"mixed units"`` when the trials count differently (then each
    trial's length is 1 too, as in `compute`)."""
    import optuna

    total, units, counted = 0.0, set(), 0
    for t in study.get_trials(deepcopy=False):
        if t.state == optuna.trial.TrialState.WAITING:
            continue
        length, unit, _ = _trial_length(t.user_attrs)
        if length is not None:
            total, counted = total + length, counted + 1
            units.add(unit)
    common = _common_units(units)
    return (float(counted) if common == "mixed units" else total), common


def results_columns(rows: list[dict[str, Any]]) -> dict[str, str | None]:
    """results.csv's columns, each with the param it holds (None: a column of `COLUMNS`): `COLUMNS`, with
    every searched param that has no column of its own (e.g. a plain Optuna study's ``dropout``) after
    ``weight_decay``, named as the study names it (``param_`` before a name another column has)."""
    extra = {(f"param_{name}" if name in COLUMNS else name): name
             for name in searched_params(rows, HYPERPARAMETER_COLUMNS)}
    i = COLUMNS.index(_PARAMS_AFTER) + 1
    return {**dict.fromkeys(COLUMNS[:i]), **extra, **dict.fromkeys(COLUMNS[i:])}


def write_results_csv(path: str | os.PathLike[str], rows: list[dict[str, Any]]) -> None:
    """Write the trial rows as CSV (columns `results_columns`), atomically."""
    columns = results_columns(rows)

    def cells(r: dict[str, Any]) -> dict[str, Any]:
        params = r.get("params") or {}
        values = {c: (r.get(c) if p is None else params.get(p)) for c, p in columns.items()}
        return {c: ("" if v is None else v) for c, v in values.items()}

    spreadsheet.write_csv(path, tuple(columns), (cells(r) for r in rows))


def trial_curves(study: optuna.Study) -> list[Any]:
    """Every trial's curve as a predictors `Curve` (run ``trial<N>``; t̂ = step / total, in its units)."""
    import numpy as np

    curves = []
    for t in sorted(study.get_trials(deepcopy=False), key=lambda tr: tr.number):
        a = t.user_attrs
        total = stored_total(a)[0]  # t̂ = step / total, in the trial's units
        if not t.intermediate_values or total is None:
            continue
        skip = a.get(SAMPLER_STEP_ATTR)
        items = sorted((int(s), float(v)) for s, v in t.intermediate_values.items() if s != skip)
        steps = np.array([s for s, _ in items], dtype=float)
        loss = np.array([v for _, v in items], dtype=float)
        sched = Schedule.parse(a.get("schedule"))
        curves.append(Curve(run=f"trial{t.number}", t_hat=steps / total, loss=loss, schedule=sched,
                            tau=_num(a.get("tau")), tpp=_positive(a.get("tpp")),
                            meta={"state": t.state.name, "number": t.number}))
    return curves


def _reference_surrogate(study: optuna.Study, reference_path: Path | None) -> Any:
    try:
        if reference_path is not None and reference_path.is_file():
            return Surrogate.load(reference_path)
        stored = study.user_attrs.get(STUDY_REFERENCE_ATTR)
        if isinstance(stored, dict) and stored.get("surrogate"):
            return Surrogate.from_dict(stored["surrogate"], source="study attr")
    except InputError:
        return None
    return find_reference(study)[0]  # what the pruner or the mirror recorded


#: Width in t̂ of each pruned trial's column of the curves figure, right of t̂ = 1: its predicted final loss
#: and interval; narrower when there are many (all the columns together span at most PREDICTION_AREA).
PREDICTION_COLUMN = 0.012
PREDICTION_AREA = 0.2


def plot_curves(path: str | os.PathLike[str], study: optuna.Study, reference_path: Path | None = None,
                title: str = "", *, units: str | None = None, loss_label: str = LOSS_LABEL) -> None:
    """Write the curves figure (PNG, atomically): raw curves with predictions and decision points, and the
    normalized curves with the reference collapsed curve. ``units``: what the trials' progress counts (the
    x-axis says so; None: the study's, `study_unpruned`); ``loss_label``: the y-axis, which loss the trials
    reported (`LOSS_LABEL` where the study does not say)."""
    import numpy as np

    plt = pyplot()
    if units is None:
        units = study_unpruned(study)[1]

    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    curves = trial_curves(study)
    fig, (ax, axn) = plt.subplots(1, 2, figsize=(13, 5))
    colors = {"COMPLETE": "tab:blue", "PRUNED": "tab:orange", "FAIL": "tab:red", "RUNNING": "tab:gray"}
    best = study.best_trial.number if any(t.state.name == "COMPLETE" for t in trials.values()) else None
    surrogate = _reference_surrogate(study, reference_path)
    untrusted = 0  # pruned trials whose curve does not collapse (no L(1) to normalize by)
    # Each pruned trial's prediction stands in its own column just right of t̂ = 1 (in trial order), so that
    # the intervals do not overlap into one bar.
    shown = [c.meta["number"] for c in curves if c.meta["state"] == "PRUNED"
             and _num(trials[c.meta["number"]].user_attrs.get("predicted_final_loss")) is not None]
    width = min(PREDICTION_COLUMN, PREDICTION_AREA / max(len(shown), 1))
    column = {n: 1.0 + width * (k + 1) for k, n in enumerate(shown)}
    for c in curves:
        t = trials[c.meta["number"]]
        state = c.meta["state"]
        a = t.user_attrs
        color = "tab:green" if t.number == best else colors.get(state, "tab:gray")
        lw = 2.2 if t.number == best else 1.0
        ok = np.isfinite(c.loss)
        ax.plot(c.t_hat[ok], c.loss[ok], color=color, lw=lw, alpha=0.85)
        pred = _num(a.get("predicted_final_loss"))
        frac = _num(a.get("decision_fraction"))
        trusted = collapses(_num(a.get("predicted_misfit")))
        if state == "PRUNED" and pred is not None:
            x = column[t.number]
            lo, hi = _num(a.get("predicted_low")), _num(a.get("predicted_high"))
            if lo is not None and hi is not None:
                ax.vlines([x], lo, hi, color=color, lw=1.0 if trusted else 2.5, alpha=0.6)
                ax.hlines([lo, hi], x - width / 3, x + width / 3, color=color,
                          lw=1.0, alpha=0.6)
            if trusted:
                ax.plot([x], [pred], "o", color=color, ms=4, alpha=0.8)
                ax.plot([c.t_hat[ok][-1], x], [c.loss[ok][-1], pred], ls=":", color=color, lw=0.8)
            else:  # no confident point: an open marker, and the flag next to the widened interval
                ax.plot([x], [pred], "o", mfc="none", color=color, ms=5, alpha=0.8)
                ax.annotate(NOT_COLLAPSING, (x, hi if hi is not None else pred), fontsize=7, color=color,
                            xytext=(-4, 2), textcoords="offset points", ha="right")
                untrusted += 1
        if state == "PRUNED" and frac is not None and ok.any():
            i = int(np.argmin(np.abs(c.t_hat - frac)))
            ax.plot([c.t_hat[i]], [c.loss[i]], "x", color="k", ms=6)
        final = t.value if state == "COMPLETE" else (pred if trusted else None)
        if final is not None and final > 0:
            axn.plot(c.t_hat[ok], c.loss[ok] / final, color=color, lw=lw, alpha=0.7)
    if surrogate is not None and curves:
        ref = curves[0]
        grid = np.linspace(0.02, 1.0, 200)
        try:
            shape = surrogate.normalized(grid, ref.schedule, ref.tau, ref.tpp)
            axn.plot(grid, shape, color="k", lw=2, ls="--", label="reference (surrogate)")
        except Exception:  # a reference that cannot be drawn for these controls is left out of the figure
            pass
    from matplotlib.lines import Line2D

    legend = [Line2D([], [], color="tab:green", lw=2.2, label="best"),
              Line2D([], [], color="tab:blue", label="complete"),
              Line2D([], [], color="tab:orange",
                     label="pruned (x decision; • predicted final, | interval: a column each past t̂ 1)"),
              Line2D([], [], color="tab:red", label="failed")]
    if untrusted:
        legend.append(Line2D([], [], color="tab:orange", marker="o", mfc="none", lw=2.5,
                             label=f"pruned, {NOT_COLLAPSING} (widened interval; not normalized)"))
    ax.legend(handles=legend, fontsize=8)
    if shown:
        ax.set_xlim(right=max(column.values()) + 2 * width)
    ax.set_xlabel(UNIT_AXIS_LABELS.get(units, "t̂"))
    ax.set_ylabel(loss_label)
    ax.set_title(f"{title} loss curves".strip())
    lows = [float(np.nanmin(c.loss[np.isfinite(c.loss)])) for c in curves if np.isfinite(c.loss).any()]
    if lows:
        # up to 1.6× the lowest loss, raised to show every curve's last loss and every pruned trial's
        # prediction (pruned curves end high), but never past 4× (a diverged curve would flatten the rest)
        tops = [min(lows) * 1.6]
        for c in curves:
            ok = np.isfinite(c.loss)
            if ok.any():
                tops.append(float(c.loss[ok][-1]))
            a = trials[c.meta["number"]].user_attrs
            tops += [v for v in (_num(a.get("predicted_final_loss")), _num(a.get("predicted_high")))
                     if c.meta["state"] == "PRUNED" and v is not None]
        ax.set_ylim(min(lows) * 0.97, min(max(tops) * 1.03, min(lows) * 4.0))
    axn.set_xlabel("t̂")
    axn.set_ylabel("ℓ = L / L(1)  (L(1) predicted for pruned trials)")
    axn.set_ylim(0.95, 1.6)
    axn.set_xlim(0.1, 1.0)
    if surrogate is not None:
        axn.legend(fontsize=8)
    axn.set_title("normalized (collapsed) curves")
    fig.tight_layout()
    save_png(fig, path, dpi=110)


REPORT_FILES = ("results.csv", "curves.csv", "curves.png")


def check_report_outputs(results_dir: str | os.PathLike[str]) -> None:
    """Check every file `write_report` writes into ``results_dir`` before any is written (InputError naming
    the first that cannot be: a device, a FIFO, a folder, an unwritable folder)."""
    for name in REPORT_FILES:
        check_writable_file(Path(results_dir) / name, "report")


def write_report(study: optuna.Study, results_dir: str | os.PathLike[str], unpruned: float,
                 reference_path: Path | None = None, title: str = "", *, units: str = "tokens",
                 sweep: bool = True) -> tuple[str, list[str]]:
    """Write results.csv, curves.csv and curves.png into ``results_dir``; return (table, summary lines).

    ``unpruned`` is in ``units`` (`summary_lines`); ``sweep=False`` for a study made outside a sweep file
    (plain Optuna, Ray Tune's mirror, Hugging Face): no `collapse-hpo resume` hint, and the figure's loss is
    "as reported" (a sweep's trainer reports its training loss; another objective may report any loss).

    Without matplotlib (a core install: it comes with the ``dashboard`` extra) the figure is left out and a
    summary line says which extra draws it; the table and the CSV files do not need it."""
    out = Path(results_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_report_outputs(out)
    rows = trial_rows(study)
    write_results_csv(out / "results.csv", rows)
    curves = trial_curves(study)
    no_figure = missing_note("the figure curves.png", "matplotlib")
    if curves:
        write_curves_csv(out / "curves.csv", curves)
        if no_figure is None:
            plot_curves(out / "curves.png", study, reference_path, title, units=units,
                        loss_label=SWEEP_LOSS_LABEL if sweep else LOSS_LABEL)
    import optuna

    waiting = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))
    def slot(t: optuna.trial.FrozenTrial) -> tuple[Any, Any]:
        return t.user_attrs.get("draw", t.number), t.user_attrs.get("seed", 0)

    trials = study.get_trials(deepcopy=False)
    live = {slot(t) for t in trials if t.state != optuna.trial.TrialState.FAIL}
    interrupted = len({slot(t) for t in trials if t.user_attrs.get("interrupted")} - live)
    running = any(r["state"] == "RUNNING" for r in rows)
    comp = compute(study, unpruned, units)
    lines = summary_lines(rows, comp, units, finished=not (waiting or interrupted or running))
    if sweep and (waiting or interrupted):
        lines.append(f"the sweep is not finished ({waiting} planned trials not started, {interrupted} "
                     "interrupted): continue it with `collapse-hpo resume`")
    if no_figure is None:
        lines.append(f"files: {out / 'results.csv'}, {out / 'curves.csv'}, {out / 'curves.png'}")
    else:
        lines.append(f"files: {out / 'results.csv'}, {out / 'curves.csv'} ({no_figure})")
    return format_table(rows), lines
