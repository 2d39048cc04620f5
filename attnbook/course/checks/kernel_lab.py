"""Checks for the kernel lab: the student's Triton kernels, launched by
:mod:`attnbook.kernels.lab`, against attnbook's references.

Each check receives the launcher bound to the student's kernel
(``functools.partial(lab.softmax, softmax_kernel)``), so in the grader the kernel runs
where the student's code runs and only tensors cross. Every input lies in a buffer of
its own whose guard band holds NaN (16 rows before and after it, and extra columns
that give each tensor a row stride of its own, drawn per run), so a load that leaves
its tensor, or walks it with another tensor's stride, shows up as NaN; under Triton's
interpreter the launchers also refuse any load outside the tensors and any store
outside the outputs, saying where and why. Accuracy follows FlashAttention-2's rule:
the error against a float64 reference is at most twice the error of PyTorch in the
kernel's dtype, plus a small absolute slack, up to a thousand keys or queries, where
float16 accumulators fail it.

The attention checks draw their shapes from the check's generator (a secret seed in
the grader): sixteen causal cases whose ``S - L`` takes every residue modulo the 16-row
tiles, so a causal bound off by one meets the case where it drops or adds a tile. They
also count the work each program does (:func:`attnbook.kernels.lab.attention_forward`'s
``record_tiles``): the tiles it loads and the ``tl.dot`` calls it runs on each, so a
kernel that masks the loads of a tile it should skip still fails.

After a pass, ``attnbook.exercises.check`` prints what the kernel would cost on a T4, an
A100 and an H100 (:func:`attnbook.kernels.lab.cost_report`: registers, spills and shared
memory with the tiles a GPU would run, and on a GPU the forward pass timed against
SDPA); the grader's :func:`~attnbook.course.checks.run_check` does not.
"""

from __future__ import annotations

import functools
import math
import textwrap

import torch

from ...core import scaled_dot_product_attention
from ...sparse import block_sparse_attention
from . import register
from .common import call_student, generator
from .library import forbid

_ATOL = {torch.float32: 1e-5, torch.float16: 1e-4}
_BLOCK = 16  # attnbook.kernels.lab.BLOCK, without importing triton here
# What every rung's answer may use: the check cell wraps it in a launcher of
# attnbook.kernels.lab, which does not count against it.
_KERNEL_ONLY = forbid(
    "attnbook",
    why="The answer is a Triton kernel that the grader compiles from its source "
    "alone: it may use triton.language and its own @triton.jit helpers, nothing from "
    "attnbook.",
    harness=("attnbook.kernels.lab",),
)


_GUARD = 16  # rows of NaN before and after each input, and columns at least


def _padded(
    gen, rows: int, cols: int, dtype, taken: set, scale: float = 1.0, shift=0.0
) -> torch.Tensor:
    """``shift + scale * randn(rows, cols)`` in ``dtype``, the view of a buffer of its
    own whose guard band holds NaN: 16 rows before and after it, and 16 to 47 extra
    columns, drawn so that its row stride is none of ``taken`` (it joins them)."""
    width = cols + int(torch.randint(_GUARD, 3 * _GUARD, (1,), generator=gen))
    while width in taken:
        width += 1
    taken.add(width)
    room = torch.full((rows + 2 * _GUARD, width), float("nan"), dtype=dtype)
    view = room[_GUARD : _GUARD + rows, :cols]
    view.copy_((shift + scale * torch.randn(rows, cols, generator=gen)).to(dtype))
    return view


def _draw(gen, low: int, high: int) -> int:
    """A random int in ``low..high`` (both included)."""
    return int(torch.randint(low, high + 1, (1,), generator=gen))


def _run(student, what: str, *args, **kwargs):
    """:func:`call_student`, with the launcher's own verdicts (a load or a store
    outside the tensors) prefixed by the case."""
    try:
        return call_student(student, what, *args, **kwargs)
    except AssertionError as err:
        if str(err).startswith(what):
            raise
        raise AssertionError(f"{what}: {err}") from None


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
    """The note of the slip whose result ``got`` is like, leaving out the slips this
    case cannot tell from the right result; a second slip alike here is named too."""
    right, found = exact.to(dtype), []
    for wrong, note in slips() if callable(slips) else slips:
        if wrong is None or note in found:
            continue
        if _like(right, wrong, same_dtype, exact, dtype):  # this case cannot tell
            continue
        if _like(got, wrong, same_dtype, exact, dtype):
            found.append(note)
    if len(found) > 1:
        return f" {found[0]} (Or, alike on this case: {found[1]})"
    return " " + found[0] if found else ""


