"""Mending Triton's CPU interpreter where an older release breaks the kernels here.

Triton before 3.7 turns a scalar of the interpreter (a one-element NumPy array) into a
loop bound with ``int(array)``, which NumPy 2.5 refuses for an array of one dimension:
``for start in range(lo, hi, BLOCK_N)`` then stops every kernel whose bounds are
computed (the causal and window bounds). Triton 3.7 squeezes the array first; this
gives the older interpreters the same rule. Compiled kernels are not touched.
"""

from __future__ import annotations


def _index(self) -> int:
    return int(self.handle.data.squeeze())


def mend_interpreter() -> None:
    """Make the interpreter's ``tensor.__index__`` squeeze its one-element array first
    (once per process; a no-op where Triton already does)."""
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "mended", False):
        return

    def patch_lang_tensor(tensor, *args, **kwargs):
        original(tensor, *args, **kwargs)
        scope = args[0] if args else kwargs.get("scope")
        if scope is not None and hasattr(scope, "set_attr"):
            scope.set_attr(tensor, "__index__", _index)
        else:  # releases that assign the attributes directly
            tensor.__index__ = _index

    patch_lang_tensor.mended = True
    interpreter._patch_lang_tensor = patch_lang_tensor
