"""Tests for attnbook.positional: each encoding against a loop written from the paper, or a property."""

import math

import pytest
import torch

from attnbook.core import scaled_dot_product_attention
from attnbook.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    T5RelativeBias,
    alibi_bias,
    alibi_slopes,
    disentangled_scores,
    multiplicative_scores,
    relative_positions,
    shaw_relative_attention,
    sinusoidal_encoding,
    t5_relative_position_bucket,
    untied_scores,
)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- sinusoidal / learned
def test_sinusoidal_matches_formula():
    n, dim, base = 13, 10, 10000.0
    pe = sinusoidal_encoding(n, dim, base)
    assert pe.shape == (n, dim) and pe.dtype == torch.float32
    for i in range(n):
        for f in range(dim // 2):
            omega = base ** (-2 * f / dim)
            assert pe[i, 2 * f].item() == pytest.approx(math.sin(i * omega), abs=1e-6)
            assert pe[i, 2 * f + 1].item() == pytest.approx(math.cos(i * omega), abs=1e-6)


def test_sinusoidal_shift_is_a_linear_map_depending_only_on_the_offset():
    """Seed 003 eq. 4: rotating the (sin, cos) pair at i by omega*j gives the pair at i + j."""
    dim, k = 8, 5
    pe = sinusoidal_encoding(40, dim).double()
    for f in range(dim // 2):
        w = 10000.0 ** (-2 * f / dim)
        rot = torch.tensor([[math.cos(w * k), math.sin(w * k)], [-math.sin(w * k), math.cos(w * k)]], dtype=torch.float64)
        for i in range(0, 30, 7):
            torch.testing.assert_close(rot @ pe[i, 2 * f: 2 * f + 2], pe[i + k, 2 * f: 2 * f + 2], atol=1e-6, rtol=0)


def test_sinusoidal_dot_product_depends_only_on_distance():
    pe = sinusoidal_encoding(64, 16).double()
    gram = pe @ pe.T
    for offset in (0, 1, 7, 20):
        diagonal = torch.diagonal(gram, offset)
        torch.testing.assert_close(diagonal, torch.full_like(diagonal, diagonal[0].item()), atol=1e-5, rtol=0)
    torch.testing.assert_close(gram, gram.T)


@pytest.mark.parametrize("dim", [0, 7])
def test_sinusoidal_rejects_bad_dim(dim):
    with pytest.raises(ValueError, match="dim"):
        sinusoidal_encoding(4, dim)


def test_learned_embedding_rows_and_limit():
    emb = LearnedPositionalEmbedding(6, 4)
    torch.testing.assert_close(emb(3), emb.weight[:3])
    torch.testing.assert_close(emb(torch.tensor([5, 0])), emb.weight[[5, 0]])
    emb(6).sum().backward()
    assert emb.weight.grad is not None and (emb.weight.grad == 1).all()
    with pytest.raises(ValueError, match="max_len=6"):
        emb(7)
    with pytest.raises(ValueError, match="max_len=6"):
        emb(torch.tensor([2, 6]))


# --------------------------------------------------------------------------- relative scores
def test_relative_positions_bottom_right():
    rel = relative_positions(2, 5)
    for i in range(2):
        for j in range(5):
            assert rel[i, j].item() == j - (i + 3)
    torch.testing.assert_close(relative_positions(4), -relative_positions(4).T)


def shaw_reference(q, k, v, rel_k, rel_v, kmax, causal):
    """Shaw et al. (2018) eqs. (2)-(4), one (i, j) pair at a time."""
    L, S, d = q.shape[0], k.shape[0], q.shape[1]
    out = torch.zeros(L, v.shape[1], dtype=q.dtype)
    for i in range(L):
        pos_i = i + S - L
        logits = []
        for j in range(S):
            r = min(max(j - pos_i, -kmax), kmax) + kmax
            e = (q[i] @ (k[j] + rel_k[r])) / math.sqrt(d)
            logits.append(e if (not causal or j <= pos_i) else -math.inf)
        w = torch.softmax(torch.stack([torch.as_tensor(x, dtype=q.dtype) for x in logits]), 0)
        for j in range(S):
            r = min(max(j - pos_i, -kmax), kmax) + kmax
            out[i] += w[j] * (v[j] + rel_v[r])
    return out


@pytest.mark.parametrize("L,S,kmax,causal", [(5, 5, 2, False), (6, 6, 3, True), (3, 7, 2, True), (4, 4, 0, False)])
def test_shaw_matches_loop(L, S, kmax, causal):
    g = gen(1)
    q, k, v = torch.randn(L, 4, generator=g, dtype=torch.float64), torch.randn(S, 4, generator=g, dtype=torch.float64), torch.randn(S, 4, generator=g, dtype=torch.float64)
    rel_k, rel_v = torch.randn(2 * kmax + 1, 4, generator=g, dtype=torch.float64), torch.randn(2 * kmax + 1, 4, generator=g, dtype=torch.float64)
    out = shaw_relative_attention(q, k, v, rel_k, rel_v, kmax, is_causal=causal)
    torch.testing.assert_close(out, shaw_reference(q, k, v, rel_k, rel_v, kmax, causal))


def test_shaw_with_zero_tables_is_plain_attention_and_batches():
    g = gen(2)
    q, k, v = (torch.randn(2, 3, 6, 8, generator=g) for _ in range(3))
    zeros = torch.zeros(9, 8)
    out, w = shaw_relative_attention(q, k, v, zeros, zeros, 4, is_causal=True, return_weights=True)
    torch.testing.assert_close(out, scaled_dot_product_attention(q, k, v, is_causal=True))
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 6))
    with pytest.raises(ValueError, match="rel_k"):
        shaw_relative_attention(q, k, v, torch.zeros(8, 8), zeros, 4)


