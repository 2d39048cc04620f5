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

__all__ = ["Variant", "parameters"]


def parameters(fn) -> list[tuple[str, bool]]:
    """``(name, is_constexpr)`` for each parameter of a ``@triton.jit`` function, read
    from its Python source, so it works under the interpreter too (which replaces the
    function with one that has no ``params``)."""
    python = getattr(fn, "fn", fn)
    return [
        (name, "constexpr" in str(param.annotation))
        for name, param in inspect.signature(python).parameters.items()
    ]


@dataclass(frozen=True)
class Variant:
    """One compiled form of a Triton kernel.

    ``kernel`` names it (``"flash_fwd"``, ``"flash_bwd_dkdv"``, ...); ``fn`` is the
    ``@triton.jit`` function; ``signature`` maps every parameter to Triton's type string
    (``"*fp16"``, ``"i32"``, ``"i64"``, ``"fp32"``, ``"constexpr"``); ``constexprs``
    gives the compile-time constants; ``num_warps`` and ``num_stages`` are the launch
    options.
    """

    kernel: str
    fn: object = field(compare=False, repr=False)
    signature: dict[str, str] = field(compare=False)
    constexprs: dict[str, object] = field(compare=False)
    num_warps: int = 4
    num_stages: int = 3

    @property
    def label(self) -> str:
        """The kernel and its constants, as one readable string."""
        consts = ", ".join(f"{k}={v}" for k, v in self.constexprs.items())
        return (
            f"{self.kernel}[{consts}; warps={self.num_warps}, stages={self.num_stages}]"
        )
