"""Checks for the exercises of the chapter on sparse attention."""

from __future__ import annotations

import torch

from ...core import scaled_dot_product_attention
from ...sparse import expand_block_mask, sliding_window_mask
from . import register
from .common import assert_close, assert_int, generator, largest_new_tensor
from .library import forbid


@register(
    "sparse-dilated-window",
    library=forbid(
        "attnbook.sparse.sliding_window_mask",
        "attnbook.sparse.longformer_mask",
        "attnbook.flex.sliding_window_mask_mod",
        "attnbook.flex.longformer_mask_mod",
        why="The exercise asks you to build the dilated window mask, which "
            "sliding_window_mask, the check's reference, returns.",
    ),
    hint="with offset = i - j (an (n, n) tensor from two aranges), allow |offset| <= "
    "window * dilation and "
    "offset % dilation == 0, and with causal also offset >= 0; return a bool tensor.",
)
def _check_dilated_window(student) -> None:
    """``student(seq_len, window, causal=False, dilation=1)`` must equal
    :func:`attnbook.sparse.sliding_window_mask`."""

    for n, window, causal, dilation in [
        (1, 0, False, 1),
        (8, 1, False, 1),
        (9, 2, False, 2),
        (12, 2, True, 3),
        (10, 0, True, 2),
        (16, 3, False, 4),
        (7, 10, True, 1),
    ]:
        got = student(n, window, is_causal=causal, dilation=dilation)
        what = f"seq_len={n}, window={window}, is_causal={causal}, dilation={dilation}"
        assert isinstance(got, torch.Tensor) and got.dtype == torch.bool, (
            f"{what}: return a bool tensor."
        )
        expected = sliding_window_mask(n, window, is_causal=causal, dilation=dilation)
        assert got.shape == expected.shape, (
            f"{what}: expected shape {tuple(expected.shape)}, got {tuple(got.shape)}."
        )
        wrong = (got != expected).nonzero()
        if len(wrong):
            i, j = wrong[0].tolist()
            raise AssertionError(
                f"{what}: entry (i, j) = {(i, j)} should be {bool(expected[i, j])}"
                f"{_window_reason(i, j, window, causal, dilation)}."
            )


def _window_reason(i: int, j: int, window: int, causal: bool, dilation: int) -> str:
    """Why ``mask[i, j]`` of a dilated, maybe causal, window is what it is."""
    offset, reach = i - j, window * dilation
    if abs(offset) > reach:
        return f": |i - j| = {abs(offset)} > window * dilation = {reach}"
    if offset % dilation:
        return (
            f": i - j = {offset} is not a multiple of the dilation, {offset} % "
            f"dilation = {offset % dilation}"
        )
    if causal and offset < 0:
        return f": with is_causal a query sees keys j <= i only, and j = {j} > i = {i}"
    return (
        f": |i - j| = {abs(offset)} <= window * dilation = {reach}, (i - j) % "
        f"dilation = 0{' and j <= i' if causal else ''}"
    )


