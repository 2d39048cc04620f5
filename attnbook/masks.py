"""Attention masks as predicates: each pattern written once, as a rule on indices.

A mask says which keys a query may see. Here every pattern is one predicate
``mask(b, h, q_idx, kv_idx) -> bool`` (True = may attend) on the batch entry, the head,
the query position and the key position, the ``mask_mod`` of FlexAttention (Dong et
al., 2024; ``torch.nn.attention.flex_attention``). The predicates are written with
tensor operations only, so one function serves three uses:

* the dense ``(..., L, S)`` matrix, by broadcasting index tensors through it
  (:func:`dense`): :func:`attnbook.core.causal_mask` and the masks of
  :mod:`attnbook.sparse` are this;
* FlexAttention's ``mask_mod``, under its ``vmap``: the mods of :mod:`attnbook.flex`
  are these functions;
* the tiles a tiled kernel visits (:func:`active_tiles`): the key ranges of
  :func:`attnbook.flash.key_range` and of the Triton kernels are tested equal to it.

Patterns: the causal mask; Longformer's sliding, dilated and global attention (Beltagy,
Peters & Cohan, 2020) and FlashAttention-2's ``window_size=(left, right)`` band (Dao,
2023); the block layouts of the Sparse Transformer (Child et al., 2019) and BigBird
(Zaheer et al., 2020); key padding; and the document mask of packed sequences.

Conventions: ``L`` queries, ``S`` keys. Every pattern that depends on the distance
between a query and a key is aligned **bottom-right** when ``L != S``: query ``i`` sits
at key position ``i + S - L`` (the last query is level with the last key), the rule of
:mod:`attnbook.contract` and what decoding with a cache needs. A tensor a predicate
reads (global flags, a block layout, document ids) is captured on the device it was
given on: build the predicate on the device of the index tensors.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .contract import check_block_layout, check_flag, check_indices, check_int

__all__ = [
    "causal",
    "sliding_window",
    "band",
    "global_tokens",
    "longformer",
    "blocks",
    "padding",
    "document",
    "dense",
    "active_tiles",
]


def _lengths(fn: str, L, S) -> tuple[int, int]:
    L = check_int(fn, "L", L, 0)
    return L, L if S is None else check_int(fn, "S", S, 0)


# --------------------------------------------------------------------------------------
# Patterns: one predicate each
# --------------------------------------------------------------------------------------
def causal(L: int, S: int | None = None) -> Callable:
    """Bottom-right causal mask: ``kv_idx <= q_idx + S - L`` (``S`` defaults to ``L``).

    With ``S == L`` the lower triangle; with ``S > L`` (new queries after a cache of
    ``S - L`` keys) the last query sees every key; with ``S < L`` the first ``L - S``
    queries see nothing.
    """
    L, S = _lengths("causal", L, S)
    shift = S - L

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + shift

    return causal


def sliding_window(
    window: int,
    *,
    is_causal: bool = False,
    dilation: int = 1,
    L: int | None = None,
    S: int | None = None,
) -> Callable:
    """Longformer's (dilated) sliding window: with the offset ``t = q_idx + S - L -
    kv_idx`` (``t = i - j`` when ``L = S``), ``|t| <= window * dilation`` and ``t %
    dilation == 0``, and ``t >= 0`` if ``is_causal``.

    Each query sees ``window`` neighbours on each side spaced ``dilation`` apart
    (``2 window + 1`` keys with itself), so the receptive field grows to ``window *
    dilation`` at the same cost. Give ``L`` and ``S`` (both, or neither: ``L = S``)
    to align ``L != S`` bottom-right.
    """
    fn = "sliding_window"
    window = check_int(fn, "window", window, 0)
    dilation = check_int(fn, "dilation", dilation, 1)
    is_causal = check_flag(fn, "is_causal", is_causal)
    if (L is None) != (S is None):
        raise ValueError(f"{fn}: give both L and S or neither, got L={L!r}, S={S!r}")
    shift = 0 if L is None else _lengths(fn, L, S)[1] - L
    reach = window * dilation

    def sliding_window(b, h, q_idx, kv_idx):
        offset = q_idx + shift - kv_idx  # i - j, bottom-right aligned
        keep = (offset <= reach) & (offset >= -reach)
        if dilation > 1:
            keep = keep & (offset % dilation == 0)
        if is_causal:
            keep = keep & (offset >= 0)
        return keep

    return sliding_window


def band(window_size: tuple[int, int], L: int, S: int | None = None) -> Callable:
    """FlashAttention-2's ``window_size=(left, right)``: query ``i`` sees the keys
    ``j`` in ``[i + S - L - left, i + S - L + right]``; ``-1`` leaves a side unbounded.

    ``(-1, -1)`` is full attention, ``(-1, 0)`` :func:`causal`, and ``(w, w)``
    :func:`sliding_window` with ``window=w``.
    """
    fn = "band"
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(
            f"{fn}: window_size must be a pair (left, right), got {window_size!r}"
        )
    left, right = (check_int(fn, "window_size", side, -1) for side in window_size)
    L, S = _lengths(fn, L, S)
    shift = S - L

    def band(b, h, q_idx, kv_idx):
        offset = q_idx + shift - kv_idx  # i + S - L - j
        keep = torch.ones_like(offset, dtype=torch.bool)  # (-1, -1): everything
        if left >= 0:
            keep = keep & (offset <= left)
        if right >= 0:
            keep = keep & (offset >= -right)
        return keep

    return band


def _is_global(fn: str, seq_len, global_idx, device) -> torch.Tensor:
    """The bool flags ``(seq_len,)`` of the positions ``global_idx``, on ``device``."""
    seq_len = check_int(fn, "seq_len", seq_len, 1)
    idx = check_indices(fn, "global_idx", global_idx, size=seq_len)
    is_global = torch.zeros(seq_len, dtype=torch.bool)
    is_global[idx.cpu()] = True
    return is_global.to(device)


def global_tokens(seq_len: int, global_idx, *, device=None) -> Callable:
    """Global tokens: ``is_global[q_idx] | is_global[kv_idx]``; the tokens in
    ``global_idx`` attend to all and are attended by all (``L = S = seq_len``).

    ``global_idx`` is a list or 1-D integer tensor of positions in ``[0, seq_len)`` (a
    bool mask is refused: pass ``mask.nonzero().flatten()``); the predicate reads a
    bool ``(seq_len,)`` tensor on ``device``.
    """
    is_global = _is_global("global_tokens", seq_len, global_idx, device)

    def global_tokens(b, h, q_idx, kv_idx):
        return is_global[q_idx] | is_global[kv_idx]

    return global_tokens


def longformer(
    seq_len: int, window: int, global_idx, dilation: int = 1, *, device=None
) -> Callable:
    """Longformer: the (dilated) :func:`sliding_window` OR the :func:`global_tokens`
    ``global_idx``, for ``L = S = seq_len``."""
    fn = "longformer"
    window = check_int(fn, "window", window, 0)
    dilation = check_int(fn, "dilation", dilation, 1)
    local = sliding_window(window, dilation=dilation)
    is_global = _is_global(fn, seq_len, global_idx, device)

    def longformer(b, h, q_idx, kv_idx):
        return local(b, h, q_idx, kv_idx) | is_global[q_idx] | is_global[kv_idx]

    return longformer


def blocks(block_mask: torch.Tensor, block_size: int) -> Callable:
    """A block layout as a token mask: ``block_mask[q_idx // b, kv_idx // b]`` with
    ``b = block_size``.

    ``block_mask`` is bool ``(n_q_blocks, n_k_blocks)``: the fixed and strided patterns
    of the Sparse Transformer or BigBird's window, global and random blocks
    (:func:`attnbook.sparse.bigbird_block_mask`). Positions up to ``n_q_blocks * b``
    and ``n_k_blocks * b`` are valid; the layout is read on its own device.
    """
    fn = "blocks"
    check_block_layout(fn, block_mask)
    size = check_int(fn, "block_size", block_size, 1)

    def blocks(b, h, q_idx, kv_idx):
        return block_mask[q_idx // size, kv_idx // size]

    return blocks


def padding(lengths) -> Callable:
    """Key padding: batch entry ``b`` has ``lengths[b]`` real keys, ``kv_idx <
    lengths[b]``.

    ``lengths`` is a list or 1-D integer tensor ``(B,)``; the predicate reads it as a
    long tensor on its device. The one pattern here that depends on ``b``.
    """
    lengths = check_indices("padding", "lengths", lengths)

    def padding(b, h, q_idx, kv_idx):
        return kv_idx < lengths[b]

    return padding


def _ids(fn: str, name: str, ids) -> torch.Tensor:
    """Sorted 1-D integer document ids (a list becomes an int64 tensor)."""
    if not isinstance(ids, torch.Tensor):
        ids = torch.as_tensor(ids)
        if ids.numel() == 0 and ids.is_floating_point():
            ids = ids.long()
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{fn}: {name} must be an integer tensor, got {ids.dtype}")
    if ids.dim() != 1:
        raise ValueError(
            f"{fn}: {name} must have 1 dimension(s), got shape {tuple(ids.shape)}"
        )
    if ids.numel() > 1 and (ids.diff() < 0).any():
        raise ValueError(
            f"{fn}: {name} must be sorted (each document contiguous), got shape "
            f"{tuple(ids.shape)}: {ids.tolist()[:20]}"
        )
    return ids


def _from_end(ids: torch.Tensor) -> torch.Tensor:
    """Each token's position counted from the end of its document: ``-1`` for the
    last token, ``-2`` for the one before, ..."""
    n = ids.numel()
    pos = torch.arange(n, device=ids.device)
    new = torch.ones(n, dtype=torch.bool, device=ids.device)
    if n:
        new[:-1] = ids[1:] != ids[:-1]  # last token of its document
    ends = torch.where(new, pos + 1, n)  # one past each document's last token
    ends = ends.flip(0).cummin(0).values.flip(0)  # nearest end at or after t
    return pos - ends


def document(
    doc_ids: torch.Tensor,
    kv_doc_ids: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
) -> Callable:
    """Packed sequences: ``doc_ids[q_idx] == kv_doc_ids[kv_idx]``, tokens attend only
    within their own document (FlashAttention-2's varlen attention).

    ``doc_ids (L,)`` and ``kv_doc_ids (S,)`` (default ``doc_ids``) are sorted integer
    ids (documents contiguous), as :func:`attnbook.flex.document_ids` makes them.
    ``is_causal`` adds causality within each document, bottom-right aligned per
    document: a document with ``L_d`` queries and ``S_d`` keys lets its query ``i``
    see its key ``j <= i + S_d - L_d``, i.e. a key whose distance from the document's
    end is at least the query's.
    """
    fn = "document"
    is_causal = check_flag(fn, "is_causal", is_causal)
    q_ids = _ids(fn, "doc_ids", doc_ids)
    kv_ids = q_ids if kv_doc_ids is None else _ids(fn, "kv_doc_ids", kv_doc_ids)
    if q_ids.device != kv_ids.device:
        raise ValueError(
            f"{fn}: doc_ids and kv_doc_ids must be on one device, got {q_ids.device}"
            f" and {kv_ids.device}"
        )
    if not is_causal:

        def same_document(b, h, q_idx, kv_idx):
            return q_ids[q_idx] == kv_ids[kv_idx]

        return same_document
    q_end, kv_end = _from_end(q_ids), _from_end(kv_ids)

    def causal_document(b, h, q_idx, kv_idx):
        same = q_ids[q_idx] == kv_ids[kv_idx]
        return same & (kv_end[kv_idx] <= q_end[q_idx])

    return causal_document


# --------------------------------------------------------------------------------------
# Forms derived from a predicate
# --------------------------------------------------------------------------------------
def dense(
    predicate: Callable, L: int, S: int, *, B: int = 1, H: int = 1, device=None
) -> torch.Tensor:
    """The predicate as a bool matrix ``(B, H, L, S)``: ``mask[b, h, i, j] =
    predicate(b, h, i, j)``.

    The index tensors ``b (B,1,1,1)``, ``h (1,H,1,1)``, ``q_idx (1,1,L,1)`` and
    ``kv_idx (1,1,1,S)`` (int32, FlexAttention's index type) broadcast through the
    predicate in one call: no loop over positions.
    """
    fn = "dense"
    if not callable(predicate):
        raise TypeError(f"{fn}: predicate must be callable, got {predicate!r:.60}")
    L, S = check_int(fn, "L", L, 0), check_int(fn, "S", S, 0)
    B, H = check_int(fn, "B", B, 0), check_int(fn, "H", H, 0)
    index = {"dtype": torch.int32, "device": device}
    b = torch.arange(B, **index).view(B, 1, 1, 1)
    h = torch.arange(H, **index).view(1, H, 1, 1)
    q_idx = torch.arange(L, **index).view(1, 1, L, 1)
    kv_idx = torch.arange(S, **index).view(1, 1, 1, S)
    mask = torch.as_tensor(predicate(b, h, q_idx, kv_idx), device=device)
    return torch.broadcast_to(mask.bool(), (B, H, L, S)).contiguous()


def active_tiles(
    predicate: Callable,
    L: int,
    S: int,
    block_q: int,
    block_k: int | None = None,
    *,
    device=None,
) -> torch.Tensor:
    """The tiles a tiled kernel must visit: bool ``(ceil(L / block_q), ceil(S /
    block_k))``, True where the tile of queries ``i * block_q ..`` and keys ``j *
    block_k ..`` holds an entry the predicate allows (``block_k`` defaults to
    ``block_q``; the last tiles may be ragged).

    The block mask FlexAttention's ``create_block_mask`` builds from a mask_mod, here
    computed densely for ``B = H = 1``: a tile with no True entry is skipped.
    """
    fn = "active_tiles"
    block_q = check_int(fn, "block_q", block_q, 1)
    block_k = block_q if block_k is None else check_int(fn, "block_k", block_k, 1)
    mask = dense(predicate, L, S, device=device)[0, 0]
    n_q, n_k = -(-L // block_q), -(-S // block_k)
    padded = mask.new_zeros(n_q * block_q, n_k * block_k)
    padded[:L, :S] = mask
    return padded.view(n_q, block_q, n_k, block_k).any(dim=3).any(dim=1)
