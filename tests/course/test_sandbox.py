"""The limits the grader puts on every kernel (attnbook.course.sandbox), tested on real processes."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from attnbook.course import sandbox

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
    done = subprocess.run([sys.executable, "-m", "attnbook.course.sandbox", "--memory", "1000000000"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no command to run after --" in done.stderr


# ---------------------------------------------------------------------------------------------
# The grading container (grading/Dockerfile), for machines without bubblewrap
# ---------------------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]
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
    args = sandbox.sandbox_arguments(tmp_path, sandbox.Limits())
    tmpfs = args.index("/tmp") - 1
    assert args[tmpfs] == "--tmpfs" and args[tmpfs - 2] == "--size", args
    binds = [i for i, a in enumerate(args) if a == "--ro-bind" and args[i + 1] != "/usr" and i > 6]
    assert binds and all(i > tmpfs for i in binds), args
    assert "--bind" not in args, "nothing of the host is writable in the sandbox"
    assert args[-5:] == ["--remount-ro", "/dev", "--remount-ro", "/", "--"]
    assert {"--unshare-all", "--die-with-parent", "--new-session"} <= set(args)
    assert "/work" not in args and str(Path(__file__).resolve().parents[2]) not in args, \
        "the repository (with the book) is never bound, only the package inside it"


@pytest.mark.parametrize("field", ["disk", "cpu_time", "total_memory"])
def test_the_new_limits_must_be_positive_or_default(field):
    with pytest.raises(ValueError, match=f"Limits.{field} must be positive"):
        sandbox.Limits(**{field: 0})
    limits = sandbox.Limits(notebook_timeout=99, memory=5 * sandbox.GIB)
    assert limits.cpu_seconds == 99 and limits.memory_together == 5 * sandbox.GIB


WRITE_EVERYWHERE = """
import os, sys
def fill(path, chunk=2**20):
    written = 0
    try:
        with open(path, "wb") as f:
            while written < 200 * chunk:
                f.write(b"x" * chunk)
                f.flush()
                written += chunk
    except OSError as err:
        return f"{written // chunk} MiB, then {err.strerror}"
    return f"{written // chunk} MiB"
for place in ["/tmp/work/f", "/tmp/home/f", "/dev/shm/f", "/f", "/dev/f", "/usr/f", sys.argv[1] + "/f"]:
    print(place, fill(place), flush=True)
