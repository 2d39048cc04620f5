"""Checks for the exercises of the chapter on linear and low-rank attention."""

from __future__ import annotations

import torch

from . import register
from .common import assert_close, assert_int, generator


def _inputs(
    seed: int, L: int, S: int, E: int = 4, Ev: int = 3, batch: tuple[int, ...] = (2,)
):
    gen = generator(seed)
    return (
        torch.randn(*batch, n, e, generator=gen, dtype=torch.float64)
        for n, e in ((L, E), (S, E), (S, Ev))
    )


@register(
    "linear-attention",
    hint="compute kv = phi(K)^T V (shape M x Ev) and z = the sum of phi(K) over the "
    "keys first, then "
    "divide phi(Q) kv by phi(Q) z + eps row by row; phi is elu(x) + 1 and there is no "
    "1/sqrt(d).",
)
def _check_linear_attention(student) -> None:
    """``student(q, k, v)`` must equal :func:`attnbook.linear.linear_attention` (elu + 1
    features) for ``L != S`` and batched heads."""

    from ..linear import linear_attention

    for seed, (L, S) in enumerate([(5, 5), (3, 8), (1, 1), (7, 2)]):
        q, k, v = _inputs(seed, L, S)
        assert_close(
            student(q, k, v),
            linear_attention(q, k, v),
            f"linear attention for L={L}, S={S}",
        )
    q, k, v = _inputs(9, 4, 6, batch=(2, 3))
    assert_close(
        student(q, k, v),
        linear_attention(q, k, v),
        "linear attention with (batch, heads, n, d) inputs",
    )


@register(
    "linear-causal-prefix-sums",
    hint="torch.cumsum over the sequence of the outer products phi(k_j) v_j^T (shape "
    "n x M x Ev) and of "
    "phi(k_j) gives S_i and z_i; out_i = phi(q_i) S_i / (phi(q_i) z_i + eps). Query i "
    "sees keys 0..i.",
)
def _check_causal_prefix_sums(student) -> None:
    """``student(q, k, v)`` must equal :func:`attnbook.linear.linear_attention` with
    ``is_causal=True``, and later keys must not change earlier outputs."""

    from ..linear import linear_attention

    for seed, n in enumerate([1, 2, 6, 11]):
        q, k, v = _inputs(seed, n, n)
        expected = linear_attention(q, k, v, is_causal=True)
        assert_close(student(q, k, v), expected, f"causal linear attention for n={n}")
    q, k, v = _inputs(5, 6, 6)
    q2 = q.clone()
    k2, v2 = k.clone(), v.clone()
    k2[..., 4:, :] += 5.0
    v2[..., 4:, :] -= 5.0
    assert_close(
        student(q2, k2, v2)[..., :4, :],
        student(q, k, v)[..., :4, :],
        "changing keys/values 4 and 5 must not change outputs 0..3 (causality)",
    )


@register(
    "linear-performer-features",
    hint="scale x by d**-0.25 first, then exp(x~ W^T - |x~|^2 / 2) / sqrt(m) with m = "
    "W.shape[0] "
    "(one exp of a difference: a quotient of two exps overflows sooner).",
)
def _check_performer_features(student) -> None:
    """``student(x, W)`` must equal :func:`attnbook.linear.performer_features`, and stay
    finite for inputs with a large norm."""

    from ..linear import performer_features

    gen = generator(0)
    for d, m, scale in [(4, 7, 1.0), (16, 32, 0.5), (8, 3, 1.0)]:
        x = scale * torch.randn(2, 5, d, generator=gen, dtype=torch.float64)
        W = torch.randn(m, d, generator=gen, dtype=torch.float64)
        assert_close(
            student(x, W), performer_features(x, W), f"features for d={d}, m={m}"
        )
    # |x~|^2 / 2 ~ 3000
    x = 40.0 * torch.randn(1, 4, 16, generator=gen, dtype=torch.float64)
    W = torch.randn(8, 16, generator=gen, dtype=torch.float64)
    got = torch.as_tensor(student(x, W))
    assert torch.isfinite(got).all(), (
        "features of inputs with a large norm must stay finite (no inf / nan)."
    )
    assert_close(
        got,
        performer_features(x, W),
        "features of inputs with a large norm",
        atol=1e-12,
        rtol=1e-6,
    )


def counted_products(
    n: int, M: int, d: int, random_features: bool
) -> tuple[list, list]:
    """The (rows, inner, cols) shapes of the matrix products of one head: linear
    attention's, then softmax attention's."""
    linear = [(M, n, d), (n, M, d), (n, M, 1)]  # phi(K)^T V, phi(Q) S, phi(Q) z
    if random_features:
        linear += [(n, d, M), (n, d, M)]  # W x~ for the queries and for the keys
    return linear, [(n, d, n), (n, n, d)]  # Q K^T, A V


def flops_of(products: list) -> int:
    """FLOPs of a list of (rows, inner, cols) matrix products, 2 per multiply-add."""
    return sum(2 * rows * inner * cols for rows, inner, cols in products)


@register(
    "linear-crossover",
    hint="linear attention: phi(K)^T V and phi(Q) S cost 2 n M d each, phi(Q) z costs "
    "2 n M (plus 2 n M d for the "
    "features of Q and again of K with random_features); softmax: Q K^T and A V cost "
    "2 n^2 d each. Find the smallest "
    "integer n with linear <= softmax (equality counts), with integer arithmetic.",
)
def _check_crossover(student) -> None:
    """``student(M, d, random_features)`` must return the first of ``n = 1, 2, 3, ...``
    at which linear attention's matmul FLOPs, summed product by product from the shapes,
    are at most softmax attention's."""

    cases = [
        (64, 64, False),
        (266, 64, False),
        (266, 64, True),
        (1, 1, False),
        (1, 1, True),
        (128, 64, False),
        (64, 32, False),
        (32, 64, False),
        (100, 8, True),
        (256, 128, True),
        (3, 1, False),
    ]
    for M, d, random_features in cases:
        n = 1
        # brute force: the first length at which linear attention is no more expensive
        while True:
            linear, softmax = (
                flops_of(products)
                for products in counted_products(n, M, d, random_features)
            )
            if linear <= softmax:
                break
            n += 1
        got = student(M, d, random_features=random_features)
        what = f"flop_crossover({M}, {d}, random_features={random_features})"
        assert_int(got, what, "a length as an int")
        assert got == n, (
            f"{what} should be {n}: at n = {n} linear attention costs {linear} matmul "
            "FLOPs against softmax "
            f"attention's {softmax}, and at every shorter length it costs more; you "
            f"return {got}."
        )
