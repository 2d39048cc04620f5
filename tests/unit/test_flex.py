"""Tests of attnbook.flex: every mask_mod and score_mod against attnbook's own dense result.

Each of the book's masks and biases is checked three ways against an independent reference
(attnbook's bool mask or additive bias through ``attnbook.core.scaled_dot_product_attention``,
a module's own function, or the definition written as a loop):

* densely, through :func:`attnbook.flex.flex_reference` (float64, several heads, L != S where
  the definition allows it);
* through ``flex_attention`` itself, eager (on the CPU it runs an unfused implementation in
  about 0.1 s per call at these sizes, float64 allowed), with the ``BlockMask`` of
  ``create_block_mask``;
* compiled, for two representative cases only (a mask combination, and score mods over
  BigBird's block mask, with fully masked rows): ``torch.compile(flex_attention)`` costs
  about 15 s for the first mod on a cold inductor cache and about 5 s for each further one
  (a few s when cached), so one module-scoped compiled function serves both, with fixed
  float32 shapes (CPU FlexAttention compiles float32/16 and bfloat16, not float64).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.nn.attention.flex_attention import (
    and_masks,
    create_block_mask,
    flex_attention,
    or_masks,
)

from attnbook.core import causal_mask, masked_softmax, scaled_dot_score
from attnbook.core import scaled_dot_product_attention as dense_attention
from attnbook.flex import (
    alibi_score_mod,
    block_mask_mod,
    causal_mask_mod,
    chain_score_mods,
    document_ids,
    document_mask,
    flex_block_mask,
    flex_reference,
    global_mask_mod,
    longformer_mask_mod,
    sliding_window_mask_mod,
    softcap_score_mod,
    t5_score_mod,
    window_size_mask_mod,
)
from attnbook.positional import T5RelativeBias, alibi_bias
from attnbook.sparse import (
    bigbird_block_mask,
    block_sparse_attention,
    expand_block_mask,
    global_mask,
    longformer_mask,
    sliding_window_mask,
)

TIGHT = dict(atol=1e-10, rtol=1e-8)  # float64
LOOSE = dict(atol=2e-5, rtol=1e-4)  # float32 against a float64 reference

# flex_attention without torch.compile warns once that it is unfused: that is the point here
pytestmark = pytest.mark.filterwarnings(
    "ignore:flex_attention called without torch.compile"
)


def qkv(B, H, L, S, E=8, *, gen, dtype=torch.float64, Hk=None):
    Hk = H if Hk is None else Hk
    q = torch.randn(B, H, L, E, generator=gen, dtype=torch.float64)
    k = torch.randn(B, Hk, S, E, generator=gen, dtype=torch.float64)
    v = torch.randn(B, Hk, S, E + 2, generator=gen, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def eager_flex(q, k, v, *, mask_mod=None, score_mod=None, scale=None, block_mask=None):
    """``flex_attention`` without compilation, the block mask built from ``mask_mod``."""
    if block_mask is None and mask_mod is not None:
        B, H, L, S = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        block_mask = create_block_mask(mask_mod, B, H, L, S, device=q.device)
    return flex_attention(
        q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale
    )


def both_ways(
    q, k, v, expected, *, mask_mod=None, score_mod=None, scale=None, tol=TIGHT
):
    """The mods give ``expected`` densely (flex_reference) and through flex_attention."""
    dense = flex_reference(q, k, v, mask_mod=mask_mod, score_mod=score_mod, scale=scale)
    torch.testing.assert_close(dense, expected, **tol)
    flex = eager_flex(q, k, v, mask_mod=mask_mod, score_mod=score_mod, scale=scale)
    torch.testing.assert_close(flex, expected, **tol)


def loop_window_mask(L, S, left, right):
    """FlashAttention-2's window_size rule, one entry at a time."""
    mask = torch.zeros(L, S, dtype=torch.bool)
    for i, j in itertools.product(range(L), range(S)):
        d = i + S - L - j
        mask[i, j] = (left < 0 or d <= left) and (right < 0 or -d <= right)
    return mask


