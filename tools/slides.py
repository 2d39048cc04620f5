"""Lecture slides for every chapter, generated from its executed notebook.

``python -m tools.slides [--book-dir book] [--executed _build/jupyter_execute/book]
[--out _build/html/slides]`` reads each chapter as ``jupyter-book build`` left it
executed (outputs included, images as base64) and writes a reveal.js deck,
``<out>/<chapter>.slides.html``, with nbconvert's ``SlidesExporter``, plus
``<out>/index.html`` listing the decks. ``make book`` runs it after the website build,
so the published site has the decks under ``slides/``; ``make slides`` rebuilds them
alone. The chapters are not edited: each deck is a synthetic notebook of markdown
cells whose ``slideshow.slide_type`` says where a slide starts.

A deck holds
- a title slide: the chapter's number and title, its opening paragraph cut to a few
  sentences, and a link to the chapter;
- one slide per ``##`` section: its number and heading, its first sentence, its display
  equations (``$$...$$`` and ``{math}`` blocks); when it has no equation, its first
  figure too. Every further figure gets a slide of its own below it. A figure is an
  image output (caption and alt text from the cell's myst-nb metadata,
  ``mystnb.figure.caption`` and ``mystnb.image.alt``) or a ``{figure}`` directive's
  diagram (its ``:alt:`` and caption), embedded in the page;
- one listing: the printed output of the chapter's first ``show_source(...)`` cell,
  the package code the chapter is about, on a slide below its section.

Left out, so that the decks belong to the student edition: the Exercises and Summary
sections; every ``{exercise}`` and ``{solution}`` directive; every code cell tagged
``solution`` or holding ``### BEGIN SOLUTION``; cells tagged ``remove-cell``, and the
outputs of cells tagged ``remove-output``. Prose, code and other outputs are not put
on slides. reveal.js and MathJax come from nbconvert's default CDN addresses.
"""

from __future__ import annotations

import argparse
import base64
import html
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
EXECUTED = ROOT / "_build" / "jupyter_execute" / "book"
OUT = ROOT / "_build" / "html" / "slides"
SKIPPED = ("Exercises", "Summary")  # sections, by heading or by a label ending -<name>
BEGIN = "### BEGIN SOLUTION"
OPENING_CHARS = 400  # the title slide keeps whole sentences up to about this length
IMAGE_TYPES = ("image/png", "image/jpeg", "image/svg+xml")
MIME = {".svg": "image/svg+xml", ".png": "image/png", ".jpg": "image/jpeg"}
IMAGE_STYLE = "max-height: 58vh; max-width: 100%;"
# a listing of up to 88 columns fits a slide's width, and about 30 lines its height
STYLE = ("<style>.reveal div.highlight > pre { font-size: 15px; line-height: 1.3; }"
         "</style>")

HEADING = re.compile(r"^(#{1,2}) +(.+?)\s*$", re.M)
LABEL_BEFORE = re.compile(r"^\(([\w.:-]+)\)=\s*\Z", re.M)  # a label ending a text
# every heading, with the label written above it if any
LABELLED = re.compile(r"(?:^\(([\w.:-]+)\)=\s*\n+)?^(#{1,6}) +(.+?)\s*$", re.M)
FENCE_OPEN = re.compile(r"^\s*(`{3,}|:{3,})\s*\{([\w:-]+)\}\s*(.*)$")
DISPLAY_MATH = re.compile(r"\$\$(.+?)\$\$", re.S)
ROLE = re.compile(r"\{([\w:-]+)\}`([^`]*)`")
# a {figure} directive's :name:, and a BibTeX entry's key, authors and year
FIGURE_NAME = re.compile(
    r"^(?:`{3,}|:{3,})\{figure\}.*\n(?::[\w-]+:.*\n)*?:name: *(\S+)", re.M)
BIB_ENTRY = re.compile(r"^@\w+\{([^,\s]+),(.*?)^\}", re.M | re.S)
# a sentence ends at . ! or ? before a capital, but not after et al., e.g. or i.e.
SENTENCE_END = re.compile(
    r"(?<=[.!?])(?<!\bal\.)(?<!e\.g\.)(?<!i\.e\.)\s+(?=[A-Z*{$`(])")


