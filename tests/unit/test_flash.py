"""attnbook.flash: online softmax, tiled forward/backward and the backend dispatch, on CPU."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnbook.core import scaled_dot_product_attention
from attnbook.positional import alibi_bias, alibi_slopes
from attnbook.sparse import sliding_window_mask
from attnbook.flash import (
    block_sparse_flash_attention,
    flash_attention,
    flash_attention_varlen,
    key_range,
    hbm_accesses,
    merge_partials,
    online_softmax,
    online_softmax_step,
    plan_tiles,
    select_backend,
    flash_backward,
    flash_forward,
)


def _qkv(gen, L, S, E=8, H=2, H_kv=2, dtype=torch.float64, batch=2):
    return [torch.randn(batch, h, n, E, generator=gen, dtype=dtype) for h, n in ((H, L), (H_kv, S), (H_kv, S))]


@given(n=st.integers(1, 40), block=st.integers(1, 50), masked=st.booleans())
def test_online_softmax_step_folds_blocks_into_the_exact_softmax(n, block, masked):
    gen = torch.Generator().manual_seed(n * 101 + block)
    scores = 10 * torch.randn(3, 4, n, generator=gen, dtype=torch.float64)
    if masked:  # some rows see nothing for a while, one row nothing at all
        scores[:, :, : n // 2] = -math.inf
        scores[0, 0] = -math.inf
    values = torch.randn(3, n, 5, generator=gen, dtype=torch.float64)
    m = torch.full((3, 4), -math.inf, dtype=torch.float64)
    l, acc = torch.zeros_like(m), torch.zeros(3, 4, 5, dtype=torch.float64)
    for j in range(0, n, block):
        m, l, acc = online_softmax_step(m, l, scores[..., j : j + block], acc, values[:, j : j + block])
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row of -inf: zeros
    seen = l > 0
    torch.testing.assert_close(m[seen], scores.amax(-1)[seen])
    torch.testing.assert_close(l[seen], torch.exp(scores - m[..., None]).sum(-1)[seen])
    torch.testing.assert_close((acc / l.clamp_min(1e-300)[..., None])[seen], (weights @ values)[seen])
    assert not torch.isnan(l).any() and not torch.isnan(acc).any()


@given(n=st.integers(1, 40), block=st.integers(1, 50), spread=st.sampled_from([1.0, 30.0, 1e3]))
def test_online_softmax_equals_softmax(n, block, spread):
    x = spread * torch.randn(3, n, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    torch.testing.assert_close(online_softmax(x, block), torch.softmax(x, dim=-1))


def test_online_softmax_rows_of_minus_inf_give_zeros_and_partial_inf_is_ignored():
    x = torch.tensor([[-math.inf] * 5, [-math.inf, 0.0, -math.inf, 1.0, -math.inf]])
    got = online_softmax(x, 2)
    assert torch.equal(got[0], torch.zeros(5))
    torch.testing.assert_close(got[1], torch.softmax(x[1], dim=-1))
    with pytest.raises(ValueError, match="block_size"):
        online_softmax(x, 0)


def test_merge_partials_of_a_key_split_equals_attention_over_all_keys(gen):
    q, k, v = _qkv(gen, 5, 12)
    scores = q @ k.transpose(-1, -2)
    full = torch.softmax(scores, -1) @ v
    parts = [(torch.softmax(scores[..., sl], -1) @ v[:, :, sl], torch.logsumexp(scores[..., sl], -1))
             for sl in (slice(0, 7), slice(7, 12))]
    out, lse = merge_partials(*parts[0], *parts[1])
    torch.testing.assert_close(out, full)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1))
    empty = (torch.zeros_like(out), torch.full_like(lse, -math.inf))  # a chunk with no visible key
    out2, lse2 = merge_partials(*empty, out, lse)
    torch.testing.assert_close(out2, full)
    torch.testing.assert_close(lse2, lse)


def test_merge_partials_in_place_writes_the_same_result_into_the_first_partial(gen):
    """inplace=True (block-sparse attention's accumulator): the result lands in out_a and lse_a, views of a
    larger buffer included, equal to the out-of-place merge; the second partial is left as it was."""
    q, k, v = _qkv(gen, 5, 12)
    scores = q @ k.transpose(-1, -2)
    parts = [(torch.softmax(scores[..., sl], -1) @ v[:, :, sl], torch.logsumexp(scores[..., sl], -1))
             for sl in (slice(0, 7), slice(7, 12))]
    want = merge_partials(*parts[0], *parts[1])
    buffer, lse_buffer = torch.zeros(2, *parts[0][0].shape, dtype=q.dtype), torch.zeros(2, *parts[0][1].shape,
                                                                                     dtype=q.dtype)
    buffer[1], lse_buffer[1] = parts[0]
    b_before = [t.clone() for t in parts[1]]
    got = merge_partials(buffer[1], lse_buffer[1], *parts[1], inplace=True)
    assert got[0].data_ptr() == buffer[1].data_ptr() and got[1].data_ptr() == lse_buffer[1].data_ptr()
    torch.testing.assert_close(buffer[1], want[0])
    torch.testing.assert_close(lse_buffer[1], want[1])
    assert (buffer[0] == 0).all() and all(torch.equal(a, b) for a, b in zip(parts[1], b_before))
    empty = (torch.zeros_like(want[0]), torch.full_like(want[1], -math.inf))
    torch.testing.assert_close(merge_partials(*empty, *want, inplace=True)[0], want[0])
    with pytest.raises(TypeError, match="merge_partials: inplace must be a bool"):
        merge_partials(*want, *want, inplace="yes")


@pytest.mark.parametrize("L, S", [(1, 1), (7, 7), (17, 30), (30, 17), (1, 23)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("blocks", [(4, 4), (5, 3), (64, 64)])
def test_tiled_forward_equals_attention_and_logsumexp(gen, L, S, causal, blocks):
    q, k, v = _qkv(gen, L, S)
    out, lse = flash_forward(q, k, v, is_causal=causal, block_q=blocks[0], block_k=blocks[1])
    torch.testing.assert_close(out, scaled_dot_product_attention(q, k, v, is_causal=causal))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        i, j = torch.arange(L)[:, None], torch.arange(S)[None, :]
        scores = scores.masked_fill(j > i + S - L, -math.inf)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1))


def test_tiled_forward_supports_gqa_and_a_custom_scale(gen):
    q, k, v = _qkv(gen, 9, 11, H=6, H_kv=2)
    out, _ = flash_forward(q, k, v, is_causal=True, scale=0.3, block_q=4, block_k=3)
    expected = scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), is_causal=True, scale=0.3)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("L, S, causal, H_kv", [(6, 6, False, 2), (7, 5, True, 1), (3, 9, True, 2)])
def test_flash_attention_gradients_pass_gradcheck(gen, L, S, causal, H_kv):
    q, k, v = (t.requires_grad_() for t in _qkv(gen, L, S, E=4, H=2, H_kv=H_kv, batch=1))
    assert torch.autograd.gradcheck(lambda a, b, c: flash_attention(a, b, c, is_causal=causal, backend="torch"), (q, k, v))


def test_flash_attention_gradients_equal_autograd_of_the_readable_version(gen):
    q, k, v = _qkv(gen, 70, 90, E=16, H=4, H_kv=2)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    grad = torch.randn(2, 4, 70, 16, generator=gen, dtype=torch.float64)
    out, backend = flash_attention(*leaves, is_causal=True, return_backend=True)
    out.backward(grad)
    assert backend == "torch"
    rq, rk, rv = ref_leaves
    scaled_dot_product_attention(rq, rk.repeat_interleave(2, 1), rv.repeat_interleave(2, 1), is_causal=True).backward(grad)
    for a, b in zip(leaves, ref_leaves):
        torch.testing.assert_close(a.grad, b.grad)


def test_backward_pass_saves_no_seq_by_seq_tensor(gen):
    L = S = 96
    q, k, v = (t.requires_grad_() for t in _qkv(gen, L, S, E=8))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        out = flash_attention(q, k, v)
    assert saved and max(saved) == q.numel() < 2 * 2 * L * S  # q, k, v, out, lse: nothing of size L x S
    out.sum().backward()


def test_fully_masked_rows_give_zero_output_and_zero_gradients(gen):
    q, k, v = (t.requires_grad_() for t in _qkv(gen, 6, 2, batch=1))
    out = flash_attention(q, k, v, is_causal=True)  # queries 0..3 see no key
    out.sum().backward()
    assert torch.all(out[:, :, :4] == 0) and torch.all(q.grad[:, :, :4] == 0)
    assert torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all()


def test_fp16_tiled_path_accumulates_in_fp32(gen):
    q, k, v = _qkv(gen, 33, 33, E=16, dtype=torch.float16)
    out, lse = flash_forward(q, k, v, block_q=8, block_k=8)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32
    exact = scaled_dot_product_attention(q.double(), k.double(), v.double())
    torch.testing.assert_close(out.double(), exact, atol=2e-3, rtol=0)
    dq, dk, dv = flash_backward(q, k, v, out, lse, torch.ones_like(out), block_q=8, block_k=8)
    assert dq.dtype == dk.dtype == dv.dtype == torch.float16


def test_backend_selection_and_clear_errors(gen, monkeypatch):
    q = torch.zeros(1, 1, 2, 16)
    assert select_backend(q, "auto") == "torch"  # CPU tensors: the PyTorch path
    assert select_backend(q, "torch") == "torch"
    with pytest.raises(ValueError, match="backend"):
        select_backend(q, "cuda")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="backend='triton' needs"):
        flash_attention(q, q, q, backend="triton")
    monkeypatch.setattr("attnbook.kernels._triton_version", lambda: None)
    with pytest.raises(RuntimeError, match="triton package"):
        select_backend(q, "triton")


def test_shape_errors_name_the_arguments(gen):
    q, k, v = _qkv(gen, 4, 5)
    # any rank, as the contract says: (H, L, E) and (L, E) work like (1, H, L, E)
    torch.testing.assert_close(flash_attention(q[0], k[0], v[0]), flash_attention(q, k, v)[0])
    torch.testing.assert_close(flash_attention(q[0, 0], k[0, 0], v[0, 0]), flash_attention(q, k, v)[0, 0])
    with pytest.raises(TypeError, match="q must be a floating-point"):
        flash_attention(q.long(), k, v)
    with pytest.raises(TypeError, match="share a dtype"):
        flash_attention(q, k.float(), v)
    with pytest.raises(ValueError, match="same last dimension"):
        flash_attention(q, k[:, :, :, :4], v)
    with pytest.raises(ValueError, match="block_q"):
        flash_forward(q, k, v, block_q=0)


def test_hbm_accesses_counts_and_asymptotics():
    io = hbm_accesses(1024, 64, sram_bytes=64 * 1024, bytes_per_element=2)  # M = 32768 elements, B = 128
    assert io["standard"] == 4 * 1024 * 64 + 4 * 1024**2
    assert io["flash"] == 2 * 1024 * 64 + 2 * 1024 * 64 * 8
    # Theta(N^2 d^2 / M): doubling N multiplies it by ~4, doubling M halves it.
    big = [hbm_accesses(n, 64, m)["flash"] for n, m in ((2**16, 2**17), (2**17, 2**17), (2**16, 2**18))]
    assert big[1] / big[0] == pytest.approx(4, rel=0.01) and big[2] / big[0] == pytest.approx(0.5, rel=0.02)
    assert hbm_accesses(64, 64, 2**30)["flash"] == 4 * 64 * 64  # everything fits: one pass
    with pytest.raises(ValueError, match="sram_bytes"):
        hbm_accesses(10, 10, 0)


def test_importing_the_package_and_flash_does_not_import_triton():
    code = "import sys, attnbook, attnbook.kernels, attnbook.flash; print('triton' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


# --------------------------------------------------------------------------------------
# FlashAttention-2's fused options: sliding window, ALiBi, softcapping
# --------------------------------------------------------------------------------------
def _fused_reference(q, k, v, *, is_causal=False, window=(-1, -1), slopes=None, softcap=0.0):
    """The options applied to the full score matrix, the slow obvious way."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    L, S = q.shape[2], k.shape[2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(L)[:, None] + S - L  # each query's position among the keys
    j = torch.arange(S)[None, :]
    if slopes is not None:
        s = s - slopes.reshape(-1, q.shape[1], 1, 1) * (i - j).abs()
    allowed = torch.ones(L, S, dtype=torch.bool)
    left, right = window
    if left >= 0:
        allowed &= j >= i - left
    if right >= 0:
        allowed &= j <= i + right
    if is_causal:
        allowed &= j <= i
    return torch.softmax(s.masked_fill(~allowed, -math.inf), -1).nan_to_num(0.0) @ v


def _same_output_and_gradients(fn, reference, tensors, tol=1e-10):
    """``fn`` and ``reference`` on copies of ``tensors``: equal outputs, and equal gradients
    for one random upstream gradient. Returns ``fn``'s output."""
    leaves = [t.clone().requires_grad_() for t in tensors]
    ref_leaves = [t.clone().requires_grad_() for t in tensors]
    out, ref = fn(*leaves), reference(*ref_leaves)
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad)
    for got, want in zip(leaves, ref_leaves):
        torch.testing.assert_close(got.grad, want.grad, atol=tol, rtol=tol)
    return out


