"""Bad-input rows of attnbook.complexity (see tests/properties/test_bad_input.py)."""

from __future__ import annotations

import torch
from test_bad_input import Bad

from attnbook.complexity import (
    ReversibleBlock,
    attention_flops,
    attention_memory_bytes,
    crossover_length,
    loglog_slope,
    measure,
    reversible_stack,
    rnn_flops,
    saved_activation_bytes,
    vaswani_table1,
)

_X = torch.zeros(1, 2)


def _block():
    return ReversibleBlock(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))


ROWS = [
    Bad("attention_flops", "non-integer", lambda: attention_flops(8.5, 16), ("attention_flops", "seq_len")),
    Bad("attention_flops", "zero", lambda: attention_flops(8, 16, n_heads=0), ("attention_flops", "n_heads")),
    Bad("attention_flops", "boolean", lambda: attention_flops(True, 16), ("attention_flops", "seq_len")),
    Bad("attention_flops", "out-of-range", lambda: attention_flops(8, 16, n_heads=3), ("attention_flops", "n_heads")),
    Bad("attention_flops", "negative", lambda: attention_flops(8, 16, kv_len=-1), ("attention_flops", "kv_len")),
    Bad("LayerComplexity.evaluate", "zero", lambda: vaswani_table1()[3].evaluate(8, 16, r=0),
        ("LayerComplexity.evaluate", "r")),
    Bad("LayerComplexity.evaluate", "zero", lambda: vaswani_table1()[2].evaluate(0, 16), ("LayerComplexity.evaluate", "n")),
    Bad("LayerComplexity.evaluate", "out-of-range", lambda: vaswani_table1()[2].evaluate(8, 16, k=1),
        ("LayerComplexity.evaluate", "k")),
    Bad("LayerComplexity.evaluate", "negative", lambda: vaswani_table1()[0].evaluate(8, -16),
        ("LayerComplexity.evaluate", "d")),
    Bad("LayerComplexity.evaluate", "non-integer", lambda: vaswani_table1()[1].evaluate(8.5, 16),
        ("LayerComplexity.evaluate", "n")),
    Bad("LayerComplexity.evaluate", "boolean", lambda: vaswani_table1()[2].evaluate(8, 16, k=True),
        ("LayerComplexity.evaluate", "k")),
    Bad("rnn_flops", "zero", lambda: rnn_flops(0, 8), ("rnn_flops", "seq_len")),
    Bad("rnn_flops", "non-integer", lambda: rnn_flops(4, 8.5), ("rnn_flops", "hidden")),
    Bad("attention_memory_bytes", "non-integer", lambda: attention_memory_bytes(8, bytes_per_elem=2.5),
        ("attention_memory_bytes", "bytes_per_elem")),
    Bad("attention_memory_bytes", "negative", lambda: attention_memory_bytes(-8), ("attention_memory_bytes", "seq_len")),
    Bad("crossover_length", "non-integer", lambda: crossover_length(64.0), ("crossover_length", "d_model")),
    Bad("crossover_length", "zero", lambda: crossover_length(0), ("crossover_length", "d_model")),
    Bad("measure", "zero", lambda: measure(torch.ones, 2, repeat=0), ("measure", "repeat")),
    Bad("measure", "non-integer", lambda: measure(torch.ones, 2, repeat=2.5), ("measure", "repeat")),
    Bad("measure", "negative", lambda: measure(torch.ones, 2, warmup=-1), ("measure", "warmup")),
    Bad("measure", "wrong-type", lambda: measure("torch.ones", 2), ("measure", "fn")),
    Bad("loglog_slope", "nan", lambda: loglog_slope([1, 2, 4], [1, float("nan"), 16]), ("loglog_slope", "x and y")),
    Bad("loglog_slope", "empty", lambda: loglog_slope([], []), ("loglog_slope", "x and y")),
    Bad("loglog_slope", "negative", lambda: loglog_slope([1, 2], [-1, 2]), ("loglog_slope", "x and y")),
    Bad("loglog_slope", "wrong-type", lambda: loglog_slope("abc", [1, 2, 3]), ("loglog_slope", "x and y")),
    Bad("loglog_slope", "wrong-shape", lambda: loglog_slope([1, 2, 3], [1, 2]), ("loglog_slope", "x and y")),
    Bad("saved_activation_bytes", "wrong-type", lambda: saved_activation_bytes(None, _X), ("saved_activation_bytes", "fn")),
    Bad("saved_activation_bytes", "wrong-type", lambda: saved_activation_bytes(torch.sin, _X, exclude=_X),
        ("saved_activation_bytes", "exclude")),
    Bad("ReversibleBlock", "wrong-type", lambda: ReversibleBlock(torch.sin, torch.nn.Linear(2, 2)),
        ("ReversibleBlock", "f")),
    Bad("reversible_stack", "empty", lambda: reversible_stack([], _X, _X), ("reversible_stack", "blocks")),
    Bad("reversible_stack", "wrong-type", lambda: reversible_stack([torch.nn.Linear(2, 2)], _X, _X),
        ("reversible_stack", "blocks")),
    Bad("reversible_stack", "integer-dtype", lambda: reversible_stack([_block()], _X.long(), _X),
        ("reversible_stack", "x1")),
]
EXEMPT = {
    "SOFTMAX_FLOPS_PER_ELEMENT": "a constant",
    "vaswani_table1": "takes no argument (its rows' evaluate has rows under LayerComplexity.evaluate)",
}
