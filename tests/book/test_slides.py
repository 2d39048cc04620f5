"""The lecture slides (``tools/slides.py``): one reveal.js deck per chapter.

``make book`` builds them into ``_build/html/slides`` after the website, from the
executed chapters in ``_build/jupyter_execute/book`` (``make slides`` rebuilds them
alone). The tests of the built decks are marked ``site``: they need ``_build/html``
(``make book``; ``make test`` builds it first) and the executed chapters, and fail
without them; ``make test-fast`` leaves them out. Every chapter of ``_toc.yml`` has a
deck with a title slide, its figures with their alt text, its display equations and
one listing, and no solution text (found as ``test_editions.py`` finds it in the
student edition); the index links every deck. The first tests build a deck from a tiny
executed notebook of their own and need no book.
"""

from __future__ import annotations

import base64
import functools
import html
import re
from pathlib import Path

import nbformat
import pytest
import test_editions  # the chapters' solution text, and how a site's words are read
import yaml
from scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
SLIDES = HTML / "slides"
EXECUTED = ROOT / "_build" / "jupyter_execute" / "book"
_TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
# The chapters: the files of the numbered parts, in their order (their numbers)
CHAPTERS = [Path(c["file"]).name for part in _TOC["parts"] if part.get("numbered")
            for c in part["chapters"]]

# registered: its dataclasses look their module up
slides = load_script(ROOT / "tools" / "slides.py", "tools_slides", register=True)
words = test_editions._words

_IMG = re.compile(r"<img\b[^>]*>")
# an {exercise} or {solution} directive, from its opening fence to the same fence again
_EXERCISE = re.compile(
    r"^\s*(`{3,}|:{3,})\s*\{(?:exercise|solution)\}.*?^\s*\1\s*$", re.M | re.S)


def _attribute(tag: str, name: str) -> str | None:
    found = re.search(rf'\b{name}="([^"]*)"', tag)
    return html.unescape(found[1]) if found else None


def _text(page: str) -> str:
    """The text of some HTML, one space apart, without the anchors' pilcrows."""
    text = html.unescape(re.sub(r"<[^>]+>", " ", page)).replace("¶", " ")
    return " ".join(text.split())


def _body(page: str) -> str:
    """What a deck shows: its slides, without the page's styles and scripts."""
    start = page.index('<div class="slides">')
    return page[start:page.index("</main>", start)]


def _slides(page: str) -> list[str]:
    """The HTML of each slide and subslide of a deck, in order (innermost sections)."""
    return re.findall(r"<section>((?:(?!<section>).)*?)</section>", _body(page), re.S)


# --------------------------------------------------------------------------------------
# A deck from a tiny executed notebook: no book build needed
# --------------------------------------------------------------------------------------
_PNG = base64.b64encode(bytes.fromhex(  # one pixel
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000005000128d3b70b00"
    "00000049454e44ae426082")).decode()


def _output(text: str, **data):
    return nbformat.v4.new_output("display_data", {"text/plain": text, **data})


def _image_cell(source: str, alt: str, caption: str, tags=()):
    figure = {"caption": caption, "name": f"fig-toy-{len(alt)}"}
    metadata = {"tags": list(tags), "mystnb": {"figure": figure, "image": {"alt": alt}}}
    cell = nbformat.v4.new_code_cell(source, metadata=metadata)
    cell.outputs = [_output("<Figure>", **{"image/png": _PNG})]
    return cell


def _toy_chapter() -> nbformat.NotebookNode:
    md = nbformat.v4.new_markdown_cell
    listing = nbformat.v4.new_code_cell("show_source(toy.fn)",
                                        metadata={"tags": ["remove-input"]})
    listing.outputs = [_output("def fn():\n    return 1")]
    later = nbformat.v4.new_code_cell("show_source(toy.other)")
    later.outputs = [_output("def other():\n    pass")]
    answer = ("def answer():\n    ### BEGIN SOLUTION\n    secret_answer = 42\n"
              "    ### END SOLUTION")
    solved = _image_cell(answer, "the solution's figure", "A solved plot.",
                         ["solution", "hide-input"])
    return nbformat.v4.new_notebook(cells=[
        md("(sec-toy)=\n# A toy chapter\n\n"
           "The opening says what {cite:t}`vaswani2017attention` did. "
           "It goes on {cite:p}`vaswani2017attention`.\n\n"
           "The second paragraph is not on the title slide."),
        nbformat.v4.new_code_cell("import toy"),
        md("(sec-toy-one)=\n## The first section\n\n"
           "Its first sentence leads. Not this one.\n\n"
           "$$\nq \\cdot k = s\n$$ (eq-toy)\n\n"
           "```{figure} figures/toy.svg\n:name: fig-toy-diagram\n"
           ":alt: A toy diagram of boxes.\n\n"
           "The diagram's caption, see {numref}`fig-toy-diagram`.\n```\n\n"
           "```{exercise} Inside an exercise\n:label: toy-inside\n\n"
           "$$\nexercise = math\n$$\n```"),
        _image_cell("plot()", "A line going up.", "The plot's caption."),
        listing,
        later,
        solved,
        _image_cell("plot()", "removed with its cell", "Removed.", ["remove-cell"]),
        md("## The second section\n\nNo math here."),
        _image_cell("plot()", "A second plot.", "Its caption."),
        md("## Summary\n\n* A summary bullet, left out.\n\n"
           "(sec-toy-exercises)=\n## Exercises\n\n"
           "```{exercise} Toy\n:label: toy-ex\n\nWrite it.\n```\n\n"
           "````{solution} toy-ex\n:class: dropdown\n\n"
           "The written answer is forty two.\n````"),
        _image_cell("plot()", "an exercise's figure", "In the exercises."),
    ])


