"""Attacks on the grader, each a real submission graded end to end (real kernels).

A student who wants the points without the work tries every trick below on the book's first
chapter. Each attack must score no more than a blank submission (0), say what happened where that
can be known, and leave every other student's rows intact: an honest student graded in the same run
keeps full marks. The chapter is cut down to its setup, answer and check cells so a kernel run takes
seconds; the grader sees it as the book's ``attention.ipynb``.

These tests run the kernels **without the sandbox** (``isolation="none"``): the verdicts must hold
even where no sandbox exists (macOS, Windows, a Linux without bubblewrap). Writing into the grader's
folders is therefore possible here; what is tested is that such writes cannot change this run's
verdicts or files. tests/course/test_grading_sandbox.py attacks the sandbox itself.
"""

from __future__ import annotations

import base64
import csv
import functools
import json
import os
import resource
import struct
import subprocess
import sys
import time
import textwrap
from pathlib import Path

import nbformat
import pytest
import torch

from attnbook import course
from attnbook.course import grader, sandbox

# the shuffled-check-cells attack duplicates a cell, id included, as a student's copy and paste would
pytestmark = pytest.mark.filterwarnings("ignore:Non-unique cell id")

ROOT = Path(__file__).resolve().parents[2]
LABELS = ["attention-masked-softmax", "attention-sqrt-dk", "attention-multi-head"]
FULL = 4  # points: 1 + 1 + 2 (the chapter's metadata)

FORGE = """
import json, os
for label in {labels!r}:
    line = json.dumps({{"label": label, "passed": True, "message": "passed"}})
    for path in [os.environ.get("ATTNBOOK_GRADE_LOG"), "checks.jsonl"]:
        if path:
            with open(path, "a") as f:
                f.write(line + "\\n")
    print(f"[PASSED] {{label}}: passed")
""".format(labels=LABELS)

ACCEPT_ALL = """
import attnbook.exercises as ex
for label in list(ex.CHECKS):
    ex.CHECKS[label] = ex.CHECKS[label].__class__(lambda student: None, "")
ex.check = lambda label, student: ex.CheckResult(label, True, "passed")
ex.run_check = ex.check
"""


def mini_chapter():
    """Chapter 1 with only its answer and check cells, after one light import cell (the real chapter's
    setup is tested by the instructor's day-one test; here every second of kernel time is paid 30 times)."""
    nb = nbformat.read(ROOT / "book" / "attention.ipynb", as_version=4)
    setup = nbformat.v4.new_code_cell(
        "import math\nimport torch\nimport attnbook\nimport attnbook.exercises\nfrom attnbook import core")
    setup.id = "setup-cell"
    nb.cells = [setup] + [c for c in nb.cells if c.cell_type == "code"
                          and ("solution" in c.metadata.get("tags", []) or "check(" in c.source)]
    checked = set(course.expected_labels(nb))  # the written exercise left with the markdown
    points = nb.metadata["attnbook"]["points"]
    nb.metadata["attnbook"]["points"] = {k: v for k, v in points.items() if k in checked}
    return nb


def classroom(root: Path, students: dict) -> tuple[Path, Path]:
    """``root/book/attention.ipynb`` (the mini chapter) and ``root/submissions/<name>/attention.ipynb`` for
    each of ``students`` (name -> notebook, or a change to apply to the blank one); returns both folders."""
    book, subs = root / "book", root / "submissions"
    book.mkdir(parents=True, exist_ok=True)
    mini = mini_chapter()
    nbformat.write(mini, book / "attention.ipynb")
    for name, given in students.items():
        nb = given
        if callable(given):
            nb = blank_of(mini)
            given(nb)
        (subs / name).mkdir(parents=True)
        nbformat.write(nb, subs / name / "attention.ipynb")
    return book, subs


def blank_of(nb):
    return course.strip_solutions(nb)


def answers(nb):
    """The answer cells of a notebook, in order."""
    return [c for c in nb.cells if "solution" in c.metadata.get("tags", [])]


def checks(nb):
    return [c for c in nb.cells if "check(" in c.source]


def new_cell(source):
    return nbformat.v4.new_code_cell(textwrap.dedent(source))


def stub_plus(code):
    """The blank answer (still the stub) with ``code`` run before the function is defined."""
    def change(nb):
        first = answers(nb)[0]
        first.source = textwrap.dedent(code) + "\n" + first.source
    return change


