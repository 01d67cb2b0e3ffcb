"""The built-in models' modules and configs, written from scratch (the registry that builds
them with example inputs is :mod:`remat.zoo`).

GPT-style (fused SDPA or explicit softmax attention), Llama-style and a dropout MLP; the image
models (ResNet-style conv net, ViT) are in :mod:`remat.vision_models`. Every model's ``forward``
returns a scalar loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

Inputs = tuple[torch.Tensor, ...]

ATTENTION_KINDS = ("sdpa", "softmax")


def _check_heads(d_model: int, heads: int) -> None:
    """Raise ValueError unless ``d_model`` splits evenly into ``heads``."""
    if d_model % heads:
        raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")


# --------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class TransformerShape:
    """What every transformer here is sized by; ``d_model`` splits evenly into ``heads``."""

    layers: int = 2
    d_model: int = 64
    heads: int = 4
    batch: int = 2
    # a graph break after this many blocks (a data-dependent branch, as a training loop's NaN check
    # makes): torch.compile then captures two graphs; None: one
    graph_break_after: int | None = None

    def __post_init__(self) -> None:
        _check_heads(self.d_model, self.heads)
        if self.graph_break_after is not None and not 0 < self.graph_break_after < self.layers:
            raise ValueError(f"graph_break_after must be between 1 and layers - 1, got {self.graph_break_after}")


def run_blocks(blocks: nn.ModuleList, x: torch.Tensor, split: int | None, *args: torch.Tensor) -> torch.Tensor:
    """``x`` through every block, with a graph break after the first ``split`` of them (a data-dependent
    branch, outside any loop, so that torch.compile resumes in a second graph)."""
    first = len(blocks) if split is None else split
    for block in blocks[:first]:
        x = block(x, *args)
    if split is None:
        return x
    if bool(x.isnan().any()):  # data-dependent: dynamo breaks the graph here
        raise FloatingPointError("NaN in the activations")
    for block in blocks[first:]:
        x = block(x, *args)
    return x


@dataclass(frozen=True)
class GPTConfig(TransformerShape):
    """GPT-2 style decoder; ``attention`` is "sdpa" (fused) or "softmax" (explicit)."""

    seq: int = 32
    vocab: int = 256
    mlp_ratio: int = 4
    dropout: float = 0.0
    attention: str = "sdpa"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {self.attention!r}")


@dataclass(frozen=True)
class LlamaConfig(TransformerShape):
    """Llama style decoder: RMSNorm, rotary embeddings, SwiGLU, no biases."""

    seq: int = 32
    vocab: int = 256
    hidden: int = 172

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.d_model // self.heads) % 2:
            raise ValueError("rotary embeddings need an even head dimension")


@dataclass(frozen=True)
class MLPConfig:
    """Regression MLP with heavy dropout."""

    layers: int = 3
    width: int = 64
    batch: int = 8
    dropout: float = 0.5


# --------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------


def _dropout(p: float) -> nn.Module:
    """Dropout with probability ``p``, or Identity when ``p`` is 0 (keeps graphs clean)."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


