"""Record the printed output of every checked cell, the reference that CI compares with.

Chapters are committed without outputs, so nbval has nothing to compare a
``# NBVAL_CHECK_OUTPUT`` cell with. Instead, the text such a cell prints is kept in
``tests/checked_outputs.json`` (chapter -> cell id -> text), and
``tests/test_outputs.py`` compares it with the chapter as the book build executed it
(``_build/jupyter_execute``). After changing what a checked cell prints on purpose::

    make book && .venv/bin/python tools/record_outputs.py [EXECUTED_DIR]

(``EXECUTED_DIR`` defaults to ``_build/jupyter_execute/book``), then read the diff of ``tests/checked_outputs.json`` before committing it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXECUTED = ROOT / "_build" / "jupyter_execute" / "book"
REFERENCE = ROOT / "tests" / "checked_outputs.json"
MARKER = "# NBVAL_CHECK_OUTPUT"


def checked_cells(notebook: dict) -> dict[str, dict]:
    """The code cells of ``notebook`` whose first line is the check marker, by id."""
    cells = {}
    for cell in notebook["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and source.lstrip().startswith(MARKER):
            cells[cell["id"]] = cell
    return cells


def printed_text(cell: dict) -> str:
    """What a reader sees printed under a cell: its streams and plain-text results (images
    and HTML are left out), with trailing spaces removed."""
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append("".join(out["text"]))
        elif out["output_type"] in ("execute_result", "display_data"):
            data = out.get("data", {})
            if "text/plain" in data and not {"image/png", "text/html"} & set(data):
                parts.append("".join(data["text/plain"]) + "\n")
        elif out["output_type"] == "error":
            parts.append(f"{out['ename']}: {out['evalue']}\n")
    text = "".join(parts)
    return "\n".join(line.rstrip() for line in text.splitlines())


def record(book: Path = ROOT / "book", executed: Path = EXECUTED) -> dict:
    reference = {}
    for path in sorted(book.glob("*.ipynb")):
        ran = executed / path.name
        if not ran.exists():
            raise SystemExit(f"{ran} is missing: run `make book` first")
        wanted = checked_cells(json.loads(path.read_text()))
        done = checked_cells(json.loads(ran.read_text()))
        reference[path.stem] = {cid: printed_text(done[cid]) for cid in wanted}
    return reference


def main(argv: list[str]) -> int:
    executed = Path(argv[0]) if argv else EXECUTED
    reference = record(executed=executed)
    empty = [
        f"{ch}/{cid}"
        for ch, cells in reference.items()
        for cid, s in cells.items()
        if not s
    ]
    if empty:
        raise SystemExit(f"checked cells that print nothing guard nothing: {empty}")
    REFERENCE.write_text(json.dumps(reference, indent=1, ensure_ascii=False) + "\n")
    cells = sum(len(v) for v in reference.values())
    print(f"recorded {cells} checked cells of {len(reference)} chapters in {REFERENCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
