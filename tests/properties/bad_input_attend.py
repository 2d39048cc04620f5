"""Bad-input rows of attnbook.attend (see tests/properties/test_bad_input.py): the entry points that
pick a backend, each refusing a bad argument once, before any backend runs. With
``backend="triton"`` (Triton's interpreter, which tests/conftest.py turns on) they also refuse
what the kernels cannot take: the launchers behind them trust their inputs."""

from __future__ import annotations

import math

import torch
from test_bad_input import Bad, Edge

from attnbook.attend import (
    block_sparse_flash_attention,
    decode_attention,
    flash_attention,
    flash_attention_varlen,
    select_backend,
)

_G = torch.Generator().manual_seed(0)
_Q = torch.randn(1, 2, 6, 4, generator=_G)
_PK = torch.randn(7, 2, 4, generator=_G)
_CU = torch.tensor([0, 3, 7], dtype=torch.int32)
_BM = torch.ones(1, 1, dtype=torch.bool)
_QT = torch.zeros(1, 2, 16, 16)  # for the Triton kernels: tiles of 16 and more
_P, _CUT = torch.zeros(8, 2, 16), torch.tensor([0, 8], dtype=torch.int32)
_QD = torch.randn(2, 2, 1, 4, generator=_G)  # one decoding step against a cache
_KC = torch.randn(2, 1, 8, 4, generator=_G)
_VC = torch.randn(2, 1, 8, 4, generator=_G)
_LENS = torch.tensor([3, 8])
_TRITON = {"backend": "triton"}


def _decode_torch(**kw):
    return decode_attention(_QD, _KC, _VC, _LENS, **{"backend": "torch", **kw})


def _decode_triton(**kw):
    return decode_attention(_QD, _KC, _VC, _LENS, backend="triton", **kw)


