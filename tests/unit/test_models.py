"""Tests for attnbook.models: shapes, causality, agreement with core.MultiHeadAttention, positional schemes,
head masks (pruning, importance, DropHead) and the returned attention weights."""

import pytest
import torch

from attnbook.core import MultiHeadAttention
from attnbook.models import (
    MLP,
    Block,
    RMSNorm,
    POSITIONAL_SCHEMES,
    Attention,
    TinyEncoder,
    TinyGPT,
    TransformerConfig,
    drophead_mask,
    head_importance,
)
from attnbook.positional import RotaryEmbedding


def config(**kwargs):
    base = dict(vocab_size=11, d_model=16, n_heads=4, n_layers=2, max_len=24)
    return TransformerConfig(**{**base, **kwargs})


def tokens(B=2, T=9, seed=0):
    return torch.randint(0, 11, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("scheme", POSITIONAL_SCHEMES)
def test_gpt_is_causal_for_every_scheme(scheme):
    torch.manual_seed(0)
    model = TinyGPT(config(positional=scheme)).eval()
    x = tokens()
    logits = model(x)
    assert logits.shape == (2, 9, 11) and torch.isfinite(logits).all()
    changed = x.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 11
    torch.testing.assert_close(model(changed)[:, :6], logits[:, :6])  # the future never leaks into the past
    assert not torch.allclose(model(changed)[:, 6:], logits[:, 6:])


@pytest.mark.parametrize("scheme", POSITIONAL_SCHEMES)
def test_encoder_is_bidirectional_and_respects_padding(scheme):
    torch.manual_seed(0)
    model = TinyEncoder(config(positional=scheme)).eval()
    x = tokens()
    changed = x.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 11
    assert not torch.allclose(model(changed)[:, 0], model(x)[:, 0])  # the first token sees the last one
    keep = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    keep[..., -1] = False  # the last token is padding: changing it changes nothing else
    torch.testing.assert_close(model(changed, keep)[:, :-1], model(x, keep)[:, :-1])


def test_without_positions_an_encoder_is_permutation_equivariant():
    torch.manual_seed(0)
    model = TinyEncoder(config(positional="none")).eval()
    x, perm = tokens(), torch.randperm(9, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model(x[:, perm]), model(x)[:, perm], atol=1e-5, rtol=1e-5)
    model = TinyEncoder(config(positional="sinusoidal")).eval()
    assert not torch.allclose(model(x[:, perm]), model(x)[:, perm], atol=1e-3)


def test_attention_without_positions_equals_core_multi_head_attention():
    torch.manual_seed(0)
    cfg = config(positional="none", n_kv_heads=2)
    ours = Attention(cfg, is_causal=True).eval()
    core = MultiHeadAttention(16, 4, n_kv_heads=2).eval()
    core.load_state_dict(ours.state_dict())  # same projection layout and names
    x = torch.randn(3, 7, 16)
    torch.testing.assert_close(ours(x), core(x, is_causal=True))
    assert ours.k_proj.weight.shape == (2 * 4, 16)  # grouped-query attention: 2 K/V heads of width 4


def test_rope_attention_rotates_queries_and_keys():
    torch.manual_seed(0)
    cfg = config(positional="rope")
    ours = Attention(cfg, is_causal=True).eval()
    x = torch.randn(2, 6, 16)
    B, T, h, hd = 2, 6, 4, 4
    q = ours.q_proj(x).view(B, T, h, hd).transpose(1, 2)
    k = ours.k_proj(x).view(B, T, h, hd).transpose(1, 2)
    v = ours.v_proj(x).view(B, T, h, hd).transpose(1, 2)
    rope = RotaryEmbedding(hd)
    out = torch.nn.functional.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
    torch.testing.assert_close(ours(x), ours.out_proj(out.transpose(1, 2).reshape(B, T, 16)), atol=1e-5, rtol=1e-5)


def test_only_learned_positions_are_limited_to_max_len():
    x = tokens(T=30)  # longer than max_len=24
    with pytest.raises(ValueError, match="max_len=24"):
        TinyGPT(config(positional="learned"))(x)
    for scheme in ("none", "sinusoidal", "t5", "alibi", "rope"):
        assert TinyGPT(config(positional=scheme))(x).shape == (2, 30, 11)


def test_config_validation():
    with pytest.raises(ValueError, match="positional"):
        config(positional="xpos")
    with pytest.raises(ValueError, match="divisible"):
        config(d_model=18)
    with pytest.raises(ValueError, match="n_kv_heads"):
        TinyGPT(config(n_kv_heads=3))


def test_t5_bias_is_shared_across_layers_and_trained():
    torch.manual_seed(0)
    model = TinyGPT(config(positional="t5"))
    assert sum(name.startswith("rel_bias") for name, _ in model.named_parameters()) == 1
    torch.nn.functional.cross_entropy(model(tokens()).flatten(0, 1), tokens(seed=1).flatten()).backward()
    assert model.rel_bias.bias.weight.grad.abs().sum() > 0


def test_gpt_learns_to_copy_the_previous_token():
    """A few hundred steps of AdamW teach a 1-layer RoPE model the shift-by-one task almost perfectly."""
    torch.manual_seed(0)
    model = TinyGPT(config(positional="rope", n_layers=1, d_model=32))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(150):
        x = torch.randint(0, 11, (16, 12), generator=g)
        loss = torch.nn.functional.cross_entropy(model(x)[:, 1:].flatten(0, 1), x[:, :-1].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
    x = torch.randint(0, 11, (64, 12), generator=g)
    accuracy = (model(x)[:, 1:].argmax(-1) == x[:, :-1]).float().mean().item()
    assert accuracy > 0.95


# --- generation and the KV cache (Chapter 6) ---------------------------------------------------
@pytest.mark.parametrize("scheme", POSITIONAL_SCHEMES)
@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])  # multi-head, grouped-query, multi-query
def test_cached_and_uncached_greedy_generation_give_identical_tokens(scheme, n_kv_heads):
    torch.manual_seed(0)
    model = TinyGPT(config(positional=scheme, n_kv_heads=n_kv_heads, max_len=32)).double().eval()
    with torch.no_grad():  # larger random weights: an untrained model at default scale repeats one token
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    prompt = tokens(B=3, T=5)
    cached = model.generate(prompt, 20, use_cache=True)
    assert cached.shape == (3, 25) and torch.equal(cached[:, :5], prompt)
    assert torch.equal(cached, model.generate(prompt, 20, use_cache=False))
    assert len(set(cached[:, 5:].flatten().tolist())) > 1  # not a degenerate constant output


