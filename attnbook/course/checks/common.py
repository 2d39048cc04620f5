"""Helpers the exercise checks share: the inputs' random generator, closeness with a
readable message, exact numbers and counts."""

from __future__ import annotations

import contextlib
import itertools
import numbers
import secrets
from collections.abc import Iterator

import torch

from ...utils import largest_new_tensor as _measure_here

__all__ = [
    "call_student",
    "explain_slips",
    "generator",
    "fresh_inputs",
    "assert_close",
    "is_number",
    "real_number",
    "assert_int",
]

# Mixed into every check's seed; 0 in a reader's notebook (the same inputs every run),
# a secret random number while the grader grades (inputs no submission can know).
_salt = 0


def generator(seed: int) -> torch.Generator:
    """A ``torch.Generator`` for a check's inputs: seeded with ``seed`` in a notebook,
    with ``seed`` mixed with a fresh secret inside :func:`fresh_inputs`."""
    return torch.Generator().manual_seed((seed + _salt) % 2**63)


@contextlib.contextmanager
def fresh_inputs(salt: int | None = None) -> Iterator[int]:
    """Within this block every check draws new random inputs: :func:`generator` mixes
    ``salt`` (by default a secret random 62-bit number) into its seeds. Yields the
    salt."""
    global _salt
    previous, _salt = _salt, secrets.randbits(62) if salt is None else salt
    try:
        yield _salt
    finally:
        _salt = previous


def assert_close(
    actual, expected, what: str, atol: float = 1e-5, rtol: float = 1e-4
) -> None:
    actual = torch.as_tensor(actual)
    expected = torch.as_tensor(expected)
    assert actual.shape == expected.shape, (
        f"{what}: expected shape {tuple(expected.shape)}, got {tuple(actual.shape)}."
    )
    assert torch.allclose(actual.double(), expected.double(), atol=atol, rtol=rtol), (
        f"{what}: values differ (max abs error "
        f"{(actual.double() - expected.double()).abs().max().item():.3g})."
    )


def is_number(x) -> bool:
    """A real Python or NumPy scalar, not a bool and not a tensor."""

    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def real_number(value, what: str) -> float:
    """``value`` as a float if it is a real number (int, float, NumPy scalar; not a bool
    or a tensor)."""
    assert is_number(value), (
        f"{what}: return a number (int or float), got {type(value).__name__} {value!r}."
    )
    return float(value)


def assert_int(value, what: str, noun: str = "an int") -> None:
    """Fail unless ``value`` is a Python int (not a bool, a float or a tensor): exact
    counts are ints."""
    assert isinstance(value, int) and not isinstance(value, bool), (
        f"{what}: return {noun}, got {type(value).__name__} {value!r}."
    )


def largest_new_tensor(student, *args) -> int:
    """The largest tensor (in elements) the operations of ``student(*args)`` create,
    measured where the student's code runs: in this process for a function (see
    :func:`attnbook.utils.largest_new_tensor`), in the submission's kernel for the
    grader's stand-in of a function there (its class defines the measurement)."""
    measure = getattr(type(student), "largest_new_tensor", None)
    if measure is not None:
        return measure(student, *args)

    return _measure_here(student, *args)


def call_student(student, what: str, *args, note="", **kwargs):
    """``student(*args, **kwargs)``, its crash (not a stub's ``NotImplementedError``)
    turned into a failed check that names the case. ``note`` is added to the message:
    a string, or a function of the exception that returns one."""
    try:
        return student(*args, **kwargs)
    except (NotImplementedError, AssertionError):
        raise
    except Exception as err:
        extra = note(err) if callable(note) else note
        raise AssertionError(
            f"{what}: your code raised {type(err).__name__}: {err}.{extra}"
        ) from None


def explain_slips(results, cases, formula, groups, notes) -> str:
    """The note on the fewest slips (two at most) that reproduce the student's
    ``results`` (None where a case failed) on every case, or ``''``.

    ``formula(case, slips=())`` computes a case with the named slips; ``groups`` holds
    tuples of slip names that exclude each other; ``notes`` maps each name to its
    explanation."""
    right = [formula(case) for case in cases]
    for n in (1, 2):
        for chosen in itertools.combinations(groups, n):
            for slips in itertools.product(*chosen):
                wrong = [formula(case, slips) for case in cases]
                if wrong != right and all(
                    r is None or r == w for r, w in zip(results, wrong)
                ):
                    return " " + " ".join(notes[s] for s in slips)
    return ""
