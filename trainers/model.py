"""A small GPT with CompleteP (α = 1) parameterization, meant to be read in one sitting.

Shape: ``width`` d, ``depth`` L blocks, ``heads`` attention heads, untied token embedding and unembedding.
Each block is pre-LN:  x ← x + (1/m_L)·Attn(LN(x));  x ← x + (1/m_L)·MLP(LN(x)).
The final LayerNorm's output h goes to the unembedding; the logits are (1/m_N)·h·Wᵀ. The model returns h and
leaves the logits to the loss (`trainers.train` uses the fused linear + cross-entropy kernel, which never
forms the full [tokens × vocab] logits).

Choices (documented in `TrainConfig`):
- MLP: squared-ReLU (``relu(x W1)² W2``, Celerity's choice, the default) or SwiGLU (``(silu(x W1) ⊙ x W3)
  W2``).
- Positions: RoPE (rotary q/k, the default: keeps `scaled_dot_product_attention` causal/flash on CUDA) or
  ALiBi (a per-head linear distance penalty added to the attention scores).
- No biases in linear layers; LayerNorms have gain and bias.

CompleteP against a base shape (METHOD.md §7), m_N = width/base_width, m_L = depth/base_depth:
- hidden matrices (attention and MLP): init std σ/√m_N; LR η_base/m_N and Adam ε/(m_N·m_L) (set in
  `trainers.optim`); the embeddings and the unembedding: init std σ, base LR.
- residual branches scaled by 1/m_L; logits scaled by 1/m_N (``logit_scale``).
- attention scores scaled by √(d_head,base)/d_head (μP's 1/d_head, equal to 1/√d_head at the base head size).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from collapse_hpo.trainers.config import TrainConfig, mlp_hidden


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE, base 10000, GPT-NeoX "rotate half" pairing: dimension i rotates with
    i + d_head/2) applied to tensors [..., T, d_head] (q and k stacked in one call)."""

    def __init__(self, head_dim: int, context: int) -> None:
        super().__init__()
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(context, dtype=torch.float32), inv_freq)  # [T, d_head/2]
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[-2]
        cos, sin = self.cos[:t].to(x.dtype), self.sin[:t].to(x.dtype)
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def alibi_bias(heads: int, context: int) -> torch.Tensor:
    """ALiBi additive attention bias [heads, T, T]: −slope_h·(i − j) for j ≤ i, −inf above the diagonal.

    Slopes are the geometric sequence 2^(−8h/H) of the ALiBi paper (for any head count, by interpolation).
    """
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)])
    pos = torch.arange(context)
    dist = (pos[:, None] - pos[None, :]).float()  # i - j
    bias = -slopes[:, None, None] * dist
    return bias.masked_fill(dist < 0, float("-inf"))


class Attention(nn.Module):
    """Causal multi-head self-attention with a fused QKV projection."""

    def __init__(self, config: TrainConfig) -> None:
        super().__init__()
        d, h = config.width, config.heads
        self.heads, self.head_dim = h, d // h
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        base_head_dim = config.base_width / h
        self.scale = math.sqrt(base_head_dim) / self.head_dim
        self.position = config.position
        if config.position == "rope":
            self.rope = RotaryEmbedding(self.head_dim, config.context)
        else:
            self.register_buffer("alibi", alibi_bias(h, config.context), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.position == "rope":
            q, k = self.rope(qkv[:2]).unbind(0)
            v = qkv[2]
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        else:
            q, k, v = qkv.unbind(0)
            mask = self.alibi[:, :t, :t].to(q.dtype)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class SquaredReLU(torch.autograd.Function):
    """relu(x)² with a one-tensor backward (2·relu(x)·grad), cheaper than autograd through relu and square."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        r = torch.relu(x)
        ctx.save_for_backward(r)
        return r * r

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        (r,) = ctx.saved_tensors
        return grad * r * 2.0


class MLP(nn.Module):
    """Squared-ReLU (2 matrices) or SwiGLU (3 matrices) feed-forward block."""

    def __init__(self, config: TrainConfig) -> None:
        super().__init__()
        d = config.width
        hidden = mlp_hidden(d, config.mlp, config.mlp_ratio)
        self.kind = config.mlp
        self.fc = nn.Linear(d, hidden, bias=False)
        self.gate = nn.Linear(d, hidden, bias=False) if config.mlp == "swiglu" else None
        self.proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            return self.proj(F.silu(self.gate(x)) * self.fc(x))
        return self.proj(SquaredReLU.apply(self.fc(x)))


class Block(nn.Module):
    """Pre-LN transformer block with CompleteP's 1/m_L residual-branch multiplier."""

    def __init__(self, config: TrainConfig, branch_scale: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.width)
        self.attn = Attention(config)
        self.ln2 = nn.LayerNorm(config.width)
        self.mlp = MLP(config)
        self.branch_scale = branch_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.branch_scale * self.attn(self.ln1(x))
        return x + self.branch_scale * self.mlp(self.ln2(x))


class GPT(nn.Module):
    """The decoder. ``forward(idx [B, T]) -> h [B, T, d]``; logits are ``logit_scale · h @ unembed.weight.T``.

    Attributes:
        m_n, m_l: CompleteP width and depth multipliers. logit_scale: 1/m_N.
    """

    def __init__(self, config: TrainConfig) -> None:
        super().__init__()
        self.config = config
        self.m_n = config.width / config.base_width
        self.m_l = config.depth / config.base_depth
        self.logit_scale = 1.0 / self.m_n
        self.embed = nn.Embedding(config.vocab_size, config.width)
        self.blocks = nn.ModuleList(Block(config, 1.0 / self.m_l) for _ in range(config.depth))
        self.ln_f = nn.LayerNorm(config.width)
        self.unembed = nn.Linear(config.width, config.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """CompleteP init: hidden matrices N(0, σ²/m_N); embeddings N(0, σ²); LayerNorm gain 1, bias 0."""
        sigma = self.config.init_std
        for name, p in self.named_parameters():
            if name in ("embed.weight", "unembed.weight"):
                nn.init.normal_(p, 0.0, sigma)
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, sigma / math.sqrt(self.m_n))
            elif name.endswith("weight"):
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def logits(self, idx: torch.Tensor) -> torch.Tensor:
        """Full logits [B, T, vocab] (for evaluation and sampling; training never forms them)."""
        return self.logit_scale * (self(idx) @ self.unembed.weight.T)

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        """Parameters by CompleteP role: "hidden" (attention and MLP matrices), "embedding" (token embedding
        and unembedding), "no_decay" (LayerNorm gains and biases)."""
        groups: dict[str, list[nn.Parameter]] = {"hidden": [], "embedding": [], "no_decay": []}
        for name, p in self.named_parameters():
            if name in ("embed.weight", "unembed.weight"):
                groups["embedding"].append(p)
            elif p.dim() == 2:
                groups["hidden"].append(p)
            else:
                groups["no_decay"].append(p)
        return groups

    def count_parameters(self) -> tuple[int, int]:
        """(non_embedding, total) parameters of this instance."""
        total = sum(p.numel() for p in self.parameters())
        emb = self.embed.weight.numel() + self.unembed.weight.numel()
        return total - emb, total
