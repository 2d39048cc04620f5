"""Checks for the kernel lab: the student's Triton kernels, launched by
:mod:`attnbook.kernels.lab`, against attnbook's references.

Each check receives the launcher bound to the student's kernel
(``functools.partial(lab.softmax, softmax_kernel)``), so in the grader the kernel runs
where the student's code runs and only tensors cross. Inputs lie inside a guard band of
NaN (rows and columns past the end read as NaN), so a load that leaves its tensor shows
up as NaN in the output; the launchers catch stores that leave theirs. Accuracy follows
FlashAttention-2's rule: the error against a float64 reference is at most twice the
error of PyTorch in the kernel's dtype, plus a small absolute slack.

After a pass, ``attnbook.exercises.check`` prints what the kernel would cost on a T4, an
A100 and an H100 (:func:`attnbook.kernels.lab.cost_report`: registers, spills and shared
memory with the tiles a GPU would run, and on a GPU the forward pass timed against
SDPA); the grader's :func:`~attnbook.exercises.run_check` does not.
"""

from __future__ import annotations

import functools
import math
import textwrap

import torch

from ..core import scaled_dot_product_attention
from ..sparse import block_sparse_attention
from . import register
from .common import call_student, generator

_ATOL = {torch.float32: 1e-5, torch.float16: 1e-4}
_BLOCK = 16  # attnbook.kernels.lab.BLOCK, without importing triton here


def _padded(gen, rows: int, cols: int, dtype, scale: float = 1.0) -> torch.Tensor:
    """``scale * randn(rows, cols)`` in ``dtype``, the view of a buffer whose extra 16
    rows and columns hold NaN."""
    room = torch.full((rows + 16, cols + 16), float("nan"), dtype=dtype)
    room[:rows, :cols] = (scale * torch.randn(rows, cols, generator=gen)).to(dtype)
    return room[:rows, :cols]


def _errors(got, exact, same_dtype) -> tuple[float, float]:
    """Max abs error of ``got`` and of PyTorch's ``same_dtype`` result against the
    float64 ``exact`` one, on the finite entries of ``exact``."""
    finite = torch.isfinite(exact)
    err = (got.double() - exact)[finite].abs().max().item() if finite.any() else 0.0
    err_pt = (
        (same_dtype.double() - exact)[finite].abs().max().item() if finite.any() else 0
    )
    return err, err_pt


def _rounding(exact, dtype) -> float:
    """The max abs error of ``exact`` merely rounded to ``dtype``, on its finite
    entries: what a perfect kernel that stores ``dtype`` errs."""
    finite = torch.isfinite(exact)
    if not finite.any():
        return 0.0
    return (exact.to(dtype).double() - exact)[finite].abs().max().item()


def _allowed(exact, same_dtype, dtype) -> float:
    """FlashAttention-2's bound: twice PyTorch's error in ``dtype``, plus the error of
    storing the exact result in ``dtype`` (as FlashAttention's tests add the rounding
    at the reference's size), plus a small ``atol``."""
    _, err_pt = _errors(same_dtype, exact, same_dtype)
    return 2 * err_pt + _rounding(exact, dtype) + _ATOL[dtype]


def _within_rule(got, exact, same_dtype, dtype) -> bool:
    """FlashAttention-2's rule: ``err <= 2 err_pytorch + rounding + atol``
    (:func:`_allowed`), infinities in the same places, no NaN."""
    if torch.isnan(got).any():
        return False
    if not torch.equal(torch.isinf(got), torch.isinf(exact)):
        return False
    err, _ = _errors(got, exact, same_dtype)
    return err <= _allowed(exact, same_dtype, dtype)


