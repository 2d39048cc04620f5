"""The book's masks and biases as FlexAttention modifications.

FlexAttention (Dong et al., 2024, "Flex Attention: A Programming Model for Generating
Optimized Attention Kernels"; ``torch.nn.attention.flex_attention``) writes an attention
variant as two small functions of the indices of one score:

* a ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (True = may attend), from which
  ``create_block_mask`` builds a :class:`~torch.nn.attention.flex_attention.BlockMask`
  that lets the kernel skip the tiles with nothing to attend to;
* a ``score_mod(score, b, h, q_idx, kv_idx) -> score`` applied to the scaled score
  ``q . k * scale`` before the softmax.

Each mask mod below is the predicate of :mod:`attnbook.masks`, where every pattern is
written once (the dense masks of :mod:`attnbook.core` and :mod:`attnbook.sparse` are
derived from the same predicates); each mod of a mask or bias the book defines equals
attnbook's dense result (``tests/unit/test_flex.py`` checks every one, densely and
through ``flex_attention``): the bottom-right causal mask of
:func:`attnbook.core.causal_mask`; the sliding, dilated and global patterns of
Longformer (Beltagy et al., 2020) from :mod:`attnbook.sparse`, and FlashAttention-2's
``window_size=(left, right)``; BigBird's
block masks (Zaheer et al., 2020); ALiBi (Press et al., 2022) and T5's bucketed relative
bias (Raffel et al., 2020) from :mod:`attnbook.positional`; the document mask of packed
sequences (FlashAttention-2's ``cu_seqlens``); and Gemma 2's logit softcapping (Gemma
Team, 2024). Masks combine with FlexAttention's ``and_masks`` / ``or_masks``, score mods
with :func:`chain_score_mods`.

:func:`flex_reference` evaluates the mods densely in plain PyTorch by broadcasting index
tensors ``b (B,1,1,1)``, ``h (1,H,1,1)``, ``q_idx (1,1,L,1)``, ``kv_idx (1,1,1,S)``
through them, so a mod can be checked (and used) without compilation. Every mod here is
elementwise, so the same function also runs under FlexAttention's ``vmap`` (eager and
``create_block_mask``) and under ``torch.compile``. A tensor a mod reads (a block mask,
document ids, a bias table) is captured on the device it was given on: pass it on the
device of ``q``. A query row with nothing to attend to gives zeros, never NaN, in
:func:`flex_reference`, as in ``flex_attention`` itself (eager and compiled). On a CPU,
compiled FlexAttention takes float32, float16 and bfloat16 only; eager
``flex_attention`` (unfused: it materializes the scores) and :func:`flex_reference`
take float64 too.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from .contract import (
    check_block_layout,
    check_flag,
    check_indices,
    check_int,
    check_qkv,
    check_real,
    default_scale,
    grouped_kv,
)
from . import masks
from .core import masked_softmax
from .positional import T5RelativeBias, alibi_slopes, t5_relative_position_bucket

__all__ = [
    "causal_mask_mod",
    "sliding_window_mask_mod",
    "window_size_mask_mod",
    "global_mask_mod",
    "longformer_mask_mod",
    "block_mask_mod",
    "flex_block_mask",
    "document_ids",
    "document_mask",
    "alibi_score_mod",
    "t5_score_mod",
    "softcap_score_mod",
    "chain_score_mods",
    "flex_reference",
]


# --------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------
def _lengths(fn: str, L: int, S: int | None) -> tuple[int, int]:
    L = check_int(fn, "L", L, 0)
    return L, L if S is None else check_int(fn, "S", S, 0)


def _index_tensor(fn: str, name: str, t, dims: int) -> torch.Tensor:
    """An integer tensor with ``dims`` dimensions (lists are converted; an empty list is
    an empty int64 tensor, not torch's default float32 one)."""
    if not isinstance(t, torch.Tensor):
        t = torch.as_tensor(t)
        if t.numel() == 0 and t.is_floating_point():
            t = t.long()
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"{fn}: {name} must be an integer tensor, got {t.dtype}")
    if t.dim() != dims:
        raise ValueError(
            f"{fn}: {name} must have {dims} dimension(s), got shape {tuple(t.shape)}"
        )
    return t


