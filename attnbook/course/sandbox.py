"""The box around the kernels that run students' code: a sandbox, and limits on memory,
processes, files, CPU and time.

The grader (:mod:`attnbook.course.grader`) starts every kernel through this module's
launcher::

    python -m attnbook.course.sandbox --memory BYTES [--cgroup DIR]... [--nproc N]
        [--cpu SECONDS] -- COMMAND...

which sets the limits on itself and then becomes ``COMMAND`` (``exec``), so the limits
hold for the kernel and everything it starts:

- **memory**: ``RLIMIT_AS``, the address space of each process (an allocation past it
  fails with ``MemoryError``; the kernel survives); all processes together: a memory
  cgroup as root, else the grader adds up their resident memory while a cell runs
  (:func:`processes`) and stops the notebook past the same number;
- **processes**: a fork bomb stops at a fixed number of processes. As root, where
  ``RLIMIT_NPROC`` does not apply, the launcher joins a ``pids`` cgroup the grader made
  (``pids.max``); as any other user, ``RLIMIT_NPROC`` is set to the processes the user
  already runs plus ``--nproc``. The launcher is also a *child subreaper*, so a process
  whose parent dies (``setsid`` and a double fork included) stays below the kernel,
  where the grader finds and kills it;
- **CPU**: ``RLIMIT_CPU`` caps each process; all processes together are capped by the
  grader (a ``cpuacct`` cgroup as root, else the processes' times in ``/proc``);
- **files**: ``RLIMIT_FSIZE`` caps the size of any file the kernel writes, and no core
  dumps. In the sandbox every place the kernel can write is a ``tmpfs`` of a fixed
  size (below).

:class:`Limits` describes them; :func:`process_guard` makes and removes the cgroups
and reports which limits hold. Where no limit can be set (Windows, a root without a
writable cgroup), the grader still grades and says so.

**The sandbox** (:func:`sandbox_arguments`, Linux with bubblewrap): between the launcher
and the kernel sits ``bwrap``, which gives the kernel its own user, PID, network, IPC
and UTS namespaces and a file system that holds only the Python runtime and installed
packages (read-only), its connection file (read-only), ``/proc`` and ``/dev`` (read-only
but for the devices). It may write in two places only: ``/tmp`` (its working folder,
home and IPC sockets; ``Limits.disk`` bytes) and ``/dev/shm`` (a quarter of that).
No home directory, no ``/etc`` beyond what the dynamic linker and fonts read, no book,
no other submission, no grades, no network; the kernel dies with the grader, and every
process in the sandbox dies with its PID namespace. The grader reaches the kernel's
sockets through ``/proc/<kernel>/root``. :func:`bwrap_works` says whether it can be
used here.

:func:`remove_tree` deletes a kernel's folder without following a link the submission
left in it.
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
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "Limits",
    "ProcessGuard",
    "process_guard",
    "Process",
    "processes",
    "descendants",
    "resident",
    "busy_seconds",
    "run_delay",
    "interrupt_main_thread",
    "remove_tree",
    "bwrap_works",
    "sandbox_arguments",
    "SANDBOX_WORK",
    "SANDBOX_HOME",
    "SANDBOX_IPC",
    "launcher_command",
    "main",
]

GIB = 2**30


@dataclass(frozen=True)
class Limits:
    """What a submission's kernel may use.

    ``cell_timeout`` and ``notebook_timeout`` are seconds of wall-clock time (one cell,
    or one check's call into the student's code; the whole notebook), ``memory`` bytes
    of address space per process, ``total_memory`` bytes of memory all its processes
    together may hold (by default ``memory``), ``processes`` the processes and threads
    the kernel may start, ``output`` the bytes of output (prints, figures) one notebook
    may send, ``file_size`` the largest file it may write, ``disk`` the bytes its files
    may take in the sandbox (its ``/tmp``; ``/dev/shm`` gets a quarter more),
    ``cpu_time`` the seconds of CPU time all its processes together may use (by default
    ``notebook_timeout``).
    """

    cell_timeout: float = 120.0
    notebook_timeout: float = 1800.0
    memory: int = 6 * GIB
    processes: int = 256
    output: int = 20 * 2**20
    file_size: int = GIB
    disk: int = GIB
    cpu_time: float | None = None
    total_memory: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "cell_timeout",
            "notebook_timeout",
            "memory",
            "processes",
            "output",
            "file_size",
            "disk",
            "cpu_time",
            "total_memory",
        ):
            value = getattr(self, name)
            if name in ("cpu_time", "total_memory") and value is None:
                continue
            if isinstance(value, bool) or not value > 0:
                raise ValueError(f"Limits.{name} must be positive, got {value!r}")

    @property
    def cpu_seconds(self) -> float:
        """The CPU time all of a notebook's processes together may use."""
        return self.notebook_timeout if self.cpu_time is None else self.cpu_time

    @property
    def memory_together(self) -> int:
        """The memory all of a notebook's processes together may hold."""
        return self.memory if self.total_memory is None else self.total_memory