@dataclass
class Figure:
    src: str  # a data: URI
    alt: str
    caption: str


@dataclass
class Section:
    number: str
    title: str
    lead: str = ""
    equations: list[str] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    listing: tuple[str, str] | None = None  # (what show_source showed, its code)


@dataclass
class Chapter:
    name: str
    number: str
    title: str = ""
    opening: str = ""
    sections: list[Section] = field(default_factory=list)


# --------------------------------------------------------------------------------------
# The chapters, and MyST's inline roles as plain text
# --------------------------------------------------------------------------------------
def chapters(book_dir: Path) -> list[str]:
    """The chapters, in the order of the numbered parts of ``_toc.yml`` (beside
    ``book_dir``); without a table of contents, the notebooks in ``book_dir``."""
    toc = book_dir.parent / "_toc.yml"
    if not toc.exists():
        return sorted(p.stem for p in book_dir.glob("*.ipynb"))
    parts = yaml.safe_load(toc.read_text()).get("parts", [])
    files = [c["file"] for p in parts if p.get("numbered") for c in p["chapters"]]
    return [Path(f).name for f in files if Path(f).parent.name == book_dir.name]


def labels(book_dir: Path, notebooks: dict[str, nbformat.NotebookNode]) -> dict:
    """``label or chapter name -> (number or "", title)`` for every labelled heading of
    the chapters (numbered as the site numbers them) and of ``book_dir``'s pages,
    every figure of the chapters (``Fig. 1.3``) and, as ``cite:<key>``, every entry of
    ``references.bib`` beside ``book_dir`` (``Vaswani et al. (2017)``)."""
    found = {}
    bib = book_dir.parent / "references.bib"
    for key, body in BIB_ENTRY.findall(bib.read_text() if bib.exists() else ""):
        author = re.search(r"^\s*author\s*=\s*\{(.*)\},?\s*$", body, re.M)
        year = re.search(r"^\s*year\s*=\s*\{?(\d+)", body, re.M)
        if author and year:
            names = [n.split(",")[0].strip(" {}") for n in author[1].split(" and ")]
            who = " and ".join(names) if len(names) < 3 else f"{names[0]} et al."
            found[f"cite:{key}"] = ("", f"{who} ({year[1]})")
    for path in sorted(book_dir.glob("*.md")):
        for label, _, title in LABELLED.findall(path.read_text(encoding="utf-8")):
            if label:
                found[label] = ("", title)
    for number, (name, nb) in enumerate(notebooks.items(), start=1):
        sections = figures = 0
        for cell in nb.cells:
            named = [cell.metadata.get("mystnb", {}).get("figure", {}).get("name")]
            if cell.cell_type == "markdown":
                named = FIGURE_NAME.findall(cell.source)
            for figure in filter(None, named):  # numbered in the order they come
                figures += 1
                found[figure] = (f"{number}.{figures}", f"Fig. {number}.{figures}")
            if cell.cell_type != "markdown":
                continue
            for label, level, title in LABELLED.findall(cell.source):
                sections += level == "##"
                where = {"#": f"{number}", "##": f"{number}.{sections}"}.get(level, "")
                if label:
                    found[label] = (where, title)
                if level == "#":
                    found[name] = (where, title)
    return found


def _role(match: re.Match, targets: dict) -> str:
    role, text = match[1], match[2]
    if role == "cite:t":  # Bahdanau et al. (2015)
        keys = [k.strip() for k in text.split(",")]
        return ", ".join(targets.get(f"cite:{k}", ("", k))[1] for k in keys)
    if role.startswith("cite"):
        return ""
    if role.startswith("py:"):
        name = text.lstrip("~.")
        return f"`{name.rsplit('.', 1)[-1] if text.startswith('~') else name}`"
    shown, target = text, text
    explicit = re.fullmatch(r"(.*?)\s*<([^>]+)>", text, re.S)
    if explicit:
        shown, target = explicit[1], explicit[2]
    number, title = targets.get(target, ("", target))
    if explicit:
        return shown.replace("%s", number).strip()
    return title  # a figure's title is its number: Fig. 1.3


