"""Attention's relatives: synthesizers, hypernetworks, routing, memory, gating,
state-space models.

Each block below isolates one way of looking at attention ``out = A(X) V(X)``:

* **depth as recurrence**: one block applied ``L`` times, the parameter sharing of the
  Universal Transformer (Dehghani et al., 2019) and ALBERT (Lan et al., 2020);
* **who makes the weights** A: a synthesizer (Tay et al., 2021) predicts them from each
  token alone (dense) or learns them outright (random); attention is a hypernetwork that
  *writes a linear layer* from the input; a dynamic convolution (Wu et al., 2019)
  predicts a local kernel from each token;
* **how the weights are normalized**: capsule routing by agreement (Sabour et al., 2017)
  lets the outputs compete for each input instead of the inputs competing for each
  output;
* **what one step of attention is**: one update of a modern Hopfield network (Ramsauer
  et al., 2021);
* **gating instead of mixing**: GLU (Dauphin et al., 2017) and gMLP (Liu et al., 2021);
* **the main alternative**: a diagonal linear state-space model (S4D/Mamba family; Gu et
  al., 2022; Gu & Dao, 2023), a recurrence that is also a long convolution;
* **attention in applications**: DIN target attention for recommendation (Zhou et al.,
  2018), hierarchical attention for documents (Yang et al., 2016), co-attention between
  two inputs (Lu et al., 2016; Xiong et al., 2017).

Sequence tensors are ``(batch, seq, dim)`` unless a docstring says otherwise.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .contract import (
    check_attn_mask,
    check_flag,
    check_float,
    check_int,
    check_key_padding_mask,
    check_real,
    check_sizes,
)
from .core import masked_softmax

__all__ = [
    "SharedLayerStack",
    "DenseSynthesizer",
    "RandomSynthesizer",
    "attention_as_linear_map",
    "dynamic_convolution",
    "squash",
    "dynamic_routing",
    "hopfield_update",
    "hopfield_energy",
    "hopfield_retrieve",
    "GLU",
    "GatedMLP",
    "ssm_kernel",
    "ssm_recurrent",
    "ssm_convolution",
    "DiagonalSSM",
    "TargetAttention",
    "AttentionPooling",
    "HierarchicalAttentionNetwork",
    "coattention",
]


def _check_seq(fn: str, name: str, x: torch.Tensor, dim: int | None = None) -> None:
    """``x`` a floating ``(batch, seq, dim)`` tensor (``dim`` fixed when given)."""
    check_float(fn, name, x)
    if x.dim() != 3 or (dim is not None and x.shape[-1] != dim):
        want = "(batch, seq, dim)" if dim is None else f"(batch, seq, {dim})"
        raise ValueError(f"{fn}: {name} must have shape {want}, got {tuple(x.shape)}")


def _check_sizes_and_hidden(fn: str, hidden, **sizes) -> None:
    """``sizes`` positive integers, ``hidden`` None (the default) or one too."""
    check_sizes(fn, **sizes)
    if hidden is not None:
        check_sizes(fn, hidden=hidden)


# --------------------------------------------------------------------------------------
# Depth as recurrence: one block, applied L times
# --------------------------------------------------------------------------------------
def _check_shared_stack(block, n_layers) -> None:
    check_sizes("SharedLayerStack", n_layers=n_layers)
    if not callable(block):
        raise TypeError(
            f"SharedLayerStack: block must be a module (callable), got "
            f"{type(block).__name__}"
        )


class SharedLayerStack(nn.Module):
    r"""One block applied ``n_layers`` times: a stack whose layers share their
    parameters (Universal Transformer, Dehghani et al., 2019; ALBERT, Lan et al., 2020).

    .. math:: h^{(l)} = f_\theta\big(h^{(l-1)}\big), \qquad l = 1, \dots, L

    with the *same* parameters :math:`\theta` at every depth, where an ordinary stack
    has :math:`\theta_1, \dots, \theta_L`. The stack holds the parameters of one block
    (``L`` times fewer) and costs the same compute as ``L`` blocks: it is an RNN over
    depth. The gradient of :math:`\theta` is the sum of the gradients its ``L`` uses
    receive (back-propagation through depth).

    ``forward(x, *args, return_states=False, **kwargs)`` calls ``block(x, *args,
    **kwargs)`` ``n_layers`` times; with ``return_states=True`` it also returns the
    stacked states ``(n_layers + 1, *x.shape)``, ``h^(0) = x`` first. Iterating the
    stack yields ``block`` ``n_layers`` times and ``len`` is ``n_layers``, so it can
    replace a model's ``nn.ModuleList`` of blocks (e.g. ``TinyGPT.blocks``).
    """

    def __init__(self, block: nn.Module, n_layers: int):
        super().__init__()
        _check_shared_stack(block, n_layers)
        self.block, self.n_layers = block, n_layers

    def __len__(self) -> int:
        return self.n_layers

    def __iter__(self):
        return iter([self.block] * self.n_layers)

    def forward(self, x: torch.Tensor, *args, return_states: bool = False, **kwargs):
        states = [x]
        for _ in range(self.n_layers):
            x = self.block(x, *args, **kwargs)  # the same parameters at every depth
            states.append(x)
        return (x, torch.stack(states)) if return_states else x


# --------------------------------------------------------------------------------------
# Who makes the weights: synthesizers and the hypernetwork view
# --------------------------------------------------------------------------------------
class _Synthesizer(nn.Module):
    """What both Synthesizers share: weights from :meth:`scores` (not from queries and
    keys), then ``out = softmax(scores) X W_v``. ``x``: ``(B, n, d_model)`` with ``n <=
    max_len``."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        check_sizes(type(self).__name__, d_model=d_model, max_len=max_len)
        self.d_model, self.max_len = d_model, max_len
        self.value = nn.Linear(d_model, d_model)

    def scores(self, x: torch.Tensor, n: int) -> torch.Tensor:
        raise NotImplementedError

    def _check_forward(self, x, attn_mask) -> None:
        fn = f"{type(self).__name__}.forward"
        _check_seq(fn, "x", x, self.d_model)
        if x.shape[1] > self.max_len:
            raise ValueError(
                f"{fn}: x has {x.shape[1]} positions but the synthesizer was built "
                f"for max_len={self.max_len}"
            )
        if attn_mask is not None:
            check_attn_mask(fn, attn_mask, (x.shape[0], x.shape[1], x.shape[1]))

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        *,
        return_weights: bool = False,
    ):
        """``attn_mask``: bool, broadcastable to the scores (True = may attend), e.g. a
        causal mask."""
        self._check_forward(x, attn_mask)
        n = x.shape[1]
        weights = masked_softmax(self.scores(x, n), attn_mask=attn_mask)
        weights = weights.expand(x.shape[0], n, n)
        out = weights @ self.value(x)
        return (out, weights) if return_weights else out


