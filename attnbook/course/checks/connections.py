"""Checks for the exercises of the chapter on attention's relatives."""

from __future__ import annotations

import torch

from ...connections import hopfield_update, ssm_convolution, ssm_recurrent
from ...linear import elu_feature_map
from . import register
from .common import assert_close, generator
from .library import allowed, forbid


@register(
    "connections-hopfield-step",
    library=forbid(
        "attnbook",
        why="The exercise asks for one Hopfield update written with torch.softmax "
            "and matrix products only.",
    ),
    hint="scores = beta * query @ patterns^T (one row per query), softmax over the "
    "patterns (last dim), "
    "then multiply by the patterns: one attention step with keys = values = patterns.",
)
def _check_hopfield_step(student) -> None:
    """``student(query, patterns, beta)`` must equal
    :func:`attnbook.connections.hopfield_update`."""

    gen = generator(1101)
    patterns = torch.randn(10, 6, generator=gen)
    cases = [
        ("one query, beta = 1", torch.randn(1, 6, generator=gen), patterns, 1.0),
        (
            "three queries, beta = 0.1 (soft: an average)",
            torch.randn(3, 6, generator=gen),
            patterns,
            0.1,
        ),
        (
            "beta = 50 (sharp, overflow test)",
            10 * torch.randn(2, 6, generator=gen),
            patterns,
            50.0,
        ),
        (
            "a batch of pattern sets (2, N, d)",
            torch.randn(2, 3, 6, generator=gen),
            torch.randn(2, 5, 6, generator=gen),
            2.0,
        ),
    ]
    for what, query, pats, beta in cases:
        actual = student(query, pats, beta)
        assert not torch.isnan(actual).any(), f"{what}: your update contains NaN."
        scores = query @ pats.transpose(-2, -1)
        truth = hopfield_update(query, pats, beta=beta)
        for wrong, mistake in [
            (
                torch.softmax(beta * scores, dim=-2) @ pats,
                "normalized over the queries",
            ),
            (torch.softmax(scores, dim=-1) @ pats, "left out beta"),
        ]:
            # a slip is named only where it gives another answer at the tolerance used
            # to match it (a saturated softmax can make beta invisible)
            assert not (
                actual.shape == wrong.shape
                and torch.allclose(actual, wrong, atol=1e-5)
                and not torch.allclose(wrong, truth, atol=1e-5)
            ), f"{what}: you {mistake}."
        assert_close(actual, truth, what)


@register(
    "connections-ssm-matrix",
    library=forbid(
        "attnbook.connections.ssm_recurrent",
        "attnbook.connections.ssm_convolution",
        "attnbook.connections.ssm_kernel",
        "attnbook.connections.DiagonalSSM",
        why="The exercise asks you to build the SSM's kernel and its matrix, which "
            "ssm_kernel and ssm_convolution compute.",
    ),
    hint="the kernel is K[d, k] = sum_n c[d, n] * a[d, n]**k * b[d, n]; the matrix is "
    "T[d, t, s] = K[d, t - s] "
    "for s <= t and 0 above the diagonal (index K with t - s and mask with a lower "
    "triangle).",
)
def _check_ssm_matrix(student) -> None:
    """``student(a, b, c, length)`` -> ``(D, L, L)`` with ``y[:, :, d] = x[:, :, d] @
    T[d].T`` = the SSM's output."""

    gen = generator(1102)
    for D, N, L in [(1, 1, 4), (3, 4, 9), (2, 8, 16)]:
        a = torch.rand(D, N, generator=gen, dtype=torch.float64) * 0.95
        b = torch.randn(D, N, generator=gen, dtype=torch.float64)
        c = torch.randn(D, N, generator=gen, dtype=torch.float64)
        T = torch.as_tensor(student(a, b, c, L))
        assert T.shape == (D, L, L), (
            f"D={D}, L={L}: expected shape ({D}, {L}, {L}), got {tuple(T.shape)}."
        )
        assert (T.triu(1) == 0).all(), (
            f"D={D}, L={L}: T must be lower-triangular (an SSM is causal)."
        )
        x = torch.randn(2, L, D, generator=gen, dtype=torch.float64)
        y = torch.einsum("dts,bsd->btd", T.to(x.dtype), x)
        assert_close(
            y,
            ssm_convolution(x, a, b, c),
            f"the output of your matrix, D={D}, N={N}, L={L}",
            atol=1e-8,
        )


