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

The checks of every chapter's exercises live here too (:mod:`attnbook.course.checks`),
one module per chapter; a reader's notebook calls them through
:mod:`attnbook.exercises`. The package loads its submodules when first touched, so a
chapter that imports the checks loads neither the grader nor the sandbox.

nbformat, jupyter_client and pyzmq come with the ``course`` extra: ``pip install
"attnbook[course]"``.
"""

from __future__ import annotations

import importlib

# where each public name lives; the submodules load when first touched
_SUBMODULES = ("checks", "cli", "grader", "notebooks", "sandbox")
_NAMES = {
    "main": "cli",
    "grade": "grader",
    "write_feedback": "grader",
    **{
        name: "notebooks"
        for name in (
            "BEGIN",
            "END",
            "HIDDEN",
            "MIN_CELL_TIMEOUT",
            "OTTER_TEST",
            "SLOWEST_CELL",
            "STUB",
            "TIMEOUT_MARGIN",
            "WRITTEN_PROMPT",
            "cell_timeout",
            "expected_labels",
            "hidden_checks",
            "make_nbgrader_source",
            "make_otter_masters",
            "make_student_bundle",
            "nbgrader_config",
            "nbgrader_source",
            "otter_master",
            "rubrics",
            "slowest_cell",
            "strip_solutions",
            "written_exercises",
        )
    },
}

__all__ = sorted(_NAMES) + list(_SUBMODULES)


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _NAMES:
        module = importlib.import_module(f".{_NAMES[name]}", __name__)
        return getattr(module, name)
    raise AttributeError(f"module 'attnbook.course' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SUBMODULES) | set(_NAMES))