def first_answer(source):
    def change(nb):
        answers(nb)[0].source = textwrap.dedent(source)
    return change


# ---- the attacks: name -> a change to the blank submission -----------------------------
def replace_checks(nb):
    for cell in checks(nb):
        cell.source = FORGE


def append_forging_cell(nb):
    nb.cells.append(new_cell(FORGE))


def accept_all_in_an_extra_cell(nb):
    nb.cells.insert(2, new_cell(ACCEPT_ALL))


def shuffle_checks(nb):
    cells = checks(nb)
    nb.cells.remove(cells[0])  # deleted
    nb.cells.remove(cells[1])
    nb.cells.insert(1, cells[1])  # moved above its answer
    nb.cells.append(nbformat.from_dict(json.loads(json.dumps(cells[2]))))  # duplicated
    cells[2].source = 'attnbook.exercises.check("attention-multi-head", attnbook.core.MultiHeadAttention.forward)'


PATCH_LIBRARY = """
import torch
import attnbook.core
attnbook.core.masked_softmax = lambda scores, *a, **k: torch.zeros_like(scores)
def my_masked_softmax(scores, mask=None, temperature=1.0):
    return torch.zeros_like(scores)
"""

HIDDEN_PATCH = """
import importlib
grading = importlib.import_module("attnbook." + "exer" + "cises")
setattr(grading, "run_" + "check", lambda label, student: True)
for name in list(getattr(grading, "CHE" + "CKS")):
    getattr(grading, "CHE" + "CKS")[name] = getattr(grading, "CHE" + "CKS")[name].__class__(lambda s: None, "")
"""

MEMORIZED = """
import torch
def _book_cases():
    gen = torch.Generator().manual_seed(101)  # the check's inputs in a reader's notebook
    scores = torch.randn(2, 3, 5, 7, generator=gen) * 3
    mask = torch.rand(2, 1, 5, 7, generator=gen) > 0.3
    mask[0, 0, 2] = False
    def f(s, m=None, t=1.0):  # right on these inputs (and written without the library)
        s = s / t if m is None else (s / t).masked_fill(~m, float("-inf"))
        return torch.nan_to_num(torch.softmax(s, -1), nan=0.0)
    return iter([f(scores), f(scores, t=0.5), f(scores, mask, 2.0), f(scores + 1000.0, mask)])
_replay = _book_cases()
def my_masked_softmax(scores, mask=None, temperature=1.0):
    return next(_replay)
"""

FORGED_REPLY = """
import base64, os, pickle, torch
class _Payload:
    def __reduce__(self):
        return (os.system, ("touch {marker}",))
_encode = base64.b64encode
def my_masked_softmax(scores, mask=None, temperature=1.0):
    # the reply the grader decodes is now a pickle that runs a command, then a torch.save file
    base64.b64encode = lambda data: _encode(pickle.dumps(_Payload()))
    torch.save = lambda obj, f, *a, **k: f.write(pickle.dumps(_Payload()))
    return scores.softmax(-1)
"""

# A reply in the grader's own format that claims a 2 GB float32 tensor and carries 4 bytes: the
# stride-0 answer (4 bytes of storage, any shape) sent past the kernel's own size check. Were the
# grader to build it, its memory would grow by 2 GB (test_the_graders_memory_does_not_grow checks).
FORGED_SHAPE = """
import base64, struct
_encode = base64.b64encode
def _u64(n):
    return struct.pack("<Q", n)
def _str(text):
    return b"s" + _u64(len(text)) + text
_CLAIM = (b"attnbook-reply-1\\n" + b"d" + _u64(1) + _str(b"ok") + b"t" + _str(b"float32")
          + _u64(1) + _u64(5 * 10**8) + bytes(4))
def _forge(data):
    return _encode(_CLAIM if data.startswith(b"attnbook-reply-1") else data)
def my_masked_softmax(scores, mask=None, temperature=1.0):
    base64.b64encode = _forge
    return scores.softmax(-1)
"""

