"""Two editions of the website from one source (issue 44).

- **student** (the default, and what ``make book`` builds into ``_build/html``, the site
  the publishing workflow deploys): every exercise, no solution. After the chapters have
  run in full (later cells and the checked outputs use the answers), each cell tagged
  ``solution`` (or holding ``### BEGIN SOLUTION``) shows what the course kit's
  ``strip_solutions`` leaves of it, the signature and ``raise NotImplementedError``, not
  collapsed and without its outputs; every ``{solution}`` directive is dropped; and the
  sources the site offers for download (``_sources/``) are the student notebooks. The
  solutions are taken out of the resolved doctree, which is what Sphinx writes both the
  pages and the search index from, so they are absent, not hidden.
- **instructor**: the book as written, every solution included (collapsed until
  clicked), with a banner on every page. ``make book-instructor`` writes it into
  ``_build/instructor/html``, never into ``_build/html``.

The edition is the Sphinx setting ``attnbook_edition``, by default the environment
variable ``ATTNBOOK_EDITION`` or ``student``. Nothing is removed before the doctrees are
pickled, so both editions share one Sphinx environment (``_build/.doctrees``) and the
execution cache: the instructor build after a student build reads and executes nothing,
only Sphinx's write phase runs again (``python _ext/editions.py build instructor``).

The student edition's Colab buttons open the student notebooks: they point at the branch
``attnbook_student_branch`` (``student``), which the publishing workflow fills with
``make student-branch`` (``book/<chapter>.ipynb`` with the solutions stripped, and the
students' README).

Registered in ``_config.yml`` under ``sphinx.local_extensions``. As a script:
``python _ext/editions.py build EDITION [OUTDIR]`` and
``python _ext/editions.py student-branch OUTDIR``.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

EDITIONS = ("student", "instructor")
ROOT = Path(__file__).resolve().parents[1]
PUBLIC_HTML = Path("_build") / "html"  # what `make book` builds and Pages deploys
INSTRUCTOR_HTML = Path("_build") / "instructor" / "html"
BANNER = (
    "Instructor edition: every exercise's solution is on these pages. Keep it to "
    "instructors; the public site is the student edition."
)
BEGIN = "### BEGIN SOLUTION"
HIDDEN = "hidden-tests"  # a check cell only the graders run (attnbook.course.notebooks)
# The opening line of a written solution: ```{solution} label  or  :::{solution} label
SOLUTION_OPEN = re.compile(r"^\s*(`{3,}|:{3,})\s*\{solution\}", re.MULTILINE)


# --------------------------------------------------------------------------------------
# What the student edition keeps of a notebook
# --------------------------------------------------------------------------------------
def _strip_solutions():
    from attnbook.course.notebooks import strip_solutions

    return strip_solutions


def _marked(source: str) -> bool:
    return any(line.strip() == BEGIN for line in source.split("\n"))


def has_solutions(nb) -> bool:
    """Whether notebook ``nb`` still holds a solution: a code cell with a ``### BEGIN
    SOLUTION`` line, a cell tagged ``solution`` that is not a stub, a hidden test, or a
    markdown cell with a ``{solution}`` directive."""
    from attnbook.course.notebooks import STUB

    for cell in nb.cells:
        if cell.cell_type == "code":
            tags = cell.get("metadata", {}).get("tags", [])
            tagged = "solution" in tags
            if HIDDEN in tags:
                return True
            if _marked(cell.source) or (tagged and STUB not in cell.source):
                return True
        elif cell.cell_type == "markdown" and SOLUTION_OPEN.search(cell.source):
            return True
    return False


def student_notebook(nb, name: str = "notebook"):
    """``(student, problems)``: what the student edition offers of notebook ``nb``,
    ``strip_solutions(nb)``, where a code cell it refuses (tagged ``solution`` without
    markers, or with unbalanced ones) is shown as the bare stub instead, each refusal
    in ``problems``."""
    import copy

    import nbformat

    nb, problems = copy.deepcopy(nb), []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or HIDDEN in cell.get("metadata", {}).get("tags", []):
            continue  # a hidden test is checked beside its public check, and dropped
        alone = nbformat.v4.new_notebook(cells=[copy.deepcopy(cell)])
        try:
            _strip_solutions()(alone, name=name)
        except ValueError as err:
            where = f"{name}, cell {index}"
            problems.append(str(err).replace(f"{name}, cell 0", where))
            cell.source = f"{BEGIN}\n### END SOLUTION"  # what is left: the stub alone
    return _strip_solutions()(nb, name=name), problems


def student_code(source: str, tags, where: str) -> tuple[str, list[str]]:
    """``(stub, problems)``: the student version of one code cell's ``source``, what
    ``strip_solutions`` leaves (the solution blocks become ``raise
    NotImplementedError(...)``), and what was wrong with the cell."""
    import nbformat

    cell = nbformat.v4.new_code_cell(source, metadata={"tags": list(tags)})
    student, problems = student_notebook(nbformat.v4.new_notebook(cells=[cell]), where)
    problems = [problem.replace(f"{where}, cell 0", where) for problem in problems]
    return student.cells[0].source, problems


def student_markdown(text: str, where: str) -> str:
    """``text`` (a markdown page) without its ``{solution}`` directives."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(text)])
    cells = _strip_solutions()(nb, name=where).cells
    return (cells[0].source + "\n") if cells else ""


