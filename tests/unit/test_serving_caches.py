"""Tests for attnbook.serving, its caches: attention sinks,
quantized KV caches, continuous batching over a paged cache."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from attnbook.serving import (
    PagedModel, QuantizedKVCache, Request, SinkKVCache, continuous_batching, dequantize,
    first_token_attention, outlier_channel_ratio, quantize, static_batching,
    streaming_losses, synthetic_trace,
)
from attnbook.core import scaled_dot_product_attention
from attnbook.kvcache import CacheFullError, KVCache, kv_cache_bytes
from attnbook.models import TinyGPT, TransformerConfig


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def tiny_gpt(n_layers=2, positional="rope", seed=0, **kw):
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=32, d_model=32, n_heads=4, n_layers=n_layers,
                            positional=positional, **kw)
    return TinyGPT(cfg).eval()


def token_ids(n, seed=0):
    return torch.randint(32, (n,), generator=torch.Generator().manual_seed(seed))


# ================================================================== attention sinks
def sink_reference(n_sink, window, N, T):
    """Positions an update of T tokens bringing the total to N returns, by definition:
    the first n_sink ever appended and the last max(window, T), without repeats."""
    return sorted(set(range(min(n_sink, N))) | set(range(max(0, N - max(window, T)), N)))


class SinkCacheMachine(RuleBasedStateMachine):
    """Any sequence of updates of any length on a sink cache: what it returns and what it
    keeps, recomputed from the full list of appended positions."""

    @initialize(n_sink=st.integers(0, 3), window=st.integers(1, 5))
    def make(self, n_sink, window):
        self.n_sink, self.window = n_sink, window
        self.cache = SinkKVCache(2, 1, 2, 3, n_sink, window, dtype=torch.float64)
        self.history = [[], []]  # per layer: one (k, v) pair of (1, 2, 3) per position

    @rule(T=st.integers(1, 7), seed=st.integers(0, 10**6))
    def update(self, T, seed):
        for layer in range(2):
            k = randn(1, 2, T, 3, seed=seed, dtype=torch.float64) + 100 * layer
            v = randn(1, 2, T, 3, seed=seed + 1, dtype=torch.float64) - 100 * layer
            self.history[layer] += [(k[:, :, t], v[:, :, t]) for t in range(T)]
            k_out, v_out = self.cache.update(layer, k, v)
            keep = sink_reference(self.n_sink, self.window, len(self.history[layer]), T)
            assert k_out.shape == (1, 2, len(keep), 3)
            for slot, p in enumerate(keep):
                assert torch.equal(k_out[:, :, slot], self.history[layer][p][0])
                assert torch.equal(v_out[:, :, slot], self.history[layer][p][1])

    @rule()
    def reset(self):
        self.cache.reset()
        self.history = [[], []]

    @invariant()
    def holds_the_sinks_and_the_last_window(self):
        if not hasattr(self, "cache"):
            return
        N = len(self.history[0])
        assert self.cache.length == N
        for layer in range(2):
            held = sink_reference(self.n_sink, self.window, N, 1) if N else []
            held = [p for p in held if p < self.n_sink or p >= N - self.window]
            assert self.cache.positions(layer).tolist() == held
            k, v = self.cache.retained(layer)
            assert k.shape[-2] == len(held) <= self.n_sink + self.window
            for slot, p in enumerate(held):
                assert torch.equal(k[:, :, slot], self.history[layer][p][0])
                assert torch.equal(v[:, :, slot], self.history[layer][p][1])


TestSinkCacheMachine = SinkCacheMachine.TestCase


def test_sink_cache_returns_the_documented_positions_for_long_and_short_updates():
    """Values equal to their position make the returned positions readable: a prefill
    longer than everything, then one token (sinks + last window including it), then a
    chunk longer than the window (every new position, so each query finds itself)."""
    cache = SinkKVCache(1, 1, 1, 1, n_sink=2, window=3)

    def append(start, T):
        k = torch.arange(start, start + T, dtype=torch.float32).view(1, 1, T, 1)
        return cache.update(0, k, -k)[0].flatten().long().tolist()

    assert append(0, 10) == list(range(10))
    assert cache.positions(0).tolist() == [0, 1, 7, 8, 9]
    assert append(10, 1) == [0, 1, 8, 9, 10]
    assert append(11, 4) == [0, 1, 11, 12, 13, 14]
    assert append(15, 2) == [0, 1, 14, 15, 16]  # held 12, 13, 14: the last 3 of 17
    assert cache.length == 17 and cache.positions(0).tolist() == [0, 1, 14, 15, 16]


def test_sink_cache_rejects_bad_arguments():
    with pytest.raises(ValueError, match="n_sink"):
        SinkKVCache(1, 1, 1, 4, n_sink=-1, window=4)
    with pytest.raises(ValueError, match="window"):
        SinkKVCache(1, 1, 1, 4, n_sink=2, window=0)
    cache = SinkKVCache(2, 1, 2, 4, n_sink=2, window=4)
    with pytest.raises(ValueError, match=r"\(1, 2, 'T', 4\).*\(1, 2, 3, 5\)"):
        cache.update(0, randn(1, 2, 3, 5), randn(1, 2, 3, 5))
    with pytest.raises(ValueError, match="k_new and v_new"):
        cache.update(0, randn(1, 2, 3, 4), randn(1, 2, 2, 4))
    with pytest.raises(ValueError, match="T >= 1"):
        cache.update(0, randn(1, 2, 0, 4), randn(1, 2, 0, 4))
    with pytest.raises(ValueError, match="layer must be in"):
        cache.update(2, randn(1, 2, 1, 4), randn(1, 2, 1, 4))


@pytest.mark.parametrize("n_sink,window", [(0, 24), (3, 21), (5, 40)])
def test_sink_cache_decoding_equals_the_full_forward_when_nothing_is_evicted(n_sink, window):
    """Slot numbering is absolute numbering while nothing was evicted: token-by-token
    decoding through the sink cache (keys stored unrotated, rotated by slot) gives the
    logits of one full causal forward pass."""
    model, ids = tiny_gpt(), token_ids(24)
    full = model(ids[None])[0]
    cache = SinkKVCache(2, 1, 4, 8, n_sink, window)
    with torch.no_grad():
        steps = torch.cat([model(ids[t].view(1, 1), cache=cache)[0] for t in range(24)])
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


def test_sink_cache_follows_the_papers_rule_in_a_one_layer_model():
    """In one layer, keys and values depend on their token only: after evictions, the
    logits of each step equal a fresh forward pass over the tokens the cache kept
    (sinks then recent ones, renumbered 0, 1, ...): positions are numbered in the cache."""
    model, ids = tiny_gpt(n_layers=1), token_ids(30, seed=1)
    n_sink, window = 2, 5
    cache = SinkKVCache(1, 1, 4, 8, n_sink, window)
    with torch.no_grad():
        for t in range(30):
            step = model(ids[t].view(1, 1), cache=cache)[0, -1]
            kept = sink_reference(n_sink, window, t + 1, 1)
            fresh = model(ids[kept][None])[0, -1]
            torch.testing.assert_close(step, fresh, atol=1e-5, rtol=1e-5)


def test_streaming_losses_full_cache_equals_the_full_forward_cross_entropy():
    model, ids = tiny_gpt(), token_ids(40, seed=2)
    expected = F.cross_entropy(model(ids[None])[0, :-1], ids[1:], reduction="none")
    torch.testing.assert_close(streaming_losses(model, ids), expected, atol=1e-5, rtol=1e-5)
    for cache in ("window", "sinks"):  # nothing evicted: the same losses
        got = streaming_losses(model, ids, cache=cache, n_sink=4, window=36)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_streaming_losses_window_and_sinks_see_what_they_keep():
    """One layer: the window variant's loss at t is that of a fresh pass over the last
    n_sink + window tokens (RoPE is relative), the sinks variant's over sinks + last
    window; with evictions the three variants differ."""
    model, ids = tiny_gpt(n_layers=1), token_ids(25, seed=3)
    n_sink, window = 2, 6
    got = {c: streaming_losses(model, ids, cache=c, n_sink=n_sink, window=window)
           for c in ("full", "window", "sinks")}
    for t in range(24):
        last = list(range(max(0, t + 1 - n_sink - window), t + 1))
        kept = sink_reference(n_sink, window, t + 1, 1)
        for cache, positions in (("window", last), ("sinks", kept)):
            logits = model(ids[positions][None])[0, -1]
            expected = F.cross_entropy(logits, ids[t + 1])
            torch.testing.assert_close(got[cache][t], expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got["window"], got["sinks"])
    assert not torch.allclose(got["full"], got["sinks"])


def test_streaming_losses_and_first_token_attention_reject_bad_input():
    model = tiny_gpt()
    with pytest.raises(ValueError, match="cache must be one of"):
        streaming_losses(model, token_ids(5), cache="ring")
    with pytest.raises(ValueError, match=r"ids must have shape \(n,\)"):
        streaming_losses(model, token_ids(5)[None])
    with pytest.raises(ValueError, match="positional='alibi'"):
        streaming_losses(tiny_gpt(positional="alibi"), token_ids(5), cache="sinks")
    with pytest.raises(ValueError, match="n_sink \\+ window - 1"):
        streaming_losses(model, token_ids(5), cache="window", n_sink=0, window=1)
    with pytest.raises(ValueError, match="ids must have shape"):
        first_token_attention(model, token_ids(1))


def test_first_token_attention_of_uniform_heads_is_the_harmonic_mean():
    """With the query projections zeroed every score is 0: query t spreads 1 / (t + 1)
    over its t + 1 keys, so the mean over t = 1 .. n - 1 is (H_n - 1) / (n - 1)."""
    model, n = tiny_gpt(), 12
    with torch.no_grad():
        for block in model.blocks:
            block.attn.q_proj.weight.zero_()
            block.attn.q_proj.bias.zero_()
    expected = sum(1 / (t + 1) for t in range(1, n)) / (n - 1)
    got = first_token_attention(model, token_ids(n))
    assert got.shape == (2,)
    torch.testing.assert_close(got, torch.full((2,), expected), atol=1e-6, rtol=1e-6)
    batch = torch.stack([token_ids(n, seed=s) for s in range(3)])
    _, weights = tiny_gpt()(batch, return_weights=True)
    torch.testing.assert_close(first_token_attention(tiny_gpt(), batch),
                               weights[..., 1:, 0].mean(dim=(1, 2, 3)))


# ================================================================== quantization
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    bits=st.sampled_from([4, 8]),
    groups=st.integers(1, 3),
    data=st.data(),
)
def test_quantize_round_trip_error_is_at_most_half_a_step(shape, bits, groups, data):
    dim = data.draw(st.integers(-len(shape) - 1, len(shape)))
    shape = list(shape)
    group_size = data.draw(st.integers(1, 4))
    shape.insert(dim % (len(shape) + 1), group_size * groups)
    x = randn(*shape, seed=data.draw(st.integers(0, 1000)), dtype=torch.float64)
    x = x * data.draw(st.sampled_from([1e-3, 1.0, 1e3]))
    q = quantize(x, bits, dim=dim, group_size=group_size)
    packed = shape[-1] if bits == 8 else math.ceil(shape[-1] / 2)  # 2 codes a byte
    assert q.data.dtype == torch.uint8 and q.data.shape == (*shape[:-1], packed)
    scale = q.scale.repeat_interleave(group_size, dim=dim % x.dim())
    err = (dequantize(q) - x).abs()
    assert bool((err <= scale / 2 * (1 + 1e-9) + 1e-12 * x.abs().amax()).all())
    assert q.scale.shape[dim] == groups


def test_quantize_is_exact_on_the_grid_and_on_constant_groups():
    """Values z + k s with k = 0 .. 2^b - 1 (the extremes included, s a power of 2) come
    back exactly; a constant group has scale 0, codes 0, and comes back exactly."""
    for bits in (4, 8):
        levels = 2**bits - 1
        k = torch.randint(0, levels + 1, (3, 2, 16), generator=torch.Generator().manual_seed(bits))
        k[..., 0], k[..., 1] = 0, levels  # each group spans the whole grid
        x = -3.0 + 0.25 * k.double()
        q = quantize(x, bits, dim=-1, group_size=16)
        assert torch.equal(dequantize(q), x)
        const = torch.full((4, 8), 2.5).index_fill(0, torch.tensor([1]), -7.0)
        qc = quantize(const, bits, dim=-1, group_size=4)
        assert torch.equal(dequantize(qc), const) and bool((qc.scale == 0).all())


def test_int4_packs_two_codes_per_byte_and_errs_more_than_int8():
    x = randn(4, 64, 33, seed=1)  # odd last dimension: padded with one code
    q8, q4 = (quantize(x, b, dim=1, group_size=32) for b in (8, 4))
    assert q8.data.shape == (4, 64, 33) and q4.data.shape == (4, 64, 17)
    e8, e4 = ((dequantize(q) - x).abs().mean() for q in (q8, q4))
    assert e4 > 8 * e8  # 15 levels instead of 255: about 17 times coarser
    assert float((dequantize(q4) - x).abs().max()) <= float(q4.scale.max()) / 2 + 1e-6


def test_quantized_memory_is_counted_exactly():
    """float32 (B=2, H=4, S=64, d=64), groups of 32: int8 stores 1 byte a value, int4 half
    a byte, plus a float32 scale and zero per group."""
    x = randn(2, 4, 64, 64)
    values, groups = x.numel(), x.numel() // 32
    assert quantize(x, 8, dim=-1, group_size=32).nbytes == values + 8 * groups
    assert quantize(x, 4, dim=-2, group_size=32).nbytes == values // 2 + 8 * groups
    assert values * 4 / (values + 8 * groups) == pytest.approx(4 / 1.25)
    cache = QuantizedKVCache(3, 2, 4, 64, 256, bits=4, group_size=32)
    for layer in range(3):
        cache.update(layer, randn(2, 4, 96, 64, seed=layer), randn(2, 4, 96, 64, seed=9))
    per_token = 3 * 2 * 4 * (64 // 2 + 2 * 2 * 4)  # layers, k and v, heads
    assert cache.bytes_per_token == per_token
    assert cache.nbytes() == per_token * 2 * 96
    assert kv_cache_bytes(3, 4, 64, 96, 2, 4) / cache.nbytes() == pytest.approx(256 / 48)
    for layer in range(3):  # 5 positions in the per-channel keys' residual, float32
        cache.update(layer, randn(2, 4, 5, 64), randn(2, 4, 5, 64))
    assert cache.nbytes() == per_token * 2 * 101 - 3 * 2 * 4 * 5 * (64 // 2 + 16 - 64 * 4)


def outlier_keys(seed, shape=(2, 4, 128, 64), n_outliers=4, magnitude=10.0):
    """Gaussian keys whose few outlier channels are large in every token (KIVI's
    observation of real keys)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(shape, generator=g)
    channels = torch.randperm(shape[-1], generator=g)[:n_outliers]
    k[..., channels] = k[..., channels] * magnitude + magnitude
    return k