# Honest answers whose comments and names mention the grading machinery: the tampering detector
# reads the code (the AST), so none of this is tampering and the answers score full marks.
MENTIONS = """
# checked below with attnbook.exercises.check("attention-masked-softmax", my_masked_softmax);
# from attnbook.exercises import CHECKS would list the checks
CHECKS = ["no mask", "temperature", "mask"]  # my own list of cases
check = {"seen": 0}
note = "attnbook.exercises.CHECKS['x'] = None is what a cheater writes"
import attnbook.exercises
attnbook.exercises.check("attention-sqrt-dk", lambda d: 1)  # trying a check is not tampering
"""

ATTACKS = {
    "forge-the-log": stub_plus(FORGE),
    "forged-check-cells": replace_checks,
    "appended-forging-cell": append_forging_cell,
    "accept-all-extra-cell": accept_all_in_an_extra_cell,
    "accept-all-in-answer": stub_plus(ACCEPT_ALL),
    "hidden-patch-in-answer": stub_plus(HIDDEN_PATCH),
    "patch-the-library": first_answer(PATCH_LIBRARY),
    "memorized-inputs": first_answer(MEMORIZED),
    "forged-reply": None,  # filled in with the marker path below
    "shuffled-check-cells": shuffle_checks,
    "os-exit": stub_plus("import os\nos._exit(0)"),
    "sys-exit": stub_plus("import sys\nsys.exit(0)"),
    "kill-the-kernel": stub_plus("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"),
    "exit-inside-the-check": first_answer("import os\ndef my_masked_softmax(*args, **kwargs):\n    os._exit(3)"),
    "infinite-loop": stub_plus("while True:\n    pass"),
    "loop-ignoring-interrupts": stub_plus(
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"),
    "loop-inside-the-check": first_answer("def my_masked_softmax(*args, **kwargs):\n    while True:\n        pass"),
    "memory-bomb": stub_plus(
        "hoard = []\ntry:\n    while True:\n        hoard.append(bytearray(10**8))\nexcept MemoryError:\n"
        "    print('memory limit reached after', len(hoard) / 10, 'GB')\ndel hoard"),
    "output-flood": stub_plus("for _ in range(40):\n    print('x' * 10**7)"),
    "huge-answer": first_answer("import torch\ndef my_masked_softmax(*args, **kwargs):\n"
                                "    return torch.zeros(2 * 10**7)"),
    # 20 GB of float32 in 4 bytes of storage: refused in the kernel before anything is copied
    "stride-0-answer": first_answer("import torch\ndef my_masked_softmax(*args, **kwargs):\n"
                                    "    return torch.zeros(1).expand(5 * 10**9)"),
    "stride-0-in-a-list": first_answer("import torch\ndef my_masked_softmax(*args, **kwargs):\n"
                                       "    return [torch.zeros(10**6)] * 100"),
    "forged-shape": first_answer(FORGED_SHAPE),
    # the library's own implementation of what the exercise asks to write, under an alias
    "calls-the-library": first_answer("from attnbook.core import masked_softmax as _ms\n"
                                      "def my_masked_softmax(scores, mask=None, temperature=1.0):\n"
                                      "    return _ms(scores, mask, temperature)"),
}


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    """One grading run: an honest student, a blank one, and every attack; returns what it wrote."""
    root = tmp_path_factory.mktemp("attacks")
    out = root / "out"
    mini = mini_chapter()
    marker = root / "pwned-by-the-reply"
    attacks = dict(ATTACKS, **{"forged-reply": first_answer(FORGED_REPLY.format(marker=marker))})
    # a folder of mode 0500 holding a link to the instructor's file, left in the kernel's folder:
    # removing that folder must not chmod the file (CVE-2023-6597 in TemporaryDirectory)
    instructor = root / "instructor-grades.csv"
    instructor.write_text("ada,4\n")
    instructor.chmod(0o600)
    attacks["links-to-the-instructor"] = stub_plus(f"""
        import os
        os.makedirs("locked")
        os.symlink({str(instructor)!r}, "locked/grades")
        os.chmod("locked", 0o500)
        """)
    attacks["write-into-the-graders-folders"] = stub_plus(f"""
        from pathlib import Path
        for target in [Path({str(out / "grades.csv")!r}), Path({str(out / "gradebook.csv")!r}),
                       Path({str(out / "feedback" / "ada.md")!r})]:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("student,notebook,label,passed\\nwriter,attention.ipynb,*,1\\n")
        Path({str(root / "book" / "attention.ipynb")!r}).write_text("{{}}")
        """)
    mentions = nbformat.from_dict(json.loads(json.dumps(mini)))
    answers(mentions)[0].source = MENTIONS + answers(mentions)[0].source
    book, subs = classroom(root, {"ada": mini, "blank": blank_of(mini), "mentions": mentions, **attacks})
    # names a shell or a spreadsheet would trip on, a file that is not a notebook, another chapter
    for name in ["..hidden", "$(touch pwned)", "a;b|c&d", "=1+1"]:
        (subs / name).mkdir()
        nbformat.write(blank_of(mini), subs / name / "attention.ipynb")
    (subs / "not-a-notebook").mkdir()
    (subs / "not-a-notebook" / "attention.ipynb").write_bytes(bytes(range(256)) * 10)
    (subs / "json-not-a-notebook").mkdir()
    (subs / "json-not-a-notebook" / "attention.ipynb").write_text('{"cells": 5}')
    vision = course.strip_solutions(nbformat.read(ROOT / "book" / "vision_attention.ipynb", as_version=4))
    (subs / "other-chapter").mkdir()
    nbformat.write(vision, subs / "other-chapter" / "attention.ipynb")
    # 10 s a cell: long enough for the floods and bombs to hit their limits on a loaded CI machine
    limits = sandbox.Limits(cell_timeout=10, notebook_timeout=120, memory=3 * sandbox.GIB)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rows = grader.grade([subs], out / "grades.csv", book_dir=book, limits=limits, jobs=2, isolation="none")
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    with (out / "gradebook.csv").open(newline="") as f:
        gradebook = {line[0]: line for line in csv.reader(f)}
    return {"rows": rows, "gradebook": gradebook, "out": out, "marker": marker, "root": root, "grown": grown,
            "instructor": instructor}


def rows_of(attacked, student):
    return {r["label"]: r for r in attacked["rows"] if r["student"] == student}


def test_the_honest_student_keeps_full_marks_and_the_blank_one_has_none(attacked):
    assert attacked["gradebook"]["Student"] == ["Student", f"attention ({FULL})", f"Total ({FULL})"]
    assert attacked["gradebook"]["ada"][1:] == [str(FULL), str(FULL)]
    assert all(rows_of(attacked, "ada")[label]["status"] == "passed" for label in LABELS)
    assert attacked["gradebook"]["blank"][1:] == ["0", "0"]


def test_comments_and_names_that_mention_the_machinery_are_not_tampering(attacked):
    rows = rows_of(attacked, "mentions")
    assert all(rows[label]["status"] == "passed" for label in LABELS), rows
    assert attacked["gradebook"]["mentions"][1:] == [str(FULL), str(FULL)]


@pytest.mark.parametrize("attack", sorted([*ATTACKS, "write-into-the-graders-folders", "links-to-the-instructor"]))
def test_an_attack_scores_no_more_than_a_blank_submission(attacked, attack):
    rows = rows_of(attacked, attack)
    assert set(LABELS) <= set(rows), f"{attack}: a check has no row"
    assert all(rows[label]["passed"] == 0 for label in LABELS), {k: r["message"] for k, r in rows.items()}
    assert attacked["gradebook"][attack][1:] == ["0", "0"]


def test_answer_cells_that_write_to_the_grading_machinery_are_reported_as_tampering(attacked):
    for attack in ["accept-all-in-answer", "hidden-patch-in-answer"]:
        for label in LABELS:
            row = rows_of(attacked, attack)[label]
            assert row["status"] == "untrusted", (attack, row)
            assert "writes to the grading machinery" in row["message"] and "review" in row["message"]
    # printing or writing a forged verdict touches no machinery: it is just an unanswered notebook
    rows = rows_of(attacked, "forge-the-log")
    assert all(rows[label]["status"] == "failed" for label in LABELS), rows


def test_a_reply_that_is_not_plain_data_is_untrusted_and_never_unpickled(attacked):
    row = rows_of(attacked, "forged-reply")["attention-masked-softmax"]
    assert row["status"] == "untrusted" and row["message"].startswith("could not be trusted: ")
    assert "not in the grader's format" in row["message"], row
    assert not attacked["marker"].exists(), "the grader ran a command the kernel sent"


def test_answers_are_measured_by_their_logical_size_before_anything_is_built(attacked):
    for attack, size in [("stride-0-answer", "19,073 MB"), ("stride-0-in-a-list", "381 MB")]:
        row = rows_of(attacked, attack)["attention-masked-softmax"]  # refused in the kernel, with a message
        assert row["status"] == "failed" and f"your answer is {size} of data; the grader takes at most 10 MB" \
            in row["message"], row
    row = rows_of(attacked, "forged-shape")["attention-masked-softmax"]  # the kernel's check bypassed
    assert row["status"] == "untrusted" and "1,907 MB of data; the grader takes at most 10 MB" in row["message"], row


def test_the_graders_memory_does_not_grow_with_an_answers_claimed_size(attacked):
    assert attacked["grown"] < 2**30, f"the grader's peak memory grew by {attacked['grown'] / 2**30:.1f} GiB"


def test_calling_the_library_the_exercise_asks_to_write_is_failed_with_a_message(attacked):
    row = rows_of(attacked, "calls-the-library")["attention-masked-softmax"]
    assert row["status"] == "failed" and "attnbook.core.masked_softmax" in row["message"], row
    feedback = (attacked["out"] / "feedback" / "calls-the-library.md").read_text()
    assert "attnbook.core.masked_softmax" in feedback


def test_replaying_the_notebooks_inputs_fails_on_the_graders_fresh_inputs(attacked):
    row = rows_of(attacked, "memorized-inputs")["attention-masked-softmax"]
    assert row["status"] == "failed" and "values differ" in row["message"]


def test_changed_check_cells_are_replaced_by_the_books_and_reported(attacked):
    for attack in ["forged-check-cells", "appended-forging-cell", "accept-all-extra-cell", "shuffled-check-cells"]:
        rows = rows_of(attacked, attack)
        assert all(rows[label]["status"] == "failed" for label in LABELS), attack
        assert "not attempted" in rows["attention-masked-softmax"]["message"]
        assert "the book's cells ran instead" in rows["*"]["message"], attack


def test_a_dead_kernel_is_reported_and_stops_the_notebook(attacked):
    for attack, code in [("os-exit", "exit code 0"), ("kill-the-kernel", "exit code -9")]:
        row = rows_of(attacked, attack)["*"]
        assert row["status"] == "error" and f"the kernel died, {code}" in row["message"], row
    row = rows_of(attacked, "exit-inside-the-check")
    assert "exit code 3" in row["*"]["message"]
    assert row["attention-sqrt-dk"]["status"] == "not run"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pins processes to a CPU (Linux)")
def test_a_dead_kernel_is_reported_the_same_on_a_busy_machine(tmp_path, monkeypatch):
    """Three busy processes share one CPU with the grader and its kernel, so a cell takes about four
    times as long on the wall clock as on an idle machine: the answer that computes for half the
    time limit, then exits, runs twice past it. A cell's time leaves out the waits for a CPU that
    other work held: the call does not time out, and the kernel's exit is reported with its exit
    code, as on an idle machine (timed by the wall clock, the call was interrupted instead)."""
    cpu = min(os.sched_getaffinity(0))
    mine = os.sched_getaffinity(0)
    limits = sandbox.Limits(cell_timeout=3, notebook_timeout=300)
    start, n = time.process_time(), 2 * 10**6
    x = 0
    for i in range(n):
        x += i
    n = int(n * limits.cell_timeout / 2 / (time.process_time() - start))  # half the limit
    book, subs = classroom(tmp_path, {"exit": first_answer(f"""
        import os
        def my_masked_softmax(*args, **kwargs):
            x = 0
            for i in range({n}):
                x += i
            os._exit(3)
        """)})
    walls = []
    run = grader.KernelSession.run

    def timed(self, code, *args, **kwargs):
        start = time.monotonic()
        try:
            return run(self, code, *args, **kwargs)
        finally:
            walls.append(time.monotonic() - start)

    monkeypatch.setattr(grader.KernelSession, "run", timed)
    # each in a session of its own, as the kernel is: the scheduler shares a CPU among sessions
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(3)]
    try:
        for hog in hogs:
            os.sched_setaffinity(hog.pid, {cpu})
        os.sched_setaffinity(0, {cpu})  # the kernel inherits it
        rows = grader.grade([subs], tmp_path / "g.csv", book_dir=book, limits=limits, isolation="none")
    finally:
        os.sched_setaffinity(0, mine)
        for hog in hogs:
            hog.kill()
            hog.wait()
    got = {r["label"]: r for r in rows}
    assert "the kernel died, exit code 3" in got["*"]["message"], got
    assert max(walls) > limits.cell_timeout, f"no cell was slowed past the time limit: {walls}"


