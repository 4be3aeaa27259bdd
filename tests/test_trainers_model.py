"""Model shape, parameter counts and the CompleteP multipliers (trainers/model.py, trainers/optim.py)."""

from __future__ import annotations

import math

import pytest
import torch

from collapse_hpo.predictors.errors import InputError
from collapse_hpo.trainers.config import TrainConfig, count_parameters, plan
from collapse_hpo.trainers.model import GPT, SquaredReLU
from collapse_hpo.trainers.optim import build_optimizer


@pytest.mark.parametrize(
    ("width", "depth", "heads", "mlp", "position"),
    [
        (16, 1, 2, "squared_relu", "rope"),
        (32, 3, 4, "swiglu", "alibi"),
        (48, 2, 3, "squared_relu", "alibi"),
        (64, 2, 4, "swiglu", "rope"),
    ],
)
def test_count_parameters_matches_the_built_model(width, depth, heads, mlp, position):
    config = TrainConfig(width=width, depth=depth, heads=heads, mlp=mlp, position=position, context=16)
    model = GPT(config)
    assert count_parameters(width, depth, heads, mlp=mlp) == model.count_parameters()
    non_emb, total = model.count_parameters()
    assert total - non_emb == 2 * 256 * width  # untied embedding and unembedding


def test_count_parameters_known_value_and_errors():
    # 2 blocks of 12·d² + 4·d, plus the final LayerNorm's 2·d: d = 64 gives 98,944.
    assert count_parameters(64, 2, 4) == (98_944, 98_944 + 2 * 256 * 64)
    with pytest.raises(InputError, match="heads"):
        count_parameters(64, 2, 3)
    with pytest.raises(InputError, match="width"):
        count_parameters(0, 2, 1)


def test_hidden_init_std_scales_with_one_over_sqrt_width_multiplier():
    base = TrainConfig(width=64, depth=1, heads=4, base_width=64, base_depth=1, context=16)
    wide = TrainConfig(width=256, depth=1, heads=4, base_width=64, base_depth=1, context=16)
    torch.manual_seed(0)
    std_base = GPT(base).blocks[0].mlp.fc.weight.std().item()
    torch.manual_seed(0)
    m_wide = GPT(wide)
    std_wide = m_wide.blocks[0].mlp.fc.weight.std().item()
    assert std_base == pytest.approx(0.02, rel=0.05)
    assert std_wide == pytest.approx(0.02 / math.sqrt(4.0), rel=0.05)
    # Embedding and unembedding keep the base init.
    assert m_wide.embed.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert m_wide.unembed.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert torch.all(m_wide.ln_f.weight == 1) and torch.all(m_wide.ln_f.bias == 0)


def test_optimizer_groups_carry_completep_lr_eps_and_decay_multipliers():
    config = TrainConfig(
        width=128,
        depth=6,
        heads=4,
        base_width=32,
        base_depth=2,
        context=16,
        lr=1e-3,
        weight_decay=0.2,
        adam_eps=1e-8,
        total_tokens=4096,
        batch_tokens=256,
    )
    p = plan(config)
    assert (p.m_n, p.m_l) == (4.0, 3.0)
    model = GPT(config)
    opt = build_optimizer(model, config, p)
    groups = {g["name"]: g for g in opt.param_groups}
    assert groups["hidden"]["lr"] == pytest.approx(1e-3)
    assert groups["hidden"]["weight_decay"] == pytest.approx(0.2)
    assert groups["hidden"]["eps"] == pytest.approx(1e-8 / 12.0)
    assert groups["embedding"]["lr"] == pytest.approx(4e-3)  # base LR η·m_N
    assert groups["embedding"]["weight_decay"] == pytest.approx(0.05)
    assert groups["embedding"]["eps"] == pytest.approx(1e-8)
    assert groups["no_decay"]["weight_decay"] == 0.0
    # Every decayed group has the same η·λ, hence one τ.
    assert groups["hidden"]["lr"] * groups["hidden"]["weight_decay"] == pytest.approx(
        groups["embedding"]["lr"] * groups["embedding"]["weight_decay"]
    )
    # Each parameter is in exactly one group; LayerNorm gains and biases are the no-decay group.
    ids = [id(q) for g in opt.param_groups for q in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    assert {id(q) for q in groups["no_decay"]["params"]} == {
        id(q) for n, q in model.named_parameters() if "ln" in n
    }


def test_residual_branches_and_logits_use_depth_and_width_multipliers():
    config = TrainConfig(width=64, depth=4, heads=4, base_width=16, base_depth=1, context=16)
    model = GPT(config)
    assert all(b.branch_scale == pytest.approx(0.25) for b in model.blocks)
    x = torch.randint(0, 256, (2, 16))
    h = model(x)
    assert torch.allclose(model.logits(x), 0.25 * h @ model.unembed.weight.T, atol=1e-6)
    # Block output is x + (1/m_L)·attn(...) + (1/m_L)·mlp(...): zeroing the branches' output matrices leaves
    # x.
    block = model.blocks[0]
    with torch.no_grad():
        block.attn.proj.weight.zero_()
        block.mlp.proj.weight.zero_()
    z = torch.randn(2, 16, 64)
    assert torch.equal(block(z), z)


@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_attention_is_causal(position):
    config = TrainConfig(width=32, depth=2, heads=4, position=position, context=16)
    model = GPT(config)
    x = torch.randint(0, 256, (1, 16))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 7) % 256
    hx, hy = model(x), model(y)
    assert torch.allclose(hx[:, :10], hy[:, :10], atol=1e-6)
    assert not torch.allclose(hx[:, 10:], hy[:, 10:], atol=1e-4)


def test_squared_relu_matches_autograd_of_relu_squared():
    x = torch.randn(50, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(SquaredReLU.apply, (x,))
    assert torch.equal(SquaredReLU.apply(x), torch.relu(x) ** 2)
