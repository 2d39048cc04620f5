"""The grader: every verdict is computed where the submission cannot reach it.

``python -m attnbook.course grade SUBMISSIONS --book book`` grades each submitted
chapter in four steps:

1. **Rebuild.** The notebook that runs is the book's chapter with its solutions stubbed
   out (:func:`attnbook.course.strip_solutions`), in which only the *answer cells* (the
   cells tagged ``solution``) come from the submission, matched by cell id, then by
   their first line. Check cells, setup cells and imports are the book's, whatever the
   submission did to them; edited, deleted, moved or extra cells are reported and
   ignored.
2. **Run.** A fresh kernel runs it under :class:`~attnbook.sandbox.Limits` (time per
   cell and per notebook, memory, processes, output), in an empty folder, with a clean
   environment.
3. **Check from outside.** A check cell is not run in the kernel. The grader evaluates
   the check (``attnbook.exercises.CHECKS``) in its own process on a stand-in for
   the student's answer (:class:`RemoteFunction`): each call sends the inputs, drawn
   from a fresh secret seed (``attnbook.exercises.common.fresh_inputs``), to the
   kernel, runs the student's function there, and brings back only the result, which
   is decoded as plain data (tensors, numbers, strings, lists; no code) and compared
   with the reference in the grader. Nothing the submission prints, writes or patches
   in its kernel decides a verdict.
4. **Report.** One row per check, a Markdown feedback file per student, and a
   gradebook CSV with points per chapter.

What this defends against, and what it cannot, is written out in the instructor guide
(``book/course.md``, *The trust model*).
"""

from __future__ import annotations

import ast
import base64
import contextlib
import csv
import io
import os
import queue
import re
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import sandbox

__all__ = [
    "CSV_FIELDS",
    "Chapter",
    "Step",
    "KernelSession",
    "CellRun",
    "KernelGone",
    "CallTimeout",
    "Untrusted",
    "RemoteFunction",
    "isolation_for",
    "summary",
    "load_chapters",
    "rebuild",
    "grade_notebook",
    "grade",
    "write_feedback",
    "write_gradebook",
    "chapter_points",
]

CSV_FIELDS = [
    "student",
    "notebook",
    "label",
    "passed",
    "status",
    "message",
    "isolation",
]
ISOLATIONS = ("auto", "bwrap", "none")
NOT_RUN = "check did not run"
NOTEBOOK = "*"  # the label of a row about the whole notebook
# A check call in a code cell: check("label", ...) or attnbook.exercises.check('label',
# ...).
CHECK_CALL = re.compile(r"""\bcheck\(\s*(["'])([^"'\n]+)\1""")
# Answer cells that reach for the grading machinery: the grader reports them as
# tampering and scores the notebook 0 for the instructor to review by hand.
_MACHINERY = re.compile(
    r"ATTNBOOK_GRADE_LOG|__attnbook|\bCHECKS\b|attnbook\s*\.\s*exercises"
    r"|from\s+attnbook(\.\w+)*\s+import[^\n]*\bexercises\b"
    r"|\bexercises\s*\.\s*(check|register|common)\b"
    # the kernel lab's launchers and recorder: an answer could swap in PyTorch
    r"|attnbook\s*\.\s*kernels\s*\.\s*lab|\blab\s*\.\s*\w+\s*=(?!=)"
    r"|from\s+attnbook\.kernels(\.\w+)*\s+import[^\n]*\blab\b"
)
MAX_REPLY = 64 * 2**20  # bytes of one encoded answer


def _require(module: str):
    """Import one of the ``course`` extra's packages, or say how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:  # pragma: no cover - the test environment has the extra
        raise ImportError(
            f"the course kit needs {module}; install the course extra: pip install "
            "'attnbook[course]'"
        ) from err


# --------------------------------------------------------------------------------------
# 1. Rebuild: the book's cells, the student's answers
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Step:
    """One step of a graded run: ``code`` to execute, or a ``check`` of ``label`` on
    the object the expression ``code`` names in the kernel."""

    kind: str  # "code", "answer" or "check"
    code: str
    label: str = ""  # the check's label (for answers: the label they answer)
    cell: str = ""  # the book's cell id


@dataclass
class Chapter:
    """A chapter as the grader uses it: its name, its steps with the solutions stubbed
    out, its check labels in order, and their points."""

    name: str
    steps: list[Step]
    labels: list[str]
    points: dict[str, float]
    sources: dict[
        str, str
    ]  # cell id -> source, for the code cells that are not answers

    @classmethod
    def from_notebook(cls, nb, name: str) -> Chapter:
        from .course import strip_solutions

        template = strip_solutions(nb, name=name)
        steps, pending = [], []
        for cell in template.cells:
            if cell.cell_type != "code":
                continue
            calls = list(CHECK_CALL.finditer(cell.source))
            if "solution" in cell.metadata.get("tags", []):
                pending.append(len(steps))
                steps.append(Step("answer", cell.source, cell=cell.get("id", "")))
            elif calls:
                label, expr = _check_call(cell.source, f"{name}, cell {cell.get('id')}")
                steps.append(Step("check", expr, label, cell.get("id", "")))
                for index in pending:  # the answers above it answer this check
                    steps[index] = Step(
                        "answer", steps[index].code, label, steps[index].cell
                    )
                pending = []
            else:
                steps.append(Step("code", cell.source, cell=cell.get("id", "")))
        labels = list(dict.fromkeys(s.label for s in steps if s.kind == "check"))
        sources = {
            c.get("id"): c.source
            for c in template.cells
            if c.cell_type == "code" and "solution" not in c.metadata.get("tags", [])
        }
        sources.pop(None, None)
        return cls(name, steps, labels, chapter_points(nb, labels), sources)


def _check_call(source: str, where: str) -> tuple[str, str]:
    """``(label, answer expression)`` of a check cell that is one ``check(...)``
    call."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise ValueError(f"{where}: the check cell does not parse: {err}") from None
    body = tree.body
    call = body[0].value if len(body) == 1 and isinstance(body[0], ast.Expr) else None
    if (
        not isinstance(call, ast.Call)
        or len(call.args) != 2
        or not isinstance(call.args[0], ast.Constant)
    ):
        raise ValueError(
            f"{where}: a check cell must be one check('label', answer) call"
        )
    return call.args[0].value, ast.unparse(call.args[1])


