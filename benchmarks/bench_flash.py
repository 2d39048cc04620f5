"""FlashAttention: tiled attention against naive attention and PyTorch's fused kernel (Chapter 7).

On the CPU, for ``n = 2^min .. 2^max`` on the same random ``(1, heads, n, d)`` inputs, it times

* ``attnbook.core.scaled_dot_product_attention`` (naive: materializes the ``n x n`` weights),
* ``attnbook.flash.flash_attention(..., backend="torch")`` (the PyTorch tiles, sized by
  ``attnbook.flash.plan_tiles`` for this CPU's caches unless ``--block`` is given; ``O(n)`` memory),
* ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch's fused kernel),

and prints the best times, peak extra memory (``attnbook.complexity.measure``) and the ratios. The
last line checks the targets at the longest length: tiled peak memory <= 1/10 of naive, tiled time
<= 3x SDPA.

On a CUDA device (``--device cuda``) it prints instead the TFLOP/s of the Triton kernels
(``attnbook.flash.flash_attention(backend="triton")``), SDPA, FlexAttention compiled with
``torch.compile`` and naive attention, forward and forward + backward, on a matrix of points (float16
and bfloat16, head dims 64 and 128, causal and not, n = 1k .. 16k, at batch 1 with 16 heads and at a
batch that fills the GPU; ``--quick``: float16, head dim 64, batch 1, n = 1k and 4k), with Triton's
speed over SDPA's and FlexAttention's per point and their geometric means and lowest points. Before
timing a point it checks FlashAttention-2's rule: against a float32 reference, the Triton output and
gradients may err at most twice as much as PyTorch's attention computed in the same dtype (plus 1e-3
absolute); it stops with an AssertionError naming the length and tensor otherwise. The ``max err``
column is the output's error for the forward pass and the gradients' for forward + backward.
FlexAttention is timed compiled or not at all: dynamo may compile one graph per shape (its recompile
limit is raised to the points' number), and a call that would run flex_attention unfused raises.
``--json FILE`` writes the rows and the summary (what ``tools/gpu_check.py`` commits).

``--tutorial PATH`` (or the environment variable ``ATTNBOOK_TRITON_TUTORIAL``) adds a third
column: the fused attention of Triton's own tutorial, ``python/tutorials/06-fused-attention.py``
from the Triton repository (its ``attention(q, k, v, causal, sm_scale)``), timed in the same run
on the points it takes (head dims 16 to 256, lengths that are multiples of 128). The book does not
ship that file: point ``PATH`` at a checkout of Triton's tutorials. The summary says at how many
points the book's kernels are slower than the tutorial's, and by how much at most.

With ``--window W`` (CPU) it times the PyTorch tiled path with a sliding window of ``W`` keys
(``flash_attention(..., window_size=(W, 0), is_causal=True)``) against the full causal path: at a
fixed window the tiles outside it are skipped, so the windowed time per token stays flat while the
causal one grows with ``n``.

Run it from the repository root::

    python benchmarks/bench_flash.py                    # CPU, n = 1024 .. 16384, about 1-2 min
    python benchmarks/bench_flash.py --device cuda      # GPU matrix (many minutes: compiles FlexAttention per shape)
    python benchmarks/bench_flash.py --device cuda --quick --json flash.json  # the GPU check's minute
    python benchmarks/bench_flash.py --window 256       # CPU, windowed vs causal, n = 1024 .. 16384
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import time

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from attnbook.complexity import measure
from attnbook.core import scaled_dot_product_attention as naive_attention
from attnbook.flash import flash_attention, plan_tiles, flash_forward
from attnbook.utils import default_device, seed_everything
from common import fused_only, raise_recompile_limit  # benchmarks/common.py


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=str(default_device()), help="cpu or cuda (default: cuda when visible)")
    parser.add_argument("--min-log2-n", type=int, default=None, help="shortest n is 2^this (default 10 CPU, 9 GPU)")
    parser.add_argument("--max-log2-n", type=int, default=14, help="longest n is 2^this (default 14: 16384)")
    parser.add_argument("--heads", type=int, default=None, help="heads (default 1 on CPU, 16 on GPU)")
    parser.add_argument("--head-dim", type=int, default=None, help="head width d (default 64; GPU: 64 and 128)")
    parser.add_argument("--block", type=int, default=None, help="tile rows of the CPU tiled path (default: plan_tiles)")
    parser.add_argument("--dtype", default=None, help="float32 / float16 / bfloat16 (default float32 CPU, float16 GPU)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default 1)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per point; the fastest is reported")
    parser.add_argument("--window", type=int, default=None, help="time a sliding window of this many keys (CPU)")
    parser.add_argument("--quick", action="store_true", help="GPU: float16, one head dim, batch 1, n = 1024 and 4096")
    parser.add_argument("--json", default=None, help="GPU: also write the rows and the summary to this file")
    parser.add_argument("--tutorial", default=os.environ.get("ATTNBOOK_TRITON_TUTORIAL"),
                        help="GPU: Triton's tutorials/06-fused-attention.py, timed as a third column")
    return parser.parse_args(argv)


def cpu_table(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    heads, d, dtype = args.heads or 1, args.head_dim or 64, getattr(torch, args.dtype or "float32")
    lo = 10 if args.min_log2_n is None else args.min_log2_n
    tiles = {} if args.block is None else {"block_q": args.block, "block_k": args.block}
    shown = "x".join(map(str, plan_tiles(d, dtype=dtype))) + " (plan_tiles)" if args.block is None else args.block
    print(f"device=cpu threads={args.threads} dtype={dtype} batch=1 heads={heads} head_dim={d} tile={shown} "
          f"(best of {args.repeat} runs; peak extra memory)")
    print(f"{'n':>6} | {'naive ms':>9} {'tiled ms':>9} {'sdpa ms':>8} tiled/sdpa | {'naive MiB':>9} {'tiled MiB':>9} tiled/naive | max|diff|")
    def tiled(q, k, v):
        if tiles:
            return flash_forward(q, k, v, **tiles)[0]
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
    heads, d, w = args.heads or 4, args.head_dim or 64, args.window
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


def check_accuracy(q, k, v, causal: bool, n: int) -> dict:
    """FlashAttention-2's rule for the Triton output and gradients: against a float32
    reference, each errs at most twice PyTorch's error in the inputs' dtype plus 1e-3
    (an AssertionError names the length and tensor otherwise). Returns the largest error
    of the output (``"fwd"``) and of the gradients (``"fwd+bwd"``)."""
    grad = torch.randn_like(q)

    def run(fn, dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out = fn(*leaves)
        out.backward(grad.to(dtype))
        return [out.detach().float()] + [t.grad.float() for t in leaves]

    exact = run(lambda *t: F.scaled_dot_product_attention(*t, is_causal=causal), torch.float32)
    same = run(lambda *t: F.scaled_dot_product_attention(*t, is_causal=causal), q.dtype)
    ours = run(lambda *t: flash_attention(*t, is_causal=causal, backend="triton"), q.dtype)
    errors = {}
    for name, r, p, o in zip(["out", "dq", "dk", "dv"], exact, same, ours):
        err, err_pt = (o - r).abs().max().item(), (p - r).abs().max().item()
        assert err <= 2 * err_pt + 1e-3, f"n={n} causal={causal} {name}: Triton error {err:.3g} > 2 x PyTorch's {err_pt:.3g}"
        errors[name] = err
    return {"fwd": errors["out"], "fwd+bwd": max(errors["dq"], errors["dk"], errors["dv"])}


def flex_attention_fn(causal: bool, n: int, device: str = "cuda"):
    """``torch.compile(flex_attention)`` with a causal block mask when asked, refusing the
    unfused path (:func:`fused_only`); ``None`` where torch has no FlexAttention."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:  # pragma: no cover - torch < 2.5
        return None
    compiled = torch.compile(flex_attention, dynamic=False)
    mask = None
    if causal:
        mask = create_block_mask(lambda b, h, i, j: j <= i, None, None, n, n, device=device)
    return fused_only(lambda q, k, v: compiled(q, k, v, block_mask=mask))


