"""Tests for the serving chapter's models: multi-head latent attention (its absorbed decoding against
materializing the keys and values, against the full pass and against the formulas written out here),
its latent cache, cache sizes against DeepSeek-V2's published comparison, the MLA language model, and
speculative decoding (greedy: the target's own tokens; sampling: the target's distribution, by a
chi-square test that a wrong rule fails)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from attnbook.serving import (
    DEEPSEEK_V2,
    LatentKVCache,
    MultiHeadLatentAttention,
    SpeculativeStats,
    acceptance_probability,
    cache_bytes_per_token,
    expected_speedup,
    expected_tokens_per_call,
    sampling_probs,
    speculative_accept,
    speculative_generate,
    truncate_cache,
)
from attnbook.kvcache import MODEL_CONFIGS, CacheFullError, KVCache, SlidingWindowKVCache, kv_cache_bytes
from attnbook.models import LatentAttention, TinyEncoder, TinyGPT, TransformerConfig
from attnbook.positional import rope_complex


# --------------------------------------------------------------------------------------------------
# Multi-head latent attention
# --------------------------------------------------------------------------------------------------
def mla(seed=0, d_model=8, n_heads=2, kv_latent_dim=5, rope_dim=4, **kw) -> MultiHeadLatentAttention:
    """A float64 MLA layer whose every parameter (the norms' weights too) is drawn from a seeded generator."""
    module = MultiHeadLatentAttention(d_model, n_heads, kv_latent_dim, rope_dim, **kw).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.7 + (p.dim() == 1))
    return module


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def rms(x, weight):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps) * weight


def mla_by_formula(m, x, is_causal=True):
    """DeepSeek-V2's equations written out: RMSNorm'd latent, per-head up-projections, decoupled RoPE
    (complex-number form), one score over [nope; rope], PyTorch's attention."""
    B, T, _ = x.shape
    H, d, r = m.n_heads, m.head_dim, m.rope_dim
    pos = torch.arange(T)
    c_kv = rms(x @ m.kv_down.weight.T, m.kv_norm.weight)
    k_nope = (c_kv @ m.k_up.weight.T).view(B, T, H, d).transpose(1, 2)
    v = (c_kv @ m.v_up.weight.T).view(B, T, H, d).transpose(1, 2)
    k_rope = rope_complex(x @ m.k_rope_proj.weight.T, pos)  # (B, T, r), one for all heads
    c_q = x if m.q_down is None else rms(x @ m.q_down.weight.T, m.q_norm.weight)
    q_nope = (c_q @ m.q_up.weight.T).view(B, T, H, d).transpose(1, 2)
    q_rope = rope_complex((c_q @ m.q_rope_proj.weight.T).view(B, T, H, r).transpose(1, 2), pos)
    q = torch.cat((q_nope, q_rope), -1)
    k = torch.cat((k_nope, k_rope[:, None].expand(B, H, T, r)), -1)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)  # scale 1/sqrt(d + r)
    return out.transpose(1, 2).reshape(B, T, H * d) @ m.out_proj.weight.T, c_kv, k_rope


def attend_to_materialized_cache(m, x_new, c_kv, k_rope):
    """The naive decode: rebuild every head's keys and values from the cached latent by hand, then
    standard attention of the new queries (the last T positions) with a bottom-right causal mask."""
    B, T, _ = x_new.shape
    S, H, d, r = c_kv.shape[1], m.n_heads, m.head_dim, m.rope_dim
    w_uk = m.k_up.weight.view(H, d, -1)
    w_uv = m.v_up.weight.view(H, d, -1)
    k = torch.cat((torch.einsum("hdc,bsc->bhsd", w_uk, c_kv), k_rope[:, None].expand(B, H, S, r)), -1)
    v = torch.einsum("hdc,bsc->bhsd", w_uv, c_kv)
    q_nope, q_rope = m.queries(x_new, offset=S - T)
    allowed = torch.ones(T, S, dtype=torch.bool).tril(S - T)
    out = F.scaled_dot_product_attention(torch.cat((q_nope, q_rope), -1), k, v, attn_mask=allowed)
    return m.out_proj(out.transpose(1, 2).reshape(B, T, H * d))


shapes = dict(
    B=st.integers(1, 2),
    n_heads=st.integers(1, 3),
    head_dim=st.integers(1, 4),
    d_model=st.integers(1, 7),
    kv_latent_dim=st.integers(1, 6),
    rope_dim=st.sampled_from([2, 4]),
    q_latent_dim=st.none() | st.integers(1, 5),
    seed=st.integers(0, 10_000),
)


@given(T=st.integers(1, 7), is_causal=st.booleans(), **shapes)
def test_mla_full_pass_equals_the_formulas_written_out(T, is_causal, B, seed, **sizes):
    m = mla(seed, **sizes)
    x = randn(B, T, sizes["d_model"], seed=seed + 1)
    expected, _, _ = mla_by_formula(m, x, is_causal)
    out, weights = m(x, is_causal=is_causal, return_weights=True)
    torch.testing.assert_close(out, expected)
    assert weights.shape == (B, sizes["n_heads"], T, T)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, sizes["n_heads"], T, dtype=torch.float64))


