"""The course kit inside real nbgrader (the `test` extra installs nbgrader 0.9.6).

An instructor's whole run, as book/course.md tells it (book/grading.md, "Inside the nbgrader
export", says what it checks), on two chapters: export the book, `nbgrader
generate_assignment`, three students (a blank notebook, a solved one, one with one wrong
answer), `autograde`, a manual grade for a written exercise, `generate_feedback` and
`export`. The scores must be 0, full and full minus the wrong exercise's points; the
written exercises must count in the totals; the feedback must show each failed check's
own message.
"""

from __future__ import annotations

import csv
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import environments

import attnbook.exercises
from attnbook import course

ROOT = Path(__file__).resolve().parents[2]
# nbgrader runs `alembic` from PATH: the environment's scripts folder, as when activated
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
}
CHAPTERS = ("inside_attention", "graph_attention")
BY_HAND = "attention-equivariance"  # the written exercise the instructor grades (2 points)
BY_HAND_IN = "inside_attention"  # the chapter that holds it
# One wrong answer per chapter: (the exercise's label, the answer cell's new source).
WRONG = {
    "inside_attention": (
        "inside-attention-future-mass",
        "def future_mass(weights):\n"
        "    n = weights.shape[-1]\n"
        "    future = torch.ones(n, n, dtype=torch.bool).triu(0)  # the diagonal too\n"
        "    return (weights * future).sum(-1).mean(dim=(0, 2))",
    ),
    "graph_attention": (
        "graph-gcn-propagation",
        "def gcn_propagation_matrix(edge_index, num_nodes):\n"
        "    A = torch.zeros(num_nodes, num_nodes)\n"
        "    A[edge_index[1], edge_index[0]] = 1.0\n"
        "    return A + torch.eye(num_nodes)  # never normalized",
    ),
}


def nbgrader(course_dir: Path, *args: str) -> str:
    """Run ``nbgrader ARGS`` in ``course_dir`` as an instructor would; its log on
    failure."""
    done = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=course_dir,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=900,
    )
    assert done.returncode == 0, f"nbgrader {' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


def graded(nb) -> dict[str, dict]:
    """grade_id -> nbgrader metadata of the graded cells of ``nb``."""
    return {
        c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"]
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("grade")
    }


def expected_message(label: str, source: str) -> str:
    """The verdict the book's check gives the wrong answer ``source`` (run here)."""
    import torch

    space = {"torch": torch}
    exec(source, space)  # noqa: S102 (our own test's answer)
    function = next(v for k, v in space.items() if callable(v) and k != "torch")
    result = attnbook.exercises.run_check(label, function)
    assert not result.passed
    return result.message


