"""Library calls: every exercise's check says whether its answer may use attnbook's own
implementation, and where it may not, an answer that does is found and fails (issue 39).

The book's solutions must be clean under their policies; answers built from each policy's
forbidden names, spelled through the chapter's own imports and in several other ways, must be
caught by the grader's static reading (``library.references``) and, in a reader's notebook, by
``run_check``'s reading of the compiled code; and the trust model's table on the grading page
(book/grading.md) must be the one the policies generate.
"""

from __future__ import annotations

import functools
import importlib
import re
from pathlib import Path

import nbformat
import pytest

import attnbook
from attnbook import core
from attnbook.course import checks as exercises  # the registry behind attnbook.exercises
from attnbook.course.checks import library
from attnbook.course.checks.library import Library, allowed, code_references, forbid, references, violations

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
CHECK_CALL = re.compile(r"\bcheck\(\s*\"([^\"]+)\"")


def _book_answers():
    """label -> (notebook name, [(answer source, setup sources)]): each solution cell of a
    chapter or a project, with the code cells that run before it (the book's, and the earlier
    answers); a project's hidden test has the answers of its milestone's public check."""
    found = {}
    for path in sorted(BOOK.glob("*.ipynb")) + sorted(BOOK.glob("projects/*.ipynb")):
        cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        pending = []
        for index, cell in enumerate(cells):
            if "solution" in cell.metadata.get("tags", []):
                pending.append(index)
                continue
            match = CHECK_CALL.search(cell.source)
            if match and pending:
                found[match.group(1)] = (
                    path.name,
                    [(cells[i].source, [c.source for c in cells[:i]]) for i in pending],
                )
                pending = []
            elif match and match.group(1).removesuffix("-hidden") in found:
                found[match.group(1)] = found[match.group(1).removesuffix("-hidden")]
    return found


ANSWERS = _book_answers()
from attnbook.course.checks.questions import LABELS as QUESTIONS  # letters and numbers

LABELS = sorted(set(exercises.CHECKS) - QUESTIONS)  # the chapters' exercises
FORBIDDING = [label for label in LABELS if not exercises.CHECKS[label].library.allows_library]


def _defined(*names: str) -> set[str]:
    """The names where attnbook defines these objects (the package moves code between
    modules and re-exports it; the readings report the defining module)."""
    return {library._canonical(n) for n in names}


def _resolve(name: str):
    """The attnbook object or module a qualified name names, imported."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


# ---------------------------------------------------------------------------------------------
# Every check declares a policy, and its names are real
# ---------------------------------------------------------------------------------------------
def test_every_chapters_checks_have_solutions_here():
    assert set(ANSWERS) == set(LABELS)


def test_every_registered_check_declares_a_policy():
    for label in LABELS:
        policy = exercises.CHECKS[label].library
        assert isinstance(policy, Library), f"{label} has no library policy"
        assert policy.why.strip().endswith("."), f"{label}: why= is one sentence"
        assert "|" not in policy.why + policy.gaps, f"{label}: the guide's table cannot hold a |"


def test_register_requires_a_policy(monkeypatch):
    monkeypatch.setattr(exercises, "CHECKS", {})
    with pytest.raises(TypeError, match="needs library="):
        exercises.register("t-none", hint="")(lambda f: None)
    with pytest.raises(TypeError, match="needs library="):
        exercises.register("t-text", hint="", library="allowed")(lambda f: None)
    exercises.register("t-ok", hint="", library=allowed("A test."))(lambda f: None)
    assert exercises.CHECKS["t-ok"].library == Library((), "A test.")


def test_policies_reject_names_outside_attnbook_and_a_missing_why():
    with pytest.raises(ValueError, match="not a qualified attnbook name"):
        forbid("torch.softmax", why="No.")
    with pytest.raises(ValueError, match="why="):
        forbid("attnbook.core.masked_softmax", why=" ")
    with pytest.raises(ValueError, match="at least one"):
        forbid(why="Nothing.")


@pytest.mark.parametrize("label", FORBIDDING)
def test_forbidden_names_are_real_attnbook_objects(label):
    """Each name imports, and names a module, function or class that attnbook defines (a
    re-export, ``attnbook.flash.merge_partials``, is fine: names are compared where defined)."""
    policy = exercises.CHECKS[label].library
    for name in (*policy.forbidden, *policy.harness):
        if name.startswith("attnbook.kernels"):
            pytest.importorskip("triton")
        obj = _resolve(name)
        defined = obj.__name__ if isinstance(obj, type(attnbook)) else obj.__module__
        assert defined.startswith("attnbook"), f"{label}: {name} is not attnbook's own"
        assert library._canonical(name) is not None


# ---------------------------------------------------------------------------------------------
# The book's solutions are clean
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("label", LABELS)
def test_every_book_solution_is_clean_under_its_policy(label):
    policy = exercises.CHECKS[label].library
    for answer, setup in ANSWERS[label][1]:
        used = references(answer, setup)
        assert not violations(policy, used), f"the book's solution of {label} uses {sorted(used)}"


def test_the_solutions_that_use_attnbook_keep_their_building_blocks():
    """The multi-head and local-attention exercises ask for scaled_dot_product_attention."""
    for label in ("attention-multi-head", "sparse-local-attention"):
        (answer, setup), = ANSWERS[label][1]
        assert references(answer, setup) == _defined("attnbook.core.scaled_dot_product_attention")


def _solution(label: str, name: str):
    """The book's solution cell of ``label`` run after the imports of the cells before it, in
    a namespace that stands for the notebook's ``__main__``; returns ``name`` from it."""
    (answer, setup), = ANSWERS[label][1]
    namespace = {"__name__": "__main__"}
    imports = [line for cell in setup for line in cell.splitlines()
               if re.match(r"(import|from) \S+ import [\w, ]+$|import [\w.]+( as \w+)?$", line)]
    exec("import math\nimport torch\nimport torch.nn.functional as F\n" + "\n".join(imports), namespace)
    exec(answer, namespace)
    return namespace[name]


