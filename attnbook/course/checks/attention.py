"""Checks for the exercises of the chapter on attention fundamentals."""

from __future__ import annotations

import itertools
import math

import torch

from ...core import MultiHeadAttention, masked_softmax
from . import register
from .common import assert_close, generator, is_number
from .library import allowed, forbid


@register(
    "attention-masked-softmax",
    library=forbid(
        "attnbook",
        why="The exercise asks for a masked softmax written without torch.softmax or "
            "attnbook.",
    ),
    hint="divide by the temperature, fill masked scores with -inf, subtract the row "
    "maximum before exp, "
    "and set rows with no allowed key to zero (their maximum is -inf).",
)
def _check_masked_softmax(student) -> None:
    """``student(scores, mask=None, temperature=1.0)`` must equal
    :func:`attnbook.core.masked_softmax`."""

    gen = generator(101)
    scores = torch.randn(2, 3, 5, 7, generator=gen) * 3
    mask = torch.rand(2, 1, 5, 7, generator=gen) > 0.3
    mask[0, 0, 2] = False  # a query with nothing to attend to
    spread = _rows_far_apart(scores, mask)
    cases = [
        ("no mask, T = 1", (scores,), {}, masked_softmax(scores)),
        (
            "temperature 0.5",
            (scores,),
            {"temperature": 0.5},
            masked_softmax(scores, temperature=0.5),
        ),
        (
            "boolean mask, T = 2",
            (scores, mask),
            {"temperature": 2.0},
            masked_softmax(scores, mask, 2.0),
        ),
        (
            "scores around 1000 (overflow test)",
            (scores + 1000.0, mask),
            {},
            masked_softmax(scores + 1000.0, mask),
        ),
        (
            "rows at very different scales (underflow test)",
            (spread, mask),
            {},
            masked_softmax(spread, mask),
        ),
    ]
    for what, args, kwargs, expected in cases:
        given = [a.clone() for a in args]
        actual = student(*given, **kwargs)
        assert isinstance(actual, torch.Tensor), (
            f"{what}: return a torch.Tensor, got {type(actual).__name__}."
        )
        changed = [
            n for n, a, b in zip(("scores", "mask"), args, given) if a.ne(b).any()
        ]
        assert not changed, (
            f"{what}: your function changed its input {changed[0]} in place: "
            "write scores = scores / temperature (a new tensor), not "
            "scores /= temperature or a masked_fill_."
        )
        assert actual.shape == expected.shape, (
            f"{what}: expected shape {tuple(expected.shape)}, "
            f"got {tuple(actual.shape)}."
        )
        _check_weights(what, actual, expected, *args, **kwargs)


