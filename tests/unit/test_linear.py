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


def test_linformer_projections_start_as_random_johnson_lindenstrauss_maps():
    """E and F are initialised N(0, 1 / proj_len), as the docstring says: mean 0 and variance 1 / k over 32,768
    entries each (the sample variance's relative error is about 1 %), and independent of each other."""
    torch.manual_seed(0)
    layer = LinformerAttention(d_model=8, n_heads=2, seq_len=512, proj_len=64)
    for P in (layer.E, layer.F):
        P = P.detach().double()
        assert abs(P.mean().item()) < 4 * math.sqrt(1 / 64 / P.numel())
        assert abs(P.var().item() * 64 - 1) < 0.05
    assert not torch.equal(layer.E, layer.F)


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


@pytest.mark.parametrize("dtype, x", [(torch.float32, -18.0), (torch.float32, -80.0), (torch.bfloat16, -7.0)])
def test_elu_feature_map_stays_positive_where_elu_plus_one_rounds_to_zero(dtype, x):
    """The docstring's reason for exp below 0: F.elu(x) + 1 rounds to exactly 0 from about -16.6 in float32 and
    -6.2 in bfloat16 (the first zeros of a fine sweep on the CPU; points safely below them here), and a key's
    weight would vanish; elu_feature_map keeps exp(x) > 0 in the input's dtype."""
    t = torch.tensor([x], dtype=dtype)
    assert (F.elu(t) + 1).item() == 0.0
    assert elu_feature_map(t).dtype == dtype and elu_feature_map(t).item() > 0
    assert elu_feature_map(t).item() == torch.exp(t).item()


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


@pytest.mark.parametrize("causal", [False, True])
def test_linear_attention_never_forms_an_L_by_S_matrix(causal, gen):
    """Associativity, as the docstring says: non-causal, nothing larger than the inputs' features and the output
    (O(M Ev) beyond them); causal, the prefix sums (S, M, Ev) at most, far below L x S."""
    from attnbook.utils import largest_new_tensor

    L = S = 1024
    E, Ev = 8, 4  # M = E features with elu + 1
    q, k, v = torch.randn(1, L, E, generator=gen), torch.randn(1, S, E, generator=gen), torch.randn(1, S, Ev, generator=gen)
    largest = largest_new_tensor(linear_attention, q, k, v, is_causal=causal)
    bound = (S + 1) * E * Ev if causal else max(L, S) * max(E, Ev)
    assert largest <= bound < L * S // 16, f"largest intermediate has {largest} elements, bound {bound}"


def test_linear_attention_step_state_has_a_fixed_size(gen):
    """Unlike a KV cache, the state never grows: after any number of tokens it is (S (..., M, Ev), z (..., M))."""
    q, k, v = _randn(gen, 2, 30, 4), _randn(gen, 2, 30, 4), _randn(gen, 2, 30, 3)
    state = None
    for t in range(30):
        _, state = linear_attention_step(q[:, t], k[:, t], v[:, t], state)
        assert state[0].shape == (2, 4, 3) and state[1].shape == (2, 4)


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


