"""The built website, as a reader sees it: headless Chromium (Debian's) driven by Selenium.

Needs ``_build/html`` (``make book``; ``make test`` builds it first) and ``chromium`` +
``chromium-driver``. The site is served on 127.0.0.1 by a local HTTP server that records every
request, so a missing stylesheet, script or image shows up as a 404 in the log.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
CHAPTERS = sorted(p.stem for p in (ROOT / "book").glob("*.ipynb"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
PAGES = ["intro.html", "book/bibliography.html", *[f"book/{c}.html" for c in CHAPTERS]]

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
    assert browser.find_element("css selector", "article h1").text.strip(), f"{page} has no title"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_math_is_typeset_from_the_local_mathjax(browser, server, chapter):
    _open(browser, server, f"book/{chapter}.html")
    _wait_until(lambda: browser.execute_script("return document.querySelectorAll('mjx-container').length > 0"), 15)
    typeset = browser.execute_script("return document.querySelectorAll('mjx-container').length")
    assert typeset > 0, f"{chapter}: no formula was typeset"
    sources = browser.execute_script("return [...document.querySelectorAll('script[src*=\"mathjax\"]')].map(s => s.src)")
    assert sources and all(src.startswith(server) for src in sources), f"MathJax must come from the site: {sources}"


@pytest.mark.parametrize("page", PAGES)
def test_internal_links_resolve(browser, server, page):
    _open(browser, server, page)
    hrefs = browser.execute_script("return [...document.querySelectorAll('a[href]')].map(a => a.href)")
    for href in hrefs:
        url = urllib.parse.urlsplit(href)
        if not href.startswith(server) or not url.path.endswith(".html"):
            continue
        target = HTML / urllib.parse.unquote(url.path).lstrip("/")
        assert target.exists(), f"{page} links to missing page {url.path}"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_colab_link_targets_this_chapter(browser, server, chapter):
    _open(browser, server, f"book/{chapter}.html")
    links = browser.execute_script(
        "return [...document.querySelectorAll('a[href*=\"colab.research.google.com\"]')].map(a => a.href)"
    )
    repo = CONFIG["repository"]["url"].removeprefix("https://github.com/")
    expected = f"https://colab.research.google.com/github/{repo}/blob/{CONFIG['repository']['branch']}/book/{chapter}.ipynb"
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
def test_code_solutions_are_collapsed_until_clicked(browser, server, chapter):
    _open(browser, server, f"book/{chapter}.html")
    hidden = browser.find_elements("css selector", ".tag_solution details.hide")
    assert hidden, f"{chapter}: no collapsed code solution found"
    details = hidden[0]
    code = details.find_element("css selector", ".cell_input")
    assert details.get_attribute("open") is None and not code.is_displayed()
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", details)
    details.find_element("css selector", "summary").click()
    _wait_until(code.is_displayed)
    assert details.get_attribute("open") is not None and code.is_displayed()
    assert "BEGIN SOLUTION" in code.text


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_written_solutions_are_collapsed_until_clicked(browser, server, chapter):
    _open(browser, server, f"book/{chapter}.html")
    solutions = browser.find_elements("css selector", ".solution.dropdown")
    assert solutions, f"{chapter}: no collapsed written solution found"
    solution = solutions[0]
    body = solution.find_element("css selector", "section")
    assert not body.is_displayed(), f"{chapter}: the first written solution is visible before a click"
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", solution)
    solution.find_element("css selector", ".toggle-button").click()
    _wait_until(body.is_displayed)
    assert body.is_displayed(), f"{chapter}: the solution did not open on click"


@pytest.mark.parametrize("word, chapter", [("equivariance", "01_attention"), ("crossover", "02_complexity")])
def test_search_finds_a_chapter_by_a_word_in_it(browser, server, word, chapter):
    _open(browser, server, f"search.html?q={word}")
    deadline = time.time() + 20
    links: list[str] = []
    while time.time() < deadline:
        links = browser.execute_script("return [...document.querySelectorAll('#search-results a')].map(a => a.href)")
        if links:
            break
        time.sleep(0.25)
    assert any(f"book/{chapter}.html" in link for link in links), f"searching {word!r} gave {links}"
