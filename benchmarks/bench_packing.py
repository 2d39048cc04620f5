"""Packing documents against padding them to the longest (FlashAttention chapter).

A batch of real documents (the topics of Python's own help, ``pydoc_data.topics``, one byte per
token, cut at ``--max-len``) is attended causally, forward and backward, four ways:

* padded to the longest, with PyTorch's ``scaled_dot_product_attention`` and a boolean mask
  (causal and key padding): what most code does;
* padded, with ``attnbook.flash.flash_attention(is_causal=True)`` (PyTorch tiles): the padding is
  computed too, only the memory is saved;
* packed (``attnbook.flash.flash_attention_varlen``, PyTorch path): no padding token is computed;
* packed, one SDPA call per document.

It prints the time per batch, real tokens per second, peak extra memory (``attnbook.complexity.
measure``) and the share of the padded batch that is padding, all measured side by side in one
run, and checks that the four agree on the real tokens.

    python benchmarks/bench_packing.py            # 16 documents of up to 2048 tokens, CPU
    python benchmarks/bench_packing.py --quick    # 8 documents of up to 512 tokens
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from pydoc_data.topics import topics
from tqdm.auto import tqdm

from attnbook.complexity import measure
from attnbook.flash import flash_attention, flash_attention_varlen


def documents(n_docs: int, max_len: int, seed: int = 0) -> list[int]:
    """Lengths in tokens (bytes) of ``n_docs`` topics drawn without replacement."""
    lengths = [min(len(text.encode()), max_len) for _, text in sorted(topics.items())]
    order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(seed))
    return [lengths[i] for i in order[:n_docs].tolist()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="8 documents of up to 512 tokens")
    args = parser.parse_args(argv)
    if args.quick:
        args.docs, args.max_len = 8, 512
    torch.set_num_threads(args.threads)
    lengths = documents(args.docs, args.max_len)
    total, longest, H, E = sum(lengths), max(lengths), args.heads, args.head_dim
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(total, H, E, generator=gen) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)

    def padded(x):
        out = x.new_zeros(len(lengths), H, longest, E)
        for b, (lo, n) in enumerate(zip(cu[:-1].tolist(), lengths)):
            out[b, :, :n] = x[lo:lo + n].transpose(0, 1)
        return out

    qp, kp, vp = padded(q), padded(k), padded(v)
    real = torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]  # (B, S)
    causal = torch.ones(longest, longest, dtype=torch.bool).tril()
    allowed = causal[None, None] & real[:, None, None, :]
    allowed |= ~real[:, None, :, None]  # padding queries see everything: no empty row

    def unpad(out):
        return torch.cat([out[b, :, :n].transpose(0, 1) for b, n in enumerate(lengths)])

    def train_step(fn, *tensors):
        with torch.enable_grad():  # measure() times under no_grad
            leaves = [t.clone().requires_grad_() for t in tensors]
            out = fn(*leaves)
            out.backward(torch.ones_like(out))
        return out.detach()

    ways = {
        "padded, SDPA + mask": (lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=allowed),
                                (qp, kp, vp), unpad),
        "padded, flash (torch)": (lambda a, b, c: flash_attention(a, b, c, is_causal=True, backend="torch"),
                                  (qp, kp, vp), unpad),
        "packed, flash varlen": (lambda a, b, c: flash_attention_varlen(a, b, c, cu, cu, longest, longest,
                                                                        is_causal=True, backend="torch"),
                                 (q, k, v), lambda out: out),
        "packed, SDPA per doc": (lambda a, b, c: torch.cat([
            F.scaled_dot_product_attention(*(t[lo:lo + n].transpose(0, 1) for t in (a, b, c)),
                                           is_causal=True).transpose(0, 1)
            for lo, n in zip(cu[:-1].tolist(), lengths)]), (q, k, v), lambda out: out),
    }
    print(f"{len(lengths)} documents of {min(lengths)}..{longest} tokens ({total} in all); padded batch "
          f"{len(lengths)} x {longest} = {len(lengths) * longest} tokens, {1 - total / (len(lengths) * longest):.0%} "
          f"padding; heads={H} head_dim={E} float32 causal, forward + backward, CPU threads={args.threads} "
          f"(best of {args.repeat})")
    print(f"{'':24} {'ms':>8} {'real tokens/s':>14} {'peak MiB':>9} {'vs SDPA padded':>15} {'max|diff|':>10}")
    reference = None
    rows = {}
    for name, (fn, tensors, back) in tqdm(ways.items(), desc="ways", leave=False):
        out = back(train_step(fn, *tensors))
        reference = out if reference is None else reference
        run = measure(train_step, fn, *tensors, repeat=args.repeat)
        rows[name] = run
        ms = 1e3 * run["min_s"]
        base = 1e3 * rows["padded, SDPA + mask"]["min_s"]
        tqdm.write(f"{name:24} {ms:8.1f} {total / run['min_s']:14,.0f} {(run['peak_bytes'] or 0) / 2**20:9.1f} "
                   f"{base / ms:14.2f}x {(out - reference).abs().max().item():10.1e}")


if __name__ == "__main__":
    main()
