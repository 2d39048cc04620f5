"""Checks for the project "A FlashAttention variant of your choice"
(``book/projects/flash_variant.ipynb``).

Each milestone has a public check, which the student runs in the notebook on a few
small cases it names, and a hidden one (label ``...-hidden``), which only the graders
run: many cases drawn from the grader's secret seed, with the edge cases the public
check leaves out (key lengths that the tiles do not divide, more queries than keys,
rows and whole batch entries that see no key, masks that differ per head and per batch
entry, float16, large scores, and the memory the tiled loop may use).

The masks handed to the student are :class:`MaskMod` objects, predicates written with
tensor operations like :mod:`attnbook.masks`; they are module-level objects so that the
grader can send them to a submission's kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...flex import flex_reference
from ...masks import active_tiles, dense
from . import register
from .common import assert_close, call_student, generator, largest_new_tensor
from .library import forbid

__all__ = ["MaskMod", "reference_tiled_attention", "reference_tile_plan"]


# --------------------------------------------------------------------------------------
# Masks the checks use: one picklable predicate with a readable name
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MaskMod:
    """``mask_mod(b, h, q_idx, kv_idx)``, True where query ``q_idx`` may see key
    ``kv_idx``, bottom-right aligned (query ``i`` sits at key position ``i + S - L``).

    With the offset ``t = q_idx + S - L - kv_idx``: ``t >= 0`` when ``causal``; ``t <=
    left`` (per head: ``left + head_step * h``) when ``left >= 0``; ``t % dilation ==
    0``; the first ``sinks`` keys are visible to every query that may see them
    causally; ``lengths[b]`` keys at most in batch entry ``b``; ``doc`` tokens per
    document (``doc > 0``: queries see only keys of their own document)."""

    name: str
    L: int
    S: int
    causal: bool = False
    left: int = -1
    head_step: int = 0
    dilation: int = 1
    sinks: int = 0
    lengths: tuple[int, ...] | None = None
    doc: int = 0

    def __call__(self, b, h, q_idx, kv_idx):
        b, h, q_idx, kv_idx = (torch.as_tensor(x) for x in (b, h, q_idx, kv_idx))
        offset = q_idx.long() + (self.S - self.L) - kv_idx.long()
        keep = torch.ones_like(offset, dtype=torch.bool)
        if self.causal:
            keep = keep & (offset >= 0)
        if self.left >= 0:
            reach = self.left + self.head_step * h.long()
            window = offset <= reach
            if self.dilation > 1:
                window = window & (offset % self.dilation == 0)
            if self.sinks:
                window = window | (kv_idx.long() < self.sinks)
            keep = keep & window
        if self.doc:
            row = q_idx.long() + (self.S - self.L)
            keep = keep & (torch.div(row, self.doc, rounding_mode="floor")
                           == torch.div(kv_idx.long(), self.doc, rounding_mode="floor"))
        if self.lengths is not None:
            lengths = torch.tensor(self.lengths, dtype=torch.long)
            keep = keep & (kv_idx.long() < lengths[b.long()])
        return keep

    def __str__(self) -> str:
        return self.name


def _describe(mask: MaskMod, **sizes) -> str:
    shown = ", ".join(f"{k}={v}" for k, v in sizes.items())
    return f"mask {mask} (L={mask.L}, S={mask.S}), {shown}"


# --------------------------------------------------------------------------------------
# Milestone 1: the tiled forward pass with a mask_mod
# --------------------------------------------------------------------------------------
def reference_tiled_attention(q, k, v, mask_mod) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``tiled_attention`` must return, computed densely in float64: the output by
    :func:`attnbook.flex.flex_reference` (zeros for a row with no allowed key) and the
    row log-sum-exp of the masked, scaled scores by ``torch.logsumexp`` (``-inf`` for
    such a row)."""
    B, H, L, E = q.shape
    S = k.shape[2]
    q64, k64, v64 = q.double(), k.double(), v.double()
    out = flex_reference(q64, k64, v64, mask_mod=mask_mod)
    scores = q64 @ k64.transpose(-1, -2) / math.sqrt(E)
    allowed = dense(mask_mod, L, S, B=B, H=H)
    lse = torch.logsumexp(scores.masked_fill(~allowed, -math.inf), dim=-1)
    return out, lse


