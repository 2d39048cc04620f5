"""The course kit on Gradescope through real otter-grader (the `test` extra installs
otter-grader 7.0.0), without Docker.

As book/course.md tells it (book/grading.md, "Inside the otter masters", says how):
`python -m attnbook.course otter` writes a chapter's master notebook, `otter assign`
turns it into the student notebook and the Gradescope autograder zip, and `otter run`
grades a blank, a solved and a wrong submission with that zip in this environment.
Scores: 0, full, and full minus the wrong exercise's points; the wrong test's output is
the check's own verdict.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch

import attnbook.exercises
from attnbook import course

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = "graph_attention"  # the quickest chapter to run (8 s)
WRONG_LABEL = "graph-gcn-propagation"
WRONG = (
    "def gcn_propagation_matrix(edge_index, num_nodes):\n"
    "    A = torch.zeros(num_nodes, num_nodes)\n"
    "    A[edge_index[1], edge_index[0]] = 1.0\n"
    "    return A + torch.eye(num_nodes)  # never normalized"
)
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
}


def otter(folder: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "otter", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=600,
    )
    assert done.returncode == 0, f"otter {' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def otter_run(tmp_path_factory):
    """Export, assign, and grade three submissions; returns (folder, results by
    student, otter assign's log)."""
    home = tmp_path_factory.mktemp("otter")
    assert course.main(["otter", str(home / "masters"), "--book", str(ROOT / "book")]) == 0
    folder = home / "masters" / CHAPTER
    assigned = otter(folder, "assign", "-v", f"{CHAPTER}.ipynb", "dist")  # -v: the points summary
    (zip_path,) = (folder / "dist" / "autograder").glob("*.zip")
    blank = folder / "dist" / "student" / f"{CHAPTER}.ipynb"
    solved = folder / "dist" / "autograder" / f"{CHAPTER}.ipynb"
    wrong_nb = nbformat.read(solved, as_version=4)
    answer = next(c for c in wrong_nb.cells if c.source.startswith("def gcn_propagation_matrix"))
    answer.source = WRONG
    wrong = home / "wrong" / f"{CHAPTER}.ipynb"
    wrong.parent.mkdir()
    nbformat.write(wrong_nb, wrong)
    results = {}
    for student, path in [("blank", blank), ("solved", solved), ("wrong", wrong)]:
        out = home / "results" / student
        out.mkdir(parents=True)
        otter(home, "run", "-a", str(zip_path), "-o", str(out), str(path))
        tests = json.loads((out / "results.json").read_text())["tests"]
        results[student] = {t["name"]: t for t in tests if "score" in t}
    return folder, results, assigned


def test_assign_writes_a_student_notebook_without_solutions_or_tests(otter_run):
    folder, _, _ = otter_run
    student = nbformat.read(folder / "dist" / "student" / f"{CHAPTER}.ipynb", as_version=4)
    text = "\n".join(c.source for c in student.cells)
    assert "BEGIN SOLUTION" not in text and "{solution}" not in text and "_verdict" not in text
    book = nbformat.read(ROOT / "book" / f"{CHAPTER}.ipynb", as_version=4)
    for label in course.expected_labels(book):  # the book's own check cells stay
        assert f'attnbook.exercises.check("{label}"' in text
    for label in course.written_exercises(book):
        assert f":label: {label}" in text, "the written exercise is a question"
        model = course.written_exercises(book)[label]
        assert model[:80] not in text, "its model answer is not released"


def test_scores_are_zero_full_and_full_minus_the_wrong_exercise(otter_run):
    _, results, _ = otter_run
    book = nbformat.read(ROOT / "book" / f"{CHAPTER}.ipynb", as_version=4)
    labels = course.expected_labels(book)
    points = {label: course.notebooks._exercise_points(book, label) for label in labels}
    for student, results_ in results.items():
        assert set(results_) == set(labels), student
        assert all(results_[k]["max_score"] == points[k] for k in labels)
    assert sum(t["score"] for t in results["blank"].values()) == 0
    assert {k: t["score"] for k, t in results["solved"].items()} == points
    wrong = {k: t["score"] for k, t in results["wrong"].items()}
    assert wrong == {**points, WRONG_LABEL: 0}


def test_the_wrong_tests_output_is_the_checks_own_verdict(otter_run):
    _, results, _ = otter_run
    space = {"torch": torch}
    exec(WRONG, space)  # noqa: S102 (our own test's answer)
    verdict = attnbook.exercises.run_check(WRONG_LABEL, space["gcn_propagation_matrix"])
    assert not verdict.passed
    output = results["wrong"][WRONG_LABEL]["output"]
    assert f"AssertionError: {verdict.message}" in output, output


def test_a_written_exercise_is_a_manual_question_worth_its_metadata_points(otter_run):
    """The manual question carries the chapter's metadata.attnbook.points, and otter's own
    summary of the assignment (`otter assign -v`) counts them in its total."""
    folder, _, assigned = otter_run
    book = nbformat.read(ROOT / "book" / f"{CHAPTER}.ipynb", as_version=4)
    points = book.metadata["attnbook"]["points"]
    written = course.written_exercises(book)
    assert written and all(points[label] == 2 for label in written), "a ★★★ written exercise"
    master = nbformat.read(folder / f"{CHAPTER}.ipynb", as_version=4)
    for label in written:
        config = f"# BEGIN QUESTION\nname: {label}\nmanual: true\npoints: {points[label]}"
        assert any(c.cell_type == "raw" and c.source == config for c in master.cells), label
        assert re.search(rf"^\d+\s+{re.escape(label)}\s+{points[label]}\s+True$", assigned, re.M), assigned
    manual = sum(points[label] for label in written)
    auto = sum(points[label] for label in course.expected_labels(book))
    assert f"Total points: {auto + manual}\nAutograded:   {auto}\nManual:       {manual}\n" in assigned, assigned
