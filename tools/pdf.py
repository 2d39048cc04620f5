"""The book as one PDF, printed by the browser from the built website.

    make pdf                                            # make book, then _build/pdf/attention-book.pdf
    .venv/bin/python tools/pdf.py [HTML_DIR [TOC [OUT.pdf]]]

The route needs nothing beyond what the browser tests already use (Debian's chromium and
chromium-driver), works offline, and prints exactly what the website shows: the executed
outputs, the figures, the formulas as MathJax typesets them, the exercises and the
bibliography. The pages of the table of contents are joined, in its order, into one document
that starts with a contents page; links between chapters become links inside the PDF. Once
MathJax has typeset every formula, Chromium prints it with a page number on every page, and
the PDF gets an outline (its bookmarks: parts, chapters, sections), placed where Chromium put
each heading. Solutions stay folded, as on the website.
"""

from __future__ import annotations

import base64
import functools
import http.server
import posixpath
import re
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import yaml

ROOT = Path(__file__).resolve().parents[1]
COMBINED = "_print.html"
# The website's frame, which a printed page does not need: navigation, buttons, footers, and
# the theme's own print header (it repeats the title and the page's contents).
FRAME = [".bd-header", ".bd-sidebar-primary", ".bd-sidebar-secondary", ".bd-header-article",
         ".header-article", ".prev-next-area", ".bd-footer", ".bd-footer-article",
         ".bd-footer-content", "#pst-back-to-top", ".skip-link", ".onlyprint", "a.headerlink"]
PRINT_CSS = """
.bd-main .bd-content .bd-article-container, .bd-page-width { max-width: 100% !important; }
.bd-article h1 { display: block !important; }
section.pdf-page { break-before: page; }
section.pdf-cover { padding-top: 30%; text-align: center; }
section.pdf-cover h1 { font-size: 2.4em; }
pre { white-space: pre-wrap !important; word-break: break-word; }
img { max-width: 100% !important; break-inside: avoid; }
h1, h2, h3 { break-after: avoid; }
nav.pdf-contents ol { list-style: none; padding-left: 1.2em; }
nav.pdf-contents > ol { padding-left: 0; }
nav.pdf-contents a { text-decoration: none; }
"""
FOOTER = ('<div style="font-size: 8px; width: 100%; text-align: center; color: #555;">'
          '<span class="pageNumber"></span> / <span class="totalPages"></span></div>')


@dataclass
class Heading:
    """A heading of the combined document: its outline level, title and element id."""

    level: int
    title: str
    anchor: str
    children: list["Heading"] = field(default_factory=list)


def pages(toc: Path) -> list[tuple[str | None, str]]:
    """``(part caption, page)`` for every document of ``_toc.yml`` in reading order; the
    page is its HTML path (``book/x.html``)."""
    spec = yaml.safe_load(toc.read_text())
    order = [(None, f"{spec['root']}.html")]

    def walk(entries, caption):
        for entry in entries or []:
            if "file" in entry:
                order.append((caption, f"{entry['file']}.html"))
            walk(entry.get("sections"), caption)
            walk(entry.get("chapters"), entry.get("caption", caption))

    walk(spec.get("parts"), None)
    walk(spec.get("chapters"), None)
    return order


def _prefix(page: str) -> str:
    return page.removesuffix(".html").replace("/", "-")


def _rewrite(url: str, page: str, included: set[str]) -> str:
    """``url`` as written in ``page`` (a path below the website's root), as seen from the
    combined document at the root: a link into an included page becomes an anchor."""
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or url.startswith(("data:", "mailto:")):
        return url
    target = posixpath.normpath(posixpath.join(posixpath.dirname(page), parts.path)) if parts.path else page
    if target in included:
        return f"#{_prefix(target)}--{parts.fragment}" if parts.fragment else f"#{_prefix(target)}"
    return urlunsplit(("", "", target, parts.query, parts.fragment))


_TEX = [(r"\\sqrt\{([^}]*)\}", r"√\1"), (r"\\(?:mathrm|text|operatorname)\{([^}]*)\}", r"\1"),
        (r"\\times", "×"), (r"\\cdot", "·"), (r"\\le\b", "≤"), (r"\\ge\b", "≥"), (r"\\to\b", "→"),
        (r"\\[a-zA-Z]+", ""), (r"[{}]", "")]


