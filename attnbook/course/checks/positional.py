"""Checks for the exercises of the chapter on positional encodings."""

from __future__ import annotations

import math

import torch

from ...positional import (
    RotaryEmbedding,
    alibi_slopes,
    sinusoidal_encoding,
    t5_relative_position_bucket,
)
from . import register
from .common import assert_close, generator
from .library import forbid


@register(
    "positional-sinusoidal",
    library=forbid(
        "attnbook.positional",
        why="The exercise asks for the sinusoidal table written without calling "
            "attnbook.positional.",
    ),
    hint="omega_f = base ** (-2f / dim) for f = 0 .. dim/2 - 1; even columns 0, 2, 4, "
    "... hold sin(i * omega_f), "
    "odd columns hold cos(i * omega_f). Build a (n, 1) column of positions times a "
    "(1, dim/2) row of frequencies.",
)
def _check_sinusoidal(student) -> None:
    """``student(n_positions, dim, base=10000.0)`` must equal
    :func:`attnbook.positional.sinusoidal_encoding`."""

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
        what = f"n_positions={n}, dim={dim}, base={base}"
        expected = sinusoidal_encoding(n, dim, base)
        if got.shape == expected.shape and not _close(got, expected, 1e-4):
            wrong = ~torch.isclose(got.double(), expected.double(), 1e-4, 1e-4)
            i, c = wrong.nonzero()[0].tolist()
            f = c // 2
            raise AssertionError(
                f"{what}: PE[{i}, {c}] should be {expected[i, c].item():.4g} = "
                f"{'cos' if c % 2 else 'sin'}({i} * omega_{f}) with omega_{f} = "
                f"base^(-{2 * f}/{dim}) = {base ** (-2 * f / dim):.4g}, got "
                f"{got[i, c].item():.4g}.{_sinusoidal_slip(got, n, dim, base)}"
            )
        assert_close(got, expected, what, atol=1e-4)


def _close(actual, expected, atol: float, rtol: float = 1e-4) -> bool:
    """``actual`` is a tensor of ``expected``'s shape and values."""
    actual = torch.as_tensor(actual)
    return actual.shape == expected.shape and torch.allclose(
        actual.double(), expected.double(), atol=atol, rtol=rtol
    )


