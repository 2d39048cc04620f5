"""The plotting helpers draw exactly the data they are given (Agg backend, no display)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from attnbook import viz  # noqa: E402


@pytest.fixture
def ax():
    fig, ax = plt.subplots()
    yield ax
    plt.close(fig)


def test_set_style_sets_the_book_rc_params():
    viz.set_style()
    assert plt.rcParams["figure.dpi"] == 110 and plt.rcParams["figure.autolayout"]
    assert plt.rcParams["axes.titleweight"] == "bold"


def test_to_numpy_handles_grad_low_precision_and_lists():
    t = torch.tensor([[0.25, 0.75]], dtype=torch.bfloat16, requires_grad=True)
    arr = viz.to_numpy(t * 1)
    assert isinstance(arr, np.ndarray) and arr.dtype == np.float32
    np.testing.assert_array_equal(arr, [[0.25, 0.75]])
    np.testing.assert_array_equal(viz.to_numpy([[1, 2]]), np.array([[1.0, 2.0]]))


def test_attention_heatmap_draws_the_given_matrix(ax):
    weights = torch.rand(3, 5, generator=torch.Generator().manual_seed(0)).softmax(-1)
    returned = viz.attention_heatmap(weights, x_labels=list("abcde"), y_labels=list("xyz"), ax=ax, title="w")
    assert returned is ax
    mesh = ax.collections[0]
    assert isinstance(mesh, matplotlib.collections.QuadMesh)
    np.testing.assert_allclose(np.asarray(mesh.get_array()).reshape(3, 5), weights.numpy(), rtol=1e-6)
    assert mesh.norm.vmin == 0.0 and mesh.norm.vmax == 1.0  # probabilities: a fixed colour scale
    assert [t.get_text() for t in ax.get_xticklabels()] == list("abcde")
    assert [t.get_text() for t in ax.get_yticklabels()] == list("xyz")
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("key", "query", "w")


def test_attention_heatmap_vmax_none_stretches_to_the_data(ax):
    scores = torch.tensor([[-2.0, 3.0], [0.5, 1.0]])
    viz.attention_heatmap(scores, ax=ax, vmax=None, cbar=False)
    mesh = ax.collections[0]
    assert (mesh.norm.vmin, mesh.norm.vmax) == (-2.0, 3.0)


@pytest.mark.parametrize("shape", [(4,), (1, 2, 3)])
def test_two_d_plots_reject_other_ranks(shape, ax):
    with pytest.raises(ValueError, match="weights must be 2-D"):
        viz.attention_heatmap(torch.ones(shape), ax=ax)
    with pytest.raises(ValueError, match="mask must be 2-D"):
        viz.plot_mask(torch.ones(shape, dtype=torch.bool), ax=ax)


def test_plot_mask_shows_the_boolean_mask(ax):
    mask = torch.ones(4, 6, dtype=torch.bool).tril(diagonal=2)
    viz.plot_mask(mask, ax=ax, title="causal")
    image = ax.images[0]
    np.testing.assert_array_equal(np.asarray(image.get_array()), mask.float().numpy())
    assert image.get_clim() == (0, 1)
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == ("key j", "query i", "causal")


def test_loglog_plot_legend_shows_the_fitted_slope(ax):
    x = [16, 32, 64, 128, 256]
    viz.loglog_plot(x, {"memory": [n**2 for n in x], "rnn": torch.tensor(x, dtype=torch.float64) * 3}, ax=ax,
                    ylabel="bytes")
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["memory (slope 2.00)", "rnn (slope 1.00)"]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), [n**2 for n in x])
    assert ax.get_ylabel() == "bytes"


def test_loglog_plot_without_fit_uses_plain_names(ax):
    viz.loglog_plot([1, 2, 4], {"cubic": [1, 8, 64]}, ax=ax, fit=False)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["cubic"]


def test_helpers_default_to_the_current_axes():
    fig = plt.figure()
    try:
        assert viz.plot_mask(torch.eye(3, dtype=torch.bool)) is fig.gca()
    finally:
        plt.close(fig)
