"""Bad-input rows of attnbook.kernels.compile (see tests/properties/test_bad_input.py)."""

from __future__ import annotations

import torch
from test_bad_input import Bad

from attnbook.kernels.compile import Resources, compile_variant, compile_variants, fits

ROWS = [
    Bad("compile_variant", "out-of-range", lambda: compile_variant("attnbook.kernels.decode", {}, 0, 61),
        ("compile_variant", "capability")),
    Bad("compile_variants", "out-of-range", lambda: compile_variants([(70, torch.float16, 64)]),
        ("compile_variants", "capability")),
    Bad("fits", "out-of-range", lambda: fits(Resources("k", "k", 70, "float16", 64, 0, 32, 0, 0)),
        ("fits", "resources")),
    Bad("fits", "wrong-type", lambda: fits({"capability": 80}), ("fits", "resources")),
]

EXEMPT = {
    "Target": "a dataclass describing a GPU generation (the constants of TARGETS)",
    "TARGETS": "a constant table of GPU generations",
    "Resources": "a dataclass of results, built by compile_variants()",
}
