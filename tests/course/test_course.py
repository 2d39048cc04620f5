"""The course kit: stripping solutions into student notebooks, and grading submitted notebooks.

Fixture notebooks are built here (not taken from the chapters). Their first cell registers two
test-only checks, so the same cells work in-process (with the registry swapped for an empty one)
and in the kernels the grader starts. Kernels are slow (~2 s each): grading runs once per module.
"""

import contextlib
import hashlib
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from attnbook import course
from attnbook.course import checks as exercises  # the registry behind attnbook.exercises
from attnbook.course import grader, sandbox

ROOT = Path(__file__).resolve().parents[2]

SETUP = '''\
import attnbook.exercises as ex
from attnbook.course.checks.library import allowed


def _check_double(f):
    for x in (0, 1, -2.5, 7):
        got = f(x)
        assert got == 2 * x, f"double({x}) should be {2 * x}, got {got!r}."


def _check_clip(f):
    for values, low, high in [([3, -1, 0.5], 0, 1), ([], 0, 1), ([5, 9], 6, 8)]:
        expected = [min(max(v, low), high) for v in values]
        assert f(values, low, high) == expected, f"clip({values}, {low}, {high}) should be {expected}."


for label, fn, hint in [("test-double", _check_double, "multiply by two"),
                        ("test-clip", _check_clip, "min(max(v, low), high)")]:
    if label not in ex.CHECKS:
        ex.register(label, hint=hint, library=allowed("Anything goes here."))(fn)'''

DOUBLE_SOLUTION = '''\
def double(x):
    """Twice x."""
    ### BEGIN SOLUTION
    return 2 * x
    ### END SOLUTION'''

CLIP_SOLUTION = '''\
def clip(values, low, high):
    """Each value clamped to [low, high]."""
    out = []
    for v in values:
        ### BEGIN SOLUTION
        v = min(max(v, low), high)
        out.append(v)
        ### END SOLUTION
    return out'''

EXERCISE_MD = '''\
```{exercise} Double it (difficulty: ★☆☆)
:label: test-double

Write `double(x)`.
```'''

WRITTEN_MD = '''\
Before the written exercise.

````{exercise} Why? (difficulty: ★★☆)
:label: test-why

Explain.
````

````{solution} test-why
:class: dropdown

Because of this code:
```python
x = 1
```
````

:::{solution} test-why
:class: dropdown
A second, colon-fenced answer.
:::

After the solutions.'''

CHECK_DOUBLE = 'attnbook.exercises.check("test-double", double)'
CHECK_CLIP = "attnbook.exercises.check('test-clip', clip)"


def solution_cell(source):
    return new_code_cell(source, metadata={"tags": ["solution", "hide-input"]})


def chapter(double=DOUBLE_SOLUTION, clip=CLIP_SOLUTION, between=()):
    """A tiny chapter: setup, two coding exercises with checks, a written exercise.

    ``between`` are extra code cells placed after the first check (a failing cell, a slow one...).
    """
    first = solution_cell(double)
    first.outputs = [new_output("stream", name="stdout", text="old output\n")]
    first.execution_count = 3
    nb = new_notebook(
        cells=[
            new_code_cell("import attnbook"),
            new_code_cell(SETUP),
            new_markdown_cell(EXERCISE_MD),
            first,
            new_code_cell(CHECK_DOUBLE),
            *[new_code_cell(src) for src in between],
            solution_cell(clip),
            new_code_cell(CHECK_CLIP),
            new_markdown_cell(WRITTEN_MD),
            new_markdown_cell(":::{solution} test-why\nOnly a solution in this cell.\n:::"),
        ],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )
    # ids as stable as a real chapter's: the same cell has the same id in every copy
    answers = iter(["double-answer", "clip-answer"])
    for cell in nb.cells:
        solution = "solution" in cell.metadata.get("tags", [])
        cell.id = next(answers) if solution else hashlib.sha1(cell.source.encode()).hexdigest()[:8]
    return nb


@pytest.fixture
def registry(monkeypatch):
    """An empty check registry for in-process runs, so test labels never leak into other tests."""
    monkeypatch.setattr(exercises, "CHECKS", {})
    return exercises.CHECKS


def run_cells(nb):
    """Execute a notebook's code cells in-process, in order; returns the printed text."""
    namespace, buffer = {}, io.StringIO()
    with contextlib.redirect_stdout(buffer):
        for cell in nb.cells:
            if cell.cell_type == "code":
                exec(cell.source, namespace)
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------
# strip_solutions
# ---------------------------------------------------------------------------------------------
def test_strip_solutions_stubs_code_at_the_markers_indentation():
    nb = chapter()
    student = course.strip_solutions(nb)
    code = [cell.source for cell in student.cells if cell.cell_type == "code"]
    assert code[2] == f'def double(x):\n    """Twice x."""\n    {course.STUB}'
    assert code[4] == ("def clip(values, low, high):\n    \"\"\"Each value clamped to [low, high].\"\"\"\n"
                       f"    out = []\n    for v in values:\n        {course.STUB}\n    return out")
    assert all("SOLUTION" not in source and "2 * x" not in source for source in code[2:])
    assert nb.cells[3].source == DOUBLE_SOLUTION  # the input notebook is left alone


