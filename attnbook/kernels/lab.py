"""The kernel lab's bench: launchers for the five kernels a student writes in Triton
(Tillet et al., 2019), a recorder of the tiles each program loads, and what a kernel
would cost on named GPUs.

* **Launchers.** :func:`softmax`, :func:`matmul`, :func:`attention_forward`,
  :func:`attention_backward` and :func:`block_sparse_forward` take the student's
  ``@triton.jit`` kernel first, allocate the outputs, choose the grid and launch it:
  compiled on a CUDA GPU with exact float32 products (not TF32), in Triton's
  interpreter on CPU tensors otherwise, whether or not ``TRITON_INTERPRET`` was set
  when the kernel was defined (:func:`interpreting`), so a student never has to know
  about it. Outputs are allocated inside a guard band of NaN (rows before and after,
  and a row stride no other tensor of the launch has): a kernel whose stores leave
  the output is caught. In the interpreter every load must stay inside the tensors
  and every store inside the outputs, or the launch says where and why (a ragged
  tile not masked, an offset gone negative, another tensor's row stride); with
  ``record_tiles`` the attention launchers and :func:`matmul` also report each
  program's work: the tiles it loaded and the ``tl.dot`` calls it ran on each.
* **Recorder.** :func:`record_loads` watches the interpreter's loads and tells, per
  program instance, which rows of each named tensor it read; :func:`plot_loads` draws
  them, one panel per program.
* **Cost.** :func:`compile_report` compiles a kernel for a T4, an A100 and an H100
  without a GPU, with :mod:`attnbook.kernels.compile`'s worker (once per kernel source,
  tiles and dtype in a process), and :func:`format_report` says in plain words whether
  it launches and spills. :func:`time_forward` times an attention kernel against
  PyTorch's SDPA on a GPU. :func:`cost_report` puts them together for a launcher's
  kernel with the tiles of :data:`GPU_CONSTEXPRS`: what the lab's checks print after a
  pass.

Importing this module on a machine without a CUDA GPU turns on Triton's interpreter
when ``triton`` is not imported yet: the lab's chapter imports it first.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

if not torch.cuda.is_available() and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ..contract import check_flag, check_float, check_int  # noqa: E402
from ._compat import mend_interpreter  # noqa: E402

mend_interpreter()  # older Triton interpreters and NumPy 2.5: see _compat

__all__ = [
    "BLOCK",
    "LAB_TARGETS",
    "softmax",
    "matmul",
    "attention_forward",
    "attention_backward",
    "block_sparse_forward",
    "interpreting",
    "define_kernels",
    "LoadRecord",
    "record_loads",
    "plot_loads",
    "variants",
    "compile_report",
    "format_report",
    "time_forward",
    "GPU_CONSTEXPRS",
    "cost_report",
]

#: The tile the launchers ask for (16 rows, the smallest ``tl.dot`` takes).
BLOCK = 16
#: The GPUs the compile report names (T4 = sm75, A100 = sm80, H100 = sm90).
LAB_TARGETS = (75, 80, 90)
_GUARD = 16  # rows of NaN before and after every output, and columns at least


# --------------------------------------------------------------------------------------
# Launching a student's kernel
# --------------------------------------------------------------------------------------
def _runnable(kernel, fn: str):
    """The kernel, checked: a ``@triton.jit`` function, and not the exercise's stub
    (``raise NotImplementedError``), which is reported as not attempted."""
    python = getattr(kernel, "fn", None)
    if python is None or not callable(python):
        raise TypeError(
            f"{fn}: kernel must be a @triton.jit function, got {type(kernel).__name__}"
        )
    if "NotImplementedError" in python.__code__.co_names:
        raise NotImplementedError("the kernel is still the exercise's stub")
    return kernel


_INTERPRETING = [0]  # depth of the open interpreting() blocks


def _device() -> torch.device:
    """Where the launchers run a kernel: the GPU when there is one, the CPU (Triton's
    interpreter) otherwise and inside :func:`interpreting`."""
    gpu = torch.cuda.is_available() and not _INTERPRETING[0]
    return torch.device("cuda" if gpu else "cpu")


@contextlib.contextmanager
def interpreting() -> Iterator[None]:
    """Within this block every Triton kernel launched on CPU tensors runs in Triton's
    interpreter, on any machine, and the launchers here run on the CPU.

    Where a GPU is present the interpreter is off, so ``@triton.jit`` made compiled
    kernels (:mod:`attnbook.kernels.flash_triton`'s, or a student's); inside the block
    a launch whose tensors are all on the CPU runs an interpreted twin of the kernel
    instead, its ``@triton.jit`` helpers included. That is how :func:`record_loads`
    sees the loads of a GPU machine's kernels, and how a check measures the tiles a
    kernel visits the same way everywhere.
    """
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    twins: dict[int, InterpretedFunction] = {}  # by id: hashing a JITFunction parses it

    def twin(jitted):
        if id(jitted) not in twins:
            twins[id(jitted)] = InterpretedFunction(jitted.fn)
        return twins[id(jitted)]

    def on_gpu(args, kwargs) -> bool:
        values = list(args) + list(kwargs.values())
        return any(isinstance(a, torch.Tensor) and a.is_cuda for a in values)

    run, call = JITFunction.run, JITFunction.__call__

    def interpreted_run(self, *args, grid, warmup, **kwargs):
        if on_gpu(args, kwargs):
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)
        return twin(self).run(*args, grid=grid, warmup=warmup, **kwargs)

    def interpreted_call(self, *args, **kwargs):  # a @triton.jit helper in a kernel
        return twin(self)(*args, **kwargs)

    switch = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"  # the library's launchers take CPU tensors
    JITFunction.run, JITFunction.__call__ = interpreted_run, interpreted_call
    _INTERPRETING[0] += 1
    try:
        yield
    finally:
        _INTERPRETING[0] -= 1
        if not _INTERPRETING[0]:
            JITFunction.run, JITFunction.__call__ = run, call
            if switch is None:
                del os.environ["TRITON_INTERPRET"]
            else:
                os.environ["TRITON_INTERPRET"] = switch


def _row_stride(cols: int, taken: set[int]) -> int:
    """A row stride for a tensor of ``cols`` columns: ``cols`` plus 16 to 47 columns of
    guard band, drawn (seeded by ``taken``, so one launch repeats) among the strides no
    tensor of the launch has yet; it joins ``taken``. A kernel that walks one tensor
    with another's row stride then leaves it."""
    draw = random.Random(hash((cols, *sorted(taken))))
    while True:
        width = cols + draw.randrange(_GUARD, 3 * _GUARD)
        if width not in taken:
            taken.add(width)
            return width


def _guarded(
    rows: int, cols: int | None, dtype: torch.dtype, taken: set[int] | None = None
) -> torch.Tensor:
    """A ``(rows, cols)`` tensor (``(rows,)`` for ``cols=None``) inside a NaN guard
    band: 16 rows before and after it and, for a matrix, a row stride of its own
    (:func:`_row_stride` among ``taken``). It reads as NaN until written."""
    device = _device()
    if cols is None:
        room = torch.full((rows + 2 * _GUARD,), math.nan, dtype=dtype, device=device)
        return room[_GUARD : _GUARD + rows]
    width = _row_stride(cols, set() if taken is None else taken)
    room = torch.full((rows + 2 * _GUARD, width), math.nan, dtype=dtype, device=device)
    return room[_GUARD : _GUARD + rows, :cols]


