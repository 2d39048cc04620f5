"""Checks for the exercises of the chapter on linear and low-rank attention."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...linear import linear_attention, performer_features
from . import register
from .common import assert_close, assert_int, generator, largest_new_tensor
from .library import allowed, forbid


def _inputs(
    seed: int, L: int, S: int, E: int = 4, Ev: int = 3, batch: tuple[int, ...] = (2,)
):
    gen = generator(seed)
    return (
        torch.randn(*batch, n, e, generator=gen, dtype=torch.float64)
        for n, e in ((L, E), (S, E), (S, Ev))
    )


def _matches(got, result) -> bool:
    """``got`` is a tensor-like of ``result``'s shape and values."""
    try:
        got = torch.as_tensor(got)
    except Exception:
        return False
    return got.shape == result.shape and bool(
        torch.allclose(got.double(), result.double(), atol=1e-6, rtol=1e-5)
    )


def _compare(got, expected, what: str, slips=()) -> None:
    """:func:`assert_close`; on a mismatch, add the note of the first slip (a pair of a
    function giving a wrong answer's result and a note) whose result ``got`` equals."""
    try:
        assert_close(got, expected, what)
    except AssertionError as err:
        note = next((note for wrong, note in slips if _matches(got, wrong())), "")
        raise AssertionError(f"{err} {note}".strip()) from None


def _elu1(x):
    return F.elu(x) + 1


def _kernel(phi_q, phi_k, v, normalize: bool = True, z_scale: float = 1.0):
    """Non-causal ``phi_q (phi_k^T v) / (phi_q z + eps)``, ``z`` the keys' sum (times
    ``z_scale``)."""
    numerator = phi_q @ (phi_k.transpose(-2, -1) @ v)
    if not normalize:
        return numerator
    z = phi_k.sum(-2).unsqueeze(-1) * z_scale
    return numerator / (phi_q @ z + 1e-6)


def _linear_slips(q, k, v) -> list:
    """What plausible wrong versions of non-causal linear attention return."""
    d, S = q.shape[-1], k.shape[-2]
    return [
        (
            lambda: _kernel(F.elu(q), F.elu(k), v),
            "Your features are elu(x): phi is elu(x) + 1, positive everywhere, so that "
            "the normalizer phi(q) . z cannot vanish.",
        ),
        (
            lambda: _kernel(torch.exp(q), torch.exp(k), v),
            "Your features are exp(x): the chapter's phi is elu(x) + 1.",
        ),
        (
            lambda: _kernel(_elu1(q / math.sqrt(d)), _elu1(k), v),
            "You scaled the queries by 1/sqrt(d) as in softmax attention: linear "
            "attention has no 1/sqrt(d), its similarity is phi(q) . phi(k).",
        ),
        (
            lambda: _kernel(_elu1(q), _elu1(k), v) / math.sqrt(d),
            "Your output is divided by sqrt(d): linear attention has no 1/sqrt(d).",
        ),
        (
            lambda: _kernel(_elu1(q), _elu1(k), v, normalize=False),
            "Your output is phi(Q) (phi(K)^T V) without the normalizer: divide row by "
            "row by phi(q_i) . sum_j phi(k_j) + eps.",
        ),
        (
            lambda: _kernel(_elu1(q), _elu1(k), v, z_scale=1 / S),
            "Your normalizer averages phi(k_j) over the keys: z is their sum (with the "
            "mean the output is S times too large).",
        ),
    ]


@register(
    "linear-attention",
    library=forbid(
        "attnbook.linear.linear_attention",
        "attnbook.linear.linear_attention_weights",
        "attnbook.linear.linear_attention_recurrent",
        "attnbook.linear.linear_attention_step",
        why="The exercise asks you to write linear attention by associativity, which "
            "linear_attention, the check's reference, implements; elu_feature_map "
            "stays allowed.",
    ),
    hint="compute kv = phi(K)^T V (shape M x Ev) and z = the sum of phi(K) over the "
    "keys first, then "
    "divide phi(Q) kv by phi(Q) z + eps row by row; phi is elu(x) + 1 and there is no "
    "1/sqrt(d).",
)
def _check_linear_attention(student) -> None:
    """``student(q, k, v)`` must equal :func:`attnbook.linear.linear_attention` (elu + 1
    features) for ``L != S`` and batched heads."""

    for seed, (L, S) in enumerate([(5, 5), (3, 8), (1, 1), (7, 2)]):
        q, k, v = _inputs(seed, L, S)
        _compare(
            student(q, k, v),
            linear_attention(q, k, v),
            f"linear attention for L={L}, S={S}",
            _linear_slips(q, k, v),
        )
    q, k, v = _inputs(9, 4, 6, batch=(2, 3))
    _compare(
        student(q, k, v),
        linear_attention(q, k, v),
        "linear attention with (batch, heads, n, d) inputs",
        _linear_slips(q, k, v),
    )
    _check_linear_memory(student)


