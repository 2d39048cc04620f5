"""The box around the kernels that run students' code: a sandbox, and limits on memory,
processes, file size and time.

The grader (:mod:`attnbook.grader`) starts every kernel through this module's launcher::

    python -m attnbook.sandbox --memory BYTES [--cgroup DIR] [--nproc N] -- COMMAND...

which sets the limits on itself and then becomes ``COMMAND`` (``exec``), so the limits
hold for the kernel and everything it starts:

- **memory**: ``RLIMIT_AS``, the address space of each process (an allocation past it
  fails with ``MemoryError``; the kernel survives);
- **processes**: a fork bomb stops at a fixed number of processes. As root, where
  ``RLIMIT_NPROC`` does not apply, the launcher joins a ``pids`` cgroup the grader made
  (``pids.max``); as any other user, ``RLIMIT_NPROC`` is set to the processes the user
  already runs plus ``--nproc``;
- **files**: ``RLIMIT_FSIZE`` caps the size of any file the kernel writes, and no core
  dumps.

:class:`Limits` describes them; :func:`process_guard` makes and removes the ``pids``
cgroup and reports which fork limit holds. Where no limit can be set (Windows, a root
without a writable cgroup), the grader still grades and says so.

**The sandbox** (:func:`sandbox_arguments`, Linux with bubblewrap): between the launcher
and the kernel sits ``bwrap``, which gives the kernel its own user, PID, network, IPC
and UTS namespaces and a file system that holds only the Python runtime and installed
packages (read-only), the kernel's private folder (its IPC sockets and working
directory), a private ``/tmp``, ``/proc`` and ``/dev``. No home directory, no ``/etc``
beyond what the dynamic linker and fonts read, no book, no other submission, no grades,
no network; the kernel dies with the grader. :func:`bwrap_works` says whether it can be
used here.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import secrets
import shutil
import signal
import site
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Limits",
    "ProcessGuard",
    "process_guard",
    "bwrap_works",
    "sandbox_arguments",
    "launcher_command",
    "main",
]

GIB = 2**30


@dataclass(frozen=True)
class Limits:
    """What a submission's kernel may use.

    ``cell_timeout`` and ``notebook_timeout`` are seconds of wall-clock time (one cell,
    or one check's call into the student's code; the whole notebook), ``memory`` bytes
    of address space per process, ``processes`` the processes and threads the kernel
    may start, ``output`` the bytes of output (prints, figures) one notebook may send,
    ``file_size`` the largest file it may write.
    """

    cell_timeout: float = 120.0
    notebook_timeout: float = 1800.0
    memory: int = 6 * GIB
    processes: int = 256
    output: int = 20 * 2**20
    file_size: int = GIB

    def __post_init__(self) -> None:
        for name in (
            "cell_timeout",
            "notebook_timeout",
            "memory",
            "processes",
            "output",
            "file_size",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not value > 0:
                raise ValueError(f"Limits.{name} must be positive, got {value!r}")


# --------------------------------------------------------------------------------------
# The fork limit: a pids cgroup (root) or RLIMIT_NPROC (everyone else)
# --------------------------------------------------------------------------------------
_CGROUP_ROOTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))


def _pids_cgroup_parent() -> Path | None:
    """A writable cgroup folder that can limit processes (v1 ``pids`` hierarchy, or v2
    with the ``pids`` controller), or ``None``."""
    if os.name != "posix" or os.geteuid() != 0:
        return None
    for root in _CGROUP_ROOTS:
        v1 = root.name == "pids" and (root / "cgroup.procs").exists()
        v2 = "pids" in _read(root / "cgroup.subtree_control").split()
        if (v1 or v2) and os.access(root, os.W_OK):
            return root
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@dataclass
class ProcessGuard:
    """How one kernel's processes are limited and killed: ``cgroup`` (a folder whose
    ``pids.max`` holds) or ``None`` with ``kind`` saying what holds instead."""

    kind: str  # "cgroup", "rlimit" or "none"
    cgroup: Path | None = None

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroup (a fork bomb's children included)."""
        if self.cgroup is None:
            return
        for _ in range(50):  # processes may fork while we kill: repeat until empty
            pids = [int(p) for p in _read(self.cgroup / "cgroup.procs").split()]
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)


