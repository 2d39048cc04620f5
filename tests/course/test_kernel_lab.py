"""The kernel lab: its launchers, tile recorder, compile report and checks, and the lab graded
through the real grader.

The student kernels are the chapter's own solution cells (book/kernel_lab.ipynb), loaded from a
module file as a student's would be; they run in Triton's interpreter on CPU tensors
(tests/conftest.py sets ``TRITON_INTERPRET`` without a GPU). The launchers are compared with
independent references (``torch.softmax``, ``@``, attnbook's attention), the recorder with the
package's own FlashAttention kernel, the compile report with attnbook.kernels.compile's rule. After
a pass, ``check`` prints that report (one real compile here; the other cases count or fake the
compile worker's process), never ``run_check``, nor a grader that sets ATTNBOOK_COMPILE_REPORT=0.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
import re
import subprocess

import nbformat
import pytest
import torch
import triton.language as tl

import attnbook.kernels.lab as lab
from attnbook import course
from attnbook.course import checks as exercises  # the registry behind attnbook.exercises
from attnbook.course import grader, sandbox
from attnbook.core import scaled_dot_product_attention
from attnbook.exercises import check, run_check
from attnbook.kernels.flash_triton import _flash_forward
from test_wrong_answers_kernel_lab import CHAPTER, _SOLUTIONS, wrong_kernel


def solution(cell, name):
    return wrong_kernel(cell, name, [], "solution")


SOFTMAX = ("kl-softmax-solution", "softmax_kernel")
MATMUL = ("kl-matmul-solution", "matmul_kernel")
FORWARD = ("kl-forward-solution", "attention_kernel")
BACKWARD = ("kl-backward-solution", "backward_kernel")
SPARSE = ("kl-sparse-solution", "block_sparse_kernel")


# ---------------------------------------------------------------------------------------------
# The launchers, with the chapter's solutions, against independent references
# ---------------------------------------------------------------------------------------------
def test_softmax_launcher_equals_torch_softmax(gen):
    x = 30 * torch.randn(7, 100, generator=gen)
    torch.testing.assert_close(lab.softmax(solution(*SOFTMAX), x), torch.softmax(x, -1))


def test_matmul_launcher_equals_the_product_on_ragged_shapes(gen):
    a, b = torch.randn(37, 29, generator=gen), torch.randn(29, 18, generator=gen)
    torch.testing.assert_close(lab.matmul(solution(*MATMUL), a, b), a @ b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("L, S, causal", [(37, 37, True), (20, 45, True), (45, 20, True), (33, 50, False)])
def test_attention_launchers_equal_attention_and_its_gradients(gen, L, S, causal):
    q, k, v = (torch.randn(n, 16, generator=gen, dtype=torch.float64, requires_grad=True) for n in (L, S, S))
    out = scaled_dot_product_attention(q, k, v, is_causal=causal)
    grad = torch.randn(L, 16, generator=gen, dtype=torch.float64)
    out.backward(grad)
    q32, k32, v32 = (t.detach().float() for t in (q, k, v))
    got, lse = lab.attention_forward(solution(*FORWARD), q32, k32, v32, causal)
    torch.testing.assert_close(got.double(), out.detach(), atol=1e-5, rtol=1e-5)
    dk, dv = lab.attention_backward(solution(*BACKWARD), q32, k32, v32, got, lse, grad.float(), causal)
    torch.testing.assert_close(dk.double(), k.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(dv.double(), v.grad, atol=1e-5, rtol=1e-4)


def test_block_sparse_launcher_equals_block_sparse_attention(gen):
    from attnbook.sparse import block_sparse_attention

    q, k, v = (torch.randn(n, 16, generator=gen) for n in (40, 50, 50))
    layout = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    out, lse = lab.block_sparse_forward(solution(*SPARSE), q, k, v, layout)
    torch.testing.assert_close(out, block_sparse_attention(q, k, v, layout, 16), atol=1e-5, rtol=1e-5)
    assert torch.all(out[32:] == 0) and torch.all(lse[32:] == float("-inf"))  # an empty row


def test_a_kernel_defined_without_the_interpreter_still_runs_on_cpu(gen):
    """A student who imported triton before the lab gets a compiled-mode kernel: the launcher
    re-wraps it for the interpreter."""
    from triton.runtime.jit import JITFunction

    compiled = JITFunction(solution(*SOFTMAX).fn)
    x = torch.randn(3, 10, generator=gen)
    torch.testing.assert_close(lab.softmax(compiled, x), torch.softmax(x, -1))


def test_a_kernel_without_source_runs_and_passes_its_check():
    """tests/course/test_exercises.py executes solution cells with exec: Triton then has no source, and
    the interpreter runs the function as it is."""
    namespace = {}
    exec("import triton\nimport triton.language as tl\n" + _SOLUTIONS[FORWARD[0]], namespace)
    partial = functools.partial(lab.attention_forward, namespace[FORWARD[1]])
    assert run_check("kernel-lab-attention-forward", partial).passed


def test_a_stub_is_not_attempted_and_compiles_to_nothing():
    stub = course.strip_solutions(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(_SOLUTIONS[SOFTMAX[0]])]))
    namespace = {}
    exec("import triton\nimport triton.language as tl\n" + stub.cells[0].source, namespace)
    result = run_check("kernel-lab-softmax", functools.partial(lab.softmax, namespace["softmax_kernel"]))
    assert not result.passed and "not attempted" in result.message
    with pytest.raises(NotImplementedError):
        lab.compile_report(namespace["softmax_kernel"], {"BLOCK": 128})


@pytest.mark.parametrize("cell, name, label, launcher", [
    (*SOFTMAX, "kernel-lab-softmax", lab.softmax), (*MATMUL, "kernel-lab-matmul", lab.matmul),
    (*FORWARD, "kernel-lab-attention-forward", lab.attention_forward),
    (*BACKWARD, "kernel-lab-attention-backward", lab.attention_backward),
    (*SPARSE, "kernel-lab-block-sparse", lab.block_sparse_forward)])  # fmt: skip
def test_each_check_accepts_the_chapters_solution_on_fresh_inputs(cell, name, label, launcher):
    from attnbook.course.checks.common import fresh_inputs

    with fresh_inputs(2**40 + 11):
        assert run_check(label, functools.partial(launcher, solution(cell, name))).passed


# ---------------------------------------------------------------------------------------------
# The tile recorder and its picture
# ---------------------------------------------------------------------------------------------
def test_recorder_sees_the_packages_causal_kernel_skip_the_upper_triangle(gen):
    q, k, v = (torch.randn(1, 1, 96, 16, generator=gen) for _ in range(3))
    with lab.record_loads(Q=q, K=k, V=v) as record:
        _flash_forward(q, k, v, is_causal=True)
    block = 32  # the package's tile under the interpreter
    assert record.tiles("K", block) == {(i, 0, 0): list(range(i + 1)) for i in range(3)}
    assert record.tiles("Q", block) == {(i, 0, 0): [i] for i in range(3)}
    with lab.record_loads(K=k) as dense:
        _flash_forward(q, k, v, is_causal=False)
    assert all(tiles == [0, 1, 2] for tiles in dense.tiles("K", block).values())


def test_recorder_counts_only_the_lanes_a_mask_lets_through(gen):
    x = torch.randn(3, 37, generator=gen)  # BLOCK = 64: 27 masked lanes per row
    with lab.record_loads(X=x) as record:
        lab.softmax(solution(*SOFTMAX), x)
    assert record.rows("X") == {(r, 0, 0): {r} for r in range(3)}
    assert len(record.loads) == 3


def test_launcher_reports_the_key_tiles_each_program_loaded_and_the_dots_on_each(gen):
    q, k, v = (torch.randn(48, 16, generator=gen) for _ in range(3))
    *_, record = lab.attention_forward(solution(*FORWARD), q, k, v, True, record_tiles=True)
    below = torch.ones(3, 3, dtype=torch.long).tril()
    assert torch.equal(record["loads"], below)  # one load of K per tile it needs
    assert torch.equal(record["dots"], torch.cat([2 * below, torch.zeros(3, 1, dtype=torch.long)], 1))
    *_, record = lab.attention_forward(lab._two_pass_forward, q, k, v, True, record_tiles=True)
    assert (record["loads"] == 2).all() and (record["dots"][:, :3] == 3).all()  # two passes, all tiles
    dk, dv, record = lab.attention_backward(solution(*BACKWARD), q, k, v, q, torch.zeros(48), v, True,
                                            record_tiles=True)
    assert torch.equal(record["loads"], below.T)  # key tile j walks the query tiles from j on
    assert torch.equal(record["dots"][:, :3], 4 * below.T) and not record["dots"][:, 3].any()  # 4 dots


def test_a_dot_on_a_fully_masked_tile_counts_as_work_and_tiles_past_the_end_have_a_column(gen):
    """A tile whose loads the mask turns off entirely loads nothing, but a tl.dot on it is work:
    it counts for the tile the pointers address, or for the column past the last tile."""
    q, k, v = (torch.randn(n, 16, generator=gen) for n in (20, 40, 40))
    one_more = wrong_kernel(*FORWARD, [("for start in range(0, hi, BLOCK_N):",
                                        "for start in range(0, hi + BLOCK_N, BLOCK_N):")], "one_more")
    out, _, record = lab.attention_forward(one_more, q, k, v, False, record_tiles=True)
    torch.testing.assert_close(out, scaled_dot_product_attention(q, k, v), atol=1e-5, rtol=1e-5)
    assert record["loads"].tolist() == [[1, 1, 1]] * 2  # the step past S loads nothing...
    assert record["dots"].tolist() == [[2, 2, 2, 2]] * 2  # ...but runs its two dots there


def test_each_output_has_a_row_stride_of_its_own_and_nan_rows_before_and_after(gen):
    """A kernel that walks one tensor with another's row stride must leave it: no two tensors of a
    launch share a row stride, and each output sits between 16 rows of NaN."""
    q, k, v = (torch.randn(n, 16, generator=gen) for n in (20, 37, 37))
    out, lse = lab.attention_forward(solution(*FORWARD), q, k, v, True)
    dk, dv = lab.attention_backward(solution(*BACKWARD), q, k, v, out, lse, q, True)
    assert out.stride(0) != 16 and len({16, dk.stride(0), dv.stride(0)}) == 3  # q, k, v's are 16
    for t in (out, dk, dv, lse):
        room = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage())
        below = room[: t.storage_offset()]
        assert t.storage_offset() >= 16 * t.stride(0) and torch.isnan(below).all()
    again, _ = lab.attention_forward(solution(*FORWARD), q, k, v, True)
    assert again.stride() == out.stride()  # drawn from the inputs' strides: a launch repeats


def test_a_load_outside_its_tensor_raises_and_says_where_and_why(gen):
    """Under the interpreter the launchers refuse a load that leaves the tensors, which a masked
    store would hide: a ragged tile not masked, an offset gone negative, another tensor's stride."""
    a, b = torch.randn(37, 29, generator=gen), torch.randn(29, 18, generator=gen)
    rows = wrong_kernel(*MATMUL, [("mask=(rows[:, None] < M) & (ks[None, :] < K)", "mask=ks[None, :] < K")],
                        "unit_rows")
    with pytest.raises(AssertionError, match=r"loaded outside a \(37, 29\) \(program \(2, 0\): a\[37, 0\]\): "
                       r"the last, ragged tile read past the end of a \(37 rows\): mask the load with rows < M"):
        lab.matmul(rows, a, b)
    q, k, v = (torch.randn(n, 16, generator=gen) for n in (20, 50, 50))
    negative = wrong_kernel(*BACKWARD, [("lo = tl.maximum(0, tl.program_id(0) * BLOCK_N - (S - L))",
                                         "lo = (tl.program_id(0) * BLOCK_N - (S - L))")], "unit_negative")
    with pytest.raises(AssertionError, match=r"loaded outside q \(20, 16\) \(program 0: q\[-16, 0\]\): a row "
                       r"before the first, from an offset that went negative"):
        lab.attention_backward(negative, q, k, v, q, torch.zeros(20), q, True)
    stride = wrong_kernel(*FORWARD, [("* stride_v", "* stride_k")], "unit_stride")
    k_wide, v_wide = (torch.randn(50, n, generator=gen)[:, :16] for n in (32, 48))  # q's rows: 16 apart
    with pytest.raises(AssertionError, match=r"loaded outside v \(50, 16\) \(program 0\): it steps 32 elements "
                       r"from one row of v to the next, k's row stride \(stride_k\), but v's rows are 48 apart: "
                       r"use stride_v for v"):
        lab.attention_forward(stride, q, k_wide, v_wide, False)


