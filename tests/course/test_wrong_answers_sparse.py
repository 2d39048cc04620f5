"""Plausible wrong answers to the exercises of the chapter on sparse attention: each fails its check
with a message that points at the mistake."""

import math

import torch
import torch.nn.functional as F
from wrong_answers import Mistake, mistake_test

from attnbook.core import scaled_dot_product_attention
from attnbook.sparse import expand_block_mask, sliding_window_mask


# sparse-dilated-window: the book's solution with one thing changed
def _window_mask(seq_len, window, is_causal=False, dilation=1, *, strict=False, reach=None, modulo=True,
                 future=False):
    offset = torch.arange(seq_len)[:, None] - torch.arange(seq_len)[None, :]
    limit = window * dilation if reach is None else reach(window, dilation)
    mask = (offset.abs() < limit) if strict else (offset.abs() <= limit)
    if modulo:
        mask = mask & (offset % dilation == 0)
    if is_causal:
        mask = mask & ((offset <= 0) if future else (offset >= 0))
    return mask


def _window_strict_inequality(seq_len, window, is_causal=False, dilation=1):
    return _window_mask(seq_len, window, is_causal, dilation, strict=True)


def _window_causal_keeps_the_future(seq_len, window, is_causal=False, dilation=1):
    return _window_mask(seq_len, window, is_causal, dilation, future=True)


def _window_reach_not_dilated(seq_len, window, is_causal=False, dilation=1):
    return _window_mask(seq_len, window, is_causal, dilation, reach=lambda w, d: w)


def _window_every_key_in_reach(seq_len, window, is_causal=False, dilation=1):
    return _window_mask(seq_len, window, is_causal, dilation, modulo=False)


# sparse-local-attention: the book's solution with one thing changed
def _local(q, k, v, block_size, *, swap=False, scale=None, seq_dim=-2):
    def blocks(x):
        n_blocks = x.shape[seq_dim] // block_size
        shape = (block_size, n_blocks) if swap else (n_blocks, block_size)
        return x.reshape(*x.shape[:-2], *shape, x.shape[-1])

    out = scaled_dot_product_attention(blocks(q), blocks(k), blocks(v), scale=scale)
    return out.reshape(*q.shape[:-1], v.shape[-1])


def _local_dense_attention(q, k, v, block_size):
    return scaled_dot_product_attention(q, k, v)  # every key, not the query's block


def _local_blocks_and_count_swapped(q, k, v, block_size):
    return _local(q, k, v, block_size, swap=True)  # (..., block_size, n // block_size, d)


def _local_unscaled(q, k, v, block_size):
    return _local(q, k, v, block_size, scale=1.0)