def _untouched(out: torch.Tensor, name: str) -> None:
    """Raise if the kernel stored anything into ``out``'s guard band (all of its
    buffer but its own elements)."""
    count = out.untyped_storage().nbytes() // out.element_size()
    whole = out.new_empty(0).set_(out.untyped_storage(), 0, (count,))
    index = torch.arange(count, device=out.device)
    inside = torch.zeros(count, dtype=torch.bool, device=out.device)
    inside[index.as_strided(out.shape, out.stride(), out.storage_offset())] = True
    if not torch.isnan(whole[~inside]).all():
        raise AssertionError(
            f"your kernel stored outside {name} {tuple(out.shape)}: mask the stores "
            "of the last, ragged tile (rows and columns past the end), and use "
            f"{name}'s own row stride (each tensor here has its own)."
        )


@contextlib.contextmanager
def _ieee_float32() -> Iterator[None]:
    """Compile with exact float32 products: on a GPU ``tl.dot`` on float32 tiles rounds
    its inputs to TF32 (10 mantissa bits) unless told otherwise, which no float32 check
    could tell from a bug. Triton reads ``TRITON_F32_DEFAULT`` when it compiles."""
    before = os.environ.get("TRITON_F32_DEFAULT")
    os.environ["TRITON_F32_DEFAULT"] = "ieee"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TRITON_F32_DEFAULT"]
        else:
            os.environ["TRITON_F32_DEFAULT"] = before


def _launch(kernel, grid, fn: str, *args, **constexprs) -> None:
    """Run ``kernel[grid](*args, **constexprs)``, float32 products exact as in the
    interpreter (:func:`_ieee_float32`); the interpreter's wrapper of an exception is
    taken off (a stub's ``NotImplementedError`` stays one)."""
    runnable = _runnable(kernel, fn)
    where = interpreting() if _device().type == "cpu" else contextlib.nullcontext()
    try:
        with where, _ieee_float32():
            runnable[grid](*args, **constexprs)
    except Exception as err:
        cause = err.__cause__
        if isinstance(cause, NotImplementedError):
            raise NotImplementedError(str(cause)) from None
        if cause is not None and type(err).__name__ == "InterpreterError":
            raise type(cause)(str(cause)) from None
        raise


@dataclass
class _Operand:
    """A tensor of one launch as the watch sees it: its name in the messages, the
    kernel's parameter for its row stride, and the masks its ragged tile needs."""

    name: str
    tensor: torch.Tensor
    stride: str | None = None  # e.g. "stride_k"
    rows_mask: str | None = None  # e.g. "keys < S"
    cols_mask: str | None = None
    output: bool = False

    def place(self, addresses):
        """Row, column and whether each address is one of the tensor's elements."""
        t = self.tensor
        size = t.element_size()
        offset = addresses - t.data_ptr()
        element, rest = np.divmod(offset, size)
        row, col = np.divmod(element, t.stride(0))
        if t.dim() == 1:
            inside = (rest == 0) & (col == 0) & (row >= 0) & (row < t.shape[0])
        else:
            inside = (rest == 0) & (row >= 0) & (row < t.shape[0]) & (col < t.shape[1])
        return row, col, inside

    def holds(self, address: int) -> bool:
        """Whether ``address`` lies in the tensor's buffer (its guard band included)."""
        start = self.tensor.untyped_storage().data_ptr()
        return start <= address < start + self.tensor.untyped_storage().nbytes()