@pytest.mark.parametrize("label, name", [
    ("attention-masked-softmax", "my_masked_softmax"),
    ("attention-multi-head", "multi_head_forward"),
    ("sparse-local-attention", "my_local_attention"),
    ("positional-sinusoidal", "my_sinusoidal"),
    ("linear-attention", "my_linear_attention"),
])
def test_the_compiled_solutions_are_clean_and_pass(label, name):
    solution = _solution(label, name)
    used = code_references(solution)
    assert not violations(exercises.CHECKS[label].library, used), sorted(used)
    assert exercises.run_check(label, solution).passed


# ---------------------------------------------------------------------------------------------
# Answers that use a forbidden name are found, however they spell it
# ---------------------------------------------------------------------------------------------
def _inside(name: str) -> str:
    """A function or class named by ``name``, or one inside it when ``name`` is a module."""
    if name == "attnbook":
        return "attnbook.core.masked_softmax"
    obj = _resolve(name)
    if not isinstance(obj, type(attnbook)):
        return name
    public = [n for n in obj.__all__ if callable(getattr(obj, n))]
    return f"{name}.{public[0]}"


def _chapter_spelling(target: str, setup) -> str | None:
    """``target`` spelled through a name the chapter's cells bound (``core.masked_softmax``,
    ``lab``, ``sliding_window_mask``), or ``None`` if they bound none that leads to it."""
    reader = library._Reader()
    for source in setup:
        reader.cell(source, answer=False)
    best = None
    for name, binding in reader.module.bindings.items():
        for path in binding.paths:
            if path == target or target.startswith(path + "."):
                spelled = name + target[len(path):]
                if best is None or len(spelled) < len(best):
                    best = spelled
    return best


