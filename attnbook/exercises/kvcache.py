"""Checks for the exercises of the chapter on the KV cache."""

from __future__ import annotations

import torch

from . import register
from .common import assert_close, generator


@register(
    "kvcache-bytes",
    hint="keys AND values (the factor 2), one entry per layer, KV head, head "
    "dimension, position and "
    "sequence in the batch, times the bytes of one element.",
)
def _check_kv_cache_bytes(student) -> None:
    """``student(n_layers, n_kv_heads, head_dim, seq_len, batch, bytes_per_elem)`` must
    equal :func:`attnbook.kvcache.kv_cache_bytes`."""

    from ..kvcache import kv_cache_bytes

    for args in [
        (32, 32, 128, 4096, 1, 2),
        (80, 8, 128, 4096, 1, 2),
        (12, 12, 64, 1024, 8, 4),
        (1, 1, 1, 1, 1, 1),
        (4, 2, 32, 0, 3, 2),
    ]:
        got, expected = student(*args), kv_cache_bytes(*args)
        assert got == expected, f"kv_cache_bytes{args} should be {expected}, got {got}"


@register(
    "kvcache-paged-gather",
    hint="position p lives in block block_table[p // block_size] at offset p % "
    "block_size: index the pool "
    "with the table (pool[block_table]), put the heads first, flatten blocks and "
    "offsets, keep `length` positions.",
)
def _check_paged_gather(student) -> None:
    """``student(pool, block_table, length)`` must equal
    :meth:`attnbook.kvcache.PagedKVCache.gather` on interleaved sequences."""

    from ..kvcache import PagedKVCache

    gen = generator(6)
    for block, n_blocks, lengths in [
        (4, 10, [7, 1, 8]),
        (1, 6, [2, 3]),
        (16, 3, [0, 16, 17]),
    ]:
        paged = PagedKVCache(n_blocks, block, 2, 3)
        for i, n in enumerate(lengths):
            paged.allocate(i)
        # interleaved appends scatter each sequence over the pool
        for step in range(max(lengths)):
            for i, n in enumerate(lengths):
                if step < n:
                    paged.append(
                        i,
                        torch.randn(2, 1, 3, generator=gen),
                        torch.randn(2, 1, 3, generator=gen),
                    )
        for i, n in enumerate(lengths):
            got = student(paged.k_pool, paged.block_tables[i], n)
            assert_close(
                got,
                paged.gather(i)[0],
                f"gather of a sequence of length {n} with block_size={block}",
            )


@register(
    "kvcache-merge-splits",
    hint="with M = the max of lse over the splits, weight each split by exp(lse_s - "
    "M), divide by the sum of "
    "the weights; a split with lse = -inf has weight 0, and if every split is empty "
    "return zeros (not NaN).",
)
def _check_merge_splits(student) -> None:
    """``student(o, lse)`` must merge per-split outputs into full softmax attention;
    all-empty splits give zeros, not NaN."""

    gen = generator(60)
    for shape, n, d in [((2, 3), 4, 5), ((1,), 1, 2), ((2,), 6, 3)]:
        scores = 3 * torch.randn(*shape, n * 4, generator=gen, dtype=torch.float64)
        values = torch.randn(*shape, n * 4, d, generator=gen, dtype=torch.float64)
        scores[..., :4] = float("-inf")  # the first split is empty
        if n == 1:
            scores[..., 0] = 0.0
        s = scores.view(*shape, n, 4)
        lse = torch.logsumexp(s, -1)
        w = torch.where(
            torch.isinf(lse)[..., None], torch.zeros_like(s), torch.softmax(s, -1)
        )
        o = (w[..., None] * values.view(*shape, n, 4, d)).sum(-2)
        expected = (torch.softmax(scores, -1)[..., None] * values).sum(-2)
        assert_close(
            student(o, lse), expected, f"merging {n} splits of shape {tuple(o.shape)}"
        )
    o, lse = (
        torch.zeros(2, 3, 4, dtype=torch.float64),
        torch.full((2, 3), float("-inf"), dtype=torch.float64),
    )
    got = torch.as_tensor(student(o, lse))
    assert torch.isfinite(got).all() and torch.equal(
        got, torch.zeros(2, 4, dtype=torch.float64)
    ), (
        "when every split is empty (lse = -inf everywhere) the merged output must be "
        "zeros, not NaN"
    )