@pytest.mark.parametrize("bits", [4, 8])
def test_per_channel_keys_beat_per_token_keys_when_keys_have_outlier_channels(bits):
    for seed in range(3):
        k = outlier_keys(seed)
        q, v = randn(2, 4, 8, 64, seed=100 + seed), randn(2, 4, 128, 64, seed=200 + seed)
        exact = scaled_dot_product_attention(q, k, v)
        errors = {}
        for axis in ("channel", "token"):
            cache = QuantizedKVCache(1, 2, 4, 64, 128, bits=bits, key_axis=axis)
            for k_part, v_part in zip(k.split(40, dim=-2), v.split(40, dim=-2)):
                k_hat, _ = cache.update(0, k_part, v_part)  # 40, 40, 40, 8: 4 groups
            out = scaled_dot_product_attention(q, k_hat, v)
            errors[axis] = float((out - exact).norm() / exact.norm())
        assert errors["channel"] < errors["token"] / 1.5, errors
    assert float(outlier_channel_ratio(k).min()) > 5
    assert float(outlier_channel_ratio(randn(2, 4, 128, 64)).max()) < 2


class QuantizedCacheMachine(RuleBasedStateMachine):
    """Random appends of random length: the cache returns dequantize(quantize(...)) of
    everything appended, full groups of 32 tokens quantized per channel for keys (the
    partial group exact), each token per group of channels for values."""

    @initialize(bits=st.sampled_from([4, 8]), key_axis=st.sampled_from(["channel", "token"]))
    def make(self, bits, key_axis):
        self.bits, self.key_axis = bits, key_axis
        self.cache = QuantizedKVCache(2, 1, 2, 16, 200, bits=bits, group_size=8,
                                      key_axis=key_axis, value_axis="token")
        self.ks, self.vs = [], []

    @rule(T=st.integers(1, 13), seed=st.integers(0, 10**6))
    def update(self, T, seed):
        k, v = randn(1, 2, T, 16, seed=seed), randn(1, 2, T, 16, seed=seed + 1)
        if self.cache.length + T > 200:
            with pytest.raises(CacheFullError):
                self.cache.update(0, k, v)
            return
        self.ks.append(k)
        self.vs.append(v)
        for layer in range(2):
            k_out, v_out = self.cache.update(layer, k * (layer + 1), v * (layer + 1))
            k_all, v_all = (torch.cat(t, dim=-2) * (layer + 1) for t in (self.ks, self.vs))
            assert torch.equal(v_out, dequantize(quantize(v_all, self.bits, dim=-1, group_size=8)))
            if self.key_axis == "token":
                expected = dequantize(quantize(k_all, self.bits, dim=-1, group_size=8))
            else:
                full = k_all.shape[-2] // 8 * 8
                parts = [k_all[..., full:, :]]
                if full:
                    parts.insert(0, dequantize(quantize(k_all[..., :full, :], self.bits,
                                                        dim=-2, group_size=8)))
                expected = torch.cat(parts, dim=-2)
            torch.testing.assert_close(k_out, expected, atol=1e-6, rtol=1e-6)

    @rule()
    def reset(self):
        self.cache.reset()
        self.ks, self.vs = [], []

    @invariant()
    def length_counts_every_position(self):
        if hasattr(self, "cache"):
            assert self.cache.length == sum(k.shape[-2] for k in self.ks)