def _spellings(target: str, setup) -> dict[str, str]:
    """Answer cells that call ``target`` (a qualified attnbook name), spelled in many ways."""
    module, _, attr = target.rpartition(".")
    while module and not library._is_module(module):  # a method: Class.method
        module, _, outer = module.rpartition(".")
        attr = f"{outer}.{attr}"
    head, _, rest = attr.partition(".")
    rest = f".{rest}" if rest else ""
    call = "def answer(*args, **kwargs):\n    return {}(*args, **kwargs)\n"
    cells = {
        "alias import": f"import {module} as _lib\n" + call.format(f"_lib.{attr}"),
        "from import as": f"from {module} import {head} as _m\n" + call.format(f"_m{rest}"),
        "attribute chain": "import attnbook\n" + call.format(target),
        "assigned": f"import {module}\nanswer = {target}\n",
        "getattr, literal": f"import {module} as _lib\n" + call.format(f"getattr(_lib, {head!r}){rest}"),
        "getattr, computed": f"import {module} as _lib\n_name = input()\n" + call.format("getattr(_lib, _name)"),
        "importlib, literal": "import importlib\n" + call.format(f"importlib.import_module({module!r}).{attr}"),
        "importlib, computed": "import importlib\n_n = input()\n" + call.format(f"importlib.import_module(_n).{attr}"),
        "__import__": call.format(f"__import__({module!r}, fromlist=['_']).{attr}"),
        "sys.modules": "import sys\n" + call.format(f"sys.modules[{module!r}].{attr}"),
        "a helper": f"import {module} as _lib\ndef _helper(x):\n    return _lib.{attr}\n" + call.format("_helper(0)"),
        "lambda": f"from {module} import {head} as _m\nanswer = lambda *a: _m{rest}(*a)\n",
        "local import": "def answer(*args):\n"
                        f"    from {module} import {head} as _m\n    return _m{rest}(*args)\n",
        "exec": f"exec('import {module} as _lib\\nanswer = _lib.{attr}')\n",
        "a line magic": f"import {module} as _lib\n%time answer = _lib.{attr}\n",
    }
    spelled = _chapter_spelling(target, setup)
    if spelled is not None:
        cells["the chapter's imports"] = call.format(spelled)
        cells["globals()"] = call.format(f"globals()[{spelled.split('.')[0]!r}]{spelled[len(spelled.split('.')[0]):]}")
    return cells


@pytest.mark.parametrize("label", FORBIDDING)
def test_an_answer_that_uses_a_forbidden_name_is_found(label):
    policy = exercises.CHECKS[label].library
    (_, setup), = ANSWERS[label][1][-1:]
    missed = []
    for index, name in enumerate(policy.forbidden):
        target = _inside(name)
        spellings = _spellings(target, setup)
        if index:  # every spelling for the first name; two for the others
            spellings = {k: v for k, v in spellings.items() if k in ("the chapter's imports", "from import as")}
        for how, cell in spellings.items():
            found = violations(policy, references(cell, setup))
            if not found:
                missed.append(f"{target} ({how}):\n{cell}")
            else:
                text = library.message(policy, found)
                assert "scores 0" in text and policy.why in text
    assert not missed, f"{label}: not found:\n" + "\n".join(missed)


def test_the_chapter_spelling_exists_where_the_chapter_imports_the_name():
    (_, setup), = ANSWERS["sparse-dilated-window"][1]
    assert _chapter_spelling("attnbook.sparse.sliding_window_mask", setup) == "sliding_window_mask"
    (_, setup), = ANSWERS["attention-masked-softmax"][1]
    assert _chapter_spelling("attnbook.core.masked_softmax", setup) == "core.masked_softmax"


# ---------------------------------------------------------------------------------------------
# What the static reading counts, and what it does not
# ---------------------------------------------------------------------------------------------
SETUP = ["import torch\nimport attnbook\nfrom attnbook import core\n",
         "def helper(x):\n    return core.masked_softmax(x)\nlayer = core.MultiHeadAttention(8, 2)\n"]


@pytest.mark.parametrize("cell, expected", [
    ("def f(s):\n    return torch.softmax(s, -1)", set()),
    ("def f(s):\n    return core.masked_softmax(s)", {"attnbook.core.masked_softmax"}),
    ("f = attnbook.core.masked_softmax", {"attnbook.core.masked_softmax"}),
    ("def f(s):\n    return helper(s)", {"attnbook.core.masked_softmax"}),  # an earlier cell's helper
    ("def f(x):\n    return layer(x)", {"attnbook.core.MultiHeadAttention"}),  # an object built from it
    ("def f(mha, x):\n    return mha(x)", set()),  # a parameter: out of reach
    ("def f(s):\n    return getattr(core, input())(s)", {"attnbook.core"}),
    ("def f(s):\n    return core.__dict__['masked_softmax'](s)", {"attnbook.core"}),
    ("def f(s, code):\n    return eval(code)(s)", {"attnbook"}),
    ("def f(s):\n    return globals()[input()](s)",
     {"attnbook", "attnbook.core", "attnbook.core.masked_softmax", "attnbook.core.MultiHeadAttention"}),
    ("f = attnbook.MultiHeadAttention", {"attnbook.core.MultiHeadAttention"}),  # a re-export, by its home
    ("import attnbook.core as c\nimport attnbook.positional", set()),  # importing a module is no use
    ("from attnbook.core import masked_softmax", {"attnbook.core.masked_softmax"}),
    ("def masked_softmax(s):\n    return s\ndef f(s):\n    return masked_softmax(s)", set()),
    ("%%capture\nf = core.masked_softmax", {"attnbook.core.masked_softmax"}),
    ("f = core.torch.softmax", set()),  # torch, reached through attnbook's module, is not attnbook
    ("def f(:", set()),  # a cell that does not parse references nothing
])
def test_what_the_static_reading_counts(cell, expected):
    assert references(cell, SETUP) == _defined(*expected)


