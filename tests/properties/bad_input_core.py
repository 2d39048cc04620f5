"""Bad-input rows of attnbook.core (see tests/properties/test_bad_input.py)."""

from __future__ import annotations

import math

import torch
from test_bad_input import Bad, Edge

from attnbook.core import (
    MultiHeadAttention,
    additive_score,
    attention_entropy,
    causal_mask,
    dot_score,
    general_score,
    hard_attention,
    hard_attention_weights,
    masked_softmax,
    padding_mask,
    scaled_dot_product_attention,
    scaled_dot_score,
)

_G = torch.Generator().manual_seed(0)
_Q, _K, _V = (torch.randn(2, 5, 4, generator=_G) for _ in range(3))
_S = torch.randn(2, 5, 5, generator=_G)
_M64 = torch.zeros(5, 5, dtype=torch.float64).masked_fill(~causal_mask(5), -math.inf)
_NAN = float("nan")


def _same_as_float32_mask(out) -> bool:
    want = scaled_dot_product_attention(_Q, _K, _V, _M64.float())
    return out.dtype == torch.float32 and torch.allclose(out, want)


def _hard_float64_mask(out) -> bool:
    want = hard_attention(_Q, _K, _V, causal_mask(5))
    return out.dtype == torch.float32 and torch.equal(out, want)


