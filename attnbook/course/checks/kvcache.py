"""Checks for the exercises of the chapter on the KV cache."""

from __future__ import annotations

import math

import torch

from ...kvcache import PagedKVCache, kv_cache_bytes
from . import register
from .common import assert_close, call_student, explain_slips, generator, is_number
from .library import allowed, forbid

_BYTES_ARGS = (
    "n_layers",
    "n_kv_heads",
    "head_dim",
    "seq_len",
    "batch",
    "bytes_per_elem",
)


def _bytes_slips(args) -> list:
    """What plausible wrong answers return for ``kv_cache_bytes(*args)``, and notes."""

    named = dict(zip(_BYTES_ARGS, args))
    full = 2 * math.prod(args)

    def without(name):  # the size with one factor left out
        return 2 * math.prod(a for n, a in named.items() if n != name)

    slips = [
        (
            full // 2,
            "You count the keys only: the values take as much memory (the factor 2).",
        ),
        (
            full * 2,
            "You count a factor twice: keys and values give one factor 2, "
            "bytes_per_elem the size of an element.",
        ),
        (full / 2**30, "You return GiB: return the number of bytes."),
        (full / 1e9, "You return GB: return the number of bytes."),
        (full * 8, "You return bits: return the number of bytes."),
        (
            without("bytes_per_elem"),
            "You count elements: multiply by bytes_per_elem to get bytes.",
        ),
    ]
    for name in ("batch", "n_layers", "n_kv_heads", "seq_len", "head_dim"):
        slips.append(
            (
                without(name),
                f"You left out {name}: the cache holds keys and values for every "
                "layer, KV head, head dimension, position and sequence.",
            )
        )
    return slips


@register(
    "kvcache-bytes",
    library=forbid(
        "attnbook.kvcache.kv_cache_bytes",
        "attnbook.kvcache.KVCache",
        "attnbook.serving.cache_bytes_per_token",
        why="The exercise asks you to count a KV cache's bytes, which "
            "kv_cache_bytes, the check's reference, returns.",
    ),
    hint="keys AND values (the factor 2), one entry per layer, KV head, head "
    "dimension, position and "
    "sequence in the batch, times the bytes of one element.",
)
def _check_kv_cache_bytes(student) -> None:
    """``student(n_layers, n_kv_heads, head_dim, seq_len, batch, bytes_per_elem)`` must
    equal :func:`attnbook.kvcache.kv_cache_bytes`."""

    cases = [
        (32, 32, 128, 4096, 1, 2),
        (80, 8, 128, 4096, 1, 2),
        (12, 12, 64, 1024, 8, 4),
        (1, 1, 1, 1, 1, 1),
        (4, 2, 32, 0, 3, 2),
    ]
    for args in cases:
        got, expected = student(*args), kv_cache_bytes(*args)
        if got != expected:
            call = ", ".join(f"{n}={a}" for n, a in zip(_BYTES_ARGS, args))
            raise AssertionError(
                f"kv_cache_bytes({call}) should be {expected}, got {got}."
                + _bytes_slip(student, cases)
            )


def _bytes_slip(student, cases) -> str:
    """The note of the slip the answer makes on every case (where it tells), or ''."""
    try:
        got = [student(*args) for args in cases]
    except Exception:
        return ""
    notes = None
    for args, g in zip(cases, got):
        here = {
            note
            for wrong, note in _bytes_slips(args)
            if is_number(g) and abs(g - wrong) <= 1e-9 * abs(wrong)
        }
        notes = here if notes is None else notes & here
    ordered = [note for wrong, note in _bytes_slips(cases[0]) if note in (notes or ())]
    return " " + ordered[0] if ordered else ""