@register(
    "sparse-local-attention",
    library=forbid(
        "attnbook.sparse.block_sparse_attention",
        "attnbook.attend.block_sparse_flash_attention",
        why="The exercise asks you to write local attention by reshaping into "
            "blocks; scaled_dot_product_attention, which it asks for, stays allowed.",
    ),
    hint="reshape q, k, v from (..., n, d) to (..., n // block_size, block_size, d), "
    "run ordinary scaled "
    "dot-product attention on the last two dimensions (every block is a batch entry), "
    "and reshape back.",
)
def _check_local_attention(student) -> None:
    """``student(q, k, v, block_size)`` must equal dense attention with a block-diagonal
    mask, in O(n b) memory."""

    gen = generator(105)
    for shape, block in [
        ((1, 4, 3), 1),
        ((2, 8, 4), 4),
        ((2, 3, 12, 8), 3),
        ((1, 6, 5), 6),
    ]:
        q, k, v = (
            torch.randn(*shape, generator=gen, dtype=torch.float64) for _ in range(3)
        )
        mask = expand_block_mask(torch.eye(shape[-2] // block, dtype=torch.bool), block)
        what = f"q of shape {shape}, block_size={block}"
        got = _run(what, student, q, k, v, block)
        expected = scaled_dot_product_attention(q, k, v, mask)
        if not _same(got, expected):
            n = shape[-2]
            swapped = expand_block_mask(torch.eye(block, dtype=torch.bool), n // block)
            slips = [
                (
                    scaled_dot_product_attention(q, k, v),
                    "your output is dense attention over all keys: each query attends "
                    f"to its own block of block_size = {block} positions only, "
                    "(..., n // block_size, block_size, d)",
                ),
                (
                    scaled_dot_product_attention(q, k, v, swapped),
                    f"your blocks are blocks of {n // block} positions, not block_size "
                    f"= {block}: reshape to (..., n // block_size, block_size, d)",
                ),
                (
                    scaled_dot_product_attention(q, k, v, mask, scale=1.0),
                    "your scores are not scaled by 1/sqrt(d)",
                ),
            ]
            for wrong, slip in slips:
                assert not _same(got, wrong), f"{what}: {slip}."
        assert_close(got, expected, what)
    n, block, dim = 2048, 16, 8
    q, k, v = (torch.randn(n, dim, generator=gen) for _ in range(3))
    largest = largest_new_tensor(student, q, k, v, block)
    assert largest <= n * block * dim, (
        f"for n={n}, block_size={block} your code made a tensor of {largest} elements: "
        f"local attention needs only n * block_size scores, not n^2 = {n * n}."
    )


@register(
    "sparse-sliding-window-attention",
    library=forbid(
        "attnbook.sparse.sliding_window_attention",
        "attnbook.attend.flash_attention",
        "attnbook.flash.flash_forward",
        why="The exercise asks you to write sliding-window attention in O(n w) "
            "memory, which sliding_window_attention and flash_attention's "
            "window_size implement.",
    ),
    hint="zero-pad k and v by `window` positions at both ends "
    "(torch.nn.functional.pad), take windows with "
    ".unfold(-2, 2 * window + 1, 1), score q against its window only, and mask the "
    "padded positions before the softmax.",
)
def _check_sliding_window_attention(student) -> None:
    """``student(q, k, v, window)`` must equal dense attention with the window mask and
    never form an ``n x n`` tensor."""

    gen = generator(104)
    for shape, window in [
        ((1, 1, 4), 0),
        ((2, 5, 4), 1),
        ((2, 3, 17, 8), 3),
        ((1, 6, 2), 10),
    ]:
        q, k, v = (
            torch.randn(*shape, generator=gen, dtype=torch.float64) for _ in range(3)
        )
        n = shape[-2]
        expected = scaled_dot_product_attention(q, k, v, sliding_window_mask(n, window))
        what = f"q of shape {shape}, window={window}"
        got = _run(what, student, q, k, v, window)
        if not _same(got, expected):
            slips = [
                (
                    scaled_dot_product_attention(
                        q, k, v, sliding_window_mask(n, window), scale=1.0
                    ),
                    "your scores are not scaled by 1/sqrt(d)",
                ),
                (
                    scaled_dot_product_attention(
                        q, k, v, sliding_window_mask(n, window, is_causal=True)
                    ),
                    "you attend to keys j <= i only: the window has `window` keys on "
                    "both sides of the query",
                ),
                (
                    scaled_dot_product_attention(q, k, v),
                    "your output is dense attention over all keys: each query sees "
                    "only |i - j| <= window",
                ),
            ]
            for wrong, slip in slips:
                assert not _same(got, wrong), f"{what}: {slip}."
            if isinstance(got, torch.Tensor) and got.shape == expected.shape:
                close = torch.isclose(got.double(), expected.double(), 1e-4, 1e-5)
                rows = (~close).flatten(0, -3)
                queries = rows.any(0).any(-1).nonzero().flatten().tolist()
                near_ends = all(i < window or i >= n - window for i in queries)
                assert not (queries and near_ends), (
                    f"{what}: only {_queries(queries)} near the ends differ"
                    f"{'s' if len(queries) == 1 else ''}, where "
                    "the window reaches past the sequence: mask the padded positions "
                    "(positions < 0 or positions >= n) with -inf before the softmax, "
                    "so that they get no weight."
                )
        assert_close(got, expected, what)
    n, window, dim = 2048, 4, 8
    q, k, v = (torch.randn(n, dim, generator=gen) for _ in range(3))
    largest = largest_new_tensor(student, q, k, v, window)
    assert largest <= n * (2 * window + 1) * dim, (
        f"for n={n}, window={window} your code made a tensor of {largest} elements: "
        f"memory must be O(n * window), not O(n^2) = {n * n}."
    )


def _run(what: str, student, *args):
    """``student(*args)``, with ``what`` named if it raises."""
    try:
        return student(*args)
    except NotImplementedError:
        raise
    except Exception as err:
        raise AssertionError(
            f"{what}: your code raised {type(err).__name__}: {err}"
        ) from None


def _same(actual, expected) -> bool:
    """``actual`` is a tensor of ``expected``'s shape and values."""
    return (
        isinstance(actual, torch.Tensor)
        and actual.shape == expected.shape
        and torch.allclose(actual.double(), expected.double(), atol=1e-5, rtol=1e-4)
    )


def _queries(indices: list[int]) -> str:
    """``query 4`` or ``queries 0 and 4`` or ``queries 0, 1 and 4``."""
    if len(indices) == 1:
        return f"query {indices[0]}"
    return f"queries {', '.join(map(str, indices[:-1]))} and {indices[-1]}"


def _layers_until_connected(n: int, w: int, dilated: bool) -> int:
    """Stack sliding-window layers (dilation 1, or (w + 1) ** l for layer l = 0, 1, ...)
    until every token reaches every other."""

    # reach[i, j]: the input of token j can influence the output of token i
    reach = torch.eye(n, dtype=torch.bool)
    layers = 0
    while not reach.all():
        mask = sliding_window_mask(n, w, dilation=(w + 1) ** layers if dilated else 1)
        # one more layer on top: i sees j if some key of i sees j
        reach = (mask.float() @ reach.float()) > 0
        layers += 1
    return layers


@register(
    "sparse-graph-depth",
    library=forbid(
        "attnbook.sparse.graph_distances",
        why="The exercise asks for the number of layers from the window's reach, "
            "which graph_distances measures directly; sliding_window_mask stays "
            "allowed.",
    ),
    hint="plain window: each layer moves information at most w positions, and one "
    "token needs no layer at all. "
    "Dilations 1, w+1, (w+1)^2, ...: k layers reach every offset up to (w+1)^k - 1 "
    "(digits 0..w in base w+1). "
    "Use integers (a loop, or -(-a // b) for a ceiling): math.log(125, 5) is "
    "3.0000000000000004.",
)
def _check_graph_depth(student) -> None:
    """``student(n, w, dilated)`` must equal the number of stacked
    :func:`attnbook.sparse.sliding_window_mask` layers after which a breadth-first
    search (boolean matrix products) finds every token connected to every other."""

    cases = [
        (1, 1),
        (2, 1),
        (3, 1),
        (5, 1),
        (7, 3),
        (64, 4),
        (256, 2),
        (100, 99),
        (10, 50),
    ]
    cases = [(n, w, False) for n, w in cases] + [
        (n, w, True)
        for n, w in [
            (1, 1),
            (2, 1),
            (3, 1),
            (4, 1),
            (5, 1),
            (64, 1),
            (65, 1),
            (243, 2),
            (244, 2),
            (256, 2),
            (125, 4),
            (126, 4),
            (100, 3),
            (9, 10),
        ]
    ]
    for n, w, dilated in cases:
        got = student(n, w, dilated=dilated)
        what = f"layers_to_connect({n}, {w}, dilated={dilated})"
        assert_int(got, what, "a number of layers as an int")
        expected = _layers_until_connected(n, w, dilated)
        assert got == expected, (
            f"{what} should be {expected} (a breadth-first search over the stacked "
            f"window masks), got {got}.{_depth_reason(got, expected, n, w, dilated)}"
        )


def _depth_reason(got: int, expected: int, n: int, w: int, dilated: bool) -> str:
    """How far ``got`` layers move information, against the farthest pair."""

    def layers(k: int) -> str:
        dilations = ", ".join(str((w + 1) ** i) for i in range(k))
        return f"{k} layer{'' if k == 1 else 's'}" + (
            f" of dilation{'' if k == 1 else 's'} {dilations}" if dilated and k else ""
        )

    if not 0 <= got <= 64:
        return ""
    if got > expected:
        if expected == 0:
            return " A single token needs no layer at all."
        return f" {layers(expected)} already connect{'s' if expected == 1 else ''} " + (
            f"all {n} tokens: they reach offsets up to {(w + 1) ** expected - 1} >= "
            f"n - 1 = {n - 1}."
            if dilated
            else f"all {n} tokens: each layer moves information up to w = {w} "
            "positions."
        )
    if dilated:
        return (
            f" With {layers(got)}, tokens reach offsets up to {(w + 1) ** got - 1} < "
            f"n - 1 = {n - 1}."
        )
    return (
        f" With {layers(got)}, information moves at most {got} * {w} = {got * w} "
        f"positions, and the first and the last token are {n - 1} apart."
    )
