"""Generation: how a trained decoder writes text, one token at a time, fast.

:func:`generate` appends tokens to a prompt, greedily or by sampling (top-k, a
temperature, the caller's ``generator``), for prompts of one length or left-padded ones
of different lengths. Without a cache every step reruns the whole prefix. With one, the
prompt runs once (prefill) and every later step feeds one token (decode); the decode hot
path is the idea of gpt-fast: a :class:`attnbook.kvcache.StaticKVCache`, the output
tokens, the positions and the mask are allocated once and written in place, so every
one-token step has the same shapes, and ``compile=True`` runs it through
``torch.compile`` (with CUDA graphs on a GPU). Multi-head latent attention decodes with
its latent cache (:class:`attnbook.serving.LatentKVCache`) through the model's general
forward pass. :meth:`attnbook.models.TinyGPT.generate` is this function.

The model is any decoder laid out as :class:`attnbook.models.TinyGPT` is (a ``config``,
``tok_emb``, ``blocks``, ``ln_f``, ``head`` and ``make_cache``): this module reads those
attributes and never imports the models, so the models can hand their ``generate`` to
it. :func:`generating` is the mode a model runs in for a call: eval mode, its previous
modes restored afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import weakref

import torch
from torch import nn
from torch.nn import functional as F

from ._random import multinomial
from .contract import check_flag, check_key_padding_mask, check_sizes
from .layers import HeadShell
from .positional import alibi_bias, sinusoidal_encoding

__all__ = ["generate", "generating"]


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_model(fn: str, model):
    """``model`` an ``nn.Module`` with a config that names its vocabulary; returns the
    config."""
    config = getattr(model, "config", None)
    if not isinstance(model, nn.Module) or not hasattr(config, "vocab_size"):
        raise TypeError(
            f"{fn}: model must be a decoder with a config (a TinyGPT), got "
            f"{type(model).__name__}"
        )
    return config


def _check_prompt(fn: str, idx, vocab_size: int) -> None:
    """Token ids: an int64 or int32 ``(batch, seq)`` tensor, ``seq >= 1``, every id in
    ``[0, vocab_size)``."""
    if not isinstance(idx, torch.Tensor) or idx.dtype not in (torch.long, torch.int):
        raise TypeError(
            f"{fn}: idx must be an int64 (or int32) tensor of token ids, got "
            f"{getattr(idx, 'dtype', type(idx).__name__)}"
        )
    if idx.dim() != 2 or idx.shape[1] < 1:
        raise ValueError(
            f"{fn}: idx must have shape (batch, seq) with seq >= 1, got "
            f"{tuple(idx.shape)}"
        )
    if idx.numel():
        low, high = torch.stack(idx.aminmax()).tolist()
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"{fn}: idx holds token ids in [{low}, {high}], outside the "
                f"vocabulary [0, {vocab_size}) of vocab_size={vocab_size}"
            )


@torch.no_grad()
def generate(
    model: nn.Module,
    idx: torch.Tensor,
    max_new_tokens: int,
    use_cache: bool = True,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    *,
    key_padding_mask: torch.Tensor | None = None,
    compile: bool = False,
) -> torch.Tensor:
    """Append ``max_new_tokens`` tokens to ``idx`` ``(B, T0)``; returns ``(B, T0 +
    max_new_tokens)``.

    ``temperature == 0``: greedy (argmax). Otherwise sample from ``softmax(logits /
    temperature)``, restricted to the ``top_k`` largest logits when given, with
    ``generator``; computed in float32 at least (as
    :func:`attnbook.serving.sampling_probs`), so a half-precision model samples
    right down to the lowest temperature.

    ``use_cache=False`` recomputes the whole prefix at every step (``O(t^2)``
    attention work per sequence of ``t`` tokens); ``use_cache=True`` runs the prompt
    once (prefill) and then one token per step (decode) against a
    :class:`attnbook.kvcache.StaticKVCache` (a latent cache for MLA): the cache,
    the output tokens, the positions and the mask are allocated once for the whole
    length and written in place, so every decode step has the same shapes. Both
    give the same tokens. ``compile=True`` runs that one-token step through
    ``torch.compile(fullgraph=True)`` (on CUDA with CUDA graphs,
    ``mode="reduce-overhead"``): compiled once per model class and shapes, on the
    first call (seconds to tens of seconds: time it), and reused by later calls
    with the same batch, length and dtype; same tokens as eager (MHA only).

    Prompts of different lengths: left-pad them to one length and give
    ``key_padding_mask`` bool ``(B, T0)``, True at the padding, which must come
    first in each row (at least one real token per row). Padding is no position and
    no key, so row ``b`` of the output, without its padding, equals generating
    ``idx[b]``'s real tokens alone (MLA: up to the rounding of its rotary angles).

    The ``learned`` scheme has no row beyond ``max_len``: without a cache the
    context is cropped to the last ``max_len`` tokens (nanoGPT's rule), which moves
    every token to a new position, so each step recomputes everything; with a
    cache that is impossible and going past ``max_len`` raises ``ValueError``.

    The model runs in eval mode for the call (dropout off, so both ways give the
    same tokens; a KV cache would otherwise see other dropout masks than the full
    recomputation) and every submodule gets its previous mode back afterwards:
    generating in the middle of training leaves the model training. ``idx`` must
    hold ids in ``[0, vocab_size)``; ``top_k`` is ``None`` or a positive integer
    (values above ``vocab_size`` keep every token); an empty batch returns ``(0,
    T0 + max_new_tokens)``.
    """
    use_cache, compile = _check_generate(
        model, idx, max_new_tokens, use_cache, temperature, top_k,
        key_padding_mask, compile,
    )  # fmt: skip
    (B, T0), total = idx.shape, idx.shape[1] + max_new_tokens
    tokens = idx.new_empty(B, total)  # the output, written in place
    tokens[:, :T0] = idx
    if B == 0 or max_new_tokens == 0:
        return tokens
    padding = key_padding_mask  # (B, total): the new tokens are never padding
    if padding is not None:
        padding = F.pad(padding.to(idx.device), (0, max_new_tokens), value=False)
    choose = functools.partial(
        _next_token, temperature=temperature, top_k=top_k, generator=generator
    )
    with generating(model):  # eval mode for the call, the old modes restored
        if not use_cache:
            _generate_uncached(model, tokens, T0, padding, choose)
        elif model.config.attention == "mla":
            _generate_latent(model, tokens, T0, padding, choose)
        else:
            with _fused_projections(model):
                _generate_static(model, tokens, T0, padding, choose, compile)
    return tokens

def _generate_uncached(model, tokens, T0, padding, choose) -> None:
    """Every step runs the whole prefix (cropped to ``max_len`` for ``learned``)."""
    crop = model.config.max_len if model.config.positional == "learned" else None
    for t in range(T0, tokens.shape[1]):
        first = 0 if crop is None else max(0, t - crop)
        mask = None if padding is None else padding[:, first:t]
        logits = model(tokens[:, first:t], key_padding_mask=mask)[:, -1]
        tokens[:, t : t + 1] = choose(logits)

def _generate_latent(model, tokens, T0, padding, choose) -> None:
    """MLA: the general forward with a latent cache, one token a step."""
    cache = model.make_cache(tokens.shape[0], tokens.shape[1] - 1)
    new = tokens[:, :T0]
    for t in range(T0, tokens.shape[1]):
        mask = None if padding is None else padding[:, :t]
        logits = model(new, cache=cache, key_padding_mask=mask)[:, -1]
        tokens[:, t : t + 1] = new = choose(logits)

def _generate_static(model, tokens, T0, padding, choose, compile) -> None:
    """The decode hot path. Everything a step needs is built once here: the cache
    (:class:`attnbook.kvcache.StaticKVCache`), the positions of every slot (real
    tokens only, under padding), an additive mask over the full length and the
    table of absolute encodings or biases; the loop then only updates them in
    place. Each step attends to the live slots only, the first ``t + 1`` (a view
    of the mask, so the attention reads ``t + 1`` keys, not ``max_len``), except
    under CUDA graphs, which replay one shape: there every step reads them all."""
    B, total = tokens.shape
    # slots for every token but the last, which is returned, never fed back, plus
    # one spare: no step then attends to the whole buffer, a case of its own for
    # the compiler (a slice to the full length would be compiled again)
    S = total
    cache, step, every_slot = _decode_setup(model, B, S, compile)
    real = None if padding is None else ~padding[:, :S]
    if real is None:
        positions = torch.arange(S, device=tokens.device).expand(B, S)
    else:
        positions = (real.cumsum(-1) - 1).clamp_min(0)
    table = _decode_table(model, S)
    if compile and not every_slot:  # one graph for every length: S is a symbol
        for tensor in (*cache.k, *cache.v, table):
            _dynamic_length(tensor, S)
    dtype = model.tok_emb.weight.dtype
    cache.seek(0, T0)  # prefill: the prompt in one pass, eager
    mask = _additive(cache.mask(real), dtype)[..., :T0]
    logits = _decode_step(model, tokens[:, :T0], cache, positions[:, :T0], mask, table)
    tokens[:, T0 : T0 + 1] = choose(logits)
    if total - 1 == T0:  # one new token: the prefill gave it
        return
    cache.seek(T0, 1)
    full = _additive(cache.mask(real), dtype)  # (B or 1, 1, 1, S): 0 or -inf
    contiguous = torch.contiguous_format  # the same strides at every call
    position = positions[:, T0 : T0 + 1].clone(memory_format=contiguous)
    new = tokens[:, T0 : T0 + 1].clone(memory_format=contiguous)  # fed back
    for t in range(T0, total - 1):  # feed token t (slot t), choose token t + 1
        if t > T0:  # the next slot, position and key: updated in place
            cache.advance()
            position.add_(1)
            full.index_fill_(-1, cache.slots, 0.0)
        mask = full if every_slot else full[..., : t + 1]
        if compile and not every_slot:  # one graph for every length t + 1
            mask = mask.clone(memory_format=contiguous)  # not a view of S slots
            torch._dynamo.mark_dynamic(mask, mask.dim() - 1)  # (not -1: ignored)
        new = choose(step(model, new, cache, position, mask, table))
        tokens[:, t + 1 : t + 2] = new

def _decode_table(model, S: int) -> torch.Tensor | None:
    """What a step looks up by slot or position, built once per generation: the
    absolute encodings ``(S, d_model)``, or the t5/alibi bias ``(1, n_heads, S,
    S)`` (causal, over slots), or ``None`` (rope, none)."""
    scheme, weight = model.config.positional, model.tok_emb.weight
    if scheme == "sinusoidal":
        d_model = model.config.d_model
        return sinusoidal_encoding(S, d_model, dtype=weight.dtype).to(weight.device)
    if scheme == "learned":
        return model.pos_emb.weight
    if scheme == "t5":
        return model.rel_bias(S, S).to(weight)
    if scheme == "alibi":
        return alibi_bias(model.config.n_heads, S, S).to(weight)
    return None

def _decode_step(model, idx, cache, positions, mask, table) -> torch.Tensor:
    """One forward pass of the hot path: ``idx`` ``(B, T)`` written at
    ``cache.slots``, ``positions`` ``(B, T)``, ``mask`` additive (0 or -inf) ``(B
    or 1, 1, T, n)`` over the first ``n`` slots, ``table`` from
    ``_decode_table`` -> the logits of the last position ``(B, vocab_size)``.
    No host synchronization, and no shape but ``n`` changes: compilable whole."""
    x, scheme, bias = model.tok_emb(idx), model.config.positional, mask
    if scheme in ("sinusoidal", "learned"):
        x = x + table[positions]
    elif scheme in ("t5", "alibi"):  # the bias rows of the query slots
        bias = table[:, :, cache.slots, : mask.shape[-1]] + mask
    rope = positions if scheme == "rope" else None
    for block in model.blocks:
        x = block(x, bias, cache, positions=rope)
    return model.head(model.ln_f(x[:, -1]))


_FUSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def _fused_projections(model: nn.Module):
    """For one generation: each attention layer's query, key and value projections
    (:class:`attnbook.layers.HeadShell`) stacked into one matrix, which
    :class:`attnbook.models.Attention` reads, so a step runs one matrix-vector
    product per layer instead of three (fewer launches, one longer read). Built from
    the parameters at the start of the call and removed at its end: the parameters
    stay the truth."""
    layers = [m for m in model.modules() if isinstance(m, HeadShell)]
    for attn in layers:
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        weight = torch.cat([p.weight for p in projections])
        biases = [p.bias for p in projections]
        bias = None if biases[0] is None else torch.cat(biases)
        held = _FUSED.get(attn)  # the same tensors every call: a compiled step's input
        if (
            held is None
            or held[0].shape != weight.shape
            or held[0].dtype != weight.dtype
            or held[0].device != weight.device  # moved since the last call
        ):
            held = _FUSED[attn] = (weight, bias)
        else:
            held[0].copy_(weight)
            if bias is not None:
                held[1].copy_(bias)
        attn._qkv = held
    try:
        yield
    finally:
        for attn in layers:
            del attn._qkv


@contextlib.contextmanager
def generating(model: nn.Module):
    """For one ``generate`` call: every submodule in eval mode (no dropout, so cached
    and uncached decoding agree), and no vocabulary check on the tokens the model
    writes itself. Each submodule's mode is restored afterwards."""
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"generating: model must be an nn.Module, got {type(model).__name__}"
        )
    modes = [(module, module.training) for module in model.modules()]
    trusted = model.__dict__.get("_ids_trusted", False)
    model.eval()
    model._ids_trusted = True
    try:
        yield
    finally:
        model._ids_trusted = trusted
        for module, mode in modes:
            module.training = mode


