"""Tests of attnbook.core against PyTorch (F.scaled_dot_product_attention, nn.MultiheadAttention),
explicit loops over (i, j), hand-computed examples, and properties checked with Hypothesis."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from attnbook.core import (
    MultiHeadAttention,
    additive_score,
    attention_entropy,
    causal_mask,
    dot_score,
    general_score,
    hard_attention,
    hard_attention_weights,
    masked_softmax,
    padding_mask,
    scaled_dot_product_attention,
    scaled_dot_score,
)

sdpa = scaled_dot_product_attention
TIGHT = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float64: dict(atol=1e-12, rtol=1e-10)}
LOOSE = {torch.float16: dict(atol=1e-2, rtol=1e-2), torch.bfloat16: dict(atol=6e-2, rtol=6e-2)}


def randn(*shape, gen, dtype=torch.float32):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def random_bool_mask(shape, gen, p=0.6, keep_first=True):
    """Random bool mask; with keep_first every row may attend key 0, so torch gives no NaN."""
    mask = torch.rand(shape, generator=gen) < p
    if keep_first:
        mask[..., 0] = True
    return mask


# ---------------------------------------------------------------------------------------------
# scaled_dot_product_attention vs torch
# ---------------------------------------------------------------------------------------------
SHAPES = [  # q batch, k/v batch, L, S, E, Ev
    ((), (), 4, 6, 8, 8),
    ((3,), (3,), 5, 5, 4, 7),
    ((2, 3), (2, 3), 3, 7, 8, 5),
    ((2, 1), (1, 3), 4, 6, 8, 8),  # broadcasting batch dims
    ((2, 3), (3,), 6, 2, 4, 3),  # k/v batch of lower rank
    ((2,), (2,), 1, 5, 4, 4),  # a single query
    ((2,), (2,), 3, 1, 4, 4),  # a single key
    ((1,), (1,), 1, 1, 2, 3),
]


@pytest.mark.parametrize("qb, kb, L, S, E, Ev", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sdpa_matches_torch_shapes(qb, kb, L, S, E, Ev, dtype, gen):
    q = randn(*qb, L, E, gen=gen, dtype=dtype)
    k, v = randn(*kb, S, E, gen=gen, dtype=dtype), randn(*kb, S, Ev, gen=gen, dtype=dtype)
    out = sdpa(q, k, v)
    expected = F.scaled_dot_product_attention(q, k, v)
    assert out.shape == expected.shape == (*torch.broadcast_shapes(qb, kb), L, Ev)
    assert out.dtype == dtype
    torch.testing.assert_close(out, expected, **TIGHT[dtype])


@pytest.mark.parametrize("mask_shape", [(4, 6), (2, 1, 4, 6), (2, 1, 1, 6), (6,), (2, 3, 4, 6)])
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sdpa_matches_torch_masks(mask_shape, kind, dtype, gen):
    q = randn(2, 3, 4, 8, gen=gen, dtype=dtype)
    k, v = randn(2, 3, 6, 8, gen=gen, dtype=dtype), randn(2, 3, 6, 5, gen=gen, dtype=dtype)
    if kind == "bool":
        mask = random_bool_mask(mask_shape, gen)
    else:  # additive: finite biases plus some -inf entries (never in column 0)
        mask = randn(*mask_shape, gen=gen, dtype=dtype).masked_fill(~random_bool_mask(mask_shape, gen), float("-inf"))
    ref_mask = mask if mask.dim() > 1 else mask[None]  # torch wants at least (L, S); ours broadcasts (S,) too
    torch.testing.assert_close(sdpa(q, k, v, mask), F.scaled_dot_product_attention(q, k, v, ref_mask), **TIGHT[dtype])


@pytest.mark.parametrize("scale", [0.1, 1.0, 2.5])
def test_sdpa_scale_matches_torch(scale, gen):
    q, k, v = randn(2, 5, 4, gen=gen), randn(2, 7, 4, gen=gen), randn(2, 7, 3, gen=gen)
    mask = random_bool_mask((5, 7), gen)
    out = sdpa(q, k, v, mask, scale=scale)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, mask, scale=scale), **TIGHT[torch.float32])


def test_sdpa_default_scale_is_inverse_sqrt_head_dim(gen):
    q, k, v = randn(3, 16, gen=gen), randn(5, 16, gen=gen), randn(5, 2, gen=gen)
    torch.testing.assert_close(sdpa(q, k, v), sdpa(q, k, v, scale=1 / 4.0))
    assert not torch.allclose(sdpa(q, k, v), sdpa(q, k, v, scale=1.0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", [None, "bool", "float"])
def test_sdpa_low_precision_on_cpu(dtype, kind, gen):
    q = randn(2, 2, 5, 8, gen=gen, dtype=dtype)
    k, v = randn(2, 2, 6, 8, gen=gen, dtype=dtype), randn(2, 2, 6, 4, gen=gen, dtype=dtype)
    mask = None
    if kind == "bool":
        mask = random_bool_mask((2, 1, 5, 6), gen)
    elif kind == "float":
        mask = randn(5, 6, gen=gen, dtype=dtype)
    out = sdpa(q, k, v, mask)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()
    # reference: the same (rounded) inputs attended in float64 by torch
    up = lambda t: None if t is None else (t if t.dtype == torch.bool else t.double())  # noqa: E731
    expected = F.scaled_dot_product_attention(up(q), up(k), up(v), up(mask))
    torch.testing.assert_close(out.double(), expected, **LOOSE[dtype])
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, mask), **LOOSE[dtype])


def test_sdpa_float_mask_of_other_dtype_is_cast(gen):
    q, k, v = randn(4, 8, gen=gen), randn(6, 8, gen=gen), randn(6, 3, gen=gen)
    mask64 = randn(4, 6, gen=gen, dtype=torch.float64)
    out = sdpa(q, k, v, mask64)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, mask64.float()))


# ---------------------------------------------------------------------------------------------
# Causal attention: equal to torch when L == S, bottom-right aligned when L != S
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
@pytest.mark.parametrize("n", [1, 2, 7])
def test_causal_square_matches_torch(batch, n, gen):
    q, k, v = randn(*batch, n, 4, gen=gen), randn(*batch, n, 4, gen=gen), randn(*batch, n, 3, gen=gen)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(sdpa(q, k, v, is_causal=True), expected)


@pytest.mark.parametrize("L, S", [(1, 5), (3, 7), (4, 6), (2, 3)])
def test_causal_rectangular_is_bottom_right(L, S, gen):
    q, k, v = randn(2, L, 4, gen=gen), randn(2, S, 4, gen=gen), randn(2, S, 3, gen=gen)
    bottom_right = torch.ones(L, S).tril(diagonal=S - L).bool()
    out = sdpa(q, k, v, is_causal=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, bottom_right))
    # and it is NOT PyTorch's top-left aligned is_causal
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (out - top_left).abs().max() > 1e-3


def test_causal_more_queries_than_keys_gives_zero_rows(gen):
    L, S = 5, 3  # queries 0 and 1 come "before" every key: fully masked
    q, k, v = randn(2, L, 4, gen=gen), randn(2, S, 4, gen=gen), randn(2, S, 3, gen=gen)
    out, w = sdpa(q, k, v, is_causal=True, return_weights=True)
    assert torch.isfinite(out).all()
    assert (out[:, : L - S] == 0).all() and (w[:, : L - S] == 0).all()
    bottom_right = torch.ones(L, S).tril(diagonal=S - L).bool()
    torch.testing.assert_close(out[:, L - S :], F.scaled_dot_product_attention(q, k, v, bottom_right)[:, L - S :])


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_causal_combines_with_mask(kind, gen):
    L, S = 4, 6
    q, k, v = randn(2, 1, L, 4, gen=gen), randn(2, 1, S, 4, gen=gen), randn(2, 1, S, 3, gen=gen)
    keep = random_bool_mask((2, 1, 1, S), gen)
    keep[..., 0] = True
    mask = keep if kind == "bool" else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    both = keep & torch.ones(L, S).tril(diagonal=S - L).bool()
    expected = F.scaled_dot_product_attention(q, k, v, both)
    torch.testing.assert_close(sdpa(q, k, v, mask, is_causal=True), expected)


# ---------------------------------------------------------------------------------------------
# Fully masked rows and gradients
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_fully_masked_rows_give_zeros_and_finite_grads(kind, gen):
    q, k, v = (randn(2, 3, 4, 5, gen=gen).requires_grad_() for _ in range(3))
    keep = random_bool_mask((2, 3, 4, 4), gen)
    keep[0, 1, 2] = False  # one dead row
    keep[1, :, 0] = False  # dead rows in every head of batch 1
    dead = ~keep.any(-1)
    mask = keep if kind == "bool" else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    out, w = sdpa(q, k, v, mask, return_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert (out[dead] == 0).all() and (w[dead] == 0).all()
    # the living rows agree with torch
    expected = F.scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out[~dead], expected[~dead])
    (out.sum() + w.sum()).backward()
    for t in (q, k, v):
        assert t.grad is not None and torch.isfinite(t.grad).all()
    assert (q.grad[dead] == 0).all()  # a dead query influences nothing


def test_gradients_match_torch(gen):
    q = randn(2, 4, 3, gen=gen, dtype=torch.float64).requires_grad_()
    k = randn(2, 5, 3, gen=gen, dtype=torch.float64).requires_grad_()
    v = randn(2, 5, 2, gen=gen, dtype=torch.float64).requires_grad_()
    mask = random_bool_mask((4, 5), gen)
    g = randn(2, 4, 2, gen=gen, dtype=torch.float64)
    ours = torch.autograd.grad((sdpa(q, k, v, mask) * g).sum(), (q, k, v))
    ref = torch.autograd.grad((F.scaled_dot_product_attention(q, k, v, mask) * g).sum(), (q, k, v))
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b)


# ---------------------------------------------------------------------------------------------
# return_weights and dropout
# ---------------------------------------------------------------------------------------------
def test_return_weights_rows_sum_to_one_and_reproduce_output(gen):
    q, k, v = randn(2, 3, 4, 8, gen=gen), randn(2, 3, 6, 8, gen=gen), randn(2, 3, 6, 5, gen=gen)
    keep = random_bool_mask((2, 1, 4, 6), gen, keep_first=False)
    keep[1, 0, 3] = False
    out, w = sdpa(q, k, v, keep, return_weights=True)
    assert w.shape == (2, 3, 4, 6)
    alive = keep.any(-1).expand(2, 3, 4)
    torch.testing.assert_close(w.sum(-1), alive.float())
    assert (w[~keep.expand_as(w)] == 0).all()
    torch.testing.assert_close(out, w @ v)
    torch.testing.assert_close(sdpa(q, k, v, keep), out)


def test_dropout_zero_is_identity(gen):
    q, k, v = randn(2, 4, 8, gen=gen), randn(2, 6, 8, gen=gen), randn(2, 6, 5, gen=gen)
    out = sdpa(q, k, v, dropout_p=0.0, generator=torch.Generator().manual_seed(1))
    assert torch.equal(out, sdpa(q, k, v))


def test_dropout_is_reproducible_with_seeded_generator(gen):
    q, k, v = randn(2, 4, 8, gen=gen), randn(2, 6, 8, gen=gen), randn(2, 6, 5, gen=gen)
    def run(seed):
        return sdpa(q, k, v, dropout_p=0.3, generator=torch.Generator().manual_seed(seed), return_weights=True)

    (a, wa), (b, wb), (c, _) = run(7), run(7), run(8)
    assert torch.equal(a, b) and torch.equal(wa, wb)
    assert not torch.equal(a, c)
    assert not torch.equal(a, sdpa(q, k, v))
    torch.testing.assert_close(a, wa @ v)


def test_dropout_preserves_expectation(gen):
    p, draws = 0.4, 4000
    q, k, v = randn(3, 8, gen=gen), randn(5, 8, gen=gen), randn(5, 2, gen=gen)
    _, w = sdpa(q, k, v, return_weights=True)
    qs, ks, vs = q.expand(draws, 3, 8), k.expand(draws, 5, 8), v.expand(draws, 5, 2)
    out, wd = sdpa(qs, ks, vs, dropout_p=p, return_weights=True, generator=torch.Generator().manual_seed(0))
    # each weight is either dropped or scaled by 1 / (1 - p) ...
    scaled = w.expand_as(wd) / (1 - p)
    assert torch.all((wd == 0) | torch.isclose(wd, scaled))
    kept = (wd != 0).float().mean()
    assert abs(kept - (1 - p)) < 0.01
    # ... so the mean over many draws is the undropped weights and output
    torch.testing.assert_close(wd.mean(0), w, atol=0.02, rtol=0)
    torch.testing.assert_close(out.mean(0), w @ v, atol=0.05, rtol=0)


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_dropout_invalid_p_raises(p, gen):
    q = randn(3, 4, gen=gen)
    with pytest.raises(ValueError, match="dropout_p"):
        sdpa(q, q, q, dropout_p=p)


# ---------------------------------------------------------------------------------------------
# Every documented ValueError names its argument
# ---------------------------------------------------------------------------------------------
def _t(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype)


SDPA_ERRORS = [
    (dict(q=_t(4), k=_t(3, 4), v=_t(3, 4)), r"q must have at least 2 dimensions"),
    (dict(q=_t(2, 4), k=_t(4), v=_t(3, 4)), r"k must have at least 2 dimensions"),
    (dict(q=_t(2, 4), k=_t(3, 4), v=_t(4)), r"v must have at least 2 dimensions"),
    (dict(q=_t(2, 4), k=_t(3, 5), v=_t(3, 4)), r"q and k must have the same last dimension"),
    (dict(q=_t(2, 4), k=_t(3, 4), v=_t(5, 4)), r"k and v must have the same sequence length"),
    (dict(q=_t(2, 4, dtype=torch.int64), k=_t(3, 4), v=_t(3, 4)), r"q must be a floating-point"),
    (dict(q=_t(2, 4), k=_t(3, 4, dtype=torch.bool), v=_t(3, 4)), r"k must be a floating-point"),
    (dict(q=[[0.0]], k=_t(3, 4), v=_t(3, 4)), r"q must be a torch.Tensor"),
    (dict(q=_t(2, 4), k=_t(3, 4, dtype=torch.float64), v=_t(3, 4)), r"q, k and v must share a dtype"),
    (dict(q=_t(2, 2, 4), k=_t(3, 3, 4), v=_t(3, 3, 4)), r"q's 2 heads are not a multiple of k's 3"),
    (dict(q=_t(2, 4), k=_t(3, 4), v=_t(3, 4), attn_mask=_t(2, 3, dtype=torch.int64)), r"attn_mask must be bool"),
    (dict(q=_t(2, 4), k=_t(3, 4), v=_t(3, 4), attn_mask=_t(3, 2, dtype=torch.bool)), r"attn_mask of shape \(3, 2\)"),
    (dict(q=_t(2, 4), k=_t(3, 4), v=_t(3, 4), attn_mask=_t(5, 2, 3)), r"attn_mask of shape \(5, 2, 3\)"),
    (dict(q=_t(2, 4), k=_t(3, 4), v=_t(3, 4), attn_mask=[[True]]), r"attn_mask must be a torch.Tensor"),
]


@pytest.mark.parametrize("kwargs, match", SDPA_ERRORS)
@pytest.mark.parametrize("fn", [scaled_dot_product_attention, hard_attention])
def test_sdpa_errors_name_the_argument(fn, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        fn(**kwargs)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: causal_mask(-1), "causal_mask: L must be an integer >= 0, got -1"),
        (lambda: causal_mask(2, -3), "causal_mask: S must be an integer >= 0, got -3"),
        (lambda: causal_mask(2.5), "causal_mask: L must be an integer"),
        (lambda: padding_mask([2.5, 3]), "padding_mask: lengths must hold integers"),
        (lambda: padding_mask([[1, 2]]), "lengths must be 1-D"),
        (lambda: padding_mask([2, -1]), "padding_mask: lengths must be >= 0"),
        (lambda: padding_mask([2, 5], max_len=4), "max_len=4"),
        (lambda: dot_score(_t(2, 3), _t(4, 5)), "q and k"),
        (lambda: general_score(_t(2, 3), _t(4, 5), _t(5, 3)), r"W must have shape \(Eq, Ek\) = \(3, 5\)"),
        (lambda: general_score(_t(2, 3), _t(4, 5), _t(15)), r"W must have shape"),
        (lambda: additive_score(_t(2, 3), _t(4, 5), _t(6, 4), _t(6, 5), _t(6)), r"W_q must have shape"),
        (lambda: additive_score(_t(2, 3), _t(4, 5), _t(3), _t(6, 5), _t(6)), r"W_q must have shape"),
        (lambda: additive_score(_t(2, 3), _t(4, 5), _t(6, 3), _t(7, 5), _t(6)), r"W_k must have shape"),
        (lambda: additive_score(_t(2, 3), _t(4, 5), _t(6, 3), _t(6, 3), _t(6)), r"W_k must have shape"),
        (lambda: additive_score(_t(2, 3), _t(4, 5), _t(6, 3), _t(6, 5), _t(5)), r"v must have shape"),
        (lambda: additive_score(_t(2, 3), _t(4, 5), _t(6, 3), _t(6, 5), _t(6, 1)), r"v must have shape"),
        (lambda: masked_softmax(_t(2, 3), temperature=0.0), "temperature"),
        (lambda: masked_softmax(_t(2, 3), temperature=-1.0), "temperature"),
        (lambda: masked_softmax(_t(2, 3), _t(3, 2, dtype=torch.bool)), "attn_mask"),
        (lambda: masked_softmax(_t(2, 3), _t(2, 3, dtype=torch.int32)), "attn_mask"),
        (lambda: hard_attention_weights(_t(2, 3), mode="softmax"), "mode"),
        (lambda: hard_attention_weights(_t(2, 3), attn_mask=_t(4, dtype=torch.bool)), "attn_mask"),
    ],
)
def test_helper_errors_name_the_argument(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(d_model=10, n_heads=4), "n_heads=4"),
        (dict(d_model=12, n_heads=4, n_kv_heads=3), "n_kv_heads=3"),
        (dict(d_model=12, n_heads=4, n_kv_heads=0), "MultiHeadAttention: n_kv_heads must be a positive integer, got 0"),
        (dict(d_model=12, n_heads=4, n_kv_heads=8), "n_kv_heads=8"),
    ],
)
def test_mha_constructor_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(**kwargs)


@pytest.mark.parametrize(
    "x, context, match",
    [
        (_t(5, 8), None, r"^MultiHeadAttention: x must have shape \(batch, seq, d_model=8\)"),
        (_t(2, 5, 6), None, r"^MultiHeadAttention: x must have shape"),
        (_t(2, 5, 8), _t(2, 3, 6), r"^MultiHeadAttention: context must have shape"),
        (_t(2, 5, 8), _t(3, 8), r"^MultiHeadAttention: context must have shape"),
        (_t(2, 5, 8), _t(3, 4, 8), r"same batch size"),
    ],
)
def test_mha_forward_errors(x, context, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(8, 2)(x, context)


def test_mha_mask_error_names_attn_mask():
    with pytest.raises(ValueError, match="attn_mask"):
        MultiHeadAttention(8, 2)(_t(2, 5, 8), attn_mask=_t(4, 4, dtype=torch.bool))


# ---------------------------------------------------------------------------------------------
# Hypothesis properties
# ---------------------------------------------------------------------------------------------
dims = st.tuples(
    st.integers(0, 2),  # batch rank
    st.integers(1, 6),  # L
    st.integers(1, 6),  # S
    st.integers(1, 5),  # E
    st.integers(1, 4),  # Ev
    st.integers(0, 2**31 - 1),  # seed
)


def _problem(rank, L, S, E, Ev, seed):
    g = torch.Generator().manual_seed(seed)
    batch = (2, 3)[:rank]
    q = randn(*batch, L, E, gen=g, dtype=torch.float64)
    k = randn(*batch, S, E, gen=g, dtype=torch.float64)
    v = randn(*batch, S, Ev, gen=g, dtype=torch.float64)
    mask = torch.rand(*batch, L, S, generator=g) < 0.7
    return g, q, k, v, mask


@given(dims)
def test_property_rows_sum_to_one_or_zero(d):
    g, q, k, v, mask = _problem(*d)
    _, w = sdpa(q, k, v, mask, return_weights=True)
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(-1), mask.any(-1).double())
    _, w = sdpa(q, k, v, return_weights=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1], dtype=torch.float64))


@given(dims)
def test_property_permuting_queries_permutes_outputs(d):
    g, q, k, v, mask = _problem(*d)
    perm = torch.randperm(q.shape[-2], generator=g)
    out = sdpa(q, k, v, mask)
    torch.testing.assert_close(sdpa(q[..., perm, :], k, v, mask[..., perm, :]), out[..., perm, :])


@given(dims)
def test_property_permuting_keys_and_values_changes_nothing(d):
    g, q, k, v, mask = _problem(*d)
    perm = torch.randperm(k.shape[-2], generator=g)
    out = sdpa(q, k, v, mask)
    torch.testing.assert_close(sdpa(q, k[..., perm, :], v[..., perm, :], mask[..., perm]), out)
    out = sdpa(q, k, v)
    torch.testing.assert_close(sdpa(q, k[..., perm, :], v[..., perm, :]), out)


@given(dims)
def test_property_masked_keys_have_no_influence(d):
    g, q, k, v, _ = _problem(*d)
    keep = torch.rand(k.shape[:-1], generator=g) < 0.6  # (..., S): key padding
    mask = keep.unsqueeze(-2)  # (..., 1, S), broadcast over queries
    out = sdpa(q, k, v, mask)
    k2 = torch.where(keep.unsqueeze(-1), k, 100 * torch.randn(k.shape, generator=g, dtype=k.dtype))
    v2 = torch.where(keep.unsqueeze(-1), v, 100 * torch.randn(v.shape, generator=g, dtype=v.dtype))
    torch.testing.assert_close(sdpa(q, k2, v2, mask), out)
    if not keep.all():
        assert not torch.equal(k2, k)


@given(dims, st.floats(0.1, 10.0))
def test_property_softmax_is_shift_invariant(d, temperature):
    g, q, k, _, mask = _problem(*d)
    scores = dot_score(q, k)
    shift = 50 * torch.randn(*scores.shape[:-1], 1, generator=g, dtype=scores.dtype)
    for m in (None, mask):
        torch.testing.assert_close(
            masked_softmax(scores + shift, m, temperature), masked_softmax(scores, m, temperature)
        )


@given(dims)
def test_property_bool_and_additive_masks_agree(d):
    _, q, k, v, mask = _problem(*d)
    additive = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float("-inf"))
    torch.testing.assert_close(sdpa(q, k, v, additive), sdpa(q, k, v, mask))


# ---------------------------------------------------------------------------------------------
# Scores against explicit loops
# ---------------------------------------------------------------------------------------------
def _loop_scores(q, k, e):
    """(L, E) x (S, E') -> (L, S), one entry at a time."""
    out = torch.empty(q.shape[0], k.shape[0], dtype=q.dtype)
    for i in range(q.shape[0]):
        for j in range(k.shape[0]):
            out[i, j] = e(q[i], k[j])
    return out


def test_dot_and_scaled_scores_match_loops(gen):
    q, k = randn(4, 3, gen=gen, dtype=torch.float64), randn(5, 3, gen=gen, dtype=torch.float64)
    dot = _loop_scores(q, k, lambda a, b: sum(a[t] * b[t] for t in range(3)))
    torch.testing.assert_close(dot_score(q, k), dot)
    torch.testing.assert_close(scaled_dot_score(q, k), dot / math.sqrt(3))
    torch.testing.assert_close(scaled_dot_score(q, k, scale=0.25), dot * 0.25)


def test_general_score_matches_loop(gen):
    q, k = randn(3, 2, gen=gen, dtype=torch.float64), randn(4, 5, gen=gen, dtype=torch.float64)
    W = randn(2, 5, gen=gen, dtype=torch.float64)
    expected = _loop_scores(q, k, lambda a, b: sum(a[r] * W[r, c] * b[c] for r in range(2) for c in range(5)))
    torch.testing.assert_close(general_score(q, k, W), expected)
    # with W = I the general score is the dot score
    q2 = randn(3, 5, gen=gen, dtype=torch.float64)
    torch.testing.assert_close(general_score(q2, k, torch.eye(5, dtype=torch.float64)), dot_score(q2, k))


def test_additive_score_matches_loop(gen):
    H = 6
    q, k = randn(3, 2, gen=gen, dtype=torch.float64), randn(4, 5, gen=gen, dtype=torch.float64)
    W_q, W_k = randn(H, 2, gen=gen, dtype=torch.float64), randn(H, 5, gen=gen, dtype=torch.float64)
    v = randn(H, gen=gen, dtype=torch.float64)

    def e(a, b):
        total = 0.0
        for h in range(H):
            pre = sum(W_q[h, r] * a[r] for r in range(2)) + sum(W_k[h, c] * b[c] for c in range(5))
            total += v[h] * math.tanh(pre)
        return total

    torch.testing.assert_close(additive_score(q, k, W_q, W_k, v), _loop_scores(q, k, e))


def test_additive_score_hand_computed():
    # H = 1, W_q picks q's first coordinate, W_k picks k's second, v = 2: e_ij = 2 tanh(q_i[0] + k_j[1])
    q = torch.tensor([[0.5, 9.0], [-1.0, 9.0]])
    k = torch.tensor([[9.0, 0.5], [9.0, 0.0], [-9.0, -0.5]])
    W_q, W_k, v = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]), torch.tensor([2.0])
    t = math.tanh
    expected = torch.tensor([
        [2 * t(1.0), 2 * t(0.5), 2 * t(0.0)],
        [2 * t(-0.5), 2 * t(-1.0), 2 * t(-1.5)],
    ])
    torch.testing.assert_close(additive_score(q, k, W_q, W_k, v), expected)


