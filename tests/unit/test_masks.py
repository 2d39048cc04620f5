"""attnbook.masks: each mask pattern is one predicate, and every other form equals it.

* each predicate, evaluated densely by :func:`attnbook.masks.dense`, equals the slow obvious
  double loop over (query, key) of ``tests/oracle.py``, on ragged shapes hypothesis draws
  (L != S, sizes 0 and 1);
* the dense masks of ``core`` and ``sparse`` equal ``dense(predicate)``;
* the FlexAttention mods of ``flex`` equal the predicates, on broadcast index tensors and under
  FlexAttention's own ``vmap`` (``create_mask``);
* the tile forms: ``flash.key_range`` visits exactly the keys some query of its block may see, and
  the Triton kernels' ``_key_range`` visits every key tile that holds a visible key, plus only
  the documented extras (see ``test_triton_key_range_covers_the_tiles_with_a_visible_key``).
"""

from __future__ import annotations

import itertools

import oracle
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import create_mask

from attnbook import core, flex, masks, sparse
from attnbook.flash import key_range

lengths = st.integers(0, 11)
positive = st.integers(1, 11)


def _loop(rule, L: int, S: int) -> torch.Tensor:
    """The slow obvious mask: ``rule(i, j)`` for every query ``i`` and key ``j``."""
    out = torch.zeros(L, S, dtype=torch.bool)
    for i, j in itertools.product(range(L), range(S)):
        out[i, j] = bool(rule(i, j))
    return out


def _dense(predicate, L: int, S: int) -> torch.Tensor:
    return masks.dense(predicate, L, S)[0, 0]


def _sorted_ids(draw, n: int, n_docs: int) -> list[int]:
    return sorted(draw(st.lists(st.integers(0, n_docs - 1), min_size=n, max_size=n)))


# --------------------------------------------------------------------------------------------------
# Each predicate equals the double loop
# --------------------------------------------------------------------------------------------------
@given(L=lengths, S=lengths)
def test_causal_is_bottom_right(L, S):
    assert torch.equal(_dense(masks.causal(L, S), L, S), _loop(lambda i, j: oracle.causal(i, j, L, S), L, S))


@given(L=lengths, S=lengths, window=st.integers(0, 4), dilation=st.integers(1, 3), is_causal=st.booleans())
def test_sliding_window_is_bottom_right(L, S, window, dilation, is_causal):
    pattern = masks.sliding_window(window, is_causal=is_causal, dilation=dilation, L=L, S=S)
    want = _loop(lambda i, j: oracle.sliding_window(i, j, window, dilation, is_causal, shift=S - L), L, S)
    assert torch.equal(_dense(pattern, L, S), want)


@given(n=positive, window=st.integers(0, 4), is_causal=st.booleans())
def test_sliding_window_without_lengths_is_square_and_a_band(n, window, is_causal):
    pattern = masks.sliding_window(window, is_causal=is_causal)
    want = _loop(lambda i, j: oracle.sliding_window(i, j, window, 1, is_causal), n, n)
    assert torch.equal(_dense(pattern, n, n), want)
    band = masks.band((window, 0 if is_causal else window), n)
    assert torch.equal(_dense(band, n, n), want), "dilation 1: the window is FlashAttention-2's band"


@given(L=lengths, S=lengths, left=st.integers(-1, 5), right=st.integers(-1, 5))
def test_band_is_flash_attention_2s_window_size(L, S, left, right):
    want = _loop(lambda i, j: oracle.window_size(i, j, L, S, left, right), L, S)
    assert torch.equal(_dense(masks.band((left, right), L, S), L, S), want)
    if (left, right) == (-1, 0):
        assert torch.equal(want, _dense(masks.causal(L, S), L, S))


@st.composite
def global_case(draw):
    n = draw(positive)
    return n, draw(st.lists(st.integers(0, n - 1), max_size=4, unique=True))


