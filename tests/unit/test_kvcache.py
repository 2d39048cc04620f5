"""Tests for attnbook.kvcache: decode intensity, cache sizes, the static, sliding-window and
paged caches, segment-level recurrence with (compressed) memory, split-KV decoding."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from torch.utils.flop_counter import FlopCounterMode

from attnbook.core import scaled_dot_product_attention
from attnbook.kvcache import (
    MODEL_CONFIGS, CacheFullError, KVCache, PagedKVCache, RelativeSegmentAttention,
    SegmentMemory, SlidingWindowKVCache, compress_memories, decode_arithmetic_intensity,
    decode_attention, kv_cache_bytes, model_cache_table, run_segments,
    split_kv_attention,
)
from attnbook.positional import sinusoidal_encoding
from attnbook.sparse import sliding_window_mask


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# --------------------------------------------------------------------------- decode intensity
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_heads,n_kv_heads", [(8, 8), (8, 2), (8, 1)])
def test_decode_intensity_counts_the_flops_and_bytes_of_an_explicit_decode_step(
    n_heads, n_kv_heads, dtype
):
    """One decode step written out: the group's query heads are the rows of one product
    with their shared K and V, so each cached element is read once. FLOPs come from
    PyTorch's counter, bytes from the tensors read and written."""
    B, S, d, group = 3, 40, 16, n_heads // n_kv_heads
    q = randn(B, n_heads, 1, d, seed=1, dtype=dtype)
    k, v = randn(B, n_kv_heads, S, d, seed=2, dtype=dtype), randn(B, n_kv_heads, S, d, seed=3, dtype=dtype)
    with FlopCounterMode(display=False) as counter:
        rows = q.view(B, n_kv_heads, group, d)  # query head h reads KV head h // group
        p = torch.softmax(rows @ k.transpose(-2, -1) / math.sqrt(d), dim=-1)
        out = (p @ v).view(B, n_heads, 1, d)
    expected = F.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1))
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)
    moved = sum(t.numel() * t.element_size() for t in (q, k, v, out))
    intensity = counter.get_total_flops() / moved
    assert intensity == pytest.approx(
        decode_arithmetic_intensity(n_heads, n_kv_heads, d, dtype.itemsize, B, seq_len=S))


def test_decode_intensity_limit_ignores_batch_and_head_dim_and_grows_with_the_group():
    assert decode_arithmetic_intensity(32, 32, 128) == 1.0  # MHA in fp16: 1 FLOP per byte
    assert decode_arithmetic_intensity(32, 8, 128) == 4.0
    assert decode_arithmetic_intensity(32, 1, 128, bytes_per_element=4) == 16.0
    long = decode_arithmetic_intensity(32, 8, 128, seq_len=10**7)
    assert long == pytest.approx(4.0, rel=1e-5) and long < 4.0
    for batch, head_dim in [(1, 64), (64, 128), (7, 80)]:
        assert decode_arithmetic_intensity(32, 8, head_dim, 2, batch, 4096) == pytest.approx(
            decode_arithmetic_intensity(32, 8, 128, 2, 1, 4096))
    with pytest.raises(ValueError, match="multiple"):
        decode_arithmetic_intensity(32, 6, 128)
    with pytest.raises(ValueError, match="seq_len"):
        decode_arithmetic_intensity(32, 8, 128, seq_len=0)


def test_kv_cache_bytes_formula_and_published_sizes():
    assert kv_cache_bytes(2, 3, 5, 7, batch=11, bytes_per_elem=4) == 2 * 2 * 3 * 5 * 7 * 11 * 4
    # Llama-2-7B in fp16: 2 * 32 layers * 4096 (= 32 heads * 128) * 2 bytes = 0.5 MiB per token, 2 GiB at 4096
    rows = {row["model"]: row for row in model_cache_table()}
    assert rows["Llama-2-7B"]["kib_per_token"] == 512 and rows["Llama-2-7B"]["mib_at_context"] == 2048
    # GQA: Llama-2-70B stores 8 KV heads of its 64, so 80 layers cost 2.5x Llama-2-7B's per token, not 20x
    assert rows["Llama-2-70B"]["kib_per_token"] == 320
    assert rows["Llama-3-8B"]["kib_per_token"] == 128  # 8 KV heads: a quarter of Llama-2-7B
    assert rows["GPT-2 small"]["kib_per_token"] == 36  # 2 * 12 * 768 * 2 bytes
    assert rows["Mistral-7B"]["cached_positions"] == MODEL_CONFIGS["Mistral-7B"]["window"] == 4096
    with pytest.raises(ValueError, match="seq_len"):
        kv_cache_bytes(1, 1, 1, -1)


