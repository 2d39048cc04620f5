"""The bad-input sweep: every public function and class of the package against the classes of
wrong input a new user makes, collected from the modules' ``__all__``.

Each module's rows live in ``tests/properties/bad_input_<module>.py`` (``kernels.flash_triton`` ->
``bad_input_kernels_flash_triton.py``), which defines

* ``ROWS``: a list of :class:`Bad` (the call must raise ``ValueError`` or ``TypeError`` whose
  message contains every needle: the function and the argument) and :class:`Edge` (an edge
  input with a documented result, such as an empty sequence giving an empty output, checked
  by a predicate);
* ``EXEMPT``: ``{name: reason}`` for public names that take no argument a user could get wrong
  (a constant, a dataclass of results), each with the reason.

A wrong input must never escape as a raw ``RuntimeError``, ``IndexError``,
``ZeroDivisionError`` or ``KeyError``, nor give a silently different answer: a :class:`Bad`
row fails on any other exception and on a return. ``test_every_public_name_has_a_row`` makes a
new public function without a row (or an exemption) fail. The grading kit (``grader``,
``course``, ``sandbox``, ``exercises``) is left out here: ``tests/course/test_grading_attacks.py``,
``tests/course/test_course.py`` and ``tests/course/test_sandbox.py`` attack it with hostile submissions.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

import pytest

MODULES = [
    "contract", "masks", "primitives", "layers", "caches", "generation", "core", "complexity", "data", "utils", "viz", "widgets", "train", "models",
    "transformer", "positional", "sparse", "linear", "kvcache", "serving", "flash", "attend", "flex",
    "distributed", "rnn", "vision", "graph", "connections", "kernels", "kernels.flash_triton",
    "kernels.decode", "kernels.compile", "kernels.tuning", "kernels.variants", "kernels.lab",
]  # fmt: skip
CLASSES = ("non-integer", "boolean", "integer-dtype", "zero", "negative", "nan", "empty",
           "wrong-shape", "wrong-dtype", "out-of-range", "wrong-type")  # fmt: skip


@dataclass(frozen=True)
class Bad:
    target: str  # the public name, as in the module's __all__ ("causal_mask", "KVCache.update")
    what: str  # one of CLASSES
    call: Callable[[], Any]
    needles: tuple[str, ...]  # substrings of the message: the function and the argument
    error: type[Exception] | tuple[type[Exception], ...] = (ValueError, TypeError)


@dataclass(frozen=True)
class Edge:
    target: str
    what: str
    call: Callable[[], Any]
    check: Callable[[Any], bool]  # the documented result


def _rows_module(module: str):
    return importlib.import_module("bad_input_" + module.replace(".", "_"))


def _public(module: str) -> list[str]:
    return list(getattr(importlib.import_module(f"attnbook.{module}"), "__all__", []))


def _all_rows():
    rows = []
    for module in MODULES:
        try:
            rows += [(module, row) for row in _rows_module(module).ROWS]
        except ModuleNotFoundError:
            pass  # test_every_public_name_has_a_row names the missing file
    return rows


ROWS = _all_rows()


def _id(item) -> str:
    module, row = item
    return f"{module}.{row.target}: {row.what}"


@pytest.mark.parametrize("module", MODULES)
def test_every_public_name_has_a_row(module):
    try:
        rows_module = _rows_module(module)
    except ModuleNotFoundError:
        pytest.fail(f"tests/properties/bad_input_{module.replace('.', '_')}.py is missing: every module needs its rows")
    covered = {row.target.split(".")[0] for row in rows_module.ROWS} | set(rows_module.EXEMPT)
    missing = [name for name in _public(module) if name not in covered]
    assert not missing, f"attnbook.{module}: public names without a bad-input row or an exemption: {missing}"
    gone = sorted(covered - set(_public(module)))
    assert not gone, f"tests/properties/bad_input_{module.replace('.', '_')}.py names what attnbook.{module} no longer has: {gone}"
    for row in rows_module.ROWS:
        assert row.what in CLASSES, f"{module}.{row.target}: unknown class of bad input {row.what!r}"


@pytest.mark.parametrize("item", ROWS, ids=[_id(item) for item in ROWS])
def test_bad_input(item):
    module, row = item
    if isinstance(row, Edge):
        assert row.check(row.call()), f"{module}.{row.target} ({row.what}): not the documented result"
        return
    try:
        result = row.call()
    except row.error as error:
        message = str(error)
        missing = [n for n in row.needles if n not in message]
        assert not missing, f"{module}.{row.target} ({row.what}): the message {message!r} does not name {missing}"
        return
    except Exception as error:  # a raw error: the user learns nothing
        pytest.fail(f"{module}.{row.target} ({row.what}): raw {type(error).__name__}: {error}")
    pytest.fail(f"{module}.{row.target} ({row.what}): accepted, returned {type(result).__name__}")
