"""The two editions of the website (``_ext/editions.py``, issue 44).

The student edition (``make book``: ``_build/html``, what Pages deploys) shows every exercise and
no solution: the solution text of the chapters (the body lines of each solution cell and of each
``{solution}`` directive, less the trivial ones) is in none of its files: pages, ``_sources``
downloads, search index. The instructor edition (``make book-instructor``:
``_build/instructor/html``) holds every one of them. The student edition's Colab buttons open the
student branch, whose tree (``make student-branch``) holds the stripped chapters at the path they
name. ``make test`` builds both editions before running this file.
"""

from __future__ import annotations

import functools
import html
import json
import re
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import yaml
from scripts import load_script

from attnbook.course.notebooks import STUB, hidden_checks, strip_solutions

ROOT = Path(__file__).resolve().parents[2]
STUDENT = ROOT / "_build" / "html"
INSTRUCTOR = ROOT / "_build" / "instructor" / "html"
EXECUTED = ROOT / "_build" / "jupyter_execute" / "book"  # the student build's runs
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
CHAPTERS = [p.stem for p in NOTEBOOKS]
# The question pages (tools/questions.py): their answers and explanations are solutions too
PAGES = [f"questions/{p.stem}" for p in sorted((ROOT / "book").glob("questions/*.ipynb"))]
# The projects: their solutions and hidden tests are the instructor's
PAGES += [f"projects/{p.stem}" for p in sorted((ROOT / "book").glob("projects/*.ipynb"))]
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
BRANCH = CONFIG["sphinx"]["config"]["attnbook_student_branch"]
TEXT_FILES = {".html", ".js", ".txt", ".md", ".ipynb", ".json", ".log", ".py", ".rst", ".xml", ".css"}

editions = load_script(ROOT / "_ext" / "editions.py")
record_outputs = load_script(ROOT / "tools" / "record_outputs.py")

# --------------------------------------------------------------------------------------------------
# The solutions of the chapters, and what counts as their text
# --------------------------------------------------------------------------------------------------
_WORD = re.compile(r"[^\W_]+")
_SOLUTION_OPEN = re.compile(r"^\s*(`{3,}|:{3,})\s*\{solution\}")
# A line whose rendered text differs from its source (a reference renders its target's title).
_ROLE = re.compile(r"\{(ref|numref|eq|doc|cite[:\w-]*|term|download|glue[:\w]*)\}")


def _words(text: str) -> str:
    """``text`` as its words alone, one space apart: the same for a source line, its
    syntax-highlighted HTML and a JSON string holding it."""
    return " ".join(_WORD.findall(text))


def _solutions(nb) -> list[tuple[str, str, list[str]]]:
    """``(where, kind, body lines)`` of each solution of ``nb``: the lines between the markers
    of a code cell (kind ``code``), the body of a ``{solution}`` directive (``written``)."""
    found = []
    for index, cell in enumerate(nb.cells):
        where = f"cell {index}"
        if cell.cell_type == "code":
            inside, body = False, []
            for line in cell.source.split("\n"):
                marker = line.strip()
                if marker in ("### BEGIN SOLUTION", "### END SOLUTION"):
                    inside = marker.startswith("### BEGIN")
                elif inside:
                    body.append(line)
            if body:
                found.append((where, "code", body))
        elif cell.cell_type == "markdown":
            fence, body = None, []
            for line in cell.source.split("\n"):
                if fence is None:
                    match = _SOLUTION_OPEN.match(line)
                    if match:
                        fence, body = match[1], []
                elif re.fullmatch(rf"\s*{re.escape(fence[0])}{{{len(fence)},}}\s*", line):
                    found.append((where, "written", body))
                    fence = None
                elif body or not re.match(r"^\s*:[\w-]+:", line):  # not the directive's options
                    body.append(line)
    return found


@functools.cache
def _library_text() -> str:
    """The package's source: public on the API's [source] pages and in ``show_source`` outputs."""
    return "\n".join(_words(p.read_text()) for p in sorted((ROOT / "attnbook").rglob("*.py")))


