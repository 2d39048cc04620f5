"""The Triton FlashAttention kernels, run on CPU by Triton's interpreter (``TRITON_INTERPRET=1``).

Accuracy is judged as FlashAttention's own tests judge it: against a float64 reference, the
kernel's error must be at most twice the error of a PyTorch reference computed in the kernel's
dtype (plus a tiny absolute slack), for the output and for the three gradients. Shapes are small
and ragged (lengths 1, 17, 100, 130; not multiples of the 32-row tiles) so the masked tails run;
head dims 8 to 256, with the ones that are not powers of two (40, 80, 96) padded inside; values
narrower or wider than keys; inputs in the (B, L, H, E) layout read where they lie; offsets past
2^31 elements; and the block-sparse backward against dense attention with the same mask.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")
if os.environ["TRITON_INTERPRET"] != "1":  # pragma: no cover - only when a GPU run overrides it
    pytest.skip("these tests exercise the CPU interpreter", allow_module_level=True)

from attnbook.core import scaled_dot_product_attention  # noqa: E402
from attnbook.attend import block_sparse_flash_attention, flash_attention  # noqa: E402
from attnbook.kernels.flash_triton import _block_sparse_attention_forward, _flash_forward  # noqa: E402
from attnbook.sparse import bigbird_block_mask, block_sparse_attention, sliding_window_mask  # noqa: E402

ATOL = {torch.float32: 1e-5, torch.float16: 1e-4}


def _inputs(gen, L, S, E, H=2, H_kv=2, dtype=torch.float32, batch=1, Ev=None):
    shapes = ((batch, H, L, E), (batch, H_kv, S, E), (batch, H_kv, S, Ev or E))
    return [torch.randn(*s, generator=gen).to(dtype) for s in shapes]


def _reference(q, k, v, is_causal, grad_out):
    """Output and gradients of the readable attention, in the dtype of the inputs."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    out = scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), is_causal=is_causal)
    out.backward(grad_out.to(out.dtype))
    return [out.detach(), q.grad, k.grad, v.grad]


CASES = [  # (L, S, head_dim, causal, H, H_kv, dtype)
    (1, 1, 16, False, 2, 2, torch.float32),
    (17, 17, 16, True, 2, 2, torch.float32),
    (100, 100, 32, True, 2, 1, torch.float32),  # MQA
    (100, 130, 64, False, 4, 2, torch.float32),  # GQA
    (130, 100, 32, True, 2, 2, torch.float32),  # L > S: the first 30 queries see no key
    (1, 130, 64, True, 2, 2, torch.float32),  # one decoding step
    (17, 17, 32, False, 2, 2, torch.float16),
    (100, 130, 16, True, 4, 2, torch.float16),
    (130, 130, 64, True, 2, 2, torch.float16),
    (130, 17, 16, False, 2, 1, torch.float16),
    (100, 130, 64, False, 4, 1, torch.float16),
    (17, 100, 128, True, 2, 2, torch.float32),
    # head dims that are not powers of two: padded to 64, 128, 128, 16 inside the kernels
    (100, 130, 40, True, 2, 1, torch.float32),
    (130, 100, 80, False, 2, 2, torch.float16),
    (17, 130, 96, True, 4, 2, torch.float32),
    (33, 33, 8, True, 2, 2, torch.float16),
    (40, 70, 256, True, 2, 1, torch.float32),  # Gemma's width
    (70, 40, 256, False, 2, 2, torch.float16),
]


@pytest.mark.parametrize("L, S, E, causal, H, H_kv, dtype", CASES)
def test_forward_and_gradients_within_twice_pytorch_error(gen, L, S, E, causal, H, H_kv, dtype):
    _check_against_pytorch(gen, L, S, E, causal, H, H_kv, dtype)


@pytest.mark.parametrize("E, Ev", [(32, 16), (24, 72), (64, 128)])
def test_values_of_another_width_than_keys(gen, E, Ev):
    _check_against_pytorch(gen, 70, 45, E, True, 2, 1, torch.float32, Ev=Ev)


