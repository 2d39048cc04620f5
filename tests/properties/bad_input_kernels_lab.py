"""Bad-input rows of attnbook.kernels.lab (see tests/properties/test_bad_input.py)."""

from __future__ import annotations

import torch
import triton
from test_bad_input import Bad

import attnbook.kernels.lab as lab

_X = torch.ones(3, 5)
_Q = torch.ones(20, 16)
_LAYOUT = torch.ones(2, 2, dtype=torch.bool)


@triton.jit
def _copy(X, Y):  # a kernel never launched: the bad inputs are refused before
    pass


def _kernel():
    return _copy


ROWS = [
    Bad("softmax", "wrong-type", lambda: lab.softmax(print, _X), ("softmax", "kernel")),
    Bad("softmax", "integer-dtype", lambda: lab.softmax(_kernel(), torch.ones(3, 5, dtype=torch.int64)),
        ("softmax", "x")),
    Bad("softmax", "wrong-shape", lambda: lab.softmax(_kernel(), torch.ones(5)), ("softmax", "x")),
    Bad("softmax", "empty", lambda: lab.softmax(_kernel(), torch.ones(0, 5)), ("softmax", "x")),
    Bad("matmul", "wrong-shape", lambda: lab.matmul(_kernel(), torch.ones(3, 4), torch.ones(5, 2)),
        ("matmul", "a (M, K)", "b (K, N)")),
    Bad("matmul", "wrong-dtype", lambda: lab.matmul(_kernel(), torch.ones(3, 4), torch.ones(4, 2).half()),
        ("matmul", "dtype")),
    Bad("attention_forward", "out-of-range", lambda: lab.attention_forward(_kernel(), *[torch.ones(4, 24)] * 3),
        ("attention_forward", "head dim", "q")),
    Bad("attention_forward", "wrong-shape",
        lambda: lab.attention_forward(_kernel(), _Q, torch.ones(7, 32), torch.ones(7, 32)),
        ("attention_forward", "k", "16 columns")),
    Bad("attention_forward", "wrong-dtype",
        lambda: lab.attention_forward(_kernel(), _Q, _Q.half(), _Q.half()), ("attention_forward", "k")),
    Bad("attention_forward", "wrong-type", lambda: lab.attention_forward(_kernel(), _Q, _Q, _Q, "yes"),
        ("attention_forward", "is_causal")),
    Bad("attention_forward", "negative", lambda: lab.attention_forward(_kernel(), _Q, _Q, _Q, scale=-1.0),
        ("attention_forward", "scale")),
    Bad("attention_backward", "wrong-shape",
        lambda: lab.attention_backward(_kernel(), _Q, _Q, _Q, _Q, torch.zeros(3), _Q),
        ("attention_backward", "lse")),
    Bad("attention_backward", "wrong-shape",
        lambda: lab.attention_backward(_kernel(), _Q, _Q, _Q, torch.ones(5, 16), torch.zeros(20), _Q),
        ("attention_backward", "out")),
    Bad("block_sparse_forward", "wrong-dtype",
        lambda: lab.block_sparse_forward(_kernel(), _Q, _Q, _Q, _LAYOUT.int()), ("block_sparse_forward", "layout")),
    Bad("block_sparse_forward", "wrong-shape",
        lambda: lab.block_sparse_forward(_kernel(), _Q, _Q, _Q, torch.ones(3, 3, dtype=torch.bool)),
        ("block_sparse_forward", "layout")),
    Bad("LoadRecord.rows", "out-of-range", lambda: lab.LoadRecord({"K": _Q}).rows("Q"), ("LoadRecord.rows", "name")),
    Bad("LoadRecord.tiles", "zero", lambda: lab.LoadRecord({"K": _Q}).tiles("K", 0), ("LoadRecord.tiles", "block")),
    Bad("record_loads", "wrong-type", lambda: lab.record_loads(K=[1, 2]).__enter__(), ("record_loads", "K")),
    Bad("record_loads", "empty", lambda: lab.record_loads().__enter__(), ("record_loads", "tensor")),
    Bad("plot_loads", "wrong-type", lambda: lab.plot_loads({"K": 1}), ("plot_loads", "record")),
    Bad("plot_loads", "out-of-range", lambda: lab.plot_loads(lab.LoadRecord({"K": _Q}), names=("Q",)),
        ("plot_loads", "names")),
    Bad("plot_loads", "empty", lambda: lab.plot_loads(lab.LoadRecord({"K": _Q}), names=("K",)),
        ("plot_loads", "record")),
    Bad("define_kernels", "wrong-type", lambda: lab.define_kernels(b"x = 1"), ("define_kernels", "source")),
    Bad("compile_report", "wrong-type", lambda: lab.compile_report(print, {}), ("compile_report", "kernel")),
    Bad("compile_report", "wrong-type", lambda: lab.compile_report(_kernel(), [1]), ("compile_report", "constexprs")),
    Bad("compile_report", "out-of-range", lambda: lab.compile_report(_kernel(), {}, targets=(70,)),
        ("compile_report", "targets")),
    Bad("compile_report", "wrong-dtype", lambda: lab.compile_report(_kernel(), {}, torch.int8),
        ("compile_report", "dtype")),
    Bad("format_report", "wrong-type", lambda: lab.format_report("report"), ("format_report", "resources")),
    Bad("time_forward", "zero", lambda: lab.time_forward(_kernel(), seq_len=0), ("time_forward", "seq_len")),
    Bad("time_forward", "wrong-type", lambda: lab.time_forward(_kernel(), is_causal=None), ("time_forward", "is_causal")),
    Bad("cost_report", "wrong-type", lambda: lab.cost_report(print, _kernel()), ("cost_report", "launcher")),
    Bad("cost_report", "out-of-range", lambda: lab.cost_report(lab.plot_loads, _kernel()), ("cost_report", "launcher")),
    Bad("cost_report", "wrong-type", lambda: lab.cost_report(lab.softmax, print), ("cost_report", "kernel")),
    Bad("cost_report", "wrong-dtype", lambda: lab.cost_report(lab.softmax, _kernel(), torch.int8),
        ("cost_report", "dtype")),
]  # fmt: skip

EXEMPT = {
    "BLOCK": "a constant: the launchers' tile",
    "LAB_TARGETS": "a constant: the GPUs the compile report names",
    "GPU_CONSTEXPRS": "a constant: the tiles cost_report compiles each launcher's kernel with",
    "variants": "the compile worker's hook, called by attnbook.kernels.compile with a kernel's source",
    "interpreting": "a context manager that takes no argument",
}
