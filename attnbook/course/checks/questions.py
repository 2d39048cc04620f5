"""The checks of the question bank: one per question of ``book/questions/<chapter>``.

A question's answer is a letter (a choice question) or a number. Its check compares a
digest of the student's answer with the digest of the right one, stored in
``questions.json`` beside this module; that file is written by ``python -m
tools.questions`` from the bank's sources (``questions/<chapter>.toml`` in the
repository), which only the instructor's copy of the book publishes. A right answer is
told its explanation, which the file holds encrypted with that answer; a wrong one is
told which section to reread. So neither the answers nor the explanations can be read
from the installed package or from the student notebooks, though a student may of
course try every option of a choice question against its check, as against any
self-check: a quiz that counts is graded after its deadline, by the grader.

A number is compared after rounding to the question's significant figures (``digits``;
0 means an exact integer), so ``0.1234`` and ``0.123`` are the same answer to three.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import numbers
from pathlib import Path

from . import register
from .library import allowed

#: Mixed into every digest and key: a digest made for another purpose never matches.
SALT = "attnbook-question-bank-v1"
DATA = Path(__file__).with_name("questions.json")
LETTERS = "ABCDEFGH"


def canonical(kind: str, answer: object, digits: int = 0, options: int = 0) -> str:
    """The text the digest is made of: the letter of a choice answer, or a number
    rounded to ``digits`` significant figures (an integer when ``digits`` is 0).
    Raises ``AssertionError`` saying what an answer must be, for one that is not."""
    if kind == "choice":
        letters = LETTERS[:options]
        text = answer.strip().strip("().").upper() if isinstance(answer, str) else None
        if text is None or len(text) != 1 or text not in letters:
            raise AssertionError(
                f"answer with one letter, {letters[0]} to {letters[-1]}, as a string "
                f"(got {answer!r:.40})."
            )
        return text
    if hasattr(answer, "item") and getattr(answer, "ndim", 0) == 0:
        answer = answer.item()  # a NumPy or PyTorch scalar
    if isinstance(answer, bool) or not isinstance(answer, numbers.Real):
        raise AssertionError(f"answer with a number (got {answer!r:.40}).")
    value = float(answer)
    if not math.isfinite(value):
        raise AssertionError(f"answer with a finite number (got {answer!r:.40}).")
    if digits == 0:
        if value != round(value):
            raise AssertionError(f"the answer is an integer (got {answer!r:.40}).")
        return str(int(round(value)))
    return format(float(format(value, f".{digits}g")), f".{digits}g")


def digest(label: str, text: str) -> str:
    """The stored digest of the canonical answer ``text`` to ``label``."""
    return hashlib.sha256(f"{SALT}:{label}:{text}".encode()).hexdigest()


def _keystream(label: str, text: str, size: int) -> bytes:
    blocks = (
        hashlib.sha256(f"{SALT}:{label}:{text}:explanation:{i}".encode()).digest()
        for i in range(math.ceil(size / 32))
    )
    return b"".join(blocks)[:size]


def seal(label: str, text: str, explanation: str) -> str:
    """``explanation`` encrypted with the canonical right answer ``text`` (a keystream
    of SHA-256 blocks), as base64."""
    raw = explanation.encode()
    mixed = bytes(a ^ b for a, b in zip(raw, _keystream(label, text, len(raw))))
    return base64.b64encode(mixed).decode()


def unseal(label: str, text: str, sealed: str) -> str:
    """The explanation :func:`seal` encrypted, given the right answer ``text``."""
    mixed = base64.b64decode(sealed)
    raw = bytes(a ^ b for a, b in zip(mixed, _keystream(label, text, len(mixed))))
    return raw.decode()


def load() -> dict[str, dict]:
    """label -> what its check needs, from ``questions.json`` (empty when absent)."""
    if not DATA.exists():
        return {}
    return json.loads(DATA.read_text())["questions"]


def _make_check(label: str, entry: dict):
    kind, digits = entry["kind"], entry.get("digits", 0)
    options = entry.get("options", 0)

    def check(student) -> str:
        answer = student() if callable(student) else student
        if answer is None or answer is Ellipsis:
            raise NotImplementedError
        text = canonical(kind, answer, digits, options)
        if digest(label, text) != entry["digest"]:
            raise AssertionError(f"{text} is not right.")
        return f"right. {unseal(label, text, entry['explanation'])}"

    return check


def _register_all() -> frozenset[str]:
    bank = load()
    for label, entry in bank.items():
        register(
            label,
            hint=f"reread the section {entry['section']}.",
            library=allowed("the answer is a letter or a number"),
            question=True,
        )(_make_check(label, entry))
    return frozenset(bank)


#: The labels of the bank's questions (the other checks are the chapters' exercises).
LABELS = _register_all()
