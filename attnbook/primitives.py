"""Shared numerical primitives: the online softmax and the log-sum-exp merge.

FlashAttention (Dao et al., 2022; Dao, 2023) never holds a whole row of scores: it
reads the row block by block and keeps a running maximum ``m`` and normalizer ``l``,
rescaling what it has summed whenever the maximum grows (the online softmax of Milakov
and Gimelshein, 2018). The same rescaling joins two attention outputs computed over
disjoint key sets, given the log-sum-exp of each one's scores: block-sparse attention
merges its pieces this way, flash-decoding merges the chunks of a KV cache, and ring
attention merges the blocks that arrive from other devices. Each step is written once,
here, and every module that needs it imports it:

* :func:`online_softmax_step`: fold one block of scores (and values) into ``(m, l,
  acc)``;
* :func:`online_softmax`: softmax over a row read in blocks;
* :func:`merge_partials`: combine two partial attention outputs by their log-sum-exp.

The running statistics are kept in float32 (float64 for float64 inputs), never in
half precision.
"""

from __future__ import annotations

import math

import torch

from .contract import check_flag, check_float, check_int

__all__ = ["online_softmax_step", "online_softmax", "merge_partials"]


# --------------------------------------------------------------------------------------
# Checks of the arguments
# --------------------------------------------------------------------------------------
def _accumulation_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float64 when any tensor is float64, else float32: the running statistics of the
    online softmax are never kept in float16 or bfloat16."""
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def _check_step(fn, m, l, scores, acc, values) -> None:
    """Shapes and dtypes of :func:`online_softmax_step`'s arguments."""
    for name, t in (("m", m), ("l", l), ("scores", scores)):
        check_float(fn, name, t)
    if scores.dim() < 1 or m.shape != scores.shape[:-1] or l.shape != m.shape:
        raise ValueError(
            f"{fn}: m and l must have the shape of scores without its last dimension "
            f"(..., rows), got m {tuple(m.shape)}, l {tuple(l.shape)}, scores "
            f"{tuple(scores.shape)}"
        )
    if (acc is None) != (values is None):
        raise ValueError(
            f"{fn}: acc and values come together (both or neither), got acc "
            f"{'None' if acc is None else tuple(acc.shape)} and values "
            f"{'None' if values is None else tuple(values.shape)}"
        )
    if values is None:
        return
    check_float(fn, "acc", acc)
    check_float(fn, "values", values)
    expected = None
    if scores.dim() >= 2 and values.dim() >= 2 and values.shape[-2] == scores.shape[-1]:
        try:
            batch = torch.broadcast_shapes(scores.shape[:-2], values.shape[:-2])
            expected = (*batch, scores.shape[-2], values.shape[-1])
        except RuntimeError:
            expected = None
    if expected is None or tuple(acc.shape) != expected:
        raise ValueError(
            f"{fn}: values must be (..., cols, Ev) with the cols of scores (..., rows, "
            f"cols), and acc (..., rows, Ev); got scores {tuple(scores.shape)}, values "
            f"{tuple(values.shape)}, acc {tuple(acc.shape)}"
        )


