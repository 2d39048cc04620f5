"""Bad-input rows of attnbook.flash (see tests/properties/test_bad_input.py), from the table of
tests/unit/test_flash.py. The entry points it gives too (``flash_attention`` ...) have theirs in
tests/properties/bad_input_attend.py, beside their home."""

from __future__ import annotations

import math

import torch
from test_bad_input import Bad

from attnbook.flash import (
    hbm_accesses,
    key_range,
    plan_tiles,
    flash_backward,
    flash_forward,
)

_G = torch.Generator().manual_seed(0)
_Q = torch.randn(1, 2, 6, 4, generator=_G)
_OUT, _LSE = flash_forward(_Q, _Q, _Q)

ROWS = [
    Bad("key_range", "non-integer", lambda: key_range(0, 4.0, 10, 10), ("key_range", "i1")),
    Bad("key_range", "negative", lambda: key_range(0, 4, -1, 10), ("key_range", "L")),
    Bad("key_range", "out-of-range", lambda: key_range(0, 4, 10, 10, window_size=(-2, 0)),
        ("key_range", "window_size")),
    Bad("flash_forward", "non-integer", lambda: flash_forward(_Q, _Q, _Q, block_q=2.5),
        ("flash_forward", "block_q")),
    Bad("flash_forward", "negative", lambda: flash_forward(_Q, _Q, _Q, block_k=-1),
        ("flash_forward", "block_k")),
    Bad("flash_forward", "nan", lambda: flash_forward(_Q, _Q, _Q, scale=math.nan),
        ("flash_forward", "scale")),
    Bad("flash_backward", "zero", lambda: flash_backward(_Q, _Q, _Q, _OUT, _LSE, _OUT, block_q=0),
        ("flash_backward", "block_q")),
    Bad("flash_backward", "wrong-shape", lambda: flash_backward(
        _Q, _Q, _Q, _OUT, _LSE, _OUT[..., :2]), ("flash_backward", "grad_out")),
    Bad("plan_tiles", "zero", lambda: plan_tiles(0), ("plan_tiles", "head_dim")),
    Bad("plan_tiles", "non-integer", lambda: plan_tiles(64, l2_bytes=2.5e5), ("plan_tiles", "l2_bytes")),
    Bad("plan_tiles", "integer-dtype", lambda: plan_tiles(64, dtype=torch.int32), ("plan_tiles", "dtype")),
    Bad("plan_tiles", "zero", lambda: plan_tiles(64, threads=0), ("plan_tiles", "threads")),
    Bad("hbm_accesses", "non-integer", lambda: hbm_accesses(1024, 64, 2.5e4), ("hbm_accesses", "sram_bytes")),
    Bad("hbm_accesses", "zero", lambda: hbm_accesses(0, 64, 2**16), ("hbm_accesses", "seq_len")),
]

EXEMPT: dict[str, str] = {
    name: "attnbook.primitives's function, which flash gives too: its rows are in bad_input_primitives.py"
    for name in ("online_softmax", "online_softmax_step", "merge_partials")
}
