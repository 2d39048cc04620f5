"""The attention contract: one set of rules for every attention entry point of attnbook.

Every function here that computes attention from queries, keys and values
(:mod:`attnbook.core`, :mod:`attnbook.sparse`, :mod:`attnbook.linear`,
:mod:`attnbook.positional`, :mod:`attnbook.flash`, :mod:`attnbook.kvcache` and the
kernels) takes its arguments as PyTorch's ``scaled_dot_product_attention`` does, and
checks them with the functions below, so a mistake gets the same clear message
everywhere.

**Tensors.** ``q (..., Hq, L, E)``, ``k (..., Hk, S, E)``, ``v (..., Hk, S, Ev)``, of
any rank >= 2 (rank 2 is one head, ``(L, E)``); the value width ``Ev`` may differ from
the key width ``E``. The leading (batch) dimensions broadcast. With rank >= 3 the
third-last dimension counts heads, and ``Hq`` must be a multiple of ``Hk``:
grouped-query attention (``Hk = 1`` is multi-query attention), query head ``h`` reading
key/value head ``h // (Hq // Hk)``; a head count of 1 broadcasts like any batch
dimension. ``q``, ``k`` and ``v`` share one floating dtype and one device.

**Masks.** ``attn_mask`` is bool (True = may attend) or an additive float, broadcastable
to ``(..., Hq, L, S)``. ``key_padding_mask`` is bool ``(B, S)``, True where a key is
padding to ignore (the convention of ``torch.nn.MultiheadAttention``). ``is_causal``
lets query ``i`` see key ``j`` when ``j <= i + S - L``: aligned to the bottom-right
corner, FlashAttention's rule and what decoding with a cache needs (PyTorch's SDPA
aligns to the top-left). A query with no visible key gets zeros, never NaN.

**Flags** are keyword-only and named as in PyTorch: ``is_causal``, ``scale`` (default
``1 / sqrt(E)``), ``dropout_p`` with ``generator=`` for its randomness,
``return_weights``, and ``enable_gqa`` on
:func:`attnbook.core.scaled_dot_product_attention` (elsewhere differing head counts mean
grouped-query attention).

**Errors.** A wrong type or dtype raises ``TypeError``, a wrong shape or value
``ValueError``; the message names the function, the argument and the shapes.
"""

from __future__ import annotations

import math
import numbers

import torch

__all__ = [
    "check_int",
    "check_sizes",
    "check_real",
    "check_flag",
    "check_attention_options",
    "check_float",
    "check_indices",
    "check_qkv",
    "check_attn_mask",
    "check_block_mask",
    "check_block_layout",
    "check_key_padding_mask",
    "check_dropout",
    "check_decode",
    "check_cache_update",
    "attention_mask",
    "expand_kv_heads",
    "grouped_kv",
    "default_scale",
]


def _shape(t) -> str:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


