"""Checks for the exercises of the chapter on attention fundamentals."""

from __future__ import annotations

import torch

from . import register
from .common import assert_close, generator, is_number


@register(
    "attention-masked-softmax",
    hint="divide by the temperature, fill masked scores with -inf, subtract the row "
    "maximum before exp, "
    "and set rows with no allowed key to zero (their maximum is -inf).",
)
def _check_masked_softmax(student) -> None:
    """``student(scores, mask=None, temperature=1.0)`` must equal
    :func:`attnbook.core.masked_softmax`."""
    from ..core import masked_softmax

    gen = generator(101)
    scores = torch.randn(2, 3, 5, 7, generator=gen) * 3
    mask = torch.rand(2, 1, 5, 7, generator=gen) > 0.3
    mask[0, 0, 2] = False  # a query with nothing to attend to
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
    ]
    for what, args, kwargs, expected in cases:
        actual = student(*args, **kwargs)
        assert isinstance(actual, torch.Tensor), (
            f"{what}: return a torch.Tensor, got {type(actual).__name__}."
        )
        assert not torch.isnan(actual).any(), f"{what}: your weights contain NaN."
        assert_close(actual, expected, what)


@register(
    "attention-multi-head",
    hint="project with mha.q_proj / k_proj / v_proj, reshape (B, T, d_model) -> (B, "
    "T, h, d_model // h) and "
    "transpose to (B, h, T, head_dim), attend per head, transpose back, reshape to "
    "(B, L, d_model), apply out_proj.",
)
def _check_multi_head(student) -> None:
    """``student(mha, x, context=None)`` must equal ``mha(x, context)`` for self- and
    cross-attention."""
    from ..core import MultiHeadAttention

    gen = generator(102)
    for d_model, n_heads, L, S in [(8, 1, 3, 3), (12, 3, 5, 5), (16, 4, 4, 6)]:
        # seed the layer's initial weights, leave the caller's RNG alone
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(d_model)
            mha = MultiHeadAttention(d_model, n_heads).eval()
        x = torch.randn(2, L, d_model, generator=gen)
        context = torch.randn(2, S, d_model, generator=gen)
        with torch.no_grad():
            if L == S:
                assert_close(
                    student(mha, x),
                    mha(x),
                    f"self-attention, d_model={d_model}, n_heads={n_heads}",
                )
            assert_close(
                student(mha, x, context),
                mha(x, context),
                f"cross-attention, d_model={d_model}, n_heads={n_heads}, L={L}, S={S}",
            )


@register(
    "attention-sqrt-dk",
    hint="q . k is a sum of d_k independent products q_i k_i, each of mean 0 and "
    "variance sigma_q^2 sigma_k^2, "
    "and Var[s X] = s^2 Var[X]: solve s^2 Var[q . k] = 1 and return the positive root "
    "as a float.",
)
def _check_sqrt_dk(student) -> None:
    """``student(d_k, sigma_q, sigma_k)`` must give Var[s q.k] = 1: exactly for
    components +-sigma (every outcome enumerated), and within 4% in a Monte Carlo
    estimate for Gaussian ones."""
    import itertools

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
            f"should be 1, which needs s {needed}."
        )
