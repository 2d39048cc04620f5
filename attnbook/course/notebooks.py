"""Notebook editing for the course kit: the student notebooks (solutions stubbed
out), the exercises of a chapter as the graders see them (its checks, its written
exercises, its slowest cell), and the exports to the graders instructors already run:
nbgrader (JupyterHub) source notebooks with their configuration, and otter-grader
(Gradescope) master notebooks."""

from __future__ import annotations

import ast
import copy
import importlib
import math
import re
from pathlib import Path

from .. import __version__
from . import sandbox

__all__ = [
    "CHECK_CALL",
    "HIDDEN",
    "require",
    "hidden_checks",
    "strip_solutions",
    "make_student_bundle",
    "expected_labels",
    "written_exercises",
    "rubrics",
    "slowest_cell",
    "cell_timeout",
    "nbgrader_config",
    "nbgrader_source",
    "make_nbgrader_source",
    "otter_master",
    "make_otter_masters",
]

# A check call in a code cell: check("label", ...) or attnbook.exercises.check('label',
# ...).
CHECK_CALL = re.compile(r"""\bcheck\(\s*(["'])([^"'\n]+)\1""")


def require(module: str):
    """Import one of the ``course`` extra's packages, or say how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:  # pragma: no cover - the test environment has the extra
        raise ImportError(
            f"the course kit needs {module}; install the course extra: pip install "
            "'attnbook[course]'"
        ) from err


BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
#: The tag of a *hidden test*: a check cell the graders run and the students never see
#: (the student notebooks, the student edition and nbgrader's and otter's student
#: notebooks leave it out). It follows the check cell of the same exercise, and its
#: label is that check's label with ``-hidden`` added.
HIDDEN = "hidden-tests"
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
STUB = 'raise NotImplementedError("Exercise: write your solution here")'
# The opening line of a written solution: ```{solution} label  or  :::{solution} label
_SOLUTION_OPEN = re.compile(r"^\s*(?P<fence>`{3,}|:{3,})\s*\{solution\}")

STUDENT_README = """\
# Exercises: the student notebooks

Each notebook here is one chapter of *Attention, from first principles to GPU kernels*
with the exercise solutions taken out. Where a solution was, a cell now says

    raise NotImplementedError("Exercise: write your solution here")

Replace that line with your code; keep the function's name and signature.

## Opening the notebooks
- **Locally**: `pip install "attnbook[course]"` (or, in a clone of the book's
  repository, `pip install -e ".[course]"`), then `jupyter lab` in this folder and open
  a chapter.
- **In Colab**: *File -> Upload notebook*. The first cell of every notebook installs
  `attnbook` when it is missing; run it first.

Run the notebook from the top (*Run -> Run All Cells*): later cells use what earlier
cells define.

## What the checks print
After each coding exercise a cell calls `attnbook.exercises.check("<label>",
your_answer)` and prints one line:
- `[PASSED] <label>: passed` - your answer agrees with the book's tested
  implementation;
- `[FAILED] <label>: not attempted yet ...` - the `raise NotImplementedError` is still
  there;
- `[FAILED] <label>: <what differs> Hint: <a hint>` - a wrong answer, or your code
  raised an error.
A check never stops the notebook, so you see every verdict in one run.

## What is graded
Only your **answer cells** (the cells that held `raise NotImplementedError`) are graded.
The grader takes them out of your notebook, puts them into the book's own copy of the
chapter, runs that in a fresh kernel, and checks your functions on new random inputs.
So:
- write your whole answer inside the answer cell: helper functions too; code in cells
  you added, and changes to other cells, are not used;
- keep the answer cell where it is and do not delete it (it is found by its cell id, or
  by its first line, such as `def my_masked_softmax(...)`);
- your answer must work for any inputs of the kind the exercise describes, not only the
  ones in the notebook;
- answer cells that touch the grading machinery (`attnbook.exercises`) are not scored.

## Submitting
1. Restart the kernel and run all cells, so the notebook runs top to bottom without your
   help.
2. Save it under its original file name (e.g. `attention.ipynb`).
3. Hand in your notebooks in a folder named after you, e.g.
   `ada_lovelace/attention.ipynb`.

