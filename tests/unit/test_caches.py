"""Tests for attnbook.caches: every cache class answers the one protocol, a layer reading
any of them on a token-by-token decode equals recomputing from scratch, and no layer
module tests which cache it was given."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from attnbook import caches, kvcache, serving
from attnbook.caches import KERNELS, AttentionCache
from attnbook.kvcache import (
    KVCache, PagedKVCache, SlidingWindowKVCache, StaticKVCache,
)
from attnbook.models import Attention, TransformerConfig
from attnbook.serving import (
    LatentKVCache, MultiHeadLatentAttention, QuantizedKVCache, SinkKVCache, truncate_cache,
)

ROOT = Path(__file__).resolve().parents[2]
B, HEADS, KV_HEADS, D_MODEL, T = 2, 4, 2, 16, 7
HEAD_DIM = D_MODEL // HEADS


def _paged():
    cache = PagedKVCache(16, 2, KV_HEADS, HEAD_DIM, dtype=torch.float64)
    for seq in range(B):
        cache.allocate(seq)
    cache.select(range(B))
    return cache


# every cache of keys and values, big enough to hold the whole decode: each then reads
# exactly what recomputing from scratch reads
KV_CACHES = {
    "KVCache": lambda: KVCache(1, B, KV_HEADS, HEAD_DIM, T, dtype=torch.float64),
    "StaticKVCache": lambda: StaticKVCache(1, B, KV_HEADS, HEAD_DIM, T + 1, dtype=torch.float64),
    "SlidingWindowKVCache": lambda: SlidingWindowKVCache(1, B, KV_HEADS, HEAD_DIM, T, dtype=torch.float64),
    "SinkKVCache": lambda: SinkKVCache(1, B, KV_HEADS, HEAD_DIM, 2, T - 2, dtype=torch.float64),
    "QuantizedKVCache": lambda: QuantizedKVCache(1, B, KV_HEADS, HEAD_DIM, T, bits=8, group_size=2,
                                                 dtype=torch.float64),
    "PagedKVCache": _paged,
}
ALL_CACHES = {**KV_CACHES, "LatentKVCache": lambda: LatentKVCache(1, B, 8, 4, T, dtype=torch.float64)}


def test_every_cache_class_of_the_package_is_listed_here():
    found = {name for module in (kvcache, serving) for name in module.__all__
             if name.endswith("Cache") and isinstance(getattr(module, name), type)}
    assert found == set(ALL_CACHES)


@pytest.mark.parametrize("name", ALL_CACHES)
def test_every_cache_answers_the_protocol(name):
    cache = ALL_CACHES[name]()
    assert isinstance(cache, AttentionCache)
    assert cache.kernel in KERNELS and isinstance(cache.positions_in_cache, bool)
    assert cache.length == 0


def test_what_is_not_a_cache_does_not_answer_it():
    assert not isinstance(object(), AttentionCache)
    assert not isinstance(kvcache.SegmentMemory(1, 4), AttentionCache)  # hidden states, no update
    assert caches.__all__ == ["KERNELS", "AttentionCache"]


def _layer():
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=8, d_model=D_MODEL, n_heads=HEADS, n_kv_heads=KV_HEADS,
                               n_layers=1, positional="rope")
    return Attention(config, is_causal=True).double().eval()


@pytest.mark.parametrize("name", KV_CACHES)
@torch.no_grad()
def test_a_layer_reading_any_cache_decodes_as_recomputing_from_scratch(name):
    """A prompt of 3 tokens, then one token a step: every output equals the layer run on the
    whole prefix without a cache. The layer asks the cache how to read it (its kernel, whether it
    numbers positions by slot); the caller gives a cache read under its mask that mask."""
    attn, cache = _layer(), KV_CACHES[name]()
    x = torch.randn(B, T, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    full = attn(x)
    steps = [(0, 3)] + [(t, t + 1) for t in range(3, T)]
    outs = []
    for start, stop in steps:
        bias = None
        if cache.kernel == "masked":  # the caller's mask over the slots it covers
            cache.seek(start, stop - start)
            bias = cache.mask()[..., :stop]
        outs.append(attn(x[:, start:stop], bias, cache))
        assert cache.length == (start if cache.kernel == "masked" else stop)
    tolerance = dict(atol=2e-2, rtol=0) if name == "QuantizedKVCache" else dict(atol=1e-12, rtol=0)
    torch.testing.assert_close(torch.cat(outs, 1), full, **tolerance)


@torch.no_grad()
def test_latent_attention_reading_its_cache_decodes_as_recomputing_from_scratch():
    torch.manual_seed(0)
    mla = MultiHeadLatentAttention(D_MODEL, HEADS, 8, 4).double().eval()
    x = torch.randn(B, T, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    cache = ALL_CACHES["LatentKVCache"]()
    outs = [mla(x[:, :3], cache=cache)] + [mla(x[:, t : t + 1], cache=cache) for t in range(3, T)]
    torch.testing.assert_close(torch.cat(outs, 1), mla(x), atol=1e-12, rtol=0)


def test_a_layer_refuses_a_cache_it_cannot_read():
    attn, x = _layer(), torch.randn(B, 1, D_MODEL, dtype=torch.float64)
    with pytest.raises(TypeError, match="Attention: cache"):
        attn(x, cache=ALL_CACHES["LatentKVCache"]())
    with pytest.raises(TypeError, match="Attention: cache"):
        attn(x, cache=object())
    mla = MultiHeadLatentAttention(D_MODEL, HEADS, 8, 4).double()
    with pytest.raises(TypeError, match="MultiHeadLatentAttention.forward: cache"):
        mla(x, cache=KV_CACHES["KVCache"]())


@pytest.mark.parametrize("name", ALL_CACHES)
def test_truncate_rolls_back_or_refuses(name):
    """Caches that append roll back to what a fresh cache holds after the same updates;
    caches that overwrite or compress refuse with a TypeError naming them."""
    cache, fresh = ALL_CACHES[name](), ALL_CACHES[name]()
    if name == "LatentKVCache":
        new = lambda t, seed: (torch.randn(B, t, 8, dtype=torch.float64),  # noqa: E731
                               torch.randn(B, t, 4, dtype=torch.float64))
    else:
        new = lambda t, seed: (torch.randn(B, KV_HEADS, t, HEAD_DIM, dtype=torch.float64),) * 2  # noqa: E731

    def write(c, t, seed):
        if c.kernel == "masked":
            c.seek(c.length, t)
        c.update(0, *new(t, seed))
        if c.kernel == "masked":
            c.advance()

    write(cache, 3, 0)
    if name in ("SlidingWindowKVCache", "SinkKVCache", "QuantizedKVCache"):
        with pytest.raises(TypeError, match=name):
            cache.truncate(0)
        with pytest.raises(TypeError, match=f"truncate_cache: cache .*{name}"):
            truncate_cache(cache, 0)
        return
    truncate_cache(cache, 1)
    assert cache.length == 1
    with pytest.raises(ValueError, match=r"length must be in \[0, cache.length=1\]"):
        cache.truncate(2)
    write(fresh, 1, 0)
    assert fresh.length == cache.length


def test_paged_update_appends_to_each_selected_sequence_and_pads_to_the_longest():
    cache = PagedKVCache(8, 2, 1, 2)
    for seq in "ab":
        cache.allocate(seq)
    cache.select(["a"])
    cache.update(0, torch.ones(1, 1, 3, 2), torch.ones(1, 1, 3, 2))
    cache.select(["b", "a"])
    k, v = cache.update(0, torch.full((2, 1, 1, 2), 2.0), torch.full((2, 1, 1, 2), 2.0))
    assert k.shape == (2, 1, 4, 2) and cache.seqlens().tolist() == [1, 4] and cache.length == 1
    assert k[0, 0, :, 0].tolist() == [2, 0, 0, 0] and k[1, 0, :, 0].tolist() == [1, 1, 1, 2]
    with pytest.raises(ValueError, match="PagedKVCache.select: seq_ids must be distinct"):
        cache.select(["a", "a"])
    with pytest.raises(ValueError, match="PagedKVCache.update: layer"):
        cache.update(1, k[:, :, :1], v[:, :, :1])
    with pytest.raises(kvcache.CacheFullError, match="PagedKVCache.update"):
        cache.update(0, torch.zeros(2, 1, 9, 2), torch.zeros(2, 1, 9, 2))
    assert cache.seqlens().tolist() == [1, 4]  # a refused update wrote nothing
    cache.truncate(1)
    assert cache.lengths == {"a": 1, "b": 1} and len(cache.free_blocks) == 6


# --------------------------------------------------------------------------------------------------
# No layer tests cache types: the layers ask the cache (its kernel, positions_in_cache)
# --------------------------------------------------------------------------------------------------
LAYER_MODULES = ["models.py", "serving.py", "core.py", "kvcache.py", "generation.py", "layers.py",
                 "caches.py"]


def _name(node) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _type_tests(tree: ast.AST) -> list[str]:
    """``isinstance(x, <a Cache class>)``, ``type(cache) is/==/in ...`` and
    ``getattr(cache, ...)``/``hasattr(cache, ...)``: a layer choosing a route by the
    cache's class."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) == "isinstance" and len(node.args) == 2:
            classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            if any(_name(c).endswith("Cache") and _name(c) != "AttentionCache" for c in classes):
                found.append(f"line {node.lineno}: isinstance(..., {ast.unparse(node.args[1])})")
        if isinstance(node, ast.Call) and _name(node.func) in ("getattr", "hasattr") and node.args:
            if "cache" in ast.unparse(node.args[0]).lower():
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                if (isinstance(side, ast.Call) and _name(side.func) == "type" and side.args
                        and "cache" in ast.unparse(side.args[0]).lower()):
                    found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("module", LAYER_MODULES)
def test_no_layer_tests_cache_types(module):
    path = ROOT / "attnbook" / module
    if not path.exists():
        pytest.skip(f"{module} does not exist")
    found = _type_tests(ast.parse(path.read_text()))
    assert not found, f"attnbook/{module} tests cache types: {found}"


def test_the_static_check_finds_what_it_looks_for():
    source = """
if isinstance(cache, StaticKVCache): pass
if type(cache) is KVCache: pass
in_cache = getattr(cache, "positions_in_cache", False)
if type(cache) not in (KVCache, LatentKVCache): pass
if isinstance(cache, AttentionCache) and cache.kernel == "masked": pass
"""
    assert len(_type_tests(ast.parse(source))) == 4
