"""FlashAttention forward, backward and block-sparse forward as Triton kernels (Dao,
2023).

Work partitioning of FlashAttention-2 (and of Triton's fused-attention tutorial):

* forward: one program per (query block, batch x head). It keeps its query tile in SRAM,
  streams the key/value tiles, and updates the online-softmax state ``(m, l, acc)`` in
  registers; it writes the output tile and the row log-sum-exp ``lse`` once.
* backward: a pre-pass ``delta = rowsum(dO * O)``; a dK/dV kernel with one program per
  (key block, batch x head) that streams the query tiles; a dQ kernel with one program
  per (query block, batch x head) that streams the key tiles. Probabilities are
  recomputed from ``(q, k, lse)``.
* block-sparse forward: the forward kernel, but each query block visits only the key
  blocks its row of a block mask lists (compressed-sparse-row indices), so skipped tiles
  cost nothing.

Inputs are ``(batch, heads, seq, head_dim)``; keys/values may have fewer heads (MQA/GQA:
query head ``h`` reads key head ``h // (H / Hkv)``). Any sequence length works: tails
are masked. Causal masks are bottom-right aligned (query ``i`` sees keys ``j <= i + S -
L``). Head dims 16, 32, 64 and 128. Scores use ``exp2`` with the scale folded into
``log2(e) * scale``. On CPU the kernels run under Triton's interpreter
(``TRITON_INTERPRET=1``), in float32 and float16 only.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from ..contract import check_qkv

__all__ = ["flash_forward", "flash_backward", "block_sparse_forward", "variants"]

_LOG2E = 1.4426950408889634
_HEAD_DIMS = (16, 32, 64, 128)


# --------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------
@triton.jit
def _attend_tile(
    q,
    m_i,
    l_i,
    acc,
    K,
    V,
    kv_base,
    start_n,
    offs_m,
    offs_d,
    L,
    S,
    qk_scale,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Online-softmax update of one query tile's state with the key/value tile starting
    at ``start_n``."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kv_mask = offs_n[:, None] < S
    k = tl.load(
        K + (kv_base + offs_n[:, None]) * HEAD_DIM + offs_d[None, :],
        mask=kv_mask,
        other=0.0,
    )
    v = tl.load(
        V + (kv_base + offs_n[:, None]) * HEAD_DIM + offs_d[None, :],
        mask=kv_mask,
        other=0.0,
    )
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # log2 units
    valid = offs_n[None, :] < S
    if CAUSAL:
        valid = valid & (offs_n[None, :] <= offs_m[:, None] + (S - L))
    s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # a row that has seen nothing yet
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2(s - shift[:, None])
    alpha = tl.math.exp2(m_i - shift)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def _finish(O, LSE, acc, m_i, l_i, q_base, offs_m, offs_d, L, HEAD_DIM: tl.constexpr):
    """Write ``out = acc / l`` and ``lse = (m + log2 l) * ln 2`` (zeros and ``-inf`` for
    empty rows)."""
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(
        l_i > 0, (m_i + tl.math.log2(l_safe)) / 1.4426950408889634, float("-inf")
    )
    row_mask = offs_m < L
    tl.store(
        O + (q_base + offs_m[:, None]) * HEAD_DIM + offs_d[None, :],
        out.to(O.dtype.element_ty),
        mask=row_mask[:, None],
    )
    tl.store(LSE + q_base + offs_m, lse, mask=row_mask)


@triton.jit
def _fwd_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    qk_scale,
    H,
    H_KV,
    L,
    S,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    kv_head = (bh // H) * H_KV + (bh % H) // (H // H_KV)
    q_base, kv_base = bh * L, kv_head * S
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        Q + (q_base + offs_m[:, None]) * HEAD_DIM + offs_d[None, :],
        mask=offs_m[:, None] < L,
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    hi = S
    if CAUSAL:  # the block's last row sees keys up to (pid_m + 1) * BLOCK_M - 1 + S - L
        hi = tl.minimum(S, (pid_m + 1) * BLOCK_M + S - L)
    for start_n in range(0, hi, BLOCK_N):
        m_i, l_i, acc = _attend_tile(
            q,
            m_i,
            l_i,
            acc,
            K,
            V,
            kv_base,
            start_n,
            offs_m,
            offs_d,
            L,
            S,
            qk_scale,
            BLOCK_N,
            HEAD_DIM,
            CAUSAL,
            PRECISION,
        )
    _finish(O, LSE, acc, m_i, l_i, q_base, offs_m, offs_d, L, HEAD_DIM)


@triton.jit
def _block_sparse_fwd_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    ROW_PTR,
    COL_IDX,
    qk_scale,
    H,
    H_KV,
    L,
    S,
    BLOCK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    kv_head = (bh // H) * H_KV + (bh % H) // (H // H_KV)
    q_base, kv_base = bh * L, kv_head * S
    offs_m = pid_m * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        Q + (q_base + offs_m[:, None]) * HEAD_DIM + offs_d[None, :],
        mask=offs_m[:, None] < L,
        other=0.0,
    )
    m_i = tl.full([BLOCK], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK], tl.float32)
    acc = tl.zeros([BLOCK, HEAD_DIM], tl.float32)
    first, last = tl.load(ROW_PTR + pid_m), tl.load(ROW_PTR + pid_m + 1)
    for idx in range(first, last):  # only the active key blocks of this row
        start_n = tl.load(COL_IDX + idx) * BLOCK
        m_i, l_i, acc = _attend_tile(
            q,
            m_i,
            l_i,
            acc,
            K,
            V,
            kv_base,
            start_n,
            offs_m,
            offs_d,
            L,
            S,
            qk_scale,
            BLOCK,
            HEAD_DIM,
            CAUSAL,
            PRECISION,
        )
    _finish(O, LSE, acc, m_i, l_i, q_base, offs_m, offs_d, L, HEAD_DIM)


@triton.jit
def _bwd_delta_kernel(O, DO, DELTA, L, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Pre-pass: ``delta_i = sum_d dO_id * O_id`` for one block of rows."""
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    ptrs = (bh * L + offs_m[:, None]) * HEAD_DIM + offs_d[None, :]
    mask = offs_m[:, None] < L
    o = tl.load(O + ptrs, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + bh * L + offs_m, tl.sum(o * do, 1), mask=offs_m < L)


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
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Probabilities of one tile, ``P = 2^(S * log2(e) * scale - lse * log2(e))``, zero
    where masked."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
    valid = (
        (offs_m[:, None] < L) & (offs_n[None, :] < S) & (lse[:, None] > float("-inf"))
    )
    if CAUSAL:
        valid = valid & (offs_n[None, :] <= offs_m[:, None] + (S - L))
    lse2 = tl.where(lse > float("-inf"), lse * 1.4426950408889634, 0.0)
    return tl.where(valid, tl.math.exp2(s - lse2[:, None]), 0.0)


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
    sm_scale,
    qk_scale,
    H,
    H_KV,
    L,
    S,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """dK, dV of one key block for one query head (GQA groups are summed afterwards)."""
    pid_n, bh = tl.program_id(0), tl.program_id(1)
    kv_head = (bh // H) * H_KV + (bh % H) // (H // H_KV)
    q_base, kv_base = bh * L, kv_head * S
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    kv_mask = offs_n[:, None] < S
    k = tl.load(
        K + (kv_base + offs_n[:, None]) * HEAD_DIM + offs_d[None, :],
        mask=kv_mask,
        other=0.0,
    )
    v = tl.load(
        V + (kv_base + offs_n[:, None]) * HEAD_DIM + offs_d[None, :],
        mask=kv_mask,
        other=0.0,
    )
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    lo = 0
    if CAUSAL:  # first query row that sees key pid_n * BLOCK_N: i >= j - (S - L)
        lo = tl.maximum(0, pid_n * BLOCK_N - (S - L)) // BLOCK_M * BLOCK_M
    for start_m in range(lo, L, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_mask = offs_m < L
        q = tl.load(
            Q + (q_base + offs_m[:, None]) * HEAD_DIM + offs_d[None, :],
            mask=row_mask[:, None],
            other=0.0,
        )
        do = tl.load(
            DO + (q_base + offs_m[:, None]) * HEAD_DIM + offs_d[None, :],
            mask=row_mask[:, None],
            other=0.0,
        )
        lse = tl.load(LSE + q_base + offs_m, mask=row_mask, other=float("-inf"))
        delta = tl.load(DELTA + q_base + offs_m, mask=row_mask, other=0.0)
        p = _recompute_p(q, k, lse, offs_m, offs_n, L, S, qk_scale, CAUSAL, PRECISION)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    out_ptrs = (bh * S + offs_n[:, None]) * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out_ptrs, dk * sm_scale, mask=kv_mask)
    tl.store(DV + out_ptrs, dv, mask=kv_mask)


@triton.jit
def _bwd_dq_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    sm_scale,
    qk_scale,
    H,
    H_KV,
    L,
    S,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """dQ of one query block: streams the key/value blocks it sees."""
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    kv_head = (bh // H) * H_KV + (bh % H) // (H // H_KV)
    q_base, kv_base = bh * L, kv_head * S
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_mask = offs_m < L
    q = tl.load(
        Q + (q_base + offs_m[:, None]) * HEAD_DIM + offs_d[None, :],
        mask=row_mask[:, None],
        other=0.0,
    )
    do = tl.load(
        DO + (q_base + offs_m[:, None]) * HEAD_DIM + offs_d[None, :],
        mask=row_mask[:, None],
        other=0.0,
    )
    lse = tl.load(LSE + q_base + offs_m, mask=row_mask, other=float("-inf"))
    delta = tl.load(DELTA + q_base + offs_m, mask=row_mask, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    hi = S
    if CAUSAL:
        hi = tl.minimum(S, (pid_m + 1) * BLOCK_M + S - L)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = offs_n[:, None] < S
        k = tl.load(
            K + (kv_base + offs_n[:, None]) * HEAD_DIM + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        v = tl.load(
            V + (kv_base + offs_n[:, None]) * HEAD_DIM + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        )
        p = _recompute_p(q, k, lse, offs_m, offs_n, L, S, qk_scale, CAUSAL, PRECISION)
        ds = p * (tl.dot(do, tl.trans(v), input_precision=PRECISION) - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(
        DQ + (q_base + offs_m[:, None]) * HEAD_DIM + offs_d[None, :],
        (dq * sm_scale).to(DQ.dtype.element_ty),
        mask=row_mask[:, None],
    )


# --------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------
def _check_inputs(fn: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """The contract's checks (:func:`attnbook.contract.check_qkv`), then a clear error
    for inputs these kernels cannot compute correctly."""
    check_qkv(fn, q, k, v)
    if (
        q.dim() != 4
        or k.dim() != 4
        or v.shape != k.shape
        or q.shape[0] != k.shape[0]
        or q.shape[3] != k.shape[3]
        or q.shape[1] % k.shape[1]
    ):
        raise ValueError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected "
            "(B, H, L, E) and two "
            "(B, Hkv, S, E) with H a multiple of Hkv"
        )
    if q.shape[-1] not in _HEAD_DIMS:
        raise ValueError(
            f"head_dim must be one of {_HEAD_DIMS} for the Triton kernels, got "
            f"{q.shape[-1]}"
        )
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
    ):
        raise ValueError(
            "q, k, v must share a dtype among float16, bfloat16, float32; got "
            f"{q.dtype}, {k.dtype}, {v.dtype}"
        )
    interpreted = os.environ.get("TRITON_INTERPRET") == "1" and not q.is_cuda
    if q.dtype == torch.bfloat16 and interpreted:
        raise ValueError(
            "bfloat16 is GPU-only: Triton's CPU interpreter computes bf16 dot "
            "products incorrectly"
        )
    if (
        q.dtype == torch.bfloat16
        and q.is_cuda
        and torch.cuda.get_device_capability(q.device) < (8, 0)
    ):
        raise ValueError(
            f"bfloat16 needs a GPU of compute capability >= 8.0 (Ampere); "
            f"{torch.cuda.get_device_name(q.device)} has "
            f"{torch.cuda.get_device_capability(q.device)}"
        )
    if not (q.is_cuda or interpreted):
        raise RuntimeError(
            "the Triton kernels need CUDA tensors, or TRITON_INTERPRET=1 for CPU "
            "tensors"
        )


def _tiles(head_dim: int, on_gpu: bool = True) -> tuple[int, int]:
    """One fixed tile configuration: 64 x 64 on a GPU (32 x 32 for head_dim 128), 32 x
    32 under the interpreter. The launchers and :func:`variants` both read it."""
    if not on_gpu:
        return 32, 32
    return (32, 32) if head_dim == 128 else (64, 64)


def _blocks(q: torch.Tensor) -> tuple[int, int]:
    return _tiles(q.shape[-1], q.is_cuda)


#: Block sizes of the block-sparse kernel that the compile test covers (the caller
#: chooses one: any power of two >= 16).
BLOCK_SPARSE_SIZES = (16, 32, 64, 128)
_TRITON_DTYPE = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
# parameters that are not pointers to the inputs' dtype, by kernel parameter name
_SCALARS = {"qk_scale": "fp32", "sm_scale": "fp32"}
_FP32_POINTERS = {"LSE", "DELTA", "DK", "DV"}
_INT_POINTERS = {"ROW_PTR", "COL_IDX"}
_SIZES = {"H", "H_KV", "L", "S"}  # upper-case like the pointers, but int32 sizes


def _signature(fn, dtype: torch.dtype) -> dict[str, str]:
    """Triton's signature of kernel ``fn`` for inputs of ``dtype``: pointers to the
    inputs' dtype (``*fp16``), float32 buffers, int32 indices, fp32 scales, i32
    sizes, and the constexprs."""
    from .variants import parameters

    sig = {}
    for name, is_constexpr in parameters(fn):
        if is_constexpr:
            sig[name] = "constexpr"
        elif name in _SCALARS:
            sig[name] = _SCALARS[name]
        elif name in _FP32_POINTERS:
            sig[name] = "*fp32"
        elif name in _INT_POINTERS:
            sig[name] = "*i32"
        elif name.isupper() and name not in _SIZES:
            sig[name] = "*" + _TRITON_DTYPE[dtype]
        else:
            sig[name] = "i32"
    return sig


def variants(
    dtype: torch.dtype,
    head_dim: int,
    *,
    causal: bool = False,
    block_sizes: tuple[int, ...] = BLOCK_SPARSE_SIZES,
) -> list:
    """Every compiled form the launchers here use on a GPU for ``dtype`` and
    ``head_dim``: the forward, the three backward kernels and the block-sparse forward
    (one per block size), as :class:`attnbook.kernels.variants.Variant` (Triton's
    default launch options: 4 warps, 3 stages)."""
    from .variants import Variant

    if dtype not in _TRITON_DTYPE:
        raise ValueError(f"dtype must be one of {list(_TRITON_DTYPE)}, got {dtype}")
    block_m, block_n = _tiles(head_dim)
    precision = "ieee" if dtype == torch.float32 else "tf32"
    tile = {"BLOCK_M": block_m, "BLOCK_N": block_n, "HEAD_DIM": head_dim}
    flags = {"CAUSAL": causal, "PRECISION": precision}
    found = [
        Variant(
            "flash_fwd", _fwd_kernel, _signature(_fwd_kernel, dtype), {**tile, **flags}
        ),
        Variant(
            "flash_bwd_delta",
            _bwd_delta_kernel,
            _signature(_bwd_delta_kernel, dtype),
            {"BLOCK_M": block_m, "HEAD_DIM": head_dim},
        ),
        Variant(
            "flash_bwd_dkdv",
            _bwd_dkdv_kernel,
            _signature(_bwd_dkdv_kernel, dtype),
            {**tile, **flags},
        ),
        Variant(
            "flash_bwd_dq",
            _bwd_dq_kernel,
            _signature(_bwd_dq_kernel, dtype),
            {**tile, **flags},
        ),
    ]
    found += [
        Variant(
            "block_sparse_fwd",
            _block_sparse_fwd_kernel,
            _signature(_block_sparse_fwd_kernel, dtype),
            {"BLOCK": block, "HEAD_DIM": head_dim, **flags},
        )
        for block in block_sizes
    ]
    return found


def _precision(q: torch.Tensor) -> str:
    """float32 inputs use exact fp32 products ("ieee"), as torch's float32 matmul does;
    not TF32."""
    return "ieee" if q.dtype == torch.float32 else "tf32"


def flash_forward(q, k, v, *, is_causal: bool = False, scale: float | None = None):
    """FlashAttention forward with Triton: ``(out (B, H, L, E), lse (B, H, L)
    float32)``."""
    _check_inputs("flash_forward", q, k, v)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    B, H, L, E = q.shape
    H_kv, S = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    out = torch.empty_like(q)
    lse = torch.empty(B, H, L, dtype=torch.float32, device=q.device)
    block_m, block_n = _blocks(q)
    grid = (triton.cdiv(L, block_m), B * H)
    _fwd_kernel[grid](
        q,
        k,
        v,
        out,
        lse,
        scale * _LOG2E,
        H,
        H_kv,
        L,
        S,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        HEAD_DIM=E,
        CAUSAL=bool(is_causal),
        PRECISION=_precision(q),
    )
    return out, lse


def flash_backward(
    q, k, v, out, lse, grad_out, *, is_causal: bool = False, scale: float | None = None
):
    """FlashAttention backward with Triton: ``(dq, dk, dv)`` from the saved ``out`` and
    ``lse``."""
    _check_inputs("flash_backward", q, k, v)
    q, k, v, out, grad_out = (t.contiguous() for t in (q, k, v, out, grad_out))
    B, H, L, E = q.shape
    H_kv, S = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    block_m, block_n = _blocks(q)
    lse = lse.float().contiguous()
    delta = torch.empty_like(lse)
    _bwd_delta_kernel[(triton.cdiv(L, block_m), B * H)](
        out, grad_out, delta, L, BLOCK_M=block_m, HEAD_DIM=E
    )
    # dK, dV per query head in float32; heads that share a key head (GQA) are summed
    # below.
    dk = torch.empty(B, H, S, E, dtype=torch.float32, device=q.device)
    dv = torch.empty_like(dk)
    args = (scale, scale * _LOG2E, H, H_kv, L, S)
    meta = dict(
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        HEAD_DIM=E,
        CAUSAL=bool(is_causal),
        PRECISION=_precision(q),
    )
    _bwd_dkdv_kernel[(triton.cdiv(S, block_n), B * H)](
        q, k, v, grad_out, lse, delta, dk, dv, *args, **meta
    )
    dq = torch.empty_like(q)
    _bwd_dq_kernel[(triton.cdiv(L, block_m), B * H)](
        q, k, v, grad_out, lse, delta, dq, *args, **meta
    )
    group = H // H_kv
    dk = dk.view(B, H_kv, group, S, E).sum(dim=2).to(k.dtype)
    dv = dv.view(B, H_kv, group, S, E).sum(dim=2).to(v.dtype)
    return dq, dk, dv


def block_sparse_forward(
    q,
    k,
    v,
    block_mask: torch.Tensor,
    block_size: int,
    *,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Block-sparse attention with Triton: only the active tiles of ``block_mask`` are
    computed.

    ``block_mask (ceil(L / b), ceil(S / b))`` bool (e.g.
    :func:`attnbook.sparse.bigbird_block_mask`), ``b = block_size`` a power of two >= 16
    (the kernel's tile). Equal to :func:`attnbook.sparse.block_sparse_attention`; rows
    with no active key give zeros.
    """
    _check_inputs("block_sparse_forward", q, k, v)
    B, H, L, E = q.shape
    H_kv, S = k.shape[1], k.shape[2]
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(
            "block_size must be a power of two >= 16 for the Triton kernel, got "
            f"{block_size}"
        )
    n_qb, n_kb = triton.cdiv(L, block_size), triton.cdiv(S, block_size)
    if block_mask.dtype != torch.bool or tuple(block_mask.shape) != (n_qb, n_kb):
        raise ValueError(
            f"block_mask must be bool of shape {(n_qb, n_kb)} for L={L}, S={S}, "
            f"block_size={block_size}; "
            f"got {block_mask.dtype} {tuple(block_mask.shape)}"
        )
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    mask = block_mask.to(q.device)
    row_ptr = torch.zeros(n_qb + 1, dtype=torch.int32, device=q.device)
    row_ptr[1:] = mask.sum(dim=1).cumsum(0)
    # row-major: grouped by query block
    col_idx = mask.nonzero()[:, 1].to(torch.int32).contiguous()
    out = torch.empty_like(q)
    lse = torch.empty(B, H, L, dtype=torch.float32, device=q.device)
    _block_sparse_fwd_kernel[(n_qb, B * H)](
        q,
        k,
        v,
        out,
        lse,
        row_ptr,
        col_idx,
        scale * _LOG2E,
        H,
        H_kv,
        L,
        S,
        BLOCK=block_size,
        HEAD_DIM=E,
        CAUSAL=bool(is_causal),
        PRECISION=_precision(q),
    )
    return out