def _check_linear_memory(student, n: int = 1024, M: int = 4, Ev: int = 3) -> None:
    """Linear attention never forms the ``n x n`` matrix ``phi(Q) phi(K)^T``: at
    ``n = 1024`` with ``M = 4`` features and ``Ev = 3`` value dimensions, no tensor the
    student's operations create may hold more than ``n * M * Ev`` elements (the
    outer products ``phi(k_j) v_j^T`` of every key), where ``n^2`` is 85 times that.
    Every operation is traced (:func:`attnbook.utils.largest_new_tensor`), in the
    submission's kernel when the grader checks."""
    q, k, v = _inputs(10, n, n, E=M, Ev=Ev, batch=())
    largest = largest_new_tensor(student, q, k, v)
    bound = n * M * Ev
    if largest <= bound:
        return
    if largest % (n * n) == 0:
        extra = largest // (n * n)
        made = (
            f"{largest} = {n} x {n}{f' x {extra}' if extra > 1 else ''} elements: "
            "an n x n matrix such as phi(Q) phi(K)^T (every query against every "
            "key), which the exercise rules out"
        )
    else:
        made = f"{largest} elements, more than n * M * Ev = {bound}"
    raise AssertionError(
        f"for q, k of shape ({n}, {M}) and v of shape ({n}, {Ev}) your code made a "
        f"tensor of {made}. Multiply in the other order: phi(K)^T V is only M x Ev "
        f"({M} x {Ev}) and phi(K) summed over the keys only M long, so memory grows "
        "like n, not n^2."
    )


def _causal(q, k, v, exclusive: bool = False, causal_z: bool = True):
    """Causal linear attention with elu + 1 features by prefix sums, or one of two
    slips: keys ``0..i-1`` (``exclusive``) or a normalizer over all keys."""
    phi_q, phi_k = _elu1(q), _elu1(k)
    outer = phi_k.unsqueeze(-1) * v.unsqueeze(-2)
    S, z = torch.cumsum(outer, dim=-3), torch.cumsum(phi_k, dim=-2)
    if exclusive:
        S, z = S - outer, z - phi_k
    if not causal_z:
        z = phi_k.sum(-2, keepdim=True)
    numerator = (phi_q.unsqueeze(-2) @ S).squeeze(-2)
    return numerator / ((phi_q * z).sum(-1, keepdim=True) + 1e-6)


def _causal_slips(q, k, v) -> list:

    return [
        (
            lambda: linear_attention(q, k, v),
            "Your output is non-causal linear attention: query i may use only keys "
            "0..i, so S_i and z_i are prefix sums (torch.cumsum over the sequence), "
            "not sums over all keys.",
        ),
        (
            lambda: _causal(q, k, v, exclusive=True),
            "Off by one: in your output query i sees keys 0..i-1; it must also see key "
            "i (an inclusive cumsum: S_i includes phi(k_i) v_i^T).",
        ),
        (
            lambda: _causal(q, k, v, causal_z=False),
            "Your numerator is causal but your normalizer sums phi(k_j) over all keys: "
            "z_i must be a prefix sum too.",
        ),
        (
            lambda: (
                torch.cumsum(_elu1(k).unsqueeze(-1) * v.unsqueeze(-2), dim=-3)
                .mul(_elu1(q).unsqueeze(-1))
                .sum(-2)
            ),
            "Your output is phi(q_i) S_i without the normalizer: divide by "
            "phi(q_i) . z_i + eps.",
        ),
    ]


