"""A reader on Colab, proven here: the chapters' install cell installs the built wheel into an
environment that holds only what a Colab runtime preinstalls, and a chapter runs top to bottom.

Every other test imports the checkout's attnbook, so the install cell (``import attnbook`` or
install) is always a no-op there. This test builds the wheel and the sdist from a copy of the
tracked files (``python -m build``: the sdist, then the wheel from the sdist), checks both with
``twine check``, creates a fresh virtual environment with Colab's preinstalled packages (the
pinned CPU torch standing in for Colab's CUDA build), and executes a chapter in a kernel of that
environment, with the install cell's one ``url = ...`` line pointed at the wheel by the release
tool's own function. It proves that the extras resolve, that installing never replaces the
runtime's torch, and that the package data the chapters need is inside the wheel.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from environments import linked_venv
from nbclient import NotebookClient
from scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
# Runs the FlashAttention kernels in Triton's interpreter, so it needs the `gpu` extra, and the
# kernel planner reads the compiled table that ships inside the wheel.
CHAPTER = ROOT / "book" / "flash.ipynb"
# What a Colab runtime has before the install cell runs (besides Jupyter's kernel).
COLAB = ["torch==2.13.0", "numpy", "matplotlib", "seaborn", "ipywidgets", "scikit-learn", "networkx",
         "ipykernel"]

release = load_script(ROOT / "tools" / "release.py")


def _run(*args, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, args))}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist and the wheel, built from the tracked files only (what a release ships)."""
    tmp = tmp_path_factory.mktemp("build")
    tracked = _run("git", "ls-files", "-z", cwd=ROOT).stdout.split("\0")
    src = tmp / "src"
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_bytes((ROOT / name).read_bytes())
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", tmp / "dist", src)
    return tmp / "dist"


@pytest.fixture(scope="module")
def colab(tmp_path_factory) -> Path:
    """A fresh environment holding Colab's preinstalled packages and nothing else: no attnbook
    (hard-linked from this one's installed files: tests/environments.py)."""
    env = tmp_path_factory.mktemp("colab") / "venv"
    python = linked_venv(env, COLAB)
    probe = "import torch, numpy, matplotlib, seaborn, sklearn, networkx, ipykernel, ipywidgets, pip"
    _run(python, "-c", probe, cwd=env)
    missing = subprocess.run([python, "-c", "import attnbook"], capture_output=True, cwd=env)
    assert missing.returncode != 0, "the fresh environment already has attnbook"
    return env


def test_both_distributions_pass_twine_check_and_the_wheel_holds_the_package(dist):
    wheel, sdist = next(dist.glob("*.whl")), next(dist.glob("*.tar.gz"))
    _run(sys.executable, "-m", "twine", "check", "--strict", wheel, sdist)
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "attnbook").rglob("*.py")
               if "__pycache__" not in p.parts}
    tracked = set(_run("git", "ls-files", "attnbook", cwd=ROOT).stdout.split())
    assert modules & tracked <= names, f"modules missing from the wheel: {sorted((modules & tracked) - names)}"
    assert "attnbook/kernels/compiled.json" in names, "the kernels' compiled table is not in the wheel"
    assert not any(n.startswith(("tests/", "book/", "benchmarks/")) for n in names)
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Provides-Extra: gpu" in metadata and "Requires-Dist: torch>=" in metadata


def test_the_install_cell_installs_the_wheel_and_the_chapter_runs_in_a_colab_like_runtime(dist, colab, tmp_path,
                                                                                        monkeypatch):
    wheel = next(dist.glob("*.whl"))
    python = colab / "bin" / "python"
    before = _run(python, "-c", "import torch; print(torch.__version__, torch.__file__)", cwd=tmp_path).stdout

    nb = nbformat.read(CHAPTER, as_version=4)
    install = next(c for c in nb.cells if c.cell_type == "code")
    assert release.install_url(install.source).startswith("git+"), "the chapter installs from git"
    install.source = release.with_install_url(install.source, wheel.as_uri())
    nb.cells.append(nbformat.v4.new_code_cell(
        "import json, sys, attnbook, torch\n"
        "from attnbook.kernels import tuning\n"
        "print(json.dumps({'python': sys.executable, 'attnbook': attnbook.__file__,\n"
        "                  'version': attnbook.__version__, 'rows': len(tuning._table()),\n"
        "                  'torch': f'{torch.__version__} {torch.__file__}'}))"))

    # a kernel of the Colab-like environment, found through its own kernelspec
    spec = tmp_path / "jupyter" / "kernels" / "colab"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Colab-like", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    work = tmp_path / "work"  # not the checkout: nothing there to import attnbook from
    work.mkdir()
    NotebookClient(nb, timeout=600, kernel_name="colab", resources={"metadata": {"path": str(work)}}).execute()

    errors = [(c.get("id"), o.ename) for c in nb.cells if c.cell_type == "code"
              for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors
    facts = json.loads(nb.cells[-1].outputs[-1].text)
    assert facts["python"] == str(python)
    assert Path(facts["attnbook"]).is_relative_to(colab), f"attnbook came from {facts['attnbook']}"
    assert facts["version"] == wheel.name.split("-")[1]
    assert facts["rows"] > 0, "the compiled kernel table did not load from the installed package"
    assert facts["torch"] == before.strip(), f"installing replaced the runtime's torch: {before} -> {facts['torch']}"
    frozen = _run(python, "-m", "pip", "list", "--format=json").stdout
    assert {p["name"].lower() for p in json.loads(frozen)} >= {"attnbook", "triton"}, "the gpu extra did not resolve"
