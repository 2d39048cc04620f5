"""The chapters' objectives box, written from the question bank's objectives, so a chapter
promises exactly what its questions test.

    python -m tools.template                  # every chapter
    python -m tools.template flash kv_cache   # these chapters only
    python -m tools.template --check          # exit 1 where a chapter's box differs

The box is the markdown cell with id ``objectives`` right after a chapter's title cell
(inserted there when missing). The rest of the chapter template (a "What runs where" box
after it; Summary, Exercises and Further reading as the last three sections) is written
by hand and checked by ``tests/book/test_template.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BANK = ROOT / "questions"
BOOK = ROOT / "book"
CELL_ID = "objectives"


def objectives(chapter: str) -> list[str]:
    """The objectives of ``questions/<chapter>.toml``, in order."""
    return tomllib.loads((BANK / f"{chapter}.toml").read_text())["objectives"]


def render(chapter: str) -> str:
    """The objectives box of a chapter, as MyST markdown."""
    items = "\n".join(f"{n}. {text}" for n, text in enumerate(objectives(chapter), 1))
    return (
        ":::{admonition} Objectives\n"
        ":class: objectives\n\n"
        "After this chapter you can:\n\n"
        f"{items}\n\n"
        f"The chapter's {{doc}}`questions <questions/{chapter}>` test each objective; "
        "its symbols are those of the {doc}`notation page <notation>`.\n"
        ":::"
    )


def apply(chapter: str, check: bool = False) -> bool:
    """Write (or, with ``check``, compare) the box of one chapter; True when it was
    already right."""
    path = BOOK / f"{chapter}.ipynb"
    nb = json.loads(path.read_text())
    cells = nb["cells"]
    want = render(chapter)
    at = next((i for i, c in enumerate(cells) if c.get("id") == CELL_ID), None)
    if at == 1 and "".join(cells[1]["source"]) == want:
        return True
    if check:
        return False
    if at is not None:
        cells.pop(at)
    cell = {"cell_type": "markdown", "id": CELL_ID, "metadata": {}, "source": want.splitlines(keepends=True)}
    cells.insert(1, cell)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return False


def chapters() -> list[str]:
    """Every chapter with a question bank."""
    return sorted(p.stem for p in BANK.glob("*.toml") if (BOOK / f"{p.stem}.ipynb").exists())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", help="chapters to write (default: all)")
    parser.add_argument("--check", action="store_true", help="only compare")
    args = parser.parse_args(argv)
    names = args.chapters or chapters()
    unknown = sorted(set(names) - set(chapters()))
    if unknown:
        parser.error(f"no chapter with a question bank: {', '.join(unknown)}")
    stale = [name for name in names if not apply(name, check=args.check)]
    if args.check and stale:
        print("objectives box differs from questions/<chapter>.toml in: " + ", ".join(stale)
              + " (run python -m tools.template)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
