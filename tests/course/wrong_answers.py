"""The harness of the wrong-answer tests: one ``tests/course/test_wrong_answers_<topic>.py`` per
chapter lists the plausible mistakes a student makes in each exercise as ``MISTAKES``, and
``mistake_test(MISTAKES)`` turns them into one parametrized test.

A mistake passes its test when the check *fails* it and the message (with the hint) contains
every one of ``needles``: the verdict must point at the mistake, not only reject it.
``tests/course/test_exercises.py`` holds every registered label to at least two mistakes.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from typing import Any

import pytest

from attnbook.exercises import check


@dataclass(frozen=True)
class Mistake:
    label: str  # the exercise's label
    what: str  # the mistake in a few words, the test's id
    answer: Any  # what the student hands to check(...)
    needles: tuple[str, ...]  # substrings the failure message must contain


def verdict(label: str, answer):
    """``check(label, answer)`` without its printed line."""
    with contextlib.redirect_stdout(io.StringIO()):
        return check(label, answer)


def mistake_test(mistakes: list[Mistake]):
    """A test function parametrized over ``mistakes``."""

    @pytest.mark.parametrize(
        "mistake", mistakes, ids=[f"{m.label}: {m.what}" for m in mistakes]
    )
    def test_a_plausible_wrong_answer_fails_with_a_message_that_points_at_it(mistake):
        result = verdict(mistake.label, mistake.answer)
        assert not result.passed, f"{mistake.what}: the check PASSED it"
        missing = [n for n in mistake.needles if n not in result.message]
        assert not missing, f"{mistake.what}: {missing} not in {result.message!r}"

    return test_a_plausible_wrong_answer_fails_with_a_message_that_points_at_it