def test_a_later_definition_replaces_an_import_of_the_same_name():
    setup = ["from attnbook.positional import sinusoidal_encoding"]
    own = "def sinusoidal_encoding(n, d):\n    return n\ndef my_sinusoidal(n, d):\n    return sinusoidal_encoding(n, d)"
    assert references(own, setup) == set()
    assert references("def my_sinusoidal(n, d):\n    return sinusoidal_encoding(n, d)", setup) == _defined(
        "attnbook.positional.sinusoidal_encoding")


def test_violations_cover_modules_classes_and_computed_access():
    policy = forbid("attnbook.positional", "attnbook.models.RMSNorm", why="Write it.")
    rmsnorm = library._canonical("attnbook.models.RMSNorm")
    used = {"attnbook.positional.alibi_slopes", f"{rmsnorm}.forward", rmsnorm.rpartition(".")[0],
            "attnbook.core.masked_softmax"}
    assert violations(policy, used) == sorted(used - {"attnbook.core.masked_softmax"})
    assert violations(allowed("Fine."), {"attnbook"}) == []
    lab = forbid("attnbook", why="Kernel only.", harness=("attnbook.kernels.lab",))
    assert violations(lab, {"attnbook.kernels.lab.softmax"}) == []


def test_the_message_says_what_was_used_and_why_it_is_not_allowed():
    policy = exercises.CHECKS["attention-masked-softmax"].library
    text = library.message(policy, ["attnbook.core.masked_softmax"])
    assert text.startswith("your answer uses attnbook.core.masked_softmax, which this exercise does not allow")
    assert policy.why in text and text.endswith("scores 0.")
    policy = exercises.CHECKS["positional-rope"].library
    text = library.message(policy, ["attnbook.positional"])
    assert "reaches attnbook.positional by a name computed while it runs" in text
    assert "attnbook.positional.RotaryEmbedding" in text


# ---------------------------------------------------------------------------------------------
# run_check: the compiled code in a reader's notebook, or the grader's references
# ---------------------------------------------------------------------------------------------
def test_run_check_fails_an_answer_that_is_or_calls_the_library():
    label = "attention-masked-softmax"
    for student in [core.masked_softmax,
                    lambda scores, mask=None, temperature=1.0: core.masked_softmax(scores, mask, temperature),
                    functools.partial(core.masked_softmax, temperature=1.0)]:
        result = exercises.run_check(label, student)
        assert not result.passed
        assert result.message.startswith(f"your answer uses {library._canonical('attnbook.core.masked_softmax')}")
        assert "scores 0" in result.message


def test_run_check_reads_what_the_grader_read_from_the_source():
    label = "attention-masked-softmax"
    solution = _solution(label, "my_masked_softmax")
    assert exercises.run_check(label, solution).passed
    assert exercises.run_check(label, solution, references=set()).passed
    failed = exercises.run_check(label, solution, references={"attnbook.core.masked_softmax"})
    assert not failed.passed and "attnbook.core.masked_softmax" in failed.message
    # the grader's references replace the in-process reading, which would find the call here
    assert exercises.run_check(label, core.masked_softmax, references=set()).passed


def test_check_prints_the_failure(capsys):
    result = exercises.check("transformer-rmsnorm", lambda x, weight, eps: attnbook.models.RMSNorm)
    assert not result.passed
    assert "[FAILED] transformer-rmsnorm: your answer uses attnbook.models.RMSNorm" in capsys.readouterr().out


