"""Plausible wrong answers to the exercises of the chapter on linear and low-rank attention: each fails
its check with a message that points at the mistake."""

import math

import torch
import torch.nn.functional as F
from wrong_answers import Mistake, mistake_test


# linear-attention: the book's solution with one thing changed
def _linear(q, k, v, eps=1e-6, *, plus_one=True, q_scale=False, normalize=True, z_mean=False):
    if q_scale:  # 1/sqrt(d) carried over from softmax attention
        q = q / math.sqrt(q.shape[-1])
    phi_q, phi_k = F.elu(q) + plus_one, F.elu(k) + plus_one
    kv = phi_k.transpose(-2, -1) @ v
    z = (phi_k.mean(-2, keepdim=True) if z_mean else phi_k.sum(-2, keepdim=True)).transpose(-2, -1)
    return (phi_q @ kv) / (phi_q @ z + eps) if normalize else phi_q @ kv


def _linear_through_the_n_by_n_weights(q, k, v, eps=1e-6):
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    similarity = phi_q @ phi_k.transpose(-2, -1)  # (..., L, S): the quadratic route
    return (similarity @ v) / (similarity.sum(-1, keepdim=True) + eps)


def _linear_through_broadcast_products(q, k, v, eps=1e-6):
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    similarity = (phi_q.unsqueeze(-2) * phi_k.unsqueeze(-3)).sum(-1)  # (..., L, S, M) first
    return (similarity @ v) / (similarity.sum(-1, keepdim=True) + eps)


def _linear_elu_without_plus_one(q, k, v, eps=1e-6):
    return _linear(q, k, v, eps, plus_one=False)


def _linear_queries_scaled_by_sqrt_d(q, k, v, eps=1e-6):
    return _linear(q, k, v, eps, q_scale=True)


def _linear_without_normalizer(q, k, v, eps=1e-6):
    return _linear(q, k, v, eps, normalize=False)


def _linear_normalizer_mean_over_keys(q, k, v, eps=1e-6):
    return _linear(q, k, v, eps, z_mean=True)


# linear-causal-prefix-sums: the book's solution with one thing changed
def _causal(q, k, v, eps=1e-6, *, causal=True, exclusive=False, causal_z=True, dim=None):
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    outer = phi_k.unsqueeze(-1) * v.unsqueeze(-2)
    if causal:
        S = torch.cumsum(outer, dim=-3 if dim is None else dim)
        z = torch.cumsum(phi_k, dim=-2 if dim is None else dim)
    else:  # every query sums over every key
        S, z = outer.sum(-3, keepdim=True), phi_k.sum(-2, keepdim=True)
    if exclusive:  # S_i and z_i of keys 0..i-1
        S, z = S - outer, z - phi_k
    if not causal_z:
        z = phi_k.sum(-2, keepdim=True)
    numerator = (phi_q.unsqueeze(-2) @ S).squeeze(-2)
    return numerator / ((phi_q * z).sum(-1, keepdim=True) + eps)


def _causal_forgot_the_mask(q, k, v, eps=1e-6):
    return _causal(q, k, v, eps, causal=False)


def _causal_exclusive_prefix_sums(q, k, v, eps=1e-6):
    return _causal(q, k, v, eps, exclusive=True)


def _causal_normalizer_over_all_keys(q, k, v, eps=1e-6):
    return _causal(q, k, v, eps, causal_z=False)


def _causal_cumsum_over_dim_1(q, k, v, eps=1e-6):
    return _causal(q, k, v, eps, dim=1)  # the sequence only for (batch, n, d) inputs


# linear-performer-features: the book's solution with one thing changed
def _features(x, W, *, power=-0.25, quotient=False, by_m=False, norm_of_x=False):
    norm = (x * x).sum(-1, keepdim=True) if norm_of_x else None
    x = x * x.shape[-1] ** power
    norm = (x * x).sum(-1, keepdim=True) if norm is None else norm
    if quotient:  # exp(W x~) / exp(|x~|^2 / 2): inf / inf for a large norm
        phi = torch.exp(x @ W.T) / torch.exp(norm / 2)
    else:
        phi = torch.exp(x @ W.T - norm / 2)
    return phi / (W.shape[0] if by_m else math.sqrt(W.shape[0]))


def _features_unscaled(x, W):
    return _features(x, W, power=0.0)


def _features_scaled_by_inverse_sqrt_d(x, W):
    return _features(x, W, power=-0.5)


def _features_quotient_of_two_exps(x, W):
    return _features(x, W, quotient=True)


def _features_divided_by_m(x, W):
    return _features(x, W, by_m=True)


def _features_norm_of_unscaled_x(x, W):
    return _features(x, W, norm_of_x=True)


# linear-crossover: tests/course/test_exercises.py already rejects the leading order M, a strict inequality, the
# features left out and a float; these are the other slips of the count
def _crossover_rounded_down(M, d, random_features=False):
    c = 2 if random_features else 1
    return (4 * c * M * d + 2 * M) // (4 * d)  # floor, not ceiling


