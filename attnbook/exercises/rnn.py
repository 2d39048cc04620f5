"""Checks for the exercises of the chapter on attention in recurrent models."""

from __future__ import annotations

import torch

from . import register
from .common import assert_close, assert_int, generator, real_number


@register(
    "rnn-luong-general",
    hint="scores e_s = h_t^T W_a h_s for every s: (query @ W)[:, None, :] times keys, "
    "summed over the last "
    "dimension (or a batched matmul); then a softmax over s with masked positions set "
    "to -inf before it.",
)
def _check_luong_general(student) -> None:
    """``student(query (B, Dq), keys (B, S, Dk), W (Dq, Dk), mask (B, S) or None)`` ->
    weights ``(B, S)``."""
    from ..rnn import LuongAttention

    gen = generator(801)
    for B, S, dq, dk in [(1, 2, 1, 1), (3, 5, 4, 6), (2, 7, 8, 8)]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(S)
            attn = LuongAttention(dq, dk, method="general")
        q, k = torch.randn(B, dq, generator=gen), torch.randn(B, S, dk, generator=gen)
        mask = torch.ones(B, S, dtype=torch.bool)
        mask[0, S // 2 + 1 :] = False  # the first sentence is shorter
        with torch.no_grad():
            for m, what in [(None, "no mask"), (mask, "with a padding mask")]:
                padding = None if m is None else ~m  # the module takes True = padding
                assert_close(
                    student(q, k, attn.W_a.detach(), m),
                    attn(q, k, key_padding_mask=padding)[1],
                    f"B={B}, S={S}, {what}",
                )


@register(
    "rnn-coverage-loss",
    hint="the coverage before step t is the sum of the weights of steps 0..t-1 (zero "
    "at t = 0: an exclusive "
    "cumulative sum over T); the loss of step t is sum_s min(a_ts, c_ts); add the "
    "steps up.",
)
def _check_coverage_loss(student) -> None:
    """``student(weights (B, T, S))`` -> total coverage loss per example ``(B,)``."""
    from ..rnn import accumulated_coverage, coverage_loss

    gen = generator(802)
    # re-reads position 0 once: loss 1
    one_hot = torch.eye(3)[[0, 0, 1, 2]].unsqueeze(0)
    cases = [("hand example (position 0 read twice)", one_hot)]
    for B, T, S in [(2, 1, 4), (3, 5, 4), (1, 6, 9)]:
        cases.append(
            (
                f"random weights B={B}, T={T}, S={S}",
                torch.softmax(torch.randn(B, T, S, generator=gen) * 2, -1),
            )
        )
    for what, w in cases:
        expected = coverage_loss(w, accumulated_coverage(w)).sum(-1)
        assert_close(student(w), expected, what)


@register(
    "rnn-local-p",
    hint="keep positions s with |s - p| <= D that are not masked; softmax the scores "
    "over those only; "
    "multiply by exp(-(s - p)^2 / (2 sigma^2)) with sigma = D / 2; everything else is "
    "exactly 0.",
)
def _check_local_p(student) -> None:
    """``student(scores (B, S), p (B,), mask (B, S), window D)`` -> local-p weights
    ``(B, S)``."""
    from ..rnn import LocalAttention

    gen = generator(803)
    for B, S, D in [(1, 3, 1), (3, 9, 2), (2, 12, 3)]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(S)
            attn = LocalAttention(4, 5, window=D, mode="local-p")
        q, k = torch.randn(B, 4, generator=gen) * 3, torch.randn(B, S, 5, generator=gen)
        mask = torch.ones(B, S, dtype=torch.bool)
        mask[-1, max(1, S - 2) :] = False
        with torch.no_grad():
            p = attn.centre(q, mask.sum(-1))
            expected = attn(q, k, key_padding_mask=~mask)[1]
            actual = student(attn.score.scores(q, k), p, mask, D)
        assert not torch.isnan(torch.as_tensor(actual)).any(), (
            f"B={B}, S={S}, D={D}: your weights contain NaN."
        )
        assert_close(actual, expected, f"B={B}, S={S}, D={D}")


def _recurrent_decoder_macs(d: int, n: int, m: int, window: int) -> tuple[int, int]:
    """(recurrence, attention) multiply-adds from the tested FLOP counters: vanilla RNN
    encoder over ``n`` steps and decoder over ``m``, plus, at each of the ``m`` output
    steps, the scores and weighted sum of one query over ``window`` annotations."""
    from ..complexity import attention_flops, rnn_flops

    recurrence = rnn_flops(n, d)["total"] + rnn_flops(m, d)["total"]
    # one decoder query against the annotations
    step = attention_flops(1, d, kv_len=window)
    # the same cost at each of the m output steps
    attention = m * (step["scores"] + step["weighted_sum"])
    return recurrence // 2, attention // 2  # 2 FLOPs per multiply-add


@register(
    "rnn-attention-cost",
    hint="the recurrences cost (n + m) * 2 d^2 multiply-adds, the attention m steps "
    "of 2 d multiply-adds per "
    "annotation it reads (n of them, or min(2 D + 1, n) with local attention); set n "
    "= m and solve for part 1.",
)
def _check_attention_cost(student) -> None:
    """``(equal_cost_length(d), recurrence_over_attention(d, n, m, D=None))`` against a
    search over ``n`` and a count with :func:`attnbook.complexity.rnn_flops` and
    :func:`attnbook.complexity.attention_flops`."""
    assert isinstance(student, (tuple, list)) and len(student) == 2, (
        "pass the pair (equal_cost_length, recurrence_over_attention), got "
        f"{type(student).__name__}."
    )
    equal_cost_length, recurrence_over_attention = student
    for d in (1, 2, 3, 64, 512):
        equal = [
            n
            for n in range(1, 4 * d + 2)
            if len(set(_recurrent_decoder_macs(d, n, n, n))) == 1
        ]
        got = equal_cost_length(d)
        assert_int(got, f"equal_cost_length({d})")
        if got != equal[0]:
            costs = (
                ""
                if got < 1
                else ", where the recurrences cost {} and the attention {} "
                "multiply-adds".format(*_recurrent_decoder_macs(d, got, got, got))
            )
            raise AssertionError(
                f"equal_cost_length({d}) returns {got}{costs}; they are equal at n = "
                f"m = {equal[0]}."
            )
    cases = [
        (512, 5000, 200, None),
        (512, 5000, 200, 10),
        (1, 1, 1, None),
        (64, 128, 128, None),
        (16, 5, 7, 10),
        (32, 100, 50, 0),
        (1000, 30, 30, None),
    ]
    for d, n, m, D in cases:
        rec, att = _recurrent_decoder_macs(
            d, n, m, n if D is None else min(2 * D + 1, n)
        )
        what = (
            f"recurrence_over_attention(d={d}, n={n}, m={m}"
            + ("" if D is None else f", D={D}")
            + ")"
        )
        got = (
            recurrence_over_attention(d, n, m)
            if D is None
            else recurrence_over_attention(d, n, m, D=D)
        )
        got = real_number(got, what)
        assert abs(got - rec / att) <= 1e-9 * (rec / att), (
            f"{what} returns {got!r}; the recurrences cost {rec} multiply-adds and "
            f"the attention {att}: "
            f"a ratio of {rec / att:.6g}."
        )
