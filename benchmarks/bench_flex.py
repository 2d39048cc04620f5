"""attnbook's sparse attentions against compiled FlexAttention and dense SDPA (``attnbook.flex``).

For each length ``n`` (default 4096, 8192, 16384; ``--quick``: 1024, 2048, 4096) on random
``(1, heads, n, head_dim)`` float32 inputs (batch 1, 4 heads of width 64), it times side by side

* a sliding window of ``--window`` (256) tokens each side:
  ``attnbook.flash.flash_attention(window_size=(w, w))`` (the PyTorch tiles, which skip the tiles
  outside the window; ``--unfold`` times the sparse chapter's teaching version,
  ``attnbook.sparse.sliding_window_attention``, instead) vs ``torch.compile(flex_attention)`` with
  ``attnbook.flex.sliding_window_mask_mod`` and its ``BlockMask`` (``create_block_mask``, block
  128) vs ``torch.nn.functional.scaled_dot_product_attention`` with the boolean
  ``sliding_window_mask``;
* a BigBird block-sparse pattern (``bigbird_block_mask``, block ``--block`` = 64, 1 global + 3
  window + 2 random blocks): ``attnbook.sparse.block_sparse_attention`` vs compiled
  FlexAttention with ``attnbook.flex.flex_block_mask`` (the same tiles, ``BLOCK_SIZE=64``) vs SDPA
  with the expanded token mask (``expand_block_mask``).

Each time is the best of up to ``--repeat`` runs after one warm-up run; a method whose warm-up took
long gets fewer runs (at least one) so that a cell stays near ``--budget`` seconds. For FlexAttention
the warm-up is the compilation (``dynamic=False``: one per pattern and length), reported in its
own table with the time to build the ``BlockMask``. Peak extra memory comes from
``attnbook.complexity.measure`` (peak resident set on a Linux CPU, the allocator on CUDA). A method
whose estimated memory exceeds ``--max-gib`` (or 80% of the memory available) is skipped and said
so, instead of crashing. The last columns are the largest absolute difference of attnbook's and
FlexAttention's outputs from SDPA's.

It runs on the CPU, and on CUDA too when ``torch.cuda.is_available()`` (same float32 inputs).
Run it from the repository root::

    python benchmarks/bench_flex.py             # CPU (+ CUDA if present), a few minutes
    python benchmarks/bench_flex.py --quick     # shorter lengths, about a minute
    python benchmarks/bench_flex.py --threads 1 # steadier on a busy machine
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from tqdm.auto import tqdm

from attnbook.complexity import measure
from attnbook.flash import flash_attention
from attnbook.flex import flex_block_mask, sliding_window_mask_mod
from attnbook.sparse import (
    bigbird_block_mask,
    block_sparse_attention,
    expand_block_mask,
    sliding_window_attention,
    sliding_window_mask,
)
from attnbook.utils import seed_everything
from common import flex_kernel_options, fused_only, raise_recompile_limit  # benchmarks/common.py

GIB = 2**30
METHODS = ("attnbook", "flex", "sdpa")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="lengths 1024, 2048, 4096 instead of 4096 .. 16384")
    parser.add_argument("--heads", type=int, default=4, help="heads (default 4)")
    parser.add_argument("--head-dim", type=int, default=64, help="head width (default 64)")
    parser.add_argument("--window", type=int, default=256, help="sliding window, tokens each side (default 256)")
    parser.add_argument("--block", type=int, default=64, help="BigBird block size (default 64)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per cell at most; the fastest is shown")
    parser.add_argument("--budget", type=float, default=30.0, help="seconds of timed runs per cell, about (default 30)")
    parser.add_argument("--max-gib", type=float, default=16.0, help="skip a method estimated above this (default 16)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads for torch (default 0: torch's default)")
    parser.add_argument("--devices", default=None, help="comma-separated, default: cpu, plus cuda when available")
    parser.add_argument("--unfold", action="store_true",
                        help="time sparse.sliding_window_attention (unfolded windows) for the window")
    return parser.parse_args(argv)


def available_bytes(device: torch.device) -> float:
    """Free memory: ``MemAvailable`` on a Linux CPU, the CUDA driver's free memory on a GPU."""
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024.0
    except OSError:
        pass
    return float("inf")


