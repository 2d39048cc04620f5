"""Interactive explorers for the chapters, each of which also draws a static figure.

A widget needs a live Python kernel; the website has none. So every explorer here first
draws an ordinary matplotlib figure (which the website shows) and then returns an
``ipywidgets`` object that redraws the same picture when a reader moves a slider in
Jupyter or Colab.

Chapter 1 uses :func:`softmax_temperature_explorer` to show how the temperature ``T`` of
``softmax(e / T)`` and the ``1 / sqrt(d_k)`` factor of scaled dot-product attention
(Vaswani et al., 2017) sharpen or flatten attention weights. Chapter 3 uses
:func:`rope_rotation_explorer` to show that rotary embeddings (Su et al., 2024; arXiv
2021) make the score of a query at position ``m`` and a key at position ``n`` depend on
``n - m`` only.
"""

from __future__ import annotations

import math
from typing import Sequence

import ipywidgets
import matplotlib.pyplot as plt
import numpy as np
import torch

from .contract import check_int, check_real
from .core import attention_entropy

__all__ = [
    "DEFAULT_SCORES",
    "softmax_temperature_explorer",
    "rope_rotation_explorer",
]

#: Scores of one query against five keys (one clear winner, a runner-up, and three
#: weaker keys), where the temperature explorer starts.
DEFAULT_SCORES = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])


def _check_inputs(
    scores, temperatures: Sequence[float]
) -> tuple[torch.Tensor, list[float]]:
    fn = "softmax_temperature_explorer"
    if scores is None:
        scores = DEFAULT_SCORES
    elif isinstance(scores, torch.Tensor) and scores.dtype == torch.bool:
        raise TypeError(f"{fn}: scores must be real numbers, got a bool tensor")
    else:
        scores = _as_vector(fn, "scores", scores)
    if scores.dim() != 1 or scores.numel() < 2 or not torch.isfinite(scores).all():
        raise ValueError(
            f"{fn}: scores must be a 1-D tensor of at least 2 finite values, got shape "
            f"{tuple(scores.shape)}"
        )
    if isinstance(temperatures, (str, bytes)) or not len(temperatures):
        raise ValueError(
            f"{fn}: temperatures must be a non-empty sequence of positive finite "
            f"numbers, got {temperatures!r}"
        )
    return scores, [check_real(fn, "temperatures", t, above=0) for t in temperatures]


