"""Plausible wrong answers to the exercises of the chapter on the quadratic cost: each fails its check
with a message that points at the mistake."""

import math

from wrong_answers import Mistake, mistake_test


# complexity-attention-flops: the book's solution with one thing changed
def _flops(seq_len, d_model, n_heads=1, batch=1, *, per_mac=2, projections=4, head_width=None,
           use_batch=True):
    n, d, B = seq_len, d_model, batch if use_batch else 1
    head_dim = d // n_heads if head_width is None else head_width(d, n_heads)
    return (projections * per_mac * B * n * d * d + n_heads * per_mac * B * n * n * head_dim
            + n_heads * per_mac * B * n * head_dim * n)


def _flops_one_per_multiply_add(seq_len, d_model, n_heads=1, batch=1):
    return _flops(seq_len, d_model, n_heads, batch, per_mac=1)


def _flops_without_the_output_projection(seq_len, d_model, n_heads=1, batch=1):
    return _flops(seq_len, d_model, n_heads, batch, projections=3)


def _flops_every_head_full_width(seq_len, d_model, n_heads=1, batch=1):
    return _flops(seq_len, d_model, n_heads, batch, head_width=lambda d, h: d)


def _flops_batch_ignored(seq_len, d_model, n_heads=1, batch=1):
    return _flops(seq_len, d_model, n_heads, batch, use_batch=False)


# complexity-max-seq-len: the book's solution with one thing changed
def _per_sequence_position(n_heads, batch, bytes_per_elem, n_layers):
    return n_heads * batch * bytes_per_elem * n_layers


def _max_seq_len_float_sqrt(budget_bytes, n_heads=1, batch=1, bytes_per_elem=4, n_layers=1):
    return int(math.sqrt(budget_bytes / _per_sequence_position(n_heads, batch, bytes_per_elem, n_layers)))


def _max_seq_len_rounded(budget_bytes, n_heads=1, batch=1, bytes_per_elem=4, n_layers=1):
    return round(math.sqrt(budget_bytes / _per_sequence_position(n_heads, batch, bytes_per_elem, n_layers)))


