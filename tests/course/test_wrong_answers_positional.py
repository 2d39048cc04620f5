"""Plausible wrong answers to the exercises of the chapter on positional encodings: each fails its
check with a message that points at the mistake."""

import math

import torch
from wrong_answers import Mistake, mistake_test


# positional-sinusoidal: the book's solution with one thing changed
def _sinusoidal(n_positions, dim, base=10000.0, *, swap=False, halves=False, first=0, two_f=True):
    position = torch.arange(first, first + n_positions, dtype=torch.float64)[:, None]
    f = torch.arange(0, dim, 2, dtype=torch.float64) if two_f else torch.arange(dim // 2, dtype=torch.float64)
    angle = position * base ** (-f / dim)
    sin, cos = (torch.cos(angle), torch.sin(angle)) if swap else (torch.sin(angle), torch.cos(angle))
    if halves:  # all the sines, then all the cosines
        return torch.cat((sin, cos), dim=-1).float()
    pe = torch.zeros(n_positions, dim, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = sin, cos
    return pe.float()


def _sinusoidal_sin_and_cos_swapped(n_positions, dim, base=10000.0):
    return _sinusoidal(n_positions, dim, base, swap=True)


def _sinusoidal_sines_then_cosines(n_positions, dim, base=10000.0):
    return _sinusoidal(n_positions, dim, base, halves=True)


def _sinusoidal_positions_from_one(n_positions, dim, base=10000.0):
    return _sinusoidal(n_positions, dim, base, first=1)


def _sinusoidal_exponent_f_over_dim(n_positions, dim, base=10000.0):
    return _sinusoidal(n_positions, dim, base, two_f=False)  # base ** (-f / dim), not (-2f / dim)


# positional-alibi-slopes: the book's solution with one thing changed
def _power_of_two(n, first=1):
    return [2.0 ** (-8.0 * h / n) for h in range(first, first + n)]


def _alibi_geometric_for_every_count(n_heads):
    return _power_of_two(n_heads)  # right only for powers of two


def _alibi_heads_from_zero(n_heads):
    p = 2 ** math.floor(math.log2(n_heads))
    return _power_of_two(p, first=0) + _power_of_two(2 * p, first=0)[0::2][: n_heads - p]


def _alibi_odd_slopes_of_the_2p_list(n_heads):
    p = 2 ** math.floor(math.log2(n_heads))
    return _power_of_two(p) + _power_of_two(2 * p)[1::2][: n_heads - p]


def _alibi_first_slopes_of_the_next_power(n_heads):
    p = 2 ** math.ceil(math.log2(n_heads))
    return _power_of_two(p)[:n_heads]


# positional-t5-bucket: the book's solution with one thing changed
def _t5(offset, bidirectional=True, num_buckets=32, max_distance=128, *, after=lambda o: o > 0,
        causal_distance=lambda o: max(-o, 0), clamp=True, halve=True, to_int=int):
    bucket = 0
    if bidirectional:
        if halve:
            num_buckets //= 2
        if after(offset):
            bucket += num_buckets
        n = abs(offset)
    else:
        n = causal_distance(offset)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    log_ratio = math.log(n / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + to_int(log_ratio * (num_buckets - max_exact))
    return bucket + (min(large, num_buckets - 1) if clamp else large)


def _t5_upper_half_for_keys_before(offset, bidirectional=True, num_buckets=32, max_distance=128):
    return _t5(offset, bidirectional, num_buckets, max_distance, after=lambda o: o < 0)


def _t5_causal_distance_of_future_keys(offset, bidirectional=True, num_buckets=32, max_distance=128):
    return _t5(offset, bidirectional, num_buckets, max_distance, causal_distance=lambda o: max(o, 0))


def _t5_not_clamped(offset, bidirectional=True, num_buckets=32, max_distance=128):
    return _t5(offset, bidirectional, num_buckets, max_distance, clamp=False)


def _t5_rounded(offset, bidirectional=True, num_buckets=32, max_distance=128):
    return _t5(offset, bidirectional, num_buckets, max_distance, to_int=round)


def _t5_buckets_not_halved(offset, bidirectional=True, num_buckets=32, max_distance=128):
    return _t5(offset, bidirectional, num_buckets, max_distance, halve=False)


# positional-rope: the book's solution with one thing changed
def _rope(x, positions, base=10000.0, *, sign=1.0, halves=False, own_positions=False, cat_output=False):
    dim = x.shape[-1]
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    if own_positions:
        positions = torch.arange(x.shape[-2])
    angles = sign * positions.float()[:, None] * inv_freq
    cos, sin = torch.cos(angles), torch.sin(angles)
    x1, x2 = (x[..., : dim // 2], x[..., dim // 2 :]) if halves else (x[..., 0::2], x[..., 1::2])
    y1, y2 = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    if halves or cat_output:
        return torch.cat((y1, y2), dim=-1)
    return torch.stack((y1, y2), dim=-1).flatten(-2)


def _rope_rotated_the_other_way(x, positions, base=10000.0):
    return _rope(x, positions, base, sign=-1.0)


def _rope_halves_paired(x, positions, base=10000.0):
    return _rope(x, positions, base, halves=True)


def _rope_positions_from_zero(x, positions, base=10000.0):
    return _rope(x, positions, base, own_positions=True)


def _rope_output_not_interleaved(x, positions, base=10000.0):
    return _rope(x, positions, base, cat_output=True)


MISTAKES = [
    Mistake("positional-sinusoidal", "sin and cos swapped", _sinusoidal_sin_and_cos_swapped,
            ("n_positions=1, dim=2, base=10000.0", "PE[0, 0] should be 0 = sin(0 * omega_0)", "got 1.",
             "sin and cos are swapped", "even columns hold sin")),
    Mistake("positional-sinusoidal", "all sines, then all cosines", _sinusoidal_sines_then_cosines,
            ("n_positions=7, dim=4, base=10000.0", "PE[0, 1] should be 1 = cos(0 * omega_0)", "got 0.",
             "all the sines first, then all the cosines", "interleave them")),
    Mistake("positional-sinusoidal", "positions start at 1", _sinusoidal_positions_from_one,
            ("n_positions=1, dim=2, base=10000.0", "PE[0, 0] should be 0 = sin(0 * omega_0)", "got 0.8415",
             "positions start at 1", "i = 0 .. n_positions - 1")),
    Mistake("positional-sinusoidal", "exponent -f / dim instead of -2f / dim",
            _sinusoidal_exponent_f_over_dim,
            ("n_positions=7, dim=4, base=10000.0", "PE[1, 2] should be 0.01 = sin(1 * omega_1)",
             "omega_1 = base^(-2/4) = 0.01", "got 0.09983", "base^(-f/dim)", "the exponent is -2f / dim")),
    Mistake("positional-alibi-slopes", "2^(-8h/n) for every head count", _alibi_geometric_for_every_count,
            ("n_heads=3: the slope of head 1 should be 2^-4", "got 2^-2.667", "not a power of two",
             "then slopes [0::2] of the 4-head list", "holds for powers of two only")),
    Mistake("positional-alibi-slopes", "heads counted from 0", _alibi_heads_from_zero,
            ("n_heads=1: the slope of head 1 should be 2^-8", "got 2^0", "count the heads from h = 0",
             "they count from h = 1")),
    Mistake("positional-alibi-slopes", "slopes [1::2] of the 2p-head list", _alibi_odd_slopes_of_the_2p_list,
            ("n_heads=3: the slope of head 3 should be 2^-2", "got 2^-4", "take slopes [1::2]",
             "take the 1st, 3rd, 5th, ... ([0::2])")),
    Mistake("positional-alibi-slopes", "the first n slopes of the next power of two",
            _alibi_first_slopes_of_the_next_power,
            ("n_heads=3: the slope of head 1 should be 2^-4", "got 2^-2 ",
             "the first n slopes of the next power of two",
             "start from the largest power of two below n")),
    Mistake("positional-t5-bucket", "keys before the query in the upper half", _t5_upper_half_for_keys_before,
            ("offset -40 (bidirectional=True, num_buckets=32, max_distance=128): expected bucket 12, got 28",
             "Your bucket is in the upper half", "keys after the query (offset > 0) use the upper half")),
    Mistake("positional-t5-bucket", "causal: future keys given a distance",
            _t5_causal_distance_of_future_keys,
            ("offset -40 (bidirectional=False, num_buckets=32, max_distance=128): expected bucket 23, got 0",
             "keys before the query (offset < 0) at distance max(-offset, 0) = -offset")),
    Mistake("positional-t5-bucket", "far end not clamped", _t5_not_clamped,
            ("offset -1000 (bidirectional=True, num_buckets=32, max_distance=128)",
             "expected bucket 15, got 21",
             "at least max_distance = 128", "past the last one of its direction",
             "clamp to num_buckets - 1")),
    Mistake("positional-t5-bucket", "log bucket rounded, not truncated", _t5_rounded,
            ("offset -40 (bidirectional=True, num_buckets=32, max_distance=128): expected bucket 12, got 13",
             "in the logarithmic range", "one too high", "with int(), not round()")),
    Mistake("positional-t5-bucket", "bidirectional buckets not halved", _t5_buckets_not_halved,
            ("offset -40 (bidirectional=True, num_buckets=32, max_distance=128): expected bucket 12, got 23",
             "the bucket for 32 buckets per direction", "halve num_buckets first")),
    Mistake("positional-rope", "rotated the other way", _rope_rotated_the_other_way,
            ("x of shape (5, 2), positions 0..4, base=10000.0", "you rotate by -angle",
             "(x1 cos - x2 sin, x1 sin + x2 cos)")),
    Mistake("positional-rope", "pairs (f, f + dim/2), GPT-NeoX style", _rope_halves_paired,
            ("x of shape (2, 3, 7, 8), positions 0..6", "you rotate the pairs (f, f + dim/2)",
             "the interleaved pairs (2f, 2f+1)")),
    Mistake("positional-rope", "positions 0..n-1 instead of the given ones", _rope_positions_from_zero,
            ("x of shape (4, 16), positions 100..103, base=500.0", "you rotate by positions 0..3",
             "use the given positions")),
    Mistake("positional-rope", "rotated pairs concatenated, not interleaved", _rope_output_not_interleaved,
            ("x of shape (2, 3, 7, 8), positions 0..6", "all first components, then all second ones",
             "pair f goes to columns 2f and 2f+1")),
]

test_wrong_answers = mistake_test(MISTAKES)