@pytest.mark.parametrize("scheme", POSITIONAL_SCHEMES)
def test_cached_logits_equal_full_forward_logits(scheme):
    """Prefill 6 tokens, then feed 3 + 1 + 2 more through the cache: every logit equals the full pass's."""
    from attnbook.kvcache import KVCache

    torch.manual_seed(0)
    model = TinyGPT(config(positional=scheme, n_kv_heads=2)).eval()
    x = tokens(T=12)
    cache = KVCache(2, 2, 2, 4, max_len=12)
    pieces = [model(x[:, a:b], cache=cache) for a, b in [(0, 6), (6, 9), (9, 10), (10, 12)]]
    torch.testing.assert_close(torch.cat(pieces, 1), model(x), atol=1e-5, rtol=1e-5)
    assert cache.length == 12


def test_learned_positions_cannot_be_cached_past_max_len_but_uncached_generation_crops():
    torch.manual_seed(0)
    model = TinyGPT(config(positional="learned", max_len=24)).eval()
    prompt = tokens(T=5)
    with pytest.raises(ValueError, match="max_len=24"):
        model.generate(prompt, 21, use_cache=True)  # would feed position 24
    assert model.generate(prompt, 20, use_cache=True).shape == (2, 25)  # positions 0..23 only: fine
    out = model.generate(prompt, 30, use_cache=False)  # crops the context to the last 24 tokens
    assert out.shape == (2, 35) and torch.equal(out[:, :25], model.generate(prompt, 20, use_cache=True))


def test_sampling_is_reproducible_and_top_k_restricts_the_choice():
    torch.manual_seed(0)
    model = TinyGPT(config()).eval()
    prompt = tokens(T=3)

    def sample(seed, **kw):
        return model.generate(prompt, 15, temperature=1.0, generator=torch.Generator().manual_seed(seed), **kw)

    assert torch.equal(sample(1), sample(1)) and not torch.equal(sample(1), sample(2))
    assert torch.equal(sample(3, use_cache=False), sample(3))  # same logits, same random draws
    assert torch.equal(sample(4, top_k=1), model.generate(prompt, 15))  # top-1 sampling is greedy
    with pytest.raises(ValueError, match="temperature"):
        model.generate(prompt, 2, temperature=-1.0)


# --- head masks, head importance, DropHead and the returned weights ------------------------------
@pytest.mark.parametrize("scheme", ["rope", "alibi", "t5", "learned"])
@pytest.mark.parametrize("cls", [TinyGPT, TinyEncoder])
def test_head_mask_of_ones_equals_no_mask(scheme, cls):
    torch.manual_seed(0)
    model = cls(config(positional=scheme)).eval()
    x = tokens()
    torch.testing.assert_close(model(x, head_mask=torch.ones(2, 4)), model(x), rtol=0, atol=0)
    torch.testing.assert_close(model(x, head_mask=torch.ones(2, 2, 4)), model(x), rtol=0, atol=0)  # per sequence


@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_zeroed_head_equals_an_output_projection_that_ignores_it(n_kv_heads):
    """Removing head h of layer l is the same as zeroing the columns of that layer's W^O that read head h."""
    torch.manual_seed(0)
    model = TinyGPT(config(n_kv_heads=n_kv_heads)).double().eval()
    x = tokens()
    for layer, head in [(0, 0), (1, 3), (0, 2)]:
        mask = torch.ones(2, 4, dtype=torch.float64)
        mask[layer, head] = 0.0
        surgery = TinyGPT(model.config).double().eval()
        surgery.load_state_dict(model.state_dict())
        with torch.no_grad():
            surgery.blocks[layer].attn.out_proj.weight[:, head * 4 : (head + 1) * 4] = 0.0  # head_dim = 16 / 4
        torch.testing.assert_close(model(x, head_mask=mask), surgery(x))
        assert not torch.allclose(model(x, head_mask=mask), model(x))


def test_head_mask_scales_the_head_output_linearly():
    """A gate xi on a head scales its contribution to W^O: the output is affine in xi (checked at 0, 1/2, 1)."""
    torch.manual_seed(0)
    attn = Attention(config(positional="rope"), is_causal=True).double().eval()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    outs = [attn(x, head_mask=torch.tensor([1.0, xi, 1.0, 1.0], dtype=torch.float64)) for xi in (0.0, 0.5, 1.0)]
    torch.testing.assert_close(outs[1], (outs[0] + outs[2]) / 2)


def test_per_sequence_head_mask_equals_running_each_sequence_alone():
    torch.manual_seed(0)
    model = TinyGPT(config()).eval()
    x = tokens(B=3)
    mask = torch.rand(2, 3, 4, generator=torch.Generator().manual_seed(1))
    together = model(x, head_mask=mask)
    for b in range(3):
        torch.testing.assert_close(together[b : b + 1], model(x[b : b + 1], head_mask=mask[:, b]))


