"""Triton GPU kernels (FlashAttention, block-sparse, decoding), and which GPUs can run
them.

The kernel modules (:mod:`attnbook.kernels.flash_triton`,
:mod:`attnbook.kernels.decode`) import ``triton`` and are loaded only when used; their
launchers trust their inputs, which the entry points of :mod:`attnbook.attend`
validate once. This package itself needs nothing but torch. Its two functions answer
the question a reader on Colab asks first, "will the Triton kernels run here?":

* :func:`plan` is the rule the dispatchers (:func:`attnbook.attend.flash_attention`,
  :func:`attnbook.attend.decode_attention`, ``TinyGPT``'s decoding step) follow for
  ``backend="auto"``: Triton on a CUDA GPU that can run the kernel, else the PyTorch
  path, with the reason;
* :func:`support` reports the current machine: GPU, compute capability, Triton version,
  and what each kernel will do there.

The rules, from Triton's and NVIDIA's documentation: Triton generates code for compute
capability 7.0 and newer and lists 8.0+ (Ampere) as its supported NVIDIA hardware; its
recent versions compute ``tl.dot`` on 7.x GPUs (V100, T4) without tensor cores, so the
kernels are correct there but slow. bfloat16 needs 8.0+. The kernels take any head
dimension up to 256 (padded to a power of two inside), and values as wide or narrow as
the keys.

And one rule from the kernels themselves: every kernel, in every tile configuration its
autotuner may choose (:mod:`attnbook.kernels.tuning`), was compiled for the book's
targets without a GPU (``benchmarks/bench_kernel_compile.py``, stored in
``compiled.json`` beside this file, see :mod:`attnbook.kernels.compile`). A
configuration whose shared memory exceeds its GPU's per-block limit would fail to
launch, and tiles that spill registers to local memory run slowly: the autotuner only
tries configurations that fit and do not spill, and :func:`plan` sends a kernel with
none to the PyTorch path and says why (on 7.x GPUs, where every float16 tile spills,
Triton still runs float16, and says so).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import sys
import textwrap
from dataclasses import dataclass

import torch

__all__ = [
    "MAX_HEAD_DIM",
    "IN_HEAD_LIMIT",
    "KernelSupport",
    "check_addressing",
    "compiled_fit",
    "plan",
    "plan_for",
    "support",
]

#: The widest head the kernels take; narrower heads are padded to a power of two.
MAX_HEAD_DIM = 256

_KERNELS = ("flash", "block_sparse", "decode")

#: Offsets within one head are 32-bit in the kernels (batch and head offsets 64-bit).
IN_HEAD_LIMIT = 2**31


def check_addressing(fn: str, **tensors: torch.Tensor) -> None:
    """Refuse a ``(B, H, rows, cols)`` tensor whose rows of one head span
    :data:`IN_HEAD_LIMIT` elements or more: the kernels address within a head in 32
    bits. The entry points of :mod:`attnbook.attend` ask this before they launch."""
    for name, t in tensors.items():
        span = (t.shape[2] - 1) * t.stride(2) + (t.shape[3] - 1) * t.stride(3)
        if span >= IN_HEAD_LIMIT:
            raise ValueError(
                f"{fn}: {name} {tuple(t.shape)} with strides {t.stride()} spans "
                f"{span} elements within one head; the kernels address at most 2^31 "
                "there (batch and head offsets are 64-bit): make each head's rows "
                "closer together"
            )


@functools.cache
def _triton_version() -> str | None:
    """Triton's installed version, ``None`` without it: read once per process (reading
    the package metadata took most of a call's host time)."""
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        return importlib.metadata.version("triton")
    except (
        importlib.metadata.PackageNotFoundError
    ):  # pragma: no cover - a source build of triton
        return "unknown"


#: The Triton kernels each dispatcher launches.
LAUNCHED = {
    "flash": ("flash_fwd", "flash_bwd_delta", "flash_bwd_dkdv", "flash_bwd_dq"),
    "block_sparse": (
        "block_sparse_fwd",
        "flash_bwd_delta",
        "block_sparse_bwd_dkdv",
        "block_sparse_bwd_dq",
    ),
    "decode": ("decode_split", "decode_merge"),
}


def _check_kernel(fn: str, kernel) -> None:
    if kernel not in _KERNELS:
        raise ValueError(f"{fn}: kernel must be one of {_KERNELS}, got {kernel!r}")