def plain(text: str, targets: dict) -> str:
    """Markdown ``text`` with MyST's roles as text a slide can show: citations in
    parentheses dropped, cross-references as their targets' numbers or titles."""
    text = ROLE.sub(lambda m: _role(m, targets), " ".join(text.split()))
    text = re.sub(r"\(\s*\)", "", text)
    text = re.sub(r"[ \t]+([,.;:)])", r"\1", text)
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def _sentences(paragraph: str, limit: int) -> str:
    """The whole sentences of ``paragraph`` that fit in ``limit`` characters (at least
    one)."""
    kept = []
    for sentence in SENTENCE_END.split(" ".join(paragraph.split())):
        if kept and len(" ".join(kept + [sentence])) > limit:
            break
        kept.append(sentence)
    return re.sub(r":$", ".", " ".join(kept))  # not a colon before a list left out


def _first_paragraph(text: str) -> str:
    """The first paragraph of prose in markdown ``text``: not a label, a heading, a
    directive, a table, a list, math, HTML or an indented block."""
    for block in re.split(r"\n\s*\n", text):
        block = block.strip("\n")
        if block.strip() and not re.match(r"\s|[#(`:$|<!>]|[*+-]\s|\d+\.\s", block):
            return block
    return ""


# --------------------------------------------------------------------------------------
# What a chapter puts on slides
# --------------------------------------------------------------------------------------
def _directives(text: str, book_dir: Path) -> tuple[str, list[Figure], list[str]]:
    """``(rest, figures, equations)``: ``text`` without its directive blocks, the
    diagrams of its ``{figure}`` directives and the bodies of its ``{math}`` ones;
    ``{exercise}``, ``{solution}`` and every other directive are dropped whole."""
    rest, figures, equations = [], [], []
    fence = None  # (fence, name, argument, body lines) of the open directive
    for line in text.split("\n"):
        if fence is None:
            opened = FENCE_OPEN.match(line)
            if opened:
                fence = (opened[1], opened[2], opened[3].strip(), [])
            else:
                rest.append(line)
            continue
        mark, name, argument, body = fence
        if not re.fullmatch(rf"\s*{re.escape(mark[0])}{{{len(mark)},}}\s*", line):
            body.append(line)
            continue
        fence = None  # the closing fence: same character, at least as long
        options = dict(re.findall(r"^:([\w-]+):[ \t]*(.*)$", "\n".join(body), re.M))
        content = "\n".join(b for b in body if not re.match(r"^:[\w-]+:", b)).strip()
        if name == "math":
            equations.append(content)
        elif name == "figure" and (book_dir / argument).is_file():
            image = book_dir / argument
            figures.append(Figure(_data_uri(MIME.get(image.suffix, "image/png"),
                                            image.read_bytes()),
                                  options.get("alt", ""), content))
    return "\n".join(rest), figures, equations


def _data_uri(kind: str, data: bytes) -> str:
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


def _output_figures(cell) -> list[Figure]:
    """The image outputs of a code cell, with myst-nb's caption and alt text."""
    meta = cell.metadata.get("mystnb") or cell.metadata.get("myst") or {}
    caption = meta.get("figure", {}).get("caption", "")
    alt = meta.get("image", {}).get("alt", "") or caption
    figures = []
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        kind = next((k for k in IMAGE_TYPES if k in data), None)
        if kind == "image/svg+xml":  # text in a notebook, base64 for the others
            svg = "".join(data[kind]).encode()
            figures.append(Figure(_data_uri(kind, svg), alt, caption))
        elif kind:
            figures.append(Figure(f"data:{kind};base64,{''.join(data[kind])}", alt,
                                  caption))
    return figures


def _captioned(figures: list[Figure], targets: dict) -> list[Figure]:
    for figure in figures:  # a caption may cite or refer, as prose does
        figure.caption = plain(figure.caption, targets)
    return figures


