"""Small transformers to train in the chapters: a causal ``TinyGPT`` and a bidirectional
``TinyEncoder``.

nanoGPT-style (Radford et al., 2019 for the pre-norm GPT-2 block): a config dataclass,
then one small class per idea (attention, MLP, block, model). What is special here is
that the positional scheme is a setting, so the chapter on positions can train the same
network with each of

* ``"none"``: no position information at all (a causal mask still leaks some, see
  the chapter on positions);
* ``"sinusoidal"`` / ``"learned"``: absolute vectors added to the token embeddings;
* ``"t5"``: T5's bucketed relative bias, one table shared by all layers;
* ``"alibi"``: ALiBi's fixed linear bias;
* ``"rope"``: rotary embeddings applied to queries and keys in every layer.

Attention runs through :func:`attnbook.core.scaled_dot_product_attention` (an additive
bias for t5 and alibi) with the projection layout of
:class:`attnbook.core.MultiHeadAttention` (``q_proj``, ``k_proj``, ``v_proj``,
``out_proj``; ``n_kv_heads < n_heads`` gives grouped-query attention).

Every forward pass takes a ``head_mask`` (1 keeps a head, 0 removes its output; Michel,
Levy & Neubig, 2019) and can return the attention weights of every layer: what head
pruning (:func:`head_importance`), DropHead (:func:`drophead_mask`) and debugging by
looking at the weights need.

The attention itself is a setting too: ``attention="mha"`` (the default) is the layer
above, ``"mla"`` DeepSeek-V2's multi-head latent attention (:class:`LatentAttention`,
built on :class:`attnbook.serving.MultiHeadLatentAttention`), which caches one
compressed latent per token instead of every head's key and value.

``TinyGPT.generate`` decodes greedily or by sampling, with or without a KV cache
(:class:`attnbook.kvcache.KVCache`; a latent cache for MLA). With a cache every forward
pass feeds only the new tokens: their positions start at ``cache.length``, RoPE rotates
the new keys before they are stored, and the t5/alibi biases are rebuilt for ``(new
queries, all keys)`` from positions. On CUDA a one-token step without a bias runs the
split-KV Triton kernel (:mod:`attnbook.kernels.decode`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import nn
from torch.nn import functional as F

from .serving import LatentKVCache, MultiHeadLatentAttention
from .core import MultiHeadAttention, scaled_dot_product_attention
from .data import BOS, EOS, PAD
from .kernels import plan_for
from .kvcache import KVCache, decode_attention
from .positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    T5RelativeBias,
    alibi_bias,
    sinusoidal_encoding,
)

__all__ = [
    "POSITIONAL_SCHEMES",
    "RMSNorm",
    "TransformerConfig",
    "Attention",
    "LatentAttention",
    "MLP",
    "Block",
    "TinyGPT",
    "TinyEncoder",
    "head_importance",
    "drophead_mask",
    "induction_scores",
    "DecoderBlock",
    "TinySeq2Seq",
    "head_ablation",
]

POSITIONAL_SCHEMES = ("none", "sinusoidal", "learned", "t5", "alibi", "rope")
ATTENTION_KINDS = ("mha", "mla")
INITS = ("torch", "normal", "scaled")


@dataclass
class TransformerConfig:
    """Sizes, the positional scheme and the block's variant. ``max_len`` is the size of
    the ``learned`` table; every other scheme runs at any length.

    The block: ``norm`` is ``"layernorm"`` or ``"rmsnorm"`` (:class:`RMSNorm`);
    ``norm_position`` ``"pre"`` (GPT-2: ``x + f(norm(x))``) or ``"post"`` (Vaswani et
    al.: ``norm(x + f(x))``); ``mlp`` ``"gelu"`` or ``"swiglu"`` (Shazeer, 2020, with
    the hidden width ``8 d / 3`` so its three matrices hold as many weights as GELU's
    two of width ``4 d``; ``"none"``: attention-only blocks, as in the study of
    induction heads by Olsson et al., 2022); ``tie_weights`` makes the output head the
    token embedding (Press and Wolf, 2017). ``init``: ``"torch"`` keeps PyTorch's
    default initialization of each layer; ``"normal"`` draws every weight matrix and
    embedding from ``N(0, 0.02^2)`` with zero biases (GPT-2); ``"scaled"`` also divides
    the standard deviation of the two projections that write into the residual stream
    (attention's ``out_proj``, the MLP's ``proj``) by ``sqrt(2 n_layers)`` (Radford et
    al., 2019), so the stream's variance stays level with depth. ``attention``:
    ``"mha"`` is :class:`Attention` (grouped-query with ``n_kv_heads``); ``"mla"`` is
    :class:`LatentAttention` (DeepSeek-AI, 2024) with a latent of ``kv_latent_dim``
    (default ``4 * head_dim``, DeepSeek-V2's ratio), a decoupled rotary part of
    ``rope_dim`` and, when ``q_latent_dim`` is given, compressed queries; it needs
    ``positional="rope"`` (its rotary part is the positional scheme) and no
    ``n_kv_heads``. The defaults are the pre-norm GELU block with PyTorch's
    initialization and multi-head attention that every chapter trained before these
    options existed."""

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
    norm: str = "layernorm"  # or "rmsnorm"
    norm_position: str = "pre"  # or "post" (Vaswani et al.)
    mlp: str = "gelu"  # or "swiglu"
    tie_weights: bool = False  # the output head shares the token embedding
    init: str = "torch"  # or "normal", "scaled" (GPT-2): see _Transformer.reset_weights
    attention: str = "mha"  # or "mla" (DeepSeek-V2's multi-head latent attention)
    kv_latent_dim: int | None = None  # MLA: the cached latent, default 4 * head_dim
    q_latent_dim: int | None = None  # MLA: the query latent (None: no compression)
    rope_dim: int = 16  # MLA: the width of the decoupled rotary part

    def __post_init__(self):
        if self.positional not in POSITIONAL_SCHEMES:
            raise ValueError(
                f"positional must be one of {POSITIONAL_SCHEMES}, got "
                f"{self.positional!r}"
            )
        for name, allowed in (
            ("norm", ("layernorm", "rmsnorm")),
            ("norm_position", ("pre", "post")),
            ("mlp", ("gelu", "swiglu", "none")),
            ("init", INITS),
            ("attention", ATTENTION_KINDS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{name} must be one of {allowed}, got {getattr(self, name)!r}"
                )
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}"
            )
        if self.attention == "mla" and (
            self.positional != "rope" or self.n_kv_heads is not None
        ):
            raise ValueError(
                "attention='mla' needs positional='rope' (its decoupled rotary part) "
                "and n_kv_heads=None (every head reads the one latent), got "
                f"positional={self.positional!r}, n_kv_heads={self.n_kv_heads}"
            )


class Attention(MultiHeadAttention):
    """:class:`attnbook.core.MultiHeadAttention` (the same projections, the same
    grouped-query layout) as a decoder or encoder layer needs it: self-attention with an
    optional rotary embedding, an optional additive bias, a KV cache and head masks."""

    def __init__(self, config: TransformerConfig, *, is_causal: bool, layer: int = 0):
        super().__init__(
            config.d_model, config.n_heads, config.n_kv_heads, dropout=config.dropout
        )
        self.layer = layer  # which slot of a KV cache this attention writes
        self.is_causal = is_causal
        self.rotary = (
            RotaryEmbedding(self.head_dim, config.rope_base)
            if config.positional == "rope"
            else None
        )

    def forward(
        self,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        cache: KVCache | None = None,
        *,
        head_mask: torch.Tensor | None = None,
        return_weights: bool = False,
    ):
        """``x``: ``(B, T, d_model)``; ``bias``: additive, broadcastable to ``(B,
        n_heads, T, S)``.

        With a ``cache`` holding ``P`` positions, ``x`` holds positions ``P .. P+T-1``,
        their keys and values are appended to the cache and the queries attend to all
        ``S = P + T`` cached keys. ``head_mask``: ``(n_heads,)`` or ``(B, n_heads)``
        factors on each head's output before ``out_proj`` (0 removes the head).
        ``return_weights=True`` also returns the weights ``(B, n_heads, T, S)``.
        """
        B, T, _ = x.shape
        offset = cache.length if cache is not None else 0
        q = self._split(self.q_proj(x), self.n_heads)
        k = self._split(self.k_proj(x), self.n_kv_heads)
        v = self._split(self.v_proj(x), self.n_kv_heads)
        # rotate after the projection, in every layer; cached keys stay rotated, except
        # in a cache that numbers positions by slot (attention sinks): it stores them
        # unrotated and they are rotated by their place in the cache at every step
        in_cache = getattr(cache, "positions_in_cache", False)
        if self.rotary is not None and not in_cache:
            q, k = self.rotary(q, offset=offset), self.rotary(k, offset=offset)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
            if self.rotary is not None and in_cache:
                q = self.rotary(q, offset=k.shape[-2] - T)
                k = self.rotary(k)
            if (
                T == 1
                and bias is None
                and not return_weights
                and x.is_cuda
                and not self.training
                and type(cache) is KVCache
                and plan_for("decode", q)[0] == "triton"
            ):
                # one token against the whole cache: the split-KV decoding kernel
                lengths = torch.full(
                    (B,), offset + 1, dtype=torch.int32, device=x.device
                )
                out = decode_attention(q, k, v, lengths, backend="triton")
                return self._merge_heads(out, head_mask)
        out, weights = scaled_dot_product_attention(
            q,
            k,
            v,
            bias,
            is_causal=self.is_causal,
            dropout_p=self.dropout if self.training else 0.0,
            return_weights=True,
            enable_gqa=True,  # n_kv_heads < n_heads: grouped-query attention
        )
        out = self._merge_heads(out, head_mask)
        return (out, weights) if return_weights else out

    def _merge_heads(
        self, out: torch.Tensor, head_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """``(B, n_heads, T, head_dim)`` -> ``(B, T, d_model)``: scale each head by its
        entry of ``head_mask``, concatenate the heads, apply ``out_proj``."""
        B, _, T, _ = out.shape
        if head_mask is not None:
            if head_mask.shape[-1] != self.n_heads or head_mask.dim() > 2:
                raise ValueError(
                    f"head_mask must have shape (n_heads={self.n_heads},) or (batch, "
                    f"n_heads), got {tuple(head_mask.shape)}"
                )
            out = out * head_mask.to(out)[..., None, None]
        return self.out_proj(out.transpose(1, 2).reshape(B, T, -1))


class LatentAttention(MultiHeadLatentAttention):
    """:class:`attnbook.serving.MultiHeadLatentAttention` as the layer of a
    :class:`Block` (``config.attention="mla"``): the signature of :class:`Attention`
    (``bias`` is any additive mask, such as the padding mask of
    ``TinyGPT.forward``), a :class:`attnbook.serving.LatentKVCache` as its
    cache, which it reads with the up-projections absorbed."""

    def __init__(self, config: TransformerConfig, *, is_causal: bool, layer: int = 0):
        head_dim = config.d_model // config.n_heads
        super().__init__(
            config.d_model,
            config.n_heads,
            config.kv_latent_dim or 4 * head_dim,
            config.rope_dim,
            q_latent_dim=config.q_latent_dim,
            rope_base=config.rope_base,
            dropout=config.dropout,
            layer=layer,
        )
        self.is_causal = is_causal

    def forward(
        self,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        cache: LatentKVCache | None = None,
        *,
        head_mask: torch.Tensor | None = None,
        return_weights: bool = False,
    ):
        """As :meth:`Attention.forward`."""
        return super().forward(
            x,
            bias,
            cache,
            is_causal=self.is_causal,
            head_mask=head_mask,
            return_weights=return_weights,
        )


def _self_attention(
    config: TransformerConfig, *, is_causal: bool, layer: int
) -> nn.Module:
    """The self-attention layer ``config.attention`` names."""
    kind = LatentAttention if config.attention == "mla" else Attention
    return kind(config, is_causal=is_causal, layer=layer)


class RMSNorm(nn.Module):
    """Root-mean-square normalization (Zhang and Sennrich, 2019): ``x / sqrt(mean(x^2)
    + eps) * weight``, LayerNorm without the mean subtraction and the bias.

    Equal to ``torch.nn.RMSNorm(dim, eps)``; ``eps=None`` takes the machine epsilon of
    the input's dtype, as torch does. Shapes ``(..., dim)`` -> the same."""

    def __init__(self, dim: int, eps: float | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.weight


def _norm(config: TransformerConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm(config.d_model)
    return nn.LayerNorm(config.d_model)


class MLP(nn.Module):
    """Position-wise feed-forward network: ``W_2 GELU(W_1 x)``, or with ``mlp="swiglu"``
    ``W_2 (SiLU(W_1 x) * W_3 x)`` (no biases, hidden width ``8 d / 3``: the same
    number of weights)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.gated = config.mlp == "swiglu"
        if self.gated:
            hidden = config.d_ff or 8 * config.d_model // 3
            self.fc = nn.Linear(config.d_model, hidden, bias=False)
            self.gate = nn.Linear(config.d_model, hidden, bias=False)
            self.proj = nn.Linear(hidden, config.d_model, bias=False)
        else:
            hidden = config.d_ff or 4 * config.d_model
            self.fc, self.proj = (
                nn.Linear(config.d_model, hidden),
                nn.Linear(hidden, config.d_model),
            )
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.dropout(self.proj(F.silu(self.fc(x)) * self.gate(x)))
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Residual block. Pre-norm (the default): ``x + Attn(N(x))``, then ``x +
    MLP(N(x))``; post-norm: ``N(x + Attn(x))``, then ``N(x + MLP(x))``; ``N`` is
    LayerNorm or RMSNorm."""

    def __init__(self, config: TransformerConfig, *, is_causal: bool, layer: int = 0):
        super().__init__()
        self.ln1, self.ln2 = _norm(config), _norm(config)
        self.post = config.norm_position == "post"
        self.attn = _self_attention(config, is_causal=is_causal, layer=layer)
        self.mlp = None if config.mlp == "none" else MLP(config)
        if self.mlp is None:  # attention-only: one sub-layer, one norm
            self.ln2 = nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        cache: KVCache | None = None,
        *,
        head_mask: torch.Tensor | None = None,
        return_weights: bool = False,
    ):
        """``(B, T, d_model)`` -> the same shape, or ``(x, weights)`` with
        ``return_weights=True``; ``head_mask`` as in :class:`Attention`."""
        inner = x if self.post else self.ln1(x)
        out = self.attn(
            inner, bias, cache, head_mask=head_mask, return_weights=return_weights
        )
        out, weights = out if return_weights else (out, None)
        if self.post:  # each sub-layer's output joins the residual, then normalized
            x = self.ln1(x + out)
            if self.mlp is not None:
                x = self.ln2(x + self.mlp(x))
        else:
            x = x + out
            if self.mlp is not None:
                x = x + self.mlp(self.ln2(x))
        return (x, weights) if return_weights else x


class _Transformer(nn.Module):
    """Embeddings, positional scheme, blocks, final norm and a linear head over the
    vocabulary."""

    is_causal: bool

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        if config.positional == "learned":
            self.pos_emb = LearnedPositionalEmbedding(config.max_len, config.d_model)
        elif config.positional == "t5":
            self.rel_bias = T5RelativeBias(
                config.n_heads,
                config.t5_num_buckets,
                config.t5_max_distance,
                bidirectional=not self.is_causal,
            )
        self.blocks = nn.ModuleList(
            Block(config, is_causal=self.is_causal, layer=layer)
            for layer in range(config.n_layers)
        )
        # post-norm blocks end normalized already (Vaswani et al. add no final norm)
        post = config.norm_position == "post"
        self.ln_f = nn.Identity() if post else _norm(config)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_weights:
            self.head.weight = self.tok_emb.weight
        if config.init != "torch":
            self.reset_weights(generator=None)

    @torch.no_grad()
    def reset_weights(self, generator: torch.Generator | None = None) -> None:
        """GPT-2's initialization (``config.init`` ``"normal"`` or ``"scaled"``):
        every ``nn.Linear`` and ``nn.Embedding`` weight from ``N(0, 0.02^2)``, biases
        zero, norms at weight 1 and bias 0. With ``"scaled"`` the residual-branch
        outputs (``attn.out_proj``, ``mlp.proj``) get ``0.02 / sqrt(2 n_layers)``:
        each of the ``2 n_layers`` branches adds to the stream, and variances add."""
        std, depth = 0.02, 2 * self.config.n_layers
        residual = set()
        if self.config.init == "scaled":
            for block in self.blocks:
                residual.add(id(block.attn.out_proj.weight))
                if block.mlp is not None:
                    residual.add(id(block.mlp.proj.weight))
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                scale = std / depth**0.5 if id(module.weight) in residual else std
                module.weight.normal_(0.0, scale, generator=generator)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()

    def _positions(
        self, x: torch.Tensor, start: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Add absolute encodings to ``x`` (B, T, d), which holds positions ``start ..
        start+T-1``, and build the additive bias (1, h, T, start+T), if any
        (bottom-right aligned: the queries are the last ``T`` positions)."""
        T, scheme = x.shape[1], self.config.positional
        if scheme == "sinusoidal":
            x = x + sinusoidal_encoding(start + T, self.config.d_model)[start:].to(x)
        elif scheme == "learned":
            x = x + self.pos_emb(torch.arange(start, start + T, device=x.device))
        if scheme == "t5":
            return x, self.rel_bias(T, start + T)
        if scheme == "alibi":
            return x, alibi_bias(
                self.config.n_heads, T, start + T, is_causal=self.is_causal
            ).to(x)
        return x, None

    def forward(
        self,
        idx: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        *,
        head_mask: torch.Tensor | None = None,
        return_weights: bool = False,
        hidden: bool = False,
    ):
        """``idx``: ``(B, T)`` token ids -> logits ``(B, T, vocab_size)`` (with
        ``hidden=True``: the final hidden states ``(B, T, d_model)``, what an
        encoder-decoder's cross-attention reads).

        ``attn_mask``: optional bool ``(B, 1, 1, S)`` key-padding mask (True = real
        token). ``cache``: a :class:`attnbook.kvcache.KVCache` holding the ``P`` earlier
        positions (``S = P + T``); it is updated in place. ``head_mask``: ``(n_layers,
        n_heads)`` or ``(n_layers, B, n_heads)``, row ``l`` scales the heads of layer
        ``l`` (1 keeps a head, 0 removes it). ``return_weights=True`` returns
        ``(logits, weights)`` with the weights of every layer, ``(n_layers, B, n_heads,
        T, S)``.
        """
        if idx.dim() != 2:
            raise ValueError(
                f"idx must have shape (batch, seq), got {tuple(idx.shape)}"
            )
        n_layers = len(self.blocks)
        if head_mask is not None and head_mask.shape[0] != n_layers:
            raise ValueError(
                f"head_mask must have shape (n_layers={n_layers}, [batch,] n_heads), "
                f"got {tuple(head_mask.shape)}"
            )
        x, bias = self._positions(
            self.tok_emb(idx), cache.length if cache is not None else 0
        )
        if attn_mask is not None:
            padding = torch.zeros(
                attn_mask.shape, dtype=x.dtype, device=x.device
            ).masked_fill(~attn_mask, float("-inf"))
            bias = padding if bias is None else bias + padding
        weights = []
        for layer, block in enumerate(self.blocks):
            mask = None if head_mask is None else head_mask[layer]
            x = block(x, bias, cache, head_mask=mask, return_weights=return_weights)
            if return_weights:
                x, w = x
                weights.append(w)
        if hidden:
            return self.ln_f(x)
        logits = self.head(self.ln_f(x))
        return (logits, torch.stack(weights)) if return_weights else logits


class TinyGPT(_Transformer):
    """A causal (decoder-only) language model: position ``t`` sees tokens ``0..t``."""

    is_causal = True

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        use_cache: bool = True,
        temperature: float = 0.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Append ``max_new_tokens`` tokens to ``idx`` ``(B, T0)``; returns ``(B, T0 +
        max_new_tokens)``.

        ``temperature == 0``: greedy (argmax). Otherwise sample from ``softmax(logits /
        temperature)``, restricted to the ``top_k`` largest logits when given, with
        ``generator``.

        ``use_cache=False`` recomputes the whole prefix at every step (``O(t^2)``
        attention work per sequence of ``t`` tokens); ``use_cache=True`` runs the prompt
        once (prefill) and then one token per step against a
        :class:`attnbook.kvcache.KVCache` (decode). Both give the same tokens. The
        ``learned`` scheme has no row beyond ``max_len``: without a cache the context is
        cropped to the last ``max_len`` tokens (nanoGPT's rule), which moves every token
        to a new position, so each step recomputes everything; with a cache that is
        impossible and going past ``max_len`` raises ``ValueError``.
        """
        if idx.dim() != 2 or idx.shape[1] < 1:
            raise ValueError(
                "idx must have shape (batch, seq) with seq >= 1, got "
                f"{tuple(idx.shape)}"
            )
        if max_new_tokens < 0 or temperature < 0:
            raise ValueError(
                "max_new_tokens and temperature must be non-negative, got "
                f"{max_new_tokens}, {temperature}"
            )
        cfg, total = self.config, idx.shape[1] + max_new_tokens
        learned = cfg.positional == "learned"
        if use_cache and learned and total - 1 > cfg.max_len:
            raise ValueError(
                "a cached learned-position model cannot go past "
                f"max_len={cfg.max_len} positions "
                f"(prompt {idx.shape[1]} + {max_new_tokens} new tokens): use "
                "use_cache=False, which crops"
            )
        cache = None
        if use_cache:
            cache = self.make_cache(idx.shape[0], max(total - 1, 1), device=idx.device)
        tokens, new = idx, idx
        for _ in range(max_new_tokens):
            if use_cache:
                logits = self(new, cache=cache)[:, -1]
            else:
                logits = self(tokens[:, -cfg.max_len :] if learned else tokens)[:, -1]
            new = _next_token(logits, temperature, top_k, generator)
            tokens = torch.cat((tokens, new), dim=1)
        return tokens

    def make_cache(
        self, batch: int, max_len: int, *, device=None
    ) -> KVCache | LatentKVCache:
        """An empty cache for ``batch`` sequences of up to ``max_len`` positions, in the
        model's dtype (and device, unless given): a :class:`attnbook.kvcache.KVCache`,
        or with ``attention="mla"`` a :class:`attnbook.serving.LatentKVCache`."""
        cfg, weight = self.config, self.tok_emb.weight
        device = weight.device if device is None else device
        if cfg.attention == "mla":
            attn = self.blocks[0].attn
            return LatentKVCache(
                cfg.n_layers,
                batch,
                attn.kv_latent_dim,
                attn.rope_dim,
                max_len,
                dtype=weight.dtype,
                device=device,
            )
        return KVCache(
            cfg.n_layers,
            batch,
            cfg.n_kv_heads or cfg.n_heads,
            cfg.d_model // cfg.n_heads,
            max_len,
            dtype=weight.dtype,
            device=device,
        )


def _next_token(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """``(B, vocab)`` logits -> ``(B, 1)`` token ids: argmax at temperature 0, else a
    (top-k) sample."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)


class TinyEncoder(_Transformer):
    """A bidirectional encoder (BERT-style, no causal mask) with a per-token output
    head."""

    is_causal = False


class DecoderBlock(nn.Module):
    """The decoder layer of an encoder-decoder Transformer (Vaswani et al., 2017):
    causal self-attention, then cross-attention from the decoder's positions to the
    encoder's output ``memory``, then the MLP, each a residual sub-layer (pre- or
    post-norm as the config says)."""

    def __init__(self, config: TransformerConfig, *, layer: int = 0):
        super().__init__()
        self.ln1, self.ln2, self.ln3 = _norm(config), _norm(config), _norm(config)
        self.post = config.norm_position == "post"
        self.attn = _self_attention(config, is_causal=True, layer=layer)
        self.cross = MultiHeadAttention(
            config.d_model, config.n_heads, config.n_kv_heads, dropout=config.dropout
        )
        self.mlp = None if config.mlp == "none" else MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        memory_mask: torch.Tensor | None = None,
        *,
        return_weights: bool = False,
    ):
        """``x (B, T, d_model)``, ``memory (B, S, d_model)``, ``memory_mask`` bool
        ``(B, 1, 1, S)`` (True = a real source token) -> ``(B, T, d_model)``; with
        ``return_weights=True`` also the cross-attention weights ``(B, n_heads, T,
        S)``."""
        if self.post:
            x = self.ln1(x + self.attn(x))
            out, weights = self.cross(x, memory, memory_mask, return_weights=True)
            x = self.ln2(x + out)
            if self.mlp is not None:
                x = self.ln3(x + self.mlp(x))
        else:
            x = x + self.attn(self.ln1(x))
            out, weights = self.cross(
                self.ln2(x), memory, memory_mask, return_weights=True
            )
            x = x + out
            if self.mlp is not None:
                x = x + self.mlp(self.ln3(x))
        return (x, weights) if return_weights else x


class TinySeq2Seq(nn.Module):
    """An encoder-decoder Transformer: a :class:`TinyEncoder` reads the source, a stack
    of :class:`DecoderBlock` writes the target one token at a time, attending to the
    encoder's final states. One config serves both (source and target share the
    vocabulary); the positional scheme must be ``"rope"`` or ``"none"``, which live
    inside the attention layers."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        if config.positional not in ("rope", "none"):
            raise ValueError(
                "TinySeq2Seq takes positional='rope' or 'none', got "
                f"{config.positional!r}"
            )
        self.config = config
        self.encoder = TinyEncoder(config)
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(
            DecoderBlock(config, layer=layer) for layer in range(config.n_layers)
        )
        post = config.norm_position == "post"
        self.ln_f = nn.Identity() if post else _norm(config)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_weights:
            self.head.weight = self.tok_emb.weight

    def forward(
        self,
        src: torch.Tensor,
        tgt: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        *,
        return_weights: bool = False,
    ):
        """``src (B, S)`` and ``tgt (B, T)`` token ids, ``src_mask`` bool ``(B, S)``
        (True = real token) -> logits ``(B, T, vocab_size)`` for the token after each
        target position; with ``return_weights=True`` also the cross-attention weights
        of every layer, ``(n_layers, B, n_heads, T, S)``."""
        memory, mask = self.encode(src, src_mask)
        return self.decode(tgt, memory, mask, return_weights=return_weights)

    def encode(
        self, src: torch.Tensor, src_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The encoder's final states ``(B, S, d_model)`` and the source mask as the
        decoder's cross-attention takes it, ``(B, 1, 1, S)`` (or ``None``)."""
        mask = None if src_mask is None else src_mask[:, None, None, :]
        return self.encoder(src, mask, hidden=True), mask

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        return_weights: bool = False,
    ):
        """The decoder alone, on the encoder's output (:meth:`encode`)."""
        x, weights = self.tok_emb(tgt), []
        for block in self.blocks:
            x, w = block(x, memory, mask, return_weights=True)
            weights.append(w)
        logits = self.head(self.ln_f(x))
        return (logits, torch.stack(weights)) if return_weights else logits

    @torch.no_grad()
    def generate(
        self,
        src: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        *,
        max_len: int,
        bos: int = BOS,
        eos: int = EOS,
    ) -> torch.Tensor:
        """Greedy decoding: ``(B, T')`` tokens ``y_1 ... eos`` then ``PAD``, ``T' <=
        max_len`` (it stops when every sequence has written ``eos``). The source is
        encoded once; the decoder reruns on the growing prefix (a few dozen tokens:
        no cache needed)."""
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        memory, mask = self.encode(src, src_mask)
        tgt = torch.full((src.shape[0], 1), bos, dtype=torch.long, device=src.device)
        done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
        for _ in range(max_len):
            new = self.decode(tgt, memory, mask)[:, -1].argmax(-1)
            new = new.masked_fill(done, PAD)
            tgt = torch.cat([tgt, new[:, None]], dim=1)
            done |= new == eos
            if done.all():
                break
        return tgt[:, 1:]


# --------------------------------------------------------------------------------------
# Head masks: pruning (Michel et al., 2019) and DropHead (Zhou et al., 2020)
# --------------------------------------------------------------------------------------
def head_importance(
    model: nn.Module,
    batches: Iterable,
    loss_fn: Callable[[nn.Module, object, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    r"""Importance of every head, ``(n_layers, n_heads)``, by Michel et al.'s proxy.

    Give each head ``h`` a gate :math:`\xi_h` on its output (the ``head_mask``) and
    measure how much the loss reacts to it at :math:`\xi = 1`:

    .. math:: I_h = \frac{1}{N} \sum_{n=1}^{N}
        \left| \frac{\partial \mathcal{L}_n}{\partial \xi_h} \right|,

    the mean over the ``N`` batches of the absolute derivative of each batch's loss:
    a first-order estimate of what removing the head (:math:`\xi_h = 0`) would cost.
    ``loss_fn(model, batch, head_mask)`` returns the scalar loss of one batch with that
    mask, e.g. ``cross_entropy(model(x, head_mask=head_mask), y)``. The model runs in
    eval mode (no dropout); its parameters get no gradient. Michel et al. also
    normalize each layer's scores; comparing heads across layers may need that.
    """
    param = next(model.parameters())
    shape = (model.config.n_layers, model.config.n_heads)
    gate = torch.ones(shape, dtype=param.dtype, device=param.device).requires_grad_()
    was_training = model.training
    model.eval()
    sizes = []  # |dL_n / d xi| of every batch
    try:
        for batch in batches:
            (grad,) = torch.autograd.grad(loss_fn(model, batch, gate), gate)
            sizes.append(grad.abs())
    finally:
        model.train(was_training)
    if not sizes:
        raise ValueError("batches is empty")
    return torch.stack(sizes).mean(0)


@torch.no_grad()
def head_ablation(
    model: nn.Module, loss_fn: Callable[[nn.Module, torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """The loss with each head removed in turn, ``(n_layers, n_heads)``: entry ``(l,
    h)`` is ``loss_fn(model, head_mask)`` with head ``h`` of layer ``l`` zeroed and
    every other head kept (the ablation that tells which heads a behaviour needs).
    ``loss_fn(model, head_mask)`` returns a scalar, e.g. ``cross_entropy(model(x,
    head_mask=head_mask), y)``; the model runs in eval mode."""
    param = next(model.parameters())
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    was_training = model.training
    model.eval()
    losses = torch.empty(n_layers, n_heads)
    try:
        for layer in range(n_layers):
            for head in range(n_heads):
                mask = torch.ones(n_layers, n_heads, dtype=param.dtype)
                mask[layer, head] = 0.0
                losses[layer, head] = float(loss_fn(model, mask.to(param.device)))
    finally:
        model.train(was_training)
    return losses


def drophead_mask(
    n_layers: int,
    n_heads: int,
    p: float,
    batch_size: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """A random DropHead ``head_mask`` of shape ``(n_layers, batch_size, n_heads)``
    (Zhou et al., 2020).

    DropHead is dropout on whole heads: for every layer and every sequence of the batch
    each head is dropped with probability ``p``, and the kept heads are scaled by
    ``n_heads / n_kept`` so that the layer's output keeps its size (a layer that loses
    every head gives zeros). Pass it as ``model(x, head_mask=...)`` in training only.
    """
    if not 0.0 <= p < 1.0:
        raise ValueError(f"p must be in [0, 1), got {p}")
    shape = (n_layers, batch_size, n_heads)
    keep = torch.rand(shape, generator=generator, device=device) >= p
    kept = keep.sum(-1, keepdim=True)
    return keep * (n_heads / kept.clamp_min(1))


def induction_scores(weights: torch.Tensor, period: int) -> dict[str, torch.Tensor]:
    """How much each head behaves like the two heads of an induction circuit (Olsson et
    al., 2022), on sequences whose second part repeats the first ``period`` tokens.

    ``weights``: the attention weights of every layer, ``(n_layers, B, n_heads, T, T)``
    (``TinyGPT(..., return_weights=True)``). For each query ``t >= period``, the
    **prefix-matching** score is the weight on key ``t - period + 1``, the token that
    followed the previous occurrence of token ``t`` (what an induction head copies); the
    **previous-token** score is the weight on key ``t - 1``, over all queries ``t >=
    1``. Both are averaged over the batch and the queries: ``(n_layers, n_heads)``
    each, 1 for a head that does exactly that.
    """
    if weights.dim() != 5 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(
            "weights must be (n_layers, batch, n_heads, T, T) self-attention, got "
            f"{tuple(weights.shape)}"
        )
    T = weights.shape[-1]
    if not 1 <= period < T:
        raise ValueError(f"period must be between 1 and T - 1 = {T - 1}, got {period}")
    queries = torch.arange(period, T)
    prefix = weights[..., queries, queries - period + 1].mean(dim=(1, 3))
    later = torch.arange(1, T)
    previous = weights[..., later, later - 1].mean(dim=(1, 3))
    return {"prefix_matching": prefix, "previous_token": previous}
