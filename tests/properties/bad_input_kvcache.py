"""Bad-input rows of attnbook.kvcache (see tests/properties/test_bad_input.py)."""

from __future__ import annotations

import torch
from test_bad_input import Bad, Edge

from attnbook.kvcache import (
    KVCache,
    PagedKVCache,
    RelativeSegmentAttention,
    SegmentMemory,
    SlidingWindowKVCache,
    StaticKVCache,
    compress_memories,
    decode_arithmetic_intensity,
    kv_cache_bytes,
    model_cache_table,
    run_segments,
    split_kv_attention,
)

_G = torch.Generator().manual_seed(0)
_Q = torch.randn(2, 2, 1, 4, generator=_G)
_KC = torch.randn(2, 1, 8, 4, generator=_G)
_VC = torch.randn(2, 1, 8, 4, generator=_G)
_LENS = torch.tensor([3, 8])
_KN = torch.randn(2, 1, 1, 4, generator=_G)


def _cache(cls=KVCache):
    return cls(2, 2, 1, 4, 8)


def _full_static():
    cache = _cache(StaticKVCache)
    cache.seek(7)
    return cache


def _paged():
    cache = PagedKVCache(4, 2, 1, 4)
    cache.allocate("a")
    return cache


def _split(**kw):
    return split_kv_attention(_Q, _KC, _VC, _LENS, **kw)


_L = RelativeSegmentAttention(8, 2)
_X = torch.randn(1, 4, 8, generator=_G)