@pytest.mark.parametrize("batch", [(), (3,), (2, 3)])
def test_score_shapes(batch, gen):
    q, k = randn(*batch, 4, 3, gen=gen), randn(*batch, 6, 5, gen=gen)
    k3 = randn(*batch, 6, 3, gen=gen)
    assert dot_score(q, k3).shape == (*batch, 4, 6)
    assert scaled_dot_score(q, k3).shape == (*batch, 4, 6)
    assert general_score(q, k, randn(3, 5, gen=gen)).shape == (*batch, 4, 6)
    assert additive_score(q, k, randn(7, 3, gen=gen), randn(7, 5, gen=gen), randn(7, gen=gen)).shape == (*batch, 4, 6)


# ---------------------------------------------------------------------------------------------
# masked_softmax
# ---------------------------------------------------------------------------------------------
def test_masked_softmax_equals_softmax_without_mask(gen):
    s = randn(3, 4, 5, gen=gen)
    torch.testing.assert_close(masked_softmax(s), torch.softmax(s, -1))
    torch.testing.assert_close(masked_softmax(s, temperature=2.0), torch.softmax(s / 2.0, -1))


def test_masked_softmax_temperature_limits(gen):
    s = randn(4, 6, gen=gen, dtype=torch.float64)
    one_hot = F.one_hot(s.argmax(-1), 6).double()
    torch.testing.assert_close(masked_softmax(s, temperature=1e-3), one_hot, atol=1e-6, rtol=0)
    torch.testing.assert_close(masked_softmax(s, temperature=1e4), torch.full_like(s, 1 / 6), atol=1e-3, rtol=0)
    # the largest weight falls monotonically as the temperature rises
    peaks = [masked_softmax(s, temperature=t).max(-1).values for t in (0.1, 0.5, 1.0, 2.0, 10.0)]
    for hot, cool in zip(peaks, peaks[1:]):
        assert (cool < hot).all()