def test_orthogonal_random_features_are_drawn_in_float64_then_converted():
    """The docstring: drawn on the CPU in float64 from the generator, then converted to dtype, so every dtype
    gets the same draw rounded (and blocks of different draws are not orthogonal to each other)."""
    exact = orthogonal_random_features(12, 4, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    for dtype in (torch.float32, torch.bfloat16):
        got = orthogonal_random_features(12, 4, generator=torch.Generator().manual_seed(7), dtype=dtype)
        assert got.dtype == dtype and torch.equal(got, exact.to(dtype))
    assert (exact[:4] @ exact[4:8].T).abs().max() > 1e-3  # independent blocks, not one orthogonal basis


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


# ---------------------------------------------------------------------------------------------
# Regressions: brute-force float64 loops written from the docstrings' definitions
# ---------------------------------------------------------------------------------------------
def _mca_loop(q, k, v, wk, wv, bk=None, bv=None, causal=False):
    """Memory-compressed attention, one block and one query at a time. Block b sums the real keys
    b*s .. min((b+1)s, S) - 1 (a ragged last block has fewer); with causal, query i sees block b iff
    its last real key is visible: min((b+1)s, S) - 1 <= i + S - L (bottom-right alignment)."""
    L, S, E, s = q.shape[-2], k.shape[-2], q.shape[-1], wk.shape[-1]
    n_blocks = -(-S // s)
    out = torch.zeros(*q.shape[:-1], wv.shape[0], dtype=torch.float64)
    for idx in itertools.product(*map(range, q.shape[:-2])):
        kc, vc, last = [], [], []
        for b in range(n_blocks):
            rows = range(b * s, min((b + 1) * s, S))
            kc.append(sum(wk[:, :, t - b * s] @ k[idx][t] for t in rows) + (0 if bk is None else bk))
            vc.append(sum(wv[:, :, t - b * s] @ v[idx][t] for t in rows) + (0 if bv is None else bv))
            last.append(rows[-1])
        for i in range(L):
            seen = [b for b in range(n_blocks) if not causal or last[b] <= i + S - L]
            if not seen:
                continue  # no complete block: zeros
            scores = torch.stack([q[idx][i] @ kc[b] / math.sqrt(E) for b in seen])
            weights = torch.softmax(scores, 0)
            out[idx][i] = sum(w * vc[b] for w, b in zip(weights, seen))
    return out


@pytest.mark.parametrize("L, S, s", [(10, 10, 3), (10, 10, 5), (7, 10, 3), (13, 10, 3), (11, 11, 4),
                                     (1, 10, 3), (4, 2, 3), (2, 2, 3), (5, 1, 2), (9, 9, 3)])
def test_memory_compressed_causal_matches_the_loop_for_every_stride(L, S, s):
    """The ragged last block (S not a multiple of s, or S < s) is visible once its last real key is:
    the old rule asked for key (b+1)s - 1, which does not exist, so not even the last query saw it."""
    gen = torch.Generator().manual_seed(100 * L + 10 * S + s)
    q, k, v = _randn(gen, 2, L, 4), _randn(gen, 2, S, 4), _randn(gen, 2, S, 3)
    wk, wv, bk, bv = _randn(gen, 4, 4, s), _randn(gen, 3, 3, s), _randn(gen, 4), _randn(gen, 3)
    for causal in (False, True):
        got = memory_compressed_attention(q, k, v, wk, wv, bk, bv, is_causal=causal)
        torch.testing.assert_close(got, _mca_loop(q, k, v, wk, wv, bk, bv, causal), rtol=1e-12, atol=1e-12)
    # the last query sees every key, hence every block: the non-causal output
    full = memory_compressed_attention(q, k, v, wk, wv, bk, bv)
    torch.testing.assert_close(memory_compressed_attention(q, k, v, wk, wv, bk, bv, is_causal=True)[:, -1],
                               full[:, -1], rtol=1e-12, atol=1e-12)


def _performer_loop(q, k, v, W, causal=False):
    """The Performer estimator from its definition, in float64: phi(x) = exp(W x~ - |x~|^2/2) / sqrt(m)
    with x~ = x d^(-1/4); out_i = sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j) over the keys
    query i sees (j <= i + S - L when causal), zeros when it sees none. No eps, no stabilization."""
    W = W.double()
    L, S, d, m = q.shape[-2], k.shape[-2], q.shape[-1], W.shape[0]
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=torch.float64)
    for idx in itertools.product(*map(range, q.shape[:-2])):
        for i in range(L):
            last = i + S - L if causal else S - 1
            num, den = torch.zeros(v.shape[-1], dtype=torch.float64), 0.0
            for j in range(last + 1):
                qt, kt = q[idx][i] * d**-0.25, k[idx][j] * d**-0.25
                # phi(q_i) . phi(k_j) = (1/m) sum_r exp(w_r.q~ - |q~|^2/2) exp(w_r.k~ - |k~|^2/2)
                weight = torch.exp(W @ (qt + kt) - (qt @ qt + kt @ kt) / 2).sum() / m
                num, den = num + weight * v[idx][j], den + weight
            if last >= 0:
                out[idx][i] = num / den
    return out


def _performer_case(seed=0, d=32, n=16):
    """Keys whose last one lies along the longest row of W: its features dwarf every other key's
    (by about e^28), the input that made earlier outputs depend on it."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = _randn(gen, 1, n, d), _randn(gen, 1, n, d), _randn(gen, 1, n, 3)
    m = round(d * math.log(d))  # performer_attention's default, drawn from the same generator
    W = orthogonal_random_features(m, d, generator=torch.Generator().manual_seed(seed))  # float32
    k[0, -1] = W[W.norm(dim=1).argmax()].double() * d**0.25  # x~ = w
    return q, k, v, W


@pytest.mark.parametrize("eps", [0.0, 1e-6, 1e-3, 1.0])
def test_causal_performer_outputs_never_depend_on_later_keys(eps):
    q, k, v, _ = _performer_case()
    k2 = k.clone()
    k2[0, -1] = _randn(torch.Generator().manual_seed(1), 32)  # an ordinary last key instead
    a = performer_attention(q, k, v, is_causal=True, eps=eps, generator=torch.Generator().manual_seed(0))
    b = performer_attention(q, k2, v, is_causal=True, eps=eps, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(a[:, :-1], b[:, :-1], rtol=0, atol=1e-12)
    assert (a[:, -1] - b[:, -1]).abs().max() > 1e-3  # the last output does see the last key


@pytest.mark.parametrize("causal", [False, True])
def test_performer_matches_its_definition_at_the_default_eps(causal):
    """Same features as the loop (same generator and seed); the default eps changes the eps = 0
    estimate by a factor within [1/(1 + eps), 1], i.e. by at most 1e-6 relative, even when one key's
    features are e^28 times the others' (the old per-call key maximum made eps swamp them: off by ~1)."""
    q, k, v, W = _performer_case()
    expected = _performer_loop(q, k, v, W, causal)
    gen = torch.Generator().manual_seed(0)
    torch.testing.assert_close(performer_attention(q, k, v, is_causal=causal, generator=gen),
                               expected, rtol=1.01e-6, atol=1e-12)
    torch.testing.assert_close(performer_attention(q, k, v, projection=W, is_causal=causal, eps=0.0),
                               expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_performer_eps_is_relative_to_the_largest_term_of_the_normalizer(causal):
    """out(eps) = out(0) * t / (t + eps), t = sum_r phi(q_i)_r z_ir / max_r phi(q_i)_r z_ir in [1, m]:
    one factor per query, between 1/(1 + eps) and 1/(1 + eps/m)."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = _randn(gen, 2, 9, 4), _randn(gen, 2, 9, 4), _randn(gen, 2, 9, 3)
    W = _randn(gen, 6, 4)
    eps = 0.5
    exact = performer_attention(q, k, v, projection=W, is_causal=causal, eps=0.0)
    factor = performer_attention(q, k, v, projection=W, is_causal=causal, eps=eps) / exact
    torch.testing.assert_close(factor, factor[..., :1].expand_as(factor))  # one factor per query
    assert (factor >= 1 / (1 + eps) - 1e-12).all() and (factor <= 1 / (1 + eps / 6) + 1e-12).all()


NO_KEY_CASES = {  # name -> (L, S, is_causal): queries that see no key
    "causal, L > S": (6, 3, True),
    "no keys": (4, 0, False),
    "no keys, causal": (4, 0, True),
}


@pytest.mark.parametrize("eps", [0.0, 1e-6])
@pytest.mark.parametrize("case", sorted(NO_KEY_CASES))
def test_a_query_that_sees_no_key_gets_zeros_and_finite_gradients(case, eps):
    L, S, causal = NO_KEY_CASES[case]
    gen = torch.Generator().manual_seed(L + S)
    q, k, v = _randn(gen, 2, L, 4), _randn(gen, 2, S, 4), _randn(gen, 2, S, 3)
    W = _randn(gen, 5, 4)
    blind = torch.arange(L) + S - L < 0 if causal else torch.full((L,), S == 0)
    calls = {
        "linear_attention": (lambda q, k, v: linear_attention(q, k, v, is_causal=causal, eps=eps),
                             _dense_kernel(q, k, v, elu_feature_map, causal=causal, eps=eps)),
        "linear_attention_weights": (lambda q, k, v: linear_attention_weights(q, k, is_causal=causal, eps=eps) @ v,
                                     _dense_kernel(q, k, v, elu_feature_map, causal=causal, eps=eps)),
        "performer_attention": (lambda q, k, v: performer_attention(q, k, v, projection=W, is_causal=causal, eps=eps),
                                _performer_loop(q, k, v, W, causal)),
    }
    for name, (call, expected) in calls.items():
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = call(*inputs)
        assert torch.equal(out[:, blind], torch.zeros_like(out[:, blind])), name
        torch.testing.assert_close(out, expected, rtol=2e-6, atol=1e-12, msg=name)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads = [torch.zeros_like(t) if t.grad is None else t.grad for t in inputs]  # None: no path, 0
        for grad, grad_of in zip(grads, "qkv"):
            assert torch.isfinite(grad).all(), f"{name}: NaN in the gradient of {grad_of}"
        assert torch.equal(grads[0][:, blind], torch.zeros_like(grads[0][:, blind])), name


def test_zero_similarity_gives_zeros_not_nan_at_eps_zero(gen):
    """A feature map that can be 0 (here relu): a query orthogonal to every key has a zero normalizer."""
    relu = lambda x: F.relu(x)  # noqa: E731
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    k = torch.tensor([[2.0, 0.0], [3.0, 0.0]], dtype=torch.float64, requires_grad=True)
    v = _randn(gen, 2, 3)
    out = linear_attention(q, k, v, feature_map=relu, eps=0.0)
    torch.testing.assert_close(out[0], (2 * v[0] + 3 * v[1]) / 5)
    assert torch.equal(out[1], torch.zeros(3, dtype=torch.float64))
    out.sum().backward()
    assert torch.isfinite(k.grad).all()
    state = (torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
    step, _ = linear_attention_step(q[1], k[0].detach(), v[0], state, feature_map=relu, eps=0.0)
    assert torch.equal(step, torch.zeros(3, dtype=torch.float64))


def test_causal_performer_is_the_loop_for_random_shapes_and_eps_zero():
    for seed, (L, S) in enumerate([(1, 1), (3, 7), (7, 3), (6, 6)]):
        gen = torch.Generator().manual_seed(seed)
        q, k, v = _randn(gen, 2, 2, L, 3), _randn(gen, 2, 1, S, 3), _randn(gen, 2, 1, S, 2)  # MQA
        W = _randn(gen, 4, 3)
        for causal in (False, True):
            got = performer_attention(q, k, v, projection=W, is_causal=causal, eps=0.0)
            torch.testing.assert_close(got, _performer_loop(q, k.expand(2, 2, S, 3), v.expand(2, 2, S, 2), W, causal),
                                       rtol=1e-10, atol=1e-12)


def test_performer_gradients_are_finite_and_match_finite_differences(gen):
    q, k, v = (_randn(gen, 1, n, 3).requires_grad_() for n in (5, 4, 4))
    W = _randn(gen, 4, 3)
    for causal in (False, True):
        assert torch.autograd.gradcheck(
            lambda q, k, v: performer_attention(q, k, v, projection=W, is_causal=causal, eps=0.0), (q, k, v))


def test_performer_in_half_precision_stays_close_to_float32(gen):
    q, k, v = (torch.randn(1, 12, 8, generator=gen) for _ in range(3))
    W = orthogonal_random_features(16, 8, generator=gen)
    for causal in (False, True):
        half = performer_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), projection=W, is_causal=causal)
        assert half.dtype == torch.bfloat16
        full = performer_attention(q, k, v, projection=W, is_causal=causal)
        torch.testing.assert_close(half.float(), full, atol=0.05, rtol=0.05)


# ---------------------------------------------------------------------------------------------
# Bad input: a ValueError or TypeError naming the function and the argument, or the documented result
# ---------------------------------------------------------------------------------------------
_G = torch.Generator().manual_seed(0)
_Q, _K, _V = (torch.randn(2, 5, 4, generator=_G, dtype=torch.float64) for _ in range(3))
_W3 = torch.randn(4, 4, 2, generator=_G, dtype=torch.float64)
_P = torch.randn(3, 5, generator=_G, dtype=torch.float64)  # a (k, n) Linformer projection
_WP = torch.randn(6, 4, generator=_G, dtype=torch.float64)  # a Performer projection
_STATE = (torch.zeros(2, 4, 4, dtype=torch.float64), torch.zeros(2, 4, dtype=torch.float64))


def _step(state=None, **kw):
    return linear_attention_step(_Q[:, 0], _K[:, 0], _V[:, 0], state, **kw)


BAD = [  # (id, call, error, the message must match)
    ("compress_sequence: kernel size 0", lambda: compress_sequence(_K, _W3[..., :0]), ValueError,
     r"compress_sequence: weight must have shape \(E_out, E=4, s\) with kernel size s >= 1, got \(4, 4, 0\)"),
    ("compress_sequence: x of rank 1", lambda: compress_sequence(_K[0, 0], _W3), ValueError,
     r"compress_sequence: x must have shape \(\.\.\., S, E\), got \(4,\)"),
    ("compress_sequence: integer x", lambda: compress_sequence(_K.long(), _W3), TypeError,
     "compress_sequence: x must be a floating-point tensor, got torch.int64"),
    ("compress_sequence: float32 weight", lambda: compress_sequence(_K, _W3.float()), TypeError,
     "compress_sequence: weight must have the dtype of x, torch.float64, got torch.float32"),
    ("compress_sequence: bias shape", lambda: compress_sequence(_K, _W3, _K[0, 0, :3]), ValueError,
     r"compress_sequence: bias must have shape \(E_out,\) = \(4,\), got \(3,\)"),
    ("memory_compressed: weight_k of the wrong width", lambda: memory_compressed_attention(
        _Q, _K, _V, _W3[:3], _W3), ValueError, r"memory_compressed_attention: weight_k must have shape \(E, E, s\)"),
    ("memory_compressed: kernel sizes differ", lambda: memory_compressed_attention(
        _Q, _K, _V, _W3, _W3[..., :1]), ValueError, "memory_compressed_attention: .*same kernel size"),
    ("memory_compressed: kernel size 0", lambda: memory_compressed_attention(
        _Q, _K, _V, _W3[..., :0], _W3[..., :0]), ValueError, "memory_compressed_attention: weight_k .* s >= 1"),
    ("memory_compressed: integer weight_v", lambda: memory_compressed_attention(
        _Q, _K, _V, _W3, _W3.long()), TypeError, "memory_compressed_attention: weight_v must be a floating"),
    ("memory_compressed: is_causal a mask", lambda: memory_compressed_attention(
        _Q, _K, _V, _W3, _W3, is_causal=torch.ones(5, 5, dtype=torch.bool)), TypeError,
     "memory_compressed_attention: is_causal must be a bool"),
    ("memory_compressed: NaN scale", lambda: memory_compressed_attention(
        _Q, _K, _V, _W3, _W3, scale=float("nan")), ValueError, "memory_compressed_attention: scale must be a finite"),
    ("MemoryCompressedAttention: stride 2.5", lambda: MemoryCompressedAttention(8, 2, stride=2.5), ValueError,
     "MemoryCompressedAttention: stride must be a positive integer, got 2.5"),
    ("MemoryCompressedAttention: n_heads 0", lambda: MemoryCompressedAttention(8, 0), ValueError,
     "MemoryCompressedAttention: n_heads must be a positive integer, got 0"),
    ("MemoryCompressedAttention: float64 x for float32 weights", lambda: MemoryCompressedAttention(8, 2)(
        torch.zeros(1, 3, 8, dtype=torch.float64)), TypeError,
     "MemoryCompressedAttention.forward: x must have the dtype of the layer's weights, torch.float32"),
    ("linformer: integer E", lambda: linformer_attention(_Q, _K, _V, _P.long(), _P), TypeError,
     "linformer_attention: E must be a floating-point tensor"),
    ("linformer: float32 F", lambda: linformer_attention(_Q, _K, _V, _P, _P.float()), TypeError,
     "linformer_attention: F must have the dtype of q, torch.float64, got torch.float32"),
    ("linformer: k = 0 rows", lambda: linformer_attention(_Q, _K, _V, _P[:0], _P[:0]), ValueError,
     r"linformer_attention: E must have shape \(k, n=5\) with k >= 1 .* got \(0, 5\)"),
    ("linformer: infinite scale", lambda: linformer_attention(_Q, _K, _V, _P, _P, scale=math.inf), ValueError,
     "linformer_attention: scale must be a finite number, got inf"),
    ("LinformerAttention: proj_len 2.0", lambda: LinformerAttention(8, 2, 4, 2.0), ValueError,
     "LinformerAttention: proj_len must be a positive integer, got 2.0"),
    ("LinformerAttention: n_heads -1", lambda: LinformerAttention(8, -1, 4, 2), ValueError,
     "LinformerAttention: n_heads must be a positive integer, got -1"),
    ("elu_feature_map: integer x", lambda: elu_feature_map(torch.ones(3, dtype=torch.long)), TypeError,
     "elu_feature_map: x must be a floating-point tensor, got torch.int64"),
    ("linear_attention_weights: negative eps", lambda: linear_attention_weights(_Q, _K, eps=-1.0), ValueError,
     "linear_attention_weights: eps must be a finite number >= 0, got -1.0"),
    ("linear_attention_weights: head dims differ", lambda: linear_attention_weights(_Q, _K[..., :3]), ValueError,
     "linear_attention_weights: q and k must have the same last dimension"),
    ("linear_attention_weights: rank 1", lambda: linear_attention_weights(_Q[0, 0], _K[0, 0]), ValueError,
     "linear_attention_weights: q must have at least 2 dimensions"),
    ("linear_attention: NaN eps", lambda: linear_attention(_Q, _K, _V, eps=float("nan")), ValueError,
     "linear_attention: eps must be a finite number >= 0, got nan"),
    ("linear_attention: eps a string", lambda: linear_attention(_Q, _K, _V, eps="1e-6"), TypeError,
     "linear_attention: eps must be a real number, got '1e-6'"),
    ("linear_attention: is_causal the string 'False'", lambda: linear_attention(_Q, _K, _V, is_causal="False"),
     TypeError, "linear_attention: is_causal must be a bool, got 'False'"),
    ("linear_attention: feature maps of different widths", lambda: linear_attention(
        _Q, _K[:, :3], _V[:, :3], feature_map=lambda x: torch.cat([x] * x.shape[-2], -1)), ValueError,
     "linear_attention: feature_map gives q 20 features and k 12; they must be the same M"),
    ("linear_attention: feature map that drops a dimension", lambda: linear_attention(
        _Q, _K, _V, feature_map=lambda x: x.sum(-1)), ValueError, r"linear_attention: feature_map\(q\) must map q"),
    ("linear_attention: float32 features", lambda: linear_attention(
        _Q, _K, _V, feature_map=lambda x: x.float()), TypeError,
     r"linear_attention: feature_map\(q\) must return a tensor of q's dtype torch.float64, got torch.float32"),
    ("linear_attention_step: 0-d q", lambda: linear_attention_step(_Q[0, 0, 0], _K[0, 0, 0], _V[0, 0, 0]),
     ValueError, r"linear_attention_step: q must have shape \(\.\.\., width\)"),
    ("linear_attention_step: integer q", lambda: linear_attention_step(_Q[:, 0].long(), _K[:, 0], _V[:, 0]),
     TypeError, "linear_attention_step: q must be a floating-point tensor"),
    ("linear_attention_step: head dims differ", lambda: linear_attention_step(_Q[:, 0], _K[:, 0, :3], _V[:, 0]),
     ValueError, "linear_attention_step: q and k must have the same last dimension"),
    ("linear_attention_step: batches do not broadcast", lambda: linear_attention_step(
        _Q[:, 0], _K[:, 0], torch.zeros(3, 4, dtype=torch.float64)), ValueError,
     "linear_attention_step: the batch dimensions do not broadcast"),
    ("linear_attention_step: state a tensor", lambda: _step(_STATE[0]), TypeError,
     "linear_attention_step: state must be a pair"),
    ("linear_attention_step: S of the wrong width", lambda: _step((_STATE[0][..., :3], _STATE[1])), ValueError,
     r"linear_attention_step: state must be \(S, z\) with S of shape \(\.\.\., M, Ev\) = \(\.\.\., 4, 4\)"),
    ("linear_attention_step: z of the wrong size", lambda: _step((_STATE[0], _STATE[1][..., :2])), ValueError,
     r"linear_attention_step: state .* got S \(2, 4, 4\) and z \(2, 2\)"),
    ("linear_attention_step: state batch does not broadcast", lambda: _step(
        (torch.zeros(3, 4, 4, dtype=torch.float64), torch.zeros(3, 4, dtype=torch.float64))), ValueError,
     r"linear_attention_step: state .* broadcasting to the tokens' batch \(2,\); got S \(3, 4, 4\)"),
    ("linear_attention_step: state of a larger batch", lambda: linear_attention_step(
        _Q[:1, 0], _K[:1, 0], _V[:1, 0], _STATE), ValueError,
     r"linear_attention_step: state .* the tokens' batch \(1,\); got S \(2, 4, 4\) and z \(2, 4\)"),
    ("linear_attention_step: state with an extra batch dimension", lambda: _step(
        (_STATE[0].expand(3, 2, 4, 4), _STATE[1].expand(3, 2, 4))), ValueError,
     r"linear_attention_step: state .* the tokens' batch \(2,\); got S \(3, 2, 4, 4\)"),
    ("linear_attention_step: float32 state", lambda: _step((_STATE[0].float(), _STATE[1].float())), TypeError,
     r"linear_attention_step: state\[0\] \(S\) must have the dtype of v, torch.float64, got torch.float32"),
    ("linear_attention_step: negative eps", lambda: _step(eps=-1e-6), ValueError,
     "linear_attention_step: eps must be a finite number >= 0"),
    ("linear_attention_recurrent: S of the wrong width", lambda: linear_attention_recurrent(
        _Q, _K, _V, (_STATE[0][..., :3], _STATE[1])), ValueError,
     r"linear_attention_recurrent: state must be \(S, z\)"),
    ("linear_attention_recurrent: state of a larger batch", lambda: linear_attention_recurrent(
        _Q[:1], _K[:1], _V[:1], _STATE), ValueError,
     r"linear_attention_recurrent: state .* the tokens' batch \(1,\); got S \(2, 4, 4\)"),
    ("linear_attention_recurrent: no tokens", lambda: linear_attention_recurrent(_Q[:, :0], _K[:, :0], _V[:, :0]),
     ValueError, "linear_attention_recurrent: q, k and v must contain at least one token"),
    ("delta_rule: NaN beta", lambda: delta_rule_attention(_Q, _K, _V, float("nan")), ValueError,
     "delta_rule_attention: beta must be finite"),
    ("delta_rule: beta a string", lambda: delta_rule_attention(_Q, _K, _V, "0.5"), TypeError,
     "delta_rule_attention: beta must be a real number or tensor, got '0.5'"),
    ("delta_rule: bool beta", lambda: delta_rule_attention(_Q, _K, _V, True), TypeError,
     "delta_rule_attention: beta must be a real number or tensor"),
    ("delta_rule: state of the wrong shape", lambda: delta_rule_attention(
        _Q, _K, _V, 1.0, state=torch.zeros(2, 3, 4, dtype=torch.float64)), ValueError,
     r"delta_rule_attention: state must have shape \(\.\.\., M, Ev\) = \(\.\.\., 4, 4\) .* got \(2, 3, 4\)"),
    ("delta_rule: state of a larger batch", lambda: delta_rule_attention(
        _Q[:1], _K[:1], _V[:1], 1.0, state=torch.zeros(2, 4, 4, dtype=torch.float64)), ValueError,
     r"delta_rule_attention: state .* the tokens' batch \(1,\), got \(2, 4, 4\)"),
    ("delta_rule: float32 state", lambda: delta_rule_attention(
        _Q, _K, _V, 1.0, state=torch.zeros(2, 4, 4)), TypeError,
     "delta_rule_attention: state must have the dtype of v, torch.float64, got torch.float32"),
    ("orthogonal_random_features: n_features 2.5", lambda: orthogonal_random_features(2.5, 4), ValueError,
     "orthogonal_random_features: n_features must be a positive integer, got 2.5"),
    ("orthogonal_random_features: n_features True", lambda: orthogonal_random_features(True, 4), ValueError,
     "orthogonal_random_features: n_features must be a positive integer, got True"),
    ("orthogonal_random_features: dim 0", lambda: orthogonal_random_features(4, 0), ValueError,
     "orthogonal_random_features: dim must be a positive integer, got 0"),
    ("orthogonal_random_features: integer dtype", lambda: orthogonal_random_features(4, 4, dtype=torch.int64),
     TypeError, "orthogonal_random_features: dtype must be a floating torch.dtype, got torch.int64"),
    ("orthogonal_random_features: generator a seed", lambda: orthogonal_random_features(4, 4, generator=0),
     TypeError, "orthogonal_random_features: generator must be a torch.Generator or None, got int"),
    ("performer_features: m = 0", lambda: performer_features(_Q, _WP[:0]), ValueError,
     r"performer_features: projection must have shape \(\.\.\., m, d=4\) with m >= 1 .* got \(0, 4\)"),
    ("performer_features: d = 0", lambda: performer_features(_Q[..., :0], _WP[:, :0]), ValueError,
     r"performer_features: x must have shape \(\.\.\., d\) with d >= 1"),
    ("performer_features: integer projection", lambda: performer_features(_Q, _WP.long()), TypeError,
     "performer_features: projection must be a floating-point tensor, got torch.int64"),
    ("performer_features: NaN in projection", lambda: performer_features(_Q, _WP * math.nan), ValueError,
     "performer_features: projection must be finite"),
    ("performer_features: projection batch does not broadcast", lambda: performer_features(
        _Q, _WP.expand(3, 6, 4)), ValueError, r"performer_features: projection .* broadcasting with x \(2, 5, 4\)"),
    ("performer_attention: n_features 2.5", lambda: performer_attention(_Q, _K, _V, n_features=2.5), ValueError,
     "performer_attention: n_features must be a positive integer, got 2.5"),
    ("performer_attention: n_features 0", lambda: performer_attention(_Q, _K, _V, n_features=0), ValueError,
     "performer_attention: n_features must be a positive integer, got 0"),
    ("performer_attention: n_features disagrees", lambda: performer_attention(
        _Q, _K, _V, n_features=5, projection=_WP), ValueError, "performer_attention: n_features=5 disagrees"),
    ("performer_attention: head_dim 0", lambda: performer_attention(_Q[..., :0], _K[..., :0], _V), ValueError,
     "performer_attention: q and k must have head_dim d >= 1"),
    ("performer_attention: projection of rank 1", lambda: performer_attention(_Q, _K, _V, projection=_WP[0]),
     ValueError, r"performer_attention: projection must have shape \(\.\.\., m, d=4\), got \(4,\)"),
    ("performer_attention: projection of the wrong width", lambda: performer_attention(
        _Q, _K, _V, projection=_WP[:, :3]), ValueError, r"performer_attention: projection must have shape"),
    ("performer_attention: NaN projection", lambda: performer_attention(_Q, _K, _V, projection=_WP * math.nan),
     ValueError, "performer_attention: projection must be finite"),
    ("performer_attention: negative eps", lambda: performer_attention(_Q, _K, _V, eps=-1.0), ValueError,
     "performer_attention: eps must be a finite number >= 0, got -1.0"),
    ("performer_attention: is_causal a tensor", lambda: performer_attention(
        _Q, _K, _V, is_causal=torch.tensor(True)), TypeError, "performer_attention: is_causal must be a bool"),
    ("performer_attention: generator a seed", lambda: performer_attention(_Q, _K, _V, generator=0), TypeError,
     "performer_attention: generator must be a torch.Generator or None, got int"),
]


@pytest.mark.parametrize("call, error, match", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_input_raises_an_error_naming_the_function_and_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


EMPTY = [  # (id, call, expected output): an empty sequence or batch gives the documented result
    ("compress_sequence: S = 0", lambda: compress_sequence(_K[:, :0], _W3), torch.zeros(2, 0, 4)),
    ("compress_sequence: S = 0, bias", lambda: compress_sequence(_K[:, :0], _W3, _W3[:, 0, 0]), torch.zeros(2, 0, 4)),
    ("compress_sequence: empty batch", lambda: compress_sequence(_K[:0], _W3), torch.zeros(0, 3, 4)),
    ("compress_sequence: E = 0 (bias only)", lambda: compress_sequence(_K[..., :0], _W3[:, :0], _W3[:, 0, 0]),
     _W3[:, 0, 0].expand(2, 3, 4)),
    ("memory_compressed: S = 0", lambda: memory_compressed_attention(_Q, _K[:, :0], _V[:, :0], _W3, _W3),
     torch.zeros(2, 5, 4)),
    ("memory_compressed: S = 0, causal", lambda: memory_compressed_attention(
        _Q, _K[:, :0], _V[:, :0], _W3, _W3, is_causal=True), torch.zeros(2, 5, 4)),
    ("memory_compressed: L = 0", lambda: memory_compressed_attention(_Q[:, :0], _K, _V, _W3, _W3, is_causal=True),
     torch.zeros(2, 0, 4)),
    ("MemoryCompressedAttention: seq 0", lambda: MemoryCompressedAttention(8, 2)(torch.zeros(3, 0, 8)).double(),
     torch.zeros(3, 0, 8)),
    ("linformer: S = 0", lambda: linformer_attention(_Q, _K[:, :0], _V[:, :0], _P[:, :0], _P[:, :0]),
     torch.zeros(2, 5, 4)),
    ("linear_attention: S = 0, eps = 0", lambda: linear_attention(_Q, _K[:, :0], _V[:, :0], eps=0.0),
     torch.zeros(2, 5, 4)),
    ("linear_attention: L = 0", lambda: linear_attention(_Q[:, :0], _K, _V, is_causal=True), torch.zeros(2, 0, 4)),
    ("linear_attention: empty batch", lambda: linear_attention(_Q[:0], _K[:0], _V[:0], is_causal=True),
     torch.zeros(0, 5, 4)),
    ("linear_attention_weights: S = 0", lambda: linear_attention_weights(_Q, _K[:, :0], eps=0.0),
     torch.zeros(2, 5, 0)),
    ("performer_attention: S = 0", lambda: performer_attention(_Q, _K[:, :0], _V[:, :0]), torch.zeros(2, 5, 4)),
    ("performer_attention: S = 0, causal", lambda: performer_attention(_Q, _K[:, :0], _V[:, :0], is_causal=True),
     torch.zeros(2, 5, 4)),
    ("performer_attention: L = 0", lambda: performer_attention(_Q[:, :0], _K, _V, is_causal=True),
     torch.zeros(2, 0, 4)),
    ("performer_attention: empty batch", lambda: performer_attention(_Q[:0], _K[:0], _V[:0], is_causal=True),
     torch.zeros(0, 5, 4)),
]


@pytest.mark.parametrize("call, expected", [case[1:] for case in EMPTY], ids=[case[0] for case in EMPTY])
def test_empty_sequences_and_batches_give_the_documented_result(call, expected):
    got = call()
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected.to(got.dtype))


def test_states_that_broadcast_are_accepted(gen):
    """A state whose batch dimensions broadcast with the token's (one shared memory for two heads)."""
    q, k, v = (_randn(gen, 2, 4) for _ in range(3))
    S, z = _randn(gen, 4, 4).abs(), _randn(gen, 4).abs()
    out, (S2, z2) = linear_attention_step(q, k, v, (S, z))
    assert out.shape == (2, 4) and S2.shape == (2, 4, 4) and z2.shape == (2, 4)
    for h in range(2):
        torch.testing.assert_close(out[h], linear_attention_step(q[h], k[h], v[h], (S, z))[0])


def test_a_shared_state_of_batch_one_is_read_by_every_token(gen):
    """A size-1 batch dimension of the state broadcasts to the tokens' batch, like a missing one."""
    q, k, v = (_randn(gen, 3, 4) for _ in range(3))
    S, z = _randn(gen, 1, 4, 4).abs(), _randn(gen, 1, 4).abs()
    out, (S2, z2) = linear_attention_step(q, k, v, (S, z))
    assert S2.shape == (3, 4, 4) and z2.shape == (3, 4)
    torch.testing.assert_close(out, linear_attention_step(q, k, v, (S[0], z[0]))[0])
    delta, memory = delta_rule_attention(q[:, None], k[:, None], v[:, None], 0.5, state=S)
    assert memory.shape == (3, 4, 4)
    torch.testing.assert_close(delta, delta_rule_attention(q[:, None], k[:, None], v[:, None], 0.5, state=S[0])[0])


def test_step_state_covers_the_batch_when_k_has_fewer_dimensions(gen):
    """k shared by the batch ((1, E) against q, v (3, E)): the returned S and z both cover the batch
    (z used to keep k's shape and the next step refused the state), and stepping on equals the
    recurrent form with k expanded to the batch."""
    q, v = _randn(gen, 3, 2, 4), _randn(gen, 3, 2, 4)
    k = _randn(gen, 1, 2, 4)
    state = None
    outs = []
    for i in range(2):
        out, state = linear_attention_step(q[:, i], k[:, i], v[:, i], state)
        assert state[0].shape == (3, 4, 4) and state[1].shape == (3, 4)
        outs.append(out)
    expected, (S, z) = linear_attention_recurrent(q, k.expand(3, 2, 4), v)
    torch.testing.assert_close(torch.stack(outs, 1), expected)
    torch.testing.assert_close(state[0], S)
    torch.testing.assert_close(state[1], z)


def test_layers_under_autocast_accept_inputs_of_another_dtype(gen):
    """The dtype check gives way to autocast, which casts: bfloat16 on the CPU."""
    torch.manual_seed(0)
    x = torch.randn(2, 6, 16, generator=gen)
    layers = [MemoryCompressedAttention(16, 2, stride=4), LinformerAttention(16, 2, seq_len=6, proj_len=3)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for layer in layers:
            assert layer(x).shape == (2, 6, 16)
    with pytest.raises(TypeError, match="LinformerAttention.forward: x must have the dtype"):
        layers[1](x.double())