@functools.cache
def _solution_lines(chapter: str) -> dict[str, list[str]]:
    """Each solution of ``chapter`` (``"<cell> <kind>"``) -> its non-trivial lines, as words:
    at least four words and 20 letters, in no part of the student notebook (the exercise, the
    stub, the prose) and not the package's own source."""
    nb = nbformat.read(ROOT / "book" / f"{chapter}.ipynb", as_version=4)
    public = [nb]
    if chapter.startswith("questions/"):  # an explanation may quote its chapter's prose
        public.append(nbformat.read(ROOT / "book" / f"{chapter.split('/')[1]}.ipynb", as_version=4))
    student = _words("\n".join(c.source for n in public for c in strip_solutions(n).cells))
    lines = {}
    for where, kind, body in _solutions(nb):
        kept = []
        for line in body:
            if kind == "written":
                if _ROLE.search(line):
                    continue
                line = re.sub(r"^\s*(\d+\.|[-*+])\s+", "", line)  # a list item's marker
            words = _words(line)
            if len(words.split()) >= 4 and len(words) >= 20 and words not in student \
                    and words not in _library_text():
                kept.append(words)
        lines[f"{where} {kind}"] = kept
    return lines


def _output_text(cell) -> str:
    """The text a code cell printed or displayed (not its images)."""
    texts = []
    for output in cell.get("outputs", []):
        texts.append("".join(output.get("text", "")))
        texts += ["".join(value) for mime, value in output.get("data", {}).items()
                  if mime.startswith("text/") or mime.endswith("json")]
        glued = "".join(output.get("data", {}).get("application/papermill.record/text/plain", ""))
        if glued:  # a number glued into the prose: shown there, maybe with thousands separators
            texts.append(glued)
            if re.fullmatch(r"-?\d+", glued.strip()):
                texts.append(f"{int(glued):,}")
        texts.append("\n".join(output.get("traceback", [])))
    return "\n".join(texts)


def _page_words(path: Path) -> str:
    text = path.read_text(errors="replace")
    if path.suffix == ".ipynb":
        text = "\n".join("".join(c.get("source", "")) + "\n" + _output_text(c)
                         for c in json.loads(text).get("cells", []))
    elif path.suffix == ".html":
        text = html.unescape(re.sub(r"<[^>]+>", " ", text))
    return _words(text)


@functools.cache
def _site_words(site: Path) -> dict[str, str]:
    """Every text file of a built site (its pages, ``_sources``, search index, scripts, logs):
    relative path -> its words."""
    if not (site / "intro.html").exists():
        pytest.fail(f"{site} is not built: run `make book` and `make book-instructor` (make test does)")
    return {p.relative_to(site).as_posix(): _page_words(p)
            for p in sorted(site.rglob("*")) if p.is_file() and p.suffix in TEXT_FILES}


# --------------------------------------------------------------------------------------------------
# The built editions
# --------------------------------------------------------------------------------------------------
def _meta_edition(site: Path, page: str) -> str | None:
    found = re.search(r'<meta name="attnbook-edition" content="(\w+)"', (site / page).read_text())
    return found and found[1]


def test_the_public_site_is_the_student_edition_and_the_instructor_edition_is_apart():
    _site_words(STUDENT), _site_words(INSTRUCTOR)
    for page in ["intro.html", "search.html", *(f"book/{c}.html" for c in CHAPTERS)]:
        assert _meta_edition(STUDENT, page) == "student", f"_build/html/{page}"
        assert _meta_edition(INSTRUCTOR, page) == "instructor", f"{INSTRUCTOR}/{page}"
    assert "Instructor edition" in (INSTRUCTOR / "intro.html").read_text(), "no banner"
    assert "Instructor edition" not in (STUDENT / "intro.html").read_text()