def test_untied_scores_match_loop():
    g = gen(3)
    n, D, d = 5, 6, 3
    x, pos = torch.randn(n, D, generator=g, dtype=torch.float64), torch.randn(n, D, generator=g, dtype=torch.float64)
    Wq, Wk, Uq, Uk = (torch.randn(D, d, generator=g, dtype=torch.float64) for _ in range(4))
    got = untied_scores(x, pos, Wq, Wk, Uq, Uk)
    for i in range(n):
        for j in range(n):
            expected = (x[i] @ Wq) @ (x[j] @ Wk) + (pos[i] @ Uq) @ (pos[j] @ Uk)
            assert got[i, j].item() == pytest.approx(expected.item(), rel=1e-9)


def test_multiplicative_scores_match_loop():
    g = gen(4)
    q, k = torch.randn(2, 5, 4, generator=g), torch.randn(2, 5, 4, generator=g)
    rel = torch.randn(3, generator=g)
    got = multiplicative_scores(q, k, rel, max_distance=2)
    for b in range(2):
        for i in range(5):
            for j in range(5):
                expected = (q[b, i] @ k[b, j]) * rel[min(abs(i - j), 2)]
                assert got[b, i, j].item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)


def test_disentangled_scores_match_deberta_loop():
    """He et al. (2021) eq. (4): c2c + Q^c_i . K^r_{delta(i,j)} + K^c_j . Q^r_{delta(j,i)}, delta(i,j) = clip(i-j)+k."""
    g = gen(5)
    n, d, kmax = 7, 4, 2
    q, k = torch.randn(n, d, generator=g, dtype=torch.float64), torch.randn(n, d, generator=g, dtype=torch.float64)
    q_pos, k_pos = torch.randn(2 * kmax + 1, d, generator=g, dtype=torch.float64), torch.randn(2 * kmax + 1, d, generator=g, dtype=torch.float64)

    def delta(a, b):
        return min(max(a - b, -kmax), kmax) + kmax

    got = disentangled_scores(q, k, q_pos, k_pos, kmax)
    for i in range(n):
        for j in range(n):
            expected = q[i] @ k[j] + q[i] @ k_pos[delta(i, j)] + k[j] @ q_pos[delta(j, i)]
            assert got[i, j].item() == pytest.approx(expected.item(), rel=1e-9)


