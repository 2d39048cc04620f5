"""Attention across devices: the sequence split over the ranks of a process group.

Each of the ``W`` ranks holds a shard ``(B, H, L / W, D)`` of ``q``, ``k`` and ``v``,
and every rank must end with the exact attention output of its own queries over the
whole sequence, and in the backward pass with the gradients of its own shards. Two
ways, one function each:

* :func:`ring_attention` (Liu et al., 2023): the key/value shards travel around a ring
  of ranks, one hop per step; each rank attends its queries to the block it holds and
  merges the partial results with the log-sum-exp merge of FlashAttention
  (:func:`attnbook.flash.merge_partials`). The next block's transfer is posted before
  the current block is computed, so communication can hide behind compute. Under a
  causal mask a contiguous split gives the last rank about ``2W - 1`` times the work of
  the first; the ``"zigzag"`` layout (rank ``r`` holds chunks ``r`` and ``2W - 1 - r``
  of ``2W``) gives every rank the same work, as striping does (Brandon et al., 2023).
* :func:`ulysses_attention` (Jacobs et al., 2023): an all-to-all turns sequence shards
  into head shards (each rank gets ``H / W`` heads over the whole sequence), each rank
  runs :func:`attnbook.attend.flash_attention` on its heads, and a second all-to-all
  turns the output back into sequence shards.

:func:`shard` and :func:`unshard` go between a full tensor and its shards,
:func:`ring_bytes_per_rank`, :func:`ulysses_bytes_per_rank` and :func:`pairs_per_rank`
give the communication and the causal work per rank in closed form, and
:func:`run_on_ranks` runs a function on ``W`` local processes over loopback (the gloo
backend on a CPU), so the tests and the chapter need no cluster.
"""

from __future__ import annotations

import math
import os
import pickle
import queue as queue_module
import socket
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist

from .contract import (
    check_flag,
    check_float,
    check_int,
    check_qkv,
    check_real,
    check_sizes,
    default_scale,
)
from .attend import flash_attention
from .flash import flash_backward, flash_forward
from .primitives import merge_partials

__all__ = [
    "CommStats",
    "shard_positions",
    "shard",
    "unshard",
    "ring_attention",
    "ulysses_attention",
    "ring_bytes_per_rank",
    "ulysses_bytes_per_rank",
    "pairs_per_rank",
    "attention_on_rank",
    "time_on_rank",
    "in_turn",
    "run_on_ranks",
    "context_memory_bytes",
    "largest_context",
]

LAYOUTS = ("contiguous", "zigzag")