def test_masked_softmax_temperature_limits_with_mask(gen):
    s = randn(4, 6, gen=gen, dtype=torch.float64)
    keep = random_bool_mask((4, 6), gen, p=0.5)
    masked_scores = s.masked_fill(~keep, float("-inf"))
    one_hot = F.one_hot(masked_scores.argmax(-1), 6).double()
    torch.testing.assert_close(masked_softmax(s, keep, temperature=1e-3), one_hot, atol=1e-6, rtol=0)
    uniform = keep.double() / keep.sum(-1, keepdim=True)
    torch.testing.assert_close(masked_softmax(s, keep, temperature=1e4), uniform, atol=1e-3, rtol=0)


def test_masked_softmax_dead_rows_are_zero():
    s = torch.randn(3, 4)
    keep = torch.tensor([[True, False, True, False], [False] * 4, [True] * 4])
    w = masked_softmax(s, keep)
    assert (w[1] == 0).all()
    torch.testing.assert_close(w.sum(-1), torch.tensor([1.0, 0.0, 1.0]))
    additive = torch.full((3, 4), float("-inf"))
    assert (masked_softmax(s, additive) == 0).all()


# ---------------------------------------------------------------------------------------------
# attention_entropy
# ---------------------------------------------------------------------------------------------
def _loop_entropy(weights, allowed):
    """-sum p log p over the allowed keys of every row, one row at a time with math.log."""
    flat_w, flat_a = weights.reshape(-1, weights.shape[-1]), allowed.expand(weights.shape).reshape(-1, weights.shape[-1])
    out = []
    for row, keep in zip(flat_w.tolist(), flat_a.tolist()):
        out.append(-sum(p * math.log(p) for p, k in zip(row, keep) if k and p > 0))
    return torch.tensor(out, dtype=torch.float64).reshape(weights.shape[:-1])