# --------------------------------------------------------------------------- T5
def t5_bucket_reference(rel: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """Mesh TensorFlow's _relative_position_bucket, one Python int at a time."""
    ret, n = 0, -rel
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            ret += num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    val = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    return ret + min(val, num_buckets - 1)


@pytest.mark.parametrize("bidirectional,num_buckets,max_distance", [(True, 32, 128), (False, 32, 128), (True, 16, 20), (False, 8, 64)])
def test_t5_buckets_match_reference(bidirectional, num_buckets, max_distance):
    rel = torch.arange(-300, 301)
    got = t5_relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    expected = [t5_bucket_reference(r, bidirectional, num_buckets, max_distance) for r in range(-300, 301)]
    assert got.tolist() == expected


def test_t5_bucket_known_values():
    b = lambda r, bi=True: t5_relative_position_bucket(torch.tensor(r), bi).item()  # noqa: E731
    assert [b(0), b(-1), b(-7), b(1), b(7)] == [0, 1, 7, 17, 23]  # exact: one bucket per distance below 8
    assert b(-8) == 8 and b(-127) == 15 and b(-128) == 15 and b(-10_000) == 15  # log-spaced, then clamped
    assert b(5, bi=False) == 0 and b(-20, bi=False) == 17  # causal: 16 + int(ln(20/16) / ln(8) * 16)


def test_t5_bias_entries_shape_and_translation_invariance():
    torch.manual_seed(0)
    module = T5RelativeBias(n_heads=3, num_buckets=8, max_distance=16)
    bias = module(5, 9)
    assert bias.shape == (1, 3, 5, 9)
    for h in range(3):
        for i in range(5):
            for j in range(9):
                bucket = t5_bucket_reference(j - (i + 4), True, 8, 16)
                assert bias[0, h, i, j].item() == module.bias.weight[bucket, h].item()
    full = module(12)
    torch.testing.assert_close(full[..., 1:, 1:], full[..., :-1, :-1])  # Toeplitz: depends on j - i only


# --------------------------------------------------------------------------- ALiBi
def test_alibi_slopes_published_values():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -h for h in range(1, 9)]))
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0 ** -(2 * h) for h in range(1, 5)]))
    sixteen = [2.0 ** (-h / 2) for h in range(1, 17)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor([2.0 ** -h for h in range(1, 9)] + sixteen[0::2][:4]))
    assert alibi_slopes(1).tolist() == [2.0 ** -8]
    for n in (3, 5, 6, 7, 12, 20):
        slopes = alibi_slopes(n)
        assert slopes.shape == (n,) and len(set(slopes.tolist())) == n and ((0 < slopes) & (slopes < 1)).all()


def test_alibi_bias_matches_loop():
    slopes = alibi_slopes(4)
    for causal in (True, False):
        bias = alibi_bias(4, 3, 6, causal=causal)
        assert bias.shape == (1, 4, 3, 6)
        for h in range(4):
            for i in range(3):
                for j in range(6):
                    pos_i = i + 3
                    if causal and j > pos_i:
                        assert bias[0, h, i, j].item() == -math.inf
                    else:
                        assert bias[0, h, i, j].item() == pytest.approx(-slopes[h].item() * abs(pos_i - j))


def test_alibi_softmax_is_shift_invariant_as_in_reference_code():
    """fairseq adds m * j instead of -m (i - j): same weights, since the difference is constant per row."""
    scores = torch.randn(1, 8, 6, 6, generator=gen(6))
    ours = torch.softmax(scores + alibi_bias(8, 6), -1)
    j = torch.arange(6).float()
    theirs = scores + alibi_slopes(8)[:, None, None] * j
    theirs = torch.softmax(theirs.masked_fill(torch.ones(6, 6).triu(1).bool(), -math.inf), -1)
    torch.testing.assert_close(ours, theirs)


