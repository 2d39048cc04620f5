"""Whether an exercise's answer may use attnbook's own implementation, and whether
it does.

Every check says, with ``register(..., library=...)``, what its exercise allows: a
:class:`Library` policy made by :func:`allowed` (a number, a measurement, or a use of
the library: calling attnbook is fine) or by :func:`forbid` (the exercise exists to
write a mechanism that attnbook implements: the answer may not use the functions and
classes that implement it). Building blocks that the book's own solution uses stay
allowed, such as :func:`attnbook.core.scaled_dot_product_attention` in the multi-head
exercise.

Two readings find what an answer uses, and :func:`violations` compares it with the
policy:

- :func:`references` reads the *source* of an answer cell (its syntax tree, never its
  text), with the names that the cells run before it bound: the grader's reading, since
  the answer itself lives in a student's kernel, out of the grader's reach;
- :func:`code_references` reads a *function's compiled code* and its globals: the
  reading of :func:`attnbook.course.checks.check` in a reader's own notebook.

Both are best effort, and both err on the side of counting: computed access that
reaches attnbook by a name neither can read (``getattr(core, name)``,
``importlib.import_module(name)``, ``sys.modules[name]``, ``globals()``, ``eval`` of a
string built at run time) counts as a use of everything in the module it reaches, or
in ``attnbook`` when that module is unknown. Neither sees an answer that copies the
library's source into itself, nor a call through an object that the answer was handed
(the multi-head exercise's layer) or that other cells built, when the policy does not
name its class: those need a trace of the calls, which the grader cannot take in the
student's kernel. :func:`policy_table` lists, per exercise, what is forbidden and what
is not detected; the grading page's trust model (``book/grading.md``) shows that table.
"""

from __future__ import annotations

import ast
import builtins
import dis
import functools
import inspect
import sys
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Library",
    "allowed",
    "forbid",
    "references",
    "code_references",
    "violations",
    "message",
    "policy_table",
    "NEVER_COUNTED",
]

_ROOT = "attnbook"
_PACKAGE_DIR = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------------------
# The policy
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Library:
    """What an exercise's answer may use of attnbook.

    ``forbidden`` holds qualified names of attnbook objects (``"attnbook.core.
    masked_softmax"``, a class such as ``"attnbook.models.RMSNorm"``, which covers its
    methods) or modules (``"attnbook.positional"``: everything in it; ``"attnbook"``:
    all of it); empty, the answer may use anything. ``why`` is one sentence: what the
    exercise asks the student to write, or why using the library is fine. ``harness``
    names attnbook objects that the book's check cell itself wraps the answer in (the
    kernel lab's launchers), which never count against it; ``gaps`` says what the
    readings miss in this exercise beyond what they miss everywhere (see
    :func:`policy_table`).
    """

    forbidden: tuple[str, ...] = ()
    why: str = ""
    harness: tuple[str, ...] = ()
    gaps: str = ""

    def __post_init__(self) -> None:
        for name in (*self.forbidden, *self.harness):
            if not isinstance(name, str) or not _in_attnbook(name):
                raise ValueError(
                    f"Library: {name!r} is not a qualified attnbook name "
                    "(attnbook.module.object)"
                )
        if not isinstance(self.why, str) or not self.why.strip():
            raise ValueError("Library: why= must say in one sentence why")

    @property
    def allows_library(self) -> bool:
        """Whether the answer may use anything in attnbook."""
        return not self.forbidden


def allowed(why: str, *, gaps: str = "") -> Library:
    """A policy under which the answer may call anything in attnbook; ``why`` says why
    that is fine (the exercise asks for a number, a measurement, or a use of the
    library)."""
    return Library((), why, (), gaps)


def forbid(
    *names: str, why: str, harness: Sequence[str] = (), gaps: str = ""
) -> Library:
    """A policy under which an answer that uses any of ``names`` (qualified attnbook
    names, or modules) scores 0; ``why`` says what the exercise asks to write."""
    if not names:
        raise ValueError("forbid: name at least one attnbook function, class or module")
    return Library(tuple(names), why, tuple(harness), gaps)


#: The parts of attnbook that no policy counts as using the library, the course kit
#: (``check``, ``run_check``, the grader) and the tools every chapter uses around its
#: code.
NEVER_COUNTED = (
    "attnbook.exercises",
    "attnbook.course",
    "attnbook.grader",
    "attnbook.sandbox",
    "attnbook.utils",
    "attnbook.viz",
)


def _in_attnbook(name: str) -> bool:
    return name == _ROOT or name.startswith(_ROOT + ".")


def _within(name: str, container: str) -> bool:
    """``name`` is ``container`` or inside it (``a.b.c`` is within ``a.b``)."""
    return name == container or name.startswith(container + ".")


def _homes(name: str, *, contents: bool = True) -> set[str]:
    """The qualified names under which what ``name`` names is defined: ``name``, where
    attnbook defines it (``attnbook.flash.merge_partials`` may live in another module
    and be re-exported), and for a module (with ``contents``) every function and
    class its ``__all__`` lists."""
    homes = {name}
    canonical = _canonical(name)
    if canonical is not None:
        homes.add(canonical)
    module = sys.modules.get(name)
    if contents and isinstance(module, types.ModuleType) and name != _ROOT:
        for attr in getattr(module, "__all__", ()):
            defined = _name_of(inspect.getattr_static(module, attr, None))
            if defined is not None:
                homes.add(defined)
    return homes


