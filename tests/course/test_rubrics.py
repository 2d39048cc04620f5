"""The rubrics of the written exercises (graded by hand).

Each written exercise's ``{solution}`` directive ends with a rubric, "**Rubric** (N points)"
and what a full, a partial and a missing answer contains, so the instructor edition shows it
and the student edition, which drops every ``{solution}`` directive, does not. The exports
show it to the grader alone:

- nbgrader: a read-only cell after the answer cell holds it in a mark-scheme region, which
  ``generate_assignment`` clears (ClearMarkScheme) and ``autograde`` restores from the
  gradebook into the notebook the formgrader renders; the exported configuration keeps it
  out of the feedback;
- otter: a markdown cell in the solution block of the manual question, which ``otter
  assign`` keeps in the autograder notebook and drops from the student's.

The real pipelines run on a one-exercise chapter (about 15 s together); the book's chapters
are checked through the exports' structure and nbgrader's own preprocessors.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from attnbook import course
from attnbook.course import notebooks
from attnbook.course.notebooks import RUBRIC_HEADING, rubrics, strip_solutions

ROOT = Path(__file__).resolve().parents[2]
BOOK = {p.stem: nbformat.read(p, as_version=4) for p in sorted((ROOT / "book").glob("*.ipynb"))}
WRITTEN = {(chapter, label) for chapter, nb in BOOK.items() for label in course.written_exercises(nb)}
ENV = {  # nbgrader runs `alembic` from PATH: the environment's scripts folder, as when activated
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
}
LEVEL = re.compile(r"^- \*\*(?P<level>Full|Partial|Missing) \((?P<points>\d+(?:\.\d+)?) points?\)\*\*: \S")


def _text_lines(rubric: str) -> list[str]:
    """The rubric's lines worth looking for elsewhere: every non-blank one, stripped."""
    return [line.strip() for line in rubric.split("\n") if len(line.strip()) >= 12]


# ---------------------------------------------------------------------------------------------
# The rubrics in the book
# ---------------------------------------------------------------------------------------------
def test_every_written_exercise_has_a_rubric_of_its_points_with_full_partial_and_missing():
    assert len(WRITTEN) == 9
    for chapter, nb in BOOK.items():
        found, written = rubrics(nb), course.written_exercises(nb)
        assert list(found) == list(written), chapter
        for label, rubric in found.items():
            worth = notebooks._exercise_points(nb, label)
            heading, *rest = rubric.split("\n")
            assert RUBRIC_HEADING.match(heading), (label, heading)
            assert float(RUBRIC_HEADING.match(heading)["points"]) == worth, label
            levels = {m["level"]: float(m["points"]) for line in rest if (m := LEVEL.match(line))}
            assert list(levels) == ["Full", "Partial", "Missing"], (label, rest)
            assert levels["Full"] == worth and 0 < levels["Partial"] < worth and levels["Missing"] == 0, label
            assert "Rubric" not in written[label], f"{label}: the model answer stops before the rubric"
            body = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
            assert heading in body and rubric.split("\n")[-1] in body


def test_rubrics_are_the_end_of_the_solution_directive_and_the_model_answer_the_rest():
    solution = ("```{solution} tiny-why\n:class: dropdown\n\nThe model answer.\n\n"
                "**Rubric** (1 point)\n\n- **Full (1 point)**: all.\n```")
    nb = new_notebook(cells=[new_markdown_cell("```{exercise} Why\n:label: tiny-why\n\nWhy?\n```"),
                             new_markdown_cell(solution)])
    assert course.written_exercises(nb) == {"tiny-why": "The model answer."}
    assert rubrics(nb) == {"tiny-why": "**Rubric** (1 point)\n\n- **Full (1 point)**: all."}
    nb.cells[1].source = solution.replace("**Rubric** (1 point)", "Rubric: none")
    assert rubrics(nb) == {"tiny-why": ""}, "no heading line, no rubric"