def matrix(args: argparse.Namespace) -> list[dict]:
    """The points timed: dtype, head dim, causal, (batch, heads) and n. The full matrix
    has float16 and bfloat16, head dims 64 and 128, causal and not, n = 1k .. 16k, each at
    batch 1 with 16 heads and at a batch that fills the GPU (batch x heads x n >= 64k
    tokens); --quick keeps float16, one head dim, batch 1 and two lengths."""
    if args.quick:
        dtypes, dims, logs = [args.dtype or "float16"], [args.head_dim or 64], [10, 12]
        shapes = ["one"]
    else:
        dtypes = [args.dtype] if args.dtype else ["float16", "bfloat16"]
        dims = [64, 128] if args.head_dim is None else [args.head_dim]
        lo = 10 if args.min_log2_n is None else args.min_log2_n
        logs, shapes = list(range(lo, args.max_log2_n + 1)), ["one", "filled"]
    heads = args.heads or 16
    points = []
    for dtype in dtypes:
        for d in dims:
            for causal in (False, True):
                for log2_n in logs:
                    n = 2**log2_n
                    for shape in shapes:
                        batch = 1 if shape == "one" else max(1, -(-65536 // (heads * n)))
                        if shape == "filled" and batch == 1:
                            continue  # batch 1 fills it already
                        points.append(dict(dtype=dtype, head_dim=d, causal=causal, batch=batch,
                                           heads=heads, n=n))
    return points


def load_tutorial(path: str):
    """The ``attention(q, k, v, causal, sm_scale)`` of the Triton tutorial file at ``path``."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--tutorial: no file {path!r} (Triton's python/tutorials/06-fused-attention.py)")
    spec = importlib.util.spec_from_file_location("triton_tutorial_fused_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "attention", None)):
        raise AttributeError(f"--tutorial: {path!r} has no attention(q, k, v, causal, sm_scale)")
    return module.attention


def tutorial_takes(point: dict) -> bool:
    """The tutorial's kernels take head dims 16, 32, 64, 128, 256 and (backward) lengths
    that are multiples of 128."""
    return point["head_dim"] in (16, 32, 64, 128, 256) and point["n"] % 128 == 0


def geometric_mean(values: list[float]) -> float:
    values = [v for v in values if v == v and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def summary(rows: list[dict]) -> dict:
    """Per pass: the geometric mean and the smallest of Triton's speed over SDPA's and over
    compiled FlexAttention's, and the point where each is smallest."""
    out = {}
    for name in ("fwd", "fwd+bwd"):
        mine = [r for r in rows if r["pass"] == name]
        if not mine:
            continue
        entry = {}
        for other in ("sdpa", "flex", "tutorial"):
            key = f"speed_vs_{other}"
            values = [r[key] for r in mine if r.get(key, math.nan) == r.get(key, math.nan)]
            if values:
                worst = min((r for r in mine if r.get(key, math.nan) == r.get(key, math.nan)),
                            key=lambda r: r[key])
                entry[key] = {"geomean": geometric_mean(values), "min": worst[key],
                              "min_at": {k: worst[k] for k in ("dtype", "head_dim", "causal", "batch", "n")},
                              "points": len(values), "slower_at": sum(v < 1 for v in values)}
        out[name] = entry
    return out


def time_point(point: dict, backward: bool, repeat: int, timer=gpu_time, device: str = "cuda",
               flex=None, errors: dict | None = None, tutorial=None) -> dict:
    """One row: TFLOP/s of Triton, SDPA, FlexAttention (``flex``: a function of q, k, v or
    None), the Triton tutorial's kernel (``tutorial``: its ``attention`` or None) and naive
    attention on one point, their ratios, peak memory and the error."""
    B, H, n, d = point["batch"], point["heads"], point["n"], point["head_dim"]
    dtype, causal = getattr(torch, point["dtype"]), point["causal"]
    q, k, v = (torch.randn(B, H, n, d, device=device, dtype=dtype, requires_grad=backward)
               for _ in range(3))
    flops = 4 * B * H * n * n * d * (0.5 if causal else 1.0) * (3.5 if backward else 1.0)  # bwd = 2.5x fwd
    fns = {
        "triton": lambda: flash_attention(q, k, v, is_causal=causal, backend="triton"),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "flex": (lambda: flex(q, k, v)) if flex is not None else None,
        "tutorial": ((lambda: tutorial(q, k, v, causal, 1 / math.sqrt(d)))
                     if tutorial is not None and tutorial_takes(point) else None),
        "naive": lambda: naive_attention(q, k, v, is_causal=causal),
    }
    cuda = device.startswith("cuda")
    tflops, mem = {}, {}
    for name, fn in fns.items():
        too_big = name == "naive" and cuda and B * H * n * n * 4 * 4 > 0.5 * torch.cuda.mem_get_info()[0]
        if fn is None or too_big:  # no FlexAttention here, or naive's n x n tensors would not fit
            tflops[name], mem[name] = float("nan"), float("nan")
            continue
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        tflops[name] = flops / timer(fn, backward, repeat) / 1e12
        mem[name] = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else float("nan")
    name = "fwd+bwd" if backward else "fwd"
    return {**point, "pass": name, "tflops": tflops, "peak_mib": mem,
            "speed_vs_sdpa": tflops["triton"] / tflops["sdpa"],
            "speed_vs_flex": tflops["triton"] / tflops["flex"],
            "speed_vs_tutorial": tflops["triton"] / tflops["tutorial"],
            "max_err": (errors or {}).get(name, float("nan"))}


def gpu_table(args: argparse.Namespace, timer=gpu_time) -> dict:
    """The Triton kernels against SDPA, compiled FlexAttention and naive attention on the
    points of :func:`matrix`, forward and forward + backward: prints the table and the
    geometric means, returns them (``--json`` writes them)."""
    device = args.device
    points = matrix(args)
    tutorial = load_tutorial(args.tutorial) if args.tutorial else None
    raise_recompile_limit(2 * len(points))  # one forward and one backward graph per point
    info = {"device": torch.cuda.get_device_name() if device.startswith("cuda") else device,
            "torch": torch.__version__, "repeat": args.repeat, "quick": args.quick,
            "tutorial": args.tutorial}
    print(f"device={info['device']} (best of {args.repeat}; TFLOP/s; speed = Triton's TFLOP/s / the other's)")
    print(f"{'dtype':>8} {'d':>3} {'causal':>6} {'B':>3} {'H':>3} {'n':>6} {'pass':>8} | {'triton':>7} {'sdpa':>7} "
          f"{'flex':>7} {'tutor.':>7} {'naive':>7} | vs sdpa  vs flex  vs tut. | {'triton MiB':>10} | max err")
    rows = []
    for point in tqdm(points, desc="points", leave=False):
        B, H, n, d = point["batch"], point["heads"], point["n"], point["head_dim"]
        q, k, v = (torch.randn(B, H, n, d, device=device, dtype=getattr(torch, point["dtype"]))
                   for _ in range(3))
        errors = check_accuracy(q, k, v, point["causal"], n)
        del q, k, v
        for backward in (False, True):
            flex = flex_attention_fn(point["causal"], n, device)
            row = time_point(point, backward, args.repeat, timer, device, flex, errors, tutorial)
            rows.append(row)
            t = row["tflops"]
            tqdm.write(f"{row['dtype']:>8} {d:>3} {str(row['causal']):>6} {B:>3} {H:>3} {n:>6} {row['pass']:>8} | "
                       f"{t['triton']:7.1f} {t['sdpa']:7.1f} {t['flex']:7.1f} {t['tutorial']:7.1f} {t['naive']:7.1f} | "
                       f"{row['speed_vs_sdpa']:7.2f} {row['speed_vs_flex']:8.2f} {row['speed_vs_tutorial']:8.2f} | "
                       f"{row['peak_mib']['triton']:10.1f} | "
                       f"{row['max_err']:.1e}")
    result = {**info, "rows": rows, "summary": summary(rows)}
    for name, entry in result["summary"].items():
        for key, s in entry.items():
            at = s["min_at"]
            print(f"{name:>8} {key}: geometric mean {s['geomean']:.2f}, lowest {s['min']:.2f} at {at['dtype']} "
                  f"d={at['head_dim']} causal={at['causal']} B={at['batch']} n={at['n']}; slower at "
                  f"{s['slower_at']} of {s['points']} points" + (f", by up to {1 / s['min']:.2f}x" if s['min'] < 1 else ""))
    if tutorial is None:
        print("(no third column: --tutorial PATH times Triton's tutorials/06-fused-attention.py beside these)")
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    seed_everything(0)
    if args.window is not None:
        window_table(args)
    elif args.device.startswith("cuda"):
        result = gpu_table(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    else:
        cpu_table(args)


if __name__ == "__main__":
    main()
