"""Linear and low-rank attention: shrink the attention matrix, or never build it.

Papers: Liu et al. (2018) for memory-compressed attention; Wang et al. (2020) for the
Linformer; Katharopoulos et al. (2020) for linear attention and "transformers are RNNs";
Schlag et al. (2021) for linear attention as a fast-weight programmer and its delta
rule; Choromanski et al. (2021) for the Performer's FAVOR+ positive orthogonal random
features.

Two families, read top to bottom:

* **Low rank.** Keep softmax attention but give it fewer keys: ``n`` keys and values
  become ``k`` (a strided convolution in memory-compressed attention, ``k = n / s``;
  learned ``(k, n)`` projections in the Linformer, ``k`` fixed). Scores are ``(L, k)``
  instead of ``(L, n)``.
* **Kernels.** Write the softmax weight ``exp(q.k)`` as a similarity ``phi(q) . phi(k)``
  and use associativity: ``(phi(Q) phi(K)^T) V = phi(Q) (phi(K)^T V)``. The right-hand
  side never forms an ``L x S`` matrix and costs ``O(n M Ev)`` for ``M`` features. With
  ``phi = elu + 1`` this is a *different* attention (linear attention); with the
  Performer's random features it is an unbiased estimate of softmax attention. Causally,
  the sums become prefix sums, i.e. an RNN whose state is ``(S_i, z_i) = (sum_{j<=i}
  phi(k_j) v_j^T, sum_{j<=i} phi(k_j))``. That state is a matrix of *fast weights*
  written by the sequence and read by ``phi(q_i)``; the delta rule overwrites what it
  stores under a key instead of adding to it.

Shapes follow :mod:`attnbook.core`: ``q (..., L, E)``, ``k (..., S, E)``, ``v (..., S,
Ev)``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .contract import check_qkv, grouped_kv
from .core import causal_mask, scaled_dot_product_attention

__all__ = [
    "compress_sequence",
    "memory_compressed_attention",
    "MemoryCompressedAttention",
    "linformer_attention",
    "LinformerAttention",
    "elu_feature_map",
    "linear_attention_weights",
    "linear_attention",
    "linear_attention_step",
    "linear_attention_recurrent",
    "delta_rule_attention",
    "orthogonal_random_features",
    "performer_features",
    "performer_attention",
]

FeatureMap = Callable[[torch.Tensor], torch.Tensor]


# --------------------------------------------------------------------------------------
# Low rank 1: memory-compressed attention (Liu et al., 2018)
# --------------------------------------------------------------------------------------
def compress_sequence(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Strided 1-D convolution along the sequence with stride = kernel size ``s``.

    ``x``: ``(..., S, E)``; ``weight``: ``(E_out, E, s)`` (an ``nn.Conv1d`` weight);
    ``bias``: ``(E_out,)``. Returns ``(..., ceil(S / s), E_out)``: row ``b`` is a
    learned weighted sum of rows ``b*s .. b*s + s - 1`` (a ragged last block is
    zero-padded, i.e. sums fewer rows).
    """
    if weight.dim() != 3 or weight.shape[1] != x.shape[-1]:
        raise ValueError(
            f"weight must have shape (E_out, E={x.shape[-1]}, s), got "
            f"{tuple(weight.shape)} for x {tuple(x.shape)}"
        )
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(
            f"bias must have shape (E_out,) = ({weight.shape[0]},), got "
            f"{tuple(bias.shape)}"
        )
    s, S = weight.shape[-1], x.shape[-2]
    flat = x.reshape(-1, S, x.shape[-1]).transpose(1, 2)  # (N, E, S): conv1d's layout
    flat = F.pad(flat, (0, -S % s))  # ragged last block: zeros on the right
    # (N, ceil(S/s), E_out)
    out = F.conv1d(flat, weight, bias, stride=s).transpose(1, 2)
    return out.reshape(*x.shape[:-2], out.shape[-2], out.shape[-1])


