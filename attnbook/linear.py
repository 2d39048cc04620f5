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
import numbers
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .contract import check_flag as _check_flag
from .contract import check_real as _check_number
from .contract import check_sizes as _check_sizes
from .contract import check_float, check_qkv, grouped_kv
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
# Argument checks: ValueError or TypeError naming the function, the argument, and what
# was expected and received (the rules of attnbook.contract)
# --------------------------------------------------------------------------------------
def _check_like(fn: str, like_name: str, like: torch.Tensor, **tensors) -> None:
    """Each tensor a floating tensor of ``like``'s dtype (any floating dtype under
    autocast, which casts) and device."""
    for name, t in tensors.items():
        check_float(fn, name, t)
        if t.dtype != like.dtype and not _autocast(like.device):
            raise TypeError(
                f"{fn}: {name} must have the dtype of {like_name}, {like.dtype}, got "
                f"{t.dtype}"
            )
        if t.device != like.device:
            raise ValueError(
                f"{fn}: {name} must be on {like_name}'s device, {like.device}, got "
                f"{t.device}"
            )


def _autocast(device: torch.device) -> bool:
    """Whether autocast is on for ``device``'s type (then mixed dtypes are cast)."""
    try:
        return torch.is_autocast_enabled(device.type)
    except TypeError:  # torch < 2.4
        if device.type == "cpu":
            return torch.is_autocast_cpu_enabled()
        return device.type == "cuda" and torch.is_autocast_enabled()


