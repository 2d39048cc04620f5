"""Checks for the project "Serve a small model with a paged cache and continuous
batching" (``book/projects/serve_paged.ipynb``).

Each milestone has a public check, which the student runs in the notebook on a few
small cases it names, and a hidden one (label ``...-hidden``), which only the graders
run: many cases drawn from the grader's secret seed, with the edge cases the public
check leaves out (block tables in any order, grouped key/value heads, lengths that fill
a block exactly, a queue that blocks, requests that never fit).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import register
from .common import assert_close, call_student, generator
from .library import forbid

__all__ = ["reference_paged_decode", "reference_schedule"]


# --------------------------------------------------------------------------------------
# Milestone 1: decode attention through a block table
# --------------------------------------------------------------------------------------
def reference_paged_decode(q, k_pool, v_pool, block_tables, seqlens) -> torch.Tensor:
    """One decode step, the obvious way: gather each sequence's keys and values into a
    contiguous tensor, then PyTorch's SDPA (with ``enable_gqa``) on its first
    ``seqlens[b]`` positions."""
    out = []
    block = k_pool.shape[2]
    for b, (table, n) in enumerate(zip(block_tables, seqlens)):
        positions = torch.arange(n)
        blocks = torch.tensor(table, dtype=torch.long)[positions // block]
        k = k_pool[blocks, :, positions % block].transpose(0, 1)  # (h_kv, n, d)
        v = v_pool[blocks, :, positions % block].transpose(0, 1)
        o = F.scaled_dot_product_attention(
            q[b, :, None], k, v, enable_gqa=q.shape[1] != k.shape[0]
        )
        out.append(o[:, 0])
    return torch.stack(out)


def _paged_case(gen, block, n_blocks, seqlens, heads, kv_heads, dim, shuffle):
    """Pools filled with noise and a block table per sequence: its blocks in order,
    or in a random order of the pool when ``shuffle``."""
    need = [math.ceil(n / block) for n in seqlens]
    order = torch.arange(n_blocks)
    if shuffle:
        order = torch.randperm(n_blocks, generator=gen)
    tables, start = [], 0
    for count in need:
        tables.append([int(i) for i in order[start : start + count]])
        start += count
    k_pool = torch.randn(n_blocks, kv_heads, block, dim, generator=gen)
    v_pool = torch.randn(n_blocks, kv_heads, block, dim, generator=gen)
    q = torch.randn(len(seqlens), heads, dim, generator=gen)
    return q, k_pool, v_pool, tables, list(seqlens)


def _decode_cases(cases, gen, student) -> None:
    for block, seqlens, heads, kv_heads, dim, shuffle in cases:
        n_blocks = sum(math.ceil(n / block) for n in seqlens) + 2
        args = _paged_case(gen, block, n_blocks, seqlens, heads, kv_heads, dim, shuffle)
        what = (
            f"block_size={block}, seqlens={list(seqlens)}, {heads} query heads, "
            f"{kv_heads} key/value heads, block_tables={args[3]}"
        )
        got = call_student(student, what, *args)
        assert_close(got, reference_paged_decode(*args), what)


_DECODE_POLICY = forbid(
    "attnbook.kvcache.PagedKVCache",
    "attnbook.kvcache.split_kv_attention",
    why="The milestone asks you to read keys and values through a block table, which "
    "PagedKVCache.gather and split_kv_attention implement.",
)
_DECODE_HINT = (
    "position p of sequence b is in block block_tables[b][p // block_size] at offset "
    "p % block_size; query head j reads key/value head j // (h / h_kv); keep only the "
    "first seqlens[b] positions."
)


@register("project-serve-paged-decode", library=_DECODE_POLICY, hint=_DECODE_HINT)
def _check_paged_decode(student) -> None:
    """Public: three small cases, blocks in order, one key/value head per query head."""
    gen = generator(41)
    _decode_cases(
        [(4, [5, 8], 2, 2, 8, False), (2, [1, 3, 4], 1, 1, 4, False),
         (8, [13], 4, 4, 16, False)],
        gen,
        student,
    )  # fmt: skip


@register(
    "project-serve-paged-decode-hidden", library=_DECODE_POLICY, hint=_DECODE_HINT
)
def _check_paged_decode_hidden(student) -> None:
    """Hidden: block tables in a random order of the pool, grouped key/value heads,
    lengths of 1 and exact multiples of the block size, random sizes."""
    gen = generator(42)
    cases = [(4, [4, 1, 8, 9], 8, 2, 8, True), (1, [3, 1], 6, 3, 4, True)]
    for _ in range(6):
        block = int(torch.randint(1, 9, (), generator=gen))
        batch = int(torch.randint(1, 6, (), generator=gen))
        lengths = torch.randint(1, 4 * block + 2, (batch,), generator=gen)
        seqlens = [int(n) for n in lengths]
        kv_heads = int(torch.randint(1, 4, (), generator=gen))
        group = int(torch.randint(1, 5, (), generator=gen))
        cases.append((block, seqlens, kv_heads * group, kv_heads, 8, True))
    _decode_cases(cases, gen, student)


# --------------------------------------------------------------------------------------
# Milestone 2: continuous batching over a paged pool
# --------------------------------------------------------------------------------------
def reference_schedule(requests, n_blocks, block_size, max_batch) -> list[tuple]:
    """The schedule the milestone specifies, computed request by request (an event
    view, not a step loop): ``[(admitted_step, finished_step), ...]`` in input order.

    Requests are served first come, first served (by arrival, ties by index); the head
    of the queue is admitted at the first step at or after its arrival, and not before
    the request ahead of it, at which fewer than ``max_batch`` sequences run and its
    blocks, ``ceil((prompt + new) / block_size)``, are free. It produces a token per
    step from its admission on, finishes after ``new`` tokens and frees its blocks
    after its last step."""
    need = [math.ceil((p + n) / block_size) for _, p, n in requests]
    for index, blocks in enumerate(need):
        if blocks > n_blocks:
            raise ValueError(
                f"request {index} needs {blocks} blocks, the pool has {n_blocks}"
            )
    order = sorted(range(len(requests)), key=lambda i: (requests[i][0], i))
    running: list[tuple[int, int]] = []  # (finished_step, blocks) of admitted requests
    result: dict[int, tuple[int, int]] = {}
    earliest = 0
    for i in order:
        step = max(earliest, requests[i][0])
        while True:
            alive = [(end, b) for end, b in running if end >= step]
            free = n_blocks - sum(b for _, b in alive)
            if len(alive) < max_batch and free >= need[i]:
                break
            step = min(end for end, _ in alive) + 1  # the next step where one has left
        end = step + requests[i][2] - 1
        running.append((end, need[i]))
        result[i] = (step, end)
        earliest = step
    return [result[i] for i in range(len(requests))]


_SCHEDULE_POLICY = forbid(
    "attnbook.kvcache.PagedKVCache",
    why="The milestone asks you to schedule the requests yourself; a real cache is "
    "not needed to count blocks.",
)
_SCHEDULE_HINT = (
    "step by step: first free the blocks of the sequences that finished at the "
    "previous step, then admit from the head of the queue (in arrival order, no "
    "overtaking) while "
    "fewer than max_batch run and the head's blocks ceil((prompt + new) / block_size) "
    "are free; a request admitted at step t finishes at step t + new - 1."
)


def _schedule_cases(cases, student) -> None:
    for requests, n_blocks, block, batch in cases:
        what = (
            f"schedule(requests={requests}, n_blocks={n_blocks}, block_size={block}, "
            f"max_batch={batch})"
        )
        want = reference_schedule(requests, n_blocks, block, batch)
        got = call_student(student, what, requests, n_blocks, block, batch)
        got = [tuple(int(x) for x in pair) for pair in got] if isinstance(
            got, (list, tuple)
        ) else got
        assert got == want, f"{what}: expected {want}, got {got}."


@register("project-serve-schedule", library=_SCHEDULE_POLICY, hint=_SCHEDULE_HINT)
def _check_schedule(student) -> None:
    """Public: a queue limited by the batch size, then one limited by the pool."""
    _schedule_cases(
        [
            ([(0, 3, 2), (0, 2, 3), (1, 4, 1)], 10, 4, 2),
            ([(0, 8, 4), (0, 8, 4), (2, 2, 2)], 6, 4, 4),
        ],
        student,
    )


@register(
    "project-serve-schedule-hidden", library=_SCHEDULE_POLICY, hint=_SCHEDULE_HINT
)
def _check_schedule_hidden(student) -> None:
    """Hidden: random workloads in which a big request at the head of the queue blocks
    smaller ones behind it (no overtaking), late arrivals, and a request that can never
    fit (a ``ValueError``)."""
    gen = generator(43)
    # the head (4 blocks) waits for the pool; the small one behind it must wait too
    cases = [([(0, 12, 4), (1, 12, 4), (1, 1, 1)], 6, 4, 3)]
    for _ in range(8):
        count = int(torch.randint(2, 9, (), generator=gen))
        block = int(torch.randint(1, 6, (), generator=gen))
        requests = [
            (int(torch.randint(0, 6, (), generator=gen)),
             int(torch.randint(1, 12, (), generator=gen)),
             int(torch.randint(1, 7, (), generator=gen)))
            for _ in range(count)
        ]  # fmt: skip
        largest = max(math.ceil((p + n) / block) for _, p, n in requests)
        n_blocks = largest + int(torch.randint(0, 2 * largest, (), generator=gen))
        batch = int(torch.randint(1, 4, (), generator=gen))
        cases.append((requests, n_blocks, block, batch))
    _schedule_cases(cases, student)
    too_big = [(0, 2, 2), (0, 30, 3)]
    try:
        got = student(too_big, 4, 4, 2)
    except NotImplementedError:
        raise
    except Exception as err:  # by name: the grader rebuilds the kernel's exception
        if type(err).__name__ == "ValueError":
            return
        raise AssertionError(
            f"schedule({too_big}, n_blocks=4, block_size=4, max_batch=2): raise "
            "ValueError for a request the pool can never hold, got "
            f"{type(err).__name__}"
        ) from None
    raise AssertionError(
        f"schedule({too_big}, n_blocks=4, block_size=4, max_batch=2): request 1 "
        "needs 9 blocks of a pool of 4, so it can never run: raise ValueError "
        f"(got {got})."
    )
