"""FlashAttention forward and backward, dense and block-sparse, as Triton kernels (Dao,
2023).

Work partitioning of FlashAttention-2 (and of Triton's fused-attention tutorial):

* forward: one program per (query tile, batch x head). It keeps its query tile in SRAM,
  streams the key/value tiles, and updates the online-softmax state ``(m, l, acc)`` in
  registers; it writes the output tile and the row log-sum-exp ``lse`` once.
* backward: a pre-pass ``delta = rowsum(dO * O)``; a dK/dV kernel with one program per
  (key tile, batch x head) that streams the query tiles; a dQ kernel with one program
  per (query tile, batch x head) that streams the key tiles. Probabilities are
  recomputed from ``(q, k, lse)``.
* block-sparse: the same three kernels, but each tile visits only the tiles its row
  (or, for dK/dV, its column) of a block mask lists, as compressed-sparse-row
  (column) indices, so skipped tiles cost nothing. A mask block may hold several
  kernel tiles (a 128-token block is walked in 64-row tiles).

Inputs are ``(batch, heads, seq, head_dim)`` with any strides (a ``(B, L, H, E)``
tensor transposed to ``(B, H, L, E)`` is read where it lies, not copied); batch and
head offsets are 64-bit. Keys/values may have fewer heads (MQA/GQA: query head ``h``
reads key head ``h // (H / Hkv)``) and values another width than keys. Any head dim up
to 256: the tile is padded to the next power of two (at least 16) and the extra
columns masked. Any sequence length: tails are masked. Causal masks are bottom-right
aligned (query ``i`` sees keys ``j <= i + S - L``). Scores use ``exp2`` with the scale
folded into ``log2(e) * scale``. On a GPU the tile configuration is autotuned over
:data:`attnbook.kernels.tuning.SPACE`, pruned to what the GPU's generation fits; on CPU
the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``), in float32 and
float16 only, with one small tile.

The launchers are private and named after their PyTorch twins: ``_flash_forward`` and
``_flash_backward`` (:func:`attnbook.flash.flash_forward` and
:func:`~attnbook.flash.flash_backward`), ``_block_sparse_attention_forward`` and
``_block_sparse_attention_backward`` (:func:`attnbook.sparse.block_sparse_attention`),
``_varlen_forward`` and ``_varlen_backward`` (packed sequences). They trust their
arguments: the entry points of :mod:`attnbook.attend` validate them once (the contract,
then what these kernels take: head dims up to :data:`MAX_HEAD_DIM`, float16, bfloat16
or float32, each head's rows within 32-bit offsets
(:func:`attnbook.kernels.check_addressing`), mask blocks of a power of two >= 16) and
call them.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._renamed import renamed
from ..contract import check_sizes
from . import tuning
from ._compat import mend_interpreter
from .tuning import Config, padded_head_dim

mend_interpreter()  # older Triton interpreters and NumPy 2.5: see _compat

__all__ = [
    "MAX_HEAD_DIM",
    "variants",
]

#: The launchers, private, each with its PyTorch twin: what they compute, in tiles.
_LAUNCHERS = {
    "_flash_forward": "attnbook.flash.flash_forward",
    "_flash_backward": "attnbook.flash.flash_backward",
    "_block_sparse_attention_forward": "attnbook.sparse.block_sparse_attention",
    "_block_sparse_attention_backward": "attnbook.sparse.block_sparse_attention",
    "_varlen_forward": None,  # PyTorch runs each packed sequence alone
    "_varlen_backward": None,
}

_LOG2E = 1.4426950408889634
#: The widest head the kernels take (FlashAttention-2's limit too).
MAX_HEAD_DIM = 256


# --------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------
@triton.jit
def _heads(bh, H, H_KV):
    """Batch index, query head and the key/value head it reads (GQA) of grid row
    ``bh``, as 64-bit integers: base offsets may pass 2^31 elements."""
    b = bh // H
    h = bh % H
    kv_h = h // (H // H_KV)
    return b.to(tl.int64), h.to(tl.int64), kv_h.to(tl.int64)


@triton.jit
def _sequence(b, CU_Q, CU_K, L, S, VARLEN: tl.constexpr):
    """The first query row and key row of sequence ``b`` and its lengths: row 0 and
    ``(L, S)`` for every sequence of a padded batch; read from the ``cu_seqlens``
    offsets of packed sequences (``VARLEN``)."""
    q0 = b * 0
    k0 = b * 0
    if VARLEN:
        q0 = tl.load(CU_Q + b).to(tl.int64)
        k0 = tl.load(CU_K + b).to(tl.int64)
        L = (tl.load(CU_Q + b + 1) - q0).to(tl.int32)
        S = (tl.load(CU_K + b + 1) - k0).to(tl.int32)
    return q0, k0, L, S


@triton.jit
def _load_tile(
    base,
    rows,
    cols,
    stride_row,
    stride_col,
    n_rows,
    WIDTH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The tile ``base[rows, cols]``; rows past ``n_rows`` and the columns that pad a
    head of ``WIDTH`` to ``BLOCK`` read as zero (and so add nothing to a product)."""
    mask = rows[:, None] < n_rows
    if WIDTH != BLOCK:
        mask = mask & (cols[None, :] < WIDTH)
    ptrs = base + rows[:, None] * stride_row + cols[None, :] * stride_col
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _store_tile(
    base,
    value,
    rows,
    cols,
    stride_row,
    stride_col,
    n_rows,
    WIDTH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Store ``value`` into ``base[rows, cols]`` for the rows below ``n_rows`` and the
    first ``WIDTH`` columns."""
    mask = rows[:, None] < n_rows
    if WIDTH != BLOCK:
        mask = mask & (cols[None, :] < WIDTH)
    ptrs = base + rows[:, None] * stride_row + cols[None, :] * stride_col
    tl.store(ptrs, value.to(base.dtype.element_ty), mask=mask)


@triton.jit
def _tanh(x):
    """``tanh(x) = 1 - 2 / (e^{2x} + 1)``: exact limits ``+-1`` where ``e^{2x}``
    overflows or vanishes."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _scores(
    q,
    k,
    offs_m,
    offs_n,
    L,
    S,
    qk_scale,
    softcap,
    slope,
    left,
    right,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    ALIBI: tl.constexpr,
    SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One tile's scores in log2 units (``log2(e) * score``), ``-inf`` where masked,
    and ``tanh(score / softcap)`` for the backward pass (unused without ``SOFTCAP``).

    In FlashAttention-2's order: the scaled product, capped (``softcap * tanh(x /
    softcap)``), ALiBi's ``- slope * |i + S - L - j|`` added, then the causal mask and
    the window ``[i + S - L - left, i + S - L + right]``."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    t = s
    if SOFTCAP:  # the natural-units score is s / log2(e)
        t = _tanh(s / (softcap * 1.4426950408889634))
        s = (softcap * 1.4426950408889634) * t
    diagonal = offs_m[:, None] + (S - L)  # each query's position among the keys
    if ALIBI:  # slope in log2 units
        s = s - slope * tl.abs(diagonal - offs_n[None, :]).to(tl.float32)
    valid = offs_n[None, :] < S
    if CAUSAL:
        valid = valid & (offs_n[None, :] <= diagonal)
    if WINDOW:
        valid = valid & (offs_n[None, :] >= diagonal - left)
        valid = valid & (offs_n[None, :] <= diagonal + right)
    return tl.where(valid, s, float("-inf")), t


