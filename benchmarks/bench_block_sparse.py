"""BigBird block-sparse attention against dense attention with the same mask (Chapter 4).

For each length ``n`` this builds a BigBird-ITC block mask (``attnbook.sparse.bigbird_block_mask``:
block 64, 3 window + 1 global + 2 random blocks by default), then times on the same random
``(1, heads, n, d)`` inputs:

* ``attnbook.sparse.block_sparse_attention``, which computes only the active tiles, and
* ``torch.nn.functional.scaled_dot_product_attention`` with the expanded boolean mask
  (``expand_block_mask``), which does ``n^2`` work whatever the mask says.

It checks that both agree, and prints the best-of-``--repeat`` times, the dense / sparse ratio,
each one's time(n) / time(n / 4) growth, and the fraction of tiles the mask keeps. The issue's
targets, at ``n = 16384``: sparse at least 3x faster than dense, and sparse time(16384) /
time(4096) <= 5 (linear scaling predicts 4, quadratic 16).

Run it from the repository root::

    python benchmarks/bench_block_sparse.py                     # n = 1024 .. 16384 on the CPU
    python benchmarks/bench_block_sparse.py --threads 1          # steadier on a busy machine
    python benchmarks/bench_block_sparse.py --device cuda --max-log2-n 16
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from attnbook.sparse import bigbird_block_mask, block_sparse_attention, expand_block_mask
from attnbook.utils import default_device, seed_everything


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=str(default_device()), help="cpu or cuda (default: cuda when visible)")
    parser.add_argument("--min-log2-n", type=int, default=10, help="shortest sequence is 2^this (default 10)")
    parser.add_argument("--max-log2-n", type=int, default=14, help="longest sequence is 2^this (default 14: 16384)")
    parser.add_argument("--heads", type=int, default=1, help="heads h (default 1)")
    parser.add_argument("--head-dim", type=int, default=64, help="head width d (default 64)")
    parser.add_argument("--block", type=int, default=64, help="block size (default 64)")
    parser.add_argument("--window", type=int, default=3, help="window blocks per row (default 3)")
    parser.add_argument("--global-blocks", type=int, default=1, help="global blocks at each end (default 1)")
    parser.add_argument("--random", type=int, default=2, help="random blocks per row (default 2)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads for torch (default 0: torch's default)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per point; the fastest is reported")
    args = parser.parse_args(argv)
    if args.max_log2_n < args.min_log2_n + 2:
        parser.error("--max-log2-n must be at least --min-log2-n + 2 (growth is time(n) / time(n / 4))")
    return args


def best_time(fn, *args, repeat: int, sync) -> float:
    """Fastest of ``repeat`` runs after one warm-up (the minimum is robust to other load)."""
    fn(*args)
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


def run(args: argparse.Namespace) -> dict[str, list[float]]:
    """Time both at every length; returns ``{"n", "sparse_s", "dense_s", "density", "max_err"}`` lists."""
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    generator = seed_everything(0)
    results = {key: [] for key in ("n", "sparse_s", "dense_s", "density", "max_err")}
    lengths = [2**p for p in range(args.min_log2_n, args.max_log2_n + 1)]
    for n in tqdm(lengths, desc="sequence lengths"):
        blocks = bigbird_block_mask(n // args.block, args.global_blocks, args.window, args.random, generator=generator)
        q, k, v = (torch.randn(1, args.heads, n, args.head_dim, generator=generator).to(device) for _ in range(3))
        block_mask = blocks.to(device)
        dense_mask = expand_block_mask(block_mask, args.block)
        sparse_out = block_sparse_attention(q, k, v, block_mask, args.block)
        dense_out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask)
        results["max_err"].append((sparse_out - dense_out).abs().max().item())
        del sparse_out, dense_out
        results["n"].append(n)
        results["density"].append(blocks.float().mean().item())
        results["sparse_s"].append(best_time(block_sparse_attention, q, k, v, block_mask, args.block, repeat=args.repeat, sync=sync))
        dense = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask)  # noqa: E731
        results["dense_s"].append(best_time(dense, q, k, v, repeat=args.repeat, sync=sync))
        del q, k, v, dense_mask
    return results


def report(results: dict, args: argparse.Namespace) -> str:
    """The table (ms, dense / sparse ratio, growth over 4x length, tile density) as text."""
    lines = [
        f"device={args.device} threads={torch.get_num_threads()} fp32 batch=1 heads={args.heads} head_dim={args.head_dim} block={args.block} "
        f"BigBird: {args.window} window + {args.global_blocks} global + {args.random} random blocks "
        f"(best of {args.repeat} runs)",
        f"{'n':>6} | {'sparse ms':>10} {'dense ms':>10} {'dense/sparse':>12} | {'sparse x4n':>10} {'dense x4n':>9} "
        f"| {'tiles kept':>10} {'max |diff|':>10}",
    ]
    ns = results["n"]
    for i, n in enumerate(ns):
        t_s, t_d = results["sparse_s"][i], results["dense_s"][i]
        growth = ""
        if n // 4 in ns:
            j = ns.index(n // 4)
            growth = f"{t_s / results['sparse_s'][j]:>10.2f} {t_d / results['dense_s'][j]:>9.2f}"
        lines.append(
            f"{n:>6} | {t_s * 1e3:>10.2f} {t_d * 1e3:>10.2f} {t_d / t_s:>12.1f} | {growth:>20} "
            f"| {results['density'][i]:>10.3f} {results['max_err'][i]:>10.1e}"
        )
    n = ns[-1]
    ratio = results["dense_s"][-1] / results["sparse_s"][-1]
    growth = results["sparse_s"][-1] / results["sparse_s"][ns.index(n // 4)]
    lines.append(
        f"at n={n}: dense/sparse = {ratio:.1f} (target >= 3: {'met' if ratio >= 3 else 'MISSED'}), "
        f"sparse time({n})/time({n // 4}) = {growth:.2f} (target <= 5: {'met' if growth <= 5 else 'MISSED'})"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(report(run(args), args))


if __name__ == "__main__":
    main()