@settings(max_examples=25)
@given(chunks=st.lists(st.integers(1, 4), min_size=1, max_size=4), **shapes)
def test_absorbed_decoding_equals_the_materialized_cache_and_the_full_pass(chunks, B, seed, **sizes):
    """Feed a sequence through the latent cache in ragged chunks (a prefill, then pieces, then single
    tokens): each chunk's output equals the naive reconstruction from what the cache holds and the
    full pass's rows; the cache holds exactly the latent and rotated key of the formulas."""
    m = mla(seed, **sizes)
    T = sum(chunks)
    x = randn(B, T, sizes["d_model"], seed=seed + 1)
    full, full_weights = m(x, return_weights=True)
    _, c_kv, k_rope = mla_by_formula(m, x)
    cache = LatentKVCache(1, B, sizes["kv_latent_dim"], sizes["rope_dim"], max_len=T, dtype=torch.float64)
    start = 0
    for n in chunks:
        out, weights = m(x[:, start:start + n], cache=cache, return_weights=True)
        stop = start + n
        assert cache.length == stop
        stored_c, stored_r = cache.c_kv[0, :, :stop], cache.k_rope[0, :, :stop]
        torch.testing.assert_close(stored_c, c_kv[:, :stop])
        torch.testing.assert_close(stored_r, k_rope[:, :stop])
        torch.testing.assert_close(out, attend_to_materialized_cache(m, x[:, start:stop], stored_c, stored_r))
        torch.testing.assert_close(out, full[:, start:stop])
        torch.testing.assert_close(weights, full_weights[:, :, start:stop, :stop])
        start = stop


def test_absorbed_matrices_are_the_up_projections_moved_into_the_query_and_the_output():
    m = mla(3, d_model=6, n_heads=3, kv_latent_dim=4, rope_dim=2)
    w_uk, w_uvo = m.absorbed()
    c, q = randn(4, seed=1), randn(3, 2, seed=2)  # one latent, one no-rope query per head
    for h in range(3):
        k_h = m.k_up.weight[2 * h:2 * h + 2] @ c  # this head's key, materialized
        torch.testing.assert_close(q[h] @ k_h, (q[h] @ w_uk[h]) @ c)
        v_h = m.v_up.weight[2 * h:2 * h + 2] @ c
        torch.testing.assert_close(m.out_proj.weight[:, 2 * h:2 * h + 2] @ v_h, c @ w_uvo[h])


@pytest.mark.parametrize("q_latent_dim", [None, 3])
def test_mla_is_causal_unless_told_otherwise(q_latent_dim):
    m = mla(1, q_latent_dim=q_latent_dim)
    x = randn(2, 6, 8, seed=1)
    y = x.clone()
    y[:, 4:] += randn(2, 2, 8, seed=2)  # change the last two tokens
    torch.testing.assert_close(m(x)[:, :4], m(y)[:, :4], rtol=0, atol=0)
    assert not torch.allclose(m(x)[:, 4:], m(y)[:, 4:])
    assert not torch.allclose(m(x, is_causal=False)[:, :4], m(y, is_causal=False)[:, :4])


def test_masks_and_head_masks_act_the_same_in_both_paths():
    """The cached (absorbed) prefill and the uncached (materialized) pass agree with a boolean mask
    that empties a query row (zeros, not NaN), an additive mask, and head masks; zeroing a head
    equals an output projection that ignores it."""
    m = mla(2, n_heads=3, head_dim=2)
    x = randn(2, 5, 8, seed=1)
    bool_mask = torch.rand(2, 1, 5, 5, generator=torch.Generator().manual_seed(0)) > 0.4
    bool_mask[0, 0, 3] = False  # a query that may see nothing
    additive = randn(1, 3, 5, 5, seed=3)
    head_mask = torch.tensor([[1.0, 0.0, 0.5], [0.0, 2.0, 1.0]])
    for kw in (dict(attn_mask=bool_mask), dict(attn_mask=additive), dict(head_mask=head_mask),
               dict(head_mask=head_mask[0]), dict(attn_mask=bool_mask, is_causal=False)):
        cache = LatentKVCache(1, 2, 5, 4, max_len=5, dtype=torch.float64)
        uncached = m(x, **kw)
        assert torch.isfinite(uncached).all()
        torch.testing.assert_close(m(x, cache=cache, **kw), uncached)
    assert m(x, attn_mask=bool_mask)[0, 3].abs().max() == 0
    ignored = mla(2, n_heads=3, head_dim=2)
    with torch.no_grad():
        ignored.out_proj.weight[:, 2:4] = 0  # head 1's columns
    torch.testing.assert_close(m(x, head_mask=torch.tensor([1.0, 0.0, 1.0])), ignored(x))