# --------------------------------------------------------------------------------------
# Layouts: which positions each rank holds
# --------------------------------------------------------------------------------------
def _check_layout(fn: str, layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(
            f"{fn}: layout must be 'contiguous' or 'zigzag', got {layout!r}"
        )


def _check_rank(fn: str, rank, world, layout: str = "contiguous") -> None:
    """``world`` a positive integer, ``rank`` an integer in ``[0, world)``, ``layout``
    one of :data:`LAYOUTS`."""
    _check_layout(fn, layout)
    check_sizes(fn, world=world)
    if check_int(fn, "rank", rank, minimum=0) >= world:
        raise ValueError(f"{fn}: rank must lie in [0, world={world}), got {rank}")


def _check_dim(fn: str, name: str, x, dim) -> None:
    """``x`` a tensor and ``dim`` one of its dimensions."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if (
        isinstance(dim, bool)
        or not isinstance(dim, int)
        or not -x.dim() <= dim < x.dim()
    ):
        raise ValueError(
            f"{fn}: dim must be a dimension of {name} {tuple(x.shape)}, got {dim!r}"
        )


def _chunks(rank: int, world: int, n_local: int, layout: str) -> list[tuple[int, int]]:
    """The chunks of rank ``rank``'s shard: ``(global_start, length)`` in local order.

    ``"contiguous"``: one chunk, positions ``rank * n .. (rank + 1) * n - 1``.
    ``"zigzag"``: the sequence in ``2 W`` chunks of ``c = n / 2``; chunks ``rank`` and
    ``2 W - 1 - rank``. All chunks of a layout have one length and start at a multiple
    of it, so a (query chunk, key chunk) pair is under a causal mask entirely visible,
    entirely masked, or on the diagonal.
    """
    if layout == "contiguous":
        return [(rank * n_local, n_local)]
    c = n_local // 2
    return [(rank * c, c), ((2 * world - 1 - rank) * c, c)]


def shard_positions(
    rank: int, world: int, seq_len: int, *, layout: str = "contiguous"
) -> torch.Tensor:
    """The global positions (int64, ``(seq_len / world,)``, in local order) that rank
    ``rank`` of ``world`` holds.

    ``"contiguous"``: ``r n, ..., (r + 1) n - 1`` with ``n = seq_len / world``.
    ``"zigzag"``: cut into ``2 world`` chunks of ``c = n / 2``, rank ``r`` holds chunk
    ``r`` then chunk ``2 world - 1 - r``: an early chunk with little causal work and a
    late one with much. ``seq_len`` must divide evenly (by ``world``, or ``2 world`` for
    zigzag): pad the sequence at its end first.
    """
    fn = "shard_positions"
    _check_rank(fn, rank, world, layout)
    check_int(fn, "seq_len", seq_len, minimum=0)
    parts = world * (2 if layout == "zigzag" else 1)
    if seq_len % parts:
        raise ValueError(
            f"{fn}: seq_len={seq_len} does not split into {parts} equal "
            f"{'chunks' if layout == 'zigzag' else 'shards'} for world={world} "
            f"(layout {layout!r}); pad the sequence at its end to a multiple of {parts}"
        )
    return torch.cat(
        [
            torch.arange(start, start + length)
            for start, length in _chunks(rank, world, seq_len // world, layout)
        ]
    )


def shard(
    x: torch.Tensor,
    rank: int,
    world: int,
    *,
    layout: str = "contiguous",
    dim: int = -2,
) -> torch.Tensor:
    """Rank ``rank``'s shard of the full tensor ``x`` along ``dim`` (the sequence, -2
    in ``(B, H, L, D)``): ``x.index_select(dim, shard_positions(...))``, shape ``(...,
    L / world, ...)``."""
    _check_dim("shard", "x", x, dim)
    positions = shard_positions(rank, world, x.shape[dim], layout=layout)
    return x.index_select(dim, positions.to(x.device))


def _check_shard_list(shards, dim) -> None:
    """A non-empty list of tensors of one shape, dtype and device, ``dim`` one of
    their dimensions."""
    fn = "unshard"
    if not isinstance(shards, (list, tuple)) or not shards:
        raise ValueError(
            f"{fn}: shards must be a non-empty list of equal-length shards, got "
            f"{shards!r}"
        )
    for r, s in enumerate(shards):
        _check_dim(fn, f"shards[{r}]", s, dim)
    lengths = [s.shape[dim] for s in shards]
    if len(set(lengths)) != 1:
        raise ValueError(
            f"{fn}: shards must be a non-empty list of equal-length shards, got "
            f"lengths {lengths} along dim {dim}"
        )
    shapes = [tuple(s.shape) for s in shards]
    if len(set(shapes)) != 1:
        raise ValueError(
            f"{fn}: the shards must have one shape (every rank's shard of one tensor), "
            f"got shapes {shapes}"
        )
    dtypes, devices = [s.dtype for s in shards], [s.device for s in shards]
    if len(set(dtypes)) != 1:
        raise TypeError(f"{fn}: the shards must share one dtype, got {dtypes}")
    if len(set(devices)) != 1:
        raise ValueError(f"{fn}: the shards must be on one device, got {devices}")


def unshard(
    shards: list[torch.Tensor], *, layout: str = "contiguous", dim: int = -2
) -> torch.Tensor:
    """The full tensor from every rank's shard (``shards[r]`` from rank ``r``): the
    inverse of :func:`shard`, ``unshard([shard(x, r, W) for r in range(W)]) == x``.

    The shards are concatenated and their positions put back in order with the inverse
    of the permutation ``cat(shard_positions(r) for r)``. They must have one shape,
    dtype and device (``ValueError``, ``TypeError`` otherwise).
    """
    _check_shard_list(shards, dim)
    world = len(shards)
    seq_len = world * shards[0].shape[dim]
    order = torch.cat(
        [shard_positions(r, world, seq_len, layout=layout) for r in range(world)]
    )
    return torch.cat(shards, dim).index_select(
        dim, torch.argsort(order).to(shards[0].device)
    )


# --------------------------------------------------------------------------------------
# The process group: checks every rank agrees on, and statistics
# --------------------------------------------------------------------------------------
@dataclass
class CommStats:
    """What one rank did in one call, for measuring communication and load balance.

    ``bytes_sent``: bytes this rank sent to other ranks in the forward pass;
    ``bytes_sent_backward``: in the backward pass (0 until ``backward`` has run).
    ``blocks_computed`` and ``blocks_skipped``: (query chunk, key chunk) pairs this
    rank attended, or skipped because the causal mask hides them entirely (ring
    attention; Ulysses computes one block, its heads over the whole sequence).
    ``pairs_attended``: the (query, key) pairs the mask lets through, summed over batch
    and query heads: the useful work of the forward pass.
    """

    bytes_sent: int = 0
    bytes_sent_backward: int = 0
    blocks_computed: int = 0
    blocks_skipped: int = 0
    pairs_attended: int = 0


class _Ring(NamedTuple):
    """A process group seen from one rank: its size, its rank, the global ranks of the
    next and previous ranks on the ring, and the group itself."""

    world: int
    rank: int
    next: int
    prev: int
    group: object


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _ring_of(fn: str, group) -> _Ring:
    """``group`` (None: every process) seen from this rank. A wrong ``group`` is
    refused here, on the rank that passed it: with no group there is no one to tell."""
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(
            f"{fn}: this process is not a member of group (torch.distributed.new_group "
            "gave it no place in that group)"
        )
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(
            f"{fn}: group must be a torch.distributed process group or None, got "
            f"{type(group).__name__}"
        )
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
    return _Ring(world, rank, ranks[(rank + 1) % world], ranks[rank - 1], group)


# Why the ranks' calls must agree, for each thing they compare (see _agree)
_MUST_AGREE = {
    "function": "every rank must run the same function",
    "shape": "every rank must hold a shard of one shape",
    "dtype": "the ranks exchange blocks of one dtype",
    "device": "the ranks exchange blocks on one kind of device",
    "requires_grad": "the backward pass exchanges gradients, so every rank must run "
    "it: make the same inputs require grad on every rank",
    "is_causal": "every rank must use the same options, or the output mixes two "
    "attentions",
    "scale": "every rank must use the same options, or the output mixes two attentions",
    "layout": "every rank must use the same layout, or the positions are wrong",
}
_ERRORS = {"ValueError": ValueError, "TypeError": TypeError}


def _describe(shape: tuple[int, ...]) -> str:
    batch, heads, kv_heads, length, e, ev = shape
    return f"(B={batch}, H={heads}, Hkv={kv_heads}, L_local={length}, E={e}, Ev={ev})"


def _shared_error(fn: str, failed: dict, world: int) -> Exception:
    """The error every rank raises when the checks of the ranks in ``failed`` (rank ->
    (error type, message)) raised: that error itself when every rank failed alike,
    else one of the first failing rank's type giving each failing rank's message."""
    kind, message = next(iter(failed.values()))
    by_message: dict[str, list[int]] = {}
    for r, (_, m) in failed.items():
        by_message.setdefault(m, []).append(r)
    if len(failed) == world and len(by_message) == 1:
        return _ERRORS[kind](message)
    parts = "; ".join(
        f"rank{'s' * (len(rs) > 1)} {', '.join(map(str, rs))}: {m}"
        for m, rs in by_message.items()
    )
    return _ERRORS[kind](
        f"{fn}: the inputs of rank(s) {sorted(failed)} of {world} are invalid, so "
        f"every rank raises this error. {parts}"
    )


def _compare_calls(fn: str, calls: list[dict]) -> None:
    """``ValueError`` naming the first thing the ranks' ``calls`` differ in."""
    for field in calls[0]:
        values = [c[field] for c in calls]
        if len(set(values)) == 1:
            continue
        if field == "shape" and len({v[3] for v in values}) > 1:
            lengths = [v[3] for v in values]
            raise ValueError(
                f"{fn}: the shards differ in length across ranks: L_local = "
                f"{lengths}. Every rank must hold as many positions: pad the sequence "
                "at its end to a multiple of the world size (2 x world for zigzag) "
                "before sharding. Under is_causal the padded keys come after every "
                "real query and change nothing."
            )
        shown = [_describe(v) if field == "shape" else v for v in values]
        raise ValueError(
            f"{fn}: the ranks' calls differ in {field}: "
            + ", ".join(f"rank {r} {v}" for r, v in enumerate(shown))
            + f"; {_MUST_AGREE[field]}"
        )