def _rows_far_apart(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``scores`` with rows whose maxima lie far apart: the rows of query 0 spread over
    +-1000, those of query 1 sit near -1000, and those of query 3 peak 100 below the
    largest allowed score of the tensor. Softmax is shift invariant row by row, so only
    a maximum taken per row keeps every row's exp in float32's range: from one maximum
    of the whole tensor, exp underflows to 0 in query 1's rows (0 / 0) and to subnormal
    numbers, a few bits of precision, in query 3's."""
    spread = scores.clone()
    spread[..., 0, :] = scores[..., 0, :] / 3 * 1000
    spread[..., 1, :] = scores[..., 1, :] - 1000
    top = spread.masked_fill(~mask, float("-inf")).max()
    row = scores[..., 3, :]
    spread[..., 3, :] = row - row.amax(-1, keepdim=True) + top - 100
    return spread


def _first(where: torch.Tensor) -> tuple[int, ...]:
    return tuple(where.nonzero()[0].tolist())


def _check_weights(what, actual, expected, scores, mask=None, temperature=1.0) -> None:
    """Name the first row that breaks a property of the masked softmax (no NaN, rows sum
    to 1 or, with no allowed key, to 0, masked keys get no weight), then compare."""

    allowed = torch.ones_like(scores, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask
    dead = ~allowed.any(-1)  # rows with no allowed key
    far = _far_below_the_top(scores / temperature, allowed)
    nan_rows = torch.isnan(actual).any(-1)
    live_nan = nan_rows & ~dead
    if live_nan.any():
        row = _first(live_nan)
        top = (scores[row] / temperature).max().item()
        if top > 80.0:  # exp(88.7) is inf in float32
            note = (
                f", whose largest score is {top:.0f}: exp overflowed to inf, and inf "
                "/ inf is NaN; subtract the row maximum before exp (softmax is shift "
                "invariant)."
            )
        else:
            note = "." + far(row)
        raise AssertionError(f"{what}: your weights contain NaN in row {row}{note}")
    assert not nan_rows.any(), (
        f"{what}: your weights contain NaN in row {_first(nan_rows)}, which has no "
        "allowed key: such a row must give zeros, not NaN (its maximum is -inf, and "
        "-inf - (-inf) is NaN)."
    )
    sums = actual.double().sum(-1)
    bad = (sums - (~dead).double()).abs() > 1e-3
    if bad.any():
        row = _first(bad)
        assert not dead[row], (
            f"{what}: row {row} has no allowed key, but your weights there sum to "
            f"{sums[row].item():.4g}: a row with no allowed key must give zeros (a "
            "large negative number instead of -inf gives a uniform row)."
        )
        note = far(row)
        raise AssertionError(
            f"{what}: row {row} of your weights sums to {sums[row].item():.4g}, not 1"
            + (
                f".{note}"
                if note
                else ": normalize over the last dimension (the keys), after masking."
            )
        )
    leak = (actual.abs() > 1e-5) & ~allowed
    assert not leak.any(), (
        f"{what}: your weights give {actual[_first(leak)].item():.3g} to the masked "
        f"key at {_first(leak)}: fill masked scores with -inf before the exp."
    )
    if temperature != 1.0:
        for wrong, how in [
            (1.0 / temperature, "you multiplied the scores by the temperature"),
            (1.0, "you ignored the temperature"),
        ]:
            assert not torch.allclose(
                actual.double(), masked_softmax(scores, mask, wrong).double(), atol=1e-5
            ), f"{what}: {how}; divide the scores by it (T = {temperature})."
    try:
        assert_close(actual, expected, what)
    except AssertionError as err:
        close = torch.isclose(actual.double(), expected.double(), 1e-4, 1e-5)
        rows = ~close.all(-1)
        note = far(_first(rows)) if rows.any() else ""
        raise AssertionError(f"{err}{note}") from None


def _far_below_the_top(scaled: torch.Tensor, allowed: torch.Tensor):
    """A function of a row index that explains, for a row whose largest allowed score
    lies so far below the tensor's largest that exp of their difference is no longer a
    normal float, what subtracting one maximum for the whole tensor does there; ''
    for other rows."""
    live = scaled.masked_fill(~allowed, float("-inf"))
    row_top, top = live.amax(-1), live.max()
    # exp(x) leaves the normal floats below log(tiny): -87.3 in float32
    limit = -math.log(torch.finfo(scaled.dtype).tiny) - 8.0

    def note(row) -> str:
        gap = (top - row_top[row]).item()
        if not (math.isfinite(gap) and gap > limit):
            return ""
        return (
            f" The largest score of row {row} is {row_top[row].item():.0f}, "
            f"{gap:.0f} below the largest of the whole tensor ({top.item():.0f}): "
            "did you subtract one maximum for the whole tensor (or a whole matrix)? "
            f"Then this row's exponents lie near -{gap:.0f}, where exp underflows to 0 "
            "(0 / 0 is NaN) or keeps only a few bits. Subtract each row's own "
            "maximum, scores.amax(dim=-1, keepdim=True)."
        )

    return note


@register(
    "attention-multi-head",
    library=forbid(
        "attnbook.core.MultiHeadAttention",
        "attnbook.models.Attention",
        why="The exercise asks you to build multi-head attention from the layer's "
            "four projections and one call of "
            "attnbook.core.scaled_dot_product_attention per head, which stays "
            "allowed.",
        gaps="calling the layer the check hands over, `mha(x, context)` or "
             "`mha.forward(...)`: the answer names only its parameter",
    ),
    hint="project with mha.q_proj / k_proj / v_proj, reshape (B, T, d_model) -> (B, "
    "T, h, d_model // h) and "
    "transpose to (B, h, T, head_dim), attend per head, transpose back, reshape to "
    "(B, L, d_model), apply out_proj.",
)
def _check_multi_head(student) -> None:
    """``student(mha, x, context=None)`` must equal ``mha(x, context)`` for self- and
    cross-attention."""

    gen = generator(102)
    one_head_passed = False
    for d_model, n_heads, L, S in [(8, 1, 3, 3), (12, 3, 5, 5), (16, 4, 4, 6)]:
        # seed the layer's initial weights, leave the caller's RNG alone
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(d_model)
            mha = MultiHeadAttention(d_model, n_heads).eval()
        x = torch.randn(2, L, d_model, generator=gen)
        context = torch.randn(2, S, d_model, generator=gen)
        with torch.no_grad():
            heads = []  # what reaches out_proj: the concatenated heads
            hook = mha.out_proj.register_forward_hook(
                lambda module, inputs, output: heads.append(inputs[0])
            )
            try:
                self_attention, cross_attention = mha(x), mha(x, context)
            finally:
                hook.remove()
            cases = [
                (
                    f"cross-attention, d_model={d_model}, n_heads={n_heads}, L={L}, "
                    f"S={S}",
                    (x, context),
                    cross_attention,
                    heads[1],
                )
            ]
            if L == S:
                cases.insert(
                    0,
                    (
                        f"self-attention, d_model={d_model}, n_heads={n_heads}",
                        (x,),
                        self_attention,
                        heads[0],
                    ),
                )
            for what, args, expected, concatenated in cases:
                got = student(mha, *args)
                note = ""
                if _same(got, concatenated):
                    note = (
                        " Your output equals the concatenated heads before "
                        "mha.out_proj: apply out_proj to them."
                    )
                elif len(args) == 2 and _same(got, self_attention):
                    note = (
                        " Your output equals the self-attention of x: take the keys "
                        "and values from context."
                    )
                elif n_heads > 1 and one_head_passed:
                    note = (
                        " n_heads=1 passed, so look at how you split the features: "
                        "head i uses features i * head_dim : (i + 1) * head_dim of "
                        "each projection (a (B, T, h, head_dim) view, then a "
                        "transpose to (B, h, T, head_dim))."
                    )
                try:
                    assert_close(got, expected, what)
                except AssertionError as err:
                    raise AssertionError(f"{err}{note}") from None
        one_head_passed = one_head_passed or n_heads == 1


def _same(actual, expected) -> bool:
    """``actual`` is a tensor of ``expected``'s shape and values."""
    return (
        isinstance(actual, torch.Tensor)
        and actual.shape == expected.shape
        and torch.allclose(actual.double(), expected.double(), atol=1e-5, rtol=1e-4)
    )


@register(
    "attention-sqrt-dk",
    library=allowed(
        "A scale derived on paper; no attnbook function returns it.",
    ),
    hint="q . k is a sum of d_k independent products q_i k_i, each of mean 0 and "
    "variance sigma_q^2 sigma_k^2, "
    "and Var[s X] = s^2 Var[X]: solve s^2 Var[q . k] = 1 and return the positive root "
    "as a float.",
)
def _check_sqrt_dk(student) -> None:
    """``student(d_k, sigma_q, sigma_k)`` must give Var[s q.k] = 1: exactly for
    components +-sigma (every outcome enumerated), and within 4% in a Monte Carlo
    estimate for Gaussian ones."""

    gen = torch.Generator().manual_seed(1)
    exact = [(1, 1.0, 1.0), (2, 2.0, 1.0), (3, 0.5, 3.0), (5, 1.5, 0.2)]
    sampled = [(64, 1.0, 1.0), (128, 0.5, 3.0), (16, 2.0, 0.25)]
    for d_k, sq, sk in exact + sampled:
        what = f"for d_k={d_k}, sigma_q={sq}, sigma_k={sk}"
        s = student(d_k, sq, sk)
        assert is_number(s), f"{what} return a float, got {type(s).__name__} {s!r}."
        assert s > 0, f"{what} return the positive scale factor, got {s!r}."
        # components +-sigma with probability 1/2 each: 4^d_k equally likely outcomes
        if (d_k, sq, sk) in exact:
            signs = torch.tensor(
                list(itertools.product((-1.0, 1.0), repeat=2 * d_k)),
                dtype=torch.float64,
            )
            dots = (sq * signs[:, :d_k] * sk * signs[:, d_k:]).sum(-1)
            var = ((dots - dots.mean()) ** 2).mean().item()
            how, tol, needed = (
                f"exact, over all {4**d_k} outcomes",
                1e-9,
                f"= {var**-0.5:.6g}",
            )
        else:  # Gaussian components, 20,000 draws of (q, k)
            q, k = (
                sq * torch.randn(20_000, d_k, generator=gen),
                sk * torch.randn(20_000, d_k, generator=gen),
            )
            var = (q * k).sum(-1).double().var().item()
            how, tol, needed = "Monte Carlo, 20,000 draws", 0.04, f"~ {var**-0.5:.3g}"
        scaled = float(s) ** 2 * var
        assert abs(scaled - 1) < tol, (
            f"{what} your s = {s!r} gives Var[s q.k] = {scaled:.6g} ({how}); it "
            f"should be 1, which needs s {needed}.{_slip(float(s), d_k, sq, sk)}"
        )


def _slip(s: float, d_k: int, sq: float, sk: float) -> str:
    """What a wrong scale factor ``s`` most likely did, if it is a known slip."""

    sd = sq * sk * math.sqrt(d_k)  # the standard deviation of q.k
    slips = [
        (
            1 / math.sqrt(d_k),
            "ignores sigma_q and sigma_k: it is right only when sigma_q sigma_k = 1",
        ),
        (1 / (sq * sk * d_k), "divides by d_k, not sqrt(d_k): Var[s X] = s^2 Var[X]"),
        (
            sd,
            "is sigma_q sigma_k sqrt(d_k), the standard deviation of q.k: s is its "
            "reciprocal",
        ),
        (
            1 / (sq**2 * sk**2 * math.sqrt(d_k)),
            "divides by the variances sigma_q^2 sigma_k^2: Var[q.k] = d_k "
            "sigma_q^2 sigma_k^2, so s divides by the standard deviations "
            "sigma_q sigma_k",
        ),
        (
            1 / math.sqrt(d_k * sq * sk),
            "takes Var[q.k] = d_k sigma_q sigma_k, but "
            "Var[q_i k_i] = sigma_q^2 sigma_k^2",
        ),
        (1 / sd**2, "is 1 / Var[q.k]: s^2 Var[q.k] = 1 needs its square root"),
    ]
    for value, what in slips:
        if math.isclose(s, value, rel_tol=1e-9):
            return f" Your s {what}."
    return ""
