"""The KV cache: what autoregressive decoding keeps so it never recomputes the past.

A decoder generating token ``t`` needs the keys and values of tokens ``0..t``. Those of
tokens ``0..t-1`` do not change when a token is appended (causal attention: the past
never sees the future), so they are computed once and stored. This module implements, in
the order the chapter tells them:

* :func:`decode_arithmetic_intensity`: why decoding is memory-bound, and how much
  grouped-query attention helps;
* :func:`kv_cache_bytes` and :data:`MODEL_CONFIGS`: how large the cache of a real model
  is;
* :class:`KVCache`: preallocated ``(batch, kv_heads, max_len, head_dim)`` buffers per
  layer;
* :class:`StaticKVCache`: the same buffers written in place at a slot tensor and read
  whole, so every decode step has the same shapes (what ``torch.compile`` and CUDA
  graphs capture; the idea of gpt-fast);
* :class:`SlidingWindowKVCache`: a ring buffer keeping the last ``window`` positions
  (the rolling buffer cache of Mistral 7B, Jiang et al., 2023);
* :class:`SegmentMemory`, :class:`RelativeSegmentAttention` and :func:`run_segments`:
  segment-level recurrence, a cache of hidden states carried across training segments
  (Transformer-XL, Dai et al., 2019), with evicted states compressed by
  :func:`compress_memories` instead of discarded (the Compressive Transformer, Rae et
  al., 2020);
* :class:`PagedKVCache`: a pool of fixed-size blocks with one block table per sequence
  (PagedAttention, Kwon et al., 2023);
* :func:`split_kv_attention`: split-KV ("flash-decoding") attention for one query token
  per sequence, in PyTorch, the reference of the Triton kernel
  ``attnbook.kernels.decode._split_kv_attention``;
  :func:`attnbook.attend.decode_attention` (also given here, as
  ``attnbook.kvcache.decode_attention``) picks the kernel on CUDA and this reference
  elsewhere.

Grouped-query attention (Ainslie et al., 2023) and multi-query attention (Shazeer, 2019)
shrink the cache by storing ``n_kv_heads < n_heads`` key/value heads; every cache here
stores ``n_kv_heads``.
"""

from __future__ import annotations

import importlib
import math

import torch
from torch import nn

from .contract import (
    check_cache_update,
    check_decode,
    check_float,
    check_int,
    check_real,
    check_sizes,
    expand_kv_heads,
)
from .primitives import merge_partials
from .layers import HeadShell, split_heads
from .positional import transformer_xl_relative_embeddings, transformer_xl_scores

__all__ = [
    "CacheFullError",
    "decode_arithmetic_intensity",
    "kv_cache_bytes",
    "MODEL_CONFIGS",
    "model_cache_table",
    "KVCache",
    "StaticKVCache",
    "SlidingWindowKVCache",
    "compress_memories",
    "SegmentMemory",
    "RelativeSegmentAttention",
    "run_segments",
    "PagedKVCache",
    "split_kv_attention",
]


def __getattr__(name: str):
    """``attnbook.kvcache.decode_attention``, the entry point that picks the decoding
    backend: it lives in :mod:`attnbook.attend` (which builds on this module, so this
    module does not import it) and is looked up there when first asked for."""
    if name == "decode_attention":
        return importlib.import_module("attnbook.attend").decode_attention
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"decode_attention"})


class CacheFullError(ValueError):
    """Raised when a write would go past a cache's capacity: nothing is ever silently
    dropped."""


# --------------------------------------------------------------------------------------
# Why decoding is memory-bound
# --------------------------------------------------------------------------------------
def _check_intensity(n_heads, n_kv_heads, head_dim, bytes_per_element, batch, seq_len):
    fn = "decode_arithmetic_intensity"
    sizes = dict(n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim)
    sizes |= dict(bytes_per_element=bytes_per_element, batch=batch)
    check_sizes(fn, **sizes, **({} if seq_len is None else {"seq_len": seq_len}))
    if n_heads % n_kv_heads:
        raise ValueError(
            f"{fn}: n_heads={n_heads} must be a multiple of n_kv_heads={n_kv_heads}"
        )


def decode_arithmetic_intensity(
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    bytes_per_element: int = 2,
    batch: int = 1,
    seq_len: int | None = None,
) -> float:
    r"""FLOPs per byte moved by attention over the KV cache in one decode step.

    Each of the ``batch`` sequences brings one query token and its own cache of
    ``seq_len`` positions. A query head does ``2 * seq_len * head_dim`` FLOPs for its
    scores ``q K^T`` and as many for ``p V``. The step reads every cached key and value
    once: with grouped-query attention (Ainslie et al., 2023) the ``h / h_kv`` query
    heads of a group share that read (multi-query attention: ``h_kv = 1``). It also
    reads the queries and writes the outputs, ``h * head_dim`` numbers each:

    .. math::
        I = \frac{4 B h S d}{\mathrm{bytes} \cdot (2 B h_{kv} S d + 2 B h d)}
        \;\longrightarrow\; \frac{2}{\mathrm{bytes}} \cdot \frac{h}{h_{kv}}
        \quad (S \to \infty)

    ``seq_len=None`` returns that limit of a long cache. ``batch`` and ``head_dim``
    cancel: every sequence brings its own cache, so a larger batch raises the FLOPs
    and the bytes together (the weight matrices' intensity, by contrast, grows with the
    batch). The softmax's few FLOPs per score are left out. The factor ``h / h_kv`` is
    only realized by a kernel that loads each key/value tile once for all the query
    heads of its group.
    """
    _check_intensity(n_heads, n_kv_heads, head_dim, bytes_per_element, batch, seq_len)
    if seq_len is None:
        return 2 / bytes_per_element * n_heads / n_kv_heads
    flops = 4 * batch * n_heads * seq_len * head_dim
    numbers = (
        2 * batch * n_kv_heads * seq_len * head_dim + 2 * batch * n_heads * head_dim
    )
    return flops / (numbers * bytes_per_element)