TestQuantizedCacheMachine = QuantizedCacheMachine.TestCase


def test_quantization_rejects_bad_arguments():
    x = randn(2, 6)
    with pytest.raises(ValueError, match="bits must be one of"):
        quantize(x, 3, dim=-1)
    with pytest.raises(ValueError, match="group_size must be a positive divisor"):
        quantize(x, 8, dim=-1, group_size=4)
    with pytest.raises(ValueError, match="dim must be in"):
        quantize(x, 8, dim=2)
    with pytest.raises(TypeError, match="float tensor"):
        quantize(torch.ones(2, 6, dtype=torch.long), 8, dim=-1)
    with pytest.raises(ValueError, match="bits must be one of"):
        QuantizedKVCache(1, 1, 1, 16, 8, bits=2)
    with pytest.raises(ValueError, match="group_size=6 must divide head_dim=16"):
        QuantizedKVCache(1, 1, 1, 16, 8, group_size=6)
    with pytest.raises(ValueError, match="key_axis must be one of"):
        QuantizedKVCache(1, 1, 1, 16, 8, key_axis="head")
    with pytest.raises(ValueError, match="value_axis must be one of"):
        QuantizedKVCache(1, 1, 1, 16, 8, value_axis="row")
    cache = QuantizedKVCache(1, 1, 1, 16, 8, group_size=8)
    with pytest.raises(ValueError, match=r"\(1, 1, 'T', 16\)"):
        cache.update(0, randn(1, 2, 1, 16), randn(1, 2, 1, 16))
    with pytest.raises(CacheFullError, match="max_len=8"):
        cache.update(0, randn(1, 1, 9, 16), randn(1, 1, 9, 16))
    with pytest.raises(ValueError, match="seq, head_dim"):
        outlier_channel_ratio(torch.ones(4))