# --------------------------------------------------------------------------------------
# Numbers and flags: one rule each, for every module
# --------------------------------------------------------------------------------------
def check_int(fn: str, name: str, value, minimum: int = 1) -> int:
    """``value`` as an int ``>= minimum``: ``TypeError`` for a non-integer (a float,
    a bool), ``ValueError`` below ``minimum``, both naming ``fn`` and ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{fn}: {name} must be an integer >= {minimum}, got {value!r} "
            f"({type(value).__name__})"
        )
    if value < minimum:
        raise ValueError(f"{fn}: {name} must be an integer >= {minimum}, got {value}")
    return int(value)


def check_sizes(fn: str, **values) -> None:
    """``ValueError`` naming ``fn`` and the argument unless every value is a positive
    integer (a bool is not one): ``check_sizes("GNN", hidden=h, heads=n)``."""
    for name, value in values.items():
        if type(value) is int and value >= 1:  # the common case, without ABC checks
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, numbers.Integral)
            or value < 1
        ):
            raise ValueError(f"{fn}: {name} must be a positive integer, got {value!r}")


def check_real(
    fn: str,
    name: str,
    value,
    *,
    above: float | None = None,
    minimum: float | None = None,
) -> float:
    """``value`` as a finite float, ``> above`` and ``>= minimum`` when given:
    ``TypeError`` for a non-number (a bool included), ``ValueError`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{fn}: {name} must be a real number, got {value!r} "
            f"({type(value).__name__})"
        )
    bound = ""
    if above is not None:
        bound += f" > {above:g}"
    if minimum is not None:
        bound += f" >= {minimum}"
    too_small = (above is not None and not value > above) or (
        minimum is not None and value < minimum
    )
    if not math.isfinite(value) or too_small:
        raise ValueError(f"{fn}: {name} must be a finite number{bound}, got {value!r}")
    return float(value)


def check_flag(fn: str, name: str, value) -> bool:
    """``value`` as a bool: True, False (or the ints 1, 0); anything else, a mask
    tensor or the string ``"False"`` included, is a ``TypeError``."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{fn}: {name} must be a bool, got {value!r}")


def check_float(fn: str, name: str, t: torch.Tensor) -> None:
    """Check that ``t`` is a floating-point tensor (``TypeError`` naming ``name``)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {_shape(t)}")
    if not t.is_floating_point():
        raise TypeError(f"{fn}: {name} must be a floating-point tensor, got {t.dtype}")


def check_indices(
    fn: str, name: str, value, *, size: int | None = None, minimum: int = 0
) -> torch.Tensor:
    """``value``, a sequence of ints or a 1-D integer tensor, as a 1-D long tensor
    with every entry in ``[minimum, size)`` (no upper bound when ``size`` is None).

    ``TypeError`` for floats and bools (a bool tensor is a mask, not positions: pass
    ``mask.nonzero().flatten()``), ``ValueError`` for another rank or an entry out of
    range; both name ``fn`` and ``name``."""
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
            hint = " (a mask: pass mask.nonzero().flatten())" * (
                value.dtype == torch.bool
            )
            raise TypeError(
                f"{fn}: {name} must hold integer positions, got a {value.dtype} "
                f"tensor{hint}"
            )
        idx = value
    else:
        try:
            items = list(value)
        except TypeError:
            raise TypeError(
                f"{fn}: {name} must be a sequence of integers or a 1-D integer tensor, "
                f"got {value!r} ({type(value).__name__})"
            ) from None
        if any(isinstance(x, (list, tuple, torch.Tensor)) for x in items):
            raise ValueError(f"{fn}: {name} must be 1-D, got {items!r:.80}")
        wrong = [
            x
            for x in items
            if isinstance(x, bool) or not isinstance(x, numbers.Integral)
        ]
        if wrong:
            raise TypeError(
                f"{fn}: {name} must hold integers, got {wrong[0]!r} "
                f"({type(wrong[0]).__name__}) in {items!r:.80}"
            )
        idx = torch.tensor([int(x) for x in items], dtype=torch.long)
    if idx.dim() != 1:
        raise ValueError(f"{fn}: {name} must be 1-D, got shape {_shape(idx)}")
    idx = idx.long()
    if idx.numel():
        low, high = int(idx.min()), int(idx.max())
        if low < minimum or (size is not None and high >= size):
            bound = (
                f"lie in [{minimum}, {size})"
                if size is not None
                else f"be >= {minimum}"
            )
            raise ValueError(f"{fn}: {name} must {bound}, got {idx.tolist()!r:.80}")
    return idx


def check_qkv(
    fn: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, gqa: bool = True
) -> None:
    """Check ``q``, ``k``, ``v`` against the contract for the function named ``fn``.

    ``gqa=False`` refuses differing head counts (as PyTorch does without
    ``enable_gqa=True``).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(fn, name, t)
        if t.dim() < 2:
            raise ValueError(
                f"{fn}: {name} must have at least 2 dimensions (..., seq, dim), got "
                f"shape {_shape(t)}"
            )
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(
            f"{fn}: q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if not q.device == k.device == v.device:
        raise ValueError(
            f"{fn}: q, k and v must be on one device, got {q.device}, {k.device}, "
            f"{v.device}"
        )
    def shapes() -> str:  # for the messages only: formatting costs a call's time
        return f"q {_shape(q)}, k {_shape(k)}, v {_shape(v)}"

    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"{fn}: q and k must have the same last dimension (head_dim): {shapes()}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"{fn}: k and v must have the same sequence length (dim -2): {shapes()}"
        )
    if k.shape[:-2] != v.shape[:-2]:
        raise ValueError(
            f"{fn}: k and v must have the same batch and heads: {shapes()}"
        )
    grouped = (
        q.dim() >= 3
        and k.dim() >= 3
        and q.shape[-3] != k.shape[-3]
        and min(q.shape[-3], k.shape[-3]) > 1
    )
    if grouped:  # differing head counts, neither 1 (1 broadcasts)
        hq, hk = q.shape[-3], k.shape[-3]
        if hq % hk:
            raise ValueError(
                f"{fn}: q's {hq} heads are not a multiple of k's {hk} (grouped-query "
                f"attention shares each key/value head among a group): {shapes()}"
            )
        if not gqa:
            raise ValueError(
                f"{fn}: q has {hq} heads and k {hk}; pass enable_gqa=True for "
                f"grouped-query attention: {shapes()}"
            )
    batch_q, batch_k = (
        (q.shape[:-3], k.shape[:-3]) if grouped else (q.shape[:-2], k.shape[:-2])
    )
    if batch_q == batch_k:
        return
    try:
        torch.broadcast_shapes(batch_q, batch_k)
    except RuntimeError:
        raise ValueError(
            f"{fn}: the batch dimensions do not broadcast: {shapes()}"
        ) from None


def check_attn_mask(fn: str, attn_mask: torch.Tensor, scores: tuple[int, ...]) -> None:
    """Check that ``attn_mask`` is bool or float and broadcasts to ``scores``
    ``(..., L, S)``."""
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(
            f"{fn}: attn_mask must be a torch.Tensor, got {_shape(attn_mask)}"
        )
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(
            f"{fn}: attn_mask must be bool (True = may attend) or float (additive), "
            f"got {attn_mask.dtype}"
        )
    try:
        ok = torch.broadcast_shapes(attn_mask.shape, scores) == torch.Size(scores)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"{fn}: attn_mask of shape {_shape(attn_mask)} does not broadcast to the "
            f"scores' shape {tuple(scores)} (..., L, S)"
        )


def check_block_mask(
    fn: str, block_mask, L: int, S: int, block_size: int
) -> tuple[int, int]:
    """Check that ``block_mask`` is a bool ``(ceil(L / block_size), ceil(S /
    block_size))`` tensor (True = the query block attends to the key block), with
    ``block_size`` an integer >= 1; returns that shape."""
    check_int(fn, "block_size", block_size)
    shape = (-(-L // block_size), -(-S // block_size))
    if (
        not isinstance(block_mask, torch.Tensor)
        or block_mask.dtype != torch.bool
        or tuple(block_mask.shape) != shape
    ):
        got = (
            f"{block_mask.dtype} {tuple(block_mask.shape)}"
            if isinstance(block_mask, torch.Tensor)
            else type(block_mask).__name__
        )
        raise ValueError(
            f"{fn}: block_mask must be a bool tensor of shape (ceil(L / block_size), "
            f"ceil(S / block_size)) = {shape} for L={L}, S={S}, "
            f"block_size={block_size}, got {got}"
        )
    return shape


def check_block_layout(fn: str, block_mask) -> tuple[int, int]:
    """Check that ``block_mask`` is a 2-D bool ``(n_q_blocks, n_k_blocks)`` tensor of
    any size (True = the query block attends to the key block); returns its shape.
    :func:`check_block_mask` also checks the shape against the lengths."""
    if not isinstance(block_mask, torch.Tensor) or block_mask.dtype != torch.bool:
        got = block_mask.dtype if isinstance(block_mask, torch.Tensor) else block_mask
        raise TypeError(
            f"{fn}: block_mask must be a bool tensor (n_q_blocks, n_k_blocks), got "
            f"{got!r:.60}"
        )
    if block_mask.dim() != 2:
        raise ValueError(
            f"{fn}: block_mask must be 2-D (n_q_blocks, n_k_blocks), got shape "
            f"{tuple(block_mask.shape)}"
        )
    return tuple(block_mask.shape)


def check_key_padding_mask(
    fn: str, key_padding_mask: torch.Tensor, batch: int, S: int
) -> None:
    """Check that ``key_padding_mask`` is a bool ``(batch, S)`` tensor."""
    if not isinstance(key_padding_mask, torch.Tensor):
        raise TypeError(
            f"{fn}: key_padding_mask must be a torch.Tensor, got "
            f"{_shape(key_padding_mask)}"
        )
    if key_padding_mask.dtype != torch.bool:
        raise TypeError(
            f"{fn}: key_padding_mask must be bool (True = padding), got "
            f"{key_padding_mask.dtype}"
        )
    if tuple(key_padding_mask.shape) != (batch, S):
        raise ValueError(
            f"{fn}: key_padding_mask must have shape (batch, S) = ({batch}, {S}), got "
            f"{_shape(key_padding_mask)}"
        )


def check_dropout(fn: str, dropout_p: float) -> None:
    """Check ``0 <= dropout_p < 1``."""
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{fn}: dropout_p must be in [0, 1), got {dropout_p}")


def attention_mask(
    fn: str,
    q: torch.Tensor,
    k: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> torch.Tensor | None:
    """One mask from the three ways of giving one: ``attn_mask`` (bool or additive),
    ``key_padding_mask`` ``(B, S)`` (True = ignore) and ``is_causal`` (bottom-right).

    Returns None when there is nothing to mask, a bool mask (True = may attend) when
    every part is bool, else an additive float mask in ``q``'s dtype; it broadcasts to
    the scores ``(..., L, S)``.
    """
    L, S = q.shape[-2], k.shape[-2]
    scores = (*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), L, S)
    parts = []
    if attn_mask is not None:
        check_attn_mask(fn, attn_mask, scores)
        parts.append(
            attn_mask if attn_mask.dtype == torch.bool else attn_mask.to(q.dtype)
        )
    if key_padding_mask is not None:
        check_key_padding_mask(
            fn, key_padding_mask, q.shape[0] if q.dim() >= 3 else 1, S
        )
        keep = ~key_padding_mask
        parts.append(keep.view(keep.shape[0], *[1] * (len(scores) - 2), S))
    if is_causal:
        i = torch.arange(L, device=q.device)[:, None]
        j = torch.arange(S, device=q.device)[None, :]
        parts.append(j <= i + (S - L))
    if not parts:
        return None
    mask = parts[0]
    for part in parts[1:]:
        if mask.dtype == torch.bool and part.dtype == torch.bool:
            mask = mask & part
        elif part.dtype == torch.bool:
            mask = mask.masked_fill(~part, float("-inf"))
        elif mask.dtype == torch.bool:
            mask = part.masked_fill(~mask, float("-inf"))
        else:
            mask = mask + part
    return mask


def expand_kv_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Grouped-query attention: repeat each of the ``Hk`` key/value heads of ``x``
    ``(..., Hk, S, E)`` for its ``n_heads // Hk`` query heads, giving
    ``(..., n_heads, S, E)``. The readable form; kernels index the shared head instead.
    ``n_heads`` is an integer >= 0, and ``x`` needs at least one head to repeat unless
    ``n_heads`` is its own head count.
    """
    if not isinstance(n_heads, torch.SymInt):  # a traced size under torch.compile
        check_int("expand_kv_heads", "n_heads", n_heads, minimum=0)
    if x.dim() < 3 or x.shape[-3] == n_heads:
        return x
    if x.shape[-3] == 0:
        raise ValueError(
            f"expand_kv_heads: x has no key/value heads (dim -3) to repeat for "
            f"n_heads={n_heads}, got x {_shape(x)}"
        )
    if n_heads % x.shape[-3]:
        raise ValueError(
            f"expand_kv_heads: n_heads={n_heads} must be a multiple of x's "
            f"{x.shape[-3]} key/value heads (dim -3), got x {_shape(x)}"
        )
    return x.repeat_interleave(n_heads // x.shape[-3], dim=-3)


def default_scale(scale: float | None, head_dim: int) -> float:
    """``scale``, or ``1 / sqrt(head_dim)`` when it is None (a NaN, infinite or bool
    ``scale`` is a ``ValueError``, and so is the default for a ``head_dim`` below 1,
    where it is undefined)."""
    if isinstance(scale, bool) or (
        isinstance(scale, numbers.Real) and not math.isfinite(scale)
    ):
        raise ValueError(f"default_scale: scale must be a finite number, got {scale!r}")
    if scale is None and head_dim < 1:
        raise ValueError(
            f"default_scale: head_dim is {head_dim}, so the default scale "
            "1/sqrt(head_dim) is undefined: pass scale="
        )
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def grouped_kv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` and ``v`` with their heads repeated to match ``q``'s when the head counts
    differ and neither is 1 (grouped-query attention); otherwise unchanged (equal head
    counts, or a head count of 1 that broadcasts)."""
    if q.dim() < 3 or k.dim() < 3 or min(q.shape[-3], k.shape[-3]) == 1:
        return k, v
    return expand_kv_heads(k, q.shape[-3]), expand_kv_heads(v, q.shape[-3])


def check_attention_options(
    fn: str,
    q: torch.Tensor,
    window_size,
    alibi_slopes: torch.Tensor | None,
    softcap: float,
) -> tuple[tuple[int, int], torch.Tensor | None, float]:
    """Check FlashAttention-2's fused options of ``fn`` for queries ``q (B, H, L, E)``:
    ``window_size = (left, right)``, each ``-1`` (unbounded) or ``>= 0``;
    ``alibi_slopes`` ``(H,)`` or ``(B, H)``; ``softcap >= 0`` (0: off). Returns the
    window as a tuple, the slopes as ``(B, H)`` float32 on ``q``'s device (or
    ``None``) and the cap as a float."""
    if (
        not isinstance(window_size, (tuple, list))
        or len(window_size) != 2
        or not all(isinstance(w, int) and w >= -1 for w in window_size)
    ):
        raise ValueError(
            f"{fn}: window_size must be two integers (left, right), each -1 "
            f"(unbounded) or >= 0, got {window_size!r}"
        )
    if not isinstance(softcap, (int, float)) or softcap < 0 or math.isnan(softcap):
        raise ValueError(
            f"{fn}: softcap must be a number >= 0 (0: off), got {softcap!r}"
        )
    B, H = q.shape[0], q.shape[1]
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor) or tuple(
            alibi_slopes.shape
        ) not in ((H,), (B, H)):
            shape = getattr(alibi_slopes, "shape", type(alibi_slopes).__name__)
            raise ValueError(
                f"{fn}: alibi_slopes must be a tensor of shape ({H},) or ({B}, {H}) "
                f"for q {tuple(q.shape)}, got {tuple(shape)}"
            )
        alibi_slopes = alibi_slopes.to(q.device, torch.float32).expand(B, H)
    return tuple(window_size), alibi_slopes, float(softcap)


def check_decode(
    fn: str,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
) -> None:
    """Check one decoding step: ``q (batch, heads, 1, head_dim)`` against caches
    ``k_cache (batch, kv_heads, max_len, head_dim)`` and ``v_cache (batch, kv_heads,
    max_len, Ev)`` (``heads`` a multiple of ``kv_heads``) holding ``cache_seqlens[b]``
    valid positions each."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_float(fn, name, t)
    if not q.dtype == k_cache.dtype == v_cache.dtype:
        raise TypeError(
            f"{fn}: q, k_cache and v_cache must share a dtype, got {q.dtype}, "
            f"{k_cache.dtype}, {v_cache.dtype}"
        )
    if q.dim() != 4 or q.shape[2] != 1:
        raise ValueError(
            f"{fn}: q must have shape (batch, heads, 1, head_dim), got {_shape(q)}"
        )
    if k_cache.dim() == 4 and k_cache.shape[-1] != q.shape[-1]:
        raise ValueError(
            f"{fn}: q and k_cache must have the same last dimension (head_dim), got q "
            f"{_shape(q)} and k_cache {_shape(k_cache)}"
        )
    if k_cache.dim() == 4 and k_cache.shape[1] == 0:  # no head to share (nor divide by)
        raise ValueError(
            f"{fn}: k_cache must have at least one key/value head (dim 1, kv_heads), "
            f"got q {_shape(q)}, k_cache {_shape(k_cache)}, v_cache {_shape(v_cache)}"
        )
    if (
        k_cache.dim() != 4
        or v_cache.dim() != 4
        or k_cache.shape[:-1] != v_cache.shape[:-1]
        or k_cache.shape[0] != q.shape[0]
        or q.shape[1] % k_cache.shape[1]
    ):
        raise ValueError(
            f"{fn}: k_cache and v_cache must have shape (batch, kv_heads, max_len, "
            f"width) with heads a multiple of kv_heads; got q {_shape(q)}, k_cache "
            f"{_shape(k_cache)}, v_cache {_shape(v_cache)}"
        )
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.is_floating_point():
        raise TypeError(
            f"{fn}: cache_seqlens must be an integer tensor, got "
            f"{_shape(cache_seqlens)}"
        )
    if cache_seqlens.shape != (q.shape[0],):
        raise ValueError(
            f"{fn}: cache_seqlens must have shape ({q.shape[0]},), got "
            f"{_shape(cache_seqlens)}"
        )
    if len(cache_seqlens) and (
        int(cache_seqlens.max()) > k_cache.shape[2] or int(cache_seqlens.min()) < 0
    ):
        raise ValueError(
            f"{fn}: cache_seqlens must lie in [0, max_len={k_cache.shape[2]}], got "
            f"{cache_seqlens.tolist()}"
        )


