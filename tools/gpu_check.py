"""The GPU check: every chapter, the GPU tests and the GPU benchmarks on one CUDA machine, as a
Colab reader runs them, written up as ``benchmarks/results/gpu/<device>.json`` and ``.md``.

Run it on a machine with a CUDA GPU whose Python already has torch and triton (as Colab's has),
from the repository's root::

    make gpu-check                      # = python3 tools/gpu_check.py run
    python3 tools/gpu_check.py run --jobs 6 --budget 480 --out benchmarks/results/gpu

It does, each step with its own share of the time budget and each output straight to a file (a
pipe that a child kernel keeps open would hang the run):

1. **chapters**: executes every chapter top to bottom, each in a fresh Jupyter kernel, ``--jobs``
   at once, with ``TRITON_INTERPRET`` unset (the kernels compile for the GPU, as in Colab);
   records each chapter's time, status, the first failing cell with its error, and the printed
   output of every cell that mentions ``cuda`` (what the chapters show of the GPU);
2. **tests**: ``tests/kernels/test_kernels_gpu.py`` and the differential tests' GPU cases (the kernels
   against a float64 oracle on shapes hypothesis draws, one configuration per shape:
   ``ATTNBOOK_AUTOTUNE=0``);
3. **benchmarks**: ``benchmarks/bench_flash.py --device cuda --quick --json`` and short runs of the
   other GPU benchmarks (:data:`BENCHMARKS`), alone on the GPU so that no timing is shared;
4. **report**: the device, the versions, the date and the commit with all of the above.

A GPU machine may have no network. The chapters need Jupyter's kernel packages (nbclient,
ipykernel and what they import), which a bare torch image lacks: on a machine with the network,
``python3 tools/gpu_check.py wheels .whl --python-version 3.12`` downloads them as wheels for that
Python; carry the folder over and put them on the path first::

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site python3 tools/gpu_check.py run

The chapters' own imports (matplotlib, seaborn, scikit-learn, networkx, tqdm, ipywidgets) must be
there too; ``run`` lists what is missing before it starts and stops if anything is.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
RESULTS = ROOT / "benchmarks" / "results" / "gpu"
#: What the chapters import beyond torch and triton, by import name.
CHAPTER_MODULES = ("nbclient", "nbformat", "ipykernel", "jupyter_client", "matplotlib",
                   "seaborn", "sklearn", "networkx", "tqdm", "ipywidgets", "numpy")  # fmt: skip
#: What a bare torch image lacks for the chapters (pip names), each wheel with its needs.
WHEELS = ("nbclient", "nbformat", "ipykernel", "ipywidgets", "jupyter_client")
#: Packages a GPU image has already, left out of the wheels (pip names, normalized).
PREINSTALLED = {
    "numpy", "torch", "triton", "matplotlib", "pillow", "packaging", "pyyaml", "psutil",
    "typing-extensions", "attrs", "six", "python-dateutil", "pygments", "setuptools",
    "filelock", "jinja2", "markupsafe", "sympy", "mpmath", "networkx", "fsspec",
}  # fmt: skip
#: The GPU benchmarks' quick runs: (name, arguments after the script, share of the
#: budget, whether it writes ``--json FILE``); the others' printed tables are kept.
BENCHMARKS = (
    ("bench_flash", ["--device", "cuda", "--quick"], 0.45, True),
    ("bench_block_sparse", ["--device", "cuda", "--min-log2-n", "11", "--max-log2-n", "13"],
     0.25, False),
    ("bench_decode", ["--device", "cuda", "--new-tokens", "128", "--repeat", "3",
                      "--plot", "/tmp/gpu-check/bench_decode.png"], 0.2, False),
    ("bench_kvcache", ["--device", "cuda"], 0.1, False),
)  # fmt: skip


# --------------------------------------------------------------------------------------
# Running one chapter (in its own process: `gpu_check.py chapter NOTEBOOK RESULT.json`)
# --------------------------------------------------------------------------------------
def run_chapter(notebook: Path, result: Path, timeout: int) -> None:
    """Execute ``notebook`` in a fresh kernel and write what happened to ``result``."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(notebook.parent)}})  # fmt: skip
    start, status, failure = time.perf_counter(), "passed", None
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError) as error:
        status = "failed"
        failure = _failure(nb, error)
    except Exception as error:  # the kernel died, or did not start
        status, failure = "failed", {"error": f"{type(error).__name__}: {error}"[:2000]}
    seconds = time.perf_counter() - start
    gpu_outputs = [
        {"cell": n, "output": _text(cell)}
        for n, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and "cuda" in cell.source and _text(cell)
    ]
    record = {"chapter": notebook.stem, "status": status, "seconds": round(seconds, 1),
              "failure": failure, "gpu_outputs": gpu_outputs}  # fmt: skip
    result.write_text(json.dumps(record, indent=1))


