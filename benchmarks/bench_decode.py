"""Milliseconds per generated token: attnbook's TinyGPT against Hugging Face GPT-2 (Chapter 6).

TinyGPT is built with GPT-2's architecture (learned positions, pre-norm LayerNorm, GELU MLP,
tied embeddings) and the same sizes as a ``transformers.GPT2LMHeadModel``, whose weights are
copied into it, so both libraries compute the same function and must write the same tokens.
For each number of new tokens it times greedy generation from a ``--prompt``-token prompt:

* ``no cache``: ``TinyGPT.generate(..., use_cache=False)``, the whole prefix at every step;
* ``cache``: the static cache, eager (``use_cache=True``);
* ``compiled``: the same step through ``torch.compile`` (``compile=True``); its compile time
  (first call minus a warm call) is printed, not hidden;
* ``HF``: ``GPT2LMHeadModel.generate`` with its default dynamic cache.

It prints the best time per token of ``--repeat`` runs, each row's ratio to Hugging Face, whether
the tokens are identical, and saves a plot (``--plot``). Without ``transformers`` (the optional
``bench`` extra: ``pip install -e .[bench]``) the HF row is skipped, with the reason printed, and
TinyGPT keeps its own initialization.
"""

from __future__ import annotations

import argparse
import time

import torch

from attnbook.models import TinyGPT, TransformerConfig