def test_mla_rejects_bad_arguments_naming_them():
    for kw, name in [(dict(rope_dim=3), "rope_dim"), (dict(kv_latent_dim=0), "kv_latent_dim"),
                     (dict(n_heads=3), "d_model=8"), (dict(q_latent_dim=0), "q_latent_dim"),
                     (dict(head_dim=0), "head_dim")]:
        with pytest.raises(ValueError, match=name):
            mla(**kw)
    m = mla()
    with pytest.raises(ValueError, match=r"x must have shape \(batch, seq, d_model=8\), got \(2, 3, 7\)"):
        m(randn(2, 3, 7))
    with pytest.raises(ValueError, match="x must"):
        m(randn(3, 8))
    with pytest.raises(TypeError, match="cache must be a LatentKVCache"):
        m(randn(2, 3, 8), cache=KVCache(1, 2, 2, 4, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"c_kv_new and k_rope_new must have shapes \(1, T, 5\)"):
        m(randn(2, 3, 8), cache=LatentKVCache(1, 1, 5, 4, 8, dtype=torch.float64))  # batch 1 cache
    with pytest.raises(ValueError, match=r"\(2, T, 6\)"):
        m(randn(2, 3, 8), cache=LatentKVCache(1, 2, 6, 4, 8, dtype=torch.float64))  # latent width 6
    with pytest.raises(ValueError, match="head_mask"):
        m(randn(2, 3, 8), head_mask=torch.ones(3))
    with pytest.raises(ValueError, match="layer=1 is not a layer of the cache"):
        mla(layer=1)(randn(2, 3, 8), cache=LatentKVCache(1, 2, 5, 4, 8, dtype=torch.float64))


# --------------------------------------------------------------------------------------------------
# The latent cache and cache sizes
# --------------------------------------------------------------------------------------------------
class LatentCacheMachine(RuleBasedStateMachine):
    """Any sequence of appends, rollbacks and resets on a two-layer latent cache: what it returns
    and holds equals the concatenation of what was appended and kept, recomputed from scratch."""

    def __init__(self):
        super().__init__()
        self.cache = LatentKVCache(2, 2, 3, 2, max_len=10, dtype=torch.float64)
        self.kept = []  # (c, r) pieces

    def _held(self):
        if not self.kept:
            return torch.zeros(2, 0, 3, dtype=torch.float64), torch.zeros(2, 0, 2, dtype=torch.float64)
        return torch.cat([c for c, _ in self.kept], 1), torch.cat([r for _, r in self.kept], 1)

    @rule(n=st.integers(1, 4), seed=st.integers(0, 1000))
    def append(self, n, seed):
        c, r = randn(2, n, 3, seed=seed), randn(2, n, 2, seed=seed + 1)
        if self.cache.length + n > 10:
            with pytest.raises(CacheFullError, match="max_len=10"):
                self.cache.update(0, c, r)
            return
        self.kept.append((c, r))
        held_c, held_r = self._held()
        for layer in range(2):
            out_c, out_r = self.cache.update(layer, c * (layer + 1), r * (layer + 1))
            torch.testing.assert_close(out_c, held_c * (layer + 1))
            torch.testing.assert_close(out_r, held_r * (layer + 1))

    @precondition(lambda self: self.cache.length > 0)
    @rule(data=st.data())
    def roll_back(self, data):
        length = data.draw(st.integers(0, self.cache.length))
        truncate_cache(self.cache, length)
        held_c, held_r = self._held()
        self.kept = [(held_c[:, :length], held_r[:, :length])]

    @rule()
    def reset(self):
        self.cache.reset()
        self.kept = []

    @invariant()
    def length_is_what_was_kept(self):
        held_c, held_r = self._held()
        assert self.cache.length == held_c.shape[1] == min(self.cache.lengths)
        for layer in range(2):
            torch.testing.assert_close(self.cache.c_kv[layer, :, :held_c.shape[1]], held_c * (layer + 1))
            torch.testing.assert_close(self.cache.k_rope[layer, :, :held_r.shape[1]], held_r * (layer + 1))


TestLatentCacheMachine = LatentCacheMachine.TestCase
TestLatentCacheMachine.settings = settings(max_examples=20, stateful_step_count=12, deadline=None)


def test_latent_cache_size_and_bad_arguments():
    cache = LatentKVCache(3, 2, 10, 4, max_len=7, dtype=torch.bfloat16)
    assert cache.bytes_per_token == 3 * (10 + 4) * 2
    assert cache.bytes_per_token * 7 * 2 == cache.c_kv.nbytes + cache.k_rope.nbytes  # all it holds
    assert cache.bytes_per_token == cache_bytes_per_token(
        "mla", n_layers=3, n_heads=8, head_dim=16, kv_latent_dim=10, rope_dim=4)
    with pytest.raises(ValueError, match="rope_dim"):
        LatentKVCache(1, 1, 4, 0, 5)
    with pytest.raises(ValueError, match="layer must be in"):
        cache.update(3, torch.zeros(2, 1, 10), torch.zeros(2, 1, 4))


@pytest.mark.parametrize("name", list(MODEL_CONFIGS))
def test_cache_bytes_per_token_equals_kv_cache_bytes_for_mha_gqa_and_mqa(name):
    cfg = MODEL_CONFIGS[name]
    sizes = dict(n_layers=cfg["n_layers"], n_heads=cfg["n_heads"], head_dim=cfg["head_dim"])
    for b in (1, 2, 4):
        assert cache_bytes_per_token("mha", **sizes, bytes_per_elem=b) == kv_cache_bytes(
            cfg["n_layers"], cfg["n_heads"], cfg["head_dim"], 1, bytes_per_elem=b)
        assert cache_bytes_per_token("gqa", **sizes, n_kv_heads=cfg["n_kv_heads"], bytes_per_elem=b) == (
            kv_cache_bytes(cfg["n_layers"], cfg["n_kv_heads"], cfg["head_dim"], 1, bytes_per_elem=b))
        assert cache_bytes_per_token("mqa", **sizes, bytes_per_elem=b) == kv_cache_bytes(
            cfg["n_layers"], 1, cfg["head_dim"], 1, bytes_per_elem=b)


def test_deepseek_v2_latent_cache_equals_gqa_with_two_and_a_quarter_groups():
    """DeepSeek-V2 (DeepSeek-AI, 2024), Table 1: MLA caches (d_c + d_R) l = (9/2) d_h l elements per
    token, "equal to GQA with only 2.25 groups"; here with the published sizes of section 3.1.2."""
    cfg = DEEPSEEK_V2
    assert (cfg["n_layers"], cfg["n_heads"], cfg["head_dim"], cfg["kv_latent_dim"], cfg["rope_dim"]) == (
        60, 128, 128, 512, 64)
    sizes = {key: cfg[key] for key in ("n_layers", "n_heads", "head_dim")}
    mla_bytes = cache_bytes_per_token("mla", **sizes, kv_latent_dim=512, rope_dim=64)
    assert mla_bytes == 60 * 576 * 2 == 69_120  # 67.5 KiB per token in bf16
    per_group = cache_bytes_per_token("gqa", **sizes, n_kv_heads=1)
    assert mla_bytes / per_group == 2.25
    mha_bytes = cache_bytes_per_token("mha", **sizes)
    assert mha_bytes == 3_932_160 and mha_bytes / mla_bytes == pytest.approx(56.89, abs=0.01)
    assert mla_bytes < cache_bytes_per_token("gqa", **sizes, n_kv_heads=4)
    assert mla_bytes > cache_bytes_per_token("mqa", **sizes)


def test_cache_bytes_per_token_rejects_bad_arguments():
    sizes = dict(n_layers=2, n_heads=4, head_dim=8)
    with pytest.raises(ValueError, match="kind must be one of"):
        cache_bytes_per_token("mha2", **sizes)
    with pytest.raises(ValueError, match="needs n_kv_heads"):
        cache_bytes_per_token("gqa", **sizes)
    with pytest.raises(ValueError, match="needs rope_dim"):
        cache_bytes_per_token("mla", **sizes, kv_latent_dim=4)
    with pytest.raises(ValueError, match="n_kv_heads=3"):
        cache_bytes_per_token("gqa", **sizes, n_kv_heads=3)
    with pytest.raises(ValueError, match="cache_bytes_per_token: n_layers must be a positive integer"):
        cache_bytes_per_token("mqa", n_layers=0, n_heads=4, head_dim=8)


# --------------------------------------------------------------------------------------------------
# The MLA language model
# --------------------------------------------------------------------------------------------------
def config(**kw):
    base = dict(vocab_size=11, d_model=16, n_heads=4, n_layers=2, max_len=40, attention="mla",
                kv_latent_dim=6, rope_dim=4)
    return TransformerConfig(**{**base, **kw})


def tokens(B=2, T=9, seed=0, vocab=11):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


def scaled_model(seed, **kw):
    """A float64 model with larger random weights (at the default scale an untrained model repeats one
    token, which would make equal greedy outputs a weak test)."""
    torch.manual_seed(seed)
    model = TinyGPT(config(**kw)).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    return model


@pytest.mark.parametrize("q_latent_dim", [None, 5])
def test_mla_model_caches_latents_and_generates_the_same_tokens_with_and_without(q_latent_dim):
    model = scaled_model(0, q_latent_dim=q_latent_dim)
    assert all(isinstance(block.attn, LatentAttention) for block in model.blocks)
    cache = model.make_cache(3, 8)
    assert isinstance(cache, LatentKVCache) and cache.c_kv.shape == (2, 3, 8, 6) and cache.k_rope.shape[-1] == 4
    prompt = tokens(B=3, T=4)
    cached = model.generate(prompt, 16, use_cache=True)
    assert torch.equal(cached, model.generate(prompt, 16, use_cache=False))
    assert len(set(cached[:, 4:].flatten().tolist())) > 1
    # the default latent is 4 head_dim (DeepSeek-V2's d_c = 4 d_h)
    assert TinyGPT(config(kv_latent_dim=None)).make_cache(1, 2).c_kv.shape[-1] == 16


def test_mla_model_cached_logits_weights_and_head_masks_equal_the_full_pass():
    model = scaled_model(1)
    x = tokens(T=10)
    head_mask = torch.tensor([[1.0, 0.0, 1.0, 0.5], [0.0, 1.0, 1.0, 1.0]])
    full, weights = model(x, head_mask=head_mask, return_weights=True)
    cache = model.make_cache(2, 10)
    pieces = [model(x[:, a:b], cache=cache, head_mask=head_mask, return_weights=True)
              for a, b in [(0, 4), (4, 5), (5, 8), (8, 10)]]
    torch.testing.assert_close(torch.cat([logits for logits, _ in pieces], 1), full)
    torch.testing.assert_close(pieces[-1][1], weights[:, :, :, 8:10])
    assert weights.shape == (2, 2, 4, 10, 10) and cache.length == 10
    padded = torch.ones(2, 1, 1, 10, dtype=torch.bool)
    padded[1, ..., 7:] = False  # a padding mask reaches the layers as an additive bias
    out, plain = model(x, padded), model(x)
    torch.testing.assert_close(out[0], plain[0])
    torch.testing.assert_close(out[1, :7], plain[1, :7])  # causal: padding after them is unseen
    assert not torch.allclose(out[1, 7:], plain[1, 7:])


def test_mla_model_trains_and_an_mla_encoder_is_bidirectional():
    torch.manual_seed(0)
    model = TinyGPT(config(n_layers=1, d_model=32, init="scaled"))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(100):  # copy the previous token
        x = torch.randint(0, 11, (16, 12), generator=g)
        loss = F.cross_entropy(model(x)[:, 1:].flatten(0, 1), x[:, :-1].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
    x = torch.randint(0, 11, (64, 12), generator=g)
    assert (model(x)[:, 1:].argmax(-1) == x[:, :-1]).float().mean() > 0.95
    encoder = TinyEncoder(config()).eval()
    y = x[:2].clone()
    y[:, -1] = (y[:, -1] + 1) % 11
    assert not torch.allclose(encoder(x[:2])[:, 0], encoder(y)[:, 0])  # the first token sees the last


def test_mla_config_is_validated_and_the_default_is_unchanged():
    with pytest.raises(ValueError, match="attention must be one of"):
        TransformerConfig(attention="gqa")
    with pytest.raises(ValueError, match="positional='rope'"):
        TransformerConfig(attention="mla", positional="alibi")
    with pytest.raises(ValueError, match="n_kv_heads=None"):
        TransformerConfig(attention="mla", n_kv_heads=2)
    with pytest.raises(ValueError, match="rope_dim"):
        TinyGPT(config(rope_dim=3))
    default = TinyGPT(TransformerConfig(vocab_size=11, d_model=16, n_heads=4))
    assert type(default.blocks[0].attn).__name__ == "Attention" and type(default.make_cache(1, 4)) is KVCache


# --------------------------------------------------------------------------------------------------
# Speculative decoding
# --------------------------------------------------------------------------------------------------
def test_truncate_cache_rolls_back_to_what_a_fresh_cache_holds():
    """Write a continuation, roll back, write another: the logits equal a cache that never saw the
    first (KV cache and latent cache alike); caches that overwrite cannot roll back."""
    for attention in ("mha", "mla"):
        model = scaled_model(2, attention=attention)
        x, junk = tokens(T=8), tokens(T=3, seed=5)
        cache = model.make_cache(2, 12)
        model(x[:, :5], cache=cache)
        model(junk, cache=cache)
        truncate_cache(cache, 5)
        assert cache.length == 5 and cache.lengths == [5, 5]
        fresh = model.make_cache(2, 12)
        model(x[:, :5], cache=fresh)
        torch.testing.assert_close(model(x[:, 5:], cache=cache), model(x[:, 5:], cache=fresh))
    with pytest.raises(ValueError, match=r"length must be in \[0, cache.length=8\]"):
        truncate_cache(cache, 9)
    with pytest.raises(TypeError, match="SlidingWindowKVCache"):
        truncate_cache(SlidingWindowKVCache(1, 1, 1, 2, window=4), 0)


def noisy_copy(model, seed, size=0.5):
    """A draft that agrees with the model often but not always: its weights plus noise."""
    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(size * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return draft


def greedy_pair(kind, attention="mha", **kw):
    target = scaled_model(0, attention=attention, vocab_size=13, **kw)
    if kind == "self":
        return target, target
    if kind == "noisy":
        return target, noisy_copy(target, 1)
    return target, scaled_model(7, vocab_size=13, n_layers=1)  # another random model, MLA


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("kind", ["self", "noisy", "other"])
def test_greedy_speculative_decoding_gives_the_targets_own_tokens(k, kind):
    target, draft = greedy_pair(kind)
    prompt = tokens(B=1, T=4, vocab=13)
    out, stats = speculative_generate(target, draft, prompt, 11, k=k)  # 11: no multiple of k + 1
    assert torch.equal(out, target.generate(prompt, 11))
    assert isinstance(stats, SpeculativeStats) and stats.generated == 11
    if kind == "self":  # every proposal accepted: k + 1 tokens per target pass
        assert stats.accepted == stats.proposed and stats.target_calls == math.ceil(11 / (k + 1))
    elif kind == "noisy":
        assert 0 < stats.accepted < stats.proposed
    assert stats.draft_calls == stats.proposed and stats.proposed <= k * stats.target_calls


def greedy_speculation_by_loop(target, draft, prompt, max_new_tokens, k):
    """The loop-level oracle, without caches: each round the draft writes min(k, left - 1) tokens
    greedily from the committed text, the target's argmax at every proposed position decides how many
    agree, and the target's own token follows. Returns the tokens, proposals accepted, target passes."""
    tokens, accepted, calls = prompt, 0, 0
    while tokens.shape[1] < prompt.shape[1] + max_new_tokens:
        L = tokens.shape[1]
        k_round = min(k, prompt.shape[1] + max_new_tokens - L - 1)
        proposal = draft.generate(tokens, k_round, use_cache=False)[:, L:]
        best = target(torch.cat((tokens, proposal), 1))[:, L - 1:].argmax(-1)
        n = 0
        while n < k_round and proposal[0, n] == best[0, n]:
            n += 1
        tokens = torch.cat((tokens, proposal[:, :n], best[:, n:n + 1]), 1)
        accepted, calls = accepted + n, calls + 1
    return tokens, accepted, calls


@pytest.mark.parametrize("attention", ["mha", "mla"])
@pytest.mark.parametrize("k", [2, 4])
def test_greedy_speculation_counts_equal_the_uncached_loop(attention, k):
    """What the cached implementation proposes and accepts, round by round, is what the oracle does:
    the draft's cache is rolled back to the committed text, never left holding rejected tokens."""
    target, draft = greedy_pair("noisy", attention)
    prompt = tokens(B=1, T=4, vocab=13, seed=3)
    out, stats = speculative_generate(target, draft, prompt, 13, k=k)
    expected, accepted, calls = greedy_speculation_by_loop(target, draft, prompt, 13, k)
    assert torch.equal(out, expected)
    assert (stats.accepted, stats.target_calls) == (accepted, calls) and 0 < accepted < stats.proposed


@pytest.mark.parametrize("attention, positional", [("mla", "rope"), ("mha", "alibi"), ("mha", "learned")])
def test_greedy_speculation_for_a_batch_across_attention_kinds_and_positions(attention, positional):
    """Three sequences at once, which accept different numbers of proposals (the batch commits the
    fewest, plus one): an MLA target with a noisy MLA draft (latent caches rolled back part way), MHA
    targets with bias-based or learned positions; and a random draft of the other kind."""
    target, draft = greedy_pair("noisy", attention, positional=positional)
    prompt = tokens(B=3, T=5, vocab=13)
    out, stats = speculative_generate(target, draft, prompt, 9, k=3)
    assert torch.equal(out, target.generate(prompt, 9)) and 0 < stats.accepted < stats.proposed
    other = greedy_pair("other")[1] if attention == "mha" else scaled_model(3, attention="mha", vocab_size=13)
    assert torch.equal(speculative_generate(target, other, prompt, 9, k=2)[0], out)
    same, stats = speculative_generate(target, target, prompt, 9, k=2)
    assert torch.equal(same, out) and stats.target_calls == 3
    assert speculative_generate(target, draft, prompt, 0)[0].equal(prompt)
    assert speculative_generate(target, draft, prompt, 1)[1].target_calls == 1


def test_speculative_generate_rejects_bad_arguments():
    target, draft = greedy_pair("other")
    prompt = tokens(B=1, T=3, vocab=13)
    with pytest.raises(ValueError, match="speculative_generate: k must be a positive integer"):
        speculative_generate(target, draft, prompt, 4, k=0)
    with pytest.raises(ValueError, match="vocab_size=11"):
        speculative_generate(target, scaled_model(1), prompt, 4)
    with pytest.raises(ValueError, match="idx must have shape"):
        speculative_generate(target, draft, prompt[0], 4)
    with pytest.raises(ValueError, match="temperature"):
        speculative_generate(target, draft, prompt, 4, temperature=-1.0)
    with pytest.raises(ValueError, match="top_k"):
        speculative_generate(target, draft, prompt, 4, temperature=1.0, top_k=0)
    p, q = torch.full((2, 3, 5), 0.2), torch.full((2, 2, 5), 0.2)
    with pytest.raises(ValueError, match=r"p must have shape \(B, k\+1, vocab\)"):
        speculative_accept(p[:, :2], q, torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="draft_tokens must have shape"):
        speculative_accept(p, q, torch.zeros(2, 3, dtype=torch.long))


def test_sampling_speculation_is_reproducible_and_top_1_is_greedy():
    target, draft = greedy_pair("noisy")
    prompt = tokens(B=2, T=3, vocab=13)

    def sample(seed, **kw):
        g = torch.Generator().manual_seed(seed)
        return speculative_generate(target, draft, prompt, 8, k=3, temperature=1.0, generator=g, **kw)[0]

    assert torch.equal(sample(1), sample(1)) and not torch.equal(sample(1), sample(2))
    assert torch.equal(sample(3, top_k=1), target.generate(prompt, 8))


# --- the distribution of speculative sampling ----------------------------------------------------
V, N = 5, 20_000
PROMPT = torch.tensor([[1, 3, 0]])


def tiny(seed):
    """A fixed random 5-token model, weights doubled so its distributions are far from uniform."""
    torch.manual_seed(seed)
    model = TinyGPT(TransformerConfig(vocab_size=V, d_model=8, n_heads=2, n_layers=1)).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(2.0)
    return model


def next_token_tables(model, depth, temperature=1.0, top_k=None):
    """For every continuation s of PROMPT by `depth` tokens (row i of the V^depth sequences, in
    lexicographic order), the model's exact sampling distribution after PROMPT + s[:j], j = 0..depth:
    ``(V^depth, depth + 1, V)``."""
    seqs = torch.cartesian_prod(*[torch.arange(V)] * depth).reshape(-1, depth)
    x = torch.cat((PROMPT.expand(len(seqs), -1), seqs), 1)
    with torch.no_grad():
        logits = model(x)[:, PROMPT.shape[1] - 1:]
    return sampling_probs(logits, temperature, top_k), seqs


def row(prefix, depth):
    """The row of next_token_tables whose sequence starts with `prefix` (then zeros)."""
    full = torch.cat((prefix, prefix.new_zeros(prefix.shape[0], depth - prefix.shape[1])), 1)
    return (full * V ** torch.arange(depth - 1, -1, -1)).sum(-1)


def joint(tables, seqs):
    """P(s) = prod_j p(s_j | PROMPT, s_<j), flattened in the order of `seqs`."""
    depth = seqs.shape[1]
    return tables[:, :depth].gather(-1, seqs[..., None])[..., 0].prod(-1)


def chi_square(samples, expected_probs, depth):
    """Pearson's statistic of the sampled sequences' counts against N * expected_probs, cells under 5
    expected pooled into one (infinite if a cell expected 0 is not empty), and the critical value at
    level 1e-4 for its degrees of freedom (Wilson-Hilferty; scipy.stats.chi2.ppf agrees within 1%)."""
    codes = (samples * V ** torch.arange(depth - 1, -1, -1)).sum(-1)
    counts = torch.zeros(V ** depth, dtype=torch.float64).index_add_(0, codes, torch.ones(len(codes), dtype=torch.float64))
    expected = expected_probs * len(codes)
    if counts[expected == 0].sum() > 0:
        return math.inf, 0.0
    small = (expected < 5) & (expected > 0)
    o = torch.cat((counts[expected >= 5], counts[small].sum()[None]))
    e = torch.cat((expected[expected >= 5], expected[small].sum()[None]))
    o, e = o[e > 0], e[e > 0]
    stat, dof = float(((o - e) ** 2 / e).sum()), len(e) - 1
    z = 3.719  # the standard normal's 1 - 1e-4 quantile
    return stat, dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


@pytest.mark.parametrize("top_k", [None, 3])
def test_speculative_sampling_draws_from_the_target_distribution(top_k):
    """20,000 sequences at once, two new tokens each, a different random draft: the counts of the 25
    token pairs pass a chi-square test against the target's exact joint distribution; the draft's own
    samples (what accepting every proposal gives) fail it by far: the test has power."""
    target, draft = tiny(0), tiny(1)
    tables, seqs = next_token_tables(target, 2, top_k=top_k)
    expected = joint(tables, seqs)
    g = torch.Generator().manual_seed(0)
    out, stats = speculative_generate(target, draft, PROMPT.expand(N, -1), 2, k=2, temperature=1.0,
                                      top_k=top_k, generator=g)
    stat, critical = chi_square(out[:, 3:], expected, 2)
    assert stat < critical
    assert 0.3 < stats.acceptance_rate < 0.9  # some proposals accepted, some resampled
    drafted = draft.generate(PROMPT.expand(N, -1), 2, temperature=1.0, top_k=top_k, generator=g)
    assert chi_square(drafted[:, 3:], expected, 2)[0] > 10 * critical


def test_a_draft_equal_to_the_target_is_always_accepted_and_the_bonus_token_is_right():
    """k = 2 proposals all accepted, then the bonus token: three tokens per target pass whose joint
    distribution (125 cells) is the target's."""
    target = tiny(0)
    tables, seqs = next_token_tables(target, 3)
    out, stats = speculative_generate(target, target, PROMPT.expand(N, -1), 3, k=2, temperature=1.0,
                                      generator=torch.Generator().manual_seed(1))
    assert stats.target_calls == 1 and stats.accepted == stats.proposed == 2 * N
    stat, critical = chi_square(out[:, 3:], joint(tables, seqs), 3)
    assert stat < critical


def wrong_residual(p, q, draft_tokens, *, generator=None):
    """A plausible bug: after a rejection, resample from p instead of the residual max(0, p - q)."""
    n, _ = speculative_accept(p, q, draft_tokens, generator=generator)
    return n, torch.multinomial(p[torch.arange(len(n)), n], 1, generator=generator)[:, 0]


def bonus_from_the_draft(p, q, draft_tokens, *, generator=None):
    """Another: the token after k accepted proposals drawn from the draft's last distribution."""
    n, token = speculative_accept(p, q, draft_tokens, generator=generator)
    other = torch.multinomial(q[:, -1], 1, generator=generator)[:, 0]
    return n, torch.where(n == q.shape[1], other, token)


@pytest.mark.parametrize("rule, passes", [(speculative_accept, True), (wrong_residual, False),
                                          (bonus_from_the_draft, False)])
def test_the_acceptance_rule_then_target_sampling_is_target_sampling(rule, passes):
    """Per sequence, with no batch coupling: draft k = 2 tokens from the draft's exact tables, apply
    the rule, then complete to 3 tokens from the target's exact tables. The 125 three-token sequences
    must follow the target's joint distribution; each buggy rule fails by far."""
    k, depth = 2, 3
    p_tables, seqs = next_token_tables(tiny(0), depth)
    q_tables, _ = next_token_tables(tiny(1), depth)
    g = torch.Generator().manual_seed(2)
    x, q = torch.zeros(N, 0, dtype=torch.long), []
    for i in range(k):
        q.append(q_tables[row(x, depth), i])
        x = torch.cat((x, torch.multinomial(q[-1], 1, generator=g)), 1)
    p = torch.stack([p_tables[row(x[:, :i], depth), i] for i in range(k + 1)], 1)
    n, token = rule(p, torch.stack(q, 1), x, generator=g)
    out = torch.cat((x, x[:, :1]), 1)  # accepted proposals, then the rule's token, then the target's
    out[torch.arange(N), n] = token
    for j in range(1, depth):
        sampled = torch.multinomial(p_tables[row(out[:, :j], depth), j], 1, generator=g)[:, 0]
        out[:, j] = torch.where(n < j, sampled, out[:, j])
    assert set(n.tolist()) == {0, 1, 2}
    stat, critical = chi_square(out, joint(p_tables, seqs), depth)
    assert (stat < critical) if passes else (stat > 10 * critical)


def test_expected_tokens_and_speedup_match_a_simulation_of_the_rule():
    """Context-free p and q (the same at every position): the rule accepts each proposal with
    probability alpha = sum min(p, q), so its mean yield per target pass, and per unit of cost, meet
    Leviathan et al.'s formulas."""
    g = torch.Generator().manual_seed(0)
    p, q = torch.tensor([0.5, 0.2, 0.2, 0.1, 0.0]), torch.tensor([0.3, 0.3, 0.1, 0.1, 0.2])
    alpha = float(acceptance_probability(p, q))
    assert alpha == pytest.approx(0.7)
    rounds = 100_000
    for k in (1, 3, 6):
        draft_tokens = torch.multinomial(q.expand(rounds, -1), k, replacement=True, generator=g)
        n, _ = speculative_accept(p.expand(rounds, k + 1, -1), q.expand(rounds, k, -1), draft_tokens, generator=g)
        yield_ = (n + 1).double()
        assert abs(yield_.mean() - expected_tokens_per_call(alpha, k)) < 4 * yield_.std() / rounds ** 0.5
        for c in (0.05, 0.5):
            simulated = yield_.sum() / (rounds * (k * c + 1))  # tokens per unit of target time
            assert float(simulated) == pytest.approx(expected_speedup(alpha, k, c), rel=0.01)
    assert expected_tokens_per_call(1.0, 4) == 5 and expected_tokens_per_call(0.0, 4) == 1
    assert expected_speedup(1.0, 4, 0.0) == 5 and expected_speedup(0.0, 3, 0.5) == pytest.approx(1 / 2.5)
    assert expected_speedup(0.8, 4, 0.05) == pytest.approx((1 - 0.8 ** 5) / (0.2 * 1.2))
    for args, name in [((1.5, 2, 0.1), "alpha"), ((0.5, -1, 0.1), "k"), ((0.5, 2, -1.0), "cost_ratio")]:
        with pytest.raises(ValueError, match=f"{name} must be"):
            expected_speedup(*args)


def test_sampling_probs_is_greedy_at_temperature_zero_and_keeps_the_top_k():
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0]])
    assert torch.equal(sampling_probs(logits, 0.0), torch.tensor([[0.0, 1.0, 0.0, 0.0]]))
    top2 = sampling_probs(logits, 0.5, top_k=2)
    torch.testing.assert_close(top2, torch.tensor([[0.0, 1.0, math.exp(-2.0), 0.0]]) / (1 + math.exp(-2.0)))
    torch.testing.assert_close(sampling_probs(logits, 1.0), torch.softmax(logits, -1))


def test_mla_on_an_empty_batch_and_sampling_arguments():
    """Regression: MLA crashed on batch 0 (reshape(B, T, -1) of nothing), sampling_probs
    took top_k=0 and a NaN temperature silently."""
    from attnbook.serving import sampling_probs

    assert mla()(randn(0, 3, 8)).shape == (0, 3, 8)
    logits = torch.randn(2, 5)
    with pytest.raises(ValueError, match="sampling_probs: top_k must be a positive integer, got 0"):
        sampling_probs(logits, 1.0, top_k=0)
    with pytest.raises(ValueError, match="sampling_probs: temperature must be a finite number >= 0, got nan"):
        sampling_probs(logits, float("nan"))