def _flash_notes(got_out, got_lse, q, k, v, mask_mod, block_n) -> str:
    """What a wrong tiled attention did, where it tells, or ''."""
    try:
        got_out = torch.as_tensor(got_out).double()
        got_lse = torch.as_tensor(got_lse).double()
    except Exception:
        return ""
    B, H, L, E = q.shape
    S = k.shape[2]
    allowed = dense(mask_mod, L, S, B=B, H=H)
    empty = ~allowed.any(-1)
    if torch.isnan(got_out).any() or torch.isnan(got_lse).any():
        if empty.any():
            return (
                " Your result has NaN, and this case has rows that see no key: for "
                "such a row the running max stays -inf and exp(s - m) is "
                "exp(-inf + inf); return output 0 and lse -inf for it."
            )
        return (
            " Your result has NaN: a tile whose entries are all masked gives m = -inf; "
            "guard the update (use 0 in place of an infinite max)."
        )
    if not torch.isfinite(got_out).all():
        return " Your output has inf: subtract the running max before the exp."
    ref_out, ref_lse = reference_tiled_attention(q, k, v, mask_mod)
    same = got_out.shape == ref_out.shape
    slips = [
        (_tiles(q, k, v, mask_mod, block_n, scale=False)[0],
         "You did not scale the scores by 1/sqrt(d_k)."),
        (_tiles(q, k, v, mask_mod, block_n, rescale=False)[0],
         "You did not rescale: when the running max grows from m to m', multiply "
         "both the running sum l and the accumulator by exp(m - m') before adding "
         "the new tile."),
        (_tiles(q, k, v, mask_mod, block_n, rescale_acc=False)[0],
         "You rescaled the running sum l but not the accumulator: multiply it by "
         "exp(m - m') too."),
        (_tiles(q, k, v, mask_mod, block_n, ragged=False)[0],
         "You left out the last key tile: when block_n does not divide S, it holds "
         "the S % block_n keys left over (or all of them when block_n > S)."),
        (_tiles(q, k, v, mask_mod, block_n, per_head=False)[0],
         "You called mask_mod for batch entry 0 and head 0 only: pass the index "
         "tensors b (B, 1, 1, 1) and h (1, h, 1, 1), the rule may differ per batch "
         "entry and per head."),
    ]  # fmt: skip
    for wrong, note in slips:
        if torch.allclose(wrong, ref_out, atol=1e-6, rtol=1e-5, equal_nan=True):
            continue  # the slip changes nothing in this case
        if same and torch.allclose(got_out, wrong, atol=1e-4, rtol=1e-3):
            return " " + note
    if same and torch.allclose(got_out, ref_out, atol=1e-3, rtol=1e-3):
        visible = ~empty
        m = _tiles(q, k, v, mask_mod, block_n)[2]
        if got_lse.shape == ref_lse.shape and torch.allclose(
            got_lse[visible], (ref_lse - m)[visible], atol=1e-4, rtol=1e-3
        ):
            return (
                " Your output is right but lse is log(l) alone: return m + log(l), "
                "the log of the sum of exp of the scaled scores."
            )
        return " Your output is right; lse is not: lse = m + log(l)."
    return ""


def _tiles(q, k, v, mask_mod, block_n, *, scale=True, rescale=True, rescale_acc=True,
           ragged=True, per_head=True):
    """The tiled loop in float64 with one slip or none: (out, lse, m)."""
    B, H, L, E = q.shape
    S = k.shape[2]
    q, k, v = q.double(), k.double(), v.double()
    if scale:
        q = q / math.sqrt(E)
    m = q.new_full((B, H, L), -math.inf)
    l, acc = q.new_zeros(B, H, L), q.new_zeros(B, H, L, v.shape[-1])
    b = torch.arange(B if per_head else 1).view(-1, 1, 1, 1)
    h = torch.arange(H if per_head else 1).view(1, -1, 1, 1)
    rows = torch.arange(L).view(1, 1, L, 1)
    for j0 in range(0, S if ragged else S - block_n + 1, block_n):
        cols = torch.arange(j0, min(j0 + block_n, S)).view(1, 1, 1, -1)
        s = q @ k[:, :, cols.flatten()].transpose(-1, -2)
        allowed = torch.as_tensor(mask_mod(b, h, rows, cols)).bool()
        s = s.masked_fill(~allowed, -math.inf)
        new = torch.maximum(m, s.amax(-1))
        safe = torch.where(torch.isinf(new), 0.0, new)
        p = torch.exp(s - safe[..., None])
        alpha = torch.exp(m - safe)
        l = (l * alpha if rescale else l) + p.sum(-1)
        acc = (acc * alpha[..., None] if rescale and rescale_acc else acc)
        acc = acc + p @ v[:, :, cols.flatten()]
        m = new
    out = acc / torch.where(l > 0, l, 1.0)[..., None]
    return out, torch.where(l > 0, m + torch.log(l), -math.inf), m


