"""Small helpers every chapter uses: reproducible seeds, the default device, showing source code,
and the size of the largest tensor a computation creates (how the memory claims are tested)."""

from __future__ import annotations

import inspect
import os
import random

import numpy as np
import torch

__all__ = ["seed_everything", "default_device", "show_source", "largest_new_tensor"]


def seed_everything(seed: int = 0) -> torch.Generator:
    """Seed Python's, NumPy's and PyTorch's generators (CPU and CUDA) and return a torch Generator.

    (String hashing is seeded per process by ``PYTHONHASHSEED`` before start-up; setting it here
    would not affect the running interpreter, so this function does not pretend to.)

    Returning a seeded ``torch.Generator`` lets code pass randomness explicitly (``generator=``)
    instead of relying on the global state.
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def default_device() -> torch.device:
    """``cuda`` when a GPU is visible, else ``cpu``. ``ATTNBOOK_DEVICE`` overrides it."""
    if "ATTNBOOK_DEVICE" in os.environ:
        return torch.device(os.environ["ATTNBOOK_DEVICE"])
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def show_source(obj) -> str:
    """Show the source of a function or class, syntax-highlighted in a notebook; returns the text.

    Chapters use it to show the tested implementation from ``attnbook`` instead of a copy.
    """
    source = inspect.getsource(obj)
    try:
        from IPython import get_ipython
        from IPython.display import Code, display

        if get_ipython() is not None:
            display(Code(source, language="python"))
            return source
    except ImportError:  # pragma: no cover - IPython is always present with the book extras
        pass
    print(source)
    return source


def largest_new_tensor(fn, *args, **kwargs) -> int:
    """Run ``fn(*args, **kwargs)`` and return the largest number of elements of any tensor an operation created.

    Every ATen operation is intercepted (``TorchDispatchMode``), so a function that claims never to
    form an ``L x S`` score matrix can be checked: its result here stays below ``L * S``. The inputs
    themselves are not counted, only what the operations produce (views included: ``x[:3]`` of a
    ``(100, 100)`` tensor counts 300 elements).
    """
    from torch.utils._python_dispatch import TorchDispatchMode

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