def test_the_student_notebooks_hold_no_rubric():
    for chapter, nb in BOOK.items():
        student = "\n".join(c.source for c in strip_solutions(nb, name=chapter).cells)
        assert "**Rubric**" not in student, chapter
        for label, rubric in rubrics(nb).items():
            leaked = [line for line in _text_lines(rubric) if line in student]
            assert not leaked, f"{chapter}, {label}: {leaked}"


# ---------------------------------------------------------------------------------------------
# nbgrader
# ---------------------------------------------------------------------------------------------
def _exported_config(monkeypatch):
    """The traitlets configuration the exported nbgrader_config.py sets."""
    from traitlets.config import Config

    config = Config()
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the file sets two variables
    exec(course.nbgrader_config(course.SLOWEST_CELL), {"get_config": lambda: config})  # noqa: S102
    return config


def test_nbgrader_source_puts_each_rubric_in_a_mark_scheme_region_that_nbgrader_clears(monkeypatch):
    from nbgrader.preprocessors import ClearMarkScheme, ClearSolutions

    config = _exported_config(monkeypatch)
    assert config.ClearMarkScheme.enforce_metadata is False
    begin, end = notebooks.MARK_SCHEME
    for chapter, nb in BOOK.items():
        found = rubrics(nb)
        if not found:
            continue
        source = course.nbgrader_source(nb, name=chapter)
        ids = [c.get("id") for c in source.cells]
        for label, rubric in found.items():
            at = ids.index(f"{label}-rubric")
            assert source.cells[at - 1].metadata["nbgrader"]["grade_id"] == label, "after its answer cell"
            cell = source.cells[at]
            assert cell.cell_type == "markdown"
            assert cell.source == (f"{notebooks.RUBRIC_NOTE.format(label=label)}\n\n"
                                   f"{begin}\n{rubric}\n{end}")
            meta = cell.metadata["nbgrader"]
            assert meta["locked"] and not (meta["grade"] or meta["solution"] or meta["task"]), label
        with pytest.raises(RuntimeError, match="Mark scheme region detected in a non-grade cell"):
            ClearMarkScheme().preprocess(nbformat.from_dict(source), {})  # nbgrader's default
        release, resources = ClearSolutions(config=config).preprocess(source, {})
        release, _ = ClearMarkScheme(config=config).preprocess(release, resources)
        text = "\n".join(c.source for c in release.cells)
        assert "MARK SCHEME" not in text and "**Rubric**" not in text, chapter
        for label, rubric in found.items():
            assert notebooks.RUBRIC_NOTE.format(label=label) in text
            assert not [line for line in _text_lines(rubric) if line in text], (chapter, label)


RUBRIC = """**Rubric** (2 points)

- **Full (2 points)**: names the sentinel quokka and says why.
- **Partial (1 point)**: names the quokka without the reason.
- **Missing (0 points)**: no answer."""


def tiny_book(folder: Path) -> Path:
    """A book of one chapter with one written exercise, its model answer and its rubric."""
    exercise = "```{exercise} Why (difficulty: ★★☆)\n:label: tiny-why\n\nWhy?\n```"
    solution = f"```{{solution}} tiny-why\n:class: dropdown\n\nThe model zebra.\n\n{RUBRIC}\n```"
    nb = new_notebook(
        cells=[new_code_cell("x = 1", id="code"), new_markdown_cell(f"{exercise}\n\n{solution}", id="why")],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                  "attnbook": {"points": {"tiny-why": 2}}},
    )
    book = folder / "book"
    book.mkdir()
    nbformat.write(nb, book / "tiny.ipynb")
    return book


def run(folder: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", *args], cwd=folder, capture_output=True, text=True,
                          env=ENV, timeout=300)
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


