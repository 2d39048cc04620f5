"""The committed GPU report (benchmarks/results/gpu/, written by tools/gpu_check.py on a GPU) and what
the book shows of it: attnbook.utils.gpu_report reads it, and the numbers the prose quotes (the
FlashAttention chapter, the tiers page) are the ones in the file."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from attnbook.utils import gpu_report

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "gpu"
REPORTS = sorted(RESULTS.glob("*.json"))


def test_the_report_is_found_and_has_what_the_chapters_show(monkeypatch, tmp_path):
    assert REPORTS, "no committed GPU report"
    report = gpu_report()
    assert report == max((json.loads(p.read_text()) for p in REPORTS),
                         key=lambda r: r["environment"]["date"])  # fmt: skip
    for key in ("device", "torch", "triton", "date", "commit", "python", "capability"):
        assert report["environment"][key]
    # every chapter the book had at the report's commit (a chapter added since, such as
    # inside_attention, split from attention after the H200 run, waits for the next GPU run)
    listed = subprocess.run(["git", "ls-tree", "--name-only", report["environment"]["commit"], "book/"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    then = {Path(name).stem for name in listed if name.endswith(".ipynb")}
    assert {c["chapter"] for c in report["chapters"]} == then
    assert then <= {p.stem for p in (ROOT / "book").glob("*.ipynb")}, "a chapter was removed: rerun the GPU check"
    assert gpu_report(REPORTS[0].stem) is not None
    monkeypatch.chdir(tmp_path)  # found beside the package's source too
    assert gpu_report(folder=RESULTS) == gpu_report()
    assert gpu_report(folder=tmp_path) is None  # an installed package without the repository
    (tmp_path / "x.md").write_text("not a report")
    assert gpu_report(folder=tmp_path) is None


def _numbers(text: str) -> list[str]:
    return re.findall(r"\d+(?:\.\d+)?", text)


def test_the_flash_chapter_quotes_the_reports_numbers():
    """Every number in the chapter's paragraph on the GPU report is one the file gives:
    the geometric means of Triton's speed over SDPA's and FlexAttention's, the lowest points,
    the device and versions."""
    nb = json.loads((ROOT / "book" / "flash.ipynb").read_text())
    prose = next("".join(c["source"]) for c in nb["cells"] if c.get("id") == "flash-gpu-report")
    report = gpu_report()
    data = report["benchmarks"]["bench_flash"]["data"]
    allowed = set()
    for name, entry in data["summary"].items():
        for s in entry.values():
            allowed |= {f"{s['geomean']:.2f}", f"{s['min']:.2f}"}
    for row in data["rows"]:
        allowed |= {f"{row['speed_vs_sdpa']:.2f}", f"{row['speed_vs_flex']:.2f}", str(row["n"]),
                    f"{row['tflops']['triton']:.0f}", f"{row['tflops']['sdpa']:.0f}"}  # fmt: skip
    env = report["environment"]
    allowed |= set(_numbers(env["device"])) | set(_numbers(env["torch"])) | set(_numbers(env["triton"]))
    allowed |= {"16", "64", "1", "2", "3"}  # the setting: heads, head dim, batch; -2, -3
    quoted = set(_numbers(re.sub(r"\{[^}]*\}`[^`]*`", "", prose)))
    assert quoted and quoted <= allowed, f"numbers not in the report: {sorted(quoted - allowed)}"
    assert f"{data['summary']['fwd']['speed_vs_sdpa']['geomean']:.2f}" in prose


def test_the_tiers_page_shows_the_measured_chapter_times():
    page = (ROOT / "book" / "gpu_tiers.md").read_text()
    report = gpu_report()
    table = page.split("<!-- gpu-report: chapter times -->")[1].split("<!-- end -->")[0]
    rows = dict(re.findall(r"^\| \{doc\}`(\w+)` \| ([^|]+) \|", table, re.M))
    assert rows, "no chapter rows on the tiers page"
    for c in report["chapters"]:
        shown = rows[c["chapter"]].strip()
        expected = f"{c['seconds']:.0f} s" if c["status"] == "passed" else "failed"
        assert shown.startswith(expected), (c["chapter"], shown, expected)
    env = report["environment"]
    assert env["device"] in table and env["torch"] in table and env["triton"] in table


def test_the_kv_cache_chapter_quotes_the_reports_numbers():
    """The decode kernel's and generation's GPU numbers in the KV-cache chapter are the
    ones the report's bench_kvcache and bench_decode printed."""
    nb = json.loads((ROOT / "book" / "kv_cache.ipynb").read_text())
    prose = next("".join(c["source"]) for c in nb["cells"] if c.get("id") == "kvcache-gpu-report")
    report = gpu_report()
    printed = report["benchmarks"]["bench_kvcache"]["output"] + report["benchmarks"]["bench_decode"]["output"]
    device = set(_numbers(report["environment"]["device"]))
    quoted = [n for n in _numbers(re.sub(r"\{[^}]*\}`[^`]*`", "", prose)) if n not in device]
    assert quoted and all(n in printed for n in quoted), [n for n in quoted if n not in printed]
    for ratio in ("0.21", "0.04", "0.51", "0.11"):
        assert ratio in prose


def test_the_instructor_guide_shows_the_measured_gpu_times():
    guide = (ROOT / "book" / "course.md").read_text()
    rows = dict(re.findall(r"^\| \{doc\}`(\w+)` \|.*\| ([^|]+) \|$", guide.split("## Chapter by chapter")[0], re.M))
    report = gpu_report()
    assert report["environment"]["device"].split()[-1] + " run time" in guide
    for c in report["chapters"]:
        expected = f"{c['seconds']:.0f} s" if c["status"] == "passed" else "failed"
        assert rows[c["chapter"]].strip().startswith(expected), (c["chapter"], rows[c["chapter"]])