def test_tinygpt_decodes_through_a_quantized_cache_close_to_float():
    """The model runs with the quantized cache unchanged (same update interface): int8
    logits stay close to the float ones, int4 drift further."""
    model, ids = tiny_gpt(), token_ids(48, seed=4)
    with torch.no_grad():
        full = model(ids[None])[0]
    errors = {}
    for bits in (8, 4):
        cache = QuantizedKVCache(2, 1, 4, 8, 48, bits=bits, group_size=8)
        with torch.no_grad():
            model(ids[None, :20], cache=cache)  # a prefill, then one token at a time
            steps = torch.cat([model(ids[t].view(1, 1), cache=cache)[0] for t in range(20, 48)])
        errors[bits] = float((steps - full[20:]).abs().max())
    assert errors[8] < 2e-3 and 4 * errors[8] < errors[4] < 0.1, errors


# ================================================================== continuous batching
def test_synthetic_trace_is_reproducible_and_within_its_ranges():
    a = synthetic_trace(50, generator=torch.Generator().manual_seed(0), prompt_len=(3, 9),
                        output_len=(2, 30), arrival_rate=0.25, vocab_size=7)
    b = synthetic_trace(50, generator=torch.Generator().manual_seed(0), prompt_len=(3, 9),
                        output_len=(2, 30), arrival_rate=0.25, vocab_size=7)
    assert a == b and [r.id for r in a] == list(range(50))
    assert all(3 <= r.prompt_len <= 9 and 2 <= r.output_len <= 30 for r in a)
    assert all(len(r.prompt) == r.prompt_len and max(r.prompt) < 7 for r in a)
    arrivals = [r.arrival_step for r in a]
    assert arrivals == sorted(arrivals) and 100 < arrivals[-1] < 300  # ~ 50 / 0.25
    assert len({r.output_len for r in a}) > 10


