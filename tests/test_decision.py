"""The shared decision rule (hpo/decision.py) on exact collapse curves with a known surrogate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from collapse_hpo.hpo.decision import Decision, PruneSettings, decide, pessimistic
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.predict import Prediction
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import ErrorBand, Surrogate

SCHEDULE = Schedule()
TAU, TPP = 0.1, 20.0
# A surrogate with a 1% (log) error band: intervals are about ±1.7% at 90% confidence.
SURROGATE = Surrogate(
    b_c=0.5, b_e=0.3, q_c=1.0, q_e=0.1,
    error_bands=[ErrorBand(fraction=0.1, n=20, bias=0.0, scale=0.01, max_abs=0.03)],
)


def curve(final_loss: float, upto: float, n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """An exact collapse curve of a run ending at ``final_loss``, observed up to t̂ = ``upto``."""
    t = np.linspace(1.0 / n, 1.0, n)
    t = t[t <= upto + 1e-12]
    return t, final_loss * SURROGATE.normalized(t, SCHEDULE, TAU, TPP)


def judge(t, y, competitors=(), **settings) -> Decision:
    return decide(
        t, y, surrogate=SURROGATE, schedule=SCHEDULE, tau=TAU, tpp=TPP,
        competitors=competitors, settings=PruneSettings(**settings),
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"min_fraction": 0.0}, "min_fraction"),
        ({"min_fraction": 1.0}, "min_fraction"),
        ({"min_fraction": math.nan}, "min_fraction"),
        ({"confidence": 1.0}, "confidence"),
        ({"confidence": "high"}, "confidence"),
        ({"keep_top_k": 0}, "keep_top_k"),
        ({"keep_top_k": 1.5}, "keep_top_k"),
        ({"keep_top_k": True}, "keep_top_k"),
    ],
)
def test_settings_are_validated_with_the_field_named(kwargs, field):
    with pytest.raises(InputError, match=field):
        PruneSettings(**kwargs)


def test_a_clearly_worse_trial_is_pruned_and_the_prediction_is_its_final_loss():
    t, y = curve(3.5, 0.3)
    d = judge(t, y, competitors=[3.0])
    assert d.prune
    assert d.prediction is not None and d.prediction.ok
    assert d.prediction.final_loss == pytest.approx(3.5, rel=1e-9)
    assert d.prediction.low < 3.5 < d.prediction.high
    assert d.threshold == 3.0
    assert d.fraction == pytest.approx(t[-1])
    assert "pruned" in d.reason and "> 3, the pessimistic final loss of the 1st best" in d.reason


def test_a_trial_within_its_interval_of_the_best_is_kept():
    t, y = curve(3.02, 0.3)  # 0.7% worse than the best: inside the ±1.7% interval
    d = judge(t, y, competitors=[3.0])
    assert not d.prune
    assert d.prediction.low <= 3.0
    assert "kept" in d.reason


def test_the_better_trial_is_kept_against_a_worse_completed_one():
    t, y = curve(3.0, 0.3)
    assert not judge(t, y, competitors=[3.5]).prune


def test_keep_top_k_compares_with_the_kth_best_pessimistic_competitor():
    t, y = curve(3.5, 0.3)
    assert judge(t, y, competitors=[3.0, 3.6], keep_top_k=2).prune is False
    d = judge(t, y, competitors=[3.0, 3.1, 3.6], keep_top_k=2)
    assert d.prune and d.threshold == 3.1
    # Fewer competitors than keep_top_k: never pruned.
    d = judge(t, y, competitors=[3.0], keep_top_k=2)
    assert not d.prune and "keep_top_k=2" in d.reason


def test_running_competitors_count_with_their_pessimistic_bound():
    t, y = curve(3.5, 0.3)
    wide = Prediction(final_loss=3.0, low=2.0, high=3.6, fraction=0.2)
    narrow = Prediction(final_loss=3.0, low=2.9, high=3.1, fraction=0.2)
    failed = Prediction(final_loss=None, low=None, high=None, fraction=0.2, reason="too few points")
    assert not judge(t, y, competitors=[wide, failed]).prune
    d = judge(t, y, competitors=[narrow, failed])
    assert d.prune and d.threshold == 3.1
    assert math.isnan(pessimistic(failed)) and pessimistic(narrow) == 3.1 and pessimistic(2.5) == 2.5
    assert math.isnan(pessimistic(math.inf))


def test_higher_confidence_prunes_less():
    t, y = curve(3.06, 0.3)  # 2% worse
    assert judge(t, y, competitors=[3.0], confidence=0.5).prune
    assert not judge(t, y, competitors=[3.0], confidence=0.999).prune


def test_nothing_is_judged_before_min_fraction():
    t, y = curve(5.0, 0.08)
    d = judge(t, y, competitors=[3.0], min_fraction=0.1)
    assert not d.prune and d.prediction is None and "min_fraction" in d.reason


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_losses_prune_at_once_even_before_min_fraction(bad):
    t, y = curve(3.0, 0.05)
    y = y.copy()
    y[-1] = bad
    d = decide(t, y, surrogate=None, schedule=SCHEDULE, tau=TAU, tpp=TPP, competitors=[],
               settings=PruneSettings())
    assert d.prune and "diverged" in d.reason and d.fraction == pytest.approx(t[-1])


@pytest.mark.parametrize("bad", [0.0, -1.5])
def test_non_positive_losses_prune_with_the_reason(bad):
    t, y = curve(3.0, 0.3)
    y = y.copy()
    y[3] = bad
    d = judge(t, y, competitors=[])
    assert d.prune and "must be positive" in d.reason


def test_reports_past_the_end_are_ignored_and_said():
    t, y = curve(3.5, 1.0)
    t2 = np.concatenate([t, [1.1, 1.2]])
    y2 = np.concatenate([y, [3.4, 3.3]])
    d = judge(t2, y2, competitors=[3.0])
    assert d.prune and "past t_hat=1" in d.reason and d.fraction == 1.0
    only_past = judge([1.5, 2.0], [3.0, 2.9])
    assert not only_past.prune and "nothing to judge" in only_past.reason


def test_unsorted_and_repeated_points_give_the_same_prediction():
    t, y = curve(3.5, 0.3)
    order = np.random.default_rng(0).permutation(t.size)
    d_sorted = judge(t, y, competitors=[3.0])
    d_shuffled = judge(t[order], y[order], competitors=[3.0])
    assert d_shuffled.prediction.final_loss == pytest.approx(d_sorted.prediction.final_loss, rel=1e-12)
    d_rep = judge(np.concatenate([t, t[-1:]]), np.concatenate([y, [9.0]]), competitors=[3.0])
    assert d_rep.prediction.final_loss == pytest.approx(d_sorted.prediction.final_loss, rel=1e-12)
    assert "repeated" in d_rep.reason


def test_no_points_and_no_surrogate_keep_the_trial():
    assert not judge([], []).prune
    t, y = curve(9.0, 0.3)
    d = decide(t, y, surrogate=None, schedule=SCHEDULE, tau=TAU, tpp=TPP, competitors=[3.0],
               settings=PruneSettings())
    assert not d.prune and "no reference surrogate" in d.reason
    with pytest.raises(ValueError, match="points"):
        judge([0.1, 0.2], [3.0])


def test_a_failed_prediction_keeps_the_trial_with_its_reason():
    t, y = curve(3.5, 0.3)
    d = decide(t, y, surrogate=SURROGATE, schedule=SCHEDULE, tau=None, tpp=TPP, competitors=[3.0],
               settings=PruneSettings())
    assert not d.prune and "no prediction" in d.reason and "weight decay" in d.reason


def test_user_attrs_carry_the_prediction():
    t, y = curve(3.5, 0.3)
    attrs = judge(t, y, competitors=[3.0]).user_attrs()
    assert set(attrs) == {"predicted_final_loss", "predicted_low", "predicted_high", "decision_fraction",
                          "prune_reason"}
    assert attrs["predicted_final_loss"] == pytest.approx(3.5)
    assert attrs["predicted_low"] < 3.5 < attrs["predicted_high"]
    early = judge(*curve(3.5, 0.05)).user_attrs()
    assert early["predicted_final_loss"] is None and "min_fraction" in early["prune_reason"]