def test_head_mask_with_a_cache_equals_the_full_forward():
    from attnbook.kvcache import KVCache

    torch.manual_seed(0)
    model = TinyGPT(config(positional="rope")).eval()
    x, mask = tokens(T=10), torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.5]])
    cache = KVCache(2, 2, 4, 4, max_len=10)
    pieces = [model(x[:, a:b], cache=cache, head_mask=mask) for a, b in [(0, 6), (6, 7), (7, 10)]]
    torch.testing.assert_close(torch.cat(pieces, 1), model(x, head_mask=mask), atol=1e-5, rtol=1e-5)


def test_head_mask_shape_errors():
    model = TinyGPT(config()).eval()
    with pytest.raises(ValueError, match="n_layers=2"):
        model(tokens(), head_mask=torch.ones(3, 4))
    with pytest.raises(ValueError, match="n_heads=4"):
        model(tokens(), head_mask=torch.ones(2, 5))


def test_returned_weights_are_the_attention_of_every_layer():
    torch.manual_seed(0)
    gpt = TinyGPT(config(positional="none")).eval()
    x = tokens(T=7)
    logits, weights = gpt(x, return_weights=True)
    torch.testing.assert_close(logits, gpt(x))
    assert weights.shape == (2, 2, 4, 7, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 4, 7))
    assert (weights.triu(1) == 0).all()  # causal: nothing above the diagonal
    # layer 0's weights are those of core.MultiHeadAttention with the same projections
    mha = MultiHeadAttention(16, 4).eval()
    mha.load_state_dict(gpt.blocks[0].attn.state_dict())
    _, expected = mha(gpt.blocks[0].ln1(gpt.tok_emb(x)), is_causal=True, return_weights=True)
    torch.testing.assert_close(weights[0], expected)
    encoder_weights = TinyEncoder(config(positional="none")).eval()(x, return_weights=True)[1]
    above = torch.ones(7, 7, dtype=torch.bool).triu(1)
    assert (encoder_weights[..., above] > 0).all()  # an encoder looks at the future


def test_head_importance_equals_finite_differences():
    """I_h = mean over batches of |dL_n / d xi_h| at xi = 1, against central differences in float64."""
    torch.manual_seed(0)
    model = TinyGPT(config(positional="rope")).double()
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 11, (3, 8), generator=g) for _ in range(3)]

    def loss_fn(m, batch, head_mask):
        logits = m(batch[:, :-1], head_mask=head_mask)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())

    importance = head_importance(model, batches, loss_fn)
    assert importance.shape == (2, 4) and model.training  # the model's mode is restored
    assert all(p.grad is None for p in model.parameters())
    eps, expected = 1e-6, torch.zeros(2, 4, dtype=torch.float64)
    model.eval()
    with torch.no_grad():
        for layer in range(2):
            for head in range(4):
                for batch in batches:
                    up, down = torch.ones(2, 4, dtype=torch.float64), torch.ones(2, 4, dtype=torch.float64)
                    up[layer, head] += eps
                    down[layer, head] -= eps
                    expected[layer, head] += abs(loss_fn(model, batch, up) - loss_fn(model, batch, down)) / (2 * eps)
    torch.testing.assert_close(importance, expected / len(batches), atol=1e-7, rtol=1e-5)
    with pytest.raises(ValueError, match="empty"):
        head_importance(model, [], loss_fn)


def test_drophead_mask_drops_whole_heads_and_keeps_the_scale():
    g = torch.Generator().manual_seed(0)
    mask = drophead_mask(3, 8, 0.25, 200, generator=g)
    assert mask.shape == (3, 200, 8)
    kept = (mask > 0).sum(-1, keepdim=True)
    # every kept head of a (layer, sequence) is scaled by n_heads / n_kept, so the scales sum to n_heads
    torch.testing.assert_close(mask, (mask > 0) * (8 / kept.clamp_min(1)).float())
    torch.testing.assert_close(mask.sum(-1)[kept[..., 0] > 0], torch.full(((kept > 0).sum().item(),), 8.0))
    assert abs((mask == 0).float().mean().item() - 0.25) < 0.02
    assert torch.equal(mask, drophead_mask(3, 8, 0.25, 200, generator=torch.Generator().manual_seed(0)))
    assert (drophead_mask(2, 4, 0.0, 5) == 1).all()
    for p in (-0.1, 1.0):
        with pytest.raises(ValueError, match="p must be"):
            drophead_mask(2, 4, p, 5)


# --------------------------------------------------------------------------------------
# The block's variants: RMSNorm, post-norm, SwiGLU, tied weights
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps", [None, 1e-5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rmsnorm_equals_torchs(eps, dtype):
    g = torch.Generator().manual_seed(0)
    ours, theirs = RMSNorm(24, eps), torch.nn.RMSNorm(24, eps)
    weight = torch.rand(24, generator=g) + 0.5
    with torch.no_grad():
        ours.weight.copy_(weight)
        theirs.weight.copy_(weight)
    x = 3 * torch.randn(2, 5, 24, generator=g)
    torch.testing.assert_close(ours.to(dtype)(x.to(dtype)), theirs.to(dtype)(x.to(dtype)))


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_post_norm_blocks_emit_normalized_outputs(norm):
    config = TransformerConfig(d_model=32, n_heads=4, norm=norm, norm_position="post")
    block = Block(config, is_causal=True)
    x = 5 * torch.randn(3, 7, 32, generator=torch.Generator().manual_seed(1)) + 2
    out = block(x)
    if norm == "layernorm":  # zero mean and unit variance per token (weight 1, bias 0)
        torch.testing.assert_close(out.mean(-1), torch.zeros(3, 7), atol=1e-5, rtol=0)
        torch.testing.assert_close(out.var(-1, unbiased=False), torch.ones(3, 7), atol=1e-4, rtol=0)
    else:  # unit root mean square per token
        torch.testing.assert_close(out.pow(2).mean(-1), torch.ones(3, 7), atol=1e-4, rtol=0)
    pre = Block(TransformerConfig(d_model=32, n_heads=4, norm=norm), is_causal=True)
    assert (pre(x).mean(-1) - x.mean(-1)).abs().max() < 1  # pre-norm keeps the residual's scale
    model = TinyGPT(TransformerConfig(d_model=32, n_heads=4, norm_position="post"))
    assert isinstance(model.ln_f, torch.nn.Identity)


