"""Quality at equal cache size: MHA, GQA, MQA and MLA trained alike (serving chapter).

DeepSeek-V2 (DeepSeek-AI, 2024) argues that multi-head latent attention caches about as
little per token as grouped-query attention with a few groups, yet models as well as
full multi-head attention. This script asks the same question at the book's scale. On
the Python documentation (``attnbook.data.python_docs``, characters) it trains
character-level ``TinyGPT`` models of the same width and depth (default d = 96, 4 heads
of 24, 3 layers, RoPE) with the same recipe, budget and batches
(``attnbook.transformer.train_language_model``: AdamW, 20 warm-up steps then cosine,
clipping at 1; 220 steps of 32 windows of 64 characters, lr 3e-3, the chapter's CPU
setting), which differ only in their attention:

* MHA: every head caches its key and value (``n_kv_heads = n_heads``);
* GQA: ``--kv-heads`` key/value heads (default 2) shared by the query heads;
* MQA: one key/value head;
* MLA = GQA: ``attention="mla"`` with the latent ``d_c`` chosen so that ``d_c + d_R``
  equals GQA's ``2 n_kv d_h`` numbers per token and layer (default 80 + 16 = 96);
* MLA = MQA: the same at MQA's ``2 d_h`` (default 32 + 16 = 48).

For each it prints the parameters, the KV-cache bytes per token of one sequence
(``attnbook.serving.cache_bytes_per_token``, float32 and float16; checked against the
cache the model itself allocates), the validation bits per character
(``attnbook.transformer.bits_per_char`` on the held-out topics, one column per seed,
then the mean and the difference from MHA's) and the training time (wall clock and CPU
seconds of the process, mean over the seeds), beside the unigram
and bigram baselines. It also checks that every trained MLA model decodes with its
latent cache: ``model.generate(prompt, 20)`` with ``use_cache=True`` (a
``LatentKVCache``, up-projections absorbed) and ``use_cache=False`` give the same
tokens.

    python benchmarks/bench_cache_quality.py                # 1 seed, ~2 min on 1 core
    python benchmarks/bench_cache_quality.py --seeds 0 1 2  # about 6-7 min
    python benchmarks/bench_cache_quality.py --steps 100 --d-model 64 --layers 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from tqdm.auto import tqdm

from attnbook import data, models, serving, transformer


def variants(d_model: int, heads: int, kv_heads: int, rope_dim: int) -> list[dict]:
    """The attention variants: name, the config's attention fields, and the arguments of
    ``cache_bytes_per_token`` (without the sizes every variant shares)."""
    head_dim = d_model // heads
    runs = [
        dict(name="MHA", config=dict(n_kv_heads=heads), cache=dict(kind="mha")),
        dict(
            name=f"GQA ({kv_heads} KV heads)",
            config=dict(n_kv_heads=kv_heads),
            cache=dict(kind="gqa", n_kv_heads=kv_heads),
        ),
        dict(name="MQA (1 KV head)", config=dict(n_kv_heads=1), cache=dict(kind="mqa")),
    ]
    for target, width in (
        (f"GQA-{kv_heads}", 2 * kv_heads * head_dim),
        ("MQA", 2 * head_dim),
    ):
        latent = width - rope_dim  # d_c + d_R = the target's numbers per token, layer
        if latent < 1:
            raise SystemExit(
                f"rope_dim={rope_dim} leaves no latent for MLA = {target} "
                f"({width} numbers)"
            )
        runs.append(
            dict(
                name=f"MLA = {target} (d_c {latent})",
                config=dict(attention="mla", kv_latent_dim=latent, rope_dim=rope_dim),
                cache=dict(kind="mla", kv_latent_dim=latent, rope_dim=rope_dim),
            )
        )
    return runs


def allocated_bytes_per_token(model: models.TinyGPT) -> int:
    """Bytes per token of one sequence in the cache the model allocates (float32)."""
    cache = model.make_cache(1, 1)
    if cache.kernel == "absorbed":  # latents, not keys and values (caches.AttentionCache)
        return cache.bytes_per_token
    return (cache.k.numel() + cache.v.numel()) * cache.k.element_size()


def train_one(corpus, config, args, seed: int) -> dict:
    torch.manual_seed(seed)
    model = models.TinyGPT(config)
    start, cpu = time.perf_counter(), time.process_time()
    transformer.train_language_model(
        model,
        corpus.train,
        steps=args.steps,
        block_size=args.block,
        batch_size=args.batch,
        lr=args.lr,
        warmup=args.warmup,
        # the same batches for every variant
        generator=torch.Generator().manual_seed(seed),
        progress=False,
    )
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    bits = transformer.bits_per_char(model, corpus.valid, args.block)
    model.eval()
    prompt = corpus.valid[: args.prompt][None]
    cached = model.generate(prompt, 20, use_cache=True)
    uncached = model.generate(prompt, 20, use_cache=False)
    return dict(
        model=model,
        bits=bits,
        seconds=seconds,
        cpu=cpu,
        same_tokens=torch.equal(cached, uncached),
        text=corpus.vocab.decode(cached[0, args.prompt :]),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=220)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--d-model", type=int, default=96)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2, help="GQA's key/value heads")
    parser.add_argument(
        "--rope-dim", type=int, default=16, help="MLA's decoupled rotary part"
    )
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument(
        "--prompt", type=int, default=16, help="prompt characters for the decode check"
    )
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.d_model % args.heads or args.heads % args.kv_heads:
        parser.error("--d-model must be a multiple of --heads, --heads of --kv-heads")
    torch.set_num_threads(args.threads)

    corpus = data.python_docs()
    V = len(corpus.vocab)
    unigram = data.ngram_bits_per_char(corpus.train, corpus.valid, 1, V)
    bigram = data.ngram_bits_per_char(corpus.train, corpus.valid, 2, V)
    head_dim = args.d_model // args.heads
    shared = dict(n_layers=args.layers, n_heads=args.heads, head_dim=head_dim)
    runs = variants(args.d_model, args.heads, args.kv_heads, args.rope_dim)

    seeds = " ".join(map(str, args.seeds))
    print(
        f"TinyGPT d={args.d_model}, {args.heads} heads of {head_dim}, "
        f"{args.layers} layers, RoPE; {args.steps} steps x {args.batch} windows of "
        f"{args.block} characters, lr {args.lr:g}, warm-up {args.warmup}; "
        f"seeds {seeds}; threads {args.threads}"
    )
    print(
        f"validation bits per character ({len(corpus.valid):,} characters): "
        f"unigram {unigram:.3f}, bigram {bigram:.3f}"
    )
    seed_cols = " ".join(f"{'s' + str(s):>5}" for s in args.seeds)
    header = (
        f"{'attention':<22} {'params':>7} | {'cache/tok/layer':>15} {'fp32 B/tok':>10} "
        f"{'fp16 B/tok':>10} | bits/char {seed_cols} {'mean':>6} {'vs MHA':>7} | "
        f"{'train s':>7} {'cpu s':>6}"
    )
    print(header)
    print("-" * len(header))
    start = time.perf_counter()
    mha_mean = None
    mla_checks = []
    for run in tqdm(runs, desc="attention variants", leave=False):
        config = models.TransformerConfig(
            vocab_size=V,
            d_model=args.d_model,
            n_heads=args.heads,
            n_layers=args.layers,
            **run["config"],
        )
        fp32 = serving.cache_bytes_per_token(**run["cache"], **shared, bytes_per_elem=4)
        fp16 = serving.cache_bytes_per_token(**run["cache"], **shared, bytes_per_elem=2)
        results = [train_one(corpus, config, args, seed) for seed in args.seeds]
        model = results[0]["model"]
        if allocated_bytes_per_token(model) != fp32:
            raise RuntimeError(
                f"{run['name']}: the model's cache does not hold {fp32} B/token"
            )
        if config.attention == "mla":
            mla_checks += [(run["name"], r["same_tokens"], r["text"]) for r in results]
        bits = [r["bits"] for r in results]
        mean = statistics.fmean(bits)
        mha_mean = mean if mha_mean is None else mha_mean
        params = sum(p.numel() for p in model.parameters())
        seconds = statistics.fmean(r["seconds"] for r in results)
        cpu = statistics.fmean(r["cpu"] for r in results)
        per_layer = fp32 // 4 // args.layers  # numbers per token and layer
        print(
            f"{run['name']:<22} {params:>7,} | {per_layer:>15} {fp32:>10,} "
            f"{fp16:>10,} | {'':>9} {' '.join(f'{b:5.3f}' for b in bits)} {mean:6.3f} "
            f"{mean - mha_mean:+7.3f} | {seconds:7.1f} {cpu:6.1f}"
        )
    if len(args.seeds) > 1:
        print(
            "(spread across seeds: compare the columns s0, s1, ... before reading a "
            "difference)"
        )
    same = sum(ok for _, ok, _ in mla_checks)
    prompt = corpus.vocab.decode(corpus.valid[: args.prompt])
    print(
        f"MLA decodes with its latent cache: generate(prompt, 20) with use_cache=True "
        f"(LatentKVCache) == use_cache=False for {same}/{len(mla_checks)} trained MLA "
        f"models: {same == len(mla_checks)} (e.g. {prompt!r} -> {mla_checks[0][2]!r})"
    )
    print(f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
