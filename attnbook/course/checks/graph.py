"""Checks for the exercises of the chapter on graph attention."""

from __future__ import annotations

import math

import torch

from ...graph import GATLayer, GCNLayer, edge_softmax, to_dense_adjacency
from . import register
from .common import assert_close, generator
from .library import forbid


def _random_edge_index(gen: torch.Generator, n: int, e: int) -> torch.Tensor:
    return torch.randint(0, n, (2, e), generator=gen)


@register(
    "graph-gcn-propagation",
    library=forbid(
        "attnbook.graph.GCNLayer",
        "attnbook.graph.GNN",
        why="The exercise asks you to build the normalized propagation matrix that "
            "GCNLayer applies; the graph helpers such as add_self_loops and "
            "to_dense_adjacency stay allowed.",
    ),
    hint="drop the existing self-loops, set A[i, j] = 1 for every edge j -> i (row = "
    "target), add the identity, "
    "take deg = row sums of A + I and return (A + I) / sqrt(deg_i deg_j).",
)
def _check_gcn_propagation(student) -> None:
    """``student(edge_index, num_nodes)`` must be the dense ``D^-1/2 (A + I) D^-1/2``
    that GCNLayer applies."""

    gen = generator(1001)
    cases = [
        (
            "a path 0 - 1 - 2 (both directions)",
            torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]),
            3,
        ),
        (
            "a graph with an isolated node 4",
            torch.tensor([[0, 1, 2, 3], [1, 0, 3, 2]]),
            5,
        ),
        (
            "existing self-loops (to be replaced)",
            torch.tensor([[0, 0, 1, 2, 2], [0, 1, 0, 2, 1]]),
            3,
        ),
        (
            "a random directed graph",
            torch.unique(_random_edge_index(gen, 8, 20), dim=1),
            8,
        ),
    ]
    for what, edge_index, n in cases:
        used, weight = GCNLayer(1, 1).edge_weights(edge_index, n)
        expected = torch.zeros(n, n).index_put_(
            (used[1], used[0]), weight, accumulate=True
        )
        actual = student(edge_index, n)
        used, weight = GCNLayer(1, 1).edge_weights(edge_index.flip(0), n)
        flipped = torch.zeros(n, n).index_put_(
            (used[1], used[0]), weight, accumulate=True
        )
        if (
            isinstance(actual, torch.Tensor)
            and actual.shape == expected.shape
            and not torch.allclose(expected, flipped)
        ):
            assert not torch.allclose(actual.double(), flipped.double(), atol=1e-5), (
                f"{what}: your matrix is the transpose of the right one (the edges "
                "reversed): row i must hold the edges INTO node i (A[target, source])."
            )
        assert_close(actual, expected, what)


@register(
    "graph-edge-softmax",
    library=forbid(
        "attnbook.graph.edge_softmax",
        "attnbook.graph.message_passing_attention",
        why="The exercise asks you to write the softmax over each node's incoming "
            "edges, which edge_softmax implements.",
    ),
    hint="for each target node take the maximum of its edges' scores (scatter_reduce "
    "with 'amax'), subtract it, "
    "exponentiate, sum per target with index_add_, and divide each edge by its "
    "target's sum.",
)
def _check_edge_softmax(student) -> None:
    """``student(scores, target, num_nodes)`` must equal
    :func:`attnbook.graph.edge_softmax`."""

    gen = generator(1002)
    target = torch.randint(0, 6, (15,), generator=gen)
    # the edges into one node score near +1000, all others near -1000
    apart = torch.where(target == target[0], 1000.0, -1000.0)[:, None]
    cases = [
        ("scores of shape (E,)", torch.randn(15, generator=gen)),
        ("scores of shape (E, heads=3)", torch.randn(15, 3, generator=gen)),
        (
            "scores around 1000 (overflow test)",
            torch.randn(15, 2, generator=gen) + 1000.0,
        ),
        (
            "scores around -1000 (underflow test)",
            torch.randn(15, 2, generator=gen) - 1000.0,
        ),
        (
            "one node's scores around +1000, the others' around -1000",
            torch.randn(15, 2, generator=gen) + apart,
        ),
    ]
    for what, scores in cases:
        # node 6 (and maybe others) has no incoming edge
        actual = student(scores, target, 7)
        expected = edge_softmax(scores, target, 7)
        if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape:
            assert_close(actual, expected, what)  # names the type or the shape
        nan = torch.isnan(actual)
        where = nan if nan.any() else ~torch.isclose(
            actual.double(), expected.double(), 1e-4, 1e-5
        )
        note = _underflow_note(scores, target, where) if where.any() else ""
        assert not nan.any(), f"{what}: your weights contain NaN.{note}"
        try:
            assert_close(actual, expected, what)
        except AssertionError as err:
            raise AssertionError(f"{err}{note}") from None


