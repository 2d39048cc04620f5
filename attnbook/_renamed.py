"""Old names that still work for one release: a module's ``__getattr__`` hands an old
name to :func:`renamed`, which warns with a :class:`DeprecationWarning` that says the
new name, and returns the object."""

from __future__ import annotations

import importlib
import warnings


def renamed(module: str, table: dict[str, tuple[str, str]], name: str):
    """The object that ``module``'s old ``name`` now is, from ``table``: old name ->
    (new qualified name, advice appended to the warning). A name not in the table raises
    :class:`AttributeError`, as a module without it would."""
    if name not in table:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    target, advice = table[name]
    warnings.warn(
        f"{module}.{name} is now {target}{advice}", DeprecationWarning, stacklevel=3
    )
    where, _, attr = target.rpartition(".")
    return getattr(importlib.import_module(where), attr)
