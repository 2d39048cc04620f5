"""FlashAttention in PyTorch: online softmax, tiling, recomputation (Dao et al., 2022;
Dao, 2023).

Exact attention ``softmax(Q K^T * scale) V`` computed block by block so that the ``L x
S`` score matrix never exists in memory. Three ideas, one function each:

* :func:`online_softmax`: softmax over a row seen in blocks, with a running maximum
  ``m`` and a running normalizer ``l`` (Milakov and Gimelshein, 2018);
  :func:`merge_partials` is the same rescaling applied to two partial attention outputs.
  Both live in :mod:`attnbook.primitives` (every module that merges partial results
  imports them from there) and are re-exported here, where the chapter teaches them.
* :func:`flash_forward`: the FlashAttention forward pass in tiles; it returns
  the output and the log-sum-exp ``lse`` of every row, the only statistic the backward
  pass needs.
* :func:`flash_backward`: the backward pass, which recomputes the
  probabilities tile by tile from ``(q, k, lse)`` instead of storing them.

:func:`attnbook.attend.flash_attention` makes the two one differentiable function;
with ``backend="auto"`` it runs the Triton kernels of
:mod:`attnbook.kernels.flash_triton` on CUDA and these PyTorch tiles elsewhere. It and
the other entry points that pick a backend (``flash_attention_varlen``,
``block_sparse_flash_attention``, ``select_backend``) live in :mod:`attnbook.attend`
and are given here too, under their names (``attnbook.flash.flash_attention``).

:func:`hbm_accesses` counts the slow-memory traffic of standard attention and of
FlashAttention, the quantity FlashAttention minimizes; :func:`plan_tiles` sizes the
PyTorch tiles for the CPU's caches, the CPU's counterpart of that SRAM. Conventions:
tensors ``(batch, heads, seq, head_dim)``; causal masks are bottom-right aligned (query
``i`` sees keys ``j <= i + S - L``), as in :func:`attnbook.core.causal_mask`; a query
that sees no key returns zeros and ``lse = -inf``.
"""

from __future__ import annotations

import importlib
import math
import numbers
import os

import torch

from ._renamed import renamed
from .contract import check_flag as _check_flag
from .contract import check_int as _check_int
from .contract import (
    check_attention_options,
    check_float,
    check_qkv,
    default_scale,
)
from .primitives import (  # noqa: F401  (re-exported: the chapter teaches them here)
    _accumulation_dtype,
    _fold_tile,
    merge_partials,
    online_softmax,
    online_softmax_step,
)

__all__ = [
    "online_softmax_step",
    "online_softmax",
    "merge_partials",
    "flash_forward",
    "flash_backward",
    "key_range",
    "plan_tiles",
    "hbm_accesses",
]

#: The entry points that pick a backend, which live in :mod:`attnbook.attend` and are
#: given here too, where the chapter teaches them (``attnbook.flash.flash_attention``).
_ENTRY_POINTS = frozenset(
    {
        "flash_attention",
        "flash_attention_varlen",
        "block_sparse_flash_attention",
        "select_backend",
    }
)


#: Old names, one release each: the forward and backward passes were
#: ``tiled_attention_*`` until their Triton twins took the same names.
_RENAMED = {
    "tiled_attention_forward": ("attnbook.flash.flash_forward", ""),
    "tiled_attention_backward": ("attnbook.flash.flash_backward", ""),
}


def __getattr__(name: str):
    """``attnbook.flash.flash_attention`` and the other entry points of
    :data:`_ENTRY_POINTS`: looked up in :mod:`attnbook.attend` when first asked for.
    That module builds on this one, so this one does not import it. The old names of
    :data:`_RENAMED` warn."""
    if name in _ENTRY_POINTS:
        return getattr(importlib.import_module("attnbook.attend"), name)
    return renamed(__name__, _RENAMED, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | _ENTRY_POINTS)


# --------------------------------------------------------------------------------------
# Checks of the arguments
# --------------------------------------------------------------------------------------
def _check_scale(fn: str, scale) -> float | None:
    """``scale``: None (``1 / sqrt(E)``) or a finite real number."""
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(
            f"{fn}: scale must be a real number or None, got {scale!r} "
            f"({type(scale).__name__})"
        )
    if not math.isfinite(scale):
        raise ValueError(f"{fn}: scale must be finite, got {scale!r}")
    return float(scale)