def _like(got, wrong, same_dtype, exact, dtype) -> bool:
    """``got`` equals the slip's result ``wrong`` (NaN where it has NaN), at the
    accuracy the rule grants."""
    if got.shape != wrong.shape:
        return False
    nan = torch.isnan(wrong)
    if not torch.equal(torch.isnan(got), nan):
        return False
    keep = ~nan & torch.isfinite(wrong)
    if not torch.equal(torch.isinf(got) & ~nan, torch.isinf(wrong) & ~nan):
        return False
    _, err_pt = _errors(same_dtype, exact, same_dtype)
    diff = (got.double() - wrong.double())[keep].abs()
    return not keep.any() or diff.max().item() <= 4 * err_pt + 10 * _ATOL[dtype]


def _note(got, slips, same_dtype, exact, dtype) -> str:
    for wrong, note in slips:
        if wrong is not None and _like(got, wrong, same_dtype, exact, dtype):
            return " " + note
    return ""


def _verdict(got, expected_shape, exact, same_dtype, dtype, what, slips, nan_note):
    """Fail with the first problem of ``got``: type, shape, a slip's signature, NaN,
    or the error against the rule."""
    assert isinstance(got, torch.Tensor), (
        f"{what}: the launcher returned {type(got).__name__}, not a tensor."
    )
    assert tuple(got.shape) == tuple(expected_shape), (
        f"{what}: expected shape {tuple(expected_shape)}, got {tuple(got.shape)}."
    )
    if _within_rule(got, exact, same_dtype, dtype):
        return
    note = _note(got, slips, same_dtype, exact, dtype)
    if torch.isnan(got).any() and not note:
        rows = torch.isnan(got).reshape(got.shape[0], -1).any(-1).nonzero()[:, 0]
        raise AssertionError(
            f"{what}: NaN in rows {rows[:6].tolist()}{'...' if len(rows) > 6 else ''}. "
            + nan_note(rows)
        )
    err, err_pt = _errors(got, exact, same_dtype)
    name = str(dtype).removeprefix("torch.")
    raise AssertionError(
        f"{what}: max error {err:.3g} against the float64 reference; PyTorch in {name} "
        f"errs {err_pt:.3g}, and a kernel may err at most twice that plus the "
        f"{_rounding(exact, dtype):.2g} of rounding the exact result to {name}, plus "
        f"{_ATOL[dtype]:g}: {_allowed(exact, same_dtype, dtype):.3g}." + note
    )


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _cost_report(student) -> str:
    """The after-pass report of every check here: the kernel in ``student``,
    ``functools.partial(launcher, kernel)``, compiled for the lab's GPUs with the
    launcher's tiles (:func:`attnbook.kernels.lab.cost_report`)."""
    from ..kernels import lab  # imports triton: only when a report is made

    launchers = {getattr(lab, name) for name in lab.GPU_CONSTEXPRS}
    is_partial = isinstance(student, functools.partial) and student.args
    kernel = student.args[0] if is_partial else None
    if not is_partial or student.func not in launchers or not hasattr(kernel, "fn"):
        return textwrap.fill(
            "No compile report: there is no kernel to report on (the check's "
            "argument is not functools.partial(<the lab's launcher>, <your "
            "@triton.jit kernel>)).",
            86,
        )
    return lab.cost_report(student.func, kernel)


# --------------------------------------------------------------------------------------
# 1. Row-wise softmax
# --------------------------------------------------------------------------------------
def _softmax_slips(x: torch.Tensor, dtype) -> list:
    cols = x.shape[1]
    block = 1 << max(0, cols - 1).bit_length()
    xf = x.double()
    padded = torch.cat([xf, xf.new_zeros(x.shape[0], block - cols)], 1)
    slips = [
        (
            (torch.exp(x.float()) / torch.exp(x.float()).sum(1, keepdim=True)).to(
                dtype
            ),
            "Your softmax does not subtract the row maximum: exp(x) overflows "
            "(float32 above x = 88, float16 above x = 11), inf / inf is NaN. Compute "
            "exp(x - max(x)), which is at most 1.",
        ),
        (
            (torch.exp(x.to(dtype)) / torch.exp(x.to(dtype)).sum(1, keepdim=True)),
            "Your softmax does not subtract the row maximum: exp(x) overflows "
            "(float32 above x = 88, float16 above x = 11), inf / inf is NaN. Compute "
            "exp(x - max(x)), which is at most 1.",
        ),
        (
            torch.softmax(padded, 1)[:, :cols],
            f"The {block - cols} padding lanes of a row of {cols} (BLOCK = {block}) "
            "count in your sum as exp(0 - max): load them with other=-float('inf'), "
            "so that exp gives 0 there.",
        ),
        (
            torch.exp(xf - xf.amax(1, keepdim=True)),
            "You return exp(x - max) without dividing by the row's sum.",
        ),
    ]
    return [(w.to(dtype) if w.dtype != dtype else w, n) for w, n in slips]


