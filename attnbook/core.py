"""Attention fundamentals: scores, masks, scaled dot-product and multi-head attention.

Papers: Bahdanau, Cho & Bengio (2015) for additive scores; Luong, Pham & Manning (2015)
for the dot and "general" scores; Vaswani et al. (2017) for scaled dot-product and
multi-head attention; Shazeer (2019) for multi-query and Ainslie et al. (2023) for
grouped-query attention; Xu et al. (2015) for hard vs soft attention.

Shapes, masks and flags follow :mod:`attnbook.contract`, which follows
``torch.nn.functional.scaled_dot_product_attention``: queries ``(..., L, E)``, keys
``(..., S, E)``, values ``(..., S, Ev)``; masks broadcast to ``(..., L, S)`` and are
either boolean (True = "may attend") or additive floats. One deliberate difference from
PyTorch: causal masks are aligned **bottom-right** when ``L != S`` (query ``i`` sees
keys ``j <= i + S - L``), which is what decoding with a KV cache needs. A query row
whose keys are all masked returns zeros (and zero weights), never NaN, as PyTorch's own
function does too (``tests/properties/test_api.py`` checks both).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ._random import multinomial, uniform
from .contract import (
    attention_mask,
    check_attn_mask,
    check_dropout,
    check_flag,
    check_float,
    check_indices,
    check_int,
    check_qkv,
    check_real,
    check_sizes,
    grouped_kv,
)
from .layers import HeadShell
from .masks import causal, dense, padding

__all__ = [
    "causal_mask",
    "padding_mask",
    "dot_score",
    "scaled_dot_score",
    "general_score",
    "additive_score",
    "masked_softmax",
    "attention_entropy",
    "scaled_dot_product_attention",
    "hard_attention_weights",
    "hard_attention",
    "MultiHeadAttention",
]


# --------------------------------------------------------------------------------------
# Masks
# --------------------------------------------------------------------------------------
def causal_mask(
    L: int, S: int | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """Boolean causal mask of shape ``(L, S)``, True where query ``i`` may attend to key
    ``j``.

    Aligned bottom-right: ``mask[i, j] = j <= i + (S - L)``. With ``S == L`` this is the
    usual lower triangle; with ``S > L`` (new queries appended after a cache of ``S -
    L`` keys) the last query sees every key. The dense form of the predicate
    :func:`attnbook.masks.causal`.
    """
    L = check_int("causal_mask", "L", L, minimum=0)
    S = L if S is None else check_int("causal_mask", "S", S, minimum=0)
    return dense(causal(L, S), L, S, device=device)[0, 0]


def _check_padding_mask(lengths, max_len) -> tuple[torch.Tensor, int]:
    fn = "padding_mask"
    lengths = check_indices(fn, "lengths", lengths)  # 1-D, ints >= 0
    longest = int(lengths.max()) if lengths.numel() else 0
    if max_len is None:
        return lengths, longest
    max_len = check_int(fn, "max_len", max_len, minimum=0)
    if max_len < longest:
        raise ValueError(
            f"{fn}: max_len={max_len} is shorter than the longest length {longest}"
        )
    return lengths, max_len


def padding_mask(
    lengths: torch.Tensor | list[int], max_len: int | None = None
) -> torch.Tensor:
    """Boolean key-padding mask of shape ``(batch, max_len)``: True on the first
    ``lengths[b]`` positions.

    For attention, broadcast it over heads and queries: ``padding_mask(lengths)[:, None,
    None, :]``. The dense form of the predicate :func:`attnbook.masks.padding`.
    """
    lengths, max_len = _check_padding_mask(lengths, max_len)
    B = len(lengths)
    return dense(padding(lengths), 1, max_len, B=B, device=lengths.device)[:, 0, 0]


# --------------------------------------------------------------------------------------
# Alignment scores e(q, k): (..., L, E) x (..., S, E) -> (..., L, S)
# --------------------------------------------------------------------------------------
def _check_scores(fn: str, q, k, *, same_dim: bool = True, scale=None) -> None:
    """Float tensors ``q (..., L, E)`` and ``k (..., S, E)`` (``E`` shared when
    ``same_dim``), and ``scale`` None or finite."""
    for name, t in (("q", q), ("k", k)):
        check_float(fn, name, t)
        if t.dim() < 2:
            raise ValueError(
                f"{fn}: {name} must have shape (..., seq, dim), got {tuple(t.shape)}"
            )
    if same_dim and q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"{fn}: q and k must share the last dimension, got q {tuple(q.shape)} "
            f"and k {tuple(k.shape)}"
        )
    if scale is not None:
        check_real(fn, "scale", scale)


def _check_default_scale(fn: str, q, scale) -> None:
    """The default ``1 / sqrt(E)`` is undefined for ``E = 0``: say so (not 1 / 0)."""
    if scale is None and q.shape[-1] == 0:
        raise ValueError(
            f"{fn}: q has head dim 0, so the default scale 1/sqrt(E) is undefined: "
            f"pass scale= (q {tuple(q.shape)})"
        )


def dot_score(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Luong's dot score ``e_ij = q_i . k_j``. Shapes ``(..., L, E)``, ``(..., S, E)``
    -> ``(..., L, S)``."""
    _check_scores("dot_score", q, k)
    return q @ k.transpose(-2, -1)


