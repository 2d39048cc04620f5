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


def test_sinusoidal_in_float64_keeps_float64_precision():
    """dtype=torch.float64 is not a float32 table cast up: it matches math.sin to 1e-12, and a
    float64 sinusoidal TinyGPT adds that table, not a rounded one."""
    n, dim = 4000, 8
    pe = sinusoidal_encoding(n, dim, dtype=torch.float64)
    assert pe.dtype == torch.float64
    omega = 10000.0 ** (-2 / dim)
    assert abs(pe[n - 1, 2].item() - math.sin((n - 1) * omega)) < 1e-12
    assert (pe - sinusoidal_encoding(n, dim).double()).abs().max() > 1e-9  # float32 would round
    from attnbook.models import TinyGPT, TransformerConfig

    cfg = TransformerConfig(vocab_size=7, d_model=8, n_heads=2, n_layers=1, positional="sinusoidal", max_len=64)
    model = TinyGPT(cfg).double().eval()
    idx = torch.tensor([[1, 2, 3, 4]])
    tokens = model.tok_emb(idx)
    embedded, _ = model._positions(tokens, 0)
    torch.testing.assert_close(embedded - tokens, pe[:4].unsqueeze(0), rtol=0, atol=1e-15)

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
    """The paper's formula: c2c + Q^c_i . K^r_{delta(i,j)} + K^c_j . Q^r_{delta(j,i)}, with its
    2k-valued delta."""
    g = gen(5)
    d = 4
    q, k = torch.randn(n, d, generator=g, dtype=torch.float64), torch.randn(n, d, generator=g, dtype=torch.float64)
    q_pos, k_pos = torch.randn(2 * kmax, d, generator=g, dtype=torch.float64), torch.randn(2 * kmax, d, generator=g, dtype=torch.float64)
    got = disentangled_scores(q, k, q_pos, k_pos, kmax, convention="paper")
    for i in range(n):
        for j in range(n):
            expected = q[i] @ k[j] + q[i] @ k_pos[deberta_delta(i, j, kmax)] + k[j] @ q_pos[deberta_delta(j, i, kmax)]
            assert got[i, j].item() == pytest.approx(expected.item(), rel=1e-9)


def _released_deberta_scores(q, k, q_pos, k_pos, span):
    """The released DeBERTa code's disentangled_att_bias (as Hugging Face's port, which loads
    the checkpoints, writes it), transcribed step by step without the scale: relative
    positions ``q_id - k_id``, c2p gathered at clamp(r + span), p2c computed on the key's row,
    gathered at clamp(-r + span) and transposed."""
    n = q.shape[-2]
    ids = torch.arange(n)
    relative_pos = ids[:, None] - ids[None, :]
    c2p_att = q @ k_pos.T  # (n, 2 span)
    c2p_pos = torch.clamp(relative_pos + span, 0, 2 * span - 1)
    c2p = torch.gather(c2p_att, -1, c2p_pos)
    p2c_att = k @ q_pos.T  # (n keys, 2 span)
    p2c_pos = torch.clamp(-relative_pos + span, 0, 2 * span - 1)
    p2c = torch.gather(p2c_att, -1, p2c_pos).T
    return q @ k.T + c2p + p2c


