"""Every figure of the book is numbered, captioned and described, read from the notebooks alone
(no build, no browser: ``tests/book/test_site.py`` checks the rendered pages).

A code cell that draws (``plt.show()``, or an explorer of ``attnbook.widgets``, which draws its
static picture) carries myst-nb's cell metadata ``mystnb.figure.caption``/``name`` and
``mystnb.image.alt``, so the website shows its output as a numbered figure with alt text. The
drawn diagrams of ``book/figures/diagrams`` (``python -m tools.diagrams``) are MyST figures in
the sections their manifest names. Readers see neither test markers nor the calls that print
listings: checked cells carry the ``check-output`` tag, and cells that only call
``show_source`` the ``remove-input`` tag.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
CHAPTERS = sorted(BOOK.glob("*.ipynb"))
NOTEBOOKS = {path.stem: json.loads(path.read_text()) for path in CHAPTERS}
DIAGRAMS = json.loads((BOOK / "figures" / "diagrams" / "diagrams.json").read_text())
FIGURE_DIRECTIVE = re.compile(r"^```\{figure\} (?P<path>\S+)\n(?P<options>(?::\w+:.*\n)*)\n"
                              r"(?P<caption>.*?)\n```", re.M | re.S)
NUMREF = re.compile(r"\{numref\}`([^`]*)`")


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def _code_cells(chapter: str):
    return [cell for cell in NOTEBOOKS[chapter]["cells"] if cell["cell_type"] == "code"]


def _parse(cell: dict) -> ast.Module:
    """A code cell as Python, its IPython lines (``%pip ...``, ``!ls``) read as ``pass``."""
    lines = [re.sub(r"^(\s*)[%!].*", r"\1pass", line) for line in _source(cell).splitlines()]
    return ast.parse("\n".join(lines))


def _name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _calls(tree: ast.AST) -> set[str]:
    """The names of the functions and methods a piece of code calls."""
    return {_name(node) for node in ast.walk(tree) if isinstance(node, ast.Call)}


def _draws(cell: dict) -> bool:
    """A cell that shows a figure: ``plt.show()``, or an explorer of ``attnbook.widgets``,
    which draws a static matplotlib figure before it returns its sliders."""
    calls = _calls(_parse(cell))
    return "plt.show()" in _source(cell) or any(name.endswith("_explorer") for name in calls)


def _only_show_source(cell: dict) -> bool:
    body = _parse(cell).body
    return bool(body) and all(
        isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)
        and _name(statement.value) == "show_source"
        for statement in body
    )


def _figure(cell: dict) -> dict:
    return cell["metadata"].get("mystnb", {}).get("figure", {})


def _directives(chapter: str) -> list[tuple[int, dict]]:
    """The MyST ``{figure}`` directives of a chapter's markdown cells: (cell index, fields)."""
    found = []
    for index, cell in enumerate(NOTEBOOKS[chapter]["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        for match in FIGURE_DIRECTIVE.finditer(_source(cell)):
            options = dict(re.findall(r"^:(\w+): (.*)$", match["options"], re.M))
            found.append((index, {"path": match["path"], "caption": match["caption"], **options}))
    return found


def _headings(chapter: str) -> list[tuple[int, int, str]]:
    """(cell index, level, line) of every heading of a chapter, fenced code left out."""
    found = []
    for index, cell in enumerate(NOTEBOOKS[chapter]["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        fenced = False
        for line in _source(cell).splitlines():
            if line.startswith(("```", "~~~")):
                fenced = not fenced
            elif not fenced and (match := re.match(r"(#{1,6}) \S", line)):
                found.append((index, len(match[1]), line))
    return found


def _figure_names(chapter: str) -> list[str]:
    names = [_figure(cell).get("name") for cell in _code_cells(chapter) if _figure(cell)]
    return names + [fields.get("name") for _, fields in _directives(chapter)]


@pytest.mark.parametrize("chapter", NOTEBOOKS)
def test_every_cell_that_draws_has_a_caption_a_name_and_alt_text(chapter):
    drawing = [cell for cell in _code_cells(chapter) if _draws(cell)]
    assert drawing, f"{chapter} draws no figure"
    for cell in drawing:
        caption = _figure(cell).get("caption", "").strip()
        alt = cell["metadata"].get("mystnb", {}).get("image", {}).get("alt", "").strip()
        where = f"{chapter}, cell {cell['id']}"
        assert caption.endswith("."), (
            f"{where} draws a figure: give it metadata.mystnb.figure.caption, one or two "
            "sentences on what it shows and what to look at")
        assert _figure(cell).get("name"), f"{where}: metadata.mystnb.figure.name is missing"
        assert len(alt) >= 40 and alt.endswith("."), (
            f"{where}: metadata.mystnb.image.alt should describe the picture for a screen reader")


@pytest.mark.parametrize("chapter", NOTEBOOKS)
def test_only_figures_are_captioned_and_a_figure_cell_shows_nothing_else(chapter):
    """myst-nb wraps *every* display output of a cell with figure metadata in its own figure
    (a progress bar or a widget would become a second figure with the same name), so a
    captioned cell draws and displays nothing else, and markdown cells carry no myst-nb
    metadata (it has no effect there)."""
    for cell in NOTEBOOKS[chapter]["cells"]:
        where = f"{chapter}, cell {cell['id']}"
        if cell["cell_type"] == "markdown":
            assert "mystnb" not in cell["metadata"], f"{where}: myst-nb metadata on markdown"
            continue
        if not _figure(cell):
            continue
        assert _draws(cell), f"{where} has a figure caption but draws nothing"
        tree = _parse(cell)
        assert not {"tqdm", "display"} & _calls(tree), (
            f"{where}: a progress bar or display() would be wrapped in the figure too; "
            "move it to a cell of its own")
        last = tree.body[-1]
        if isinstance(last, ast.Expr) and not _source(cell).rstrip().endswith(";"):
            assert isinstance(last.value, ast.Call) and _name(last.value) in {"show", "print"}, (
                f"{where}: its last line displays a value, which would become a second figure")


def test_figure_names_are_unique_and_name_their_chapter():
    seen = {}
    for chapter in NOTEBOOKS:
        for name in _figure_names(chapter):
            assert name and name.startswith(f"fig-{chapter}-"), (
                f"{chapter}: figure name {name!r} must start with fig-{chapter}-")
            assert name not in seen, f"{name} names a figure in {chapter} and in {seen[name]}"
            seen[name] = chapter
    assert len(seen) >= len(DIAGRAMS) + 80


@pytest.mark.parametrize("entry", DIAGRAMS, ids=[e["name"] for e in DIAGRAMS])
def test_every_diagram_is_in_its_section_once(entry):
    chapter = entry["chapter"]
    cells = NOTEBOOKS[chapter]["cells"]
    path = f"figures/diagrams/{entry['file']}"
    placed = [(index, fields) for ch in NOTEBOOKS for index, fields in _directives(ch)
              if fields["path"] == path and ch == chapter]
    everywhere = [ch for ch in NOTEBOOKS for _, fields in _directives(ch) if fields["path"] == path]
    assert len(placed) == 1 and everywhere == [chapter], (
        f"{entry['name']} must appear once, in {chapter}: found in {everywhere}")
    index, fields = placed[0]
    assert fields.get("name") == f"fig-{chapter}-{entry['name']}"
    assert fields.get("alt") == entry["alt"], f"{entry['name']}: alt text differs from the manifest"
    assert fields.get("width") == f"{entry['width']}%"
    assert fields["caption"] == entry["caption"], f"{entry['name']}: caption differs from the manifest"
    # inside the section its heading opens: after the heading, before the next heading of the
    # same or a higher level
    headings = _headings(chapter)
    start, level = next((i, n) for i, n, line in headings if line == entry["after"])
    end = next((i for i, n, line in headings if i > start and n <= level), len(cells))
    assert start < index < end, f"{entry['name']} is not in {entry['after']!r} of {chapter}"


def test_every_numref_names_a_target_that_exists():
    texts = [_source(cell) for nb in NOTEBOOKS.values() for cell in nb["cells"]
             if cell["cell_type"] == "markdown"]
    texts += [path.read_text() for path in [*BOOK.glob("*.md"), ROOT / "intro.md"]]
    targets = {name for chapter in NOTEBOOKS for name in _figure_names(chapter)}
    for text in texts:
        targets |= set(re.findall(r"^\(([\w-]+)\)=$", text, re.M))
        targets |= set(re.findall(r"^:(?:label|name): ([\w-]+)$", text, re.M))
    refs = {ref.rsplit("<", 1)[-1].rstrip(">").strip() for text in texts
            for ref in NUMREF.findall(text)}
    assert {r for r in refs if r.startswith("fig-")}, "no figure is referred to"
    assert refs <= targets, f"{{numref}} to targets that do not exist: {sorted(refs - targets)}"


@pytest.mark.parametrize("chapter", NOTEBOOKS)
def test_no_test_marker_in_the_code_and_listing_calls_hidden(chapter):
    for cell in _code_cells(chapter):
        where = f"{chapter}, cell {cell['id']}"
        tags = cell["metadata"].get("tags", [])
        assert "NBVAL_CHECK_OUTPUT" not in _source(cell), (
            f"{where}: readers see the marker; tag the cell check-output instead")
        if "show_source" in _source(cell):
            assert _only_show_source(cell) == ("remove-input" in tags), (
                f"{where}: a cell that only calls show_source is tagged remove-input (the "
                "site shows the listing, not the call), and only such a cell is")
        else:
            assert "remove-input" not in tags, f"{where}: hides code that computes something"
