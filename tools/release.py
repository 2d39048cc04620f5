"""Prepare a release: one version number in attnbook, the CHANGELOG and every notebook's install cell.

    python tools/release.py 0.2.0        # or: make release VERSION=0.2.0
    python tools/release.py --links      # or: make links (a fork points every link at itself)
    python tools/release.py --notes 0.2.0  # the CHANGELOG section of a release (its notes)

An assignment must not break mid-semester, so the install cell of each chapter installs the tagged
release it was written for (``...attention-book@v0.2.0``), never a moving branch. This script
refuses to run until ``CHANGELOG.md`` has a ``## [0.2.0]`` section, then rewrites
``attnbook.__version__`` and the install cells, and prints the git commands that tag the release.

The repository's address is one setting, ``repository.url`` in ``_config.yml``: Jupyter Book
builds the Colab and repository buttons from it, and this script writes it into every install
cell, the package's project URLs and the ``git clone`` lines of the README, the introduction and
the instructor guide. A fork changes that setting and runs ``make links``.
``tests/book/test_repository.py`` checks that all of them agree.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
VERSION_LINE = re.compile(r'^__version__ = "([^"]+)"$', re.M)
# The install cell builds the package spec from this one line: `url = "git+<repo>@<ref>"`.
INSTALL_URL = re.compile(r'^(\s*url = ")([^"]*)(")', re.M)
PINNED = re.compile(r"^git\+(\S+?)@([\w.\-]+)$")
CLONE = re.compile(r"git clone (\S+?) && cd (\S+)")
GIT_SPEC = re.compile(r"git\+https://[^\s\"'`@]+@v\d+\.\d+\.\d+")
LINKED = ["README.md", "intro.md", "book/course.md"]


def repository_url(root: Path = ROOT) -> str:
    """``repository.url`` of ``_config.yml``, the one place the address is set."""
    config = yaml.safe_load((root / "_config.yml").read_text())
    return config["repository"]["url"].rstrip("/")


def install_url(source: str) -> str:
    """What the install cell ``source`` installs from (its ``url = "..."`` line)."""
    found = INSTALL_URL.search(source)
    if not found:
        raise ValueError('the install cell has no `url = "..."` line')
    return found.group(2)


def with_install_url(source: str, url: str) -> str:
    """The install cell ``source`` installing from ``url`` instead: a ``git+URL@ref``, or a
    wheel's path or ``file://`` URL (the Colab-path test installs the built wheel this way)."""
    install_url(source)
    return INSTALL_URL.sub(lambda m: m.group(1) + url + m.group(3), source, count=1)


def _write_if_changed(path: Path, text: str, changed: list[Path]) -> None:
    if path.read_text() != text:
        path.write_text(text)
        changed.append(path)


def point_links(root: Path = ROOT, version: str | None = None) -> list[Path]:
    """Write ``repository.url`` (and the release tag ``v<version>``, default the package's
    version) into every install cell, the project URLs and the ``git clone`` lines."""
    url = repository_url(root)
    pyproject = root / "pyproject.toml"
    homepage = re.search(r'^Homepage = "([^"]*)"', pyproject.read_text(), re.M) if pyproject.exists() else None
    old = homepage.group(1).rstrip("/") if homepage else url  # where the links point now
    init = (root / "attnbook" / "__init__.py").read_text()
    version = version or VERSION_LINE.search(init).group(1)
    changed: list[Path] = []
    book = root / "book"  # the chapters, their question pages and the projects
    pages = sorted(book.glob("questions/*.ipynb")) + sorted(book.glob("projects/*.ipynb"))
    for path in sorted(book.glob("*.ipynb")) + pages:
        nb = json.loads(path.read_text())
        code = [cell for cell in nb["cells"] if cell["cell_type"] == "code"]
        source = "".join(code[0]["source"])
        if not PINNED.match(install_url(source)):
            raise ValueError(f"{path.name}: the install cell does not install git+URL@ref")
        pinned = with_install_url(source, f"git+{url}@v{version}")
        if pinned != source:
            code[0]["source"] = pinned.splitlines(keepends=True)
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
            changed.append(path)
    name = url.rsplit("/", 1)[-1]
    for rel in LINKED:
        if (root / rel).exists():
            text = (root / rel).read_text().replace(old + "/", url + "/")  # e.g. release downloads
            text = CLONE.sub(f"git clone {url} && cd {name}", text)
            text = GIT_SPEC.sub(f"git+{url}@v{version}", text)
            _write_if_changed(root / rel, text, changed)
    if pyproject.exists():
        text = re.sub(r'^(Homepage|Repository|Issues) = "[^"]*"',
                      lambda m: f'{m.group(1)} = "{url}' + ('/issues"' if m.group(1) == "Issues" else '"'),
                      pyproject.read_text(), flags=re.M)
        _write_if_changed(pyproject, text, changed)
    return changed


def release(version: str, root: Path = ROOT) -> list[Path]:
    """Set ``version`` everywhere it is written; return the files changed."""
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise ValueError(f"version must look like 1.2.3, got {version!r}")
    changelog = (root / "CHANGELOG.md").read_text()
    if f"## [{version}]" not in changelog:
        raise ValueError(f"CHANGELOG.md has no '## [{version}]' section: write what changed first")
    changed = []
    init = root / "attnbook" / "__init__.py"
    text = init.read_text()
    new = VERSION_LINE.sub(f'__version__ = "{version}"', text, count=1)
    if new != text:
        init.write_text(new)
        changed.append(init)
    return changed + point_links(root, version)


def notes(version: str, root: Path = ROOT) -> str:
    """The CHANGELOG section of ``version``: the release's notes."""
    changelog = (root / "CHANGELOG.md").read_text()
    found = re.search(rf"^## \[{re.escape(version)}\][^\n]*\n(.*?)(?=^## \[|\Z)", changelog, re.M | re.S)
    if not found:
        raise ValueError(f"CHANGELOG.md has no '## [{version}]' section")
    return found.group(1).strip()


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["--notes"] and len(argv) == 2:
            print(notes(argv[1]))
            return 0
        if argv == ["--links"]:
            changed = point_links()
            for path in changed:
                print(f"updated {path.relative_to(ROOT)}")
            print(f"every link points at {repository_url()}" + ("" if changed else " already"))
            return 0
        if len(argv) != 1 or argv[0].startswith("-"):
            print(__doc__)
            return 2
        changed = release(argv[0])
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for path in changed:
        print(f"updated {path.relative_to(ROOT)}")
    print(f"\nNow run `make test`, then:\n  git commit -am 'Release v{argv[0]}' && git tag -a v{argv[0]} -m v{argv[0]}"
          " && git push --follow-tags")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