@register(
    "kernel-lab-softmax",
    after_pass=_cost_report,
    hint="one program per row: cols = tl.arange(0, BLOCK), load with mask=cols < "
    "n_cols and other=-inf, compute in float32, subtract tl.max(x, 0), divide exp by "
    "its tl.sum, store with the same mask.",
)
def _check_softmax(student) -> None:
    """``student(x)`` (the lab's launcher with the kernel) must equal ``torch.softmax(x,
    dim=-1)`` within FlashAttention-2's error rule, on rows whose widths are not powers
    of two, in float32 and float16, with entries large enough to overflow ``exp``."""
    gen = generator(250)
    cases = [  # (rows, cols, dtype, scale of the entries)
        (4, 100, torch.float32, 1.0),
        (3, 37, torch.float16, 1.0),
        (5, 64, torch.float32, 40.0),  # exp(x) overflows without the row max
        (2, 1, torch.float32, 1.0),
        (6, 300, torch.float16, 3.0),
        (3, 50, torch.float16, 20.0),
    ]
    for rows, cols, dtype, scale in cases:
        x = _padded(gen, rows, cols, dtype, scale)
        what = f"x of shape ({rows}, {cols}) in {_name(dtype)} (entries up to " + (
            f"{x.abs().max().item():.0f})"
        )
        got = call_student(student, f"softmax for {what}", x)
        exact = torch.softmax(x.double(), -1)
        same = torch.softmax(x.float(), -1).to(dtype)
        _verdict(
            got, x.shape, exact, same, dtype, what, _softmax_slips(x, dtype),
            lambda _: f"A row of {cols} read past its end (BLOCK = "
            f"{1 << max(0, cols - 1).bit_length()}: the lanes cols >= n_cols hold "
            "whatever follows, here NaN): mask the load with cols < n_cols.",
        )  # fmt: skip


# --------------------------------------------------------------------------------------
# 2. Tiled matrix product
# --------------------------------------------------------------------------------------
@register(
    "kernel-lab-matmul",
    after_pass=_cost_report,
    hint="program (i, j) owns C's tile rows i*BLOCK_M.., columns j*BLOCK_N..; a "
    "float32 tl.zeros accumulator; loop k0 over range(0, K, BLOCK_K), load the A and "
    "B tiles with masks rows < M & ks < K and ks < K & cols < N (other=0), acc += "
    "tl.dot(a, b); store acc in C's dtype with the mask rows < M & cols < N.",
)
def _check_matmul(student) -> None:
    """``student(a, b)`` must equal ``a @ b`` within FlashAttention-2's rule, on
    ragged shapes (no side a multiple of the 16-row tiles) in float32 and float16."""
    gen = generator(251)
    for M, K, N, dtype in [
        (16, 16, 16, torch.float32),
        (40, 33, 21, torch.float32),
        (1, 50, 17, torch.float16),
        (35, 70, 48, torch.float16),
        (20, 5, 3, torch.float32),
    ]:
        a = _padded(gen, M, K, dtype)
        b = _padded(gen, K, N, dtype)
        what = f"a ({M}, {K}) @ b ({K}, {N}) in {_name(dtype)}"
        got = call_student(student, what, a, b)
        exact = a.double() @ b.double()
        same = (a.float() @ b.float()).to(dtype)
        slips = [
            (
                (a.double() @ b.double()[:, :1].expand(K, N)),
                "Every column of your C is the first one: offset B's columns by "
                "the program's tile, j * BLOCK_N + tl.arange(0, BLOCK_N).",
            ),
        ]
        _verdict(
            got, (M, N), exact, same, dtype, what, slips,
            lambda _: f"K = {K} is not a multiple of BLOCK_K = {_BLOCK}: the last step "
            "of your k-loop read past column K of a (and row K of b); mask those "
            "loads with ks < K and other=0.",
        )  # fmt: skip


