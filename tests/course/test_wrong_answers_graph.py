"""Plausible wrong answers to the exercises of the chapter on graph attention: each fails its check
with a message that points at the mistake."""

import torch
import torch.nn.functional as F
from wrong_answers import Mistake, mistake_test


def _gcn(transpose=False, keep_loops=False, self_loops=True, row_norm=False):
    def gcn_propagation_matrix(edge_index, num_nodes):
        A = torch.zeros(num_nodes, num_nodes)
        keep = torch.ones_like(edge_index[0], dtype=torch.bool) if keep_loops else edge_index[0] != edge_index[1]
        src, dst = edge_index[0, keep], edge_index[1, keep]
        if transpose:
            A[src, dst] = 1.0  # row = source: A^T
        else:
            A[dst, src] = 1.0 if not keep_loops else A[dst, src] + 1.0
        if keep_loops:
            A = A.index_put((dst, src), torch.ones(len(src)), accumulate=True) - A.clamp(max=1)
        A_hat = A + torch.eye(num_nodes) if self_loops else A
        d = A_hat.sum(1)
        if row_norm:
            return A_hat / d[:, None]
        return A_hat / torch.sqrt(d[:, None] * d[None, :]).clamp_min(1e-12)
    return gcn_propagation_matrix


def _edge_softmax(stable=True, by_source=False, normalize=True, start=float("-inf"), one_max=None):
    def edge_softmax(scores, target, num_nodes):
        index = target.view(-1, *([1] * (scores.dim() - 1))).expand_as(scores)
        if one_max == "all":  # one maximum for every edge and head
            exp = torch.exp(scores - scores.max())
        elif one_max == "head":  # one maximum per head, over all edges
            exp = torch.exp(scores - scores.amax(0, keepdim=True))
        elif stable:
            node_max = torch.full((num_nodes, *scores.shape[1:]), start).scatter_reduce(
                0, index, scores, reduce="amax", include_self=True)
            exp = torch.exp(scores - node_max.gather(0, index))
        else:
            exp = torch.exp(scores)
        if not normalize:
            return exp
        if by_source:  # a softmax over all edges at once
            return exp / exp.sum(0, keepdim=True)
        node_sum = torch.zeros(num_nodes, *scores.shape[1:]).index_add_(0, target, exp)
        return exp / node_sum.gather(0, index)
    return edge_softmax


def _gat(swap=False, self_loops=True, softmax_dim=-1, slope=None):
    def gat_coefficients(x, adj, weight, att_src, att_dst, negative_slope=0.2):
        heads, out_dim = att_src.shape[1:]
        z = (x @ weight.T).view(-1, heads, out_dim)
        s_src = (z * att_src).sum(-1).T
        s_dst = (z * att_dst).sum(-1).T
        if swap:  # the source's half used for the query and vice versa
            s_src, s_dst = s_dst, s_src
        e = F.leaky_relu(s_dst[:, :, None] + s_src[:, None, :], negative_slope if slope is None else slope)
        allowed = adj | torch.eye(adj.shape[0], dtype=torch.bool) if self_loops else adj
        return torch.nan_to_num(torch.softmax(e.masked_fill(~allowed, float("-inf")), dim=softmax_dim))
    return gat_coefficients


MISTAKES = [
    Mistake("graph-gcn-propagation", "A transposed (row = source)", _gcn(transpose=True),
            ("existing self-loops (to be replaced)", "the transpose of the right one", "(row = target)")),
    Mistake("graph-gcn-propagation", "no self-loops added", _gcn(self_loops=False),
            ("a path 0 - 1 - 2 (both directions)", "add the identity")),
    Mistake("graph-gcn-propagation", "rows normalized instead of symmetric", _gcn(row_norm=True),
            ("a path 0 - 1 - 2", "(A + I) / sqrt(deg_i deg_j)")),
    Mistake("graph-edge-softmax", "no maximum subtracted (overflow)", _edge_softmax(stable=False),
            ("scores around 1000 (overflow test)", "NaN", "subtract it")),
    Mistake("graph-edge-softmax", "the maximum of all scores subtracted", _edge_softmax(one_max="all"),
            ("one node's scores around +1000, the others' around -1000", "your weights contain NaN",
             "below the largest score of all", "one maximum for all edges",
             "Subtract each target node's own maximum")),
    Mistake("graph-edge-softmax", "each head's maximum over all edges subtracted", _edge_softmax(one_max="head"),
            ("one node's scores around +1000, the others' around -1000", "your weights contain NaN",
             "below the largest score of all", "Subtract each target node's own maximum")),
    Mistake("graph-edge-softmax", "node maximum buffer starts at zeros", _edge_softmax(start=0.0),
            ("scores around -1000 (underflow test)", "your weights contain NaN", "every score into node",
             "does your node maximum start at 0?", "max(0, scores)", "Start it at -inf")),
    Mistake("graph-edge-softmax", "one softmax over all edges", _edge_softmax(by_source=True),
            ("scores of shape (E,)", "divide each edge by its target's sum")),
    Mistake("graph-edge-softmax", "exponentials never normalized", _edge_softmax(normalize=False),
            ("scores of shape (E,)", "sum per target with index_add_")),
    Mistake("graph-gat-coefficients", "source and target halves swapped", _gat(swap=True),
            ("one head on a path 0 - 1 - 2 plus an isolated node 3", "leaky_relu(s_dst[i, h] + s_src[j, h]")),
    Mistake("graph-gat-coefficients", "no self-loops", _gat(self_loops=False),
            ("one head on a path", "add the identity to adj")),
    Mistake("graph-gat-coefficients", "softmax over the queries", _gat(softmax_dim=-2),
            ("one head on a path", "softmax over j (the last dim)")),
    Mistake("graph-gat-coefficients", "negative_slope ignored (always 0.2)", _gat(slope=0.2),
            ("2 heads on a random directed graph, negative_slope = 0.01", "negative_slope")),
]

test_wrong_answers = mistake_test(MISTAKES)