def test_post_norm_block_is_norm_of_residual_plus_sublayer():
    config = TransformerConfig(d_model=16, n_heads=2, norm_position="post")
    block = Block(config, is_causal=False)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(2))
    h = block.ln1(x + block.attn(x))
    torch.testing.assert_close(block(x), block.ln2(h + block.mlp(h)))


def test_swiglu_has_the_parameter_budget_of_the_gelu_mlp():
    d = 48
    gelu = MLP(TransformerConfig(d_model=d, n_heads=4))
    swiglu = MLP(TransformerConfig(d_model=d, n_heads=4, mlp="swiglu"))
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(swiglu) == 3 * d * (8 * d // 3) == 8 * d * d  # three matrices, no biases
    assert abs(count(swiglu) - count(gelu)) / count(gelu) < 0.02  # GELU's biases: 5 d
    x = torch.randn(2, 3, d, generator=torch.Generator().manual_seed(3))
    expected = swiglu.proj(torch.nn.functional.silu(swiglu.fc(x)) * swiglu.gate(x))
    torch.testing.assert_close(swiglu(x), expected)


def test_tied_weights_share_one_matrix_and_its_gradient():
    model = TinyGPT(TransformerConfig(vocab_size=20, d_model=16, n_heads=2, tie_weights=True))
    assert model.head.weight is model.tok_emb.weight
    n_tied = sum(p.numel() for p in model.parameters())
    untied = TinyGPT(TransformerConfig(vocab_size=20, d_model=16, n_heads=2))
    assert sum(p.numel() for p in untied.parameters()) - n_tied == 20 * 16
    idx = torch.randint(0, 20, (2, 6), generator=torch.Generator().manual_seed(4))
    model(idx).sum().backward()
    assert model.tok_emb.weight.grad is not None and model.tok_emb.weight.grad.abs().sum() > 0


def test_the_default_block_is_unchanged():
    """The chapters' models: pre-norm LayerNorm, GELU, untied, the same parameter names."""
    model = TinyGPT(TransformerConfig(d_model=16, n_heads=2, n_layers=1))
    names = set(model.state_dict())
    assert {"blocks.0.ln1.weight", "blocks.0.ln1.bias", "blocks.0.mlp.fc.bias", "ln_f.weight",
            "head.weight"} <= names
    assert not any("gate" in n for n in names)
    block = model.blocks[0]
    x = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(5))
    h = x + block.attn(block.ln1(x))
    torch.testing.assert_close(block(x), h + block.mlp(block.ln2(h)))


def test_block_options_are_validated():
    for name, bad in (("norm", "batchnorm"), ("norm_position", "sandwich"), ("mlp", "relu")):
        with pytest.raises(ValueError, match=f"{name} must be one of"):
            TransformerConfig(**{name: bad})


def test_attention_only_blocks_have_no_mlp():
    config = TransformerConfig(d_model=16, n_heads=2, mlp="none")
    block = Block(config, is_causal=True)
    assert block.mlp is None and not any("mlp" in n for n, _ in block.named_parameters())
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(6))
    torch.testing.assert_close(block(x), x + block.attn(block.ln1(x)))
    post = Block(TransformerConfig(d_model=16, n_heads=2, mlp="none", norm_position="post"),
                 is_causal=True)
    torch.testing.assert_close(post(x), post.ln1(x + post.attn(x)))


def test_induction_scores_find_a_previous_token_head_and_an_induction_head():
    from attnbook.models import induction_scores

    period, T = 5, 10
    weights = torch.full((2, 3, 2, T, T), 0.0)
    causal = torch.ones(T, T).tril()
    weights[:] = causal / causal.sum(-1, keepdim=True)  # uniform over the visible keys
    previous = torch.zeros(T, T)
    previous[0, 0] = 1.0
    previous[torch.arange(1, T), torch.arange(0, T - 1)] = 1.0
    weights[0, :, 0] = previous  # layer 0, head 0: the previous token
    induction = weights[1, 0, 1].clone()
    rows = torch.arange(period, T)
    induction[rows] = 0.0
    induction[rows, rows - period + 1] = 1.0
    weights[1, :, 1] = induction  # layer 1, head 1: the token after the earlier copy
    scores = induction_scores(weights, period)
    assert scores["previous_token"][0, 0] == pytest.approx(1.0)
    assert scores["prefix_matching"][1, 1] == pytest.approx(1.0)
    assert scores["prefix_matching"][0, 0] < 0.5 and scores["previous_token"][1, 1] < 0.5
    # a uniform head over t + 1 keys gives each of them 1 / (t + 1)
    expected = torch.tensor([1 / (t + 1) for t in range(period, T)]).mean()
    assert scores["prefix_matching"][0, 1].item() == pytest.approx(expected.item())
    with pytest.raises(ValueError, match="period must be between"):
        induction_scores(weights, T)