Each cell, and each call of your function by a check, has a time limit (120 s by
default), and the whole notebook one too. Every check is recorded: passed, failed, or
"check did not run" when your function was not defined or the notebook stopped first.
"""


# --------------------------------------------------------------------------------------
# Student notebooks
# --------------------------------------------------------------------------------------
def _strip_code(source: str, where: str) -> tuple[str, bool]:
    """Replace each ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` block by the stub.

    The stub takes the BEGIN marker's indentation. Returns the new source and whether
    any block was found; an unbalanced or nested marker raises ``ValueError`` naming
    ``where``.
    """
    out: list[str] = []
    begin_line = None  # 1-based line of the open BEGIN marker, None outside a block
    found = False
    for number, line in enumerate(source.split("\n"), start=1):
        marker = line.strip()
        if marker == BEGIN:
            if begin_line is not None:
                raise ValueError(
                    f"{where}: line {number}: {BEGIN} inside the block opened on line "
                    f"{begin_line}"
                )
            begin_line, found = number, True
            out.append(line[: len(line) - len(line.lstrip())] + STUB)
        elif marker == END:
            if begin_line is None:
                raise ValueError(
                    f"{where}: line {number}: {END} without a {BEGIN} before it"
                )
            begin_line = None
        elif begin_line is None:
            out.append(line)
    if begin_line is not None:
        raise ValueError(f"{where}: line {begin_line}: {BEGIN} has no {END}")
    return "\n".join(out), found


def _strip_written_solutions(source: str) -> str:
    """Remove every ``{solution}`` directive (fenced with backticks or colons) from
    markdown."""
    out: list[str] = []
    fence = None  # the opening fence while inside a solution directive
    for line in source.split("\n"):
        if fence is None:
            match = _SOLUTION_OPEN.match(line)
            if match:
                fence = match["fence"]
            else:
                out.append(line)
        elif re.fullmatch(rf"\s*{re.escape(fence[0])}{{{len(fence)},}}\s*", line):
            fence = None  # the closing fence: same character, at least as long
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip("\n")


def _is_hidden(cell) -> bool:
    tags = cell.get("metadata", {}).get("tags", [])
    return cell.cell_type == "code" and HIDDEN in tags


def hidden_checks(nb, name: str = "notebook") -> dict[str, tuple[str, str]]:
    """``{public label: (hidden label, answer expression)}`` for the hidden tests of
    ``nb`` (cells tagged :data:`HIDDEN`).

    Raises ``ValueError`` naming ``name`` and the cell for a hidden test that is not one
    ``check("<label>-hidden", answer)`` call right after the code cell that checks
    ``<label>`` (so each stays beside its exercise in every export).
    """
    found, previous = {}, None  # previous: the label the last code cell checks
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        checked = CHECK_CALL.search(cell.source)
        if _is_hidden(cell):
            where = f"{name}, cell {index}"
            call = _one_check_call(cell, where) if checked else None
            if call is None or not call[0].endswith("-hidden"):
                raise ValueError(
                    f"{where}: a cell tagged {HIDDEN!r} must be one "
                    "check('<label>-hidden', answer) call"
                )
            public = call[0].removesuffix("-hidden")
            if previous != public or public in found:
                raise ValueError(
                    f"{where}: hidden test {call[0]!r} must follow the check cell of "
                    f"{public!r}"
                )
            found[public] = call
        previous = checked[2] if checked else None
    return found


def strip_solutions(nb, name: str = "notebook", *, keep_hidden: bool = False):
    """The student version of notebook ``nb`` (an nbformat v4 notebook; ``nb`` is not
    modified).

    - code cells: each ``### BEGIN SOLUTION`` / ``### END SOLUTION`` block becomes
      ``raise NotImplementedError("Exercise: write your solution here")`` at the
      marker's indentation; outputs and execution counts are cleared;
    - cells tagged ``solution`` lose the ``hide-input`` tag, so the student sees the
      stub;
    - markdown cells lose their ``{solution}`` directives (a cell left empty is
      dropped);
    - hidden tests (cells tagged :data:`HIDDEN`) are left out, with their points in
      the metadata, unless ``keep_hidden`` (the grader keeps them: it runs the book's
      cells with the student's answers);
    - everything else, the exercise text and the ``check(...)`` cells included, is kept.

    Raises ``ValueError`` naming ``name`` and the cell for an unbalanced marker, or for
    a cell tagged ``solution`` without markers (the student would see the answer).
    """
    hidden = hidden_checks(nb, name)  # a malformed one raises before anything is made
    student = copy.deepcopy(nb)
    points = student.metadata.get("attnbook", {}).get("points", {})
    for secret, _ in [] if keep_hidden else hidden.values():
        points.pop(secret, None)  # not even the hidden tests' names
    cells = []
    for index, cell in enumerate(student.cells):
        where = f"{name}, cell {index}" + (
            f" (id {cell['id']})" if cell.get("id") else ""
        )
        tags = cell.get("metadata", {}).get("tags", [])
        if _is_hidden(cell) and not keep_hidden:
            continue
        if cell.cell_type == "code":
            cell.source, stubbed = _strip_code(cell.source, where)
            if "solution" in tags:
                if not stubbed:
                    raise ValueError(
                        f"{where}: tagged 'solution' but has no {BEGIN} / {END} block"
                    )
                cell.metadata["tags"] = [tag for tag in tags if tag != "hide-input"]
            cell.outputs = []
            cell.execution_count = None
            cell.metadata.pop("execution", None)
        elif cell.cell_type == "markdown":
            cell.source = _strip_written_solutions(cell.source)
            if not cell.source.strip():
                continue
        cells.append(cell)
    student.cells = cells
    return student


def make_student_bundle(book_dir="book", out_dir="student") -> list[Path]:
    """Write the student version of every ``book_dir/*.ipynb`` and a README into
    ``out_dir``.

    Returns the paths written, notebooks first (sorted), then ``README.md``.
    """
    nbformat = require("nbformat")
    notebooks = _chapters(book_dir)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in notebooks:
        student = strip_solutions(nbformat.read(path, as_version=4), name=path.name)
        nbformat.write(student, out_dir / path.name)
        written.append(out_dir / path.name)
    readme = out_dir / "README.md"
    readme.write_text(STUDENT_README)
    written.append(readme)
    return written


# --------------------------------------------------------------------------------------
# Exercises as the graders see them: checks, written answers, the slowest cells
# --------------------------------------------------------------------------------------
# The opening line of an exercise and its label option
_EXERCISE_OPEN = re.compile(r"^\s*(?P<fence>`{3,}|:{3,})\s*\{exercise\}")
_LABEL = re.compile(r"^\s*:label:\s*(?P<label>\S+)")


