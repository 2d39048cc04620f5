"""The Transformer block counted, initialized, trained on real text and read head by
head: the code of the chapter on the Transformer block.

The block itself (:class:`attnbook.models.Block`, its norms and feed-forward variants)
lives in :mod:`attnbook.models`; this module measures it:

* **Counting.** :func:`block_parameters` and :func:`model_parameters` give the
  parameters of every part from the config (Vaswani et al., 2017; GPT-2's layout);
  :func:`block_flops` the forward FLOPs of one block on a sequence, its attention part
  from :func:`attnbook.complexity.attention_flops` (multi-head latent attention's,
  DeepSeek-AI, 2024, counted here from its projections).
* **Initialization.** :func:`residual_stream_rms` reads the size of the residual
  stream after the embedding and after every block, where GPT-2's depth-scaled
  initialization (Radford et al., 2019) keeps it level.
* **Training a language model.** :func:`lm_optimizer` (AdamW with weight decay on the
  weight matrices only), :func:`train_language_model` (warm-up and cosine decay,
  gradient clipping, bfloat16 autocast on a GPU) and :func:`bits_per_char` on a
  held-out split; :func:`sample_text` decodes from a prompt.
* **Reading the heads.** :func:`text_patterns` finds, in a text, the keys a head would
  attend to if it looked at the previous character, the start of the current word,
  the innermost open bracket or the character after the previous occurrence of the
  current pair (an induction head on real text; Olsson et al., 2022), and
  :func:`pattern_scores` measures how much weight each head gives them.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
from torch import nn
from torch.nn import functional as F

from .complexity import attention_flops
from .contract import check_flag, check_float, check_int, check_real, check_sizes
from .data import PAD, Task, Vocab, lm_windows, repeated_tokens
from .models import TinyGPT, TinySeq2Seq, TransformerConfig
from .train import History, fit, warmup_cosine

__all__ = [
    "block_parameters",
    "model_parameters",
    "block_flops",
    "residual_stream_rms",
    "lm_optimizer",
    "train_language_model",
    "bits_per_char",
    "sample_text",
    "text_patterns",
    "pattern_scores",
    "seq2seq_loss",
    "exact_match",
    "repeat_losses",
    "train_on_repeats",
]


# --------------------------------------------------------------------------------------
# Checks shared by the functions below
# --------------------------------------------------------------------------------------
def _check_config(fn: str, config) -> None:
    if not isinstance(config, TransformerConfig):
        raise TypeError(
            f"{fn}: config must be a TransformerConfig, got {type(config).__name__}"
        )
    try:  # a field set after construction skips __post_init__'s check
        config.check()
    except (TypeError, ValueError) as error:
        raise type(error)(f"{fn}: config is invalid: {error}") from None


def _check_model(fn: str, model, kind: type = nn.Module) -> None:
    if not isinstance(model, kind):
        raise TypeError(
            f"{fn}: model must be a {kind.__name__}, got {type(model).__name__}"
        )


def _check_ids(fn: str, name: str, ids, vocab_size: int | None, shape: str) -> None:
    """``ids``: an int64 tensor of ``len(shape)`` dimensions (``shape`` like ``"(B,
    T)"``), none of them empty, its values in ``[0, vocab_size)``."""
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long:
        raise TypeError(
            f"{fn}: {name} must be an int64 tensor of token ids, got "
            f"{getattr(ids, 'dtype', type(ids).__name__)}"
        )
    if ids.dim() != shape.strip("(,)").count(",") + 1 or ids.numel() == 0:
        raise ValueError(
            f"{fn}: {name} must have shape {shape} with no empty dimension, got "
            f"{tuple(ids.shape)}"
        )
    if vocab_size is not None and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(
            f"{fn}: {name} holds token ids outside the vocabulary [0, {vocab_size}): "
            f"min {int(ids.min())}, max {int(ids.max())}"
        )


def _vocab_size(model) -> int | None:
    config = getattr(model, "config", None)
    return getattr(config, "vocab_size", None)


# --------------------------------------------------------------------------------------
# Counting
# --------------------------------------------------------------------------------------
def _mlp_hidden(config: TransformerConfig) -> int:
    if config.mlp == "swiglu":
        return config.d_ff or 8 * config.d_model // 3
    return config.d_ff or 4 * config.d_model


