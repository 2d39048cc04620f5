"""Tests of attnbook.rnn: hand-computed 2-3 token examples for each score, masking, shapes, local
attention's centre and window, coverage, decoding (beam 1 == greedy), and a short training run."""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch

from attnbook import data, rnn
from attnbook.core import additive_score
from hypothesis import given
from hypothesis import strategies as st


def _set(param: torch.Tensor, value) -> None:
    with torch.no_grad():
        param.copy_(torch.as_tensor(value, dtype=param.dtype).reshape(param.shape))


def _softmax(xs):
    exps = [math.exp(x) for x in xs]
    return [e / sum(exps) for e in exps]


# ---------------------------------------------------------------------------------------------
# Bahdanau
# ---------------------------------------------------------------------------------------------
def _bahdanau_2x2(coverage=False):
    """Query dim 1, key dim 1, hidden 2: small enough to compute by hand."""
    attn = rnn.BahdanauAttention(1, 1, 2, coverage=coverage)
    _set(attn.W.weight, [[1.0], [0.0]])   # W s = (s, 0)
    _set(attn.U.weight, [[0.0], [1.0]])   # U h = (0, h)
    _set(attn.v, [1.0, 2.0])              # e = tanh(s) + 2 tanh(h)
    if coverage:
        _set(attn.w_c, [0.0, -1.0])       # e = tanh(s) + 2 tanh(h - c)
    return attn


def test_bahdanau_hand_computed():
    attn = _bahdanau_2x2()
    s, h = 0.5, [1.0, -1.0, 0.0]
    ctx, w = attn(torch.tensor([[s]]), torch.tensor([[[x] for x in h]]))
    e = [math.tanh(s) + 2 * math.tanh(x) for x in h]
    expected = _softmax(e)
    assert torch.allclose(w, torch.tensor([expected]), atol=1e-6)
    assert ctx.item() == pytest.approx(sum(a * x for a, x in zip(expected, h)), abs=1e-6)


def test_bahdanau_coverage_enters_the_score():
    attn = _bahdanau_2x2(coverage=True)
    s, h, c = 0.0, [1.0, 1.0], [0.0, 2.0]
    _, w = attn(torch.tensor([[s]]), torch.tensor([[[x] for x in h]]), coverage=torch.tensor([c]))
    expected = _softmax([2 * math.tanh(x - cj) for x, cj in zip(h, c)])
    assert torch.allclose(w, torch.tensor([expected]), atol=1e-6)
    assert w[0, 0] > w[0, 1]  # the already covered key loses weight
    with pytest.raises(ValueError, match="coverage"):
        _bahdanau_2x2()(torch.tensor([[s]]), torch.tensor([[[x] for x in h]]), coverage=torch.tensor([c]))