# --------------------------------------------------------------------------------------
# How big is the cache?
# --------------------------------------------------------------------------------------
def kv_cache_bytes(
    n_layers: int,
    n_kv_heads: int,
    head_dim: int,
    seq_len: int,
    batch: int = 1,
    bytes_per_elem: int = 2,
) -> int:
    r"""Bytes of a full KV cache.

    .. math::
        2 \times \text{layers} \times \text{kv\_heads} \times \text{head\_dim}
        \times \text{seq\_len} \times \text{batch} \times \text{bytes}

    The 2 counts keys and values. ``bytes_per_elem=2`` is fp16/bf16.
    """
    for name, value in dict(
        n_layers=n_layers,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        seq_len=seq_len,
        batch=batch,
        bytes_per_elem=bytes_per_elem,
    ).items():
        check_int("kv_cache_bytes", name, value, 0)
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch * bytes_per_elem


#: Published configurations (layers, attention heads, key/value heads, head width,
#: context length, and Mistral's sliding window). Sources: GPT-2 (Radford et al., 2019;
#: the released ``config.json``), Llama 2 (Touvron et al., 2023, Table 1: GQA only in
#: the 34B/70B models), Llama 3 (Grattafiori et al., 2024, Table 3; 8192 is Llama 3's
#: context, 3.1 extends it to 128K), Mistral 7B (Jiang et al., 2023, Table 1).
MODEL_CONFIGS: dict[str, dict[str, int]] = {
    "GPT-2 small": dict(
        n_layers=12, n_heads=12, n_kv_heads=12, head_dim=64, context=1024
    ),
    "Llama-2-7B": dict(
        n_layers=32, n_heads=32, n_kv_heads=32, head_dim=128, context=4096
    ),
    "Llama-2-70B": dict(
        n_layers=80, n_heads=64, n_kv_heads=8, head_dim=128, context=4096
    ),
    "Llama-3-8B": dict(
        n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, context=8192
    ),
    "Mistral-7B": dict(
        n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, context=8192, window=4096
    ),
}


def model_cache_table(
    bytes_per_elem: int = 2, batch: int = 1
) -> list[dict[str, float]]:
    """One row per model of :data:`MODEL_CONFIGS`: cache KiB per token, MiB at the full
    context.

    With a sliding window (Mistral) the cache never holds more than ``window``
    positions, so the ``cached positions`` column is ``min(context, window)``.
    """
    check_sizes("model_cache_table", bytes_per_elem=bytes_per_elem, batch=batch)
    rows = []
    for name, cfg in MODEL_CONFIGS.items():
        positions = min(cfg["context"], cfg.get("window", cfg["context"]))
        per_token = kv_cache_bytes(
            cfg["n_layers"],
            cfg["n_kv_heads"],
            cfg["head_dim"],
            1,
            batch,
            bytes_per_elem,
        )
        rows.append(
            dict(
                model=name,
                **cfg,
                cached_positions=positions,
                kib_per_token=per_token / 1024,
                mib_at_context=per_token * positions / 2**20,
            )
        )
    return rows


# --------------------------------------------------------------------------------------
# Caches
# --------------------------------------------------------------------------------------


def _check_cache(fn: str, dtype, **sizes) -> None:
    """Every size a positive integer and ``dtype`` a floating torch.dtype."""
    check_sizes(fn, **sizes)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{fn}: dtype must be a floating torch.dtype, got {dtype!r}")


def _check_layer(fn: str, layer, n_layers: int) -> None:
    """``layer`` an int in ``[0, n_layers)`` (a negative index is refused)."""
    if check_int(fn, "layer", layer, 0) >= n_layers:
        raise ValueError(f"{fn}: layer must be in [0, {n_layers}), got {layer}")


_ONE_LAYER = object()  # PagedKVCache's pool: no layer index to check


def _check_update(fn, cache, layer, k_new, v_new, names=("k_new", "v_new")) -> None:
    """The contract's rule of a cache update, and floating ``k_new``, ``v_new`` (an
    integer tensor would be cast silently into the buffer)."""
    check_float(fn, names[0], k_new)
    check_float(fn, names[1], v_new)
    if layer is _ONE_LAYER:  # PagedKVCache: one layer, (n_kv_heads, T, head_dim)
        check_cache_update(
            fn, k_new, v_new, cache.shape[1:2], cache.shape[-1], names=names
        )
        return
    leading, n_layers = tuple(cache.shape[1:3]), cache.shape[0]
    check_cache_update(
        fn, k_new, v_new, leading, cache.shape[-1], layer=layer, n_layers=n_layers,
        names=names,
    )  # fmt: skip


