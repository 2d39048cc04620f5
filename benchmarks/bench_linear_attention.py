"""Linear attention against softmax attention: time and memory against sequence length, and the crossover.

For ``n = 2^min .. 2^max`` this times, on the same random ``(1, heads, n, head_dim)`` inputs,

* ``attnbook.linear.linear_attention`` (elu + 1 features, non-causal: ``phi(Q) (phi(K)^T V)``,
  ``O(n d^2)`` time, no ``n x n`` tensor),
* ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch's fused kernel, ``O(n^2 d)`` time),
* ``attnbook.core.scaled_dot_product_attention`` (readable, materializes the ``n x n`` weights;
  skipped above ``--max-log2-n-dense`` because its memory grows as ``n^2``),

and prints the best time of ``--repeat`` runs and the peak extra memory of each
(``attnbook.complexity.measure``), the ratios softmax / linear, the fitted log-log slopes, and the
crossover: the shortest measured ``n`` from which on linear attention is faster than each softmax
implementation at every longer measured length.

Run it from the repository root, e.g.::

    python benchmarks/bench_linear_attention.py                      # CPU, n = 2^6 .. 2^14
    python benchmarks/bench_linear_attention.py --device cuda --max-log2-n 16 --dtype float16
    python benchmarks/bench_linear_attention.py --threads 1          # steadier on a shared CPU
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from attnbook.complexity import measure
from attnbook.core import scaled_dot_product_attention
from attnbook.linear import linear_attention
from attnbook.utils import default_device, seed_everything
from common import record, slope_text as _slope  # benchmarks/common.py

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
IMPLEMENTATIONS = {
    "linear": linear_attention,
    "torch sdpa": F.scaled_dot_product_attention,
    "attnbook sdpa": scaled_dot_product_attention,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=str(default_device()), help="cpu or cuda (default: cuda when visible)")
    parser.add_argument("--min-log2-n", type=int, default=6, help="shortest sequence is 2^this (default 6: n = 64)")
    parser.add_argument("--max-log2-n", type=int, default=14, help="longest sequence is 2^this (default 14: n = 16384)")
    parser.add_argument("--max-log2-n-dense", type=int, default=12,
                        help="longest n for attnbook's materializing attention (default 12: n = 4096)")
    parser.add_argument("--heads", type=int, default=8, help="number of heads h (default 8)")
    parser.add_argument("--head-dim", type=int, default=64, help="head width d (default 64)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per point; the fastest is reported")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch (default: torch's choice); 1 is steadier on a busy machine")
    args = parser.parse_args(argv)
    if args.max_log2_n - args.min_log2_n < 1:
        parser.error("need at least two lengths: --max-log2-n must exceed --min-log2-n")
    return args


def run(args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """Measure every implementation at every length; returns ``{impl: {"n", "time_s", "peak_bytes"}}``."""
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    generator = seed_everything(0)
    results = {name: {"n": [], "time_s": [], "peak_bytes": []} for name in IMPLEMENTATIONS}
    lengths = [2**p for p in range(args.min_log2_n, args.max_log2_n + 1)]
    for n in tqdm(lengths, desc="sequence lengths"):
        q, k, v = (torch.randn(1, args.heads, n, args.head_dim, generator=generator).to(device, dtype) for _ in range(3))
        for name, fn in IMPLEMENTATIONS.items():
            if name == "attnbook sdpa" and n > 2**args.max_log2_n_dense:
                continue
            record(results[name], n, measure(fn, q, k, v, repeat=args.repeat))
        del q, k, v
    return results


def crossover(linear: dict, other: dict) -> int | None:
    """Shortest measured ``n`` from which on linear attention is faster at every longer measured ``n``."""
    faster = {n: t_lin < t_other for n, t_lin, t_other in zip(linear["n"], linear["time_s"], other["time_s"])}
    ns = sorted(faster)
    for i, n in enumerate(ns):
        if all(faster[m] for m in ns[i:]):
            return n
    return None



def report(results: dict, args: argparse.Namespace) -> str:
    """The side-by-side table (ms, MiB, ratios softmax / linear), slopes and crossovers, as text."""
    mib = 2.0**20
    lin, fused, readable = results["linear"], results["torch sdpa"], results["attnbook sdpa"]
    lines = [
        f"device={args.device} threads={torch.get_num_threads()} dtype={args.dtype} batch=1 heads={args.heads} "
        f"head_dim={args.head_dim} non-causal (best of {args.repeat} runs; peak extra memory)",
        f"{'n':>6} | {'linear ms':>9} {'torch ms':>9} {'attnbook ms':>11} {'torch/lin':>9} {'attnb/lin':>9} | "
        f"{'linear MiB':>10} {'torch MiB':>9} {'attnbook MiB':>12}",
    ]
    for i, n in enumerate(lin["n"]):
        t_l, t_t = lin["time_s"][i], fused["time_s"][i]
        if n in readable["n"]:
            j = readable["n"].index(n)
            t_a, m_a = f"{readable['time_s'][j] * 1e3:>11.2f}", f"{readable['peak_bytes'][j] / mib:>12.1f}"
            r_a = f"{readable['time_s'][j] / t_l:>9.2f}"
        else:
            t_a, m_a, r_a = f"{'-':>11}", f"{'-':>12}", f"{'-':>9}"
        lines.append(
            f"{n:>6} | {t_l * 1e3:>9.2f} {t_t * 1e3:>9.2f} {t_a} {t_t / t_l:>9.2f} {r_a} | "
            f"{lin['peak_bytes'][i] / mib:>10.1f} {fused['peak_bytes'][i] / mib:>9.1f} {m_a}"
        )
    lines.append("  (MiB 0.0: below the resolution of the reading; '-': not run, its n x n memory is too large)")
    half = len(lin["n"]) // 2
    lines.append("log-log slopes (y ~ n^p), all lengths / longer half:")
    for name, r in results.items():
        h = len(r["n"]) // 2
        lines.append(
            f"  {name:>13}: time {_slope(r['n'], r['time_s'])} / {_slope(r['n'][h:], r['time_s'][h:])}, "
            f"memory {_slope(r['n'], r['peak_bytes'])} / {_slope(r['n'][half:], r['peak_bytes'][half:])}"
        )
    for name, other in (("torch sdpa", fused), ("attnbook sdpa", readable)):
        sub = {key: [val for n, val in zip(lin["n"], lin[key]) if n in other["n"]] for key in ("n", "time_s")}
        n_star = crossover(sub, other)
        lines.append(f"crossover vs {name}: " + (f"linear attention is faster from n = {n_star} on" if n_star
                                                 else "linear attention is not faster at the longest lengths measured"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_grad_enabled(False)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(report(run(args), args))


if __name__ == "__main__":
    main()