@given(case=global_case(), window=st.integers(0, 3), dilation=st.integers(1, 3))
def test_global_tokens_and_longformer(case, window, dilation):
    n, idx = case
    want = _loop(lambda i, j: oracle.global_tokens(i, j, idx), n, n)
    assert torch.equal(_dense(masks.global_tokens(n, idx), n, n), want)
    local = _loop(lambda i, j: oracle.sliding_window(i, j, window, dilation), n, n)
    assert torch.equal(_dense(masks.longformer(n, window, idx, dilation), n, n), want | local)


@given(data=st.data(), L=positive, S=positive, block=st.integers(1, 4))
def test_blocks_read_the_layout(data, L, S, block):
    n_q, n_k = -(-L // block), -(-S // block)
    layout = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n_q * n_k, max_size=n_q * n_k)))
    layout = layout.view(n_q, n_k)
    want = _loop(lambda i, j: oracle.in_block(i, j, layout.tolist(), block), L, S)
    assert torch.equal(_dense(masks.blocks(layout, block), L, S), want)


@given(lengths_=st.lists(st.integers(0, 6), max_size=4), max_len=st.integers(6, 8), H=st.integers(1, 2))
def test_padding_depends_on_the_batch_entry(lengths_, max_len, H):
    B, L = len(lengths_), 3
    got = masks.dense(masks.padding(lengths_), L, max_len, B=B, H=H)
    assert got.shape == (B, H, L, max_len)
    for b, n in enumerate(lengths_):
        assert torch.equal(got[b], (torch.arange(max_len) < n).expand(H, L, max_len))


@st.composite
def documents(draw):
    n_docs = draw(st.integers(1, 3))
    L, S = draw(lengths), draw(lengths)
    return _sorted_ids(draw, L, n_docs), _sorted_ids(draw, S, n_docs)


@given(ids=documents(), is_causal=st.booleans())
def test_document_is_bottom_right_within_each_document(ids, is_causal):
    q_ids, kv_ids = ids
    L, S = len(q_ids), len(kv_ids)
    pattern = masks.document(torch.tensor(q_ids, dtype=torch.long), torch.tensor(kv_ids, dtype=torch.long),
                             is_causal=is_causal)
    want = _loop(lambda i, j: oracle.same_document(i, j, q_ids, kv_ids, is_causal), L, S)
    assert torch.equal(_dense(pattern, L, S), want)


def test_dense_broadcasts_over_batch_and_heads():
    got = masks.dense(masks.causal(3, 5), 3, 5, B=2, H=4)
    assert got.shape == (2, 4, 3, 5) and got.dtype == torch.bool and got.is_contiguous()
    assert torch.equal(got, core.causal_mask(3, 5).expand(2, 4, 3, 5))
    assert masks.dense(masks.causal(0), 0, 0).shape == (1, 1, 0, 0)


# --------------------------------------------------------------------------------------------------
# The dense masks of core and sparse are dense(predicate)
# --------------------------------------------------------------------------------------------------
@given(L=lengths, S=lengths)
def test_core_causal_mask_is_the_dense_predicate(L, S):
    assert torch.equal(core.causal_mask(L, S), _dense(masks.causal(L, S), L, S))


@given(lengths_=st.lists(st.integers(0, 6), max_size=4))
def test_core_padding_mask_is_the_dense_predicate(lengths_):
    want = masks.dense(masks.padding(lengths_), 1, 6, B=len(lengths_))[:, 0, 0]
    assert torch.equal(core.padding_mask(lengths_, 6), want)


@given(L=positive, S=positive, window=st.integers(0, 4), dilation=st.integers(1, 3), is_causal=st.booleans())
def test_sparse_sliding_window_mask_is_the_dense_predicate_and_aligns_like_flex(L, S, window, dilation, is_causal):
    got = sparse.sliding_window_mask(L, window, is_causal=is_causal, dilation=dilation, S=S)
    pattern = masks.sliding_window(window, is_causal=is_causal, dilation=dilation, L=L, S=S)
    assert got.shape == (L, S) and torch.equal(got, _dense(pattern, L, S))
    mod = flex.sliding_window_mask_mod(window, is_causal=is_causal, dilation=dilation, L=L, S=S)
    assert torch.equal(got, _dense(mod, L, S)), "the dense mask and the flex mod agree for L != S"
    square = sparse.sliding_window_mask(L, window, is_causal=is_causal, dilation=dilation)
    assert torch.equal(square, sparse.sliding_window_mask(L, window, is_causal=is_causal, dilation=dilation, S=L))


