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

from .contract import check_flag as _check_flag
from .contract import check_int as _check_int
from .contract import check_real as _check_real
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
# Checks of the arguments: each error names the function, the argument, what was
# expected and what came
# --------------------------------------------------------------------------------------
def _check_tensor(fn: str, name: str, t, dims: int | None = None) -> None:
    """``t`` is a floating-point tensor (``TypeError``), with ``dims`` dimensions when
    given (``ValueError``)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{fn}: {name} must be a floating-point tensor, got {t.dtype}")
    if dims is not None and t.dim() != dims:
        raise ValueError(
            f"{fn}: {name} must have {dims} dimensions, got shape {tuple(t.shape)}"
        )


def _check_positions(fn: str, positions, like: torch.Size | None = None) -> None:
    """``positions``: a tensor of integer or (finite) float positions, broadcasting to
    ``like`` (the shape of the vectors without their last dimension) when given."""
    if not isinstance(positions, torch.Tensor):
        raise TypeError(
            f"{fn}: positions must be a torch.Tensor of integer or float positions, "
            f"got {type(positions).__name__}"
        )
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(
            f"{fn}: positions must be integer or float, got {positions.dtype}"
        )
    if positions.is_floating_point() and not torch.isfinite(positions).all():
        raise ValueError(f"{fn}: positions must be finite, got NaN or infinity")
    if like is not None:
        try:
            fits = torch.broadcast_shapes(positions.shape, like) == like
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(
                f"{fn}: positions of shape {tuple(positions.shape)} must broadcast to "
                f"the shape of x without its last dimension, {tuple(like)}"
            )


# --------------------------------------------------------------------------------------
# Absolute encodings, added to the token embeddings
# --------------------------------------------------------------------------------------
def _check_sinusoidal(n_positions, dim, base, dtype) -> tuple[int, int, float]:
    fn = "sinusoidal_encoding"
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{fn}: dtype must be a floating torch.dtype, got {dtype!r}")
    n_positions = _check_int(fn, "n_positions", n_positions, 0)
    if _check_int(fn, "dim", dim) % 2:
        raise ValueError(
            f"{fn}: dim must be a positive even number (sin/cos pairs), got {dim}"
        )
    return n_positions, dim, _check_real(fn, "base", base, above=0.0)


def sinusoidal_encoding(
    n_positions: int, dim: int, base: float = 10000.0, *, dtype=torch.float32
) -> torch.Tensor:
    r"""The Transformer's fixed encoding, shape ``(n_positions, dim)``.

    .. math::

        PE_{i, 2f} = \sin(\omega_f i), \quad PE_{i, 2f+1} = \cos(\omega_f i), \quad
        \omega_f = \text{base}^{-2f/\text{dim}}

    Wavelengths grow geometrically from ``2 pi`` to ``2 pi * base``. For each frequency
    the pair ``(sin, cos)`` at position ``i + k`` is a rotation of the pair at ``i`` by
    the angle ``omega_f k``, a linear map that depends on ``k`` only. Computed in
    float64 and returned in ``dtype``.
    """
    n_positions, dim, base = _check_sinusoidal(n_positions, dim, base, dtype)
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]
    omega = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)
    pe = torch.empty(n_positions, dim, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(position * omega)
    pe[:, 1::2] = torch.cos(position * omega)
    return pe.to(dtype)


class LearnedPositionalEmbedding(nn.Module):
    """A trained table of ``max_len`` position vectors (GPT-2, BERT):
    ``forward(positions) -> (..., dim)``.

    Positions ``>= max_len`` have no row, so the model cannot run on longer inputs: this
    raises a ``ValueError`` instead of the cryptic index error of ``nn.Embedding``.
    """

    def __init__(self, max_len: int, dim: int):
        super().__init__()
        fn = "LearnedPositionalEmbedding"
        max_len, dim = _check_int(fn, "max_len", max_len), _check_int(fn, "dim", dim)
        self.max_len, self.dim = max_len, dim
        self.weight = nn.Parameter(torch.randn(max_len, dim) * 0.02)

    def forward(self, positions: torch.Tensor | int) -> torch.Tensor:
        """``positions``: an int ``n`` (positions ``0..n-1``) or an integer tensor of
        positions."""
        fn = "LearnedPositionalEmbedding"
        if not isinstance(positions, torch.Tensor):
            n = _check_int(fn, "positions", positions, 0)
            positions = torch.arange(n, device=self.weight.device)
        if (
            positions.is_floating_point()
            or positions.is_complex()
            or (positions.dtype == torch.bool)
        ):
            raise TypeError(
                f"{fn}: positions must be an int or an integer tensor, got "
                f"{positions.dtype}"
            )
        if positions.numel() and (
            int(positions.max()) >= self.max_len or int(positions.min()) < 0
        ):
            raise ValueError(
                f"{fn}: positions must lie in [0, max_len={self.max_len}), got range "
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
    fn = "relative_positions"
    q_len = _check_int(fn, "q_len", q_len, 0)
    k_len = q_len if k_len is None else _check_int(fn, "k_len", k_len, 0)
    i = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    j = torch.arange(k_len, device=device)[None, :]
    return j - i


def _check_table(
    name: str,
    table: torch.Tensor,
    rows: int,
    dim: int,
    what="2*max_distance + 1",
    fn: str = "shaw_relative_attention",
) -> None:
    _check_tensor(fn, name, table)
    if table.dim() != 2 or table.shape != (rows, dim):
        raise ValueError(
            f"{fn}: {name} must have shape ({what}, head_dim) = ({rows}, {dim}), got "
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
    fn = "shaw_relative_attention"
    check_qkv(fn, q, k, v)
    k, v = grouped_kv(q, k, v)
    max_distance = _check_int(fn, "max_distance", max_distance, 0)
    is_causal = _check_flag(fn, "is_causal", is_causal)
    if scale is not None:
        scale = _check_real(fn, "scale", scale)
    d, L, S = q.shape[-1], q.shape[-2], k.shape[-2]
    _check_table("rel_k", rel_k, 2 * max_distance + 1, d)
    _check_table("rel_v", rel_v, 2 * max_distance + 1, v.shape[-1])
    rel_k, rel_v = rel_k.to(q.dtype), rel_v.to(q.dtype)  # like a float mask: q's dtype
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
    fn = "untied_scores"
    _check_tensor(fn, "x", x)
    _check_tensor(fn, "pos", pos, 2)
    if x.dim() < 2 or pos.shape != x.shape[-2:]:
        raise ValueError(
            f"{fn}: x must be (..., n, D) and pos (n, D), one row per position of x: "
            f"x {tuple(x.shape)}, pos {tuple(pos.shape)}"
        )
    D = x.shape[-1]
    for name, w in (("W_q", W_q), ("W_k", W_k), ("U_q", U_q), ("U_k", U_k)):
        _check_tensor(fn, name, w, 2)
    if (
        W_q.shape[0] != D
        or U_q.shape[0] != D
        or W_k.shape != W_q.shape
        or U_k.shape != U_q.shape
    ):
        raise ValueError(
            f"{fn}: W_q, W_k must both be (D, d) and U_q, U_k both (D, d') with D = "
            f"{D}, got W_q {tuple(W_q.shape)}, W_k {tuple(W_k.shape)}, U_q "
            f"{tuple(U_q.shape)}, U_k {tuple(U_k.shape)}"
        )
    pos, W_q, W_k, U_q, U_k = (t.to(x.dtype) for t in (pos, W_q, W_k, U_q, U_k))
    content = (x @ W_q) @ (x @ W_k).transpose(-2, -1)
    position = (pos @ U_q) @ (pos @ U_k).transpose(-2, -1)
    return content + position


def _check_qk(fn: str, q, k) -> None:
    """Queries ``(..., L, d)`` and keys ``(..., S, d)``: float tensors of one dtype and
    one width."""
    _check_tensor(fn, "q", q)
    _check_tensor(fn, "k", k)
    if q.dtype != k.dtype:
        raise TypeError(f"{fn}: q and k must share a dtype, got {q.dtype}, {k.dtype}")
    if q.dim() < 2 or k.dim() < 2 or q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"{fn}: q and k must be (..., L, d) and (..., S, d) with one d, got q "
            f"{tuple(q.shape)} and k {tuple(k.shape)}"
        )


def multiplicative_scores(
    q: torch.Tensor, k: torch.Tensor, rel: torch.Tensor, max_distance: int
) -> torch.Tensor:
    r"""Content scores multiplied by a learned function of the distance.

    .. math:: \tilde a_{ij} = (q_i \cdot k_j)\, \pi_{\min(|i - j|, k)}

    ``q``: ``(..., L, d)``, ``k``: ``(..., S, d)``, ``rel``: ``(max_distance + 1,)`` one
    scalar per distance. Unlike an additive bias, the factor rescales the content score:
    a distance with ``pi = 0`` removes content from the logit entirely.
    """
    fn = "multiplicative_scores"
    _check_qk(fn, q, k)
    max_distance = _check_int(fn, "max_distance", max_distance, 0)
    _check_tensor(fn, "rel", rel)
    if rel.shape != (max_distance + 1,):
        raise ValueError(
            f"{fn}: rel must have shape (max_distance + 1,) = ({max_distance + 1},), "
            f"got {tuple(rel.shape)}"
        )
    rel = rel.to(q.dtype)
    distance = (
        relative_positions(q.shape[-2], k.shape[-2], device=q.device)
        .abs()
        .clamp(max=max_distance)
    )
    return (q @ k.transpose(-2, -1)) * rel[distance]


def _check_disentangled(q, k, q_pos, k_pos, max_distance, convention) -> int:
    fn = "disentangled_scores"
    if convention not in ("released", "paper"):
        raise ValueError(
            f"{fn}: convention must be 'released' or 'paper', got {convention!r}"
        )
    _check_qk(fn, q, k)
    n, d = q.shape[-2], q.shape[-1]
    if k.shape[-2] != n:
        raise ValueError(
            f"{fn} is self-attention: q {tuple(q.shape)} and k "
            f"{tuple(k.shape)} need equal lengths"
        )
    max_distance = _check_int(fn, "max_distance", max_distance, 1)
    _check_table("q_pos", q_pos, 2 * max_distance, d, "2*max_distance", fn)
    _check_table("k_pos", k_pos, 2 * max_distance, d, "2*max_distance", fn)
    return max_distance


def disentangled_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    max_distance: int,
    *,
    convention: str = "released",
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

    ``convention`` says which row the position-to-content term reads. ``"paper"``: the
    formula above, ``q^r_{delta(j, i)}``. ``"released"`` (the default): the released
    DeBERTa code, and Hugging Face's port that loads its checkpoints, index it with
    ``delta(i, j)``, the same row as the content-to-position term, so a table trained
    there must be read that way. For ``|i - j| < k`` the two rows mirror each other
    (``delta(j, i) = 2k - delta(i, j)``).
    """
    max_distance = _check_disentangled(q, k, q_pos, k_pos, max_distance, convention)
    n = q.shape[-2]
    q_pos, k_pos = q_pos.to(q.dtype), k_pos.to(q.dtype)
    i_minus_j = -relative_positions(n, n, device=q.device)
    delta_ij = i_minus_j.clamp(-max_distance, max_distance - 1) + max_distance
    content = q @ k.transpose(-2, -1)
    c2p = torch.einsum("...id,ijd->...ij", q, k_pos[delta_ij])
    # the paper: delta(j, i) at entry (i, j); the released code: delta(i, j)
    delta_p2c = delta_ij.T if convention == "paper" else delta_ij
    p2c = torch.einsum("...jd,ijd->...ij", k, q_pos[delta_p2c])
    return content + c2p + p2c


