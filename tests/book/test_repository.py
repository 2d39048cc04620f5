"""The repository keeps its promises: layout, one list of dependencies, notebooks wired into the book."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

import attnbook

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
PAGES = sorted((ROOT / "book").glob("questions/*.ipynb"))  # the question pages (tools/questions.py)
PROJECTS = sorted((ROOT / "book").glob("projects/*.ipynb"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _toc_files(entries) -> list[str]:
    files = []
    for entry in entries or []:
        if "file" in entry:
            files.append(entry["file"])
        for key in ("chapters", "sections", "parts"):
            files += _toc_files(entry.get(key))
    return files


def test_top_level_layout():
    for name in ["README.md", "environment.yml", "pyproject.toml", "Makefile", "_config.yml", "_toc.yml",
                 "references.bib", "intro.md", "CHANGELOG.md", "book", "attnbook", "tests", "benchmarks", "tools/release.py", ".ci/run"]:
        assert (ROOT / name).exists(), f"{name} is missing from the top level"


def test_there_are_chapters():
    assert len(NOTEBOOKS) >= 2, f"expected the chapter notebooks in book/, found {NOTEBOOKS}"


def test_every_notebook_is_in_the_toc():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    listed = set(_toc_files(toc.get("parts")) + _toc_files(toc.get("chapters")))
    for nb in NOTEBOOKS:
        assert f"book/{nb.stem}" in listed, f"{nb.name} is not listed in _toc.yml"
    for entry in listed:
        assert any((ROOT / f"{entry}{ext}").exists() for ext in (".ipynb", ".md")), f"_toc.yml lists missing {entry}"


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_starts_with_the_install_cell(nb_path):
    nb = json.loads(nb_path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    first = "".join(code[0]["source"])
    url = CONFIG["repository"]["url"]
    assert "import attnbook" in first and "except ImportError" in first, "first code cell must be the install cell"
    pinned = re.search(r"git\+(\S+?)@([\w.\-]+)\"", first)
    assert pinned, "the install cell must pip-install attnbook from the repository (git+URL@ref)"
    assert pinned.group(1) == url, f"install URL {pinned.group(1)} differs from _config.yml's {url}"
    release = f"v{attnbook.__version__}"
    assert pinned.group(2) == release, (
        f"the install cell installs @{pinned.group(2)}; pin it to the release tag {release} (make release VERSION=...)"
    )
    setup = "".join(code[1]["source"])
    assert "seed_everything" in setup and "default_device" in setup, "second code cell: imports, seed, device"


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs(nb_path):
    nb = json.loads(nb_path.read_text())
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert not cell.get("outputs") and cell.get("execution_count") is None, f"cell {i} has outputs"


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_exercises_with_checks(nb_path):
    nb = json.loads(nb_path.read_text())
    text = "\n".join("".join(c["source"]) for c in nb["cells"])
    exercises = re.findall(r"```\{exercise\}", text)
    assert len(exercises) >= 3, f"{nb_path.name} has {len(exercises)} exercises, needs at least 3"
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if "### BEGIN SOLUTION" in src:
            tags = cell.get("metadata", {}).get("tags", [])
            assert {"solution", "hide-input"} <= set(tags), f"solution cell without solution/hide-input tags: {src[:60]}"
            assert src.count("### BEGIN SOLUTION") == src.count("### END SOLUTION")
    labels = re.findall(r":label: (\S+)", text)
    for label in re.findall(r"exercises\.check\(\"([^\"]+)\"", text):
        assert label in labels, f"check label {label} has no exercise with that :label:"


def test_notebooks_define_no_subject_functions_outside_exercises():
    """The triangle: chapters import attention code from attnbook instead of redefining it."""
    for nb_path in NOTEBOOKS:
        nb = json.loads(nb_path.read_text())
        for cell in nb["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] != "code" or "### BEGIN SOLUTION" in src:
                continue
            for name in re.findall(r"^def (\w+)", src, flags=re.M):
                assert "attention" not in name and "softmax" not in name, (
                    f"{nb_path.name} defines {name}(): subject code belongs in attnbook"
                )


# Extras a reader adds by hand: `bench` brings Hugging Face transformers for one comparison in
# benchmarks/bench_decode.py, which the book's build and tests never need.
OPTIONAL_EXTRAS = {"bench"}


def test_environment_yml_installs_the_pyproject_extras():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_entries = [d for d in env["dependencies"] if isinstance(d, dict)][0]["pip"]
    assert len(pip_entries) == 1, "environment.yml must not carry a second list of packages"
    extras = re.fullmatch(r"-e \.\[(.+)\]", pip_entries[0])
    assert extras, f"environment.yml should install '-e .[extras]', got {pip_entries[0]}"
    declared = set(PYPROJECT["project"]["optional-dependencies"]) - OPTIONAL_EXTRAS
    assert set(extras.group(1).split(",")) == declared, "environment.yml must install every pyproject extra"
    conda_only = [d for d in env["dependencies"] if isinstance(d, str)]
    assert all(re.fullmatch(r"python(=[\d.]+)?|pip", d) for d in conda_only), conda_only
    python = next(d for d in conda_only if d.startswith("python"))
    minimum = PYPROJECT["project"]["requires-python"].removeprefix(">=")
    assert tuple(map(int, python.split("=")[1].split("."))) >= tuple(map(int, minimum.split(".")))


def test_makefile_installs_the_same_extras_and_pins_torch_first():
    makefile = (ROOT / "Makefile").read_text()
    extras = re.search(r'-e "\.\[(.+?)\]"', makefile).group(1)
    assert set(extras.split(",")) == set(PYPROJECT["project"]["optional-dependencies"]) - OPTIONAL_EXTRAS
    torch_line = makefile.index("torch==$(TORCH_VERSION)")
    assert torch_line < makefile.index('-e ".['), "the pinned torch must be installed before attnbook"


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci/run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in ci and "make test" in readme and "make book" in readme
    assert readme.index("make book") < 1200, "the two commands belong at the top of the README"


def test_runtime_dependencies_stay_small():
    deps = {re.split(r"[<>=!\[ ]", d)[0] for d in PYPROJECT["project"]["dependencies"]}
    assert deps == {"torch", "numpy", "matplotlib", "seaborn", "ipywidgets", "tqdm"}
    assert PYPROJECT["project"]["requires-python"] == ">=3.10"
    book = " ".join(PYPROJECT["project"]["optional-dependencies"]["book"])
    assert "jupyter-book>=1.0,<2" in book


def test_config_sets_the_launch_buttons_and_execution():
    assert CONFIG["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    assert CONFIG["repository"]["branch"] == "main"
    assert CONFIG["html"]["use_repository_button"] and CONFIG["html"]["use_issues_button"]
    assert CONFIG["execute"]["execute_notebooks"] == "cache" and CONFIG["execute"]["timeout"] > 0
    assert "sphinx_exercise" in CONFIG["sphinx"]["extra_extensions"]


def test_every_cited_key_exists_in_references_bib():
    bib_keys = set(re.findall(r"@\w+\{([^,]+),", (ROOT / "references.bib").read_text()))
    sources = [ROOT / "intro.md", *NOTEBOOKS, *(ROOT / "book").glob("*.md")]
    for path in sources:
        for group in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", path.read_text()):
            for key in group.split(","):
                assert key.strip() in bib_keys, f"{path.name} cites unknown key {key!r}"


def test_version_is_exposed_and_in_the_changelog():
    assert re.fullmatch(r"\d+\.\d+\.\d+", attnbook.__version__)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", changelog, flags=re.M)
    assert releases, "CHANGELOG.md has no '## [X.Y.Z] - YYYY-MM-DD' release section"
    assert releases[0][0] == attnbook.__version__, (
        f"the newest CHANGELOG release is {releases[0][0]}, attnbook.__version__ is {attnbook.__version__}"
    )
    assert "## [Unreleased]" in changelog.split(f"## [{releases[0][0]}]")[0], "keep an [Unreleased] section on top"


def _release_module():
    from scripts import load_script

    return load_script(ROOT / "tools" / "release.py")


def _copy_for_release(tmp_path):
    import shutil

    shutil.copytree(ROOT / "book", tmp_path / "book", ignore=shutil.ignore_patterns("*.md"))
    (tmp_path / "attnbook").mkdir()
    shutil.copy(ROOT / "attnbook" / "__init__.py", tmp_path / "attnbook" / "__init__.py")
    shutil.copy(ROOT / "CHANGELOG.md", tmp_path / "CHANGELOG.md")
    shutil.copy(ROOT / "_config.yml", tmp_path / "_config.yml")
    return tmp_path


def test_release_script_pins_every_install_cell_and_the_version(tmp_path):
    release = _release_module()
    root = _copy_for_release(tmp_path)
    with pytest.raises(ValueError, match="CHANGELOG.md has no '## \\[9.8.7\\]' section"):
        release.release("9.8.7", root)
    with pytest.raises(ValueError, match="version must look like 1.2.3"):
        release.release("v9.8", root)
    changelog = root / "CHANGELOG.md"
    changelog.write_text(changelog.read_text().replace("## [Unreleased]", "## [Unreleased]\n\n## [9.8.7] - 2030-01-01"))
    changed = release.release("9.8.7", root)
    assert len(changed) == len(NOTEBOOKS) + len(PAGES) + len(PROJECTS) + 1
    assert '__version__ = "9.8.7"' in (root / "attnbook" / "__init__.py").read_text()
    book = root / "book"
    for path in [*sorted(book.glob("*.ipynb")), *sorted(book.glob("questions/*.ipynb")),
                 *sorted(book.glob("projects/*.ipynb"))]:
        nb = json.loads(path.read_text())
        first = "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])
        assert '@v9.8.7"' in first and "@v" + attnbook.__version__ + '"' not in first, path.name
        original = json.loads((ROOT / path.relative_to(root)).read_text())
        # every cell but the install cell (the first code cell) is left as it was
        others = lambda cells: [c["source"] for c in cells if c is not next(  # noqa: E731
            d for d in cells if d["cell_type"] == "code")]
        assert others(nb["cells"]) == others(original["cells"]), path.name
    assert release.release("9.8.7", root) == [], "a second run changes nothing"


def test_every_link_follows_the_one_repository_setting(tmp_path):
    """A fork changes repository.url in _config.yml and runs `make links`: every install cell, the
    project URL and the clone commands follow; on this repository everything already agrees."""
    import shutil

    release = _release_module()
    root = _copy_for_release(tmp_path)
    for name in release.LINKED + ["pyproject.toml"]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, root / name)
    assert release.point_links(root) == [], "a link disagrees with _config.yml: run `make links`"
    config = root / "_config.yml"
    config.write_text(config.read_text().replace(CONFIG["repository"]["url"], "https://github.com/someone/fork"))
    changed = {p.relative_to(root).as_posix() for p in release.point_links(root)}
    assert changed == {f"book/{p.name}" for p in NOTEBOOKS} | {f"book/questions/{p.name}" for p in PAGES} | {
        f"book/projects/{p.name}" for p in PROJECTS} | {"intro.md", "pyproject.toml", "book/course.md", "README.md"}
    everything = "".join((root / name).read_text() for name in changed)
    assert CONFIG["repository"]["url"] not in everything
    assert everything.count("someone/fork") >= len(NOTEBOOKS) + 3
    for path in NOTEBOOKS:
        first = "".join(next(c for c in json.loads((root / "book" / path.name).read_text())["cells"]
                             if c["cell_type"] == "code")["source"])
        assert release.install_url(first) == f"git+https://github.com/someone/fork@v{attnbook.__version__}"


def test_release_notes_are_the_changelog_section():
    release = _release_module()
    text = release.notes(attnbook.__version__)
    assert text and "## [" not in text
    assert text in (ROOT / "CHANGELOG.md").read_text()
    with pytest.raises(ValueError, match="no '## \\[0.0.0\\]' section"):
        release.notes("0.0.0")


def test_tracked_files_exclude_build_outputs():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    assert tracked, "the tests run from a git checkout of the book"
    assert not any(t.startswith(("_build/", ".venv/")) for t in tracked)


# ---------------------------------------------------------------------------------------------
# The instructor guide, the API reference and the GPU tiers page keep up with the chapters
# ---------------------------------------------------------------------------------------------
COURSE = (ROOT / "book" / "course.md").read_text()
# How grading works inside (the trust model, limits, the library table, grading times): its own page
GRADING = (ROOT / "book" / "grading.md").read_text()
EXERCISE = re.compile(r"`{3,}\{exercise\}\s*(.+?)\s*\(difficulty: ([★☆]+)\)\s*\n:label: (\S+)")


def _topic(nb_path) -> str:
    """A chapter's topic: its first label is ``(sec-<topic>)=``, and every label in it starts so."""
    first = "".join(json.loads(nb_path.read_text())["cells"][0]["source"])
    return re.match(r"\(sec-([a-z0-9-]+)\)=", first).group(1)