def test_kv_cache_appends_returns_valid_views_and_resets():
    cache = KVCache(n_layers=2, batch=2, n_kv_heads=3, head_dim=4, max_len=10)
    k, v = randn(2, 3, 6, 4, seed=1), randn(2, 3, 6, 4, seed=2)
    for layer in range(2):
        K, V = cache.update(layer, k[:, :, :4], v[:, :, :4])
        assert K.shape == (2, 3, 4, 4)
    assert cache.length == 4
    K, V = cache.update(0, k[:, :, 4:], v[:, :, 4:])
    torch.testing.assert_close(K, k)
    torch.testing.assert_close(V, v)
    assert cache.length == 4  # layer 1 has not seen positions 4, 5 yet
    cache.reset()
    assert cache.length == 0 and cache.update(1, k[:, :, :1], v[:, :, :1])[0].shape[-2] == 1


def test_kv_cache_refuses_to_write_past_max_len_and_bad_shapes():
    cache = KVCache(1, 1, 1, 4, max_len=5)
    cache.update(0, randn(1, 1, 5, 4), randn(1, 1, 5, 4))
    with pytest.raises(CacheFullError, match="max_len=5"):
        cache.update(0, randn(1, 1, 1, 4), randn(1, 1, 1, 4))
    assert cache.lengths == [5]  # the failed write changed nothing
    with pytest.raises(ValueError, match="k_new and v_new"):
        KVCache(1, 1, 1, 4, max_len=5).update(0, randn(1, 2, 1, 4), randn(1, 2, 1, 4))


@pytest.mark.parametrize("chunks", [[1] * 13, [5, 1, 1, 6], [13], [2, 9, 1, 1]])
def test_sliding_window_cache_attention_equals_dense_windowed_attention(chunks):
    """Feeding a sequence in chunks through the ring buffer gives dense attention with a causal window mask."""
    window, n = 4, sum(chunks)
    q, k, v = randn(1, 2, n, 8, seed=3), randn(1, 2, n, 8, seed=4), randn(1, 2, n, 8, seed=5)
    mask = sliding_window_mask(n, window - 1) & torch.ones(n, n, dtype=torch.bool).tril()  # keys p-window+1 .. p
    expected = scaled_dot_product_attention(q, k, v, mask)
    cache, outs, start = SlidingWindowKVCache(1, 1, 2, 8, window), [], 0
    for T in chunks:
        K, V = cache.update(0, k[:, :, start:start + T], v[:, :, start:start + T])
        S = K.shape[-2]
        assert S == min(start, window) + T
        i = torch.arange(start, start + T)[:, None]  # query positions
        j = torch.arange(start + T - S, start + T)[None, :]  # key positions, oldest first
        outs.append(scaled_dot_product_attention(q[:, :, start:start + T], K, V, (j <= i) & (j > i - window)))
        start += T
        assert cache.k.shape[-2] == window  # memory never grows
    torch.testing.assert_close(torch.cat(outs, dim=2), expected)
    K_kept, _ = cache.retained(0)
    torch.testing.assert_close(K_kept, k[:, :, -window:])