@pytest.mark.parametrize("salt", [0, 1, 2**40 + 11])
def test_the_attention_checks_draw_every_residue_of_s_minus_l_and_a_thousand_tokens(salt):
    """The causal bound off by one shows for one residue of S - L modulo the tiles, float16
    accumulators past a thousand keys or queries: every run of a check has both, whatever its seed."""
    from attnbook.course.checks import kernel_lab as checks
    from attnbook.course.checks.common import fresh_inputs, generator

    with fresh_inputs(salt):
        forward = checks._attention_shapes(generator(252), checks._long_forward(generator(1)))
        backward = checks._attention_shapes(generator(253), checks._long_backward(generator(2)))
        layouts = [checks._layout(generator(254 + i), (3, 4)) for i in range(5)]
    for cases in (forward, backward):
        causal = [(L, S) for L, S, _, is_causal, *_ in cases if is_causal]
        assert {(S - L) % 16 for L, S in causal} == set(range(16))
        assert any(S - L >= 16 for L, S in causal) and any(L >= 17 and S < L for L, S in causal)
        assert any(S % 16 and not is_causal for _, S, _, is_causal, *_ in cases)  # a ragged last key tile
        assert all(L >= 1 and S >= 1 for L, S, *_ in cases)
    assert any(S >= 1000 and dtype == torch.float16 for _, S, _, _, dtype, _ in forward)
    assert any(L >= 1000 and dtype == torch.float16 for L, _, _, _, dtype, _ in backward)
    for layout in layouts:  # the ragged last key block read, an empty row, a block no row reads
        assert layout[:, -1].any() and (~layout.any(1)).any() and (~layout.any(0)).any()


