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

Masks follow :mod:`attnbook.contract`: ``key_padding_mask`` is bool ``(B, S)``, True
where a key is padding; ``attn_mask`` is bool (True = may attend) or additive and must
have the four dimensions of the scores ``(B, n_heads, T, S)`` (each may be 1), so a
padding mask is never mistaken for a ``(T, S)`` one.

``TinyGPT.generate`` decodes greedily or by sampling, with or without a KV cache:
:mod:`attnbook.generation` (the static cache, ``torch.compile``, CUDA graphs). Any
cache of the one protocol (:class:`attnbook.caches.AttentionCache`) can be passed to the
forward pass, which feeds only the new tokens: their positions start at
``cache.length``, RoPE rotates the new keys before they are stored (unless the cache
numbers positions by slot), and the t5/alibi biases are rebuilt for ``(new queries, all
keys)`` from positions. The attention layer asks the cache how to read what it returns
(its ``kernel``); on CUDA a one-token step against a contiguous prefix
(``kernel="split_kv"``, a :class:`attnbook.kvcache.KVCache`) without a bias runs the
split-KV Triton kernel (:mod:`attnbook.kernels.decode`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import nn
from torch.nn import functional as F

from ._random import uniform
from .serving import LatentKVCache, MultiHeadLatentAttention
from .contract import check_sizes as _check_sizes
from .contract import check_key_padding_mask
from .contract import check_flag, check_float, check_int
from .core import MultiHeadAttention, scaled_dot_product_attention
from .data import BOS, EOS, PAD
from .generation import generate, generating
from .kernels import plan_for
from .attend import decode_attention
from .kvcache import KVCache, StaticKVCache
from .caches import AttentionCache
from .layers import HeadShell, RMSNorm
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


# --------------------------------------------------------------------------------------
# Argument checks: ValueError or TypeError naming the function, the argument, and what
# was expected and received
# --------------------------------------------------------------------------------------
def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_rate(fn: str, name: str, p) -> None:
    """A probability in ``[0, 1)``; NaN is refused."""
    if not _is_real(p) or not 0.0 <= p < 1.0:
        raise ValueError(f"{fn}: {name} must be a number in [0, 1), got {p!r}")


def _check_width(fn: str, x, width: int, shape: str = "(..., d_model={})") -> None:
    """``x`` a floating tensor whose last dimension is ``width``."""
    check_float(fn, "x", x)
    if (
        x.dim() < 1
        or x.shape[-1] != width
        or (shape.startswith("(batch") and x.dim() != 3)
    ):
        raise ValueError(
            f"{fn}: x must have shape {shape.format(width)}, got {tuple(x.shape)}"
        )


def _check_config(fn: str, config) -> None:
    if not isinstance(config, TransformerConfig):
        raise TypeError(
            f"{fn}: config must be a TransformerConfig, got {type(config).__name__}"
        )


def _check_ids(
    fn: str, name: str, idx: torch.Tensor, vocab_size: int, *, check_range: bool = True
) -> None:
    """Token ids: an int64 or int32 ``(batch, seq)`` tensor, ``seq >= 1``, every id in
    ``[0, vocab_size)`` (one min/max per call; ``check_range=False`` skips it for
    tokens the model wrote itself)."""
    if not isinstance(idx, torch.Tensor) or idx.dtype not in (torch.long, torch.int):
        raise TypeError(
            f"{fn}: {name} must be an int64 (or int32) tensor of token ids, got "
            f"{getattr(idx, 'dtype', type(idx).__name__)}"
        )
    if idx.dim() != 2 or idx.shape[1] < 1:
        raise ValueError(
            f"{fn}: {name} must have shape (batch, seq) with seq >= 1, got "
            f"{tuple(idx.shape)}"
        )
    if check_range and idx.numel():
        low, high = torch.stack(idx.aminmax()).tolist()
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"{fn}: {name} holds token ids in [{low}, {high}], outside the "
                f"vocabulary [0, {vocab_size}) of vocab_size={vocab_size}"
            )