def _verdict(
    got, expected_shape, exact, same_dtype, dtype, what, slips, nan_note, otherwise=None
):
    """Fail with the first problem of ``got``: type, shape, a slip's signature, NaN,
    or the error against the rule. ``slips`` (``(wrong result, note)`` pairs, or a
    function that returns them, called only on a failure) name the mistake;
    ``otherwise``, a function of the error's ratio to the rule's bound, gives the
    note on an error that none of them explains."""
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
        f"{_ATOL[dtype]:g}: {_allowed(exact, same_dtype, dtype):.3g}."
        + (note or _otherwise(otherwise, err / _allowed(exact, same_dtype, dtype)))
    )


def _otherwise(note, ratio: float) -> str:
    text = note(ratio) if note is not None else ""
    return " " + text if text else ""


def _float16_note(dtype, sums: str, accumulators: str):
    """The note on a float16 error a few times the rule's bound at most: what float16
    accumulators give, rounding at every tile of the ``sums``."""

    def note(ratio: float) -> str:
        if dtype != torch.float16 or ratio > 8:
            return ""
        return (
            f"An error this near the rule in float16 is what float16 accumulators "
            f"give, rounded at each of the {sums} summed here: keep {accumulators} in "
            "float32 (tl.zeros(..., tl.float32)) and round once, when storing."
        )

    return note


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _cost_report(student) -> str:
    """The after-pass report of every check here: the kernel in ``student``,
    ``functools.partial(launcher, kernel)``, compiled for the lab's GPUs with the
    launcher's tiles (:func:`attnbook.kernels.lab.cost_report`)."""
    from ...kernels import lab  # imports triton: only when a report is made

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
    library=_KERNEL_ONLY,
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
        x = _padded(gen, rows, cols, dtype, set(), scale)
        what = f"x of shape ({rows}, {cols}) in {_name(dtype)} (entries up to " + (
            f"{x.abs().max().item():.0f})"
        )
        got = _run(student, f"softmax for {what}", x)
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
    library=_KERNEL_ONLY,
    after_pass=_cost_report,
    hint="program (i, j) owns C's tile rows i*BLOCK_M.., columns j*BLOCK_N..; a "
    "float32 tl.zeros accumulator; loop k0 over range(0, K, BLOCK_K), load the A and "
    "B tiles with masks rows < M & ks < K and ks < K & cols < N (other=0), acc += "
    "tl.dot(a, b); store acc in C's dtype with the mask rows < M & cols < N.",
)
def _check_matmul(student) -> None:
    """``student(a, b, record_tiles=True)`` must return ``(c, record)`` with ``c``
    equal to ``a @ b`` within FlashAttention-2's rule, on ragged shapes (no side a
    multiple of the 16-row tiles) in float32 and float16, its loads inside ``a`` and
    ``b`` (under the interpreter) and no ``tl.dot`` past ``K``."""
    gen = generator(251)
    for M, K, N, dtype in [
        (16, 16, 16, torch.float32),
        (40, 33, 21, torch.float32),
        (1, 50, 17, torch.float16),
        (35, 70, 48, torch.float16),
        (20, 5, 3, torch.float32),
    ]:
        taken: set[int] = set()
        a = _padded(gen, M, K, dtype, taken)
        b = _padded(gen, K, N, dtype, taken)
        what = f"a ({M}, {K}) @ b ({K}, {N}) in {_name(dtype)}"
        got = _run(student, what, a, b, record_tiles=True)
        assert isinstance(got, (tuple, list)) and len(got) == 2, (
            f"{what}: the launcher must return (c, record), got {got!r:.80}."
        )
        got, record = got
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
            "of your k loop read past column K of a (and row K of b); mask those "
            "loads with ks < K and other=0.",
        )  # fmt: skip
        past = record["dots"][:, -1].nonzero()[:, 0] if record is not None else []
        if len(past):
            i, j = divmod(int(past[0]), math.ceil(N / _BLOCK))
            raise AssertionError(
                f"{what}: your values are right, but program ({i}, {j}) ran tl.dot on "
                f"a step of the k loop past K = {K}, on masked tiles: loop k0 over "
                "range(0, K, BLOCK_K)."
            )


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


