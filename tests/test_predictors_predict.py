"""Early-align prediction: accuracy on known truth, the three alignment losses, reasons, fuzzing, speed."""

import math
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collapse_hpo.predictors.predict import Prediction, align_divisor, interval, predict_final_loss
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import ErrorBand, Surrogate
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE, synthetic_curves

SCHED = Schedule()
BANDED = Surrogate(b_c=0.5, b_e=0.3, q_c=1.0, q_e=0.1,
                   error_bands=[ErrorBand(0.1, 10, 0.0, 0.02, 0.05), ErrorBand(0.5, 10, 0.0, 0.005, 0.01)])


def _partial(fraction, n=200, final=3.0, tau=0.1, tpp=20.0, surrogate=TRUE_SURROGATE):
    t = np.linspace(0.005, fraction, n)
    return t, final * surrogate.normalized(t, SCHED, tau, tpp)


@pytest.mark.parametrize("method", ["sq", "mae", "log"])
def test_exact_curve_recovers_final_loss_with_each_alignment(method):
    s = Surrogate(b_c=0.5, b_e=0.3, q_c=1.0, q_e=0.1, align=method)
    t, y = _partial(0.2)
    pred = predict_final_loss(t, y, surrogate=s, schedule=SCHED, tau=0.1, tpp=20)
    assert pred.ok and pred.reason is None
    assert pred.final_loss == pytest.approx(3.0, rel=1e-9)
    assert pred.fraction == pytest.approx(0.2) and pred.align_mae == pytest.approx(0.0, abs=1e-12)
    assert pred.low is None and pred.high is None  # no error model in this surrogate


def test_align_divisor_closed_forms():
    loss = np.array([2.0, 4.0, 8.0])
    shape = np.array([1.0, 2.0, 4.0])
    for m in ("sq", "mae", "log"):
        assert align_divisor(loss, shape, m) == pytest.approx(2.0)
    # the squared-error form is the paper's u = Σ L ℓ̂ / Σ L²
    loss2 = np.array([2.0, 3.0])
    shape2 = np.array([1.1, 1.4])
    u = (2 * 1.1 + 3 * 1.4) / (4 + 9)
    assert align_divisor(loss2, shape2, "sq") == pytest.approx(1 / u)
    with pytest.raises(ValueError):
        align_divisor(loss, shape, "cubic")


def test_noisy_synthetic_predictions_are_close_and_intervals_come_from_the_error_model():
    curves = synthetic_curves(noise=0.003, seed=3)
    for c in curves:
        tc = c.truncated(0.25)
        pred = predict_final_loss(tc.t_hat, tc.loss, surrogate=BANDED, schedule=c.schedule, tau=c.tau,
                                  tpp=c.tpp)
        assert pred.ok
        assert abs(pred.final_loss / c.meta["true_final_loss"] - 1) < 0.005
        assert pred.low < pred.final_loss < pred.high
    # wider interval early than late, wider at higher confidence
    t, y = _partial(0.12)
    early = predict_final_loss(t, y, surrogate=BANDED, schedule=SCHED, tau=0.1, tpp=20)
    t, y = _partial(0.45)
    late = predict_final_loss(t, y, surrogate=BANDED, schedule=SCHED, tau=0.1, tpp=20)
    wide = predict_final_loss(t, y, surrogate=BANDED, schedule=SCHED, tau=0.1, tpp=20, confidence=0.99)
    assert (early.high - early.low) / early.final_loss > (late.high - late.low) / late.final_loss
    assert wide.high - wide.low > late.high - late.low


def test_interval_applies_bias_and_student_t():
    lo, hi = interval(2.0, ErrorBand(0.2, 3, 0.01, 0.02, 0.03), 0.9)
    half = 2.919986 * 0.02 * math.sqrt(1 + 1 / 3)  # t_{0.95, 2}
    assert lo == pytest.approx(2.0 * math.exp(0.01 - half), rel=1e-5)
    assert hi == pytest.approx(2.0 * math.exp(0.01 + half), rel=1e-5)
    assert interval(2.0, None, 0.9) == (None, None)