def _gather_note(got, pool, table, length) -> str:
    """What a wrong gather did, from its shape or its values, or ''."""
    try:
        got = torch.as_tensor(got)
    except Exception:
        return ""
    n_heads, block_size, head_dim = pool.shape[1:]
    blocks = pool[table]  # (n_table, h, block_size, d)
    one_off = "Off by one: return positions 0 .. length - 1, `length` of them."
    shapes = [
        (
            (n_heads, len(table) * block_size, head_dim),
            "You return every slot of the sequence's blocks: keep the first `length` "
            "positions (the last block is only partly filled).",
        ),
        ((n_heads, length + 1, head_dim), one_off),
        ((n_heads, length - 1, head_dim), one_off),
        (
            (length, n_heads, head_dim),
            "Put the heads first: the result is (n_kv_heads, length, head_dim).",
        ),
    ]
    if tuple(got.shape) != (n_heads, length, head_dim):
        notes = [note for shape, note in shapes if shape == tuple(got.shape)]
        return " " + notes[0] if notes else ""
    slips = [
        (
            pool[: len(table)].transpose(0, 1).flatten(1, 2)[:, :length],
            "You read blocks 0, 1, 2, ... of the pool: a sequence's blocks are "
            "scattered over it; take them in the order of block_table "
            "(pool[block_table]).",
        ),
        (
            blocks.reshape(n_heads, -1, head_dim)[:, :length],
            "You reshaped (blocks, n_kv_heads, block_size, head_dim) to (n_kv_heads, "
            "...) without moving the heads first: transpose(0, 1), then flatten blocks "
            "and offsets.",
        ),
    ]
    for wrong, note in slips:
        if torch.allclose(got.double(), wrong.double(), atol=1e-6, rtol=1e-5):
            return " " + note
    return ""


@register(
    "kvcache-paged-gather",
    library=forbid(
        "attnbook.kvcache.PagedKVCache",
        why="The exercise asks you to write the gather a paged cache does, which "
            "PagedKVCache.gather implements.",
    ),
    hint="position p lives in block block_table[p // block_size] at offset p % "
    "block_size: index the pool "
    "with the table (pool[block_table]), put the heads first, flatten blocks and "
    "offsets, keep `length` positions.",
)
def _check_paged_gather(student) -> None:
    """``student(pool, block_table, length)`` must equal
    :meth:`attnbook.kvcache.PagedKVCache.gather` on interleaved sequences."""

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
            table = paged.block_tables[i]
            got = student(paged.k_pool, list(table), n)
            try:
                assert_close(
                    got,
                    paged.gather(i)[0],
                    f"gather of a sequence of length {n} with block_size={block}, "
                    f"block_table={table}",
                )
            except AssertionError as err:
                note = _gather_note(got, paged.k_pool, table, n)
                raise AssertionError(f"{err}{note}".strip()) from None


def _merge_note(got, o, lse) -> str:
    """What a wrong merge did, or ''."""
    try:
        got = torch.as_tensor(got)
    except Exception:
        return ""
    if not torch.isfinite(got).all():
        return (
            " Your output has inf or NaN: exp(lse) overflows for large scores; "
            "subtract the largest lse before the exp (the weights exp(lse_s - M) are "
            "at most 1)."
        )
    weights = torch.exp(lse - lse.amax(-1, keepdim=True))
    slips = [
        (
            o.mean(-2),
            "You averaged the splits: weight split s by exp(lse_s - M) / sum_s' "
            "exp(lse_s' - M), its share of the softmax's normalizer.",
        ),
        (
            (weights[..., None] * o).sum(-2),
            "You did not divide by the sum of the weights exp(lse_s - M).",
        ),
        (
            o[..., 1:, :].mean(-2),
            "You averaged the non-empty splits: weight split s by exp(lse_s - M) / "
            "sum_s' exp(lse_s' - M).",
        ),
    ]
    for wrong, note in slips:
        if wrong.shape == got.shape and torch.allclose(
            got.double(), wrong.double(), atol=1e-6, rtol=1e-5
        ):
            return " " + note
    return ""


