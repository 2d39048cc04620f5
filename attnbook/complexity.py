"""The cost of attention: FLOPs, memory, and Table 1 of Vaswani et al. (2017), plus a
measuring helper, and what training keeps for the backward pass.

Conventions: one multiply-add counts as 2 FLOPs (what ``torch.utils.flop_counter``
counts); ``n`` is the sequence length, ``d`` the model width, ``h`` the number of heads,
``B`` the batch. Self-attention costs ``O(n^2 d)`` time and ``O(h n^2)`` memory for the
weights; a recurrent layer costs ``O(n d^2)`` time but needs ``n`` sequential steps. The
two are equal near ``n = d``.

Training also keeps activations for the backward pass: :func:`saved_activation_bytes`
counts them exactly, and :class:`ReversibleBlock` with :func:`reversible_stack` (Gomez
et al., 2017, as in the Reformer of Kitaev et al., 2020) recomputes them instead, the
alternative to gradient checkpointing (Chen et al., 2016; ``torch.utils.checkpoint``).
"""

from __future__ import annotations

import gc
import math
import numbers
import statistics
import sys
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .contract import check_float, check_sizes

__all__ = [
    "SOFTMAX_FLOPS_PER_ELEMENT",
    "attention_flops",
    "rnn_flops",
    "attention_memory_bytes",
    "crossover_length",
    "LayerComplexity",
    "vaswani_table1",
    "measure",
    "loglog_slope",
    "saved_activation_bytes",
    "ReversibleBlock",
    "reversible_stack",
]

#: Max, subtract, exp, sum and divide, a conventional estimate (not a matmul term).
SOFTMAX_FLOPS_PER_ELEMENT = 5


def _check_attention_flops(seq_len, d_model, n_heads, batch, kv_len, n_kv_heads):
    fn = "attention_flops"
    check_sizes(
        fn,
        seq_len=seq_len,
        d_model=d_model,
        n_heads=n_heads,
        batch=batch,
        kv_len=kv_len,
        n_kv_heads=n_kv_heads,
    )
    if d_model % n_heads or n_heads % n_kv_heads:
        raise ValueError(
            f"{fn}: d_model={d_model} must be divisible by n_heads={n_heads}, and "
            f"n_heads by n_kv_heads={n_kv_heads}"
        )


def attention_flops(
    seq_len: int,
    d_model: int,
    n_heads: int = 1,
    batch: int = 1,
    kv_len: int | None = None,
    n_kv_heads: int | None = None,
) -> dict:
    """FLOPs of one multi-head self-attention layer, step by step (2 FLOPs per
    multiply-add).

    With ``n = seq_len``, ``m = kv_len`` (default ``n``), ``d = d_model``:

    =================  ======================  ========================================
    step               FLOPs                   shape of the work
    =================  ======================  ========================================
    q/k/v projections  ``2 B (n + 2m g) d^2``  ``(B n d) x (d d)``; K, V ``g`` as wide
    scores             ``2 B n m d``           ``h`` heads of ``(n, d/h) x (d/h, m)``
    softmax            ``5 B h n m``           elementwise over the ``(B, h, n, m)``
    weighted sum       ``2 B n m d``           ``h`` heads of ``(n, m) x (m, d/h)``
    output projection  ``2 B n d^2``           ``(B n d) x (d d)``
    =================  ======================  ========================================

    where ``g = n_kv_heads / h``.

    With grouped-query attention (``n_kv_heads < n_heads``) only the K and V projections
    shrink. Returns a dict with those five keys plus ``"total"`` and ``"matmul"`` (all
    but softmax). Bias additions are not counted (as PyTorch's FLOP counter does not).
    """
    kv_len = seq_len if kv_len is None else kv_len
    n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
    _check_attention_flops(seq_len, d_model, n_heads, batch, kv_len, n_kv_heads)
    n, m, d, B = seq_len, kv_len, d_model, batch
    d_kv = d // n_heads * n_kv_heads  # width of the K and V projections
    steps = {
        "qkv_projections": 2 * B * n * d * d + 2 * 2 * B * m * d * d_kv,
        "scores": 2 * B * n * m * d,
        "softmax": SOFTMAX_FLOPS_PER_ELEMENT * B * n_heads * n * m,
        "weighted_sum": 2 * B * n * m * d,
        "output_projection": 2 * B * n * d * d,
    }
    steps["matmul"] = sum(v for k, v in steps.items() if k != "softmax")
    steps["total"] = steps["matmul"] + steps["softmax"]
    return steps


