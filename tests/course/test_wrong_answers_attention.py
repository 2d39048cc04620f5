"""Plausible wrong answers to the exercises of the chapter on attention fundamentals: each fails its
check with a message that points at the mistake."""

import math

import torch
from wrong_answers import Mistake, mistake_test

from attnbook import core


# attention-masked-softmax: the book's solution with one thing changed
def _softmax(scores, mask=None, temperature=1.0, *, divide=True, fill=float("-inf"), subtract_max=True,
             guard_dead_rows=True, dim=-1, mask_after=False, global_max=False):
    scores = scores / temperature if divide else scores * temperature
    if mask is not None and not mask_after:
        scores = scores.masked_fill(~mask, fill)
    if subtract_max:
        row_max = scores.amax() if global_max else scores.amax(dim=dim, keepdim=True)
        if guard_dead_rows:
            row_max = row_max.masked_fill(torch.isneginf(row_max), 0.0)
        scores = scores - row_max
    exp = torch.exp(scores)
    total = exp.sum(dim=dim, keepdim=True)
    weights = exp / total.clamp_min(torch.finfo(exp.dtype).tiny) if guard_dead_rows else exp / total
    if mask is not None and mask_after:  # the softmax over all keys, then the masked ones zeroed
        weights = weights.masked_fill(~mask, 0.0)
    return weights


def _softmax_times_temperature(scores, mask=None, temperature=1.0):
    return _softmax(scores, mask, temperature, divide=False)


def _softmax_without_the_row_maximum(scores, mask=None, temperature=1.0):
    return _softmax(scores, mask, temperature, subtract_max=False)


def _softmax_nan_on_a_fully_masked_row(scores, mask=None, temperature=1.0):
    return _softmax(scores, mask, temperature, guard_dead_rows=False)


def _softmax_masked_with_a_large_negative_number(scores, mask=None, temperature=1.0):
    return _softmax(scores, mask, temperature, fill=-1e9)


def _softmax_minus_the_tensors_maximum(scores, mask=None, temperature=1.0):
    return _softmax(scores, mask, temperature, global_max=True)


def _softmax_minus_each_matrixs_maximum(scores, mask=None, temperature=1.0):
    scores = scores / temperature
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    exp = torch.exp(scores - scores.amax(dim=(-2, -1), keepdim=True))
    return exp / exp.sum(-1, keepdim=True).clamp_min(torch.finfo(exp.dtype).tiny)


def _softmax_minus_the_tensors_maximum_dead_rows_zeroed_after(scores, mask=None, temperature=1.0):
    scores = scores / temperature
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    exp = torch.exp(scores - scores.max())
    weights = exp / exp.sum(-1, keepdim=True)  # 0 / 0 where every exp underflowed
    return torch.where(torch.isneginf(scores).all(-1, keepdim=True), 0.0, weights)


def _softmax_dividing_in_place(scores, mask=None, temperature=1.0):
    scores /= temperature  # changes the caller's tensor
    return _softmax(scores, mask)


def _softmax_over_the_queries(scores, mask=None, temperature=1.0):
    return _softmax(scores, mask, temperature, dim=-2)


def _softmax_masked_after_normalizing(scores, mask=None, temperature=1.0):
    return _softmax(scores, mask, temperature, mask_after=True)


# attention-multi-head: the book's solution with one thing changed
def _multi_head(mha, x, context=None, *, kv_from_x=False, strided=False, out_proj=True, no_transpose=False):
    context = x if context is None or kv_from_x else context
    d, h = mha.head_dim, mha.n_heads
    q, k, v = mha.q_proj(x), mha.k_proj(context), mha.v_proj(context)
    if no_transpose:  # (B, T, d_model) viewed as (B, h, T, head_dim): mixes tokens and heads
        B, L, S = x.shape[0], x.shape[1], context.shape[1]
        q, k, v = q.reshape(B, h, L, d), k.reshape(B, h, S, d), v.reshape(B, h, S, d)
        out = core.scaled_dot_product_attention(q, k, v)
        heads = out.reshape(B, L, h * d)
    else:
        parts = [slice(i, None, h) if strided else slice(i * d, (i + 1) * d) for i in range(h)]
        heads = [core.scaled_dot_product_attention(q[..., p], k[..., p], v[..., p]) for p in parts]
        heads = torch.cat(heads, dim=-1)
    return mha.out_proj(heads) if out_proj else heads


def _multi_head_keys_and_values_from_x(mha, x, context=None):
    return _multi_head(mha, x, context, kv_from_x=True)


def _multi_head_strided_head_features(mha, x, context=None):
    return _multi_head(mha, x, context, strided=True)


def _multi_head_without_out_proj(mha, x, context=None):
    return _multi_head(mha, x, context, out_proj=False)


def _multi_head_reshaped_without_transpose(mha, x, context=None):
    return _multi_head(mha, x, context, no_transpose=True)


# attention-sqrt-dk: tests/course/test_exercises.py already rejects 1/sqrt(d_k), 1/(sq sk d_k), a negative s, a
# tensor and a formula wrong only for large d_k; these are the other slips of the algebra
def _scale_standard_deviation(d_k, sigma_q, sigma_k):
    return sigma_q * sigma_k * math.sqrt(d_k)  # the standard deviation of q.k, not its reciprocal