# --------------------------------------------------------------------------------------
# 3. FlashAttention-2 forward
# --------------------------------------------------------------------------------------
def _visible(L: int, S: int, causal: bool) -> torch.Tensor:
    """``(L, S)`` bool: query ``i`` sees key ``j`` (bottom-right causal)."""
    allowed = torch.ones(L, S, dtype=torch.bool)
    if causal:
        allowed = torch.arange(S)[None, :] <= torch.arange(L)[:, None] + S - L
    return allowed


def _tiled(q, k, v, allowed, scale, rescale_acc=True, rescale_l=True):
    """The online softmax over key tiles of 16, in float64, optionally with one of its
    two rescalings left out: what a kernel with that slip computes."""
    q, k, v = q.double(), k.double(), v.double()
    L, S = allowed.shape
    m = torch.full((L,), -math.inf, dtype=torch.float64)
    l_i = torch.zeros(L, dtype=torch.float64)
    acc = torch.zeros(L, v.shape[1], dtype=torch.float64)
    for start in range(0, S, _BLOCK):
        s = (q @ k[start : start + _BLOCK].T) * scale
        s = s.masked_fill(~allowed[:, start : start + _BLOCK], -math.inf)
        m_new = torch.maximum(m, s.amax(1))
        shift = torch.where(torch.isinf(m_new), 0.0, m_new)
        p = torch.exp(s - shift[:, None])
        alpha = torch.exp(m - shift)
        l_i = (l_i * alpha if rescale_l else l_i) + p.sum(1)
        acc = (acc * alpha[:, None] if rescale_acc else acc) + p @ v[
            start : start + _BLOCK
        ]
        m = m_new
    return acc / torch.where(l_i > 0, l_i, 1.0)[:, None]


def _bound_only(L: int, S: int) -> torch.Tensor:
    """``(L, S)`` bool: the keys a causal kernel that bounds its loop but masks nothing
    lets query ``i`` see (every key before its tile's bound)."""
    bound = torch.clamp((torch.arange(L) // _BLOCK + 1) * _BLOCK + S - L, max=S)
    return torch.arange(S)[None, :] < bound[:, None]


def _attention_cases(gen, cases):
    for L, S, E, causal, dtype in cases:
        q, k, v = (_padded(gen, n, E, dtype) for n in (L, S, S))
        yield (L, S, E, causal, dtype), q, k, v


def _reference(q, k, v, causal, scale):
    """Output (float64 and in the inputs' dtype) and float64 log-sum-exp."""
    exact = scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=causal, scale=scale
    )
    same = scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=causal, scale=scale
    ).to(q.dtype)
    scores = (q.double() @ k.double().T * scale).masked_fill(
        ~_visible(q.shape[0], k.shape[0], causal), -math.inf
    )
    return exact, same, torch.logsumexp(scores, -1)


def _needed_tiles(L: int, S: int, causal: bool) -> torch.Tensor:
    """``(query tiles, key tiles)`` bool: the key tiles a query tile has a visible key
    in."""
    allowed = _visible(L, S, causal)
    tiles_q, tiles_k = math.ceil(L / _BLOCK), math.ceil(S / _BLOCK)
    padded = torch.zeros(tiles_q * _BLOCK, tiles_k * _BLOCK, dtype=torch.bool)
    padded[:L, :S] = allowed
    return padded.reshape(tiles_q, _BLOCK, tiles_k, _BLOCK).any(3).any(1)


