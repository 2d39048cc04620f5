"""FlashAttention: tiled attention against naive attention and PyTorch's fused kernel (Chapter 7).

On the CPU, for ``n = 2^min .. 2^max`` on the same random ``(1, heads, n, d)`` inputs, it times

* ``attnbook.core.scaled_dot_product_attention`` (naive: materializes the ``n x n`` weights),
* ``attnbook.flash.flash_attention(..., backend="torch")`` (the PyTorch tiles, sized by
  ``attnbook.flash.plan_tiles`` for this CPU's caches unless ``--block`` is given; ``O(n)`` memory),
* ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch's fused kernel),

and prints the best times, peak extra memory (``attnbook.complexity.measure``) and the ratios. The
last line checks the targets at the longest length: tiled peak memory <= 1/10 of naive, tiled time
<= 3x SDPA.

On a CUDA device (``--device cuda``) it prints instead a table of TFLOP/s for the forward pass and
for forward + backward of the Triton kernels (``attnbook.flash.flash_attention(backend="triton")``),
SDPA, FlexAttention compiled with ``torch.compile`` and naive attention, causal and not, with the
Triton / SDPA ratio and peak memory. Before timing it checks every length with FlashAttention-2's
rule: against a float32 reference, the Triton output and gradients may err at most twice as much as
PyTorch's attention computed in the same dtype (plus 1e-3 absolute); it stops with an
AssertionError naming the length and tensor otherwise.

With ``--window W`` (CPU) it times the PyTorch tiled path with a sliding window of ``W`` keys
(``flash_attention(..., window_size=(W, 0), is_causal=True)``) against the full causal path: at a
fixed window the tiles outside it are skipped, so the windowed time per token stays flat while the
causal one grows with ``n``.

Run it from the repository root::

    python benchmarks/bench_flash.py                    # CPU, n = 1024 .. 16384, about 1-2 min
    python benchmarks/bench_flash.py --device cuda      # GPU table, fp16, n = 512 .. 16384
    python benchmarks/bench_flash.py --window 256       # CPU, windowed vs causal, n = 1024 .. 16384
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from attnbook.complexity import measure
from attnbook.core import scaled_dot_product_attention as naive_attention
from attnbook.flash import flash_attention, plan_tiles, tiled_attention_forward
from attnbook.utils import default_device, seed_everything


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=str(default_device()), help="cpu or cuda (default: cuda when visible)")
    parser.add_argument("--min-log2-n", type=int, default=None, help="shortest n is 2^this (default 10 CPU, 9 GPU)")
    parser.add_argument("--max-log2-n", type=int, default=14, help="longest n is 2^this (default 14: 16384)")
    parser.add_argument("--heads", type=int, default=None, help="heads (default 1 on CPU, 16 on GPU)")
    parser.add_argument("--head-dim", type=int, default=64, help="head width d (default 64)")
    parser.add_argument("--block", type=int, default=None, help="tile rows of the CPU tiled path (default: plan_tiles)")
    parser.add_argument("--dtype", default=None, help="float32 / float16 / bfloat16 (default float32 CPU, float16 GPU)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default 1)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per point; the fastest is reported")
    parser.add_argument("--window", type=int, default=None, help="time a sliding window of this many keys (CPU)")
    return parser.parse_args(argv)


def cpu_table(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    heads, d, dtype = args.heads or 1, args.head_dim, getattr(torch, args.dtype or "float32")
    lo = 10 if args.min_log2_n is None else args.min_log2_n
    tiles = {} if args.block is None else {"block_q": args.block, "block_k": args.block}
    shown = "x".join(map(str, plan_tiles(d, dtype=dtype))) + " (plan_tiles)" if args.block is None else args.block
    print(f"device=cpu threads={args.threads} dtype={dtype} batch=1 heads={heads} head_dim={d} tile={shown} "
          f"(best of {args.repeat} runs; peak extra memory)")
    print(f"{'n':>6} | {'naive ms':>9} {'tiled ms':>9} {'sdpa ms':>8} tiled/sdpa | {'naive MiB':>9} {'tiled MiB':>9} tiled/naive | max|diff|")
    def tiled(q, k, v):
        if tiles:
            return tiled_attention_forward(q, k, v, **tiles)[0]
        return flash_attention(q, k, v, backend="torch")

    for log2_n in tqdm(range(lo, args.max_log2_n + 1), desc="lengths", leave=False):
        n = 2**log2_n
        q, k, v = (torch.randn(1, heads, n, d, dtype=dtype) for _ in range(3))
        runs = {
            "naive": measure(naive_attention, q, k, v, repeat=args.repeat),
            "tiled": measure(tiled, q, k, v, repeat=args.repeat),
            "sdpa": measure(F.scaled_dot_product_attention, q, k, v, repeat=args.repeat),
        }
        diff = (tiled(q, k, v) - F.scaled_dot_product_attention(q, k, v)).abs().max()
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


def window_table(args: argparse.Namespace) -> None:
    """Sliding-window vs causal attention on the PyTorch tiled path: time per token."""
    torch.set_num_threads(args.threads)
    heads, d, w = args.heads or 4, args.head_dim, args.window
    lo = 10 if args.min_log2_n is None else args.min_log2_n
    print(f"device=cpu threads={args.threads} float32 batch=1 heads={heads} head_dim={d} window={w} "
          f"tile={'x'.join(map(str, plan_tiles(d)))} (plan_tiles; best of {args.repeat} runs)")
    print(f"{'n':>6} | {'causal ms':>9} {'window ms':>9} causal/window | {'causal us/token':>15} "
          f"{'window us/token':>15} | max|diff| vs dense mask")
    for log2_n in tqdm(range(lo, args.max_log2_n + 1), desc="lengths", leave=False):
        n = 2**log2_n
        q, k, v = (torch.randn(1, heads, n, d) for _ in range(3))
        ms = {}
        for name, window in (("causal", (-1, -1)), ("window", (w, 0))):
            ms[name] = 1e3 * measure(
                lambda window=window: flash_attention(q, k, v, is_causal=True, window_size=window, backend="torch"),
                repeat=args.repeat)["min_s"]
        diff = float("nan")
        if n <= 4096:  # the dense reference needs an n x n mask
            i = torch.arange(n)
            allowed = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - w)
            dense = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
            diff = (flash_attention(q, k, v, is_causal=True, window_size=(w, 0), backend="torch") - dense).abs().max().item()
        tqdm.write(f"{n:>6} | {ms['causal']:9.1f} {ms['window']:9.1f} {ms['causal'] / ms['window']:13.2f} | "
                   f"{1e3 * ms['causal'] / n:15.2f} {1e3 * ms['window'] / n:15.2f} | {diff:.1e}")


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


def check_gpu_accuracy(q, k, v, causal: bool, n: int) -> float:
    """FlashAttention-2's rule for the Triton output and gradients; returns the largest error."""
    grad = torch.randn_like(q)

    def run(fn, dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out = fn(*leaves)
        out.backward(grad.to(dtype))
        return [out.detach().float()] + [t.grad.float() for t in leaves]

    exact = run(lambda *t: F.scaled_dot_product_attention(*t, is_causal=causal), torch.float32)
    same = run(lambda *t: F.scaled_dot_product_attention(*t, is_causal=causal), q.dtype)
    ours = run(lambda *t: flash_attention(*t, is_causal=causal, backend="triton"), q.dtype)
    worst = 0.0
    for name, r, p, o in zip(["out", "dq", "dk", "dv"], exact, same, ours):
        err, err_pt = (o - r).abs().max().item(), (p - r).abs().max().item()
        assert err <= 2 * err_pt + 1e-3, f"n={n} causal={causal} {name}: Triton error {err:.3g} > 2 x PyTorch's {err_pt:.3g}"
        worst = max(worst, err)
    return worst


def flex_attention_fn(causal: bool, n: int):
    """``torch.compile(flex_attention)`` with a causal block mask when asked (None if unavailable)."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:  # pragma: no cover - torch < 2.5
        return None
    compiled = torch.compile(flex_attention, dynamic=False)
    mask = None
    if causal:
        mask = create_block_mask(lambda b, h, i, j: j <= i, None, None, n, n, device="cuda")
    return lambda q, k, v: compiled(q, k, v, block_mask=mask)


def gpu_table(args: argparse.Namespace) -> None:
    heads, d, dtype = args.heads or 16, args.head_dim, getattr(torch, args.dtype or "float16")
    lo = 9 if args.min_log2_n is None else args.min_log2_n
    print(f"device={torch.cuda.get_device_name()} dtype={dtype} batch=1 heads={heads} head_dim={d} (best of {args.repeat}; TFLOP/s)")
    print(f"{'causal':>6} {'pass':>8} {'n':>6} | {'triton':>7} {'sdpa':>7} {'flex':>7} {'naive':>7} triton/sdpa "
          f"triton/flex | {'triton MiB':>10} {'naive MiB':>10} | max err")
    for causal in (False, True):
        for backward in (False, True):
            for log2_n in range(lo, args.max_log2_n + 1):
                n = 2**log2_n
                q, k, v = (torch.randn(1, heads, n, d, device="cuda", dtype=dtype, requires_grad=backward) for _ in range(3))
                err = check_gpu_accuracy(q, k, v, causal, n) if not backward else float("nan")
                flex = flex_attention_fn(causal, n)
                flops = 4 * heads * n * n * d * (0.5 if causal else 1.0) * (3.5 if backward else 1.0)  # bwd = 2.5x fwd
                fns = {
                    "triton": lambda: flash_attention(q, k, v, is_causal=causal, backend="triton"),
                    "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                    "flex": (lambda: flex(q, k, v)) if flex is not None else None,
                    "naive": lambda: naive_attention(q, k, v, is_causal=causal),
                }
                tflops, mem = {}, {}
                for name, fn in fns.items():
                    if fn is None:
                        tflops[name], mem[name] = float("nan"), float("nan")
                        continue
                    if name == "naive" and heads * n * n * 4 * 4 > 0.5 * torch.cuda.mem_get_info()[0]:
                        tflops[name], mem[name] = float("nan"), float("nan")  # its n x n tensors would not fit
                        continue
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    tflops[name] = flops / gpu_time(fn, backward, args.repeat) / 1e12
                    mem[name] = (torch.cuda.max_memory_allocated() - base) / 2**20
                print(f"{str(causal):>6} {'fwd+bwd' if backward else 'fwd':>8} {n:>6} | {tflops['triton']:7.1f} "
                      f"{tflops['sdpa']:7.1f} {tflops['flex']:7.1f} {tflops['naive']:7.1f} "
                      f"{tflops['triton'] / tflops['sdpa']:11.2f} {tflops['triton'] / tflops['flex']:11.2f} | "
                      f"{mem['triton']:10.1f} {mem['naive']:10.1f} | {err:.1e}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    seed_everything(0)
    if args.window is not None:
        window_table(args)
    elif args.device.startswith("cuda"):
        gpu_table(args)
    else:
        cpu_table(args)


if __name__ == "__main__":
    main()
