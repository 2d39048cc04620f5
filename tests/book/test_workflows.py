"""The GitHub workflows: valid against GitHub's schema, and doing what README.md says they do.

GitHub only runs them on its own servers, so here they are checked the two ways that can be
checked offline: against the workflow JSON schema (check-jsonschema's vendored copy of
SchemaStore's), and against this repository: every make target, script, test file, benchmark
and command-line option a workflow calls exists.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
MAKEFILE = (ROOT / "Makefile").read_text()


def _load(name: str) -> dict:
    # YAML 1.1 reads the key `on` as True
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())
    flow["on"] = flow.pop(True, flow.get("on"))
    return flow


def _runs(flow: dict) -> str:
    return "\n".join(step.get("run", "") for job in flow["jobs"].values() for step in job["steps"])


def _uses(flow: dict) -> list[str]:
    return [step["uses"] for job in flow["jobs"].values() for step in job["steps"] if "uses" in step]


def test_the_four_workflows_exist():
    assert {p.name for p in WORKFLOWS} == {"tests.yml", "pages.yml", "release.yml", "gpu.yml"}


def test_every_workflow_validates_against_githubs_schema():
    checker = Path(sys.executable).with_name("check-jsonschema")
    result = subprocess.run([str(checker), "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "validation done" in result.stdout


def test_a_broken_workflow_is_caught_by_the_schema(tmp_path):
    """The schema check is not a formality: a job without runs-on fails it."""
    flow = yaml.safe_load((ROOT / ".github" / "workflows" / "tests.yml").read_text())
    del flow["jobs"]["test"]["runs-on"]
    broken = tmp_path / "broken.yml"
    broken.write_text(yaml.safe_dump(flow))
    checker = Path(sys.executable).with_name("check-jsonschema")
    result = subprocess.run([str(checker), "--builtin-schema", "vendor.github-workflows", str(broken)],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "runs-on" in result.stdout + result.stderr


def test_tests_run_ci_on_every_push_and_pull_request_with_a_cached_environment():
    flow = _load("tests.yml")
    assert "pull_request" in flow["on"] and flow["on"]["push"]["branches"] == ["main"]
    assert "bash .ci/run" in _runs(flow)
    assert any(u.startswith("actions/cache@") for u in _uses(flow))
    cache = next(s for s in flow["jobs"]["test"]["steps"] if s.get("uses", "").startswith("actions/cache@"))
    assert cache["with"]["path"] == ".venv" and "hashFiles('pyproject.toml', 'Makefile')" in cache["with"]["key"]
    assert flow["jobs"]["test"]["timeout-minutes"] <= 90


def test_pages_deploys_the_website_from_main():
    flow = _load("pages.yml")
    assert flow["on"]["push"]["branches"] == ["main"]
    assert flow["permissions"]["pages"] == "write" and flow["permissions"]["id-token"] == "write"
    assert "make book" in _runs(flow)
    uses = _uses(flow)
    assert any(u.startswith("actions/upload-pages-artifact@") for u in uses)
    assert any(u.startswith("actions/deploy-pages@") for u in uses)


def test_a_version_tag_publishes_every_release_asset():
    flow = _load("release.yml")
    assert flow["on"]["push"]["tags"] == ["v*.*.*"] and flow["permissions"]["contents"] == "write"
    runs = _runs(flow)
    for command in ("bash .ci/run", "make test-grading", "make pdf", "-m build --outdir dist", "twine check --strict dist/*",
                    "-m attnbook.course student student", "-m attnbook.course nbgrader nbgrader/source",
                    "tools/release.py --notes", "gh release create"):
        assert command in runs, f"release.yml does not run {command!r}"
    for asset in ("student", "nbgrader-source", "website", "dist/attention-book.pdf"):
        assert asset in runs, f"release.yml attaches no {asset}"
    intro = (ROOT / "intro.md").read_text()
    assert "/releases/latest/download/attention-book.pdf" in intro, "the website does not link the PDF"


def test_the_gpu_job_runs_only_on_a_registered_gpu_runner():
    flow = _load("gpu.yml")
    job = flow["jobs"]["gpu"]
    assert job["runs-on"] == ["self-hosted", "linux", "gpu"]
    assert "vars.HAS_GPU_RUNNER" in job["if"]
    runs = _runs(flow)
    assert "tests/kernels/test_kernels_gpu.py" in runs
    benches = re.findall(r"^\s*bench (\w+) (.*)$", runs, re.M)
    assert len(benches) >= 5
    for bench, args in benches:
        source = (ROOT / "benchmarks" / f"{bench}.py").read_text()
        assert "cuda" in args, f"{bench} does not run on the GPU"
        for option in re.findall(r"--[\w-]+", args):
            assert f'"{option}"' in source, f"benchmarks/{bench}.py takes no {option}"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_everything_a_workflow_calls_exists(path):
    runs = _runs(_load(path.name))
    for target in re.findall(r"\bmake (\w+)", runs):
        assert re.search(rf"^{target}:", MAKEFILE, re.M), f"{path.name}: no make target {target!r}"
    for file in re.findall(r"\b((?:tests|benchmarks|tools|\.ci)/[\w./-]+\.(?:py|sh)|\.ci/run)\b", runs):
        assert (ROOT / file).exists(), f"{path.name} calls {file}, which does not exist"
    for module in re.findall(r"-m (attnbook\.\w+)", runs):
        assert (ROOT / (module.replace(".", "/") + ".py")).exists() or (
            ROOT / module.replace(".", "/") / "__main__.py").exists(), f"{path.name}: no {module}"


# ---------------------------------------------------------------------------------------------
# .ci/run: the chapters executed in a kernel from the grading extra alone (tools/grading_kernel.py)
# ---------------------------------------------------------------------------------------------
grading_kernel = load_script(ROOT / "tools" / "grading_kernel.py")


def test_ci_builds_the_book_in_the_grading_kernel_and_checks_the_kernels_log():
    lines = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    build = lines.index(".venv/bin/python tools/grading_kernel.py build _build/grading-kernel")
    test = lines.index("make test BOOK_KERNELS=_build/grading-kernel")
    check = lines.index(".venv/bin/python tools/grading_kernel.py check _build/grading-kernel")
    assert lines.index("make install") < build < test < check == len(lines) - 1
    assert not any(re.match(r"make (book|test)\b", line) for line in lines[:test]), "one book build"


def _fresh_make_env() -> dict:
    """The environment without what an enclosing `make` passes down (CI runs pytest under `make
    test BOOK_KERNELS=...`, whose MAKEFLAGS would hand BOOK_KERNELS to every `make` below)."""
    drop = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "BOOK_KERNELS")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _book_command(*variables: str) -> str:
    done = subprocess.run(["make", "-n", "-o", ".venv/.installed", "book", *variables], cwd=ROOT,
                          capture_output=True, text=True, check=True, env=_fresh_make_env())
    return next(line for line in done.stdout.splitlines() if "jupyter-book build" in line)


def test_only_book_kernels_puts_a_kernel_first_on_jupyter_path_for_the_book_build():
    assert _book_command("BOOK_KERNELS=/ci/kernel").startswith(
        'JUPYTER_PATH="/ci/kernel${JUPYTER_PATH:+:$JUPYTER_PATH}" .venv/bin/jupyter-book build')
    assert _book_command().startswith(".venv/bin/jupyter-book build"), "a reader's `make book`"
    test = subprocess.run(["make", "-n", "-o", ".venv/.installed", "-o", "book", "test",
                           "BOOK_KERNELS=/ci/kernel"], cwd=ROOT, capture_output=True, text=True, check=True,
                          env=_fresh_make_env())
    assert "JUPYTER_PATH" not in test.stdout, "the tests run in .venv's kernels"


def _kernel_log(where: Path, book: Path, **change) -> tuple[list[str], list[str]]:
    """grading_kernel.check on a log in which one kernel of ``where/venv`` ran each
    chapter of ``book`` (fields of the first kernel's records replaced by ``change``)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from environments import grading_requirements, installed_closure

    seen = sorted(set(installed_closure([*grading_requirements(ROOT), "setuptools", "pip"])) | {"attnbook"})
    records = []
    for n, chapter in enumerate(sorted(book.glob("*.ipynb"))):
        start = {"prefix": str(where / "venv"), "python": "3.11", "path": [str(where / "venv")],
                 "distributions": seen}
        code = ["".join(c["source"]) for c in json.loads(chapter.read_text())["cells"] if c["cell_type"] == "code"]
        cells = [{"cell": grading_kernel.digest(source), "error": False, "foreign": []}
                 for source in code if source.strip()]  # nbclient skips blank cells
        if n == 0:
            start |= {k: v for k, v in change.items() if k in start}
            cells[-1] |= {k: v for k, v in change.items() if k in cells[-1]}
        records += [{"kernel": str(n), **record} for record in [start, *cells]]
    (where / grading_kernel.LOG).write_text("".join(json.dumps(r) + "\n" for r in records))
    return grading_kernel.check(where, book)


def test_the_grading_kernel_check_fails_unless_every_chapter_ran_there_and_reached_nothing_else(tmp_path):
    book = tmp_path / "book"
    book.mkdir()
    for name in ("one", "two"):
        nb = {"cells": [{"cell_type": "markdown", "source": ["# ", name]},
                        {"cell_type": "code", "source": [f"x = '{name}'\n", "print(x)"]},
                        {"cell_type": "code", "source": ["  \n"]},  # never executed
                        {"cell_type": "code", "source": ["import attnbook"]}]}
        (book / f"{name}.ipynb").write_text(json.dumps(nb))
    proof, failures = _kernel_log(tmp_path, book)
    assert not failures and proof[0].startswith(f"2 of 2 chapters in {book} ran")
    assert "pytest" in proof[2], "the proof names the test environment's packages it lacked"
    elsewhere = "/elsewhere/lib/python3.11/site-packages"
    bad = {
        "ran in": {"prefix": str(ROOT / ".venv")},
        "other distributions": {"distributions": ["attnbook", "pytest"]},
        "reached another environment: sys.path": {"path": [elsewhere]},
        "modules ['pytest": {"foreign": [f"pytest ({elsewhere}/pytest/__init__.py)"]},
        "a cell raised": {"error": True},
    }
    for message, change in bad.items():
        assert any(message in f for f in _kernel_log(tmp_path, book, **change)[1]), message
    assert not _kernel_log(tmp_path, book)[1]  # a clean log of one and two
    (book / "three.ipynb").write_text((book / "one.ipynb").read_text().replace("one", "three"))
    failures = grading_kernel.check(tmp_path, book)[1]
    assert failures == [f"three.ipynb: no kernel of {tmp_path} ran its 2 code cells (the book build "
                        "did not execute it there: did it reuse an older cache?)"]
