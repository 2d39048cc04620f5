"""Attention on graphs: GCN (routing fixed by the graph) and GAT (routing computed from
the data).

Papers: Kipf & Welling (2017) for the graph convolutional network; Velickovic et al.
(2018) for the graph attention network; Brody, Alon & Yahav (2022) for why GAT's
attention is "static".

The example graph of the chapter, Zachary's karate club, is
:func:`attnbook.data.karate_club`.

A graph with ``N`` nodes is given by node features ``x`` of shape ``(N, in_dim)`` and an
``edge_index`` of shape ``(2, E)`` (int64): edge ``e`` carries a message from the source
node ``j = edge_index[0, e]`` to the target node ``i = edge_index[1, e]``. An undirected
graph lists both directions. This is PyTorch Geometric's convention, and
:class:`GATLayer` uses the parameter layout of its ``GATConv`` (``lin``, ``att_src``,
``att_dst``, ``bias``), so weights carry over.

A GNN layer is attention whose keys are restricted to the neighbours: every layer here
computes, for every target node ``i``, a weighted average over its incoming edges ``j ->
i``. GCN fixes the weights from the node degrees; GAT computes them with an additive
score and a softmax over the incoming edges. Dot-product self-attention is the same
message passing on the complete graph (:func:`message_passing_attention`).
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch import nn

from .contract import check_sizes as _check_sizes
from .contract import check_float, check_qkv, grouped_kv
from .core import masked_softmax

__all__ = [
    "add_self_loops",
    "complete_graph",
    "to_dense_adjacency",
    "edge_softmax",
    "message_passing_attention",
    "GCNLayer",
    "GATLayer",
    "GNN",
]


# --------------------------------------------------------------------------------------
# Graph utilities
# --------------------------------------------------------------------------------------
def _check_num_nodes(fn: str, num_nodes: int) -> None:
    if (
        isinstance(num_nodes, bool)
        or not isinstance(num_nodes, numbers.Integral)
        or num_nodes < 0
    ):
        raise ValueError(
            f"{fn}: num_nodes must be a non-negative integer, got {num_nodes!r}"
        )


def _check_rate(fn: str, name: str, p: float) -> None:
    """A probability in ``[0, 1)`` (NaN refused)."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p < 1.0:
        raise ValueError(f"{fn}: {name} must be a number in [0, 1), got {p!r}")


def _check_edge_index(
    edge_index: torch.Tensor, num_nodes: int, fn: str = "edge_index"
) -> None:
    """``edge_index``: an int64 ``(2, E)`` tensor of node ids in ``[0, num_nodes)``
    (``TypeError`` for a wrong type or dtype, ``ValueError`` for a wrong shape or id;
    the message names ``fn``)."""
    _check_num_nodes(fn, num_nodes)
    if not isinstance(edge_index, torch.Tensor) or edge_index.dtype != torch.long:
        raise TypeError(
            f"{fn}: edge_index must be an int64 tensor, got "
            f"{getattr(edge_index, 'dtype', type(edge_index).__name__)}"
        )
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(
            f"{fn}: edge_index must have shape (2, E) (row 0 = source, row 1 = "
            f"target), got {tuple(edge_index.shape)}"
        )
    if edge_index.numel():
        low, high = edge_index.aminmax()
        low, high = int(low), int(high)
        if low < 0 or high >= num_nodes:
            raise ValueError(
                f"{fn}: edge_index refers to nodes outside 0..{num_nodes - 1} "
                f"(num_nodes={num_nodes}): got ids in [{low}, {high}]"
            )


def _check_x(fn: str, x: torch.Tensor, in_dim: int) -> None:
    """Node features: a floating-point ``(N, in_dim)`` tensor."""
    check_float(fn, "x", x)
    if x.dim() != 2 or x.shape[1] != in_dim:
        raise ValueError(
            f"{fn}: x must have shape (N, in_dim={in_dim}), got {tuple(x.shape)}"
        )


def _check_gnn(kind, in_dim, hidden, n_classes, heads, dropout) -> None:
    if kind not in ("gcn", "gat"):
        raise ValueError(f"GNN: kind must be 'gcn' or 'gat', got {kind!r}")
    _check_sizes("GNN", in_dim=in_dim, hidden=hidden, n_classes=n_classes, heads=heads)
    _check_rate("GNN", "dropout", dropout)


