"""Tests for attnbook.models: shapes, causality, agreement with core.MultiHeadAttention, positional schemes."""

import pytest
import torch

from attnbook.core import MultiHeadAttention
from attnbook.models import POSITIONAL_SCHEMES, Attention, TinyEncoder, TinyGPT, TransformerConfig
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
    ours = Attention(cfg, causal=True).eval()
    core = MultiHeadAttention(16, 4, n_kv_heads=2).eval()
    core.load_state_dict(ours.state_dict())  # same projection layout and names
    x = torch.randn(3, 7, 16)
    torch.testing.assert_close(ours(x), core(x, is_causal=True))
    assert ours.k_proj.weight.shape == (2 * 4, 16)  # grouped-query attention: 2 K/V heads of width 4


def test_rope_attention_rotates_queries_and_keys():
    torch.manual_seed(0)
    cfg = config(positional="rope")
    ours = Attention(cfg, causal=True).eval()
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
