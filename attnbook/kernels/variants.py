"""What a kernel launch compiles to: one :class:`Variant` per (kernel, configuration).

The launch code of each kernel module (:mod:`attnbook.kernels.flash_triton`,
:mod:`attnbook.kernels.decode`) lists, with its ``variants(...)`` function, every
compiled form its dispatcher and autotuner can choose for a GPU target: the Triton
function, its signature, the compile-time constants and the launch options. The compile
test and ``benchmarks/bench_kernel_compile.py`` compile exactly these for named GPUs
(without one), so what is proven is what runs.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

__all__ = ["Variant", "parameters", "specialize"]


def parameters(fn) -> list[tuple[str, bool]]:
    """``(name, is_constexpr)`` for each parameter of a ``@triton.jit`` function, read
    from its Python source, so it works under the interpreter too (which replaces the
    function with one that has no ``params``)."""
    python = getattr(fn, "fn", fn)
    if not callable(python):
        raise TypeError(f"parameters: fn must be a @triton.jit function, got {fn!r}")
    return [
        (name, "constexpr" in str(param.annotation))
        for name, param in inspect.signature(python).parameters.items()
    ]


def specialize(
    fn, types: dict[str, str], constexprs: dict[str, object]
) -> tuple[dict[str, str], dict[str, object], dict[tuple[int], list]]:
    """How a launch on contiguous, freshly allocated tensors specializes kernel ``fn``:
    ``(signature, constexprs, attrs)`` for ``triton.compile``.

    ``types`` gives the Triton type of the runtime parameters that are not ``i32``
    (pointers ``"*fp16"``, scales ``"fp32"``). A stride named ``stride_*d`` (the last
    dimension's) is the constant 1, as Triton specializes an integer argument equal to
    1; pointers (16-byte aligned allocations) and the other strides (multiples of a
    head dim >= 16) carry ``tt.divisibility`` 16, as Triton marks such arguments.
    """
    for name, arg in (("types", types), ("constexprs", constexprs)):
        if not isinstance(arg, dict):
            raise TypeError(f"specialize: {name} must be a dict, got {arg!r}")
    signature, constants, attrs = {}, dict(constexprs), {}
    for index, (name, is_constexpr) in enumerate(parameters(fn)):
        if is_constexpr:
            signature[name] = "constexpr"
            continue
        if name.startswith("stride_") and name.endswith("d"):
            signature[name], constants[name] = "constexpr", 1
            continue
        signature[name] = types.get(name, "i32")
        if signature[name].startswith("*") or name.startswith("stride_"):
            attrs[(index,)] = [["tt.divisibility", 16]]
    return signature, constants, attrs


@dataclass(frozen=True)
class Variant:
    """One compiled form of a Triton kernel.

    ``kernel`` names it (``"flash_fwd"``, ``"flash_bwd_dkdv"``, ...); ``fn`` is the
    ``@triton.jit`` function; ``signature`` maps every parameter to Triton's type string
    (``"*fp16"``, ``"i32"``, ``"i64"``, ``"fp32"``, ``"constexpr"``); ``constexprs``
    gives the compile-time constants; ``num_warps`` and ``num_stages`` are the launch
    options; ``config`` is the :class:`attnbook.kernels.tuning.Config` it was made
    from (``None`` for kernels with one fixed form); ``attrs`` are the argument
    properties a launch specializes on (Triton's ``tt.divisibility`` of pointers and
    strides).
    """

    kernel: str
    fn: object = field(compare=False, repr=False)
    signature: dict[str, str] = field(compare=False)
    constexprs: dict[str, object] = field(compare=False)
    num_warps: int = 4
    num_stages: int = 3
    config: object = None
    attrs: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def label(self) -> str:
        """The kernel and its constants, as one readable string."""
        consts = ", ".join(
            f"{k}={v}"
            for k, v in self.constexprs.items()
            if not k.startswith("stride_")  # the unit strides of a contiguous launch
        )
        return (
            f"{self.kernel}[{consts}; warps={self.num_warps}, stages={self.num_stages}]"
        )
