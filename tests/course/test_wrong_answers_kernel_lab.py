"""Plausible wrong kernels for the kernel lab's exercises: each is the chapter's own solution
with one mistake edited in (the row max, the ragged-tile mask, the causal bound, the rescale of
the accumulator, ...), written to a module file so that Triton reads its source as it would a
student's, and launched through the lab's launcher under the interpreter.

The check must fail each one with a message that points at the mistake (see tests/course/wrong_answers.py).
Besides the values, the classes here are: another tensor's row stride (each input and output has
its own), loads outside a tensor that a masked store would hide (a missing row, column or key mask,
a negative offset), a causal bound off by one (it shows for one residue of S - L modulo the 16-row
tiles), float16 accumulators (they show past a thousand keys or queries), the ragged last key block
and the log-sum-exp of the block-sparse pass, and work not skipped (the tl.dot calls on tiles a
program must skip, loads masked or not, and a two-pass softmax that reads every key tile twice).
"""

from __future__ import annotations

import functools
import inspect
import tempfile
from pathlib import Path

import nbformat

import attnbook.kernels.lab as lab
from wrong_answers import Mistake, mistake_test
from scripts import load_script

CHAPTER = Path(__file__).resolve().parents[2] / "book" / "kernel_lab.ipynb"
_FOLDER = Path(tempfile.mkdtemp(prefix="attnbook-wrong-kernels-"))
_SOLUTIONS = {cell.id: cell.source for cell in nbformat.read(CHAPTER, as_version=4).cells}


def wrong_kernel(cell: str, name: str, edits: list[tuple[str, str]], tag: str, source=None):
    """Kernel ``name`` of the chapter's solution cell ``cell`` (or of ``source``) with each
    ``(old, new)`` of ``edits`` applied (each ``old`` must be in the source), imported from a
    module file."""
    source = _SOLUTIONS[cell] if source is None else source
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


def _two_pass(edits, tag):
    """The lab's own wasteful kernel (a two-pass softmax over every key tile), edited."""
    source = inspect.getsource(lab._two_pass_forward.fn)
    kernel = wrong_kernel("", "_two_pass_forward", edits, tag, source=source)
    return functools.partial(lab.attention_forward, kernel)


CAUSAL_MASK = "valid = valid & (keys[None, :] <= rows[:, None] + S - L)"
CAUSAL_BOUND = "hi = tl.minimum(S, tl.program_id(0) * BLOCK_M + BLOCK_M + S - L)"
RESCALE = "acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)"
KV_MASK = ",\n                    mask=keys[:, None] < S, other=0.0)"
K_LOAD = ("k = tl.load(K + keys[:, None] * stride_k + dims[None, :],\n"
          "                    mask=keys[:, None] < S, other=0.0)")
