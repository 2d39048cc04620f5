"""attnbook.graph against dense references written out with explicit loops over nodes and edges."""

import pytest
import torch
import torch.nn.functional as F

from attnbook import graph
from attnbook.core import scaled_dot_product_attention
from attnbook.data import karate_club


def _random_graph(gen, N=7, E=18, with_loops=True):
    edge_index = torch.randint(0, N, (2, E), generator=gen)
    if with_loops:  # make sure some existing self-loops (even duplicated ones) are present to be replaced
        edge_index = torch.cat([edge_index, torch.tensor([[2, 2, 5], [2, 2, 5]])], dim=1)
    return edge_index


def _randomize(module, gen):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return module


def _reference_gat(layer, x, edge_index):
    """GAT written the slow obvious way: per head, per target node, a loop over its in-neighbours."""
    N = x.shape[0]
    H, C = layer.heads, layer.out_dim
    W = layer.lin.weight  # (H*C, in)
    a_src, a_dst = layer.att_src[0], layer.att_dst[0]  # (H, C)
    neighbours = {i: set() for i in range(N)}
    for j, i in edge_index.T.tolist():
        if i != j or not layer.add_self_loops:  # existing self-loops are kept only without add_self_loops
            neighbours[i].add(j)  # duplicate edges collapse here, so the test graphs avoid them below
    if layer.add_self_loops:
        for i in range(N):
            neighbours[i].add(i)
    out = torch.zeros(N, H, C, dtype=torch.float64)
    for h in range(H):
        Wh = W[h * C:(h + 1) * C].double()
        for i in range(N):
            js = sorted(neighbours[i])
            if not js:
                continue
            zi = Wh @ x[i].double()
            e = torch.stack([F.leaky_relu(a_dst[h].double() @ zi + a_src[h].double() @ (Wh @ x[j].double()),
                                          layer.negative_slope) for j in js])
            alpha = torch.exp(e - e.max()) / torch.exp(e - e.max()).sum()
            out[i, h] = sum(alpha[n] * (Wh @ x[j].double()) for n, j in enumerate(js))
    out = out.reshape(N, H * C) if layer.concat else out.mean(1)
    return out + layer.bias.double() if layer.bias is not None else out


def _simple_graph(gen, N=7, p=0.35):
    """A random directed graph without duplicate edges (plus a few self-loops to be replaced)."""
    adj = torch.rand(N, N, generator=gen) < p
    adj[2, 2] = adj[5, 5] = True
    i, j = adj.nonzero().T
    return torch.stack([j, i])


def test_add_self_loops_replaces_existing_loops():
    ei = torch.tensor([[0, 1, 1, 2, 2], [1, 0, 1, 2, 0]])
    out = graph.add_self_loops(ei, 4)
    loops = out[:, out[0] == out[1]]
    assert sorted(loops[0].tolist()) == [0, 1, 2, 3]  # exactly one per node, node 3 included
    assert out.shape[1] == 3 + 4


def test_edge_index_is_validated():
    with pytest.raises(ValueError, match="edge_index"):
        graph.add_self_loops(torch.tensor([[0, 5], [1, 0]]), 3)
    with pytest.raises(ValueError, match=r"\(2, E\)"):
        graph.to_dense_adjacency(torch.zeros(3, 4, dtype=torch.long), 3)


def test_edge_softmax_sums_to_one_per_target(gen):
    ei = _random_graph(gen)
    scores = torch.randn(ei.shape[1], 3, generator=gen) * 10
    alpha = graph.edge_softmax(scores, ei[1], 7)
    sums = torch.zeros(7, 3).index_add_(0, ei[1], alpha)
    has_in = torch.zeros(7, dtype=torch.bool)
    has_in[ei[1]] = True
    torch.testing.assert_close(sums[has_in], torch.ones(int(has_in.sum()), 3))
    for i in ei[1].unique().tolist():  # each group is an ordinary softmax
        torch.testing.assert_close(alpha[ei[1] == i], torch.softmax(scores[ei[1] == i], dim=0))


