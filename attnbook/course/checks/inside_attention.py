"""Checks for the exercises of the chapter that looks inside attention (debugging a
mask by its weights, the entropy of attention rows)."""

from __future__ import annotations

import torch

from ...core import attention_entropy, causal_mask, masked_softmax
from . import register
from .common import generator
from .library import allowed, forbid


def _weights(gen: torch.Generator, shape: tuple[int, ...], causal: bool):
    """Rows of attention weights: a softmax of random scores, causally masked or not."""
    scores = torch.randn(*shape, generator=gen) * 2
    mask = causal_mask(shape[-2], shape[-1]) if causal else None
    return masked_softmax(scores, mask)


def _future_mass(weights: torch.Tensor) -> torch.Tensor:
    n = weights.shape[-1]
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    return (weights * future).sum(-1).mean(dim=(0, 2))


@register(
    "inside-attention-future-mass",
    library=allowed(
        "A sum over a mask of later keys; no attnbook function returns it.",
    ),
    hint="keys after query i are j > i, the strict upper triangle "
    "(torch.ones(n, n, dtype=torch.bool).triu(1)); sum each row's weights there, then "
    "average over the batch (dim 0) and the queries (dim 2), keeping the heads.",
)
def _check_future_mass(student) -> None:
    """``student(weights (B, h, n, n))`` must return each head's weight on later keys,
    averaged over the batch and the queries, shape ``(h,)``."""

    gen = generator(211)
    cases = [
        ("weights without a mask, B=3, h=4, n=6", _weights(gen, (3, 4, 6, 6), False)),
        ("weights under a causal mask, B=2, h=3, n=5",
         _weights(gen, (2, 3, 5, 5), True)),
        ("one sequence, one head, n=9", _weights(gen, (1, 1, 9, 9), False)),
        ("n=1: a single query and key", _weights(gen, (2, 2, 1, 1), False)),
    ]
    for what, weights in cases:
        given = weights.clone()
        actual = student(given)
        assert isinstance(actual, torch.Tensor), (
            f"{what}: return a torch.Tensor, got {type(actual).__name__}."
        )
        assert given.equal(weights), (
            f"{what}: your function changed the weights in place."
        )
        expected = _future_mass(weights)
        assert actual.shape == expected.shape, (
            f"{what}: expected shape {tuple(expected.shape)} (one number per head), "
            f"got {tuple(actual.shape)}."
        )
        if torch.allclose(actual.double(), expected.double(), atol=1e-5):
            continue
        n = weights.shape[-1]
        slips = [
            ((weights * torch.ones(n, n).triu(0)).sum(-1).mean(dim=(0, 2)),
             "you counted the diagonal (j >= i): a query's own key is not in its "
             "future"),
            ((weights * torch.ones(n, n).tril(-1)).sum(-1).mean(dim=(0, 2)),
             "you summed the keys before the query (j < i), not after it"),
            ((weights * torch.ones(n, n).triu(1)).sum(-1).sum(dim=(0, 2)),
             "you summed over the batch and the queries instead of averaging"),
        ]
        why = next((w for value, w in slips if value.shape == actual.shape
                    and torch.allclose(actual.double(), value.double(), atol=1e-5)), "")
        error = (actual.double() - expected.double()).abs().max().item()
        raise AssertionError(
            f"{what}: values differ from the mass on future keys (max abs error "
            f"{error:.3g}, expected {[round(x, 4) for x in expected.tolist()]})"
            + (f"; {why}." if why else ".")
        )


@register(
    "inside-attention-entropy",
    library=forbid(
        "attnbook",
        why="The exercise asks for the normalized entropy written without "
        "attention_entropy, which the check compares with.",
    ),
    hint="use 0 ln 0 = 0 (torch.where(w > 0, w * w.log(), 0) keeps NaN out), sum over "
    "the allowed keys only, and divide by ln of each row's number of allowed keys "
    "(mask.expand(weights.shape).sum(-1)), giving 0 where fewer than two are allowed.",
)
def _check_entropy(student) -> None:
    """``student(weights (..., S), mask)`` must equal
    :func:`attnbook.core.attention_entropy` with ``normalize=True``."""

    gen = generator(223)
    scores = torch.randn(2, 3, 6, 6, generator=gen) * 2
    causal = causal_mask(6, 6)  # row i sees i + 1 keys: different maxima per row
    padding = torch.rand(2, 1, 1, 6, generator=gen) > 0.4
    padding[0, 0, 0, :] = False
    padding[0, 0, 0, 2] = True  # a row with a single allowed key
    padding[1, 0, 0, :] = False  # a row with no allowed key
    sharp = torch.full((4, 5), -60.0)
    sharp[:, 0] = 60.0  # weights that underflow to exactly 0
    cases = [
        ("a causal mask, float32", masked_softmax(scores, causal), causal),
        ("a padding mask of shape (B, 1, 1, S)", masked_softmax(scores, padding),
         padding),
        ("a causal mask, float64", masked_softmax(scores.double(), causal), causal),
        ("one-hot rows with weights of exactly 0", masked_softmax(sharp),
         torch.ones(4, 5, dtype=torch.bool)),
    ]
    for what, weights, mask in cases:
        given_w, given_m = weights.clone(), mask.clone()
        actual = student(given_w, given_m)
        assert isinstance(actual, torch.Tensor), (
            f"{what}: return a torch.Tensor, got {type(actual).__name__}."
        )
        assert given_w.equal(weights) and given_m.equal(mask), (
            f"{what}: your function changed its inputs in place."
        )
        expected = attention_entropy(weights, mask, normalize=True)
        assert actual.shape == expected.shape, (
            f"{what}: expected shape {tuple(expected.shape)} (one number per row), "
            f"got {tuple(actual.shape)}."
        )
        assert not actual.isnan().any(), (
            f"{what}: NaN in your result, where a weight is 0 (0 ln 0 is 0, but "
            "0 * log(0) is NaN in floating point) or a row has no allowed key."
        )
        if torch.allclose(actual.double(), expected.double(), atol=1e-5, rtol=1e-4):
            continue
        raw = attention_entropy(weights, mask)
        n_all = torch.full_like(raw, weights.shape[-1]).log()
        slips = [
            (raw, "you did not divide by ln of the number of allowed keys"),
            (torch.where(raw > 0, raw / n_all, 0.0),
             "you divided by ln S for every row: divide by ln of the number of keys "
             "the row may see"),
            (raw / torch.log(torch.tensor(2.0)),
             "you computed the entropy in bits and did not normalize it"),
        ]
        why = next((w for value, w in slips if value.shape == actual.shape
                    and torch.allclose(actual.double(), value.double(), atol=1e-5)), "")
        error = (actual.double() - expected.double()).abs().max().item()
        raise AssertionError(
            f"{what}: values differ from the normalized entropy (max abs error "
            f"{error:.3g})" + (f"; {why}." if why else ".")
        )