FUSED = [  # (L, S, H, H_kv, is_causal, window, alibi, softcap)
    (70, 70, 2, 2, False, (8, 8), False, 0.0),
    (70, 90, 4, 2, True, (16, -1), False, 0.0),
    (90, 70, 2, 1, False, (-1, 5), False, 0.0),  # L > S: the first rows see few keys
    (70, 70, 2, 2, True, (-1, -1), True, 0.0),
    (50, 80, 2, 2, False, (-1, -1), "batch", 0.0),  # slopes per (batch, head)
    (70, 70, 2, 2, False, (-1, -1), False, 2.0),
    (60, 75, 4, 2, True, (10, 0), True, 1.5),  # everything at once, with GQA
    (33, 33, 2, 2, False, (0, 0), False, 0.0),  # each query sees itself only
]


@pytest.mark.parametrize("L, S, H, H_kv, causal, window, alibi, softcap", FUSED)
def test_fused_options_forward_and_backward_equal_the_dense_reference(gen, L, S, H, H_kv, causal, window,
                                                                      alibi, softcap):
    q = torch.randn(2, H, L, 16, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, H_kv, S, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    slopes = None
    if alibi == "batch":
        slopes = torch.rand(2, H, generator=gen)
    elif alibi:
        slopes = alibi_slopes(H)
    kwargs = dict(is_causal=causal, window_size=window, alibi_slopes=slopes, softcap=softcap)
    _same_output_and_gradients(
        lambda *t: flash_attention(*t, **kwargs, backend="torch"),
        lambda *t: _fused_reference(*t, is_causal=causal, window=window,
                                    slopes=None if slopes is None else slopes.double(), softcap=softcap),
        (q, k, v))


def test_fused_options_agree_with_the_books_own_masks_and_biases(gen):
    """Independent references: the sparse chapter's sliding-window mask and the positional
    chapter's ALiBi bias, through the readable attention."""
    q, k, v = (torch.randn(1, 4, 64, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    window = sliding_window_mask(64, 6)
    torch.testing.assert_close(flash_attention(q, k, v, window_size=(6, 6), backend="torch"),
                               scaled_dot_product_attention(q, k, v, window), atol=1e-12, rtol=1e-12)
    bias = alibi_bias(4, 64, is_causal=True).double()
    torch.testing.assert_close(
        flash_attention(q, k, v, is_causal=True, alibi_slopes=alibi_slopes(4), backend="torch"),
        scaled_dot_product_attention(q, k, v, bias), atol=1e-12, rtol=1e-12)


def test_tiles_outside_the_window_are_skipped(gen, monkeypatch):
    """The tiled loop multiplies only the keys of key_range: at a fixed window the keys each
    query tile touches stay bounded as the length grows (so the time grows linearly)."""
    from attnbook import flash

    touched = []
    real = flash._tile_scores
    monkeypatch.setattr(flash, "_tile_scores", lambda qk, *a: (touched.append(qk.shape[-1]), real(qk, *a))[1])
    q, k, v = (torch.randn(1, 1, 512, 8, generator=gen) for _ in range(3))
    flash.flash_forward(q, k, v, window_size=(16, 0), block_q=128, block_k=128)
    assert sum(touched) == 128 + 3 * (128 + 16)  # of 4 x 512 keys without the window
    for n in (256, 1024, 4096):
        spans = [hi - lo for lo, hi in (key_range(i0, i0 + 128, n, n, window_size=(16, 0))
                                        for i0 in range(0, n, 128))]
        assert max(spans) == 128 + 16
    assert key_range(0, 128, 256, 256, is_causal=True) == (0, 128)
    assert key_range(128, 256, 256, 256, window_size=(16, 16)) == (112, 256)
    assert key_range(0, 10, 40, 17, is_causal=True)[1] <= 0  # L > S: these rows see nothing


def test_fused_options_reject_bad_values(gen):
    q = torch.randn(2, 3, 8, 4, generator=gen)
    with pytest.raises(ValueError, match="window_size must be two integers"):
        flash_attention(q, q, q, window_size=(-2, 0))
    with pytest.raises(ValueError, match="window_size"):
        flash_attention(q, q, q, window_size=4)
    with pytest.raises(ValueError, match="softcap must be a number >= 0"):
        flash_attention(q, q, q, softcap=-1.0)
    with pytest.raises(ValueError, match=r"alibi_slopes must be a tensor of shape \(3,\) or \(2, 3\)"):
        flash_attention(q, q, q, alibi_slopes=torch.ones(4))


# --------------------------------------------------------------------------------------
# Packed sequences (FlashAttention-2's varlen layout)
# --------------------------------------------------------------------------------------
def _packed(gen, lengths_q, lengths_k, H=4, H_kv=2, E=16, Ev=16, dtype=torch.float64):
    q = torch.randn(sum(lengths_q), H, E, generator=gen, dtype=dtype)
    k = torch.randn(sum(lengths_k), H_kv, E, generator=gen, dtype=dtype)
    v = torch.randn(sum(lengths_k), H_kv, Ev, generator=gen, dtype=dtype)
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("lengths_q, lengths_k, causal, window, softcap", [
    ([5, 17, 1, 30], [5, 17, 1, 30], False, (-1, -1), 0.0),
    ([5, 17, 1, 30], [5, 17, 1, 30], True, (-1, -1), 0.0),
    ([3, 20, 12], [9, 20, 4], True, (4, -1), 1.5),  # L != S per sequence: bottom-right alignment
    ([7, 0, 9], [7, 6, 9], False, (2, 2), 0.0),  # an empty query sequence
])
def test_varlen_equals_attention_on_each_sequence_alone(gen, lengths_q, lengths_k, causal, window, softcap):
    q, k, v, cu_q, cu_k = _packed(gen, lengths_q, lengths_k)
    slopes = torch.rand(len(lengths_q), 4, generator=gen)
    options = dict(is_causal=causal, window_size=window, softcap=softcap)

    def each_alone(q, k, v):  # the readable attention on each sequence, with its own slopes
        return torch.cat([
            _fused_reference(q[cu_q[b]:cu_q[b + 1]].transpose(0, 1)[None],
                             *(t[cu_k[b]:cu_k[b + 1]].transpose(0, 1)[None] for t in (k, v)),
                             window=window, slopes=slopes[b].double(), is_causal=causal,
                             softcap=softcap)[0].transpose(0, 1)
            for b in range(len(lengths_q))])

    out = _same_output_and_gradients(
        lambda *t: flash_attention_varlen(*t, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                          alibi_slopes=slopes, backend="torch", **options),
        each_alone, (q, k, v))
    assert out.shape == (sum(lengths_q), 4, 16)


def test_no_token_attends_across_a_sequence_boundary(gen):
    q, k, v, cu_q, cu_k = _packed(gen, [6, 9, 4], [6, 9, 4])
    out = flash_attention_varlen(q, k, v, cu_q, cu_k, 9, 9, backend="torch")
    k2, v2 = k.clone(), v.clone()
    k2[6:15], v2[6:15] = 100.0, -100.0  # the second sequence's keys and values only
    changed = flash_attention_varlen(q, k2, v2, cu_q, cu_k, 9, 9, backend="torch")
    torch.testing.assert_close(changed[:6], out[:6])
    torch.testing.assert_close(changed[15:], out[15:])
    assert not torch.allclose(changed[6:15], out[6:15])


def test_varlen_rejects_bad_offsets(gen):
    q, k, v, cu_q, cu_k = _packed(gen, [3, 4], [3, 4])
    with pytest.raises(ValueError, match="cu_seqlens_q must be a 1-D int32 tensor"):
        flash_attention_varlen(q, k, v, cu_q.long(), cu_k, 4, 4)
    with pytest.raises(ValueError, match="must rise from 0 to the 7 tokens"):
        flash_attention_varlen(q, k, v, torch.tensor([0, 8, 7], dtype=torch.int32), cu_k, 8, 4)
    with pytest.raises(ValueError, match="longer than the max_seqlen"):
        flash_attention_varlen(q, k, v, cu_q, cu_k, 3, 4)
    with pytest.raises(ValueError, match="as many sequences"):
        flash_attention_varlen(q, k, v, cu_q, torch.tensor([0, 7], dtype=torch.int32), 4, 7)
    with pytest.raises(ValueError, match="packed"):
        flash_attention_varlen(q[None], k[None], v[None], cu_q, cu_k, 4, 4)


# --------------------------------------------------------------------------------------
# The online softmax in float16/bfloat16: statistics in float32, one rounding at the end
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block", [1, 3, 16])
def test_online_softmax_in_half_precision_keeps_its_statistics_in_float32(gen, dtype, block):
    """Keeping m and l in bfloat16 made rows of 1000 entries read in blocks of 4 sum to 1.15-1.37.
    Stated tolerance: each entry within half an ulp of the float64 softmax of the same (rounded)
    inputs, eps/2 relative, the rounding of the result itself, which torch's own softmax in
    that dtype also meets; each row sums to 1 within eps."""
    x = (4 * torch.randn(8, 1000, generator=gen, dtype=torch.float64)).to(dtype)
    x[0, :500] = -math.inf  # a row half masked
    got = online_softmax(x, block)
    assert got.dtype == dtype
    exact = torch.softmax(x.double(), dim=-1)
    eps = torch.finfo(dtype).eps
    tiny = torch.finfo(dtype).smallest_normal if dtype == torch.bfloat16 else 2.0**-24  # fp16 subnormals
    bound = eps / 2 * exact + tiny
    assert ((got.double() - exact).abs() <= bound).all()
    assert ((torch.softmax(x, dim=-1).double() - exact).abs() <= bound).all()  # torch in this dtype: the same bound
    assert (got.double().sum(-1) - 1).abs().max() <= eps


def test_online_softmax_step_promotes_half_precision_statistics(gen):
    """Fed bfloat16 statistics, scores and values, the step returns float32 statistics, so a
    loop that feeds them back never rounds its running sums to bfloat16."""
    scores = (3 * torch.randn(2, 5, 300, generator=gen)).bfloat16()
    values = torch.randn(2, 300, 4, generator=gen).bfloat16()
    m = torch.full((2, 5), -math.inf, dtype=torch.bfloat16)
    l, acc = torch.zeros_like(m), torch.zeros(2, 5, 4, dtype=torch.bfloat16)
    for j in range(0, 300, 2):
        m, l, acc = online_softmax_step(m, l, scores[..., j : j + 2], acc, values[:, j : j + 2])
        assert m.dtype == l.dtype == acc.dtype == torch.float32
    s, vals = scores.double(), values.double()
    torch.testing.assert_close(m.double(), s.amax(-1), rtol=0, atol=0)
    torch.testing.assert_close(l.double(), torch.exp(s - m.double()[..., None]).sum(-1), rtol=1e-5, atol=0)
    torch.testing.assert_close((acc / l[..., None]).double(), torch.softmax(s, -1) @ vals, rtol=1e-5, atol=1e-6)
    # float64 anywhere: float64; an empty block changes nothing
    m64, l64, _ = online_softmax_step(m.double(), l, scores[..., :3])
    assert m64.dtype == l64.dtype == torch.float64
    same = online_softmax_step(m, l, scores[..., :0], acc, values[:, :0])
    assert all(torch.equal(a, b) for a, b in zip(same, (m, l, acc)))


# --------------------------------------------------------------------------------------
# Second derivatives: create_graph=True differentiates a recomputation, to any order
# --------------------------------------------------------------------------------------
GRADGRAD = [  # (L, S, H, H_kv, causal, fused options)
    (5, 5, 2, 2, False, {}),
    (5, 5, 2, 2, True, {}),
    (4, 7, 2, 2, True, {}),  # L < S: bottom-right causal
    (6, 3, 2, 2, True, {}),  # L > S: the first rows see no key
    (5, 7, 4, 2, False, {}),  # GQA, L != S
    (6, 4, 2, 1, True, {}),  # MQA, L > S
    (5, 6, 2, 2, True, {"window_size": (2, -1), "softcap": 1.5, "alibi_slopes": "alibi"}),
]


@pytest.mark.parametrize("L, S, H, H_kv, causal, fused", GRADGRAD)
def test_flash_attention_passes_gradgradcheck(gen, L, S, H, H_kv, causal, fused):
    """The hand-written backward treated the saved lse as a constant under create_graph=True, so
    second derivatives were wrong without an error (gradgradcheck failed)."""
    fused = {**fused, "alibi_slopes": alibi_slopes(H)} if "alibi_slopes" in fused else fused
    q = torch.randn(1, H, L, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, H_kv, S, 3, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradgradcheck(
        lambda a, b, c: flash_attention(a, b, c, is_causal=causal, backend="torch", **fused), (q, k, v))


def _second_derivative(fn, tensors, gen):
    """d/d(q, k, v) of <grad of <fn(q, k, v), w>, u>: a Hessian-vector product through a
    create_graph=True backward pass."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    w = torch.randn(out.shape, generator=gen, dtype=out.dtype).to(out.device)
    grads = torch.autograd.grad(out, leaves, w, create_graph=True)
    u = [torch.randn(g.shape, generator=gen, dtype=g.dtype).to(g.device) for g in grads]
    return [*grads, *torch.autograd.grad(sum((g * d).sum() for g, d in zip(grads, u)), leaves)]


def test_second_derivatives_equal_the_readable_attentions(gen):
    q, k, v = _qkv(gen, 9, 13, E=4, H=4, H_kv=2, batch=1)
    seed = torch.Generator().manual_seed(5)
    got = _second_derivative(lambda *t: flash_attention(*t, is_causal=True, backend="torch"), (q, k, v), seed)
    seed = torch.Generator().manual_seed(5)
    want = _second_derivative(
        lambda q, k, v: scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                     is_causal=True), (q, k, v), seed)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_varlen_passes_gradgradcheck(gen):
    q, k, v, cu_q, cu_k = _packed(gen, [3, 0, 4], [4, 2, 4], H=2, H_kv=1, E=3, Ev=3)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    assert torch.autograd.gradgradcheck(
        lambda a, b, c: flash_attention_varlen(a, b, c, cu_q, cu_k, 4, 4, is_causal=True, backend="torch"), leaves)


def _needs_triton_here():
    pytest.importorskip("triton")
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs a GPU or TRITON_INTERPRET=1 (tests/conftest.py sets it without a GPU)")
    return "cuda" if torch.cuda.is_available() else "cpu"


def test_second_derivatives_through_the_triton_backends_equal_the_readable_attentions(gen):
    """The Triton backward kernels are opaque to autograd: under create_graph=True each Triton
    Function differentiates the PyTorch path instead, and gets the readable attention's
    second derivatives."""
    from attnbook.sparse import expand_block_mask

    device = _needs_triton_here()

    def check(fn, reference, tensors):
        tensors = [t.to(device) for t in tensors]
        got = _second_derivative(fn, tensors, torch.Generator().manual_seed(3))
        want = _second_derivative(reference, tensors, torch.Generator().manual_seed(3))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)

    q, k, v = (t.float() for t in _qkv(gen, 20, 24, E=16, H=2, H_kv=1, batch=1))
    check(lambda *t: flash_attention(*t, is_causal=True, backend="triton"),
          lambda q, k, v: scaled_dot_product_attention(q, k.expand(1, 2, 24, 16), v.expand(1, 2, 24, 16),
                                                       is_causal=True), (q, k, v))
    mask = torch.tensor([[True, False], [True, True]], device=device)
    dense = expand_block_mask(mask, 16)[:20, :24]
    check(lambda *t: block_sparse_flash_attention(*t, mask, 16, backend="triton"),
          lambda q, k, v: scaled_dot_product_attention(q, k.expand(1, 2, 24, 16), v.expand(1, 2, 24, 16),
                                                       dense), (q, k, v))
    qp, kp, vp, cu_q, cu_k = (t.to(device) for t in _packed(gen, [5, 7], [6, 7], H=2, H_kv=2, E=16, Ev=16,
                                                               dtype=torch.float32))

    def each_alone(q, k, v):
        return torch.cat([scaled_dot_product_attention(
            q[cu_q[b]:cu_q[b + 1]].transpose(0, 1), k[cu_k[b]:cu_k[b + 1]].transpose(0, 1),
            v[cu_k[b]:cu_k[b + 1]].transpose(0, 1), is_causal=True).transpose(0, 1) for b in range(2)])

    check(lambda *t: flash_attention_varlen(*t, cu_q, cu_k, 7, 7, is_causal=True, backend="triton"),
          each_alone, (qp, kp, vp))


# --------------------------------------------------------------------------------------
# Bad input: every public function names itself, the argument, and what it expected
# --------------------------------------------------------------------------------------
def _bad_flash_calls():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 6, 4, generator=g)
    x = torch.randn(3, 10, generator=g)
    m, l = torch.zeros(3), torch.ones(3)
    out, lse = flash_forward(q, q, q)
    packed = torch.randn(7, 2, 4, generator=g)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    return [  # (call, exception, pattern)
        (lambda: online_softmax(x, 0), ValueError, r"online_softmax: block_size must be an integer >= 1, got 0"),
        (lambda: online_softmax(x, 2.5), TypeError, r"online_softmax: block_size must be an integer .*2\.5"),
        (lambda: online_softmax(x, True), TypeError, r"online_softmax: block_size"),
        (lambda: online_softmax(x.long(), 2), TypeError, r"online_softmax: x must be a floating-point"),
        (lambda: online_softmax(torch.tensor(1.0), 2), ValueError, r"online_softmax: x must have at least 1"),
        (lambda: online_softmax_step(m[:2], l, x), ValueError, r"online_softmax_step: m and l must have the shape"),
        (lambda: online_softmax_step(m, l, x, acc=torch.zeros(3, 2)), ValueError,
         r"online_softmax_step: acc and values come together"),
        (lambda: online_softmax_step(m, l, x[None], torch.zeros(1, 3, 2), torch.zeros(9, 2)), ValueError,
         r"online_softmax_step: m and l"),
        (lambda: online_softmax_step(m[None], l[None], x[None], torch.zeros(1, 3, 2), torch.zeros(9, 2)),
         ValueError, r"online_softmax_step: values must be \(\.\.\., cols, Ev\)"),
        (lambda: merge_partials(out, lse, out, lse[..., :3]), ValueError, r"merge_partials: out_a and out_b"),
        (lambda: merge_partials(out, lse.long(), out, lse), TypeError, r"merge_partials: lse_a must be a floating"),
        (lambda: key_range(5, 3, 10, 10), ValueError, r"key_range: need 0 <= i0 <= i1 <= L, got i0=5, i1=3"),
        (lambda: key_range(0, 4.0, 10, 10), TypeError, r"key_range: i1 must be an integer"),
        (lambda: key_range(0, 4, -1, 10), ValueError, r"key_range: L must be an integer >= 0"),
        (lambda: key_range(0, 4, 10, 10, window_size=(-2, 0)), ValueError, r"key_range: window_size"),
        (lambda: key_range(0, 4, 10, 10, window_size=(1.5, 0)), ValueError, r"key_range: window_size"),
        (lambda: key_range(0, 4, 10, 10, is_causal="yes"), TypeError, r"key_range: is_causal must be a bool"),
        (lambda: flash_forward(q, q, q, block_q=2.5), TypeError, r"flash_forward: block_q"),
        (lambda: flash_forward(q, q, q, block_k=-1), ValueError, r"flash_forward: block_k .*-1"),
        (lambda: flash_forward(q, q, q, scale=math.nan), ValueError,
         r"flash_forward: scale must be finite, got nan"),
        (lambda: flash_forward(q, q, q, scale="0.5"), TypeError, r"flash_forward: scale"),
        (lambda: flash_backward(q, q, q, out, lse[..., :5], out), ValueError,
         r"flash_backward: out and grad_out must be .* and lse"),
        (lambda: flash_backward(q, q, q, out, lse, out[..., :2]), ValueError,
         r"flash_backward: out and grad_out"),
        (lambda: flash_backward(q, q, q, out, lse, out, block_q=0), ValueError,
         r"flash_backward: block_q"),
        (lambda: flash_attention(q, q, q, is_causal="False"), TypeError, r"flash_attention: is_causal must be a bool"),
        (lambda: flash_attention(q, q, q, scale=math.inf), ValueError, r"flash_attention: scale must be finite"),
        (lambda: flash_attention(q[..., :0], q[..., :0], q), ValueError, r"flash_attention: q has head_dim 0"),
        (lambda: flash_attention(q, q, q, backend="cuda"), ValueError,
         r"flash_attention: backend must be 'auto', 'torch' or 'triton', got 'cuda'"),
        (lambda: flash_attention_varlen(packed, packed, packed, cu, cu, 4.5, 4), TypeError,
         r"flash_attention_varlen: max_seqlen_q must be an integer"),
        (lambda: flash_attention_varlen(packed, packed, packed, cu, cu, 4, -1), ValueError,
         r"flash_attention_varlen: max_seqlen_k must be an integer >= 0"),
        (lambda: flash_attention_varlen(packed[:, :1], packed, packed, cu, cu, 4, 4), ValueError,
         r"flash_attention_varlen: q's 1 heads are not a multiple of k's 2"),
        (lambda: flash_attention_varlen(packed, packed, packed, cu, cu, 4, 4, scale=math.nan), ValueError,
         r"flash_attention_varlen: scale"),
        (lambda: block_sparse_flash_attention(q, q, q, torch.ones(1, 1, dtype=torch.bool), 0), ValueError,
         r"block_sparse_flash_attention: block_size must be an integer >= 1"),
        (lambda: block_sparse_flash_attention(q, q, q, torch.ones(1, 1, dtype=torch.bool), 8.0), TypeError,
         r"block_sparse_flash_attention: block_size"),
        (lambda: block_sparse_flash_attention(q, q, q, torch.ones(2, 2, dtype=torch.bool), 8), ValueError,
         r"block_sparse_flash_attention: block_mask must be a bool tensor of shape .* = \(1, 1\)"),
        (lambda: block_sparse_flash_attention(q, q, q, torch.ones(1, 1), 8), ValueError,
         r"block_sparse_flash_attention: block_mask .*torch.float32"),
        (lambda: select_backend(q, "auto", kernel="decode"), ValueError, r"select_backend: kernel must be"),
        (lambda: select_backend(q.long(), "torch"), TypeError, r"select_backend: q must be a floating-point"),
        (lambda: hbm_accesses(1024, 64, 2.5e4), TypeError, r"hbm_accesses: sram_bytes must be an integer"),
        (lambda: hbm_accesses(0, 64, 2**16), ValueError, r"hbm_accesses: seq_len must be an integer >= 1, got 0"),
    ]


@pytest.mark.parametrize("index", range(len(_bad_flash_calls())))
def test_bad_arguments_raise_errors_naming_the_function_and_the_argument(index):
    call, error, pattern = _bad_flash_calls()[index]
    with pytest.raises(error, match=pattern):
        call()


def test_empty_sequences_give_the_documented_results(gen):
    q, k, v = _qkv(gen, 4, 5)
    assert flash_attention(q[:, :, :0], k, v).shape == (2, 2, 0, 8)  # no query: an empty output
    none = flash_attention(q, k[:, :, :0], v[:, :, :0])  # no key: zeros, lse -inf
    assert torch.equal(none, torch.zeros_like(q))
    _, lse = flash_forward(q, k[:, :, :0], v[:, :, :0])
    assert torch.isinf(lse).all() and (lse < 0).all()
    empty_mask = torch.ones(1, 0, dtype=torch.bool)
    assert torch.equal(block_sparse_flash_attention(q, k[:, :, :0], v[:, :, :0], empty_mask, 4), torch.zeros_like(q))
    assert block_sparse_flash_attention(q[:, :, :0], k, v, torch.ones(0, 2, dtype=torch.bool), 4).shape == (2, 2, 0, 8)
    assert online_softmax(torch.zeros(3, 0), 4).shape == (3, 0)
    assert key_range(0, 0, 0, 0) == (0, 0)


def test_triton_without_a_gpu_or_the_interpreter_says_how_to_get_one(monkeypatch):
    """No GPU and no TRITON_INTERPRET: a clear error naming the function, how to get the
    interpreter, and backend='torch' (not Triton's raw '0 active drivers')."""
    from attnbook import kernels

    monkeypatch.setattr(kernels, "_triton_version", lambda: "3.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = torch.zeros(1, 2, 16, 16)
    packed, cu = torch.zeros(16, 2, 16), torch.tensor([0, 16], dtype=torch.int32)
    calls = {
        "flash_attention": lambda: flash_attention(q, q, q, backend="triton"),
        "flash_attention_varlen": lambda: flash_attention_varlen(packed, packed, packed, cu, cu, 16, 16,
                                                                 backend="triton"),
        "block_sparse_flash_attention": lambda: block_sparse_flash_attention(
            q, q, q, torch.ones(1, 1, dtype=torch.bool), 16, backend="triton"),
        "select_backend": lambda: select_backend(q, "triton"),
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError) as info:
            call()
        message = str(info.value)
        assert message.startswith(f"{name}: backend='triton' needs")
        assert "TRITON_INTERPRET" in message and "backend='torch'" in message and "0 active drivers" not in message
    # the variable set after the kernels were compiled for a GPU: said so, before Triton fails
    fake = type(sys)("attnbook.kernels.flash_triton")
    fake._fwd_kernel = type("JITFunction", (), {})()
    monkeypatch.setitem(sys.modules, "attnbook.kernels.flash_triton", fake)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match=r"flash_attention: .*TRITON_INTERPRET=1 was set after .* imported"):
        flash_attention(q, q, q, backend="triton")
    assert flash_attention(q, q, q, backend="torch").shape == q.shape  # the way out


# ---------------------------------------------------------------------------------------------
# plan_tiles: the CPU tile plan, and the tiled path without a copy of K and V under GQA
# ---------------------------------------------------------------------------------------------
@given(E=st.integers(1, 512), Ev=st.integers(1, 512), l1=st.integers(2**10, 2**20), l2=st.integers(2**14, 2**25),
       double=st.booleans(), threads=st.integers(1, 12))
def test_plan_tiles_fills_the_caches_as_documented(E, Ev, l1, l2, double, threads):
    dtype = torch.float64 if double else torch.float32
    w = 8 if double else 4
    share, bk = plan_tiles(E, Ev, dtype=dtype, l1_bytes=l1, l2_bytes=l2, threads=threads)
    split = 2 ** (threads.bit_length() - 1)  # the largest power of two <= threads
    assert share % split == 0
    bq = share // split  # one thread's rows: what its caches must hold
    assert bq & (bq - 1) == 0 and bk & (bk - 1) == 0  # powers of two
    assert 16 <= bq <= 256 and bq <= bk <= 4096
    # the query tile fits in L1 and is the largest power of two that does (within the bounds)
    assert bq == 16 or bq * E * w <= l1
    assert bq == 256 or 2 * bq * E * w > l1
    # the score tile and the key/value tiles fit in half of L2, and twice block_k would not
    fits = lambda bk: w * (bq * bk + bk * (E + Ev)) <= l2 / 2  # noqa: E731
    assert bk == bq or fits(bk)
    assert bk == 4096 or not fits(2 * bk)


def test_plan_tiles_reads_the_caches_and_the_defaults_are_its_plan(monkeypatch):
    from attnbook import flash

    assert plan_tiles(64) == plan_tiles(64, l1_bytes=flash._cache_bytes(1, 2**15),
                                        l2_bytes=flash._cache_bytes(2, 2**20), threads=torch.get_num_threads())
    caches = dict(l1_bytes=2**15, l2_bytes=2**20)
    assert plan_tiles(64, **caches, threads=1) == (128, 512)  # the worked example of the chapter
    assert plan_tiles(64, **caches, threads=2) == plan_tiles(64, **caches, threads=3) == (256, 512)
    seen = []
    monkeypatch.setattr(flash, "plan_tiles", lambda *a, **kw: seen.append(a) or (4, 8))
    gen = torch.Generator().manual_seed(0)
    q, k, v = _qkv(gen, 20, 30)
    out, lse = flash_forward(q, k, v)
    expected, expected_lse = flash_forward(q, k, v, block_q=4, block_k=8)
    assert seen and torch.equal(out, expected) and torch.equal(lse, expected_lse)


@pytest.mark.parametrize("H, H_kv", [(4, 1), (4, 2), (6, 3)])
def test_tiled_path_never_copies_k_and_v_for_grouped_query_attention(H, H_kv):
    from attnbook.utils import largest_new_tensor

    gen = torch.Generator().manual_seed(H * 10 + H_kv)
    q, k, v = _qkv(gen, 32, 512, E=8, H=H, H_kv=H_kv, dtype=torch.float32, batch=1)
    expanded = H * 512 * 8  # what repeating each key head for its query heads would allocate
    # views of K and V (and their gradients), the output and dq, and one tile per key head
    allowed = max(H_kv * 512 * 8, H * 32 * 8, H * 16 * 16)
    tiles = dict(block_q=16, block_k=16)
    assert largest_new_tensor(flash_forward, q, k, v, **tiles) <= allowed < expanded
    out, lse = flash_forward(q, k, v, **tiles)
    grad = torch.randn(out.shape, generator=gen)
    assert largest_new_tensor(flash_backward, q, k, v, out, lse, grad, **tiles) <= allowed
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    reference = torch.nn.functional.scaled_dot_product_attention(*leaves, enable_gqa=True)
    expected = torch.autograd.grad(reference, leaves, grad)
    torch.testing.assert_close(out, reference.detach(), atol=1e-5, rtol=1e-5)
    for got, want in zip(flash_backward(q, k, v, out, lse, grad, **tiles), expected):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(0, 2, 5, 4), (1, 0, 5, 4), (2, 2, 0, 4), (0, 0, 0, 4)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_attention_on_empty_shapes_equals_sdpa_and_backpropagates(shape, is_causal):
    """No batch, no heads or no queries: SDPA's empty output, and a backward pass that gives
    empty gradients (a reshape of -1 and H // Hkv failed on these)."""
    q, k, v = (torch.randn(*shape, requires_grad=True) for _ in range(3))
    out = flash_attention(q, k, v, is_causal=is_causal)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert out.shape == ref.shape
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape


def test_flash_attention_with_a_head_dim_of_zero_and_a_scale_equals_sdpa():
    q, k = torch.randn(1, 2, 3, 0), torch.randn(1, 2, 6, 0)
    v = torch.randn(1, 2, 6, 5)
    out = flash_attention(q, k, v, scale=1.0)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0)
    assert torch.allclose(out, ref)  # every score 0: the mean of the values
