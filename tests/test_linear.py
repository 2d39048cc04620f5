"""attnbook.linear against independent references: dense quadratic attention written out, SDPA, statistics."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from attnbook.linear import (
    LinformerAttention,
    MemoryCompressedAttention,
    compress_sequence,
    delta_rule_attention,
    elu_feature_map,
    linear_attention,
    linear_attention_recurrent,
    linear_attention_step,
    linear_attention_weights,
    linformer_attention,
    memory_compressed_attention,
    orthogonal_random_features,
    performer_attention,
    performer_features,
)


def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def _dense_softmax(q, k, v, mask=None):
    """softmax(q k^T / sqrt(d)) v with an optional bool mask, the obvious way."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v


def _dense_kernel(q, k, v, phi, causal=False, eps=1e-6):
    """The quadratic form of kernel attention with explicit loops over queries: an independent reference."""
    L, S = q.shape[-2], k.shape[-2]
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for i in range(L):
        last = i + S - L if causal else S - 1
        if last < 0:
            continue
        sim = (phi(q[..., i : i + 1, :]) * phi(k[..., : last + 1, :])).sum(-1)  # (..., j)
        out[..., i, :] = (sim.unsqueeze(-1) * v[..., : last + 1, :]).sum(-2) / (sim.sum(-1, keepdim=True) + eps)
    return out


# ---------------------------------------------------------------------------------------------
# Memory-compressed attention
# ---------------------------------------------------------------------------------------------
def test_compress_sequence_is_a_weighted_sum_of_blocks(gen):
    x, w, b = _randn(gen, 2, 3, 7, 4), _randn(gen, 5, 4, 3), _randn(gen, 5)
    out = compress_sequence(x, w, b)
    assert out.shape == (2, 3, 3, 5)  # ceil(7 / 3) blocks
    padded = torch.cat([x, torch.zeros(2, 3, 2, 4, dtype=x.dtype)], dim=-2)
    for blk in range(3):
        rows = padded[..., 3 * blk : 3 * blk + 3, :]  # (..., s, E)
        expected = torch.einsum("oet,...te->...o", w, rows) + b
        torch.testing.assert_close(out[..., blk, :], expected)


def test_memory_compressed_attention_is_softmax_over_compressed_keys(gen):
    q, k, v = _randn(gen, 2, 2, 9, 4), _randn(gen, 2, 2, 12, 4), _randn(gen, 2, 2, 12, 6)
    wk, wv = _randn(gen, 4, 4, 4), _randn(gen, 6, 6, 4)
    out = memory_compressed_attention(q, k, v, wk, wv)
    torch.testing.assert_close(out, _dense_softmax(q, compress_sequence(k, wk), compress_sequence(v, wv)))


def test_memory_compressed_stride_one_identity_kernel_is_plain_attention(gen):
    q, k, v = (_randn(gen, 1, 2, 8, 4) for _ in range(3))
    eye = torch.eye(4, dtype=torch.float64)[:, :, None]
    torch.testing.assert_close(memory_compressed_attention(q, k, v, eye, eye), _dense_softmax(q, k, v))
    torch.testing.assert_close(
        memory_compressed_attention(q, k, v, eye, eye, is_causal=True),
        _dense_softmax(q, k, v, torch.ones(8, 8, dtype=torch.bool).tril()),
    )


def test_memory_compressed_causal_sees_only_complete_past_blocks(gen):
    n, s = 10, 3
    q, k, v = (_randn(gen, 1, 1, n, 4) for _ in range(3))
    wk, wv = _randn(gen, 4, 4, s), _randn(gen, 4, 4, s)
    out = memory_compressed_attention(q, k, v, wk, wv, is_causal=True)
    assert torch.equal(out[..., : s - 1, :], torch.zeros_like(out[..., : s - 1, :]))  # no complete block yet
    # changing a future key must not change the output of earlier queries
    k2 = k.clone()
    k2[..., 7, :] += 10.0
    out2 = memory_compressed_attention(q, k2, v, wk, wv, is_causal=True)
    torch.testing.assert_close(out2[..., :8, :], out[..., :8, :])  # block of key 7 is complete at query 8
    assert not torch.allclose(out2[..., 8:, :], out[..., 8:, :])


