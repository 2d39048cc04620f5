"""attnbook: the tested code behind *Attention, from first principles to GPU kernels*.

Every formula a chapter teaches is implemented once here, tested in ``tests/`` against
an independent reference, and imported by the chapter notebooks in ``book/``. Light
modules are imported eagerly; the plotting and course modules load on first use
(``attnbook.viz`` works without an explicit ``import attnbook.viz``).
"""

import importlib

__version__ = "0.1.0"

from . import complexity, core, exercises, utils  # noqa: E402,F401
from .core import MultiHeadAttention, scaled_dot_product_attention  # noqa: E402,F401
from .utils import show_source  # noqa: E402,F401  (DESIGN.md: attnbook.show_source(fn))

_LAZY = {
    "positional",
    "models",
    "sparse",
    "linear",
    "kvcache",
    "flash",
    "rnn",
    "data",
    "vision",
    "graph",
    "connections",
    "viz",
    "widgets",
    "train",
    "course",
    "kernels",
}


def __getattr__(name: str):
    if name in _LAZY:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'attnbook' has no attribute {name!r}")
