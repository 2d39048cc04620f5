"""The decode hot path (issue 24): ``StaticKVCache`` and ``TinyGPT.generate``'s prefill and
one-token steps on it, eager and compiled, against recomputing everything without a cache,
for greedy decoding and seeded sampling, ragged (left-padded) batches included."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbook.kvcache import CacheFullError, StaticKVCache
from attnbook.models import POSITIONAL_SCHEMES, TinyGPT, TransformerConfig


def _model(scheme="rope", n_kv_heads=None, **kw):
    """A float64 TinyGPT with weights scaled up (at the default scale it repeats one token)."""
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=11, d_model=16, n_heads=4, n_layers=2, n_kv_heads=n_kv_heads,
                            max_len=40, positional=scheme, **kw)
    model = TinyGPT(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    return model


PROMPT = torch.randint(0, 11, (3, 6), generator=torch.Generator().manual_seed(1))
PADDING = torch.tensor([[True, True, False, False, False, False],   # 4 real tokens
                        [False] * 6,                                 # 6
                        [True] * 5 + [False]])                       # 1


def _alone(model, idx, padding, n, **kw):
    """Each row's real tokens generated alone: the reference of a ragged batch."""
    rows = []
    for b in range(idx.shape[0]):
        pad = int(padding[b].sum())
        rows.append(model.generate(idx[b : b + 1, pad:], n, **kw)[0])
    return rows


# --------------------------------------------------------------------------------------
# StaticKVCache against slicing
# --------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=5), st.integers(1, 3))
def test_static_cache_holds_what_was_written_where_it_was_written(chunks, batch):
    """seek/update/advance write each chunk into its slots in place; the buffers equal the
    concatenation of everything written, and mask() lets slot i see slots 0..i."""
    g = torch.Generator().manual_seed(len(chunks) * 10 + batch)
    max_len = sum(chunks) + 1
    cache = StaticKVCache(2, batch, 2, 3, max_len)
    k_buffer, v_buffer = cache.k, cache.v
    written_k, start = [], 0
    for T in chunks:
        cache.seek(start, T)
        k, v = torch.randn(batch, 2, T, 3, generator=g), torch.randn(batch, 2, T, 3, generator=g)
        k_all, v_all = cache.update(1, k, v)
        assert k_all.shape == (batch, 2, max_len, 3) and k_all.data_ptr() == cache.k[1].data_ptr()
        written_k.append(k)
        torch.testing.assert_close(k_all[:, :, start : start + T], k, rtol=0, atol=0)
        torch.testing.assert_close(v_all[:, :, start : start + T], v, rtol=0, atol=0)
        mask = cache.mask()
        expected = torch.arange(max_len)[None, :] <= torch.arange(start, start + T)[:, None]
        assert torch.equal(mask[0, 0], expected)
        start += T
    assert cache.k is k_buffer and cache.v is v_buffer  # never reallocated
    torch.testing.assert_close(cache.k[1][:, :, :start], torch.cat(written_k, -2), rtol=0, atol=0)
    assert not cache.k[0].any()  # the other layer untouched


def test_static_cache_advances_in_place_and_refuses_to_overflow():
    cache = StaticKVCache(1, 1, 1, 2, 4)
    cache.seek(2)
    slots = cache.slots
    cache.advance()
    assert cache.slots is slots and cache.slots.tolist() == [3] and cache.length == 3
    with pytest.raises(CacheFullError, match="max_len=4"):
        cache.advance()
    with pytest.raises(CacheFullError, match="max_len=4"):
        cache.seek(3, 2)


def test_static_cache_mask_lets_padding_queries_see_themselves_only():
    cache = StaticKVCache(1, 2, 1, 2, 5)
    cache.seek(0, 3)
    real = torch.tensor([[False, True, True, True, True], [True] * 5])
    mask = cache.mask(real)[:, 0]  # (2, 3, 5)
    assert mask[0, 0].tolist() == [True, False, False, False, False]  # padding: its own slot
    assert mask[0, 2].tolist() == [False, True, True, False, False]  # padding key hidden
    assert mask[1, 2].tolist() == [True, True, True, False, False]


# --------------------------------------------------------------------------------------
# The hot path gives the tokens of recomputation
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", POSITIONAL_SCHEMES)
@pytest.mark.parametrize("n_kv_heads", [None, 1])
def test_ragged_batches_give_each_rows_own_tokens_cached_and_uncached(scheme, n_kv_heads):
    model = _model(scheme, n_kv_heads)
    cached = model.generate(PROMPT, 12, key_padding_mask=PADDING)
    uncached = model.generate(PROMPT, 12, key_padding_mask=PADDING, use_cache=False)
    assert cached.shape == (3, 18) and torch.equal(cached[:, :6], PROMPT)
    assert torch.equal(cached, uncached)
    for b, row in enumerate(_alone(model, PROMPT, PADDING, 12)):
        assert torch.equal(cached[b, int(PADDING[b].sum()) :], row), (scheme, b)
    assert len(set(cached[:, 6:].flatten().tolist())) > 2  # not a degenerate constant output


