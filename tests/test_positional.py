"""Tests for attnbook.positional: each encoding against a loop written from the paper, or a property."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnbook.core import scaled_dot_product_attention
from attnbook.models import TinyGPT, TransformerConfig
from attnbook.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    T5RelativeBias,
    alibi_bias,
    alibi_slopes,
    disentangled_scores,
    multiplicative_scores,
    principal_angles,
    principal_components,
    relative_positions,
    rope_complex,
    shaw_relative_attention,
    sinusoidal_encoding,
    subspace_overlap,
    t5_relative_position_bucket,
    transformer_xl_relative_embeddings,
    transformer_xl_scores,
    untied_scores,
    variance_in_subspace,
    yarn_inv_freq,
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
    """Vaswani et al. (2017): rotating the (sin, cos) pair at i by omega*k gives the pair at i + k."""
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


def deberta_delta(i, j, k):
    """He et al. (2021): delta(i, j) = 0 if i - j <= -k, 2k - 1 if i - j >= k, else i - j + k."""
    if i - j <= -k:
        return 0
    if i - j >= k:
        return 2 * k - 1
    return i - j + k


@pytest.mark.parametrize("n,kmax", [(7, 2), (5, 1), (4, 6)])
def test_disentangled_scores_match_deberta_loop(n, kmax):
    """c2c + Q^c_i . K^r_{delta(i,j)} + K^c_j . Q^r_{delta(j,i)}, with the paper's 2k-valued delta."""
    g = gen(5)
    d = 4
    q, k = torch.randn(n, d, generator=g, dtype=torch.float64), torch.randn(n, d, generator=g, dtype=torch.float64)
    q_pos, k_pos = torch.randn(2 * kmax, d, generator=g, dtype=torch.float64), torch.randn(2 * kmax, d, generator=g, dtype=torch.float64)
    got = disentangled_scores(q, k, q_pos, k_pos, kmax)
    for i in range(n):
        for j in range(n):
            expected = q[i] @ k[j] + q[i] @ k_pos[deberta_delta(i, j, kmax)] + k[j] @ q_pos[deberta_delta(j, i, kmax)]
            assert got[i, j].item() == pytest.approx(expected.item(), rel=1e-9)


def test_deberta_delta_takes_2k_values_and_tables_have_2k_rows():
    assert sorted({deberta_delta(i, j, 3) for i in range(20) for j in range(20)}) == list(range(6))
    q = torch.randn(5, 4)
    with pytest.raises(ValueError, match=r"2\*max_distance"):
        disentangled_scores(q, q, torch.zeros(7, 4), torch.zeros(7, 4), 3)  # the 2k + 1 rows of a clip to [-k, k]
    with pytest.raises(ValueError, match="at least 1"):
        disentangled_scores(q, q, torch.zeros(0, 4), torch.zeros(0, 4), 0)


def test_disentangled_position_terms_depend_only_on_relative_distance():
    """Shift test: the same content placed t positions later gives the same scores among those tokens."""
    g = gen(12)
    n, t, d, kmax = 6, 4, 8, 3
    q, k = torch.randn(n + t, d, generator=g, dtype=torch.float64), torch.randn(n + t, d, generator=g, dtype=torch.float64)
    q_pos, k_pos = torch.randn(2 * kmax, d, generator=g, dtype=torch.float64), torch.randn(2 * kmax, d, generator=g, dtype=torch.float64)
    early = disentangled_scores(q[t:], k[t:], q_pos, k_pos, kmax)  # tokens at positions 0..n-1
    late = disentangled_scores(q, k, q_pos, k_pos, kmax)[t:, t:]  # the same tokens at positions t..t+n-1
    torch.testing.assert_close(early, late)


def test_untied_scores_have_no_word_position_cross_terms():
    """The mixed second difference s(x, p) - s(x, p') - s(x', p) + s(x', p') vanishes only without cross terms."""
    g = gen(13)
    n, D, d = 5, 8, 4
    x, x2, p, p2 = (torch.randn(n, D, generator=g, dtype=torch.float64) for _ in range(4))
    Wq, Wk, Uq, Uk = (torch.randn(D, d, generator=g, dtype=torch.float64) for _ in range(4))

    def untied(a, b):
        return untied_scores(a, b, Wq, Wk, Uq, Uk)

    def absolute(a, b):
        return ((a + b) @ Wq) @ ((a + b) @ Wk).T

    for score, zero in ((untied, True), (absolute, False)):
        mixed = score(x, p) - score(x, p2) - score(x2, p) + score(x2, p2)
        assert (mixed.abs().max().item() < 1e-10) == zero


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


