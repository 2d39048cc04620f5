"""BigBird block-sparse attention against dense attention, its sparse limit and FlexAttention (Chapter 4).

For each length ``n`` this builds a BigBird-ITC block mask (``attnbook.sparse.bigbird_block_mask``:
block 64, 3 window + 1 global + 2 random blocks by default), then times on the same random
``(1, heads, n, d)`` inputs (4 heads of 64 by default), side by side in one loop (each round runs every
method once, and the best round of each is kept, so a burst of load from other jobs hits all alike):

* ``attnbook.sparse.block_sparse_attention``, which computes only the active tiles;
* ``torch.nn.functional.scaled_dot_product_attention`` with the expanded boolean mask
  (``expand_block_mask``), which does ``n^2`` work whatever the mask says;
* the same SDPA without a mask: PyTorch's fused kernel at full efficiency on the ``n^2`` problem.
  The **sparse limit** is ``density x`` this time, where ``density`` is the fraction of tiles the
  mask keeps: the time of the kept work done as efficiently as dense work;
* the same SDPA on the problems an ordinary BigBird row is made of, with no gather, merge or
  bookkeeping around it: one block of queries against its ``c`` blocks of keys (``c`` the most
  common number of kept blocks per row), already contiguous, one problem per such row and head.
  Its time per score over unmasked SDPA's is the **kernel floor**: the sparse / limit that code
  built on this kernel cannot go below on those rows, however little it does around it;
* ``torch.compile(flex_attention)`` with the same tiles (``attnbook.flex.flex_block_mask``); its
  compile time (the first call) and the time to build its ``BlockMask`` are printed in a second
  table. ``--no-flex`` leaves it out.

It checks that block-sparse and FlexAttention agree with masked SDPA, and prints the times, dense /
sparse, sparse / limit, the kernel floor, sparse / Flex, each time's growth time(n) / time(n / 4), and
the tiles kept.
The targets, at the longest length (16,384): sparse at least 3x faster than masked dense, sparse
time(16384) / time(4096) <= 5 (linear scaling predicts 4, quadratic 16), and sparse time <= 1.5x
the sparse limit.

Run it from the repository root::

    python benchmarks/bench_block_sparse.py --threads 1      # n = 1024 .. 16384 on the CPU, a few minutes
    python benchmarks/bench_block_sparse.py --no-flex        # without compiling FlexAttention
    python benchmarks/bench_block_sparse.py --sweep          # the kernel's rate by queries per problem
    python benchmarks/bench_block_sparse.py --device cuda --max-log2-n 16
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from attnbook.sparse import (
    bigbird_block_mask,
    block_sparse_attention,
    expand_block_mask,
)
from attnbook.utils import default_device, seed_everything
from common import flex_kernel_options, fused_only, raise_recompile_limit  # benchmarks/common.py

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=str(default_device()), help="cpu or cuda (default: cuda when visible)")
    parser.add_argument("--min-log2-n", type=int, default=10, help="shortest sequence is 2^this (default 10)")
    parser.add_argument("--max-log2-n", type=int, default=14, help="longest sequence is 2^this (default 14: 16384)")
    parser.add_argument("--heads", type=int, default=4, help="heads h (default 4)")
    parser.add_argument("--head-dim", type=int, default=64, help="head width d (default 64)")
    parser.add_argument("--block", type=int, default=64, help="block size (default 64)")
    parser.add_argument("--window", type=int, default=3, help="window blocks per row (default 3)")
    parser.add_argument("--global-blocks", type=int, default=1, help="global blocks at each end (default 1)")
    parser.add_argument("--random", type=int, default=2, help="random blocks per row (default 2)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads for torch (default 0: torch's default)")
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds per length; the fastest is reported")
    parser.add_argument("--no-flex", action="store_true", help="leave out compiled FlexAttention")
    parser.add_argument("--sweep", action="store_true",
                        help="instead: the fused kernel's time per score by queries per problem, over dense's")
    args = parser.parse_args(argv)
    if args.max_log2_n < args.min_log2_n + 2:
        parser.error("--max-log2-n must be at least --min-log2-n + 2 (growth is time(n) / time(n / 4))")
    return args


def best_times(fns: dict, repeat: int, sync) -> dict[str, float]:
    """Fastest of ``repeat`` rounds of each function after one warm-up round; each round runs every
    function once, in turn (the minimum is robust to other load, the rounds to its drift)."""
    for fn in fns.values():
        fn()
    sync()
    times = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    return {name: min(t) for name, t in times.items()}


def row_problems(block_mask: torch.Tensor, block: int, q: torch.Tensor, generator) -> tuple:
    """Inputs of the kernel floor: for each of the ``R`` block rows that keep the most common number
    ``c`` of key blocks, and each head, one block of queries ``(1, heads R, block, d)`` against ``c``
    contiguous blocks of keys and values ``(1, heads R, c block, d)``; returns them and their number
    of scores as a share of the dense problem's, ``heads R block c block / (heads n^2)``."""
    counts = block_mask.sum(dim=-1)
    c = int(counts.mode().values)
    problems = q.shape[1] * int((counts == c).sum())
    shapes = ((1, problems, block, q.shape[-1]), (1, problems, c * block, q.shape[-1]))
    tensors = [torch.randn(shapes[min(i, 1)], generator=generator).to(q.device) for i in range(3)]
    return tensors, problems * block * c * block / (q.shape[1] * q.shape[-2] ** 2)


