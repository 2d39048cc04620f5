"""The website's interactives in headless Chromium (Debian's, driven by Selenium).

Two parts. First a harness page, written to a temporary folder, loads the scripts and the
stylesheet of ``_static/interactives/`` and holds the five placeholders: each widget
replaces its fallback, its controls (mouse and keyboard) change the drawing and the
status line, stepping reaches the end state, the browser logs no error and nothing
scrolls sideways at 1280 and 800 pixels. Then the built site (``_build/html``, skipped
until the book is built with the placeholders): each of the five chapter pages holds one
widget, initialised. The arithmetic is checked against attnbook in node:
``tests/book/test_interactives.py``.
"""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "_static" / "interactives"
HTML = ROOT / "_build" / "html"
#: widget -> the chapter whose page holds it
CHAPTER = {"online-softmax": "flash", "masks": "attention", "paged-allocator": "kv_cache",
           "ring": "distributed", "speculative": "serving"}  # fmt: skip

pytestmark = pytest.mark.site


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not (chromium and driver_path):
        pytest.fail("the browser tests need Debian's chromium and chromium-driver "
                    "(apt-get install chromium chromium-driver)")  # fmt: skip
    profile = tempfile.mkdtemp(prefix="attnbook-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--disable-background-networking", "--disable-sync",
                "--disable-component-update", "--window-size=1280,1000",
                f"--user-data-dir={profile}", "--allow-file-access-from-files"]:  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _harness(folder: Path) -> Path:
    """A page like a chapter's column: the stylesheet, every script, five placeholders."""
    shutil.copytree(STATIC, folder / "_static" / "interactives")
    scripts = "\n".join(
        f'<script src="_static/interactives/{p.name}"></script>'
        for p in sorted(STATIC.glob("*.js"), reverse=True)  # any order must work
    )
    placeholders = "\n".join(
        f'<div class="attn-interactive" data-widget="{name}">'
        f'<p class="attn-fallback">This interactive needs JavaScript.</p></div>'
        for name in CHAPTER
    )
    page = folder / "index.html"
    page.write_text(
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        "<title>interactives</title>"
        "<link rel='stylesheet' href='_static/interactives/interactives.css'>"
        f"{scripts}</head><body><main style='max-width: 50rem; margin: 0 auto; "
        f"padding: 0 1rem'><h1>Interactives</h1>{placeholders}</main></body></html>"
    )
    return page


@pytest.fixture(scope="module")
def harness(browser):
    folder = Path(tempfile.mkdtemp(prefix="attnbook-interactives-"))
    url = _harness(folder).as_uri()
    browser.get(url)
    browser.get_log("browser")  # start from an empty log
    yield url
    shutil.rmtree(folder, ignore_errors=True)


def _open(browser, url: str, width: int = 1280):
    browser.set_window_size(width, 1000)
    browser.get(url)
    deadline = time.time() + 20
    while browser.execute_script("return document.readyState") != "complete":
        if time.time() > deadline:
            break
        time.sleep(0.1)


def _widget(browser, name: str):
    return browser.find_element("css selector", f'.attn-interactive[data-widget="{name}"]')


def _status(widget) -> str:
    return widget.find_element("css selector", ".attn-status").text


def _click(widget, action: str):
    button = widget.find_element("css selector", f'button[data-action="{action}"]')
    widget.parent.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
    button.click()


def _set(browser, control, value):
    """Set a slider or a select as a reader would, firing its input and change events."""
    browser.execute_script(
        "arguments[0].value = arguments[1];"
        "arguments[0].dispatchEvent(new Event('input', {bubbles: true}));"
        "arguments[0].dispatchEvent(new Event('change', {bubbles: true}));",
        control, str(value),
    )  # fmt: skip