@pytest.mark.parametrize("heads,concat", [(1, True), (3, True), (3, False)])
@pytest.mark.parametrize("add_loops", [True, False])
def test_gat_matches_the_loop_reference(gen, heads, concat, add_loops):
    ei = _simple_graph(gen)
    layer = _randomize(graph.GATLayer(5, 4, heads=heads, concat=concat, add_self_loops=add_loops), gen)
    x = torch.randn(7, 5, generator=gen)
    out = layer(x, ei)
    assert out.shape == (7, heads * 4 if concat else 4)
    torch.testing.assert_close(out.double(), _reference_gat(layer, x, ei), atol=1e-5, rtol=1e-4)


def test_gat_parameter_layout_is_the_conventional_one():
    layer = graph.GATLayer(6, 5, heads=2)
    shapes = {name: tuple(p.shape) for name, p in layer.named_parameters()}
    assert shapes == {"att_src": (1, 2, 5), "att_dst": (1, 2, 5), "bias": (10,), "lin.weight": (10, 6)}
    assert tuple(graph.GATLayer(6, 5, heads=2, concat=False).bias.shape) == (5,)
    assert graph.GATLayer(6, 5, bias=False).bias is None


@pytest.mark.parametrize("heads,concat", [(1, True), (2, True), (4, False)])
def test_gat_dense_form_equals_the_edge_form(gen, heads, concat):
    ei = _simple_graph(gen, N=9)
    layer = _randomize(graph.GATLayer(3, 4, heads=heads, concat=concat), gen)
    x = torch.randn(9, 3, generator=gen)
    out, (used, alpha) = layer(x, ei, return_weights=True)
    dense_out, dense_alpha = layer.forward_dense(x, graph.to_dense_adjacency(ei, 9), return_weights=True)
    torch.testing.assert_close(dense_out, out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dense_alpha[:, used[1], used[0]].T, alpha, atol=1e-6, rtol=1e-5)
    off_graph = ~(graph.to_dense_adjacency(ei, 9) | torch.eye(9, dtype=torch.bool))
    assert (dense_alpha[:, off_graph] == 0).all()


def test_gat_is_equivariant_to_node_relabelling(gen):
    ei = _simple_graph(gen, N=8)
    layer = _randomize(graph.GATLayer(4, 3, heads=2), gen)
    x = torch.randn(8, 4, generator=gen)
    perm = torch.randperm(8, generator=gen)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(8)  # node perm[n] is called n in the relabelled graph
    torch.testing.assert_close(layer(x[perm], inverse[ei]), layer(x, ei)[perm], atol=1e-6, rtol=1e-5)


def test_gat_dropout_only_in_training(gen):
    ei = _simple_graph(gen)
    layer = graph.GATLayer(5, 4, heads=2, dropout=0.5)
    x = torch.randn(7, 5, generator=gen)
    layer.eval()
    torch.testing.assert_close(layer(x, ei), layer(x, ei))
    layer.train()
    torch.manual_seed(0)
    assert not torch.allclose(layer(x, ei), layer.eval()(x, ei))


def test_gcn_matches_the_dense_normalized_adjacency(gen):
    ei = _random_graph(gen, N=6, E=14)
    layer = _randomize(graph.GCNLayer(5, 3), gen)
    x = torch.randn(6, 5, generator=gen)
    A = torch.zeros(6, 6, dtype=torch.float64)
    for j, i in ei.T.tolist():  # duplicated edges count twice, as in message passing
        if i != j:
            A[i, j] += 1
    A_hat = A + torch.eye(6, dtype=torch.float64)
    d = A_hat.sum(1)
    expected = (A_hat / torch.sqrt(d[:, None] * d[None, :])) @ (x.double() @ layer.lin.weight.double().T) + layer.bias.double()
    torch.testing.assert_close(layer(x, ei).double(), expected, atol=1e-5, rtol=1e-5)


