"""Plausible wrong answers to the exercises of the chapter on attention across devices:
each fails its check with a message that points at the mistake."""

import pytest
import torch
from wrong_answers import Mistake, mistake_test, verdict

import attnbook.flash
from attnbook.distributed import (
    ring_bytes_per_rank,
    shard_positions,
    ulysses_bytes_per_rank,
)
from attnbook.course.checks import common, distributed


# distributed-zigzag-positions: the book's solution with one thing changed
def _zigzag(rank, world, seq_len, *, late=None, chunks=2, swap=False):
    c = seq_len // (chunks * world)  # the chunk length
    early = list(range(rank * c, (rank + 1) * c))
    j = 2 * world - 1 - rank if late is None else late(rank, world)
    late = list(range(j * c, (j + 1) * c))
    return late + early if swap else early + late


def _zigzag_contiguous(rank, world, seq_len):
    n = seq_len // world
    return list(range(rank * n, (rank + 1) * n))


def _zigzag_late_chunk_first(rank, world, seq_len):
    return _zigzag(rank, world, seq_len, swap=True)


def _zigzag_late_chunk_2w_minus_r(rank, world, seq_len):
    return _zigzag(rank, world, seq_len, late=lambda r, w: 2 * w - r)


def _zigzag_world_chunks(rank, world, seq_len):  # chunks r and W - 1 - r of W
    return _zigzag(rank, world, seq_len, chunks=1, late=lambda r, w: w - 1 - r)


def _zigzag_chunk_of_seq_len_over_world(rank, world, seq_len):
    return _zigzag(rank, world, seq_len, chunks=1)


def _zigzag_late_chunk_w_plus_r(rank, world, seq_len):
    return _zigzag(rank, world, seq_len, late=lambda r, w: w + r)


def _zigzag_striped(rank, world, seq_len):
    return list(range(rank, seq_len, world))


def _zigzag_true_division(rank, world, seq_len):
    c = seq_len / (2 * world)
    return list(range(rank * c, (rank + 1) * c))


def _zigzag_float_tensor(rank, world, seq_len):
    c = seq_len / (2 * world)
    late = 2 * world - 1 - rank
    return torch.cat(
        [torch.arange(rank * c, (rank + 1) * c), torch.arange(late * c, (late + 1) * c)]
    )


def _zigzag_early_chunk_only(rank, world, seq_len):
    c = seq_len // (2 * world)
    return list(range(rank * c, (rank + 1) * c))


def _zigzag_as_a_tensor(rank, world, seq_len):  # accepted: a 1-D integer tensor
    return torch.tensor(_zigzag(rank, world, seq_len))


