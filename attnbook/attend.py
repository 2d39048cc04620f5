"""The entry points that pick a backend: one interface over the PyTorch references and
the Triton kernels (FlashAttention-2's ``flash_attn_interface``, Dao, 2023).

Four functions run attention on whichever backend can: Triton on a CUDA GPU that can
run the kernel, the PyTorch reference elsewhere.

* :func:`flash_attention`: exact attention in tiles, differentiable to any order;
  PyTorch: :func:`attnbook.flash.flash_forward` and
  :func:`~attnbook.flash.flash_backward`; Triton:
  ``attnbook.kernels.flash_triton._flash_forward`` and ``_flash_backward``.
* :func:`flash_attention_varlen`: packed sequences of different lengths; PyTorch: each
  sequence alone; Triton: ``attnbook.kernels.flash_triton._varlen_forward`` and
  ``attnbook.kernels.flash_triton._varlen_backward``.
* :func:`block_sparse_flash_attention`: the active tiles of a block mask; PyTorch:
  :func:`attnbook.sparse.block_sparse_attention`; Triton:
  ``attnbook.kernels.flash_triton._block_sparse_attention_forward`` and
  ``attnbook.kernels.flash_triton._block_sparse_attention_backward``.
* :func:`decode_attention`: one query token per sequence against a cache (split-KV,
  "flash-decoding"); PyTorch: :func:`attnbook.kvcache.split_kv_attention`; Triton:
  ``attnbook.kernels.decode._split_kv_attention``.

Each one does the same three things, once: it validates its arguments
(:mod:`attnbook.contract`, and the Triton kernels' own limits when it picks them), asks
:func:`attnbook.kernels.plan_for` which backend ``backend="auto"`` means for these
tensors (:func:`select_backend`), and calls the autograd function of that backend or the
PyTorch path. The launchers behind it trust what they are given. ``return_backend=True``
says which backend ran, without global state. :mod:`attnbook.flash` and
:mod:`attnbook.kvcache`, where the chapters teach these functions, give them under
their old names too (``attnbook.flash.flash_attention``).
"""

from __future__ import annotations

import torch

from .contract import check_block_mask, check_float, check_qkv
from .contract import check_flag as _check_flag
from .contract import check_int as _check_int
from .contract import check_attention_options
from .flash import (  # the reference and its argument checks: one of each
    _as_4d,
    _check_head_dim,
    _check_scale,
    _from_4d,
    flash_backward,
    flash_forward,
)
from .kernels import MAX_HEAD_DIM, check_addressing, plan_for, triton_missing
from .kvcache import _check_split_kv, split_kv_attention
from .sparse import block_sparse_attention

__all__ = [
    "flash_attention",
    "flash_attention_varlen",
    "block_sparse_flash_attention",
    "decode_attention",
    "select_backend",
]

#: Per kernel: the module and jitted function a Triton launch needs, and the PyTorch
#: path to name when it cannot run.
_TRITON = {
    "flash": ("attnbook.kernels.flash_triton", "_fwd_kernel", "the PyTorch tiles"),
    "block_sparse": (
        "attnbook.kernels.flash_triton",
        "_fwd_kernel",
        "the PyTorch tiles",
    ),
    "decode": ("attnbook.kernels.decode", "_split_kernel", "split_kv_attention"),
}
_TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# --------------------------------------------------------------------------------------
# Choosing the backend
# --------------------------------------------------------------------------------------
def select_backend(
    q: torch.Tensor,
    backend: str = "auto",
    *,
    v: torch.Tensor | None = None,
    kernel: str = "flash",
    block_size: int | None = None,
) -> str:
    """Resolve ``backend`` for inputs like ``q``: ``"triton"`` or ``"torch"``.

    ``"auto"`` picks ``"triton"`` when ``q`` is on a CUDA GPU that can run the kernels
    (Triton installed, compute capability >= 7.0, bfloat16 only on >= 8.0, head dims
    of ``q`` and values ``v`` up to 256, a tile configuration that fits the GPU: the
    rule of :func:`attnbook.kernels.plan` for ``kernel``, ``"flash"`` or
    ``"block_sparse"`` with its ``block_size``), else ``"torch"``.
    ``"triton"`` requires Triton and either a CUDA tensor or Triton's CPU interpreter
    (environment variable ``TRITON_INTERPRET=1``, slow, for tests, set before
    :mod:`attnbook.kernels.flash_triton` is first imported, since Triton reads it when
    the kernels are defined); otherwise it raises ``RuntimeError`` saying what is
    missing.
    """
    fn = "select_backend"
    if kernel not in ("flash", "block_sparse"):
        raise ValueError(
            f"{fn}: kernel must be 'flash' or 'block_sparse', got {kernel!r}"
        )
    return _select_backend(fn, q, backend, v, kernel, block_size)