# --------------------------------------------------------------------------------------
# Cgroups (root): processes, memory and CPU time of all the kernel's processes
# --------------------------------------------------------------------------------------
_CGROUP_ROOT = Path("/sys/fs/cgroup")
# the cgroup v1 hierarchy of each controller, and the file that limits or counts
_V1 = {
    "pids": "pids.max",
    "memory": "memory.limit_in_bytes",
    "cpuacct": "cpuacct.usage",
}


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _cgroup_parents() -> dict[str, Path]:
    """For each controller (``pids``, ``memory``, ``cpuacct``; v1 hierarchies, or one
    v2 folder with the controllers enabled), the writable cgroup folder this process
    is in, where the grader may make its own; empty unless root."""
    if os.name != "posix" or os.geteuid() != 0:
        return {}
    mine = {}  # controller -> this process's cgroup path ("" for v2)
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        number, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if number != "0" else [""]:
            mine[name] = path.lstrip("/")
    found = {}
    for name in _V1:
        folder = _CGROUP_ROOT / name / mine.get(name, "")
        usable = (folder / "cgroup.procs").exists() and os.access(folder, os.W_OK)
        if name in mine and usable:
            found[name] = folder
    if "" in mine:
        for root in (_CGROUP_ROOT, _CGROUP_ROOT / "unified"):
            folder = root / mine[""]
            enabled = _read(folder / "cgroup.subtree_control").split()
            if (folder / "cgroup.procs").exists() and os.access(folder, os.W_OK):
                for name in ("pids", "memory"):
                    if name in enabled and name not in found:
                        found[name] = folder
                if "cpu" in enabled and "cpuacct" not in found:
                    found["cpuacct"] = folder
    return found


@dataclass
class ProcessGuard:
    """How one kernel's processes are limited, counted and killed: ``cgroups`` (a
    folder per controller: ``pids``, ``memory``, ``cpuacct``) as root, or none with
    ``kind`` saying what holds instead (``rlimit``: ``RLIMIT_NPROC``)."""

    kind: str  # "cgroup", "rlimit" or "none"
    cgroups: dict[str, Path] = field(default_factory=dict)

    @property
    def cgroup(self) -> Path | None:
        """The ``pids`` cgroup (the fork limit), if any."""
        return self.cgroups.get("pids")

    def members(self) -> set[int]:
        """The processes in the guard's cgroups."""
        found = set()
        for folder in set(self.cgroups.values()):
            found |= {int(p) for p in _read(folder / "cgroup.procs").split()}
        return found

    def cpu_seconds(self) -> float | None:
        """CPU time all processes ever in the cgroup used (None without one)."""
        folder = self.cgroups.get("cpuacct")
        if folder is None:
            return None
        usage = _read(folder / "cpuacct.usage").strip()
        if usage:
            return int(usage) / 1e9
        for line in _read(folder / "cpu.stat").splitlines():  # cgroup v2
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
        return None

    def kill_all(self, keep: set[int] = frozenset()) -> None:
        """SIGKILL every process in the cgroups but ``keep`` (a fork bomb's children
        included)."""
        for _ in range(50):  # processes may fork while we kill: repeat until empty
            pids = self.members() - set(keep)
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)


