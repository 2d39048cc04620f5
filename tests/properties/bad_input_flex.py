"""Bad-input rows of attnbook.flex (see tests/properties/test_bad_input.py)."""

from __future__ import annotations

import torch
from test_bad_input import Bad, Edge

from attnbook.flex import (
    alibi_score_mod,
    block_mask_mod,
    causal_mask_mod,
    chain_score_mods,
    document_ids,
    document_mask,
    flex_block_mask,
    flex_reference,
    global_mask_mod,
    longformer_mask_mod,
    sliding_window_mask_mod,
    softcap_score_mod,
    t5_score_mod,
    window_size_mask_mod,
)

_G = torch.Generator().manual_seed(0)
_Q, _K, _V = (torch.randn(1, 2, 6, 4, generator=_G) for _ in range(3))
_BM = torch.ones(2, 2, dtype=torch.bool)
_NAN = float("nan")

ROWS = [
    Bad("causal_mask_mod", "non-integer", lambda: causal_mask_mod(2.5), ("causal_mask_mod", "L")),
    Bad("causal_mask_mod", "negative", lambda: causal_mask_mod(4, -1), ("causal_mask_mod", "S")),
    Bad("sliding_window_mask_mod", "non-integer", lambda: sliding_window_mask_mod(1.5), ("sliding_window_mask_mod", "window")),
    Bad("sliding_window_mask_mod", "zero", lambda: sliding_window_mask_mod(2, dilation=0),
        ("sliding_window_mask_mod", "dilation")),
    Bad("sliding_window_mask_mod", "wrong-type", lambda: sliding_window_mask_mod(2, is_causal="no"),
        ("sliding_window_mask_mod", "is_causal")),
    Bad("sliding_window_mask_mod", "wrong-shape", lambda: sliding_window_mask_mod(2, L=4),
        ("sliding_window_mask_mod", "L and S")),
    Bad("window_size_mask_mod", "out-of-range", lambda: window_size_mask_mod((-2, 0), 4),
        ("window_size_mask_mod", "window_size")),
    Bad("window_size_mask_mod", "wrong-shape", lambda: window_size_mask_mod((1, 2, 3), 4),
        ("window_size_mask_mod", "window_size")),
    Bad("window_size_mask_mod", "non-integer", lambda: window_size_mask_mod((1, 1), 4.5),
        ("window_size_mask_mod", "L")),
    Bad("global_mask_mod", "non-integer", lambda: global_mask_mod(8, [0.5]), ("global_mask_mod", "global_idx")),
    Bad("global_mask_mod", "boolean", lambda: global_mask_mod(4, torch.tensor([True, False, False, True])),
        ("global_mask_mod", "global_idx")),
    Bad("global_mask_mod", "out-of-range", lambda: global_mask_mod(8, [0, 8]), ("global_mask_mod", "global_idx")),
    Bad("global_mask_mod", "zero", lambda: global_mask_mod(0, []), ("global_mask_mod", "seq_len")),
    Bad("longformer_mask_mod", "non-integer", lambda: longformer_mask_mod(8, 2, [1.5]), ("longformer_mask_mod", "global_idx")),
    Bad("longformer_mask_mod", "negative", lambda: longformer_mask_mod(8, -1, [1]), ("longformer_mask_mod", "window")),
    Bad("longformer_mask_mod", "boolean", lambda: longformer_mask_mod(4, 1, torch.ones(4, dtype=torch.bool)),
        ("longformer_mask_mod", "global_idx")),
    Bad("block_mask_mod", "wrong-dtype", lambda: block_mask_mod(_BM.float(), 4), ("block_mask_mod", "block_mask")),
    Bad("block_mask_mod", "zero", lambda: block_mask_mod(_BM, 0), ("block_mask_mod", "block_size")),
    Bad("block_mask_mod", "wrong-shape", lambda: block_mask_mod(_BM[0], 4), ("block_mask_mod", "block_mask")),
    Bad("flex_block_mask", "non-integer", lambda: flex_block_mask(_BM, 2.5), ("flex_block_mask", "block_size")),
    Bad("flex_block_mask", "wrong-shape", lambda: flex_block_mask(_BM, 4, 20, 8), ("flex_block_mask", "block_mask")),
    Bad("document_ids", "non-integer", lambda: document_ids([0.0, 2.0]), ("document_ids", "cu_seqlens")),
    Bad("document_ids", "out-of-range", lambda: document_ids([1, 3]), ("document_ids", "cu_seqlens")),
    Bad("document_ids", "negative", lambda: document_ids([0, 3, 2]), ("document_ids", "cu_seqlens")),
    Bad("document_ids", "empty", lambda: document_ids([]), ("document_ids", "cu_seqlens")),
    Bad("document_mask", "boolean", lambda: document_mask(torch.ones(4, dtype=torch.bool)), ("document_mask", "doc_ids")),
    Bad("document_mask", "wrong-shape", lambda: document_mask(torch.zeros(2, 2, dtype=torch.long)),
        ("document_mask", "doc_ids")),
    Bad("document_mask", "wrong-type", lambda: document_mask(torch.zeros(4, dtype=torch.long), is_causal="yes"),
        ("document_mask", "is_causal")),
    Bad("alibi_score_mod", "zero", lambda: alibi_score_mod(0, 4), ("alibi_score_mod", "n_heads")),
    Bad("alibi_score_mod", "non-integer", lambda: alibi_score_mod(2, 4.0), ("alibi_score_mod", "L")),
    Bad("t5_score_mod", "wrong-type", lambda: t5_score_mod(torch.nn.Linear(2, 2), 4), ("t5_score_mod", "module")),
    Bad("softcap_score_mod", "nan", lambda: softcap_score_mod(_NAN), ("softcap_score_mod", "softcap")),
    Bad("softcap_score_mod", "zero", lambda: softcap_score_mod(0.0), ("softcap_score_mod", "softcap")),
    Bad("softcap_score_mod", "boolean", lambda: softcap_score_mod(True), ("softcap_score_mod", "softcap")),
    Bad("chain_score_mods", "wrong-type", lambda: chain_score_mods(softcap_score_mod(5.0), 3),
        ("chain_score_mods", "score_mod")),
    Bad("flex_reference", "integer-dtype", lambda: flex_reference(_Q.long(), _K.long(), _V.long()),
        ("flex_reference", "q")),
    Bad("flex_reference", "nan", lambda: flex_reference(_Q, _K, _V, scale=_NAN), ("flex_reference", "scale")),
    Bad("flex_reference", "wrong-type", lambda: flex_reference(_Q, _K, _V, mask_mod=_BM), ("flex_reference", "mask_mod")),
    Edge("flex_reference", "empty", lambda: flex_reference(_Q[:, :, :0], _K, _V), lambda out: out.shape == (1, 2, 0, 4)),
]
EXEMPT: dict[str, str] = {}
