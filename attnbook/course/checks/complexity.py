"""Checks for the exercises of the chapter on the quadratic cost."""

from __future__ import annotations

import math

import torch

from ...complexity import attention_flops, attention_memory_bytes
from ...kvcache import KVCache
from . import register
from .common import assert_int
from .library import allowed, forbid


@register(
    "complexity-attention-flops",
    library=forbid(
        "attnbook.complexity.attention_flops",
        "attnbook.transformer.block_flops",
        why="The exercise asks you to count the FLOPs from the shapes, without "
            "attention_flops, which the check compares with.",
    ),
    hint="Count 2 FLOPs per multiply-add in the four matrix products: Q, K, V "
    "projections (3 of n x d times d x d), "
    "scores (h heads of (n, d/h) x (d/h, n)), weighted sum, output projection. The "
    "head count cancels out.",
)
def _check_attention_matmul_flops(student) -> None:
    """``student(n, d_model, n_heads=..., batch=...)`` must equal the matrix-product
    FLOPs of :func:`attnbook.complexity.attention_flops`, exactly, on six sizes."""

    cases = [
        (4, 8, 2, 1),  # first: n != d and h > 1 tell every term apart
        (1, 1, 1, 1),
        (7, 12, 3, 5),
        (128, 64, 1, 2),
        (1000, 512, 8, 1),
        (4096, 4096, 32, 3),
    ]
    for n, d, h, batch in cases:
        got = student(n, d, n_heads=h, batch=batch)
        flops = attention_flops(n, d, n_heads=h, batch=batch)
        expected = flops["matmul"]
        assert got == expected, (
            f"for n={n}, d_model={d}, n_heads={h}, batch={batch} you return {got!r}; "
            f"the matrix products cost {expected} FLOPs: Q, K, V projections "
            f"{flops['qkv_projections']}, scores {flops['scores']}, weighted sum "
            f"{flops['weighted_sum']}, output projection "
            f"{flops['output_projection']}.{_flops_slip(got, n, d, h, batch)}"
        )


def _flops_slip(got, n: int, d: int, h: int, batch: int) -> str:
    """What a wrong FLOP count most likely left out or added, if it is a known slip."""
    flops = attention_flops(n, d, n_heads=h, batch=batch)
    expected = flops["matmul"]
    if got == expected // 2:
        return " That is exactly half: count 2 FLOPs per multiply-add, not 1."
    if batch > 1 and got == attention_flops(n, d, n_heads=h)["matmul"]:
        return " That is the count for batch=1: every product runs batch times."
    if h > 1 and got == expected + (h - 1) * (flops["scores"] + flops["weighted_sum"]):
        return (
            f" That is {h} heads of d_model-wide scores and weighted sums: each head "
            "is d_model / n_heads wide."
        )
    projection = flops["output_projection"]  # each of the four: 2 B n d^2
    if got == expected - projection:
        return (
            f" That is {projection} short, one projection (2 B n d^2): count four, "
            "Q, K, V and the output projection."
        )
    if got == expected - flops["scores"]:
        return (
            f" That is {flops['scores']} short, what the scores or the weighted sum "
            "cost (2 B n^2 d each): count both."
        )
    return ""


@register(
    "complexity-max-seq-len",
    library=allowed(
        "The answer inverts the weights' byte count exactly; attention_memory_bytes, "
        "the count itself, is a fair building block.",
    ),
    hint="The weights take batch * n_heads * n^2 * bytes_per_elem * n_layers bytes: "
    "solve for n and round down "
    "with integer arithmetic (math.isqrt), returning 0 when not even n = 1 fits.",
)
def _check_max_seq_len(student) -> None:
    """``student(budget_bytes, ...)`` must return the longest ``n`` whose attention
    weights fit the budget (:func:`attnbook.complexity.attention_memory_bytes`), exactly
    at the boundary."""

    cases = [
        dict(budget_bytes=2**34),  # 16 GiB, one fp32 matrix: exactly 65,536
        dict(budget_bytes=2**34 - 1),  # one byte less: 65,535
        dict(budget_bytes=16 * 10**9),  # 16 GB (decimal)
        dict(budget_bytes=80 * 10**9, n_heads=32, batch=8, bytes_per_elem=2),
        dict(
            budget_bytes=24 * 2**30, n_heads=12, batch=4, bytes_per_elem=2, n_layers=12
        ),
        dict(budget_bytes=3),  # less than one fp32 element: nothing fits
        dict(budget_bytes=4),  # exactly one element
        # (2^27 + 1)^2 - 1 elements: a float square root rounds up to 2^27 + 1
        dict(budget_bytes=4 * (2**54 + 2**28)),
    ]
    for case in cases:
        kwargs = {k: v for k, v in case.items() if k != "budget_bytes"}
        budget = case["budget_bytes"]
        n = student(**case)
        assert isinstance(n, int), (
            f"for {case} return an int, got {type(n).__name__} {n!r}."
        )
        assert n >= 0, f"for {case} you return a negative length {n}."
        if n > 0:
            need = attention_memory_bytes(n, **kwargs)
            assert need <= budget, (
                f"for {case} you return n={n}, but its weights need {need} bytes > "
                f"the budget.{_length_slip(n, **case)}"
            )
        longer = attention_memory_bytes(n + 1, **kwargs)
        assert longer > budget, (
            f"for {case} you return n={n}, but n={n + 1} still fits ({longer} bytes "
            f"<= {budget}): return the largest n.{_length_slip(n, **case)}"
        )