def _check_against_pytorch(gen, L, S, E, causal, H, H_kv, dtype, Ev=None):
    q, k, v = _inputs(gen, L, S, E, H, H_kv, dtype, Ev=Ev)
    grad_out = torch.randn(1, H, L, Ev or E, generator=gen)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, ran = flash_attention(*leaves, is_causal=causal, backend="triton", return_backend=True)
    assert ran == "triton"
    out.backward(grad_out.to(dtype))
    got = [out.detach()] + [t.grad for t in leaves]
    exact = _reference(q.double(), k.double(), v.double(), causal, grad_out.double())
    same_dtype = _reference(q, k, v, causal, grad_out)
    for name, g, r, p in zip(["out", "dq", "dk", "dv"], got, exact, same_dtype):
        assert g.dtype == dtype and g.shape == r.shape
        err, err_pt = (g.double() - r).abs().max().item(), (p.double() - r).abs().max().item()
        assert err <= 2 * err_pt + ATOL[dtype], f"{name}: kernel error {err:.3g} vs PyTorch {dtype} error {err_pt:.3g}"


def test_queries_that_see_no_key_give_zeros_and_minus_inf_lse(gen):
    q, k, v = _inputs(gen, 40, 17, 16)
    out, lse = _flash_forward(q, k, v, is_causal=True)  # bottom-right: query i sees keys j <= i - 23
    assert torch.all(out[:, :, :23] == 0) and torch.all(lse[:, :, :23] == float("-inf"))
    assert torch.isfinite(lse[:, :, 23:]).all()
    expected = torch.logsumexp(q.double() @ k.double().transpose(-1, -2) / 4.0, dim=-1)
    torch.testing.assert_close(lse[:, :, -1].double(), expected[:, :, -1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pattern", ["sliding", "bigbird"])
@pytest.mark.parametrize("causal", [False, True])
def test_block_sparse_kernel_equals_dense_masked_attention(gen, pattern, causal):
    L = S = 130  # 5 blocks of 32, the last one ragged
    q, k, v = _inputs(gen, L, S, 32, H=2, H_kv=1)
    if pattern == "sliding":
        block_mask = sliding_window_mask(5, 1)
    else:
        block_mask = bigbird_block_mask(5, n_global=1, n_window=3, n_random=1, generator=gen)
    got, ran = block_sparse_flash_attention(q, k, v, block_mask, 32, is_causal=causal, backend="triton",
                                            return_backend=True)
    assert ran == "triton"
    expected = block_sparse_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), block_mask, 32, is_causal=causal)
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)


def test_block_sparse_kernel_skips_inactive_blocks(gen):
    """NaN in a key block the mask excludes cannot reach the output if the block is never loaded."""
    q, k, v = _inputs(gen, 64, 64, 16)
    k[:, :, 32:] = float("nan")
    block_mask = torch.tensor([[True, False], [True, False]])
    out = _block_sparse_attention_forward(q, k, v, block_mask, 32)
    assert torch.isfinite(out).all()
    expected = scaled_dot_product_attention(q, k[:, :, :32], v[:, :, :32])
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)


def test_unsupported_inputs_raise_clear_errors(gen):
    """What the kernels cannot take is refused once, by the entry point that would launch
    them (attnbook.attend), naming itself: the launchers trust their inputs."""
    q, k, v = _inputs(gen, 17, 17, 16)
    triton = dict(backend="triton")
    with pytest.raises(ValueError, match="flash_attention: bfloat16"):
        flash_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), **triton)
    with pytest.raises(ValueError, match="flash_attention: backend='triton' takes .*float64"):
        flash_attention(q.double(), k.double(), v.double(), **triton)
    with pytest.raises(ValueError, match="flash_attention: the head_dim of q .* at most 256"):
        flash_attention(*_inputs(gen, 17, 17, 264), **triton)
    with pytest.raises(ValueError, match="head_dim of v"):
        flash_attention(*_inputs(gen, 17, 17, 16, Ev=300), **triton)
    with pytest.raises(ValueError, match="block_sparse_flash_attention: block_size must be a power of two"):
        block_sparse_flash_attention(q, k, v, torch.ones(2, 2, dtype=torch.bool), 12, **triton)
    with pytest.raises(ValueError, match="block_sparse_flash_attention: block_mask"):
        block_sparse_flash_attention(q, k, v, torch.ones(3, 3, dtype=torch.bool), 16, **triton)
    assert block_sparse_flash_attention(q, k, v, torch.ones(2, 2, dtype=torch.bool), 12,
                                        return_backend=True)[1] == "torch"  # "auto" never picks it


