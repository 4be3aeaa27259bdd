"""AdamW timescale helpers (METHOD.md §2)."""

import math

import pytest

from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.timescale import (
    adamw_tau,
    optimal_tau,
    step_tau,
    tokens_per_parameter,
    weight_decay_for_tau,
)


def test_paper_610m_example_gives_tau_0105():
    tau = adamw_tau(batch_tokens=504 * 2048, lr=1.62e-2 * 256 / 2048, weight_decay=0.1, total_tokens=48.5e9)
    assert tau == pytest.approx(0.105, abs=0.001)


def test_weight_decay_for_tau_inverts_tau():
    lam = weight_decay_for_tau(batch_tokens=2**19, lr=3e-3, tau=0.2, total_tokens=1e10)
    assert adamw_tau(2**19, 3e-3, lam, 1e10) == pytest.approx(0.2)
    assert weight_decay_for_tau(2**19, 3e-3, math.inf, 1e10) == 0.0
    assert adamw_tau(2**19, 3e-3, 0.0, 1e10) == math.inf


def test_tpp_and_optimal_tau_law():
    assert tokens_per_parameter(2e9, 1e8) == pytest.approx(20.0)
    # the METHOD.md fit of the Celerity settings: 0.175 @ 20, 0.087 @ 80, 0.051 @ 234 TPP (within 5%)
    for tpp, tau in ((20, 0.175), (80, 0.087), (234, 0.051)):
        assert optimal_tau(tpp) == pytest.approx(tau, rel=0.05)
    assert optimal_tau(100, coefficient=1.0, exponent=-1.0) == pytest.approx(0.01)


def test_step_tau_is_one_over_lr_decay_steps():
    """A run counted in optimizer steps: τ = 1/(η·λ·steps), the token τ with D = B·steps, whatever B."""
    assert step_tau(lr=1e-3, weight_decay=0.1, steps=50_000) == pytest.approx(0.2)
    for batch_tokens in (2**10, 2**19):
        tokens = batch_tokens * 8_000
        assert step_tau(3e-4, 0.05, 8_000) == pytest.approx(adamw_tau(batch_tokens, 3e-4, 0.05, tokens))
    assert step_tau(1e-3, 0.0, 100) == math.inf
    with pytest.raises(InputError, match="steps"):
        step_tau(1e-3, 0.1, 0)


@pytest.mark.parametrize("call", [
    lambda: adamw_tau(0, 1e-3, 0.1, 1e9), lambda: adamw_tau(1e5, -1e-3, 0.1, 1e9),
    lambda: adamw_tau(1e5, 1e-3, -0.1, 1e9), lambda: weight_decay_for_tau(1e5, 1e-3, 0.0, 1e9),
    lambda: tokens_per_parameter(1e9, float("nan")), lambda: optimal_tau(-5),
])
def test_bad_values_raise_input_error(call):
    with pytest.raises(InputError):
        call()


def test_derive_decay_is_the_one_derivation_of_lambda():
    from collapse_hpo.predictors.timescale import derive_decay, no_decay_tau

    lam, tau = derive_decay(2048, 3e-3, 1_105_920, tau=0.175)
    assert lam == weight_decay_for_tau(2048, 3e-3, 0.175, 1_105_920) and tau == 0.175
    assert derive_decay(2048, 3e-3, 1_105_920, weight_decay=lam)[1] == pytest.approx(0.175)
    assert derive_decay(2048, 3e-3, 1_105_920) == (0.0, None)  # no weight decay: tau None
    assert derive_decay(2048, 3e-3, 1_105_920, weight_decay=0.0) == (0.0, None)
    with pytest.raises(InputError, match="not both"):
        derive_decay(2048, 3e-3, 1_105_920, tau=0.1, weight_decay=0.1)
    assert no_decay_tau(math.inf) is None and no_decay_tau("inf") is None and no_decay_tau(0.2) == 0.2