def test_induction_scores_read_a_models_returned_weights():
    from attnbook.data import repeated_tokens
    from attnbook.models import induction_scores

    model = TinyGPT(TransformerConfig(vocab_size=20, d_model=16, n_heads=2, mlp="none"))
    tokens = repeated_tokens(3, 6, 20, generator=torch.Generator().manual_seed(7))
    _, weights = model(tokens, return_weights=True)
    scores = induction_scores(weights, 6)
    assert scores["prefix_matching"].shape == scores["previous_token"].shape == (2, 2)
    assert ((scores["prefix_matching"] > 0) & (scores["prefix_matching"] < 1)).all()


# --------------------------------------------------------------------------------------
# The encoder-decoder
# --------------------------------------------------------------------------------------
def _seq2seq(**options):
    from attnbook.models import TinySeq2Seq

    torch.manual_seed(0)
    return TinySeq2Seq(TransformerConfig(vocab_size=12, d_model=32, n_heads=4, **options)).eval()


@pytest.mark.parametrize("position", ["pre", "post"])
def test_the_decoder_is_causal_and_reads_only_the_real_source_tokens(position):
    model = _seq2seq(norm_position=position)
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(3, 12, (2, 7), generator=g), torch.randint(3, 12, (2, 5), generator=g)
    src_mask = torch.ones(2, 7, dtype=torch.bool)
    src_mask[1, 5:] = False  # the second source has 5 real tokens
    logits, weights = model(src, tgt, src_mask, return_weights=True)
    assert logits.shape == (2, 5, 12) and weights.shape == (2, 2, 4, 5, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 4, 5))
    assert (weights[:, 1, :, :, 5:] == 0).all()
    later = tgt.clone()
    later[:, 3:] = 3  # change the future target tokens: earlier positions must not move
    torch.testing.assert_close(model(src, later, src_mask)[:, :3], logits[:, :3])
    padded = src.clone()
    padded[1, 5:] = 4  # change padding only
    torch.testing.assert_close(model(padded, tgt, src_mask)[1], logits[1])
    changed = src.clone()
    changed[0, 0] = 3 if src[0, 0] != 3 else 4
    assert not torch.allclose(model(changed, tgt, src_mask)[0], logits[0])


def test_the_encoder_decoder_learns_to_reverse_a_string():
    from attnbook.data import BOS

    model = _seq2seq().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(2)
    for _ in range(250):
        src = torch.randint(3, 12, (32, 6), generator=g)
        tgt = torch.cat([torch.full((32, 1), BOS), src.flip(1)], dim=1)
        loss = torch.nn.functional.cross_entropy(model(src, tgt[:, :-1]).flatten(0, 1), tgt[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    src = torch.randint(3, 12, (64, 6), generator=g)
    tgt = torch.cat([torch.full((64, 1), BOS), src.flip(1)], dim=1)
    with torch.no_grad():
        predicted = model(src, tgt[:, :-1]).argmax(-1)
    assert (predicted == tgt[:, 1:]).float().mean() > 0.9


# --------------------------------------------------------------------------------------
# Padding masks: key_padding_mask, and no (B, S) mask taken for a (T, S) one
# --------------------------------------------------------------------------------------
def _padded_batch(B, S, side, seed=0):
    """``(B, S)`` ids and the key padding mask (True = padding): row ``b`` holds ``S - b``
    real tokens (at least 1), padded on the right or the left."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 11, (B, S), generator=g)
    padding = torch.zeros(B, S, dtype=torch.bool)
    for b in range(B):
        n = max(1, S - b)
        if side == "right":
            padding[b, n:] = True
        else:
            padding[b, : S - n] = True
    idx[padding] = 0  # whatever the padding holds, it must not matter
    return idx, padding


def _check_rows_equal_alone(model, idx, padding, atol):
    out = model(idx, key_padding_mask=padding)
    for b in range(idx.shape[0]):
        real = ~padding[b]
        alone = model(idx[b : b + 1, real])[0]  # the sequence without any padding
        torch.testing.assert_close(out[b, real], alone, rtol=0, atol=atol)


@pytest.mark.parametrize("B,S", [(3, 3), (2, 5)])  # B == S used to broadcast as a (T, S) mask
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("scheme", POSITIONAL_SCHEMES)
@pytest.mark.parametrize("cls", [TinyGPT, TinyEncoder])
def test_key_padding_mask_gives_each_row_the_logits_of_its_sequence_alone(cls, scheme, side, B, S):
    torch.manual_seed(0)
    model = cls(config(positional=scheme)).double().eval()
    idx, padding = _padded_batch(B, S, side)
    _check_rows_equal_alone(model, idx, padding, atol=1e-10)


@pytest.mark.parametrize("B,S", [(3, 3), (2, 5)])
@pytest.mark.parametrize("side", ["right", "left"])
def test_key_padding_mask_in_float32_and_with_latent_attention(side, B, S):
    """float32 to 1e-5; MLA's decoupled rotary part numbers slots (its float32 angles round
    differently at shifted positions), so it is checked in float32 only."""
    torch.manual_seed(0)
    _check_rows_equal_alone(TinyGPT(config()).eval(), *_padded_batch(B, S, side), atol=1e-5)
    mla = TinyGPT(config(attention="mla", rope_dim=4)).eval()
    _check_rows_equal_alone(mla, *_padded_batch(B, S, side), atol=1e-5)


@pytest.mark.parametrize("scheme", POSITIONAL_SCHEMES)
def test_key_padding_mask_with_a_cache_equals_the_full_pass(scheme):
    """Prefill a left-padded batch, then decode through the cache with the mask grown to every
    cached key: the logits at the real tokens equal the full pass's."""
    torch.manual_seed(0)
    model = TinyGPT(config(positional=scheme)).double().eval()
    idx, padding = _padded_batch(3, 9, "left")
    full = model(idx, key_padding_mask=padding)
    cache = model.make_cache(3, 9)
    pieces = [model(idx[:, a:b], cache=cache, key_padding_mask=padding[:, :b])
              for a, b in [(0, 5), (5, 6), (6, 9)]]
    torch.testing.assert_close(torch.cat(pieces, 1)[~padding], full[~padding], rtol=0, atol=1e-10)


def test_a_four_dimensional_attn_mask_still_works_and_agrees_with_key_padding_mask():
    """The callers' form, bool (B, 1, 1, S) with True = real token (TinySeq2Seq.encode), and an
    additive float mask both keep working; with right padding they equal key_padding_mask."""
    torch.manual_seed(0)
    for cls in (TinyGPT, TinyEncoder):
        model = cls(config(positional="learned")).double().eval()
        idx, padding = _padded_batch(3, 3, "right")
        keep = ~padding[:, None, None, :]
        real = ~padding  # the outputs at padding positions mean nothing
        expected = model(idx, key_padding_mask=padding)[real]
        torch.testing.assert_close(model(idx, keep)[real], expected, rtol=0, atol=0)
        additive = torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, float("-inf"))
        torch.testing.assert_close(model(idx, additive)[real], expected, rtol=0, atol=0)
        both = model(idx, keep, key_padding_mask=padding)[real]  # the same mask twice
        torch.testing.assert_close(both, expected, rtol=0, atol=0)