# --------------------------------------------------------------------------------------
# Mask mods
# --------------------------------------------------------------------------------------
def causal_mask_mod(L: int, S: int | None = None) -> Callable:
    """Bottom-right causal mask, ``kv_idx <= q_idx + S - L``, for ``L`` queries and
    ``S`` keys (default ``S = L``): :func:`attnbook.core.causal_mask` as a mask_mod.

    With ``S > L`` (new queries after a cache of ``S - L`` keys) the last query sees
    every key; with ``S < L`` the first ``L - S`` queries see nothing (zeros).
    """
    return masks.causal(*_lengths("causal_mask_mod", L, S))


def _check_sliding_window(window, is_causal, dilation, L, S) -> None:
    """The checks of :func:`sliding_window_mask_mod`."""
    fn = "sliding_window_mask_mod"
    check_int(fn, "window", window, 0)
    check_int(fn, "dilation", dilation, 1)
    check_flag(fn, "is_causal", is_causal)
    if (L is None) != (S is None):
        raise ValueError(f"{fn}: give both L and S or neither, got L={L!r}, S={S!r}")
    if L is not None:
        _lengths(fn, L, S)


def sliding_window_mask_mod(
    window: int,
    *,
    is_causal: bool = False,
    dilation: int = 1,
    L: int | None = None,
    S: int | None = None,
) -> Callable:
    """:func:`attnbook.sparse.sliding_window_mask` as a mask_mod: with ``t = q_idx + S -
    L - kv_idx`` (bottom-right aligned offset; ``t = i - j`` when ``L = S``),
    ``|t| <= window * dilation`` and ``t % dilation == 0``, and ``t >= 0`` if causal.

    ``window`` neighbours on each side spaced ``dilation`` apart (Longformer's dilated
    window when ``dilation > 1``). Give ``L`` and ``S`` (both) for ``L != S``.
    """
    _check_sliding_window(window, is_causal, dilation, L, S)
    return masks.sliding_window(
        window, is_causal=is_causal, dilation=dilation, L=L, S=S
    )


def window_size_mask_mod(
    window_size: tuple[int, int], L: int, S: int | None = None
) -> Callable:
    """FlashAttention-2's ``window_size=(left, right)``: query ``i`` sees keys ``j`` in
    ``[i + S - L - left, i + S - L + right]``; ``-1`` leaves that side unbounded.

    ``(-1, -1)`` is full attention, ``(-1, 0)`` the bottom-right causal mask and ``(w,
    w)`` :func:`sliding_window_mask_mod` with ``window=w``. The predicate
    :func:`attnbook.masks.band`.
    """
    fn = "window_size_mask_mod"
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(
            f"{fn}: window_size must be a pair (left, right), got {window_size!r}"
        )
    for side in window_size:
        check_int(fn, "window_size", side, -1)
    return masks.band(tuple(window_size), *_lengths(fn, L, S))


def global_mask_mod(seq_len: int, global_idx, *, device=None) -> Callable:
    """:func:`attnbook.sparse.global_mask` as a mask_mod: ``is_global[q_idx] |
    is_global[kv_idx]``, the tokens ``global_idx`` attending to and attended by all.

    ``is_global`` is a bool ``(seq_len,)`` tensor on ``device`` read by the mod.
    """
    fn = "global_mask_mod"
    seq_len = check_int(fn, "seq_len", seq_len, 1)
    idx = check_indices(fn, "global_idx", global_idx, size=seq_len)
    return masks.global_tokens(seq_len, idx, device=device)


def _check_longformer(seq_len, window, global_idx, dilation) -> None:
    fn = "longformer_mask_mod"
    seq_len = check_int(fn, "seq_len", seq_len, 1)
    check_int(fn, "window", window, 0)
    check_int(fn, "dilation", dilation, 1)
    check_indices(fn, "global_idx", global_idx, size=seq_len)


def longformer_mask_mod(
    seq_len: int, window: int, global_idx, dilation: int = 1, *, device=None
) -> Callable:
    """:func:`attnbook.sparse.longformer_mask` as a mask_mod: the (dilated) sliding
    window OR the global tokens (:func:`attnbook.masks.longformer`)."""
    _check_longformer(seq_len, window, global_idx, dilation)
    return masks.longformer(seq_len, window, global_idx, dilation, device=device)


def block_mask_mod(block_mask: torch.Tensor, block_size: int) -> Callable:
    """A block mask ``(n_q_blocks, n_k_blocks)`` as a token mask_mod:
    ``block_mask[q_idx // block_size, kv_idx // block_size]``, the mask_mod of
    :func:`attnbook.sparse.expand_block_mask` (BigBird's
    :func:`attnbook.sparse.bigbird_block_mask`, say).

    Indices up to ``n_q_blocks * block_size`` and ``n_k_blocks * block_size`` are
    valid; the tensor is read on its own device.
    """
    fn = "block_mask_mod"
    check_block_layout(fn, block_mask)
    return masks.blocks(block_mask, check_int(fn, "block_size", block_size, 1))


