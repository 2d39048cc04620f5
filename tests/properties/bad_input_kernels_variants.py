"""Bad-input rows of attnbook.kernels.variants (see tests/properties/test_bad_input.py)."""

from __future__ import annotations

from test_bad_input import Bad

from attnbook.kernels.variants import parameters, specialize

ROWS = [
    Bad("parameters", "wrong-type", lambda: parameters(3), ("parameters", "fn")),
    Bad("specialize", "wrong-type", lambda: specialize(lambda x: x, ["*fp16"], {}), ("specialize", "types")),
]

EXEMPT = {"Variant": "a dataclass of results, built by the kernel modules' variants()"}