Q_MASK = ",\n                mask=rows[:, None] < L, other=0.0)"
LO = "lo = tl.maximum(0, tl.program_id(0) * BLOCK_N - (S - L)) // BLOCK_M * BLOCK_M"
ROWS_MASK = "mask=rows[:, None] < L, other=0.0)"
SCORES = 's = tl.where(keys[None, :] < S, tl.dot(q, tl.trans(k)) * scale, float("-inf"))'
FLOAT16_FORWARD = [  # acc and l in the inputs' dtype, each update rounded to it (float32 for the log)
    ("acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)", "acc = tl.zeros([BLOCK_M, HEAD_DIM], q.dtype)"),
    (RESCALE, "acc = (acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)).to(q.dtype)"),
    ("l = tl.zeros([BLOCK_M], tl.float32)", "l = tl.zeros([BLOCK_M], q.dtype)"),
    ("l = l * alpha + tl.sum(p, 1)", "l = (l * alpha + tl.sum(p, 1)).to(q.dtype)"),
    ("safe = tl.where(l > 0, l, 1.0)", "safe = tl.where(l > 0, l, 1.0).to(tl.float32)"),
]
FLOAT16_BACKWARD = [  # dk and dv in the inputs' dtype
    ("dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)", "dk = tl.zeros([BLOCK_N, HEAD_DIM], k.dtype)"),
    ("dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)", "dv = tl.zeros([BLOCK_N, HEAD_DIM], k.dtype)"),
    ("dv += tl.dot(tl.trans(p.to(do.dtype)), do)", "dv += tl.dot(tl.trans(p.to(do.dtype)), do).to(k.dtype)"),
    ("dk += tl.dot(tl.trans(ds.to(q.dtype)), q) * scale",
     "dk += (tl.dot(tl.trans(ds.to(q.dtype)), q) * scale).to(k.dtype)"),
]
# a block-sparse kernel that walks every key block, finds in COL_IDX whether the layout lists it,
# and masks the loads and scores of those it does not: right values, all the work
EVERY_BLOCK = [
    ("    for idx in range(tl.load(ROW_PTR + block), tl.load(ROW_PTR + block + 1)):\n"
     "        keys = tl.load(COL_IDX + idx) * BLOCK + tl.arange(0, BLOCK)\n",
     "    for j in range(0, tl.cdiv(S, BLOCK)):\n"
     "        keys = j * BLOCK + tl.arange(0, BLOCK)\n"
     "        listed = tl.zeros([BLOCK], tl.int32)\n"
     "        for idx in range(tl.load(ROW_PTR + block), tl.load(ROW_PTR + block + 1)):\n"
     "            listed += (tl.load(COL_IDX + idx) == j).to(tl.int32)\n"
     "        inside = (keys < S) & (listed > 0)\n"),
    ("mask=keys[:, None] < S, other=0.0)", "mask=inside[:, None], other=0.0)"),
    ("s = tl.where(keys[None, :] < S,", "s = tl.where(inside[None, :],"),
]
# the two-pass kernel with the causal bound on both loops: no upper triangle, K read twice
TWO_PASS_BOUNDED = [
    ("    top = tl.full(", "    hi = S\n    if CAUSAL:\n"
     "        hi = tl.minimum(S, tl.program_id(0) * BLOCK_M + BLOCK_M + S - L)\n    top = tl.full("),
    ("for start in range(0, S, BLOCK_N):", "for start in range(0, hi, BLOCK_N):"),
]

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
    # another tensor's row stride: every input and output has its own
    Mistake("kernel-lab-softmax", "stores y with x's row stride",
            _softmax([("Y + row * stride_y", "Y + row * stride_x")], "y_stride_x"),
            ("stored outside y", "x's row stride (stride_x)", "use stride_y")),
    Mistake("kernel-lab-softmax", "loads x with y's row stride",
            _softmax([("X + row * stride_x", "X + row * stride_y")], "x_stride_y"),
            ("loaded outside x", "use stride_x")),
    Mistake("kernel-lab-matmul", "walks b with a's row stride",
            _matmul([("B + ks[:, None] * stride_bk", "B + ks[:, None] * stride_am")], "b_stride_am"),
            ("loaded outside b", "a's row stride (stride_am)", "use stride_bk")),
    Mistake("kernel-lab-matmul", "stores c with a's row stride",
            _matmul([("C + rows[:, None] * stride_cm", "C + rows[:, None] * stride_am")], "c_stride_am"),
            ("stored outside c", "use stride_cm")),
    Mistake("kernel-lab-attention-forward", "uses stride_q for every tensor",
            _forward([("* stride_k", "* stride_q"), ("* stride_v", "* stride_q"), ("* stride_o", "* stride_q")],
                     "stride_q"),
            ("outside", "q's row stride (stride_q)", "each tensor here has its own row stride")),
    Mistake("kernel-lab-attention-backward", "uses stride_q for every tensor",
            _backward([("* stride_k", "* stride_q"), ("* stride_v", "* stride_q"), ("* stride_do", "* stride_q"),
                       ("* stride_dk", "* stride_q"), ("* stride_dv", "* stride_q")], "stride_q"),
            ("outside", "q's row stride (stride_q)", "each tensor here has its own row stride")),
    Mistake("kernel-lab-attention-backward", "stores dk with k's row stride",
            _backward([("DK + keys[:, None] * stride_dk", "DK + keys[:, None] * stride_k")], "dk_stride_k"),
            ("stored outside dk", "k's row stride (stride_k)", "use stride_dk")),
    Mistake("kernel-lab-block-sparse", "uses stride_q for every tensor",
            _sparse([("* stride_k", "* stride_q"), ("* stride_v", "* stride_q"), ("* stride_o", "* stride_q")],
                    "stride_q"),
            ("outside", "q's row stride (stride_q)", "each tensor here has its own row stride")),
    # loads outside a tensor that the masked stores would hide
    Mistake("kernel-lab-matmul", "forgets the row mask on a",
            _matmul([("mask=(rows[:, None] < M) & (ks[None, :] < K)", "mask=ks[None, :] < K")], "no_row_mask"),
            ("loaded outside a", "past the end of a", "rows < M")),
    Mistake("kernel-lab-matmul", "forgets the column mask on b",
            _matmul([("mask=(ks[:, None] < K) & (cols[None, :] < N)", "mask=ks[:, None] < K")], "no_col_mask"),
            ("loaded outside b", "read past its end", "cols < N")),
    Mistake("kernel-lab-attention-forward", "forgets the row mask on q",
            _forward([(Q_MASK, ")")], "no_q_mask"),
            ("loaded outside q", "rows < L")),
    Mistake("kernel-lab-attention-forward", "forgets the key mask on k alone",
            _forward([(K_LOAD, "k = tl.load(K + keys[:, None] * stride_k + dims[None, :])")], "no_k_mask"),
            ("loaded outside k", "keys < S")),
    Mistake("kernel-lab-attention-backward", "forgets the row masks on q and do",
            _backward([("stride_q + dims[None, :],\n                    mask=rows[:, None] < L, other=0.0)",
                        "stride_q + dims[None, :])"),
                       ("stride_do + dims[None, :],\n                     mask=rows[:, None] < L, other=0.0)",
                        "stride_do + dims[None, :])")], "no_q_mask"),
            ("loaded outside q", "rows < L")),
    Mistake("kernel-lab-attention-backward", "starts the loop at a negative query (no max(0, ...))",
            _backward([(LO, "lo = (tl.program_id(0) * BLOCK_N - (S - L)) // BLOCK_M * BLOCK_M")], "negative_lo"),
            ("loaded outside q", "went negative", "tl.maximum(0")),
    Mistake("kernel-lab-block-sparse", "forgets the key mask on k",
            _sparse([(K_LOAD, "k = tl.load(K + keys[:, None] * stride_k + dims[None, :])")], "no_k_mask"),
            ("loaded outside k", "keys < S")),
    # a causal bound off by one: the residue of S - L modulo 16 where it shows
    Mistake("kernel-lab-attention-forward", "stops the causal loop one key short",
            _forward([(CAUSAL_BOUND, CAUSAL_BOUND.replace("S - L)", "S - L - 1)"))], "bound_minus_1"),
            ("causal bound is one key short", "1 modulo 16")),
    Mistake("kernel-lab-attention-forward", "runs the causal loop one key too far",
            _forward([(CAUSAL_BOUND, CAUSAL_BOUND.replace("S - L)", "S - L + 1)"))], "bound_plus_1"),
            ("values are right", "loaded key tile", "bound the loop")),
    Mistake("kernel-lab-attention-backward", "starts the loop over query tiles one query late",
            _backward([(LO, LO.replace("(S - L))", "(S - L) + 1)"))], "lo_plus_1"),
            ("starts one query late", "1 modulo 16")),
    # float16 accumulators: FlashAttention-2's rule at a thousand keys or queries
    Mistake("kernel-lab-attention-forward", "accumulates acc and l in the inputs' dtype (float16)",
            _forward(FLOAT16_FORWARD, "float16_acc"),
            ("float16 accumulators", "keep m, l and acc in float32")),
    Mistake("kernel-lab-attention-backward", "accumulates dk and dv in the inputs' dtype (float16)",
            _backward(FLOAT16_BACKWARD, "float16_acc"),
            ("float16 accumulators", "keep dk and dv in float32")),
    # the block-sparse pass: its ragged last key block and its log-sum-exp
    Mistake("kernel-lab-block-sparse", "does not mask the scores of the keys past S",
            _sparse([(SCORES, "s = tl.dot(q, tl.trans(k)) * scale")], "no_score_mask"),
            ("keys past S", "-inf")),
    Mistake("kernel-lab-block-sparse", "stores the row max as the log-sum-exp",
            _sparse([("tl.where(l > 0, m + tl.log(safe)", "tl.where(l > 0, m")], "lse_max"),
            ("lse for", "log-sum-exp of each row")),
    Mistake("kernel-lab-attention-forward", "forgets to mask the scores of the keys past S",
            _forward([("valid = keys[None, :] < S", "valid = keys[None, :] < S + BLOCK_N")], "no_score_mask"),
            ("keys past S", "-inf")),
    # work not skipped: the tl.dot calls on tiles the program must skip, loads masked or not
    Mistake("kernel-lab-attention-forward", "walks every key tile, masking the loads past the causal bound",
            _forward([(CAUSAL_BOUND, "seen = tl.minimum(S, tl.program_id(0) * BLOCK_M + BLOCK_M + S - L)"),
                      ("    hi = S\n", "    hi = S\n    seen = S\n"),
                      ("mask=keys[:, None] < S, other=0.0)", "mask=keys[:, None] < seen, other=0.0)")],
                     "masked_no_bound"),
            ("values are right", "ran tl.dot on key tile", "does not skip")),
    Mistake("kernel-lab-attention-forward", "the lab's two-pass kernel, with no causal bound",
            functools.partial(lab.attention_forward, lab._two_pass_forward),
            ("values are right", "loaded key tile", "bound the loop")),
    Mistake("kernel-lab-attention-forward", "a two-pass softmax with the causal bound",
            _two_pass(TWO_PASS_BOUNDED, "bounded"),
            ("values are right", "times", "online")),
    Mistake("kernel-lab-attention-backward", "walks every query tile (lo = 0)",
            _backward([(LO, "lo = 0")], "lo_zero"),
            ("values are right", "query tile", "start the loop over query tiles")),
    Mistake("kernel-lab-attention-backward", "walks every query tile, masking the loads before the first",
            _backward([("    lo = 0\n    if CAUSAL:", "    lo = 0\n    first = -L\n    if CAUSAL:"),
                       (LO, "first = tl.program_id(0) * BLOCK_N - (S - L)"),
                       (ROWS_MASK, "mask=(rows[:, None] < L) & (rows[:, None] >= first), other=0.0)")],
                      "masked_lo_zero"),
            ("values are right", "ran tl.dot on query tile", "start the loop over query tiles")),
    Mistake("kernel-lab-block-sparse", "walks every key block, masking those the layout leaves out",
            _sparse(EVERY_BLOCK, "masked_dense"),
            ("values are right", "ran tl.dot on key block", "does not skip")),
]  # fmt: skip

test_kernel_lab_wrong_answers = mistake_test(MISTAKES)