def _empty_rows_note(L, S, causal):
    def note(rows) -> str:
        empty = (~_visible(L, S, causal).any(1)).nonzero()[:, 0]
        if causal and len(empty) and set(rows.tolist()) <= set(empty.tolist()):
            return (
                f"With L = {L} > S = {S}, causal queries 0..{len(empty) - 1} see no "
                "key: their max stays -inf and exp(-inf - (-inf)) is NaN. Shift by 0 "
                "where m is -inf, and store zeros and lse = -inf for them."
            )
        return (
            f"The last, ragged tile read past the end of q (L = {L}) or of k, v (S = "
            f"{S}), which hold NaN there: mask those loads (rows < L, keys < S) with "
            "other=0, and mask the scores of keys >= S with -inf."
        )

    return note


@register(
    "kernel-lab-attention-forward",
    after_pass=_cost_report,
    hint="one program per query tile: load q once; m = -inf, l = 0, acc = 0 (float32); "
    "for each key tile up to min(S, (pid + 1) * BLOCK_M + S - L) when CAUSAL: s = "
    "tl.dot(q, tl.trans(k)) * scale, -inf where keys >= S or (CAUSAL) key > row + S - "
    "L; m_new = max(m, rowmax s); alpha = exp(m - m_new); l = l * alpha + rowsum p; "
    "acc = acc * alpha + p v. Then out = acc / l and lse = m + log l (0 and -inf for "
    "rows with l = 0).",
)
def _check_attention_forward(student) -> None:
    """``student(q, k, v, is_causal, scale, record_tiles=True)`` must return ``(out,
    lse)`` equal to attnbook's attention and its log-sum-exp within FlashAttention-2's
    rule, on ragged lengths with ``L != S``, causal (bottom-right) and not, in float32
    and float16; a causal kernel must not load key tiles that no query of its tile
    sees (checked under the interpreter)."""
    gen = generator(252)
    cases = [
        (37, 37, 16, True, torch.float32),
        (20, 45, 32, True, torch.float32),
        (33, 50, 16, False, torch.float16),
        (45, 20, 16, True, torch.float16),  # L > S: the first 25 queries see no key
        (1, 1, 16, False, torch.float32),
        (48, 48, 32, True, torch.float16),
    ]
    for (L, S, E, causal, dtype), q, k, v in _attention_cases(gen, cases):
        scale = 1 / math.sqrt(E) * (1.5 if dtype == torch.float32 else 1.0)
        what = f"L={L}, S={S}, E={E}, is_causal={causal}, {_name(dtype)}"
        got = call_student(student, what, q, k, v, causal, scale, record_tiles=True)
        assert isinstance(got, (tuple, list)) and len(got) == 3, (
            f"{what}: the launcher must return (out, lse, tiles), got {got!r:.80}."
        )
        out, lse, tiles = got
        exact, same, lse_exact = _reference(q, k, v, causal, scale)
        allowed = _visible(L, S, causal)
        slips = [
            (
                _reference(q, k, v, False, scale)[0].to(dtype) if causal else None,
                "Your causal kernel lets every query see every key: mask the scores "
                "of keys j > i + S - L with -inf (CAUSAL is a tl.constexpr flag).",
            ),
            (
                scaled_dot_product_attention(
                    q.double(),
                    k.double(),
                    v.double(),
                    scale=scale,
                    attn_mask=torch.ones(L, S, dtype=torch.bool).tril(),
                ).to(dtype)
                if causal and L != S
                else None,
                "Your causal mask is aligned top-left (key j <= i): attnbook's is "
                "bottom-right, j <= i + S - L, as FlashAttention-2's.",
            ),  # fmt: skip
            (
                _tiled(q, k, v, _bound_only(L, S), scale).to(dtype) if causal else None,
                "Your loop stops at the causal bound, but the tile on the diagonal is "
                "not masked: its queries see keys after their own. Set the scores of "
                "keys j > i + S - L to -inf (tl.where) in every tile.",
            ),
            (
                _tiled(q, k, v, allowed, scale, rescale_acc=False).to(dtype),
                "Your accumulator is not rescaled: when a key tile raises the row "
                "max from m to m_new, acc (like l) must be multiplied by alpha = "
                "exp(m - m_new) before p @ v is added.",
            ),
            (
                _tiled(q, k, v, allowed, scale, rescale_l=False).to(dtype),
                "Your normalizer l is not rescaled: l = l * alpha + rowsum(p), with "
                "alpha = exp(m - m_new), as for acc.",
            ),
            (
                scaled_dot_product_attention(
                    q.double(), k.double(), v.double(), is_causal=causal, scale=1.0
                ).to(dtype),
                "Your scores miss the scale: s = tl.dot(q, tl.trans(k)) * scale.",
            ),
        ]
        _verdict(
            out, (L, E), exact, same, dtype, f"out for {what}", slips,
            _empty_rows_note(L, S, causal),
        )  # fmt: skip
        assert isinstance(lse, torch.Tensor) and lse.shape == (L,), (
            f"lse for {what}: expected a tensor of shape ({L},), got {lse!r:.60}."
        )
        ok = torch.equal(torch.isinf(lse), torch.isinf(lse_exact)) and not (
            torch.isnan(lse).any()
        )
        finite = torch.isfinite(lse_exact)
        err = (lse.double() - lse_exact)[finite].abs().max().item() if ok else 0
        if not ok or err > 1e-3 * max(1.0, lse_exact[finite].abs().max().item()):
            note = ""
            if ok and torch.allclose(
                lse.double()[finite], lse_exact[finite] / math.log(2), atol=1e-3
            ):
                note = " Your lse is in log2 units: store it in natural log, m + ln l."
            raise AssertionError(
                f"lse for {what}: expected the log-sum-exp of each row's scaled "
                "scores (m + log l; -inf for a query that sees no key), max error "
                f"{err:.3g}, or -inf/NaN in the wrong places." + note
            )
        if tiles is not None and causal:
            needed = _needed_tiles(L, S, causal)
            extra = (tiles & ~needed).nonzero()
            if len(extra):
                program, tile = extra[0].tolist()
                raise AssertionError(
                    f"{what}: your values are right, but program {program} (queries "
                    f"{program * _BLOCK}..) loaded key tile {tile}, whose keys none of "
                    "its queries may see: bound the loop over key tiles at min(S, (pid "
                    "+ 1) * BLOCK_M + S - L), the causal bound that skips the upper "
                    "triangle (half the work)."
                )