def _run_flash_case(student, mask, B, H, E, Ev, block_n, gen, dtype=torch.float32,
                    spread=1.0, memory=False) -> None:
    L, S = mask.L, mask.S
    q = (spread * torch.randn(B, H, L, E, generator=gen)).to(dtype)
    k = torch.randn(B, H, S, E, generator=gen).to(dtype)
    v = torch.randn(B, H, S, Ev, generator=gen).to(dtype)
    what = _describe(mask, B=B, H=H, d_k=E, d_v=Ev, block_n=block_n,
                     dtype=str(dtype).removeprefix("torch."))  # fmt: skip
    got = call_student(student, f"tiled_attention with {what}", q, k, v, mask, block_n)
    assert isinstance(got, (tuple, list)) and len(got) == 2, (
        f"{what}: return a pair (out, lse), got {type(got).__name__}."
    )
    out, lse = (torch.as_tensor(x) for x in got)
    ref_out, ref_lse = reference_tiled_attention(q, k, v, mask)
    assert out.dtype == dtype, (
        f"{what}: return out in q's dtype, {dtype}, got {out.dtype}."
    )
    assert lse.dtype == torch.float32, (
        f"{what}: return lse in float32 (accumulate in float32), got {lse.dtype}."
    )
    tol = {"atol": 1e-5, "rtol": 1e-4} if dtype == torch.float32 else {
        "atol": 2e-3, "rtol": 2e-3}  # fmt: skip
    try:
        assert_close(out, ref_out, f"{what}: out", **tol)
        assert_close(lse, ref_lse, f"{what}: lse", **tol)
    except AssertionError as err:
        note = _flash_notes(out, lse, q, k, v, mask, block_n)
        raise AssertionError(f"{err}{note}") from None
    if memory:
        largest = largest_new_tensor(student, q, k, v, mask, block_n)
        limit = max(4 * B * H * L * max(block_n, E, Ev), B * H * S * max(E, Ev))
        assert largest <= limit, (
            f"{what}: your code created a tensor of {largest:,} elements, more than "
            f"the tiles and the inputs need ({limit:,}; the L x S scores are "
            f"{B * H * L * S:,}): evaluate mask_mod and the scores one key tile "
            "of block_n columns at a time, never for all S keys at once."
        )


_FLASH_POLICY = forbid(
    "attnbook.flash",
    "attnbook.flex",
    "attnbook.attend",
    "attnbook.kernels",
    "attnbook.sparse",
    "attnbook.core.scaled_dot_product_attention",
    why="The milestone asks you to write the tiled forward pass, which "
    "attnbook.flash.flash_forward and FlexAttention's reference implement.",
)
_FLASH_HINT = (
    "for each key tile: s = q k^T / sqrt(d_k), masked to -inf where mask_mod is False; "
    "m' = max(m, rowmax(s)); rescale l and acc by exp(m - m'); add rowsum(exp(s - m')) "
    "and exp(s - m') v; at the end out = acc / l and lse = m + log l, with out = 0 and "
    "lse = -inf for a row that saw no key."
)


@register("project-flash-tiled", library=_FLASH_POLICY, hint=_FLASH_HINT)
def _check_tiled(student) -> None:
    """Public: full attention, causal, and a causal window with one sink token when
    ``L < S``; lengths the tiles divide, float32."""
    gen = generator(71)
    cases = [
        (MaskMod("full", 8, 8), 1, 2, 4, 4, 4),
        (MaskMod("causal", 8, 8, causal=True), 2, 1, 4, 4, 4),
        (MaskMod("causal window of 3 with 1 sink", 6, 12, causal=True, left=3,
                 sinks=1), 1, 2, 8, 8, 4),
    ]  # fmt: skip
    for mask, B, H, E, Ev, block_n in cases:
        _run_flash_case(student, mask, B, H, E, Ev, block_n, gen)


