"""The course kit: student notebooks with the solutions stripped out, an export to
nbgrader, and the command line of the grader.

A chapter's coding exercise is a code cell tagged ``solution`` whose answer lies between
nbgrader's markers, followed by a check cell::

    def my_softmax(scores):              # the answer cell, tagged solution, hide-input
        ### BEGIN SOLUTION
        return scores.softmax(-1)
        ### END SOLUTION

    attnbook.exercises.check("attention-masked-softmax", my_softmax)   # the check cell

Three commands turn the book into a course::

    python -m attnbook.course student OUTDIR [--book book]
    python -m attnbook.course nbgrader SOURCE_DIR [--book book] [--points P]
    python -m attnbook.course grade SUBMISSIONS... [--book book] [--out grades.csv]
        [--jobs N] [--timeout 120] [--notebook-timeout 1800] [--memory 6]
        [--output-limit 20] [--require-sandbox | --no-sandbox] [--feedback DIR]
        [--gradebook FILE]

``student`` replaces every marked block by ``raise NotImplementedError(...)`` (so the
check reports "not attempted" until the student writes code), un-hides the stub, clears
outputs and removes the written ``{solution}`` directives. ``grade`` rebuilds each
submission from the book's chapter with only the student's answer cells, runs it in a
kernel under limits, and runs the checks in its own process on new inputs (see
:mod:`attnbook.grader` for how, and :mod:`attnbook.sandbox` for the limits); it writes
one CSV row per student, notebook and check, a gradebook with points per chapter, and
one Markdown feedback file per student.

nbformat, jupyter_client and pyzmq come with the ``course`` extra: ``pip install
"attnbook[course]"``.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
import time
from pathlib import Path

from . import grader, sandbox
from .grader import CHECK_CALL as _CHECK_CALL
from .grader import _require, grade, write_feedback

__all__ = [
    "strip_solutions",
    "make_student_bundle",
    "nbgrader_source",
    "make_nbgrader_source",
    "expected_labels",
    "main",
]

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
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


def strip_solutions(nb, name: str = "notebook"):
    """The student version of notebook ``nb`` (an nbformat v4 notebook; ``nb`` is not
    modified).

    - code cells: each ``### BEGIN SOLUTION`` / ``### END SOLUTION`` block becomes
      ``raise NotImplementedError("Exercise: write your solution here")`` at the
      marker's indentation; outputs and execution counts are cleared;
    - cells tagged ``solution`` lose the ``hide-input`` tag, so the student sees the
      stub;
    - markdown cells lose their ``{solution}`` directives (a cell left empty is
      dropped);
    - everything else, the exercise text and the ``check(...)`` cells included, is kept.

    Raises ``ValueError`` naming ``name`` and the cell for an unbalanced marker, or for
    a cell tagged ``solution`` without markers (the student would see the answer).
    """
    student = copy.deepcopy(nb)
    cells = []
    for index, cell in enumerate(student.cells):
        where = f"{name}, cell {index}" + (
            f" (id {cell['id']})" if cell.get("id") else ""
        )
        tags = cell.get("metadata", {}).get("tags", [])
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
    nbformat = _require("nbformat")
    book_dir, out_dir = Path(book_dir), Path(out_dir)
    notebooks = sorted(book_dir.glob("*.ipynb"))
    if not notebooks:
        raise ValueError(f"book_dir {str(book_dir)!r} has no *.ipynb notebooks")
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
# nbgrader source notebooks
# --------------------------------------------------------------------------------------
NBGRADER_SCHEMA = 3


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


def nbgrader_source(nb, name: str = "notebook", points: float | None = None):
    """The nbgrader *source* version of chapter ``nb`` (not modified), for ``nbgrader
    generate_assignment``.

    - cells tagged ``solution`` keep their solution between the markers (nbgrader's own)
      and become *autograded answer* cells (``solution: true``), without the
      ``hide-input`` tag;
    - each check cell ``attnbook.exercises.check("label", f)`` becomes an *autograder
      tests* cell worth ``points``, by default the label's points in the chapter's
      metadata (``metadata.attnbook.points``, 1 if absent): ``grade: true``,
      ``locked: true``, ``grade_id`` = the label; its call is wrapped in ``assert``,
      so a failed check raises and nbgrader counts it;
    - written ``{solution}`` directives are removed from markdown (nbgrader would
      release them);
    - outputs are cleared.

    Raises ``ValueError`` naming ``name`` and the cell for a check cell that is not a
    single ``check(...)`` call (it could not be wrapped safely) or for unbalanced
    markers.
    """
    source = copy.deepcopy(nb)
    given = nb.metadata.get("attnbook", {}).get("points", {})
    cells, pending = [], None  # pending: the last solution cell, waiting for its check
    for index, cell in enumerate(source.cells):
        where = f"{name}, cell {index}"
        if cell.cell_type == "markdown":
            cell.source = _strip_written_solutions(cell.source)
            if cell.source.strip():
                cells.append(cell)
            continue
        if cell.cell_type != "code":
            cells.append(cell)
            continue
        cell.outputs, cell.execution_count = [], None
        cell.metadata.pop("execution", None)
        tags = cell.metadata.get("tags", [])
        calls = list(_CHECK_CALL.finditer(cell.source))
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
        elif calls:
            line = cell.source.strip()
            if len(calls) != 1 or "\n" in line or not line.endswith(")"):
                raise ValueError(
                    f"{where}: a check cell must be one check(...) call to become an "
                    "nbgrader test"
                )
            label = calls[0][2]
            cell.source = (
                f"assert {line}, 'the check above failed: read its message and hint'"
            )
            cell.metadata["nbgrader"] = _nbgrader_meta(
                label,
                solution=False,
                grade=True,
                locked=True,
                points=given.get(label, 1) if points is None else points,
            )
            if pending is not None:
                pending.metadata["nbgrader"]["grade_id"] = f"{label}-answer"
                pending = None
        cells.append(cell)
    source.cells = cells
    return source


def make_nbgrader_source(
    book_dir="book", out_dir="source", points: float | None = None
) -> list[Path]:
    """Write ``out_dir/<chapter>/<chapter>.ipynb`` for every ``book_dir/*.ipynb``:
    nbgrader's layout, one assignment per chapter (see :func:`nbgrader_source`). Returns
    the paths written."""
    nbformat = _require("nbformat")
    book_dir, out_dir = Path(book_dir), Path(out_dir)
    notebooks = sorted(book_dir.glob("*.ipynb"))
    if not notebooks:
        raise ValueError(f"book_dir {str(book_dir)!r} has no *.ipynb notebooks")
    written = []
    for path in notebooks:
        target = out_dir / path.stem / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(
            nbgrader_source(
                nbformat.read(path, as_version=4), name=path.name, points=points
            ),
            target,
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
        for m in _CHECK_CALL.finditer(cell.source)
    ]
    return list(dict.fromkeys(found))


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------
def main(argv=None) -> int:
    """``python -m attnbook.course student OUTDIR`` / ``python -m attnbook.course grade
    SUBMISSIONS...``."""
    parser = argparse.ArgumentParser(
        prog="python -m attnbook.course", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    student = commands.add_parser(
        "student", help="write student notebooks (solutions stubbed out) and a README"
    )
    student.add_argument("outdir", help="folder for the student notebooks")
    student.add_argument(
        "--book",
        default="book",
        help="folder with the chapter notebooks (default: book)",
    )
    nbg = commands.add_parser(
        "nbgrader", help="write nbgrader source notebooks, one assignment per chapter"
    )
    nbg.add_argument("outdir", help="nbgrader's source/ folder")
    nbg.add_argument(
        "--book",
        default="book",
        help="folder with the chapter notebooks (default: book)",
    )
    nbg.add_argument(
        "--points",
        type=float,
        default=None,
        help="points per auto-checked exercise (default: each chapter's "
        "metadata.attnbook.points, 1 where it lists none)",
    )
    grading = commands.add_parser(
        "grade",
        help="grade submitted notebooks: checks run in the grader, on new inputs",
    )
    grading.add_argument(
        "submissions", nargs="+", help="notebooks, or folders searched for *.ipynb"
    )
    grading.add_argument(
        "--book",
        default="book",
        help="the chapters' folder: each notebook is rebuilt from the chapter of its "
        "name (default: book)",
    )
    grading.add_argument(
        "--out", default="grades.csv", help="CSV file to write (default: grades.csv)"
    )
    grading.add_argument(
        "--feedback",
        default=None,
        help="folder for one feedback file per student (default: feedback/ beside the "
        "CSV)",
    )
    grading.add_argument(
        "--gradebook",
        default=None,
        help="gradebook CSV, one row per student (default: gradebook.csv beside the "
        "CSV)",
    )
    grading.add_argument(
        "--jobs", type=int, default=1, help="notebooks graded at once (default: 1)"
    )
    box = grading.add_mutually_exclusive_group()
    box.add_argument(
        "--require-sandbox",
        action="store_true",
        help="refuse to grade where the bubblewrap sandbox does not work",
    )
    box.add_argument(
        "--no-sandbox",
        action="store_true",
        help="run the kernels without the sandbox (every row says isolation: none)",
    )
    limits = sandbox.Limits()
    grading.add_argument(
        "--timeout",
        type=float,
        default=limits.cell_timeout,
        help="seconds per cell and per call into an answer (default: "
        f"{limits.cell_timeout:g})",
    )
    grading.add_argument(
        "--notebook-timeout",
        type=float,
        default=limits.notebook_timeout,
        help=f"seconds per notebook (default: {limits.notebook_timeout:g})",
    )
    grading.add_argument(
        "--memory",
        type=float,
        default=limits.memory / sandbox.GIB,
        help="GiB of memory per kernel process (default: "
        f"{limits.memory / sandbox.GIB:g})",
    )
    grading.add_argument(
        "--output-limit",
        type=float,
        default=limits.output / 2**20,
        help=f"MB of output per notebook (default: {limits.output / 2**20:g})",
    )
    args = parser.parse_args(argv)

    try:
        if args.command == "student":
            written = make_student_bundle(args.book, args.outdir)
            print(
                f"Wrote {len(written) - 1} student notebooks and README.md to "
                f"{args.outdir}"
            )
        elif args.command == "nbgrader":
            written = make_nbgrader_source(args.book, args.outdir, points=args.points)
            print(
                f"Wrote {len(written)} nbgrader assignments to {args.outdir}: "
                f"nbgrader generate_assignment <chapter> makes the release versions"
            )
        else:
            limits = sandbox.Limits(
                cell_timeout=args.timeout,
                notebook_timeout=args.notebook_timeout,
                memory=int(args.memory * sandbox.GIB),
                output=int(args.output_limit * 2**20),
            )
            out = Path(args.out)
            feedback = (
                out.parent / "feedback" if args.feedback is None else args.feedback
            )
            book = (
                out.parent / "gradebook.csv"
                if args.gradebook is None
                else args.gradebook
            )
            start = time.monotonic()

            def progress(done, total, student, notebook):
                print(
                    f"[{done}/{total}] {student}/{notebook} "
                    f"({time.monotonic() - start:.0f} s)",
                    flush=True,
                )

            rows = grader.grade(
                args.submissions,
                out,
                book_dir=args.book,
                limits=limits,
                jobs=args.jobs,
                isolation="bwrap"
                if args.require_sandbox
                else "none"
                if args.no_sandbox
                else "auto",
                feedback_dir=feedback,
                gradebook=book,
                progress=progress,
            )
            checks = [row for row in rows if row["label"] != grader.NOTEBOOK]
            print(
                f"Graded {len({(r['student'], r['notebook']) for r in rows})} "
                f"notebooks in {time.monotonic() - start:.0f} s: "
                f"{sum(r['passed'] for r in checks)}/{len(checks)} checks passed"
            )
            print(grader.summary(rows))
            print(
                f"Wrote {out}, {book} and one feedback file per student in {feedback}/"
            )
    except (ValueError, FileNotFoundError) as err:
        parser.exit(1, f"error: {err}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