def estimates(pattern: str, n: int, args) -> dict[str, float]:
    """Rough peak bytes of each method (measured on the CPU, rounded up).

    Dense SDPA: the ``n x n`` bool mask, its float copy and, should the fused kernel not take
    it, one float ``n x n`` score matrix per head. attnbook's sliding window: its matrix
    product copies the ``(n, E, 2 w + 1)`` unfolded keys per head (``--unfold``); the flash tiles
    hold one tile of scores at a time. The block-sparse loop works
    in chunks of about 2^20 scores; FlexAttention's ``create_block_mask`` evaluates the mask_mod
    on ``n x n`` int32 indices.
    """
    h, e = args.heads, args.head_dim
    dense = n * n * (1 + 4 + 4 * h)
    unfolded = h * n * e * (2 * args.window + 1) * 4 * 1.2
    attnbook = unfolded if pattern == "sliding window" and args.unfold else 2**28
    return {"attnbook": attnbook, "flex": n * n * 12.0, "sdpa": dense}


def time_cell(fn, repeat: int, budget: float, sync) -> tuple[float, float, int | None, torch.Tensor]:
    """Warm up once (timed: the compilation for FlexAttention), then the best of up to ``repeat``
    runs. Returns ``(warm-up s, best s, peak extra bytes, output)``."""
    t0 = time.perf_counter()
    out = fn()
    sync()
    warm = time.perf_counter() - t0
    runs = max(1, min(repeat, int(budget / max(warm, 1e-9))))
    result = measure(fn, repeat=runs, warmup=0)
    return warm, result["min_s"], result["peak_bytes"], out


