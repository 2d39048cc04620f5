"""Split-KV decoding ("flash-decoding", Dao et al., 2023) in Triton: one query token per
sequence.

During decoding each sequence contributes one query row, so a kernel that gives one
program per (sequence, head) launches only ``batch * heads`` programs: with a small
batch most of a GPU's streaming multiprocessors sit idle while a few programs walk a
long cache. Flash-decoding also splits the *keys*: program ``(b, h, s)`` handles chunk
``s`` of sequence ``b``'s cache and writes a partial output ``o_s`` and its log-sum-exp
``lse_s``; a second kernel merges the chunks,

    o = sum_s exp(lse_s - M) o_s / sum_s exp(lse_s - M),   M = max_s lse_s,

which is exactly softmax attention over the whole cache (the same rescaling as
FlashAttention's online softmax, done once across chunks). Caches have different valid
lengths per sequence (``cache_seqlens``); positions beyond them are masked and chunks
that start beyond them are empty (``lse = -inf``, weight 0). Grouped-query attention:
query head ``h`` reads key/value head ``h // (heads // kv_heads)``.

The PyTorch reference of the same algorithm is
:func:`attnbook.kvcache.split_kv_attention`. Scores are a row-times-tile product
(``tl.sum(q[None, :] * k, 1)``), not ``tl.dot``: one query row is below ``tl.dot``'s
16-row minimum, and decoding is memory-bound anyway (each key is read once and used for
2 FLOPs per element). Accumulation is in fp32 for fp16/bf16 inputs. Tested on CPU under
``TRITON_INTERPRET=1`` (fp32 and fp16); the bf16 path runs on GPUs only.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..contract import check_decode

__all__ = ["decode_attention", "default_num_splits", "variants"]

BLOCK_N = 32  # keys per tile


@triton.jit
def _split_kernel(
    Q,
    K,
    V,
    SEQLENS,
    O_PART,
    LSE_PART,
    stride_qb,
    stride_qh,
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
    stride_os,
    stride_od,
    stride_lb,
    stride_lh,
    stride_ls,
    scale,
    n_heads,
    group,
    split_len,
    head_dim,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program ``(b * n_heads + h, s)``: online softmax over keys ``[s * split_len, (s +
    1) * split_len)`` that are below ``seqlens[b]``; writes ``o_s`` (normalized) and
    ``lse_s = m + log l``."""
    bh, split = tl.program_id(0), tl.program_id(1)
    b, h = bh // n_heads, bh % n_heads
    kv_h = h // group
    seqlen = tl.load(SEQLENS + b)
    start = split * split_len
    end = tl.minimum(start + split_len, seqlen)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    q = tl.load(
        Q + b * stride_qb + h * stride_qh + offs_d * stride_qd, mask=mask_d, other=0.0
    ).to(tl.float32)
    q = q * scale
    m = tl.full([1], float("-inf"), tl.float32)
    l = tl.zeros([1], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    k_base = K + b * stride_kb + kv_h * stride_kh
    v_base = V + b * stride_vb + kv_h * stride_vh
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        tile_mask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(
            k_base + offs_n[:, None] * stride_ks + offs_d[None, :] * stride_kd,
            mask=tile_mask,
            other=0.0,
        )
        x = tl.sum(q[None, :] * k.to(tl.float32), axis=1)  # (BLOCK_N,) scores
        x = tl.where(mask_n, x, float("-inf"))
        # finite: the tile has at least one valid key
        m_new = tl.maximum(m, tl.max(x, axis=0))
        p = tl.exp(x - m_new)
        alpha = tl.exp(m - m_new)  # rescales what was accumulated under the old maximum
        v = tl.load(
            v_base + offs_n[:, None] * stride_vs + offs_d[None, :] * stride_vd,
            mask=tile_mask,
            other=0.0,
        )
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        l = l * alpha + tl.sum(p, axis=0)
        m = m_new
    empty = l == 0.0
    out = acc / tl.where(empty, 1.0, l)
    lse = tl.where(empty, float("-inf"), m + tl.log(tl.where(empty, 1.0, l)))
    tl.store(
        O_PART + b * stride_ob + h * stride_oh + split * stride_os + offs_d * stride_od,
        out,
        mask=mask_d,
    )
    tl.store(
        LSE_PART + b * stride_lb + h * stride_lh + split * stride_ls + tl.arange(0, 1),
        lse,
    )


@triton.jit
def _merge_kernel(
    O_PART,
    LSE_PART,
    OUT,
    stride_ob,
    stride_oh,
    stride_os,
    stride_od,
    stride_lb,
    stride_lh,
    stride_ls,
    stride_outb,
    stride_outh,
    stride_outd,
    n_heads,
    num_splits,
    head_dim,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program ``b * n_heads + h``: ``o = sum_s w_s o_s`` with ``w_s =
    softmax_s(lse_s)``; zeros if all empty."""
    bh = tl.program_id(0)
    b, h = bh // n_heads, bh % n_heads
    offs_s, offs_d = tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_D)
    mask_s, mask_d = offs_s < num_splits, offs_d < head_dim
    lse = tl.load(
        LSE_PART + b * stride_lb + h * stride_lh + offs_s * stride_ls,
        mask=mask_s,
        other=float("-inf"),
    )
    top = tl.max(lse, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)
    w = tl.where(lse == float("-inf"), 0.0, tl.exp(lse - top))
    o = tl.load(
        O_PART
        + b * stride_ob
        + h * stride_oh
        + offs_s[:, None] * stride_os
        + offs_d[None, :] * stride_od,
        mask=mask_s[:, None] & mask_d[None, :],
        other=0.0,
    )
    total = tl.sum(w, axis=0)
    out = tl.sum(w[:, None] * o, axis=0) / tl.where(total == 0.0, 1.0, total)
    tl.store(
        OUT + b * stride_outb + h * stride_outh + offs_d * stride_outd,
        out.to(OUT.dtype.element_ty),
        mask=mask_d,
    )


def default_num_splits(
    batch_heads: int, max_len: int, target_programs: int = 128
) -> int:
    """Enough splits that ``batch * heads * splits`` reaches about ``target_programs``
    (an H100 has 132 SMs), but no split shorter than one ``BLOCK_N`` tile."""
    return max(
        1,
        min(
            math.ceil(target_programs / max(batch_heads, 1)),
            math.ceil(max_len / BLOCK_N),
            MAX_SPLITS,
        ),
    )


#: Merge-tile sizes (``BLOCK_S``: the splits rounded up to a power of two >= 16): every
#: one a launch can use, since ``num_splits`` is at most :data:`MAX_SPLITS`.
MAX_SPLITS = 128
MERGE_BLOCKS = (16, 32, 64, 128)


def _block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def variants(dtype: torch.dtype, head_dim: int) -> list:
    """The compiled forms :func:`decode_attention` launches on a GPU for ``dtype`` and
    ``head_dim``: the split kernel and the merge kernel (one per ``BLOCK_S`` in
    ``MERGE_BLOCKS``), as :class:`attnbook.kernels.variants.Variant`."""
    from .variants import Variant, parameters

    names = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
    if dtype not in names:
        raise ValueError(f"dtype must be one of {list(names)}, got {dtype}")

    def signature(fn, typed):
        return {
            name: "constexpr" if constexpr else typed.get(name, "i32")
            for name, constexpr in parameters(fn)
        }

    data = "*" + names[dtype]
    split = signature(
        _split_kernel,
        {
            "Q": data,
            "K": data,
            "V": data,
            "SEQLENS": "*i32",
            "O_PART": "*fp32",
            "LSE_PART": "*fp32",
            "scale": "fp32",
        },
    )
    merge = signature(
        _merge_kernel, {"O_PART": "*fp32", "LSE_PART": "*fp32", "OUT": data}
    )
    block_d = _block_d(head_dim)
    return [
        Variant(
            "decode_split",
            _split_kernel,
            split,
            {"BLOCK_N": BLOCK_N, "BLOCK_D": block_d},
        ),
        *[
            Variant(
                "decode_merge",
                _merge_kernel,
                merge,
                {"BLOCK_S": block_s, "BLOCK_D": block_d},
            )
            for block_s in MERGE_BLOCKS
        ],
    ]


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    num_splits: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Split-KV attention of one query per sequence: ``(batch, heads, 1, head_dim)``
    over the first ``cache_seqlens[b]`` positions of ``k_cache, v_cache: (batch,
    kv_heads, max_len, head_dim)``.

    Equal to ``softmax(q k^T * scale) v`` (``scale`` default ``1 / sqrt(d)``) over each
    valid prefix; a sequence of length
    0 gets zeros. ``num_splits`` defaults to :func:`default_num_splits`. Two launches:
    ``_split_kernel`` on a ``(batch * heads, num_splits)`` grid, then ``_merge_kernel``
    on ``(batch * heads,)``.
    """
    check_decode("decode_attention", q, k_cache, v_cache, cache_seqlens)
    if v_cache.shape[-1] != k_cache.shape[-1]:
        raise ValueError(
            "decode_attention: the Triton kernel needs v_cache as wide as k_cache, got "
            f"{tuple(v_cache.shape)} and {tuple(k_cache.shape)}; use backend='torch'"
        )
    B, H, _, d = q.shape
    S = k_cache.shape[2]
    num_splits = num_splits or default_num_splits(B * H, S)
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(
            f"num_splits must be between 1 and {MAX_SPLITS} (the merge kernel reads "
            f"every split in one tile), got {num_splits}"
        )
    split_len = max(1, math.ceil(S / num_splits))
    seqlens = cache_seqlens.to(device=q.device, dtype=torch.int32).contiguous()
    o_part = torch.empty(B, H, num_splits, d, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(B, H, num_splits, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    block_d = _block_d(d)
    _split_kernel[(B * H, num_splits)](
        q,
        k_cache,
        v_cache,
        seqlens,
        o_part,
        lse_part,
        q.stride(0),
        q.stride(1),
        q.stride(3),
        *k_cache.stride(),
        *v_cache.stride(),
        *o_part.stride(),
        *lse_part.stride(),
        1.0 / math.sqrt(d) if scale is None else scale,
        H,
        H // k_cache.shape[1],
        split_len,
        d,
        BLOCK_N=BLOCK_N,
        BLOCK_D=block_d,
    )
    _merge_kernel[(B * H,)](
        o_part,
        lse_part,
        out,
        *o_part.stride(),
        *lse_part.stride(),
        out.stride(0),
        out.stride(1),
        out.stride(3),
        H,
        num_splits,
        d,
        BLOCK_S=max(16, triton.next_power_of_2(num_splits)),
        BLOCK_D=block_d,
    )
    return out
