"""Layers that several mechanisms share: the norm and the multi-head shell.

Every attention layer of the book does the same three things around the part that
differs: it projects its input to queries, keys and values, splits the width into
heads, and, once attention has mixed the values, merges the heads back and projects
them out. The layers that differ only in *how they attend* (grouped-query attention
with a KV cache in :mod:`attnbook.models`, Transformer-XL's relative attention in
:mod:`attnbook.kvcache`, multi-head latent attention and the paged decode step in
:mod:`attnbook.serving`) share this shell:

* :func:`split_heads`: ``(B, T, heads * head_dim)`` -> ``(B, heads, T, head_dim)``;
* :func:`merge_heads`: the inverse, ``(B, heads, T, head_dim)`` -> ``(B, T, heads *
  head_dim)``;
* :func:`scale_heads`: each head's output times its entry of a ``head_mask`` (Michel,
  Levy & Neubig, 2019: 1 keeps a head, 0 removes it);
* :class:`HeadShell`: the three together as the two methods of a layer, ``project``
  (queries, keys and values in heads) and ``merge`` (heads back through the output
  projection), for any layer with ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj``.

:class:`RMSNorm` (Zhang and Sennrich, 2019) is the norm of the Transformer block and of
multi-head latent attention's latents. This module sits low in the package: it imports
only torch and :mod:`attnbook.contract`, so the models and the serving layers can both
build on it without importing each other.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from .contract import check_float, check_int, check_sizes

__all__ = ["RMSNorm", "split_heads", "merge_heads", "scale_heads", "HeadShell"]


def _check_heads(fn: str, x, heads: int) -> None:
    check_float(fn, "x", x)
    check_int(fn, "heads", heads)
    if x.dim() != 3 or x.shape[-1] % heads:
        raise ValueError(
            f"{fn}: x must have shape (batch, seq, heads * head_dim) with a width "
            f"divisible by heads={heads}, got {tuple(x.shape)}"
        )


def _check_width(fn: str, x, dim: int) -> None:
    """``x`` a floating tensor ``(..., dim)``."""
    check_float(fn, "x", x)
    if x.dim() < 1 or x.shape[-1] != dim:
        raise ValueError(
            f"{fn}: x must have shape (..., dim={dim}), got {tuple(x.shape)}"
        )


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``(B, T, heads * head_dim)`` -> ``(B, heads, T, head_dim)``: the width cut into
    ``heads`` slices of ``head_dim``, heads first (a view, no copy)."""
    _check_heads("split_heads", x, heads)
    B, T, width = x.shape
    return x.view(B, T, heads, width // heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(B, heads, T, head_dim)`` -> ``(B, T, heads * head_dim)``: the heads'
    outputs side by side again, what the output projection reads."""
    check_float("merge_heads", "x", x)
    if x.dim() != 4:
        raise ValueError(
            "merge_heads: x must have shape (batch, heads, seq, head_dim), got "
            f"{tuple(x.shape)}"
        )
    B, H, T, d = x.shape
    return x.transpose(1, 2).reshape(B, T, H * d)


def scale_heads(x: torch.Tensor, head_mask: torch.Tensor | None) -> torch.Tensor:
    """``x (B, heads, T, width)`` times ``head_mask`` per head: ``head_mask`` is
    ``(heads,)`` or ``(B, heads)`` (1 keeps a head, 0 removes it, DropHead scales the
    kept ones); ``None`` returns ``x`` as it is."""
    if head_mask is None:
        return x
    check_float("scale_heads", "x", x)
    check_float("scale_heads", "head_mask", head_mask)
    if x.dim() != 4 or tuple(head_mask.shape) not in (
        (x.shape[1],),
        (x.shape[0], x.shape[1]),
    ):
        raise ValueError(
            f"scale_heads: head_mask must have shape (heads,) or (batch, heads) for x "
            f"(batch, heads, seq, width) = {tuple(x.shape)}, got "
            f"{tuple(head_mask.shape)}"
        )
    return x * head_mask.to(x)[..., None, None]


class RMSNorm(nn.Module):
    """Root-mean-square normalization (Zhang and Sennrich, 2019): ``x / sqrt(mean(x^2)
    + eps) * weight``, LayerNorm without the mean subtraction and the bias.

    Equal to ``torch.nn.RMSNorm(dim, eps)``; ``eps=None`` takes the machine epsilon of
    the input's dtype, as torch does. Shapes ``(..., dim)`` -> the same."""

    def __init__(self, dim: int, eps: float | None = None):
        super().__init__()
        check_sizes("RMSNorm", dim=dim)
        if eps is not None and (
            not isinstance(eps, numbers.Real)
            or isinstance(eps, bool)
            or not 0.0 < eps < math.inf
        ):
            raise ValueError(
                f"RMSNorm: eps must be None or a finite number > 0, got {eps!r}"
            )
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_width("RMSNorm.forward", x, self.weight.shape[0])
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.weight


class HeadShell:
    """The shell of a multi-head attention layer, shared by every layer that differs
    only in how it attends: mixed into an ``nn.Module`` with ``q_proj``, ``k_proj``,
    ``v_proj``, ``out_proj`` (``nn.Linear``), ``n_heads`` and ``n_kv_heads``.

    ``project(x, context=None)``: ``x (B, T, d_model)``, ``context (B, S, d_model)``
    (default ``x``) -> ``q (B, n_heads, T, head_dim)``, ``k`` and ``v`` ``(B,
    n_kv_heads, S, head_dim)``. ``merge(out, head_mask=None)``: ``out (B, n_heads, T,
    head_dim)`` -> ``(B, T, d_model)``, each head scaled by ``head_mask``, the heads
    concatenated and projected out. What comes between the two is the layer's own."""

    def project(
        self, x: torch.Tensor, context: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        context = x if context is None else context
        q = split_heads(self.q_proj(x), self.n_heads)
        k = split_heads(self.k_proj(context), self.n_kv_heads)
        v = split_heads(self.v_proj(context), self.n_kv_heads)
        return q, k, v

    def merge(
        self, out: torch.Tensor, head_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.out_proj(merge_heads(scale_heads(out, head_mask)))