def _underflow_note(scores, target, wrong) -> str:
    """Why the first wrong weight (``wrong`` marks them) is wrong, if exp underflowed
    there: its node's largest score lies far below the largest of all scores (one
    maximum for every edge), or far below 0 (a node maximum that starts at 0); else
    ''."""
    first = tuple(wrong.nonzero()[0].tolist())
    edge, heads = first[0], first[1:]
    node = int(target[edge])
    node_top = scores[target == node][(slice(None), *heads)].max().item()
    top = scores.max().item()
    # exp(x) leaves the normal floats below log(tiny): -87.3 in float32
    limit = -math.log(torch.finfo(scores.dtype).tiny) - 8.0
    where = f"edge {edge}" + (f", head {heads[0]}" if heads else "")
    if top - node_top > limit:
        return (
            f" At {where} the largest score into node {node} is {node_top:.0f}, "
            f"{top - node_top:.0f} below the largest score of all ({top:.0f}): did "
            "you subtract one maximum for all edges (scores.max())? Then exp "
            "underflows to 0 at every edge into that node, and 0 / 0 is NaN. "
            "Subtract each target node's own maximum (scatter_reduce with 'amax')."
        )
    if node_top < -limit:
        return (
            f" At {where} every score into node {node} is at most {node_top:.0f}: "
            "does your node maximum start at 0? torch.zeros(...).scatter_reduce(..., "
            "'amax') takes max(0, scores) (include_self=True is the default), so the "
            "maximum is 0, exp underflows to 0 at every edge into that node, and "
            "0 / 0 is NaN. Start it at -inf (torch.full(..., float('-inf'))) or pass "
            "include_self=False."
        )
    return ""


@register(
    "graph-gat-coefficients",
    library=forbid(
        "attnbook.graph.GATLayer",
        "attnbook.graph.GNN",
        why="The exercise asks you to compute GAT's attention weights, which "
            "GATLayer.forward_dense returns; edge_softmax and the masked softmaxes "
            "stay allowed.",
    ),
    hint="z = (x @ weight.T).view(N, heads, out_dim); s_src = (z * att_src).sum(-1) "
    "and s_dst likewise, "
    "both (N, heads); e[h, i, j] = leaky_relu(s_dst[i, h] + s_src[j, h], "
    "negative_slope); add the identity to "
    "adj, fill the non-edges with -inf and softmax over j (the last dim).",
)
def _check_gat_coefficients(student) -> None:
    """``student(x, adj, weight, att_src, att_dst, negative_slope)`` must equal
    ``GATLayer.forward_dense``'s weights."""

    gen = generator(1003)
    cases = [
        (
            "one head on a path 0 - 1 - 2 plus an isolated node 3",
            torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]),
            4,
            1,
            0.2,
        ),
        (
            "3 heads on a graph that already has self-loops",
            torch.tensor([[0, 0, 1, 2, 2, 3], [0, 1, 0, 2, 3, 3]]),
            4,
            3,
            0.2,
        ),
        (
            "2 heads on a random directed graph, negative_slope = 0.01",
            _random_edge_index(gen, 7, 15),
            7,
            2,
            0.01,
        ),
    ]
    for what, edge_index, n, heads, slope in cases:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(heads)
            layer = GATLayer(5, 4, heads=heads, negative_slope=slope).eval()
        x = torch.randn(n, 5, generator=gen)
        adj = to_dense_adjacency(edge_index, n)
        with torch.no_grad():
            _, expected = layer.forward_dense(x, adj, return_weights=True)
        actual = student(
            x,
            adj.clone(),
            layer.lin.weight.detach().clone(),
            layer.att_src.detach().clone(),
            layer.att_dst.detach().clone(),
            slope,
        )
        assert isinstance(actual, torch.Tensor), (
            f"return a torch.Tensor, got {type(actual).__name__}."
        )
        assert not torch.isnan(actual).any(), f"{what}: your weights contain NaN."
        assert_close(actual, expected, what)