def scaled_dot_score(
    q: torch.Tensor, k: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """Transformer score ``e_ij = q_i . k_j / sqrt(E)`` (or ``* scale`` when given)."""
    _check_scores("scaled_dot_score", q, k, scale=scale)
    _check_default_scale("scaled_dot_score", q, scale)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    # scaling q (L x E) is cheaper than scaling the L x S scores
    return dot_score(q * scale, k)


def general_score(q: torch.Tensor, k: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Luong's "general" (bilinear) score ``e_ij = q_i^T W k_j`` with ``W`` of shape
    ``(Eq, Ek)``.

    Unlike the dot score, queries and keys may have different sizes ``Eq`` and ``Ek``.
    """
    _check_scores("general_score", q, k, same_dim=False)
    check_float("general_score", "W", W)
    if W.dim() != 2 or W.shape != (q.shape[-1], k.shape[-1]):
        raise ValueError(
            f"general_score: W must have shape (Eq, Ek) = ({q.shape[-1]}, "
            f"{k.shape[-1]}) for q "
            f"{tuple(q.shape)} "
            f"and k {tuple(k.shape)}, got {tuple(W.shape)}"
        )
    return (q @ W) @ k.transpose(-2, -1)


def _check_additive_score(q, k, W_q, W_k, v) -> None:
    fn = "additive_score"
    _check_scores(fn, q, k, same_dim=False)
    for name, t in (("W_q", W_q), ("W_k", W_k), ("v", v)):
        check_float(fn, name, t)
    if W_q.dim() != 2 or W_q.shape[1] != q.shape[-1]:
        raise ValueError(
            f"{fn}: W_q must have shape (H, Eq={q.shape[-1]}), got {tuple(W_q.shape)}"
        )
    if W_k.dim() != 2 or W_k.shape != (W_q.shape[0], k.shape[-1]):
        raise ValueError(
            f"{fn}: W_k must have shape (H={W_q.shape[0]}, Ek={k.shape[-1]}), got "
            f"{tuple(W_k.shape)}"
        )
    if v.shape != (W_q.shape[0],):
        raise ValueError(
            f"{fn}: v must have shape (H,) = ({W_q.shape[0]},), got {tuple(v.shape)}"
        )


def additive_score(
    q: torch.Tensor,
    k: torch.Tensor,
    W_q: torch.Tensor,
    W_k: torch.Tensor,
    v: torch.Tensor,
) -> torch.Tensor:
    """Bahdanau's additive (concat) score ``e_ij = v^T tanh(W_q q_i + W_k k_j)``.

    ``W_q``: ``(H, Eq)``, ``W_k``: ``(H, Ek)``, ``v``: ``(H,)``. It builds an ``(..., L,
    S, H)`` intermediate, which is why it costs more memory than a dot product.
    """
    _check_additive_score(q, k, W_q, W_k, v)
    # (..., L, S, H)
    hidden = torch.tanh((q @ W_q.T).unsqueeze(-2) + (k @ W_k.T).unsqueeze(-3))
    return hidden @ v


# --------------------------------------------------------------------------------------
# Normalization and scaled dot-product attention
# --------------------------------------------------------------------------------------
def _check_masked_softmax(scores, attn_mask, temperature) -> None:
    fn = "masked_softmax"
    check_float(fn, "scores", scores)
    check_real(fn, "temperature", temperature, above=0)
    if attn_mask is not None:
        check_attn_mask(fn, attn_mask, tuple(scores.shape))


def masked_softmax(
    scores: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Softmax over the last dimension of ``scores / temperature``, ignoring masked
    keys.

    ``attn_mask`` is bool (True = keep) or additive float. Rows with every key masked
    give zeros. Low temperatures sharpen the distribution towards argmax, high ones
    flatten it towards uniform.
    """
    _check_masked_softmax(scores, attn_mask, temperature)
    scores = scores / temperature
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.to(scores.dtype)  # as SDPA: q's dtype
    if attn_mask is None:
        return torch.softmax(scores, dim=-1)
    # rows with nothing to attend to
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True)
    if not dead.any():  # the common case: no extra L x S copies
        return torch.softmax(scores, dim=-1)
    weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1)
    return weights.masked_fill(dead, 0.0)