def _title(heading) -> str:
    """A heading's text for the outline, its formulas in plain characters."""
    parts = []
    for node in heading.descendants:
        if isinstance(node, str) and not node.find_parent("span", class_="math"):
            parts.append(str(node))
        elif getattr(node, "name", None) == "span" and "math" in node.get("class", []):
            tex = node.get_text().strip().removeprefix("\\(").removesuffix("\\)")
            for pattern, repl in _TEX:
                tex = re.sub(pattern, repl, tex)
            parts.append(tex)
    return " ".join("".join(parts).split())


def combine(html_dir: Path, order: list[tuple[str | None, str]],
            cover: tuple[str, ...] = ()) -> tuple[Path, list[Heading]]:
    """One HTML document at the website's root: a cover (its lines: title first), a
    contents page, then every page of ``order``. Returns it and its outline."""
    from bs4 import BeautifulSoup

    missing = [p for _, p in order if not (html_dir / p).exists()]
    if missing:
        raise SystemExit(f"{missing} are missing from {html_dir}: run `make book` first")
    shell = BeautifulSoup((html_dir / order[0][1]).read_text(), "html.parser")
    for selector in FRAME:
        for node in shell.select(selector):
            node.decompose()
    body = shell.select_one("article.bd-article")
    body.clear()
    included = {p for _, p in order}
    outline: list[Heading] = []
    part = None
    for caption, page in order:
        soup = BeautifulSoup((html_dir / page).read_text(), "html.parser")
        for selector in FRAME:
            for node in soup.select(selector):
                node.decompose()
        article = soup.select_one("article.bd-article")
        prefix = _prefix(page)
        for node in article.find_all(id=True):  # ids are unique per page, not per book
            node["id"] = f"{prefix}--{node['id']}"
        for tag, attr in (("img", "src"), ("a", "href"), ("source", "src"), ("object", "data")):
            for node in article.find_all(tag):
                if node.get(attr):
                    node[attr] = _rewrite(node[attr], page, included)
        section = shell.new_tag("section", attrs={"class": "pdf-page", "id": prefix})
        section.extend(list(article.children))
        body.append(section)
        chapter = None
        for heading in section.find_all(["h1", "h2"]):
            anchor = heading.parent.get("id") or prefix
            entry = Heading(1 if heading.name == "h1" else 2, _title(heading), anchor)
            if heading.name == "h1" and chapter is None:
                chapter = entry
                if caption is None:
                    outline.append(entry)
                else:
                    if part is None or part.title != caption:
                        part = Heading(0, caption, anchor)
                        outline.append(part)
                    part.children.append(entry)
            elif chapter is not None:
                chapter.children.append(entry)
    body.insert(0, _contents(shell, outline))
    if cover:
        page = shell.new_tag("section", attrs={"class": "pdf-cover", "id": "pdf-cover"})
        for i, line in enumerate(cover):
            node = shell.new_tag("h1" if i == 0 else "p")
            node.string = line
            page.append(node)
        body.insert(0, page)
    for node in shell.select("link[href], script[src]"):  # the shell is the root page already
        attr = "href" if node.name == "link" else "src"
        node[attr] = _rewrite(node[attr], order[0][1], set())
    style = shell.new_tag("style")
    style.string = PRINT_CSS
    shell.head.append(style)
    out = html_dir / COMBINED
    out.write_text(str(shell))
    return out, outline