def _mha_parameters(config: TransformerConfig) -> int:
    """:class:`attnbook.models.Attention`: ``W_Q, W_O`` ``d x d``, ``W_K, W_V`` ``d x
    d_kv``, each with a bias."""
    d = config.d_model
    d_kv = (config.n_kv_heads or config.n_heads) * (d // config.n_heads)
    return 2 * d * d + 2 * d * d_kv + 2 * d + 2 * d_kv


def _mla_widths(config: TransformerConfig) -> tuple[int, int, int, int, int | None]:
    """MLA's ``d_h`` (head width), ``d_c`` (KV latent), ``d_R`` (rotary part), ``q_in``
    (what the query up-projections read: ``d_q`` or ``d``) and ``d_q`` (or ``None``), as
    :class:`attnbook.models.LatentAttention` builds them."""
    d_h = config.d_model // config.n_heads
    d_c = config.kv_latent_dim or 4 * d_h
    d_q = config.q_latent_dim
    return d_h, d_c, config.rope_dim, d_q or config.d_model, d_q


def _mla_parameters(config: TransformerConfig) -> int:
    """:class:`attnbook.models.LatentAttention` (no biases; ``h d_h = d``)."""
    d, h = config.d_model, config.n_heads
    _, d_c, d_R, q_in, d_q = _mla_widths(config)
    # W^DKV and its RMSNorm, W^UK, W^UV, W^KR
    kv = d * d_c + d_c + 2 * d_c * d + d * d_R
    q = (d * d_q + d_q if d_q else 0) + q_in * d + q_in * h * d_R  # W^DQ, W^UQ, W^QR
    return kv + q + d * d  # W^O


def _mha_flops(config: TransformerConfig, n: int, B: int) -> int:
    return attention_flops(
        n, config.d_model, config.n_heads, B, n_kv_heads=config.n_kv_heads
    )["matmul"]


def _mla_flops(config: TransformerConfig, n: int, B: int) -> int:
    """MLA without a cache (the keys and values of every head materialized): each
    projection weight once per token, then ``h`` heads of ``(n, d_h + d_R) x (d_h +
    d_R, n)`` scores and ``(n, n) x (n, d_h)`` weighted sums."""
    d, h = config.d_model, config.n_heads
    d_h, d_c, d_R, _, d_q = _mla_widths(config)
    weights = _mla_parameters(config) - d_c - (d_q or 0)  # all but the norms' gains
    return 2 * B * n * weights + 2 * B * h * n * n * (d_h + d_R) + 2 * B * n * n * d


#: The parameters and forward FLOPs of each ``config.attention`` kind: one function
#: per kind, so a new kind without its count fails loudly instead of taking MHA's.
_ATTENTION_PARAMETERS = {"mha": _mha_parameters, "mla": _mla_parameters}
_ATTENTION_FLOPS = {"mha": _mha_flops, "mla": _mla_flops}


def block_parameters(config: TransformerConfig) -> dict[str, int]:
    """Parameters of one :class:`attnbook.models.Block`, part by part.

    With ``d = d_model``, ``h = n_heads``, ``d_kv = n_kv_heads * d / h`` and ``f`` the
    MLP's hidden width:

    * ``attention``, ``"mha"``: ``W_Q, W_O`` are ``d x d``, ``W_K, W_V`` are ``d x
      d_kv``, each with a bias: ``2 d^2 + 2 d d_kv + 2 d + 2 d_kv``;
    * ``attention``, ``"mla"`` (no biases; ``d_h = d / h``, ``d_c = kv_latent_dim``,
      default ``4 d_h``, ``d_R = rope_dim``, ``d_q = q_latent_dim``, ``q_in = d_q``
      or ``d`` without one): ``W^{DKV}`` ``d d_c`` and its RMSNorm ``d_c``,
      ``W^{UK}, W^{UV}`` ``2 d_c d``, ``W^{KR}`` ``d d_R``, with ``d_q`` also
      ``W^{DQ}`` ``d d_q`` and its RMSNorm ``d_q``, ``W^{UQ}`` ``q_in d``, ``W^{QR}``
      ``q_in h d_R`` and ``W^O`` ``d^2``;
    * ``mlp``: GELU ``2 d f + f + d`` (``f = 4d``); SwiGLU ``3 d f`` (``f = 8d/3``, no
      biases); none for attention-only blocks;
    * ``norms``: ``2 d`` per LayerNorm, ``d`` per RMSNorm, two per block (one without
      an MLP).

    ``total`` is their sum, about ``12 d^2`` for the GELU block."""
    _check_config("block_parameters", config)
    d = config.d_model
    attention = _ATTENTION_PARAMETERS[config.attention](config)
    f = _mlp_hidden(config)
    mlp = {"gelu": 2 * d * f + f + d, "swiglu": 3 * d * f, "none": 0}[config.mlp]
    per_norm = 2 * d if config.norm == "layernorm" else d
    norms = per_norm * (1 if config.mlp == "none" else 2)
    return {
        "attention": attention,
        "mlp": mlp,
        "norms": norms,
        "total": attention + mlp + norms,
    }


def model_parameters(config: TransformerConfig) -> dict[str, int]:
    """Parameters of a :class:`attnbook.models.TinyGPT`: ``embedding`` (``V d``, plus
    the ``learned`` position table or T5's bias table), ``blocks`` (``n_layers`` times
    :func:`block_parameters`), ``final_norm`` (none after post-norm blocks), ``head``
    (``V d``, zero when tied to the embedding) and ``total``."""
    _check_config("model_parameters", config)
    d, V = config.d_model, config.vocab_size
    embedding = V * d
    if config.positional == "learned":
        embedding += config.max_len * d
    elif config.positional == "t5":
        embedding += config.t5_num_buckets * config.n_heads
    blocks = config.n_layers * block_parameters(config)["total"]
    final_norm = 0
    if config.norm_position == "pre":
        final_norm = 2 * d if config.norm == "layernorm" else d
    head = 0 if config.tie_weights else V * d
    return {
        "embedding": embedding,
        "blocks": blocks,
        "final_norm": final_norm,
        "head": head,
        "total": embedding + blocks + final_norm + head,
    }


def _check_flops(config, seq_len, batch) -> None:
    _check_config("block_flops", config)
    check_sizes("block_flops", seq_len=seq_len, batch=batch)


def block_flops(config: TransformerConfig, seq_len: int, batch: int = 1) -> dict:
    """Forward FLOPs of one block on ``batch`` sequences of ``seq_len`` tokens (2 per
    multiply-add, matrix products only, as PyTorch's FLOP counter counts them).

    ``attention``: for ``"mha"``, :func:`attnbook.complexity.attention_flops`'s matrix
    products (projections, scores, weighted sum; a causal mask still computes every
    score); for ``"mla"`` (keys and values materialized, as without a cache), ``2 B n``
    per weight of its projections (all of :func:`block_parameters`' but the two
    RMSNorm gains), ``2 B n^2 h (d_h + d_R)`` for the scores (the rotary part widens
    queries and keys) and ``2 B n^2 d`` for the weighted sum; ``mlp``: ``2 B n d f``
    per weight matrix (two for GELU, three for SwiGLU); ``total``: both;
    ``per_token``: ``total / (B n)``. A training step, forward and backward, costs
    ``3 total``: the backward computes two products per forward one (the gradients of
    both factors)."""
    _check_flops(config, seq_len, batch)
    att = _ATTENTION_FLOPS[config.attention](config, seq_len, batch)
    matrices = {"gelu": 2, "swiglu": 3, "none": 0}[config.mlp]
    mlp = matrices * 2 * batch * seq_len * config.d_model * _mlp_hidden(config)
    return {
        "attention": att,
        "mlp": mlp,
        "total": att + mlp,
        "per_token": (att + mlp) / (batch * seq_len),
    }


# --------------------------------------------------------------------------------------
# Initialization: the size of the residual stream
# --------------------------------------------------------------------------------------
def _check_rms(model, idx) -> None:
    fn = "residual_stream_rms"
    _check_model(fn, model)
    if not isinstance(getattr(model, "blocks", None), (nn.ModuleList, nn.Module)):
        raise TypeError(f"{fn}: model must have blocks, got {type(model).__name__}")
    _check_ids(fn, "idx", idx, _vocab_size(model), "(B, T)")


@torch.no_grad()
def residual_stream_rms(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """The root-mean-square of the residual stream ``x`` ``(B, T, d)``: after the
    embedding (entry 0) and after each of ``model.blocks`` (entries 1 ..
    ``n_layers``), read by forward hooks while ``model(idx)`` runs."""
    _check_rms(model, idx)
    sizes: list[float] = []

    def before(module, args):
        sizes.append(args[0].pow(2).mean().sqrt().item())

    def after(module, args, output):
        out = output[0] if isinstance(output, tuple) else output
        sizes.append(out.pow(2).mean().sqrt().item())

    blocks = list(model.blocks)
    hooks = [blocks[0].register_forward_pre_hook(before)]
    hooks += [block.register_forward_hook(after) for block in blocks]
    try:
        model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.tensor(sizes)


# --------------------------------------------------------------------------------------
# Training a language model
# --------------------------------------------------------------------------------------
def _check_optimizer(fn: str, model, lr, weight_decay, betas=(0.9, 0.95)) -> None:
    _check_model(fn, model)
    check_real(fn, "lr", lr, above=0)
    check_real(fn, "weight_decay", weight_decay, minimum=0)
    if (
        not isinstance(betas, (tuple, list))
        or len(betas) != 2
        or not all(
            isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1
            for b in betas
        )
    ):
        raise ValueError(f"{fn}: betas must be two numbers in [0, 1), got {betas!r}")


def lm_optimizer(
    model: nn.Module,
    lr: float,
    *,
    weight_decay: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.95),
) -> torch.optim.AdamW:
    """AdamW (Loshchilov and Hutter, 2019) with two parameter groups: weight decay on
    the weight matrices and embeddings (tensors of 2 or more dimensions), none on
    biases and the norms' gains, which set scales rather than store features (GPT-2's
    and nanoGPT's recipe). ``betas=(0.9, 0.95)``: a shorter memory of the squared
    gradient than Adam's default 0.999, steadier for transformers."""
    _check_optimizer("lm_optimizer", model, lr, weight_decay, betas)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


class _Windows:
    """``steps`` random training windows, drawn lazily (``len`` for the progress
    bar)."""

    def __init__(self, ids, steps, block_size, batch_size, generator):
        self.args = (ids, block_size, batch_size, generator)
        self.steps = steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _ in range(self.steps):
            yield lm_windows(*self.args)


def _autocast(device: torch.device, enabled: bool):
    """bfloat16 autocast on a GPU that supports it; nothing elsewhere."""
    if enabled and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _check_training(model, ids, steps, block_size, batch_size, lr, warmup) -> None:
    fn = "train_language_model"
    _check_optimizer(fn, model, lr, 0.0)
    check_sizes(fn, steps=steps, block_size=block_size, batch_size=batch_size)
    if check_int(fn, "warmup", warmup, minimum=0) >= steps:
        raise ValueError(f"{fn}: warmup must be < steps={steps}, got {warmup}")
    _check_ids(fn, "ids", ids, _vocab_size(model), "(N,)")
    if len(ids) <= block_size:
        raise ValueError(
            f"{fn}: ids must hold more than block_size={block_size} ids, got {len(ids)}"
        )


def _check_training_options(min_lr, weight_decay, grad_clip, mixed_precision, progress):
    fn = "train_language_model"
    if min_lr is not None:
        check_real(fn, "min_lr", min_lr, minimum=0)
    check_real(fn, "weight_decay", weight_decay, minimum=0)
    if grad_clip is not None:
        check_real(fn, "grad_clip", grad_clip, above=0)
    check_flag(fn, "mixed_precision", mixed_precision)
    check_flag(fn, "progress", progress)


def train_language_model(
    model: TinyGPT,
    ids: torch.Tensor,
    *,
    steps: int,
    block_size: int,
    batch_size: int,
    lr: float,
    warmup: int = 0,
    min_lr: float | None = None,
    weight_decay: float = 0.1,
    grad_clip: float | None = 1.0,
    mixed_precision: bool = True,
    generator: torch.Generator | None = None,
    progress: bool = True,
) -> History:
    """Train ``model`` for ``steps`` optimizer steps on random windows of the 1-D id
    tensor ``ids`` (next-character cross-entropy), with the usual recipe:

    * :func:`lm_optimizer` (AdamW, decay on matrices only);
    * :func:`attnbook.train.warmup_cosine`: ``warmup`` steps of linear warm-up to
      ``lr``, then a cosine decay to ``min_lr`` (default ``lr / 10``); ``warmup=0``
      starts at ``lr``;
    * gradient clipping at ``grad_clip`` (``None``: none);
    * with ``mixed_precision`` and a CUDA model, the forward pass in bfloat16
      (autocast; the weights and the optimizer stay float32, and bfloat16 needs no
      loss scaling).

    Batches are drawn with ``generator``. Returns :func:`attnbook.train.fit`'s
    :class:`~attnbook.train.History` (loss in nats and gradient norm per step)."""
    _check_training(model, ids, steps, block_size, batch_size, lr, warmup)
    _check_training_options(min_lr, weight_decay, grad_clip, mixed_precision, progress)
    min_lr = lr / 10 if min_lr is None else min_lr
    device = next(model.parameters()).device
    windows = _Windows(ids.to(device), steps, block_size, batch_size, generator)

    def loss_fn(model, batch):
        x, y = batch
        with _autocast(device, mixed_precision):
            logits = model(x)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    def schedule(step: int) -> float:
        return warmup_cosine(step, warmup=warmup, total=steps, lr=lr, min_lr=min_lr)

    return fit(
        model,
        loss_fn,
        windows,
        optimizer=lm_optimizer(model, lr, weight_decay=weight_decay),
        grad_clip=grad_clip,
        lr_schedule=schedule,
        progress=progress,
    )


def _check_bits(model, ids, block_size, batch_size) -> None:
    fn = "bits_per_char"
    _check_model(fn, model)
    _check_ids(fn, "ids", ids, _vocab_size(model), "(N,)")
    if len(ids) < 2:
        raise ValueError(f"{fn}: ids must hold 2 or more ids, got {tuple(ids.shape)}")
    check_sizes(fn, block_size=block_size, batch_size=batch_size)


@torch.no_grad()
def bits_per_char(
    model: nn.Module, ids: torch.Tensor, block_size: int, *, batch_size: int = 64
) -> float:
    """The model's cross-entropy on every character of ``ids`` after the first, in bits
    per character: ``ids`` is cut into consecutive windows of ``block_size + 1``
    characters overlapping by one (the last one shorter), and each window predicts its
    characters 2 .. from the ones before them in the window. Deterministic: no sampling
    of windows. Comparable with :func:`attnbook.data.ngram_bits_per_char`."""
    _check_bits(model, ids, block_size, batch_size)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    starts = list(range(0, len(ids) - 1, block_size))
    full = [s for s in starts if s + block_size + 1 <= len(ids)]
    try:
        for k in range(0, len(full), batch_size):
            rows = torch.stack(
                [ids[s : s + block_size + 1] for s in full[k : k + batch_size]]
            )
            rows = rows.to(device)
            logits = model(rows[:, :-1])
            total += F.cross_entropy(
                logits.float().flatten(0, 1), rows[:, 1:].flatten(), reduction="sum"
            ).item()
            count += rows[:, 1:].numel()
        for s in starts[len(full) :]:  # the shorter last window
            row = ids[s:].to(device)[None]
            logits = model(row[:, :-1])
            total += F.cross_entropy(
                logits.float()[0], row[0, 1:], reduction="sum"
            ).item()
            count += row.shape[1] - 1
    finally:
        model.train(was_training)
    return total / count / math.log(2)


def _check_sample(model, vocab, prompt, n_chars, temperature, top_k) -> None:
    fn = "sample_text"
    _check_model(fn, model, TinyGPT)
    if not isinstance(vocab, Vocab):
        raise TypeError(f"{fn}: vocab must be a Vocab, got {type(vocab).__name__}")
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"{fn}: prompt must be a non-empty str, got {prompt!r}")
    unknown = sorted(set(prompt) - set(vocab.stoi))
    if unknown:
        raise ValueError(f"{fn}: prompt has characters not in vocab: {unknown}")
    check_int(fn, "n_chars", n_chars, minimum=0)
    check_real(fn, "temperature", temperature, minimum=0)
    if top_k is not None:
        check_sizes(fn, top_k=top_k)