def test_every_solution_has_text_to_look_for():
    """Each chapter has solution lines to check, and so has each written solution: the checks
    below are not vacuous. (A code solution may have none: a one-liner, or the very line of the
    package's own function that the exercise asks to write again.)"""
    for chapter in CHAPTERS:
        lines = _solution_lines(chapter)
        assert sum(map(len, lines.values())) >= 3, f"{chapter}: {lines}"
        for where, kept in lines.items():
            if where.endswith("written"):
                assert kept, f"{chapter}, {where}: a written solution with no line to check"
    for page in PAGES:  # the explanations of the question pages
        assert sum(map(len, _solution_lines(page).values())) >= 10, page


@pytest.mark.parametrize("chapter", CHAPTERS + PAGES)
def test_no_solution_text_in_the_student_edition(chapter):
    files = _site_words(STUDENT)
    leaks = [f"{where}: {line!r} in {name}" for where, lines in _solution_lines(chapter).items()
             for line in lines for name, words in files.items() if line in words]
    assert not leaks, f"{chapter}: solution text in the student edition:\n" + "\n".join(leaks[:20])


@pytest.mark.parametrize("chapter", CHAPTERS + PAGES)
def test_the_instructor_edition_holds_every_solution(chapter):
    page = _site_words(INSTRUCTOR)[f"book/{chapter}.html"]
    missing = [f"{where}: {line!r}" for where, lines in _solution_lines(chapter).items()
               for line in lines if line not in page]
    assert not missing, f"{chapter}: solution text missing from the instructor page:\n" + "\n".join(missing)


def test_the_hidden_tests_are_in_the_instructor_edition_only():
    """A project's hidden tests (cells tagged ``hidden-tests``): not even their labels reach the
    student edition; the instructor edition shows each after its milestone's public check."""
    projects = [page for page in PAGES if page.startswith("projects/")]
    assert len(projects) >= 3
    for page in projects:
        nb = nbformat.read(ROOT / "book" / f"{page}.ipynb", as_version=4)
        secrets = [_words(label) for label, _ in hidden_checks(nb, page).values()]
        assert secrets, f"{page} has no hidden test"
        for secret in secrets:
            leaks = [name for name, words in _site_words(STUDENT).items() if secret in words]
            assert not leaks, f"{page}: hidden test {secret!r} in the student edition: {leaks}"
            assert secret in _site_words(INSTRUCTOR)[f"book/{page}.html"], (page, secret)


def _cells(page: str) -> list[str]:
    """The HTML of each code cell of a page, from its opening ``div`` to the next cell's."""
    return re.split(r'(?=<div class="cell(?: [^"]*)? docutils container")', page)[1:]


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_students_see_every_exercise_and_the_stub_to_complete(chapter):
    nb = nbformat.read(ROOT / "book" / f"{chapter}.ipynb", as_version=4)
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    exercises = len(re.findall(r"^\s*(?:`{3,}|:{3,})\s*\{exercise\}", markdown, re.M))
    written = len(re.findall(r"^\s*(?:`{3,}|:{3,})\s*\{solution\}", markdown, re.M))
    answer_cells = sum("solution" in c.metadata.get("tags", []) for c in nb.cells)
    student = (STUDENT / "book" / f"{chapter}.html").read_text()
    instructor = (INSTRUCTOR / "book" / f"{chapter}.html").read_text()
    for page in (student, instructor):
        assert len(re.findall(r'<div class="exercise\b', page)) == exercises
    assert not re.search(r'<div class="solution\b', student), "a written solution in the student page"
    assert len(re.findall(r'<div class="solution\b', instructor)) == written
    stubs = [c for c in _cells(student) if "tag_solution" in c.split(">", 1)[0]]
    assert len(stubs) == answer_cells
    for cell in stubs:  # shown, not collapsed, and the stub strip_solutions leaves
        assert "<details" not in cell and "cell_output" not in cell
        assert _words(STUB) in _words(html.unescape(re.sub(r"<[^>]+>", " ", cell)))
    hidden = [c for c in _cells(instructor) if "tag_solution" in c.split(">", 1)[0]]
    assert len(hidden) == answer_cells and all("<details" in c for c in hidden), "collapsed for instructors"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_notebook_offered_for_download_is_the_student_notebook(chapter):
    source = nbformat.read(ROOT / "book" / f"{chapter}.ipynb", as_version=4)
    offered = nbformat.read(STUDENT / "_sources" / "book" / f"{chapter}.ipynb", as_version=4)
    expected = strip_solutions(source, name=f"{chapter}.ipynb")
    assert [(c.cell_type, c.source) for c in offered.cells] == [(c.cell_type, c.source) for c in expected.cells]
    assert not editions.has_solutions(offered)
    page = (STUDENT / "book" / f"{chapter}.html").read_text()
    assert f'href="../_sources/book/{chapter}.ipynb"' in page, "the page offers its notebook"
    kept = nbformat.read(INSTRUCTOR / "_sources" / "book" / f"{chapter}.ipynb", as_version=4)
    assert [c.source for c in kept.cells] == [c.source for c in source.cells]