def _length_slip(n: int, budget_bytes: int, **kwargs) -> str:
    """What a wrong longest length ``n`` most likely did, if it is a known slip."""

    defaults = dict(n_heads=1, batch=1, bytes_per_elem=4, n_layers=1)
    per_element = math.prod({**defaults, **kwargs}.values())  # bytes per n^2
    if n == int(math.sqrt(budget_bytes / per_element)):
        return (
            " A square root in floating point rounds up here: use math.isqrt on "
            "integers."
        )
    if n == round(math.sqrt(budget_bytes / per_element)):
        return " You rounded to the nearest length: round down."
    if n == math.isqrt(budget_bytes) // per_element:
        return (
            " You took the square root before dividing: n^2 <= budget / (batch * "
            "n_heads * bytes_per_elem * n_layers), so divide first, then take the root."
        )
    ignored = [
        f"{name}={value}"
        for name, value in kwargs.items()
        if value != defaults[name]
        and n == math.isqrt(budget_bytes // (per_element // value * defaults[name]))
    ]
    return f" Your n ignores {' or '.join(ignored)}." if ignored else ""


@register(
    "complexity-projection-crossover",
    library=allowed(
        "A length derived from the FLOP table's terms; attention_flops, whose terms "
        "the check compares, is a fair building block.",
    ),
    hint="the n^2 terms are the scores and the weighted sum, 2 n^2 d FLOPs each; the "
    "four projections cost "
    "2 n d^2 each. Solve 4 n^2 d = 8 n d^2 for n > 0 and return an int.",
)
def _check_projection_crossover(student) -> None:
    """``student(d_model)`` must return the ``n`` at which the scores and weighted sum
    of :func:`attnbook.complexity.attention_flops` first cost as much as its four
    projections, found by trying ``n = 1, 2, 3, ...``."""

    for d in (1, 2, 3, 64, 512, 768, 4096):
        n = 0
        # brute force: the first length whose n^2 terms reach the projections' FLOPs
        while True:
            n += 1
            flops = attention_flops(n, d)
            quadratic = flops["scores"] + flops["weighted_sum"]
            projections = flops["qkv_projections"] + flops["output_projection"]
            if quadratic >= projections:
                break
        got = student(d)
        assert_int(got, f"for d_model={d}", "the length as an int")
        assert got == n, (
            f"for d_model={d} you return n={got}; the n^2 terms (scores + weighted "
            "sum) first cost as much as the "
            f"four projections at n = {n}, {quadratic} FLOPs against {projections}."
            + _crossover_slip(student)
        )


def _crossover_slip(student) -> str:
    """The known wrong formula ``student`` follows for every ``d_model``, if any."""
    slips = [
        (
            lambda d: d,
            "n = d_model",
            "there the n^2 terms, 4 n^2 d, match a recurrent layer's 4 n d^2 "
            "(crossover_length), not the four projections' 8 n d^2",
        ),
        (
            lambda d: 3 * d // 2,
            "n = 3 d / 2",
            "that balances the n^2 terms against three projections, 6 n d^2; the "
            "output projection is the fourth",
        ),
        (
            lambda d: 4 * d,
            "n = 4 d",
            "that balances the scores alone, 2 n^2 d; the weighted sum costs "
            "2 n^2 d too",
        ),
        (
            lambda d: d // 2,
            "n = d / 2",
            "that solves 8 n^2 d = 4 n d^2, the two sides swapped",
        ),
        (
            lambda d: 2 * d + 1,
            "n = 2 d + 1",
            "at n = 2 d the two costs are already equal",
        ),
    ]
    try:
        answers = {d: student(d) for d in (2, 3, 64, 512, 768, 4096)}
    except Exception:
        return ""
    for formula, name, why in slips:
        if all(got == formula(d) for d, got in answers.items()):
            return f" Your answers are {name} for every d_model: {why}."
    return ""


@register(
    "complexity-kv-decoding-cost",
    library=forbid(
        "attnbook.complexity.attention_flops",
        "attnbook.kvcache.kv_cache_bytes",
        "attnbook.kvcache.KVCache",
        "attnbook.serving.cache_bytes_per_token",
        why="The exercise asks you to write each decoding step's FLOPs and the "
            "cache's bytes yourself; attention_flops and KVCache are what the check "
            "measures with.",
    ),
    hint="without a cache step t costs a whole layer on t tokens, 8 t d^2 + 4 t^2 d; "
    "with one it costs 8 d^2 "
    "(four projections of one token) + 4 t d (one query against t keys and t values). "
    "Sum over t = 1..T exactly "
    "(sum t = T(T+1)/2, sum t^2 = T(T+1)(2T+1)/6) with integers. The cache holds K "
    "and V: 2 x layers x "
    "n_kv_heads x (d_model / n_heads) x seq_len x batch x bytes.",
)
def _check_kv_decoding_cost(student) -> None:
    """``(decoding_flops, kv_cache_size)``: the first must equal
    :func:`attnbook.complexity.attention_flops` summed over the decoding steps without
    and with a cache, the second the bytes of an :class:`attnbook.kvcache.KVCache` of
    that shape."""

    assert (
        isinstance(student, tuple) and len(student) == 2 and all(map(callable, student))
    ), "pass the pair of functions (decoding_flops, kv_cache_size) to the check."
    decoding_flops, kv_cache_size = student
    for T, d in [(1, 1), (1, 8), (2, 4), (5, 3), (100, 64), (1000, 768)]:
        for kv_cache in (False, True):
            expected = projected = 0
            for t in range(1, T + 1):  # step t: the t-th token is new, t tokens in all
                # project the new token only, attend to t cached keys and values
                if kv_cache:
                    new_token = attention_flops(1, d)
                    attend = attention_flops(1, d, kv_len=t)
                    step = (
                        new_token["qkv_projections"]
                        + new_token["output_projection"]
                        + attend["scores"]
                        + attend["weighted_sum"]
                    )
                    projected += (
                        new_token["qkv_projections"] + new_token["output_projection"]
                    )
                else:  # the whole layer again on the t tokens so far
                    flops = attention_flops(t, d)
                    step = flops["matmul"]
                    projected += flops["qkv_projections"] + flops["output_projection"]
                expected += step
            got = decoding_flops(T, d, kv_cache=kv_cache)
            what = f"decoding_flops({T}, {d}, kv_cache={kv_cache})"
            assert_int(got, what, "an exact int")
            assert got == expected, (
                f"{what} should be {expected} (the layer's matmul FLOPs summed over "
                f"steps t = 1..{T}), got {got}. Of the {expected}, {projected} are "
                f"the four projections of {'the new token' if kv_cache else 't tokens'}"
                f" at each step and {expected - projected} the scores and weighted "
                f"sums{' against t cached keys and values' if kv_cache else ''}."
                + _decoding_slip(decoding_flops, kv_cache)
            )
    # totals near 2**72, far past 2**53: a float division such as int(x / 3) rounds
    for T, d in [(1_000_000, 4096), (123_457, 97)]:
        for kv_cache in (False, True):
            expected = _decoding_total(T, d, kv_cache)
            got = decoding_flops(T, d, kv_cache=kv_cache)
            what = f"decoding_flops({T}, {d}, kv_cache={kv_cache})"
            assert_int(got, what, "an exact int")
            assert got == expected, (
                f"{what} should be {expected}, got {got}, off by {got - expected}. "
                "A float (x / 3, int(x / 3), x / 2) keeps only 53 bits, and this "
                "total needs more: divide the integer with // (T (T + 1) (2T + 1) is "
                "a multiple of 6, T (T + 1) of 2), so the result is exact."
            )
    dtypes = {
        1: torch.float8_e4m3fn,
        2: torch.float16,
        4: torch.float32,
        8: torch.float64,
    }
    for n_layers, d, h, h_kv, seq_len, nbytes, batch in [
        (32, 4096, 32, 32, 4096, 2, 1),
        (32, 4096, 32, 8, 4096, 2, 1),
        (1, 1, 1, 1, 1, 1, 1),
        (12, 768, 12, 12, 1024, 4, 8),
        (80, 8192, 64, 8, 4096, 2, 3),
        (2, 64, 8, 1, 10, 8, 2),
    ]:
        # no memory used
        cache = KVCache(
            n_layers, batch, h_kv, d // h, seq_len, dtype=dtypes[nbytes], device="meta"
        )
        expected = sum(t.numel() * t.element_size() for t in (cache.k, cache.v))
        got = kv_cache_size(
            n_layers, d, h, h_kv, seq_len, bytes_per_elem=nbytes, batch=batch
        )
        what = (
            f"kv_cache_size({n_layers}, {d}, {h}, {h_kv}, {seq_len}, "
            f"bytes_per_elem={nbytes}, batch={batch})"
        )
        assert_int(got, what, "the bytes as an int")
        assert got == expected, (
            f"{what} should be {expected} bytes (the K and V buffers of a KVCache), "
            f"got {got}."
            + _cache_slip(got, n_layers, d, h, h_kv, seq_len, nbytes, batch)
        )


def _decoding_total(T: int, d: int, kv_cache: bool) -> int:
    """The FLOPs the check's loop sums over the steps t = 1..T, in closed form with
    integers (sum t = T(T+1)/2, sum t^2 = T(T+1)(2T+1)/6): with a cache 8 d^2 + 4 t d
    per step, without one 8 t d^2 + 4 t^2 d."""
    if kv_cache:
        return 8 * T * d * d + 2 * T * (T + 1) * d
    return 4 * T * (T + 1) * d * d + 2 * T * (T + 1) * (2 * T + 1) * d // 3


def _decoding_slip(decoding_flops, kv_cache: bool) -> str:
    """The known wrong total ``decoding_flops`` gives for every size, if any."""
    if kv_cache:
        slips = [
            (
                lambda T, d: 6 * T * d * d + 2 * T * (T + 1) * d,
                "three projections per new token, 6 d^2: the output projection is the "
                "fourth",
            ),
            (
                lambda T, d: 8 * T * d * d + T * (T + 1) * d,
                "only the scores, 2 t d per step: the weighted sum of t values costs "
                "2 t d too",
            ),
            (
                lambda T, d: 8 * T * d * d + 2 * T * T * d,
                "the leading order: sum the steps exactly, sum t = T(T+1)/2",
            ),
            (
                lambda T, d: 8 * T * d * d + 2 * T * (T - 1) * d,
                "attention to t - 1 keys at step t: the new token's key and value are "
                "cached too, t in all",
            ),
            (
                lambda T, d: (
                    4 * T * (T + 1) * d * d + 2 * T * (T + 1) * (2 * T + 1) * d // 3
                ),
                "the total without a cache: with one, each step projects only the new "
                "token",
            ),
        ]
    else:
        slips = [
            (
                lambda T, d: (
                    4 * (T - 1) * T * d * d + 2 * (T - 1) * T * (2 * T - 1) * d // 3
                ),
                "a sum over t = 0..T-1: step t = 1..T runs the layer on t tokens",
            ),
            (
                lambda T, d: 4 * T * T * d * d + 4 * T**3 * d / 3,
                "the leading order: sum the steps exactly, sum t = T(T+1)/2 and sum "
                "t^2 = T(T+1)(2T+1)/6",
            ),
            (
                lambda T, d: (
                    4 * T * (T + 1) * d * d + T * (T + 1) * (2 * T + 1) * d // 3
                ),
                "half the n^2 terms: the causal mask saves no FLOPs in a dense layer, "
                "all t^2 scores are computed",
            ),
            (
                lambda T, d: 8 * T * d * d + 2 * T * (T + 1) * d,
                "the total with a cache: without one, each step runs the layer on "
                "all t tokens",
            ),
        ]
    sizes = [(2, 4), (5, 3), (100, 64), (1000, 768)]
    try:
        totals = [decoding_flops(T, d, kv_cache=kv_cache) for T, d in sizes]
        for formula, what in slips:
            if all(abs(got - formula(*size)) <= 1 for got, size in zip(totals, sizes)):
                return f" Your totals are {what}."
    except Exception:
        pass
    return ""


def _cache_slip(got, n_layers, d, h, h_kv, seq_len, nbytes, batch) -> str:
    """What a wrong KV-cache size most likely left out, if it is a known slip."""
    size = dict(
        buffers=2,
        n_layers=n_layers,
        heads=h_kv,
        head_dim=d // h,
        seq_len=seq_len,
        batch=batch,
        nbytes=nbytes,
    )
    slips = [
        ("buffers", 1, "counts the keys only: the cache holds K and V"),
        ("heads", h, f"keeps all {h} heads: only n_kv_heads={h_kv} are cached"),
        (
            "head_dim",
            d,
            f"makes every head d_model={d} wide, not d_model // n_heads wide",
        ),
        ("n_layers", 1, "is one layer's: every layer has its own cache"),
        ("batch", 1, "is one sequence's: multiply by batch"),
        ("nbytes", 1, "counts elements, not bytes: multiply by bytes_per_elem"),
    ]
    for factor, value, what in slips:
        wrong = 1
        for k, v in {**size, factor: value}.items():
            wrong *= v
        if got == wrong and value != size[factor]:
            return f" Your size {what}."
    return ""
