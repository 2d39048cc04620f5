"""Checks for the exercises of the chapter on sparse attention."""

from __future__ import annotations

import torch

from . import register
from .common import assert_close, assert_int, generator, largest_new_tensor


@register(
    "sparse-dilated-window",
    hint="with offset = i - j (an (n, n) tensor from two aranges), allow |offset| <= "
    "window * dilation and "
    "offset % dilation == 0, and with causal also offset >= 0; return a bool tensor.",
)
def _check_dilated_window(student) -> None:
    """``student(seq_len, window, causal=False, dilation=1)`` must equal
    :func:`attnbook.sparse.sliding_window_mask`."""
    from ..sparse import sliding_window_mask

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
        assert not len(wrong), (
            f"{what}: entry (i, j) = {tuple(wrong[0].tolist())} should be "
            f"{bool(expected[tuple(wrong[0])])}."
        )


@register(
    "sparse-local-attention",
    hint="reshape q, k, v from (..., n, d) to (..., n // block_size, block_size, d), "
    "run ordinary scaled "
    "dot-product attention on the last two dimensions (every block is a batch entry), "
    "and reshape back.",
)
def _check_local_attention(student) -> None:
    """``student(q, k, v, block_size)`` must equal dense attention with a block-diagonal
    mask, in O(n b) memory."""
    from ..core import scaled_dot_product_attention
    from ..sparse import expand_block_mask

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
        assert_close(
            student(q, k, v, block),
            scaled_dot_product_attention(q, k, v, mask),
            f"q of shape {shape}, block_size={block}",
        )
    n, block, dim = 2048, 16, 8
    q, k, v = (torch.randn(n, dim, generator=gen) for _ in range(3))
    largest = largest_new_tensor(student, q, k, v, block)
    assert largest <= n * block * dim, (
        f"for n={n}, block_size={block} your code made a tensor of {largest} elements: "
        f"local attention needs only n * block_size scores, not n^2 = {n * n}."
    )


@register(
    "sparse-sliding-window-attention",
    hint="zero-pad k and v by `window` positions at both ends "
    "(torch.nn.functional.pad), take windows with "
    ".unfold(-2, 2 * window + 1, 1), score q against its window only, and mask the "
    "padded positions before the softmax.",
)
def _check_sliding_window_attention(student) -> None:
    """``student(q, k, v, window)`` must equal dense attention with the window mask and
    never form an ``n x n`` tensor."""
    from ..core import scaled_dot_product_attention
    from ..sparse import sliding_window_mask

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
        expected = scaled_dot_product_attention(
            q, k, v, sliding_window_mask(shape[-2], window)
        )
        assert_close(
            student(q, k, v, window), expected, f"q of shape {shape}, window={window}"
        )
    n, window, dim = 2048, 4, 8
    q, k, v = (torch.randn(n, dim, generator=gen) for _ in range(3))
    largest = largest_new_tensor(student, q, k, v, window)
    assert largest <= n * (2 * window + 1) * dim, (
        f"for n={n}, window={window} your code made a tensor of {largest} elements: "
        f"memory must be O(n * window), not O(n^2) = {n * n}."
    )


def _layers_until_connected(n: int, w: int, dilated: bool) -> int:
    """Stack sliding-window layers (dilation 1, or (w + 1) ** l for layer l = 0, 1, ...)
    until every token reaches every other."""
    from ..sparse import sliding_window_mask

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
            f"window masks), got {got}."
        )
