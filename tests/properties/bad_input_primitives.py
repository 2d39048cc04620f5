"""Bad-input rows of attnbook.primitives (see tests/properties/test_bad_input.py); attnbook.flash
re-exports these functions and its rows try them there too."""

from __future__ import annotations

import torch
from test_bad_input import Bad

from attnbook.flash import flash_forward
from attnbook.primitives import merge_partials, online_softmax, online_softmax_step

_G = torch.Generator().manual_seed(0)
_Q = torch.randn(1, 2, 6, 4, generator=_G)
_X = torch.randn(3, 10, generator=_G)
_M, _L = torch.zeros(3), torch.ones(3)
_OUT, _LSE = flash_forward(_Q, _Q, _Q)

ROWS = [
    Bad("online_softmax", "zero", lambda: online_softmax(_X, 0), ("online_softmax", "block_size")),
    Bad("online_softmax", "non-integer", lambda: online_softmax(_X, 2.5), ("online_softmax", "block_size")),
    Bad("online_softmax", "boolean", lambda: online_softmax(_X, True), ("online_softmax", "block_size")),
    Bad("online_softmax", "integer-dtype", lambda: online_softmax(_X.long(), 2), ("online_softmax", "x")),
    Bad("online_softmax_step", "wrong-shape", lambda: online_softmax_step(_M[:2], _L, _X),
        ("online_softmax_step", "m")),
    Bad("merge_partials", "integer-dtype", lambda: merge_partials(_OUT, _LSE.long(), _OUT, _LSE),
        ("merge_partials", "lse_a")),
    Bad("merge_partials", "wrong-shape", lambda: merge_partials(_OUT, _LSE, _OUT, _LSE[..., :3]),
        ("merge_partials", "out_a")),
]

EXEMPT: dict[str, str] = {}