@pytest.mark.parametrize("B,S", [(3, 3), (2, 5), (4, 1)])
@pytest.mark.parametrize("cls", [TinyGPT, TinyEncoder])
def test_a_two_dimensional_mask_is_refused_not_broadcast_as_query_by_key(cls, B, S):
    model = cls(config()).eval()
    idx = tokens(B=B, T=S)
    with pytest.raises(ValueError) as info:
        model(idx, torch.ones(B, S, dtype=torch.bool))
    message = str(info.value)
    for fragment in (f"{cls.__name__}.forward", "attn_mask", f"(batch, n_heads, T, S) = ({B}, 4, {S}, {S})",
                     f"got ({B}, {S})", "key_padding_mask"):
        assert fragment in message, message


def test_the_decoders_memory_mask_and_src_mask_are_checked():
    model = _seq2seq()
    src, tgt = torch.randint(3, 12, (3, 3)), torch.randint(3, 12, (3, 3))
    with pytest.raises(ValueError, match=r"src_mask must be a bool tensor of src's shape \(batch, S\) = \(3, 3\)"):
        model(src, tgt, torch.ones(3, 1, 1, 3, dtype=torch.bool))
    memory, _ = model.encode(src)
    with pytest.raises(ValueError, match=r"memory_mask must have 4 dimensions .* got \(3, 3\)"):
        model.blocks[0](model.tok_emb(tgt), memory, torch.ones(3, 3, dtype=torch.bool))


# --------------------------------------------------------------------------------------
# generate runs in eval mode and restores the caller's modes
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["rope", "learned"])
def test_generate_in_training_mode_gives_identical_cached_and_uncached_tokens(scheme):
    torch.manual_seed(0)
    model = TinyGPT(config(positional=scheme, dropout=0.5, max_len=32)).double()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    model.train()
    model.blocks[1].mlp.eval()  # a submodule the caller froze: it must stay in eval
    prompt = tokens(B=3, T=5)
    cached = model.generate(prompt, 20, use_cache=True)
    uncached = model.generate(prompt, 20, use_cache=False)
    assert torch.equal(cached, uncached)
    assert model.training and model.blocks[0].attn.training and model.blocks[1].ln1.training
    assert not model.blocks[1].mlp.training and not model.blocks[1].mlp.dropout.training
    torch.testing.assert_close(model.eval()(prompt), model(prompt))  # eval: deterministic
    assert torch.equal(model.generate(prompt, 20), cached)  # eval mode gives the same tokens
    assert not model.training
    model.train()
    with pytest.raises(ValueError):  # restored on error too
        model.generate(prompt, 2, temperature=-1.0)
    assert model.training


def test_seq2seq_generate_runs_in_eval_mode_and_restores_training():
    from attnbook.models import TinySeq2Seq

    torch.manual_seed(0)
    model = TinySeq2Seq(TransformerConfig(vocab_size=12, d_model=32, n_heads=4, dropout=0.5))
    src = torch.randint(3, 12, (4, 6), generator=torch.Generator().manual_seed(1))
    model.train()
    out = model.generate(src, max_len=8)
    assert model.training and model.encoder.training and model.blocks[0].cross.training
    assert torch.equal(out, model.eval().generate(src, max_len=8))


# --------------------------------------------------------------------------------------
# Bad input: ValueError or TypeError naming the function, the argument, expected and got
# --------------------------------------------------------------------------------------
def _gpt(**kw):
    torch.manual_seed(0)
    return TinyGPT(config(**kw)).eval()


