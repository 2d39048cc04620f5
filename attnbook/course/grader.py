"""The grader: every verdict is computed where the submission cannot reach it.

``python -m attnbook.course grade SUBMISSIONS --book book`` grades each submitted
chapter in four steps:

1. **Rebuild.** The notebook that runs is the book's chapter with its solutions stubbed
   out (:func:`~attnbook.course.notebooks.strip_solutions`), in which only the
   *answer cells* (the cells tagged ``solution``) come from the submission, matched by
   cell id, then by their first line. Check cells, setup cells and imports are the
   book's, whatever the submission did to them; edited, deleted, moved or extra cells
   are reported and ignored. The book's hidden tests (cells tagged ``hidden-tests``,
   which no student notebook has) are check cells like the others here.
2. **Run.** A fresh kernel runs it under
   :class:`~attnbook.course.sandbox.Limits` (time per cell and per notebook, CPU
   time, memory, processes, disk, output), in an empty folder, with a clean
   environment. A cell's time leaves out the waits for a CPU that
   other work held, so a busy machine changes no verdict.
3. **Check from outside.** A check cell is not run in the kernel. The grader evaluates
   the check (``attnbook.exercises.CHECKS``) in its own process on a stand-in for
   the student's answer (:class:`RemoteFunction`): each call sends the inputs, drawn
   from a fresh secret seed (``attnbook.course.checks.common.fresh_inputs``), to the
   kernel, runs the student's function there, and brings back only the result, which
   is decoded as plain data (tensors, numbers, strings, lists; no code) and compared
   with the reference in the grader. Nothing the submission prints, writes or patches
   in its kernel decides a verdict. The kernel lab's checks go further: their answer
   is a kernel's source. The grader reads the answer cells' ``@triton.jit`` functions
   (:func:`kernel_source`, which allows Triton's language and nothing else), and
   defines them in a worker of their own, a second kernel in which no student cell
   ran, where the book's launchers run them in Triton's interpreter and measure their
   tiles.
4. **Report.** One row per check, a Markdown feedback file per student, and a
   gradebook CSV with points per chapter.

What this defends against, and what it cannot, is written out on the book's grading
page (``book/grading.md``, *The trust model*).
"""

from __future__ import annotations

import ast
import base64
import contextlib
import csv
import math
import os
import queue
import re
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import sandbox
from .notebooks import CHECK_CALL, strip_solutions, written_exercises
from .notebooks import require as _require

__all__ = [
    "CSV_FIELDS",
    "Chapter",
    "Step",
    "KernelSession",
    "CellRun",
    "KernelGone",
    "CallTimeout",
    "Untrusted",
    "MACHINERY",
    "machinery_writes",
    "kernel_check",
    "kernel_source",
    "answer_references",
    "KernelSource",
    "RemoteFunction",
    "isolation_for",
    "summary",
    "load_chapters",
    "rebuild",
    "grade_notebook",
    "grade",
    "write_feedback",
    "write_gradebook",
    "chapter_points",
]

CSV_FIELDS = [
    "student",
    "notebook",
    "label",
    "passed",
    "status",
    "message",
    "isolation",
]
ISOLATIONS = ("auto", "bwrap", "none")
NOT_RUN = "check did not run"
NOTEBOOK = "*"  # the label of a row about the whole notebook
MAX_REPLY = 64 * 2**20  # bytes of one encoded answer


# --------------------------------------------------------------------------------------
# 1. Rebuild: the book's cells, the student's answers
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One step of a graded run: ``code`` to execute, or a ``check`` of ``label`` on
    the object the expression ``code`` names in the kernel."""

    kind: str  # "code", "answer" or "check"
    code: str
    label: str = ""  # the check's label (for answers: the label they answer)
    cell: str = ""  # the book's cell id


@dataclass
class Chapter:
    """A chapter as the grader uses it: its name, its steps with the solutions stubbed
    out, its check labels in order, and their points."""

    name: str
    steps: list[Step]
    labels: list[str]
    points: dict[str, float]
    sources: dict[
        str, str
    ]  # cell id -> source, for the code cells that are not answers

    @classmethod
    def from_notebook(cls, nb, name: str) -> Chapter:
        template = strip_solutions(nb, name=name, keep_hidden=True)  # hidden tests run
        steps, pending = [], []
        for cell in template.cells:
            if cell.cell_type != "code":
                continue
            calls = list(CHECK_CALL.finditer(cell.source))
            if "solution" in cell.metadata.get("tags", []):
                pending.append(len(steps))
                steps.append(Step("answer", cell.source, cell=cell.get("id", "")))
            elif calls:
                label, expr = _check_call(cell.source, f"{name}, cell {cell.get('id')}")
                steps.append(Step("check", expr, label, cell.get("id", "")))
                for index in pending:  # the answers above it answer this check
                    steps[index] = Step(
                        "answer", steps[index].code, label, steps[index].cell
                    )
                pending = []
            else:
                steps.append(Step("code", cell.source, cell=cell.get("id", "")))
        labels = list(dict.fromkeys(s.label for s in steps if s.kind == "check"))
        sources = {
            c.get("id"): c.source
            for c in template.cells
            if c.cell_type == "code" and "solution" not in c.metadata.get("tags", [])
        }
        sources.pop(None, None)
        return cls(name, steps, labels, chapter_points(nb, labels), sources)


def _check_call(source: str, where: str) -> tuple[str, str]:
    """``(label, answer expression)`` of a check cell that is one ``check(...)``
    call."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise ValueError(f"{where}: the check cell does not parse: {err}") from None
    body = tree.body
    call = body[0].value if len(body) == 1 and isinstance(body[0], ast.Expr) else None
    if (
        not isinstance(call, ast.Call)
        or len(call.args) != 2
        or not isinstance(call.args[0], ast.Constant)
    ):
        raise ValueError(
            f"{where}: a check cell must be one check('label', answer) call"
        )
    return call.args[0].value, ast.unparse(call.args[1])


def chapter_points(nb, labels: list[str]) -> dict[str, float]:
    """Points per check label: the chapter's ``metadata.attnbook.points`` (``{label:
    points}``), 1 for a label it does not list. The metadata also gives the points of
    the written exercises, which are graded by hand (nbgrader's and otter's exports
    read them); any other label in it is a typo and raises ``ValueError``."""
    given = nb.metadata.get("attnbook", {}).get("points", {})
    unknown = sorted(set(given) - set(labels) - set(written_exercises(nb)))
    if unknown:
        raise ValueError(
            "metadata.attnbook.points names labels that are neither checked nor "
            f"written exercises: {unknown}"
        )
    return {label: float(given.get(label, 1)) for label in labels}


def _first_line(source: str) -> str:
    return next((line.strip() for line in source.splitlines() if line.strip()), "")


# --------------------------------------------------------------------------------------
# Tampering: answer cells that write to the grading machinery
# --------------------------------------------------------------------------------------
# What an answer cell must not rebind or mutate: the check registry and its helpers,
# the kernel lab's launchers (a kernel-lab check runs the student's kernel through
# them, in the kernel), the measurement of new tensors two checks make in the kernel,
# and the grader. A chapter adds what its check expressions name (``lab``,
# ``functools.partial``).
MACHINERY = (
    "attnbook.exercises",
    "attnbook.kernels.lab",
    "attnbook.utils.largest_new_tensor",
    "attnbook.course",
    "attnbook.grader",
    "attnbook.sandbox",
)
_BUILTINS = frozenset(
    ("getattr", "setattr", "delattr", "vars", "globals", "locals", "exec", "eval")
    + ("__import__",)
)
_GLOBALS = "<globals>"  # the path of the kernel's global namespace
_ANY = "*"  # an attribute or key whose name the source does not spell out
# methods that change the object they are called on
_MUTATORS = frozenset(
    ("update", "clear", "pop", "popitem", "setdefault", "append", "extend", "insert")
    + ("remove", "register", "__setitem__", "__delitem__", "__setattr__", "__delattr__")
)


def _touches(path: str | None, machinery) -> bool:
    """Whether writing to ``path`` changes the machinery: it is one of its paths, lies
    under one, or is a module above one (``attnbook.kernels``). A ``*`` segment (a
    name only known when the cell runs) matches anything below the path before it."""
    if not path:
        return False
    if path.split(".")[0] == _ANY:  # sys.modules[name]: any module at all
        return True
    head = path.partition("." + _ANY)[0]
    return any(
        head == m or head.startswith(m + ".") or m.startswith(head + ".")
        for m in machinery
    )


