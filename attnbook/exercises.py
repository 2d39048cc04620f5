"""Auto-checks for the chapters' exercises.

A chapter's coding exercise ends with ``attnbook.exercises.check("<label>", student_object)``. The
check compares the student's object with the tested implementation in ``attnbook`` (or with a
property) and prints a clear pass/fail line with a hint. Checks are registered by label with
:func:`register`; labels are ``chNN-short-name`` and equal the ``{exercise}`` label in the chapter.

When the environment variable ``ATTNBOOK_GRADE_LOG`` names a file, every check also appends one
JSON line ``{"label", "passed", "message"}`` to it: that is how ``python -m attnbook.course grade``
learns what passed without parsing printed text.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["CheckResult", "register", "check", "labels", "CHECKS"]


@dataclass(frozen=True)
class CheckResult:
    label: str
    passed: bool
    message: str

    def __bool__(self) -> bool:
        return self.passed

    def _ipython_display_(self) -> None:
        """Display nothing in a notebook: :func:`check` has already printed the verdict."""


@dataclass(frozen=True)
class _Check:
    fn: Callable[[object], None]
    hint: str


CHECKS: dict[str, _Check] = {}


def register(label: str, hint: str) -> Callable:
    """Register ``fn(student_object)`` as the check for ``label``; it raises ``AssertionError`` on a wrong answer."""

    def decorator(fn: Callable[[object], None]) -> Callable[[object], None]:
        if label in CHECKS:
            raise ValueError(f"exercise label {label!r} is registered twice")
        CHECKS[label] = _Check(fn, hint)
        return fn

    return decorator


def labels() -> list[str]:
    """All registered exercise labels, sorted."""
    return sorted(CHECKS)


def _log(result: CheckResult) -> None:
    path = os.environ.get("ATTNBOOK_GRADE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"label": result.label, "passed": result.passed, "message": result.message}) + "\n")


def check(label: str, student: object) -> CheckResult:
    """Run the check registered for ``label`` on the student's object and print the verdict."""
    if label not in CHECKS:
        raise ValueError(f"unknown exercise label {label!r}; known labels: {', '.join(labels())}")
    entry = CHECKS[label]
    try:
        entry.fn(student)
        result = CheckResult(label, True, "passed")
    except NotImplementedError:
        result = CheckResult(label, False, "not attempted yet: replace the `raise NotImplementedError` with your code")
    except AssertionError as err:
        result = CheckResult(label, False, f"{err} Hint: {entry.hint}".strip())
    except Exception as err:  # a crash in student code is a failed check, never a crashed notebook
        result = CheckResult(label, False, f"your code raised {type(err).__name__}: {err}. Hint: {entry.hint}")
    mark = "PASSED" if result.passed else "FAILED"
    print(f"[{mark}] {label}: {result.message}")
    _log(result)
    return result