def _agree(fn: str, group, error: Exception | None, call: dict | None = None) -> _Ring:
    """Make every rank of ``group`` raise the same error, or none, before data moves.

    Each rank calls it after checking its own arguments, with the error its checks
    raised (None when they passed) and ``call``, what it is about to do (function,
    shapes, dtype, device, options). One ``all_gather_object`` shares both; then if
    any rank's checks failed, every rank raises that error (:func:`_shared_error`),
    and if the calls differ, every rank raises the same ``ValueError`` naming what
    differs. Otherwise the ranks whose checks passed would wait forever in a
    collective the others never join, and shards of different sizes or dtypes would
    make gloo abort the process. Without an initialized process group the error is
    raised as it is, or a ``RuntimeError`` says the group is missing. (Under NCCL the
    objects travel through the GPU that ``torch.cuda.set_device`` chose for the rank.)
    """
    if not (dist.is_available() and dist.is_initialized()):
        if error is not None:
            raise error
        raise RuntimeError(
            f"{fn} needs an initialized process group: call "
            "torch.distributed.init_process_group first, or run the function under "
            "attnbook.distributed.run_on_ranks"
        )
    ring = _ring_of(fn, group)
    kind = "TypeError" if isinstance(error, TypeError) else "ValueError"
    mine = (None if error is None else (kind, str(error)), call)
    reports: list = [None] * ring.world
    dist.all_gather_object(reports, mine, group=group)
    failed = {r: report for r, (report, _) in enumerate(reports) if report is not None}
    if failed:
        raise _shared_error(fn, failed, ring.world) from error
    if call is not None:
        _compare_calls(fn, [c for _, c in reports])
    return ring


_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_local_shards(fn: str, q, k, v) -> None:
    """This rank's ``q, k, v``: the contract, and what sharded attention adds to it."""
    check_qkv(fn, q, k, v)
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if q.dtype not in _DTYPES:
        raise TypeError(
            f"{fn}: q, k and v must be float16, bfloat16, float32 or float64, got "
            f"{q.dtype}"
        )
    if min(q.dim(), k.dim()) < 3 or q.shape[:-3] != k.shape[:-3]:
        raise ValueError(
            f"{fn}: q, k and v must be (..., heads, seq, head_dim) shards with the "
            f"same leading dimensions, got {shapes}"
        )
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"{fn}: q and k must be shards of one sequence (the same local length, "
            f"dim -2), got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
    heads, kv_heads = q.shape[-3], k.shape[-3]
    if heads and (kv_heads == 0 or heads % kv_heads):
        raise ValueError(
            f"{fn}: q's heads must be a multiple of k's (grouped-query attention; a "
            f"single query head does not broadcast over key/value heads here), got "
            f"{shapes}"
        )
    if q.shape[-1] == 0:
        raise ValueError(
            f"{fn}: head_dim must be >= 1 (with 0 every score is 0, and the default "
            f"scale 1/sqrt(head_dim) is undefined), got {shapes}"
        )


def _check_shards(
    fn, q, k, v, group, *, is_causal, scale, return_stats, layout="contiguous"
) -> _Ring:
    """Check this rank's ``q, k, v`` and options, then agree with the other ranks
    (:func:`_agree`): every rank raises the same error, or none."""
    error, call = None, None
    try:
        _check_layout(fn, layout)
        is_causal = check_flag(fn, "is_causal", is_causal)
        check_flag(fn, "return_stats", return_stats)
        if scale is not None:
            check_real(fn, "scale", scale)
        _check_local_shards(fn, q, k, v)
        call = {
            "function": fn,
            "shape": (math.prod(q.shape[:-3]), q.shape[-3], k.shape[-3], q.shape[-2],
                      q.shape[-1], v.shape[-1]),  # fmt: skip
            "dtype": str(q.dtype),
            "device": q.device.type,
            "requires_grad": tuple(
                torch.is_grad_enabled() and t.requires_grad for t in (q, k, v)
            ),
            "is_causal": is_causal,
            "scale": default_scale(scale, q.shape[-1]),
            "layout": layout,
        }
    except (ValueError, TypeError) as e:
        error = e
    return _agree(fn, group, error, call)