def test_sparse_sliding_window_mask_square_case_is_unchanged():
    """The square mask as it was written before the predicate: the offsets ``i - j``."""
    for n, window, dilation, is_causal in itertools.product([1, 2, 7], [0, 1, 3], [1, 2], [False, True]):
        offset = torch.arange(n)[:, None] - torch.arange(n)[None, :]
        want = (offset.abs() <= window * dilation) & (offset % dilation == 0)
        want = want & (offset >= 0) if is_causal else want
        assert torch.equal(sparse.sliding_window_mask(n, window, is_causal=is_causal, dilation=dilation), want)


@given(case=global_case(), window=st.integers(0, 3), dilation=st.integers(1, 3))
def test_sparse_global_and_longformer_masks_are_the_dense_predicates(case, window, dilation):
    n, idx = case
    assert torch.equal(sparse.global_mask(n, idx), _dense(masks.global_tokens(n, idx), n, n))
    assert torch.equal(sparse.longformer_mask(n, window, idx, dilation),
                       _dense(masks.longformer(n, window, idx, dilation), n, n))


@given(data=st.data(), L=positive, S=positive, block=st.integers(1, 4))
def test_sparse_expand_block_mask_is_the_dense_predicate(data, L, S, block):
    n_q, n_k = -(-L // block), -(-S // block)
    layout = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n_q * n_k, max_size=n_q * n_k)))
    layout = layout.view(n_q, n_k)
    assert torch.equal(sparse.expand_block_mask(layout, block)[:L, :S], _dense(masks.blocks(layout, block), L, S))


