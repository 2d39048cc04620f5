"""Attention's cost against sequence length: attnbook's readable attention beside PyTorch's fused one.

For ``n = 2^7 .. 2^max`` this times ``attnbook.core.scaled_dot_product_attention`` (which
materializes the ``(B, h, n, n)`` scores and weights, as Chapter 2 explains) and
``torch.nn.functional.scaled_dot_product_attention`` (a fused kernel that picks a memory-efficient
backend where it can) on the same random ``(1, heads, n, d / heads)`` inputs. It prints a table of the
best time (of ``--repeat`` runs) and peak extra memory of each, their ratios, and the log-log slopes ``p`` in
``time ~ n^p`` and ``memory ~ n^p`` fitted over all lengths and over the longer half.

Run it from the repository root, e.g.::

    python benchmarks/bench_attention_scaling.py                       # CPU, n up to 2^11
    python benchmarks/bench_attention_scaling.py --device cuda --max-log2-n 14 --dtype float16

Peak memory comes from ``attnbook.complexity.measure``: the CUDA allocator on a GPU, the process's
peak resident set size on a Linux CPU (a few MiB of noise, so small lengths may read 0).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from attnbook.complexity import measure
from attnbook.core import scaled_dot_product_attention
from attnbook.utils import default_device, seed_everything
from common import record, slope_text as _slope  # benchmarks/common.py

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
IMPLEMENTATIONS = {"attnbook": scaled_dot_product_attention, "torch": F.scaled_dot_product_attention}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=str(default_device()), help="cpu or cuda (default: cuda when visible)")
    parser.add_argument("--max-log2-n", type=int, default=11, help="longest sequence is 2^this (default 11: n = 2048)")
    parser.add_argument("--d", type=int, default=512, help="model width d = heads * head_dim (default 512)")
    parser.add_argument("--heads", type=int, default=8, help="number of heads h (default 8)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per point; the fastest is reported")
    args = parser.parse_args(argv)
    if args.max_log2_n < 8:
        parser.error("--max-log2-n must be at least 8 (two lengths are needed for a slope)")
    if args.d % args.heads:
        parser.error(f"--d={args.d} must be divisible by --heads={args.heads}")
    return args


def run(args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """Measure both implementations at every length; returns ``{impl: {"n", "time_s", "peak_bytes"}}``."""
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    generator = seed_everything(0)
    head_dim = args.d // args.heads
    results = {name: {"n": [], "time_s": [], "peak_bytes": []} for name in IMPLEMENTATIONS}
    lengths = [2**p for p in range(7, args.max_log2_n + 1)]
    for n in tqdm(lengths, desc="sequence lengths"):
        q, k, v = (torch.randn(1, args.heads, n, head_dim, generator=generator).to(device, dtype) for _ in range(3))
        for name, fn in IMPLEMENTATIONS.items():
            record(results[name], n, measure(fn, q, k, v, repeat=args.repeat))
        del q, k, v
    return results



def report(results: dict, args: argparse.Namespace) -> str:
    """The table (time in ms, memory in MiB, attnbook / torch ratios) and the fitted slopes, as text."""
    mib = 2.0**20
    ours, theirs = results["attnbook"], results["torch"]
    lines = [
        f"device={args.device} dtype={args.dtype} batch=1 heads={args.heads} head_dim={args.d // args.heads} "
        f"(best of {args.repeat} runs; peak extra memory)",
        f"{'n':>6} | {'attnbook ms':>11} {'torch ms':>9} {'ratio':>6} | {'attnbook MiB':>12} {'torch MiB':>9} {'ratio':>6}",
    ]
    for i, n in enumerate(ours["n"]):
        t_a, t_t = ours["time_s"][i], theirs["time_s"][i]
        m_a, m_t = ours["peak_bytes"][i], theirs["peak_bytes"][i]
        mem_ratio = f"{m_a / m_t:6.1f}" if m_t > 0 else f"{'n/a':>6}"
        lines.append(
            f"{n:>6} | {t_a * 1e3:>11.2f} {t_t * 1e3:>9.2f} {t_a / t_t:>6.1f} | "
            f"{m_a / mib:>12.1f} {m_t / mib:>9.1f} {mem_ratio}"
        )
    if 0 in theirs["peak_bytes"]:
        lines.append("  (torch MiB 0.0: below the resolution of the reading; ratio n/a)")
    half = len(ours["n"]) // 2
    lines.append("log-log slopes (y ~ n^p), all lengths / longer half:")
    for name, r in results.items():
        lines.append(
            f"  {name:>8}: time {_slope(r['n'], r['time_s'])} / {_slope(r['n'][half:], r['time_s'][half:])}, "
            f"memory {_slope(r['n'], r['peak_bytes'])} / {_slope(r['n'][half:], r['peak_bytes'][half:])}"
        )
    flops = 4 * ours["n"][-1] ** 2 * args.d  # scores + weighted sum, 2 FLOPs per multiply-add
    best = min(theirs["time_s"][-1], ours["time_s"][-1])
    lines.append(f"at n={ours['n'][-1]}: 4 n^2 d = {flops:.3g} FLOPs, {flops / best / 1e9:.1f} GFLOP/s for the faster one")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_grad_enabled(False)
    print(report(run(args), args))


if __name__ == "__main__":
    main()
