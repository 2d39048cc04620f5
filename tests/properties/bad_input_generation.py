"""Bad-input rows of attnbook.generation (see tests/properties/test_bad_input.py)."""

from __future__ import annotations

import torch
from test_bad_input import Bad, Edge

from attnbook import generation as G
from attnbook.models import TinyGPT, TransformerConfig


def _gpt():
    torch.manual_seed(0)
    return TinyGPT(TransformerConfig(vocab_size=9, d_model=16, n_heads=2, n_layers=1))


_IDX = torch.tensor([[1, 2, 3]])

ROWS = [
    Bad("generate", "wrong-type", lambda: G.generate(torch.nn.Linear(2, 2), _IDX, 2), ("generate", "model")),
    Bad("generate", "integer-dtype", lambda: G.generate(_gpt(), _IDX.float(), 2), ("generate", "idx")),
    Bad("generate", "wrong-shape", lambda: G.generate(_gpt(), _IDX[0], 2), ("generate", "idx")),
    Bad("generate", "out-of-range", lambda: G.generate(_gpt(), _IDX + 7, 2), ("generate", "idx")),
    Bad("generate", "negative", lambda: G.generate(_gpt(), _IDX, -1), ("generate", "max_new_tokens")),
    Bad("generate", "non-integer", lambda: G.generate(_gpt(), _IDX, 1.5), ("generate", "max_new_tokens")),
    Bad("generate", "wrong-type", lambda: G.generate(_gpt(), _IDX, 2, use_cache="yes"), ("generate", "use_cache")),
    Bad("generate", "nan", lambda: G.generate(_gpt(), _IDX, 2, temperature=float("nan")),
        ("generate", "temperature")),
    Bad("generate", "zero", lambda: G.generate(_gpt(), _IDX, 2, top_k=0), ("generate", "top_k")),
    Bad("generate", "wrong-shape", lambda: G.generate(_gpt(), _IDX, 2, key_padding_mask=torch.zeros(1, 2, dtype=torch.bool)),
        ("generate", "key_padding_mask")),
    Edge("generate", "empty", lambda: G.generate(_gpt(), _IDX[:0], 2), lambda out: out.shape == (0, 5)),
    Edge("generate", "zero", lambda: G.generate(_gpt(), _IDX, 0), lambda out: torch.equal(out, _IDX)),
    Bad("generating", "wrong-type", lambda: G.generating("model").__enter__(), ("generating", "model")),
]
EXEMPT: dict[str, str] = {}
