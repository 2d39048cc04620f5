"""Bad-input rows of attnbook.kernels.decode (see tests/test_bad_input.py): all refused
before any kernel launch."""

from __future__ import annotations

import torch
from test_bad_input import Bad

from attnbook.kernels.decode import decode_attention, default_num_splits, variants

_Q, _K = torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 8, 4)
_LENS = torch.tensor([3])


def _decode(**kw):
    return decode_attention(_Q, _K, _K, _LENS, **kw)


ROWS = [
    Bad("decode_attention", "integer-dtype", lambda: decode_attention(_Q.long(), _K.long(), _K.long(), _LENS),
        ("decode_attention", "q")),
    Bad("decode_attention", "zero", lambda: _decode(num_splits=0), ("decode_attention", "num_splits")),
    Bad("decode_attention", "non-integer", lambda: _decode(num_splits=2.0), ("decode_attention", "num_splits")),
    Bad("decode_attention", "out-of-range", lambda: _decode(num_splits=1000), ("decode_attention", "num_splits")),
    Bad("decode_attention", "nan", lambda: _decode(scale=float("nan")), ("decode_attention", "scale")),
    Bad("decode_attention", "out-of-range", lambda: decode_attention(_Q, _K, _K, torch.tensor([9])),
        ("decode_attention", "cache_seqlens")),
    Bad("decode_attention", "wrong-dtype", lambda: decode_attention(_Q, _K, _K, _LENS.float()),
        ("decode_attention", "cache_seqlens")),
    Bad("decode_attention", "zero", lambda: decode_attention(_Q, _K[:, :0], _K[:, :0], _LENS),
        ("decode_attention", "k_cache", "kv_heads", "(1, 0, 8, 4)")),
    Bad("default_num_splits", "non-integer", lambda: default_num_splits(2.5, 64),
        ("default_num_splits", "batch_heads")),
    Bad("default_num_splits", "negative", lambda: default_num_splits(2, -1), ("default_num_splits", "max_len")),
    Bad("default_num_splits", "zero", lambda: default_num_splits(2, 64, 0),
        ("default_num_splits", "target_programs")),
    Bad("variants", "wrong-dtype", lambda: variants(torch.int32, 64), ("variants", "dtype")),
    Bad("variants", "zero", lambda: variants(torch.float16, 0), ("variants", "head_dim")),
]

EXEMPT = {"MAX_HEAD_DIM": "a constant"}