def _check_head_dim(fn: str, q: torch.Tensor, scale: float | None) -> None:
    """The default scale ``1 / sqrt(E)`` needs ``E >= 1``."""
    if q.shape[-1] == 0 and scale is None:
        raise ValueError(
            f"{fn}: q has head_dim 0, so the default scale 1/sqrt(head_dim) is "
            f"undefined: q {tuple(q.shape)}"
        )


# --------------------------------------------------------------------------------------
# Tiled forward and backward (PyTorch)
# --------------------------------------------------------------------------------------
def _as_4d(q, k, v):
    """``q, k, v`` of the contract's shapes as ``(B, H, L, E)`` tensors for the tiled
    code and the kernels, and the leading shape to give the output back."""
    if (  # already (B, H, L, E) with one batch: nothing to reshape (the common call)
        q.dim() == k.dim() == v.dim() == 4
        and q.shape[0] == k.shape[0] == v.shape[0]
        and (q.shape[1] > 1 or k.shape[1] == 1)
    ):
        return q, k, v, q.shape[:1]
    rank = max(q.dim(), k.dim(), 3)
    q, k, v = (t.reshape((1,) * (rank - t.dim()) + tuple(t.shape)) for t in (q, k, v))
    batch = torch.broadcast_shapes(q.shape[:-3], k.shape[:-3])
    if (
        q.shape[-3] == 1 and k.shape[-3] > 1
    ):  # one query head broadcast over the K/V heads
        q = q.expand(*q.shape[:-3], k.shape[-3], *q.shape[-2:])
    q, k, v = (
        t.expand(*batch, *t.shape[-3:]).reshape(math.prod(batch), *t.shape[-3:])
        for t in (q, k, v)
    )
    return q, k, v, batch


def _from_4d(x: torch.Tensor, batch: torch.Size, rank: int) -> torch.Tensor:
    """Undo :func:`_as_4d` for a ``(B, H, L, ...)`` result."""
    x = x.reshape(*batch, *x.shape[1:])
    return x.reshape(x.shape[1:]) if rank == 2 else x


def key_range(
    i0: int,
    i1: int,
    L: int,
    S: int,
    *,
    is_causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
) -> tuple[int, int]:
    """The keys ``[lo, hi)`` that queries ``i0 .. i1 - 1`` may see: a tile loop visits
    only these, so tiles entirely outside a sliding window or above the causal diagonal
    cost nothing.

    With FlashAttention-2's ``window_size = (left, right)`` (``-1``: unbounded) query
    ``i`` sees keys ``j`` in ``[i + S - L - left, i + S - L + right]``; ``is_causal``
    caps ``right`` at 0 (bottom-right aligned, like the causal mask). ``hi <= lo``
    means no key at all.
    """
    fn = "key_range"
    is_causal = _check_flag(fn, "is_causal", is_causal)
    L, S = _check_int(fn, "L", L, 0), _check_int(fn, "S", S, 0)
    i0, i1 = _check_int(fn, "i0", i0, 0), _check_int(fn, "i1", i1, 0)
    if not i0 <= i1 <= L:
        raise ValueError(f"{fn}: need 0 <= i0 <= i1 <= L, got i0={i0}, i1={i1}, L={L}")
    _check_window(fn, window_size)
    left, right = window_size
    if is_causal:
        right = 0 if right < 0 else min(right, 0)
    lo = 0 if left < 0 else max(0, i0 + S - L - left)
    hi = S if right < 0 else min(S, i1 - 1 + S - L + right + 1)
    return lo, hi


def _check_window(fn: str, window_size) -> None:
    """FlashAttention-2's ``window_size``: two ints, each -1 (unbounded) or >= 0."""
    if (
        not isinstance(window_size, (tuple, list))
        or len(window_size) != 2
        or not all(
            isinstance(w, numbers.Integral) and not isinstance(w, bool) and w >= -1
            for w in window_size
        )
    ):
        raise ValueError(
            f"{fn}: window_size must be two integers (left, right), each -1 "
            f"(unbounded) or >= 0, got {window_size!r}"
        )