def _chapters(book_dir) -> list[Path]:
    """The chapter notebooks of ``book_dir``, sorted; a ``ValueError`` that says where
    to point ``--book`` when there are none."""
    notebooks = sorted(Path(book_dir).glob("*.ipynb"))
    if not notebooks:
        raise ValueError(
            f"book_dir {str(book_dir)!r} has no *.ipynb notebooks: pass the book/ "
            "folder of a clone of the book's repository (--book path/to/book)"
        )
    return notebooks


def _directives(source: str, opening: re.Pattern) -> list[tuple[str, str, str]]:
    """``(argument, label, body)`` of each directive of ``source`` whose opening line
    matches ``opening``: the text after ``{name}``, its ``:label:`` option ('' if
    none), and the text between the fences without the options."""
    found, lines, index = [], source.split("\n"), 0
    while index < len(lines):
        match = opening.match(lines[index])
        index += 1
        if not match:
            continue
        fence, label, body = match["fence"], "", []
        closing = re.compile(rf"\s*{re.escape(fence[0])}{{{len(fence)},}}\s*")
        while index < len(lines) and not closing.fullmatch(lines[index]):
            option = _LABEL.match(lines[index])
            if option:
                label = option["label"]
            elif body or not re.match(r"^\s*:\w[\w-]*:", lines[index]):
                body.append(lines[index])
            index += 1
        index += 1  # the closing fence
        argument = match.string[match.end() :].strip()
        found.append((argument, label, "\n".join(body).strip("\n")))
    return found


# A written exercise's rubric: the end of its {solution} directive, from this line on
# (instructor-only, as the directive is), e.g. "**Rubric** (2 points)" then a list
# "- **Full (2 points)**: ...", "- **Partial (1 point)**: ...", "- **Missing (0
# points)**: ..." of what each answer contains.
RUBRIC_HEADING = re.compile(
    r"^\*\*Rubric\*\* \((?P<points>\d+(?:\.\d+)?) points?\)\s*$"
)


def _split_rubric(body: str) -> tuple[str, str]:
    """``(model answer, rubric)`` of a ``{solution}`` directive's ``body``: the rubric
    from its heading line (``RUBRIC_HEADING``) to the end ('' if none)."""
    lines = body.split("\n")
    at = next((i for i, line in enumerate(lines) if RUBRIC_HEADING.match(line)), None)
    if at is None:
        return body.strip("\n"), ""
    return "\n".join(lines[:at]).strip("\n"), "\n".join(lines[at:]).strip("\n")


def _written(nb) -> dict[str, tuple[str, str]]:
    """label -> ``(model answer, rubric)`` of each written exercise of ``nb``."""
    checked = set(expected_labels(nb))
    exercises, solutions = [], {}
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        exercises += [lab for _, lab, _ in _directives(cell.source, _EXERCISE_OPEN)]
        for argument, _, body in _directives(cell.source, _SOLUTION_OPEN):
            model, rubric = _split_rubric(body)
            old_model, old_rubric = solutions.get(argument, ("", ""))
            solutions[argument] = (
                "\n\n".join(filter(None, [old_model, model])),
                "\n\n".join(filter(None, [old_rubric, rubric])),
            )
    return {
        label: solutions.get(label, ("", ""))
        for label in exercises
        if label not in checked
    }


def written_exercises(nb) -> dict[str, str]:
    """The exercises of ``nb`` that no ``check(...)`` cell grades: label -> the model
    answer written in the chapter's ``{solution}`` directive, without its rubric ('' if
    it has none), in order of appearance."""
    return {label: model for label, (model, _) in _written(nb).items()}