def chapter_points(nb, labels: list[str]) -> dict[str, float]:
    """Points per check label: the chapter's ``metadata.attnbook.points`` (``{label:
    points}``), 1 for a label it does not list. The metadata also gives the points of
    the written exercises, which are graded by hand (nbgrader's and otter's exports
    read them); any other label in it is a typo and raises ``ValueError``."""
    from .course import written_exercises

    given = nb.metadata.get("attnbook", {}).get("points", {})
    unknown = sorted(set(given) - set(labels) - set(written_exercises(nb)))
    if unknown:
        raise ValueError(
            "metadata.attnbook.points names labels that are neither checked nor "
            f"written exercises: {unknown}"
        )
    return {label: float(given.get(label, 1)) for label in labels}


def _first_line(source: str) -> str:
    return next((line.strip() for line in source.splitlines() if line.strip()), "")


def rebuild(chapter: Chapter, submission) -> tuple[list[Step], list[str], list[str]]:
    """The steps to run for ``submission`` (an nbformat notebook) of ``chapter``.

    Returns ``(steps, notes, tampering)``: the chapter's steps with each answer cell's
    code taken from the submission (by cell id, else the unused submitted cell with the
    same first line, e.g. ``def my_softmax(...)``; a missing answer keeps the stub),
    notes on what was ignored or not found, and the reasons to distrust the answers
    (an answer cell that reaches for the grading machinery).
    """
    cells = [c for c in submission.cells if c.cell_type == "code"]
    by_id = {c.get("id"): c for c in cells if c.get("id")}
    used: set[int] = set()
    steps, notes, tampering, missing = [], [], [], []
    for step in chapter.steps:
        if step.kind != "answer":
            steps.append(step)
            continue
        found = by_id.get(step.cell)
        if found is None or id(found) in used:
            first = _first_line(step.code)
            found = next(
                (
                    c
                    for c in cells
                    if id(c) not in used and _first_line(c.source) == first
                ),
                None,
            )
        if found is None:
            missing.append(step.label)
            steps.append(step)
            continue
        used.add(id(found))
        steps.append(Step("answer", found.source, step.label, step.cell))
        match = _MACHINERY.search(found.source)
        if match:
            tampering.append(
                f"the answer cell for {step.label} uses the grading machinery "
                f"({match[0]!r})"
            )
    if missing:
        notes.append(
            f"no answer cell found for {', '.join(missing)} (matched by cell id and by "
            "first line): graded as not attempted"
        )
    present = {c.get("id") for c in cells} - {None}
    book = chapter.sources
    expected = set(book) | {s.cell for s in chapter.steps if s.kind == "answer"}
    if expected and len(expected & present) < len(expected) / 2:
        notes.append(
            f"this notebook does not look like {chapter.name}: only "
            f"{len(expected & present)} of its {len(expected)} code cells are in it"
        )
    edited = sum(
        1
        for c in cells
        if c.get("id") in book and c.source.strip() != book[c.get("id")].strip()
    )
    deleted = len(set(book) - present)
    added = sum(1 for c in cells if id(c) not in used and c.get("id") not in book)
    if edited or deleted or added:
        notes.append(
            f"cells outside your answers differ from the book's (edited {edited}, "
            f"deleted {deleted}, added {added}): the book's cells ran instead; only "
            "your answer cells count"
        )
    return steps, notes, tampering


# --------------------------------------------------------------------------------------
# 2. Run: a kernel under limits, spoken to over the Jupyter protocol
# --------------------------------------------------------------------------------------
class KernelGone(BaseException):  # noqa: N818 - a condition, not an error of the check
    """The kernel died or was stopped: nothing after this can run."""


class CallTimeout(BaseException):  # noqa: N818
    """A call into the student's code ran past the time limit (the kernel was
    interrupted and lives on)."""


class Untrusted(BaseException):  # noqa: N818
    """The kernel's reply is not a plain answer: the check cannot be trusted."""


@dataclass
class CellRun:
    error: str | None = None  # "NameError: name 'f' is not defined"
    reply: dict = field(default_factory=dict)