# --------------------------------------------------------------------------------------
# Online softmax and the log-sum-exp merge
# --------------------------------------------------------------------------------------
def online_softmax_step(
    m: torch.Tensor,
    l: torch.Tensor,
    scores: torch.Tensor,
    acc: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Fold one block of ``scores (..., rows, cols)`` into the running maximum ``m``
    and normalizer ``l`` (both ``(..., rows)``), and, with ``values (..., cols, Ev)``,
    into the unnormalized output ``acc (..., rows, Ev)``:

        ``m' = max(m, rowmax(scores))``, ``P = exp(scores - m')``,
        ``l' = l exp(m - m') + rowsum(P)``, ``acc' = acc exp(m - m') + P values``.

    The factor ``exp(m - m')`` rescales what was summed under the old maximum. Where the
    maximum is still ``-inf`` (only masked entries so far) 0 stands in for it, so no
    ``-inf - (-inf)`` becomes NaN. Returns ``(m', l', acc')`` (``acc'`` is None without
    values) in float32, or float64 when an argument is float64: the update is computed
    in that precision and float16/bfloat16 arguments are promoted, so running
    statistics never accumulate half-precision rounding. An empty block (``cols = 0``)
    changes nothing. The one update of the online softmax, FlashAttention's forward pass
    and (with :func:`merge_partials` between devices) ring attention.
    """
    _check_step("online_softmax_step", m, l, scores, acc, values)
    dtype = _accumulation_dtype(m, l, scores, acc, values)
    m, l, scores = m.to(dtype), l.to(dtype).clone(), scores.to(dtype).clone()
    acc = None if acc is None else acc.to(dtype).clone()
    values = None if values is None else values.to(dtype)
    return _fold_tile(m, l, scores, acc, values)


def _fold_tile(m, l, scores, acc=None, values=None):
    """:func:`online_softmax_step` as the tile loop runs it: ``(m', l', acc')``, with
    ``l``, ``acc`` and ``scores`` (which becomes ``P``) overwritten in place unless
    autograd records the step. The rescale by ``exp(m - m')`` and the product ``P V``
    are one ``acc * alpha + P V`` update (``baddbmm``), and no tile-sized temporary is
    allocated besides ``scores`` itself."""
    if scores.shape[-1] == 0:
        return m, l, acc
    m_new = torch.maximum(m, scores.amax(dim=-1))
    shift = torch.nan_to_num(m_new, nan=0.0, posinf=0.0, neginf=0.0)  # -inf: 0
    tensors = (m, l, scores, acc, values)
    if torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in tensors
    ):
        p, alpha = torch.exp(scores - shift[..., None]), torch.exp(m - shift)
        l = l * alpha + p.sum(dim=-1)
        acc = None if values is None else acc * alpha[..., None] + p @ values
        return m_new, l, acc
    p = scores.sub_(shift.unsqueeze(-1)).exp_()
    alpha = (m - shift).exp_()
    l.mul_(alpha).add_(p.sum(dim=-1))
    if values is not None:
        acc.mul_(alpha.unsqueeze(-1))
        if acc.dim() == p.dim() == values.dim() == 3:
            acc.baddbmm_(p, values)
        else:
            acc.add_(p @ values)
    return m_new, l, acc


def online_softmax(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """Softmax over the last dimension of ``x``, reading it ``block_size`` entries at a
    time.

    One pass keeps, per row, the running maximum ``m`` and the normalizer ``l = sum_j
    exp(x_j - m)`` of the entries seen so far. A new block ``x_B`` updates them as

        ``m' = max(m, max(x_B))``,   ``l' = l * exp(m - m') + sum_j exp(x_Bj - m')``,

    (rescaling the old sum to the new maximum), and a second pass writes ``exp(x_j - m)
    / l``. Equal to ``torch.softmax(x, -1)``; rows that are all ``-inf`` give zeros.
    ``m`` and ``l`` are kept in float32 (float64 for float64 ``x``), as the tiled
    forward pass keeps them, and the result is rounded to ``x``'s dtype once, at the
    end. Shapes: ``x (..., n)`` -> ``(..., n)``.
    """
    check_float("online_softmax", "x", x)
    if x.dim() < 1:
        raise ValueError("online_softmax: x must have at least 1 dimension, got 0-d")
    check_int("online_softmax", "block_size", block_size)
    acc = _accumulation_dtype(x)
    m = torch.full(x.shape[:-1], -math.inf, dtype=acc, device=x.device)
    l = torch.zeros_like(m)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start : start + block_size]
        m, l, _ = online_softmax_step(m, l, block)
    shift = torch.where(torch.isfinite(m), m, 0.0)
    p = torch.exp(x.to(acc) - shift[..., None])
    return (p / torch.where(l > 0, l, 1.0)[..., None]).to(x.dtype)


def merge_partials(
    out_a: torch.Tensor,
    lse_a: torch.Tensor,
    out_b: torch.Tensor,
    lse_b: torch.Tensor,
    *,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine attention over two disjoint key sets into attention over their union.

    ``out_x (..., L, Ev)`` is softmax attention over key set ``x`` alone and ``lse_x
    (..., L)`` the log-sum-exp of its scores. With ``lse = log(exp(lse_a) +
    exp(lse_b))``,

        ``out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b``.

    This is the step FlashAttention takes for every new key block and flash-decoding
    takes to merge chunks of a KV cache. A side with ``lse = -inf`` (no visible key)
    contributes nothing. ``inplace=True`` writes the result into ``out_a`` and
    ``lse_a`` (views of larger buffers included) and returns them: no output-sized
    temporary, for hot loops that merge into an accumulator.
    """
    _check_partials("merge_partials", out_a, lse_a, out_b, lse_b)
    check_flag("merge_partials", "inplace", inplace)
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isfinite(lse), lse, 0.0)
    w_a = torch.exp(lse_a - safe)[..., None]
    w_b = torch.exp(lse_b - safe)[..., None]
    if inplace:
        return out_a.mul_(w_a).addcmul_(out_b, w_b), lse_a.copy_(lse)
    return w_a * out_a + w_b * out_b, lse


def _check_partials(fn, out_a, lse_a, out_b, lse_b) -> None:
    """Each ``lse_x`` is ``out_x``'s shape without the last dimension; the two outputs
    have one shape."""
    for name, t in (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b)):
        check_float(fn, name, t)
    check_float(fn, "lse_b", lse_b)
    if (
        out_a.dim() < 1
        or out_a.shape != out_b.shape
        or lse_a.shape != out_a.shape[:-1]
        or lse_b.shape != out_b.shape[:-1]
    ):
        raise ValueError(
            f"{fn}: out_a and out_b must have one shape (..., L, Ev) and lse_a, lse_b "
            f"the shape (..., L); got out_a {tuple(out_a.shape)}, lse_a "
            f"{tuple(lse_a.shape)}, out_b {tuple(out_b.shape)}, lse_b "
            f"{tuple(lse_b.shape)}"
        )
