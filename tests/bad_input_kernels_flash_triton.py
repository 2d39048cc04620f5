"""Bad-input rows of attnbook.kernels.flash_triton (see tests/test_bad_input.py): all
refused before any kernel launch."""

from __future__ import annotations

import torch
from test_bad_input import Bad

from attnbook.kernels.flash_triton import (
    block_sparse_backward,
    block_sparse_forward,
    flash_backward,
    flash_forward,
    varlen_backward,
    varlen_forward,
    variants,
)

_Q = torch.zeros(1, 2, 16, 16)
_P = torch.zeros(8, 2, 16)
_CU = torch.tensor([0, 8], dtype=torch.int32)
_BM = torch.ones(1, 1, dtype=torch.bool)

ROWS = [
    Bad("flash_forward", "integer-dtype", lambda: flash_forward(_Q.long(), _Q.long(), _Q.long()),
        ("flash_forward", "q")),
    Bad("flash_forward", "nan", lambda: flash_forward(_Q, _Q, _Q, softcap=float("nan")),
        ("flash_forward", "softcap")),
    Bad("flash_backward", "integer-dtype", lambda: flash_backward(_Q.int(), _Q.int(), _Q.int(), _Q, _Q, _Q),
        ("flash_backward", "q")),
    Bad("block_sparse_forward", "zero", lambda: block_sparse_forward(_Q, _Q, _Q, _BM, 0),
        ("block_sparse_forward", "block_size")),
    Bad("block_sparse_forward", "non-integer", lambda: block_sparse_forward(_Q, _Q, _Q, _BM, 16.0),
        ("block_sparse_forward", "block_size")),
    Bad("block_sparse_forward", "wrong-shape", lambda: block_sparse_forward(
        _Q, _Q, _Q, torch.ones(2, 2, dtype=torch.bool), 16), ("block_sparse_forward", "block_mask")),
    Bad("block_sparse_backward", "negative", lambda: block_sparse_backward(_Q, _Q, _Q, _Q, _Q, _Q, _BM, -16),
        ("block_sparse_backward", "block_size")),
    Bad("varlen_forward", "wrong-dtype", lambda: varlen_forward(_P, _P, _P, _CU.long(), _CU, 8, 8),
        ("varlen_forward", "cu_seqlens_q")),
    Bad("varlen_backward", "integer-dtype", lambda: varlen_backward(
        _P.long(), _P.long(), _P.long(), _P, _P, _P, _CU, _CU, 8, 8), ("varlen_forward", "q")),
    Bad("variants", "wrong-dtype", lambda: variants(torch.int64, 64), ("variants", "dtype")),
    Bad("variants", "non-integer", lambda: variants(torch.float16, 6.5), ("variants", "head_dim")),
]

EXEMPT = {"MAX_HEAD_DIM": "a constant (FlashAttention-2's head-dim limit)"}