def test_gcn_weights_do_not_depend_on_the_features(gen):
    ei = _simple_graph(gen)
    layer = graph.GCNLayer(5, 3, bias=False)
    x = torch.randn(7, 5, generator=gen)
    torch.testing.assert_close(layer(2 * x, ei), 2 * layer(x, ei))  # linear in x: the routing is fixed
    gat = _randomize(graph.GATLayer(5, 3, bias=False), gen)
    assert not torch.allclose(gat(2 * x, ei), 2 * gat(x, ei))  # GAT's routing moves with the data


@pytest.mark.parametrize("leading", [(), (3,), (2, 3)])
def test_self_attention_is_message_passing_on_the_complete_graph(gen, leading):
    N, E = 6, 4
    q, k, v = (torch.randn(*leading, N, E, generator=gen) for _ in range(3))
    out = graph.message_passing_attention(q, k, v, graph.complete_graph(N))
    expected = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_message_passing_on_a_sparse_graph_is_masked_attention(gen):
    ei = _simple_graph(gen, N=8)
    q, k, v = (torch.randn(8, 5, generator=gen) for _ in range(3))
    adj = graph.to_dense_adjacency(ei, 8)
    out = graph.message_passing_attention(q, k, v, ei, scale=0.7)
    torch.testing.assert_close(out, scaled_dot_product_attention(q, k, v, adj, scale=0.7), atol=1e-6, rtol=1e-5)


def test_complete_graph_edges():
    ei = graph.complete_graph(4)
    assert ei.shape == (2, 16) and graph.to_dense_adjacency(ei, 4).all()
    no_loops = graph.complete_graph(4, self_loops=False)
    assert no_loops.shape == (2, 12) and not (no_loops[0] == no_loops[1]).any()


def test_gnn_models_run_and_validate():
    data = karate_club()
    for kind in ("gcn", "gat"):
        logits = graph.GNN(kind, 34, 8, 2).eval()(data["x"], data["edge_index"])
        assert logits.shape == (34, 2) and torch.isfinite(logits).all()
    with pytest.raises(ValueError, match="kind"):
        graph.GNN("mlp", 34, 8, 2)


def test_gat_classifier_defaults_to_the_papers_cora_layout():
    """Velickovic et al. (2018), Cora: 8 heads of 8 features concatenated, then one head."""
    model = graph.GNN("gat", in_dim=34, hidden=8, n_classes=2)
    assert (model.layer1.heads, model.layer1.out_dim, model.layer1.concat) == (8, 8, True)
    assert model.layer2.in_dim == 64 and model.layer2.heads == 1
    x = torch.eye(34)
    edge_index = karate_club()["edge_index"]
    assert model.layer1(x, edge_index).shape == (34, 64)


# --- float64 accuracy, and bad input ------------------------------------------------------------
def _dense_gcn_reference(layer, x, edge_index):
    """``D^-1/2 (A + I) D^-1/2 X W^T + b`` in float64 with dense matrices built edge by edge:
    ``A[i, j]`` counts the edges ``j -> i`` (a repeated edge counts twice). With
    ``add_self_loops`` the listed self-loops are dropped and ``I`` added; without, ``A`` is used
    as listed and a node of degree 0 gets zeros."""
    N = x.shape[0]
    A = torch.zeros(N, N, dtype=torch.float64)
    for j, i in edge_index.T.tolist():
        if i != j or not layer.add_self_loops:
            A[i, j] += 1.0
    if layer.add_self_loops:
        A += torch.eye(N, dtype=torch.float64)
    deg = A.sum(1)
    inv_sqrt = torch.zeros(N, dtype=torch.float64)
    for n in range(N):
        if deg[n] > 0:
            inv_sqrt[n] = 1.0 / deg[n].sqrt()
    propagation = torch.diag(inv_sqrt) @ A @ torch.diag(inv_sqrt)
    out = propagation @ x.double() @ layer.lin.weight.double().T
    return out if layer.bias is None else out + layer.bias.double()