def _forbidding(policy: Library, name: str) -> list[str]:
    """The policy's forbidden names that ``name`` uses (is, or is inside)."""
    return [
        f
        for f in policy.forbidden
        if any(_within(name, home) for home in _homes(f))
    ]


def violations(policy: Library, names: Iterable[str]) -> list[str]:
    """The names among ``names`` (what an answer uses, from :func:`references` or
    :func:`code_references`) that ``policy`` forbids, sorted: a forbidden name, or
    something inside a forbidden module or class, or a module (or class) that holds a
    forbidden name, which only computed access leaves as a use (``getattr(core,
    name)``). Names are compared where attnbook defines them, so a re-export is the
    object it re-exports. The policy's ``harness`` never counts, nor do the course kit
    and the reader's tools (:data:`NEVER_COUNTED`): an answer cell that tries a check,
    or seeds a generator, uses no mechanism."""
    harness = set().union(*(_homes(h, contents=False) for h in policy.harness))
    harness |= set(NEVER_COUNTED)
    forbidden = set().union(*(_homes(f) for f in policy.forbidden))
    found = set()
    for name in names:
        if any(_within(name, h) for h in harness):
            continue
        if any(_within(name, f) or _within(f, name) for f in forbidden):
            found.add(name)
    return sorted(found)


def message(policy: Library, found: Sequence[str]) -> str:
    """The feedback for an answer that uses ``found`` (from :func:`violations`), which
    ``policy`` forbids: what it used, and why the exercise does not allow it."""
    direct, reached, held = [], [], set()
    for name in found:
        hit = _forbidding(policy, name)
        if hit:  # shown as the policy names it, when it is that object itself
            same = [f for f in hit if name in _homes(f, contents=False)]
            direct.append(same[0] if same else name)
        else:
            reached.append(name)
            held |= {
                f
                for f in policy.forbidden
                if any(_within(home, name) for home in _homes(f))
            }
    parts = []
    if direct:
        parts.append(f"your answer uses {_listed(sorted(set(direct)))}")
    if reached:
        parts.append(
            f"your answer reaches {_listed(reached)} by a name computed while it runs "
            "(getattr, importlib, __import__, sys.modules, globals(), eval or exec), "
            f"and that holds {_listed(sorted(held))}"
        )
    return (
        f"{' and '.join(parts)}, which this exercise does not allow: {policy.why} "
        "Write it yourself; an answer that uses the library's own implementation "
        "scores 0."
    )


def _listed(names: Sequence[str]) -> str:
    shown = list(names[:4]) + ([f"{len(names) - 4} more"] if len(names) > 4 else [])
    return ", ".join(shown[:-1]) + " and " + shown[-1] if len(shown) > 1 else shown[0]