@pytest.fixture(scope="module")
def course_run(tmp_path_factory):
    """The instructor's run, once; returns the course folder and seconds per step."""
    home = tmp_path_factory.mktemp("course")
    times = {}
    start = time.monotonic()
    # The commands of book/course.md, section "nbgrader", with the book in a clone
    assert course.main(["nbgrader", str(home / "source"), "--book", str(ROOT / "book")]) == 0
    shutil.copy(home / "source" / "nbgrader_config.py", home / "nbgrader_config.py")
    for chapter in CHAPTERS:
        nbgrader(home, "generate_assignment", chapter, "--force")
    times["export and generate_assignment"] = time.monotonic() - start

    for chapter in CHAPTERS:
        source = nbformat.read(home / "source" / chapter / f"{chapter}.ipynb", as_version=4)
        solutions = {c.id: c.source for c in source.cells}
        blank = nbformat.read(home / "release" / chapter / f"{chapter}.ipynb", as_version=4)
        solved = nbformat.from_dict(json.loads(json.dumps(blank)))
        for cell in solved.cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("solution"):
                cell.source = (
                    solutions[cell.id]
                    if cell.cell_type == "code"
                    else "My proof: ... (a written answer, graded by hand)"
                )
        wrong = nbformat.from_dict(json.loads(json.dumps(solved)))
        label, answer = WRONG[chapter]
        cell = next(
            c for c in wrong.cells if c.metadata.get("nbgrader", {}).get("grade_id") == f"{label}-answer"
        )
        cell.source = answer
        # the blank student also "fixes" a test cell: nbgrader restores it from its checksum
        test = next(c for c in blank.cells if c.metadata.get("nbgrader", {}).get("grade_id") == label)
        test.source = "pass  # my check passes now"
        for student, nb in [("blank", blank), ("solved", solved), ("wrong", wrong)]:
            folder = home / "submitted" / student / chapter
            folder.mkdir(parents=True)
            nbformat.write(nb, folder / f"{chapter}.ipynb")

    start = time.monotonic()
    for chapter in CHAPTERS:
        nbgrader(home, "autograde", chapter, "--create", "--force")
    times["autograde"] = time.monotonic() - start

    # The instructor grades one written answer by hand (formgrader does this in a browser)
    from nbgrader.api import Gradebook

    os.environ["PATH"] = ENV["PATH"]  # for the Gradebook opened here

    with Gradebook(f"sqlite:///{home / 'gradebook.db'}") as gb:
        grade = gb.find_grade(BY_HAND, BY_HAND_IN, BY_HAND_IN, "solved")
        assert grade.needs_manual_grade and grade.auto_score is None, "autograde leaves it to us"
        # full marks, as formgrader records them: the score, and no manual grade pending
        grade.manual_score = grade.max_score
        grade.needs_manual_grade = False
        gb.db.commit()

    start = time.monotonic()
    for chapter in CHAPTERS:
        nbgrader(home, "generate_feedback", chapter, "--force")
    nbgrader(home, "export")
    times["generate_feedback and export"] = time.monotonic() - start
    print("nbgrader steps, seconds:", {k: round(v, 1) for k, v in times.items()})
    return home


def test_the_export_writes_a_config_whose_timeout_covers_the_slowest_cell(course_run):
    text = (course_run / "nbgrader_config.py").read_text()
    timeout = course.cell_timeout(course.SLOWEST_CELL)
    assert f"c.Execute.timeout = {timeout}\n" in text and timeout >= 120
    assert timeout >= course.TIMEOUT_MARGIN * max(course.SLOWEST_CELL.values())
    assert 'os.environ.setdefault("OMP_NUM_THREADS", "1")' in text
    assert 'attnbook[grading]' in text


def test_released_notebooks_hide_solutions_and_keep_written_answer_cells(course_run):
    for chapter in CHAPTERS:
        release = nbformat.read(course_run / "release" / chapter / f"{chapter}.ipynb", as_version=4)
        book = nbformat.read(ROOT / "book" / f"{chapter}.ipynb", as_version=4)
        text = "\n".join(c.source for c in release.cells)
        assert course.BEGIN not in text and "{solution}" not in text
        cells = graded(release)
        assert [k for k, m in cells.items() if not m["solution"]] == course.expected_labels(book)
        written = course.written_exercises(book)
        assert written, f"{chapter} has a written exercise"
        metadata = book.metadata["attnbook"]["points"]
        for label in written:
            answer = next(c for c in release.cells if c.metadata.get("nbgrader", {}).get("grade_id") == label)
            worth = metadata[label]
            prompt = course.WRITTEN_PROMPT.format(label=label, points=worth,
                                                  unit="point" if worth == 1 else "points")
            assert answer.cell_type == "markdown", label
            assert answer.source == prompt + "\n\nYOUR ANSWER HERE", "the prompt and its points stay"
            assert cells[label]["solution"] and cells[label]["points"] == metadata[label], (
                f"{chapter}: {label} is worth the chapter's metadata.attnbook.points")


def test_a_written_exercise_is_worth_its_metadata_points_not_a_fixed_point(course_run):
    book = nbformat.read(ROOT / "book" / f"{BY_HAND_IN}.ipynb", as_version=4)
    assert BY_HAND in course.written_exercises(book)
    assert book.metadata["attnbook"]["points"][BY_HAND] == 2
    source = nbformat.read(course_run / "source" / BY_HAND_IN / f"{BY_HAND_IN}.ipynb", as_version=4)
    assert graded(source)[BY_HAND]["points"] == 2