def test_bahdanau_equals_core_additive_score(gen):
    attn = rnn.BahdanauAttention(5, 6, 7)
    q, k = torch.randn(3, 5, generator=gen), torch.randn(3, 4, 6, generator=gen)
    expected = additive_score(q.unsqueeze(1), k, attn.W.weight, attn.U.weight, attn.v).squeeze(1)
    assert torch.allclose(attn.scores(q, attn.project_keys(k)), expected, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Luong
# ---------------------------------------------------------------------------------------------
def test_luong_dot_hand_computed():
    attn = rnn.LuongAttention(2, 2, method="dot")
    q = torch.tensor([[1.0, 2.0]])
    k = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    ctx, w = attn(q, k)
    expected = _softmax([1.0, 2.0, 3.0])
    assert torch.allclose(w, torch.tensor([expected]), atol=1e-6)
    assert torch.allclose(ctx, torch.tensor([expected]) @ k[0], atol=1e-6)


def test_luong_general_hand_computed():
    attn = rnn.LuongAttention(1, 2, method="general")
    _set(attn.W_a, [[2.0, -1.0]])  # e = q (2 k_1 - k_2)
    q, k = torch.tensor([[0.5]]), torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    _, w = attn(q, k)
    assert torch.allclose(w, torch.tensor([_softmax([1.0, -0.5])]), atol=1e-6)


def test_luong_concat_hand_computed():
    attn = rnn.LuongAttention(1, 1, method="concat", hidden_dim=2)
    _set(attn.W_a.weight, [[1.0, 1.0], [0.0, -1.0]])  # W_a [q; k] = (q + k, -k)
    _set(attn.v_a, [1.0, 3.0])
    q, ks = 0.2, [0.3, -0.7]
    _, w = attn(torch.tensor([[q]]), torch.tensor([[[x] for x in ks]]))
    e = [math.tanh(q + x) + 3 * math.tanh(-x) for x in ks]
    assert torch.allclose(w, torch.tensor([_softmax(e)]), atol=1e-6)


def test_luong_rejects_bad_arguments():
    with pytest.raises(ValueError, match="method"):
        rnn.LuongAttention(2, 2, method="cosine")
    with pytest.raises(ValueError, match="query_dim == key_dim"):
        rnn.LuongAttention(2, 3, method="dot")
    with pytest.raises(ValueError, match="keys"):
        rnn.LuongAttention(2, 2, method="dot")(torch.zeros(1, 2), torch.zeros(1, 3, 5))


# ---------------------------------------------------------------------------------------------
# Masking and shapes, for every attention module
# ---------------------------------------------------------------------------------------------
MODULES = [
    lambda: rnn.BahdanauAttention(4, 6, 5),
    lambda: rnn.BahdanauAttention(4, 6, 5, coverage=True),
    lambda: rnn.LuongAttention(6, 6, method="dot"),
    lambda: rnn.LuongAttention(4, 6, method="general"),
    lambda: rnn.LuongAttention(4, 6, method="concat"),
    lambda: rnn.LocalAttention(4, 6, window=2, mode="local-p"),
    lambda: rnn.LocationAwareAttention(4, 6, 5, n_filters=3, kernel_size=3),
    lambda: rnn.LocationAwareAttention(4, 6, 5, location=False),
]


@pytest.mark.parametrize("make", MODULES)
def test_masked_positions_get_exactly_zero_weight(make, gen):
    attn = make()
    B, S = 3, 5
    q, k = torch.randn(B, attn.query_dim, generator=gen), torch.randn(B, S, 6, generator=gen)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    ctx, w = attn(q, k, key_padding_mask=~mask)  # True = padding, as in PyTorch
    assert ctx.shape == (B, 6) and w.shape == (B, S)
    assert (w[~mask] == 0).all()
    assert torch.allclose(ctx, (w.unsqueeze(1) @ k).squeeze(1), atol=1e-6)
    if not isinstance(attn, rnn.LocalAttention):  # global weights are a distribution over real tokens
        assert torch.allclose(w.sum(-1), torch.ones(B), atol=1e-6)
    # changing a masked key changes nothing
    k2 = k.clone()
    k2[~mask] = 100.0
    ctx2, w2 = attn(q, k2, key_padding_mask=~mask)
    assert torch.allclose(w, w2, atol=1e-6) and torch.allclose(ctx, ctx2, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Local attention
# ---------------------------------------------------------------------------------------------
def test_local_p_centre_formula_and_window(gen):
    attn = rnn.LocalAttention(3, 4, window=2, mode="local-p")
    q, k = torch.randn(2, 3, generator=gen), torch.randn(2, 9, 4, generator=gen)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False  # lengths 9 and 6
    p = attn.centre(q, mask.sum(-1))
    expected = torch.tensor([9.0, 6.0]) * torch.sigmoid(attn.v_p(torch.tanh(attn.W_p(q)))).squeeze(-1)
    assert torch.allclose(p, expected)
    assert ((p >= 0) & (p <= torch.tensor([9.0, 6.0]))).all()
    _, w = attn(q, k, key_padding_mask=~mask)
    s = torch.arange(9.0)
    outside = (s[None, :] - p[:, None]).abs() > 2
    assert (w[outside] == 0).all() and (w[~mask] == 0).all()
    # inside the window: softmax of the general score over the window, times the Gaussian (sigma = D/2)
    inside = ~outside & mask
    scores = attn.score.scores(q, k)
    for b in range(2):
        align = torch.softmax(scores[b][inside[b]], -1)
        gauss = torch.exp(-((s[inside[b]] - p[b]) ** 2) / (2 * 1.0**2))
        assert torch.allclose(w[b][inside[b]], align * gauss, atol=1e-6)


def test_local_m_centre_is_the_step_and_needs_it(gen):
    attn = rnn.LocalAttention(3, 4, window=1, mode="local-m")
    q, k = torch.randn(1, 3, generator=gen), torch.randn(1, 6, 4, generator=gen)
    _, w = attn(q, k, step=3)
    assert (w[0, [0, 1, 5]] == 0).all() and (w[0, 2:5] > 0).all()
    assert w[0, 3].item() == pytest.approx(torch.softmax(attn.score.scores(q, k)[0, 2:5], -1)[1].item(), abs=1e-6)
    with pytest.raises(ValueError, match="step"):
        attn(q, k)


# ---------------------------------------------------------------------------------------------
# Coverage
# ---------------------------------------------------------------------------------------------
def test_coverage_loss_hand_computed():
    a = torch.tensor([[0.7, 0.2, 0.1]])
    c = torch.tensor([[0.5, 0.0, 1.5]])
    assert rnn.coverage_loss(a, c).item() == pytest.approx(0.5 + 0.0 + 0.1)
    assert rnn.coverage_loss(a, torch.zeros_like(a)).item() == 0.0
    with pytest.raises(ValueError, match="same shape"):
        rnn.coverage_loss(a, c[:, :2])


def test_accumulated_coverage_and_repeated_attention():
    w = torch.tensor([[[1.0, 0.0], [0.5, 0.5], [1.0, 0.0]]])
    assert torch.equal(rnn.accumulated_coverage(w), torch.tensor([[[0.0, 0.0], [1.0, 0.0], [1.5, 0.5]]]))
    assert rnn.repeated_attention(w).item() == pytest.approx(1.5)  # position 0 got 2.5 units
    assert rnn.repeated_attention(w, torch.tensor([[True, True, False]])).item() == pytest.approx(0.5)


def test_seq2seq_coverage_accumulates_its_own_weights(gen):
    torch.manual_seed(0)
    model = rnn.Seq2Seq(7, 6, attention="bahdanau", coverage=True, hidden=8, emb_dim=4)
    src = torch.randint(3, 7, (2, 5), generator=gen)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[1, 3:] = False
    out = model(src, mask, torch.randint(3, 6, (2, 4), generator=gen))
    assert torch.allclose(out.coverage, rnn.accumulated_coverage(out.weights), atol=1e-6)
    assert (out.coverage[:, 0] == 0).all()


# ---------------------------------------------------------------------------------------------
# Location-aware attention
# ---------------------------------------------------------------------------------------------
def _location_scores_by_loops(attn, query, keys, prev):
    """e_ij = w . tanh(W s + V h_j + U f_ij + b), f_ij[c] = sum_t F[c, t] prev[j + t - K//2]."""
    B, S = prev.shape
    K = attn.F.kernel_size[0]
    filters = attn.F.weight[:, 0]  # (n_filters, K)
    scores = torch.zeros(B, S)
    for b in range(B):
        for j in range(S):
            f = torch.zeros(filters.shape[0])
            for t in range(K):
                if 0 <= j + t - K // 2 < S:
                    f = f + filters[:, t] * prev[b, j + t - K // 2]
            hidden = attn.W.weight @ query[b] + attn.V.weight @ keys[b, j] + attn.U.weight @ f + attn.b
            scores[b, j] = attn.w @ torch.tanh(hidden)
    return scores


@given(B=st.integers(1, 3), S=st.integers(1, 9), K=st.sampled_from([1, 3, 5, 7]), seed=st.integers(0, 99))
def test_location_aware_scores_match_loops(B, S, K, seed):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    attn = rnn.LocationAwareAttention(3, 4, 5, n_filters=2, kernel_size=K)
    with torch.no_grad():
        attn.b.normal_(generator=g)
    q, k = torch.randn(B, 3, generator=g), torch.randn(B, S, 4, generator=g)
    prev = torch.rand(B, S, generator=g).softmax(-1)
    with torch.no_grad():
        got = attn.scores(q, attn.V(k), prev)
        _, w = attn(q, k, prev_weights=prev)
    expected = _location_scores_by_loops(attn, q, k, prev)
    assert torch.allclose(got, expected, atol=1e-5)
    assert torch.allclose(w, expected.softmax(-1), atol=1e-5)


def test_location_aware_shapes_mask_and_padding(gen):
    torch.manual_seed(0)
    attn = rnn.LocationAwareAttention(4, 6, 5, n_filters=3, kernel_size=5)
    B, T, S = 3, 4, 7
    keys = torch.randn(B, S, 6, generator=gen)
    lengths = torch.tensor([7, 5, 2])
    mask = torch.arange(S)[None, :] < lengths[:, None]
    queries = torch.randn(B, T, 4, generator=gen)
    with torch.no_grad():
        ctx, w = attn(queries[:, 0], keys, key_padding_mask=~mask)
        weights = attn.align(queries, keys, key_padding_mask=~mask)
        # the padded frames are invisible: the short example alone aligns the same way
        alone = attn.align(queries[2:], keys[2:, :2], key_padding_mask=~mask[2:, :2])
    assert ctx.shape == (B, 6) and w.shape == (B, S) and weights.shape == (B, T, S)
    assert (weights[~mask.unsqueeze(1).expand(-1, T, -1)] == 0).all()
    assert torch.allclose(weights.sum(-1), torch.ones(B, T), atol=1e-6)
    assert torch.allclose(alone, weights[2:, :, :2], atol=1e-6)
    # step 0 starts from a one-hot on the first frame
    start = torch.zeros(B, S)
    start[:, 0] = 1.0
    with torch.no_grad():
        assert torch.allclose(attn(queries[:, 0], keys, key_padding_mask=~mask, prev_weights=start)[1], w)


def test_location_aware_with_U_zero_is_additive_attention(gen):
    torch.manual_seed(0)
    attn = rnn.LocationAwareAttention(4, 6, 5)
    content = rnn.LocationAwareAttention(4, 6, 5, location=False)
    content.load_state_dict({k: v for k, v in attn.state_dict().items() if k in content.state_dict()})
    with torch.no_grad():
        attn.U.weight.zero_()
    q, k = torch.randn(3, 4, generator=gen), torch.randn(3, 8, 6, generator=gen)
    prev = torch.rand(3, 8, generator=gen).softmax(-1)
    expected = additive_score(q.unsqueeze(1), k, attn.W.weight, attn.V.weight, attn.w).squeeze(1)
    with torch.no_grad():
        assert torch.allclose(attn.scores(q, attn.V(k), prev), expected, atol=1e-6)
        assert torch.allclose(content(q, k, prev_weights=prev)[1], expected.softmax(-1), atol=1e-6)
        # content only: identical frames get identical weights, whatever came before
        k[:, 5] = k[:, 2]
        w = content(q, k, prev_weights=prev)[1]
    assert torch.allclose(w[:, 5], w[:, 2])


def test_location_aware_rejects_bad_arguments():
    with pytest.raises(ValueError, match="kernel_size"):
        rnn.LocationAwareAttention(2, 2, 3, kernel_size=4)
    with pytest.raises(ValueError, match="prev_weights"):
        rnn.LocationAwareAttention(2, 2, 3)(torch.zeros(1, 2), torch.zeros(1, 3, 2), prev_weights=torch.zeros(1, 4))


def test_weight_on_target_hand_computed():
    w = torch.tensor([[[0.5, 0.5, 0.0], [0.1, 0.2, 0.7]]])
    a = torch.tensor([[[True, False, False], [False, True, True]]])
    assert rnn.weight_on_target(w, a).item() == pytest.approx((0.5 + 0.9) / 2)


def test_location_aware_alignment_learns_to_move_forward():
    """A short training run: location lets the alignment pick the right copy of a repeated
    word; content alone splits its weight between the copies."""
    task = data.repeated_segments(128, 3, generator=torch.Generator().manual_seed(0))
    test = data.repeated_segments(50, 3, generator=torch.Generator().manual_seed(1))
    result = {}
    for location in (False, True):
        torch.manual_seed(0)
        attn = rnn.LocationAwareAttention(5, 8, 32, location=location)
        losses = rnn.train_aligner(attn, task, steps=80, generator=torch.Generator().manual_seed(0))
        assert losses[-1] < losses[0]
        with torch.no_grad():
            result[location] = rnn.weight_on_target(attn.align(test.queries, test.frames, key_padding_mask=~test.mask), test.alignment)
    assert result[False] < 0.4 < 0.8 < result[True]


# ---------------------------------------------------------------------------------------------
# The encoder-decoder
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("attention", rnn.Seq2Seq.ATTENTIONS)
def test_seq2seq_shapes_and_padding(attention, gen):
    torch.manual_seed(0)
    model = rnn.Seq2Seq(9, 7, attention=attention, hidden=8, emb_dim=4).eval()
    src = torch.randint(3, 9, (3, 6), generator=gen)
    lengths = torch.tensor([6, 4, 2])
    mask = torch.arange(6)[None, :] < lengths[:, None]
    src = src.masked_fill(~mask, data.PAD)
    tgt = torch.randint(3, 7, (3, 5), generator=gen)
    out = model(src, mask, tgt)
    assert out.logits.shape == (3, 5, 7) and out.weights.shape == (3, 5, 6)
    assert (out.weights[~mask.unsqueeze(1).expand(-1, 5, -1)] == 0).all()
    # padding is invisible: the short sentence alone gives the same outputs
    alone = model(src[2:, :2], mask[2:, :2], tgt[2:])
    assert torch.allclose(alone.logits, out.logits[2:], atol=1e-5)


@pytest.mark.parametrize("attention", ["none", "bahdanau", "general", "local-m"])
def test_beam_search_of_width_one_is_greedy(attention, gen):
    torch.manual_seed(1)
    model = rnn.Seq2Seq(9, 7, attention=attention, hidden=8, emb_dim=4).eval()
    src = torch.randint(3, 9, (4, 5), generator=gen)
    mask = torch.ones_like(src, dtype=torch.bool)
    tokens, _ = model.greedy_decode(src, mask, max_len=8)
    greedy = [[t for t in row.tolist() if t not in (data.PAD,)] for row in tokens]
    greedy = [row[: row.index(data.EOS)] if data.EOS in row else row for row in greedy]
    assert model.beam_search(src, mask, beam_size=1, max_len=8) == greedy


def _log_probability(model, src, mask, outputs, *, finished=True):
    """Independent reference: the log-probability of each output (a list of token ids, EOS
    appended when ``finished``) under teacher forcing, all outputs of one source in one batch."""
    rows = [[data.BOS] + out + ([data.EOS] if finished else []) for out in outputs]
    width = max(len(r) for r in rows)
    tgt = torch.tensor([r + [data.PAD] * (width - len(r)) for r in rows])
    n = len(rows)
    with torch.no_grad():
        logp = model(src.expand(n, -1), mask.expand(n, -1), tgt[:, :-1]).logits.log_softmax(-1)
    per_token = logp.gather(-1, tgt[:, 1:, None])[..., 0]
    return (per_token * (tgt[:, 1:] != data.PAD)).sum(-1).double()


def _greedy_outputs(model, src, mask, max_len):
    """Greedy outputs as lists without EOS, and whether each one finished (emitted EOS)."""
    tokens, _ = model.greedy_decode(src, mask, max_len=max_len)
    outs = []
    for row in tokens.tolist():
        outs.append((row[: row.index(data.EOS)], True) if data.EOS in row else (row, False))
    return outs


@pytest.mark.parametrize("seed", range(12))
def test_beam_search_never_scores_below_greedy(seed):
    """On small random models (seeded) a wider beam never returns a less likely output than greedy
    decoding. Not a theorem (see test_beam_search_can_prune_the_greedy_output), but the behaviour the
    chapter describes; the old stopping rule broke it on the trained model below."""
    torch.manual_seed(seed)
    attention = rnn.Seq2Seq.ATTENTIONS[seed % len(rnn.Seq2Seq.ATTENTIONS)]
    model = rnn.Seq2Seq(9, 5 + seed % 3, attention=attention, hidden=8, emb_dim=4).eval()
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 9, (3, 5), generator=g)
    mask = torch.ones_like(src, dtype=torch.bool)
    max_len = 8
    for b, (greedy, done) in enumerate(_greedy_outputs(model, src, mask, max_len)):
        if not done:  # an unfinished output has no comparable score
            continue
        floor = _log_probability(model, src[b : b + 1], mask[b : b + 1], [greedy]).item()
        for beam_size in (1, 2, 3, 4):
            (out,) = model.beam_search(src[b : b + 1], mask[b : b + 1], beam_size=beam_size, max_len=max_len)
            assert len(out) < max_len  # a finished output exists (greedy's), so beam finishes too
            score = _log_probability(model, src[b : b + 1], mask[b : b + 1], [out]).item()
            assert score >= floor - 1e-5, (beam_size, out, score, greedy, floor)


@pytest.fixture(scope="module")
def under_trained_copier():
    """A copy model trained for 12 short epochs on strings of a and b (a few seconds): its EOS
    probability depends on the length, so EOS is often the runner-up early on. The old stopping
    rule ("stop once beam_size outputs have ended") returned an output less likely than greedy's
    on 43 of its 60 x 3 (test source, beam 2-4) pairs, e.g. source 27, beam 3: log-probability
    -2.65 where greedy's has -0.33; source 49, beam 4: -4.41 against -0.98."""
    task = data.copy_task(300, 60, min_len=3, max_len=7, n_symbols=2, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    model = rnn.Seq2Seq(len(task.src_vocab), len(task.tgt_vocab), attention="bahdanau", hidden=16, emb_dim=8)
    rnn.train_seq2seq(model, task, epochs=12, lr=1e-2, progress=False, generator=torch.Generator().manual_seed(0))
    return task, model.eval()


def test_beam_search_beats_greedy_on_a_trained_model(under_trained_copier):
    task, model = under_trained_copier
    batch = task.encode(task.test)
    max_len = 12
    for i in range(len(task.test)):
        n = int(batch["src_mask"][i].sum())
        src, mask = batch["src"][i : i + 1, :n], batch["src_mask"][i : i + 1, :n]
        ((greedy, done),) = _greedy_outputs(model, src, mask, max_len)
        if not done:
            continue
        floor = _log_probability(model, src, mask, [greedy]).item()
        for beam_size in (2, 3, 4):
            (out,) = model.beam_search(src, mask, beam_size=beam_size, max_len=max_len)
            score = _log_probability(model, src, mask, [out]).item()
            assert score >= floor - 1e-4, (i, beam_size, out, score, greedy, floor)


class _Scripted(rnn.Seq2Seq):
    """A decoder whose next-token probabilities are a Python function of the output so far,
    over the target vocabulary (PAD, BOS, EOS, a=3, b=4): the probability of every output is
    known exactly, independently of any network. The prefix rides in the decoder state, which
    beam search reorders with its hypotheses."""

    def __init__(self, next_probs, max_len=8):
        super().__init__(4, 5, hidden=2, emb_dim=2)
        self.next_probs, self.max_len = next_probs, max_len

    def _initial_state(self, memory, summary):
        return {**super()._initial_state(memory, summary), "prefix": torch.full((memory.shape[0], self.max_len), -1)}

    def step(self, y_prev, state, memory, src_mask, t):
        prefix = state["prefix"].clone()
        if t > 0:
            prefix[:, t - 1] = y_prev
        logits = torch.tensor([self.next_probs(tuple(row[:t])) for row in prefix.tolist()]).log()
        return logits, memory.new_zeros(memory.shape[:2]), {**state, "prefix": prefix}


def _scripted_probability(next_probs, out):
    p = 1.0
    for t, token in enumerate(out + [data.EOS]):
        p *= next_probs(tuple(out[:t]))[token]
    return p


_SRC, _MASK = torch.tensor([[3]]), torch.ones(1, 1, dtype=torch.bool)


def test_beam_search_does_not_stop_while_a_live_output_can_still_win():
    """The regression: with beam 2 the old rule stopped as soon as two outputs had ended ("" at
    step 0, "a" at step 1) and returned "" (log-probability log 0.1 = -2.30), although the live
    "aa" went on to end with log(0.899^2 x 0.9) = -0.32, which greedy decoding finds."""

    def next_probs(prefix):  # (PAD, BOS, EOS, a, b)
        return [0.0, 0.0, 0.1, 0.899, 0.001] if len(prefix) < 2 else [0.0, 0.0, 0.9, 0.099, 0.001]

    model = _Scripted(next_probs).eval()
    assert _greedy_outputs(model, _SRC, _MASK, 6)[0] == ([3, 3], True)
    for beam_size in (1, 2, 3, 5, 100):
        assert model.beam_search(_SRC, _MASK, beam_size=beam_size, max_len=6) == [[3, 3]], beam_size
    assert math.log(_scripted_probability(next_probs, [3, 3])) == pytest.approx(-0.32, abs=0.005)
    assert math.log(_scripted_probability(next_probs, [])) == pytest.approx(-2.30, abs=0.005)


def test_beam_search_can_prune_the_greedy_output():
    """The docstring's caveat: beam search is a heuristic. Greedy takes "a" (0.4) and then EOS
    (0.34): probability 0.136. With beam 2, b's continuations "bb" (0.35 x 0.55) and "ba" (0.35 x
    0.45) beat "a" + EOS and drop it; they end at best with 0.35 x 0.55 x 0.45 = 0.087. Beam 3
    keeps "" (0.25, EOS first), the most likely output."""

    def next_probs(prefix):  # (PAD, BOS, EOS, a, b)
        if prefix == ():
            return [0.0, 0.0, 0.25, 0.4, 0.35]
        if prefix == (3,):
            return [0.0, 0.0, 0.34, 0.33, 0.33]
        if prefix == (4,):
            return [0.0, 0.0, 0.0, 0.45, 0.55]
        if len(prefix) == 2 and prefix[0] == 4:
            return [0.0, 0.0, 0.1, 0.45, 0.45]
        return [0.0, 0.0, 1.0, 0.0, 0.0]

    model = _Scripted(next_probs).eval()
    def prob(beam_size):
        out = model.beam_search(_SRC, _MASK, beam_size=beam_size, max_len=6)[0]
        return _scripted_probability(next_probs, out)

    assert _greedy_outputs(model, _SRC, _MASK, 6)[0] == ([3], True)
    assert prob(1) == pytest.approx(0.4 * 0.34)
    assert prob(2) == pytest.approx(0.35 * 0.55 * 0.45)  # below greedy's 0.136
    assert prob(3) == prob(50) == pytest.approx(0.25)


@pytest.mark.parametrize("attention,seed", [("bahdanau", 0), ("general", 1), ("local-p", 2), ("none", 3), ("dot", 4)])
def test_wide_beam_search_is_exhaustive_search(attention, seed):
    """Target tokens a, b (V = 5), at most 3 tokens + EOS: 15 outputs, scored one by one by teacher
    forcing. A beam of 24 >= the 8 x 3 extensions of the last step prunes nothing, so beam search
    (with its early stop) must return the most likely of them."""
    torch.manual_seed(seed)
    model = rnn.Seq2Seq(9, 5, attention=attention, hidden=8, emb_dim=4).eval()
    with torch.no_grad():  # sharper distributions than at initialization: fewer near-ties
        model.out.weight.mul_(3.0)
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 9, (2, 4), generator=g)
    mask = torch.ones_like(src, dtype=torch.bool)
    outputs = [list(o) for n in range(4) for o in itertools.product([3, 4], repeat=n)]
    for b, found in enumerate(model.beam_search(src, mask, beam_size=24, max_len=4)):
        scores = _log_probability(model, src[b : b + 1], mask[b : b + 1], outputs)
        assert found == outputs[int(scores.argmax())], (b, found, scores.tolist())
    # beam 1 is greedy, which need not be the best: the search is what differs
    greedy = [out for out, _ in _greedy_outputs(model, src, mask, 4)]
    assert model.beam_search(src, mask, beam_size=1, max_len=4) == greedy


def test_hard_attention_decoding_uses_one_hot_weights(gen):
    torch.manual_seed(0)
    model = rnn.Seq2Seq(9, 7, attention="bahdanau", hidden=8, emb_dim=4).eval()
    model.hard = True
    src = torch.randint(3, 9, (2, 5), generator=gen)
    _, w = model.greedy_decode(src, torch.ones_like(src, dtype=torch.bool), max_len=4)
    assert torch.equal(w.sum(-1), torch.ones(w.shape[:2])) and set(w.unique().tolist()) <= {0.0, 1.0}


def test_seq2seq_rejects_bad_arguments():
    with pytest.raises(ValueError, match="attention"):
        rnn.Seq2Seq(5, 5, attention="transformer")
    with pytest.raises(ValueError, match="coverage"):
        rnn.Seq2Seq(5, 5, attention="general", coverage=True)


def test_input_gradients_and_distance(gen):
    torch.manual_seed(0)
    task = data.copy_task(50, 10, min_len=5, max_len=5, generator=torch.Generator().manual_seed(0))
    model = rnn.Seq2Seq(len(task.src_vocab), len(task.tgt_vocab), attention="bahdanau", hidden=8, emb_dim=4)
    batch = task.encode(task.test)
    norms = rnn.input_gradient_norms(model, batch)
    assert norms.shape == (6, 5) and (norms > 0).all()  # 5 letters + EOS, 5 source tokens
    # independent reference for one entry: autograd on a single example's loss
    x = model.src_emb(batch["src"][:1]).detach().requires_grad_(True)
    logits = model(batch["src"][:1], batch["src_mask"][:1], batch["tgt"][:1, :-1], embedded=x).logits
    loss = torch.nn.functional.cross_entropy(logits[0, 2], batch["tgt"][0, 3])
    (g,) = torch.autograd.grad(loss, x)
    single = rnn.input_gradient_norms(model, {k: v[:1] for k, v in batch.items()})
    assert single[2, 1].item() == pytest.approx(g[0, 1].norm().item(), rel=1e-5)
    distances, means = rnn.gradient_vs_distance(torch.arange(8.0).reshape(2, 4))
    # per position (mean over the 2 steps): 2, 3, 4, 5; distances min(s, 3 - s): 0, 1, 1, 0
    assert distances.tolist() == [0, 1]
    assert means.tolist() == [(2.0 + 5.0) / 2, (3.0 + 4.0) / 2]


def test_training_learns_to_copy():
    """A short real training run: the attention model copies unseen strings of length 3-5."""
    task = data.copy_task(1200, 100, min_len=3, max_len=5, n_symbols=5, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    model = rnn.Seq2Seq(len(task.src_vocab), len(task.tgt_vocab), attention="bahdanau", hidden=32, emb_dim=16)
    threads = torch.get_num_threads()
    history = rnn.train_seq2seq(model, task, epochs=3, lr=1e-2, progress=False, generator=torch.Generator().manual_seed(0))
    assert history.losses[-1] < 0.25 * history.losses[0]
    assert rnn.exact_match(model, task) > 0.8
    assert torch.get_num_threads() == threads  # single_thread() restored the thread count


# ---------------------------------------------------------------------------------------------
# Padding conventions: global attention reads any mask; what counts positions needs right padding
# ---------------------------------------------------------------------------------------------
def _left_and_right_padded(gen, vocab=9):
    """Three sources of lengths 5, 3, 1, right-padded and the same tokens left-padded."""
    lengths = torch.tensor([5, 3, 1])
    right = torch.arange(5)[None, :] < lengths[:, None]
    left = right.flip(-1)
    tokens = torch.randint(3, vocab, (3, 5), generator=gen)
    src_right = tokens.masked_fill(~right, data.PAD)
    src_left = torch.full_like(tokens, data.PAD)
    for b, n in enumerate(lengths.tolist()):
        src_left[b, 5 - n :] = src_right[b, :n]
    return src_right, right, src_left, left


@pytest.mark.parametrize("attention", rnn.Seq2Seq.ATTENTIONS)
def test_seq2seq_rejects_a_left_padded_mask(attention, gen):
    """The old model packed a left-padded source as if its padding were at the end: it read PAD
    tokens and dropped real ones, silently (here the logits moved by up to 0.11 against the same
    sources right-padded). Now every entry point says so."""
    torch.manual_seed(0)
    model = rnn.Seq2Seq(9, 7, attention=attention, hidden=8, emb_dim=4).eval()
    src_right, right, src_left, left = _left_and_right_padded(gen)
    tgt = torch.randint(3, 7, (3, 4), generator=gen)
    message = (r"(Seq2Seq\.\w+: src_mask|sequence_loss: batch\['src_mask'\]) must be right-padded "
               r"\(True = real token.*row 1 is \[0, 0, 1, 1, 1\]")
    calls = [
        lambda s, m: model(s, m, tgt),
        lambda s, m: model.encode(s, m),
        lambda s, m: model.greedy_decode(s, m, max_len=3),
        lambda s, m: model.beam_search(s, m, beam_size=2, max_len=3),
        lambda s, m: rnn.sequence_loss(model, {"src": s, "src_mask": m, "tgt": tgt}),
    ]
    for call in calls:
        call(src_right, right)  # the right-padded batch is fine
        with pytest.raises(ValueError, match=message):
            call(src_left, left)
    # a hole in the middle of a row is not right-padded either
    holed = right.clone()
    holed[0, 2] = False
    with pytest.raises(ValueError, match="row 0 is"):
        model(src_right, holed, tgt)


def test_local_attention_rejects_a_left_padded_mask(gen):
    for mode in ("local-m", "local-p"):
        attn = rnn.LocalAttention(4, 6, window=1, mode=mode)
        q, k = torch.randn(2, 4, generator=gen), torch.randn(2, 5, 6, generator=gen)
        right = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
        attn(q, k, key_padding_mask=~right, step=1)
        with pytest.raises(ValueError, match=r"LocalAttention\.forward: key_padding_mask must be right-padded \(True = padding"):
            attn(q, k, key_padding_mask=~right.flip(-1), step=1)


def test_location_aware_start_needs_right_padding_and_global_attention_does_not(gen):
    torch.manual_seed(0)
    attn = rnn.LocationAwareAttention(4, 6, 5, kernel_size=3)
    q, k = torch.randn(2, 4, generator=gen), torch.randn(2, 5, 6, generator=gen)
    left = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], dtype=torch.bool)
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"LocationAwareAttention\.forward: key_padding_mask must be right-padded"):
            attn(q, k, key_padding_mask=~left)  # the default start (frame 0) would be padding
        with pytest.raises(ValueError, match=r"LocationAwareAttention\.align: key_padding_mask must be right-padded"):
            attn.align(q[:, None], k, key_padding_mask=~left)
        prev = torch.softmax(torch.randn(2, 5, generator=gen), -1) * left
        attn(q, k, key_padding_mask=~left, prev_weights=prev)  # an explicit start is fine
    # global attention has no notion of position: a left-padded row equals its right-padded self
    for glob in (rnn.BahdanauAttention(4, 6, 5), rnn.LuongAttention(4, 6), rnn.LuongAttention(4, 6, method="concat")):
        with torch.no_grad():
            ctx_left, w_left = glob(q, k, key_padding_mask=~left)
            k_right = torch.cat([k[1:, 2:], k[1:, :2]], 1)
            ctx_right, w_right = glob(q[1:], k_right, key_padding_mask=~left[1:].flip(-1))
        assert torch.allclose(ctx_left[1:], ctx_right, atol=1e-6)
        assert torch.allclose(w_left[1:, 2:], w_right[:, :3], atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Bad input: a ValueError / TypeError naming the function, the argument and what it got
# ---------------------------------------------------------------------------------------------
def _model(**kw):
    torch.manual_seed(0)
    return rnn.Seq2Seq(9, 7, hidden=8, emb_dim=4, **kw).eval()


_Q, _K = torch.randn(2, 4), torch.randn(2, 3, 6)
_SRC2 = torch.tensor([[3, 4, 5], [6, 7, 0]])
_MASK2 = _SRC2 != data.PAD
_TGT2 = torch.tensor([[1, 3, 4, 2], [1, 5, 2, 0]])
_BATCH = {"src": _SRC2, "src_mask": _MASK2, "tgt": _TGT2}
_TINY = data.copy_task(8, 4, min_len=2, max_len=3, n_symbols=3, generator=torch.Generator().manual_seed(0))
_SEGMENTS = data.repeated_segments(4, 2, generator=torch.Generator().manual_seed(0))

BAD_INPUTS = [
    # sizes: zero, negative, not an integer
    (lambda: rnn.BahdanauAttention(0, 6, 5),
     ValueError, r"BahdanauAttention: query_dim must be a positive integer, got 0"),
    (lambda: rnn.BahdanauAttention(4, 6, -1), ValueError, r"BahdanauAttention: hidden_dim .* got -1"),
    (lambda: rnn.BahdanauAttention(4, 6.0, 5), ValueError, r"BahdanauAttention: key_dim .* got 6\.0"),
    (lambda: rnn.LuongAttention(0, 0, method="dot"), ValueError, r"LuongAttention: query_dim .* got 0"),
    (lambda: rnn.LuongAttention(4, 6, method="concat", hidden_dim=0),
     ValueError, r"LuongAttention: hidden_dim .* got 0"),
    (lambda: rnn.LuongAttention(4, 6, method="cosine"), ValueError, r"LuongAttention: method must be one of"),
    (lambda: rnn.LocalAttention(4, 6, window=0),
     ValueError, r"LocalAttention: window must be a positive integer, got 0"),
    (lambda: rnn.LocalAttention(4, 6, window=-2), ValueError, r"LocalAttention: window .* got -2"),
    (lambda: rnn.LocalAttention(4, 6, window=1.5), ValueError, r"LocalAttention: window .* got 1\.5"),
    (lambda: rnn.LocalAttention(4, 6, window=True), ValueError, r"LocalAttention: window .* got True"),
    (lambda: rnn.LocalAttention(4, 6, hidden_dim=0), ValueError, r"LocalAttention: hidden_dim .* got 0"),
    (lambda: rnn.LocalAttention(4, 6, mode="local-x"), ValueError, r"LocalAttention: mode must be one of"),
    (lambda: rnn.LocationAwareAttention(4, 6, 5, n_filters=0),
     ValueError, r"LocationAwareAttention: n_filters .* got 0"),
    (lambda: rnn.LocationAwareAttention(4, 6, 5, kernel_size=4),
     ValueError, r"LocationAwareAttention: kernel_size must be odd .* got 4"),
    (lambda: rnn.LocationAwareAttention(4, 6, 5, kernel_size=-3),
     ValueError, r"LocationAwareAttention: kernel_size .* got -3"),
    (lambda: rnn.LocationAwareAttention(4, 6, 0), ValueError, r"LocationAwareAttention: hidden_dim .* got 0"),
    (lambda: rnn.Seq2Seq(2, 7), ValueError, r"Seq2Seq: src_vocab must be >= 3 .* got 2"),
    (lambda: rnn.Seq2Seq(9, 0), ValueError, r"Seq2Seq: tgt_vocab must be a positive integer, got 0"),
    (lambda: rnn.Seq2Seq(9, 7, hidden=0), ValueError, r"Seq2Seq: hidden .* got 0"),
    (lambda: rnn.Seq2Seq(9, 7, emb_dim=-4), ValueError, r"Seq2Seq: emb_dim .* got -4"),
    (lambda: rnn.Seq2Seq(9, 7, attention="local-p", window=0), ValueError, r"Seq2Seq: window .* got 0"),
    (lambda: rnn.Seq2Seq(9, 7, coverage=True, coverage_weight=-1.0),
     ValueError, r"Seq2Seq: coverage_weight must be a finite number >= 0, got -1\.0"),
    (lambda: rnn.Seq2Seq(9, 7, attention="transformer"), ValueError, r"Seq2Seq: attention must be one of"),
    # attention steps: shapes, dtypes, masks
    (lambda: rnn.BahdanauAttention(4, 6, 5)(_Q[:, :3], _K),
     ValueError, r"BahdanauAttention\.forward: query must have shape \(B, Dq=4\), got \(2, 3\)"),
    (lambda: rnn.BahdanauAttention(4, 6, 5)(_Q, _K[:1]),
     ValueError, r"BahdanauAttention\.forward: keys must have shape \(B=2, S, Dk=6\), got \(1, 3, 6\)"),
    (lambda: rnn.BahdanauAttention(4, 6, 5)(_Q, _K.long()),
     TypeError, r"BahdanauAttention\.forward: keys must be a floating-point tensor"),
    (lambda: rnn.BahdanauAttention(4, 6, 5)(_Q.double(), _K.double()),
     TypeError, r"BahdanauAttention\.forward: query \(torch.float64\) .* dtype torch.float32"),
    (lambda: rnn.BahdanauAttention(4, 6, 5)(_Q, _K, key_padding_mask=torch.zeros(2, 3)),
     TypeError, r"BahdanauAttention\.forward: key_padding_mask must be bool"),
    (lambda: rnn.BahdanauAttention(4, 6, 5)(_Q, _K, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)),
     ValueError, r"BahdanauAttention\.forward: key_padding_mask must have shape \(batch, S\) = \(2, 3\), got \(2, 4\)"),
    (lambda: rnn.BahdanauAttention(4, 6, 5, coverage=True)(_Q, _K, coverage=torch.zeros(2, 4)),
     ValueError, r"BahdanauAttention\.forward: coverage must have shape \(B, S\) = \(2, 3\), got \(2, 4\)"),
    (lambda: rnn.BahdanauAttention(4, 6, 5)(_Q, _K, keys_proj=torch.zeros(2, 3, 4)),
     ValueError, r"BahdanauAttention\.forward: keys_proj must have shape \(B, S, H\) = \(2, 3, 5\), got \(2, 3, 4\)"),
    (lambda: rnn.LuongAttention(4, 6)(_Q, _K, key_padding_mask=torch.zeros(3, 2, dtype=torch.bool)),
     ValueError, r"LuongAttention\.forward: key_padding_mask must have shape"),
    (lambda: rnn.LocalAttention(4, 6, mode="local-m")(_Q, _K),
     ValueError, r"LocalAttention\.forward: local-m attention needs the decoder step"),
    (lambda: rnn.LocalAttention(4, 6, mode="local-m")(_Q, _K, step=-1),
     ValueError, r"LocalAttention\.forward: step must be an integer >= 0, got -1"),
    (lambda: rnn.LocalAttention(4, 6, mode="local-m")(_Q, _K, step=1.5),
     ValueError, r"LocalAttention\.forward: step .* got 1\.5"),
    (lambda: rnn.LocalAttention(4, 6)(_Q, _K[..., :5]), ValueError, r"LocalAttention\.forward: keys must have shape"),
    (lambda: rnn.LocalAttention(4, 6).centre(_Q, torch.tensor([3])),
     ValueError, r"LocalAttention\.centre: lengths must be a tensor of shape \(B,\) = \(2,\), got \(1,\)"),
    (lambda: rnn.LocationAwareAttention(4, 6, 5)(_Q, _K, prev_weights=torch.zeros(2, 4)),
     ValueError, r"LocationAwareAttention\.forward: prev_weights must have shape \(B, S\) = \(2, 3\), got \(2, 4\)"),
    (lambda: rnn.LocationAwareAttention(4, 6, 5).align(_Q, _K),
     ValueError, r"LocationAwareAttention\.align: queries must have shape \(B, T, Dq=4\)"),
    # coverage and alignment measures
    (lambda: rnn.coverage_loss(torch.zeros(2, 3), torch.zeros(2, 4)),
     ValueError, r"coverage_loss: weights \(2, 3\) and coverage \(2, 4\) must have the same shape \(\.\.\., S\)"),
    (lambda: rnn.coverage_loss([0.5], torch.zeros(1)), TypeError, r"coverage_loss: weights must be a torch.Tensor"),
    (lambda: rnn.accumulated_coverage(torch.zeros(2, 3)),
     ValueError, r"accumulated_coverage: weights must have shape \(B, T, S\), got \(2, 3\)"),
    (lambda: rnn.repeated_attention(torch.zeros(2, 3)),
     ValueError, r"repeated_attention: weights must have shape \(B, T, S\)"),
    (lambda: rnn.repeated_attention(torch.zeros(2, 3, 4), torch.ones(2, 4, dtype=torch.bool)),
     ValueError, r"repeated_attention: tgt_mask must have shape \(B, T\) = \(2, 3\), got \(2, 4\)"),
    (lambda: rnn.repeated_attention(torch.zeros(2, 3, 4), torch.ones(1, 3, dtype=torch.bool)),
     ValueError, r"repeated_attention: tgt_mask must have shape"),
    (lambda: rnn.repeated_attention(torch.zeros(2, 3, 4), torch.ones(2, 3)),
     TypeError, r"repeated_attention: tgt_mask must be a bool tensor"),
    (lambda: rnn.weight_on_target(torch.zeros(1, 0, 3), torch.zeros(1, 0, 3)),
     ValueError, r"weight_on_target: .*needs B >= 1 and T >= 1"),
    (lambda: rnn.weight_on_target(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4)),
     ValueError, r"weight_on_target: weights and alignment must have the same shape"),
    (lambda: rnn.train_aligner(rnn.LocationAwareAttention(5, 8, 4), _SEGMENTS, steps=-1),
     ValueError, r"train_aligner: steps must be an integer >= 0, got -1"),
    (lambda: rnn.train_aligner(rnn.LocationAwareAttention(5, 8, 4), _SEGMENTS, batch_size=0),
     ValueError, r"train_aligner: batch_size .* got 0"),
    (lambda: rnn.train_aligner(rnn.LocationAwareAttention(5, 8, 4), _SEGMENTS, lr=0.0),
     ValueError, r"train_aligner: lr must be a finite number > 0, got 0\.0"),
    (lambda: rnn.train_aligner(rnn.BahdanauAttention(5, 8, 4), _SEGMENTS),
     TypeError, r"train_aligner: attention must be a LocationAwareAttention"),
    # the encoder-decoder: token ids, masks, empty batches and sequences
    (lambda: _model()(_SRC2.masked_fill(_SRC2 == 7, 9), _MASK2, _TGT2),
     ValueError, r"Seq2Seq\.forward: src holds token ids outside the vocabulary \[0, 9\): min 0, max 9"),
    (lambda: _model()(_SRC2 - 1, _MASK2, _TGT2),
     ValueError, r"Seq2Seq\.forward: src holds token ids outside the vocabulary \[0, 9\): min -1"),
    (lambda: _model()(_SRC2.float(), _MASK2, _TGT2),
     TypeError, r"Seq2Seq\.forward: src must be an int64 tensor of token ids, got torch.float32"),
    (lambda: _model()(_SRC2, _MASK2, _TGT2 + 4),
     ValueError, r"Seq2Seq\.forward: tgt_in holds token ids outside the vocabulary \[0, 7\)"),
    (lambda: _model()(_SRC2, _MASK2.long(), _TGT2),
     TypeError, r"Seq2Seq\.forward: src_mask must be a bool tensor \(True = real token\), got torch.int64"),
    (lambda: _model()(_SRC2, _MASK2[:, :2], _TGT2),
     ValueError, r"Seq2Seq\.forward: src_mask must have src's shape \(B, S\) = \(2, 3\), got \(2, 2\)"),
    (lambda: _model()(_SRC2, _MASK2 & torch.tensor([[True], [False]]), _TGT2),
     ValueError, r"Seq2Seq\.forward: every source sequence needs at least one token; src_mask row 1"),
    (lambda: _model()(_SRC2[:0], _MASK2[:0], _TGT2[:0]),
     ValueError, r"Seq2Seq\.forward: src must have shape \(B, S\) with B >= 1 and S >= 1, got \(0, 3\)"),
    (lambda: _model()(_SRC2[:, :0], _MASK2[:, :0], _TGT2),
     ValueError, r"Seq2Seq\.forward: src must have shape .* got \(2, 0\)"),
    (lambda: _model()(_SRC2, _MASK2, _TGT2[:, :0]),
     ValueError, r"Seq2Seq\.forward: tgt_in must have shape \(B=2, T\) with T >= 1 .* got \(2, 0\)"),
    (lambda: _model()(_SRC2, _MASK2, _TGT2[:1]), ValueError, r"Seq2Seq\.forward: tgt_in must have shape \(B=2, T\)"),
    (lambda: _model()(_SRC2, _MASK2, _TGT2, embedded=torch.zeros(2, 3, 5)),
     ValueError, r"Seq2Seq\.forward: embedded must have shape \(B, S, emb_dim\) = \(2, 3, 4\), got \(2, 3, 5\)"),
    (lambda: _model().encode(_SRC2, _MASK2, embedded=torch.zeros(2, 3, 4, dtype=torch.float64)),
     TypeError, r"Seq2Seq\.encode: embedded must have the model's dtype torch.float32"),
    (lambda: _model().greedy_decode(_SRC2, _MASK2, max_len=-1),
     ValueError, r"Seq2Seq\.greedy_decode: max_len must be an integer >= 0, got -1"),
    (lambda: _model().greedy_decode(_SRC2 + 9, _MASK2),
     ValueError, r"Seq2Seq\.greedy_decode: src holds token ids outside"),
    (lambda: _model().beam_search(_SRC2, _MASK2, beam_size=0),
     ValueError, r"Seq2Seq\.beam_search: beam_size must be a positive integer, got 0"),
    (lambda: _model().beam_search(_SRC2, _MASK2, beam_size=-2),
     ValueError, r"Seq2Seq\.beam_search: beam_size .* got -2"),
    (lambda: _model().beam_search(_SRC2, _MASK2, beam_size=2.0),
     ValueError, r"Seq2Seq\.beam_search: beam_size .* got 2\.0"),
    (lambda: _model().beam_search(_SRC2, _MASK2, max_len=-1),
     ValueError, r"Seq2Seq\.beam_search: max_len must be an integer >= 0, got -1"),
    (lambda: _model().beam_search(_SRC2[:0], _MASK2[:0]),
     ValueError, r"Seq2Seq\.beam_search: src must have shape .* got \(0, 3\)"),
    # training and evaluation
    (lambda: rnn.sequence_loss(_model(), {"src": _SRC2, "tgt": _TGT2}),
     TypeError, r"sequence_loss: batch must be a mapping .* missing \['src_mask'\]"),
    (lambda: rnn.sequence_loss(_model(), {**_BATCH, "tgt": _TGT2[:, :1]}),
     ValueError, r"sequence_loss: batch\['tgt'\] must have shape \(B=2, T\) with T >= 2"),
    (lambda: rnn.sequence_loss(_model(), {**_BATCH, "tgt": _TGT2 * (_TGT2 == 1)}),
     ValueError, r"sequence_loss: batch\['tgt'\] has no target token"),
    (lambda: rnn.sequence_loss(_model(), {**_BATCH, "tgt": _TGT2 + 5}),
     ValueError, r"sequence_loss: batch\['tgt'\] holds token ids outside the vocabulary \[0, 7\)"),
    (lambda: rnn.sequence_loss(torch.nn.Linear(2, 2), _BATCH),
     TypeError, r"sequence_loss: model must be a Seq2Seq, got Linear"),
    (lambda: rnn.train_seq2seq(_model(), _TINY, epochs=0),
     ValueError, r"train_seq2seq: epochs must be a positive integer, got 0"),
    (lambda: rnn.train_seq2seq(_model(), _TINY, batch_size=0), ValueError, r"train_seq2seq: batch_size .* got 0"),
    (lambda: rnn.train_seq2seq(_model(), _TINY, lr=-1e-3),
     ValueError, r"train_seq2seq: lr must be a finite number > 0, got -0\.001"),
    (lambda: rnn.train_seq2seq(_model(), _TINY, grad_clip=0.0),
     ValueError, r"train_seq2seq: grad_clip must be a finite number > 0, got 0\.0"),
    (lambda: rnn.exact_match(_model(), _TINY, []), ValueError, r"exact_match: pairs is empty"),
    (lambda: rnn.exact_match(_model(), _TINY, batch_size=0), ValueError, r"exact_match: batch_size .* got 0"),
    (lambda: rnn.input_gradient_norms(_model(), _BATCH),
     ValueError, r"input_gradient_norms: batch\['src_mask'\] must be all True .* got 1 padded positions"),
    (lambda: rnn.gradient_vs_distance(torch.zeros(4)),
     ValueError, r"gradient_vs_distance: norms must have shape \(T, S\) with T, S >= 1, got \(4,\)"),
    (lambda: rnn.gradient_vs_distance(torch.zeros(0, 3)),
     ValueError, r"gradient_vs_distance: norms must have shape .* got \(0, 3\)"),
]