def rnn_flops(
    seq_len: int, hidden: int, input_dim: int | None = None, batch: int = 1
) -> dict:
    """FLOPs of a vanilla RNN layer ``h_t = tanh(W h_{t-1} + U x_t + b)`` over
    ``seq_len`` steps.

    Each step costs ``2 d^2 + 2 d d_in`` FLOPs (two matrix-vector products), so the
    layer costs ``O(n d^2)`` and, unlike attention, needs ``n`` *sequential* steps.
    Returns ``per_step``, ``total`` and ``sequential_steps``.
    """
    input_dim = hidden if input_dim is None else input_dim
    check_sizes(
        "rnn_flops", seq_len=seq_len, hidden=hidden, input_dim=input_dim, batch=batch
    )
    per_step = 2 * batch * hidden * (hidden + input_dim)
    return {
        "per_step": per_step,
        "total": per_step * seq_len,
        "sequential_steps": seq_len,
    }


def attention_memory_bytes(
    seq_len: int,
    n_heads: int = 1,
    batch: int = 1,
    bytes_per_elem: int = 4,
    n_layers: int = 1,
    kv_len: int | None = None,
) -> int:
    """Bytes of the attention-weight tensors ``B x h x n x m`` (per layer, times
    ``n_layers``).

    This is the memory standard attention materializes and FlashAttention avoids; e.g.
    one fp32 ``65,536 x 65,536`` matrix is ``2^32 * 4 B = 17.2 GB``.
    """
    kv_len = seq_len if kv_len is None else kv_len
    check_sizes(
        "attention_memory_bytes",
        seq_len=seq_len,
        n_heads=n_heads,
        batch=batch,
        bytes_per_elem=bytes_per_elem,
        n_layers=n_layers,
        kv_len=kv_len,
    )
    return batch * n_heads * seq_len * kv_len * bytes_per_elem * n_layers


def crossover_length(d_model: int) -> int:
    """Length ``n`` at which self-attention's ``n^2 d`` equals a recurrent layer's ``n
    d^2``: ``n = d``.

    Shorter sequences than this make self-attention *cheaper* than a recurrent layer per
    layer; longer ones make it more expensive (but still parallel: 1 sequential step
    instead of ``n``).
    """
    check_sizes("crossover_length", d_model=d_model)
    return d_model


@dataclass(frozen=True)
class LayerComplexity:
    """One row of Table 1 of Vaswani et al. (2017)."""

    layer: str
    complexity: str  #: complexity per layer (big-O, as printed in the paper)
    sequential: str  #: minimum number of sequential operations
    path_length: str  #: maximum path length between any two positions
    complexity_fn: Callable[..., float]
    sequential_fn: Callable[..., float]
    path_length_fn: Callable[..., float]

    def evaluate(self, n: int, d: int, k: int = 3, r: int = 16) -> dict:
        """The three columns evaluated (constants dropped) for concrete ``n, d, k,
        r``: positive integers, the kernel ``k >= 2`` (the base of ``log_k n``; a
        kernel of width 1 never connects two positions). Anything else is a
        ``ValueError`` naming the argument."""
        fn = "LayerComplexity.evaluate"
        check_sizes(fn, n=n, d=d, k=k, r=r)
        if k < 2:
            raise ValueError(
                f"{fn}: k must be a kernel width >= 2 (the path length is log_k n), "
                f"got {k!r}"
            )
        return {
            "layer": self.layer,
            "complexity": self.complexity_fn(n, d, k, r),
            "sequential": self.sequential_fn(n, d, k, r),
            "path_length": self.path_length_fn(n, d, k, r),
        }