@register(
    "linear-causal-prefix-sums",
    library=forbid(
        "attnbook.linear.linear_attention",
        "attnbook.linear.linear_attention_weights",
        "attnbook.linear.linear_attention_recurrent",
        "attnbook.linear.linear_attention_step",
        why="The exercise asks you to write causal linear attention with prefix "
            "sums, which linear_attention with is_causal=True implements; "
            "elu_feature_map stays allowed.",
    ),
    hint="torch.cumsum over the sequence of the outer products phi(k_j) v_j^T (shape "
    "n x M x Ev) and of "
    "phi(k_j) gives S_i and z_i; out_i = phi(q_i) S_i / (phi(q_i) z_i + eps). Query i "
    "sees keys 0..i.",
)
def _check_causal_prefix_sums(student) -> None:
    """``student(q, k, v)`` must equal :func:`attnbook.linear.linear_attention` with
    ``is_causal=True``, and later keys must not change earlier outputs."""

    for seed, n in enumerate([1, 2, 6, 11]):
        q, k, v = _inputs(seed, n, n)
        expected = linear_attention(q, k, v, is_causal=True)
        _compare(
            student(q, k, v),
            expected,
            f"causal linear attention for n={n}",
            _causal_slips(q, k, v),
        )
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
    q, k, v = _inputs(7, 5, 5, batch=(2, 3))
    try:
        assert_close(
            student(q, k, v),
            linear_attention(q, k, v, is_causal=True),
            "causal linear attention with (batch, heads, n, d) inputs",
        )
    except AssertionError as err:
        raise AssertionError(
            f"{err} The (batch, n, d) cases passed: take the cumsums over the sequence "
            "dimension counted from the end (dim=-3 for the outer products, dim=-2 for "
            "phi(k)), not over a fixed dim such as 1."
        ) from None


def _features(x, W, power=-0.25, scaled_norm=True, half=True, norm=True, m_root=True):
    """Performer features, or one slip: the power of ``d`` that scales ``x``, the norm
    of the unscaled ``x``, ``|x~|^2`` without the half, no norm term, a division by
    ``m`` instead of ``sqrt(m)`` (``m_root=False``) or none (``m_root=None``)."""
    d, m = x.shape[-1], W.shape[0]
    xs = x * d**power
    sq = ((xs if scaled_norm else x) ** 2).sum(-1, keepdim=True)
    log_phi = xs @ W.T - (sq / 2 if half else sq) * norm
    divide = 1.0 if m_root is None else math.sqrt(m) if m_root else m
    return torch.exp(log_phi) / divide


def _performer_slips(x, W) -> list:
    return [
        (
            lambda: _features(x, W, power=0.0),
            "You did not scale x: x~ = x d^(-1/4), so that x~_q . x~_k = q . k / "
            "sqrt(d).",
        ),
        (
            lambda: _features(x, W, power=-0.5),
            "You scaled x by d^(-1/2): x~ = x d^(-1/4) (the 1/sqrt(d) is shared by the "
            "query and the key).",
        ),
        (
            lambda: _features(x, W, scaled_norm=False),
            "Your |x~|^2 is the norm of x before scaling: use the scaled x~ in both "
            "terms.",
        ),
        (
            lambda: _features(x, W, half=False),
            "You subtract |x~|^2: subtract |x~|^2 / 2.",
        ),
        (
            lambda: _features(x, W, norm=False),
            "Your features are exp(W x~) / sqrt(m): subtract |x~|^2 / 2 in the "
            "exponent, without it phi(q) . phi(k) estimates exp(|q~ + k~|^2 / 2), not "
            "exp(q~ . k~).",
        ),
        (
            lambda: _features(x, W, m_root=None),
            "You did not divide by sqrt(m), m = W.shape[0].",
        ),
        (
            lambda: _features(x, W, m_root=False),
            "You divided by m: divide by sqrt(m) (phi(q) and phi(k) each carry "
            "1/sqrt(m), so that their dot product averages the m features).",
        ),
    ]