def _errors(browser) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def _overflow(browser) -> list[str]:
    return browser.execute_script(
        """const wide = [];
           if (document.documentElement.scrollWidth > window.innerWidth + 1)
             wide.push('page ' + document.documentElement.scrollWidth + 'px in '
                       + window.innerWidth + 'px');
           document.querySelectorAll('.attn-interactive').forEach(w => {
             if (w.scrollWidth > w.clientWidth + 1)
               wide.push(w.dataset.widget + ' ' + w.scrollWidth + 'px in ' + w.clientWidth + 'px');
             w.querySelectorAll('*').forEach(e => {
               const r = e.getBoundingClientRect(), box = w.getBoundingClientRect();
               if (r.width && r.right > box.right + 1)
                 wide.push(w.dataset.widget + ': ' + e.tagName + ' ends at ' + r.right
                           + ' past ' + box.right);
             });
           });
           return wide;"""
    )


def test_every_widget_replaces_its_fallback_and_has_a_live_status(browser, harness):
    _open(browser, harness)
    for name in CHAPTER:
        widget = _widget(browser, name)
        assert "attn-ready" in widget.get_attribute("class"), name
        assert not widget.find_elements("css selector", ".attn-fallback"), name
        status = widget.find_element("css selector", ".attn-status")
        assert status.get_attribute("aria-live") == "polite" and status.text, name
        controls = widget.find_elements("css selector", "input, select")
        assert controls, name
        for control in controls:  # every control has a label
            cid = control.get_attribute("id")
            assert widget.find_elements("css selector", f'label[for="{cid}"]'), (name, cid)
    assert not _errors(browser)


@pytest.mark.parametrize("width", [1280, 800])
def test_nothing_scrolls_sideways(browser, harness, width):
    _open(browser, harness, width)
    wide = _overflow(browser)
    for name in CHAPTER:  # at the end state too, where the drawings are largest
        if name != "masks":  # the masks have no steps
            _click(_widget(browser, name), "end")
    wide += _overflow(browser)
    assert not wide, f"at {width} px: {wide[:8]}"
    browser.set_window_size(1280, 1000)


def test_online_softmax_steps_to_the_full_softmax(browser, harness):
    _open(browser, harness)
    widget = _widget(browser, "online-softmax")
    start = _status(widget)
    _click(widget, "next")
    assert _status(widget) != start and "Tile 1 of 3" in _status(widget)
    rows = widget.find_elements("css selector", ".attn-table tbody tr")
    assert len(rows) == 2
    block = widget.find_elements("css selector", 'input[type="range"]')[1]
    _set(browser, block, 3)
    assert "in 4 tiles of 3" in _status(widget)
    _click(widget, "end")
    assert widget.get_attribute("data-done") == "1"
    assert "equals the full softmax" in _status(widget)
    online = [e.text for e in widget.find_elements("css selector", "text.attn-online")]
    full = [e.text for e in widget.find_elements("css selector", "text.attn-full")]
    assert len(online) == 12 and online == full
    assert float(re.search(r"largest difference ([0-9.e+-]+)", _status(widget))[1]) < 1e-12
    assert not _errors(browser)


def test_masks_redraw_for_every_control_and_answer_the_keyboard(browser, harness):
    from selenium.webdriver.common.keys import Keys

    _open(browser, harness)
    widget = _widget(browser, "masks")
    assert widget.get_attribute("data-allowed") == "22"  # causal, L = 4, S = 7
    assert "query 3 sits at key position 6 and sees keys 0 to 6" in _status(widget)
    assert len(widget.find_elements("css selector", "rect.attn-cell")) == 28
    sliders = widget.find_elements("css selector", 'input[type="range"]')
    sliders[0].send_keys(Keys.ARROW_LEFT)  # L: 4 -> 3, from the keyboard
    assert "L = 3" in _status(widget)
    assert len(widget.find_elements("css selector", "rect.attn-cell")) == 21
    _set(browser, widget.find_element("css selector", "select"), "causal-sliding")
    assert "causal sliding window" in _status(widget) and "w = 2" in _status(widget)
    assert widget.get_attribute("data-allowed") == "9"
    _set(browser, widget.find_element("css selector", "select"), "longformer")
    assert "L = 3, S = 3" in _status(widget)
    assert not _errors(browser)