def _sinusoidal_slip(got, n: int, dim: int, base: float) -> str:
    """What a wrong sinusoidal table most likely did, if it is a known slip."""

    def table(first=0, two=2.0, sign=-1.0, swap=False, halves=False):
        i = torch.arange(first, first + n, dtype=torch.float64)[:, None]
        f = torch.arange(dim // 2, dtype=torch.float64)
        angle = i * base ** (sign * two * f / dim)
        sin, cos = torch.sin(angle), torch.cos(angle)
        if swap:
            sin, cos = cos, sin
        if halves:
            return torch.cat((sin, cos), dim=-1)
        return torch.stack((sin, cos), dim=-1).flatten(-2)

    slips = [
        (table(swap=True), "sin and cos are swapped: even columns hold sin, odd cos"),
        (
            table(halves=True),
            "you put all the sines first, then all the cosines: interleave them, "
            "sin in the even columns and cos in the odd ones",
        ),
        (
            table(first=1),
            "your positions start at 1: rows are i = 0 .. n_positions - 1",
        ),
        (
            table(two=1.0),
            "your frequencies are base^(-f/dim): the exponent is -2f / dim, f = 0 .. "
            "dim/2 - 1",
        ),
        (table(sign=1.0), "your frequencies grow: omega_f = base^(-2f/dim) shrinks"),
    ]
    for table_, what in slips:
        if _close(got, table_, 1e-4):
            return f" Your table: {what}."
    return ""


@register(
    "positional-alibi-slopes",
    library=forbid(
        "attnbook.positional.alibi_slopes",
        "attnbook.positional.alibi_bias",
        "attnbook.flex.alibi_score_mod",
        why="The exercise asks you to write ALiBi's slope rule, which alibi_slopes "
            "implements.",
    ),
    hint="for a power of two n: 2 ** (-8 * h / n) for h = 1..n. Otherwise take p = "
    "the largest power of two below n, "
    "the p slopes of p heads, then slopes [0::2] of the 2p-head list until you have n.",
)
def _check_alibi_slopes(student) -> None:
    """``student(n_heads)`` must return ALiBi's slopes (a list or tensor) for powers of
    two and other counts."""

    for n in (1, 2, 4, 8, 16, 3, 6, 12, 20, 24):
        answer = student(n)
        got = torch.as_tensor(answer, dtype=torch.float64)
        expected = alibi_slopes(n).double()
        if got.shape == expected.shape and not _close(got, expected, 1e-7, 1e-6):
            h = int((~torch.isclose(got, expected, 1e-6, 1e-7)).nonzero()[0])
            power = (n & (n - 1)) == 0
            p = 2 ** (n.bit_length() - 1)
            raise AssertionError(
                f"n_heads={n}: the slope of head {h + 1} should be "
                f"{_power(expected[h].item())}, got {_power(got[h].item())}."
                + (
                    ""
                    if power
                    else f" n_heads={n} is not a power of two: the {p} slopes of {p} "
                    f"heads come first, then slopes [0::2] of the {2 * p}-head list."
                )
                + _alibi_slip(answer, n)
            )
        assert_close(got, expected, f"n_heads={n}", atol=1e-7, rtol=1e-6)


def _power(x: float) -> str:
    """``x`` as a power of two: ``2^-4 = 0.0625``."""

    return f"2^{math.log2(x):.4g} = {x:.4g}" if x > 0 else f"{x:.4g}"


def _alibi_slip(answer, n: int) -> str:
    """What wrong ALiBi slopes most likely did, if it is a known slip."""

    def geometric(m, first=1):
        return [2.0 ** (-8.0 * h / m) for h in range(first, first + m)]

    p = 2 ** (n.bit_length() - 1)
    slips = [
        (geometric(n), "follow 2^(-8h/n), which holds for powers of two only"),
        (
            geometric(p, 0) + geometric(2 * p, 0)[0::2][: n - p],
            "count the heads from h = 0: they count from h = 1, the first slope is "
            "2^(-8/n)",
        ),
        (
            geometric(p) + geometric(2 * p)[1::2][: n - p],
            "take slopes [1::2] of the 2p-head list, the 2nd, 4th, ...: take the "
            "1st, 3rd, 5th, ... ([0::2])",
        ),
        (
            geometric(2 ** math.ceil(math.log2(n)))[:n],
            "are the first n slopes of the next power of two: start from the "
            "largest power of two below n",
        ),
    ]
    got = torch.as_tensor(answer, dtype=torch.float64)
    for slopes, what in slips:
        if _close(got, torch.tensor(slopes, dtype=torch.float64), 1e-7, 1e-6):
            return f" Your slopes {what}."
    return ""


@register(
    "positional-t5-bucket",
    library=forbid(
        "attnbook.positional.t5_relative_position_bucket",
        "attnbook.positional.T5RelativeBias",
        "attnbook.flex.t5_score_mod",
        why="The exercise asks you to write T5's bucketing in plain Python, which "
            "t5_relative_position_bucket implements.",
    ),
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
                + _t5_slip(int(got), offset, bidirectional, num_buckets, max_distance)
            )


def _t5_slip(got: int, offset: int, bidirectional, num_buckets, max_distance) -> str:
    """Where a wrong T5 bucket went wrong: the offset's distance and range, and a
    known slip."""

    expected = t5_relative_position_bucket(
        torch.tensor(offset), bidirectional, num_buckets, max_distance
    ).item()
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    max_exact = per_direction // 2
    distance = abs(offset) if bidirectional else max(-offset, 0)
    if distance < max_exact:
        where = f"below max_exact = {max_exact}, so it is its own bucket"
    elif distance < max_distance:
        where = (
            f"in the logarithmic range, max_exact = {max_exact} <= distance < "
            f"max_distance = {max_distance}"
        )
    else:
        where = (
            f"at least max_distance = {max_distance}: it shares the last bucket of "
            "its direction"
        )
    note = f" Its distance is {distance}, {where}."
    upper = bidirectional and offset > 0
    if bidirectional and abs(got - expected) == per_direction:
        note += (
            f" Your bucket is in the {'upper' if got > expected else 'lower'} half: "
            f"keys after the query (offset > 0) use the upper half, buckets "
            f"{per_direction}..{num_buckets - 1}; keys before it the lower half."
        )
    elif not bidirectional and offset < 0 and got == 0:
        note += (
            " A causal model puts keys before the query (offset < 0) at distance "
            "max(-offset, 0) = -offset; only future keys go to bucket 0."
        )
    elif (
        bidirectional
        and offset <= 0
        and got
        == t5_relative_position_bucket(
            torch.tensor(offset), True, 2 * num_buckets, max_distance
        ).item()
    ):
        note += (
            f" That is the bucket for {num_buckets} buckets per direction: with "
            f"bidirectional=True, halve num_buckets first ({per_direction} each way)."
        )
    elif got > expected and got > per_direction * (1 + upper) - 1:
        note += (
            f" Your bucket is past the last one of its direction, "
            f"{per_direction * (1 + upper) - 1}: clamp to num_buckets - 1 (per "
            "direction)."
        )
    elif max_exact <= distance < max_distance and got == expected + 1:
        note += (
            " Your bucket is one too high: truncate the logarithmic bucket with "
            "int(), not round()."
        )
    return note


@register(
    "positional-rope",
    library=forbid(
        "attnbook.positional.RotaryEmbedding",
        "attnbook.positional.rope_complex",
        why="The exercise asks you to write the rotary rotation, which "
            "RotaryEmbedding implements.",
    ),
    hint="angles = positions[:, None] * inv_freq[None, :] with inv_freq = base ** "
    "(-2f / dim); for each pair "
    "(x[..., 2f], x[..., 2f+1]) return (x1 cos - x2 sin, x1 sin + x2 cos), "
    "interleaved back in the same order.",
)
def _check_rope(student) -> None:
    """``student(x, positions, base=10000.0)`` must equal ``RotaryEmbedding(dim, base,
    interleaved=True)``."""

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
        what = (
            f"x of shape {shape}, positions {start}..{start + shape[-2] - 1}, "
            f"base={base}"
        )
        if not _close(got, expected, 1e-4):
            rope = RotaryEmbedding(shape[-1], base, interleaved=True)
            rotated = rope(x, positions=positions)
            slips = [
                (
                    rope(x, positions=-positions),
                    "you rotate by -angle: the rotation of a pair (x1, x2) is "
                    "(x1 cos - x2 sin, x1 sin + x2 cos)",
                ),
                (
                    RotaryEmbedding(shape[-1], base)(x, positions=positions),
                    "you rotate the pairs (f, f + dim/2) (GPT-NeoX, LLaMA): this "
                    "exercise rotates the interleaved pairs (2f, 2f+1)",
                ),
                (
                    rope(x),
                    f"you rotate by positions 0..{shape[-2] - 1}: use the given "
                    "positions",
                ),
                (
                    torch.cat((rotated[..., 0::2], rotated[..., 1::2]), dim=-1),
                    "you return all first components, then all second ones: "
                    "interleaved back, pair f goes to columns 2f and 2f+1",
                ),
            ]
            for wrong, slip in slips:
                if _close(got, wrong, 1e-4):
                    raise AssertionError(f"{what}: {slip}.")
        assert_close(got, expected, what, atol=1e-4)