# distributed-comm-bytes: the book's solution with one thing changed
def _comm(
    method,
    batch,
    heads,
    seq_len,
    head_dim,
    world,
    bytes_per_elem,
    *,
    hops=None,
    kv=2,
    ring_len=None,
    tensors=4,
    factor=True,
    uly_len=None,
    swap=False,
    size=None,
):
    if swap:
        method = {"ring": "ulysses", "ulysses": "ring"}[method]
    size = bytes_per_elem if size is None else size
    shard = batch * heads * (seq_len // world) * head_dim  # one tensor's shard
    if method == "ring":  # K and V make W - 1 hops
        per_hop = shard if ring_len is None else batch * heads * ring_len * head_dim
        return (world - 1 if hops is None else hops) * kv * per_hop * size
    if uly_len is not None:
        shard = batch * heads * uly_len * head_dim
    if not factor:
        return tensors * shard * size
    return tensors * shard * (world - 1) // world * size


def _comm_w_hops(method, b, h, L, d, W, size):
    return _comm(method, b, h, L, d, W, size, hops=W)


def _comm_ring_keys_only(method, b, h, L, d, W, size):
    return _comm(method, b, h, L, d, W, size, kv=1)


def _comm_ring_full_sequence(method, b, h, L, d, W, size):
    return _comm(method, b, h, L, d, W, size, ring_len=L)


def _comm_ulysses_without_the_factor(method, b, h, L, d, W, size):
    return _comm(method, b, h, L, d, W, size, factor=False)


def _comm_ulysses_three_all_to_alls(method, b, h, L, d, W, size):
    return _comm(method, b, h, L, d, W, size, tensors=3)


def _comm_ulysses_full_sequence(method, b, h, L, d, W, size):
    return _comm(method, b, h, L, d, W, size, uly_len=L)


def _comm_methods_swapped(method, b, h, L, d, W, size):
    return _comm(method, b, h, L, d, W, size, swap=True)


def _comm_elements(method, b, h, L, d, W, size):
    return _comm(method, b, h, L, d, W, size, size=1)


def _comm_swapped_elements(method, b, h, L, d, W, size):
    return _comm(method, b, h, L, d, W, size, swap=True, size=1)


def _comm_true_division(method, b, h, L, d, W, size):
    shard = b * h * (L / W) * d
    if method == "ring":
        return (W - 1) * 2 * shard * size
    return 4 * shard * (W - 1) / W * size


# distributed-ring-step: the book's solution with one thing changed
def _ring(
    out,
    lse,
    q,
    k_block,
    v_block,
    q_start,
    k_start,
    is_causal,
    scale,
    *,
    offsets=True,
    guard=True,
    scale_as=None,
    merge="lse",
    fill=float("-inf"),
    causal=True,
    strict=False,
    scores=None,
):
    s = {"sqrt": q.shape[-1] ** -0.5, "none": 1.0}.get(scale_as, scale)
    scores = q @ k_block.transpose(-2, -1) * s if scores is None else scores
    if is_causal and causal:  # from the global positions: key j visible iff j <= i
        i = (q_start if offsets else 0) + torch.arange(q.shape[-2])[:, None]
        j = (k_start if offsets else 0) + torch.arange(k_block.shape[-2])[None, :]
        scores = scores.masked_fill(j >= i if strict else j > i, fill)
    block_lse = torch.logsumexp(scores, dim=-1)  # -inf for rows that see nothing
    new_lse = torch.logaddexp(lse, block_lse)
    if merge == "average":
        own = torch.softmax(scores, dim=-1).nan_to_num() @ v_block
        return (out + own) / 2, new_lse
    if merge == "overwrite":
        return torch.softmax(scores, dim=-1).nan_to_num() @ v_block, block_lse
    if guard:
        safe = torch.where(torch.isfinite(new_lse), new_lse, torch.zeros_like(new_lse))
    else:
        safe = new_lse
    p = torch.exp(scores - safe[..., None])  # this block's weights, normalized globally
    old = 1.0 if merge == "no-rescale" else torch.exp(lse - safe)[..., None]
    lse_out = lse if merge == "old-lse" else new_lse
    return old * out + p @ v_block, lse_out


def _ring_local_positions(*args):
    return _ring(*args, offsets=False)


def _ring_no_guard(*args):
    return _ring(*args, guard=False)


def _ring_softmax_then_merge_partials(
    out, lse, q, k_block, v_block, q_start, k_start, is_causal, scale
):
    scores = q @ k_block.transpose(-2, -1) * scale
    if is_causal:
        i = q_start + torch.arange(q.shape[-2])[:, None]
        j = k_start + torch.arange(k_block.shape[-2])[None, :]
        scores = scores.masked_fill(j > i, float("-inf"))
    block_out = torch.softmax(scores, dim=-1) @ v_block  # NaN for a row that sees none
    return attnbook.flash.merge_partials(
        out, lse, block_out, torch.logsumexp(scores, -1)
    )


def _ring_sqrt_d_scale(*args):
    return _ring(*args, scale_as="sqrt")


def _ring_unscaled(*args):
    return _ring(*args, scale_as="none")


def _ring_average(*args):
    return _ring(*args, merge="average")


def _ring_overwrite(*args):
    return _ring(*args, merge="overwrite")


def _ring_no_rescale(*args):
    return _ring(*args, merge="no-rescale")


def _ring_old_lse(*args):
    return _ring(*args, merge="old-lse")


def _ring_finite_fill(*args):
    return _ring(*args, fill=-1e9)


def _ring_finfo_min_fill(*args):
    return _ring(*args, fill=torch.finfo(torch.float64).min)


def _ring_no_mask(*args):
    return _ring(*args, causal=False)


def _ring_strict_mask(*args):
    return _ring(*args, strict=True)


def _ring_keys_numbered_like_queries(
    out, lse, q, k_block, v_block, q_start, k_start, is_causal, scale
):
    scores = q @ k_block.transpose(-2, -1) * scale
    if is_causal:
        i = q_start + torch.arange(q.shape[-2])[:, None]
        j = k_start + torch.arange(q.shape[-2])[None, :]  # the length of q, not k
        scores = scores.masked_fill(j > i, float("-inf"))
    return _ring(out, lse, q, k_block, v_block, 0, 0, False, 1.0, scores=scores)


def _ring_skips_the_blocks_before_its_queries(*args):
    out, lse, *_, q_start, k_start, is_causal, _ = args
    if is_causal and k_start < q_start:  # "earlier blocks are masked"
        return out, lse
    return _ring(*args)


def _ring_lse_keepdim(*args):
    out, lse = _ring(*args)
    return out, lse[..., None]


def _ring_float32(*args):
    out, lse = _ring(*args)
    return out.float(), lse.float()


def _ring_out_only(*args):
    return _ring(*args)[0]


_RING_CASE = (
    "comm_bytes('ring', batch=1, heads=32, seq_len=131072, head_dim=128, world=8, "
    "bytes_per_elem=2)"
)
_ULYSSES_CASE = _RING_CASE.replace("'ring'", "'ulysses'")

MISTAKES = [
    Mistake(
        "distributed-zigzag-positions",
        "the contiguous layout",
        _zigzag_contiguous,
        (
            "zigzag_positions(rank=0, world=2, seq_len=8) should be [0, 1, 6, 7]",
            "(chunks 0 and 3 of 4, 2 positions each), got [0, 1, 2, 3].",
            "That is the contiguous layout",
        ),
    ),
    Mistake(
        "distributed-zigzag-positions",
        "late chunk first",
        _zigzag_late_chunk_first,
        ("should be [0, 1, 6, 7]", "got [6, 7, 0, 1]", "the early chunk first"),
    ),
    Mistake(
        "distributed-zigzag-positions",
        "late chunk 2W - r",
        _zigzag_late_chunk_2w_minus_r,
        ("got [0, 1, 8, 9]", "Off by one: the late chunk is 2 world - 1 - r"),
    ),
    Mistake(
        "distributed-zigzag-positions",
        "W chunks, r and W - 1 - r",
        _zigzag_world_chunks,
        ("got [0, 1, 2, 3, 4, 5, 6, 7]", "You cut the sequence into world chunks"),
    ),
    Mistake(
        "distributed-zigzag-positions",
        "chunk length seq_len / world",
        _zigzag_chunk_of_seq_len_over_world,
        ("should be [0, 1, 6, 7]", "You cut the sequence into world chunks"),
    ),
    Mistake(
        "distributed-zigzag-positions",
        "late chunk W + r",
        _zigzag_late_chunk_w_plus_r,
        ("got [0, 1, 4, 5]", "Your late chunk is world + r"),
    ),
    Mistake(
        "distributed-zigzag-positions",
        "the striped layout",
        _zigzag_striped,
        ("got [0, 2, 4, 6]", "That is the striped layout"),
    ),
    Mistake(
        "distributed-zigzag-positions",
        "chunk length with /",
        _zigzag_true_division,
        (
            "zigzag_positions(rank=0, world=2, seq_len=8): your code raised TypeError",
            "The chunk length is seq_len // (2 * world): / gives a float.",
        ),
    ),
    Mistake(
        "distributed-zigzag-positions",
        "a float tensor",
        _zigzag_float_tensor,
        ("return integer positions, got a Tensor of dtype torch.float32",),
    ),
    Mistake(
        "distributed-zigzag-positions",
        "the early chunk only",
        _zigzag_early_chunk_only,
        ("got [0, 1].", "A rank holds seq_len / world = 4 positions"),
    ),
    Mistake(
        "distributed-comm-bytes",
        "ring with W hops",
        _comm_w_hops,
        (
            _RING_CASE + " should be 1879048192 (7 hops x K and V, 2 x 1 x 32 x 16384 "
            "x 128 elements each hop, x 2 bytes), got 2147483648.",
            "Your ring makes world hops",
        ),
    ),
    Mistake(
        "distributed-comm-bytes",
        "ring counts K only",
        _comm_ring_keys_only,
        ("got 939524096.", "Your ring sends the keys only"),
    ),
    Mistake(
        "distributed-comm-bytes",
        "ring sends the full sequence each hop",
        _comm_ring_full_sequence,
        ("should be 1879048192", "Your ring sends the whole sequence's K and V"),
    ),
    Mistake(
        "distributed-comm-bytes",
        "Ulysses without (W - 1) / W",
        _comm_ulysses_without_the_factor,
        (
            _ULYSSES_CASE + " should be 469762048 (4 all-to-alls (q, k, v, out) x 7/8 "
            "of a 1 x 32 x 16384 x 128 shard x 2 bytes), got 536870912.",
            "Your Ulysses sends all of each tensor",
        ),
    ),
    Mistake(
        "distributed-comm-bytes",
        "Ulysses with three all-to-alls",
        _comm_ulysses_three_all_to_alls,
        ("should be 469762048", "Your Ulysses counts three all-to-alls"),
    ),
    Mistake(
        "distributed-comm-bytes",
        "Ulysses over the full sequence",
        _comm_ulysses_full_sequence,
        ("should be 469762048", "Your Ulysses counts the full sequence"),
    ),
    Mistake(
        "distributed-comm-bytes",
        "the methods swapped",
        _comm_methods_swapped,
        ("got 469762048.", "Your two methods are swapped"),
    ),
    Mistake(
        "distributed-comm-bytes",
        "elements, not bytes",
        _comm_elements,
        ("got 939524096.", "You count elements"),
    ),
    Mistake(
        "distributed-comm-bytes",
        "the methods swapped and elements",
        _comm_swapped_elements,
        ("Your two methods are swapped", "You count elements"),
    ),
    Mistake(
        "distributed-comm-bytes",
        "a float from /",
        _comm_true_division,
        ("return a number of bytes as an int, got float 1879048192.0",),
    ),
    Mistake(
        "distributed-ring-step",
        "a mask from local positions",
        _ring_local_positions,
        ("a block no query sees", "You mask by local positions"),
    ),
    Mistake(
        "distributed-ring-step",
        "NaN for an empty block",
        _ring_no_guard,
        (
            "a block no query sees",
            "from the start: out = 0 and lse = -inf must come back unchanged",
            "your out has NaN.",
            "An empty block must be a no-op",
        ),
    ),
    Mistake(
        "distributed-ring-step",
        "softmax of the block, then merge_partials",
        _ring_softmax_then_merge_partials,
        (
            "after a first block: out and lse must come back unchanged",
            "your out has NaN.",
            "An empty block must be a no-op",
        ),
    ),
    Mistake(
        "distributed-ring-step",
        "scale 1 / sqrt(D) whatever the argument",
        _ring_sqrt_d_scale,
        ("one block from the start with scale=0.3", "You scale by 1 / sqrt(D)"),
    ),
    Mistake(
        "distributed-ring-step",
        "no scale",
        _ring_unscaled,
        ("one block from the start (out = 0", "Your scores are not scaled"),
    ),
    Mistake(
        "distributed-ring-step",
        "averaging the outputs",
        _ring_average,
        ("one block from the start (out = 0", "You average the outputs"),
    ),
    Mistake(
        "distributed-ring-step",
        "the block's attention alone",
        _ring_overwrite,
        (
            "a second block merged into the state of a first one",
            "You return this block's attention alone",
        ),
    ),
    Mistake(
        "distributed-ring-step",
        "the running output not rescaled",
        _ring_no_rescale,
        ("a second block merged", "You do not rescale the running output"),
    ),
    Mistake(
        "distributed-ring-step",
        "the old lse returned",
        _ring_old_lse,
        ("lse differs", "You return the old lse"),
    ),
    Mistake(
        "distributed-ring-step",
        "masked with -1e9",
        _ring_finite_fill,
        ("a block no query sees", "You fill the masked scores with a finite number"),
    ),
    Mistake(
        "distributed-ring-step",
        "masked with finfo.min",
        _ring_finfo_min_fill,
        ("a block no query sees", "You fill the masked scores with a finite number"),
    ),
    Mistake(
        "distributed-ring-step",
        "no causal mask",
        _ring_no_mask,
        ("a block no query sees", "You never mask"),
    ),
    Mistake(
        "distributed-ring-step",
        "the diagonal masked",
        _ring_strict_mask,
        ("query 0 sees no key", "You hide the key at the query's own position"),
    ),
    Mistake(
        "distributed-ring-step",
        "keys numbered with the length of q",
        _ring_keys_numbered_like_queries,
        (
            "a block no query sees",
            "must come back unchanged: your code raised RuntimeError",
            "number the keys with k_block.shape[-2]",
        ),
    ),
    Mistake(
        "distributed-ring-step",
        "the blocks before its queries skipped",
        _ring_skips_the_blocks_before_its_queries,
        (
            "ring of world=2 (B=",
            "is_causal=True), rank 1 (queries at ",
            "step 1: the block of rank 0 (keys at 0..",
            "out differs from the attention over the keys seen so far",
        ),
    ),
    Mistake(
        "distributed-ring-step",
        "lse with keepdim",
        _ring_lse_keepdim,
        ("lse should have shape", "(logsumexp without keepdim)"),
    ),
    Mistake(
        "distributed-ring-step",
        "float32",
        _ring_float32,
        ("your out is torch.float32: keep the inputs' dtype, torch.float64.",),
    ),
    Mistake(
        "distributed-ring-step",
        "out only",
        _ring_out_only,
        ("return the pair (out, lse), got Tensor.",),
    ),
]

test_wrong_answers = mistake_test(MISTAKES)


# ---------------------------------------------------------------------------------
# The book's solutions and the checks' references against attnbook.distributed
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("salt", [0, 1, 2**40 + 7])
def test_the_book_solutions_with_nothing_changed_pass(salt):
    with common.fresh_inputs(salt):
        for label, answer in [
            ("distributed-zigzag-positions", _zigzag),
            ("distributed-zigzag-positions", _zigzag_as_a_tensor),
            ("distributed-comm-bytes", _comm),
            ("distributed-ring-step", _ring),
        ]:
            result = verdict(label, answer)
            assert result.passed, result.message


def test_a_stub_is_not_attempted():
    def stub(*args):
        raise NotImplementedError("Exercise: write your solution here")

    for label in distributed_labels():
        result = verdict(label, stub)
        assert not result.passed and "not attempted" in result.message


def distributed_labels():
    from attnbook.exercises import labels

    return [label for label in labels() if label.startswith("distributed-")]


def test_the_zigzag_reference_is_shard_positions_and_every_slip_shows():
    for world in (1, 2, 3, 4, 8):
        for c in (1, 2, 5):
            for rank in range(world):
                args = (rank, world, 2 * world * c)
                expected = shard_positions(*args[:2], args[2], layout="zigzag")
                assert distributed._zigzag(*args) == _zigzag(*args)
                assert _zigzag(*args) == expected.tolist()
    calls = [(r, 2, 8) for r in range(2)] + [(r, 4, 16) for r in range(4)]
    for slip, note in distributed._ZIGZAG_SLIPS:
        assert any(slip(*call) != _zigzag(*call) for call in calls), note


@pytest.mark.parametrize("salt", [0, 1, 2**40 + 7])
def test_the_comm_bytes_cases_and_slips_follow_the_closed_forms(salt):
    with common.fresh_inputs(salt):
        cases = distributed._comm_cases(common.generator(1102))
    gen = torch.Generator().manual_seed(salt)
    for _ in range(300):  # and the book's rounding agrees everywhere
        world = int(torch.randint(1, 9, (1,), generator=gen))
        b, h, n, d, size = (int(x) for x in torch.randint(1, 50, (5,), generator=gen))
        cases += [(m, b, world * h, world * n, d, world, size) for m in ("ring", "ulysses")]
    for case in cases:
        method, *args = case
        per_rank = {"ring": ring_bytes_per_rank, "ulysses": ulysses_bytes_per_rank}
        expected = per_rank[method](*args)["forward"]
        assert distributed._comm_reference(case) == expected
        assert distributed._comm_bytes(case) == expected == _comm(*case)
    for slip in distributed._COMM_SLIPS:  # each slip shows on the check's cases
        cases = distributed._comm_cases(common.generator(1102))
        assert any(
            distributed._comm_bytes(c, (slip,)) != distributed._comm_bytes(c)
            for c in cases
        )


def test_the_ring_slips_differ_from_the_step_where_they_matter():
    """Every slip of the ring step changes some unit case, so the check tells it."""
    cases = distributed._unit_cases(common.generator(1103))
    for options, note in distributed._RING_SLIPS:
        assert any(
            not all(
                distributed._same(w, e)
                for w, e in zip(distributed._step(*args, **options), expected)
            )
            for _, args, expected in cases
        ), note
    for _, args, expected in cases:  # the reference step gives the expected states
        got = distributed._step(*args)
        assert all(distributed._same(g, e) for g, e in zip(got, expected))