def test_a_deck_from_a_tiny_executed_notebook(tmp_path):
    book, executed, out = tmp_path / "book", tmp_path / "executed", tmp_path / "out"
    (book / "figures").mkdir(parents=True)
    executed.mkdir()
    svg = '<svg xmlns="http://www.w3.org/2000/svg"/>'
    (book / "figures" / "toy.svg").write_text(svg)
    (tmp_path / "_toc.yml").write_text(
        "root: intro\nparts:\n  - numbered: true\n    chapters:\n"
        "      - file: book/toy\n  - chapters:\n      - file: book/guide\n")
    (tmp_path / "references.bib").write_text(
        "@article{vaswani2017attention,\n"
        "  author = {Vaswani, Ashish and Shazeer, Noam and Parmar, Niki},\n"
        "  year = {2017}\n}\n")
    nbformat.write(_toy_chapter(), executed / "toy.ipynb")
    argv = ["--book-dir", str(book), "--executed", str(executed), "--out", str(out)]

    assert slides.main(argv) == 0
    page = (out / "toy.slides.html").read_text()
    shown = _slides(page)
    text = _text(_body(page))
    # the title slide; the first section's slide, with its equation, then one subslide
    # each for its diagram, its plot and its listing; the second section's slide, with
    # its one plot (no equation); no Summary, no Exercises
    levels = [re.search(r"<h(\d)", s)[1] for s in shown]
    assert levels == ["1", "2", "3", "3", "3", "2"]
    assert "1. A toy chapter" in shown[0] and "Read the chapter" in shown[0]
    opening = "The opening says what Vaswani et al. (2017) did. It goes on."
    assert opening in _text(shown[0]) and "second paragraph" not in text
    assert "1.1 The first section" in shown[1]
    assert "Its first sentence leads." in _text(shown[1]) and "Not this one" not in text
    assert "$$\nq \\cdot k = s\n$$" in shown[1] and "eq-toy" not in text
    alts = [_attribute(tag, "alt") for tag in _IMG.findall(_body(page))]
    assert alts == ["A toy diagram of boxes.", "A line going up.", "A second plot."]
    assert "see Fig. 1.1" in _text(shown[2])
    assert "The plot's caption." in _text(shown[3])
    assert "Listing: toy.fn" in _text(shown[4])
    assert '<div class="highlight">' in shown[4]
    assert words("def fn():\n    return 1") in words(_text(shown[4]))
    assert "def other" not in text, "one listing: the first show_source cell's"
    assert "1.2 The second section" in shown[5] and "Its caption." in _text(shown[5])
    for left_out in ["exercise = math", "secret_answer", "solution's figure", "Summary",
                     "removed with its cell", "forty two", "summary bullet", "Write it",
                     "exercise's figure"]:
        assert left_out not in text, left_out
    assert "https://unpkg.com/reveal.js" in page, "reveal.js from nbconvert's CDN"
    index = (out / "index.html").read_text()
    assert re.findall(r'href="([^"]+\.slides\.html)"', index) == ["toy.slides.html"]
    assert "1. A toy chapter" in index
    slides.main(argv)
    assert (out / "toy.slides.html").read_text() == page, "the same deck, built again"


def test_a_missing_executed_chapter_says_to_build_the_book(tmp_path, capsys):
    (tmp_path / "book").mkdir()
    nbformat.write(_toy_chapter(), tmp_path / "book" / "toy.ipynb")
    argv = ["--book-dir", str(tmp_path / "book"), "--executed", str(tmp_path / "none")]
    assert slides.main([*argv, "--out", str(tmp_path / "out")]) == 1
    assert "make book" in capsys.readouterr().err


def test_make_book_builds_the_slides_into_the_site():
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^book: .*\n((?:\t.*\n)+)", makefile, re.M)[1]
    assert recipe.index("jupyter-book build") < recipe.index("$(SLIDES_BUILD)")
    assert re.search(r"^SLIDES \?= _build/html/slides$", makefile, re.M)
    build = r"^SLIDES_BUILD = \$\(BIN\)/python -m tools\.slides --out \$\(SLIDES\)$"
    assert re.search(build, makefile, re.M)
    assert re.search(r"^slides: .*\n\t\$\(SLIDES_BUILD\)$", makefile, re.M)


