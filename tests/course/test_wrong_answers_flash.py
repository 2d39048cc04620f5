"""Plausible wrong answers to the exercises of the chapter on FlashAttention: each fails its check with
a message that points at the mistake."""

import torch
from wrong_answers import Mistake, mistake_test


# flash-merge-states: the book's solution with one thing changed
def _merge(m_a, l_a, m_b, l_b, *, guard=True, return_shift=False, factor=None):
    m = torch.maximum(m_a, m_b)
    shift = torch.where(torch.isfinite(m), m, torch.zeros_like(m)) if guard else m
    if factor is None:
        l = l_a * torch.exp(m_a - shift) + l_b * torch.exp(m_b - shift)
    else:
        l = factor(m_a, l_a, m_b, l_b, shift)
    return (shift if return_shift else m), l


def _merge_without_rescaling(m_a, l_a, m_b, l_b):
    return _merge(m_a, l_a, m_b, l_b, factor=lambda m_a, l_a, m_b, l_b, m: l_a + l_b)


def _merge_inverted_factor(m_a, l_a, m_b, l_b):
    return _merge(m_a, l_a, m_b, l_b,
                  factor=lambda m_a, l_a, m_b, l_b, m: l_a * torch.exp(m - m_a) + l_b * torch.exp(m - m_b))


def _merge_rescales_only_the_first(m_a, l_a, m_b, l_b):
    return _merge(m_a, l_a, m_b, l_b, factor=lambda m_a, l_a, m_b, l_b, m: l_a * torch.exp(m_a - m) + l_b)


def _merge_nan_for_two_empty_blocks(m_a, l_a, m_b, l_b):
    return _merge(m_a, l_a, m_b, l_b, guard=False)


def _merge_returns_the_finite_shift_as_m(m_a, l_a, m_b, l_b):
    return _merge(m_a, l_a, m_b, l_b, return_shift=True)  # m = 0 for two empty blocks


# flash-causal-key-blocks: the book's solution with one thing changed
def _key_blocks(q_block, block_q, block_k, L, S, *, offset=None, first_row=False, clamp=True, plus_one=1):
    last_row = q_block * block_q if first_row else min((q_block + 1) * block_q, L) - 1
    last_key = min(last_row + (S - L if offset is None else offset), S - 1)
    if clamp and last_key < 0:
        return 0
    return last_key // block_k + plus_one


def _key_blocks_top_left(q_block, block_q, block_k, L, S):
    return _key_blocks(q_block, block_q, block_k, L, S, offset=0)


def _key_blocks_of_the_first_row(q_block, block_q, block_k, L, S):
    return _key_blocks(q_block, block_q, block_k, L, S, first_row=True)


def _key_blocks_negative_without_keys(q_block, block_q, block_k, L, S):
    return _key_blocks(q_block, block_q, block_k, L, S, clamp=False)


def _key_blocks_without_plus_one(q_block, block_q, block_k, L, S):
    return _key_blocks(q_block, block_q, block_k, L, S, plus_one=0)


def _key_blocks_square_answer(q_block, block_q, block_k, L, S):
    return q_block + 1  # right for L == S, block_q == block_k


# flash-attention-backward: the book's solution with one thing changed
def _backward(q, k, v, out, lse, dout, scale, *, grad_scale=True, delta="out", p_scale=True, swap=False):
    p = torch.exp(q @ k.transpose(-1, -2) * (scale if p_scale else 1.0) - lse[..., None])
    dv = p.transpose(-1, -2) @ dout
    dp = dout @ v.transpose(-1, -2)
    d = {"out": (dout * out).sum(-1, keepdim=True), "dp": dp.sum(-1, keepdim=True), "none": 0.0}[delta]
    ds = p * (dp - d)
    s = scale if grad_scale else 1.0
    dq, dk = ds @ k * s, ds.transpose(-1, -2) @ q * s
    return (dk, dq, dv) if swap else (dq, dk, dv)


def _backward_without_scale(q, k, v, out, lse, dout, scale):
    return _backward(q, k, v, out, lse, dout, scale, grad_scale=False)


def _backward_without_delta(q, k, v, out, lse, dout, scale):
    return _backward(q, k, v, out, lse, dout, scale, delta="none")


def _backward_delta_as_rowsum_of_dp(q, k, v, out, lse, dout, scale):
    return _backward(q, k, v, out, lse, dout, scale, delta="dp")