class KVCache:
    """A static KV cache: one preallocated ``(batch, n_kv_heads, max_len, head_dim)``
    buffer per layer for keys and one for values (``self.k``, ``self.v`` have shape
    ``(n_layers, batch, n_kv_heads, max_len, head_dim)``).

    ``update(layer, k_new, v_new)`` writes ``T`` new positions ``(batch, n_kv_heads, T,
    head_dim)`` after the ones that layer already holds and returns views of all valid
    positions, ``(..., length + T, head_dim)``. ``length`` is the number of positions
    every layer holds: inside one forward pass, layer ``l`` reads the same ``length``
    before its own update, which is the position offset of the new tokens. Writing past
    ``max_len`` raises :class:`CacheFullError`.

    It answers :class:`attnbook.caches.AttentionCache` with ``kernel = "split_kv"``:
    every row holds the same contiguous prefix, which a one-token step may read with
    the split-KV decoding kernel; ``truncate(length)`` rolls every layer back.
    """

    kernel = "split_kv"
    positions_in_cache = False

    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device=None,
    ):
        sizes = dict(n_layers=n_layers, batch=batch, n_kv_heads=n_kv_heads)
        if type(self) is KVCache:  # a subclass checks its own arguments
            _check_cache("KVCache", dtype, **sizes, head_dim=head_dim, max_len=max_len)
        self.max_len = max_len
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = [0] * n_layers

    @property
    def length(self) -> int:
        return min(self.lengths)

    def update(
        self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _check_update("KVCache.update", self.k, layer, k_new, v_new)
        start, T = self.lengths[layer], k_new.shape[-2]
        if start + T > self.max_len:
            raise CacheFullError(
                f"KVCache.update: layer {layer} holds {start} positions, appending "
                f"{T} would "
                f"exceed max_len={self.max_len}"
            )
        self.k[layer, :, :, start : start + T] = k_new
        self.v[layer, :, :, start : start + T] = v_new
        self.lengths[layer] = start + T
        return self.k[layer, :, :, : start + T], self.v[layer, :, :, : start + T]

    def reset(self) -> None:
        """Forget every position (the buffers stay allocated)."""
        self.lengths = [0] * len(self.lengths)

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions of every layer: positions are appended
        in order, so this only sets ``lengths`` (the stale entries behind are
        overwritten by the next update)."""
        _check_truncate(f"{type(self).__name__}.truncate", self, length)
        self.lengths = [length] * len(self.lengths)


def _check_truncate(fn: str, cache, length) -> None:
    """``length`` an integer in ``[0, cache.length]``."""
    if check_int(fn, "length", length, 0) > cache.length:
        raise ValueError(
            f"{fn}: length must be in [0, cache.length={cache.length}], got {length}"
        )


def _refuse_truncate(cache) -> None:
    """A cache that overwrites old positions has nothing to roll back to."""
    raise TypeError(
        f"{type(cache).__name__}.truncate: a {type(cache).__name__} overwrites or "
        "compresses old positions, so it cannot roll back (caches that append can: "
        "KVCache, StaticKVCache, PagedKVCache, LatentKVCache)"
    )


def _check_seek(cache, start, count, fn="StaticKVCache.seek") -> None:
    check_int(fn, "start", start, 0)
    check_int(fn, "count", count)
    if start + count > cache.max_len:
        raise CacheFullError(
            f"{fn}: slots {start} .. {start + count - 1} go past "
            f"max_len={cache.max_len}"
        )


def _check_static_update(cache, layer, k_new, v_new) -> None:
    fn = "StaticKVCache.update"
    check_float(fn, "k_new", k_new)
    check_float(fn, "v_new", v_new)
    buffer = cache.k[0]
    check_cache_update(
        fn, k_new, v_new, tuple(buffer.shape[:2]), buffer.shape[-1], layer=layer,
        n_layers=len(cache.k), names=("k_new", "v_new"),
    )  # fmt: skip
    if k_new.shape[-2] != cache.slots.numel():
        raise ValueError(
            f"{fn}: k_new and v_new must hold one position per slot of seek(), "
            f"{cache.slots.numel()}, got {k_new.shape[-2]}"
        )


def _check_real_keys(cache, real) -> None:
    shape = (cache.k[0].shape[0], cache.max_len)
    if real is not None and (
        not isinstance(real, torch.Tensor)
        or real.dtype != torch.bool
        or tuple(real.shape) != shape
    ):
        raise ValueError(
            f"StaticKVCache.mask: real must be None or a bool tensor of shape (batch, "
            f"max_len) = {shape} (False at padding), got "
            f"{getattr(real, 'dtype', type(real).__name__)} "
            f"{tuple(getattr(real, 'shape', ()))}"
        )


class StaticKVCache:
    """The decode hot path's cache: per layer, one preallocated ``(batch, n_kv_heads,
    max_len, head_dim)`` tensor for keys and one for values (``self.k[layer]``,
    ``self.v[layer]``), whose every update has the same shapes.

    ``seek(start, count)`` points the next update at slots ``start .. start + count -
    1`` (``self.slots``, an int64 tensor, rewritten in place when ``count`` is
    unchanged); ``update(layer, k_new, v_new)`` copies the ``count`` new positions
    there in place (an ``index_put_``: no allocation, no ``torch.cat``) and returns the
    *whole* buffers ``(batch, n_kv_heads, max_len, head_dim)``. Attention therefore
    always sees ``max_len`` keys, and the caller masks the slots not written yet with
    a boolean mask over the full length (:meth:`mask`). The shapes never change from one
    step to the next: that is what lets ``torch.compile`` trace a decode step once
    and CUDA graphs replay it. ``advance()`` moves the slots past the ones just written.
    ``length`` is the first of the current slots (host side, never read by a step).
    Writing past ``max_len`` raises :class:`CacheFullError` at ``seek`` or ``advance``.

    It answers :class:`attnbook.caches.AttentionCache` with ``kernel = "masked"``:
    attention reads the whole buffer under the caller's mask; ``truncate(length)``
    points the next update back at slot ``length``.
    """

    kernel = "masked"
    positions_in_cache = False

    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device=None,
    ):
        sizes = dict(n_layers=n_layers, batch=batch, n_kv_heads=n_kv_heads)
        _check_cache(
            "StaticKVCache", dtype, **sizes, head_dim=head_dim, max_len=max_len
        )
        self.max_len, self.length = max_len, 0
        shape = (batch, n_kv_heads, max_len, head_dim)
        # one tensor per layer, not views of one: a compiled step then updates each
        # buffer in place instead of copying the whole cache around the write
        self.k = tuple(
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)
        )
        self.v = tuple(
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)
        )
        self.slots = torch.zeros(1, dtype=torch.long, device=self.k[0].device)

    def seek(self, start: int, count: int = 1) -> None:
        """Make slots ``start .. start + count - 1`` the next ones written."""
        _check_seek(self, start, count)
        if self.slots.numel() == count:
            self.slots.copy_(torch.arange(start, start + count))
        else:
            self.slots = torch.arange(start, start + count, device=self.k[0].device)
        self.length = start

    def advance(self) -> None:
        """The next update writes right after the slots just written."""
        count = self.slots.numel()
        _check_seek(self, self.length + count, count, "StaticKVCache.advance")
        self.length += count
        self.slots.add_(count)

    def update(
        self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _check_static_update(self, layer, k_new, v_new)
        self.k[layer].index_copy_(2, self.slots, k_new)  # in place, at the slots
        self.v[layer].index_copy_(2, self.slots, v_new)
        return self.k[layer], self.v[layer]

    def mask(self, real: torch.Tensor | None = None) -> torch.Tensor:
        """Bool ``(batch or 1, 1, count, max_len)``, True where the query in slot
        ``slots[i]`` may attend: keys in earlier slots and its own, and, given ``real``
        (bool ``(batch, max_len)``, False at padding), only real keys. A padding query
        keeps its own slot, so no row is empty."""
        _check_real_keys(self, real)
        keys = torch.arange(self.max_len, device=self.k[0].device)
        earlier = keys <= self.slots[:, None]  # (count, max_len)
        if real is None:
            return earlier[None, None]
        own = keys == self.slots[:, None]
        return (earlier & (real[:, None, :] | own))[:, None]

    def truncate(self, length: int) -> None:
        """Make slots ``length ..`` the next ones written (as many as before): the
        slots behind are overwritten."""
        _check_truncate("StaticKVCache.truncate", self, length)
        self.seek(length, self.slots.numel())


class SlidingWindowKVCache(KVCache):
    """A ring buffer of the last ``window`` positions per layer (Mistral's rolling
    buffer cache).

    Position ``p`` lives in slot ``p mod window``, so memory is ``window`` positions
    however long the sequence. ``update(layer, k_new, v_new)`` returns the keys and
    values the ``T`` new queries may need, oldest first: the ``min(length, window)``
    retained positions followed by the ``T`` new ones (a query at position ``p`` must
    still mask keys before ``p - window + 1`` itself). It then keeps the last ``window``
    of them. ``length`` counts every position ever appended; nothing overflows.

    Its ``kernel`` is ``"causal"`` (the returned keys are the window, not a prefix of
    the text); it cannot roll back (``truncate`` raises ``TypeError``).
    """

    kernel = "causal"

    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        head_dim: int,
        window: int,
        dtype: torch.dtype = torch.float32,
        device=None,
    ):
        sizes = dict(n_layers=n_layers, batch=batch, n_kv_heads=n_kv_heads)
        _check_cache(
            "SlidingWindowKVCache", dtype, **sizes, head_dim=head_dim, window=window
        )
        super().__init__(n_layers, batch, n_kv_heads, head_dim, window, dtype, device)
        self.window = window

    def retained(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The retained keys and values of ``layer`` in position order, ``(...,
        min(length, window), head_dim)``."""
        _check_layer("SlidingWindowKVCache.retained", layer, len(self.lengths))
        n = self.lengths[layer]
        slots = (
            torch.arange(max(0, n - self.window), n, device=self.k.device) % self.window
        )
        return self.k[layer][:, :, slots], self.v[layer][:, :, slots]

    def update(
        self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _check_update("SlidingWindowKVCache.update", self.k, layer, k_new, v_new)
        k_old, v_old = self.retained(layer)
        k_all, v_all = (
            torch.cat((k_old, k_new), dim=-2),
            torch.cat((v_old, v_new), dim=-2),
        )
        n, T = self.lengths[layer], k_new.shape[-2]
        keep = min(T, self.window)  # only the last `window` new positions survive
        slots = torch.arange(n + T - keep, n + T, device=self.k.device) % self.window
        self.k[layer][:, :, slots] = k_new[..., T - keep :, :]
        self.v[layer][:, :, slots] = v_new[..., T - keep :, :]
        self.lengths[layer] = n + T
        return k_all, v_all

    def truncate(self, length: int) -> None:
        """Refused: the ring buffer has overwritten the positions it would need."""
        _refuse_truncate(self)


# --------------------------------------------------------------------------------------
# Segment-level recurrence: Transformer-XL and the Compressive Transformer
# --------------------------------------------------------------------------------------
def _check_compress(fn: str, states, rate) -> None:
    check_float(fn, "states", states)
    if states.dim() < 2:
        raise ValueError(
            f"{fn}: states must have shape (..., n, d), got {tuple(states.shape)}"
        )
    check_int(fn, "rate", rate)


def compress_memories(states: torch.Tensor, rate: int) -> torch.Tensor:
    """Mean-pool ``states`` ``(..., n, d)`` over runs of ``rate`` consecutive positions:
    ``(..., ceil(n / rate), d)``, the last run possibly shorter.

    This is the simplest compression function of the Compressive Transformer (Rae et
    al., 2020), which also tries max-pooling and learned (dilated) convolutions of
    stride ``rate``.
    """
    _check_compress("compress_memories", states, rate)
    n = states.shape[-2]
    slots = -(-n // rate)
    pad = slots * rate - n
    padded = torch.nn.functional.pad(states, (0, 0, 0, pad))
    sums = padded.unflatten(-2, (slots, rate)).sum(-2)
    counts = torch.full(
        (slots, 1), float(rate), dtype=states.dtype, device=states.device
    )
    if pad:
        counts[-1] = rate - pad
    return sums / counts


class SegmentMemory:
    """Hidden states carried from one segment to the next, per layer: Transformer-XL's
    memory (Dai et al., 2019) and the Compressive Transformer's compressed memory (Rae
    et al., 2020).

    ``update(layer, hidden)`` appends the ``(batch, L, d_model)`` states that entered
    ``layer`` in the current segment, *detached* (gradients stop at the segment
    boundary), and keeps the last ``mem_len``. What falls out is discarded when
    ``compressed_len == 0``; otherwise each eviction of ``n`` states is compressed by
    :func:`compress_memories` into ``ceil(n / compression_rate)`` slots, appended to
    the compressed memory, of which the last ``compressed_len`` slots are kept.
    ``context(layer)`` returns ``[compressed, memory]``, oldest first, ``(batch, <=
    compressed_len + mem_len, d_model)`` (``None`` before the first update): the extra
    keys and values the next segment attends to. Memory never grows past ``mem_len +
    compressed_len`` positions per layer, however long the sequence.
    """

    def __init__(
        self,
        n_layers: int,
        mem_len: int,
        compressed_len: int = 0,
        compression_rate: int = 2,
    ):
        fn = "SegmentMemory"
        check_sizes(fn, n_layers=n_layers, compression_rate=compression_rate)
        check_int(fn, "mem_len", mem_len, 0)
        check_int(fn, "compressed_len", compressed_len, 0)
        self.mem_len, self.compressed_len = mem_len, compressed_len
        self.compression_rate = compression_rate
        self.memory: list[torch.Tensor | None] = [None] * n_layers
        self.compressed: list[torch.Tensor | None] = [None] * n_layers

    def context(self, layer: int) -> torch.Tensor | None:
        _check_layer("SegmentMemory.context", layer, len(self.memory))
        parts = [
            t for t in (self.compressed[layer], self.memory[layer]) if t is not None
        ]
        return torch.cat(parts, dim=-2) if parts else None

    def _check_update(self, layer, hidden) -> None:
        fn = "SegmentMemory.update"
        _check_layer(fn, layer, len(self.memory))
        check_float(fn, "hidden", hidden)
        old = self.memory[layer]
        if hidden.dim() != 3 or (
            old is not None
            and (hidden.shape[::2] != old.shape[::2] or hidden.dtype != old.dtype)
        ):
            held = "" if old is None else f" {old.dtype} {tuple(old.shape)} held"
            raise ValueError(
                f"{fn}: hidden must have shape (batch, L, d_model) matching the "
                f"memory{held}, got {hidden.dtype} {tuple(hidden.shape)}"
            )

    def slots(self, layer: int) -> tuple[int, int]:
        """``(memory positions, compressed slots)`` held for ``layer``."""
        return tuple(
            0 if t is None else t.shape[-2]
            for t in (self.memory[layer], self.compressed[layer])
        )

    def update(self, layer: int, hidden: torch.Tensor) -> None:
        self._check_update(layer, hidden)
        hidden = hidden.detach()  # stop-gradient: SG(h) in Dai et al.
        old = self.memory[layer]
        states = hidden if old is None else torch.cat((old, hidden), dim=-2)
        n_evict = max(0, states.shape[-2] - self.mem_len)
        evicted, self.memory[layer] = states[..., :n_evict, :], states[..., n_evict:, :]
        if self.compressed_len and n_evict:
            new = compress_memories(evicted, self.compression_rate)
            old = self.compressed[layer]
            both = new if old is None else torch.cat((old, new), dim=-2)
            self.compressed[layer] = both[..., -self.compressed_len :, :]


class RelativeSegmentAttention(HeadShell, nn.Module):
    r"""One Transformer-XL attention layer (Dai et al., 2019): the ``L`` queries of the
    current segment attend to the memory and the segment, with relative scores.

    With ``m`` the memory ``(B, M, d_model)`` and ``x`` the segment ``(B, L,
    d_model)``, ``c = [SG(m); x]`` (``S = M + L`` positions), ``q = x W_q``, ``k = c
    W_k``, ``v = c W_v`` per head, and ``r = R W_R`` the projected sinusoidal relative
    embeddings (:func:`attnbook.positional.transformer_xl_relative_embeddings`). Query
    ``i`` sits at position ``M + i``; the logits are
    :func:`attnbook.positional.transformer_xl_scores`,

    .. math::
        a_{ij} = (q_i + u) \cdot k_j + (q_i + v) \cdot r_{M + i - j},

    divided by ``sqrt(head_dim)``, causal (future keys get ``-inf``). Returns ``W_o``
    applied to the heads' outputs, ``(B, L, d_model)``. Keys carry no position, so a
    memory state means the same thing in every segment. The projections and heads are
    the shell every attention layer shares (:class:`attnbook.layers.HeadShell`).
    """

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        check_sizes("RelativeSegmentAttention", d_model=d_model, n_heads=n_heads)
        if d_model % n_heads:
            raise ValueError(
                f"RelativeSegmentAttention: d_model={d_model} must be a multiple of "
                f"n_heads={n_heads}"
            )
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.n_kv_heads = n_heads
        self.q_proj, self.k_proj, self.v_proj, self.r_proj = (
            nn.Linear(d_model, d_model, bias=False) for _ in range(4)
        )
        self.out_proj = nn.Linear(d_model, d_model, bias=False)
        self.u = nn.Parameter(0.1 * torch.randn(n_heads, self.head_dim))
        self.v = nn.Parameter(0.1 * torch.randn(n_heads, self.head_dim))

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None):
        self._check_forward(x, memory)
        c = x if memory is None else torch.cat((memory.detach().to(x), x), dim=-2)
        S, D = c.shape[1], x.shape[-1]
        q, k, val = self.project(x, c)  # (B, H, L or S, d)
        r = self.r_proj(transformer_xl_relative_embeddings(S, D).to(x))
        r = split_heads(r[None], self.n_heads)[0]  # (H, S, d): r[:, delta]
        scores = transformer_xl_scores(q, k, r, self.u, self.v)
        out = torch.softmax(scores / math.sqrt(self.head_dim), dim=-1) @ val
        return self.merge(out)  # (B, L, d_model)

    def _check_forward(self, x, memory) -> None:
        fn, D = "RelativeSegmentAttention.forward", self.n_heads * self.head_dim
        for name, t in (("x", x), ("memory", memory)):
            if t is None:
                continue
            check_float(fn, name, t)
            if t.dim() != 3 or t.shape[-1] != D or t.shape[0] != x.shape[0]:
                raise ValueError(
                    f"{fn}: {name} must have shape (batch, length, d_model={D}) with "
                    f"x's batch, got {name} {tuple(t.shape)} (x {tuple(x.shape)})"
                )


def _check_run_segments(layers, x, segment_len, memory) -> None:
    fn = "run_segments"
    check_int(fn, "segment_len", segment_len)
    check_float(fn, "x", x)
    if x.dim() != 3:
        raise ValueError(
            f"{fn}: x must have shape (B, T, d_model), got {tuple(x.shape)}"
        )
    if memory is not None and not isinstance(memory, SegmentMemory):
        raise TypeError(
            f"{fn}: memory must be a SegmentMemory or None, got {type(memory).__name__}"
        )
    if memory is not None and len(memory.memory) != len(layers):
        raise ValueError(
            f"{fn}: memory has {len(memory.memory)} layers, the stack {len(layers)}: "
            "memory needs one per layer"
        )


def run_segments(
    layers,
    x: torch.Tensor,
    segment_len: int,
    memory: SegmentMemory | None = None,
) -> torch.Tensor:
    """Run ``x`` ``(B, T, d_model)`` through a stack of
    :class:`RelativeSegmentAttention` layers one segment of ``segment_len`` positions
    at a time: ``h <- h + layer(h, memory.context(l))``, after which layer ``l``'s
    input ``h`` is stored with ``memory.update(l, h)``. Without ``memory`` every
    segment is processed alone (a vanilla Transformer on fixed-length segments).
    Returns the top layer's states, ``(B, T, d_model)``.
    """
    _check_run_segments(layers, x, segment_len, memory)
    outputs = []
    for start in range(0, x.shape[1], segment_len):
        h = x[:, start : start + segment_len]
        for layer_index, layer in enumerate(layers):
            context = None if memory is None else memory.context(layer_index)
            out = h + layer(h, context)
            if memory is not None:
                memory.update(layer_index, h)
            h = out
        outputs.append(h)
    return torch.cat(outputs, dim=1) if outputs else x.clone()


class PagedKVCache:
    """One layer's KV cache as a pool of ``n_blocks`` blocks of ``block_size`` positions
    (PagedAttention).

    ``k_pool``, ``v_pool``: ``(n_blocks, n_kv_heads, block_size, head_dim)``, shared by
    all sequences. Each sequence has a block table (the list of its blocks, in order):
    position ``p`` of a sequence lives in block ``table[p // block_size]`` at offset ``p
    % block_size``. Blocks are taken from the free list only when the last one is full,
    so a sequence wastes at most ``block_size - 1`` slots, all in its last block,
    instead of the ``max_len - length`` a contiguous reservation wastes.

    It answers :class:`attnbook.caches.AttentionCache` for a batch of sequences:
    ``select(seq_ids)`` names them, in batch order; ``update(0, k_new, v_new)``
    (``(batch, n_kv_heads, T, head_dim)``, one row per selected sequence) appends to
    each and returns their keys and values padded to the longest, ``(batch,
    n_kv_heads, S_max, head_dim)``, row ``b`` valid for its first
    :meth:`seqlens` ``[b]`` positions (``kernel = "split_kv"``: the split-KV decoding
    kernel reads them with those lengths); ``length`` is the shortest selected
    sequence's; ``truncate(length)`` rolls every selected sequence back, returning
    the blocks it no longer needs.
    """

    kernel = "split_kv"
    positions_in_cache = False

    def __init__(
        self,
        n_blocks: int,
        block_size: int,
        n_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device=None,
    ):
        sizes = dict(n_blocks=n_blocks, block_size=block_size, n_kv_heads=n_kv_heads)
        _check_cache("PagedKVCache", dtype, **sizes, head_dim=head_dim)
        self.block_size = block_size
        self.k_pool = torch.zeros(
            n_blocks, n_kv_heads, block_size, head_dim, dtype=dtype, device=device
        )
        self.v_pool = torch.zeros_like(self.k_pool)
        self.free_blocks = list(range(n_blocks))
        self.block_tables: dict[object, list[int]] = {}
        self.lengths: dict[object, int] = {}
        self.selected: list = []

    def allocate(self, seq_id) -> None:
        """Start an empty sequence (no block is taken until the first append)."""
        if seq_id in self.block_tables:
            raise ValueError(
                f"PagedKVCache.allocate: seq_id {seq_id!r} is already allocated"
            )
        self.block_tables[seq_id], self.lengths[seq_id] = [], 0

    def _table(self, seq_id, fn: str) -> list[int]:
        if seq_id not in self.block_tables:
            raise ValueError(
                f"{fn}: seq_id {seq_id!r} is not allocated (allocated: "
                f"{list(self.block_tables)})"
            )
        return self.block_tables[seq_id]

    def append(self, seq_id, k: torch.Tensor, v: torch.Tensor) -> None:
        """Append ``T`` positions ``k, v: (n_kv_heads, T, head_dim)`` to ``seq_id``,
        taking blocks as needed."""
        table = self._table(seq_id, "PagedKVCache.append")
        _check_update("PagedKVCache.append", self.k_pool, _ONE_LAYER, k, v, ("k", "v"))
        n, T = self.lengths[seq_id], k.shape[-2]
        needed = -(-(n + T) // self.block_size) - len(table)
        if needed > len(self.free_blocks):
            raise CacheFullError(
                f"PagedKVCache.append: sequence {seq_id!r} needs {needed} more blocks, "
                f"only {len(self.free_blocks)} are free"
            )
        table.extend(self.free_blocks.pop(0) for _ in range(needed))
        positions = torch.arange(n, n + T)
        blocks = torch.tensor(table, dtype=torch.long)[positions // self.block_size]
        self.k_pool[blocks, :, positions % self.block_size] = k.transpose(0, 1)
        self.v_pool[blocks, :, positions % self.block_size] = v.transpose(0, 1)
        self.lengths[seq_id] = n + T

    def gather(self, seq_id) -> tuple[torch.Tensor, torch.Tensor]:
        """The contiguous ``(n_kv_heads, length, head_dim)`` keys and values of
        ``seq_id``."""
        table, n = self._table(seq_id, "PagedKVCache.gather"), self.lengths[seq_id]
        # (h, blocks * block_size, d) -> valid
        k = self.k_pool[table].transpose(0, 1).flatten(1, 2)[:, :n]
        v = self.v_pool[table].transpose(0, 1).flatten(1, 2)[:, :n]
        return k, v

    def free(self, seq_id) -> None:
        """Return the sequence's blocks to the pool."""
        self.free_blocks.extend(self._table(seq_id, "PagedKVCache.free"))
        del self.block_tables[seq_id], self.lengths[seq_id]

    def wasted_slots(self) -> int:
        """Allocated but unused slots, summed over sequences: ``blocks * block_size -
        length`` each."""
        return sum(
            len(t) * self.block_size - self.lengths[s]
            for s, t in self.block_tables.items()
        )

    def select(self, seq_ids) -> None:
        """The allocated, distinct sequences the next :meth:`update` appends to, in
        batch order."""
        seq_ids = list(seq_ids)
        for seq_id in seq_ids:
            self._table(seq_id, "PagedKVCache.select")
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(
                f"PagedKVCache.select: seq_ids must be distinct, got {seq_ids}"
            )
        self.selected = seq_ids

    @property
    def length(self) -> int:
        """Positions the shortest selected sequence holds (0 when none is)."""
        return min((self.lengths[s] for s in self.selected), default=0)

    def seqlens(self) -> torch.Tensor:
        """``(batch,)`` int64: the positions each selected sequence holds."""
        return torch.tensor([self.lengths[s] for s in self.selected], dtype=torch.long)

    def update(
        self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append row ``b`` of ``k_new``, ``v_new`` ``(batch, n_kv_heads, T,
        head_dim)`` to the ``b``-th selected sequence; return every selected
        sequence's keys and values padded with zeros to the longest, ``(batch,
        n_kv_heads, S_max, head_dim)`` (row ``b`` valid up to :meth:`seqlens`).
        ``layer`` must be 0: a pool holds one layer. When the pool cannot take the
        blocks, :class:`CacheFullError` is raised before anything is written."""
        fn = "PagedKVCache.update"
        _check_layer(fn, layer, 1)
        leading = (len(self.selected), self.k_pool.shape[1])
        check_float(fn, "k_new", k_new)
        check_float(fn, "v_new", v_new)
        check_cache_update(
            fn, k_new, v_new, leading, self.k_pool.shape[-1], names=("k_new", "v_new")
        )
        T = k_new.shape[-2]
        needed = sum(
            -(-(self.lengths[s] + T) // self.block_size) - len(self.block_tables[s])
            for s in self.selected
        )
        if needed > len(self.free_blocks):
            raise CacheFullError(
                f"{fn}: the selected sequences need {needed} more blocks, only "
                f"{len(self.free_blocks)} are free"
            )
        for b, seq_id in enumerate(self.selected):
            self.append(seq_id, k_new[b], v_new[b])
        lengths = self.seqlens()
        S = int(lengths.max()) if len(lengths) else 0
        shape = (len(self.selected), self.k_pool.shape[1], S, self.k_pool.shape[-1])
        k_pad, v_pad = self.k_pool.new_zeros(shape), self.v_pool.new_zeros(shape)
        for b, seq_id in enumerate(self.selected):
            n = self.lengths[seq_id]
            k_pad[b, :, :n], v_pad[b, :, :n] = self.gather(seq_id)
        return k_pad, v_pad

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions of every selected sequence; the blocks
        past them go back to the free list."""
        _check_truncate("PagedKVCache.truncate", self, length)
        for seq_id in self.selected:
            table = self.block_tables[seq_id]
            keep = -(-length // self.block_size)
            self.free_blocks.extend(table[keep:])
            del table[keep:]
            self.lengths[seq_id] = length


# --------------------------------------------------------------------------------------
# Split-KV decoding (flash-decoding)
# --------------------------------------------------------------------------------------
def _check_split_kv(fn, q, k_cache, v_cache, cache_seqlens, num_splits, scale) -> None:
    """The contract's decode checks, ``num_splits`` an int >= 1 (None where the
    caller has a default) and ``scale`` None or a finite number."""
    check_decode(fn, q, k_cache, v_cache, cache_seqlens)
    if num_splits is not None:
        check_int(fn, "num_splits", num_splits)
    if scale is not None:
        check_real(fn, "scale", scale)


def split_kv_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    num_splits: int = 4,
    scale: float | None = None,
) -> torch.Tensor:
    r"""Attention of one query token per sequence over the first ``cache_seqlens[b]``
    cached positions, computed split by split and merged with the log-sum-exp (the
    algorithm of the Triton kernel).

    The ``max_len`` positions are cut into ``num_splits`` chunks of ``ceil(max_len /
    num_splits)``. Each chunk ``s`` computes, for its valid keys, ``m_s = max_j x_j``,
    ``l_s = sum_j exp(x_j - m_s)``, ``o_s = sum_j exp(x_j - m_s) v_j / l_s`` and ``lse_s
    = m_s + log l_s``. The merge is exact:

    .. math::

        o = \sum_s w_s\, o_s, \qquad w_s = \frac{\exp(\mathrm{lse}_s)}{\sum_{s'}
        \exp(\mathrm{lse}_{s'})}

    Args:
        q: ``(batch, heads, 1, head_dim)``.
        k_cache, v_cache: ``(batch, kv_heads, max_len, head_dim)``; ``heads`` a multiple
            of ``kv_heads`` (query head ``h`` reads key/value head ``h // (heads //
            kv_heads)``).
        cache_seqlens: ``(batch,)`` integers, the valid length of each sequence's cache.

    Returns ``(batch, heads, 1, Ev)``; a sequence with length 0 gets zeros. Splits run
    in fp32 and merge with :func:`attnbook.primitives.merge_partials`.
    """
    _check_split_kv(
        "split_kv_attention", q, k_cache, v_cache, cache_seqlens, num_splits, scale
    )
    B, H, _, d = q.shape
    S = k_cache.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    split_len = max(1, math.ceil(S / num_splits))
    pad = split_len * num_splits - S
    # each key/value head serves `group` query heads
    k = expand_kv_heads(torch.nn.functional.pad(k_cache.float(), (0, 0, 0, pad)), H)
    v = expand_kv_heads(torch.nn.functional.pad(v_cache.float(), (0, 0, 0, pad)), H)
    scores = torch.einsum("bhd,bhsd->bhs", q[:, :, 0].float(), k) * scale
    # (B, S + pad)
    valid = (
        torch.arange(S + pad, device=q.device)[None, :]
        < cache_seqlens.to(q.device)[:, None]
    )
    scores = scores.masked_fill(~valid[:, None], float("-inf")).view(
        B, H, num_splits, split_len
    )
    m = scores.amax(-1)  # (B, H, splits); -inf for an empty split
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(scores - m_safe[..., None])
    l = p.sum(-1)
    dv = v.shape[-1]
    o = (
        torch.einsum("bhns,bhnsd->bhnd", p, v.view(B, H, num_splits, split_len, dv))
        / l.clamp_min(1e-30)[..., None]
    )
    lse = m_safe + torch.log(l)  # -inf for an empty split
    # merge the splits with the log-sum-exp rule (an empty split weighs nothing)
    out, total = o[..., 0, :], lse[..., 0]
    for s in range(1, num_splits):
        out, total = merge_partials(out, total, o[..., s, :], lse[..., s])
    return out.unsqueeze(2).to(q.dtype)