def vaswani_table1() -> list[LayerComplexity]:
    """Table 1 of Vaswani et al. (2017): ``n`` length, ``d`` width, ``k`` kernel, ``r``
    neighbourhood.

    The convolutional path length ``O(log_k n)`` is for dilated convolutions; contiguous
    kernels need ``O(n / k)`` layers.
    """
    return [
        LayerComplexity(
            "Self-Attention",
            "O(n^2 d)",
            "O(1)",
            "O(1)",
            lambda n, d, k, r: n * n * d,
            lambda n, d, k, r: 1,
            lambda n, d, k, r: 1,
        ),
        LayerComplexity(
            "Recurrent",
            "O(n d^2)",
            "O(n)",
            "O(n)",
            lambda n, d, k, r: n * d * d,
            lambda n, d, k, r: n,
            lambda n, d, k, r: n,
        ),
        LayerComplexity(
            "Convolutional",
            "O(k n d^2)",
            "O(1)",
            "O(log_k(n))",
            lambda n, d, k, r: k * n * d * d,
            lambda n, d, k, r: 1,
            lambda n, d, k, r: math.log(n, k),
        ),
        LayerComplexity(
            "Self-Attention (restricted)",
            "O(r n d)",
            "O(1)",
            "O(n/r)",
            lambda n, d, k, r: r * n * d,
            lambda n, d, k, r: 1,
            lambda n, d, k, r: n / r,
        ),
    ]


# --------------------------------------------------------------------------------------
# Measuring on the reader's machine
# --------------------------------------------------------------------------------------
def _rss_field(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    try:  # Linux: writing 5 to clear_refs resets the peak resident set size (VmHWM)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _check_measure(fn, repeat, warmup) -> None:
    if not callable(fn):
        raise TypeError(f"measure: fn must be callable, got {fn!r:.60}")
    integers = all(
        isinstance(n, numbers.Integral) and not isinstance(n, bool)
        for n in (repeat, warmup)
    )
    if not integers or repeat < 1 or warmup < 0:
        raise ValueError(
            f"measure: repeat must be >= 1 and warmup >= 0 (integers), got "
            f"repeat={repeat!r}, warmup={warmup!r}"
        )


def measure(fn: Callable, *args, repeat: int = 5, warmup: int = 1, **kwargs) -> dict:
    """Run ``fn(*args, **kwargs)`` and return its median wall time and peak extra
    memory.

    Returns ``{"time_s": median seconds, "min_s": fastest run (robust on a busy
    machine), "times_s": all runs, "peak_bytes": int | None, "memory": how}``. Peak
    memory is read from the CUDA allocator when the arguments live on a GPU
    (``torch.cuda.max_memory_allocated`` above the starting allocation), and on Linux
    CPUs from the process's peak resident set size (``VmHWM``, reset before the run)
    above the resident size at the start. Elsewhere ``peak_bytes`` is ``None``. The CPU
    reading includes allocator noise of a few MiB, so trust it for large tensors, which
    is where attention's ``n^2`` shows.
    """
    _check_measure(fn, repeat, warmup)
    tensors = [
        a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)
    ]
    cuda = any(t.is_cuda for t in tensors)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.no_grad():
        for _ in range(warmup):
            fn(*args, **kwargs)
        sync()
        gc.collect()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            start_mem, how = torch.cuda.memory_allocated(), "cuda allocator"
        elif sys.platform.startswith("linux") and _reset_peak_rss():
            start_mem, how = _rss_field("VmRSS"), "peak RSS (VmHWM)"
        else:
            start_mem, how = None, "unavailable"
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            result = fn(*args, **kwargs)
            sync()
            times.append(time.perf_counter() - t0)
            del result
        if cuda:
            peak = torch.cuda.max_memory_allocated() - start_mem
        elif start_mem is not None:
            peak = max(0, (_rss_field("VmHWM") or 0) - start_mem)
        else:
            peak = None
    return {
        "time_s": statistics.median(times),
        "min_s": min(times),
        "times_s": times,
        "peak_bytes": peak,
        "memory": how,
    }


def _check_loglog(x, y) -> tuple[torch.Tensor, torch.Tensor]:
    """``log x`` and ``log y`` as flat float64 tensors, or a ``ValueError``."""
    fn = "loglog_slope"
    try:
        x = torch.as_tensor(x, dtype=torch.float64).flatten()
        y = torch.as_tensor(y, dtype=torch.float64).flatten()
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(
            f"{fn}: x and y must be sequences of numbers ({error})"
        ) from None
    if x.numel() != y.numel() or x.numel() < 2:
        raise ValueError(
            f"{fn}: x and y need the same length >= 2, got {x.numel()} and {y.numel()}"
        )
    finite = bool(x.isfinite().all() and y.isfinite().all())
    if not finite or (x <= 0).any() or (y <= 0).any():
        raise ValueError(
            f"{fn}: x and y must be positive and finite to take logarithms"
        )
    if torch.allclose(x, x[0]):
        raise ValueError(f"{fn}: x must contain at least two different values")
    return x.log(), y.log()


