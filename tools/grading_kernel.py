"""The kernel CI executes the book in: Python from a venv holding attnbook's `grading` extra alone.

Instructors grade in a kernel that installs ``attnbook[grading]`` (book/course.md), while the
book is built in .venv, which holds the book, course, test and gpu extras too. So CI runs every
chapter of the book build in a kernel whose Python sees only attnbook, its dependencies and its
`grading` extra: a chapter that imports anything else raises there, and the build, which allows
no error, fails on the push that brought the import, not at the next release's
``make test-grading``. Its three steps, as .ci/run runs them::

    .venv/bin/python tools/grading_kernel.py build _build/grading-kernel
    make test BOOK_KERNELS=_build/grading-kernel
    .venv/bin/python tools/grading_kernel.py check _build/grading-kernel

``build DIR`` writes DIR/venv (tests/environments.py: hard links to the files .venv has
installed, in seconds) and DIR/kernels/python3/kernel.json. The Makefile puts DIR first on
JUPYTER_PATH for the book build only when BOOK_KERNELS is set, and Jupyter looks a kernel up
in JUPYTER_PATH before anywhere else; ``make book`` without it uses .venv's kernel as always.

The kernel is this file run by DIR/venv's python (``launch``): it starts ipykernel as
``python -m ipykernel_launcher`` does and appends to DIR/kernel.log one JSON line when it
starts (its ``sys.prefix``, ``sys.path`` and the distributions it can import) and one per
cell it runs (the cell's SHA-256, whether it raised, and every module loaded from a
site-packages folder other than its own).

``check DIR`` then requires, for every chapter in book/, a kernel of DIR/venv that ran exactly
the chapter's code cells, in order, without an error; and of every kernel, that it could see
exactly the distributions the grading extra installs and loaded no module from another
environment. It prints what it proved, or what failed. It needs a book build that executed
every chapter, as CI's clean clone does: a chapter whose run came from an older execution cache
has no kernel in the log.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOG = "kernel.log"


def digest(source: str) -> str:
    """The SHA-256 of a cell's source, as the log records it."""
    return hashlib.sha256(source.encode()).hexdigest()


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _elsewhere(path: str, prefix: str) -> bool:
    """Whether ``path`` lies in a site-packages folder outside the environment ``prefix``."""
    parts = Path(path).parts
    if "site-packages" not in parts and "dist-packages" not in parts:
        return False
    real, home = os.path.realpath(path), os.path.realpath(prefix)
    return os.path.commonpath([real, home]) != home


# ---------------------------------------------------------------------------------------------
# The kernel (run by the grading venv's python: the standard library and ipykernel only)
# ---------------------------------------------------------------------------------------------
def launch(log: Path, argv: list[str]) -> None:
    """Start an IPython kernel with ``argv`` (``-f CONNECTION_FILE``) that records itself
    and each cell it runs in ``log``."""
    from importlib.metadata import distributions

    sys.path[0] = os.getcwd()  # as under `python -m ipykernel_launcher`, not tools/
    kernel, reported = uuid.uuid4().hex, set()

    def write(record: dict) -> None:
        with open(log, "a") as f:
            f.write(json.dumps({"kernel": kernel, **record}) + "\n")

    write({
        "prefix": sys.prefix,
        "python": sys.version.split()[0],
        "path": sys.path,
        "distributions": sorted({canonical(d.metadata["Name"] or "?") for d in distributions()}),
    })

    def ran(result) -> None:
        foreign = []
        for name, module in list(sys.modules.items()):
            if name in reported:
                continue
            reported.add(name)
            file = getattr(module, "__file__", None)
            if isinstance(file, str) and _elsewhere(file, sys.prefix):
                foreign.append(f"{name} ({file})")
        cell = digest(result.info.raw_cell)
        write({"cell": cell, "error": not result.success, "foreign": foreign})

    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize(argv)
    app.shell.events.register("post_run_cell", ran)
    app.start()


# ---------------------------------------------------------------------------------------------
# build and check (run by .venv's python)
# ---------------------------------------------------------------------------------------------
def build(where: Path) -> Path:
    """A fresh ``where``: the grading venv in ``where/venv`` and the kernel spec
    ``where/kernels/python3``; returns the spec's folder."""
    sys.path.insert(0, str(ROOT / "tests"))
    from environments import grading_venv

    where = where.resolve()
    if where.exists():
        shutil.rmtree(where)
    where.mkdir(parents=True)
    python = grading_venv(where / "venv", ROOT)
    # the spec `ipykernel install` writes for that python, this file in place of the launcher
    done = subprocess.run(
        [str(python), "-c", "import json; from ipykernel.kernelspec import get_kernel_dict; "
         "print(json.dumps(get_kernel_dict()))"], capture_output=True, text=True, check=True)
    kernel = json.loads(done.stdout)
    at = kernel["argv"].index("-m")
    if kernel["argv"][at + 1] != "ipykernel_launcher":
        raise RuntimeError(f"build: unexpected ipykernel argv {kernel['argv']}")
    this = str(Path(__file__).resolve())
    kernel["argv"][at : at + 2] = [this, "launch", str(where / LOG)]
    kernel["display_name"] = "Python 3 (attnbook[grading] alone)"
    spec = where / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps(kernel, indent=1) + "\n")
    return spec