def _tile_scores(
    qk: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    L: int,
    S: int,
    is_causal: bool,
    window: tuple[int, int],
    slopes: torch.Tensor | None,
    softcap: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One tile's final scores from its scaled products ``qk (B, H, rows, cols)``:
    ``softcap * tanh(qk / softcap)``, then ALiBi's ``- slope * |i + S - L - j|``, then
    ``-inf`` outside the causal mask and the window. Also returns ``tanh(qk /
    softcap)`` (the backward pass needs it) or ``None``."""
    tanh = None
    if softcap:
        tanh = torch.tanh(qk / softcap)
        qk = softcap * tanh
    if slopes is not None:
        distance = (rows[:, None] + (S - L) - cols[None, :]).abs().to(qk.dtype)
        qk = qk - slopes.to(qk.dtype)[:, :, None, None] * distance
    left, right = window
    if is_causal:
        right = 0 if right < 0 else min(right, 0)
    if left >= 0 or right >= 0:
        offset = cols[None, :] - rows[:, None] - (S - L)  # j - (i + S - L)
        allowed = torch.ones_like(offset, dtype=torch.bool)
        if left >= 0:
            allowed &= offset >= -left
        if right >= 0:
            allowed &= offset <= right
        qk = qk.masked_fill(~allowed, -math.inf)
    return qk, tanh


def _cache_bytes(level: int, default: int) -> int:
    """Size of this CPU's level-``level`` data cache (Linux sysfs), else ``default``."""
    root = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for index in sorted(os.listdir(root)):
            with open(f"{root}/{index}/level") as f:
                found = int(f.read()) == level
            with open(f"{root}/{index}/type") as f:
                found = found and f.read().strip() in ("Data", "Unified")
            if found:
                with open(f"{root}/{index}/size") as f:
                    size = f.read().strip().upper()
                scale = {"K": 2**10, "M": 2**20}.get(size[-1:], 1)
                return int(size.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return default


def plan_tiles(
    head_dim: int,
    value_dim: int | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    l1_bytes: int | None = None,
    l2_bytes: int | None = None,
    threads: int | None = None,
) -> tuple[int, int]:
    """Tile sizes ``(block_q, block_k)`` of the PyTorch tiled path for the CPU's caches.

    The tiles are computed in float32 (float64 for float64 inputs), ``w`` bytes an
    element, and each of the ``threads`` threads (default: ``torch.get_num_threads()``)
    works on its share of the query rows, ``block_q / threads``. That share of the
    query tile, ``block_q / threads x head_dim``, fills at most the level-1 data cache.
    ``block_k``: a thread's share of the score tile, ``block_q / threads x block_k``,
    and the key and value tiles ``block_k x (head_dim + value_dim)`` fit together in
    half of the level-2 cache, so the matmul that writes the scores, the exponentials
    that read them and the product with ``V`` find them there. Both are powers of two,
    ``16 <= block_q / threads <= 256`` and ``block_q / threads <= block_k <= 4096``:
    big enough that the Python loop (``L S / (block_q block_k)`` steps) costs little
    beside the arithmetic. The cache sizes are read from Linux's sysfs (defaults 32 KiB
    and 1 MiB), or given. (With one thread's tile on two threads, 128 x 512 at
    ``head_dim`` 64, the path took 3.2 times SDPA's time at 16,384 tokens; with 256 x
    512, 1.9 times.)
    """
    fn = "plan_tiles"
    head_dim = _check_int(fn, "head_dim", head_dim)
    value_dim = (
        head_dim if value_dim is None else _check_int(fn, "value_dim", value_dim)
    )
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{fn}: dtype must be a floating torch.dtype, got {dtype!r}")
    l1 = (
        _cache_bytes(1, 2**15)
        if l1_bytes is None
        else _check_int(fn, "l1_bytes", l1_bytes)
    )
    l2 = (
        _cache_bytes(2, 2**20)
        if l2_bytes is None
        else _check_int(fn, "l2_bytes", l2_bytes)
    )
    threads = (
        torch.get_num_threads()
        if threads is None
        else _check_int(fn, "threads", threads)
    )
    threads = 2 ** math.floor(math.log2(threads))  # a power of two: tiles split evenly
    w = 8 if dtype == torch.float64 else 4

    def power_of_two(x: float, lo: int, hi: int) -> int:
        return min(hi, max(lo, 2 ** max(0, math.floor(math.log2(max(x, 1))))))

    rows = power_of_two(l1 / (w * head_dim), 16, 256)  # one thread's query rows
    block_k = power_of_two(l2 / 2 / (w * (rows + head_dim + value_dim)), rows, 4096)
    return rows * threads, block_k


def flash_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    alibi_slopes: torch.Tensor | None = None,
    softcap: float = 0.0,
    block_q: int | None = None,
    block_k: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention's forward pass with PyTorch tiles: ``(out, lse)``, never an ``L x
    S`` tensor.

    For each query block ``Q_i`` (``block_q`` rows) and each key block ``K_j, V_j``
    (``block_k`` rows): ``S_ij = Q_i K_j^T * scale``, then the online-softmax update of
    the running maximum ``m``, normalizer ``l`` and unnormalized output ``acc``:

        ``m' = max(m, rowmax(S_ij))``, ``P = exp(S_ij - m')``, ``l' = l e^(m - m') +
        rowsum(P)``, ``acc' = acc e^(m - m') + P V_j``;   finally ``out = acc / l``,
        ``lse = m + log l``.

    With FlashAttention-2's options: ``softcap > 0`` caps each scaled score,
    ``softcap * tanh(S / softcap)`` (Gemma 2); ``alibi_slopes`` ``(H,)`` or ``(B, H)``
    adds ALiBi's ``-slope * |i + S - L - j|``; ``window_size = (left, right)`` lets
    query ``i`` see only keys ``j`` in ``[i + S - L - left, i + S - L + right]``
    (:func:`key_range`). Key blocks entirely after the causal diagonal or outside the
    window are skipped, so at a fixed window the time grows linearly with the length.
    Shapes follow
    :mod:`attnbook.contract`: ``q (..., H, L, E)``, ``k (..., Hkv, S, E)``, ``v (...,
    Hkv, S, Ev)`` -> ``out (..., H, L, Ev)``, ``lse (..., H, L)`` (float32 or float64).
    ``scale`` defaults to ``1 / sqrt(E)``, the tiles to :func:`plan_tiles`. Under
    grouped-query attention the ``H / Hkv`` query heads that share a key head are
    stacked into the rows of one query tile, so every key tile is read once for all of
    them and no copy of K and V is made. Besides the output, the largest temporary is
    one ``(H / Hkv) block_q x block_k`` score tile per key head.
    """
    fn = "flash_forward"
    check_qkv(fn, q, k, v)
    rank = max(q.dim(), k.dim())
    q, k, v, batch = _as_4d(q, k, v)
    is_causal = _check_flag(fn, "is_causal", is_causal)
    scale = _check_scale(fn, scale)
    _check_head_dim(fn, q, scale)
    block_q, block_k = _check_tiles(fn, block_q, block_k, q, v)
    window, slopes, softcap = check_attention_options(
        fn, q, window_size, alibi_slopes, softcap
    )
    (B, H, L, E), (Hkv, S, Ev) = q.shape, v.shape[1:]
    scale, g = default_scale(scale, E), _group(H, Hkv)
    acc_dtype = _accumulation_dtype(q)
    # (B Hkv, g, L, E): the g query heads of a key head side by side
    q = q.reshape(B * Hkv, g, L, E)
    k, v = k.reshape(B * Hkv, S, E), v.reshape(B * Hkv, S, Ev)
    out = q.new_empty(B * Hkv, g, L, Ev)
    lse = q.new_empty(B * Hkv, g, L, dtype=acc_dtype)
    masked = is_causal or slopes is not None or softcap or window != (-1, -1)
    for i0 in range(0, L, block_q):
        i1 = min(i0 + block_q, L)
        rows = torch.arange(i0, i1, device=q.device)
        n = g * (i1 - i0)  # the block's rows of all g heads (sizes, not -1: B may be 0)
        qi = (q[:, :, i0:i1].to(acc_dtype) * scale).reshape(B * Hkv, n, E)
        m = qi.new_full(qi.shape[:2], -math.inf)
        l, acc = qi.new_zeros(qi.shape[:2]), qi.new_zeros(*qi.shape[:2], Ev)
        # only the keys some row of the block may see (causal diagonal, window)
        lo, hi = key_range(i0, i1, L, S, is_causal=is_causal, window_size=window)
        for j0 in range(lo, hi, block_k):
            j1 = min(j0 + block_k, hi)
            kj, vj = k[:, j0:j1].to(acc_dtype), v[:, j0:j1].to(acc_dtype)
            s = torch.bmm(qi, kj.transpose(1, 2))  # (B Hkv, g rows, cols)
            if masked:
                cols = torch.arange(j0, j1, device=q.device)
                s = _tile_scores(s.view(B, H, i1 - i0, j1 - j0), rows, cols, L, S,
                                 is_causal, window, slopes, softcap)[0]  # fmt: skip
                s = s.reshape(B * Hkv, n, j1 - j0)
            m, l, acc = _fold_tile(m, l, s, acc, vj)
        out[:, :, i0:i1] = (acc / torch.where(l > 0, l, 1.0)[..., None]).view(
            B * Hkv, g, i1 - i0, Ev
        )
        lse[:, :, i0:i1] = torch.where(l > 0, m + torch.log(l), -math.inf).view(
            B * Hkv, g, i1 - i0
        )
    out, lse = out.view(B, H, L, Ev), lse.view(B, H, L)
    return _from_4d(out, batch, rank), _from_4d(lse, batch, rank)


def _check_tiles(fn, block_q, block_k, q, v) -> tuple[int, int]:
    """``block_q`` and ``block_k``: positive integers, or None (:func:`plan_tiles`)."""
    planned = plan_tiles(max(q.shape[-1], 1), max(v.shape[-1], 1), dtype=q.dtype)
    block_q = planned[0] if block_q is None else _check_int(fn, "block_q", block_q)
    block_k = planned[1] if block_k is None else _check_int(fn, "block_k", block_k)
    return block_q, block_k


def flash_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    alibi_slopes: torch.Tensor | None = None,
    softcap: float = 0.0,
    block_q: int | None = None,
    block_k: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(dq, dk, dv)`` of attention, recomputing the probabilities tile by
    tile.

    With ``P_ij = exp(S_ij - lse_i)`` rebuilt from ``q, k`` and the saved ``lse``, and
    the pre-pass ``delta_i = rowsum(dO_i * O_i)`` (equal to ``sum_j P_ij dP_ij``), every
    tile contributes

        ``dV_j += P^T dO_i``, ``dP = dO_i V_j^T``, ``dS = P * (dP - delta_i)``,
        ``dQ_i += dS K_j * scale``, ``dK_j += dS^T Q_i * scale``.

    With ``softcap``, ``dS`` is multiplied by the cap's derivative ``1 - tanh^2(S /
    softcap)`` before it reaches ``dQ`` and ``dK``; ALiBi's bias and the window need
    nothing more (the same tiles are skipped). For MQA/GQA the query heads that share a
    key head are rows of one tile, as in :func:`flash_forward`, so the
    products ``P^T dO`` and ``dS^T Q`` sum their key/value gradients without a copy of
    K and V. Shapes ``(B, H, L, E)`` as
    :func:`attnbook.attend.flash_attention` saves them;
    ``grad_out`` is like ``out``; tiles from :func:`plan_tiles` unless given. Computed
    in float32 (float64 for float64 ``q``), whatever ``lse``'s dtype.
    """
    fn = "flash_backward"
    check_qkv(fn, q, k, v)
    if q.dim() != 4 or k.dim() != 4 or q.shape[0] != k.shape[0]:
        raise ValueError(
            f"{fn}: takes (B, H, L, E) tensors with one batch size, got q "
            f"{tuple(q.shape)} and k {tuple(k.shape)}"
        )
    for name, t in (("out", out), ("lse", lse), ("grad_out", grad_out)):
        check_float(fn, name, t)
    out_shape = (*q.shape[:3], v.shape[-1])
    if (
        tuple(out.shape) != out_shape
        or tuple(grad_out.shape) != out_shape
        or tuple(lse.shape) != tuple(q.shape[:3])
    ):
        raise ValueError(
            f"{fn}: out and grad_out must be (B, H, L, Ev) = {out_shape} and lse (B, "
            f"H, L) = {tuple(q.shape[:3])}; got out {tuple(out.shape)}, grad_out "
            f"{tuple(grad_out.shape)}, lse {tuple(lse.shape)}"
        )
    is_causal = _check_flag(fn, "is_causal", is_causal)
    scale = _check_scale(fn, scale)
    _check_head_dim(fn, q, scale)
    block_q, block_k = _check_tiles(fn, block_q, block_k, q, v)
    window, slopes, softcap = check_attention_options(
        fn, q, window_size, alibi_slopes, softcap
    )
    (B, H, L, E), (Hkv, S, Ev) = q.shape, v.shape[1:]
    scale, g = default_scale(scale, E), _group(H, Hkv)
    acc_dtype = _accumulation_dtype(q)
    # (B Hkv, g, L, .): the g query heads of a key head side by side, as in the forward
    qa, do, o = (
        x.reshape(B * Hkv, g, L, x.shape[-1]).to(acc_dtype) for x in (q, grad_out, out)
    )
    ka, va = (x.reshape(B * Hkv, S, x.shape[-1]).to(acc_dtype) for x in (k, v))
    delta = (do * o).sum(dim=-1)  # (B Hkv, g, L)
    # rows that see nothing: P = 0
    lse = lse.to(acc_dtype).reshape(B * Hkv, g, L)
    lse_safe = torch.where(torch.isfinite(lse), lse, math.inf)
    dq, dk, dv = torch.zeros_like(qa), torch.zeros_like(ka), torch.zeros_like(va)
    for i0 in range(0, L, block_q):
        i1 = min(i0 + block_q, L)
        rows = torch.arange(i0, i1, device=q.device)
        n = g * (i1 - i0)  # the block's rows of all g heads (sizes, not -1: B may be 0)
        qi, doi = (x[:, :, i0:i1].reshape(B * Hkv, n, x.shape[-1]) for x in (qa, do))
        lse_i = lse_safe[:, :, i0:i1].reshape(B * Hkv, n, 1)
        delta_i = delta[:, :, i0:i1].reshape(B * Hkv, n, 1)
        dqi = qi.new_zeros(qi.shape)
        lo, hi = key_range(i0, i1, L, S, is_causal=is_causal, window_size=window)
        for j0 in range(lo, hi, block_k):
            j1 = min(j0 + block_k, hi)
            kj, vj = ka[:, j0:j1], va[:, j0:j1]
            cols = torch.arange(j0, j1, device=q.device)
            s, tanh = _tile_scores(
                (qi @ kj.transpose(-1, -2) * scale).view(B, H, i1 - i0, j1 - j0),
                rows, cols, L, S, is_causal, window, slopes, softcap,
            )  # fmt: skip
            s = s.reshape(B * Hkv, n, j1 - j0)
            p = torch.exp(s - lse_i)
            dv[:, j0:j1] += p.transpose(-1, -2) @ doi  # sums over the g heads' rows
            ds = p * (doi @ vj.transpose(-1, -2) - delta_i)
            if tanh is not None:  # d(softcap tanh(x / softcap)) / dx = 1 - tanh^2
                ds = ds * (1 - tanh * tanh).reshape(ds.shape)
            dqi += ds @ kj * scale
            dk[:, j0:j1] += ds.transpose(-1, -2) @ qi * scale
        dq[:, :, i0:i1] = dqi.view(B * Hkv, g, i1 - i0, E)
    dq = dq.view(B, H, L, E)
    dk, dv = dk.view(B, Hkv, S, E), dv.view(B, Hkv, S, Ev)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _group(H: int, Hkv: int) -> int:
    """Query heads per key/value head (0 when there are no heads at all)."""
    return H // Hkv if Hkv else 0