@pytest.mark.parametrize("n,kmax", [(7, 2), (5, 1), (4, 6), (9, 3)])
def test_disentangled_scores_default_is_the_released_code(n, kmax):
    """The default reads the position-to-content term at delta(i, j), as the released code
    does, and differs from the paper's delta(j, i) wherever the mirrored rows differ."""
    g = gen(6)
    d = 4
    q, k, = (torch.randn(n, d, generator=g, dtype=torch.float64) for _ in range(2))
    q_pos, k_pos = (torch.randn(2 * kmax, d, generator=g, dtype=torch.float64) for _ in range(2))
    released = disentangled_scores(q, k, q_pos, k_pos, kmax)
    torch.testing.assert_close(released, _released_deberta_scores(q, k, q_pos, k_pos, kmax), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(released, disentangled_scores(q, k, q_pos, k_pos, kmax, convention="released"))
    paper = disentangled_scores(q, k, q_pos, k_pos, kmax, convention="paper")
    assert (released - paper).abs().max() > 0.1
    # they agree on the diagonal (delta(i, i) = k either way) and differ only in the p2c term
    torch.testing.assert_close(torch.diagonal(released), torch.diagonal(paper), rtol=1e-12, atol=1e-12)
    p2c_paper = torch.stack([torch.stack([k[j] @ q_pos[deberta_delta(j, i, kmax)] for j in range(n)]) for i in range(n)])
    p2c_released = torch.stack([torch.stack([k[j] @ q_pos[deberta_delta(i, j, kmax)] for j in range(n)]) for i in range(n)])
    torch.testing.assert_close(released - paper, p2c_released - p2c_paper, rtol=1e-10, atol=1e-10)


def test_deberta_delta_takes_2k_values_and_tables_have_2k_rows():
    assert sorted({deberta_delta(i, j, 3) for i in range(20) for j in range(20)}) == list(range(6))
    q = torch.randn(5, 4)
    with pytest.raises(ValueError, match=r"2\*max_distance"):
        disentangled_scores(q, q, torch.zeros(7, 4), torch.zeros(7, 4), 3)  # the 2k + 1 rows of a clip to [-k, k]
    with pytest.raises(ValueError, match="max_distance must be an integer >= 1"):
        disentangled_scores(q, q, torch.zeros(0, 4), torch.zeros(0, 4), 0)


@pytest.mark.parametrize("convention", ["released", "paper"])
def test_disentangled_position_terms_depend_only_on_relative_distance(convention):
    """Shift test: the same content placed t positions later gives the same scores among those tokens."""
    g = gen(12)
    n, t, d, kmax = 6, 4, 8, 3
    q, k = torch.randn(n + t, d, generator=g, dtype=torch.float64), torch.randn(n + t, d, generator=g, dtype=torch.float64)
    q_pos, k_pos = torch.randn(2 * kmax, d, generator=g, dtype=torch.float64), torch.randn(2 * kmax, d, generator=g, dtype=torch.float64)
    early = disentangled_scores(q[t:], k[t:], q_pos, k_pos, kmax, convention=convention)  # positions 0..n-1
    late = disentangled_scores(q, k, q_pos, k_pos, kmax, convention=convention)[t:, t:]  # positions t..t+n-1
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


# --------------------------------------------------------------------------- T5: invalid settings, more references
T5_SETTINGS = [  # (bidirectional, num_buckets, max_distance): max_exact = num_buckets // 4 or // 2
    (True, 32, 128), (False, 32, 128), (True, 16, 20), (False, 8, 64),
    (True, 4, 2), (False, 2, 2),  # the smallest valid: max_exact 1, max_distance 2
    (True, 32, 9), (False, 32, 17),  # max_distance = max_exact + 1
    (True, 33, 40), (False, 11, 7),  # odd bucket counts
    (True, 64, 300), (False, 10, 1000),
]


@pytest.mark.parametrize("bidirectional,num_buckets,max_distance", T5_SETTINGS)
def test_t5_buckets_match_the_released_definition_and_grow_with_the_distance(bidirectional, num_buckets,
                                                                            max_distance):
    rel = torch.arange(-300, 301)
    got = t5_relative_position_bucket(rel, bidirectional, num_buckets, max_distance).tolist()
    assert got == [t5_bucket_reference(r, bidirectional, num_buckets, max_distance) for r in range(-300, 301)]
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    bucket = dict(zip(range(-300, 301), got))
    past = [bucket[-n] for n in range(301)]  # keys before the query, by distance
    assert past[0] == 0 and past == sorted(past) and max(past) <= per_direction - 1
    if max_distance <= 300:  # every distance >= max_distance shares the last bucket
        assert past[max_distance:] == [per_direction - 1] * (301 - max_distance)
    assert all(b == min(n, per_direction - 1) for n, b in enumerate(past[: per_direction // 2]))  # exact ones
    if bidirectional:  # keys after the query: the upper half, the same shape
        assert [bucket[n] for n in range(1, 301)] == [per_direction + b for b in past[1:]]
    else:  # a causal model puts every future key in bucket 0
        assert all(bucket[n] == 0 for n in range(1, 301))


@pytest.mark.parametrize("bidirectional,num_buckets,max_distance,max_exact", [
    (True, 32, 8, 8), (True, 32, 5, 8), (False, 32, 16, 16), (False, 32, 10, 16), (True, 16, 4, 4),
    (False, 4, 2, 2), (True, 32, 1, 8),
])
def test_t5_max_distance_not_above_max_exact_is_refused(bidirectional, num_buckets, max_distance, max_exact):
    """With max_distance <= max_exact the log-spaced formula divides by log(max_distance /
    max_exact) <= 0: it returned buckets of the other direction, negative buckets or -2^63."""
    pattern = (rf"t5_relative_position_bucket: max_distance={max_distance} must be greater than "
               rf"max_exact={max_exact} \(num_buckets={num_buckets}")
    with pytest.raises(ValueError, match=pattern):
        t5_relative_position_bucket(torch.arange(-30, 31), bidirectional, num_buckets, max_distance)
    with pytest.raises(ValueError, match=rf"T5RelativeBias: max_distance={max_distance} .*max_exact={max_exact}"):
        T5RelativeBias(2, num_buckets, max_distance, bidirectional=bidirectional)


def test_a_t5_model_with_a_degenerate_max_distance_fails_at_construction():
    """TransformerConfig(positional="t5", t5_max_distance=10) trained and generated with distance
    26 in the bucket of distance 0."""
    with pytest.raises(ValueError, match="max_distance"):
        TinyGPT(TransformerConfig(vocab_size=11, d_model=16, n_heads=4, n_layers=1, max_len=16, positional="t5",
                                  t5_max_distance=10))
    with pytest.raises(ValueError, match=r"T5RelativeBias: max_distance=10 must be greater than max_exact=16"):
        T5RelativeBias(4, 32, 10, bidirectional=False)  # what TinyGPT builds from that config
    T5RelativeBias(4, 32, 10, bidirectional=True)  # an encoder's max_exact is 8: fine


# --------------------------------------------------------------------------- RoPE in bfloat16 / float16
ROPE_SCALINGS = [None, {"type": "linear", "factor": 4.0}, {"type": "ntk", "factor": 4.0},
                 {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}]


@pytest.mark.parametrize("scaling", ROPE_SCALINGS)
@pytest.mark.parametrize("cast", ["bfloat16", "half", "nested"])
def test_rope_cast_to_half_precision_keeps_float32_frequencies(scaling, cast):
    """model.to(torch.bfloat16) rounded the inv_freq buffer: angles at position 4000 were off by
    up to 1.75 rad."""
    reference = RotaryEmbedding(64, scaling=scaling)
    rope = RotaryEmbedding(64, scaling=scaling)
    if cast == "bfloat16":
        rope = rope.to(torch.bfloat16)
    elif cast == "half":
        rope = rope.half()
    else:  # inside a model cast as a whole, then cast back
        rope = torch.nn.Sequential(rope).to(torch.bfloat16).float().to(torch.float16)[0]
    assert rope.inv_freq.dtype == torch.float32 and torch.equal(rope.inv_freq, reference.inv_freq)
    positions = torch.arange(8193)
    angles = rope.angles(positions)
    assert angles.dtype == torch.float32 and torch.equal(angles, reference.angles(positions))
    ref_angles = reference.angles(positions)
    assert torch.equal(torch.cos(angles), torch.cos(ref_angles)) and torch.equal(torch.sin(angles), torch.sin(ref_angles))
    exact = positions.double()[:, None] * reference._inv_freq64  # float64 angles
    torch.testing.assert_close(angles.double(), exact, rtol=2**-22, atol=0)  # float32 rounding, twice
    assert "inv_freq" not in rope.state_dict()  # not saved: checkpoints never held it
    x = torch.randn(2, 3, 16, 64, generator=gen(20))
    torch.testing.assert_close(rope(x), reference(x), rtol=0, atol=0)  # float32 inputs: the same numbers


def test_rope_cast_to_float64_gets_float64_frequencies_and_back():
    reference = RotaryEmbedding(64, scaling={"type": "linear", "factor": 2.0})
    wide = RotaryEmbedding(64, scaling={"type": "linear", "factor": 2.0}).double()
    assert wide.inv_freq.dtype == torch.float64 and torch.equal(wide.inv_freq, reference._inv_freq64)
    positions = torch.arange(0, 8193, 64)
    torch.testing.assert_close(wide.angles(positions), positions.double()[:, None] * reference._inv_freq64,
                               rtol=2**-52, atol=0)
    assert torch.equal(wide.to(torch.bfloat16).float().inv_freq, reference.inv_freq)  # float32 again, exactly


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_rotates_half_precision_inputs_within_their_rounding(dtype, interleaved):
    """A module cast to the inputs' dtype rotates them as the float64 rotation does, up to the
    rounding of the result (eps/2 relative) and the float32 angles' rounding (|m| 2^-23 rad)."""
    positions = torch.tensor([0, 1, 17, 1000, 4000, 8191])
    x = torch.randn(2, 6, 64, generator=gen(21)).to(dtype)
    rope = RotaryEmbedding(64, interleaved=interleaved).to(dtype)
    got = rope(x, positions=positions)
    assert got.dtype == dtype
    theta = 10000.0 ** -(torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    expected = torch.stack([x[:, m].double() @ rotation_matrix(positions[m].item(), theta, interleaved).T
                            for m in range(6)], dim=1)
    pairs = (x.double()[..., 0::2] ** 2 + x.double()[..., 1::2] ** 2).sqrt() if interleaved else (
        (x.double()[..., :32] ** 2 + x.double()[..., 32:] ** 2).sqrt())
    pair_norm = pairs.repeat_interleave(2, -1) if interleaved else torch.cat((pairs, pairs), -1)
    angle_error = positions.double()[None, :, None] * 2.0**-23 + 1e-6
    bound = torch.finfo(dtype).eps / 2 * expected.abs() + angle_error * pair_norm
    assert ((got.double() - expected).abs() <= bound).all()


def test_rope_integer_positions_are_converted_before_multiplying():
    rope = RotaryEmbedding(16, base=500.0)
    x = torch.randn(5, 16, generator=gen(22))
    for dtype in (torch.int32, torch.int64, torch.int16):
        torch.testing.assert_close(rope(x, positions=torch.arange(1000, 1005, dtype=dtype)),
                                   rope(x, positions=torch.arange(1000, 1005).double()), rtol=0, atol=0)
    torch.testing.assert_close(rope(x, offset=1000), rope(x, positions=torch.arange(1000, 1005)))


# --------------------------------------------------------------------------- float masks and tables of another dtype
def test_float_masks_and_tables_of_another_dtype_are_cast_to_q():
    g = gen(23)
    q, k, v = (torch.randn(2, 5, 8, generator=g, dtype=torch.float64) for _ in range(3))
    rel = torch.randn(5, 8, generator=g)  # float32 tables, float64 queries
    mask = torch.zeros(5, 5).masked_fill(torch.ones(5, 5).triu(1).bool(), -math.inf)  # float32 additive mask
    got = shaw_relative_attention(q, k, v, rel, rel, 2, mask)
    torch.testing.assert_close(got, shaw_relative_attention(q, k, v, rel.double(), rel.double(), 2, is_causal=True))
    torch.testing.assert_close(multiplicative_scores(q, k, torch.ones(3), 2), q @ k.transpose(-2, -1))


# --------------------------------------------------------------------------- bad input, table-driven
def _bad_positional_calls():
    g = gen(24)
    q = torch.randn(4, 8, generator=g)
    rope = RotaryEmbedding(8)
    emb = LearnedPositionalEmbedding(6, 4)
    xl = xl_inputs((), 2, 4, 6, 3)
    yarn = dict(dim=16, base=10000.0, factor=4.0, original_max_position_embeddings=64)
    return [  # (call, exception, pattern)
        (lambda: sinusoidal_encoding(3.5, 8), TypeError, r"sinusoidal_encoding: n_positions must be an integer"),
        (lambda: sinusoidal_encoding(-1, 8), ValueError, r"sinusoidal_encoding: n_positions must be an integer >= 0"),
        (lambda: sinusoidal_encoding(4, 8.0), TypeError, r"sinusoidal_encoding: dim"),
        (lambda: sinusoidal_encoding(4, 8, base=0.0), ValueError, r"sinusoidal_encoding: base must be a finite number > 0"),
        (lambda: sinusoidal_encoding(4, 8, base=math.nan), ValueError, r"sinusoidal_encoding: base .*nan"),
        (lambda: LearnedPositionalEmbedding(0, 4), ValueError, r"LearnedPositionalEmbedding: max_len must be an integer >= 1"),
        (lambda: LearnedPositionalEmbedding(4.0, 4), TypeError, r"LearnedPositionalEmbedding: max_len"),
        (lambda: emb(-1), ValueError, r"LearnedPositionalEmbedding: positions must be an integer >= 0"),
        (lambda: emb(2.0), TypeError, r"LearnedPositionalEmbedding: positions"),
        (lambda: emb(torch.tensor([1.0])), TypeError, r"LearnedPositionalEmbedding: positions must be an int or an integer"),
        (lambda: relative_positions(2.5), TypeError, r"relative_positions: q_len must be an integer"),
        (lambda: relative_positions(2, -1), ValueError, r"relative_positions: k_len must be an integer >= 0"),
        (lambda: shaw_relative_attention(q, q, q, torch.zeros(1, 8), torch.zeros(1, 8), -1), ValueError,
         r"shaw_relative_attention: max_distance must be an integer >= 0"),
        (lambda: shaw_relative_attention(q, q, q, torch.zeros(3, 8), torch.zeros(3, 8), 1.0), TypeError,
         r"shaw_relative_attention: max_distance"),
        (lambda: shaw_relative_attention(q, q, q, torch.zeros(3, 8).long(), torch.zeros(3, 8), 1), TypeError,
         r"shaw_relative_attention: rel_k must be a floating-point"),
        (lambda: shaw_relative_attention(q, q, q, torch.zeros(3, 8), torch.zeros(3, 8), 1, scale=math.nan),
         ValueError, r"shaw_relative_attention: scale must be a finite number"),
        (lambda: shaw_relative_attention(q, q, q, torch.zeros(3, 8), torch.zeros(3, 8), 1, is_causal="no"),
         TypeError, r"shaw_relative_attention: is_causal must be a bool"),
        (lambda: untied_scores(q, q[:3], *[torch.zeros(8, 2)] * 4), ValueError, r"untied_scores: x must be .* and pos"),
        (lambda: untied_scores(q, q, torch.zeros(8, 2), torch.zeros(8, 3), torch.zeros(8, 2), torch.zeros(8, 2)),
         ValueError, r"untied_scores: W_q, W_k must both be"),
        (lambda: untied_scores(q, q.long(), *[torch.zeros(8, 2)] * 4), TypeError, r"untied_scores: pos must be a floating"),
        (lambda: multiplicative_scores(q, q, torch.ones(2), -1), ValueError,
         r"multiplicative_scores: max_distance must be an integer >= 0"),
        (lambda: multiplicative_scores(q, q.double(), torch.ones(2), 1), TypeError, r"multiplicative_scores: q and k must share"),
        (lambda: multiplicative_scores(q, q[:, :4], torch.ones(2), 1), ValueError, r"multiplicative_scores: q and k must be"),
        (lambda: disentangled_scores(q, q, torch.zeros(2, 8), torch.zeros(2, 8), 1.0), TypeError,
         r"disentangled_scores: max_distance"),
        (lambda: transformer_xl_relative_embeddings(10, 7), ValueError, r"transformer_xl_relative_embeddings: dim"),
        (lambda: transformer_xl_relative_embeddings(2.5, 8), TypeError, r"transformer_xl_relative_embeddings: n must"),
        (lambda: transformer_xl_scores(*xl[:2], xl[2].long(), *xl[3:]), TypeError,
         r"transformer_xl_scores: r must be a floating-point"),
        (lambda: transformer_xl_scores(*xl, return_terms="yes"), TypeError, r"transformer_xl_scores: return_terms"),
        (lambda: t5_relative_position_bucket(torch.tensor([1.0])), TypeError,
         r"t5_relative_position_bucket: relative_position must be an integer tensor, got torch.float32"),
        (lambda: t5_relative_position_bucket(torch.tensor([True])), TypeError, r"t5_relative_position_bucket: relative_position"),
        (lambda: t5_relative_position_bucket(torch.tensor([1]), True, 32.0), TypeError,
         r"t5_relative_position_bucket: num_buckets must be an integer"),
        (lambda: t5_relative_position_bucket(torch.tensor([1]), True, 3), ValueError,
         r"t5_relative_position_bucket: num_buckets=3 is too small, max_exact = 0 .* use num_buckets >= 4"),
        (lambda: t5_relative_position_bucket(torch.tensor([1]), False, 1), ValueError,
         r"t5_relative_position_bucket: num_buckets=1 is too small, .* >= 2"),
        (lambda: t5_relative_position_bucket(torch.tensor([1]), "yes"), TypeError,
         r"t5_relative_position_bucket: bidirectional must be a bool"),
        (lambda: t5_relative_position_bucket(torch.tensor([1]), True, 32, 0), ValueError,
         r"t5_relative_position_bucket: max_distance must be an integer >= 1"),
        (lambda: T5RelativeBias(0), ValueError, r"T5RelativeBias: n_heads must be an integer >= 1"),
        (lambda: T5RelativeBias(2, num_buckets=16.0), TypeError, r"T5RelativeBias: num_buckets"),
        (lambda: T5RelativeBias(2)(2.5), TypeError, r"T5RelativeBias: q_len must be an integer"),
        (lambda: alibi_slopes(0), ValueError, r"alibi_slopes: n_heads must be an integer >= 1, got 0"),
        (lambda: alibi_slopes(8.0), TypeError, r"alibi_slopes: n_heads"),
        (lambda: alibi_bias(8, -1), ValueError, r"alibi_bias: q_len must be an integer >= 0"),
        (lambda: alibi_bias(8, 4, is_causal="no"), TypeError, r"alibi_bias: is_causal must be a bool"),
        (lambda: yarn_inv_freq(**{**yarn, "dim": 15}), ValueError, r"yarn_inv_freq: dim must be a positive even"),
        (lambda: yarn_inv_freq(**{**yarn, "base": 1.0}), ValueError, r"yarn_inv_freq: base must be a finite number > 1"),
        (lambda: yarn_inv_freq(**{**yarn, "factor": 0.0}), ValueError, r"yarn_inv_freq: scaling factor must be >= 1"),
        (lambda: yarn_inv_freq(**{**yarn, "factor": math.nan}), ValueError, r"yarn_inv_freq: scaling factor .*nan"),
        (lambda: yarn_inv_freq(**{**yarn, "original_max_position_embeddings": 0}), ValueError,
         r"yarn_inv_freq: original_max_position_embeddings must be an integer >= 1"),
        (lambda: yarn_inv_freq(**yarn, beta_fast=1.0, beta_slow=1.0), ValueError,
         r"yarn_inv_freq: beta_slow must be smaller than beta_fast"),
        (lambda: yarn_inv_freq(**yarn, beta_slow=0.0), ValueError, r"yarn_inv_freq: beta_slow must be a finite number > 0"),
        (lambda: RotaryEmbedding(8.0), TypeError, r"RotaryEmbedding: dim must be an integer"),
        (lambda: RotaryEmbedding(8, base=0.0), ValueError, r"RotaryEmbedding: base must be a finite number > 0, got 0.0"),
        (lambda: RotaryEmbedding(8, base=-10.0), ValueError, r"RotaryEmbedding: base"),
        (lambda: RotaryEmbedding(8, base=math.nan), ValueError, r"RotaryEmbedding: base"),
        (lambda: RotaryEmbedding(8, interleaved="yes"), TypeError, r"RotaryEmbedding: interleaved must be a bool"),
        (lambda: RotaryEmbedding(8, scaling="linear"), TypeError, r"RotaryEmbedding: scaling must be a dict"),
        (lambda: RotaryEmbedding(8, scaling={"type": "linear"}), ValueError, r"RotaryEmbedding: linear scaling needs a 'factor'"),
        (lambda: RotaryEmbedding(8, scaling={"type": "linear", "factr": 4.0}), ValueError,
         r"RotaryEmbedding: unknown key\(s\) \['factr'\] in linear scaling"),
        (lambda: RotaryEmbedding(8, scaling={"type": "ntk", "factor": math.nan}), ValueError,
         r"RotaryEmbedding: scaling factor must be a finite number"),
        (lambda: RotaryEmbedding(8, scaling={"type": "ntk", "factor": -2.0}), ValueError,
         r"RotaryEmbedding: scaling factor must be >= 1"),
        (lambda: RotaryEmbedding(8, scaling={"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 0}),
         ValueError, r"yarn_inv_freq: original_max_position_embeddings"),
        (lambda: rope(q.long()), TypeError, r"RotaryEmbedding: x must be a floating-point"),
        (lambda: rope(q, offset=2.5), TypeError, r"RotaryEmbedding: offset must be an integer"),
        (lambda: rope(q, offset=-1), ValueError, r"RotaryEmbedding: offset must be an integer >= 0"),
        (lambda: rope(q, positions=torch.arange(4), offset=3), ValueError, r"RotaryEmbedding: give positions or offset"),
        (lambda: rope(q, positions=torch.ones(4, dtype=torch.bool)), TypeError, r"RotaryEmbedding: positions must be integer"),
        (lambda: rope(q, positions=torch.tensor([0.0, 1.0, math.nan, 3.0])), ValueError,
         r"RotaryEmbedding: positions must be finite"),
        (lambda: rope(q, positions=torch.arange(5)), ValueError,
         r"RotaryEmbedding: positions of shape \(5,\) must broadcast to .* \(4,\)"),
        (lambda: rope(q[0]), ValueError, r"RotaryEmbedding: x must be \(\.\.\., seq, dim\)"),
        (lambda: rope.angles([1, 2]), TypeError, r"RotaryEmbedding.angles: positions must be a torch.Tensor"),
        (lambda: rope_complex(q, torch.arange(4), base=0.0), ValueError, r"rope_complex: base must be a finite number > 0"),
        (lambda: rope_complex(q[:, :7], torch.arange(4)), ValueError, r"rope_complex: x must have an even"),
        (lambda: rope_complex(q, torch.arange(3)), ValueError, r"rope_complex: positions of shape \(3,\)"),
        (lambda: rope_complex(q, torch.arange(4), interleaved="no"), TypeError, r"rope_complex: interleaved"),
        (lambda: principal_components(q, 4), ValueError, r"principal_components: k must lie in \[1, 3\] .*got 4"),
        (lambda: principal_components(q, 0), ValueError, r"principal_components: k must be an integer >= 1"),
        (lambda: principal_components(q, 1.5), TypeError, r"principal_components: k must be an integer"),
        (lambda: principal_components(q[None], 1), ValueError, r"principal_components: x must be a \(n, D\) matrix"),
        (lambda: principal_angles(q, torch.randn(4, 5), 1), ValueError, r"principal_angles: b must be a \(n, 8\) matrix"),
        (lambda: subspace_overlap(q, torch.randn(4, 5), 1), ValueError, r"subspace_overlap: b must be a \(n, 8\) matrix"),
        (lambda: variance_in_subspace(torch.ones(4, 8), q, 1), ValueError, r"variance_in_subspace: the rows of x .* do not vary"),
        (lambda: variance_in_subspace(q[:, :3], q, 1), ValueError, r"variance_in_subspace: x must be a \(n, 8\) matrix"),
    ]


@pytest.mark.parametrize("index", range(len(_bad_positional_calls())))
def test_bad_arguments_raise_errors_naming_the_function_and_the_argument(index):
    call, error, pattern = _bad_positional_calls()[index]
    with pytest.raises(error, match=pattern):
        call()


def test_empty_sequences_give_empty_results():
    assert sinusoidal_encoding(0, 8).shape == (0, 8)
    assert relative_positions(0, 3).shape == (0, 3)
    assert RotaryEmbedding(8)(torch.zeros(2, 0, 8)).shape == (2, 0, 8)
    assert rope_complex(torch.zeros(2, 0, 8), torch.arange(0)).shape == (2, 0, 8)
    assert T5RelativeBias(2, 8, 16)(0, 3).shape == (1, 2, 0, 3)
    assert alibi_bias(4, 0, 3).shape == (1, 4, 0, 3)
    assert LearnedPositionalEmbedding(4, 2)(0).shape == (0, 2)