@pytest.mark.parametrize("t,y,kw,reason", [
    ([], [], {}, "no points"),
    ([0.1, 0.2], [1.0], {}, "equal length"),
    (np.linspace(0.01, 0.05, 20), np.ones(20), {}, "below min_fraction"),
    ([0.05, 0.15, 0.2, 0.2], [3, 3, 3, 3], {}, "too few points"),
    (np.linspace(0.01, 0.2, 20), np.r_[np.ones(19), np.nan], {}, "NaN/inf"),
    (np.linspace(0.01, 0.2, 20), np.r_[np.ones(10), np.inf, np.ones(9)], {}, "NaN/inf"),
    (np.linspace(0.01, 0.2, 20), np.r_[np.ones(19), -1.0], {}, "not positive"),
    (np.linspace(0.01, 0.2, 20), np.r_[np.ones(19), 0.0], {}, "not positive"),
    (np.r_[np.linspace(0.01, 0.2, 19), np.nan], np.ones(20), {}, "t_hat has NaN"),
    (np.linspace(0.5, 1.2, 20), np.ones(20), {}, "past its end"),
    (np.linspace(0.01, 0.2, 20), np.ones(20), {"tau": None}, "no weight decay"),
    (np.linspace(0.01, 0.2, 20), np.ones(20), {"confidence": 1.5}, "confidence"),
    ("abc", "def", {}, "numeric"),
])
def test_reasons_instead_of_exceptions(t, y, kw, reason):
    args = {"surrogate": TRUE_SURROGATE, "schedule": SCHED, "tau": 0.1, "tpp": 20.0}
    args.update(kw)
    pred = predict_final_loss(t, y, **args)
    assert isinstance(pred, Prediction) and not pred.ok
    assert pred.final_loss is None and reason in pred.reason


def test_unsorted_and_repeated_points_give_the_same_prediction():
    t, y = _partial(0.3, n=100)
    base = predict_final_loss(t, y, surrogate=TRUE_SURROGATE, schedule=SCHED, tau=0.1, tpp=20)
    rng = np.random.default_rng(0)
    order = rng.permutation(t.size)
    shuffled = predict_final_loss(t[order], y[order], surrogate=TRUE_SURROGATE, schedule=SCHED, tau=0.1,
                                  tpp=20)
    assert shuffled.final_loss == pytest.approx(base.final_loss, rel=1e-12)
    rep = predict_final_loss(np.r_[t, t[-5:]], np.r_[y, y[-5:]], surrogate=TRUE_SURROGATE, schedule=SCHED,
                             tau=0.1, tpp=20)
    assert rep.final_loss == pytest.approx(base.final_loss, rel=1e-3)


def _curves():
    n = st.integers(min_value=0, max_value=60)

    def build(args):
        size, kind, scale, seed = args
        rng = np.random.default_rng(seed)
        t = np.sort(rng.uniform(0, 1.05, size))
        if kind == "constant":
            y = np.full(size, scale)
        elif kind == "increasing":
            y = scale * (1 + t)
        elif kind == "spiky":
            y = scale * (1 + 0.01 * rng.standard_normal(size))
            y[rng.integers(0, max(size, 1), size=min(size, 3))] *= 1e6
        elif kind == "nan":
            y = scale * np.ones(size)
            y[rng.random(size) < 0.3] = np.nan
        else:  # anything goes
            y = rng.choice([np.nan, np.inf, -np.inf, 0.0, -1.0, 1e-300, 1e300, 2.0], size=size)
        return t, y

    return st.tuples(n, st.sampled_from(["constant", "increasing", "spiky", "nan", "wild"]),
                     st.floats(1e-6, 1e6), st.integers(0, 2**31)).map(build)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(curve=_curves(), tau=st.sampled_from([None, 0.1, 1e-9, 1e9]),
       tpp=st.sampled_from([20.0, 1e-6, 1e6, None]))
def test_fuzz_never_raises_returns_prediction_or_reason(curve, tau, tpp):
    t, y = curve
    for s in (TRUE_SURROGATE, BANDED):
        pred = predict_final_loss(t, y, surrogate=s, schedule=SCHED, tau=tau, tpp=tpp)
        assert isinstance(pred, Prediction)
        if pred.ok:
            assert math.isfinite(pred.final_loss) and pred.final_loss > 0 and pred.reason is None
        else:
            assert pred.final_loss is None and isinstance(pred.reason, str) and pred.reason