def _select_backend(
    fn: str,
    q: torch.Tensor,
    backend: str,
    v: torch.Tensor | None = None,
    kernel: str = "flash",
    block_size: int | None = None,
) -> str:
    """:func:`select_backend` for any kernel of :func:`attnbook.kernels.plan`, its
    errors naming the function ``fn`` that asked."""
    if not isinstance(backend, str) or backend not in ("auto", "torch", "triton"):
        raise ValueError(
            f"{fn}: backend must be 'auto', 'torch' or 'triton', got {backend!r}"
        )
    check_float(fn, "q", q)
    if backend == "torch":
        return "torch"
    if backend == "auto":
        return plan_for(kernel, q, v, block_size)[0]
    module, jitted, reference = _TRITON[kernel]
    missing = triton_missing(q, module, jitted)
    if missing is not None:  # before Triton's own "0 active drivers"
        raise RuntimeError(
            f"{fn}: backend='triton' needs {missing}. Or use backend='torch' "
            f"({reference}) or backend='auto'."
        )
    return "triton"


def _check_triton_limits(
    fn: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_size: int | None = None,
) -> None:
    """What the Triton kernels take beyond the contract: head dims of ``q`` and ``v``
    in ``[1, MAX_HEAD_DIM]``, float16, bfloat16 (on a GPU of compute capability 8.0+;
    Triton's CPU interpreter computes its dot products wrongly) or float32, rows of one
    head within 32-bit offsets (:func:`attnbook.kernels.check_addressing`; packed
    ``(total, H, E)`` tensors are read as one sequence of heads), and a block-sparse
    ``block_size`` that is a power of two >= 16."""
    heads = [t.transpose(0, 1).unsqueeze(0) if t.dim() == 3 else t for t in (q, k, v)]
    check_addressing(fn, **dict(zip("qkv", heads)))
    for name, t in (("q", q), ("v", v)):
        if not 1 <= t.shape[-1] <= MAX_HEAD_DIM:
            raise ValueError(
                f"{fn}: the head_dim of {name} {tuple(t.shape)} must be at most "
                f"{MAX_HEAD_DIM} for backend='triton', got {t.shape[-1]}"
            )
    if q.dtype not in _TRITON_DTYPES:
        raise ValueError(
            f"{fn}: backend='triton' takes q, k, v in float16, bfloat16 or float32, "
            f"got {q.dtype}"
        )
    if q.dtype == torch.bfloat16 and not q.is_cuda:
        raise ValueError(
            f"{fn}: bfloat16 is GPU-only: Triton's CPU interpreter computes bf16 dot "
            "products incorrectly"
        )
    if q.dtype == torch.bfloat16 and (
        torch.cuda.get_device_capability(q.device) < (8, 0)
    ):
        raise ValueError(
            f"{fn}: bfloat16 needs a GPU of compute capability >= 8.0 (Ampere); "
            f"{torch.cuda.get_device_name(q.device)} has "
            f"{torch.cuda.get_device_capability(q.device)}"
        )
    if block_size is not None and (block_size < 16 or block_size & (block_size - 1)):
        raise ValueError(
            f"{fn}: block_size must be a power of two >= 16 for backend='triton', "
            f"got {block_size}"
        )


