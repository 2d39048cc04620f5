"""attnbook.connections against independent references (explicit loops, SDPA) and properties."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from attnbook import connections as C
from attnbook.core import causal_mask, scaled_dot_product_attention


# ---------------------------------------------------------------------------------------------
# Synthesizers and the hypernetwork view
# ---------------------------------------------------------------------------------------------
def test_dense_synthesizer_rows_come_from_each_token_alone(gen):
    syn = C.DenseSynthesizer(6, max_len=10, hidden=12)
    x = torch.randn(2, 7, 6, generator=gen)
    out, w = syn(x, return_weights=True)
    expected_w = torch.softmax(syn.w2(F.relu(syn.w1(x)))[..., :7], dim=-1)
    torch.testing.assert_close(w, expected_w)
    torch.testing.assert_close(out, expected_w @ syn.value(x))
    x2 = x.clone()
    x2[:, 3] = torch.randn(2, 6, generator=gen)  # change token 3 only: only row 3 of the weights moves
    w2 = syn(x2, return_weights=True)[1]
    rows_changed = (w2 - w).abs().amax(dim=(0, 2)) > 1e-7
    assert rows_changed.tolist() == [i == 3 for i in range(7)]
    with pytest.raises(ValueError, match="max_len"):
        syn(torch.randn(1, 11, 6))


def test_dense_synthesizer_mask(gen):
    syn = C.DenseSynthesizer(4, max_len=5)
    w = syn(torch.randn(1, 5, 4, generator=gen), attn_mask=causal_mask(5), return_weights=True)[1]
    assert (w[0][~causal_mask(5)] == 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 5))


def test_random_synthesizer_ignores_the_input(gen):
    syn = C.RandomSynthesizer(4, max_len=8, trainable=False, generator=torch.Generator().manual_seed(1))
    assert not syn.logits.requires_grad
    _, w1 = syn(torch.randn(3, 6, 4, generator=gen), return_weights=True)
    _, w2 = syn(torch.randn(3, 6, 4, generator=gen), return_weights=True)
    torch.testing.assert_close(w1, w2)
    torch.testing.assert_close(w1[0], torch.softmax(syn.logits[:6, :6], -1))


def test_attention_is_a_data_dependent_linear_layer(gen):
    n, d, dk, dv = 5, 4, 3, 2
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    wq, wk = torch.randn(d, dk, generator=gen, dtype=torch.float64), torch.randn(d, dk, generator=gen, dtype=torch.float64)
    wv = torch.randn(d, dv, generator=gen, dtype=torch.float64)
    M, A = C.attention_as_linear_map(x, wq, wk, wv)
    assert M.shape == (n * dv, n * d)
    expected = scaled_dot_product_attention(x @ wq, x @ wk, x @ wv)
    torch.testing.assert_close((M @ x.reshape(-1)).reshape(n, dv), expected)
    for i in range(n):  # block (i, j) is A_ij W_v^T: one shared non-negative scalar per pair
        for j in range(n):
            torch.testing.assert_close(M[i * dv:(i + 1) * dv, j * d:(j + 1) * d], A[i, j] * wv.T)
    M2, _ = C.attention_as_linear_map(2 * x, wq, wk, wv)
    assert not torch.allclose(M, M2)  # a different input writes a different layer


# ---------------------------------------------------------------------------------------------
# Parameter sharing across layers
# ---------------------------------------------------------------------------------------------
def _mlp_block(gen, d=5):
    block = torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.Tanh())
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return block


@pytest.mark.parametrize("n_layers", [1, 4])
def test_shared_stack_is_one_block_applied_n_times(gen, n_layers):
    block = _mlp_block(gen)
    stack = C.SharedLayerStack(block, n_layers)
    x = torch.randn(3, 5, generator=gen)
    expected, states = x, [x]
    for _ in range(n_layers):
        expected = block(expected)
        states.append(expected)
    out, got_states = stack(x, return_states=True)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(got_states, torch.stack(states))
    assert len(stack) == n_layers and all(b is block for b in stack)
    assert sum(p.numel() for p in stack.parameters()) == sum(p.numel() for p in block.parameters())


def test_shared_stack_gradient_is_the_sum_over_depths(gen):
    """Back-propagation through depth: unsharing the block into L copies and adding their
    gradients gives the shared block's gradient."""
    import copy

    block = _mlp_block(gen)
    x = torch.randn(4, 5, generator=gen)
    C.SharedLayerStack(block, 3)(x).square().sum().backward()
    copies = [copy.deepcopy(block) for _ in range(3)]
    for c in copies:
        c.zero_grad()
    torch.nn.Sequential(*copies)(x).square().sum().backward()
    for name, p in block.named_parameters():
        total = sum(dict(c.named_parameters())[name].grad for c in copies)
        torch.testing.assert_close(p.grad, total)


