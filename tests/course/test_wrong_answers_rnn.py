"""Plausible wrong answers to the exercises of the chapter on attention in recurrent models: each fails
its check with a message that points at the mistake."""

import torch
from wrong_answers import Mistake, mistake_test


# rnn-luong-general: the book's solution with one thing changed
def _luong(query, keys, W, mask=None, *, transpose_w=False, fill=float("-inf"), invert=False, after=False,
           dim=-1):
    scores = ((query @ (W.T if transpose_w else W)).unsqueeze(1) * keys).sum(-1)
    if mask is not None and not after:
        scores = scores.masked_fill(mask if invert else ~mask, fill)
    weights = torch.softmax(scores, dim=dim)
    if mask is not None and after:  # padding zeroed after the softmax, rows not renormalized
        weights = weights.masked_fill(~mask, 0.0)
    return weights


def _luong_w_transposed(query, keys, W, mask=None):
    return _luong(query, keys, W, mask, transpose_w=True)


def _luong_real_tokens_masked(query, keys, W, mask=None):
    return _luong(query, keys, W, mask, invert=True)


def _luong_padding_zeroed_after_the_softmax(query, keys, W, mask=None):
    return _luong(query, keys, W, mask, after=True)


def _luong_masked_with_zero(query, keys, W, mask=None):
    return _luong(query, keys, W, mask, fill=0.0)


def _luong_softmax_over_the_batch(query, keys, W, mask=None):
    return _luong(query, keys, W, mask, dim=0)


# rnn-coverage-loss: the book's solution with one thing changed
def _coverage_including_the_current_step(weights):
    coverage = weights.cumsum(dim=1)  # c_t includes a_t: every step costs 1
    return torch.minimum(weights, coverage).sum(dim=(1, 2))


def _coverage_over_source_positions(weights):
    coverage = weights.cumsum(dim=2) - weights
    return torch.minimum(weights, coverage).sum(dim=(1, 2))


def _coverage_per_step(weights):
    coverage = weights.cumsum(dim=1) - weights
    return torch.minimum(weights, coverage).sum(dim=2)  # (B, T): the steps not added up


def _coverage_averaged_over_steps(weights):
    coverage = weights.cumsum(dim=1) - weights
    return torch.minimum(weights, coverage).sum(dim=2).mean(dim=1)


# rnn-local-p: the book's solution with one thing changed
def _local_p(scores, p, mask, D, *, sigma=None, gauss=True, strict=False, window_softmax=True, guard=True):
    s = torch.arange(scores.shape[-1], dtype=scores.dtype)[None, :]
    inside = (s - p[:, None]).abs() < D if strict else (s - p[:, None]).abs() <= D
    keep = mask & inside if window_softmax else mask
    align = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    if guard:
        align = torch.nan_to_num(align, nan=0.0)
    align = align * inside
    sigma = D / 2 if sigma is None else sigma
    return align * torch.exp(-((s - p[:, None]) ** 2) / (2 * sigma**2)) if gauss else align


def _local_p_sigma_d(scores, p, mask, D):
    return _local_p(scores, p, mask, D, sigma=D)


def _local_p_without_gaussian(scores, p, mask, D):
    return _local_p(scores, p, mask, D, gauss=False)


def _local_p_strict_window(scores, p, mask, D):
    return _local_p(scores, p, mask, D, strict=True)


def _local_p_softmax_over_all_positions(scores, p, mask, D):
    return _local_p(scores, p, mask, D, window_softmax=False)


def _local_p_nan_for_an_empty_window(scores, p, mask, D):
    return _local_p(scores, p, mask, D, guard=False)


# rnn-attention-cost: tests/course/test_exercises.py already rejects n = d, a float, the inverted ratio, an
# unclamped window and a single function; these are the other slips of the count
def _equal_cost_length(d):
    return 2 * d


def _ratio(d, n, m, D=None):
    window = n if D is None else min(2 * D + 1, n)
    return (n + m) * 2 * d * d / (2 * window * m * d)


def _ratio_window_2d(d, n, m, D=None):
    window = n if D is None else min(2 * D, n)  # the centre forgotten
    return (n + m) * 2 * d * d / (2 * window * m * d)


def _ratio_encoder_only(d, n, m, D=None):
    window = n if D is None else min(2 * D + 1, n)
    return n * 2 * d * d / (2 * window * m * d)  # the decoder's recurrence left out


def _ratio_integer_division(d, n, m, D=None):
    window = n if D is None else min(2 * D + 1, n)
    return (n + m) * 2 * d * d // (2 * window * m * d)


