"""Small helpers every chapter uses: reproducible seeds, the default device, running on
one CPU thread, showing source code, and the size of the largest tensor a computation
creates (how the memory claims are tested)."""

from __future__ import annotations

import contextlib
import inspect
import os
import random

import numpy as np
import torch

from .contract import check_flag, check_int, check_sizes

__all__ = [
    "seed_everything",
    "default_device",
    "gpu_report",
    "single_thread",
    "show_source",
    "glue",
    "largest_new_tensor",
    "check_positive",
]


def _check_seed(seed) -> None:
    if check_int("seed_everything", "seed", seed, minimum=0) >= 2**32:
        raise ValueError(f"seed_everything: seed must be < 2**32, got {seed}")


def seed_everything(seed: int = 0) -> torch.Generator:
    """Seed Python's, NumPy's and PyTorch's generators (CPU and CUDA) and return a torch
    Generator.

    (String hashing is seeded per process by ``PYTHONHASHSEED`` before start-up; setting
    it here would not affect the running interpreter, so this function does not pretend
    to.)

    Returning a seeded ``torch.Generator`` lets code pass randomness explicitly
    (``generator=``) instead of relying on the global state. ``seed`` is an integer in
    ``[0, 2**32)``, the range NumPy accepts.
    """
    _check_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def default_device() -> torch.device:
    """``cuda`` when a GPU is visible, else ``cpu``. ``ATTNBOOK_DEVICE`` overrides
    it."""
    if "ATTNBOOK_DEVICE" in os.environ:
        name = os.environ["ATTNBOOK_DEVICE"]
        try:
            return torch.device(name)
        except RuntimeError:
            raise ValueError(
                f"default_device: ATTNBOOK_DEVICE must name a torch device (cpu, "
                f"cuda, cuda:1, mps), got {name!r}"
            ) from None
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _report_folders(folder) -> list:
    from pathlib import Path

    if folder is not None:
        return [Path(folder)]
    here = [Path.cwd(), *Path.cwd().parents, Path(__file__).resolve().parents[1]]
    return [p / "benchmarks" / "results" / "gpu" for p in here]


def gpu_report(device: str | None = None, *, folder=None) -> dict | None:
    """The committed GPU report, read as the chapters show it: what ``make gpu-check``
    measured on a GPU (``benchmarks/results/gpu/<device>.json``: the device, versions,
    date and commit, each chapter's time and status, the GPU tests and the benchmarks).

    ``device`` picks a report by its file name (``"nvidia-h200"``); by default the
    newest. The folder is ``folder``, else ``benchmarks/results/gpu`` in the working
    directory or above it, or beside the package's source. ``None`` where there is none:
    a copy of the package installed without the book's repository.
    """
    import json

    if device is not None and not isinstance(device, str):
        raise TypeError(f"gpu_report: device must be a str or None, got {device!r:.40}")
    for found in _report_folders(folder):
        reports = sorted(found.glob("*.json")) if found.is_dir() else []
        if device is not None:
            reports = [p for p in reports if p.stem == device]
        if reports:
            read = [json.loads(p.read_text()) for p in reports]
            return max(read, key=lambda r: r["environment"]["date"])
    if device is not None and folder is not None:
        raise ValueError(f"gpu_report: no report for device {device!r} in {folder}")
    return None


