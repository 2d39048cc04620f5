"""Helpers the exercise checks share: closeness with a readable message, exact numbers
and counts."""

from __future__ import annotations

import torch

__all__ = ["assert_close", "is_number", "real_number", "assert_int"]


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
    import numbers

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
