"""Checks for the exercises of the chapter on vision attention."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...vision import PatchEmbedding, SpatialAttention, attention_rollout
from . import register
from .common import assert_close, generator, real_number
from .library import allowed, forbid


@register(
    "vision-patchify",
    library=forbid(
        "attnbook.vision.PatchEmbedding",
        "attnbook.vision.VisionTransformer",
        why="The exercise asks you to cut patches with reshape and permute, the step "
            "PatchEmbedding does with a convolution.",
    ),
    hint="cut (B, C, H, W) into (H/p) x (W/p) patches with reshape(B, C, H/p, p, W/p, "
    "p), move the two patch-grid "
    "axes to the front of each image (permute to B, H/p, W/p, C, p, p) and flatten: "
    "rows of patches first, "
    "each patch channel-major.",
)
def _check_patchify(student) -> None:
    """``student(images, patch_size)`` must equal unfold's row-major, channel-major
    patches ``(B, N, C*p*p)``."""

    gen = generator(109)
    for B, C, size, p in [(1, 1, 4, 2), (2, 3, 8, 4), (3, 2, 6, 3), (1, 1, 5, 5)]:
        x = torch.randn(B, C, size, size, generator=gen)
        expected = F.unfold(x, kernel_size=p, stride=p).transpose(1, 2)
        actual = student(x, p)
        assert isinstance(actual, torch.Tensor), (
            f"return a torch.Tensor, got {type(actual).__name__}."
        )
        what = f"patches of a {tuple(x.shape)} batch with patch_size={p}"
        if actual.shape == expected.shape and not torch.allclose(actual, expected):
            grid = x.reshape(B, C, size // p, p, size // p, p)
            for order, mistake in [
                ((0, 4, 2, 1, 3, 5), "your patches run down the columns first"),
                ((0, 2, 4, 3, 5, 1), "each of your patches is flattened pixel-major"),
            ]:
                variant = grid.permute(*order).reshape(expected.shape)
                assert not torch.allclose(actual, variant), (
                    f"{what}: {mistake} ({order}); the book's order is row-major "
                    "patches, each flattened channel-major (C, p, p)."
                )
        assert_close(actual, expected, what)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(p)
            embed = PatchEmbedding(size, p, C, 5)
        with torch.no_grad():
            assert_close(
                actual @ embed.proj.weight.reshape(5, -1).T + embed.proj.bias,
                embed(x),
                f"a linear layer on your patches vs PatchEmbedding (patch_size={p})",
            )


@register(
    "vision-rollout",
    library=forbid(
        "attnbook.vision.attention_rollout",
        why="The exercise asks you to write attention rollout, which "
            "attention_rollout, the check's reference, computes.",
    ),
    hint="for each layer: average over heads (dim 1), add the identity, halve, divide "
    "each row by its sum; then "
    "multiply the layers together with the LATER layer on the left: rollout = A_l @ "
    "rollout.",
)
def _check_rollout(student) -> None:
    """``student(attentions)`` must equal :func:`attnbook.vision.attention_rollout`
    (with the residual)."""

    gen = generator(209)
    cases = [(1, 1, 2, 1), (2, 4, 5, 3), (1, 2, 7, 6)]
    for B, H, T, L in cases:
        layers = [
            torch.softmax(2 * torch.randn(B, H, T, T, generator=gen), dim=-1)
            for _ in range(L)
        ]
        if L > 1:  # an asymmetric case: the order of the product matters
            layers[0][..., 0] += 1.0
            layers[0] /= layers[0].sum(-1, keepdim=True)
        assert_close(
            student(layers),
            attention_rollout(layers),
            f"rollout of {L} layers of shape {(B, H, T, T)}",
        )


@register(
    "vision-spatial-gate",
    library=forbid(
        "attnbook.vision.SpatialAttention",
        "attnbook.vision.CBAM",
        why="The exercise asks you to write CBAM's spatial gate, which "
            "SpatialAttention.gate, the check's reference, computes.",
    ),
    hint="stack the channel mean and the channel maximum (in that order, "
    "keepdim=True) into (B, 2, H, W), "
    "apply F.conv2d(pooled, weight, padding=k // 2) and a sigmoid.",
)
def _check_spatial_gate(student) -> None:
    """``student(x, weight)`` must equal :meth:`attnbook.vision.SpatialAttention.gate`
    with that conv weight."""

    gen = generator(309)
    cases = [
        ("one channel (mean = max), k = 1", (1, 1, 4, 4), 1),
        ("8 channels, a 7 x 5 map, k = 3", (2, 8, 7, 5), 3),
        ("a 7 x 7 kernel on a 4 x 6 map (larger than the image)", (3, 16, 4, 6), 7),
    ]
    for what, shape, k in cases:
        x = torch.randn(*shape, generator=gen)
        gate = SpatialAttention(k)
        with torch.no_grad():
            gate.conv.weight.copy_(torch.randn(1, 2, k, k, generator=gen))
            expected = gate.gate(x)
        actual = student(x.clone(), gate.conv.weight.detach().clone())
        assert isinstance(actual, torch.Tensor), (
            f"return a torch.Tensor, got {type(actual).__name__}."
        )
        assert_close(actual, expected, what)


@register(
    "vision-conv-heads",
    library=allowed(
        "A peak solved from the error bound; no attnbook function returns it.",
    ),
    hint="the bound 2 (n - 1) / (e^pi + n - 1) * max_abs_x * w_norm decreases in pi; "
    "set it equal to tol and solve "
    "for e^pi (keep the n - 1 in the denominator), and return 0.0 when pi = 0 already "
    "meets the tolerance.",
)
def _check_conv_heads(student) -> None:
    """``student(n, tol, max_abs_x=1.0, w_norm=1.0)`` must return the smallest peak ``pi
    >= 0`` with ``2 (n-1) / (e^pi + n-1) * max_abs_x * w_norm <= tol``, found by
    bisection."""

    def bound(pi, n, x, w):
        return (
            0.0
            if n == 1
            else 2 * (n - 1) / (math.exp(min(pi, 700.0)) + (n - 1)) * x * w
        )

    def bisect(n, tol, x, w):
        if bound(0.0, n, x, w) <= tol:
            return 0.0
        lo, hi = 0.0, 1.0
        while bound(hi, n, x, w) > tol:
            lo, hi = hi, 2 * hi
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if bound(mid, n, x, w) <= tol else (mid, hi)
        return hi

    cases = [
        (1024, 1e-6, 1.0, 1.0),  # the exercise's numbers
        (2, 0.5, 1.0, 1.0),  # few pixels: the n - 1 in the denominator matters
        (16, 1.0, 1.0, 1.0),
        (4096, 1e-3, 10.0, 9.0),
        (10**6, 1e-12, 1.0, 1.0),
        (1, 1e-9, 1.0, 1.0),  # one pixel: no other pixel to leak weight to
        (64, 2.0, 1.0, 1.0),  # a tolerance so loose that pi = 0 is enough
    ]
    for n, tol, x, w in cases:
        expected = bisect(n, tol, x, w)
        what = f"n={n}, tol={tol}, max_abs_x={x}, w_norm={w}"
        try:
            answer = student(n, tol, max_abs_x=x, w_norm=w)
        except (ValueError, ZeroDivisionError, OverflowError) as err:
            at_zero = bound(0.0, n, x, w)
            enough = "; pi = 0 already meets it" if at_zero <= tol else ""
            raise AssertionError(
                f"for {what} your code raised {type(err).__name__}: {err} (the "
                f"bound at pi = 0 is {at_zero:.4g}{enough})."
            ) from None
        got = real_number(answer, what)
        assert abs(got - expected) <= 1e-6 * max(1.0, expected), (
            f"for {what} you return pi = {got!r}, where the bound is "
            f"{bound(got, n, x, w):.4g}; the smallest "
            f"pi >= 0 with the bound <= tol is {expected:.8g}."
        )