def _as_vector(fn: str, name: str, x) -> torch.Tensor:
    try:
        return torch.as_tensor(x, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{fn}: {name} must be numbers, got {x!r:.60}") from None


def _bars(ax, weights: torch.Tensor, title: str) -> None:
    """One bar per key, heights = weights, on a fixed [0, 1] axis so panels compare by
    eye."""
    ax.bar(np.arange(len(weights)), weights.numpy(), color="tab:blue")
    ax.set_ylim(0, 1)
    ax.set_xticks(np.arange(len(weights)))
    ax.set_xlabel("key j")
    ax.set_title(title)


def softmax_temperature_explorer(
    scores=None, temperatures: Sequence[float] = (0.25, 1.0, 4.0)
):
    r"""Show ``softmax(scores / T)`` for several temperatures ``T``, then return a
    slider explorer.

    Static figure (always drawn, so the website shows it): one bar chart of the weights
    ``alpha = softmax(scores / T)`` per temperature, side by side, and a last panel with
    the entropy ``H(alpha)`` (:func:`~attnbook.core.attention_entropy`) against ``T`` on
    a log axis: it rises from 0 (argmax, ``T -> 0``) to ``log S`` (uniform,
    ``T -> inf``), with the given temperatures marked.

    Interactive part (returned): an ``ipywidgets.interactive`` with

    * ``temperature``: a log-scale slider for ``T``;
    * ``d_k``: the scores are treated as unit-variance scores blown up to raw dot
      products of ``d_k``-dimensional vectors, ``e * sqrt(d_k)`` (their spread grows
      like ``sqrt(d_k)``);
    * ``scale``: divide by ``sqrt(d_k)`` again, as scaled dot-product attention does.

    Unscaled, a larger ``d_k`` saturates the softmax towards one-hot; scaled, the bars
    do not move.

    Args:
        scores: ``(S,)`` scores of one query against ``S >= 2`` keys; default
            ``DEFAULT_SCORES`` (2, 1, 0.5, 0, -1).
        temperatures: positive temperatures for the static panels.

    Returns the ``ipywidgets.interactive`` widget. Raises ``ValueError`` for bad scores
    or temperatures.
    """
    scores, temperatures = _check_inputs(scores, temperatures)

    # Static figure: len(temperatures) bar panels + one entropy panel.
    fig, axes = plt.subplots(
        1, len(temperatures) + 1, figsize=(3.0 * (len(temperatures) + 1), 3.0)
    )
    for ax, t in zip(axes[:-1], temperatures):
        weights = torch.softmax(scores / t, dim=-1)
        _bars(ax, weights, f"T = {t:g}, H = {attention_entropy(weights):.2f}")
    axes[0].set_ylabel("weight $\\alpha_j$")
    grid = torch.logspace(
        math.log10(min(temperatures)) - 1, math.log10(max(temperatures)) + 1, 200
    )
    ax = axes[-1]
    ax.semilogx(
        grid.numpy(),
        attention_entropy(torch.softmax(scores / grid[:, None], dim=-1)).numpy(),
    )
    ax.plot(
        temperatures,
        [
            float(attention_entropy(torch.softmax(scores / t, dim=-1)))
            for t in temperatures
        ],
        "o",
    )
    ax.axhline(
        math.log(len(scores)),
        color="gray",
        linestyle="--",
        label=f"log S = {math.log(len(scores)):.2f}",
    )
    ax.set_xlabel("temperature T")
    ax.set_ylabel("entropy H (nats)")
    ax.set_title("entropy grows with T")
    ax.legend(loc="lower right")
    plt.show()

    def redraw(temperature: float, d_k: int, scale: bool) -> None:
        logits = scores * math.sqrt(d_k)
        if scale:
            logits = logits / math.sqrt(d_k)
        weights = torch.softmax(logits / temperature, dim=-1)
        fig, ax = plt.subplots(figsize=(4.5, 3.0))
        _bars(
            ax,
            weights,
            f"max weight {weights.max():.2f}, H = {attention_entropy(weights):.2f}",
        )
        ax.set_ylabel("weight $\\alpha_j$")
        plt.show()

    return ipywidgets.interactive(
        redraw,
        temperature=ipywidgets.FloatLogSlider(
            value=1.0,
            base=10,
            min=-2,
            max=2,
            step=0.05,
            description="T",
            continuous_update=False,
        ),
        d_k=ipywidgets.SelectionSlider(
            options=[2**i for i in range(11)],
            value=1,
            description="d_k",
            continuous_update=False,
        ),
        scale=ipywidgets.Checkbox(value=False, description="scale by 1/sqrt(d_k)"),
    )


def _draw_rotation(rope, q: torch.Tensor, k: torch.Tensor, m: int, n: int, ax) -> float:
    """Draw ``q``, ``k`` (faint) and ``R_m q``, ``R_n k`` (bold) on ``ax``; return the
    rotated score."""
    qm = rope(q[None], positions=torch.tensor([m]))[0]
    kn = rope(k[None], positions=torch.tensor([n]))[0]
    for vec, color in ((q, "tab:blue"), (k, "tab:orange")):
        ax.annotate(
            "",
            vec.numpy(),
            (0, 0),
            arrowprops=dict(arrowstyle="->", color=color, alpha=0.3),
        )
    for vec, name, color in (
        (qm, f"$R_{{{m}}} q$", "tab:blue"),
        (kn, f"$R_{{{n}}} k$", "tab:orange"),
    ):
        ax.annotate(
            "", vec.numpy(), (0, 0), arrowprops=dict(arrowstyle="->", color=color, lw=2)
        )
        ax.text(*(1.15 * vec).numpy(), name, color=color, ha="center", va="center")
    ax.set_xlim(-1.35, 1.35)
    ax.set_ylim(-1.35, 1.35)
    ax.set_aspect("equal")
    score = float(qm @ kn)
    ax.set_title(f"m={m}, n={n}: score {score:.3f}")
    return score


def _check_rope_inputs(pairs, q, k) -> tuple[torch.Tensor, torch.Tensor]:
    fn = "rope_rotation_explorer"
    if not pairs:
        raise ValueError(f"{fn}: pairs must name at least one (m, n) position pair")
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"{fn}: pairs must hold (m, n) pairs, got {pair!r}")
        for position in pair:
            check_int(fn, "pairs (positions m, n)", position, minimum=0)
    q_t, k_t = _as_vector(fn, "q", q), _as_vector(fn, "k", k)
    if q_t.shape != (2,) or k_t.shape != (2,):
        raise ValueError(
            f"{fn}: q and k must be 2-D vectors, got shapes {tuple(q_t.shape)} and "
            f"{tuple(k_t.shape)}"
        )
    return q_t, k_t


def rope_rotation_explorer(
    pairs: Sequence[tuple[int, int]] = ((0, 1), (2, 3), (0, 3)),
    q: Sequence[float] = (1.0, 0.2),
    k: Sequence[float] = (0.8, 0.6),
):
    r"""Rotary embedding of one 2-D query/key pair. With ``dim = 2`` the only frequency
    is ``theta = base^0 = 1``: position ``m`` rotates by ``m`` radians.

    RoPE rotates ``q`` by ``m theta`` and ``k`` by ``n theta``, so :math:`(R_m q)^\top
    (R_n k) = q^\top R_{n-m} k` depends on ``n - m`` only. Draws one static panel per
    ``(m, n)`` in ``pairs`` (pairs with equal offsets show equal scores), then returns
    an ``ipywidgets`` interactive with sliders for ``m`` and ``n``.
    """
    from .positional import RotaryEmbedding

    q_t, k_t = _check_rope_inputs(pairs, q, k)
    rope = RotaryEmbedding(2)
    fig, axes = plt.subplots(
        1, len(pairs), figsize=(3.4 * len(pairs), 3.4), squeeze=False
    )
    for (m, n), ax in zip(pairs, axes[0]):
        _draw_rotation(rope, q_t, k_t, m, n, ax)
    plt.show()

    def redraw(m: int = 0, n: int = 1) -> None:
        fig, ax = plt.subplots(figsize=(3.6, 3.6))
        _draw_rotation(rope, q_t, k_t, m, n, ax)
        plt.show()

    return ipywidgets.interactive(redraw, m=(0, 10), n=(0, 10))
