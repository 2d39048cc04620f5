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

from .._renamed import renamed
from ..contract import check_int, check_sizes
from ._compat import mend_interpreter

mend_interpreter()  # older Triton interpreters and NumPy 2.5: see _compat

__all__ = [
    "MAX_HEAD_DIM",
    "default_num_splits",
    "variants",
]

#: The launcher, private, with its PyTorch twin.
_LAUNCHERS = {"_split_kv_attention": "attnbook.kvcache.split_kv_attention"}

BLOCK_N = 32  # keys per split at least (and per tile, for head dims up to 64)
MERGE_CHUNK = 16  # splits the merge kernel adds up at a time
#: The widest head the kernel takes (keys and values are padded to a power of two).
MAX_HEAD_DIM = 256


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
    v_dim,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """Program ``(b * n_heads + h, s)``: online softmax over keys ``[s * split_len, (s +
    1) * split_len)`` that are below ``seqlens[b]``; writes ``o_s`` (normalized) and
    ``lse_s = m + log l``. Batch and head offsets are 64-bit."""
    bh, split = tl.program_id(0), tl.program_id(1)
    seqlen = tl.load(SEQLENS + bh // n_heads)
    b, h = (bh // n_heads).to(tl.int64), (bh % n_heads).to(tl.int64)
    kv_h = h // group
    start = split * split_len
    end = tl.minimum(start + split_len, seqlen)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    mask_d, mask_dv = offs_d < head_dim, offs_dv < v_dim
    q = tl.load(
        Q + b * stride_qb + h * stride_qh + offs_d * stride_qd, mask=mask_d, other=0.0
    ).to(tl.float32)
    q = q * scale
    m = tl.full([1], float("-inf"), tl.float32)
    l = tl.zeros([1], tl.float32)
    acc = tl.zeros([BLOCK_DV], tl.float32)
    k_base = K + b * stride_kb + kv_h * stride_kh
    v_base = V + b * stride_vb + kv_h * stride_vh
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        k = tl.load(
            k_base + offs_n[:, None] * stride_ks + offs_d[None, :] * stride_kd,
            mask=mask_n[:, None] & mask_d[None, :],
            other=0.0,
        )
        x = tl.sum(q[None, :] * k.to(tl.float32), axis=1)  # (BLOCK_N,) scores
        x = tl.where(mask_n, x, float("-inf"))
        # finite: the tile has at least one valid key
        m_new = tl.maximum(m, tl.max(x, axis=0))
        p = tl.exp(x - m_new)
        alpha = tl.exp(m - m_new)  # rescales what was accumulated under the old maximum
        v = tl.load(
            v_base + offs_n[:, None] * stride_vs + offs_dv[None, :] * stride_vd,
            mask=mask_n[:, None] & mask_dv[None, :],
            other=0.0,
        )
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        l = l * alpha + tl.sum(p, axis=0)
        m = m_new
    empty = l == 0.0
    out = acc / tl.where(empty, 1.0, l)
    lse = tl.where(empty, float("-inf"), m + tl.log(tl.where(empty, 1.0, l)))
    tl.store(
        O_PART
        + b * stride_ob
        + h * stride_oh
        + split * stride_os
        + offs_dv * stride_od,
        out,
        mask=mask_dv,
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
    MERGE_CHUNK: tl.constexpr,
):
    """Program ``b * n_heads + h``: ``o = sum_s w_s o_s`` with ``w_s =
    softmax_s(lse_s)``; zeros if all empty. The splits' log-sum-exps are read at once
    (``BLOCK_S``), their outputs ``MERGE_CHUNK`` splits at a time, so the tile held in
    registers stays ``MERGE_CHUNK x BLOCK_D`` however many splits there are."""
    bh = tl.program_id(0)
    b, h = (bh // n_heads).to(tl.int64), (bh % n_heads).to(tl.int64)
    LSE_PART += b * stride_lb + h * stride_lh
    O_PART += b * stride_ob + h * stride_oh
    offs_s, offs_d = tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    lse = tl.load(
        LSE_PART + offs_s * stride_ls, mask=offs_s < num_splits, other=float("-inf")
    )
    top = tl.max(lse, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)
    total = tl.sum(tl.where(lse == float("-inf"), 0.0, tl.exp(lse - top)), axis=0)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for s0 in range(0, num_splits, MERGE_CHUNK):
        offs_c = s0 + tl.arange(0, MERGE_CHUNK)
        mask_c = offs_c < num_splits
        lse_c = tl.load(LSE_PART + offs_c * stride_ls, mask=mask_c, other=-float("inf"))
        w = tl.where(lse_c == float("-inf"), 0.0, tl.exp(lse_c - top))
        o = tl.load(
            O_PART + offs_c[:, None] * stride_os + offs_d[None, :] * stride_od,
            mask=mask_c[:, None] & mask_d[None, :],
            other=0.0,
        )
        acc += tl.sum(w[:, None] * o, axis=0)
    out = acc / tl.where(total == 0.0, 1.0, total)
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
    check_int("default_num_splits", "batch_heads", batch_heads, 0)
    check_int("default_num_splits", "max_len", max_len, 0)
    check_sizes("default_num_splits", target_programs=target_programs)
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


def _tile_n(block_d: int) -> int:
    """Keys per tile of the split kernel: 32 for heads up to 64 wide, fewer for wider
    ones, so the ``keys x head`` tile it holds in float32 registers stays at 2,048
    values (32 x 128 and 16 x 256 spilled on an H100)."""
    return min(BLOCK_N, 2048 // block_d)


def variants(dtype: torch.dtype, head_dim: int, v_dim: int | None = None) -> list:
    """The compiled forms ``_split_kv_attention`` launches on a GPU for ``dtype``,
    ``head_dim`` and value width ``v_dim`` (default ``head_dim``): the split kernel
    and the merge kernel (one per ``BLOCK_S`` in ``MERGE_BLOCKS``), as
    :class:`attnbook.kernels.variants.Variant`."""
    from .variants import Variant, specialize

    names = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
    if dtype not in names:
        raise ValueError(f"variants: dtype must be one of {list(names)}, got {dtype}")
    check_sizes(
        "variants", head_dim=head_dim, **({} if v_dim is None else {"v_dim": v_dim})
    )
    data = "*" + names[dtype]
    v_dim = head_dim if v_dim is None else v_dim
    split = {"Q": data, "K": data, "V": data, "SEQLENS": "*i32", "scale": "fp32"}
    split |= {"O_PART": "*fp32", "LSE_PART": "*fp32"}
    merge = {"O_PART": "*fp32", "LSE_PART": "*fp32", "OUT": data}

    def variant(kernel, fn, types, constexprs):
        signature, constants, attrs = specialize(fn, types, constexprs)
        return Variant(kernel, fn, signature, constants, attrs=attrs)

    block_d, block_dv = _block_d(head_dim), _block_d(v_dim)
    found = [
        variant(
            "decode_split",
            _split_kernel,
            split,
            {
                "BLOCK_N": _tile_n(max(block_d, block_dv)),
                "BLOCK_D": block_d,
                "BLOCK_DV": block_dv,
            },
        )
    ]
    for block_s in MERGE_BLOCKS:
        found.append(
            variant(
                "decode_merge",
                _merge_kernel,
                merge,
                {"BLOCK_S": block_s, "BLOCK_D": block_dv, "MERGE_CHUNK": MERGE_CHUNK},
            )
        )
    return found


def _split_kv_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    num_splits: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Split-KV attention of one query per sequence: ``q (batch, heads, 1, head_dim)``
    over the first ``cache_seqlens[b]`` positions of ``k_cache (batch, kv_heads,
    max_len, head_dim)`` and ``v_cache (batch, kv_heads, max_len, v_dim)``, in any
    strides (a slice of a larger cache is read where it lies); head dims up to 256.

    Equal to ``softmax(q k^T * scale) v`` (``scale`` default ``1 / sqrt(head_dim)``)
    over each valid prefix: ``(batch, heads, 1, v_dim)``; a sequence of length 0 gets
    zeros. The Triton twin of :func:`attnbook.kvcache.split_kv_attention`.
    ``num_splits`` defaults to :func:`default_num_splits`. Two launches:
    ``_split_kernel`` on a ``(batch * heads, num_splits)`` grid, then ``_merge_kernel``
    on ``(batch * heads,)``.

    A launcher: it trusts its arguments, which
    :func:`attnbook.attend.decode_attention` (``backend="triton"``) has validated
    (the contract's decode checks, head dims up to :data:`MAX_HEAD_DIM`, ``num_splits``
    in ``[1, MAX_SPLITS]`` (128), a CUDA tensor or Triton's interpreter). Call that.
    """
    B, H, _, d = q.shape
    dv = v_cache.shape[-1]
    S = k_cache.shape[2]
    if num_splits is None:
        num_splits = default_num_splits(B * H, S)
    split_len = max(1, math.ceil(S / num_splits))
    seqlens = cache_seqlens.to(device=q.device, dtype=torch.int32).contiguous()
    o_part = torch.empty(B, H, num_splits, dv, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(B, H, num_splits, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q) if dv == d else q.new_empty(B, H, 1, dv)
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
        dv,
        BLOCK_N=_tile_n(max(_block_d(d), _block_d(dv))),
        BLOCK_D=_block_d(d),
        BLOCK_DV=_block_d(dv),
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
        dv,
        BLOCK_S=max(16, triton.next_power_of_2(num_splits)),
        BLOCK_D=_block_d(dv),
        MERGE_CHUNK=MERGE_CHUNK,
    )
    return out


_ENTRY = "; call attnbook.attend.decode_attention, which validates and picks a backend"
#: Old names of the launcher, one release each.
_RENAMED = {
    "decode_attention": ("attnbook.kernels.decode._split_kv_attention", _ENTRY),
    "split_kv_forward": ("attnbook.kernels.decode._split_kv_attention", _ENTRY),
}


def __getattr__(name: str):
    """The launcher's old names, ``decode_attention`` (until 0.1) and
    ``split_kv_forward``: one release with a :class:`DeprecationWarning`."""
    return renamed(__name__, _RENAMED, name)