def _bound_only(L: int, S: int, off: int = 0) -> torch.Tensor:
    """``(L, S)`` bool: the keys of the key tiles a causal loop bounded at ``min(S,
    (pid + 1) * BLOCK_M + S - L + off)`` walks for query ``i``: what its tile sees
    when the kernel masks nothing but the keys past ``S``."""
    bound = torch.clamp((torch.arange(L) // _BLOCK + 1) * _BLOCK + S - L + off, max=S)
    end = torch.clamp(-(-bound // _BLOCK) * _BLOCK, min=0)  # whole tiles
    return torch.arange(S)[None, :] < end[:, None]


def _walked_queries(L: int, S: int, off: int = 0) -> torch.Tensor:
    """``(L, S)`` bool: the queries of the query tiles a backward loop walks for key
    ``j`` when it starts at ``max(0, n0 - (S - L) + off)`` rounded down to a tile,
    ``n0`` the first key of ``j``'s tile."""
    first = torch.arange(S) // _BLOCK * _BLOCK - (S - L) + off
    lo = torch.clamp(first, min=0) // _BLOCK * _BLOCK
    return torch.arange(L)[:, None] >= lo[None, :]


def _attention_shapes(gen, long_case: tuple) -> list[tuple]:
    """The ``(L, S, E, causal, dtype, shift of v)`` cases of one check run, drawn from
    ``gen``, in float32 and float16 by turns:

    * sixteen causal ones whose ``S - L`` takes every residue modulo the 16-row tiles
      (a causal bound off by one drops or adds a key tile for one residue only), from
      -16 to -1, so the last row of the first query tile (``L >= 17``: a full one)
      sees at most 15 keys and a key dropped from it shows;
    * two causal ones with ``L <= S``, ``S - L`` below 16 and from 16 to 40 (a
      backward loop that does not clamp its first query at 0 starts below it);
    * two non-causal ones whose last key tile is ragged, one query against one key,
      and ``long_case``."""
    cases = []
    for i, residue in enumerate(torch.randperm(_BLOCK, generator=gen).tolist()):
        L = _draw(gen, 17, 56)
        dtype = (torch.float32, torch.float16)[i % 2]
        cases.append((L, L + residue - _BLOCK, (16, 32, 64)[_draw(gen, 0, 2)], True,
                      dtype, 0.0))  # fmt: skip
    for i, gap in enumerate((_draw(gen, 0, 15), _draw(gen, 16, 40))):
        L = _draw(gen, 1, 40)
        cases.append((L, L + gap, 32, True, (torch.float16, torch.float32)[i], 0.0))
    for dtype in (torch.float16, torch.float32):
        S = _BLOCK * _draw(gen, 1, 3) + _draw(gen, 1, _BLOCK - 1)
        cases.append((_draw(gen, 1, 60), S, 16, False, dtype, 0.0))
    return cases + [(1, 1, 16, False, torch.float32, 0.0), long_case]


def _long_forward(gen) -> tuple:
    """A short query tile against a thousand keys or more, in float16, the values near
    1 (as a trained model's often are), so that a float16 accumulator's rounding, which
    grows with the keys summed, breaks FlashAttention-2's rule."""
    causal = bool(_draw(gen, 0, 1))
    return (_draw(gen, 17, 48), _draw(gen, 1000, 1100), 16, causal, torch.float16, 1.0)


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


def _zero_keys(k, v):
    """``k`` and ``v`` in float64, padded with zero rows to whole tiles: what a kernel
    that loads the ragged last tile with ``other=0`` and does not mask its scores
    attends to."""
    pad = -k.shape[0] % _BLOCK
    extra = k.new_zeros(pad, k.shape[1], dtype=torch.float64)
    return torch.cat([k.double(), extra]), torch.cat([v.double(), extra])


_KEYS_PAST_S = (
    "The keys past S in your last, ragged key tile (loaded as 0) count, with score 0: "
    "set the scores of keys >= S to -inf (tl.where), not only their loads to 0."
)


def _needed_tiles(L: int, S: int, causal: bool) -> torch.Tensor:
    """``(query tiles, key tiles)`` bool: the key tiles a query tile has a visible key
    in."""
    allowed = _visible(L, S, causal)
    tiles_q, tiles_k = math.ceil(L / _BLOCK), math.ceil(S / _BLOCK)
    padded = torch.zeros(tiles_q * _BLOCK, tiles_k * _BLOCK, dtype=torch.bool)
    padded[:L, :S] = allowed
    return padded.reshape(tiles_q, _BLOCK, tiles_k, _BLOCK).any(3).any(1)


def _check_lse(lse, lse_exact, what) -> None:
    """``lse`` must equal the float64 log-sum-exp, ``-inf`` where it is."""
    L = lse_exact.shape[0]
    assert isinstance(lse, torch.Tensor) and lse.shape == (L,), (
        f"lse for {what}: expected a tensor of shape ({L},), got {lse!r:.60}."
    )
    ok = torch.equal(torch.isinf(lse), torch.isinf(lse_exact)) and not (
        torch.isnan(lse).any()
    )
    finite = torch.isfinite(lse_exact)
    some = ok and bool(finite.any())
    err = (lse.double() - lse_exact)[finite].abs().max().item() if some else 0.0
    top = lse_exact[finite].abs().max().item() if finite.any() else 0.0
    if not ok or err > 1e-3 * max(1.0, top):
        note = ""
        if ok and torch.allclose(
            lse.double()[finite], lse_exact[finite] / math.log(2), atol=1e-3
        ):
            note = " Your lse is in log2 units: store it in natural log, m + ln l."
        raise AssertionError(
            f"lse for {what}: expected the log-sum-exp of each row's scaled scores (m "
            "+ log l; -inf for a query that sees no key), max error "
            f"{err:.3g}, or -inf/NaN in the wrong places." + note
        )


_WASTE = ("loaded", "dot", "past", "twice")  # the order a check reports them in


def _work(record, needed: torch.Tensor, found: dict, what: str) -> None:
    """Add to ``found`` (by kind, the first case's only) the waste in a launcher's
    ``record`` of each program's work, as ``(what, program, tile, times)``: a tile it
    ``"loaded"`` but does not need, one it ran a ``"dot"`` on, a dot ``"past"`` the
    last tile, a tile loaded ``"twice"`` or more."""
    if record is None:
        return
    assert isinstance(record, dict) and {"loads", "dots"} <= set(record), (
        f"{what}: the launcher's record of the work must be a dict with loads and "
        f"dots, got {record!r:.80}."
    )
    loads, dots = record["loads"], record["dots"]
    for kind, where in zip(_WASTE, (
        (loads > 0) & ~needed,
        (dots[:, :-1] > 0) & ~needed,
        dots[:, -1:] > 0,
        loads > 1,
    )):  # fmt: skip
        hits = where.nonzero()
        if len(hits) and kind not in found:
            program, tile = hits[0].tolist()
            times = int(loads[program, min(tile, loads.shape[1] - 1)])
            found[kind] = (what, program, tile, times)


def _first_waste(found: dict) -> tuple | None:
    """The waste a check reports of all it found: a tile that must be skipped before
    a tile read twice."""
    return next(((kind, *found[kind]) for kind in _WASTE if kind in found), None)


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


_BOUND = (
    "bound the loop over key tiles at min(S, (pid + 1) * BLOCK_M + S - L), the causal "
    "bound that skips the upper triangle (half the work)."
)


def _forward_waste(found) -> str:
    kind, what, program, tile, times = found
    who = f"program {program} (queries {program * _BLOCK}..)"
    if kind == "loaded":
        return (
            f"{what}: your values are right, but {who} loaded key tile {tile}, whose "
            f"keys none of its queries may see: {_BOUND}"
        )
    if kind == "dot":
        return (
            f"{what}: your values are right, but {who} ran tl.dot on key tile {tile}, "
            "whose keys none of its queries may see (masking its loads does not skip "
            f"the work): {_BOUND}"
        )
    if kind == "past":
        return (
            f"{what}: your values are right, but {who} ran tl.dot on a key tile past "
            "S: loop over range(0, hi, BLOCK_N) with hi at most S."
        )
    return (
        f"{what}: your values are right, but {who} loaded key tile {tile} {times} "
        "times: FlashAttention-2 reads each key tile once per query tile, rescaling "
        "acc and l by alpha = exp(m - m_new) when the row max grows (the online "
        "softmax), where a first pass for the maxima reads K twice."
    )


@register(
    "kernel-lab-attention-forward",
    library=_KERNEL_ONLY,
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
    lse, record)``, ``out`` and ``lse`` equal to attnbook's attention and its
    log-sum-exp within FlashAttention-2's rule, on the shapes of
    :func:`_attention_shapes` (ragged, ``L != S``, causal (bottom-right) and not,
    float32 and float16, a thousand keys in float16); each program must load each key
    tile it needs once, and neither load nor run ``tl.dot`` on a key tile that no query
    of its tile sees (the record, read under the interpreter)."""
    gen, waste = generator(252), {}
    for L, S, E, causal, dtype, shift in _attention_shapes(gen, _long_forward(gen)):
        taken: set[int] = set()
        q, k = (_padded(gen, n, E, dtype, taken) for n in (L, S))
        v = _padded(gen, S, E, dtype, taken, shift=shift)
        scale = 1 / math.sqrt(E) * (1.5 if dtype == torch.float32 else 1.0)
        what = f"L={L}, S={S}, E={E}, is_causal={causal}, {_name(dtype)}"
        got = _run(student, what, q, k, v, causal, scale, record_tiles=True)
        assert isinstance(got, (tuple, list)) and len(got) == 3, (
            f"{what}: the launcher must return (out, lse, record), got {got!r:.80}."
        )
        out, lse, record = got
        exact, same, lse_exact = _reference(q, k, v, causal, scale)

        def slips(q=q, k=k, v=v, causal=causal, L=L, S=S, scale=scale, dtype=dtype):
            allowed = _visible(L, S, causal)
            return [
                (
                    _reference(q, k, v, False, scale)[0].to(dtype) if causal else None,
                    "Your causal kernel lets every query see every key: mask the "
                    "scores of keys j > i + S - L with -inf (CAUSAL is a tl.constexpr "
                    "flag).",
                ),
                (
                    scaled_dot_product_attention(
                        q.double(), k.double(), v.double(), scale=scale,
                        attn_mask=torch.ones(L, S, dtype=torch.bool).tril(),
                    ).to(dtype)
                    if causal and L != S
                    else None,
                    "Your causal mask is aligned top-left (key j <= i): attnbook's is "
                    "bottom-right, j <= i + S - L, as FlashAttention-2's.",
                ),
                (
                    _tiled(q, k, v, _bound_only(L, S), scale).to(dtype)
                    if causal
                    else None,
                    "Your loop stops at the causal bound, but the tile on the diagonal "
                    "is not masked: its queries see keys after their own. Set the "
                    "scores of keys j > i + S - L to -inf (tl.where) in every tile.",
                ),
                (
                    _tiled(q, k, v, allowed & _bound_only(L, S, -1), scale).to(dtype)
                    if causal and (S - L) % _BLOCK == 1
                    else None,
                    "Your causal bound is one key short: a query tile's last row sees "
                    "keys up to its index + S - L, so the loop runs while start < "
                    "min(S, (pid + 1) * BLOCK_M + S - L); one less drops a whole key "
                    f"tile where that key opens one (S - L = {S - L}, 1 modulo 16).",
                ),
                (
                    _tiled(q, k, v, allowed, scale, rescale_acc=False).to(dtype),
                    "Your accumulator is not rescaled: when a key tile raises the row "
                    "max from m to m_new, acc (like l) must be multiplied by alpha = "
                    "exp(m - m_new) before p @ v is added.",
                ),
                (
                    _tiled(q, k, v, allowed, scale, rescale_l=False).to(dtype),
                    "Your normalizer l is not rescaled: l = l * alpha + rowsum(p), "
                    "with alpha = exp(m - m_new), as for acc.",
                ),
                (
                    scaled_dot_product_attention(
                        q.double(), k.double(), v.double(), is_causal=causal, scale=1.0
                    ).to(dtype),
                    "Your scores miss the scale: s = tl.dot(q, tl.trans(k)) * scale.",
                ),
                (
                    scaled_dot_product_attention(
                        q.double(), *_zero_keys(k, v), scale=scale
                    ).to(dtype)
                    if not causal and S % _BLOCK
                    else None,
                    _KEYS_PAST_S,
                ),
            ]  # fmt: skip

        tiles = f"{math.ceil(S / _BLOCK)} key tiles"
        _verdict(
            out, (L, E), exact, same, dtype, f"out for {what}", slips,
            _empty_rows_note(L, S, causal), _float16_note(dtype, tiles, "m, l and acc"),
        )  # fmt: skip
        _check_lse(lse, lse_exact, what)
        _work(record, _needed_tiles(L, S, causal), waste, what)
    if waste:
        raise AssertionError(_forward_waste(_first_waste(waste)))


# --------------------------------------------------------------------------------------
# 4. Backward pass for dK and dV
# --------------------------------------------------------------------------------------
def _gradients(q, k, v, do, causal, scale):
    """float64 ``(out, lse, dk, dv)`` by autograd, and ``(dk, dv)`` by autograd in the
    inputs' dtype: PyTorch's own error, FlashAttention-2's reference for the rule."""
    found = []
    for dtype in (torch.float64, q.dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out = scaled_dot_product_attention(*leaves, is_causal=causal, scale=scale)
        out.backward(do.to(dtype))
        found.append((out.detach(), leaves[1].grad, leaves[2].grad))
    (out, dk, dv), (_, dk32, dv32) = found
    scores = (q.double() @ k.double().T * scale).masked_fill(
        ~_visible(q.shape[0], k.shape[0], causal), -math.inf
    )
    return out, torch.logsumexp(scores, -1), dk, dv, dk32, dv32


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


def _long_backward(gen) -> tuple:
    """A thousand queries or more against a key tile or three, in float16, the
    gradient near 1: each program sums over every query, so float16 accumulators
    for dk and dv break FlashAttention-2's rule."""
    return (_draw(gen, 1000, 1100), _draw(gen, 17, 48), 16, False, torch.float16, 1.0)


def _backward_waste(found) -> str:
    kind, what, program, tile, _ = found
    who = f"program {program} (keys {program * _BLOCK}..)"
    start = (
        "start the loop over query tiles at the first query that sees key n0 = pid * "
        "BLOCK_N, lo = max(0, n0 - (S - L)), rounded down to a multiple of BLOCK_M: "
        "the queries before it see none of the tile's keys."
    )
    if kind in ("loaded", "dot"):
        did = "loaded" if kind == "loaded" else "ran tl.dot on"
        return (
            f"{what}: your values are right, but {who} {did} query tile {tile}, whose "
            f"queries see none of its keys: {start}"
        )
    if kind == "past":
        return (
            f"{what}: your values are right, but {who} ran tl.dot on a query tile "
            "past L: loop over range(lo, L, BLOCK_M)."
        )
    return (
        f"{what}: your values are right, but {who} loaded query tile {tile} more than "
        "once: walk the query tiles once, accumulating dk and dv."
    )


@register(
    "kernel-lab-attention-backward",
    library=_KERNEL_ONLY,
    after_pass=_cost_report,
    hint="one program per key tile: load k, v once; dk = dv = 0 (float32); for each "
    "query tile (from the first that sees the tile, when CAUSAL): p = exp(s - lse) "
    "with s = scale q k^T masked to -inf; dv += p^T do; dp = do v^T; ds = p * (dp - "
    "delta); dk += ds^T q * scale. Store dk and dv with the mask keys < S.",
)
def _check_attention_backward(student) -> None:
    """``student(q, k, v, out, lse, grad_out, is_causal, scale, record_tiles=True)``
    must return ``(dk, dv, record)``, the gradients equal to autograd's within
    FlashAttention-2's rule (PyTorch's error: its autograd in the inputs' dtype), on
    the shapes of :func:`_attention_shapes` with a
    thousand queries in float16; no program may load or run ``tl.dot`` on a query tile
    that sees none of its keys."""
    gen, waste = generator(253), {}
    for L, S, E, causal, dtype, shift in _attention_shapes(gen, _long_backward(gen)):
        taken: set[int] = set()
        q, k, v = (_padded(gen, n, E, dtype, taken) for n in (L, S, S))
        scale = 1 / math.sqrt(E)
        do = _padded(gen, L, E, dtype, taken, shift=shift)
        out, lse, dk, dv, dk_pt, dv_pt = _gradients(q, k, v, do, causal, scale)
        what = f"L={L}, S={S}, E={E}, is_causal={causal}, {_name(dtype)}"
        outs = _padded(gen, L, E, dtype, taken)
        outs.copy_(out.to(dtype))
        got = _run(student, what, q, k, v, outs, lse.float(), do, causal, scale,
                   record_tiles=True)  # fmt: skip
        assert isinstance(got, (tuple, list)) and len(got) == 3, (
            f"{what}: the launcher must return (dk, dv, record), got {got!r:.80}."
        )
        visible = _visible(L, S, causal)

        def wrong(kind, index, q=q, k=k, v=v, do=do, out=out, lse=lse, scale=scale):
            mask = torch.ones_like(visible) if kind == "dense" else visible
            if kind == "late":
                mask = visible & _walked_queries(q.shape[0], k.shape[0], 1)
            return _dkdv(q, k, v, do, out, lse, mask, scale, kind != "no delta")[index]

        for index, (name, g, exact, same) in enumerate(
            (("dk", got[0], dk, dk_pt), ("dv", got[1], dv, dv_pt))
        ):

            def slips(index=index, name=name, exact=exact, dtype=dtype, causal=causal):
                return [
                    (
                        wrong("dense", index).to(dtype) if causal else None,
                        f"Your {name} ignores the causal mask: p must be 0 (not "
                        "exp(s - lse)) where key j > query i + S - L.",
                    ),
                    (
                        (exact / scale).to(dtype) if name == "dk" else None,
                        "Your dk lacks the scale: the scores are scale * q k^T, so dk "
                        "= ds^T q * scale.",
                    ),
                    (
                        wrong("no delta", index).to(dtype) if name == "dk" else None,
                        "Your ds is p * dp: subtract delta = rowsum(dO * O) first, ds "
                        "= p * (dp - delta[:, None]).",
                    ),
                    (
                        wrong("late", index).to(dtype)
                        if causal and (S - L) % _BLOCK == 1
                        else None,
                        "Your loop over query tiles starts one query late: the first "
                        "query that sees key n0 is n0 - (S - L), so lo = max(0, n0 - "
                        "(S - L)) // BLOCK_M * BLOCK_M; one more skips a whole query "
                        f"tile where that query ends one (S - L = {S - L}, 1 modulo "
                        "16).",
                    ),
                ]

            tiles = f"{math.ceil(L / _BLOCK)} query tiles"
            _verdict(
                g, (S, E), exact, same, dtype, f"{name} for {what}", slips,
                lambda _, n=name: f"Your {n} has NaN: the ragged last tile of q, do "
                f"(L = {L}) or of k, v (S = {S}) read past the end (NaN there); mask "
                "those loads with other=0, and queries that see no key (lse = -inf) "
                "must give p = 0.", _float16_note(dtype, tiles, "dk and dv"),
            )  # fmt: skip
        _work(got[2], _needed_tiles(L, S, causal).T, waste, what)
    if waste:
        raise AssertionError(_backward_waste(_first_waste(waste)))


# --------------------------------------------------------------------------------------
# 5. Block-sparse forward
# --------------------------------------------------------------------------------------
def _expand(layout: torch.Tensor, L: int, S: int) -> torch.Tensor:
    """A block layout as the ``(L, S)`` bool mask of the keys each query sees."""
    rows = layout.repeat_interleave(_BLOCK, 0)[:L]
    return rows.repeat_interleave(_BLOCK, 1)[:, :S]


def _layout(gen, blocks: tuple[int, int]) -> torch.Tensor:
    """A random layout of ``blocks`` (two query blocks or more, three key blocks or
    more) with a key block no row reads, an empty query row, and a row that reads
    every other key block, the ragged last one included (so its row max may grow from
    block to block)."""
    density = 0.2 + 0.4 * torch.rand(1, generator=gen)
    layout = torch.rand(blocks, generator=gen) < density
    empty, full = torch.randperm(blocks[0], generator=gen)[:2].tolist()
    layout[full] = True
    layout[:, _draw(gen, 0, blocks[1] - 2)] = False
    layout[empty] = False
    return layout


def _sparse_waste(found) -> str:
    kind, what, row, block, times = found
    if kind == "loaded":
        return (
            f"{what}: query block {row} loaded key block {block}, which its row of the "
            "layout leaves out: a block-sparse kernel skips those (they are the "
            "saving)."
        )
    if kind == "dot":
        return (
            f"{what}: your values are right, but query block {row} ran tl.dot on key "
            f"block {block}, which its row of the layout leaves out (masking its loads "
            "does not skip the work): walk only COL_IDX[ROW_PTR[i]:ROW_PTR[i + 1]], "
            "the blocks that are the saving."
        )
    if kind == "past":
        return (
            f"{what}: your values are right, but query block {row} ran tl.dot on a key "
            "block past S: walk only the blocks COL_IDX lists."
        )
    return (
        f"{what}: your values are right, but query block {row} loaded key block "
        f"{block} {times} times: one pass over its blocks with the online softmax "
        "reads each once."
    )


@register(
    "kernel-lab-block-sparse",
    library=_KERNEL_ONLY,
    after_pass=_cost_report,
    hint="one program per query block: for idx in range(tl.load(ROW_PTR + block), "
    "tl.load(ROW_PTR + block + 1)), the key block is tl.load(COL_IDX + idx); run the "
    "online-softmax update of the attention kernel on that block only (keys >= S "
    "masked), then out = acc / l and lse = m + log l (zeros, -inf for an empty row).",
)
def _check_block_sparse(student) -> None:
    """``student(q, k, v, layout, scale, record_tiles=True)`` must return ``(out, lse,
    record)`` equal to :func:`attnbook.sparse.block_sparse_attention` and its float64
    log-sum-exp within FlashAttention-2's rule, on random layouts (an empty row, the
    ragged last key block in use, a key block no row reads), and neither load nor run
    ``tl.dot`` on a key block its row of the layout leaves out (the values of the
    blocks no row reads are NaN, and the interpreter records the work)."""
    gen, waste = generator(254), {}
    for i in range(4):
        L = _draw(gen, 17, 70)
        S = _BLOCK * _draw(gen, 2, 4) + _draw(gen, 1, _BLOCK - 1)  # ragged
        E, dtype = (16, 32)[i % 2], (torch.float32, torch.float16)[i // 2]
        taken: set[int] = set()
        q, k, v = (_padded(gen, n, E, dtype, taken) for n in (L, S, S))
        layout = _layout(gen, (math.ceil(L / _BLOCK), math.ceil(S / _BLOCK)))
        clean_k, clean_v = k.clone(), v.clone()
        for block in (~layout.any(0)).nonzero()[:, 0].tolist():  # never read: NaN
            k[block * _BLOCK : (block + 1) * _BLOCK] = float("nan")
            v[block * _BLOCK : (block + 1) * _BLOCK] = float("nan")
        scale = 1 / math.sqrt(E)
        what = f"L={L}, S={S}, E={E}, {_name(dtype)}, layout {layout.int().tolist()}"
        got = _run(student, what, q, k, v, layout, scale, record_tiles=True)
        assert isinstance(got, (tuple, list)) and len(got) == 3, (
            f"{what}: the launcher must return (out, lse, record), got {got!r:.80}."
        )
        out, lse, record = got

        def reference(x, y, z, mask, scale=scale):
            return block_sparse_attention(x, y, z, mask, _BLOCK, scale=scale)

        exact = reference(q.double(), clean_k.double(), clean_v.double(), layout)
        same = reference(q.float(), clean_k.float(), clean_v.float(), layout).to(dtype)

        def slips(q=q, k=clean_k, v=clean_v, layout=layout, L=L, S=S, dtype=dtype):
            dense = torch.ones_like(layout)
            return [
                (
                    reference(q.double(), k.double(), v.double(), dense).to(dtype),
                    "Your kernel attends to every key block: walk only COL_IDX["
                    "ROW_PTR[i]:ROW_PTR[i + 1]].",
                ),
                (
                    _tiled(
                        q, k, v, _expand(layout, L, S), scale, rescale_acc=False
                    ).to(dtype),
                    "Your accumulator is not rescaled: when a key block raises the "
                    "row max from m to m_new, acc (like l) must be multiplied by "
                    "alpha = exp(m - m_new) before p @ v is added.",
                ),
                (
                    reference(q.double(), *_zero_keys(k, v), layout).to(dtype),
                    _KEYS_PAST_S,
                ),
            ]

        _verdict(
            out, (L, E), exact, same, dtype, f"out for {what}", slips,
            lambda _: "Your kernel read key blocks the layout leaves out (they hold "
            f"NaN here), or rows past the end of q, k, v (L = {L}, S = {S}): walk "
            "only the blocks COL_IDX lists for the row, and mask the ragged tile.",
        )  # fmt: skip
        scores = (q.double() @ clean_k.double().T * scale).masked_fill(
            ~_expand(layout, L, S), -math.inf
        )
        _check_lse(lse, torch.logsumexp(scores, -1), what)
        _work(record, layout, waste, what)
    if waste:
        raise AssertionError(_sparse_waste(_first_waste(waste)))