def kernels(where: Path) -> dict[str, dict]:
    """The kernels ``where/kernel.log`` records: id -> their start record, with the list
    of the cells they ran under "cells"."""
    found = {}
    log = where / LOG
    for line in log.read_text().splitlines() if log.is_file() else []:
        record = json.loads(line)
        kernel = found.setdefault(record.pop("kernel"), {"cells": []})
        if "cell" in record:
            kernel["cells"].append(record)
        else:
            kernel.update(record)
    return found


def check(where: Path, book: Path = ROOT / "book") -> tuple[list[str], list[str]]:
    """What ``where/kernel.log`` proves about the chapters in ``book``: (the lines of the
    proof, the failures); the proof holds only if there is no failure."""
    sys.path.insert(0, str(ROOT / "tests"))
    from environments import grading_requirements, installed_closure

    where = where.resolve()
    venv = os.path.realpath(where / "venv")
    grading = [*grading_requirements(ROOT), "setuptools", "pip"]  # as environments.grading_venv
    expected = set(installed_closure(grading)) | {"attnbook"}
    found, failures = kernels(where), []
    for kernel, run in found.items():
        if os.path.realpath(run.get("prefix", "")) != venv:
            failures.append(f"kernel {kernel} ran in {run.get('prefix')}, not in {venv}")
        seen = set(run.get("distributions", []))
        if seen != expected:
            failures.append(f"kernel {kernel} saw other distributions than the grading extra's: "
                            f"{sorted(seen - expected)} more, {sorted(expected - seen)} fewer")
        paths = [p for p in run.get("path", []) if _elsewhere(p, venv)]
        foreign = [m for cell in run["cells"] for m in cell["foreign"]]
        if paths or foreign:
            failures.append(f"kernel {kernel} reached another environment: sys.path {paths}, "
                            f"modules {foreign[:10]}")
    chapters = sorted(book.glob("*.ipynb"))
    for chapter in chapters:
        cells = json.loads(chapter.read_text())["cells"]
        sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        code = [digest(source) for source in sources if source.strip()]
        runs = [run for run in found.values() if [c["cell"] for c in run["cells"]] == code]
        if not runs:
            failures.append(f"{chapter.name}: no kernel of {where} ran its {len(code)} code cells "
                            "(the book build did not execute it there: did it reuse an older cache?)")
        elif all(any(c["error"] for c in run["cells"]) for run in runs):
            failures.append(f"{chapter.name}: a cell raised in the grading kernel")
    from importlib.metadata import distributions

    others = {canonical(d.metadata["Name"] or "") for d in distributions()} - expected
    dev = [name for name in ("jupyter-book", "pytest", "nbgrader", "otter-grader") if name in others]
    python = ", ".join(sorted({str(run.get("python")) for run in found.values()}))
    proof = [
        f"{len(chapters)} of {len(chapters)} chapters in {book} ran, every cell without an error, "
        f"in kernels of {venv} (Python {python}); {len(found)} kernels in all",
        f"each kernel could import exactly {len(expected)} distributions: attnbook, its "
        "dependencies and its grading extra",
        f"out of its reach: the other {len(others)} distributions of {sys.prefix}, "
        f"{', '.join(dev)} among them",
        "no kernel loaded a module from another environment's site-packages",
    ]
    return proof, failures


def main(argv: list[str]) -> int:
    if argv[:1] == ["launch"] and len(argv) >= 2:
        launch(Path(argv[1]), argv[2:])
        return 0
    if len(argv) != 2 or argv[0] not in ("build", "check"):
        print("usage: python tools/grading_kernel.py build|check DIR", file=sys.stderr)
        return 2
    where = Path(argv[1])
    if argv[0] == "build":
        spec = build(where)
        print(f"Grading kernel: {spec / 'kernel.json'}, Python {where.resolve() / 'venv'}")
        return 0
    proof, failures = check(where)
    if failures:
        print("The chapters did not all run in a kernel from the grading extra alone:",
              *failures, sep="\n  ", file=sys.stderr)
        return 1
    print("Grading kernel:", *proof, sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
