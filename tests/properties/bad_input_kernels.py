"""Bad-input rows of attnbook.kernels (see tests/properties/test_bad_input.py)."""

from __future__ import annotations

import torch
from test_bad_input import Bad

from attnbook.kernels import check_addressing, compiled_fit, plan, plan_for, support

_X = torch.zeros(1, 2, 4, 8)

ROWS = [
    Bad("plan", "out-of-range", lambda: plan("flash2", None), ("plan", "kernel")),
    Bad("plan_for", "out-of-range", lambda: plan_for("nope", _X), ("plan_for", "kernel")),
    Bad("plan_for", "wrong-type", lambda: plan_for("flash", [1.0, 2.0]), ("plan_for", "x")),
    Bad("compiled_fit", "out-of-range", lambda: compiled_fit("bogus", (8, 0), torch.float16, 64),
        ("compiled_fit", "kernel")),
    Bad("support", "wrong-type", lambda: support("nonsense"), ("support", "device")),
    # rows of one head 2^31 elements apart (a stride, no storage): the kernels' 32-bit offsets
    Bad("check_addressing", "out-of-range",
        lambda: check_addressing("flash_attention", q=torch.empty(2, 8, device="meta").as_strided(
            (1, 1, 2, 8), (0, 0, 2**31, 1))),
        ("flash_attention", "q", "spans")),
]

EXEMPT = {
    "MAX_HEAD_DIM": "a constant",
    "IN_HEAD_LIMIT": "a constant (32-bit offsets within one head)",
    "KernelSupport": "a dataclass of results, built by support()",
}