def flex_block_mask(
    block_mask: torch.Tensor,
    block_size: int,
    L: int | None = None,
    S: int | None = None,
    *,
    mask_mod: Callable | None = None,
) -> BlockMask:
    """FlexAttention's :class:`~torch.nn.attention.flex_attention.BlockMask` for a
    block mask ``(ceil(L / b), ceil(S / b))``, with the same block size ``b =
    block_size``: ``create_block_mask(block_mask_mod(...), None, None, L, S,
    BLOCK_SIZE=b)`` on ``block_mask``'s device.

    Its tiles are attnbook's tiles, so FlexAttention skips exactly the blocks
    :func:`attnbook.sparse.block_sparse_attention` skips; active tiles are "full" (no
    per-score mask) except where ``L`` or ``S`` end inside a block. ``L`` and ``S``
    default to the block mask's full extent. ``mask_mod``, if given, is ANDed with the
    block pattern (``causal_mask_mod(L, S)`` for a causal block-sparse pattern).
    """
    fn = "flex_block_mask"
    check_block_layout(fn, block_mask)
    block_size = check_int(fn, "block_size", block_size, 1)
    n_q, n_k = block_mask.shape
    L = n_q * block_size if L is None else check_int(fn, "L", L, 1)
    S = n_k * block_size if S is None else check_int(fn, "S", S, 1)
    if (n_q, n_k) != (-(-L // block_size), -(-S // block_size)):
        raise ValueError(
            f"{fn}: block_mask of shape {tuple(block_mask.shape)} does not cover L={L}"
            f", S={S} in blocks of {block_size}: expected (ceil(L / block_size), "
            f"ceil(S / block_size)) = ({-(-L // block_size)}, {-(-S // block_size)})"
        )
    blocks = block_mask_mod(block_mask, block_size)
    if mask_mod is None:
        mod = blocks
    else:

        def mod(b, h, q_idx, kv_idx):
            return blocks(b, h, q_idx, kv_idx) & mask_mod(b, h, q_idx, kv_idx)

    return create_block_mask(
        mod, None, None, L, S, device=block_mask.device, BLOCK_SIZE=block_size
    )


def document_ids(cu_seqlens) -> torch.Tensor:
    """Per-token document ids ``(total,)`` (int32) of packed sequences given by
    FlashAttention-2's ``cu_seqlens`` (int32 offsets ``[0, n1, n1 + n2, ...]``, shape
    ``(n_docs + 1,)``): token ``t`` is in document ``d`` when ``cu_seqlens[d] <= t <
    cu_seqlens[d + 1]``.

    ``cu_seqlens`` must start at 0 and never decrease; an empty document (two equal
    offsets) is allowed and owns no token.
    """
    fn = "document_ids"
    offsets = _index_tensor(fn, "cu_seqlens", cu_seqlens, 1)
    if offsets.numel() == 0 or int(offsets[0]) != 0:
        raise ValueError(
            f"{fn}: cu_seqlens must start at 0, got {offsets.tolist()} (shape "
            f"{tuple(offsets.shape)})"
        )
    lengths = offsets.diff()
    if (lengths < 0).any():
        raise ValueError(
            f"{fn}: cu_seqlens must be non-decreasing offsets, got {offsets.tolist()}"
            f" (shape {tuple(offsets.shape)})"
        )
    n_docs = lengths.numel()
    docs = torch.arange(n_docs, dtype=torch.int32, device=offsets.device)
    return docs.repeat_interleave(lengths.long())


def document_mask(
    doc_ids: torch.Tensor,
    *,
    is_causal: bool = False,
    kv_doc_ids: torch.Tensor | None = None,
) -> Callable:
    """Document mask of packed sequences: ``doc_ids[q_idx] == kv_doc_ids[kv_idx]``,
    tokens attend only within their own document (FlashAttention-2's varlen attention).

    ``doc_ids`` ``(L,)`` for the packed queries, from :func:`document_ids`;
    ``kv_doc_ids`` ``(S,)`` for the packed keys (default ``doc_ids``: self-attention).
    Both are sorted (documents are contiguous). ``is_causal`` adds causality within each
    document, aligned bottom-right per document as FlashAttention-2 aligns it: a
    document with ``L_d`` queries and ``S_d`` keys lets its query ``i`` see its key
    ``j <= i + S_d - L_d``, i.e. key ``kv_idx`` when its distance from the document's
    end is at least the query's. With one id list this is ``kv_idx <= q_idx``. The
    predicate :func:`attnbook.masks.document`.
    """
    fn = "document_mask"
    is_causal = check_flag(fn, "is_causal", is_causal)
    q_ids = _index_tensor(fn, "doc_ids", doc_ids, 1)
    kv_ids = q_ids if kv_doc_ids is None else kv_doc_ids
    kv_ids = _index_tensor(fn, "kv_doc_ids", kv_ids, 1)
    for name, ids in (("doc_ids", q_ids), ("kv_doc_ids", kv_ids)):
        if ids.numel() > 1 and (ids.diff() < 0).any():
            raise ValueError(
                f"{fn}: {name} must be sorted (each document contiguous), got shape "
                f"{tuple(ids.shape)}: {ids.tolist()[:20]}"
            )
    if q_ids.device != kv_ids.device:
        raise ValueError(
            f"{fn}: doc_ids and kv_doc_ids must be on one device, got {q_ids.device}"
            f" and {kv_ids.device}"
        )
    return masks.document(q_ids, kv_ids, is_causal=is_causal)


# --------------------------------------------------------------------------------------
# Score mods
# --------------------------------------------------------------------------------------
def alibi_score_mod(
    n_heads: int, L: int, S: int | None = None, *, device=None
) -> Callable:
    """ALiBi (Press et al., 2022) as a score_mod: ``score - m_h |q_idx + S - L -
    kv_idx|`` with the slopes ``m_h`` of :func:`attnbook.positional.alibi_slopes`.

    The symmetric bias of :func:`attnbook.positional.alibi_bias` with
    ``is_causal=False``; for the causal form add ``causal_mask_mod(L, S)`` as the mask
    (FlexAttention then skips the tiles above the diagonal). The mod reads the
    ``(n_heads,)`` float32 slopes on ``device``.
    """
    fn = "alibi_score_mod"
    slopes = alibi_slopes(check_int(fn, "n_heads", n_heads, 1)).to(device)
    L, S = _lengths(fn, L, S)
    shift = S - L

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx + shift - kv_idx).abs()

    return alibi


def t5_score_mod(module: T5RelativeBias, L: int, S: int | None = None) -> Callable:
    """T5's bucketed relative bias (Raffel et al., 2020) as a score_mod: ``score +
    weight[bucket(kv_idx - (q_idx + S - L)), h]``.

    ``module`` is a :class:`attnbook.positional.T5RelativeBias`; ``weight`` its
    ``bias.weight`` ``(num_buckets, n_heads)`` (read live, so training updates it), and
    ``bucket`` is :func:`attnbook.positional.t5_relative_position_bucket` with the
    module's settings, applied to the same bottom-right aligned offsets as
    ``module(L, S)``. T5 does not scale its logits: call attention with ``scale=1.0``.
    """
    fn = "t5_score_mod"
    if not isinstance(module, T5RelativeBias):
        raise TypeError(
            f"{fn}: module must be an attnbook.positional.T5RelativeBias, got "
            f"{type(module).__name__}"
        )
    L, S = _lengths(fn, L, S)
    shift = S - L
    weight = module.bias.weight
    settings = (module.bidirectional, module.num_buckets, module.max_distance)

    def t5_bias(score, b, h, q_idx, kv_idx):
        bucket = t5_relative_position_bucket(kv_idx - (q_idx + shift), *settings)
        return score + weight[bucket, h]

    return t5_bias


def softcap_score_mod(softcap: float) -> Callable:
    """Gemma 2's logit softcapping (Gemma Team, 2024) as a score_mod: ``softcap *
    tanh(score / softcap)`` on the scaled score, which keeps every logit in ``(-softcap,
    softcap)`` and is close to the identity for ``|score| << softcap``."""
    fn = "softcap_score_mod"
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"{fn}: softcap must be a positive number, got {softcap!r}")
    if not (softcap > 0 and math.isfinite(softcap)):
        raise ValueError(f"{fn}: softcap must be positive and finite, got {softcap!r}")
    cap = float(softcap)

    def softcap_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    return softcap_mod