def methods(q, k, v, block_mask, dense_mask, block: int, rows: list) -> dict:
    """The four eager methods on one input, as functions of nothing."""
    return {
        "sparse": lambda: block_sparse_attention(q, k, v, block_mask, block),
        "dense": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask),
        "unmasked": lambda: F.scaled_dot_product_attention(q, k, v),
        "rows": lambda: F.scaled_dot_product_attention(*rows),
    }


def compiled_flex(blocks: torch.Tensor, args: argparse.Namespace, q, k, v, sync):
    """``(fn, seconds to build the BlockMask, seconds of the first (compiling) call, output)``."""
    from torch.nn.attention.flex_attention import flex_attention

    from attnbook.flex import flex_block_mask

    t0 = time.perf_counter()
    block_mask = flex_block_mask(blocks, args.block)
    build = time.perf_counter() - t0
    compiled = fused_only(torch.compile(flex_attention, dynamic=False))  # never unfused
    options = flex_kernel_options(block_mask, q.device)
    fn = lambda: compiled(q, k, v, block_mask=block_mask, kernel_options=options)  # noqa: E731
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = fn()
    sync()
    return fn, build, time.perf_counter() - t0, out


def run(args: argparse.Namespace) -> dict[str, list]:
    """Time every method at every length; returns lists keyed ``n``, ``density``, ``row_share``,
    ``<method>_s``, ``max_err``, ``flex_err``, ``flex_build_s``, ``flex_compile_s``."""
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    generator = seed_everything(0)
    results: dict[str, list] = {}
    lengths = [2**p for p in range(args.min_log2_n, args.max_log2_n + 1)]
    for n in tqdm(lengths, desc="sequence lengths"):
        blocks = bigbird_block_mask(n // args.block, args.global_blocks, args.window, args.random, generator=generator)
        q, k, v = (torch.randn(1, args.heads, n, args.head_dim, generator=generator).to(device) for _ in range(3))
        block_mask = blocks.to(device)
        dense_mask = expand_block_mask(block_mask, args.block)
        rows, row_share = row_problems(blocks, args.block, q, generator)
        fns = methods(q, k, v, block_mask, dense_mask, args.block, rows)
        dense_out = fns["dense"]()
        row = {"n": n, "density": blocks.float().mean().item(), "row_share": row_share,
               "max_err": (fns["sparse"]() - dense_out).abs().max().item()}
        if not args.no_flex:
            fns["flex"], row["flex_build_s"], row["flex_compile_s"], flex_out = compiled_flex(blocks.to(device), args, q, k, v, sync)
            row["flex_err"] = (flex_out - dense_out).abs().max().item()
        del dense_out
        row.update({f"{name}_s": t for name, t in best_times(fns, args.repeat, sync).items()})
        for key, value in row.items():
            results.setdefault(key, []).append(value)
    return results


def report(results: dict, args: argparse.Namespace) -> str:
    """The tables (ms, ratios, growth over 4x length, tile density; FlexAttention's one-off costs) as text."""
    flex = "flex_s" in results
    lines = [
        f"device={args.device} threads={torch.get_num_threads()} fp32 batch=1 heads={args.heads} head_dim={args.head_dim} block={args.block} "
        f"BigBird: {args.window} window + {args.global_blocks} global + {args.random} random blocks "
        f"(best of {args.repeat} rounds)",
        f"{'n':>6} | {'sparse ms':>9} {'dense ms':>9} {'no-mask ms':>10} {'limit ms':>9} {'flex ms':>8} | "
        f"{'dense/sparse':>12} {'sparse/limit':>12} {'kernel floor':>12} {'sparse/flex':>11} | "
        f"{'sparse x4n':>10} {'dense x4n':>9} | {'tiles kept':>10} {'max |diff|':>10}",
    ]
    ns = results["n"]
    for i, n in enumerate(ns):
        t_s, t_d, t_u = (results[f"{m}_s"][i] for m in ("sparse", "dense", "unmasked"))
        limit = results["density"][i] * t_u
        t_f = results["flex_s"][i] if flex else float("nan")
        floor = kernel_floor(results, i)
        growth = ""
        if n // 4 in ns:
            j = ns.index(n // 4)
            growth = f"{t_s / results['sparse_s'][j]:>10.2f} {t_d / results['dense_s'][j]:>9.2f}"
        lines.append(
            f"{n:>6} | {t_s * 1e3:>9.2f} {t_d * 1e3:>9.2f} {t_u * 1e3:>10.2f} {limit * 1e3:>9.2f} {t_f * 1e3:>8.2f} | "
            f"{t_d / t_s:>12.1f} {t_s / limit:>12.2f} {floor:>12.2f} {t_s / t_f:>11.2f} | {growth:>20} "
            f"| {results['density'][i]:>10.3f} {results['max_err'][i]:>10.1e}"
        )
    if flex:
        lines.append("FlexAttention, paid once per mask and length: " + ", ".join(
            f"n={n}: BlockMask {b:.2f} s + compile {c:.1f} s (max |diff| {e:.1e})"
            for n, b, c, e in zip(ns, results["flex_build_s"], results["flex_compile_s"], results["flex_err"])))
    n = ns[-1]
    ratio = results["dense_s"][-1] / results["sparse_s"][-1]
    growth = results["sparse_s"][-1] / results["sparse_s"][ns.index(n // 4)]
    to_limit = results["sparse_s"][-1] / (results["density"][-1] * results["unmasked_s"][-1])
    met = lambda ok: "met" if ok else "MISSED"  # noqa: E731
    lines.append(
        f"at n={n}: dense/sparse = {ratio:.1f} (target >= 3: {met(ratio >= 3)}), "
        f"sparse time({n})/time({n // 4}) = {growth:.2f} (target <= 5: {met(growth <= 5)}), "
        f"sparse/limit = {to_limit:.2f} (target <= 1.5: {met(to_limit <= 1.5)})"
        + (f", sparse/flex = {results['sparse_s'][-1] / results['flex_s'][-1]:.2f}" if flex else "")
    )
    lines.append(
        f"kernel floor at n={n}: the fused kernel alone, on the one-block problems of the ordinary rows "
        f"(keys already contiguous), takes {kernel_floor(results, -1):.2f}x unmasked SDPA's time per score"
    )
    return "\n".join(lines)


def kernel_floor(results: dict, i: int) -> float:
    """Seconds per score of SDPA on the ordinary rows' problems over seconds per score of unmasked
    SDPA, at length index ``i``."""
    return results["rows_s"][i] / results["unmasked_s"][i] / results["row_share"][i]


def sweep(args: argparse.Namespace, queries=(32, 64, 128, 256, 512, 768, 1024)) -> str:
    """The fused kernel's seconds per score on problems of ``L`` queries against ``(window + 2 global +
    random)`` blocks of keys (a BigBird row's keys, contiguous), as many problems as the unmasked
    problem at the longest length has queries, over unmasked SDPA's seconds per score at that length:
    how the kernel's efficiency depends on the number of queries per problem."""
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    generator = seed_everything(0)
    n, d = 2**args.max_log2_n, args.head_dim
    keys = (args.window + 2 * args.global_blocks + args.random) * args.block
    dense = [torch.randn(1, args.heads, n, d, generator=generator).to(device) for _ in range(3)]
    fns = {"dense": lambda: F.scaled_dot_product_attention(*dense)}
    scores = {"dense": args.heads * n * n}
    for L in queries:
        problems = max(1, args.heads * n // L)
        qkv = [torch.randn(1, problems, size, d, generator=generator).to(device) for size in (L, keys, keys)]
        fns[L] = lambda qkv=qkv: F.scaled_dot_product_attention(*qkv)
        scores[L] = problems * L * keys
    times = best_times(fns, args.repeat, sync)
    rate = {name: times[name] / scores[name] for name in fns}
    lines = [f"device={args.device} threads={torch.get_num_threads()} fp32: the fused kernel on problems of L "
             f"queries against {keys} keys, time per score over unmasked SDPA's at n={n} "
             f"({rate['dense'] * 1e9:.2f} ns per score)"]
    lines += [f"L={L:>5}: {rate[L] / rate['dense']:.2f}" for L in queries]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    raise_recompile_limit(args.max_log2_n - args.min_log2_n + 1)  # FlexAttention per length
    print(sweep(args) if args.sweep else report(run(args), args))


if __name__ == "__main__":
    main()