def test_attention_entropy_matches_the_formula(gen):
    w = torch.softmax(randn(2, 3, 4, 7, gen=gen, dtype=torch.float64), -1)
    everything = torch.ones(7, dtype=torch.bool)
    torch.testing.assert_close(attention_entropy(w), _loop_entropy(w, everything))
    keep = random_bool_mask((2, 1, 4, 7), gen)
    torch.testing.assert_close(attention_entropy(w, keep), _loop_entropy(w, keep))


def test_attention_entropy_one_hot_is_zero_and_uniform_is_log_s():
    one_hot = F.one_hot(torch.tensor([[0, 3], [5, 1]]), 6).float()
    assert (attention_entropy(one_hot) == 0).all()
    for S in (1, 2, 5, 64):
        uniform = torch.full((3, S), 1 / S, dtype=torch.float64)
        torch.testing.assert_close(attention_entropy(uniform), torch.full((3,), math.log(S), dtype=torch.float64))
        expected = torch.full((3,), 1.0 if S > 1 else 0.0, dtype=torch.float64)
        torch.testing.assert_close(attention_entropy(uniform, normalize=True), expected)


def test_attention_entropy_excludes_masked_keys(gen):
    """Masked keys do not count: the entropy of a masked softmax row is the entropy over the allowed keys alone,
    and weights left on masked keys (e.g. after dropout or an additive mask of -1e4) are ignored."""
    s = randn(5, 8, gen=gen, dtype=torch.float64)
    keep = random_bool_mask((5, 8), gen)
    w = masked_softmax(s, keep)
    for i in range(5):
        alone = torch.softmax(s[i][keep[i]], -1)
        torch.testing.assert_close(attention_entropy(w, keep)[i], attention_entropy(alone))
        n = int(keep[i].sum())
        normalized = attention_entropy(alone) / math.log(n) if n > 1 else torch.tensor(0.0, dtype=torch.float64)
        torch.testing.assert_close(attention_entropy(w, keep, normalize=True)[i], normalized)
    leaked = w + 0.1 * (~keep)  # weight on masked keys changes nothing
    torch.testing.assert_close(attention_entropy(leaked, keep), attention_entropy(w, keep))
    additive = torch.zeros(5, 8, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    torch.testing.assert_close(attention_entropy(leaked, additive), attention_entropy(w, keep))


def test_attention_entropy_causal_normalized_and_dead_rows(gen):
    w = masked_softmax(torch.zeros(6, 6), causal_mask(6))  # uniform over the visible keys
    torch.testing.assert_close(attention_entropy(w, causal_mask(6)), torch.log(torch.arange(1.0, 7.0)))
    torch.testing.assert_close(attention_entropy(w, causal_mask(6), normalize=True), torch.tensor([0.0] + [1.0] * 5))
    dead = torch.zeros(2, 4)  # a fully masked row has zero weights and zero entropy
    assert (attention_entropy(dead, torch.zeros(2, 4, dtype=torch.bool), normalize=True) == 0).all()


def test_attention_entropy_has_finite_gradients_under_a_mask(gen):
    """A penalty lambda * H trains through masked (exactly zero) weights without NaN."""
    s = randn(2, 6, 6, gen=gen).requires_grad_()
    w = masked_softmax(s, causal_mask(6))
    attention_entropy(w, causal_mask(6), normalize=True).mean().backward()
    assert torch.isfinite(s.grad).all() and s.grad.abs().sum() > 0
    # the gradient matches the one of the formula on the allowed keys (row 2: keys 0..2)
    s2 = s.detach()[0, 2, :3].clone().requires_grad_()
    p = torch.softmax(s2, -1)
    (-(p * p.log()).sum() / math.log(3) / 12).backward()
    torch.testing.assert_close(s.grad[0, 2, :3], s2.grad)


@given(dims)
def test_property_attention_entropy_matches_the_loop_and_its_bounds(d):
    """On drawn shapes (ragged masks, fully masked rows, S = 1): the loop formula, 0 <= H <= log |A_i|."""
    g, q, k, v, mask = _problem(*d)
    _, w = sdpa(q, k, v, mask, return_weights=True)
    H = attention_entropy(w, mask)
    torch.testing.assert_close(H, _loop_entropy(w, mask))
    n_allowed = mask.sum(-1).double()
    assert (H >= -1e-12).all() and (H <= torch.log(n_allowed.clamp_min(1)) + 1e-9).all()
    normalized = attention_entropy(w, mask, normalize=True)
    assert (normalized >= -1e-12).all() and (normalized <= 1 + 1e-9).all()
    assert (normalized[n_allowed < 2] == 0).all()


def test_attention_entropy_errors_name_the_argument():
    with pytest.raises(TypeError, match="weights"):
        attention_entropy(torch.ones(3, dtype=torch.long))
    with pytest.raises(ValueError, match="attn_mask"):
        attention_entropy(torch.full((2, 4), 0.25), torch.ones(3, dtype=torch.bool))


# ---------------------------------------------------------------------------------------------
# Masks
# ---------------------------------------------------------------------------------------------
def test_causal_mask_examples():
    T, F_ = True, False
    assert torch.equal(causal_mask(3), torch.tensor([[T, F_, F_], [T, T, F_], [T, T, T]]))
    assert torch.equal(causal_mask(3, 3), causal_mask(3))
    # L < S: two new queries after a cache of 2 keys; the last query sees every key
    assert torch.equal(causal_mask(2, 4), torch.tensor([[T, T, T, F_], [T, T, T, T]]))
    # L > S: the first query precedes every key
    assert torch.equal(causal_mask(3, 2), torch.tensor([[F_, F_], [T, F_], [T, T]]))
    assert torch.equal(causal_mask(1, 1), torch.tensor([[T]]))
    assert causal_mask(0, 3).shape == (0, 3)


@pytest.mark.parametrize("L", [1, 2, 5])
@pytest.mark.parametrize("S", [1, 3, 5, 8])
def test_causal_mask_is_shifted_lower_triangle(L, S):
    mask = causal_mask(L, S)
    assert mask.dtype == torch.bool and mask.shape == (L, S)
    assert torch.equal(mask, torch.ones(L, S).tril(diagonal=S - L).bool())
    if S >= L:
        assert mask[-1].all()  # the newest query sees everything


def test_padding_mask_examples():
    T, F_ = True, False
    assert torch.equal(padding_mask([2, 0, 3]), torch.tensor([[T, T, F_], [F_, F_, F_], [T, T, T]]))
    assert torch.equal(padding_mask(torch.tensor([1, 2]), max_len=4), torch.tensor([[T, F_, F_, F_], [T, T, F_, F_]]))
    assert padding_mask([]).shape == (0, 0)
    assert padding_mask([3]).dtype == torch.bool


def test_padding_mask_hides_padded_keys(gen):
    lengths = [3, 5]
    q, k, v = randn(2, 2, 4, 8, gen=gen), randn(2, 2, 5, 8, gen=gen), randn(2, 2, 5, 3, gen=gen)
    out = sdpa(q, k, v, padding_mask(lengths)[:, None, None, :])
    for b, n in enumerate(lengths):  # same as attending to the unpadded keys only
        torch.testing.assert_close(out[b], F.scaled_dot_product_attention(q[b], k[b, :, :n], v[b, :, :n]))


# ---------------------------------------------------------------------------------------------
# Hard attention
# ---------------------------------------------------------------------------------------------
def test_hard_argmax_is_one_hot_of_score_argmax(gen):
    s = randn(2, 3, 5, 7, gen=gen)
    w = hard_attention_weights(s)
    assert torch.equal(w, F.one_hot(s.argmax(-1), 7).float())


@pytest.mark.parametrize("kind", [None, "bool", "float"])
def test_hard_argmax_separates_scores_that_softmax_rounds_to_a_tie(kind):
    # exp(0) == exp(1e-8) in float32, so an argmax over the softmax weights would pick key 0
    s = torch.tensor([[0.0, 1e-8, -1.0, 5.0]])
    masks = {"bool": torch.tensor([True, True, True, False]), "float": torch.tensor([0.0, 0.0, 0.0, float("-inf")])}
    mask = masks.get(kind)
    w = hard_attention_weights(s if mask is not None else s[:, :3], attn_mask=mask)
    assert w[0, :3].tolist() == [0.0, 1.0, 0.0]


def test_hard_argmax_respects_mask(gen):
    s = randn(4, 6, gen=gen)
    keep = s < s.median()  # hide the best keys, so the answer must change
    keep[:, 0] = True
    w = hard_attention_weights(s, attn_mask=keep)
    assert torch.equal(w, F.one_hot(s.masked_fill(~keep, float("-inf")).argmax(-1), 6).float())
    assert (w[~keep] == 0).all()
    assert not torch.equal(w, hard_attention_weights(s))


def test_hard_sample_frequencies_approach_softmax(gen):
    s = randn(3, 5, gen=gen)
    keep = torch.tensor([[True] * 5, [True, False, True, False, True], [False, True, True, True, True]])
    draws = 20000
    w = hard_attention_weights(s.expand(draws, 3, 5), "sample", keep, generator=torch.Generator().manual_seed(0))
    assert ((w == 0) | (w == 1)).all() and (w.sum(-1) == 1).all()
    torch.testing.assert_close(w.mean(0), masked_softmax(s, keep), atol=0.015, rtol=0)
    # a seeded generator reproduces the draws
    again = hard_attention_weights(s.expand(draws, 3, 5), "sample", keep, generator=torch.Generator().manual_seed(0))
    assert torch.equal(w, again)


@pytest.mark.parametrize("mode", ["argmax", "sample"])
def test_hard_fully_masked_rows_are_zero(mode, gen):
    s = randn(3, 4, gen=gen)
    keep = torch.tensor([[True, True, False, False], [False] * 4, [False, False, False, True]])
    w = hard_attention_weights(s, mode, keep, generator=gen)
    assert (w[1] == 0).all()
    assert (w[[0, 2]].sum(-1) == 1).all()
    assert w[2, 3] == 1 and (w[~keep] == 0).all()


def test_hard_attention_copies_one_value(gen):
    q, k, v = randn(2, 4, 8, gen=gen), randn(2, 6, 8, gen=gen), randn(2, 6, 3, gen=gen)
    out, w = hard_attention(q, k, v, return_weights=True)
    idx = (q @ k.transpose(-2, -1)).argmax(-1)  # scaling does not move the argmax
    torch.testing.assert_close(out, torch.gather(v, 1, idx[..., None].expand(2, 4, 3)))
    torch.testing.assert_close(out, w @ v)
    assert torch.equal(hard_attention(q, k, v), out)


@pytest.mark.parametrize("mode", ["argmax", "sample"])
def test_hard_attention_without_keys_gives_zeros(mode, gen):
    """S = 0 (found by tests/properties/test_differential.py): argmax of nothing raised IndexError; every query
    sees no key, so the contract's zeros."""
    q, k, v = randn(2, 3, 4, gen=gen), randn(2, 0, 4, gen=gen), randn(2, 0, 5, gen=gen)
    out, w = hard_attention(q, k, v, mode=mode, return_weights=True, generator=gen)
    assert out.shape == (2, 3, 5) and w.shape == (2, 3, 0) and (out == 0).all()
    assert hard_attention_weights(randn(3, 0, gen=gen), mode).shape == (3, 0)
    with pytest.raises(ValueError, match="mode"):
        hard_attention_weights(randn(3, 0, gen=gen), "softest")


# ---------------------------------------------------------------------------------------------
# MultiHeadAttention vs torch.nn.MultiheadAttention
# ---------------------------------------------------------------------------------------------
def _torch_twin(mha: MultiHeadAttention) -> nn.MultiheadAttention:
    bias = mha.q_proj.bias is not None
    ref = nn.MultiheadAttention(mha.d_model, mha.n_heads, bias=bias, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight]))
        ref.out_proj.weight.copy_(mha.out_proj.weight)
        if bias:
            ref.in_proj_bias.copy_(torch.cat([mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias]))
            ref.out_proj.bias.copy_(mha.out_proj.bias)
    return ref.eval()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("d_model, n_heads", [(8, 1), (12, 3), (16, 4)])