def loglog_slope(x, y) -> float:
    """Least-squares slope of ``log y`` against ``log x``: the exponent ``p`` in ``y ~
    x^p``."""
    x, y = _check_loglog(x, y)
    xc = x - x.mean()
    return float((xc * (y - y.mean())).sum() / (xc * xc).sum())


# --------------------------------------------------------------------------------------
# Activation memory in training: what autograd saves, and how to save less
# --------------------------------------------------------------------------------------
def _check_saved(fn, exclude) -> None:
    if not callable(fn):
        raise TypeError(f"saved_activation_bytes: fn must be callable, got {fn!r:.60}")
    if isinstance(exclude, torch.Tensor) or not all(
        isinstance(t, torch.Tensor) for t in exclude
    ):
        raise TypeError(
            "saved_activation_bytes: exclude must be a sequence of tensors, got "
            f"{exclude!r:.60}"
        )


def saved_activation_bytes(
    fn: Callable, *inputs, exclude: Sequence[torch.Tensor] = ()
) -> int:
    """Bytes of the tensors autograd keeps for the backward pass of ``fn(*inputs)``.

    Every tensor an operation saves for its backward pass (the built-in operations'
    saved inputs and outputs, and ``ctx.save_for_backward`` in a custom
    ``torch.autograd.Function``) goes through the pack hook of
    ``torch.autograd.graph.saved_tensors_hooks``. The result is the total size of the
    distinct buffers (storages) of those tensors that are still held when ``fn``
    returns: a tensor saved by two operations counts once, and a saved view counts its
    whole buffer, which it keeps alive. Parameters (and views of them, such as the
    ``weight.t()`` a linear layer saves) and the tensors in ``exclude`` are left out:
    they live whether or not we train. The inputs count when saved, as the activations
    of the layer before. Deterministic: it reads no allocator.

    For a stack of ``L`` standard attention blocks this is about ``L (c_1 B n d + c_2 B
    h n^2)`` times the element size: the ``O(n d)`` activations and the ``O(h n^2)``
    attention weights of every block.
    """
    _check_saved(fn, exclude)
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    held = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        parameter = isinstance(t, torch.nn.Parameter) or isinstance(
            t._base, torch.nn.Parameter
        )
        if not parameter:
            held.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*inputs)
    buffers = {}
    for ref in held:
        t = ref()
        if t is not None and t.untyped_storage().data_ptr() not in skip:
            storage = t.untyped_storage()
            buffers[storage.data_ptr()] = storage.nbytes()
    del out
    return sum(buffers.values())


