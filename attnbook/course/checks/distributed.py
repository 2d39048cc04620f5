"""Checks for the exercises of the chapter on attention across devices."""

from __future__ import annotations

import itertools
import math
import numbers

import torch
import torch.nn.functional as F

from ...distributed import ring_bytes_per_rank, shard_positions, ulysses_bytes_per_rank
from . import register
from .common import explain_slips, assert_int, call_student, generator
from .library import forbid


def _pick(gen: torch.Generator, options):
    """One of ``options``, drawn with ``gen``."""
    return options[torch.randint(len(options), (1,), generator=gen).item()]


def _randint(gen: torch.Generator, lo: int, hi: int) -> int:
    """An int in ``lo .. hi`` (both included), drawn with ``gen``."""
    return torch.randint(lo, hi + 1, (1,), generator=gen).item()


# ---------------------------------------------------------------------------------
# distributed-zigzag-positions
# ---------------------------------------------------------------------------------
def _chunk(index: int, c: int) -> list[int]:
    return list(range(index * c, (index + 1) * c))


_WORLD_CHUNKS = (
    "You cut the sequence into world chunks: zigzag cuts it into 2 world chunks of c "
    "= seq_len // (2 world), and rank r holds two of them, seq_len / world positions "
    "in all."
)

# zigzag_positions's slips: (rank, world, seq_len) -> the answer, and a note
_ZIGZAG_SLIPS = [
    (
        lambda r, W, L: _chunk(r, L // W),
        (
            "That is the contiguous layout (rank r holds positions r n .. "
            "(r + 1) n - 1): zigzag holds chunk r and chunk 2 world - 1 - r of 2 world "
            "chunks, an early one and a late one, so every rank gets the same causal "
            "work."
        ),
    ),
    (
        lambda r, W, L: _chunk(2 * W - 1 - r, L // (2 * W)) + _chunk(r, L // (2 * W)),
        (
            "Your two chunks are in the wrong order: the local order is the early "
            "chunk first, chunk r, then chunk 2 world - 1 - r."
        ),
    ),
    (
        lambda r, W, L: _chunk(r, L // (2 * W)) + _chunk(2 * W - r, L // (2 * W)),
        (
            "Off by one: the late chunk is 2 world - 1 - r (chunks count from 0, so "
            "the last is 2 world - 1 and rank 0 pairs the first chunk with it), not "
            "2 world - r."
        ),
    ),
    (
        lambda r, W, L: _chunk(r, L // W) + _chunk(W - 1 - r, L // W),
        _WORLD_CHUNKS,
    ),
    (
        lambda r, W, L: _chunk(r, L // W) + _chunk(2 * W - 1 - r, L // W),
        _WORLD_CHUNKS,
    ),
    (
        lambda r, W, L: _chunk(r, L // (2 * W)) + _chunk(W + r, L // (2 * W)),
        (
            "Your late chunk is world + r: it mirrors the early one, 2 world - 1 - r, "
            "so the rank with the earliest chunk also holds the last (and the work "
            "balances)."
        ),
    ),
    (
        lambda r, W, L: list(range(r, L, W)),
        (
            "That is the striped layout (positions r, r + world, r + 2 world, ...): "
            "zigzag holds two contiguous chunks, r and 2 world - 1 - r of 2 world."
        ),
    ),
]


def _zigzag(rank: int, world: int, seq_len: int) -> list[int]:
    return shard_positions(rank, world, seq_len, layout="zigzag").tolist()


def _zigzag_slip(results, calls) -> str:
    """The note of the first slip that gives ``results`` (None where the answer
    failed) on every call and changes one of them, or ''."""
    expected = [_zigzag(*call) for call in calls]
    for slip, note in _ZIGZAG_SLIPS:
        wrong = [slip(*call) for call in calls]
        if wrong != expected and all(
            got is None or got == w for got, w in zip(results, wrong)
        ):
            return " " + note
    return ""


def _show(positions: list[int]) -> str:
    """A list of positions, runs of consecutive ones as ``a..b`` when it is long."""
    if len(positions) <= 12:
        return str(positions)
    runs, start = [], 0
    for i in range(1, len(positions) + 1):
        if i == len(positions) or positions[i] != positions[i - 1] + 1:
            a, b = positions[start], positions[i - 1]
            runs.append(str(a) if a == b else f"{a}..{b}")
            start = i
    shown = ", ".join(runs[:8]) + (", ..." if len(runs) > 8 else "")
    return f"[{shown}] ({len(positions)} positions)"


_FLOAT_NOTE = " The chunk length is seq_len // (2 * world): / gives a float."


def _as_positions(got, what: str) -> list[int]:
    """The answer as a list of ints: a list or tuple of ints, or a 1-D integer
    tensor or array."""
    if isinstance(got, torch.Tensor) or type(got).__name__ == "ndarray":
        if isinstance(got, torch.Tensor):
            floating = got.is_floating_point() or got.is_complex()
            kind = "f" if floating else "b" if got.dtype == torch.bool else "i"
        else:
            kind = got.dtype.kind
        assert kind in "iu", (
            f"{what}: return integer positions, got a {type(got).__name__} of dtype "
            f"{got.dtype}." + (_FLOAT_NOTE if kind in "fc" else "")
        )
        assert len(got.shape) == 1, (
            f"{what}: return a flat list of positions, got shape {tuple(got.shape)}."
        )
        return [int(x) for x in got.tolist()]
    assert isinstance(got, (list, tuple)), (
        f"{what}: return a list of ints, got {type(got).__name__} {got!r}."
    )
    positions = []
    for x in got:
        if isinstance(x, torch.Tensor) and x.dim() == 0 and not x.is_floating_point():
            x = x.item()
        assert isinstance(x, numbers.Integral) and not isinstance(x, bool), (
            f"{what}: every position must be an int, got {type(x).__name__} {x!r}."
            + (_FLOAT_NOTE if isinstance(x, float) else "")
        )
        positions.append(int(x))
    return positions


def _range_note(err: Exception) -> str:
    return _FLOAT_NOTE if "float" in str(err) else ""


@register(
    "distributed-zigzag-positions",
    library=forbid(
        "attnbook.distributed.shard_positions",
        "attnbook.distributed.shard",
        why="The exercise asks you to write the zigzag layout, which shard_positions "
            "computes.",
    ),
    hint="c = seq_len // (2 * world); rank r holds chunk r, positions r c .. "
    "(r + 1) c - 1, then chunk 2 world - 1 - r, positions (2 world - 1 - r) c .. "
    "(2 world - r) c - 1.",
)
def _check_zigzag_positions(student) -> None:
    """``student(rank, world, seq_len)`` -> the global positions rank ``rank`` holds
    under the zigzag layout, in local order (a list or tuple of ints, or a 1-D integer
    tensor): ``shard_positions(rank, world, seq_len, layout="zigzag")`` of
    :mod:`attnbook.distributed`, for every rank of worlds 1, 2, 3, 4 and 8 (``seq_len``
    a multiple of ``2 world``)."""
    gen = generator(1101)
    configs = [(2, 8), (4, 16)]  # the chapter's pictures
    for world in (1, 2, 3, 4, 8):  # chunk lengths no answer can know
        configs.append((world, 2 * world * _randint(gen, 1, 5)))
    calls = [(r, W, L) for W, L in configs for r in range(W)]

    def call(case):
        r, W, L = case
        what = f"zigzag_positions(rank={r}, world={W}, seq_len={L})"
        got = call_student(student, what, r, W, L, note=_range_note)
        return what, _as_positions(got, what)

    for case in calls:
        what, got = call(case)
        expected = _zigzag(*case)
        if got != expected:
            results = []
            for other in calls:
                try:
                    results.append(call(other)[1])
                except AssertionError:
                    results.append(None)
            r, W, L = case
            c = L // (2 * W)
            note = _zigzag_slip(results, calls)
            if not note and len(got) != len(expected):
                note = (
                    f" A rank holds seq_len / world = {len(expected)} positions: two "
                    f"chunks of c = seq_len // (2 world) = {c}."
                )
            raise AssertionError(
                f"{what} should be {_show(expected)} (chunks {r} and {2 * W - 1 - r} "
                f"of {2 * W}, {c} positions each), got {_show(got)}." + note
            )


# ---------------------------------------------------------------------------------
# distributed-comm-bytes
# ---------------------------------------------------------------------------------
_COMM_SLIPS = {
    "ring-w-hops": "Your ring makes world hops: a rank's block is sent world - 1 "
    "times (at the last step the rank holds the last block it needs and sends "
    "nothing), (world - 1) x 2 x shard.",
    "ring-k-only": "Your ring sends the keys only: the values travel with them, "
    "2 x shard elements per hop.",
    "ring-full-seq": "Your ring sends the whole sequence's K and V at every hop: a "
    "rank sends the block it holds, seq_len / world positions.",
    "ulysses-no-factor": "Your Ulysses sends all of each tensor: in an all-to-all a "
    "rank keeps the 1 / world of its shard that is its own and sends the other "
    "(world - 1) / world.",
    "ulysses-three": "Your Ulysses counts three all-to-alls: q, k and v go out to head "
    "shards, and the output comes back to sequence shards, four in all.",
    "ulysses-full-seq": "Your Ulysses counts the full sequence: each all-to-all "
    "moves a rank's own shard, (batch, heads, seq_len / world, head_dim), of which it "
    "sends (world - 1) / world.",
    "swapped": "Your two methods are swapped: the ring passes K and V around (world - "
    "1) x 2 x shard; Ulysses runs four all-to-alls, 4 x shard x (world - 1) / world.",
    "elements": "You count elements: multiply by bytes_per_elem to get bytes.",
    "bits": "You return bits: return the number of bytes.",
}
_COMM_GROUPS = [
    {"ring-w-hops", "ring-k-only", "ring-full-seq"},
    {"ulysses-no-factor", "ulysses-three", "ulysses-full-seq"},
    {"swapped"},
    {"elements", "bits"},
]
_COMM_ARGS = ("batch", "heads", "seq_len", "head_dim", "world", "bytes_per_elem")


def _comm_bytes(case: tuple, slips=()) -> int:
    """Forward bytes one rank sends for ``case = (method, batch, heads, seq_len,
    head_dim, world, bytes_per_elem)``, right or with the named ``slips``."""
    method, b, h, L, d, W, size = case
    if "swapped" in slips:
        method = {"ring": "ulysses", "ulysses": "ring"}[method]
    shard = b * h * (L // W) * d
    if method == "ring":
        hops = W if "ring-w-hops" in slips else W - 1
        per_hop = (1 if "ring-k-only" in slips else 2) * shard
        per_hop *= W if "ring-full-seq" in slips else 1
        sent = hops * per_hop
    else:
        tensors = (3 if "ulysses-three" in slips else 4) * shard
        tensors *= W if "ulysses-full-seq" in slips else 1
        sent = tensors if "ulysses-no-factor" in slips else tensors * (W - 1) // W
    size = 1 if "elements" in slips else size
    return sent * size * (8 if "bits" in slips else 1)


def _comm_slip(results, cases) -> str:
    """The explanation of the fewest slips (two at most) that give the answer's
    ``results`` (None where it failed) on every case, or ''."""
    return explain_slips(results, cases, _comm_bytes, _COMM_GROUPS, _COMM_SLIPS)


def _comm_reference(case: tuple) -> int:
    method, *args = case
    per_rank = {"ring": ring_bytes_per_rank, "ulysses": ulysses_bytes_per_rank}
    return per_rank[method](*args)["forward"]


def _comm_formula(case: tuple) -> str:
    method, b, h, L, d, W, size = case
    shard = f"{b} x {h} x {L // W} x {d}"
    if method == "ring":
        return f"{W - 1} hops x K and V, 2 x {shard} elements each hop, x {size} bytes"
    return (
        f"4 all-to-alls (q, k, v, out) x {W - 1}/{W} of a {shard} shard x {size} bytes"
    )


def _comm_cases(gen: torch.Generator) -> list[tuple]:
    """A 32-head model at 128k tokens on 8 ranks, small and odd ones, one rank, and
    random ones."""
    cases = []
    for method in ("ring", "ulysses"):
        cases += [
            (method, 1, 32, 131072, 128, 8, 2),
            (method, 2, 6, 12, 8, 3, 4),  # Ulysses: the heads split over the ranks
            (method, 1, 8, 4096, 64, 4, 1),
            (method, 3, 2, 10, 4, 1, 2),  # one rank: nothing to send
        ]
    for method in ("ring", "ulysses", "ring", "ulysses"):  # configs no answer knows
        world = _pick(gen, (2, 3, 4, 6, 8))
        cases.append(
            (
                method,
                _randint(gen, 1, 4),
                world * _randint(gen, 1, 4),
                world * 16 * _randint(gen, 1, 64),
                _pick(gen, (32, 64, 80, 128)),
                world,
                _pick(gen, (1, 2, 4)),
            )
        )
    return cases


@register(
    "distributed-comm-bytes",
    library=forbid(
        "attnbook.distributed.ring_bytes_per_rank",
        "attnbook.distributed.ulysses_bytes_per_rank",
        why="The exercise asks you to count the bytes each method sends, which "
            "ring_bytes_per_rank and ulysses_bytes_per_rank return.",
    ),
    hint="shard = batch * heads * (seq_len // world) * head_dim elements; the ring "
    "sends K and V world - 1 times, (world - 1) * 2 * shard; Ulysses runs four "
    "all-to-alls (q, k, v, out), each sending (world - 1) / world of a shard, "
    "4 * shard * (world - 1) // world; times bytes_per_elem.",
)
def _check_comm_bytes(student) -> None:
    """``student(method, batch, heads, seq_len, head_dim, world, bytes_per_elem)`` ->
    the bytes (an int) one rank sends in the forward pass, ``method`` ``"ring"`` or
    ``"ulysses"``: ``ring_bytes_per_rank(...)["forward"]`` and
    ``ulysses_bytes_per_rank(...)["forward"]`` of :mod:`attnbook.distributed`, all
    arguments positional."""
    cases = _comm_cases(generator(1102))

    def call(case):
        method, *args = case
        what = f"comm_bytes({method!r}, " + ", ".join(
            f"{name}={value}" for name, value in zip(_COMM_ARGS, args)
        )
        what += ")"
        got = call_student(student, what, *case)
        if isinstance(got, float) and got.is_integer():
            raise AssertionError(
                f"{what}: return a number of bytes as an int, got float {got!r}. "
                "Multiply before dividing, with //: 4 * shard * (world - 1) // world."
            )
        assert_int(got, what, "a number of bytes as an int")
        return what, got

    for case in cases:
        what, got = call(case)
        expected = _comm_reference(case)
        if got != expected:
            results = []
            for other in cases:
                try:
                    results.append(call(other)[1])
                except AssertionError:
                    results.append(None)
            raise AssertionError(
                f"{what} should be {expected} ({_comm_formula(case)}), got {got}."
                + _comm_slip(results, cases)
            )


# ---------------------------------------------------------------------------------
# distributed-ring-step
# ---------------------------------------------------------------------------------
def _step(
    out,
    lse,
    q,
    k,
    v,
    q_start,
    k_start,
    is_causal,
    scale,
    *,
    mask="global",
    scale_as=None,
    merge="lse",
    guard=True,
    fill=float("-inf"),
):
    """One ring step, right or with one slip: ``mask`` ``"local"``, ``"no-q"`` or
    ``"no-k"`` (positions without an offset), ``"strict"`` (the diagonal hidden) or
    ``"reversed"``; ``scale_as`` ``"default"`` (1 / sqrt(D)) or ``"none"``; ``merge``
    ``"average"``, ``"sum"``, ``"overwrite"``, ``"no-rescale"``, ``"old-lse"`` or
    ``"block-lse"``; ``guard=False``: no finite shift (NaN for empty rows); ``fill``
    a finite number in place of -inf; ``mask="none"``: no mask at all."""
    s = {"default": q.shape[-1] ** -0.5, "none": 1.0}.get(scale_as, scale)
    scores = q @ k.transpose(-2, -1) * s
    if is_causal and mask != "none":
        qs, ks = {"local": (0, 0), "no-q": (0, k_start), "no-k": (q_start, 0)}.get(
            mask, (q_start, k_start)
        )
        i = qs + torch.arange(q.shape[-2])[:, None]
        j = ks + torch.arange(k.shape[-2])[None, :]
        hidden = {"strict": j >= i, "reversed": j < i}.get(mask, j > i)
        scores = scores.masked_fill(hidden, fill)
    block_lse = torch.logsumexp(scores, dim=-1)
    new_lse = torch.logaddexp(lse, block_lse)

    def finite(x):
        return torch.where(torch.isfinite(x), x, torch.zeros_like(x))

    safe = finite(new_lse) if guard else new_lse
    if merge in ("lse", "old-lse", "block-lse"):
        p = torch.exp(scores - safe[..., None])
        merged = torch.exp(lse - safe)[..., None] * out + p @ v
        return merged, {"lse": new_lse, "old-lse": lse, "block-lse": block_lse}[merge]
    own = torch.exp(scores - finite(block_lse)[..., None]) @ v  # the block's output
    if merge == "average":
        return (out + own) / 2, new_lse
    if merge == "sum":
        return out + own, new_lse
    if merge == "overwrite":
        return own, block_lse
    return out + torch.exp(block_lse - safe)[..., None] * own, new_lse  # no-rescale


_GLOBAL = (
    "You mask by local positions: under is_causal compare GLOBAL positions, query "
    "q_start + i against key k_start + j (a block from another rank is shifted)."
)
_EMPTY = (
    "An empty block must be a no-op: a row that sees no key of the block has "
    "block_lse = -inf (and a softmax of 0 / 0 = NaN), and while its lse is still "
    "-inf too, exp(lse - new_lse) is exp(-inf - (-inf)) = NaN; weight the block by "
    "exp(scores - safe) and the running output by exp(lse - safe), with a finite "
    "shift safe = new_lse (0 where it is -inf), so the row keeps its out and lse."
)
_AVERAGE = (
    "You average the outputs: weight each by its share of the softmax mass, out = "
    "exp(lse - new_lse) out + exp(block_lse - new_lse) out_block (the log-sum-exp "
    "merge)."
)
_NO_MASK = (
    "You never mask: under is_causal hide every key whose global position k_start + "
    "j is after the query's, q_start + i."
)
_FINITE_FILL = (
    "You fill the masked scores with a finite number: a row that sees no key of the "
    "block then averages the hidden ones (its scores are all equal); fill with -inf, "
    "so such a row's block_lse is -inf and the block adds nothing to it."
)
_RING_SLIPS = [
    ({"mask": "local"}, _GLOBAL),
    ({"mask": "no-q"}, _GLOBAL),
    ({"mask": "no-k"}, _GLOBAL),
    ({"mask": "none"}, _NO_MASK),
    ({"fill": -1e9}, _FINITE_FILL),
    (
        {"mask": "strict"},
        (
            "You hide the key at the query's own position: key j is visible to query i "
            "iff j <= i."
        ),
    ),
    (
        {"mask": "reversed"},
        "Your mask is the wrong way round: hide the keys after the query (j > i).",
    ),
    (
        {"scale_as": "default"},
        "You scale by 1 / sqrt(D): multiply the scores by the scale you are given.",
    ),
    (
        {"scale_as": "none"},
        "Your scores are not scaled: multiply q k^T by the scale you are given.",
    ),
    ({"merge": "average"}, _AVERAGE),
    ({"merge": "sum"}, _AVERAGE),
    (
        {"merge": "overwrite"},
        (
            "You return this block's attention alone: merge it with the running (out, "
            "lse), which holds the blocks before."
        ),
    ),
    (
        {"merge": "no-rescale"},
        (
            "You do not rescale the running output: it is normalized by the old lse, "
            "so multiply it by exp(lse - new_lse)."
        ),
    ),
    (
        {"merge": "old-lse"},
        (
            "You return the old lse: return new_lse = logaddexp(lse, block_lse), which "
            "the next step merges against."
        ),
    ),
    (
        {"merge": "block-lse"},
        (
            "Your lse is the block's alone: return the merged new_lse = logaddexp(lse, "
            "block_lse)."
        ),
    ),
    ({"guard": False}, _EMPTY),
]


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(
        a.double(), b.double(), atol=1e-9, rtol=1e-7, equal_nan=True
    )


def _matches(got, wrong, options) -> bool:
    """Whether the answer's ``(out, lse)`` is the slip's (only out for a finite fill,
    whose lse depends on the number)."""
    parts = 1 if "fill" in options else 2
    return all(_same(g, w) for g, w in zip(got[:parts], wrong[:parts]))


def _ring_slip(args, got, expected, others=()) -> str:
    """The note of a slip that gives the answer's ``got`` on these ``args``, or ''.

    Several slips can give one result on one call; ``others`` (``(args, got)`` of the
    answer on other calls, ``got`` None where it failed) pick the slip that gives the
    answer's result on those too, else the first that fits this call."""
    fits = [
        (options, note)
        for options, note in _RING_SLIPS
        if not all(_same(w, e) for w, e in zip(_step(*args, **options), expected))
        and _matches(got, _step(*args, **options), options)
    ]
    for options, note in fits:
        if all(
            result is None or _matches(result, _step(*call, **options), options)
            for call, result in others
        ):
            return " " + note
    return " " + fits[0][1] if fits else ""


def _state(q, keys, values, q_start, key_positions, is_causal, scale):
    """``(out, lse)`` of ``q`` (at ``q_start``) over the keys seen so far, from the
    definition: 0 and -inf for rows that see none."""
    scores = q @ keys.transpose(-2, -1) * scale
    if is_causal:
        i = q_start + torch.arange(q.shape[-2])[:, None]
        scores = scores.masked_fill(key_positions[None, :] > i, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    return torch.exp(scores - safe[..., None]) @ values, lse


def _size_note(err: Exception) -> str:
    if "size of tensor" in str(err):
        return (
            " The key block may be longer or shorter than q: number the keys with "
            "k_block.shape[-2] and the queries with q.shape[-2]."
        )
    return ""


def _call_step(student, what, args) -> tuple:
    """The answer's ``(out, lse)`` on copies of ``args``, as tensors of the right
    form; raise naming ``what`` otherwise."""
    copies = (a.clone() if torch.is_tensor(a) else a for a in args)
    got = call_student(student, what, *copies, note=_size_note)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise AssertionError(
            f"{what}: return the pair (out, lse), got {type(got).__name__}."
        )
    got = tuple(torch.as_tensor(g) for g in got)
    out, lse, q = args[:3]
    for name, g, shape in (("out", got[0], out.shape), ("lse", got[1], lse.shape)):
        if g.shape != shape:
            keepdim = " (logsumexp without keepdim)" if name == "lse" else ""
            raise AssertionError(
                f"{what}: {name} should have shape {tuple(shape)}{keepdim}, got "
                f"{tuple(g.shape)}."
            )
        if g.dtype != q.dtype:
            raise AssertionError(
                f"{what}: your {name} is {g.dtype}: keep the inputs' dtype, {q.dtype}."
            )
    return got


def _others(student, cases) -> list:
    """``(args, got)`` of the answer on each of ``cases`` (None where it failed)."""
    results = []
    for what, args, _ in cases:
        try:
            results.append((args, _call_step(student, what, args)))
        except AssertionError:  # call_student turns a crash into one
            results.append((args, None))
    return results


def _compare_step(student, what, args, expected, unit=()) -> tuple:
    """Call ``student`` on ``args``, compare its ``(out, lse)`` with ``expected`` and
    return it; raise naming ``what`` and a recognized slip on a mismatch (told apart
    with the answer's results on the ``unit`` cases)."""
    got = _call_step(student, what, args)
    for name, g, e in zip(("out", "lse"), got, expected):
        if torch.isnan(g).any() and not torch.isnan(e).any():
            q_start, k_start, is_causal = args[5:8]
            if is_causal and k_start > q_start:  # query row 0 sees no key
                note = " " + _EMPTY
            else:
                note = _ring_slip(args, got, expected, _others(student, unit))
            raise AssertionError(f"{what}: your {name} has NaN.{note}")
        if _same(g, e):
            continue
        if name == "lse" and not torch.equal(torch.isneginf(g), torch.isneginf(e)):
            where = "it must be -inf exactly for the rows that see no key yet"
        else:
            finite = torch.isfinite(e) & torch.isfinite(g)
            error = (g - e)[finite].abs().max().item() if finite.any() else math.inf
            where = f"max abs error {error:.3g}"
        note = _ring_slip(args, got, expected, _others(student, unit))
        seen_none = torch.isneginf(expected[1]) & torch.isfinite(got[1])
        if not note and args[7] and seen_none.any():
            note = " Your lse is finite for a row that sees no key yet. " + _FINITE_FILL
        raise AssertionError(
            f"{what}: {name} differs from the attention over the keys seen so far "
            f"({where})." + note
        )
    return got


def _blocks(gen, B, H, n, m, D):
    q = torch.randn(B, H, n, D, generator=gen, dtype=torch.float64)
    k = torch.randn(B, H, m, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H, m, D, generator=gen, dtype=torch.float64)
    return q, k, v


def _start(q) -> tuple:
    """The state before any block: out = 0, lse = -inf."""
    B, H, n, D = q.shape
    zeros = torch.zeros(B, H, n, D, dtype=q.dtype)
    return zeros, torch.full((B, H, n), float("-inf"), dtype=q.dtype)


def _unit_cases(gen) -> list:
    """``(description, args, expected)`` for single steps: a first block, a scale, a
    merge, and blocks no query (or some queries) can see."""
    B, H, D = _randint(gen, 1, 2), _randint(gen, 1, 3), _randint(gen, 2, 6)
    n = _randint(gen, 2, 4)
    m = n + _randint(gen, 1, 2)  # a key block of another length than q
    q, k, v = _blocks(gen, B, H, n, m, D)
    k0, v0 = _blocks(gen, B, H, n, m, D)[1:]
    default = D**-0.5
    start = _start(q)

    def at(a, length):
        return f"{a}..{a + length - 1}"

    def expect(blocks, q_start, is_causal, scale):
        keys = torch.cat([b[0] for b in blocks], dim=-2)
        values = torch.cat([b[1] for b in blocks], dim=-2)
        positions = torch.cat([torch.arange(s, s + len_) for _, _, s, len_ in blocks])
        return _state(q, keys, values, q_start, positions, is_causal, scale)

    first = expect([(k0, v0, 0, m)], 0, False, default)
    first_c = expect([(k0, v0, 0, m)], 10, True, default)
    cases = []
    what = (
        f"one block from the start (out = 0, lse = -inf), queries at {at(0, n)}, "
        f"keys at {at(0, m)}, is_causal=False"
    )
    expected = expect([(k, v, 0, m)], 0, False, default)
    cases.append((what, (*start, q, k, v, 0, 0, False, default), expected))
    what = (
        f"one block from the start with scale=0.3 (not 1 / sqrt(D) = {default:.3g}), "
        "is_causal=False"
    )
    expected = expect([(k, v, 0, m)], 0, False, 0.3)
    cases.append((what, (*start, q, k, v, 0, 0, False, 0.3), expected))
    what = "a second block merged into the state of a first one, is_causal=False"
    expected = expect([(k0, v0, 0, m), (k, v, m, m)], 0, False, default)
    cases.append((what, (*first, q, k, v, 0, m, False, default), expected))
    what = (
        f"a block no query sees (queries at {at(10, n)}, keys at {at(10 + n, m)}, "
        "is_causal=True) after a first block: out and lse must come back unchanged"
    )
    cases.append((what, (*first_c, q, k, v, 10, 10 + n, True, default), first_c))
    what = (
        f"a block no query sees (queries at {at(0, n)}, keys at {at(n, m)}, "
        "is_causal=True) from the start: out = 0 and lse = -inf must come back "
        "unchanged"
    )
    cases.append((what, (*start, q, k, v, 0, n, True, default), start))
    what = (
        f"a block only the later queries see (queries at {at(0, n)}, keys at "
        f"{at(1, m)}, is_causal=True) from the start: query 0 sees no key and keeps "
        "out = 0, lse = -inf"
    )
    expected = expect([(k, v, 1, m)], 0, True, default)
    cases.append((what, (*start, q, k, v, 0, 1, True, default), expected))
    what = (
        f"a block seen in part (queries at {at(10, n)}, keys at {at(11, m)}, "
        "is_causal=True) after a first block: query 10 sees no key of it and keeps "
        "its out and lse"
    )
    expected = expect([(k0, v0, 0, m), (k, v, 11, m)], 10, True, default)
    cases.append((what, (*first_c, q, k, v, 10, 11, True, default), expected))
    return cases


@register(
    "distributed-ring-step",
    library=forbid(
        "attnbook.distributed.ring_attention",
        "attnbook.distributed.attention_on_rank",
        "attnbook.flash.flash_forward",
        why="The exercise asks you to write one ring step, a block's attention at its "
            "global positions with its log-sum-exp, which ring_attention runs; "
            "merge_partials, to fold it into the running state, stays allowed.",
    ),
    hint="scores = q k^T * scale, under is_causal set to -inf where the key's global "
    "position k_start + j exceeds the query's q_start + i; block_lse = "
    "logsumexp(scores, -1), new_lse = logaddexp(lse, block_lse); with safe = new_lse "
    "(0 where it is -inf), out = exp(lse - safe) out + exp(scores - safe) v_block.",
)
def _check_ring_step(student) -> None:
    """``student(out, lse, q, k_block, v_block, q_start, k_start, is_causal, scale)``
    -> the updated ``(out, lse)`` of one rank's ring-attention step, in float64 (all
    arguments positional): first on single steps, then driving whole rings of 1, 2
    and 4 ranks (contiguous shards; rank r sees the blocks of ranks r, r - 1, ...),
    each state compared with the attention over the blocks seen so far and the last
    with ``torch.nn.functional.scaled_dot_product_attention`` on the full sequence."""
    gen = generator(1103)
    unit = _unit_cases(gen)
    for what, args, expected in unit:
        _compare_step(student, what, args, expected, unit)
    for world, is_causal in itertools.product((1, 2, 4), (False, True)):
        B, H, D = _randint(gen, 1, 2), _randint(gen, 1, 3), _randint(gen, 2, 6)
        n = _randint(gen, 2, 4)
        L = world * n
        q, k, v = _blocks(gen, B, H, L, L, D)
        scale = D**-0.5
        full = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        ring = (
            f"ring of world={world} (B={B}, H={H}, n={n} positions per rank, D={D}, "
            f"is_causal={is_causal})"
        )
        for rank in range(world):
            rows = slice(rank * n, (rank + 1) * n)
            q_r = q[:, :, rows]
            state = _start(q_r)
            seen = []
            for step in range(world):
                src = (rank - step) % world
                seen.append(src)
                cols = torch.cat([torch.arange(s * n, (s + 1) * n) for s in seen])
                if step == world - 1:  # every block seen: the whole sequence
                    scores = q_r @ k.transpose(-2, -1) * scale
                    if is_causal:
                        i = torch.arange(rank * n, (rank + 1) * n)[:, None]
                        scores = scores.masked_fill(torch.arange(L) > i, -float("inf"))
                    expected = (full[:, :, rows], torch.logsumexp(scores, dim=-1))
                else:
                    expected = _state(
                        q_r, k[:, :, cols], v[:, :, cols], rank * n, cols, is_causal,
                        scale,
                    )  # fmt: skip
                what = (
                    f"{ring}, rank {rank} (queries at {rank * n}..{rank * n + n - 1}),"
                    f" step {step}: the block of rank {src} (keys at {src * n}.."
                    f"{src * n + n - 1})"
                )
                args = (*state, q_r, k[:, :, src * n : (src + 1) * n],
                        v[:, :, src * n : (src + 1) * n], rank * n, src * n,
                        is_causal, scale)  # fmt: skip
                state = _compare_step(student, what, args, expected, unit)