def _is_solution(cell) -> bool:
    tagged = "solution" in cell.metadata.get("tags", [])
    return tagged or any(line.strip() == BEGIN for line in cell.source.split("\n"))


def _skipped(title: str, label: str | None) -> bool:
    suffix = (label or "").rsplit("-", 1)[-1].lower()
    return title in SKIPPED or suffix in {s.lower() for s in SKIPPED}


def outline(name: str, nb, number: str, book_dir: Path, targets: dict) -> Chapter:
    """What the slides of chapter ``name`` (executed notebook ``nb``) show."""
    chapter = Chapter(name, number)
    section: Section | None = None  # None before the first ## and in skipped sections
    seen = 0  # ## headings so far, skipped ones included: the site's section numbers
    listed = False
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if "remove-cell" in tags:
            continue
        if cell.cell_type == "code":
            if section is None or _is_solution(cell):
                continue
            if "remove-output" not in tags:
                section.figures += _captioned(_output_figures(cell), targets)
            if not listed and "show_source(" in cell.source:
                code = "\n\n".join("".join(o["data"]["text/plain"]).rstrip()
                                   for o in cell.get("outputs", [])
                                   if "text/plain" in o.get("data", {}))
                called = re.search(r"show_source\(\s*([\w.]+)", cell.source)
                if code:
                    section.listing, listed = (called[1] if called else "", code), True
            continue
        if cell.cell_type != "markdown":
            continue
        # a markdown cell may hold several headings: the text between them, in order
        pieces = HEADING.split(cell.source)
        for index in range(0, len(pieces), 3):
            text = pieces[index]
            if index:  # a heading opens what follows it
                level, title = pieces[index - 2], pieces[index - 1]
                before = LABEL_BEFORE.search(pieces[index - 3])
                label = before[1] if before else None
                if level == "#":
                    chapter.title = plain(title, targets)
                    chapter.opening = _sentences(
                        plain(_first_paragraph(text), targets), OPENING_CHARS)
                    continue
                seen += 1
                section = None
                if not _skipped(title, label):
                    lead = plain(_first_paragraph(text), targets)
                    section = Section(f"{number}.{seen}", plain(title, targets),
                                      _sentences(lead, 0))
                    chapter.sections.append(section)
            if section is None:
                continue
            text, figures, equations = _directives(text, book_dir)
            section.equations += equations
            section.equations += [m.strip() for m in DISPLAY_MATH.findall(text)]
            section.figures += _captioned(figures, targets)
    return chapter


# --------------------------------------------------------------------------------------
# The deck: a notebook of markdown cells with slide metadata, through SlidesExporter
# --------------------------------------------------------------------------------------
def _cell(source: str, slide_type: str):
    return nbformat.v4.new_markdown_cell(
        source, metadata={"slideshow": {"slide_type": slide_type}})


def _figure(figure: Figure) -> str:
    image = (f'<img src="{figure.src}" alt="{html.escape(figure.alt)}" '
             f'style="{IMAGE_STYLE}">')
    return image + ("\n\n" + figure.caption if figure.caption else "")


def deck(chapter: Chapter) -> nbformat.NotebookNode:
    """The chapter's slides as a notebook: a ``slide`` per section, a ``subslide``
    below it for each further figure and for the listing."""
    title = f"# {chapter.number}. {chapter.title}"
    link = f"[Read the chapter](../book/{chapter.name}.html)"
    parts = [STYLE, title, chapter.opening, link]
    cells = [_cell("\n\n".join(filter(None, parts)), "slide")]
    for section in chapter.sections:
        heading = f"## {section.number} {section.title}"
        first = [f"$$\n{equation}\n$$" for equation in section.equations]
        figures = list(section.figures)
        if not first and figures:
            first.append(_figure(figures.pop(0)))
        parts = [heading, section.lead, *first]
        cells.append(_cell("\n\n".join(filter(None, parts)), "slide"))
        for figure in figures:
            cells.append(_cell(f"### {section.title}\n\n{_figure(figure)}", "subslide"))
        if section.listing:
            called, code = section.listing
            name = f": `{called}`" if called else ""
            listing = f"### Listing{name}\n\n```python\n{code}\n```"
            cells.append(_cell(listing, "subslide"))
    for number, cell in enumerate(cells):  # the same deck from the same chapter
        cell.id = f"slide-{number}"
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata.title = f"{chapter.number}. {chapter.title}"
    return nb


