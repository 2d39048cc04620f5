"""Serving attention: what today's inference systems do with the KV cache, built on
the book's models and measured (the chapter on serving).

* **Multi-head latent attention** (DeepSeek-AI, 2024): :class:`MultiHeadLatentAttention`
  caches one small latent per token instead of every head's keys and values
  (:class:`LatentKVCache`), and decodes with the up-projections absorbed into the
  query and output projections; :func:`cache_bytes_per_token` compares its cache with
  MHA, GQA and MQA (:data:`DEEPSEEK_V2`: the published configuration).
* **Speculative decoding** (Leviathan, Kalman and Matias, 2023; Chen et al., 2023):
  :func:`speculative_generate` lets a small draft model propose ``k`` tokens and the
  target check them in one pass, exactly: the greedy tokens are the target's own, and
  the accept/resample rule (:func:`speculative_accept`) keeps the target's sampling
  distribution; :func:`expected_speedup` is the paper's formula.
* **Attention sinks** (StreamingLLM, Xiao et al., 2023): :class:`SinkKVCache` keeps the
  first few tokens and a window of recent ones, numbered by their place in the cache;
  :func:`streaming_losses` and :func:`first_token_attention` measure a model decoding
  past its training length.
* **Quantized KV caches** (KIVI, Liu et al., 2024): :func:`quantize`,
  :func:`dequantize` and :class:`QuantizedKVCache` store keys per channel and values
  per token in 8 or 4 bits; :func:`outlier_channel_ratio` shows why keys want it.
* **Continuous batching** (Orca, Yu et al., 2022) over the paged cache (vLLM, Kwon et
  al., 2023): :func:`continuous_batching` admits requests as others finish,
  :func:`static_batching` waits for whole batches; both run a real
  :class:`attnbook.models.TinyGPT` through :class:`PagedModel` on a
  :func:`synthetic_trace`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import deque
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from ._random import multinomial, uniform
from .contract import (
    check_attn_mask,
    check_cache_update,
    check_flag,
    check_float,
    check_int,
    check_real,
    check_sizes,
)
from .caches import AttentionCache
from .core import scaled_dot_product_attention
from .attend import decode_attention
from .kvcache import (
    CacheFullError,
    KVCache,
    PagedKVCache,
    SlidingWindowKVCache,
)
from .layers import RMSNorm, merge_heads, scale_heads, split_heads
from .positional import RotaryEmbedding

__all__ = [
    "MultiHeadLatentAttention",
    "LatentKVCache",
    "DEEPSEEK_V2",
    "cache_bytes_per_token",
    "truncate_cache",
    "sampling_probs",
    "acceptance_probability",
    "speculative_accept",
    "SpeculativeStats",
    "speculative_generate",
    "expected_tokens_per_call",
    "expected_speedup",
    "SinkKVCache",
    "streaming_losses",
    "first_token_attention",
    "QuantizedTensor",
    "quantize",
    "dequantize",
    "QuantizedKVCache",
    "outlier_channel_ratio",
    "Request",
    "synthetic_trace",
    "PagedModel",
    "RequestTiming",
    "ServeResult",
    "continuous_batching",
    "static_batching",
]


# --------------------------------------------------------------------------------------
# Multi-head latent attention (DeepSeek-V2)
# --------------------------------------------------------------------------------------
def _check_mla(d_model, n_heads, kv_latent_dim, rope_dim, head_dim, q_latent_dim):
    fn = "MultiHeadLatentAttention"
    check_sizes(fn, d_model=d_model, n_heads=n_heads, kv_latent_dim=kv_latent_dim)
    check_sizes(fn, rope_dim=rope_dim)
    for name, value in (("head_dim", head_dim), ("q_latent_dim", q_latent_dim)):
        if value is not None:
            check_sizes(fn, **{name: value})
    if rope_dim % 2:
        raise ValueError(
            f"{fn}: rope_dim must be even (RoPE rotates pairs), got {rope_dim}"
        )
    if head_dim is None and d_model % n_heads:
        raise ValueError(
            f"{fn}: d_model={d_model} must be divisible by n_heads={n_heads} "
            "(or pass head_dim)"
        )


def _check_mla_options(rope_base, dropout, layer) -> None:
    fn = "MultiHeadLatentAttention"
    check_real(fn, "rope_base", rope_base, above=0)
    if check_real(fn, "dropout", dropout, minimum=0) >= 1:
        raise ValueError(f"{fn}: dropout must be in [0, 1), got {dropout!r}")
    check_int(fn, "layer", layer, minimum=0)


def _check_mla_input(mla, x, attn_mask, cache, is_causal, head_mask, weights):
    fn = "MultiHeadLatentAttention.forward"
    check_float(fn, "x", x)
    if x.dim() != 3 or x.shape[-1] != mla.d_model:
        raise ValueError(
            f"{fn}: x must have shape (batch, seq, d_model={mla.d_model}), got "
            f"{tuple(x.shape)}"
        )
    if cache is not None and (
        not isinstance(cache, AttentionCache) or cache.kernel != "absorbed"
    ):
        raise TypeError(
            f"{fn}: cache must be a LatentKVCache (MLA caches the latent, not keys "
            f"and values), got {type(cache).__name__}"
        )
    if cache is not None and not mla.layer < len(cache.lengths):
        raise ValueError(
            f"{fn}: layer={mla.layer} is not a layer of the cache (it has "
            f"{len(cache.lengths)})"
        )
    check_flag(fn, "is_causal", is_causal)
    check_flag(fn, "return_weights", weights)
    B, T, _ = x.shape
    if attn_mask is not None:
        S = T + (0 if cache is None else cache.lengths[mla.layer])
        check_attn_mask(fn, attn_mask, (B, mla.n_heads, T, S))
    _check_head_mask(fn, head_mask, B, mla.n_heads)


def _check_head_mask(fn: str, head_mask, B: int, n_heads: int) -> None:
    if head_mask is None:
        return
    check_float(fn, "head_mask", head_mask)
    if tuple(head_mask.shape) not in ((n_heads,), (B, n_heads)):
        raise ValueError(
            f"{fn}: head_mask must have shape (n_heads={n_heads},) or (batch={B}, "
            f"n_heads), got {tuple(head_mask.shape)}"
        )


class MultiHeadLatentAttention(nn.Module):
    r"""Multi-head latent attention, MLA (DeepSeek-AI, 2024, DeepSeek-V2 section 2.1).

    The keys and values of a token ``x`` (width ``d_model``) are compressed jointly
    into one latent vector of width ``d_c = kv_latent_dim``; only that latent and one
    small rotary key of width ``d_R = rope_dim``, shared by all heads, are cached:

    .. math::
        c^{KV} = \mathrm{RMSNorm}(W^{DKV} x), \qquad
        k^C_h = W^{UK}_h c^{KV}, \qquad v_h = W^{UV}_h c^{KV}, \qquad
        k^R = \mathrm{RoPE}(W^{KR} x).

    Queries: ``c^Q = RMSNorm(W^{DQ} x)`` (``c^Q = x`` when ``q_latent_dim=None``),
    ``q_h = [W^{UQ}_h c^Q ; RoPE(W^{QR}_h c^Q)]``. Head ``h`` scores key ``j`` by

    .. math:: s_{hj} = \frac{q^C_h \cdot k^C_{hj} + q^R_h \cdot k^R_j}
        {\sqrt{d_h + d_R}},

    and the layer returns ``W^O [o_1; ...; o_H]``, ``o_h = softmax(s_h) V_h``. RoPE is
    kept out of ``k^C`` ("decoupled") because a position-dependent rotation between
    ``W^{UK}_h`` and the score would stop ``W^{UK}_h`` from moving into the query.

    ``forward(x, attn_mask=None, cache=None, *, is_causal=True, head_mask=None,
    return_weights=False)``: ``x (B, T, d_model)`` -> ``(B, T, d_model)``.
    ``attn_mask`` as in :func:`attnbook.core.scaled_dot_product_attention`, broadcast
    to ``(B, n_heads, T, S)``; ``head_mask`` ``(n_heads,)`` or ``(B, n_heads)`` scales
    each head's output; ``return_weights=True`` also returns ``(B, n_heads, T, S)``.

    * Without a cache (training, a prompt) the per-head keys and values are
      materialized (:meth:`materialize`) and attended to as in multi-head attention.
    * With a :class:`LatentKVCache` holding ``P`` positions, ``x`` holds positions
      ``P .. P+T-1``: their ``c^{KV}`` and ``k^R`` are appended, and the queries attend
      **with the up-projections absorbed** (:meth:`absorbed`): ``q^C_h \cdot W^{UK}_h
      c_j = (W^{UK\top}_h q^C_h) \cdot c_j`` takes the scores against the latent
      itself, and ``W^O_h \sum_j w_j W^{UV}_h c_j = (W^O_h W^{UV}_h) \sum_j w_j c_j``
      folds ``W^{UV}_h`` into the output projection. That is multi-query attention
      with a single key head ``[c_j ; k^R_j]`` of width ``d_c + d_R`` and a single
      value head ``c_j``: no per-head key or value of the past is ever formed.

    ``layer`` is the slot of the cache this layer writes; ``head_dim`` defaults to
    ``d_model // n_heads``. No projection has a bias.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        kv_latent_dim: int,
        rope_dim: int,
        *,
        head_dim: int | None = None,
        q_latent_dim: int | None = None,
        rope_base: float = 10000.0,
        dropout: float = 0.0,
        layer: int = 0,
    ):
        super().__init__()
        _check_mla(d_model, n_heads, kv_latent_dim, rope_dim, head_dim, q_latent_dim)
        _check_mla_options(rope_base, dropout, layer)
        head_dim = d_model // n_heads if head_dim is None else head_dim
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, head_dim
        self.kv_latent_dim, self.rope_dim = kv_latent_dim, rope_dim
        self.q_latent_dim, self.dropout, self.layer = q_latent_dim, dropout, layer
        width = n_heads * head_dim
        self.kv_down = nn.Linear(d_model, kv_latent_dim, bias=False)  # W^DKV
        self.kv_norm = RMSNorm(kv_latent_dim)
        self.k_up = nn.Linear(kv_latent_dim, width, bias=False)  # W^UK
        self.v_up = nn.Linear(kv_latent_dim, width, bias=False)  # W^UV
        self.k_rope_proj = nn.Linear(d_model, rope_dim, bias=False)  # W^KR
        q_in = d_model if q_latent_dim is None else q_latent_dim
        if q_latent_dim is None:
            self.q_down = self.q_norm = None
        else:
            self.q_down = nn.Linear(d_model, q_latent_dim, bias=False)  # W^DQ
            self.q_norm = RMSNorm(q_latent_dim)
        self.q_up = nn.Linear(q_in, width, bias=False)  # W^UQ
        self.q_rope_proj = nn.Linear(q_in, n_heads * rope_dim, bias=False)  # W^QR
        self.out_proj = nn.Linear(width, d_model, bias=False)  # W^O
        self.rotary = RotaryEmbedding(rope_dim, rope_base)

    def latent(
        self, x: torch.Tensor, offset: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """What the cache stores for ``x (B, T, d_model)`` at positions ``offset ..``:
        ``c^{KV}`` ``(B, T, kv_latent_dim)`` and the rotated ``k^R`` ``(B, T,
        rope_dim)``."""
        c_kv = self.kv_norm(self.kv_down(x))
        return c_kv, self.rotary(self.k_rope_proj(x), offset=offset)

    def queries(
        self, x: torch.Tensor, offset: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``q^C`` ``(B, n_heads, T, head_dim)`` and the rotated ``q^R`` ``(B,
        n_heads, T, rope_dim)``."""
        c_q = x if self.q_down is None else self.q_norm(self.q_down(x))
        q_nope = split_heads(self.q_up(c_q), self.n_heads)
        q_rope = split_heads(self.q_rope_proj(c_q), self.n_heads)
        return q_nope, self.rotary(q_rope, offset=offset)

    def materialize(
        self, c_kv: torch.Tensor, k_rope: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head keys ``[W^{UK}_h c ; k^R]`` ``(B, n_heads, S, head_dim +
        rope_dim)`` and values ``W^{UV}_h c`` ``(B, n_heads, S, head_dim)`` from
        ``c_kv (B, S, kv_latent_dim)`` and ``k_rope (B, S, rope_dim)``."""
        B, S, _ = c_kv.shape
        k_nope = split_heads(self.k_up(c_kv), self.n_heads)
        v = split_heads(self.v_up(c_kv), self.n_heads)
        k_rope = k_rope[:, None].expand(B, self.n_heads, S, self.rope_dim)
        return torch.cat((k_nope, k_rope), dim=-1), v

    def absorbed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The absorbed matrices: ``W^{UK}`` per head, ``(n_heads, head_dim,
        kv_latent_dim)`` (``q^C_h`` times it is the query against the latent), and
        ``W^{UV}_h`` folded into ``W^O``, ``(n_heads, kv_latent_dim, d_model)``. A
        server computes them once after training; here they are rebuilt per call."""
        H, d = self.n_heads, self.head_dim
        w_uk = self.k_up.weight.view(H, d, self.kv_latent_dim)
        w_uv = self.v_up.weight.view(H, d, self.kv_latent_dim)
        w_o = self.out_proj.weight.view(self.d_model, H, d)
        return w_uk, torch.einsum("hec,mhe->hcm", w_uv, w_o)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        cache: LatentKVCache | None = None,
        *,
        is_causal: bool = True,
        head_mask: torch.Tensor | None = None,
        return_weights: bool = False,
    ):
        _check_mla_input(
            self, x, attn_mask, cache, is_causal, head_mask, return_weights
        )
        offset = 0 if cache is None else cache.lengths[self.layer]
        c_kv, k_rope = self.latent(x, offset)
        q_nope, q_rope = self.queries(x, offset)
        options = dict(
            is_causal=is_causal,
            scale=1.0 / math.sqrt(self.head_dim + self.rope_dim),
            dropout_p=self.dropout if self.training else 0.0,
            return_weights=True,
        )
        if cache is None:  # materialize the keys and values of every head
            k, v = self.materialize(c_kv, k_rope)
            q = torch.cat((q_nope, q_rope), dim=-1)
            out, weights = scaled_dot_product_attention(q, k, v, attn_mask, **options)
            out = self.out_proj(merge_heads(scale_heads(out, head_mask)))
        else:  # absorbed: attend to the latent, one shared key/value head
            c_kv, k_rope = cache.update(self.layer, c_kv, k_rope)
            w_uk, w_uvo = self.absorbed()
            q = torch.cat((torch.einsum("bhtd,hdc->bhtc", q_nope, w_uk), q_rope), -1)
            k = torch.cat((c_kv, k_rope), dim=-1)[:, None]  # (B, 1, S, d_c + d_R)
            out, weights = scaled_dot_product_attention(
                q, k, c_kv[:, None], attn_mask, enable_gqa=True, **options
            )  # (B, H, T, d_c): each head's weighted sum of latents
            out = scale_heads(out, head_mask)
            out = torch.einsum("bhtc,hcm->btm", out, w_uvo)
        return (out, weights) if return_weights else out


def _check_dtype(fn: str, dtype) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{fn}: dtype must be a floating torch.dtype, got {dtype!r}")


def _check_latent_cache(n_layers, batch, kv_latent_dim, rope_dim, max_len, dtype):
    fn = "LatentKVCache"
    check_sizes(fn, n_layers=n_layers, batch=batch, kv_latent_dim=kv_latent_dim)
    check_sizes(fn, rope_dim=rope_dim, max_len=max_len)
    _check_dtype(fn, dtype)


class LatentKVCache:
    """The cache of multi-head latent attention: per layer, the normalized latent
    ``c^{KV}`` ``(batch, max_len, kv_latent_dim)`` and the rotated shared key ``k^R``
    ``(batch, max_len, rope_dim)`` of every position (``self.c_kv``, ``self.k_rope``:
    ``(n_layers, batch, max_len, ...)``), whatever the number of heads.

    ``update(layer, c_kv_new, k_rope_new)`` appends ``T`` positions ``(batch, T,
    kv_latent_dim)`` and ``(batch, T, rope_dim)`` to that layer and returns all it
    holds, ``(batch, length + T, ...)``; ``length`` is the number of positions every
    layer holds (the position offset of the next tokens); ``reset`` forgets them.
    Writing past ``max_len`` raises :class:`attnbook.kvcache.CacheFullError`.
    ``bytes_per_token``: ``n_layers (kv_latent_dim + rope_dim)`` elements per token
    of one sequence, what :func:`cache_bytes_per_token` gives for ``"mla"``.

    It answers :class:`attnbook.caches.AttentionCache` with ``kernel = "absorbed"``:
    only multi-head latent attention reads it; ``truncate(length)`` rolls back.
    """

    kernel = "absorbed"
    positions_in_cache = False

    def __init__(
        self,
        n_layers: int,
        batch: int,
        kv_latent_dim: int,
        rope_dim: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device=None,
    ):
        _check_latent_cache(n_layers, batch, kv_latent_dim, rope_dim, max_len, dtype)
        self.max_len = max_len
        self.c_kv = torch.zeros(
            n_layers, batch, max_len, kv_latent_dim, dtype=dtype, device=device
        )
        self.k_rope = torch.zeros(
            n_layers, batch, max_len, rope_dim, dtype=dtype, device=device
        )
        self.lengths = [0] * n_layers

    @property
    def length(self) -> int:
        return min(self.lengths)

    @property
    def bytes_per_token(self) -> int:
        """Bytes one position of one sequence takes in all layers."""
        n_layers, _, _, width = self.c_kv.shape
        elements = n_layers * (width + self.k_rope.shape[-1])
        return elements * self.c_kv.element_size()

    def update(
        self, layer: int, c_kv_new: torch.Tensor, k_rope_new: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if (
            isinstance(layer, bool)
            or not isinstance(layer, int)
            or not 0 <= layer < len(self.lengths)
        ):
            raise ValueError(
                f"LatentKVCache.update: layer must be in [0, {len(self.lengths)}), "
                f"got {layer!r}"
            )
        for name, t in (("c_kv_new", c_kv_new), ("k_rope_new", k_rope_new)):
            check_float("LatentKVCache.update", name, t)
        batch, width, rope = self.c_kv.shape[1], self.c_kv.shape[-1], self.rope_dim
        # the rule of attnbook.contract.check_cache_update: T >= 1 new positions
        if (
            not isinstance(c_kv_new, torch.Tensor)
            or not isinstance(k_rope_new, torch.Tensor)
            or c_kv_new.dim() != 3
            or tuple(c_kv_new.shape[::2]) != (batch, width)
            or tuple(k_rope_new.shape) != (batch, c_kv_new.shape[1], rope)
            or c_kv_new.shape[1] < 1
        ):
            raise ValueError(
                "LatentKVCache.update: c_kv_new and k_rope_new must have shapes "
                f"({batch}, T, {width}) and ({batch}, T, {rope}) with T >= 1, got "
                f"{tuple(getattr(c_kv_new, 'shape', ()))} and "
                f"{tuple(getattr(k_rope_new, 'shape', ()))}"
            )
        start, T = self.lengths[layer], c_kv_new.shape[1]
        if start + T > self.max_len:
            raise CacheFullError(
                f"LatentKVCache.update: layer {layer} holds {start} positions, "
                f"appending {T} would exceed max_len={self.max_len}"
            )
        self.c_kv[layer, :, start : start + T] = c_kv_new
        self.k_rope[layer, :, start : start + T] = k_rope_new
        self.lengths[layer] = start + T
        return self.c_kv[layer, :, : start + T], self.k_rope[layer, :, : start + T]

    @property
    def rope_dim(self) -> int:
        return self.k_rope.shape[-1]

    def reset(self) -> None:
        """Forget every position (the buffers stay allocated)."""
        self.lengths = [0] * len(self.lengths)

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions of every layer (only ``lengths``
        changes: the stale entries are overwritten by the next update)."""
        fn = "LatentKVCache.truncate"
        if check_int(fn, "length", length, minimum=0) > self.length:
            raise ValueError(
                f"{fn}: length must be in [0, cache.length={self.length}], got {length}"
            )
        self.lengths = [length] * len(self.lengths)


#: The attention of DeepSeek-V2 as published (DeepSeek-AI, 2024, section 3.1.2), 60
#: layers, 128 heads of width 128, latent ``d_c = 512 = 4 d_h``, query latent 1536,
#: rotary part ``d_R = 64 = d_h / 2``, hidden size 5120.
DEEPSEEK_V2: dict[str, int] = dict(
    n_layers=60,
    n_heads=128,
    head_dim=128,
    kv_latent_dim=512,
    rope_dim=64,
    q_latent_dim=1536,
    d_model=5120,
)


def _check_cache_kind(kind, n_kv_heads, kv_latent_dim, rope_dim) -> None:
    fn, kinds = "cache_bytes_per_token", ("mha", "gqa", "mqa", "mla")
    if kind not in kinds:
        raise ValueError(f"{fn}: kind must be one of {kinds}, got {kind!r}")
    needed = {"gqa": ("n_kv_heads",), "mla": ("kv_latent_dim", "rope_dim")}
    given = dict(n_kv_heads=n_kv_heads, kv_latent_dim=kv_latent_dim, rope_dim=rope_dim)
    for name in needed.get(kind, ()):
        if given[name] is None:
            raise ValueError(f"{fn}: kind={kind!r} needs {name}")
        check_sizes(fn, **{name: given[name]})


def cache_bytes_per_token(
    kind: str,
    *,
    n_layers: int,
    n_heads: int,
    head_dim: int,
    n_kv_heads: int | None = None,
    kv_latent_dim: int | None = None,
    rope_dim: int | None = None,
    bytes_per_elem: int = 2,
) -> int:
    r"""Bytes of cache one token of one sequence needs, by attention kind (the
    comparison of DeepSeek-V2's Table 1, times ``bytes_per_elem``):

    ============  ==========================================
    ``"mha"``     :math:`2\, n_h d_h\, l`
    ``"gqa"``     :math:`2\, n_g d_h\, l` (``n_kv_heads`` groups)
    ``"mqa"``     :math:`2\, d_h\, l`
    ``"mla"``     :math:`(d_c + d_R)\, l`
    ============  ==========================================

    With DeepSeek-V2's ``d_c = 4 d_h`` and ``d_R = d_h / 2`` MLA stores ``4.5 d_h``
    numbers per layer: as much as GQA with 2.25 groups.
    """
    _check_cache_kind(kind, n_kv_heads, kv_latent_dim, rope_dim)
    check_sizes(
        "cache_bytes_per_token",
        n_layers=n_layers,
        n_heads=n_heads,
        head_dim=head_dim,
        bytes_per_elem=bytes_per_elem,
    )
    if kind == "gqa" and n_heads % n_kv_heads:
        raise ValueError(
            f"cache_bytes_per_token: n_heads={n_heads} must be a multiple of "
            f"n_kv_heads={n_kv_heads}"
        )
    if kind == "mla":
        return n_layers * (kv_latent_dim + rope_dim) * bytes_per_elem
    kv_heads = {"mha": n_heads, "gqa": n_kv_heads, "mqa": 1}[kind]
    return 2 * n_layers * kv_heads * head_dim * bytes_per_elem


# --------------------------------------------------------------------------------------
# Speculative decoding
# --------------------------------------------------------------------------------------
@contextlib.contextmanager
def _evaluating(*models: nn.Module):
    """Every submodule of ``models`` in eval mode (dropout off) for the block, each
    submodule's own mode restored afterwards, as ``TinyGPT.generate`` does."""
    modes = [(module, module.training) for m in models for module in m.modules()]
    for model in models:
        model.eval()
    try:
        yield
    finally:
        for module, mode in modes:
            module.training = mode


def truncate_cache(cache: AttentionCache, length: int) -> None:
    """Roll a cache back to its first ``length`` positions, in every layer (what a
    rejected draft token needs): the cache's own ``truncate``
    (:class:`attnbook.caches.AttentionCache`). Positions are appended in order, so
    this only sets ``lengths``: the stale entries behind are overwritten by the next
    update. A ring buffer (:class:`attnbook.kvcache.SlidingWindowKVCache`) or any
    other cache that overwrites old positions cannot roll back and raises
    ``TypeError``."""
    fn = "truncate_cache"
    if not isinstance(cache, AttentionCache):
        raise TypeError(
            f"{fn}: cache must be a cache (attnbook.caches.AttentionCache), got "
            f"{type(cache).__name__}"
        )
    if check_int(fn, "length", length, minimum=0) > cache.length:
        raise ValueError(
            f"{fn}: length must be in [0, cache.length={cache.length}], got {length}"
        )
    try:
        cache.truncate(length)
    except TypeError as error:
        raise TypeError(f"{fn}: cache cannot roll back: {error}") from None


def _check_sampling(fn: str, temperature, top_k, logits=None) -> None:
    """``temperature`` a finite number >= 0, ``top_k`` None or a positive integer,
    ``logits`` (when given) floating ``(..., vocab)`` with ``vocab >= 1``."""
    check_real(fn, "temperature", temperature, minimum=0)
    if top_k is not None:
        check_sizes(fn, top_k=top_k)
    if logits is not None:
        check_float(fn, "logits", logits)
        if logits.dim() < 1 or logits.shape[-1] == 0:
            raise ValueError(
                f"{fn}: logits must have shape (..., vocab) with vocab >= 1, got "
                f"{tuple(logits.shape)}"
            )
        if logits.numel() and not bool((logits < math.inf).all()):
            raise ValueError(
                f"{fn}: logits must not hold NaN or +inf (-inf marks a token that "
                "cannot be drawn)"
            )
        if logits.numel() and bool((logits == -math.inf).all(-1).any()):
            raise ValueError(
                f"{fn}: logits must have a finite entry in every row, a row of shape "
                f"{tuple(logits.shape)} is all -inf"
            )


def sampling_probs(
    logits: torch.Tensor, temperature: float, top_k: int | None = None
) -> torch.Tensor:
    """The distribution a decoder samples from, ``(..., vocab)`` logits -> ``(...,
    vocab)`` probabilities in the logits' dtype: ``softmax(logits / temperature)``
    over the ``top_k`` largest logits (all when ``None``); ``temperature == 0`` is
    greedy decoding, a one-hot at the argmax.

    It computes in float32 at least, on ``(logits - max) / temperature``: float16
    logits divided by a low temperature in float16 overflow (``65504 / 1e-4``), and
    ``inf - inf`` in the softmax is NaN. So every temperature down to the smallest
    is exact up to the float32 rounding, then rounded once to the logits' dtype.
    ``-inf`` marks a token that cannot be drawn; NaN, ``+inf`` and a row without a
    finite logit raise ``ValueError``."""
    _check_sampling("sampling_probs", temperature, top_k, logits)
    if temperature == 0:
        index = logits.argmax(-1, keepdim=True)
        return torch.zeros_like(logits).scatter_(-1, index, 1.0)
    scaled = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if top_k is not None:  # ranked as given: rounding cannot make or break a tie
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values
        scaled = scaled.masked_fill(logits < kth[..., -1:], float("-inf"))
    scaled = (scaled - scaled.amax(-1, keepdim=True)) / temperature
    return torch.softmax(scaled, dim=-1).to(logits.dtype)


def _check_distributions(fn: str, **tensors) -> None:
    for name, t in tensors.items():
        check_float(fn, name, t)


def _check_same_distributions(p, q) -> None:
    _check_distributions("acceptance_probability", p=p, q=q)
    if p.shape != q.shape:
        raise ValueError(
            f"acceptance_probability: p and q must have the same shape (..., vocab), "
            f"got {tuple(p.shape)} and {tuple(q.shape)}"
        )


def acceptance_probability(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    r"""``beta = sum_x min(p(x), q(x))`` over the last dimension: the probability that
    a token drawn from the draft's ``q`` is accepted for the target's ``p`` (Leviathan
    et al.'s :math:`\beta`; its mean over contexts is the acceptance rate
    :math:`\alpha`). ``1 - beta`` is the total variation distance of ``p`` and
    ``q``."""
    _check_same_distributions(p, q)
    return torch.minimum(p, q).sum(-1)


def _check_accept(p, q, draft_tokens) -> None:
    fn = "speculative_accept"
    _check_distributions(fn, p=p, q=q)
    if q.dim() != 3 or p.shape != (q.shape[0], q.shape[1] + 1, q.shape[2]):
        raise ValueError(
            f"{fn}: p must have shape (B, k+1, vocab) and q (B, k, vocab), got "
            f"{tuple(p.shape)} and {tuple(q.shape)}"
        )
    if q.shape[2] == 0:
        raise ValueError(f"{fn}: p and q must have vocab >= 1, got {tuple(q.shape)}")
    for name, t in (("p", p), ("q", q)):
        _check_probabilities(fn, name, t)
    _check_token_ids(fn, "draft_tokens", draft_tokens, tuple(q.shape[:2]), q.shape[2])


def _check_probabilities(fn: str, name: str, t: torch.Tensor) -> None:
    """Every entry of ``t`` finite and ``>= 0`` and every row (last dimension) summing
    to 1 up to rounding (``max(1e-3, 4 eps)`` of its dtype)."""
    if t.numel() == 0:
        return
    if not bool(((t >= 0) & (t < math.inf)).all()):  # NaN fails both
        what = "NaN" if bool(t.isnan().any()) else f"min {float(t.min())}"
        raise ValueError(
            f"{fn}: {name} must hold probabilities (finite, >= 0), got {what}"
        )
    sums = t.to(torch.promote_types(t.dtype, torch.float32)).sum(-1)
    tolerance = max(1e-3, 4 * torch.finfo(t.dtype).eps)
    if not bool(((sums - 1).abs() <= tolerance).all()):
        raise ValueError(
            f"{fn}: every row of {name} must sum to 1 (a distribution over the "
            f"vocabulary), got sums in [{float(sums.min()):g}, {float(sums.max()):g}]"
        )


def _check_token_ids(fn: str, name: str, ids, shape: tuple, vocab_size: int) -> None:
    """``ids`` an int64 tensor of ``shape`` with values in ``[0, vocab_size)``."""
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long:
        raise TypeError(
            f"{fn}: {name} must be an int64 tensor of token ids, got "
            f"{getattr(ids, 'dtype', type(ids).__name__)}"
        )
    if tuple(ids.shape) != shape:
        raise ValueError(
            f"{fn}: {name} must have shape {shape}, got {tuple(ids.shape)}"
        )
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(
            f"{fn}: {name} holds token ids outside the vocabulary [0, {vocab_size}): "
            f"min {int(ids.min())}, max {int(ids.max())}"
        )


def speculative_accept(
    p: torch.Tensor,
    q: torch.Tensor,
    draft_tokens: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The verification rule of speculative sampling, for a batch of sequences.

    Draft token ``x_i ~ q_i`` is accepted with probability ``min(1, p_i(x_i) /
    q_i(x_i))``, in order, until the first rejection. If ``x_i`` is rejected the next
    token is drawn from the normalized residual

    .. math:: p'(x) = \frac{\max(0,\, p_i(x) - q_i(x))}
        {\sum_{x'} \max(0,\, p_i(x') - q_i(x'))},

    and if all ``k`` are accepted a bonus token is drawn from ``p_{k+1}``. Accepted
    tokens followed by that one token are distributed exactly as ``k' + 1`` tokens
    sampled from the target (Chen et al., 2023, Theorem 1): accepting ``x``
    contributes ``q(x) min(1, p(x)/q(x)) = min(p(x), q(x))``, the residual
    contributes ``p(x) - min(p(x), q(x))``.

    Args:
        p: ``(B, k+1, vocab)`` target probabilities at the ``k`` drafted positions
            and the one after.
        q: ``(B, k, vocab)`` draft probabilities the tokens were drawn from.
        draft_tokens: ``(B, k)`` token ids.
        generator: for the uniform draws and the residual sample.

    Returns ``(n_accepted (B,), next_token (B,))``. With one-hot ``p`` and ``q``
    (temperature 0) the rule is deterministic: accept while the draft's argmax is the
    target's, then the target's argmax. Every row of ``p`` and ``q`` must be a
    distribution: entries finite and ``>= 0``, summing to 1 up to rounding
    (``ValueError`` otherwise); an empty batch returns two empty tensors.
    """
    _check_accept(p, q, draft_tokens)
    B, k, V = q.shape
    p_x = p[:, :k].gather(-1, draft_tokens[..., None])[..., 0]
    q_x = q.gather(-1, draft_tokens[..., None])[..., 0]
    r = uniform((B, k), generator=generator, dtype=p.dtype, device=p.device)
    accept = r * q_x < p_x  # r < p(x) / q(x), without dividing by q(x)
    n = accept.long().cumprod(-1).sum(-1)  # accepted before the first rejection
    # a zero row after q makes the residual at n = k the bonus distribution p_{k+1}
    q_pad = torch.cat((q, q.new_zeros(B, 1, V)), dim=1)
    at_n = n[:, None, None].expand(B, 1, V)
    p_n = p.gather(1, at_n)[:, 0]
    residual = (p_n - q_pad.gather(1, at_n)[:, 0]).clamp_min(0.0)
    # p == q up to rounding leaves no residual mass: any sample of p is right then
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_n)
    token = multinomial(residual, 1, generator=generator)[:, 0]
    return n, token


@dataclass
class SpeculativeStats:
    """Counts of one :func:`speculative_generate` call, summed over the batch where a
    count is per sequence: ``proposed`` draft tokens, ``accepted`` (those the rule
    accepted before a sequence's first rejection), ``target_calls`` and
    ``draft_calls`` (forward passes, the prompt's included), ``generated`` (new
    tokens per sequence)."""

    proposed: int = 0
    accepted: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    generated: int = 0

    @property
    def acceptance_rate(self) -> float:
        """Fraction of proposed draft tokens accepted (``nan`` if none)."""
        return self.accepted / self.proposed if self.proposed else float("nan")

    @property
    def tokens_per_target_call(self) -> float:
        """New tokens per sequence per target forward pass (1 without a draft)."""
        return self.generated / self.target_calls if self.target_calls else 0.0


def _check_speculative(target, draft, idx, max_new_tokens, k) -> None:
    fn = "speculative_generate"
    for name, model in (("target", target), ("draft", draft)):
        if not hasattr(getattr(model, "config", None), "vocab_size"):
            raise TypeError(
                f"{fn}: {name} must be a TinyGPT (with a config), got "
                f"{type(model).__name__}"
            )
    vocab_t, vocab_d = target.config.vocab_size, draft.config.vocab_size
    if vocab_t != vocab_d:
        raise ValueError(
            f"{fn}: draft has vocab_size={vocab_d}, the target vocab_size={vocab_t}: "
            "they must share one vocabulary"
        )
    check_int(fn, "max_new_tokens", max_new_tokens, minimum=0)
    check_sizes(fn, k=k)
    shape = tuple(idx.shape) if isinstance(idx, torch.Tensor) else ()
    if len(shape) != 2 or 0 in shape:
        raise ValueError(
            f"{fn}: idx must have shape (batch, seq) with batch, seq >= 1, got "
            f"{shape if isinstance(idx, torch.Tensor) else type(idx).__name__}"
        )
    _check_token_ids(fn, "idx", idx, shape, vocab_t)


@torch.no_grad()
def speculative_generate(
    target: nn.Module,
    draft: nn.Module,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    k: int = 4,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, SpeculativeStats]:
    """Speculative decoding (Leviathan et al., 2023; Chen et al., 2023): a small
    ``draft`` model proposes ``k`` tokens one by one, the ``target`` scores all of
    them in one forward pass, and :func:`speculative_accept` keeps a prefix plus one
    token of the target's. Returns ``(tokens (B, T0 + max_new_tokens), stats)``.

    The output is distributed exactly as ``target.generate(idx, max_new_tokens,
    temperature=temperature, top_k=top_k)``; at ``temperature == 0`` it is the same
    tokens. Both models are :class:`attnbook.models.TinyGPT` models over one vocabulary;
    as ``generate`` does, both run in eval mode for the call (dropout would make the
    passes random) and every submodule gets its previous mode back afterwards; each
    keeps a cache (``make_cache``: a KV cache, or a latent cache for MLA) that is
    rolled back with :func:`truncate_cache` past the accepted tokens. The target's
    first pass reads the prompt and the first proposals together.

    A batch shares one cache length, so every sequence commits the smallest number
    ``n`` of accepted tokens in the batch, then one more: its own rule's token if it
    stopped at ``n``, else its accepted draft token ``n + 1``. Every token is still
    drawn from the target's distribution given the ones before (whether a sequence
    stops at ``n`` depends only on draws made before token ``n + 1``), so batching
    costs speed, not exactness. The last round drafts fewer tokens so that exactly
    ``max_new_tokens`` come out.
    """
    _check_speculative(target, draft, idx, max_new_tokens, k)
    _check_sampling("speculative_generate", temperature, top_k)
    with _evaluating(target, draft):
        return _speculate(
            target, draft, idx, max_new_tokens, k, temperature, top_k, generator
        )


def _speculate(target, draft, idx, max_new_tokens, k, temperature, top_k, generator):
    """The rounds of :func:`speculative_generate`, its arguments checked."""
    B, total = idx.shape[0], idx.shape[1] + max_new_tokens
    stats = SpeculativeStats(generated=max_new_tokens)
    capacity = max(total - 1, 1)
    target_cache = target.make_cache(B, capacity, device=idx.device)
    draft_cache = draft.make_cache(B, capacity, device=idx.device)
    tokens = idx
    while tokens.shape[1] < total:
        L = tokens.shape[1]
        k_round = min(k, total - L - 1)  # never propose past max_new_tokens
        seq, q = tokens, []
        for _ in range(k_round):  # the draft proposes, one token per pass
            logits = draft(seq[:, draft_cache.length :], cache=draft_cache)[:, -1]
            q.append(sampling_probs(logits, temperature, top_k))
            seq = torch.cat((seq, multinomial(q[-1], 1, generator=generator)), 1)
        # the target scores every proposal, and the position after, in one pass
        logits = target(seq[:, target_cache.length :], cache=target_cache)
        p = sampling_probs(logits[:, -(k_round + 1) :], temperature, top_k)
        q = torch.stack(q, 1) if q else p.new_zeros(B, 0, p.shape[-1])
        proposed = seq[:, L:]
        n_each, token = speculative_accept(p, q, proposed, generator=generator)
        n = int(n_each.min())
        if n < k_round:  # sequences that accepted more keep their draft token n + 1
            token = torch.where(n_each > n, proposed[:, n], token)
        tokens = torch.cat((seq[:, : L + n], token[:, None]), dim=1)
        # keep the cached positions 0 .. L+n-1; the new last token is fed next round
        truncate_cache(target_cache, L + n)
        truncate_cache(draft_cache, min(draft_cache.length, L + n))
        stats.proposed += B * k_round
        stats.accepted += int(n_each.sum())
        stats.target_calls += 1
        stats.draft_calls += k_round
    return tokens, stats


def expected_tokens_per_call(alpha: float, k: int) -> float:
    r"""Expected tokens one target pass yields when each of ``k`` draft tokens is
    accepted with probability ``alpha``, independently (Leviathan et al., 2023):
    the accepted drafts plus the target's own token,

    .. math:: E[\#\text{tokens}] = \sum_{i=0}^{k} \alpha^i
        = \frac{1 - \alpha^{k+1}}{1 - \alpha}

    (``k + 1`` at ``alpha = 1``)."""
    _check_speculation("expected_tokens_per_call", alpha, k, 0.0)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, k: int, cost_ratio: float) -> float:
    r"""Leviathan et al.'s expected improvement in walltime (Theorem 3.8): a round
    costs ``k`` draft passes of ``cost_ratio`` ``c`` target passes each plus one
    target pass, and yields :func:`expected_tokens_per_call` tokens,

    .. math:: \frac{1 - \alpha^{k+1}}{(1 - \alpha)(k c + 1)}.
    """
    _check_speculation("expected_speedup", alpha, k, cost_ratio)
    return expected_tokens_per_call(alpha, k) / (k * cost_ratio + 1.0)


def _check_speculation(fn: str, alpha: float, k: int, cost_ratio: float) -> None:
    if check_real(fn, "alpha", alpha, minimum=0) > 1:
        raise ValueError(f"{fn}: alpha must be in [0, 1], got {alpha}")
    check_int(fn, "k", k, minimum=0)
    check_real(fn, "cost_ratio", cost_ratio, minimum=0)


# --------------------------------------------------------------------------------------
# Attention sinks (StreamingLLM)
# --------------------------------------------------------------------------------------
def _check_sink_cache(n_layers, batch, n_kv_heads, head_dim, n_sink, window, dtype):
    fn = "SinkKVCache"
    check_sizes(fn, n_layers=n_layers, batch=batch, n_kv_heads=n_kv_heads)
    check_sizes(fn, head_dim=head_dim, window=window)
    check_int(fn, "n_sink", n_sink, minimum=0)
    _check_dtype(fn, dtype)


def _check_layer(fn: str, layer, n_layers: int) -> None:
    """``layer`` an int in ``[0, n_layers)``: a negative index would read another
    layer, as a list does."""
    if check_int(fn, "layer", layer, minimum=0) >= n_layers:
        raise ValueError(f"{fn}: layer must be in [0, {n_layers}), got {layer}")


def _check_kv_update(fn: str, cache_shape, layer, k_new, v_new) -> None:
    """What ``KVCache.update`` refuses: floating ``k_new``, ``v_new`` (an integer
    tensor would be cast silently) of shape ``cache_shape[1:] + (T, head_dim)``,
    ``layer`` in ``[0, n_layers)``; ``cache_shape`` is ``(n_layers, batch,
    n_kv_heads, head_dim)``."""
    check_float(fn, "k_new", k_new)
    check_float(fn, "v_new", v_new)
    n_layers, batch, n_kv_heads, head_dim = cache_shape
    check_cache_update(
        fn, k_new, v_new, (batch, n_kv_heads), head_dim, layer=layer,
        n_layers=n_layers, names=("k_new", "v_new"),
    )  # fmt: skip


class SinkKVCache(KVCache):
    r"""The first ``n_sink`` positions ever appended (the attention sinks) plus a ring
    buffer of the last ``window`` positions, per layer (Xiao et al., 2023).

    Memory is ``n_sink + window`` positions however long the stream: slots ``0 ..
    n_sink - 1`` hold the sinks, position ``p >= n_sink`` lives in slot ``n_sink + (p -
    n_sink) mod window``. Between updates a layer that has seen ``n`` positions holds
    :meth:`positions`: ``[0, min(n_sink, n))`` and ``[max(n_sink, n - window), n)``.

    ``update(layer, k, v)`` appends ``T`` positions ``(batch, n_kv_heads, T,
    head_dim)``; with ``N = n + T`` it returns, oldest first, the keys and values of

    .. math:: [0, \min(n_s, N)) \,\cup\, [\max(n_s, N - \max(w, T)), N),

    the sinks and the last ``window`` positions *including the new ones* (one decode
    step attends to ``n_sink + window`` keys, the paper's cache size). A causal mask
    aligned bottom-right then lets new query ``n + i`` see the sinks and the returned
    positions up to its own. For a chunk of ``T <= window`` the last query sees the
    positions one decode step would, at the same indices, and each earlier query a
    subset of its own decode step's (fewer recent positions). When ``T > window`` all
    ``T`` new positions are returned, so each new query finds itself: query ``n + i``
    sees the sinks and ``[n, n + i]``, the last one (sinks full) ``T`` recent
    positions, more than the ``window`` a decode step keeps (a long prefill is
    attended to in full). In a model of several layers only the positions agree: the
    hidden states of a chunk's earlier positions, hence the next layer's keys, depend
    on what they saw.

    ``positions_in_cache = True`` (:class:`attnbook.caches.AttentionCache`) tells
    :class:`attnbook.models.Attention` that keys are stored unrotated and that queries
    and keys are rotated by their index in the returned tensor, not by their position
    in the text: the paper's rule, which keeps every distance the model sees below
    ``n_sink + max(window, T)``. ``length`` counts every position ever appended;
    nothing overflows, and nothing rolls back (``truncate`` raises ``TypeError``).
    """

    kernel = "causal"
    positions_in_cache = True

    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        head_dim: int,
        n_sink: int,
        window: int,
        dtype: torch.dtype = torch.float32,
        device=None,
    ):
        _check_sink_cache(n_layers, batch, n_kv_heads, head_dim, n_sink, window, dtype)
        super().__init__(
            n_layers, batch, n_kv_heads, head_dim, n_sink + window, dtype, device
        )
        self.n_sink, self.window = n_sink, window

    def positions(self, layer: int) -> torch.Tensor:
        """The positions ``layer`` holds, in order: ``(min(length, n_sink + window),)``
        integers."""
        _check_layer("SinkKVCache.positions", layer, len(self.lengths))
        n = self.lengths[layer]
        first = min(self.n_sink, n)
        return torch.cat(
            (torch.arange(first), torch.arange(max(first, n - self.window), n))
        )

    def _slots(self, positions: torch.Tensor) -> torch.Tensor:
        ring = self.n_sink + (positions - self.n_sink) % self.window
        return torch.where(positions < self.n_sink, positions, ring).to(self.k.device)

    def retained(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values ``layer`` holds, in the order of :meth:`positions`."""
        _check_layer("SinkKVCache.retained", layer, len(self.lengths))
        slots = self._slots(self.positions(layer))
        return self.k[layer][:, :, slots], self.v[layer][:, :, slots]

    def update(
        self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (len(self.lengths), *self.k.shape[1:3], self.k.shape[-1])
        _check_kv_update("SinkKVCache.update", shape, layer, k_new, v_new)
        n, T = self.lengths[layer], k_new.shape[-2]
        N = n + T
        held = self.positions(layer)
        k_old, v_old = self.retained(layer)
        k_all = torch.cat((k_old, k_new.to(k_old)), dim=-2)
        v_all = torch.cat((v_old, v_new.to(v_old)), dim=-2)
        every = torch.cat((held, torch.arange(n, N)))
        returned = (every < self.n_sink) | (every >= N - max(self.window, T))
        # store the new positions that stay: sinks, and the last `window`
        new = torch.arange(n, N)
        stays = (new < self.n_sink) | (new >= N - self.window)
        slots = self._slots(new[stays])
        self.k[layer][:, :, slots] = k_new[..., stays, :].to(k_old)
        self.v[layer][:, :, slots] = v_new[..., stays, :].to(v_old)
        self.lengths[layer] = N
        return k_all[..., returned, :], v_all[..., returned, :]

    def truncate(self, length: int) -> None:
        """Refused: the ring has overwritten the positions it would need."""
        raise TypeError(
            "SinkKVCache.truncate: a SinkKVCache overwrites old positions, so it "
            "cannot roll back"
        )


STREAMING_CACHES = ("full", "window", "sinks")


def _check_model_ids(fn: str, model, ids, shape: str, min_len: int = 2) -> None:
    """``model`` a TinyGPT-like model (with a ``config``) and ``ids`` int64 token ids
    of ``shape`` (``"(n,)"`` or ``"(n,) or (batch, n)"``), ``n >= min_len``."""
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if vocab is None:
        raise TypeError(
            f"{fn}: model must be a TinyGPT (with a config), got {type(model).__name__}"
        )
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long:
        raise TypeError(
            f"{fn}: ids must be an int64 tensor of token ids, got "
            f"{getattr(ids, 'dtype', type(ids).__name__)}"
        )
    if ids.dim() not in ((1,) if shape == "(n,)" else (1, 2)) or (
        ids.shape[-1] < min_len or 0 in ids.shape
    ):
        raise ValueError(
            f"{fn}: ids must have shape {shape} with n >= {min_len}, got "
            f"{tuple(ids.shape)}"
        )
    _check_token_ids(fn, "ids", ids, tuple(ids.shape), vocab)


def _check_streaming(model, ids, cache, n_sink, window, progress) -> None:
    fn = "streaming_losses"
    if not isinstance(cache, str):
        if not isinstance(cache, AttentionCache) or cache.length != 0:
            raise ValueError(
                f"{fn}: cache must be one of {STREAMING_CACHES} or an empty cache "
                f"object with update() and length (e.g. a QuantizedKVCache), got "
                f"{cache!r}"
            )
    elif cache not in STREAMING_CACHES:
        raise ValueError(
            f"{fn}: cache must be one of {STREAMING_CACHES}, got {cache!r}"
        )
    _check_model_ids(fn, model, ids, "(n,)")
    check_int(fn, "n_sink", n_sink, minimum=0)
    check_int(fn, "window", window, minimum=0)
    check_flag(fn, "progress", progress)
    positional = model.config.positional
    latent = getattr(model.config, "attention", "mha") == "mla"
    if latent and cache in ("window", "sinks"):
        raise ValueError(
            f"{fn}: cache={cache!r} holds per-head keys and values; a model with "
            "attention='mla' caches latents: use cache='full' or a LatentKVCache"
        )
    if not isinstance(cache, str) and latent != (cache.kernel == "absorbed"):
        need = "a LatentKVCache" if latent else "a cache of keys and values"
        raise ValueError(
            f"{fn}: cache must be {need} for a model with attention="
            f"{model.config.attention!r}, got {type(cache).__name__}"
        )
    if cache in ("window", "sinks") and positional in ("t5", "alibi"):
        raise ValueError(
            f"{fn}: cache={cache!r} needs a model whose positions live in the keys or "
            f"the input, got positional={positional!r}"
        )
    if cache in ("window", "sinks") and n_sink + window < 2:
        raise ValueError(
            f"{fn}: cache={cache!r} keeps n_sink + window - 1 positions, which must "
            f"be >= 1, got n_sink={n_sink}, window={window}"
        )
    if cache == "sinks" and window < 1:
        raise ValueError(f"{fn}: window must be >= 1 with cache='sinks', got 0")


@torch.no_grad()
def streaming_losses(
    model,
    ids: torch.Tensor,
    *,
    cache: str = "full",
    n_sink: int = 4,
    window: int = 60,
    progress: bool = False,
) -> torch.Tensor:
    """Next-token loss at every position when ``model`` (a
    :class:`attnbook.models.TinyGPT`) reads the 1-D ``ids`` ``(n,)`` one token at a
    time: ``(n - 1,)``, entry ``t`` is ``-log p(ids[t + 1] | what the cache kept of
    ids[:t + 1])``.

    ``cache``:

    * ``"full"``: a :class:`attnbook.kvcache.KVCache` keeping everything (dense
      attention; past the training length RoPE meets distances it never saw), or
      for ``attention="mla"`` a :class:`LatentKVCache` (the only cache MLA reads);
    * ``"window"``: a :class:`attnbook.kvcache.SlidingWindowKVCache` of ``n_sink +
      window - 1`` positions, so each step attends to the last ``n_sink + window``
      tokens, the same budget as ``"sinks"``. Its keys are rotated at their absolute
      positions; RoPE scores depend on distances only, so this is the same as
      numbering by slot: window attention, which loses the first tokens;
    * ``"sinks"``: a :class:`SinkKVCache` (``n_sink`` first tokens + last ``window``,
      rotated by slot): StreamingLLM.

    * an empty cache object with the :class:`attnbook.kvcache.KVCache` interface (for
      example a :class:`QuantizedKVCache` for one sequence, long enough for ``ids``;
      a :class:`LatentKVCache` for MLA, and only for MLA): the model reads through it
      as it is.

    The ``t5`` and ``alibi`` schemes build biases for absolute lengths and run only
    with ``"full"`` (or a cache object). ``progress=True`` shows a tqdm bar. The model
    runs in eval mode for the call; every submodule gets its previous mode back.
    """
    given = None if isinstance(cache, str) else cache
    _check_streaming(model, ids, cache, n_sink, window, progress)
    cache = cache if given is None else type(given).__name__
    cfg = model.config
    param = next(model.parameters())
    sizes = (cfg.n_layers, 1, cfg.n_kv_heads or cfg.n_heads, cfg.d_model // cfg.n_heads)
    kw = dict(dtype=param.dtype, device=param.device)
    if given is not None:
        kv = given
    elif cache == "full" and cfg.attention == "mla":
        kv = model.make_cache(1, ids.shape[0])
    elif cache == "full":
        kv = KVCache(*sizes, ids.shape[0], **kw)
    elif cache == "window":
        kv = SlidingWindowKVCache(*sizes, n_sink + window - 1, **kw)
    else:
        kv = SinkKVCache(*sizes, n_sink, window, **kw)
    ids = ids.to(param.device)
    steps = range(ids.shape[0] - 1)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc=f"streaming ({cache})")
    losses = []
    with _evaluating(model):
        for t in steps:
            logits = model(ids[t].view(1, 1), cache=kv)[0, -1]
            losses.append(F.cross_entropy(logits.float(), ids[t + 1]))
    return torch.stack(losses)


@torch.no_grad()
def first_token_attention(model, ids: torch.Tensor) -> torch.Tensor:
    """Mean attention weight on position 0 in every layer, ``(n_layers,)``: the weights
    of one forward pass over ``ids`` (``(n,)`` or ``(batch, n)``, ``n >= 2``) on key
    0, averaged over the batch, the heads and the queries ``1 .. n - 1`` (query 0 can
    only attend to itself). A head spreading its weight evenly gives query ``t`` the
    weight ``1 / (t + 1)``, a mean of ``(H_n - 1) / (n - 1)`` (``H_n`` the harmonic
    number); a layer with an attention sink gives much more. The model runs in eval
    mode for the call; every submodule gets its previous mode back."""
    _check_model_ids("first_token_attention", model, ids, "(n,) or (batch, n)")
    ids = ids[None] if ids.dim() == 1 else ids
    with _evaluating(model):
        _, weights = model(ids, return_weights=True)  # (layers, B, heads, n, n)
    return weights[..., 1:, 0].mean(dim=(1, 2, 3))


# --------------------------------------------------------------------------------------
# Quantized KV caches (KIVI)
# --------------------------------------------------------------------------------------
QUANT_BITS = (4, 8)
QUANT_AXES = ("channel", "token")


@dataclass(frozen=True)
class QuantizedTensor:
    """A tensor of ``shape`` stored as ``bits``-bit integer codes with one ``scale`` and
    one ``zero`` (the group's minimum) per group of ``group_size`` consecutive entries
    along ``dim``.

    ``data``: ``uint8`` codes in the layout of the tensor; with ``bits=4`` two codes
    share a byte along the last dimension (low nibble first; an odd last dimension is
    padded with one zero code). ``scale`` and ``zero``: the tensor's shape with ``dim``
    replaced by the number of groups, in float32 (float64 for a float64 tensor): a
    half-precision scale would cost the half-step bound of :func:`quantize`.
    """

    data: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    bits: int
    dim: int
    group_size: int
    shape: tuple

    @property
    def nbytes(self) -> int:
        """The bytes actually stored, the codes (``bits / 8`` per value) plus the
        scales and zeros."""
        return sum(
            t.numel() * t.element_size() for t in (self.data, self.scale, self.zero)
        )


def _pack4(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte along the last dimension: ``(..., n)`` -> ``(..., ceil(n
    / 2))``."""
    if codes.shape[-1] % 2:
        codes = F.pad(codes, (0, 1))
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def _unpack4(data: torch.Tensor, n: int) -> torch.Tensor:
    return torch.stack((data & 15, data >> 4), dim=-1).flatten(-2)[..., :n]


def quantize(
    x: torch.Tensor, bits: int, *, dim: int, group_size: int | None = None
) -> QuantizedTensor:
    r"""Asymmetric round-to-nearest quantization of ``x`` to ``bits`` (4 or 8) bits,
    one scale and zero point per group of ``group_size`` entries along ``dim`` (the
    whole ``dim`` when ``None``).

    For a group ``g`` with minimum ``z = min g`` and maximum ``M``:

    .. math::
        s = \frac{M - z}{2^b - 1}, \qquad q = \mathrm{round}\Big(\frac{x - z}{s}\Big)
        \in \{0, \dots, 2^b - 1\}, \qquad \hat x = q\, s + z,

    so ``|x - x_hat| <= s / 2`` and the group's minimum and maximum come back exactly
    (up to the float arithmetic of ``q s + z``). A constant group has ``s = 0``: its
    codes are 0 and it comes back exactly. KIVI (Liu et al., 2024) quantizes keys with
    ``dim`` the token axis (per-channel statistics) and values with ``dim`` the channel
    axis (per-token statistics).

    ``x`` must be finite (a NaN or inf would make its group NaN: ``ValueError``).
    The arithmetic, ``s`` and ``z`` are float32 at least, for any dtype of ``x``, and
    :func:`dequantize` returns float32 for a half-precision ``x``: with ``s``, ``x -
    z`` and ``q s + z`` rounded to bfloat16's 8 bits the error reached 2 steps (0.8 in
    float16). Rounding ``x_hat`` back to bfloat16 would add half a unit in the last
    place of ``x``, which can exceed ``s / 2`` when the group's range is small next to
    its values (near 100 bfloat16 steps by 0.5).
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"quantize: x must be a float tensor, got {type(x).__name__}")
    if bits not in QUANT_BITS:
        raise ValueError(f"quantize: bits must be one of {QUANT_BITS}, got {bits!r}")
    if (
        isinstance(dim, bool)
        or not isinstance(dim, int)
        or not -x.dim() <= dim < x.dim()
    ):
        raise ValueError(
            f"quantize: dim must be in [{-x.dim()}, {x.dim()}) for x of shape "
            f"{tuple(x.shape)}, got {dim!r}"
        )
    dim = dim % x.dim()
    n = x.shape[dim]
    group_size = n if group_size is None else group_size
    if (
        isinstance(group_size, bool)
        or not isinstance(group_size, int)
        or (group_size < 1 or n % group_size)
    ):
        raise ValueError(
            f"quantize: group_size must be a positive divisor of x.shape[{dim}]={n}, "
            f"got {group_size!r}"
        )
    _check_finite("quantize", "x", x)
    levels = 2**bits - 1
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    groups = x.movedim(dim, -1).unflatten(-1, (n // group_size, group_size))
    zero = groups.amin(-1, keepdim=True)
    scale = (groups.amax(-1, keepdim=True) - zero) / levels
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.round((groups - zero) / safe).clamp_(0, levels).to(torch.uint8)
    codes = codes.flatten(-2).movedim(-1, dim)
    if bits == 4:
        codes = _pack4(codes)
    return QuantizedTensor(
        data=codes,
        scale=scale.squeeze(-1).movedim(-1, dim),
        zero=zero.squeeze(-1).movedim(-1, dim),
        bits=bits,
        dim=dim,
        group_size=group_size,
        shape=tuple(x.shape),
    )


def _check_finite(fn: str, name: str, x: torch.Tensor) -> None:
    """No NaN or inf in ``x``: one would make its whole group's scale NaN."""
    if x.numel() and not bool(x.isfinite().all()):
        raise ValueError(
            f"{fn}: {name} must be finite (a NaN or inf makes its group's scale, so "
            f"every value of the group, NaN), got {x.dtype} {tuple(x.shape)} with "
            f"{int((~x.isfinite()).sum())} non-finite"
        )


def dequantize(q: QuantizedTensor) -> torch.Tensor:
    """``q.data * scale + zero`` with each group's scale and zero broadcast over its
    entries: a tensor of ``q.shape`` in the dtype of the scales (float32, or float64
    for a float64 tensor)."""
    if not isinstance(q, QuantizedTensor):
        raise TypeError(
            f"dequantize: q must be a QuantizedTensor (from quantize), got "
            f"{type(q).__name__}"
        )
    codes = _unpack4(q.data, q.shape[-1]) if q.bits == 4 else q.data
    scale = q.scale.repeat_interleave(q.group_size, dim=q.dim)
    zero = q.zero.repeat_interleave(q.group_size, dim=q.dim)
    return codes.to(scale.dtype) * scale + zero


def _cat_tokens(a: QuantizedTensor | None, b: QuantizedTensor) -> QuantizedTensor:
    """Two quantized ``(..., T, d)`` blocks, one after the other along the token axis
    ``-2`` (groups never straddle the cut)."""
    if a is None:
        return b
    shape = a.shape[:-2] + (a.shape[-2] + b.shape[-2], a.shape[-1])
    cat = [
        torch.cat((x, y), dim=-2)
        for x, y in zip((a.data, a.scale, a.zero), (b.data, b.scale, b.zero))
    ]
    return QuantizedTensor(*cat, a.bits, a.dim, a.group_size, shape)


def _check_quantized_cache(n_layers, batch, n_kv_heads, head_dim, max_len, dtype):
    fn = "QuantizedKVCache"
    check_sizes(fn, n_layers=n_layers, batch=batch, n_kv_heads=n_kv_heads)
    check_sizes(fn, head_dim=head_dim, max_len=max_len)
    _check_dtype(fn, dtype)


def _check_quantization(bits, group_size, key_axis, value_axis, head_dim) -> None:
    fn = "QuantizedKVCache"
    check_sizes(fn, group_size=group_size)
    if isinstance(bits, bool) or bits not in QUANT_BITS:
        raise ValueError(f"{fn}: bits must be one of {QUANT_BITS}, got {bits!r}")
    for name, axis in (("key_axis", key_axis), ("value_axis", value_axis)):
        if axis not in QUANT_AXES:
            raise ValueError(f"{fn}: {name} must be one of {QUANT_AXES}, got {axis!r}")
    if "token" in (key_axis, value_axis) and head_dim % group_size:
        raise ValueError(
            f"{fn}: group_size={group_size} must divide head_dim={head_dim} to "
            "quantize per token"
        )


class QuantizedKVCache:
    """A KV cache stored in ``bits`` (8 or 4) bits with KIVI's axes (Liu et al., 2024),
    with the ``update(layer, k, v)`` interface of :class:`attnbook.kvcache.KVCache`.

    Keys have a few outlier channels, large in every token; values do not. So
    ``key_axis="channel"`` (the default) gives each channel its own scale and zero,
    computed over a group of ``group_size`` tokens, and ``value_axis="token"`` gives
    each token its own, over groups of ``group_size`` channels (``group_size`` must
    then divide ``head_dim``); either axis can be chosen for either tensor.

    A per-channel group needs ``group_size`` tokens before it can be quantized. The
    tokens of the not-yet-full group stay in full precision in a residual buffer
    (``< group_size`` tokens per layer) and are quantized together once the group fills.
    KIVI's residual is larger (``R`` recent tokens, a multiple of ``group_size``, for
    keys and values alike); here only the partial group is kept, and per-token
    quantization happens at once.

    ``update`` appends ``T`` positions ``(batch, n_kv_heads, T, head_dim)`` and returns
    the dequantized keys and values of every position, ``(..., length, head_dim)``
    in ``dtype``: what a fused kernel would dequantize on the fly. Scales and zeros
    are float32 (float64 in a float64 cache, see :class:`QuantizedTensor`), so each
    returned entry is within ``s / 2`` of the entry appended (as cast to ``dtype``)
    plus one rounding to ``dtype``: half a unit in the last place. In a bfloat16 or
    float16 cache they cost 8 bytes per group instead of 4, ``bytes_per_token``
    counts them. A NaN or inf (after the cast to ``dtype``: float16 ends at 65504)
    raises ``ValueError``: it would make its whole group NaN. ``nbytes()`` counts what
    is stored (codes, scales, zeros, residual), not the capacity; ``max_len`` bounds
    the length (:class:`attnbook.kvcache.CacheFullError` past it). It answers
    :class:`attnbook.caches.AttentionCache` with ``kernel = "causal"`` (what it
    returns is not what it stores) and cannot roll back (``truncate`` raises
    ``TypeError``: its groups are quantized together).
    """

    kernel = "causal"
    positions_in_cache = False

    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        head_dim: int,
        max_len: int,
        *,
        bits: int = 8,
        group_size: int = 32,
        key_axis: str = "channel",
        value_axis: str = "token",
        dtype: torch.dtype = torch.float32,
        device=None,
    ):
        _check_quantized_cache(n_layers, batch, n_kv_heads, head_dim, max_len, dtype)
        _check_quantization(bits, group_size, key_axis, value_axis, head_dim)
        self.bits, self.group_size, self.max_len = bits, group_size, max_len
        self.axes = {"k": key_axis, "v": value_axis}
        self.dtype, self.device, self.head_dim = dtype, device, head_dim
        self.leading = (batch, n_kv_heads)
        self.n_layers = n_layers
        self.reset()

    def reset(self) -> None:
        """Forget every position."""
        L = self.n_layers
        self.lengths = [0] * L
        self.quantized = {"k": [None] * L, "v": [None] * L}
        empty = torch.zeros(
            *self.leading, 0, self.head_dim, dtype=self.dtype, device=self.device
        )
        self.residual = {"k": [empty] * L, "v": [empty] * L}

    @property
    def length(self) -> int:
        return min(self.lengths)

    def _append(self, name: str, layer: int, x: torch.Tensor) -> torch.Tensor:
        x, G = x.to(self.dtype), self.group_size
        if self.axes[name] == "token":
            new = quantize(x, self.bits, dim=-1, group_size=G)
        else:
            x = torch.cat((self.residual[name][layer], x), dim=-2)
            full = x.shape[-2] // G * G
            self.residual[name][layer] = x[..., full:, :]
            if full == 0:
                new = None
            else:
                new = quantize(x[..., :full, :], self.bits, dim=-2, group_size=G)
        if new is not None:
            self.quantized[name][layer] = _cat_tokens(self.quantized[name][layer], new)
        stored = self.quantized[name][layer]
        parts = [] if stored is None else [dequantize(stored).to(self.dtype)]
        return torch.cat(parts + [self.residual[name][layer]], dim=-2)

    def update(
        self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        fn = "QuantizedKVCache.update"
        shape = (self.n_layers, *self.leading, self.head_dim)
        _check_kv_update(fn, shape, layer, k_new, v_new)
        k_new, v_new = k_new.to(self.dtype), v_new.to(self.dtype)
        _check_finite(fn, f"k_new (in {self.dtype})", k_new)
        _check_finite(fn, f"v_new (in {self.dtype})", v_new)
        n, T = self.lengths[layer], k_new.shape[-2]
        if n + T > self.max_len:
            raise CacheFullError(
                f"QuantizedKVCache.update: layer {layer} holds {n} positions, "
                f"appending {T} would exceed max_len={self.max_len}"
            )
        self.lengths[layer] = n + T
        return self._append("k", layer, k_new), self._append("v", layer, v_new)

    def truncate(self, length: int) -> None:
        """Refused: a quantized group cannot be cut back to full precision."""
        raise TypeError(
            "QuantizedKVCache.truncate: a QuantizedKVCache quantizes its groups "
            "together, so it cannot roll back"
        )

    def nbytes(self) -> int:
        """Bytes held now: codes, scales and zeros of every quantized group, plus the
        full-precision residual."""
        total = 0
        for name in ("k", "v"):
            for q, r in zip(self.quantized[name], self.residual[name]):
                total += (0 if q is None else q.nbytes) + r.numel() * r.element_size()
        return total

    @property
    def bytes_per_token(self) -> float:
        """Bytes per position of one sequence, over all layers, keys and values, once
        its groups are full: ``ceil(head_dim * bits / 8)`` bytes of codes per head
        plus the scales and zeros, per token (``head_dim / group_size`` of each) or per
        channel (``head_dim`` of each, shared by ``group_size`` tokens): both give ``2
        head_dim / group_size`` numbers per head and token, of 4 bytes (8 in a float64
        cache)."""
        codes = math.ceil(self.head_dim * self.bits / 8)
        itemsize = torch.promote_types(self.dtype, torch.float32).itemsize
        scales = 2 * self.head_dim / self.group_size * itemsize
        return 2 * self.n_layers * self.leading[1] * (codes + scales)


def outlier_channel_ratio(k: torch.Tensor) -> torch.Tensor:
    """How much the largest channel dominates: for keys ``(..., seq, head_dim)``, the
    mean absolute value of each channel over the tokens, ``m_c``, then ``max_c m_c /
    median_c m_c``, shape ``(...)`` (one number per head; for an even ``head_dim`` the
    median is the lower of the two middle values, as ``torch.median`` takes it).
    Close to 1 when channels are alike; large when a few channels carry outliers,
    which is why KIVI quantizes keys per channel. A head whose median channel is all
    zeros gives ``inf`` (``nan`` if every channel is)."""
    check_float("outlier_channel_ratio", "k", k)
    if k.dim() < 2 or k.shape[-1] == 0 or k.shape[-2] == 0:
        raise ValueError(
            "outlier_channel_ratio: k must have shape (..., seq, head_dim) with seq, "
            f"head_dim >= 1, got {tuple(k.shape)}"
        )
    m = k.abs().mean(dim=-2)
    return m.amax(-1) / m.median(-1).values


# --------------------------------------------------------------------------------------
# Continuous batching over a paged cache (Orca, vLLM)
# --------------------------------------------------------------------------------------
def _check_request(r) -> None:
    fn = "Request"
    check_sizes(fn, prompt_len=r.prompt_len, output_len=r.output_len)
    check_int(fn, "arrival_step", r.arrival_step, minimum=0)
    if not isinstance(r.prompt, tuple) or len(r.prompt) != r.prompt_len:
        raise ValueError(
            f"{fn}: prompt must hold prompt_len={r.prompt_len} tokens, got "
            f"{len(r.prompt) if isinstance(r.prompt, tuple) else r.prompt!r}"
        )
    if not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in r.prompt
    ):
        raise ValueError(
            f"{fn}: prompt must hold non-negative integer token ids, got {r.prompt}"
        )


@dataclass(frozen=True)
class Request:
    """A generation request: ``prompt`` (``prompt_len`` token ids) arrives at step
    ``arrival_step`` and wants ``output_len`` new tokens (greedy)."""

    id: int
    prompt_len: int
    output_len: int
    arrival_step: int
    prompt: tuple[int, ...] = ()

    def __post_init__(self):
        _check_request(self)


def _check_trace(n_requests, generator, prompt_len, output_len, arrival_rate):
    fn = "synthetic_trace"
    check_sizes(fn, n_requests=n_requests)
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"{fn}: generator must be a torch.Generator, got {type(generator).__name__}"
        )
    for name, pair in (("prompt_len", prompt_len), ("output_len", output_len)):
        if not (
            isinstance(pair, (tuple, list))
            and len(pair) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) for n in pair)
            and 1 <= pair[0] <= pair[1]
        ):
            raise ValueError(
                f"{fn}: {name} must be a range (lo, hi) of integers with 1 <= lo <= "
                f"hi, got {pair!r}"
            )
    check_real(fn, "arrival_rate", arrival_rate, above=0)


def synthetic_trace(
    n_requests: int,
    *,
    generator: torch.Generator,
    prompt_len: tuple[int, int] = (4, 24),
    output_len: tuple[int, int] = (1, 48),
    arrival_rate: float = 0.5,
    vocab_size: int = 32,
) -> list[Request]:
    """``n_requests`` requests with prompt and output lengths drawn uniformly from the
    inclusive ranges ``prompt_len`` and ``output_len``, random prompt tokens below
    ``vocab_size``, and Poisson arrivals at ``arrival_rate`` requests per step (the
    gaps are exponential; a request arrives at the step its time falls in)."""
    _check_trace(n_requests, generator, prompt_len, output_len, arrival_rate)
    check_sizes("synthetic_trace", vocab_size=vocab_size)

    def draw(lo: int, hi: int) -> list[int]:
        return torch.randint(lo, hi + 1, (n_requests,), generator=generator).tolist()

    prompts, outputs = draw(*prompt_len), draw(*output_len)
    gaps = -torch.log1p(-torch.rand(n_requests, generator=generator)) / arrival_rate
    arrivals = gaps.cumsum(0).floor().long().tolist()
    return [
        Request(
            i,
            p,
            o,
            a,
            tuple(torch.randint(vocab_size, (p,), generator=generator).tolist()),
        )
        for i, (p, o, a) in enumerate(zip(prompts, outputs, arrivals))
    ]


def _check_prefill(engine, request) -> None:
    fn = "PagedModel.prefill"
    if not isinstance(request, Request):
        raise TypeError(
            f"{fn}: request must be a Request, got {type(request).__name__}"
        )
    vocab = engine.model.config.vocab_size
    if max(request.prompt) >= vocab:
        raise ValueError(
            f"{fn}: request {request.id!r} has prompt token ids outside the "
            f"vocabulary [0, {vocab}): max {max(request.prompt)}"
        )


def _check_decode_tokens(tokens, vocab: int) -> None:
    if not isinstance(tokens, (list, tuple)) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
        for t in tokens
    ):
        raise ValueError(
            f"PagedModel.decode: tokens must be a list of token ids in [0, {vocab}), "
            f"got {tokens!r}"
        )


def _check_paged(model, n_blocks, block_size, max_len) -> None:
    fn = "PagedModel"
    positional = getattr(getattr(model, "config", None), "positional", None)
    if positional is None:
        raise TypeError(
            f"{fn}: model must be a TinyGPT (with a config), got {type(model).__name__}"
        )
    if positional not in ("rope", "none"):
        raise ValueError(
            f"{fn}: PagedModel runs positional='rope' or 'none', got {positional!r}"
        )
    check_sizes(fn, n_blocks=n_blocks, block_size=block_size)
    if max_len is not None:
        check_sizes(fn, max_len=max_len)


class PagedModel:
    """A :class:`attnbook.models.TinyGPT` serving many sequences over one
    :class:`attnbook.kvcache.PagedKVCache` per layer (``n_blocks`` blocks of
    ``block_size`` positions each; every layer takes the same blocks).

    * ``prefill`` runs a prompt through the model's own forward pass with a private
      :class:`attnbook.kvcache.KVCache`, copies its keys and values into the pages
      and returns the first (greedy) token;
    * ``decode`` runs one token for each of a ragged batch of sequences: per layer the
      model's projections, RoPE at each sequence's own position, an append to the
      pages, a gather of each sequence's keys and values padded to the longest, and
      :func:`attnbook.attend.decode_attention` with ``cache_seqlens`` (the Triton
      kernel on a GPU), then the block's MLP. ``Attention.forward`` cannot do this: it
      takes one position offset for the whole batch.

    ``max_len`` (default the model's ``config.max_len``) is what a contiguous cache
    would reserve per sequence. Positional schemes ``"rope"`` and ``"none"`` only.
    """

    def __init__(self, model, *, n_blocks: int, block_size: int, max_len=None):
        _check_paged(model, n_blocks, block_size, max_len)
        cfg = model.config
        self.model = model.eval()
        self.n_blocks, self.block_size = n_blocks, block_size
        self.max_len = cfg.max_len if max_len is None else max_len
        param = next(model.parameters())
        head_dim = cfg.d_model // cfg.n_heads
        self.caches = [
            PagedKVCache(
                n_blocks,
                block_size,
                cfg.n_kv_heads or cfg.n_heads,
                head_dim,
                dtype=param.dtype,
                device=param.device,
            )
            for _ in range(cfg.n_layers)
        ]

    def blocks_for(self, n_positions: int) -> int:
        return -(-n_positions // self.block_size)

    @property
    def blocks_in_use(self) -> int:
        return self.n_blocks - len(self.caches[0].free_blocks)

    @property
    def stored_positions(self) -> int:
        return sum(self.caches[0].lengths.values())

    def wasted_slots(self) -> int:
        return self.caches[0].wasted_slots()

    @torch.no_grad()
    def prefill(self, request: Request) -> int:
        _check_prefill(self, request)
        cfg, param = self.model.config, next(self.model.parameters())
        p = request.prompt_len
        if request.id in self.caches[0].block_tables:
            raise ValueError(f"PagedModel.prefill: sequence {request.id!r} is running")
        # check before any page is touched: a refused prefill changes nothing
        self._check_room("prefill", self.blocks_for(p))
        kv = KVCache(
            cfg.n_layers,
            1,
            cfg.n_kv_heads or cfg.n_heads,
            cfg.d_model // cfg.n_heads,
            p,
            dtype=param.dtype,
            device=param.device,
        )
        ids = torch.tensor([request.prompt], device=param.device)
        logits = self.model(ids, cache=kv)[0, -1]
        for layer, cache in enumerate(self.caches):
            cache.allocate(request.id)
            cache.append(request.id, kv.k[layer, 0, :, :p], kv.v[layer, 0, :, :p])
        return int(logits.argmax())

    @torch.no_grad()
    def decode(self, seq_ids: list, tokens: list[int]) -> list[int]:
        """Feed ``tokens[b]`` to sequence ``seq_ids[b]`` (at position = its length so
        far) and return the greedy next token of each. The ids must be distinct
        running sequences; when the pool cannot take the blocks the step needs, it
        raises :class:`attnbook.kvcache.CacheFullError` and changes nothing. No
        sequence (``decode([], [])``) is a step of nothing: ``[]``."""
        model, param = self.model, next(self.model.parameters())
        lengths = self.caches[0].lengths
        _check_decode_tokens(tokens, model.config.vocab_size)
        if len(tokens) != len(seq_ids) or len(set(seq_ids)) != len(seq_ids):
            raise ValueError(
                "PagedModel.decode: seq_ids must be distinct and tokens hold one token "
                f"each, got seq_ids {list(seq_ids)} and {len(tokens)} tokens"
            )
        unknown = [s for s in seq_ids if s not in lengths]
        if unknown:
            raise ValueError(f"PagedModel.decode: sequences {unknown} are not running")
        if not seq_ids:
            return []
        # a sequence whose last block is full takes a new one
        full = sum(lengths[s] % self.block_size == 0 for s in seq_ids)
        self._check_room("decode", full)
        positions = torch.tensor([self.caches[0].lengths[s] for s in seq_ids])
        x = model.tok_emb(torch.tensor(tokens, device=param.device)[:, None])
        for layer, block in enumerate(model.blocks):
            inner = x if block.post else block.ln1(x)
            out = self._attend(layer, block.attn, inner, seq_ids, positions)
            if block.post:  # the residual logic of attnbook.models.Block
                x = block.ln1(x + out)
                if block.mlp is not None:
                    x = block.ln2(x + block.mlp(x))
            else:
                x = x + out
                if block.mlp is not None:
                    x = x + block.mlp(block.ln2(x))
        return model.head(model.ln_f(x))[:, -1].argmax(-1).tolist()

    def _attend(self, layer, attn, x, seq_ids, positions) -> torch.Tensor:
        q, k, v = attn.project(x)  # the layer's shell: (B, heads, 1, head_dim)
        if attn.rotary is not None:  # each sequence at its own position
            at = positions.view(-1, 1, 1)
            q, k = attn.rotary(q, at), attn.rotary(k, at)
        cache = self.caches[layer]
        cache.select(seq_ids)
        k_pad, v_pad = cache.update(0, k, v)  # padded to the longest sequence
        out = decode_attention(q, k_pad, v_pad, cache.seqlens().to(x.device))
        return attn.out_proj(merge_heads(out))

    def _check_room(self, fn: str, needed: int) -> None:
        free = len(self.caches[0].free_blocks)
        if needed > free:
            raise CacheFullError(
                f"PagedModel.{fn}: needs {needed} more blocks, only {free} are free"
            )

    def release(self, seq_id) -> None:
        for cache in self.caches:
            cache.free(seq_id)


@dataclass
class RequestTiming:
    """When a request arrived, got its first token and its last, in steps. A step's
    tokens are ready at its end: a request arriving at step ``a`` and served at once
    has ``first_token = a + 1`` and ``finish = a + output_len``."""

    arrival: int
    first_token: int = -1
    finish: int = -1

    @property
    def latency(self) -> int:
        return self.finish - self.arrival

    @property
    def time_to_first_token(self) -> int:
        return self.first_token - self.arrival


@dataclass
class ServeResult:
    """What a scheduler did: the tokens of every request, its :class:`RequestTiming`,
    and per step the running sequences, the blocks in use, the positions stored, the
    slots a contiguous cache of ``max_len`` per running sequence would reserve and the
    paged cache's wasted slots (measured after the step's appends)."""

    outputs: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    running: list = field(default_factory=list)
    blocks_in_use: list = field(default_factory=list)
    stored: list = field(default_factory=list)
    contiguous_slots: list = field(default_factory=list)
    wasted_slots: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def steps(self) -> int:
        return len(self.running)

    @property
    def tokens(self) -> int:
        return sum(len(t) for t in self.outputs.values())

    def summary(self) -> dict:
        """Throughput (tokens per step and per second), latency (mean, p95 with linear
        interpolation) and time to first token in steps, peak blocks in use. With no
        request (an empty list served) the counts and rates are 0 and the three
        per-request statistics ``nan``: a mean of nothing."""
        lat = torch.tensor(
            [t.latency for t in self.timings.values()], dtype=torch.float
        )
        ttft = [t.time_to_first_token for t in self.timings.values()]
        nan = float("nan")
        return dict(
            steps=self.steps,
            tokens=self.tokens,
            tokens_per_step=self.tokens / max(self.steps, 1),
            tokens_per_second=self.tokens / max(self.seconds, 1e-9),
            mean_latency=float(lat.mean()) if ttft else nan,
            p95_latency=float(torch.quantile(lat, 0.95)) if ttft else nan,
            mean_ttft=sum(ttft) / len(ttft) if ttft else nan,
            peak_blocks=max(self.blocks_in_use, default=0),
        )


def continuous_batching(
    requests: list[Request], engine: PagedModel, *, max_batch: int
) -> ServeResult:
    """Iteration-level scheduling (Orca, Yu et al., 2022) over a paged cache.

    Every step: admit waiting requests, first come first served, while fewer than
    ``max_batch`` run and the pool can hold them (each admitted request reserves the
    ``ceil((prompt_len + output_len - 1) / block_size)`` blocks it will have filled when
    done: the lengths are known in a simulation, where vLLM allocates as it goes and
    preempts when the pool runs dry); prefill each admitted request (its first token);
    run one decode step for every other running request; retire the finished ones,
    whose blocks go back at once. Cost model: one step is one unit of time whatever it
    holds; a prefill shares its step with the decodes (Orca's selective batching),
    which flatters long prompts; ``ServeResult.seconds`` is the measured time."""
    return _serve(requests, engine, max_batch, static=False)


def static_batching(
    requests: list[Request], engine: PagedModel, *, max_batch: int
) -> ServeResult:
    """Request-level batching: wait until ``max_batch`` requests have arrived (or every
    remaining one), prefill them together and decode until the longest is done.
    Finished requests keep their slot, idle, and are returned with the whole batch
    (their ``finish`` is the batch's end); then the next batch starts. Same cost model
    as :func:`continuous_batching`."""
    return _serve(requests, engine, max_batch, static=True)


def _check_serve(fn: str, requests, engine, max_batch) -> None:
    check_sizes(fn, max_batch=max_batch)
    if not isinstance(engine, PagedModel):
        raise TypeError(
            f"{fn}: engine must be a PagedModel, got {type(engine).__name__}"
        )
    if not isinstance(requests, (list, tuple)) or not all(
        isinstance(r, Request) for r in requests
    ):
        raise TypeError(f"{fn}: requests must be a list of Request, got {requests!r}")
    if len({r.id for r in requests}) != len(requests):
        raise ValueError(f"{fn}: requests must have distinct ids")
    if engine.blocks_in_use:
        raise ValueError(f"{fn}: engine must start with an empty cache")
    for r in requests:
        need = engine.blocks_for(r.prompt_len + r.output_len - 1)
        if need > engine.n_blocks:
            raise ValueError(
                f"{fn}: requests: request {r.id} needs {need} blocks, the pool has "
                f"{engine.n_blocks}"
            )


def _serve(requests, engine: PagedModel, max_batch: int, static: bool) -> ServeResult:
    fn = "static_batching" if static else "continuous_batching"
    _check_serve(fn, requests, engine, max_batch)

    def need(r: Request) -> int:  # blocks held once its last token is out
        return engine.blocks_for(r.prompt_len + r.output_len - 1)

    waiting = deque(sorted(requests, key=lambda r: (r.arrival_step, r.id)))
    running: list[Request] = []
    res = ServeResult(timings={r.id: RequestTiming(r.arrival_step) for r in requests})
    start, step, reserved = time.perf_counter(), 0, 0
    while waiting or running:
        admitted = []
        if static and not running and waiting:
            batch = list(waiting)[:max_batch]
            for r in batch if batch[-1].arrival_step <= step else ():
                if reserved + need(r) > engine.n_blocks:
                    break
                reserved += need(r)
                admitted.append(waiting.popleft())
        while (
            not static
            and waiting
            and len(running) + len(admitted) < max_batch
            and waiting[0].arrival_step <= step
            and reserved + need(waiting[0]) <= engine.n_blocks
        ):
            reserved += need(waiting[0])
            admitted.append(waiting.popleft())
        decoding = [r for r in running if len(res.outputs[r.id]) < r.output_len]
        if decoding:
            last = [res.outputs[r.id][-1] for r in decoding]
            for r, token in zip(
                decoding, engine.decode([r.id for r in decoding], last)
            ):
                res.outputs[r.id].append(token)
        for r in admitted:
            res.outputs[r.id] = [engine.prefill(r)]
            res.timings[r.id].first_token = step + 1
        running += admitted
        res.running.append(len(running))
        res.blocks_in_use.append(engine.blocks_in_use)
        res.stored.append(engine.stored_positions)
        res.contiguous_slots.append(len(running) * engine.max_len)
        res.wasted_slots.append(engine.wasted_slots())
        done = [r for r in running if len(res.outputs[r.id]) == r.output_len]
        if static and len(done) < len(running):
            done = []  # a static batch returns all its requests together
        for r in done:
            engine.release(r.id)
            reserved -= need(r)
            res.timings[r.id].finish = step + 1
            running.remove(r)
        step += 1
    res.seconds = time.perf_counter() - start
    return res
