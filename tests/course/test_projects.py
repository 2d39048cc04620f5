"""The staged projects (``book/projects/*.ipynb``): milestones with public checks, hidden
tests and a rubric, graded by the three routes.

A hidden test is a check cell tagged ``hidden-tests`` right after its milestone's public
check, labelled ``<label>-hidden``. The student notebooks, the student edition and nbgrader's
and otter's student notebooks leave it out; the book's grader, ``nbgrader autograde`` and
otter's autograder run it. The routes are shown on the serving project with a submission that
passes every public check and fails every hidden test: a paged attention that maps query heads
to key/value heads wrongly (the public cases have one key/value head per query head) and a
scheduler that lets a small request overtake a blocked one (no public case blocks).
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
from nbformat.v4 import new_code_cell, new_notebook
from scripts import load_script

from attnbook import course
from attnbook.course import grader, notebooks
from attnbook.course.notebooks import HIDDEN, hidden_checks, strip_solutions

ROOT = Path(__file__).resolve().parents[2]
PROJECTS = ROOT / "book" / "projects"
BOOK = {p.stem: nbformat.read(p, as_version=4) for p in sorted(PROJECTS.glob("*.ipynb"))}
SERVE = "serve_paged"
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
}
# The serving project's answers that pass its public checks and fail its hidden tests
PUBLIC_ONLY = {
    "m1-answer": '''
def paged_decode_attention(q, k_pool, v_pool, block_tables, seqlens):
    B, h, d = q.shape
    group = h // k_pool.shape[1]
    out = torch.empty_like(q)
    for b in range(B):
        n = seqlens[b]
        k = k_pool[block_tables[b]].transpose(0, 1).flatten(1, 2)[:, :n]
        v = v_pool[block_tables[b]].transpose(0, 1).flatten(1, 2)[:, :n]
        k, v = k.repeat(group, 1, 1), v.repeat(group, 1, 1)  # head j reads j % h_kv
        w = (torch.einsum("hd,hnd->hn", q[b], k) / math.sqrt(d)).softmax(-1)
        out[b] = torch.einsum("hn,hnd->hd", w, v)
    return out
''',
    "m2-answer": '''
def schedule(requests, n_blocks, block_size, max_batch):
    need = [math.ceil((p + n) / block_size) for _, p, n in requests]
    if max(need) > n_blocks:
        raise ValueError("a request can never fit")
    queue = sorted(range(len(requests)), key=lambda i: (requests[i][0], i))
    running, spans, step = {}, {}, 0
    while len(spans) < len(requests):
        running = {i: e for i, e in running.items() if e >= step}
        for i in list(queue):  # any request that fits, even past a blocked head
            free = n_blocks - sum(need[j] for j in running)
            if requests[i][0] <= step and len(running) < max_batch and need[i] <= free:
                queue.remove(i)
                spans[i] = (step, step + requests[i][2] - 1)
                running[i] = spans[i][1]
        step += 1
    return [spans[i] for i in range(len(requests))]
''',
}
SERVE_LABELS = ["project-serve-paged-decode", "project-serve-schedule"]


def _with_answers(nb, answers: dict[str, str]):
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    for cell in nb.cells:
        if cell.get("id") in answers:
            cell.source = answers[cell["id"]].strip("\n")
    return nb


def _text(nb) -> str:
    return "\n".join(cell.source for cell in nb.cells)


# ---- the projects --------------------------------------------------------------------------
@pytest.mark.parametrize("name", BOOK)
def test_each_project_has_milestones_with_public_and_hidden_checks_and_a_rubric(name):
    nb = BOOK[name]
    hidden = hidden_checks(nb, name)
    checked = [label for label in notebooks.expected_labels(nb) if not label.endswith("-hidden")]
    assert len(checked) >= 2, f"{name}: at least two coded milestones"
    assert sorted(hidden) == sorted(checked), f"{name}: every coded milestone has hidden tests"
    written = course.written_exercises(nb)
    assert written and all(course.rubrics(nb)[label] for label in written), name
    points = nb.metadata["attnbook"]["points"]
    assert set(points) == set(checked) | {h for h, _ in hidden.values()} | set(written)
    headings = re.findall(r"^## Milestone (\d+):", _text(nb), re.M)
    assert headings == [str(n) for n in range(1, len(headings) + 1)] and len(headings) >= 3
    assert nb.cells[0].source.lstrip().startswith("(project-"), "a label to link to"


def test_a_hidden_test_must_follow_the_public_check_of_its_milestone():
    def book(*cells):
        return new_notebook(cells=[new_code_cell(s, metadata=m) for s, m in cells])

    tag = {"tags": [HIDDEN]}
    ok = book(('check("x-a", f)', {}), ('check("x-a-hidden", f)', tag))
    assert hidden_checks(ok) == {"x-a": ("x-a-hidden", "f")}
    for bad, why in [
        (book(('check("x-a-hidden", f)', tag)), "must follow the check cell"),
        (book(('check("x-a", f)', {}), ("x = 1", {}), ('check("x-a-hidden", f)', tag)),
         "must follow the check cell"),
        (book(('check("x-a", f)', {}), ('check("x-b-hidden", f)', tag)), "must follow"),
        (book(('check("x-a", f)', {}), ('check("x-a", f)', tag)), "-hidden"),
        (book(('check("x-a", f)', {}), ('print(1)', tag)), "must be one check"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=why):
            strip_solutions(bad)


@pytest.mark.parametrize("name", BOOK)
def test_the_student_notebook_has_no_hidden_test_and_no_solution(name):
    nb = BOOK[name]
    student = strip_solutions(nb, name=name)
    text = _text(student)
    assert "-hidden" not in text and HIDDEN not in json.dumps(student.dict())
    assert "### BEGIN SOLUTION" not in text
    kept = strip_solutions(nb, name=name, keep_hidden=True)
    assert len(kept.cells) == len(student.cells) + len(hidden_checks(nb))


def test_the_student_bundle_and_branch_leave_the_hidden_tests_out(tmp_path):
    editions = load_script(ROOT / "_ext" / "editions.py")
    written = editions.student_branch(tmp_path / "branch", ROOT / "book")
    projects = [p for p in written if p.parent.name == "projects"]
    assert sorted(p.stem for p in projects) == sorted(BOOK)
    for path in projects:
        assert "-hidden" not in path.read_text(), path


# ---- the book's grader ---------------------------------------------------------------------
def test_the_books_grader_runs_the_hidden_tests(tmp_path):
    nb = BOOK[SERVE]
    subs = tmp_path / "subs"
    model = {c.id: c.source for c in nb.cells if "solution" in c.metadata.get("tags", [])}
    for student, answers in (("model", model), ("public_only", PUBLIC_ONLY)):
        (subs / student).mkdir(parents=True)
        submitted = _with_answers(strip_solutions(nb, name=SERVE), answers)
        nbformat.write(submitted, subs / student / f"{SERVE}.ipynb")
    (subs / "blank").mkdir()
    nbformat.write(strip_solutions(nb, name=SERVE), subs / "blank" / f"{SERVE}.ipynb")
    rows = grader.grade([subs], tmp_path / "grades.csv", book_dir=PROJECTS, jobs=2,
                        isolation="none")  # fmt: skip
    got = {(r["student"], r["label"]): r for r in rows if r["label"] != "*"}
    for label in SERVE_LABELS:
        for hidden in (label, f"{label}-hidden"):
            assert got["model", hidden]["passed"] == 1, got["model", hidden]
            assert "not attempted" in got["blank", hidden]["message"]
        assert got["public_only", label]["passed"] == 1, got["public_only", label]
        row = got["public_only", f"{label}-hidden"]
        assert row["passed"] == 0 and row["status"] == "failed", row


# ---- nbgrader and otter --------------------------------------------------------------------
def run(tool: str, folder: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", tool, *args], cwd=folder, capture_output=True,
                          text=True, env=ENV, timeout=600)  # fmt: skip
    assert done.returncode == 0, f"{tool} {' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done.stdout + done.stderr


def test_nbgrader_releases_no_hidden_test_and_autograde_runs_them(tmp_path):
    from nbgrader.api import Gradebook

    home = tmp_path
    assert course.main(["nbgrader", str(home / "export"), "--book", str(PROJECTS)]) == 0
    source = home / "source" / SERVE
    source.mkdir(parents=True)
    (source / f"{SERVE}.ipynb").write_bytes((home / "export" / SERVE / f"{SERVE}.ipynb").read_bytes())
    (home / "nbgrader_config.py").write_text((home / "export" / "nbgrader_config.py").read_text())
    exported = nbformat.read(source / f"{SERVE}.ipynb", as_version=4)
    hidden = [c for c in exported.cells if c.source.startswith(notebooks.HIDDEN_BEGIN)]
    assert [c.metadata["nbgrader"]["grade_id"] for c in hidden] == [f"{x}-hidden" for x in SERVE_LABELS]
    run("nbgrader", home, "generate_assignment", SERVE, "--force")
    released = nbformat.read(home / "release" / SERVE / f"{SERVE}.ipynb", as_version=4)
    assert "-hidden" not in _text(released) and "HIDDEN TESTS" not in _text(released)
    folder = home / "submitted" / "ada" / SERVE
    folder.mkdir(parents=True)
    nbformat.write(_with_answers(released, PUBLIC_ONLY), folder / f"{SERVE}.ipynb")
    run("nbgrader", home, "autograde", SERVE, "--create", "--force")
    points = BOOK[SERVE].metadata["attnbook"]["points"]
    with Gradebook(f"sqlite:///{home / 'gradebook.db'}") as gb:
        grades = {g.name: (g.auto_score, g.max_score)
                  for g in gb.find_submission_notebook(SERVE, SERVE, "ada").grades}  # fmt: skip
    for label in SERVE_LABELS:
        assert grades[label] == (points[label], points[label])
        assert grades[f"{label}-hidden"] == (0, points[f"{label}-hidden"])


def test_otter_keeps_the_hidden_tests_for_the_autograder(tmp_path):
    home = tmp_path
    assert course.main(["otter", str(home / "masters"), "--book", str(PROJECTS)]) == 0
    folder = home / "masters" / SERVE
    master = nbformat.read(folder / f"{SERVE}.ipynb", as_version=4)
    assert sum(c.source.startswith("# HIDDEN\n") for c in master.cells) == len(SERVE_LABELS)
    run("otter", folder, "assign", f"{SERVE}.ipynb", "dist")
    student = nbformat.read(folder / "dist" / "student" / f"{SERVE}.ipynb", as_version=4)
    assert "-hidden" not in _text(student)
    (zip_path,) = (folder / "dist" / "autograder").glob("*.zip")
    solved = nbformat.read(folder / "dist" / "autograder" / f"{SERVE}.ipynb", as_version=4)
    for cell in solved.cells:
        for name in ("paged_decode_attention", "schedule"):
            if cell.source.startswith(f"def {name}("):
                key = "m1-answer" if name != "schedule" else "m2-answer"
                cell.source = PUBLIC_ONLY[key].strip("\n")
    path = home / "ada" / f"{SERVE}.ipynb"
    path.parent.mkdir()
    nbformat.write(solved, path)
    out = home / "results"
    out.mkdir()
    run("otter", home, "run", "-a", str(zip_path), "-o", str(out), str(path))
    tests = {t["name"]: t for t in json.loads((out / "results.json").read_text())["tests"]}
    points = BOOK[SERVE].metadata["attnbook"]["points"]
    for label in SERVE_LABELS:
        assert tests[label]["score"] == points[label], tests[label]
        assert tests[label]["max_score"] == points[label] + points[f"{label}-hidden"]


@pytest.mark.parametrize("name", BOOK)
def test_the_student_editions_download_has_no_hidden_test(name, tmp_path):
    """The student edition rewrites the notebooks offered for download (``_sources/``) as
    ``editions.student_notebook`` gives them."""
    editions = load_script(ROOT / "_ext" / "editions.py")
    student, problems = editions.student_notebook(BOOK[name], f"{name}.ipynb")
    assert not problems and "-hidden" not in _text(student)
    assert editions.has_solutions(BOOK[name]) and not editions.has_solutions(student)
    nbformat.write(BOOK[name], tmp_path / f"{name}.ipynb")
    assert editions.strip_sources(tmp_path) == [tmp_path / f"{name}.ipynb"]
    assert "-hidden" not in (tmp_path / f"{name}.ipynb").read_text()