def _equal_cost_length_scores_only(d):
    return 4 * d  # attention counted as n m d: the weighted sum forgotten


MISTAKES = [
    Mistake("rnn-luong-general", "query @ W^T", _luong_w_transposed,
            ("B=3, S=5, Dq=4, Dk=6, no mask: your code raised RuntimeError", "W has shape (Dq, Dk) = (4, 6)",
             "(query @ W)")),
    Mistake("rnn-luong-general", "the real tokens masked", _luong_real_tokens_masked,
            ("B=1, S=2, Dq=1, Dk=1, with a padding mask", "NaN in row 0", "did you mask the real tokens",
             "fill the scores where ~mask")),
    Mistake("rnn-luong-general", "padding zeroed after the softmax", _luong_padding_zeroed_after_the_softmax,
            ("B=3, S=5, Dq=4, Dk=6, with a padding mask", "row 0 of your weights sums to", "not 1",
             "after masking the scores")),
    Mistake("rnn-luong-general", "padding scores set to 0, not -inf", _luong_masked_with_zero,
            ("B=3, S=5, Dq=4, Dk=6, with a padding mask", "to padding position 3 of row 0", "-inf (not 0)")),
    Mistake("rnn-luong-general", "softmax over the batch", _luong_softmax_over_the_batch,
            ("B=1, S=2, Dq=1, Dk=1, no mask", "row 0 of your weights sums to 2", "over the keys (dim=-1)")),
    Mistake("rnn-coverage-loss", "coverage includes the current step", _coverage_including_the_current_step,
            ("hand example (position 0 read twice)", "The loss per example should be [1.0]",
             "includes the current step",
             "weights.cumsum(dim=1) - weights")),
    Mistake("rnn-coverage-loss", "accumulated over the source positions", _coverage_over_source_positions,
            ("hand example (position 0 read twice)", "accumulated over the source positions", "dim 1 (T)")),
    Mistake("rnn-coverage-loss", "one loss per step", _coverage_per_step,
            ("hand example (position 0 read twice): expected shape (1,), got (1, 4)", "one loss per step",
             "sum over the steps t as well")),
    Mistake("rnn-coverage-loss", "steps averaged", _coverage_averaged_over_steps,
            ("hand example (position 0 read twice)", "The loss per example should be [1.0]",
             "do not average them")),
    Mistake("rnn-local-p", "sigma = D", _local_p_sigma_d,
            ("B=1, S=3, D=1, p=[", "sigma = D: it is D / 2")),
    Mistake("rnn-local-p", "Gaussian left out", _local_p_without_gaussian,
            ("B=1, S=3, D=1", "Multiply the window's softmax by the Gaussian")),
    Mistake("rnn-local-p", "strict window |s - p| < D", _local_p_strict_window,
            ("p = [7, 3], D = 2", "window from 1 to 5",
             "Off by one: the window is |s - p| <= D, both ends included")),
    Mistake("rnn-local-p", "softmax over all positions, then cut to the window",
            _local_p_softmax_over_all_positions,
            ("B=3, S=9, D=2", "softmax over all positions and then cut it to the window",
             "before the softmax")),
    Mistake("rnn-local-p", "NaN for a window with no real token", _local_p_nan_for_an_empty_window,
            ("a window with no real token (row 0: real tokens 0..2, p = 7, D = 2)", "zeros, not NaN",
             "torch.nan_to_num")),
    Mistake("rnn-attention-cost", "window of 2 D annotations", (_equal_cost_length, _ratio_window_2d),
            ("recurrence_over_attention(d=512, n=5000, m=200, D=10) returns", "a ratio of 633.905",
             "2 D + 1 annotations (D on each side and the centre)")),
    Mistake("rnn-attention-cost", "the decoder's recurrence left out",
            (_equal_cost_length, _ratio_encoder_only),
            ("recurrence_over_attention(d=512, n=5000, m=200) returns 2.56", "a ratio of 2.6624",
             "Count both recurrences")),
    Mistake("rnn-attention-cost", "ratio with //", (_equal_cost_length, _ratio_integer_division),
            ("recurrence_over_attention(d=512, n=5000, m=200) returns 2.0;", "a ratio of 2.6624",
             "divide with /, not //")),
    Mistake("rnn-attention-cost", "equal length with the attention's weighted sum forgotten",
            (_equal_cost_length_scores_only, _ratio),
            ("equal_cost_length(1) returns 4", "they are equal at n = m = 2", "d for the weighted sum")),
]

test_wrong_answers = mistake_test(MISTAKES)
