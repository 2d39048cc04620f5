"""The GitHub workflows: valid against GitHub's schema, and doing what README.md says they do.

GitHub only runs them on its own servers, so here they are checked the two ways that can be
checked offline: against the workflow JSON schema (check-jsonschema's vendored copy of
SchemaStore's), and against this repository: every make target, script, test file, benchmark
and command-line option a workflow calls exists.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
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
    assert "tests/test_kernels_gpu.py" in runs
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