# --------------------------------------------------------------------------------------------------
# The FlexAttention mods are the predicates
# --------------------------------------------------------------------------------------------------
def _mod_pairs(L: int, S: int):
    """(flex mod, predicate) pairs for L queries and S keys (square patterns use L)."""
    n = L
    layout = torch.tensor([[True, False, True], [False, True, True]])
    ids = torch.tensor([0] * (n // 2) + [1] * (n - n // 2))
    return {
        "causal": (flex.causal_mask_mod(L, S), masks.causal(L, S), (L, S)),
        "sliding": (flex.sliding_window_mask_mod(2, dilation=2, L=L, S=S),
                    masks.sliding_window(2, dilation=2, L=L, S=S), (L, S)),
        "band": (flex.window_size_mask_mod((3, 1), L, S), masks.band((3, 1), L, S), (L, S)),
        "global": (flex.global_mask_mod(n, [0, n - 1]), masks.global_tokens(n, [0, n - 1]), (n, n)),
        "longformer": (flex.longformer_mask_mod(n, 1, [0], 2), masks.longformer(n, 1, [0], 2), (n, n)),
        "blocks": (flex.block_mask_mod(layout, 4), masks.blocks(layout, 4), (min(L, 8), min(S, 12))),
        "document": (flex.document_mask(ids, is_causal=True), masks.document(ids, is_causal=True), (n, n)),
    }


@pytest.mark.parametrize("L, S", [(1, 1), (5, 9), (9, 5), (8, 8)])
@pytest.mark.parametrize("name", ["causal", "sliding", "band", "global", "longformer", "blocks", "document"])
def test_flex_mods_are_the_predicates_densely_and_under_vmap(name, L, S):
    mod, predicate, (rows, cols) = _mod_pairs(L, S)[name]
    want = masks.dense(predicate, rows, cols, B=2, H=3)
    assert torch.equal(masks.dense(mod, rows, cols, B=2, H=3), want)
    # FlexAttention's own dense mask, built by vmap over the four indices
    assert torch.equal(create_mask(predicate, 2, 3, rows, cols, device="cpu").bool(), want)


def test_active_tiles_are_the_tiles_with_a_visible_key():
    got = masks.active_tiles(masks.causal(5, 7), 5, 7, 2, 3)
    assert got.shape == (3, 3)
    dense = core.causal_mask(5, 7)
    for qi, ki in itertools.product(range(3), range(3)):
        assert bool(got[qi, ki]) == bool(dense[2 * qi : 2 * qi + 2, 3 * ki : 3 * ki + 3].any())


# --------------------------------------------------------------------------------------------------
# The tile forms visit the tiles that hold a visible key
# --------------------------------------------------------------------------------------------------
def _windowed(L: int, S: int, left: int, right: int, is_causal: bool):
    band = masks.band((left, right), L, S)
    if not is_causal:
        return band
    causal = masks.causal(L, S)
    return lambda b, h, q, kv: band(b, h, q, kv) & causal(b, h, q, kv)


windows = st.tuples(st.integers(-1, 6), st.integers(-1, 6))


@given(L=positive, S=lengths, block=st.integers(1, 5), window=windows, is_causal=st.booleans())
def test_flash_key_range_is_exactly_the_keys_a_query_block_may_see(L, S, block, window, is_causal):
    mask = _dense(_windowed(L, S, *window, is_causal), L, S)
    for i0 in range(0, L, block):
        i1 = min(i0 + block, L)
        lo, hi = key_range(i0, i1, L, S, is_causal=is_causal, window_size=window)
        seen = mask[i0:i1].any(dim=0).nonzero().flatten().tolist()
        assert seen == list(range(lo, hi)), (i0, i1, lo, hi, seen)


try:  # the Triton kernels' tile rule, run by Triton's CPU interpreter (tests/conftest.py sets it)
    import triton
    import triton.language as tl

    from attnbook.kernels.flash_triton import _UNBOUNDED, _key_range
except ImportError:  # pragma: no cover - triton is optional
    triton = None
else:

    @triton.jit
    def _key_ranges(OUT, L, S, left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
        """The ``[lo, hi)`` each query tile's program of the forward kernel computes."""
        pid = tl.program_id(0)
        lo, hi = _key_range(pid * BLOCK_M, L, S, left, right, BLOCK_M, BLOCK_N, CAUSAL, WINDOW)
        tl.store(OUT + 2 * pid, lo)
        tl.store(OUT + 2 * pid + 1, hi)


@pytest.fixture(scope="module")
def triton_key_range():
    """``[lo, hi)`` per query tile from ``flash_triton._key_range``, with the window and the
    causal flag passed as ``flash_triton._options`` passes them."""
    import os

    if triton is None or os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the kernels' helper under Triton's CPU interpreter")

    def run(L, S, left, right, is_causal, block_m, block_n):
        n = -(-L // block_m)
        out = torch.zeros(2 * n, dtype=torch.int32)
        window = left >= 0 or right >= 0
        if is_causal:  # the causal mask is a window's right side at 0
            right = 0 if right < 0 else min(right, 0)
        _key_ranges[(n,)](out, L, S, _UNBOUNDED if left < 0 else left,
                          _UNBOUNDED if right < 0 else right, BLOCK_M=block_m, BLOCK_N=block_n,
                          CAUSAL=is_causal, WINDOW=window)
        return out.view(n, 2).tolist()

    return run


@given(L=positive, S=positive, blocks=st.sampled_from([(2, 2), (2, 4), (4, 2), (3, 5)]),
       window=windows, is_causal=st.booleans())
def test_triton_key_range_covers_the_tiles_with_a_visible_key(triton_key_range, L, S, blocks, window,
                                                              is_causal):
    """The kernel visits the key tiles ``range(lo, hi, BLOCK_N)``. They are every tile that holds a
    key some query of the tile may see, plus, documented: the tiles the padded rows of the last
    query tile (rows ``L ..``, which are never stored) would see under the same rule; and a tile
    ``[lo, lo + BLOCK_N)`` may start at a tile boundary past ``S`` only when no row sees a key. No
    other tile is visited."""
    block_m, block_n = blocks
    n_rows = -(-L // block_m) * block_m  # the padded rows the programs cover
    L_pad_mask = _dense(_windowed(L, S, *window, is_causal), L, S)
    for tile, (lo, hi) in enumerate(triton_key_range(L, S, *window, is_causal, block_m, block_n)):
        visited = {start // block_n for start in range(lo, hi, block_n)}
        assert lo % block_n == 0, "the first tile starts on a tile boundary"
        rows = L_pad_mask[tile * block_m : (tile + 1) * block_m]
        needed = {j // block_n for j in rows.any(dim=0).nonzero().flatten().tolist()}
        assert needed <= visited, (tile, lo, hi, needed, visited)
        # the extras: keys the padded rows past L would see, counted with the same rule
        last = min((tile + 1) * block_m, n_rows)
        allowed = set()
        for i in range(tile * block_m, last):
            for j in range(S):
                if oracle.window_size(i, j, L, S, *window) and (not is_causal or oracle.causal(i, j, L, S)):
                    allowed.add(j // block_n)
        assert visited <= allowed | needed, (tile, lo, hi, visited, allowed)


# --------------------------------------------------------------------------------------------------
# Bad input names the function and the argument
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call, error, words", [
    (lambda: masks.causal(2.5), TypeError, "causal: L"),
    (lambda: masks.causal(3, -1), ValueError, "causal: S"),
    (lambda: masks.sliding_window(-1), ValueError, "sliding_window: window"),
    (lambda: masks.sliding_window(2, dilation=0), ValueError, "sliding_window: dilation"),
    (lambda: masks.sliding_window(2, is_causal="no"), TypeError, "sliding_window: is_causal"),
    (lambda: masks.sliding_window(2, L=4), ValueError, "sliding_window: give both L and S"),
    (lambda: masks.band((1, 2, 3), 4), TypeError, "band: window_size"),
    (lambda: masks.band((-2, 0), 4), ValueError, "band: window_size"),
    (lambda: masks.global_tokens(0, []), ValueError, "global_tokens: seq_len"),
    (lambda: masks.global_tokens(4, [4]), ValueError, "global_tokens: global_idx"),
    (lambda: masks.global_tokens(4, torch.ones(4, dtype=torch.bool)), TypeError, "global_tokens: global_idx"),
    (lambda: masks.longformer(8, -1, [0]), ValueError, "longformer: window"),
    (lambda: masks.longformer(8, 1, [1.5]), TypeError, "longformer: global_idx"),
    (lambda: masks.blocks(torch.ones(2, 2), 2), TypeError, "blocks: block_mask"),
    (lambda: masks.blocks(torch.ones(2, dtype=torch.bool), 2), ValueError, "blocks: block_mask"),
    (lambda: masks.blocks(torch.ones(2, 2, dtype=torch.bool), 0), ValueError, "blocks: block_size"),
    (lambda: masks.padding([1, -1]), ValueError, "padding: lengths"),
    (lambda: masks.padding([1.5]), TypeError, "padding: lengths"),
    (lambda: masks.document(torch.tensor([1, 0])), ValueError, "document: doc_ids"),
    (lambda: masks.document(torch.ones(3)), TypeError, "document: doc_ids"),
    (lambda: masks.document(torch.zeros(2, 2, dtype=torch.long)), ValueError, "document: doc_ids"),
    (lambda: masks.document(torch.zeros(2, dtype=torch.long), is_causal="yes"), TypeError, "document: is_causal"),
    (lambda: masks.dense(3, 2, 2), TypeError, "dense: predicate"),
    (lambda: masks.dense(masks.causal(2), 2, -1), ValueError, "dense: S"),
    (lambda: masks.dense(masks.causal(2), 2, 2, B=1.0), TypeError, "dense: B"),
    (lambda: masks.active_tiles(masks.causal(2), 2, 2, 0), ValueError, "active_tiles: block_q"),
    (lambda: masks.active_tiles(masks.causal(2), 2, 2, 2, True), TypeError, "active_tiles: block_k"),
])
def test_bad_input_names_the_argument(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_sliding_window_mask_refuses_a_bad_key_length():
    with pytest.raises(ValueError, match="sliding_window_mask: S"):
        sparse.sliding_window_mask(4, 1, S=0)