def compiled_fit(
    kernel: str,
    capability: tuple[int, int],
    dtype: torch.dtype,
    head_dim: int,
    block_size: int | None = None,
) -> tuple[str, str] | None:
    """What the compiled table says of ``kernel``'s launches (``"flash"``,
    ``"block_sparse"``, ``"decode"``) on a GPU of ``capability``.

    ``None`` when every kernel launched has a configuration that fits: within the
    per-block shared memory and without spills (the autotuner chooses among those; for
    block-sparse masks, tiles no larger than ``block_size``). ``("shared", why)`` when
    one has no configuration within the shared memory, ``("spill", why)`` when all of a
    kernel's configurations that fit spill registers. The nearest measured target at or
    below ``capability`` stands in for it (8.7 -> 8.6, 10.0 -> 9.0).
    """
    from .compile import TARGETS
    from .tuning import _measured_target, _table, padded_head_dim

    _check_kernel("compiled_fit", kernel)
    target = _measured_target(tuple(capability))
    if target is None:
        return None
    name, width = str(dtype).removeprefix("torch."), padded_head_dim(head_dim)
    limit = TARGETS[target].shared
    spills = []
    for launched in LAUNCHED[kernel]:
        rows = [
            row
            for (k, cc, dt, e, config), row in _table().items()
            if (k, cc, dt, e) == (launched, target, name, width)
            and (
                block_size is None
                or config is None
                or max(config.block_m, config.block_n) <= block_size
            )
        ]
        if not rows:
            continue  # not measured (another Triton's table): nothing to say
        fixed = rows[0]["config"] is None  # one form per launch: all must fit
        within = [row for row in rows if row["shared"] <= limit]
        if (fixed and len(within) < len(rows)) or not within:
            worst = (
                max(rows, key=lambda row: row["shared"])
                if fixed
                else min(rows, key=lambda row: row["shared"])
            )
            return "shared", (
                f"{launched} needs {worst['shared'] // 1024} KiB of shared memory "
                f"{'' if fixed else 'in its smallest tile '}for head_dim {head_dim} "
                f"in {name}; sm{target} allows {limit // 1024} KiB per block"
            )
        clean = [row for row in within if not row["spill"]]
        if (fixed and len(clean) < len(within)) or not clean:
            least = min(within, key=lambda row: row["spill"])
            spills.append(
                f"{launched} spills {least['spill']} bytes per thread to local "
                f"memory for head_dim {head_dim} in {name} on sm{target}"
            )
    return ("spill", spills[0]) if spills else None


def plan(
    kernel: str,
    capability: tuple[int, int] | None,
    dtype: torch.dtype = torch.float16,
    head_dim: int = 64,
    triton_version: str | None = "installed",
    block_size: int | None = None,
) -> tuple[str, str]:
    """The backend ``"auto"`` picks for ``kernel`` (``"flash"``, ``"block_sparse"`` or
    ``"decode"``), and why.

    ``capability`` is the GPU's compute capability ``(major, minor)`` (``None``: no CUDA
    tensor), ``triton_version`` ``None`` when Triton is not installed, ``head_dim`` the
    wider of the key and value widths, ``block_size`` the block of a block-sparse mask.
    Returns ``("triton", note)`` or ``("torch", reason)``; the note says when Triton
    runs but without tensor cores (capability 7.x).
    """
    _check_kernel("plan", kernel)
    if capability is None:
        return (
            "torch",
            "no CUDA tensor: the PyTorch reference runs (Triton only under "
            "TRITON_INTERPRET=1, for tests)",
        )
    if triton_version is None:
        return "torch", "Triton is not installed (pip install triton, or attnbook[gpu])"
    if tuple(capability) < (7, 0):
        return (
            "torch",
            "Triton does not compile for compute capability "
            f"{capability[0]}.{capability[1]} (< 7.0)",
        )
    if dtype == torch.bfloat16 and tuple(capability) < (8, 0):
        return (
            "torch",
            "bfloat16 needs compute capability >= 8.0, this GPU has "
            f"{capability[0]}.{capability[1]}",
        )
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return "torch", f"the kernels take float16, bfloat16 or float32, not {dtype}"
    if head_dim > MAX_HEAD_DIM:
        return "torch", f"head_dim {head_dim} is over the kernels' {MAX_HEAD_DIM}"
    if kernel == "block_sparse" and (
        block_size is None or block_size < 16 or block_size & (block_size - 1)
    ):
        return "torch", (
            f"block_size {block_size}: the Triton kernel takes powers of two >= 16"
        )
    misfit = compiled_fit(kernel, tuple(capability), dtype, head_dim, block_size)
    tensor_cores = tuple(capability) >= (8, 0)
    if misfit is not None and (
        misfit[0] == "shared" or dtype == torch.float32 or tensor_cores
    ):
        return "torch", misfit[1] + (
            ": it would not launch"
            if misfit[0] == "shared"
            else ": slower than PyTorch"
        )
    if not tensor_cores:
        return "triton", (
            "runs, but Triton computes tl.dot without tensor cores on compute "
            "capability "
            f"{capability[0]}.{capability[1]}: correct and slower than on 8.0+"
            + (f" ({misfit[1]})" if misfit else "")
        )
    return (
        "triton",
        f"compute capability {capability[0]}.{capability[1]}: fully supported",
    )


