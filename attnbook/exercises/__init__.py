"""Auto-checks for the chapters' exercises.

A chapter's coding exercise ends with ``attnbook.exercises.check("<label>",
student_object)``. The check compares the student's object with the tested
implementation in ``attnbook`` (or with a property) and prints a clear pass/fail line
with a hint. Checks are registered by label with :func:`register`; labels are
``<topic>-short-name`` (``positional-alibi-slopes``), equal the ``{exercise}`` label in
the chapter, and the checks of each chapter live in the submodule named by its topic.

The grader (:mod:`attnbook.grader`) does not run ``check`` in the student's kernel: it
calls :func:`run_check` in its own process on a stand-in for the student's answer, with
inputs drawn from a secret seed (``attnbook.exercises.common.fresh_inputs``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CheckResult", "register", "check", "run_check", "labels", "CHECKS"]


@dataclass(frozen=True)
class CheckResult:
    label: str
    passed: bool
    message: str

    def __bool__(self) -> bool:
        return self.passed

    def _ipython_display_(self) -> None:
        """Display nothing in a notebook: :func:`check` has already printed the
        verdict."""


@dataclass(frozen=True)
class _Check:
    fn: Callable[[object], None]
    hint: str


CHECKS: dict[str, _Check] = {}


def register(label: str, hint: str) -> Callable:
    """Register ``fn(student_object)`` as the check for ``label``; it raises
    ``AssertionError`` on a wrong answer."""

    def decorator(fn: Callable[[object], None]) -> Callable[[object], None]:
        if label in CHECKS:
            raise ValueError(f"exercise label {label!r} is registered twice")
        CHECKS[label] = _Check(fn, hint)
        return fn

    return decorator


def labels() -> list[str]:
    """All registered exercise labels, sorted."""
    return sorted(CHECKS)


def run_check(label: str, student: object) -> CheckResult:
    """The verdict of the check registered for ``label`` on the student's object,
    without printing it: the grader calls this in its own process."""
    if label not in CHECKS:
        raise ValueError(
            f"unknown exercise label {label!r}; known labels: {', '.join(labels())}"
        )
    entry = CHECKS[label]
    try:
        entry.fn(student)
        return CheckResult(label, True, "passed")
    except NotImplementedError:
        return CheckResult(
            label,
            False,
            "not attempted yet: replace the `raise NotImplementedError` with your code",
        )
    except AssertionError as err:
        return CheckResult(label, False, f"{err} Hint: {entry.hint}".strip())
    # a crash in student code is a failed check, never a crashed notebook
    except Exception as err:
        return CheckResult(
            label,
            False,
            f"your code raised {type(err).__name__}: {err}. Hint: {entry.hint}",
        )


def check(label: str, student: object) -> CheckResult:
    """Run the check registered for ``label`` on the student's object and print the
    verdict."""
    result = run_check(label, student)
    mark = "PASSED" if result.passed else "FAILED"
    print(f"[{mark}] {label}: {result.message}")
    return result


# Each chapter's checks register themselves on import, in the book's order.
from . import (  # noqa: E402,F401
    attention,
    complexity,
    connections,
    distributed,
    flash,
    graph,
    kernel_lab,
    kvcache,
    linear,
    positional,
    rnn,
    serving,
    sparse,
    transformer,
    vision,
)