def attention_entropy(
    weights: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    *,
    normalize: bool = False,
) -> torch.Tensor:
    r"""Entropy in nats of each row of attention weights, over the keys it may see.

    .. math:: H(\alpha_i) = -\sum_{j \in \mathcal{A}_i} \alpha_{ij} \log
        \alpha_{ij}, \qquad 0 \log 0 = 0,

    where :math:`\mathcal{A}_i` are the keys allowed to query ``i`` by ``attn_mask``
    (bool, True = may attend, or additive float, ``-inf`` = masked; broadcastable to
    ``weights``). ``weights``: ``(..., S)`` rows that sum to 1 (or 0 for a dead row);
    returns ``(...)``. ``H = 0`` for a one-hot row and ``H = log S`` for a uniform row
    over ``S`` allowed keys. With ``normalize=True`` each row is divided by ``log
    |A_i|``, its largest possible value, so rows with different numbers of keys (a
    causal mask) compare on one scale from 0 (one key) to 1 (uniform); rows with fewer
    than two keys give 0.

    Low entropy means a head looks at a few keys, high entropy that it averages many;
    a penalty ``lambda * H`` in the loss pushes heads one way or the other.
    """
    check_float("attention_entropy", "weights", weights)
    normalize = check_flag("attention_entropy", "normalize", normalize)
    # 0 log 0 = 0, with a finite gradient at 0 (xlogy's is -inf), so that the entropy
    # can be a training penalty under a mask
    tiny = torch.finfo(weights.dtype).tiny
    plogp = torch.where(weights > 0, weights * weights.clamp_min(tiny).log(), 0.0)
    allowed = None
    if attn_mask is not None:
        check_attn_mask("attention_entropy", attn_mask, tuple(weights.shape))
        allowed = attn_mask if attn_mask.dtype == torch.bool else ~attn_mask.isneginf()
        plogp = plogp.masked_fill(~allowed, 0.0)
    entropy = -plogp.sum(-1)
    if not normalize:
        return entropy
    if allowed is None:
        n_keys = torch.full_like(entropy, weights.shape[-1])
    else:
        n_keys = allowed.expand(weights.shape).sum(-1).to(entropy)
    log_n = torch.log(n_keys)
    return torch.where(n_keys > 1, entropy / log_n.clamp_min(1e-12), 0.0)


