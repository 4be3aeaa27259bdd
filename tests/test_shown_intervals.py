"""Honest predictions on screen (issue 13, item 3): a partial curve that does not collapse onto the reference
shape gets a wide interval that holds its true final loss and the "does not collapse" note, everywhere it is
shown; a collapsing curve keeps its narrow interval; the decisions do not move.

Real curves: the reference surrogate is calibrated on the collapse family (studies/bench/artifacts), the
collapsing curve is the best run of the τ-held LR sweep, and the curves that do not collapse are a high-LR run
(LR 0.16, beyond the sweep's range: it stalls at a loss far above what the reference shape predicts) and the
LR sweep's run with a loss spike from t̂ = 0.25 on (it rises by 15% and stays there).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from collapse_hpo.hpo.rule.decision import Competitor, PruneSettings, decide
from collapse_hpo.hpo.rule.record import DecisionEntry, latest_prediction
from collapse_hpo.predictors.calibrate import calibrate
from collapse_hpo.predictors.curves import Curve, read_curves_csv
from collapse_hpo.predictors.misfit import MISFIT_LIMIT, NOT_COLLAPSING
from collapse_hpo.predictors.predict import predict_final_loss
from collapse_hpo.predictors.surrogate import Surrogate

ARTIFACTS = Path(__file__).resolve().parents[1] / "studies" / "bench" / "artifacts"


@pytest.fixture(scope="module")
def reference() -> Surrogate:
    return calibrate(read_curves_csv(ARTIFACTS / "curves_collapse_tau_full.csv")).surrogate


@pytest.fixture(scope="module")
def curves() -> dict[str, Curve]:
    out = {c.run: c for c in read_curves_csv(ARTIFACTS / "curves_lr_tau_full.csv")}
    out.update({c.run: c for c in read_curves_csv(ARTIFACTS / "curves_lr_high_full.csv")})
    return out


def _points(c: Curve) -> tuple[np.ndarray, np.ndarray]:
    ok = np.isfinite(c.loss)
    return c.t_hat[ok], c.loss[ok].copy()


def _spiked(c: Curve) -> tuple[np.ndarray, np.ndarray, float]:
    """The curve with a loss spike: from t̂ = 0.25 the loss rises by 15% until 0.4 and stays there."""
    t, y = _points(c)
    base = float(np.interp(0.25, t, y))
    y = np.where(t > 0.25, base * (1 + 0.15 * np.clip((t - 0.25) / 0.15, 0, 1)), y)
    return t, y, float(y[-1])


def _predict(reference, c, t, y, p):
    keep = t <= p + 1e-9
    return predict_final_loss(t[keep], y[keep], surrogate=reference, schedule=c.schedule, tau=c.tau,
                              tpp=c.tpp)


def test_calibration_stores_the_reference_residual_by_fraction(reference):
    assert reference.error_bands
    assert all(b.fit_residual is not None and b.fit_residual > 0 for b in reference.error_bands)
    again = Surrogate.from_dict(reference.to_dict())
    assert [b.fit_residual for b in again.error_bands] == [b.fit_residual for b in reference.error_bands]
    band = reference.error_band(0.33)  # between learned fractions: interpolated like the rest of the band
    assert band is not None and band.fit_residual is not None


@pytest.mark.parametrize("case", ["high_lr", "spike"])
def test_a_curve_that_does_not_collapse_is_flagged_and_its_interval_holds_the_truth(reference, curves, case):
    if case == "high_lr":
        c = curves["lr_high_s0_01"]
        t, y = _points(c)
        final, p = c.final_loss, 0.46
    else:
        c = curves["lr_tau_s0_10"]
        t, y, final = _spiked(c)
        p = 0.4
    pred = _predict(reference, c, t, y, p)
    assert pred.ok and pred.misfit is not None and pred.misfit > MISFIT_LIMIT
    assert not pred.collapses
    # the learned band alone was the confident, wrong number the issue saw: it misses the truth
    assert not pred.low <= final <= pred.high
    lo, hi = pred.shown
    assert lo <= final <= hi
    assert lo <= pred.low and hi >= pred.high  # only ever wider
    # the judge's entry: the shown interval on screen, the note in the reason, the rule's band kept aside
    d = decide(t[t <= p + 1e-9], y[t <= p + 1e-9], surrogate=reference, schedule=c.schedule, tau=c.tau,
               tpp=c.tpp, competitors=[1.0], settings=PruneSettings())
    entry = DecisionEntry.of(d, step=1000, n=10, reference="ref", threshold_trial=0)
    assert entry.predicted_low == pytest.approx(lo) and entry.predicted_high == pytest.approx(hi)
    assert entry.rule_low == pytest.approx(pred.low) and entry.rule_high == pytest.approx(pred.high)
    assert NOT_COLLAPSING in entry.reason and entry.misfit == pytest.approx(pred.misfit)
    assert entry.latest_attrs()["predicted_misfit"] == pytest.approx(pred.misfit)
    back = DecisionEntry.from_dict(entry.to_dict())
    assert back == entry


@pytest.mark.parametrize("p", [0.2, 0.3, 0.5])
def test_a_collapsing_curve_keeps_its_narrow_interval(reference, curves, p):
    c = curves["lr_tau_s0_10"]
    t, y = _points(c)
    pred = _predict(reference, c, t, y, p)
    assert pred.ok and pred.misfit is not None and pred.misfit <= MISFIT_LIMIT
    assert pred.shown == (pred.low, pred.high)
    assert pred.low <= c.final_loss <= pred.high
    d = decide(t[t <= p + 1e-9], y[t <= p + 1e-9], surrogate=reference, schedule=c.schedule, tau=c.tau,
               tpp=c.tpp, competitors=[1.0], settings=PruneSettings())
    entry = DecisionEntry.of(d, step=1000, n=10, reference="ref", threshold_trial=0)
    assert NOT_COLLAPSING not in entry.reason and entry.reason == d.reason
    assert (entry.predicted_low, entry.predicted_high) == (entry.rule_low, entry.rule_high)


def test_the_shown_interval_never_moves_a_decision(reference, curves):
    """A competitor's logged prediction counts with the rule's band, not the widened one shown on screen."""
    c = curves["lr_tau_s0_10"]
    t, y, _ = _spiked(c)
    keep = t <= 0.4 + 1e-9
    d = decide(t[keep], y[keep], surrogate=reference, schedule=c.schedule, tau=c.tau, tpp=c.tpp,
               competitors=[], settings=PruneSettings())
    entry = DecisionEntry.of(d, step=1000, n=10, reference="ref", threshold_trial=None)
    assert entry.predicted_high > entry.rule_high  # widened on screen
    latest = latest_prediction([entry])
    assert latest is not None and latest.high == entry.rule_high and latest.low == entry.rule_low
    # the interval rule against that competitor decides as with the learned band
    other = _points(curves["lr_tau_s0_00"])
    settings = PruneSettings(comparison="interval")
    kwargs = {"surrogate": reference, "schedule": c.schedule, "tau": c.tau, "tpp": c.tpp,
              "settings": settings}
    ot, oy = other[0][other[0] <= 0.3], other[1][other[0] <= 0.3]
    ours = decide(ot, oy, competitors=[Competitor(latest=latest)], **kwargs)
    learned = d.prediction
    assert learned is not None
    same = decide(ot, oy, competitors=[learned], **kwargs)
    assert (ours.prune, ours.threshold) == (same.prune, same.threshold)
    # an entry written before rule_low/rule_high existed reads its only interval as the rule's
    old = {k: v for k, v in entry.to_dict().items() if k not in ("rule_low", "rule_high", "misfit")}
    read = DecisionEntry.from_dict(old)
    assert (read.rule_low, read.rule_high) == (entry.predicted_low, entry.predicted_high)


def _attrs(misfit: float | None) -> dict:
    return {"predicted_final_loss": 2.417, "predicted_low": 2.2, "predicted_high": 3.6,
            "predicted_misfit": misfit, "decision_fraction": 0.2, "prune_reason": "pruned",
            "tokens_trained": 200, "total_tokens": 1000}


@pytest.mark.parametrize("misfit", [3.1, 0.8])
def test_every_screen_says_does_not_collapse_instead_of_a_bare_number(misfit):
    from collapse_hpo.hpo.outputs.dashboard import trial_note
    from collapse_hpo.hpo.outputs.progress import Progress
    from collapse_hpo.hpo.outputs.report import format_table

    flagged = misfit > MISFIT_LIMIT
    row = {"number": 3, "state": "PRUNED", "draw": 3, "seed": 0, "lr": 0.1, "batch_tokens": 512,
           "weight_decay": 0.1, "tau": 0.2, "tokens_trained": 200, "final_loss": None, "error": None,
           **{k: v for k, v in _attrs(misfit).items() if k not in ("tokens_trained", "total_tokens")}}
    table = format_table([row])
    assert (NOT_COLLAPSING in table) == flagged
    assert ("2.4170" in table) != flagged
    assert "2.200-3.600" in table
    trial = SimpleNamespace(number=3, state=SimpleNamespace(name="PRUNED"), value=None,
                            user_attrs=_attrs(misfit))
    note = trial_note(trial)
    assert (NOT_COLLAPSING in note) == flagged and ("**2.4170**" in note) != flagged
    out = io.StringIO()
    progress = Progress(unpruned_tokens=4000, out=out)
    progress.finished(trial)
    assert (NOT_COLLAPSING in out.getvalue()) == flagged


def _figure_study(pruned: list[dict]) -> Any:
    """An in-memory study for the curves figure: one trial trained to the end (final loss 2.0) and one pruned
    trial per entry of ``pruned`` (its user attrs), each with two reports of 3.5."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    good = study.ask()
    for s in range(100, 1001, 100):
        good.report(3.0 - s / 1000, s)
    good.set_user_attr("total_tokens", 1000)
    study.tell(good, 2.0)
    for attrs in pruned:
        cut = study.ask()
        for s in (100, 200):
            cut.report(3.5, s)
        for k, v in attrs.items():
            cut.set_user_attr(k, v)
        study.tell(cut, state=optuna.trial.TrialState.PRUNED)
    return study


