"""Compile every Triton kernel for T4, A100, A10, L4 and H100 without a GPU, and print
what each needs: shared memory, registers, spills.

    .venv/bin/python benchmarks/bench_kernel_compile.py          # the full matrix
    .venv/bin/python benchmarks/bench_kernel_compile.py --write  # and refresh the table
    .venv/bin/python benchmarks/bench_kernel_compile.py --summary  # the table only

The variants are the launch code's own (``flash_triton.variants``,
``decode.variants``): every kernel in every tile configuration of the autotuner's space,
for head dims 16 to 256 (the padded widths: 40 runs as 64, 96 as 128), causal (the
variant with the most masking), so what is compiled is what runs. ``--write`` stores the
result in ``attnbook/kernels/compiled.json``, which the autotuner's pruning and
``plan()`` read; ``tests/kernels/test_kernels_compile.py`` recompiles a subset and fails when
the table and the kernels drift apart. The summary at the end is the table the tiers page
quotes: per target, dtype and head dim, how many configurations of each kernel fit
without spilling, and what ``plan()`` runs.
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
TABLE = ROOT / "attnbook" / "kernels" / "compiled.json"
DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}
HEAD_DIMS = (16, 32, 64, 128, 256)


def cases():
    for capability in kc.TARGETS:
        for name, dtype in DTYPES.items():
            if name == "bfloat16" and capability < 80:
                continue  # no bfloat16 before Ampere
            for head_dim in HEAD_DIMS:
                yield capability, dtype, head_dim


def summary() -> None:
    """Per target, dtype and head dim: the configurations of the forward, dK/dV and dQ
    kernels that fit without spilling (of those in the space), and plan()'s choice."""
    from attnbook.kernels import plan, tuning

    print(
        "\nfitting configurations (no spills, shared memory within the limit) of the "
        "forward / dK/dV / dQ kernels, and what plan('flash') runs:"
    )
    sizes = {kernel: len(tuning.SPACE[family]) for kernel, family in
             (("flash_fwd", "fwd"), ("flash_bwd_dkdv", "bwd"), ("flash_bwd_dq", "bwd"))}
    header = " | ".join(f"E = {e}" for e in HEAD_DIMS)
    print(f"| target (limit per block) | dtype | {header} |")
    print("|---|---|" + "---|" * len(HEAD_DIMS))
    for cc, target in kc.TARGETS.items():
        for name, dtype in DTYPES.items():
            if name == "bfloat16" and cc < 80:
                continue
            cells = []
            for e in HEAD_DIMS:
                counts = [
                    len(tuning.candidates(k, divmod(cc, 10), dtype, e))
                    for k in sizes
                ]
                backend, _ = plan("flash", divmod(cc, 10), dtype, e)
                fits = "/".join(str(c) for c in counts)
                cells.append(f"{fits} {'T' if backend == 'triton' else 'torch'}")
            label = f"{cc / 10:.1f}, {target.gpus.split(' (')[0]} ({target.shared // 1024} KiB)"
            print(f"| {label} | {name} | " + " | ".join(cells) + " |")
    print(f"(of {'/'.join(str(n) for n in sizes.values())} in the space; T = Triton)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="refresh compiled.json")
    parser.add_argument("--summary", action="store_true", help="print the summary of the table")
    parser.add_argument("--processes", type=int, default=None)
    args = parser.parse_args()
    if args.summary:
        summary()
        return 0
    start = time.perf_counter()
    results = kc.compile_variants(list(cases()), processes=args.processes)
    took = time.perf_counter() - start
    import triton

    print(f"triton {triton.__version__}: {len(results)} kernels compiled in {took:.0f} s")
    print(f"{'target':7} {'dtype':8} {'E':>4} {'kernel':22} {'config':18} "
          f"{'shared':>7} {'regs':>4} {'spill':>6}  fits")
    for r in results:
        ok, _ = kc.fits(r)
        config = "x".join(str(c) for c in r.config[:2]) + f" w{r.config[2]} s{r.config[3]}" if r.config else "-"
        print(f"sm{r.capability:<5} {r.dtype:8} {r.head_dim:>4} {r.kernel:22} {config:18} "
              f"{r.shared // 1024:>5}K {r.registers:>4} {r.local + r.stack:>6}  {'yes' if ok else 'NO'}")
    misfits = [r for r in results if not kc.fits(r)[0]]
    print(f"{len(misfits)} of {len(results)} do not fit (shared memory over the limit, or spills)")
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
                    "config": r.config,
                    "shared": r.shared,
                    "registers": r.registers,
                    "spill": r.local + r.stack,
                }
                for r in results
            ],
        }
        rows = ",\n".join(json.dumps(row) for row in table["kernels"])  # a row a line
        TABLE.write_text(f'{{"triton": "{table["triton"]}", "kernels": [\n{rows}\n]}}\n')
        print(f"wrote {TABLE.relative_to(ROOT)}")
        from attnbook.kernels import tuning

        tuning._table.cache_clear()
        summary()
    return 0


if __name__ == "__main__":
    sys.exit(main())