def _max_seq_len_layers_ignored(budget_bytes, n_heads=1, batch=1, bytes_per_elem=4, n_layers=1):
    return math.isqrt(budget_bytes // _per_sequence_position(n_heads, batch, bytes_per_elem, 1))


def _max_seq_len_root_before_dividing(budget_bytes, n_heads=1, batch=1, bytes_per_elem=4, n_layers=1):
    return math.isqrt(budget_bytes) // _per_sequence_position(n_heads, batch, bytes_per_elem, n_layers)


# complexity-projection-crossover: tests/course/test_exercises.py already rejects n = d, a float and 2d + 1
def _crossover_three_projections(d_model):
    return 3 * d_model // 2  # 4 n^2 d = 6 n d^2: the output projection left out


def _crossover_scores_only(d_model):
    return 4 * d_model  # 2 n^2 d = 8 n d^2: the weighted sum left out


def _crossover_sides_swapped(d_model):
    return d_model // 2  # 8 n^2 d = 4 n d^2


# complexity-kv-decoding-cost: tests/course/test_exercises.py already rejects leading-order totals, a cache step
# that starts from t = 0, a float, a cache of keys only, a cache that ignores GQA and a single function
def _decoding_flops(n_tokens, d_model, kv_cache=False, *, steps_from_zero=False, projections=4, attention=4):
    T, d = n_tokens, d_model
    if kv_cache:  # step t: projections of the new token, `attention` t d for its attention
        return 2 * projections * T * d * d + attention * T * (T + 1) // 2 * d
    if steps_from_zero:  # sums over t = 0 .. T - 1
        T -= 1
    return 4 * T * (T + 1) * d * d + 2 * T * (T + 1) * (2 * T + 1) * d // 3


def _kv_cache_size(n_layers, d_model, n_heads, n_kv_heads, seq_len, bytes_per_elem=2, batch=1, *,
                   width=None, use_batch=True):
    head_dim = d_model // n_heads if width is None else width
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * (batch if use_batch else 1) * bytes_per_elem


def _decoding_float_division(T, d, kv_cache=False):
    if kv_cache:
        return 8 * T * d * d + int(4 * T * (T + 1) * d / 2)
    return 4 * T * (T + 1) * d * d + int(2 * T * (T + 1) * (2 * T + 1) * d / 3)  # rounds past 2**53


def _decoding_steps_from_zero(T, d, kv_cache=False):
    return _decoding_flops(T, d, kv_cache, steps_from_zero=True)


def _decoding_cache_three_projections(T, d, kv_cache=False):
    return _decoding_flops(T, d, kv_cache, projections=3)


def _decoding_cache_scores_only(T, d, kv_cache=False):
    return _decoding_flops(T, d, kv_cache, attention=2)


def _cache_heads_d_model_wide(n_layers, d_model, n_heads, n_kv_heads, seq_len, bytes_per_elem=2, batch=1):
    return _kv_cache_size(n_layers, d_model, n_heads, n_kv_heads, seq_len, bytes_per_elem, batch,
                          width=d_model)


def _cache_batch_ignored(n_layers, d_model, n_heads, n_kv_heads, seq_len, bytes_per_elem=2, batch=1):
    return _kv_cache_size(n_layers, d_model, n_heads, n_kv_heads, seq_len, bytes_per_elem, batch,
                          use_batch=False)


MISTAKES = [
    Mistake("complexity-attention-flops", "1 FLOP per multiply-add", _flops_one_per_multiply_add,
            ("for n=4, d_model=8, n_heads=2, batch=1 you return 1280", "the matrix products cost 2560 FLOPs",
             "exactly half", "2 FLOPs per multiply-add")),
    Mistake("complexity-attention-flops", "output projection left out", _flops_without_the_output_projection,
            ("for n=4, d_model=8, n_heads=2, batch=1 you return 2048", "output projection 512",
             "512 short, one projection", "count four, Q, K, V and the output projection")),
    Mistake("complexity-attention-flops", "every head d_model wide", _flops_every_head_full_width,
            ("for n=4, d_model=8, n_heads=2, batch=1 you return", "scores 256", "d_model / n_heads wide",
             "head count cancels out")),
    Mistake("complexity-attention-flops", "batch ignored", _flops_batch_ignored,
            ("for n=7, d_model=12, n_heads=3, batch=5 you return", "the count for batch=1",
             "every product runs batch times")),
    Mistake("complexity-max-seq-len", "a float square root", _max_seq_len_float_sqrt,
            ("you return n=134217729", "> the budget", "floating point", "math.isqrt")),
    Mistake("complexity-max-seq-len", "rounded to the nearest length", _max_seq_len_rounded,
            ("{'budget_bytes': 17179869183} you return n=65536", "> the budget", "round down")),
    Mistake("complexity-max-seq-len", "n_layers ignored", _max_seq_len_layers_ignored,
            ("'n_layers': 12", "> the budget", "ignores n_heads=12 or n_layers=12")),
    Mistake("complexity-max-seq-len", "square root taken before dividing", _max_seq_len_root_before_dividing,
            ("{'budget_bytes': 17179869184} you return n=32768", "n=32769 still fits",
             "square root before dividing", "divide first")),
    Mistake("complexity-projection-crossover", "three projections: n = 1.5 d", _crossover_three_projections,
            ("for d_model=1 you return n=1", "the four projections at n = 2", "n = 3 d / 2 for every d_model",
             "the output projection is the fourth")),
    Mistake("complexity-projection-crossover", "the scores only: n = 4 d", _crossover_scores_only,
            ("for d_model=1 you return n=4", "at n = 2", "n = 4 d for every d_model", "the scores alone",
             "the weighted sum costs 2 n^2 d too")),
    Mistake("complexity-projection-crossover", "sides swapped: n = d / 2", _crossover_sides_swapped,
            ("for d_model=1 you return n=0", "at n = 2", "n = d / 2 for every d_model",
             "the two sides swapped")),
    Mistake("complexity-kv-decoding-cost", "int(x / 3): a float division rounds large totals",
            (_decoding_float_division, _kv_cache_size),
            ("decoding_flops(1000000, 4096, kv_cache=False) should be", "off by 524288",
             "keeps only 53 bits", "divide the integer with //")),
    Mistake("complexity-kv-decoding-cost", "no cache: steps t = 0 .. T - 1",
            (_decoding_steps_from_zero, _kv_cache_size),
            ("decoding_flops(1, 1, kv_cache=False) should be 12", "steps t = 1..1), got 0.",
             "a sum over t = 0..T-1")),
    Mistake("complexity-kv-decoding-cost", "cache: three projections per new token",
            (_decoding_cache_three_projections, _kv_cache_size),
            ("decoding_flops(1, 1, kv_cache=True) should be 12", "got 10.",
             "8 are the four projections of the new token",
             "three projections per new token", "the output projection is the fourth")),
    Mistake("complexity-kv-decoding-cost", "cache: the scores without the weighted sum",
            (_decoding_cache_scores_only, _kv_cache_size),
            ("decoding_flops(1, 1, kv_cache=True) should be 12", "got 10.", "4 the scores and weighted sums",
             "only the scores", "the weighted sum of t values costs 2 t d too")),
    Mistake("complexity-kv-decoding-cost", "cache heads d_model wide",
            (_decoding_flops, _cache_heads_d_model_wide),
            ("kv_cache_size(32, 4096, 32, 32, 4096, bytes_per_elem=2, batch=1) should be 2147483648",
             "got 68719476736", "every head d_model=4096 wide, not d_model // n_heads wide")),
    Mistake("complexity-kv-decoding-cost", "cache: batch ignored", (_decoding_flops, _cache_batch_ignored),
            ("kv_cache_size(12, 768, 12, 12, 1024, bytes_per_elem=4, batch=8) should be 603979776",
             "got 75497472",
             "one sequence's: multiply by batch")),
]

test_wrong_answers = mistake_test(MISTAKES)
