"""Compile every Triton kernel for T4, A100, A10, L4 and H100 without a GPU, and print
what each needs: shared memory, registers, spills.

    .venv/bin/python benchmarks/bench_kernel_compile.py          # the full matrix
    .venv/bin/python benchmarks/bench_kernel_compile.py --write  # and refresh the table

The variants are the launch code's own (``flash_triton.variants``,
``decode.variants``), so what is compiled is what runs. ``--write`` stores the result
in ``attnbook/kernels/compiled.json``, which ``plan()`` reads;
``tests/test_kernels_compile.py`` recompiles a subset and fails when the table and the
kernels drift apart.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from attnbook.kernels import compile as kc

ROOT = Path(__file__).resolve().parent.parent
DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}
HEAD_DIMS = (16, 32, 64, 128)


def cases():
    for capability in kc.TARGETS:
        for name, dtype in DTYPES.items():
            if name == "bfloat16" and capability < 80:
                continue  # no bfloat16 before Ampere
            for head_dim in HEAD_DIMS:
                yield capability, dtype, head_dim


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="refresh compiled.json")
    parser.add_argument("--processes", type=int, default=None)
    args = parser.parse_args()
    start = time.perf_counter()
    results = kc.compile_variants(list(cases()), processes=args.processes)
    took = time.perf_counter() - start
    import triton

    print(
        f"triton {triton.__version__}: {len(results)} kernels compiled in {took:.0f} s"
    )
    print(
        f"{'target':7} {'dtype':8} {'E':>4} {'kernel':17} {'config':22} "
        f"{'shared':>7} {'regs':>4} {'spill':>6}  fits"
    )
    for r in results:
        ok, _ = kc.fits(r)
        config = r.label[r.label.index("[") + 1 : r.label.index(";")]
        config = ", ".join(
            part
            for part in config.split(", ")
            if not part.startswith(("HEAD_DIM", "CAUSAL", "PRECISION"))
        )
        print(
            f"sm{r.capability:<5} {r.dtype:8} {r.head_dim:>4} {r.kernel:17} "
            f"{config:22} {r.shared // 1024:>5}K {r.registers:>4} "
            f"{r.local + r.stack:>6}  {'yes' if ok else 'NO'}"
        )
    misfits = [r for r in results if not kc.fits(r)[0]]
    print(
        f"{len(misfits)} of {len(results)} do not fit (shared memory over the limit, "
        "or spills)"
    )
    if args.write:
        table = {
            "triton": triton.__version__,
            "kernels": [
                {
                    "capability": r.capability,
                    "dtype": r.dtype,
                    "head_dim": r.head_dim,
                    "kernel": r.kernel,
                    "label": r.label,
                    "shared": r.shared,
                    "registers": r.registers,
                    "spill": r.local + r.stack,
                }
                for r in results
            ],
        }
        path = ROOT / "attnbook" / "kernels" / "compiled.json"
        path.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
