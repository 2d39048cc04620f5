"""What grading a class costs: kernel start-up with and without the sandbox, and a class of N
submissions of one chapter graded with --jobs J.

    .venv/bin/python benchmarks/bench_grading.py                 # 30 submissions of chapter 1
    .venv/bin/python benchmarks/bench_grading.py --students 10 --chapter kv_cache --jobs 2

The class is a third right answers (the book's solutions), a third blank (the student version), a
third with a wrong first answer. Run it on an otherwise idle machine: it measures wall-clock time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from attnbook import course
from attnbook.course import grader, sandbox

ROOT = Path(__file__).resolve().parent.parent


def startup(isolation: str, repeat: int) -> list[float]:
    """Seconds from launching a kernel to its first executed cell (``1 + 1``)."""
    times = []
    for _ in range(repeat):
        with sandbox.process_guard(256) as guard:
            start = time.perf_counter()
            with grader.KernelSession(sandbox.Limits(), guard, isolation) as kernel:
                kernel.run("1 + 1")
                times.append(time.perf_counter() - start)
    return times


def make_class(chapter: Path, n: int, folder: Path) -> None:
    book = nbformat.read(chapter, as_version=4)
    blank = course.strip_solutions(book)
    wrong = course.strip_solutions(book)
    first = next(c for c in wrong.cells if course.STUB in c.source)
    first.source = first.source.replace(course.STUB, "return None  # a wrong answer")
    for i in range(n):
        nb = (book, blank, wrong)[i % 3]
        (folder / f"student{i:02d}").mkdir(parents=True)
        nbformat.write(nb, folder / f"student{i:02d}" / chapter.name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--chapter", default="attention", help="a book/<name>.ipynb")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5, help="kernel starts timed per mode")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    modes = ["none"] + (["bwrap"] if sandbox.bwrap_works() else [])
    print(f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}; sandbox: {modes[-1]}")
    medians = {}
    for mode in modes:
        times = startup(mode, args.repeat)
        medians[mode] = statistics.median(times)
        print(f"kernel start-up, isolation {mode:5}: median {medians[mode]:.2f} s "
              f"(min {min(times):.2f}, max {max(times):.2f}, {args.repeat} starts)")
    if "bwrap" in medians:
        print(f"the sandbox adds {medians['bwrap'] - medians['none']:+.2f} s per notebook")
    chapter = ROOT / "book" / f"{args.chapter}.ipynb"
    with tempfile.TemporaryDirectory() as tmp:
        subs = Path(tmp) / "submissions"
        make_class(chapter, args.students, subs)
        start = time.perf_counter()
        rows = grader.grade([subs], Path(tmp) / "out" / "grades.csv", book_dir=ROOT / "book",
                            jobs=args.jobs, isolation=modes[-1])
        took = time.perf_counter() - start
    checks = [r for r in rows if r["label"] != grader.NOTEBOOK]
    errors = [r for r in rows if r["label"] == grader.NOTEBOOK and r["status"] == "error"]
    print(f"{args.students} submissions of {chapter.name}, --jobs {args.jobs}, isolation "
          f"{modes[-1]}: {took:.0f} s ({took / args.students:.1f} s per submission), "
          f"{sum(r['passed'] for r in checks)}/{len(checks)} checks passed, "
          f"{len(errors)} notebooks did not finish")
    return 0


if __name__ == "__main__":
    sys.exit(main())