def test_mha_self_attention_matches_torch(d_model, n_heads, bias, gen):
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model, n_heads, bias=bias).eval()
    ref = _torch_twin(mha)
    x = randn(2, 5, d_model, gen=gen)
    out, w = mha(x, return_weights=True)
    assert out.shape == (2, 5, d_model) and w.shape == (2, n_heads, 5, 5)
    ref_out, ref_w = ref(x, x, x, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)
    _, ref_avg = ref(x, x, x, need_weights=True)  # torch's default averages the heads
    torch.testing.assert_close(w.mean(1), ref_avg)


def test_mha_cross_attention_matches_torch(gen):
    torch.manual_seed(0)
    mha = MultiHeadAttention(12, 3).eval()
    ref = _torch_twin(mha)
    x, ctx = randn(2, 4, 12, gen=gen), randn(2, 7, 12, gen=gen)
    out, w = mha(x, ctx, return_weights=True)
    assert w.shape == (2, 3, 4, 7)
    ref_out, ref_w = ref(x, ctx, ctx, average_attn_weights=False)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)


def test_mha_masks_match_torch(gen):
    torch.manual_seed(0)
    mha = MultiHeadAttention(12, 3).eval()
    ref = _torch_twin(mha)
    x, ctx = randn(2, 4, 12, gen=gen), randn(2, 6, 12, gen=gen)
    keep = random_bool_mask((4, 6), gen)  # ours: True = may attend
    out = mha(x, ctx, attn_mask=keep)
    ref_out, _ = ref(x, ctx, ctx, attn_mask=~keep)  # torch: True = NOT allowed
    torch.testing.assert_close(out, ref_out)
    # key padding: ours broadcasts (B, 1, 1, S); torch takes key_padding_mask (B, S), True = ignore
    pad = padding_mask([6, 3])
    out, w = mha(x, ctx, attn_mask=pad[:, None, None, :], return_weights=True)
    ref_out, ref_w = ref(x, ctx, ctx, key_padding_mask=~pad, average_attn_weights=False)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(w, ref_w)