# --------------------------------------------------------------------------------------
# 4. Backward pass for dK and dV
# --------------------------------------------------------------------------------------
def _gradients(q, k, v, do, causal, scale):
    """float64 ``(out, lse, dk, dv)`` by autograd, and ``(dk, dv)`` from float32
    autograd in the inputs' dtype (PyTorch's own error)."""
    found = []
    for dtype in (torch.float64, torch.float32):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out = scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale)
        out.backward(do.to(dtype))
        found.append((out.detach(), leaves[1].grad, leaves[2].grad))
    (out, dk, dv), (_, dk32, dv32) = found
    scores = (q.double() @ k.double().T * scale).masked_fill(
        ~_visible(q.shape[0], k.shape[0], causal), -math.inf
    )
    return out, torch.logsumexp(scores, -1), dk, dv, dk32.to(q.dtype), dv32.to(q.dtype)


def _dkdv(q, k, v, do, out, lse, allowed, scale, delta=True):
    """``(dk, dv)`` in float64 by the backward formulas, with the probabilities rebuilt
    from ``lse`` where ``allowed``: a kernel's slips are other ``allowed`` masks or
    ``delta=False``."""
    q, k, v, do, out = (t.double() for t in (q, k, v, do, out))
    s = q @ k.T * scale
    keep = allowed & torch.isfinite(lse)[:, None]
    p = torch.where(keep, torch.exp(s - torch.where(keep, lse[:, None], 0.0)), 0.0)
    ds = p * (do @ v.T - ((do * out).sum(-1, keepdim=True) if delta else 0.0))
    return ds.T @ q * scale, p.T @ do