def test_shared_stack_replaces_a_models_blocks(gen):
    from attnbook.models import TinyEncoder, TransformerConfig

    torch.manual_seed(0)
    model = TinyEncoder(TransformerConfig(vocab_size=7, d_model=16, n_heads=2, n_layers=1))
    idx = torch.randint(0, 7, (2, 6), generator=gen)
    block = model.blocks[0]
    with torch.no_grad():
        h = model.tok_emb(idx)
        for _ in range(3):
            h = block(h)
        expected = model.head(model.ln_f(h))
        model.blocks = C.SharedLayerStack(block, 3)
        torch.testing.assert_close(model(idx), expected)
        _, weights = model(idx, return_weights=True)
    assert weights.shape == (3, 2, 2, 6, 6)


def test_shared_stack_validates_n_layers():
    with pytest.raises(ValueError, match="n_layers"):
        C.SharedLayerStack(torch.nn.Identity(), 0)


# ---------------------------------------------------------------------------------------------
# Dynamic convolution
# ---------------------------------------------------------------------------------------------
def _dynamic_convolution_reference(x, kernel_proj, window, heads):
    """The definition, one output number at a time: channel c of token i mixes positions
    i - window + 1 .. i (zeros before the start) with the softmax of its group's kernel."""
    B, n, d = x.shape
    out = torch.zeros_like(x)
    kernels = torch.zeros(B, heads, n, window, dtype=x.dtype)
    for b in range(B):
        for i in range(n):
            logits = kernel_proj(x[b, i]).view(heads, window)
            for h in range(heads):
                kernels[b, h, i] = torch.exp(logits[h]) / torch.exp(logits[h]).sum()
            for c in range(d):
                h = c // (d // heads)
                for j in range(window):
                    source = i - window + 1 + j
                    if source >= 0:
                        out[b, i, c] += kernels[b, h, i, j] * x[b, source, c]
    return out, kernels


@given(
    batch=st.integers(1, 2),
    n=st.integers(1, 7),
    heads=st.integers(1, 3),
    per_head=st.integers(1, 3),
    window=st.integers(1, 9),
)
def test_dynamic_convolution_matches_the_definition(batch, n, heads, per_head, window):
    g = torch.Generator().manual_seed(n * 100 + heads * 10 + window)
    d = heads * per_head
    x = torch.randn(batch, n, d, generator=g, dtype=torch.float64)
    proj = torch.nn.Linear(d, heads * window).double()
    with torch.no_grad():
        proj.weight.copy_(torch.randn(proj.weight.shape, generator=g, dtype=torch.float64))
        out, kernels = C.dynamic_convolution(x, proj, window, heads, return_weights=True)
        out_ref, kernels_ref = _dynamic_convolution_reference(x, proj, window, heads)
    torch.testing.assert_close(out, out_ref)
    torch.testing.assert_close(kernels, kernels_ref)
    torch.testing.assert_close(kernels.sum(-1), torch.ones(batch, heads, n, dtype=torch.float64))