def _chapter_exercises(nb_path):
    nb = json.loads(nb_path.read_text())
    md = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    checked = set(re.findall(r"exercises\.check\(\"([^\"]+)\"", code))
    return [(label, stars, label in checked) for _, stars, label in EXERCISE.findall(md)]


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_course_guide_lists_the_chapters_exercises_as_they_are(nb_path):
    nn = _topic(nb_path)
    section = COURSE.split(f"(course-{nn})=")[1].split("(course-")[0]
    assert f"{{doc}}`Read the chapter <{nb_path.stem}>`" in section
    for needed in ["**Prerequisites.**", "**After this chapter a student can**", "**Study time:**", "**CPU run time:**"]:
        assert needed in section, f"course.md, chapter {nn}: {needed} is missing"
    rows = re.findall(r"^\| `(\S+)`: .+? \| ([★☆]+) \| (auto-check|written)", section, flags=re.M)
    expected = _chapter_exercises(nb_path)
    assert [(label, stars, kind == "auto-check") for label, stars, kind in rows] == expected, (
        f"course.md's exercise table for chapter {nn} differs from {nb_path.name}: regenerate it"
    )


def test_course_syllabus_assigns_every_auto_checked_exercise_and_names_only_real_ones():
    syllabus = COURSE.split("(course-syllabus)=")[1].split("(course-bundle)=")[0]
    weeks = re.findall(r"^\| (\d+) \|", syllabus, flags=re.M)
    assert weeks == [str(w) for w in range(1, 13)], "the syllabus has 12 weeks, in order"
    exercises = {label: auto for nb in NOTEBOOKS for label, _, auto in _chapter_exercises(nb)}
    named = set(re.findall(r"`([a-z]+-[\w-]+)`", syllabus))
    assert named <= set(exercises), f"the syllabus names exercises that do not exist: {named - set(exercises)}"
    assert {label for label, auto in exercises.items() if auto} <= named, "every auto-checked exercise is assigned"
    chapters_taught = set(re.findall(r"\{doc\}`(\w+)`", syllabus))
    assert chapters_taught == {nb.stem for nb in NOTEBOOKS}, "every chapter is taught in some week"
    # FlashAttention and the kernel lab, the hardest chapters, get a week each (issue 44)
    per_week = {w: re.findall(r"\{doc\}`(\w+)`", chapters)
                for w, chapters in re.findall(r"^\| (\d+) \| ([^|]*) \|", syllabus, flags=re.M)}
    assert ["flash"] in per_week.values() and ["kernel_lab"] in per_week.values(), per_week