@register(
    "kvcache-merge-splits",
    library=forbid(
        "attnbook.flash.merge_partials",
        "attnbook.kvcache.split_kv_attention",
        "attnbook.attend.decode_attention",
        why="The exercise asks you to write the merge of split-KV decoding, which "
            "split_kv_attention does with merge_partials.",
    ),
    hint="with M = the max of lse over the splits, weight each split by exp(lse_s - "
    "M), divide by the sum of "
    "the weights; a split with lse = -inf has weight 0, and if every split is empty "
    "return zeros (not NaN).",
)
def _check_merge_splits(student) -> None:
    """``student(o, lse)`` must merge per-split outputs into full softmax attention,
    also when every lse is large; all-empty splits give zeros, not NaN."""

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
        # adding 1000 to every score adds 1000 to every lse and changes nothing else
        for shift, large in [(0.0, ""), (1000.0, ", every score + 1000")]:
            got = student(o.clone(), lse + shift)
            try:
                assert_close(
                    got,
                    expected,
                    f"merging {n} splits of shape {tuple(o.shape)}{large}",
                )
            except AssertionError as err:
                note = _merge_note(got, o, lse)
                raise AssertionError(f"{err}{note}") from None
    o, lse = (
        torch.zeros(2, 3, 4, dtype=torch.float64),
        torch.full((2, 3), float("-inf"), dtype=torch.float64),
    )
    got = torch.as_tensor(student(o, lse))
    assert torch.isfinite(got).all() and torch.equal(
        got, torch.zeros(2, 4, dtype=torch.float64)
    ), (
        "when every split is empty (lse = -inf everywhere) the merged output must be "
        "zeros, not NaN: the largest lse is then -inf, and lse - (-inf) is NaN; "
        "subtract 0 instead of an infinite maximum"
    )


_DECODE_ARGS = (
    "n_params",
    "n_layers",
    "n_kv_heads",
    "head_dim",
    "seq_len",
    "batch",
    "bytes_per_elem",
)
_DECODE_NOTES = {
    "per_sequence": "You read the weights once per sequence: a decode step multiplies "
    "the whole batch by each weight matrix, so the weights are read once per step; "
    "only the cache is read once per sequence.",
    "no_cache": "You left out the KV cache: each step also reads the keys and values "
    "of every cached position, in every layer, for every sequence.",
    "keys_only": "You read the cached keys only: the values take as much (the factor "
    "2).",
    "elements": "You count elements: multiply by bytes_per_elem to get bytes.",
    "bits": "You return bits: return the number of bytes.",
}


def _decode_bytes(case, slips=()) -> int:
    """The bytes of ``case`` with the named slips (the right answer without any)."""
    n_params, n_layers, n_kv_heads, head_dim, seq_len, batch, size = case
    weights = n_params * (batch if "per_sequence" in slips else 1)
    cache = (
        0
        if "no_cache" in slips
        else kv_cache_bytes(n_layers, n_kv_heads, head_dim, seq_len, batch, 1)
        // (2 if "keys_only" in slips else 1)
    )
    size = 1 if "elements" in slips else size * (8 if "bits" in slips else 1)
    return (weights + cache) * size


@register(
    "kvcache-decode-bytes",
    library=allowed(
        "A byte count followed by a measurement; kv_cache_bytes, which the first "
        "exercise writes, is a fair building block.",
    ),
    hint="every weight once per step (the whole batch shares each read), plus the keys "
    "AND values of seq_len cached positions in every layer for every sequence, times "
    "the bytes of one element.",
)
def _check_decode_bytes(student) -> None:
    """``student(n_params, n_layers, n_kv_heads, head_dim, seq_len, batch,
    bytes_per_elem)``: the bytes one decode step must read at least once, the
    weights once and each sequence's cache."""

    cases = [
        (3_300_000, 4, 8, 32, 512, 1, 4),
        (3_300_000, 4, 8, 32, 512, 8, 4),
        (7_000_000_000, 32, 8, 128, 4096, 16, 2),
        (1000, 2, 1, 4, 0, 3, 2),
        (50, 1, 2, 3, 7, 5, 1),
    ]
    results = []
    for case in cases:
        call = ", ".join(f"{n}={a}" for n, a in zip(_DECODE_ARGS, case))
        got = call_student(student, f"decode_bytes({call})", *case)
        results.append(got if is_number(got) else None)
    for case, got in zip(cases, results):
        expected = _decode_bytes(case)
        if got != expected:
            call = ", ".join(f"{n}={a}" for n, a in zip(_DECODE_ARGS, case))
            groups = (
                ("per_sequence",),
                ("no_cache", "keys_only"),
                ("elements", "bits"),
            )
            note = explain_slips(results, cases, _decode_bytes, groups, _DECODE_NOTES)
            raise AssertionError(
                f"decode_bytes({call}) should be {expected:,}, got {got!r}.{note}"
            )