@pytest.mark.parametrize("call,error,message", BAD_INPUTS,
                         ids=[m.split(":")[0].replace("\\", "") + f"-{i}" for i, (_, _, m) in enumerate(BAD_INPUTS)])
def test_bad_input_raises_a_clear_error(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_every_public_name_is_covered_by_the_bad_input_table():
    named = " ".join(m for _, _, m in BAD_INPUTS)
    for name in set(rnn.__all__) - {"Decoded"}:  # a NamedTuple: nothing to check
        assert re.search(rf"\b{name}\b", named), name


def test_empty_but_valid_inputs_give_the_documented_results(gen):
    """S = 0 keys: zero context; B = 0: empty outputs; T = 0 queries, max_len = 0: empty decodes."""
    for attn, kw in [(rnn.BahdanauAttention(4, 6, 5), {}), (rnn.LuongAttention(4, 6, method="concat"), {}),
                     (rnn.LocalAttention(4, 6, mode="local-m"), {"step": 0}), (rnn.LocalAttention(4, 6), {}),
                     (rnn.LocationAwareAttention(4, 6, 5, kernel_size=3), {})]:
        with torch.no_grad():
            ctx, w = attn(_Q, _K[:, :0], key_padding_mask=torch.zeros(2, 0, dtype=torch.bool), **kw)
            assert torch.equal(ctx, torch.zeros(2, 6)) and w.shape == (2, 0)
            ctx, w = attn(_Q[:0], _K[:0], **kw)
            assert ctx.shape == (0, 6) and w.shape == (0, 3)
    with torch.no_grad():
        assert rnn.LocationAwareAttention(4, 6, 5).align(_Q[:, None, :][:, :0], _K).shape == (2, 0, 3)
    model = _model()
    tokens, weights = model.greedy_decode(_SRC2, _MASK2, max_len=0)
    assert tokens.shape == (2, 0) and weights.shape == (2, 0, 3)
    assert model.beam_search(_SRC2, _MASK2, max_len=0) == [[], []]
    assert rnn.train_aligner(rnn.LocationAwareAttention(5, 8, 4), _SEGMENTS, steps=0) == []