def _differentiable_backward(forward, inputs, grad_out, needs_grad):
    """The gradients of ``forward(*inputs)`` against ``grad_out`` as tensors that are
    themselves differentiable: a backward pass run with ``create_graph=True`` (second
    derivatives, a gradient penalty) comes here.

    The hand-written backward passes treat the saved ``lse`` as a constant and the
    Triton ones are opaque to autograd, so their results cannot be differentiated
    again. Here ``forward`` (the PyTorch tiles, built of differentiable operations)
    runs once more under autograd and ``torch.autograd.grad`` differentiates it with
    ``create_graph=True``: exact second derivatives, at the price of autograd storing
    every tile of that recomputation (``O(L S)`` memory, only in this case)."""
    with torch.enable_grad():
        out = forward(*inputs)
    wanted = [t for t, need in zip(inputs, needs_grad) if need]
    grads = iter(
        torch.autograd.grad(out, wanted, grad_out, create_graph=True, allow_unused=True)
    )
    return tuple(next(grads) if need else None for need in needs_grad)


# --------------------------------------------------------------------------------------
# FlashAttention
# --------------------------------------------------------------------------------------
def _forward_pass(backend: str):
    """The forward pass of ``backend``: the Triton launcher or the PyTorch tiles."""
    if backend == "triton":
        from .kernels.flash_triton import _flash_forward

        return _flash_forward
    return flash_forward


def _needs_graph(*tensors: torch.Tensor) -> bool:
    """Whether autograd must record this call: gradients on and an input that wants
    one. Otherwise the entry points call the forward pass alone (no graph node, no
    saved tensors: less host time per call)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class _FlashAttention(torch.autograd.Function):
    """Autograd wrapper: saves ``(q, k, v, out, lse)``, never an ``L x S`` tensor."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, scale, backend, window, slopes, softcap):
        fused = {"window_size": window, "alibi_slopes": slopes, "softcap": softcap}
        out, lse = _forward_pass(backend)(
            q, k, v, is_causal=is_causal, scale=scale, **fused
        )
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal, ctx.scale, ctx.backend, ctx.fused = (
            is_causal,
            scale,
            backend,
            fused,
        )
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiable gradients

            def forward(q, k, v):
                return flash_forward(
                    q, k, v, is_causal=ctx.is_causal, scale=ctx.scale, **ctx.fused
                )[0]

            grads = _differentiable_backward(
                forward, (q, k, v), grad_out, ctx.needs_input_grad[:3]
            )
            return *grads, None, None, None, None, None, None
        if ctx.backend == "triton":
            from .kernels.flash_triton import _flash_backward

            check_addressing("flash_attention", grad_out=grad_out)
            run = _flash_backward
        else:
            run = flash_backward
        dq, dk, dv = run(
            q, k, v, out, lse, grad_out,
            is_causal=ctx.is_causal, scale=ctx.scale, **ctx.fused,
        )  # fmt: skip
        return dq, dk, dv, None, None, None, None, None, None


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    alibi_slopes: torch.Tensor | None = None,
    softcap: float = 0.0,
    backend: str = "auto",
    return_backend: bool = False,
):
    """Exact, differentiable attention ``softmax(q k^T * scale [+ causal mask]) v`` in
    tiles.

    Equal to ``attnbook.core.scaled_dot_product_attention(q, k, v, is_causal=is_causal,
    scale=scale, enable_gqa=True)`` (bottom-right causal alignment) with memory
    ``O(L + S)`` per head beyond the inputs and outputs, in the forward and the backward
    pass. FlashAttention-2's fused options, each applied inside the tiles (see
    :func:`attnbook.flash.flash_forward`): ``window_size=(left, right)`` (a
    sliding window; tiles outside it are skipped), ``alibi_slopes`` ``(H,)`` or ``(B,
    H)`` (ALiBi), ``softcap`` (Gemma 2's cap on the scores). ``backend``: ``"auto"``
    (Triton on a GPU that can run it, PyTorch elsewhere), ``"torch"`` or ``"triton"``
    (see :func:`select_backend`). Shapes follow :mod:`attnbook.contract`: ``q (..., H,
    L, E)``, ``k (..., Hkv, S, E)``, ``v (..., Hkv, S, Ev)`` -> ``(..., H, L, Ev)``.
    With ``return_backend=True`` it returns ``(out, backend)``, the backend that ran.

    Gradients of any order: a backward pass with ``create_graph=True`` (second
    derivatives, ``torch.autograd.gradgradcheck``) differentiates a recomputation of
    the forward pass in PyTorch tiles (on either backend) instead of the hand-written
    backward pass, so that pass needs ``O(L S)`` memory: autograd stores every tile.
    """
    fn = "flash_attention"
    check_qkv(fn, q, k, v)
    is_causal = _check_flag(fn, "is_causal", is_causal)
    return_backend = _check_flag(fn, "return_backend", return_backend)
    scale = _check_scale(fn, scale)
    _check_head_dim(fn, q, scale)
    rank = max(q.dim(), k.dim())
    q4, k4, v4, batch = _as_4d(q, k, v)
    window, slopes, softcap = check_attention_options(
        fn, q4, window_size, alibi_slopes, softcap
    )
    chosen = _select_backend(fn, q4, backend, v4)
    if chosen == "triton":
        _check_triton_limits(fn, q4, k4, v4)
    if _needs_graph(q4, k4, v4):
        out = _FlashAttention.apply(
            q4, k4, v4, bool(is_causal), scale, chosen, window, slopes, softcap
        )
    else:
        fused = {"window_size": window, "alibi_slopes": slopes, "softcap": softcap}
        out, _ = _forward_pass(chosen)(
            q4, k4, v4, is_causal=bool(is_causal), scale=scale, **fused
        )
    out = _from_4d(out, batch, rank)
    return (out, chosen) if return_backend else out