def _split_heads(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split a fused (B, T, 3*C) projection into q, k, v of shape (B, heads, T, C/heads)."""
    b, t, c3 = qkv.shape
    q, k, v = qkv.view(b, t, 3, heads, c3 // (3 * heads)).permute(2, 0, 3, 1, 4).unbind(0)
    return q, k, v


def _merge_heads(y: torch.Tensor) -> torch.Tensor:
    """Inverse of the head split: (B, H, T, D) -> (B, T, H*D)."""
    b, h, t, d = y.shape
    return y.transpose(1, 2).reshape(b, t, h * d)


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused qkv projection."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        *,
        causal: bool,
        dropout: float = 0.0,
        attention: str = "sdpa",
    ) -> None:
        super().__init__()
        self.heads = heads
        self.causal = causal
        self.dropout = dropout
        self.attention = attention
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.attn_drop = _dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend over the sequence of ``x`` (B, T, C)."""
        q, k, v = _split_heads(self.qkv(x), self.heads)
        if self.attention == "sdpa":
            p = self.dropout if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=self.causal)
        else:
            y = self._softmax_attention(q, k, v)
        return self.proj(_merge_heads(y))

    def _softmax_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention spelled out as matmul, mask, softmax, dropout, matmul."""
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if self.causal:
            t = q.shape[-2]
            future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        return self.attn_drop(scores.softmax(dim=-1)) @ v


class Block(nn.Module):
    """Pre-LayerNorm transformer block: attention and a GELU MLP, each residual."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        *,
        causal: bool,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
        attention: str = "sdpa",
    ) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, heads, causal=causal, dropout=dropout, attention=attention)
        self.resid_drop = _dropout(dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, mlp_ratio * d_model),
            nn.GELU(),
            nn.Linear(mlp_ratio * d_model, d_model),
            _dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block to ``x`` (B, T, C)."""
        x = x + self.resid_drop(self.attn(self.ln1(x)))
        return x + self.mlp(self.ln2(x))


# --------------------------------------------------------------------------
# GPT
# --------------------------------------------------------------------------


class GPT(nn.Module):
    """GPT-2 style language model returning the next-token cross-entropy loss."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq, cfg.d_model)
        self.blocks = nn.ModuleList(
            Block(
                cfg.d_model,
                cfg.heads,
                causal=True,
                mlp_ratio=cfg.mlp_ratio,
                dropout=cfg.dropout,
                attention=cfg.attention,
            )
            for _ in range(cfg.layers)
        )
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.graph_break_after = cfg.graph_break_after

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Loss of predicting ``targets`` (B, T) from token ids ``idx`` (B, T)."""
        return next_token_loss(self.predict(idx), targets)

    def predict(self, idx: torch.Tensor) -> torch.Tensor:
        """Next-token logits (B, T, vocab) from token ids ``idx`` (B, T)."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = run_blocks(self.blocks, self.tok_emb(idx) + self.pos_emb(pos), self.graph_break_after)
        return self.lm_head(self.ln_f(x))


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of logits (B, T, vocab) against targets (B, T)."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


# --------------------------------------------------------------------------
# Llama
# --------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` over its last dimension."""
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seq: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary cos and sin tables of shape (seq, head_dim), halves repeated."""
    inv_freq = base ** -(torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (..., T, D) by position, rotate-half formulation."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaAttention(nn.Module):
    """Causal SDPA attention with rotary embeddings and no biases."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.wqkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Attend over ``x`` (B, T, C) with rotary tables (T, C/heads)."""
        q, k, v = _split_heads(self.wqkv(x), self.heads)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(_merge_heads(y))


class SwiGLU(nn.Module):
    """Gated MLP: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden, bias=False)
        self.w3 = nn.Linear(d_model, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the gated MLP to ``x``."""
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    """Pre-RMSNorm block: rotary attention and SwiGLU, each residual."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = LlamaAttention(cfg.d_model, cfg.heads)
        self.mlp_norm = RMSNorm(cfg.d_model)
        self.mlp = SwiGLU(cfg.d_model, cfg.hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Apply the block to ``x`` (B, T, C)."""
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """Llama style language model returning the next-token cross-entropy loss."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.layers))
        self.graph_break_after = cfg.graph_break_after
        self.norm = RMSNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        cos, sin = rope_tables(cfg.seq, cfg.d_model // cfg.heads)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Loss of predicting ``targets`` (B, T) from token ids ``idx`` (B, T)."""
        return next_token_loss(self.predict(idx), targets)

    def predict(self, idx: torch.Tensor) -> torch.Tensor:
        """Next-token logits (B, T, vocab) from token ids ``idx`` (B, T)."""
        t = idx.shape[1]
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x = run_blocks(self.blocks, self.tok_emb(idx), self.graph_break_after, cos, sin)
        return self.lm_head(self.norm(x))


# --------------------------------------------------------------------------
# DropoutMLP
# --------------------------------------------------------------------------


class DropoutMLP(nn.Module):
    """(Linear-GELU-Dropout) x layers, then Linear to one output; returns MSE loss."""

    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        hidden = (
            module
            for _ in range(cfg.layers)
            for module in (nn.Linear(cfg.width, cfg.width), nn.GELU(), _dropout(cfg.dropout))
        )
        self.net = nn.Sequential(*hidden, nn.Linear(cfg.width, 1))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean squared error of predicting ``y`` (N, 1) from ``x`` (N, width)."""
        return F.mse_loss(self.predict(x), y)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Predictions (N, 1) from ``x`` (N, width)."""
        return self.net(x)