# The guide is for deciding and teaching; how grading works inside is book/grading.md
INTERNALS = ["course-trust", "course-trust-kernels", "course-trust-library", "course-limits",
             "course-trust-graders", "course-grading-times"]


def test_instructor_guide_is_under_4000_words():
    words = len(COURSE.split())  # what `wc -w book/course.md` counts: code blocks and tables too
    assert words < 4000, f"book/course.md has {words} words: move what explains machinery to grading.md"


def test_grading_internals_have_their_own_page():
    labels = lambda text: re.findall(r"^\(([\w-]+)\)=$", text, flags=re.M)  # noqa: E731
    for label in INTERNALS:
        assert label in labels(GRADING), f"book/grading.md lacks ({label})="
        assert label not in labels(COURSE), f"({label})= is still in book/course.md"
    assert not set(labels(COURSE)) & set(labels(GRADING)), "a label is defined on both pages"
    toc = _toc_files(yaml.safe_load((ROOT / "_toc.yml").read_text()).get("parts"))
    assert toc.index("book/grading") == toc.index("book/course") + 1, "grading.md follows the guide in _toc.yml"
    # every {ref} to a course- label, anywhere in the book, finds it on one of the two pages
    defined = set(labels(COURSE)) | set(labels(GRADING))
    for path in [ROOT / "intro.md", *NOTEBOOKS, *(ROOT / "book").glob("*.md")]:
        for target in re.findall(r"\{ref\}`(?:[^`<]*<)?(course-[\w-]+)>?`", path.read_text()):
            assert target in defined, f"{path.name} refers to {target}, which neither page defines"
    # the guide links each grading route to how it works
    for section in ("grading-grader", "grading-nbgrader", "grading-otter"):
        assert f"({section})=" in GRADING and f"{{ref}}`{section}`" in COURSE, section