def doc_block_mask(q_lens, k_lens, is_causal):
    """Block-diagonal mask of packed documents: one bottom-right causal (or full) block
    per document, from attnbook.core.causal_mask."""
    blocks = [
        causal_mask(lq, lk) if is_causal else torch.ones(lq, lk, dtype=torch.bool)
        for lq, lk in zip(q_lens, k_lens)
    ]
    L, S = sum(q_lens), sum(k_lens)
    mask = torch.zeros(L, S, dtype=torch.bool)
    i = j = 0
    for block, lq, lk in zip(blocks, q_lens, k_lens):
        mask[i : i + lq, j : j + lk] = block
        i, j = i + lq, j + lk
    return mask


# ---------------------------------------------------------------------------------------------
# 1. Causal, bottom-right aligned
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("L, S", [(29, 29), (19, 41), (41, 19)])
def test_causal(L, S, gen):
    q, k, v = qkv(2, 3, L, S, gen=gen)
    expected = dense_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(
        expected, dense_attention(q, k, v, attn_mask=causal_mask(L, S)), **TIGHT
    )
    both_ways(q, k, v, expected, mask_mod=causal_mask_mod(L, S))


# ---------------------------------------------------------------------------------------------
# 2-3. Sliding and dilated windows; FlashAttention-2's window_size
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "window, dilation, causal",
    [(0, 1, False), (4, 1, False), (4, 1, True), (3, 3, False), (2, 2, True)],
)
def test_sliding_window(window, dilation, causal, gen):
    n = 45
    q, k, v = qkv(1, 3, n, n, gen=gen)
    mask = sliding_window_mask(n, window, is_causal=causal, dilation=dilation)
    expected = dense_attention(q, k, v, attn_mask=mask)
    mod = sliding_window_mask_mod(window, is_causal=causal, dilation=dilation)
    both_ways(q, k, v, expected, mask_mod=mod)


def test_sliding_window_matches_the_sparse_attention(gen):
    from attnbook.sparse import sliding_window_attention

    q, k, v = qkv(2, 2, 50, 50, gen=gen)
    for causal in (False, True):
        expected = sliding_window_attention(q, k, v, 6, is_causal=causal)
        mod = sliding_window_mask_mod(6, is_causal=causal)
        torch.testing.assert_close(
            flex_reference(q, k, v, mask_mod=mod), expected, **TIGHT
        )


@pytest.mark.parametrize("L, S", [(23, 23), (17, 40), (40, 17)])
@pytest.mark.parametrize(
    "left, right", [(3, 3), (5, 0), (-1, 0), (2, -1), (-1, -1), (0, 4)]
)
def test_window_size(L, S, left, right, gen):
    q, k, v = qkv(1, 2, L, S, gen=gen)
    expected = dense_attention(q, k, v, attn_mask=loop_window_mask(L, S, left, right))
    mod = window_size_mask_mod((left, right), L, S)
    torch.testing.assert_close(flex_reference(q, k, v, mask_mod=mod), expected, **TIGHT)
    if (left, right) == (-1, 0):  # the causal mask
        torch.testing.assert_close(
            expected, dense_attention(q, k, v, is_causal=True), **TIGHT
        )
    if left == right >= 0:  # the symmetric sliding window, aligned bottom-right
        sym = sliding_window_mask_mod(left, L=L, S=S)
        torch.testing.assert_close(
            flex_reference(q, k, v, mask_mod=sym), expected, **TIGHT
        )


def test_window_size_through_flex_attention(gen):
    L, S = 40, 64
    q, k, v = qkv(1, 2, L, S, gen=gen)
    expected = dense_attention(q, k, v, attn_mask=loop_window_mask(L, S, 7, 2))
    both_ways(q, k, v, expected, mask_mod=window_size_mask_mod((7, 2), L, S))