# --------------------------------------------------------------------------------------
# The decks of the built site
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built():
    if not (HTML / "intro.html").exists():
        pytest.fail(
            f"{HTML} is not built: run `make book` first (make test does it)")
    if not (SLIDES / "index.html").exists():
        pytest.fail(
            f"{SLIDES} is not built: `make book` builds it (`make slides` alone)")
    return SLIDES


@functools.cache
def _source(chapter: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / "book" / f"{chapter}.ipynb", as_version=4)


def _alt_texts(nb) -> set[str]:
    """The alt text of every figure of a chapter: its plots' and its diagrams'."""
    alts = {c.metadata.get("mystnb", {}).get("image", {}).get("alt") for c in nb.cells}
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            alts |= set(re.findall(r"^:alt:[ \t]*(.+?)\s*$", cell.source, re.M))
    return alts - {None}


@pytest.mark.site
def test_the_index_links_every_chapters_deck_in_order(built):
    notebooks = {p.stem for p in (ROOT / "book").glob("*.ipynb")}
    assert len(CHAPTERS) >= 15 and set(CHAPTERS) <= notebooks
    index = (built / "index.html").read_text()
    linked = re.findall(r'href="([^"]+\.slides\.html)"', index)
    assert linked == [f"{c}.slides.html" for c in CHAPTERS]
    assert all((built / f"{c}.slides.html").exists() for c in CHAPTERS)


@pytest.mark.site
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_each_deck_has_a_title_figures_equations_and_one_listing(built, chapter):
    page = (built / f"{chapter}.slides.html").read_text()
    shown, body = _slides(page), _body(page)
    nb = _source(chapter)
    number = CHAPTERS.index(chapter) + 1
    title = re.search(r"^# (.+)$", nb.cells[0].source, re.M)[1]
    heading = re.search(r"<h1\b[^>]*>(.*?)</h1>", shown[0], re.S)
    assert heading and _text(heading[1]) == f"{number}. {title}", "the title slide"
    assert f'href="../book/{chapter}.html"' in shown[0], "it links the chapter"

    # figures: where the chapter has any, at least one, each with its alt text
    alts = _alt_texts(nb)
    images = _IMG.findall(body)
    if alts:
        assert images, f"{chapter}: no figure"
    for tag in images:
        assert _attribute(tag, "src").startswith("data:image/"), "figures are embedded"
        assert _attribute(tag, "alt") in alts, f"{chapter}: a figure without alt text"

    # equations: where the chapter has display math outside its exercises and solutions,
    # at least one, each the chapter's own and none from an exercise
    markdown = [_EXERCISE.sub("", c.source)
                for c in nb.cells if c.cell_type == "markdown"]
    equations = [html.unescape(e) for e in re.findall(r"\$\$(.+?)\$\$", body, re.S)]
    if any("$$" in source for source in markdown):
        assert equations, f"{chapter}: no equation"
    prose = " ".join("\n".join(markdown).split())
    for equation in equations:
        assert " ".join(equation.split()) in prose, f"{chapter}: {equation}"

    # one listing: what the chapter's first show_source cell printed
    assert len(re.findall(r'<h3[^>]*>Listing', body)) == 1, f"{chapter}: listings"
    if not (EXECUTED / f"{chapter}.ipynb").exists():
        pytest.fail(f"{EXECUTED} has no {chapter}.ipynb: run `make book`")
    executed = nbformat.read(EXECUTED / f"{chapter}.ipynb", as_version=4)
    # a chapter the build took from its cache is written there without outputs
    executed = slides._with_outputs(executed, ROOT / "book" / f"{chapter}.ipynb")
    cell = next(c for c in executed.cells
                if c.cell_type == "code" and "show_source(" in c.source)
    output = next(o for o in cell.outputs if "text/plain" in o.get("data", {}))
    listing = next(s for s in shown if re.search(r"<h3[^>]*>Listing", s))
    assert words("".join(output["data"]["text/plain"])) in words(_text(listing))


@pytest.mark.site
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_deck_holds_solution_text(built, chapter):
    """The editions test's solution lines of the chapter: in no deck, nor the index."""
    files = {p.name: test_editions._page_words(p)
             for p in sorted(built.glob("*.html"))}
    leaks = [f"{where}: {line!r} in {name}"
             for where, lines in test_editions._solution_lines(chapter).items()
             for line in lines for name, found in files.items() if line in found]
    assert not leaks, f"{chapter}: solution text in the slides:\n" + "\n".join(leaks)
    assert "NotImplementedError" not in (built / f"{chapter}.slides.html").read_text()