def test_loops_are_interrupted_or_killed_and_the_rest_still_runs(attacked):
    row = rows_of(attacked, "infinite-loop")["attention-masked-softmax"]  # the answer never got defined
    assert row["status"] == "not run" and "your answer cell raised the cell ran longer than 10 s" in row["message"]
    assert rows_of(attacked, "infinite-loop")["attention-sqrt-dk"]["status"] == "failed"  # the kernel lived on
    row = rows_of(attacked, "loop-inside-the-check")["attention-masked-softmax"]
    assert row["status"] == "failed" and "ran longer than 10 s on the check's inputs" in row["message"]
    assert rows_of(attacked, "loop-inside-the-check")["attention-sqrt-dk"]["status"] == "failed"  # kernel alive
    row = rows_of(attacked, "loop-ignoring-interrupts")["*"]
    assert row["status"] == "error" and "ignored the interrupt" in row["message"]


def test_memory_and_output_are_capped(attacked):
    rows = rows_of(attacked, "memory-bomb")
    assert rows["attention-masked-softmax"]["status"] == "failed", rows  # the kernel survived its MemoryError
    assert "*" not in rows or rows["*"]["status"] == "note", rows
    row = rows_of(attacked, "output-flood")["*"]
    assert row["status"] == "error" and "more than 20 MB of output" in row["message"], row
    row = rows_of(attacked, "huge-answer")["attention-masked-softmax"]
    assert row["status"] == "failed" and "the grader takes at most 10 MB" in row["message"]