def plan_for(
    kernel: str,
    x: torch.Tensor,
    v: torch.Tensor | None = None,
    block_size: int | None = None,
) -> tuple[str, str]:
    """:func:`plan` for queries ``x`` shaped ``(..., head_dim)`` (their device, dtype
    and last dim), values ``v`` if given (the wider of the two widths decides) and a
    block-sparse mask's ``block_size``."""
    _check_kernel("plan_for", kernel)
    for name, t in (("x", x), ("v", v)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"plan_for: {name} must be a torch.Tensor, got {t!r}")
    width = max(x.shape[-1], v.shape[-1] if v is not None else 0)
    capability = torch.cuda.get_device_capability(x.device) if x.is_cuda else None
    return plan(kernel, capability, x.dtype, width, _triton_version(), block_size)


def triton_missing(
    x: torch.Tensor, module: str, kernel: str, *, installed: bool | None = None
) -> str | None:
    """What the Triton kernel ``kernel`` of the module ``module`` (its dotted name,
    ``"attnbook.kernels.decode"``) still needs to run on tensors like ``x``, said so
    that a reader can get it; ``None`` when it can run.

    A CUDA tensor runs on the GPU. A CPU tensor needs Triton's interpreter:
    ``TRITON_INTERPRET=1`` set before ``module`` is first imported, since Triton reads
    it when the kernels are defined. Without it Triton fails with "0 active drivers",
    and set too late the kernel was compiled for a GPU. ``installed`` says whether
    Triton is installed (default: look). The entry points of :mod:`attnbook.attend`
    (:func:`attnbook.attend.flash_attention`,
    :func:`attnbook.attend.decode_attention`) raise with this before a launch; the
    launchers behind them trust it."""
    if installed is None:
        installed = _triton_version() is not None
    if not installed:
        return (
            "the triton package, which is not installed (pip install triton, or "
            "attnbook[gpu])"
        )
    if x.is_cuda:
        return None
    if os.environ.get("TRITON_INTERPRET") != "1":
        return (
            f"a CUDA tensor or Triton's CPU interpreter; q is on {x.device} and "
            "TRITON_INTERPRET is not '1'. For the interpreter (slow, for tests) set "
            f"os.environ['TRITON_INTERPRET'] = '1' before {module} is first imported "
            "(restart the Python kernel if it was)"
        )
    defined = getattr(sys.modules.get(module), kernel, None)
    if defined is not None and type(defined).__name__ != "InterpretedFunction":
        return (
            f"Triton's CPU interpreter for q on {x.device}: TRITON_INTERPRET=1 was "
            f"set after {module} had been imported, so its kernels were compiled for a "
            "GPU (Triton reads the variable when it defines them). Set it before the "
            "first import (restart the Python kernel)"
        )
    return None


@dataclass(frozen=True)
class KernelSupport:
    """What :func:`support` found: the device and, per kernel and dtype, the backend and
    the reason."""

    device: str
    capability: tuple[int, int] | None
    triton_version: str | None
    interpreter: bool
    plans: dict[tuple[str, str], tuple[str, str]]

    def __str__(self) -> str:
        cap = (
            "-"
            if self.capability is None
            else f"{self.capability[0]}.{self.capability[1]}"
        )
        lines = [
            f"device: {self.device} (compute capability {cap})",
            f"triton: {self.triton_version or 'not installed'}"
            + ("; TRITON_INTERPRET=1 (CPU interpreter)" if self.interpreter else ""),
        ]
        for (kernel, dtype), (backend, why) in self.plans.items():
            head = f"{kernel + ' ' + dtype + ':':<17} {backend:<6} "
            # fold long reasons under themselves: the report fits 88 columns
            lines += textwrap.wrap(
                why, 88, initial_indent=head, subsequent_indent=" " * len(head)
            )
        return "\n".join(lines)


def support(device: torch.device | str | None = None) -> KernelSupport:
    """Report which backend each kernel uses on ``device`` (default: the current CUDA
    GPU, else CPU).

    ``print(attnbook.kernels.support())`` in a Colab notebook shows the GPU, its compute
    capability, the Triton version and, for the flash and decode kernels in
    float16/bfloat16/float32 (head_dim 64), whether ``backend="auto"`` runs Triton or
    the PyTorch path, and why.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(
            f"support: device must be a torch.device or a name such as 'cuda:0', got "
            f"{device!r}"
        ) from None
    if device.type == "cuda":
        name, capability = (
            torch.cuda.get_device_name(device),
            torch.cuda.get_device_capability(device),
        )
    else:
        name, capability = device.type, None
    version = _triton_version()
    plans = {
        (kernel, str(dtype).removeprefix("torch.")): plan(
            kernel, capability, dtype, 64, version
        )
        for kernel in ("flash", "decode")
        for dtype in (torch.float16, torch.bfloat16, torch.float32)
    }
    return KernelSupport(
        name, capability, version, os.environ.get("TRITON_INTERPRET") == "1", plans
    )