ROWS = [
    Bad("causal_mask", "non-integer", lambda: causal_mask(2.5), ("causal_mask", "L")),
    Bad("causal_mask", "boolean", lambda: causal_mask(3, True), ("causal_mask", "S")),
    Bad("causal_mask", "negative", lambda: causal_mask(-1), ("causal_mask", "L")),
    Edge("causal_mask", "zero", lambda: causal_mask(0), lambda m: m.shape == (0, 0)),
    Bad("padding_mask", "non-integer", lambda: padding_mask([2.5, 3]), ("padding_mask", "lengths")),
    Bad("padding_mask", "boolean", lambda: padding_mask(torch.tensor([True, False])),
        ("padding_mask", "lengths")),
    Bad("padding_mask", "negative", lambda: padding_mask([2, -1]), ("padding_mask", "lengths")),
    Bad("padding_mask", "wrong-shape", lambda: padding_mask([[1, 2]]), ("padding_mask", "lengths")),
    Bad("padding_mask", "non-integer", lambda: padding_mask([1, 2], max_len=3.5), ("padding_mask", "max_len")),
    Bad("padding_mask", "out-of-range", lambda: padding_mask([2, 5], max_len=4), ("padding_mask", "max_len")),
    Edge("padding_mask", "empty", lambda: padding_mask([]), lambda m: m.shape == (0, 0)),
    Bad("dot_score", "integer-dtype", lambda: dot_score(_Q.long(), _K.long()), ("dot_score", "q")),
    Bad("dot_score", "wrong-shape", lambda: dot_score(_Q, _K[..., :3]), ("dot_score", "q and k")),
    Bad("scaled_dot_score", "nan", lambda: scaled_dot_score(_Q, _K, _NAN), ("scaled_dot_score", "scale")),
    Bad("scaled_dot_score", "integer-dtype", lambda: scaled_dot_score(_Q.int(), _K), ("scaled_dot_score", "q")),
    Bad("general_score", "integer-dtype", lambda: general_score(_Q, _K, torch.eye(4, dtype=torch.long)),
        ("general_score", "W")),
    Bad("general_score", "wrong-shape", lambda: general_score(_Q, _K, torch.eye(3)), ("general_score", "W")),
    Bad("additive_score", "wrong-shape", lambda: additive_score(_Q, _K, torch.ones(6, 4), torch.ones(6, 4),
                                                                torch.ones(5)), ("additive_score", "v")),
    Bad("additive_score", "integer-dtype", lambda: additive_score(
        _Q, _K, torch.ones(6, 4, dtype=torch.long), torch.ones(6, 4), torch.ones(6)), ("additive_score", "W_q")),
    Bad("masked_softmax", "nan", lambda: masked_softmax(_S, temperature=_NAN), ("masked_softmax", "temperature")),
    Bad("masked_softmax", "zero", lambda: masked_softmax(_S, temperature=0.0), ("masked_softmax", "temperature")),
    Bad("masked_softmax", "integer-dtype", lambda: masked_softmax(_S.long()), ("masked_softmax", "scores")),
    Bad("masked_softmax", "wrong-shape", lambda: masked_softmax(_S, torch.ones(3, 5, dtype=torch.bool)),
        ("masked_softmax", "attn_mask")),
    Bad("masked_softmax", "wrong-dtype", lambda: masked_softmax(_S, torch.ones(5, 5, dtype=torch.long)),
        ("masked_softmax", "attn_mask")),
    Edge("masked_softmax", "wrong-dtype", lambda: masked_softmax(_S, _M64),
         lambda w: w.dtype == torch.float32 and torch.allclose(w, masked_softmax(_S, causal_mask(5)))),
    Bad("attention_entropy", "integer-dtype", lambda: attention_entropy(torch.ones(3, 3, dtype=torch.long)),
        ("attention_entropy", "weights")),
    Bad("attention_entropy", "wrong-type", lambda: attention_entropy(_S.softmax(-1), normalize="yes"),
        ("attention_entropy", "normalize")),
    Bad("attention_entropy", "wrong-shape", lambda: attention_entropy(_S.softmax(-1), torch.ones(3, dtype=torch.bool)),
        ("attention_entropy", "attn_mask")),
    Bad("scaled_dot_product_attention", "zero", lambda: scaled_dot_product_attention(
        torch.randn(1, 2, 3, 0), torch.randn(1, 2, 3, 0), torch.randn(1, 2, 3, 4)),
        ("scaled_dot_product_attention", "scale", "head dim 0")),
    Bad("scaled_dot_score", "zero", lambda: scaled_dot_score(torch.randn(2, 0), torch.randn(3, 0)),
        ("scaled_dot_score", "scale")),
    Bad("scaled_dot_product_attention", "integer-dtype", lambda: scaled_dot_product_attention(
        _Q.long(), _K.long(), _V.long()), ("scaled_dot_product_attention", "q")),
    Bad("scaled_dot_product_attention", "nan", lambda: scaled_dot_product_attention(_Q, _K, _V, scale=_NAN),
        ("scaled_dot_product_attention", "scale")),
    Bad("scaled_dot_product_attention", "nan", lambda: scaled_dot_product_attention(_Q, _K, _V, dropout_p=_NAN),
        ("scaled_dot_product_attention", "dropout_p")),
    Bad("scaled_dot_product_attention", "wrong-type", lambda: scaled_dot_product_attention(
        _Q, _K, _V, is_causal=causal_mask(5)), ("scaled_dot_product_attention", "is_causal")),
    Bad("scaled_dot_product_attention", "wrong-shape", lambda: scaled_dot_product_attention(
        _Q, _K, _V, torch.ones(4, 5, dtype=torch.bool)), ("scaled_dot_product_attention", "attn_mask")),
    Bad("scaled_dot_product_attention", "wrong-dtype", lambda: scaled_dot_product_attention(
        _Q, _K, _V, torch.ones(5, 5, dtype=torch.long)), ("scaled_dot_product_attention", "attn_mask")),
    Edge("scaled_dot_product_attention", "wrong-dtype", lambda: scaled_dot_product_attention(_Q, _K, _V, _M64),
         _same_as_float32_mask),
    Edge("scaled_dot_product_attention", "empty", lambda: scaled_dot_product_attention(_Q[:, :0], _K, _V),
         lambda out: out.shape == (2, 0, 4)),
    Bad("hard_attention_weights", "wrong-type", lambda: hard_attention_weights(_S, mode="soft"),
        ("hard_attention_weights", "mode")),
    Bad("hard_attention_weights", "integer-dtype", lambda: hard_attention_weights(_S.long()),
        ("hard_attention_weights", "scores")),
    Bad("hard_attention_weights", "wrong-shape", lambda: hard_attention_weights(
        _S, attn_mask=torch.ones(4, dtype=torch.bool)), ("hard_attention_weights", "attn_mask")),
    Edge("hard_attention", "wrong-dtype", lambda: hard_attention(_Q, _K, _V, _M64), _hard_float64_mask),
    Bad("hard_attention", "nan", lambda: hard_attention(_Q, _K, _V, scale=_NAN), ("hard_attention", "scale")),
    Bad("hard_attention", "wrong-type", lambda: hard_attention(_Q, _K, _V, mode="soft"), ("hard_attention", "mode")),
    Bad("hard_attention", "integer-dtype", lambda: hard_attention(_Q.long(), _K.long(), _V.long()),
        ("hard_attention", "q")),
    Bad("hard_attention", "wrong-shape", lambda: hard_attention(_Q, _K, _V, torch.ones(4, 5, dtype=torch.bool)),
        ("hard_attention", "attn_mask")),
    Edge("hard_attention", "empty", lambda: hard_attention(_Q, _K[:, :0], _V[:, :0]),
         lambda out: out.shape == (2, 5, 4) and not out.any()),
    Bad("MultiHeadAttention", "zero", lambda: MultiHeadAttention(8, 0), ("MultiHeadAttention", "n_heads")),
    Bad("MultiHeadAttention", "non-integer", lambda: MultiHeadAttention(8.0, 2), ("MultiHeadAttention", "d_model")),
    Bad("MultiHeadAttention", "negative", lambda: MultiHeadAttention(8, 2, -1), ("MultiHeadAttention", "n_kv_heads")),
    Bad("MultiHeadAttention", "nan", lambda: MultiHeadAttention(8, 2, dropout=_NAN), ("MultiHeadAttention", "dropout")),
    Bad("MultiHeadAttention", "wrong-shape", lambda: MultiHeadAttention(8, 2)(torch.ones(2, 5, 6)),
        ("MultiHeadAttention", "x")),
    Bad("MultiHeadAttention", "integer-dtype", lambda: MultiHeadAttention(8, 2)(torch.ones(2, 5, 8, dtype=torch.long)),
        ("MultiHeadAttention", "x")),
    Bad("MultiHeadAttention", "wrong-shape", lambda: MultiHeadAttention(8, 2)(
        torch.ones(2, 5, 8), attn_mask=torch.ones(3, 3, dtype=torch.bool)), ("MultiHeadAttention", "attn_mask", "(3, 3)")),
    Bad("MultiHeadAttention", "integer-dtype", lambda: MultiHeadAttention(8, 2)(
        torch.ones(2, 5, 8), attn_mask=torch.ones(5, 5, dtype=torch.long)), ("MultiHeadAttention", "attn_mask")),
    Bad("MultiHeadAttention", "wrong-type", lambda: MultiHeadAttention(8, 2)(torch.ones(2, 5, 8), is_causal="yes"),
        ("MultiHeadAttention", "is_causal")),
]
EXEMPT: dict[str, str] = {}