def test_lightweight_convolution_is_a_grouped_conv1d(gen):
    """A kernel that ignores the token: the same operation as a causal depthwise conv1d
    whose channels share their group's softmax-normalized kernel."""
    B, n, d, heads, window = 2, 9, 6, 3, 4
    logits = torch.randn(heads, window, generator=gen)
    x = torch.randn(B, n, d, generator=gen)
    out = C.dynamic_convolution(
        x, lambda t: logits.reshape(1, 1, -1).expand(*t.shape[:2], -1), window, heads
    )
    kernel = torch.softmax(logits, -1).repeat_interleave(d // heads, dim=0)  # (d, window)
    expected = F.conv1d(F.pad(x.transpose(1, 2), (window - 1, 0)), kernel[:, None], groups=d)
    torch.testing.assert_close(out, expected.transpose(1, 2))


def test_dynamic_convolution_weights_come_from_the_query_alone(gen):
    proj = torch.nn.Linear(4, 2 * 3)
    x = torch.randn(1, 8, 4, generator=gen)
    x2 = x.clone()
    x2[0, 5] = torch.randn(4, generator=gen)
    with torch.no_grad():
        _, w = C.dynamic_convolution(x, proj, 3, 2, return_weights=True)
        _, w2 = C.dynamic_convolution(x2, proj, 3, 2, return_weights=True)
    moved = (w - w2).abs().amax(dim=(0, 1, 3)) > 0
    assert moved.tolist() == [i == 5 for i in range(8)]


def test_dynamic_convolution_validates():
    x = torch.randn(1, 5, 6)
    with pytest.raises(ValueError, match="heads"):
        C.dynamic_convolution(x, torch.nn.Linear(6, 8), 2, 4)
    with pytest.raises(ValueError, match="window"):
        C.dynamic_convolution(x, torch.nn.Linear(6, 6), 0, 3)
    with pytest.raises(ValueError, match="kernel_proj"):
        C.dynamic_convolution(x, torch.nn.Linear(6, 5), 2, 3)
    with pytest.raises(ValueError, match="x must"):
        C.dynamic_convolution(torch.randn(5, 6), torch.nn.Linear(6, 6), 2, 3)


# ---------------------------------------------------------------------------------------------
# Routing by agreement
# ---------------------------------------------------------------------------------------------
def _routing_reference(u_hat, n_iter):
    B, n_in, n_out, d = u_hat.shape
    b = torch.zeros(B, n_in, n_out, dtype=u_hat.dtype)
    for it in range(n_iter):
        c = torch.exp(b) / torch.exp(b).sum(2, keepdim=True)
        v = torch.zeros(B, n_out, d, dtype=u_hat.dtype)
        for j in range(n_out):
            s = sum(c[:, i, j, None] * u_hat[:, i, j] for i in range(n_in))
            norm2 = (s * s).sum(-1, keepdim=True)
            v[:, j] = norm2 / (1 + norm2) * s / torch.sqrt(norm2)
        if it < n_iter - 1:
            for i in range(n_in):
                for j in range(n_out):
                    b[:, i, j] += (u_hat[:, i, j] * v[:, j]).sum(-1)
    return v, c


@pytest.mark.parametrize("n_iter", [1, 3])
def test_dynamic_routing_matches_the_loop_reference(gen, n_iter):
    u_hat = torch.randn(2, 5, 3, 4, generator=gen, dtype=torch.float64)
    v, c = C.dynamic_routing(u_hat, n_iter=n_iter)
    v_ref, c_ref = _routing_reference(u_hat, n_iter)
    torch.testing.assert_close(v, v_ref)
    torch.testing.assert_close(c, c_ref)
    torch.testing.assert_close(c.sum(2), torch.ones(2, 5, dtype=torch.float64))  # each input splits itself
    assert (v.norm(dim=-1) < 1).all()


# ---------------------------------------------------------------------------------------------
# Hopfield retrieval
# ---------------------------------------------------------------------------------------------
def test_hopfield_update_is_one_attention_step(gen):
    X = torch.randn(2, 9, 6, generator=gen)
    xi = torch.randn(2, 3, 6, generator=gen)
    torch.testing.assert_close(C.hopfield_update(xi, X, beta=0.8), scaled_dot_product_attention(xi, X, X, scale=0.8))


def test_hopfield_energy_never_increases(gen):
    X = torch.randn(12, 8, generator=gen, dtype=torch.float64)
    xi = torch.randn(4, 8, generator=gen, dtype=torch.float64)
    energies = [C.hopfield_energy(xi, X, beta=0.5)]
    for _ in range(10):
        xi = C.hopfield_update(xi, X, beta=0.5)
        energies.append(C.hopfield_energy(xi, X, beta=0.5))
    for before, after in zip(energies, energies[1:]):
        assert (after <= before + 1e-12).all()
    bound = 2 * X.norm(dim=-1).max() ** 2
    assert all(((e >= 0) & (e <= bound)).all() for e in energies[1:])  # 0 <= E <= 2 M^2 after one update


def test_hopfield_retrieves_a_stored_pattern_from_a_noisy_query(gen):
    X = torch.sign(torch.randn(20, 64, generator=gen))  # 20 random +-1 patterns, nearly orthogonal
    query = torch.where(torch.rand(64, generator=gen) > 0.25, X[7], -X[7])  # flip about 25% of the signs
    fixed, steps = C.hopfield_retrieve(query[None], X, beta=1.0)
    torch.testing.assert_close(fixed[0], X[7], atol=1e-5, rtol=0)
    assert steps <= 3
    again = C.hopfield_update(fixed, X, beta=1.0)
    torch.testing.assert_close(again, fixed, atol=1e-6, rtol=0)  # a fixed point


def test_hopfield_small_beta_averages(gen):
    X = torch.randn(5, 4, generator=gen)
    fixed, _ = C.hopfield_retrieve(torch.randn(1, 4, generator=gen), X, beta=1e-4)
    torch.testing.assert_close(fixed[0], X.mean(0), atol=1e-3, rtol=0)  # the "metastable" global average


# ---------------------------------------------------------------------------------------------
# Gating
# ---------------------------------------------------------------------------------------------
def test_glu_formula_and_no_mixing(gen):
    glu = C.GLU(5, 3)
    x = torch.randn(2, 4, 5, generator=gen)
    expected = torch.sigmoid(x @ glu.gate.weight.T + glu.gate.bias) * (x @ glu.proj.weight.T + glu.proj.bias)
    torch.testing.assert_close(glu(x), expected)
    perm = torch.randperm(4, generator=gen)
    torch.testing.assert_close(glu(x[:, perm]), glu(x)[:, perm])  # position-wise: no mixing


def test_gmlp_matches_the_formula_and_mixes_positions(gen):
    block = C.GatedMLP(6, 8, seq_len=5)
    x = torch.randn(2, 5, 6, generator=gen)
    per_position = block(x)  # W_s = 0 at initialization: a per-position MLP
    perm = torch.randperm(5, generator=gen)
    torch.testing.assert_close(block(x[:, perm]), per_position[:, perm])
    with torch.no_grad():
        block.spatial_weight.copy_(torch.randn(5, 5, generator=gen))
    z = F.gelu(F.linear(F.layer_norm(x, (6,), block.norm.weight, block.norm.bias), block.proj_in.weight, block.proj_in.bias))
    z1, z2 = z[..., :4], z[..., 4:]
    z2 = F.layer_norm(z2, (4,), block.gate_norm.weight, block.gate_norm.bias)
    gate = torch.einsum("ts,bsf->btf", block.spatial_weight, z2) + block.spatial_bias
    expected = x + F.linear(z1 * gate, block.proj_out.weight, block.proj_out.bias)
    torch.testing.assert_close(block(x), expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(block(x[:, perm]), block(x)[:, perm], atol=1e-4)  # now it is not equivariant


def test_causal_gmlp_ignores_the_future(gen):
    block = C.GatedMLP(4, 6, seq_len=6, is_causal=True)
    with torch.no_grad():
        block.spatial_weight.copy_(torch.randn(6, 6, generator=gen))
    x = torch.randn(1, 6, 4, generator=gen)
    x2 = x.clone()
    x2[:, 4:] = torch.randn(1, 2, 4, generator=gen)
    torch.testing.assert_close(block(x)[:, :4], block(x2)[:, :4])


# ---------------------------------------------------------------------------------------------
# State-space model
# ---------------------------------------------------------------------------------------------
def _ssm_params(gen, D=3, N=4, dtype=torch.float64):
    a = torch.rand(D, N, generator=gen, dtype=dtype) * 0.98  # stable: |a| < 1
    b = torch.randn(D, N, generator=gen, dtype=dtype)
    c = torch.randn(D, N, generator=gen, dtype=dtype)
    return a, b, c


def test_ssm_kernel_is_the_sum_of_powers(gen):
    a, b, c = _ssm_params(gen)
    K = C.ssm_kernel(a, b, c, 6)
    for d in range(3):
        for k in range(6):
            assert math.isclose(K[d, k].item(), sum(c[d, n] * a[d, n] ** k * b[d, n] for n in range(4)).item(), rel_tol=1e-12)


@pytest.mark.parametrize("L", [1, 7, 33])
def test_ssm_recurrence_equals_convolution(gen, L):
    a, b, c = _ssm_params(gen)
    x = torch.randn(2, L, 3, generator=gen, dtype=torch.float64)
    y_rec, _ = C.ssm_recurrent(x, a, b, c)
    y_conv = C.ssm_convolution(x, a, b, c)
    K = C.ssm_kernel(a, b, c, L)
    y_direct = torch.stack([sum(K[:, t - s] * x[:, s] for s in range(t + 1)) for t in range(L)], dim=1)
    torch.testing.assert_close(y_rec, y_direct)
    torch.testing.assert_close(y_conv, y_direct)


def test_ssm_state_continues_a_sequence(gen):
    a, b, c = _ssm_params(gen)
    x = torch.randn(1, 10, 3, generator=gen, dtype=torch.float64)
    full, _ = C.ssm_recurrent(x, a, b, c)
    first, state = C.ssm_recurrent(x[:, :6], a, b, c)
    second, _ = C.ssm_recurrent(x[:, 6:], a, b, c, state)
    torch.testing.assert_close(torch.cat([first, second], 1), full)
    assert state.shape == (1, 3, 4)  # fixed size, whatever the length


def test_diagonal_ssm_layer_modes_agree_and_are_causal(gen):
    layer = C.DiagonalSSM(4, d_state=8, generator=gen)
    x = torch.randn(2, 12, 4, generator=gen)
    torch.testing.assert_close(layer(x), layer(x, mode="recurrent"), atol=1e-5, rtol=1e-4)
    assert ((layer.decay() > 0) & (layer.decay() < 1)).all()
    x2 = x.clone()
    x2[:, 8:] = 0
    torch.testing.assert_close(layer(x2)[:, :8], layer(x)[:, :8], atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="mode"):
        layer(x, mode="fft")


# ---------------------------------------------------------------------------------------------
# Recommendation, documents, co-attention
# ---------------------------------------------------------------------------------------------
def test_target_attention_reference_and_padding(gen):
    din = C.TargetAttention(4, hidden=8)
    hist = torch.randn(2, 5, 4, generator=gen)
    target = torch.randn(2, 4, generator=gen)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])  # True = real item
    interest, w = din(hist, target, key_padding_mask=~mask)  # True = padding, as in PyTorch
    for bi in range(2):
        for t in range(5):
            feat = torch.cat([hist[bi, t], target[bi], hist[bi, t] - target[bi], hist[bi, t] * target[bi]])
            expected = din.mlp(feat).squeeze() if mask[bi, t] else torch.tensor(0.0)
            torch.testing.assert_close(w[bi, t], expected)
    torch.testing.assert_close(interest, (w.unsqueeze(-1) * hist).sum(1))
    hist_changed = hist.clone()
    hist_changed[1, 3:] = 100.0  # padding does not leak
    torch.testing.assert_close(din(hist_changed, target, key_padding_mask=~mask)[0], interest)
    softmaxed = C.TargetAttention(4, hidden=8, normalize=True)
    torch.testing.assert_close(softmaxed(hist, target, key_padding_mask=~mask)[1].sum(-1), torch.ones(2))
    with pytest.raises(ValueError, match="key_padding_mask"):
        din(hist, target, key_padding_mask=~mask[:, :4])