def test_grading_page_says_what_every_auto_check_compares():
    section = GRADING.split("(grading-checks)=")[1].split("\n(")[0]
    rows = re.findall(r"^\| `([a-z]+-[\w-]+)` \| ", section, flags=re.M)
    auto = [label for nb in NOTEBOOKS for label, _, checked in _chapter_exercises(nb) if checked]
    assert sorted(rows) == sorted(auto), "grading.md's table of checks differs from the chapters' auto-checks"


def _cli_commands() -> dict[str, set[str]]:
    """``python -m attnbook.course``'s subcommands and the options of each, read from cli.py's
    argparse calls (``x = commands.add_parser("name")``, then ``x.add_argument("--opt")``, options
    of a group ``g = x.add_mutually_exclusive_group()`` included)."""
    import ast

    tree = ast.parse((ROOT / "attnbook" / "course" / "cli.py").read_text())
    owner: dict[str, str] = {}  # variable -> subcommand
    options: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            call, target = node.value, node.targets[0]
            if isinstance(call.func, ast.Attribute) and isinstance(target, ast.Name):
                if call.func.attr == "add_parser":
                    owner[target.id] = call.args[0].value
                    options[call.args[0].value] = {"--help", "-h"}
                elif call.func.attr == "add_mutually_exclusive_group" and call.func.value.id in owner:
                    owner[target.id] = owner[call.func.value.id]
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
                and isinstance(node.func.value, ast.Name) and node.func.value.id in owner):
            options[owner[node.func.value.id]] |= {a.value for a in node.args if a.value.startswith("-")}
    return options


