"""The Triton FlashAttention kernels, run on CPU by Triton's interpreter (``TRITON_INTERPRET=1``).

Accuracy is judged as FlashAttention's own tests judge it: against a float64 reference, the
kernel's error must be at most twice the error of a PyTorch reference computed in the kernel's
dtype (plus a tiny absolute slack), for the output and for the three gradients. Shapes are small
and ragged (lengths 1, 17, 100, 130; not multiples of the 32-row tiles) so the masked tails run.
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
from attnbook.flash import block_sparse_flash_attention, flash_attention  # noqa: E402
from attnbook.kernels.flash_triton import block_sparse_forward, flash_forward  # noqa: E402
from attnbook.sparse import bigbird_block_mask, block_sparse_attention, sliding_window_mask  # noqa: E402

ATOL = {torch.float32: 1e-5, torch.float16: 1e-4}


def _inputs(gen, L, S, E, H=2, H_kv=2, dtype=torch.float32, batch=1):
    shapes = ((batch, H, L, E), (batch, H_kv, S, E), (batch, H_kv, S, E))
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
]


@pytest.mark.parametrize("L, S, E, causal, H, H_kv, dtype", CASES)
def test_forward_and_gradients_within_twice_pytorch_error(gen, L, S, E, causal, H, H_kv, dtype):
    q, k, v = _inputs(gen, L, S, E, H, H_kv, dtype)
    grad_out = torch.randn(1, H, L, E, generator=gen)
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
    out, lse = flash_forward(q, k, v, is_causal=True)  # bottom-right: query i sees keys j <= i - 23
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
    out = block_sparse_forward(q, k, v, block_mask, 32)
    assert torch.isfinite(out).all()
    expected = scaled_dot_product_attention(q, k[:, :, :32], v[:, :, :32])
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)


def test_unsupported_inputs_raise_clear_errors(gen):
    q, k, v = _inputs(gen, 17, 17, 16)
    with pytest.raises(ValueError, match="bfloat16"):
        flash_forward(q.bfloat16(), k.bfloat16(), v.bfloat16())
    with pytest.raises(ValueError, match="head_dim"):
        flash_forward(*_inputs(gen, 17, 17, 24))
    with pytest.raises(ValueError, match="block_size"):
        block_sparse_forward(q, k, v, torch.ones(2, 2, dtype=torch.bool), 12)
    with pytest.raises(ValueError, match="block_mask"):
        block_sparse_forward(q, k, v, torch.ones(3, 3, dtype=torch.bool), 16)
