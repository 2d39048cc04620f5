"""The question bank: from ``questions/<chapter>.toml`` (the format is in
``questions/README.md``) to the chapters' question pages and the checks' data.

    python -m tools.questions           # write the pages and questions.json
    python -m tools.questions --check   # exit 1 when they differ from the sources

Each page, ``book/questions/<chapter>.ipynb``, lists the chapter's objectives with the
questions that test each, then every question as an exercise: its prompt and options,
an answer cell (``def answer_3(): ... return "C"``, the return line between the solution
markers, so the student edition and the student notebooks keep only a stub), its check,
and a ``{solution}`` directive with the answer and its explanation, which only the
instructor edition shows. The pages are not executed by the book build (their check
outputs would show the explanations); the tests grade them instead.

``attnbook/course/checks/questions.json`` holds, per question, the digest of its answer
and its explanation sealed with that answer (:mod:`attnbook.course.checks.questions`).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tomllib
from pathlib import Path

import nbformat

from attnbook.course.checks.questions import LETTERS, canonical, digest, seal

ROOT = Path(__file__).resolve().parents[1]
BANK = ROOT / "questions"
PAGES = ROOT / "book" / "questions"
DATA = ROOT / "attnbook" / "course" / "checks" / "questions.json"
KINDS = ("choice", "number")
REQUIRED = {
    "choice": {"objective", "section", "kind", "prompt", "options", "answer",
               "explanation"},
    "number": {"objective", "section", "kind", "prompt", "answer", "digits",
               "explanation"},
}  # fmt: skip


def sections(chapter_nb) -> dict[str, str]:
    """label -> title of each ``(label)=`` target followed by a heading in a chapter."""
    found = {}
    for cell in chapter_nb.cells:
        if cell.cell_type == "markdown":
            for label, title in re.findall(
                r"^\(([\w-]+)\)=\s*\n#+\s+(.+)$", cell.source, re.MULTILINE
            ):
                found[label] = title.strip()
    return found


def load(path: Path, book: Path = ROOT / "book") -> dict:
    """The bank of ``path``, checked: raises ``ValueError`` naming the file and the
    question for anything the format forbids."""
    bank = tomllib.loads(path.read_text())
    chapter = bank.get("chapter")
    if chapter != path.stem:
        raise ValueError(f"{path.name}: chapter = {chapter!r}, expected {path.stem!r}")
    notebook = book / f"{chapter}.ipynb"
    if not notebook.exists():
        raise ValueError(f"{path.name}: no chapter {notebook}")
    titles = sections(nbformat.read(notebook, as_version=4))
    objectives = bank.get("objectives", [])
    questions = bank.get("question", [])
    if not 10 <= len(questions) <= 15:
        raise ValueError(f"{path.name}: {len(questions)} questions, not 10 to 15")
    for n, q in enumerate(questions, 1):
        where = f"{path.name}, question {n}"
        kind = q.get("kind")
        if kind not in KINDS:
            raise ValueError(f"{where}: kind {kind!r} is not one of {KINDS}")
        if set(q) != REQUIRED[kind]:
            raise ValueError(
                f"{where}: keys {sorted(set(q))}, expected {sorted(REQUIRED[kind])}"
            )
        if not 1 <= q["objective"] <= len(objectives):
            raise ValueError(f"{where}: objective {q['objective']} is not 1 to "
                             f"{len(objectives)}")  # fmt: skip
        if q["section"] not in titles:
            raise ValueError(f"{where}: {q['section']!r} is no section of {chapter}")
        if kind == "choice":
            letters = LETTERS[: len(q["options"])]
            if not 3 <= len(q["options"]) <= 5 or q["answer"] not in letters:
                raise ValueError(f"{where}: {len(q['options'])} options, answer "
                                 f"{q['answer']!r}")  # fmt: skip
        else:
            value, digits = q["answer"], q["digits"]
            if digits == 0 and value != int(value):
                raise ValueError(f"{where}: digits = 0 needs an integer answer")
            if digits:
                _check_rounding(value, digits, where)
    covered = {q["objective"] for q in questions}
    missing = sorted(set(range(1, len(objectives) + 1)) - covered)
    if missing:
        raise ValueError(f"{path.name}: no question tests objectives {missing}")
    return {**bank, "titles": titles}


def _check_rounding(value: float, digits: int, where: str) -> None:
    """A rounded answer must stay 0.1 of a unit of its last digit off a rounding
    boundary, so every answer a student rounds correctly matches."""
    from decimal import Decimal

    exponent = Decimal(repr(float(value))).adjusted() - digits + 1
    units = abs(value) / 10.0**exponent  # the value in units of the last kept digit
    if abs(units - math.floor(units) - 0.5) < 0.1:
        raise ValueError(f"{where}: {value} lies near a rounding boundary at "
                         f"{digits} significant figures")  # fmt: skip


def label(chapter: str, n: int) -> str:
    return f"{chapter}-q{n}"


def _title(chapter_nb) -> str:
    for line in chapter_nb.cells[0].source.splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    raise ValueError("the chapter's first cell has no '# ' title")


def _install(chapter_nb) -> str:
    """The chapter's install cell: its first code cell (the objectives and "What runs
    where" boxes come before it)."""
    return next(c.source for c in chapter_nb.cells if c.cell_type == "code")