def _text(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            parts.append(output.get("text", ""))
        elif "data" in output and "text/plain" in output["data"]:
            parts.append(output["data"]["text/plain"])
    return "".join(parts)[-4000:]


def _failure(nb, error) -> dict:
    """The first cell with an error output: its index, its first lines, the error."""
    for n, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if output.get("output_type") == "error":
                trace = "\n".join(output.get("traceback", []))
                trace = re.sub(r"\x1b\[[0-9;]*m", "", trace)  # no terminal colours
                return {
                    "cell": n,
                    "source": cell.source[:600],
                    "error": f"{output.get('ename')}: {output.get('evalue')}"[:2000],
                    "traceback": trace[-4000:],
                }
    return {"error": str(error)[-2000:]}


# --------------------------------------------------------------------------------------
# The steps of `run`
# --------------------------------------------------------------------------------------
def environment(commit: str | None) -> dict:
    import torch

    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit or _git_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(device=props.name, capability=list(torch.cuda.get_device_capability(0)),
                    memory_gib=round(props.total_memory / 2**30, 1),
                    multiprocessors=props.multi_processor_count)  # fmt: skip
    else:
        info.update(device=None, capability=None)
    smi = shutil.which("nvidia-smi")
    if smi:
        query = [smi, "--query-gpu=driver_version", "--format=csv,noheader"]
        done = subprocess.run(query, capture_output=True, text=True, timeout=30)
        info["driver"] = done.stdout.strip() or None
    return info


def _git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def missing_modules() -> list[str]:
    import importlib.util

    return [name for name in CHAPTER_MODULES if importlib.util.find_spec(name) is None]


def _child_env(extra: dict | None = None) -> dict:
    """The environment of every child: ``TRITON_INTERPRET`` unset (Colab's), the
    repository on the path, no display."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    paths = [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update(PYTHONPATH=os.pathsep.join(paths), MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "2")  # Colab's two cores
    env.update(extra or {})
    return env


def chapters(names: list[str], jobs: int, budget: float, work: Path) -> list[dict]:
    """Every chapter in its own process and kernel, ``jobs`` at once, all within
    ``budget`` seconds."""
    work.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + budget

    def one(name: str) -> dict:
        result, log = work / f"{name}.json", work / f"{name}.log"
        left = max(30, int(deadline - time.monotonic()))
        command = [sys.executable, __file__, "chapter", str(BOOK / f"{name}.ipynb"),
                   str(result), "--timeout", str(left)]  # fmt: skip
        start = time.perf_counter()
        with open(log, "w") as out:
            try:
                subprocess.run(command, stdout=out, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, env=_child_env(),
                               timeout=left + 30, cwd=BOOK)  # fmt: skip
            except subprocess.TimeoutExpired:
                pass
        if result.exists():
            return json.loads(result.read_text())
        return {"chapter": name, "status": "failed", "seconds": round(time.perf_counter()
                - start, 1), "failure": {"error": "no result: " + log.read_text()[-1500:]},
                "gpu_outputs": []}  # fmt: skip

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(one, names))


def _junit(path: Path) -> dict:
    if not path.exists():
        return {"passed": 0, "failed": 0, "skipped": 0, "errors": 1, "failures": []}
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "failures": []}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            counts["failed" if bad.tag == "failure" else "errors"] += 1
            counts["failures"].append(f"{case.get('name')}: {bad.get('message', '')[:300]}")
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts


def _timeouts(shares: list[float], budget: float):
    """One timeout per step, each its share of what is left of ``budget`` when it starts:
    time a step leaves unused goes to the steps after it."""
    deadline = time.monotonic() + budget
    for n, share in enumerate(shares):
        left = max(0.0, deadline - time.monotonic())
        yield max(30.0, left * share / sum(shares[n:]))


def tests(budget: float, work: Path) -> dict:
    """The GPU tests and the differential tests' GPU cases, each within its share."""
    runs = {
        "test_kernels_gpu": (["tests/kernels/test_kernels_gpu.py", "-n", "8"], {}, 0.6),
        "differential_gpu": (
            ["tests/properties/test_differential.py", "-k", "test_kernel_", "-n", "8"],
            {"ATTNBOOK_AUTOTUNE": "0"},
            0.4,
        ),
    }
    results = {}
    timeouts = _timeouts([share for *_, share in runs.values()], budget)
    for (name, (args, extra, _)), timeout in zip(runs.items(), timeouts):
        xml, log = work / f"{name}.xml", work / f"{name}.log"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   f"--junitxml={xml}", *args]  # fmt: skip
        start = time.perf_counter()
        with open(log, "w") as out:
            try:
                subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                               stdin=subprocess.DEVNULL, env=_child_env(extra),
                               timeout=timeout)  # fmt: skip
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
        results[name] = {**_junit(xml), "seconds": round(time.perf_counter() - start, 1),
                         "timed_out": timed_out, "command": " ".join(command[1:])}  # fmt: skip
    return results


