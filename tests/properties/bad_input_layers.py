"""Bad-input rows of attnbook.layers (see tests/properties/test_bad_input.py)."""

from __future__ import annotations

import torch
from test_bad_input import Bad, Edge

from attnbook import layers as L

_X = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0))
_H = torch.randn(2, 4, 3, 2, generator=torch.Generator().manual_seed(1))

ROWS = [
    Bad("split_heads", "integer-dtype", lambda: L.split_heads(_X.long(), 4), ("split_heads", "x")),
    Bad("split_heads", "wrong-shape", lambda: L.split_heads(_X, 3), ("split_heads", "x", "heads=3")),
    Bad("split_heads", "wrong-shape", lambda: L.split_heads(_X[0], 4), ("split_heads", "x")),
    Bad("split_heads", "zero", lambda: L.split_heads(_X, 0), ("split_heads", "heads")),
    Bad("split_heads", "boolean", lambda: L.split_heads(_X, True), ("split_heads", "heads")),
    Bad("split_heads", "non-integer", lambda: L.split_heads(_X, 2.0), ("split_heads", "heads")),
    Edge("split_heads", "empty", lambda: L.split_heads(_X[:0], 4), lambda out: out.shape == (0, 4, 3, 2)),
    Bad("merge_heads", "wrong-shape", lambda: L.merge_heads(_X), ("merge_heads", "x")),
    Bad("merge_heads", "integer-dtype", lambda: L.merge_heads(_H.long()), ("merge_heads", "x")),
    Edge("merge_heads", "empty", lambda: L.merge_heads(_H[:0]), lambda out: out.shape == (0, 3, 8)),
    Bad("scale_heads", "wrong-shape", lambda: L.scale_heads(_H, torch.ones(3)), ("scale_heads", "head_mask")),
    Bad("scale_heads", "integer-dtype", lambda: L.scale_heads(_H, torch.ones(4, dtype=torch.long)),
        ("scale_heads", "head_mask")),
    Bad("scale_heads", "wrong-type", lambda: L.scale_heads(_H, [1.0] * 4), ("scale_heads", "head_mask")),
    Bad("RMSNorm", "zero", lambda: L.RMSNorm(0), ("RMSNorm", "dim")),
    Bad("RMSNorm", "negative", lambda: L.RMSNorm(8, eps=-1e-6), ("RMSNorm", "eps")),
    Bad("RMSNorm", "nan", lambda: L.RMSNorm(8, eps=float("nan")), ("RMSNorm", "eps")),
    Bad("RMSNorm", "boolean", lambda: L.RMSNorm(True), ("RMSNorm", "dim")),
    Bad("RMSNorm", "wrong-shape", lambda: L.RMSNorm(16)(_X), ("RMSNorm.forward", "x", "dim=16")),
    Bad("RMSNorm", "integer-dtype", lambda: L.RMSNorm(8)(_X.long()), ("RMSNorm.forward", "x")),
]

EXEMPT = {
    "HeadShell": "a mixin with no constructor: the layer it is mixed into checks its input "
                 "(Attention, RelativeSegmentAttention rows)",
}