def memory_compressed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    weight_k: torch.Tensor,
    weight_v: torch.Tensor,
    bias_k: torch.Tensor | None = None,
    bias_v: torch.Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    r"""Memory-compressed attention: softmax attention over keys and values shortened by
    a strided conv.

    .. math::

        \mathrm{softmax}\!\big(Q\,(\theta_k \circledast K)^\top /
        \sqrt{E}\big)\,(\theta_v \circledast V)

    ``weight_k``, ``weight_v``: ``(E, E, s)`` and ``(Ev, Ev, s)`` convolution weights,
    stride = kernel = ``s``, so the score matrix is ``(L, ceil(S/s))``: ``s`` times
    smaller. With ``is_causal``, query ``i`` (bottom-right aligned, as
    :func:`attnbook.core.causal_mask`) sees compressed block ``b`` only when every key
    in it is visible, i.e. ``(b + 1) s - 1 <= i + S - L``; queries that see no complete
    block return zeros. Returns ``(..., L, Ev)``.
    """
    check_qkv("memory_compressed_attention", q, k, v)
    k, v = grouped_kv(q, k, v)
    if weight_k.shape[-1] != weight_v.shape[-1]:
        raise ValueError(
            f"weight_k {tuple(weight_k.shape)} and weight_v {tuple(weight_v.shape)} "
            "need the same kernel size"
        )
    k_c = compress_sequence(k, weight_k, bias_k)
    v_c = compress_sequence(v, weight_v, bias_v)
    mask = None
    if is_causal:
        L, S, s = q.shape[-2], k.shape[-2], weight_k.shape[-1]
        # last key of each block
        last_key = torch.arange(k_c.shape[-2], device=q.device) * s + s - 1
        mask = last_key[None, :] <= torch.arange(L, device=q.device)[:, None] + (S - L)
    return scaled_dot_product_attention(q, k_c, v_c, mask, scale=scale)


class MemoryCompressedAttention(nn.Module):
    """Multi-head memory-compressed attention over ``(batch, seq, d_model)`` inputs.

    Projections as in :class:`attnbook.core.MultiHeadAttention`; keys and values of
    every head are then compressed by one ``Conv1d(head_dim, head_dim,
    kernel_size=stride, stride=stride)`` each, shared by the heads. (Liu et al. convolve
    the full ``d_model``-wide keys; sharing per head keeps the functional form
    :func:`memory_compressed_attention` per head and costs fewer parameters.)
    """

    def __init__(self, d_model: int, n_heads: int, stride: int = 3, bias: bool = True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(
                f"d_model={d_model} must be divisible by n_heads={n_heads}"
            )
        if stride < 1:
            raise ValueError(f"stride must be >= 1, got {stride}")
        self.d_model, self.n_heads, self.head_dim, self.stride = (
            d_model,
            n_heads,
            d_model // n_heads,
            stride,
        )
        self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.conv_k = nn.Conv1d(self.head_dim, self.head_dim, stride, stride=stride)
        self.conv_v = nn.Conv1d(self.head_dim, self.head_dim, stride, stride=stride)

    def forward(self, x: torch.Tensor, *, is_causal: bool = False) -> torch.Tensor:
        """``x``: ``(B, n, d_model)`` -> ``(B, n, d_model)``; the scores are ``(B, h, n,
        ceil(n / stride))``."""
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x must have shape (batch, seq, d_model={self.d_model}), got "
                f"{tuple(x.shape)}"
            )
        B, n, _ = x.shape
        q, k, v = (
            self.qkv_proj(x)
            .view(B, n, 3, self.n_heads, self.head_dim)
            .permute(2, 0, 3, 1, 4)
        )
        out = memory_compressed_attention(
            q,
            k,
            v,
            self.conv_k.weight,
            self.conv_v.weight,
            self.conv_k.bias,
            self.conv_v.bias,
            is_causal=is_causal,
        )
        return self.out_proj(out.transpose(1, 2).reshape(B, n, self.d_model))


# --------------------------------------------------------------------------------------
# Low rank 2: the Linformer (Wang et al., 2020)
# --------------------------------------------------------------------------------------
def linformer_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    E: torch.Tensor,
    F: torch.Tensor,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    r"""Linformer attention: project the ``n`` keys and values down to ``k`` rows, then
    attend.

    .. math:: \mathrm{softmax}\!\big(Q\,(E K)^\top / \sqrt{d}\big)\,(F V)

    ``E``, ``F``: ``(k, n)`` with ``n = S`` the key length; ``q (..., L, d)``, ``k (...,
    n, d)``, ``v (..., n, dv)``. The scores are ``(L, k)``: cost ``O(L k d)`` instead of
    ``O(L n d)``. Every projected key mixes *all* positions, so there is no causal
    version. Returns ``(..., L, dv)``.
    """
    check_qkv("linformer_attention", q, k, v)
    k, v = grouped_kv(q, k, v)
    n = k.shape[-2]
    for name, P in (("E", E), ("F", F)):
        if P.dim() != 2 or P.shape[1] != n:
            raise ValueError(
                f"{name} must have shape (k, n={n}) for k {tuple(k.shape)}, got "
                f"{tuple(P.shape)}"
            )
    return scaled_dot_product_attention(q, E @ k, F @ v, scale=scale)