def write_deck(nb, path: Path) -> Path:
    """Write notebook ``nb`` as reveal.js slides to ``path``."""
    from nbconvert import SlidesExporter

    # no heading anchors: a heading with math gets a percent-encoded id its link misses
    exporter = SlidesExporter(reveal_scroll=True, reveal_number="c/t",
                              exclude_anchor_links=True)
    resources = {"metadata": {"name": path.stem}}
    body, _ = exporter.from_notebook_node(nb, resources=resources)
    path.write_text(body, encoding="utf-8")
    return path


def write_index(decks: list[tuple[str, str]], out: Path) -> Path:
    """``out/index.html``: a link to each deck, given as ``(file name, title)``."""
    items = "\n".join(f'  <li><a href="{html.escape(f)}">{html.escape(t)}</a></li>'
                      for f, t in decks)
    page = f"""<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>Lecture slides</title>
<style>body {{ font-family: sans-serif; max-width: 40em; margin: 2em auto; }}</style>
</head>
<body>
<h1>Lecture slides</h1>
<p>One reveal.js deck per chapter, generated from the executed chapter: its figures,
its key equations and one listing. Arrow keys move between slides; <kbd>F</kbd> is full
screen, <kbd>Esc</kbd> the overview. <a href="../intro.html">Back to the book</a>.</p>
<ol>
{items}
</ol>
</body>
</html>
"""
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


def _with_outputs(nb, source: Path):
    """``nb``, or, when it has no output at all, the chapter ``source`` with the outputs of
    the book's execution cache: jupyter-book writes a chapter it took from the cache into
    ``_build/jupyter_execute`` without them."""
    if any(c.get("outputs") for c in nb.cells if c.cell_type == "code"):
        return nb
    from jupyter_cache import get_cache

    cache = ROOT / "_build" / ".jupyter_cache"  # _config.yml's execute.cache
    try:
        _, merged = get_cache(cache).merge_match_into_notebook(
            nbformat.read(source, as_version=4))
    except KeyError:  # not in the cache either: the deck has no figures to show
        return nb
    return merged


def build(book_dir: Path = BOOK, executed: Path = EXECUTED,
          out: Path = OUT) -> list[Path]:
    """Write a deck for every chapter, then the index; returns the decks' paths."""
    names = chapters(book_dir)
    missing = [n for n in names if not (executed / f"{n}.ipynb").exists()]
    if missing:
        raise FileNotFoundError(
            f"{executed} has no executed {', '.join(missing)}: run `make book` first")
    notebooks = {n: _with_outputs(nbformat.read(executed / f"{n}.ipynb", as_version=4),
                                  book_dir / f"{n}.ipynb") for n in names}  # fmt: skip
    targets = labels(book_dir, notebooks)
    out.mkdir(parents=True, exist_ok=True)
    written, index = [], []
    for number, (name, nb) in enumerate(notebooks.items(), start=1):
        chapter = outline(name, nb, str(number), book_dir, targets)
        written.append(write_deck(deck(chapter), out / f"{name}.slides.html"))
        index.append((written[-1].name, f"{number}. {chapter.title}"))
    write_index(index, out)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.slides",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--book-dir", type=Path, default=BOOK,
                        help="the chapters' sources (diagrams; _toc.yml beside it)")
    parser.add_argument("--executed", type=Path, default=EXECUTED,
                        help="the executed chapters jupyter-book build leaves")
    parser.add_argument("--out", type=Path, default=OUT, help="where the decks go")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        decks = build(args.book_dir, args.executed, args.out)
    except FileNotFoundError as err:
        print(err, file=sys.stderr)
        return 1
    seconds = time.perf_counter() - start
    print(f"{len(decks)} decks in {args.out} ({seconds:.1f} s): open "
          f"{(args.out / 'index.html').resolve().as_uri()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
