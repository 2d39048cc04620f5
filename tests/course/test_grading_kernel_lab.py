"""The kernel lab graded from the kernels' source, in a worker no student cell ran in.

A kernel-lab check (``functools.partial(lab.softmax, softmax_kernel)``) is not evaluated in the
student's kernel. The grader reads the answer cells' ``@triton.jit`` functions and constants
(``grader.kernel_source``), allows only Triton's language in them, and defines them in a fresh
kernel of its own where the book's launchers measure the tiles. Each attack below once scored
full marks where the check ran in the student's process (a control shows the cheat computes the
right answers in-process); now each scores what a blank scores, with a message, in the sandbox.
"""

from __future__ import annotations

import functools
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

import attnbook.kernels.lab as lab
from attnbook import course
from attnbook.course import grader, sandbox
from attnbook.exercises import run_check
from test_grading_chapters import cut

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = ROOT / "book" / "kernel_lab.ipynb"
LABELS = ["kernel-lab-softmax", "kernel-lab-matmul", "kernel-lab-attention-forward",
          "kernel-lab-attention-backward", "kernel-lab-block-sparse"]


def answer_cells(nb):
    return [c for c in nb.cells if "solution" in c.metadata.get("tags", [])]


def book_answers():
    return [c.source for c in answer_cells(nbformat.read(CHAPTER, as_version=4))]


# ---- a check that ends the worker fails alone ----------------------------------------------------
class FakeWorker:
    """A KernelSession stand-in: counts its starts; ``deaths`` says which checks end it."""

    started: list = []

    def __init__(self, limits, guard, isolation, deadline):
        self.deadline = deadline
        FakeWorker.started.append(self)

    def start(self):
        pass

    def run(self, code):
        return grader.CellRun()

    def close(self):
        self.closed = True


def kernel_steps():
    nb = nbformat.read(CHAPTER, as_version=4)
    steps = grader.Chapter.from_notebook(nb, CHAPTER.name).steps
    return [s for s in steps if s.kind == "check" and grader.kernel_check(s.code)]


@pytest.mark.parametrize("deaths, verdicts", [
    ({}, ["passed"] * 5),  # one worker for every check
    # the machine's hiccup: the check runs once more, in a fresh worker, and passes
    ({"kernel-lab-matmul": 1}, ["passed"] * 5),
    # a kernel that ends its worker twice fails alone; the next check gets a new worker
    ({"kernel-lab-attention-forward": 2}, ["passed", "passed", "failed", "passed", "passed"]),
])  # fmt: skip
def test_a_check_that_ends_the_worker_fails_alone(monkeypatch, deaths, verdicts):
    left = dict(deaths)
    FakeWorker.started = []

    def check(worker, step, run_check, error):
        if left.get(step.label):
            left[step.label] -= 1
            raise grader.KernelGone("a cell ran longer than 15 s and ignored the interrupt")
        return grader._row(step.label, 1, "passed", "passed")

    monkeypatch.setattr(grader, "KernelSession", FakeWorker)
    monkeypatch.setattr(grader, "_check", check)
    rows = grader._grade_kernels(book_answers(), kernel_steps(), sandbox.Limits(), None, "none", {})
    assert [rows[label]["status"] for label in LABELS] == verdicts
    assert len(FakeWorker.started) == 1 + sum(deaths.values())
    assert all(w.closed for w in FakeWorker.started)
    assert len({w.deadline for w in FakeWorker.started}) == 1  # one time limit for them all
    for label, times in deaths.items():
        if times == 2:
            assert rows[label]["message"] == (
                "your kernel stopped: a cell ran longer than 15 s and ignored the interrupt")