ROWS = [
    # decode_arithmetic_intensity
    Bad("decode_arithmetic_intensity", "zero", lambda: decode_arithmetic_intensity(8, 0, 64),
        ("decode_arithmetic_intensity", "n_kv_heads")),
    Bad("decode_arithmetic_intensity", "non-integer", lambda: decode_arithmetic_intensity(8.5, 2, 64),
        ("decode_arithmetic_intensity", "n_heads")),
    Bad("decode_arithmetic_intensity", "boolean", lambda: decode_arithmetic_intensity(8, True, 64),
        ("decode_arithmetic_intensity", "n_kv_heads")),
    Bad("decode_arithmetic_intensity", "negative", lambda: decode_arithmetic_intensity(8, 2, 64, seq_len=-1),
        ("decode_arithmetic_intensity", "seq_len")),
    Bad("decode_arithmetic_intensity", "out-of-range", lambda: decode_arithmetic_intensity(8, 3, 64),
        ("decode_arithmetic_intensity", "n_kv_heads")),
    # kv_cache_bytes
    Bad("kv_cache_bytes", "negative", lambda: kv_cache_bytes(2, 1, 64, -1),
        ("kv_cache_bytes", "seq_len")),
    Bad("kv_cache_bytes", "non-integer", lambda: kv_cache_bytes(2, 1, 64, 10.5),
        ("kv_cache_bytes", "seq_len")),
    Bad("kv_cache_bytes", "boolean", lambda: kv_cache_bytes(True, 1, 64, 10),
        ("kv_cache_bytes", "n_layers")),
    Edge("kv_cache_bytes", "zero", lambda: kv_cache_bytes(2, 1, 64, 0), lambda n: n == 0),
    # model_cache_table
    Bad("model_cache_table", "zero", lambda: model_cache_table(bytes_per_elem=0),
        ("model_cache_table", "bytes_per_elem")),
    Bad("model_cache_table", "non-integer", lambda: model_cache_table(batch=1.5),
        ("model_cache_table", "batch")),
    # KVCache
    Bad("KVCache", "negative", lambda: KVCache(2, 2, 1, 4, -1), ("KVCache", "max_len")),
    Bad("KVCache", "zero", lambda: KVCache(2, 0, 1, 4, 8), ("KVCache", "batch")),
    Bad("KVCache", "non-integer", lambda: KVCache(2, 2, 1, 4, 8.0), ("KVCache", "max_len")),
    Bad("KVCache", "boolean", lambda: KVCache(True, 2, 1, 4, 8), ("KVCache", "n_layers")),
    Bad("KVCache", "wrong-dtype", lambda: KVCache(2, 2, 1, 4, 8, dtype=torch.int64), ("KVCache", "dtype")),
    Bad("KVCache.update", "wrong-type", lambda: _cache().update(None, _KN, _KN), ("KVCache.update", "layer")),
    Bad("KVCache.update", "out-of-range", lambda: _cache().update(2, _KN, _KN), ("KVCache.update", "layer")),
    Bad("KVCache.update", "wrong-shape", lambda: _cache().update(0, _KN[..., :3], _KN[..., :3]),
        ("KVCache.update", "k_new")),
    Bad("KVCache.update", "empty", lambda: _cache().update(0, _KN[:, :, :0], _KN[:, :, :0]),
        ("KVCache.update", "k_new")),
    Bad("KVCache.update", "integer-dtype", lambda: _cache().update(0, _KN.long(), _KN.long()),
        ("KVCache.update", "k_new")),
    Bad("KVCache.update", "boolean", lambda: _cache().update(True, _KN, _KN), ("KVCache.update", "layer")),
    # StaticKVCache
    Bad("StaticKVCache", "zero", lambda: StaticKVCache(2, 2, 1, 4, 0), ("StaticKVCache", "max_len")),
    Bad("StaticKVCache", "non-integer", lambda: StaticKVCache(2, 2.0, 1, 4, 8), ("StaticKVCache", "batch")),
    Bad("StaticKVCache", "wrong-dtype", lambda: StaticKVCache(2, 2, 1, 4, 8, dtype=torch.int32),
        ("StaticKVCache", "dtype")),
    Bad("StaticKVCache.seek", "negative", lambda: _cache(StaticKVCache).seek(-1), ("StaticKVCache.seek", "start")),
    Bad("StaticKVCache.seek", "zero", lambda: _cache(StaticKVCache).seek(0, 0), ("StaticKVCache.seek", "count")),
    Bad("StaticKVCache.seek", "out-of-range", lambda: _cache(StaticKVCache).seek(6, 3),
        ("StaticKVCache.seek", "max_len=8")),
    Bad("StaticKVCache.seek", "boolean", lambda: _cache(StaticKVCache).seek(True), ("StaticKVCache.seek", "start")),
    Bad("StaticKVCache.update", "out-of-range", lambda: _cache(StaticKVCache).update(2, _KN, _KN),
        ("StaticKVCache.update", "layer")),
    Bad("StaticKVCache.update", "wrong-shape", lambda: _cache(StaticKVCache).update(0, _KN.repeat(1, 1, 2, 1),
        _KN.repeat(1, 1, 2, 1)), ("StaticKVCache.update", "k_new", "slot")),
    Bad("StaticKVCache.update", "integer-dtype", lambda: _cache(StaticKVCache).update(0, _KN.long(), _KN.long()),
        ("StaticKVCache.update", "k_new")),
    Bad("StaticKVCache.mask", "wrong-shape", lambda: _cache(StaticKVCache).mask(torch.ones(2, 5, dtype=torch.bool)),
        ("StaticKVCache.mask", "real", "(2, 8)")),
    Bad("StaticKVCache.mask", "wrong-dtype", lambda: _cache(StaticKVCache).mask(torch.ones(2, 8)),
        ("StaticKVCache.mask", "real")),
    Bad("StaticKVCache.advance", "out-of-range", lambda: _full_static().advance(),
        ("StaticKVCache.advance", "max_len=8")),
    # SlidingWindowKVCache
    Bad("SlidingWindowKVCache", "negative", lambda: SlidingWindowKVCache(2, 2, 1, 4, -1),
        ("SlidingWindowKVCache", "window")),
    Bad("SlidingWindowKVCache", "non-integer", lambda: SlidingWindowKVCache(2, 2, 1, 4, 2.5),
        ("SlidingWindowKVCache", "window")),
    Bad("SlidingWindowKVCache.update", "out-of-range", lambda: _cache(SlidingWindowKVCache).update(-1, _KN, _KN),
        ("SlidingWindowKVCache.update", "layer")),
    Bad("SlidingWindowKVCache.update", "wrong-shape",
        lambda: _cache(SlidingWindowKVCache).update(0, _KN[:1], _KN[:1]), ("SlidingWindowKVCache.update", "k_new")),
    Bad("SlidingWindowKVCache.retained", "out-of-range", lambda: _cache(SlidingWindowKVCache).retained(5),
        ("SlidingWindowKVCache.retained", "layer")),
    # compress_memories
    Bad("compress_memories", "zero", lambda: compress_memories(_X, 0), ("compress_memories", "rate")),
    Bad("compress_memories", "non-integer", lambda: compress_memories(_X, 1.5), ("compress_memories", "rate")),
    Bad("compress_memories", "integer-dtype", lambda: compress_memories(_X.long(), 2),
        ("compress_memories", "states")),
    Bad("compress_memories", "wrong-shape", lambda: compress_memories(_X[0, 0], 2),
        ("compress_memories", "states")),
    Edge("compress_memories", "empty", lambda: compress_memories(_X[:, :0], 2), lambda t: t.shape == (1, 0, 8)),
    # SegmentMemory
    Bad("SegmentMemory", "negative", lambda: SegmentMemory(2, -1), ("SegmentMemory", "mem_len")),
    Bad("SegmentMemory", "non-integer", lambda: SegmentMemory(2, 4.5), ("SegmentMemory", "mem_len")),
    Bad("SegmentMemory", "zero", lambda: SegmentMemory(0, 4), ("SegmentMemory", "n_layers")),
    Bad("SegmentMemory", "boolean", lambda: SegmentMemory(2, 4, compression_rate=True),
        ("SegmentMemory", "compression_rate")),
    Bad("SegmentMemory.update", "out-of-range", lambda: SegmentMemory(2, 4).update(2, _X),
        ("SegmentMemory.update", "layer")),
    Bad("SegmentMemory.update", "wrong-shape", lambda: SegmentMemory(2, 4).update(0, _X[0]),
        ("SegmentMemory.update", "hidden")),
    Bad("SegmentMemory.update", "integer-dtype", lambda: SegmentMemory(2, 4).update(0, _X.long()),
        ("SegmentMemory.update", "hidden")),
    Bad("SegmentMemory.context", "out-of-range", lambda: SegmentMemory(2, 4).context(-3),
        ("SegmentMemory.context", "layer")),
    # RelativeSegmentAttention
    Bad("RelativeSegmentAttention", "out-of-range", lambda: RelativeSegmentAttention(8, 3),
        ("RelativeSegmentAttention", "n_heads")),
    Bad("RelativeSegmentAttention", "zero", lambda: RelativeSegmentAttention(8, 0),
        ("RelativeSegmentAttention", "n_heads")),
    Bad("RelativeSegmentAttention", "non-integer", lambda: RelativeSegmentAttention(8.0, 2),
        ("RelativeSegmentAttention", "d_model")),
    Bad("RelativeSegmentAttention.forward", "wrong-shape", lambda: _L(_X[..., :6]),
        ("RelativeSegmentAttention.forward", "x")),
    Bad("RelativeSegmentAttention.forward", "wrong-shape", lambda: _L(_X, torch.zeros(1, 2, 6)),
        ("RelativeSegmentAttention.forward", "memory")),
    Bad("RelativeSegmentAttention.forward", "integer-dtype", lambda: _L(_X.long()),
        ("RelativeSegmentAttention.forward", "x")),
    # run_segments
    Bad("run_segments", "zero", lambda: run_segments([_L], _X, 0), ("run_segments", "segment_len")),
    Bad("run_segments", "non-integer", lambda: run_segments([_L], _X, 2.5), ("run_segments", "segment_len")),
    Bad("run_segments", "wrong-shape", lambda: run_segments([_L], _X, 2, SegmentMemory(2, 4)),
        ("run_segments", "memory")),
    Bad("run_segments", "wrong-shape", lambda: run_segments([_L], _X[0], 2), ("run_segments", "x")),
    Edge("run_segments", "empty", lambda: run_segments([_L], _X[:, :0], 2), lambda t: t.shape == (1, 0, 8)),
    # PagedKVCache
    Bad("PagedKVCache", "zero", lambda: PagedKVCache(0, 2, 1, 4), ("PagedKVCache", "n_blocks")),
    Bad("PagedKVCache", "non-integer", lambda: PagedKVCache(4, 2.0, 1, 4), ("PagedKVCache", "block_size")),
    Bad("PagedKVCache", "negative", lambda: PagedKVCache(4, 2, 1, -4), ("PagedKVCache", "head_dim")),
    Bad("PagedKVCache", "wrong-dtype", lambda: PagedKVCache(4, 2, 1, 4, dtype=torch.bool),
        ("PagedKVCache", "dtype")),
    Bad("PagedKVCache.append", "out-of-range", lambda: _paged().append("b", _KN[0], _KN[0]),
        ("PagedKVCache.append", "seq_id")),
    Bad("PagedKVCache.append", "wrong-shape", lambda: _paged().append("a", _KN, _KN),
        ("PagedKVCache.append", "k")),
    Bad("PagedKVCache.append", "integer-dtype", lambda: _paged().append("a", _KN[0].long(), _KN[0].long()),
        ("PagedKVCache.append", "k")),
    Bad("PagedKVCache.allocate", "out-of-range", lambda: _paged().allocate("a"),
        ("PagedKVCache.allocate", "seq_id")),
    Bad("PagedKVCache.gather", "out-of-range", lambda: _paged().gather("zz"), ("PagedKVCache.gather", "seq_id")),
    Bad("PagedKVCache.free", "out-of-range", lambda: _paged().free("zz"), ("PagedKVCache.free", "seq_id")),
    # split_kv_attention
    Bad("split_kv_attention", "integer-dtype", lambda: split_kv_attention(_Q.long(), _KC.long(), _VC.long(), _LENS),
        ("split_kv_attention", "q")),
    Bad("split_kv_attention", "zero", lambda: _split(num_splits=0), ("split_kv_attention", "num_splits")),
    Bad("split_kv_attention", "negative", lambda: _split(num_splits=-2), ("split_kv_attention", "num_splits")),
    Bad("split_kv_attention", "non-integer", lambda: _split(num_splits=2.5), ("split_kv_attention", "num_splits")),
    Bad("split_kv_attention", "boolean", lambda: _split(num_splits=True), ("split_kv_attention", "num_splits")),
    Bad("split_kv_attention", "nan", lambda: _split(scale=float("nan")), ("split_kv_attention", "scale")),
    Bad("split_kv_attention", "wrong-type", lambda: _split(scale="0.5"), ("split_kv_attention", "scale")),
    Bad("split_kv_attention", "out-of-range", lambda: split_kv_attention(_Q, _KC, _VC, torch.tensor([3, 9])),
        ("split_kv_attention", "cache_seqlens")),
    Bad("split_kv_attention", "negative", lambda: split_kv_attention(_Q, _KC, _VC, torch.tensor([-1, 2])),
        ("split_kv_attention", "cache_seqlens")),
    Bad("split_kv_attention", "wrong-dtype", lambda: split_kv_attention(_Q, _KC, _VC, _LENS.float()),
        ("split_kv_attention", "cache_seqlens")),
    Bad("split_kv_attention", "wrong-shape", lambda: split_kv_attention(_Q, _KC, _VC, _LENS[:1]),
        ("split_kv_attention", "cache_seqlens")),
    Bad("split_kv_attention", "wrong-shape", lambda: split_kv_attention(_Q, _KC[:1], _VC[:1], _LENS),
        ("split_kv_attention", "k_cache")),
    Bad("split_kv_attention", "zero", lambda: split_kv_attention(_Q, _KC[:, :0], _VC[:, :0], _LENS),
        ("split_kv_attention", "k_cache", "kv_heads", "(2, 0, 8, 4)")),
    Edge("split_kv_attention", "zero", lambda: split_kv_attention(_Q[:, :0], _KC, _VC, _LENS),
         lambda t: t.shape == (2, 0, 1, 4)),
    Edge("split_kv_attention", "empty", lambda: split_kv_attention(_Q, _KC, _VC, torch.tensor([0, 0])),
         lambda t: t.shape == (2, 2, 1, 4) and not t.any()),
    Edge("split_kv_attention", "empty",
         lambda: split_kv_attention(_Q[:0], _KC[:0], _VC[:0], _LENS[:0]), lambda t: t.shape == (0, 2, 1, 4)),
]

EXEMPT = {
    "CacheFullError": "an exception class (a ValueError): raised, never called with user input",
    "MODEL_CONFIGS": "a constant dict of published model configurations",
}