@pytest.mark.parametrize("add_loops", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_float64_gcn_matches_the_dense_reference_to_float64_precision(seed, add_loops):
    """Degrees used to be counted in float32 whatever the input: float64 was off by 1e-7."""
    g = torch.Generator().manual_seed(seed)
    N = 9
    edges = torch.randint(0, N - 2, (2, 25), generator=g)  # nodes 7 and 8 stay isolated
    repeated = edges[:, :4]  # multi-edges: counted twice in the degree and in the sum
    loops = torch.tensor([[1, 1, 3], [1, 1, 3]])  # self-loops already present, one duplicated
    edge_index = torch.cat([edges, repeated, loops], dim=1)
    layer = _randomize(graph.GCNLayer(5, 3, add_self_loops=add_loops), g).double()
    x = torch.randn(N, 5, generator=g, dtype=torch.float64)
    out = layer(x, edge_index)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, _dense_gcn_reference(layer, x, edge_index), rtol=0, atol=1e-13)
    used, weight = layer.edge_weights(edge_index, N, dtype=torch.float64)
    assert weight.dtype == torch.float64
    assert layer.edge_weights(edge_index, N)[1].dtype == torch.get_default_dtype()


def test_float64_gat_matches_the_loop_reference_to_float64_precision(gen):
    ei = _simple_graph(gen, N=8)
    layer = _randomize(graph.GATLayer(5, 4, heads=3), gen).double()
    x = torch.randn(8, 5, generator=gen, dtype=torch.float64)
    out = layer(x, ei)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, _reference_gat(layer, x, ei), rtol=0, atol=1e-12)
    dense = layer.forward_dense(x, graph.to_dense_adjacency(ei, 8))
    torch.testing.assert_close(dense, out, rtol=0, atol=1e-12)
    q, k, v = (torch.randn(8, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    by_edges = graph.message_passing_attention(q, k, v, ei)
    masked = scaled_dot_product_attention(q, k, v, graph.to_dense_adjacency(ei, 8))
    torch.testing.assert_close(by_edges, masked, rtol=0, atol=1e-13)


_X = torch.randn(4, 3)
_EI = torch.tensor([[0, 1, 2], [1, 2, 3]])
BAD_GRAPH_INPUTS = [
    # (call, error, fragments every message must contain)
    (lambda: graph.GCNLayer(0, 2), ValueError, ["GCNLayer", "in_dim", "positive integer", "0"]),
    (lambda: graph.GCNLayer(3, -1), ValueError, ["GCNLayer", "out_dim", "-1"]),
    (lambda: graph.GCNLayer(3.0, 2), ValueError, ["GCNLayer", "in_dim", "3.0"]),
    (lambda: graph.GATLayer(3, 2, heads=0), ValueError, ["GATLayer", "heads", "0"]),
    (lambda: graph.GATLayer(3, 2, dropout=float("nan")), ValueError, ["GATLayer", "dropout", "[0, 1)", "nan"]),
    (lambda: graph.GATLayer(3, 2, dropout=-0.1), ValueError, ["GATLayer", "dropout", "-0.1"]),
    (lambda: graph.GATLayer(3, 2, dropout=1.0), ValueError, ["GATLayer", "dropout", "1.0"]),
    (lambda: graph.GATLayer(3, 2, negative_slope=float("inf")), ValueError, ["GATLayer", "negative_slope"]),
    (lambda: graph.GNN("mlp", 3, 4, 2), ValueError, ["GNN", "kind", "'mlp'"]),
    (lambda: graph.GNN("gat", 3, 4, 2, heads=0), ValueError, ["GNN", "heads", "0"]),
    (lambda: graph.GNN("gcn", 3, 0, 2), ValueError, ["GNN", "hidden", "0"]),
    (lambda: graph.GNN("gcn", 3, 4, 2, dropout=1.5), ValueError, ["GNN", "dropout", "1.5"]),
    (lambda: graph.GCNLayer(3, 2)(_X, torch.tensor([[0, 4], [1, 1]])), ValueError,
     ["GCNLayer", "edge_index", "0..3", "[0, 4]"]),
    (lambda: graph.GATLayer(3, 2)(_X, torch.tensor([[-1, 0], [1, 1]])), ValueError,
     ["GATLayer", "edge_index", "0..3", "[-1, 1]"]),
    (lambda: graph.GATLayer(3, 2)(_X, _EI.int()), TypeError, ["GATLayer", "edge_index", "int64", "int32"]),
    (lambda: graph.GCNLayer(3, 2)(_X, _EI[:1]), ValueError, ["GCNLayer", "edge_index", "(2, E)", "(1, 3)"]),
    (lambda: graph.GCNLayer(3, 2)(_X[:, :2], _EI), ValueError, ["GCNLayer", "x", "in_dim=3", "(4, 2)"]),
    (lambda: graph.GATLayer(3, 2)(_X.long(), _EI), TypeError, ["GATLayer", "x", "floating"]),
    (lambda: graph.GNN("gcn", 3, 4, 2)(_X[0], _EI), ValueError, ["GNN", "x", "(N, in_dim=3)", "(3,)"]),
    (lambda: graph.GATLayer(3, 2).forward_dense(_X, torch.ones(4, 4)), TypeError,
     ["forward_dense", "adj", "bool", "float32"]),
    (lambda: graph.GATLayer(3, 2).forward_dense(_X, torch.ones(4, 3, dtype=torch.bool)), ValueError,
     ["forward_dense", "adj", "(4, 4)", "(4, 3)"]),
    (lambda: graph.add_self_loops(_EI, 3), ValueError, ["add_self_loops", "edge_index", "0..2", "[0, 3]"]),
    (lambda: graph.add_self_loops(_EI, -1), ValueError, ["add_self_loops", "num_nodes", "-1"]),
    (lambda: graph.to_dense_adjacency(_EI, 2.5), ValueError, ["to_dense_adjacency", "num_nodes", "2.5"]),
    (lambda: graph.complete_graph(-1), ValueError, ["complete_graph", "num_nodes", "-1"]),
    (lambda: graph.edge_softmax(torch.randn(3), torch.tensor([0, 1, 5]), 3), ValueError,
     ["edge_softmax", "target", "0..2", "[0, 5]"]),
    (lambda: graph.edge_softmax(torch.randn(3), torch.tensor([0, 1]), 3), ValueError,
     ["edge_softmax", "(E, ...)", "(3,)", "(2,)"]),
    (lambda: graph.edge_softmax(torch.randn(3), torch.tensor([0.0, 1.0, 1.0]), 3), TypeError,
     ["edge_softmax", "target", "int64"]),
    (lambda: graph.message_passing_attention(_X, _X, _X, torch.tensor([[0, 9], [1, 1]])), ValueError,
     ["message_passing_attention", "edge_index", "[0, 9]"]),
    (lambda: graph.message_passing_attention(_X, _X, _X, _EI, scale=float("nan")), ValueError,
     ["message_passing_attention", "scale", "nan"]),
]


@pytest.mark.parametrize("call,error,fragments", BAD_GRAPH_INPUTS,
                         ids=[f"{i}-{f[0]}-{f[1]}" for i, (_, _, f) in enumerate(BAD_GRAPH_INPUTS)])
def test_bad_graph_input_is_refused_with_a_clear_message(call, error, fragments):
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from: {message}"


def test_empty_and_isolated_graphs_give_the_documented_result(gen):
    """No edge at all: GCN gives each node its own features (the self-loop, weight 1), GAT
    attends to itself only, and a graph of zero nodes gives zero rows."""
    empty = torch.zeros(2, 0, dtype=torch.long)
    x = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    gcn = _randomize(graph.GCNLayer(3, 2), gen).double()
    torch.testing.assert_close(gcn(x, empty), gcn.lin(x) + gcn.bias)
    no_loops = _randomize(graph.GCNLayer(3, 2, add_self_loops=False), gen).double()
    torch.testing.assert_close(no_loops(x, empty), no_loops.bias.expand(4, 2))  # no edge: zeros + b
    gat = _randomize(graph.GATLayer(3, 2, heads=2), gen).double()
    torch.testing.assert_close(gat(x, empty), gat.lin(x) + gat.bias)
    assert gcn(x[:0], empty).shape == (0, 2) and gat(x[:0], empty).shape == (0, 4)
    assert graph.complete_graph(0).shape == (2, 0) and graph.add_self_loops(empty, 0).shape == (2, 0)