def test_the_chapters_wasteful_kernel_is_not_part_of_the_api():
    assert "causal_kernel_without_bound" not in lab.__all__ and not hasattr(lab, "causal_kernel_without_bound")
    assert not any(name.startswith("_") for name in lab.__all__)


def test_plot_loads_draws_one_panel_per_program(gen):
    import matplotlib

    matplotlib.use("Agg")
    q, k, v = (torch.randn(40, 16, generator=gen) for _ in range(3))
    with lab.record_loads(Q=q, K=k, V=v) as record:
        lab.attention_forward(solution(*FORWARD), q, k, v, True)
    fig = lab.plot_loads(record, title="causal")
    images = [ax for ax in fig.axes if ax.images and ax.get_title().startswith("program")]
    assert len(images) == 3  # three query tiles of 16, the last ragged
    last = images[-1].images[0].get_array()
    assert last[0, 1] == 1 and last[2, 1] == 8 / 8  # the last program loads the ragged tile too
    first = images[0].images[0].get_array()
    assert first[0, 1] == 1 and first[1, 1] == 0 and first[0, 0] == 1 and first[1, 0] == 0


# ---------------------------------------------------------------------------------------------
# The compile report
# ---------------------------------------------------------------------------------------------
def test_compile_report_compiles_for_the_three_gpus_and_agrees_with_fits():
    from attnbook.kernels.compile import fits

    report = lab.compile_report(solution(*FORWARD), {"HEAD_DIM": 64, "CAUSAL": True, "BLOCK_M": 64,
                                                     "BLOCK_N": 64}, torch.float16)
    assert [r.capability for r in report] == [75, 80, 90]
    assert all(r.registers > 0 and r.shared > 0 and r.dtype == "float16" for r in report)
    text = lab.format_report(report).splitlines()
    verdicts = [line for line in text if line.startswith("sm")]
    assert len(verdicts) == 3
    for r, line in zip(report, verdicts):
        assert line.endswith("fits") == fits(r)[0]
    assert all(len(line) <= 86 for line in text)


