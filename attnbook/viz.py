"""Plotting helpers so every chapter looks the same: attention heatmaps, masks, log-log
scaling plots."""

from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
import torch

from .contract import check_flag, check_real

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
    try:
        return np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(
            "to_numpy: x must be a tensor, an array or a (nested) sequence of "
            "numbers, "
            f"got {x!r:.60}"
        ) from None


def _check_2d(fn: str, name: str, x) -> np.ndarray:
    try:
        a = to_numpy(x)
    except TypeError:
        raise TypeError(
            f"{fn}: {name} must be a 2-D tensor or array, got {x!r:.60}"
        ) from None
    if a.ndim != 2:
        raise ValueError(
            f"{fn}: {name} must be 2-D (queries, keys), got shape {a.shape}"
        )
    return a


def _check_heatmap(weights, x_labels, y_labels, annot, vmax, cbar) -> np.ndarray:
    fn = "attention_heatmap"
    w = _check_2d(fn, "weights", weights)
    for name, labels, n in (
        ("x_labels", x_labels, w.shape[1]),
        ("y_labels", y_labels, w.shape[0]),
    ):
        if labels is not None and (isinstance(labels, str) or len(labels) != n):
            raise ValueError(
                f"{fn}: {name} must be {n} labels for weights of shape {w.shape}, got "
                f"{labels!r:.60}"
            )
    if vmax is not None:
        check_real(fn, "vmax", vmax, above=0)
    check_flag(fn, "annot", annot)
    check_flag(fn, "cbar", cbar)
    return w


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
    w = _check_heatmap(weights, x_labels, y_labels, annot, vmax, cbar)
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
    m = _check_2d("plot_mask", "mask", mask)
    ax = ax or plt.gca()
    ax.imshow(m, cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xlabel("key j")
    ax.set_ylabel("query i")
    ax.grid(False)
    if title:
        ax.set_title(title)
    return ax


def _check_loglog_plot(x, series, fit) -> None:
    fn = "loglog_plot"
    check_flag(fn, "fit", fit)
    if not isinstance(series, Mapping) or not series:
        raise TypeError(
            f"{fn}: series must be a non-empty mapping {{name: values}}, got "
            f"{series!r:.60}"
        )
    n = len(to_numpy(x).reshape(-1))
    for name, y in series.items():
        if len(to_numpy(y).reshape(-1)) != n:
            raise ValueError(
                f"{fn}: series[{name!r}] has {len(to_numpy(y).reshape(-1))} values for "
                f"{n} x values"
            )


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

    _check_loglog_plot(x, series, fit)
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
