"""The deviation-from-collapse monitor (predictors/residuals.py) and the raw-loss baseline."""

from __future__ import annotations

import math

import numpy as np
import pytest

from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.residuals import (
    AlarmRule,
    Monitor,
    choose_threshold,
    early_align_divisor,
    normalized_reference,
    persistent_peak,
    raw_loss_alarm,
    residuals,
    rise_series,
    smooth_trailing,
)
from collapse_hpo.predictors.synthetic import synthetic_curves


def family(n: int = 4, noise: float = 0.002):
    return synthetic_curves(taus=(0.2,), tpps=(20.0,), seeds=n, n_points=100, noise=noise, seed=1)


def drift(curve, start: float = 0.4, slope: float = 0.1) -> np.ndarray:
    """The curve's loss with a slow multiplicative drift from ``start`` (loss still falls: raw rule blind)."""
    return curve.loss * np.where(curve.t_hat > start, 1.0 + slope * (curve.t_hat - start), 1.0)


def test_smooth_trailing_is_a_causal_window_mean():
    t = np.array([0.1, 0.2, 0.3, 0.4])
    y = np.array([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(smooth_trailing(t, y, 0.0), y)
    np.testing.assert_allclose(smooth_trailing(t, y, 0.15), [1.0, 1.5, 2.5, 3.5])
    np.testing.assert_allclose(smooth_trailing(t, y, 1.0), [1.0, 1.5, 2.0, 2.5])


def test_early_align_divisor_recovers_the_scale():
    ref = np.linspace(1.3, 1.0, 20)
    assert early_align_divisor(2.7 * ref, ref) == pytest.approx(2.7)


def test_clean_run_no_alarm_and_drift_alarms_after_the_fault():
    c0, *rest = family()
    ref = normalized_reference(c0.t_hat, c0.loss)
    for c in rest:
        clean = residuals(c.t_hat, c.loss, *ref)
        assert not clean.alarm.fired
        assert clean.divisor == pytest.approx(c.meta["true_final_loss"], rel=0.01)
        assert np.all(np.isnan(clean.residual[c.t_hat <= 0.3]))
        bad = residuals(c.t_hat, drift(c), *ref)
        assert bad.alarm.fired and 0.4 < bad.alarm.t_hat < 0.65
        raw = raw_loss_alarm(c.t_hat, drift(c))
        assert not raw.fired  # the loss never rises: only the residual sees the fault


def test_online_monitor_matches_the_batch_check():
    c0, c1 = family(2)
    ref = normalized_reference(c0.t_hat, c0.loss)
    y = drift(c1)
    rule = AlarmRule(threshold=0.008, persistence=2)
    batch = residuals(c1.t_hat, y, *ref, rule)
    mon = Monitor(*ref, rule)
    fired = [a for t, v in zip(c1.t_hat, y) if (a := mon.update(t, v)) is not None]
    assert len(fired) == 1 and fired[0].t_hat == pytest.approx(batch.alarm.t_hat)
    assert mon.divisor == pytest.approx(batch.divisor)


def test_two_sided_catches_a_run_below_the_reference():
    c0, c1 = family(2)
    ref = normalized_reference(c0.t_hat, c0.loss)
    y = drift(c1, slope=-0.1)
    assert not residuals(c1.t_hat, y, *ref).alarm.fired
    assert residuals(c1.t_hat, y, *ref, AlarmRule(two_sided=True)).alarm.fired


def test_raw_loss_rule_fires_when_the_loss_rises():
    t = np.linspace(0.01, 1.0, 100)
    y = 3.0 - t + np.where(t > 0.5, 2.0 * (t - 0.5), 0.0)  # rises from t̂ = 0.5
    a = raw_loss_alarm(t, y, margin=0.01, persistence=3, smooth=0.0)
    # s/min − 1 > 0.01 needs (t − 0.5)/(2.5) > 0.01: t > 0.525; third such report
    assert a.fired and 0.525 < a.t_hat < 0.56
    _, rise = rise_series(t, y, smooth=0.0)
    assert np.nanmax(rise) == pytest.approx((3.0 - 1.0 + 1.0) / 2.5 - 1.0)


def test_persistent_peak_is_the_firing_boundary():
    stat = np.array([np.nan, 0.001, 0.02, 0.03, 0.005, 0.04, 0.05, 0.045, 0.0])
    peak = persistent_peak(stat, 3)
    assert peak == pytest.approx(0.04)
    t = np.linspace(0.1, 0.9, stat.size)
    from collapse_hpo.predictors.residuals import _persistent

    assert _persistent(t, stat, peak * 0.999, 3, "x").fired
    assert not _persistent(t, stat, peak, 3, "x").fired
    assert choose_threshold([0.01, peak, -math.inf], safety=1.5) == pytest.approx(1.5 * peak)
    with pytest.raises(InputError):
        choose_threshold([-math.inf])


@pytest.mark.parametrize("kwargs", [
    {"align": (0.3, 0.1)}, {"threshold": 0.0}, {"persistence": 0}, {"persistence": 1.5}, {"smooth": 1.0},
])
def test_alarm_rule_validation(kwargs):
    with pytest.raises(InputError, match="alarm rule"):
        AlarmRule(**kwargs)


def test_reference_must_be_complete():
    c0 = family(1)[0]
    with pytest.raises(InputError, match="complete run"):
        normalized_reference(c0.t_hat[:50], c0.loss[:50])


def test_too_few_points_in_the_window_gives_no_divisor():
    c0, c1 = family(2)
    ref = normalized_reference(c0.t_hat, c0.loss)
    res = residuals(c1.t_hat[:20], c1.loss[:20], *ref)  # ends at t̂ = 0.2: window [0.1, 0.3] not passed
    assert not res.alarm.fired and math.isfinite(res.divisor) and np.all(np.isnan(res.residual))
    res = residuals(c1.t_hat[:11], c1.loss[:11], *ref)  # 2 reports in the window: no divisor
    assert not res.alarm.fired and math.isnan(res.divisor) and "align window" in res.alarm.reason
