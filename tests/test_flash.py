"""attnbook.flash: online softmax, tiled forward/backward and the backend dispatch, on CPU."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnbook.core import scaled_dot_product_attention
from attnbook.flash import (
    flash_attention,
    hbm_accesses,
    merge_partials,
    online_softmax,
    online_softmax_step,
    select_backend,
    tiled_attention_backward,
    tiled_attention_forward,
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


@pytest.mark.parametrize("L, S", [(1, 1), (7, 7), (17, 30), (30, 17), (1, 23)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("blocks", [(4, 4), (5, 3), (64, 64)])
def test_tiled_forward_equals_attention_and_logsumexp(gen, L, S, causal, blocks):
    q, k, v = _qkv(gen, L, S)
    out, lse = tiled_attention_forward(q, k, v, is_causal=causal, block_q=blocks[0], block_k=blocks[1])
    torch.testing.assert_close(out, scaled_dot_product_attention(q, k, v, is_causal=causal))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        i, j = torch.arange(L)[:, None], torch.arange(S)[None, :]
        scores = scores.masked_fill(j > i + S - L, -math.inf)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1))


def test_tiled_forward_supports_gqa_and_a_custom_scale(gen):
    q, k, v = _qkv(gen, 9, 11, H=6, H_kv=2)
    out, _ = tiled_attention_forward(q, k, v, is_causal=True, scale=0.3, block_q=4, block_k=3)
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
    out, lse = tiled_attention_forward(q, k, v, block_q=8, block_k=8)
    assert out.dtype == torch.float16 and lse.dtype == torch.float32
    exact = scaled_dot_product_attention(q.double(), k.double(), v.double())
    torch.testing.assert_close(out.double(), exact, atol=2e-3, rtol=0)
    dq, dk, dv = tiled_attention_backward(q, k, v, out, lse, torch.ones_like(out), block_q=8, block_k=8)
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
    monkeypatch.setattr("attnbook.flash._triton_importable", lambda: False)
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
        tiled_attention_forward(q, k, v, block_q=0)


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