def _check_generate(
    model, idx, max_new_tokens, use_cache, temperature, top_k, padding, compile
) -> tuple[bool, bool]:
    fn = f"{type(model).__name__}.generate"
    cfg = _check_model(fn, model)
    _check_prompt(fn, idx, cfg.vocab_size)
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, numbers.Integral)
        or max_new_tokens < 0
    ):
        raise ValueError(
            f"{fn}: max_new_tokens must be a non-negative integer, got "
            f"{max_new_tokens!r}"
        )
    use_cache = check_flag(fn, "use_cache", use_cache)
    compile = check_flag(fn, "compile", compile)
    if not _is_real(temperature) or not 0.0 <= temperature < math.inf:
        raise ValueError(
            f"{fn}: temperature must be a finite number >= 0 (0: greedy), got "
            f"{temperature!r}"
        )
    if top_k is not None:
        check_sizes(fn, top_k=top_k)
    if padding is not None:
        check_key_padding_mask(fn, padding, *idx.shape)
        starts = padding.long().diff(dim=-1) if idx.shape[1] > 1 else None
        if padding[:, -1].any() or (starts is not None and (starts > 0).any()):
            raise ValueError(
                f"{fn}: key_padding_mask must be left padding (True only before the "
                "first real token of each row) with a real last token, got "
                f"{padding.int().tolist()[:4]}"
            )
    if compile and (not use_cache or cfg.attention == "mla"):
        raise ValueError(
            f"{fn}: compile=True compiles the cached decode step of attention='mha'; "
            f"got use_cache={use_cache}, attention={cfg.attention!r}"
        )
    total = idx.shape[1] + max_new_tokens
    if use_cache and cfg.positional == "learned" and total - 1 > cfg.max_len:
        raise ValueError(
            f"{fn}: a cached learned-position model cannot go past "
            f"max_len={cfg.max_len} positions "
            f"(prompt {idx.shape[1]} + {max_new_tokens} new tokens): use "
            "use_cache=False, which crops"
        )
    return use_cache, compile