def test_inputs_in_the_hugging_face_layout_are_read_where_they_lie(gen, monkeypatch):
    """(B, L, H, E) tensors transposed to (B, H, L, E): the kernels get the caller's views, not
    copies, the output keeps the layout (transposing it back is free), and the result matches."""
    from attnbook.kernels import flash_triton

    B, L, H, H_kv, E = 2, 37, 4, 2, 32
    q = torch.randn(B, L, H, E, generator=gen).transpose(1, 2)
    k, v = (torch.randn(B, L, H_kv, E, generator=gen).transpose(1, 2) for _ in range(2))
    launched = []
    real_launch = flash_triton._launch
    monkeypatch.setattr(flash_triton, "_launch", lambda kernel, fn, grid, args, *rest: (
        launched.append((kernel, args)), real_launch(kernel, fn, grid, args, *rest))[1])
    out, lse = _flash_forward(q, k, v, is_causal=True)
    grad_out = torch.randn(B, L, H, E, generator=gen).transpose(1, 2)
    dq, dk, dv = flash_triton._flash_backward(q, k, v, out, lse, grad_out, is_causal=True)
    fwd_args = launched[0][1]
    assert fwd_args[0] is q and fwd_args[1] is k and fwd_args[2] is v
    dkdv_args = dict(launched)["flash_bwd_dkdv"]
    assert dkdv_args[0] is q and dkdv_args[3] is grad_out
    assert not q.is_contiguous() and out.stride() == q.stride() and out.transpose(1, 2).is_contiguous()
    exact = _reference(q.double(), k.double(), v.double(), True, grad_out.double())
    for name, got, want in zip(["out", "dq", "dk", "dv"], [out, dq, dk, dv], exact):
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5, msg=name)


def test_offsets_past_two_to_the_31_elements(gen):
    """Batch 2 of a view whose batch stride is 2^30 + 64 elements starts 2^31 + 128 elements into
    its storage: 32-bit offset arithmetic would wrap around and read the wrong memory. The storage
    (4 GiB of float16) is reserved, not written: only the three small slices used are touched."""
    stride_b = 2**30 + 64
    L, E = 24, 16
    storage = torch.empty(2 * stride_b + L * E, dtype=torch.float16)
    q = storage.as_strided((3, 1, L, E), (stride_b, L * E, E, 1))
    for b in range(3):
        q[b] = torch.randn(1, L, E, generator=gen).half()
    assert q.storage_offset() + 2 * q.stride(0) >= 2**31
    k, v = (torch.randn(3, 1, L, E, generator=gen).half() for _ in range(2))
    out, _ = _flash_forward(q, k, v, is_causal=True)
    expected = scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    torch.testing.assert_close(out.float(), expected, atol=2e-3, rtol=2e-3)
    grads = flash_triton_backward(q, k, v, out, torch.randn(3, 1, L, E, generator=gen).half())
    assert all(torch.isfinite(g).all() for g in grads)


def flash_triton_backward(q, k, v, out, grad_out):
    from attnbook.kernels.flash_triton import _flash_backward

    _, lse = _flash_forward(q, k, v, is_causal=True)
    return _flash_backward(q, k, v, out, lse, grad_out, is_causal=True)


def test_a_head_whose_rows_span_2_to_the_31_elements_is_refused(gen):
    storage = torch.empty(2**31 + 16, dtype=torch.float16)  # reserved, never touched
    q = storage.as_strided((1, 1, 2, 16), (0, 0, 2**31, 1))
    kv = torch.zeros(1, 1, 2, 16).half()
    with pytest.raises(ValueError, match="flash_attention: q .* spans .* elements within one head"):
        flash_attention(q, kv, kv, backend="triton")


def _dense_mask(block_mask, block, L, S):
    return block_mask.repeat_interleave(block, 0).repeat_interleave(block, 1)[:L, :S]


