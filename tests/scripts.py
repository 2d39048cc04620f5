"""Load a file of the repository that is not part of the package (a tool, a benchmark, a generated kernel) as a
module, so that tests can call its functions; its folder goes on ``sys.path``, as running it would put it, so
that it imports its siblings (``benchmarks/common.py``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str | None = None, *, register: bool = False) -> ModuleType:
    """The module of the Python file ``path``, named ``name`` (default: the file's stem). ``register=True`` puts it
    in ``sys.modules`` before running it, for a script whose dataclasses look their module up."""
    name = name or Path(path).stem
    folder = str(Path(path).resolve().parent)
    if folder not in sys.path:  # as `python folder/script.py` has it: its siblings import
        sys.path.append(folder)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
