"""Positional information for attention: absolute, relative, bias-based and rotary
encodings.

Self-attention is permutation-equivariant, so order has to be injected. This module
implements the main answers, in the order Chapter 3 tells them:

* absolute encodings added to the input: sinusoidal (Vaswani et al., 2017) and learned;
* relative position inside the score: Shaw, Uszkoreit & Vaswani (2018); the "untied" and
  multiplicative variants of the four-term decomposition; DeBERTa's disentangled
  attention (He et al., 2021);
* scalar biases added to the logits: T5's bucketed relative bias (Raffel et al., 2020)
  and ALiBi (Press, Smith & Lewis, 2022);
* rotary embeddings, RoPE (Su et al., 2024; arXiv 2021), with the context-extension
  recipes position interpolation (Chen et al., 2023), "NTK-aware" base scaling and YaRN
  (Peng et al., 2024).

Relative offsets are ``j - i`` (key position minus query position). When there are more
keys than queries (a KV cache holding ``S - L`` earlier tokens) query ``i`` sits at
position ``i + S - L``, the same bottom-right alignment as
:func:`attnbook.core.causal_mask`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .core import _check_qkv, causal_mask, masked_softmax

__all__ = [
    "sinusoidal_encoding",
    "LearnedPositionalEmbedding",
    "relative_positions",
    "shaw_relative_attention",
    "untied_scores",
    "multiplicative_scores",
    "disentangled_scores",
    "t5_relative_position_bucket",
    "T5RelativeBias",
    "alibi_slopes",
    "alibi_bias",
    "RotaryEmbedding",
]


# --------------------------------------------------------------------------------------
# Absolute encodings, added to the token embeddings
# --------------------------------------------------------------------------------------
def sinusoidal_encoding(
    n_positions: int, dim: int, base: float = 10000.0
) -> torch.Tensor:
    r"""The Transformer's fixed encoding, shape ``(n_positions, dim)``.

    .. math::

        PE_{i, 2f} = \sin(\omega_f i), \quad PE_{i, 2f+1} = \cos(\omega_f i), \quad
        \omega_f = \text{base}^{-2f/\text{dim}}

    Wavelengths grow geometrically from ``2 pi`` to ``2 pi * base``. For each frequency
    the pair ``(sin, cos)`` at position ``i + k`` is a rotation of the pair at ``i`` by
    the angle ``omega_f k``, a linear map that depends on ``k`` only.
    """
    if n_positions < 0:
        raise ValueError(f"n_positions must be non-negative, got {n_positions}")
    if dim <= 0 or dim % 2:
        raise ValueError(
            f"dim must be a positive even number (sin/cos pairs), got {dim}"
        )
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]
    omega = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)
    pe = torch.empty(n_positions, dim, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(position * omega)
    pe[:, 1::2] = torch.cos(position * omega)
    return pe.float()


class LearnedPositionalEmbedding(nn.Module):
    """A trained table of ``max_len`` position vectors (GPT-2, BERT):
    ``forward(positions) -> (..., dim)``.

    Positions ``>= max_len`` have no row, so the model cannot run on longer inputs: this
    raises a ``ValueError`` instead of the cryptic index error of ``nn.Embedding``.
    """

    def __init__(self, max_len: int, dim: int):
        super().__init__()
        if max_len < 1 or dim < 1:
            raise ValueError(
                f"max_len and dim must be positive, got max_len={max_len}, dim={dim}"
            )
        self.max_len, self.dim = max_len, dim
        self.weight = nn.Parameter(torch.randn(max_len, dim) * 0.02)

    def forward(self, positions: torch.Tensor | int) -> torch.Tensor:
        """``positions``: an int ``n`` (positions ``0..n-1``) or an integer tensor of
        positions."""
        if isinstance(positions, int):
            positions = torch.arange(positions, device=self.weight.device)
        if positions.numel() and (
            int(positions.max()) >= self.max_len or int(positions.min()) < 0
        ):
            raise ValueError(
                f"positions must lie in [0, max_len={self.max_len}), got range "
                f"[{int(positions.min())}, {int(positions.max())}]: a learned table "
                "cannot extrapolate"
            )
        return self.weight[positions]


# --------------------------------------------------------------------------------------
# Relative positions inside the attention score
# --------------------------------------------------------------------------------------
def relative_positions(
    q_len: int, k_len: int | None = None, device=None
) -> torch.Tensor:
    """``(q_len, k_len)`` integer matrix of offsets ``j - i``, bottom-right aligned.

    Query ``i`` sits at position ``i + k_len - q_len``, so the last query is the last
    key's position. Negative entries are keys in the past.
    """
    k_len = q_len if k_len is None else k_len
    if q_len < 0 or k_len < 0:
        raise ValueError(f"q_len and k_len must be non-negative, got {q_len}, {k_len}")
    i = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    j = torch.arange(k_len, device=device)[None, :]
    return j - i


def _check_table(name: str, table: torch.Tensor, rows: int, dim: int) -> None:
    if table.dim() != 2 or table.shape != (rows, dim):
        raise ValueError(
            f"{name} must have shape (2*max_distance + 1, head_dim) = ({rows}, "
            f"{dim}), got {tuple(table.shape)}"
        )


def shaw_relative_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rel_k: torch.Tensor,
    rel_v: torch.Tensor,
    max_distance: int,
    attn_mask: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    return_weights: bool = False,
):
    r"""Self-attention with relative position representations (Shaw et al., 2018).

    .. math::
        e_{ij} = \frac{q_i \cdot (k_j + a^K_{ij})}{\sqrt{d}}, \qquad
        z_i = \sum_j w_{ij} \,(v_j + a^V_{ij}), \qquad
        a_{ij} = \text{table}[\operatorname{clip}(j - i, -k, k) + k]

    Args:
        q: ``(..., L, d)``; k, v: ``(..., S, d)``.
        rel_k, rel_v: learned tables ``(2 * max_distance + 1, d)``, one row per
            clipped offset.
        max_distance: ``k``; offsets further than ``k`` share the edge rows.
        attn_mask, is_causal: as in :func:`attnbook.core.scaled_dot_product_attention`.

    Returns ``(..., L, d)`` (and the ``(..., L, S)`` weights with
    ``return_weights=True``). The ``(L, S, d)`` gathered tables cost ``O(L S d)``
    memory, the price of this form.
    """
    _check_qkv(q, k, v)
    if max_distance < 0:
        raise ValueError(f"max_distance must be non-negative, got {max_distance}")
    d, L, S = q.shape[-1], q.shape[-2], k.shape[-2]
    _check_table("rel_k", rel_k, 2 * max_distance + 1, d)
    _check_table("rel_v", rel_v, 2 * max_distance + 1, v.shape[-1])
    index = (
        relative_positions(L, S, device=q.device).clamp(-max_distance, max_distance)
        + max_distance
    )
    a_k, a_v = rel_k[index], rel_v[index]  # (L, S, d)
    scores = (
        q @ k.transpose(-2, -1) + torch.einsum("...id,ijd->...ij", q, a_k)
    ) / math.sqrt(d)
    if is_causal:
        causal = causal_mask(L, S, device=q.device)
        attn_mask = (
            causal
            if attn_mask is None
            else (
                attn_mask & causal
                if attn_mask.dtype == torch.bool
                else attn_mask.masked_fill(~causal, float("-inf"))
            )
        )
    weights = masked_softmax(scores, attn_mask)
    out = weights @ v + torch.einsum("...ij,ijd->...id", weights, a_v)
    return (out, weights) if return_weights else out


def untied_scores(
    x: torch.Tensor,
    pos: torch.Tensor,
    W_q: torch.Tensor,
    W_k: torch.Tensor,
    U_q: torch.Tensor,
    U_k: torch.Tensor,
) -> torch.Tensor:
    r"""Untied content and position scores (seed 003 eq. 9; TUPE, Ke et al., 2021).

    .. math:: \tilde a_{ij} = (x_i W_q)(x_j W_k)^\top + (p_i U_q)(p_j U_k)^\top

    The two cross terms of the four-term expansion (eq. 8) are dropped and positions get
    their own projections. ``x``: ``(..., n, D)``; ``pos``: ``(n, D)`` absolute position
    embeddings; ``W_*``, ``U_*``: ``(D, d)``. Returns raw logits ``(..., n, n)`` (divide
    by a scale before the softmax).
    """
    if pos.shape[-2] != x.shape[-2]:
        raise ValueError(
            f"pos must have one row per position of x: x {tuple(x.shape)}, pos "
            f"{tuple(pos.shape)}"
        )
    content = (x @ W_q) @ (x @ W_k).transpose(-2, -1)
    position = (pos @ U_q) @ (pos @ U_k).transpose(-2, -1)
    return content + position


def multiplicative_scores(
    q: torch.Tensor, k: torch.Tensor, rel: torch.Tensor, max_distance: int
) -> torch.Tensor:
    r"""Content scores multiplied by a learned function of the distance (seed 003 eq.
    12).

    .. math:: \tilde a_{ij} = (q_i \cdot k_j)\, \pi_{\min(|i - j|, k)}

    ``q``: ``(..., L, d)``, ``k``: ``(..., S, d)``, ``rel``: ``(max_distance + 1,)`` one
    scalar per distance. Unlike an additive bias, the factor rescales the content score:
    a distance with ``pi = 0`` removes content from the logit entirely.
    """
    if rel.shape != (max_distance + 1,):
        raise ValueError(
            f"rel must have shape (max_distance + 1,) = ({max_distance + 1},), got "
            f"{tuple(rel.shape)}"
        )
    distance = (
        relative_positions(q.shape[-2], k.shape[-2], device=q.device)
        .abs()
        .clamp(max=max_distance)
    )
    return (q @ k.transpose(-2, -1)) * rel[distance]


def disentangled_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    max_distance: int,
) -> torch.Tensor:
    r"""DeBERTa's disentangled attention logits (He et al., 2021; seed 003 eq. 13),
    unscaled.

    .. math::
        \tilde a_{ij} = \underbrace{q_i \cdot k_j}_{\text{content-content}}
        + \underbrace{q_i \cdot k^{r}_{\delta(i, j)}}_{\text{content-position}}
        + \underbrace{k_j \cdot q^{r}_{\delta(j, i)}}_{\text{position-content}},
        \qquad \delta(i, j) = \operatorname{clip}(i - j, -k, k) + k

    ``q``, ``k``: content queries and keys ``(..., n, d)``; ``q_pos``, ``k_pos``: the
    relative position table projected by the query and key maps, ``(2 * max_distance +
    1, d)``. Note DeBERTa's offset is ``i - j`` (query minus key), the opposite sign to
    Shaw's. DeBERTa divides the sum by ``sqrt(3 d)`` before the softmax.
    """
    n, d = q.shape[-2], q.shape[-1]
    if k.shape[-2] != n:
        raise ValueError(
            f"disentangled_scores is self-attention: q {tuple(q.shape)} and k "
            f"{tuple(k.shape)} need equal lengths"
        )
    _check_table("q_pos", q_pos, 2 * max_distance + 1, d)
    _check_table("k_pos", k_pos, 2 * max_distance + 1, d)
    i_minus_j = -relative_positions(n, n, device=q.device)
    delta_ij = i_minus_j.clamp(-max_distance, max_distance) + max_distance
    content = q @ k.transpose(-2, -1)
    c2p = torch.einsum("...id,ijd->...ij", q, k_pos[delta_ij])
    # delta(j, i) at entry (i, j)
    p2c = torch.einsum("...jd,ijd->...ij", k, q_pos[delta_ij.T])
    return content + c2p + p2c


# --------------------------------------------------------------------------------------
# Scalar biases on the logits: T5 and ALiBi
# --------------------------------------------------------------------------------------
def t5_relative_position_bucket(
    relative_position: torch.Tensor,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> torch.Tensor:
    """T5's bucket of each offset ``relative_position = key_position - query_position``
    (Raffel et al., 2020).

    With ``bidirectional`` half the buckets hold keys before the query and half keys
    after it (offset ``> 0`` adds ``num_buckets // 2``); a causal model only uses the
    past (future offsets go to bucket 0). Within one direction of ``B`` buckets and
    distance ``n = |offset|``:

    * ``n < B/2``: one exact bucket per distance, bucket ``n``;
    * otherwise ``B/2 + floor(log(n / (B/2)) / log(max_distance / (B/2)) * (B/2))``:
      log-spaced, clamped to ``B - 1``, so every distance ``>= max_distance`` shares the
      last bucket.
    """
    relative_position = torch.as_tensor(relative_position)
    if relative_position.is_floating_point():
        raise ValueError(
            "relative_position must be an integer tensor, got "
            f"{relative_position.dtype}"
        )
    bucket = torch.zeros_like(relative_position, dtype=torch.long)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    if max_exact < 1:
        raise ValueError(
            f"num_buckets is too small for bucketing ({num_buckets} per direction)"
        )
    # log(0) is -inf for distance 0: torch.where picks the exact branch there, so it
    # never shows.
    log_ratio = torch.log(distance.float() / max_exact) / math.log(
        max_distance / max_exact
    )
    large = max_exact + (log_ratio * (num_buckets - max_exact)).to(torch.long)
    large = large.clamp(max=num_buckets - 1)
    return bucket + torch.where(distance < max_exact, distance, large)


class T5RelativeBias(nn.Module):
    """T5's learned relative attention bias: one scalar per (bucket, head), added to the
    logits.

    ``forward(q_len, k_len=None)`` returns the additive bias ``(1, n_heads, q_len,
    k_len)``, bottom-right aligned like :func:`relative_positions`. T5 computes it once
    and shares it across all layers of a stack (and does not divide its logits by
    ``sqrt(d)``).
    """

    def __init__(
        self,
        n_heads: int,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = True,
    ):
        super().__init__()
        self.n_heads, self.num_buckets = n_heads, num_buckets
        self.max_distance, self.bidirectional = max_distance, bidirectional
        self.bias = nn.Embedding(num_buckets, n_heads)

    def forward(self, q_len: int, k_len: int | None = None) -> torch.Tensor:
        rel = relative_positions(q_len, k_len, device=self.bias.weight.device)
        buckets = t5_relative_position_bucket(
            rel, self.bidirectional, self.num_buckets, self.max_distance
        )
        # (L, S, h) -> (1, h, L, S)
        return self.bias(buckets).permute(2, 0, 1).unsqueeze(0)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """ALiBi's head slopes ``m_h`` (Press et al., 2022), shape ``(n_heads,)``.

    For ``n`` a power of two: the geometric sequence ``m_h = 2^(-8h/n)``, ``h = 1..n``
    (8 heads: 1/2, 1/4, ..., 1/256). Otherwise, with ``p`` the largest power of two
    below ``n``: the ``p`` slopes of ``p`` heads, then the 1st, 3rd, 5th, ... slopes of
    the ``2p``-head sequence (they fall between the first list's slopes) until there are
    ``n``. 12 heads: the 8-head slopes, then ``2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5``.
    """
    if n_heads < 1:
        raise ValueError(f"n_heads must be positive, got {n_heads}")

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    p = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(p) + power_of_two(2 * p)[0::2][: n_heads - p]
    return torch.tensor(slopes)


def alibi_bias(
    n_heads: int, q_len: int, k_len: int | None = None, causal: bool = True
) -> torch.Tensor:
    r"""ALiBi's additive bias ``(1, n_heads, q_len, k_len)``: a penalty linear in the
    distance.

    .. math:: b_{h,ij} = -m_h\, |i - j|

    ``causal=True`` (decoders, as in the paper) sets keys after the query to ``-inf``,
    so the bias is a complete additive mask; ``causal=False`` is the symmetric form used
    for encoders. Keys and queries are bottom-right aligned. (The reference
    implementation adds ``m_h j`` instead, which differs from ``-m_h (i - j)`` by a
    per-row constant the softmax ignores.)
    """
    distance = relative_positions(q_len, k_len).abs().float()
    bias = -alibi_slopes(n_heads)[:, None, None] * distance
    if causal:
        bias = bias.masked_fill(~causal_mask(q_len, k_len), float("-inf"))
    return bias.unsqueeze(0)


# --------------------------------------------------------------------------------------
# Rotary embeddings
# --------------------------------------------------------------------------------------
class RotaryEmbedding(nn.Module):
    r"""Rotary position embedding, RoPE (Su et al., 2024; arXiv 2021), applied to
    queries and keys.

    Each pair of coordinates of a ``dim``-vector at position ``m`` is rotated by the
    angle ``m * theta_f`` with ``theta_f = base^(-2f/dim)``, ``f = 0 .. dim/2 - 1``
    (``inv_freq``). Because rotations compose, ``<R_m q, R_n k> = <q, R_{n-m} k>``: the
    score depends on ``n - m`` only.

    * ``interleaved=True`` rotates pairs ``(2f, 2f+1)`` (RoFormer, GPT-J);
      ``interleaved=False`` rotates ``(f, f + dim/2)`` (GPT-NeoX, LLaMA). They are the
      same map up to a fixed permutation of coordinates, but checkpoints trained with
      one need that one.
    * ``scaling`` stretches a model's context by a factor ``s``:

      - ``{"type": "linear", "factor": s}``: position interpolation, ``theta_f / s``
        (Chen et al., 2023);
      - ``{"type": "ntk", "factor": s}``: "NTK-aware" static scaling, base ``base *
        s^(dim/(dim-2))``, which keeps the fastest frequency and interpolates the
        slowest by exactly ``s``;
      - ``{"type": "yarn", "factor": s, "original_max_position_embeddings": L0,
        "beta_fast": 32, "beta_slow": 1}`` (Peng et al., 2024): with ``r_f = L0 /
        wavelength_f`` rotations in the original context, ``gamma_f = clip((r_f -
        beta_slow) / (beta_fast - beta_slow), 0, 1)`` and ``theta'_f = (1 - gamma_f)
        theta_f / s + gamma_f theta_f``: fast dimensions are kept, slow ones
        interpolated, a linear ramp between. ``attention_scaling = 0.1 ln(s) + 1``
        multiplies the rotated queries and keys (so the logits by its square), as the
        paper and Hugging Face do. (The authors' code rounds the ramp ends to whole
        dimensions; this is the paper's formula.)

    ``forward(x, positions=None, offset=0)``: ``x`` ``(..., seq, dim)``; positions
    default to ``offset, offset + 1, ...`` (``offset`` = tokens already in a KV cache).
    Returns the rotated ``x``.
    """

    def __init__(
        self,
        dim: int,
        base: float = 10000.0,
        interleaved: bool = False,
        scaling: dict | None = None,
    ):
        super().__init__()
        if dim <= 0 or dim % 2:
            raise ValueError(
                f"dim must be a positive even number (RoPE rotates pairs), got {dim}"
            )
        self.dim, self.base, self.interleaved, self.scaling = (
            dim,
            base,
            interleaved,
            scaling,
        )
        exponent = torch.arange(0, dim, 2, dtype=torch.float64) / dim
        inv_freq = base**-exponent
        self.attention_scaling = 1.0
        kind = None if scaling is None else scaling.get("type")
        factor = 1.0 if scaling is None else float(scaling.get("factor", 1.0))
        if scaling is not None and factor < 1.0:
            raise ValueError(f"scaling factor must be >= 1, got {factor}")
        if kind is None:
            if scaling is not None:
                raise ValueError(
                    "scaling needs a 'type' of 'linear', 'ntk' or 'yarn', got "
                    f"{scaling}"
                )
        elif kind == "linear":
            inv_freq = inv_freq / factor
        elif kind == "ntk":
            inv_freq = (
                (base * factor ** (dim / (dim - 2))) ** -exponent
                if dim > 2
                else inv_freq / factor
            )
        elif kind == "yarn":
            if "original_max_position_embeddings" not in scaling:
                raise ValueError(
                    "yarn scaling needs 'original_max_position_embeddings' (the "
                    "trained context length)"
                )
            original = float(scaling["original_max_position_embeddings"])
            beta_fast, beta_slow = (
                float(scaling.get("beta_fast", 32)),
                float(scaling.get("beta_slow", 1)),
            )
            rotations = original * inv_freq / (2 * math.pi)  # r_f = L0 / wavelength_f
            gamma = ((rotations - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0)
            inv_freq = (1 - gamma) * inv_freq / factor + gamma * inv_freq
            self.attention_scaling = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        else:
            raise ValueError(
                f"unknown scaling type {kind!r}; use 'linear', 'ntk' or 'yarn'"
            )
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def angles(self, positions: torch.Tensor) -> torch.Tensor:
        """Rotation angles ``positions[..., None] * inv_freq``: shape ``(..., dim/2)``,
        in float32."""
        return positions.to(torch.float32)[..., None] * self.inv_freq

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, offset: int = 0
    ) -> torch.Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(
                f"x must have last dimension dim={self.dim}, got shape {tuple(x.shape)}"
            )
        if positions is None:
            positions = torch.arange(offset, offset + x.shape[-2], device=x.device)
        theta = self.angles(positions.to(x.device))  # (..., seq, dim/2)
        cos = (torch.cos(theta) * self.attention_scaling).to(x.dtype)
        sin = (torch.sin(theta) * self.attention_scaling).to(x.dtype)
        if self.interleaved:
            x1, x2 = x[..., 0::2], x[..., 1::2]
            return torch.stack(
                (x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1
            ).flatten(-2)
        x1, x2 = x[..., : self.dim // 2], x[..., self.dim // 2 :]
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