@contextlib.contextmanager
def process_guard(processes: int) -> Iterator[ProcessGuard]:
    """A fresh ``pids`` cgroup limited to ``processes`` when running as root with a
    writable cgroup (removed, its processes killed, on exit); otherwise a guard that
    says ``rlimit`` (POSIX, not root) or ``none``."""
    parent = _pids_cgroup_parent()
    if parent is None:
        limited = os.name == "posix" and os.geteuid() != 0
        yield ProcessGuard("rlimit" if limited else "none")
        return
    folder = parent / f"attnbook-grade-{secrets.token_hex(6)}"
    try:
        folder.mkdir()
        (folder / "pids.max").write_text(str(processes))
    except OSError:
        with contextlib.suppress(OSError):
            folder.rmdir()
        yield ProcessGuard("none")
        return
    guard = ProcessGuard("cgroup", folder)
    try:
        yield guard
    finally:
        guard.kill_all()
        for _ in range(100):
            try:
                folder.rmdir()
                break
            except OSError:  # the last processes are still exiting
                time.sleep(0.05)


def _user_processes() -> int:
    """Processes and threads of this user now (what ``RLIMIT_NPROC`` counts)."""
    uid, count = os.getuid(), 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(entry / "task"))
            except OSError:
                continue
    return count


# --------------------------------------------------------------------------------------
# The sandbox: bubblewrap
# --------------------------------------------------------------------------------------
@functools.cache
def bwrap_works() -> bool:
    """Whether ``bwrap`` is installed and can make the namespaces the sandbox needs
    (user namespaces may be switched off, e.g. in some containers)."""
    if not sys.platform.startswith("linux") or shutil.which("bwrap") is None:
        return False
    probe = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/"]
    try:
        done = subprocess.run([*probe, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _python_dirs() -> list[Path]:
    """The folders the kernel's Python needs, read-only: the interpreter's prefixes,
    the site-packages, and the attnbook package itself (without what lies beside it:
    in a source checkout that is the book)."""
    found = {Path(__file__).resolve().parent}
    for name in [
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        *site.getsitepackages(),
        site.getusersitepackages(),
    ]:
        for path in {Path(name), Path(name).resolve()}:
            if path.is_dir() and path != Path("/"):
                found.add(path)
    ordered = sorted(found, key=lambda p: len(p.parts))
    return [
        p for i, p in enumerate(ordered) if not any(q in p.parents for q in ordered[:i])
    ]


def sandbox_arguments(folder: Path, workdir: Path) -> list[str]:
    """The ``bwrap`` arguments that put a command in the sandbox, with ``folder`` (the
    kernel's private folder) writable and ``workdir`` as its working directory."""
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session"]
    if os.geteuid() == 0:
        args += ["--cap-drop", "ALL"]
    args += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for etc in (
        "/etc/ld.so.cache",
        "/etc/localtime",
        "/etc/fonts",
        "/etc/alternatives",
    ):
        args += ["--ro-bind-try", etc, etc]
    # /tmp first: binds below it (a checkout in /tmp, the kernel's folder) go on top
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for path in _python_dirs():
        args += ["--ro-bind", str(path), str(path)]
    args += ["--bind", str(folder), str(folder), "--chdir", str(workdir)]
    return [*args, "--"]


def launcher_command(
    limits: Limits,
    guard: ProcessGuard,
    command: list[str],
    wrapper: list[str] = (),
) -> list[str]:
    """The command that runs ``command`` under ``limits`` (see :func:`main`), inside
    ``wrapper`` (the sandbox's arguments, or nothing)."""
    cmd = [sys.executable, "-m", "attnbook.sandbox", "--memory", str(limits.memory)]
    cmd += ["--file-size", str(limits.file_size)]
    if guard.cgroup is not None:
        cmd += ["--cgroup", str(guard.cgroup)]
    elif guard.kind == "rlimit":
        cmd += ["--nproc", str(limits.processes)]
    return [*cmd, "--", *wrapper, *command]


def main(argv: list[str] | None = None) -> int:
    """Set the limits on this process, then ``exec`` the command after ``--``."""
    parser = argparse.ArgumentParser(prog="python -m attnbook.sandbox")
    parser.add_argument("--memory", type=int, required=True, help="bytes per process")
    parser.add_argument("--file-size", type=int, default=GIB, help="bytes per file")
    parser.add_argument("--cgroup", help="a pids cgroup folder to join")
    parser.add_argument("--nproc", type=int, help="processes beyond the user's own")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run after --")
    import resource

    if args.cgroup:  # join before anything else can fork
        Path(args.cgroup, "cgroup.procs").write_text(str(os.getpid()))
    if args.nproc:
        n = _user_processes() + args.nproc
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
    for limit, value in (
        (resource.RLIMIT_AS, args.memory),
        (resource.RLIMIT_FSIZE, args.file_size),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(limit, (value, value))
    os.execvp(command[0], command)
    return 1  # pragma: no cover - exec does not return


if __name__ == "__main__":
    sys.exit(main())