def _empty_output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The output ``(..., H, n, Ev)`` when it has no element (a batch, head count,
    local length or value width of 0), as PyTorch's SDPA gives it. Autograd sees it as
    a function of ``q, k, v`` with zero gradient (a ``where`` that never picks them,
    so NaN-safe), so a backward pass gives zeros instead of failing."""
    never = torch.zeros((), dtype=torch.bool, device=q.device)
    anchor = torch.where(never, q.sum() + k.sum() + v.sum(), 0.0)
    return anchor.expand(*q.shape[:-1], v.shape[-1]).contiguous()


# --------------------------------------------------------------------------------------
# Ring attention
# --------------------------------------------------------------------------------------
class _InFlight(NamedTuple):
    works: list
    received: list[torch.Tensor]


def _pass_along(tensors: list[torch.Tensor], ring: _Ring, tag: int) -> _InFlight:
    """Post one hop around the ring: send ``tensors`` to the next rank and receive
    tensors of the same shapes from the previous one (tags ``tag, tag + 1, ...``).
    Returns at once; ``wait`` on the works before reading the received tensors."""
    received = [torch.empty_like(t) for t in tensors]
    ops = []
    for i, (t, buf) in enumerate(zip(tensors, received)):
        ops.append(dist.P2POp(dist.isend, t, ring.next, ring.group, tag + i))
        ops.append(dist.P2POp(dist.irecv, buf, ring.prev, ring.group, tag + i))
    return _InFlight(dist.batch_isend_irecv(ops), received)


def _arrive(flight: _InFlight) -> list[torch.Tensor]:
    for work in flight.works:
        work.wait()
    return flight.received


def _block_pairs(ring: _Ring, src: int, n: int, layout: str, is_causal: bool):
    """The (query chunk, key chunk) pairs of this rank's queries against the block of
    rank ``src``: ``(q_slice, k_slice, diagonal)`` for each pair to compute, and the
    number of pairs the causal mask hides entirely (key chunk after the query chunk)."""
    pairs, skipped = [], 0
    q_chunks = _chunks(ring.rank, ring.world, n, layout)
    k_chunks = _chunks(src, ring.world, n, layout)
    q_local = 0
    for qa, c in q_chunks:
        k_local = 0
        for kb, _ in k_chunks:
            if is_causal and kb > qa:
                skipped += 1
            else:
                diagonal = is_causal and kb == qa
                rows = slice(q_local, q_local + c)
                pairs.append((rows, slice(k_local, k_local + c), diagonal))
            k_local += c
        q_local += c
    return pairs, skipped


def _ring_forward(q, k, v, scale, is_causal, layout, ring, stats):
    """``(out, lse)`` of this rank's queries over the whole ring: ``W`` steps, at step
    ``t`` the key/value block of rank ``r - t``; each pair of chunks through
    :func:`~attnbook.flash.flash_forward`, merged with
    :func:`~attnbook.flash.merge_partials`, in float32 (float64 for float64 inputs)."""
    B, H, n, _ = q.shape
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    qa = q.to(acc)
    out = q.new_zeros(B, H, n, v.shape[-1], dtype=acc)
    lse = q.new_full((B, H, n), float("-inf"), dtype=acc)
    for step in range(ring.world):
        flight = None
        if step < ring.world - 1:  # the next block travels while this one is computed
            flight = _pass_along([k, v], ring, tag=0)
            stats.bytes_sent += _nbytes(k) + _nbytes(v)
        src = (ring.rank - step) % ring.world
        pairs, skipped = _block_pairs(ring, src, n, layout, is_causal)
        stats.blocks_skipped += skipped
        for rows, cols, diagonal in pairs:
            o, s = flash_forward(
                qa[:, :, rows], k[:, :, cols].to(acc), v[:, :, cols].to(acc),
                is_causal=diagonal, scale=scale,
            )  # fmt: skip
            out[:, :, rows], lse[:, :, rows] = merge_partials(
                out[:, :, rows], lse[:, :, rows], o, s
            )
            c = rows.stop - rows.start
            stats.blocks_computed += 1
            stats.pairs_attended += B * H * (c * (c + 1) // 2 if diagonal else c * c)
        if flight is not None:
            k, v = _arrive(flight)
    return out.to(q.dtype), lse


def _ring_backward(q, k, v, out, lse, dout, scale, is_causal, layout, ring, stats):
    """``(dq, dk, dv)`` of this rank's shards. The key/value blocks make the forward
    trip again, and with each block travels the accumulator of its ``dK, dV``: every
    rank adds the gradient its queries give the block (recomputed from the saved ``out``
    and ``lse`` by :func:`~attnbook.flash.flash_backward`) and passes it on;
    after ``W`` hops each accumulator is back home. The accumulators travel in float32
    (float64 for float64 inputs), and one step's accumulators are in flight while the
    next step is computed."""
    n = q.shape[2]
    acc = lse.dtype
    qa, out, dout = q.to(acc), out.to(acc), dout.to(acc)
    dq = torch.zeros_like(qa)
    grads_flight = None
    for step in range(ring.world):
        kv_flight = None
        if step < ring.world - 1:
            kv_flight = _pass_along([k, v], ring, tag=0)
            stats.bytes_sent_backward += _nbytes(k) + _nbytes(v)
        src = (ring.rank - step) % ring.world
        dk = torch.zeros_like(k, dtype=acc)
        dv = torch.zeros_like(v, dtype=acc)
        for rows, cols, diagonal in _block_pairs(ring, src, n, layout, is_causal)[0]:
            dq_p, dk_p, dv_p = flash_backward(
                qa[:, :, rows], k[:, :, cols].to(acc), v[:, :, cols].to(acc),
                out[:, :, rows], lse[:, :, rows], dout[:, :, rows],
                is_causal=diagonal, scale=scale,
            )  # fmt: skip
            dq[:, :, rows] += dq_p
            dk[:, :, cols] += dk_p
            dv[:, :, cols] += dv_p
        if grads_flight is not None:  # what the ranks before added to this block
            dk_in, dv_in = _arrive(grads_flight)
            dk, dv = dk + dk_in, dv + dv_in
        if kv_flight is not None:
            k, v = _arrive(kv_flight)
        if ring.world > 1:
            grads_flight = _pass_along([dk, dv], ring, tag=2)
            stats.bytes_sent_backward += _nbytes(dk) + _nbytes(dv)
    if grads_flight is not None:
        dk, dv = _arrive(grads_flight)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    """Saves this rank's ``(q, k, v, out, lse)``; the backward runs the ring again."""

    @staticmethod
    def forward(ctx, q, k, v, scale, is_causal, layout, ring, stats):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, lse = _ring_forward(q, k, v, scale, is_causal, layout, ring, stats)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (scale, is_causal, layout, ring, stats)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        grads = _ring_backward(q, k, v, out, lse, dout.contiguous(), *ctx.options)
        return *grads, None, None, None, None, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    layout: str = "contiguous",
    group=None,
    return_stats: bool = False,
):
    """Exact attention over a sequence sharded across the ranks of ``group``, the
    key/value shards passed around a ring (Liu et al., 2023); differentiable.

    Rank ``r`` of ``W`` holds ``q, k, v (..., H|Hkv, n, E|Ev)``, the positions
    :func:`shard_positions` gives it (``layout``), and gets ``out (..., H, n, Ev)``
    equal to its rows of ``softmax(Q K^T * scale [+ causal mask]) V`` over the full
    sequence. At step ``t = 0 .. W - 1`` it holds the block ``K_s, V_s`` of rank ``s =
    r - t (mod W)``, posts its send to rank ``r + 1`` (and the receive of the next
    block from ``r - 1``), computes ``(O_rs, lse_rs)`` of its queries against the block,
    and merges, with ``lse = log(exp(lse) + exp(lse_rs))``,

        ``O <- exp(lse_old - lse) O + exp(lse_rs - lse) O_rs``.

    ``is_causal`` masks from the global positions, per (query chunk, key chunk) pair: a
    key chunk after the query chunk is skipped, one before it is attended in full, the
    diagonal one with the causal mask. Under ``"contiguous"`` rank ``r`` attends ``r +
    1`` of the ``W`` blocks; ``"zigzag"`` balances the work (:func:`pairs_per_rank`).
    The sends and receives are posted with ``batch_isend_irecv`` and waited for only
    after the block is computed: gloo moves the bytes on its own threads, NCCL on its
    own CUDA stream, so the transfer runs while the rank computes.

    The backward pass, a custom autograd function, recomputes each block's
    probabilities from the saved ``out`` and ``lse`` as FlashAttention's does
    (:func:`~attnbook.flash.flash_backward`): the blocks go around the ring
    again, each with the accumulator of its ``dK, dV``, which every rank adds to and
    passes on, so after ``W`` hops each rank holds the gradients of its own shards.
    Under grouped-query attention (``Hkv`` dividing ``H``) only the smaller key/value
    heads travel.

    Every rank must make the same call: shards of one shape (pad the sequence
    otherwise), dtype (float16, bfloat16, float32 or float64) and kind of device, the
    same inputs requiring grad, the same ``is_causal``, ``scale`` and ``layout``. The
    ranks compare their calls in one collective before any data moves, so a wrong
    argument on any rank, or a difference between ranks, raises the same
    ``ValueError`` or ``TypeError`` on every rank, instead of leaving the others waiting
    or gloo aborting on blocks of different sizes; ``RuntimeError`` without an
    initialized process group. ``H`` must be a multiple of ``Hkv`` (one query head does
    not broadcast over several key/value heads here) and ``E >= 1``. An output with no
    element (a batch, head count, local length or ``Ev`` of 0) comes back at once,
    empty as from SDPA, with zero gradients and no communication. With
    ``return_stats=True`` it returns ``(out, stats)``, a :class:`CommStats` whose
    backward fields fill in when the backward pass runs.
    """
    fn = "ring_attention"
    ring = _check_shards(
        fn, q, k, v, group, is_causal=is_causal, scale=scale,
        return_stats=return_stats, layout=layout,
    )  # fmt: skip
    n = q.shape[-2]
    if layout == "zigzag" and n % 2:
        raise ValueError(
            f"{fn}: layout='zigzag' holds two chunks per rank, so the local length "
            f"must be even, got q {tuple(q.shape)}"
        )
    scale = default_scale(scale, q.shape[-1])
    stats = CommStats()
    if not math.prod((*q.shape[:-1], v.shape[-1])):  # nothing to compute or send
        out = _empty_output(q, k, v)
        return (out, stats) if return_stats else out
    q4, k4, v4 = (t.reshape(-1, *t.shape[-3:]) for t in (q, k, v))
    out = _RingAttention.apply(q4, k4, v4, scale, bool(is_causal), layout, ring, stats)
    out = out.reshape(*q.shape[:-1], v.shape[-1])
    return (out, stats) if return_stats else out