def test_paged_cache_gather_equals_contiguous_and_wastes_only_the_last_block():
    block, heads, d = 4, 2, 3
    paged = PagedKVCache(n_blocks=12, block_size=block, n_kv_heads=heads, head_dim=d)
    lengths, chunks = {"a": 0, "b": 0, "c": 0}, {"a": [3, 1, 5], "b": [9, 2], "c": [1, 1, 1, 1]}
    full = {s: (randn(heads, sum(c), d, seed=i), randn(heads, sum(c), d, seed=10 + i)) for i, (s, c) in enumerate(chunks.items())}
    for s in chunks:
        paged.allocate(s)
    for step in range(4):  # interleave the sequences, so their blocks interleave in the pool
        for s, sizes in chunks.items():
            if step < len(sizes):
                n, T = lengths[s], sizes[step]
                paged.append(s, full[s][0][:, n:n + T], full[s][1][:, n:n + T])
                lengths[s] += T
    for s in chunks:
        K, V = paged.gather(s)
        torch.testing.assert_close(K, full[s][0])
        torch.testing.assert_close(V, full[s][1])
        assert len(paged.block_tables[s]) == math.ceil(lengths[s] / block)
    assert paged.wasted_slots() == sum(-n % block for n in lengths.values()) == 3 + 1 + 0
    assert paged.wasted_slots() < len(chunks) * (block - 1) + 1
    used = sorted(b for t in paged.block_tables.values() for b in t)
    assert used == sorted(set(used)) and len(paged.free_blocks) == 12 - len(used)  # no block shared
    paged.free("b")
    assert len(paged.free_blocks) == 12 - 3 - 1 and "b" not in paged.block_tables
    with pytest.raises(CacheFullError, match="blocks"):
        paged.append("a", randn(heads, 40, d), randn(heads, 40, d))
    with pytest.raises(ValueError, match="not allocated"):
        paged.gather("b")
    with pytest.raises(ValueError, match="already"):
        paged.allocate("a")


# --------------------------------------------------------------------------- segment recurrence
def _mean_pool_by_hand(states, rate):
    """(B, n, d) -> (B, ceil(n / rate), d): the mean of each run of `rate` positions."""
    n = states.shape[1]
    return torch.stack([states[:, s:s + rate].mean(1) for s in range(0, n, rate)], 1)