def test_format_report_says_when_a_kernel_would_not_launch():
    from attnbook.kernels.compile import Resources

    big = Resources("k", "k", 75, "float16", 128, 96 * 1024, 128, 0, 0)
    spill = Resources("k", "k", 80, "float16", 128, 1024, 255, 64, 0)
    text = lab.format_report([big, spill])
    assert "WOULD NOT LAUNCH" in text and "64 KiB per block" in text and "SPILLS" in text
    assert "needs 96 KiB of shared memory, the T4 allows 64 KiB" in text
    assert all(len(line) <= 86 for line in text.splitlines())  # the chapter's output width


# ---------------------------------------------------------------------------------------------
# The report a check prints after a pass
# ---------------------------------------------------------------------------------------------
LABS = [(*SOFTMAX, "kernel-lab-softmax", lab.softmax), (*MATMUL, "kernel-lab-matmul", lab.matmul),
        (*FORWARD, "kernel-lab-attention-forward", lab.attention_forward),
        (*BACKWARD, "kernel-lab-attention-backward", lab.attention_backward),
        (*SPARSE, "kernel-lab-block-sparse", lab.block_sparse_forward)]
ROW = {"config": None, "shared": 16 * 1024, "registers": 96, "local": 0, "stack": 0}


@pytest.fixture
def reports(monkeypatch):
    """Reports on, whatever the environment says (an nbgrader config run in this process sets the
    switch), and compile_report's cache empty for the test."""
    monkeypatch.setenv("ATTNBOOK_COMPILE_REPORT", "1")
    monkeypatch.delenv("ATTNBOOK_COMPILE_REPORT")
    monkeypatch.setattr(lab, "_COMPILED", {})