@pytest.fixture(scope="module")
def served():
    model = tiny_gpt(n_kv_heads=2)
    trace = synthetic_trace(24, generator=torch.Generator().manual_seed(0))
    out = {}
    for policy in (continuous_batching, static_batching):
        engine = PagedModel(model, n_blocks=48, block_size=8, max_len=128)
        out[policy.__name__] = (policy(trace, engine, max_batch=6), engine)
    return model, trace, out


@pytest.mark.parametrize("policy", ["continuous_batching", "static_batching"])
def test_every_request_gets_the_tokens_it_gets_decoded_alone(served, policy):
    """Greedy tokens under batching over the paged cache equal TinyGPT.generate on the
    request alone (its own KVCache): ragged batches change nothing."""
    model, trace, out = served
    result, engine = out[policy]
    for r in trace:
        alone = model.generate(torch.tensor([r.prompt]), r.output_len)[0, r.prompt_len:]
        assert result.outputs[r.id] == alone.tolist()
    assert result.tokens == sum(r.output_len for r in trace)
    assert max(result.running) <= 6
    assert engine.blocks_in_use == 0 and engine.stored_positions == 0
    for cache in engine.caches:  # every block is back in the pool
        assert sorted(cache.free_blocks) == list(range(48)) and not cache.block_tables


