"""Bad-input rows of attnbook.contract (see tests/properties/test_bad_input.py).

The checks raise in the name of the function that calls them (their ``fn`` argument,
``"attend"`` here); the rows check that name and the argument are in the message."""

from __future__ import annotations

import torch
from test_bad_input import Bad, Edge

from attnbook.contract import (
    attention_mask,
    check_attention_options,
    check_attn_mask,
    check_block_layout,
    check_block_mask,
    check_cache_update,
    check_decode,
    check_dropout,
    check_flag,
    check_float,
    check_indices,
    check_int,
    check_key_padding_mask,
    check_qkv,
    check_real,
    check_sizes,
    default_scale,
    expand_kv_heads,
    grouped_kv,
)

_NAN = float("nan")
_Q = torch.randn(2, 4, 5, 8)
_KV = torch.randn(2, 2, 5, 8)
_K3 = torch.randn(2, 3, 5, 8)
_CACHE = torch.zeros(2, 2, 16, 8)
_LENS = torch.tensor([3, 4])
_F = "attend"

ROWS = [
    Bad("check_int", "non-integer", lambda: check_int(_F, "n", 2.5), (_F, "n")),
    Bad("check_int", "boolean", lambda: check_int(_F, "n", True), (_F, "n")),
    Bad("check_int", "zero", lambda: check_int(_F, "n", 0), (_F, "n")),
    Bad("check_sizes", "negative", lambda: check_sizes(_F, heads=-1), (_F, "heads")),
    Bad("check_sizes", "non-integer", lambda: check_sizes(_F, heads=2.5), (_F, "heads")),
    Bad("check_real", "nan", lambda: check_real(_F, "eps", _NAN), (_F, "eps")),
    Bad("check_real", "boolean", lambda: check_real(_F, "eps", True), (_F, "eps")),
    Bad("check_real", "zero", lambda: check_real(_F, "eps", 0.0, above=0), (_F, "eps")),
    Bad("check_flag", "wrong-type", lambda: check_flag(_F, "is_causal", "False"), (_F, "is_causal")),
    Bad("check_flag", "wrong-type", lambda: check_flag(_F, "is_causal", torch.ones(2, dtype=torch.bool)),
        (_F, "is_causal")),
    Bad("check_attention_options", "out-of-range", lambda: check_attention_options(_F, _Q, (-2, 0), None, 0.0),
        (_F, "window_size")),
    Bad("check_attention_options", "nan", lambda: check_attention_options(_F, _Q, (-1, -1), None, _NAN),
        (_F, "softcap")),
    Bad("check_attention_options", "wrong-shape", lambda: check_attention_options(
        _F, _Q, (-1, -1), torch.ones(3), 0.0), (_F, "alibi_slopes")),
    Bad("check_float", "integer-dtype", lambda: check_float(_F, "x", torch.ones(3, dtype=torch.long)), (_F, "x")),
    Bad("check_float", "wrong-type", lambda: check_float(_F, "x", [1.0]), (_F, "x")),
    Bad("check_indices", "non-integer", lambda: check_indices(_F, "idx", [1.5]), (_F, "idx")),
    Bad("check_indices", "boolean", lambda: check_indices(_F, "idx", torch.tensor([True, False])), (_F, "idx")),
    Bad("check_indices", "out-of-range", lambda: check_indices(_F, "idx", [0, 4], size=4), (_F, "idx")),
    Bad("check_indices", "negative", lambda: check_indices(_F, "idx", [-1]), (_F, "idx")),
    Bad("check_indices", "wrong-shape", lambda: check_indices(_F, "idx", torch.zeros(2, 2, dtype=torch.long)),
        (_F, "idx")),
    Bad("check_indices", "wrong-type", lambda: check_indices(_F, "idx", 3), (_F, "idx")),
    Edge("check_indices", "empty", lambda: check_indices(_F, "idx", [], size=4),
         lambda t: t.dtype == torch.long and t.shape == (0,)),
    Bad("check_qkv", "integer-dtype", lambda: check_qkv(_F, _Q.long(), _KV, _KV), (_F, "q")),
    Bad("check_qkv", "wrong-shape", lambda: check_qkv(_F, _Q, _K3, _K3), (_F, "heads")),
    Bad("check_qkv", "wrong-dtype", lambda: check_qkv(_F, _Q.double(), _KV, _KV), (_F, "dtype")),
    Bad("check_attn_mask", "wrong-shape", lambda: check_attn_mask(_F, torch.ones(4, 5, dtype=torch.bool), (2, 4, 5, 6)),
        (_F, "attn_mask")),
    Bad("check_attn_mask", "wrong-dtype", lambda: check_attn_mask(_F, torch.ones(5, 6, dtype=torch.long), (5, 6)),
        (_F, "attn_mask")),
    Bad("check_block_mask", "wrong-shape", lambda: check_block_mask(_F, torch.ones(2, 2, dtype=torch.bool), 9, 8, 4),
        (_F, "block_mask", "(3, 2)", "L=9")),
    Bad("check_block_mask", "wrong-dtype", lambda: check_block_mask(_F, torch.ones(3, 2), 9, 8, 4),
        (_F, "block_mask", "torch.float32")),
    Bad("check_block_mask", "wrong-type", lambda: check_block_mask(_F, [[True]], 4, 4, 4), (_F, "block_mask", "list")),
    Bad("check_block_layout", "wrong-dtype", lambda: check_block_layout(_F, torch.ones(2, 2)), (_F, "block_mask", "bool")),
    Bad("check_block_layout", "wrong-shape", lambda: check_block_layout(_F, torch.ones(2, dtype=torch.bool)),
        (_F, "block_mask", "2-D")),
    Bad("check_block_layout", "wrong-type", lambda: check_block_layout(_F, [[True]]), (_F, "block_mask")),
    Bad("check_key_padding_mask", "wrong-dtype", lambda: check_key_padding_mask(_F, torch.ones(2, 5), 2, 5),
        (_F, "key_padding_mask")),
    Bad("check_key_padding_mask", "wrong-shape", lambda: check_key_padding_mask(
        _F, torch.ones(2, 4, dtype=torch.bool), 2, 5), (_F, "key_padding_mask")),
    Bad("check_dropout", "nan", lambda: check_dropout(_F, _NAN), (_F, "dropout_p")),
    Bad("check_dropout", "out-of-range", lambda: check_dropout(_F, 1.0), (_F, "dropout_p")),
    Bad("check_decode", "wrong-shape", lambda: check_decode(_F, _Q, _CACHE, _CACHE, _LENS), (_F, "q")),
    Bad("check_decode", "out-of-range", lambda: check_decode(_F, _Q[:, :, :1], _CACHE, _CACHE, torch.tensor([3, 17])),
        (_F, "cache_seqlens")),
    Bad("check_decode", "wrong-dtype", lambda: check_decode(_F, _Q[:, :, :1], _CACHE, _CACHE, _LENS.float()),
        (_F, "cache_seqlens")),
    Bad("check_decode", "zero", lambda: check_decode(_F, _Q[:, :, :1], _CACHE[:, :0], _CACHE[:, :0], _LENS),
        (_F, "k_cache", "kv_heads", "(2, 0, 16, 8)")),
    Edge("check_decode", "zero", lambda: check_decode(_F, _Q[:, :0, :1], _CACHE, _CACHE, _LENS), lambda r: r is None),
    Bad("check_cache_update", "wrong-shape", lambda: check_cache_update(_F, _KV, _KV[..., :4], (2, 2), 8),
        (_F, "k and v")),
    Bad("check_cache_update", "out-of-range", lambda: check_cache_update(_F, _KV, _KV, (2, 2), 8, layer=3, n_layers=2),
        (_F, "layer")),
    Bad("attention_mask", "wrong-shape", lambda: attention_mask(_F, _Q, _Q, torch.ones(3, 5, dtype=torch.bool)),
        (_F, "attn_mask")),
    Bad("attention_mask", "wrong-dtype", lambda: attention_mask(_F, _Q, _Q, key_padding_mask=torch.ones(2, 5)),
        (_F, "key_padding_mask")),
    Edge("attention_mask", "wrong-dtype", lambda: attention_mask(_F, _Q, _Q, torch.zeros(5, 5, dtype=torch.float64)),
         lambda m: m.dtype == _Q.dtype),
    Bad("expand_kv_heads", "out-of-range", lambda: expand_kv_heads(_K3, 4), ("expand_kv_heads", "n_heads")),
    Bad("expand_kv_heads", "zero", lambda: expand_kv_heads(_KV[:, :0], 4),
        ("expand_kv_heads", "key/value heads", "(2, 0, 5, 8)")),
    Bad("expand_kv_heads", "negative", lambda: expand_kv_heads(_KV, -2), ("expand_kv_heads", "n_heads")),
    Bad("expand_kv_heads", "non-integer", lambda: expand_kv_heads(_KV, 4.0), ("expand_kv_heads", "n_heads")),
    Bad("check_block_mask", "zero", lambda: check_block_mask(_F, torch.ones(1, 1, dtype=torch.bool), 4, 4, 0),
        (_F, "block_size")),
    Bad("grouped_kv", "wrong-shape", lambda: grouped_kv(_Q, _K3, _K3), ("expand_kv_heads", "n_heads")),
    Bad("default_scale", "nan", lambda: default_scale(_NAN, 8), ("default_scale", "scale")),
    Bad("default_scale", "boolean", lambda: default_scale(True, 8), ("default_scale", "scale")),
    Bad("default_scale", "zero", lambda: default_scale(None, 0), ("default_scale", "head_dim", "scale=")),
    Edge("default_scale", "zero", lambda: default_scale(0.5, 0), lambda s: s == 0.5),
]
EXEMPT: dict[str, str] = {}
