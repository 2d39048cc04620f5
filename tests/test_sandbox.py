"""The limits the grader puts on every kernel (attnbook.sandbox), tested on real processes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnbook import sandbox

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="rlimits and cgroups are Linux's")


@pytest.mark.parametrize("field", ["cell_timeout", "notebook_timeout", "memory", "processes", "output", "file_size"])
@pytest.mark.parametrize("value", [0, -1, True])
def test_limits_must_be_positive_and_the_error_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"Limits.{field} must be positive"):
        sandbox.Limits(**{field: value})


def launch(limits, code, guard=None):
    guard = guard or sandbox.ProcessGuard("none")
    command = sandbox.launcher_command(limits, guard, [sys.executable, "-c", code])
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


@linux
def test_the_launcher_sets_the_memory_and_file_limits_then_runs_the_command():
    limits = sandbox.Limits(memory=2 * sandbox.GIB, file_size=2**20)
    done = launch(limits, "import resource as r; print(r.getrlimit(r.RLIMIT_AS)[0], "
                          "r.getrlimit(r.RLIMIT_FSIZE)[0], r.getrlimit(r.RLIMIT_CORE)[0])")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(2 * sandbox.GIB), str(2**20), "0"]


@linux
def test_an_allocation_past_the_memory_limit_fails_and_the_process_lives_on():
    code = ("hoard = []\ntry:\n    while True:\n        hoard.append(bytearray(10**8))\n"
            "except MemoryError:\n    print(len(hoard))")
    done = launch(sandbox.Limits(memory=sandbox.GIB), code)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) <= 10  # 100 MB each: at most 1 GiB


@linux
def test_a_file_past_the_size_limit_cannot_be_written(tmp_path):
    code = f"open({str(tmp_path / 'big')!r}, 'wb').write(b'x' * 2**21)"
    done = launch(sandbox.Limits(file_size=2**20), code)
    assert done.returncode != 0 and "File too large" in done.stderr + str(done.returncode)


@linux
def test_the_process_guard_caps_forks_and_kills_what_is_left():
    code = ("import os, time\nn = 0\ntry:\n    for _ in range(100):\n        if os.fork() == 0:\n"
            "            os.close(1)\n            os.close(2)\n            time.sleep(60)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint(n)")
    with sandbox.process_guard(20) as guard:
        assert guard.kind in ("cgroup", "rlimit"), "no fork limit on this Linux machine"
        done = launch(sandbox.Limits(processes=20), code, guard)
        assert done.returncode == 0, done.stderr
        assert int(done.stdout) < 25  # 20 processes (cgroup), or 20 beyond the user's own (rlimit)
    if guard.cgroup is not None:
        assert not guard.cgroup.exists(), "the cgroup and its sleeping children were removed"


def test_the_launcher_needs_a_command():
    done = subprocess.run([sys.executable, "-m", "attnbook.sandbox", "--memory", "1000000000"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no command to run after --" in done.stderr


# ---------------------------------------------------------------------------------------------
# The grading container (grading/Dockerfile), for machines without bubblewrap
# ---------------------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "grading" / "Dockerfile"


def test_the_grading_dockerfile_pins_torch_installs_bubblewrap_and_requires_the_sandbox():
    text = DOCKERFILE.read_text()
    torch_version = re.search(r"^TORCH_VERSION \?= (\S+)", (ROOT / "Makefile").read_text(), re.M)[1]
    assert f"torch=={torch_version} --index-url https://download.pytorch.org/whl/cpu" in text
    assert "apt-get install -y --no-install-recommends bubblewrap" in text
    assert "USER grader" in text, "students' code must not run as root in the container"
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M)[1])
    assert entry[:4] == ["python", "-m", "attnbook.course", "grade"] and "--require-sandbox" in entry
    for source in re.findall(r"^COPY (.+) /src/?\S*$", text, re.M):
        for path in source.split():
            assert (ROOT / path).exists(), f"COPY {path}: no such path in the repository"
    assert "--network none" in text, "the documented run command keeps the container offline"


def _docker_daemon() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _docker_daemon(), reason="building the image needs a running Docker daemon")
def test_the_grading_image_builds_and_its_grader_starts():
    subprocess.run(["docker", "build", "-f", str(DOCKERFILE), "-t", "attnbook-grader-test", str(ROOT)],
                   check=True, timeout=1800)
    done = subprocess.run(["docker", "run", "--rm", "--network", "none", "attnbook-grader-test", "--help"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "--require-sandbox" in done.stdout


def test_the_sandbox_mounts_tmp_before_the_python_folders_it_binds(tmp_path):
    """bwrap mounts in order: a private /tmp mounted after the binds would hide a checkout or a
    virtual environment under /tmp (as in CI's fresh clone)."""
    args = sandbox.sandbox_arguments(tmp_path, tmp_path)
    tmpfs = args.index("--tmpfs")
    binds = [i for i, a in enumerate(args) if a == "--ro-bind" and args[i + 1] != "/usr" and i > 6]
    assert binds and all(i > tmpfs for i in binds), args
    assert args.index("--bind") > tmpfs and args[-1] == "--"
    assert {"--unshare-all", "--die-with-parent", "--new-session"} <= set(args)
    assert "/work" not in args and str(Path(__file__).resolve().parent.parent) not in args, \
        "the repository (with the book) is never bound, only the package inside it"