@pytest.mark.parametrize("policy", ["continuous_batching", "static_batching"])
def test_timings_and_page_accounting_are_consistent(served, policy):
    _, trace, out = served
    result, engine = out[policy]
    for r in trace:
        t = result.timings[r.id]
        assert t.arrival == r.arrival_step < t.first_token <= t.finish <= result.steps
        assert t.finish - t.first_token >= r.output_len - 1 and t.latency >= r.output_len
    assert max(t.finish for t in result.timings.values()) == result.steps
    for blocks, stored, wasted, running, contiguous in zip(
        result.blocks_in_use, result.stored, result.wasted_slots, result.running,
        result.contiguous_slots
    ):  # paging wastes less than a block per sequence; a contiguous cache, max_len
        assert blocks * 8 - stored == wasted <= running * 7
        assert contiguous == running * 128 >= stored
    assert max(result.blocks_in_use) <= 48


def test_a_static_batch_starts_together_and_returns_together(served):
    _, trace, out = served
    result, _ = out["static_batching"]
    batches = {}
    for r in trace:
        batches.setdefault(result.timings[r.id].first_token, []).append(r)
    assert len(batches) > 2
    for start, batch in batches.items():
        longest = max(r.output_len for r in batch)
        assert len(batch) <= 6 and max(r.arrival_step for r in batch) < start
        assert {result.timings[r.id].finish for r in batch} == {start + longest - 1}