def _make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", (ROOT / "Makefile").read_text(), flags=re.M))


CODE_BLOCK = re.compile(r"^ *```[\w-]*\n(.*?)^ *```", flags=re.M | re.S)


def _shell_lines(page: str):
    """Every command line of a page's code blocks (continuations joined, a ``$ `` prompt dropped,
    the ``# comment`` after it returned apart), then every inline code span of its prose."""
    for block in CODE_BLOCK.findall(page):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            command, _, comment = line.partition("#") if not line.startswith("#") else ("", "", line)
            yield command.strip(), comment
    for span in re.findall(r"`([^`\n]+)`", CODE_BLOCK.sub("", page)):
        yield span.strip(), ""


def test_the_guides_commands_name_real_subcommands_and_make_targets():
    """The guide's commands are the ones the tests run: every ``python -m attnbook.course`` and
    ``make`` in its code blocks (their comments too) and inline code names a subcommand, options and
    targets that exist."""
    cli, targets = _cli_commands(), _make_targets()
    assert {"student", "nbgrader", "otter", "grade"} <= set(cli) and {"book", "student", "gpu-check"} <= targets
    shown = set()
    for page in (COURSE, GRADING):
        for command, comment in _shell_lines(page):
            for text in (command, comment):
                for call in re.findall(r"python -m attnbook\.course ([^;&|]*)", text):
                    sub, *args = call.split()
                    assert sub in cli, f"`python -m attnbook.course {sub}` is no subcommand of cli.py"
                    unknown = {a.split("=")[0] for a in args if a.startswith("-")} - cli[sub]
                    assert not unknown, f"`python -m attnbook.course {sub}` has no option {unknown}"
                    shown.add(sub)
            if command.startswith("make "):
                named = [w for w in command.split()[1:] if "=" not in w and not w.startswith("-")]
                missing = set(named) - targets
                assert named and not missing, f"`{command}`: the Makefile has no target {missing}"
    assert shown >= set(cli), f"the guide never shows `python -m attnbook.course {set(cli) - shown}`"


