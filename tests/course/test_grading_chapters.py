"""Every chapter's exercises through the real grader: the book's answers pass and the blank
student version fails, with each check running in the grader on its stand-in for the kernel's
function (tensors, modules, tuples of functions and NumPy values cross the boundary).

Each chapter is cut to its import cells and its answer and check cells (the answers depend only
on the imports, which tests/course/test_exercises.py checks), so a kernel run takes seconds.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from attnbook import course
from attnbook.course import grader, sandbox

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "book").glob("*.ipynb"))


def _imports(source: str) -> bool:
    try:
        tree = ast.parse(TransformerManager().transform_cell(source))
    except SyntaxError:
        return False
    return any(isinstance(node, (ast.Import, ast.ImportFrom)) for node in tree.body)


def cut(nb):
    """The chapter's imports, answers and checks only; the points of the written exercises (in
    the markdown cut away) leave the metadata with them."""
    nb.cells = [c for c in nb.cells if c.cell_type == "code" and (
        "solution" in c.metadata.get("tags", []) or "check(" in c.source or _imports(c.source))]
    checked = set(course.expected_labels(nb))
    points = nb.metadata.get("attnbook", {}).get("points", {})
    nb.metadata.setdefault("attnbook", {})["points"] = {k: v for k, v in points.items() if k in checked}
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("chapters")
    book, subs = root / "book", root / "submissions"
    book.mkdir()
    for path in CHAPTERS:
        nb = cut(nbformat.read(path, as_version=4))
        nbformat.write(nb, book / path.name)
        for student, version in [("solved", nb), ("blank", course.strip_solutions(nb))]:
            (subs / student).mkdir(parents=True, exist_ok=True)
            nbformat.write(version, subs / student / path.name)
    rows = grader.grade([subs], root / "grades.csv", book_dir=book, jobs=2,
                        limits=sandbox.Limits(cell_timeout=120, notebook_timeout=600))
    return rows


@pytest.mark.parametrize("chapter", [p.name for p in CHAPTERS])
def test_the_books_answers_pass_and_the_blank_fails_through_the_grader(graded, chapter):
    rows = [r for r in graded if r["notebook"] == chapter]
    solved = {r["label"]: r for r in rows if r["student"] == "solved" and r["label"] != "*"}
    blank = {r["label"]: r for r in rows if r["student"] == "blank" and r["label"] != "*"}
    assert solved and set(solved) == set(blank)
    assert all(r["status"] == "passed" for r in solved.values()), {k: r["message"] for k, r in solved.items()}
    assert all(r["status"] == "failed" and "not attempted" in r["message"] for r in blank.values()), blank
    errors = [r["message"] for r in rows if r["label"] == "*" and r["status"] == "error"]
    assert not errors, errors
