"""Bad-input rows of attnbook.positional (see tests/properties/test_bad_input.py), from the table of
tests/unit/test_positional.py."""

from __future__ import annotations

import math

import torch
from test_bad_input import Bad

from attnbook.positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    T5RelativeBias,
    alibi_bias,
    alibi_slopes,
    disentangled_scores,
    multiplicative_scores,
    principal_angles,
    principal_components,
    relative_positions,
    rope_complex,
    shaw_relative_attention,
    sinusoidal_encoding,
    subspace_overlap,
    t5_relative_position_bucket,
    transformer_xl_relative_embeddings,
    transformer_xl_scores,
    untied_scores,
    variance_in_subspace,
    yarn_inv_freq,
)

_G = torch.Generator().manual_seed(24)
_Q = torch.randn(4, 8, generator=_G)
_R3 = torch.zeros(3, 8)
_XL = tuple(torch.randn(*s, generator=_G, dtype=torch.float64) for s in ((2, 4, 3), (2, 6, 3), (2, 6, 3), (2, 3), (2, 3)))
_YARN = dict(dim=16, base=10000.0, factor=4.0, original_max_position_embeddings=64)
_W = [torch.zeros(8, 2)] * 4

ROWS = [
    Bad("sinusoidal_encoding", "non-integer", lambda: sinusoidal_encoding(3.5, 8), ("sinusoidal_encoding", "n_positions")),
    Bad("sinusoidal_encoding", "negative", lambda: sinusoidal_encoding(-1, 8), ("sinusoidal_encoding", "n_positions")),
    Bad("sinusoidal_encoding", "wrong-dtype", lambda: sinusoidal_encoding(4, 8, dtype=torch.long),
        ("sinusoidal_encoding", "dtype")),
    Bad("sinusoidal_encoding", "nan", lambda: sinusoidal_encoding(4, 8, base=math.nan), ("sinusoidal_encoding", "base")),
    Bad("LearnedPositionalEmbedding", "zero", lambda: LearnedPositionalEmbedding(0, 4),
        ("LearnedPositionalEmbedding", "max_len")),
    Bad("LearnedPositionalEmbedding", "non-integer", lambda: LearnedPositionalEmbedding(4.0, 4),
        ("LearnedPositionalEmbedding", "max_len")),
    Bad("LearnedPositionalEmbedding", "negative", lambda: LearnedPositionalEmbedding(6, 4)(-1),
        ("LearnedPositionalEmbedding", "positions")),
    Bad("LearnedPositionalEmbedding", "wrong-dtype", lambda: LearnedPositionalEmbedding(6, 4)(torch.tensor([1.0])),
        ("LearnedPositionalEmbedding", "positions")),
    Bad("relative_positions", "non-integer", lambda: relative_positions(2.5), ("relative_positions", "q_len")),
    Bad("relative_positions", "negative", lambda: relative_positions(2, -1), ("relative_positions", "k_len")),
    Bad("shaw_relative_attention", "negative", lambda: shaw_relative_attention(
        _Q, _Q, _Q, torch.zeros(1, 8), torch.zeros(1, 8), -1), ("shaw_relative_attention", "max_distance")),
    Bad("shaw_relative_attention", "integer-dtype", lambda: shaw_relative_attention(
        _Q, _Q, _Q, _R3.long(), _R3, 1), ("shaw_relative_attention", "rel_k")),
    Bad("shaw_relative_attention", "nan", lambda: shaw_relative_attention(
        _Q, _Q, _Q, _R3, _R3, 1, scale=math.nan), ("shaw_relative_attention", "scale")),
    Bad("untied_scores", "integer-dtype", lambda: untied_scores(_Q, _Q.long(), *_W), ("untied_scores", "pos")),
    Bad("untied_scores", "wrong-shape", lambda: untied_scores(_Q, _Q[:3], *_W), ("untied_scores", "pos")),
    Bad("multiplicative_scores", "negative", lambda: multiplicative_scores(_Q, _Q, torch.ones(2), -1),
        ("multiplicative_scores", "max_distance")),
    Bad("multiplicative_scores", "wrong-dtype", lambda: multiplicative_scores(_Q, _Q.double(), torch.ones(2), 1),
        ("multiplicative_scores", "k")),
    Bad("disentangled_scores", "non-integer", lambda: disentangled_scores(
        _Q, _Q, torch.zeros(2, 8), torch.zeros(2, 8), 1.0), ("disentangled_scores", "max_distance")),
    Bad("disentangled_scores", "out-of-range", lambda: disentangled_scores(
        _Q, _Q, torch.zeros(2, 8), torch.zeros(2, 8), 1, convention="hf"), ("disentangled_scores", "convention")),
    Bad("transformer_xl_relative_embeddings", "non-integer", lambda: transformer_xl_relative_embeddings(2.5, 8),
        ("transformer_xl_relative_embeddings", "n")),
    Bad("transformer_xl_relative_embeddings", "out-of-range", lambda: transformer_xl_relative_embeddings(10, 7),
        ("transformer_xl_relative_embeddings", "dim")),
    Bad("transformer_xl_scores", "integer-dtype", lambda: transformer_xl_scores(*_XL[:2], _XL[2].long(), *_XL[3:]),
        ("transformer_xl_scores", "r")),
    Bad("transformer_xl_scores", "wrong-type", lambda: transformer_xl_scores(*_XL, return_terms="yes"),
        ("transformer_xl_scores", "return_terms")),
    Bad("t5_relative_position_bucket", "out-of-range", lambda: t5_relative_position_bucket(torch.tensor([1]), False, 1),
        ("t5_relative_position_bucket", "num_buckets")),
    Bad("t5_relative_position_bucket", "zero", lambda: t5_relative_position_bucket(torch.tensor([1]), True, 32, 0),
        ("t5_relative_position_bucket", "max_distance")),
    Bad("T5RelativeBias", "zero", lambda: T5RelativeBias(0), ("T5RelativeBias", "n_heads")),
    Bad("T5RelativeBias", "non-integer", lambda: T5RelativeBias(2)(2.5), ("T5RelativeBias", "q_len")),
    Bad("alibi_slopes", "zero", lambda: alibi_slopes(0), ("alibi_slopes", "n_heads")),
    Bad("alibi_slopes", "non-integer", lambda: alibi_slopes(8.0), ("alibi_slopes", "n_heads")),
    Bad("alibi_bias", "negative", lambda: alibi_bias(8, -1), ("alibi_bias", "q_len")),
    Bad("alibi_bias", "wrong-type", lambda: alibi_bias(8, 4, is_causal="no"), ("alibi_bias", "is_causal")),
    Bad("yarn_inv_freq", "out-of-range", lambda: yarn_inv_freq(**{**_YARN, "dim": 15}), ("yarn_inv_freq", "dim")),
    Bad("yarn_inv_freq", "nan", lambda: yarn_inv_freq(**{**_YARN, "base": math.nan}), ("yarn_inv_freq", "base")),
    Bad("yarn_inv_freq", "zero", lambda: yarn_inv_freq(**{**_YARN, "original_max_position_embeddings": 0}),
        ("yarn_inv_freq", "original_max_position_embeddings")),
    Bad("RotaryEmbedding", "non-integer", lambda: RotaryEmbedding(8.0), ("RotaryEmbedding", "dim")),
    Bad("RotaryEmbedding", "nan", lambda: RotaryEmbedding(8, base=math.nan), ("RotaryEmbedding", "base")),
    Bad("RotaryEmbedding", "integer-dtype", lambda: RotaryEmbedding(8)(_Q.long()), ("RotaryEmbedding", "x")),
    Bad("RotaryEmbedding", "negative", lambda: RotaryEmbedding(8)(_Q, offset=-1), ("RotaryEmbedding", "offset")),
    Bad("RotaryEmbedding", "wrong-dtype", lambda: RotaryEmbedding(8)(_Q, positions=torch.ones(4, dtype=torch.bool)),
        ("RotaryEmbedding", "positions")),
    Bad("RotaryEmbedding", "wrong-shape", lambda: RotaryEmbedding(8)(_Q, positions=torch.arange(5)),
        ("RotaryEmbedding", "positions")),
    Bad("rope_complex", "nan", lambda: rope_complex(_Q, torch.arange(4), base=math.nan), ("rope_complex", "base")),
    Bad("rope_complex", "wrong-shape", lambda: rope_complex(_Q, torch.arange(3)), ("rope_complex", "positions")),
    Bad("principal_components", "out-of-range", lambda: principal_components(_Q, 4), ("principal_components", "k")),
    Bad("principal_components", "non-integer", lambda: principal_components(_Q, 1.5), ("principal_components", "k")),
    Bad("principal_angles", "wrong-shape", lambda: principal_angles(_Q, torch.randn(4, 5), 1), ("principal_angles", "b")),
    Bad("subspace_overlap", "wrong-shape", lambda: subspace_overlap(_Q, torch.randn(4, 5), 1), ("subspace_overlap", "b")),
    Bad("subspace_overlap", "out-of-range", lambda: subspace_overlap(_Q, _Q, 99), ("subspace_overlap", "k")),
    Bad("principal_angles", "zero", lambda: principal_angles(_Q, _Q, 0), ("principal_angles", "k")),
    Bad("variance_in_subspace", "wrong-shape", lambda: variance_in_subspace(_Q[:, :3], _Q, 1),
        ("variance_in_subspace", "x")),
]

EXEMPT: dict[str, str] = {}