def test_target_attention_weights_are_not_normalized(gen):
    """Repeating the history doubles DIN's interest vector; a softmax version would not change."""
    din = C.TargetAttention(3, hidden=6)
    hist = torch.randn(1, 4, 3, generator=gen)
    target = torch.randn(1, 3, generator=gen)
    once, _ = din(hist, target)
    twice, _ = din(torch.cat([hist, hist], 1), target)
    torch.testing.assert_close(twice, 2 * once)


def test_attention_pooling_and_han_shapes_and_masks(gen):
    pool = C.AttentionPooling(6, hidden=5)
    h = torch.randn(3, 4, 6, generator=gen)
    mask = torch.tensor([[True] * 4, [True, True, False, False], [False] * 4])
    s, alpha = pool(h, key_padding_mask=~mask)
    expected = torch.softmax((torch.tanh(pool.proj(h)) @ pool.context).masked_fill(~mask, float("-inf"))[:2], -1)
    torch.testing.assert_close(alpha[:2], expected)
    assert (alpha[2] == 0).all() and (s[2] == 0).all()  # a fully padded sequence gives zeros, not NaN
    han = C.HierarchicalAttentionNetwork(vocab_size=20, embed_dim=8, hidden=6, n_classes=3)
    docs = torch.randint(1, 20, (2, 4, 5), generator=gen)
    docs[0, 3] = 0  # an empty sentence
    docs[1, :, 4] = 0  # padded words
    logits, ww, sw = han(docs)
    assert logits.shape == (2, 3) and ww.shape == (2, 4, 5) and sw.shape == (2, 4)
    torch.testing.assert_close(sw.sum(-1), torch.ones(2))
    assert sw[0, 3] == 0 and (ww[1, :, 4] == 0).all()
    assert torch.isfinite(logits).all()