def test_api_reference_documents_every_public_module():
    api = (ROOT / "book" / "api.md").read_text()
    documented = set(re.findall(r"^\.\. automodule:: (attnbook[\w.]*)$", api, flags=re.M))
    # private modules (``_random``, ``kernels/_compat``) hold helpers, not reference: not listed
    moved = {"attnbook.grader", "attnbook.sandbox"}  # one-release aliases of the course kit's modules
    modules = {f"attnbook.{p.stem}" for p in (ROOT / "attnbook").glob("*.py") if not p.stem.startswith("_")} - moved
    modules |= {"attnbook.course"} | {f"attnbook.course.{p.stem}" for p in (ROOT / "attnbook" / "course").glob("*.py")
                                      if not p.stem.startswith("_")}
    # the checks' registry (its per-chapter submodules hold only the checks) and their library
    # policies, which the grader reads too
    modules |= {"attnbook.course.checks", "attnbook.course.checks.library"}
    modules |= {f"attnbook.kernels.{p.stem}" for p in (ROOT / "attnbook" / "kernels").glob("*.py")
                if not p.stem.startswith("_")}
    modules.add("attnbook.kernels")
    assert documented == modules, f"api.md misses {modules - documented}, or lists unknown {documented - modules}"


API_ROLE = re.compile(r"\{py:(func|class|mod|meth)\}`~?([^`<]+?)(?:\s*<([^>]+)>)?`")


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_links_the_api_reference_with_public_names(nb_path):
    import importlib

    nb = json.loads(nb_path.read_text())
    md = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    roles = API_ROLE.findall(md)
    assert len(roles) >= 4, f"{nb_path.name} links only {len(roles)} API names"
    assert re.search(r"\{ref\}`api-[\w-]+`", md), f"{nb_path.name} does not point to its module's API section"
    for kind, text, target in roles:
        name = (target or text).strip().lstrip("~")
        if kind == "mod":
            importlib.import_module(name)
            continue
        parts = name.split(".")
        for i in range(len(parts) - 1, 0, -1):
            try:
                module = importlib.import_module(".".join(parts[:i]))
                break
            except ImportError:
                continue
        assert parts[i] in module.__all__, f"{nb_path.name} links {name}, which is not public (api.md shows __all__)"
        obj = module
        for part in parts[i:]:
            obj = getattr(obj, part)
        assert obj.__doc__, f"{nb_path.name} links {name}, which has no docstring, so no API entry"


def test_gpu_tiers_page_covers_each_tier_and_says_what_is_unmeasured():
    page = (ROOT / "book" / "gpu_tiers.md").read_text()
    for tier in ["CPU", "T4", "L4", "A100", "H100"]:
        assert f"**{tier}" in page or f"**Colab {tier}" in page, f"gpu_tiers.md has no row for {tier}"
    assert "attnbook.kernels.support()" in page and "When a kernel does not run on your GPU" in page
    assert "not measured" in page.lower()


def _bib_authors_and_years() -> list[tuple[str, str]]:
    bib = (ROOT / "references.bib").read_text()
    found = []
    for body in re.findall(r"@\w+\{[^,]+,(.*?)\n\}", bib, flags=re.S):
        author = re.search(r"author\s*=\s*\{(.*?)\},?\n", body, flags=re.S)
        year = re.search(r"year\s*=\s*\{?(\d{4})", body)
        if author and year:
            plain = re.sub(r"\\[`'^\"~vcu]\{?(\w)\}?", r"\1", author.group(1)).replace("{", "").replace("}", "")
            found.append((plain, year.group(1)))
    return found


def test_every_paper_the_package_names_is_in_the_bibliography():
    """A docstring that says "Dao et al. (2022)" relies on that paper: the bibliography must list it."""
    entries = _bib_authors_and_years()
    cited = re.compile(r"\b([A-Z][a-zA-Z\-]+)(?: et al\.?| (?:&|and) [A-Z][a-zA-Z\-]+)?,? \(?((?:19|20)\d\d)\b")
    not_papers = {"Table", "Figure", "Eq", "Section", "Llama", "Mistral", "GPT", "In", "The", "See"}
    missing = set()
    for path in sorted((ROOT / "attnbook").rglob("*.py")):
        for name, year in cited.findall(path.read_text()):
            if name not in not_papers and not any(name in authors and y == year for authors, y in entries):
                missing.add(f"{path.name}: {name} ({year})")
    assert not missing, f"papers named in attnbook but missing from references.bib: {sorted(missing)}"