def _check_sdpa(q, k, v, is_causal, scale, dropout_p, return_weights, gqa) -> None:
    fn = "scaled_dot_product_attention"
    for name, flag in (
        ("is_causal", is_causal),
        ("return_weights", return_weights),
        ("enable_gqa", gqa),
    ):
        check_flag(fn, name, flag)
    check_qkv(fn, q, k, v, gqa=bool(gqa))
    _check_default_scale(fn, q, scale)
    check_real(fn, "dropout_p", dropout_p)
    check_dropout(fn, dropout_p)
    if scale is not None:
        check_real(fn, "scale", scale)


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    enable_gqa: bool = False,
    generator: torch.Generator | None = None,
):
    r"""``softmax(q k^T * scale + mask) v``, written out step by step.

    .. math::

        \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{Q
        K^\top}{\sqrt{d_k}} + M\right) V

    Args:
        q: ``(..., L, E)`` queries. k: ``(..., S, E)`` keys. v: ``(..., S, Ev)`` values.
        attn_mask: bool (True = may attend) or additive float, broadcastable to
            ``(..., L, S)``.
        is_causal: add a bottom-right aligned causal mask (see :func:`causal_mask`).
        scale: multiplies the scores; default ``1 / sqrt(E)``.
        dropout_p: attention dropout on the weights (inverted dropout, like PyTorch).
        return_weights: also return the ``(..., L, S)`` weights that were applied
            (after dropout).
        enable_gqa: allow fewer key/value heads than query heads (grouped-query
            attention): query head ``h`` reads key/value head ``h // (Hq // Hk)``.
        generator: random generator for the dropout mask.

    The arguments follow :mod:`attnbook.contract`. Returns ``(..., L, Ev)``, or ``(out,
    weights)`` with ``return_weights=True``.
    """
    _check_sdpa(q, k, v, is_causal, scale, dropout_p, return_weights, enable_gqa)
    fn = "scaled_dot_product_attention"
    k, v = grouped_kv(q, k, v)  # each K/V head serves a group of query heads
    attn_mask = attention_mask(fn, q, k, attn_mask, is_causal=is_causal)
    scores = scaled_dot_score(q, k, scale)
    weights = masked_softmax(scores, attn_mask)
    if dropout_p > 0.0:
        keep = (
            uniform(weights.shape, generator=generator, device=weights.device)
            >= dropout_p
        )
        weights = weights * keep / (1.0 - dropout_p)
    out = weights @ v
    return (out, weights) if return_weights else out


# --------------------------------------------------------------------------------------
# Hard vs soft attention
# --------------------------------------------------------------------------------------
def _check_hard(fn: str, mode, attn_mask, scores: tuple[int, ...]) -> None:
    if mode not in ("argmax", "sample"):
        raise ValueError(f"{fn}: mode must be 'argmax' or 'sample', got {mode!r}")
    if attn_mask is not None:
        check_attn_mask(fn, attn_mask, scores)


