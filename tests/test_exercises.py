"""The exercise checks: the check API, and every registered check against its chapter's solution.

For every label, the solution cell of the chapter that checks it must PASS and the student stub
made by ``attnbook.course.strip_solutions`` must FAIL. Solution cells are run on their own, after the
imports of the cells before them, so they must not depend on other variables of the chapter.
"""

import ast
import contextlib
import io
import json
from pathlib import Path

import nbformat
import pytest
import torch
from IPython.core.inputtransformer2 import TransformerManager

from attnbook import course, exercises
from attnbook.exercises import CheckResult, check, labels, register

BOOK = Path(__file__).resolve().parent.parent / "book"


# ---------------------------------------------------------------------------------------------
# The check API (on a private registry, so test labels never leak into the real one)
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(exercises, "CHECKS", {})

    @register("t-square", hint="multiply x by itself")
    def _check_square(f):
        for x in (0, 3, -2):
            if f(x) != x * x:  # an explicit raise: pytest rewrites `assert` messages in test modules
                raise AssertionError(f"square({x}) should be {x * x}, got {f(x)!r}.")

    return exercises.CHECKS


def test_a_right_answer_passes(registry, capsys):
    result = check("t-square", lambda x: x**2)
    assert result == CheckResult("t-square", True, "passed") and bool(result)
    assert capsys.readouterr().out == "[PASSED] t-square: passed\n"


def test_a_wrong_answer_fails_with_the_message_and_the_hint(registry, capsys):
    result = check("t-square", lambda x: 2 * x)
    assert not result
    assert result.message == "square(3) should be 9, got 6. Hint: multiply x by itself"
    assert capsys.readouterr().out == f"[FAILED] t-square: {result.message}\n"


def test_a_stub_is_reported_as_not_attempted(registry, capsys):
    def square(x):
        raise NotImplementedError("Exercise: write your solution here")

    result = check("t-square", square)
    assert not result.passed and "not attempted" in result.message
    assert capsys.readouterr().out.startswith("[FAILED] t-square: not attempted")


def test_a_crash_in_student_code_is_a_failure_never_an_exception(registry, capsys):
    result = check("t-square", lambda x: 1 / x)
    assert not result.passed
    assert result.message == "your code raised ZeroDivisionError: division by zero. Hint: multiply x by itself"
    assert capsys.readouterr().out.startswith("[FAILED] t-square: your code raised ZeroDivisionError")


def test_unknown_label_raises_listing_the_known_labels(registry):
    register("t-other", hint="")(lambda f: None)
    with pytest.raises(ValueError, match=r"unknown exercise label 'nope'; known labels: t-other, t-square"):
        check("nope", None)
    assert labels() == ["t-other", "t-square"]


def test_registering_a_label_twice_raises(registry):
    with pytest.raises(ValueError, match="'t-square' is registered twice"):
        register("t-square", hint="again")(lambda f: None)


def test_every_check_appends_a_json_line_to_the_grade_log(registry, tmp_path, monkeypatch, capsys):
    log = tmp_path / "grade.jsonl"
    monkeypatch.setenv("ATTNBOOK_GRADE_LOG", str(log))
    check("t-square", lambda x: x * x)
    check("t-square", lambda x: x)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines[0] == {"label": "t-square", "passed": True, "message": "passed"}
    assert lines[1]["passed"] is False and lines[1]["message"].startswith("square(3) should be 9")
    assert len(lines) == 2


def test_assert_close_names_the_shape_or_the_error():
    exercises._assert_close(torch.ones(2), torch.ones(2) + 1e-7, "weights")
    with pytest.raises(AssertionError, match=r"weights: expected shape \(3,\), got \(2,\)"):
        exercises._assert_close(torch.ones(2), torch.ones(3), "weights")
    with pytest.raises(AssertionError, match="weights: values differ .max abs error 0.5"):
        exercises._assert_close(torch.ones(2), torch.tensor([1.0, 1.5]), "weights")


# ---------------------------------------------------------------------------------------------
# Every registered check against the book's solutions
# ---------------------------------------------------------------------------------------------
def _check_calls(source: str):
    """``(label, object expression)`` for each ``check("label", obj)`` call in a code cell."""
    tree = ast.parse(TransformerManager().transform_cell(source))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and len(node.args) == 2 and isinstance(node.args[0], ast.Constant)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == "check"):
            yield node.args[0].value, ast.unparse(node.args[1])


def book_exercises():
    """For every check call in book/*.ipynb: label -> (notebook name, imports, solution source, object expr).

    ``imports`` is the source of every import statement in the cells before the solution cell; the
    solution cell is the nearest code cell before the check that has a ``### BEGIN SOLUTION`` marker.
    """
    found = {}
    for path in sorted(BOOK.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        imports, solution = [], None
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            for label, expr in _check_calls(cell.source):
                assert label not in found, f"{label} is checked in {found[label][0]} and again in {path.name}"
                found[label] = (path.name, "\n".join(imports), solution, expr)
            if course.BEGIN in cell.source:
                solution = cell.source
            else:
                tree = ast.parse(TransformerManager().transform_cell(cell.source))
                imports += [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    return found


def _run(label, imports, solution_source, expr):
    """Exec the imports and a solution cell in a fresh namespace, then check the object; returns the result."""
    namespace = {}
    exec("import math\nimport torch\nimport attnbook\nimport attnbook.exercises\n" + imports, namespace)
    with contextlib.redirect_stdout(io.StringIO()):
        exec(solution_source, namespace)
        return check(label, eval(expr, namespace))


def test_every_registered_label_is_checked_in_exactly_one_chapter():
    in_book = book_exercises()
    assert sorted(in_book) == labels(), (
        f"registered but never checked in book/: {sorted(set(labels()) - set(in_book))}; "
        f"checked in book/ but not registered: {sorted(set(in_book) - set(labels()))}"
    )
    if list(BOOK.glob("*.ipynb")):
        assert labels(), "the book has chapters but no exercise checks"


def test_every_check_label_is_an_exercise_label_in_its_chapter():
    for label, (name, *_) in book_exercises().items():
        markdown = "\n".join(c.source for c in nbformat.read(BOOK / name, as_version=4).cells
                             if c.cell_type == "markdown")
        assert f":label: {label}\n" in markdown + "\n", f"{name} checks {label!r} but has no exercise with that label"


def test_every_solution_passes_and_every_stub_fails():
    problems = []
    for label, (name, imports, solution, expr) in book_exercises().items():
        if solution is None:
            problems.append(f"{name}: no solution cell before the check of {label!r}")
            continue
        try:
            if not _run(label, imports, solution, expr):
                problems.append(f"{name}: the solution for {label!r} FAILS its check")
        except Exception as err:
            problems.append(f"{name}: the solution cell for {label!r} raised {type(err).__name__}: {err}")
        stub = course.strip_solutions(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(solution)]))
        try:
            if _run(label, imports, stub.cells[0].source, expr):
                problems.append(f"{name}: the student stub for {label!r} PASSES its check")
        except NotImplementedError:
            pass  # the stub raises as soon as the cell runs: the student cannot miss it
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------
# Wrong answers fail: checks for the computable parts of exercises that were written-only
# ---------------------------------------------------------------------------------------------
# (chapters 1-5)

# (chapters 7-11)
