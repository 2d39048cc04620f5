"""attnbook.attend: the one module of the entry points that pick a backend. Their values and
errors are tested in tests/unit/test_flash.py, test_kvcache.py, test_kernels_flash.py and
test_kernels_decode.py (through the names the chapters use); here, the interface itself: where
the names live, that each validates once and the launchers trust it, and the renamed launcher."""

from __future__ import annotations

import ast
import importlib
import inspect
import warnings
from pathlib import Path

import pytest
import torch

from attnbook import attend, flash, kvcache

ENTRY_POINTS = {
    "flash_attention": "flash",
    "flash_attention_varlen": "flash",
    "block_sparse_flash_attention": "flash",
    "select_backend": "flash",
    "decode_attention": "kvcache",
}
ROOT = Path(attend.__file__).parent


def test_the_entry_points_live_in_attend_and_keep_their_old_names():
    for name, old in ENTRY_POINTS.items():
        fn = getattr(attend, name)
        assert fn.__module__ == "attnbook.attend" and name in attend.__all__
        assert getattr(importlib.import_module(f"attnbook.{old}"), name) is fn  # no warning: it stays
        assert name not in importlib.import_module(f"attnbook.{old}").__all__  # documented once
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from attnbook.flash import flash_attention  # noqa: F401  (what the chapters write)
        from attnbook.kvcache import decode_attention  # noqa: F401
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        flash.nothing  # noqa: B018


def test_the_entry_points_are_the_only_backend_choosers():
    """No module below attend asks the kernel plan or defines an autograd function over the
    kernels: flash and kvcache hold the PyTorch references, kernels/ the launchers."""
    for module in ("flash.py", "kvcache.py", "kernels/flash_triton.py", "kernels/decode.py"):
        tree = ast.parse((ROOT / module).read_text())
        names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        assert not names & {"plan_for", "triton_missing", "Function"}, module
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    for alias in node.names} | {node.module or "" for node in ast.walk(tree)
                                                if isinstance(node, ast.ImportFrom)}
        assert "attend" not in imported, f"{module} imports attend: a cycle"


