"""The kernels compiled for named GPUs, without one: shared memory, registers, spills.

Triton compiles for a GPU it does not see: ``triton.compile(ASTSource(...),
target=GPUTarget("cuda", capability, 32))`` runs the whole pipeline to PTX and cubin,
and ``cuobjdump --dump-resource-usage`` (shipped in Triton's wheel) reads what each
kernel needs from the cubin. :func:`compile_variants` does that for every
:class:`~attnbook.kernels.variants.Variant` the launch code lists
(``flash_triton.variants``, ``decode.variants``), in worker processes that import the
kernels without ``TRITON_INTERPRET`` (the interpreter replaces ``@triton.jit``
functions when they are defined, so a process that interprets cannot compile).
:func:`fits` says whether a compiled kernel can launch on its target and run without
spilling registers to local memory.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import re
import subprocess
import tempfile
from dataclasses import astuple, dataclass
from pathlib import Path

import torch

__all__ = [
    "Target",
    "TARGETS",
    "Resources",
    "compile_variant",
    "compile_variants",
    "fits",
]


@dataclass(frozen=True)
class Target:
    """A GPU generation: ``shared`` is the most shared memory one block may use (the
    opt-in maximum, in bytes), ``registers`` the most registers per thread."""

    capability: int
    gpus: str
    shared: int
    registers: int = 255


#: The targets the book's readers meet (from NVIDIA's CUDA C++ Programming Guide,
#: "Technical specifications per compute capability").
TARGETS = {
    75: Target(75, "T4, RTX 20xx (Turing)", 64 * 1024),
    80: Target(80, "A100 (Ampere)", 163 * 1024),
    86: Target(86, "A10, RTX 30xx (Ampere)", 99 * 1024),
    89: Target(89, "L4, RTX 40xx (Ada)", 99 * 1024),
    90: Target(90, "H100 (Hopper)", 227 * 1024),
}


@dataclass(frozen=True)
class Resources:
    """What one compiled kernel needs on its target: shared memory (bytes per block),
    registers per thread, and local memory per thread (spilled registers and stack,
    bytes). ``config`` is the tile configuration ``(block_m, block_n, num_warps,
    num_stages)`` for kernels with several (:data:`attnbook.kernels.tuning.SPACE`)."""

    kernel: str
    label: str
    capability: int
    dtype: str
    head_dim: int
    shared: int
    registers: int
    local: int
    stack: int
    config: tuple[int, int, int, int] | None = None


def fits(resources: Resources) -> tuple[bool, str]:
    """Whether the kernel launches on its target (shared memory within the per-block
    limit) and runs from registers alone (no local memory), and if not, why."""
    if not isinstance(resources, Resources) or resources.capability not in TARGETS:
        raise ValueError(
            f"fits: resources must be Resources compiled for one of {list(TARGETS)}, "
            f"got {resources!r}"
        )
    target = TARGETS[resources.capability]
    if resources.shared > target.shared:
        return False, (
            f"{resources.kernel} needs {resources.shared // 1024} KiB of shared "
            f"memory, sm{resources.capability} allows {target.shared // 1024} KiB per "
            "block"
        )
    spill = resources.local + resources.stack
    if spill:
        return False, (
            f"{resources.kernel} spills {spill} bytes per thread to local memory on "
            f"sm{resources.capability}"
        )
    return True, "fits"


def _cuobjdump() -> str:
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not path.exists():
        raise FileNotFoundError(f"cuobjdump is not in Triton's wheel ({path})")
    return str(path)


def compile_variant(module: str, kwargs: dict, index: int, capability: int) -> dict:
    """Compile variant ``index`` of ``module.variants(**kwargs)`` (a module that lists
    its kernels' launch variants, as :mod:`attnbook.kernels.variants` does) for the GPU
    of compute ``capability``, and read its resources with ``cuobjdump``: a dict of
    kernel, label, config, shared memory (bytes), registers, local and stack bytes.
    Run it in a process where Triton's interpreter is off."""
    import importlib

    if capability not in TARGETS:
        raise ValueError(
            f"compile_variant: capability must be one of {list(TARGETS)}, got "
            f"{capability!r}"
        )
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    variant = importlib.import_module(module).variants(**kwargs)[index]
    source = ASTSource(
        fn=variant.fn,
        signature=variant.signature,
        constexprs=variant.constexprs,
        attrs=variant.attrs,
    )
    compiled = triton.compile(
        source,
        target=GPUTarget("cuda", capability, 32),
        options={"num_warps": variant.num_warps, "num_stages": variant.num_stages},
    )
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        text = subprocess.run(
            [_cuobjdump(), "--dump-resource-usage", str(cubin)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    usage = {
        key: int(value)
        for key, value in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", text)
    }
    return {
        "kernel": variant.kernel,
        "label": variant.label,
        "config": None if variant.config is None else list(astuple(variant.config)),
        "shared": max(compiled.metadata.shared, usage.get("SHARED", 0)),
        "registers": usage.get("REG", 0),
        "local": usage.get("LOCAL", 0),
        "stack": usage.get("STACK", 0),
    }


def _without_interpreter() -> None:
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


def compile_variants(
    cases: list[tuple[int, torch.dtype, int]],
    *,
    causal: bool = True,
    kernels: tuple[str, ...] = ("flash", "decode"),
    processes: int | None = None,
) -> list[Resources]:
    """Compile every variant of ``kernels`` for each ``(capability, dtype, head_dim)``
    in ``cases`` and return their :class:`Resources`, in order. Runs in ``processes``
    worker processes (default: the CPU count)."""
    modules = {
        "flash": ("attnbook.kernels.flash_triton", {"causal": causal}),
        "decode": ("attnbook.kernels.decode", {}),
    }
    jobs = []
    for capability, dtype, head_dim in cases:
        if capability not in TARGETS:
            raise ValueError(
                f"compile_variants: capability must be one of {list(TARGETS)}, got "
                f"{capability!r}"
            )
        for kernel in kernels:
            module, extra = modules[kernel]
            kwargs = {"dtype": dtype, "head_dim": head_dim, **extra}
            count = len(_variants_count(module, kwargs))
            jobs += [(module, kwargs, i, capability) for i in range(count)]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(
        processes or os.cpu_count(),
        mp_context=context,
        initializer=_without_interpreter,
    ) as pool:
        done = list(pool.map(compile_variant, *zip(*jobs, strict=True)))
    return [
        Resources(
            capability=job[3],
            dtype=str(job[1]["dtype"]).removeprefix("torch."),
            head_dim=job[1]["head_dim"],
            **{**result, "config": result["config"] and tuple(result["config"])},
        )
        for job, result in zip(jobs, done, strict=True)
    ]


def _variants_count(module: str, kwargs: dict) -> list:
    """The variants' kernels, listed here without compiling (the interpreter may be on
    in this process: only their number is used)."""
    import importlib

    return importlib.import_module(module).variants(**kwargs)
