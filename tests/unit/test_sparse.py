"""Tests of attnbook.sparse: masks against their definitions written as explicit loops, the
sparse attentions against dense attention with the same mask (attnbook.core and PyTorch),
shape tracing that no L x S tensor is ever formed, and graph distances against a plain BFS."""

from __future__ import annotations

import itertools
import math
from collections import deque

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from attnbook.core import causal_mask
from attnbook.core import scaled_dot_product_attention as dense_attention
from attnbook.sparse import (
    RelativeLabelBias,
    bigbird_block_mask,
    block_sparse_attention,
    etc_relative_labels,
    expand_block_mask,
    global_mask,
    graph_distances,
    longformer_mask,
    lsh_buckets,
    lsh_mask,
    random_mask,
    sliding_window_mask,
    sliding_window_attention,
)
from attnbook.utils import largest_new_tensor

TIGHT = dict(atol=1e-10, rtol=1e-8)  # float64 throughout, unless a test says otherwise


def randn(*shape, gen, dtype=torch.float64):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


# ---------------------------------------------------------------------------------------------
# Token masks: the definitions, entry by entry
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n, window, dilation, causal", list(itertools.product([1, 6, 11], [0, 1, 3], [1, 2, 3], [False, True])))
def test_sliding_window_mask_definition(n, window, dilation, causal):
    mask = sliding_window_mask(n, window, is_causal=causal, dilation=dilation)
    for i, j in itertools.product(range(n), range(n)):
        expected = abs(i - j) <= window * dilation and (i - j) % dilation == 0 and (j <= i or not causal)
        assert mask[i, j].item() == expected, (i, j)


def test_global_mask_definition():
    mask = global_mask(7, [0, 4])
    for i, j in itertools.product(range(7), range(7)):
        assert mask[i, j].item() == (i in (0, 4) or j in (0, 4))
    assert not global_mask(3, []).any()


@pytest.mark.parametrize("n, r", [(1, 1), (9, 0), (9, 3), (16, 16)])
def test_random_mask_rows_have_n_random_keys(n, r):
    mask = random_mask(n, r, generator=torch.Generator().manual_seed(1))
    assert mask.shape == (n, n) and mask.dtype == torch.bool
    assert (mask.sum(dim=-1) == r).all()


def test_random_mask_is_reproducible_and_uniform():
    assert torch.equal(random_mask(20, 3, torch.Generator().manual_seed(5)), random_mask(20, 3, torch.Generator().manual_seed(5)))
    assert not torch.equal(random_mask(20, 3, torch.Generator().manual_seed(5)), random_mask(20, 3, torch.Generator().manual_seed(6)))
    gen = torch.Generator().manual_seed(0)
    freq = sum(random_mask(10, 2, gen).float() for _ in range(2000)) / 2000  # each key: probability 2 / 10
    assert (freq - 0.2).abs().max() < 0.04


def test_longformer_mask_is_window_or_global():
    expected = sliding_window_mask(12, 2, dilation=2) | global_mask(12, [0, 11])
    assert torch.equal(longformer_mask(12, 2, [0, 11], dilation=2), expected)


# ---------------------------------------------------------------------------------------------
# ETC: labels and mask against the paper's definition, pair by pair; the per-label bias
# ---------------------------------------------------------------------------------------------
def _etc_labels_loop(n_global, n_long, radius, segment, k):
    """Ainslie et al. (2020), read pair by pair: four pieces g2g, g2l, l2g, l2l."""
    clip = lambda x: min(max(x, -k), k) + k  # noqa: E731  labels 0..2k for offsets -k..k
    n = n_global + n_long
    labels, mask = [[0] * n for _ in range(n)], [[False] * n for _ in range(n)]
    for a, b in itertools.product(range(n), range(n)):
        if a < n_global and b < n_global:  # g2g: full, relative position among globals
            labels[a][b], mask[a][b] = clip(b - a), True
        elif a >= n_global and b >= n_global:  # l2l: local radius, clipped offset
            i, j = a - n_global, b - n_global
            labels[a][b], mask[a][b] = clip(j - i), abs(j - i) <= radius
        else:  # g2l / l2g: full, "own segment" or "other segment"
            g, t = (a, b - n_global) if a < n_global else (b, a - n_global)
            labels[a][b], mask[a][b] = (2 * k + 2 if segment[t] == g else 2 * k + 1), True
    return torch.tensor(labels), torch.tensor(mask)