def test_mha_is_causal_matches_torch(gen):
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).eval()
    ref = _torch_twin(mha)
    x = randn(3, 6, 8, gen=gen)
    out, w = mha(x, is_causal=True, return_weights=True)
    upper = ~torch.ones(6, 6).tril().bool()
    ref_out, _ = ref(x, x, x, attn_mask=upper, is_causal=True)
    torch.testing.assert_close(out, ref_out)
    assert (w[..., upper] == 0).all()


def _gqa_reference(mha: MultiHeadAttention, x, ctx):
    """Grouped-query attention written out: query head i reads K/V head i // (n_heads // n_kv_heads)."""
    B, L, _ = x.shape
    S, hd, h, g = ctx.shape[1], mha.head_dim, mha.n_heads, mha.n_kv_heads
    q = mha.q_proj(x).view(B, L, h, hd)
    k = mha.k_proj(ctx).view(B, S, g, hd)
    v = mha.v_proj(ctx).view(B, S, g, hd)
    heads = []
    for i in range(h):
        j = i // (h // g)
        heads.append(F.scaled_dot_product_attention(q[:, :, i], k[:, :, j], v[:, :, j]))
    return mha.out_proj(torch.cat(heads, dim=-1))


@pytest.mark.parametrize("n_heads, n_kv_heads", [(4, 4), (4, 2), (4, 1), (6, 3), (6, 2)])
def test_gqa_matches_reference_with_repeated_kv_heads(n_heads, n_kv_heads, gen):
    torch.manual_seed(0)
    mha = MultiHeadAttention(12 if n_heads == 6 else 16, n_heads, n_kv_heads).eval()
    d = mha.d_model
    x, ctx = randn(2, 5, d, gen=gen), randn(2, 3, d, gen=gen)
    with torch.no_grad():
        torch.testing.assert_close(mha(x), _gqa_reference(mha, x, x))
        torch.testing.assert_close(mha(x, ctx), _gqa_reference(mha, x, ctx))
    assert mha.k_proj.out_features == mha.v_proj.out_features == n_kv_heads * mha.head_dim


