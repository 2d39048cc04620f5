"""Bad-input rows of attnbook.sparse (see tests/properties/test_bad_input.py)."""

from __future__ import annotations

import torch
from test_bad_input import Bad, Edge

from attnbook.sparse import (
    RelativeLabelBias,
    bigbird_block_mask,
    block_sparse_attention,
    etc_relative_labels,
    expand_block_mask,
    global_mask,
    graph_distances,
    longformer_mask,
    lsh_buckets,
    lsh_mask,
    random_mask,
    sliding_window_attention,
    sliding_window_mask,
)

_G = torch.Generator().manual_seed(0)
_Q, _K, _V = (torch.randn(2, 8, 4, generator=_G) for _ in range(3))
_BM = torch.ones(2, 2, dtype=torch.bool)
_NAN = float("nan")


def _labels():
    return etc_relative_labels(2, 4, 1, [0, 0, 1, 1])[0]


ROWS = [
    Bad("sliding_window_mask", "non-integer", lambda: sliding_window_mask(8, 1.5), ("sliding_window_mask", "window")),
    Bad("sliding_window_mask", "negative", lambda: sliding_window_mask(8, -1), ("sliding_window_mask", "window")),
    Bad("sliding_window_mask", "zero", lambda: sliding_window_mask(0, 1), ("sliding_window_mask", "seq_len")),
    Bad("sliding_window_mask", "zero", lambda: sliding_window_mask(8, 1, dilation=0),
        ("sliding_window_mask", "dilation")),
    Bad("sliding_window_mask", "wrong-type", lambda: sliding_window_mask(8, 1, is_causal="no"),
        ("sliding_window_mask", "is_causal")),
    Bad("global_mask", "non-integer", lambda: global_mask(8, [1.5, 3]), ("global_mask", "global_idx")),
    Bad("global_mask", "boolean", lambda: global_mask(4, torch.tensor([True, False, False, True])),
        ("global_mask", "global_idx", "nonzero")),
    Bad("global_mask", "boolean", lambda: global_mask(4, [True, False]), ("global_mask", "global_idx")),
    Bad("global_mask", "out-of-range", lambda: global_mask(4, [0, 4]), ("global_mask", "global_idx")),
    Bad("global_mask", "negative", lambda: global_mask(4, [-1]), ("global_mask", "global_idx")),
    Bad("global_mask", "non-integer", lambda: global_mask(4.0, [1]), ("global_mask", "seq_len")),
    Edge("global_mask", "empty", lambda: global_mask(3, []), lambda m: m.shape == (3, 3) and not m.any()),
    Bad("random_mask", "out-of-range", lambda: random_mask(4, 5), ("random_mask", "n_random")),
    Bad("random_mask", "non-integer", lambda: random_mask(4, 1.5), ("random_mask", "n_random")),
    Bad("random_mask", "zero", lambda: random_mask(0, 0), ("random_mask", "seq_len")),
    Bad("longformer_mask", "non-integer", lambda: longformer_mask(8, 2, [1.5]), ("longformer_mask", "global_idx")),
    Bad("longformer_mask", "negative", lambda: longformer_mask(8, -2, [1]), ("longformer_mask", "window")),
    Bad("longformer_mask", "boolean", lambda: longformer_mask(4, 1, torch.ones(4, dtype=torch.bool)),
        ("longformer_mask", "global_idx")),
    Bad("etc_relative_labels", "out-of-range", lambda: etc_relative_labels(2, 3, 1, [0, 1, 2]),
        ("etc_relative_labels", "segment_of_long")),
    Bad("etc_relative_labels", "non-integer", lambda: etc_relative_labels(2, 2, 1, [0.0, 1.0]),
        ("etc_relative_labels", "segment_of_long")),
    Bad("etc_relative_labels", "wrong-shape", lambda: etc_relative_labels(2, 3, 1, [0, 1]),
        ("etc_relative_labels", "segment_of_long")),
    Bad("etc_relative_labels", "negative", lambda: etc_relative_labels(2, 2, -1, [0, 1]),
        ("etc_relative_labels", "radius")),
    Bad("etc_relative_labels", "non-integer", lambda: etc_relative_labels(2, 2, 1, [0, 1], max_distance=1.5),
        ("etc_relative_labels", "max_distance")),
    Bad("etc_relative_labels", "zero", lambda: etc_relative_labels(0, 2, 1, [0, 1]), ("etc_relative_labels", "n_global")),
    Bad("RelativeLabelBias", "zero", lambda: RelativeLabelBias(0, 2), ("RelativeLabelBias", "n_labels")),
    Bad("RelativeLabelBias", "non-integer", lambda: RelativeLabelBias(5, 2.5), ("RelativeLabelBias", "n_heads")),
    Bad("RelativeLabelBias", "out-of-range", lambda: RelativeLabelBias(3, 2)(_labels()), ("RelativeLabelBias", "labels")),
    Bad("RelativeLabelBias", "integer-dtype", lambda: RelativeLabelBias(5, 2)(_labels().float()),
        ("RelativeLabelBias", "labels")),
    Bad("RelativeLabelBias", "wrong-shape", lambda: RelativeLabelBias(5, 2)(_labels(), torch.ones(3, 3, dtype=torch.bool)),
        ("RelativeLabelBias", "mask")),
    Bad("bigbird_block_mask", "negative", lambda: bigbird_block_mask(8, n_random=-1), ("bigbird_block_mask", "n_random")),
    Bad("bigbird_block_mask", "non-integer", lambda: bigbird_block_mask(8.0), ("bigbird_block_mask", "n_blocks")),
    Bad("bigbird_block_mask", "boolean", lambda: bigbird_block_mask(8, n_global=True), ("bigbird_block_mask", "n_global")),
    Bad("expand_block_mask", "zero", lambda: expand_block_mask(_BM, 0), ("expand_block_mask", "block_size")),
    Bad("expand_block_mask", "wrong-dtype", lambda: expand_block_mask(_BM.float(), 2), ("expand_block_mask", "block_mask")),
    Bad("block_sparse_attention", "non-integer", lambda: block_sparse_attention(_Q, _K, _V, _BM, 4.0),
        ("block_sparse_attention", "block_size")),
    Bad("block_sparse_attention", "wrong-shape", lambda: block_sparse_attention(_Q, _K, _V, _BM, 2),
        ("block_sparse_attention", "block_mask")),
    Bad("block_sparse_attention", "wrong-dtype", lambda: block_sparse_attention(_Q, _K, _V, _BM.long(), 4),
        ("block_sparse_attention", "block_mask")),
    Bad("block_sparse_attention", "integer-dtype", lambda: block_sparse_attention(_Q.long(), _K.long(), _V.long(), _BM, 4),
        ("block_sparse_attention", "q")),
    Bad("block_sparse_attention", "nan", lambda: block_sparse_attention(_Q, _K, _V, _BM, 4, scale=_NAN),
        ("block_sparse_attention", "scale")),
    Bad("block_sparse_attention", "wrong-type", lambda: block_sparse_attention(_Q, _K, _V, _BM, 4, is_causal=_BM),
        ("block_sparse_attention", "is_causal")),
    Edge("block_sparse_attention", "empty", lambda: block_sparse_attention(
        _Q[:, :0], _K[:, :0], _V[:, :0], torch.ones(0, 0, dtype=torch.bool), 4), lambda out: out.shape == (2, 0, 4)),
    Edge("block_sparse_attention", "empty", lambda: block_sparse_attention(
        _Q[:0], _K[:0], _V[:0], _BM, 4), lambda out: out.shape == (0, 8, 4)),
    Edge("block_sparse_attention", "empty", lambda: block_sparse_attention(
        _Q[:0], _K[:0], _V[:0], _BM, 4, is_causal=True), lambda out: out.shape == (0, 8, 4)),
    Edge("block_sparse_attention", "zero", lambda: block_sparse_attention(
        _Q[None, :0], _K[None, :0], _V[None, :0], _BM, 4), lambda out: out.shape == (1, 0, 8, 4)),
    Edge("block_sparse_attention", "zero", lambda: block_sparse_attention(_Q, _K, _V[..., :0], _BM, 4),
         lambda out: out.shape == (2, 8, 0)),
    Bad("block_sparse_attention", "zero", lambda: block_sparse_attention(_Q[..., :0], _K[..., :0], _V, _BM, 4),
        ("block_sparse_attention", "head_dim 0", "scale=", "(2, 8, 0)")),
    Bad("sliding_window_attention", "zero", lambda: sliding_window_attention(_Q[..., :0], _K[..., :0], _V, 1),
        ("sliding_window_attention", "head_dim 0", "scale=", "(2, 8, 0)")),
    Edge("sliding_window_attention", "empty", lambda: sliding_window_attention(_Q[:0], _K[:0], _V[:0], 1),
         lambda out: out.shape == (0, 8, 4)),
    Bad("sliding_window_attention", "non-integer", lambda: sliding_window_attention(_Q, _K, _V, 2.5),
        ("sliding_window_attention", "window")),
    Bad("sliding_window_attention", "negative", lambda: sliding_window_attention(_Q, _K, _V, -1),
        ("sliding_window_attention", "window")),
    Bad("sliding_window_attention", "nan", lambda: sliding_window_attention(_Q, _K, _V, 1, scale=_NAN),
        ("sliding_window_attention", "scale")),
    Bad("sliding_window_attention", "integer-dtype", lambda: sliding_window_attention(_Q.int(), _K.int(), _V.int(), 1),
        ("sliding_window_attention", "q")),
    Bad("sliding_window_attention", "wrong-shape", lambda: sliding_window_attention(_Q, _K[:, :5], _V[:, :5], 1),
        ("sliding_window_attention", "q and k")),
    Edge("sliding_window_attention", "empty", lambda: sliding_window_attention(_Q[:, :0], _K[:, :0], _V[:, :0], 2),
         lambda out: out.shape == (2, 0, 4)),
    Bad("lsh_buckets", "integer-dtype", lambda: lsh_buckets(torch.ones(8, 4, dtype=torch.long), 4), ("lsh_buckets", "x")),
    Bad("lsh_buckets", "non-integer", lambda: lsh_buckets(_Q, 4.0), ("lsh_buckets", "n_buckets")),
    Bad("lsh_buckets", "out-of-range", lambda: lsh_buckets(_Q, 3), ("lsh_buckets", "n_buckets")),
    Bad("lsh_buckets", "zero", lambda: lsh_buckets(_Q, 0), ("lsh_buckets", "n_buckets")),
    Bad("lsh_mask", "integer-dtype", lambda: lsh_mask(torch.ones(8, 4, dtype=torch.long), 4), ("lsh_mask", "x")),
    Bad("lsh_mask", "boolean", lambda: lsh_mask(_Q, True), ("lsh_mask", "n_buckets")),
    Bad("graph_distances", "wrong-shape", lambda: graph_distances(torch.ones(3, 4, dtype=torch.bool)),
        ("graph_distances", "mask")),
    Bad("graph_distances", "wrong-dtype", lambda: graph_distances(torch.ones(3, 3)), ("graph_distances", "mask")),
    Edge("graph_distances", "empty", lambda: graph_distances(torch.ones(0, 0, dtype=torch.bool)),
         lambda d: d.shape == (0, 0)),
]
EXEMPT: dict[str, str] = {}