def _check_4d_mask(fn: str, name: str, mask, scores: tuple[int, ...]) -> None:
    """``mask``: bool or float, four dimensions, broadcastable to ``scores`` ``(B,
    n_heads, T, S)``. A 2-D ``(batch, S)`` padding mask would broadcast as ``(T, S)``
    whenever ``batch == T``: refused, with a pointer to ``key_padding_mask``."""
    if not isinstance(mask, torch.Tensor) or not (
        mask.dtype == torch.bool or mask.is_floating_point()
    ):
        raise TypeError(
            f"{fn}: {name} must be a bool (True = may attend) or additive float "
            f"tensor, got {getattr(mask, 'dtype', type(mask).__name__)}"
        )
    ok = mask.dim() == 4
    if ok:
        try:
            ok = torch.broadcast_shapes(mask.shape, scores) == torch.Size(scores)
        except RuntimeError:
            ok = False
    if not ok:
        B, _, T, S = scores
        raise ValueError(
            f"{fn}: {name} must have 4 dimensions broadcastable to (batch, n_heads, "
            f"T, S) = {tuple(scores)}, such as ({B}, 1, 1, {S}) for padding or (1, 1, "
            f"{T}, {S}); got {tuple(mask.shape)}. A (batch, S) padding mask goes in "
            "key_padding_mask= (bool, True = padding)"
        )


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
        self.check()

    def check(self) -> None:
        """Validate every field (``ValueError`` naming the field, the expected and the
        received value). Runs on construction; the models run it again, in case a
        field was changed since."""
        fn = "TransformerConfig"
        if self.positional not in POSITIONAL_SCHEMES:
            raise ValueError(
                f"{fn}: positional must be one of {POSITIONAL_SCHEMES}, got "
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
                    f"{fn}: {name} must be one of {allowed}, got "
                    f"{getattr(self, name)!r}"
                )
        _check_sizes(
            fn,
            vocab_size=self.vocab_size,
            d_model=self.d_model,
            n_heads=self.n_heads,
            n_layers=self.n_layers,
            max_len=self.max_len,
            t5_num_buckets=self.t5_num_buckets,
            t5_max_distance=self.t5_max_distance,
            rope_dim=self.rope_dim,
        )
        optional = ("n_kv_heads", "d_ff", "kv_latent_dim", "q_latent_dim")
        _check_sizes(
            fn,
            **{n: getattr(self, n) for n in optional if getattr(self, n) is not None},
        )
        if self.d_model % self.n_heads:
            raise ValueError(
                f"{fn}: d_model={self.d_model} must be divisible by "
                f"n_heads={self.n_heads}"
            )
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"{fn}: n_heads={self.n_heads} must be a multiple of "
                f"n_kv_heads={self.n_kv_heads}"
            )
        _check_rate(fn, "dropout", self.dropout)
        if not _is_real(self.rope_base) or not 0.0 < self.rope_base < math.inf:
            raise ValueError(
                f"{fn}: rope_base must be a finite number > 0, got {self.rope_base!r}"
            )
        if not isinstance(self.tie_weights, bool):
            raise TypeError(
                f"{fn}: tie_weights must be a bool, got {self.tie_weights!r}"
            )
        head_dim = self.d_model // self.n_heads
        if self.positional == "rope" and self.attention == "mha" and head_dim % 2:
            raise ValueError(
                f"{fn}: positional='rope' rotates pairs, so head_dim = d_model // "
                f"n_heads must be even, got {self.d_model} // {self.n_heads} = "
                f"{head_dim}"
            )
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ValueError(
                f"{fn}: positional='sinusoidal' needs an even d_model (sin/cos pairs), "
                f"got {self.d_model}"
            )
        if self.positional == "t5" and (
            self.t5_num_buckets < 2 or self.t5_max_distance <= self.t5_num_buckets // 2
        ):
            raise ValueError(
                f"{fn}: positional='t5' needs t5_num_buckets >= 2 and "
                "t5_max_distance > t5_num_buckets // 2 (the exact buckets), got "
                "t5_num_buckets="
                f"{self.t5_num_buckets}, t5_max_distance={self.t5_max_distance}"
            )
        if self.attention == "mla" and self.rope_dim % 2:
            raise ValueError(
                f"{fn}: rope_dim must be even (RoPE rotates pairs), got {self.rope_dim}"
            )
        if self.attention == "mla" and (
            self.positional != "rope" or self.n_kv_heads is not None
        ):
            raise ValueError(
                f"{fn}: attention='mla' needs positional='rope' (its decoupled rotary "
                "part) "
                "and n_kv_heads=None (every head reads the one latent), got "
                f"positional={self.positional!r}, n_kv_heads={self.n_kv_heads}"
            )


