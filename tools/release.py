"""Prepare a release: one version number in attnbook, the CHANGELOG and every notebook's install cell.

    python tools/release.py 0.2.0        # or: make release VERSION=0.2.0

An assignment must not break mid-semester, so the install cell of each chapter installs the tagged
release it was written for (``...attention-book@v0.2.0``), never a moving branch. This script
refuses to run until ``CHANGELOG.md`` has a ``## [0.2.0]`` section, then rewrites
``attnbook.__version__`` and the install cells, and prints the git commands that tag the release.
``tests/test_repository.py`` checks that the three agree.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION_LINE = re.compile(r'^__version__ = "([^"]+)"$', re.M)
INSTALL_REF = re.compile(r'(git\+https://\S+?@)([\w.\-]+)(")')


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
    for path in sorted((root / "book").glob("*.ipynb")):
        nb = json.loads(path.read_text())
        code = [cell for cell in nb["cells"] if cell["cell_type"] == "code"]
        source = "".join(code[0]["source"])
        pinned = INSTALL_REF.sub(rf"\g<1>v{version}\g<3>", source)
        if pinned == source and f"@v{version}\"" not in source:
            raise ValueError(f"{path.name}: the first code cell has no git+URL@ref install line")
        if pinned != source:
            code[0]["source"] = pinned.splitlines(keepends=True)
            path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
            changed.append(path)
    return changed


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    try:
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
