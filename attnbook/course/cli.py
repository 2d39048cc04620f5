"""The course kit's command line, ``python -m attnbook.course``: see
:mod:`attnbook.course`."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from . import grader, sandbox
from .notebooks import make_nbgrader_source, make_otter_masters, make_student_bundle

__all__ = ["main"]

# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------
#: The ``--book`` option of the commands that read the chapters.
_BOOK_OPTION = {
    "default": "book",
    "help": "folder with the chapter notebooks (default: book)",
}


def _package_doc() -> str:
    """The course kit's docstring (:mod:`attnbook.course`), which the help quotes."""
    import importlib

    return importlib.import_module(__package__).__doc__ or ""


def main(argv=None) -> int:
    """``python -m attnbook.course student|nbgrader|otter|grade ...``: see the module's
    docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m attnbook.course",
        description=" ".join(_package_doc().split("\n\n")[0].split()),
    )
    commands = parser.add_subparsers(dest="command", required=True)
    student = commands.add_parser(
        "student", help="write student notebooks (solutions stubbed out) and a README"
    )
    student.add_argument("outdir", help="folder for the student notebooks")
    student.add_argument("--book", **_BOOK_OPTION)
    nbg = commands.add_parser(
        "nbgrader", help="write nbgrader source notebooks, one assignment per chapter"
    )
    nbg.add_argument("outdir", help="nbgrader's source/ folder")
    nbg.add_argument("--book", **_BOOK_OPTION)
    nbg.add_argument(
        "--points",
        type=float,
        default=None,
        help="points per auto-checked exercise (default: each chapter's "
        "metadata.attnbook.points, 1 where it lists none)",
    )
    nbg.add_argument(
        "--timings",
        default=None,
        help="folder of the chapters executed where you grade (e.g. an autograded "
        "submission's folder): the cell timeout comes from their slowest cells "
        "(default: the book's measured table, course.SLOWEST_CELL)",
    )
    otter = commands.add_parser(
        "otter",
        help="write otter-grader master notebooks (Gradescope), one per chapter",
    )
    otter.add_argument("outdir", help="folder for the master notebooks")
    otter.add_argument("--book", **_BOOK_OPTION)
    otter.add_argument(
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
        help="seconds per notebook, and as many CPU seconds for all its processes "
        f"together (default: {limits.notebook_timeout:g})",
    )
    grading.add_argument(
        "--memory",
        type=float,
        default=limits.memory / sandbox.GIB,
        help="GiB of memory per process of a submission, and for all of them "
        f"together (default: {limits.memory / sandbox.GIB:g})",
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
            written = make_nbgrader_source(
                args.book, args.outdir, points=args.points, timings_dir=args.timings
            )
            print(
                f"Wrote {len(written) - 1} nbgrader assignments and {written[-1].name} "
                f"to {args.outdir}: copy {written[-1].name} into your course folder; "
                "nbgrader generate_assignment <chapter> makes the release versions"
            )
        elif args.command == "otter":
            written = make_otter_masters(args.book, args.outdir, points=args.points)
            print(
                f"Wrote {len(written)} otter master notebooks to {args.outdir}: "
                "otter assign <chapter>/<chapter>.ipynb dist/<chapter> writes the "
                "student notebook and the Gradescope autograder zip"
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