class ReversibleBlock(torch.nn.Module):
    """Reversible residual block (Gomez et al., 2017), the Reformer's layer (Kitaev et
    al., 2020).

    The activations are split in two halves ``x1, x2`` (each ``(..., d)``), and

        ``y1 = x1 + F(x2)``,   ``y2 = x2 + G(y1)``.

    The inputs follow from the outputs, ``x2 = y2 - G(y1)``, ``x1 = y1 - F(x2)``
    (:meth:`inverse`), so a stack of these blocks need not store any activation for
    the backward pass: :func:`reversible_stack` recomputes them from the last output.
    In a Transformer ``F`` is the attention sublayer and ``G`` the feed-forward one.
    ``F`` and ``G`` are any modules mapping ``(..., d)`` to ``(..., d)``; they must be
    deterministic (no dropout), since they run again in the backward pass.
    """

    def __init__(self, f: torch.nn.Module, g: torch.nn.Module):
        super().__init__()
        for name, module in (("f", f), ("g", g)):
            if not isinstance(module, torch.nn.Module):
                raise TypeError(
                    f"ReversibleBlock: {name} must be a torch.nn.Module mapping "
                    "(..., d) "
                    f"to (..., d), got {type(module).__name__}"
                )
        self.f, self.g = f, g

    def forward(
        self, x1: torch.Tensor, x2: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x1, x2) -> (y1, y2)``, differentiable the ordinary way (all saved)."""
        y1 = x1 + self.f(x2)
        return y1, x2 + self.g(y1)

    def inverse(
        self, y1: torch.Tensor, y2: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(y1, y2) -> (x1, x2)``: the inputs, exact up to floating-point rounding."""
        x2 = y2 - self.g(y1)
        return y1 - self.f(x2), x2

    def backward_pass(self, y1, y2, dy1, dy2):
        """One block of the backward pass, from outputs and their gradients.

        Recomputes ``G(y1)`` to get ``x2`` and ``F(x2)`` to get ``x1``, backpropagating
        through each: ``dy1 += (dG/dy1)^T dy2``, ``dx2 = dy2 + (dF/dx2)^T dy1``, ``dx1
        = dy1``. Returns ``(x1, x2, dx1, dx2, grads)``, ``grads`` a list of
        ``(parameter, gradient)`` pairs of this block.
        """
        grads = []

        def backprop(module, inp, grad_out):
            params = [p for p in module.parameters() if p.requires_grad]
            with torch.enable_grad():
                inp = inp.detach().requires_grad_()
                # the module sees a view, not the leaf: FlopCounterMode's module
                # hooks refuse a leaf inside autograd.grad
                out = module(inp.view_as(inp))
                g_inp, *g_params = torch.autograd.grad(
                    out, [inp, *params], grad_out, allow_unused=True
                )
            grads.extend((p, g) for p, g in zip(params, g_params) if g is not None)
            return out.detach(), g_inp

        g_y1, dg = backprop(self.g, y1, dy2)
        dy1 = dy1 + dg
        x2 = y2 - g_y1
        f_x2, df = backprop(self.f, x2, dy1)
        return y1 - f_x2, x2, dy1, dy2 + df, grads


class _ReversibleStack(torch.autograd.Function):
    """Runs reversible blocks without saving their activations: the forward pass keeps
    only the last output, the backward pass rebuilds each block's input from its
    output."""

    @staticmethod
    def forward(ctx, x1, x2, blocks, *params):
        with torch.no_grad():  # nothing is saved; each input is freed when used
            for block in blocks:
                x1, x2 = block(x1, x2)
        ctx.blocks, ctx.params = blocks, params
        ctx.save_for_backward(x1, x2)
        return x1, x2

    @staticmethod
    def backward(ctx, dy1, dy2):
        y1, y2 = ctx.saved_tensors
        grads = {}  # id(parameter) -> gradient, summed over the blocks that share it
        for block in reversed(ctx.blocks):
            y1, y2, dy1, dy2, block_grads = block.backward_pass(y1, y2, dy1, dy2)
            for p, g in block_grads:
                grads[id(p)] = grads[id(p)] + g if id(p) in grads else g
        return (dy1, dy2, None, *(grads.get(id(p)) for p in ctx.params))


def _check_reversible_stack(blocks, x1, x2) -> list:
    fn = "reversible_stack"
    blocks = (
        list(blocks) if isinstance(blocks, (list, tuple, torch.nn.ModuleList)) else None
    )
    if not blocks or not all(isinstance(b, ReversibleBlock) for b in blocks):
        raise ValueError(
            f"{fn}: blocks must be a non-empty sequence of ReversibleBlock"
        )
    for name, t in (("x1", x1), ("x2", x2)):
        check_float(fn, name, t)
    return blocks


def reversible_stack(
    blocks: Sequence[ReversibleBlock], x1: torch.Tensor, x2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply reversible ``blocks`` in order, saving activations independent of their
    number.

    Same values and gradients as calling the blocks one after the other, but autograd
    keeps only the two output halves (``2 B n d`` numbers for ``(B, n, d)`` halves),
    whatever the number of blocks ``L``. The backward pass recomputes every ``F`` and
    ``G`` once (:meth:`ReversibleBlock.backward_pass`), about one extra forward pass,
    and at its peak holds one block's internals. Returns ``(y1, y2)``.
    """
    blocks = _check_reversible_stack(blocks, x1, x2)
    params = list(
        dict.fromkeys(p for b in blocks for p in b.parameters() if p.requires_grad)
    )
    return _ReversibleStack.apply(x1, x2, blocks, *params)
