"""Auto-checks for the chapters' exercises.

A chapter's coding exercise ends with ``attnbook.exercises.check("<label>",
student_object)`` (:mod:`attnbook.exercises` forwards to this
module). The check compares the student's object with the tested
implementation in ``attnbook`` (or with a property) and prints a clear pass/fail line
with a hint. Checks are registered by label with :func:`register`; labels are
``<topic>-short-name`` (``positional-alibi-slopes``), equal the ``{exercise}`` label in
the chapter, and the checks of each chapter live in the submodule named by its topic.

The grader (:mod:`attnbook.course.grader`) does not run ``check`` in the student's
kernel: it calls :func:`run_check` in its own process on a stand-in for the student's
answer, with inputs drawn from a secret seed
(``attnbook.course.checks.common.fresh_inputs``).

Every check also says whether the answer may use attnbook's own implementation
(``register(..., library=...)``, a
:class:`~attnbook.course.checks.library.Library` policy):
where the exercise exists to write a mechanism, an answer that uses the attnbook
function or class implementing it fails with a message, and its check does not run
(:mod:`attnbook.course.checks.library` says how the use is found, and what is missed).

A check may have an *after-pass* report (``register(..., after_pass=fn)``): what
``check`` prints under a passing verdict, such as the kernel lab's compile report (what
the kernel would cost on three GPUs, several seconds of compiling). :func:`run_check`
never makes it, and ``check`` skips it when the environment variable
``ATTNBOOK_COMPILE_REPORT`` is ``0`` (the nbgrader configuration the course kit writes
sets it) or while otter-grader grades the notebook: a grader needs the verdict alone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from .library import Library, code_references, message, violations

__all__ = [
    "CheckResult",
    "register",
    "check",
    "run_check",
    "labels",
    "reports_wanted",
    "CHECKS",
    "REPORT_SWITCH",
]


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
    after_pass: Callable[[object], str | None] | None = None
    library: Library | None = None  # what the answer may use of attnbook
    question: bool = False  # a question of the bank, not a chapter's exercise


CHECKS: dict[str, _Check] = {}

#: The environment variable that turns the after-pass reports off when it is ``0``.
REPORT_SWITCH = "ATTNBOOK_COMPILE_REPORT"


def register(
    label: str,
    hint: str,
    after_pass: Callable[[object], str | None] | None = None,
    *,
    library: Library | None = None,
    question: bool = False,
) -> Callable:
    """Register ``fn(student_object)`` as the check for ``label``; it raises
    ``AssertionError`` on a wrong answer, and what it returns on a right one, when it
    is text, is the verdict's message instead of "passed".
    ``after_pass(student_object)``, if given, returns a report (text, or ``None``) that
    :func:`check` prints after a pass.

    ``library`` is required: the policy that says whether the answer may use
    attnbook's own implementation, made by
    :func:`~attnbook.course.checks.library.allowed` or
    :func:`~attnbook.course.checks.library.forbid`. ``question`` marks a question of
    the bank (``attnbook.course.checks.questions``)."""
    if after_pass is not None and not callable(after_pass):
        raise TypeError(
            f"register: after_pass must be callable or None, got {after_pass!r:.60}"
        )
    if not isinstance(library, Library):
        raise TypeError(
            f"register: {label!r} needs library=, a Library policy that says whether "
            "its answer may use attnbook (library.allowed(why) or "
            f"library.forbid(*names, why=...)), got {library!r:.60}"
        )

    def decorator(fn: Callable[[object], None]) -> Callable[[object], None]:
        if label in CHECKS:
            raise ValueError(f"exercise label {label!r} is registered twice")
        CHECKS[label] = _Check(fn, hint, after_pass, library, question)
        return fn

    return decorator


def labels() -> list[str]:
    """All registered exercise labels, sorted."""
    return sorted(CHECKS)


def run_check(
    label: str, student: object, references: set[str] | None = None
) -> CheckResult:
    """The verdict of the check registered for ``label`` on the student's object,
    without printing it: the grader calls this in its own process.

    An answer that uses what the check's library policy forbids fails with a message
    that says what it used, and the check does not run. What it uses is
    ``references``, the qualified attnbook names that the answer's source refers to
    (the grader reads them from the answer cell with
    :func:`~attnbook.course.checks.library.references`), or, when ``references`` is
    ``None``, what ``student``'s compiled code refers to
    (:func:`~attnbook.course.checks.library.code_references`)."""
    if label not in CHECKS:
        raise ValueError(
            f"unknown exercise label {label!r}; known labels: {', '.join(labels())}"
        )
    entry = CHECKS[label]
    policy = entry.library
    if policy is not None and not policy.allows_library:
        used = code_references(student) if references is None else set(references)
        found = violations(policy, used)
        if found:
            return CheckResult(label, False, message(policy, found))
    try:
        said = entry.fn(student)  # a check may say more than "passed" (the bank's why)
        return CheckResult(label, True, said if isinstance(said, str) else "passed")
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


def reports_wanted() -> bool:
    """Whether :func:`check` makes the after-pass reports: not when
    ``ATTNBOOK_COMPILE_REPORT`` is ``0`` (or ``false``, ``no``, ``off``), and not while
    otter-grader grades the notebook (its ``Notebook`` is in grading mode)."""
    switch = os.environ.get(REPORT_SWITCH, "").strip().lower()
    if switch in ("0", "false", "no", "off"):
        return False
    otter = sys.modules.get("otter")  # imported by otter's first cell when it grades
    notebook = getattr(otter, "Notebook", None)
    return not getattr(notebook, "_grading_mode", False)


def _after_pass(entry: _Check, student: object) -> str | None:
    """The report of ``entry``'s after-pass hook on ``student``; a hook that raises
    gives one line that says why there is no report."""
    try:
        report = entry.after_pass(student)
    except Exception as err:
        last = (str(err).strip().splitlines() or ["(no message)"])[-1]
        why = f"{type(err).__name__}: {last}"  # a Triton error's last line says why
        return f"(No report after the pass, the verdict stands: {why[:300]})"
    if report is not None and not isinstance(report, str):
        return (
            "(No report after the pass, the verdict stands: the report hook returned "
            f"{type(report).__name__}, not text)"
        )
    return report


def check(label: str, student: object) -> CheckResult:
    """Run the check registered for ``label`` on the student's object and print the
    verdict; after a pass, print the check's after-pass report too, unless
    :func:`reports_wanted` says no. The report never changes the verdict."""
    result = run_check(label, student)
    mark = "PASSED" if result.passed else "FAILED"
    print(f"[{mark}] {label}: {result.message}")
    entry = CHECKS[label]
    if result.passed and entry.after_pass is not None and reports_wanted():
        report = _after_pass(entry, student)
        if report:
            print(report)
    return result


# Each chapter's checks register themselves on import, in the book's order.
from . import (  # noqa: E402,F401
    attention,
    complexity,
    connections,
    distributed,
    flash,
    graph,
    inside_attention,
    kernel_lab,
    kvcache,
    linear,
    positional,
    project_context,
    project_flash,
    project_serve,
    questions,
    rnn,
    serving,
    sparse,
    transformer,
    vision,
)
