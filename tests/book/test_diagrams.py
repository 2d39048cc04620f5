"""The book's drawn diagrams (``tools/diagrams``, written to ``book/figures/diagrams``).

The committed SVGs and manifest must be exactly what the code draws now (rerun
``.venv/bin/python -m tools.diagrams`` after a change); every SVG must be an accessible,
self-contained image whose text is legible at its suggested width and never overlaps
other text; and the manifest must place every diagram after a heading that exists, in
a chapter that exists.
"""

import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # tools/ is a namespace package at the repository root

from tools.diagrams import MANIFEST, OUT, build  # noqa: E402
from tools.diagrams.svg import CENTRE, FONT, text_width  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"
COLUMN = 720  # pixels of the page column a diagram's width is a share of
MIN_TEXT = 11  # pixels, as displayed
ENTRIES = json.loads((OUT / MANIFEST).read_text())
NAMES = [e["name"] for e in ENTRIES]


@pytest.fixture(scope="module")
def drawn() -> dict[str, str]:
    return build()


def _svg(name: str) -> ET.Element:
    return ET.parse(OUT / f"{name}.svg").getroot()


def _view_box(root: ET.Element) -> list[float]:
    return [float(v) for v in root.get("viewBox").split()]


def _texts(root: ET.Element):
    """Every ``<text>`` with its font size and weight, as inherited from its groups."""

    def walk(el, size, bold):
        size = float(el.get("font-size", size or 0)) or size
        bold = el.get("font-weight", "bold" if bold else "normal") == "bold"
        if el.tag == f"{SVG}text":
            yield el, size, bold
        for child in el:
            yield from walk(child, size, bold)

    yield from walk(root, None, False)


def test_committed_files_are_what_the_code_draws(drawn):
    committed = {p.name: p.read_text(encoding="utf-8") for p in OUT.iterdir()}
    stale = sorted(set(committed) - set(drawn))
    missing = sorted(set(drawn) - set(committed))
    changed = sorted(n for n in set(drawn) & set(committed) if drawn[n] != committed[n])
    assert not (stale or missing or changed), (
        f"book/figures/diagrams is out of date (stale {stale}, missing {missing}, "
        f"changed {changed}): run .venv/bin/python -m tools.diagrams and commit"
    )


def test_there_are_enough_diagrams_and_each_has_its_svg():
    assert len(ENTRIES) >= 25
    assert len(set(NAMES)) == len(NAMES), "two diagrams share a name"
    svgs = {p.stem for p in OUT.glob("*.svg")}
    assert svgs == set(NAMES), (
        f"SVGs without an entry: {sorted(svgs - set(NAMES))}; "
        f"entries without an SVG: {sorted(set(NAMES) - svgs)}"
    )
    assert all(e["file"] == f"{e['name']}.svg" for e in ENTRIES)


def test_captions_are_distinct_and_alt_texts_are_sentences():
    captions = [e["caption"] for e in ENTRIES]
    assert len(set(captions)) == len(captions), "two diagrams share a caption"
    for e in ENTRIES:
        assert e["caption"].strip() and e["title"].strip(), e["name"]
        alt = e["alt"]
        assert len(alt) >= 60 and alt[0].isupper() and alt.endswith("."), (
            f"{e['name']}: the alt text should describe the picture in full sentences"
        )
        assert isinstance(e["width"], int) and 10 <= e["width"] <= 100, e["name"]


def _markdown_headings(chapter: str) -> set[str]:
    nb = json.loads((ROOT / "book" / f"{chapter}.ipynb").read_text())
    return {
        line
        for cell in nb["cells"]
        if cell["cell_type"] == "markdown"
        for line in "".join(cell["source"]).splitlines()
        if line.startswith("#")
    }


@pytest.mark.parametrize("entry", ENTRIES, ids=NAMES)
def test_placed_after_a_real_heading_of_a_real_chapter(entry):
    notebook = ROOT / "book" / f"{entry['chapter']}.ipynb"
    assert notebook.exists(), f"{entry['name']}: no chapter book/{notebook.name}"
    assert entry["after"] in _markdown_headings(entry["chapter"]), (
        f"{entry['name']}: {entry['after']!r} is not a heading of {notebook.name}"
    )


@pytest.mark.parametrize("entry", ENTRIES, ids=NAMES)
def test_svg_is_an_accessible_self_contained_image(entry):
    text = (OUT / entry["file"]).read_text(encoding="utf-8")
    root = ET.fromstring(text)
    assert root.tag == f"{SVG}svg"
    assert root.get("role") == "img"
    x, y, w, h = _view_box(root)
    assert x == y == 0 and w > 0 and h > 0
    title, desc = root.find(f"{SVG}title"), root.find(f"{SVG}desc")
    assert title is not None and title.text and title.text.strip()
    assert desc is not None and desc.text and desc.text.strip()
    assert desc.text == entry["alt"] and title.text == entry["title"]
    ids = {el.get("id") for el in root.iter() if el.get("id")}
    assert set(root.get("aria-labelledby", "").split()) <= ids
    # one font stack, set once; nothing fetched, nothing run
    assert root.get("font-family") == FONT
    assert [el for el in root.iter() if el.get("font-family")] == [root]
    tags = {el.tag.removeprefix(SVG) for el in root.iter()}
    assert not tags & {"image", "script", "style", "foreignObject", "use"}, tags
    assert not re.search(r"href|url\(|@import", text)
    assert re.findall(r"https?://[^\"]*", text) == ["http://www.w3.org/2000/svg"]


@pytest.mark.parametrize("entry", ENTRIES, ids=NAMES)
def test_text_is_legible_at_the_suggested_width(entry):
    root = _svg(entry["name"])
    scale = COLUMN * entry["width"] / 100 / _view_box(root)[2]
    for el, size, _ in _texts(root):
        assert size, f"{entry['name']}: {el.text!r} has no font size"
        assert size * scale >= MIN_TEXT, (
            f"{entry['name']}: {el.text!r} is {size * scale:.1f} px on the page"
        )


@pytest.mark.parametrize("entry", ENTRIES, ids=NAMES)
def test_text_stays_on_the_canvas_and_never_overlaps(entry):
    root = _svg(entry["name"])
    _, _, width, height = _view_box(root)
    boxes = []
    for el, size, bold in _texts(root):
        w = text_width(el.text, size, bold)
        x, centre = float(el.get("x")), float(el.get("y")) - CENTRE * size
        x0 = {"start": x, "middle": x - w / 2, "end": x - w}[
            el.get("text-anchor", "start")
        ]
        boxes.append((el.text, x0, centre - size / 2, x0 + w, centre + size / 2))
    for s, x0, y0, x1, y1 in boxes:
        assert x0 >= 0 and y0 >= 0 and x1 <= width and y1 <= height, (
            f"{entry['name']}: {s!r} leaves the canvas"
        )
    for i, (s, ax0, ay0, ax1, ay1) in enumerate(boxes):
        for t, bx0, by0, bx1, by1 in boxes[i + 1 :]:
            apart = ax1 <= bx0 + 0.5 or bx1 <= ax0 + 0.5 or ay1 <= by0 + 0.5 or (
                by1 <= ay0 + 0.5
            )
            assert apart, f"{entry['name']}: {s!r} overlaps {t!r}"
