"""The final-loss law L(N, D) = E + A/N^α + B/D^β, its surrogate JSON field, and `forecast` from Python."""

import json
import math

import numpy as np
import pytest

from collapse_hpo.predictors.calibrate import calibrate
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.forecast import forecast, raw_end
from collapse_hpo.predictors.scaling_law import ScalingLaw, fit_scaling_law
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import Surrogate
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE, synthetic_curves

E, A, ALPHA, B, BETA = 1.69, 406.4, 0.34, 410.7, 0.28  # Chinchilla's published constants


def chinchilla(n, d):
    return E + A / np.asarray(n, float) ** ALPHA + B / np.asarray(d, float) ** BETA


def grid(sizes=(1e7, 3e7, 1e8, 3e8, 1e9), tpps=(10.0, 30.0, 100.0)):
    n = np.repeat(sizes, len(tpps))
    return n, n * np.tile(tpps, len(sizes))


def test_recovers_known_constants_without_noise():
    n, d = grid()
    law = fit_scaling_law(n, d, chinchilla(n, d), n_boot=0)
    assert law.kind == "full" and law.n_sizes == 5 and law.n_points == 15
    assert law.e == pytest.approx(E, rel=1e-3)
    assert law.alpha == pytest.approx(ALPHA, rel=1e-3)
    assert law.beta == pytest.approx(BETA, rel=1e-3)
    assert law.a * law.n0**law.alpha == pytest.approx(A, rel=1e-2)
    assert law.b * law.d0**law.beta == pytest.approx(B, rel=1e-2)
    # extrapolation to 10x the largest size
    assert law.predict(1e10, 2e11) == pytest.approx(float(chinchilla(1e10, 2e11)), rel=1e-4)


def test_noisy_fit_interval_covers_the_truth_beyond_the_reference_sizes():
    n, d = grid()
    hits, widths = 0, []
    for seed in range(6):
        rng = np.random.default_rng(seed)
        obs = chinchilla(n, d) * np.exp(rng.normal(0.0, 0.004, n.size))
        law = fit_scaling_law(n, d, obs, n_boot=60, seed=seed)
        lo, hi = law.interval(3e9, 6e10, 0.9)
        truth = float(chinchilla(3e9, 6e10))
        assert lo < law.predict(3e9, 6e10) < hi
        hits += lo <= truth <= hi
        widths.append(hi / lo - 1)
        assert law.extrapolation_error is not None and law.extrapolation_error < 0.03
    assert hits >= 5
    assert np.mean(widths) < 0.06  # informative, not arbitrarily wide


def test_too_few_sizes_is_refused_unless_alpha_is_fixed():
    n, d = grid(sizes=(1e7, 1e8))
    with pytest.raises(InputError, match="3 or more model sizes"):
        fit_scaling_law(n, d, chinchilla(n, d))
    law = fit_scaling_law(n, d, chinchilla(n, d), alpha=ALPHA, n_boot=0)
    assert law.fixed == ["alpha"] and law.alpha == ALPHA
    assert law.predict(1e9, 2e10) == pytest.approx(float(chinchilla(1e9, 2e10)), rel=2e-3)


def test_one_tpp_gives_an_n_only_law_that_refuses_other_tpps():
    n = np.array([1e7, 2e7, 4e7, 8e7, 1.6e8])
    d = 20.0 * n
    law = fit_scaling_law(n, d, chinchilla(n, d), n_boot=0)
    assert law.kind == "n_only" and law.b == 0.0
    assert law.predict(3.2e8, 6.4e9) == pytest.approx(float(chinchilla(3.2e8, 6.4e9)), rel=3e-3)
    with pytest.raises(InputError, match="one TPP"):
        law.predict(3.2e8, 3.2e8 * 100)


@pytest.mark.parametrize(
    "args, match",
    [
        (([1e7, 1e8, 1e9], [1e8, 1e9], [3.0, 2.8, 2.6]), "same length"),
        (([1e7, -1e8, 1e9], [1e8, 1e9, 1e10], [3.0, 2.8, 2.6]), "params"),
        (([1e7, 1e8, 1e9], [1e8, 1e9, 1e10], [3.0, math.nan, 2.6]), "final_loss"),
    ],
)
def test_bad_input(args, match):
    with pytest.raises(InputError, match=match):
        fit_scaling_law(*args)


def _law() -> ScalingLaw:
    n, d = grid(sizes=(1e7, 1e8, 1e9))
    return fit_scaling_law(n, d, chinchilla(n, d), n_boot=5, target="final_over_raw1")


