"""The built website, as a reader sees it: headless Chromium (Debian's) driven by Selenium.

Needs ``_build/html`` (``make book``; ``make test`` builds it first) and ``chromium`` +
``chromium-driver``. The site is served on 127.0.0.1 by a local HTTP server that records every
request, so a missing stylesheet, script or image shows up as a 404 in the log.
"""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
CHAPTERS = sorted(p.stem for p in (ROOT / "book").glob("*.ipynb"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())


def _toc_pages(entries) -> list[str]:
    pages = []
    for entry in entries or []:
        if "file" in entry:
            pages.append(f"{entry['file']}.html")
        for key in ("chapters", "sections", "parts"):
            pages += _toc_pages(entry.get(key))
    return pages


_TOC = yaml.safe_load((ROOT / "_toc.yml").read_text())
# Every page a reader reaches from the navigation, plus Sphinx's own search and index pages.
PAGES = ["intro.html", *_toc_pages(_TOC.get("parts")), "search.html", "genindex.html"]

pytestmark = pytest.mark.site


class _Handler(http.server.SimpleHTTPRequestHandler):
    log: list[tuple[str, int]] = []

    def log_request(self, code="-", size="-"):
        _Handler.log.append((urllib.parse.urlsplit(self.path).path, int(code)))

    def log_message(self, *args):  # keep the test output clean
        pass


@pytest.fixture(scope="module")
def server():
    if not (HTML / "intro.html").exists():
        pytest.fail(f"{HTML} is not built: run `make book` first (make test does it)")
    handler = functools.partial(_Handler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not (chromium and driver_path):
        pytest.fail("the browser tests need Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)")
    profile = tempfile.mkdtemp(prefix="attnbook-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--window-size=1400,1000", f"--user-data-dir={profile}"]:
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _open(browser, server, page: str):
    _Handler.log.clear()
    browser.get(f"{server}/{page}")
    deadline = time.time() + 20
    while browser.execute_script("return document.readyState") != "complete" and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)  # late assets (fonts, images) requested by scripts


def _wait_until(condition, seconds: float = 5.0) -> None:
    deadline = time.time() + seconds
    while not condition() and time.time() < deadline:
        time.sleep(0.1)


@pytest.mark.parametrize("page", PAGES)
def test_page_loads_every_local_asset(browser, server, page):
    _open(browser, server, page)
    failed = [(path, code) for path, code in _Handler.log if code >= 400]
    assert not failed, f"{page}: local requests failed: {failed}"
    broken_images = browser.execute_script(
        "return [...document.images].filter(i => i.complete && i.naturalWidth === 0).map(i => i.src)"
    )
    assert not broken_images, f"{page}: images that did not load: {broken_images}"
    titles = browser.execute_script("return [...document.querySelectorAll('h1')].map(h => h.innerText.trim()).filter(Boolean)")
    assert titles, f"{page} has no visible title"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_math_is_typeset_from_the_local_mathjax(browser, server, chapter):
    _open(browser, server, f"book/{chapter}.html")
    _wait_until(lambda: browser.execute_script("return document.querySelectorAll('mjx-container').length > 0"), 15)
    typeset = browser.execute_script("return document.querySelectorAll('mjx-container').length")
    assert typeset > 0, f"{chapter}: no formula was typeset"
    sources = browser.execute_script("return [...document.querySelectorAll('script[src*=\"mathjax\"]')].map(s => s.src)")
    assert sources and all(src.startswith(server) for src in sources), f"MathJax must come from the site: {sources}"


_IDS: dict[Path, set[str]] = {}


def _ids(path: Path) -> set[str]:
    """The element ids of a built page (the targets of ``page.html#id`` links)."""
    if path not in _IDS:
        _IDS[path] = set(re.findall(r"""\bid=["']([^"']+)["']""", path.read_text(errors="replace")))
    return _IDS[path]


def _broken_links(page: str, hrefs: list[str], server: str) -> list[str]:
    broken = []
    for href in hrefs:
        if not href.startswith(server):
            continue
        url = urllib.parse.urlsplit(href)
        path = urllib.parse.unquote(url.path).lstrip("/") or "index.html"
        target = HTML / path
        if path.endswith("/"):
            target = target / "index.html"
        if not target.exists():
            broken.append(f"{href} (no such file)")
        elif url.fragment and target.suffix == ".html" and urllib.parse.unquote(url.fragment) not in _ids(target):
            broken.append(f"{href} (no element with id {url.fragment!r})")
    return broken


@pytest.mark.parametrize("page", PAGES)
def test_internal_links_resolve(browser, server, page):
    _open(browser, server, page)
    hrefs = browser.execute_script("return [...document.querySelectorAll('a[href]')].map(a => a.href)")
    broken = _broken_links(page, hrefs, server)
    assert not broken, f"{page} has broken internal links: {broken}"


def test_every_built_page_has_no_broken_internal_link(server):
    """All of _build/html, beyond the navigation: the [source] pages of the API, the module index..."""
    pages = sorted(p for p in HTML.rglob("*.html") if not p.relative_to(HTML).parts[0].startswith("_static"))
    assert len(pages) > len(PAGES), "expected the API's [source] pages too"
    broken = {}
    for path in pages:
        page = path.relative_to(HTML).as_posix()
        base = f"{server}/{page}"
        hrefs = [urllib.parse.urljoin(base, h) for h in re.findall(r"""<a\b[^>]*\bhref=["']([^"']+)["']""", path.read_text())]
        hrefs += [urllib.parse.urljoin(base, h) for h in re.findall(r"""<(?:img|script)\b[^>]*\bsrc=["']([^"'#?]+)""", path.read_text())]
        found = _broken_links(page, [h.replace("&amp;", "&") for h in hrefs], server)
        if found:
            broken[page] = found
    assert not broken, f"broken internal links or assets: {broken}"


def _scrolling_code(browser, server, page: str) -> list:
    """The ``pre`` blocks of ``page`` wider than their box in a 1280-pixel-wide window, with
    every collapsed block (hidden solutions, hidden inputs) opened first."""
    browser.set_window_size(1280, 1000)
    try:
        _open(browser, server, page)
        return browser.execute_script(
            """document.querySelectorAll('details').forEach(d => { d.open = true; });
               document.querySelectorAll('.toggle-hidden, .toggle-details__container')
                 .forEach(e => e.classList.remove('toggle-hidden'));
               const longest = t => t.split('\\n').reduce((a, l) => l.length > a.length ? l : a, '');
               return [...document.querySelectorAll('pre')]
                 .filter(p => p.offsetParent !== null && p.scrollWidth > p.clientWidth + 1)
                 .map(p => `${p.scrollWidth}px in ${p.clientWidth}px: ${longest(p.innerText).slice(0, 90)}`)"""
        )
    finally:
        browser.set_window_size(1400, 1000)


@pytest.mark.parametrize("page", PAGES)
def test_code_fits_the_page_at_1280_px(browser, server, page):
    """Code cells, their outputs and listings show without a horizontal scroll bar."""
    wide = _scrolling_code(browser, server, page)
    assert not wide, f"{page}: {len(wide)} code blocks scroll sideways at 1280 px: {wide[:5]}"


def test_api_source_pages_fit_the_page_at_1280_px(browser, server):
    """The API reference's [source] pages show the package's modules: they fit too."""
    pages = sorted(p.relative_to(HTML).as_posix() for p in (HTML / "_modules").rglob("*.html"))
    assert len(pages) >= 10, f"expected a [source] page per module, found {pages}"
    wide = {page: found for page in pages if (found := _scrolling_code(browser, server, page))}
    assert not wide, f"[source] pages with code that scrolls sideways at 1280 px: {wide}"


@pytest.mark.parametrize("page", PAGES)
def test_every_image_has_alt_text_and_every_chapter_figure_a_numbered_caption(browser, server, page):
    """Every image of a page has alt text; in a chapter every image is a numbered figure ("Fig.
    N.M" in its caption: numfig, and tests/book/test_figures.py for the notebooks' metadata)."""
    _open(browser, server, page)
    no_alt = browser.execute_script(
        "return [...document.querySelectorAll('article img')].filter(i => !(i.alt && i.alt.trim())).map(i => i.src)"
    )
    assert not no_alt, f"{page}: images without alt text: {no_alt}"
    if page.removeprefix("book/").removesuffix(".html") not in CHAPTERS:
        return
    figures = browser.execute_script(
        """return [...document.querySelectorAll('article img')].map(i => {
             const number = i.closest('figure')?.querySelector('figcaption span.caption-number');
             const text = i.closest('figure')?.querySelector('figcaption span.caption-text');
             return [i.src, number ? number.textContent.trim() : '', text ? text.textContent.trim() : ''];
           })"""
    )
    assert figures, f"{page} shows no image"
    unnumbered = [src for src, number, text in figures if not (re.fullmatch(r"Fig\. \d+\.\d+", number) and text)]
    assert not unnumbered, f"{page}: images outside a figure with a numbered caption: {unnumbered}"
    numbers = [number for _, number, _ in figures]
    assert len(set(numbers)) == len(numbers), f"{page}: two images share a figure number: {numbers}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_colab_link_targets_this_chapters_student_notebook(browser, server, chapter):
    """The public site is the student edition: its Colab button opens the chapter from the student
    branch (solutions stripped; tests/book/test_editions.py checks that branch's notebooks)."""
    _open(browser, server, f"book/{chapter}.html")
    links = browser.execute_script(
        "return [...document.querySelectorAll('a[href*=\"colab.research.google.com\"]')].map(a => a.href)"
    )
    repo = CONFIG["repository"]["url"].removeprefix("https://github.com/")
    branch = CONFIG["sphinx"]["config"]["attnbook_student_branch"]
    expected = f"https://colab.research.google.com/github/{repo}/blob/{branch}/book/{chapter}.ipynb"
    assert links == [expected], f"{chapter}: Colab links {links}, expected [{expected}]"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_shows_its_figures(browser, server, chapter):
    _open(browser, server, f"book/{chapter}.html")
    figures = browser.execute_script(
        "return [...document.querySelectorAll('.cell_output img')].map(i => [i.naturalWidth, i.alt])"
    )
    assert len(figures) >= 2, f"{chapter}: expected executed figures in the page, found {len(figures)}"
    assert all(width > 100 for width, _ in figures), f"{chapter}: a figure did not render: {figures}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_exercise_cells_show_the_stub_to_complete(browser, server, chapter):
    """The student edition: each answer cell is shown, open, as the stub a student completes; the
    solution is not behind a click, it is not on the page (tests/book/test_editions.py)."""
    _open(browser, server, f"book/{chapter}.html")
    cells = browser.find_elements("css selector", ".tag_solution")
    assert cells, f"{chapter}: no exercise answer cell found"
    for cell in cells:
        assert not cell.find_elements("css selector", "details"), f"{chapter}: a collapsed answer cell"
        code = cell.find_element("css selector", ".cell_input")
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", code)
        assert code.is_displayed(), f"{chapter}: an answer cell is hidden"
        assert "raise NotImplementedError" in code.text and "BEGIN SOLUTION" not in code.text


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_exercises_show_and_written_solutions_are_absent(browser, server, chapter):
    _open(browser, server, f"book/{chapter}.html")
    exercises = browser.find_elements("css selector", ".exercise")
    assert len(exercises) >= 3, f"{chapter}: {len(exercises)} exercises on the page"
    assert all(e.is_displayed() for e in exercises)
    assert not browser.find_elements("css selector", ".solution"), f"{chapter}: a written solution on the page"


SEARCH_WORDS = {"attention": "bottleneck", "inside_attention": "equivariance",
                "complexity": "crossover", "positional": "ALiBi",
                "sparse": "BigBird", "linear": "Performer", "kv_cache": "paged", "flash": "SRAM",
                "rnn_attention": "Bahdanau", "vision_attention": "rollout", "graph_attention": "karate",
                "connections": "Hopfield", "transformer": "induction", "serving": "speculative",
                "distributed": "Ulysses", "kernel_lab": "launcher"}


def test_search_words_cover_every_chapter():
    assert sorted(SEARCH_WORDS) == CHAPTERS


@pytest.mark.parametrize("chapter, word", sorted(SEARCH_WORDS.items()))
def test_search_finds_a_chapter_by_a_word_in_it(browser, server, chapter, word):
    _open(browser, server, f"search.html?q={word}")
    deadline = time.time() + 20
    links: list[str] = []
    while time.time() < deadline:
        links = browser.execute_script("return [...document.querySelectorAll('#search-results a')].map(a => a.href)")
        if links:
            break
        time.sleep(0.25)
    assert any(f"book/{chapter}.html" in link for link in links), f"searching {word!r} gave {links}"