def test_memory_compressed_module_shapes_and_causality(gen):
    torch.manual_seed(0)
    layer = MemoryCompressedAttention(d_model=16, n_heads=2, stride=4).double()
    x = _randn(gen, 3, 13, 16)
    assert layer(x).shape == (3, 13, 16)
    y = layer(x, is_causal=True)
    x2 = x.clone()
    x2[:, 9:] = _randn(gen, 3, 4, 16)
    torch.testing.assert_close(layer(x2, is_causal=True)[:, :9], y[:, :9])
    with pytest.raises(ValueError, match="d_model"):
        layer(x[..., :8])


# ---------------------------------------------------------------------------------------------
# Linformer
# ---------------------------------------------------------------------------------------------
def test_linformer_matches_attention_over_projected_keys(gen):
    q, k, v = _randn(gen, 2, 3, 10, 8), _randn(gen, 2, 3, 16, 8), _randn(gen, 2, 3, 16, 5)
    E, Fm = _randn(gen, 4, 16), _randn(gen, 4, 16)
    torch.testing.assert_close(linformer_attention(q, k, v, E, Fm), _dense_softmax(q, E @ k, Fm @ v))


def test_linformer_with_identity_projection_is_exact(gen):
    q, k, v = (_randn(gen, 1, 2, 12, 8) for _ in range(3))
    eye = torch.eye(12, dtype=torch.float64)
    torch.testing.assert_close(linformer_attention(q, k, v, eye, eye), _dense_softmax(q, k, v))


def test_linformer_rejects_projection_of_the_wrong_length(gen):
    q = _randn(gen, 1, 1, 12, 8)
    with pytest.raises(ValueError, match=r"E must have shape \(k, n=12\)"):
        linformer_attention(q, q, q, _randn(gen, 4, 10), _randn(gen, 4, 12))


def test_linformer_module(gen):
    torch.manual_seed(0)
    layer = LinformerAttention(d_model=16, n_heads=4, seq_len=20, proj_len=5).double()
    assert layer.E.shape == (5, 20) and layer(_randn(gen, 2, 20, 16)).shape == (2, 20, 16)
    with pytest.raises(ValueError, match="seq_len=20"):
        layer(_randn(gen, 2, 19, 16))
    with pytest.raises(ValueError, match="proj_len"):
        LinformerAttention(16, 4, seq_len=20, proj_len=21)


# ---------------------------------------------------------------------------------------------
# Linear attention: associative, prefix-sum and recurrent forms agree with the quadratic form
# ---------------------------------------------------------------------------------------------
def test_elu_feature_map_is_positive_and_elu_plus_one():
    x = torch.linspace(-20, 5, 101, dtype=torch.float64)
    assert (elu_feature_map(x) > 0).all()
    torch.testing.assert_close(elu_feature_map(x), torch.where(x > 0, x + 1, torch.exp(x)))


