"""Bad-input rows of attnbook.kernels.flash_triton (see tests/properties/test_bad_input.py).

The launchers (private, in ``_LAUNCHERS``) trust their inputs: attnbook.attend's entry points validate them once (the
contract, and what these kernels take) and call them, so their rows live in
tests/properties/bad_input_attend.py, as calls with ``backend="triton"``."""

from __future__ import annotations

import torch
from test_bad_input import Bad

from attnbook.kernels.flash_triton import variants

ROWS = [
    Bad("variants", "wrong-dtype", lambda: variants(torch.int64, 64), ("variants", "dtype")),
    Bad("variants", "non-integer", lambda: variants(torch.float16, 6.5), ("variants", "head_dim")),
]

EXEMPT = {
    "MAX_HEAD_DIM": "a constant (FlashAttention-2's head-dim limit)",
}
