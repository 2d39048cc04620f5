"""The question bank (questions/*.toml, tools/questions.py, attnbook.course.checks.questions).

Every numbered chapter has 10 to 15 questions, each drawn from one of its objectives; the pages
and the checks' data are what the sources make; every right answer passes its own check and is
told why, every wrong option fails and is told where to reread; nothing in the installed
package or a student notebook gives an answer away; and the pages are graded by the three
routes: the book's grader (every page), nbgrader (every page, one assignment) and otter (two
pages on every push, every page in `make test-grading`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from attnbook import course
from attnbook.course import grader
from attnbook.course.checks import questions as bank_checks
from attnbook.exercises import run_check
from tools import questions as Q

ROOT = Path(__file__).resolve().parents[2]
PAGES = ROOT / "book" / "questions"
BANKS = {b["chapter"]: b for b in Q.banks()}
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
}


def numbered_chapters() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [Path(c["file"]).name for part in toc["parts"] if part.get("numbered")
            for c in part["chapters"]]  # fmt: skip


def every_question():
    for chapter, bank in BANKS.items():
        for n, q in enumerate(bank["question"], 1):
            yield pytest.param(Q.label(chapter, n), q, id=Q.label(chapter, n))


# ---- the bank and what it makes -------------------------------------------------------------
def test_every_chapter_has_ten_to_fifteen_questions_covering_every_objective():
    assert sorted(BANKS) == sorted(numbered_chapters())
    for chapter, bank in BANKS.items():
        assert 10 <= len(bank["question"]) <= 15, chapter
        assert {q["objective"] for q in bank["question"]} == set(
            range(1, len(bank["objectives"]) + 1)), chapter
        letters = [q["answer"] for q in bank["question"] if q["kind"] == "choice"]
        assert len(set(letters)) >= 3, f"{chapter}: the right letters vary: {letters}"


def test_the_pages_and_the_checks_data_are_what_the_sources_make():
    assert Q.main(["--check"]) == 0, "run python -m tools.questions"


def test_the_page_lists_each_objective_with_the_questions_that_test_it():
    bank = BANKS["attention"]
    intro = nbformat.read(PAGES / "attention.ipynb", as_version=4).cells[0].source
    for n, objective in enumerate(bank["objectives"], 1):
        line = next(x for x in intro.splitlines() if x.startswith(f"{n}. {objective}"))
        wanted = [i for i, q in enumerate(bank["question"], 1) if q["objective"] == n]
        assert re.findall(r"<attention-q(\d+)>", line) == [str(i) for i in wanted]


def test_the_format_is_enforced(tmp_path):
    good = (ROOT / "questions" / "attention.toml").read_text()
    for change, why in [
        (lambda s: s.replace('kind = "choice"', 'kind = "essay"', 1), "kind"),
        (lambda s: s.replace('chapter = "attention"', 'chapter = "flash"'), "expected"),
        (lambda s: re.sub(r'section = "[^"]+"', 'section = "sec-nowhere"', s, count=1),
         "no section"),
    ]:  # fmt: skip
        path = tmp_path / "attention.toml"
        path.write_text(change(good))
        with pytest.raises(ValueError, match=why):
            Q.load(path)
    with pytest.raises(ValueError, match="rounding boundary"):
        Q._check_rounding(0.1235, 3, "here")
    Q._check_rounding(0.1234, 3, "here")


# ---- each check ------------------------------------------------------------------------------
@pytest.mark.parametrize("name, q", list(every_question()))
def test_the_right_answer_passes_with_its_explanation_and_every_other_fails(name, q):
    right = run_check(name, lambda: q["answer"])
    assert right.passed, right.message
    assert right.message == f"right. {q['explanation'].strip()}"
    if q["kind"] == "choice":
        wrong = [x for x in Q.LETTERS[: len(q["options"])] if x != q["answer"]]
        assert run_check(name, lambda: q["answer"].lower()).passed  # "c" is "C"
    else:
        value, digits = q["answer"], q["digits"]
        wrong = [value + 1] if digits == 0 else [value * 1.25, -value]  # past rounding
        if digits:  # the answer to its significant figures, and a little more
            assert run_check(name, lambda: float(f"{value:.{digits}g}")).passed
            assert run_check(name, lambda: float(f"{value:.{digits + 2}g}")).passed
    for answer in wrong:
        verdict = run_check(name, lambda answer=answer: answer)
        assert not verdict.passed and "is not right" in verdict.message
        assert "reread the section" in verdict.message
        assert q["explanation"].strip()[:40] not in verdict.message
    blank = run_check(name, lambda: None)
    assert not blank.passed and blank.message.startswith("not attempted")


def test_an_answer_of_the_wrong_form_is_told_what_form():
    choice = next(n for n, e in bank_checks.load().items() if e["kind"] == "choice")
    number = next(n for n, e in bank_checks.load().items() if e["kind"] == "number")
    assert "one letter, A to" in run_check(choice, lambda: "B or C").message
    assert "one letter" in run_check(choice, lambda: 2).message
    assert "a number" in run_check(number, lambda: "12").message
    assert "finite" in run_check(number, lambda: float("nan")).message


def test_no_answer_or_explanation_can_be_read_from_the_package_or_a_student_page():
    stored = bank_checks.DATA.read_text()
    for chapter, bank in BANKS.items():
        student = course.strip_solutions(nbformat.read(PAGES / f"{chapter}.ipynb", as_version=4))
        text = "\n".join(c.source for c in student.cells)
        assert "BEGIN SOLUTION" not in text and "{solution}" not in text
        answers = [c.source for c in student.cells if c.get("id", "").endswith("-answer")]
        assert answers and not any("return " in a for a in answers)
        for q in bank["question"]:
            explanation = q["explanation"].strip()
            assert explanation[:40] not in stored and explanation[:40] not in text
    assert "answer" not in json.dumps({k: sorted(v) for k, v in bank_checks.load().items()})


# ---- the three grading routes ----------------------------------------------------------------
def solved_with_one_wrong(chapter: str):
    """The page solved, but question 1 answered wrong: (notebook, the wrong label)."""
    nb = nbformat.read(PAGES / f"{chapter}.ipynb", as_version=4)
    q = BANKS[chapter]["question"][0]
    wrong = ('"A"' if q["answer"] != "A" else '"B"') if q["kind"] == "choice" else repr(
        q["answer"] + 1)
    for cell in nb.cells:
        if cell.get("id") == "q1-answer":
            cell.source = f"def answer_1():\n    return {wrong}"
    return nb, Q.label(chapter, 1)


def test_the_books_grader_scores_every_page(tmp_path):
    subs = tmp_path / "subs"
    expected = {}
    for chapter in BANKS:
        nb, wrong = solved_with_one_wrong(chapter)
        (subs / "mixed").mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, subs / "mixed" / f"{chapter}.ipynb")
        expected.update({Q.label(chapter, n): n != 1
                         for n in range(1, len(BANKS[chapter]["question"]) + 1)})  # fmt: skip
    (subs / "blank").mkdir()
    page = nbformat.read(PAGES / "attention.ipynb", as_version=4)
    nbformat.write(course.strip_solutions(page), subs / "blank" / "attention.ipynb")
    rows = grader.grade([subs], tmp_path / "grades.csv", book_dir=PAGES, jobs=2,
                        isolation="none")  # fmt: skip
    errors = [r for r in rows if r["label"] == "*" and r["status"] == "error"]
    assert not errors, errors
    mixed = {r["label"]: r for r in rows if r["student"] == "mixed" and r["label"] != "*"}
    assert {k: bool(r["passed"]) for k, r in mixed.items()} == expected
    assert all(r["message"].startswith("right. ") for r in mixed.values() if r["passed"])
    blank = [r for r in rows if r["student"] == "blank" and r["label"] != "*"]
    assert len(blank) == len(BANKS["attention"]["question"])
    assert all(r["status"] == "failed" and "not attempted" in r["message"] for r in blank)


def run(tool: str, folder: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", tool, *args], cwd=folder, capture_output=True,
                          text=True, env=ENV, timeout=900)  # fmt: skip
    assert done.returncode == 0, f"{tool} {' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


def test_nbgrader_scores_every_page_in_one_assignment(tmp_path):
    """The pages as one nbgrader assignment, `questions`: a student with every page solved but
    its first question scores the total less one point per page."""
    from nbgrader.api import Gradebook

    home = tmp_path
    assert course.main(["nbgrader", str(home / "export"), "--book", str(PAGES)]) == 0
    (home / "source" / "questions").mkdir(parents=True)
    for chapter in BANKS:
        exported = home / "export" / chapter / f"{chapter}.ipynb"
        (home / "source" / "questions" / f"{chapter}.ipynb").write_bytes(exported.read_bytes())
    config = (home / "export" / "nbgrader_config.py").read_text()
    (home / "nbgrader_config.py").write_text(config)
    run("nbgrader", home, "generate_assignment", "questions", "--force")
    folder = home / "submitted" / "mixed" / "questions"
    folder.mkdir(parents=True)
    for chapter in BANKS:
        released = nbformat.read(home / "release" / "questions" / f"{chapter}.ipynb", as_version=4)
        source = nbformat.read(home / "source" / "questions" / f"{chapter}.ipynb", as_version=4)
        answers = {c.id: c.source for c in source.cells}
        for cell in released.cells:
            if cell.metadata.get("nbgrader", {}).get("solution"):
                cell.source = answers[cell.id]
                if cell.id == "q1-answer":
                    cell.source = solved_with_one_wrong(chapter)[0].cells[
                        [c.id for c in source.cells].index("q1-answer")].source
        nbformat.write(released, folder / f"{chapter}.ipynb")
    run("nbgrader", home, "autograde", "questions", "--create", "--force")
    os.environ["PATH"] = ENV["PATH"]
    with Gradebook(f"sqlite:///{home / 'gradebook.db'}") as gb:
        for chapter, bank in BANKS.items():
            total = len(bank["question"])
            nb = gb.find_submission_notebook(chapter, "questions", "mixed")
            assert (nb.score, nb.max_score) == (total - 1, total), chapter


# Two pages on every push (about 22 s each); every page in `make test-grading` (every_chapter)
OTTER_ON_PUSH = ("attention", "kernel_lab")


@pytest.mark.parametrize("chapter", [
    pytest.param(c, marks=() if c in OTTER_ON_PUSH else pytest.mark.every_chapter)
    for c in sorted(BANKS)])  # fmt: skip
def test_otter_scores_a_page(tmp_path, chapter):
    home = tmp_path
    assert course.main(["otter", str(home / "masters"), "--book", str(PAGES)]) == 0
    folder = home / "masters" / chapter
    run("otter", folder, "assign", f"{chapter}.ipynb", "dist")
    (zip_path,) = (folder / "dist" / "autograder").glob("*.zip")
    solved = nbformat.read(folder / "dist" / "autograder" / f"{chapter}.ipynb", as_version=4)
    wrong_answer = solved_with_one_wrong(chapter)[0]
    source = next(c.source for c in wrong_answer.cells if c.get("id") == "q1-answer")
    for cell in solved.cells:
        if cell.source.startswith("def answer_1():"):
            cell.source = source
    path = home / "mixed" / f"{chapter}.ipynb"
    path.parent.mkdir()
    nbformat.write(solved, path)
    out = home / "results"
    out.mkdir()
    run("otter", home, "run", "-a", str(zip_path), "-o", str(out), str(path))
    tests = json.loads((out / "results.json").read_text())["tests"]
    scores = {t["name"]: t["score"] for t in tests if "score" in t}
    total = len(BANKS[chapter]["question"])
    assert scores == {Q.label(chapter, n): float(n != 1) for n in range(1, total + 1)}