def _ipython_to_python(source: str) -> str:
    """A cell's source as the kernel runs it (``%magic`` and ``!shell`` lines become
    calls)."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:  # pragma: no cover - the course extra has IPython
        return source
    try:
        return TransformerManager().transform_cell(source)
    except Exception:
        return source


class _Writes(ast.NodeVisitor):
    """Finds the writes an answer cell makes to the grading machinery, following
    aliases (``import attnbook.exercises as e``, ``g = getattr(attnbook, "exer" +
    "cises")``, ``sys.modules[...]``, ``importlib.import_module(...)``) through the
    cells in the order they run. Reads, calls, comments and strings never count, nor
    does a student's own name that happens to be ``CHECKS`` or ``check``."""

    def __init__(self, machinery, protected=()):
        self.machinery = tuple(machinery)
        self.protected = set(protected)  # global names the check expressions read
        self.env: dict[str, str | None] = {}  # global name -> the path it is bound to
        self.stars: list[str] = []  # modules imported with ``import *``
        self.scopes: list[tuple[dict, set]] = []  # (locals, names declared global)
        self.found: list[str] = []

    # ---- what an expression names ----------------------------------------------------
    def const(self, node) -> str | None:
        """The value of a string expression made only of literals, else ``None``."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.const(node.left), self.const(node.right)
            return None if left is None or right is None else left + right
        if isinstance(node, ast.JoinedStr):
            parts = [self.const(v) for v in node.values]
            return None if None in parts else "".join(parts)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "join"
            and len(node.args) == 1
            and isinstance(node.args[0], ast.List | ast.Tuple)
        ):
            sep = self.const(node.func.value)
            parts = [self.const(v) for v in node.args[0].elts]
            return None if sep is None or None in parts else sep.join(parts)
        return None

    def lookup(self, name: str) -> str | None:
        for local, declared in reversed(self.scopes):
            if name in declared:
                break
            if name in local:
                return local[name]
        if name in self.env:
            return self.env[name]
        # a name no cell bound may come from ``from MODULE import *``
        return next(
            (f"{m}.{name}" for m in self.stars if m.startswith("attnbook")), None
        )

    def builtin(self, func) -> str | None:
        """The name of the built-in function ``func`` is, unless the cell rebound it."""
        if not isinstance(func, ast.Name) or func.id not in _BUILTINS:
            return None
        if func.id in self.env or any(func.id in s[0] for s in self.scopes):
            return None
        return func.id

    def path(self, node) -> str | None:
        """The dotted path ``node`` evaluates to, where it can be known."""
        if isinstance(node, ast.Name):
            return self.lookup(node.id)
        if isinstance(node, ast.Attribute):
            base = self.path(node.value)
            return base and f"{base}.{node.attr}"
        if isinstance(node, ast.Subscript):
            base, key = self.path(node.value), self.const(node.slice)
            if base == "sys.modules":
                return key or _ANY
            if base == _GLOBALS:
                return self.env.get(key) if key else None
            if _touches(base, self.machinery):
                return f"{base}.{_ANY}"
            return None
        if isinstance(node, ast.NamedExpr):
            return self.path(node.value)
        if isinstance(node, ast.Call):
            return self.called(node)
        return None

    def called(self, node: ast.Call) -> str | None:
        """The path a call returns: ``getattr``, ``vars``, ``globals``, imports."""
        func, args = node.func, node.args
        name, target = self.builtin(func), self.path(func)
        if name == "getattr" and len(args) >= 2:
            base = self.path(args[0])
            return base and f"{base}.{self.const(args[1]) or _ANY}"
        if name in ("globals", "locals") and not self.scopes:
            return _GLOBALS
        if name == "vars":
            if not args:
                return _GLOBALS if not self.scopes else None
            base = self.path(args[0])
            return base and f"{base}.__dict__"
        if target in ("importlib.import_module", "__import__") or name == "__import__":
            module = self.const(args[0]) if args else None
            if module is None:
                return None
            fromlist = (
                args[3]
                if len(args) > 3
                else next((k.value for k in node.keywords if k.arg == "fromlist"), None)
            )
            if name == "__import__" and not fromlist:
                return module.split(".")[0]
            return module
        if target == "sys.modules.get" and args:
            return self.const(args[0]) or _ANY
        return None

    # ---- writes ----------------------------------------------------------------------
    def report(self, node, what: str) -> None:
        self.found.append(f"{what} (line {getattr(node, 'lineno', '?')})")

    def bind(self, name: str, value: str | None, node) -> None:
        """``name`` is bound to what has path ``value`` in the current scope."""
        if self.scopes and name not in self.scopes[-1][1]:
            self.scopes[-1][0][name] = value
            return
        old = self.env.get(name)
        if name.startswith("__attnbook"):
            self.report(node, f"rebinds {name}, the grader's name")
        elif name in self.protected and value != old:
            self.report(node, f"rebinds {name}, which a check reads")
        self.env[name] = value

    def write(self, target, value: str | None, node) -> None:
        """``target`` (an assignment target) is written with a value of path
        ``value``."""
        if isinstance(target, ast.Name):
            self.bind(target.id, value, node)
        elif isinstance(target, ast.Starred):
            self.write(target.value, None, node)
        elif isinstance(target, ast.Tuple | ast.List):
            for element in target.elts:
                self.write(element, None, node)
        elif isinstance(target, ast.Attribute):
            base = self.path(target.value)
            if base and _touches(f"{base}.{target.attr}", self.machinery):
                self.report(node, f"assigns {ast.unparse(target)[:80]}")
        elif isinstance(target, ast.Subscript):
            base, key = self.path(target.value), self.const(target.slice)
            if base == _GLOBALS:
                if key is None:
                    self.report(node, "writes to globals() by a computed name")
                else:
                    self.bind(key, value, node)
            elif base == "sys.modules" and _touches(key or _ANY, self.machinery):
                self.report(node, f"replaces sys.modules[{key or '...'!r}]")
            elif base and base.endswith(".__dict__"):
                owner = base[: -len(".__dict__")]
                if _touches(f"{owner}.{key or _ANY}", self.machinery):
                    self.report(node, f"writes into the namespace of {owner}")
            elif _touches(base, self.machinery):
                self.report(node, f"assigns {ast.unparse(target)[:80]}")

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        value = self.path(node.value)
        for target in node.targets:
            pairs = isinstance(target, ast.Tuple | ast.List) and isinstance(
                node.value, ast.Tuple | ast.List
            )
            if pairs and len(target.elts) == len(node.value.elts):
                for t, v in zip(target.elts, node.value.elts, strict=True):
                    self.write(t, self.path(v), node)
                continue
            self.write(target, value, node)
            self.visit_target(target)

    def visit_AugAssign(self, node) -> None:
        self.visit(node.value)
        self.write(node.target, None, node)
        self.visit_target(node.target)

    def visit_AnnAssign(self, node) -> None:
        if node.value is not None:
            self.visit(node.value)
            self.write(node.target, self.path(node.value), node)
        self.visit_target(node.target)

    def visit_Delete(self, node) -> None:
        for target in node.targets:
            self.write(target, None, node)
            self.visit_target(target)

    def visit_NamedExpr(self, node) -> None:
        self.visit(node.value)
        self.write(node.target, self.path(node.value), node)

    def visit_target(self, target) -> None:
        """Visit what a target reads (``a[f()]``), not the target itself."""
        if isinstance(target, ast.Attribute | ast.Subscript):
            self.visit(target.value)
            if isinstance(target, ast.Subscript):
                self.visit(target.slice)

    def visit_For(self, node) -> None:
        self.visit(node.iter)
        self.write(node.target, None, node)
        for child in [*node.body, *node.orelse]:
            self.visit(child)

    visit_AsyncFor = visit_For

    def visit_withitem(self, node) -> None:
        self.visit(node.context_expr)
        if node.optional_vars is not None:
            self.write(node.optional_vars, None, node.context_expr)

    def visit_Import(self, node) -> None:
        for alias in node.names:
            if alias.asname:
                self.bind(alias.asname, alias.name, node)
            else:
                top = alias.name.split(".")[0]
                self.bind(top, top, node)

    def visit_ImportFrom(self, node) -> None:
        base = node.module if not node.level else None
        for alias in node.names:
            if alias.name == "*":
                if base:
                    self.stars.append(base)
                continue
            self.bind(alias.asname or alias.name, base and f"{base}.{alias.name}", node)

    def visit_ExceptHandler(self, node) -> None:
        if node.type is not None:
            self.visit(node.type)
        if node.name:
            self.bind(node.name, None, node)
        for statement in node.body:
            self.visit(statement)

    def visit_Global(self, node) -> None:
        if self.scopes:
            self.scopes[-1][1].update(node.names)

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        func, args = node.func, node.args
        name = self.builtin(func)
        if name in ("setattr", "delattr") or (
            isinstance(func, ast.Attribute)
            and func.attr in ("__setattr__", "__delattr__")
            and isinstance(func.value, ast.Name)
            and func.value.id in ("object", "type")
        ):
            if args:
                base = self.path(args[0])
                key = self.const(args[1]) if len(args) > 1 else None
                if base and _touches(f"{base}.{key or _ANY}", self.machinery):
                    self.report(node, f"sets an attribute of {base}")
                elif base == _GLOBALS:
                    self.report(node, "sets an attribute of the global namespace")
        elif isinstance(func, ast.Attribute) and func.attr in _MUTATORS:
            base = self.path(func.value)
            owner = (
                base[: -len(".__dict__")]
                if base and base.endswith(".__dict__")
                else None
            )
            if base == _GLOBALS or base == "sys.modules":
                self.report(node, f"changes {ast.unparse(func.value)[:60]}")
            elif owner is not None and _touches(f"{owner}.{_ANY}", self.machinery):
                self.report(node, f"changes the namespace of {owner}")
            elif _touches(base, self.machinery):
                self.report(node, f"calls {ast.unparse(func)[:80]}")
        else:
            # code run from a string: exec, eval, and IPython's cell magics (%%capture)
            method = func.attr if isinstance(func, ast.Attribute) else None
            where = {"run_cell_magic": 2, "run_cell": 0, "ex": 0, "ev": 0}.get(method)
            where = 0 if name in ("exec", "eval") else where
            ok = where is not None and where < len(args)
            code = self.const(args[where]) if ok else None
            if code is not None:
                try:
                    tree = ast.parse(_ipython_to_python(code))
                except (SyntaxError, ValueError):
                    return
                for statement in tree.body:
                    self.visit(statement)

    # ---- scopes ----------------------------------------------------------------------
    def visit_FunctionDef(self, node) -> None:
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.visit(node.args)
        self.bind(node.name, None, node)
        params = [
            a.arg
            for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        ]
        params += [a.arg for a in (node.args.vararg, node.args.kwarg) if a]
        self.scopes.append(({p: None for p in params}, set()))
        for statement in node.body:
            self.visit(statement)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node) -> None:
        self.visit(node.args)
        params = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
        self.scopes.append(({p: None for p in params}, set()))
        self.visit(node.body)
        self.scopes.pop()

    def visit_ClassDef(self, node) -> None:
        for child in [*node.decorator_list, *node.bases, *node.keywords]:
            self.visit(child)
        self.scopes.append(({}, set()))
        for statement in node.body:
            self.visit(statement)
        self.scopes.pop()
        self.bind(node.name, None, node)

    def visit_comprehension(self, node) -> None:
        self.visit(node.iter)
        for condition in node.ifs:
            self.visit(condition)

    def visit_ListComp(self, node) -> None:
        names = [
            n.id
            for g in node.generators
            for n in ast.walk(g.target)
            if isinstance(n, ast.Name)
        ]
        self.scopes.append(({n: None for n in names}, set()))
        self.generic_visit(node)
        self.scopes.pop()

    visit_SetComp = visit_GeneratorExp = visit_DictComp = visit_ListComp

    # ---- whole cells -----------------------------------------------------------------
    def cell(self, source: str) -> list[str]:
        """The writes of one cell (run after the cells seen before it)."""
        try:
            tree = ast.parse(_ipython_to_python(source))
        except (SyntaxError, ValueError):
            return []  # it does not run: nothing it says can happen
        except (RecursionError, MemoryError):
            return ["is too deeply nested to be read"]
        self.found = []
        try:
            for statement in tree.body:
                self.visit(statement)
        except RecursionError:
            return ["is too deeply nested to be read"]
        return self.found


def machinery_writes(
    answers: list[str], setup: list[str] = (), checked: list[str] = ()
) -> list[list[str]]:
    """For each answer cell (sources, in the order they run), what it does to the
    grading machinery: ``[]`` for an honest cell, else one line per write.

    ``setup`` are the book's other cells, stubs included (their imports say what a name
    such as ``lab`` is bound to); ``checked`` the chapter's check expressions, which the
    grader evaluates in the kernel: the imported names they read (``lab``,
    ``functools``) must not be rebound, nor the attributes they read
    (``functools.partial``) be assigned.
    """
    book = _Writes(MACHINERY)
    for source in setup:
        book.cell(source)
    paths, names = set(), set()
    for expr in checked:
        try:
            tree = ast.parse(expr, mode="eval")
        except SyntaxError:
            continue
        inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and book.env.get(node.id):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and id(node) not in inner:
                paths.add(book.path(node))
    reader = _Writes((*MACHINERY, *sorted(p for p in paths if p)), names)
    reader.env, reader.stars = dict(book.env), list(book.stars)
    return [reader.cell(source) for source in answers]


def rebuild(chapter: Chapter, submission) -> tuple[list[Step], list[str], list[str]]:
    """The steps to run for ``submission`` (an nbformat notebook) of ``chapter``.

    Returns ``(steps, notes, tampering)``: the chapter's steps with each answer cell's
    code taken from the submission (by cell id, else the unused submitted cell with the
    same first line, e.g. ``def my_softmax(...)``; a missing answer keeps the stub),
    notes on what was ignored or not found, and the reasons to distrust the answers
    (an answer cell that reaches for the grading machinery).
    """
    cells = [c for c in submission.cells if c.cell_type == "code"]
    by_id = {c.get("id"): c for c in cells if c.get("id")}
    used: set[int] = set()
    steps, notes, tampering, missing = [], [], [], []
    for step in chapter.steps:
        if step.kind != "answer":
            steps.append(step)
            continue
        found = by_id.get(step.cell)
        if found is None or id(found) in used:
            first = _first_line(step.code)
            found = next(
                (
                    c
                    for c in cells
                    if id(c) not in used and _first_line(c.source) == first
                ),
                None,
            )
        if found is None:
            missing.append(step.label)
            steps.append(step)
            continue
        used.add(id(found))
        steps.append(Step("answer", found.source, step.label, step.cell))
    given = [s for s in steps if s.kind == "answer"]
    writes = machinery_writes(
        [s.code for s in given],
        setup=[s.code for s in chapter.steps if s.kind != "check"],
        checked=[s.code for s in chapter.steps if s.kind == "check"],
    )
    for step, found in zip(given, writes):
        if found:
            tampering.append(
                f"the answer cell for {step.label} writes to the grading machinery: "
                + "; ".join(found[:3])
            )
    if missing:
        notes.append(
            f"no answer cell found for {', '.join(missing)} (matched by cell id and by "
            "first line): graded as not attempted"
        )
    present = {c.get("id") for c in cells} - {None}
    book = chapter.sources
    expected = set(book) | {s.cell for s in chapter.steps if s.kind == "answer"}
    if expected and len(expected & present) < len(expected) / 2:
        notes.append(
            f"this notebook does not look like {chapter.name}: only "
            f"{len(expected & present)} of its {len(expected)} code cells are in it"
        )
    edited = sum(
        1
        for c in cells
        if c.get("id") in book and c.source.strip() != book[c.get("id")].strip()
    )
    deleted = len(set(book) - present)
    added = sum(1 for c in cells if id(c) not in used and c.get("id") not in book)
    if edited or deleted or added:
        notes.append(
            f"cells outside your answers differ from the book's (edited {edited}, "
            f"deleted {deleted}, added {added}): the book's cells ran instead; only "
            "your answer cells count"
        )
    return steps, notes, tampering


# --------------------------------------------------------------------------------------
# Kernel checks: the kernel lab's kernels, graded from their source
# --------------------------------------------------------------------------------------
# A kernel-lab check names the lab's launcher and the student's @triton.jit function:
# ``functools.partial(lab.softmax, softmax_kernel)``. Its answer is the kernel's source.
# The grader reads the answer cells, keeps their @triton.jit functions and constants
# when the code is Triton code (below), and defines them in a worker of its own, a
# second kernel in which no student cell ever ran; the launchers there are the book's.
_KERNEL_NAMES = frozenset(("tl", "triton", "functools", "lab"))
# the Python built-ins a Triton kernel may call (the compiler knows these)
_KERNEL_BUILTINS = frozenset(
    ("range", "min", "max", "abs", "float", "int", "bool", "len", "print")
)
_TRITON_ATTRIBUTES = frozenset(("cdiv", "next_power_of_2"))
# attributes that reach past Triton's values into the interpreter or Python's frames
_KERNEL_INTERNALS = frozenset(
    ("handle", "mro", "f_globals", "f_locals", "f_builtins", "f_back", "gi_frame")
    + ("gi_code", "cr_frame", "tb_frame", "tb_next", "func_globals")
)
_KERNEL_STATEMENTS = (
    ast.Assign,
    ast.AugAssign,
    ast.AnnAssign,
    ast.For,
    ast.While,
    ast.If,
    ast.Expr,
    ast.Return,
    ast.Pass,
    ast.Break,
    ast.Continue,
    ast.Assert,
    ast.Raise,
)
_KERNEL_EXPRESSIONS = (
    ast.BoolOp,
    ast.BinOp,
    ast.UnaryOp,
    ast.IfExp,
    ast.Compare,
    ast.Call,
    ast.keyword,
    ast.Constant,
    ast.Attribute,
    ast.Subscript,
    ast.Slice,
    ast.Name,
    ast.List,
    ast.Tuple,
    ast.JoinedStr,
    ast.FormattedValue,
    ast.expr_context,
    ast.operator,
    ast.unaryop,
    ast.cmpop,
    ast.boolop,
)


def kernel_check(expr: str) -> tuple[str, str] | None:
    """``(launcher, kernel)`` when the check expression ``expr`` is
    ``functools.partial(lab.<launcher>, <kernel>)``, a kernel-lab check whose answer is
    the ``@triton.jit`` function named ``kernel``; ``None`` for any other check."""
    try:
        call = ast.parse(expr, mode="eval").body
    except SyntaxError:
        return None
    if not (
        isinstance(call, ast.Call)
        and not call.keywords
        and len(call.args) == 2
        and ast.unparse(call.func) == "functools.partial"
        and isinstance(call.args[0], ast.Attribute)
        and isinstance(call.args[0].value, ast.Name)
        and call.args[0].value.id == "lab"
        and isinstance(call.args[1], ast.Name)
    ):
        return None
    return call.args[0].attr, call.args[1].id


@dataclass
class KernelSource:
    """What the grader takes from a submission's answer cells for the kernel checks:
    ``text``, the ``@triton.jit`` functions and constants it allows, in the order the
    cells define them (rewritten from their syntax trees: no comment, no other code);
    ``defined``, their names; ``refused``, why a function named there was left out."""

    text: str = ""
    defined: set[str] = field(default_factory=set)
    refused: dict[str, str] = field(default_factory=dict)


def _is_triton_jit(node: ast.expr) -> bool:
    return ast.unparse(node) == "triton.jit"


def _literal(node: ast.expr | None) -> bool:
    """A number or a bool, maybe signed, maybe in ``tl.constexpr(...)``."""
    if isinstance(node, ast.Call) and ast.unparse(node.func) == "tl.constexpr":
        return len(node.args) == 1 and not node.keywords and _literal(node.args[0])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) in (int, float, bool)


class _KernelReader(ast.NodeVisitor):
    """Why one ``@triton.jit`` function is not Triton code the grader can run: each
    problem a line. Allowed are the statements and expressions of Triton's language,
    the names the function binds, its parameters, the submission's other kernels and
    constants, ``tl``, ``triton.cdiv``, ``triton.next_power_of_2`` and a few
    built-ins; attributes of ``tl`` that are not modules (``tl.math`` aside); no
    attribute that starts with ``_`` or reaches into the interpreter; ``raise`` only of
    ``NotImplementedError`` (the exercise's stub)."""

    def __init__(self, known: set[str]):
        self.known = known
        self.problems: list[str] = []
        self.names: set[str] = set()

    def problem(self, node: ast.AST, what: str) -> None:
        if len(self.problems) < 3:
            self.problems.append(f"line {getattr(node, 'lineno', '?')}: {what}")

    def read(self, fn: ast.FunctionDef) -> list[str]:
        args = fn.args
        if args.vararg or args.kwarg:
            self.problem(fn, "a kernel takes no *args or **kwargs")
        params = args.posonlyargs + args.args + args.kwonlyargs
        for arg in params:
            if arg.annotation is not None and ast.unparse(arg.annotation) not in (
                "tl.constexpr",
                "triton.language.constexpr",
            ):
                self.problem(arg, f"parameter {arg.arg} is annotated other than "
                             "tl.constexpr")  # fmt: skip
        for default in args.defaults + [d for d in args.kw_defaults if d is not None]:
            if not _literal(default) and not (
                isinstance(default, ast.Constant) and default.value is None
            ):
                self.problem(default, "a parameter's default must be a number")
        stored = {
            n.id
            for n in ast.walk(fn)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        }
        bound = {a.arg for a in params} | stored
        for name in sorted(bound & {"tl", "triton"}):
            self.problem(fn, f"the kernel rebinds {name}")
        self.names = bound | self.known | {"tl", "triton"} | _KERNEL_BUILTINS
        for statement in fn.body:
            self.visit(statement)
        return self.problems

    def generic_visit(self, node: ast.AST) -> None:
        if not isinstance(node, _KERNEL_STATEMENTS + _KERNEL_EXPRESSIONS):
            what = type(node).__name__
            self.problem(node, f"{what} is not part of Triton's language")
            return
        super().generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id not in self.names:
            self.problem(node, f"the kernel reads {node.id}, which is not a kernel's: "
                         "only its parameters, its own names, tl and the kernels and "
                         "constants of your answer cells")  # fmt: skip

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = node.attr
        if name.startswith("_") or name in _KERNEL_INTERNALS:
            self.problem(node, f"the attribute .{name} is not part of Triton's "
                         "language")  # fmt: skip
            return
        base = ast.unparse(node.value)
        if base == "triton":
            if name not in _TRITON_ATTRIBUTES:
                self.problem(node, f"triton.{name} cannot be called in a kernel")
            return
        if base in ("tl", "tl.math"):
            import inspect

            module = _require("triton.language")
            if base == "tl.math":
                module = module.math
            value = getattr(module, name, None)
            if value is None:
                self.problem(node, f"{base} has no {name}")
            elif inspect.ismodule(value) and (base, name) != ("tl", "math"):
                self.problem(node, f"{base}.{name} is a module, not part of the "
                             "language")  # fmt: skip
            return
        self.visit(node.value)

    def visit_Raise(self, node: ast.Raise) -> None:
        exc = node.exc
        if isinstance(exc, ast.Call) and all(
            isinstance(a, ast.Constant) for a in exc.args
        ) and not exc.keywords:
            exc = exc.func
        if node.cause is not None or ast.unparse(exc or node) != "NotImplementedError":
            self.problem(node, "a kernel raises nothing but the stub's "
                         "NotImplementedError")  # fmt: skip


def kernel_source(answers: list[str]) -> KernelSource:
    """The ``@triton.jit`` functions and constants of the answer cells ``answers`` (in
    the order they run) that ``_KernelReader`` allows, as one source text; a
    function it refuses is named in ``refused`` with the first problems found, and any
    other code in the cells is left out: it ran, if at all, in the student's kernel."""
    nodes: list[ast.stmt] = []
    refused: dict[str, str] = {}
    for source in answers:
        try:
            tree = ast.parse(_ipython_to_python(source))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and any(
                _is_triton_jit(d) for d in node.decorator_list
            ):
                nodes.append(node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and _literal(node.value):
                single = [node.target] if isinstance(node, ast.AnnAssign) else None
                targets = single or node.targets
                if len(targets) == 1 and isinstance(targets[0], ast.Name):
                    nodes.append(node)
    kept, defined = [], set()
    known = {_defined_name(n) for n in nodes}
    for node in nodes:
        name = _defined_name(node)
        why = None
        if name in _KERNEL_NAMES or name.startswith("_"):
            why = f"the name {name} is the grader's; choose another"
        elif isinstance(node, ast.FunctionDef):
            try:
                problems = _KernelReader(known).read(node)
            except RecursionError:
                problems = ["it is too deeply nested to be read"]
            if len(node.decorator_list) != 1:
                problems.insert(0, "a kernel has one decorator, @triton.jit")
            why = "; ".join(problems) or None
        if why is None:  # the last definition of a name is the one that counts
            kept.append(ast.unparse(node))
            defined.add(name)
            refused.pop(name, None)
        else:
            refused[name] = why
            defined.discard(name)
    return KernelSource("\n\n\n".join(kept) + "\n" if kept else "", defined, refused)


def _defined_name(node: ast.stmt) -> str:
    if isinstance(node, ast.FunctionDef):
        return node.name
    target = node.targets[0] if isinstance(node, ast.Assign) else node.target
    return target.id


# --------------------------------------------------------------------------------------
# 2. Run: a kernel under limits, spoken to over the Jupyter protocol
# --------------------------------------------------------------------------------------
class KernelGone(BaseException):  # noqa: N818 - a condition, not an error of the check
    """The kernel died or was stopped: nothing after this can run."""


class CallTimeout(BaseException):  # noqa: N818
    """A call into the student's code ran past the time limit (the kernel was
    interrupted and lives on)."""


class Untrusted(BaseException):  # noqa: N818
    """The kernel's reply is not a plain answer: the check cannot be trusted."""


@dataclass
class CellRun:
    error: str | None = None  # "NameError: name 'f' is not defined"
    reply: dict = field(default_factory=dict)


def _kernel_env(home: Path) -> dict[str, str]:
    """A clean environment for the kernel: no secrets of the grader's, a private home,
    and this attnbook on the path when it is not pip-installed."""
    keep = ("PATH", "LANG", "LC_ALL", "OMP_NUM_THREADS", "TRITON_INTERPRET", "TZ")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(
        HOME=str(home),
        IPYTHONDIR=str(home / ".ipython"),
        MPLBACKEND="Agg",
        MPLCONFIGDIR=str(home / ".matplotlib"),
        JUPYTER_PLATFORM_DIRS="1",
        PYDEVD_DISABLE_FILE_VALIDATION="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    root = str(Path(__file__).resolve().parents[2])
    installed = {
        str(Path(p).resolve())
        for p in [*site.getsitepackages(), site.getusersitepackages()]
    }
    if root not in installed:
        env["PYTHONPATH"] = root
    return env


class KernelSession:
    """A ``python3`` kernel for one submission, started under ``limits`` in a private
    temporary folder, killed with everything it started when the session ends.

    ``run(code)`` executes a cell; ``call(expr, path, args, kwargs)`` calls the object
    the expression ``expr`` names (``path`` indexes into it) and returns the decoded
    result. The kernel is spoken to over IPC sockets. With ``isolation="bwrap"`` it runs
    in the sandbox (:func:`~attnbook.course.sandbox.sandbox_arguments`), where the
    sockets lie
    in its own ``/tmp``, reached from here through ``/proc/<kernel>/root``.

    A cell's time is the wall-clock time it runs less the time the kernel waited for a
    CPU the machine gave to other work than the submission's
    (:func:`~attnbook.course.sandbox.run_delay`,
    :func:`~attnbook.course.sandbox.busy_seconds`), so a
    busy machine does not time out an honest cell. While a cell runs, the CPU time and
    the memory of all the submission's processes are checked twice a second; at a cell's
    timeout every process but the kernel is killed before it is interrupted.
    """

    def __init__(
        self,
        limits: sandbox.Limits,
        guard: sandbox.ProcessGuard,
        isolation: str = "none",
        deadline: float | None = None,
    ):
        if isolation not in ("bwrap", "none"):
            raise ValueError(f"isolation must be 'bwrap' or 'none', got {isolation!r}")
        self.limits, self.guard, self.isolation = limits, guard, isolation
        self.output = 0  # bytes of output the kernel sent so far
        self.answer_limit = min(MAX_REPLY, limits.output // 2)  # bytes of one answer
        self.deadline = (
            time.monotonic() + limits.notebook_timeout if deadline is None else deadline
        )
        self.folder = Path(tempfile.mkdtemp(prefix="attnbook-kernel-"))
        self.proc: subprocess.Popen | None = None
        self.kernel_pid: int | None = None  # the kernel's process, as this host sees it
        self.chain: set[int] = set()  # the launcher, bwrap's init and the kernel
        self.client, self._monitors, self._watched = None, [], 0.0
        self._waited = 0.0  # seconds the kernel waited for a CPU other work held
        self._counters: tuple[float, float, float] | None = None

    # ---- life cycle ------------------------------------------------------------------
    def start(self) -> None:
        jupyter_client = _require("jupyter_client")
        zmq = _require("zmq")
        connection = self.folder / "kernel.json"
        transport = "ipc" if os.name == "posix" else "tcp"
        if self.isolation == "bwrap":
            ip, home, cwd = sandbox.SANDBOX_IPC, Path(sandbox.SANDBOX_HOME), self.folder
            wrapper = sandbox.sandbox_arguments(self.folder, self.limits)
        else:
            cwd, home, wrapper = self.folder / "work", self.folder / "home", []
            cwd.mkdir()
            home.mkdir()
            ip = str(self.folder / "ipc") if transport == "ipc" else "127.0.0.1"
        _, info = jupyter_client.connect.write_connection_file(
            str(connection), transport=transport, ip=ip
        )
        kernel = [sys.executable, "-m", "ipykernel_launcher", "-f", str(connection)]
        self.proc = subprocess.Popen(
            sandbox.launcher_command(self.limits, self.guard, kernel, wrapper),
            cwd=cwd,
            env=_kernel_env(home),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        ready_by = time.monotonic() + 120
        self.kernel_pid, self.chain = self._find_kernel(ready_by)
        if self.isolation == "bwrap":
            info["ip"] = f"/proc/{self.kernel_pid}/root{sandbox.SANDBOX_IPC}"
        context = zmq.Context()
        context.setsockopt(zmq.MAXMSGSIZE, self.limits.output)
        self.client = jupyter_client.BlockingKernelClient(context=context)
        self.client.load_connection_info(info)
        self.client.start_channels()
        # a message over MAXMSGSIZE disconnects the kernel's channel: watch for that
        self._monitors = [
            channel.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            for channel in (self.client.iopub_channel, self.client.shell_channel)
        ]
        while True:
            self._alive()
            try:
                self.client.wait_for_ready(timeout=2)
                return
            except RuntimeError:
                if time.monotonic() > ready_by:
                    raise KernelGone("the kernel did not start in 120 s") from None

    def _find_kernel(self, ready_by: float) -> tuple[int, set[int]]:
        """The kernel's process id and the chain of processes down to it: the launcher
        itself (which became the kernel), or in the sandbox the launcher (which became
        ``bwrap``), bwrap's init in the new PID namespace, and the kernel below it."""
        if self.isolation != "bwrap":
            return self.proc.pid, {self.proc.pid}
        while time.monotonic() < ready_by:
            self._alive()
            table = sandbox.processes()
            tree = sandbox.descendants(self.proc.pid, table)
            inits = [p.pid for p in tree if p.ppid == self.proc.pid]
            kernels = [p.pid for p in tree if inits and p.ppid == inits[0]]
            if kernels:
                return kernels[0], {self.proc.pid, inits[0], kernels[0]}
            time.sleep(0.02)
        raise KernelGone("the kernel did not start in 120 s")

    def close(self) -> None:
        for monitor in self._monitors:
            with contextlib.suppress(Exception):
                monitor.close(linger=0)
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.stop_channels()
            with contextlib.suppress(Exception):
                self.client.context.destroy(linger=0)
        if self.proc is not None:
            self._kill_everything()
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=10)
        with contextlib.suppress(OSError):
            sandbox.remove_tree(self.folder)

    def __enter__(self) -> KernelSession:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _alive(self, grace: float = 0.0) -> None:
        """Raise :class:`KernelGone` with the exit status if the kernel has exited;
        with ``grace``, first wait that long for a kernel process that is already
        gone (or a zombie) to report its status."""
        if grace and self.proc.poll() is None and self._kernel_gone():
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace)
        code = self.proc.poll()
        if code is not None and self.isolation == "bwrap" and 128 < code <= 192:
            code = 128 - code  # bwrap reports a signal as 128 + signal
        if code is not None:
            why = {
                -signal.SIGKILL: " (killed: out of memory or processes?)",
                -signal.SIGSEGV: " (segmentation fault)",
                -signal.SIGXCPU: " (out of CPU time)",
            }.get(code, "")
            raise KernelGone(f"the kernel died, exit code {code}{why}")

    def _kernel_gone(self) -> bool:
        table = sandbox.processes()
        kernel = table.get(self.kernel_pid)
        return bool(table) and (kernel is None or kernel.exited)

    def _watch(self) -> None:
        """At most twice a second: stop the notebook once all its processes together
        have used more CPU time than ``limits.cpu_seconds`` or hold more memory than
        ``limits.memory_together``, and add to :meth:`_clock`'s discount the time the
        kernel waited for a CPU, in the share of the machine's work that was not the
        submission's own (its own busy children slow its clock down not at all)."""
        now = time.monotonic()
        if now - self._watched < 0.5:
            return
        self._watched = now
        tree = sandbox.descendants(self.proc.pid)
        cpu = self.guard.cpu_seconds()
        cpu = sum(p.cpu for p in tree) if cpu is None else cpu
        counters = (sandbox.run_delay(self.kernel_pid), cpu, sandbox.busy_seconds())
        if self._counters is not None:
            delay, own, busy = (a - b for a, b in zip(counters, self._counters))
            if busy > 0:
                self._waited += max(delay, 0) * min(max(1 - own / busy, 0), 1)
        self._counters = counters
        if cpu > self.limits.cpu_seconds:
            self.kill(
                f"the notebook used more than {self.limits.cpu_seconds:g} s of CPU "
                "time (all its processes together)"
            )
        memory = self.limits.memory_together
        if sandbox.resident(tree, memory) > memory:
            self.kill(
                f"the notebook's processes held more than {memory / 2**20:,.0f} MiB of "
                "memory together"
            )

    def _signal(self, pid: int | None, sig: int | None) -> None:
        if pid is not None and sig is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def _kill_others(self, interrupt: bool = False) -> None:
        """SIGKILL every process of the submission but the chain down to the kernel:
        what a cell left running, in a session of its own or not. The kernel is
        stopped meanwhile, so it cannot start more; with ``interrupt`` its main thread
        gets a SIGINT as it resumes
        (:func:`~attnbook.course.sandbox.interrupt_main_thread`)."""
        self._signal(self.kernel_pid, getattr(signal, "SIGSTOP", None))
        try:
            for _ in range(50):  # children may fork while we kill: repeat until none
                tree = sandbox.descendants(self.proc.pid)
                others = {p.pid for p in tree if not p.exited} | self.guard.members()
                others -= self.chain
                if not others:
                    return
                for pid in others:
                    self._signal(pid, signal.SIGKILL)
                time.sleep(0.02)
        finally:
            if interrupt and self.kernel_pid is not None:
                sandbox.interrupt_main_thread(self.kernel_pid)
            self._signal(self.kernel_pid, getattr(signal, "SIGCONT", None))

    def _kill_everything(self) -> None:
        """SIGKILL every process of the submission: those below the kernel first, while
        it still adopts their orphans, then the kernel and the chain above it (in the
        sandbox the kernel's PID namespace, and all in it, dies with bwrap's init)."""
        self._kill_others()
        middle = self.chain - {self.kernel_pid, self.proc.pid}  # bwrap's init
        for pid in (self.kernel_pid, *middle, self.proc.pid):
            self._signal(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError, AttributeError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.guard.kill_all()

    def kill(self, why: str) -> None:
        """Stop the notebook for ``why``; a kernel that has already died on its own is
        reported as such."""
        self._alive(grace=2.0)
        self._kill_everything()
        raise KernelGone(why)

    # ---- executing -------------------------------------------------------------------
    def _clock(self) -> float:
        """Seconds that count against a cell's time: wall-clock time less the time the
        kernel waited for a CPU that other work held (see :meth:`_watch`)."""
        return time.monotonic() - self._waited

    def run(self, code: str, user_expressions: dict | None = None) -> CellRun:
        """Execute ``code``; raises :class:`CallTimeout` (the cell was interrupted, the
        kernel lives on) or :class:`KernelGone`."""
        timeout = min(self.limits.cell_timeout, self.deadline - time.monotonic())
        if timeout <= 0:
            self.kill(
                f"the notebook ran out of its time limit "
                f"({self.limits.notebook_timeout:g} s)"
            )
        msg_id = self.client.execute(
            code,
            store_history=False,
            allow_stdin=False,
            stop_on_error=False,
            user_expressions=user_expressions or {},
        )
        result = CellRun()
        if not self._drain(msg_id, timeout, result, self.deadline):
            self._interrupt(msg_id, f"ran longer than {timeout:g} s")
            raise CallTimeout(f"ran longer than {timeout:g} s")
        result.reply = self._reply(msg_id)
        return result

    def _drain(
        self,
        msg_id: str,
        budget: float,
        result: CellRun,
        until: float = math.inf,
        reap: bool = False,
    ) -> bool:
        """Read the kernel's output until the cell is done (True), or it has run for
        ``budget`` seconds of :meth:`_clock` or the wall clock reads ``until`` (False),
        counting its bytes against the output limit; with ``reap``, killing every
        process but the kernel as it goes."""
        start, reaped = self._clock(), 0.0
        while True:
            self._alive()
            self._watch()
            if reap and time.monotonic() - reaped > 0.25:
                self._kill_others()
                reaped = time.monotonic()
            left = min(budget - (self._clock() - start), until - time.monotonic())
            if left <= 0:
                self._alive(grace=1.0)  # a kernel that died just now is no timeout
                return False
            if any(monitor.poll(0) for monitor in self._monitors):
                self.kill(
                    "the notebook sent more than "
                    f"{self.limits.output // 2**20} MB of output at once"
                )
            try:
                msg = self.client.get_iopub_msg(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            content = msg.get("content", {})
            self.output += sum(len(str(v)) for v in content.values())
            if self.output > self.limits.output:
                self.kill(
                    f"the notebook printed more than {self.limits.output // 2**20} MB "
                    "of output"
                )
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "error" and result.error is None:
                value = str(content.get("evalue", "")).strip().splitlines()
                name = str(content.get("ename", "Error"))
                result.error = f"{name}: {value[0] if value else ''}".rstrip(": ")[:300]
            if msg["msg_type"] == "status" and content.get("execution_state") == "idle":
                return True

    def _reply(self, msg_id: str) -> dict:
        start = self._clock()
        while self._clock() - start < 10:
            self._alive()
            if any(monitor.poll(0) for monitor in self._monitors):
                self.kill(
                    "the notebook sent more than "
                    f"{self.limits.output // 2**20} MB of output at once"
                )
            try:
                msg = self.client.get_shell_msg(timeout=0.5)
            except queue.Empty:
                continue
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                return msg.get("content", {})
        self.kill("the kernel did not answer")
        return {}  # pragma: no cover - kill raises

    def _interrupt(self, msg_id: str, why: str = "ran past its time limit") -> None:
        """Kill every process of the submission but the kernel and interrupt the running
        cell (SIGINT, as Jupyter does); kill the kernel if it does not stop in 10 s.
        ``why`` says why the cell is interrupted."""
        self._kill_others(interrupt=True)
        if not self._drain(msg_id, 10, CellRun(), reap=True):
            self.kill(f"a cell {why} and ignored the interrupt")
        self._kill_others()  # what it started between the SIGINT and its stop
        self._reply(msg_id)

    # ---- calling the student's code from the grader ----------------------------------
    def call(self, expr: str, path: tuple, args=None, kwargs=None, measure=False):
        """Evaluate ``expr`` in the kernel, index it with ``path``, and (with ``args``)
        call it; return the decoded result. ``args is None`` describes the object
        instead: callables come back as :class:`RemoteFunction`."""
        import pickle

        payload = None
        if args is not None:
            payload = base64.b64encode(pickle.dumps((args, kwargs or {}))).decode()
        limit = self.answer_limit
        code = _KERNEL_SIDE + (
            f"\n__attnbook_reply__ = __attnbook_answer__({expr!r}, {path!r}, "
            f"{payload!r}, {measure!r}, {limit}, {MAX_NODES})\ndel __attnbook_answer__"
        )
        run = self.run(code, {"reply": "__attnbook_reply__"})
        if run.error is not None:
            raise Untrusted(f"the call into your answer was disrupted: {run.error}")
        reply = run.reply.get("user_expressions", {}).get("reply", {})
        text = (
            reply.get("data", {}).get("text/plain") if isinstance(reply, dict) else None
        )
        # the repr of one base64 string, nothing else (never parsed as Python)
        if not isinstance(text, str) or len(text) > 4 * (limit + 99) // 3 + 8:
            raise Untrusted("the kernel sent no readable reply")
        found = re.fullmatch(r"'([A-Za-z0-9+/]*={0,2})'", text)
        if found is None:
            raise Untrusted("the kernel sent no readable reply")
        try:
            value = _decode(base64.b64decode(found[1], validate=True), limit)
        except Untrusted:
            raise
        except Exception as err:
            raise Untrusted(
                f"the kernel's reply is not a plain answer ({type(err).__name__})"
            ) from None
        return _materialize(value, self, expr)


# The reply's format, written in the kernel and read in the grader. It has no references
# and no strides: every value is written out in full, so what the grader builds from a
# reply of n bytes is at most n bytes of data in at most MAX_NODES Python objects. After
# the magic, one value, which is one tag byte and then:
#   N T F                  None, True, False
#   i <u8 n> n bytes        an int (little-endian, signed)
#   s b  <u64 n> n bytes    a str (UTF-8), bytes
#   f <f64>  c <f64 f64>    a float, a complex
#   l u d  <u64 n> values   a list, a tuple, a dict (n keys, each followed by its value)
#   t <str> <shape> bytes   a tensor: dtype name, <u64 ndim> <u64 size>..., its elements
#   a A <str> <shape> bytes a NumPy array, a NumPy scalar (dtype.str, shape, elements)
#   o <str> <str>           a stand-in for another object: its type name and repr
#   k <list>                a callable, by its path (only when describing the answer)
MAGIC = b"attnbook-reply-1\n"
MAX_NODES = 2**20  # values in one answer's lists, tuples and dicts
TENSOR_DTYPES = (
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
) + ("float32", "float64", "complex64", "complex128")

# The code the grader sends into the kernel for each call: it evaluates the answer,
# calls it on the grader's inputs, and writes the result in the format above. Sizes are
# measured before anything is copied (a tensor's logical size is its numel times its
# element size, whatever its strides), so an answer over the limit is refused in the
# kernel with a message; the grader checks the same limits again on what arrives.
_KERNEL_SIDE = r"""
def __attnbook_answer__(expr, path, payload, measure, limit, max_nodes):
    import base64, pickle, struct
    import torch
    ns = globals()
    dtypes = @DTYPES@
    keys = (int, str)

    class Refused(Exception):
        pass

    def walk(x, where, depth, out, spent):
        # out None: count bytes and values only (nothing is copied); else write
        if depth > 50:
            raise Refused("your answer is nested more than 50 levels deep")
        spent[1] += 1
        if spent[1] > max_nodes:
            raise Refused(f"your answer holds more than {max_nodes:,} values in lists, "
                          "tuples and dicts; return a tensor instead")
        def put(*parts, size=None):
            spent[0] += sum(map(len, parts)) if size is None else size
            if out is not None:
                out.extend(parts)
        def blob(tag, data):
            put(tag, struct.pack("<Q", len(data)), data)
        def array(tag, dtype, shape, nbytes, data):
            put(tag)
            walk(dtype, where, depth + 1, out, spent)
            put(struct.pack("<Q", len(shape)), size=8 + 8 * len(shape) + nbytes)
            if out is not None:
                out.extend(struct.pack("<Q", int(n)) for n in shape)
                out.append(data())
        t = type(x)
        if x is None or t is bool:
            put({None: b"N", True: b"T", False: b"F"}[x])
        elif t is int:
            data = x.to_bytes(x.bit_length() // 8 + 1, "little", signed=True)
            if len(data) > 255:
                raise Refused("your answer holds an integer of over 2,000 bits")
            put(b"i", bytes([len(data)]), data)
        elif t is float:
            put(b"f", struct.pack("<d", x))
        elif t is complex:
            put(b"c", struct.pack("<dd", x.real, x.imag))
        elif t is str:
            blob(b"s", x.encode("utf-8", "replace"))
        elif t is bytes:
            blob(b"b", x)
        elif t in (list, tuple) or (t is dict and all(type(k) in keys for k in x)):
            put({list: b"l", tuple: b"u", dict: b"d"}[t], struct.pack("<Q", len(x)))
            for k, v in x.items() if t is dict else enumerate(x):
                if t is dict:
                    walk(k, where, depth + 1, out, spent)
                walk(v, (*where, k) if depth else where, depth + 1, out, spent)
        elif isinstance(x, torch.Tensor) and x.layout == torch.strided \
                and not x.is_meta and str(x.dtype)[6:] in dtypes:
            def data():
                y = x.detach().as_subclass(torch.Tensor).cpu()
                y = y.resolve_conj().resolve_neg().contiguous().reshape(-1)
                return y.view(torch.uint8).numpy().tobytes() if y.numel() else b""
            # the logical size: numel times element size, whatever the strides
            nbytes = x.numel() * x.element_size()
            array(b"t", str(x.dtype)[6:], tuple(x.shape), nbytes, data)
        elif t.__module__ == "numpy" and getattr(getattr(x, "dtype", None), "kind",
                                                 "") in tuple("biufc"):
            import numpy
            array(b"a" if t.__name__ == "ndarray" else b"A", x.dtype.str,
                  numpy.shape(x), int(x.nbytes),
                  lambda: numpy.ascontiguousarray(x).tobytes())
        elif payload is None and callable(x):
            put(b"k")
            walk(list(where), where, depth + 1, out, spent)
        else:
            try:
                text = repr(x)[:200]
            except Exception:
                text = ""
            put(b"o")
            walk(t.__name__[:60], where, depth + 1, out, spent)
            walk(text, where, depth + 1, out, spent)

    def write(reply):
        spent = [0, 0]
        walk(reply, (), 0, None, spent)  # measure first
        if spent[0] > limit:
            raise Refused(f"your answer is {spent[0] / 2**20:,.0f} MB of data; the "
                          f"grader takes at most {limit / 2**20:.0f} MB")
        out = [@MAGIC@]
        walk(reply, (), 0, out, [0, 0])
        return b"".join(out)

    try:
        obj = eval(expr, ns)
        for key in path:
            obj = obj[key]
        if payload is None:
            result = obj
        else:
            args, kwargs = pickle.loads(base64.b64decode(payload))
            if measure:
                from attnbook.utils import largest_new_tensor
                result = largest_new_tensor(obj, *args, **kwargs)
            else:
                result = obj(*args, **kwargs)
        data = write({"ok": result})
    except BaseException as err:
        if isinstance(err, KeyboardInterrupt):
            raise
        try:
            message = str(err)[:2000]
        except Exception:
            message = ""
        name = "ValueError" if isinstance(err, Refused) else type(err).__name__
        data = write({"raised": str(name)[:60], "message": message})
    return base64.b64encode(data).decode()
""".replace("@DTYPES@", repr(TENSOR_DTYPES)).replace("@MAGIC@", repr(MAGIC))


def _text(self) -> str:
    return self.text


class _Callable:
    """A callable in the described answer, at ``path``; a :class:`RemoteFunction`
    once materialized."""

    def __init__(self, path: tuple):
        self.path = path


class _Reader:
    """Reads one reply (:data:`MAGIC` and the format above), checking as it goes that
    it holds at most ``limit`` bytes of data in at most :data:`MAX_NODES` values, and
    only the kinds the format has."""

    def __init__(self, data: bytes, limit: int):
        self.data, self.pos, self.limit, self.nodes = memoryview(data), 0, limit, 0
        self.kinds: dict[str, type] = {}  # the stand-ins' classes, by type name

    def take(self, n: int) -> bytes:
        if n < 0 or n > len(self.data) - self.pos:
            raise Untrusted("the kernel's reply is cut short")
        chunk = self.data[self.pos : self.pos + n].tobytes()
        self.pos += n
        return chunk

    def u64(self) -> int:
        import struct

        return struct.unpack("<Q", self.take(8))[0]

    def text(self) -> str:
        if self.take(1) != b"s":
            raise Untrusted("the kernel's reply has the wrong form")
        return self.take(self.u64()).decode("utf-8", "replace")

    def shape(self, itemsize: int) -> tuple[tuple[int, ...], int]:
        ndim = self.u64()
        if ndim > 32:
            raise Untrusted(f"the answer has {ndim} dimensions")
        shape = tuple(self.u64() for _ in range(ndim))
        nbytes = itemsize
        for n in shape:
            nbytes *= n
        if nbytes > self.limit:  # its logical size, before anything is built
            raise Untrusted(
                f"the answer is {nbytes / 2**20:,.0f} MB of data; the grader takes at "
                f"most {self.limit / 2**20:.0f} MB"
            )
        return shape, nbytes

    def value(self, depth: int = 0):
        import struct

        import numpy
        import torch

        self.nodes += 1
        if depth > 50 or self.nodes > MAX_NODES:
            raise Untrusted("the answer is nested too deeply or holds too many values")
        tag = self.take(1)
        if tag in (b"N", b"T", b"F"):
            return {b"N": None, b"T": True, b"F": False}[tag]
        if tag == b"i":
            return int.from_bytes(self.take(self.take(1)[0]), "little", signed=True)
        if tag == b"f":
            return struct.unpack("<d", self.take(8))[0]
        if tag == b"c":
            return complex(*struct.unpack("<dd", self.take(16)))
        if tag == b"s":
            return self.take(self.u64()).decode("utf-8", "replace")
        if tag == b"b":
            return self.take(self.u64())
        if tag in (b"l", b"u", b"d"):
            n = self.u64()
            if n > len(self.data) - self.pos:  # every value takes a byte at least
                raise Untrusted("the kernel's reply is cut short")
            if tag == b"d":
                items = {}
                for _ in range(n):
                    key = self.value(depth + 1)
                    if type(key) not in (str, int):
                        raise Untrusted("the answer has a dict key that is not plain")
                    items[key] = self.value(depth + 1)
                return items
            values = [self.value(depth + 1) for _ in range(n)]
            return values if tag == b"l" else tuple(values)
        if tag == b"t":
            name = self.text()
            if name not in TENSOR_DTYPES:
                raise Untrusted(f"a tensor of dtype {name[:30]!r} is not plain data")
            dtype = getattr(torch, name)
            shape, nbytes = self.shape(torch.empty((), dtype=dtype).element_size())
            data = self.take(nbytes)
            if not nbytes:
                return torch.empty(shape, dtype=dtype)
            flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            return flat.view(dtype).reshape(shape)
        if tag in (b"a", b"A"):
            name = self.text()
            if not re.fullmatch(r"[<>|=]?[biufc][0-9]{1,2}", name):
                raise Untrusted(f"a NumPy answer of dtype {name[:30]!r} is not plain")
            dtype = numpy.dtype(name)
            shape, nbytes = self.shape(dtype.itemsize)
            array = numpy.frombuffer(self.take(nbytes), dtype=dtype).reshape(shape)
            return array.copy() if tag == b"a" else array[()]
        if tag == b"o":
            name = re.sub(r"\W", "_", self.text())[:60] or "object"
            if name not in self.kinds and len(self.kinds) >= 100:
                raise Untrusted("the answer holds objects of over 100 types")
            kind = self.kinds.setdefault(name, type(name, (), {"__repr__": _text}))
            stand_in = kind()
            stand_in.text = self.text()[:200]
            return stand_in
        if tag == b"k":
            path = self.value(depth + 1)
            if not isinstance(path, list):
                raise Untrusted("the kernel's reply has the wrong form")
            return _Callable(tuple(path))
        raise Untrusted("the kernel's reply has the wrong form")


def _decode(data: bytes, limit: int = MAX_REPLY):
    """The kernel's reply as plain data: a dict ``{"ok": answer}`` or ``{"raised":
    name, "message": text}``, read by :class:`_Reader` (no pickle, no code, nothing
    larger than ``limit`` bytes, tensors built contiguous from the bytes sent)."""
    if len(data) > limit + len(MAGIC) or not data.startswith(MAGIC):
        raise Untrusted("the kernel's reply is not in the grader's format")
    reader = _Reader(data, limit)
    reader.take(len(MAGIC))
    reply = reader.value()
    if reader.pos != len(data):
        raise Untrusted("the kernel's reply has bytes after its end")
    if not isinstance(reply, dict) or not ({"ok"} == set(reply) or "raised" in reply):
        raise Untrusted("the kernel's reply has the wrong form")
    return reply


def _materialize(reply: dict, session: KernelSession, expr: str):
    if "raised" in reply:
        name = re.sub(r"\W", "_", str(reply["raised"]))[:60] or "Exception"
        message = str(reply.get("message", ""))[:2000]
        if name == "NotImplementedError":
            raise NotImplementedError(message)
        if name == "AssertionError":
            raise AssertionError(message)
        raise type(name, (Exception,), {})(message)

    def build(x):
        if isinstance(x, _Callable):
            return RemoteFunction(session, expr, x.path)
        if type(x) in (list, tuple):
            return type(x)(build(v) for v in x)
        if type(x) is dict:
            return {k: build(v) for k, v in x.items()}
        return x

    return build(reply["ok"])


class RemoteFunction:
    """The grader's stand-in for a function the student defined in the kernel: calling
    it sends the arguments there and returns the decoded result."""

    def __init__(self, session: KernelSession, expr: str, path: tuple = ()):
        self._session, self._expr, self._path = session, expr, path

    def __call__(self, *args, **kwargs):
        return self._session.call(self._expr, self._path, args, kwargs)

    def largest_new_tensor(self, *args) -> int:
        """:func:`attnbook.utils.largest_new_tensor` of the call, measured in the
        kernel."""
        value = self._session.call(self._expr, self._path, args, {}, measure=True)
        if not isinstance(value, int) or isinstance(value, bool):
            raise Untrusted("the kernel's memory measurement is not an int")
        return value

    def __repr__(self) -> str:
        index = "".join(f"[{key!r}]" for key in self._path)
        return f"<your {self._expr}{index}>"


# --------------------------------------------------------------------------------------
# 3. Grade one notebook
# --------------------------------------------------------------------------------------
def _row(label, passed, status, message) -> dict:
    return {"label": label, "passed": int(passed), "status": status, "message": message}


def grade_notebook(
    path,
    chapter: Chapter,
    limits: sandbox.Limits | None = None,
    isolation: str = "none",
) -> list[dict]:
    """Grade the submission at ``path`` against ``chapter``: rows ``{"notebook",
    "label", "passed" (0/1), "status", "message"}``, one per check of the chapter, in
    its order, plus rows labelled ``"*"`` about the whole notebook. Never raises for
    anything the submission does.

    ``status`` is ``passed``, ``failed``, ``not run`` (the check could not run: the
    answer is undefined, or the kernel died before it), or ``untrusted`` (the kernel's
    reply could not be read as an answer, or the answer cell reaches for the grading
    machinery); ``*`` rows are ``error`` (the notebook did not run to the end) or
    ``note``. ``isolation`` (``"bwrap"`` or ``"none"``) is where the kernel runs; every
    row says it.
    """
    from .checks import run_check

    nbformat = _require("nbformat")
    limits = limits or sandbox.Limits()
    path = Path(path)
    rows: dict[str, dict] = {}
    extra: list[dict] = []

    def finish() -> list[dict]:
        for label in chapter.labels:
            rows.setdefault(label, _row(label, 0, "not run", NOT_RUN))
        ordered = [rows[label] for label in chapter.labels] + extra
        return [
            {"notebook": path.name, **row, "isolation": isolation} for row in ordered
        ]

    try:
        if path.is_symlink():
            raise ValueError("it is a link, not a file")
        if path.stat().st_size > 50 * 2**20:
            raise ValueError("it is larger than 50 MB")
        submission = nbformat.read(path, as_version=4)
        if not isinstance(submission.get("cells"), list):
            raise ValueError("it has no cells")
    except Exception as err:
        extra.append(
            _row(NOTEBOOK, 0, "error", f"not a notebook that can be read: {err}"[:300])
        )
        return finish()
    try:
        steps, notes, tampering = rebuild(chapter, submission)
    except Exception as err:
        extra.append(_row(NOTEBOOK, 0, "error", f"could not match its cells: {err}"))
        return finish()
    extra += [_row(NOTEBOOK, 0, "note", note) for note in notes]
    if tampering:
        why = "; ".join(tampering)
        for label in chapter.labels:
            rows[label] = _row(
                label,
                0,
                "untrusted",
                f"not scored: {why}. The instructor reviews this notebook by hand.",
            )
        return finish()

    answer_errors: dict[str, str] = {}
    used = answer_references(steps)
    kernel_checks = [s for s in steps if s.kind == "check" and kernel_check(s.code)]
    notebook_checks = any(s.kind == "check" and s not in kernel_checks for s in steps)
    with sandbox.process_guard(limits.processes, limits.memory_together) as guard:
        try:
            # the notebook runs for its checks; the kernel lab's have a worker
            if notebook_checks or not kernel_checks:
                with KernelSession(limits, guard, isolation) as kernel:
                    for step in steps:
                        if step in kernel_checks:
                            continue
                        if step.kind != "check":
                            try:
                                run = kernel.run(step.code)
                            except CallTimeout as err:
                                why = f"the cell {err}; it was interrupted"
                                run = CellRun(error=why)
                            if step.kind == "answer" and run.error:
                                answer_errors[step.label] = run.error
                            continue
                        rows[step.label] = _check(
                            kernel,
                            step,
                            run_check,
                            answer_errors.get(step.label),
                            used.get(step.label, set()),
                        )
        except KernelGone as err:
            extra.append(_row(NOTEBOOK, 0, "error", str(err)))
        except Exception as err:  # the grader's own failure: say so, never abort
            extra.append(
                _row(
                    NOTEBOOK, 0, "error", f"grading failed: {type(err).__name__}: {err}"
                )
            )
    if kernel_checks:
        answers = [s.code for s in steps if s.kind == "answer"]
        with sandbox.process_guard(limits.processes, limits.memory_together) as guard:
            try:
                _grade_kernels(answers, kernel_checks, limits, guard, isolation, rows)
            except KernelGone as err:
                extra.append(_row(NOTEBOOK, 0, "error", f"the kernels' worker: {err}"))
            except Exception as err:
                extra.append(
                    _row(
                        NOTEBOOK,
                        0,
                        "error",
                        f"grading the kernels failed: {type(err).__name__}: {err}",
                    )
                )
    return finish()


# What the grader runs in the kernels' worker before any check: the book's launchers,
# then the submission's kernels, defined from the text kernel_source allowed.
_WORKER_SETUP = """
import functools
from attnbook.kernels import lab
globals().update(lab.define_kernels({source!r}))
"""


def _grade_kernels(
    answers, checks, limits, guard, isolation, rows: dict | None = None
) -> dict[str, dict]:
    """Add to ``rows`` (a new dict by default) and return them: the rows of the kernel
    checks ``checks``, the answer cells' kernels, read by :func:`kernel_source`, defined
    in a fresh kernel of their own (the worker) and checked there through the book's
    launchers, each call from this process like any other check's. Raises
    :class:`KernelGone`, with the rows it has, once the notebook's time is up."""
    from .checks import run_check

    rows = {} if rows is None else rows
    try:
        source = kernel_source(answers)
    except ImportError as err:
        rows.update(
            {s.label: _row(s.label, 0, "not run", f"{NOT_RUN}: {err}") for s in checks}
        )
        return rows
    wanted = []
    for step in checks:
        _, name = kernel_check(step.code)
        if name in source.refused:
            why = source.refused[name]
            rows[step.label] = _row(
                step.label,
                0,
                "failed",
                f"your kernel {name} is not Triton code the grader can run: "
                f"{why}"[:600],
            )
        elif name not in source.defined:
            rows[step.label] = _row(
                step.label,
                0,
                "not run",
                f"{NOT_RUN}: your answer cells define no @triton.jit function named "
                f"{name}",
            )
        else:
            wanted.append(step)
    deadline = time.monotonic() + limits.notebook_timeout
    worker: KernelSession | None = None
    try:
        for step in wanted:
            # A check whose call ends the worker (a kernel that ignores the interrupt,
            # or runs out of memory) fails alone: the next check gets a fresh worker.
            # The first death may be the machine's, so that check runs once more.
            for attempt in (1, 2):
                try:
                    if worker is None:
                        worker = KernelSession(limits, guard, isolation, deadline)
                        worker.start()
                        setup = worker.run(_WORKER_SETUP.format(source=source.text))
                    if setup.error:
                        rows[step.label] = _row(
                            step.label,
                            0,
                            "failed",
                            f"your kernels could not be defined: {setup.error}",
                        )
                    else:
                        rows[step.label] = _check(worker, step, run_check, None)
                    break
                except KernelGone as err:
                    worker.close()
                    worker = None
                    if attempt == 2 or time.monotonic() >= deadline:
                        rows[step.label] = _row(
                            step.label, 0, "failed", f"your kernel stopped: {err}"
                        )
                        if time.monotonic() >= deadline:
                            raise
    finally:
        if worker is not None:
            worker.close()
    return rows


def answer_references(steps: list[Step]) -> dict[str, set[str]]:
    """For each label, the qualified attnbook names its answer cells use, read from
    their source by :func:`attnbook.course.checks.library.references` with the
    cells that run before each (the book's and the earlier answers) as its setup:
    what the check's library policy is held to. An answer cell the reading cannot
    take apart uses nothing it can name (the tampering detector reports what it
    cannot read)."""
    from .checks.library import references

    seen: list[str] = []
    found: dict[str, set[str]] = {}
    for step in steps:
        if step.kind == "answer":
            try:
                used = references(step.code, seen)
            except Exception:  # noqa: BLE001 - never the grader's crash
                used = set()
            found.setdefault(step.label, set()).update(used)
        if step.kind in ("code", "answer"):
            seen.append(step.code)
    return found


def _check(
    kernel: KernelSession,
    step: Step,
    run_check,
    answer_error,
    references: set[str] = frozenset(),
) -> dict:
    """Run the check of ``step`` in this process on the kernel's answer; the answer
    uses the attnbook names ``references`` (:func:`answer_references`)."""
    label = step.label
    try:
        try:
            student = kernel.call(step.code, ())
        except (NotImplementedError, AssertionError):
            raise
        except Exception as err:
            where = f"; your answer cell raised {answer_error}" if answer_error else ""
            return _row(
                label,
                0,
                "not run",
                f"{NOT_RUN}: {type(err).__name__}: {err}{where}"[:500],
            )
        result = run_check(label, student, references=set(references))
        status = "passed" if result.passed else "failed"
        return _row(label, result.passed, status, result.message)
    except CallTimeout as err:
        return _row(label, 0, "failed", f"your answer {err} on the check's inputs")
    except Untrusted as err:
        return _row(label, 0, "untrusted", f"could not be trusted: {err}")
    except (NotImplementedError, AssertionError) as err:
        return _row(label, 0, "failed", str(err) or type(err).__name__)


# --------------------------------------------------------------------------------------
# 4. Many submissions: rows, CSV, feedback, gradebook
# --------------------------------------------------------------------------------------
def _submissions(paths, chapters=()) -> list[tuple[str, Path, str]]:
    """``(student, notebook path, notebook name)`` for every submitted notebook.

    A directory is searched recursively (links are not followed): a notebook in a
    sub-folder belongs to the student named by the first folder below the given
    directory (``ada/attention.ipynb``). A notebook directly in it, or given as a file,
    belongs to the student its name gives: ``ada_attention.ipynb`` or
    ``ada-attention.ipynb`` (the form in which Canvas and Moodle download
    submissions) is ada's ``attention.ipynb`` when ``attention.ipynb`` is one of
    ``chapters``; any other name is its own student.
    """

    def loose(path: Path) -> tuple[str, Path, str]:
        for chapter in sorted(chapters, key=len, reverse=True):
            for sep in ("_", "-"):
                if (
                    path.name.endswith(sep + chapter)
                    and len(path.name) > len(chapter) + 1
                ):
                    return path.name[: -len(chapter) - 1], path, chapter
        return path.stem, path, path.name

    found = []
    for given in map(Path, paths):
        if given.is_file():
            found.append(loose(given))
        elif given.is_dir():
            for folder, dirs, files in os.walk(given):
                dirs[:] = sorted(d for d in dirs if d != ".ipynb_checkpoints")
                for name in sorted(files):
                    if not name.endswith(".ipynb"):
                        continue
                    path = Path(folder) / name
                    rel = path.relative_to(given)
                    if len(rel.parts) > 1:
                        found.append(
                            (rel.parts[0], path, Path(*rel.parts[1:]).as_posix())
                        )
                    else:
                        found.append(loose(path))
        else:
            raise FileNotFoundError(f"submission {str(given)!r} does not exist")
    return found


def load_chapters(book_dir) -> dict[str, Chapter]:
    """Every ``book_dir/*.ipynb`` as a :class:`Chapter`, read once, before any student
    code runs (a submission that writes into the book cannot change this run)."""
    nbformat = _require("nbformat")
    book_dir = Path(book_dir)
    notebooks = sorted(book_dir.glob("*.ipynb"))
    if not notebooks:
        raise ValueError(f"book_dir {str(book_dir)!r} has no *.ipynb notebooks")
    return {
        p.name: Chapter.from_notebook(nbformat.read(p, as_version=4), p.name)
        for p in notebooks
    }


def grade(
    paths,
    out_csv="grades.csv",
    *,
    book_dir="book",
    limits: sandbox.Limits | None = None,
    jobs: int = 1,
    isolation: str = "auto",
    feedback_dir=None,
    gradebook=None,
    progress=None,
) -> list[dict]:
    """Grade every submitted notebook under ``paths`` against the chapters in
    ``book_dir``; write the per-check CSV ``out_csv``, one feedback file per student
    (``feedback_dir``, default ``feedback/`` beside the CSV) and the gradebook
    (``gradebook``, default ``gradebook.csv`` beside it).

    ``paths`` are notebook files or directories (see ``_submissions``). ``jobs``
    notebooks are graded at once. Each row is ``{"student", "notebook", "label",
    "passed", "status", "message", "isolation"}`` (see
    :func:`grade_notebook`). A notebook whose name is not a chapter's
    gets one ``*`` row saying so. The inputs of every check are
    drawn from one fresh secret seed for the whole run.

    ``isolation`` is ``"auto"`` (the bubblewrap sandbox where it works, else none),
    ``"bwrap"`` (refuse to grade without it) or ``"none"``; see
    :func:`attnbook.course.grader.isolation_for`.
    """
    from .checks.common import fresh_inputs

    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
    isolation = isolation_for(isolation)
    chapters = load_chapters(book_dir)
    submissions = _submissions(paths, chapters)
    out_csv = Path(out_csv)
    lock, done = threading.Lock(), [0]

    def one(item) -> list[dict]:
        student, path, notebook = item
        chapter = chapters.get(Path(notebook).name)
        if chapter is None:
            rows = [
                {
                    "notebook": notebook,
                    **_row(
                        NOTEBOOK,
                        0,
                        "error",
                        f"no chapter of the book is named {Path(notebook).name!r}: "
                        "not graded",
                    ),
                    "isolation": isolation,
                }
            ]
        else:
            rows = grade_notebook(path, chapter, limits, isolation)
        with lock:
            done[0] += 1
            if progress:
                progress(done[0], len(submissions), student, notebook)
        return [{"student": student, **row, "notebook": notebook} for row in rows]

    with fresh_inputs(), ThreadPoolExecutor(max_workers=jobs) as pool:
        rows = [row for rows in pool.map(one, submissions) for row in rows]
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    with out_csv.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows({k: _cell(v) for k, v in row.items()} for row in rows)
    write_feedback(
        rows, out_csv.parent / "feedback" if feedback_dir is None else feedback_dir
    )
    write_gradebook(
        rows,
        chapters,
        out_csv.parent / "gradebook.csv" if gradebook is None else gradebook,
    )
    return rows


def isolation_for(wanted: str = "auto") -> str:
    """The isolation to grade with: ``"bwrap"`` where the sandbox works (always for
    ``wanted="bwrap"``, or an error saying how to get it), else ``"none"``."""
    if wanted not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {ISOLATIONS}, got {wanted!r}")
    if wanted == "none":
        return "none"
    if sandbox.bwrap_works():
        return "bwrap"
    if wanted == "bwrap":
        raise ValueError(
            "the sandbox is required but bubblewrap does not work here (Linux only: "
            "apt-get install bubblewrap, and user namespaces must be allowed); see the "
            "instructor guide for Docker and nbgrader"
        )
    return "none"


def _cell(value):
    """A CSV cell that a spreadsheet will not run as a formula."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def _feedback_name(student: str) -> str:
    """A safe file name for ``student``'s feedback: letters, digits, ``.``, ``_`` and
    ``-`` only."""
    return (re.sub(r"[^\w.-]+", "_", student).strip("._") or "student") + ".md"


def write_feedback(rows: list[dict], feedback_dir) -> list[Path]:
    """Write ``feedback_dir/<student>.md`` for every student in ``rows`` (the rows
    :func:`grade` returns).

    Each file says, per notebook, how many checks passed and, for every check, its
    verdict with the check's message and hint; what stopped a notebook, what was
    ignored, and any check that could not be trusted come first. Returns the paths
    written.
    """
    from .. import __version__

    feedback_dir = Path(feedback_dir)
    feedback_dir.mkdir(parents=True, exist_ok=True)
    written, names = [], {}
    for student in dict.fromkeys(row["student"] for row in rows):
        mine = [row for row in rows if row["student"] == student]
        checks = [row for row in mine if row["label"] != NOTEBOOK]
        lines = [
            f"# Feedback for {student}",
            "",
            f"{sum(int(r['passed']) for r in checks)} of {len(checks)} checks passed "
            f"(graded with attnbook {__version__}: your answer cells ran in the book's "
            "notebook, in a fresh kernel, and the checks ran on new inputs).",
            "",
        ]
        for notebook in dict.fromkeys(row["notebook"] for row in mine):
            rows_nb = [row for row in mine if row["notebook"] == notebook]
            checks_nb = [row for row in rows_nb if row["label"] != NOTEBOOK]
            lines += [
                f"## {notebook}: "
                f"{sum(int(r['passed']) for r in checks_nb)}/{len(checks_nb)} checks "
                "passed",
                "",
            ]
            for row in rows_nb:
                if row["label"] == NOTEBOOK and row["status"] == "error":
                    lines.append(
                        f"- **The notebook did not run to the end**: {row['message']}. "
                        "Checks after that point could not run; run it top to bottom "
                        "yourself (Restart & Run All) to see where it stops."
                    )
                elif row["label"] == NOTEBOOK:
                    lines.append(f"- Note: {row['message']}.")
            for row in checks_nb:
                verdict = {"passed": "PASSED", "untrusted": "UNTRUSTED"}.get(
                    row["status"], "FAILED"
                )
                lines.append(f"- `[{verdict}] {row['label']}`: {row['message']}")
            lines.append("")
        name = _feedback_name(student)
        names[name] = names.get(name, 0) + 1
        if names[name] > 1:  # two names that sanitize alike keep separate files
            name = f"{name[:-3]}-{names[name]}.md"
        path = feedback_dir / name
        path.write_text("\n".join(lines))
        written.append(path)
    return written


def write_gradebook(rows: list[dict], chapters: dict[str, Chapter], path) -> Path:
    """Write the gradebook CSV: one row per student, one column of points per chapter
    graded (named after the chapter and its maximum, ``attention (3)``), and ``Total``.

    The first column is ``Student``, the name of the student's folder: Canvas and
    Moodle import a CSV with an identifier column plus one column per assignment (map
    ``Student`` to the login or ID field when importing). A chapter a student did not
    submit is empty; a cell never starts with ``=``, ``+``, ``-`` or ``@``.
    """
    graded = [n for n in chapters if any(Path(r["notebook"]).name == n for r in rows)]
    header = ["Student"]
    for name in graded:
        header.append(
            f"{Path(name).stem} ({_points(sum(chapters[name].points.values()))})"
        )
    header.append(
        f"Total ({_points(sum(sum(chapters[n].points.values()) for n in graded))})"
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for student in dict.fromkeys(row["student"] for row in rows):
            line, total = [_cell(student)], 0.0
            for name in graded:
                mine = [
                    r
                    for r in rows
                    if r["student"] == student
                    and Path(r["notebook"]).name == name
                    and r["label"] != NOTEBOOK
                ]
                if not mine:
                    line.append("")
                    continue
                got = sum(
                    chapters[name].points.get(r["label"], 0)
                    for r in mine
                    if int(r["passed"])
                )
                total += got
                line.append(_points(got))
            line.append(_points(total))
            writer.writerow(line)
    return path


def _points(value: float) -> str:
    return f"{value:g}"


def summary(rows: list[dict]) -> str:
    """The isolation the kernels ran in, then one line per student: checks passed out
    of checks expected, and failed runs."""
    kinds = sorted({row.get("isolation", "none") for row in rows}) or ["none"]
    lines = [f"isolation: {', '.join(kinds)}"]
    if "none" in kinds:
        lines[0] += (
            " (no sandbox: the submissions' code could read and write what your user "
            "can; see the instructor guide)"
        )
    for student in dict.fromkeys(row["student"] for row in rows):
        mine = [row for row in rows if row["student"] == student]
        checks = [row for row in mine if row["label"] != NOTEBOOK]
        broken = sorted(
            {
                r["notebook"]
                for r in mine
                if r["label"] == NOTEBOOK and r["status"] == "error"
            }
        )
        untrusted = sum(1 for r in checks if r["status"] == "untrusted")
        passed = sum(r["passed"] for r in checks)
        line = f"  {student}: {passed}/{len(checks)} checks passed"
        if untrusted:
            line += f"; {untrusted} untrusted"
        if broken:
            line += f"; did not finish: {', '.join(broken)}"
        lines.append(line)
    return "\n".join(lines)
