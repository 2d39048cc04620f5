"""Small transformers to train in the chapters: a causal ``TinyGPT`` and a bidirectional ``TinyEncoder``.

nanoGPT-style (Radford et al., 2019 for the pre-norm GPT-2 block): a config dataclass, then one
small class per idea (attention, MLP, block, model). What is special here is that the positional
scheme is a setting, so Chapter 3 can train the same network with each of

* ``"none"``: no position information at all (a causal mask still leaks some, see Chapter 3);
* ``"sinusoidal"`` / ``"learned"``: absolute vectors added to the token embeddings;
* ``"t5"``: T5's bucketed relative bias, one table shared by all layers;
* ``"alibi"``: ALiBi's fixed linear bias;
* ``"rope"``: rotary embeddings applied to queries and keys in every layer.

Attention runs through :func:`attnbook.core.scaled_dot_product_attention` (an additive bias for t5
and alibi) with the projection layout of :class:`attnbook.core.MultiHeadAttention` (``q_proj``,
``k_proj``, ``v_proj``, ``out_proj``; ``n_kv_heads < n_heads`` gives grouped-query attention).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .core import scaled_dot_product_attention
from .positional import LearnedPositionalEmbedding, RotaryEmbedding, T5RelativeBias, alibi_bias, sinusoidal_encoding

__all__ = ["POSITIONAL_SCHEMES", "TransformerConfig", "Attention", "MLP", "Block", "TinyGPT", "TinyEncoder"]

POSITIONAL_SCHEMES = ("none", "sinusoidal", "learned", "t5", "alibi", "rope")


@dataclass
class TransformerConfig:
    """Sizes and the positional scheme. ``max_len`` is the size of the ``learned`` table; every
    other scheme runs at any length."""

    vocab_size: int = 32
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    n_kv_heads: int | None = None
    d_ff: int | None = None  # default 4 * d_model
    max_len: int = 512
    positional: str = "rope"
    dropout: float = 0.0
    rope_base: float = 10000.0
    t5_num_buckets: int = 32
    t5_max_distance: int = 128

    def __post_init__(self):
        if self.positional not in POSITIONAL_SCHEMES:
            raise ValueError(f"positional must be one of {POSITIONAL_SCHEMES}, got {self.positional!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")


class Attention(nn.Module):
    """Multi-head self-attention with an optional rotary embedding and an optional additive bias."""

    def __init__(self, config: TransformerConfig, causal: bool):
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads or config.n_heads
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")
        self.head_dim = config.d_model // config.n_heads
        self.causal, self.dropout = causal, config.dropout
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.k_proj = nn.Linear(config.d_model, self.n_kv_heads * self.head_dim)
        self.v_proj = nn.Linear(config.d_model, self.n_kv_heads * self.head_dim)
        self.out_proj = nn.Linear(config.d_model, config.d_model)
        self.rotary = RotaryEmbedding(self.head_dim, config.rope_base) if config.positional == "rope" else None

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x``: ``(B, T, d_model)``; ``bias``: additive, broadcastable to ``(B, n_heads, T, T)``."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.rotary is not None:  # rotate after the projection, in every layer
            q, k = self.rotary(q), self.rotary(k)
        group = self.n_heads // self.n_kv_heads
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = scaled_dot_product_attention(q, k, v, bias, is_causal=self.causal,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """Position-wise feed-forward network ``W_2 GELU(W_1 x)``."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        hidden = config.d_ff or 4 * config.d_model
        self.fc, self.proj = nn.Linear(config.d_model, hidden), nn.Linear(hidden, config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm residual block: ``x + Attn(LN(x))``, then ``x + MLP(LN(x))``."""

    def __init__(self, config: TransformerConfig, causal: bool):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(config.d_model), nn.LayerNorm(config.d_model)
        self.attn, self.mlp = Attention(config, causal), MLP(config)

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), bias)
        return x + self.mlp(self.ln2(x))


class _Transformer(nn.Module):
    """Embeddings, positional scheme, blocks, final norm and a linear head over the vocabulary."""

    causal: bool

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        if config.positional == "learned":
            self.pos_emb = LearnedPositionalEmbedding(config.max_len, config.d_model)
        elif config.positional == "t5":
            self.rel_bias = T5RelativeBias(config.n_heads, config.t5_num_buckets, config.t5_max_distance,
                                           bidirectional=not self.causal)
        self.blocks = nn.ModuleList(Block(config, self.causal) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def _positions(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Add absolute encodings to ``x`` (B, T, d) and build the additive bias (1, h, T, T), if any."""
        T, scheme = x.shape[1], self.config.positional
        if scheme == "sinusoidal":
            x = x + sinusoidal_encoding(T, self.config.d_model).to(x)
        elif scheme == "learned":
            x = x + self.pos_emb(T)
        if scheme == "t5":
            return x, self.rel_bias(T)
        if scheme == "alibi":
            return x, alibi_bias(self.config.n_heads, T, causal=self.causal).to(x)
        return x, None

    def forward(self, idx: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``idx``: ``(B, T)`` token ids -> logits ``(B, T, vocab_size)``.

        ``attn_mask``: optional bool ``(B, 1, 1, T)`` key-padding mask (True = real token).
        """
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (batch, seq), got {tuple(idx.shape)}")
        x, bias = self._positions(self.tok_emb(idx))
        if attn_mask is not None:
            padding = torch.zeros(attn_mask.shape, dtype=x.dtype, device=x.device).masked_fill(~attn_mask, float("-inf"))
            bias = padding if bias is None else bias + padding
        for block in self.blocks:
            x = block(x, bias)
        return self.head(self.ln_f(x))


class TinyGPT(_Transformer):
    """A causal (decoder-only) language model: position ``t`` sees tokens ``0..t``."""

    causal = True


class TinyEncoder(_Transformer):
    """A bidirectional encoder (BERT-style, no causal mask) with a per-token output head."""

    causal = False