def test_speed_1000_point_partial_curve_under_5ms():
    t, y = _partial(0.2, n=1000)
    sched = Schedule.from_data(np.linspace(0, 1, 1000), SCHED(np.linspace(0, 1, 1000)))
    predict_final_loss(t, y, surrogate=BANDED, schedule=sched, tau=0.1, tpp=20)  # warm the t-quantile cache
    start = time.perf_counter()
    for _ in range(50):
        pred = predict_final_loss(t, y, surrogate=BANDED, schedule=sched, tau=0.1, tpp=20)
    per_call = (time.perf_counter() - start) / 50
    assert pred.ok and per_call < 5e-3


def test_the_t_quantile_is_scipy_stats_to_the_bit():
    """``t_quantile`` computes scipy.stats.t.ppf without importing scipy.stats (``predict._t_ppf``): the same
    bits at the confidences and counts the rule and the error models use, and at random ones."""
    from scipy import stats

    from collapse_hpo.predictors.predict import _t_ppf

    rng = np.random.default_rng(0)
    confidences = [0.5, 0.8, 0.9, 0.95, 0.99, 0.999, 1e-9, 1 - 1e-12, *rng.uniform(0, 1, 200).tolist()]
    dfs = [1, 2, 3, 4, 5, 7, 10, 19, 30, 100, 1000, 10**6, *rng.integers(1, 500, 50).tolist()]
    for conf in confidences:
        q = 0.5 + 0.5 * conf
        for df in dfs:
            want = float(stats.t.ppf(q, df=df))
            got = _t_ppf(q, df)
            assert got == want and math.copysign(1, got) == math.copysign(1, want), (conf, df)
    # the edges (q at 0 or 1, df below 1) go to scipy.stats itself: checked against what they must be
    assert _t_ppf(1.0, 3) == math.inf and _t_ppf(0.0, 3) == -math.inf and _t_ppf(0.5, 3) == 0.0
    heavy = _t_ppf(0.7, 0.5)  # df 0.5: the quantile whose CDF is 0.7
    assert 1.0 < heavy < 1.02 and math.isclose(float(stats.t.cdf(heavy, df=0.5)), 0.7, rel_tol=1e-12)
    assert math.isnan(_t_ppf(0.7, -1.0))


def test_final_loss_of_is_the_finished_predictions_point_or_none_where_finishing_fails():
    """``final_loss_of`` skips building the Prediction: the same point as ``_finish``'s (the alignment
    divisor) wherever that one is ok, and None where finishing raises (a band so wide its interval's exp
    overflows), controls inside and outside the reference's ranges, with and without an error model."""
    from dataclasses import replace

    from collapse_hpo.predictors.predict import _finish, align_partial, final_loss_of

    huge = [ErrorBand(0.1, 10, 0.0, 400.0, 500.0), ErrorBand(0.5, 10, 0.0, 0.005, 0.01)]
    surrogates = [
        TRUE_SURROGATE,
        BANDED,
        replace(BANDED, reference={"tau": [0.05, 0.2], "tpp": [10.0, 40.0]}),
        replace(BANDED, error_bands=huge),
    ]
    finished = failed = 0
    for s in surrogates:
        for tau, tpp in ((0.1, 20.0), (1.5, 200.0), (None, None)):
            for fraction in (0.12, 0.3, 0.6):
                t, y = _partial(fraction, n=40, tau=tau if tau is not None else 0.1, tpp=tpp or 20.0)
                aligned = align_partial(t, y, surrogate=s, schedule=SCHED, tau=tau, tpp=tpp)
                if isinstance(aligned, Prediction):  # no alignment: its failed Prediction says so
                    assert final_loss_of(aligned, s, tau=tau, tpp=tpp) is None and not aligned.ok
                    continue
                try:
                    p = _finish(aligned, s, tau, tpp, 0.9, None)
                    want = float(p.final_loss) if p.ok else None
                    finished += 1
                except OverflowError:
                    want = None
                    failed += 1
                assert final_loss_of(aligned, s, tau=tau, tpp=tpp, confidence=0.9) == want
    assert finished and failed  # both ways were taken