def _kernel_env(home: Path) -> dict[str, str]:
    """A clean environment for the kernel: no secrets of the grader's, a private home,
    and this attnbook on the path when it is not pip-installed."""
    keep = ("PATH", "LANG", "LC_ALL", "OMP_NUM_THREADS", "TRITON_INTERPRET", "TZ")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(
        HOME=str(home),
        IPYTHONDIR=str(home / ".ipython"),
        MPLBACKEND="Agg",
        MPLCONFIGDIR=str(home / ".matplotlib"),
        JUPYTER_PLATFORM_DIRS="1",
        PYDEVD_DISABLE_FILE_VALIDATION="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    root = str(Path(__file__).resolve().parent.parent)
    installed = {
        str(Path(p).resolve())
        for p in [*site.getsitepackages(), site.getusersitepackages()]
    }
    if root not in installed:
        env["PYTHONPATH"] = root
    return env


class KernelSession:
    """A ``python3`` kernel for one submission, started under ``limits`` in a private
    temporary folder, killed with everything it started when the session ends.

    ``run(code)`` executes a cell; ``call(expr, path, args, kwargs)`` calls the object
    the expression ``expr`` names (``path`` indexes into it) and returns the decoded
    result. The kernel is spoken to over IPC sockets in the private folder. With
    ``isolation="bwrap"`` it runs in the sandbox
    (:func:`attnbook.sandbox.sandbox_arguments`).
    """

    def __init__(
        self,
        limits: sandbox.Limits,
        guard: sandbox.ProcessGuard,
        isolation: str = "none",
    ):
        if isolation not in ("bwrap", "none"):
            raise ValueError(f"isolation must be 'bwrap' or 'none', got {isolation!r}")
        self.limits, self.guard, self.isolation = limits, guard, isolation
        self.output = 0  # bytes of output the kernel sent so far
        self.deadline = time.monotonic() + limits.notebook_timeout
        self._folder = tempfile.TemporaryDirectory(prefix="attnbook-kernel-")
        self.folder = Path(self._folder.name)
        self.proc: subprocess.Popen | None = None
        self.client, self._monitors = None, []

    # ---- life cycle ------------------------------------------------------------------
    def start(self) -> None:
        jupyter_client = _require("jupyter_client")
        zmq = _require("zmq")
        work, home = self.folder / "work", self.folder / "home"
        work.mkdir()
        home.mkdir()
        connection = self.folder / "kernel.json"
        transport = "ipc" if os.name == "posix" else "tcp"
        jupyter_client.connect.write_connection_file(
            str(connection),
            transport=transport,
            ip=str(self.folder / "ipc") if transport == "ipc" else "127.0.0.1",
        )
        kernel = [sys.executable, "-m", "ipykernel_launcher", "-f", str(connection)]
        wrapper = (
            sandbox.sandbox_arguments(self.folder, work)
            if self.isolation == "bwrap"
            else []
        )
        self._log = (self.folder / "kernel.log").open("wb")
        self.proc = subprocess.Popen(
            sandbox.launcher_command(self.limits, self.guard, kernel, wrapper),
            cwd=work,
            env=_kernel_env(home),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        context = zmq.Context()
        context.setsockopt(zmq.MAXMSGSIZE, self.limits.output)
        self.client = jupyter_client.BlockingKernelClient(context=context)
        self.client.load_connection_file(str(connection))
        self.client.start_channels()
        # a message over MAXMSGSIZE disconnects the kernel's channel: watch for that
        self._monitors = [
            channel.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            for channel in (self.client.iopub_channel, self.client.shell_channel)
        ]
        ready_by = time.monotonic() + 120
        while True:
            self._alive()
            try:
                self.client.wait_for_ready(timeout=2)
                return
            except RuntimeError:
                if time.monotonic() > ready_by:
                    raise KernelGone("the kernel did not start in 120 s") from None

    def close(self) -> None:
        for monitor in self._monitors:
            with contextlib.suppress(Exception):
                monitor.close(linger=0)
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.stop_channels()
            with contextlib.suppress(Exception):
                self.client.context.destroy(linger=0)
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.guard.kill_all()
            with contextlib.suppress(Exception):
                self.proc.kill()
                self.proc.wait(timeout=10)
            self._log.close()
        self._folder.cleanup()

    def __enter__(self) -> KernelSession:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _alive(self) -> None:
        code = self.proc.poll()
        if code is not None and self.isolation == "bwrap" and 128 < code <= 192:
            code = 128 - code  # bwrap reports a signal as 128 + signal
        if code is not None:
            why = {
                -signal.SIGKILL: " (killed: out of memory or processes?)",
                -signal.SIGSEGV: " (segmentation fault)",
            }.get(code, "")
            raise KernelGone(f"the kernel died, exit code {code}{why}")

    def kill(self, why: str) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.guard.kill_all()
        raise KernelGone(why)

    # ---- executing -------------------------------------------------------------------
    def run(self, code: str, user_expressions: dict | None = None) -> CellRun:
        """Execute ``code``; raises :class:`attnbook.grader.CallTimeout` (the cell was
        interrupted, the kernel lives on) or :class:`attnbook.grader.KernelGone`."""
        timeout = min(self.limits.cell_timeout, self.deadline - time.monotonic())
        if timeout <= 0:
            self.kill(
                f"the notebook ran out of its time limit "
                f"({self.limits.notebook_timeout:g} s)"
            )
        msg_id = self.client.execute(
            code,
            store_history=False,
            allow_stdin=False,
            stop_on_error=False,
            user_expressions=user_expressions or {},
        )
        result = CellRun()
        if not self._drain(msg_id, time.monotonic() + timeout, result):
            self._interrupt(msg_id)
            raise CallTimeout(f"ran longer than {timeout:g} s")
        result.reply = self._reply(msg_id)
        return result

    def _drain(self, msg_id: str, until: float, result: CellRun) -> bool:
        """Read the kernel's output until the cell is done (True) or ``until`` (False),
        counting its bytes against the output limit."""
        while True:
            self._alive()
            left = until - time.monotonic()
            if left <= 0:
                return False
            if any(monitor.poll(0) for monitor in self._monitors):
                self.kill(
                    "the notebook sent more than "
                    f"{self.limits.output // 2**20} MB of output at once"
                )
            try:
                msg = self.client.get_iopub_msg(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            content = msg.get("content", {})
            self.output += sum(len(str(v)) for v in content.values())
            if self.output > self.limits.output:
                self.kill(
                    f"the notebook printed more than {self.limits.output // 2**20} MB "
                    "of output"
                )
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "error" and result.error is None:
                value = str(content.get("evalue", "")).strip().splitlines()
                name = str(content.get("ename", "Error"))
                result.error = f"{name}: {value[0] if value else ''}".rstrip(": ")[:300]
            if msg["msg_type"] == "status" and content.get("execution_state") == "idle":
                return True

    def _reply(self, msg_id: str) -> dict:
        until = time.monotonic() + 10
        while time.monotonic() < until:
            self._alive()
            if any(monitor.poll(0) for monitor in self._monitors):
                self.kill(
                    "the notebook sent more than "
                    f"{self.limits.output // 2**20} MB of output at once"
                )
            try:
                msg = self.client.get_shell_msg(timeout=0.5)
            except queue.Empty:
                continue
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                return msg.get("content", {})
        self.kill("the kernel did not answer")
        return {}  # pragma: no cover - kill raises

    def _interrupt(self, msg_id: str) -> None:
        """Interrupt the running cell; kill the kernel if it does not stop in 10 s."""
        # over the control channel: the kernel may be in a sandbox of its own
        request = self.client.session.msg("interrupt_request", {})
        self.client.control_channel.send(request)
        if not self._drain(msg_id, time.monotonic() + 10, CellRun()):
            self.kill("a cell ran past its time limit and ignored the interrupt")
        self._reply(msg_id)

    # ---- calling the student's code from the grader ----------------------------------
    def call(self, expr: str, path: tuple, args=None, kwargs=None, measure=False):
        """Evaluate ``expr`` in the kernel, index it with ``path``, and (with ``args``)
        call it; return the decoded result. ``args is None`` describes the object
        instead: callables come back as :class:`RemoteFunction`."""
        import pickle

        payload = None
        if args is not None:
            payload = base64.b64encode(pickle.dumps((args, kwargs or {}))).decode()
        limit = min(MAX_REPLY, self.limits.output // 2)
        code = _KERNEL_SIDE + (
            f"\n__attnbook_reply__ = __attnbook_answer__({expr!r}, {path!r}, "
            f"{payload!r}, {measure!r}, {limit})\ndel __attnbook_answer__"
        )
        run = self.run(code, {"reply": "__attnbook_reply__"})
        if run.error is not None:
            raise Untrusted(f"the call into your answer was disrupted: {run.error}")
        reply = run.reply.get("user_expressions", {}).get("reply", {})
        text = (
            reply.get("data", {}).get("text/plain") if isinstance(reply, dict) else None
        )
        if not isinstance(text, str) or len(text) > 2 * MAX_REPLY:
            raise Untrusted("the kernel sent no readable reply")
        try:
            encoded = ast.literal_eval(text)
            value = _decode(base64.b64decode(encoded, validate=True))
        except Untrusted:
            raise
        except Exception as err:
            raise Untrusted(
                f"the kernel's reply is not a plain answer ({type(err).__name__})"
            ) from None
        return _materialize(value, self, expr)


# The code the grader sends into the kernel for each call: it evaluates the answer,
# calls it on the grader's inputs, and encodes the result as plain data (exact built-in
# types, dense tensors, NumPy arrays, stand-ins for anything else).
_KERNEL_SIDE = r"""
def __attnbook_answer__(expr, path, payload, measure, limit):
    import base64, io, pickle
    import torch
    ns = globals()

    def encode(x, where):
        if type(x) in (type(None), bool, int, float, complex, str, bytes):
            return x
        if isinstance(x, torch.Tensor):
            if x.layout != torch.strided or x.is_meta:
                return {"__opaque__": "sparse or meta Tensor", "repr": ""}
            return x.detach().as_subclass(torch.Tensor).cpu().clone()
        if type(x) in (list, tuple):
            return type(x)(encode(v, (*where, i)) for i, v in enumerate(x))
        if type(x) is dict and all(type(k) in (str, int) for k in x):
            return {k: encode(v, (*where, k)) for k, v in x.items()}
        module = type(x).__module__
        if module == "numpy" and hasattr(x, "dtype") and x.dtype.kind in "biufc":
            array = type(x).__name__ == "ndarray"
            kind = "__numpy__" if array else "__numpy_scalar__"
            import numpy
            return {kind: x.dtype.str, "shape": list(numpy.shape(x)),
                    "data": numpy.ascontiguousarray(x).tobytes()}
        if payload is None and callable(x):
            return {"__callable__": list(where)}
        try:
            text = repr(x)[:200]
        except Exception:
            text = ""
        return {"__opaque__": type(x).__name__, "repr": text}

    try:
        obj = eval(expr, ns)
        for key in path:
            obj = obj[key]
        if payload is None:
            result = encode(obj, ())
        else:
            args, kwargs = pickle.loads(base64.b64decode(payload))
            if measure:
                from attnbook.utils import largest_new_tensor
                result = encode(largest_new_tensor(obj, *args, **kwargs), ())
            else:
                result = encode(obj(*args, **kwargs), ())
        reply = {"ok": result}
    except BaseException as err:
        if isinstance(err, KeyboardInterrupt):
            raise
        reply = {"raised": type(err).__name__, "message": str(err)[:2000]}
    buffer = io.BytesIO()
    torch.save(reply, buffer)
    if 4 * buffer.tell() // 3 > limit:
        size = buffer.tell() / 2**20
        buffer = io.BytesIO()
        message = (f"your answer is {size:.0f} MB of data; the grader takes at most "
                   f"{limit / 2**20:.0f} MB")
        torch.save({"raised": "ValueError", "message": message}, buffer)
    return base64.b64encode(buffer.getvalue()).decode()
"""


def _decode(data: bytes):
    """The kernel's reply as plain data: only tensors, built-in scalars, strings and
    containers load (``weights_only``), and every node is checked."""
    import torch

    if len(data) > MAX_REPLY:
        raise Untrusted(f"the answer is larger than {MAX_REPLY // 2**20} MB")
    with warnings.catch_warnings():  # the pickle protocol the kernel used
        warnings.simplefilter("ignore", UserWarning)
        reply = torch.load(io.BytesIO(data), weights_only=True)
    if not isinstance(reply, dict) or not ({"ok"} == set(reply) or "raised" in reply):
        raise Untrusted("the kernel's reply has the wrong form")
    return reply


def _plain(x, depth: int = 0):
    """Check and rebuild a decoded value from the allowed kinds only."""
    import numpy
    import torch

    if depth > 50:
        raise Untrusted("the answer is nested too deeply")
    if type(x) in (type(None), bool, int, float, complex, str, bytes):
        return x
    if isinstance(x, torch.Tensor):
        return x.detach().as_subclass(torch.Tensor)
    if type(x) in (list, tuple):
        return type(x)(_plain(v, depth + 1) for v in x)
    if isinstance(x, dict):
        if "__opaque__" in x:
            name = re.sub(r"\W", "_", str(x["__opaque__"]))[:60] or "object"
            text = str(x.get("repr", ""))[:200]
            return type(name, (), {"__repr__": lambda self: text})()
        for kind in ("__numpy__", "__numpy_scalar__"):
            if kind in x:
                dtype = numpy.dtype(str(x[kind]))
                if dtype.kind not in "biufc":
                    raise Untrusted(
                        f"a NumPy answer of dtype {dtype} is not plain data"
                    )
                shape = tuple(int(n) for n in x["shape"])
                array = numpy.frombuffer(x["data"], dtype=dtype).reshape(shape).copy()
                return array if kind == "__numpy__" else array[()]
        if "__callable__" in x:
            return x  # turned into a RemoteFunction by _materialize
        return {k: _plain(v, depth + 1) for k, v in x.items()}
    raise Untrusted(f"the answer holds a {type(x).__name__}, which is not plain data")


def _materialize(reply: dict, session: KernelSession, expr: str):
    if "raised" in reply:
        name = re.sub(r"\W", "_", str(reply["raised"]))[:60] or "Exception"
        message = str(reply.get("message", ""))
        if name == "NotImplementedError":
            raise NotImplementedError(message)
        if name == "AssertionError":
            raise AssertionError(message)
        raise type(name, (Exception,), {})(message)

    def build(x):
        if isinstance(x, dict) and "__callable__" in x:
            path = tuple(x["__callable__"])
            return RemoteFunction(session, expr, path)
        if type(x) in (list, tuple):
            return type(x)(build(v) for v in x)
        return x

    return build(_plain(reply["ok"]))


class RemoteFunction:
    """The grader's stand-in for a function the student defined in the kernel: calling
    it sends the arguments there and returns the decoded result."""

    def __init__(self, session: KernelSession, expr: str, path: tuple = ()):
        self._session, self._expr, self._path = session, expr, path

    def __call__(self, *args, **kwargs):
        return self._session.call(self._expr, self._path, args, kwargs)

    def largest_new_tensor(self, *args) -> int:
        """:func:`attnbook.utils.largest_new_tensor` of the call, measured in the
        kernel."""
        value = self._session.call(self._expr, self._path, args, {}, measure=True)
        if not isinstance(value, int) or isinstance(value, bool):
            raise Untrusted("the kernel's memory measurement is not an int")
        return value

    def __repr__(self) -> str:
        index = "".join(f"[{key!r}]" for key in self._path)
        return f"<your {self._expr}{index}>"


# --------------------------------------------------------------------------------------
# 3. Grade one notebook
# --------------------------------------------------------------------------------------
def _row(label, passed, status, message) -> dict:
    return {"label": label, "passed": int(passed), "status": status, "message": message}


def grade_notebook(
    path,
    chapter: Chapter,
    limits: sandbox.Limits | None = None,
    isolation: str = "none",
) -> list[dict]:
    """Grade the submission at ``path`` against ``chapter``: rows ``{"notebook",
    "label", "passed" (0/1), "status", "message"}``, one per check of the chapter, in
    its order, plus rows labelled ``"*"`` about the whole notebook. Never raises for
    anything the submission does.

    ``status`` is ``passed``, ``failed``, ``not run`` (the check could not run: the
    answer is undefined, or the kernel died before it), or ``untrusted`` (the kernel's
    reply could not be read as an answer, or the answer cell reaches for the grading
    machinery); ``*`` rows are ``error`` (the notebook did not run to the end) or
    ``note``. ``isolation`` (``"bwrap"`` or ``"none"``) is where the kernel runs; every
    row says it.
    """
    from .exercises import run_check

    nbformat = _require("nbformat")
    limits = limits or sandbox.Limits()
    path = Path(path)
    rows: dict[str, dict] = {}
    extra: list[dict] = []

    def finish() -> list[dict]:
        for label in chapter.labels:
            rows.setdefault(label, _row(label, 0, "not run", NOT_RUN))
        ordered = [rows[label] for label in chapter.labels] + extra
        return [
            {"notebook": path.name, **row, "isolation": isolation} for row in ordered
        ]

    try:
        if path.is_symlink():
            raise ValueError("it is a link, not a file")
        if path.stat().st_size > 50 * 2**20:
            raise ValueError("it is larger than 50 MB")
        submission = nbformat.read(path, as_version=4)
        if not isinstance(submission.get("cells"), list):
            raise ValueError("it has no cells")
    except Exception as err:
        extra.append(
            _row(NOTEBOOK, 0, "error", f"not a notebook that can be read: {err}"[:300])
        )
        return finish()
    try:
        steps, notes, tampering = rebuild(chapter, submission)
    except Exception as err:
        extra.append(_row(NOTEBOOK, 0, "error", f"could not match its cells: {err}"))
        return finish()
    extra += [_row(NOTEBOOK, 0, "note", note) for note in notes]
    if tampering:
        why = "; ".join(tampering)
        for label in chapter.labels:
            rows[label] = _row(
                label,
                0,
                "untrusted",
                f"not scored: {why}. The instructor reviews this notebook by hand.",
            )
        return finish()

    answer_errors: dict[str, str] = {}
    with sandbox.process_guard(limits.processes) as guard:
        try:
            with KernelSession(limits, guard, isolation) as kernel:
                for step in steps:
                    if step.kind != "check":
                        try:
                            run = kernel.run(step.code)
                        except CallTimeout as err:
                            run = CellRun(error=f"the cell {err}; it was interrupted")
                        if step.kind == "answer" and run.error:
                            answer_errors[step.label] = run.error
                        continue
                    rows[step.label] = _check(
                        kernel, step, run_check, answer_errors.get(step.label)
                    )
        except KernelGone as err:
            extra.append(_row(NOTEBOOK, 0, "error", str(err)))
        except Exception as err:  # the grader's own failure: say so, never abort
            extra.append(
                _row(
                    NOTEBOOK, 0, "error", f"grading failed: {type(err).__name__}: {err}"
                )
            )
    return finish()


def _check(kernel: KernelSession, step: Step, run_check, answer_error) -> dict:
    """Run the check of ``step`` in this process on the kernel's answer."""
    label = step.label
    try:
        try:
            student = kernel.call(step.code, ())
        except (NotImplementedError, AssertionError):
            raise
        except Exception as err:
            where = f"; your answer cell raised {answer_error}" if answer_error else ""
            return _row(
                label,
                0,
                "not run",
                f"{NOT_RUN}: {type(err).__name__}: {err}{where}"[:500],
            )
        result = run_check(label, student)
        status = "passed" if result.passed else "failed"
        return _row(label, result.passed, status, result.message)
    except CallTimeout as err:
        return _row(label, 0, "failed", f"your answer {err} on the check's inputs")
    except Untrusted as err:
        return _row(label, 0, "untrusted", f"could not be trusted: {err}")
    except (NotImplementedError, AssertionError) as err:
        return _row(label, 0, "failed", str(err) or type(err).__name__)


# --------------------------------------------------------------------------------------
# 4. Many submissions: rows, CSV, feedback, gradebook
# --------------------------------------------------------------------------------------
def _submissions(paths, chapters=()) -> list[tuple[str, Path, str]]:
    """``(student, notebook path, notebook name)`` for every submitted notebook.

    A directory is searched recursively (links are not followed): a notebook in a
    sub-folder belongs to the student named by the first folder below the given
    directory (``ada/attention.ipynb``). A notebook directly in it, or given as a file,
    belongs to the student its name gives: ``ada_attention.ipynb`` or
    ``ada-attention.ipynb`` (the form in which Canvas and Moodle download
    submissions) is ada's ``attention.ipynb`` when ``attention.ipynb`` is one of
    ``chapters``; any other name is its own student.
    """

    def loose(path: Path) -> tuple[str, Path, str]:
        for chapter in sorted(chapters, key=len, reverse=True):
            for sep in ("_", "-"):
                if (
                    path.name.endswith(sep + chapter)
                    and len(path.name) > len(chapter) + 1
                ):
                    return path.name[: -len(chapter) - 1], path, chapter
        return path.stem, path, path.name

    found = []
    for given in map(Path, paths):
        if given.is_file():
            found.append(loose(given))
        elif given.is_dir():
            for folder, dirs, files in os.walk(given):
                dirs[:] = sorted(d for d in dirs if d != ".ipynb_checkpoints")
                for name in sorted(files):
                    if not name.endswith(".ipynb"):
                        continue
                    path = Path(folder) / name
                    rel = path.relative_to(given)
                    if len(rel.parts) > 1:
                        found.append(
                            (rel.parts[0], path, Path(*rel.parts[1:]).as_posix())
                        )
                    else:
                        found.append(loose(path))
        else:
            raise FileNotFoundError(f"submission {str(given)!r} does not exist")
    return found


def load_chapters(book_dir) -> dict[str, Chapter]:
    """Every ``book_dir/*.ipynb`` as a :class:`Chapter`, read once, before any student
    code runs (a submission that writes into the book cannot change this run)."""
    nbformat = _require("nbformat")
    book_dir = Path(book_dir)
    notebooks = sorted(book_dir.glob("*.ipynb"))
    if not notebooks:
        raise ValueError(f"book_dir {str(book_dir)!r} has no *.ipynb notebooks")
    return {
        p.name: Chapter.from_notebook(nbformat.read(p, as_version=4), p.name)
        for p in notebooks
    }


def grade(
    paths,
    out_csv="grades.csv",
    *,
    book_dir="book",
    limits: sandbox.Limits | None = None,
    jobs: int = 1,
    isolation: str = "auto",
    feedback_dir=None,
    gradebook=None,
    progress=None,
) -> list[dict]:
    """Grade every submitted notebook under ``paths`` against the chapters in
    ``book_dir``; write the per-check CSV ``out_csv``, one feedback file per student
    (``feedback_dir``, default ``feedback/`` beside the CSV) and the gradebook
    (``gradebook``, default ``gradebook.csv`` beside it).

    ``paths`` are notebook files or directories (see ``_submissions``). ``jobs``
    notebooks are graded at once. Each row is ``{"student", "notebook", "label",
    "passed", "status", "message", "isolation"}`` (see
    :func:`attnbook.grader.grade_notebook`). A notebook whose name is not a chapter's
    gets one ``*`` row saying so. The inputs of every check are
    drawn from one fresh secret seed for the whole run.

    ``isolation`` is ``"auto"`` (the bubblewrap sandbox where it works, else none),
    ``"bwrap"`` (refuse to grade without it) or ``"none"``; see
    :func:`attnbook.grader.isolation_for`.
    """
    from .exercises.common import fresh_inputs

    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
    isolation = isolation_for(isolation)
    chapters = load_chapters(book_dir)
    submissions = _submissions(paths, chapters)
    out_csv = Path(out_csv)
    lock, done = threading.Lock(), [0]

    def one(item) -> list[dict]:
        student, path, notebook = item
        chapter = chapters.get(Path(notebook).name)
        if chapter is None:
            rows = [
                {
                    "notebook": notebook,
                    **_row(
                        NOTEBOOK,
                        0,
                        "error",
                        f"no chapter of the book is named {Path(notebook).name!r}: "
                        "not graded",
                    ),
                    "isolation": isolation,
                }
            ]
        else:
            rows = grade_notebook(path, chapter, limits, isolation)
        with lock:
            done[0] += 1
            if progress:
                progress(done[0], len(submissions), student, notebook)
        return [{"student": student, **row, "notebook": notebook} for row in rows]

    with fresh_inputs(), ThreadPoolExecutor(max_workers=jobs) as pool:
        rows = [row for rows in pool.map(one, submissions) for row in rows]
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    with out_csv.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows({k: _cell(v) for k, v in row.items()} for row in rows)
    write_feedback(
        rows, out_csv.parent / "feedback" if feedback_dir is None else feedback_dir
    )
    write_gradebook(
        rows,
        chapters,
        out_csv.parent / "gradebook.csv" if gradebook is None else gradebook,
    )
    return rows


def isolation_for(wanted: str = "auto") -> str:
    """The isolation to grade with: ``"bwrap"`` where the sandbox works (always for
    ``wanted="bwrap"``, or an error saying how to get it), else ``"none"``."""
    if wanted not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {ISOLATIONS}, got {wanted!r}")
    if wanted == "none":
        return "none"
    if sandbox.bwrap_works():
        return "bwrap"
    if wanted == "bwrap":
        raise ValueError(
            "the sandbox is required but bubblewrap does not work here (Linux only: "
            "apt-get install bubblewrap, and user namespaces must be allowed); see the "
            "instructor guide for Docker and nbgrader"
        )
    return "none"


def _cell(value):
    """A CSV cell that a spreadsheet will not run as a formula."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def _feedback_name(student: str) -> str:
    """A safe file name for ``student``'s feedback: letters, digits, ``.``, ``_`` and
    ``-`` only."""
    return (re.sub(r"[^\w.-]+", "_", student).strip("._") or "student") + ".md"


def write_feedback(rows: list[dict], feedback_dir) -> list[Path]:
    """Write ``feedback_dir/<student>.md`` for every student in ``rows`` (the rows
    :func:`grade` returns).

    Each file says, per notebook, how many checks passed and, for every check, its
    verdict with the check's message and hint; what stopped a notebook, what was
    ignored, and any check that could not be trusted come first. Returns the paths
    written.
    """
    from . import __version__

    feedback_dir = Path(feedback_dir)
    feedback_dir.mkdir(parents=True, exist_ok=True)
    written, names = [], {}
    for student in dict.fromkeys(row["student"] for row in rows):
        mine = [row for row in rows if row["student"] == student]
        checks = [row for row in mine if row["label"] != NOTEBOOK]
        lines = [
            f"# Feedback for {student}",
            "",
            f"{sum(int(r['passed']) for r in checks)} of {len(checks)} checks passed "
            f"(graded with attnbook {__version__}: your answer cells ran in the book's "
            "notebook, in a fresh kernel, and the checks ran on new inputs).",
            "",
        ]
        for notebook in dict.fromkeys(row["notebook"] for row in mine):
            rows_nb = [row for row in mine if row["notebook"] == notebook]
            checks_nb = [row for row in rows_nb if row["label"] != NOTEBOOK]
            lines += [
                f"## {notebook}: "
                f"{sum(int(r['passed']) for r in checks_nb)}/{len(checks_nb)} checks "
                "passed",
                "",
            ]
            for row in rows_nb:
                if row["label"] == NOTEBOOK and row["status"] == "error":
                    lines.append(
                        f"- **The notebook did not run to the end**: {row['message']}. "
                        "Checks after that point could not run; run it top to bottom "
                        "yourself (Restart & Run All) to see where it stops."
                    )
                elif row["label"] == NOTEBOOK:
                    lines.append(f"- Note: {row['message']}.")
            for row in checks_nb:
                verdict = {"passed": "PASSED", "untrusted": "UNTRUSTED"}.get(
                    row["status"], "FAILED"
                )
                lines.append(f"- `[{verdict}] {row['label']}`: {row['message']}")
            lines.append("")
        name = _feedback_name(student)
        names[name] = names.get(name, 0) + 1
        if names[name] > 1:  # two names that sanitize alike keep separate files
            name = f"{name[:-3]}-{names[name]}.md"
        path = feedback_dir / name
        path.write_text("\n".join(lines))
        written.append(path)
    return written


def write_gradebook(rows: list[dict], chapters: dict[str, Chapter], path) -> Path:
    """Write the gradebook CSV: one row per student, one column of points per chapter
    graded (named after the chapter and its maximum, ``attention (3)``), and ``Total``.

    The first column is ``Student``, the name of the student's folder: Canvas and
    Moodle import a CSV with an identifier column plus one column per assignment (map
    ``Student`` to the login or ID field when importing). A chapter a student did not
    submit is empty; a cell never starts with ``=``, ``+``, ``-`` or ``@``.
    """
    graded = [n for n in chapters if any(Path(r["notebook"]).name == n for r in rows)]
    header = ["Student"]
    for name in graded:
        header.append(
            f"{Path(name).stem} ({_points(sum(chapters[name].points.values()))})"
        )
    header.append(
        f"Total ({_points(sum(sum(chapters[n].points.values()) for n in graded))})"
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for student in dict.fromkeys(row["student"] for row in rows):
            line, total = [_cell(student)], 0.0
            for name in graded:
                mine = [
                    r
                    for r in rows
                    if r["student"] == student
                    and Path(r["notebook"]).name == name
                    and r["label"] != NOTEBOOK
                ]
                if not mine:
                    line.append("")
                    continue
                got = sum(
                    chapters[name].points.get(r["label"], 0)
                    for r in mine
                    if int(r["passed"])
                )
                total += got
                line.append(_points(got))
            line.append(_points(total))
            writer.writerow(line)
    return path


def _points(value: float) -> str:
    return f"{value:g}"


def summary(rows: list[dict]) -> str:
    """The isolation the kernels ran in, then one line per student: checks passed out
    of checks expected, and failed runs."""
    kinds = sorted({row.get("isolation", "none") for row in rows}) or ["none"]
    lines = [f"isolation: {', '.join(kinds)}"]
    if "none" in kinds:
        lines[0] += (
            " (no sandbox: the submissions' code could read and write what your user "
            "can; see the instructor guide)"
        )
    for student in dict.fromkeys(row["student"] for row in rows):
        mine = [row for row in rows if row["student"] == student]
        checks = [row for row in mine if row["label"] != NOTEBOOK]
        broken = sorted(
            {
                r["notebook"]
                for r in mine
                if r["label"] == NOTEBOOK and r["status"] == "error"
            }
        )
        untrusted = sum(1 for r in checks if r["status"] == "untrusted")
        passed = sum(r["passed"] for r in checks)
        line = f"  {student}: {passed}/{len(checks)} checks passed"
        if untrusted:
            line += f"; {untrusted} untrusted"
        if broken:
            line += f"; did not finish: {', '.join(broken)}"
        lines.append(line)
    return "\n".join(lines)