def test_the_launchers_trust_their_inputs():
    """The contract's checks run once, in the entry point: the launchers call none of them."""
    for module in ("kernels/flash_triton.py", "kernels/decode.py"):
        tree = ast.parse((ROOT / module).read_text())
        called = {node.func.id for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
        again = called & {"check_qkv", "check_decode", "check_attention_options", "check_real"}
        assert not again, f"{module} checks {again} again"


def test_validation_happens_once_per_call(monkeypatch):
    calls = []
    real = attend.check_qkv
    monkeypatch.setattr(attend, "check_qkv", lambda *a: (calls.append(a[0]), real(*a))[1])
    q = torch.randn(1, 2, 5, 4)
    attend.flash_attention(q, q, q, backend="torch")
    assert calls == ["flash_attention"]


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_each_entry_point_says_which_backend_ran(name):
    q = torch.randn(1, 2, 4, 4)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    calls = {
        "flash_attention": lambda: attend.flash_attention(q, q, q, return_backend=True),
        "flash_attention_varlen": lambda: attend.flash_attention_varlen(
            q[0].transpose(0, 1), q[0].transpose(0, 1), q[0].transpose(0, 1), cu, cu, 4, 4, return_backend=True),
        "block_sparse_flash_attention": lambda: attend.block_sparse_flash_attention(
            q, q, q, torch.ones(1, 1, dtype=torch.bool), 4, return_backend=True),
        "decode_attention": lambda: attend.decode_attention(q[:, :, :1], q, q, torch.tensor([3]),
                                                            return_backend=True),
        "select_backend": lambda: (None, attend.select_backend(q)),
    }
    assert calls[name]()[1] == "torch"  # CPU tensors: the PyTorch path
    if name != "select_backend":
        assert "return_backend" in inspect.signature(getattr(attend, name)).parameters


# each launcher: (module, its name, its PyTorch twin, its old public names)
LAUNCHERS = [
    ("attnbook.kernels.flash_triton", "_flash_forward", "attnbook.flash.flash_forward",
     ["flash_forward"]),
    ("attnbook.kernels.flash_triton", "_flash_backward", "attnbook.flash.flash_backward",
     ["flash_backward"]),
    ("attnbook.kernels.flash_triton", "_block_sparse_attention_forward",
     "attnbook.sparse.block_sparse_attention", ["block_sparse_forward"]),
    ("attnbook.kernels.flash_triton", "_block_sparse_attention_backward",
     "attnbook.sparse.block_sparse_attention", ["block_sparse_backward"]),
    ("attnbook.kernels.flash_triton", "_varlen_forward", None, ["varlen_forward"]),
    ("attnbook.kernels.flash_triton", "_varlen_backward", None, ["varlen_backward"]),
    ("attnbook.kernels.decode", "_split_kv_attention", "attnbook.kvcache.split_kv_attention",
     ["split_kv_forward", "decode_attention"]),
]  # fmt: skip


@pytest.mark.parametrize("module, name, twin, old", LAUNCHERS)
def test_each_launcher_is_private_named_after_its_pytorch_twin_and_its_old_names_warn(
    module, name, twin, old
):
    pytest.importorskip("triton")
    kernels = importlib.import_module(module)
    launcher = getattr(kernels, name)
    assert name.startswith("_") and name not in kernels.__all__
    if twin is not None:
        where, _, twin_name = twin.rpartition(".")
        assert callable(getattr(importlib.import_module(where), twin_name))
        assert name.lstrip("_").startswith(twin_name.removesuffix("_attention")), (name, twin)
    for old_name in old:
        assert old_name not in kernels.__all__
        with pytest.warns(DeprecationWarning, match="attnbook.attend"):
            assert getattr(kernels, old_name) is launcher


@pytest.mark.parametrize("old, new", [("tiled_attention_forward", "flash_forward"),
                                      ("tiled_attention_backward", "flash_backward")])
def test_the_pytorch_passes_old_names_warn_for_one_release(old, new):
    flash = importlib.import_module("attnbook.flash")
    assert old not in flash.__all__ and new in flash.__all__
    with pytest.warns(DeprecationWarning, match=f"attnbook.flash.{new}"):
        assert getattr(flash, old) is getattr(flash, new)


# --------------------------------------------------------------------------------------
# The host path: what a call costs before the GPU sees work
# --------------------------------------------------------------------------------------
def test_a_call_reads_no_package_metadata_and_no_table(monkeypatch):
    """Triton's version is read once per process and the tile configurations once per
    (kernel, GPU, dtype, width, mask block): a call reads neither (reading the package
    metadata took most of a call's host time)."""
    pytest.importorskip("triton")
    import importlib.metadata

    from attnbook import kernels
    from attnbook.kernels import flash_triton, tuning

    kernels._triton_version()  # read once
    reads = []
    monkeypatch.setattr(importlib.metadata, "version", lambda *a: reads.append(a) or "0")
    q = torch.randn(1, 2, 8, 16)
    for _ in range(3):
        kernels.plan_for("flash", q)
        attend.flash_attention(q, q, q, backend="torch")
    assert reads == []

    flash_triton._gpu_configs.cache_clear()
    calls = []
    real = tuning.candidates
    monkeypatch.setattr(tuning, "candidates", lambda *a, **k: calls.append(a) or real(*a, **k))
    for _ in range(3):
        flash_triton._gpu_configs("flash_fwd", (9, 0), torch.float16, 64, None)
    assert len(calls) == 1 and flash_triton._gpu_configs.cache_info().hits == 2


def test_a_call_without_gradients_records_no_graph():
    q, k, v = (torch.randn(1, 2, 8, 16, dtype=torch.float64) for _ in range(3))
    out = attend.flash_attention(q, k, v, is_causal=True)
    assert out.grad_fn is None  # the forward pass alone: no autograd node, nothing saved
    q.requires_grad_()
    out = attend.flash_attention(q, k, v, is_causal=True)
    assert out.grad_fn is not None
    with torch.no_grad():
        assert attend.flash_attention(q, k, v, is_causal=True).grad_fn is None