def test_scores_are_zero_full_and_full_minus_the_wrong_exercise(course_run):
    with (course_run / "grades.csv").open(newline="") as f:
        rows = {(r["assignment"], r["student_id"]): r for r in csv.DictReader(f)}
    assert set(rows) == {(c, s) for c in CHAPTERS for s in ("blank", "solved", "wrong")}
    for chapter in CHAPTERS:
        book = nbformat.read(ROOT / "book" / f"{chapter}.ipynb", as_version=4)
        auto = {label: course.notebooks._exercise_points(book, label) for label in course.expected_labels(book)}
        manual = {label: course.notebooks._exercise_points(book, label) for label in course.written_exercises(book)}
        by_hand = manual[BY_HAND] if chapter == BY_HAND_IN else 0  # the grade given above
        for student, score in [
            ("blank", 0),
            ("solved", sum(auto.values()) + by_hand),
            ("wrong", sum(auto.values()) - auto[WRONG[chapter][0]]),
        ]:
            row = rows[chapter, student]
            assert float(row["max_score"]) == sum(auto.values()) + sum(manual.values()), (
                f"{chapter}: the written exercises count in nbgrader's total"
            )
            assert float(row["score"]) == score, (chapter, student, row)


def test_the_gradebook_totals_count_written_points_and_flag_written_answers_for_grading(course_run):
    """nbgrader's own gradebook: each chapter's maximum holds its written exercises' points,
    and a written answer that a student wrote waits for the instructor; an untouched one
    scores 0 by itself; the one graded above has its points and waits no more."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course_run / 'gradebook.db'}") as gb:
        for chapter in CHAPTERS:
            book = nbformat.read(ROOT / "book" / f"{chapter}.ipynb", as_version=4)
            points = book.metadata["attnbook"]["points"]
            written = list(course.written_exercises(book))
            assert gb.find_assignment(chapter).max_score == sum(points.values()), chapter
            assert all(gb.find_grade_cell(w, chapter, chapter).max_score == points[w] for w in written)
            for student in ("blank", "solved", "wrong"):
                submission = gb.find_submission_notebook(chapter, chapter, student)
                grades = [gb.find_grade(w, chapter, chapter, student) for w in written]
                state = [(g.auto_score, g.manual_score, g.needs_manual_grade) for g in grades]
                if student == "blank":
                    assert state == [(0, None, False)] * len(written), (chapter, student)
                elif (chapter, student) == (BY_HAND_IN, "solved"):
                    assert state == [(None, points[BY_HAND], False)], (chapter, student)
                else:
                    assert state == [(None, None, True)] * len(written), (chapter, student)
                assert submission.needs_manual_grade == any(s[2] for s in state), (chapter, student)


def test_no_cell_of_a_solved_chapter_errors_under_autograde(course_run):
    for chapter in CHAPTERS:
        nb = nbformat.read(course_run / "autograded" / "solved" / chapter / f"{chapter}.ipynb", as_version=4)
        errors = [c.id for c in nb.cells if any(o.output_type == "error" for o in c.get("outputs", []))]
        assert not errors, f"{chapter}: error cells {errors}"
        assert course.slowest_cell(nb)[0] > 0, "nbgrader records each cell's timing"


def text_of(page: Path) -> str:
    """The text a student reads in an HTML feedback page."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def test_feedback_shows_each_failed_checks_own_message(course_run):
    for chapter in CHAPTERS:
        book = nbformat.read(ROOT / "book" / f"{chapter}.ipynb", as_version=4)
        label, answer = WRONG[chapter]
        wrong = text_of(course_run / "feedback" / "wrong" / chapter / f"{chapter}.html")
        assert f"AssertionError: {expected_message(label, answer)}" in wrong, chapter
        blank = text_of(course_run / "feedback" / "blank" / chapter / f"{chapter}.html")
        stub = "AssertionError: not attempted yet: replace the `raise NotImplementedError`"
        # every check ran, the one whose test cell the student replaced by `pass` included
        assert blank.count(stub) == len(course.expected_labels(book)), chapter