def test_removing_a_kernels_folder_follows_no_link_the_submission_left(attacked):
    assert oct(attacked["instructor"].stat().st_mode & 0o777) == "0o600"
    assert attacked["instructor"].read_text() == "ada,4\n"


def test_writes_into_the_graders_folders_do_not_change_this_runs_files(attacked):
    out = attacked["out"]
    with (out / "grades.csv").open(newline="") as f:
        written = list(csv.DictReader(f))
    assert len(written) == len(attacked["rows"]) and not any(r["student"] == "writer" for r in written)
    assert (out / "feedback" / "ada.md").read_text().startswith("# Feedback for ada\n")
    assert f"{len(LABELS)} of {len(LABELS)} checks passed" in (out / "feedback" / "ada.md").read_text()


def test_odd_names_bad_files_and_other_chapters_are_rows_not_crashes(attacked):
    out = attacked["out"]
    feedback = sorted(p.name for p in (out / "feedback").iterdir())
    assert {"hidden.md", "touch_pwned.md", "a_b_c_d.md", "1_1.md"} <= set(feedback)
    assert not (attacked["root"] / "pwned").exists() and not Path("pwned").exists()
    assert attacked["gradebook"]["'=1+1"][1:] == ["0", "0"]  # a spreadsheet shows it, never runs it
    for student in ["not-a-notebook", "json-not-a-notebook"]:
        row = rows_of(attacked, student)["*"]
        assert row["status"] == "error" and row["message"].startswith("not a notebook that can be read")
    rows = rows_of(attacked, "other-chapter")
    notes = [r["message"] for r in attacked["rows"] if r["student"] == "other-chapter" and r["label"] == "*"]
    assert any(n.startswith("this notebook does not look like attention.ipynb: only 0 of its") for n in notes)
    assert all(rows[label]["passed"] == 0 for label in LABELS)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process limits are Linux's (cgroups, rlimits)")