ROWS = [
    # flash_attention, flash_attention_varlen, block_sparse_flash_attention, select_backend
    # empty batch, no heads: SDPA's empty result (it was a reshape error and a ZeroDivisionError)
    Edge("flash_attention", "empty", lambda: flash_attention(*(torch.randn(0, 2, 3, 4) for _ in range(3))),
         lambda out: out.shape == (0, 2, 3, 4)),
    Edge("flash_attention", "zero", lambda: flash_attention(*(torch.randn(1, 0, 3, 4) for _ in range(3)),
                                                            is_causal=True),
         lambda out: out.shape == (1, 0, 3, 4)),
    Bad("flash_attention", "wrong-type", lambda: flash_attention(_Q, _Q, _Q, is_causal="False"),
        ("flash_attention", "is_causal")),
    Bad("flash_attention", "nan", lambda: flash_attention(_Q, _Q, _Q, scale=math.inf), ("flash_attention", "scale")),
    Bad("flash_attention", "integer-dtype", lambda: flash_attention(_Q.long(), _Q.long(), _Q.long()),
        ("flash_attention", "q")),
    Bad("flash_attention", "out-of-range", lambda: flash_attention(_Q, _Q, _Q, backend="cuda"),
        ("flash_attention", "backend")),
    Bad("flash_attention_varlen", "non-integer", lambda: flash_attention_varlen(_PK, _PK, _PK, _CU, _CU, 4.5, 4),
        ("flash_attention_varlen", "max_seqlen_q")),
    Bad("flash_attention_varlen", "negative", lambda: flash_attention_varlen(_PK, _PK, _PK, _CU, _CU, 4, -1),
        ("flash_attention_varlen", "max_seqlen_k")),
    Bad("block_sparse_flash_attention", "zero", lambda: block_sparse_flash_attention(_Q, _Q, _Q, _BM, 0),
        ("block_sparse_flash_attention", "block_size")),
    Bad("block_sparse_flash_attention", "wrong-shape", lambda: block_sparse_flash_attention(
        _Q, _Q, _Q, torch.ones(2, 2, dtype=torch.bool), 8), ("block_sparse_flash_attention", "block_mask")),
    Bad("block_sparse_flash_attention", "wrong-dtype", lambda: block_sparse_flash_attention(
        _Q, _Q, _Q, torch.ones(1, 1), 8), ("block_sparse_flash_attention", "block_mask")),
    Bad("select_backend", "out-of-range", lambda: select_backend(_Q, "auto", kernel="decode"),
        ("select_backend", "kernel")),
    Bad("select_backend", "integer-dtype", lambda: select_backend(_Q.long(), "torch"), ("select_backend", "q")),
    # what the Triton kernels cannot take, refused by the entry point (the launchers trust it)
    Bad("flash_attention", "integer-dtype", lambda: flash_attention(_QT.long(), _QT.long(), _QT.long(), **_TRITON),
        ("flash_attention", "q")),
    Bad("flash_attention", "nan", lambda: flash_attention(_QT, _QT, _QT, softcap=float("nan"), **_TRITON),
        ("flash_attention", "softcap")),
    Bad("flash_attention", "wrong-dtype", lambda: flash_attention(_QT.double(), _QT.double(), _QT.double(),
                                                                  **_TRITON), ("flash_attention", "float64")),
    Bad("flash_attention", "out-of-range", lambda: flash_attention(*(torch.zeros(1, 1, 2, 264),) * 3, **_TRITON),
        ("flash_attention", "head_dim of q")),
    Bad("flash_attention", "zero", lambda: flash_attention(_QT[..., :0], _QT[..., :0], _QT, scale=1.0, **_TRITON),
        ("flash_attention", "head_dim of q")),
    Bad("block_sparse_flash_attention", "zero", lambda: block_sparse_flash_attention(_QT, _QT, _QT, _BM, 0, **_TRITON),
        ("block_sparse_flash_attention", "block_size")),
    Bad("block_sparse_flash_attention", "non-integer",
        lambda: block_sparse_flash_attention(_QT, _QT, _QT, _BM, 16.0, **_TRITON),
        ("block_sparse_flash_attention", "block_size")),
    Bad("block_sparse_flash_attention", "out-of-range",
        lambda: block_sparse_flash_attention(_QT, _QT, _QT, torch.ones(2, 2, dtype=torch.bool), 12, **_TRITON),
        ("block_sparse_flash_attention", "block_size", "power of two")),
    Bad("block_sparse_flash_attention", "wrong-shape", lambda: block_sparse_flash_attention(
        _QT, _QT, _QT, torch.ones(2, 2, dtype=torch.bool), 16, **_TRITON), ("block_sparse_flash_attention", "block_mask")),
    Bad("block_sparse_flash_attention", "negative",
        lambda: block_sparse_flash_attention(_QT, _QT, _QT, _BM, -16, **_TRITON),
        ("block_sparse_flash_attention", "block_size")),
    Bad("flash_attention_varlen", "wrong-dtype",
        lambda: flash_attention_varlen(_P, _P, _P, _CUT.long(), _CUT, 8, 8, **_TRITON),
        ("flash_attention_varlen", "cu_seqlens_q")),
    Bad("flash_attention_varlen", "integer-dtype",
        lambda: flash_attention_varlen(_P.long(), _P.long(), _P.long(), _CUT, _CUT, 8, 8, **_TRITON),
        ("flash_attention_varlen", "q")),
    Bad("flash_attention_varlen", "out-of-range",
        lambda: flash_attention_varlen(*(torch.zeros(8, 2, 300),) * 3, _CUT, _CUT, 8, 8, **_TRITON),
        ("flash_attention_varlen", "head_dim of q")),
    # decode_attention
    Bad("decode_attention", "integer-dtype", lambda: decode_attention(_QD.int(), _KC.int(), _VC.int(), _LENS),
        ("decode_attention", "q")),
    Bad("decode_attention", "zero", lambda: _decode_torch(num_splits=0), ("decode_attention", "num_splits")),
    Bad("decode_attention", "negative", lambda: _decode_torch(num_splits=-1), ("decode_attention", "num_splits")),
    Bad("decode_attention", "non-integer", lambda: _decode_torch(num_splits=1.5), ("decode_attention", "num_splits")),
    Bad("decode_attention", "nan", lambda: _decode_torch(scale=float("nan")), ("decode_attention", "scale")),
    Bad("decode_attention", "wrong-type", lambda: _decode_torch(backend="cuda"), ("decode_attention", "backend")),
    Bad("decode_attention", "boolean", lambda: _decode_torch(return_backend="yes"), ("decode_attention", "return_backend")),
    Bad("decode_attention", "out-of-range", lambda: decode_attention(_QD, _KC, _VC, torch.tensor([9, 1])),
        ("decode_attention", "cache_seqlens")),
    Bad("decode_attention", "zero", lambda: decode_attention(_QD, _KC[:, :0], _VC[:, :0], _LENS),
        ("decode_attention", "k_cache", "kv_heads", "(2, 0, 8, 4)")),
    Bad("decode_attention", "zero", lambda: decode_attention(_QD, _KC[:, :0], _VC[:, :0], _LENS, backend="triton"),
        ("decode_attention", "k_cache", "kv_heads")),
    # CacheFullError is an exception class
    Bad("decode_attention", "integer-dtype",
        lambda: decode_attention(_QD.long(), _KC.long(), _VC.long(), _LENS, **_TRITON), ("decode_attention", "q")),
    Bad("decode_attention", "out-of-range", lambda: _decode_triton(num_splits=1000),
        ("decode_attention", "num_splits", "128")),
    Bad("decode_attention", "non-integer", lambda: _decode_triton(num_splits=2.0), ("decode_attention", "num_splits")),
    Bad("decode_attention", "wrong-dtype", lambda: decode_attention(_QD, _KC, _VC, _LENS.float(), **_TRITON),
        ("decode_attention", "cache_seqlens")),
    Bad("decode_attention", "out-of-range", lambda: decode_attention(
        torch.zeros(1, 1, 1, 264), *(torch.zeros(1, 1, 4, 264),) * 2, torch.tensor([4]), **_TRITON),
        ("decode_attention", "head_dim of q")),
]

EXEMPT: dict[str, str] = {}
