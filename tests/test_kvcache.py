"""Tests for attnbook.kvcache: cache sizes, the static, sliding-window and paged caches, split-KV decoding."""

import math

import pytest
import torch
import torch.nn.functional as F

from attnbook.core import scaled_dot_product_attention
from attnbook.kvcache import (
    MODEL_CONFIGS, CacheFullError, KVCache, PagedKVCache, SlidingWindowKVCache, decode_attention, kv_cache_bytes,
    model_cache_table, split_kv_attention,
)
from attnbook.sparse import sliding_window_mask


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


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
    torch.testing.assert_close(split_kv_attention(q, k, v, seqlens, num_splits), _sdpa_over_prefixes(q, k, v, seqlens))


def test_split_kv_reference_empty_sequence_fp16_and_dispatch():
    q, k, v = randn(2, 2, 1, 8, seed=9), randn(2, 2, 12, 8, seed=10), randn(2, 2, 12, 8, seed=11)
    out = split_kv_attention(q, k, v, torch.tensor([0, 12]), 3)
    assert torch.equal(out[0], torch.zeros_like(out[0]))  # an empty cache reads nothing: zeros, not NaN
    half = split_kv_attention(q.half(), k.half(), v.half(), torch.tensor([5, 12]), 4)
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.float(), _sdpa_over_prefixes(q, k, v, torch.tensor([5, 12])), atol=2e-3, rtol=2e-3)
    decode_attention(q, k, v, torch.tensor([3, 4]))
    assert decode_attention.last_backend == "torch"  # no CUDA here, so no Triton either
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
