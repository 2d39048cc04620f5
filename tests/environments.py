"""Fresh virtual environments that hold exactly a given list of requirements, in seconds.

Installing torch and the rest from their wheels takes minutes. The same distributions are
already installed in the test environment, so a new environment gets the installed closure of
the requirements (every file and its metadata, so that pip sees them installed) as hard links.
pip replaces a hard link without touching the file it shares, so nothing done in the new
environment reaches this one. Requirements that this environment lacks raise, naming them.
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
            if file.parts[0] == ".." or "__pycache__" in file.parts:
                continue  # scripts outside site-packages; bytecode is rebuilt
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
