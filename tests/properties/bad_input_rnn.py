"""Bad-input rows for attnbook.rnn (see tests/properties/test_bad_input.py): the cases of
``test_rnn.BAD_INPUTS``, each with its class of wrong input and the argument its message
names, plus a few more classes."""

import torch
from test_bad_input import Bad, Edge
from test_rnn import BAD_INPUTS

from attnbook import rnn

_Q, _K = torch.randn(2, 4), torch.randn(2, 3, 6)

# (class of wrong input, argument the message names) for each BAD_INPUTS entry, in order
_TABLE = [
    ("zero", "query_dim"), ("negative", "hidden_dim"), ("non-integer", "key_dim"), ("zero", "query_dim"),
    ("zero", "hidden_dim"), ("wrong-type", "method"), ("zero", "window"), ("negative", "window"),
    ("non-integer", "window"), ("boolean", "window"), ("zero", "hidden_dim"), ("wrong-type", "mode"),
    ("zero", "n_filters"), ("out-of-range", "kernel_size"), ("negative", "kernel_size"), ("zero", "hidden_dim"),
    ("out-of-range", "src_vocab"), ("zero", "tgt_vocab"), ("zero", "hidden"), ("negative", "emb_dim"),
    ("zero", "window"), ("negative", "coverage_weight"), ("wrong-type", "attention"),
    ("wrong-shape", "query"), ("wrong-shape", "keys"), ("integer-dtype", "keys"), ("wrong-dtype", "query"),
    ("wrong-dtype", "key_padding_mask"), ("wrong-shape", "key_padding_mask"), ("wrong-shape", "coverage"),
    ("wrong-shape", "keys_proj"), ("wrong-shape", "key_padding_mask"), ("wrong-type", "step"),
    ("negative", "step"), ("non-integer", "step"), ("wrong-shape", "keys"), ("wrong-shape", "lengths"),
    ("wrong-shape", "prev_weights"), ("wrong-shape", "queries"),
    ("wrong-shape", "coverage"), ("wrong-type", "weights"), ("wrong-shape", "weights"), ("wrong-shape", "weights"),
    ("wrong-shape", "tgt_mask"), ("wrong-shape", "tgt_mask"), ("wrong-dtype", "tgt_mask"), ("empty", "weights"),
    ("wrong-shape", "alignment"), ("negative", "steps"), ("zero", "batch_size"), ("zero", "lr"),
    ("wrong-type", "attention"),
    ("out-of-range", "src"), ("out-of-range", "src"), ("wrong-dtype", "src"), ("out-of-range", "tgt_in"),
    ("wrong-dtype", "src_mask"), ("wrong-shape", "src_mask"), ("empty", "src_mask"), ("empty", "src"),
    ("empty", "src"), ("empty", "tgt_in"), ("wrong-shape", "tgt_in"), ("wrong-shape", "embedded"),
    ("wrong-dtype", "embedded"), ("negative", "max_len"), ("out-of-range", "src"), ("zero", "beam_size"),
    ("negative", "beam_size"), ("non-integer", "beam_size"), ("negative", "max_len"), ("empty", "src"),
    ("wrong-type", "batch"), ("wrong-shape", "batch['tgt']"), ("empty", "batch['tgt']"),
    ("out-of-range", "batch['tgt']"), ("wrong-type", "model"),
    ("zero", "epochs"), ("zero", "batch_size"), ("negative", "lr"), ("zero", "grad_clip"),
    ("empty", "pairs"), ("zero", "batch_size"), ("wrong-shape", "batch['src_mask']"),
    ("wrong-shape", "norms"), ("empty", "norms"),
]  # fmt: skip
assert len(_TABLE) == len(BAD_INPUTS), "test_rnn.BAD_INPUTS changed: update _TABLE"


def _function(pattern: str) -> str:
    """The function the message names: the pattern before its first colon, unescaped."""
    return pattern.split(":")[0].replace("\\", "")


ROWS = [
    Bad(_function(pattern).split(".")[0], what, call, (_function(pattern), argument), error)
    for (what, argument), (call, error, pattern) in zip(_TABLE, BAD_INPUTS)
] + [
    Bad("BahdanauAttention", "boolean", lambda: rnn.BahdanauAttention(True, 6, 5), ("BahdanauAttention", "query_dim")),
    Bad("LuongAttention", "integer-dtype", lambda: rnn.LuongAttention(4, 6, method="general")(_Q, _K.long()),
        ("LuongAttention.forward", "keys")),
    Bad("coverage_loss", "integer-dtype", lambda: rnn.coverage_loss(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3)),
        ("coverage_loss", "weights")),
    Edge("BahdanauAttention", "empty", lambda: rnn.BahdanauAttention(4, 6, 5)(_Q, _K[:, :0]),
         lambda r: not r[0].any() and r[0].shape == (2, 6)),
]  # fmt: skip

EXEMPT = {"Decoded": "a NamedTuple of results that the decoders return"}