@pytest.mark.parametrize("scheme", ["rope", "alibi", "learned"])
def test_seeded_sampling_gives_the_same_tokens_cached_uncached_and_alone(scheme):
    model = _model(scheme)

    def sample(**kw):
        return model.generate(PROMPT, 10, temperature=1.5, top_k=6,
                              generator=torch.Generator().manual_seed(7), **kw)

    cached = sample(key_padding_mask=PADDING)
    assert torch.equal(cached, sample(key_padding_mask=PADDING, use_cache=False))
    assert torch.equal(sample(), sample(use_cache=False))
    assert not torch.equal(sample(), model.generate(PROMPT, 10))  # it did sample


def test_latent_attention_decodes_ragged_batches_like_recomputation():
    model = _model("rope", attention="mla", rope_dim=2)
    cached = model.generate(PROMPT, 10, key_padding_mask=PADDING)
    assert torch.equal(cached, model.generate(PROMPT, 10, key_padding_mask=PADDING, use_cache=False))


def test_the_decode_steps_read_the_live_slots_of_one_buffer_written_in_place():
    """Step t attends to the t + 1 live slots (views of one preallocated buffer, not the
    whole of it and no growing torch.cat), the cache is written in place (index_copy_),
    and the prompt runs once."""
    from torch.profiler import ProfilerActivity, profile

    model, n = _model("rope"), 9
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        model.generate(PROMPT, n)
    events = [e for e in prof.events()]
    sdpa = [e.input_shapes for e in events if e.name == "aten::scaled_dot_product_attention"]
    assert len(sdpa) == model.config.n_layers * n  # 1 prefill + n - 1 decode steps per layer
    lengths = [shapes[1][2] for shapes in sdpa[:: model.config.n_layers]]
    assert lengths == list(range(6, 6 + n))  # the prompt's 6 keys, then one more a step
    assert {tuple(shapes[1]) for shapes in sdpa} == {(3, 4, t, 4) for t in lengths}
    writes = [e for e in events if e.name == "aten::index_copy_"]
    assert len(writes) == 2 * model.config.n_layers * n
    cats = [e.input_shapes for e in events if e.name == "aten::cat"]  # RoPE's q with k
    assert cats and not [s for s in cats if any(len(x) == 4 and x[2] > 6 for x in s)]


def test_generate_checks_its_new_arguments():
    model = _model()
    with pytest.raises(ValueError, match="TinyGPT.generate: key_padding_mask must be left padding"):
        model.generate(PROMPT, 2, key_padding_mask=PADDING.flip(-1))
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(batch, S\) = \(3, 6\)"):
        model.generate(PROMPT, 2, key_padding_mask=PADDING[:, 1:])
    with pytest.raises(ValueError, match="compile=True .* use_cache=False"):
        model.generate(PROMPT, 2, use_cache=False, compile=True)
    with pytest.raises(TypeError, match="TinyGPT.generate: compile must be a bool"):
        model.generate(PROMPT, 2, compile="yes")
    assert model.generate(PROMPT, 0, key_padding_mask=PADDING).shape == (3, 6)


# --------------------------------------------------------------------------------------
# Compiled: one small configuration (torch.compile costs tens of seconds on a CPU)
# --------------------------------------------------------------------------------------
def test_the_compiled_step_gives_the_eager_tokens_and_is_reused():
    from torch._dynamo.utils import counters

    model = _model("rope", n_kv_heads=2)
    eager = model.generate(PROMPT, 8, key_padding_mask=PADDING)
    compiled = model.generate(PROMPT, 8, key_padding_mask=PADDING, compile=True)
    assert torch.equal(compiled, eager)
    graphs = counters["stats"]["unique_graphs"]
    again = model.generate(PROMPT[[2, 0, 1]], 8, key_padding_mask=PADDING[[2, 0, 1]], compile=True)
    assert counters["stats"]["unique_graphs"] == graphs  # same shapes: no new graph
    assert torch.equal(again, eager[[2, 0, 1]])
    sampled = dict(temperature=1.0, key_padding_mask=PADDING)
    sample = model.generate(PROMPT, 8, compile=True, generator=torch.Generator().manual_seed(3), **sampled)
    uncached = model.generate(PROMPT, 8, use_cache=False, generator=torch.Generator().manual_seed(3), **sampled)
    assert torch.equal(sample, uncached) and not torch.equal(sample, eager)
    longer = model.generate(PROMPT, 13, key_padding_mask=PADDING, compile=True)
    assert torch.equal(longer, model.generate(PROMPT, 13, key_padding_mask=PADDING))
    assert counters["stats"]["unique_graphs"] == graphs  # one graph for every length
