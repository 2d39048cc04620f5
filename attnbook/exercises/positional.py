"""Checks for the exercises of the chapter on positional encodings."""

from __future__ import annotations

import torch

from . import register
from .common import assert_close, generator


@register(
    "positional-sinusoidal",
    hint="omega_f = base ** (-2f / dim) for f = 0 .. dim/2 - 1; even columns 0, 2, 4, "
    "... hold sin(i * omega_f), "
    "odd columns hold cos(i * omega_f). Build a (n, 1) column of positions times a "
    "(1, dim/2) row of frequencies.",
)
def _check_sinusoidal(student) -> None:
    """``student(n_positions, dim, base=10000.0)`` must equal
    :func:`attnbook.positional.sinusoidal_encoding`."""
    from ..positional import sinusoidal_encoding

    for n, dim, base in [
        (1, 2, 10000.0),
        (7, 4, 10000.0),
        (50, 16, 10000.0),
        (33, 10, 100.0),
    ]:
        got = student(n, dim, base=base)
        assert isinstance(got, torch.Tensor), (
            f"return a torch.Tensor, got {type(got).__name__}."
        )
        assert_close(
            got,
            sinusoidal_encoding(n, dim, base),
            f"n_positions={n}, dim={dim}, base={base}",
            atol=1e-4,
        )


@register(
    "positional-alibi-slopes",
    hint="for a power of two n: 2 ** (-8 * h / n) for h = 1..n. Otherwise take p = "
    "the largest power of two below n, "
    "the p slopes of p heads, then slopes [0::2] of the 2p-head list until you have n.",
)
def _check_alibi_slopes(student) -> None:
    """``student(n_heads)`` must return ALiBi's slopes (a list or tensor) for powers of
    two and other counts."""
    from ..positional import alibi_slopes

    for n in (1, 2, 4, 8, 16, 3, 6, 12, 20, 24):
        got = torch.as_tensor(student(n), dtype=torch.float64)
        assert_close(
            got, alibi_slopes(n).double(), f"n_heads={n}", atol=1e-7, rtol=1e-6
        )


@register(
    "positional-t5-bucket",
    hint="bidirectional: halve num_buckets and add it when the key is after the query "
    "(offset > 0); distance = |offset|. "
    "Causal: distance = max(-offset, 0). Distances below half the (per-direction) "
    "buckets are their own bucket; "
    "larger ones get max_exact + int(log(n / max_exact) / log(max_distance / "
    "max_exact) * (buckets - max_exact)), "
    "clamped to buckets - 1.",
)
def _check_t5_bucket(student) -> None:
    """``student(offset, bidirectional=True, num_buckets=32, max_distance=128)`` on a
    Python int offset."""
    from ..positional import t5_relative_position_bucket

    offsets = list(range(-40, 41)) + [
        -1000,
        -200,
        -129,
        -128,
        -127,
        -64,
        64,
        127,
        128,
        500,
    ]
    for bidirectional, num_buckets, max_distance in [
        (True, 32, 128),
        (False, 32, 128),
        (True, 8, 32),
    ]:
        for offset in offsets:
            expected = t5_relative_position_bucket(
                torch.tensor(offset), bidirectional, num_buckets, max_distance
            ).item()
            got = student(
                offset,
                bidirectional=bidirectional,
                num_buckets=num_buckets,
                max_distance=max_distance,
            )
            assert int(got) == expected, (
                f"offset {offset} (bidirectional={bidirectional}, "
                f"num_buckets={num_buckets}, "
                f"max_distance={max_distance}): expected bucket {expected}, got {got}."
            )


@register(
    "positional-rope",
    hint="angles = positions[:, None] * inv_freq[None, :] with inv_freq = base ** "
    "(-2f / dim); for each pair "
    "(x[..., 2f], x[..., 2f+1]) return (x1 cos - x2 sin, x1 sin + x2 cos), "
    "interleaved back in the same order.",
)
def _check_rope(student) -> None:
    """``student(x, positions, base=10000.0)`` must equal ``RotaryEmbedding(dim, base,
    interleaved=True)``."""
    from ..positional import RotaryEmbedding

    gen = generator(303)
    for shape, base, start in [
        ((5, 2), 10000.0, 0),
        ((2, 3, 7, 8), 10000.0, 0),
        ((4, 16), 500.0, 100),
    ]:
        x = torch.randn(*shape, generator=gen)
        positions = torch.arange(start, start + shape[-2])
        expected = RotaryEmbedding(shape[-1], base, interleaved=True)(
            x, positions=positions
        )
        got = student(x, positions, base=base)
        assert_close(
            got,
            expected,
            f"x of shape {shape}, positions {start}..{start + shape[-2] - 1}, "
            f"base={base}",
            atol=1e-4,
        )
