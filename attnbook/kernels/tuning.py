"""Tile configurations of the Triton kernels, and the autotuner that picks one on a GPU.

A configuration is a tile (``BLOCK_M`` query rows by ``BLOCK_N`` key rows) and two
launch options (warps, software-pipeline stages), as in Triton's fused-attention
tutorial.
:data:`SPACE` lists what each kernel may run with on a GPU. Not every configuration
suits every GPU: a 128 x 64 float16 tile at head dim 256 needs more shared memory than
an L4 has, and big float32 tiles spill registers. So the space is pruned per target
with the compiled table (:mod:`attnbook.kernels.compile`, ``compiled.json``): only
configurations that were compiled for the GPU's generation, fit its shared memory and
do not spill are candidates (:func:`candidates`). Among the candidates :func:`pick`
times each once per key (the kernel, the device, dtype, head dims, causal, and the
lengths rounded up to a power of two) and keeps the fastest. Under Triton's CPU
interpreter one small configuration runs, untimed. With ``ATTNBOOK_AUTOTUNE=0`` (for
correctness runs on a GPU, where timing every configuration of every new shape takes
longer than the test) :func:`pick` keeps the first candidate that launches cleanly.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..contract import check_sizes

__all__ = [
    "Config",
    "SPACE",
    "INTERPRETER",
    "padded_head_dim",
    "candidates",
    "pick",
    "tuned",
]


@dataclass(frozen=True, order=True)
class Config:
    """One tile configuration: ``block_m`` x ``block_n`` tiles, ``num_warps`` warps and
    ``num_stages`` pipeline stages."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        check_sizes(
            "Config", block_m=self.block_m, block_n=self.block_n,
            num_warps=self.num_warps, num_stages=self.num_stages,
        )  # fmt: skip

    @property
    def label(self) -> str:
        return (
            f"{self.block_m}x{self.block_n}, warps={self.num_warps}, "
            f"stages={self.num_stages}"
        )


#: What each kernel may run with on a GPU, largest tiles first. The 16 x 16 tile is
#: there for block-sparse masks of 16-token blocks (a tile never straddles two mask
#: blocks).
SPACE: dict[str, tuple[Config, ...]] = {
    "fwd": (
        Config(128, 64, 8, 3),
        Config(64, 64, 4, 3),
        Config(64, 32, 4, 2),
        Config(32, 32, 4, 2),
        Config(16, 16, 4, 2),
    ),
    "bwd": (
        Config(64, 64, 8, 2),
        Config(64, 32, 4, 2),
        Config(32, 32, 4, 2),
        Config(16, 16, 4, 2),
    ),
    "delta": (Config(64, 64, 4, 1),),
}
#: The one configuration run by Triton's CPU interpreter (speed is not measured there).
INTERPRETER = Config(32, 32, 4, 1)


def padded_head_dim(head_dim: int) -> int:
    """The width a kernel's tile gives a head of ``head_dim`` (the next power of two, at
    least 16: ``tl.dot`` needs 16): head dims 40, 80, 96 run as 64, 128, 128 with the
    extra columns masked."""
    check_sizes("padded_head_dim", head_dim=head_dim)
    return max(16, 1 << (int(head_dim) - 1).bit_length())


@functools.cache
def _table() -> dict[tuple, dict]:
    """The compiled table by (kernel, capability, dtype, padded head dim, config)."""
    path = Path(__file__).with_name("compiled.json")
    if not path.exists():  # a broken install: the table ships inside the wheel
        raise FileNotFoundError(
            f"{path} is missing: reinstall attnbook (its wheel ships the table)"
        )
    rows = json.loads(path.read_text())["kernels"]
    return {
        (
            row["kernel"],
            row["capability"],
            row["dtype"],
            row["head_dim"],
            Config(*row["config"]) if row.get("config") else None,
        ): row
        for row in rows
    }


def _measured_target(capability: tuple[int, int]) -> int | None:
    """The compiled target that stands in for ``capability``: the nearest one at or
    below it (8.7 -> 8.6, 10.0 -> 9.0). Should that GPU have less shared memory than
    its stand-in, :func:`pick` skips the configurations it refuses to launch."""
    from .compile import TARGETS

    cc = capability[0] * 10 + capability[1]
    below = [t for t in TARGETS if t <= cc]
    return max(below) if below else None