@pytest.mark.parametrize("n_global, n_long, radius, k", [(1, 1, 0, 0), (2, 7, 1, 3), (3, 12, 3, 2), (4, 5, 9, 9)])
def test_etc_relative_labels_match_the_definition(n_global, n_long, radius, k):
    segment = [t * n_global // n_long for t in range(n_long)]  # contiguous segments
    labels, mask = etc_relative_labels(n_global, n_long, radius, segment, max_distance=k)
    expected_labels, expected_mask = _etc_labels_loop(n_global, n_long, radius, segment, k)
    assert labels.dtype == torch.long and mask.dtype == torch.bool
    assert torch.equal(labels, expected_labels) and torch.equal(mask, expected_mask)
    assert 0 <= labels.min() and labels.max() < 2 * k + 3


@given(n_global=st.integers(1, 5), n_long=st.integers(1, 20), radius=st.integers(0, 6),
       k=st.one_of(st.none(), st.integers(0, 6)), data=st.data())
def test_etc_relative_labels_property(n_global, n_long, radius, k, data):
    segment = data.draw(st.lists(st.integers(0, n_global - 1), min_size=n_long, max_size=n_long))
    labels, mask = etc_relative_labels(n_global, n_long, radius, segment, max_distance=k)
    expected = _etc_labels_loop(n_global, n_long, radius, segment, radius if k is None else k)
    assert torch.equal(labels, expected[0]) and torch.equal(mask, expected[1])


def test_etc_mask_is_global_rows_and_columns_plus_a_window():
    labels, mask = etc_relative_labels(2, 10, 2, [0] * 5 + [1] * 5)
    expected = global_mask(12, [0, 1])
    expected[2:, 2:] |= sliding_window_mask(10, 2)
    assert torch.equal(mask, expected)


@pytest.mark.parametrize(
    "args, match",
    [
        ((0, 3, 1, []), "n_global"),
        ((2, 3, -1, [0, 0, 1]), "radius"),
        ((2, 3, 1, [0, 1]), "segment_of_long"),
        ((2, 3, 1, [0, 1, 2]), "segment_of_long"),
    ],
)
def test_etc_relative_labels_errors(args, match):
    with pytest.raises(ValueError, match=match):
        etc_relative_labels(*args)


def test_relative_label_bias_matches_a_loop_and_learns_only_used_labels(gen):
    n_global, n_long, heads, k = 2, 9, 3, 2
    # radius 1 < k = 2: offsets +-2 (labels 0 and 4) occur only in masked-out pairs
    labels, mask = etc_relative_labels(n_global, n_long, 1, [0] * 4 + [1] * 5, max_distance=k)
    bias = RelativeLabelBias(2 * k + 3, heads).double()
    assert not bias(labels).any()  # starts at zero: plain masked attention
    with torch.no_grad():
        bias.bias.weight.copy_(randn(2 * k + 3, heads, gen=gen))
    q, key, value = (randn(1, heads, 11, 4, gen=gen) for _ in range(3))
    additive = bias(labels, mask)
    assert additive.shape == (heads, 11, 11)
    out = dense_attention(q, key, value, additive)
    table = bias.bias.weight
    for h, i in itertools.product(range(heads), range(11)):  # one softmax row at a time
        logits = [q[0, h, i] @ key[0, h, j] / 2.0 + table[labels[i, j], h] for j in range(11)]
        allowed = [j for j in range(11) if mask[i, j]]
        weights = torch.softmax(torch.stack([logits[j] for j in allowed]), dim=0)
        expected = sum(w * value[0, h, j] for w, j in zip(weights, allowed))
        torch.testing.assert_close(out[0, h, i], expected, **TIGHT)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, key, value, attn_mask=additive), **TIGHT)
    out.sum().backward()
    used = torch.zeros(2 * k + 3, dtype=torch.bool)
    used[labels[mask]] = True
    assert used.tolist() == [False, True, True, True, False, True, True]
    assert (table.grad[~used] == 0).all() and (table.grad[used] != 0).all()


