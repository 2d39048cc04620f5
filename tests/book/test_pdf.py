"""The PDF route, end to end on a small book: one chapter and the bibliography with the book's own
configuration, built to HTML by Jupyter Book, printed by tools/pdf.py (headless Chromium), and read
back with pypdf. `make pdf` runs the same code on the whole book, so the route cannot rot between
releases. The chapter's execution comes from the book build's cache (make test builds the book
first), so the chapter is not run again."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml
from scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = "graph_attention"  # short to run, with figures, formulas, code, citations and exercises

pdf = load_script(ROOT / "tools" / "pdf.py", "book_pdf", register=True)  # its dataclass needs it


@pytest.fixture(scope="module")
def small_pdf(tmp_path_factory):
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.fail("the PDF is printed by Debian's chromium and chromium-driver (apt-get install ...)")
    book = tmp_path_factory.mktemp("small-book")
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["execute"]["cache"] = str(ROOT / "_build" / ".jupyter_cache")  # the book build's runs
    (book / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    (book / "_toc.yml").write_text(yaml.safe_dump({
        "format": "jb-book", "root": "intro",
        "parts": [{"caption": "Attention across architectures", "numbered": True,
                   "chapters": [{"file": f"book/{CHAPTER}"}]},
                  {"caption": "Reference", "chapters": [{"file": "book/bibliography"}]}]}))
    (book / "intro.md").write_text("# A small book\n\nOne chapter of the book, printed the way the whole "
                                   "book is.\n")
    for name in ("references.bib", "assets", "_static", "_ext"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, book / name)
    (book / "book").mkdir()
    for name in (f"{CHAPTER}.ipynb", "bibliography.md"):
        shutil.copy(ROOT / "book" / name, book / "book" / name)
    # Not -W: the chapter links to chapters this small book leaves out.
    built = subprocess.run([str(Path(sys.executable).with_name("jupyter-book")), "build", str(book),
                            "--builder", "html", "--keep-going"], capture_output=True, text=True)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert "Executing notebook" not in built.stdout, "the chapter ran again: build the book first"
    out = book / "small.pdf"
    pdf.build(book / "_build" / "html", book / "_toc.yml", out)
    from pypdf import PdfReader

    return PdfReader(out)


def _outline(reader, entries=None, depth=0):
    found = []
    for entry in reader.outline if entries is None else entries:
        if isinstance(entry, list):
            found += _outline(reader, entry, depth + 1)
        else:
            found.append((depth, entry.title, reader.get_destination_page_number(entry)))
    return found


def _text(reader) -> str:
    return unicodedata.normalize("NFKC", "\n".join(page.extract_text() for page in reader.pages))


def test_the_pdf_has_pages_numbers_and_a_title(small_pdf):
    assert len(small_pdf.pages) >= 15
    assert small_pdf.metadata.title == yaml.safe_load((ROOT / "_config.yml").read_text())["title"]
    last = small_pdf.pages[-1].extract_text()
    assert re.search(rf"\b{len(small_pdf.pages)} / {len(small_pdf.pages)}\b", last), "no page number"


def test_the_outline_has_the_part_the_chapter_and_its_sections_in_page_order(small_pdf):
    outline = _outline(small_pdf)
    titles = [title for _, title, _ in outline]
    assert "Attention across architectures" in titles
    chapter = next(e for e in outline if re.fullmatch(r"1\. Graph attention", e[1]))
    sections = [e for e in outline if e[0] == chapter[0] + 1 and e[1].startswith("1.")]
    assert len(sections) >= 6 and any("Exercises" in t for _, t, _ in sections)
    pages = [p for _, _, p in outline]
    assert pages == sorted(pages), "bookmarks out of page order"
    text = small_pdf.pages[sections[0][2]].extract_text()
    assert sections[0][1].split(". ", 1)[1] in " ".join(text.split()), "a bookmark points at the wrong page"


def test_formulas_code_figures_and_the_bibliography_are_printed(small_pdf):
    text = _text(small_pdf)
    assert "softmax" in text and "α" in text, "no typeset formula"  # GAT's attention coefficients
    assert "import torch" in text or "from attnbook" in text, "no code"
    images = sum(len(page.images) for page in small_pdf.pages)
    assert images >= 2, f"{images} figures"
    assert "Veličković" in text or "Velickovic" in text, "the bibliography is missing GAT's paper"
    assert "Contents" in text