def _feature_pair(
    fn: str, feature_map: FeatureMap, q: torch.Tensor, k: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``feature_map(q)``, ``feature_map(k)``, checked: floating tensors of the inputs'
    dtype that keep every dimension but the last, with the same number ``M`` of
    features."""
    if not callable(feature_map):
        raise TypeError(f"{fn}: feature_map must be callable, got {feature_map!r}")
    phis = []
    for name, x in (("q", q), ("k", k)):
        phi = feature_map(x)
        if not isinstance(phi, torch.Tensor) or phi.dtype != x.dtype:
            got = phi.dtype if isinstance(phi, torch.Tensor) else type(phi).__name__
            raise TypeError(
                f"{fn}: feature_map({name}) must return a tensor of {name}'s dtype "
                f"{x.dtype}, got {got}"
            )
        if phi.dim() != x.dim() or phi.shape[:-1] != x.shape[:-1]:
            raise ValueError(
                f"{fn}: feature_map({name}) must map {name} {tuple(x.shape)} to "
                f"(..., M) features of shape {(*x.shape[:-1], 'M')}, got "
                f"{tuple(phi.shape)}"
            )
        phis.append(phi)
    if phis[0].shape[-1] != phis[1].shape[-1]:
        raise ValueError(
            f"{fn}: feature_map gives q {phis[0].shape[-1]} features and k "
            f"{phis[1].shape[-1]}; they must be the same M"
        )
    return phis[0], phis[1]


def _broadcasts(state_shape: tuple[int, ...], batch: tuple[int, ...]) -> bool:
    """Whether the batch dimensions of a ``(..., m, d)`` tensor broadcast with
    ``batch`` (either way: both may grow)."""
    try:
        torch.broadcast_shapes(state_shape[:-2], batch)
    except RuntimeError:
        return False
    return True


def _broadcasts_to(state_shape: tuple[int, ...], batch: tuple[int, ...]) -> bool:
    """Whether the batch dimensions of a ``(..., M, Ev)`` recurrent state broadcast
    *to* the tokens' ``batch``: each is missing, 1 (one memory shared by the tokens)
    or equal. A state of another batch size must not grow the batch instead, or the
    tokens would be read as one shared token (a silent wrong result)."""
    state_batch = tuple(state_shape[:-2])
    if len(state_batch) > len(batch):
        return False
    return all(s in (1, b) for s, b in zip(state_batch[::-1], batch[::-1]))


def _safe_ratio(num: torch.Tensor, den: torch.Tensor, eps: float) -> torch.Tensor:
    """``num / (den + eps)``, and 0 where that denominator is 0 (a query that sees no
    key, or whose similarities are all 0): never NaN, neither in the value nor in its
    gradient. With ``eps > 0`` and positive features the denominator is ``>= eps``."""
    if eps > 0:
        return num / (den + eps)
    zero = den == 0  # the guard works on the small den; num is only multiplied
    return num * den.masked_fill(zero, 1.0).reciprocal().masked_fill(zero, 0.0)


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
    zero-padded, i.e. sums fewer rows). ``S = 0`` gives no rows.
    """
    return _compress("compress_sequence", x, weight, bias, ("x", "weight", "bias"))


def _compress(
    fn: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    names: tuple[str, str, str],
) -> torch.Tensor:
    """:func:`compress_sequence`, with errors naming ``fn`` and the arguments
    ``names``."""
    x_name, w_name, b_name = names
    check_float(fn, x_name, x)
    _check_like(fn, x_name, x, **{w_name: weight})
    if bias is not None:
        _check_like(fn, x_name, x, **{b_name: bias})
    if x.dim() < 2:
        raise ValueError(
            f"{fn}: {x_name} must have shape (..., S, E), got {tuple(x.shape)}"
        )
    if weight.dim() != 3 or weight.shape[1] != x.shape[-1] or weight.shape[2] < 1:
        raise ValueError(
            f"{fn}: {w_name} must have shape (E_out, E={x.shape[-1]}, s) with kernel "
            f"size s >= 1, got {tuple(weight.shape)} for {x_name} {tuple(x.shape)}"
        )
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(
            f"{fn}: {b_name} must have shape (E_out,) = ({weight.shape[0]},), got "
            f"{tuple(bias.shape)}"
        )
    s, S = weight.shape[-1], x.shape[-2]
    if x.numel() == 0:  # no rows, no batch or E = 0: the sums are empty
        out = x.new_zeros(*x.shape[:-2], -(-S // s), weight.shape[0])
        return out if bias is None else out + bias
    # (N, E, S): conv1d's layout
    flat = x.reshape(math.prod(x.shape[:-2]), S, x.shape[-1]).transpose(1, 2)
    flat = F.pad(flat, (0, -S % s))  # ragged last block: zeros on the right
    # (N, ceil(S/s), E_out)
    out = F.conv1d(flat, weight, bias, stride=s).transpose(1, 2)
    return out.reshape(*x.shape[:-2], out.shape[-2], out.shape[-1])


def _check_compressed(fn, q, k, v, weight_k, weight_v, is_causal, scale) -> bool:
    """The checks of :func:`memory_compressed_attention` that :func:`_compress` does
    not make; returns ``is_causal`` as a bool."""
    check_qkv(fn, q, k, v)
    is_causal = _check_flag(fn, "is_causal", is_causal)
    if scale is not None:
        _check_number(fn, "scale", scale)
    weights = (weight_k, weight_v)
    if not all(isinstance(w, torch.Tensor) and w.dim() == 3 for w in weights):
        return is_causal  # _compress names what is wrong with them
    if weight_k.shape[0] != q.shape[-1] or weight_k.shape[-1] != weight_v.shape[-1]:
        raise ValueError(
            f"{fn}: weight_k must have shape (E, E, s) = ({q.shape[-1]}, "
            f"{q.shape[-1]}, s) and weight_v the same kernel size s, got weight_k "
            f"{tuple(weight_k.shape)} and weight_v {tuple(weight_v.shape)}"
        )
    return is_causal


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
    in it is visible. Block ``b`` holds keys ``bs .. min((b + 1) s, S) - 1`` (the last
    block is ragged when ``s`` does not divide ``S``), so the rule is ``min((b + 1) s,
    S) - 1 <= i + S - L``, and the last query sees every block. Queries that see no
    complete block return zeros. Returns ``(..., L, Ev)``.
    """
    fn = "memory_compressed_attention"
    is_causal = _check_compressed(fn, q, k, v, weight_k, weight_v, is_causal, scale)
    k, v = grouped_kv(q, k, v)
    k_c = _compress(fn, k, weight_k, bias_k, ("k", "weight_k", "bias_k"))
    v_c = _compress(fn, v, weight_v, bias_v, ("v", "weight_v", "bias_v"))
    mask = None
    if is_causal:
        L, S, s = q.shape[-2], k.shape[-2], weight_k.shape[-1]
        # last key of each block: a ragged last block ends at key S - 1
        blocks = torch.arange(k_c.shape[-2], device=q.device)
        last_key = ((blocks + 1) * s).clamp(max=S) - 1
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
        fn = "MemoryCompressedAttention"
        _check_sizes(fn, d_model=d_model, n_heads=n_heads, stride=stride)
        _check_flag(fn, "bias", bias)
        if d_model % n_heads:
            raise ValueError(
                f"{fn}: d_model={d_model} must be divisible by n_heads={n_heads}"
            )
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
        fn = "MemoryCompressedAttention.forward"
        _check_like(fn, "the layer's weights", self.out_proj.weight, x=x)
        _check_flag(fn, "is_causal", is_causal)
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"{fn}: x must have shape (batch, seq, d_model={self.d_model}), got "
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
def _check_linformer(q, k, v, E, F, scale) -> None:
    fn = "linformer_attention"
    check_qkv(fn, q, k, v)
    if scale is not None:
        _check_number(fn, "scale", scale)
    n = k.shape[-2]
    for name, P in (("E", E), ("F", F)):
        _check_like(fn, "q", q, **{name: P})
        if P.dim() != 2 or P.shape[1] != n or P.shape[0] < 1:
            raise ValueError(
                f"{fn}: {name} must have shape (k, n={n}) with k >= 1 for k "
                f"{tuple(k.shape)}, got {tuple(P.shape)}"
            )


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
    _check_linformer(q, k, v, E, F, scale)
    k, v = grouped_kv(q, k, v)
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
        fn = "LinformerAttention"
        _check_sizes(
            fn, d_model=d_model, n_heads=n_heads, seq_len=seq_len, proj_len=proj_len
        )
        _check_flag(fn, "bias", bias)
        if d_model % n_heads:
            raise ValueError(
                f"{fn}: d_model={d_model} must be divisible by n_heads={n_heads}"
            )
        if proj_len > seq_len:
            raise ValueError(
                f"{fn}: proj_len must be in [1, seq_len={seq_len}], got {proj_len}"
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
        fn = "LinformerAttention.forward"
        _check_like(fn, "the layer's weights", self.out_proj.weight, x=x)
        if x.dim() != 3 or x.shape[1:] != (self.seq_len, self.d_model):
            raise ValueError(
                f"{fn}: x must have shape (batch, seq_len={self.seq_len}, "
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
    0`` like ``exp``. Computed as ``x + 1`` for ``x > 0`` and ``exp(x)`` below, the
    same function: ``F.elu(x) + 1`` rounds to exactly 0 once ``exp(x)`` is lost beside
    the ``-1`` of ``elu`` (from about ``x = -16.6`` in float32 and ``-6.2`` in
    bfloat16), and a key's weight would vanish."""
    check_float("elu_feature_map", "x", x)
    return torch.where(x > 0, x + 1.0, torch.exp(x.clamp(max=0.0)))


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

    (sums over the keys ``j`` that query ``i`` may see; ``eps >= 0``). A row whose
    query sees no key (causal with ``L > S``, or ``S = 0``) is zeros, for every ``eps``.
    For pictures and checks only: :func:`linear_attention` gives ``A @ v`` without ever
    forming ``A``.
    """
    fn = "linear_attention_weights"
    check_qkv(fn, q, k, k)
    is_causal = _check_flag(fn, "is_causal", is_causal)
    eps = _check_number(fn, "eps", eps, minimum=0)
    k = grouped_kv(q, k, k)[0]
    phi_q, phi_k = _feature_pair(fn, feature_map, q, k)
    sim = phi_q @ phi_k.transpose(-2, -1)
    if is_causal:
        sim = sim * causal_mask(q.shape[-2], k.shape[-2], device=q.device)
    return _safe_ratio(sim, sim.sum(-1, keepdim=True), eps)


def _kernel_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool,
    eps: float,
) -> torch.Tensor:
    """``phi_q (phi_k^T v) / (phi_q sum_j phi_k_j + eps)`` from features ``(..., L,
    M)``, ``(..., S, M)``; 0 where the denominator is 0 (no visible key)."""
    if not is_causal:
        # (..., M, Ev): the whole "memory", independent of L
        kv = phi_k.transpose(-2, -1) @ v
        z = phi_k.sum(-2)  # (..., M)
        return _safe_ratio(phi_q @ kv, phi_q @ z.unsqueeze(-1), eps)
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
    return _safe_ratio(num, den, eps)


def _check_kernel_call(fn, q, k, v, is_causal, eps) -> tuple[bool, float]:
    """``q, k, v`` by the contract, ``is_causal`` a flag and ``eps >= 0``: returns
    ``(is_causal, eps)``."""
    check_qkv(fn, q, k, v)
    is_causal = _check_flag(fn, "is_causal", is_causal)
    return is_causal, _check_number(fn, "eps", eps, minimum=0)


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
    Ev)`` memory. ``eps >= 0``; a query that sees no key (causal with ``L > S``, or ``S
    = 0``) returns zeros, whatever ``eps``. Equal to ``linear_attention_weights(q, k,
    ...) @ v``. Returns ``(..., L, Ev)``.
    """
    fn = "linear_attention"
    is_causal, eps = _check_kernel_call(fn, q, k, v, is_causal, eps)
    k, v = grouped_kv(q, k, v)
    phi_q, phi_k = _feature_pair(fn, feature_map, q, k)
    return _kernel_attention(phi_q, phi_k, v, is_causal, eps)


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

    ``q``, ``k``: ``(..., E)``; ``v``: ``(..., Ev)``, one token each, batch ``B`` (the
    three broadcast). ``state = (S (..., M, Ev), z (..., M))``, zeros when ``None``,
    broadcasts to ``B`` (a size-1 or missing dimension shares one memory); a state of
    another batch size is a ``ValueError``. Returns ``(out (B, Ev), (S (B, M, Ev), z
    (B, M)))``: a fixed size, whatever the number of tokens seen (a KV cache grows).
    """
    phi_q, phi_k, (S, z), batch = _step_inputs(q, k, v, state, feature_map, eps)
    M, Ev = phi_k.shape[-1], v.shape[-1]  # the new S and z cover all of the batch B
    S = (S + phi_k.unsqueeze(-1) * v.unsqueeze(-2)).expand(*batch, M, Ev).contiguous()
    z = (z + phi_k).expand(*batch, M).contiguous()
    out = _safe_ratio(
        (phi_q.unsqueeze(-2) @ S).squeeze(-2), (phi_q * z).sum(-1, keepdim=True), eps
    )
    return out, (S, z)


def _step_inputs(q, k, v, state, feature_map, eps):
    """Check the arguments of :func:`linear_attention_step`; return ``phi(q)``,
    ``phi(k)``, the state (zeros when ``None``) and the tokens' batch shape."""
    fn = "linear_attention_step"
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(fn, name, t)
        if t.dim() < 1:
            raise ValueError(
                f"{fn}: {name} must have shape (..., width) for one token, got a "
                "0-d tensor"
            )
    _check_like(fn, "q", q, k=k, v=v)
    _check_number(fn, "eps", eps, minimum=0)
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{fn}: q and k must have the same last dimension: {shapes}")
    try:
        batch = torch.broadcast_shapes(q.shape[:-1], k.shape[:-1], v.shape[:-1])
    except RuntimeError:
        raise ValueError(
            f"{fn}: the batch dimensions do not broadcast: {shapes}"
        ) from None
    phi_q, phi_k = _feature_pair(fn, feature_map, q, k)
    if state is None:
        S = torch.zeros(*phi_k.shape, v.shape[-1], dtype=v.dtype, device=v.device)
        return phi_q, phi_k, (S, torch.zeros_like(phi_k)), batch
    return phi_q, phi_k, _check_state(fn, state, batch, phi_k.shape[-1], v), batch


def _check_state(
    fn: str, state, batch: tuple[int, ...], M: int, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A linear-attention state ``(S (..., M, Ev), z (..., M))`` in ``v``'s dtype and
    device, whose batch dimensions broadcast to the tokens' ``batch``."""
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise TypeError(
            f"{fn}: state must be a pair (S, z) or None, got {type(state).__name__}"
        )
    S, z = state
    _check_like(fn, "v", v, **{"state[0] (S)": S, "state[1] (z)": z})
    Ev = v.shape[-1]
    ok = S.dim() >= 2 and S.shape[-2:] == (M, Ev) and z.shape == S.shape[:-1]
    if not ok or not _broadcasts_to(S.shape, batch):
        raise ValueError(
            f"{fn}: state must be (S, z) with S of shape (..., M, Ev) = (..., {M}, "
            f"{Ev}) and z (..., M) = (..., {M}), batch dimensions broadcasting to "
            f"the tokens' batch {tuple(batch)}; got S {tuple(S.shape)} and z "
            f"{tuple(z.shape)}"
        )
    return S, z


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
    sequence), zeros when ``None``, with batch dimensions that broadcast to the
    inputs' (as in :func:`linear_attention_step`). Returns ``(out (..., n, Ev), (S,
    z))``; with ``state=None`` ``out`` equals ``linear_attention(q, k, v,
    feature_map=feature_map, is_causal=True, eps=eps)``. ``n`` sequential steps.
    """
    fn = "linear_attention_recurrent"
    check_qkv(fn, q, k, v)
    _check_number(fn, "eps", eps, minimum=0)
    k, v = grouped_kv(q, k, v)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"{fn}: the recurrent form needs one query per key, got q "
            f"{tuple(q.shape)} and k {tuple(k.shape)}"
        )
    if q.shape[-2] == 0:
        raise ValueError(
            f"{fn}: q, k and v must contain at least one token, got q {tuple(q.shape)}"
        )
    phi_k = _feature_pair(fn, feature_map, q[..., :1, :], k[..., :1, :])[1]
    if state is not None:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        state = _check_state(fn, state, batch, phi_k.shape[-1], v)
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
    ``(..., M, Ev)`` memory left by an earlier call, zeros when ``None``, with batch
    dimensions that broadcast to the inputs' (a state of another batch size is a
    ``ValueError``). Returns ``(out (..., n, Ev), S (..., M, Ev))``, in ``n``
    sequential steps.
    """
    fn = "delta_rule_attention"
    check_qkv(fn, q, k, v)
    k, v = grouped_kv(q, k, v)
    n = q.shape[-2]
    if k.shape[-2] != n or n == 0:
        raise ValueError(
            f"{fn}: the delta rule needs one query per key and at least one token, "
            f"got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    beta = _check_beta(fn, beta, v, (*batch, n))
    phi_q, phi_k = _feature_pair(fn, feature_map, q, k)
    f = F.normalize(phi_k, dim=-1)  # (..., n, M), unit rows
    g = F.normalize(phi_q, dim=-1)
    M, Ev = f.shape[-1], v.shape[-1]
    if state is None:
        state = v.new_zeros(*batch, M, Ev)
    else:
        _check_like(fn, "v", v, state=state)
        shape = state.shape
        if (
            state.dim() < 2
            or shape[-2:] != (M, Ev)
            or not _broadcasts_to(shape, batch)
        ):
            raise ValueError(
                f"{fn}: state must have shape (..., M, Ev) = (..., {M}, {Ev}) with "
                f"batch dimensions broadcasting to the tokens' batch {tuple(batch)}, "
                f"got {tuple(state.shape)}"
            )
    outs = []
    for t in range(n):
        f_t = f[..., t, :].unsqueeze(-1)  # (..., M, 1)
        stored = (f_t.transpose(-2, -1) @ state).squeeze(-2)  # (..., Ev): v-bar
        delta = beta[..., t, None] * (v[..., t, :] - stored)
        state = state + f_t * delta.unsqueeze(-2)
        outs.append((g[..., t, :].unsqueeze(-2) @ state).squeeze(-2))
    return torch.stack(outs, dim=-2), state


def _check_beta(fn: str, beta, v: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``beta`` (a real number or a real tensor, finite) as a tensor of ``shape`` in
    ``v``'s dtype and device."""
    is_tensor = isinstance(beta, torch.Tensor)
    if (
        isinstance(beta, bool)
        or not (is_tensor or isinstance(beta, numbers.Real))
        or (is_tensor and (beta.dtype == torch.bool or beta.is_complex()))
    ):
        got = beta.dtype if is_tensor else f"{beta!r} ({type(beta).__name__})"
        raise TypeError(f"{fn}: beta must be a real number or tensor, got {got}")
    if not torch.isfinite(torch.as_tensor(beta)).all():
        got = "NaN or inf entries" if is_tensor else repr(beta)
        raise ValueError(f"{fn}: beta must be finite, got {got}")
    beta = torch.as_tensor(beta, dtype=v.dtype, device=v.device)
    try:
        return torch.broadcast_to(beta, shape)
    except RuntimeError:
        raise ValueError(
            f"{fn}: beta must broadcast to (..., n) = {shape}, got {tuple(beta.shape)}"
        ) from None


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
    truncated. The draws are made on the CPU in float64 from ``generator`` (a CPU
    generator), then converted to the floating ``dtype`` and moved to ``device``.
    """
    fn = "orthogonal_random_features"
    _check_sizes(fn, n_features=n_features, dim=dim)
    _check_generator(fn, generator)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{fn}: dtype must be a floating torch.dtype, got {dtype!r}")
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


def _check_generator(fn: str, generator) -> None:
    """``generator``: None or a CPU ``torch.Generator`` (the features are drawn on the
    CPU)."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"{fn}: generator must be a torch.Generator or None, got "
            f"{type(generator).__name__}"
        )
    if generator is not None and generator.device.type != "cpu":
        raise ValueError(
            f"{fn}: generator must be a CPU torch.Generator (the random features are "
            f"drawn on the CPU), got one on {generator.device}"
        )


def _log_performer_features(
    x: torch.Tensor, projection: torch.Tensor, fn: str = "performer_features"
) -> torch.Tensor:
    """``W x~ - |x~|^2 / 2`` with ``x~ = x d^(-1/4)``: the logarithm of the positive
    features times ``sqrt(m)``."""
    check_float(fn, "x", x)
    check_float(fn, "projection", projection)
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(
            f"{fn}: x must have shape (..., d) with d >= 1 (x~ = x d^(-1/4)), got "
            f"{tuple(x.shape)}"
        )
    d = x.shape[-1]
    P = projection.shape
    if (
        projection.dim() < 2
        or P[-1] != d
        or P[-2] < 1
        or not _broadcasts(x.shape, P[:-2])
    ):
        raise ValueError(
            f"{fn}: projection must have shape (..., m, d={d}) with m >= 1 and batch "
            f"dimensions broadcasting with x {tuple(x.shape)}, got {tuple(P)}"
        )
    if projection.device != x.device:
        raise ValueError(
            f"{fn}: projection must be on x's device, {x.device}, got "
            f"{projection.device}"
        )
    if not torch.isfinite(projection).all():
        raise ValueError(f"{fn}: projection must be finite, got NaN or inf entries")
    x = x * d**-0.25
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
    the paper's suggestion) from ``generator``. With ``phi`` the features, ``z_i`` the
    sum of ``phi(k_j)`` over the keys that query ``i`` sees (all, or ``j <= i + S - L``
    with ``is_causal``) and ``S_i`` that of ``phi(k_j) v_j^T``:

    .. math::

        \mathrm{out}_i = \frac{\phi(q_i)^\top S_i}{\phi(q_i)^\top z_i
        + \varepsilon \max_r \phi(q_i)_r z_{ir}}

    ``eps`` is measured against the largest term of the normalizer, so it is
    scale-free: the output is the ``eps = 0`` estimate times a factor between ``1 / (1
    + eps)`` and ``1 / (1 + eps / m)``, whatever the size of the features. (The
    normalizer is a sum of positive terms, so it cannot vanish while a key is visible;
    ``eps`` only keeps the old interface.) A query that sees no key returns zeros.

    Numerically nothing is exponentiated but differences of logarithms: ``log z_i`` is a
    ``logsumexp`` over the keys (``logcumsumexp`` with ``is_causal``), ``S_i / z_i`` is
    a mean of the values weighted per feature (with ``is_causal`` a running mean,
    updated key by key as in :func:`linear_attention_recurrent`), and the ``m`` terms of
    the normalizer are scaled so that the largest is 1. So nothing overflows, no
    constant depends on a key that the query cannot see, and no result depends on the
    scale of the features. Half-precision inputs are computed in float32. Returns
    ``(..., L, dv)``.
    """
    fn = "performer_attention"
    check_qkv(fn, q, k, v)
    is_causal = _check_flag(fn, "is_causal", is_causal)
    eps = _check_number(fn, "eps", eps, minimum=0)
    k, v = grouped_kv(q, k, v)
    d = q.shape[-1]
    if d < 1:
        raise ValueError(
            f"{fn}: q and k must have head_dim d >= 1, got q {tuple(q.shape)}"
        )
    if n_features is not None:
        _check_sizes(fn, n_features=n_features)
    if projection is None:
        _check_generator(fn, generator)
        m = max(1, round(d * math.log(d))) if n_features is None else n_features
        projection = orthogonal_random_features(
            m, d, generator=generator, device=q.device
        )
    else:
        check_float(fn, "projection", projection)
        if projection.dim() < 2:
            raise ValueError(
                f"{fn}: projection must have shape (..., m, d={d}), got "
                f"{tuple(projection.shape)}"
            )
        if n_features is not None and n_features != projection.shape[-2]:
            raise ValueError(
                f"{fn}: n_features={n_features} disagrees with projection of shape "
                f"{tuple(projection.shape)} (m = {projection.shape[-2]})"
            )
    work = torch.promote_types(q.dtype, torch.float32)  # never fp16 / bf16 sums
    log_q = _log_performer_features(q.to(work), projection, fn)
    log_k = _log_performer_features(k.to(work), projection, fn)
    out = _favor_attention(log_q, log_k, v.to(work), is_causal, eps)
    return out.to(q.dtype)


def _favor_attention(
    log_q: torch.Tensor,
    log_k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool,
    eps: float,
) -> torch.Tensor:
    """Kernel attention with features ``exp(log_q)`` ``(..., L, m)`` and ``exp(log_k)``
    ``(..., S, m)``, never exponentiating more than a difference of logarithms."""
    L, S = log_q.shape[-2], log_k.shape[-2]
    if S == 0 or L == 0:  # zeros (connected to q and v: gradients are zeros), or empty
        return log_q.sum(-1, keepdim=True) * 0 + v.sum(-2, keepdim=True)
    if not is_causal:
        log_z = torch.logsumexp(log_k, dim=-2, keepdim=True)  # (..., 1, m)
        # (..., m, dv): per feature r, the mean of the values weighted by phi(k_j)_r
        mean_v = torch.softmax(log_k, dim=-2).transpose(-2, -1) @ v
        logits = log_q + log_z  # (..., L, m): log phi(q_i)_r z_r
        terms = torch.exp(logits - logits.amax(-1, keepdim=True))  # largest: 1
        return (terms @ mean_v) / (terms.sum(-1, keepdim=True) + eps)
    # Causal: per feature r, S_t / z_t is a running mean of the values, weighted by
    # phi(k_j)_r: mean_t = mean_{t-1} + p_t (v_t - mean_{t-1}) with the share p_t =
    # phi(k_t)_r / z_tr in (0, 1]. Nothing can overflow, and no constant comes from a
    # later key. Query i reads the mean after key t = i + S - L, in O(m dv) memory.
    log_z = torch.logcumsumexp(log_k, dim=-2)  # (..., S, m): log z_t
    share = torch.exp(log_k - log_z)  # (..., S, m): p_t
    last = torch.arange(L, device=log_q.device) + S - L  # query i sees keys j <= last
    logits = log_q + log_z.index_select(-2, last.clamp(min=0))  # (..., L, m)
    terms = torch.exp(logits - logits.amax(-1, keepdim=True))
    batch = torch.broadcast_shapes(log_k.shape[:-2], v.shape[:-2])
    mean = v.new_zeros(*batch, log_k.shape[-1], v.shape[-1])  # (..., m, dv)
    nums = [v.new_zeros(v.shape[-1])] * max(L - S, 0)  # queries that see no key: 0
    for t in range(S):
        mean = torch.addcmul(mean, share[..., t, :, None], v[..., t, None, :] - mean)
        if t >= S - L:  # the query that sees keys 0..t
            nums.append((terms[..., t - S + L, None, :] @ mean).squeeze(-2))
    num = torch.stack(torch.broadcast_tensors(*nums), dim=-2)  # (..., L, dv)
    return num / (terms.sum(-1, keepdim=True) + eps)
