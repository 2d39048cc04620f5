"""Plausible wrong answers to the exercises of the chapter on attention's relatives: each fails its
check with a message that points at the mistake."""

import torch
from wrong_answers import Mistake, mistake_test


def _hopfield(beta_used=True, dim=-1, values="patterns"):
    def hopfield_step(query, patterns, beta):
        scores = query @ patterns.transpose(-2, -1)
        weights = torch.softmax((beta if beta_used else 1.0) * scores, dim=dim)
        return weights @ (patterns if values == "patterns" else patterns * 0 + query.mean(-2, keepdim=True))
    return hopfield_step


def _hopfield_unstable(query, patterns, beta):  # softmax by hand, no maximum subtracted
    e = torch.exp(beta * query @ patterns.transpose(-2, -1))
    return (e / e.sum(-1, keepdim=True)) @ patterns


def _ssm_step(in_place=False, output_before=False, no_broadcast=False):
    def ssm_step(x_t, h, a, b, c):
        if no_broadcast:  # b * x_t without the state axis: wrong shapes, or a crash
            h_new = a * h + b * x_t
        elif in_place:
            h.mul_(a).add_(b * x_t.unsqueeze(-1))
            h_new = h
        else:
            h_new = a * h + b * x_t.unsqueeze(-1)
        y = (c * (h if output_before else h_new)).sum(-1)
        return y, h_new
    return ssm_step


def _ssm_matrix(upper=False, lag_offset=0, no_c=False):
    def ssm_matrix(a, b, c, length):
        k = torch.arange(length, dtype=a.dtype)
        weights = b if no_c else c * b
        kernel = (weights.unsqueeze(-1) * a.unsqueeze(-1) ** (k + lag_offset)).sum(1)
        lag = torch.arange(length)[:, None] - torch.arange(length)[None, :]
        if upper:
            lag = -lag
        zero = torch.zeros((), dtype=a.dtype)
        return torch.where(lag >= 0, kernel[:, lag.clamp(min=0)], zero)
    return ssm_matrix


def _retention(transposed=False, exponent_plus_one=False, no_causal=False):
    def retention_mask(n, gamma):
        lag = torch.arange(n)[:, None] - torch.arange(n)[None, :]
        if transposed:
            lag = -lag
        power = lag.abs() + (1 if exponent_plus_one else 0)
        decay = gamma ** power.float()
        return decay if no_causal else torch.where(lag >= 0, decay, 0.0)
    return retention_mask


MISTAKES = [
    Mistake("connections-hopfield-step", "beta ignored", _hopfield(beta_used=False),
            ("three queries, beta = 0.1 (soft: an average): you left out beta", "scores = beta * query @ patterns^T")),
    Mistake("connections-hopfield-step", "softmax over the queries", _hopfield(dim=-2),
            ("one query, beta = 1: you normalized over the queries", "softmax over the patterns (last dim)")),
    Mistake("connections-hopfield-step", "softmax without the maximum (overflow)", _hopfield_unstable,
            ("beta = 50 (sharp, overflow test)", "NaN")),
    Mistake("connections-ssm-step", "the state updated in place", _ssm_step(in_place=True),
            ("changed the state h in place", "Return a new tensor")),
    Mistake("connections-ssm-step", "output read from the old state", _ssm_step(output_before=True),
            ("a = 0 (no memory: y_t = sum_n c b x_t)", "sums c * h_new over the last (state) dimension")),
    Mistake("connections-ssm-step", "input not broadcast over the state", _ssm_step(no_broadcast=True),
            ("x_t.unsqueeze(-1)",)),
    Mistake("connections-ssm-matrix", "upper-triangular (anti-causal)", _ssm_matrix(upper=True),
            ("must be lower-triangular (an SSM is causal)",)),
    Mistake("connections-ssm-matrix", "kernel starts at a^1 (off by one)", _ssm_matrix(lag_offset=1),
            ("the output of your matrix, D=1, N=1, L=4", "a[d, n]**k * b[d, n]")),
    Mistake("connections-ssm-matrix", "c left out of the kernel", _ssm_matrix(no_c=True),
            ("the output of your matrix", "sum_n c[d, n]")),
    Mistake("connections-linear-attention-ssm", "rows and columns swapped", _retention(transposed=True),
            ("n=2, gamma=0.5: M[t, s] for (t, s) = (0, 1) should be 0", "Rows are queries t, columns keys s")),
    Mistake("connections-linear-attention-ssm", "one decay too many (gamma ** (t - s + 1))",
            _retention(exponent_plus_one=True),
            ("n=1, gamma=0.9: M[t, s] for (t, s) = (0, 0) should be 1", "(none when s = t)")),
    Mistake("connections-linear-attention-ssm", "no causal mask", _retention(no_causal=True),
            ("should be 0", "what does output t see of keys s > t")),
]

test_wrong_answers = mistake_test(MISTAKES)