class LinformerAttention(nn.Module):
    """Multi-head Linformer self-attention for sequences of exactly ``seq_len`` tokens.

    ``E`` and ``F`` are learned ``(proj_len, seq_len)`` parameters shared by the heads
    (the paper's "headwise sharing"), initialised ``N(0, 1 / proj_len)`` so that ``E K``
    is a random Johnson-Lindenstrauss projection before training.
    """

    def __init__(
        self, d_model: int, n_heads: int, seq_len: int, proj_len: int, bias: bool = True
    ):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(
                f"d_model={d_model} must be divisible by n_heads={n_heads}"
            )
        if not 1 <= proj_len <= seq_len:
            raise ValueError(
                f"proj_len must be in [1, seq_len={seq_len}], got {proj_len}"
            )
        self.d_model, self.n_heads, self.head_dim, self.seq_len = (
            d_model,
            n_heads,
            d_model // n_heads,
            seq_len,
        )
        self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.E = nn.Parameter(torch.randn(proj_len, seq_len) / math.sqrt(proj_len))
        self.F = nn.Parameter(torch.randn(proj_len, seq_len) / math.sqrt(proj_len))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``(B, seq_len, d_model)`` -> ``(B, seq_len, d_model)``; scores are
        ``(B, h, seq_len, proj_len)``."""
        if x.dim() != 3 or x.shape[1:] != (self.seq_len, self.d_model):
            raise ValueError(
                f"x must have shape (batch, seq_len={self.seq_len}, "
                f"d_model={self.d_model}), got {tuple(x.shape)}"
            )
        B, n, _ = x.shape
        q, k, v = (
            self.qkv_proj(x)
            .view(B, n, 3, self.n_heads, self.head_dim)
            .permute(2, 0, 3, 1, 4)
        )
        out = linformer_attention(q, k, v, self.E, self.F)
        return self.out_proj(out.transpose(1, 2).reshape(B, n, self.d_model))


# --------------------------------------------------------------------------------------
# Kernels 1: linear attention (Katharopoulos et al., 2020)
# --------------------------------------------------------------------------------------
def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """``phi(x) = elu(x) + 1``, elementwise: positive everywhere, so ``phi(q) . phi(k) >
    0`` like ``exp``."""
    return F.elu(x) + 1.0


def linear_attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    feature_map: FeatureMap = elu_feature_map,
    is_causal: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    r"""The ``(..., L, S)`` weights that linear attention applies, built the slow
    quadratic way.

    .. math::

        A_{ij} = \frac{\phi(q_i)\cdot\phi(k_j)}{\sum_{j'} \phi(q_i)\cdot\phi(k_{j'}) +
        \varepsilon}

    (sums over the keys ``j`` that query ``i`` may see). For pictures and checks only:
    :func:`linear_attention` gives ``A @ v`` without ever forming ``A``.
    """
    sim = feature_map(q) @ feature_map(k).transpose(-2, -1)
    if is_causal:
        sim = sim * causal_mask(q.shape[-2], k.shape[-2], device=q.device)
    return sim / (sim.sum(-1, keepdim=True) + eps)


def _kernel_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool,
    eps: float,
) -> torch.Tensor:
    """``phi_q (phi_k^T v) / (phi_q sum_j phi_k_j + eps)`` from features ``(..., L,
    M)``, ``(..., S, M)``."""
    if not is_causal:
        # (..., M, Ev): the whole "memory", independent of L
        kv = phi_k.transpose(-2, -1) @ v
        z = phi_k.sum(-2)  # (..., M)
        return (phi_q @ kv) / ((phi_q @ z.unsqueeze(-1)) + eps)
    # Causal: prefix sums S_t = sum_{j<t} phi(k_j) v_j^T, z_t = sum_{j<t} phi(k_j), with
    # S_0 = 0.
    L, S = phi_q.shape[-2], phi_k.shape[-2]
    kv = torch.cumsum(phi_k.unsqueeze(-1) * v.unsqueeze(-2), dim=-3)  # (..., S, M, Ev)
    z = torch.cumsum(phi_k, dim=-2)  # (..., S, M)
    kv = F.pad(kv, (0, 0, 0, 0, 1, 0))  # prepend the empty prefix S_0
    z = F.pad(z, (0, 0, 1, 0))
    # bottom-right alignment: query i sees keys j <= i + S - L, i.e. prefix index i + S
    # - L + 1
    idx = (torch.arange(L, device=phi_q.device) + S - L + 1).clamp(min=0)
    num = (phi_q.unsqueeze(-2) @ kv.index_select(-3, idx)).squeeze(-2)  # (..., L, Ev)
    den = (phi_q * z.index_select(-2, idx)).sum(-1, keepdim=True)  # (..., L, 1)
    return num / (den + eps)


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    feature_map: FeatureMap = elu_feature_map,
    is_causal: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    r"""Linear attention (Katharopoulos et al., 2020), by associativity: no ``L x S``
    matrix.

    .. math::

        \mathrm{out}_i = \frac{\phi(q_i)^\top \sum_j \phi(k_j) v_j^\top}{\phi(q_i)^\top
        \sum_j \phi(k_j) + \varepsilon}

    There is no ``1/sqrt(E)``: the similarity is ``phi(q) . phi(k)``, not ``exp(q . k /
    sqrt(E))``. ``feature_map`` maps ``(..., n, E)`` to positive ``(..., n, M)``
    features. Non-causal: time ``O((L + S) M Ev)``, memory ``O(M Ev)`` beyond inputs and
    output. Causal (bottom-right aligned, as :func:`attnbook.core.causal_mask`): the
    sums run over ``j <= i + S - L`` and become prefix sums (``torch.cumsum``), ``O(S M
    Ev)`` memory; a query that sees no key returns zeros. Equal to
    ``linear_attention_weights(q, k, ...) @ v``. Returns ``(..., L, Ev)``.
    """
    check_qkv("linear_attention", q, k, v)
    k, v = grouped_kv(q, k, v)
    return _kernel_attention(feature_map(q), feature_map(k), v, is_causal, eps)


def linear_attention_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    feature_map: FeatureMap = elu_feature_map,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    r"""One step of causal linear attention as an RNN (one new token).

    .. math::
        S_i = S_{i-1} + \phi(k_i) v_i^\top, \quad z_i = z_{i-1} + \phi(k_i), \quad
        \mathrm{out}_i = \frac{\phi(q_i)^\top S_i}{\phi(q_i)^\top z_i + \varepsilon}

    ``q``, ``k``: ``(..., E)``; ``v``: ``(..., Ev)`` (one token each). ``state = (S,
    z)`` with ``S`` ``(..., M, Ev)`` and ``z`` ``(..., M)``, zeros when ``None``.
    Returns ``(out (..., Ev), (S, z))``. The state has a fixed size, whatever the number
    of tokens seen: unlike a KV cache, it never grows.
    """
    phi_q, phi_k = feature_map(q), feature_map(k)
    if state is None:
        S = torch.zeros(*phi_k.shape, v.shape[-1], dtype=v.dtype, device=v.device)
        z = torch.zeros_like(phi_k)
    else:
        S, z = state
    S = S + phi_k.unsqueeze(-1) * v.unsqueeze(-2)
    z = z + phi_k
    out = (phi_q.unsqueeze(-2) @ S).squeeze(-2) / (
        (phi_q * z).sum(-1, keepdim=True) + eps
    )
    return out, (S, z)


def linear_attention_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    feature_map: FeatureMap = elu_feature_map,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Causal linear attention computed token by token with
    :func:`linear_attention_step` (the RNN form).

    ``q``, ``k``: ``(..., n, E)``; ``v``: ``(..., n, Ev)``, one query per key
    (self-attention). ``state``: the ``(S, z)`` left by an earlier call (continue a
    sequence), zeros when ``None``. Returns ``(out (..., n, Ev), (S, z))``; with
    ``state=None`` ``out`` equals ``linear_attention(q, k, v, feature_map=feature_map,
    is_causal=True, eps=eps)``. ``n`` sequential steps.
    """
    check_qkv("linear_attention_recurrent", q, k, v)
    k, v = grouped_kv(q, k, v)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"the recurrent form needs one query per key, got q {tuple(q.shape)} and "
            f"k {tuple(k.shape)}"
        )
    if q.shape[-2] == 0:
        raise ValueError(
            f"q, k and v must contain at least one token, got q {tuple(q.shape)}"
        )
    outs = []
    for i in range(q.shape[-2]):
        out, state = linear_attention_step(
            q[..., i, :],
            k[..., i, :],
            v[..., i, :],
            state,
            feature_map=feature_map,
            eps=eps,
        )
        outs.append(out)
    return torch.stack(outs, dim=-2), state