def benchmarks(budget: float, work: Path, only: list[str] | None = None) -> dict:
    """Each GPU benchmark's quick mode alone on the GPU (those named in ``only``, if
    given): its printed table, and its JSON where it writes one."""
    results = {}
    chosen = [b for b in BENCHMARKS if only is None or b[0] in only]
    timeouts = _timeouts([share for _, _, share, _ in chosen], budget)
    for (name, args, _, writes_json), timeout in zip(chosen, timeouts):
        data, log = work / f"{name}.json", work / f"{name}.log"
        command = [sys.executable, f"benchmarks/{name}.py", *args]
        command += ["--json", str(data)] if writes_json else []
        start = time.perf_counter()
        with open(log, "w") as out:
            try:
                done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT,
                                      cwd=ROOT, stdin=subprocess.DEVNULL,
                                      env=_child_env(), timeout=timeout)
                status = "passed" if done.returncode == 0 else f"exit {done.returncode}"
            except subprocess.TimeoutExpired:
                status = "timed out"
        text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text())
        results[name] = {
            "command": " ".join(command[1:-2] if writes_json else command[1:]),
            "status": status,
            "seconds": round(time.perf_counter() - start, 1),
            "output": "\n".join(line for line in text.splitlines()
                                if "it/s]" not in line and "s/it]" not in line)[-6000:],
            "data": json.loads(data.read_text()) if data.exists() else None,
        }  # fmt: skip
    return results