def test_paged_allocator_serves_every_request_and_frees_the_pool(browser, harness):
    _open(browser, harness)
    widget = _widget(browser, "paged-allocator")
    assert "Before the first step" in _status(widget)
    _click(widget, "next")
    assert "Step 0" in _status(widget) and "arrived" in _status(widget)
    assert widget.find_elements("css selector", "rect.attn-used")
    _click(widget, "end")
    assert widget.get_attribute("data-done") == "1"
    assert "pool is free again" in _status(widget)
    assert not widget.find_elements("css selector", "rect.attn-used")
    _set(browser, widget.find_elements("css selector", 'input[type="range"]')[0], 2)
    assert len(widget.find_elements("css selector", "rect.attn-slot")) == 2 * 16
    assert not _errors(browser)


@pytest.mark.parametrize("layout, causal, skipped", [("contiguous", False, 0),
                         ("contiguous", True, 6), ("zigzag", True, 28)])  # fmt: skip
def test_ring_finishes_every_block(browser, harness, layout, causal, skipped):
    from selenium.webdriver.common.keys import Keys

    _open(browser, harness)
    widget = _widget(browser, "ring")
    _set(browser, widget.find_element("css selector", "select"), layout)
    if causal:
        widget.find_element("css selector", 'input[type="checkbox"]').click()
    next_button = widget.find_element("css selector", 'button[data-action="next"]')
    next_button.send_keys(Keys.SPACE)  # a button answers the keyboard
    assert "Step t = 0 (the steps run t = 0 to 3)" in _status(widget) and "rank 0 holds KV 0" in _status(widget)
    for _ in range(3):
        next_button.click()
    chunks = 8 if layout == "zigzag" else 4
    assert widget.get_attribute("data-done") == "1"
    assert f"all {chunks * chunks} blocks visited" in _status(widget)
    assert int(widget.get_attribute("data-skipped")) == skipped
    assert int(widget.get_attribute("data-computed")) == chunks * chunks - skipped
    assert not _errors(browser)


def test_speculative_round_ends_with_a_target_token_and_new_rounds_differ(browser, harness):
    _open(browser, harness)
    widget = _widget(browser, "speculative")
    statuses = set()
    for _ in range(4):
        assert "the draft proposed 4 tokens" in _status(widget)
        _click(widget, "next")
        assert "Check 1" in _status(widget) and "min(1, p/q)" in _status(widget)
        _click(widget, "end")
        assert widget.get_attribute("data-done") == "1"
        assert "tokens for one target pass" in _status(widget)
        n = int(widget.get_attribute("data-accepted"))
        assert len(widget.find_elements("css selector", ".attn-accepted")) == n
        assert len(widget.find_elements("css selector", ".attn-target")) == 1
        statuses.add(_status(widget))
        _click(widget, "new")
    assert len(statuses) > 1
    assert not _errors(browser)


# --------------------------------------------------------------------------------------
# The built site
# --------------------------------------------------------------------------------------
class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site():
    page = HTML / "book" / "flash.html"
    if not page.exists() or 'data-widget="online-softmax"' not in page.read_text():
        pytest.skip("_build/html is not built with the interactives' placeholders (make book)")
    handler = functools.partial(_Quiet, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.mark.parametrize("name", list(CHAPTER))
def test_each_chapter_page_holds_its_widget_initialised(browser, site, name):
    _open(browser, f"{site}/book/{CHAPTER[name]}.html")
    browser.get_log("browser")
    _open(browser, f"{site}/book/{CHAPTER[name]}.html")
    widgets = browser.find_elements("css selector", ".attn-interactive")
    assert [w.get_attribute("data-widget") for w in widgets] == [name]
    widget = widgets[0]
    assert "attn-ready" in widget.get_attribute("class")
    assert not widget.find_elements("css selector", ".attn-fallback")
    if name != "masks":  # the masks have no steps
        _click(widget, "end")
        assert widget.get_attribute("data-done") == "1"
    assert not [e for e in _overflow(browser) if e.startswith(name)]
    errors = [e for e in _errors(browser) if "interactive" in e or "/interactives/" in e]
    assert not errors