@register(
    "kernel-lab-attention-backward",
    after_pass=_cost_report,
    hint="one program per key tile: load k, v once; dk = dv = 0 (float32); for each "
    "query tile (from the first that sees the tile, when CAUSAL): p = exp(s - lse) "
    "with s = scale q k^T masked to -inf; dv += p^T do; dp = do v^T; ds = p * (dp - "
    "delta); dk += ds^T q * scale. Store dk and dv with the mask keys < S.",
)
def _check_attention_backward(student) -> None:
    """``student(q, k, v, out, lse, grad_out, is_causal, scale)`` must return ``(dk,
    dv)`` equal to autograd's within FlashAttention-2's rule (PyTorch's float32
    gradients rounded to the inputs' dtype stand in for its error)."""
    gen = generator(253)
    cases = [
        (37, 37, 16, True, torch.float32),
        (20, 45, 32, True, torch.float32),
        (33, 50, 16, False, torch.float16),
        (45, 20, 16, True, torch.float16),
    ]
    for (L, S, E, causal, dtype), q, k, v in _attention_cases(gen, cases):
        scale = 1 / math.sqrt(E)
        do = _padded(gen, L, E, dtype)
        out, lse, dk, dv, dk_pt, dv_pt = _gradients(q, k, v, do, causal, scale)
        what = f"L={L}, S={S}, E={E}, is_causal={causal}, {_name(dtype)}"
        outs = _padded(gen, L, E, dtype)
        outs.copy_(out.to(dtype))
        got = call_student(student, what, q, k, v, outs, lse.float(), do, causal, scale)
        assert isinstance(got, (tuple, list)) and len(got) == 2, (
            f"{what}: the launcher must return (dk, dv), got {got!r:.80}."
        )
        visible = _visible(L, S, causal)
        wrong = {
            "dense": _dkdv(q, k, v, do, out, lse, torch.ones_like(visible), scale),
            "no delta": _dkdv(q, k, v, do, out, lse, visible, scale, delta=False),
        }
        for index, (name, g, exact, same) in enumerate(
            (("dk", got[0], dk, dk_pt), ("dv", got[1], dv, dv_pt))
        ):
            slips = [
                (
                    wrong["dense"][index].to(dtype) if causal else None,
                    f"Your {name} ignores the causal mask: p must be 0 (not exp(s - "
                    "lse)) where key j > query i + S - L.",
                ),
                (
                    (exact / scale).to(dtype) if name == "dk" else None,
                    "Your dk lacks the scale: the scores are scale * q k^T, so dk = "
                    "ds^T q * scale.",
                ),
                (
                    wrong["no delta"][index].to(dtype) if name == "dk" else None,
                    "Your ds is p * dp: subtract delta = rowsum(dO * O) first, ds = p "
                    "* (dp - delta[:, None]).",
                ),
            ]
            _verdict(
                g, (S, E), exact, same, dtype, f"{name} for {what}", slips,
                lambda _, n=name: f"Your {n} has NaN: the ragged last tile of q, do "
                f"(L = {L}) or of k, v (S = {S}) read past the end (NaN there); mask "
                "those loads with other=0, and queries that see no key (lse = -inf) "
                "must give p = 0.",
            )  # fmt: skip


# --------------------------------------------------------------------------------------
# 5. Block-sparse forward
# --------------------------------------------------------------------------------------
def _expand(layout: torch.Tensor, L: int, S: int) -> torch.Tensor:
    """A block layout as the ``(L, S)`` bool mask of the keys each query sees."""
    rows = layout.repeat_interleave(_BLOCK, 0)[:L]
    return rows.repeat_interleave(_BLOCK, 1)[:, :S]