def worker(monkeypatch, returncode=0, stderr="", fake=True):
    """The jobs handed to compile_report's worker process; with ``fake``, answered without
    compiling (one ``ROW`` per target, or ``returncode`` and ``stderr``)."""
    jobs, real = [], subprocess.run

    def run(command, *args, **kwargs):
        job = json.loads(kwargs["input"])
        jobs.append(job)
        if not fake:
            return real(command, *args, **kwargs)
        rows = [{**ROW, "kernel": job["name"], "label": job["name"]}] * len(job["targets"])
        return subprocess.CompletedProcess(command, returncode, json.dumps(rows), stderr)

    monkeypatch.setattr(lab.subprocess, "run", run)
    return jobs


def test_a_pass_prints_what_the_kernel_costs_on_a_t4_an_a100_and_an_h100_compiled_once(
        capsys, monkeypatch, reports):
    jobs = worker(monkeypatch, fake=False)  # a real compile, counted
    kernel = solution(*SOFTMAX)
    outputs = []
    for _ in range(2):  # running the check cell again compiles nothing
        assert check("kernel-lab-softmax", functools.partial(lab.softmax, kernel)).passed
        outputs.append(capsys.readouterr().out)
    assert len(jobs) == 1 and outputs[0] == outputs[1]
    assert jobs[0]["constexprs"] == {"BLOCK": 4096} and jobs[0]["targets"] == [75, 80, 90]
    assert jobs[0]["dtype"] == "fp16" and jobs[0]["name"] == "softmax_kernel"
    lines = outputs[0].splitlines()
    assert lines[:2] == ["[PASSED] kernel-lab-softmax: passed", "On a GPU (float16, 4 warps; BLOCK=4096):"]
    found = [re.match(r"sm(\d\d) (T4|A100|H100) +(\d+) registers +(\d+) B spilled +[\d.]+ KiB shared: (\w+)",
                      line) for line in lines[2:5]]
    assert [(m[1], m[2]) for m in found] == [("75", "T4"), ("80", "A100"), ("90", "H100")], lines
    assert all(0 < int(m[3]) <= 255 for m in found)
    assert all(int(m[4]) == 0 and m[5] == "fits" for m in found)  # a row of 4,096 in registers
    assert len(lines) == 5 and all(len(line) <= 86 for line in lines)


@pytest.mark.parametrize("cell, name, label, launcher", LABS)
def test_each_report_compiles_the_kernel_with_its_own_constexprs(monkeypatch, reports, cell, name,
                                                                  label, launcher):
    jobs = worker(monkeypatch)
    kernel = solution(cell, name)
    report = exercises.CHECKS[label].after_pass(functools.partial(launcher, kernel))
    constexprs = [n for n, p in inspect.signature(kernel.fn).parameters.items()
                  if p.annotation is tl.constexpr]
    assert len(jobs) == 1 and sorted(jobs[0]["constexprs"]) == sorted(constexprs)
    assert jobs[0]["constexprs"] == lab.GPU_CONSTEXPRS[launcher.__name__]
    assert all(value >= 32 for value in jobs[0]["constexprs"].values() if value is not True)  # GPU tiles
    assert [line[:4] for line in report.splitlines()[1:]] == ["sm75", "sm80", "sm90"]


def test_no_report_after_a_failure_nor_in_run_check(capsys, monkeypatch, reports):
    from test_wrong_answers_kernel_lab import _softmax

    jobs = worker(monkeypatch)
    wrong = _softmax([("e = tl.exp(x - tl.max(x, 0))", "e = tl.exp(x)")], "report_no_max")
    assert not check("kernel-lab-softmax", wrong).passed
    assert capsys.readouterr().out.startswith("[FAILED]") and jobs == []
    right = functools.partial(lab.softmax, solution(*SOFTMAX))
    assert run_check("kernel-lab-softmax", right).passed  # the grader's call
    assert capsys.readouterr().out == "" and jobs == []