@pytest.mark.parametrize("bias", [True, False])
def test_mqa_parameter_count(bias):
    d, h = 32, 8
    hd = d // h
    mqa = MultiHeadAttention(d, h, n_kv_heads=1, bias=bias)
    expected = 2 * d * d + 2 * d * hd + (2 * d + 2 * hd if bias else 0)
    assert sum(p.numel() for p in mqa.parameters()) == expected
    full = MultiHeadAttention(d, h, bias=bias)
    assert sum(p.numel() for p in full.parameters()) == 4 * d * d + (4 * d if bias else 0)


def test_mha_dropout_only_in_train_mode(gen):
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, dropout=0.5)
    plain = MultiHeadAttention(8, 2, dropout=0.0)
    plain.load_state_dict(mha.state_dict())
    x = randn(2, 6, 8, gen=gen)
    mha.eval()
    with torch.no_grad():
        a, b = mha(x), mha(x)
        assert torch.equal(a, b)
        torch.testing.assert_close(a, plain(x))
        mha.train()
        torch.manual_seed(1)
        c, wc = mha(x, return_weights=True)
        d = mha(x)
        _, w = plain(x, return_weights=True)
    assert not torch.allclose(c, a)
    assert not torch.equal(c, d)
    dropped = wc == 0
    assert dropped.any() and (~dropped).any()
    torch.testing.assert_close(wc[~dropped], 2 * w[~dropped])  # survivors scaled by 1 / (1 - p)