def _draw(study: Any, path: Path, look: Callable[[Any], None], monkeypatch: pytest.MonkeyPatch) -> None:
    """``plot_curves`` of ``study`` into ``path``, with ``look`` called on the loss-curve axes just before the
    figure is saved (what a reader of the PNG sees)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from collapse_hpo.hpo.outputs.report import plot_curves

    real_savefig = plt.Figure.savefig

    def spy(fig, *args, **kwargs):
        look(fig.axes[0])
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", spy)
    plot_curves(path, study)


def test_the_figure_draws_no_confident_point_for_a_curve_that_does_not_collapse(tmp_path, monkeypatch):
    seen: dict[str, Any] = {}

    def look(ax):
        seen["texts"] = [t.get_text() for t in ax.texts]
        seen["legend"] = [t.get_text() for t in ax.get_legend().get_texts()]
        seen["ylim"] = ax.get_ylim()

    _draw(_figure_study([_attrs(3.1)]), tmp_path / "curves.png", look, monkeypatch)
    assert NOT_COLLAPSING in seen["texts"]
    assert any(NOT_COLLAPSING in t for t in seen["legend"])
    assert seen["ylim"][1] >= 3.6  # the widened interval is on the figure, not clipped


def test_collapse_hpo_predict_shows_the_widened_interval_and_the_note(reference, curves, tmp_path, capsys):
    import json

    from collapse_hpo.hpo.cli import main
    from collapse_hpo.predictors.curves import write_curves_csv

    reference.save(tmp_path / "s.json")
    write_curves_csv(tmp_path / "c.csv", [curves["lr_high_s0_01"], curves["lr_tau_s0_10"]])
    args = ["predict", str(tmp_path / "c.csv"), "--surrogate", str(tmp_path / "s.json"), "--fraction", "0.46"]
    assert main([*args, "--json"]) == 0
    high, good = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert high["misfit"] > MISFIT_LIMIT and high["low"] <= high["actual_final_loss"] <= high["high"]
    assert good["misfit"] <= MISFIT_LIMIT
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert NOT_COLLAPSING in next(x for x in lines if x.startswith("lr_high_s0_01"))
    assert NOT_COLLAPSING not in next(x for x in lines if x.startswith("lr_tau_s0_10"))


def test_a_huge_misfit_widens_the_interval_without_overflow():
    """A curve far off the reference's shape (misfit in the hundreds: an off-family curve against a prior)
    raised the margins to a power that overflowed a float, and the judgement crashed the sweep."""
    from collapse_hpo.predictors.misfit import shown_interval

    low, high = shown_interval(2.0, 1.0, 4.0, misfit=5_000.0, current_loss=2.5, lowest_loss=2.2)
    assert 0.0 <= low < 1.0 and np.isfinite(high) and high > 4.0


def test_the_figure_gives_each_pruned_trials_interval_its_own_column(tmp_path, monkeypatch):
    """Every pruned trial's interval was drawn at t̂ = 1, so the intervals overlapped into one bar."""
    bars: list[tuple[float, float, float]] = []

    def look(ax):
        for coll in ax.collections:
            for seg in coll.get_segments():
                (x0, y0), (x1, y1) = seg[0], seg[-1]
                if x0 == x1:  # a vertical bar: an interval
                    bars.append((float(x0), float(min(y0, y1)), float(max(y0, y1))))

    study = _figure_study([{**_attrs(0.8), "predicted_low": low} for low in (2.2, 2.3, 2.4)])
    _draw(study, tmp_path / "curves.png", look, monkeypatch)
    assert sorted(round(lo, 6) for _x, lo, _hi in bars) == [2.2, 2.3, 2.4]
    columns = [x for x, _lo, _hi in bars]
    assert len(set(columns)) == 3 and min(columns) > 1.0