# --------------------------------------------------------------------------------------
# Packed sequences of different lengths
# --------------------------------------------------------------------------------------
def _check_cu_seqlens(
    fn: str, name: str, cu: torch.Tensor, total: int, max_len: int
) -> list[int]:
    """FlashAttention-2's ``cu_seqlens``: int32, 1-D, from 0 up to ``total``, never
    decreasing, no sequence longer than ``max_len``. Returns the offsets."""
    if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1:
        raise ValueError(
            f"{fn}: {name} must be a 1-D int32 tensor of offsets, got "
            f"{getattr(cu, 'dtype', type(cu).__name__)} "
            f"{tuple(getattr(cu, 'shape', ()))}"
        )
    offsets = cu.tolist()
    lengths = [b - a for a, b in zip(offsets, offsets[1:])]
    if len(offsets) < 2 or offsets[0] != 0 or offsets[-1] != total or min(lengths) < 0:
        raise ValueError(
            f"{fn}: {name} must rise from 0 to the {total} tokens without decreasing, "
            f"got {offsets}"
        )
    if max(lengths) > max_len:
        raise ValueError(
            f"{fn}: a sequence of {max(lengths)} tokens is longer than the max_seqlen "
            f"given for {name} ({max_len})"
        )
    return offsets


def _zeros_on_graph(x: torch.Tensor, width: int) -> torch.Tensor:
    """Zeros ``(*x.shape[:-1], width)`` that autograd sees as a function of ``x`` with
    zero gradient (a ``where`` that never picks ``x``: NaN-safe), so that a backward
    pass through an output made only of them gives zeros instead of failing."""
    never = torch.zeros((), dtype=torch.bool, device=x.device)
    rows = torch.where(never, x.sum(-1, keepdim=True), 0.0)
    return rows.expand(*x.shape[:-1], width)


