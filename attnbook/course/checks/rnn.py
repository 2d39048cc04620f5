"""Checks for the exercises of the chapter on attention in recurrent models."""

from __future__ import annotations

import torch

from ...complexity import attention_flops, rnn_flops
from ...core import masked_softmax
from ...rnn import LocalAttention, LuongAttention, accumulated_coverage, coverage_loss
from . import register
from .common import (
    call_student,
    assert_close,
    assert_int,
    generator,
    is_number,
    real_number,
)
from .library import allowed, forbid


def _first(where: torch.Tensor) -> int:
    return int(where.nonzero()[0, 0])


def _check_weights(actual, expected, what: str, real=None, slips=()) -> None:
    """Name the first row of ``actual`` (B, S) that breaks a property of masked
    attention weights (no NaN; rows sum to 1 where ``expected``'s do; no weight on
    padding, where ``real`` is False), then compare, adding the note of the first slip
    (a function giving a wrong answer's weights, and a note) that ``actual`` equals."""
    actual = torch.as_tensor(actual)
    assert actual.shape == expected.shape, (
        f"{what}: expected shape {tuple(expected.shape)}, got {tuple(actual.shape)}."
    )
    masked = real is not None
    real = torch.ones_like(expected, dtype=torch.bool) if real is None else real
    nan = torch.isnan(actual).any(-1)
    if nan.any():
        row = _first(nan)
        inverted = (
            " That row has no padding at all: did you mask the real tokens? The mask "
            "is True for real tokens, so fill the scores where ~mask."
            if masked and real[row].all()
            else ""
        )
        raise AssertionError(
            f"{what}: your weights contain NaN in row {row}.{inverted}"
        )
    sums = actual.double().sum(-1)
    off = (sums - 1).abs() > 1e-4
    normalized = bool(((expected.double().sum(-1) - 1).abs() < 1e-4).all())
    if normalized and off.any():
        row = _first(off)
        raise AssertionError(
            f"{what}: row {row} of your weights sums to {sums[row].item():.4g}, not 1: "
            "take the softmax over the keys (dim=-1)"
            + (
                ", after masking the scores, not by zeroing weights after it."
                if masked
                else "."
            )
        )
    leak = (actual != 0) & ~real
    if leak.any():
        row, col = leak.nonzero()[0].tolist()
        raise AssertionError(
            f"{what}: your weights give {actual[row, col].item():.3g} to padding "
            f"position {col} of row {row}: fill the masked scores with -inf (not 0) "
            "before the softmax."
        )
    try:
        assert_close(actual, expected, what)
    except AssertionError as err:
        note = next(
            (
                " " + note
                for wrong, note in slips
                if torch.allclose(actual.double(), wrong().double(), atol=1e-5)
            ),
            "",
        )
        raise AssertionError(f"{err}{note}") from None


def _luong_slips(q, k, W, m) -> list:
    def weights(scores):
        if m is not None:
            scores = scores.masked_fill(~m, float("-inf"))
        return torch.softmax(scores, -1)

    slips = []
    if W.shape[0] == W.shape[1]:
        slips += [
            (
                lambda: weights(((q @ W.T).unsqueeze(1) * k).sum(-1)),
                "Your scores use W^T: e_s = h_t^T W h_s = (query @ W) . keys_s.",
            ),
            (
                lambda: weights((q.unsqueeze(1) * k).sum(-1)),
                "Your scores ignore W (that is the dot score): e_s = (query @ W) . "
                "keys_s.",
            ),
        ]
    return slips + [
        (
            lambda: weights(((q @ W).unsqueeze(1) * k).sum(-1) / q.shape[-1] ** 0.5),
            "Your scores are divided by sqrt(d): Luong's general score has no scale.",
        )
    ]


