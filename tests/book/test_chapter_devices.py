"""Every tensor a chapter hands to a call beside a tensor it moved to the GPU is on the GPU too.

On a CPU every tensor is on the CPU, so a chapter cell that moves ``q, k, v`` to its device but
passes a tensor it built on the host beside them (``cu_seqlens``, a mask, a lengths vector) runs
here and stops on a GPU, the way Colab runs it: the FlashAttention chapter's packed-sequences cell
did exactly that (``cu_seqlens_q must be on q's device cuda:0, got cpu``). CI has no GPU, so this
test reads the chapters' code instead: it follows, cell after cell, which names hold a tensor
built on the host (a factory such as ``torch.tensor`` or ``torch.randn`` without ``device=``) and
which hold one moved to the device (``.to(dev)``, ``.to(device)``, ``.cuda()``, ``device=dev``),
and fails on any call that mixes the two. A host tensor that is meant to stay on the host beside
device tensors (an index list, say) is marked with ``# host`` at the end of the call's line.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

BOOK = Path(__file__).resolve().parents[2] / "book"
CHAPTERS = sorted(BOOK.glob("*.ipynb"))
FACTORIES = {
    "tensor", "as_tensor", "randn", "rand", "randint", "randperm", "zeros", "ones", "full",
    "empty", "arange", "linspace", "eye", "tril", "triu",
}  # fmt: skip
DEVICE_NAMES = {"dev", "device", "gpu"}


def _is_device_value(node: ast.AST) -> bool:
    """``dev``, ``device``, ``"cuda"``, ``torch.device("cuda")``: a device that may be a
    GPU (``"cpu"`` is not)."""
    if isinstance(node, ast.Name):
        return node.id in DEVICE_NAMES
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.startswith("cuda")
    if isinstance(node, ast.Call) and _dotted(node.func) == "torch.device" and node.args:
        return _is_device_value(node.args[0])
    return False


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _moves(node: ast.AST) -> bool:
    """``x.to(dev, ...)``, ``x.to(device=dev)``, ``x.cuda()`` or a factory with
    ``device=dev``."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    if node.func.attr == "cuda":
        return True
    device_kw = [kw.value for kw in node.keywords if kw.arg == "device"]
    if node.func.attr == "to":
        return any(_is_device_value(a) for a in node.args[:1] + device_kw)
    return any(_is_device_value(v) for v in device_kw)


def _built_on_host(node: ast.AST) -> bool:
    """A factory call (``torch.randn(...)``) with no device, and no move after it."""
    if not isinstance(node, ast.Call):
        return False
    name = _dotted(node.func)
    if not name.startswith("torch.") or name.split(".")[-1] not in FACTORIES:
        return False
    return not any(kw.arg == "device" and _is_device_value(kw.value) for kw in node.keywords)