class _Watch:
    """What Triton's interpreter does with one launch's tensors.

    Every load must read elements of the launch's tensors, and every store write
    elements of its outputs: anything else raises ``AssertionError`` saying where and
    why (a ragged tile not masked, a negative offset, another tensor's row stride).
    For the record, per program: how many loads of ``walked[0]`` touched each of its
    ``tiles`` tiles of :data:`BLOCK` rows (a lane let through), and how many
    ``tl.dot`` calls ran on each: a dot counts for the tiles of the program's latest
    load from a ``walked`` tensor, masked lanes included (a fully masked tile is still
    work when a dot runs on it), or for the column past the last tile when that load
    was past either end, or when there was none yet.
    """

    def __init__(self, operands, walked=(), tiles=0, programs=1):
        self.operands = list(operands)
        self.walked = tuple(walked)
        self.tiles = tiles
        self.loads = torch.zeros(programs, tiles, dtype=torch.int64)
        self.dots = torch.zeros(programs, tiles + 1, dtype=torch.int64)
        self.latest: dict[int, list[int]] = {}

    def record(self) -> dict[str, torch.Tensor]:
        return {"loads": self.loads.clone(), "dots": self.dots.clone()}

    # -- the interpreter's builder, wrapped ------------------------------------------
    def __enter__(self):
        from triton.runtime.interpreter import interpreter_builder as builder

        self.saved = {}
        for name, wrap in (("create_masked_load", self._load),
                           ("create_masked_store", self._store),
                           ("create_dot", self._dot)):  # fmt: skip
            self.saved[name] = builder.__dict__.get(name)  # a recorder around
            setattr(builder, name, wrap(getattr(builder, name)))
        return self

    def __exit__(self, *exc):
        from triton.runtime.interpreter import interpreter_builder as builder

        for name, outer in self.saved.items():
            if outer is None:
                delattr(builder, name)  # back to the class's method
            else:
                setattr(builder, name, outer)
        return False

    @staticmethod
    def _program() -> tuple[int, tuple[int, int, int]]:
        from triton.runtime.interpreter import interpreter_builder as builder

        (x, y, z), (_, gy, gz) = builder.grid_idx, builder.grid_dim
        return (x * gy + y) * gz + z, (x, y, z)

    def _load(self, original):
        def load(ptrs, mask, other, *args, **kwargs):
            addresses = ptrs.data.astype("int64")
            on = mask.data.astype(bool)
            self._inside(addresses, on, "loaded")
            self._walk(addresses, on)
            return original(ptrs, mask, other, *args, **kwargs)

        return load

    def _store(self, original):
        def store(ptrs, value, mask, *args, **kwargs):
            self._inside(ptrs.data.astype("int64"), mask.data.astype(bool), "stored")
            return original(ptrs, value, mask, *args, **kwargs)

        return store

    def _dot(self, original):
        def dot(*args, **kwargs):
            program, _ = self._program()
            for tile in self.latest.get(program, [self.tiles]):
                self.dots[program, tile] += 1
            return original(*args, **kwargs)

        return dot

    # -- what a load or a store touched ----------------------------------------------
    def _owner(self, address: int, among=None) -> _Operand | None:
        """The operand (of ``among``, by default all) whose buffer holds ``address``,
        else the one starting nearest below it."""
        among = self.operands if among is None else among
        for op in among:
            if op.holds(address):
                return op
        below = [op for op in among if op.tensor.data_ptr() <= address]
        return max(below, key=lambda op: op.tensor.data_ptr(), default=None)

    def _walk(self, addresses, on) -> None:
        owner = self._owner(int(addresses.min())) if addresses.size else None
        if owner is None or owner.name not in self.walked:
            return
        program, _ = self._program()
        row, _, _ = owner.place(addresses)
        tiles = np.unique(row // BLOCK)
        self.latest[program] = sorted(
            {int(t) if 0 <= t < self.tiles else self.tiles for t in tiles}
        )
        if owner.name == self.walked[0]:
            for tile in np.unique(row[np.broadcast_to(on, row.shape)] // BLOCK):
                if 0 <= tile < self.tiles:
                    self.loads[program, int(tile)] += 1

    def _inside(self, addresses, on, verb: str) -> None:
        on = np.broadcast_to(on, addresses.shape)
        live = addresses[on]
        if not live.size:
            return
        allowed = [op for op in self.operands if verb == "loaded" or op.output]
        ok = np.zeros(live.shape, dtype=bool)
        for op in allowed:
            ok |= op.place(live)[2]
        if ok.all():
            return
        bad = int(live[~ok][0])
        raise AssertionError(self._outside(bad, live, verb, allowed))

    def _outside(self, address: int, live, verb: str, allowed) -> str:
        """Where the lane at ``address`` went, and the likely reason."""
        from triton.runtime.interpreter import interpreter_builder as builder

        _, index = self._program()
        dims = sum(n > 1 for n in builder.grid_dim[1:]) + 1
        program = f"program {index[0]}" if dims == 1 else f"program {index[:dims]}"
        for owner in allowed:  # every lane in place, had it used the right stride
            other = self._stride_used(owner, live)
            if other is not None:
                t, name, step = owner.tensor, owner.name, other.tensor.stride(0)
                return (
                    f"your kernel {verb} outside {name} {tuple(t.shape)} ({program}): "
                    f"it steps {step} elements from one row of {name} to the next, "
                    f"{other.name}'s row stride ({other.stride}), but {name}'s rows "
                    f"are {t.stride(0)} apart: use {owner.stride} for {name} (each "
                    "tensor here has its own row stride)."
                )
        owner = self._walking(live, allowed) or self._owner(address, allowed)
        if owner is None:
            names = ", ".join(op.name for op in allowed)
            return (
                f"your kernel {verb} outside {names}: {program} {verb} an address "
                "before all of them."
            )
        t, name = owner.tensor, owner.name
        row, col, _ = (int(v[0]) for v in owner.place(np.array([address])))
        where = f"{name}[{row}]" if t.dim() == 1 else f"{name}[{row}, {col}]"
        shape = tuple(t.shape)
        head = f"your kernel {verb} outside {name} {shape} ({program}: {where})"
        if verb == "stored":
            return (
                f"{head}: mask the stores of the last, ragged tile (rows and columns "
                "past the end)."
            )
        gpu = " On a GPU such a load reads another tensor's memory, or faults."
        if row < 0:
            return (
                f"{head}: a row before the first, from an offset that went negative: "
                "start at 0 (tl.maximum(0, ...)) or mask those rows." + gpu
            )
        if row >= t.shape[0]:
            mask = f" with {owner.rows_mask}" if owner.rows_mask else ""
            return (
                f"{head}: the last, ragged tile read past the end of {name} "
                f"({t.shape[0]} rows): mask the load{mask} and other=0." + gpu
            )
        if t.dim() == 2 and col >= t.shape[1]:
            mask = f" with {owner.cols_mask}" if owner.cols_mask else ""
            return (
                f"{head}: row {row} of {name} read past its end ({t.shape[1]} "
                f"columns): mask the load{mask}, other=0." + gpu
            )
        return f"{head}: an address between its elements." + gpu

    @staticmethod
    def _walking(live, allowed) -> _Operand | None:
        """The matrix whose rows, with its own stride, hold every lane's column: the
        one an access walks, whichever buffer its rows fell into (an offset that went
        negative reaches below its guard band)."""
        for op in allowed:
            t = op.tensor
            if t.dim() == 2 and t.shape[1] > 1:
                element = (live - t.data_ptr()) // t.element_size()
                if (np.mod(element, t.stride(0)) < t.shape[1]).all():
                    return op
        return None

    def _stride_used(self, owner: _Operand, live) -> _Operand | None:
        """The operand whose row stride, taken for ``owner``'s, puts every lane of
        the access in ``owner``'s rows and columns, if there is one (the largest such
        stride: a multiple of a stride explains the lanes too)."""
        t = owner.tensor
        if t.dim() != 2 or owner.stride is None:
            return None
        element = (live - t.data_ptr()) // t.element_size()
        found = None
        for other in self.operands:
            step = other.tensor.stride(0) if other.tensor.dim() == 2 else None
            if other is owner or step is None or step == t.stride(0):
                continue
            row, col = np.divmod(element, step)
            if ((row >= 0) & (row < t.shape[0]) & (col < t.shape[1])).all():
                if found is None or step > found.tensor.stride(0):
                    found = other
        return found


@contextlib.contextmanager
def _watching(operands, walked=(), tiles=0, programs=1):
    """A ``_Watch`` of the launch's tensors while it runs in the interpreter (on the
    CPU); ``None`` where the kernel runs compiled."""
    if _device().type != "cpu":
        yield None
        return
    with _Watch(operands, walked, tiles, programs) as watch:
        yield watch


def _matrix(fn: str, name: str, t, columns: int | None = None) -> None:
    check_float(fn, name, t)
    if t.dim() != 2 or t.stride(-1) != 1 or t.shape[0] == 0:
        raise ValueError(
            f"{fn}: {name} must be a non-empty 2-D tensor whose rows are contiguous "
            f"(stride 1 along the last dim), got shape {tuple(t.shape)}, stride "
            f"{tuple(t.stride())}"
        )
    if columns is not None and t.shape[1] != columns:
        raise ValueError(
            f"{fn}: {name} must have {columns} columns, got shape {tuple(t.shape)}"
        )


def _moved(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` with its whole storage, so a view keeps its strides and the
    guard band around it (``Tensor.to`` would copy the view alone)."""
    if t.device == device:
        return t
    count = t.untyped_storage().nbytes() // t.element_size()
    whole = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (count,))
    return whole.to(device).as_strided(t.shape, t.stride(), t.storage_offset())


def _to_device(*tensors):
    return [_moved(t, _device()) if t is not None else None for t in tensors]


def _on_cpu(*tensors):
    return [_moved(t, torch.device("cpu")) for t in tensors]


def _check_softmax(kernel, x) -> None:
    _matrix("softmax", "x", x)


def softmax(kernel, x: torch.Tensor) -> torch.Tensor:
    """``softmax(x, dim=-1)`` of a ``(rows, cols)`` tensor by ``kernel``, one program
    per row.

    ``kernel(X, Y, n_cols, stride_x, stride_y, BLOCK: tl.constexpr)``: row ``r`` starts
    at ``X + r * stride_x`` (and ``Y + r * stride_y``), its ``n_cols`` entries are
    contiguous, and ``BLOCK`` is the power of two at or above ``n_cols``. Returns ``y``
    in ``x``'s dtype, on ``x``'s device.
    """
    _check_softmax(kernel, x)
    (xd,) = _to_device(x)
    rows, cols = x.shape
    y = _guarded(rows, cols, x.dtype, {xd.stride(0)})
    block = _next_power_of_2(cols)
    operands = [_Operand("x", xd, "stride_x", None, "cols < n_cols"),
                _Operand("y", y, "stride_y", output=True)]  # fmt: skip
    with _watching(operands):
        _launch(kernel, (rows,), "softmax", xd, y, cols, xd.stride(0), y.stride(0),
                BLOCK=block)  # fmt: skip
    _untouched(y, "y")
    return y.to(x.device)


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _check_matmul(kernel, a, b) -> None:
    _matrix("matmul", "a", a)
    _matrix("matmul", "b", b)
    if a.shape[1] != b.shape[0] or a.dtype != b.dtype:
        raise ValueError(
            f"matmul: a (M, K) and b (K, N) must share K and their dtype, got a "
            f"{tuple(a.shape)} {a.dtype} and b {tuple(b.shape)} {b.dtype}"
        )


def matmul(
    kernel, a: torch.Tensor, b: torch.Tensor, record_tiles: bool = False
) -> torch.Tensor | tuple[torch.Tensor, dict]:
    """``a @ b`` for ``a (M, K)`` and ``b (K, N)`` by ``kernel``, one program per
    ``BLOCK x BLOCK`` tile of the output, in ``a``'s dtype.

    ``kernel(A, B, C, M, N, K, stride_am, stride_bk, stride_cm, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr)``; rows are contiguous (the column
    stride is 1); program ``(i, j)`` computes ``C[i*BLOCK_M:, j*BLOCK_N:]``. With
    ``record_tiles=True`` it returns ``(c, record)``, the record of its steps along
    ``K`` (the tiles of ``b``'s rows) as in :func:`attention_forward`, programs in
    launch order (``i * tiles of N + j``).
    """
    _check_matmul(kernel, a, b)
    check_flag("matmul", "record_tiles", record_tiles)
    if record_tiles and _device().type == "cuda":
        c = matmul(kernel, a, b)
        with interpreting():
            _, record = matmul(kernel, *_on_cpu(a, b), record_tiles=True)
        return c, record
    ad, bd = _to_device(a, b)
    (M, K), N = a.shape, b.shape[1]
    c = _guarded(M, N, a.dtype, {ad.stride(0), bd.stride(0)})
    grid = (math.ceil(M / BLOCK), math.ceil(N / BLOCK))
    ragged_k = (f"ks < K (K = {K} is not a multiple of BLOCK_K = {BLOCK}: the last "
                "step of the k loop runs past it)")  # fmt: skip
    operands = [_Operand("a", ad, "stride_am", "rows < M", ragged_k),
                _Operand("b", bd, "stride_bk", ragged_k, "cols < N"),
                _Operand("c", c, "stride_cm", output=True)]  # fmt: skip
    tiles = math.ceil(K / BLOCK)
    with _watching(operands, ("b",), tiles, grid[0] * grid[1]) as watch:
        _launch(kernel, grid, "matmul", ad, bd, c, M, N, K, ad.stride(0), bd.stride(0),
                c.stride(0), BLOCK_M=BLOCK, BLOCK_N=BLOCK, BLOCK_K=BLOCK)  # fmt: skip
    _untouched(c, "c")
    return (c.to(a.device), watch.record()) if record_tiles else c.to(a.device)


def _check_attention(fn, kernel, q, k, v, is_causal, scale) -> None:
    _matrix(fn, "q", q)
    width = q.shape[1]
    if width < 16 or width & (width - 1) or width > 128:
        raise ValueError(
            f"{fn}: the head dim of q must be a power of two in 16..128 (tl.dot's "
            f"tiles), got q {tuple(q.shape)}"
        )
    for name, t in (("k", k), ("v", v)):
        _matrix(fn, name, t, width)
        if t.dtype != q.dtype:
            raise TypeError(f"{fn}: {name} must be {q.dtype} like q, got {t.dtype}")
    if k.shape != v.shape:
        raise ValueError(
            f"{fn}: k and v must have one shape (S, E), got {tuple(k.shape)} and "
            f"{tuple(v.shape)}"
        )
    check_flag(fn, "is_causal", is_causal)
    if scale is not None and not (isinstance(scale, (int, float)) and scale > 0):
        raise ValueError(f"{fn}: scale must be a positive number, got {scale!r}")


def _strides(*tensors) -> set[int]:
    return {t.stride(0) for t in tensors}


def attention_forward(
    kernel,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool = False,
    scale: float | None = None,
    record_tiles: bool = False,
) -> tuple:
    """Attention of one head by ``kernel``: ``q (L, E)``, ``k, v (S, E)``; returns
    ``(out (L, E), lse (L,) float32)``, ``lse`` the row log-sum-exp of the scaled
    scores (``-inf`` and zeros for a query that sees no key).

    ``kernel(Q, K, V, O, LSE, L, S, scale, stride_q, stride_k, stride_v, stride_o,
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N:
    tl.constexpr)``, one program per ``BLOCK_M`` query rows; ``CAUSAL`` is bottom-right
    aligned: query ``i`` sees key ``j`` when ``j <= i + S - L``.

    With ``record_tiles=True`` a third result records the work of each program on
    each key tile: ``"loads"`` (``(programs, key tiles)`` int) counts its loads of
    ``K`` that touched the tile (a lane let through), ``"dots"`` (``(programs, key
    tiles + 1)`` int) the ``tl.dot`` calls it ran on the tile: those after its latest
    load of ``K`` or ``V`` from that tile, masked lanes included (masking a tile's
    loads does not skip a dot on it), the last column for keys past ``S``. It is read
    in Triton's interpreter on every machine: on a GPU the outputs come from the
    compiled kernel and the record from a second run under :func:`interpreting`.
    Under the interpreter every load must stay inside the tensors and every store
    inside the outputs, or the launch raises ``AssertionError`` saying where.
    """
    _check_attention("attention_forward", kernel, q, k, v, is_causal, scale)
    check_flag("attention_forward", "record_tiles", record_tiles)
    if record_tiles and _device().type == "cuda":
        out, lse = attention_forward(kernel, q, k, v, is_causal, scale)
        with interpreting():
            *_, record = attention_forward(kernel, *_on_cpu(q, k, v), is_causal,
                                           scale, record_tiles=True)  # fmt: skip
        return out, lse, record
    qd, kd, vd = _to_device(q, k, v)
    (L, E), S = q.shape, k.shape[0]
    scale = 1 / math.sqrt(E) if scale is None else float(scale)
    out = _guarded(L, E, q.dtype, _strides(qd, kd, vd))
    lse = _guarded(L, None, torch.float32)
    grid = (math.ceil(L / BLOCK),)
    operands = [_Operand("q", qd, "stride_q", "rows < L"),
                _Operand("k", kd, "stride_k", "keys < S"),
                _Operand("v", vd, "stride_v", "keys < S"),
                _Operand("out", out, "stride_o", output=True),
                _Operand("lse", lse, output=True)]  # fmt: skip
    tiles = math.ceil(S / BLOCK)
    with _watching(operands, ("k", "v"), tiles, grid[0]) as watch:
        _launch(kernel, grid, "attention_forward", qd, kd, vd, out, lse, L, S, scale,
                qd.stride(0), kd.stride(0), vd.stride(0), out.stride(0), HEAD_DIM=E,
                CAUSAL=bool(is_causal), BLOCK_M=BLOCK, BLOCK_N=BLOCK)  # fmt: skip
    _untouched(out, "out")
    _untouched(lse, "lse")
    results = out.to(q.device), lse.to(q.device)
    return results + (watch.record(),) if record_tiles else results


def attention_backward(
    kernel,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    is_causal: bool = False,
    scale: float | None = None,
    record_tiles: bool = False,
) -> tuple:
    """``(dk, dv)`` of one head's attention by ``kernel``, from the forward pass's
    ``out (L, E)`` and ``lse (L,)`` and the gradient ``grad_out (L, E)``; float32.

    The pre-pass ``delta = rowsum(grad_out * out)`` is computed here. ``kernel(Q, K,
    V, DO, LSE, DELTA, DK, DV, L, S, scale, stride_q, stride_k, stride_v, stride_do,
    stride_dk, stride_dv, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M:
    tl.constexpr, BLOCK_N: tl.constexpr)``, one program per ``BLOCK_N`` key rows.
    ``record_tiles`` as in :func:`attention_forward`, over the query tiles each
    program walks (the loads of ``Q``; the dots on the tiles of its latest load of
    ``Q``, ``DO``, ``LSE`` or ``DELTA``).
    """
    fn = "attention_backward"
    _check_attention(fn, kernel, q, k, v, is_causal, scale)
    check_flag(fn, "record_tiles", record_tiles)
    for name, t in (("out", out), ("grad_out", grad_out)):
        _matrix(fn, name, t, q.shape[1])
        if t.shape != q.shape:
            raise ValueError(
                f"{fn}: {name} must be shaped like q, got {tuple(t.shape)}"
            )
    if not isinstance(lse, torch.Tensor) or lse.shape != q.shape[:1]:
        raise ValueError(f"{fn}: lse must be a tensor of shape ({q.shape[0]},)")
    if record_tiles and _device().type == "cuda":
        dk, dv = attention_backward(kernel, q, k, v, out, lse, grad_out, is_causal,
                                    scale)  # fmt: skip
        with interpreting():
            *_, record = attention_backward(kernel, *_on_cpu(q, k, v, out, lse,
                                            grad_out), is_causal, scale,
                                            record_tiles=True)  # fmt: skip
        return dk, dv, record
    qd, kd, vd, dod = _to_device(q, k, v, grad_out)
    (L, E), S = q.shape, k.shape[0]
    delta, lsed = _guarded(L, None, torch.float32), _guarded(L, None, torch.float32)
    delta.copy_((grad_out.float() * out.float()).sum(-1))
    lsed.copy_(lse.float())
    scale = 1 / math.sqrt(E) if scale is None else float(scale)
    taken = _strides(qd, kd, vd, dod)
    dk, dv = _guarded(S, E, torch.float32, taken), _guarded(S, E, torch.float32, taken)
    operands = [_Operand("q", qd, "stride_q", "rows < L"),
                _Operand("k", kd, "stride_k", "keys < S"),
                _Operand("v", vd, "stride_v", "keys < S"),
                _Operand("do", dod, "stride_do", "rows < L"),
                _Operand("lse", lsed, None, "rows < L"),
                _Operand("delta", delta, None, "rows < L"),
                _Operand("dk", dk, "stride_dk", output=True),
                _Operand("dv", dv, "stride_dv", output=True)]  # fmt: skip
    grid = (math.ceil(S / BLOCK),)
    walked, tiles = ("q", "do", "lse", "delta"), math.ceil(L / BLOCK)
    with _watching(operands, walked, tiles, grid[0]) as watch:
        _launch(kernel, grid, fn, qd, kd, vd, dod, lsed, delta, dk, dv, L, S, scale,
                qd.stride(0), kd.stride(0), vd.stride(0), dod.stride(0), dk.stride(0),
                dv.stride(0), HEAD_DIM=E, CAUSAL=bool(is_causal), BLOCK_M=BLOCK,
                BLOCK_N=BLOCK)  # fmt: skip
    _untouched(dk, "dk")
    _untouched(dv, "dv")
    results = dk.to(q.device), dv.to(q.device)
    return results + (watch.record(),) if record_tiles else results


def block_sparse_forward(
    kernel,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: torch.Tensor,
    scale: float | None = None,
    record_tiles: bool = False,
) -> tuple:
    """Block-sparse attention of one head by ``kernel``: query block ``i`` attends to
    the key blocks ``j`` where ``layout[i, j]`` (blocks of ``BLOCK`` rows, the last
    ones ragged). Returns ``(out (L, E), lse (L,))`` like :func:`attention_forward`.

    The layout reaches the kernel compressed by rows: query block ``i``'s key blocks
    are ``COL_IDX[ROW_PTR[i]:ROW_PTR[i + 1]]`` (int32). ``kernel(Q, K, V, O, LSE,
    ROW_PTR, COL_IDX, L, S, scale, stride_q, stride_k, stride_v, stride_o, HEAD_DIM:
    tl.constexpr, BLOCK: tl.constexpr)``, one program per query block;
    ``record_tiles`` as in :func:`attention_forward`.
    """
    fn = "block_sparse_forward"
    _check_attention(fn, kernel, q, k, v, False, scale)
    check_flag(fn, "record_tiles", record_tiles)
    (L, E), S = q.shape, k.shape[0]
    blocks = (math.ceil(L / BLOCK), math.ceil(S / BLOCK))
    if not isinstance(layout, torch.Tensor) or layout.dtype != torch.bool:
        raise TypeError(f"{fn}: layout must be a bool tensor, got {layout!r:.40}")
    if tuple(layout.shape) != blocks:
        raise ValueError(
            f"{fn}: layout must have one row per query block and one column per key "
            f"block of {BLOCK}, {blocks}, got {tuple(layout.shape)}"
        )
    if record_tiles and _device().type == "cuda":
        out, lse = block_sparse_forward(kernel, q, k, v, layout, scale)
        with interpreting():
            *_, record = block_sparse_forward(kernel, *_on_cpu(q, k, v), layout,
                                              scale, record_tiles=True)  # fmt: skip
        return out, lse, record
    qd, kd, vd = _to_device(q, k, v)
    counts = layout.sum(1).to(torch.int32)
    row_ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)
    col_idx = layout.nonzero()[:, 1].to(torch.int32)
    if col_idx.numel() == 0:
        col_idx = torch.zeros(1, dtype=torch.int32)  # never read: every row is empty
    row_ptr, col_idx = _to_device(row_ptr.contiguous(), col_idx.contiguous())
    scale = 1 / math.sqrt(E) if scale is None else float(scale)
    out = _guarded(L, E, q.dtype, _strides(qd, kd, vd))
    lse = _guarded(L, None, torch.float32)
    operands = [_Operand("q", qd, "stride_q", "rows < L"),
                _Operand("k", kd, "stride_k", "keys < S"),
                _Operand("v", vd, "stride_v", "keys < S"),
                _Operand("row_ptr", row_ptr), _Operand("col_idx", col_idx),
                _Operand("out", out, "stride_o", output=True),
                _Operand("lse", lse, output=True)]  # fmt: skip
    with _watching(operands, ("k", "v"), blocks[1], blocks[0]) as watch:
        _launch(kernel, (blocks[0],), fn, qd, kd, vd, out, lse, row_ptr, col_idx, L,
                S, scale, qd.stride(0), kd.stride(0), vd.stride(0), out.stride(0),
                HEAD_DIM=E, BLOCK=BLOCK)  # fmt: skip
    _untouched(out, "out")
    _untouched(lse, "lse")
    results = out.to(q.device), lse.to(q.device)
    return results + (watch.record(),) if record_tiles else results


# fmt: off
@triton.jit
def _two_pass_forward(Q, K, V, O, LSE, L, S, scale, stride_q, stride_k, stride_v,
                      stride_o, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The chapter's wasteful kernel for :func:`attention_forward` (not an answer to
    its exercise): a two-pass softmax, the row maxima over every key tile first, then
    the sums shifted by them. It masks every score, so its values are right, but it
    walks all the key tiles twice, the upper triangle included, where FlashAttention-2
    walks those up to the causal bound once, rescaling as the maxima grow."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + rows[:, None] * stride_q + dims[None, :],
                mask=rows[:, None] < L, other=0.0)
    top = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for start in range(0, S, BLOCK_N):  # pass 1, every key tile: the row maxima
        keys = start + tl.arange(0, BLOCK_N)
        k = tl.load(K + keys[:, None] * stride_k + dims[None, :],
                    mask=keys[:, None] < S, other=0.0)
        seen = keys[None, :] < S
        if CAUSAL:
            seen = seen & (keys[None, :] <= rows[:, None] + S - L)
        s = tl.where(seen, tl.dot(q, tl.trans(k)) * scale, float("-inf"))
        top = tl.maximum(top, tl.max(s, 1))
    top = tl.where(top == float("-inf"), 0.0, top)  # final: nothing to rescale
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start in range(0, S, BLOCK_N):  # pass 2, every key tile again: the sums
        keys = start + tl.arange(0, BLOCK_N)
        k = tl.load(K + keys[:, None] * stride_k + dims[None, :],
                    mask=keys[:, None] < S, other=0.0)
        v = tl.load(V + keys[:, None] * stride_v + dims[None, :],
                    mask=keys[:, None] < S, other=0.0)
        seen = keys[None, :] < S
        if CAUSAL:
            seen = seen & (keys[None, :] <= rows[:, None] + S - L)
        s = tl.where(seen, tl.dot(q, tl.trans(k)) * scale, float("-inf"))
        weights = tl.exp(s - top[:, None])
        total += tl.sum(weights, 1)
        acc += tl.dot(weights.to(v.dtype), v)
    some = total > 0
    total = tl.where(some, total, 1.0)
    tl.store(O + rows[:, None] * stride_o + dims[None, :],
             (acc / total[:, None]).to(O.dtype.element_ty), mask=rows[:, None] < L)
    tl.store(LSE + rows, tl.where(some, top + tl.log(total), float("-inf")),
             mask=rows < L)
# fmt: on


def define_kernels(source: str) -> dict[str, object]:
    """The ``@triton.jit`` functions and constants that ``source`` defines, by name, as
    the grader defines a submission's kernels in a worker of its own: ``source`` is
    written to a file of its own and imported as a module whose only other names are
    ``triton`` and ``tl`` (``triton.language``), so ``@triton.jit`` can read the
    kernels' source, and nothing else the notebook defined is in their reach.

    The grader hands over only what it read and allowed (``attnbook.course.grader``'s
    ``kernel_source``): ``@triton.jit`` functions and constants, nothing that runs when
    the module is imported."""
    import importlib.util
    import tempfile

    if not isinstance(source, str):
        raise TypeError(f"define_kernels: source must be a str, got {source!r:.40}")
    folder = tempfile.mkdtemp(prefix="attnbook-kernels-")
    path = os.path.join(folder, "submitted_kernels.py")
    with open(path, "w") as f:
        f.write("import triton\nimport triton.language as tl\n\n" + source)
    spec = importlib.util.spec_from_file_location("submitted_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {
        name: value
        for name, value in vars(module).items()
        if not name.startswith("_") and name not in ("triton", "tl")
    }


# --------------------------------------------------------------------------------------
# Which tiles each program loads
# --------------------------------------------------------------------------------------
@dataclass
class LoadRecord:
    """What :func:`record_loads` saw: for each load, the program instance ``(x, y,
    z)``, the tensor's name and the rows it read (the lanes its mask let through)."""

    tensors: dict[str, torch.Tensor]
    loads: list[tuple[tuple[int, int, int], str, frozenset]] = field(
        default_factory=list
    )

    def programs(self) -> list[tuple[int, int, int]]:
        """The program instances that loaded anything, in launch order."""
        return list(dict.fromkeys(program for program, _, _ in self.loads))

    def rows(self, name: str) -> dict[tuple[int, int, int], set[int]]:
        """Per program, the rows of tensor ``name`` it loaded."""
        if name not in self.tensors:
            raise ValueError(
                f"LoadRecord.rows: name must be one of {list(self.tensors)}, got "
                f"{name!r}"
            )
        found = {program: set() for program in self.programs()}
        for program, which, rows in self.loads:
            if which == name:
                found[program] |= rows
        return found

    def tiles(self, name: str, block: int = BLOCK) -> dict[tuple[int, int, int], list]:
        """Per program, the tiles of ``block`` rows of tensor ``name`` it touched."""
        check_int("LoadRecord.tiles", "block", block)
        return {
            program: sorted({row // block for row in rows})
            for program, rows in self.rows(name).items()
        }


def _row_of(tensors: dict[str, torch.Tensor]):
    """A function from an address to ``(name, row)`` for the named tensors."""
    spans = []
    for name, t in tensors.items():
        start, size = t.data_ptr(), t.element_size()
        rows, stride = (t.shape[-2], t.stride(-2)) if t.dim() >= 2 else (t.numel(), 1)
        last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n)
        spans.append((name, start, start + (last + 1) * size, size, stride, rows))

    def find(address: int):
        for name, start, end, size, stride, rows in spans:
            if start <= address < end:
                return name, ((address - start) // size // stride) % rows
        return None

    return find


@contextlib.contextmanager
def record_loads(**tensors: torch.Tensor) -> Iterator[LoadRecord]:
    """Within this block, record every load the Triton interpreter makes from the named
    CPU ``tensors`` (``record_loads(Q=q, K=k, V=v)``): which program read which rows.

    It wraps the interpreter's load (``interpreter_builder.create_masked_load``) inside
    :func:`interpreting`, so it works for any kernel launched on CPU tensors, on a
    machine with a GPU too; the lanes a mask turns off are not loads and are not
    counted.
    """
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            raise TypeError(
                f"record_loads: {name} must be a CPU tensor (the interpreter's "
                f"memory), got {t!r:.40}"
            )
    if not tensors:
        raise ValueError("record_loads: name at least one tensor, e.g. K=k")
    from triton.runtime.interpreter import interpreter_builder

    record, find = LoadRecord(dict(tensors)), _row_of(tensors)
    original = interpreter_builder.create_masked_load
    outer = interpreter_builder.__dict__.get("create_masked_load")  # a recorder around

    def load(ptrs, mask, other, *args, **kwargs):
        seen: dict[str, set] = {}
        live = ptrs.data.reshape(-1)[mask.data.reshape(-1).astype(bool)]
        for address in set(live.tolist()):
            hit = find(int(address))
            if hit is not None:
                seen.setdefault(hit[0], set()).add(int(hit[1]))
        program = tuple(interpreter_builder.grid_idx)
        for name, rows in seen.items():
            record.loads.append((program, name, frozenset(rows)))
        return original(ptrs, mask, other, *args, **kwargs)

    interpreter_builder.create_masked_load = load
    try:
        with interpreting():  # compiled kernels too, where a GPU turned it off
            yield record
    finally:
        if outer is None:
            del interpreter_builder.create_masked_load  # back to the class's method
        else:
            interpreter_builder.create_masked_load = outer


def plot_loads(
    record: LoadRecord,
    names: tuple[str, ...] = ("Q", "K", "V"),
    block: int = BLOCK,
    title: str | None = None,
):
    """One panel per program instance: for each tensor in ``names`` (a column), the
    share of each tile's rows (a row of the panel, tile 0 on top) the program loaded.
    Returns the figure."""
    import matplotlib.pyplot as plt
    import numpy as np

    if not isinstance(record, LoadRecord):
        raise TypeError(f"plot_loads: record must be a LoadRecord, got {record!r:.40}")
    check_int("plot_loads", "block", block)
    missing = [n for n in names if n not in record.tensors]
    if missing or not names:
        raise ValueError(
            f"plot_loads: names must be among {list(record.tensors)}, got {names!r}"
        )
    programs = record.programs()
    if not programs:
        raise ValueError("plot_loads: record holds no load (did the kernel run?)")
    sizes = [record.tensors[n].shape[-2] for n in names]
    tiles = max(math.ceil(n / block) for n in sizes)
    rows = {name: record.rows(name) for name in names}
    fig, axes = plt.subplots(
        1,
        len(programs),
        figsize=(0.9 * len(programs) + 1.2, 2.4),
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    for ax, program in zip(axes[0], programs):
        share = np.full((tiles, len(names)), np.nan)
        for col, (name, n) in enumerate(zip(names, sizes)):
            for tile in range(math.ceil(n / block)):
                span = range(tile * block, min(n, (tile + 1) * block))
                share[tile, col] = len(rows[name][program] & set(span)) / len(span)
        image = ax.imshow(share, cmap="rocket_r" if _has_seaborn() else "Reds",
                          vmin=0, vmax=1, aspect="auto")  # fmt: skip
        ax.set_xticks(range(len(names)), names)
        ax.set_yticks(range(tiles))
        ax.grid(False)
        ax.set_title(f"program {program[0]}", fontsize=9)
    axes[0][0].set_ylabel(f"tile ({block} rows)")
    fig.colorbar(image, ax=axes[0].tolist(), label="share loaded", shrink=0.8)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def _has_seaborn() -> bool:
    try:
        import seaborn  # noqa: F401
    except ImportError:  # pragma: no cover - seaborn comes with the book's extras
        return False
    return True


# --------------------------------------------------------------------------------------
# What the kernel costs on a GPU
# --------------------------------------------------------------------------------------
_FLOAT32_POINTERS = ("LSE", "DELTA", "DK", "DV")
_INT32_POINTERS = ("ROW_PTR", "COL_IDX")
_SIZES = ("L", "S", "M", "N", "K")  # sizes in capitals, as the formulas write them
# What compile_report compiled in this process: the worker's rows by (kernel source,
# name, dtype, constexprs, targets), so that a check cell run again compiles nothing.
_COMPILED: dict[tuple, list] = {}


def variants(source: str, name: str, dtype: str, constexprs: dict) -> list:
    """(For the compile worker.) Kernel ``name`` defined by ``source`` (which imports
    ``triton`` and ``triton.language as tl`` itself), as one
    :class:`~attnbook.kernels.variants.Variant` specialized for ``dtype`` pointers.

    Parameters in capitals are pointers (``LSE``, ``DELTA``, ``DK``, ``DV`` to float32,
    ``ROW_PTR``, ``COL_IDX`` to int32, the others to ``dtype``) except the sizes ``L``,
    ``S``, ``M``, ``N`` and (in a kernel without a ``Q``, the matrix product's) ``K``;
    ``scale`` is a float, the rest are 32-bit integers."""
    import atexit
    import importlib.util
    import shutil
    import tempfile

    from .variants import Variant, specialize

    folder = tempfile.mkdtemp(prefix="attnbook-lab-")
    atexit.register(shutil.rmtree, folder, True)  # when the worker process ends
    path = os.path.join(folder, "student_kernel.py")
    with open(path, "w") as f:
        f.write("import triton\nimport triton.language as tl\n\n" + source)
    spec = importlib.util.spec_from_file_location("student_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kernel = getattr(module, name)
    types = {}
    params = _parameters(kernel)
    sizes = set(_SIZES) - ({"K"} if ("Q", False) in params else set())
    for param, is_constexpr in params:
        if is_constexpr:
            continue
        if param in _FLOAT32_POINTERS:
            types[param] = "*fp32"
        elif param in _INT32_POINTERS:
            types[param] = "*i32"
        elif param.isupper() and param not in sizes:
            types[param] = "*" + dtype
        elif param == "scale":
            types[param] = "fp32"
    signature, constants, attrs = specialize(kernel, types, constexprs)
    return [Variant(name, kernel, signature, constants, 4, 2, attrs=attrs)]


def _parameters(kernel):
    from .variants import parameters

    return parameters(kernel)


def _compile_worker(source, name, dtype, constexprs, targets):
    """In a process without the interpreter: compile for every target."""
    from .compile import compile_variant

    kwargs = {"source": source, "name": name, "dtype": dtype, "constexprs": constexprs}
    return [compile_variant(__name__, kwargs, 0, cc) for cc in targets]


# The compile worker's command: triton is imported before this module, so the module
# leaves the interpreter off, and the job comes and goes as JSON.
_WORKER = (
    "import json, sys\n"
    "import triton\n"
    "from attnbook.kernels.lab import _compile_worker\n"
    "job = json.load(sys.stdin)\n"
    "json.dump(_compile_worker(**job), sys.stdout)\n"
)


def _check_compile_report(kernel, constexprs, dtype, targets) -> None:
    from .compile import TARGETS

    if getattr(kernel, "fn", None) is None:
        raise TypeError(
            f"compile_report: kernel must be a @triton.jit function, got {kernel!r:.40}"
        )
    if not isinstance(constexprs, dict):
        raise TypeError(
            f"compile_report: constexprs must be a dict, got {constexprs!r}"
        )
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(
            f"compile_report: dtype must be float16, bfloat16 or float32, got {dtype}"
        )
    bad = [cc for cc in targets if cc not in TARGETS]
    if not targets or bad:
        raise ValueError(
            f"compile_report: targets must be among {list(TARGETS)}, got {targets!r}"
        )


def compile_report(
    kernel,
    constexprs: dict,
    dtype: torch.dtype = torch.float16,
    targets: tuple[int, ...] = LAB_TARGETS,
) -> list:
    """Compile ``kernel`` (a ``@triton.jit`` function whose source is in a file or a
    notebook cell) with ``constexprs`` for each GPU generation in ``targets``, without a
    GPU, and return its :class:`~attnbook.kernels.compile.Resources`: registers, spills
    and shared memory per target.

    The kernel is compiled in a fresh process without ``TRITON_INTERPRET`` (a process
    that interprets cannot compile), by :mod:`attnbook.kernels.compile`'s worker, once
    per source text, ``constexprs``, ``dtype`` and ``targets`` in this process (a second
    call with the same ones compiles nothing); a kernel that does not compile raises
    ``ValueError`` with Triton's message.
    """
    from .compile import Resources

    targets = tuple(targets)
    _check_compile_report(kernel, constexprs, dtype, targets)
    python = kernel.fn
    if "NotImplementedError" in python.__code__.co_names:
        raise NotImplementedError("the kernel is still the exercise's stub")
    try:
        source = inspect.getsource(python)
    except (OSError, TypeError):
        raise ValueError(
            "compile_report: the kernel's source is not available (define it in a "
            "file or a notebook cell)"
        ) from None
    name = python.__name__
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("@"))
    source = "\n".join(line[len(lines[start]) - len(lines[start].lstrip()):]
                       for line in lines[start:]) + "\n"  # fmt: skip
    short = str(dtype).removeprefix("torch.")
    triton_dtype = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}[short]
    job = {"source": source, "name": name, "dtype": triton_dtype,
           "constexprs": dict(constexprs), "targets": list(targets)}  # fmt: skip
    key = (source, name, triton_dtype, json.dumps(job["constexprs"], sort_keys=True),
           targets)  # fmt: skip
    if key not in _COMPILED:
        _COMPILED[key] = _compile_in_worker(job)
    done = _COMPILED[key]
    width = int(constexprs.get("HEAD_DIM", constexprs.get("BLOCK", 0)))
    return [
        Resources(capability=cc, dtype=short, head_dim=width, **{**row, "config": None})
        for cc, row in zip(targets, done)
    ]


def _compile_in_worker(job: dict) -> list:
    """The worker's rows for ``job``, from a fresh Python process without the
    interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")]).rstrip(":")
    run = subprocess.run(
        [sys.executable, "-c", _WORKER],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if run.returncode:
        last = (run.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise ValueError(f"compile_report: Triton could not compile the kernel: {last}")
    return json.loads(run.stdout)


def format_report(resources: list) -> str:
    """One line per target: registers per thread, bytes spilled, shared memory, and in
    plain words whether the kernel would launch there and run from registers."""
    from .compile import TARGETS, Resources, fits

    if not isinstance(resources, (list, tuple)) or not all(
        isinstance(r, Resources) for r in resources
    ):
        raise TypeError(
            f"format_report: resources must be a list of Resources (from "
            f"compile_report), got {resources!r:.60}"
        )
    lines = []
    for r in resources:
        gpu = TARGETS[r.capability].gpus.split(",")[0].split(" (")[0]
        head = (
            f"sm{r.capability} {gpu:<5}{r.registers:>4} registers "
            f"{r.local + r.stack:>6} B spilled {r.shared / 1024:6.1f} KiB shared: "
        )
        limit = TARGETS[r.capability].shared
        if fits(r)[0]:
            lines.append(head + "fits")
        elif r.shared > limit:
            lines.append(head + "WOULD NOT LAUNCH")
            lines.append(
                f"    it needs {r.shared // 1024} KiB of shared memory, the {gpu} "
                f"allows {limit // 1024} KiB per block: smaller tiles"
            )
        else:
            lines.append(head + "SPILLS")
            lines.append(
                f"    on the {gpu}, registers overflow to slow local memory: smaller "
                "tiles"
            )
    return "\n".join(lines)


def time_forward(
    kernel,
    seq_len: int = 4096,
    head_dim: int = 64,
    is_causal: bool = True,
    dtype: torch.dtype = torch.float16,
) -> dict[str, float]:
    """On a CUDA GPU: milliseconds of ``kernel`` through :func:`attention_forward` and
    of ``F.scaled_dot_product_attention`` on one head of ``seq_len`` tokens (best of
    Triton's ``do_bench``); raises ``RuntimeError`` without a GPU."""
    check_int("time_forward", "seq_len", seq_len)
    check_int("time_forward", "head_dim", head_dim, 16)
    check_flag("time_forward", "is_causal", is_causal)
    if not torch.cuda.is_available():
        raise RuntimeError("time_forward: timing needs a CUDA GPU")
    import torch.nn.functional as F
    from triton.testing import do_bench

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(seq_len, head_dim, device="cuda", dtype=dtype, generator=gen)
        for _ in range(3)
    )
    yours = do_bench(lambda: attention_forward(kernel, q, k, v, is_causal))
    sdpa = do_bench(
        lambda: F.scaled_dot_product_attention(
            q[None], k[None], v[None], is_causal=is_causal
        )
    )
    return {"yours": yours, "sdpa": sdpa}


#: The constexprs :func:`cost_report` compiles each launcher's kernel with: tiles a
#: GPU would run (the launchers' 16-row tiles are for the interpreter), a head of 64,
#: rows of 4,096 scores; the backward pass walks 32 queries at a time past its 64 keys,
#: as Triton's fused-attention tutorial does.
GPU_CONSTEXPRS: dict[str, dict] = {
    "softmax": dict(BLOCK=4096),
    "matmul": dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32),
    "attention_forward": dict(BLOCK_M=64, BLOCK_N=64, HEAD_DIM=64, CAUSAL=True),
    "attention_backward": dict(BLOCK_M=32, BLOCK_N=64, HEAD_DIM=64, CAUSAL=True),
    "block_sparse_forward": dict(BLOCK=64, HEAD_DIM=64),
}


def cost_report(launcher, kernel, dtype: torch.dtype = torch.float16) -> str:
    """What ``kernel``, written for the lab's ``launcher`` (:func:`softmax`, ...,
    :func:`block_sparse_forward`), would cost on a GPU: a heading naming the tiles of
    :data:`GPU_CONSTEXPRS`, then :func:`format_report` of :func:`compile_report` for
    the lab's targets (a T4, an A100, an H100) in ``dtype``. On a CUDA GPU, for
    :func:`attention_forward`, a last line gives :func:`time_forward`'s milliseconds
    against SDPA (the other kernels have no SDPA call doing the same work). Raises
    ``ValueError`` for another launcher, and what :func:`compile_report` raises."""
    name = getattr(launcher, "__name__", None)
    if name not in GPU_CONSTEXPRS or launcher is not globals()[name]:
        raise ValueError(
            f"cost_report: launcher must be one of the lab's launchers "
            f"({', '.join(GPU_CONSTEXPRS)}), got {launcher!r:.60}"
        )
    if getattr(kernel, "fn", None) is None:
        raise TypeError(
            f"cost_report: kernel must be a @triton.jit function, got {kernel!r:.40}"
        )
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(
            f"cost_report: dtype must be float16, bfloat16 or float32, got {dtype}"
        )
    constexprs = GPU_CONSTEXPRS[name]
    report = compile_report(kernel, constexprs, dtype, LAB_TARGETS)
    tiles = ", ".join(f"{k}={v}" for k, v in constexprs.items())
    short = str(dtype).removeprefix("torch.")
    heading = f"On a GPU ({short}, 4 warps; {tiles}):"  # the worker's 4 warps
    lines = [textwrap.fill(heading, 86), format_report(report)]
    if name == "attention_forward" and torch.cuda.is_available():
        times = time_forward(kernel, seq_len=4096, head_dim=64)
        yours, sdpa = times["yours"], times["sdpa"]
        timed = (
            f"On this {torch.cuda.get_device_name()}, one causal head of 4,096 tokens: "
            f"your kernel {yours:.3f} ms, SDPA {sdpa:.3f} ms (through the lab's "
            "launcher, whose 16-row tiles are built for checking, not speed)."
        )
        lines.append(textwrap.fill(timed, 86))
    return "\n".join(lines)