@register(
    "rnn-luong-general",
    library=forbid(
        "attnbook.rnn.LuongAttention",
        "attnbook.core.general_score",
        why="The exercise asks you to write Luong's general score and its weights, "
            "which general_score and LuongAttention compute; masked_softmax stays "
            "allowed.",
    ),
    hint="scores e_s = h_t^T W_a h_s for every s: (query @ W)[:, None, :] times keys, "
    "summed over the last "
    "dimension (or a batched matmul); then a softmax over s with masked positions set "
    "to -inf before it.",
)
def _check_luong_general(student) -> None:
    """``student(query (B, Dq), keys (B, S, Dk), W (Dq, Dk), mask (B, S) or None)`` ->
    weights ``(B, S)``."""

    gen = generator(801)
    for B, S, dq, dk in [(1, 2, 1, 1), (3, 5, 4, 6), (2, 7, 8, 8)]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(S)
            attn = LuongAttention(dq, dk, method="general")
        q, k = torch.randn(B, dq, generator=gen), torch.randn(B, S, dk, generator=gen)
        mask = torch.ones(B, S, dtype=torch.bool)
        mask[0, S // 2 + 1 :] = False  # the first sentence is shorter
        W = attn.W_a.detach()
        with torch.no_grad():
            for m, how in [(None, "no mask"), (mask, "with a padding mask")]:
                what = f"B={B}, S={S}, Dq={dq}, Dk={dk}, {how}"
                padding = None if m is None else ~m  # the module takes True = padding
                got = call_student(
                    student,
                    what,
                    q,
                    k,
                    W,
                    None if m is None else m.clone(),
                    note=f" W has shape (Dq, Dk) = ({dq}, {dk}): query @ W has the "
                    "keys' width Dk.",
                )
                _check_weights(
                    got,
                    attn(q, k, key_padding_mask=padding)[1],
                    what,
                    m,
                    _luong_slips(q, k, W, m),
                )


def _coverage_slips(w) -> list:
    before = w.cumsum(1) - w
    return [
        (
            lambda: torch.minimum(w, w.cumsum(1)).sum((1, 2)),
            "Your coverage includes the current step: min(a_t, c_t) is then a_t, and "
            "every step's loss is 1. c_t sums the steps before t only "
            "(weights.cumsum(dim=1) - weights).",
        ),
        (
            lambda: torch.minimum(w, w.cumsum(2) - w).sum((1, 2)),
            "You accumulated over the source positions: the coverage sums the weights "
            "of the earlier decoder steps, over dim 1 (T).",
        ),
        (
            lambda: torch.maximum(w, before).sum((1, 2)),
            "The loss takes the minimum of a_tj and c_tj, not the maximum.",
        ),
        (
            lambda: torch.minimum(w, before).mean((1, 2)),
            "Sum over the steps and positions, do not average.",
        ),
        (
            lambda: torch.minimum(w, before).sum(2).mean(1),
            "Sum the steps' losses, do not average them.",
        ),
    ]


@register(
    "rnn-coverage-loss",
    library=forbid(
        "attnbook.rnn.coverage_loss",
        "attnbook.rnn.accumulated_coverage",
        why="The exercise asks you to write the coverage and its loss, which "
            "accumulated_coverage and coverage_loss compute.",
    ),
    hint="the coverage before step t is the sum of the weights of steps 0..t-1 (zero "
    "at t = 0: an exclusive "
    "cumulative sum over T); the loss of step t is sum_s min(a_ts, c_ts); add the "
    "steps up.",
)
def _check_coverage_loss(student) -> None:
    """``student(weights (B, T, S))`` -> total coverage loss per example ``(B,)``."""

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
        got = torch.as_tensor(student(w.clone()))
        B, T, S = w.shape
        shapes = {
            (B, T): "You return one loss per step: sum over the steps t as well.",
            (B, S): "You return one loss per position: sum over the positions j as "
            "well.",
            (): "You summed over the batch too: return one loss per example.",
        }
        note = shapes.get(tuple(got.shape), "") if got.shape != expected.shape else ""
        try:
            assert_close(got, expected, what)
        except AssertionError as err:
            if not note:
                note = next(
                    (
                        note
                        for wrong, note in _coverage_slips(w)
                        if torch.allclose(got.double(), wrong().double(), atol=1e-5)
                    ),
                    "",
                )
            should = f"The loss per example should be {expected.tolist()}."
            raise AssertionError(f"{err} {should} {note}".strip()) from None


def _local_p(scores, p, mask, D, sigma=None, strict=False, gauss=True, window=True):
    """Local-p weights from the formula, or one slip: another sigma, a strict window,
    no Gaussian, or the softmax over all real positions (then cut to the window)."""

    s = torch.arange(scores.shape[-1], dtype=scores.dtype)[None, :]
    dist = (s - p[:, None]).abs()
    inside = dist < D if strict else dist <= D
    align = masked_softmax(scores, mask & inside if window else mask) * inside
    sigma = D / 2 if sigma is None else sigma
    return align * torch.exp(-(dist**2) / (2 * sigma**2)) if gauss else align


def _local_p_slips(scores, p, mask, D) -> list:
    return [
        (
            lambda: _local_p(scores, p, mask, D, sigma=D),
            "Your Gaussian has sigma = D: it is D / 2.",
        ),
        (
            lambda: _local_p(scores, p, mask, D, gauss=False),
            "Multiply the window's softmax by the Gaussian exp(-(s - p)^2 / (2 "
            "sigma^2)), sigma = D / 2.",
        ),
        (
            lambda: _local_p(scores, p, mask, D, strict=True),
            "Off by one: the window is |s - p| <= D, both ends included.",
        ),
        (
            lambda: _local_p(scores, p, mask, D, window=False),
            "You took the softmax over all positions and then cut it to the window: "
            "mask the scores outside the window with -inf before the softmax, so that "
            "the window's weights sum to 1.",
        ),
        (
            lambda: _local_p(scores, p, torch.ones_like(mask), D) * mask,
            "Your softmax spreads weight over padding positions in the window: mask "
            "them before the softmax too.",
        ),
    ]


@register(
    "rnn-local-p",
    library=forbid(
        "attnbook.rnn.LocalAttention",
        why="The exercise asks you to write local-p's window and Gaussian, which "
            "LocalAttention applies; masked_softmax stays allowed.",
    ),
    hint="keep positions s with |s - p| <= D that are not masked; softmax the scores "
    "over those only; "
    "multiply by exp(-(s - p)^2 / (2 sigma^2)) with sigma = D / 2; everything else is "
    "exactly 0.",
)
def _check_local_p(student) -> None:
    """``student(scores (B, S), p (B,), mask (B, S), window D)`` -> local-p weights
    ``(B, S)``; a window with no real token gives zeros."""

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
            scores = attn.score.scores(q, k)
            actual = student(scores.clone(), p.clone(), mask.clone(), D)
        what = f"B={B}, S={S}, D={D}, p={[round(x, 3) for x in p.tolist()]}"
        _check_weights(actual, expected, what, mask, _local_p_slips(scores, p, mask, D))
    # row 0's window, positions 5..9 around p = 7, holds only padding; row 1's window
    # around p = 3 ends on positions 1 and 5, exactly D away
    scores = torch.linspace(-1.0, 1.0, 16).view(2, 8)
    p, D = torch.tensor([7.0, 3.0]), 2
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[0, 3:] = False
    expected = _local_p(scores, p, mask, D)
    actual = torch.as_tensor(student(scores.clone(), p.clone(), mask.clone(), D))
    assert not torch.isnan(actual[0]).any(), (
        "a window with no real token (row 0: real tokens 0..2, p = 7, D = 2) must give "
        "zeros, not NaN: the softmax over no position is 0 / 0; replace the NaN by 0 "
        "(torch.nan_to_num) or guard the row."
    )
    _check_weights(
        actual,
        expected,
        "p = [7, 3], D = 2 (row 0: a window with no real token; row 1: a window "
        "from 1 to 5)",
        mask,
        _local_p_slips(scores, p, mask, D),
    )


def _recurrent_decoder_macs(d: int, n: int, m: int, window: int) -> tuple[int, int]:
    """(recurrence, attention) multiply-adds from the tested FLOP counters: vanilla RNN
    encoder over ``n`` steps and decoder over ``m``, plus, at each of the ``m`` output
    steps, the scores and weighted sum of one query over ``window`` annotations."""

    recurrence = rnn_flops(n, d)["total"] + rnn_flops(m, d)["total"]
    # one decoder query against the annotations
    step = attention_flops(1, d, kv_len=window)
    # the same cost at each of the m output steps
    attention = m * (step["scores"] + step["weighted_sum"])
    return recurrence // 2, attention // 2  # 2 FLOPs per multiply-add


def _ratio(d, n, m, D=None, window=None, encoder_only=False, products=2, floor=False):
    """Recurrence over attention multiply-adds, right or with one slip: the window as a
    function of D, the decoder's recurrence left out, one attention product, //."""
    reads = n if D is None else (min(2 * D + 1, n) if window is None else window(D))
    recurrence = (n if encoder_only else n + m) * 2 * d * d
    attention = products * reads * m * d
    if attention == 0:
        return None
    return recurrence // attention if floor else recurrence / attention


# equal_cost_length's slips: d -> the answer, and a note
_EQUAL_SLIPS = [
    (
        lambda d: d,
        "n = d balances 2 n^2 d against 2 n d^2: count both recurrences, the encoder's "
        "n steps and the decoder's m = n, (n + n) 2 d^2.",
    ),
    (
        lambda d: 4 * d,
        "n = 4 d balances n^2 d: the attention costs 2 d multiply-adds per annotation "
        "(d for the score, d for the weighted sum), 2 n m d in all.",
    ),
]

# recurrence_over_attention's slips: (d, n, m, D) -> the answer, and a note
_RATIO_SLIPS = [
    (
        lambda d, n, m, D: 1 / _ratio(d, n, m, D),
        "That is the attention over the recurrences: return recurrences / attention.",
    ),
    (
        lambda d, n, m, D: _ratio(d, n, m, D, window=lambda D: 2 * D + 1),
        "Local attention reads min(2 D + 1, n) annotations: never more than the n "
        "there are.",
    ),
    (
        lambda d, n, m, D: _ratio(d, n, m, D, window=lambda D: min(2 * D, n)),
        "A window of half-width D reads 2 D + 1 annotations (D on each side and the "
        "centre).",
    ),
    (
        lambda d, n, m, D: _ratio(d, n, m, D, window=lambda D: min(D, n)),
        "A window of half-width D reads 2 D + 1 annotations (D on each side and the "
        "centre), not D.",
    ),
    (
        lambda d, n, m, D: _ratio(d, n, m, D, encoder_only=True),
        "Count both recurrences: the encoder's n steps and the decoder's m, (n + m) 2 "
        "d^2.",
    ),
    (
        lambda d, n, m, D: _ratio(d, n, m, D, products=1),
        "The attention costs 2 d multiply-adds per annotation: d for the score and d "
        "for the weighted sum.",
    ),
    (
        lambda d, n, m, D: _ratio(d, n, m, D, floor=True),
        "You return a rounded ratio: divide with /, not //.",
    ),
]


def _slip_of(results, slips, cases) -> str:
    """The note of the first slip equal to the answer's ``results`` (None where it
    crashed) on every case where both are defined, or ''."""
    for slip, note in slips:
        try:
            wrong = [slip(*case) for case in cases]
        except Exception:
            continue
        pairs = [(r, w) for r, w in zip(results, wrong) if None not in (r, w)]
        if pairs and all(
            is_number(r) and abs(r - w) <= 1e-9 * abs(w) + 1e-12 for r, w in pairs
        ):
            return " " + note
    return ""


def _results(call, cases) -> list:
    """``call(case)`` for every case, None where the answer crashed."""
    results = []
    for case in cases:
        try:
            results.append(call(case))
        except Exception:
            results.append(None)
    return results


@register(
    "rnn-attention-cost",
    library=allowed(
        "Counts from the chapter's formula; rnn_flops and attention_flops count with "
        "other conventions and are fair building blocks.",
    ),
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
    widths = [(d,) for d in (1, 2, 3, 64, 512)]
    for (d,) in widths:
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
            results = _results(lambda case: equal_cost_length(*case), widths)
            slip = _slip_of(results, _EQUAL_SLIPS, widths)
            raise AssertionError(
                f"equal_cost_length({d}) returns {got}{costs}; they are equal at n = "
                f"m = {equal[0]}.{slip}"
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
        if abs(got - rec / att) > 1e-9 * (rec / att):
            results = _results(
                lambda case: (
                    recurrence_over_attention(*case[:3])
                    if case[3] is None
                    else recurrence_over_attention(*case[:3], D=case[3])
                ),
                cases,
            )
            slip = _slip_of(results, _RATIO_SLIPS, cases)
            raise AssertionError(
                f"{what} returns {got!r}; the recurrences cost {rec} multiply-adds and "
                f"the attention {att}: a ratio of {rec / att:.6g}.{slip}"
            )
