"""Where post-LN needs learning-rate warm-up and pre-LN does not (the Transformer-block
chapter).

Xiong et al. (2020) show that at initialization the gradient of a post-LN Transformer is
large near the output, so a large learning rate from the first step can wreck it, while
a pre-LN one trains without warm-up. This script finds where that shows on the book's
character-level model (``TinyGPT``, d = 64, 4 heads, RoPE) on the Python documentation
(``attnbook.data.python_docs``): for each depth and peak learning rate it trains

* pre-LN without warm-up,
* post-LN without warm-up,
* post-LN with a linear warm-up over the first quarter of the steps,

with ``attnbook.transformer.train_language_model`` (AdamW without weight decay, constant
learning rate after the warm-up, no clipping: clipping would hide what the norm's place
does), and prints the training loss in bits per character (mean of the last 10 steps) of
each, beside the unigram baseline (4.70). A run "stuck" near the unigram has learned
only character frequencies.

    python benchmarks/bench_warmup.py                 # depths 2, 6, 12; lr 1e-3, 3e-3, 1e-2
    python benchmarks/bench_warmup.py --depths 6 --lrs 1e-2 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from tqdm.auto import tqdm

from attnbook import data, models, transformer


def final_bits(
    depth: int, lr: float, position: str, warmup: int, steps: int, seed: int, batch: int
):
    corpus = data.python_docs()
    torch.manual_seed(seed)
    config = models.TransformerConfig(
        vocab_size=len(corpus.vocab),
        d_model=64,
        n_heads=4,
        n_layers=depth,
        norm_position=position,
    )
    model = models.TinyGPT(config)
    history = transformer.train_language_model(
        model,
        corpus.train,
        steps=steps,
        block_size=64,
        batch_size=batch,
        lr=lr,
        warmup=warmup,
        min_lr=lr,  # constant after the warm-up
        weight_decay=0.0,
        grad_clip=None,
        generator=torch.Generator().manual_seed(seed),
        progress=False,
    )
    return sum(history.losses[-10:]) / 10 / math.log(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 6, 12])
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--batch", type=int, default=16, help="windows of 64 characters")
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs = [("pre-LN", "pre", 0), ("post-LN", "post", 0), ("post-LN + warm-up", "post", 1)]
    print(f"{args.steps} steps, batch {args.batch} x 64 characters, d=64; training loss in bits per "
          "character (mean of the last 10 steps; unigram baseline 4.70)")
    print(f"{'layers':>6} {'lr':>7} | " + " | ".join(f"{name:>17}" for name, _, _ in runs))
    start = time.perf_counter()
    grid = [(d, lr) for d in args.depths for lr in args.lrs]
    for depth, lr in tqdm(grid, desc="depth x lr", leave=False):
        cells = []
        for _, position, warm in runs:
            bits = [
                final_bits(
                    depth, lr, position, warm * args.steps // 4, args.steps, seed, args.batch
                )
                for seed in args.seeds
            ]
            cells.append(" ".join(f"{b:.2f}" for b in bits))
        print(f"{depth:>6} {lr:>7.0e} | " + " | ".join(f"{c:>17}" for c in cells))
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