def transformer_xl_relative_embeddings(n: int, dim: int) -> torch.Tensor:
    """Transformer-XL's fixed relative embeddings ``R_delta`` for distances ``delta = 0
    .. n-1``, shape ``(n, dim)`` (Dai et al., 2019).

    They are the sinusoidal table of :func:`sinusoidal_encoding` indexed by distance
    instead of absolute position. Each head projects them with its own ``W_R``
    (``r = R @ W_R``, shape ``(n, d)`` per head) before :func:`transformer_xl_scores`.
    """
    fn = "transformer_xl_relative_embeddings"
    n = _check_int(fn, "n", n, 0)
    if _check_int(fn, "dim", dim) % 2:
        raise ValueError(
            f"{fn}: dim must be a positive even number (sin/cos pairs), got {dim}"
        )
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
    fn = "transformer_xl_scores"
    _check_qk(fn, q, k)
    if q.dim() < 3 or k.dim() != q.dim():
        raise ValueError(
            f"{fn}: q and k must be (..., H, L, d) and (..., H, S, d), got "
            f"{tuple(q.shape)} and {tuple(k.shape)}"
        )
    H, L, d = q.shape[-3:]
    S = k.shape[-2]
    if k.shape[-3] != H or k.shape[-1] != d or S < L:
        raise ValueError(
            f"{fn}: k must be (..., H={H}, S >= L={L}, d={d}), got {tuple(k.shape)}"
        )
    for name, t, shape, what in (
        ("r", r, (H, S, d), "(H, S, d)"),
        ("u", u, (H, d), "(H, d)"),
        ("v", v, (H, d), "(H, d)"),
    ):
        _check_tensor(fn, name, t)
        if t.shape != shape:
            raise ValueError(
                f"{fn}: {name} must have shape {what} = {shape}, got {tuple(t.shape)}"
            )
    r, u, v = r.to(q.dtype), u.to(q.dtype), v.to(q.dtype)
    return_terms = _check_flag(fn, "return_terms", return_terms)
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
def _t5_buckets(
    fn: str, bidirectional: bool, num_buckets: int, max_distance: int
) -> tuple[int, int]:
    """Check T5's bucketing settings; returns ``(buckets per direction, max_exact)``."""
    bidirectional = _check_flag(fn, "bidirectional", bidirectional)
    num_buckets = _check_int(fn, "num_buckets", num_buckets)
    max_distance = _check_int(fn, "max_distance", max_distance)
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    max_exact = per_direction // 2
    how = (
        f"num_buckets={num_buckets}, bidirectional={bidirectional}: {per_direction} "
        f"buckets per direction, the first max_exact = {per_direction} // 2 exact"
    )
    if max_exact < 1:
        raise ValueError(
            f"{fn}: num_buckets={num_buckets} is too small, max_exact = {max_exact} "
            f"({how}); use num_buckets >= {4 if bidirectional else 2}"
        )
    if max_distance <= max_exact:
        raise ValueError(
            f"{fn}: max_distance={max_distance} must be greater than max_exact="
            f"{max_exact} ({how}): the log-spaced buckets span distances max_exact .. "
            f"max_distance. Use max_distance > {max_exact} or fewer num_buckets"
        )
    return per_direction, max_exact


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

    ``max_exact = B/2`` (``num_buckets // 4`` bidirectional, ``num_buckets // 2``
    causal) must be at least 1 and ``max_distance`` greater than ``max_exact``: the
    log-spaced buckets span the distances from ``max_exact`` to ``max_distance``, and
    with ``max_distance <= max_exact`` the formula divides by ``log(max_distance /
    max_exact) <= 0`` (negative buckets, buckets of the other direction); that raises
    ``ValueError``.

    The logarithm is taken in float32, as in the released T5 code (and Hugging Face's),
    so that trained checkpoints get the buckets they were trained with: where the
    formula lands exactly on an integer, rounding can put a distance one bucket low
    (34 buckets, ``max_distance=27``, offset -18: 13, not 14). T5's own settings (32
    buckets, 128) have no such distance.
    """
    fn = "t5_relative_position_bucket"
    num_buckets, max_exact = _t5_buckets(fn, bidirectional, num_buckets, max_distance)
    relative_position = torch.as_tensor(relative_position)
    if (
        relative_position.is_floating_point()
        or relative_position.is_complex()
        or relative_position.dtype == torch.bool
    ):
        raise TypeError(
            f"{fn}: relative_position must be an integer tensor, got "
            f"{relative_position.dtype}"
        )
    bucket = torch.zeros_like(relative_position, dtype=torch.long)
    if bidirectional:
        bucket = bucket + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp(min=0)
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
        fn = "T5RelativeBias"
        n_heads = _check_int(fn, "n_heads", n_heads)
        _t5_buckets(
            fn, bidirectional, num_buckets, max_distance
        )  # fail here, not later
        self.n_heads, self.num_buckets = n_heads, int(num_buckets)
        self.max_distance, self.bidirectional = int(max_distance), bool(bidirectional)
        self.bias = nn.Embedding(num_buckets, n_heads)

    def forward(self, q_len: int, k_len: int | None = None) -> torch.Tensor:
        q_len = _check_int("T5RelativeBias", "q_len", q_len, 0)
        if k_len is not None:
            k_len = _check_int("T5RelativeBias", "k_len", k_len, 0)
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
    n_heads = _check_int("alibi_slopes", "n_heads", n_heads)

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
    fn = "alibi_bias"
    n_heads = _check_int(fn, "n_heads", n_heads)
    q_len = _check_int(fn, "q_len", q_len, 0)
    k_len = q_len if k_len is None else _check_int(fn, "k_len", k_len, 0)
    is_causal = _check_flag(fn, "is_causal", is_causal)
    distance = relative_positions(q_len, k_len).abs().float()
    bias = -alibi_slopes(n_heads)[:, None, None] * distance
    if is_causal:
        bias = bias.masked_fill(~causal_mask(q_len, k_len), float("-inf"))
    return bias.unsqueeze(0)


# --------------------------------------------------------------------------------------
# Rotary embeddings
# --------------------------------------------------------------------------------------
def _check_rope_dim(fn: str, dim) -> int:
    if _check_int(fn, "dim", dim) % 2:
        raise ValueError(
            f"{fn}: dim must be a positive even number (RoPE rotates pairs), got {dim}"
        )
    return int(dim)


def _check_factor(fn: str, factor) -> float:
    factor = _check_real(fn, "scaling factor", factor)
    if factor < 1.0:
        raise ValueError(f"{fn}: scaling factor must be >= 1, got {factor}")
    return factor


def _check_yarn(fn, dim, base, factor, L0, beta_fast, beta_slow):
    """YaRN's settings: ``dim`` even, ``base > 1`` (the ramp counts turns with ``log
    base``), ``factor >= 1``, ``L0 >= 1``, ``0 < beta_slow < beta_fast``."""
    dim = _check_rope_dim(fn, dim)
    base = _check_real(fn, "base", base, above=1.0)
    factor = _check_factor(fn, factor)
    L0 = _check_int(fn, "original_max_position_embeddings", L0)
    beta_fast = _check_real(fn, "beta_fast", beta_fast, above=0.0)
    beta_slow = _check_real(fn, "beta_slow", beta_slow, above=0.0)
    if not beta_slow < beta_fast:
        raise ValueError(
            f"{fn}: beta_slow must be smaller than beta_fast (turns in the trained "
            f"context), got beta_fast={beta_fast}, beta_slow={beta_slow}"
        )
    return dim, base, factor, L0, beta_fast, beta_slow


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

    ``attention_scaling = 0.1 ln(s) + 1`` (1 when ``s = 1``). Requires an even ``dim``,
    ``base > 1``, ``factor >= 1`` and ``0 < beta_slow < beta_fast``.
    """
    fn = "yarn_inv_freq"
    dim, base, factor, L0, beta_fast, beta_slow = _check_yarn(
        fn, dim, base, factor, original_max_position_embeddings, beta_fast, beta_slow
    )
    if ramp not in ("released", "paper"):
        raise ValueError(f"{fn}: ramp must be 'released' or 'paper', got {ramp!r}")
    inv_freq = base ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    L0 = float(L0)
    if ramp == "released":

        def pair_turning(n: float) -> float:  # the pair index that turns n times in L0
            return dim * math.log(L0 / (n * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(pair_turning(beta_fast)), 0)
        high = min(math.ceil(pair_turning(beta_slow)), dim - 1)
        high = high + 0.001 if low == high else high
        f = torch.arange(dim // 2, dtype=torch.float64)
        gamma = 1 - ((f - low) / (high - low)).clamp(0.0, 1.0)
    else:  # "paper"
        turns = L0 * inv_freq / (2 * math.pi)
        gamma = ((turns - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0)
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
    (integer or float, broadcasting to ``x.shape[:-1]``) default to ``offset, offset +
    1, ...`` (``offset`` = tokens already in a KV cache); give one or the other.
    Returns the rotated ``x`` in its dtype.

    Precision: ``inv_freq`` stays float32 when the module is cast to float16 or
    bfloat16 (``.half()``, ``.to(torch.bfloat16)`` round a buffer, and a bfloat16
    frequency is off by up to 0.4%: 1.75 rad at position 4000; ``.double()`` makes it
    float64), angles ``positions * inv_freq`` are computed in that dtype (integer
    positions converted first), and the rotation is applied in float32 (float64 for
    float64 ``x``) and rounded to ``x``'s dtype once.
    """

    def __init__(
        self,
        dim: int,
        base: float = 10000.0,
        interleaved: bool = False,
        scaling: dict | None = None,
    ):
        super().__init__()
        fn = "RotaryEmbedding"
        dim = _check_rope_dim(fn, dim)
        base = _check_real(fn, "base", base, above=0.0)
        interleaved = _check_flag(fn, "interleaved", interleaved)
        self.dim, self.base, self.interleaved, self.scaling = (
            dim,
            base,
            interleaved,
            scaling,
        )
        exponent = torch.arange(0, dim, 2, dtype=torch.float64) / dim
        inv_freq = base**-exponent
        self.attention_scaling = 1.0
        kind, factor = _check_scaling(fn, scaling)
        if kind == "linear":
            inv_freq = inv_freq / factor
        elif kind == "ntk":
            inv_freq = (
                (base * factor ** (dim / (dim - 2))) ** -exponent
                if dim > 2
                else inv_freq / factor
            )
        elif kind == "yarn":
            inv_freq, self.attention_scaling = yarn_inv_freq(
                dim,
                base,
                factor,
                scaling["original_max_position_embeddings"],
                beta_fast=scaling.get("beta_fast", 32.0),
                beta_slow=scaling.get("beta_slow", 1.0),
                ramp=scaling.get("ramp", "released"),
            )
        # float64 master copy: not a buffer, so no cast of the module rounds it
        self._inv_freq64 = inv_freq
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def _apply(self, fn, *args, **kwargs):
        """``.to()``, ``.half()``, ``.cuda()``... move ``inv_freq`` and rebuild it from
        the float64 master copy: float32, or float64 in a module cast to float64, never
        float16/bfloat16 (such a cast would round it)."""
        super()._apply(fn, *args, **kwargs)
        wide = self.inv_freq.dtype == torch.float64
        dtype = torch.float64 if wide else torch.float32
        self.inv_freq = self._inv_freq64.to(self.inv_freq.device, dtype)
        return self

    def angles(self, positions: torch.Tensor) -> torch.Tensor:
        """Rotation angles ``positions[..., None] * inv_freq``: shape ``(..., dim/2)``,
        in float32 (float64 in a module cast to float64); integer positions are
        converted to that dtype first, never multiplied as integers."""
        _check_positions("RotaryEmbedding.angles", positions)
        inv_freq = self.inv_freq
        if inv_freq.dtype not in (torch.float32, torch.float64):  # cast by other means
            inv_freq = self._inv_freq64.to(inv_freq.device, torch.float32)
        return positions.to(inv_freq.device, inv_freq.dtype)[..., None] * inv_freq

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, offset: int = 0
    ) -> torch.Tensor:
        # the positions given, or offset, offset + 1, ... (checked)
        positions = self._positions(x, positions, offset)
        theta = self.angles(positions)  # (..., seq, dim/2), float32
        work = torch.promote_types(x.dtype, torch.float32)  # rotate in float32 at least
        cos = (torch.cos(theta) * self.attention_scaling).to(work)
        sin = (torch.sin(theta) * self.attention_scaling).to(work)
        if self.interleaved:
            x1, x2 = x[..., 0::2].to(work), x[..., 1::2].to(work)
            out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
            return out.flatten(-2).to(x.dtype)
        x1, x2 = x[..., : self.dim // 2].to(work), x[..., self.dim // 2 :].to(work)
        out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        return out.to(x.dtype)  # one rounding to x's dtype

    def _positions(self, x, positions, offset) -> torch.Tensor:
        """:meth:`forward`'s arguments checked, and its positions on ``x``'s device:
        the given ones, else ``offset, offset + 1, ...``."""
        fn = "RotaryEmbedding"
        _check_tensor(fn, "x", x)
        if x.dim() < 1 or x.shape[-1] != self.dim:
            raise ValueError(
                f"{fn}: x must have last dimension dim={self.dim}, got shape "
                f"{tuple(x.shape)}"
            )
        if isinstance(offset, torch.Tensor) and offset.dim() == 0:
            offset = offset.item()  # a 0-d tensor from a cache's length
        offset = _check_int(fn, "offset", offset, 0)
        if positions is None:
            if x.dim() < 2:
                raise ValueError(
                    f"{fn}: x must be (..., seq, dim) when positions are not given, "
                    f"got shape {tuple(x.shape)}"
                )
            return torch.arange(offset, offset + x.shape[-2], device=x.device)
        if offset:
            raise ValueError(
                f"{fn}: give positions or offset, not both (got offset={offset} and "
                "positions)"
            )
        _check_positions(fn, positions, x.shape[:-1])
        return positions.to(x.device)


def _check_scaling(fn: str, scaling) -> tuple[str | None, float]:
    """RoPE's ``scaling`` dict: its type (None without scaling) and factor, each key
    known (a misspelt key would otherwise be ignored in silence)."""
    if scaling is None:
        return None, 1.0
    if not isinstance(scaling, dict):
        raise TypeError(
            f"{fn}: scaling must be a dict or None, got {type(scaling).__name__}"
        )
    kind = scaling.get("type")
    keys = {"linear": {"type", "factor"}, "ntk": {"type", "factor"}}
    keys["yarn"] = keys["linear"] | {
        "original_max_position_embeddings",
        "beta_fast",
        "beta_slow",
        "ramp",
    }
    if kind is None:
        raise ValueError(
            f"{fn}: scaling needs a 'type' of 'linear', 'ntk' or 'yarn', got {scaling}"
        )
    if kind not in keys:
        raise ValueError(
            f"{fn}: unknown scaling type {kind!r}; use 'linear', 'ntk' or 'yarn'"
        )
    unknown = sorted(set(scaling) - keys[kind], key=str)
    if unknown:
        raise ValueError(
            f"{fn}: unknown key(s) {unknown} in {kind} scaling; expected "
            f"{sorted(keys[kind])}"
        )
    if "factor" not in scaling:
        raise ValueError(f"{fn}: {kind} scaling needs a 'factor', got {scaling}")
    factor = _check_factor(fn, scaling["factor"])
    if kind == "yarn" and "original_max_position_embeddings" not in scaling:
        raise ValueError(
            f"{fn}: yarn scaling needs 'original_max_position_embeddings' (the "
            "trained context length)"
        )
    return kind, factor


def _check_rope_complex(x, positions, base, interleaved) -> tuple[float, bool]:
    fn = "rope_complex"
    _check_tensor(fn, "x", x)
    if x.dim() < 1 or x.shape[-1] == 0 or x.shape[-1] % 2:
        raise ValueError(
            f"{fn}: x must have an even, positive last dimension, got {tuple(x.shape)}"
        )
    _check_positions(fn, positions, x.shape[:-1])
    base = _check_real(fn, "base", base, above=0.0)
    return base, _check_flag(fn, "interleaved", interleaved)


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
    (``interleaved=True``). ``x``: ``(..., seq, dim)``; ``positions``: ``(seq,)``
    (integer or float; any shape broadcasting to ``x.shape[:-1]``). Returns the rotated
    ``x``, same shape and dtype.
    """
    base, interleaved = _check_rope_complex(x, positions, base, interleaved)
    dim = x.shape[-1]
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
def _check_matrix(fn: str, name: str, x, width: int | None = None) -> None:
    """``x``: a real ``(n, D)`` matrix of row vectors (``D = width`` when given)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.is_complex() or x.dtype == torch.bool:
        raise TypeError(f"{fn}: {name} must be a real tensor, got {x.dtype}")
    if x.dim() != 2 or (width is not None and x.shape[1] != width):
        want = "(n, D)" if width is None else f"(n, {width})"
        raise ValueError(
            f"{fn}: {name} must be a {want} matrix of row vectors, got {tuple(x.shape)}"
        )


def principal_components(
    x: torch.Tensor, k: int, *, center: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PCA of the rows of ``x`` ``(n, D)``: ``(coords (n, k), basis (D, k),
    explained (k,))``.

    ``basis`` holds the top ``k`` right singular vectors of the (centred) rows as
    orthonormal columns, ``coords = x_c @ basis`` and ``explained`` is each
    component's fraction of the total variance. Computed in float64.
    """
    fn = "principal_components"
    _check_matrix(fn, "x", x)
    center = _check_flag(fn, "center", center)
    x = x.detach().to(torch.float64)
    x = x - x.mean(0) if center else x
    rank = min(x.shape[0] - int(center), x.shape[1])
    k = _check_int(fn, "k", k)
    if not 1 <= k <= rank:
        raise ValueError(
            f"{fn}: k must lie in [1, {rank}] for x of shape {tuple(x.shape)}, got {k}"
        )
    _, sv, vh = torch.linalg.svd(x, full_matrices=False)
    basis = vh[:k].T
    return x @ basis, basis, sv[:k] ** 2 / (sv**2).sum()


def _check_subspaces(fn: str, a, b, k) -> None:
    """Two real matrices of rows of one width, each with a top-``k`` subspace."""
    _check_matrix(fn, "a", a)
    _check_matrix(fn, "b", b, a.shape[1])
    k = _check_int(fn, "k", k)
    rank = min(a.shape[0] - 1, b.shape[0] - 1, a.shape[1])
    if not 1 <= k <= rank:
        raise ValueError(
            f"{fn}: k must lie in [1, {rank}] for a {tuple(a.shape)} and b "
            f"{tuple(b.shape)} (centred rows), got {k}"
        )


def principal_angles(a: torch.Tensor, b: torch.Tensor, k: int) -> torch.Tensor:
    """Principal angles (radians, ascending) between the top-``k`` principal
    subspaces of the rows of ``a`` ``(n_a, D)`` and of ``b`` ``(n_b, D)``.

    They are the ``arccos`` of the singular values of ``U_a^T U_b``, with ``U`` the
    orthonormal bases of :func:`principal_components`: 0 for a shared direction,
    ``pi/2`` for orthogonal ones.
    """
    _check_subspaces("principal_angles", a, b, k)
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
    _check_subspaces("subspace_overlap", a, b, k)
    return float((torch.cos(principal_angles(a, b, k)) ** 2).mean())


def variance_in_subspace(x: torch.Tensor, basis_rows: torch.Tensor, k: int) -> float:
    """Fraction of the variance of the rows of ``x`` ``(n, D)`` that lies in the
    top-``k`` principal subspace of the rows of ``basis_rows`` ``(m, D)``.

    ``||x_c U||_F^2 / ||x_c||_F^2`` with ``x_c`` the centred rows and ``U`` ``(D, k)``
    from :func:`principal_components`. A random ``k``-dimensional subspace of ``R^D``
    holds ``k / D`` of it on average. ``x`` must vary (``ValueError`` otherwise: the
    fraction would be 0 / 0).
    """
    fn = "variance_in_subspace"
    _check_matrix(fn, "basis_rows", basis_rows)
    _check_matrix(fn, "x", x, basis_rows.shape[1])
    _, basis, _ = principal_components(basis_rows, k)
    x = x.detach().to(torch.float64)
    x = x - x.mean(0)
    total = x.pow(2).sum()
    if not total > 0:
        raise ValueError(
            f"{fn}: the rows of x {tuple(x.shape)} do not vary (all equal, or fewer "
            "than 2), so the fraction of their variance is undefined"
        )
    return float((x @ basis).pow(2).sum() / total)
