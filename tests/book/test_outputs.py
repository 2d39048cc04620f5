"""Every chapter ran top to bottom in the book build, and every checked cell (a code cell
tagged ``check-output``) prints what it printed when its numbers were written into the
chapter's prose.

The chapters are committed without outputs and ``make book`` executes each one once. Its
execution cache (``_build/.jupyter_cache``) keeps a run only if it finished without an error,
keyed by the chapter's code, so a chapter whose current code has a cached run is proven to
run; a second execution (nbval) would prove nothing more and cost minutes of CI. The
references of checked cells live in ``tests/checked_outputs.json``, written by
``tools/record_outputs.py``. A new checked cell without a reference fails too, so no check is
silently empty.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest
from scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "book").glob("*.ipynb"))
REFERENCE = json.loads((ROOT / "tests" / "checked_outputs.json").read_text())

record_outputs = load_script(ROOT / "tools" / "record_outputs.py")


def _executed(chapter: Path) -> dict:
    ran = record_outputs.executed_notebook(chapter)
    if ran is None:
        pytest.fail(f"{chapter.name}: the book build has no successful run of its current code "
                    "(it failed, or the book was not built since it changed): run `make book`")
    return ran


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_chapter_ran_top_to_bottom_without_an_error(chapter):
    ran = _executed(chapter)
    code = [c for c in ran["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    assert code, f"{chapter.name} has no code"
    not_run = [c["id"] for c in code if c.get("execution_count") is None]
    assert not not_run, f"{chapter.name}: cells {not_run} never ran"
    errors = [(c["id"], o.get("ename")) for c in code for o in c.get("outputs", [])
              if o["output_type"] == "error"]
    assert not errors, f"{chapter.name}: cells raised {errors}"
    counts = [c["execution_count"] for c in code]
    assert counts == sorted(counts), f"{chapter.name} did not run top to bottom: {counts}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_checked_cells_print_their_recorded_output(chapter):
    wanted = record_outputs.checked_cells(json.loads(chapter.read_text()))
    ran = {cell["id"]: cell for cell in _executed(chapter)["cells"]}
    assert wanted, f"{chapter.name} has no checked cell: its printed numbers are unguarded"
    reference = REFERENCE.get(chapter.stem, {})
    missing = sorted(set(wanted) - set(reference))
    assert not missing, (f"{chapter.name}: checked cells {missing} have no recorded output; "
                         "run tools/record_outputs.py after `make book`")
    for cell_id in wanted:
        got = record_outputs.printed_text(ran[cell_id])
        expected = reference[cell_id]
        assert expected, f"{chapter.name}, cell {cell_id}: a checked cell that prints nothing"
        diff = "\n".join(difflib.unified_diff(expected.splitlines(), got.splitlines(),
                                              "recorded", "executed", lineterm=""))
        assert got == expected, f"{chapter.name}, cell {cell_id} prints something else:\n{diff}"


def test_every_recorded_output_belongs_to_a_checked_cell():
    for chapter in CHAPTERS:
        wanted = record_outputs.checked_cells(json.loads(chapter.read_text()))
        stale = sorted(set(REFERENCE.get(chapter.stem, {})) - set(wanted))
        assert not stale, f"{chapter.name}: recorded outputs {stale} belong to no checked cell"
    assert set(REFERENCE) == {c.stem for c in CHAPTERS}, "a chapter was renamed or removed"


def test_printed_text_keeps_streams_and_results_and_leaves_out_figures():
    cell = {"outputs": [
        {"output_type": "stream", "name": "stdout", "text": ["a = 1  \n", "b\n"]},
        {"output_type": "execute_result", "data": {"text/plain": ["(2, 3)"]}},
        {"output_type": "display_data", "data": {"image/png": "...", "text/plain": ["<Figure>"]}},
        {"output_type": "error", "ename": "ValueError", "evalue": "bad", "traceback": []},
    ]}
    assert record_outputs.printed_text(cell) == "a = 1\nb\n(2, 3)\nValueError: bad"


def test_checked_cells_are_the_code_cells_tagged_check_output():
    """The tag, not a comment in the code, marks a checked cell (readers never see it)."""
    notebook = {"cells": [
        {"cell_type": "code", "id": "a", "metadata": {"tags": ["check-output"]}, "source": "1"},
        {"cell_type": "code", "id": "b", "metadata": {}, "source": "# check-output\n2"},
        {"cell_type": "markdown", "id": "c", "metadata": {"tags": ["check-output"]}, "source": ""},
        {"cell_type": "code", "id": "d", "metadata": {"tags": ["remove-input", "check-output"]},
         "source": "show_source(f)"},
    ]}
    assert list(record_outputs.checked_cells(notebook)) == ["a", "d"]