def test_the_workers_time_limit_ends_the_kernel_checks_and_keeps_their_rows(monkeypatch):
    clock = [0.0]

    def check(worker, step, run_check, error):
        clock[0] += 100
        if step.label == "kernel-lab-attention-forward":
            raise grader.KernelGone("the notebook ran out of its time limit (250 s)")
        return grader._row(step.label, 1, "passed", "passed")

    monkeypatch.setattr(grader.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(grader, "KernelSession", FakeWorker)
    monkeypatch.setattr(grader, "_check", check)
    rows = {}
    with pytest.raises(grader.KernelGone, match="time limit"):
        grader._grade_kernels(book_answers(), kernel_steps(), sandbox.Limits(notebook_timeout=250),
                              None, "none", rows)
    assert [rows[label]["status"] for label in LABELS[:3]] == ["passed", "passed", "failed"]
    assert LABELS[3] not in rows  # the grader says "check did not run" for these


# ---- which checks are kernel checks ---------------------------------------------------------------
def test_the_labs_check_expressions_are_kernel_checks_and_no_other_chapters_are():
    nb = nbformat.read(CHAPTER, as_version=4)
    chapter = grader.Chapter.from_notebook(nb, CHAPTER.name)
    found = {s.label: grader.kernel_check(s.code) for s in chapter.steps if s.kind == "check"}
    assert found == {
        "kernel-lab-softmax": ("softmax", "softmax_kernel"),
        "kernel-lab-matmul": ("matmul", "matmul_kernel"),
        "kernel-lab-attention-forward": ("attention_forward", "attention_kernel"),
        "kernel-lab-attention-backward": ("attention_backward", "backward_kernel"),
        "kernel-lab-block-sparse": ("block_sparse_forward", "block_sparse_kernel"),
    }
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        if path != CHAPTER:
            other = grader.Chapter.from_notebook(nbformat.read(path, as_version=4), path.name)
            assert not any(grader.kernel_check(s.code) for s in other.steps if s.kind == "check")


@pytest.mark.parametrize("expr", ["functools.partial(lab.softmax)", "lab.softmax",
                                  "functools.partial(lab.softmax, k, 1)", "partial(lab.softmax, k)",
                                  "functools.partial(bench.softmax, k)", "functools.partial(lab.x, k.fn)",
                                  "not python ("])
def test_other_expressions_are_not_kernel_checks(expr):
    assert grader.kernel_check(expr) is None


# ---- what the grader takes from the answer cells ---------------------------------------------------
def test_every_kernel_in_the_book_is_taken_whole_and_nothing_else():
    source = grader.kernel_source(book_answers())
    assert source.refused == {}
    assert source.defined == {"softmax_kernel", "matmul_kernel", "attention_kernel", "backward_kernel",
                              "block_sparse_kernel"}
    assert "### BEGIN SOLUTION" not in source.text  # comments are not carried
    kernels = lab.define_kernels(source.text)
    assert set(kernels) == source.defined
    assert all(hasattr(k, "fn") for k in kernels.values())


def test_the_stubs_are_taken_and_report_not_attempted():
    nb = course.strip_solutions(nbformat.read(CHAPTER, as_version=4))
    source = grader.kernel_source([c.source for c in answer_cells(nb)])
    assert source.refused == {} and len(source.defined) == 5
    kernel = lab.define_kernels(source.text)["softmax_kernel"]
    verdict = run_check("kernel-lab-softmax", functools.partial(lab.softmax, kernel))
    assert not verdict.passed and "not attempted" in verdict.message


def test_constants_helpers_and_the_last_definition_are_taken():
    cells = ["""
import torch
import triton
import triton.language as tl
ROWS = 16
WIDE: tl.constexpr = tl.constexpr(32)
setup = torch.zeros(3)  # ignored: it is not a kernel

@triton.jit
def helper(x):
    return x * 2

@triton.jit
def k(X, N: tl.constexpr = 4):
    raise NotImplementedError("Exercise: write your solution here")
""", """
@triton.jit
def k(X, N: tl.constexpr = 4):
    i = tl.arange(0, N)
    tl.store(X + i, helper(tl.load(X + i)) + ROWS + WIDE, mask=i < triton.cdiv(N, 1))
"""]
    source = grader.kernel_source(cells)
    assert source.refused == {} and source.defined == {"ROWS", "WIDE", "helper", "k"}
    assert "torch" not in source.text and "setup" not in source.text
    assert source.text.index("NotImplementedError") < source.text.rindex("def k(")


KERNEL = """
@triton.jit
def softmax_kernel(X, Y, n_cols, stride_x, stride_y, BLOCK: tl.constexpr):
{body}
"""

REFUSED = {
    # reaching Python through Triton's own modules, the interpreter's values or names
    "tl-core-builtins": ("    tl.core.builtins.exec('import os')", "tl.core is a module"),
    "tl-math-core": ("    tl.math.core.builtins.print(1)", "tl.math.core is a module"),
    "handle": ("    x = tl.load(X)\n    y = x.handle.data.sum()", ".handle"),
    "dunder": ("    g = tl.load.__globals__", ".__globals__"),
    "import-call": ("    os = __import__('os')", "reads __import__"),
    "a-global": ("    torch.softmax(X, -1)", "reads torch"),
    "import": ("    import os", "Import is not part"),
    "lambda": ("    f = lambda v: v", "Lambda is not part"),
    "comprehension": ("    xs = [i for i in range(3)]", "ListComp is not part"),
    "try": ("    try:\n        pass\n    except Exception:\n        pass", "Try is not part"),
    "with": ("    with open('x') as f:\n        pass", "With is not part"),
    "nested-def": ("    def inner():\n        pass", "FunctionDef is not part"),
    "global": ("    global lab", "Global is not part"),
    "rebinds-tl": ("    tl = 3", "rebinds tl"),
    "raise-other": ("    raise ValueError('x')", "NotImplementedError"),
    "triton-attribute": ("    triton.compile(None)", "triton.compile cannot"),
    "unknown-tl": ("    tl.maximun(1, 2)", "tl has no maximun"),
    "format-walrus": ("    (y := 1)", "NamedExpr is not part"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_code_that_is_not_tritons_language_is_refused_with_the_line(name):
    body, why = REFUSED[name]
    source = grader.kernel_source([KERNEL.format(body=body)])
    assert "softmax_kernel" not in source.defined and source.text == ""
    message = source.refused["softmax_kernel"]
    assert why in message and message.startswith("line "), message


@pytest.mark.parametrize("head, why", [
    ("def softmax_kernel(X, Y, *rest):", "*args"),
    ("def softmax_kernel(X, Y, n: int):", "annotated"),
    ("def softmax_kernel(X, Y, n=print):", "default"),
    ("def lab(X, Y):", "the grader's"),
    ("def _hidden(X, Y):", "the grader's"),
])
def test_signatures_and_names_the_grader_cannot_run_are_refused(head, why):
    name = head.split("(")[0].removeprefix("def ")
    source = grader.kernel_source([f"@triton.jit\n{head}\n    pass\n"])
    assert why in source.refused[name], source.refused


def test_functions_without_triton_jit_and_other_code_are_left_out():
    cells = ["def softmax_kernel(X, Y, n_cols, stride_x, stride_y, BLOCK):\n    pass\n",
             "@torch.compile\ndef k(x):\n    return x\n",
             "@triton.jit\n@functools.cache\ndef two(x):\n    pass\n",
             "x = [1]\nBIG = 2 ** 40\nimport os\nos.system('true')\n",
             "%%capture\nthis is not python"]
    source = grader.kernel_source(cells)
    assert source.defined == set() and source.text == ""
    assert "one decorator" in source.refused["two"]


# ---- the attacks, end to end through the grader in the sandbox -------------------------------------
CHEAT = """
import torch
from triton.runtime.interpreter import InterpretedFunction

def _plain(X, Y, n_cols, stride_x, stride_y, BLOCK):
    pass

class _Cheat(InterpretedFunction):
    # a launch that fills the output with PyTorch's softmax: no kernel, no loads
    def __getitem__(self, grid):
        def launch(X, Y, n_cols, stride_x, stride_y, BLOCK):
            Y.copy_(X.float().softmax(-1).to(Y.dtype))
        return launch

softmax_kernel = _Cheat(_plain)
"""

FUNCTOOLS = """
import types
functools = types.SimpleNamespace(partial=lambda launcher, kernel: lambda x: x.float().softmax(-1).to(x.dtype))
"""

SETATTR = """
from attnbook.kernels import lab as _bench
setattr(_bench, "softmax", lambda kernel, x: x.float().softmax(-1).to(x.dtype))
vars(_bench)["matmul"] = lambda kernel, a, b, **k: (a.float() @ b.float()).to(a.dtype)
"""

ESCAPE = KERNEL.format(body="    tl.core.builtins.exec('Y.copy_(X.softmax(-1))')")


def cheat_kernel():
    namespace: dict = {}
    exec(compile(textwrap.dedent(CHEAT), str(Path(__file__)), "exec"), namespace)
    return namespace["softmax_kernel"]


def test_control_the_cheat_passes_a_check_run_where_the_students_code_runs():
    """What the grader once did: the check called the launcher in the student's process, so a
    kernel object that fills the output itself passed."""
    import inspect

    kernel = cheat_kernel()
    assert inspect.isclass(type(kernel)) and hasattr(kernel, "fn")
    assert run_check("kernel-lab-softmax", functools.partial(lab.softmax, kernel)).passed


def first_answer_prefixed(code):
    def change(nb):
        first = answer_cells(nb)[0]
        first.source = textwrap.dedent(code) + "\n" + first.source
    return change


def first_answer_is(code):
    def change(nb):
        answer_cells(nb)[0].source = textwrap.dedent(code)
    return change


def unbounded_forward_with_a_patched_tile_map(nb):
    """The forward kernel with its causal bound taken out (every key tile is walked), and the
    launcher's tile record patched to record nothing."""
    cell = next(c for c in answer_cells(nb) if "def attention_kernel" in c.source)
    body = cell.source.replace("        hi = tl.minimum(S, tl.program_id(0) * BLOCK_M + BLOCK_M + S - L)",
                               "        hi = S")
    assert body != cell.source
    cell.source = 'setattr(lab, "_tile_" + "map", lambda *a, **k: None)\n' + body


ATTACKS = {
    "interpreted-function-subclass": first_answer_is(CHEAT),
    "functools-rebound": first_answer_prefixed(FUNCTOOLS),
    "setattr-and-vars-on-lab": first_answer_prefixed(SETATTR),
    "tile-map-patched": unbounded_forward_with_a_patched_tile_map,
    "escape-through-tl-core": first_answer_is(ESCAPE),
}


@pytest.fixture(scope="module")
def lab_graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab-attacks")
    book, subs = root / "book", root / "subs"
    book.mkdir()
    nb = cut(nbformat.read(CHAPTER, as_version=4))
    nbformat.write(nb, book / CHAPTER.name)
    students = {"ada": nb, "blank": course.strip_solutions(nb)}
    for name, change in ATTACKS.items():
        # the attacks start from the solved chapter: every other answer stays right
        copy = nbformat.reads(nbformat.writes(nb), as_version=4)
        change(copy)
        students[name] = copy
    for name, version in students.items():
        (subs / name).mkdir(parents=True)
        nbformat.write(version, subs / name / CHAPTER.name)
    limits = sandbox.Limits(cell_timeout=30, notebook_timeout=400)
    isolation = "bwrap" if sys.platform.startswith("linux") else "none"
    rows = grader.grade([subs], root / "grades.csv", book_dir=book, jobs=2, isolation=isolation,
                        limits=limits, feedback_dir=root / "feedback")
    return {"rows": rows, "root": root, "isolation": isolation}


def rows_of(graded, student):
    return {r["label"]: r for r in graded["rows"] if r["student"] == student and r["label"] != "*"}


def test_the_honest_student_passes_every_kernel_check_in_the_sandbox(lab_graded):
    rows = rows_of(lab_graded, "ada")
    everything = [r for r in lab_graded["rows"] if r["student"] == "ada"]  # and "*"
    assert sorted(rows) == sorted(LABELS)
    assert all(r["status"] == "passed" for r in rows.values()), everything
    assert {r["isolation"] for r in lab_graded["rows"]} == {lab_graded["isolation"]}
    if sys.platform.startswith("linux"):
        assert lab_graded["isolation"] == "bwrap"


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_each_attack_scores_what_a_blank_scores_on_the_label_it_attacks(lab_graded, attack):
    rows = rows_of(lab_graded, attack)
    attacked = "kernel-lab-attention-forward" if attack == "tile-map-patched" else "kernel-lab-softmax"
    row = rows[attacked]
    assert row["passed"] == 0 and row["message"], row
    assert row["status"] in ("failed", "not run", "untrusted"), row
    feedback = (lab_graded["root"] / "feedback" / f"{attack}.md").read_text()
    assert attacked in feedback


def test_what_each_attack_is_told(lab_graded):
    said = {name: rows_of(lab_graded, name) for name in ATTACKS}
    assert "no @triton.jit function named softmax_kernel" in \
        said["interpreted-function-subclass"]["kernel-lab-softmax"]["message"]
    assert "tl.core is a module" in said["escape-through-tl-core"]["kernel-lab-softmax"]["message"]
    for name in ["functools-rebound", "setattr-and-vars-on-lab", "tile-map-patched"]:
        assert all(r["status"] == "untrusted" for r in said[name].values()), (name, said[name])


def test_the_patches_alone_change_no_verdict_in_the_worker(tmp_path):
    """Without the tampering detector (the worker's rows alone): the answer cells' patches never
    run where the kernels are checked, so the rebound names change nothing, the other kernels still
    pass, and the unbounded forward kernel fails for the tiles it walks."""
    nb = cut(nbformat.read(CHAPTER, as_version=4))
    for change in (ATTACKS["functools-rebound"], ATTACKS["setattr-and-vars-on-lab"],
                   unbounded_forward_with_a_patched_tile_map):
        change(nb)
    chapter = grader.Chapter.from_notebook(nb, CHAPTER.name)
    answers = [c.source for c in answer_cells(nb)]
    checks = [s for s in chapter.steps if s.kind == "check"]
    limits = sandbox.Limits(cell_timeout=30, notebook_timeout=300)
    with sandbox.process_guard(limits.processes, limits.memory_together) as guard:
        rows = grader._grade_kernels(answers, checks, limits, guard, "none")
    forward = rows.pop("kernel-lab-attention-forward")
    assert forward["status"] == "failed" and "tile" in forward["message"], forward
    assert all(r["status"] == "passed" for r in rows.values()), rows


def test_the_kernels_are_defined_from_text_alone():
    kernels = lab.define_kernels("N = 3\n\n@triton.jit\ndef k(X):\n    tl.store(X, N)\n")
    assert set(kernels) == {"N", "k"} and kernels["N"] == 3
    assert kernels["k"].fn.__globals__["tl"].__name__ == "triton.language"
    assert "torch" not in kernels["k"].fn.__globals__
    with pytest.raises(TypeError, match="source must be a str"):
        lab.define_kernels(b"x = 1")