def test_surrogate_json_round_trip_with_and_without_a_law(tmp_path):
    s = Surrogate(b_c=0.5, b_e=0.3, q_c=0.8, q_e=0.1, scaling_law=_law())
    s.save(tmp_path / "s.json")
    back = Surrogate.load(tmp_path / "s.json")
    assert back.scaling_law == s.scaling_law
    assert back.scaling_law.predict(5e8, 1e10) == s.scaling_law.predict(5e8, 1e10)
    # a file written before the law existed (no such key) still loads, without a law
    old = Surrogate(b_c=0.5, b_e=0.3, q_c=0.8, q_e=0.1)
    d = old.to_dict()
    assert "scaling_law" not in d
    (tmp_path / "old.json").write_text(json.dumps(d))
    assert Surrogate.load(tmp_path / "old.json").scaling_law is None


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda law: law.pop("alpha"), "missing alpha"),
        (lambda law: law.update(kind="cubic"), "kind"),
        (lambda law: law.update(samples=[[1.0, 2.0]]), r"samples\[0\]"),
        (lambda law: law.update(extra=1), "unknown field"),
    ],
)
def test_malformed_law_in_a_surrogate_file_is_one_line_error(tmp_path, edit, match):
    d = Surrogate(b_c=0.5, b_e=0.3, q_c=0.8, q_e=0.1, scaling_law=_law()).to_dict()
    edit(d["scaling_law"])
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(InputError, match=match) as err:
        Surrogate.load(tmp_path / "bad.json")
    assert "bad.json" in str(err.value) and "\n" not in str(err.value)


def _references():
    """Synthetic references at 3 sizes × 2 TPPs whose final losses follow Chinchilla's law × raw(1)."""
    sizes = {"s": 2e7, "m": 6e7, "l": 1.8e8}
    curves, params = [], {}
    for tag, n in sizes.items():
        for c in synthetic_curves(taus=(0.1,), tpps=(20.0, 80.0), noise=0.0005, seed=len(curves)):
            c.run = f"{tag}_{c.run}"
            target = float(chinchilla(n, c.tpp * n)) * raw_end(TRUE_SURROGATE, c.schedule, c.tau, c.tpp)
            c.loss = c.loss * target / c.final_loss
            curves.append(c)
            params[c.run] = n
    return curves, params


def test_calibrate_with_sizes_fits_the_law_and_forecast_gives_the_curve():
    curves, params = _references()
    cal = calibrate(curves, params=params, free_m=False, folds=2)
    s = cal.surrogate
    assert s.scaling_law is not None and s.scaling_law.target == "final_over_raw1"
    assert any(n.startswith("scaling law") for n in cal.notes)
    n, d = 5.4e8, 5.4e8 * 40.0
    fc = forecast(s, n, d, tau=0.1)
    truth = float(chinchilla(n, d)) * raw_end(TRUE_SURROGATE, Schedule(), 0.1, 40.0)
    assert fc.final_loss == pytest.approx(truth, rel=0.01)
    assert fc.low < fc.final_loss < fc.high
    assert fc.loss[-1] == pytest.approx(fc.final_loss)
    np.testing.assert_allclose(fc.loss, fc.final_loss * s.normalized(fc.t_hat, Schedule(), 0.1, 40.0))
    assert np.all(fc.loss_low <= fc.loss) and np.all(fc.loss <= fc.loss_high)
    assert any("outside the reference sizes" in note for note in fc.notes)
    assert any("too few to check it" in note for note in fc.notes)  # 3 sizes: no held-out-size check
    assert any("outside the reference TPPs" in note for note in forecast(s, n, n * 200.0, tau=0.1).notes)
    # a constant-LR run ends higher than a decayed one, by the surrogate's raw(1) ratio
    const = forecast(s, n, d, tau=0.1, schedule="constant")
    assert const.final_loss / fc.final_loss == pytest.approx(
        raw_end(s, Schedule(kind="constant"), 0.1, 40.0) / raw_end(s, Schedule(), 0.1, 40.0)
    )
    assert const.final_loss > fc.final_loss


def test_calibrate_with_two_sizes_says_it_cannot_and_forecast_refuses():
    curves, params = _references()
    keep = [c for c in curves if not c.run.startswith("l_")]
    cal = calibrate(keep, params=params, free_m=False, folds=2)
    assert cal.surrogate.scaling_law is None
    assert any("no scaling law" in n and "3 or more model sizes" in n for n in cal.notes)
    with pytest.raises(InputError, match="no scaling law"):
        forecast(cal.surrogate, 1e9, 2e10, tau=0.1)
    with pytest.raises(InputError, match="no model size"):
        calibrate(keep, params={keep[0].run: 1e7}, free_m=False, folds=2)
    # sizes on some curves only: no law, and the notes say why
    partial = [c.truncated(1.0) for c in curves]
    for c in partial:
        c.params = params[c.run] if c.run.startswith("s_") else None
    cal = calibrate(partial, free_m=False, folds=2)
    assert cal.surrogate.scaling_law is None and any("some runs have no params" in n for n in cal.notes)
