"""FlashAttention: tiled attention against naive attention and PyTorch's fused kernel (Chapter 7).

On the CPU, for ``n = 2^min .. 2^max`` on the same random ``(1, heads, n, d)`` inputs, it times

* ``attnbook.core.scaled_dot_product_attention`` (naive: materializes the ``n x n`` weights),
* ``attnbook.flash.tiled_attention_forward`` (PyTorch tiles of ``--block`` rows; ``O(n)`` memory),
* ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch's fused kernel),

and prints the best times, peak extra memory (``attnbook.complexity.measure``) and the ratios. The
last line checks the targets at the longest length: tiled peak memory <= 1/10 of naive, tiled time
<= 3x SDPA.

On a CUDA device (``--device cuda``) it prints instead a table of TFLOP/s for the forward pass and
for forward + backward of the Triton kernels (``attnbook.flash.flash_attention(backend="triton")``),
SDPA and naive attention, causal and not, with the Triton / SDPA ratio and peak memory.

Run it from the repository root::

    python benchmarks/bench_flash.py                    # CPU, n = 1024 .. 16384, about 1-2 min
    python benchmarks/bench_flash.py --device cuda      # GPU table, fp16, n = 512 .. 16384
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from attnbook.complexity import measure
from attnbook.core import scaled_dot_product_attention as naive_attention
from attnbook.flash import flash_attention, tiled_attention_forward
from attnbook.utils import default_device, seed_everything


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=str(default_device()), help="cpu or cuda (default: cuda when visible)")
    parser.add_argument("--min-log2-n", type=int, default=None, help="shortest n is 2^this (default 10 CPU, 9 GPU)")
    parser.add_argument("--max-log2-n", type=int, default=14, help="longest n is 2^this (default 14: 16384)")
    parser.add_argument("--heads", type=int, default=None, help="heads (default 1 on CPU, 16 on GPU)")
    parser.add_argument("--head-dim", type=int, default=64, help="head width d (default 64)")
    parser.add_argument("--block", type=int, default=1024, help="tile rows of the CPU tiled path (default 1024)")
    parser.add_argument("--dtype", default=None, help="float32 / float16 / bfloat16 (default float32 CPU, float16 GPU)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default 1)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per point; the fastest is reported")
    return parser.parse_args(argv)


def cpu_table(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    heads, d, dtype = args.heads or 1, args.head_dim, getattr(torch, args.dtype or "float32")
    lo = 10 if args.min_log2_n is None else args.min_log2_n
    print(f"device=cpu threads={args.threads} dtype={dtype} batch=1 heads={heads} head_dim={d} tile={args.block} "
          f"(best of {args.repeat} runs; peak extra memory)")
    print(f"{'n':>6} | {'naive ms':>9} {'tiled ms':>9} {'sdpa ms':>8} tiled/sdpa | {'naive MiB':>9} {'tiled MiB':>9} tiled/naive | max|diff|")
    for log2_n in tqdm(range(lo, args.max_log2_n + 1), desc="lengths", leave=False):
        n = 2**log2_n
        q, k, v = (torch.randn(1, heads, n, d, dtype=dtype) for _ in range(3))
        runs = {
            "naive": measure(naive_attention, q, k, v, repeat=args.repeat),
            "tiled": measure(tiled_attention_forward, q, k, v, block_q=args.block, block_k=args.block, repeat=args.repeat),
            "sdpa": measure(F.scaled_dot_product_attention, q, k, v, repeat=args.repeat),
        }
        diff = (tiled_attention_forward(q, k, v, block_q=args.block, block_k=args.block)[0] - F.scaled_dot_product_attention(q, k, v)).abs().max()
        ms = {name: 1e3 * r["min_s"] for name, r in runs.items()}
        mib = {name: (r["peak_bytes"] or 0) / 2**20 for name, r in runs.items()}
        time_ratio = ms["tiled"] / ms["sdpa"]
        mem_ratio = mib["tiled"] / mib["naive"] if mib["naive"] > 0 else float("nan")
        tqdm.write(f"{n:>6} | {ms['naive']:9.1f} {ms['tiled']:9.1f} {ms['sdpa']:8.1f} {time_ratio:10.2f} | "
              f"{mib['naive']:9.1f} {mib['tiled']:9.1f} {mem_ratio:11.3f} | {diff.item():.1e}")
        del q, k, v
    met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    print(f"at n={n}: tiled/naive memory = {mem_ratio:.3f} (target <= 0.1: {met(mem_ratio <= 0.1)}), "
          f"tiled/sdpa time = {time_ratio:.2f} (target <= 3: {met(time_ratio <= 3)})")


def gpu_time(fn, backward: bool, repeat: int) -> float:
    """Fastest of ``repeat`` CUDA-event timings of ``fn()`` (and of its backward pass)."""
    def step():
        out = fn()
        if backward:
            out.backward(torch.ones_like(out))
    step()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return min(times)


def gpu_table(args: argparse.Namespace) -> None:
    heads, d, dtype = args.heads or 16, args.head_dim, getattr(torch, args.dtype or "float16")
    lo = 9 if args.min_log2_n is None else args.min_log2_n
    print(f"device={torch.cuda.get_device_name()} dtype={dtype} batch=1 heads={heads} head_dim={d} (best of {args.repeat}; TFLOP/s)")
    print(f"{'causal':>6} {'pass':>8} {'n':>6} | {'triton':>7} {'sdpa':>7} {'naive':>7} triton/sdpa | {'triton MiB':>10} {'naive MiB':>10}")
    for causal in (False, True):
        for backward in (False, True):
            for log2_n in range(lo, args.max_log2_n + 1):
                n = 2**log2_n
                q, k, v = (torch.randn(1, heads, n, d, device="cuda", dtype=dtype, requires_grad=backward) for _ in range(3))
                flops = 4 * heads * n * n * d * (0.5 if causal else 1.0) * (3.5 if backward else 1.0)  # bwd = 2.5x fwd
                fns = {
                    "triton": lambda: flash_attention(q, k, v, is_causal=causal, backend="triton"),
                    "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                    "naive": lambda: naive_attention(q, k, v, is_causal=causal),
                }
                tflops, mem = {}, {}
                for name, fn in fns.items():
                    if name == "naive" and heads * n * n * 4 * 4 > 0.5 * torch.cuda.mem_get_info()[0]:
                        tflops[name], mem[name] = float("nan"), float("nan")  # its n x n tensors would not fit
                        continue
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    tflops[name] = flops / gpu_time(fn, backward, args.repeat) / 1e12
                    mem[name] = (torch.cuda.max_memory_allocated() - base) / 2**20
                print(f"{str(causal):>6} {'fwd+bwd' if backward else 'fwd':>8} {n:>6} | {tflops['triton']:7.1f} "
                      f"{tflops['sdpa']:7.1f} {tflops['naive']:7.1f} {tflops['triton'] / tflops['sdpa']:11.2f} | "
                      f"{mem['triton']:10.1f} {mem['naive']:10.1f}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    seed_everything(0)
    if args.device.startswith("cuda"):
        gpu_table(args)
    else:
        cpu_table(args)


if __name__ == "__main__":
    main()
