"""Synthetic generators: the known truth they carry and the noisy quadratic model's behaviour."""

import numpy as np
import pytest

from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE, nqm_curve, synthetic_curves


def test_surrogate_curves_carry_their_truth():
    curves = synthetic_curves(taus=(0.1, None), tpps=(20.0,), noise=0.0,
                              surrogate=TRUE_SURROGATE.__class__(b_c=0.5, b_e=0.0, q_c=1.0, q_e=0.1,
                                                                 tau_law="constant"))
    assert len(curves) == 2 and curves[1].tau is None
    for c in curves:
        assert c.complete and c.final_loss == pytest.approx(c.meta["true_final_loss"])
    noisy = synthetic_curves(noise=0.01, seed=4)
    rel = [np.std(c.loss / (c.meta["true_final_loss"] * TRUE_SURROGATE.normalized(c.t_hat, c.schedule, c.tau,
                                                                                 c.tpp)) - 1) for c in noisy]
    assert np.mean(rel) == pytest.approx(0.01, rel=0.2)


def test_nqm_shape_depends_on_tau_and_decay_gives_late_drop():
    def ell(c, t):
        return np.interp(t, c.t_hat, c.loss) / c.meta["true_final_loss"]

    short, long_ = nqm_curve(0.05), nqm_curve(0.4)
    assert ell(short, 0.2) < ell(long_, 0.2)  # a short timescale forgets the start faster
    const = nqm_curve(0.1, schedule=Schedule("constant"))
    decay = nqm_curve(0.1)
    # decay to zero suppresses the noise floor: the last 20% drops more than with a constant LR
    assert ell(decay, 0.8) - 1 > 2 * (ell(const, 0.8) - 1)
    assert decay.loss[-1] == pytest.approx(decay.meta["true_final_loss"])  # noise=0
    n = nqm_curve(0.1, noise=0.01, seed=1)
    assert n.loss[-1] != n.meta["true_final_loss"] and np.all(np.isfinite(n.loss))
    assert nqm_curve(None).tau is None