@given(n=st.integers(0, 13), rate=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_compress_memories_is_mean_pooling_with_a_short_last_run(n, rate, seed):
    states = randn(2, n, 3, seed=seed)
    out = compress_memories(states, rate)
    assert out.shape == (2, math.ceil(n / rate), 3)
    if n:
        torch.testing.assert_close(out, _mean_pool_by_hand(states, rate))
    with pytest.raises(ValueError, match="rate"):
        compress_memories(states, 0)


def _xl_layer_reference(layer, h, first_key):
    """One RelativeSegmentAttention layer over a whole sequence h (B, T, D), the slow obvious
    way: query i attends keys first_key(i) .. i with score
    (q_i + u) . k_j + (q_i + v) . r_(i - j), r = sinusoidal table of distances @ W_R."""
    B, T, D = h.shape
    H, d = layer.n_heads, layer.head_dim
    q, k, v = (h @ lin.weight.T for lin in (layer.q_proj, layer.k_proj, layer.v_proj))
    r = sinusoidal_encoding(T, D).to(h) @ layer.r_proj.weight.T  # row = distance
    out = torch.zeros_like(h)
    for b in range(B):
        for head in range(H):
            c = slice(head * d, (head + 1) * d)
            for i in range(T):
                keys = range(first_key(i), i + 1)
                scores = torch.stack([
                    ((q[b, i, c] + layer.u[head]) @ k[b, j, c]
                     + (q[b, i, c] + layer.v[head]) @ r[i - j, c]) / math.sqrt(d)
                    for j in keys])
                weights = torch.softmax(scores, 0)
                out[b, i, c] = sum(w * v[b, j, c] for w, j in zip(weights, keys))
    return out @ layer.out_proj.weight.T


def _stack(n_layers, d_model=8, n_heads=2, seed=0):
    torch.manual_seed(seed)
    return [RelativeSegmentAttention(d_model, n_heads).double() for _ in range(n_layers)]


@given(T=st.integers(1, 11), segment_len=st.integers(1, 5), n_layers=st.integers(1, 2),
       extra=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_segments_with_a_memory_of_the_whole_sequence_equal_attention_over_the_prefix(
    T, segment_len, n_layers, extra, seed
):
    """Memory M >= T: segment-by-segment processing sees every earlier position, so it is
    causal relative attention over the whole prefix at once, layer by layer."""
    layers = _stack(n_layers, seed=seed % 100)
    x = randn(2, T, 8, seed=seed, dtype=torch.float64)
    memory = SegmentMemory(n_layers, mem_len=T + extra)
    with torch.no_grad():
        got = run_segments(layers, x, segment_len, memory)
        h = x
        for layer in layers:
            h = h + _xl_layer_reference(layer, h, lambda i: 0)
    torch.testing.assert_close(got, h)
    assert [memory.slots(layer) for layer in range(n_layers)] == [(T, 0)] * n_layers


@given(T=st.integers(1, 12), segment_len=st.integers(1, 4), mem_len=st.integers(0, 5),
       n_layers=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_segments_with_a_short_memory_see_back_to_the_segment_start_minus_memory(
    T, segment_len, mem_len, n_layers, seed
):
    """Memory M < T: a query of the segment starting at s sees keys s - M .. i in every
    layer (the window each layer's states were computed with)."""
    layers = _stack(n_layers, seed=seed % 100)
    x = randn(1, T, 8, seed=seed, dtype=torch.float64)
    with torch.no_grad():
        got = run_segments(layers, x, segment_len, SegmentMemory(n_layers, mem_len))
        h = x
        for layer in layers:
            h = h + _xl_layer_reference(
                layer, h, lambda i: max(0, i // segment_len * segment_len - mem_len))
    torch.testing.assert_close(got, h)


def test_memory_is_detached_so_no_gradient_crosses_a_segment_boundary():
    layers = _stack(2)
    x = randn(1, 12, 8, seed=4, dtype=torch.float64).requires_grad_()
    memory = SegmentMemory(2, mem_len=8)
    out = run_segments(layers, x, 4, memory)
    assert all(not memory.context(layer).requires_grad for layer in range(2))
    out[:, 8:].sum().backward()  # the last segment only
    assert torch.count_nonzero(x.grad[:, :8]) == 0  # earlier segments: through memory only
    assert torch.count_nonzero(x.grad[:, 8:]) > 0
    assert all(p.grad is not None for layer in layers for p in layer.parameters())
    # the same run without memory: earlier segments are not even read
    with torch.no_grad():
        alone = run_segments(layers, x, 4)
        assert not torch.allclose(alone[:, 8:], out[:, 8:])
        torch.testing.assert_close(alone[:, :4], out[:, :4])  # nothing before segment 0


def test_effective_context_grows_by_the_memory_length_per_layer():
    """The last position of a segment depends on inputs segment_len + n_layers * mem_len
    back (M a multiple of L): each layer reaches M further."""
    L, M, T = 2, 4, 24
    for n_layers in (1, 2, 3):
        layers = _stack(n_layers, seed=n_layers)
        x = randn(1, T, 8, seed=5, dtype=torch.float64).repeat(T + 1, 1, 1)
        x[torch.arange(1, T + 1), torch.arange(T)] += 1.0  # row p + 1 changes input p
        with torch.no_grad():
            out = run_segments(layers, x, L, SegmentMemory(n_layers, M))[:, -1]
        changed = (out[1:] - out[0]).abs().amax(-1) > 1e-9
        assert T - int(changed.nonzero().min()) == L + n_layers * M


@pytest.mark.parametrize("mem_len,compressed_len,rate", [(4, 3, 2), (3, 10, 3), (0, 4, 1)])
def test_compressed_memory_keeps_ceil_evicted_over_rate_slots_of_mean_pooled_states(
    mem_len, compressed_len, rate
):
    memory = SegmentMemory(1, mem_len, compressed_len, rate)
    pushed, evicted_so_far, pooled = [], 0, []
    for i, n in enumerate([3, 5, 1, 2, 6]):
        pushed.append(randn(2, n, 3, seed=i))
        memory.update(0, pushed[-1])
        states = torch.cat(pushed, 1)
        evicted = max(0, states.shape[1] - mem_len)
        if evicted > evicted_so_far:
            chunk = states[:, evicted_so_far:evicted]
            pooled.append(_mean_pool_by_hand(chunk, rate))
            assert pooled[-1].shape[1] == math.ceil(chunk.shape[1] / rate)
        evicted_so_far = evicted
        by_hand = torch.cat(pooled, 1)[:, -compressed_len:] if pooled else None
        kept, slots = memory.slots(0)
        assert kept == min(mem_len, states.shape[1])
        assert slots == (0 if by_hand is None else by_hand.shape[1]) <= compressed_len
        if by_hand is not None:
            torch.testing.assert_close(memory.compressed[0], by_hand)
        torch.testing.assert_close(memory.memory[0], states[:, states.shape[1] - kept:])
        expected = states[:, states.shape[1] - kept:]
        if by_hand is not None:
            expected = torch.cat((by_hand, expected), 1)
        torch.testing.assert_close(memory.context(0), expected)


class SegmentMemoryMachine(RuleBasedStateMachine):
    """Any sequence of pushes: the memory holds the last M states, the compressed memory
    the last C slots of the mean-pooled evictions, recomputed from scratch."""

    def __init__(self):
        super().__init__()
        self.M, self.C, self.rate = 3, 4, 2
        self.memory = SegmentMemory(2, self.M, self.C, self.rate)
        self.pushes = []

    @rule(n=st.integers(1, 5), seed=st.integers(0, 1000))
    def push(self, n, seed):
        self.pushes.append(randn(1, n, 2, seed=seed))
        for layer in range(2):
            self.memory.update(layer, self.pushes[-1] * (layer + 1))

    @invariant()
    def matches_recomputing_from_scratch(self):
        if not self.pushes:
            assert self.memory.context(0) is None
            return
        states = torch.cat(self.pushes, 1)
        totals = torch.tensor([p.shape[1] for p in self.pushes]).cumsum(0).tolist()
        cuts = [0] + [max(0, t - self.M) for t in totals]
        pooled = [_mean_pool_by_hand(states[:, a:b], self.rate)
                  for a, b in zip(cuts, cuts[1:]) if b > a]
        parts = ([torch.cat(pooled, 1)[:, -self.C:]] if pooled else []) + [
            states[:, max(0, states.shape[1] - self.M):]]
        for layer in range(2):
            torch.testing.assert_close(self.memory.context(layer), torch.cat(parts, 1) * (layer + 1))
            assert sum(self.memory.slots(layer)) <= self.M + self.C


TestSegmentMemoryMachine = SegmentMemoryMachine.TestCase


def test_segment_memory_and_attention_reject_bad_arguments():
    with pytest.raises(ValueError, match="mem_len"):
        SegmentMemory(1, -1)
    with pytest.raises(ValueError, match="d_model"):
        RelativeSegmentAttention(10, 4)
    with pytest.raises(ValueError, match="memory has 1 layers"):
        run_segments(_stack(2), randn(1, 4, 8, dtype=torch.float64), 2, SegmentMemory(1, 2))
    with pytest.raises(ValueError, match="segment_len"):
        run_segments(_stack(1), randn(1, 4, 8, dtype=torch.float64), 0)


def _sdpa_over_prefixes(q, k, v, seqlens):
    group = q.shape[1] // k.shape[1]
    outs = []
    for b, n in enumerate(seqlens.tolist()):
        kb = k[b:b + 1, :, :n].repeat_interleave(group, 1).float()
        vb = v[b:b + 1, :, :n].repeat_interleave(group, 1).float()
        outs.append(F.scaled_dot_product_attention(q[b:b + 1].float(), kb, vb) if n else torch.zeros_like(q[b:b + 1]).float())
    return torch.cat(outs)


@pytest.mark.parametrize("num_splits", [1, 3, 7, 200])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_split_kv_reference_equals_sdpa_over_each_valid_prefix(num_splits, kv_heads):
    q, k, v = randn(4, 4, 1, 16, seed=6), randn(4, kv_heads, 50, 16, seed=7), randn(4, kv_heads, 50, 16, seed=8)
    seqlens = torch.tensor([1, 17, 50, 33])
    torch.testing.assert_close(split_kv_attention(q, k, v, seqlens, num_splits=num_splits), _sdpa_over_prefixes(q, k, v, seqlens))


def test_split_kv_reference_empty_sequence_fp16_and_dispatch():
    q, k, v = randn(2, 2, 1, 8, seed=9), randn(2, 2, 12, 8, seed=10), randn(2, 2, 12, 8, seed=11)
    out = split_kv_attention(q, k, v, torch.tensor([0, 12]), num_splits=3)
    assert torch.equal(out[0], torch.zeros_like(out[0]))  # an empty cache reads nothing: zeros, not NaN
    half = split_kv_attention(q.half(), k.half(), v.half(), torch.tensor([5, 12]), num_splits=4)
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float(), _sdpa_over_prefixes(q, k, v, torch.tensor([5, 12])), atol=2e-3, rtol=2e-3)
    # no CUDA here, so no Triton either
    assert decode_attention(q, k, v, torch.tensor([3, 4]), return_backend=True)[1] == "torch"
    with pytest.raises(ValueError, match="cache_seqlens"):
        split_kv_attention(q, k, v, torch.tensor([13, 1]))
    with pytest.raises(ValueError, match="q must"):
        split_kv_attention(q[:, :, 0], k, v, torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="backend"):
        decode_attention(q, k, v, torch.tensor([1, 1]), backend="cuda")


def test_importing_attnbook_and_kvcache_does_not_import_triton():
    import subprocess
    import sys

    code = "import attnbook, attnbook.kvcache, attnbook.models, sys; print('triton' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_every_cache_applies_the_contracts_update_rule():
    """One rule (contract.check_cache_update) for every cache: a layer outside the cache,
    an empty update and a wrong width raise ValueError naming the argument."""
    from attnbook.serving import QuantizedKVCache, SinkKVCache

    caches = [KVCache(2, 1, 1, 4, max_len=8), SlidingWindowKVCache(2, 1, 1, 4, window=3),
              SinkKVCache(2, 1, 1, 4, n_sink=1, window=3),
              QuantizedKVCache(2, 1, 1, 4, 8, bits=8, group_size=4)]
    for cache in caches:
        name = type(cache).__name__
        with pytest.raises(ValueError, match=rf"{name}.update: layer must be in \[0, 2\), got 2"):
            cache.update(2, randn(1, 1, 1, 4), randn(1, 1, 1, 4))
        with pytest.raises(ValueError, match="T >= 1"):
            cache.update(0, randn(1, 1, 0, 4), randn(1, 1, 0, 4))
        with pytest.raises(ValueError, match=r"\(1, 1, 'T', 4\)"):
            cache.update(0, randn(1, 1, 2, 5), randn(1, 1, 2, 5))
    pages = PagedKVCache(4, 2, 1, 4)
    pages.allocate("a")
    with pytest.raises(ValueError, match="PagedKVCache.append: k and v must have shape"):
        pages.append("a", randn(1, 0, 4), randn(1, 0, 4))


def test_num_splits_zero_and_bad_sizes_are_refused_not_replaced():
    """Regression: num_splits=0 fell back to the default, max_len=-1 and integer
    tensors slipped through; each now names the function and the argument."""
    q, k = torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 8, 4)
    lens = torch.tensor([3])
    for call in (split_kv_attention, decode_attention):
        with pytest.raises(ValueError, match=f"{call.__name__}: num_splits must be an integer >= 1, got 0"):
            call(q, k, k, lens, num_splits=0)
        with pytest.raises(TypeError, match=f"{call.__name__}: q must be a floating-point tensor"):
            call(q.long(), k.long(), k.long(), lens)
    with pytest.raises(ValueError, match="KVCache: max_len must be a positive integer, got -1"):
        KVCache(1, 1, 1, 4, -1)
    with pytest.raises(ValueError, match="SlidingWindowKVCache: window must be a positive integer"):
        SlidingWindowKVCache(1, 1, 1, 4, 0)
    with pytest.raises(TypeError, match="KVCache.update: k_new must be a floating-point tensor"):
        KVCache(1, 1, 1, 4, 8).update(0, torch.zeros(1, 1, 1, 4, dtype=torch.long), torch.zeros(1, 1, 1, 4))
    with pytest.raises(ValueError, match="PagedKVCache.gather: seq_id 'x' is not allocated"):
        PagedKVCache(2, 2, 1, 4).gather("x")


def test_decode_triton_without_a_gpu_or_the_interpreter_says_how_to_get_one(monkeypatch):
    """decode_attention(backend="triton") on a CPU tensor without TRITON_INTERPRET: a clear
    RuntimeError naming the function, how to get the interpreter and backend='torch', not
    Triton's raw '0 active drivers'; the same words as the flash path (one helper,
    attnbook.kernels.triton_missing)."""
    import sys

    from attnbook import kernels
    from attnbook.flash import select_backend

    q, k = torch.zeros(1, 2, 1, 16), torch.zeros(1, 1, 8, 16)
    lens = torch.tensor([5])
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError) as info:
        decode_attention(q, k, k, lens, backend="triton")
    message = str(info.value)
    assert message.startswith("decode_attention: backend='triton' needs a CUDA tensor or Triton's CPU interpreter")
    assert "os.environ['TRITON_INTERPRET'] = '1' before attnbook.kernels.decode" in message
    assert "backend='torch'" in message and "0 active drivers" not in message
    with pytest.raises(RuntimeError) as flash_info:
        select_backend(q, "triton")
    assert "TRITON_INTERPRET is not '1'. For the interpreter (slow, for tests) set" in str(flash_info.value)
    # the variable set after the decode kernels were compiled for a GPU: said so
    fake = type(sys)("attnbook.kernels.decode")
    fake._split_kernel = type("JITFunction", (), {})()
    monkeypatch.setitem(sys.modules, "attnbook.kernels.decode", fake)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match=r"decode_attention: .*TRITON_INTERPRET=1 was set after "
                                           r"attnbook.kernels.decode had been imported"):
        decode_attention(q, k, k, lens, backend="triton")
    # no Triton at all: said so, before importing the kernel module fails
    monkeypatch.setattr(kernels, "_triton_version", lambda: None)
    with pytest.raises(RuntimeError, match="decode_attention: backend='triton' needs the triton package"):
        decode_attention(q, k, k, lens, backend="triton")
    # backend='torch' still runs
    assert decode_attention(q, k, k, lens, backend="torch").shape == (1, 2, 1, 16)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_decode_with_no_query_heads_or_no_batch_gives_empty_outputs_and_zero_kv_heads_is_refused(backend):
    """Heads 0 and batch 0 give the empty result of the documented shape (as SDPA over
    empty shapes); a cache with no key/value head has nothing to share: ValueError."""
    q, k = randn(2, 2, 1, 8, seed=12), randn(2, 2, 6, 8, seed=13)
    lens = torch.tensor([3, 6])
    for qq, kk, ll in ((q[:, :0], k, lens), (q[:0], k[:0], lens[:0])):
        out = decode_attention(qq, kk, kk, ll, backend=backend)
        expected = F.scaled_dot_product_attention(qq, kk[:, : qq.shape[1]], kk[:, : qq.shape[1]])
        assert out.shape == expected.shape == (*qq.shape[:2], 1, 8)
    with pytest.raises(ValueError, match=r"decode_attention: k_cache must have at least one key/value head .*"
                                         r"k_cache \(2, 0, 6, 8\)"):
        decode_attention(q, k[:, :0], k[:, :0], lens, backend=backend)
