"""Triton GPU kernels (FlashAttention, block-sparse, decoding), and which GPUs can run
them.

The kernel modules (:mod:`attnbook.kernels.flash_triton`,
:mod:`attnbook.kernels.decode`) import ``triton`` and are loaded only when used; this
package itself needs nothing but torch. Its two functions answer the question a reader
on Colab asks first, "will the Triton kernels run here?":

* :func:`plan` is the rule the dispatchers (:func:`attnbook.flash.flash_attention`,
  :func:`attnbook.kvcache.decode_attention`, ``TinyGPT``'s decoding step) follow for
  ``backend="auto"``: Triton on a CUDA GPU that can run the kernel, else the PyTorch
  path, with the reason;
* :func:`support` reports the current machine: GPU, compute capability, Triton version,
  and what each kernel will do there.

The rules, from Triton's and NVIDIA's documentation: Triton generates code for compute
capability 7.0 and newer and lists 8.0+ (Ampere) as its supported NVIDIA hardware; its
recent versions compute ``tl.dot`` on 7.x GPUs (V100, T4) without tensor cores, so the
kernels are correct there but slow. bfloat16 needs 8.0+. The FlashAttention kernels take
head dimensions 16, 32, 64 and 128.

And one rule from the kernels themselves: every kernel was compiled for the book's
targets without a GPU (``benchmarks/bench_kernel_compile.py``, stored in
``compiled.json`` beside this file, see :mod:`attnbook.kernels.compile`). A
configuration whose shared memory exceeds its GPU's per-block limit would fail to
launch, and float32 tiles that spill registers to local memory run far slower than
PyTorch: :func:`plan` sends both to the PyTorch path and says why.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "FLASH_HEAD_DIMS",
    "plan",
    "plan_for",
    "compiled_fit",
    "support",
    "KernelSupport",
]

#: Head dimensions the FlashAttention kernels are compiled for (one tile shape each).
FLASH_HEAD_DIMS = (16, 32, 64, 128)

_KERNELS = ("flash", "decode")


def _triton_version() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        return importlib.metadata.version("triton")
    except (
        importlib.metadata.PackageNotFoundError
    ):  # pragma: no cover - a source build of triton
        return "unknown"


# the kernels each dispatcher launches (the block-sparse kernel has its own rules)
_LAUNCHED = {
    "flash": ("flash_fwd", "flash_bwd_delta", "flash_bwd_dkdv", "flash_bwd_dq"),
    "decode": ("decode_split", "decode_merge"),
}


@functools.cache
def _compiled() -> list[dict]:
    path = Path(__file__).with_name("compiled.json")
    return json.loads(path.read_text())["kernels"] if path.exists() else []


def compiled_fit(
    kernel: str, capability: tuple[int, int], dtype: torch.dtype, head_dim: int
) -> tuple[str, str] | None:
    """What the compiled table says of ``kernel``'s launches on ``capability``: ``None``
    when all fit, ``("shared", why)`` when one needs more shared memory than a block
    may have, ``("spill", why)`` when one spills registers. The nearest measured target
    at or below ``capability`` stands in for it (8.7 -> 8.6, 10.0 -> 9.0)."""
    measured = sorted({row["capability"] for row in _compiled()})
    cc = capability[0] * 10 + capability[1]
    below = [t for t in measured if t <= cc]
    if not below:
        return None
    target, name = below[-1], str(dtype).removeprefix("torch.")
    rows = [
        row
        for row in _compiled()
        if row["capability"] == target
        and row["dtype"] == name
        and row["head_dim"] == head_dim
        and row["kernel"] in _LAUNCHED[kernel]
    ]
    from .compile import TARGETS

    limit = TARGETS[target].shared
    for row in rows:
        if row["shared"] > limit:
            return "shared", (
                f"{row['kernel']} needs {row['shared'] // 1024} KiB of shared memory "
                f"for head_dim {head_dim} in {name}; sm{target} allows "
                f"{limit // 1024} KiB per block"
            )
    for row in rows:
        if row["spill"]:
            return "spill", (
                f"{row['kernel']} spills {row['spill']} bytes per thread to local "
                f"memory for head_dim {head_dim} in {name} on sm{target}"
            )
    return None


def plan(
    kernel: str,
    capability: tuple[int, int] | None,
    dtype: torch.dtype = torch.float16,
    head_dim: int = 64,
    triton_version: str | None = "installed",
) -> tuple[str, str]:
    """The backend ``"auto"`` picks for ``kernel`` (``"flash"`` or ``"decode"``), and
    why.

    ``capability`` is the GPU's compute capability ``(major, minor)`` (``None``: no CUDA
    tensor), ``triton_version`` ``None`` when Triton is not installed. Returns
    ``("triton", note)`` or ``("torch", reason)``; the note says when Triton runs but
    without tensor cores (capability 7.x).
    """
    if kernel not in _KERNELS:
        raise ValueError(f"kernel must be one of {_KERNELS}, got {kernel!r}")
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
    if kernel == "flash" and head_dim not in FLASH_HEAD_DIMS:
        return (
            "torch",
            f"head_dim {head_dim} is not one of the kernels' {FLASH_HEAD_DIMS}",
        )
    misfit = compiled_fit(kernel, tuple(capability), dtype, head_dim)
    if misfit is not None and (misfit[0] == "shared" or dtype == torch.float32):
        return "torch", misfit[1] + (
            ": it would not launch"
            if misfit[0] == "shared"
            else ": slower than PyTorch"
        )
    if tuple(capability) < (8, 0):
        return "triton", (
            "runs, but Triton computes tl.dot without tensor cores on compute "
            "capability "
            f"{capability[0]}.{capability[1]}: correct and slower than on 8.0+"
        )
    return (
        "triton",
        f"compute capability {capability[0]}.{capability[1]}: fully supported",
    )


def plan_for(
    kernel: str, x: torch.Tensor, v: torch.Tensor | None = None
) -> tuple[str, str]:
    """:func:`plan` for queries ``x`` shaped ``(..., head_dim)`` (their device, dtype
    and last dim) and, if given, values ``v``: the Triton kernels need values as wide as
    the keys, so a different value width runs the PyTorch path."""
    if v is not None and v.shape[-1] != x.shape[-1]:
        return "torch", (
            f"value width {v.shape[-1]} differs from head_dim {x.shape[-1]}: the "
            "Triton kernels need equal widths"
        )
    capability = torch.cuda.get_device_capability(x.device) if x.is_cuda else None
    return plan(kernel, capability, x.dtype, x.shape[-1], _triton_version())


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
    device = torch.device(device)
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
        for kernel in _KERNELS
        for dtype in (torch.float16, torch.bfloat16, torch.float32)
    }
    return KernelSupport(
        name, capability, version, os.environ.get("TRITON_INTERPRET") == "1", plans
    )
