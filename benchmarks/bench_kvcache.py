"""Greedy generation with and without a KV cache, and split-KV decode attention (Chapter 6).

Part 1 (any device): TinyGPT (4 layers, d_model 256, RoPE) generates up to ``--max-new`` tokens greedily
from a 16-token prompt, once recomputing the whole prefix at every step and once with a KV cache. It
checks both give identical tokens and prints tokens per second and the speedup for several lengths.
Part 2 (CUDA only): one decode step of attention over a long cache, the Triton split-KV kernel with
1 split and with the default number of splits against PyTorch's SDPA over the padded cache.
"""

from __future__ import annotations

import argparse
import time

import torch

from attnbook.models import TinyGPT, TransformerConfig


def timed(fn, repeat: int) -> tuple[float, object]:
    """Best wall-clock time of ``repeat`` runs (synchronizing CUDA) and the last result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best, result


def bench_generate(device: str, max_new: int, repeat: int) -> None:
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=64, d_model=256, n_heads=8, n_layers=4, positional="rope")
    model = TinyGPT(cfg).to(device).eval()
    prompt = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(0)).to(device)
    print(f"TinyGPT 4 layers, d_model 256, 8 heads, rope; prompt 16 tokens, batch 1, greedy; device={device}, "
          f"threads={torch.get_num_threads()} (best of {repeat})")
    print(f"{'new tokens':>10} | {'no cache s':>10} {'cache s':>8} | {'no cache tok/s':>14} {'cache tok/s':>11} | "
          f"{'speedup':>7} identical")
    lengths = [n for n in (32, 64, 128, 256, 512, 1024) if n < max_new] + [max_new]
    for n in lengths:
        t_full, full = timed(lambda: model.generate(prompt, n, use_cache=False), repeat)
        t_cache, cached = timed(lambda: model.generate(prompt, n, use_cache=True), repeat)
        print(f"{n:>10} | {t_full:>10.3f} {t_cache:>8.3f} | {n / t_full:>14.1f} {n / t_cache:>11.1f} | "
              f"{t_full / t_cache:>7.1f} {bool(torch.equal(full, cached))}")


def bench_kvcache_kernel(repeat: int) -> None:
    from attnbook.kernels.decode import default_num_splits, _split_kv_attention

    print("\none decode step, fp16, batch 1, 32 heads, 8 KV heads, head_dim 128 (times in microseconds)")
    print(f"{'cache len':>9} | {'sdpa':>8} {'1 split':>8} {'splits':>8} {'n':>4} | {'sdpa/splits':>11} {'max|diff|':>9}")
    for S in (1024, 4096, 16384, 65536):
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.float16, generator=g)
        k, v = (torch.randn(1, 8, S, 128, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
        seqlens = torch.tensor([S], device="cuda")
        sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
        t_sdpa, ref = timed(sdpa, repeat)
        t_one, _ = timed(lambda: _split_kv_attention(q, k, v, seqlens, num_splits=1), repeat)
        n = default_num_splits(32, S)
        t_split, out = timed(lambda: _split_kv_attention(q, k, v, seqlens), repeat)
        diff = (out.float() - ref.float()).abs().max().item()
        print(f"{S:>9} | {t_sdpa * 1e6:>8.1f} {t_one * 1e6:>8.1f} {t_split * 1e6:>8.1f} {n:>4} | "
              f"{t_sdpa / t_split:>11.2f} {diff:>9.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--max-new", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    bench_generate(args.device, args.max_new, args.repeat)
    if args.device == "cuda":
        bench_kvcache_kernel(max(args.repeat, 20))


if __name__ == "__main__":
    main()