#: The compiled decode steps, one per model class and compile mode, and the static
#: caches per model, batch, length, dtype and device, reused across generate calls:
#: the buffers keep their addresses (CUDA graphs replay on them) and the compiled graph
#: its shapes, so only the first call pays for compiling.
_COMPILED_STEPS: dict = {}
_STATIC_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _decode_setup(model, B: int, S: int, compile: bool):
    """``(cache, step, every_slot)`` of one generation: the static cache, eager
    ``_decode_step`` or its compiled form (compiled on first use), and whether each
    step must attend to all ``S`` slots (CUDA graphs replay one shape) rather than
    the live ones (on CPU the compiled step takes the length as a dynamic size)."""
    weight = model.tok_emb.weight
    if not compile:
        return model.make_cache(B, S, static=True), _decode_step, False
    key = (B, S, weight.dtype, weight.device)
    caches = _STATIC_CACHES.setdefault(model, {})
    if key not in caches:
        caches[key] = cache = model.make_cache(B, S, static=True)
        if weight.is_cuda:  # CUDA graphs may mutate only buffers at fixed addresses
            for buffer in cache.k + cache.v + (cache.slots,):
                torch._dynamo.mark_static_address(buffer)
    cache = caches[key]
    for buffer in cache.k + cache.v:
        buffer.zero_()
    mode = "reduce-overhead" if weight.is_cuda else None
    step_key = (type(model), mode)
    if step_key not in _COMPILED_STEPS:
        # CUDA replays the step as a CUDA graph. On a CPU the graph's wrapper is C++
        # too (cpp_wrapper: the Python that calls its kernels cost about a tenth of a
        # step), and a one-row matrix product becomes a multiply and a sum that inductor
        # fuses into its own kernel on every thread (decompose_mm_pass), where the
        # library's matrix-vector product ran on one core: the step streams its weights
        # from memory, and two cores draw more bandwidth than one
        cpu = {
            "cpp_wrapper": True,
            "post_grad_fusion_options": {"decompose_mm_pass": {}},
        }
        how = {"mode": mode} if mode else {"options": cpu}
        _COMPILED_STEPS[step_key] = torch.compile(  # one graph per model and dtype
            _decode_step, fullgraph=True, **how
        )
    return cache, _COMPILED_STEPS[step_key], weight.is_cuda


def _dynamic_length(tensor: torch.Tensor | None, S: int) -> None:
    """Mark every dimension of size ``S`` of ``tensor`` (not a parameter) dynamic, so
    the compiled step serves every generation length with one graph."""
    if tensor is None or isinstance(tensor, nn.Parameter):
        return
    for dim, size in enumerate(tensor.shape):
        if size == S:
            torch._dynamo.mark_dynamic(tensor, dim)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool mask (True = may attend) -> additive, 0 or -inf, in ``dtype``: attention
    adds it as it is, where a bool mask is converted again by every call."""
    additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return additive.masked_fill_(~mask, float("-inf"))


def _next_token(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """``(B, vocab)`` logits -> ``(B, 1)`` token ids: argmax at temperature 0, else a
    (top-k) sample."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    # float32 at least, less the maximum: float16 logits / 1e-4 overflow to inf (NaN)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    logits = (logits - logits.amax(-1, keepdim=True)) / temperature
    return multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