def _kind(node: ast.AST, names: dict[str, str]) -> str | None:
    """``"device"``, ``"host"`` or ``None`` (unknown, or not a tensor) for an expression."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, (ast.GeneratorExp, ast.ListComp)):
        return _kind(node.elt, names)
    if _moves(node):
        return "device"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr in ("requires_grad_", "clone", "contiguous", "detach", "float",
                              "half", "double", "long", "int"):  # fmt: skip
            return _kind(node.func.value, names)
    return "host" if _built_on_host(node) else None


def _contains_move(node: ast.AST, names: dict[str, str]) -> bool:
    return any(_moves(n) or _kind(n, names) == "device" for n in ast.walk(node))


def _assign(target: ast.AST, value: ast.AST, names: dict[str, str]) -> None:
    if isinstance(target, ast.Name):
        kind = _kind(value, names)
        if kind is None:
            names.pop(target.id, None)
        else:
            names[target.id] = kind
    elif isinstance(target, (ast.Tuple, ast.List)):
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
            for t, v in zip(target.elts, value.elts):
                _assign(t, v, names)
        else:  # q, k, v = (torch.randn(...).to(dev) for _ in range(3))
            kind = _kind(value, names)
            for t in target.elts:
                if isinstance(t, ast.Name):
                    if kind is None:
                        names.pop(t.id, None)
                    else:
                        names[t.id] = kind


def mixed_calls(source: str, names: dict[str, str] | None = None) -> list[str]:
    """The calls in ``source`` that pass a host-built tensor beside one moved to the
    device: ``"line N: f(...) gets host tensor x beside device tensors"``. ``names``
    carries what earlier cells assigned, and is updated."""
    names = {} if names is None else names
    tree = ast.parse(source)
    lines = source.splitlines()
    found = []
    for stmt in tree.body:  # cells run top to bottom: follow assignments in order
        for node in ast.walk(stmt):
            if not isinstance(node, ast.Call):
                continue
            args = list(node.args) + [kw.value for kw in node.keywords]
            if not any(_contains_move(a, names) for a in args):
                continue
            end = lines[(node.end_lineno or node.lineno) - 1]
            if end.rstrip().endswith("# host"):
                continue
            for arg in args:
                if isinstance(arg, ast.Name) and names.get(arg.id) == "host":
                    found.append(
                        f"line {node.lineno}: {_dotted(node.func) or 'a call'}(...) gets "
                        f"host tensor {arg.id} beside device tensors"
                    )
        for node in ast.walk(stmt):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    _assign(target, node.value, names)
    return found


def _code_cells(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def _runnable(source: str) -> str:
    """The cell without IPython's ``%magic`` and ``!shell`` lines."""
    return "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()
    )


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_no_call_mixes_host_and_device_tensors(chapter):
    names: dict[str, str] = {}
    problems = []
    for number, source in enumerate(_code_cells(chapter)):
        problems += [f"code cell {number}, {p}" for p in mixed_calls(_runnable(source), names)]
    assert not problems, (
        f"{chapter.name}: on a GPU these calls get tensors on two devices:\n"
        + "\n".join(problems)
    )


def test_the_check_finds_the_packed_sequences_bug():
    """The FlashAttention chapter's cell as it stopped on a GPU: ``cu_seqlens`` stayed on
    the host while ``q, k, v`` moved."""
    cell = """
cu_seqlens = torch.tensor([0, 5, 22, 23, 53], dtype=torch.int32)
q, k, v = (torch.randn(53, 4, 16, generator=generator) for _ in range(3))
kernel = flash_attention_varlen(
    *(t.to(dev) for t in (q, k, v)), cu_seqlens, cu_seqlens, 30, 30,
    is_causal=True, backend="triton",
)
"""
    found = mixed_calls(cell)
    assert len(found) == 2 and all("cu_seqlens" in f for f in found), found
    fixed = cell.replace("cu_seqlens, cu_seqlens", "cu_dev, cu_dev").replace(
        "kernel =", "cu_dev = cu_seqlens.to(dev)\nkernel ="
    )
    assert mixed_calls(fixed) == []


@pytest.mark.parametrize(
    "cell, bad",
    [
        ("x = torch.zeros(3)\ny = torch.ones(3, device=dev)\nf(x, y)", ["x"]),
        ("x = torch.arange(4)\nm = model.to(device)\nm(x.to(device), mask=x)", ["x"]),
        ("x = torch.zeros(3)\nf(x.cuda(), x)  # host", []),  # marked on purpose
        ("x = torch.zeros(3).to(dev)\ny = torch.ones(3, device=dev)\nf(x, y)", []),
        ("x = torch.zeros(3)\nx = x.to(dev)\nf(x, torch.ones(1, device=dev))", []),
        ("x = torch.zeros(3, device='cpu')\nf(x, torch.ones(1).to('cuda'))", ["x"]),
        ("x = torch.zeros(3)\nf(x, y.to(dev))", ["x"]),
        ("x = torch.zeros(3)\nf(x, y.cpu())", []),  # nothing moved to the device
    ],
)
def test_mixed_calls_on_small_cells(cell, bad):
    found = mixed_calls(cell)
    assert [f.split("host tensor ")[1].split()[0] for f in found] == bad, found
