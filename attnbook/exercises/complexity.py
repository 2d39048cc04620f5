"""Checks for the exercises of the chapter on the quadratic cost."""

from __future__ import annotations

import torch

from ..complexity import attention_flops, attention_memory_bytes
from . import register
from .common import assert_int


@register(
    "complexity-attention-flops",
    hint="Count 2 FLOPs per multiply-add in the four matrix products: Q, K, V "
    "projections (3 of n x d times d x d), "
    "scores (h heads of (n, d/h) x (d/h, n)), weighted sum, output projection. The "
    "head count cancels out.",
)
def _check_attention_matmul_flops(student) -> None:
    """``student(n, d_model, n_heads=..., batch=...)`` must equal the matrix-product
    FLOPs of :func:`attnbook.complexity.attention_flops`, exactly, on six sizes."""

    cases = [
        (1, 1, 1, 1),
        (4, 8, 2, 1),
        (7, 12, 3, 5),
        (128, 64, 1, 2),
        (1000, 512, 8, 1),
        (4096, 4096, 32, 3),
    ]
    for n, d, h, batch in cases:
        got = student(n, d, n_heads=h, batch=batch)
        expected = attention_flops(n, d, n_heads=h, batch=batch)["matmul"]
        assert got == expected, (
            f"for n={n}, d_model={d}, n_heads={h}, batch={batch} you return {got!r}; "
            f"the matrix products cost {expected} FLOPs."
        )


@register(
    "complexity-max-seq-len",
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
                "the budget."
            )
        longer = attention_memory_bytes(n + 1, **kwargs)
        assert longer > budget, (
            f"for {case} you return n={n}, but n={n + 1} still fits ({longer} bytes "
            f"<= {budget}): return the largest n."
        )


@register(
    "complexity-projection-crossover",
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
        )


@register(
    "complexity-kv-decoding-cost",
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
    from ..kvcache import KVCache

    assert (
        isinstance(student, tuple) and len(student) == 2 and all(map(callable, student))
    ), "pass the pair of functions (decoding_flops, kv_cache_size) to the check."
    decoding_flops, kv_cache_size = student
    for T, d in [(1, 1), (1, 8), (2, 4), (5, 3), (100, 64), (1000, 768)]:
        for kv_cache in (False, True):
            expected = 0
            for t in range(1, T + 1):  # step t: the t-th token is new, t tokens in all
                # project the new token only, attend to t cached keys and values
                if kv_cache:
                    new_token = attention_flops(1, d)
                    attend = attention_flops(1, d, kv_len=t)
                    expected += (
                        new_token["qkv_projections"]
                        + new_token["output_projection"]
                        + attend["scores"]
                        + attend["weighted_sum"]
                    )
                else:  # the whole layer again on the t tokens so far
                    expected += attention_flops(t, d)["matmul"]
            got = decoding_flops(T, d, kv_cache=kv_cache)
            what = f"decoding_flops({T}, {d}, kv_cache={kv_cache})"
            assert_int(got, what, "an exact int")
            assert got == expected, (
                f"{what} should be {expected} (the layer's matmul FLOPs summed over "
                f"steps t = 1..{T}), got {got}."
            )
    dtypes = {1: torch.uint8, 2: torch.float16, 4: torch.float32, 8: torch.float64}
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
        )