def _limit_cgroup(folder: Path, name: str, processes: int, memory: int | None) -> None:
    if name == "pids":
        (folder / "pids.max").write_text(str(processes))
    elif name == "memory" and memory is not None:
        v1 = folder / "memory.limit_in_bytes"
        if v1.exists():
            v1.write_text(str(memory))
            with contextlib.suppress(OSError):  # no swap for the kernel, where known
                (folder / "memory.memsw.limit_in_bytes").write_text(str(memory))
        else:
            (folder / "memory.max").write_text(str(memory))
            with contextlib.suppress(OSError):
                (folder / "memory.swap.max").write_text("0")


@contextlib.contextmanager
def process_guard(processes: int, memory: int | None = None) -> Iterator[ProcessGuard]:
    """Fresh cgroups below this process's own, as root where they are writable: ``pids``
    limited to ``processes``, ``memory`` to ``memory`` bytes (all the kernel's processes
    and its ``tmpfs`` files together), ``cpuacct`` to count CPU time. Their processes
    are killed and the cgroups removed on exit. Otherwise a guard that says ``rlimit``
    (POSIX, not root) or ``none``."""
    parents = _cgroup_parents()
    name = f"attnbook-grade-{secrets.token_hex(6)}"
    made: dict[str, Path] = {}
    for controller, parent in parents.items():
        folder = parent / name
        new = folder not in made.values()
        try:
            if new:
                folder.mkdir()
            _limit_cgroup(folder, controller, processes, memory)
            made[controller] = folder
        except OSError:
            if new:
                with contextlib.suppress(OSError):
                    folder.rmdir()
    if "pids" not in made:
        for folder in set(made.values()):
            with contextlib.suppress(OSError):
                folder.rmdir()
        limited = os.name == "posix" and os.geteuid() != 0
        yield ProcessGuard("rlimit" if limited else "none")
        return
    guard = ProcessGuard("cgroup", made)
    try:
        yield guard
    finally:
        guard.kill_all()
        for folder in set(made.values()):
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
# The kernel's processes, as /proc shows them
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Process:
    """One process: its parent, the CPU seconds it and its reaped children used, its
    resident memory in bytes, and whether it has exited (a zombie not yet reaped)."""

    pid: int
    ppid: int
    cpu: float
    rss: int
    exited: bool = False


@functools.cache
def _clock() -> tuple[int, int]:
    return os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")


def processes() -> dict[int, Process]:
    """Every process on this machine (Linux; ``{}`` elsewhere)."""
    table = {}
    if not sys.platform.startswith("linux"):
        return table
    ticks, page = _clock()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                text = f.read()
        except OSError:
            continue
        fields = text[text.rfind(b")") + 2 :].split()
        if len(fields) < 22:
            continue
        cpu = sum(int(n) for n in fields[11:15]) / ticks  # utime stime cutime cstime
        rss, exited = int(fields[21]) * page, fields[0] in (b"Z", b"X")
        table[int(name)] = Process(int(name), int(fields[1]), cpu, rss, exited)
    return table


def descendants(root: int, table: dict[int, Process] | None = None) -> list[Process]:
    """``root`` and every process below it, parents before children."""
    table = processes() if table is None else table
    children: dict[int, list[Process]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc)
    found = [table[root]] if root in table else []
    for proc in found:
        found += children.get(proc.pid, [])
    return found


def resident(procs: list[Process], limit: float = 0) -> int:
    """Bytes of memory ``procs`` hold together: their resident sizes if those add up to
    at most ``limit``, else their proportional set sizes where ``/proc`` gives them (a
    page that n of them share, as forked processes do, counts 1/n to each)."""
    alive = [proc for proc in procs if not proc.exited]
    total = sum(proc.rss for proc in alive)
    if total <= limit:
        return total
    total = 0
    for proc in alive:
        text = _read(Path(f"/proc/{proc.pid}/smaps_rollup"))
        pss = [line.split()[1] for line in text.splitlines() if line.startswith("Pss:")]
        total += int(pss[0]) * 1024 if pss else proc.rss
    return total


def busy_seconds() -> float:
    """CPU seconds this machine's CPUs have spent on any work (``/proc/stat``)."""
    fields = _read(Path("/proc/stat")).split("\n", 1)[0].split()[1:]
    if len(fields) < 8:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq + steal) / _clock()[0]