@register(
    "connections-ssm-step",
    library=forbid(
        "attnbook.connections.ssm_recurrent",
        "attnbook.connections.ssm_convolution",
        "attnbook.connections.ssm_kernel",
        "attnbook.connections.DiagonalSSM",
        why="The exercise asks you to write one step of the SSM recurrence, which "
            "ssm_recurrent, the check's reference, runs.",
    ),
    hint="broadcast the input over the state with x_t.unsqueeze(-1): h_new = a * h + "
    "b * x_t[..., None] is "
    "(B, D, N); the output sums c * h_new over the last (state) dimension. Return a "
    "new tensor, not h modified.",
)
def _check_ssm_step(student) -> None:
    """Scanning ``student(x_t, h, a, b, c)`` over a sequence must equal
    :func:`attnbook.connections.ssm_recurrent`."""

    gen = generator(1103)
    cases = [  # (what, B, D, N, L, a = 0?, non-zero initial state?)
        ("a = 0 (no memory: y_t = sum_n c b x_t)", 1, 2, 3, 3, True, False),
        ("B=2, D=3, N=4 from a zero state", 2, 3, 4, 6, False, False),
        ("B=3, D=2, N=8 from a non-zero state", 3, 2, 8, 5, False, True),
    ]
    for what, B, D, N, L, no_memory, warm in cases:
        a = (
            torch.zeros(D, N, dtype=torch.float64)
            if no_memory
            else torch.rand(D, N, generator=gen, dtype=torch.float64)
        )
        b, c = (torch.randn(D, N, generator=gen, dtype=torch.float64) for _ in range(2))
        x = torch.randn(B, L, D, generator=gen, dtype=torch.float64)
        h0 = (
            torch.randn(B, D, N, generator=gen, dtype=torch.float64)
            if warm
            else torch.zeros(B, D, N, dtype=torch.float64)
        )
        y_expected, h_expected = ssm_recurrent(x, a, b, c, state=h0.clone())
        h, ys = h0.clone(), []
        for t in range(L):
            h_before = h.clone()
            out = student(x[:, t].clone(), h, a, b, c)
            assert isinstance(out, tuple) and len(out) == 2, (
                f"{what}: return a pair (y_t, h_new), got {type(out).__name__}."
            )
            assert torch.equal(h, h_before), (
                f"{what}: your step changed the state h in place; return a new tensor."
            )
            y_t, h = (torch.as_tensor(o) for o in out)
            assert y_t.shape == (B, D) and h.shape == (B, D, N), (
                f"{what}: expected y_t {(B, D)} and h_new {(B, D, N)}, got "
                f"{tuple(y_t.shape)} and {tuple(h.shape)}."
            )
            ys.append(y_t)
        assert_close(
            torch.stack(ys, dim=1),
            y_expected,
            f"{what}: the outputs y_1..y_{L}",
            atol=1e-8,
        )
        assert_close(h, h_expected, f"{what}: the final state", atol=1e-8)


def _retention_recurrence(
    phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, gamma: float
) -> torch.Tensor:
    """Outputs ``y_t = phi(q_t)^T S_t`` of ``S_t = gamma S_{t-1} + phi(k_t) v_t^T`` from
    ``S_0 = 0``, one step at a time."""
    state = torch.zeros(phi_k.shape[-1], v.shape[-1], dtype=v.dtype)
    ys = []
    for t in range(v.shape[0]):
        state = gamma * state + torch.outer(phi_k[t], v[t])
        ys.append(phi_q[t] @ state)
    return torch.stack(ys)


@register(
    "connections-linear-attention-ssm",
    library=allowed(
        "No attnbook function builds the decay mask; the check compares it with the "
        "recurrence run step by step.",
    ),
    hint="unroll S_t = gamma S_{t-1} + phi(k_t) v_t^T: how many times is key s's "
    "write multiplied by gamma before "
    "output t reads it (none when s = t), and what does output t see of keys s > t? "
    "Rows are queries t, columns keys s.",
)
def _check_linear_attention_ssm(student) -> None:
    """``student(n, gamma)`` -> ``M`` (n, n) such that ``(M * phi(Q) phi(K)^T) V``
    equals the decayed recurrence run step by step."""

    gen = generator(1104)
    for n, gamma in [(1, 0.9), (2, 0.5), (5, 0.9), (8, 0.3), (9, 0.99), (6, 1.0)]:
        what = f"n={n}, gamma={gamma}"
        M = student(n, gamma)
        assert isinstance(M, torch.Tensor) and M.is_floating_point(), (
            f"{what}: return a float torch.Tensor, got {type(M).__name__}"
            + (f" of dtype {M.dtype}." if isinstance(M, torch.Tensor) else ".")
        )
        assert M.shape == (n, n), (
            f"{what}: expected shape ({n}, {n}), got {tuple(M.shape)}."
        )
        M = M.double()
        # phi = 1 (one feature) and V = I make the recurrence's output y_t[s] the mask
        # entry M[t, s] itself
        ones = torch.ones(n, 1, dtype=torch.float64)
        impulse = _retention_recurrence(
            ones, ones, torch.eye(n, dtype=torch.float64), gamma
        )
        wrong = (~torch.isclose(M, impulse, atol=1e-6, rtol=1e-5)).nonzero()
        assert not len(wrong), (
            f"{what}: M[t, s] for (t, s) = {tuple(wrong[0].tolist())} should be "
            f"{impulse[tuple(wrong[0])].item():.6g} "
            "(the recurrence's output y_t[s] with phi = 1 and V = I), got "
            f"{M[tuple(wrong[0])].item():.6g}."
        )
        phi_q, phi_k = (
            elu_feature_map(torch.randn(n, 4, generator=gen, dtype=torch.float64))
            for _ in range(2)
        )
        v = torch.randn(n, n + 2, generator=gen, dtype=torch.float64)
        assert_close(
            (M * (phi_q @ phi_k.T)) @ v,
            _retention_recurrence(phi_q, phi_k, v, gamma),
            f"{what}: (M * phi(Q) phi(K)^T) V against the recurrence on random inputs",
            atol=1e-6,
        )