# --------------------------------------------------------------------------------------
# Names of attnbook objects, without importing anything
# --------------------------------------------------------------------------------------
def _name_of(obj) -> str | None:
    """The qualified name of ``obj`` if attnbook defines it (a module, function, class,
    method or Triton kernel), else ``None``. Reads an arbitrary object's attributes
    without running its code (no ``__getattr__``, no properties)."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, types.ModuleType):
        name = getattr(obj, "__name__", "")
        return name if isinstance(name, str) and _in_attnbook(name) else None
    if isinstance(obj, _NAMED_KINDS):
        module = getattr(obj, "__module__", None)
        qualname = getattr(obj, "__qualname__", None)
    else:  # an instance that names itself, as a Triton kernel does: its own __dict__
        own = _own_dict(obj)
        module, qualname = own.get("__module__"), own.get("__qualname__")
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    return f"{module}.{qualname}" if _in_attnbook(module) else None


_NAMED_KINDS = (
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
)


def _own_dict(obj) -> dict:
    """``obj``'s instance ``__dict__``, or an empty one, read without running its
    code (only Python's own ``__dict__`` slot is read, never a property)."""
    try:
        slot = inspect.getattr_static(obj, "__dict__", None)
        if isinstance(slot, types.GetSetDescriptorType):
            slot = slot.__get__(obj, type(obj))
    except Exception:
        return {}
    return slot if isinstance(slot, dict) else {}


def _is_code_object(obj) -> bool:
    """A module, function, class or other object with a qualified name of its own."""
    if isinstance(obj, (types.ModuleType, staticmethod, classmethod, *_NAMED_KINDS)):
        return True
    return isinstance(_own_dict(obj).get("__qualname__"), str)


def _canonical(path: str) -> str | None:
    """The qualified name under which attnbook defines what ``path`` names (a re-export
    such as ``attnbook.MultiHeadAttention`` is ``attnbook.core.MultiHeadAttention``);
    ``path`` itself when it names data, or nothing loaded yet; ``None`` when it
    names an object from outside attnbook (``attnbook.core.torch``). Reads the
    modules already imported, and asks a module's ``__getattr__`` for a name it hands
    out from another module."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        module = sys.modules.get(".".join(parts[:i]))
        if module is not None:
            break
    else:
        return path
    obj = module
    for attr in parts[i:]:
        try:
            obj = inspect.getattr_static(obj, attr)
        except AttributeError:
            # a module that hands out names from another (attnbook.flash gives
            # attnbook.attend's entry points under their old names)
            forward = vars(obj).get("__getattr__") if inspect.ismodule(obj) else None
            try:
                obj = forward(attr) if forward is not None else None
            except Exception:  # noqa: BLE001 - a name it does not have
                obj = None
            if obj is None:
                return path
    if not _is_code_object(obj):
        return path
    return _name_of(obj)


def _is_module(path: str) -> bool:
    """Whether ``path`` names an attnbook module, loaded or not (a file in the
    package)."""
    if isinstance(sys.modules.get(path), types.ModuleType):
        return True
    if not _in_attnbook(path):
        return False
    where = _PACKAGE_DIR.joinpath(*path.split(".")[1:])
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


# --------------------------------------------------------------------------------------
# The static reading: an answer cell's syntax tree
# --------------------------------------------------------------------------------------
def _ipython_to_python(source: str) -> str:
    """A cell's source as the kernel runs it: ``%magic`` and ``!shell`` lines become
    calls (``get_ipython().run_line_magic(...)``), whose code this reading follows."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:  # pragma: no cover - the course extra has IPython
        lines = source.splitlines()
        if lines and lines[0].startswith("%%"):  # a cell magic runs the rest
            lines = lines[1:]
        return "\n".join(
            "pass" if line.lstrip()[:1] in ("%", "!") else line for line in lines
        )
    try:
        return TransformerManager().transform_cell(source)
    except Exception:
        return source


_GLOBALS = "<globals>"  # the value of globals() or vars()
_IPYTHON = "<ipython>"  # the value of get_ipython()
_BUILTIN_NAMES = (
    "getattr",
    "__import__",
    "globals",
    "vars",
    "locals",
    "eval",
    "exec",
    "compile",
)


@dataclass
class _Binding:
    """What a name holds: ``paths`` it is another name for (``attnbook.core``,
    ``builtins.getattr``), ``refs`` the attnbook names the value was built from,
    ``const`` a string it holds, ``lazy`` a definition whose body's references it
    carries (computed when something uses the name)."""

    paths: frozenset = frozenset()
    refs: frozenset = frozenset()
    const: str | None = None
    lazy: ast.AST | None = None

    def merged(self, other: _Binding) -> _Binding:
        return _Binding(
            self.paths | other.paths,
            self.refs | other.refs,
            self.const if self.const == other.const else None,
            self.lazy or other.lazy,
        )


_NOTHING = _Binding()


class _Scope:
    def __init__(self, kind: str, parent: _Scope | None = None, names=()):
        self.kind = kind  # "module", "function" or "class"
        self.parent = parent
        self.names = set(names)  # a function's local names
        self.bindings: dict[str, _Binding] = {}


class _Reader(ast.NodeVisitor):
    """Reads cells in the order they run. Module-level names are bound in order (a
    later ``def`` replaces an import of the same name); a function's local names
    collect every value they are given; a function body is read against the module's
    names as they are once the cell has run, as Python looks them up when it is
    called."""

    def __init__(self) -> None:
        self.module = _Scope("module")
        self.scope = self.module
        self.sink: set[str] = set()  # where the references being read go
        self.deferred: list[tuple[ast.AST, _Scope]] = []
        self.carried: dict[int, frozenset] = {}
        self.busy: set[int] = set()

    # ---- reading cells ---------------------------------------------------------------
    def cell(self, source: str, answer: bool) -> set[str]:
        try:
            tree = ast.parse(_ipython_to_python(source))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return set()
        found: set[str] = set()
        self.sink, self.deferred = found, []
        try:
            for statement in tree.body:
                self.visit(statement)
            if answer:  # read the bodies with the names as they are after the cell
                while self.deferred:
                    node, scope = self.deferred.pop(0)
                    self.body(node, scope)
        except RecursionError:
            found.add(_ROOT)  # too deep to read: count it as reaching anything
        self.deferred = []
        return found if answer else set()

    def code(self, source: str) -> None:
        """Read code run from a string (``exec``, ``eval``, a cell magic) where it
        runs."""
        try:
            tree = ast.parse(_ipython_to_python(source))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return
        for statement in tree.body:
            self.visit(statement)

    def collect(self, node: ast.AST) -> set[str]:
        """The references of ``node``, also added to the current sink."""
        outer, self.sink = self.sink, set()
        try:
            self.visit(node)
            return self.sink
        finally:
            outer |= self.sink
            self.sink = outer

    # ---- names -----------------------------------------------------------------------
    def lookup(self, name: str) -> _Binding:
        scope, first = self.scope, True
        while scope is not None:
            if scope.kind == "module":
                found = scope.bindings.get(name)
                if found is not None:
                    return found
                if name in _BUILTIN_NAMES:
                    return _Binding(paths=frozenset({f"builtins.{name}"}))
                if name == "get_ipython":
                    return _Binding(paths=frozenset({"IPython.get_ipython"}))
                return _NOTHING
            if scope.kind == "function" and name in scope.names:
                return scope.bindings.get(name, _NOTHING)
            if scope.kind == "class" and first and name in scope.bindings:
                return scope.bindings[name]
            scope, first = scope.parent, False
        return _NOTHING

    def bind(self, name: str, binding: _Binding) -> None:
        scope = self.scope
        if scope.kind == "module":
            scope.bindings[name] = binding
        else:  # a function's names keep every value they were given
            old = scope.bindings.get(name)
            scope.bindings[name] = binding if old is None else old.merged(binding)

    def use(self, binding: _Binding) -> None:
        """Reading a name: the references its value carries."""
        self.sink.update(binding.refs)
        if binding.lazy is not None:
            self.sink.update(self.carry(binding.lazy))

    def carry(self, node: ast.AST) -> frozenset:
        """The references of a definition an earlier cell made, read on first use."""
        key = id(node)
        if key in self.carried:
            return self.carried[key]
        if key in self.busy:  # a recursive definition: its references are on the way
            return frozenset()
        self.busy.add(key)
        outer, self.sink = self.sink, set()
        saved_scope, saved_deferred = self.scope, self.deferred
        self.scope, self.deferred = self.module, []
        try:
            self.body(node, self.module)
            while self.deferred:
                inner, scope = self.deferred.pop(0)
                self.body(inner, scope)
            found = frozenset(self.sink)
        finally:
            self.sink = outer
            self.scope, self.deferred = saved_scope, saved_deferred
            self.busy.discard(key)
        self.carried[key] = found
        return found

    def every_global(self) -> set[str]:
        """What ``globals()`` or a computed lookup in it may reach: every attnbook name
        the module's names are, or carry."""
        found = set()
        for binding in list(self.module.bindings.values()):
            found |= {p for p in binding.paths if _in_attnbook(p)} | binding.refs
            if binding.lazy is not None:
                found |= self.carry(binding.lazy)
        return found

    # ---- constants -------------------------------------------------------------------
    def const(self, node) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.const(node.left), self.const(node.right)
            return None if left is None or right is None else left + right
        if isinstance(node, ast.JoinedStr):
            parts = [self.const(v) for v in node.values]
            return None if None in parts else "".join(parts)
        if isinstance(node, ast.Name):
            return self.lookup(node.id).const
        return None

    # ---- paths: what an expression names ---------------------------------------------
    def path(self, node) -> set[str] | None:
        """The dotted names ``node`` may be (``{"attnbook.core.masked_softmax"}``), an
        empty set for a name that holds no known module or object, or ``None`` when
        ``node`` is no name at all (then the caller reads it as an expression).
        Computed access found on the way is recorded as a reference."""
        if isinstance(node, ast.Name):
            binding = self.lookup(node.id)
            self.use(binding)
            return set(binding.paths)
        if isinstance(node, ast.Attribute):
            base = self.path(node.value)
            if base is None:
                return None
            if node.attr.startswith("__") and node.attr.endswith("__"):
                self.escape(base)  # __dict__, __globals__, ...: anything inside
                return set()
            return {f"{p}.{node.attr}" for p in base}
        if isinstance(node, ast.Subscript):
            return self.subscript(node)
        if isinstance(node, ast.Call):
            return self.call(node)
        return None

    def escape(self, paths: Iterable[str]) -> None:
        self.sink.update(p for p in paths if _in_attnbook(p))

    def subscript(self, node: ast.Subscript) -> set[str] | None:
        base = self.path(node.value)
        if base is None:
            return None
        key = self.const(node.slice)
        self.visit(node.slice)
        if "sys.modules" in base:
            if key is None:
                self.sink.add(_ROOT)
                return set()
            return {key}
        if _GLOBALS in base:
            if key is None:
                self.sink.update(self.every_global())
                return set()
            found = self.lookup_global(key)
            return set(found.paths)
        self.escape(base)  # core.__dict__[...] was an escape already; a[...] of data
        return set()

    def lookup_global(self, name: str) -> _Binding:
        saved, self.scope = self.scope, self.module
        try:
            binding = self.lookup(name)
        finally:
            self.scope = saved
        self.use(binding)
        return binding

    def call(self, node: ast.Call) -> set[str] | None:
        func = self.path(node.func)
        if func is None:
            return None
        args, keywords = node.args, node.keywords
        if "builtins.getattr" in func and len(args) >= 2:
            base = self.path(args[0])
            key = self.const(args[1])
            for extra in args[1:]:
                self.visit(extra)
            if base is None:
                return set()
            if key is None or (key.startswith("__") and key.endswith("__")):
                self.escape(base)
                return set()
            return {f"{p}.{key}" for p in base}
        if func & {"importlib.import_module", "builtins.__import__", "sys.modules.get"}:
            key = self.const(args[0]) if args else None
            for extra in (*args, *keywords):
                self.visit(extra)
            if key is None:
                self.sink.add(_ROOT)
                return set()
            if "builtins.__import__" in func and len(args) < 4 and not keywords:
                key = key.split(".")[0]  # __import__("a.b") returns a
            return {key}
        if func & {"builtins.globals", "builtins.locals"} or (
            "builtins.vars" in func and not args
        ):
            return {_GLOBALS}
        if f"{_GLOBALS}.get" in func:
            key = self.const(args[0]) if args else None
            for extra in (*args, *keywords):
                self.visit(extra)
            if key is None:
                self.sink.update(self.every_global())
                return set()
            return set(self.lookup_global(key).paths)
        if "IPython.get_ipython" in func:
            return {_IPYTHON}
        runs = {"builtins.eval": 0, "builtins.exec": 0, "builtins.compile": 0}
        runs.update({f"{_IPYTHON}.run_cell": 0, f"{_IPYTHON}.run_line_magic": 1})
        runs[f"{_IPYTHON}.run_cell_magic"] = 2
        where = next((runs[f] for f in func if f in runs), None)
        if where is not None:
            for extra in (*args, *keywords):
                self.visit(extra)
            code = self.const(args[where]) if where < len(args) else None
            if code is None:
                self.sink.add(_ROOT)  # code built while it runs: may reach anything
            else:
                self.code(code)
            return set()
        # an ordinary call: the function is used, its arguments read
        self.escape(func)
        for extra in (*args, *keywords):
            self.visit(extra)
        return set()

    # ---- expressions -----------------------------------------------------------------
    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.escape(self.path(node))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        paths = self.path(node)
        if paths is None:
            self.generic_visit(node)
        else:
            self.escape(paths)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        paths = self.subscript(node) if isinstance(node.ctx, ast.Load) else None
        if paths is None:
            self.generic_visit(node)
        else:
            self.escape(paths)

    def visit_Call(self, node: ast.Call) -> None:
        paths = self.call(node)
        if paths is None:
            self.generic_visit(node)
        else:
            self.escape(paths)

    # ---- statements that bind names --------------------------------------------------
    def value(self, node) -> _Binding:
        """The binding an assignment of ``node`` gives: another name for a module
        (``c = attnbook.core``), or a value that carries what it was built from (an
        attnbook function assigned is a use of it)."""
        outer, self.sink = self.sink, set()
        try:
            paths = self.path(node)
            if paths is None:
                self.visit(node)
                paths = set()
            objects = {p for p in paths if _in_attnbook(p) and not _is_module(p)}
            self.sink |= objects
            refs = frozenset(self.sink)
        finally:
            outer |= self.sink
            self.sink = outer
        return _Binding(frozenset(paths), refs, self.const(node))

    def assign(self, target, binding: _Binding) -> None:
        if isinstance(target, ast.Name):
            self.bind(target.id, binding)
        elif isinstance(target, (ast.Tuple, ast.List)):
            part = _Binding(refs=binding.refs | {p for p in binding.paths})
            for element in target.elts:
                self.assign(element, part)
        elif isinstance(target, ast.Starred):
            self.assign(target.value, _Binding(refs=binding.refs))
        else:  # obj.attr = ..., x[i] = ...: read the target's parts
            self.visit(target)

    def visit_Assign(self, node: ast.Assign) -> None:
        binding = self.value(node.value)
        for target in node.targets:
            self.assign(target, binding)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.visit(node.annotation)
        if node.value is not None:
            self.assign(node.target, self.value(node.value))

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        refs = self.collect(node.value)
        if isinstance(node.target, ast.Name):
            self.use(self.lookup(node.target.id))
            self.bind(node.target.id, _Binding(refs=frozenset(refs)))
        else:
            self.visit(node.target)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.assign(node.target, self.value(node.value))

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            if isinstance(target, ast.Name) and self.scope.kind == "module":
                self.module.bindings.pop(target.id, None)
            elif not isinstance(target, ast.Name):
                self.visit(target)

    def visit_For(self, node) -> None:
        refs = self.collect(node.iter)
        self.assign(node.target, _Binding(refs=frozenset(refs)))
        for statement in (*node.body, *node.orelse):
            self.visit(statement)

    visit_AsyncFor = visit_For

    def visit_With(self, node) -> None:
        for item in node.items:
            refs = self.collect(item.context_expr)
            if item.optional_vars is not None:
                self.assign(item.optional_vars, _Binding(refs=frozenset(refs)))
        for statement in node.body:
            self.visit(statement)

    visit_AsyncWith = visit_With

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is not None:
            self.visit(node.type)
        if node.name:
            self.bind(node.name, _NOTHING)
        for statement in node.body:
            self.visit(statement)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.bind(alias.asname, _Binding(paths=frozenset({alias.name})))
            else:
                top = alias.name.split(".")[0]
                self.bind(top, _Binding(paths=frozenset({top})))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            for alias in node.names:
                if alias.name != "*":
                    self.bind(alias.asname or alias.name, _NOTHING)
            return
        for alias in node.names:
            if alias.name == "*":
                for name in _public_names(node.module):
                    path = f"{node.module}.{name}"
                    self.bind(name, _Binding(paths=frozenset({path})))
                continue
            path = f"{node.module}.{alias.name}"
            if _in_attnbook(path) and not _is_module(path):
                self.sink.add(path)  # importing a function or class is using it
            self.bind(alias.asname or alias.name, _Binding(paths=frozenset({path})))

    def visit_Global(self, node: ast.Global) -> None:
        if self.scope.kind == "function":
            self.scope.names.difference_update(node.names)

    # ---- definitions -----------------------------------------------------------------
    def visit_FunctionDef(self, node) -> None:
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.visit(node.args)  # defaults and annotations run at definition time
        if node.returns is not None:
            self.visit(node.returns)
        self.define(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for expr in (*node.decorator_list, *node.bases, *node.keywords):
            self.visit(expr)
        self.define(node)

    def define(self, node) -> None:
        """Bind the name of a definition; read its body now inside a function, or once
        the cell has run at module level (as Python does when it is called)."""
        self.bind(node.name, _Binding(lazy=node))
        if self.scope.kind == "module":
            self.deferred.append((node, self.module))
        else:
            self.body(node, self.scope)

    def body(self, node, parent: _Scope) -> None:
        saved = self.scope
        try:
            if isinstance(node, ast.ClassDef):
                self.scope = _Scope("class", parent)
                for statement in node.body:
                    self.visit(statement)
                return
            self.scope = _Scope("function", parent, _local_names(node))
            for param in _parameters(node.args):
                self.scope.bindings[param] = _NOTHING
            if isinstance(node, ast.Lambda):
                self.visit(node.body)
            else:
                for statement in node.body:
                    self.visit(statement)
        finally:
            self.scope = saved

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.visit(node.args)
        self.body(node, self.scope)

    def visit_arguments(self, node: ast.arguments) -> None:
        for default in (*node.defaults, *node.kw_defaults):
            if default is not None:
                self.visit(default)
        for arg in (*node.posonlyargs, *node.args, *node.kwonlyargs):
            if arg.annotation is not None:
                self.visit(arg.annotation)
        for arg in (node.vararg, node.kwarg):
            if arg is not None and arg.annotation is not None:
                self.visit(arg.annotation)

    def comprehension(self, node, parts) -> None:
        saved = self.scope
        names = set()
        for generator in node.generators:
            names |= _target_names(generator.target)
        self.scope = _Scope("function", saved, names)
        try:
            for generator in node.generators:
                refs = self.collect(generator.iter)
                self.assign(generator.target, _Binding(refs=frozenset(refs)))
                for condition in generator.ifs:
                    self.visit(condition)
            for part in parts:
                self.visit(part)
        finally:
            self.scope = saved

    def visit_ListComp(self, node) -> None:
        self.comprehension(node, [node.elt])

    visit_SetComp = visit_GeneratorExp = visit_ListComp

    def visit_DictComp(self, node: ast.DictComp) -> None:
        self.comprehension(node, [node.key, node.value])


def _parameters(args: ast.arguments) -> list[str]:
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    return names + [a.arg for a in (args.vararg, args.kwarg) if a is not None]


def _target_names(target) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _local_names(node) -> set[str]:
    """The names a function (or lambda) binds: its parameters and every name it
    assigns, imports or defines, not counting those of nested functions and classes,
    nor those it declares ``global``."""
    names = set(_parameters(node.args))
    declared: set[str] = set()
    todo = [node.body] if isinstance(node, ast.Lambda) else list(node.body)
    while todo:
        current = todo.pop()
        if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(current.name)
            continue
        if isinstance(current, ast.Lambda):
            continue
        if isinstance(current, ast.Global):
            declared.update(current.names)
        elif isinstance(current, ast.Name) and not isinstance(current.ctx, ast.Load):
            names.add(current.id)
        elif isinstance(current, (ast.Import, ast.ImportFrom)):
            for alias in current.names:
                if alias.name != "*":
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(current, ast.ExceptHandler) and current.name:
            names.add(current.name)
        todo.extend(ast.iter_child_nodes(current))
    return names - declared


def _public_names(module: str) -> list[str]:
    """What ``from module import *`` binds, for a module already imported."""
    loaded = sys.modules.get(module)
    if loaded is None:
        return []
    names = getattr(loaded, "__all__", None)
    if names is None:
        names = [n for n in vars(loaded) if not n.startswith("_")]
    return [n for n in names if isinstance(n, str)]


def references(answer: str, setup: Sequence[str] = ()) -> set[str]:
    """The qualified attnbook names that the answer cell ``answer`` (source code,
    IPython syntax allowed) uses, read from its syntax tree.

    ``setup`` holds the code cells that run before it, in order (the book's cells and
    the student's earlier answer cells): their imports and definitions say what the
    answer's names are. Found are attribute chains (``core.masked_softmax``,
    ``attnbook.core.masked_softmax``), names imported under any alias (``import
    attnbook.core as c``, ``from attnbook.core import masked_softmax as m``),
    ``getattr`` with a literal name, code run from a literal string (``exec``,
    ``eval``, cell magics), and names that earlier cells defined from attnbook (a
    helper function that calls it, an object built from it). Computed access counts
    as a use of what it reaches: ``getattr(core, name)`` of the module
    ``attnbook.core``, ``__dict__`` and other dunder attributes of their owner,
    ``importlib.import_module``, ``__import__`` or ``sys.modules`` with a name not
    spelled in the cell, and ``exec`` or ``eval`` of a string built at run time, of
    ``attnbook``, and ``globals()`` looked up by a computed name of every attnbook
    name the module's names hold. A cell that does not parse references nothing.
    Importing a module is not using it; importing a function or class is.
    """
    reader = _Reader()
    for source in setup:
        reader.cell(source, answer=False)
    found = reader.cell(answer, answer=True)
    names = {_canonical(n) for n in found if _in_attnbook(n)}
    return {n for n in names if n is not None}


# --------------------------------------------------------------------------------------
# The in-process reading: a function's compiled code
# --------------------------------------------------------------------------------------
# Objects of the course kit's classes (the grader's stand-ins for functions that run in
# a student's kernel, attnbook.course.grader) hold no student code to read: the grader
# passes what the answer cell's source references instead.
_STAND_INS = ("attnbook.course", "attnbook.grader")
_MOST_OBJECTS = 10_000


def code_references(obj) -> set[str]:
    """The qualified attnbook names that ``obj`` (a student's answer: a function, a
    lambda, a class, a bound method, a ``functools.partial``, a tuple of them, or a
    Triton kernel) refers to, read from its compiled code. Best effort.

    ``obj`` itself is used when attnbook defines it (the answer *is*
    ``attnbook.core.masked_softmax``), and so is the class of an attnbook object
    (``RMSNorm(d)``). Otherwise its code objects are walked, nested ones included:
    each global name (``co_names``) resolved in the function's ``__globals__``, with
    the attribute loads that follow it in the bytecode (``core.masked_softmax``), its
    defaults and closure cells; the student's own functions and classes it reaches
    (defined in the same module, ``__main__`` in a notebook) are walked in turn. A
    module that the code loads without an attribute after it (``getattr(core,
    name)``) counts as used whole; loading ``__import__``, ``importlib.import_module``,
    ``sys.modules``, ``eval``, ``exec`` or ``compile`` counts as a use of the attnbook
    modules its string constants name, or of ``attnbook``; ``globals()`` and
    ``vars()`` of every attnbook object in the function's globals. What local
    variables hold (``import attnbook.core as c`` inside the function, then
    ``c.masked_softmax``) is followed only from an import to the attribute loads
    after it.
    """
    found: set[str] = set()
    _Walk(found).object(obj)
    names = {_canonical(n) for n in found}
    return {n for n in names if n is not None}


class _Walk:
    """The walk of :func:`code_references`: what it found, the objects it has read (at
    most ``_MOST_OBJECTS``, so a huge nested list costs little), and the modules
    whose functions are the student's own (``__main__``, and those of the functions
    it was given)."""

    def __init__(self, found: set[str]) -> None:
        self.found = found
        self.seen: set[int] = set()
        self.homes: set[str] = {"__main__"}

    def object(self, obj, depth: int = 0) -> None:
        if depth > 50 or id(obj) in self.seen or len(self.seen) > _MOST_OBJECTS:
            return
        self.seen.add(id(obj))
        kind = type(obj)
        if any(_within(getattr(kind, "__module__", "") or "", s) for s in _STAND_INS):
            return
        try:
            self.read(obj, kind, depth)
        except Exception:  # an object this reading cannot take apart: nothing found
            pass

    def read(self, obj, kind: type, depth: int) -> None:
        name = _name_of(obj)
        if name is not None:
            if not any(_within(name, s) for s in _STAND_INS):
                self.found.add(name)
            return
        fn = _own_dict(obj).get("fn")
        if isinstance(obj, functools.partial):
            for part in (obj.func, *obj.args, *obj.keywords.values()):
                self.object(part, depth + 1)
        elif isinstance(obj, (tuple, list)):
            for part in obj[:100]:
                self.object(part, depth + 1)
        elif isinstance(obj, types.MethodType):
            self.object(obj.__func__, depth + 1)
        elif isinstance(obj, types.FunctionType):
            self.function(obj, depth)
        elif isinstance(obj, type):
            self.cls(obj, depth)
        elif isinstance(fn, types.FunctionType):
            self.object(fn, depth + 1)  # a Triton kernel: @triton.jit's function
        elif _name_of(kind) is not None:
            self.found.add(_name_of(kind))  # an object of an attnbook class
        elif callable(obj) and kind.__module__ in self.homes:
            self.cls(kind, depth)

    def cls(self, cls: type, depth: int) -> None:
        self.homes.add(cls.__module__)
        for base in cls.__mro__[1:]:
            name = _name_of(base)
            if name is not None:
                self.found.add(name)
        for value in list(vars(cls).values()):
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            elif isinstance(value, property):
                value = [value.fget, value.fset, value.fdel]
            self.object(value, depth + 1)

    def function(self, fn: types.FunctionType, depth: int) -> None:
        if fn.__module__ is not None:
            self.homes.add(fn.__module__)
        for part in (*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values()):
            self.value(part, depth)
        for cell in fn.__closure__ or ():
            try:
                self.value(cell.cell_contents, depth)
            except ValueError:  # an empty cell
                pass
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is not None:
            self.object(wrapped, depth + 1)
        self.code(fn.__code__, fn.__globals__, depth)

    def value(self, value, depth: int) -> None:
        """A global, default or closure value: an attnbook object (or an object of an
        attnbook class) is used, a module escapes whole, the student's own functions
        and classes are walked."""
        if isinstance(value, types.ModuleType):
            name = _name_of(value)
            if name is not None:
                self.found.add(name)
        elif _name_of(value) is not None or _name_of(type(value)) is not None:
            self.object(value, depth + 1)
        elif isinstance(value, (functools.partial, types.MethodType, tuple, list)):
            self.object(value, depth + 1)
        elif isinstance(value, (types.FunctionType, type)):
            if value.__module__ in self.homes:
                self.object(value, depth + 1)
        elif callable(value) and type(value).__module__ in self.homes:
            self.object(value, depth + 1)

    def code(self, code: types.CodeType, globals_: dict, depth: int) -> None:
        instructions = list(dis.get_instructions(code))
        strings = [c for c in code.co_consts if isinstance(c, str)]
        local_modules: dict[str, str] = {}  # a local variable -> the module it holds
        i = 0
        while i < len(instructions):
            ins = instructions[i]
            if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                name = ins.argval
                if name in globals_:
                    obj = globals_[name]
                else:
                    obj = getattr(builtins, name, None)
                i = self.chain(obj, instructions, i + 1, globals_, strings, depth)
                continue
            local = ins.opname in ("LOAD_FAST", "LOAD_DEREF")
            if local and ins.argval in local_modules:
                path, i = local_modules[ins.argval], i + 1
                while i < len(instructions) and instructions[i].opname in _ATTRIBUTE:
                    attr = instructions[i].argval
                    if attr.startswith("__"):
                        break
                    path, i = f"{path}.{attr}", i + 1
                self.found.add(path)
                continue
            if ins.opname == "IMPORT_NAME" and isinstance(ins.argval, str):
                fromlist = instructions[i - 1].argval if i else None
                i = self.imported(
                    ins.argval, fromlist, instructions, i + 1, local_modules
                )
                continue
            i += 1
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self.code(const, globals_, depth + 1)

    def chain(self, obj, instructions, i, globals_, strings, depth) -> int:
        """Follow the attribute loads after a global (``core.masked_softmax``) and note
        what they end on; returns the index of the next instruction to read."""
        while i < len(instructions) and instructions[i].opname in _ATTRIBUTE:
            attr = instructions[i].argval
            if attr.startswith("__") and attr.endswith("__"):
                break  # __dict__, __globals__: the object escapes whole
            if not isinstance(obj, (types.ModuleType, type)):
                break  # an attribute of data: what it holds is not known here
            try:
                nxt = inspect.getattr_static(obj, attr)
            except AttributeError:
                nxt = sys.modules.get(f"{getattr(obj, '__name__', '')}.{attr}")
            if nxt is None:
                name = _name_of(obj)
                if name is not None:  # not loaded yet: name it as the code spells it
                    self.found.add(f"{name}.{attr}")
                return i + 1
            obj, i = nxt, i + 1
        runs_code = ("__import__", "eval", "exec", "compile")
        if (
            obj is sys.modules
            or any(obj is getattr(builtins, n) for n in runs_code)
            or obj is getattr(sys.modules.get("importlib"), "import_module", None)
        ):
            named = [s for s in strings if _in_attnbook(s)]
            self.found.update(named or [_ROOT])
        elif any(obj is f for f in (globals, vars, locals)):
            for value in list(globals_.values()):
                if _name_of(value) is not None:
                    self.found.add(_name_of(value))
        else:
            self.value(obj, depth)
        return i

    def imported(self, module, fromlist, instructions, i, local_modules) -> int:
        """An import inside a function: ``from attnbook.core import masked_softmax``
        uses the function; a module bound to a local variable is followed where the
        variable's attributes are read."""
        base = module if fromlist is not None else module.split(".")[0]
        chained = fromlist is None  # import a.b as c: IMPORT_FROM b, then c = a.b
        current = base
        while i < len(instructions) and instructions[i].opname in (
            "IMPORT_FROM",
            "STORE_FAST",
            "STORE_DEREF",
            "STORE_NAME",
            "STORE_GLOBAL",
            "POP_TOP",
        ):
            ins = instructions[i]
            if ins.opname == "IMPORT_FROM":
                current = module if chained else f"{base}.{ins.argval}"
            elif ins.opname != "POP_TOP" and _in_attnbook(current):
                if _is_module(current):
                    local_modules[ins.argval] = current
                else:
                    self.found.add(current)
            i += 1
        return i


_ATTRIBUTE = ("LOAD_ATTR", "LOAD_METHOD")


# --------------------------------------------------------------------------------------
# The trust model's table
# --------------------------------------------------------------------------------------
def _described(name: str) -> str:
    if name == _ROOT:
        return "anything in attnbook"
    if _is_module(name):
        return f"anything in `{name}`"
    return f"`{name}`"


def policy_table() -> str:
    """The Markdown table of every registered exercise's policy (the question bank's
    answers are letters and numbers, which may use anything), in the order the checks
    are registered: its label, whether the answer may use the library (and
    why), what the grader detects, and what it does not detect beyond what it misses
    everywhere. A project's hidden test (label ``...-hidden``) has its milestone's
    policy and no row: the public page does not name it. The grading page's trust
    model (``book/grading.md``) holds this table, and a test keeps the two equal."""
    from . import CHECKS

    rows = [
        "| exercise | library use | what is detected "
        "| what is not, besides the above |",
        "|---|---|---|---|",
    ]
    for label, entry in CHECKS.items():
        policy = entry.library
        if policy is None or entry.question:  # a letter or a number: nothing to use
            continue
        if label.endswith("-hidden") and label.removesuffix("-hidden") in CHECKS:
            continue
        if policy.allows_library:
            use, detected = f"Allowed. {policy.why}", "nothing to detect"
        else:
            use = f"Forbidden. {policy.why}"
            detected = "uses of " + ", ".join(_described(n) for n in policy.forbidden)
            if policy.harness:
                detected += " (not of " + ", ".join(f"`{n}`" for n in policy.harness)
                detected += ", which the check cell wraps the answer in)"
        gaps = policy.gaps or "-"
        rows.append(f"| `{label}` | {use} | {detected} | {gaps} |")
    return "\n".join(rows) + "\n"