# --------------------------------------------------------------------------------------
# Fast weights: the delta rule (Schlag et al., 2021)
# --------------------------------------------------------------------------------------
def delta_rule_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor | float,
    *,
    feature_map: FeatureMap = elu_feature_map,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Causal linear attention with the delta rule: a fast-weight memory that can
    overwrite (Schlag et al., 2021).

    Linear attention adds ``phi(k_t) v_t^T`` to its state and never removes anything.
    The delta rule first reads what the memory returns for the key, then moves that
    value toward ``v_t`` by a step ``beta_t``:

    .. math::

        \bar v_t = S_{t-1}^\top f_t, \qquad
        S_t = S_{t-1} + \beta_t\, f_t\, (v_t - \bar v_t)^\top, \qquad
        \mathrm{out}_t = S_t^\top g_t,

    with unit-length features ``f_t = phi(k_t) / |phi(k_t)|`` and ``g_t = phi(q_t) /
    |phi(q_t)|``. In the paper's layout, with fast weights ``W_t = S_t^T``: ``W_t =
    W_{t-1} + beta_t (v_t - W_{t-1} f_t) f_t^T``. ``beta_t = 1`` replaces the value
    stored under ``f_t`` by ``v_t``, ``beta_t = 0`` leaves the memory as it is (Schlag
    et al. learn ``beta_t`` as a sigmoid). They scale features to sum 1; unit length
    makes ``beta_t = 1`` an exact overwrite. There is no denominator: the memory is read
    directly.

    ``q``, ``k``: ``(..., n, E)``; ``v``: ``(..., n, Ev)``, one query per key;
    ``beta``: ``(..., n)`` or anything that broadcasts to it (a float); ``state``: the
    ``(..., M, Ev)`` memory left by an earlier call, zeros when ``None``. Returns ``(out
    (..., n, Ev), S (..., M, Ev))``, in ``n`` sequential steps.
    """
    check_qkv("delta_rule_attention", q, k, v)
    k, v = grouped_kv(q, k, v)
    n = q.shape[-2]
    if k.shape[-2] != n or n == 0:
        raise ValueError(
            "the delta rule needs one query per key and at least one token, got q "
            f"{tuple(q.shape)} and k {tuple(k.shape)}"
        )
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    beta = torch.as_tensor(beta, dtype=v.dtype, device=v.device)
    try:
        beta = torch.broadcast_to(beta, (*batch, n))
    except RuntimeError:
        raise ValueError(
            f"beta must broadcast to (..., n) = {(*batch, n)}, got {tuple(beta.shape)}"
        ) from None
    f = F.normalize(feature_map(k), dim=-1)  # (..., n, M), unit rows
    g = F.normalize(feature_map(q), dim=-1)
    if state is None:
        state = v.new_zeros(*batch, f.shape[-1], v.shape[-1])
    outs = []
    for t in range(n):
        f_t = f[..., t, :].unsqueeze(-1)  # (..., M, 1)
        stored = (f_t.transpose(-2, -1) @ state).squeeze(-2)  # (..., Ev): v-bar
        delta = beta[..., t, None] * (v[..., t, :] - stored)
        state = state + f_t * delta.unsqueeze(-2)
        outs.append((g[..., t, :].unsqueeze(-2) @ state).squeeze(-2))
    return torch.stack(outs, dim=-2), state


# --------------------------------------------------------------------------------------
# Kernels 2: the Performer's FAVOR+ (Choromanski et al., 2021)
# --------------------------------------------------------------------------------------
def orthogonal_random_features(
    n_features: int,
    dim: int,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """``(n_features, dim)`` Gaussian projection with orthogonal rows within each block
    of ``dim``.

    Each block of ``dim`` rows is the ``Q`` of a QR decomposition of a Gaussian matrix
    (exactly orthogonal directions), and each row is rescaled to the norm of an
    independent ``N(0, I_dim)`` vector. So every row is marginally ``N(0, I_dim)``
    (keeping the estimate unbiased), while rows within a block are orthogonal (lowering
    its variance). ``n_features > dim`` stacks independent blocks; the last one is
    truncated.
    """
    if n_features < 1 or dim < 1:
        raise ValueError(
            f"n_features and dim must be positive, got n_features={n_features}, "
            f"dim={dim}"
        )
    gaussian = torch.randn(
        math.ceil(n_features / dim), dim, dim, generator=generator, dtype=torch.float64
    )
    Q, R = torch.linalg.qr(gaussian)  # a batch of independent blocks
    # Haar-distributed
    blocks = Q.transpose(-2, -1) * torch.sign(
        torch.diagonal(R, dim1=-2, dim2=-1)
    ).unsqueeze(-1)
    directions = blocks.reshape(-1, dim)[:n_features]
    norms = torch.randn(n_features, dim, generator=generator, dtype=torch.float64).norm(
        dim=1, keepdim=True
    )
    return (directions * norms).to(dtype=dtype, device=device)


def _log_performer_features(x: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """``W x~ - |x~|^2 / 2`` with ``x~ = x d^(-1/4)``: the logarithm of the positive
    features times ``sqrt(m)``."""
    if projection.dim() < 2 or projection.shape[-1] != x.shape[-1]:
        raise ValueError(
            f"projection must have shape (..., m, d={x.shape[-1]}), got "
            f"{tuple(projection.shape)}"
        )
    x = x * x.shape[-1] ** -0.25
    return (
        x @ projection.transpose(-2, -1).to(x.dtype) - (x * x).sum(-1, keepdim=True) / 2
    )


def performer_features(x: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    r"""FAVOR+ positive random features: ``phi(x) = exp(W x~ - |x~|^2 / 2) / sqrt(m)``,
    ``x~ = x d^(-1/4)``.

    ``x``: ``(..., n, d)``; ``projection`` ``W``: ``(m, d)`` with ``N(0, I)`` rows
    (:func:`orthogonal_random_features`), or a batch ``(..., m, d)`` of them that
    broadcasts against ``x`` (one per head, or per independent draw). Returns positive
    ``(..., n, m)`` features with

    .. math::

        \mathbb{E}_W\big[\phi(q)\cdot\phi(k)\big] = \exp\!\big(q\cdot k / \sqrt{d}\big),

    because ``E[exp(w.(a + b))] = exp(|a + b|^2 / 2)`` for ``w ~ N(0, I)`` and
    ``|a + b|^2 / 2 - |a|^2 / 2 - |b|^2 / 2 = a.b``.
    """
    return torch.exp(_log_performer_features(x, projection)) / math.sqrt(
        projection.shape[-2]
    )


def performer_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    n_features: int | None = None,
    projection: torch.Tensor | None = None,
    is_causal: bool = False,
    generator: torch.Generator | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    r"""Performer (FAVOR+) attention: linear attention with :func:`performer_features`.

    Estimates ``softmax(q k^T / sqrt(d)) v`` in ``O(n m d)`` time without an ``n x n``
    matrix. ``projection``: an ``(m, d)`` matrix; when ``None``, one is drawn with
    :func:`orthogonal_random_features` (``m = n_features``, default ``round(d ln d)``,
    the paper's suggestion) from ``generator``. Numerically, the features of each query
    are divided by their largest value and those of all keys by the keys' largest value:
    constant factors that cancel between the numerator and the denominator, but keep
    ``exp`` from overflowing. Returns ``(..., L, dv)``.
    """
    check_qkv("performer_attention", q, k, v)
    k, v = grouped_kv(q, k, v)
    d = q.shape[-1]
    if projection is None:
        m = max(1, round(d * math.log(d))) if n_features is None else n_features
        projection = orthogonal_random_features(
            m, d, generator=generator, device=q.device
        )
    elif n_features is not None and n_features != projection.shape[-2]:
        raise ValueError(
            f"n_features={n_features} disagrees with projection of shape "
            f"{tuple(projection.shape)}"
        )
    log_q = _log_performer_features(q, projection)
    log_k = _log_performer_features(k, projection)
    # per-query constant: cancels in the ratio
    phi_q = torch.exp(log_q - log_q.amax(-1, keepdim=True))
    # one constant for all keys: cancels
    phi_k = torch.exp(log_k - log_k.amax((-2, -1), keepdim=True))
    return _kernel_attention(phi_q, phi_k, v, is_causal, eps)