# --------------------------------------------------------------------------------------
# Ulysses: all-to-all from sequence shards to head shards
# --------------------------------------------------------------------------------------
def _all_to_all(x: torch.Tensor, to_heads: bool, ring: _Ring) -> torch.Tensor:
    """One all-to-all between the two layouts of ``W`` ranks.

    ``to_heads``: ``(B, H, n, D)``, all heads of this rank's positions -> ``(B, H / W,
    W n, D)``, this rank's heads over every position (rank ``s``'s positions at ``s n ..
    (s + 1) n - 1``). Otherwise the inverse. Each rank keeps ``1 / W`` of its tensor and
    sends ``W - 1`` pieces, one to every other rank.
    """
    W = ring.world
    if to_heads:
        B, H, n, D = x.shape
        send = x.reshape(B, W, H // W, n, D).transpose(0, 1)  # piece s: heads of rank s
    else:
        B, h, L, D = x.shape
        send = x.reshape(B, h, W, L // W, D).permute(2, 0, 1, 3, 4)  # piece s: rank s's
    received = torch.empty_like(send.contiguous())
    dist.all_to_all_single(received, send.contiguous(), group=ring.group)
    if to_heads:  # piece s: our heads at rank s's positions
        return received.permute(1, 2, 0, 3, 4).reshape(B, H // W, W * n, D)
    return received.transpose(0, 1).reshape(B, W * h, L // W, D)  # piece s: heads of s


class _AllToAll(torch.autograd.Function):
    """:func:`_all_to_all`, whose gradient is the all-to-all the other way."""

    @staticmethod
    def forward(ctx, x, to_heads, ring, stats):
        ctx.options = (to_heads, ring, stats)
        stats.bytes_sent += _nbytes(x) * (ring.world - 1) // ring.world
        return _all_to_all(x, to_heads, ring)

    @staticmethod
    def backward(ctx, grad):
        to_heads, ring, stats = ctx.options
        stats.bytes_sent_backward += _nbytes(grad) * (ring.world - 1) // ring.world
        return _all_to_all(grad.contiguous(), not to_heads, ring), None, None, None


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    group=None,
    return_stats: bool = False,
):
    """Exact attention over a sequence sharded across the ranks of ``group``, by
    switching from sequence shards to head shards and back (DeepSpeed-Ulysses, Jacobs
    et al., 2023); differentiable.

    Rank ``r`` of ``W`` holds ``q (..., H, n, E)``, ``k (..., Hkv, n, E)``, ``v (...,
    Hkv, n, Ev)`` at positions ``r n .. (r + 1) n - 1`` (the contiguous layout). An
    all-to-all gives it heads ``r H / W .. (r + 1) H / W - 1`` over all ``L = W n``
    positions, ``(..., H / W, L, E)``; :func:`attnbook.attend.flash_attention` computes
    their attention on the rank; a second all-to-all returns ``out (..., H, n, Ev)``.
    The backward pass runs the same all-to-alls the other way. Each rank sends ``(W -
    1) / W`` of each of ``q, k, v, out``: ``4 (W - 1) / W^2`` of a full tensor, less
    per rank as ``W`` grows, where the ring sends about one full key and value tensor.

    ``H`` (and ``Hkv``) must be divisible by ``W``: it raises ``ValueError`` naming
    ``n_heads`` and the world size otherwise. The other rules, the checks every rank
    agrees on and the empty output are those of :func:`ring_attention`.
    ``return_stats=True`` returns ``(out, stats)``, a :class:`CommStats`.
    """
    fn = "ulysses_attention"
    ring = _check_shards(
        fn, q, k, v, group, is_causal=is_causal, scale=scale, return_stats=return_stats
    )
    for name, heads in (("n_heads", q.shape[-3]), ("n_kv_heads", k.shape[-3])):
        if heads % ring.world:
            raise ValueError(
                f"{fn}: {name}={heads} is not divisible by the world size "
                f"{ring.world}: each rank takes {name} / world heads (q "
                f"{tuple(q.shape)}, k {tuple(k.shape)}); use ring_attention instead"
            )
    stats = CommStats()
    if not math.prod((*q.shape[:-1], v.shape[-1])):  # nothing to compute or send
        out = _empty_output(q, k, v)
        return (out, stats) if return_stats else out
    q4, k4, v4 = (t.reshape(-1, *t.shape[-3:]) for t in (q, k, v))
    qh, kh, vh = (_AllToAll.apply(t, True, ring, stats) for t in (q4, k4, v4))
    out = flash_attention(qh, kh, vh, is_causal=is_causal, scale=scale)
    out = _AllToAll.apply(out, False, ring, stats)
    B, h, L = qh.shape[:3]
    stats.blocks_computed = 1
    stats.pairs_attended = B * h * (L * (L + 1) // 2 if is_causal else L * L)
    out = out.reshape(*q.shape[:-1], v.shape[-1])
    return (out, stats) if return_stats else out


# --------------------------------------------------------------------------------------
# Communication and work in closed form
# --------------------------------------------------------------------------------------
def _local_length(fn: str, seq_len: int, world: int) -> int:
    check_sizes(fn, seq_len=seq_len, world=world)
    if seq_len % world:
        raise ValueError(
            f"{fn}: seq_len={seq_len} must split evenly over world={world} ranks"
        )
    return seq_len // world


def _check_bytes_sizes(fn: str, batch, heads, head_dim, bytes_per_elem) -> None:
    check_sizes(fn, batch=batch, heads=heads, head_dim=head_dim)
    check_sizes(fn, bytes_per_elem=bytes_per_elem)


def _check_optional_sizes(fn: str, **sizes) -> None:
    """Each of ``sizes`` None (its default) or a positive integer."""
    check_sizes(fn, **{name: v for name, v in sizes.items() if v is not None})


def _check_groups(fn: str, heads: int, kv_heads: int, world: int | None = None):
    """``kv_heads`` divides ``heads`` (grouped-query attention shares each key/value
    head among ``heads / kv_heads`` query heads); with ``world``, Ulysses' split of
    the heads: ``world`` divides both."""
    if heads % kv_heads:
        raise ValueError(
            f"{fn}: kv_heads={kv_heads} must divide heads={heads}: grouped-query "
            "attention shares each key/value head among heads / kv_heads query heads"
        )
    for name, h in (("heads", heads), ("kv_heads", kv_heads)):
        if world is not None and h % world:
            raise ValueError(
                f"{fn}: {name}={h} is not divisible by world={world}: Ulysses gives "
                f"each rank {name} / world heads"
            )


def ring_bytes_per_rank(
    batch: int,
    heads: int,
    seq_len: int,
    head_dim: int,
    world: int,
    bytes_per_elem: int,
    *,
    kv_heads: int | None = None,
    value_dim: int | None = None,
) -> dict[str, int]:
    """Bytes each rank sends in :func:`ring_attention`: ``{"forward", "backward"}``.

    A rank's key and value blocks hold ``b = batch * kv_heads * (seq_len / world) *
    (head_dim + value_dim)`` elements (``kv_heads`` defaults to ``heads``, ``value_dim``
    to ``head_dim``; the queries never travel). Forward: the blocks make ``W - 1``
    hops, ``(W - 1) b * bytes_per_elem``. Backward: the same again, plus the ``dK, dV``
    accumulators making ``W`` hops (the last one home) in float32, or float64 for 8-byte
    inputs: ``W b * max(bytes_per_elem, 4)`` (nothing when ``W = 1``). About ``2 L D``
    per key/value head however many ranks share the sequence. ``kv_heads`` must divide
    ``heads`` (``ValueError`` otherwise).
    """
    n = _local_length("ring_bytes_per_rank", seq_len, world)
    _check_bytes_sizes("ring_bytes_per_rank", batch, heads, head_dim, bytes_per_elem)
    _check_optional_sizes("ring_bytes_per_rank", kv_heads=kv_heads, value_dim=value_dim)
    kv_heads = heads if kv_heads is None else kv_heads
    value_dim = head_dim if value_dim is None else value_dim
    _check_groups("ring_bytes_per_rank", heads, kv_heads)
    block = batch * kv_heads * n * (head_dim + value_dim)
    forward = (world - 1) * block * bytes_per_elem
    grads = world * block * max(bytes_per_elem, 4) if world > 1 else 0
    return {"forward": forward, "backward": forward + grads}


def ulysses_bytes_per_rank(
    batch: int,
    heads: int,
    seq_len: int,
    head_dim: int,
    world: int,
    bytes_per_elem: int,
    *,
    kv_heads: int | None = None,
    value_dim: int | None = None,
) -> dict[str, int]:
    """Bytes each rank sends in :func:`ulysses_attention`: ``{"forward",
    "backward"}``.

    An all-to-all sends ``W - 1`` of the ``W`` pieces of a rank's ``(batch, h, seq_len /
    W, d)`` shard. Forward: ``q (heads, head_dim)``, ``k (kv_heads, head_dim)``, ``v
    (kv_heads, value_dim)`` and the output ``(heads, value_dim)`` (``kv_heads`` defaults
    to ``heads``, ``value_dim`` to ``head_dim``):

        ``(W - 1) / W * batch * (seq_len / W) * (heads + kv_heads) * (head_dim +
        value_dim)``

    elements of ``bytes_per_elem``. The backward pass sends ``dO`` one way and ``dQ,
    dK, dV`` the other: the same. As in :func:`ulysses_attention`, ``world`` must
    divide ``heads`` and ``kv_heads``, and ``kv_heads`` divide ``heads`` (``ValueError``
    otherwise).
    """
    fn = "ulysses_bytes_per_rank"
    n = _local_length(fn, seq_len, world)
    _check_bytes_sizes(fn, batch, heads, head_dim, bytes_per_elem)
    _check_optional_sizes(fn, kv_heads=kv_heads, value_dim=value_dim)
    kv_heads = heads if kv_heads is None else kv_heads
    value_dim = head_dim if value_dim is None else value_dim
    _check_groups(fn, heads, kv_heads, world)
    shards = batch * n * (heads + kv_heads) * (head_dim + value_dim)
    sent = shards * (world - 1) // world * bytes_per_elem
    return {"forward": sent, "backward": sent}


def _check_pairs(seq_len, world, layout, is_causal) -> None:
    fn = "pairs_per_rank"
    _check_rank(fn, 0, world, layout)
    check_int(fn, "seq_len", seq_len, minimum=0)
    check_flag(fn, "is_causal", is_causal)


def pairs_per_rank(
    seq_len: int, world: int, *, layout: str = "contiguous", is_causal: bool = True
) -> list[int]:
    """The (query, key) pairs each rank's queries attend, per batch and head: under a
    causal mask the query at position ``i`` sees ``i + 1`` keys, so rank ``r`` does
    ``sum(i + 1 for i in shard_positions(r))``; without it, ``n * seq_len``.

    Contiguous: rank ``r`` does ``n^2 (r + 1/2) + n / 2``, from about ``n^2 / 2`` for
    the first rank to ``(2 W - 1) n^2 / 2`` for the last. Zigzag: every rank ``c^2 (2 W
    - 1) + c (c + 1)`` with ``c = n / 2``, the average.
    """
    _check_pairs(seq_len, world, layout, is_causal)
    work = []
    for r in range(world):
        positions = shard_positions(r, world, seq_len, layout=layout)
        work.append(
            int((positions + 1).sum()) if is_causal else len(positions) * seq_len
        )
    return work


# --------------------------------------------------------------------------------------
# Running on local ranks
# --------------------------------------------------------------------------------------
def _check_on_rank(fn: str, rank, world_size, method, layout, repeat=1) -> None:
    if method not in ("ring", "ulysses"):
        raise ValueError(f"{fn}: method must be 'ring' or 'ulysses', got {method!r}")
    check_sizes(fn, world_size=world_size, repeat=repeat)
    if check_int(fn, "rank", rank, minimum=0) >= world_size:
        raise ValueError(
            f"{fn}: rank must lie in [0, world_size={world_size}), got {rank}"
        )
    _check_layout(fn, layout)
    if method == "ulysses" and layout != "contiguous":
        raise ValueError(
            f"{fn}: method='ulysses' takes the contiguous layout, got layout={layout!r}"
        )


def _place(fn: str, rank: int, world_size: int, group) -> tuple[int, int]:
    """This process's rank and world size: those within ``group`` when one is given,
    else ``rank`` and ``world_size``, which must then be its place among all the
    processes (with a process group initialized)."""
    if not (dist.is_available() and dist.is_initialized()):
        return rank, world_size  # _agree says that the group is missing
    ring = _ring_of(fn, group)
    if group is None and (rank, world_size) != (ring.rank, ring.world):
        raise ValueError(
            f"{fn}: rank={rank} and world_size={world_size} must be this process's "
            f"place in the process group: rank {ring.rank} of {ring.world}"
        )
    return ring.rank, ring.world


def _local_shards(fn, rank, world_size, layout, q, k, v, grad_out=None) -> list:
    """This rank's shards of the full ``q, k, v`` (and ``grad_out``, the output's
    shape, when given)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(fn, name, t)
    if grad_out is not None:
        check_float(fn, "grad_out", grad_out)
        expected = (*q.shape[:-1], v.shape[-1])
        if tuple(grad_out.shape) != expected:
            raise ValueError(
                f"{fn}: grad_out must have the output's shape {expected} (q's with "
                f"v's last dimension), got {tuple(grad_out.shape)}"
            )
    try:  # detached: the rank differentiates with respect to its own shards
        return [
            None if t is None else shard(t.detach(), rank, world_size, layout=layout)
            for t in (q, k, v, grad_out)
        ]
    except ValueError as e:  # the length does not split, or no dim -2
        raise ValueError(f"{fn}: {e}") from e


def attention_on_rank(
    rank: int,
    world_size: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor | None = None,
    *,
    method: str = "ring",
    is_causal: bool = False,
    scale: float | None = None,
    layout: str = "contiguous",
    group=None,
) -> dict:
    """One rank's part of a demonstration, to run under :func:`run_on_ranks`: from the
    full ``q, k, v (B, H, L, D)`` (the same on every rank) keep this rank's shards, run
    ``method`` (``"ring"`` or ``"ulysses"``, which takes the contiguous layout), and
    backpropagate this rank's shard of ``grad_out`` when given.

    Returns ``{"out", "dq", "dk", "dv", "stats"}``: the shards of the output and
    gradients (``None`` without ``grad_out``; :func:`unshard` joins the ranks') and the
    :class:`CommStats`. Bind the flags with ``functools.partial``. With a ``group``,
    the rank and size within it replace ``rank`` and ``world_size``; without one they
    must be this process's rank and the number of processes. The ranks agree on their
    arguments before any data moves, as :func:`ring_attention` describes: a wrong
    argument on any rank (a length that does not split, a ``grad_out`` of the wrong
    shape or on some ranks only) raises the same error on every rank.
    """
    fn, error = "attention_on_rank", None
    try:
        _check_on_rank(fn, rank, world_size, method, layout)
        rank, world_size = _place(fn, rank, world_size, group)
        q, k, v, grad_out = _local_shards(
            fn, rank, world_size, layout, q, k, v, grad_out
        )
    except (ValueError, TypeError) as e:
        error = e
    _agree(fn, group, error)
    q, k, v = (t.requires_grad_(grad_out is not None) for t in (q, k, v))
    flags = {"is_causal": is_causal, "scale": scale, "group": group}
    if method == "ring":
        out, stats = ring_attention(q, k, v, layout=layout, return_stats=True, **flags)
    else:
        out, stats = ulysses_attention(q, k, v, return_stats=True, **flags)
    if grad_out is not None:
        out.backward(grad_out)
    return {
        "out": out.detach(),
        "dq": q.grad,
        "dk": k.grad,
        "dv": v.grad,
        "stats": stats,
    }


def time_on_rank(
    rank: int,
    world_size: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    method: str = "ring",
    is_causal: bool = False,
    layout: str = "contiguous",
    repeat: int = 3,
) -> dict:
    """Time one training step of attention (forward and backward) on this rank's
    shards, under :func:`run_on_ranks`: the best of ``repeat`` runs after one warm-up.

    Every run starts and ends at a barrier, so the time is that of the slowest rank, the
    one the whole group waits for. Returns ``{"seconds", "stats"}`` (the
    :class:`CommStats` of the last run). It runs on every process (the default group):
    ``rank`` and ``world_size`` must be this process's, and a wrong argument on any
    rank raises the same error on every rank (see :func:`attention_on_rank`).
    """
    fn, error = "time_on_rank", None
    try:
        _check_on_rank(fn, rank, world_size, method, layout, repeat)
        _place(fn, rank, world_size, None)
        q, k, v, _ = _local_shards(fn, rank, world_size, layout, q, k, v)
    except (ValueError, TypeError) as e:
        error = e
    _agree(fn, None, error)
    grad = torch.ones(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    best = math.inf
    for run in range(repeat + 1):
        qs, ks, vs = (t.detach().requires_grad_() for t in (q, k, v))
        dist.barrier()
        start = time.perf_counter()
        if method == "ring":
            out, stats = ring_attention(
                qs, ks, vs, is_causal=is_causal, layout=layout, return_stats=True
            )
        else:
            out, stats = ulysses_attention(
                qs, ks, vs, is_causal=is_causal, return_stats=True
            )
        out.backward(grad)
        dist.barrier()
        if run:  # the first run warms up
            best = min(best, time.perf_counter() - start)
    return {"seconds": best, "stats": stats}


def _check_in_turn(rank, world_size, fns) -> None:
    fn = "in_turn"
    check_sizes(fn, world_size=world_size)
    if check_int(fn, "rank", rank, minimum=0) >= world_size:
        raise ValueError(
            f"{fn}: rank must lie in [0, world_size={world_size}), got {rank}"
        )
    bad = [i for i, f in enumerate(fns) if not callable(f)]
    if bad:
        raise TypeError(f"{fn}: fns must be callables, got {[fns[i] for i in bad]!r}")


def in_turn(rank: int, world_size: int, *fns: Callable) -> list:
    """Run several rank functions one after another in the same processes, so that
    one :func:`run_on_ranks` (one spawn, the slow part) serves many experiments:
    ``run_on_ranks(in_turn, W, f, g)`` returns, per rank, ``[f(rank, W), g(rank,
    W)]``. Bind each function's arguments with ``functools.partial``."""
    _check_in_turn(rank, world_size, fns)
    return [fn(rank, world_size) for fn in fns]


def _free_port() -> int:
    """A TCP port free on the loopback interface now (bind to port 0, read it back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world_size, port, backend, timeout_s, fn, args, results):
    """The body of one spawned rank: join the group, run ``fn``, report the result
    (pickled) or the traceback. A failing rank reports and then keeps its connections
    open until the launcher stops it: closing them would make the other ranks fail
    with "connection reset", and their report could arrive first and hide the cause."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    try:
        dist.init_process_group(
            backend,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        payload = pickle.dumps(fn(rank, world_size, *args))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))
        time.sleep(timeout_s)
        return
    dist.destroy_process_group()
    results.put((rank, True, payload))


def _check_run(fn, world_size, backend, timeout) -> None:
    name = "run_on_ranks"
    if not callable(fn):
        raise TypeError(f"{name}: fn must be a callable, got {type(fn).__name__}")
    check_int(name, "world_size", world_size, minimum=1)
    if backend not in ("gloo", "nccl", "mpi"):
        raise ValueError(
            f"{name}: backend must be 'gloo', 'nccl' or 'mpi', got {backend!r}"
        )
    check_real(name, "timeout", timeout, above=0)


def run_on_ranks(
    fn: Callable,
    world_size: int,
    *args,
    backend: str = "gloo",
    timeout: float = 120.0,
) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` local processes that form
    one process group, and return the ranks' results in rank order.

    The processes start with ``torch.multiprocessing``'s spawn method (each imports
    torch: about a second or more apiece), meet at ``127.0.0.1`` on a free port
    (``MASTER_ADDR``, ``MASTER_PORT``) and initialize ``backend`` (gloo: CPU tensors
    over loopback TCP). ``fn`` must be importable by the new processes, a function
    defined in a module, not in a notebook (use :func:`attention_on_rank` with
    ``functools.partial``); ``args`` and the results must pickle. If a rank raises or
    dies, the others are stopped and ``RuntimeError`` carries its traceback or exit
    code; after ``timeout`` seconds without all results, ``TimeoutError``.
    """
    _check_run(fn, world_size, backend, timeout)
    ctx = torch.multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(rank, world_size, port, backend, timeout, fn, args, results),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    values: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(values) < world_size:
            try:
                rank, ok, payload = results.get(timeout=0.5)
            except queue_module.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode is not None]
                if any(r not in values for r in dead) and results.empty():
                    r = next(r for r in dead if r not in values)
                    raise RuntimeError(
                        f"run_on_ranks: rank {r} exited with code "
                        f"{procs[r].exitcode} without a result"
                    ) from None
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(values))
                    raise TimeoutError(
                        f"run_on_ranks: no result from ranks {missing} in {timeout} s"
                    ) from None
                continue
            if not ok:
                raise RuntimeError(f"run_on_ranks: rank {rank} raised:\n{payload}")
            values[rank] = pickle.loads(payload)
    finally:
        for p in procs:
            if len(values) < world_size:
                p.terminate()
            p.join()
    return [values[r] for r in range(world_size)]


# --------------------------------------------------------------------------------------
# How long a context fits: memory per GPU
# --------------------------------------------------------------------------------------
def _check_model_sizes(
    n_params, n_layers, d_model, d_ff, n_heads, n_kv_heads, head_dim, bytes_per_elem
) -> None:
    fn = "context_memory_bytes"
    check_int(fn, "n_params", n_params, minimum=0)
    check_int(fn, "d_ff", d_ff, minimum=0)
    check_sizes(fn, n_layers=n_layers, d_model=d_model, n_heads=n_heads)
    check_sizes(fn, n_kv_heads=n_kv_heads, head_dim=head_dim)
    check_sizes(fn, bytes_per_elem=bytes_per_elem)


def context_memory_bytes(
    seq_len: int,
    world: int,
    *,
    n_params: int,
    n_layers: int,
    d_model: int,
    d_ff: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    method: str = "ring",
    bytes_per_elem: int = 2,
) -> dict[str, int]:
    """Bytes one of ``world`` GPUs holds to prefill a context of ``seq_len`` tokens
    (inference, batch 1) with the sequence split across the GPUs, in a simple model
    with the terms the complexity and KV-cache chapters count:

    * ``"weights"``: the whole model on every GPU, ``n_params * bytes_per_elem``;
    * ``"kv_cache"``: the keys and values of the GPU's ``seq_len / world`` positions in
      every layer, :func:`attnbook.kvcache.kv_cache_bytes`;
    * ``"activations"``: one layer's working set at a time (prefill keeps nothing else)
      per local token: the residual and its normalized copy (``2 d_model``), ``q, k, v``
      and the attention output (``(2 n_heads + 2 n_kv_heads) head_dim``) and the gated
      MLP's three ``d_ff`` vectors, FlashAttention style: no score matrix;
    * ``"in_flight"``: for ``"ring"`` the key/value block in use and the one arriving
      (``4 n_kv_heads head_dim`` per local token), for ``"ulysses"`` the all-to-all's
      receive buffers for ``q, k, v`` (``(n_heads + 2 n_kv_heads) head_dim``);
    * ``"scores"``: what standard attention would add, one layer's ``n_heads x
      (seq_len / world) x seq_len`` score matrix
      (:func:`~attnbook.complexity.attention_memory_bytes`), not in ``"total"``.

    ``n_kv_heads`` must divide ``n_heads``, and Ulysses needs ``n_kv_heads`` (so
    ``n_heads`` too) divisible by ``world`` (``ValueError`` otherwise).
    Left out: the logits (a server computes them for the last token only), the
    allocator's fragmentation, and the CUDA context (about 0.5 GB).
    """
    from .complexity import attention_memory_bytes
    from .kvcache import kv_cache_bytes

    fn = "context_memory_bytes"
    if method not in ("ring", "ulysses"):
        raise ValueError(f"{fn}: method must be 'ring' or 'ulysses', got {method!r}")
    n = _local_length(fn, seq_len, world)
    _check_model_sizes(
        n_params, n_layers, d_model, d_ff, n_heads, n_kv_heads, head_dim, bytes_per_elem
    )
    if n_heads % n_kv_heads:
        raise ValueError(
            f"{fn}: n_kv_heads={n_kv_heads} must divide n_heads={n_heads} "
            "(grouped-query attention)"
        )
    if method == "ulysses" and n_kv_heads % world:
        raise ValueError(
            f"{fn}: Ulysses splits the heads over the GPUs, and n_kv_heads="
            f"{n_kv_heads} is not divisible by world={world}"
        )
    per_token = 2 * d_model + 2 * (n_heads + n_kv_heads) * head_dim + 3 * d_ff
    if method == "ring":
        in_flight = 4 * n_kv_heads * head_dim
    else:
        in_flight = (n_heads + 2 * n_kv_heads) * head_dim
    terms = {
        "weights": n_params * bytes_per_elem,
        "kv_cache": kv_cache_bytes(
            n_layers, n_kv_heads, head_dim, n, 1, bytes_per_elem
        ),
        "activations": n * per_token * bytes_per_elem,
        "in_flight": n * in_flight * bytes_per_elem,
    }
    terms["total"] = sum(terms.values())
    terms["scores"] = attention_memory_bytes(
        n, n_heads, bytes_per_elem=bytes_per_elem, kv_len=seq_len
    )
    return terms


def _check_largest(gpu_bytes, world, multiple) -> None:
    check_int("largest_context", "gpu_bytes", gpu_bytes, minimum=0)
    check_sizes("largest_context", world=world, multiple=multiple)


def largest_context(
    gpu_bytes: int, world: int, *, multiple: int = 1024, **config
) -> int:
    """The longest context, a multiple of ``multiple * world`` tokens, whose
    :func:`context_memory_bytes` total fits in ``gpu_bytes`` on each of ``world``
    GPUs (``config``: its keyword arguments); 0 when not even the weights fit.

    The total is the weights plus a fixed number of bytes per local token, so the
    answer grows linearly with ``world``: ``world`` times the tokens one GPU's free
    memory holds.
    """
    _check_largest(gpu_bytes, world, multiple)
    step = multiple * world
    fixed = context_memory_bytes(step, world, **config)
    per_step = fixed["total"] - fixed["weights"]
    free = gpu_bytes - fixed["weights"]
    return max(free // per_step, 0) * step
