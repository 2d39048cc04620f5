"""Bad-input rows of attnbook.caches (see tests/properties/test_bad_input.py)."""

from __future__ import annotations

ROWS: list = []
EXEMPT = {
    "KERNELS": "a constant: the names a cache's kernel takes",
    "AttentionCache": "a Protocol: nothing to call; every cache's own rows check its methods",
}
