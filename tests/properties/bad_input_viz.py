"""Bad-input rows of attnbook.viz (see tests/properties/test_bad_input.py)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import torch  # noqa: E402
from test_bad_input import Bad, Edge  # noqa: E402

from attnbook.viz import attention_heatmap, loglog_plot, plot_mask, to_numpy  # noqa: E402

_W = torch.full((3, 4), 0.25)

ROWS = [
    Bad("attention_heatmap", "wrong-shape", lambda: attention_heatmap(torch.ones(2, 3, 4)),
        ("attention_heatmap", "weights")),
    Bad("attention_heatmap", "wrong-shape", lambda: attention_heatmap(_W, ["a", "b"]), ("attention_heatmap", "x_labels")),
    Bad("attention_heatmap", "wrong-shape", lambda: attention_heatmap(_W, y_labels="abc"),
        ("attention_heatmap", "y_labels")),
    Bad("attention_heatmap", "nan", lambda: attention_heatmap(_W, vmax=float("nan")), ("attention_heatmap", "vmax")),
    Bad("attention_heatmap", "wrong-type", lambda: attention_heatmap("weights"), ("attention_heatmap", "weights")),
    Bad("attention_heatmap", "wrong-type", lambda: attention_heatmap(_W, annot="yes"), ("attention_heatmap", "annot")),
    Bad("plot_mask", "wrong-shape", lambda: plot_mask(torch.ones(4, dtype=torch.bool)), ("plot_mask", "mask")),
    Bad("plot_mask", "wrong-type", lambda: plot_mask({"a": 1}), ("plot_mask", "mask")),
    Bad("loglog_plot", "wrong-shape", lambda: loglog_plot([1, 2, 4], {"a": [1, 4]}), ("loglog_plot", "series")),
    Bad("loglog_plot", "wrong-type", lambda: loglog_plot([1, 2, 4], [1, 4, 16]), ("loglog_plot", "series")),
    Bad("loglog_plot", "empty", lambda: loglog_plot([1, 2, 4], {}), ("loglog_plot", "series")),
    Bad("loglog_plot", "wrong-type", lambda: loglog_plot([1, 2], {"a": [1, 2]}, fit="yes"), ("loglog_plot", "fit")),
    Bad("to_numpy", "wrong-type", lambda: to_numpy("abc"), ("to_numpy", "x")),
    Edge("to_numpy", "integer-dtype", lambda: to_numpy(torch.arange(3)),
         lambda a: a.dtype.kind == "f" and a.tolist() == [0.0, 1.0, 2.0]),
    Edge("to_numpy", "empty", lambda: to_numpy([]), lambda a: a.shape == (0,)),
]
EXEMPT = {"set_style": "takes no argument"}