def _what(q: dict) -> str:
    if q["kind"] == "choice":
        letters = LETTERS[: len(q["options"])]
        return f'one letter, "{letters[0]}" to "{letters[-1]}"'
    if q["digits"] == 0:
        return "an integer"
    return f"a number, to {q['digits']} significant figures"


def _right(q: dict) -> str:
    if q["kind"] == "choice":
        return f'"{q["answer"]}"'
    return repr(int(q["answer"]) if q["digits"] == 0 else float(q["answer"]))


def page(bank: dict, book: Path = ROOT / "book"):
    """The question page of ``bank`` as a notebook."""
    chapter, questions = bank["chapter"], bank["question"]
    chapter_nb = nbformat.read(book / f"{chapter}.ipynb", as_version=4)
    title = _title(chapter_nb)
    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    tested = []
    for n, objective in enumerate(bank["objectives"], 1):
        refs = [f"{{ref}}`{i} <{label(chapter, i)}>`"
                for i, q in enumerate(questions, 1) if q["objective"] == n]  # fmt: skip
        which = "question" if len(refs) == 1 else "questions"
        tested.append(f"{n}. {objective} ({which} {', '.join(refs)})")
    cells = [
        md(
            f"(sec-questions-{chapter})=\n# Questions: {title}\n\n"
            "These questions test the objectives of "
            f"{{doc}}`the chapter <../{chapter}>`, "
            "each followed by the questions that test it. Answer a question in its "
            "cell, as the cell's docstring says, and run the check below it: it says "
            "whether you are right and, when you are, why; a wrong answer is told "
            "which section to reread.\n\n"
            "After this chapter you can:\n\n" + "\n".join(tested),
            id="questions-intro",
        ),
        code(_install(chapter_nb), id="install"),  # the chapter's install cell
        code("import attnbook.exercises  # the checks", id="imports"),
    ]
    for n, q in enumerate(questions, 1):
        name = label(chapter, n)
        options = ""
        if q["kind"] == "choice":
            options = "\n\n" + "\n".join(
                f"- **{letter}.** {text.strip()}"
                for letter, text in zip(LETTERS, q["options"])
            )
        cells += [
            md(
                f"````{{exercise}} Question {n}\n:label: {name}\n\n"
                f"{q['prompt'].strip()}{options}\n````",
                id=f"q{n}-question",
            ),
            code(
                f"def answer_{n}():\n"
                f'    """Your answer to question {n}: {_what(q)}."""\n'
                "    ### BEGIN SOLUTION\n"
                f"    return {_right(q)}\n"
                "    ### END SOLUTION",
                id=f"q{n}-answer",
                metadata={"tags": ["solution", "hide-input"]},
            ),
            code(
                f'attnbook.exercises.check("{name}", answer_{n})', id=f"q{n}-check"
            ),
            md(
                f"````{{solution}} {name}\n:class: dropdown\n\n"
                f"**Answer: {q['answer']}.** {q['explanation'].strip()}\n\n"
                f"Section: {{ref}}`{q['section']}`.\n````",
                id=f"q{n}-solution",
            ),
        ]
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python",
                       "name": "python3"},
        "language_info": {"name": "python"},
        "mystnb": {"execution_mode": "off"},
        "attnbook": {"points": {label(chapter, n): 1
                                for n in range(1, len(questions) + 1)}},
    }  # fmt: skip
    return nb


def data(banks: list[dict]) -> dict:
    """What the checks need: per question its kind, digest and sealed explanation."""
    out = {}
    for bank in banks:
        chapter = bank["chapter"]
        for n, q in enumerate(bank["question"], 1):
            name = label(chapter, n)
            options = len(q.get("options", []))
            text = canonical(q["kind"], q["answer"], q.get("digits", 0), options)
            section = bank["titles"][q["section"]]
            entry = {
                "kind": q["kind"],
                "digest": digest(name, text),
                "explanation": seal(name, text, q["explanation"].strip()),
                "section": f"“{section}” of the chapter",
            }
            entry.update({"options": options} if options else {"digits": q["digits"]})
            out[name] = entry
    return {
        "about": "Written by python -m tools.questions from questions/*.toml.",
        "questions": out,
    }


def banks(folder: Path = BANK) -> list[dict]:
    return [load(path) for path in sorted(folder.glob("*.toml"))]


def outputs(all_banks: list[dict]) -> dict[Path, str]:
    """Every file the bank makes, path -> text."""
    files = {
        PAGES / f"{b['chapter']}.ipynb": nbformat.writes(page(b)) + "\n"
        for b in all_banks
    }
    files[DATA] = json.dumps(data(all_banks), indent=1, ensure_ascii=False) + "\n"
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a generated file is stale")  # fmt: skip
    args = parser.parse_args(argv)
    files = outputs(banks())
    stale = [p for p, text in files.items()
             if not p.exists() or p.read_text() != text]  # fmt: skip
    if args.check:
        for path in stale:
            print(f"stale: {path.relative_to(ROOT)} (run python -m tools.questions)")
        return 1 if stale else 0
    PAGES.mkdir(parents=True, exist_ok=True)
    for path in stale:
        path.write_text(files[path])
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
