"""Record the printed output of every checked cell, the reference that CI compares with.

Chapters are committed without outputs. The book build executes each one once and keeps
the result in its execution cache (``_build/.jupyter_cache``), keyed by the chapter's
code: a chapter whose current code has a cached result ran top to bottom without an error
(the build does not cache a failed run). ``tests/book/test_outputs.py`` reads that result to
check that every chapter ran and that every checked cell (a code cell tagged
``check-output`` in its ``metadata.tags``, which readers never see) printed what it
printed when its numbers were written into the prose; the text is kept in
``tests/checked_outputs.json`` (chapter -> cell id -> text). After changing what a
checked cell prints on purpose::

    make book && .venv/bin/python tools/record_outputs.py [EXECUTED_DIR]

then read the diff of ``tests/checked_outputs.json`` before committing it.
``EXECUTED_DIR``, a folder of executed notebooks, replaces the cache when given.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "_build" / ".jupyter_cache"
REFERENCE = ROOT / "tests" / "checked_outputs.json"
TAG = "check-output"


def checked_cells(notebook: dict) -> dict[str, dict]:
    """The code cells of ``notebook`` tagged ``check-output``, by id."""
    return {
        cell["id"]: cell
        for cell in notebook["cells"]
        if cell["cell_type"] == "code" and TAG in cell["metadata"].get("tags", [])
    }


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


def executed_notebook(chapter: Path, cache: Path = CACHE) -> dict | None:
    """The book build's successful execution of ``chapter`` as it is now (a notebook
    dict), or ``None`` when its current code has none: never built, changed since, or
    failed."""
    import nbformat
    from jupyter_cache import get_cache

    if not (cache / "global.db").exists():
        return None
    store = get_cache(cache)
    try:
        record = store.match_cache_notebook(nbformat.read(chapter, as_version=4))
    except KeyError:
        return None
    return json.loads(nbformat.writes(store.get_cache_bundle(record.pk).nb))


def record(book: Path = ROOT / "book", executed: Path | None = None) -> dict:
    reference = {}
    for path in sorted(book.glob("*.ipynb")):
        if executed is None:
            ran = executed_notebook(path)
            if ran is None:
                raise SystemExit(f"{path.name} has no successful run: `make book` first")
        else:
            if not (executed / path.name).exists():
                raise SystemExit(f"{executed / path.name} is missing")
            ran = json.loads((executed / path.name).read_text())
        wanted = checked_cells(json.loads(path.read_text()))
        done = {cell["id"]: cell for cell in ran["cells"]}
        reference[path.stem] = {cid: printed_text(done[cid]) for cid in wanted}
    return reference


def main(argv: list[str]) -> int:
    reference = record(executed=Path(argv[0]) if argv else None)
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
