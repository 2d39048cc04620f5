"""Bad-input rows of attnbook.kernels.tuning (see tests/properties/test_bad_input.py)."""

from __future__ import annotations

import torch
from test_bad_input import Bad

from attnbook.kernels.tuning import Config, candidates, padded_head_dim, pick

ROWS = [
    Bad("Config", "zero", lambda: Config(0, 32), ("Config", "block_m")),
    Bad("Config", "non-integer", lambda: Config(32, 32.0), ("Config", "block_n")),
    Bad("Config", "boolean", lambda: Config(32, 32, True), ("Config", "num_warps")),
    Bad("padded_head_dim", "zero", lambda: padded_head_dim(0), ("padded_head_dim", "head_dim")),
    Bad("padded_head_dim", "non-integer", lambda: padded_head_dim(40.5), ("padded_head_dim", "head_dim")),
    Bad("candidates", "out-of-range", lambda: candidates("decode", (8, 0), torch.float16, 64),
        ("candidates", "kernel")),
    Bad("candidates", "wrong-type", lambda: candidates("flash_fwd", "8.0", torch.float16, 64),
        ("candidates", "capability")),
    Bad("pick", "empty", lambda: pick("key", [], lambda c: None), ("pick", "configs")),
]

EXEMPT = {
    "SPACE": "a constant table of tile configurations",
    "INTERPRETER": "a constant configuration",
    "tuned": "takes no argument (returns what pick chose)",
}
