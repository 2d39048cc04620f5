"""Sparse attention: each query attends to a small, structured set of keys.

Papers: Child et al. (2019) for strided / fixed sparse patterns; Beltagy, Peters & Cohan
(2020) for Longformer's sliding, dilated and global attention; Ainslie et al. (2020) for
ETC's global-local attention and its relative-position labels (clipped as in Shaw et
al. (2018), turned into one learned scalar per label and head as in Raffel et al.
(2020)); Zaheer et al. (2020) for BigBird's window + global + random blocks; Kitaev,
Kaiser & Levskaya (2020) for Reformer's locality-sensitive hashing.

A sparse pattern is a boolean mask ``(L, S)`` with True = "may attend" (the convention
of ``attnbook.core``); each token-level pattern is the dense form of one predicate of
:mod:`attnbook.masks`, where the FlexAttention mods and the tile ranges come from too.
Dense attention with that mask costs ``O(L S)`` whatever the mask says; the point of
this module is :func:`block_sparse_attention` and :func:`sliding_window_attention`,
which only compute the allowed entries and so cost ``O(n (w + g + r))`` for BigBird's
window ``w``, global ``g`` and random ``r`` keys per query. Block masks ``(n_q_blocks,
n_k_blocks)`` mark which ``block_size x block_size`` tiles are computed;
:func:`expand_block_mask` turns one into the equivalent token mask, and the
FlashAttention chapter's Triton kernel reads the same block masks.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .contract import (
    check_block_mask,
    check_flag,
    check_float,
    check_indices,
    check_int,
    check_qkv,
    check_real,
    check_sizes,
    grouped_kv,
)
from .core import masked_softmax
from .masks import dense, global_tokens, longformer, sliding_window
from .primitives import merge_partials

__all__ = [
    "sliding_window_mask",
    "global_mask",
    "random_mask",
    "longformer_mask",
    "etc_relative_labels",
    "RelativeLabelBias",
    "bigbird_block_mask",
    "expand_block_mask",
    "block_sparse_attention",
    "sliding_window_attention",
    "lsh_buckets",
    "lsh_mask",
    "graph_distances",
]


# --------------------------------------------------------------------------------------
# Token-level patterns (L = S = seq_len)
# --------------------------------------------------------------------------------------
def _check_window(fn: str, seq_len, window, is_causal, dilation=1) -> None:
    if seq_len is not None:
        check_sizes(fn, seq_len=seq_len)
    check_sizes(fn, dilation=dilation)
    check_int(fn, "window", window, minimum=0)
    check_flag(fn, "is_causal", is_causal)


def sliding_window_mask(
    seq_len: int,
    window: int,
    *,
    is_causal: bool = False,
    dilation: int = 1,
    S: int | None = None,
) -> torch.Tensor:
    """Local (sliding-window) attention: ``mask[i, j] = |t| <= window * dilation`` and
    ``t % dilation == 0`` for the offset ``t = i + S - L - j`` (``t = i - j`` when
    ``S = L``).

    Each query sees ``window`` neighbours on each side (``2 window + 1`` keys including
    itself), spaced ``dilation`` apart, so the receptive field grows to ``window *
    dilation`` at the same cost (Longformer's dilated windows). With ``is_causal`` only
    the left half is kept (``t >= 0``). Shape ``(seq_len, S)``: ``L = seq_len``
    queries and ``S`` keys (default ``seq_len``), aligned bottom-right when ``S !=
    L`` like the causal mask. The dense form of :func:`attnbook.masks.sliding_window`.
    """
    _check_window("sliding_window_mask", seq_len, window, is_causal, dilation)
    L = seq_len
    if S is None:
        S = L
    check_sizes("sliding_window_mask", S=S)
    pattern = sliding_window(window, is_causal=is_causal, dilation=dilation, L=L, S=S)
    return dense(pattern, L, S)[0, 0]


def global_mask(seq_len: int, global_idx) -> torch.Tensor:
    """Global tokens: ``mask[i, j] = i in G or j in G``; the tokens in ``G`` attend to
    and are attended by all.

    ``global_idx`` is a list or 1-D integer tensor of positions (a bool mask is refused:
    pass ``mask.nonzero().flatten()``). Shape ``(seq_len, seq_len)``: the dense form of
    :func:`attnbook.masks.global_tokens`.
    """
    check_sizes("global_mask", seq_len=seq_len)
    idx = check_indices("global_mask", "global_idx", global_idx, size=seq_len)
    return dense(global_tokens(seq_len, idx), seq_len, seq_len)[0, 0]


def _check_random_mask(seq_len, n_random) -> None:
    check_sizes("random_mask", seq_len=seq_len)
    if check_int("random_mask", "n_random", n_random, minimum=0) > seq_len:
        raise ValueError(
            f"random_mask: n_random must be an integer in [0, seq_len={seq_len}], got "
            f"{n_random!r}"
        )


def random_mask(
    seq_len: int, n_random: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Random attention: each query attends to ``n_random`` distinct keys drawn
    uniformly.

    Shape ``(seq_len, seq_len)``; pass ``generator`` for a reproducible draw.
    """
    _check_random_mask(seq_len, n_random)
    picks = torch.rand(seq_len, seq_len, generator=generator).argsort(dim=-1)[
        :, :n_random
    ]
    mask = torch.zeros(seq_len, seq_len, dtype=torch.bool)
    return mask.scatter_(1, picks, True)


def longformer_mask(
    seq_len: int, window: int, global_idx, dilation: int = 1
) -> torch.Tensor:
    """Longformer: a (dilated) sliding window plus global tokens. Shape ``(seq_len,
    seq_len)``: the dense form of :func:`attnbook.masks.longformer`."""
    _check_window("longformer_mask", seq_len, window, False, dilation)
    idx = check_indices("longformer_mask", "global_idx", global_idx, size=seq_len)
    return dense(longformer(seq_len, window, idx, dilation), seq_len, seq_len)[0, 0]


# --------------------------------------------------------------------------------------
# ETC: a global input, a long input, and relative-position labels between them
# --------------------------------------------------------------------------------------
def _check_etc(n_global, n_long, radius, segment_of_long, max_distance):
    fn = "etc_relative_labels"
    check_sizes(fn, n_global=n_global, n_long=n_long)
    check_int(fn, "radius", radius, minimum=0)
    if max_distance is not None:
        check_int(fn, "max_distance", max_distance, minimum=0)
    segment = check_indices(fn, "segment_of_long", segment_of_long, size=n_global)
    if segment.numel() != n_long:
        raise ValueError(
            f"{fn}: segment_of_long must hold n_long={n_long} integers in [0, "
            f"n_global={n_global}), got {segment.tolist()}"
        )
    return segment


def etc_relative_labels(
    n_global: int,
    n_long: int,
    radius: int,
    segment_of_long,
    *,
    max_distance: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ETC's global-local attention pattern and its relative-position labels
    (Ainslie et al., 2020).

    The ``N = n_global + n_long`` tokens are ordered global first, then long; ``(a, b)``
    is query ``a``, key ``b``. Each long token ``t`` belongs to the segment of global
    token ``segment_of_long[t]`` (a sentence and its summary token, say). With ``k =
    max_distance`` (default ``radius``) and ``clip(x) = min(max(x, -k), k)``:

    * g2g (global query, global key): may attend, label ``k + clip(b - a)``;
    * l2l (long ``i``, long ``j``, counted within the long input): may attend when
      ``|j - i| <= radius``, label ``k + clip(j - i)``;
    * g2l and l2g (one global, one long token): may attend, label ``2k + 2`` when the
      long token lies in the global token's segment, ``2k + 1`` otherwise.

    Labels ``0 .. 2k`` are the clipped offsets ``-k .. k`` of Shaw et al. (2018); the
    two labels ``2k + 1`` and ``2k + 2`` replace a distance where none exists, between
    the global and the long input, so there are ``2k + 3`` labels in all. Masked-out
    l2l pairs keep their clipped label, which the mask makes unused.

    Returns ``labels (N, N)`` long in ``[0, 2k + 3)`` and ``mask (N, N)`` bool (True =
    may attend); ``segment_of_long`` is a list or 1-D tensor of ``n_long`` integers in
    ``[0, n_global)``.
    """
    segment = _check_etc(n_global, n_long, radius, segment_of_long, max_distance)
    k = radius if max_distance is None else max_distance
    is_long = torch.arange(n_global + n_long) >= n_global
    # position within its own input, and the segment (global token) each token is in
    position = torch.cat([torch.arange(n_global), torch.arange(n_long)])
    owner = torch.cat([torch.arange(n_global), segment])
    offset = position[None, :] - position[:, None]  # j - i
    labels = offset.clamp(-k, k) + k
    crosses = is_long[:, None] != is_long[None, :]  # g2l or l2g
    same_segment = (owner[:, None] == owner[None, :]).long()
    labels = torch.where(crosses, 2 * k + 1 + same_segment, labels)
    both_long = is_long[:, None] & is_long[None, :]
    mask = ~both_long | (offset.abs() <= radius)
    return labels, mask


class RelativeLabelBias(nn.Module):
    """One learned scalar per (label, head) added to the attention logits:
    ``bias[h, i, j] = b[labels[i, j], h]``.

    T5's relative bias (Raffel et al., 2020) with the labels given instead of computed
    from distances, so it also works for ETC's labels (:func:`etc_relative_labels`),
    which are not all distances. The table starts at zero (no preference). ``forward
    (labels (L, S) long, mask (L, S) bool or None)`` returns the additive mask ``(heads,
    L, S)`` for ``attnbook.core.scaled_dot_product_attention``, ``-inf`` where ``mask``
    is False.
    """

    def __init__(self, n_labels: int, n_heads: int):
        super().__init__()
        check_sizes("RelativeLabelBias", n_labels=n_labels, n_heads=n_heads)
        self.bias = nn.Embedding(n_labels, n_heads)
        nn.init.zeros_(self.bias.weight)

    def _check_inputs(self, labels, mask) -> None:
        fn = "RelativeLabelBias"
        n = self.bias.num_embeddings
        if not isinstance(labels, torch.Tensor) or labels.dim() != 2:
            raise ValueError(
                f"{fn}: labels must be an (L, S) tensor, got {labels!r:.60}"
            )
        check_indices(fn, "labels", labels.flatten(), size=n)
        if mask is not None and (
            not isinstance(mask, torch.Tensor)
            or mask.dtype != torch.bool
            or mask.shape != labels.shape
        ):
            raise ValueError(
                f"{fn}: mask must be a bool tensor of labels' shape "
                f"{tuple(labels.shape)}, got {mask!r:.60}"
            )

    def forward(
        self, labels: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        self._check_inputs(labels, mask)
        out = self.bias(labels).movedim(-1, 0)  # (L, S, heads) -> (heads, L, S)
        return out if mask is None else out.masked_fill(~mask, -math.inf)


# --------------------------------------------------------------------------------------
# Block patterns
# --------------------------------------------------------------------------------------
def _check_bigbird(n_blocks, n_global, n_window, n_random) -> None:
    check_sizes("bigbird_block_mask", n_blocks=n_blocks)
    for name, value in (
        ("n_global", n_global),
        ("n_window", n_window),
        ("n_random", n_random),
    ):
        check_int("bigbird_block_mask", name, value, minimum=0)


def bigbird_block_mask(
    n_blocks: int,
    n_global: int = 1,
    n_window: int = 3,
    n_random: int = 2,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """BigBird-ITC block pattern ``(n_blocks, n_blocks)`` (Zaheer et al., 2020).

    * global: the first and the last ``n_global`` blocks attend to every block and every
      block attends to them (rows and columns full);
    * window: every other block row ``i`` has its ``n_window`` centred neighbours, block
      offsets ``-(n_window // 2) .. n_window - 1 - n_window // 2`` (``-1, 0, 1`` for the
      default 3), cut at the ends;
    * random: plus ``n_random`` blocks drawn uniformly from those not already chosen in
      that row (fewer when fewer are left).

    Each non-global row has at most ``2 n_global + n_window + n_random`` active blocks,
    so the number of computed tiles grows linearly with ``n_blocks``.
    """
    _check_bigbird(n_blocks, n_global, n_window, n_random)
    rows = torch.arange(n_blocks)
    offset = rows[None, :] - rows[:, None]  # j - i
    mask = (offset >= -(n_window // 2)) & (offset < n_window - n_window // 2)
    is_global = (rows < n_global) | (rows >= n_blocks - n_global)
    mask |= is_global[:, None] | is_global[None, :]
    if n_random:
        # Rank the free blocks of each row by a random key; chosen blocks get +inf and
        # sort last.
        keys = torch.rand(n_blocks, n_blocks, generator=generator).masked_fill(
            mask, math.inf
        )
        picks = keys.argsort(dim=-1)[:, :n_random]
        # False where a row had fewer than n_random free blocks
        free = torch.gather(~mask, 1, picks)
        random_part = torch.zeros_like(mask).scatter_(1, picks, free)
        mask |= random_part & ~is_global[:, None]
    return mask


def expand_block_mask(block_mask: torch.Tensor, block_size: int) -> torch.Tensor:
    """Token mask of a block mask: ``(..., nq, nk) -> (..., nq * block_size, nk *
    block_size)``.

    Entry ``(i, j)`` is ``block_mask[i // block_size, j // block_size]``. For lengths
    that are not multiples of ``block_size`` (a ragged last block), slice the result:
    ``[..., :L, :S]``.
    """
    check_sizes("expand_block_mask", block_size=block_size)
    if (
        not isinstance(block_mask, torch.Tensor)
        or block_mask.dtype != torch.bool
        or block_mask.dim() < 2
    ):
        raise ValueError(
            "expand_block_mask: block_mask must be a bool tensor (..., n_q_blocks, "
            "n_k_blocks), got "
            f"{block_mask!r:.60}"
        )
    return block_mask.repeat_interleave(block_size, dim=-2).repeat_interleave(
        block_size, dim=-1
    )


# --------------------------------------------------------------------------------------
# Attention that computes only the allowed entries
# --------------------------------------------------------------------------------------
# scores per step of the masked rows' loop in block_sparse_attention
_CHUNK_SCORES = 2**20
# gathered key (and value) elements per step of the gathered rows' loop: 2 MiB of
# float32, gathered into the cache that attends to them
_CHUNK_KEYS = 2**19
# query blocks per call in a band of diagonals: one call's output stays in the cache
_BAND_ROWS = 32
# keys per split of the rows that see every key
_SPLIT_KEYS = 1024


def _pad_seq(x: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pad dimension -2 of ``x`` to ``length`` (no copy if it has that length)."""
    if x.shape[-2] == length:
        return x
    return torch.nn.functional.pad(x, (0, 0, 0, length - x.shape[-2]))


def _scale(fn: str, q: torch.Tensor, scale: float | None) -> float:
    """``scale`` (checked finite), or ``1 / sqrt(E)`` for ``q (..., E)``, which needs
    ``E >= 1``."""
    if scale is not None:
        return check_real(fn, "scale", scale)
    if q.shape[-1] == 0:
        raise ValueError(
            f"{fn}: q has head_dim 0, so the default scale 1/sqrt(head_dim) is "
            f"undefined (pass scale=): q {tuple(q.shape)}"
        )
    return 1.0 / math.sqrt(q.shape[-1])


def _check_block_sparse(q, k, v, block_mask, b, is_causal, scale) -> float:
    """The checks of :func:`block_sparse_attention`; returns the scale."""
    fn = "block_sparse_attention"
    check_qkv(fn, q, k, v)
    check_sizes(fn, block_size=b)
    check_flag(fn, "is_causal", is_causal)
    scale = _scale(fn, q, scale)
    check_block_mask(fn, block_mask, q.shape[-2], k.shape[-2], b)
    return scale


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_mask: torch.Tensor,
    block_size: int,
    *,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention that computes only the tiles a block mask allows.

    Equal to ``attnbook.core.scaled_dot_product_attention(q, k, v,
    expand_block_mask(block_mask, block_size)[:L, :S], is_causal=is_causal)``, but it
    never forms an ``L x S`` score tensor.

    Shapes: ``q (..., L, E)``, ``k (..., S, E)``, ``v (..., S, Ev)``, ``block_mask
    (ceil(L / b), ceil(S / b))`` bool, shared by every batch entry and head; ``b =
    block_size``. The last block may be ragged (``L`` or ``S`` not a multiple of ``b``).
    ``is_causal`` adds the bottom-right aligned causal mask of
    ``attnbook.core.causal_mask`` (query ``i`` sees keys ``j <= i + S - L``); tiles
    entirely above that diagonal are dropped before any work.

    Algorithm. Per query block (a row of tiles), list its active key blocks. A *plain*
    row needs no mask inside its tiles (no tile crosses the causal diagonal or holds
    the ragged last key block), so PyTorch's fused kernel can attend to its keys as
    they are, in pieces whose results are joined by their log-sum-exp
    (:func:`attnbook.primitives.merge_partials`): rows that see every block (BigBird's
    global rows) over splits of the whole of ``k, v`` (``_full_rows``); for the other
    plain rows, the key blocks all of them keep (global columns) in one long call, a
    band of block diagonals (the window) as overlapping views of ``k, v``, and the rest
    (random blocks) gathered, rows with the same number of them together
    (``_partial_rows``). Each kept tile is computed once. The rows that need a mask
    are padded to a common width with a validity flag and attended with a token mask
    (``_masked_rows``). Cost: ``O(active tiles * b^2 * E)``, i.e. ``O(n (w + g + r)
    E)`` for BigBird.

    Empty shapes give what SDPA gives: an empty batch, no heads, ``L = 0`` or ``Ev =
    0`` the empty ``(..., L, Ev)`` result, ``S = 0`` zeros (no key to see), ``E = 0``
    equal scores (with an explicit ``scale``: the default ``1 / sqrt(E)`` is
    undefined, a ``ValueError``).
    """
    scale = _check_block_sparse(q, k, v, block_mask, block_size, is_causal, scale)
    k, v = grouped_kv(q, k, v)
    L, S, b = q.shape[-2], k.shape[-2], block_size
    n_qb, n_kb = -(-L // b), -(-S // b)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if L == 0 or S == 0 or v.shape[-1] == 0 or 0 in batch:
        # no tile to compute: an empty result, or zeros (no key to see); q (k^T v) has
        # the output's shape and never forms an L x S tensor
        return (q * scale) @ (k.transpose(-2, -1) @ v)
    if q.shape[-1] == 0:  # no features: every score is 0, as with one zero feature
        q, k = (torch.nn.functional.pad(t, (0, 1)) for t in (q, k))
    # (N, blocks, b, E) views: N = batch entries times heads
    qb, kb, vb = (
        _pad_seq(t.expand(*batch, *t.shape[-2:]), n * b).reshape(-1, n, b, t.shape[-1])
        for t, n in ((q, n_qb), (k, n_kb), (v, n_kb))
    )
    # keys and values are gathered and viewed block by block: once in memory order, so
    # that no step copies them again (a (B, S, H, E) layout, say, arrives transposed)
    kb, vb = kb.contiguous(), vb.contiguous()
    q_pos = torch.arange(n_qb * b, device=q.device).view(n_qb, b)
    k_pos = torch.arange(n_kb * b, device=q.device).view(n_kb, b)
    active = block_mask.to(q.device) & (k_pos[None, :, 0] < S)
    if is_causal:  # drop tiles whose first key lies after the last query's diagonal
        active &= k_pos[None, :, 0] <= q_pos[:, -1:] + (S - L)
    # a tile needs a token mask when it holds keys past S or crosses the diagonal
    crossing = (k_pos[None, :, -1] >= S).expand(n_qb, n_kb)
    if is_causal:
        crossing = crossing | (k_pos[None, :, -1] > q_pos[:, :1] + (S - L))
    counts = active.sum(dim=-1)
    plain = ~(active & crossing).any(dim=-1) & (counts > 0)
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in (qb, kb, vb))
    out = qb.new_empty(*qb.shape[:-1], vb.shape[-1])
    full = plain & (counts == n_kb)
    if full.any():
        _full_rows(out, qb, kb, vb, full.nonzero().flatten(), scale, grad)
    if (plain & ~full).any():
        _partial_rows(
            out, qb, kb, vb, (plain & ~full).nonzero().flatten(), active, scale, grad
        )
    rows = (~plain).nonzero().flatten()
    if len(rows):
        shift = S - L if is_causal else None
        _masked_rows(out, qb, kb, vb, rows, active, q_pos, k_pos, S, shift, scale)
    return out.flatten(-3, -2)[:, :L].reshape(*batch, L, vb.shape[-1])


def _gather_blocks(x: torch.Tensor, idx: torch.Tensor, buffer) -> torch.Tensor:
    """Blocks ``idx (r, c)`` of ``x (N, blocks, b, E)`` as ``(N, r, c b, E)``: row ``i``
    holds its ``c`` blocks in order. One ``index_select`` over the flattened ``(N
    blocks, b E)`` rows (whole rows copied as such, faster than indexing dimension 1),
    written into the front of ``buffer`` (1-D) when one is given: a fresh allocation of
    tens of MiB costs more than the copy (the operating system maps new pages)."""
    N, n, b, E = x.shape
    flat = (torch.arange(N, device=idx.device)[:, None] * n + idx.flatten()).flatten()
    rows = x.reshape(N * n, b * E)
    if buffer is None:  # under autograd: index_select's out= is not differentiable
        picked = rows.index_select(0, flat)
    else:
        picked = torch.index_select(
            rows, 0, flat, out=buffer[: len(flat) * b * E].view(-1, b * E)
        )
    return picked.view(N, *idx.shape[:1], -1, E)


def _query_rows(qb: torch.Tensor, rows: torch.Tensor):
    """``qb[:, rows]`` and ``rows`` as a slice when they are consecutive (a view), else
    one ``index_select`` (advanced indexing copies several times slower)."""
    r = _as_slice(rows)
    return (qb[:, r] if isinstance(r, slice) else qb.index_select(1, rows)), r


def _attend_lse(q, k, v, scale: float, grad: bool):
    """Unmasked attention ``(N, r, l, E) x (N, r, s, E) -> (N, r, l, Ev)`` and the
    log-sum-exp of each query's scores ``(N, r, l)``, what :func:`merge_partials` needs
    to join attention over disjoint key sets; both in float32 (float64 for float64
    inputs), the precision partial results are merged in. On the CPU (no autograd,
    ``Ev = E``) this is PyTorch's fused kernel, which returns both; elsewhere the
    readable formula."""
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    if not grad and q.device.type == "cpu" and q.shape[-1] == v.shape[-1]:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, scale=scale
        )
        return out.to(dtype), lse.to(dtype)
    q, k, v = (x.to(dtype) for x in (q, k, v))
    scores = q @ k.transpose(-2, -1) * scale
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse.unsqueeze(-1)) @ v, lse


def _merge_rows(acc, lse, rows, o, o_lse, grad: bool) -> None:
    """Fold attention ``o`` over new keys (log-sum-exp ``o_lse``) into ``acc[:, rows]``
    and ``lse[:, rows]``, in place unless autograd records it; ``rows`` a slice (views:
    nothing is copied) or an index tensor. A row without a partial result yet (its
    ``lse`` still ``-inf``) takes ``o`` as it is: no merge, and no zeroed buffer."""
    fresh = torch.isneginf(lse[:, rows, 0]).all(dim=0)  # (r,)
    if fresh.all():
        acc[:, rows], lse[:, rows] = o, o_lse
        return
    if fresh.any():  # some rows fresh, some not: each kind on its own
        idx = torch.arange(acc.shape[1], device=lse.device)[rows]
        for part in (fresh, ~fresh):
            _merge_rows(acc, lse, idx[part], o[:, part], o_lse[:, part], grad)
        return
    if grad:  # the merge saves its inputs for the backward pass: copies, not views
        old, old_lse = acc[:, rows].clone(), lse[:, rows].clone()
        acc[:, rows], lse[:, rows] = merge_partials(old, old_lse, o, o_lse)
    elif isinstance(rows, slice):
        merge_partials(acc[:, rows], lse[:, rows], o, o_lse, inplace=True)
    else:
        o_rows, lse_rows = acc[:, rows], lse[:, rows]  # copies
        merge_partials(o_rows, lse_rows, o, o_lse, inplace=True)
        acc[:, rows], lse[:, rows] = o_rows, lse_rows


def _as_slice(rows: torch.Tensor):
    """``rows`` (sorted indices) as a slice when they are consecutive, else unchanged:
    a slice of a tensor is a view, an index a copy."""
    first, last = int(rows[0]), int(rows[-1])
    return slice(first, last + 1) if last - first + 1 == len(rows) else rows


def _full_rows(out, qb, kb, vb, rows, scale, grad) -> None:
    """Query blocks ``rows`` that see every key block (BigBird's global rows): all of
    ``k`` and ``v``, nothing gathered. The keys are cut into splits of about
    ``_SPLIT_KEYS`` keys, attended as separate problems and joined by their
    log-sum-exp, as flash-decoding does: the few queries of these rows then meet each
    split's keys while they are in the cache, instead of streaming all of ``k`` and
    ``v`` from memory once for every 32 queries (1.5x the dense rate on two threads
    without splits, 1.2x with them)."""
    N, n_kb, b, E = kb.shape
    q_rows, r = _query_rows(qb, rows)
    q_rows = q_rows.reshape(N, 1, -1, E)
    per = max(1, min(n_kb, _SPLIT_KEYS // b))  # key blocks per split
    n_splits, rest = divmod(n_kb, per)
    # (N, splits, per * b, E): equal splits as views of k and v, then the rest
    k_s, v_s = (
        x[:, : n_splits * per].reshape(N, n_splits, per * b, -1) for x in (kb, vb)
    )
    o, o_lse = _attend_lse(q_rows.expand(N, n_splits, -1, E), k_s, v_s, scale, grad)
    parts = list(zip(o.unbind(1), o_lse.unbind(1)))
    if rest:
        k_r, v_r = (
            x[:, n_splits * per :].reshape(N, 1, rest * b, -1) for x in (kb, vb)
        )
        o, o_lse = _attend_lse(q_rows, k_r, v_r, scale, grad)
        parts.append((o[:, 0], o_lse[:, 0]))
    acc, acc_lse = parts[0]
    for o, o_lse in parts[1:]:
        acc, acc_lse = merge_partials(acc, acc_lse, o, o_lse, inplace=not grad)
    out[:, r] = acc.view(N, len(rows), b, -1).to(out.dtype)


def _shared_columns(acc, lse, qb, kb, vb, rows, cols, scale, grad) -> None:
    """Key blocks ``cols`` that every row of ``rows`` keeps (BigBird's global columns):
    all those queries against those keys as one long problem, the fused kernel at its
    most efficient (hundreds of queries per call instead of one block), the first
    partial result of each row."""
    N, _, b, E = qb.shape
    q_rows, r = _query_rows(qb, rows)
    k_cols, v_cols = (_gather_blocks(x, cols[None], None) for x in (kb, vb))
    # (N, 1, rows * b, E) against (N, 1, len(cols) * b, E)
    o, o_lse = _attend_lse(q_rows.reshape(N, 1, -1, E), k_cols, v_cols, scale, grad)
    _merge_rows(acc, lse, r, o.view(N, len(rows), b, -1), o_lse.view(N, -1, b), grad)


def _band(tiles: torch.Tensor, n_rows: int):
    """The widest run of consecutive block diagonals ``j - i = o1 .. o1 + width - 1``
    each of which holds a tile in at least half of ``n_rows`` rows: a sliding window
    (BigBird's three blocks), or None."""
    n_qb, n_kb = tiles.shape
    i, j = tiles.nonzero(as_tuple=True)
    fill = torch.bincount(j - i + n_qb - 1, minlength=n_qb + n_kb - 1).tolist()
    threshold = max(2, (n_rows + 1) // 2)
    best, best_fill, start = None, 0, None
    for d, f in enumerate(fill + [0]):  # d = j - i + n_qb - 1
        if f >= threshold:
            start = d if start is None else start
        elif start is not None:
            if sum(fill[start:d]) > best_fill:  # the run start .. d - 1
                best_fill = sum(fill[start:d])
                best = (start - (n_qb - 1), d - start)
            start = None
    return best


def _band_rows(acc, lse, qb, kb, vb, tiles, o1, width, scale, grad) -> None:
    """Rows whose band ``o1 .. o1 + width - 1`` is all kept: the band's keys are
    consecutive, so each run of such rows attends to overlapping windows of one view
    of ``k`` and ``v`` (``unfold``: no copy). Clears those tiles from ``tiles``."""
    N, n_qb, b, E = qb.shape
    n_kb = kb.shape[1]
    rows = torch.arange(n_qb, device=tiles.device)
    cols = rows[:, None] + o1 + torch.arange(width, device=tiles.device)  # (n_qb, w)
    inside = ((cols >= 0) & (cols < n_kb)).all(dim=-1)
    kept = torch.gather(tiles, 1, cols.clamp(0, n_kb - 1)).all(dim=-1) & inside
    band = rows[kept]
    if not len(band):
        return
    # (N, n_kb - width + 1, width * b, E): window s holds key blocks s .. s + width - 1
    windows = [
        x.flatten(1, 2).unfold(1, width * b, b).transpose(-2, -1) for x in (kb, vb)
    ]
    for run in band.split(_runs(band)):  # consecutive rows, _BAND_ROWS per call
        for start in range(int(run[0]), int(run[-1]) + 1, _BAND_ROWS):
            r = slice(start, min(start + _BAND_ROWS, int(run[-1]) + 1))
            k_win, v_win = (w[:, r.start + o1 : r.stop + o1] for w in windows)
            o, o_lse = _attend_lse(qb[:, r], k_win, v_win, scale, grad)
            _merge_rows(acc, lse, r, o, o_lse, grad)
    tiles[band[:, None], cols[band]] = False


def _runs(rows: torch.Tensor) -> list[int]:
    """Lengths of the runs of consecutive integers in sorted ``rows``."""
    breaks = ((rows[1:] - rows[:-1]) != 1).nonzero().flatten() + 1
    edges = [0, *breaks.tolist(), len(rows)]
    return [b - a for a, b in zip(edges, edges[1:])]


def _gathered_rows(acc, lse, qb, kb, vb, tiles, scale, grad) -> None:
    """Every tile left in ``tiles``: rows with the same number ``c`` of them gather
    those key blocks (``(N, r, c b, E)``, in chunks of about ``_CHUNK_KEYS`` elements
    written into reused buffers) and attend to them in one call."""
    N, n_kb, b, E = kb.shape
    counts = tiles.sum(dim=-1)
    order = (~tiles).to(torch.int8).argsort(dim=-1, stable=True)  # kept blocks first
    for c in counts[counts > 0].unique().tolist():
        rows = (counts == c).nonzero().flatten()
        step = max(1, _CHUNK_KEYS // (N * c * b * E))
        buffers = [
            None
            if grad
            else x.new_empty(N * min(step, len(rows)) * c * b * x.shape[-1])
            for x in (kb, vb)
        ]
        for chunk in rows.split(step):
            k_rows, v_rows = (
                _gather_blocks(x, order[chunk, :c], buf)
                for x, buf in zip((kb, vb), buffers)
            )
            q_rows, r = _query_rows(qb, chunk)
            o, o_lse = _attend_lse(q_rows, k_rows, v_rows, scale, grad)
            _merge_rows(acc, lse, r, o, o_lse, grad)


def _partial_rows(out, qb, kb, vb, rows, active, scale, grad) -> None:
    """Query blocks ``rows`` that keep some, not all, key blocks and need no token mask.
    Their tiles are split into three kinds of work, each shaped for the fused kernel,
    and the partial results are joined by :func:`merge_partials`:

    1. key blocks every row keeps (global columns): one call for all rows;
    2. a band of block diagonals (a sliding window): overlapping views of ``k, v``;
    3. whatever is left (random blocks, rows at the ends of the band): gathered."""
    N, n_qb, b, _ = qb.shape
    dtype = torch.float64 if out.dtype == torch.float64 else torch.float32
    acc = out if out.dtype == dtype else torch.empty_like(out, dtype=dtype)
    lse = out.new_full((N, n_qb, b), -math.inf, dtype=dtype)
    tiles = torch.zeros_like(active)
    tiles[rows] = active[rows]
    shared = tiles[rows].all(dim=0)
    if shared.any():
        _shared_columns(
            acc, lse, qb, kb, vb, rows, shared.nonzero().flatten(), scale, grad
        )
        tiles[:, shared] = False
    band = _band(tiles, len(rows))
    if band is not None:
        _band_rows(acc, lse, qb, kb, vb, tiles, *band, scale, grad)
    _gathered_rows(acc, lse, qb, kb, vb, tiles, scale, grad)
    if acc is not out:
        out[:, rows] = acc[:, rows].to(out.dtype)


def _masked_rows(out, qb, kb, vb, rows, active, q_pos, k_pos, S, shift, scale):
    """Write into ``out`` the attention of the query blocks ``rows`` whose tiles need a
    token mask: keys past ``S``, or (``shift`` not None) keys after the causal diagonal
    ``j <= i + shift``, or no active block at all.

    Each row's active key blocks are gathered, padded to a common width with a validity
    flag and attended with :func:`attnbook.core.masked_softmax` (a row with no allowed
    key gives zeros). A global row sees every block and would pad every row to ``S /
    b`` blocks, so the rows are sorted by their number of active blocks and split in two
    groups (narrow and wide), each padded to its own width; the split minimizes the
    total ``rows x width``. Chunks keep each step near ``_CHUNK_SCORES`` scores."""
    N, b = qb.shape[0], qb.shape[2]
    counts = active[rows].sum(dim=-1)
    order = counts.argsort()
    rows, sorted_counts = rows[order], counts[order].tolist()
    n = len(rows)
    costs = [
        (i * sorted_counts[i - 1] if i else 0) + (n - i) * sorted_counts[-1]
        for i in range(n + 1)
    ]
    n_narrow = min(range(n + 1), key=costs.__getitem__)
    for group in (rows[:n_narrow], rows[n_narrow:]):
        if not len(group):
            continue
        width = max(int(active[group].sum(dim=-1).max()), 1)
        step = max(1, _CHUNK_SCORES // (N * b * b * width))
        for r in group.split(step):  # r rows at a time, about _CHUNK_SCORES scores
            # (r, width): active key blocks first, then padding blocks (valid False)
            idx = (~active[r]).to(torch.int8).argsort(dim=-1, stable=True)[:, :width]
            valid = torch.gather(active[r], 1, idx).repeat_interleave(b, dim=-1)
            keys = k_pos[idx].flatten(1)[:, None, :]  # (r, 1, width * b) key positions
            blocked = ~valid[:, None, :] | (keys >= S)
            if shift is not None:
                blocked = blocked | (keys > q_pos[r][:, :, None] + shift)
            k_rows = kb[:, idx].flatten(-3, -2)  # (N, r, width * b, E)
            v_rows = vb[:, idx].flatten(-3, -2)  # (N, r, width * b, Ev)
            scores = (qb[:, r] * scale) @ k_rows.transpose(-2, -1)  # (N, r, b, w b)
            out[:, r] = masked_softmax(scores, ~blocked) @ v_rows  # no key: zeros


def _check_sliding_window_attention(q, k, v, window, is_causal, scale) -> float:
    """The checks of :func:`sliding_window_attention`; returns the scale."""
    fn = "sliding_window_attention"
    check_qkv(fn, q, k, v)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"{fn} is self-attention: q and k need the same length, got q "
            f"{tuple(q.shape)} and k {tuple(k.shape)}"
        )
    _check_window(fn, None, window, is_causal)
    return _scale(fn, q, scale)


def sliding_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    *,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Self-attention where query ``i`` sees keys ``|i - j| <= window`` (``i - window <=
    j <= i`` if causal).

    Equal to dense attention with ``sliding_window_mask(n, window,
    is_causal=is_causal)``, with ``O(n * window)`` scores: keys and values are
    zero-padded by ``window`` at both ends and ``unfold`` makes the ``(..., n, 2
    window + 1)`` windows as views, so the scores are ``(..., n, 2 window + 1)``
    instead of ``(..., n, n)``. The batched product copies the windows (``n (2 window
    + 1) E`` values per head); :func:`attnbook.attend.flash_attention` with
    ``window_size`` holds one tile at a time instead. Shapes ``(..., n, E)``, ``(...,
    n, E)``, ``(..., n, Ev)`` -> ``(..., n, Ev)``; queries and keys must have the same
    length ``n``.

    Cost: ``n s`` scores with ``s = 2 window + 1`` keys per query (``window + 1`` if
    causal), so ``2 n s (E + Ev)`` FLOPs for the two matrix products: linear in ``n``
    and in ``window``.
    """
    scale = _check_sliding_window_attention(q, k, v, window, is_causal, scale)
    k, v = grouped_kv(q, k, v)
    n = q.shape[-2]
    if n == 0:  # no token: nothing to unfold
        return q @ k.transpose(-2, -1) @ v
    right = 0 if is_causal else window
    span = window + right + 1
    k_win = _pad_positions(k, window, right).unfold(-2, span, 1)  # (..., n, E, span)
    v_win = _pad_positions(v, window, right).unfold(-2, span, 1)  # (..., n, Ev, span)
    scores = (q.unsqueeze(-2) * scale) @ k_win  # (..., n, 1, span)
    key_pos = torch.arange(n, device=q.device)[:, None] + torch.arange(
        -window, right + 1, device=q.device
    )
    allowed = ((key_pos >= 0) & (key_pos < n)).unsqueeze(-2)  # (n, 1, span)
    weights = masked_softmax(scores, allowed)  # rows with no key: zeros
    return (weights @ v_win.transpose(-2, -1)).squeeze(-2)


def _pad_positions(x: torch.Tensor, before: int, after: int) -> torch.Tensor:
    """``x`` ``(..., n, E)`` with ``before`` and ``after`` rows of zeros around its
    positions. ``F.pad`` does the same, but torch 2.9 and older refuse it a tensor with
    no features."""
    n = x.shape[-2]
    out = x.new_zeros(*x.shape[:-2], n + before + after, x.shape[-1])
    out[..., before : before + n, :] = x
    return out


# --------------------------------------------------------------------------------------
# Learned / content-based sparsity: locality-sensitive hashing (Reformer)
# --------------------------------------------------------------------------------------
def _check_lsh(fn: str, x, n_buckets) -> None:
    check_float(fn, "x", x)
    if x.dim() < 1:
        raise ValueError(f"{fn}: x must have shape (..., n, E), got {tuple(x.shape)}")
    if check_int(fn, "n_buckets", n_buckets, minimum=2) % 2:
        raise ValueError(
            f"{fn}: n_buckets must be an even integer >= 2, got {n_buckets}"
        )


def lsh_buckets(
    x: torch.Tensor, n_buckets: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Angular LSH of Kitaev et al. (2020): ``h(x) = argmax([x R ; -x R])`` with a
    random ``R`` ``(E, n_buckets / 2)``.

    Vectors at a small angle land in the same bucket with high probability, so attending
    only within a bucket keeps most of each query's large dot products. ``x (..., n,
    E)`` -> integer buckets ``(..., n)`` in ``[0, n_buckets)``; ``n_buckets`` must be
    even.
    """
    _check_lsh("lsh_buckets", x, n_buckets)
    rotation = torch.randn(x.shape[-1], n_buckets // 2, generator=generator).to(x)
    projected = x @ rotation
    return torch.cat([projected, -projected], dim=-1).argmax(dim=-1)


def lsh_mask(
    x: torch.Tensor, n_buckets: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Shared-QK LSH attention pattern: ``mask[..., i, j] = bucket(x_i) ==
    bucket(x_j)``. Shape ``(..., n, n)``.

    Reformer shares queries and keys (``Q = K``) so a query's bucket is also its own
    key's bucket. The dense mask is for pictures and checks; Reformer sorts by bucket
    and attends within chunks.
    """
    _check_lsh("lsh_mask", x, n_buckets)
    buckets = lsh_buckets(x, n_buckets, generator)
    return buckets[..., :, None] == buckets[..., None, :]


# --------------------------------------------------------------------------------------
# The graph view
# --------------------------------------------------------------------------------------
def graph_distances(mask: torch.Tensor) -> torch.Tensor:
    """Shortest-path lengths of the directed attention graph (edge ``i -> j`` when
    ``mask[i, j]``).

    Breadth-first search from every node at once with boolean matrix products: after
    ``t`` rounds ``reach[i, j]`` says whether ``j`` is within ``t`` hops of ``i``.
    Information flows along these paths across stacked layers: ``distance[i, j]`` layers
    are needed before token ``i`` can depend on token ``j``. Returns ``(n, n)`` integer
    distances, ``-1`` where no path exists.
    """
    square = (
        isinstance(mask, torch.Tensor)
        and mask.dim() == 2
        and mask.shape[0] == mask.shape[1]
    )
    if not square or mask.dtype != torch.bool:
        raise ValueError(
            f"graph_distances: mask must be a square 2-D bool tensor, got {mask!r:.60}"
        )
    n = mask.shape[0]
    adjacency = mask.float()
    reach = torch.eye(n, dtype=torch.bool, device=mask.device)
    dist = torch.where(reach, 0, -1)
    for hops in range(1, n):
        new = ((reach.float() @ adjacency) > 0) | reach
        if torch.equal(new, reach):
            break
        dist[new & ~reach] = hops
        reach = new
    return dist
