"""Plotting helpers so every chapter looks the same: attention heatmaps, masks, log-log
scaling plots."""

from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
import torch

__all__ = ["set_style", "attention_heatmap", "plot_mask", "loglog_plot", "to_numpy"]

CMAP = "rocket_r"


def set_style() -> None:
    """The book's plot style: seaborn's white grid, readable fonts, tight figures."""
    sns.set_theme(style="whitegrid", context="notebook", font_scale=0.95)
    plt.rcParams.update(
        {"figure.dpi": 110, "figure.autolayout": True, "axes.titleweight": "bold"}
    )


def to_numpy(x) -> np.ndarray:
    """A tensor (any device, any dtype, with or without grad) or array as a float NumPy
    array."""
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=float)


def attention_heatmap(
    weights,
    x_labels: Sequence[str] | None = None,
    y_labels: Sequence[str] | None = None,
    *,
    ax=None,
    title: str | None = None,
    annot: bool = False,
    vmax: float | None = 1.0,
    cbar: bool = True,
):
    """Heatmap of a 2-D ``(queries, keys)`` weight matrix: rows are queries, columns are
    keys.

    ``vmax=1`` keeps colours comparable across plots (weights are probabilities); pass
    ``None`` to stretch the colour scale to the data (for scores, not weights).
    """
    w = to_numpy(weights)
    if w.ndim != 2:
        raise ValueError(f"weights must be 2-D (queries, keys), got shape {w.shape}")
    ax = ax or plt.gca()
    sns.heatmap(
        w,
        ax=ax,
        cmap=CMAP,
        vmin=0.0 if vmax is not None else None,
        vmax=vmax,
        square=w.shape[0] == w.shape[1],
        annot=annot,
        fmt=".2f",
        cbar=cbar,
        linewidths=0.5 if max(w.shape) <= 16 else 0,
        xticklabels=x_labels if x_labels is not None else "auto",
        yticklabels=y_labels if y_labels is not None else "auto",
    )
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    return ax


def plot_mask(mask, *, ax=None, title: str | None = None):
    """Show a boolean mask (True = may attend) as dark cells on white; rows are
    queries."""
    m = to_numpy(mask)
    if m.ndim != 2:
        raise ValueError(f"mask must be 2-D (queries, keys), got shape {m.shape}")
    ax = ax or plt.gca()
    ax.imshow(m, cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    ax.grid(False)
    if title:
        ax.set_title(title)
    return ax


def loglog_plot(
    x: Sequence[float],
    series: Mapping[str, Sequence[float]],
    *,
    ax=None,
    xlabel: str = "sequence length n",
    ylabel: str = "",
    title: str | None = None,
    fit: bool = True,
):
    """Log-log plot of several series against ``x``; with ``fit`` each legend shows its
    fitted slope.

    A straight line of slope ``p`` on log-log axes means ``y ~ x^p``: attention's memory
    shows slope 2, a recurrent layer's slope 1.
    """
    from .complexity import loglog_slope

    ax = ax or plt.gca()
    for name, y in series.items():
        y = to_numpy(y)
        label = f"{name} (slope {loglog_slope(x, y):.2f})" if fit else name
        ax.loglog(x, y, "o-", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    if title:
        ax.set_title(title)
    return ax
