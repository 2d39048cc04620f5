"""tools/gpu_check.py without a GPU: one chapter's run and what it records, the report it writes,
the test results it reads, and that every command it would run on a GPU exists here.

The check itself runs on a CUDA machine (``make gpu-check``); what it needs no GPU for is tested here,
so that a lent GPU's minutes go to the chapters and kernels, not to the tool's own bugs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tool():
    return load_script(ROOT / "tools" / "gpu_check.py")


def test_a_chapter_run_records_its_failure_and_what_it_printed_of_the_gpu(tool, tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell('print("cuda" if False else "no cuda here")'),
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_code_cell('raise ValueError("cu_seqlens must be on cuda:0")'),
        nbformat.v4.new_code_cell('print("never")'),
    ]
    path = tmp_path / "chapter.ipynb"
    nbformat.write(nb, path)
    tool.run_chapter(path, tmp_path / "result.json", timeout=120)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["chapter"] == "chapter" and result["status"] == "failed"
    assert result["failure"]["cell"] == 2
    assert result["failure"]["error"] == "ValueError: cu_seqlens must be on cuda:0"
    assert "\x1b[" not in result["failure"]["traceback"]  # no terminal colours
    assert result["gpu_outputs"] == [{"cell": 0, "output": "no cuda here\n"}]
    assert result["seconds"] > 0


def test_a_passing_chapter(tool, tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print(1 + 1)")]
    nbformat.write(nb, tmp_path / "ok.ipynb")
    tool.run_chapter(tmp_path / "ok.ipynb", tmp_path / "ok.json", timeout=120)
    result = json.loads((tmp_path / "ok.json").read_text())
    assert result["status"] == "passed" and result["failure"] is None


def test_the_report_in_markdown(tool):
    report = {
        "environment": {"date": "2026-11-27 12:00 UTC", "commit": "0123456789abcdef", "python": "3.12.3",
                        "torch": "2.11.0", "cuda": "13.0", "triton": "3.6.0", "driver": "580",
                        "device": "NVIDIA H100 80GB HBM3", "capability": [9, 0]},
        "seconds": 400.0,
        "chapters": [
            {"chapter": "flash", "status": "passed", "seconds": 40.2, "failure": None},
            {"chapter": "kernel_lab", "status": "failed", "seconds": 3.0,
             "failure": {"cell": 8, "error": "AssertionError: a | b\nmore"}},
        ],
        "tests": {"test_kernels_gpu": {"passed": 45, "failed": 1, "errors": 0, "skipped": 0, "seconds": 81,
                                       "timed_out": False, "failures": ["test_x: boom"]}},
        "benchmarks": {"bench_flash": {"status": "passed", "seconds": 60, "command": "benchmarks/bench_flash.py",
                                       "output": "table"}},
    }  # fmt: skip
    text = tool.markdown(report)
    assert text.startswith("# GPU check: NVIDIA H100 80GB HBM3\n")
    assert "commit `0123456789ab`" in text and "compute capability 9.0" in text
    assert "| flash | passed | 40.2 |  |" in text
    assert "| kernel_lab | failed | 3.0 | cell 8: AssertionError: a \\| b more |" in text
    assert "| test_kernels_gpu | 45 | 1 | 0 | 0 | 81 |" in text and "- test_x: boom" in text
    assert "### bench_flash: passed, 60 s" in text and "```\ntable\n```" in text
    assert tool.slug(report["environment"]["device"]) == "nvidia-h100-80gb-hbm3"


def test_junit_results_are_counted(tool, tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text(
        '<testsuites><testsuite><testcase name="a"/><testcase name="b"><failure message="bad"/>'
        '</testcase><testcase name="c"><skipped/></testcase><testcase name="d"><error message="x"/>'
        "</testcase></testsuite></testsuites>"
    )
    counts = tool._junit(xml)
    assert (counts["passed"], counts["failed"], counts["skipped"], counts["errors"]) == (1, 1, 1, 1)
    assert counts["failures"] == ["b: bad", "d: x"]
    assert tool._junit(tmp_path / "missing.xml")["errors"] == 1  # pytest never wrote it


def test_children_run_as_in_colab(tool, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    env = tool._child_env({"ATTNBOOK_AUTOTUNE": "0"})
    assert "TRITON_INTERPRET" not in env  # the kernels compile for the GPU
    assert env["PYTHONPATH"].split(":") == [str(ROOT), "/tmp/site"]
    assert env["ATTNBOOK_AUTOTUNE"] == "0" and env["MPLBACKEND"] == "Agg"


def test_it_stops_before_starting_when_a_chapter_module_is_missing(tool, monkeypatch, capsys):
    monkeypatch.setattr(tool, "CHAPTER_MODULES", ("nbclient", "no_such_module_here"))
    assert tool.main(["run", "--out", "/nonexistent"]) == 2
    assert "no_such_module_here" in capsys.readouterr().out


def test_every_command_it_runs_exists(tool):
    """The benchmarks' flags are their scripts' own, the test files and the selection
    exist, and ``make gpu-check`` calls the tool."""
    for name, args, share, _ in tool.BENCHMARKS:
        source = (ROOT / "benchmarks" / f"{name}.py").read_text()
        for flag in (a for a in args if a.startswith("--")):
            assert f'"{flag}"' in source, f"{name} has no {flag}"
        assert 0 < share < 1
    assert sum(share for *_, share, _ in tool.BENCHMARKS) == pytest.approx(1.0)
    assert (ROOT / "tests" / "kernels" / "test_kernels_gpu.py").exists()
    differential = (ROOT / "tests" / "properties" / "test_differential.py").read_text()
    assert len(re.findall(r"^def test_kernel_", differential, re.M)) >= 4
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^gpu-check:\n\t\$\(GPU_PYTHON\) tools/gpu_check.py run$", makefile, re.M)
    for module in tool.CHAPTER_MODULES:
        assert re.fullmatch(r"[a-z_]+", module)


def test_time_a_step_leaves_goes_to_the_next(tool, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(tool.time, "monotonic", lambda: clock[0])
    timeouts = tool._timeouts([0.5, 0.25, 0.25], 400)
    assert next(timeouts) == 200  # half of the whole
    clock[0] = 50.0  # the first step took 50 s of its 200
    assert next(timeouts) == 175  # half of the 350 left, the steps after it share the rest
    clock[0] = 100.0
    assert next(timeouts) == 300
    assert list(tool._timeouts([1.0], 10)) == [30.0]  # never under 30 s


def test_a_rerun_updates_its_entries_and_says_so(tool):
    old = {"environment": {"date": "d0", "commit": "aaa"}, "seconds": 400,
           "chapters": [{"chapter": "flash", "status": "passed"}, {"chapter": "kernel_lab", "status": "failed"}],
           "tests": {"t": {"passed": 1}}, "benchmarks": {"bench_flash": {"status": "timed out"}}}  # fmt: skip
    new = {"environment": {"date": "d1", "commit": "bbbbbbbbbbbbbbbb"}, "seconds": 90,
           "chapters": [{"chapter": "kernel_lab", "status": "passed"}], "tests": {},
           "benchmarks": {"bench_flash": {"status": "passed"}}}  # fmt: skip
    merged = tool.merge(old, new)
    assert [(c["chapter"], c["status"]) for c in merged["chapters"]] == [("flash", "passed"), ("kernel_lab", "passed")]
    assert merged["chapters"][1]["rerun"] == {"commit": "bbbbbbbbbbbbbbbb", "date": "d1"}
    assert "rerun" not in merged["chapters"][0] and merged["environment"]["commit"] == "aaa"
    assert merged["benchmarks"]["bench_flash"]["status"] == "passed" and merged["tests"] == old["tests"]
    assert merged["reruns"] == [{"commit": "bbbbbbbbbbbbbbbb", "date": "d1", "seconds": 90,
                                 "chapters": ["kernel_lab"], "tests": [], "benchmarks": ["bench_flash"]}]  # fmt: skip
    merged["environment"].update(python="3.12", torch="2.11", device="H200")
    merged["tests"] = {}
    merged["benchmarks"]["bench_flash"].update(seconds=60, command="x", output="table")
    merged["chapters"] = [{**c, "seconds": 1.0, "failure": None} for c in merged["chapters"]]
    text = tool.markdown(merged)
    assert "Re-run at commit `bbbbbbbbbbbb` (d1, 90 s): kernel_lab, bench_flash." in text
    assert "| kernel_lab (re-run at `bbbbbbbbbbbb`) | passed |" in text


def test_the_benchmarks_arguments_parse(tool):
    """Where a benchmark has parse_args, the GPU check's arguments pass it (bench_block_sparse
    refused 12..13: it needs two lengths between its ends)."""
    for name, args, _, writes_json in tool.BENCHMARKS:
        bench = load_script(ROOT / "benchmarks" / f"{name}.py")
        if hasattr(bench, "parse_args"):
            bench.parse_args(args + (["--json", "x.json"] if writes_json else []))
