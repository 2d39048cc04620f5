"""attnbook: the tested code behind *Attention, from first principles to GPU kernels*.

Every formula a chapter teaches is implemented once here, tested in ``tests/`` against an
independent reference, and imported by the chapter notebooks in ``book/``.
"""

__version__ = "0.1.0"

from . import complexity, core, utils  # noqa: F401  (light modules; the rest import on demand)
from .core import MultiHeadAttention, scaled_dot_product_attention  # noqa: F401