# ---------------------------------------------------------------------------------------------
# Helpers shared by the checks
# ---------------------------------------------------------------------------------------------
def _assert_close(actual, expected, what: str, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    actual = torch.as_tensor(actual)
    expected = torch.as_tensor(expected)
    assert actual.shape == expected.shape, f"{what}: expected shape {tuple(expected.shape)}, got {tuple(actual.shape)}."
    assert torch.allclose(actual.double(), expected.double(), atol=atol, rtol=rtol), (
        f"{what}: values differ (max abs error {(actual.double() - expected.double()).abs().max().item():.3g})."
    )


# ---------------------------------------------------------------------------------------------
# Chapter 1: attention fundamentals
# ---------------------------------------------------------------------------------------------
@register(
    "ch01-masked-softmax",
    hint="divide by the temperature, fill masked scores with -inf, subtract the row maximum before exp, "
    "and set rows with no allowed key to zero (their maximum is -inf).",
)
def _check_ch01_masked_softmax(student) -> None:
    """``student(scores, mask=None, temperature=1.0)`` must equal :func:`attnbook.core.masked_softmax`."""
    from .core import masked_softmax

    gen = torch.Generator().manual_seed(101)
    scores = torch.randn(2, 3, 5, 7, generator=gen) * 3
    mask = torch.rand(2, 1, 5, 7, generator=gen) > 0.3
    mask[0, 0, 2] = False  # a query with nothing to attend to
    cases = [
        ("no mask, T = 1", (scores,), {}, masked_softmax(scores)),
        ("temperature 0.5", (scores,), {"temperature": 0.5}, masked_softmax(scores, temperature=0.5)),
        ("boolean mask, T = 2", (scores, mask), {"temperature": 2.0}, masked_softmax(scores, mask, 2.0)),
        ("scores around 1000 (overflow test)", (scores + 1000.0, mask), {}, masked_softmax(scores + 1000.0, mask)),
    ]
    for what, args, kwargs, expected in cases:
        actual = student(*args, **kwargs)
        assert isinstance(actual, torch.Tensor), f"{what}: return a torch.Tensor, got {type(actual).__name__}."
        assert not torch.isnan(actual).any(), f"{what}: your weights contain NaN."
        _assert_close(actual, expected, what)


@register(
    "ch01-multi-head",
    hint="project with mha.q_proj / k_proj / v_proj, reshape (B, T, d_model) -> (B, T, h, d_model // h) and "
    "transpose to (B, h, T, head_dim), attend per head, transpose back, reshape to (B, L, d_model), apply out_proj.",
)
def _check_ch01_multi_head(student) -> None:
    """``student(mha, x, context=None)`` must equal ``mha(x, context)`` for self- and cross-attention."""
    from .core import MultiHeadAttention

    gen = torch.Generator().manual_seed(102)
    for d_model, n_heads, L, S in [(8, 1, 3, 3), (12, 3, 5, 5), (16, 4, 4, 6)]:
        with torch.random.fork_rng(devices=[]):  # seed the layer's initial weights, leave the caller's RNG alone
            torch.manual_seed(d_model)
            mha = MultiHeadAttention(d_model, n_heads).eval()
        x = torch.randn(2, L, d_model, generator=gen)
        context = torch.randn(2, S, d_model, generator=gen)
        with torch.no_grad():
            if L == S:
                _assert_close(student(mha, x), mha(x), f"self-attention, d_model={d_model}, n_heads={n_heads}")
            _assert_close(student(mha, x, context), mha(x, context),
                          f"cross-attention, d_model={d_model}, n_heads={n_heads}, L={L}, S={S}")


# ---------------------------------------------------------------------------------------------
# Chapter 2: the quadratic cost
# ---------------------------------------------------------------------------------------------
from .complexity import attention_flops, attention_memory_bytes  # noqa: E402  (only Chapter 2's checks use them)


@register(
    "ch02-attention-flops",
    hint="Count 2 FLOPs per multiply-add in the four matrix products: Q, K, V projections (3 of n x d times d x d), "
    "scores (h heads of (n, d/h) x (d/h, n)), weighted sum, output projection. The head count cancels out.",
)
def _check_attention_matmul_flops(student) -> None:
    cases = [(1, 1, 1, 1), (4, 8, 2, 1), (7, 12, 3, 5), (128, 64, 1, 2), (1000, 512, 8, 1), (4096, 4096, 32, 3)]
    for n, d, h, batch in cases:
        got = student(n, d, n_heads=h, batch=batch)
        expected = attention_flops(n, d, n_heads=h, batch=batch)["matmul"]
        assert got == expected, (
            f"for n={n}, d_model={d}, n_heads={h}, batch={batch} you return {got!r}; "
            f"the matrix products cost {expected} FLOPs."
        )


@register(
    "ch02-max-seq-len",
    hint="The weights take batch * n_heads * n^2 * bytes_per_elem * n_layers bytes: solve for n and round down "
    "with integer arithmetic (math.isqrt), returning 0 when not even n = 1 fits.",
)
def _check_max_seq_len(student) -> None:
    cases = [
        dict(budget_bytes=2**34),  # 16 GiB, one fp32 matrix: exactly 65,536
        dict(budget_bytes=2**34 - 1),  # one byte less: 65,535
        dict(budget_bytes=16 * 10**9),  # 16 GB (decimal)
        dict(budget_bytes=80 * 10**9, n_heads=32, batch=8, bytes_per_elem=2),
        dict(budget_bytes=24 * 2**30, n_heads=12, batch=4, bytes_per_elem=2, n_layers=12),
        dict(budget_bytes=3),  # less than one fp32 element: nothing fits
        dict(budget_bytes=4),  # exactly one element
    ]
    for case in cases:
        kwargs = {k: v for k, v in case.items() if k != "budget_bytes"}
        budget = case["budget_bytes"]
        n = student(**case)
        assert isinstance(n, int), f"for {case} return an int, got {type(n).__name__} {n!r}."
        assert n >= 0, f"for {case} you return a negative length {n}."
        if n > 0:
            need = attention_memory_bytes(n, **kwargs)
            assert need <= budget, f"for {case} you return n={n}, but its weights need {need} bytes > the budget."
        longer = attention_memory_bytes(n + 1, **kwargs)
        assert longer > budget, (
            f"for {case} you return n={n}, but n={n + 1} still fits ({longer} bytes <= {budget}): return the largest n."
        )


# ---------------------------------------------------------------------------------------------
# Chapter 3: positional encodings
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Chapter 4: sparse attention
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Chapter 5: linear and low-rank attention
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Chapter 8: attention in recurrent models
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Chapter 9: vision attention
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Chapter 10: graph attention
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Chapter 11: attention's relatives
# ---------------------------------------------------------------------------------------------