def _local_with_the_dense_mask(q, k, v, block_size):
    mask = expand_block_mask(torch.eye(q.shape[-2] // block_size, dtype=torch.bool), block_size)
    return scaled_dot_product_attention(q, k, v, mask)  # right values, an n x n mask and n x n scores


def _local_length_from_dim_1(q, k, v, block_size):
    return _local(q, k, v, block_size, seq_dim=1)  # right for (batch, n, d) only


# sparse-sliding-window-attention: the book's solution with one thing changed
def _sliding(q, k, v, window, *, mask_padding=True, right_end=lambda p, n: p >= n, scale=True,
             left_only=False):
    n, span = q.shape[-2], 2 * window + 1
    pad = (0, 0, window, window)
    k_windows = F.pad(k, pad).unfold(-2, span, 1)
    v_windows = F.pad(v, pad).unfold(-2, span, 1)
    scores = (q.unsqueeze(-2) @ k_windows).squeeze(-2) / (math.sqrt(q.shape[-1]) if scale else 1.0)
    positions = torch.arange(n)[:, None] + torch.arange(-window, window + 1)
    if mask_padding:
        scores = scores.masked_fill((positions < 0) | right_end(positions, n), float("-inf"))
    if left_only:
        scores = scores.masked_fill(torch.arange(-window, window + 1) > 0, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return (v_windows @ weights.unsqueeze(-1)).squeeze(-1)


def _sliding_padding_not_masked(q, k, v, window):
    return _sliding(q, k, v, window, mask_padding=False)


def _sliding_last_padded_slot_kept(q, k, v, window):
    return _sliding(q, k, v, window, right_end=lambda p, n: p > n)


def _sliding_unscaled(q, k, v, window):
    return _sliding(q, k, v, window, scale=False)


def _sliding_left_half_only(q, k, v, window):
    return _sliding(q, k, v, window, left_only=True)


def _sliding_with_the_dense_mask(q, k, v, window):
    return scaled_dot_product_attention(q, k, v, sliding_window_mask(q.shape[-2], window))


# sparse-graph-depth: tests/course/test_exercises.py already rejects n // w, (n - 1) // w, the base 2w + 1,
# float logarithms and a float
def _layers(n, w, dilated=False, *, plain=None, at_least=lambda n: n):
    if not dilated:
        return -(-(n - 1) // w) if plain is None else plain(n, w)
    layers = 0
    while (w + 1) ** layers < at_least(n):
        layers += 1
    return layers


def _layers_two_sided_reach(n, w, dilated=False):
    return _layers(n, w, dilated, plain=lambda n, w: -(-(n - 1) // (2 * w)))  # w per side taken as 2 w


def _layers_dilated_loop_off_by_one(n, w, dilated=False):
    return _layers(n, w, dilated, at_least=lambda n: n + 1)  # while (w + 1) ** layers <= n


def _layers_dilated_to_offset_n_minus_2(n, w, dilated=False):
    return _layers(n, w, dilated, at_least=lambda n: n - 1)  # the farthest offset taken as n - 2


def _layers_window_ignored(n, w, dilated=False):
    return n - 1 if not dilated else _layers(n, w, True)  # one position per layer


MISTAKES = [
    Mistake("sparse-dilated-window", "|i - j| < window * dilation", _window_strict_inequality,
            ("seq_len=1, window=0, is_causal=False, dilation=1: entry (i, j) = (0, 0) should be True",
             "|i - j| = 0 <= window * dilation = 0")),
    Mistake("sparse-dilated-window", "causal keeps the keys after the query", _window_causal_keeps_the_future,
            ("seq_len=12, window=2, is_causal=True, dilation=3: entry (i, j) = (0, 3) should be False",
             "with is_causal a query sees keys j <= i only", "j = 3 > i = 0")),
    Mistake("sparse-dilated-window", "reach of window, not window * dilation", _window_reach_not_dilated,
            ("seq_len=9, window=2, is_causal=False, dilation=2: entry (i, j) = (0, 4) should be True",
             "|i - j| = 4 <= window * dilation = 4")),
    Mistake("sparse-dilated-window", "every key within reach, dilation not a step",
            _window_every_key_in_reach,
            ("seq_len=9, window=2, is_causal=False, dilation=2: entry (i, j) = (0, 1) should be False",
             "i - j = -1 is not a multiple of the dilation")),
    Mistake("sparse-local-attention", "dense attention over every key", _local_dense_attention,
            ("q of shape (1, 4, 3), block_size=1", "your output is dense attention over all keys",
             "its own block of block_size = 1 positions")),
    Mistake("sparse-local-attention", "(block_size, n // block_size) reshape",
            _local_blocks_and_count_swapped,
            ("q of shape (1, 4, 3), block_size=1", "dense attention over all keys",
             "(..., n // block_size, block_size, d)")),
    Mistake("sparse-local-attention", "no 1/sqrt(d) scale", _local_unscaled,
            ("q of shape (2, 8, 4), block_size=4", "your scores are not scaled by 1/sqrt(d)")),
    Mistake("sparse-local-attention", "dense attention under the block mask", _local_with_the_dense_mask,
            ("for n=2048, block_size=16 your code made a tensor of 4194304 elements",
             "local attention needs only n * block_size scores")),
    Mistake("sparse-local-attention", "length read from dim 1", _local_length_from_dim_1,
            ("q of shape (2, 3, 12, 8), block_size=3: your code raised RuntimeError",
             "is invalid for input")),
    Mistake("sparse-sliding-window-attention", "padded slots not masked", _sliding_padding_not_masked,
            ("q of shape (2, 5, 4), window=1: only queries 0 and 4 near the ends differ",
             "mask the padded positions", "with -inf before the softmax")),
    Mistake("sparse-sliding-window-attention", "last padded slot kept (p > n)",
            _sliding_last_padded_slot_kept,
            ("q of shape (2, 5, 4), window=1: only query 4 near the ends differs", "positions >= n")),
    Mistake("sparse-sliding-window-attention", "no 1/sqrt(d) scale", _sliding_unscaled,
            ("q of shape (2, 5, 4), window=1: your scores are not scaled by 1/sqrt(d)",)),
    Mistake("sparse-sliding-window-attention", "left half of the window only", _sliding_left_half_only,
            ("q of shape (2, 5, 4), window=1: you attend to keys j <= i only", "on both sides of the query")),
    Mistake("sparse-sliding-window-attention", "dense attention under the window mask",
            _sliding_with_the_dense_mask,
            ("for n=2048, window=4 your code made a tensor of 4194304 elements",
             "memory must be O(n * window)")),
    Mistake("sparse-graph-depth", "w per side taken as 2 w per layer", _layers_two_sided_reach,
            ("layers_to_connect(3, 1, dilated=False) should be 2", "got 1.",
             "With 1 layer, information moves at most 1 * 1 = 1 positions", "the last token are 2 apart")),
    Mistake("sparse-graph-depth", "dilated loop with <=", _layers_dilated_loop_off_by_one,
            ("layers_to_connect(1, 1, dilated=True) should be 0", "got 1.",
             "A single token needs no layer at all")),
    Mistake("sparse-graph-depth", "dilated: offsets up to n - 2", _layers_dilated_to_offset_n_minus_2,
            ("layers_to_connect(2, 1, dilated=True) should be 1", "got 0.",
             "With 0 layers, tokens reach offsets up to 0 < n - 1 = 1")),
    Mistake("sparse-graph-depth", "window ignored: one position per layer", _layers_window_ignored,
            ("layers_to_connect(7, 3, dilated=False) should be 2", "got 6.",
             "2 layers already connect all 7 tokens", "each layer moves information up to w = 3 positions")),
]

test_wrong_answers = mistake_test(MISTAKES)