def test_t5_bias_is_one_scalar_per_head_and_bucket_shared_across_layers():
    module = T5RelativeBias(n_heads=4, num_buckets=16)
    assert [tuple(p.shape) for p in module.parameters()] == [(16, 4)]  # (num_buckets, n_heads)
    bias = module(6)
    assert not torch.equal(bias[0, 0], bias[0, 1])  # heads are not tied
    config = TransformerConfig(vocab_size=11, d_model=16, n_heads=4, n_layers=3, max_len=16, positional="t5")
    tables = [name for name, p in TinyGPT(config).named_parameters() if "rel_bias" in name]
    assert tables == ["rel_bias.bias.weight"]  # one table for all three layers


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
        bias = alibi_bias(4, 3, 6, is_causal=causal)
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


def test_rope_yarn_paper_ramp_matches_paper_formula():
    """ramp="paper" keeps the continuous ramp of Peng et al. (2024), linear in the number of turns."""
    dim, base, s, L0 = 64, 10000.0, 8.0, 256
    rope = RotaryEmbedding(dim, base, scaling={"type": "yarn", "factor": s, "original_max_position_embeddings": L0,
                                               "beta_fast": 32, "beta_slow": 1, "ramp": "paper"})
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


def hf_yarn_reference(dim, base, factor, L0, beta_fast=32, beta_slow=1):
    """Hugging Face's _compute_yarn_parameters (truncate=True, the authors' ramp), transcribed line by line."""
    def find_correction_dim(num_rotations, dim, base, max_position_embeddings):
        return (dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    def find_correction_range(low_rot, high_rot, dim, base, max_position_embeddings):
        low = math.floor(find_correction_dim(low_rot, dim, base, max_position_embeddings))
        high = math.ceil(find_correction_dim(high_rot, dim, base, max_position_embeddings))
        return max(low, 0), min(high, dim - 1)

    def linear_ramp_factor(min, max, dim):
        if min == max:
            max += 0.001
        linear_func = (torch.arange(dim, dtype=torch.float32) - min) / (max - min)
        return torch.clamp(linear_func, 0, 1)

    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    low, high = find_correction_range(beta_fast, beta_slow, dim, base, L0)
    inv_freq_extrapolation_factor = 1 - linear_ramp_factor(low, high, dim // 2)
    inv_freq = (inv_freq_interpolation * (1 - inv_freq_extrapolation_factor)
                + inv_freq_extrapolation * inv_freq_extrapolation_factor)
    return inv_freq, 0.1 * math.log(factor) + 1.0


@pytest.mark.parametrize("dim,base,factor,L0,betas", [
    (128, 10000.0, 4.0, 4096, (32, 1)), (128, 10000.0, 8.0, 4096, (32, 1)),
    (128, 10000.0, 8.0, 2048, (32, 1)), (128, 10000.0, 4.0, 2048, (32, 1)),
    (64, 500000.0, 16.0, 8192, (16, 2)), (16, 10000.0, 2.0, 64, (32, 1)),
])
def test_rope_yarn_default_is_the_released_ramp(dim, base, factor, L0, betas):
    scaling = {"type": "yarn", "factor": factor, "original_max_position_embeddings": L0,
               "beta_fast": betas[0], "beta_slow": betas[1]}
    rope = RotaryEmbedding(dim, base, scaling=scaling)
    expected, mscale = hf_yarn_reference(dim, base, factor, L0, *betas)
    torch.testing.assert_close(rope.inv_freq, expected, rtol=1e-6, atol=0)
    assert rope.attention_scaling == pytest.approx(mscale)
    explicit = RotaryEmbedding(dim, base, scaling={**scaling, "ramp": "released"})
    assert torch.equal(explicit.inv_freq, rope.inv_freq)


def test_rope_yarn_released_ramp_ends_at_whole_pairs():
    """dim 128, L0 4096: pair 20.9 turns 32 times, pair 45.03 once, so pairs 0..20 are kept and 46.. interpolated."""
    inv_freq, scale = yarn_inv_freq(128, 10000.0, 8.0, 4096)
    original = 10000.0 ** -(torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    torch.testing.assert_close(inv_freq[:21], original[:21], rtol=1e-12, atol=0)
    torch.testing.assert_close(inv_freq[46:], original[46:] / 8, rtol=1e-12, atol=0)
    ramp = (original[21:46] / inv_freq[21:46] - 1) / 7  # 0 = kept, 1 = divided by 8
    assert (ramp.diff() > 0).all() and 0 < ramp.min() < ramp.max() < 1
    assert scale == pytest.approx(0.1 * math.log(8) + 1)
    with pytest.raises(ValueError, match="ramp"):
        yarn_inv_freq(128, 10000.0, 8.0, 4096, ramp="smooth")


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rope_complex_equals_the_rotation_form(interleaved, dtype):
    x = torch.randn(2, 3, 9, 16, generator=gen(14), dtype=dtype)
    positions = torch.arange(4, 13)
    got = rope_complex(x, positions, 500.0, interleaved=interleaved)
    assert got.dtype == dtype and got.shape == x.shape
    expected = RotaryEmbedding(16, 500.0, interleaved=interleaved)(x, positions=positions)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    for m in (0, 5):  # and the dense block-diagonal rotation
        dense = x[..., m, :].double() @ rotation_matrix(positions[m].item(), RotaryEmbedding(16, 500.0).inv_freq.double(), interleaved).T
        torch.testing.assert_close(got[..., m, :].double(), dense, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- Transformer-XL
def transformer_xl_reference(q, k, r, u, v):
    """Dai et al. (2019): (a) q_i.k_j + (b) q_i.r_{i-j} + (c) u.k_j + (d) v.r_{i-j}, one (h, i, j) at a time."""
    H, L, _ = q.shape
    S = k.shape[1]
    scores = torch.full((H, L, S), -math.inf, dtype=q.dtype)
    terms = torch.zeros(4, H, L, S, dtype=q.dtype)
    for h in range(H):
        for i in range(L):
            for j in range(S):
                delta = (S - L + i) - j
                if delta < 0:
                    continue
                terms[:, h, i, j] = torch.stack([q[h, i] @ k[h, j], q[h, i] @ r[h, delta],
                                                 u[h] @ k[h, j], v[h] @ r[h, delta]])
                scores[h, i, j] = terms[:, h, i, j].sum()
    return scores, terms


def xl_inputs(batch, H, L, S, d, seed=15):
    g = gen(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    return rand(*batch, H, L, d), rand(*batch, H, S, d), rand(H, S, d), rand(H, d), rand(H, d)


@given(st.integers(1, 3), st.integers(1, 5), st.integers(0, 4), st.integers(1, 6), st.booleans())
def test_transformer_xl_scores_match_loop(H, L, memory, d, batched):
    S = L + memory
    batch = (2,) if batched else ()
    q, k, r, u, v = xl_inputs(batch, H, L, S, d)
    scores, terms = transformer_xl_scores(q, k, r, u, v, return_terms=True)
    assert scores.shape == (*batch, H, L, S) and len(terms) == 4
    for b in range(2) if batched else [None]:
        pick = (lambda t: t[b]) if batched else (lambda t: t)
        ref_scores, ref_terms = transformer_xl_reference(pick(q), pick(k), r, u, v)
        torch.testing.assert_close(pick(scores), ref_scores)
        for got, ref in zip(terms, ref_terms):
            torch.testing.assert_close(pick(got), ref)
    torch.testing.assert_close(transformer_xl_scores(q, k, r, u, v), scores)


def test_transformer_xl_scores_are_invariant_to_shifting_absolute_positions():
    """Put t more memory keys in front: every query and key moves t positions, the layout of the old pairs does not."""
    H, L, S, d, t = 2, 4, 7, 5, 3
    q, k, r, u, v = xl_inputs((1,), H, L, S + t, d, seed=16)
    late = transformer_xl_scores(q, k, r, u, v)[..., t:]  # queries at t+S-L.., keys at t..
    early = transformer_xl_scores(q, k[..., t:, :], r[:, :S], u, v)  # the same tokens at positions 0..
    torch.testing.assert_close(early, late)


def test_transformer_xl_one_step_with_a_cache_equals_the_last_row():
    q, k, r, u, v = xl_inputs((2,), 3, 6, 6, 4, seed=17)
    full = transformer_xl_scores(q, k, r, u, v)
    step = transformer_xl_scores(q[..., -1:, :], k, r, u, v)  # the new query against 5 cached keys + its own
    torch.testing.assert_close(step, full[..., -1:, :])


def test_transformer_xl_relative_embeddings_and_bad_shapes():
    R = transformer_xl_relative_embeddings(10, 8)
    torch.testing.assert_close(R, sinusoidal_encoding(10, 8))
    q, k, r, u, v = xl_inputs((), 2, 4, 6, 3)
    with pytest.raises(ValueError, match="S >= L"):
        transformer_xl_scores(q, k[:, :3], r[:, :3], u, v)
    with pytest.raises(ValueError, match="r must have shape"):
        transformer_xl_scores(q, k, r[:, :5], u, v)
    with pytest.raises(ValueError, match="u must have shape"):
        transformer_xl_scores(q, k, r, u[:1], v)


# --------------------------------------------------------------------------- subspaces of a learned table
def orthonormal(D, k, seed):
    return torch.linalg.qr(torch.randn(D, k, generator=gen(seed), dtype=torch.float64))[0]


def rows_in(basis, n, seed):
    return torch.randn(n, basis.shape[1], generator=gen(seed), dtype=torch.float64) @ basis.T


def test_subspace_overlap_known_answers():
    D = 12
    Q = orthonormal(D, 6, 20)
    a, b = rows_in(Q[:, :3], 20, 21), rows_in(Q[:, 3:], 30, 22)
    assert subspace_overlap(a, b, 3) == pytest.approx(0.0, abs=1e-12)  # orthogonal subspaces
    assert variance_in_subspace(a, b, 3) == pytest.approx(0.0, abs=1e-12)
    a2 = rows_in(Q[:, :3], 25, 23)
    assert subspace_overlap(a, a2, 3) == pytest.approx(1.0, abs=1e-12)  # the same subspace
    assert variance_in_subspace(a, a2, 3) == pytest.approx(1.0, abs=1e-12)
    torch.testing.assert_close(principal_angles(a, b, 3), torch.full((3,), math.pi / 2, dtype=torch.float64))


def test_principal_angle_of_two_lines_and_variance_split():
    e1, e2 = torch.eye(5, dtype=torch.float64)[:2]
    t = torch.randn(9, 1, generator=gen(24), dtype=torch.float64)
    for theta in (0.3, 1.0, 1.4):
        line = t * (math.cos(theta) * e1 + math.sin(theta) * e2)
        assert principal_angles(t * e1, line, 1).item() == pytest.approx(theta, abs=1e-9)
        assert subspace_overlap(t * e1, line, 1) == pytest.approx(math.cos(theta) ** 2, abs=1e-9)
    s = torch.tensor([[1.0], [-1.0], [2.0], [-2.0]], dtype=torch.float64)
    x = torch.cat([s * e1 * 3, s * e2], 0)  # variance 9 : 1 between e1 and e2
    assert variance_in_subspace(x, t * e1, 1) == pytest.approx(0.9)


def test_principal_components_match_the_covariance_eigendecomposition():
    x = torch.randn(40, 6, generator=gen(25), dtype=torch.float64) * torch.tensor([5.0, 3, 2, 1, 0.5, 0.1])
    coords, basis, explained = principal_components(x, 3)
    xc = x - x.mean(0)
    evals, evecs = torch.linalg.eigh(xc.T @ xc)
    evals, evecs = evals.flip(0), evecs.flip(1)
    torch.testing.assert_close(explained, evals[:3] / evals.sum())
    torch.testing.assert_close((basis.T @ evecs[:, :3]).abs(), torch.eye(3, dtype=torch.float64))
    torch.testing.assert_close(coords, xc @ basis)
    with pytest.raises(ValueError, match="k must lie"):
        principal_components(x, 7)


def test_random_subspaces_overlap_about_k_over_D():
    D, k = 64, 8
    overlaps = [subspace_overlap(rows_in(orthonormal(D, k, 30 + s), 40, s), rows_in(orthonormal(D, k, 60 + s), 40, s + 1), k)
                for s in range(20)]
    assert sum(overlaps) / len(overlaps) == pytest.approx(k / D, rel=0.25)


@pytest.mark.parametrize("kwargs,match", [
    ({"dim": 7}, "even"),
    ({"dim": 8, "scaling": {"type": "dynamic", "factor": 2.0}}, "unknown scaling"),
    ({"dim": 8, "scaling": {"type": "yarn", "factor": 2.0}}, "original_max_position_embeddings"),
    ({"dim": 8, "scaling": {"type": "linear", "factor": 0.5}}, ">= 1"),
    ({"dim": 8, "scaling": {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64,
                            "ramp": "cubic"}}, "ramp"),
])
def test_rope_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RotaryEmbedding(**kwargs)
    with pytest.raises(ValueError, match="dim=8"):
        RotaryEmbedding(8)(torch.zeros(3, 6))