def slug(device: str | None) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"nvidia-h100-80gb-hbm3"``."""
    return re.sub(r"[^a-z0-9]+", "-", (device or "no-gpu").lower()).strip("-")


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        f"# GPU check: {env.get('device')}",
        "",
        f"{env['date']}, commit `{(env.get('commit') or 'unknown')[:12]}`: Python "
        f"{env['python']}, torch {env['torch']} (CUDA {env.get('cuda')}), Triton "
        f"{env.get('triton')}, driver {env.get('driver')}, compute capability "
        f"{'.'.join(map(str, env.get('capability') or []))}.",
        f"Written by `tools/gpu_check.py run` in {report['seconds']:.0f} s.",
    ]
    for again in report.get("reruns", []):
        steps = ", ".join(again["chapters"] + again["tests"] + again["benchmarks"])
        lines.append(f"Re-run at commit `{(again['commit'] or 'unknown')[:12]}` "
                     f"({again['date']}, {again['seconds']:.0f} s): {steps}.")
    lines += [
        "",
        "## Chapters",
        "",
        "| chapter | status | seconds | first error |",
        "|---|---|---:|---|",
    ]
    for c in report["chapters"]:
        error = (c.get("failure") or {}).get("error", "")
        cell = (c.get("failure") or {}).get("cell")
        where = f"cell {cell}: " if cell is not None else ""
        error = (where + error).replace("|", "\\|").replace("\n", " ")[:160]
        again = f" (re-run at `{c['rerun']['commit'][:12]}`)" if c.get("rerun") else ""
        lines.append(f"| {c['chapter']}{again} | {c['status']} | {c['seconds']:.1f} | {error} |")
    lines += ["", "## Tests", "", "| run | passed | failed | errors | skipped | seconds |",
              "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for name, t in report["tests"].items():
        lines.append(f"| {name} | {t['passed']} | {t['failed']} | {t['errors']} | "
                     f"{t['skipped']} | {t['seconds']:.0f}{' (timed out)' if t['timed_out'] else ''} |")  # fmt: skip
        lines += [f"- {f}" for f in t["failures"][:10]]
    lines += ["", "## Benchmarks"]
    for name, b in report["benchmarks"].items():
        again = f" (re-run at `{b['rerun']['commit'][:12]}`)" if b.get("rerun") else ""
        lines += ["", f"### {name}: {b['status']}, {b['seconds']:.0f} s{again}", "",
                  f"`python {b['command']}`", "", "```", b["output"].strip(), "```"]  # fmt: skip
    return "\n".join(lines) + "\n"


def merge(old: dict, new: dict) -> dict:
    """``old`` with what ``new`` re-ran put in place of its entries (chapters by name,
    test runs and benchmarks by key), each re-run entry marked with the commit and date it
    ran on, and the re-run listed under ``"reruns"``."""
    env = new["environment"]
    stamp = {"commit": env.get("commit"), "date": env["date"]}
    merged = json.loads(json.dumps(old))
    for c in new["chapters"]:
        merged["chapters"] = [x for x in merged["chapters"] if x["chapter"] != c["chapter"]]
        merged["chapters"].append({**c, "rerun": stamp})
    merged["chapters"].sort(key=lambda c: c["chapter"])
    for part in ("tests", "benchmarks"):
        for key, value in new[part].items():
            merged[part][key] = {**value, "rerun": stamp}
    merged.setdefault("reruns", []).append({
        **stamp, "seconds": new["seconds"], "chapters": [c["chapter"] for c in new["chapters"]],
        "tests": list(new["tests"]), "benchmarks": list(new["benchmarks"]),
    })  # fmt: skip
    return merged


def run(args: argparse.Namespace) -> int:
    missing = missing_modules()
    if missing:
        print("Missing modules (see this file's docstring: carry wheels): " + ", ".join(missing))
        return 2
    start = time.perf_counter()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    names = args.chapters.split(",") if args.chapters else sorted(
        p.stem for p in BOOK.glob("*.ipynb"))  # fmt: skip
    env = environment(args.commit)
    print(f"GPU check on {env.get('device')}: {len(names)} chapters, {args.jobs} at once",
          flush=True)
    report = {"environment": env}
    deadline = time.monotonic() + args.budget  # a step's unused time goes to the next

    def left() -> float:
        return max(30.0, deadline - time.monotonic())

    report["chapters"] = chapters(names, args.jobs, 0.45 * args.budget, work / "chapters")
    print("chapters:", sum(c["status"] == "passed" for c in report["chapters"]), "of",
          len(names), "passed", flush=True)  # fmt: skip
    report["tests"] = {} if args.skip_tests else tests(0.5 * left(), work)
    print("tests:", {k: (v["passed"], v["failed"]) for k, v in report["tests"].items()},
          flush=True)  # fmt: skip
    only = args.benchmarks.split(",") if args.benchmarks else None
    report["benchmarks"] = {} if args.skip_benchmarks else benchmarks(left(), work, only)
    report["seconds"] = round(time.perf_counter() - start, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = slug(env.get("device"))
    if args.merge and (out / f"{name}.json").exists():
        report = merge(json.loads((out / f"{name}.json").read_text()), report)
    (out / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / f"{name}.md").write_text(markdown(report))
    print(f"report: {out / name}.json and .md ({report['seconds']:.0f} s)")
    failed = [c["chapter"] for c in report["chapters"] if c["status"] != "passed"]
    failed += [k for k, v in report["tests"].items() if v["failed"] or v["errors"]]
    failed += [k for k, v in report["benchmarks"].items() if v["status"] != "passed"]
    print("all passed" if not failed else "not passed: " + ", ".join(failed))
    return 1 if failed else 0


def wheels(args: argparse.Namespace) -> int:
    """Download the chapters' Jupyter packages as wheels for the GPU machine's Python,
    their needs included, less what a GPU image has (:data:`PREINSTALLED`)."""
    target = Path(args.dir)
    target.mkdir(parents=True, exist_ok=True)
    platforms = [f"--platform=manylinux_2_{n}_x86_64" for n in (17, 27, 28)]
    command = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
               f"--python-version={args.python_version}", "--implementation=cp",
               *platforms, "--platform=manylinux2014_x86_64", "-d", str(target),
               *WHEELS]  # fmt: skip
    subprocess.run(command, check=True)
    for wheel in target.glob("*.whl"):
        project = wheel.name.split("-")[0].lower().replace("_", "-")
        if project in PREINSTALLED:
            wheel.unlink()
    kept = sorted(w.name for w in target.glob("*.whl"))
    size = sum(w.stat().st_size for w in target.glob("*.whl")) / 2**20
    print(f"{len(kept)} wheels, {size:.1f} MiB, in {target}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("run", help="the whole check, and the report")
    p.add_argument("--out", default=str(RESULTS), help="where the report goes")
    p.add_argument("--work", default="/tmp/gpu-check", help="logs and partial results")
    p.add_argument("--jobs", type=int, default=4, help="chapters at once")
    p.add_argument("--budget", type=float, default=460, help="seconds for the whole check")
    p.add_argument("--chapters", default=None, help="comma-separated (default: all)")
    p.add_argument("--commit", default=None, help="the commit checked (default: git's)")
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--skip-benchmarks", action="store_true")
    p.add_argument("--benchmarks", default=None, help="comma-separated (default: all)")
    p.add_argument("--merge", action="store_true",
                   help="re-run some steps: update the existing report's entries")
    p = commands.add_parser("chapter", help="(internal) execute one chapter")
    p.add_argument("notebook", type=Path)
    p.add_argument("result", type=Path)
    p.add_argument("--timeout", type=int, default=300)
    p = commands.add_parser("wheels", help="download the Jupyter packages as wheels")
    p.add_argument("dir", nargs="?", default=".whl")
    p.add_argument("--python-version", default="3.12")
    args = parser.parse_args(argv)
    if args.command == "chapter":
        run_chapter(args.notebook, args.result, args.timeout)
        return 0
    return run(args) if args.command == "run" else wheels(args)


if __name__ == "__main__":
    sys.exit(main())
