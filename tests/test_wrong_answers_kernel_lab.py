"""Plausible wrong kernels for the kernel lab's exercises: each is the chapter's own solution
with one mistake edited in (the row max, the ragged-tile mask, the causal bound, the rescale of
the accumulator, ...), written to a module file so that Triton reads its source as it would a
student's, and launched through the lab's launcher under the interpreter.

The check must fail each one with a message that points at the mistake (see tests/wrong_answers.py).
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import nbformat

import attnbook.kernels.lab as lab
from wrong_answers import Mistake, mistake_test
from scripts import load_script

CHAPTER = Path(__file__).resolve().parent.parent / "book" / "kernel_lab.ipynb"
_FOLDER = Path(tempfile.mkdtemp(prefix="attnbook-wrong-kernels-"))
_SOLUTIONS = {cell.id: cell.source for cell in nbformat.read(CHAPTER, as_version=4).cells}


def wrong_kernel(cell: str, name: str, edits: list[tuple[str, str]], tag: str):
    """Kernel ``name`` of the chapter's solution cell ``cell`` with each ``(old, new)`` of
    ``edits`` applied (each ``old`` must be in the source), imported from a module file."""
    source = _SOLUTIONS[cell]
    for old, new in edits:
        assert old in source, f"{cell}: {old!r} is not in the solution any more"
        source = source.replace(old, new)
    stem = f"wrong_{name}_{tag}"
    path = _FOLDER / f"{stem}.py"
    path.write_text("import triton\nimport triton.language as tl\n\n" + source + "\n")
    return getattr(load_script(path), name)


def _softmax(edits, tag):
    kernel = wrong_kernel("kl-softmax-solution", "softmax_kernel", edits, tag)
    return functools.partial(lab.softmax, kernel)


def _matmul(edits, tag):
    kernel = wrong_kernel("kl-matmul-solution", "matmul_kernel", edits, tag)
    return functools.partial(lab.matmul, kernel)


def _forward(edits, tag):
    kernel = wrong_kernel("kl-forward-solution", "attention_kernel", edits, tag)
    return functools.partial(lab.attention_forward, kernel)


def _backward(edits, tag):
    kernel = wrong_kernel("kl-backward-solution", "backward_kernel", edits, tag)
    return functools.partial(lab.attention_backward, kernel)


def _sparse(edits, tag):
    kernel = wrong_kernel("kl-sparse-solution", "block_sparse_kernel", edits, tag)
    return functools.partial(lab.block_sparse_forward, kernel)


CAUSAL_MASK = "valid = valid & (keys[None, :] <= rows[:, None] + S - L)"
CAUSAL_BOUND = "hi = tl.minimum(S, tl.program_id(0) * BLOCK_M + BLOCK_M + S - L)"
RESCALE = "acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)"
KV_MASK = ",\n                    mask=keys[:, None] < S, other=0.0)"

MISTAKES = [
    Mistake("kernel-lab-softmax", "forgets the row max",
            _softmax([("e = tl.exp(x - tl.max(x, 0))", "e = tl.exp(x)")], "no_max"),
            ("does not subtract the row maximum", "overflows")),
    Mistake("kernel-lab-softmax", "pads the ragged row with 0 instead of -inf",
            _softmax([('other=-float("inf")', "other=0.0")], "pad_zero"),
            ("padding lanes", "other=-float('inf')")),
    Mistake("kernel-lab-softmax", "forgets the ragged-tile mask on the load",
            _softmax([(', mask=cols < n_cols, other=-float("inf"))', ")")], "no_load_mask"),
            ("read past its end", "mask the load with cols < n_cols")),
    Mistake("kernel-lab-softmax", "forgets the mask on the store",
            _softmax([("y.to(Y.dtype.element_ty), mask=cols < n_cols)", "y.to(Y.dtype.element_ty))")],
                     "no_store_mask"),
            ("stored outside y", "mask the stores")),
    Mistake("kernel-lab-matmul", "forgets the ragged-tile mask of the k loop",
            _matmul([("mask=(rows[:, None] < M) & (ks[None, :] < K)", "mask=rows[:, None] < M"),
                     ("mask=(ks[:, None] < K) & (cols[None, :] < N)", "mask=cols[None, :] < N")],
                    "no_k_mask"),
            ("is not a multiple of BLOCK_K", "ks < K")),
    Mistake("kernel-lab-matmul", "forgets the ragged-tile mask on the store",
            _matmul([(", c, mask=inside)", ", c)")], "no_store_mask"),
            ("stored outside c", "ragged tile")),
    Mistake("kernel-lab-attention-forward", "forgets the causal bound (loads the upper triangle)",
            _forward([(CAUSAL_BOUND, "hi = S")], "no_bound"),
            ("values are right", "bound the loop", "upper triangle")),
    Mistake("kernel-lab-attention-forward", "forgets the causal mask and the bound",
            _forward([(CAUSAL_BOUND, "hi = S"), (CAUSAL_MASK, "valid = valid")], "no_causal"),
            ("lets every query see every key",)),
    Mistake("kernel-lab-attention-forward", "bounds the loop but leaves the diagonal tile unmasked",
            _forward([(CAUSAL_MASK, "valid = valid")], "no_diagonal_mask"),
            ("tile on the diagonal is not masked",)),
    Mistake("kernel-lab-attention-forward", "forgets to rescale the accumulator",
            _forward([(RESCALE, "acc = acc + tl.dot(p.to(v.dtype), v)")], "no_rescale"),
            ("accumulator is not rescaled", "alpha = exp(m - m_new)")),
    Mistake("kernel-lab-attention-forward", "aligns the causal mask top-left",
            _forward([(CAUSAL_MASK, "valid = valid & (keys[None, :] <= rows[:, None])"),
                      (CAUSAL_BOUND, "hi = tl.minimum(S, tl.program_id(0) * BLOCK_M + BLOCK_M)")],
                     "top_left"),
            ("aligned top-left", "j <= i + S - L")),
    Mistake("kernel-lab-attention-forward", "forgets the ragged-tile mask on K and V",
            _forward([(KV_MASK, ")")], "no_kv_mask"),
            ("ragged tile read past the end",)),
    Mistake("kernel-lab-attention-backward", "forgets the scale in dk",
            _backward([("dk += tl.dot(tl.trans(ds.to(q.dtype)), q) * scale",
                        "dk += tl.dot(tl.trans(ds.to(q.dtype)), q)")], "no_scale"),
            ("dk lacks the scale",)),
    Mistake("kernel-lab-attention-backward", "ignores the causal mask",
            _backward([(CAUSAL_MASK, "valid = valid"),
                       ("lo = tl.maximum(0, tl.program_id(0) * BLOCK_N - (S - L)) // BLOCK_M * BLOCK_M",
                        "lo = 0")], "no_causal"),
            ("ignores the causal mask",)),
    Mistake("kernel-lab-attention-backward", "forgets delta",
            _backward([("ds = p * (tl.dot(do, tl.trans(v)) - delta[:, None])",
                        "ds = p * tl.dot(do, tl.trans(v))")], "no_delta"),
            ("subtract delta",)),
    Mistake("kernel-lab-block-sparse", "walks every key block instead of the layout's",
            _sparse([("for idx in range(tl.load(ROW_PTR + block), tl.load(ROW_PTR + block + 1)):",
                      "for idx in range(0, tl.cdiv(S, BLOCK)):"),
                     ("keys = tl.load(COL_IDX + idx) * BLOCK", "keys = idx * BLOCK")], "dense"),
            ("layout leaves out",)),
    Mistake("kernel-lab-block-sparse", "forgets to rescale the accumulator",
            _sparse([(RESCALE, "acc = acc + tl.dot(p.to(v.dtype), v)")], "no_rescale"),
            ("accumulator is not rescaled",)),
]  # fmt: skip

test_kernel_lab_wrong_answers = mistake_test(MISTAKES)
