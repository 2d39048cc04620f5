"""Every chapter follows one template, read from the notebooks alone (no build):

1. its title cell;
2. the objectives box (cell id ``objectives``), written from the question bank by
   ``python -m tools.template``, which links the chapter's questions and the notation page;
3. the "What runs where" box (cell id ``runs-where``): on a CPU, on a Colab GPU, what differs;
4. its sections, at most one of them holding a "common claim" box;
5. Summary, Exercises and Further reading, the last three sections, in that order.

And every number its prose quotes through myst-nb's glue was recorded by one of its own cells
in the book build's run (read from the execution cache, as ``tests/book/test_outputs.py`` does;
the build fails on a name no cell recorded, this test says which chapter and name), and no two
chapters record the same name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
NOTEBOOKS = {p.stem: json.loads(p.read_text()) for p in sorted(BOOK.glob("*.ipynb"))}
template = load_script(ROOT / "tools" / "template.py")
GLUE_ROLE = re.compile(r"\{glue(?::\w+)?\}`([A-Za-z_]\w*)(?::[^`]*)?`")
record_outputs = load_script(ROOT / "tools" / "record_outputs.py")


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def _markdown(chapter: str) -> list[str]:
    return [_source(c) for c in NOTEBOOKS[chapter]["cells"] if c["cell_type"] == "markdown"]


def _h2(chapter: str) -> list[str]:
    """The level-2 headings of a chapter, outside fenced blocks."""
    found = []
    for text in _markdown(chapter):
        fenced = False
        for line in text.splitlines():
            if line.startswith(("```", "~~~")):
                fenced = not fenced
            elif not fenced and line.startswith("## "):
                found.append(line[3:].strip())
    return found


def test_the_notation_page_is_in_the_book():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    assert "book/notation" in files
    text = (BOOK / "notation.md").read_text()
    for symbol in ("h_{kv}", "d_k", "B_r", "B_c"):
        assert symbol in text, symbol


@pytest.mark.parametrize("chapter", NOTEBOOKS)
def test_the_objectives_box_is_the_question_banks_objectives(chapter):
    cells = NOTEBOOKS[chapter]["cells"]
    assert cells[1].get("id") == "objectives", f"{chapter}: run python -m tools.template"
    assert _source(cells[1]) == template.render(chapter), (
        f"{chapter}: the objectives differ from questions/{chapter}.toml: run python -m tools.template")


@pytest.mark.parametrize("chapter", NOTEBOOKS)
def test_the_what_runs_where_box_follows_the_objectives(chapter):
    cell = NOTEBOOKS[chapter]["cells"][2]
    text = _source(cell)
    assert cell.get("id") == "runs-where", f"{chapter}: cell 2 is not the 'What runs where' box"
    assert text.startswith(":::{admonition} What runs where\n:class: runs-where\n"), chapter
    assert "CPU" in text and "GPU" in text and "differs" in text, chapter
    assert 40 <= len(text.split()) <= 200, f"{chapter}: {len(text.split())} words"


@pytest.mark.parametrize("chapter", NOTEBOOKS)
def test_summary_exercises_and_further_reading_close_the_chapter(chapter):
    assert _h2(chapter)[-3:] == ["Summary", "Exercises", "Further reading"], _h2(chapter)[-4:]
    text = "\n".join(_markdown(chapter))
    reading = text[text.index("## Further reading"):]
    assert 3 <= len(re.findall(r"\{cite:[tp]\}", reading)), f"{chapter}: cite 3 or more works"


@pytest.mark.parametrize("chapter", NOTEBOOKS)
def test_at_most_one_common_claim_box_and_the_phrase_nowhere_else(chapter):
    boxes = [t for t in _markdown(chapter) if ":class: common-claim" in t]
    assert len(boxes) <= 1, f"{chapter}: {len(boxes)} common-claim boxes"
    outside = []
    for text in _markdown(chapter):
        if ":class: common-claim" in text:  # drop the box itself, keep the rest of its cell
            text = re.sub(r":::\{admonition\} A common claim\n:class: common-claim\n.*?\n:::", "", text,
                          flags=re.S)
        outside += re.findall(r"[^.\n]*common claim[^.\n]*", text, flags=re.I)
    assert not outside, f"{chapter}: 'common claim' outside its box: {outside}"


def _recorded(chapter: str) -> set[str]:
    """The names the chapter's cells glued in the book build's run."""
    ran = record_outputs.executed_notebook(BOOK / f"{chapter}.ipynb")
    if ran is None:
        pytest.fail(f"{chapter}: the book build has no successful run of its current code: run `make book`")
    return {output["metadata"]["scrapbook"]["name"]
            for cell in ran["cells"] if cell["cell_type"] == "code"
            for output in cell.get("outputs", [])
            if "scrapbook" in output.get("metadata", {})}  # fmt: skip


@pytest.mark.parametrize("chapter", NOTEBOOKS)
def test_every_glued_number_is_recorded_by_the_chapter(chapter):
    quoted = {name for text in _markdown(chapter) for name in GLUE_ROLE.findall(text)}
    missing = quoted - _recorded(chapter)
    assert not missing, f"{chapter}: quoted but never glued: {sorted(missing)}"


def test_glued_names_are_unique_across_the_book():
    owners: dict[str, list[str]] = {}
    for chapter in NOTEBOOKS:
        for name in _recorded(chapter):
            owners.setdefault(name, []).append(chapter)
    shared = {name: chapters for name, chapters in owners.items() if len(chapters) > 1}
    assert not shared, shared