def run_delay(pid: int) -> float:
    """Seconds the main thread of ``pid`` has spent waiting for a CPU (runnable, while
    other work ran), from ``/proc/<pid>/schedstat``; 0 where that is not known."""
    try:
        return int(_read(Path(f"/proc/{pid}/schedstat")).split()[1]) / 1e9
    except (IndexError, ValueError):
        return 0.0


def interrupt_main_thread(pid: int) -> None:
    """Send SIGINT to the main thread of ``pid`` (``tgkill``), where Python raises
    ``KeyboardInterrupt``: sent to the process, the signal may land on another of its
    threads, and a main thread asleep in ``time.sleep`` would never see it."""
    tgkill = None
    if sys.platform.startswith("linux"):
        import ctypes

        tgkill = getattr(ctypes.CDLL(None, use_errno=True), "tgkill", None)
    if tgkill is None or tgkill(pid, pid, signal.SIGINT) != 0:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGINT)


# --------------------------------------------------------------------------------------
# Removing a kernel's folder: no link is ever followed
# --------------------------------------------------------------------------------------
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)


def _open_folder(name: str, parent: int) -> int:
    """A descriptor of the folder ``name`` in the folder ``parent`` (a descriptor),
    made readable if the submission took that away; never through a link."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except PermissionError:
        pass
    if hasattr(os, "O_PATH"):  # Linux: chmod the folder itself, by its descriptor
        handle = os.open(
            name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent
        )
        try:
            os.chmod(f"/proc/self/fd/{handle}", 0o700)
        finally:
            os.close(handle)
    else:
        os.chmod(name, 0o700, dir_fd=parent, follow_symlinks=False)
    return os.open(name, _DIR_FLAGS, dir_fd=parent)


def _remove_entry(name: str, parent: int, depth: int = 0) -> None:
    if depth > 100:  # deeper than any honest folder: left in place, unread
        return
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(name, dir_fd=parent)  # a link is removed, never followed
        return
    try:
        fd = _open_folder(name, parent)
    except OSError:  # swapped for a link or a file since: remove that
        os.unlink(name, dir_fd=parent)
        return
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o700 != 0o700:
            os.fchmod(fd, 0o700)  # the folder itself, by its descriptor
        for entry in os.listdir(fd):
            _remove_entry(entry, fd, depth + 1)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):  # not empty: something was left unread
        os.rmdir(name, dir_fd=parent)


def remove_tree(path) -> None:
    """Delete the folder ``path`` and all it holds, as a submission may have left it:
    folders without permissions, links to anywhere. Every entry is reached through its
    folder's descriptor and examined without following links; permissions are only
    ever changed on a folder opened as a folder, by its descriptor, so no file outside
    ``path`` is touched (unlike ``tempfile.TemporaryDirectory`` before Python 3.12.2
    and 3.11.8, CVE-2023-6597). Does nothing if ``path`` does not exist."""
    path = Path(path)
    if os.open not in os.supports_dir_fd:  # pragma: no cover - Windows
        shutil.rmtree(path, ignore_errors=True)
        return
    parent = os.open(path.parent, _DIR_FLAGS)
    try:
        _remove_entry(path.name, parent)
    finally:
        os.close(parent)


# --------------------------------------------------------------------------------------
# The sandbox: bubblewrap
# --------------------------------------------------------------------------------------
#: The kernel's working folder, inside the sandbox (on its sized ``/tmp``).
SANDBOX_WORK = "/tmp/work"
#: The kernel's home folder, inside the sandbox (on its sized ``/tmp``).
SANDBOX_HOME = "/tmp/home"
SANDBOX_IPC = "/tmp/ipc/kernel"  # its IPC sockets: /tmp/ipc/kernel-<port>


@functools.cache
def bwrap_works() -> bool:
    """Whether ``bwrap`` is installed and can make the namespaces and sized ``tmpfs``
    mounts the sandbox needs (user namespaces may be switched off, e.g. in some
    containers; ``--size`` needs bubblewrap 0.8)."""
    if not sys.platform.startswith("linux") or shutil.which("bwrap") is None:
        return False
    probe = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/"]
    probe += ["--size", str(2**20), "--tmpfs", "/tmp", "--remount-ro", "/"]
    try:
        done = subprocess.run(
            [*probe, "true"], capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _python_dirs() -> list[Path]:
    """The folders the kernel's Python needs, read-only: the interpreter's prefixes,
    the site-packages, and the attnbook package itself (without what lies beside it:
    in a source checkout that is the book)."""
    found = {Path(__file__).resolve().parents[1]}
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


def sandbox_arguments(folder: Path, limits: Limits) -> list[str]:
    """The ``bwrap`` arguments that put a command in the sandbox, with ``folder`` (the
    grader's folder for this kernel, holding its connection file) read-only, and
    ``/tmp`` (``limits.disk`` bytes: :data:`SANDBOX_WORK`, :data:`SANDBOX_HOME`, the
    sockets) and ``/dev/shm`` (a quarter of that) the only places it can write."""
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
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--size", str(max(limits.disk // 4, 2**20)), "--tmpfs", "/dev/shm"]
    # /tmp first: binds below it (a checkout in /tmp, the kernel's folder) go on top
    args += ["--size", str(limits.disk), "--tmpfs", "/tmp"]
    for path in (SANDBOX_WORK, SANDBOX_HOME, str(Path(SANDBOX_IPC).parent)):
        args += ["--dir", path]
    for path in _python_dirs():
        args += ["--ro-bind", str(path), str(path)]
    args += ["--ro-bind", str(folder), str(folder), "--chdir", SANDBOX_WORK]
    # nothing else is writable: the root and /dev hold only mount points and devices
    args += ["--remount-ro", "/dev", "--remount-ro", "/"]
    return [*args, "--"]


def launcher_command(
    limits: Limits,
    guard: ProcessGuard,
    command: list[str],
    wrapper: list[str] = (),
) -> list[str]:
    """The command that runs ``command`` under ``limits`` (see :func:`main`), inside
    ``wrapper`` (the sandbox's arguments, or nothing)."""
    cmd = [sys.executable, "-m", "attnbook.course.sandbox"]
    cmd += ["--memory", str(limits.memory)]
    cmd += ["--file-size", str(limits.file_size)]
    cmd += ["--cpu", str(max(1, int(limits.cpu_seconds)))]
    for folder in dict.fromkeys(guard.cgroups.values()):
        cmd += ["--cgroup", str(folder)]
    if guard.cgroup is None and guard.kind == "rlimit":
        cmd += ["--nproc", str(limits.processes)]
    return [*cmd, "--", *wrapper, *command]


def _become_subreaper() -> None:
    """Make orphaned descendants this process's children (Linux ``prctl``), so they
    stay below the kernel; kept across ``exec``."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def main(argv: list[str] | None = None) -> int:
    """Set the limits on this process, then ``exec`` the command after ``--``."""
    parser = argparse.ArgumentParser(prog="python -m attnbook.course.sandbox")
    parser.add_argument("--memory", type=int, required=True, help="bytes per process")
    parser.add_argument("--file-size", type=int, default=GIB, help="bytes per file")
    parser.add_argument("--cpu", type=int, help="CPU seconds per process")
    parser.add_argument("--cgroup", action="append", help="a cgroup folder to join")
    parser.add_argument("--nproc", type=int, help="processes beyond the user's own")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run after --")
    import resource

    for folder in args.cgroup or []:  # join before anything else can fork
        Path(folder, "cgroup.procs").write_text(str(os.getpid()))
    if args.nproc:
        n = _user_processes() + args.nproc
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
    limits = [
        (resource.RLIMIT_AS, args.memory, args.memory),
        (resource.RLIMIT_FSIZE, args.file_size, args.file_size),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    if args.cpu:  # SIGXCPU at the limit, SIGKILL a little later
        limits.append((resource.RLIMIT_CPU, args.cpu, args.cpu + 5))
    for limit, soft, hard in limits:
        resource.setrlimit(limit, (soft, hard))
    _become_subreaper()
    os.execvp(command[0], command)
    return 1  # pragma: no cover - exec does not return


if __name__ == "__main__":
    sys.exit(main())