# --------------------------------------------------------------------------- RoPE
def rotation_matrix(position: float, inv_freq: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """The block-diagonal RoPE matrix R_m, written out as a dense (dim, dim) matrix."""
    half = inv_freq.numel()
    R = torch.zeros(2 * half, 2 * half, dtype=torch.float64)
    for f in range(half):
        a, b = (2 * f, 2 * f + 1) if interleaved else (f, f + half)
        c, s = math.cos(position * inv_freq[f].item()), math.sin(position * inv_freq[f].item())
        R[a, a], R[a, b], R[b, a], R[b, b] = c, -s, s, c
    return R


@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_matches_dense_rotation(interleaved):
    rope = RotaryEmbedding(8, interleaved=interleaved)
    assert rope.inv_freq.shape == (4,) and rope.attention_scaling == 1.0
    torch.testing.assert_close(rope.inv_freq.double(), torch.tensor([10000.0 ** (-2 * f / 8) for f in range(4)], dtype=torch.float64))
    x = torch.randn(2, 5, 8, generator=gen(7), dtype=torch.float64)
    got = rope(x, offset=3)
    for m in range(5):
        expected = x[:, m] @ rotation_matrix(m + 3, rope.inv_freq, interleaved).T
        torch.testing.assert_close(got[:, m], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rope(x, positions=torch.arange(3, 8)), got)


@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_scores_depend_only_on_relative_position_and_norm_is_kept(interleaved):
    rope = RotaryEmbedding(16, interleaved=interleaved)
    g = gen(8)
    q, k = torch.randn(16, generator=g, dtype=torch.float64), torch.randn(16, generator=g, dtype=torch.float64)

    def score(m, n):
        return rope(q[None], positions=torch.tensor([m])) @ rope(k[None], positions=torch.tensor([n]))[0]

    for m, n in [(0, 4), (10, 14), (100, 104), (1000, 1004)]:
        assert score(m, n).item() == pytest.approx(score(0, 4).item(), abs=1e-4)
    x = torch.randn(3, 40, 16, generator=g)
    torch.testing.assert_close(rope(x).norm(dim=-1), x.norm(dim=-1))


def test_rope_interleaved_equals_half_split_up_to_a_permutation():
    dim = 12
    perm = torch.tensor([c for f in range(dim // 2) for c in (f, f + dim // 2)])  # half-split -> interleaved layout
    x = torch.randn(2, 7, dim, generator=gen(9))
    half = RotaryEmbedding(dim, interleaved=False)(x)
    inter = RotaryEmbedding(dim, interleaved=True)(x[..., perm])
    torch.testing.assert_close(inter, half[..., perm])


def test_rope_linear_and_ntk_scaling():
    x = torch.randn(1, 6, 8, generator=gen(10))
    linear = RotaryEmbedding(8, scaling={"type": "linear", "factor": 4.0})
    torch.testing.assert_close(linear.inv_freq, RotaryEmbedding(8).inv_freq / 4)
    torch.testing.assert_close(linear(x, positions=torch.arange(0, 24, 4)), RotaryEmbedding(8)(x), atol=1e-5, rtol=1e-5)
    ntk = RotaryEmbedding(8, scaling={"type": "ntk", "factor": 4.0})
    new_base = 10000.0 * 4.0 ** (8 / 6)
    torch.testing.assert_close(ntk.inv_freq.double(), torch.tensor([new_base ** (-2 * f / 8) for f in range(4)], dtype=torch.float64))
    assert ntk.inv_freq[0].item() == 1.0  # the fastest frequency is untouched
    assert ntk.inv_freq[-1].item() == pytest.approx(RotaryEmbedding(8).inv_freq[-1].item() / 4, rel=1e-5)  # slowest / s


def test_rope_yarn_matches_paper_formula():
    dim, base, s, L0 = 64, 10000.0, 8.0, 256
    rope = RotaryEmbedding(dim, base, scaling={"type": "yarn", "factor": s, "original_max_position_embeddings": L0,
                                               "beta_fast": 32, "beta_slow": 1})
    assert rope.attention_scaling == pytest.approx(0.1 * math.log(s) + 1)
    kinds = set()
    for f in range(dim // 2):
        theta = base ** (-2 * f / dim)
        r = L0 / (2 * math.pi / theta)  # rotations of this pair within the original context
        if r < 1:
            expected, kinds_f = theta / s, "interpolated"
        elif r > 32:
            expected, kinds_f = theta, "kept"
        else:
            gamma = (r - 1) / 31
            expected, kinds_f = (1 - gamma) * theta / s + gamma * theta, "ramp"
        kinds.add(kinds_f)
        assert rope.inv_freq[f].item() == pytest.approx(expected, rel=1e-5)
    assert kinds == {"interpolated", "kept", "ramp"}  # this configuration exercises all three regimes
    x = torch.randn(4, 64, generator=gen(11))
    torch.testing.assert_close(rope(x).norm(dim=-1), x.norm(dim=-1) * rope.attention_scaling)


@pytest.mark.parametrize("kwargs,match", [
    ({"dim": 7}, "even"),
    ({"dim": 8, "scaling": {"type": "dynamic", "factor": 2.0}}, "unknown scaling"),
    ({"dim": 8, "scaling": {"type": "yarn", "factor": 2.0}}, "original_max_position_embeddings"),
    ({"dim": 8, "scaling": {"type": "linear", "factor": 0.5}}, ">= 1"),
])
def test_rope_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RotaryEmbedding(**kwargs)
    with pytest.raises(ValueError, match="dim=8"):
        RotaryEmbedding(8)(torch.zeros(3, 6))