@register(
    "linear-performer-features",
    library=forbid(
        "attnbook.linear.performer_features",
        "attnbook.linear.performer_attention",
        why="The exercise asks you to write the FAVOR+ features, which "
            "performer_features, the check's reference, computes.",
    ),
    hint="scale x by d**-0.25 first, then exp(x~ W^T - |x~|^2 / 2) / sqrt(m) with m = "
    "W.shape[0] "
    "(one exp of a difference: a quotient of two exps overflows sooner).",
)
def _check_performer_features(student) -> None:
    """``student(x, W)`` must equal :func:`attnbook.linear.performer_features`, and stay
    finite and exact where ``exp(|x~|^2 / 2)`` overflows."""

    gen = generator(0)
    for d, m, scale in [(4, 7, 1.0), (16, 32, 0.5), (8, 3, 1.0)]:
        x = scale * torch.randn(2, 5, d, generator=gen, dtype=torch.float64)
        W = torch.randn(m, d, generator=gen, dtype=torch.float64)
        _compare(
            student(x, W),
            performer_features(x, W),
            f"features for d={d}, m={m}",
            _performer_slips(x, W),
        )
    # x~ = t w_0 with |w_0| = 25: |x~|^2 / 2 = 625 t^2 / 2 > 1200 overflows exp, while
    # the first feature, exp(625 (t - t^2 / 2)) / sqrt(m), lies between e^-32 and e^13
    W = torch.randn(8, 16, generator=gen, dtype=torch.float64)
    W[0] *= 25 / W[0].norm()
    t = torch.tensor([1.98, 2.0, 2.02, 2.05], dtype=torch.float64)
    x = (t[:, None] * W[0] * 16**0.25).unsqueeze(0)  # (1, 4, 16); x~ = x / 2
    got = torch.as_tensor(student(x, W))
    assert torch.isfinite(got).all(), (
        "features of inputs with a large norm (|x~|^2 / 2 > 1200) must stay finite "
        "(no inf / nan): exp(|x~|^2 / 2) overflows there, so a quotient or a product "
        "of two exps gives inf or NaN; take one exp of the difference, exp(W x~ - "
        "|x~|^2 / 2)."
    )
    assert_close(
        got,
        performer_features(x, W),
        "features of inputs with a large norm (|x~|^2 / 2 > 1200)",
        atol=1e-300,
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


def _ceil(a, b) -> int:
    return -(-a // b)


# flop_crossover's slips: (M, d, random_features) -> what the answer returns, and a note
_CROSSOVER_SLIPS = [
    (
        lambda M, d, rf: (4 * (1 + rf) * M * d + 2 * M) // (4 * d),
        "You round down: the crossover is the smallest integer n >= (linear's cost per "
        "n) / (4 d), a ceiling (-(-a // b) with integers).",
    ),
    (
        lambda M, d, rf: (4 * (1 + rf) * M * d + 2 * M) // (4 * d) + 1,
        "Equality counts: where the two costs are equal linear attention is already no "
        "more expensive (<=, not <).",
    ),
    (
        lambda M, d, rf: round((4 * (1 + rf) * M * d + 2 * M) / (4 * d)),
        "You round to the nearest integer: the crossover is a ceiling.",
    ),
    (
        lambda M, d, rf: (1 + rf) * M,
        "That is the leading order: the 2 n M FLOPs of phi(Q) z move the crossover to "
        "n >= M + M / (2 d) (2 M + M / (2 d) with the features).",
    ),
    (
        lambda M, d, rf: _ceil(4 * M * d + 2 * M, 4 * d),
        "With random_features=True count the features too: W x~ costs 2 n M d for the "
        "queries and again for the keys.",
    ),
    (
        lambda M, d, rf: _ceil((4 + 2 * rf) * M * d + 2 * M, 4 * d),
        "The features cost 2 n M d for the queries and again for the keys (two "
        "products, not one).",
    ),
    (
        lambda M, d, rf: _ceil(4 * (1 + rf) * M * d + 2 * M, 2 * d),
        "Softmax attention costs two products of 2 n^2 d FLOPs each, Q K^T and A V.",
    ),
]


def _crossover_slip(student, cases) -> str:
    """The note of the slip whose results the answer returns on every case, or ''."""
    try:
        got = [student(M, d, random_features=rf) for M, d, rf in cases]
    except Exception:
        return ""
    for slip, note in _CROSSOVER_SLIPS:
        if all(g == slip(M, d, rf) for g, (M, d, rf) in zip(got, cases)):
            return " " + note
    return ""


@register(
    "linear-crossover",
    library=allowed(
        "A count from the shapes; no attnbook function counts linear attention's "
        "FLOPs.",
    ),
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

    def costs(n, M, d, random_features):
        return (
            flops_of(products)
            for products in counted_products(n, M, d, random_features)
        )

    for M, d, random_features in cases:
        n = 1
        # brute force: the first length at which linear attention is no more expensive
        while True:
            linear, softmax = costs(n, M, d, random_features)
            if linear <= softmax:
                break
            n += 1
        got = student(M, d, random_features=random_features)
        what = f"flop_crossover({M}, {d}, random_features={random_features})"
        assert_int(got, what, "a length as an int")
        if got != n:
            at_yours = ""
            if 1 <= got < n:
                mine = tuple(costs(got, M, d, random_features))
                at_yours = (
                    f" At your n = {got} linear attention still costs {mine[0]} "
                    f"against {mine[1]}."
                )
            raise AssertionError(
                f"{what} should be {n}: at n = {n} linear attention costs {linear} "
                "matmul FLOPs against softmax "
                f"attention's {softmax}, and at every shorter length it costs more; "
                f"you return {got}.{at_yours}{_crossover_slip(student, cases)}"
            )