def _check_candidates(kernel, capability) -> None:
    fn = "candidates"
    if not isinstance(kernel, str) or not kernel.startswith(
        ("flash_", "block_sparse_", "decode_")
    ):
        raise ValueError(
            f"{fn}: kernel must name a launch such as 'flash_fwd' or "
            f"'block_sparse_bwd_dq', got {kernel!r}"
        )
    if (
        not isinstance(capability, tuple)
        or len(capability) != 2
        or not all(isinstance(c, int) and not isinstance(c, bool) for c in capability)
    ):
        raise ValueError(
            f"{fn}: capability must be a (major, minor) tuple of ints, "
            f"got {capability!r}"
        )


def candidates(
    kernel: str,
    capability: tuple[int, int],
    dtype: torch.dtype,
    head_dim: int,
    *,
    allow_spills: bool = False,
) -> list[tuple[Config, dict]]:
    """The configurations of ``kernel`` (``"flash_fwd"``, ``"flash_bwd_dkdv"``, ...)
    that the compiled table says fit a GPU of ``capability``: shared memory within its
    per-block limit and, unless ``allow_spills``, no register spills. Each comes with
    its table row (shared memory, registers, spill). Empty when nothing fits."""
    from .compile import TARGETS

    _check_candidates(kernel, capability)
    target = _measured_target(capability)
    if target is None:
        return []
    name = str(dtype).removeprefix("torch.")
    family = _family(kernel)
    found = []
    for config in SPACE[family]:
        row = _table().get((kernel, target, name, padded_head_dim(head_dim), config))
        if row is None or row["shared"] > TARGETS[target].shared:
            continue
        if row["spill"] and not allow_spills:
            continue
        found.append((config, row))
    return found


def _family(kernel: str) -> str:
    if kernel.endswith("_fwd"):
        return "fwd"
    return "delta" if kernel.endswith("delta") else "bwd"


_CHOSEN: dict[Hashable, Config] = {}


def pick(
    key: Hashable,
    configs: list[Config],
    run: Callable[[Config], object],
    *,
    timer: Callable[[Callable[[], None]], float] | None = None,
) -> Config:
    """The fastest of ``configs`` for ``key``, timed once (``run(config)`` launches the
    kernel) and remembered. One configuration is returned untimed.

    A configuration that fails to launch (Triton's ``OutOfResources``) is skipped, and
    so is one whose compiled kernel spills registers (``n_spills`` of what ``run``
    returns: Triton's compiled kernel) while another does not: the compiled table
    measures the padded head dims, and a head of 96 masked inside a tile of 128 may
    need a few more registers than the table says."""
    if not configs:
        raise ValueError("pick: configs is empty: no configuration to choose from")
    if len(configs) == 1:
        return configs[0]
    if key in _CHOSEN:
        return _CHOSEN[key]
    untimed = os.environ.get("ATTNBOOK_AUTOTUNE", "1") == "0"
    if untimed:
        timer = _first_clean
    if timer is None:
        import triton.testing

        def timer(fn):
            return triton.testing.do_bench(fn, warmup=5, rep=20)

    launched = {}
    for config in configs:  # the first launch compiles: what did the compiler need?
        try:
            launched[config] = getattr(run(config), "n_spills", 0) or 0
        except Exception as error:  # a launch the GPU refuses: not a candidate
            if type(error).__name__ != "OutOfResources":
                raise
        if untimed and launched.get(config) == 0:
            break  # the first clean one: compile no other
    if not launched:
        raise RuntimeError(f"no configuration of {key} could launch on this GPU")
    clean = [config for config, spills in launched.items() if spills == 0]
    times = {config: timer(lambda c=config: run(c)) for config in clean or launched}
    best = min(times, key=times.get)
    _CHOSEN[key] = best
    return best


def _first_clean(fn: Callable[[], object]) -> float:
    """The timer of ``ATTNBOOK_AUTOTUNE=0``: nothing is timed, every configuration that
    launched counts the same, and :func:`pick` keeps the first."""
    return 0.0


def tuned() -> dict[Hashable, Config]:
    """What :func:`pick` chose so far in this process, by key (a copy)."""
    return dict(_CHOSEN)