def test_a_fork_bomb_is_contained_and_the_next_student_is_graded(tmp_path):
    with sandbox.process_guard(8) as guard:
        assert guard.kind in ("cgroup", "rlimit"), "no fork limit on this Linux machine"
    book, subs = tmp_path / "book", tmp_path / "subs"
    book.mkdir()
    mini = mini_chapter()
    nbformat.write(mini, book / "attention.ipynb")
    bomb = blank_of(mini)
    stub_plus("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")(bomb)
    for name, nb in [("bomber", bomb), ("ada", mini)]:
        (subs / name).mkdir(parents=True)
        nbformat.write(nb, subs / name / "attention.ipynb")
    limits = sandbox.Limits(cell_timeout=5, notebook_timeout=60, processes=64)
    rows = grader.grade([subs], tmp_path / "g.csv", book_dir=book, limits=limits, jobs=1, isolation="none")
    got = {(r["student"], r["label"]): r for r in rows}
    assert all(got["bomber", label]["passed"] == 0 for label in LABELS)
    assert all(got["ada", label]["status"] == "passed" for label in LABELS)


# ---- the tampering detector: the AST of the answer cells, never a pattern in their text ----------
@functools.cache
def book_chapter(name):
    nb = nbformat.read(ROOT / "book" / name, as_version=4)
    return grader.Chapter.from_notebook(nb, name), nbformat.writes(nb)