# --------------------------------------------------------------------------------------
# The Sphinx extension
# --------------------------------------------------------------------------------------
def _edition(config) -> str:
    edition = config.attnbook_edition
    if edition not in EDITIONS:
        from sphinx.errors import ConfigError

        raise ConfigError(
            f"attnbook_edition (or ATTNBOOK_EDITION) is {edition!r}: one of {EDITIONS}"
        )
    return edition


def _configure(app, config) -> None:
    """The student edition's launch buttons open the student branch; the instructor
    edition says what it is on every page."""
    options = dict(config.html_theme_options or {})
    if _edition(config) == "student":
        options["repository_branch"] = config.attnbook_student_branch
    else:
        if not options.get("announcement"):  # jupyter-book's default is ""
            options["announcement"] = BANNER
    config.html_theme_options = options


def _check_outdir(app) -> None:
    """The instructor edition is never written where the public site is built."""
    if _edition(app.config) == "instructor" and app.builder.format == "html":
        public = (Path(app.srcdir) / PUBLIC_HTML).resolve()
        if Path(app.outdir).resolve() == public:
            from sphinx.errors import ExtensionError

            raise ExtensionError(
                f"the instructor edition (every solution) is not built into {public}, "
                "the public site: run `make book-instructor` (it writes "
                f"{INSTRUCTOR_HTML})"
            )


def _drop_solutions(app, doctree, docname: str) -> None:
    """Student edition: stub the solution cells and drop the written solutions and the
    hidden tests of the resolved doctree that Sphinx writes the page and the search
    index from."""
    from docutils import nodes
    from sphinx.util import logging
    from sphinx_exercise.nodes import solution_node

    logger = logging.getLogger(__name__)
    for node in list(doctree.findall(solution_node)):
        node.parent.remove(node)
    cells = [
        node
        for node in doctree.findall(nodes.container)
        if node.get("nb_element") == "cell_code"
    ]
    for number, cell in enumerate(cells):
        literal = next(
            (
                block
                for child in cell.children
                if child.get("nb_element") == "cell_code_source"
                for block in child.findall(nodes.literal_block)
            ),
            None,
        )
        metadata = cell.get("cell_metadata") or {}
        tags = list(metadata.get("tags", [])) if isinstance(metadata, dict) else []
        if HIDDEN in tags or f"tag_{HIDDEN}" in cell["classes"]:
            cell.parent.remove(cell)  # a hidden test: not even its label is shown
            continue
        text = literal.astext() if literal is not None else ""
        marked = any(line.strip() == BEGIN for line in text.split("\n"))
        if not (marked or "solution" in tags or "tag_solution" in cell["classes"]):
            continue
        stub, problems = student_code(text, tags, f"{docname}, code cell {number + 1}")
        for problem in problems:  # the cell shows the bare stub
            logger.warning(f"{problem}: the page shows the stub", location=cell)
        if literal is not None:
            literal.rawsource = stub
            literal[:] = [nodes.Text(stub)]
        for child in list(cell.children):  # outputs cleared, as in strip_solutions
            if child.get("nb_element") == "cell_code_output":
                cell.remove(child)
        cell["classes"] = [c for c in cell["classes"] if not c.startswith("tag_hide-")]
        cell.attributes.pop("hide_mode", None)


def _post_transform():
    from sphinx.transforms.post_transforms import SphinxPostTransform

    class DropSolutions(SphinxPostTransform):
        """Runs before myst-nb's ``HideInputCells`` (199) would collapse the stubs."""

        default_priority = 150

        def run(self, **kwargs) -> None:
            if _edition(self.config) == "student":
                _drop_solutions(self.app, self.document, self.env.docname)

    return DropSolutions


def _page_context(app, pagename, templatename, context, doctree) -> None:
    """Each page says which edition it belongs to (the tests read it)."""
    tag = f'<meta name="attnbook-edition" content="{_edition(app.config)}" />\n'
    context["metatags"] = context.get("metatags", "") + tag


