"""attnbook: the tested code behind *Attention, from first principles to GPU kernels*.

Every formula a chapter teaches is implemented once here, tested in ``tests/`` against
an independent reference, and imported by the chapter notebooks in ``book/``.

``import attnbook`` loads only what the first chapter starts with: scaled dot-product
attention (:mod:`attnbook.core`, with the contract and the masks it rests on) and
:func:`attnbook.utils.show_source`. Every other submodule loads when it is first
touched, as an attribute (``attnbook.flash.flash_attention``) or by its own import, so
a reader pays only for the chapters they open.
"""

import importlib
import pkgutil

__version__ = "0.1.0"

from . import core, utils  # noqa: E402,F401
from .core import MultiHeadAttention, scaled_dot_product_attention  # noqa: E402,F401
from .utils import show_source  # noqa: E402,F401

# every public submodule and subpackage, loaded on first use
_LAZY = frozenset(
    info.name
    for info in pkgutil.iter_modules(__path__)
    if not info.name.startswith("_")
)


def __getattr__(name: str):
    if name in _LAZY:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'attnbook' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY)