def rubrics(nb) -> dict[str, str]:
    """label -> the rubric of each written exercise of ``nb`` ('' if it has none), in
    order of appearance: the end of its ``{solution}`` directive from the line
    ``**Rubric** (N points)`` (``RUBRIC_HEADING``) on, a list of what a full, a partial
    and a missing answer contains. Instructor-only, as the directive is: the student
    notebooks and the student edition drop it, the nbgrader and otter exports show it
    to the grader alone (see :func:`nbgrader_source` and :func:`otter_master`)."""
    return {label: rubric for label, (_, rubric) in _written(nb).items()}


def _exercise_points(nb, label: str, points: float | None = None) -> float:
    """``points`` if given, else the label's points in ``metadata.attnbook.points``
    (1 where the chapter lists none)."""
    if points is not None:
        return points
    return nb.metadata.get("attnbook", {}).get("points", {}).get(label, 1)


def slowest_cell(nb) -> tuple[float, str | None]:
    """``(seconds, cell id)`` of the slowest code cell of an *executed* notebook ``nb``,
    from the timestamps nbclient records in each cell's ``metadata.execution``
    (``iopub.execute_input`` to ``shell.execute_reply``); ``(0.0, None)`` when no
    cell has them."""
    from datetime import datetime

    best: tuple[float, str | None] = (0.0, None)
    for cell in nb.cells:
        stamps = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in stamps and "shell.execute_reply" in stamps:
            start, end = (
                datetime.fromisoformat(stamps[key].replace("Z", "+00:00"))
                for key in ("iopub.execute_input", "shell.execute_reply")
            )
            seconds = (end - start).total_seconds()
            if seconds > best[0]:
                best = (seconds, cell.get("id"))
    return best


# The slowest cell of each chapter, in seconds, measured with slowest_cell() on the
# chapters executed one at a time by nbclient with one PyTorch thread, on a 2-core CPU
# that other jobs kept busy (load average 4-6), so about 2-3 times what an idle machine
# takes (2026-11-25). `python -m attnbook.course nbgrader --timings DIR` measures them
# again from notebooks executed where you grade.
SLOWEST_CELL = {
    "attention": 1.4,
    "complexity": 24.8,
    "connections": 9.2,
    "distributed": 55.2,
    "flash": 6.9,
    "graph_attention": 9.6,
    "inside_attention": 6.8,
    "kernel_lab": 7.9,
    "kv_cache": 23.2,
    "linear": 4.1,
    "positional": 112.1,
    "rnn_attention": 20.6,
    "serving": 41.2,
    "sparse": 11.3,
    "transformer": 69.8,
    "vision_attention": 28.4,
}
# A grading machine runs several kernels at once, and a student's answer may be slower
# than the book's: a cell may take this many times the slowest cell measured, and never
# less than the book's own grader allows a cell.
TIMEOUT_MARGIN = 4
MIN_CELL_TIMEOUT = sandbox.Limits().cell_timeout


def cell_timeout(slowest: dict[str, float]) -> int:
    """Seconds per cell for chapters whose slowest cells took ``slowest`` (chapter ->
    seconds): ``TIMEOUT_MARGIN`` times the slowest, rounded up to 10 s, at least
    ``MIN_CELL_TIMEOUT``."""
    worst = max(slowest.values(), default=0.0)
    return max(int(MIN_CELL_TIMEOUT), 10 * math.ceil(TIMEOUT_MARGIN * worst / 10))


NBGRADER_CONFIG = """\
# nbgrader settings for the chapters of "Attention, from first principles to GPU
# kernels", written by `python -m attnbook.course nbgrader` (attnbook {version}).
# Copy this file into your nbgrader course folder, or add its lines to the
# nbgrader_config.py there.
import os

c = get_config()  # noqa: F821 (nbgrader defines it)

# Seconds per cell under `nbgrader autograde` and `validate`. nbgrader's default, 30 s,
# is too short: the slowest cell of these chapters took {worst:.1f} s ({chapter}) on a
# 2-core CPU with one PyTorch thread; this is {margin} times that, at least {floor:g} s.
c.Execute.timeout = {timeout}

# The kernel that runs the notebooks needs attnbook and every package its chapters
# import (scikit-learn, networkx, triton, ...): install them where the kernel runs,
#   pip install "attnbook[grading] @ git+{url}@v{version}"
# One PyTorch thread per kernel: the chapters' models are tiny, and two threads per
# kernel on a shared machine made them 10-30 times slower. Kernels inherit this.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# No compile report after a kernel lab check passes (several seconds per kernel): a
# grader needs the verdict alone.
os.environ.setdefault("ATTNBOOK_COMPILE_REPORT", "0")

# The rubric of each written exercise is in a read-only cell after its answer cell,
# between "=== BEGIN MARK SCHEME ===" and "=== END MARK SCHEME ===". generate_assignment
# takes it out of the students' notebooks (ClearMarkScheme) and autograde puts it back
# from the gradebook, as it does every read-only cell, so the formgrader shows it.
# nbgrader looks for mark schemes in task cells only unless told otherwise:
c.ClearMarkScheme.enforce_metadata = False
# and the feedback the students get leaves it out too (nbgrader's default shows it):
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.ClearMarkScheme",
    "nbgrader.preprocessors.GetGrades",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
"""
REPOSITORY = "https://github.com/attnbook/attention-book"