def chapter_of(name):
    """The book's chapter ``name`` as the grader reads it, and its notebook with the solutions."""
    chapter, text = book_chapter(name)
    return chapter, nbformat.reads(text, as_version=4)


def writes(source, name="attention.ipynb"):
    """What ``source``, as an answer cell of chapter ``name``, does to the grading machinery."""
    chapter, _ = chapter_of(name)
    setup = [s.code for s in chapter.steps if s.kind != "check"]
    checked = [s.code for s in chapter.steps if s.kind == "check"]
    return grader.machinery_writes([textwrap.dedent(source)], setup, checked)[0]


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "book").glob("*.ipynb")))
def test_every_solution_in_the_book_is_trusted(name):
    """The book's own answers, run through the grader's rebuild as a submission, are never tampering;
    nor are they with comments and a variable that name the machinery."""
    chapter, nb = chapter_of(name)
    steps, notes, tampering = grader.rebuild(chapter, nb)
    assert tampering == [], tampering
    for cell in answers(nb):
        cell.source = ("# attnbook.exercises.check(label, answer); CHECKS = {} would not matter\n"
                       "CHECKS = ['mine']\n" + cell.source)
    assert grader.rebuild(chapter, nb)[2] == []


ATTACK_FORMS = [
    "attnbook.exercises.CHECKS['attention-sqrt-dk'] = None",
    "import attnbook.exercises as e\ne.check = lambda *a: None",
    "from attnbook import exercises as grading\ngrading.run_check = print",
    "from attnbook.exercises import CHECKS\nCHECKS.clear()",
    "from attnbook.exercises import CHECKS as C\nC['attention-sqrt-dk'] = None",
    "setattr(attnbook.exercises, 'check', print)",
    "setattr(attnbook.exercises, name_known_only_at_run_time, print)",
    "vars(attnbook.exercises)['check'] = print",
    "attnbook.exercises.__dict__['run_check'] = print",
    "vars(attnbook.exercises).update(check=print)",
    "import sys\nsys.modules['attnbook.exercises'].check = print",
    "import sys\nsys.modules['attnbook.exercises'] = None",
    "import importlib\ng = importlib.import_module('attnbook.' + 'exer' + 'cises')\nsetattr(g, 'run_' + 'check', 1)",
    "g = __import__('attnbook.exercises', fromlist=['check'])\ng.CHECKS.update({})",
    "getattr(getattr(attnbook, 'exercises'), 'CHE' + 'CKS')['x'] = 1",
    "object.__setattr__(attnbook.exercises.CHECKS['attention-sqrt-dk'], 'fn', print)",
    "attnbook.exercises.CHECKS['attention-sqrt-dk'].fn.__code__ = (lambda s: None).__code__",
    "def f():\n    import attnbook.exercises as e\n    e.check = print\nf()",
    "exec('attnbook.exercises.check = print')",
    "%%capture\nattnbook.exercises.CHECKS.clear()",  # a cell magic runs its body from a string
    "del attnbook.exercises.check",
    "from attnbook.exercises import *\nCHECKS['x'] = 1",
    "attnbook.utils.largest_new_tensor = lambda *a: 0",  # the measurement two checks make in the kernel
    "__attnbook_answer__ = None",
]


@pytest.mark.parametrize("source", ATTACK_FORMS)
def test_every_form_of_writing_to_the_machinery_is_tampering(source):
    assert writes(source), source