# ---------------------------------------------------------------------------------------------
# BigBird block masks
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_blocks, g, w, r", [(1, 1, 3, 2), (4, 1, 3, 2), (10, 1, 3, 2), (16, 2, 3, 3), (12, 1, 5, 0), (9, 0, 4, 1)])
def test_bigbird_block_mask_structure(n_blocks, g, w, r):
    mask = bigbird_block_mask(n_blocks, g, w, r, generator=torch.Generator().manual_seed(n_blocks))
    is_global = [i < g or i >= n_blocks - g for i in range(n_blocks)]
    for i in range(n_blocks):
        if is_global[i]:
            assert mask[i].all() and mask[:, i].all(), f"global block {i} must see and be seen by all"
            continue
        fixed = {j for j in range(n_blocks) if is_global[j] or -(w // 2) <= j - i < w - w // 2}
        chosen = set(torch.nonzero(mask[i]).flatten().tolist())
        assert fixed <= chosen, f"row {i} misses window/global blocks {fixed - chosen}"
        assert len(chosen - fixed) == min(r, n_blocks - len(fixed)), f"row {i}: wrong number of random blocks"


def test_bigbird_block_mask_random_part_is_seeded_and_varies():
    a = bigbird_block_mask(32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a, bigbird_block_mask(32, generator=torch.Generator().manual_seed(0)))
    assert not torch.equal(a, bigbird_block_mask(32, generator=torch.Generator().manual_seed(1)))
    active = a.sum(dim=-1)
    assert active[0] == active[-1] == 32 and (active[1:-1] <= 2 + 3 + 2).all()  # linear: O(g + w + r) per row


def test_expand_block_mask_definition():
    block = torch.rand(2, 3, 4, generator=torch.Generator().manual_seed(0)) < 0.5
    token = expand_block_mask(block, 3)
    assert token.shape == (2, 9, 12)
    for b, i, j in itertools.product(range(2), range(9), range(12)):
        assert token[b, i, j] == block[b, i // 3, j // 3]


# ---------------------------------------------------------------------------------------------
# block_sparse_attention == dense attention with the expanded mask
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("L, S", [(1, 1), (5, 5), (16, 16), (37, 37), (12, 40), (40, 12), (64, 33)])
@pytest.mark.parametrize("block", [1, 4, 8, 16])
@pytest.mark.parametrize("is_causal", [False, True])
def test_block_sparse_matches_dense(L, S, block, is_causal, gen):
    n_qb, n_kb = math.ceil(L / block), math.ceil(S / block)
    block_mask = torch.rand(n_qb, n_kb, generator=gen) < 0.4
    block_mask[0] = True  # a dense row, so the wide-row path runs too
    q, k, v = randn(2, 3, L, 8, gen=gen), randn(2, 3, S, 8, gen=gen), randn(2, 3, S, 5, gen=gen)
    out = block_sparse_attention(q, k, v, block_mask, block, is_causal=is_causal)
    token_mask = expand_block_mask(block_mask, block)[:L, :S]
    torch.testing.assert_close(out, dense_attention(q, k, v, token_mask, is_causal=is_causal), **TIGHT)


@given(
    L=st.integers(1, 50), S=st.integers(1, 50), block=st.integers(1, 12), density=st.floats(0.0, 1.0),
    causal=st.booleans(), seed=st.integers(0, 2**16),
)
def test_block_sparse_matches_dense_property(L, S, block, density, causal, seed):
    gen = torch.Generator().manual_seed(seed)
    block_mask = torch.rand(math.ceil(L / block), math.ceil(S / block), generator=gen) < density
    q, k, v = randn(1, 2, L, 4, gen=gen), randn(1, 2, S, 4, gen=gen), randn(1, 2, S, 3, gen=gen)
    out = block_sparse_attention(q, k, v, block_mask, block, is_causal=causal)
    expected = dense_attention(q, k, v, expand_block_mask(block_mask, block)[:L, :S], is_causal=causal)
    assert not out.isnan().any()  # rows with nothing to attend to are zeros, as in attnbook.core
    torch.testing.assert_close(out, expected, **TIGHT)


def test_block_sparse_bigbird_matches_torch_sdpa_float32(gen):
    n, block = 8 * 32 + 5, 32  # ragged last block
    block_mask = bigbird_block_mask(math.ceil(n / block), generator=gen)
    q, k, v = (torch.randn(2, 4, n, 16, generator=gen) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=expand_block_mask(block_mask, block)[:n, :n])
    torch.testing.assert_close(block_sparse_attention(q, k, v, block_mask, block), expected, atol=1e-5, rtol=1e-5)


def test_block_sparse_broadcasts_batch_dims(gen):
    q, k, v = randn(2, 1, 10, 4, gen=gen), randn(1, 3, 10, 4, gen=gen), randn(1, 3, 10, 6, gen=gen)
    block_mask = torch.rand(3, 3, generator=gen) < 0.6
    out = block_sparse_attention(q, k, v, block_mask, 4)
    assert out.shape == (2, 3, 10, 6)
    torch.testing.assert_close(out, dense_attention(q, k, v, expand_block_mask(block_mask, 4)[:10, :10]), **TIGHT)


def test_block_sparse_reads_transposed_layouts(gen):
    """Tensors stored (batch, seq, heads, dim) and transposed to the contract's (batch, heads, seq, dim): a view
    whose blocks are not contiguous, which the gathers and window views must read right."""
    n, block = 12 * 8, 8
    block_mask = bigbird_block_mask(n // block, generator=gen)
    q, k, v = (randn(1, n, 3, 4, gen=gen).transpose(1, 2) for _ in range(3))
    assert not k.is_contiguous()
    out = block_sparse_attention(q, k, v, block_mask, block)
    torch.testing.assert_close(out, dense_attention(q, k, v, expand_block_mask(block_mask, block)), **TIGHT)


def test_block_sparse_gradients_match_dense(gen):
    block_mask = bigbird_block_mask(5, generator=gen)
    block_mask[2] = False  # a row with nothing to attend to: zero output, zero gradient
    inputs = [randn(1, 2, 18, 4, gen=gen).requires_grad_() for _ in range(3)]
    grads = torch.autograd.grad(block_sparse_attention(*inputs, block_mask, 4).square().sum(), inputs)
    dense = dense_attention(*inputs, expand_block_mask(block_mask, 4)[:18, :18])
    for got, expected in zip(grads, torch.autograd.grad(dense.square().sum(), inputs)):
        torch.testing.assert_close(got, expected, **TIGHT)


def test_block_sparse_never_forms_an_L_by_S_tensor(gen):
    n, block = 8192, 64  # long enough that the fixed-size chunks of scores are far below n^2
    block_mask = bigbird_block_mask(n // block, generator=gen)
    q, k, v = (torch.randn(1, 1, n, 16, generator=gen) for _ in range(3))
    largest = largest_new_tensor(block_sparse_attention, q, k, v, block_mask, block)
    assert largest < n * n / 32, f"largest intermediate has {largest} elements; n^2 = {n * n}"


def _record_calls(monkeypatch, names):
    """Patch attnbook.sparse's helpers ``names`` to count their calls."""
    from attnbook import sparse

    calls = dict.fromkeys(names, 0)
    for name in names:
        original = getattr(sparse, name)

        def counted(*args, original=original, name=name):
            calls[name] += 1
            return original(*args)

        monkeypatch.setattr(sparse, name, counted)
    return calls


def _record_scores(monkeypatch):
    """Patch the fused call of attnbook.sparse to add up the query-key scores it computes (per batch entry and
    head: the first dimension is N)."""
    from attnbook import sparse

    seen = {"scores": 0}
    original = sparse._attend_lse

    def counted(q, k, v, scale, grad):
        seen["scores"] += q.shape[1:-1].numel() * k.shape[-2]
        return original(q, k, v, scale, grad)

    monkeypatch.setattr(sparse, "_attend_lse", counted)
    return seen


PARTS = ("_full_rows", "_shared_columns", "_band_rows", "_gathered_rows", "_masked_rows")


@pytest.mark.parametrize("n, causal, plain", [(8 * 16, False, True), (8 * 16 + 5, False, False), (8 * 16, True, False)])
def test_block_sparse_routes_rows_to_the_fused_kernel_only_when_no_tile_needs_a_mask(n, causal, plain, gen, monkeypatch):
    """BigBird without a causal mask and with whole blocks: every row is plain, and its tiles take the three fused
    routes (global rows over split keys, global columns for every other row in one call, the window band as views,
    the random blocks gathered), no token mask. A ragged last key block or a causal diagonal sends rows through the
    masked path."""
    calls = _record_calls(monkeypatch, PARTS)
    block_mask = bigbird_block_mask(math.ceil(n / 16), generator=gen)
    q, k, v = randn(2, 3, n, 8, gen=gen), randn(2, 3, n, 8, gen=gen), randn(2, 3, n, 5, gen=gen)
    out = block_sparse_attention(q, k, v, block_mask, 16, is_causal=causal)
    expected = dense_attention(q, k, v, expand_block_mask(block_mask, 16)[:n, :n], is_causal=causal)
    torch.testing.assert_close(out, expected, **TIGHT)
    # BigBird's window holds the diagonal and its global columns the ragged last block: no row is plain then
    assert all((calls[name] > 0) == plain for name in PARTS[:-1]) and (calls["_masked_rows"] > 0) == (not plain)


@given(
    n_qb=st.integers(2, 14), n_kb=st.integers(2, 14), block=st.integers(1, 5), width=st.integers(1, 4),
    offset=st.integers(-3, 3), n_shared=st.integers(0, 2), n_full=st.integers(0, 2), extra=st.floats(0.0, 0.3),
    seed=st.integers(0, 2**16),
)
def test_block_sparse_computes_each_kept_tile_once_and_matches_dense(n_qb, n_kb, block, width, offset, n_shared,
                                                                     n_full, extra, seed):
    """Structured masks (a band of diagonals, shared columns, rows that see everything, scattered tiles) split into
    the fused routes: the output equals dense attention with the expanded mask, and the fused calls compute exactly
    (kept tiles) x block^2 scores: no tile twice, none padded."""
    monkeypatch = pytest.MonkeyPatch()
    seen = _record_scores(monkeypatch)
    calls = _record_calls(monkeypatch, ("_masked_rows",))
    try:
        gen = torch.Generator().manual_seed(seed)
        i, j = torch.arange(n_qb)[:, None], torch.arange(n_kb)[None, :]
        mask = (j - i >= offset) & (j - i < offset + width)
        mask[:, torch.randperm(n_kb, generator=gen)[:n_shared]] = True
        mask[torch.randperm(n_qb, generator=gen)[:n_full]] = True
        mask |= torch.rand(n_qb, n_kb, generator=gen) < extra
        mask[~mask.any(dim=-1), 0] = True  # every row keeps a tile: all rows plain
        L, S = n_qb * block, n_kb * block
        q, k, v = randn(1, 2, L, 4, gen=gen), randn(1, 2, S, 4, gen=gen), randn(1, 2, S, 4, gen=gen)
        out = block_sparse_attention(q, k, v, mask, block)
        torch.testing.assert_close(out, dense_attention(q, k, v, expand_block_mask(mask, block)), **TIGHT)
        assert seen["scores"] == int(mask.sum()) * block * block and calls["_masked_rows"] == 0
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("grad", [False, True])
def test_block_sparse_rows_with_and_without_a_partial_result_in_one_call(grad, gen, monkeypatch):
    """No shared column, so the band writes the first partial result of its rows; the edge rows, outside the
    band, meet their first keys in the same gathered call as band rows that merge theirs: each row either takes
    the call's result as it is or merges it, and all equal dense attention."""
    calls = _record_calls(monkeypatch, ("_shared_columns", "_band_rows", "_gathered_rows"))
    n_blocks, block = 10, 4
    i, j = torch.arange(n_blocks)[:, None], torch.arange(n_blocks)[None, :]
    mask = (j - i).abs() <= 1  # a band of three diagonals; rows 0 and 9 hold only two of them
    mask[0, 5] = mask[9, 3] = True  # rows 0 and 9: three tiles outside any band
    mask[4, 7:] = True  # row 4: three tiles past its band, so rows 0, 4 and 9 are gathered together
    inputs = [randn(1, 2, n_blocks * block, 4, gen=gen).requires_grad_(grad) for _ in range(3)]
    out = block_sparse_attention(*inputs, mask, block)
    dense = dense_attention(*inputs, expand_block_mask(mask, block))
    torch.testing.assert_close(out, dense, **TIGHT)
    assert calls == {"_shared_columns": 0, "_band_rows": 1, "_gathered_rows": 1}
    if grad:
        for got, want in zip(torch.autograd.grad(out.sum(), inputs), torch.autograd.grad(dense.sum(), inputs)):
            torch.testing.assert_close(got, want, **TIGHT)


def test_block_sparse_bigbird_float16_within_the_error_of_pytorch_in_float16(gen):
    """Partial results are merged in float32 and rounded to float16 once: the error against float64 is within
    FlashAttention-2's rule, twice the error of PyTorch's own float16 attention with the expanded mask."""
    n, block = 16 * 16, 16
    block_mask = bigbird_block_mask(n // block, generator=gen)
    q, k, v = (torch.randn(2, 3, n, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    token_mask = expand_block_mask(block_mask, block)
    exact = dense_attention(q, k, v, token_mask)
    half = [x.half() for x in (q, k, v)]
    torch_err = (F.scaled_dot_product_attention(*half, attn_mask=token_mask).double() - exact).abs().max()
    ours = block_sparse_attention(*half, block_mask, block)
    assert ours.dtype == torch.float16
    assert (ours.double() - exact).abs().max() <= 2 * torch_err


@pytest.mark.parametrize("grad", [False, True])
def test_block_sparse_chunks_and_reused_buffers_give_the_same_result(grad, gen, monkeypatch):
    """Tiny chunks: many gathers into the same buffers (or, under autograd, fresh tensors and the readable
    softmax(q k^T) v), one call per band row, full rows split into unequal key splits; rows of different widths;
    every row and gradient equals dense attention. (Second derivatives
    through the plain rows: test_flash.py's test_second_derivatives_through_the_triton_backends_...)"""
    from attnbook import sparse

    monkeypatch.setattr(sparse, "_CHUNK_KEYS", 1)  # one block row per chunk
    monkeypatch.setattr(sparse, "_BAND_ROWS", 1)  # one call per row of the band
    monkeypatch.setattr(sparse, "_SPLIT_KEYS", 5 * 8)  # a full row's 12 key blocks: splits of 5, 5 and 2
    block_mask = bigbird_block_mask(12, n_random=3, generator=gen)
    block_mask[5, :] = True  # a second row that sees every block
    block_mask[7, 9:] = True  # a wider plain row
    inputs = [randn(1, 2, 12 * 8, 4, gen=gen).requires_grad_(grad) for _ in range(3)]
    out = block_sparse_attention(*inputs, block_mask, 8)
    dense = dense_attention(*inputs, expand_block_mask(block_mask, 8))
    torch.testing.assert_close(out, dense, **TIGHT)
    if grad:
        upstream = randn(*out.shape, gen=gen)
        for got, want in zip(torch.autograd.grad(out, inputs, upstream), torch.autograd.grad(dense, inputs, upstream)):
            torch.testing.assert_close(got, want, **TIGHT)


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(block_mask=torch.ones(2, 2, dtype=torch.bool)), "block_mask"),
        (dict(block_mask=torch.ones(3, 3)), "block_mask"),
        (dict(block_size=0), "block_size"),
    ],
)
def test_block_sparse_errors_name_the_argument(bad, match, gen):
    args = dict(q=randn(1, 10, 4, gen=gen), k=randn(1, 10, 4, gen=gen), v=randn(1, 10, 4, gen=gen),
                block_mask=torch.ones(3, 3, dtype=torch.bool), block_size=4)
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        block_sparse_attention(**args)


# ---------------------------------------------------------------------------------------------
# sliding_window_attention == dense attention with the window mask, in O(n w) memory
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n, window, causal", list(itertools.product([1, 2, 9, 30], [0, 1, 4, 40], [False, True])))
def test_sliding_window_attention_matches_dense(n, window, causal, gen):
    q, k, v = randn(2, 3, n, 8, gen=gen), randn(2, 3, n, 8, gen=gen), randn(2, 3, n, 5, gen=gen)
    expected = dense_attention(q, k, v, sliding_window_mask(n, window, is_causal=causal))
    torch.testing.assert_close(sliding_window_attention(q, k, v, window, is_causal=causal), expected, **TIGHT)


@pytest.mark.parametrize("window, causal", [(0, False), (2, False), (2, True)])
def test_sliding_window_attention_of_an_empty_sequence(window, causal, gen):
    """n = 0 (found by tests/properties/test_differential.py): unfold of the padded keys raised RuntimeError."""
    q, k, v = randn(2, 0, 4, gen=gen), randn(2, 0, 4, gen=gen), randn(2, 0, 3, gen=gen)
    out = sliding_window_attention(q, k, v, window, is_causal=causal)
    assert out.shape == (2, 0, 3)


@pytest.mark.parametrize("L, S", [(0, 5), (0, 0), (4, 0)])
def test_block_sparse_without_queries_or_keys(L, S, gen):
    """L = 0 raised IndexError in the row-group split (found by tests/properties/test_differential.py); S = 0 gives
    the contract's zeros, attached to the autograd graph."""
    q = randn(2, L, 4, gen=gen, dtype=torch.float64).requires_grad_()
    k, v = randn(2, S, 4, gen=gen, dtype=torch.float64), randn(2, S, 3, gen=gen, dtype=torch.float64)
    block_mask = torch.ones(-(-L // 2), -(-S // 2), dtype=torch.bool)
    for is_causal in (False, True):
        out = block_sparse_attention(q, k, v, block_mask, 2, is_causal=is_causal)
        assert out.shape == (2, L, 3) and (out == 0).all()
        torch.testing.assert_close(out, dense_attention(q, k, v, is_causal=is_causal))
    if L:
        out.sum().backward()
        assert (q.grad == 0).all()


EMPTY_SHAPES = [  # (B, H, Hk, L, S, E, Ev): an empty batch, no heads, no queries, no keys, no widths
    (0, 2, 2, 8, 8, 4, 3), (0, 4, 2, 9, 7, 4, 3), (2, 0, 0, 8, 8, 4, 3), (2, 0, 1, 8, 8, 4, 3),
    (2, 2, 2, 0, 8, 4, 3), (2, 2, 2, 8, 0, 4, 3), (0, 2, 2, 0, 0, 4, 3), (2, 2, 2, 8, 5, 4, 0),
    (2, 3, 3, 9, 6, 0, 3),
]


@pytest.mark.parametrize("B, H, Hk, L, S, E, Ev", EMPTY_SHAPES)
@pytest.mark.parametrize("is_causal", [False, True])
def test_block_sparse_on_empty_shapes_equals_sdpa(B, H, Hk, L, S, E, Ev, is_causal, gen):
    """Regression: batch 0 (or heads 0) died in a reshape, and causal batch 0 divided by zero. Every empty shape
    gives SDPA's result on the same shapes: the empty (B, H, L, Ev) output, zeros without keys, and with no
    features (E = 0, an explicit scale) equal scores, i.e. the mean of the visible values."""
    q, k, v = randn(B, H, L, E, gen=gen), randn(B, Hk, S, E, gen=gen), randn(B, Hk, S, Ev, gen=gen)
    block_mask = torch.rand(-(-L // 4), -(-S // 4), generator=gen) < 0.7
    out = block_sparse_attention(q, k, v, block_mask, 4, is_causal=is_causal, scale=0.5)
    token_mask = expand_block_mask(block_mask, 4)[:L, :S]
    if is_causal:
        token_mask = token_mask & causal_mask(L, S)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=token_mask, scale=0.5, enable_gqa=H != Hk)
    expected = torch.nan_to_num(expected)  # SDPA's NaN rows (no key allowed) are the contract's zeros
    assert out.shape == expected.shape == (B, H, L, Ev)
    torch.testing.assert_close(out, expected, **TIGHT)


def test_block_sparse_and_sliding_window_refuse_the_default_scale_of_no_features(gen):
    """E = 0 divided by zero in 1/sqrt(E); as in flash_attention, the default scale is undefined there."""
    q, v = randn(2, 2, 8, 0, gen=gen), randn(2, 2, 8, 3, gen=gen)
    with pytest.raises(ValueError, match=r"block_sparse_attention: q has head_dim 0, .* \(pass scale=\): "
                                         r"q \(2, 2, 8, 0\)"):
        block_sparse_attention(q, q, v, torch.ones(2, 2, dtype=torch.bool), 4)
    with pytest.raises(ValueError, match=r"sliding_window_attention: q has head_dim 0"):
        sliding_window_attention(q, q, v, 1)
    out = sliding_window_attention(q, q, v, 1, scale=1.0)
    expected = F.scaled_dot_product_attention(q, q, v, attn_mask=sliding_window_mask(8, 1), scale=1.0)
    torch.testing.assert_close(out, expected, **TIGHT)


@pytest.mark.parametrize("shape", [(0, 2, 6, 4), (2, 0, 6, 4)])
def test_sliding_window_attention_on_an_empty_batch_or_no_heads_equals_sdpa(shape, gen):
    q = randn(*shape, gen=gen)
    out = sliding_window_attention(q, q, q[..., :3], 2)
    expected = F.scaled_dot_product_attention(q, q, q[..., :3], attn_mask=sliding_window_mask(6, 2))
    assert out.shape == expected.shape == (*shape[:-1], 3)


@pytest.mark.parametrize("L, S, block", [(64, 64, 8), (37, 50, 8), (50, 37, 4)])
def test_causal_tiles_above_the_diagonal_cost_nothing(L, S, block, gen):
    """The docstring's "tiles entirely above that diagonal are dropped before any work": with is_causal a full
    block mask costs exactly the FLOPs of the mask that keeps only the tiles the diagonal reaches, and gives the
    same output."""
    q, k, v = randn(1, 2, L, 4, gen=gen), randn(1, 2, S, 4, gen=gen), randn(1, 2, S, 3, gen=gen)
    n_qb, n_kb = -(-L // block), -(-S // block)
    i, j = torch.arange(n_qb)[:, None], torch.arange(n_kb)[None, :]
    reached = j * block <= i * block + block - 1 + S - L  # a tile's first key is visible to its last query
    runs = []
    for mask in (torch.ones(n_qb, n_kb, dtype=torch.bool), reached):
        with FlopCounterMode(display=False) as counter:
            out = block_sparse_attention(q, k, v, mask, block, is_causal=True)
        runs.append((counter.get_total_flops(), out))
    assert runs[0][0] == runs[1][0]
    assert torch.equal(runs[0][1], runs[1][1])


def test_sliding_window_attention_memory_is_linear(gen):
    n, window = 4096, 8
    q, k, v = (torch.randn(1, n, 16, generator=gen) for _ in range(3))
    largest = largest_new_tensor(sliding_window_attention, q, k, v, window)
    assert largest <= n * (2 * window + 1) * 16, f"largest intermediate has {largest} elements"


@pytest.mark.parametrize("n, window", [(64, 0), (64, 3), (128, 3), (128, 12), (256, 12)])
def test_sliding_window_attention_flops_are_linear_in_n_and_w(n, window, gen):
    """torch's FLOP counter sees two matmuls of n (2w + 1) d multiply-adds: O(n w d)."""
    d = 8
    q, k, v = (torch.randn(1, n, d, generator=gen) for _ in range(3))
    with FlopCounterMode(display=False) as counter:
        sliding_window_attention(q, k, v, window)
    assert counter.get_total_flops() == 2 * 2 * n * (2 * window + 1) * d


@pytest.mark.parametrize("n, window, causal, E, Ev", [(64, 3, True, 8, 8), (64, 3, False, 8, 5), (96, 5, True, 4, 12)])
def test_sliding_window_attention_flops_follow_the_docstring(n, window, causal, E, Ev, gen):
    """2 n s (E + Ev) FLOPs with s = 2 window + 1 keys per query, window + 1 if causal, for key and value widths
    that differ."""
    q, k, v = torch.randn(1, n, E, generator=gen), torch.randn(1, n, E, generator=gen), torch.randn(1, n, Ev, generator=gen)
    s = window + 1 if causal else 2 * window + 1
    with FlopCounterMode(display=False) as counter:
        sliding_window_attention(q, k, v, window, is_causal=causal)
    assert counter.get_total_flops() == 2 * n * s * (E + Ev)


def test_sliding_window_attention_errors(gen):
    q = randn(5, 4, gen=gen)
    with pytest.raises(ValueError, match="same length"):
        sliding_window_attention(q, randn(6, 4, gen=gen), randn(6, 4, gen=gen), 1)
    with pytest.raises(ValueError, match="window"):
        sliding_window_attention(q, q, q, -1)


# ---------------------------------------------------------------------------------------------
# LSH buckets and the graph view
# ---------------------------------------------------------------------------------------------
def test_lsh_buckets_range_and_scale_invariance(gen):
    x = randn(3, 50, 8, gen=gen)
    buckets = lsh_buckets(x, 8, generator=torch.Generator().manual_seed(0))
    assert buckets.shape == (3, 50) and buckets.min() >= 0 and buckets.max() < 8
    assert torch.equal(buckets, lsh_buckets(2.5 * x, 8, generator=torch.Generator().manual_seed(0)))  # angular
    mask = lsh_mask(x[0], 8, generator=gen)
    assert torch.equal(mask, mask.T) and mask.diagonal().all()


def test_lsh_close_vectors_collide_more_often(gen):
    x = randn(2000, 16, gen=gen)
    near, far = x + 0.1 * randn(2000, 16, gen=gen), randn(2000, 16, gen=gen)
    rate = lambda y: (lsh_buckets(torch.stack([x, y]), 8, torch.Generator().manual_seed(3)).diff(dim=0) == 0).float().mean()  # noqa: E731
    assert rate(near) > 0.8 and rate(far) < 0.3


def test_lsh_mask_is_equality_of_the_buckets(gen):
    """lsh_mask's definition, mask[..., i, j] = bucket(x_i) == bucket(x_j), with the buckets of lsh_buckets drawn
    from the same generator state, for a batch of sequences."""
    x = randn(2, 3, 20, 8, gen=gen)
    buckets = lsh_buckets(x, 6, torch.Generator().manual_seed(4))
    mask = lsh_mask(x, 6, torch.Generator().manual_seed(4))
    assert mask.shape == (2, 3, 20, 20)
    for index in itertools.product(range(2), range(3), range(20), range(20)):
        b, h, i, j = index
        assert mask[index].item() == (buckets[b, h, i] == buckets[b, h, j]).item()


def _bfs_distances(mask: torch.Tensor) -> list[list[int]]:
    n = mask.shape[0]
    out = []
    for s in range(n):
        dist = [-1] * n
        dist[s], queue = 0, deque([s])
        while queue:
            i = queue.popleft()
            for j in torch.nonzero(mask[i]).flatten().tolist():
                if dist[j] < 0:
                    dist[j] = dist[i] + 1
                    queue.append(j)
        out.append(dist)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_graph_distances_match_bfs(seed):
    mask = torch.rand(12, 12, generator=torch.Generator().manual_seed(seed)) < 0.15
    assert graph_distances(mask).tolist() == _bfs_distances(mask)


def test_graph_distances_window_and_global():
    n, w = 33, 2
    assert graph_distances(sliding_window_mask(n, w)).max() == math.ceil((n - 1) / w)
    assert graph_distances(longformer_mask(n, w, [16])).max() == 2  # any token -> global token -> any token


@pytest.mark.parametrize(
    "call, error, match",
    [
        # a bool tensor used as indices made tokens 0 and 1 global (True, False -> 1, 0)
        (lambda: global_mask(4, torch.tensor([True, False, False, True])), TypeError,
         r"global_mask: global_idx must hold integer positions, got a torch.bool tensor .*nonzero"),
        (lambda: global_mask(8, [1.5, 3]), TypeError, "global_mask: global_idx must hold integers"),
        (lambda: lsh_buckets(torch.ones(8, 4, dtype=torch.long), 4), TypeError,
         "lsh_buckets: x must be a floating-point tensor"),
        (lambda: sliding_window_mask(8, 2.5), TypeError, "sliding_window_mask: window"),
        (lambda: sliding_window_attention(*[torch.ones(4, 2)] * 3, 1, scale=float("nan")), ValueError,
         "sliding_window_attention: scale"),
    ],
)
def test_wrong_inputs_are_refused_not_rounded(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_bool_mask_as_global_positions_via_nonzero():
    flags = torch.tensor([True, False, False, True])
    assert torch.equal(global_mask(4, flags.nonzero().flatten()), global_mask(4, [0, 3]))