def strip_sources(sources: Path, problems: list[str] | None = None) -> list[Path]:
    """Rewrite each file under ``sources`` (a build's ``_sources``) that holds a
    solution as the student sees it: notebooks as ``student_notebook`` gives them (what
    went wrong is appended to ``problems``), markdown pages without their
    ``{solution}`` directives. Returns the files rewritten."""
    import nbformat

    rewritten = []
    for path in sorted(p for p in sources.rglob("*") if p.is_file()):
        if path.suffix == ".ipynb":
            nb = nbformat.read(path, as_version=4)
            if has_solutions(nb):
                student, found = student_notebook(nb, name=str(path))
                nbformat.write(student, path)
                rewritten.append(path)
                if problems is not None:
                    problems += found
        elif path.suffix in (".md", ".txt", ".rst"):
            text = path.read_text(encoding="utf-8")
            if SOLUTION_OPEN.search(text):
                path.write_text(student_markdown(text, path.name), encoding="utf-8")
                rewritten.append(path)
    return rewritten


def _strip_downloads(app, exception) -> None:
    """Student edition: the notebooks and pages offered for download (``_sources/``,
    copies of the sources) lose their solutions too."""
    if _edition(app.config) != "student" or app.builder.format != "html":
        return
    from sphinx.util import logging

    sources, problems = Path(app.outdir) / "_sources", []
    if sources.is_dir():
        strip_sources(sources, problems)
    for problem in problems:  # the download shows the bare stub
        logging.getLogger(__name__).warning(f"{problem}: _sources/ has the stub")


def setup(app):
    default = os.environ.get("ATTNBOOK_EDITION", "student")
    # "html": switching editions rewrites every page but reads nothing again, so both
    # editions share one environment and one execution cache.
    app.add_config_value("attnbook_edition", default, "html", types=[str])
    app.add_config_value("attnbook_student_branch", "student", "html", types=[str])
    app.connect("config-inited", _configure)
    app.connect("builder-inited", _check_outdir)
    app.add_post_transform(_post_transform())
    app.connect("html-page-context", _page_context)
    app.connect("build-finished", _strip_downloads)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}


# --------------------------------------------------------------------------------------
# As a script: the instructor build, and the student branch
# --------------------------------------------------------------------------------------
def build(edition: str, outdir: Path, root: Path = ROOT) -> int:
    """Build ``edition`` of the book at ``root`` into ``outdir`` with the settings of
    ``make book`` (``jupyter-book build . --builder html -W -n --keep-going``) and its
    environment (``_build/.doctrees``), hence its execution cache: after ``make book``
    nothing is read or executed again. Returns Sphinx's status (0 on success)."""
    from jupyter_book.sphinx import build_sphinx

    root = Path(root).absolute()
    os.environ["ATTNBOOK_EDITION"] = edition
    overrides = {  # what jupyter-book's command line passes for `build . -n`
        "external_toc_path": (root / "_toc.yml").as_posix(),
        "latex_individualpages": False,
        "nitpicky": True,
        "attnbook_edition": edition,
    }
    result = build_sphinx(
        root,
        Path(outdir).absolute(),
        noconfig=True,
        path_config=str(root / "_config.yml"),
        confoverrides=overrides,
        doctreedir=str(root / "_build" / ".doctrees"),
        builder="html",
        warningiserror=True,
        keep_going=True,
    )
    if isinstance(result, Exception):
        return 1
    return int(result or 0)


def student_branch(out: Path, book: Path = ROOT / "book") -> list[Path]:
    """Write the tree of the student branch into ``out`` (emptied first): every chapter
    at ``book/<chapter>.ipynb``, its question page at ``book/questions/<chapter>.ipynb``
    and the projects at ``book/projects/<project>.ipynb``, the paths the Colab buttons
    open, with the solutions and hidden tests stripped (``make_student_bundle``), and
    the students' README at the top. Returns the notebooks, then the README."""
    from attnbook.course.notebooks import make_student_bundle

    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    *notebooks, readme = make_student_bundle(book, out / "book")
    readme.replace(out / "README.md")
    for part in ("questions", "projects"):  # at book/questions/<chapter>, ...
        if (book / part).is_dir():
            *pages, other = make_student_bundle(book / part, out / "book" / part)
            other.unlink()
            notebooks += pages
    return [*notebooks, out / "README.md"]


def main(argv: list[str]) -> int:
    usage = (
        "usage: editions.py build {student,instructor} [OUTDIR]\n"
        "       editions.py student-branch OUTDIR"
    )
    if argv[:1] == ["build"] and len(argv) in (2, 3) and argv[1] in EDITIONS:
        default = PUBLIC_HTML if argv[1] == "student" else INSTRUCTOR_HTML
        outdir = Path(argv[2]) if len(argv) == 3 else ROOT / default
        return build(argv[1], outdir)
    if len(argv) == 2 and argv[0] == "student-branch":
        written = student_branch(Path(argv[1]))
        print(f"{argv[1]}: {len(written) - 1} student notebooks in book/, README.md")
        return 0
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
