"""Bad-input rows for attnbook.graph (see tests/properties/test_bad_input.py): the cases of
``test_graph.BAD_GRAPH_INPUTS``, each with its public name and class of wrong input,
plus a few more classes."""

import torch
from test_bad_input import Bad, Edge
from test_graph import BAD_GRAPH_INPUTS

from attnbook import graph

_X = torch.randn(4, 3)
_EI = torch.tensor([[0, 1, 2], [1, 2, 3]])

# (public name, class of wrong input, needles to add) for each BAD_GRAPH_INPUTS entry, in order
_TABLE = [
    ("GCNLayer", "zero", ()), ("GCNLayer", "negative", ()), ("GCNLayer", "non-integer", ()),
    ("GATLayer", "zero", ()), ("GATLayer", "nan", ()), ("GATLayer", "negative", ()),
    ("GATLayer", "out-of-range", ()), ("GATLayer", "nan", ()), ("GNN", "wrong-type", ()),
    ("GNN", "zero", ()), ("GNN", "zero", ()), ("GNN", "out-of-range", ()),
    ("GCNLayer", "out-of-range", ()), ("GATLayer", "out-of-range", ()), ("GATLayer", "wrong-dtype", ()),
    ("GCNLayer", "wrong-shape", ()), ("GCNLayer", "wrong-shape", ()), ("GATLayer", "integer-dtype", ()),
    ("GNN", "wrong-shape", ()), ("GATLayer", "wrong-dtype", ()), ("GATLayer", "wrong-shape", ()),
    ("add_self_loops", "out-of-range", ()), ("add_self_loops", "negative", ()),
    ("to_dense_adjacency", "non-integer", ()), ("complete_graph", "negative", ()),
    ("edge_softmax", "out-of-range", ()), ("edge_softmax", "wrong-shape", ("scores", "target")),
    ("edge_softmax", "wrong-dtype", ()), ("message_passing_attention", "out-of-range", ()),
    ("message_passing_attention", "nan", ()),
]  # fmt: skip
assert len(_TABLE) == len(BAD_GRAPH_INPUTS), "test_graph.BAD_GRAPH_INPUTS changed: update _TABLE"

ROWS = [
    Bad(target, what, call, tuple(fragments) + extra, error)
    for (target, what, extra), (call, error, fragments) in zip(_TABLE, BAD_GRAPH_INPUTS)
] + [
    Bad("GCNLayer", "boolean", lambda: graph.GCNLayer(True, 2), ("GCNLayer", "in_dim")),
    Bad("GNN", "non-integer", lambda: graph.GNN("gcn", 3, 2.5, 2), ("GNN", "hidden")),
    Bad("complete_graph", "boolean", lambda: graph.complete_graph(True), ("complete_graph", "num_nodes")),
    Edge("complete_graph", "empty", lambda: graph.complete_graph(0), lambda ei: ei.shape == (2, 0)),
    Bad("to_dense_adjacency", "wrong-dtype", lambda: graph.to_dense_adjacency(_EI.float(), 4),
        ("to_dense_adjacency", "edge_index")),
    Edge("add_self_loops", "empty", lambda: graph.add_self_loops(torch.zeros(2, 0, dtype=torch.long), 3),
         lambda ei: torch.equal(ei, torch.tensor([[0, 1, 2], [0, 1, 2]]))),
    Bad("message_passing_attention", "integer-dtype",
        lambda: graph.message_passing_attention(_X.long(), _X, _X, _EI), ("message_passing_attention", "q")),
    Bad("message_passing_attention", "wrong-shape",
        lambda: graph.message_passing_attention(_X, _X[:3], _X[:3], _EI), ("message_passing_attention", "q", "k")),
]  # fmt: skip

EXEMPT: dict[str, str] = {}
