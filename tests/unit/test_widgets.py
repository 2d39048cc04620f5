"""Tests for attnbook.widgets: the static figure is right, the widget is a widget, bad input fails."""

import math

import matplotlib

matplotlib.use("Agg")

import ipywidgets  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from attnbook.core import attention_entropy  # noqa: E402
from attnbook.widgets import DEFAULT_SCORES, softmax_temperature_explorer  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    plt.close("all")
    yield
    plt.close("all")


def _bar_heights(ax) -> torch.Tensor:
    return torch.tensor([patch.get_height() for patch in ax.patches], dtype=torch.float32)


def test_entropy_of_one_hot_and_uniform():
    assert attention_entropy(torch.tensor([0.0, 1.0, 0.0])).item() == 0.0
    assert attention_entropy(torch.full((7,), 1 / 7)).item() == pytest.approx(math.log(7))


@pytest.mark.parametrize("scores, temperatures", [(None, (0.25, 1.0, 4.0)), ([3.0, -1.0, 0.5, 2.0], (0.1, 10.0))])
def test_static_figure_shows_softmax_at_each_temperature(scores, temperatures):
    widget = softmax_temperature_explorer(scores, temperatures)
    expected_scores = DEFAULT_SCORES if scores is None else torch.tensor(scores)
    static = plt.figure(plt.get_fignums()[0])  # drawn first, before the widget's own redraw
    axes = static.axes
    assert len(axes) == len(temperatures) + 1  # one bar panel per temperature + the entropy panel
    for ax, t in zip(axes, temperatures):
        torch.testing.assert_close(_bar_heights(ax), torch.softmax(expected_scores / t, dim=-1))
    # The entropy panel's curve increases with T (temperature flattens the weights).
    entropy = axes[-1].lines[0].get_ydata()
    assert (entropy[1:] >= entropy[:-1] - 1e-6).all()
    assert isinstance(widget, ipywidgets.Widget)


def test_widget_redraws_with_d_k_and_scale():
    widget = softmax_temperature_explorer()
    controls = {child.description: child for child in widget.children if hasattr(child, "value")}
    assert {"T", "d_k", "scale by 1/sqrt(d_k)"} <= set(controls)
    controls["T"].value = 2.0
    controls["d_k"].value = 64
    unscaled = _bar_heights(plt.gcf().axes[0])
    torch.testing.assert_close(unscaled, torch.softmax(DEFAULT_SCORES * 8.0 / 2.0, dim=-1))
    controls["scale by 1/sqrt(d_k)"].value = True
    scaled = _bar_heights(plt.gcf().axes[0])
    torch.testing.assert_close(scaled, torch.softmax(DEFAULT_SCORES / 2.0, dim=-1))
    assert unscaled.max() > scaled.max()  # unscaled dot products saturate the softmax


@pytest.mark.parametrize("temperatures", [(0.0, 1.0), (-1.0,), (), (float("inf"),), (float("nan"),)])
def test_invalid_temperatures_raise(temperatures):
    with pytest.raises(ValueError, match="temperatures"):
        softmax_temperature_explorer(temperatures=temperatures)


@pytest.mark.parametrize("scores", [[1.0], [[1.0, 2.0]], [1.0, float("nan")]])
def test_invalid_scores_raise(scores):
    with pytest.raises(ValueError, match="scores"):
        softmax_temperature_explorer(scores)


def test_rope_explorer_scores_depend_on_the_offset_only():
    from attnbook.widgets import rope_rotation_explorer

    widget = rope_rotation_explorer(pairs=[(0, 1), (2, 3), (0, 3)])
    assert isinstance(widget, ipywidgets.Widget)
    titles = [ax.get_title() for ax in plt.figure(1).axes]
    scores = [float(t.rsplit(" ", 1)[1]) for t in titles]
    assert scores[0] == pytest.approx(scores[1], abs=1e-3) and abs(scores[0] - scores[2]) > 0.1
    q, k = torch.tensor([1.0, 0.2]), torch.tensor([0.8, 0.6])
    rot = torch.tensor([[math.cos(1.0), -math.sin(1.0)], [math.sin(1.0), math.cos(1.0)]])  # R_1, offset n - m = 1
    assert scores[0] == pytest.approx(float(q @ rot @ k), abs=1e-3)


def test_rope_explorer_rejects_bad_vectors():
    from attnbook.widgets import rope_rotation_explorer

    with pytest.raises(ValueError, match="q and k"):
        rope_rotation_explorer(q=(1.0, 0.0, 0.0))
