"""Shared test settings: a fast, deterministic Hypothesis profile and seeded random generators.

Hypothesis runs ``max_examples=30`` per property with no deadline (the first call into torch can be
slow), derandomized so a run on CI is the run on a laptop. Set ``HYPOTHESIS_PROFILE=thorough`` for a
longer local search.

Without a GPU the Triton kernels run in Triton's CPU interpreter. ``TRITON_INTERPRET`` is read when a
``@triton.jit`` function is defined, so it is set here, before any test module of any xdist worker can
import a kernel; set in a kernel test module instead, it came too late whenever another test file in
the same worker had imported the kernels first.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

settings.register_profile(
    "attnbook",
    deadline=None,
    max_examples=30,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("thorough", deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "attnbook"))


@pytest.fixture
def gen() -> torch.Generator:
    """A CPU generator seeded with 0: tests draw their random tensors from it, never from global state."""
    return torch.Generator().manual_seed(0)
