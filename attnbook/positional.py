"""Positional information for attention: absolute, relative, bias-based and rotary
encodings.

Self-attention is permutation-equivariant, so order has to be injected. This module
implements the main answers, in the order the positional-encodings chapter tells them:

* absolute encodings added to the input: sinusoidal (Vaswani et al., 2017) and learned,
  with tools to look inside a learned table (principal components, principal angles
  between the token and position subspaces);
* relative position inside the score: Shaw, Uszkoreit & Vaswani (2018); Transformer-XL's
  four relative terms (Dai et al., 2019); untied positions (TUPE, Ke et al., 2021) and a
  multiplicative variant; DeBERTa's disentangled attention (He et al., 2021);
* scalar biases added to the logits: T5's bucketed relative bias (Raffel et al., 2020)
  and ALiBi (Press, Smith & Lewis, 2022);
* rotary embeddings, RoPE (Su et al., 2024; arXiv 2021), with the context-extension
  recipes position interpolation (Chen et al., 2023), "NTK-aware" base scaling and YaRN
  (Peng et al., 2024); the same rotation written as complex multiplication.

Relative offsets are ``j - i`` (key position minus query position), except where a paper
defines its distance the other way (Transformer-XL and DeBERTa use ``i - j``, said at
each function). When there are more
keys than queries (a KV cache holding ``S - L`` earlier tokens) query ``i`` sits at
position ``i + S - L``, the same bottom-right alignment as
:func:`attnbook.core.causal_mask`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .contract import attention_mask, check_qkv, grouped_kv
from .core import causal_mask, masked_softmax

__all__ = [
    "sinusoidal_encoding",
    "LearnedPositionalEmbedding",
    "relative_positions",
    "shaw_relative_attention",
    "untied_scores",
    "multiplicative_scores",
    "disentangled_scores",
    "transformer_xl_relative_embeddings",
    "transformer_xl_scores",
    "t5_relative_position_bucket",
    "T5RelativeBias",
    "alibi_slopes",
    "alibi_bias",
    "yarn_inv_freq",
    "RotaryEmbedding",
    "rope_complex",
    "principal_components",
    "principal_angles",
    "subspace_overlap",
    "variance_in_subspace",
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


def _check_table(
    name: str, table: torch.Tensor, rows: int, dim: int, what="2*max_distance + 1"
) -> None:
    if table.dim() != 2 or table.shape != (rows, dim):
        raise ValueError(
            f"{name} must have shape ({what}, head_dim) = ({rows}, {dim}), got "
            f"{tuple(table.shape)}"
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
    scale: float | None = None,
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
        attn_mask, is_causal, scale: as in
            :func:`attnbook.core.scaled_dot_product_attention`.

    Returns ``(..., L, d)`` (and the ``(..., L, S)`` weights with
    ``return_weights=True``). The ``(L, S, d)`` gathered tables cost ``O(L S d)``
    memory, the price of this form.
    """
    check_qkv("shaw_relative_attention", q, k, v)
    k, v = grouped_kv(q, k, v)
    if max_distance < 0:
        raise ValueError(f"max_distance must be non-negative, got {max_distance}")
    d, L, S = q.shape[-1], q.shape[-2], k.shape[-2]
    _check_table("rel_k", rel_k, 2 * max_distance + 1, d)
    _check_table("rel_v", rel_v, 2 * max_distance + 1, v.shape[-1])
    offsets = relative_positions(L, S, device=q.device)  # j - i
    index = offsets.clamp(-max_distance, max_distance) + max_distance
    a_k, a_v = rel_k[index], rel_v[index]  # (L, S, d)
    scores = q @ k.transpose(-2, -1) + torch.einsum("...id,ijd->...ij", q, a_k)
    scores = scores * (1.0 / math.sqrt(d) if scale is None else scale)
    attn_mask = attention_mask(
        "shaw_relative_attention", q, k, attn_mask, is_causal=is_causal
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
    r"""Untied content and position scores (TUPE, Ke et al., 2021).

    .. math:: \tilde a_{ij} = (x_i W_q)(x_j W_k)^\top + (p_i U_q)(p_j U_k)^\top

    Expanding ``((x_i + p_i) W_q)((x_j + p_j) W_k)^T`` gives four terms:
    content-content, two word-position cross terms, and position-position. The untied
    form drops the two cross terms and gives positions their own projections.

    ``x``: ``(..., n, D)``; ``pos``: ``(n, D)`` absolute position embeddings; ``W_*``,
    ``U_*``: ``(D, d)``. Returns raw logits ``(..., n, n)`` (divide by a scale before
    the softmax; TUPE uses ``sqrt(2d)``).
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
    r"""Content scores multiplied by a learned function of the distance.

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
    r"""DeBERTa's disentangled attention logits (He et al., 2021), unscaled.

    .. math::
        \tilde a_{ij} = \underbrace{q_i \cdot k_j}_{\text{content-to-content}}
        + \underbrace{q_i \cdot k^{r}_{\delta(i, j)}}_{\text{content-to-position}}
        + \underbrace{k_j \cdot q^{r}_{\delta(j, i)}}_{\text{position-to-content}}

    with the paper's relative distance, which takes ``2k`` values:

    .. math::
        \delta(i, j) = \begin{cases} 0 & i - j \le -k \\ 2k - 1 & i - j \ge k \\
        i - j + k & \text{otherwise} \end{cases}
        \;=\; \operatorname{clip}(i - j, -k, k - 1) + k

    ``q``, ``k``: content queries and keys ``(..., n, d)``; ``q_pos``, ``k_pos``: the
    relative position table projected by the query and key maps, ``(2 * max_distance,
    d)`` (``k = max_distance >= 1``). DeBERTa's offset is ``i - j`` (query minus key),
    the opposite sign to Shaw's. It divides the sum by ``sqrt(3 d)`` before the
    softmax.
    """
    n, d = q.shape[-2], q.shape[-1]
    if k.shape[-2] != n:
        raise ValueError(
            f"disentangled_scores is self-attention: q {tuple(q.shape)} and k "
            f"{tuple(k.shape)} need equal lengths"
        )
    if max_distance < 1:
        raise ValueError(f"max_distance must be at least 1, got {max_distance}")
    _check_table("q_pos", q_pos, 2 * max_distance, d, "2*max_distance")
    _check_table("k_pos", k_pos, 2 * max_distance, d, "2*max_distance")
    i_minus_j = -relative_positions(n, n, device=q.device)
    delta_ij = i_minus_j.clamp(-max_distance, max_distance - 1) + max_distance
    content = q @ k.transpose(-2, -1)
    c2p = torch.einsum("...id,ijd->...ij", q, k_pos[delta_ij])
    # delta(j, i) at entry (i, j)
    p2c = torch.einsum("...jd,ijd->...ij", k, q_pos[delta_ij.T])
    return content + c2p + p2c


def transformer_xl_relative_embeddings(n: int, dim: int) -> torch.Tensor:
    """Transformer-XL's fixed relative embeddings ``R_delta`` for distances ``delta = 0
    .. n-1``, shape ``(n, dim)`` (Dai et al., 2019).

    They are the sinusoidal table of :func:`sinusoidal_encoding` indexed by distance
    instead of absolute position. Each head projects them with its own ``W_R``
    (``r = R @ W_R``, shape ``(n, d)`` per head) before :func:`transformer_xl_scores`.
    """
    return sinusoidal_encoding(n, dim)


def transformer_xl_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    r: torch.Tensor,
    u: torch.Tensor,
    v: torch.Tensor,
    *,
    return_terms: bool = False,
):
    r"""Transformer-XL's relative attention logits (Dai et al., 2019), unscaled.

    .. math::
        \tilde a_{ij} = \underbrace{q_i \cdot k_j}_{(a)}
        + \underbrace{q_i \cdot r_{\delta}}_{(b)}
        + \underbrace{u \cdot k_j}_{(c)}
        + \underbrace{v \cdot r_{\delta}}_{(d)}
        = (q_i + u) \cdot k_j + (q_i + v) \cdot r_{\delta},
        \qquad \delta = (S - L + i) - j

    (a) content, (b) content-dependent position, (c) a global content bias, (d) a global
    position bias. ``r_delta = W_R R_delta`` is the projected relative embedding of
    distance ``delta``; ``u`` and ``v`` are learned and shared by all queries.

    Args:
        q: ``(..., H, L, d)`` queries of the current segment.
        k: ``(..., H, S, d)`` keys, ``S >= L``: the ``S - L`` cached (memory) keys
            followed by the current segment. Query ``i`` sits at absolute position
            ``S - L + i``, key ``j`` at position ``j``.
        r: ``(H, S, d)``, ``r[:, delta]`` for ``delta = 0 .. S-1``.
        u, v: ``(H, d)``.
        return_terms: also return the four terms ``(a, b, c, d)``, each ``(..., H, L,
            S)``, with 0 at masked entries.

    Returns the ``(..., H, L, S)`` logits, ``-inf`` where ``delta < 0`` (future keys).
    Divide by ``sqrt(d)`` before the softmax. Only distances enter (b) and (d), so the
    scores are unchanged when every absolute position shifts by the same amount.
    """
    if q.dim() < 3 or k.dim() != q.dim():
        raise ValueError(
            "q and k must be (..., H, L, d) and (..., H, S, d), got "
            f"{tuple(q.shape)} and {tuple(k.shape)}"
        )
    H, L, d = q.shape[-3:]
    S = k.shape[-2]
    if k.shape[-3] != H or k.shape[-1] != d or S < L:
        raise ValueError(
            f"k must be (..., H={H}, S >= L={L}, d={d}), got {tuple(k.shape)}"
        )
    if r.shape != (H, S, d):
        raise ValueError(
            f"r must have shape (H, S, d) = ({H}, {S}, {d}), got {tuple(r.shape)}"
        )
    for name, t in (("u", u), ("v", v)):
        if t.shape != (H, d):
            raise ValueError(
                f"{name} must have shape (H, d) = ({H}, {d}), got {tuple(t.shape)}"
            )
    delta = -relative_positions(L, S, device=q.device)  # (L, S): (S - L + i) - j
    future = delta < 0
    index = delta.clamp(min=0)
    rows = torch.arange(L, device=q.device)[:, None]
    a = q @ k.transpose(-2, -1)
    b = (q @ r.transpose(-2, -1))[..., rows, index]  # q_i . r[delta(i, j)]
    c = torch.einsum("hd,...hsd->...hs", u, k)[..., None, :].expand_as(a)
    d_term = (v[:, None, :] * r).sum(-1)[:, index].expand_as(a)  # (H, L, S) -> batch
    scores = (a + b + c + d_term).masked_fill(future, float("-inf"))
    if not return_terms:
        return scores
    terms = tuple(t.masked_fill(future, 0.0) for t in (a, b, c, d_term))
    return scores, terms


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
    """T5's learned relative attention bias (Raffel et al., 2020): one scalar per head
    and per bucket, added to the logits.

    ``bias.weight`` has shape ``(num_buckets, n_heads)``: every head has its own scalar
    for each bucket (heads are not tied), and the one table serves every layer of a
    stack (layers are tied: T5 computes the bias in the first layer and reuses it).
    ``forward(q_len, k_len=None)`` returns the additive bias ``(1, n_heads, q_len,
    k_len)``, bottom-right aligned like :func:`relative_positions`. T5 does not divide
    its logits by ``sqrt(d)``.
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
    n_heads: int, q_len: int, k_len: int | None = None, *, is_causal: bool = True
) -> torch.Tensor:
    r"""ALiBi's additive bias ``(1, n_heads, q_len, k_len)``: a penalty linear in the
    distance.

    .. math:: b_{h,ij} = -m_h\, |i - j|

    ``is_causal=True`` (decoders, as in the paper) sets keys after the query to
    ``-inf``, so the bias is a complete additive mask; ``is_causal=False`` is the
    symmetric form used for encoders. Keys and queries are bottom-right aligned. (The
    reference implementation adds ``m_h j`` instead, which differs from ``-m_h (i - j)``
    by a per-row constant the softmax ignores.)
    """
    distance = relative_positions(q_len, k_len).abs().float()
    bias = -alibi_slopes(n_heads)[:, None, None] * distance
    if is_causal:
        bias = bias.masked_fill(~causal_mask(q_len, k_len), float("-inf"))
    return bias.unsqueeze(0)


# --------------------------------------------------------------------------------------
# Rotary embeddings
# --------------------------------------------------------------------------------------
def yarn_inv_freq(
    dim: int,
    base: float,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    ramp: str = "released",
) -> tuple[torch.Tensor, float]:
    r"""YaRN's rotary frequencies (Peng et al., 2024): returns ``(inv_freq,
    attention_scaling)``, ``inv_freq`` of shape ``(dim/2,)`` in float64.

    Pair ``f`` turns ``r_f = L0 theta_f / (2 pi)`` times over the trained context
    ``L0``. Pairs that turn often keep ``theta_f`` (they have seen every angle), slow
    pairs are interpolated to ``theta_f / s``, and a ramp ``gamma_f`` blends the two:

    .. math:: \theta'_f = (1 - \gamma_f)\,\theta_f / s + \gamma_f\,\theta_f

    * ``ramp="released"`` (default): the ramp of the authors' code and of Hugging
      Face's ``_compute_yarn_parameters``, which released models use. The pair index
      that turns ``n`` times is ``f(n) = dim ln(L0 / (2 pi n)) / (2 ln base)``; with
      ``low = floor(f(beta_fast))`` and ``high = ceil(f(beta_slow))`` (clamped to ``[0,
      dim - 1]``), ``gamma_f = 1 - clip((f - low) / (high - low), 0, 1)``: linear in
      the pair index, between whole-numbered ends.
    * ``ramp="paper"``: ``gamma_f = clip((r_f - beta_slow) / (beta_fast - beta_slow),
      0, 1)``, linear in the number of turns.

    ``attention_scaling = 0.1 ln(s) + 1`` (1 when ``s = 1``).
    """
    inv_freq = base ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    L0 = float(original_max_position_embeddings)
    if ramp == "released":

        def pair_turning(n: float) -> float:  # the pair index that turns n times in L0
            return dim * math.log(L0 / (n * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(pair_turning(beta_fast)), 0)
        high = min(math.ceil(pair_turning(beta_slow)), dim - 1)
        high = high + 0.001 if low == high else high
        f = torch.arange(dim // 2, dtype=torch.float64)
        gamma = 1 - ((f - low) / (high - low)).clamp(0.0, 1.0)
    elif ramp == "paper":
        turns = L0 * inv_freq / (2 * math.pi)
        gamma = ((turns - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0)
    else:
        raise ValueError(f"ramp must be 'released' or 'paper', got {ramp!r}")
    inv_freq = (1 - gamma) * inv_freq / factor + gamma * inv_freq
    return inv_freq, (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)


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
        "beta_fast": 32, "beta_slow": 1, "ramp": "released"}`` (Peng et al., 2024),
        computed by :func:`yarn_inv_freq`: fast pairs are kept, slow ones
        interpolated, a linear ramp between; ``"ramp": "released"`` (the default) is
        the ramp of the authors' code and of Hugging Face, ``"paper"`` the paper's
        formula. ``attention_scaling = 0.1 ln(s) + 1`` multiplies the rotated queries
        and keys (so the logits by its square), as the paper and Hugging Face do.

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
            inv_freq, self.attention_scaling = yarn_inv_freq(
                dim,
                base,
                factor,
                scaling["original_max_position_embeddings"],
                beta_fast=float(scaling.get("beta_fast", 32)),
                beta_slow=float(scaling.get("beta_slow", 1)),
                ramp=scaling.get("ramp", "released"),
            )
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


def rope_complex(
    x: torch.Tensor,
    positions: torch.Tensor,
    base: float = 10000.0,
    *,
    interleaved: bool = False,
) -> torch.Tensor:
    r"""RoPE written as complex multiplication (Su et al., 2024): the same map as
    :class:`RotaryEmbedding`.

    View the ``dim`` coordinates as ``dim/2`` complex numbers ``z_f`` and multiply each
    by a unit phase:

    .. math:: z_f \mapsto z_f\, e^{\mathrm{i}\, m \theta_f}, \qquad
        \theta_f = \text{base}^{-2f/\text{dim}}

    ``z_f = x_f + i x_{f + dim/2}`` (``interleaved=False``, the pairing of
    :class:`RotaryEmbedding`'s default) or ``z_f = x_{2f} + i x_{2f+1}``
    (``interleaved=True``). ``x``: ``(..., seq, dim)``; ``positions``: ``(seq,)``.
    Returns the rotated ``x``, same shape and dtype.
    """
    dim = x.shape[-1]
    if dim % 2:
        raise ValueError(f"x must have an even last dimension, got {tuple(x.shape)}")
    half = dim // 2
    real = torch.float64 if x.dtype == torch.float64 else torch.float32
    if interleaved:
        pairs = x.reshape(*x.shape[:-1], half, 2)
    else:
        pairs = torch.stack((x[..., :half], x[..., half:]), dim=-1)
    z = torch.view_as_complex(pairs.to(real).contiguous())  # (..., seq, dim/2)
    theta = base ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = positions.to(torch.float64)[..., None] * theta
    phase = torch.polar(torch.ones_like(angles), angles).to(z.dtype).to(x.device)
    out = torch.view_as_real(z * phase)  # (..., seq, dim/2, 2)
    out = out.flatten(-2) if interleaved else torch.cat(out.unbind(-1), dim=-1)
    return out.to(x.dtype)


# --------------------------------------------------------------------------------------
# Looking inside a learned table: principal components and principal angles
# --------------------------------------------------------------------------------------
def principal_components(
    x: torch.Tensor, k: int, *, center: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PCA of the rows of ``x`` ``(n, D)``: ``(coords (n, k), basis (D, k),
    explained (k,))``.

    ``basis`` holds the top ``k`` right singular vectors of the (centred) rows as
    orthonormal columns, ``coords = x_c @ basis`` and ``explained`` is each
    component's fraction of the total variance. Computed in float64.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be a (n, D) matrix of row vectors, got {x.shape}")
    x = x.detach().to(torch.float64)
    x = x - x.mean(0) if center else x
    rank = min(x.shape[0] - int(center), x.shape[1])
    if not 1 <= k <= rank:
        raise ValueError(f"k must lie in [1, {rank}] for x of shape {tuple(x.shape)}")
    _, sv, vh = torch.linalg.svd(x, full_matrices=False)
    basis = vh[:k].T
    return x @ basis, basis, sv[:k] ** 2 / (sv**2).sum()


def principal_angles(a: torch.Tensor, b: torch.Tensor, k: int) -> torch.Tensor:
    """Principal angles (radians, ascending) between the top-``k`` principal
    subspaces of the rows of ``a`` ``(n_a, D)`` and of ``b`` ``(n_b, D)``.

    They are the ``arccos`` of the singular values of ``U_a^T U_b``, with ``U`` the
    orthonormal bases of :func:`principal_components`: 0 for a shared direction,
    ``pi/2`` for orthogonal ones.
    """
    _, u_a, _ = principal_components(a, k)
    _, u_b, _ = principal_components(b, k)
    cosines = torch.linalg.svdvals(u_a.T @ u_b).clamp(0.0, 1.0)
    return torch.arccos(cosines)


def subspace_overlap(a: torch.Tensor, b: torch.Tensor, k: int) -> float:
    """Mean squared cosine of the ``k`` :func:`principal_angles`, ``||U_a^T
    U_b||_F^2 / k``, in ``[0, 1]``.

    1 when the two top-``k`` subspaces coincide, 0 when they are orthogonal; two
    random ``k``-dimensional subspaces of ``R^D`` give ``k / D`` on average.
    """
    return float((torch.cos(principal_angles(a, b, k)) ** 2).mean())


def variance_in_subspace(x: torch.Tensor, basis_rows: torch.Tensor, k: int) -> float:
    """Fraction of the variance of the rows of ``x`` ``(n, D)`` that lies in the
    top-``k`` principal subspace of the rows of ``basis_rows`` ``(m, D)``.

    ``||x_c U||_F^2 / ||x_c||_F^2`` with ``x_c`` the centred rows and ``U`` ``(D, k)``
    from :func:`principal_components`. A random ``k``-dimensional subspace of ``R^D``
    holds ``k / D`` of it on average.
    """
    _, basis, _ = principal_components(basis_rows, k)
    x = x.detach().to(torch.float64)
    x = x - x.mean(0)
    return float((x @ basis).pow(2).sum() / x.pow(2).sum())