def test_coattention_is_two_cross_attentions(gen):
    a = torch.randn(2, 5, 4, generator=gen)
    b = torch.randn(2, 7, 4, generator=gen)
    real_b = torch.rand(2, 7, generator=gen) > 0.3
    a_ctx, b_ctx, w_ab, w_ba = C.coattention(a, b, key_padding_mask_b=~real_b)
    torch.testing.assert_close(a_ctx, scaled_dot_product_attention(a, b, b, real_b[:, None, :], scale=1.0))
    torch.testing.assert_close(b_ctx, scaled_dot_product_attention(b, a, a, scale=1.0))
    real_a = torch.tensor([[True] * 5, [True, True, False, False, False]])
    _, b_ctx, _, w_ba = C.coattention(a, b, key_padding_mask_a=~real_a)
    assert (w_ba[1][:, 2:] == 0).all()  # True = padding: no weight on a's padded words
    torch.testing.assert_close(b_ctx, scaled_dot_product_attention(b, a, a, real_a[:, None, :], scale=1.0))
    torch.testing.assert_close(w_ab.transpose(-2, -1).shape, w_ba.shape)
    with pytest.raises(ValueError, match="share d"):
        C.coattention(a, torch.randn(2, 7, 3))


# --- the hierarchical attention network over padded documents ---
def _han_batch(docs):
    """docs: lists of sentences (1-D id tensors) -> (B, S, W) right-padded with 0."""
    S = max(len(d) for d in docs)
    W = max(len(s) for d in docs for s in d)
    out = torch.zeros(len(docs), S, W, dtype=torch.long)
    for b, d in enumerate(docs):
        for i, s in enumerate(d):
            out[b, i, : len(s)] = s
    return out