def nbgrader_config(slowest: dict[str, float]) -> str:
    """The text of an ``nbgrader_config.py`` for chapters whose slowest cells took
    ``slowest`` (chapter -> seconds): ``Execute.timeout`` from :func:`cell_timeout`,
    the kernel's environment documented, one PyTorch thread."""

    chapter = max(slowest, key=slowest.get) if slowest else "no chapter"
    return NBGRADER_CONFIG.format(
        version=__version__,
        worst=slowest.get(chapter, 0.0),
        chapter=chapter,
        margin=TIMEOUT_MARGIN,
        floor=MIN_CELL_TIMEOUT,
        timeout=cell_timeout(slowest),
        url=REPOSITORY,
    )


# --------------------------------------------------------------------------------------
# nbgrader source notebooks
# --------------------------------------------------------------------------------------
NBGRADER_SCHEMA = 3
# What a test cell runs: the check prints its verdict, and a failed one raises with it,
# so `nbgrader validate` and the feedback show the check's own message and hint.
NBGRADER_TEST = "_verdict = {call}\nassert _verdict, _verdict.message"
WRITTEN_PROMPT = (
    "**Your answer to the written exercise `{label}`** ({points:g} {unit}):"
)
# nbgrader's mark-scheme region (ClearMarkScheme's delimiters are "BEGIN MARK SCHEME"
# and "END MARK SCHEME", found anywhere in a line), and the line of the rubric cell
# that the students see.
MARK_SCHEME = ("=== BEGIN MARK SCHEME ===", "=== END MARK SCHEME ===")
RUBRIC_NOTE = "*Your answer to `{label}` is graded by hand against a rubric.*"


def _nbgrader_meta(
    grade_id: str,
    *,
    solution: bool,
    grade: bool,
    locked: bool,
    points: float | None = None,
) -> dict:
    meta = {
        "grade": grade,
        "grade_id": grade_id,
        "locked": locked,
        "schema_version": NBGRADER_SCHEMA,
        "solution": solution,
        "task": False,
    }
    if points is not None:
        meta["points"] = points
    return meta


def _one_check_call(cell, where: str) -> tuple[str, str] | None:
    """``(label, answer expression)`` of a check cell that is one ``check("label",
    answer)`` call (on one line or several), None for a cell with no check;
    ``ValueError`` for anything else (it could not become a test safely)."""
    if not CHECK_CALL.search(cell.source):
        return None
    try:
        body = ast.parse(cell.source).body
    except SyntaxError:
        body = []
    call = body[0].value if len(body) == 1 and isinstance(body[0], ast.Expr) else None
    if (
        not isinstance(call, ast.Call)
        or len(call.args) != 2
        or call.keywords
        or not isinstance(call.args[0], ast.Constant)
    ):
        raise ValueError(
            f"{where}: a check cell must be one check(...) call to become a test"
        )
    return call.args[0].value, ast.unparse(call.args[1])


def _nbgrader_rubric(label: str, rubric: str):
    """The read-only cell that shows ``rubric`` to the grader of ``label``'s answer."""
    begin, end = MARK_SCHEME
    cell = require("nbformat").v4.new_markdown_cell(
        f"{RUBRIC_NOTE.format(label=label)}\n\n{begin}\n{rubric}\n{end}",
        id=f"{label}-rubric"[:64],
    )
    cell.metadata["nbgrader"] = _nbgrader_meta(
        f"{label}-rubric", solution=False, grade=False, locked=True
    )
    return cell