@torch.no_grad()
def sample_text(
    model: TinyGPT,
    vocab: Vocab,
    prompt: str,
    n_chars: int,
    *,
    temperature: float = 0.8,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> str:
    """``prompt`` followed by the ``n_chars`` tokens the model writes
    (:meth:`attnbook.models.TinyGPT.generate` with a KV cache; ``temperature=0`` is
    greedy), each as its character: ``n_chars`` characters, unless the model picks a
    special id (which a model trained on text all but never does), written as its name
    such as ``<s>``."""
    _check_sample(model, vocab, prompt, n_chars, temperature, top_k)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    idx = torch.tensor([vocab.encode(prompt)], device=device)
    try:
        out = model.generate(
            idx, n_chars, temperature=temperature, top_k=top_k, generator=generator
        )
    finally:
        model.train(was_training)
    return "".join(vocab.itos[i] for i in out[0].tolist())


# --------------------------------------------------------------------------------------
# Reading the heads on real text
# --------------------------------------------------------------------------------------
_OPEN, _CLOSE = "([{", ")]}"


def text_patterns(text: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """For each behaviour a head of a character-level model might have, the query
    positions ``t`` where it is defined in ``text`` and the key ``k(t) <= t`` it points
    at: ``{name: (queries, keys)}``, two 1-D long tensors each.

    * ``"previous character"``: ``k = t - 1``, for every ``t >= 1``;
    * ``"start of word"``: for a letter ``t`` that is not the first of its word,
      ``k`` = the word's first letter (words are runs of letters);
    * ``"open bracket"``: for ``t`` inside brackets (after an unmatched ``(``, ``[``
      or ``{``, not on a bracket itself), ``k`` = the innermost open bracket;
    * ``"open quote"``: for ``t`` inside double quotes (after an odd number of ``"``,
      not on a quote itself), ``k`` = the opening quote;
    * ``"induction"``: for ``t`` whose pair ``text[t-1:t+1]`` occurred before, ending
      at ``j < t - 1`` (the latest such), ``k = j + 1``: the character that followed
      it, what a head that copies would read (Olsson et al., 2022)."""
    if not isinstance(text, str):
        raise TypeError(f"text_patterns: text must be a str, got {type(text).__name__}")
    queries: dict[str, list[int]] = {
        n: []
        for n in (
            "previous character",
            "start of word",
            "open bracket",
            "open quote",
            "induction",
        )
    }
    keys: dict[str, list[int]] = {n: [] for n in queries}

    def add(name: str, t: int, k: int) -> None:
        queries[name].append(t)
        keys[name].append(k)

    word_start, stack, quote, last_pair_end = None, [], None, {}
    for t, ch in enumerate(text):
        if t >= 1:
            add("previous character", t, t - 1)
        if ch.isalpha():
            if word_start is None:
                word_start = t
            else:
                add("start of word", t, word_start)
        else:
            word_start = None
        if ch in _CLOSE:
            if stack:
                stack.pop()
        elif ch in _OPEN:
            stack.append(t)
        elif stack:
            add("open bracket", t, stack[-1])
        if ch == '"':
            quote = t if quote is None else None
        elif quote is not None:
            add("open quote", t, quote)
        if t >= 3:  # the pairs ending at 1 .. t - 2 are known: add the one at t - 2
            last_pair_end[text[t - 3 : t - 1]] = t - 2
        j = last_pair_end.get(text[t - 1 : t + 1]) if t >= 1 else None
        if j is not None:  # j < t - 1 even where text[t-2:t] is the pair too (a run)
            add("induction", t, j + 1)
    return {
        name: (
            torch.tensor(queries[name], dtype=torch.long),
            torch.tensor(keys[name], dtype=torch.long),
        )
        for name in queries
    }


def _check_pattern_scores(weights, patterns) -> None:
    fn = "pattern_scores"
    check_float(fn, "weights", weights)
    if weights.dim() != 4 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(
            f"{fn}: weights must be (n_layers, n_heads, T, T), got "
            f"{tuple(weights.shape)}"
        )
    pairs = patterns.values() if isinstance(patterns, dict) else [None]
    if not all(
        isinstance(p, tuple)
        and len(p) == 2
        and all(isinstance(t, torch.Tensor) and t.dtype == torch.long for t in p)
        and p[0].shape == p[1].shape
        and p[0].dim() == 1
        and (len(p[0]) == 0 or (p[0].min() >= 0 and p[1].min() >= 0))
        and bool((p[1] <= p[0]).all())
        for p in pairs
    ):
        raise ValueError(
            f"{fn}: patterns must be {{name: (queries, keys)}}, two 1-D int64 tensors "
            "of one length with 0 <= keys <= queries (text_patterns' result)"
        )


def pattern_scores(
    weights: torch.Tensor, patterns: dict[str, tuple[torch.Tensor, torch.Tensor]]
) -> dict[str, tuple[torch.Tensor, float]]:
    """How much weight each head puts where each pattern points.

    ``weights``: ``(n_layers, n_heads, T, T)`` causal self-attention weights of one
    text (``TinyGPT(..., return_weights=True)`` at batch index 0); ``patterns``: from
    :func:`text_patterns` on the same ``T`` characters (or a longer text: queries
    past ``T`` are ignored). Returns ``{name: (scores, chance)}``: ``scores``
    ``(n_layers, n_heads)`` is the mean weight on ``k(t)`` over the pattern's queries,
    ``chance`` what a head that spreads its weight uniformly over the visible keys
    would score, the mean of ``1 / (t + 1)``; a pattern with no query is left out."""
    _check_pattern_scores(weights, patterns)
    T = weights.shape[-1]
    out = {}
    for name, (q, k) in patterns.items():
        keep = q < T
        q, k = q[keep], k[keep]
        if len(q) == 0:
            continue
        scores = weights[..., q, k].mean(-1)
        out[name] = (scores, (1.0 / (q.double() + 1)).mean().item())
    return out


# --------------------------------------------------------------------------------------
# The encoder-decoder on a string task
# --------------------------------------------------------------------------------------
def _check_seq2seq_batch(fn: str, model, batch) -> None:
    _check_model(fn, model, TinySeq2Seq)
    missing = (
        ["src", "tgt", "src_mask"]
        if not isinstance(batch, dict)
        else [key for key in ("src", "tgt", "src_mask") if key not in batch]
    )
    if missing:
        raise TypeError(
            f"{fn}: batch must be a dict with src, tgt and src_mask, missing {missing}"
        )
    _check_ids(fn, "batch['tgt']", batch["tgt"], model.config.vocab_size, "(B, T)")
    if batch["tgt"].shape[1] < 2:
        raise ValueError(
            f"{fn}: batch['tgt'] must have shape (B, T) with T >= 2 (BOS and a "
            f"target), got {tuple(batch['tgt'].shape)}"
        )


def seq2seq_loss(model: TinySeq2Seq, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Token cross-entropy with teacher forcing for a
    :class:`~attnbook.models.TinySeq2Seq` on a :class:`attnbook.data.Task` batch: the
    decoder reads ``tgt[:, :-1]`` (``BOS y_1 ...``) and predicts ``tgt[:, 1:]``;
    padding is ignored."""
    _check_seq2seq_batch("seq2seq_loss", model, batch)
    logits = model(batch["src"], batch["tgt"][:, :-1], batch["src_mask"])
    return F.cross_entropy(
        logits.flatten(0, 1), batch["tgt"][:, 1:].flatten(), ignore_index=PAD
    )


def _check_exact_match(model, task, pairs, batch_size) -> None:
    fn = "exact_match"
    _check_model(fn, model, TinySeq2Seq)
    if not isinstance(task, Task):
        raise TypeError(f"{fn}: task must be a Task, got {type(task).__name__}")
    if len(pairs) == 0:
        raise ValueError(f"{fn}: pairs is empty: no pair to score")
    check_sizes(fn, batch_size=batch_size)


@torch.no_grad()
def exact_match(
    model: TinySeq2Seq, task: Task, pairs=None, *, batch_size: int = 500
) -> float:
    """Fraction of ``pairs`` (default ``task.test``) whose greedy output
    (:meth:`~attnbook.models.TinySeq2Seq.generate`) equals the target string."""
    pairs = task.test if pairs is None else pairs
    _check_exact_match(model, task, pairs, batch_size)
    was_training = model.training
    model.eval()
    correct = 0
    try:
        for k in range(0, len(pairs), batch_size):
            chunk = pairs[k : k + batch_size]
            batch = task.encode(chunk)
            tokens = model.generate(
                batch["src"], batch["src_mask"], max_len=batch["tgt"].shape[1]
            )
            known = len(task.tgt_vocab)  # a shared vocabulary can hold more ids
            correct += sum(
                int(row.max()) < known and task.tgt_vocab.decode(row) == target
                for row, (_, target) in zip(tokens, chunk)
            )
    finally:
        model.train(was_training)
    return correct / len(pairs)


# --------------------------------------------------------------------------------------
# Induction heads on repeated random tokens
# --------------------------------------------------------------------------------------
def _check_repeats(model, tokens, period) -> None:
    fn = "repeat_losses"
    _check_model(fn, model)
    check_int(fn, "period", period, minimum=2)
    _check_ids(fn, "tokens", tokens, _vocab_size(model), "(B, 2 period)")
    if tokens.shape[1] != 2 * period:
        raise ValueError(
            f"{fn}: tokens must have shape (B, 2 period) = (B, {2 * period}), got "
            f"{tuple(tokens.shape)}"
        )


def repeat_losses(
    model: nn.Module, tokens: torch.Tensor, period: int, head_mask=None
) -> tuple[float, float]:
    """The next-token loss (nats) of ``model`` on ``tokens`` ``(B, 2 period)`` from
    :func:`attnbook.data.repeated_tokens`, split into the first half (random: nothing
    to learn beyond ``ln V``) and the repeated half (predictable by copying). Targets
    ``1 .. period - 1`` are the first half, ``period .. 2 period - 1`` the second."""
    _check_repeats(model, tokens, period)
    logits = model(tokens[:, :-1], head_mask=head_mask)
    losses = F.cross_entropy(
        logits.float().transpose(1, 2), tokens[:, 1:], reduction="none"
    )
    first, second = losses[:, : period - 1], losses[:, period - 1 :]
    return first.mean().item(), second.mean().item()


def _check_train_on_repeats(model, steps, batch_size, periods, lr, eval_every):
    fn = "train_on_repeats"
    _check_optimizer(fn, model, lr, 0.0)
    check_sizes(fn, steps=steps, batch_size=batch_size, eval_every=eval_every)
    if steps % eval_every:
        raise ValueError(
            f"{fn}: steps={steps} must be a multiple of eval_every={eval_every}"
        )
    if (
        not isinstance(periods, (tuple, list))
        or len(periods) != 2
        or not all(isinstance(p, int) and not isinstance(p, bool) for p in periods)
        or not 2 <= periods[0] <= periods[1]
    ):
        raise ValueError(
            f"{fn}: periods must be two integers 2 <= low <= high, got {periods!r}"
        )


def _check_eval_tokens(model, eval_tokens) -> None:
    fn = "train_on_repeats"
    _check_ids(fn, "eval_tokens", eval_tokens, _vocab_size(model), "(B, 2 period)")
    if eval_tokens.shape[1] % 2 or eval_tokens.shape[1] < 4:
        raise ValueError(
            f"{fn}: eval_tokens must have shape (B, 2 period) with period >= 2, got "
            f"{tuple(eval_tokens.shape)}"
        )


def train_on_repeats(
    model: TinyGPT,
    *,
    steps: int,
    batch_size: int,
    periods: tuple[int, int],
    lr: float,
    eval_every: int,
    eval_tokens: torch.Tensor,
    generator: torch.Generator | None = None,
    progress: bool = True,
) -> dict[str, list[float]]:
    """Train ``model`` on :func:`attnbook.data.repeated_tokens` with a period drawn
    for every batch uniformly from ``periods = (low, high)`` (a period that changes is
    what makes a previous-token head necessary: with a fixed one, position alone finds
    the token to copy), AdamW at a constant ``lr``.

    Every ``eval_every`` steps, the losses of :func:`repeat_losses` on the held-out
    ``eval_tokens`` ``(B, 2 p)``. Returns ``{"step", "first_half",
    "repeated_half"}``: the curves in which the phase change shows."""
    _check_train_on_repeats(model, steps, batch_size, periods, lr, eval_every)
    _check_eval_tokens(model, eval_tokens)
    low, high = periods
    vocab = model.config.vocab_size
    period = eval_tokens.shape[1] // 2
    curves = {"step": [], "first_half": [], "repeated_half": []}

    def batches():
        for _ in range(eval_every):
            p = int(torch.randint(low, high + 1, (1,), generator=generator))
            yield repeated_tokens(batch_size, p, vocab, generator=generator)

    def loss_fn(model, tokens):
        logits = model(tokens[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())

    def evaluate(model):
        first, second = repeat_losses(model, eval_tokens, period)
        curves["step"].append(len(curves["step"]) * eval_every + eval_every)
        curves["first_half"].append(first)
        curves["repeated_half"].append(second)
        return {"repeated_half": second}

    fit(
        model,
        loss_fn,
        batches,
        epochs=steps // eval_every,
        optimizer=torch.optim.AdamW(model.parameters(), lr=lr),
        eval_fn=evaluate,
        progress=progress,
    )
    return curves