LAB_ATTACKS = [  # the kernel lab's checks run the student's kernel through the launchers, in the kernel
    "lab.attention_forward = lambda kernel, *a, **k: None",
    "import attnbook.kernels.lab as L\nL.softmax = torch.softmax",
    "from attnbook.kernels import lab as bench\nbench.matmul = torch.matmul",
    "setattr(attnbook . kernels . lab, 'matmul', torch.matmul)",
    "import types\nlab = types.SimpleNamespace(softmax=torch.softmax)",  # the name the check reads
    "functools.partial = lambda launcher, kernel: launcher",
    "import functools as ft\nft.partial = print",
    "def f():\n    global lab\n    lab = None",
    "globals()['lab'] = None",
]


@pytest.mark.parametrize("source", LAB_ATTACKS)
def test_rebinding_the_kernel_labs_launchers_or_the_names_its_checks_read_is_tampering(source):
    assert writes(source, "kernel_lab.ipynb"), source


@pytest.mark.parametrize("source", [
    "CHECKS = [1, 2]\nCHECKS[0] = 3",
    "check = lambda x: x\nrun_check = None",
    "# attnbook.exercises.CHECKS['x'] = None\ndef f():\n    pass",
    "text = 'setattr(attnbook.exercises, \"check\", None)'",
    "attnbook.exercises.check('attention-sqrt-dk', lambda d: 1)",
    "import attnbook.exercises\nprint(sorted(attnbook.exercises.CHECKS))",
    "from attnbook import exercises\nverdict = exercises.run_check('attention-sqrt-dk', abs)",
    "def f(attnbook):\n    attnbook.exercises = 1",  # a parameter, not the module
    "from attnbook.kernels import lab as bench\nx = bench.softmax\nif lab.tiles == 1:\n    pass",
    "%timeit sum(range(10))",
    "%%capture\nCHECKS = {}",
])
def test_reads_calls_comments_and_the_students_own_names_are_not_tampering(source):
    assert writes(source) == [] and writes(source, "kernel_lab.ipynb") == [], source


# ---- the reply the kernel sends: decoded by the grader, never trusted -----------------------------
def u64(n):
    return struct.pack("<Q", n)


def text(value: bytes):
    return b"s" + u64(len(value)) + value


def reply(answer: bytes) -> bytes:
    return grader.MAGIC + b"d" + u64(1) + text(b"ok") + answer


@pytest.mark.parametrize("data, why", [
    (b"\x80\x04K\x01.", "not in the grader's format"),  # a pickle
    (reply(b"t" + text(b"float32") + u64(1) + u64(5 * 10**9) + b"\0" * 4), "19,073 MB of data"),
    (reply(b"t" + text(b"float32") + u64(2) + u64(2**40) + u64(2**40) + b"\0" * 4), "MB of data"),
    (reply(b"t" + text(b"float32") + u64(1) + u64(3) + b"\0" * 4), "cut short"),
    (reply(b"t" + text(b"object") + u64(0)), "not plain data"),
    (reply(b"a" + text(b"|O8") + u64(0)), "not plain"),
    (reply(b"l" + u64(2**60)), "cut short"),
    (reply(b"".join([b"l" + u64(1)] * 60) + b"N"), "nested too deeply"),
    (reply(b"l" + u64(2**21) + b"N" * 2**21), "too many values"),
    (reply(b"N") + b"more", "bytes after its end"),
    (reply(b"Z"), "wrong form"),
    (grader.MAGIC + b"l" + u64(0), "wrong form"),
])
def test_a_forged_reply_is_refused_before_anything_large_is_built(data, why):
    with pytest.raises(grader.Untrusted, match=why):
        grader._decode(data, 10 * 2**20)


def test_a_reply_is_rebuilt_as_fresh_contiguous_tensors_and_plain_values():
    namespace = {}
    exec(grader._KERNEL_SIDE, namespace)
    namespace["answer"] = {"t": torch.arange(6.0).reshape(2, 3).t(), "n": [1, -2**70, 1.5, "x", None]}
    sent = namespace["__attnbook_answer__"]("answer", (), None, False, 2**20, grader.MAX_NODES)
    got = grader._decode(base64.b64decode(sent), 2**20)["ok"]
    assert got["n"] == [1, -2**70, 1.5, "x", None] and type(got["t"]) is torch.Tensor
    assert got["t"].is_contiguous() and torch.equal(got["t"], namespace["answer"]["t"])