def timed(fn, repeat: int, device: str) -> tuple[float, object]:
    """Best wall-clock seconds of ``repeat`` runs (CUDA synchronized) and the last result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best, result


def hugging_face(args, n_positions: int):
    """A GPT2LMHeadModel of the benchmark's sizes and GELU, or the reason there is none."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
        from transformers.utils import logging
    except ImportError as error:
        return None, f"transformers is not installed ({error}): pip install -e .[bench]"
    logging.set_verbosity_error()
    config = GPT2Config(
        vocab_size=args.vocab, n_embd=args.d_model, n_layer=args.layers, n_head=args.heads,
        n_positions=n_positions, activation_function="gelu", bos_token_id=None,
        eos_token_id=None, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval(), ""


@torch.no_grad()
def copy_weights(hf, model: TinyGPT) -> None:
    """GPT-2's weights into TinyGPT (GPT-2's Conv1D stores ``(in, out)``, nn.Linear
    ``(out, in)``; its ``c_attn`` holds the query, key and value projections side by side)."""
    gpt, d = hf.transformer, model.config.d_model
    model.tok_emb.weight.copy_(gpt.wte.weight)
    model.pos_emb.weight.copy_(gpt.wpe.weight)
    for block, layer in zip(model.blocks, gpt.h):
        block.ln1.load_state_dict(layer.ln_1.state_dict())
        block.ln2.load_state_dict(layer.ln_2.state_dict())
        w, b = layer.attn.c_attn.weight, layer.attn.c_attn.bias
        for i, proj in enumerate((block.attn.q_proj, block.attn.k_proj, block.attn.v_proj)):
            proj.weight.copy_(w[:, i * d : (i + 1) * d].T)
            proj.bias.copy_(b[i * d : (i + 1) * d])
        pairs = ((block.attn.out_proj, layer.attn.c_proj), (block.mlp.fc, layer.mlp.c_fc),
                 (block.mlp.proj, layer.mlp.c_proj))  # fmt: skip
        for linear, conv in pairs:
            linear.weight.copy_(conv.weight.T)
            linear.bias.copy_(conv.bias)
    model.ln_f.load_state_dict(gpt.ln_f.state_dict())


def plot(path: str, lengths: list[int], rows: dict[str, list[float]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, values in rows.items():
        points = [(n, v) for n, v in zip(lengths, values) if v == v]
        if points:
            ax.plot(*zip(*points), marker="o", label=name)
    ax.set(xscale="log", yscale="log", xlabel="new tokens", ylabel="ms per token", title=title)
    ax.set_xticks(lengths, labels=[str(n) for n in lengths])
    ax.set_xticks([], minor=True)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot saved to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[128, 512, 1024])
    parser.add_argument("--no-cache-max", type=int, default=512,
                        help="time the uncached path only up to this many new tokens (it is quadratic)")
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled row")
    parser.add_argument("--plot", default="bench_decode.png")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device, lengths = args.device, sorted(args.new_tokens)
    n_positions = args.prompt + lengths[-1]
    cfg = TransformerConfig(
        vocab_size=args.vocab, d_model=args.d_model, n_heads=args.heads, n_layers=args.layers,
        positional="learned", max_len=n_positions, tie_weights=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = TinyGPT(cfg).eval()
    hf, why = hugging_face(args, n_positions)
    if hf is not None:
        copy_weights(hf, model)
        hf.to(device)
    model.to(device)
    prompt = torch.randint(0, args.vocab, (args.batch, args.prompt),
                           generator=torch.Generator().manual_seed(0)).to(device)  # fmt: skip
    print(f"TinyGPT (GPT-2 architecture) d_model {args.d_model}, {args.layers} layers, "
          f"{args.heads} heads, vocab {args.vocab};\nbatch {args.batch}, prompt {args.prompt}, "
          f"greedy; device={device}, threads={torch.get_num_threads()}, "
          f"torch {torch.__version__} (best of {args.repeat})")
    if hf is None:
        print(f"HF row skipped: {why}")
    if not args.no_compile:
        start = time.perf_counter()
        model.generate(prompt, lengths[0], compile=True)
        first = time.perf_counter() - start
        warm, _ = timed(lambda: model.generate(prompt, lengths[0], compile=True), 1, device)
        print(f"compiled step: first call {first:.1f} s, warm call {warm:.2f} s,\n"
              f"compile time about {first - warm:.1f} s (once per model class and shapes)")

    names = ["no cache", "cache (eager)", "compiled", "HF GPT-2"]
    rows = {name: [] for name in names}
    short = {"cache (eager)": "cache"}
    header = " ".join(f"{short.get(name, name):>9}" for name in names)
    print(f"\nms per token (identical: every row wrote the same tokens)\n"
          f"{'new':>5} | {header} | {'cache/HF':>8} {'comp/HF':>7} | identical")
    for n in lengths:
        runs = {
            "no cache": (lambda: model.generate(prompt, n, use_cache=False))
            if n <= args.no_cache_max else None,
            "cache (eager)": lambda: model.generate(prompt, n),
            "compiled": None if args.no_compile else (lambda: model.generate(prompt, n, compile=True)),
            "HF GPT-2": None if hf is None else (lambda: hf.generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                min_new_tokens=n, do_sample=False)),
        }  # fmt: skip
        if runs["compiled"] is not None:  # new shapes: compiled once, before timing
            runs["compiled"]()
        # the methods alternate within each round, so a burst of load hits them alike
        best, tokens = dict.fromkeys(names, float("nan")), {}
        for _ in range(args.repeat):
            for name in names:
                if runs[name] is not None:
                    seconds, tokens[name] = timed(runs[name], 1, device)
                    best[name] = min(seconds, best[name]) if best[name] == best[name] else seconds
        for name in names:
            rows[name].append(best[name] * 1e3 / n)
        reference = tokens["cache (eager)"]
        same = all(torch.equal(t, reference) for t in tokens.values())
        cells = " ".join(f"{v[-1]:>9.3f}" if v[-1] == v[-1] else f"{'-':>9}" for v in rows.values())
        hf_ms = rows["HF GPT-2"][-1]
        ratios = f"{rows['cache (eager)'][-1] / hf_ms:>8.2f} {rows['compiled'][-1] / hf_ms:>7.2f}"
        print(f"{n:>5} | {cells} | {ratios} | {same}")
    if hf is not None and 512 in lengths:
        i = lengths.index(512)
        eager, compiled = (rows[k][i] / rows["HF GPT-2"][i] for k in ("cache (eager)", "compiled"))
        print(f"at 512 new tokens: cache/HF = {eager:.2f} (target <= 0.8: "
              f"{'met' if eager <= 0.8 else 'missed'}),\n"
              f"compiled/HF = {compiled:.2f} (target <= 0.6: {'met' if compiled <= 0.6 else 'missed'})")
    plot(args.plot, lengths, rows, f"greedy decoding, {device}, {torch.get_num_threads()} threads")


if __name__ == "__main__":
    main()
