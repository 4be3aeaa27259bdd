"""Collapse metrics: smoothing, normalization, resampling, spread Δ and the supercollapse ratio Δ/σ."""

import numpy as np
import pytest

from collapse_hpo.predictors.collapse import normalize, resample, seed_noise, smooth, spread, supercollapse
from collapse_hpo.predictors.curves import Curve
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE, synthetic_curves


def test_local_linear_smoothing_keeps_lines_and_reduces_noise():
    t = np.linspace(0, 1, 501)
    line = 3.0 - t
    np.testing.assert_allclose(smooth(t, line, 0.05), line, atol=1e-10)  # also at the ends
    rng = np.random.default_rng(0)
    noisy = line + 0.01 * rng.standard_normal(t.size)
    sm = smooth(t, noisy, 0.05)
    assert np.std(sm - line) < 0.3 * np.std(noisy - line)
    assert abs(sm[-1] - line[-1]) < 0.005  # an unbiased end value, unlike a trailing moving average
    np.testing.assert_array_equal(smooth(t, noisy, 0.0), noisy)


def test_normalize_and_resample():
    c = Curve("a", np.array([0.0, 0.5, 1.0]), np.array([6.0, np.nan, 2.0]))
    t, ell = normalize(c)
    np.testing.assert_allclose(t, [0.0, 1.0])
    np.testing.assert_allclose(ell, [3.0, 1.0])
    out = resample(np.array([0.2, 0.6]), np.array([1.0, 3.0]), np.array([0.1, 0.4, 0.6, 0.9]))
    assert np.isnan(out[0]) and np.isnan(out[3])
    np.testing.assert_allclose(out[1:3], [2.0, 3.0])
    with pytest.raises(InputError):
        normalize(Curve("b", np.array([0.0]), np.array([1.0])))


def test_spread_is_zero_for_a_perfect_family_and_grows_with_shape_change():
    fam = synthetic_curves(taus=(0.1,), tpps=(20.0,), seeds=4, noise=0.0)
    s = spread(fam)
    assert s.mean == pytest.approx(0.0, abs=1e-12) and s.max == pytest.approx(0.0, abs=1e-12)
    broken = synthetic_curves(taus=(0.02, 0.5), tpps=(20.0,), noise=0.0)  # τ not held: shapes differ
    b = spread(broken)
    assert b.mean > 0.005 and b.max >= b.mean
    # Δ by hand at t̂ = 0.2: std of the two ℓ̂ values
    v = [TRUE_SURROGATE.normalized(0.2, c.schedule, c.tau, c.tpp)[0] for c in broken]
    assert b.delta[0] == pytest.approx(np.std(v), rel=1e-3)
    with pytest.raises(InputError):
        spread(fam[:1])


def test_supercollapse_ratio_below_one_only_when_sizes_agree_within_seed_noise():
    same = [synthetic_curves(taus=(0.1,), tpps=(20.0,), seeds=5, noise=0.002, seed=k) for k in range(3)]
    sc = supercollapse(same)
    assert sc.noise.mean > 0 and sc.ratio_mean < 1.0
    diff = [synthetic_curves(taus=(tau,), tpps=(20.0,), seeds=5, noise=0.002, seed=k)
            for k, tau in enumerate((0.03, 0.1, 0.4))]
    assert supercollapse(diff).ratio_mean > 3.0
    assert seed_noise(same).mean == pytest.approx(sc.noise.mean)
    with pytest.raises(InputError):
        seed_noise([[same[0][0]]])
