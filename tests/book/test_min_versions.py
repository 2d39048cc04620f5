"""The lowest torch that ``pyproject.toml`` admits (``torch>=X``) runs the package.

A fresh virtual environment gets exactly that release from PyPI (its CUDA build: PyTorch's CPU
index is not reachable from CI; the CUDA libraries load without a GPU), the package's other
runtime dependencies and pytest; it imports ``attnbook`` from this checkout and runs the unit
tests of the modules that lean on the newest torch: SDPA with ``enable_gqa``, FlexAttention
eager and compiled (``torch.compile`` on a CPU), ``nn.RMSNorm``, the masks and the multi-head
layers. About 3.5 GB of downloads the first time (pip's cache keeps them) and two to four
minutes.

How the floor was set: the whole unit suite was run on 2.5, 2.6, 2.7, 2.8 and 2.9 (see the
CHANGELOG). 2.5 and 2.6 refuse FlexAttention on head widths that are not powers of two; 2.7
and 2.8 fail to compile FlexAttention for a CPU; 2.9 passes.
"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
FLOOR = next(re.fullmatch(r"torch>=([\d.]+)", d)[1] for d in PROJECT["dependencies"]
             if d.startswith("torch"))  # fmt: skip
TESTS = ["tests/unit/test_flex.py", "tests/unit/test_core.py", "tests/unit/test_masks.py",
         "tests/unit/test_layers.py", "tests/unit/test_sparse.py"]  # fmt: skip


def _run(command: list[str], **kwargs) -> str:
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
    return done.stdout


def test_the_declared_floor_is_a_whole_release():
    assert re.fullmatch(r"2\.\d+(\.0)?", FLOOR), FLOOR
    assert any(d.startswith("torch>=") for d in PROJECT["dependencies"])


def test_the_lowest_torch_declared_runs_the_package(tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    others = [d for d in PROJECT["dependencies"] if not d.startswith("torch")]
    _run([python, "-m", "pip", "install", "-q", f"torch=={FLOOR}", *others, "pytest",
          "hypothesis"], timeout=1500)  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("VIRTUAL_ENV", None)
    version = _run([python, "-c", "import torch, attnbook; print(torch.__version__)"], env=env,
                   cwd=tmp_path, timeout=300)  # fmt: skip
    assert version.strip().split("+")[0] in (FLOOR, f"{FLOOR}.0"), version
    out = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *TESTS], env=env,
               cwd=ROOT, timeout=1500)  # fmt: skip
    assert re.search(r"\d+ passed", out) and "failed" not in out, out[-2000:]
