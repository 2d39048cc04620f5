"""The course kit: student notebooks with the solutions stripped out, and a grader for
submissions.

A chapter's coding exercise is a code cell tagged ``solution`` whose answer lies between
nbgrader's markers, followed by a check cell::

    def my_softmax(scores):                                   # cell tagged solution,
    hide-input
        ### BEGIN SOLUTION
        return scores.softmax(-1)
        ### END SOLUTION

    attnbook.exercises.check("attention-masked-softmax", my_softmax) # check cell

Two commands turn the book into a course (a third exports it to nbgrader)::

    python -m attnbook.course student OUTDIR [--book book]
    python -m attnbook.course nbgrader SOURCE_DIR [--book book] [--points 1]
    python -m attnbook.course grade SUBMISSIONS... --out grades.csv [--timeout 120]
        [--feedback DIR] [--book book]

``student`` replaces every marked block by ``raise NotImplementedError(...)`` (so the
check reports "not attempted" until the student writes code), un-hides the stub, clears
outputs and removes the written ``{solution}`` directives. ``grade`` executes each
submitted notebook in a fresh kernel with ``ATTNBOOK_GRADE_LOG`` pointing at a temporary
file; every ``check`` appends a JSON line there (see :mod:`attnbook.exercises`), and the
grader turns those lines into one CSV row per student, notebook and check, and one
Markdown feedback file per student. Grading runs the submitted
code: run it in a sandbox you trust with that.

nbformat and nbclient come with the ``course`` extra: ``pip install
"attnbook[course]"``.
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import re
import site
import sys
import tempfile
from pathlib import Path

__all__ = [
    "strip_solutions",
    "make_student_bundle",
    "nbgrader_source",
    "make_nbgrader_source",
    "grade_notebook",
    "grade",
    "write_feedback",
    "expected_labels",
    "main",
]

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
STUB = 'raise NotImplementedError("Exercise: write your solution here")'
CSV_FIELDS = ["student", "notebook", "label", "passed", "message"]
NOT_RUN = "check did not run"

# A check call in a code cell: check("label", ...) or attnbook.exercises.check('label',
# ...).
_CHECK_CALL = re.compile(r"""\bcheck\(\s*(["'])([^"'\n]+)\1""")
# The opening line of a written solution: ```{solution} label  or  :::{solution} label
_SOLUTION_OPEN = re.compile(r"^\s*(?P<fence>`{3,}|:{3,})\s*\{solution\}")

STUDENT_README = """\
# Exercises: the student notebooks

Each notebook here is one chapter of *Attention, from first principles to GPU kernels*
with the
exercise solutions taken out. Where a solution was, a cell now says

    raise NotImplementedError("Exercise: write your solution here")

Replace that line with your code; keep the function's name and signature.

## Opening the notebooks
- **Locally**: `pip install "attnbook[course]"` (or, in a clone of the book's
  repository,
  `pip install -e ".[course]"`), then `jupyter lab` in this folder and open a chapter.
- **In Colab**: *File -> Upload notebook*. The first cell of every notebook installs
  `attnbook` when
  it is missing; run it first.

Run the notebook from the top (*Run -> Run All Cells*): later cells use what earlier
cells define.

## What the checks print
After each coding exercise a cell calls `attnbook.exercises.check("<label>",
your_answer)` and prints
one line:
- `[PASSED] <label>: passed` - your answer agrees with the book's tested implementation;
- `[FAILED] <label>: not attempted yet ...` - the `raise NotImplementedError` is still
  there;
- `[FAILED] <label>: <what differs> Hint: <a hint>` - a wrong answer, or your code
  raised an error.
A check never stops the notebook, so you see every verdict in one run. Do not edit the
check cells:
the grader looks for them.

## Submitting
1. Restart the kernel and run all cells, so the notebook runs top to bottom without your
   help.
2. Save it under its original file name (e.g. `attention.ipynb`).
3. Hand in your notebooks in a folder named after you, e.g.
   `ada_lovelace/attention.ipynb`.

The grader re-runs every submitted notebook in a fresh kernel (each cell has a time
limit, 120 s by
default) and records every check: passed, failed, or "check did not run" when the
notebook
stopped or crashed before reaching it.
"""


def _require(module: str):
    """Import one of the ``course`` extra's packages, or say how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:  # pragma: no cover - the test environment has the extra
        raise ImportError(
            f"attnbook.course needs {module}; install the course extra: pip install "
            "'attnbook[course]'"
        ) from err


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


def nbgrader_source(nb, name: str = "notebook", points: float = 1):
    """The nbgrader *source* version of chapter ``nb`` (not modified), for ``nbgrader
    generate_assignment``.

    - cells tagged ``solution`` keep their solution between the markers (nbgrader's own)
      and become *autograded answer* cells (``solution: true``), without the
      ``hide-input`` tag;
    - each check cell ``attnbook.exercises.check("label", f)`` becomes an *autograder
      tests* cell worth ``points`` (``grade: true``, ``locked: true``, ``grade_id`` =
      the label) whose call is wrapped in ``assert``, so a failed check raises and
      nbgrader counts it;
    - written ``{solution}`` directives are removed from markdown (nbgrader would
      release them);
    - outputs are cleared.

    Raises ``ValueError`` naming ``name`` and the cell for a check cell that is not a
    single ``check(...)`` call (it could not be wrapped safely) or for unbalanced
    markers.
    """
    source = copy.deepcopy(nb)
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
                label, solution=False, grade=True, locked=True, points=points
            )
            if pending is not None:
                pending.metadata["nbgrader"]["grade_id"] = f"{label}-answer"
                pending = None
        cells.append(cell)
    source.cells = cells
    return source


def make_nbgrader_source(
    book_dir="book", out_dir="source", points: float = 1
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


def _kernel_env(log_path: Path) -> dict[str, str]:
    """The kernel's environment: the grade log, and this attnbook on the path when it is
    a source checkout.

    Putting the grader's own checkout first on ``PYTHONPATH`` means the kernel runs the
    same checks as the grader even when attnbook is not pip-installed; an installed
    attnbook needs nothing.
    """
    env = dict(os.environ, ATTNBOOK_GRADE_LOG=str(log_path))
    root = str(Path(__file__).resolve().parent.parent)
    installed = {
        str(Path(p).resolve())
        for p in [*site.getsitepackages(), site.getusersitepackages()]
    }
    if root not in installed:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


def _check_cell_errors(nb) -> dict[str, str]:
    """``{label: "NameError: name 'f' is not defined"}`` for each executed check cell
    that raised.

    A check cell raises when the code it checks never got defined (a syntax error or an
    exception in the student's cell above it): the error tells the student where to
    look.
    """
    errors = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        raised = [
            out for out in cell.get("outputs", []) if out.get("output_type") == "error"
        ]
        if raised:
            name, value = raised[0].get("ename", "Error"), raised[0].get("evalue", "")
            text = f"{name}: {value}".strip().rstrip(":")
            for match in _CHECK_CALL.finditer(cell.source):
                errors.setdefault(match[2], text)
    return errors


def grade_notebook(
    path, timeout: float = 120, expected: list[str] | None = None
) -> list[dict]:
    """Execute the notebook at ``path`` in a fresh ``python3`` kernel and return its
    check results.

    Cells run in the notebook's folder with ``allow_errors=True`` (a failing cell does
    not stop the checks after it) and a per-cell ``timeout`` in seconds. Returns one
    dict ``{"notebook", "label", "passed" (0/1), "message"}`` per check label: the last
    verdict it reported, or ``"check did not run"`` for a label that never reported. The
    labels expected are those the notebook's source calls plus ``expected`` (the book's
    own labels for this chapter, so a deleted check cell still counts as a failed
    check). A notebook that cannot be read, crashes its kernel or times out adds a row
    with label ``"*"`` and the error; it never raises.
    """
    nbformat = _require("nbformat")
    nbclient = _require("nbclient")
    path = Path(path)
    rows: dict[str, dict] = {}
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as err:
        unread = [
            {"notebook": path.name, "label": label, "passed": 0, "message": NOT_RUN}
            for label in expected or []
        ]
        return unread + [
            {
                "notebook": path.name,
                "label": "*",
                "passed": 0,
                "message": f"could not read: {_first_line(err)}",
            }
        ]
    error = None
    with tempfile.TemporaryDirectory(prefix="attnbook-grade-") as tmp:
        log_path = Path(tmp) / "checks.jsonl"
        log_path.touch()
        client = nbclient.NotebookClient(
            nb,
            timeout=timeout,
            kernel_name="python3",
            allow_errors=True,
            resources={"metadata": {"path": str(path.parent.resolve())}},
        )
        try:
            client.execute(env=_kernel_env(log_path))
        except nbclient.exceptions.CellTimeoutError:
            error = f"timed out: a cell ran longer than {timeout:g} s"
        except Exception as err:  # a dead kernel, a kernel that does not start, ...
            error = f"notebook did not finish: {_first_line(err)}"
        for line in log_path.read_text().splitlines():
            try:
                report = json.loads(line)
                rows[report["label"]] = {
                    "label": report["label"],
                    "passed": int(bool(report["passed"])),
                    "message": report["message"],
                }
            # the submitted code wrote into the log
            except (ValueError, KeyError, TypeError):
                error = error or f"unreadable grade log line: {line[:80]!r}"
    present = expected_labels(nb)
    errors = _check_cell_errors(nb)
    for label in present:
        message = (
            f"{NOT_RUN}: its cell raised {errors[label]}"
            if label in errors
            else NOT_RUN
        )
        rows.setdefault(label, {"label": label, "passed": 0, "message": message})
    for label in expected or []:
        rows.setdefault(
            label,
            {
                "label": label,
                "passed": 0,
                "message": f"{NOT_RUN} (its check cell is missing)",
            },
        )
    results = [{"notebook": path.name, **row} for row in rows.values()]
    if error:
        results.append(
            {"notebook": path.name, "label": "*", "passed": 0, "message": error}
        )
    return results


def _submissions(paths) -> list[tuple[str, Path, str]]:
    """``(student, notebook path, notebook name)`` for every submitted notebook.

    A file is its own submission (student = file stem). A directory is searched
    recursively; a notebook in a sub-folder belongs to the student named by the first
    folder below the given directory, one directly inside it to the student named by its
    stem.
    """
    found = []
    for given in map(Path, paths):
        if given.is_file():
            found.append((given.stem, given, given.name))
        elif given.is_dir():
            for path in sorted(given.rglob("*.ipynb")):
                rel = path.relative_to(given)
                if ".ipynb_checkpoints" in rel.parts:
                    continue
                if len(rel.parts) > 1:
                    found.append((rel.parts[0], path, Path(*rel.parts[1:]).as_posix()))
                else:
                    found.append((path.stem, path, path.name))
        else:
            raise FileNotFoundError(f"submission {str(given)!r} does not exist")
    return found


def _book_labels(book_dir, notebook: str) -> list[str] | None:
    """The check labels of the book's own copy of ``notebook`` (matched by file name),
    if there is one."""
    if book_dir is None:
        return None
    original = Path(book_dir) / Path(notebook).name
    if not original.is_file():
        return None
    return expected_labels(_require("nbformat").read(original, as_version=4))


def grade(
    paths, out_csv="grades.csv", timeout: float = 120, feedback_dir=None, book_dir=None
) -> list[dict]:
    """Grade every submitted notebook under ``paths``; write a CSV and one feedback file
    per student.

    ``paths`` are notebook files or directories (see the student naming rule in
    ``_submissions``). Each row is ``{"student", "notebook", "label", "passed",
    "message"}`` as in :func:`grade_notebook`. A crash or a time-out in one submission
    is a row, never an abort. The CSV goes to ``out_csv``; the feedback files (see
    :func:`write_feedback`) to ``feedback_dir``, by default a ``feedback`` folder beside
    the CSV. With ``book_dir`` (the chapters' folder), a submission is also expected to
    report every check of the book's notebook of the same name.
    """
    rows = []
    for student, path, notebook in _submissions(paths):
        for row in grade_notebook(
            path, timeout=timeout, expected=_book_labels(book_dir, notebook)
        ):
            rows.append({"student": student, **row, "notebook": notebook})
    out_csv = Path(out_csv)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    with out_csv.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    write_feedback(
        rows, out_csv.parent / "feedback" if feedback_dir is None else feedback_dir
    )
    return rows


def _feedback_name(student: str) -> str:
    """A safe file name for ``student``'s feedback: letters, digits, ``.``, ``_`` and
    ``-`` only."""
    return (re.sub(r"[^\w.-]+", "_", student).strip("._") or "student") + ".md"


def write_feedback(rows: list[dict], feedback_dir) -> list[Path]:
    """Write ``feedback_dir/<student>.md`` for every student in ``rows`` (the rows
    :func:`grade` returns).

    Each file says, per notebook, how many checks passed and, for every check, PASSED or
    FAILED with the check's message and hint, exactly as the student saw it when running
    the notebook; a notebook that crashed, timed out or could not be read says so first.
    Returns the paths written.
    """
    from . import __version__

    feedback_dir = Path(feedback_dir)
    feedback_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for student in dict.fromkeys(row["student"] for row in rows):
        mine = [row for row in rows if row["student"] == student]
        checks = [row for row in mine if row["label"] != "*"]
        lines = [
            f"# Feedback for {student}",
            "",
            f"{sum(int(r['passed']) for r in checks)} of {len(checks)} checks passed "
            f"(graded with attnbook {__version__}: every notebook re-run from the top "
            "in a fresh kernel).",
            "",
        ]
        for notebook in dict.fromkeys(row["notebook"] for row in mine):
            rows_nb = [row for row in mine if row["notebook"] == notebook]
            checks_nb = [row for row in rows_nb if row["label"] != "*"]
            lines += [
                f"## {notebook}: "
                f"{sum(int(r['passed']) for r in checks_nb)}/{len(checks_nb)} checks "
                "passed",
                "",
            ]
            lines += [
                f"- **The notebook did not run to the end**: {row['message']}. Checks "
                "after that point "
                "could not run; run it top to bottom yourself (Restart & Run All) to "
                "see where it stops."
                for row in rows_nb
                if row["label"] == "*"
            ]
            for row in checks_nb:
                verdict = "PASSED" if int(row["passed"]) else "FAILED"
                lines.append(f"- `[{verdict}] {row['label']}`: {row['message']}")
            lines.append("")
        path = feedback_dir / _feedback_name(student)
        path.write_text("\n".join(lines))
        written.append(path)
    return written


def _summary(rows: list[dict]) -> str:
    """One line per student: checks passed out of checks expected, and failed runs."""
    lines = []
    for student in dict.fromkeys(row["student"] for row in rows):
        mine = [row for row in rows if row["student"] == student]
        checks = [row for row in mine if row["label"] != "*"]
        broken = sorted({row["notebook"] for row in mine if row["label"] == "*"})
        passed = sum(row["passed"] for row in checks)
        line = f"  {student}: {passed}/{len(checks)} checks passed"
        lines.append(
            line + (f"; did not finish: {', '.join(broken)}" if broken else "")
        )
    return "\n".join(lines)


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
        default=1,
        help="points per auto-checked exercise (default: 1)",
    )
    grader = commands.add_parser(
        "grade", help="execute submitted notebooks and write a CSV of their checks"
    )
    grader.add_argument(
        "submissions", nargs="+", help="notebooks, or folders searched for *.ipynb"
    )
    grader.add_argument(
        "--out", default="grades.csv", help="CSV file to write (default: grades.csv)"
    )
    grader.add_argument(
        "--timeout", type=float, default=120, help="seconds per cell (default: 120)"
    )
    grader.add_argument(
        "--feedback",
        default=None,
        help="folder for one feedback file per student (default: feedback/ beside the "
        "CSV)",
    )
    grader.add_argument(
        "--book",
        default="book",
        help="the chapters' folder: a submission must report every check of the "
        "chapter "
        "with its name (default: book, skipped when it does not exist)",
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
            book = args.book if Path(args.book).is_dir() else None
            feedback = (
                Path(args.out).parent / "feedback"
                if args.feedback is None
                else Path(args.feedback)
            )
            rows = grade(
                args.submissions,
                args.out,
                timeout=args.timeout,
                feedback_dir=feedback,
                book_dir=book,
            )
            checks = [row for row in rows if row["label"] != "*"]
            print(
                f"Graded {len({(r['student'], r['notebook']) for r in rows})} "
                "notebooks: "
                f"{sum(r['passed'] for r in checks)}/{len(checks)} checks passed"
            )
            print(_summary(rows))
            print(f"Wrote {args.out} and one feedback file per student in {feedback}/")
    except (ValueError, FileNotFoundError) as err:
        parser.exit(1, f"error: {err}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