def _scale_with_variances(d_k, sigma_q, sigma_k):
    return 1.0 / (sigma_q**2 * sigma_k**2 * math.sqrt(d_k))  # divides by the variances


def _scale_sigmas_not_squared(d_k, sigma_q, sigma_k):
    return 1.0 / math.sqrt(d_k * sigma_q * sigma_k)  # Var[q_i k_i] taken as sigma_q sigma_k


def _scale_without_the_square_root(d_k, sigma_q, sigma_k):
    return 1.0 / (d_k * sigma_q**2 * sigma_k**2)  # 1 / Var[q.k]: s^2, not s


MISTAKES = [
    Mistake("attention-masked-softmax", "multiplies by the temperature", _softmax_times_temperature,
            ("temperature 0.5", "multiplied the scores by the temperature", "divide by the temperature")),
    Mistake("attention-masked-softmax", "no row maximum subtracted: exp overflows",
            _softmax_without_the_row_maximum,
            ("scores around 1000 (overflow test)", "NaN", "exp overflowed", "subtract the row maximum")),
    Mistake("attention-masked-softmax", "the whole tensor's maximum subtracted: a row near -1000 underflows",
            _softmax_minus_the_tensors_maximum,
            ("rows at very different scales (underflow test)", "row (0, 0, 1) of your weights sums to 0, not 1",
             "below the largest of the whole tensor", "one maximum for the whole tensor",
             "Subtract each row's own maximum")),
    Mistake("attention-masked-softmax", "each matrix's maximum subtracted", _softmax_minus_each_matrixs_maximum,
            ("rows at very different scales (underflow test)", "row (0, 0, 1)", "or a whole matrix",
             "Subtract each row's own maximum")),
    Mistake("attention-masked-softmax", "the whole tensor's maximum subtracted, dead rows zeroed after: 0 / 0",
            _softmax_minus_the_tensors_maximum_dead_rows_zeroed_after,
            ("rows at very different scales (underflow test)", "your weights contain NaN in row (0, 0, 1)",
             "exp underflows to 0 (0 / 0 is NaN)", "Subtract each row's own maximum")),
    Mistake("attention-masked-softmax", "NaN on a fully masked row", _softmax_nan_on_a_fully_masked_row,
            ("boolean mask, T = 2", "NaN", "no allowed key", "must give zeros")),
    Mistake("attention-masked-softmax", "masked with -1e9: a fully masked row is uniform",
            _softmax_masked_with_a_large_negative_number,
            ("boolean mask, T = 2", "row (0, 0, 2) has no allowed key", "sum to 1", "must give zeros")),
    Mistake("attention-masked-softmax", "scores /= temperature edits the input", _softmax_dividing_in_place,
            ("temperature 0.5", "changed its input scores in place", "not scores /= temperature")),
    Mistake("attention-masked-softmax", "softmax over the queries", _softmax_over_the_queries,
            ("no mask, T = 1", "sums to", "not 1", "normalize over the last dimension (the keys)")),
    Mistake("attention-masked-softmax", "mask applied after normalizing", _softmax_masked_after_normalizing,
            ("boolean mask, T = 2", "sums to", "not 1", "after masking")),
    Mistake("attention-multi-head", "keys and values from x, not context", _multi_head_keys_and_values_from_x,
            ("cross-attention, d_model=8, n_heads=1", "self-attention of x", "keys and values from context")),
    Mistake("attention-multi-head", "head i takes every h-th feature", _multi_head_strided_head_features,
            ("self-attention, d_model=12, n_heads=3", "n_heads=1 passed", "head_dim")),
    Mistake("attention-multi-head", "out_proj forgotten", _multi_head_without_out_proj,
            ("self-attention, d_model=8, n_heads=1", "before mha.out_proj", "apply out_proj")),
    Mistake("attention-multi-head", "reshaped to (B, h, T, head_dim) without a transpose",
            _multi_head_reshaped_without_transpose,
            ("self-attention, d_model=12, n_heads=3", "n_heads=1 passed", "transpose")),
    Mistake("attention-sqrt-dk", "returns the standard deviation of q.k", _scale_standard_deviation,
            ("for d_k=2, sigma_q=2.0, sigma_k=1.0", "it should be 1, which needs s = 0.353553",
             "the standard deviation of q.k", "its reciprocal")),
    Mistake("attention-sqrt-dk", "divides by the variances", _scale_with_variances,
            ("for d_k=2, sigma_q=2.0, sigma_k=1.0", "needs s = 0.353553", "sigma_q^2 sigma_k^2",
             "standard deviations")),
    Mistake("attention-sqrt-dk", "sigmas not squared in Var[q.k]", _scale_sigmas_not_squared,
            ("for d_k=2, sigma_q=2.0, sigma_k=1.0", "needs s = 0.353553",
             "Var[q_i k_i] = sigma_q^2 sigma_k^2")),
    Mistake("attention-sqrt-dk", "no square root: returns 1 / Var[q.k]", _scale_without_the_square_root,
            ("for d_k=2, sigma_q=2.0, sigma_k=1.0", "needs s = 0.353553", "1 / Var[q.k]", "square root")),
]

test_wrong_answers = mistake_test(MISTAKES)
