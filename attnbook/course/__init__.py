"""The course kit, beside the library: student notebooks with the solutions stripped
out, exports to nbgrader and otter-grader, the grader and its sandbox, and their
command line. The library never imports it.

A chapter's coding exercise is a code cell tagged ``solution`` whose answer lies between
nbgrader's markers, followed by a check cell::

    def my_softmax(scores):              # the answer cell, tagged solution, hide-input
        ### BEGIN SOLUTION
        return scores.softmax(-1)
        ### END SOLUTION

    attnbook.exercises.check("attention-masked-softmax", my_softmax)   # the check cell

Four commands turn the book into a course::

    python -m attnbook.course student OUTDIR [--book book]
    python -m attnbook.course nbgrader SOURCE_DIR [--book book] [--points P]
        [--timings DIR]
    python -m attnbook.course otter OUTDIR [--book book] [--points P]
    python -m attnbook.course grade SUBMISSIONS... [--book book] [--out grades.csv]
        [--jobs N] [--timeout 120] [--notebook-timeout 1800] [--memory 6]
        [--output-limit 20] [--require-sandbox | --no-sandbox] [--feedback DIR]
        [--gradebook FILE]

``student`` replaces every marked block by ``raise NotImplementedError(...)`` (so the
check reports "not attempted" until the student writes code), un-hides the stub, clears
outputs and removes the written ``{solution}`` directives. ``grade`` rebuilds each
submission from the book's chapter with only the student's answer cells, runs it in a
kernel under limits, and runs the checks in its own process on new inputs (see
:mod:`attnbook.course.grader` for how, and :mod:`attnbook.course.sandbox` for the
limits); it writes one CSV row per student, notebook and check, a gradebook with points
per chapter, and one Markdown feedback file per student. ``nbgrader`` and ``otter``
export the chapters to the two graders instructors already run: nbgrader (JupyterHub)
and otter-grader (Gradescope); see
:func:`~attnbook.course.notebooks.nbgrader_source` and
:func:`~attnbook.course.notebooks.otter_master`.

nbformat, jupyter_client and pyzmq come with the ``course`` extra: ``pip install
"attnbook[course]"``.
"""

from __future__ import annotations

from . import cli, grader, notebooks, sandbox
from .cli import main
from .grader import grade, write_feedback
from .notebooks import (
    BEGIN,
    END,
    MIN_CELL_TIMEOUT,
    OTTER_TEST,
    SLOWEST_CELL,
    STUB,
    TIMEOUT_MARGIN,
    WRITTEN_PROMPT,
    cell_timeout,
    expected_labels,
    make_nbgrader_source,
    make_otter_masters,
    make_student_bundle,
    nbgrader_config,
    nbgrader_source,
    otter_master,
    slowest_cell,
    strip_solutions,
    written_exercises,
)

__all__ = [
    "strip_solutions",
    "make_student_bundle",
    "nbgrader_source",
    "make_nbgrader_source",
    "expected_labels",
    "written_exercises",
    "slowest_cell",
    "cell_timeout",
    "nbgrader_config",
    "otter_master",
    "make_otter_masters",
    "grade",
    "write_feedback",
    "main",
    "cli",
    "grader",
    "notebooks",
    "sandbox",
    # the constants of the notebook editing, as the graders' exports and tests read them
    "BEGIN",
    "END",
    "STUB",
    "WRITTEN_PROMPT",
    "SLOWEST_CELL",
    "TIMEOUT_MARGIN",
    "MIN_CELL_TIMEOUT",
    "OTTER_TEST",
]