def test_han_document_alone_equals_the_same_document_padded_in_a_batch():
    """Both GRUs are bidirectional: run over padding, the backward direction starts on PAD
    embeddings and every real word's annotation changes. Packed, a document's logits and
    weights do not depend on the other documents of its batch (float64, 1e-10)."""
    torch.manual_seed(0)
    han = C.HierarchicalAttentionNetwork(vocab_size=20, embed_dim=8, hidden=6, n_classes=3).double().eval()
    g = torch.Generator().manual_seed(0)
    lengths = [[3, 5, 2], [4], [6, 1, 3, 2], [2, 2]]  # padded words and padded sentences
    docs = [[torch.randint(1, 20, (n,), generator=g) for n in d] for d in lengths]
    with torch.no_grad():
        logits, words, sentences = han(_han_batch(docs))
        for b, doc in enumerate(docs):
            alone, w, s = han(_han_batch([doc]))
            torch.testing.assert_close(alone[0], logits[b], rtol=0, atol=1e-10)
            torch.testing.assert_close(s[0], sentences[b, : len(doc)], rtol=0, atol=1e-10)
            torch.testing.assert_close(w[0], words[b, : len(doc), : w.shape[2]], rtol=0, atol=1e-10)
        assert (sentences[1, 1:] == 0).all() and (words[0, 0, 3:] == 0).all()


