"""attnbook.kernels._compat: Triton's CPU interpreter before 3.7 turned a computed loop bound
into an index with ``int(array)`` of a one-element array, which NumPy 2.5 refuses, so every kernel
with a causal or window bound stopped there (the kernel lab on an H200 image: Triton 3.6, NumPy
2.5). The old rule is put back here, NumPy 2.5's refusal is made of NumPy 2.4's warning, and the
mended interpreter must run the kernel."""

from __future__ import annotations

import warnings

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

import attnbook.kernels.flash_triton  # noqa: F401  (importing a kernel mends the interpreter)
from attnbook.kernels import _compat

if not hasattr(interpreter, "_patch_lang_tensor"):  # pragma: no cover - another Triton layout
    pytest.skip("this Triton's interpreter has no _patch_lang_tensor", allow_module_level=True)


@triton.jit
def _bounded(X, L, S, BLOCK: tl.constexpr):
    m0 = tl.program_id(0) * BLOCK
    hi = tl.where(m0 < L, tl.minimum(S, m0 + BLOCK + S - L), 0)  # a computed bound
    for start in range(0, hi, BLOCK):
        tl.store(X + start // BLOCK, 1.0)


def test_the_interpreter_runs_computed_loop_bounds_after_mending(monkeypatch):
    if not isinstance(_bounded, interpreter.InterpretedFunction):
        pytest.skip("needs TRITON_INTERPRET=1 (tests/conftest.py sets it without a GPU)")
    mended = interpreter._patch_lang_tensor
    assert getattr(mended, "mended", False)  # importing the kernels mended it

    def triton_36(tensor, scope):  # Triton 3.6's rule: int() of the array as it is
        mended(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", triton_36)
    x = torch.zeros(4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # NumPy 2.5 raises where 2.4 warns
        if tuple(int(p) for p in __import__("numpy").__version__.split(".")[:2]) < (2, 5):
            with pytest.raises(Exception, match="0-dimensional|scalar"):
                _bounded[(1,)](x, 32, 32, BLOCK=16)
        _compat.mend_interpreter()
        _bounded[(1,)](x, 32, 32, BLOCK=16)
    assert x.tolist() == [1.0, 0.0, 0.0, 0.0]
    _compat.mend_interpreter()  # once: a mended interpreter is left as it is
    assert interpreter._patch_lang_tensor.mended