def _crossover_one_softmax_product(M, d, random_features=False):
    c = 2 if random_features else 1
    return -(-(4 * c * M * d + 2 * M) // (2 * d))  # softmax as 2 n^2 d: A V forgotten


def _crossover_features_of_one_side(M, d, random_features=False):
    c = 1.5 if random_features else 1  # W x~ counted for the queries only
    return int(-(-(4 * c * M * d + 2 * M) // (4 * d)))


def _crossover_rounded_to_nearest(M, d, random_features=False):
    c = 2 if random_features else 1
    return round((4 * c * M * d + 2 * M) / (4 * d))


MISTAKES = [
    Mistake("linear-attention", "phi(Q) phi(K)^T formed: n x n memory", _linear_through_the_n_by_n_weights,
            ("for q, k of shape (1024, 4) and v of shape (1024, 3)", "1048576 = 1024 x 1024 elements",
             "phi(Q) phi(K)^T", "rules out", "phi(K)^T V is only M x Ev (4 x 3)", "not n^2")),
    Mistake("linear-attention", "phi(q_i) * phi(k_j) broadcast: n x n x M memory", _linear_through_broadcast_products,
            ("for q, k of shape (1024, 4)", "4194304 = 1024 x 1024 x 4 elements", "an n x n matrix",
             "Multiply in the other order")),
    Mistake("linear-attention", "phi = elu(x) without + 1", _linear_elu_without_plus_one,
            ("linear attention for L=5, S=5", "Your features are elu(x)", "elu(x) + 1")),
    Mistake("linear-attention", "queries scaled by 1/sqrt(d)", _linear_queries_scaled_by_sqrt_d,
            ("linear attention for L=5, S=5", "scaled the queries by 1/sqrt(d)", "no 1/sqrt(d)")),
    Mistake("linear-attention", "no normalizer", _linear_without_normalizer,
            ("linear attention for L=5, S=5", "without the normalizer", "phi(q_i) . sum_j phi(k_j) + eps")),
    Mistake("linear-attention", "normalizer averages phi(k) over the keys", _linear_normalizer_mean_over_keys,
            ("linear attention for L=5, S=5", "averages phi(k_j) over the keys", "z is their sum")),
    Mistake("linear-causal-prefix-sums", "not causal: sums over all keys", _causal_forgot_the_mask,
            ("causal linear attention for n=2", "non-causal linear attention", "only keys 0..i",
             "torch.cumsum")),
    Mistake("linear-causal-prefix-sums", "exclusive prefix sums: keys 0..i-1", _causal_exclusive_prefix_sums,
            ("causal linear attention for n=1", "Off by one", "must also see key i", "inclusive cumsum")),
    Mistake("linear-causal-prefix-sums", "normalizer over all keys", _causal_normalizer_over_all_keys,
            ("causal linear attention for n=2", "normalizer sums phi(k_j) over all keys", "prefix sum too")),
    Mistake("linear-causal-prefix-sums", "cumsum over dim 1: right only for (batch, n, d)",
            _causal_cumsum_over_dim_1,
            ("(batch, heads, n, d) inputs", "(batch, n, d) cases passed", "counted from the end", "dim=-3")),
    Mistake("linear-performer-features", "x not scaled by d^(-1/4)", _features_unscaled,
            ("features for d=4, m=7", "You did not scale x", "x~ = x d^(-1/4)")),
    Mistake("linear-performer-features", "x scaled by d^(-1/2)", _features_scaled_by_inverse_sqrt_d,
            ("features for d=4, m=7", "scaled x by d^(-1/2)", "x~ = x d^(-1/4)")),
    Mistake("linear-performer-features", "quotient of two exps overflows", _features_quotient_of_two_exps,
            ("large norm", "must stay finite", "exp(|x~|^2 / 2) overflows", "one exp of the difference")),
    Mistake("linear-performer-features", "divided by m, not sqrt(m)", _features_divided_by_m,
            ("features for d=4, m=7", "You divided by m", "divide by sqrt(m)")),
    Mistake("linear-performer-features", "norm of the unscaled x", _features_norm_of_unscaled_x,
            ("features for d=4, m=7", "norm of x before scaling", "scaled x~ in both terms")),
    Mistake("linear-crossover", "rounded down", _crossover_rounded_down,
            ("flop_crossover(64, 64, random_features=False) should be 65", "you return 64",
             "At your n = 64 linear attention still costs", "You round down", "a ceiling")),
    Mistake("linear-crossover", "softmax counted as Q K^T alone", _crossover_one_softmax_product,
            ("flop_crossover(64, 64, random_features=False) should be 65", "you return 129",
             "two products of 2 n^2 d FLOPs each")),
    Mistake("linear-crossover", "features of the queries only", _crossover_features_of_one_side,
            ("flop_crossover(266, 64, random_features=True) should be 535", "you return 402",
             "for the queries and again for the keys")),
    Mistake("linear-crossover", "rounded to the nearest integer", _crossover_rounded_to_nearest,
            ("flop_crossover(64, 64, random_features=False) should be 65", "you return 64",
             "round to the nearest integer", "a ceiling")),
]

test_wrong_answers = mistake_test(MISTAKES)