def test_han_rejects_padding_before_real_words_or_sentences():
    han = C.HierarchicalAttentionNetwork(vocab_size=20, embed_dim=8, hidden=6, n_classes=3)
    docs = torch.randint(1, 20, (2, 3, 4))
    docs[0, 1, 1] = 0  # a PAD inside a sentence
    with pytest.raises(ValueError, match=r"HierarchicalAttentionNetwork: docs must be padded at the end: a word at index \(0, 1, 2\)"):
        han(docs)
    docs = torch.randint(1, 20, (2, 3, 4))
    docs[1, 0] = 0  # an empty sentence before a real one
    with pytest.raises(ValueError, match=r"a sentence at index \(1, 1\) follows padding"):
        han(docs)


def test_empty_sequences_and_wrong_masks():
    """Regression: an empty sequence crashed the SSM forms (torch.stack of nothing, an FFT
    of length 0), and the masks of TargetAttention and AttentionPooling were not checked."""
    x, a = torch.randn(2, 0, 4), torch.full((4, 3), 0.5)
    b = c = torch.randn(4, 3)
    state = torch.randn(2, 4, 3)
    y, h = C.ssm_recurrent(x, a, b, c, state)
    assert y.shape == (2, 0, 4) and torch.equal(h, state)
    assert C.ssm_convolution(x, a, b, c).shape == (2, 0, 4)
    assert C.ssm_kernel(a, b, c, 0).shape == (4, 0)
    assert C.DiagonalSSM(4, 3)(x).shape == (2, 0, 4)
    with pytest.raises(ValueError, match=r"ssm_recurrent: state must have shape \(B, D, N\)"):
        C.ssm_recurrent(torch.randn(2, 3, 4), a, b, c, torch.zeros(2, 4))
    history, target = torch.randn(2, 5, 4), torch.randn(2, 4)
    with pytest.raises(ValueError, match=r"TargetAttention.forward: key_padding_mask must have shape \(batch, S\) = \(2, 5\)"):
        C.TargetAttention(4)(history, target, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="TargetAttention.forward: key_padding_mask must be bool"):
        C.TargetAttention(4)(history, target, key_padding_mask=torch.zeros(2, 5))
    with pytest.raises(ValueError, match="AttentionPooling.forward: key_padding_mask must have shape"):
        C.AttentionPooling(4)(history, key_padding_mask=torch.zeros(5, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="hopfield_update: beta must be a finite number > 0, got nan"):
        C.hopfield_update(target, history[0], beta=float("nan"))
