"""Bad-input rows of attnbook.kernels.decode (see tests/properties/test_bad_input.py). Its launcher,
``_split_kv_attention``, trusts its inputs: ``attend.decode_attention(..., backend="triton")``
validates them once, so their rows live in tests/properties/bad_input_attend.py."""

from __future__ import annotations

import torch
from test_bad_input import Bad

from attnbook.kernels.decode import default_num_splits, variants

ROWS = [
    Bad("default_num_splits", "non-integer", lambda: default_num_splits(2.5, 64),
        ("default_num_splits", "batch_heads")),
    Bad("default_num_splits", "negative", lambda: default_num_splits(2, -1), ("default_num_splits", "max_len")),
    Bad("default_num_splits", "zero", lambda: default_num_splits(2, 64, 0),
        ("default_num_splits", "target_programs")),
    Bad("variants", "wrong-dtype", lambda: variants(torch.int32, 64), ("variants", "dtype")),
    Bad("variants", "zero", lambda: variants(torch.float16, 0), ("variants", "head_dim")),
]

EXEMPT = {
    "MAX_HEAD_DIM": "a constant",
}