# --------------------------------------------------------------------------------------------------
# The search index: no word that only a solution uses
# --------------------------------------------------------------------------------------------------
@functools.cache
def _language():
    from sphinx.search.en import SearchEnglish

    return SearchEnglish({})


def _terms(text: str) -> set[str]:
    """The terms Sphinx's English index files ``text`` under (``IndexBuilder.feed``)."""
    lang, found = _language(), set()
    for word in lang.split(text):
        term = lang.stem(word).lower()
        if not lang.word_filter(term) and lang.word_filter(word):
            term = word
        if lang.word_filter(term):
            found.add(term)
    return found


@functools.cache
def _library_terms() -> set[str]:
    return _terms("\n".join(p.read_text() for p in sorted((ROOT / "attnbook").rglob("*.py"))))


@functools.cache
def _index(site: Path) -> dict[str, set[str]]:
    """docname -> the terms (and title terms) the site's ``searchindex.js`` files under it."""
    text = (site / "searchindex.js").read_text()
    data = json.loads(text[text.index("(") + 1:text.rindex(")")])
    terms: dict[str, set[str]] = {}
    for key in ("terms", "titleterms"):
        for term, docs in data[key].items():
            for doc in [docs] if isinstance(docs, int) else docs:
                terms.setdefault(data["docnames"][doc], set()).add(term)
    return terms


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_the_search_index_has_no_word_only_a_solution_uses(chapter):
    nb = nbformat.read(ROOT / "book" / f"{chapter}.ipynb", as_version=4)
    if not (EXECUTED / f"{chapter}.ipynb").exists():
        pytest.fail(f"{EXECUTED} has no {chapter}.ipynb: run `make book`")
    executed = nbformat.read(EXECUTED / f"{chapter}.ipynb", as_version=4)
    cached = record_outputs.executed_notebook(ROOT / "book" / f"{chapter}.ipynb")
    if cached is not None:  # jupyter-book writes a chapter it took from its cache without outputs
        executed = nbformat.from_dict(cached)
    outputs = [_output_text(c) for c in executed.cells
               if c.cell_type == "code" and "solution" not in c.metadata.get("tags", [])]
    # what the page shows besides the cells' sources: their outputs, and the figures' captions and
    # alt text (myst-nb reads them from the cells' metadata)
    figures = [json.dumps(c.metadata.get("mystnb", {})) for c in nb.cells]
    elsewhere = _terms("\n".join([c.source for c in strip_solutions(nb).cells] + outputs + figures))
    elsewhere |= _library_terms()
    only = _terms("\n".join("\n".join(body) for _, _, body in _solutions(nb))) - elsewhere
    assert only, f"{chapter}: every word of its solutions is used elsewhere too; nothing to check"
    doc = f"book/{chapter}"
    assert not only & _index(STUDENT)[doc], f"{chapter}: solution words in the student search index"
    assert only <= _index(INSTRUCTOR)[doc], f"{chapter}: not indexed for instructors: {only - _index(INSTRUCTOR)[doc]}"


