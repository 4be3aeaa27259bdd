"""Training speed on this CPU: our trainer vs a plain PyTorch GPT of the same shape (not a test).

For each size (about 50K, 200K and 1M non-embedding parameters, context 128, 4,096-token batches) it times
`collapse_hpo.trainers.train.train` (CompleteP groups, fused linear + cross-entropy kernel, reporting, the
real data pipeline) and a plain nanoGPT-style model of the same width, depth and heads (learned positions,
GELU MLP, full logits with F.cross_entropy, one AdamW group) fed from the same batches. Each configuration
runs ``--repeats`` times and the best tokens/s is kept (the CPU is shared, so the best run is the least
disturbed).

    .venv/bin/python studies/bench/train_speed.py --threads 2 --steps 40 --repeats 2
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from collapse_hpo.trainers.config import TrainConfig, count_parameters
from collapse_hpo.trainers.data import TrainBatches, load_corpus
from collapse_hpo.trainers.train import train

SIZES = [(64, 1, 4), (96, 2, 4), (160, 3, 4)]


class PlainBlock(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.fc, self.out = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class PlainGPT(nn.Module):
    """nanoGPT-style baseline: learned positions, GELU MLP, untied head, full logits."""

    def __init__(self, d: int, depth: int, heads: int, context: int, vocab: int = 256) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(PlainBlock(d, heads) for _ in range(depth))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def plain_speed(d: int, depth: int, heads: int, steps: int, batch_tokens: int, context: int) -> float:
    """Tokens/s of the plain model over ``steps`` optimizer steps (data drawn like the trainer's)."""
    torch.manual_seed(0)
    model = PlainGPT(d, depth, heads, context)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    batches = TrainBatches(load_corpus("stdlib", context), context, 256, data_seed=0)
    per = batch_tokens // context
    t0 = time.perf_counter()
    for step in range(steps):
        x, y = batches.get(step * per, per)
        loss = F.cross_entropy(model(x).view(-1, 256), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return steps * batch_tokens / (time.perf_counter() - t0)


def ours_speed(d: int, depth: int, heads: int, steps: int, batch_tokens: int, context: int) -> float:
    """Tokens/s of `train` (metadata tokens_per_second: the whole loop with reports; no validation)."""
    config = TrainConfig(width=d, depth=depth, heads=heads, base_width=d, base_depth=depth, context=context,
                         total_tokens=steps * batch_tokens, batch_tokens=batch_tokens, tau=0.2,
                         val_fractions=(), val_tokens=4096)  # no validation: the plain loop has none
    return train(config).metadata["tokens_per_second"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--context", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_corpus("stdlib", args.context)  # load once, outside the timings
    print(f"torch {torch.__version__}, {args.threads} threads, {args.steps} steps of {args.batch_tokens} "
          f"tokens, best of {args.repeats}")
    print(f"{'width':>5} {'depth':>5} {'heads':>5} {'N non-emb':>10} {'ours tok/s':>11} {'plain tok/s':>12} "
          f"{'ratio':>6}")
    for d, depth, heads in SIZES:
        n, _ = count_parameters(d, depth, heads)
        ours, plain = -math.inf, -math.inf
        for _ in range(args.repeats):  # interleaved, so both see the same machine load
            ours = max(ours, ours_speed(d, depth, heads, args.steps, args.batch_tokens, args.context))
            plain = max(plain, plain_speed(d, depth, heads, args.steps, args.batch_tokens, args.context))
        print(f"{d:>5} {depth:>5} {heads:>5} {n:>10,} {ours:>11,.0f} {plain:>12,.0f} {ours / plain:>6.2f}",
              flush=True)


if __name__ == "__main__":
    main()
