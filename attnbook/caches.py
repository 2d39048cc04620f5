"""One cache protocol: what every cache of the book answers, so that an attention layer
asks the cache how to read it instead of testing which cache it is.

A decoder's attention layer meets many caches: the KV cache that appends
(:class:`attnbook.kvcache.KVCache`), the static one written in place for compiled
decoding (:class:`attnbook.kvcache.StaticKVCache`), a ring buffer
(:class:`attnbook.kvcache.SlidingWindowKVCache`, Jiang et al., 2023), the paged pool
(:class:`attnbook.kvcache.PagedKVCache`, Kwon et al., 2023), the latent cache of
multi-head latent attention (:class:`attnbook.serving.LatentKVCache`, DeepSeek-AI,
2024), attention sinks (:class:`attnbook.serving.SinkKVCache`, Xiao et al., 2023) and
a quantized cache (:class:`attnbook.serving.QuantizedKVCache`, Liu et al., 2024). They
store different things in different places, but a layer needs only four answers from
any of them, the members of :class:`AttentionCache`:

* ``length``: how many positions every layer holds before this step, which is the
  position of the first new query (the offset RoPE rotates it by);
* ``update(layer, k_new, v_new)``: store the step's new keys and values (or, for the
  latent cache, latents and rotary keys) and return what attention reads;
* ``kernel``: how attention reads what ``update`` returned, one of :data:`KERNELS`;
* ``positions_in_cache``: whether keys are stored unrotated and rotated by their index
  in the returned tensor (StreamingLLM's rule) instead of by their position in the
  text.

and a fifth that the rollback of speculative decoding needs: ``truncate(length)``
keeps the first ``length`` positions, or raises ``TypeError`` for a cache that
overwrites old positions and so cannot roll back.

The protocol is ``runtime_checkable``: ``isinstance(cache, AttentionCache)`` says
whether an object answers all five (it checks that the members exist, not what they
return; ``tests/unit/test_caches.py`` checks that on a decode against recomputing from
scratch).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

__all__ = ["KERNELS", "AttentionCache"]

#: How attention reads what a cache's ``update`` returned (the cache's ``kernel``):
#:
#: * ``"split_kv"``: every row holds the same contiguous prefix of positions, the new
#:   ones last; the new queries see it under a causal mask aligned bottom-right, and
#:   one new token may be read by the split-KV decoding kernel
#:   (:func:`attnbook.attend.decode_attention`) with that length;
#: * ``"causal"``: the returned keys end with the new ones, under a causal mask aligned
#:   bottom-right, but they are not one contiguous prefix of the text (a window, sinks
#:   and a window) or not stored as they are read (quantized): the general kernel;
#: * ``"masked"``: the whole buffer, every slot; the caller's mask (``bias``) says
#:   which slots each query sees, and its width how many slots are read: PyTorch's
#:   fused kernel under that mask, the same shapes at every step;
#: * ``"absorbed"``: latents, not keys and values: multi-head latent attention reads
#:   them with its up-projections absorbed
#:   (:class:`attnbook.serving.MultiHeadLatentAttention`).
KERNELS = ("split_kv", "causal", "masked", "absorbed")


@runtime_checkable
class AttentionCache(Protocol):
    """What every cache answers. Shapes are those of keys and values, ``(batch,
    n_kv_heads, T, head_dim)`` for the ``T`` new positions of one step (the latent
    cache takes ``(batch, T, kv_latent_dim)`` and ``(batch, T, rope_dim)``)."""

    #: How attention reads what :meth:`update` returns: one of :data:`KERNELS`.
    kernel: str
    #: Whether keys are stored unrotated and rotated by their index in what
    #: :meth:`update` returns (attention sinks), or rotated by the layer at their
    #: position before :meth:`update` and cached rotated (every other cache).
    positions_in_cache: bool

    @property
    def length(self) -> int:
        """How many positions every layer holds, which is the position of the next
        step's first query (for a paged pool, that of the shortest sequence
        selected)."""
        ...

    def update(
        self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``T`` new positions of ``layer`` and return the keys and values
        attention reads, ``(batch, n_kv_heads, S, head_dim)`` each, read as
        ``kernel`` says."""
        ...

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions of every layer (``0 <= length <=
        self.length``); a cache that overwrites old positions raises ``TypeError``."""
        ...