def hard_attention_weights(
    scores: torch.Tensor,
    mode: str = "argmax",
    attn_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One-hot weights picking a single key per query (Xu et al., 2015).

    ``mode="argmax"`` picks the best-scoring key (deterministic); ``mode="sample"``
    draws a key from ``softmax(scores)``, so its expectation is the soft weights.
    Neither is differentiable with respect to the scores: training needs REINFORCE or a
    relaxation (Gumbel-softmax). Fully masked rows give zeros.
    """
    check_float("hard_attention_weights", "scores", scores)
    _check_hard("hard_attention_weights", mode, attn_mask, tuple(scores.shape))
    soft = masked_softmax(scores, attn_mask)
    if scores.shape[-1] == 0:  # no key at all: nothing to pick (argmax of nothing)
        return soft
    alive = soft.sum(-1, keepdim=True) > 0
    # argmax of the masked scores: softmax can round near-equal scores to a tie
    if mode == "argmax":
        if attn_mask is not None:
            scores = (
                scores.masked_fill(~attn_mask, float("-inf"))
                if attn_mask.dtype == torch.bool
                else scores + attn_mask.to(scores.dtype)
            )
        index = scores.argmax(-1, keepdim=True)
    else:  # "sample"
        flat = soft.reshape(-1, soft.shape[-1])
        flat = torch.where(flat.sum(-1, keepdim=True) > 0, flat, torch.ones_like(flat))
        index = multinomial(flat, 1, generator=generator).reshape(
            *soft.shape[:-1], 1
        )
    one_hot = torch.zeros_like(soft).scatter_(-1, index, 1.0)
    return one_hot * alive


def _check_hard_attention(q, k, v, attn_mask, mode, scale, return_weights) -> None:
    fn = "hard_attention"
    check_qkv(fn, q, k, v)
    check_flag(fn, "return_weights", return_weights)
    if scale is not None:
        check_real(fn, "scale", scale)
    k_batch = list(k.shape[:-2])
    if q.dim() >= 3 and k.dim() >= 3 and min(q.shape[-3], k.shape[-3]) > 1:
        k_batch[-1] = q.shape[-3]  # grouped-query heads: k's are repeated
    batch = torch.broadcast_shapes(q.shape[:-2], k_batch)
    _check_hard(fn, mode, attn_mask, (*batch, q.shape[-2], k.shape[-2]))


def hard_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    *,
    mode: str = "argmax",
    scale: float | None = None,
    generator: torch.Generator | None = None,
    return_weights: bool = False,
):
    """Hard attention: each query copies the value of one key chosen by
    :func:`hard_attention_weights`."""
    _check_hard_attention(q, k, v, attn_mask, mode, scale, return_weights)
    k, v = grouped_kv(q, k, v)
    weights = hard_attention_weights(
        scaled_dot_score(q, k, scale), mode, attn_mask, generator
    )
    out = weights @ v
    return (out, weights) if return_weights else out


# --------------------------------------------------------------------------------------
# Multi-head attention (MHA, and MQA/GQA when n_kv_heads < n_heads)
# --------------------------------------------------------------------------------------
def _check_mha(d_model, n_heads, n_kv_heads, dropout, bias) -> None:
    fn = "MultiHeadAttention"
    check_sizes(fn, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads)
    check_flag(fn, "bias", bias)
    check_real(fn, "dropout", dropout, minimum=0)
    if dropout >= 1:
        raise ValueError(f"{fn}: dropout must be in [0, 1), got {dropout}")
    if d_model % n_heads:
        raise ValueError(
            f"{fn}: d_model={d_model} must be divisible by n_heads={n_heads}"
        )
    if n_heads % n_kv_heads:
        raise ValueError(
            f"{fn}: n_heads={n_heads} must be a multiple of n_kv_heads={n_kv_heads}"
        )


class MultiHeadAttention(HeadShell, nn.Module):
    """Multi-head attention (Vaswani et al., 2017) with optional grouped key/value
    heads.

    ``head_i = Attention(x W_i^Q, c W_i^K, c W_i^V)``, ``MHA(x, c) = concat(head_1..h)
    W^O``, where ``c = x`` for self-attention and the encoder output for
    cross-attention. With ``n_kv_heads < n_heads`` every group of ``n_heads //
    n_kv_heads`` query heads shares one key and value head (``n_kv_heads = 1``:
    multi-query attention), which shrinks the KV cache.

    Inputs are ``(batch, seq, d_model)``; masks broadcast to ``(batch, n_heads, L, S)``.
    The projections and the heads come from :class:`attnbook.layers.HeadShell`.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
    ):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        _check_mha(d_model, n_heads, n_kv_heads, dropout, bias)
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def _check_inputs(self, x, context, attn_mask, is_causal, return_weights) -> None:
        fn = "MultiHeadAttention"
        check_flag(fn, "is_causal", is_causal)
        check_flag(fn, "return_weights", return_weights)
        for name, t in (("x", x), ("context", context)):
            check_float(fn, name, t)
            if t.dim() != 3 or t.shape[-1] != self.d_model:
                raise ValueError(
                    f"{fn}: {name} must have shape (batch, seq, d_model="
                    f"{self.d_model}), got {tuple(t.shape)}"
                )
        if context.shape[0] != x.shape[0]:
            raise ValueError(
                f"{fn}: x {tuple(x.shape)} and context {tuple(context.shape)} must "
                "have the same batch size"
            )
        if attn_mask is not None:
            scores = (x.shape[0], self.n_heads, x.shape[1], context.shape[1])
            check_attn_mask(fn, attn_mask, scores)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        *,
        is_causal: bool = False,
        return_weights: bool = False,
    ):
        """``x``: ``(B, L, d_model)``; ``context``: ``(B, S, d_model)`` for
        cross-attention (default ``x``).

        Returns ``(B, L, d_model)``, or ``(out, weights)`` with per-head weights ``(B,
        n_heads, L, S)``.
        """
        context = x if context is None else context
        self._check_inputs(x, context, attn_mask, is_causal, return_weights)
        q, k, v = self.project(x, context)  # (B, heads, T, head_dim) each
        out, weights = scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask,
            is_causal=is_causal,
            enable_gqa=True,
            dropout_p=self.dropout if self.training else 0.0,
            return_weights=True,
        )
        out = self.merge(out)  # heads side by side again, then W^O
        return (out, weights) if return_weights else out