@register(
    "kernel-lab-block-sparse",
    after_pass=_cost_report,
    hint="one program per query block: for idx in range(tl.load(ROW_PTR + block), "
    "tl.load(ROW_PTR + block + 1)), the key block is tl.load(COL_IDX + idx); run the "
    "online-softmax update of the attention kernel on that block only (keys >= S "
    "masked), then out = acc / l and lse = m + log l (zeros, -inf for an empty row).",
)
def _check_block_sparse(student) -> None:
    """``student(q, k, v, layout, scale, record_tiles=True)`` must equal
    :func:`attnbook.sparse.block_sparse_attention` within FlashAttention-2's rule, and
    never load a key block its query block's row of the layout leaves out (the values
    of those blocks are NaN, and the interpreter records the loads)."""
    gen = generator(254)
    for L, S, E, dtype, density in [
        (40, 40, 16, torch.float32, 0.5),
        (64, 50, 32, torch.float16, 0.4),
        (33, 70, 16, torch.float32, 0.3),
    ]:
        q, k, v = (_padded(gen, n, E, dtype) for n in (L, S, S))
        blocks = (math.ceil(L / _BLOCK), math.ceil(S / _BLOCK))
        layout = torch.rand(blocks, generator=gen) < density
        layout[0, 0] = True
        layout[:, -1] = False  # no query block reads the ragged last key block...
        layout[-1, :] = False  # ...and the last query block reads none
        if blocks[1] > 2:
            layout[1, -2] = True
        clean_k, clean_v = k.clone(), v.clone()
        skipped = ~layout.any(0)
        for block in skipped.nonzero()[:, 0].tolist():  # never-read blocks are NaN
            k[block * _BLOCK : (block + 1) * _BLOCK] = float("nan")
            v[block * _BLOCK : (block + 1) * _BLOCK] = float("nan")
        scale = 1 / math.sqrt(E)
        what = f"L={L}, S={S}, E={E}, {_name(dtype)}, layout {layout.int().tolist()}"
        got = call_student(student, what, q, k, v, layout, scale, record_tiles=True)
        assert isinstance(got, (tuple, list)) and len(got) == 3, (
            f"{what}: the launcher must return (out, lse, tiles), got {got!r:.80}."
        )
        out, lse, tiles = got

        def reference(x, y, z, mask):
            return block_sparse_attention(x, y, z, mask, _BLOCK, scale=scale)

        exact = reference(q.double(), clean_k.double(), clean_v.double(), layout)
        same = reference(q.float(), clean_k.float(), clean_v.float(), layout).to(dtype)
        dense = torch.ones_like(layout)
        slips = [
            (
                reference(q.double(), clean_k.double(), clean_v.double(), dense).to(
                    dtype
                ),
                "Your kernel attends to every key block: walk only COL_IDX[ROW_PTR[i]"
                ":ROW_PTR[i + 1]].",
            ),
            (
                _tiled(
                    q, clean_k, clean_v, _expand(layout, L, S), scale, rescale_acc=False
                ).to(dtype),
                "Your accumulator is not rescaled: when a key block raises the row "
                "max from m to m_new, acc (like l) must be multiplied by alpha = "
                "exp(m - m_new) before p @ v is added.",
            ),
        ]
        _verdict(
            out, (L, E), exact, same, dtype, f"out for {what}", slips,
            lambda _: "Your kernel read key blocks the layout leaves out (they hold "
            f"NaN here), or rows past the end of q, k, v (L = {L}, S = {S}): walk "
            "only the blocks COL_IDX lists for the row, and mask the ragged tile.",
        )  # fmt: skip
        if tiles is not None:
            extra = (tiles & ~layout).nonzero()
            if len(extra):
                row, block = extra[0].tolist()
                raise AssertionError(
                    f"{what}: query block {row} loaded key block {block}, which its "
                    "row of the layout leaves out: a block-sparse kernel skips those "
                    "(they are the saving)."
                )
        assert isinstance(lse, torch.Tensor) and lse.shape == (L,), (
            f"lse for {what}: expected a tensor of shape ({L},), got {lse!r:.60}."
        )