def test_nbgrader_hides_the_rubric_from_the_student_and_shows_it_to_the_grader(tmp_path):
    """generate_assignment, autograde and generate_feedback with the exported configuration:
    the released notebook and the feedback lack the rubric; the autograded notebook, the one
    the formgrader renders, has it beside the student's answer."""
    home = tmp_path / "course"
    course.make_nbgrader_source(tiny_book(tmp_path), home / "source")
    (home / "nbgrader_config.py").write_text((home / "source" / "nbgrader_config.py").read_text())
    run(home, "nbgrader", "generate_assignment", "tiny", "--force")
    release = nbformat.read(home / "release" / "tiny" / "tiny.ipynb", as_version=4)
    text = "\n".join(c.source for c in release.cells)
    assert "quokka" not in text and "Rubric" not in text and "zebra" not in text
    cell = next(c for c in release.cells if c.get("id") == "tiny-why-rubric")
    assert cell.source.strip() == notebooks.RUBRIC_NOTE.format(label="tiny-why")

    answer = next(c for c in release.cells if c.get("id") == "tiny-why-answer")
    answer.source = answer.source.replace("YOUR ANSWER HERE", "Because of the walrus.")
    (home / "submitted" / "ada" / "tiny").mkdir(parents=True)
    nbformat.write(release, home / "submitted" / "ada" / "tiny" / "tiny.ipynb")
    run(home, "nbgrader", "autograde", "tiny", "--create", "--force")
    graded = nbformat.read(home / "autograded" / "ada" / "tiny" / "tiny.ipynb", as_version=4)
    ids = [c.get("id") for c in graded.cells]
    assert ids.index("tiny-why-rubric") == ids.index("tiny-why-answer") + 1
    shown = graded.cells[ids.index("tiny-why-rubric")].source
    assert RUBRIC in shown and notebooks.MARK_SCHEME[0] in shown, "restored for the formgrader"
    assert "walrus" in graded.cells[ids.index("tiny-why-answer")].source

    run(home, "nbgrader", "generate_feedback", "tiny", "--force")
    feedback = (home / "feedback" / "ada" / "tiny" / "tiny.html").read_text()
    assert "walrus" in feedback and "quokka" not in feedback and "MARK SCHEME" not in feedback


# ---------------------------------------------------------------------------------------------
# otter
# ---------------------------------------------------------------------------------------------
def test_otter_master_puts_each_rubric_in_the_solution_of_its_manual_question():
    for chapter, nb in BOOK.items():
        found = rubrics(nb)
        if not found:
            continue
        cells = course.otter_master(nb, name=f"{chapter}.ipynb").cells
        for label, rubric in found.items():
            start = next(i for i, c in enumerate(cells)
                         if c.cell_type == "raw" and c.source.startswith(f"# BEGIN QUESTION\nname: {label}\n"))
            assert "manual: true" in cells[start].source
            block = [(c.cell_type, c.source, c.get("id")) for c in cells[start + 2:start + 6]]
            assert block[0][:2] == ("raw", "# BEGIN SOLUTION") and block[1][2] == f"{label}-answer"
            assert block[2] == ("markdown", rubric, f"{label}-rubric")
            assert block[3][:2] == ("raw", "# END SOLUTION")


def test_otter_assign_keeps_the_rubric_for_the_autograder_notebook_only(tmp_path):
    (master,) = course.make_otter_masters(tiny_book(tmp_path), tmp_path / "otter")
    run(master.parent, "otter", "assign", master.name, "dist")
    student = nbformat.read(master.parent / "dist" / "student" / "tiny.ipynb", as_version=4)
    text = "\n".join(c.source for c in student.cells)
    assert "quokka" not in text and "Rubric" not in text and "zebra" not in text
    assert "_Type your answer here" in text, "the student answers in otter's response cell"
    graded = nbformat.read(master.parent / "dist" / "autograder" / "tiny.ipynb", as_version=4)
    rubric = next(c for c in graded.cells if c.source == RUBRIC)
    assert "otter_assign_solution_cell" in rubric.metadata.get("tags", [])