class Attention(MultiHeadAttention):
    """:class:`attnbook.core.MultiHeadAttention` (the same projections, the same
    grouped-query layout) as a decoder or encoder layer needs it: self-attention with an
    optional rotary embedding, an optional additive bias, a KV cache and head masks.
    Its shell (:class:`attnbook.layers.HeadShell`, through MultiHeadAttention) projects
    and merges the heads; what
    lies between is asked of the cache (:class:`attnbook.caches.AttentionCache`)."""

    _qkv = None  # (weight, bias) of q, k, v stacked, set by generate for its call

    def __init__(self, config: TransformerConfig, *, is_causal: bool, layer: int = 0):
        _check_config("Attention", config)
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

    def project(
        self, x: torch.Tensor, context: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The shell's projection, or during ``generate`` the fused one: the three
        matrices stacked (``attnbook.generation._fused_projections``), one product
        instead of three."""
        if self._qkv is None or context is not None:
            return super().project(x, context)
        # (B, T, heads + 2 kv_heads, head_dim) -> heads first, then split: 3 views
        B, T, _ = x.shape
        heads = (self.n_heads, self.n_kv_heads, self.n_kv_heads)
        qkv = F.linear(x, *self._qkv).view(B, T, sum(heads), -1).transpose(1, 2)
        return qkv.split(heads, 1)

    def forward(
        self,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
        cache: AttentionCache | None = None,
        *,
        head_mask: torch.Tensor | None = None,
        return_weights: bool = False,
        positions: torch.Tensor | None = None,
    ):
        """``x``: ``(B, T, d_model)``; ``bias``: additive, broadcastable to ``(B,
        n_heads, T, S)``.

        With a ``cache`` holding ``P`` positions, ``x`` holds positions ``P .. P+T-1``,
        their keys and values are stored in the cache and the queries attend to what
        it returns, read as its ``kernel`` says
        (:class:`attnbook.caches.AttentionCache`). ``positions``: ``(B, T)`` positions
        for RoPE instead of ``P .. P+T-1`` (a padded batch numbers only its real
        tokens; a cache that numbers by slot, ``positions_in_cache``, ignores them).
        ``head_mask``: ``(n_heads,)`` or ``(B, n_heads)`` factors on each head's
        output before ``out_proj`` (0 removes the head). ``return_weights=True`` also
        returns the weights ``(B, n_heads, T, S)``.

        With a cache read under the caller's mask (``kernel == "masked"``, the
        :class:`attnbook.kvcache.StaticKVCache` of the decode hot path) the queries
        attend to the slots ``bias`` covers, and ``bias`` is the whole mask (bool,
        True = may attend, or additive, ``(B, 1 or n_heads, T, slots)``); no weights.
        """
        kernel = _check_attention(self, x, cache, head_mask, return_weights)
        q, k, v = self.project(x)
        # rotate after the projection, in every layer; cached keys stay rotated, except
        # in a cache that numbers positions by slot (attention sinks): it stores them
        # unrotated and they are rotated by their place in the cache at every step
        by_slot = cache is not None and cache.positions_in_cache
        if self.rotary is not None and not by_slot and positions is not None:
            # the queries and keys of a step rotated in one call (one cos/sin)
            qk = self.rotary(torch.cat((q, k), 1), positions[:, None])
            q, k = qk.split((self.n_heads, self.n_kv_heads), 1)
        elif self.rotary is not None and not by_slot:
            offset = cache.length if cache is not None else 0
            q, k = self.rotary(q, offset=offset), self.rotary(k, offset=offset)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        if by_slot and self.rotary is not None:
            q = self.rotary(q, offset=k.shape[-2] - x.shape[1])
            k = self.rotary(k)
        dropout_p = self.dropout if self.training else 0.0
        if kernel == "masked":
            # the decode hot path: attend under the caller's mask (bias: bool or
            # additive) to the slots it covers, the first bias.shape[-1] (the live
            # ones in eager; all of them when compiled for CUDA graphs, whose shapes
            # never change), one fused kernel for all heads
            if bias is not None:
                k, v = k[:, :, : bias.shape[-1]], v[:, :, : bias.shape[-1]]
            out = F.scaled_dot_product_attention(
                q, k, v, bias, dropout_p=dropout_p,
                enable_gqa=self.n_kv_heads != self.n_heads,
            )  # fmt: skip
            return self.merge(out, head_mask)
        if kernel == "split_kv" and self._split_kv_kernel(q, bias, return_weights):
            # one token against a contiguous prefix: the split-KV decoding kernel
            lengths = torch.full(
                (q.shape[0],), k.shape[-2], dtype=torch.int32, device=q.device
            )
            out = decode_attention(q, k, v, lengths, backend="triton")
            return self.merge(out, head_mask)
        out, weights = scaled_dot_product_attention(
            q,
            k,
            v,
            bias,
            is_causal=self.is_causal,
            dropout_p=dropout_p,
            return_weights=True,
            enable_gqa=True,  # n_kv_heads < n_heads: grouped-query attention
        )
        out = self.merge(out, head_mask)
        return (out, weights) if return_weights else out

    def _split_kv_kernel(self, q, bias, return_weights) -> bool:
        """Whether a step may run the split-KV Triton kernel: one token, no bias, no
        weights, eval mode, on a GPU that can run it."""
        return (
            q.shape[-2] == 1
            and bias is None
            and not return_weights
            and q.is_cuda
            and not self.training
            and plan_for("decode", q)[0] == "triton"
        )


def _check_attention(attn, x, cache, head_mask, return_weights) -> str | None:
    """The checks of :meth:`Attention.forward`; returns the cache's ``kernel``."""
    fn = "Attention"
    _check_width(fn, x, attn.d_model, "(batch, seq, d_model={})")
    if head_mask is not None and (
        head_mask.shape[-1] != attn.n_heads or head_mask.dim() > 2
    ):
        raise ValueError(
            f"{fn}: head_mask must have shape (n_heads={attn.n_heads},) "
            f"or (batch, n_heads), got {tuple(head_mask.shape)}"
        )
    if cache is None:
        return None
    if not isinstance(cache, AttentionCache) or cache.kernel == "absorbed":
        raise TypeError(
            f"{fn}: cache must be a cache of keys and values (an AttentionCache "
            f"whose kernel is not 'absorbed'), got {type(cache).__name__}"
        )
    if return_weights and cache.kernel == "masked":
        raise ValueError(
            f"{fn}: return_weights=True needs a cache that is not read under the "
            f"caller's mask, got a {type(cache).__name__} (its fused kernel keeps "
            "no weights)"
        )
    return cache.kernel