_IDS = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(0))
BAD_MODEL_INPUTS = [
    # config fields
    (lambda: config(n_heads=0), ValueError, ["TransformerConfig", "n_heads", "positive integer", "0"]),
    (lambda: config(n_heads=-4), ValueError, ["TransformerConfig", "n_heads", "-4"]),
    (lambda: config(d_model=18), ValueError, ["TransformerConfig", "d_model=18", "divisible", "n_heads=4"]),
    (lambda: config(d_model=16.0), ValueError, ["TransformerConfig", "d_model", "16.0"]),
    (lambda: config(max_len=-1), ValueError, ["TransformerConfig", "max_len", "-1"]),
    (lambda: config(max_len=0, positional="none"), ValueError, ["TransformerConfig", "max_len", "0"]),
    (lambda: config(n_layers=0), ValueError, ["TransformerConfig", "n_layers", "0"]),
    (lambda: config(vocab_size=0), ValueError, ["TransformerConfig", "vocab_size", "0"]),
    (lambda: config(n_kv_heads=0), ValueError, ["TransformerConfig", "n_kv_heads", "0"]),
    (lambda: config(n_kv_heads=3), ValueError, ["TransformerConfig", "n_heads=4", "n_kv_heads=3"]),
    (lambda: config(d_ff=0), ValueError, ["TransformerConfig", "d_ff", "0"]),
    (lambda: config(dropout=float("nan")), ValueError, ["TransformerConfig", "dropout", "[0, 1)", "nan"]),
    (lambda: config(dropout=-0.1), ValueError, ["TransformerConfig", "dropout", "-0.1"]),
    (lambda: config(dropout=1.0), ValueError, ["TransformerConfig", "dropout", "1.0"]),
    (lambda: config(rope_base=float("nan")), ValueError, ["TransformerConfig", "rope_base", "nan"]),
    (lambda: config(rope_base=0.0), ValueError, ["TransformerConfig", "rope_base", "0.0"]),
    (lambda: config(d_model=12, n_heads=4), ValueError, ["TransformerConfig", "head_dim", "even", "3"]),
    (lambda: config(d_model=15, n_heads=5, positional="sinusoidal"), ValueError,
     ["TransformerConfig", "sinusoidal", "even d_model", "15"]),
    (lambda: config(positional="t5", t5_num_buckets=8, t5_max_distance=4), ValueError,
     ["TransformerConfig", "t5_max_distance", "t5_num_buckets=8", "t5_max_distance=4"]),
    (lambda: TinyEncoder(config(positional="t5", t5_num_buckets=2)), ValueError,
     ["TinyEncoder", "t5_num_buckets >= 4", "2"]),
    (lambda: config(tie_weights=1), TypeError, ["TransformerConfig", "tie_weights", "1"]),
    (lambda: config(attention="mla", rope_dim=3), ValueError, ["TransformerConfig", "rope_dim", "3"]),
    (lambda: TinyGPT({"d_model": 16}), TypeError, ["TinyGPT", "config", "TransformerConfig", "dict"]),
    (lambda: RMSNorm(0), ValueError, ["RMSNorm", "dim", "0"]),
    (lambda: RMSNorm(4, eps=-1.0), ValueError, ["RMSNorm", "eps", "-1.0"]),
    # forward
    (lambda: _gpt()(torch.full((2, 5), 11)), ValueError,
     ["TinyGPT.forward", "idx", "[11, 11]", "vocab_size=11"]),
    (lambda: _gpt()(_IDS - 3), ValueError, ["TinyGPT.forward", "idx", "[-3,", "[0, 11)"]),
    (lambda: TinyEncoder(config()).eval()(torch.full((2, 5), 40)), ValueError,
     ["TinyEncoder.forward", "idx", "[40, 40]", "vocab_size=11"]),
    (lambda: _gpt()(_IDS.float()), TypeError, ["TinyGPT.forward", "idx", "int64", "float32"]),
    (lambda: _gpt()(_IDS[0]), ValueError, ["TinyGPT.forward", "idx", "(batch, seq)", "(5,)"]),
    (lambda: _gpt()(_IDS[:, :0]), ValueError, ["TinyGPT.forward", "idx", "seq >= 1", "(2, 0)"]),
    (lambda: _gpt()(_IDS, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)), ValueError,
     ["TinyGPT.forward", "key_padding_mask", "(2, 5)", "(2, 4)"]),
    (lambda: _gpt()(_IDS, key_padding_mask=torch.zeros(2, 5)), TypeError,
     ["TinyGPT.forward", "key_padding_mask", "bool", "float32"]),
    (lambda: _gpt()(_IDS, torch.ones(2, 1, 5, dtype=torch.bool)), ValueError,
     ["TinyGPT.forward", "attn_mask", "(2, 4, 5, 5)", "got (2, 1, 5)"]),
    (lambda: _gpt()(_IDS, torch.ones(2, 1, 1, 4, dtype=torch.bool)), ValueError,
     ["TinyGPT.forward", "attn_mask", "(2, 4, 5, 5)", "got (2, 1, 1, 4)"]),
    (lambda: _gpt()(_IDS, torch.ones(2, 1, 1, 5, dtype=torch.long)), TypeError,
     ["TinyGPT.forward", "attn_mask", "bool", "int64"]),
    (lambda: _gpt()(_IDS, head_mask=torch.ones(2, 3, 4)), ValueError,
     ["TinyGPT.forward", "head_mask", "batch=2", "(2, 3, 4)"]),
    (lambda: _gpt(positional="learned")(torch.zeros(1, 25, dtype=torch.long)), ValueError, ["max_len=24"]),
    # generate
    (lambda: _gpt().generate(_IDS, -1), ValueError, ["TinyGPT.generate", "max_new_tokens", "-1"]),
    (lambda: _gpt().generate(_IDS, 2.0), ValueError, ["TinyGPT.generate", "max_new_tokens", "2.0"]),
    (lambda: _gpt().generate(_IDS, 2, temperature=float("nan")), ValueError,
     ["TinyGPT.generate", "temperature", "nan"]),
    (lambda: _gpt().generate(_IDS, 2, temperature=-0.5), ValueError, ["TinyGPT.generate", "temperature", "-0.5"]),
    (lambda: _gpt().generate(_IDS, 2, temperature=float("inf")), ValueError,
     ["TinyGPT.generate", "temperature", "inf"]),
    (lambda: _gpt().generate(_IDS, 2, temperature=1.0, top_k=0), ValueError,
     ["TinyGPT.generate", "top_k", "positive integer", "0"]),
    (lambda: _gpt().generate(_IDS, 2, temperature=1.0, top_k=2.5), ValueError, ["TinyGPT.generate", "top_k", "2.5"]),
    (lambda: _gpt().generate(_IDS + 11, 2), ValueError, ["TinyGPT.generate", "idx", "vocab_size=11", "[11,"]),
    (lambda: _gpt().generate(_IDS[:, :0], 2), ValueError, ["TinyGPT.generate", "idx", "seq >= 1"]),
    (lambda: _gpt().make_cache(0, 4), ValueError, ["TinyGPT.make_cache", "batch", "0"]),
    # the encoder-decoder
    (lambda: _seq2seq().generate(_IDS, max_len=0), ValueError, ["TinySeq2Seq.generate", "max_len", "0"]),
    (lambda: _seq2seq().generate(_IDS, max_len=3, eos=12), ValueError,
     ["TinySeq2Seq.generate", "eos", "[0, 12)", "12"]),
    (lambda: _seq2seq().generate(_IDS + 12, max_len=3), ValueError,
     ["TinySeq2Seq.encode", "src", "vocab_size=12"]),
    (lambda: _seq2seq()(_IDS, _IDS[:1]), ValueError, ["TinySeq2Seq.forward", "same batch size"]),
    (lambda: _seq2seq()(_IDS, _IDS + 12), ValueError, ["TinySeq2Seq.decode", "tgt", "vocab_size=12"]),
    (lambda: TinySeq2SeqOf(positional="alibi"), ValueError, ["TinySeq2Seq", "positional", "'alibi'"]),
    # head masks and scores
    (lambda: drophead_mask(2, 4, float("nan"), 3), ValueError, ["drophead_mask", "p", "nan"]),
    (lambda: drophead_mask(2, 0, 0.1, 3), ValueError, ["drophead_mask", "n_heads", "0"]),
    (lambda: drophead_mask(2, 4, 0.1, -1), ValueError, ["drophead_mask", "batch_size", "-1"]),
    (lambda: head_importance(_gpt(), [], lambda m, b, g: 0), ValueError, ["head_importance", "batches is empty"]),
    (lambda: InductionScores(torch.rand(2, 1, 4, 6, 6), 0), ValueError, ["induction_scores", "period", "0"]),
    (lambda: InductionScores(torch.rand(2, 4, 6, 6), 2), ValueError,
     ["induction_scores", "weights", "(n_layers, batch, n_heads, T, T)", "(2, 4, 6, 6)"]),
]