def test_package_lines_fit_the_page():
    """The package's source is shown in the chapters and on the API's [source] pages: every
    line fits in 88 columns (pyproject.toml's ruff line-length), so none scrolls sideways."""
    long = [f"{path.relative_to(ROOT)}:{number}"
            for path in sorted((ROOT / "attnbook").rglob("*.py"))
            for number, line in enumerate(path.read_text().splitlines(), 1) if len(line) > 88]
    assert not long, f"{len(long)} package lines are longer than 88 characters: {long[:10]}"


# Text that points at documents a reader never sees: the book cites papers instead.
UNSEEN_SOURCES = re.compile(
    r"\b(source|lecture|interview|course) notes\b|\b(the|of the|in the) notes\b|\bnotes'"
    r"|\bseeds? ?0\d\d\b|\bseeds/|\bsource material\b|\beq\. ?\d+"
    r"|\b(their|its) (figure|equation|eq\.|table) ?\d+",
    flags=re.IGNORECASE,
)


def test_the_book_stands_alone():
    """No chapter, page, docstring or benchmark refers to source notes, seeds or their
    equation numbers: a reader cannot follow them."""
    texts = [*sorted((ROOT / "book").glob("*.ipynb")), *sorted((ROOT / "book").glob("*.md")),
             ROOT / "intro.md", ROOT / "README.md", *sorted((ROOT / "attnbook").rglob("*.py")),
             *sorted(p for p in (ROOT / "benchmarks").rglob("*") if p.is_file())]
    hits = []
    for path in texts:
        text = path.read_text()
        if path.suffix == ".ipynb":
            text = "\n".join("".join(cell["source"]) for cell in json.loads(text)["cells"])
        for match in UNSEEN_SOURCES.finditer(text):
            context = text[max(0, match.start() - 40):match.end() + 40].replace("\n", " ")
            hits.append(f"{path.relative_to(ROOT)}: ...{context}...")
    assert not hits, f"{len(hits)} references to material the reader never sees:\n" + "\n".join(hits)


def test_contributing_gives_the_three_recipes_and_names_only_files_that_exist():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    for recipe in ["## Recipe 1: an attention variant", "## Recipe 2: an exercise", "## Recipe 3: a kernel"]:
        assert recipe in text, recipe
    named = set(re.findall(r"`((?:attnbook|tests|benchmarks|tools|book)/[\w./]+?\.(?:py|md|json))`", text))
    assert len(named) > 20, named
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"CONTRIBUTING.md names files that do not exist: {missing}"
    layers = (ROOT / "pyproject.toml").read_text().split("\n[tool.importlinter]\n")[1].split("layers = [")[1].split("]")[0]
    for module in re.findall(r'"?attnbook\.(\w+)', layers):
        if module not in ("grader", "sandbox", "_random"):
            assert f"`{module}`" in text or f"`attnbook.{module}`" in text, f"CONTRIBUTING.md's layers miss {module}"


def test_pyproject_ships_every_package_of_attnbook():
    """setuptools installs the packages pyproject lists, no more: a subpackage missing there is
    missing from every install (and one listed that is gone fails the install)."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "attnbook").rglob("__init__.py")}
    assert listed == found, f"pyproject lists {sorted(listed)}, the tree has {sorted(found)}"


def test_the_intros_chapter_map_lists_every_chapter():
    intro = (ROOT / "intro.md").read_text()
    mapped = set(re.findall(r"^\| \{doc\}`book/(\w+)` \|", intro, flags=re.M))
    assert mapped == {nb.stem for nb in NOTEBOOKS}, f"the map misses {sorted({nb.stem for nb in NOTEBOOKS} - mapped)}"


def test_the_declared_torch_floor_has_what_the_package_calls():
    """The package calls SDPA with enable_gqa and FlexAttention (torch 2.5) and nn.RMSNorm
    (2.4): the floor in pyproject is at least 2.5, so pip never pairs attnbook with a torch
    that lacks them (it is 2.9: tests/book/test_min_versions.py runs the tests on it)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floor = next(d for d in deps if d.startswith("torch")).split(">=")[1]
    assert tuple(map(int, floor.split(".")[:2])) >= (2, 5), floor
    source = "\n".join(p.read_text() for p in (ROOT / "attnbook").rglob("*.py"))
    for needs_2_5 in ("enable_gqa", "flex_attention"):
        assert needs_2_5 in source  # still used: the floor still has a reason