def chain_score_mods(*score_mods: Callable | None) -> Callable:
    """One score_mod applying ``score_mods`` in order: ``mod_n(... mod_1(score) ...)``
    (None entries are skipped).

    Order matters where a mod is not additive: Gemma 2 caps the logits last, so a bias
    goes before :func:`softcap_score_mod`.
    """
    mods = [mod for mod in score_mods if mod is not None]
    for mod in mods:
        if not callable(mod):
            raise TypeError(
                f"chain_score_mods: every score_mod must be callable, got {mod!r:.60}"
            )

    def chained(score, b, h, q_idx, kv_idx):
        for mod in mods:
            score = mod(score, b, h, q_idx, kv_idx)
        return score

    return chained


# --------------------------------------------------------------------------------------
# Dense evaluation
# --------------------------------------------------------------------------------------
def flex_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask_mod: Callable | None = None,
    score_mod: Callable | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """``flex_attention(q, k, v, score_mod, block_mask from mask_mod, scale=scale)``
    evaluated densely in plain PyTorch.

    ``q (B, Hq, L, E)``, ``k (B, Hk, S, E)``, ``v (B, Hk, S, Ev)`` (``Hq`` a multiple of
    ``Hk``: grouped-query attention) -> ``(B, Hq, L, Ev)``; other ranks as in
    :mod:`attnbook.contract` (the leading dims are flattened into the batch ``b``).
    With int32 index tensors ``b (B,1,1,1)``, ``h (1,Hq,1,1)``, ``q_idx (1,1,L,1)``,
    ``kv_idx (1,1,1,S)``:

    ``s = score_mod(q k^T * scale, b, h, q_idx, kv_idx)``, ``s[~mask_mod(b, h, q_idx,
    kv_idx)] = -inf``, ``out = softmax(s) v``,

    ``scale`` defaulting to ``1 / sqrt(E)``. As in eager ``flex_attention``, the scores,
    the mods and the softmax run in float32 for float16 and bfloat16 inputs (a mod may
    read float32 buffers: ALiBi's slopes, a T5 table) and the weights are rounded to
    ``q``'s dtype before the product with ``v``. It costs ``O(B H L S)`` memory. A row
    with no allowed key (every entry masked, or ``-inf`` from the score_mod) gives
    zeros.
    """
    from .flash import _as_4d, _from_4d

    fn = "flex_reference"
    check_qkv(fn, q, k, v)
    if scale is not None:
        check_real(fn, "scale", scale)
    rank = max(q.dim(), k.dim())
    if not q.dim() == k.dim() == v.dim() == 4:
        # the contract's other ranks, and mixed ranks (leading dims broadcast): the
        # leading dims are the batch
        q, k, v, batch = _as_4d(q, k, v)
        out = flex_reference(
            q, k, v, mask_mod=mask_mod, score_mod=score_mod, scale=scale
        )
        return _from_4d(out, batch, rank)
    for name, mod in (("mask_mod", mask_mod), ("score_mod", score_mod)):
        if mod is not None and not callable(mod):
            raise TypeError(f"{fn}: {name} must be callable or None, got {mod!r:.60}")
    k, v = grouped_kv(q, k, v)
    # a batch or head count of 1 broadcasts (one query head over several key heads too)
    B, H = max(q.shape[0], k.shape[0]), max(q.shape[1], k.shape[1])
    L, S = q.shape[2], k.shape[2]
    index = torch.int32
    b = torch.arange(B, device=q.device, dtype=index).view(B, 1, 1, 1)
    h = torch.arange(H, device=q.device, dtype=index).view(1, H, 1, 1)
    q_idx = torch.arange(L, device=q.device, dtype=index).view(1, 1, L, 1)
    kv_idx = torch.arange(S, device=q.device, dtype=index).view(1, 1, 1, S)
    # FlexAttention's precision: scores, score_mod and softmax in float32 (float64 for
    # float64 inputs), the weights rounded to q's dtype for the product with v
    work = torch.promote_types(q.dtype, torch.float32)
    scale = default_scale(scale, q.shape[-1])
    scores = (q.to(work) @ k.to(work).transpose(-2, -1)) * scale
    if score_mod is not None:
        scores = score_mod(scores, b, h, q_idx, kv_idx).to(work).expand(B, H, L, S)
    allowed = ~scores.isneginf()
    if mask_mod is not None:
        allowed = allowed & mask_mod(b, h, q_idx, kv_idx)
    return masked_softmax(scores, allowed).to(q.dtype) @ v
