"""Fresh virtual environments that hold exactly a given list of requirements, in seconds.

Installing torch and the rest from their wheels takes minutes. The same distributions are
already installed in the test environment, so a new environment gets the installed closure of
the requirements (every file and its metadata, so that pip sees them installed) as hard links.
pip replaces a hard link without touching the file it shares, so nothing done in the new
environment reaches this one. Requirements that this environment lacks raise, naming them.

grading_venv() builds what an instructor's grading kernel holds: the attnbook of this working
tree with its dependencies and its `grading` extra, nothing else. tests/course/test_nbgrader.py
autogrades every chapter in one; CI executes the book in one (tools/grading_kernel.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the test extra installs tomli
    import tomli as tomllib


def installed_closure(requirements: list[str]) -> dict:
    """The installed distributions ``requirements`` need, dependencies and the extras asked
    for included, by name."""
    found, extras, todo = {}, {}, [Requirement(r) for r in requirements]
    while todo:
        requirement = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        key = canonicalize_name(requirement.name)
        new = {""} | set(requirement.extras)
        if key in found and new <= extras[key]:
            continue
        if key not in found:
            try:
                found[key] = distribution(requirement.name)
            except PackageNotFoundError:
                raise LookupError(f"{requirement} is not installed here: install the test extra") from None
            extras[key] = set()
        if requirement.specifier and found[key].version not in requirement.specifier:
            raise LookupError(f"{requirement}: {found[key].version} is installed here")
        for dependency in map(Requirement, found[key].requires or []):
            marker = dependency.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in new - extras[key]):
                dependency.marker = None  # evaluated here, for the extras that brought it in
                todo.append(dependency)
        extras[key] |= new
    return found


def linked_venv(where: Path, requirements: list[str]) -> Path:
    """A new virtual environment in ``where`` holding the installed closure of
    ``requirements`` (and pip), with their command-line scripts; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    site = next((where / "lib").glob("python3*/site-packages"))
    for dist in installed_closure([*requirements, "pip"]).values():
        for file in dist.files or []:
            if file.parts[0] == "..":
                continue  # scripts outside site-packages: written below
            if "__pycache__" in file.parts and not dist.locate_file(file).is_file():
                continue  # bytecode that was never written (its source is compiled on import)
            # bytecode is linked too: the same source inode, so its mtime and size still match;
            # the import system sets each code object's file name to the new path
            target = site / file
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(dist.locate_file(file), target)
            except OSError:  # another file system: copy
                shutil.copy2(dist.locate_file(file), target)
        for script in dist.entry_points.select(group="console_scripts"):  # as pip writes them
            module, _, attr = script.value.partition(":")
            path = where / "bin" / script.name
            path.write_text(f"#!{where / 'bin' / 'python'}\nimport sys\nfrom {module} import "
                            f"{attr.split('.')[0]}\nsys.exit({attr}())\n")
            path.chmod(0o755)
    return where / "bin" / "python"


def grading_requirements(root: Path, extra: list[str] = ()) -> list[str]:
    """What a grading kernel installs: the dependencies of the attnbook in ``root`` and its
    `grading` extra (``root/pyproject.toml``), and ``extra``."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["grading"], *extra]


def grading_venv(where: Path, root: Path, extra: list[str] = ()) -> Path:
    """A new venv in ``where`` holding the installed closure of
    ``grading_requirements(root, extra)`` (and setuptools, for the next step) and the
    attnbook of ``root`` installed editable without dependencies; returns its python."""
    python = linked_venv(where, [*grading_requirements(root, extra), "setuptools"])
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", str(root)],
        env={**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise RuntimeError(f"grading_venv: pip install -e {root} failed:\n{done.stdout}{done.stderr}")
    return python
