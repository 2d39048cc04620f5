"""Bad-input rows of attnbook.linear (see tests/properties/test_bad_input.py), from the BAD table of
tests/unit/test_linear.py."""

from __future__ import annotations

import math

import torch
from test_bad_input import Bad

from attnbook.linear import (
    LinformerAttention,
    MemoryCompressedAttention,
    compress_sequence,
    delta_rule_attention,
    elu_feature_map,
    linear_attention,
    linear_attention_recurrent,
    linear_attention_step,
    linear_attention_weights,
    linformer_attention,
    memory_compressed_attention,
    orthogonal_random_features,
    performer_attention,
    performer_features,
)

_G = torch.Generator().manual_seed(0)
_Q, _K, _V = (torch.randn(2, 5, 4, generator=_G, dtype=torch.float64) for _ in range(3))
_W3 = torch.randn(4, 4, 2, generator=_G, dtype=torch.float64)
_P = torch.randn(3, 5, generator=_G, dtype=torch.float64)
_WP = torch.randn(6, 4, generator=_G, dtype=torch.float64)
_S = (torch.zeros(2, 4, 4, dtype=torch.float64), torch.zeros(2, 4, dtype=torch.float64))


def _step(state=None, **kw):
    return linear_attention_step(_Q[:, 0], _K[:, 0], _V[:, 0], state, **kw)