@pytest.mark.parametrize("switch", ["0", "off", "False"])
def test_ATTNBOOK_COMPILE_REPORT_0_turns_the_report_off(capsys, monkeypatch, reports, switch):
    jobs = worker(monkeypatch)
    monkeypatch.setenv("ATTNBOOK_COMPILE_REPORT", switch)
    assert check("kernel-lab-softmax", functools.partial(lab.softmax, solution(*SOFTMAX))).passed
    assert capsys.readouterr().out == "[PASSED] kernel-lab-softmax: passed\n" and jobs == []


def test_the_graders_of_the_course_kit_get_no_report(capsys, monkeypatch, reports):
    """nbgrader: the nbgrader_config.py the kit writes sets the switch for its kernels; otter: its
    grading mode (the first cell otter adds when it grades a notebook) turns the report off."""
    from traitlets.config import Config

    import otter

    jobs = worker(monkeypatch)
    answer = functools.partial(lab.softmax, solution(*SOFTMAX))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # both restored when the test ends
    exec(course.nbgrader_config({"kernel_lab": 8.0}), {"get_config": Config})
    assert os.environ["ATTNBOOK_COMPILE_REPORT"] == "0"
    assert check("kernel-lab-softmax", answer).passed
    monkeypatch.delenv("ATTNBOOK_COMPILE_REPORT")
    monkeypatch.setattr(otter.Notebook, "_grading_mode", True)
    assert check("kernel-lab-softmax", answer).passed
    assert capsys.readouterr().out == "[PASSED] kernel-lab-softmax: passed\n" * 2 and jobs == []
    monkeypatch.setattr(otter.Notebook, "_grading_mode", False)  # a student's own run
    assert check("kernel-lab-softmax", answer).passed
    assert "sm90" in capsys.readouterr().out and len(jobs) == 1


def test_a_report_that_cannot_be_made_leaves_the_pass_and_says_why_in_one_line(capsys, monkeypatch,
                                                                               reports):
    worker(monkeypatch, returncode=1, stderr="Traceback ...\nRuntimeError: Failed to find C compiler. "
           "Please specify via CC environment variable.")
    answer = functools.partial(lab.softmax, solution(*SOFTMAX))
    result = check("kernel-lab-softmax", answer)
    assert result == exercises.CheckResult("kernel-lab-softmax", True, "passed")
    verdict, note = capsys.readouterr().out.splitlines()
    assert verdict == "[PASSED] kernel-lab-softmax: passed"
    assert note.startswith("(No report after the pass, the verdict stands: ValueError: compile_report: "
                           "Triton could not compile the kernel: RuntimeError: Failed to find C compiler")
    namespace = {}  # a kernel whose source Python cannot find (exec'd): the check passes all the same
    exec("import triton\nimport triton.language as tl\n" + _SOLUTIONS[SOFTMAX[0]], namespace)
    assert check("kernel-lab-softmax", functools.partial(lab.softmax, namespace["softmax_kernel"])).passed
    assert "source is not available" in capsys.readouterr().out.splitlines()[1]

    def boom(student):
        raise RuntimeError("the report broke\nin two lines")

    entry = exercises.CHECKS["kernel-lab-softmax"]
    for hook, why in [(boom, "RuntimeError: in two lines"), (lambda student: 42, "returned int, not text")]:
        monkeypatch.setitem(exercises.CHECKS, "kernel-lab-softmax", dataclasses.replace(entry, after_pass=hook))
        assert check("kernel-lab-softmax", answer).passed
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == 2 and lines[1].startswith("(No report after the pass") and why in lines[1], lines


def test_the_report_says_when_there_is_no_kernel_to_report_on(monkeypatch, reports):
    jobs = worker(monkeypatch)
    hook = exercises.CHECKS["kernel-lab-softmax"].after_pass
    kernel = solution(*SOFTMAX)
    for student in [lambda x: torch.softmax(x, -1), functools.partial(lab.softmax, print),
                    functools.partial(torch.softmax, kernel), functools.partial(lab.softmax)]:
        assert "there is no kernel to report on" in hook(student).replace("\n", " ")
    assert jobs == []
    with pytest.raises(TypeError, match="after_pass must be callable"):
        exercises.register("kernel-lab-never", "no hint", after_pass="report")