def test_continuous_batching_beats_static_batching_when_output_lengths_vary(served):
    _, _, out = served
    cont, static = (out[p][0].summary() for p in ("continuous_batching", "static_batching"))
    assert cont["steps"] < static["steps"]
    assert cont["tokens_per_step"] > static["tokens_per_step"]
    assert cont["mean_latency"] < static["mean_latency"]


def test_a_lone_request_is_served_at_once_and_a_small_pool_makes_requests_wait():
    model = tiny_gpt()
    lone = Request(0, 3, 5, 2, (1, 2, 3))
    result = continuous_batching([lone], PagedModel(model, n_blocks=4, block_size=4),
                                 max_batch=4)
    t = result.timings[0]
    assert (t.first_token, t.finish, t.latency, result.steps) == (3, 7, 5, 7)
    assert result.running == [0, 0, 1, 1, 1, 1, 1]
    # three requests needing 2 blocks each, a pool of 4: the third waits for a free one
    trace = [Request(i, 4, 4, 0, (i, 1, 2, 3)) for i in range(3)]
    engine = PagedModel(model, n_blocks=4, block_size=4)
    result = continuous_batching(trace, engine, max_batch=3)
    assert max(result.running) == 2 and max(result.blocks_in_use) <= 4
    assert result.timings[2].first_token == result.timings[0].finish + 1
    assert all(len(result.outputs[r.id]) == 4 for r in trace)


def test_serving_rejects_bad_input():
    model = tiny_gpt()
    engine = PagedModel(model, n_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="max_batch"):
        continuous_batching([], engine, max_batch=0)
    with pytest.raises(ValueError, match="distinct ids"):
        static_batching([Request(0, 1, 1, 0, (1,))] * 2, engine, max_batch=2)
    with pytest.raises(ValueError, match="request 7 needs 3 blocks, the pool has 2"):
        continuous_batching([Request(7, 5, 5, 0, (1,) * 5)], engine, max_batch=2)
    with pytest.raises(ValueError, match="prompt must hold prompt_len=3"):
        Request(0, 3, 1, 0, (1, 2))
    with pytest.raises(ValueError, match="output_len"):
        Request(0, 1, 0, 0, (1,))
    with pytest.raises(ValueError, match="positional='rope' or 'none'"):
        PagedModel(tiny_gpt(positional="alibi"), n_blocks=2, block_size=4)


def _page_state(engine):
    return [(dict(c.block_tables), dict(c.lengths), list(c.free_blocks)) for c in engine.caches]