ROWS = [
    Bad("compress_sequence", "zero", lambda: compress_sequence(_K, _W3[..., :0]), ("compress_sequence", "weight")),
    Bad("compress_sequence", "integer-dtype", lambda: compress_sequence(_K.long(), _W3), ("compress_sequence", "x")),
    Bad("compress_sequence", "wrong-shape", lambda: compress_sequence(_K, _W3, _K[0, 0, :3]),
        ("compress_sequence", "bias")),
    Bad("memory_compressed_attention", "integer-dtype", lambda: memory_compressed_attention(
        _Q, _K, _V, _W3, _W3.long()), ("memory_compressed_attention", "weight_v")),
    Bad("memory_compressed_attention", "nan", lambda: memory_compressed_attention(
        _Q, _K, _V, _W3, _W3, scale=float("nan")), ("memory_compressed_attention", "scale")),
    Bad("memory_compressed_attention", "wrong-type", lambda: memory_compressed_attention(
        _Q, _K, _V, _W3, _W3, is_causal=torch.ones(5, 5, dtype=torch.bool)),
        ("memory_compressed_attention", "is_causal")),
    Bad("MemoryCompressedAttention", "non-integer", lambda: MemoryCompressedAttention(8, 2, stride=2.5),
        ("MemoryCompressedAttention", "stride")),
    Bad("MemoryCompressedAttention", "zero", lambda: MemoryCompressedAttention(8, 0),
        ("MemoryCompressedAttention", "n_heads")),
    Bad("linformer_attention", "integer-dtype", lambda: linformer_attention(_Q, _K, _V, _P.long(), _P),
        ("linformer_attention", "E")),
    Bad("linformer_attention", "zero", lambda: linformer_attention(_Q, _K, _V, _P[:0], _P[:0]),
        ("linformer_attention", "E")),
    Bad("linformer_attention", "nan", lambda: linformer_attention(_Q, _K, _V, _P, _P, scale=math.inf),
        ("linformer_attention", "scale")),
    Bad("LinformerAttention", "non-integer", lambda: LinformerAttention(8, 2, 4, 2.0),
        ("LinformerAttention", "proj_len")),
    Bad("LinformerAttention", "negative", lambda: LinformerAttention(8, -1, 4, 2), ("LinformerAttention", "n_heads")),
    Bad("elu_feature_map", "integer-dtype", lambda: elu_feature_map(torch.ones(3, dtype=torch.long)),
        ("elu_feature_map", "x")),
    Bad("linear_attention_weights", "negative", lambda: linear_attention_weights(_Q, _K, eps=-1.0),
        ("linear_attention_weights", "eps")),
    Bad("linear_attention_weights", "wrong-shape", lambda: linear_attention_weights(_Q[0, 0], _K[0, 0]),
        ("linear_attention_weights", "q")),
    Bad("linear_attention", "nan", lambda: linear_attention(_Q, _K, _V, eps=float("nan")), ("linear_attention", "eps")),
    Bad("linear_attention", "wrong-type", lambda: linear_attention(_Q, _K, _V, is_causal="False"),
        ("linear_attention", "is_causal")),
    Bad("linear_attention_step", "integer-dtype", lambda: linear_attention_step(_Q[:, 0].long(), _K[:, 0], _V[:, 0]),
        ("linear_attention_step", "q")),
    Bad("linear_attention_step", "wrong-shape", lambda: _step((_S[0][..., :3], _S[1])),
        ("linear_attention_step", "state")),
    Bad("linear_attention_step", "wrong-dtype", lambda: _step((_S[0].float(), _S[1].float())),
        ("linear_attention_step", "state")),
    Bad("linear_attention_step", "wrong-shape", lambda: linear_attention_step(_Q[:1, 0], _K[:1, 0], _V[:1, 0], _S),
        ("linear_attention_step", "state", "(2, 4, 4)", "(1,)")),
    Bad("linear_attention_step", "negative", lambda: _step(eps=-1e-6), ("linear_attention_step", "eps")),
    Bad("linear_attention_recurrent", "wrong-shape", lambda: linear_attention_recurrent(
        _Q, _K, _V, (_S[0][..., :3], _S[1])), ("linear_attention_recurrent", "state")),
    Bad("linear_attention_recurrent", "wrong-shape", lambda: linear_attention_recurrent(_Q[:1], _K[:1], _V[:1], _S),
        ("linear_attention_recurrent", "state", "(2, 4, 4)", "(1,)")),
    Bad("linear_attention_recurrent", "empty", lambda: linear_attention_recurrent(
        _Q[:, :0], _K[:, :0], _V[:, :0]), ("linear_attention_recurrent", "q")),
    Bad("delta_rule_attention", "nan", lambda: delta_rule_attention(_Q, _K, _V, float("nan")),
        ("delta_rule_attention", "beta")),
    Bad("delta_rule_attention", "boolean", lambda: delta_rule_attention(_Q, _K, _V, True),
        ("delta_rule_attention", "beta")),
    Bad("delta_rule_attention", "wrong-shape", lambda: delta_rule_attention(
        _Q, _K, _V, 1.0, state=torch.zeros(2, 3, 4, dtype=torch.float64)), ("delta_rule_attention", "state")),
    Bad("delta_rule_attention", "wrong-shape", lambda: delta_rule_attention(_Q[:1], _K[:1], _V[:1], 1.0, state=_S[0]),
        ("delta_rule_attention", "state", "(2, 4, 4)", "(1,)")),
    Bad("orthogonal_random_features", "non-integer", lambda: orthogonal_random_features(2.5, 4),
        ("orthogonal_random_features", "n_features")),
    Bad("orthogonal_random_features", "boolean", lambda: orthogonal_random_features(True, 4),
        ("orthogonal_random_features", "n_features")),
    Bad("orthogonal_random_features", "zero", lambda: orthogonal_random_features(4, 0),
        ("orthogonal_random_features", "dim")),
    Bad("orthogonal_random_features", "wrong-dtype", lambda: orthogonal_random_features(4, 4, dtype=torch.int64),
        ("orthogonal_random_features", "dtype")),
    Bad("performer_features", "zero", lambda: performer_features(_Q, _WP[:0]), ("performer_features", "projection")),
    Bad("performer_features", "nan", lambda: performer_features(_Q, _WP * math.nan),
        ("performer_features", "projection")),
    Bad("performer_features", "integer-dtype", lambda: performer_features(_Q, _WP.long()),
        ("performer_features", "projection")),
    Bad("performer_attention", "non-integer", lambda: performer_attention(_Q, _K, _V, n_features=2.5),
        ("performer_attention", "n_features")),
    Bad("performer_attention", "zero", lambda: performer_attention(_Q, _K, _V, n_features=0),
        ("performer_attention", "n_features")),
    Bad("performer_attention", "nan", lambda: performer_attention(_Q, _K, _V, projection=_WP * math.nan),
        ("performer_attention", "projection")),
    Bad("performer_attention", "wrong-type", lambda: performer_attention(_Q, _K, _V, generator=0),
        ("performer_attention", "generator")),
]

EXEMPT: dict[str, str] = {}