# --------------------------------------------------------------------------------------
# IO complexity
# --------------------------------------------------------------------------------------
def hbm_accesses(
    seq_len: int, head_dim: int, sram_bytes: int, bytes_per_element: int = 2
) -> dict[str, int]:
    """Elements read from and written to slow memory (HBM) by one head's attention
    forward pass.

    * ``"standard"``: read ``Q, K`` and write ``S = Q K^T``; read ``S``, write ``P =
      softmax(S)``; read ``P, V``, write ``O``: ``4 N d + 4 N^2`` elements, i.e.
      ``Theta(N d + N^2)``.
    * ``"flash"``: tiles of ``B = floor(M / (4 d))`` rows (a ``Q``, ``K``, ``V`` and
      output tile fit in ``M = sram_bytes / bytes_per_element`` elements of SRAM), ``1
      <= B <= N``. Each query tile is read once and its output written once (``2 N d``),
      and for each of the ``ceil(N / B)`` query tiles all of ``K`` and ``V`` stream
      through (``2 N d`` each time): ``2 N d + 2 N d ceil(N / B) = Theta(N^2 d^2 / M)``
      once ``B < N``.
    """
    fn = "hbm_accesses"
    n, d = _check_int(fn, "seq_len", seq_len), _check_int(fn, "head_dim", head_dim)
    _check_int(fn, "sram_bytes", sram_bytes)
    _check_int(fn, "bytes_per_element", bytes_per_element)
    m = sram_bytes // bytes_per_element
    block = min(n, max(1, m // (4 * d)))
    return {
        "standard": 4 * n * d + 4 * n * n,
        "flash": 2 * n * d + 2 * n * d * -(-n // block),
    }
