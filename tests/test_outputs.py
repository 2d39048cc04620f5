"""Every ``# NBVAL_CHECK_OUTPUT`` cell prints what it printed when its numbers were written
into the chapter's prose.

The chapters are committed without outputs, so nbval executes them (catching any crash) but
has no reference to compare a checked cell with. The references live in
``tests/checked_outputs.json``, written by ``tools/record_outputs.py``; this test compares
them with the chapters as ``make book`` executed them (``_build/jupyter_execute``). A new
checked cell without a reference fails too, so no check is silently empty.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book").glob("*.ipynb"))
REFERENCE = json.loads((ROOT / "tests" / "checked_outputs.json").read_text())

_spec = importlib.util.spec_from_file_location("record_outputs", ROOT / "tools" / "record_outputs.py")
record_outputs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record_outputs)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_checked_cells_print_their_recorded_output(chapter):
    executed = record_outputs.EXECUTED / chapter.name
    if not executed.exists():
        pytest.fail(f"{executed} is missing: run `make book` first (make test does it)")
    wanted = record_outputs.checked_cells(json.loads(chapter.read_text()))
    ran = record_outputs.checked_cells(json.loads(executed.read_text()))
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