def nbgrader_source(nb, name: str = "notebook", points: float | None = None):
    """The nbgrader *source* version of chapter ``nb`` (not modified), for ``nbgrader
    generate_assignment``.

    - cells tagged ``solution`` keep their solution between the markers (nbgrader's own)
      and become *autograded answer* cells (``solution: true``), without the
      ``hide-input`` tag;
    - each check cell ``attnbook.exercises.check("label", f)`` becomes an *autograder
      tests* cell worth ``points``, by default the label's points in the chapter's
      metadata (``metadata.attnbook.points``, 1 if absent): ``grade: true``,
      ``locked: true``, ``grade_id`` = the label; it runs the check and raises
      ``AssertionError`` with the check's verdict and hint when it fails (see
      ``NBGRADER_TEST``), so nbgrader counts it and shows the student why;
    - each written exercise (one no check grades) gets a *manually graded answer*
      markdown cell after it, worth the label's points in the metadata (1 if absent),
      ``grade_id`` = the label; it holds the chapter's model answer, which
      ``generate_assignment`` replaces by "YOUR ANSWER HERE";
    - after that cell, a written exercise with a rubric (:func:`rubrics`) gets a
      *read-only* markdown cell, ``grade_id`` = ``<label>-rubric``: ``RUBRIC_NOTE``
      then the rubric in a mark-scheme region (``MARK_SCHEME``), which
      ``generate_assignment`` removes from the students' notebooks and ``autograde``
      restores from the gradebook, so the formgrader shows it beside the answer (the
      exported configuration lets ClearMarkScheme clear a cell that is not a task cell
      and keeps the rubric out of the feedback);
    - a hidden test (a cell tagged :data:`HIDDEN`) becomes an autograder tests cell of
      its own label whose whole source is in nbgrader's hidden-tests region:
      ``generate_assignment`` empties it in the students' notebooks, ``autograde`` runs
      it from the gradebook;
    - written ``{solution}`` directives are removed from markdown (nbgrader would
      release them);
    - outputs are cleared.

    Raises ``ValueError`` naming ``name`` and the cell for a check cell that is not a
    single ``check(...)`` call, for a misplaced hidden test or for unbalanced markers.
    """
    nbformat = require("nbformat")
    hidden_checks(nb, name)
    source = copy.deepcopy(nb)
    written, rubric_of = written_exercises(nb), rubrics(nb)
    cells, pending = [], None  # pending: the last solution cell, waiting for its check
    for index, cell in enumerate(source.cells):
        where = f"{name}, cell {index}"
        if cell.cell_type == "markdown":
            labels = [lab for _, lab, _ in _directives(cell.source, _EXERCISE_OPEN)]
            cell.source = _strip_written_solutions(cell.source)
            if cell.source.strip():
                cells.append(cell)
            for label in (label for label in labels if label in written):
                worth = _exercise_points(nb, label)
                model = written[label] or "(The book gives no model answer.)"
                answer = nbformat.v4.new_markdown_cell(  # the prompt stays, the model
                    WRITTEN_PROMPT.format(  # answer becomes "YOUR ANSWER HERE"
                        label=label,
                        points=worth,
                        unit="point" if worth == 1 else "points",
                    )
                    + f"\n\n{BEGIN}\n{model}\n{END}",
                    id=f"{label}-answer"[:64],
                )
                answer.metadata["nbgrader"] = _nbgrader_meta(
                    label, solution=True, grade=True, locked=False, points=worth
                )
                cells.append(answer)
                if rubric_of[label]:
                    cells.append(_nbgrader_rubric(label, rubric_of[label]))
            continue
        if cell.cell_type != "code":
            cells.append(cell)
            continue
        cell.outputs, cell.execution_count = [], None
        cell.metadata.pop("execution", None)
        tags = cell.metadata.get("tags", [])
        check = _one_check_call(cell, where)
        if "solution" in tags:
            if not _strip_code(cell.source, where)[1]:
                raise ValueError(
                    f"{where}: tagged 'solution' but has no {BEGIN} / {END} block"
                )
            cell.metadata["tags"] = [tag for tag in tags if tag != "hide-input"]
            cell.metadata["nbgrader"] = _nbgrader_meta(
                f"cell-{index}", solution=True, grade=False, locked=False
            )
            pending = cell
        elif check is not None:
            label = check[0]
            cell.source = NBGRADER_TEST.format(call=cell.source.strip())
            if HIDDEN in tags:
                cell.source = f"{HIDDEN_BEGIN}\n{cell.source}\n{HIDDEN_END}"
            cell.metadata["nbgrader"] = _nbgrader_meta(
                label,
                solution=False,
                grade=True,
                locked=True,
                points=_exercise_points(nb, label, points),
            )
            if pending is not None:
                pending.metadata["nbgrader"]["grade_id"] = f"{label}-answer"
                pending = None
        cells.append(cell)
    source.cells = cells
    return source