@contextlib.contextmanager
def single_thread():
    """Run PyTorch on one CPU thread inside the block, then restore the thread count.

    A small recurrent model does hundreds of tiny matrix products per batch; on a CPU,
    waking a second thread for each costs more than it saves (several times slower on a
    busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _check_show_source(obj, start, end, docstring) -> None:
    fn = "show_source"
    try:
        inspect.getsource(obj)
    except (TypeError, OSError):
        raise TypeError(
            f"{fn}: obj must be a function or a class defined in Python source, got "
            f"{obj!r:.60}"
        ) from None
    for name, text in (("start", start), ("end", end)):
        if text is not None and not isinstance(text, str):
            raise TypeError(f"{fn}: {name} must be a string or None, got {text!r}")
    check_flag(fn, "docstring", docstring)


def show_source(
    obj, start: str | None = None, end: str | None = None, *, docstring: bool = True
) -> str:
    """Show the source of a function or class, syntax-highlighted in a notebook; returns
    the text.

    Chapters use it to show the tested implementation from ``attnbook`` instead of a
    copy. A listing should carry one idea in about 30 lines, so it can be cut down:

    * ``docstring=False`` leaves out the docstring (the API reference page has it);
    * ``start`` and ``end`` keep only the lines from the first one containing ``start``
      to the first later one containing ``end`` (both included), below the ``def`` or
      ``class`` line; a ``...`` line marks each cut. A substring that is not there
      raises ``ValueError``, so a chapter notices when the code it quotes changes.
    """
    _check_show_source(obj, start, end, docstring)
    lines = inspect.getsource(obj).splitlines()
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith(_DEF))
    while not lines[head].rstrip().endswith(":"):  # a signature over several lines
        head += 1
    body = list(range(head + 1, len(lines)))
    doc = inspect.getdoc(obj) if hasattr(obj, "__doc__") else None
    if (
        not docstring
        and doc
        and obj.__doc__
        and lines[body[0]].lstrip().startswith(_QUOTES)
    ):
        quote = lines[body[0]].lstrip().lstrip("rR")[:3]
        stop = next(
            i
            for i in body
            if lines[i].rstrip().endswith(quote)
            and (i > body[0] or lines[i].count(quote) >= 2)
        )
        body = [i for i in body if i > stop]
    keep = body
    if start is not None or end is not None:

        def find(text: str, after: int) -> int:
            for i in body:
                if i >= after and text in lines[i]:
                    return i
            name = getattr(obj, "__qualname__", obj)
            raise ValueError(f"show_source({name}): no line contains {text!r}")

        first = find(start, body[0]) if start is not None else body[0]
        last = find(end, first + 1) if end is not None else body[-1]
        keep = [i for i in body if first <= i <= last]
    out, previous = lines[: head + 1], body[0] - 1 if body else head
    for i in keep:
        if i != previous + 1:
            out.append(_ellipsis(lines[i]))
        out.append(lines[i])
        previous = i
    if keep and keep[-1] != len(lines) - 1:
        out.append(_ellipsis(lines[keep[-1]]))
    source = "\n".join(out) + "\n"
    try:
        from IPython import get_ipython
        from IPython.display import Code, display

        if get_ipython() is not None:
            display(Code(source, language="python"))
            return source
    except (
        ImportError
    ):  # pragma: no cover - IPython is always present with the book extras
        pass
    print(source)
    return source


def glue(name: str, value, *, display: bool = False):
    """Record ``value`` under ``name`` for the chapter's prose, and return it.

    The website's prose quotes a number a cell computed as ``{glue:text}`name:.1f```
    (myst-nb's glue), so the text and the output beside it come from the same run and
    cannot disagree. The record is the display data myst-nb reads (its format, written
    here so that a kernel without myst-nb, such as a grading kernel, records it too);
    ``display=True`` also shows the value. Outside IPython nothing is recorded.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"glue: name must be an identifier, got {name!r}")
    check_flag("glue", "display", display)
    try:
        from IPython import get_ipython
        from IPython.core.formatters import DisplayFormatter
        from IPython.display import display as show
    except ImportError:  # pragma: no cover - IPython comes with ipywidgets
        return value
    if get_ipython() is None:
        return value
    bundle, metadata = DisplayFormatter().format(value)
    prefix = "" if display else _GLUE_PREFIX
    metadata["scrapbook"] = {"name": name, "mime_prefix": prefix}
    record = {prefix + mime: data for mime, data in bundle.items()}
    show(record, raw=True, metadata=metadata)
    return value


#: The MIME prefix of a glued value that is recorded and not shown (myst-nb's, after
#: papermill's scrapbook).
_GLUE_PREFIX = "application/papermill.record/"


_DEF = ("def ", "class ", "async def ")
_QUOTES = ('"""', 'r"""', "'''", "r'''")


def _ellipsis(line: str) -> str:
    """A ``...`` line indented like ``line``: it marks lines a listing leaves out."""
    return " " * (len(line) - len(line.lstrip())) + "..."


def largest_new_tensor(fn, *args, **kwargs) -> int:
    """Run ``fn(*args, **kwargs)`` and return the largest number of elements of any
    tensor an operation created.

    Every ATen operation is intercepted (``TorchDispatchMode``), so a function that
    claims never to form an ``L x S`` score matrix can be checked: its result here stays
    below ``L * S``. The inputs themselves are not counted, only what the operations
    produce (views included: ``x[:3]`` of a ``(100, 100)`` tensor counts 300 elements).
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    if not callable(fn):
        raise TypeError(f"largest_new_tensor: fn must be callable, got {fn!r:.60}")

    class Largest(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    Largest.numel = max(Largest.numel, t.numel())
            return out

    with Largest():
        fn(*args, **kwargs)
    return Largest.numel


def check_positive(fn: str = "check_positive", /, **values: int) -> None:
    """Raise ``ValueError`` naming ``fn`` and the argument unless every value is a
    positive integer (a bool is not one): ``check_positive("Cache", window=w)``.

    :func:`attnbook.contract.check_sizes` under its old name; ``fn`` defaults to
    ``"check_positive"``, so pass the caller's name."""
    if not isinstance(fn, str):
        raise TypeError(f"check_positive: fn must be a function's name, got {fn!r}")
    check_sizes(fn, **values)