def _check_message_passing(q, k, v, edge_index, scale) -> None:
    fn = "message_passing_attention"
    check_qkv(fn, q, k, v)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"{fn}: q and k need the same number of nodes N (dim -2), got q "
            f"{tuple(q.shape)} and k {tuple(k.shape)}"
        )
    _check_edge_index(edge_index, q.shape[-2], fn)
    if scale is not None and (
        isinstance(scale, bool)
        or not isinstance(scale, numbers.Real)
        or not math.isfinite(scale)
    ):
        raise ValueError(f"{fn}: scale must be None or a finite number, got {scale!r}")


def add_self_loops(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Remove the self-loops ``i -> i`` in ``edge_index`` and append exactly one per
    node.

    ``(2, E)`` -> ``(2, E' + N)`` where ``E'`` counts the edges that are not self-loops.
    Every node then attends (at least) to itself, so no softmax row is empty.
    """
    _check_edge_index(edge_index, num_nodes, "add_self_loops")
    return _add_self_loops(edge_index, num_nodes)


def _add_self_loops(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """:func:`add_self_loops` on an ``edge_index`` already checked."""
    keep = edge_index[0] != edge_index[1]
    loops = torch.arange(num_nodes, device=edge_index.device).repeat(2, 1)
    return torch.cat([edge_index[:, keep], loops], dim=1)


def complete_graph(
    num_nodes: int, *, self_loops: bool = True, device=None
) -> torch.Tensor:
    """``edge_index`` of the complete directed graph: every ``j -> i`` (with ``i -> i``
    when ``self_loops``)."""
    _check_num_nodes("complete_graph", num_nodes)
    j, i = torch.meshgrid(
        torch.arange(num_nodes, device=device),
        torch.arange(num_nodes, device=device),
        indexing="xy",
    )
    # target-major: all edges into node 0 first
    edge_index = torch.stack([j.reshape(-1), i.reshape(-1)])
    return edge_index if self_loops else edge_index[:, edge_index[0] != edge_index[1]]


def to_dense_adjacency(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Boolean ``(N, N)`` matrix with ``adj[i, j] = True`` iff there is an edge ``j ->
    i``.

    Rows are targets (queries) and columns sources (keys), like an attention mask: True
    = may attend. A repeated edge gives one True.
    """
    _check_edge_index(edge_index, num_nodes, "to_dense_adjacency")
    adj = torch.zeros(num_nodes, num_nodes, dtype=torch.bool, device=edge_index.device)
    adj[edge_index[1], edge_index[0]] = True
    return adj


def edge_softmax(
    scores: torch.Tensor, target: torch.Tensor, num_nodes: int
) -> torch.Tensor:
    r"""Softmax of edge scores over the incoming edges of each target node.

    .. math::

        \alpha_e = \frac{\exp s_e}{\sum_{e' : \mathrm{target}(e') = \mathrm{target}(e)}
        \exp s_{e'}}

    ``scores``: ``(E, ...)`` (e.g. ``(E, heads)``); ``target``: ``(E,)`` node ids.
    Returns ``(E, ...)``; the weights of the edges into each node sum to 1. The per-node
    maximum is subtracted before ``exp`` (the usual overflow guard; it cancels in the
    ratio). Node ids outside ``[0, num_nodes)`` raise ``ValueError``.
    """
    fn = "edge_softmax"
    _check_num_nodes(fn, num_nodes)
    check_float(fn, "scores", scores)
    if not isinstance(target, torch.Tensor) or target.dtype != torch.long:
        raise TypeError(
            f"{fn}: target must be an int64 tensor, got "
            f"{getattr(target, 'dtype', type(target).__name__)}"
        )
    if target.dim() != 1 or scores.dim() < 1 or scores.shape[0] != target.shape[0]:
        raise ValueError(
            f"{fn}: scores (E, ...) and target (E,) must agree, got "
            f"{tuple(scores.shape)} and {tuple(target.shape)}"
        )
    if target.numel():
        low, high = (int(t) for t in target.aminmax())
        if low < 0 or high >= num_nodes:
            raise ValueError(
                f"{fn}: target refers to nodes outside 0..{num_nodes - 1} "
                f"(num_nodes={num_nodes}): got ids in [{low}, {high}]"
            )
    index = target.view(-1, *([1] * (scores.dim() - 1))).expand_as(scores)
    node_max = torch.full(
        (num_nodes, *scores.shape[1:]),
        float("-inf"),
        dtype=scores.dtype,
        device=scores.device,
    )
    node_max = node_max.scatter_reduce(
        0, index, scores, reduce="amax", include_self=True
    )
    exp = torch.exp(scores - node_max.gather(0, index))
    node_sum = torch.zeros_like(node_max).index_add_(0, target, exp)
    return exp / node_sum.gather(0, index)


def message_passing_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    edge_index: torch.Tensor,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    r"""Dot-product attention as message passing: each node attends over its incoming
    edges only.

    .. math:: s_{j \to i} = \mathrm{scale}\; q_i \cdot k_j, \qquad
              \alpha_{j \to i} = \operatorname{softmax}_{j \in N(i)} s_{j \to i}, \qquad
              \mathrm{out}_i = \sum_{j \in N(i)} \alpha_{j \to i} v_j

    Shapes follow :mod:`attnbook.contract`: ``q``, ``k`` ``(..., N, E)`` and ``v``
    ``(..., N, Ev)`` for the ``N`` nodes (heads and batch in front, grouped-query heads
    allowed); ``scale`` defaults to ``1 / sqrt(E)``. On :func:`complete_graph` (with
    self-loops) this *is* scaled dot-product self-attention; on a sparser graph it is
    attention with the mask :func:`to_dense_adjacency`. Nodes with no incoming edge get
    zeros, like a fully masked query.
    """
    _check_message_passing(q, k, v, edge_index, scale)
    k, v = grouped_kv(q, k, v)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    N = q.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    # nodes first, for indexing by edge: (N, ..., E)
    q, k, v = (t.expand(*batch, *t.shape[-2:]).movedim(-2, 0) for t in (q, k, v))
    source, target = edge_index
    scores = (q[target] * k[source]).sum(-1) * scale  # (E, ...): one score per edge
    alpha = edge_softmax(scores, target, N)
    messages = alpha.unsqueeze(-1) * v[source]  # (E, ..., Ev)
    out = torch.zeros(N, *v.shape[1:], dtype=v.dtype, device=v.device)
    return out.index_add_(0, target, messages).movedim(0, -2)


# --------------------------------------------------------------------------------------
# GCN: the routing weights are fixed by the graph
# --------------------------------------------------------------------------------------
class GCNLayer(nn.Module):
    r"""Graph convolution (Kipf & Welling, 2017): :math:`H' = \hat D^{-1/2} \hat A \hat
    D^{-1/2} X W + b`.

    :math:`\hat A = A + I` (existing self-loops replaced by one per node), :math:`\hat
    D` its degree matrix. Per edge: ``out_i = sum_{j -> i} x_j W / sqrt(deg_i deg_j) +
    b``, with ``deg`` counted on incoming edges. An edge listed twice counts twice (in
    ``deg`` and in the sum: ``A[i, j]`` is the number of edges ``j -> i``), as in
    message passing; an isolated node gets only its self-loop (or, without
    ``add_self_loops``, zeros plus ``b``). The weight of an edge depends only on the
    degrees, never on the features: the graph fixes the routing. Degrees and weights
    are computed in the dtype of ``x``. Layout as PyTorch Geometric's ``GCNConv``:
    ``lin`` (no bias) and ``bias``.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        *,
        add_self_loops: bool = True,
        bias: bool = True,
    ):
        super().__init__()
        _check_sizes("GCNLayer", in_dim=in_dim, out_dim=out_dim)
        self.in_dim, self.out_dim, self.add_self_loops = in_dim, out_dim, add_self_loops
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim)) if bias else None

    def edge_weights(
        self, edge_index: torch.Tensor, num_nodes: int, *, dtype=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The edges used (self-loops added when ``add_self_loops``) and their ``1 /
        sqrt(deg_i deg_j)`` weights, in ``dtype`` (default: torch's default dtype;
        :meth:`forward` passes the dtype of ``x``)."""
        _check_edge_index(edge_index, num_nodes, "GCNLayer.edge_weights")
        dtype = torch.get_default_dtype() if dtype is None else dtype
        if self.add_self_loops:
            edge_index = _add_self_loops(edge_index, num_nodes)
        source, target = edge_index
        deg = torch.zeros(num_nodes, dtype=dtype, device=edge_index.device)
        deg.index_add_(0, target, torch.ones_like(target, dtype=dtype))
        inv_sqrt = deg.pow(-0.5).masked_fill(deg == 0, 0.0)
        return edge_index, inv_sqrt[source] * inv_sqrt[target]

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """``x``: ``(N, in_dim)``, ``edge_index``: ``(2, E)`` -> ``(N, out_dim)``."""
        _check_x("GCNLayer", x, self.in_dim)
        edge_index, weight = self.edge_weights(edge_index, x.shape[0], dtype=x.dtype)
        h = self.lin(x)
        source, target = edge_index
        out = torch.zeros_like(h).index_add_(0, target, weight[:, None] * h[source])
        return out if self.bias is None else out + self.bias


# --------------------------------------------------------------------------------------
# GAT: the routing weights are computed from the data, masked by the graph
# --------------------------------------------------------------------------------------
class GATLayer(nn.Module):
    r"""Graph attention (Velickovic et al., 2018) with ``heads`` heads, in PyTorch
    Geometric's layout.

    For head ``h``, with :math:`z_n = W x_n` (``lin``, no bias, reshaped to ``(N, heads,
    out_dim)``):

    .. math:: e_{ij} = \mathrm{LeakyReLU}\big(a_{\mathrm{dst}} \cdot z_i +
              a_{\mathrm{src}} \cdot z_j\big), \qquad \alpha_{ij} =
              \operatorname{softmax}_{j \in N(i) \cup \{i\}} e_{ij}, \qquad h'_i =
              \sum_j \alpha_{ij} z_j

    which is the paper's :math:`a^\top [W h_i \,\|\, W h_j]` with :math:`a =
    [a_{\mathrm{dst}}; a_{\mathrm{src}}]`. ``att_src`` and ``att_dst`` have shape ``(1,
    heads, out_dim)``. Existing self-loops are replaced by one per node
    (``add_self_loops``). Heads are concatenated head-major to ``(N, heads * out_dim)``
    (``concat=True``) or averaged to ``(N, out_dim)``; then ``bias`` is added.
    ``dropout`` drops attention coefficients during training. The nonlinearity between
    layers is the caller's.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        *,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        bias: bool = True,
    ):
        super().__init__()
        _check_sizes("GATLayer", in_dim=in_dim, out_dim=out_dim, heads=heads)
        _check_rate("GATLayer", "dropout", dropout)
        if (
            isinstance(negative_slope, bool)
            or not isinstance(negative_slope, numbers.Real)
            or not math.isfinite(negative_slope)
        ):
            raise ValueError(
                "GATLayer: negative_slope must be a finite number, got "
                f"{negative_slope!r}"
            )
        self.in_dim, self.out_dim, self.heads, self.concat = (
            in_dim,
            out_dim,
            heads,
            concat,
        )
        self.negative_slope, self.dropout, self.add_self_loops = (
            negative_slope,
            dropout,
            add_self_loops,
        )
        self.lin = nn.Linear(in_dim, heads * out_dim, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, out_dim))
        self.att_dst = nn.Parameter(torch.empty(1, heads, out_dim))
        self.bias = (
            nn.Parameter(torch.zeros(heads * out_dim if concat else out_dim))
            if bias
            else None
        )
        nn.init.xavier_uniform_(self.lin.weight)
        nn.init.xavier_uniform_(self.att_src)
        nn.init.xavier_uniform_(self.att_dst)

    def _project(
        self, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``z = W x`` as ``(N, heads, out_dim)`` and the two halves of the score, ``(N,
        heads)`` each."""
        _check_x("GATLayer", x, self.in_dim)
        z = self.lin(x).view(-1, self.heads, self.out_dim)
        return z, (z * self.att_src).sum(-1), (z * self.att_dst).sum(-1)

    def _combine(self, out: torch.Tensor) -> torch.Tensor:
        width = self.heads * self.out_dim  # not -1: a graph of 0 nodes has 0 elements
        out = out.reshape(out.shape[0], width) if self.concat else out.mean(dim=1)
        return out if self.bias is None else out + self.bias

    def forward(
        self, x: torch.Tensor, edge_index: torch.Tensor, *, return_weights: bool = False
    ):
        """``x``: ``(N, in_dim)``, ``edge_index``: ``(2, E)`` -> ``(N, heads*out_dim)``
        or ``(N, out_dim)``.

        With ``return_weights=True`` also returns ``(edge_index_used, alpha)``: the
        edges after the self-loop step, ``(2, E')``, and their weights ``(E', heads)``.
        """
        _check_x("GATLayer", x, self.in_dim)
        N = x.shape[0]
        _check_edge_index(edge_index, N, "GATLayer")
        if self.add_self_loops:
            edge_index = _add_self_loops(edge_index, N)
        z, s_src, s_dst = self._project(x)
        source, target = edge_index
        # (E, heads)
        e = F.leaky_relu(s_dst[target] + s_src[source], self.negative_slope)
        alpha = edge_softmax(e, target, N)
        alpha_used = F.dropout(alpha, self.dropout, self.training)
        out = torch.zeros_like(z).index_add_(
            0, target, alpha_used.unsqueeze(-1) * z[source]
        )
        out = self._combine(out)
        return (out, (edge_index, alpha)) if return_weights else out

    def forward_dense(
        self, x: torch.Tensor, adj: torch.Tensor, *, return_weights: bool = False
    ):
        """The same layer written as masked attention over an ``(N, N)`` score matrix.

        ``adj``: bool ``(N, N)``, ``adj[i, j]`` = edge ``j -> i``
        (:func:`to_dense_adjacency`; it is the ``attn_mask``, True = may attend). The
        scores ``e[h, i, j]`` are computed for every
        pair and the non-edges masked, exactly like a causal mask in a decoder: the
        graph is the mask. Returns the output and, on request, the ``(heads, N, N)``
        weights. Costs ``O(N^2)`` memory, so it is for small graphs and for checking.
        """
        _check_x("GATLayer.forward_dense", x, self.in_dim)
        N = x.shape[0]
        if not isinstance(adj, torch.Tensor) or adj.dtype != torch.bool:
            raise TypeError(
                "GATLayer.forward_dense: adj must be a bool tensor, got "
                f"{getattr(adj, 'dtype', type(adj).__name__)}"
            )
        if adj.shape != (N, N):
            raise ValueError(
                f"GATLayer.forward_dense: adj must have shape (N, N) = ({N}, {N}), "
                f"got {tuple(adj.shape)}"
            )
        if self.add_self_loops:
            adj = adj | torch.eye(N, dtype=torch.bool, device=adj.device)
        z, s_src, s_dst = self._project(x)
        # (heads, N_i, N_j)
        e = F.leaky_relu(s_dst.T[:, :, None] + s_src.T[:, None, :], self.negative_slope)
        alpha = masked_softmax(e, attn_mask=adj)
        alpha_used = F.dropout(alpha, self.dropout, self.training)
        # (N, heads, out_dim)
        out = self._combine((alpha_used @ z.transpose(0, 1)).transpose(0, 1))
        return (out, alpha) if return_weights else out


class GNN(nn.Module):
    """Two-layer node classifier: ``layer1 -> ELU -> dropout -> layer2`` with GCN or GAT
    layers (dropout is also applied to the input features).

    ``kind="gcn"``: ``GCNLayer(in, hidden) -> GCNLayer(hidden, n_classes)``.
    ``kind="gat"``: ``GATLayer(in, hidden, heads)`` (heads concatenated to ``hidden *
    heads`` features) ``-> GATLayer(hidden * heads, n_classes, heads=1)``. With
    ``hidden=8, heads=8`` this is the transductive architecture of Velickovic et al.
    (2018) for Cora and Citeseer: 8 heads of 8 features, then one classifying head (on
    PubMed they average 8 output heads instead, which this class does not build). In
    the GAT layers ``dropout`` also drops attention coefficients. Returns logits ``(N,
    n_classes)``.
    """

    def __init__(
        self,
        kind: str,
        in_dim: int,
        hidden: int,
        n_classes: int,
        *,
        heads: int = 8,
        dropout: float = 0.5,
    ):
        super().__init__()
        _check_gnn(kind, in_dim, hidden, n_classes, heads, dropout)
        if kind == "gcn":
            self.layer1, self.layer2 = (
                GCNLayer(in_dim, hidden),
                GCNLayer(hidden, n_classes),
            )
        else:
            self.layer1 = GATLayer(in_dim, hidden, heads=heads, dropout=dropout)
            self.layer2 = GATLayer(hidden * heads, n_classes, heads=1, dropout=dropout)
        self.kind, self.in_dim, self.dropout = kind, in_dim, dropout

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """``x``: ``(N, in_dim)``, ``edge_index``: ``(2, E)`` -> logits ``(N,
        n_classes)``."""
        _check_x("GNN", x, self.in_dim)
        h = F.dropout(x, self.dropout, self.training)
        h = F.elu(self.layer1(h, edge_index))
        h = F.dropout(h, self.dropout, self.training)
        return self.layer2(h, edge_index)