def test_on_a_gpu_the_forward_report_times_the_kernel_against_sdpa(monkeypatch, reports):
    """The timing line, with time_forward's own measurement faked (this machine has no GPU)."""
    worker(monkeypatch)
    asked = []

    def time_forward(kernel, **shape):
        asked.append(shape)
        return {"yours": 1.5, "sdpa": 0.25}

    monkeypatch.setattr(lab, "time_forward", time_forward)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    report = lab.cost_report(lab.attention_forward, solution(*FORWARD))
    assert asked == [{"seq_len": 4096, "head_dim": 64}]
    assert "On this NVIDIA H100 80GB HBM3, one causal head of 4,096 tokens: your kernel 1.500 ms, SDPA " \
           "0.250 ms" in report.replace("\n", " ")
    assert all(len(line) <= 86 for line in report.splitlines())
    assert " ms" not in lab.cost_report(lab.block_sparse_forward, solution(*SPARSE))  # no SDPA twin


# ---------------------------------------------------------------------------------------------
# Through the grader: solved, blank, and a kernel that never stops
# ---------------------------------------------------------------------------------------------
def test_the_grader_scores_a_solved_a_blank_and_a_looping_lab(tmp_path):
    from test_grading_chapters import cut

    nb = cut(nbformat.read(CHAPTER, as_version=4))
    book, subs = tmp_path / "book", tmp_path / "subs"
    book.mkdir()
    nbformat.write(nb, book / CHAPTER.name)
    looping = nbformat.reads(nbformat.writes(nb), as_version=4)
    for cell in looping.cells:
        if cell.id == FORWARD[0]:  # forgets `start += BLOCK_N`: the loop never ends
            cell.source = cell.source.replace(
                "    for start in range(0, hi, BLOCK_N):\n", "    start = 0\n    while start < hi:\n")
            assert "while start < hi" in cell.source
    for student, version in [("solved", nb), ("blank", course.strip_solutions(nb)), ("looping", looping)]:
        (subs / student).mkdir(parents=True)
        nbformat.write(version, subs / student / CHAPTER.name)
    rows = grader.grade([subs], tmp_path / "grades.csv", book_dir=book, jobs=2, isolation="none",
                        limits=sandbox.Limits(cell_timeout=15, notebook_timeout=400))
    by = {(r["student"], r["label"]): r for r in rows if r["label"] != "*"}
    labels = [label for student, label in by if student == "solved"]
    assert len(labels) == 5
    assert all(by["solved", label]["status"] == "passed" for label in labels), rows
    assert all(by["blank", label]["status"] == "failed" and "not attempted" in by["blank", label]["message"]
               for label in labels)
    looped = [r for r in rows if r["student"] == "looping"]  # with its "*" rows: why
    stuck = by["looping", "kernel-lab-attention-forward"]
    # interrupted ("your answer ran longer than 15 s"), or stopped when it ignored the
    # interrupt ("your kernel stopped: a cell ran longer than 15 s and ignored ...")
    assert stuck["passed"] == 0 and "ran longer than" in stuck["message"], looped
    for label in labels:  # the loop costs only its own check: the others still ran
        if label != "kernel-lab-attention-forward":
            assert by["looping", label]["status"] == "passed", looped
    errors = [r["message"] for r in rows if r["label"] == "*" and r["status"] == "error"]
    assert not errors, errors
    assert os.path.exists(tmp_path / "gradebook.csv")


def test_inputs_move_to_the_gpu_with_their_guard_band(gen):
    """On a GPU the launchers copy a view's whole storage, so the NaN band around a check's
    input stays where a kernel that reads too far finds it (shown here with the meta device)."""
    room = torch.full((6, 8), float("nan"))
    room[:4, :5] = torch.randn(4, 5, generator=gen)
    view = room[:4, :5]
    moved = lab._moved(view, torch.device("meta"))
    assert moved.shape == view.shape and moved.stride() == view.stride() == (8, 1)
    assert moved.untyped_storage().nbytes() == room.untyped_storage().nbytes()
    assert lab._moved(view, torch.device("cpu")) is view


def test_recorders_nest(gen):
    q, k, v = (torch.randn(32, 16, generator=gen) for _ in range(3))
    with lab.record_loads(K=k) as outer:
        with lab.record_loads(Q=q) as inner:
            lab.attention_forward(solution(*FORWARD), q, k, v, True)
        lab.attention_forward(solution(*FORWARD), q, k, v, True)
    assert inner.tiles("Q") == {(0, 0, 0): [0], (1, 0, 0): [1]}
    assert len(outer.loads) == 2 * 3  # both launches: 1 + 2 key tiles each
    assert outer.tiles("K") == {(0, 0, 0): [0], (1, 0, 0): [0, 1]}