# ---------------------------------------------------------------------------------------------
# 4. Global tokens and Longformer
# ---------------------------------------------------------------------------------------------
def test_global_tokens(gen):
    n, idx = 47, [0, 13, 46]
    q, k, v = qkv(2, 3, n, n, gen=gen)
    expected = dense_attention(q, k, v, attn_mask=global_mask(n, idx))
    both_ways(q, k, v, expected, mask_mod=global_mask_mod(n, idx))


@pytest.mark.parametrize("dilation", [1, 2])
def test_longformer(dilation, gen):
    n, idx = 52, torch.tensor([3, 30])
    q, k, v = qkv(1, 4, n, n, gen=gen)
    expected = dense_attention(q, k, v, attn_mask=longformer_mask(n, 4, idx, dilation))
    both_ways(q, k, v, expected, mask_mod=longformer_mask_mod(n, 4, idx, dilation))


# ---------------------------------------------------------------------------------------------
# 5. BigBird's block-sparse pattern
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("L, S, block", [(64, 64, 8), (61, 45, 8), (50, 70, 16)])
def test_bigbird_block_mask_mod(L, S, block, gen):
    n_q, n_k = -(-L // block), -(-S // block)
    blocks = bigbird_block_mask(max(n_q, n_k), 1, 3, 1, generator=gen)[:n_q, :n_k]
    q, k, v = qkv(2, 3, L, S, gen=gen)
    token_mask = expand_block_mask(blocks, block)[:L, :S]
    expected = dense_attention(q, k, v, attn_mask=token_mask)
    torch.testing.assert_close(
        block_sparse_attention(q, k, v, blocks, block), expected, **TIGHT
    )
    mod = block_mask_mod(blocks, block)
    torch.testing.assert_close(flex_reference(q, k, v, mask_mod=mod), expected, **TIGHT)
    # FlexAttention's BlockMask with attnbook's tiles: the same active blocks
    flex_blocks = flex_block_mask(blocks, block, L, S)
    assert flex_blocks.BLOCK_SIZE == (block, block)
    assert torch.equal(flex_blocks.to_dense()[0, 0].bool(), blocks)
    torch.testing.assert_close(
        eager_flex(q, k, v, block_mask=flex_blocks), expected, **TIGHT
    )


def test_bigbird_block_mask_causal(gen):
    L, S, block = 45, 61, 8
    blocks = bigbird_block_mask(8, 1, 3, 2, generator=gen)[: -(-L // block)]
    q, k, v = qkv(1, 2, L, S, gen=gen)
    expected = block_sparse_attention(q, k, v, blocks, block, is_causal=True)
    both = expand_block_mask(blocks, block)[:L, :S] & causal_mask(L, S)
    torch.testing.assert_close(
        expected, dense_attention(q, k, v, attn_mask=both), **TIGHT
    )
    bm = flex_block_mask(blocks, block, L, S, mask_mod=causal_mask_mod(L, S))
    torch.testing.assert_close(eager_flex(q, k, v, block_mask=bm), expected, **TIGHT)


# ---------------------------------------------------------------------------------------------
# 6. ALiBi
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("H, L, S", [(4, 33, 33), (6, 21, 40), (3, 40, 21)])
def test_alibi(H, L, S, gen):
    q, k, v = qkv(2, H, L, S, gen=gen)
    mod = alibi_score_mod(H, L, S)
    tol = dict(atol=1e-6, rtol=1e-6)  # attnbook's bias is float32
    expected = dense_attention(q, k, v, attn_mask=alibi_bias(H, L, S, is_causal=False))
    both_ways(q, k, v, expected, score_mod=mod, tol=tol)
    # the causal form: the same bias plus the causal mask (rows with no key: zeros)
    expected = dense_attention(q, k, v, attn_mask=alibi_bias(H, L, S, is_causal=True))
    both_ways(q, k, v, expected, mask_mod=causal_mask_mod(L, S), score_mod=mod, tol=tol)


# ---------------------------------------------------------------------------------------------
# 7. T5's bucketed relative bias
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("L, S", [(30, 30), (12, 70), (70, 12)])
def test_t5_bias(bidirectional, L, S, gen):
    H = 3
    module = T5RelativeBias(
        H, num_buckets=16, max_distance=24, bidirectional=bidirectional
    )
    with torch.no_grad():
        module.bias.weight.copy_(torch.randn(16, H, generator=gen))
    q, k, v = qkv(1, H, L, S, gen=gen)
    bias = module(L, S).detach()
    expected = dense_attention(q, k, v, attn_mask=bias, scale=1.0)
    mod = t5_score_mod(module, L, S)
    with torch.no_grad():
        both_ways(
            q, k, v, expected, score_mod=mod, scale=1.0, tol=dict(atol=1e-6, rtol=1e-6)
        )


def test_t5_score_mod_reads_the_live_table_and_carries_gradients(gen):
    H, L = 2, 20
    module = T5RelativeBias(H, num_buckets=8, max_distance=16)
    q, k, v = qkv(1, H, L, L, gen=gen, dtype=torch.float32)
    mod = t5_score_mod(module, L)
    with torch.no_grad():
        module.bias.weight.copy_(
            torch.randn(8, H, generator=gen)
        )  # after building the mod
    out = flex_reference(q, k, v, score_mod=mod, scale=1.0)
    expected = dense_attention(q, k, v, attn_mask=module(L, L), scale=1.0)
    torch.testing.assert_close(out, expected, **LOOSE)
    out.sum().backward()
    expected.sum().backward()  # the same gradient again, accumulated: twice the first
    grad = module.bias.weight.grad.clone()
    module.bias.weight.grad = None
    dense_attention(q, k, v, attn_mask=module(L, L), scale=1.0).sum().backward()
    torch.testing.assert_close(grad, 2 * module.bias.weight.grad, **LOOSE)


# ---------------------------------------------------------------------------------------------
# 8. Documents of packed sequences
# ---------------------------------------------------------------------------------------------
def test_document_ids():
    cu = torch.tensor([0, 3, 3, 7, 12], dtype=torch.int32)
    ids = document_ids(cu)
    expected = [d for d in range(4) for _ in range(int(cu[d + 1] - cu[d]))]
    assert ids.tolist() == expected and ids.dtype == torch.int32


def per_document(q, k, v, q_lens, k_lens, is_causal):
    """Varlen attention: attnbook attention on each document alone, concatenated."""
    outs, i, j = [], 0, 0
    for lq, lk in zip(q_lens, k_lens):
        outs.append(
            dense_attention(
                q[..., i : i + lq, :],
                k[..., j : j + lk, :],
                v[..., j : j + lk, :],
                is_causal=is_causal,
            )
        )
        i, j = i + lq, j + lk
    return torch.cat(outs, dim=-2)


@pytest.mark.parametrize("is_causal", [False, True])
def test_document_mask_self_attention(is_causal, gen):
    lens = [5, 17, 1, 9]
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
    q, k, v = qkv(1, 3, sum(lens), sum(lens), gen=gen)
    expected = per_document(q, k, v, lens, lens, is_causal)
    mask = doc_block_mask(lens, lens, is_causal)
    torch.testing.assert_close(
        dense_attention(q, k, v, attn_mask=mask), expected, **TIGHT
    )
    both_ways(
        q, k, v, expected, mask_mod=document_mask(document_ids(cu), is_causal=is_causal)
    )


@pytest.mark.parametrize("is_causal", [False, True])
def test_document_mask_varlen_queries_and_keys(is_causal, gen):
    # decoding-style packs: each document has fewer queries than keys, and one more
    q_lens, k_lens = [2, 7, 1, 6], [9, 7, 4, 3]
    cu_q = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools.accumulate(k_lens)], dtype=torch.int32)
    q, k, v = qkv(1, 2, sum(q_lens), sum(k_lens), gen=gen)
    expected = per_document(q, k, v, q_lens, k_lens, is_causal)
    mod = document_mask(
        document_ids(cu_q), kv_doc_ids=document_ids(cu_k), is_causal=is_causal
    )
    both_ways(q, k, v, expected, mask_mod=mod)


# ---------------------------------------------------------------------------------------------
# 9. Softcapping
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cap", [0.5, 5.0])
def test_softcap(cap, gen):
    L, S = 26, 39
    q, k, v = qkv(2, 3, L, S, gen=gen)
    q = q * 4  # large logits, so the cap bites
    scores = scaled_dot_score(q, k)
    capped = cap * torch.tanh(scores / cap)
    expected = masked_softmax(capped, causal_mask(L, S)) @ v
    both_ways(
        q,
        k,
        v,
        expected,
        mask_mod=causal_mask_mod(L, S),
        score_mod=softcap_score_mod(cap),
    )


# ---------------------------------------------------------------------------------------------
# Composition
# ---------------------------------------------------------------------------------------------
def test_and_or_masks_compose_like_bool_masks(gen):
    lens, n = [20, 11, 25], 56
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
    q, k, v = qkv(1, 2, n, n, gen=gen)
    docs = document_mask(document_ids(cu), is_causal=True)
    local = or_masks(sliding_window_mask_mod(3), global_mask_mod(n, [0, 31]))
    mask = doc_block_mask(lens, lens, True) & (
        sliding_window_mask(n, 3) | global_mask(n, [0, 31])
    )
    expected = dense_attention(q, k, v, attn_mask=mask)
    both_ways(q, k, v, expected, mask_mod=and_masks(docs, local))


def test_chain_score_mods_applies_in_order(gen):
    H, L, S, cap = 4, 18, 30, 1.5
    q, k, v = qkv(1, H, L, S, gen=gen)
    bias = alibi_bias(H, L, S, is_causal=False).double()
    scores = scaled_dot_score(q, k)
    biased_then_capped = masked_softmax(cap * torch.tanh((scores + bias) / cap)) @ v
    capped_then_biased = masked_softmax(cap * torch.tanh(scores / cap) + bias) @ v
    alibi, softcap = alibi_score_mod(H, L, S), softcap_score_mod(cap)
    tol = dict(atol=1e-6, rtol=1e-6)
    both_ways(
        q,
        k,
        v,
        biased_then_capped,
        score_mod=chain_score_mods(alibi, None, softcap),
        tol=tol,
    )
    both_ways(
        q, k, v, capped_then_biased, score_mod=chain_score_mods(softcap, alibi), tol=tol
    )
    assert not torch.allclose(biased_then_capped, capped_then_biased)


# ---------------------------------------------------------------------------------------------
# flex_reference itself: plain attention, grouped heads, rows with nothing to attend to
# ---------------------------------------------------------------------------------------------
def test_flex_reference_takes_the_contracts_other_ranks(gen):
    q, k, v = (torch.randn(2, 3, 2, 5, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    mod = causal_mask_mod(5, 5)
    flat = flex_reference(*(t.reshape(6, 2, 5, 4) for t in (q, k, v)), mask_mod=mod)
    torch.testing.assert_close(flex_reference(q, k, v, mask_mod=mod), flat.reshape(2, 3, 2, 5, 4), **TIGHT)
    one_head = flex_reference(q[0, 0, 0], k[0, 0, 0], v[0, 0, 0], mask_mod=mod)
    torch.testing.assert_close(one_head, flat[0, 0], **TIGHT)


def test_flex_reference_without_mods_is_attention(gen):
    q, k, v = qkv(2, 4, 15, 22, gen=gen, Hk=2)
    expected = dense_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(flex_reference(q, k, v), expected, **TIGHT)
    torch.testing.assert_close(
        flex_reference(q, k, v, scale=0.3),
        dense_attention(q, k, v, scale=0.3, enable_gqa=True),
        **TIGHT,
    )
    torch.testing.assert_close(
        flex_attention(q, k, v, enable_gqa=True), expected, **TIGHT
    )


def test_fully_masked_rows_give_zeros(gen):
    L, S = 24, 10  # causal with L > S: the first 14 queries see no key
    q, k, v = qkv(1, 2, L, S, gen=gen)
    mod = causal_mask_mod(L, S)
    expected = dense_attention(q, k, v, is_causal=True)
    assert torch.equal(
        expected[..., : L - S, :], torch.zeros_like(expected[..., : L - S, :])
    )
    dense = flex_reference(q, k, v, mask_mod=mod)
    flex = eager_flex(q, k, v, mask_mod=mod)
    for out in (dense, flex):
        assert not out.isnan().any()
        torch.testing.assert_close(out, expected, **TIGHT)

    # rows killed by the score_mod (-inf) instead of the mask: zeros too
    def kill_first_rows(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx < 5, -math.inf, score)

    dense = flex_reference(q, k, v, score_mod=kill_first_rows)
    flex = flex_attention(q, k, v, score_mod=kill_first_rows)
    plain = dense_attention(q, k, v)
    for out in (dense, flex):
        assert torch.equal(out[..., :5, :], torch.zeros_like(out[..., :5, :]))
        torch.testing.assert_close(out[..., 5:, :], plain[..., 5:, :], **TIGHT)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flex_reference_half_inputs_with_float32_buffers(dtype, gen):
    """Found by tests/properties/test_differential.py: a half q with ALiBi's float32 slopes (or a float32 T5 table) in the
    score_mod raised "expected scalar type Float but found Half". Like eager flex_attention, the scores and
    mods run in float32 and the weights are rounded to q's dtype."""
    q, k, v = qkv(2, 2, 5, 7, gen=gen, dtype=dtype)
    t5 = T5RelativeBias(2, 8, 16)
    for score_mod in (alibi_score_mod(2, 5, 7), t5_score_mod(t5, 5, 7)):
        with torch.no_grad():
            got = flex_reference(q, k, v, mask_mod=causal_mask_mod(5, 7), score_mod=score_mod)
            want = eager_flex(q, k, v, mask_mod=causal_mask_mod(5, 7), score_mod=score_mod)
        assert got.dtype == dtype
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def test_flex_reference_broadcasts_one_query_head_and_mixed_ranks(gen):
    """Found by tests/properties/test_differential.py: with q (B, 1, L, E) and k (B, 2, S, E) the head index ran over one
    head (a score_mod's result did not expand), and with a 4-D q and a 3-D k the key length was read from
    k's last dimension. The contract broadcasts both."""
    q, k, v = qkv(2, 1, 4, 6, gen=gen, Hk=2)
    mod = alibi_score_mod(2, 4, 6)
    expected = flex_reference(q.expand(2, 2, 4, 8), k, v, score_mod=mod)
    torch.testing.assert_close(flex_reference(q, k, v, score_mod=mod), expected, **TIGHT)
    q, k, v = qkv(2, 2, 4, 6, gen=gen)
    torch.testing.assert_close(flex_reference(q, k[0], v[0], mask_mod=causal_mask_mod(4, 6)),
                               dense_attention(q, k[0], v[0], is_causal=True), **TIGHT)


def test_global_mask_mod_takes_an_empty_list(gen):
    """An empty Python list of global tokens was refused as float32 (sparse.global_mask takes it)."""
    q, k, v = qkv(1, 1, 4, 4, gen=gen)
    out = flex_reference(q, k, v, mask_mod=global_mask_mod(4, []))
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(global_mask_mod(4, [])(0, 0, torch.arange(4)[:, None], torch.arange(4)), global_mask(4, []))


# ---------------------------------------------------------------------------------------------
# Compiled FlexAttention: two representative cases, one compiled function, fixed shapes
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compiled_flex():
    return torch.compile(flex_attention, dynamic=False)


def test_compiled_mask_combination(compiled_flex):
    gen = torch.Generator().manual_seed(1)
    lens, n = [70, 100, 86], 256
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32)
    q, k, v = qkv(1, 2, n, n, E=16, gen=gen)
    mod = and_masks(
        document_mask(document_ids(cu), is_causal=True),
        or_masks(sliding_window_mask_mod(16), global_mask_mod(n, [0, 100])),
    )
    mask = doc_block_mask(lens, lens, True) & (
        sliding_window_mask(n, 16) | global_mask(n, [0, 100])
    )
    expected = dense_attention(q, k, v, attn_mask=mask)
    block_mask = create_block_mask(mod, None, None, n, n, device="cpu", BLOCK_SIZE=32)
    assert block_mask.sparsity() > 0  # tiles are skipped
    q32, k32, v32 = (t.float() for t in (q, k, v))
    out = compiled_flex(q32, k32, v32, block_mask=block_mask)
    torch.testing.assert_close(out, expected.float(), **LOOSE)


def test_compiled_score_mods_over_bigbird_blocks(compiled_flex):
    gen = torch.Generator().manual_seed(2)
    H, L, S, block, cap = 4, 256, 200, 32, 2.0  # causal, L > S: 56 rows see no key
    blocks = bigbird_block_mask(8, 1, 3, 1, generator=gen)[:, : -(-S // block)]
    module = T5RelativeBias(H, num_buckets=16, max_distance=64)
    with torch.no_grad():
        module.bias.weight.copy_(torch.randn(16, H, generator=gen))
    q, k, v = qkv(1, H, L, S, E=16, gen=gen)
    bias = (
        module(L, S).detach().double() + alibi_bias(H, L, S, is_causal=False).double()
    )
    mask = expand_block_mask(blocks, block)[:L, :S] & causal_mask(L, S)
    scores = scaled_dot_score(q, k) + bias
    expected = masked_softmax(cap * torch.tanh(scores / cap), mask) @ v
    assert torch.equal(expected[..., : L - S, :], torch.zeros(1, H, L - S, 18).double())
    score_mod = chain_score_mods(
        t5_score_mod(module, L, S), alibi_score_mod(H, L, S), softcap_score_mod(cap)
    )
    block_mask = flex_block_mask(blocks, block, L, S, mask_mod=causal_mask_mod(L, S))
    q32, k32, v32 = (t.float() for t in (q, k, v))
    with torch.no_grad():
        out = compiled_flex(q32, k32, v32, score_mod=score_mod, block_mask=block_mask)
        dense = flex_reference(
            q, k, v, score_mod=score_mod, mask_mod=block_mask.mask_mod
        )
    assert not out.isnan().any()  # compiled FlexAttention: zeros for the dead rows too
    torch.testing.assert_close(out, expected.float(), **LOOSE)
    torch.testing.assert_close(dense, expected, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Bad input: ValueError / TypeError naming the function and the argument
# ---------------------------------------------------------------------------------------------
BAD = [
    (lambda: causal_mask_mod(-1, 4), ValueError, "causal_mask_mod: L"),
    (lambda: causal_mask_mod(4.0, 4), TypeError, "causal_mask_mod: L"),
    (
        lambda: sliding_window_mask_mod(-1),
        ValueError,
        "sliding_window_mask_mod: window",
    ),
    (
        lambda: sliding_window_mask_mod(2, dilation=0),
        ValueError,
        "sliding_window_mask_mod: dilation",
    ),
    (
        lambda: sliding_window_mask_mod(2, L=4),
        ValueError,
        "sliding_window_mask_mod: give both L and S",
    ),
    (
        lambda: window_size_mask_mod((-2, 3), 8, 8),
        ValueError,
        "window_size_mask_mod: window_size",
    ),
    (
        lambda: window_size_mask_mod((1.5, 3), 8, 8),
        TypeError,
        "window_size_mask_mod: window_size",
    ),
    (
        lambda: window_size_mask_mod(3, 8, 8),
        TypeError,
        "window_size_mask_mod: window_size",
    ),
    (
        lambda: global_mask_mod(8, [0, 8]),
        ValueError,
        r"global_mask_mod: global_idx .*\[0, 8\]",
    ),
    (lambda: global_mask_mod(8, [0.5]), TypeError, "global_mask_mod: global_idx"),
    (
        lambda: block_mask_mod(torch.ones(2, 2), 4),
        TypeError,
        "block_mask_mod: block_mask",
    ),
    (
        lambda: block_mask_mod(torch.ones(2, dtype=torch.bool), 4),
        ValueError,
        r"block_mask_mod: block_mask .*\(2,\)",
    ),
    (
        lambda: block_mask_mod(torch.ones(2, 2, dtype=torch.bool), 0),
        ValueError,
        "block_mask_mod: block_size",
    ),
    (
        lambda: flex_block_mask(torch.ones(2, 3, dtype=torch.bool), 4, 12, 12),
        ValueError,
        r"flex_block_mask: block_mask of shape \(2, 3\).*\(3, 3\)",
    ),
    (
        lambda: document_ids(torch.tensor([1, 3, 5])),
        ValueError,
        "document_ids: cu_seqlens must start at 0",
    ),
    (
        lambda: document_ids(torch.tensor([0, 4, 3])),
        ValueError,
        r"document_ids: cu_seqlens .*non-decreasing.*\(3,\)",
    ),
    (
        lambda: document_ids(torch.tensor([0.0, 3.0])),
        TypeError,
        "document_ids: cu_seqlens",
    ),
    (
        lambda: document_ids(torch.zeros(2, 2, dtype=torch.int32)),
        ValueError,
        r"document_ids: cu_seqlens .*\(2, 2\)",
    ),
    (
        lambda: document_mask(torch.tensor([0, 1, 0])),
        ValueError,
        r"document_mask: doc_ids must be sorted.*\(3,\)",
    ),
    (
        lambda: document_mask(torch.tensor([0, 1]), kv_doc_ids=torch.ones(2)),
        TypeError,
        "document_mask: kv_doc_ids",
    ),
    (lambda: alibi_score_mod(0, 4), ValueError, "alibi_score_mod: n_heads"),
    (
        lambda: t5_score_mod(torch.nn.Embedding(4, 2), 4),
        TypeError,
        "t5_score_mod: module",
    ),
    (lambda: softcap_score_mod(0.0), ValueError, "softcap_score_mod: softcap"),
    (lambda: softcap_score_mod("30"), TypeError, "softcap_score_mod: softcap"),
    (
        lambda: chain_score_mods(softcap_score_mod(1.0), 3),
        TypeError,
        "chain_score_mods",
    ),
    (
        lambda: flex_reference(torch.ones(8), torch.ones(4, 8), torch.ones(4, 8)),
        ValueError,
        r"flex_reference: q must have at least 2 dimensions",
    ),
    (
        lambda: flex_reference(
            torch.ones(1, 1, 4, 8), torch.ones(1, 1, 5, 6), torch.ones(1, 1, 5, 6)
        ),
        ValueError,
        r"flex_reference: q and k .*\(1, 1, 4, 8\)",
    ),
    (
        lambda: flex_reference(*[torch.ones(1, 1, 4, 8)] * 3, mask_mod=3),
        TypeError,
        "flex_reference: mask_mod",
    ),
    (
        lambda: flex_reference(*[torch.ones(1, 1, 4, 8, dtype=torch.long)] * 3),
        TypeError,
        "flex_reference: q",
    ),
]


@pytest.mark.parametrize(
    "call, error, match",
    BAD,
    ids=[m.split(":")[0] + f"-{i}" for i, (_, _, m) in enumerate(BAD)],
)
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_public_names_are_documented():
    import attnbook.flex as flex

    assert flex.__doc__ and "Dong et al., 2024" in flex.__doc__
    for name in flex.__all__:
        obj = getattr(flex, name)
        assert callable(obj) and obj.__doc__ and obj.__module__ == "attnbook.flex", name