@given(L=st.integers(1, 9), S=st.integers(1, 9), E=st.integers(1, 6), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_linear_attention_equals_the_quadratic_form(L, S, E, causal, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _randn(gen, 2, L, E), _randn(gen, 2, S, E), _randn(gen, 2, S, 3)
    expected = _dense_kernel(q, k, v, elu_feature_map, causal=causal)
    torch.testing.assert_close(linear_attention(q, k, v, is_causal=causal), expected)
    torch.testing.assert_close(linear_attention_weights(q, k, is_causal=causal) @ v, expected)


def test_linear_attention_weights_rows_sum_to_one_and_respect_the_mask(gen):
    q, k = _randn(gen, 3, 7, 4), _randn(gen, 3, 7, 4)
    A = linear_attention_weights(q, k, is_causal=True)
    torch.testing.assert_close(A.sum(-1), torch.ones(3, 7, dtype=torch.float64), atol=1e-5, rtol=0)
    lower = torch.ones(7, 7, dtype=torch.bool).tril()
    assert (A[..., ~lower] == 0).all() and (A[..., lower] > 0).all()


def test_causal_linear_attention_is_the_recurrent_form(gen):
    q, k, v = _randn(gen, 2, 3, 11, 4), _randn(gen, 2, 3, 11, 4), _randn(gen, 2, 3, 11, 5)
    out, (S, z) = linear_attention_recurrent(q, k, v)
    torch.testing.assert_close(out, linear_attention(q, k, v, is_causal=True))
    phi_k = elu_feature_map(k)
    torch.testing.assert_close(S, phi_k.transpose(-2, -1) @ v)  # final state: sum_j phi(k_j) v_j^T
    torch.testing.assert_close(z, phi_k.sum(-2))
    assert S.shape == (2, 3, 4, 5) and z.shape == (2, 3, 4)


def test_recurrent_form_continues_from_a_state(gen):
    q, k, v = (_randn(gen, 1, 2, 10, 4) for _ in range(3))
    first, state = linear_attention_recurrent(q[..., :6, :], k[..., :6, :], v[..., :6, :])
    second, _ = linear_attention_recurrent(q[..., 6:, :], k[..., 6:, :], v[..., 6:, :], state=state)
    torch.testing.assert_close(torch.cat([first, second], -2), linear_attention(q, k, v, is_causal=True))
    step, _ = linear_attention_step(q[..., 6, :], k[..., 6, :], v[..., 6, :], state)
    torch.testing.assert_close(step, second[..., 0, :])


def test_linear_attention_with_a_custom_feature_map(gen):
    q, k, v = (_randn(gen, 2, 8, 3) for _ in range(3))
    phi = lambda x: torch.cat([F.relu(x), F.relu(-x)], -1) + 0.1  # noqa: E731  (M = 2E features)
    torch.testing.assert_close(linear_attention(q, k, v, feature_map=phi, is_causal=True), _dense_kernel(q, k, v, phi, causal=True))


def test_linear_attention_causal_with_more_queries_than_keys_gives_zeros_first(gen):
    q, k, v = _randn(gen, 1, 6, 4), _randn(gen, 1, 3, 4), _randn(gen, 1, 3, 2)
    out = linear_attention(q, k, v, is_causal=True)
    assert torch.equal(out[:, :3], torch.zeros(1, 3, 2, dtype=torch.float64))
    torch.testing.assert_close(out, _dense_kernel(q, k, v, elu_feature_map, causal=True))


def test_linear_attention_rejects_bad_shapes(gen):
    with pytest.raises(ValueError, match="same last dimension"):
        linear_attention(_randn(gen, 1, 4, 3), _randn(gen, 1, 4, 5), _randn(gen, 1, 4, 5))
    with pytest.raises(ValueError, match="one query per key"):
        linear_attention_recurrent(_randn(gen, 1, 3, 4), _randn(gen, 1, 4, 4), _randn(gen, 1, 4, 4))


# ---------------------------------------------------------------------------------------------
# Fast weights: the delta rule
# ---------------------------------------------------------------------------------------------
def _delta_rule_loop(q, k, v, beta, phi):
    """Schlag et al.'s layout, one sequence at a time: W_t = W_{t-1} + b_t (v_t - W_{t-1} f_t) f_t^T."""
    *batch, n, _ = q.shape
    out = torch.zeros(*batch, n, v.shape[-1], dtype=q.dtype)
    states = torch.zeros(*batch, phi(k[..., :1, :]).shape[-1], v.shape[-1], dtype=q.dtype)
    for b in itertools.product(*map(range, batch)):
        W = torch.zeros(v.shape[-1], states.shape[-2], dtype=q.dtype)  # (Ev, M)
        for t in range(n):
            f, g = phi(k[b][t]), phi(q[b][t])
            f, g = f / f.norm(), g / g.norm()
            W = W + beta[b][t] * torch.outer(v[b][t] - W @ f, f)
            out[b][t] = W @ g
        states[b] = W.T
    return out, states


@given(n=st.integers(1, 8), E=st.integers(1, 5), Ev=st.integers(1, 4), heads=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_delta_rule_matches_the_loop_in_the_papers_layout(n, E, Ev, heads, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _randn(gen, heads, n, E), _randn(gen, heads, n, E), _randn(gen, heads, n, Ev)
    beta = torch.rand(heads, n, generator=gen, dtype=torch.float64)
    out, state = delta_rule_attention(q, k, v, beta)
    expected_out, expected_state = _delta_rule_loop(q, k, v, beta, elu_feature_map)
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(state, expected_state)


def test_delta_rule_overwrites_where_the_additive_rule_averages(gen):
    key = _randn(gen, 1, 1, 6).expand(1, 2, 6)  # the same key A twice
    values = torch.tensor([[[1.0], [2.0]]], dtype=torch.float64)  # A -> 1, then A -> 2
    out, _ = delta_rule_attention(key, key, values, beta=1.0)
    torch.testing.assert_close(out[0, :, 0], torch.tensor([1.0, 2.0], dtype=torch.float64))
    additive, _ = linear_attention_recurrent(key, key, values)
    torch.testing.assert_close(additive[0, :, 0], torch.tensor([1.0, 1.5], dtype=torch.float64))
    half, _ = delta_rule_attention(key, key, values, beta=0.5)  # half a step toward 2
    torch.testing.assert_close(half[0, -1, 0], torch.tensor(0.5 + 0.75, dtype=torch.float64))


def test_delta_rule_with_orthogonal_keys_stores_each_latest_value(gen):
    identity = lambda x: x  # noqa: E731  one-hot keys stay orthonormal features
    keys = torch.eye(4, dtype=torch.float64)[[0, 1, 2, 0, 1]]  # keys 0 and 1 written twice
    v = _randn(gen, 5, 3)
    _, S = delta_rule_attention(keys, keys, v, 1.0, feature_map=identity)
    torch.testing.assert_close(S[:3], v[[3, 4, 2]])  # row i of S holds the last value of key i
    assert torch.equal(S[3], torch.zeros(3, dtype=torch.float64))
    _, S_once = delta_rule_attention(keys[:3], keys[:3], v[:3], 1.0, feature_map=identity)
    torch.testing.assert_close(S_once, keys[:3].T @ v[:3])  # distinct keys: the additive sum


def test_delta_rule_continues_from_a_state_and_beta_zero_only_reads(gen):
    q, k, v = (_randn(gen, 2, 9, 4) for _ in range(3))
    beta = torch.rand(2, 9, generator=gen, dtype=torch.float64)
    full, S = delta_rule_attention(q, k, v, beta)
    first, S1 = delta_rule_attention(q[:, :5], k[:, :5], v[:, :5], beta[:, :5])
    second, S2 = delta_rule_attention(q[:, 5:], k[:, 5:], v[:, 5:], beta[:, 5:], state=S1)
    torch.testing.assert_close(torch.cat([first, second], 1), full)
    torch.testing.assert_close(S2, S)
    frozen, S3 = delta_rule_attention(q, k, v, 0.0, state=S)
    torch.testing.assert_close(S3, S)
    g = F.normalize(elu_feature_map(q), dim=-1)
    torch.testing.assert_close(frozen, g @ S)


def test_delta_rule_rejects_bad_inputs(gen):
    q = _randn(gen, 2, 5, 4)
    with pytest.raises(ValueError, match="beta must broadcast"):
        delta_rule_attention(q, q, q, torch.ones(3))
    with pytest.raises(ValueError, match="one query per key"):
        delta_rule_attention(q[:, :4], q, q, 1.0)


# ---------------------------------------------------------------------------------------------
# Performer: orthogonal random features, unbiased positive features, the attention estimate
# ---------------------------------------------------------------------------------------------
def test_orthogonal_random_features_are_orthogonal_within_blocks():
    W = orthogonal_random_features(20, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert W.shape == (20, 8)
    for block in (W[:8], W[8:16]):
        gram = block @ block.T
        off = gram - torch.diag(torch.diagonal(gram))
        assert off.abs().max() < 1e-10
    assert W[16:].shape == (4, 8)  # truncated last block


def test_orthogonal_random_features_have_gaussian_row_norms():
    # Marginally N(0, I_d): E|w|^2 = d and each coordinate has variance 1.
    W = orthogonal_random_features(4000, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    sq = (W * W).sum(1)
    assert abs(sq.mean().item() - 16) < 4 * math.sqrt(2 * 16 / 4000)  # Var |w|^2 = 2d
    assert abs(W.var().item() - 1) < 0.05


def test_orthogonal_random_features_use_the_generator():
    a = orthogonal_random_features(10, 4, generator=torch.Generator().manual_seed(3))
    b = orthogonal_random_features(10, 4, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def test_performer_features_formula_and_positivity(gen):
    x, W = _randn(gen, 2, 5, 4), _randn(gen, 7, 4)
    xt = x * 4**-0.25
    expected = torch.exp(xt @ W.T - (xt**2).sum(-1, keepdim=True) / 2) / math.sqrt(7)
    phi = performer_features(x, W)
    torch.testing.assert_close(phi, expected)
    assert (phi > 0).all()


@pytest.mark.parametrize("orthogonal", [False, True])
def test_positive_random_features_are_unbiased(orthogonal):
    """Mean of the estimate over many independent draws lies within a few standard errors of exp(q.k/sqrt(d))."""
    gen = torch.Generator().manual_seed(7)
    d, m, draws = 8, 16, 4000
    q, k = 0.6 * _randn(gen, 3, d), 0.6 * _randn(gen, 3, d)  # three (q, k) pairs
    exact = torch.exp((q * k).sum(-1) / math.sqrt(d))
    if orthogonal:  # blocks of d rows are independent draws: split one big matrix into `draws` of them
        W = orthogonal_random_features(draws * m, d, generator=gen, dtype=torch.float64).view(draws, m, d)
    else:
        W = _randn(gen, draws, m, d)
    phi_q = performer_features(q, W)  # (draws, 3, m): the 3 queries as a sequence, one projection per draw
    estimates = (phi_q * performer_features(k, W)).sum(-1)  # (draws, 3)
    mean, stderr = estimates.mean(0), estimates.std(0) / math.sqrt(draws)
    assert ((mean - exact).abs() < 4 * stderr).all(), (mean, exact, stderr)
    assert (estimates > 0).all()  # positive features never give a negative weight


def test_performer_kernel_error_falls_as_features_grow():
    gen = torch.Generator().manual_seed(11)
    q, k = 0.5 * _randn(gen, 32, 16), 0.5 * _randn(gen, 32, 16)
    exact = torch.exp(q @ k.T / 4)
    errors = []
    for m in (16, 256, 4096):
        errs = []
        for _ in range(10):
            W = orthogonal_random_features(m, 16, generator=gen, dtype=torch.float64)
            est = performer_features(q, W) @ performer_features(k, W).T
            errs.append(((est - exact) / exact).pow(2).mean().sqrt())
        errors.append(torch.stack(errs).mean().item())
    assert errors[0] > 2.5 * errors[1] > 6 * errors[2], errors  # ~ 1 / sqrt(m): 4x per 16x features


def test_performer_attention_approaches_softmax_attention(gen):
    q, k, v = (0.5 * _randn(gen, 1, 2, 24, 8) for _ in range(3))
    for causal in (False, True):
        mask = torch.ones(24, 24, dtype=torch.bool).tril() if causal else None
        exact = _dense_softmax(q, k, v, mask)
        W_small = orthogonal_random_features(8, 8, generator=gen, dtype=torch.float64)
        W_big = orthogonal_random_features(40000, 8, generator=gen, dtype=torch.float64)
        err_small = (performer_attention(q, k, v, projection=W_small, is_causal=causal) - exact).abs().mean()
        err_big = (performer_attention(q, k, v, projection=W_big, is_causal=causal) - exact).abs().mean()
        assert err_big < 0.02 and err_big < err_small / 5, (causal, err_small, err_big)


def test_performer_attention_equals_linear_attention_with_performer_features(gen):
    """The stabilising constants cancel: same result as plugging performer_features into linear_attention."""
    q, k, v = _randn(gen, 2, 10, 4), _randn(gen, 2, 10, 4), _randn(gen, 2, 10, 3)
    W = _randn(gen, 32, 4)
    for causal in (False, True):
        expected = linear_attention(q, k, v, feature_map=lambda x: performer_features(x, W), is_causal=causal, eps=0.0)
        torch.testing.assert_close(performer_attention(q, k, v, projection=W, is_causal=causal, eps=0.0), expected)


def test_performer_attention_does_not_overflow_for_large_inputs(gen):
    q, k, v = 30 * _randn(gen, 1, 16, 8), 30 * _randn(gen, 1, 16, 8), _randn(gen, 1, 16, 3)
    out = performer_attention(q.float(), k.float(), v.float(), n_features=64, generator=gen)
    assert torch.isfinite(out).all()


def test_performer_attention_default_features_and_generator(gen):
    q = _randn(gen, 1, 6, 16)
    a = performer_attention(q, q, q, generator=torch.Generator().manual_seed(0))
    b = performer_attention(q, q, q, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="n_features=5 disagrees"):
        performer_attention(q, q, q, n_features=5, projection=_randn(gen, 6, 16))