class DenseSynthesizer(_Synthesizer):
    r"""Dense Synthesizer: each token predicts its own row of attention weights, no
    query-key product.

    .. math::

        A = \operatorname{softmax}\big(\mathrm{ReLU}(X W_1 + b_1) W_2 + b_2\big)_{[:,
        :n]}, \qquad \mathrm{out} = A\, X W_v

    ``W_2`` maps to ``max_len`` columns, one per *position*: row ``i`` says how much
    token ``i`` takes from position ``j`` whatever token sits there, and sequences
    longer than ``max_len`` are impossible. ``x``: ``(B, n, d_model)`` with ``n <=
    max_len`` -> ``(B, n, d_model)``.
    """

    def __init__(self, d_model: int, max_len: int, hidden: int | None = None):
        super().__init__(d_model, max_len)
        _check_sizes_and_hidden("DenseSynthesizer", hidden)
        self.w1 = nn.Linear(d_model, hidden or d_model)
        self.w2 = nn.Linear(hidden or d_model, max_len)

    def scores(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return self.w2(F.relu(self.w1(x)))[..., :n]  # (B, n, n)


class RandomSynthesizer(_Synthesizer):
    r"""Random Synthesizer: the weights do not depend on the input at all, :math:`A =
    \operatorname{softmax}(R)`.

    ``R`` is a ``(max_len, max_len)`` matrix, initialized from ``N(0, 1)`` with
    ``generator`` and learned (``trainable=True``) or kept fixed. It routes information
    between positions, but the routing is the same for every input: a learned
    token-mixing matrix, like gMLP's. ``x``: ``(B, n, d_model)`` -> ``(B, n, d_model)``.
    """

    def __init__(
        self,
        d_model: int,
        max_len: int,
        *,
        trainable: bool = True,
        generator: torch.Generator | None = None,
    ):
        super().__init__(d_model, max_len)
        check_flag("RandomSynthesizer", "trainable", trainable)
        self.logits = nn.Parameter(
            torch.randn(max_len, max_len, generator=generator), requires_grad=trainable
        )

    def scores(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return self.logits[:n, :n]  # (n, n): the same for every input


def _check_linear_map(x, w_q, w_k, w_v) -> None:
    fn = "attention_as_linear_map"
    for name, t in (("x", x), ("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        check_float(fn, name, t)
    if (
        x.dim() != 2
        or any(w.dim() != 2 for w in (w_q, w_k, w_v))
        or w_q.shape[0] != x.shape[1]
        or w_k.shape != w_q.shape
        or w_v.shape[0] != x.shape[1]
    ):
        raise ValueError(
            f"{fn}: expected x (n, d), w_q and w_k (d, d_k), w_v (d, d_v); got x "
            f"{tuple(x.shape)}, "
            f"w_q {tuple(w_q.shape)}, w_k {tuple(w_k.shape)}, w_v {tuple(w_v.shape)}"
        )


def attention_as_linear_map(
    x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The linear layer that self-attention *writes* for the input ``x``: attention as
    a hypernetwork.

    For one sequence ``x`` ``(n, d)`` and projections ``w_q``, ``w_k`` ``(d, d_k)``,
    ``w_v`` ``(d, d_v)``, self-attention is ``out = A (x W_v)`` with ``A = softmax(x W_q
    (x W_k)^T / sqrt(d_k))``. Flattening row-major, ``vec(out) = M vec(x)`` with

    .. math:: M = A \otimes W_v^\top \in \mathbb{R}^{n d_v \times n d},

    a matrix of ``n x n`` blocks, block ``(i, j)`` being ``A_ij W_v^T``: one
    non-negative scalar per pair of positions, shared by every feature. ``A`` is
    computed from ``x`` (the hypernetwork), ``M`` then acts on ``x`` as an ordinary
    layer. Returns ``(M, A)``.
    """
    _check_linear_map(x, w_q, w_k, w_v)
    A = torch.softmax((x @ w_q) @ (x @ w_k).T / math.sqrt(w_q.shape[1]), dim=-1)
    return torch.kron(A, w_v.T.contiguous()), A


def _check_dynamic_convolution(x, window, heads) -> None:
    fn = "dynamic_convolution"
    _check_seq(fn, "x", x)
    check_sizes(fn, window=window, heads=heads)
    if x.shape[-1] % heads:
        raise ValueError(
            f"{fn}: heads must be a positive divisor of d={x.shape[-1]}, got {heads!r}"
        )


def dynamic_convolution(
    x: torch.Tensor,
    kernel_proj,
    window: int,
    heads: int,
    *,
    return_weights: bool = False,
):
    r"""Causal dynamic convolution (Wu et al., 2019): a depthwise convolution whose
    kernel each token predicts for itself.

    For token ``i`` a linear map predicts ``heads`` kernels of width ``k = window``,
    normalized by a softmax over the window, and channel ``c`` (in group ``h = c //
    (d / heads)``) mixes the last ``k`` positions with its group's kernel:

    .. math:: W_{i,h,:} = \operatorname{softmax}\big(f(x_i)_{h,:}\big), \qquad
              \mathrm{out}_{i,c} = \sum_{j=0}^{k-1} W_{i,h,j}\; x_{i-k+1+j,\,c}

    Positions before the start are zeros (the softmax still runs over all ``k``
    weights), so the weight on ``x_i`` itself is ``W[..., i, k-1]``. The weights are
    attention-like (non-negative, summing to 1 over a local window) but computed from
    the query token alone, with no keys: the weight of a neighbour depends on its
    *offset*, not its content. The ``heads`` groups share one kernel across their
    ``d / heads`` channels. A kernel that ignores ``x`` gives the lightweight
    convolution of the same paper.

    ``x``: ``(B, n, d)`` with ``d`` divisible by ``heads``; ``kernel_proj``: a callable
    (e.g. ``nn.Linear(d, heads * window)``) mapping ``(B, n, d)`` to ``(B, n, heads *
    window)``. Returns ``out`` ``(B, n, d)``, and with ``return_weights=True`` also the
    kernels ``(B, heads, n, window)``, entry ``j`` weighting position ``i - window + 1 +
    j``.
    """
    _check_dynamic_convolution(x, window, heads)
    B, n, d = x.shape
    logits = kernel_proj(x)
    if logits.shape != (B, n, heads * window):
        raise ValueError(
            f"dynamic_convolution: kernel_proj(x) must have shape (B, n, heads * "
            f"window) = ({B}, {n}, {heads * window}), got {tuple(logits.shape)}"
        )
    weights = torch.softmax(logits.reshape(B, n, heads, window), dim=-1)
    padded = F.pad(x, (0, 0, window - 1, 0))  # zeros before the first position
    # windows[b, i, c, j] = x[b, i - window + 1 + j, c]
    windows = padded.unfold(1, window, 1).reshape(B, n, heads, d // heads, window)
    out = (windows * weights.unsqueeze(3)).sum(-1).reshape(B, n, d)
    return (out, weights.transpose(1, 2)) if return_weights else out


# --------------------------------------------------------------------------------------
# How the weights are normalized: capsule routing by agreement
# --------------------------------------------------------------------------------------
def _check_squash(s, dim, eps) -> None:
    check_float("squash", "s", s)
    if (
        isinstance(dim, bool)
        or not isinstance(dim, int)
        or not -s.dim() <= dim < max(s.dim(), 1)
    ):
        raise ValueError(
            f"squash: dim must be an integer in [{-s.dim()}, {s.dim()}) for s of shape "
            f"{tuple(s.shape)}, got {dim!r}"
        )
    check_real("squash", "eps", eps, above=0)


def squash(s: torch.Tensor, *, dim: int = -1, eps: float = 1e-8) -> torch.Tensor:
    r"""Capsule nonlinearity :math:`v = \frac{\|s\|^2}{1 + \|s\|^2} \frac{s}{\|s\|}`:
    keeps the direction, length in [0, 1)."""
    _check_squash(s, dim, eps)
    sq = (s * s).sum(dim, keepdim=True)
    return sq / (1.0 + sq) * s / torch.sqrt(sq + eps)


def _check_routing(u_hat, n_iter) -> None:
    check_float("dynamic_routing", "u_hat", u_hat)
    if u_hat.dim() != 4:
        raise ValueError(
            "dynamic_routing: u_hat must have shape (B, n_in, n_out, d), got "
            f"{tuple(u_hat.shape)}"
        )
    check_sizes("dynamic_routing", n_iter=n_iter)


def dynamic_routing(
    u_hat: torch.Tensor, *, n_iter: int = 3
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Routing by agreement (Sabour et al., 2017) between ``n_in`` lower and ``n_out``
    higher capsules.

    ``u_hat``: ``(B, n_in, n_out, d)``, the prediction of lower capsule ``i`` for higher
    capsule ``j``. Starting from logits ``b = 0``, repeat ``n_iter`` times:

    .. math:: c_{ij} = \operatorname{softmax}_{j}(b_{ij}), \quad s_j = \sum_i c_{ij}
              \hat u_{j|i}, \quad v_j = \mathrm{squash}(s_j), \quad b_{ij} \mathrel{+}=
              \hat u_{j|i} \cdot v_j

    The softmax runs over the *outputs* ``j``: each input distributes itself among the
    outputs, the opposite of attention, whose softmax makes the inputs compete for each
    output. Returns ``(v (B, n_out, d), c (B, n_in, n_out))``.
    """
    _check_routing(u_hat, n_iter)
    b = torch.zeros(u_hat.shape[:3], dtype=u_hat.dtype, device=u_hat.device)
    for it in range(n_iter):
        c = torch.softmax(b, dim=2)
        v = squash((c.unsqueeze(-1) * u_hat).sum(1))  # (B, n_out, d)
        if it < n_iter - 1:
            b = b + (u_hat * v.unsqueeze(1)).sum(-1)
    return v, c


# --------------------------------------------------------------------------------------
# Attention as memory retrieval: the modern Hopfield network
# --------------------------------------------------------------------------------------
def _check_hopfield(fn: str, query, patterns, beta) -> None:
    check_float(fn, "query", query)
    check_float(fn, "patterns", patterns)
    check_real(fn, "beta", beta, above=0)
    if (
        query.dim() < 2
        or patterns.dim() < 2
        or query.shape[-1] != patterns.shape[-1]
        or patterns.shape[-2] == 0
    ):
        raise ValueError(
            f"{fn}: query (..., L, d) and patterns (..., N, d) with N >= 1 must share "
            f"d, got {tuple(query.shape)} and {tuple(patterns.shape)}"
        )


def hopfield_update(
    query: torch.Tensor, patterns: torch.Tensor, *, beta: float
) -> torch.Tensor:
    r"""One update of a modern (continuous) Hopfield network (Ramsauer et al., 2021).

    With the stored patterns as the rows of ``X`` (``(..., N, d)``) and state ``xi``
    (``(..., L, d)``, one row per query), :math:`\xi^{\text{new}} =
    \operatorname{softmax}(\beta\, \xi X^\top) X` (the paper's :math:`X
    \operatorname{softmax}(\beta X^\top \xi)` with patterns as columns). It is one step
    of attention with keys = values = the patterns and ``scale = beta``.
    """
    _check_hopfield("hopfield_update", query, patterns, beta)
    return torch.softmax(beta * query @ patterns.transpose(-2, -1), dim=-1) @ patterns


def hopfield_energy(
    query: torch.Tensor, patterns: torch.Tensor, *, beta: float
) -> torch.Tensor:
    r"""The energy the update minimizes, per query row: ``(..., L)``.

    .. math:: E(\xi) = -\tfrac{1}{\beta} \log \sum_{i=1}^{N} \exp(\beta\, x_i^\top \xi)
              + \tfrac12 \xi^\top \xi + \tfrac{1}{\beta} \log N + \tfrac12 M^2, \qquad M
              = \max_i \|x_i\|

    The constants make ``0 <= E <= 2 M^2`` for every state in the convex hull of the
    patterns, i.e. after the first update (Ramsauer et al., 2021, appendix). The update
    is a concave-convex procedure step on ``E``, so the energy never increases.
    """
    _check_hopfield("hopfield_energy", query, patterns, beta)
    N = patterns.shape[-2]
    lse = torch.logsumexp(beta * query @ patterns.transpose(-2, -1), dim=-1)
    M = patterns.norm(dim=-1).max(dim=-1).values.unsqueeze(-1)
    return -lse / beta + 0.5 * (query * query).sum(-1) + math.log(N) / beta + 0.5 * M**2


def _check_retrieve(query, patterns, beta, max_iter, tol) -> None:
    _check_hopfield("hopfield_retrieve", query, patterns, beta)
    check_sizes("hopfield_retrieve", max_iter=max_iter)
    check_real("hopfield_retrieve", "tol", tol, minimum=0)


def hopfield_retrieve(
    query: torch.Tensor,
    patterns: torch.Tensor,
    *,
    beta: float,
    max_iter: int = 100,
    tol: float = 1e-6,
) -> tuple[torch.Tensor, int]:
    """Iterate :func:`hopfield_update` until the state moves less than ``tol`` (max abs
    change).

    Returns ``(fixed point (..., L, d), number of updates made)``, the count including
    the last update, the one that moved less than ``tol``. With a large ``beta`` and
    well-separated patterns the first update already lands close to the stored pattern
    nearest to the query and the later ones only refine it; with a small ``beta`` the
    state converges to an average of several patterns (a metastable state).
    """
    _check_retrieve(query, patterns, beta, max_iter, tol)
    xi = query
    for step in range(1, max_iter + 1):
        new = hopfield_update(xi, patterns, beta=beta)
        if (new - xi).abs().max() < tol:
            return new, step
        xi = new
    return xi, max_iter


# --------------------------------------------------------------------------------------
# Gating instead of mixing: GLU and gMLP
# --------------------------------------------------------------------------------------
class GLU(nn.Module):
    r"""Gated linear unit (Dauphin et al., 2017): :math:`\mathrm{GLU}(x) = \sigma(x W_g
    + b_g) \odot (x W + b)`.

    One path gates the other elementwise; each position is processed on its own (nothing
    is mixed across the sequence). ``gate`` and ``proj`` are the two ``Linear(d_in,
    d_out)``.
    """

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        check_sizes("GLU", d_in=d_in, d_out=d_out)
        self.gate = nn.Linear(d_in, d_out)
        self.proj = nn.Linear(d_in, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_float("GLU.forward", "x", x)
        if x.dim() < 1 or x.shape[-1] != self.gate.in_features:
            raise ValueError(
                f"GLU.forward: x must have shape (..., d_in={self.gate.in_features}), "
                f"got {tuple(x.shape)}"
            )
        return torch.sigmoid(self.gate(x)) * self.proj(x)


def _check_gated_mlp(d_model, d_ffn, seq_len, is_causal) -> None:
    check_sizes("GatedMLP", d_model=d_model, d_ffn=d_ffn, seq_len=seq_len)
    if d_ffn % 2:
        raise ValueError(
            f"GatedMLP: d_ffn must be even (it is split in two halves), got {d_ffn}"
        )
    check_flag("GatedMLP", "is_causal", is_causal)


def _check_gated_input(x, d_model: int, seq_len: int) -> None:
    _check_seq("GatedMLP.forward", "x", x, d_model)
    if x.shape[1] != seq_len:
        raise ValueError(
            f"GatedMLP.forward: gMLP's mixing matrix is built for seq_len={seq_len}, "
            f"got x {tuple(x.shape)}"
        )


class GatedMLP(nn.Module):
    r"""A gMLP block (Liu et al., 2021): an MLP whose gate mixes the positions with a
    learned matrix.

    .. math:: [Z_1, Z_2] = \mathrm{GELU}(\mathrm{LN}(X) U), \quad
              \mathrm{out} = X + \big(Z_1 \odot (W_s\, \mathrm{LN}(Z_2) + b_s)\big) V

    ``W_s`` is a ``(seq_len, seq_len)`` token-mixing matrix (the only place positions
    interact) initialized to zero with ``b_s = 1``, so at initialization the block is a
    per-position MLP. ``is_causal=True`` masks ``W_s`` to its lower triangle. ``x``:
    ``(B, seq_len, d_model)``.
    """

    def __init__(
        self, d_model: int, d_ffn: int, seq_len: int, *, is_causal: bool = False
    ):
        super().__init__()
        _check_gated_mlp(d_model, d_ffn, seq_len, is_causal)
        self.d_model, self.seq_len, self.is_causal = d_model, seq_len, is_causal
        self.norm = nn.LayerNorm(d_model)
        self.proj_in = nn.Linear(d_model, d_ffn)
        self.gate_norm = nn.LayerNorm(d_ffn // 2)
        self.spatial_weight = nn.Parameter(torch.zeros(seq_len, seq_len))
        self.spatial_bias = nn.Parameter(torch.ones(seq_len, 1))
        self.proj_out = nn.Linear(d_ffn // 2, d_model)

    def token_mixing(self) -> torch.Tensor:
        """The ``(seq_len, seq_len)`` mixing matrix ``W_s`` actually applied
        (lower-triangular when causal)."""
        if not self.is_causal:
            return self.spatial_weight
        return self.spatial_weight.tril()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_gated_input(x, self.d_model, self.seq_len)
        z1, z2 = F.gelu(self.proj_in(self.norm(x))).chunk(2, dim=-1)
        # mixes positions, not features
        gate = self.token_mixing() @ self.gate_norm(z2) + self.spatial_bias
        return x + self.proj_out(z1 * gate)


# --------------------------------------------------------------------------------------
# The main alternative: a diagonal linear state-space model (recurrence = convolution)
# --------------------------------------------------------------------------------------
def _check_abc(fn: str, a, b, c, D: int | None = None) -> None:
    """``a``, ``b``, ``c`` floating ``(D, N)`` tensors of one shape."""
    for name, t in (("a", a), ("b", b), ("c", c)):
        check_float(fn, name, t)
    if (
        a.dim() != 2
        or (D is not None and a.shape[0] != D)
        or b.shape != a.shape
        or c.shape != a.shape
    ):
        raise ValueError(
            f"{fn}: a, b, c must all have shape (D={'D' if D is None else D}, N), "
            f"got a {tuple(a.shape)}, b {tuple(b.shape)}, c {tuple(c.shape)}"
        )


def _check_ssm(fn: str, x, a, b, c, state=None) -> None:
    _check_seq(fn, "x", x)
    _check_abc(fn, a, b, c, x.shape[-1])
    if state is not None:
        check_float(fn, "state", state)
        if state.shape != (x.shape[0], *a.shape):
            raise ValueError(
                f"{fn}: state must have shape (B, D, N) = "
                f"{(x.shape[0], *a.shape)}, got {tuple(state.shape)}"
            )


def ssm_kernel(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, length: int
) -> torch.Tensor:
    r"""The convolution kernel of a diagonal linear SSM: :math:`K_{d,k} = \sum_n
    c_{dn}\, a_{dn}^k\, b_{dn}`.

    ``a``, ``b``, ``c``: ``(D, N)`` (``D`` channels, each with an ``N``-dimensional
    diagonal state). Returns ``(D, length)``. With ``|a| < 1`` the kernel decays
    geometrically: how far back the model sees is set by how close ``a`` is to 1.
    """
    _check_abc("ssm_kernel", a, b, c)
    check_int("ssm_kernel", "length", length, minimum=0)
    # (D, N, length)
    powers = a.unsqueeze(-1) ** torch.arange(length, device=a.device, dtype=a.dtype)
    return ((c * b).unsqueeze(-1) * powers).sum(1)


def ssm_recurrent(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    state: torch.Tensor | None = None,
):
    r"""The recurrent form, one step per token: :math:`h_t = a \odot h_{t-1} + b\, x_t,\
    y_t = \sum_n c \odot h_t`.

    ``x``: ``(B, L, D)``; ``a``, ``b``, ``c``: ``(D, N)``; ``state``: ``(B, D, N)``
    (zeros when None). Returns ``(y (B, L, D), final state (B, D, N))``. Memory is ``O(D
    N)`` whatever ``L``: this is how an SSM generates, with a fixed-size state instead
    of a growing KV cache.
    """
    _check_ssm("ssm_recurrent", x, a, b, c, state)
    h = (
        torch.zeros(x.shape[0], *a.shape, dtype=x.dtype, device=x.device)
        if state is None
        else state
    )
    ys = [x[:, :0]]  # an empty sequence gives an empty output and the state unchanged
    for t in range(x.shape[1]):
        h = a * h + b * x[:, t, :, None]
        ys.append((c * h).sum(-1)[:, None])
    return torch.cat(ys, dim=1), h


def ssm_convolution(
    x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor
) -> torch.Tensor:
    r"""The same map as :func:`ssm_recurrent` (zero initial state), as a causal
    convolution via FFT.

    .. math:: y_t = \sum_{s \le t} K_{t-s}\, x_s

    computed with zero-padded FFTs of length ``2L``: ``O(D L log L)`` and fully parallel
    over ``t``, which is how an SSM trains. ``x``: ``(B, L, D)`` -> ``(B, L, D)``. It
    needs ``a`` to be the same at every step; a *selective* SSM (Mamba), whose ``a``
    depends on the input, keeps only the recurrent (scan) form.
    """
    _check_ssm("ssm_convolution", x, a, b, c)
    L = x.shape[1]
    K = ssm_kernel(a, b, c, L)  # (D, L)
    n = max(
        2 * L, 1
    )  # zero padding turns the FFT's circular convolution into a linear one
    y = torch.fft.irfft(
        torch.fft.rfft(x.transpose(1, 2), n=n) * torch.fft.rfft(K, n=n), n=n
    )[..., :L]
    return y.transpose(1, 2)


class DiagonalSSM(nn.Module):
    r"""A trainable diagonal linear SSM layer: :func:`ssm_convolution` plus a skip term
    ``D x``.

    ``a = exp(-exp(log_rate))`` lies in (0, 1), so the recurrence is always stable; the
    rates are initialized log-spaced so that the ``d_state`` modes of a channel cover
    short and long memories. ``forward(x, *, mode="convolution" | "recurrent")``: both
    give the same output.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 16,
        *,
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        check_sizes("DiagonalSSM", d_model=d_model, d_state=d_state)
        # decay per step from 0.001 to 1
        rates = torch.logspace(-3, 0, d_state).repeat(d_model, 1)
        self.log_rate = nn.Parameter(rates.log())
        self.b = nn.Parameter(
            torch.randn(d_model, d_state, generator=generator) / math.sqrt(d_state)
        )
        self.c = nn.Parameter(
            torch.randn(d_model, d_state, generator=generator) / math.sqrt(d_state)
        )
        self.skip = nn.Parameter(torch.ones(d_model))

    def decay(self) -> torch.Tensor:
        """The diagonal ``a`` of shape ``(d_model, d_state)``, in (0, 1)."""
        return torch.exp(-torch.exp(self.log_rate))

    def forward(self, x: torch.Tensor, *, mode: str = "convolution") -> torch.Tensor:
        _check_seq("DiagonalSSM.forward", "x", x, self.skip.shape[0])
        if mode == "convolution":
            y = ssm_convolution(x, self.decay(), self.b, self.c)
        elif mode == "recurrent":
            y = ssm_recurrent(x, self.decay(), self.b, self.c)[0]
        else:
            raise ValueError(
                "DiagonalSSM.forward: mode must be 'convolution' or 'recurrent', got "
                f"{mode!r}"
            )
        return y + self.skip * x


# --------------------------------------------------------------------------------------
# Attention in applications: recommendation, documents, pairs of inputs
# --------------------------------------------------------------------------------------
def _check_target_attention(history, target, d: int, key_padding_mask) -> None:
    fn = "TargetAttention.forward"
    _check_seq(fn, "history", history, d)
    check_float(fn, "target", target)
    if target.shape != (history.shape[0], d):
        raise ValueError(
            f"{fn}: target must have shape (B, d) = ({history.shape[0]}, {d}), "
            f"got {tuple(target.shape)}"
        )
    if key_padding_mask is not None:
        check_key_padding_mask(fn, key_padding_mask, *history.shape[:2])


class TargetAttention(nn.Module):
    r"""DIN's local activation unit (Zhou et al., 2018): the candidate item queries the
    user's history.

    .. math:: w_t = \mathrm{MLP}\big([h_t,\ e,\ h_t - e,\ h_t \odot e]\big), \qquad
              \mathrm{interest} = \sum_t w_t h_t

    ``history``: ``(B, T, d)`` item embeddings, ``target``: ``(B, d)`` the candidate,
    ``key_padding_mask``: bool ``(B, T)``, True where the history is padding to ignore
    (``torch.nn.MultiheadAttention``'s convention; padding gets weight 0). DIN does
    **not** normalize the weights (``normalize=False``): the sum keeps how *much* of the
    history matches, which a softmax would erase (one matching item out of 50 and 50
    out of 50 would look alike). ``normalize=True`` uses a softmax instead. Returns
    ``(interest (B, d), weights (B, T))``.
    """

    def __init__(self, d: int, hidden: int = 32, *, normalize: bool = False):
        super().__init__()
        check_sizes("TargetAttention", d=d, hidden=hidden)
        self.d, self.normalize = (
            d,
            check_flag("TargetAttention", "normalize", normalize),
        )
        self.mlp = nn.Sequential(
            nn.Linear(4 * d, hidden), nn.PReLU(), nn.Linear(hidden, 1)
        )

    def forward(
        self,
        history: torch.Tensor,
        target: torch.Tensor,
        *,
        key_padding_mask: torch.Tensor | None = None,
    ):
        _check_target_attention(history, target, self.d, key_padding_mask)
        e = target.unsqueeze(1).expand_as(history)
        # (B, T)
        scores = self.mlp(
            torch.cat([history, e, history - e, history * e], dim=-1)
        ).squeeze(-1)
        if self.normalize:
            keep = None if key_padding_mask is None else ~key_padding_mask
            weights = masked_softmax(scores, attn_mask=keep)
        elif key_padding_mask is None:
            weights = scores
        else:
            weights = scores.masked_fill(key_padding_mask, 0.0)
        return (weights.unsqueeze(-1) * history).sum(1), weights


def _check_pooling(h, d: int, key_padding_mask) -> None:
    fn = "AttentionPooling.forward"
    _check_seq(fn, "h", h, d)
    if key_padding_mask is not None:
        check_key_padding_mask(fn, key_padding_mask, *h.shape[:2])


class AttentionPooling(nn.Module):
    r"""Attention with a *learned* query (Yang et al., 2016): summarize a sequence into
    one vector.

    .. math::

        u_t = \tanh(W h_t + b), \quad \alpha_t = \operatorname{softmax}_t(u_t \cdot
        u_w), \quad s = \sum_t \alpha_t h_t

    ``u_w`` is a trained "context vector" asking *which positions matter for the task*.
    ``h``: ``(B, T, d)``, ``key_padding_mask``: bool ``(B, T)``, True where ``h`` is
    padding to ignore. Returns ``(s (B, d), alpha (B, T))``; a fully padded sequence
    gives zeros.
    """

    def __init__(self, d: int, hidden: int | None = None):
        super().__init__()
        _check_sizes_and_hidden("AttentionPooling", hidden, d=d)
        self.proj = nn.Linear(d, hidden or d)
        self.context = nn.Parameter(torch.randn(hidden or d) / math.sqrt(hidden or d))

    def forward(self, h: torch.Tensor, *, key_padding_mask: torch.Tensor | None = None):
        _check_pooling(h, self.proj.in_features, key_padding_mask)
        keep = None if key_padding_mask is None else ~key_padding_mask
        alpha = masked_softmax(torch.tanh(self.proj(h)) @ self.context, attn_mask=keep)
        return (alpha.unsqueeze(-1) * h).sum(1), alpha


def _packed_gru(gru: nn.GRU, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Run the batch-first ``gru`` over the first ``lengths[i]`` steps of each row of
    ``x`` ``(N, T, d)`` only, so that the backward direction starts at the last real
    step, not at the padding; padded steps and empty rows (length 0) give zeros."""
    width = gru.hidden_size * (2 if gru.bidirectional else 1)
    out = x.new_zeros(*x.shape[:2], width)
    rows = (lengths > 0).nonzero().squeeze(-1)
    if len(rows):
        packed = pack_padded_sequence(
            x[rows], lengths[rows].cpu(), batch_first=True, enforce_sorted=False
        )
        y, _ = pad_packed_sequence(
            gru(packed)[0], batch_first=True, total_length=x.shape[1]
        )
        out = out.index_copy(0, rows, y)
    return out


def _check_han(vocab_size, embed_dim, hidden, n_classes, pad_id) -> None:
    fn = "HierarchicalAttentionNetwork"
    check_sizes(fn, vocab_size=vocab_size, embed_dim=embed_dim, hidden=hidden)
    check_sizes(fn, n_classes=n_classes)
    if check_int(fn, "pad_id", pad_id, minimum=0) >= vocab_size:
        raise ValueError(f"{fn}: pad_id must be in [0, {vocab_size}), got {pad_id}")


def _check_docs(docs, vocab_size: int) -> None:
    fn = "HierarchicalAttentionNetwork.forward"
    if not isinstance(docs, torch.Tensor) or docs.dtype != torch.long:
        raise TypeError(
            f"{fn}: docs must be an int64 tensor of token ids, got "
            f"{getattr(docs, 'dtype', type(docs).__name__)}"
        )
    if docs.dim() != 3:
        raise ValueError(
            f"{fn}: docs must have shape (B, S, W), got {tuple(docs.shape)}"
        )
    if docs.numel() and (docs.min() < 0 or docs.max() >= vocab_size):
        raise ValueError(
            f"{fn}: docs holds token ids outside the vocabulary [0, {vocab_size}): "
            f"min {int(docs.min())}, max {int(docs.max())}"
        )


class HierarchicalAttentionNetwork(nn.Module):
    """Hierarchical attention network (Yang et al., 2016): words -> sentence vectors ->
    document vector.

    A bidirectional GRU reads each sentence, :class:`AttentionPooling` turns its words
    into one sentence vector; a second bidirectional GRU reads the sentence vectors, a
    second pooling makes the document vector, a linear layer classifies it. ``docs``:
    ``(B, S, W)`` token ids, ``pad_id`` marks padding: words at the end of a sentence,
    empty sentences at the end of a document (``ValueError`` otherwise). Both GRUs run
    over the real words and sentences only (packed sequences), so a document gives the
    same result alone or padded in a batch. Returns ``(logits (B, n_classes),
    word_weights (B, S, W), sentence_weights (B, S))``: two levels of "where the model
    looked".
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int,
        hidden: int,
        n_classes: int,
        pad_id: int = 0,
    ):
        super().__init__()
        _check_han(vocab_size, embed_dim, hidden, n_classes, pad_id)
        self.pad_id = pad_id
        self.embed = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
        self.word_rnn = nn.GRU(embed_dim, hidden, batch_first=True, bidirectional=True)
        self.word_pool = AttentionPooling(2 * hidden)
        self.sentence_rnn = nn.GRU(
            2 * hidden, hidden, batch_first=True, bidirectional=True
        )
        self.sentence_pool = AttentionPooling(2 * hidden)
        self.classify = nn.Linear(2 * hidden, n_classes)

    def forward(self, docs: torch.Tensor):
        _check_docs(docs, self.embed.num_embeddings)
        B, S, W = docs.shape
        word_mask = docs != self.pad_id  # (B, S, W)
        sentence_mask = word_mask.any(-1)  # (B, S): sentences with a word
        for mask, what in ((word_mask, "word"), (sentence_mask, "sentence")):
            late = mask[..., 1:] & ~mask[..., :-1]  # real after padding
            if late.any():
                where = tuple(late.nonzero()[0].tolist())
                raise ValueError(
                    f"HierarchicalAttentionNetwork: docs must be padded at the end: a "
                    f"{what} at index {where[:-1] + (where[-1] + 1,)} follows padding"
                )
        flat = word_mask.view(B * S, W)
        words = _packed_gru(
            self.word_rnn, self.embed(docs.view(B * S, W)), flat.sum(-1)
        )  # (B*S, W, 2h)
        sentences, word_weights = self.word_pool(words, key_padding_mask=~flat)
        sentences = _packed_gru(
            self.sentence_rnn, sentences.view(B, S, -1), sentence_mask.sum(-1)
        )
        document, sentence_weights = self.sentence_pool(
            sentences, key_padding_mask=~sentence_mask
        )
        return self.classify(document), word_weights.view(B, S, W), sentence_weights


def _check_coattention(a, b, mask_a, mask_b) -> None:
    fn = "coattention"
    check_float(fn, "a", a)
    check_float(fn, "b", b)
    if a.dim() < 2 or b.dim() < 2 or a.shape[-1] != b.shape[-1]:
        raise ValueError(
            f"{fn}: a (..., n, d) and b (..., m, d) must share d, got "
            f"{tuple(a.shape)} and {tuple(b.shape)}"
        )
    for name, mask, x in (
        ("key_padding_mask_a", mask_a, a),
        ("key_padding_mask_b", mask_b, b),
    ):
        if mask is None:
            continue
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError(
                f"{fn}: {name} must be a bool tensor (True = padding), got "
                f"{getattr(mask, 'dtype', type(mask).__name__)}"
            )
        if mask.shape != x.shape[:-1]:
            raise ValueError(
                f"{fn}: {name} must have shape {tuple(x.shape[:-1])} (..., n), got "
                f"{tuple(mask.shape)}"
            )


def coattention(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    key_padding_mask_a: torch.Tensor | None = None,
    key_padding_mask_b: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Parallel co-attention: one affinity matrix, read in both directions.

    .. math:: L = A B^\top \in \mathbb{R}^{n \times m}, \quad
              \tilde A = \operatorname{softmax}_{\text{rows}}(L)\, B, \quad
              \tilde B = \operatorname{softmax}_{\text{rows}}(L^\top)\, A

    ``a``: ``(..., n, d)`` (e.g. question words), ``b``: ``(..., m, d)`` (e.g. image
    regions or context words); ``key_padding_mask_a`` ``(..., n)`` /
    ``key_padding_mask_b`` ``(..., m)``: bool, True where ``a`` / ``b`` is padding to
    ignore (``torch.nn.MultiheadAttention``'s convention). Row ``i`` of ``weights_ab``
    says which elements of ``b`` matter to ``a_i``, and vice versa. These are two
    cross-attentions (scale 1) sharing one score matrix. Returns ``(a_context (..., n,
    d), b_context (..., m, d), weights_ab (..., n, m), weights_ba (..., m, n))``.
    """
    _check_coattention(a, b, key_padding_mask_a, key_padding_mask_b)
    affinity = a @ b.transpose(-2, -1)
    keep_a, keep_b = (
        None if m is None else ~m.unsqueeze(-2)
        for m in (key_padding_mask_a, key_padding_mask_b)
    )
    weights_ab = masked_softmax(affinity, attn_mask=keep_b)
    weights_ba = masked_softmax(affinity.transpose(-2, -1), attn_mask=keep_a)
    return weights_ab @ b, weights_ba @ a, weights_ab, weights_ba
