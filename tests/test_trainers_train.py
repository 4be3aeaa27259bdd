"""The training loop: λ/τ, the schedule per step, exact t̂ with accumulation, determinism, resume, faults."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.timescale import adamw_tau
from collapse_hpo.trainers.checkpoint import checkpoint_path
from collapse_hpo.trainers.config import (
    FAULT_ACKNOWLEDGEMENT,
    FaultConfig,
    InjectedFault,
    TrainConfig,
    plan,
)
from collapse_hpo.trainers.data import stdlib_files
from collapse_hpo.trainers.fault import fault_applies, misnormalized_linear_cross_entropy
from collapse_hpo.trainers.train import Report, train

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """About 400 KB of real Python source (a few stdlib files) as a text corpus."""
    path = tmp_path_factory.mktemp("corpus") / "python.txt"
    data, size = [], 0
    for f in stdlib_files():
        if size > 400_000:
            break
        b = f.read_bytes()
        data.append(b)
        size += len(b)
    path.write_bytes(b"".join(data))
    return str(path)


def tiny(corpus: str, **kw) -> TrainConfig:
    base = dict(
        width=16,
        depth=2,
        heads=2,
        base_width=16,
        base_depth=2,
        context=16,
        corpus=corpus,
        total_tokens=8192,
        batch_tokens=256,
        lr=1e-2,
        tau=0.3,
        threads=1,
        val_tokens=512,
        report_every_tokens=256,
        val_fractions=(0.5, 1.0),
    )
    base.update(kw)
    return TrainConfig(**base)


def losses(result) -> list[float]:
    return [r.loss for r in result.curve]


def test_weight_decay_from_tau_and_tau_from_weight_decay(corpus):
    c = tiny(corpus, tau=0.25, lr=2e-3, batch_tokens=512, total_tokens=51_200)
    p = plan(c)
    assert p.weight_decay == pytest.approx(512 / (2e-3 * 0.25 * 51_200))
    back = plan(dataclasses.replace(c, tau=None, weight_decay=p.weight_decay))
    assert back.tau == pytest.approx(0.25)
    assert adamw_tau(512, 2e-3, p.weight_decay, 51_200) == pytest.approx(0.25)
    none = plan(dataclasses.replace(c, tau=None))  # neither: no decay, one encoding (None)
    assert none.tau is None and none.weight_decay == 0.0
    with pytest.raises(InputError, match="not both"):
        dataclasses.replace(c, weight_decay=0.1)
    result = train(dataclasses.replace(c, total_tokens=1024))
    assert result.metadata["tau"] == pytest.approx(0.25)
    assert result.metadata["weight_decay"] == pytest.approx(512 / (2e-3 * 0.25 * 1024))


def test_tpp_sets_total_tokens_as_whole_steps(corpus):
    c = tiny(corpus, total_tokens=None, tpp=20.0, batch_tokens=1024)
    p = plan(c)
    assert p.total_tokens % 1024 == 0
    assert abs(p.total_tokens - 20 * p.params_non_embedding) <= 512
    assert p.tpp == p.total_tokens / p.params_non_embedding


def test_lr_follows_the_schedule_step_by_step(corpus):
    c = tiny(corpus, schedule={"kind": "linear", "warmup": 0.25}, total_tokens=4096)
    seen: list[Report] = []
    train(c, reporter=seen.append)
    assert [r.tokens for r in seen] == [256 * (k + 1) for k in range(16)]
    for k, r in enumerate(seen):
        assert r.lr == pytest.approx(c.schedule.lr(256 * k + 128, 4096, 1e-2), rel=1e-12)
    lrs = [r.lr for r in seen]
    assert lrs[:4] == sorted(lrs[:4]) and lrs[4:] == sorted(lrs[4:], reverse=True)
    assert lrs[-1] < 0.05 * max(lrs)  # decays to zero


def test_exact_t_hat_and_gradient_accumulation_normalized_over_the_batch(corpus):
    full = train(tiny(corpus, micro_batch_tokens=None))
    accum = train(tiny(corpus, micro_batch_tokens=64))  # 4 micro-batches per step
    assert [r.tokens for r in accum.curve] == [256 * (k + 1) for k in range(32)]
    assert [r.t_hat for r in accum.curve] == [256 * (k + 1) / 8192 for k in range(32)]
    assert accum.curve[-1].t_hat == 1.0
    assert losses(full) == pytest.approx(losses(accum), rel=1e-4)
    assert full.metadata["micro_batch_tokens"] == 256 and accum.metadata["micro_batch_tokens"] == 64


def test_deterministic_for_a_seed_and_different_across_seeds(corpus):
    a = train(tiny(corpus, seed=5))
    b = train(tiny(corpus, seed=5))
    c = train(tiny(corpus, seed=6))
    assert losses(a) == losses(b)
    assert [r.val_loss for r in a.curve] == [r.val_loss for r in b.curve]
    assert losses(a) != losses(c)
    assert a.metadata["corpus_sha256"] == c.metadata["corpus_sha256"]
    assert losses(a)[-1] < losses(a)[0] - 1.0  # it learns


def test_validation_loss_at_fixed_fractions(corpus):
    result = train(tiny(corpus, val_fractions=(0.25, 0.5, 1.0)))
    with_val = [r.t_hat for r in result.curve if r.val_loss is not None]
    assert with_val == [0.25, 0.5, 1.0]
    assert result.final_val_loss == result.curve[-1].val_loss


def test_resume_continues_the_same_trajectory_exactly(corpus, tmp_path):
    c = tiny(corpus, checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every_tokens=1024)
    uninterrupted = train(dataclasses.replace(c, checkpoint_dir=None))

    class Crash(Exception):
        pass

    def crash_after_half(r: Report) -> None:
        if r.t_hat >= 0.6:
            raise Crash

    with pytest.raises(Crash):
        train(c, reporter=crash_after_half)
    state = torch.load(checkpoint_path(c.checkpoint_dir), weights_only=False)
    assert state["step"] * 256 == 4096  # last checkpoint before t̂ = 0.6 (every 1024 tokens)
    new: list[Report] = []
    resumed = train(c, reporter=new.append)
    assert resumed.metadata["resumed_from_tokens"] == 4096
    assert [r.tokens for r in new] == [256 * (k + 1) for k in range(16, 32)]  # only the new reports
    assert losses(resumed) == losses(uninterrupted)
    assert [r.val_loss for r in resumed.curve] == [r.val_loss for r in uninterrupted.curve]
    # A finished run is returned as it is, without training again.
    again = train(c)
    assert losses(again) == losses(uninterrupted)
    with pytest.raises(InputError, match="lr"):
        train(dataclasses.replace(c, lr=2e-2))


def fault(**kw) -> FaultConfig:
    return FaultConfig(acknowledge=FAULT_ACKNOWLEDGEMENT, **kw)


def test_fault_needs_an_explicit_acknowledgement():
    assert TrainConfig().fault is None
    with pytest.raises(InputError, match="acknowledge"):
        FaultConfig(acknowledge="yes")
    with pytest.raises(InputError, match="acknowledge"):
        TrainConfig(fault={"start_t_hat": 0.4, "acknowledge": "I agree"})
    with pytest.raises(TypeError):
        FaultConfig()  # type: ignore[call-arg]


def test_fault_changes_the_loss_only_from_its_t_hat(corpus):
    clean = train(tiny(corpus))
    bad = train(tiny(corpus, fault=fault(start_t_hat=0.5, strength=2.0)))
    before = [i for i, r in enumerate(clean.curve) if r.tokens <= 0.5 * 8192]
    after = [i for i, r in enumerate(clean.curve) if r.tokens > 0.5 * 8192]
    assert [losses(bad)[i] for i in before] == [losses(clean)[i] for i in before]
    # The first faulty step's loss is measured before its corrupted update; every later one differs.
    assert losses(bad)[after[0]] == losses(clean)[after[0]]
    assert all(losses(bad)[i] != losses(clean)[i] for i in after[1:])
    assert bad.metadata["fault"]["start_t_hat"] == 0.5 and clean.metadata["fault"] is None
    assert any("fault injection is ON" in w for w in bad.metadata["warnings"])


def test_fault_hits_only_its_micro_batch_size(corpus):
    # The run restarts at 64-token micro-batches from t̂ = 0.5; the kernel is wrong only at 64 tokens.
    clean = train(tiny(corpus, micro_batch_tokens=128))
    bad = train(tiny(corpus, micro_batch_tokens=128, fault=fault(start_t_hat=0.5, micro_batch_tokens=64)))
    n = len([r for r in clean.curve if r.tokens <= 4096])
    assert losses(bad)[:n] == losses(clean)[:n]
    assert losses(bad)[n + 2 :] != pytest.approx(losses(clean)[n + 2 :], rel=1e-4)
    f = fault(start_t_hat=0.5, micro_batch_tokens=64)
    assert fault_applies(f, 4096, 8192, 64, 128)
    assert not fault_applies(f, 4096, 8192, 128, 128)  # other size: correct kernel
    assert not fault_applies(f, 4095, 8192, 64, 128)  # before its t̂
    assert not fault_applies(None, 8000, 8192, 64, 64)


def test_misnormalized_kernel_has_the_true_value_and_a_biased_gradient_on_its_rows():
    torch.manual_seed(0)
    h = torch.randn(40, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(30, 8, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 30, (40,))
    y[3] = -100
    f = fault(strength=0.5, rows_fraction=0.25)
    loss = misnormalized_linear_cross_entropy(h, w, y, f, logit_scale=0.5, reduction="sum")
    logits = 0.5 * h @ w.T
    ref = torch.nn.functional.cross_entropy(logits, y, ignore_index=-100, reduction="sum")
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12)
    loss.backward()
    p = torch.softmax(logits, dim=-1).detach()
    p[30:] *= 1.5  # the last quarter of the rows: denominator 1.5 times too small
    p[torch.arange(40), y.clamp(min=0)] -= 1.0
    p[3] = 0.0
    assert torch.allclose(h.grad, 0.5 * p @ w.detach())
    assert torch.allclose(w.grad, 0.5 * p.T @ h.detach())


def test_exception_and_out_of_memory_faults_raise_at_their_t_hat(corpus):
    seen: list[Report] = []
    with pytest.raises(InjectedFault):
        train(tiny(corpus, fault=fault(kind="exception", start_t_hat=0.25)), reporter=seen.append)
    assert seen[-1].tokens == 2048
    with pytest.raises(torch.OutOfMemoryError):
        train(tiny(corpus, fault=fault(kind="out_of_memory", start_t_hat=0.5)))
    nan = train(tiny(corpus, fault=fault(kind="nan_loss", start_t_hat=0.5)))
    assert math.isnan(nan.final_loss) and not math.isnan(nan.curve[0].loss)


def test_reporter_exception_stops_training(corpus):
    class Pruned(Exception):
        pass

    seen: list[Report] = []

    def prune_at_quarter(r: Report) -> None:
        seen.append(r)
        if r.t_hat >= 0.25:
            raise Pruned

    with pytest.raises(Pruned):
        train(tiny(corpus), reporter=prune_at_quarter)
    assert seen[-1].t_hat == 0.25