"""


@linux
@pytest.mark.skipif(not sandbox.bwrap_works(), reason="needs bubblewrap")
def test_every_place_the_sandbox_can_write_is_a_tmpfs_of_a_fixed_size(tmp_path):
    """With a 64 MiB disk limit, /tmp (the working folder, home, sockets) takes 64 MiB in all and
    /dev/shm 16 MiB; the root, /dev, the Python folders and the grader's folder take nothing."""
    limits = sandbox.Limits(disk=64 * 2**20)
    command = [*sandbox.sandbox_arguments(tmp_path, limits), sys.executable, "-c", WRITE_EVERYWHERE,
               str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    got = {place: text for place, text in (line.split(" ", 1) for line in done.stdout.splitlines())}
    work, home = (int(got[p].split()[0]) for p in ["/tmp/work/f", "/tmp/home/f"])
    assert work + home <= 64 and "No space left on device" in got["/tmp/home/f"], got
    assert int(got["/dev/shm/f"].split()[0]) <= 16 and "No space left" in got["/dev/shm/f"], got
    for place in ["/f", "/dev/f", "/usr/f", str(tmp_path) + "/f"]:
        assert got[place].startswith("0 MiB, then ") and "No space" not in got[place], (place, got[place])
    assert list(tmp_path.iterdir()) == [], "the grader's folder is read-only in the sandbox"


@linux
def test_the_launcher_caps_cpu_time_and_adopts_orphans():
    code = ("import ctypes, resource\nflag = ctypes.c_int()\n"
            "ctypes.CDLL(None).prctl(37, ctypes.byref(flag), 0, 0, 0)\n"  # PR_GET_CHILD_SUBREAPER
            "print(*resource.getrlimit(resource.RLIMIT_CPU), flag.value)")
    done = launch(sandbox.Limits(cpu_time=7), code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["7", "12", "1"]


@linux
def test_the_kernels_processes_are_found_below_it_with_their_cpu_time():
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\nelse:\n    time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(100):
            tree = sandbox.descendants(proc.pid)
            if len(tree) == 2:
                break
            time.sleep(0.05)
        assert [p.pid for p in tree][0] == proc.pid and tree[1].ppid == proc.pid, tree
        assert all(p.cpu >= 0 and p.rss > 0 for p in tree) and sandbox.resident(tree) > 0
        assert sandbox.run_delay(proc.pid) >= 0
    finally:
        for p in reversed(sandbox.descendants(proc.pid)):
            os.kill(p.pid, signal.SIGKILL)
        proc.wait()


# ---------------------------------------------------------------------------------------------
# Removing a kernel's folder (CVE-2023-6597: TemporaryDirectory's cleanup chmods through links)
# ---------------------------------------------------------------------------------------------
def plant_links(base: Path) -> tuple[Path, Path, Path]:
    """``base/kernel``, as a submission may leave it: a folder of mode 0500 holding a link to the
    instructor's file (0600), an unreadable folder, a link to the instructor's folder."""
    instructor = base / "instructor"
    instructor.mkdir()
    grades = instructor / "grades.csv"
    grades.write_text("ada,4\n")
    grades.chmod(0o600)
    kernel = base / "kernel"
    (kernel / "locked").mkdir(parents=True)
    (kernel / "locked" / "grades").symlink_to(grades)  # alone: the first entry the cleanup meets
    (kernel / "locked").chmod(0o500)
    (kernel / "locked-too").mkdir()
    (kernel / "locked-too" / "dangling").symlink_to(base / "nowhere")
    (kernel / "locked-too").chmod(0o500)
    (kernel / "sealed").mkdir()
    (kernel / "sealed" / "file").write_text("x")
    (kernel / "sealed").chmod(0)
    (kernel / "to-the-instructor").symlink_to(instructor)
    return kernel, grades, instructor


def as_an_ordinary_user(base: Path, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` (with ``path`` the kernel's folder) as this user, or as nobody when root (where
    permissions never stop a removal and the bug does not show)."""
    drop = ""
    if os.geteuid() == 0:
        for path in [base, *base.rglob("*")]:
            os.lchown(path, 65534, 65534)
        drop = "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
    script = f"import os, tempfile\nfrom attnbook.course import sandbox\npath = {str(base / 'kernel')!r}\n{drop}{code}"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)


@linux
def test_removing_a_kernels_folder_never_follows_a_link():
    base = Path(tempfile.mkdtemp(prefix="attnbook-links-"))
    base.chmod(0o755)
    try:
        kernel, grades, instructor = plant_links(base)
        done = as_an_ordinary_user(base, "sandbox.remove_tree(path)")
        assert done.returncode == 0, done.stderr
        assert not kernel.exists() and not kernel.is_symlink()
        assert stat.S_IMODE(grades.stat().st_mode) == 0o600, "the instructor's file was chmod-ed"
        assert grades.read_text() == "ada,4\n" and stat.S_IMODE(instructor.stat().st_mode) == 0o755
    finally:
        shutil.rmtree(base, ignore_errors=True)


# the Pythons whose TemporaryDirectory chmods through links (fixed in 3.11.8 and 3.12.2)
VULNERABLE = (3, 11) <= sys.version_info[:3] < (3, 11, 8) or (3, 12) <= sys.version_info[:3] < (3, 12, 2)


@linux
@pytest.mark.skipif(not VULNERABLE, reason="this Python's TemporaryDirectory is fixed")
def test_the_standard_cleanup_this_replaces_does_chmod_through_the_link():
    """The control: on this Python, TemporaryDirectory's cleanup makes the instructor's file 0700."""
    base = Path(tempfile.mkdtemp(prefix="attnbook-links-"))
    base.chmod(0o755)
    try:
        kernel, grades, _ = plant_links(base)
        done = as_an_ordinary_user(base, "tempfile.TemporaryDirectory._rmtree(path, ignore_errors=True)")
        assert done.returncode == 0, done.stderr
        assert stat.S_IMODE(grades.stat().st_mode) == 0o700
    finally:
        shutil.rmtree(base, ignore_errors=True)