def _contents(shell, outline: list[Heading]):
    """The contents page: every part, chapter and section, each a link to its place."""
    nav = shell.new_tag("nav", attrs={"class": "pdf-contents"})
    title = shell.new_tag("h1")
    title.string = "Contents"
    nav.append(title)

    def listing(entries):
        items = shell.new_tag("ol")
        for entry in entries:
            item = shell.new_tag("li")
            link = shell.new_tag("a", href=f"#{entry.anchor}")
            link.string = entry.title
            if entry.level == 0:  # a part
                strong = shell.new_tag("strong")
                strong.append(link)
                link = strong
            item.append(link)
            if entry.children and entry.level < 2:
                item.append(listing(entry.children))
            items.append(item)
        return items

    nav.append(listing(outline))
    section = shell.new_tag("section", attrs={"class": "pdf-page", "id": "pdf-contents"})
    section.append(nav)
    return section


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def print_pdf(html_dir: Path, document: str, pdf: Path, timeout: float = 900.0) -> int:
    """Print ``html_dir/document`` with headless Chromium once MathJax has typeset it;
    returns the number of formulas typeset."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not (chromium and driver_path):
        raise SystemExit("the PDF is printed by Debian's chromium and chromium-driver: "
                         "apt-get install chromium chromium-driver")
    handler = functools.partial(_Quiet, directory=str(html_dir))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    profile = tempfile.mkdtemp(prefix="attnbook-pdf-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", f"--user-data-dir={profile}"]:
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        driver.command_executor.client_config.timeout = timeout
        driver.set_page_load_timeout(timeout)
        driver.set_script_timeout(timeout)
        driver.get(f"http://127.0.0.1:{httpd.server_address[1]}/{document}")
        typeset = driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "const wait = () => (window.MathJax && MathJax.startup && MathJax.startup.promise)"
            "  ? MathJax.startup.promise.then(() => done(document.querySelectorAll('mjx-container').length))"
            "  : setTimeout(wait, 100);"
            "document.fonts.ready.then(wait);")
        printed = driver.execute_cdp_cmd("Page.printToPDF", {
            "printBackground": True, "paperWidth": 8.27, "paperHeight": 11.69,  # A4, inches
            "marginTop": 0.6, "marginBottom": 0.7, "marginLeft": 0.6, "marginRight": 0.6,
            "displayHeaderFooter": True, "headerTemplate": "<span></span>", "footerTemplate": FOOTER,
        })
    finally:
        driver.quit()
        httpd.shutdown()
        shutil.rmtree(profile, ignore_errors=True)
    pdf.parent.mkdir(parents=True, exist_ok=True)
    pdf.write_bytes(base64.b64decode(printed["data"]))
    return typeset


def add_outline(pdf: Path, outline: list[Heading], title: str) -> int:
    """Bookmarks for ``outline``, each at the page Chromium put its anchor on (the contents
    page links to every anchor, so each is a named destination). Returns their number."""
    import logging

    from pypdf import PdfReader, PdfWriter

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # Chromium's trailer undercounts objects
    reader = PdfReader(pdf)
    pages = {name.lstrip("/"): reader.get_destination_page_number(dest)
             for name, dest in reader.named_destinations.items()}
    writer = PdfWriter(clone_from=reader)
    count = 0

    def add(entries, parent):
        nonlocal count
        for entry in entries:
            if entry.anchor not in pages:
                raise SystemExit(f"no page for {entry.title!r} (#{entry.anchor}) in {pdf}")
            item = writer.add_outline_item(title=entry.title, page_number=pages[entry.anchor], parent=parent)
            count += 1
            add(entry.children, item)

    add(outline, None)
    writer.add_metadata({"/Title": title, "/Creator": "attnbook tools/pdf.py (Chromium)"})
    writer.page_mode = "/UseOutlines"
    with open(pdf, "wb") as out:
        writer.write(out)
    return count


def build(html_dir: Path, toc: Path, pdf: Path) -> Path:
    """``make pdf``: the website in ``html_dir``, in the order of ``toc``, as ``pdf``."""
    config = yaml.safe_load((toc.parent / "_config.yml").read_text())
    version = re.search(r'__version__ = "([^"]+)"', (ROOT / "attnbook" / "__init__.py").read_text())[1]
    cover = (config["title"], config.get("author", ""), f"attnbook {version}",
             config["repository"]["url"])
    combined, outline = combine(html_dir, pages(toc), cover)
    try:
        formulas = print_pdf(html_dir, combined.name, pdf)
    finally:
        combined.unlink()
    bookmarks = add_outline(pdf, outline, config["title"])
    from pypdf import PdfReader

    print(f"{pdf}: {len(PdfReader(pdf).pages)} pages, {bookmarks} bookmarks, {formulas} formulas")
    return pdf


def main(argv: list[str]) -> int:
    html_dir, toc, pdf = (argv + [None] * 3)[:3]
    build(Path(html_dir or ROOT / "_build" / "html"), Path(toc or ROOT / "_toc.yml"),
          Path(pdf or ROOT / "_build" / "pdf" / "attention-book.pdf"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