# --------------------------------------------------------------------------------------------------
# Colab: the student edition's buttons open the student branch, which holds the student notebooks
# --------------------------------------------------------------------------------------------------
def _colab_links(site: Path, chapter: str) -> list[str]:
    return re.findall(r'href="(https://colab\.research\.google\.com/[^"]+)"',
                      (site / "book" / f"{chapter}.html").read_text())


@pytest.fixture(scope="module")
def student_branch(tmp_path_factory):
    """The tree `make student-branch` writes and pages.yml pushes to the student branch."""
    out = tmp_path_factory.mktemp("student-branch") / "tree"
    editions.student_branch(out)
    return out


@pytest.mark.parametrize("chapter", CHAPTERS + PAGES)
def test_colab_buttons_open_the_student_notebook(student_branch, chapter):
    repo = CONFIG["repository"]["url"].removeprefix("https://github.com/")
    prefix = f"https://colab.research.google.com/github/{repo}/blob/"
    links = _colab_links(STUDENT, chapter)
    assert links == [f"{prefix}{BRANCH}/book/{chapter}.ipynb"], links
    path = links[0].removeprefix(f"{prefix}{BRANCH}/")
    opened = nbformat.read(student_branch / path, as_version=4)
    source = nbformat.read(ROOT / "book" / f"{chapter}.ipynb", as_version=4)
    assert [c.source for c in opened.cells] == [c.source for c in strip_solutions(source).cells]
    assert not editions.has_solutions(opened) and STUB in "\n".join(c.source for c in opened.cells)
    assert _colab_links(INSTRUCTOR, chapter) == [f"{prefix}{CONFIG['repository']['branch']}/book/{chapter}.ipynb"]


def test_the_student_branch_holds_the_chapters_and_the_students_readme(student_branch):
    assert sorted(p.relative_to(student_branch).as_posix() for p in student_branch.rglob("*") if p.is_file()) \
        == sorted([*(f"book/{c}.ipynb" for c in CHAPTERS + PAGES), "README.md"])
    assert "raise NotImplementedError" in (student_branch / "README.md").read_text()


# --------------------------------------------------------------------------------------------------
# The extension's parts, the Makefile and the workflows
# --------------------------------------------------------------------------------------------------
def test_strip_sources_rewrites_only_what_holds_a_solution(tmp_path):
    nb = nbformat.read(NOTEBOOKS[0], as_version=4)
    nbformat.write(nb, tmp_path / "chapter.ipynb")
    nbformat.write(strip_solutions(nb), tmp_path / "done.ipynb")
    (tmp_path / "page.md").write_text("# Page\n\n:::{solution} x\nThe answer.\n:::\n\nAfter.\n")
    (tmp_path / "guide.md").write_text("Markers: `### BEGIN SOLUTION`; `{solution}` directives.\n")
    assert editions.strip_sources(tmp_path) == [tmp_path / "chapter.ipynb", tmp_path / "page.md"]
    assert not editions.has_solutions(nbformat.read(tmp_path / "chapter.ipynb", as_version=4))
    assert (tmp_path / "page.md").read_text() == "# Page\n\nAfter.\n"
    assert editions.strip_sources(tmp_path) == [], "a second pass changes nothing"


def test_a_cell_the_course_kit_refuses_is_shown_as_the_bare_stub():
    """strip_solutions refuses a cell tagged solution without markers; the student edition shows
    the stub alone and the build warns (an error under -W)."""
    unmarked = nbformat.v4.new_code_cell("answer = 6 * 7", metadata={"tags": ["solution", "hide-input"]})
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A"), unmarked])
    student, problems = editions.student_notebook(nb, "x.ipynb")
    assert student.cells[1].source == STUB and "answer" not in student.cells[1].source
    assert len(problems) == 1 and problems[0].startswith("x.ipynb, cell 1") and "tagged 'solution'" in problems[0]
    assert editions.has_solutions(nb) and not editions.has_solutions(student)
    answer = "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n"
    assert editions.student_code(answer, ["solution"], "p, code cell 3") == (f"def f():\n    {STUB}\n", [])
    stub, problems = editions.student_code(answer.replace("    ### END SOLUTION\n", ""), [], "p, code cell 3")
    assert stub == STUB and problems[0].startswith("p, code cell 3") and "BEGIN SOLUTION has no" in problems[0]


