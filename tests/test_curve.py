"""hpo/rule/curve.py: the one curve cache of both adapters (the pruner's ``_Known``, the scheduler's
``_ViewCache``)."""

from __future__ import annotations

import numpy as np

from collapse_hpo.hpo.rule.curve import CurveView
from collapse_hpo.hpo.rule.judge import clean_reports


def test_add_keeps_the_curve_sorted_by_step_past_the_first_capacity():
    rng = np.random.default_rng(0)
    steps = rng.permutation(np.arange(1, 201))  # out of order, more than the 64 first slots
    curve = CurveView()
    for s in steps:
        curve.add(float(s), s / 200, 5.0 / s)
    order = np.sort(steps)
    assert curve.steps == [float(s) for s in order]
    assert np.array_equal(curve.t_hat, order / 200) and np.array_equal(curve.loss, 5.0 / order)
    # the summary saw the reports in the order they came, as the judge would clean them
    assert curve.summary.reports() == clean_reports(steps / 200, 5.0 / steps)


def test_append_keeps_the_order_of_arrival_and_clear_forgets():
    curve = CurveView()
    for step, t, y in [(10, 0.1, 3.0), (5, 0.2, 2.5), (30, 0.3, float("nan"))]:
        curve.append(step, t, y)
    assert curve.steps == [10, 5, 30] and list(curve.t_hat) == [0.1, 0.2, 0.3]
    assert curve.summary.reports().diverged
    curve.clear()
    assert len(curve) == 0 and curve.t_hat.size == 0 and curve.summary.count == 0