def check_cache_update(
    fn: str,
    k: torch.Tensor,
    v: torch.Tensor,
    leading: tuple[int, ...],
    head_dim: int,
    *,
    layer: int | None = None,
    n_layers: int | None = None,
    names: tuple[str, str] = ("k", "v"),
) -> None:
    """The rule of every KV cache's ``update`` (or ``append``): ``k`` and ``v`` both of
    shape ``leading + (T, head_dim)`` with ``T >= 1``, and, for a cache of ``n_layers``
    layers, ``layer`` an int in ``[0, n_layers)`` (``ValueError`` naming the argument
    and the shapes; ``names`` are the caller's names for ``k`` and ``v``)."""
    if n_layers is not None and (
        isinstance(layer, bool)
        or not isinstance(layer, int)
        or not 0 <= layer < n_layers
    ):
        raise ValueError(f"{fn}: layer must be in [0, {n_layers}), got {layer!r}")
    if (
        not isinstance(k, torch.Tensor)
        or not isinstance(v, torch.Tensor)
        or k.shape != v.shape
        or k.dim() != len(leading) + 2
        or tuple(k.shape[:-2]) != tuple(leading)
        or k.shape[-1] != head_dim
        or k.shape[-2] < 1
    ):
        raise ValueError(
            f"{fn}: {names[0]} and {names[1]} must have shape "
            f"{tuple(leading) + ('T', head_dim)} with "
            f"T >= 1, got {_shape(k)} and {_shape(v)}"
        )