def _backward_p_without_scale(q, k, v, out, lse, dout, scale):
    return _backward(q, k, v, out, lse, dout, scale, p_scale=False)


def _backward_dq_and_dk_swapped(q, k, v, out, lse, dout, scale):
    return _backward(q, k, v, out, lse, dout, scale, swap=True)


# flash-io-head-dim: tests/course/test_exercises.py already rejects 4.0, n / B tiles, the streaming alone and a
# tensor; these are the other slips of the count
def _ratio(n, sram_bytes, bytes_per_element=2, *, bytes_as_elements=False, tiles=None, floor_1=True,
           inverted=False):
    def traffic(d):
        m = sram_bytes if bytes_as_elements else sram_bytes // bytes_per_element
        rows = m // (4 * d)
        block = min(n, max(1, rows) if floor_1 else rows)
        count = -(-n // block) if tiles is None else tiles(n, block)
        return 2 * n * d + 2 * n * d * count

    return traffic(64) / traffic(128) if inverted else traffic(128) / traffic(64)


def _ratio_sram_in_bytes(n, sram_bytes, bytes_per_element=2):
    return _ratio(n, sram_bytes, bytes_per_element, bytes_as_elements=True)


def _ratio_inverted(n, sram_bytes, bytes_per_element=2):
    return _ratio(n, sram_bytes, bytes_per_element, inverted=True)


def _ratio_ceil_as_floor_plus_one(n, sram_bytes, bytes_per_element=2):
    return _ratio(n, sram_bytes, bytes_per_element, tiles=lambda n, b: n // b + 1)


def _ratio_without_at_least_one_row(n, sram_bytes, bytes_per_element=2):
    return _ratio(n, sram_bytes, bytes_per_element, floor_1=False)


# flash-window-key-range: the book's solution with one thing changed
def _window(i0, i1, L, S, left, right, *, aligned=True, plus_one=1, clamp=True):
    shift = S - L if aligned else 0
    lo = 0 if left < 0 else i0 + shift - left
    hi = S if right < 0 else i1 - 1 + shift + right + plus_one
    return (max(0, lo), min(S, hi)) if clamp else (lo, hi)


def _window_top_left(i0, i1, L, S, left, right):
    return _window(i0, i1, L, S, left, right, aligned=False)


def _window_without_plus_one(i0, i1, L, S, left, right):
    return _window(i0, i1, L, S, left, right, plus_one=0)


def _window_unclamped(i0, i1, L, S, left, right):
    return _window(i0, i1, L, S, left, right, clamp=False)


# flash-packed-positions: the book's solution with one thing changed
def _packed(cu_seqlens, *, restart=True, first_id=0):
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    doc = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    pos = torch.arange(int(cu_seqlens[-1]))
    if restart:
        pos = pos - cu_seqlens[:-1].long()[doc]
    return doc + first_id, pos


def _packed_positions_run_on(cu_seqlens):
    return _packed(cu_seqlens, restart=False)


def _packed_ids_from_one(cu_seqlens):
    return _packed(cu_seqlens, first_id=1)


MISTAKES = [
    Mistake("flash-merge-states", "l_a + l_b without rescaling", _merge_without_rescaling,
            ("for blocks of 3 and 5 scores", "You added l_a + l_b", "l_x * exp(m_x - m)")),
    Mistake("flash-merge-states", "rescaled by exp(m - m_x)", _merge_inverted_factor,
            ("for blocks of 3 and 5 scores", "factor is exp(m - m_x)", "exp(m_x - m)")),
    Mistake("flash-merge-states", "only l_a rescaled", _merge_rescales_only_the_first,
            ("for blocks of 3 and 5 scores", "You rescaled only l_a", "exp(m_b - m)")),
    Mistake("flash-merge-states", "NaN for two empty blocks", _merge_nan_for_two_empty_blocks,
            ("two empty blocks must give l = 0, not NaN", "exp(-inf - (-inf))", "finite number")),
    Mistake("flash-merge-states", "m = 0 returned for two empty blocks", _merge_returns_the_finite_shift_as_m,
            ("two empty blocks must give m = -inf", "got m = 0.0", "finite shift only inside the exp")),
    Mistake("flash-causal-key-blocks", "top-left alignment", _key_blocks_top_left,
            ("L=7, S=13, block_q=3, block_k=4: query block 0 needs 3 key blocks, you said 1",
             "row 2, sees keys 0..8", "top-left alignment", "j <= i + S - L")),
    Mistake("flash-causal-key-blocks", "counted for the block's first row", _key_blocks_of_the_first_row,
            ("L=7, S=13, block_q=3, block_k=4: query block 0 needs 3 key blocks, you said 2", "first query",
             "min((q_block + 1) * block_q, L) - 1")),
    Mistake("flash-causal-key-blocks", "negative count when no key is visible",
            _key_blocks_negative_without_keys,
            ("L=13, S=5, block_q=4, block_k=2: query block 0 needs 0 key blocks, you said -2", "sees no key",
             "needs 0 key blocks")),
    Mistake("flash-causal-key-blocks", "last key // block_k without + 1", _key_blocks_without_plus_one,
            ("L=8, S=8, block_q=2, block_k=2: query block 0 needs 1 key block, you said 0", "Off by one",
             "k // block_k + 1")),
    Mistake("flash-causal-key-blocks", "q_block + 1: right for the square case only",
            _key_blocks_square_answer,
            ("L=7, S=13, block_q=3, block_k=4", "only when L == S and block_q == block_k")),
    Mistake("flash-attention-backward", "dq and dk without the scale", _backward_without_scale,
            ("dq for L=4, S=6, d=3", "dq lacks the scale", "dS k * scale")),
    Mistake("flash-attention-backward", "no delta: dS = P * dP", _backward_without_delta,
            ("dq for L=4, S=6, d=3", "Your dS is P * dP", "rowsum(dout * out)")),
    Mistake("flash-attention-backward", "delta as the rowsum of dP", _backward_delta_as_rowsum_of_dp,
            ("dq for L=4, S=6, d=3", "Your delta_i is the plain rowsum of dP", "rowsum(dout * out)")),
    Mistake("flash-attention-backward", "P rebuilt without the scale", _backward_p_without_scale,
            ("for L=4, S=6, d=3", "without the scale", "exp(scale * q k^T - lse)")),
    Mistake("flash-attention-backward", "dq and dk swapped", _backward_dq_and_dk_swapped,
            ("dq for L=4, S=6, d=3: expected shape (2, 4, 3), got (2, 6, 3)", "shape of k",
             "return (dq, dk, dv)")),
    Mistake("flash-io-head-dim", "SRAM bytes taken as elements", _ratio_sram_in_bytes,
            ("for n=16384, sram_bytes=196608, bytes_per_element=2", "a ratio of 3.95455",
             "sram_bytes // bytes_per_element")),
    Mistake("flash-io-head-dim", "traffic(64) / traffic(128)", _ratio_inverted,
            ("for n=16384, sram_bytes=196608, bytes_per_element=2 you return 0.25", "a ratio of 3.95455",
             "That is traffic(64) / traffic(128)")),
    Mistake("flash-io-head-dim", "ceil(n / B) as n // B + 1", _ratio_ceil_as_floor_plus_one,
            ("for n=300, sram_bytes=196608, bytes_per_element=2", "n // B + 1, one too many",
             "-(-n // B)")),
    Mistake("flash-io-head-dim", "no tile of at least one row: divides by zero",
            _ratio_without_at_least_one_row,
            ("for n=100, sram_bytes=1000, bytes_per_element=2 your code divides by zero", "0 at d = 128",
             "B = max(1, M // (4 d))")),
    Mistake("flash-window-key-range", "top-left alignment", _window_top_left,
            ("queries 0..4 of L=5 against S=12 keys, window (left=3, right=-1)", "[lo, hi) = (4, 12)",
             "you returned (0, 12)", "top-left aligned")),
    Mistake("flash-window-key-range", "hi without + 1", _window_without_plus_one,
            ("queries 0..3 of L=8 against S=8 keys, window (left=2, right=2)", "you returned (0, 5)",
             "hi = last + 1")),
    Mistake("flash-window-key-range", "not clamped to [0, S]", _window_unclamped,
            ("queries 0..3 of L=8 against S=8 keys, window (left=2, right=2)", "you returned (-2, 6)")),
    Mistake("flash-packed-positions", "positions run on across documents", _packed_positions_run_on,
            ("positions for cu_seqlens=[0, 3, 5, 9]", "expected [0, 1, 2, 0, 1, 0, 1, 2, 3]",
             "each document starts again at 0")),
    Mistake("flash-packed-positions", "document ids from 1", _packed_ids_from_one,
            ("document ids for cu_seqlens=[0, 3, 5, 9]", "Your ids count from 1")),
]

test_wrong_answers = mistake_test(MISTAKES)
