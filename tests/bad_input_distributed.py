"""Bad-input rows for attnbook.distributed (see tests/test_bad_input.py).

No row spawns a process: the functions that need a process group are called without
one and raise their documented ``RuntimeError`` ("needs an initialized process
group"), and ``run_on_ranks`` is only given arguments it refuses before spawning."""

import torch
from test_bad_input import Bad, Edge

from attnbook import distributed as D

NAN = float("nan")
_X = torch.randn(1, 2, 8, 4)
_LLAMA = dict(n_params=8_030_261_248, n_layers=32, d_model=4096, d_ff=14336, n_heads=32, n_kv_heads=8,
              head_dim=128)  # fmt: skip
_NO_GROUP = "needs an initialized process group"


def _rank_fn(rank, world_size):
    return rank


ROWS = [
    # layouts
    Bad("shard_positions", "out-of-range", lambda: D.shard_positions(4, 4, 8), ("shard_positions", "rank")),
    Bad("shard_positions", "negative", lambda: D.shard_positions(-1, 4, 8), ("shard_positions", "rank")),
    Bad("shard_positions", "non-integer", lambda: D.shard_positions(1.5, 4, 8), ("shard_positions", "rank")),
    Bad("shard_positions", "zero", lambda: D.shard_positions(0, 0, 8), ("shard_positions", "world")),
    Bad("shard_positions", "boolean", lambda: D.shard_positions(0, True, 8), ("shard_positions", "world")),
    Bad("shard_positions", "non-integer", lambda: D.shard_positions(0, 2, 8.0), ("shard_positions", "seq_len")),
    Bad("shard_positions", "negative", lambda: D.shard_positions(0, 2, -4), ("shard_positions", "seq_len")),
    Bad("shard_positions", "wrong-shape", lambda: D.shard_positions(0, 2, 6, layout="zigzag"),
        ("shard_positions", "seq_len=6")),
    Bad("shard_positions", "wrong-type", lambda: D.shard_positions(0, 2, 8, layout="striped"),
        ("shard_positions", "layout")),
    Edge("shard_positions", "empty", lambda: D.shard_positions(1, 2, 0), lambda p: p.shape == (0,)),
    Bad("shard", "out-of-range", lambda: D.shard(_X, 2, 2), ("shard_positions", "rank")),
    Bad("shard", "out-of-range", lambda: D.shard(_X, 0, 2, dim=4), ("shard", "dim")),
    Bad("shard", "non-integer", lambda: D.shard(_X, 0, 2, dim=1.5), ("shard", "dim")),
    Bad("shard", "wrong-type", lambda: D.shard([1, 2], 0, 2), ("shard", "x")),
    Bad("unshard", "empty", lambda: D.unshard([]), ("unshard", "shards")),
    Bad("unshard", "wrong-shape", lambda: D.unshard([_X, _X[..., :4, :]]), ("unshard", "shards", "equal-length")),
    Bad("unshard", "out-of-range", lambda: D.unshard([_X, _X], dim=4), ("unshard", "dim")),
    Bad("unshard", "wrong-type", lambda: D.unshard([_X, "x"]), ("unshard", "shards[1]")),
    Bad("unshard", "wrong-shape", lambda: D.unshard([_X, _X[:, :1]]), ("unshard", "shards", "one shape")),
    Bad("unshard", "wrong-shape", lambda: D.unshard([_X, _X[0]]), ("unshard", "shards", "one shape")),
    Bad("unshard", "wrong-dtype", lambda: D.unshard([_X, _X.double()]), ("unshard", "shards", "dtype")),
    Bad("unshard", "wrong-type", lambda: D.unshard([_X, _X.to("meta")]), ("unshard", "shards", "device")),
    # the attention functions: a clear RuntimeError without a process group
    Bad("ring_attention", "wrong-type", lambda: D.ring_attention(_X, _X, _X, layout="striped"),
        ("ring_attention", "layout")),
    Bad("ring_attention", "wrong-type", lambda: D.ring_attention(_X, _X, _X, is_causal="yes"),
        ("ring_attention", "is_causal")),
    Bad("ring_attention", "nan", lambda: D.ring_attention(_X, _X, _X, scale=NAN), ("ring_attention", "scale")),
    Bad("ring_attention", "wrong-type", lambda: D.ring_attention(_X, _X, _X), ("ring_attention", _NO_GROUP),
        error=RuntimeError),
    Bad("ulysses_attention", "wrong-type", lambda: D.ulysses_attention(_X, _X, _X, return_stats=2),
        ("ulysses_attention", "return_stats")),
    Bad("ulysses_attention", "wrong-type", lambda: D.ulysses_attention(_X, _X, _X), ("ulysses_attention", _NO_GROUP),
        error=RuntimeError),
    # a rank's own mistakes are named before the missing group (tests/test_distributed_bad_input.py
    # makes every rank of a group raise them, and the differences between ranks)
    Bad("ring_attention", "wrong-shape", lambda: D.ring_attention(_X[:, :1], _X, _X), ("ring_attention", "heads")),
    Bad("ulysses_attention", "wrong-shape", lambda: D.ulysses_attention(_X[:, :1], _X, _X),
        ("ulysses_attention", "heads")),
    Bad("ring_attention", "zero", lambda: D.ring_attention(_X[..., :0], _X[..., :0], _X, scale=1.0),
        ("ring_attention", "head_dim")),
    Bad("ulysses_attention", "zero", lambda: D.ulysses_attention(_X[..., :0], _X[..., :0], _X),
        ("ulysses_attention", "head_dim")),
    Bad("ring_attention", "wrong-dtype", lambda: D.ring_attention(*[_X.to(torch.float8_e4m3fn)] * 3),
        ("ring_attention", "float16, bfloat16, float32 or float64")),
    Bad("ulysses_attention", "integer-dtype", lambda: D.ulysses_attention(*[_X.long()] * 3), ("ulysses_attention", "q")),
    Bad("ring_attention", "wrong-shape", lambda: D.ring_attention(_X[0, 0], _X[0, 0], _X[0, 0]),
        ("ring_attention", "(..., heads, seq, head_dim)")),
    # communication and work in closed form
    Bad("ring_bytes_per_rank", "zero", lambda: D.ring_bytes_per_rank(1, 8, 1024, 64, 0, 2),
        ("ring_bytes_per_rank", "world")),
    Bad("ring_bytes_per_rank", "non-integer", lambda: D.ring_bytes_per_rank(1, 8, 1024, 64, 2.5, 2),
        ("ring_bytes_per_rank", "world")),
    Bad("ring_bytes_per_rank", "negative", lambda: D.ring_bytes_per_rank(-1, 8, 1024, 64, 4, 2),
        ("ring_bytes_per_rank", "batch")),
    Bad("ring_bytes_per_rank", "zero", lambda: D.ring_bytes_per_rank(1, 8, 1024, 64, 4, 2, kv_heads=0),
        ("ring_bytes_per_rank", "kv_heads")),
    Bad("ring_bytes_per_rank", "boolean", lambda: D.ring_bytes_per_rank(1, 8, 1024, 64, 4, True),
        ("ring_bytes_per_rank", "bytes_per_elem")),
    Bad("ring_bytes_per_rank", "out-of-range", lambda: D.ring_bytes_per_rank(1, 8, 1000, 64, 3, 2),
        ("ring_bytes_per_rank", "seq_len=1000")),
    Bad("ring_bytes_per_rank", "out-of-range", lambda: D.ring_bytes_per_rank(1, 8, 1024, 64, 4, 2, kv_heads=3),
        ("ring_bytes_per_rank", "kv_heads=3", "heads=8")),
    Bad("ring_bytes_per_rank", "out-of-range", lambda: D.ring_bytes_per_rank(1, 2, 1024, 64, 4, 2, kv_heads=4),
        ("ring_bytes_per_rank", "kv_heads=4", "heads=2")),
    Bad("ulysses_bytes_per_rank", "out-of-range", lambda: D.ulysses_bytes_per_rank(1, 8, 1024, 64, 2, 2, kv_heads=6),
        ("ulysses_bytes_per_rank", "kv_heads=6", "heads=8")),
    Bad("ulysses_bytes_per_rank", "zero", lambda: D.ulysses_bytes_per_rank(1, 8, 0, 64, 4, 2),
        ("ulysses_bytes_per_rank", "seq_len")),
    Bad("ulysses_bytes_per_rank", "non-integer", lambda: D.ulysses_bytes_per_rank(1, 8, 1024, 64.0, 4, 2),
        ("ulysses_bytes_per_rank", "head_dim")),
    Bad("ulysses_bytes_per_rank", "negative", lambda: D.ulysses_bytes_per_rank(1, 8, 1024, 64, 4, 2, value_dim=-2),
        ("ulysses_bytes_per_rank", "value_dim")),
    Bad("pairs_per_rank", "zero", lambda: D.pairs_per_rank(8, 0), ("pairs_per_rank", "world")),
    Bad("pairs_per_rank", "non-integer", lambda: D.pairs_per_rank(8, 2.5), ("pairs_per_rank", "world")),
    Bad("pairs_per_rank", "negative", lambda: D.pairs_per_rank(-8, 2), ("pairs_per_rank", "seq_len")),
    Bad("pairs_per_rank", "wrong-type", lambda: D.pairs_per_rank(8, 2, layout="striped"), ("pairs_per_rank", "layout")),
    Bad("pairs_per_rank", "wrong-type", lambda: D.pairs_per_rank(8, 2, is_causal="no"), ("pairs_per_rank", "is_causal")),
    Edge("pairs_per_rank", "empty", lambda: D.pairs_per_rank(0, 2), lambda work: work == [0, 0]),
    # running on local ranks
    Bad("attention_on_rank", "wrong-type", lambda: D.attention_on_rank(0, 1, _X, _X, _X, method="tree"),
        ("attention_on_rank", "method")),
    Bad("attention_on_rank", "out-of-range", lambda: D.attention_on_rank(2, 2, _X, _X, _X),
        ("attention_on_rank", "rank")),
    Bad("attention_on_rank", "zero", lambda: D.attention_on_rank(0, 0, _X, _X, _X), ("attention_on_rank", "world_size")),
    Bad("attention_on_rank", "wrong-type", lambda: D.attention_on_rank(0, 1, _X, _X, _X), ("attention_on_rank", _NO_GROUP),
        error=RuntimeError),
    Bad("attention_on_rank", "integer-dtype", lambda: D.attention_on_rank(0, 1, *[_X.long()] * 4),
        ("attention_on_rank", "q")),
    Bad("attention_on_rank", "wrong-shape", lambda: D.attention_on_rank(0, 1, _X, _X, _X, _X[..., :4, :]),
        ("attention_on_rank", "grad_out")),
    Bad("attention_on_rank", "wrong-shape", lambda: D.attention_on_rank(0, 3, _X, _X, _X),
        ("attention_on_rank", "seq_len=8")),
    Bad("attention_on_rank", "out-of-range", lambda: D.attention_on_rank(0, 2, _X, _X, _X, method="ulysses",
        layout="zigzag"), ("attention_on_rank", "layout")),
    Bad("time_on_rank", "wrong-type", lambda: D.time_on_rank(0, 1, _X, _X, _X, method="tree"), ("time_on_rank", "method")),
    Bad("time_on_rank", "out-of-range", lambda: D.time_on_rank(0, 2, _X, _X, _X, method="ulysses", layout="zigzag"),
        ("time_on_rank", "layout")),
    Bad("time_on_rank", "wrong-type", lambda: D.time_on_rank(0, 1, "q", _X, _X), ("time_on_rank", "q")),
    Bad("time_on_rank", "wrong-type", lambda: D.time_on_rank(0, 1, _X, _X, _X), ("time_on_rank", _NO_GROUP),
        error=RuntimeError),
    Bad("time_on_rank", "zero", lambda: D.time_on_rank(0, 1, _X, _X, _X, repeat=0), ("time_on_rank", "repeat")),
    Bad("time_on_rank", "non-integer", lambda: D.time_on_rank(0.5, 1, _X, _X, _X), ("time_on_rank", "rank")),
    Bad("in_turn", "wrong-type", lambda: D.in_turn(0, 1, _rank_fn, "f"), ("in_turn", "fns")),
    Bad("in_turn", "zero", lambda: D.in_turn(0, 0, _rank_fn), ("in_turn", "world_size")),
    Bad("in_turn", "out-of-range", lambda: D.in_turn(2, 2, _rank_fn), ("in_turn", "rank")),
    Edge("in_turn", "empty", lambda: D.in_turn(0, 1), lambda out: out == []),
    Bad("run_on_ranks", "zero", lambda: D.run_on_ranks(_rank_fn, 0), ("run_on_ranks", "world_size")),
    Bad("run_on_ranks", "non-integer", lambda: D.run_on_ranks(_rank_fn, 1.5), ("run_on_ranks", "world_size")),
    Bad("run_on_ranks", "boolean", lambda: D.run_on_ranks(_rank_fn, True), ("run_on_ranks", "world_size")),
    Bad("run_on_ranks", "nan", lambda: D.run_on_ranks(_rank_fn, 1, timeout=NAN), ("run_on_ranks", "timeout")),
    Bad("run_on_ranks", "wrong-type", lambda: D.run_on_ranks("fn", 1), ("run_on_ranks", "fn")),
    Bad("run_on_ranks", "wrong-type", lambda: D.run_on_ranks(_rank_fn, 1, backend="tcp"), ("run_on_ranks", "backend")),
    # memory per GPU
    Bad("context_memory_bytes", "zero", lambda: D.context_memory_bytes(8192, 0, **_LLAMA),
        ("context_memory_bytes", "world")),
    Bad("context_memory_bytes", "non-integer", lambda: D.context_memory_bytes(8192.0, 4, **_LLAMA),
        ("context_memory_bytes", "seq_len")),
    Bad("context_memory_bytes", "negative", lambda: D.context_memory_bytes(8192, 4, **{**_LLAMA, "n_layers": -1}),
        ("context_memory_bytes", "n_layers")),
    Bad("context_memory_bytes", "zero", lambda: D.context_memory_bytes(8192, 4, **{**_LLAMA, "head_dim": 0}),
        ("context_memory_bytes", "head_dim")),
    Bad("context_memory_bytes", "wrong-type", lambda: D.context_memory_bytes(8192, 4, method="tree", **_LLAMA),
        ("context_memory_bytes", "method")),
    Bad("context_memory_bytes", "out-of-range",
        lambda: D.context_memory_bytes(16 * 1024, 16, method="ulysses", **_LLAMA), ("context_memory_bytes", "n_kv_heads")),
    Bad("context_memory_bytes", "out-of-range",
        lambda: D.context_memory_bytes(8192, 4, **{**_LLAMA, "n_kv_heads": 6}), ("context_memory_bytes", "n_kv_heads=6")),
    Bad("largest_context", "zero", lambda: D.largest_context(80 * 10**9, 0, **_LLAMA), ("largest_context", "world")),
    Bad("largest_context", "zero", lambda: D.largest_context(80 * 10**9, 4, multiple=0, **_LLAMA),
        ("largest_context", "multiple")),
    Bad("largest_context", "negative", lambda: D.largest_context(-1, 4, **_LLAMA), ("largest_context", "gpu_bytes")),
    Bad("largest_context", "non-integer", lambda: D.largest_context(80 * 10**9, 2.5, **_LLAMA),
        ("largest_context", "world")),
    Edge("largest_context", "zero", lambda: D.largest_context(0, 4, **_LLAMA), lambda n: n == 0),
]  # fmt: skip

EXEMPT = {
    "CommStats": "a dataclass of counts that the attention functions return",
}