def test_strip_solutions_keeps_checks_unhides_stubs_and_clears_outputs():
    nb = chapter()
    student = course.strip_solutions(nb)
    code = [cell for cell in student.cells if cell.cell_type == "code"]
    assert [c.source for c in code if "check(" in c.source] == [CHECK_DOUBLE, CHECK_CLIP]
    assert code[0].source == "import attnbook" and code[1].source == SETUP
    assert [c.metadata["tags"] for c in code if "tags" in c.metadata] == [["solution"], ["solution"]]
    assert all(c.outputs == [] and c.execution_count is None for c in code)
    assert nb.cells[3].outputs and nb.cells[3].metadata["tags"] == ["solution", "hide-input"]
    nbformat.validate(student)


def test_strip_solutions_removes_written_solutions_only():
    student = course.strip_solutions(chapter())
    markdown = [cell.source for cell in student.cells if cell.cell_type == "markdown"]
    # the cell holding nothing but a solution is gone; the exercises and the prose stay
    assert markdown == [EXERCISE_MD, "Before the written exercise.\n\n````{exercise} Why? (difficulty: ★★☆)\n"
                        ":label: test-why\n\nExplain.\n````\n\nAfter the solutions."]


@pytest.mark.parametrize(
    "source, problem",
    [
        ("def f():\n    ### BEGIN SOLUTION\n    return 1", "line 2: ### BEGIN SOLUTION has no ### END SOLUTION"),
        ("def f():\n    return 1\n    ### END SOLUTION", "line 3: ### END SOLUTION without a ### BEGIN SOLUTION"),
        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "line 2: ### BEGIN SOLUTION inside the block"),
        ("def f():\n    return 1", "tagged 'solution' but has no ### BEGIN SOLUTION"),
    ],
)
def test_unbalanced_markers_raise_naming_notebook_and_cell(source, problem):
    nb = chapter(clip=source)
    with pytest.raises(ValueError, match="ch99.ipynb, cell 5 ") as err:
        course.strip_solutions(nb, name="ch99.ipynb")
    assert problem in str(err.value)


def test_stub_fails_its_check_and_solution_passes(registry):
    printed = run_cells(chapter())
    assert printed.splitlines() == ["[PASSED] test-double: passed", "[PASSED] test-clip: passed"]
    printed = run_cells(course.strip_solutions(chapter()))
    assert printed.splitlines() == [
        "[FAILED] test-double: not attempted yet: replace the `raise NotImplementedError` with your code",
        "[FAILED] test-clip: not attempted yet: replace the `raise NotImplementedError` with your code",
    ]
    namespace = {}
    exec(course.strip_solutions(chapter()).cells[3].source, namespace)
    with pytest.raises(NotImplementedError, match="Exercise: write your solution here"):
        namespace["double"](1)


def test_expected_labels_in_order_without_duplicates():
    nb = chapter(between=[CHECK_DOUBLE, "from attnbook.exercises import check\ncheck( 'attention-spaced',  f)"])
    nb.cells.append(new_markdown_cell('check("in-markdown", f)'))
    assert course.expected_labels(nb) == ["test-double", "attention-spaced", "test-clip"]


def test_every_book_notebook_strips_cleanly():
    notebooks = sorted((ROOT / "book").glob("*.ipynb"))
    assert notebooks, "book/ has no chapter notebooks"
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        student = course.strip_solutions(nb, name=path.name)
        sources = [cell.source for cell in student.cells]
        assert not any(course.BEGIN in s or course.END in s for s in sources), path.name
        assert not any(course.notebooks._SOLUTION_OPEN.match(line) for s in sources for line in s.splitlines()), path.name

        def checks(notebook):
            return [c.source for c in notebook.cells if c.cell_type == "code" and course.notebooks.CHECK_CALL.search(c.source)]

        assert checks(student) == checks(nb), path.name
        n_stubs = sum(s.count(course.STUB) for s in sources)
        assert n_stubs == sum(c.source.count(course.BEGIN) for c in nb.cells if c.cell_type == "code"), path.name


