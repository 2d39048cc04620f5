"""The exercises' check, as a chapter calls it.

A chapter's coding exercise ends with a check cell::

    attnbook.exercises.check("positional-alibi-slopes", my_alibi_slopes)

which prints ``[PASSED]`` or ``[FAILED]`` with a hint. The checks themselves, one
module per chapter, their registry and their library policies live in the course kit
(:mod:`attnbook.course.checks`), beside the grader that runs them on fresh inputs; this
module is the name the notebooks, and the nbgrader and otter exports made from them,
call them by.
"""

from .course import checks as _checks

__all__ = [
    "check",
    "run_check",
    "labels",
    "register",
    "reports_wanted",
    "CheckResult",
    "CHECKS",
    "REPORT_SWITCH",
]


def __getattr__(name: str):
    # read from the course kit at each use, never copied: one registry, one ``check``
    if name in __all__:
        return getattr(_checks, name)
    raise AttributeError(f"module 'attnbook.exercises' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