def run_cell(args, device, pattern: str, n: int, compiled, generator, sync) -> dict:
    """Time the three methods on one pattern and length; returns one row of the table."""
    q, k, v = (torch.randn(1, args.heads, n, args.head_dim, generator=generator).to(device) for _ in range(3))
    t0 = time.perf_counter()
    if pattern == "sliding window":
        block_mask = create_block_mask(sliding_window_mask_mod(args.window), None, None, n, n, device=device)
        dense_mask = lambda: sliding_window_mask(n, args.window).to(device)  # noqa: E731
        if args.unfold:
            ours = lambda: sliding_window_attention(q, k, v, args.window)  # noqa: E731
        else:
            window = (args.window, args.window)
            ours = lambda: flash_attention(q, k, v, window_size=window, backend="torch")  # noqa: E731
    else:
        blocks = bigbird_block_mask(n // args.block, 1, 3, 2, generator=generator).to(device)
        block_mask = flex_block_mask(blocks, args.block)
        dense_mask = lambda: expand_block_mask(blocks, args.block)  # noqa: E731
        ours = lambda: block_sparse_attention(q, k, v, blocks, args.block)  # noqa: E731
    sync()
    row = {"pattern": pattern, "n": n, "mask_s": time.perf_counter() - t0,
           "density": 1.0 - block_mask.sparsity() / 100.0}
    limit = min(args.max_gib * GIB, 0.8 * available_bytes(device))
    need = estimates(pattern, n, args)
    outputs = {}
    for name in METHODS:
        if need[name] > limit:
            row[name] = f"skipped: needs about {need[name] / GIB:.1f} GiB, limit {limit / GIB:.1f} GiB"
            continue
        if name == "attnbook":
            fn = ours
        elif name == "flex":
            options = flex_kernel_options(block_mask, device)
            fn = lambda: compiled(q, k, v, block_mask=block_mask, kernel_options=options)  # noqa: E731
        else:
            mask = dense_mask()
            fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731
        warm, best, peak, outputs[name] = time_cell(fn, args.repeat, args.budget, sync)
        row.update({name: best, f"{name}_warm": warm, f"{name}_mib": (peak or 0) / 2**20})
    for name in ("attnbook", "flex"):
        if name in outputs and "sdpa" in outputs:
            row[f"{name}_err"] = (outputs[name] - outputs["sdpa"]).abs().max().item()
    return row


def run(args, device: torch.device) -> list[dict]:
    """One row per (pattern, length), the patterns' compilations sharing one compiled function."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    lengths = [1024, 2048, 4096] if args.quick else [4096, 8192, 16384]
    compiled = fused_only(torch.compile(flex_attention, dynamic=False))  # never unfused
    generator = seed_everything(0)
    cells = [(pattern, n) for pattern in ("sliding window", "BigBird") for n in lengths]
    return [
        run_cell(args, device, pattern, n, compiled, generator, sync)
        for pattern, n in tqdm(cells, desc=f"{device.type} cells")
    ]


def fmt_ms(value) -> str:
    return f"{value * 1e3:10.1f}" if isinstance(value, float) else f"{'skipped':>10}"


def ratio(row, a, b) -> str:
    both = isinstance(row.get(a), float) and isinstance(row.get(b), float)
    return f"{row[a] / row[b]:9.2f}" if both else f"{'n/a':>9}"


def report(rows: list[dict], args, device: torch.device) -> str:
    threads = f" threads={torch.get_num_threads()}" if device.type == "cpu" else ""
    lines = [
        f"torch {torch.__version__} device={device}{threads} float32 batch=1 heads={args.heads} head_dim={args.head_dim} "
        f"window={args.window} each side, BigBird block={args.block} (1 global + 3 window + 2 random "
        f"blocks); best of up to {args.repeat} runs after a warm-up",
        f"{'pattern':<14} {'n':>6} | {'attnbook ms':>11} {'flex ms':>10} {'sdpa ms':>10} | "
        f"{'attn/flex':>9} {'attn/sdpa':>9} | {'attnbook MiB':>12} {'flex MiB':>9} {'sdpa MiB':>9} | "
        f"{'attn-sdpa':>9} {'flex-sdpa':>9}",
    ]
    for row in rows:
        mib = " ".join(
            f"{row[f'{m}_mib']:{w}.0f}" if f"{m}_mib" in row else f"{'-':>{w}}"
            for m, w in (("attnbook", 12), ("flex", 9), ("sdpa", 9))
        )
        errs = " ".join(
            f"{row[f'{m}_err']:9.1e}" if f"{m}_err" in row else f"{'n/a':>9}" for m in ("attnbook", "flex")
        )
        lines.append(
            f"{row['pattern']:<14} {row['n']:>6} | {fmt_ms(row['attnbook']):>11} {fmt_ms(row['flex'])} "
            f"{fmt_ms(row['sdpa'])} | {ratio(row, 'attnbook', 'flex')} {ratio(row, 'attnbook', 'sdpa')} | "
            f"{mib} | {errs}"
        )
    skipped = [f"{r['pattern']} n={r['n']} {m}: {r[m]}" for r in rows for m in METHODS if isinstance(r[m], str)]
    lines += [f"  {s}" for s in skipped]
    lines += [
        "warm-up (first call) and setup, seconds; flex's warm-up is torch.compile + one run:",
        f"{'pattern':<14} {'n':>6} | {'BlockMask':>9} {'density':>7} | {'flex warm-up':>12} "
        f"{'attnbook 1st':>12} {'sdpa 1st':>9}",
    ]
    for row in rows:
        warm = " ".join(
            f"{row[f'{m}_warm']:{w}.2f}" if f"{m}_warm" in row else f"{'-':>{w}}"
            for m, w in (("flex", 12), ("attnbook", 12), ("sdpa", 9))
        )
        lines.append(f"{row['pattern']:<14} {row['n']:>6} | {row['mask_s']:9.2f} {row['density']:7.3f} | {warm}")
    lines.append(
        "(MiB: peak extra memory of the timed runs; on a CPU the resident-set reading misses memory "
        "the allocator reuses, so small values read low. density: fraction of FlexAttention tiles "
        "computed. Compilation reloads from the on-disk inductor cache when it can: for cold "
        "numbers set TORCHINDUCTOR_CACHE_DIR to an empty folder.)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    raise_recompile_limit(16)  # one compilation per pattern and n
    devices = args.devices.split(",") if args.devices else ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for name in devices:
        device = torch.device(name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            rows = run(args, device)
        print(report(rows, args, device))


if __name__ == "__main__":
    main()