@pytest.mark.parametrize("block, causal, L, S, E, dtype", [
    (32, False, 100, 100, 24, torch.float32),
    (32, True, 130, 100, 32, torch.float32),
    (16, True, 70, 70, 16, torch.float16),
    (64, False, 130, 150, 40, torch.float32),  # a 64-token mask block walked in 32-row tiles
])
def test_block_sparse_backward_equals_dense_attention_with_the_same_mask(gen, block, causal, L, S, E, dtype):
    n_qb, n_kb = -(-L // block), -(-S // block)
    block_mask = torch.rand(n_qb, n_kb, generator=gen) < 0.5
    block_mask[0, 0] = block_mask[-1, -1] = True
    q, k, v = _inputs(gen, L, S, E, H=2, H_kv=1, dtype=dtype)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, ran = block_sparse_flash_attention(*leaves, block_mask, block, is_causal=causal, backend="triton",
                                            return_backend=True)
    assert ran == "triton" and out.grad_fn is not None
    grad_out = torch.randn(1, 2, L, E, generator=gen).to(dtype)
    out.backward(grad_out)
    allowed = _dense_mask(block_mask, block, L, S)
    if causal:
        allowed = allowed & (torch.arange(S)[None, :] <= torch.arange(L)[:, None] + S - L)

    def reference(q, k, v, grad):
        q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
        scores = q @ k.repeat_interleave(2, 1).transpose(-1, -2) / E**0.5
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
        o = weights @ v.repeat_interleave(2, 1)
        o.backward(grad)
        return [o.detach(), q.grad, k.grad, v.grad]

    exact = reference(q.double(), k.double(), v.double(), grad_out.double())
    same = reference(q, k, v, grad_out)
    for name, g, r, p in zip(["out", "dq", "dk", "dv"], [out.detach()] + [t.grad for t in leaves], exact, same):
        err, err_pt = (g.double() - r).abs().max().item(), (p.double() - r).abs().max().item()
        assert err <= 2 * err_pt + ATOL[dtype], f"{name}: kernel error {err:.3g} vs PyTorch {err_pt:.3g}"


def test_block_sparse_gradients_are_the_same_on_both_backends(gen):
    q, k, v = _inputs(gen, 96, 96, 32)
    block_mask = sliding_window_mask(3, 1)
    grads = {}
    for backend in ("torch", "triton"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        block_sparse_flash_attention(*leaves, block_mask, 32, is_causal=True, backend=backend).sum().backward()
        grads[backend] = [t.grad for t in leaves]
    for got, want in zip(grads["triton"], grads["torch"]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_block_sparse_backward_skips_inactive_blocks(gen):
    """NaN in keys, values and queries outside the active tiles cannot reach any gradient."""
    from attnbook.kernels.flash_triton import _block_sparse_attention_backward

    q, k, v = _inputs(gen, 64, 64, 16)
    k[:, :, 32:] = float("nan")
    v[:, :, 32:] = float("nan")
    block_mask = torch.tensor([[True, False], [True, False]])
    out, lse = _block_sparse_attention_forward(q, k, v, block_mask, 32, return_lse=True)
    dq, dk, dv = _block_sparse_attention_backward(q, k, v, out, lse, torch.ones_like(out), block_mask, 32)
    assert torch.isfinite(dq).all() and torch.isfinite(dk[:, :, :32]).all() and torch.isfinite(dv[:, :, :32]).all()
    assert (dk[:, :, 32:] == 0).all() and (dv[:, :, 32:] == 0).all()


# --------------------------------------------------------------------------------------
# FlashAttention-2's fused options and packed sequences, in the kernels
# --------------------------------------------------------------------------------------
def _fused_reference(q, k, v, grad_out, *, is_causal=False, window=(-1, -1), slopes=None, softcap=0.0):
    """Output and gradients of the options applied to the full score matrix (dtype of the inputs)."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    L, S = q.shape[2], k.shape[2]
    s = q @ kk.transpose(-1, -2) / q.shape[-1] ** 0.5
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i, j = torch.arange(L)[:, None] + S - L, torch.arange(S)[None, :]
    if slopes is not None:
        s = s - slopes.reshape(-1, q.shape[1], 1, 1).to(s.dtype) * (i - j).abs().to(s.dtype)
    allowed = torch.ones(L, S, dtype=torch.bool)
    if window[0] >= 0:
        allowed &= j >= i - window[0]
    if window[1] >= 0:
        allowed &= j <= i + window[1]
    if is_causal:
        allowed &= j <= i
    out = torch.softmax(s.float().masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0).to(q.dtype) @ vv
    out.backward(grad_out.to(out.dtype))
    return [out.detach(), q.grad, k.grad, v.grad]


@pytest.mark.parametrize("L, S, E, H, H_kv, causal, window, alibi, softcap, dtype", [
    (100, 100, 32, 2, 2, False, (20, 20), False, 0.0, torch.float32),
    (130, 100, 40, 4, 2, True, (33, -1), False, 0.0, torch.float32),  # L > S, GQA, padded head
    (70, 130, 16, 2, 1, False, (-1, 8), True, 0.0, torch.float32),
    (100, 100, 64, 2, 2, True, (-1, -1), True, 0.0, torch.float16),
    (90, 90, 32, 2, 2, False, (-1, -1), False, 3.0, torch.float32),
    (100, 120, 32, 4, 2, True, (40, 0), True, 2.0, torch.float16),  # all at once
])
def test_fused_options_in_the_kernels(gen, L, S, E, H, H_kv, causal, window, alibi, softcap, dtype):
    q, k, v = _inputs(gen, L, S, E, H, H_kv, dtype)
    slopes = torch.rand(1, H, generator=gen) if alibi else None
    grad_out = torch.randn(1, H, L, E, generator=gen)
    options = dict(is_causal=causal, window_size=window, alibi_slopes=slopes, softcap=softcap)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, ran = flash_attention(*leaves, **options, backend="triton", return_backend=True)
    assert ran == "triton"
    out.backward(grad_out.to(dtype))
    got = [out.detach()] + [t.grad for t in leaves]
    ref = dict(is_causal=causal, window=window, slopes=slopes, softcap=softcap)
    exact = _fused_reference(q.double(), k.double(), v.double(), grad_out.double(), **ref)
    same = _fused_reference(q, k, v, grad_out, **ref)
    for name, g, r, p in zip(["out", "dq", "dk", "dv"], got, exact, same):
        err, err_pt = (g.double() - r).abs().max().item(), (p.double() - r).abs().max().item()
        assert err <= 2 * err_pt + ATOL[dtype], f"{name}: kernel error {err:.3g} vs PyTorch {err_pt:.3g}"


def test_the_kernel_never_loads_tiles_outside_the_window(gen):
    """NaN keys and values far behind every query's window cannot reach the output or the gradients if
    their tiles are never loaded (a masked NaN would still poison the products: 0 * NaN = NaN)."""
    from attnbook.kernels.flash_triton import _flash_backward

    L = 128
    q, k, v = _inputs(gen, L, L, 16)
    # query tile 96..127 with window 16 sees keys >= 80; the first 64 keys are never needed there
    k[:, :, :64], v[:, :, :64] = float("nan"), float("nan")
    out, lse = _flash_forward(q, k, v, is_causal=True, window_size=(16, 0))
    assert torch.isfinite(out[:, :, 96:]).all() and torch.isnan(out[:, :, :64]).all()
    dq, _, _ = _flash_backward(q, k, v, out, lse, torch.ones_like(out), is_causal=True, window_size=(16, 0))
    assert torch.isfinite(dq[:, :, 96:]).all()


def test_packed_sequences_in_the_kernels_equal_each_sequence_alone(gen):
    from attnbook.attend import flash_attention_varlen

    lengths_q, lengths_k = [17, 1, 40, 0, 33], [17, 5, 40, 9, 20]
    H, H_kv, E = 4, 2, 24
    q = torch.randn(sum(lengths_q), H, E, generator=gen)
    k, v = (torch.randn(sum(lengths_k), H_kv, E, generator=gen) for _ in range(2))
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()], dtype=torch.int32)
    slopes = torch.rand(len(lengths_q), H, generator=gen)
    options = dict(is_causal=True, window_size=(12, -1), alibi_slopes=slopes, softcap=2.0)
    grads = {}
    for backend in ("torch", "triton"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out, ran = flash_attention_varlen(*leaves, cu_q, cu_k, 40, 40, **options, backend=backend,
                                          return_backend=True)
        assert ran == backend
        out.backward(torch.ones_like(out))
        grads[backend] = [out.detach()] + [t.grad for t in leaves]
    for name, got, want in zip(["out", "dq", "dk", "dv"], grads["triton"], grads["torch"]):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5, msg=name)