# ---------------------------------------------------------------------------------------------
# nbgrader source notebooks
# ---------------------------------------------------------------------------------------------
def test_nbgrader_source_marks_answers_and_tests_and_drops_written_solutions():
    nb = chapter()
    source = course.nbgrader_source(nb, name="ch.ipynb", points=2)
    meta = [(cell.source.split("\n")[0], cell.metadata.get("nbgrader")) for cell in source.cells]
    graded = [(first, m) for first, m in meta if m]
    assert [m["grade_id"] for _, m in graded] == [
        "test-double-answer", "test-double", "test-clip-answer", "test-clip", "test-why"]
    for first, m in graded[:4]:
        assert m["schema_version"] == 3 and m["task"] is False
        if m["solution"]:
            assert not m["grade"] and not m["locked"] and "points" not in m
        else:
            assert m["grade"] and m["locked"] and m["points"] == 2 and first.startswith("_verdict = attnbook.exercises.check(")
    # the written exercise: a manually graded answer cell after it, holding the model answers
    why = next(cell for cell in source.cells if cell.metadata.get("nbgrader", {}).get("grade_id") == "test-why")
    assert why.cell_type == "markdown" and why.id == "test-why-answer"
    assert why.metadata["nbgrader"] == {"grade": True, "grade_id": "test-why", "locked": False, "points": 1,
                                        "schema_version": 3, "solution": True, "task": False}
    assert source.cells[source.cells.index(why) - 1].source.startswith("Before the written exercise.")
    for answer in ("x = 1", "A second, colon-fenced answer.", "Only a solution in this cell."):
        assert answer in why.source, "the model answers, which generate_assignment replaces"
    assert ":class:" not in why.source and "{solution}" not in why.source
    prompt = course.WRITTEN_PROMPT.format(label="test-why", points=1, unit="point")
    assert why.source.startswith(prompt + "\n\n" + course.BEGIN + "\n")  # the prompt is kept
    assert why.source.endswith("\n" + course.END)  # only the model answer is replaced
    answers = [cell for cell in source.cells if cell.metadata.get("nbgrader", {}).get("solution")
               and cell.cell_type == "code"]
    assert all(course.BEGIN in cell.source for cell in answers), "nbgrader strips the solutions itself"
    assert all("hide-input" not in cell.metadata.get("tags", []) for cell in answers)
    text = "\n".join(cell.source for cell in source.cells)
    assert "{solution}" not in text and "Before the written exercise." in text
    assert all(not cell.get("outputs") for cell in source.cells if cell.cell_type == "code")
    assert nb.cells[4].source == CHECK_DOUBLE, "the book's notebook is not modified"


def test_nbgrader_tests_raise_on_a_wrong_answer_and_pass_on_a_right_one(registry):
    source = course.nbgrader_source(chapter())
    run_cells(source)  # the book's solutions: every assert passes
    wrong = course.nbgrader_source(chapter(double="def double(x):\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION"))
    with pytest.raises(AssertionError) as failed:
        run_cells(wrong)
    # the test cell raises with the check's own verdict and hint: what nbgrader shows
    assert str(failed.value) == exercises.run_check("test-double", lambda x: x + 1).message
    assert "Hint:" in str(failed.value)


def test_nbgrader_source_refuses_a_check_cell_it_cannot_wrap():
    nb = chapter()
    nb.cells[4].source = CHECK_DOUBLE + "\nprint('more')"
    with pytest.raises(ValueError, match="cell 4: a check cell must be one check"):
        course.nbgrader_source(nb, name="ch.ipynb")


def test_cli_nbgrader_writes_one_assignment_per_chapter(tmp_path, capsys):
    book = tmp_path / "book"
    book.mkdir()
    nbformat.write(chapter(), book / "01_first.ipynb")
    nbformat.write(chapter(), book / "02_second.ipynb")
    assert course.main(["nbgrader", str(tmp_path / "source"), "--book", str(book), "--points", "3"]) == 0
    assert "Wrote 2 nbgrader assignments" in capsys.readouterr().out
    for stem in ("01_first", "02_second"):
        written = nbformat.read(tmp_path / "source" / stem / f"{stem}.ipynb", as_version=4)
        assert written == course.nbgrader_source(nbformat.read(book / f"{stem}.ipynb", as_version=4), points=3)


def test_every_book_notebook_exports_to_nbgrader():
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        source = course.nbgrader_source(nb, name=path.name)
        tests = [c for c in source.cells if c.metadata.get("nbgrader", {}).get("grade")]
        auto = [c.metadata["nbgrader"]["grade_id"] for c in tests if c.cell_type == "code"]
        manual = [c.metadata["nbgrader"]["grade_id"] for c in tests if c.cell_type == "markdown"]
        assert auto == course.expected_labels(nb), path.name
        assert manual == list(course.written_exercises(nb)), path.name
        assert all(c.metadata["nbgrader"]["solution"] for c in tests if c.cell_type == "markdown")
        ids = [c.metadata["nbgrader"]["grade_id"] for c in source.cells if "nbgrader" in c.metadata]
        assert len(ids) == len(set(ids)), f"{path.name}: nbgrader grade_ids must be unique"


# ---------------------------------------------------------------------------------------------
# The command line: student bundle
# ---------------------------------------------------------------------------------------------
def test_written_exercises_are_the_unchecked_ones_with_their_model_answers():
    written = course.written_exercises(chapter())
    assert list(written) == ["test-why"]
    assert written["test-why"].startswith("Because of this code:") and "x = 1" in written["test-why"]
    assert "A second, colon-fenced answer." in written["test-why"] and ":class:" not in written["test-why"]
    counts = {p.stem: len(course.written_exercises(nbformat.read(p, as_version=4)))
              for p in sorted((ROOT / "book").glob("*.ipynb"))}
    assert counts["inside_attention"] == 1 and counts["attention"] == 0 and counts["complexity"] == 0