class _VarlenFlash(torch.autograd.Function):
    """Autograd wrapper of the Triton varlen kernels."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, is_causal, scale, *fused):
        from .kernels.flash_triton import _varlen_forward

        window, slopes, softcap = fused
        options = {"window_size": window, "alibi_slopes": slopes, "softcap": softcap}
        out, lse = _varlen_forward(
            q, k, v, cu_q, cu_k, max_q, max_k,
            is_causal=is_causal, scale=scale, **options,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.sizes, ctx.is_causal, ctx.scale = (max_q, max_k), is_causal, scale
        ctx.options = options
        return out

    @staticmethod
    def backward(ctx, grad_out):
        from .kernels.flash_triton import _varlen_backward

        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiable gradients

            def forward(q, k, v):
                return flash_attention_varlen(
                    q, k, v, cu_q, cu_k, *ctx.sizes, is_causal=ctx.is_causal,
                    scale=ctx.scale, backend="torch", **ctx.options,
                )  # fmt: skip

            grads = _differentiable_backward(
                forward, (q, k, v), grad_out, ctx.needs_input_grad[:3]
            )
            return *grads, *([None] * 9)
        dq, dk, dv = _varlen_backward(
            q, k, v, out, lse, grad_out, cu_q, cu_k, *ctx.sizes,
            is_causal=ctx.is_causal, scale=ctx.scale, **ctx.options,
        )  # fmt: skip
        return dq, dk, dv, *([None] * 9)


def flash_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    alibi_slopes: torch.Tensor | None = None,
    softcap: float = 0.0,
    backend: str = "auto",
    return_backend: bool = False,
):
    """Attention over packed sequences of different lengths, FlashAttention-2's
    ``flash_attn_varlen_func``: no padding, and no token attends across a boundary.

    ``q (total_q, H, E)`` holds the queries of every sequence one after the other,
    sequence ``b`` in rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``; ``k, v (total_k,
    Hkv, E|Ev)`` likewise with ``cu_seqlens_k`` (int32 offsets starting at 0).
    ``max_seqlen_q`` and ``max_seqlen_k`` bound the lengths (the Triton grid is sized by
    them). Each sequence is attended as :func:`flash_attention` would attend it alone:
    causal masks and windows aligned bottom-right per sequence, ALiBi slopes ``(H,)`` or
    ``(B, H)``, ``softcap``. Returns ``(total_q, H, Ev)``, differentiable (to any order,
    as :func:`flash_attention`).
    """
    fn = "flash_attention_varlen"
    if not all(isinstance(t, torch.Tensor) and t.dim() == 3 for t in (q, k, v)):
        raise ValueError(
            f"{fn}: q, k, v must be packed (total, heads, head_dim), "
            f"got {[tuple(getattr(t, 'shape', ())) for t in (q, k, v)]}"
        )
    check_qkv(fn, *(t.transpose(0, 1) for t in (q, k, v)))
    if q.shape[1] % k.shape[1]:
        raise ValueError(
            f"{fn}: q's {q.shape[1]} heads are not a multiple of k's {k.shape[1]}: q "
            f"{tuple(q.shape)}, k {tuple(k.shape)}"
        )
    max_seqlen_q = _check_int(fn, "max_seqlen_q", max_seqlen_q, 0)
    max_seqlen_k = _check_int(fn, "max_seqlen_k", max_seqlen_k, 0)
    is_causal = _check_flag(fn, "is_causal", is_causal)
    return_backend = _check_flag(fn, "return_backend", return_backend)
    scale = _check_scale(fn, scale)
    _check_head_dim(fn, q, scale)
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if isinstance(cu, torch.Tensor) and cu.device != q.device:
            raise ValueError(
                f"{fn}: {name} must be on q's device {q.device}, got {cu.device}"
            )
    starts_q = _check_cu_seqlens(
        fn, "cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q
    )
    starts_k = _check_cu_seqlens(
        fn, "cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k
    )
    if len(starts_q) != len(starts_k):
        raise ValueError(
            f"{fn}: cu_seqlens_q and cu_seqlens_k must describe as many sequences, "
            f"got {len(starts_q) - 1} and {len(starts_k) - 1}"
        )
    n_seq = len(starts_q) - 1
    window, slopes, softcap = check_attention_options(
        fn, q.new_empty(n_seq, q.shape[1], 0, 0), window_size, alibi_slopes, softcap
    )
    chosen = _select_backend(fn, q.unsqueeze(0), backend, v)
    if chosen == "triton":
        _check_triton_limits(fn, q, k, v)
        out = _VarlenFlash.apply(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            bool(is_causal), scale, window, slopes, softcap,
        )  # fmt: skip
        return (out, chosen) if return_backend else out
    outs = []
    for b in range(n_seq):  # the reference: each sequence on its own
        L_b, S_b = starts_q[b + 1] - starts_q[b], starts_k[b + 1] - starts_k[b]
        if L_b == 0 or S_b == 0:  # no query, or nothing to see: zeros
            outs.append(_zeros_on_graph(q[starts_q[b] : starts_q[b + 1]], v.shape[-1]))
            continue
        qb, kb, vb = (
            t[lo:hi].transpose(0, 1).unsqueeze(0)
            for t, lo, hi in (
                (q, starts_q[b], starts_q[b + 1]),
                (k, starts_k[b], starts_k[b + 1]),
                (v, starts_k[b], starts_k[b + 1]),
            )
        )
        out = flash_attention(
            qb, kb, vb, is_causal=is_causal, scale=scale, window_size=window,
            alibi_slopes=None if slopes is None else slopes[b : b + 1],
            softcap=softcap, backend="torch",
        )  # fmt: skip
        outs.append(out[0].transpose(0, 1))
    out = torch.cat(outs) if outs else q.new_empty(0, q.shape[1], v.shape[-1])
    return (out, chosen) if return_backend else out


# --------------------------------------------------------------------------------------
# Block-sparse attention
# --------------------------------------------------------------------------------------
class _BlockSparseFlash(torch.autograd.Function):
    """Autograd wrapper of the Triton block-sparse kernels: saves ``(q, k, v, out,
    lse)`` and the mask; the backward visits the same active tiles."""

    @staticmethod
    def forward(ctx, q, k, v, block_mask, block_size, is_causal, scale):
        from .kernels.flash_triton import _block_sparse_attention_forward

        out, lse = _block_sparse_attention_forward(
            q, k, v, block_mask, block_size,
            is_causal=is_causal, scale=scale, return_lse=True,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, out, lse, block_mask)
        ctx.block_size, ctx.is_causal, ctx.scale = block_size, is_causal, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        from .kernels.flash_triton import _block_sparse_attention_backward

        q, k, v, out, lse, block_mask = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: differentiable gradients

            def forward(q, k, v):
                return block_sparse_attention(
                    q, k, v, block_mask, ctx.block_size, is_causal=ctx.is_causal,
                    scale=ctx.scale,
                )  # fmt: skip

            grads = _differentiable_backward(
                forward, (q, k, v), grad_out, ctx.needs_input_grad[:3]
            )
            return *grads, None, None, None, None
        check_addressing("block_sparse_flash_attention", grad_out=grad_out)
        dq, dk, dv = _block_sparse_attention_backward(
            q, k, v, out, lse, grad_out, block_mask, ctx.block_size,
            is_causal=ctx.is_causal, scale=ctx.scale,
        )  # fmt: skip
        return dq, dk, dv, None, None, None, None


def block_sparse_flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_mask: torch.Tensor,
    block_size: int,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    backend: str = "auto",
    return_backend: bool = False,
):
    """Attention restricted to the active tiles of a block mask, differentiable on
    both backends.

    Equal to :func:`attnbook.sparse.block_sparse_attention` (which the ``"torch"``
    backend calls); the ``"triton"`` backend runs the Triton twin
    ``attnbook.kernels.flash_triton._block_sparse_attention_forward``, which visits
    only the active key blocks of each query block, and its backward, which visits the
    same tiles (``block_size`` a power of two >= 16 there).
    ``block_mask (ceil(L / b), ceil(S / b))`` bool, ``b = block_size``; ``q (..., H,
    L, E)``, ``k (..., Hkv, S, E)``, ``v (..., Hkv, S, Ev)`` -> ``(..., H, L, Ev)``.
    With ``return_backend=True`` it returns ``(out, backend)``. Differentiable to any
    order (a backward pass with ``create_graph=True`` differentiates the PyTorch path).
    """
    fn = "block_sparse_flash_attention"
    check_qkv(fn, q, k, v)
    block_size = _check_int(fn, "block_size", block_size)
    is_causal = _check_flag(fn, "is_causal", is_causal)
    return_backend = _check_flag(fn, "return_backend", return_backend)
    scale = _check_scale(fn, scale)
    _check_head_dim(fn, q, scale)
    L, S = q.shape[-2], k.shape[-2]
    check_block_mask(fn, block_mask, L, S, block_size)
    rank = max(q.dim(), k.dim())
    q4, k4, v4, batch = _as_4d(q, k, v)
    chosen = _select_backend(fn, q4, backend, v4, "block_sparse", block_size)
    if L == 0 or S == 0:  # no tile at all: empty, or zeros (no key to see)
        out = flash_attention(q4, k4, v4, scale=scale, backend="torch")
    elif chosen == "triton":
        _check_triton_limits(fn, q4, k4, v4, block_size)
        out = _BlockSparseFlash.apply(
            q4, k4, v4, block_mask, block_size, bool(is_causal), scale
        )
    else:
        out = block_sparse_attention(
            q4, k4, v4, block_mask, block_size, is_causal=is_causal, scale=scale
        )
    out = _from_4d(out, batch, rank)
    return (out, chosen) if return_backend else out


# --------------------------------------------------------------------------------------
# Decoding against a cache
# --------------------------------------------------------------------------------------
def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    num_splits: int | None = None,
    scale: float | None = None,
    backend: str = "auto",
    return_backend: bool = False,
):
    """Split-KV decoding of one query token per sequence: ``q (batch, heads, 1,
    head_dim)`` over the first ``cache_seqlens[b]`` positions of ``k_cache (batch,
    kv_heads, max_len, head_dim)`` and ``v_cache (batch, kv_heads, max_len, v_dim)``
    -> ``(batch, heads, 1, v_dim)``.

    The Triton kernel (``attnbook.kernels.decode._split_kv_attention``) when
    ``backend="triton"`` or, with ``"auto"``, when the tensors are on a CUDA GPU that
    can run it (:func:`attnbook.kernels.plan`); its PyTorch reference
    :func:`attnbook.kvcache.split_kv_attention` (``backend="torch"``, ``num_splits``
    default 4) otherwise. With ``return_backend=True`` it returns ``(out, backend)``,
    the backend that ran. ``backend="triton"`` takes head dims up to 256 and
    ``num_splits`` up to 128 (the splits the merge kernel reads); on a CPU tensor it
    needs Triton's interpreter (``TRITON_INTERPRET=1`` set before the kernels are first
    imported); without it, or without Triton, a ``RuntimeError`` says what is missing
    (``attnbook.kernels.triton_missing``).
    """
    fn = "decode_attention"
    if not isinstance(backend, str) or backend not in ("auto", "torch", "triton"):
        raise ValueError(
            f"{fn}: backend must be 'auto', 'torch' or 'triton', got {backend!r}"
        )
    return_backend = _check_flag(fn, "return_backend", return_backend)
    _check_split_kv(fn, q, k_cache, v_cache, cache_seqlens, num_splits, scale)
    chosen = _select_backend(fn, q, backend, v_cache, "decode")
    if chosen == "triton":
        from .kernels.decode import MAX_SPLITS, _split_kv_attention

        for name, t in (("q", q), ("v_cache", v_cache)):
            if not 1 <= t.shape[-1] <= MAX_HEAD_DIM:
                raise ValueError(
                    f"{fn}: the head_dim of {name} {tuple(t.shape)} must be at most "
                    f"{MAX_HEAD_DIM} for backend='triton', got {t.shape[-1]}"
                )
        if num_splits is not None and num_splits > MAX_SPLITS:
            raise ValueError(
                f"{fn}: num_splits must be between 1 and {MAX_SPLITS} for "
                f"backend='triton' (the merge kernel reads every split in one tile), "
                f"got {num_splits}"
            )
        out = _split_kv_attention(
            q, k_cache, v_cache, cache_seqlens, num_splits=num_splits, scale=scale
        )
    else:
        splits = 4 if num_splits is None else num_splits
        out = split_kv_attention(
            q, k_cache, v_cache, cache_seqlens, num_splits=splits, scale=scale
        )
    return (out, chosen) if return_backend else out