def test_an_allowed_exercise_runs_its_check_whatever_the_answer_uses():
    result = exercises.run_check("attention-sqrt-dk", lambda d, a, b: attnbook.core.masked_softmax and 1 / (a * b * d**0.5))
    assert result.passed


def test_code_references_follows_helpers_defaults_closures_classes_and_local_imports():
    namespace = {"__name__": "__main__"}
    exec("""
import importlib
from attnbook import core
def helper(x):
    return core.masked_softmax(x)
def via_helper(x):
    return helper(x)
def default(x, f=core.masked_softmax):
    return f(x)
def make():
    g = core.masked_softmax
    return lambda x: g(x)
closure = make()
class Layer:
    def __call__(self, x):
        return core.masked_softmax(x)
def local(x):
    import attnbook.core as c
    return c.masked_softmax(x)
def computed(x, name):
    return getattr(core, name)(x)
def imported(x, name):
    return importlib.import_module(name).masked_softmax(x)
def plain(x):
    return x.softmax(-1)
""", namespace)
    softmax = _defined("attnbook.core.masked_softmax")
    for name in ["via_helper", "default", "closure", "local"]:
        assert code_references(namespace[name]) == softmax, name
    assert code_references(namespace["Layer"]()) == softmax
    assert code_references(namespace["computed"]) == {"attnbook.core"}
    assert code_references(namespace["imported"]) == {"attnbook"}
    assert code_references(namespace["plain"]) == set()
    assert code_references(attnbook.models.RMSNorm(4)) == _defined("attnbook.models.RMSNorm")
    assert code_references((namespace["plain"], core.causal_mask)) == _defined("attnbook.core.causal_mask")


def test_the_kernel_labs_launcher_does_not_count_but_a_library_kernel_does():
    lab = pytest.importorskip("attnbook.kernels.lab")
    flash_triton = importlib.import_module("attnbook.kernels.flash_triton")
    policy = exercises.CHECKS["kernel-lab-softmax"].library
    assert violations(policy, code_references(functools.partial(lab.softmax, flash_triton._fwd_kernel))) == [
        "attnbook.kernels.flash_triton._fwd_kernel"]
    (answer, setup), = ANSWERS["kernel-lab-softmax"][1]
    stolen = "from attnbook.kernels import flash_triton\n" + answer.replace("row = tl.program_id(0)",
                                                                          "row = flash_triton._heads(0, 1, 1)")
    assert violations(policy, references(stolen, setup)) == ["attnbook.kernels.flash_triton._heads"]


# ---------------------------------------------------------------------------------------------
# The table on the grading page (book/grading.md, the trust model) is the policies'
# ---------------------------------------------------------------------------------------------
def test_the_guides_trust_model_table_is_the_generated_one():
    page = (BOOK / "grading.md").read_text()
    section = page.split("(course-trust-library)=")[1].split("\n(")[0]
    table = library.policy_table()
    start = section.find(table.splitlines()[0])
    assert start >= 0, "grading.md's trust model has no library table: paste attnbook.course.checks.library.policy_table()"
    committed = section[start:].split("\n\n")[0].rstrip("\n") + "\n"
    assert committed == table, "grading.md's library table differs from the policies: regenerate it with policy_table()"
    hidden = [label for label in LABELS if label.endswith("-hidden")]
    assert hidden and table.count("\n| `") == len(LABELS) - len(hidden)


def test_the_table_says_allowed_or_forbidden_for_every_exercise():
    rows = library.policy_table().splitlines()[2:]
    for row in rows:
        use = row.split(" | ")[1]
        assert use.startswith(("Allowed. ", "Forbidden. ")), row
    forbidden = sum(" | Forbidden. " in row for row in rows)
    public = [label for label in LABELS if not label.endswith("-hidden")]  # hidden: no row
    named = [label for label in FORBIDDING if label in public]
    assert forbidden == len(named) and len(rows) - forbidden == len(public) - len(named)


def test_the_graders_stand_ins_hold_nothing_to_read():
    """The grader hands run_check a stand-in for the function in the student's kernel: its class
    is the course kit's, and the grader passes the answer cell's references instead."""
    stand_in = type("RemoteFunction", (), {"__module__": "attnbook.course.grader",
                                           "__call__": lambda self, *a: core.masked_softmax(*a)})
    assert code_references(stand_in()) == set()
    assert code_references((stand_in(), core.causal_mask)) == _defined("attnbook.core.causal_mask")