def test_float_masks_of_another_dtype_are_cast_to_the_scores_dtype_as_sdpa_does():
    # a float64 additive mask on float32 scores: once promoted the weights to float64
    # (hard_attention then failed in its matmul with v); now cast as torch's SDPA casts it
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 4, generator=gen) for _ in range(3))
    bool_mask = causal_mask(5)
    float64 = torch.zeros(5, 5, dtype=torch.float64).masked_fill(~bool_mask, float("-inf"))
    weights = masked_softmax(q @ k.mT, float64)
    assert weights.dtype == torch.float32
    assert torch.allclose(weights, masked_softmax(q @ k.mT, bool_mask))
    out = hard_attention(q, k, v, float64)
    assert out.dtype == torch.float32 and torch.equal(out, hard_attention(q, k, v, bool_mask))
    # grouped-query heads with a mask over the query heads
    q4, k2, v2 = torch.randn(4, 3, 8, generator=gen), torch.randn(2, 6, 8, generator=gen), torch.randn(2, 6, 8, generator=gen)
    assert hard_attention(q4, k2, v2, causal_mask(3, 6)).shape == (4, 3, 8)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: masked_softmax(_t(2, 3), temperature=float("nan")), "masked_softmax: temperature"),
        (lambda: scaled_dot_product_attention(_t(2, 4), _t(3, 4), _t(3, 4), scale=float("nan")),
         "scaled_dot_product_attention: scale"),
        (lambda: scaled_dot_product_attention(_t(2, 4), _t(3, 4), _t(3, 4), is_causal="yes"),
         "scaled_dot_product_attention: is_causal"),
        (lambda: MultiHeadAttention(8, 0), "MultiHeadAttention: n_heads must be a positive integer"),
        (lambda: dot_score(_t(2, 4).long(), _t(3, 4).long()), "dot_score: q must be a floating-point"),
    ],
)
def test_nan_parameters_flags_and_integer_tensors_are_refused(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