def make_nbgrader_source(
    book_dir="book",
    out_dir="source",
    points: float | None = None,
    timings_dir=None,
) -> list[Path]:
    """Write ``out_dir/<chapter>/<chapter>.ipynb`` for every ``book_dir/*.ipynb``
    (nbgrader's layout, one assignment per chapter; see :func:`nbgrader_source`) and
    ``out_dir/nbgrader_config.py`` (:func:`nbgrader_config`), its cell timeout from
    the slowest cells in ``SLOWEST_CELL``, or measured with :func:`slowest_cell` on the
    executed notebooks of the same names in ``timings_dir``. Returns the paths
    written, the config last."""
    nbformat = require("nbformat")
    out_dir = Path(out_dir)
    written, slowest = [], {}
    for path in _chapters(book_dir):
        target = out_dir / path.stem / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(
            nbgrader_source(
                nbformat.read(path, as_version=4), name=path.name, points=points
            ),
            target,
        )
        written.append(target)
        if timings_dir is None:
            slowest[path.stem] = SLOWEST_CELL.get(path.stem, 0.0)
        else:
            executed = Path(timings_dir) / path.name
            if not executed.is_file():
                raise ValueError(
                    f"timings_dir {str(timings_dir)!r} has no executed {path.name}"
                )
            seconds = slowest_cell(nbformat.read(executed, as_version=4))[0]
            if not seconds:
                raise ValueError(
                    f"{executed}: no cell has execution timestamps (execute it with "
                    "nbclient or nbgrader, which record them)"
                )
            slowest[path.stem] = seconds
    config = out_dir / "nbgrader_config.py"
    config.write_text(nbgrader_config(slowest))
    written.append(config)
    return written


# --------------------------------------------------------------------------------------
# otter-grader master notebooks (Gradescope)
# --------------------------------------------------------------------------------------
OTTER_CONFIG = """\
# ASSIGNMENT CONFIG
name: {name}
requirements: requirements.txt
init_cell: false
check_all_cell: false
export_cell: false
run_tests: false
generate:
  pdf: false
  show_stdout: true
"""
# The test of a coding exercise: the book's check, without its printed line, on the
# answer; a failure raises with the check's verdict and hint. It is public, so
# Gradescope shows the verdict as soon as a student submits (it holds no secret).
OTTER_TEST = (
    '_verdict = attnbook.exercises.run_check("{label}", {answer})\n'
    "assert _verdict, _verdict.message"
)
OTTER_REQUIREMENTS = """\
# What the Gradescope image installs for these chapters (written by `python -m
# attnbook.course otter`): the CPU build of PyTorch, and attnbook with every package
# its chapters import.
--extra-index-url https://download.pytorch.org/whl/cpu
attnbook[grading] @ git+{url}@v{version}
"""


def _raw(source: str):
    return require("nbformat").v4.new_raw_cell(source)


def otter_master(nb, name: str = "notebook", points: float | None = None):
    """The otter-grader *master* notebook of chapter ``nb`` (not modified), for ``otter
    assign`` (otter's notebook format v1), which writes the student notebook and the
    Gradescope autograder zip.

    - a first raw cell holds the assignment config (``OTTER_CONFIG``: the chapter's
      name, ``requirements.txt`` beside the notebook, no otter cells in the student
      notebook, no PDF);
    - each coding exercise becomes a question named by its label, worth ``points``
      (by default the label's points in ``metadata.attnbook.points``, 1 if absent):
      its prompt is the exercise's markdown, its solution the answer cell (otter
      replaces the block between the markers by ``...``), its one public test
      ``OTTER_TEST``, and no otter check cell: the chapter's own check cell stays in
      the question, so a student sees its verdict while working, without otter;
    - a hidden test (a cell tagged :data:`HIDDEN`) becomes a second test of its
      exercise's question, marked ``# HIDDEN`` (in the autograder, not in the student's
      notebook); the question's ``points`` list gives each test its label's points;
    - each written exercise becomes a manually graded question (``manual: true``) whose
      solution is a markdown cell with the chapter's model answer, then one with its
      rubric (:func:`rubrics`), if it has one: ``otter assign`` keeps both in the
      autograder notebook and drops them from the student's;
    - written ``{solution}`` directives are removed and outputs are cleared.

    Raises ``ValueError`` naming ``name`` and the cell for a check cell that is not a
    single ``check(...)`` call, for unbalanced markers, or for an exercise cell that
    holds two exercises.
    """
    nbformat = require("nbformat")
    hidden = hidden_checks(nb, name)
    source = copy.deepcopy(nb)
    written = written_exercises(nb)
    cells = [_raw(OTTER_CONFIG.format(name=Path(name).stem))]
    opened = None  # the question open in `cells` (its label), None between questions
    for index, cell in enumerate(source.cells):
        where = f"{name}, cell {index}"
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            cell.metadata.pop("execution", None)
            if _is_hidden(cell):  # a test of the question its public check closed
                continue
            check = _one_check_call(cell, where)
            if "solution" in cell.metadata.get("tags", []):
                marked = cell.source.replace(BEGIN, "# BEGIN SOLUTION")
                if not _strip_code(cell.source, where)[1]:
                    raise ValueError(
                        f"{where}: tagged 'solution' but has no {BEGIN} / {END} block"
                    )
                cell.source = marked.replace(END, "# END SOLUTION")
                cells += [_raw("# BEGIN SOLUTION"), cell, _raw("# END SOLUTION")]
                continue
            cells.append(cell)
            if check is not None:
                label, answer = check
                if opened != label:
                    raise ValueError(
                        f"{where}: check {label!r} has no exercise before it"
                    )
                tests = [
                    nbformat.v4.new_code_cell(
                        OTTER_TEST.format(label=label, answer=answer),
                        id=f"{label}-test"[:64],
                    )
                ]
                if label in hidden:
                    secret, answer = hidden[label]
                    tests.append(
                        nbformat.v4.new_code_cell(
                            "# HIDDEN\n"
                            + OTTER_TEST.format(label=secret, answer=answer),
                            id=f"{secret}-test"[:64],
                        )
                    )
                cells += [
                    _raw("# BEGIN TESTS"),
                    *tests,
                    _raw("# END TESTS"),
                    _raw("# END QUESTION"),
                ]
                opened = None
            continue
        if cell.cell_type != "markdown":
            cells.append(cell)
            continue
        for part, chunk in enumerate(_split_exercises(cell.source)):
            piece = nbformat.v4.new_markdown_cell(
                chunk,
                id=cell.id if part == 0 else f"{cell.id}-{part}"[:64],
                metadata=copy.deepcopy(cell.metadata),
            )
            opened = _otter_markdown(piece, nb, written, points, opened, cells, hidden)
    if opened is not None:
        raise ValueError(f"{name}: exercise {opened!r} has no check cell after it")
    for position, cell in enumerate(cells):
        if cell.cell_type == "raw":  # otter's delimiters: ids stable from run to run
            cell.id = f"otter-{position}"
    source.cells = cells
    return source