def test_slowest_cell_reads_nbclients_timestamps():
    nb = chapter()
    stamps = [("2026-01-01T00:00:00.000Z", "2026-01-01T00:00:01.500Z"),
              ("2026-01-01T00:00:02.000Z", "2026-01-01T00:00:09.250Z"),
              ("2026-01-01T00:00:10.000Z", "2026-01-01T00:00:10.100Z")]
    for cell, (start, end) in zip([c for c in nb.cells if c.cell_type == "code"], stamps):
        cell.metadata["execution"] = {"iopub.execute_input": start, "shell.execute_reply": end}
    slowest = [c for c in nb.cells if c.cell_type == "code"][1]
    assert course.slowest_cell(nb) == (7.25, slowest.id)
    assert course.slowest_cell(chapter()) == (0.0, None)


def test_cell_timeout_is_a_margin_over_the_slowest_cell_and_never_below_the_graders():
    assert course.cell_timeout({}) == course.MIN_CELL_TIMEOUT == 120
    assert course.cell_timeout({"a": 1.0, "b": 29.0}) == 120
    assert course.cell_timeout({"a": 31.0, "b": 40.0}) == 160
    for worst in (0.5, 30.1, 44.4, 112.1, 500.0):
        timeout = course.cell_timeout({"x": worst})
        assert timeout >= course.TIMEOUT_MARGIN * worst and timeout % 10 == 0 and timeout >= 120


def test_the_book_records_the_slowest_cell_of_every_chapter():
    chapters = {p.stem for p in (ROOT / "book").glob("*.ipynb")}
    assert set(course.SLOWEST_CELL) == chapters
    assert all(seconds > 0 for seconds in course.SLOWEST_CELL.values())


def test_nbgrader_config_is_python_that_sets_the_timeout_and_one_thread(monkeypatch):
    from traitlets.config import Config

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("ATTNBOOK_COMPILE_REPORT", raising=False)
    config = Config()
    text = course.nbgrader_config({"attention": 10.0, "positional": 50.0})
    exec(text, {"get_config": lambda: config})
    assert config.Execute.timeout == 200 and list(config.Execute) == ["timeout"]
    assert "50.0 s (positional)" in text and "attnbook[grading]" in text
    assert os.environ.pop("OMP_NUM_THREADS") == "1"
    assert os.environ.pop("ATTNBOOK_COMPILE_REPORT") == "0"  # no GPU report when grading


def test_make_nbgrader_source_measures_the_timeout_from_executed_notebooks(tmp_path):
    book, executed = tmp_path / "book", tmp_path / "executed"
    book.mkdir(), executed.mkdir()
    nbformat.write(chapter(), book / "ch.ipynb")
    ran = chapter()
    ran.cells[0].metadata["execution"] = {"iopub.execute_input": "2026-01-01T00:00:00Z",
                                          "shell.execute_reply": "2026-01-01T00:01:00Z"}
    nbformat.write(ran, executed / "ch.ipynb")
    written = course.make_nbgrader_source(book, tmp_path / "source", timings_dir=executed)
    assert written == [tmp_path / "source" / "ch" / "ch.ipynb", tmp_path / "source" / "nbgrader_config.py"]
    assert "c.Execute.timeout = 240\n" in written[-1].read_text()
    with pytest.raises(ValueError, match="no cell has execution timestamps"):
        course.make_nbgrader_source(book, tmp_path / "s2", timings_dir=book)
    with pytest.raises(ValueError, match="has no executed ch.ipynb"):
        course.make_nbgrader_source(book, tmp_path / "s3", timings_dir=tmp_path)