# ---------------------------------------------------------------------------------------------
# Every chapter under autograde, in a fresh environment built from the `grading` extra alone
# ---------------------------------------------------------------------------------------------
def grading_venv(where: Path) -> dict[str, str]:
    """A new venv holding only attnbook, its dependencies, its `grading` extra and nbgrader
    itself (hard-linked from this environment, tests/environments.py), its `python3` kernel
    its own; returns the environment to run it in."""
    python = environments.grading_venv(where / "venv", ROOT, ["nbgrader==0.9.6"])
    bin_dir = python.parent
    env = {k: v for k, v in ENV.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env |= {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "JUPYTER_DATA_DIR": str(where / "jupyter"),  # no kernel of the user's shadows ours
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    for args in (
        ["-m", "ipykernel", "install", "--sys-prefix", "--name", "python3"],
        ["-c", "import attnbook, sklearn, networkx, triton, nbgrader"],
    ):
        done = subprocess.run([str(python), *args], env=env, capture_output=True, text=True,
                              timeout=900, cwd=where)
        assert done.returncode == 0, f"{args}:\n{done.stdout}{done.stderr}"
    return env


def autograde_solved(home: Path, chapters: list[str], env: dict[str, str]) -> None:
    """An nbgrader course in ``home`` whose student `solved` hands in each chapter with
    the book's solutions; generate_assignment and autograde every chapter."""
    home.mkdir(parents=True)
    python = str(Path(env["PATH"].split(os.pathsep)[0]) / "python")
    run = lambda *args: subprocess.run([python, *args], cwd=home, env=env, capture_output=True,  # noqa: E731
                                       text=True, timeout=1800)
    done = run("-m", "attnbook.course", "nbgrader", "source", "--book", str(ROOT / "book"))
    assert done.returncode == 0, done.stderr
    shutil.copy(home / "source" / "nbgrader_config.py", home / "nbgrader_config.py")
    for chapter in chapters:
        folder = home / "submitted" / "solved" / chapter
        folder.mkdir(parents=True)
        shutil.copy(home / "source" / chapter / f"{chapter}.ipynb", folder)
        for step in (["generate_assignment", chapter, "--force"], ["autograde", chapter, "--create", "--force"]):
            done = run("-m", "nbgrader", *step)
            assert done.returncode == 0, f"{step}:\n{done.stdout}{done.stderr}"


@pytest.mark.every_chapter  # about 10 CPU-minutes: `make test-grading` and every release run it
def test_every_chapter_autogrades_without_an_error_cell_in_a_venv_from_the_grading_extra(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    start = time.monotonic()
    env = grading_venv(tmp_path)
    built = time.monotonic() - start
    chapters = sorted(p.stem for p in (ROOT / "book").glob("*.ipynb"))
    # two courses, one per core, the slow chapters spread between them
    by_cost = sorted(chapters, key=lambda c: -course.SLOWEST_CELL.get(c, 0.0))
    halves = [by_cost[0::2], by_cost[1::2]]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda i: autograde_solved(tmp_path / f"course{i}", halves[i], env), (0, 1)))
    graded = time.monotonic() - start - built
    measured, failures = {}, []
    timeout = course.cell_timeout(course.SLOWEST_CELL)
    for i, half in enumerate(halves):
        for chapter in half:
            nb = nbformat.read(tmp_path / f"course{i}" / "autograded" / "solved" / chapter / f"{chapter}.ipynb",
                               as_version=4)
            errors = [(c.id, o.get("ename"), o.get("evalue", "")[:200]) for c in nb.cells
                      for o in c.get("outputs", []) if o.output_type == "error"]
            if errors:
                failures.append(f"{chapter}: {errors}")
            measured[chapter] = round(course.slowest_cell(nb)[0], 1)
    print(f"venv built in {built:.0f} s; {len(chapters)} chapters autograded in {graded:.0f} s "
          f"on 2 courses; slowest cell per chapter (s): {measured}")
    assert not failures, "\n".join(failures)
    assert max(measured.values()) < timeout