class LatentAttention(MultiHeadLatentAttention):
    """:class:`attnbook.serving.MultiHeadLatentAttention` as the layer of a
    :class:`Block` (``config.attention="mla"``): the signature of :class:`Attention`
    (``bias`` is any additive mask, such as the padding mask of
    ``TinyGPT.forward``), a :class:`attnbook.serving.LatentKVCache` as its
    cache, which it reads with the up-projections absorbed."""

    def __init__(self, config: TransformerConfig, *, is_causal: bool, layer: int = 0):
        _check_config("LatentAttention", config)
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
        positions: torch.Tensor | None = None,
    ):
        """As :meth:`Attention.forward`, except ``positions``, which is ignored: the
        decoupled rotary part numbers the slots (relative, so padding only changes the
        rounding of its float32 angles)."""
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
        _check_config("MLP", config)
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
        _check_width("MLP.forward", x, self.proj.out_features)
        if self.gated:
            out = self.proj(F.silu(self.fc(x)) * self.gate(x))
        else:
            out = self.proj(F.gelu(self.fc(x)))
        return self.dropout(out) if self.training else out  # eval: no call at all


class Block(nn.Module):
    """Residual block. Pre-norm (the default): ``x + Attn(N(x))``, then ``x +
    MLP(N(x))``; post-norm: ``N(x + Attn(x))``, then ``N(x + MLP(x))``; ``N`` is
    LayerNorm or RMSNorm."""

    def __init__(self, config: TransformerConfig, *, is_causal: bool, layer: int = 0):
        super().__init__()
        _check_config("Block", config)
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
        positions: torch.Tensor | None = None,
    ):
        """``(B, T, d_model)`` -> the same shape, or ``(x, weights)`` with
        ``return_weights=True``; ``head_mask`` and ``positions`` (RoPE's, of a padded
        batch) as in :class:`Attention`."""
        _check_width("Block.forward", x, self.ln1.weight.shape[0])
        inner = x if self.post else self.ln1(x)
        out = self.attn(
            inner,
            bias,
            cache,
            head_mask=head_mask,
            return_weights=return_weights,
            positions=positions,
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
    _ids_trusted = False  # set by generate: skip the vocabulary check of its own tokens

    def __init__(self, config: TransformerConfig):
        super().__init__()
        name = type(self).__name__
        _check_config(name, config)
        config.check()
        if (
            config.positional == "t5"
            and not self.is_causal
            and config.t5_num_buckets < 4
        ):
            raise ValueError(
                f"{name}: a bidirectional T5 bias splits its buckets between the two "
                f"directions and needs t5_num_buckets >= 4, got {config.t5_num_buckets}"
            )
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
        self, x: torch.Tensor, start: int = 0, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Add absolute encodings to ``x`` (B, T, d), which holds positions ``start ..
        start+T-1`` (or ``positions`` (B, T), those of a padded batch), and build the
        additive bias (1, h, T, start+T), if any (bottom-right aligned: the queries are
        the last ``T`` positions)."""
        T, scheme = x.shape[1], self.config.positional
        if positions is None and scheme in ("sinusoidal", "learned"):
            positions = torch.arange(start, start + T, device=x.device)
        if scheme == "sinusoidal":
            pe = sinusoidal_encoding(start + T, self.config.d_model, dtype=x.dtype)
            x = x + pe.to(x.device)[positions]
        elif scheme == "learned":
            x = x + self.pos_emb(positions)
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
        key_padding_mask: torch.Tensor | None = None,
        head_mask: torch.Tensor | None = None,
        return_weights: bool = False,
        hidden: bool = False,
    ):
        """``idx``: ``(B, T)`` token ids in ``[0, vocab_size)`` -> logits ``(B, T,
        vocab_size)`` (with ``hidden=True``: the final hidden states ``(B, T,
        d_model)``, what an encoder-decoder's cross-attention reads).

        ``cache``: a :class:`attnbook.kvcache.KVCache` holding the ``P`` earlier
        positions (``S = P + T``); it is updated in place. The masks, as in
        :mod:`attnbook.contract`, combine with each other and with the causal mask:

        * ``key_padding_mask``: bool ``(B, S)``, True where a key is padding (with a
          cache, ``S`` counts the cached positions too). Padding is no position:
          ``sinusoidal``, ``learned`` and ``rope`` number only the real tokens, and
          the biases of ``t5`` and ``alibi`` see distances that left or right padding
          leaves unchanged, so each row's outputs at its real tokens equal those of the
          sequence run alone (with ``attention="mla"`` up to the rounding of its
          rotary angles, which number slots). A query with no real key to see (left
          padding, causal) gets zeros from attention; outputs at padding mean
          nothing.
        * ``attn_mask``: bool (True = may attend) or additive float with four
          dimensions, broadcastable to ``(B, n_heads, T, S)``, e.g. ``(B, 1, 1, S)``
          (True = real token) as a padding mask that keeps the slot positions. A
          ``(B, S)`` mask is refused: broadcast as ``(T, S)`` it would be another mask
          whenever ``B == T``.

        ``head_mask``: ``(n_layers, n_heads)`` or ``(n_layers, B, n_heads)``, row ``l``
        scales the heads of layer ``l`` (1 keeps a head, 0 removes it).
        ``return_weights=True`` returns ``(logits, weights)`` with the weights of every
        layer, ``(n_layers, B, n_heads, T, S)``. An empty batch (``B = 0``) gives
        empty outputs and leaves ``cache`` as it is. Token ids outside the vocabulary
        raise ``ValueError`` (one min/max per call).
        """
        fn = f"{type(self).__name__}.forward"
        cfg, n_layers = self.config, len(self.blocks)
        _check_ids(fn, "idx", idx, cfg.vocab_size, check_range=not self._ids_trusted)
        (B, T), P = idx.shape, cache.length if cache is not None else 0
        scores = (B, cfg.n_heads, T, P + T)
        if head_mask is not None and (
            not isinstance(head_mask, torch.Tensor)
            or head_mask.dim() not in (2, 3)
            or head_mask.shape[0] != n_layers
            or head_mask.shape[-1] != cfg.n_heads
            or (head_mask.dim() == 3 and head_mask.shape[1] not in (1, B))
        ):
            raise ValueError(
                f"{fn}: head_mask must have shape (n_layers={n_layers}, "
                f"n_heads={cfg.n_heads}) or (n_layers={n_layers}, batch={B}, "
                f"n_heads={cfg.n_heads}), got {tuple(getattr(head_mask, 'shape', ()))}"
            )
        if attn_mask is not None:
            _check_4d_mask(fn, "attn_mask", attn_mask, scores)
        if key_padding_mask is not None:
            check_key_padding_mask(fn, key_padding_mask, B, P + T)
        if B == 0:
            out = self.head.weight.new_zeros(
                0, T, cfg.d_model if hidden else cfg.vocab_size
            )
            if return_weights and not hidden:
                return out, out.new_zeros(n_layers, *scores)
            return out
        positions = None  # padding is no position: number the real tokens only
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.to(idx.device)
            if cfg.positional in ("sinusoidal", "learned", "rope"):
                real = (~key_padding_mask).cumsum(-1)  # real tokens up to each slot
                positions = (real[:, P:] - 1).clamp_min(0)
        x, bias = self._positions(self.tok_emb(idx), P, positions)
        if attn_mask is not None:
            padding = (
                torch.zeros(
                    attn_mask.shape, dtype=x.dtype, device=x.device
                ).masked_fill(~attn_mask.to(x.device), float("-inf"))
                if attn_mask.dtype == torch.bool
                else attn_mask.to(x)
            )
            bias = padding if bias is None else bias + padding
        if key_padding_mask is not None:
            padding = torch.zeros(B, 1, 1, P + T, dtype=x.dtype, device=x.device)
            padding = padding.masked_fill(
                key_padding_mask[:, None, None], float("-inf")
            )
            bias = padding if bias is None else bias + padding
        weights = []
        for layer, block in enumerate(self.blocks):
            mask = None if head_mask is None else head_mask[layer]
            x = block(
                x,
                bias,
                cache,
                head_mask=mask,
                return_weights=return_weights,
                positions=positions if cfg.positional == "rope" else None,
            )
            if return_weights:
                x, w = x
                weights.append(w)
        if hidden:
            return self.ln_f(x)
        logits = self.head(self.ln_f(x))
        return (logits, torch.stack(weights)) if return_weights else logits


class TinyGPT(_Transformer):
    """A causal (decoder-only) language model: position ``t`` sees tokens ``0..t``.
    It writes text with :meth:`generate` (:mod:`attnbook.generation`)."""

    is_causal = True

    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        use_cache: bool = True,
        temperature: float = 0.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        *,
        key_padding_mask: torch.Tensor | None = None,
        compile: bool = False,
    ) -> torch.Tensor:
        """Append ``max_new_tokens`` tokens to ``idx`` ``(B, T0)``: ``(B, T0 +
        max_new_tokens)`` tokens, greedy at ``temperature=0``, with a static KV cache
        unless ``use_cache=False``, compiled with ``compile=True``, left-padded
        prompts given ``key_padding_mask``: :func:`attnbook.generation.generate`,
        which documents every argument."""
        return generate(
            self, idx, max_new_tokens, use_cache, temperature, top_k, generator,
            key_padding_mask=key_padding_mask, compile=compile,
        )  # fmt: skip

    def make_cache(
        self, batch: int, max_len: int, *, device=None, static: bool = False
    ) -> KVCache | StaticKVCache | LatentKVCache:
        """An empty cache for ``batch`` sequences of up to ``max_len`` positions, in the
        model's dtype (and device, unless given): a :class:`attnbook.kvcache.KVCache`
        (``static=True``: a :class:`attnbook.kvcache.StaticKVCache`), or with
        ``attention="mla"`` a :class:`attnbook.serving.LatentKVCache`."""
        fn = f"{type(self).__name__}.make_cache"
        _check_sizes(fn, batch=batch, max_len=max_len)
        static = check_flag(fn, "static", static)
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
        kind = StaticKVCache if static else KVCache
        return kind(
            cfg.n_layers,
            batch,
            cfg.n_kv_heads or cfg.n_heads,
            cfg.d_model // cfg.n_heads,
            max_len,
            dtype=weight.dtype,
            device=device,
        )


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
        _check_config("DecoderBlock", config)
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
        ``(B, 1, 1, S)`` (True = a real source token; any bool or additive mask with
        four dimensions broadcastable to ``(B, n_heads, T, S)``) -> ``(B, T,
        d_model)``; with ``return_weights=True`` also the cross-attention weights ``(B,
        n_heads, T, S)``."""
        if memory_mask is not None:
            scores = (x.shape[0], self.cross.n_heads, x.shape[1], memory.shape[1])
            _check_4d_mask("DecoderBlock.forward", "memory_mask", memory_mask, scores)
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

    _ids_trusted = False  # set by generate: skip the vocabulary check of its own tokens

    def __init__(self, config: TransformerConfig):
        super().__init__()
        _check_config("TinySeq2Seq", config)
        config.check()
        if config.positional not in ("rope", "none"):
            raise ValueError(
                "TinySeq2Seq: positional must be 'rope' or 'none', got "
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
        (True = real token, as :meth:`attnbook.data.Task.encode` makes it; the
        opposite of a ``key_padding_mask``) -> logits ``(B, T, vocab_size)`` for the
        token after each target position; with ``return_weights=True`` also the
        cross-attention weights of every layer, ``(n_layers, B, n_heads, T, S)``."""
        memory, mask = self.encode(src, src_mask)
        if isinstance(tgt, torch.Tensor) and tgt.dim() == 2 and len(tgt) != len(src):
            raise ValueError(
                f"TinySeq2Seq.forward: src {tuple(src.shape)} and tgt "
                f"{tuple(tgt.shape)} must have the same batch size"
            )
        return self.decode(tgt, memory, mask, return_weights=return_weights)

    def encode(
        self, src: torch.Tensor, src_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The encoder's final states ``(B, S, d_model)`` and the source mask as the
        decoder's cross-attention takes it, ``(B, 1, 1, S)`` (or ``None``)."""
        fn = "TinySeq2Seq.encode"
        _check_ids(fn, "src", src, self.config.vocab_size)
        if src_mask is not None and (
            not isinstance(src_mask, torch.Tensor)
            or src_mask.dtype != torch.bool
            or src_mask.shape != src.shape
        ):
            raise ValueError(
                f"{fn}: src_mask must be a bool tensor of src's shape (batch, S) = "
                f"{tuple(src.shape)} (True = real token), got "
                f"{getattr(src_mask, 'dtype', type(src_mask).__name__)} "
                f"{tuple(getattr(src_mask, 'shape', ()))}"
            )
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
        fn = "TinySeq2Seq.decode"
        cfg = self.config
        _check_ids(fn, "tgt", tgt, cfg.vocab_size, check_range=not self._ids_trusted)
        if (
            not isinstance(memory, torch.Tensor)
            or memory.dim() != 3
            or memory.shape[0] != tgt.shape[0]
            or memory.shape[2] != cfg.d_model
        ):
            raise ValueError(
                f"{fn}: memory must have shape (batch, S, d_model) = ({tgt.shape[0]}, "
                f"S, {cfg.d_model}), got {tuple(getattr(memory, 'shape', ()))}"
            )
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
        no cache needed). The model runs in eval mode for the call, and every
        submodule gets its previous mode back afterwards."""
        fn, vocab = "TinySeq2Seq.generate", self.config.vocab_size
        _check_sizes(fn, max_len=max_len)
        for name, token in (("bos", bos), ("eos", eos)):
            if (
                isinstance(token, bool)
                or not isinstance(token, numbers.Integral)
                or not 0 <= token < vocab
            ):
                raise ValueError(
                    f"{fn}: {name} must be a token id in [0, {vocab}) "
                    f"(vocab_size={vocab}), got {token!r}"
                )
        with generating(self):  # eval mode for the call, the old modes restored
            memory, mask = self.encode(src, src_mask)
            tgt = torch.full(
                (src.shape[0], 1), bos, dtype=torch.long, device=src.device
            )
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
        raise ValueError("head_importance: batches is empty (expected one or more)")
    return torch.stack(sizes).mean(0)


def _check_ablation(model, loss_fn) -> None:
    config = getattr(model, "config", None)
    if not isinstance(model, nn.Module) or not isinstance(config, TransformerConfig):
        raise TypeError(
            "head_ablation: model must be a model with a TransformerConfig (TinyGPT, "
            f"TinyEncoder), got {type(model).__name__}"
        )
    if not callable(loss_fn):
        raise TypeError(
            f"head_ablation: loss_fn must be a callable, got {type(loss_fn).__name__}"
        )


@torch.no_grad()
def head_ablation(
    model: nn.Module, loss_fn: Callable[[nn.Module, torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """The loss with each head removed in turn, ``(n_layers, n_heads)``: entry ``(l,
    h)`` is ``loss_fn(model, head_mask)`` with head ``h`` of layer ``l`` zeroed and
    every other head kept (the ablation that tells which heads a behaviour needs).
    ``loss_fn(model, head_mask)`` returns a scalar, e.g. ``cross_entropy(model(x,
    head_mask=head_mask), y)``; the model runs in eval mode."""
    _check_ablation(model, loss_fn)
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
    _check_sizes("drophead_mask", n_layers=n_layers, n_heads=n_heads)
    check_int("drophead_mask", "batch_size", batch_size, 0)
    _check_rate("drophead_mask", "p", p)
    shape = (n_layers, batch_size, n_heads)
    keep = uniform(shape, generator=generator, device=device) >= p
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
    fn = "induction_scores"
    if (
        not isinstance(weights, torch.Tensor)
        or weights.dim() != 5
        or weights.shape[-1] != weights.shape[-2]
        or weights.shape[1] == 0
    ):
        raise ValueError(
            f"{fn}: weights must be (n_layers, batch, n_heads, T, T) self-attention "
            f"with batch >= 1, got {tuple(getattr(weights, 'shape', ()))}"
        )
    T = weights.shape[-1]
    if (
        isinstance(period, bool)
        or not isinstance(period, numbers.Integral)
        or not 1 <= period < T
    ):
        raise ValueError(
            f"{fn}: period must be between 1 and T - 1 = {T - 1} (an integer), got "
            f"{period!r}"
        )
    queries = torch.arange(period, T)
    prefix = weights[..., queries, queries - period + 1].mean(dim=(1, 3))
    later = torch.arange(1, T)
    previous = weights[..., later, later - 1].mean(dim=(1, 3))
    return {"prefix_matching": prefix, "previous_token": previous}
