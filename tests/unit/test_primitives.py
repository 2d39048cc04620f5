"""attnbook.primitives: the online softmax and the log-sum-exp merge, against plain softmax
attention over the union of the key sets (hypothesis draws ragged splits, empty sides and
fully masked rows). The deeper tests of the same functions stay in tests/unit/test_flash.py, through
their re-export ``attnbook.flash``."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnbook import flash, primitives
from attnbook.primitives import merge_partials, online_softmax, online_softmax_step


def _attend(q, k, v):
    """Softmax attention and the log-sum-exp of each row, in float64; no key: zeros, -inf."""
    scores = q @ k.transpose(-2, -1)
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    return weights @ v, lse


@given(L=st.integers(1, 5), S=st.integers(0, 9), split=st.integers(0, 9), seed=st.integers(0, 99),
       inplace=st.booleans())
def test_merge_partials_is_attention_over_the_union(L, S, split, seed, inplace):
    split = min(split, S)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, n, 3, generator=gen, dtype=torch.float64) for n in (L, S, S))
    out_a, lse_a = _attend(q, k[:, :split], v[:, :split])
    out_b, lse_b = _attend(q, k[:, split:], v[:, split:])
    out, lse = merge_partials(out_a, lse_a, out_b, lse_b, inplace=inplace)
    want, want_lse = _attend(q, k, v)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(lse, want_lse)
    if inplace:
        assert out is out_a and lse is lse_a


@given(n=st.integers(0, 12), block=st.integers(1, 5), seed=st.integers(0, 99))
def test_online_softmax_step_by_step_is_softmax_attention(n, block, seed):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(3, n, generator=gen, dtype=torch.float64)
    values = torch.randn(n, 2, generator=gen, dtype=torch.float64)
    m = torch.full((3,), -math.inf, dtype=torch.float64)
    l, acc = torch.zeros(3, dtype=torch.float64), torch.zeros(3, 2, dtype=torch.float64)
    for j in range(0, n, block):
        m, l, acc = online_softmax_step(m, l, scores[:, j : j + block], acc, values[j : j + block])
    want = torch.softmax(scores, -1) @ values if n else torch.zeros(3, 2, dtype=torch.float64)
    torch.testing.assert_close(acc / torch.where(l > 0, l, 1.0)[:, None], want)
    torch.testing.assert_close(online_softmax(scores, block), torch.softmax(scores, -1))


def test_flash_reexports_the_same_functions():
    for name in primitives.__all__:
        assert getattr(flash, name) is getattr(primitives, name), name
        assert name in flash.__all__


@pytest.mark.parametrize("call, error, words", [
    (lambda: merge_partials(torch.zeros(2, 3), torch.zeros(2), torch.zeros(2, 4), torch.zeros(2)), ValueError,
     "merge_partials: out_a and out_b"),
    (lambda: merge_partials(torch.zeros(2, 3), torch.zeros(2), torch.zeros(2, 3), torch.zeros(2),
                            inplace="yes"), TypeError, "merge_partials: inplace"),
    (lambda: online_softmax(torch.zeros(3), 0), ValueError, "online_softmax: block_size"),
    (lambda: online_softmax_step(torch.zeros(2), torch.zeros(3), torch.zeros(2, 4)), ValueError,
     "online_softmax_step: m and l"),
])
def test_bad_input_names_the_argument(call, error, words):
    with pytest.raises(error, match=words):
        call()