def TinySeq2SeqOf(**kw):
    from attnbook.models import TinySeq2Seq

    return TinySeq2Seq(TransformerConfig(vocab_size=12, d_model=32, n_heads=4, **kw))


def InductionScores(weights, period):
    from attnbook.models import induction_scores

    return induction_scores(weights, period)


@pytest.mark.parametrize("call,error,fragments", BAD_MODEL_INPUTS,
                         ids=[f"{i}-" + "-".join(f[:2]) for i, (_, _, f) in enumerate(BAD_MODEL_INPUTS)])
def test_bad_model_input_is_refused_with_a_clear_message(call, error, fragments):
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from: {message}"


def test_a_config_changed_after_construction_is_checked_again():
    cfg = config()
    cfg.n_heads = 0
    with pytest.raises(ValueError, match="TransformerConfig: n_heads must be a positive integer"):
        TinyGPT(cfg)


@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_an_empty_batch_gives_empty_outputs(attention):
    model = _gpt(attention=attention, rope_dim=4)
    empty = torch.zeros(0, 5, dtype=torch.long)
    assert model(empty).shape == (0, 5, 11)
    logits, weights = model(empty, return_weights=True)
    assert logits.shape == (0, 5, 11) and weights.shape == (2, 0, 4, 5, 5)
    assert model(empty, hidden=True).shape == (0, 5, 16)
    assert model.generate(empty, 3).shape == (0, 8) and model.generate(empty, 3, use_cache=False).shape == (0, 8)
    assert drophead_mask(2, 4, 0.5, 0).shape == (2, 0, 4)


def test_top_k_above_the_vocabulary_keeps_every_token():
    model = _gpt()
    prompt = tokens(T=3)

    def sample(**kw):
        return model.generate(prompt, 10, temperature=1.0, generator=torch.Generator().manual_seed(5), **kw)

    assert torch.equal(sample(top_k=1000), sample())


def test_layers_and_head_ablation_name_a_wrong_input():
    """Regression: MLP and Block raised RuntimeError on a wrong width or an integer input,
    head_ablation AttributeError on a model without a config."""
    from attnbook.models import MLP, Block, head_ablation

    cfg = TransformerConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1)
    with pytest.raises(ValueError, match=r"MLP.forward: x must have shape \(..., d_model=16\), got \(2, 7\)"):
        MLP(cfg)(torch.randn(2, 7))
    with pytest.raises(TypeError, match="Block.forward: x must be a floating-point tensor"):
        Block(cfg, is_causal=True)(torch.ones(2, 3, 16, dtype=torch.long))
    with pytest.raises(TypeError, match="head_ablation: model must be a model with a TransformerConfig"):
        head_ablation(torch.nn.Linear(2, 2), lambda model, mask: 0.0)