def _split_exercises(source: str) -> list[str]:
    """``source`` cut before each ``{exercise}`` directive, so each piece holds one."""
    pieces: list[list[str]] = [[]]
    for line in source.split("\n"):
        if _EXERCISE_OPEN.match(line) and any(x.strip() for x in pieces[-1]):
            pieces.append([])
        pieces[-1].append(line)
    return ["\n".join(piece).strip("\n") for piece in pieces]


def _otter_markdown(cell, nb, written, points, opened, cells, hidden) -> str | None:
    """Append markdown ``cell`` (at most one exercise) to ``cells``, inside the raw
    cells of its question; returns the label of the question left open for its test."""
    labels = [lab for _, lab, _ in _directives(cell.source, _EXERCISE_OPEN)]
    cell.source = _strip_written_solutions(cell.source)
    if not cell.source.strip():
        return opened
    if not labels:
        cells.append(cell)
        return opened
    label = labels[0]
    if opened is not None:
        raise ValueError(f"exercise {opened!r} has no check cell before {label!r}")
    if label not in written:
        worth = _exercise_points(nb, label, points)
        if label in hidden:  # one number per test: the public one, then the hidden one
            worth = [worth, _exercise_points(nb, hidden[label][0], points)]
        config = f"name: {label}\npoints: {worth}\ncheck_cell: false"
        cells += [_raw(f"# BEGIN QUESTION\n{config}"), cell]
        return label
    nbformat = require("nbformat")
    answer = nbformat.v4.new_markdown_cell(
        written[label] or "(The book gives no model answer.)", id=f"{label}-answer"[:64]
    )
    rubric = rubrics(nb).get(label)
    marking = (
        [nbformat.v4.new_markdown_cell(rubric, id=f"{label}-rubric"[:64])]
        if rubric
        else []
    )
    worth = _exercise_points(nb, label)
    cells += [
        _raw(f"# BEGIN QUESTION\nname: {label}\nmanual: true\npoints: {worth}"),
        cell,
        _raw("# BEGIN SOLUTION"),
        answer,
        *marking,
        _raw("# END SOLUTION"),
        _raw("# END QUESTION"),
    ]
    return opened


def make_otter_masters(
    book_dir="book", out_dir="otter", points: float | None = None
) -> list[Path]:
    """Write ``out_dir/<chapter>/<chapter>.ipynb`` (:func:`otter_master`) and the
    ``requirements.txt`` of the Gradescope image beside it, for every
    ``book_dir/*.ipynb``. Returns the notebooks written."""

    nbformat = require("nbformat")
    written = []
    for path in _chapters(book_dir):
        target = Path(out_dir) / path.stem / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        master = otter_master(
            nbformat.read(path, as_version=4), name=path.name, points=points
        )
        nbformat.write(master, target)
        (target.parent / "requirements.txt").write_text(
            OTTER_REQUIREMENTS.format(url=REPOSITORY, version=__version__)
        )
        written.append(target)
    return written



# --------------------------------------------------------------------------------------
# Grading
# --------------------------------------------------------------------------------------
def expected_labels(nb) -> list[str]:
    """The labels of the ``check("...")`` calls in ``nb``'s code cells, in order of
    appearance."""
    found = [
        m[2]
        for cell in nb.cells
        if cell.cell_type == "code"
        for m in CHECK_CALL.finditer(cell.source)
    ]
    return list(dict.fromkeys(found))