@triton.jit
def _key_range(
    m0,
    L,
    S,
    left,
    right,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
):
    """The key tiles ``[lo, hi)`` query rows ``m0 .. m0 + BLOCK_M - 1`` may see (the
    causal diagonal and the window bound them): the tiles outside are never loaded."""
    hi = S
    if CAUSAL:  # the tile's last row sees keys up to m0 + BLOCK_M - 1 + S - L
        hi = tl.minimum(S, m0 + BLOCK_M + S - L)
    lo = 0
    if WINDOW:
        hi = tl.minimum(hi, m0 + BLOCK_M + S - L + right)
        lo = tl.maximum(0, m0 + S - L - left) // BLOCK_N * BLOCK_N
    return lo, tl.where(m0 < L, hi, 0)


@triton.jit
def _attend_tile(
    q,
    m_i,
    l_i,
    acc,
    K,
    V,
    start_n,
    offs_m,
    offs_d,
    offs_dv,
    stride_ks,
    stride_kd,
    stride_vs,
    stride_vd,
    L,
    S,
    qk_scale,
    softcap,
    slope,
    left,
    right,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    V_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    ALIBI: tl.constexpr,
    SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Online-softmax update of one query tile's state with the key/value tile starting
    at ``start_n`` (``K``, ``V`` point at this head's keys and values)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = _load_tile(K, offs_n, offs_d, stride_ks, stride_kd, S, HEAD_DIM, BLOCK_D)
    v = _load_tile(V, offs_n, offs_dv, stride_vs, stride_vd, S, V_DIM, BLOCK_DV)
    s, _ = _scores(
        q, k, offs_m, offs_n, L, S, qk_scale, softcap, slope, left, right,
        CAUSAL, WINDOW, ALIBI, SOFTCAP, PRECISION,
    )  # fmt: skip
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # a row that has seen nothing yet
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - shift[:, None])
    alpha = tl.math.exp2(m_i - shift)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _fwd_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    ROW_PTR,
    COL_IDX,
    CU_Q,
    CU_K,
    ALIBI_SLOPES,
    stride_qb,
    stride_qh,
    stride_ql,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_vd,
    stride_ob,
    stride_oh,
    stride_ol,
    stride_od,
    stride_rqb,
    stride_rqh,
    qk_scale,
    softcap,
    H,
    H_KV,
    L,
    S,
    MASK_BLOCK,
    left,
    right,
    HEAD_DIM: tl.constexpr,
    V_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPARSE: tl.constexpr,
    VARLEN: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    ALIBI: tl.constexpr,
    SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h, kv_h = _heads(bh, H, H_KV)
    q0, k0, L, S = _sequence(b, CU_Q, CU_K, L, S, VARLEN)
    Q += b * stride_qb + h * stride_qh + q0 * stride_ql
    K += b * stride_kb + kv_h * stride_kh + k0 * stride_ks
    V += b * stride_vb + kv_h * stride_vh + k0 * stride_vs
    O += b * stride_ob + h * stride_oh + q0 * stride_ol
    LSE += b * stride_rqb + h * stride_rqh + q0
    slope = 0.0
    if ALIBI:
        slope = tl.load(ALIBI_SLOPES + b * H + h) * 1.4426950408889634
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    q = _load_tile(Q, offs_m, offs_d, stride_ql, stride_qd, L, HEAD_DIM, BLOCK_D)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    lo, hi = _key_range(
        pid_m * BLOCK_M, L, S, left, right, BLOCK_M, BLOCK_N, CAUSAL, WINDOW
    )
    if not SPARSE:
        for start_n in range(lo, hi, BLOCK_N):
            m_i, l_i, acc = _attend_tile(
                q, m_i, l_i, acc, K, V, start_n, offs_m, offs_d, offs_dv,
                stride_ks, stride_kd, stride_vs, stride_vd, L, S, qk_scale,
                softcap, slope, left, right, BLOCK_N, HEAD_DIM, V_DIM, BLOCK_D,
                BLOCK_DV, CAUSAL, WINDOW, ALIBI, SOFTCAP, PRECISION,
            )  # fmt: skip
    else:  # only the key blocks listed for this tile's row of the block mask
        row = pid_m * BLOCK_M // MASK_BLOCK
        first, last = tl.load(ROW_PTR + row), tl.load(ROW_PTR + row + 1)
        for idx in range(first, last):
            start = tl.load(COL_IDX + idx) * MASK_BLOCK
            end = tl.minimum(start + MASK_BLOCK, hi)
            for start_n in range(tl.maximum(start, lo), end, BLOCK_N):
                m_i, l_i, acc = _attend_tile(
                    q, m_i, l_i, acc, K, V, start_n, offs_m, offs_d, offs_dv,
                    stride_ks, stride_kd, stride_vs, stride_vd, L, S, qk_scale,
                    softcap, slope, left, right, BLOCK_N, HEAD_DIM, V_DIM, BLOCK_D,
                    BLOCK_DV, CAUSAL, WINDOW, ALIBI, SOFTCAP, PRECISION,
                )  # fmt: skip
    # out = acc / l and lse = (m + log2 l) * ln 2; zeros and -inf for empty rows
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    lse = (m_i + tl.math.log2(l_safe)) / 1.4426950408889634
    _store_tile(
        O, acc / l_safe[:, None], offs_m, offs_dv, stride_ol, stride_od, L, V_DIM,
        BLOCK_DV,
    )  # fmt: skip
    tl.store(LSE + offs_m, tl.where(l_i > 0, lse, -float("inf")), mask=offs_m < L)


@triton.jit
def _bwd_delta_kernel(
    O,
    DO,
    DELTA,
    CU_Q,
    stride_ob,
    stride_oh,
    stride_ol,
    stride_od,
    stride_gb,
    stride_gh,
    stride_gl,
    stride_gd,
    stride_rqb,
    stride_rqh,
    H,
    L,
    V_DIM: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    VARLEN: tl.constexpr,
):
    """Pre-pass: ``delta_i = sum_d dO_id * O_id`` for one tile of rows."""
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = (bh // H).to(tl.int64), (bh % H).to(tl.int64)
    q0, _, L, _ = _sequence(b, CU_Q, CU_Q, L, L, VARLEN)
    offs_m, offs_dv = pid_m * BLOCK_M + tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_DV)
    o = _load_tile(
        O + b * stride_ob + h * stride_oh + q0 * stride_ol,
        offs_m, offs_dv, stride_ol, stride_od, L, V_DIM, BLOCK_DV,
    )  # fmt: skip
    do = _load_tile(
        DO + b * stride_gb + h * stride_gh + q0 * stride_gl,
        offs_m, offs_dv, stride_gl, stride_gd, L, V_DIM, BLOCK_DV,
    )  # fmt: skip
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    DELTA += b * stride_rqb + h * stride_rqh + q0
    tl.store(DELTA + offs_m, delta, mask=offs_m < L)


@triton.jit
def _recompute_p(
    q,
    k,
    lse,
    offs_m,
    offs_n,
    L,
    S,
    qk_scale,
    softcap,
    slope,
    left,
    right,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    ALIBI: tl.constexpr,
    SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Probabilities of one tile, ``P = 2^(log2(e) (score - lse))``, zero where masked
    (and for rows that see nothing); and the softcap's ``tanh`` for ``dS``."""
    s, t = _scores(
        q, k, offs_m, offs_n, L, S, qk_scale, softcap, slope, left, right,
        CAUSAL, WINDOW, ALIBI, SOFTCAP, PRECISION,
    )  # fmt: skip
    rows = (offs_m < L) & (lse > float("-inf"))
    lse2 = tl.where(rows, lse * 1.4426950408889634, 0.0)
    return tl.where(rows[:, None], tl.math.exp2(s - lse2[:, None]), 0.0), t


@triton.jit
def _dkdv_tile(
    dk,
    dv,
    k,
    v,
    Q,
    DO,
    LSE,
    DELTA,
    start_m,
    offs_n,
    offs_d,
    offs_dv,
    stride_ql,
    stride_qd,
    stride_gl,
    stride_gd,
    L,
    S,
    qk_scale,
    softcap,
    slope,
    left,
    right,
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    V_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    ALIBI: tl.constexpr,
    SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Add one query tile's share to a key tile's ``dK`` and ``dV``."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = _load_tile(Q, offs_m, offs_d, stride_ql, stride_qd, L, HEAD_DIM, BLOCK_D)
    do = _load_tile(DO, offs_m, offs_dv, stride_gl, stride_gd, L, V_DIM, BLOCK_DV)
    lse = tl.load(LSE + offs_m, mask=offs_m < L, other=float("-inf"))
    delta = tl.load(DELTA + offs_m, mask=offs_m < L, other=0.0)
    p, t = _recompute_p(
        q, k, lse, offs_m, offs_n, L, S, qk_scale, softcap, slope, left, right,
        CAUSAL, WINDOW, ALIBI, SOFTCAP, PRECISION,
    )  # fmt: skip
    dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    ds = p * (dp - delta[:, None])
    if SOFTCAP:  # d(softcap tanh(x / softcap)) / dx = 1 - tanh^2
        ds = ds * (1.0 - t * t)
    dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    return dk, dv


@triton.jit
def _query_range(
    n0,
    L,
    S,
    left,
    right,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
):
    """The query tiles ``[lo, hi)`` that may see keys ``n0 .. n0 + BLOCK_N - 1``."""
    lo = 0
    hi = L
    if CAUSAL:  # the first query row that sees key n0: i >= n0 - (S - L)
        lo = tl.maximum(0, n0 - (S - L))
    if WINDOW:
        lo = tl.maximum(lo, n0 - (S - L) - right)
        hi = tl.minimum(L, n0 + BLOCK_N - (S - L) + left)
    return lo // BLOCK_M * BLOCK_M, tl.where(n0 < S, hi, 0)


@triton.jit
def _bwd_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DK,
    DV,
    COL_PTR,
    ROW_IDX,
    CU_Q,
    CU_K,
    ALIBI_SLOPES,
    stride_qb,
    stride_qh,
    stride_ql,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_vd,
    stride_gb,
    stride_gh,
    stride_gl,
    stride_gd,
    stride_rqb,
    stride_rqh,
    stride_rkb,
    stride_rkh,
    sm_scale,
    qk_scale,
    softcap,
    H,
    H_KV,
    L,
    S,
    MASK_BLOCK,
    left,
    right,
    HEAD_DIM: tl.constexpr,
    V_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPARSE: tl.constexpr,
    VARLEN: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    ALIBI: tl.constexpr,
    SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """dK, dV of one key tile for one query head, in float32 (heads that share a key
    head under GQA are summed afterwards)."""
    pid_n, bh = tl.program_id(0), tl.program_id(1)
    b, h, kv_h = _heads(bh, H, H_KV)
    q0, k0, L, S = _sequence(b, CU_Q, CU_K, L, S, VARLEN)
    Q += b * stride_qb + h * stride_qh + q0 * stride_ql
    K += b * stride_kb + kv_h * stride_kh + k0 * stride_ks
    V += b * stride_vb + kv_h * stride_vh + k0 * stride_vs
    DO += b * stride_gb + h * stride_gh + q0 * stride_gl
    LSE += b * stride_rqb + h * stride_rqh + q0
    DELTA += b * stride_rqb + h * stride_rqh + q0
    slope = 0.0
    if ALIBI:
        slope = tl.load(ALIBI_SLOPES + b * H + h) * 1.4426950408889634
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    k = _load_tile(K, offs_n, offs_d, stride_ks, stride_kd, S, HEAD_DIM, BLOCK_D)
    v = _load_tile(V, offs_n, offs_dv, stride_vs, stride_vd, S, V_DIM, BLOCK_DV)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    lo, hi = _query_range(
        pid_n * BLOCK_N, L, S, left, right, BLOCK_M, BLOCK_N, CAUSAL, WINDOW
    )
    if not SPARSE:
        for start_m in range(lo, hi, BLOCK_M):
            dk, dv = _dkdv_tile(
                dk, dv, k, v, Q, DO, LSE, DELTA, start_m, offs_n, offs_d, offs_dv,
                stride_ql, stride_qd, stride_gl, stride_gd, L, S, qk_scale, softcap,
                slope, left, right, BLOCK_M, HEAD_DIM, V_DIM, BLOCK_D, BLOCK_DV,
                CAUSAL, WINDOW, ALIBI, SOFTCAP, PRECISION,
            )  # fmt: skip
    else:  # only the query blocks listed for this tile's column of the block mask
        col = pid_n * BLOCK_N // MASK_BLOCK
        first, last = tl.load(COL_PTR + col), tl.load(COL_PTR + col + 1)
        for idx in range(first, last):
            start = tl.load(ROW_IDX + idx) * MASK_BLOCK
            end = tl.minimum(start + MASK_BLOCK, hi)
            for start_m in range(tl.maximum(start, lo), end, BLOCK_M):
                dk, dv = _dkdv_tile(
                    dk, dv, k, v, Q, DO, LSE, DELTA, start_m, offs_n, offs_d,
                    offs_dv, stride_ql, stride_qd, stride_gl, stride_gd, L, S,
                    qk_scale, softcap, slope, left, right, BLOCK_M, HEAD_DIM, V_DIM,
                    BLOCK_D, BLOCK_DV, CAUSAL, WINDOW, ALIBI, SOFTCAP, PRECISION,
                )  # fmt: skip
    rows = b * stride_rkb + h * stride_rkh + k0  # this head's first key row
    DK += rows * HEAD_DIM
    DV += rows * V_DIM
    _store_tile(DK, dk * sm_scale, offs_n, offs_d, HEAD_DIM, 1, S, HEAD_DIM, BLOCK_D)
    _store_tile(DV, dv, offs_n, offs_dv, V_DIM, 1, S, V_DIM, BLOCK_DV)


@triton.jit
def _dq_tile(
    dq,
    q,
    do,
    lse,
    delta,
    K,
    V,
    start_n,
    offs_m,
    offs_d,
    offs_dv,
    stride_ks,
    stride_kd,
    stride_vs,
    stride_vd,
    L,
    S,
    qk_scale,
    softcap,
    slope,
    left,
    right,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    V_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    ALIBI: tl.constexpr,
    SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Add one key tile's share to a query tile's ``dQ``."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = _load_tile(K, offs_n, offs_d, stride_ks, stride_kd, S, HEAD_DIM, BLOCK_D)
    v = _load_tile(V, offs_n, offs_dv, stride_vs, stride_vd, S, V_DIM, BLOCK_DV)
    p, t = _recompute_p(
        q, k, lse, offs_m, offs_n, L, S, qk_scale, softcap, slope, left, right,
        CAUSAL, WINDOW, ALIBI, SOFTCAP, PRECISION,
    )  # fmt: skip
    ds = p * (tl.dot(do, tl.trans(v), input_precision=PRECISION) - delta[:, None])
    if SOFTCAP:
        ds = ds * (1.0 - t * t)
    return dq + tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)


@triton.jit
def _bwd_dq_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    ROW_PTR,
    COL_IDX,
    CU_Q,
    CU_K,
    ALIBI_SLOPES,
    stride_qb,
    stride_qh,
    stride_ql,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_vd,
    stride_gb,
    stride_gh,
    stride_gl,
    stride_gd,
    stride_rqb,
    stride_rqh,
    sm_scale,
    qk_scale,
    softcap,
    H,
    H_KV,
    L,
    S,
    MASK_BLOCK,
    left,
    right,
    HEAD_DIM: tl.constexpr,
    V_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPARSE: tl.constexpr,
    VARLEN: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOW: tl.constexpr,
    ALIBI: tl.constexpr,
    SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """dQ of one query tile: streams the key/value tiles it sees."""
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h, kv_h = _heads(bh, H, H_KV)
    q0, k0, L, S = _sequence(b, CU_Q, CU_K, L, S, VARLEN)
    Q += b * stride_qb + h * stride_qh + q0 * stride_ql
    K += b * stride_kb + kv_h * stride_kh + k0 * stride_ks
    V += b * stride_vb + kv_h * stride_vh + k0 * stride_vs
    DO += b * stride_gb + h * stride_gh + q0 * stride_gl
    rows = b * stride_rqb + h * stride_rqh + q0  # this head's first query row
    slope = 0.0
    if ALIBI:
        slope = tl.load(ALIBI_SLOPES + b * H + h) * 1.4426950408889634
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    q = _load_tile(Q, offs_m, offs_d, stride_ql, stride_qd, L, HEAD_DIM, BLOCK_D)
    do = _load_tile(DO, offs_m, offs_dv, stride_gl, stride_gd, L, V_DIM, BLOCK_DV)
    lse = tl.load(LSE + rows + offs_m, mask=offs_m < L, other=-float("inf"))
    delta = tl.load(DELTA + rows + offs_m, mask=offs_m < L, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo, hi = _key_range(
        pid_m * BLOCK_M, L, S, left, right, BLOCK_M, BLOCK_N, CAUSAL, WINDOW
    )
    if not SPARSE:
        for start_n in range(lo, hi, BLOCK_N):
            dq = _dq_tile(
                dq, q, do, lse, delta, K, V, start_n, offs_m, offs_d, offs_dv,
                stride_ks, stride_kd, stride_vs, stride_vd, L, S, qk_scale, softcap,
                slope, left, right, BLOCK_N, HEAD_DIM, V_DIM, BLOCK_D, BLOCK_DV,
                CAUSAL, WINDOW, ALIBI, SOFTCAP, PRECISION,
            )  # fmt: skip
    else:
        row = pid_m * BLOCK_M // MASK_BLOCK
        first, last = tl.load(ROW_PTR + row), tl.load(ROW_PTR + row + 1)
        for idx in range(first, last):
            start = tl.load(COL_IDX + idx) * MASK_BLOCK
            end = tl.minimum(start + MASK_BLOCK, hi)
            for start_n in range(tl.maximum(start, lo), end, BLOCK_N):
                dq = _dq_tile(
                    dq, q, do, lse, delta, K, V, start_n, offs_m, offs_d, offs_dv,
                    stride_ks, stride_kd, stride_vs, stride_vd, L, S, qk_scale,
                    softcap, slope, left, right, BLOCK_N, HEAD_DIM, V_DIM, BLOCK_D,
                    BLOCK_DV, CAUSAL, WINDOW, ALIBI, SOFTCAP, PRECISION,
                )  # fmt: skip
    DQ += rows * HEAD_DIM
    _store_tile(DQ, dq * sm_scale, offs_m, offs_d, HEAD_DIM, 1, L, HEAD_DIM, BLOCK_D)


# --------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------
def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _precision(q: torch.Tensor) -> str:
    """float32 inputs use exact fp32 products ("ieee"), as torch's float32 matmul does;
    not TF32."""
    return "ieee" if q.dtype == torch.float32 else "tf32"


def _configs(
    kernel: str, q: torch.Tensor, width: int, mask_block: int | None = None
) -> list[Config]:
    """The tile configurations ``kernel`` may run with for ``q``: the interpreter's one
    on CPU; on a GPU the configurations of :data:`~attnbook.kernels.tuning.SPACE` that
    the compiled table says fit it (spilling ones only when nothing else fits), no
    tile larger than a mask block."""
    if _interpreted() and not q.is_cuda:
        config = tuning.INTERPRETER
        if mask_block is not None:
            return [
                Config(
                    min(config.block_m, mask_block),
                    min(config.block_n, mask_block),
                    config.num_warps,
                    config.num_stages,
                )
            ]
        return [config]
    capability = torch.cuda.get_device_capability(q.device)
    return _gpu_configs(kernel, capability, q.dtype, width, mask_block)


@functools.cache
def _gpu_configs(
    kernel: str,
    capability: tuple[int, int],
    dtype: torch.dtype,
    width: int,
    mask_block: int | None,
) -> tuple[Config, ...]:
    """:func:`_configs` on a GPU, read from the compiled table once per kernel, GPU,
    dtype, width and mask block (a call reads no table)."""
    found = []
    for allow_spills in (False, True):
        found = [
            config
            for config, _ in tuning.candidates(
                kernel, capability, dtype, width, allow_spills=allow_spills
            )
            if mask_block is None
            or (config.block_m <= mask_block and config.block_n <= mask_block)
        ]
        if found:
            break
    if not found:
        raise RuntimeError(
            f"{kernel}: no tile configuration fits compute capability "
            f"{capability[0]}.{capability[1]} for {dtype} at head dim {width}"
            + (f" and {mask_block}-token mask blocks" if mask_block else "")
            + ": use backend='torch' (attnbook.kernels.plan says why)"
        )
    return tuple(found)


def _launch(kernel: str, fn, grid, args: tuple, meta: dict, configs, key) -> None:
    """Launch ``fn`` over ``grid(config)`` with the configuration
    :func:`attnbook.kernels.tuning.pick` chooses among ``configs`` for ``key``."""
    tiles = ("BLOCK_M",) if kernel == "flash_bwd_delta" else ("BLOCK_M", "BLOCK_N")

    def run(config: Config):  # returns the compiled kernel (its n_spills, on a GPU)
        sizes = dict(zip(tiles, (config.block_m, config.block_n), strict=False))
        return fn[grid(config)](
            *args,
            **meta,
            **sizes,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )

    run(tuning.pick((kernel, *key), configs, run))


def _block_index(
    block_mask: torch.Tensor,
    device: torch.device,
    by_columns: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``block_mask`` (bool ``(ceil(L / block_size), ceil(S / block_size))``) as
    compressed-sparse-row indices ``(row_ptr, col_idx)``: row ``i``'s active key
    blocks are ``col_idx[row_ptr[i]:row_ptr[i + 1]]``. With ``by_columns``,
    compressed-sparse-column: each key block's active query blocks."""
    mask = block_mask.to(device)
    if by_columns:
        mask = mask.t()
    ptr = torch.zeros(mask.shape[0] + 1, dtype=torch.int32, device=device)
    ptr[1:] = mask.sum(dim=1).cumsum(0)
    index = mask.nonzero()[:, 1].to(torch.int32).contiguous()  # row-major order
    return ptr, index


_UNBOUNDED = 1 << 30  # a window side of -1: further than any sequence


@dataclass(frozen=True)
class _Layout:
    """Where a launch's rows live: a padded batch ``(B, H, L, E)``, or packed sequences
    ``(total, H, E)`` with ``cu_seqlens`` offsets (``varlen``)."""

    B: int
    H: int
    H_kv: int
    L: int  # the longest query sequence (the grid's rows)
    S: int
    E: int
    Ev: int
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    varlen: bool = False
    total_q: int = 0
    total_k: int = 0

    def strides(self, t: torch.Tensor) -> tuple[int, ...]:
        """``t``'s (batch, head, row, column) strides; packed rows carry the batch."""
        if self.varlen:
            return 0, t.stride(1), t.stride(0), t.stride(2)
        return tuple(t.stride())

    def rows(self, per_query: bool = True) -> tuple[int, int]:
        """(batch, head) strides, in rows, of the float32 buffers the launcher owns
        (lse, delta, dQ for queries; dK, dV for keys)."""
        n = self.L if per_query else self.S
        total = self.total_q if per_query else self.total_k
        return (0, total) if self.varlen else (self.H * n, n)


def _padded(q, k, v) -> _Layout:
    """The layout of ``(B, H, L, E)`` tensors."""
    none = torch.empty(0, dtype=torch.int32, device=q.device)
    B, H, L, E = q.shape
    return _Layout(B, H, k.shape[1], L, k.shape[2], E, v.shape[3], none, none)


def _options(q, layout, is_causal, window_size, alibi_slopes, softcap) -> tuple:
    """FlashAttention-2's fused options, as
    :func:`attnbook.contract.check_attention_options` passes them (``window_size`` two
    ints, ``alibi_slopes`` ``(H,)`` or ``(B, H)``), as kernel arguments and constexpr
    flags."""
    left, right = window_size
    slopes = (
        None
        if alibi_slopes is None
        else alibi_slopes.to(q.device, torch.float32).expand(layout.B, layout.H)
    )
    flags = {
        "CAUSAL": bool(is_causal),
        "WINDOW": left >= 0 or right >= 0,
        "ALIBI": slopes is not None,
        "SOFTCAP": bool(softcap),
    }
    if is_causal:  # the causal mask is a window's right side at 0
        right = 0 if right < 0 else min(right, 0)
    args = {
        "left": _UNBOUNDED if left < 0 else left,
        "right": _UNBOUNDED if right < 0 else right,
        "softcap": float(softcap) or 1.0,
        "slopes": (
            slopes.contiguous()
            if slopes is not None
            else torch.empty(0, dtype=torch.float32, device=q.device)
        ),
    }
    return args, flags


def _key(q, layout: _Layout, flags: dict, mask_block=None) -> tuple:
    """What the fastest tile depends on: the device, dtype, head dims, the masks and
    biases, the mask block, and the lengths rounded up to a power of two."""
    return (
        str(q.device),
        q.dtype,
        layout.E,
        layout.Ev,
        tuple(flags.values()),
        layout.varlen,
        mask_block,
        triton.next_power_of_2(layout.L),
        triton.next_power_of_2(layout.S),
    )


def _forward(q, k, v, layout, is_causal, scale, options, index=None, mask_block=None):
    """Launch the forward kernel, dense (``index`` None) or over a block mask's CSR
    ``index``, on a padded or packed ``layout``: ``(out, lse)``."""
    scale = 1.0 / math.sqrt(layout.E) if scale is None else scale
    args, flags = options
    if layout.varlen:
        out = q.new_empty(layout.total_q, layout.H, layout.Ev)
        lse = torch.empty(
            layout.H, layout.total_q, dtype=torch.float32, device=q.device
        )
    else:
        # the output in q's memory layout (a (B, L, H, E) view stays one) if it can be
        same = layout.Ev == layout.E
        out = torch.empty_like(q) if same else q.new_empty(*q.shape[:3], layout.Ev)
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    sparse = index is not None
    row_ptr, col_idx = (
        index if sparse else (layout.cu_q, layout.cu_q)
    )  # unused if dense
    kernel = "block_sparse_fwd" if sparse else "flash_fwd"
    _launch(
        kernel,
        _fwd_kernel,
        lambda c: (triton.cdiv(layout.L, c.block_m), layout.B * layout.H),
        (q, k, v, out, lse, row_ptr, col_idx, layout.cu_q, layout.cu_k, args["slopes"])
        + tuple(s for t in (q, k, v, out) for s in layout.strides(t))
        + layout.rows()
        + (scale * _LOG2E, args["softcap"], layout.H, layout.H_kv, layout.L, layout.S)
        + (mask_block or 16, args["left"], args["right"]),
        {
            "HEAD_DIM": layout.E,
            "V_DIM": layout.Ev,
            "BLOCK_D": padded_head_dim(layout.E),
            "BLOCK_DV": padded_head_dim(layout.Ev),
            "SPARSE": sparse,
            "VARLEN": layout.varlen,
            **flags,
            "PRECISION": _precision(q),
        },
        _configs(kernel, q, max(layout.E, layout.Ev), mask_block),
        _key(q, layout, flags, mask_block),
    )
    return out, lse


def _backward(
    q, k, v, out, lse, grad_out, layout, scale, options, indices=None, block=None
):
    """Launch the three backward kernels, dense or over a block mask's CSR and CSC
    ``indices``, on a padded or packed ``layout``: ``(dq, dk, dv)``."""
    B, H, H_kv, E, Ev = layout.B, layout.H, layout.H_kv, layout.E, layout.Ev
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    args, flags = options
    lse = lse.float().contiguous()
    delta = torch.empty_like(lse)
    grid_q = lambda c: (triton.cdiv(layout.L, c.block_m), B * H)  # noqa: E731
    _launch(
        "flash_bwd_delta",
        _bwd_delta_kernel,
        grid_q,
        (out, grad_out, delta, layout.cu_q, *layout.strides(out))
        + (*layout.strides(grad_out), *layout.rows(), H, layout.L),
        {"V_DIM": Ev, "BLOCK_DV": padded_head_dim(Ev), "VARLEN": layout.varlen},
        _configs("flash_bwd_delta", q, max(E, Ev)),
        _key(q, layout, flags),
    )
    sparse = indices is not None
    none = layout.cu_q
    (row_ptr, col_idx), (col_ptr, row_idx) = indices if sparse else ((none,) * 2,) * 2
    # dK, dV per query head in float32 (GQA heads are summed below); dQ like lse
    if layout.varlen:
        dq = q.new_empty(H, layout.total_q, E)
        dk = torch.empty(H, layout.total_k, E, dtype=torch.float32, device=q.device)
        dv = torch.empty(H, layout.total_k, Ev, dtype=torch.float32, device=q.device)
    else:
        dq = q.new_empty(B, H, layout.L, E)
        dk = torch.empty(B, H, layout.S, E, dtype=torch.float32, device=q.device)
        dv = torch.empty(B, H, layout.S, Ev, dtype=torch.float32, device=q.device)
    common = (layout.cu_q, layout.cu_k, args["slopes"])
    common += tuple(s for t in (q, k, v, grad_out) for s in layout.strides(t))
    sizes = (H, H_kv, layout.L, layout.S, block or 16, args["left"], args["right"])
    scales = (scale, scale * _LOG2E, args["softcap"])
    meta = {
        "HEAD_DIM": E,
        "V_DIM": Ev,
        "BLOCK_D": padded_head_dim(E),
        "BLOCK_DV": padded_head_dim(Ev),
        "SPARSE": sparse,
        "VARLEN": layout.varlen,
        **flags,
        "PRECISION": _precision(q),
    }
    prefix = "block_sparse" if sparse else "flash"
    key = _key(q, layout, flags, block)
    _launch(
        f"{prefix}_bwd_dkdv",
        _bwd_dkdv_kernel,
        lambda c: (triton.cdiv(layout.S, c.block_n), B * H),
        (q, k, v, grad_out, lse, delta, dk, dv, col_ptr, row_idx, *common)
        + layout.rows()
        + layout.rows(per_query=False)
        + scales
        + sizes,
        meta,
        _configs(f"{prefix}_bwd_dkdv", q, max(E, Ev), block),
        key,
    )
    _launch(
        f"{prefix}_bwd_dq",
        _bwd_dq_kernel,
        grid_q,
        (q, k, v, grad_out, lse, delta, dq, row_ptr, col_idx, *common)
        + layout.rows()
        + scales
        + sizes,
        meta,
        _configs(f"{prefix}_bwd_dq", q, max(E, Ev), block),
        key,
    )
    group = H // H_kv
    if layout.varlen:  # (H, total, E) -> (total, H, E)
        dk = dk.view(H_kv, group, layout.total_k, E).sum(dim=1).transpose(0, 1)
        dv = dv.view(H_kv, group, layout.total_k, Ev).sum(dim=1).transpose(0, 1)
        dq = dq.transpose(0, 1)
    else:
        dk = dk.view(B, H_kv, group, layout.S, E).sum(dim=2)
        dv = dv.view(B, H_kv, group, layout.S, Ev).sum(dim=2)
    return dq, dk.to(k.dtype), dv.to(v.dtype)


def _flash_forward(
    q,
    k,
    v,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    alibi_slopes: torch.Tensor | None = None,
    softcap: float = 0.0,
):
    """FlashAttention forward with Triton: ``(out (B, H, L, Ev), lse (B, H, L)
    float32)``. ``q (B, H, L, E)``, ``k (B, Hkv, S, E)``, ``v (B, Hkv, S, Ev)`` in any
    strides; head dims up to 256. FlashAttention-2's fused options as in
    :func:`attnbook.attend.flash_attention`: ``window_size``, ``alibi_slopes``,
    ``softcap``; tiles outside the window are never loaded. Validated by
    :func:`attnbook.attend.flash_attention`, which calls it."""
    layout = _padded(q, k, v)
    options = _options(q, layout, is_causal, window_size, alibi_slopes, softcap)
    return _forward(q, k, v, layout, is_causal, scale, options)


def _flash_backward(
    q,
    k,
    v,
    out,
    lse,
    grad_out,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    alibi_slopes: torch.Tensor | None = None,
    softcap: float = 0.0,
):
    """FlashAttention backward with Triton: ``(dq, dk, dv)`` from the saved ``out`` and
    ``lse``, with the forward's options."""
    layout = _padded(q, k, v)
    options = _options(q, layout, is_causal, window_size, alibi_slopes, softcap)
    return _backward(q, k, v, out, lse, grad_out, layout, scale, options)


def _packed(q, k, v, cu_q, cu_k, max_q, max_k) -> _Layout:
    """The layout of packed ``(total, H, E)`` tensors."""
    total_q, H, E = q.shape
    return _Layout(
        len(cu_q) - 1, H, k.shape[1], max(1, max_q), max(1, max_k), E, v.shape[2],
        cu_q.to(q.device), cu_k.to(q.device), True, total_q, k.shape[0],
    )  # fmt: skip


def _varlen_forward(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
    is_causal: bool = False, scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    alibi_slopes: torch.Tensor | None = None, softcap: float = 0.0,
):  # fmt: skip
    """FlashAttention over packed sequences (``flash_attn_varlen_func``'s layout):
    ``q (total_q, H, E)``, ``k, v (total_k, Hkv, E|Ev)``, sequence ``b`` in rows
    ``cu_seqlens[b]:cu_seqlens[b + 1]``. Returns ``(out (total_q, H, Ev), lse (H,
    total_q))``. One program per (query tile of the longest sequence, sequence x head);
    a program past its sequence's end does nothing. Validated by
    :func:`attnbook.attend.flash_attention_varlen`, which calls it."""
    layout = _packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    options = _options(q, layout, is_causal, window_size, alibi_slopes, softcap)
    return _forward(q, k, v, layout, is_causal, scale, options)


def _varlen_backward(
    q, k, v, out, lse, grad_out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    max_seqlen_k, *, is_causal: bool = False, scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    alibi_slopes: torch.Tensor | None = None, softcap: float = 0.0,
):  # fmt: skip
    """Backward of ``_varlen_forward``: ``(dq, dk, dv)`` in the packed layout."""
    layout = _packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    options = _options(q, layout, is_causal, window_size, alibi_slopes, softcap)
    return _backward(q, k, v, out, lse, grad_out, layout, scale, options)


def _block_sparse_attention_forward(
    q,
    k,
    v,
    block_mask: torch.Tensor,
    block_size: int,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
):
    """Block-sparse attention with Triton: only the active tiles of ``block_mask`` are
    computed.

    ``block_mask (ceil(L / b), ceil(S / b))`` bool (e.g.
    :func:`attnbook.sparse.bigbird_block_mask`), ``b = block_size`` a power of two >= 16
    (a mask block may span several kernel tiles). Equal to
    :func:`attnbook.sparse.block_sparse_attention`; rows with no active key give zeros.
    With ``return_lse=True`` it returns ``(out, lse)``, what
    ``_block_sparse_attention_backward`` needs. Validated by
    :func:`attnbook.attend.block_sparse_flash_attention`, which calls it.
    """
    layout = _padded(q, k, v)
    index = _block_index(block_mask, q.device)
    options = _options(q, layout, is_causal, (-1, -1), None, 0.0)
    out, lse = _forward(q, k, v, layout, is_causal, scale, options, index, block_size)
    return (out, lse) if return_lse else out


def _block_sparse_attention_backward(
    q,
    k,
    v,
    out,
    lse,
    grad_out,
    block_mask: torch.Tensor,
    block_size: int,
    *,
    is_causal: bool = False,
    scale: float | None = None,
):
    """Backward of ``_block_sparse_attention_forward``: ``(dq, dk, dv)``. The dK/dV
    kernel walks each key block's column of ``block_mask`` (compressed-sparse-column
    indices), the dQ kernel each query block's row, so inactive tiles cost nothing
    here either."""
    layout = _padded(q, k, v)
    rows = _block_index(block_mask, q.device)
    cols = _block_index(block_mask, q.device, by_columns=True)
    options = _options(q, layout, is_causal, (-1, -1), None, 0.0)
    return _backward(
        q, k, v, out, lse, grad_out, layout, scale, options, (rows, cols), block_size
    )


# --------------------------------------------------------------------------------------
# What the launchers compile on a GPU
# --------------------------------------------------------------------------------------
_TRITON_DTYPE = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
_FP32_POINTERS = {"LSE", "DELTA", "DK", "DV", "ALIBI_SLOPES"}
_INDEX_POINTERS = {"ROW_PTR", "COL_IDX", "COL_PTR", "ROW_IDX", "CU_Q", "CU_K"}


def _types(fn, dtype: torch.dtype) -> dict[str, str]:
    """Triton's types of kernel ``fn``'s pointers and scales for inputs of ``dtype``
    (the other runtime parameters are int32 sizes and strides)."""
    from .variants import parameters

    types = {}
    for name, is_constexpr in parameters(fn):
        if (
            is_constexpr
            or name.startswith("stride_")
            or name in {"H", "H_KV", "L", "S"}
        ):
            continue
        if name.endswith("scale") or name == "softcap":
            types[name] = "fp32"
        elif name.islower() or name == "MASK_BLOCK":  # window sides, mask block
            types[name] = "i32"
        elif name in _FP32_POINTERS:
            types[name] = "*fp32"
        elif name in _INDEX_POINTERS:
            types[name] = "*i32"
        else:
            types[name] = "*" + _TRITON_DTYPE[dtype]
    return types


def variants(
    dtype: torch.dtype, head_dim: int, *, causal: bool = False, v_dim: int | None = None
) -> list:
    """Every compiled form the launchers can run on a GPU for ``dtype`` and ``head_dim``
    (and value width ``v_dim``, default ``head_dim``): the forward and the dK/dV and dQ
    backward kernels, dense and block-sparse, in every configuration of
    :data:`attnbook.kernels.tuning.SPACE`, and the backward pre-pass, as
    :class:`attnbook.kernels.variants.Variant`.

    The dense kernels are listed in their heaviest form, with every option on (packed
    sequences, a window, ALiBi, softcapping; ``causal`` as given): what fits with all
    of them fits with fewer, so the compiled table bounds every launch."""
    from .variants import Variant, specialize

    if dtype not in _TRITON_DTYPE:
        raise ValueError(
            f"variants: dtype must be one of {list(_TRITON_DTYPE)}, got {dtype}"
        )
    sizes = {} if v_dim is None else {"v_dim": v_dim}
    check_sizes("variants", head_dim=head_dim, **sizes)
    v_dim = head_dim if v_dim is None else v_dim
    shapes = {
        "HEAD_DIM": head_dim,
        "V_DIM": v_dim,
        "BLOCK_D": padded_head_dim(head_dim),
        "BLOCK_DV": padded_head_dim(v_dim),
    }
    flags = {
        "CAUSAL": causal,
        "PRECISION": "ieee" if dtype == torch.float32 else "tf32",
    }

    def variant(kernel, fn, config, constexprs):
        signature, constants, attrs = specialize(fn, _types(fn, dtype), constexprs)
        return Variant(
            kernel,
            fn,
            signature,
            constants,
            config.num_warps,
            config.num_stages,
            config=config,
            attrs=attrs,
        )

    heaviest = {"VARLEN": True, "WINDOW": True, "ALIBI": True, "SOFTCAP": True}
    plain = dict.fromkeys(heaviest, False)  # block-sparse takes no other option
    found = []
    for sparse, prefix in ((False, "flash"), (True, "block_sparse")):
        for family, suffix, fn in (
            ("fwd", "fwd", _fwd_kernel),
            ("bwd", "bwd_dkdv", _bwd_dkdv_kernel),
            ("bwd", "bwd_dq", _bwd_dq_kernel),
        ):
            for config in tuning.SPACE[family]:
                tile = {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n}
                found.append(
                    variant(
                        f"{prefix}_{suffix}",
                        fn,
                        config,
                        {
                            **shapes,
                            **tile,
                            "SPARSE": sparse,
                            **(plain if sparse else heaviest),
                            **flags,
                        },
                    )
                )
    for config in tuning.SPACE["delta"]:
        found.append(
            variant(
                "flash_bwd_delta",
                _bwd_delta_kernel,
                config,
                {
                    "V_DIM": v_dim,
                    "BLOCK_DV": shapes["BLOCK_DV"],
                    "BLOCK_M": config.block_m,
                    "VARLEN": True,
                },
            )
        )
    return found


_ENTRY = "; call the entry point in attnbook.attend: it validates and picks a backend"
#: The launchers' public names until they became private, one release each.
_RENAMED = {
    old: (f"attnbook.kernels.flash_triton._{new}", _ENTRY)
    for old, new in {
        "flash_forward": "flash_forward",
        "flash_backward": "flash_backward",
        "varlen_forward": "varlen_forward",
        "varlen_backward": "varlen_backward",
        "block_sparse_forward": "block_sparse_attention_forward",
        "block_sparse_backward": "block_sparse_attention_backward",
    }.items()
}


def __getattr__(name: str):
    return renamed(__name__, _RENAMED, name)
