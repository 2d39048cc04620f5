"""Bad-input rows of attnbook.masks (see tests/properties/test_bad_input.py)."""

from __future__ import annotations

import torch
from test_bad_input import Bad

from attnbook import masks

_B2 = torch.ones(2, 2, dtype=torch.bool)

ROWS = [
    Bad("causal", "non-integer", lambda: masks.causal(2.5), ("causal", "L")),
    Bad("causal", "negative", lambda: masks.causal(3, -1), ("causal", "S")),
    Bad("sliding_window", "negative", lambda: masks.sliding_window(-1), ("sliding_window", "window")),
    Bad("sliding_window", "zero", lambda: masks.sliding_window(2, dilation=0), ("sliding_window", "dilation")),
    Bad("sliding_window", "wrong-type", lambda: masks.sliding_window(2, is_causal="no"),
        ("sliding_window", "is_causal")),
    Bad("sliding_window", "out-of-range", lambda: masks.sliding_window(2, L=4), ("sliding_window", "L and S")),
    Bad("band", "wrong-type", lambda: masks.band((1, 2, 3), 4), ("band", "window_size")),
    Bad("band", "negative", lambda: masks.band((-2, 0), 4), ("band", "window_size")),
    Bad("global_tokens", "zero", lambda: masks.global_tokens(0, []), ("global_tokens", "seq_len")),
    Bad("global_tokens", "out-of-range", lambda: masks.global_tokens(4, [4]), ("global_tokens", "global_idx")),
    Bad("global_tokens", "wrong-dtype", lambda: masks.global_tokens(4, torch.ones(4, dtype=torch.bool)),
        ("global_tokens", "global_idx")),
    Bad("longformer", "negative", lambda: masks.longformer(8, -1, [0]), ("longformer", "window")),
    Bad("longformer", "non-integer", lambda: masks.longformer(8, 1, [1.5]), ("longformer", "global_idx")),
    Bad("blocks", "wrong-dtype", lambda: masks.blocks(torch.ones(2, 2), 2), ("blocks", "block_mask")),
    Bad("blocks", "wrong-shape", lambda: masks.blocks(torch.ones(2, dtype=torch.bool), 2), ("blocks", "block_mask")),
    Bad("blocks", "zero", lambda: masks.blocks(_B2, 0), ("blocks", "block_size")),
    Bad("padding", "negative", lambda: masks.padding([1, -1]), ("padding", "lengths")),
    Bad("padding", "non-integer", lambda: masks.padding([1.5]), ("padding", "lengths")),
    Bad("document", "out-of-range", lambda: masks.document(torch.tensor([1, 0])), ("document", "doc_ids")),
    Bad("document", "wrong-dtype", lambda: masks.document(torch.ones(3)), ("document", "doc_ids")),
    Bad("document", "wrong-shape", lambda: masks.document(torch.zeros(2, 2, dtype=torch.long)),
        ("document", "doc_ids")),
    Bad("document", "wrong-type", lambda: masks.document(torch.zeros(2, dtype=torch.long), is_causal="yes"),
        ("document", "is_causal")),
    Bad("dense", "wrong-type", lambda: masks.dense(3, 2, 2), ("dense", "predicate")),
    Bad("dense", "negative", lambda: masks.dense(masks.causal(2), 2, -1), ("dense", "S")),
    Bad("dense", "non-integer", lambda: masks.dense(masks.causal(2), 2, 2, B=1.0), ("dense", "B")),
    Bad("active_tiles", "zero", lambda: masks.active_tiles(masks.causal(2), 2, 2, 0), ("active_tiles", "block_q")),
    Bad("active_tiles", "boolean", lambda: masks.active_tiles(masks.causal(2), 2, 2, 2, True),
        ("active_tiles", "block_k")),
]

EXEMPT: dict[str, str] = {}