@register("project-flash-tiled-hidden", library=_FLASH_POLICY, hint=_FLASH_HINT)
def _check_tiled_hidden(student) -> None:
    """Hidden: ragged last tiles, ``L > S`` (rows that see no key), batch entries with
    no key, windows that differ per head, dilation, documents, float16, large scores,
    and the memory of the loop."""
    gen = generator(72)
    fixed = [
        # more queries than keys: the first L - S rows see nothing
        (MaskMod("causal", 9, 5, causal=True), 1, 2, 4, 4, 2, torch.float32, 1.0),
        # a batch entry with no key at all, S not a multiple of block_n
        (MaskMod("key padding, lengths (7, 0)", 4, 7, lengths=(7, 0)), 2, 1, 4, 3, 3,
         torch.float32, 1.0),
        # large scores: exp without the max overflows
        (MaskMod("causal", 6, 6, causal=True), 1, 1, 8, 8, 4, torch.float32, 30.0),
        # one tile wider than every key
        (MaskMod("full", 3, 5), 1, 1, 4, 4, 16, torch.float32, 1.0),
    ]  # fmt: skip
    for mask, B, H, E, Ev, block_n, dtype, spread in fixed:
        _run_flash_case(student, mask, B, H, E, Ev, block_n, gen, dtype, spread)
    for _ in range(8):
        L = int(torch.randint(1, 20, (), generator=gen))
        S = int(torch.randint(1, 24, (), generator=gen))
        B = int(torch.randint(1, 3, (), generator=gen))
        H = int(torch.randint(1, 4, (), generator=gen))
        kind = int(torch.randint(0, 5, (), generator=gen))
        left = int(torch.randint(0, 6, (), generator=gen))
        if kind == 0:
            mask = MaskMod("causal", L, S, causal=True)
        elif kind == 1:
            mask = MaskMod(f"causal window of {left} + 2 per head", L, S, causal=True,
                           left=left, head_step=2)  # fmt: skip
        elif kind == 2:
            mask = MaskMod(f"causal window of {left}, dilation 2, 2 sinks", L, S,
                           causal=True, left=left, dilation=2, sinks=2)  # fmt: skip
        elif kind == 3:
            mask = MaskMod("documents of 5 tokens, causal", L, S, causal=True, doc=5)
        else:
            drawn = torch.randint(0, S + 1, (B,), generator=gen)
            lengths = tuple(int(x) for x in drawn)
            mask = MaskMod(f"key padding, lengths {lengths}", L, S, lengths=lengths)
        block_n = int(torch.randint(1, 9, (), generator=gen))
        dtype = torch.float16 if torch.rand((), generator=gen) < 0.3 else torch.float32
        Ev = int(torch.randint(1, 9, (), generator=gen))
        _run_flash_case(student, mask, B, H, 8, Ev, block_n, gen, dtype)
    # the loop's memory: never an L x S tensor
    mask = MaskMod("causal window of 16 with 2 sinks", 32, 256, causal=True, left=16,
                   sinks=2)  # fmt: skip
    _run_flash_case(student, mask, 1, 2, 4, 4, 8, gen, memory=True)


# --------------------------------------------------------------------------------------
# Milestone 2: which tiles to visit, and which need the mask
# --------------------------------------------------------------------------------------
def reference_tile_plan(L, S, block_m, block_n, mask_mod) -> torch.Tensor:
    """The plan ``visited_tiles`` must return, from :func:`attnbook.masks.active_tiles`:
    0 where the tile holds no allowed entry, 2 where every entry of it inside the ``L x
    S`` matrix is allowed, 1 otherwise (``long``, ``(ceil(L / block_m), ceil(S /
    block_n))``)."""
    visited = active_tiles(mask_mod, L, S, block_m, block_n)

    def masked(b, h, q_idx, kv_idx):
        return ~torch.as_tensor(mask_mod(b, h, q_idx, kv_idx)).bool()

    partial = active_tiles(masked, L, S, block_m, block_n)
    return visited.long() + (visited & ~partial).long()