def test_a_refused_prefill_or_decode_changes_no_page():
    """Regression (found by tests/properties/test_state_machines.py): a prefill the pool could not
    hold left its sequence allocated, with no block, in layer 0 (a retry then said
    "already allocated"); a decode that ran out of blocks mid-batch had appended to
    the first sequences of layer 0 only, so the layers disagreed on their lengths."""
    model = tiny_gpt()
    engine = PagedModel(model, n_blocks=1, block_size=1)
    with pytest.raises(CacheFullError, match="needs 2 more blocks, only 1"):
        engine.prefill(Request(0, 2, 1, 0, (1, 2)))
    assert _page_state(engine) == _page_state(PagedModel(model, n_blocks=1, block_size=1))
    engine.prefill(Request(0, 1, 1, 0, (1,)))  # the same id, now that it fits
    engine = PagedModel(model, n_blocks=3, block_size=1)
    engine.prefill(Request(0, 1, 1, 0, (1,)))
    engine.prefill(Request(1, 1, 1, 0, (2,)))
    before = _page_state(engine)
    with pytest.raises(CacheFullError, match="needs 2 more blocks, only 1"):
        engine.decode([0, 1], [3, 4])
    assert _page_state(engine) == before
    assert len(engine.decode([1], [4])) == 1  # one of them still fits


def test_decode_rejects_a_repeated_or_unknown_sequence_and_changes_nothing():
    """Regression: one sequence twice in a batch wrote two tokens at one position and
    then crashed with a RuntimeError; an unknown id was a bare KeyError."""
    engine = PagedModel(tiny_gpt(), n_blocks=8, block_size=2)
    engine.prefill(Request(0, 1, 1, 0, (1,)))
    before = _page_state(engine)
    with pytest.raises(ValueError, match="distinct"):
        engine.decode([0, 0], [3, 4])
    with pytest.raises(ValueError, match="one token each"):
        engine.decode([0], [3, 4])
    with pytest.raises(ValueError, match=r"sequences \[5\] are not running"):
        engine.decode([0, 5], [3, 4])
    with pytest.raises(ValueError, match="sequence 0 is running"):
        engine.prefill(Request(0, 1, 1, 0, (1,)))
    assert _page_state(engine) == before


def test_latent_cache_refuses_an_empty_update_like_every_cache():
    """Regression: LatentKVCache.update took T = 0 new positions (and a float layer),
    where check_cache_update, the rule of every other cache, asks for T >= 1."""
    from attnbook.serving import LatentKVCache

    cache = LatentKVCache(2, 1, 3, 2, max_len=4)
    with pytest.raises(ValueError, match="T >= 1"):
        cache.update(0, torch.zeros(1, 0, 3), torch.zeros(1, 0, 2))
    with pytest.raises(ValueError, match="layer must be in"):
        cache.update(0.0, torch.zeros(1, 1, 3), torch.zeros(1, 1, 2))
    assert cache.lengths == [0, 0]


def test_streaming_losses_reads_through_a_given_cache_object():
    model = tiny_gpt()
    ids = torch.randint(0, 32, (20,), generator=torch.Generator().manual_seed(3))
    cfg = model.config
    sizes = (cfg.n_layers, 1, cfg.n_kv_heads or cfg.n_heads, cfg.d_model // cfg.n_heads)
    full = streaming_losses(model, ids, cache="full")
    given = streaming_losses(model, ids, cache=KVCache(*sizes, 20))
    assert torch.allclose(full, given)
    int8 = streaming_losses(model, ids, cache=QuantizedKVCache(*sizes, 20, bits=8,
                                                                 group_size=4))
    assert (int8 - full).abs().max() < 0.05 and not torch.equal(int8, full)
    used = KVCache(*sizes, 20)
    for layer in range(cfg.n_layers):
        new = torch.zeros(1, sizes[2], 1, sizes[3])
        used.update(layer, new, new)
    with pytest.raises(ValueError, match="empty cache object"):
        streaming_losses(model, ids, cache=used)