_INTERPRETER_OFF = r'''
import functools, json, os, sys
import triton  # first: with triton imported, the lab leaves the interpreter off
from triton.runtime.jit import JITFunction
import torch
import attnbook.kernels.lab as lab
import attnbook.kernels.flash_triton as flash_triton
from attnbook.exercises import run_check

assert os.environ.get("TRITON_INTERPRET") == "0"
assert type(flash_triton._fwd_kernel) is JITFunction  # compiled kernels, as on a GPU
run = JITFunction.run
q, k, v = (torch.randn(1, 1, 64, 16, generator=torch.Generator().manual_seed(i))
           for i in range(3))
with lab.record_loads(Q=q, K=k, V=v) as record:
    out, _ = flash_triton._flash_forward(q, k, v, is_causal=True)
exact = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
sys.path.insert(0, sys.argv[1])
from solutions import softmax_kernel  # defined here with the interpreter off
verdict = run_check("kernel-lab-softmax", functools.partial(lab.softmax, softmax_kernel))
wasteful = run_check("kernel-lab-attention-forward",
                     functools.partial(lab.attention_forward, lab._two_pass_forward))
print(json.dumps({
    "error": (out - exact).abs().max().item(),
    "tiles": {str(p[0]): t for p, t in record.tiles("K", block=32).items()},
    "restored": JITFunction.run is run and os.environ["TRITON_INTERPRET"] == "0",
    "softmax": [verdict.passed, verdict.message],
    "wasteful": [wasteful.passed, wasteful.message],
}))
'''


def test_the_lab_runs_where_the_interpreter_is_off(tmp_path):
    """On a GPU machine Triton's interpreter is off, so ``@triton.jit`` makes compiled
    kernels: there the chapter's tile recordings stopped, since they run the library's
    kernels on CPU tensors. With ``TRITON_INTERPRET=0`` on this CPU the same holds;
    :func:`lab.interpreting` runs each launch on CPU tensors in an interpreted twin, the
    ``@triton.jit`` helpers of ``tl.max`` and ``tl.sum`` included, and puts everything
    back afterwards."""
    source = "import triton\nimport triton.language as tl\n\n\n" + _SOLUTIONS[SOFTMAX[0]]
    (tmp_path / "solutions.py").write_text(source)
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run(
        [os.sys.executable, "-c", _INTERPRETER_OFF, str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["error"] < 1e-5
    assert result["tiles"] == {"0": [0], "1": [0, 1]}  # the upper triangle skipped
    assert result["restored"]
    assert result["softmax"][0], result["softmax"][1]
    assert not result["wasteful"][0] and "loaded key tile" in result["wasteful"][1]  # the record works there


def test_launches_compile_float32_products_exactly(monkeypatch):
    """A GPU rounds float32 ``tl.dot`` inputs to TF32 unless ``TRITON_F32_DEFAULT`` says
    otherwise when the kernel compiles: the launchers set it to ``ieee`` for the launch
    alone, so float32 checks hold a GPU to float32's accuracy, as the interpreter."""
    seen = []

    class Kernel:  # stands in for a @triton.jit function; records the environment
        fn = staticmethod(lambda X, Y: None)

        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.append(os.environ["TRITON_F32_DEFAULT"])

    monkeypatch.delenv("TRITON_F32_DEFAULT", raising=False)
    lab._launch(Kernel(), (1,), "softmax", 1, 2)
    assert seen == ["ieee"] and "TRITON_F32_DEFAULT" not in os.environ
    monkeypatch.setenv("TRITON_F32_DEFAULT", "tf32")
    lab._launch(Kernel(), (1,), "softmax", 1, 2)
    assert seen == ["ieee", "ieee"] and os.environ["TRITON_F32_DEFAULT"] == "tf32"


def test_interpreting_nests_and_restores():
    from triton.runtime.jit import JITFunction

    run, call = JITFunction.run, JITFunction.__call__
    before = os.environ.get("TRITON_INTERPRET")
    with lab.interpreting():
        assert lab._device().type == "cpu" and os.environ["TRITON_INTERPRET"] == "1"
        with lab.interpreting():
            assert JITFunction.run is not run
        assert JITFunction.run is not run  # the outer block still interprets
    assert JITFunction.run is run and JITFunction.__call__ is call
    assert os.environ.get("TRITON_INTERPRET") == before