def _plan_note(got, want, L, S, block_m, block_n) -> str:
    """What a wrong plan did, where it tells, or ''."""
    rows, cols = want.shape
    if tuple(got.shape) != tuple(want.shape):
        if got.shape[0] in (L // block_m,) or got.shape[-1] in (S // block_n,):
            return (
                " You left out the last, ragged tile: there are ceil(L / block_m) "
                "query tiles and ceil(S / block_n) key tiles, the last ones shorter."
            )
        return ""
    if ((got > 0) != (want > 0)).any():
        missed = ((want > 0) & (got == 0)).nonzero().tolist()
        extra = ((want == 0) & (got > 0)).nonzero().tolist()
        if missed:
            return (
                f" Tiles {missed[:4]} hold allowed entries but your plan skips them: "
                "the kernel would miss keys (incomplete)."
            )
        return (
            f" Tiles {extra[:4]} hold no allowed entry but your plan visits them: "
            "the kernel would waste work on them (not tight)."
        )
    wrong_full = ((want == 2) & (got == 1)).nonzero().tolist()
    if wrong_full:
        last = [t for t in wrong_full if t[0] == rows - 1 or t[1] == cols - 1]
        if last and len(last) == len(wrong_full):
            return (
                f" Tiles {wrong_full[:4]} are full: every entry of them inside the "
                "L x S matrix is allowed; the positions past L or S of a ragged tile "
                "do not count (the kernel bounds-checks them anyway)."
            )
        return f" Tiles {wrong_full[:4]} are full (every entry allowed): mark them 2."
    wrong_partial = ((want == 1) & (got == 2)).nonzero().tolist()
    if wrong_partial:
        return (
            f" Tiles {wrong_partial[:4]} hold masked entries: mark them 1, or the "
            "kernel would skip the mask on them."
        )
    return ""


def _run_plan_case(student, mask, block_m, block_n) -> None:
    L, S = mask.L, mask.S
    what = _describe(mask, block_m=block_m, block_n=block_n)
    got = call_student(student, f"visited_tiles with {what}", L, S, block_m, block_n,
                       mask)  # fmt: skip
    want = reference_tile_plan(L, S, block_m, block_n, mask)
    try:
        got = torch.as_tensor(got)
    except Exception:
        raise AssertionError(
            f"{what}: return a tensor of 0, 1 and 2, got {type(got).__name__}."
        ) from None
    assert not got.is_floating_point() and got.dtype != torch.bool, (
        f"{what}: return an integer tensor of 0, 1 and 2, got dtype {got.dtype}."
    )
    if tuple(got.shape) != tuple(want.shape) or not torch.equal(got.long(), want):
        shown = want.tolist() if want.numel() <= 64 else f"shape {tuple(want.shape)}"
        mine = got.tolist() if got.numel() <= 64 else f"shape {tuple(got.shape)}"
        note = _plan_note(got.long(), want, L, S, block_m, block_n)
        raise AssertionError(f"{what}: expected {shown}, got {mine}.{note}")


_PLAN_POLICY = forbid(
    "attnbook.masks.active_tiles",
    "attnbook.masks.dense",
    "attnbook.flex.flex_block_mask",
    "attnbook.flash.key_range",
    why="The milestone asks you to find the tiles a kernel visits from the mask_mod, "
    "which attnbook.masks.active_tiles and FlexAttention's block mask compute.",
)
_PLAN_HINT = (
    "evaluate mask_mod on each tile's query and key indices (only those inside L and "
    "S): 0 if no entry is allowed, 2 if every one is, 1 otherwise; there are "
    "ceil(L / block_m) x ceil(S / block_n) tiles."
)


@register("project-flash-plan", library=_PLAN_POLICY, hint=_PLAN_HINT)
def _check_plan(student) -> None:
    """Public: causal, a causal window with a sink, and non-square tiles with ``L <
    S``; every length a multiple of its tile."""
    for mask, block_m, block_n in [
        (MaskMod("causal", 8, 8, causal=True), 4, 4),
        (MaskMod("causal window of 4 with 1 sink", 16, 16, causal=True, left=4,
                 sinks=1), 4, 4),
        (MaskMod("causal", 8, 16, causal=True), 4, 8),
    ]:  # fmt: skip
        _run_plan_case(student, mask, block_m, block_n)


@register("project-flash-plan-hidden", library=_PLAN_POLICY, hint=_PLAN_HINT)
def _check_plan_hidden(student) -> None:
    """Hidden: ragged tiles on both sides, ``L > S``, tiles larger than the lengths,
    dilated windows, documents, and random sizes."""
    gen = generator(73)
    for mask, block_m, block_n in [
        (MaskMod("causal", 10, 10, causal=True), 4, 4),
        (MaskMod("full", 5, 7), 4, 4),
        (MaskMod("causal", 12, 5, causal=True), 4, 2),
        (MaskMod("causal window of 2", 9, 9, causal=True, left=2), 16, 16),
    ]:  # fmt: skip
        _run_plan_case(student, mask, block_m, block_n)
    for _ in range(12):
        L = int(torch.randint(1, 40, (), generator=gen))
        S = int(torch.randint(1, 40, (), generator=gen))
        left = int(torch.randint(0, 9, (), generator=gen))
        kind = int(torch.randint(0, 4, (), generator=gen))
        mask = [
            MaskMod("causal", L, S, causal=True),
            MaskMod(f"causal window of {left} with 2 sinks", L, S, causal=True,
                    left=left, sinks=2),
            MaskMod(f"window of {left}, dilation 3", L, S, left=left, dilation=3),
            MaskMod("documents of 6 tokens", L, S, doc=6),
        ][kind]  # fmt: skip
        block_m = int(torch.randint(1, 9, (), generator=gen))
        block_n = int(torch.randint(1, 9, (), generator=gen))
        _run_plan_case(student, mask, block_m, block_n)