def test_a_course_folder_without_book_gets_told_where_to_point(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        course.main(["nbgrader", "source"])
    assert "pass the book/ folder of a clone of the book's repository" in capsys.readouterr().err


def otter_chapter():
    """The tiny chapter with an exercise directive before each coding exercise."""
    nb = chapter()
    at = next(i for i, c in enumerate(nb.cells) if c.get("id") == "clip-answer")
    nb.cells.insert(at, new_markdown_cell(EXERCISE_MD.replace("test-double", "test-clip"), id="clip-text"))
    return nb


def otter_blocks(nb):
    """The master notebook as otter reads it: (kind, first line) per cell."""
    return [(c.cell_type, c.source.split("\n")[0]) for c in nb.cells]


def test_otter_master_wraps_each_exercise_in_a_question():
    nb = otter_chapter()
    master = course.otter_master(nb, name="ch.ipynb", points=3)
    assert master.cells[0].cell_type == "raw" and master.cells[0].source.startswith("# ASSIGNMENT CONFIG\nname: ch\n")
    blocks = otter_blocks(master)
    raws = [first for kind, first in blocks if kind == "raw"]
    assert raws == ["# ASSIGNMENT CONFIG"] + ["# BEGIN QUESTION", "# BEGIN SOLUTION", "# END SOLUTION",
                                             "# BEGIN TESTS", "# END TESTS", "# END QUESTION"] * 2 + [
        "# BEGIN QUESTION", "# BEGIN SOLUTION", "# END SOLUTION", "# END QUESTION"]
    questions = [c.source for c in master.cells if c.source.startswith("# BEGIN QUESTION")]
    assert questions == ["# BEGIN QUESTION\nname: test-double\npoints: 3\ncheck_cell: false",
                         "# BEGIN QUESTION\nname: test-clip\npoints: 3\ncheck_cell: false",
                         "# BEGIN QUESTION\nname: test-why\nmanual: true\npoints: 1"]
    tests = [c.source for c in master.cells if c.source.startswith("_verdict")]
    assert tests == [course.OTTER_TEST.format(label="test-double", answer="double"),
                     course.OTTER_TEST.format(label="test-clip", answer="clip")]
    solutions = [c.source for c in master.cells if c.cell_type == "code" and "BEGIN SOLUTION" in c.source]
    assert len(solutions) == 2 and all("# BEGIN SOLUTION" in s and course.BEGIN not in s for s in solutions)
    assert CHECK_DOUBLE in [c.source for c in master.cells], "the book's check cell stays for the student"
    answer = next(c for c in master.cells if c.get("id") == "test-why-answer")
    assert answer.cell_type == "markdown" and "x = 1" in answer.source
    text = "\n".join(c.source for c in master.cells)
    assert "{solution}" not in text and "Before the written exercise." in text
    assert len({c.id for c in master.cells}) == len(master.cells)
    assert course.otter_master(nb, name="ch.ipynb", points=3) == master, "the same export every time"


def test_otter_master_splits_a_cell_that_holds_two_exercises_and_needs_every_check():
    nb = otter_chapter()
    at = next(i for i, c in enumerate(nb.cells) if c.source.startswith("Before the written exercise."))
    nb.cells[at].source += "\n\n" + EXERCISE_MD.replace("test-double", "test-again")
    nb.cells.insert(at + 1, new_code_cell('attnbook.exercises.check("test-again", double)'))
    master = course.otter_master(nb, name="ch.ipynb")
    questions = [c.source.split("\n")[1] for c in master.cells if c.source.startswith("# BEGIN QUESTION")]
    assert questions == ["name: test-double", "name: test-clip", "name: test-why", "name: test-again"]
    ends = [i for i, c in enumerate(master.cells) if c.source == "# END QUESTION"]
    begins = [i for i, c in enumerate(master.cells) if c.source.startswith("# BEGIN QUESTION")]
    assert all(b < e for b, e in zip(begins, ends)) and all(e < b for e, b in zip(ends, begins[1:]))
    nb = otter_chapter()  # the clip check moved after the next exercise
    check = next(c for c in nb.cells if c.source == CHECK_CLIP)
    nb.cells.remove(check)
    nb.cells.append(check)
    with pytest.raises(ValueError, match="exercise 'test-clip' has no check cell before 'test-why'"):
        course.otter_master(nb, name="ch.ipynb")
    with pytest.raises(ValueError, match="ch.ipynb, cell 6: check 'test-clip' has no exercise before it"):
        course.otter_master(chapter(), name="ch.ipynb")


def test_every_book_notebook_exports_to_otter(tmp_path, capsys):
    assert course.main(["otter", str(tmp_path), "--book", str(ROOT / "book")]) == 0
    assert "otter master notebooks" in capsys.readouterr().out
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        master = nbformat.read(tmp_path / path.stem / path.name, as_version=4)
        names = [c.source.split("\n")[1].removeprefix("name: ") for c in master.cells
                 if c.source.startswith("# BEGIN QUESTION")]
        checked, written = course.expected_labels(nb), list(course.written_exercises(nb))
        assert sorted(names) == sorted(checked + written), path.name
        opens = sum(c.source.startswith("# BEGIN QUESTION") for c in master.cells)
        assert opens == sum(c.source == "# END QUESTION" for c in master.cells), path.name
        assert "attnbook[grading] @ git+" in (tmp_path / path.stem / "requirements.txt").read_text()


def test_cli_student_writes_notebooks_and_readme(tmp_path, capsys):
    book = tmp_path / "book"
    book.mkdir()
    nbformat.write(chapter(), book / "01_first.ipynb")
    nbformat.write(new_notebook(cells=[new_markdown_cell("No exercises.")]), book / "02_second.ipynb")
    (book / "notes.md").write_text("not a notebook")
    assert course.main(["student", str(tmp_path / "out"), "--book", str(book)]) == 0
    assert "Wrote 2 student notebooks" in capsys.readouterr().out
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["01_first.ipynb", "02_second.ipynb", "README.md"]
    written = nbformat.read(out / "01_first.ipynb", as_version=4)
    assert written == course.strip_solutions(nbformat.read(book / "01_first.ipynb", as_version=4))
    readme = (out / "README.md").read_text()
    for needed in ["NotImplementedError", "[PASSED]", "[FAILED]", "Colab", "jupyter lab", "Submitting"]:
        assert needed in readme


def test_cli_student_reports_unbalanced_markers(tmp_path, capsys):
    nbformat.write(chapter(double="### BEGIN SOLUTION\nx = 1"), tmp_path / "bad.ipynb")
    with pytest.raises(SystemExit) as exit_info:
        course.main(["student", str(tmp_path / "out"), "--book", str(tmp_path)])
    assert exit_info.value.code == 1
    assert "bad.ipynb, cell 3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        course.main(["student", str(tmp_path / "out"), "--book", str(tmp_path / "missing")])


def test_python_dash_m_entry_point(tmp_path):
    nbformat.write(chapter(), tmp_path / "01.ipynb")
    done = subprocess.run([sys.executable, "-m", "attnbook.course", "student", str(tmp_path / "s"),
                           "--book", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "s" / "01.ipynb").exists() and (tmp_path / "s" / "README.md").exists()


# ---------------------------------------------------------------------------------------------
# Grading (real kernels)
# ---------------------------------------------------------------------------------------------
def student_version(**answers):
    """A submission: the student notebook with the stubs replaced by ``answers`` (cell index -> source)."""
    nb = course.strip_solutions(chapter(between=answers.pop("between", ())))
    for index, source in answers.items():
        nb.cells[int(index.lstrip("c"))].source = source
    return nb


CORRECT_DOUBLE = "def double(x):\n    return x * 2"
CORRECT_CLIP = "def clip(values, low, high):\n    return [min(max(v, low), high) for v in values]"


@pytest.fixture(scope="module")
def test_checks():
    """The fixture chapter's two checks, registered in this process (where the grader runs
    checks) for the module's tests, removed after."""
    namespace = {}
    exec(SETUP.replace("import attnbook.exercises as ex", ""), {"ex": exercises, **namespace})
    yield
    for label in ("test-double", "test-clip"):
        exercises.CHECKS.pop(label, None)


@pytest.fixture(scope="module")
def graded(tmp_path_factory, test_checks):
    """Grade five submissions through the CLI; returns (rows read from the CSV, printed summary, feedback dir)."""
    root = tmp_path_factory.mktemp("grading")
    subs = root / "submissions"
    (subs / "alice").mkdir(parents=True)
    (subs / "bob" / "work").mkdir(parents=True)
    # alice: both answers right
    nbformat.write(student_version(c3=CORRECT_DOUBLE, c5=CORRECT_CLIP), subs / "alice" / "ch.ipynb")
    # bob: a wrong answer, and a cell of his own that raises: the book's cells run, not his
    nbformat.write(student_version(c3="def double(x):\n    return x + 1", c6=CORRECT_CLIP,
                                   between=["raise RuntimeError('boom')"]), subs / "bob" / "work" / "ch.ipynb")
    # carol (a file directly in the folder, named as Canvas names downloads): the first answer is right,
    # the second sleeps past the timeout
    nbformat.write(student_version(c3=CORRECT_DOUBLE, c5="import time\ntime.sleep(120)\n" + CORRECT_CLIP),
                   subs / "carol_ch.ipynb")
    # dave: deleted the second check cell; the book's check runs anyway
    dave = student_version(c3=CORRECT_DOUBLE, c5=CORRECT_CLIP)
    dave.cells = [cell for cell in dave.cells if cell.source != CHECK_CLIP]
    (subs / "dave").mkdir()
    nbformat.write(dave, subs / "dave" / "ch.ipynb")
    # erin: answers nothing, and replaced both check cells by prints of a pass
    erin = student_version()
    for cell in erin.cells:
        if "check(" in cell.source:
            cell.source = 'print("[PASSED] test-double: passed")'
    (subs / "erin").mkdir()
    nbformat.write(erin, subs / "erin" / "ch.ipynb")
    (root / "book").mkdir()
    nbformat.write(chapter(), root / "book" / "ch.ipynb")
    out = root / "grades.csv"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert course.main(["grade", str(subs), "--out", str(out), "--timeout", "8", "--jobs", "2",
                            "--book", str(root / "book")]) == 0
    with out.open(newline="") as f:
        return list(csv.DictReader(f)), printed.getvalue(), root / "feedback", root / "gradebook.csv"


def by_key(rows):
    return {(r["student"], r["notebook"], r["label"]): (r["passed"], r["message"]) for r in rows}


def test_grade_csv_has_one_row_per_student_notebook_and_check(graded):
    rows = graded[0]
    assert list(rows[0]) == grader.CSV_FIELDS
    keys = [(r["student"], r["notebook"], r["label"]) for r in rows if r["label"] != "*"]
    assert sorted(keys) == sorted([
        (student, notebook, label)
        for student, notebook in [("alice", "ch.ipynb"), ("bob", "work/ch.ipynb"), ("carol", "ch.ipynb"),
                                  ("dave", "ch.ipynb"), ("erin", "ch.ipynb")]
        for label in ("test-double", "test-clip")
    ])


def test_grade_records_passes_failures_and_hints(graded):
    rows = by_key(graded[0])
    assert rows["alice", "ch.ipynb", "test-double"] == ("1", "passed")
    assert rows["alice", "ch.ipynb", "test-clip"] == ("1", "passed")
    passed, message = rows["bob", "work/ch.ipynb", "test-double"]
    assert passed == "0" and "should be " in message and "got " in message and "Hint: multiply by two" in message
    assert rows["bob", "work/ch.ipynb", "test-clip"] == ("1", "passed")
    passed, message = rows["bob", "work/ch.ipynb", "*"]
    assert "added 1" in message and "the book's cells ran instead" in message


def test_grade_interrupts_a_slow_answer_without_losing_the_other_checks(graded):
    rows = by_key(graded[0])
    assert rows["carol", "ch.ipynb", "test-double"] == ("1", "passed")
    passed, message = rows["carol", "ch.ipynb", "test-clip"]
    assert passed == "0" and message.startswith(f"{grader.NOT_RUN}: NameError")
    assert "your answer cell raised the cell ran longer than 8 s; it was interrupted" in message


def test_grade_runs_the_books_checks_whatever_the_submission_did_to_its_check_cells(graded):
    rows = by_key(graded[0])
    assert rows["dave", "ch.ipynb", "test-clip"] == ("1", "passed")  # the deleted check ran
    assert "deleted 1" in rows["dave", "ch.ipynb", "*"][1]
    assert rows["erin", "ch.ipynb", "test-double"][0] == rows["erin", "ch.ipynb", "test-clip"][0] == "0"
    assert "not attempted" in rows["erin", "ch.ipynb", "test-double"][1]


def test_grade_prints_a_summary(graded):
    printed = graded[1]
    assert "Graded 5 notebooks in " in printed and ": 6/10 checks passed" in printed
    assert "alice: 2/2 checks passed" in printed and "bob: 1/2 checks passed" in printed
    assert "carol: 1/2 checks passed" in printed and "erin: 0/2 checks passed" in printed
    assert "[5/5]" in printed  # progress, one line per notebook


def test_grade_writes_one_feedback_file_per_student(graded):
    feedback = graded[2]
    assert sorted(p.name for p in feedback.iterdir()) == ["alice.md", "bob.md", "carol.md", "dave.md", "erin.md"]
    alice = (feedback / "alice.md").read_text()
    assert alice.startswith("# Feedback for alice\n") and "2 of 2 checks passed" in alice
    assert "## ch.ipynb: 2/2 checks passed" in alice and "- `[PASSED] test-double`: passed" in alice
    bob = (feedback / "bob.md").read_text()
    assert "## work/ch.ipynb: 1/2 checks passed" in bob
    assert "- `[FAILED] test-double`: double(" in bob and "Hint: multiply by two" in bob
    assert "- Note: cells outside your answers differ" in bob
    carol = (feedback / "carol.md").read_text()
    assert f"- `[FAILED] test-clip`: {grader.NOT_RUN}" in carol
    assert "alice" not in bob and "bob" not in alice, "a student sees only their own results"


def test_gradebook_has_one_row_per_student_and_points_per_chapter(graded):
    with graded[3].open(newline="") as f:
        table = list(csv.reader(f))
    assert table[0] == ["Student", "ch (2)", "Total (2)"]
    assert sorted(table[1:]) == [["alice", "2", "2"], ["bob", "1", "1"], ["carol", "1", "1"], ["dave", "2", "2"],
                                 ["erin", "0", "0"]]


def test_gradebook_points_come_from_the_chapters_metadata_and_cells_are_never_formulas(tmp_path):
    nb = chapter()
    nb.metadata["attnbook"] = {"points": {"test-double": 2.5, "test-clip": 1}}
    chapters = {"ch.ipynb": grader.Chapter.from_notebook(nb, "ch.ipynb"),
                "other.ipynb": grader.Chapter.from_notebook(chapter(), "other.ipynb")}
    rows = [{"student": s, "notebook": n, "label": label, "passed": p, "status": "", "message": ""}
            for s, n, label, p in [("=HYPERLINK(1)", "ch.ipynb", "test-double", 1),
                                   ("=HYPERLINK(1)", "ch.ipynb", "test-clip", 0),
                                   ("ada", "other.ipynb", "test-clip", 1), ("ada", "other.ipynb", "*", 0)]]
    grader.write_gradebook(rows, chapters, tmp_path / "book.csv")
    with (tmp_path / "book.csv").open(newline="") as f:
        table = list(csv.reader(f))
    assert table == [["Student", "ch (3.5)", "other (2)", "Total (5.5)"],
                     ["'=HYPERLINK(1)", "2.5", "", "2.5"], ["ada", "", "1", "1"]]
    nb.metadata["attnbook"] = {"points": {"test-typo": 1}}
    with pytest.raises(ValueError, match="test-typo"):
        grader.Chapter.from_notebook(nb, "ch.ipynb")


def test_every_chapter_lists_the_points_of_each_of_its_checks_and_written_exercises():
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        points = nb.metadata.get("attnbook", {}).get("points", {})
        every = course.expected_labels(nb) + list(course.written_exercises(nb))
        assert list(points) == every, f"{path.name}: metadata.attnbook.points"
        assert all(isinstance(p, (int, float)) and p > 0 for p in points.values()), path.name


def test_feedback_file_names_are_safe(tmp_path):
    rows = [{"student": name, "notebook": "a.ipynb", "label": "x", "passed": 1, "status": "passed",
             "message": "passed"} for name in ["../../etc/passwd", "Ada Lovelace", "émile", "Ada?Lovelace"]]
    written = course.write_feedback(rows, tmp_path / "fb")
    assert [p.name for p in written] == ["etc_passwd.md", "Ada_Lovelace.md", "émile.md", "Ada_Lovelace-2.md"]
    assert all(p.parent == tmp_path / "fb" for p in written)


def test_grade_survives_a_dead_kernel_an_unreadable_file_and_a_notebook_that_is_no_chapter(tmp_path, test_checks):
    nbformat.write(student_version(c3=CORRECT_DOUBLE, c5="import os\nos._exit(1)"), tmp_path / "crash.ipynb")
    (tmp_path / "broken.ipynb").write_text("{not json")
    nbformat.write(student_version(), tmp_path / "stranger.ipynb")
    (tmp_path / "book").mkdir()
    for name in ("crash", "broken"):
        nbformat.write(chapter(), tmp_path / "book" / f"{name}.ipynb")
    rows = course.grade([tmp_path / f"{n}.ipynb" for n in ("crash", "broken", "stranger")], tmp_path / "g.csv",
                        book_dir=tmp_path / "book", limits=sandbox.Limits(cell_timeout=30))
    got = {(r["student"], r["label"]): (r["passed"], r["status"], r["message"]) for r in rows}
    assert got["crash", "test-double"] == (1, "passed", "passed")
    assert got["crash", "test-clip"] == (0, "not run", grader.NOT_RUN)
    assert got["crash", "*"][:2] == (0, "error") and "the kernel died, exit code 1" in got["crash", "*"][2]
    assert got["broken", "*"][:2] == (0, "error") and got["broken", "*"][2].startswith("not a notebook")
    assert got["broken", "test-double"] == (0, "not run", grader.NOT_RUN)
    assert got["stranger", "*"] == (0, "error", "no chapter of the book is named 'stranger.ipynb': not graded")
    assert len(rows) == 7
    with (tmp_path / "g.csv").open(newline="") as f:
        assert len(list(csv.DictReader(f))) == 7


# ---------------------------------------------------------------------------------------------
# Day one, as an instructor: a real chapter, its bundle, two submissions, the grades
# ---------------------------------------------------------------------------------------------
def test_instructor_day_one_with_chapter_one(tmp_path):
    """Bundle Chapter 1, hand in one right and one broken notebook, grade them: CSV and feedback agree."""
    bundle, subs = tmp_path / "bundle", tmp_path / "submissions"
    assert course.main(["student", str(bundle), "--book", str(ROOT / "book")]) == 0
    blank = nbformat.read(bundle / "attention.ipynb", as_version=4)
    book = {cell.get("id"): cell for cell in nbformat.read(ROOT / "book" / "attention.ipynb", as_version=4).cells}
    stubbed = [cell for cell in blank.cells if course.STUB in cell.source]
    assert len(stubbed) >= 2, "Chapter 1 should have at least two coding exercises"
    labels = course.expected_labels(blank)

    ada = nbformat.from_dict(json.loads(json.dumps(blank)))  # every stub answered as the book does
    for cell in ada.cells:
        if course.STUB in cell.source:
            cell.source = book[cell.get("id")].source
    bob = nbformat.from_dict(json.loads(json.dumps(blank)))  # a wrong first answer, the rest left as stubs
    first = next(cell for cell in bob.cells if course.STUB in cell.source)
    first.source = first.source.replace(course.STUB, "return scores.softmax(-1)  # forgot the mask and temperature")
    for name, nb in [("ada", ada), ("bob", bob)]:
        (subs / name).mkdir(parents=True)
        nbformat.write(nb, subs / name / "attention.ipynb")

    out = tmp_path / "grades.csv"
    assert course.main(["grade", str(subs), "--out", str(out), "--book", str(ROOT / "book"), "--timeout", "120", "--jobs", "2"]) == 0
    with out.open(newline="") as f:
        rows = {(r["student"], r["label"]): (r["passed"], r["message"]) for r in csv.DictReader(f)}
    assert set(rows) == {(student, label) for student in ("ada", "bob") for label in labels}, "no crash rows"
    assert all(rows["ada", label] == ("1", "passed") for label in labels)
    verdict, message = rows["bob", labels[0]]
    assert verdict == "0" and "Hint:" in message
    # carl's second answer does not parse: its check cell cannot find the function, and says so
    carl = nbformat.from_dict(json.loads(json.dumps(ada)))
    broken = [cell for cell in carl.cells if cell.get("id") == stubbed[1].get("id")][0]
    broken.source = broken.source.replace("### BEGIN SOLUTION", "x = (  # unfinished\n    ### BEGIN SOLUTION", 1)
    (subs / "carl").mkdir()
    nbformat.write(carl, subs / "carl" / "attention.ipynb")
    carl_rows = {r["label"]: r for r in course.grade([subs / "carl"], tmp_path / "carl.csv", book_dir=ROOT / "book")}
    assert carl_rows[labels[0]]["passed"] == 1
    message = carl_rows[labels[1]]["message"]
    assert message.startswith(f"{grader.NOT_RUN}: NameError: name ") and "your answer cell raised SyntaxError" in message
    assert all(rows["bob", label][0] == "0" and "not attempted" in rows["bob", label][1] for label in labels[1:])
    assert f"{len(labels)} of {len(labels)} checks passed" in (tmp_path / "feedback" / "ada.md").read_text()
    assert f"0 of {len(labels)} checks passed" in (tmp_path / "feedback" / "bob.md").read_text()