def test_the_instructor_edition_is_never_built_where_the_public_site_is(tmp_path):
    from sphinx.errors import ConfigError, ExtensionError

    def app(edition, outdir):
        config = SimpleNamespace(attnbook_edition=edition)
        return SimpleNamespace(config=config, srcdir=str(tmp_path), outdir=str(outdir),
                               builder=SimpleNamespace(format="html"))

    with pytest.raises(ExtensionError, match="make book-instructor"):
        editions._check_outdir(app("instructor", tmp_path / "_build" / "html"))
    editions._check_outdir(app("instructor", tmp_path / "_build" / "instructor" / "html"))
    editions._check_outdir(app("student", tmp_path / "_build" / "html"))
    with pytest.raises(ConfigError):
        editions._check_outdir(app("teacher", tmp_path / "elsewhere"))


def test_make_test_builds_both_editions_and_the_instructor_one_reads_nothing_again():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test: book book-instructor$", makefile, re.M)
    recipe = re.search(r"^book-instructor: book\n((?:\t.*\n)+)", makefile, re.M)[1]
    assert "_ext/editions.py build instructor" in recipe and "jupyter-book" not in recipe
    # the same Sphinx environment as `make book`, hence nothing read or executed again
    assert 'doctreedir=str(root / "_build" / ".doctrees")' in (ROOT / "_ext" / "editions.py").read_text()
    assert CONFIG["sphinx"]["local_extensions"] == {"editions": "_ext"}


def _workflow(name: str) -> dict:
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
    flow["on"] = flow.pop(True, flow.get("on"))
    return flow


def test_pages_deploys_the_student_edition_after_pushing_the_student_branch():
    flow = _workflow("pages.yml")
    build = flow["jobs"]["build"]["steps"]
    upload = next(s for s in build if s.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert upload["with"]["path"] == "_build/html"
    runs = "\n".join(s.get("run", "") for s in build)
    assert "make book" in runs and "make student-branch" in runs
    push = flow["jobs"]["student-branch"]
    assert push["permissions"] == {"contents": "write"} and push["needs"] == "build"
    script = "\n".join(s.get("run", "") for s in push["steps"])
    assert f"git init -q -b {BRANCH}" in script and f"HEAD:refs/heads/{BRANCH}" in script
    assert set(flow["jobs"]["deploy"]["needs"]) == {"build", "student-branch"}


def test_no_workflow_publishes_the_instructor_edition():
    """Pages deploys _build/html; a release attaches dist/* for anyone to download; the instructor
    edition is only kept, encrypted, as a release run's artifact."""
    uploads = []
    for path in sorted((ROOT / ".github" / "workflows").glob("*.yml")):
        for job in _workflow(path.name)["jobs"].values():
            for step in job["steps"]:
                assert "ATTNBOOK_EDITION" not in json.dumps(step), f"{path.name} picks an edition"
                if step.get("uses", "").startswith(("actions/upload-", "actions/deploy-")):
                    uploads.append((path.name, step))
    instructor = [(name, step) for name, step in uploads if "instructor" in json.dumps(step)]
    assert [name for name, _ in instructor] == ["release.yml"], instructor
    step = instructor[0][1]
    assert step["with"]["path"].endswith(".zip.gpg") and "encrypted" in step["if"]
    steps = _workflow("release.yml")["jobs"]["release"]["steps"]
    runs = "\n".join(s.get("run", "") for s in steps)
    assert "gh release create" in runs and "dist/*" in runs
    assert not re.search(r"instructor\S*\s+dist/|dist/\S*instructor", runs), "the release is public"
    keep = next(s for s in steps if s.get("id") == "instructor")
    assert "--symmetric" in keep["run"] and "secrets.INSTRUCTOR_EDITION_PASSPHRASE" in keep["env"]["PASSPHRASE"]
    assert "_build/instructor" in keep["run"], "it zips what make test built"
