"""The Triton kernels compiled and run on a real CUDA GPU: skipped without one.

Run on a GPU machine (the interpreter must be off, since other kernel tests switch it on)::

    TRITON_INTERPRET=0 python -m pytest tests/kernels/test_kernels_gpu.py

FlashAttention-2's accuracy rule, as in its own test suite: against a float32 reference, the
kernel's error in the output and in each gradient is at most twice the error of PyTorch computing
in the kernel's dtype (plus a small absolute slack for values near zero). Covered: forward and
backward in float16 and bfloat16, causal and not, GQA, head dims 40, 64, 80, 96, 128 and 256,
values narrower than keys, inputs in the (B, L, H, E) layout, block-sparse forward and backward,
split-KV decoding, and the autotuner's choice.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU: tests/kernels/test_kernels_compile.py checks the kernels compile for one",
                allow_module_level=True)
if os.environ.get("TRITON_INTERPRET") == "1":  # pragma: no cover - only on a GPU machine
    pytest.skip("TRITON_INTERPRET=1 is set: run TRITON_INTERPRET=0 pytest tests/kernels/test_kernels_gpu.py",
                allow_module_level=True)

from attnbook.flash import block_sparse_flash_attention, flash_attention  # noqa: E402
from attnbook.kernels import tuning  # noqa: E402
from attnbook.kernels.decode import _split_kv_attention  # noqa: E402

CAPABILITY = torch.cuda.get_device_capability()
DTYPES = [torch.float16] + ([torch.bfloat16] if CAPABILITY >= (8, 0) else [])
SLACK = {torch.float16: 1e-3, torch.bfloat16: 1e-2}


def _run(fn, tensors, grad, dtype):
    leaves = [t.detach().to(dtype).requires_grad_() for t in tensors]
    out = fn(*leaves)
    out.backward(grad.to(dtype))
    return [out.detach().float()] + [t.grad.float() for t in leaves]


def _assert_within_twice_pytorch(ours, fn_reference, tensors, grad, dtype, what):
    exact = _run(fn_reference, tensors, grad, torch.float32)
    same = _run(fn_reference, tensors, grad, dtype)
    for name, o, r, p in zip(["out", "dq", "dk", "dv"], ours, exact, same):
        err, err_pt = (o - r).abs().max().item(), (p - r).abs().max().item()
        assert err <= 2 * err_pt + SLACK[dtype], f"{what} {name}: {err:.3g} vs PyTorch {err_pt:.3g}"


def _sdpa_gqa(causal):
    def fn(q, k, v):
        group = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(
            q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), is_causal=causal)
    return fn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("E, Ev", [(40, 40), (64, 64), (80, 80), (96, 96), (128, 128), (256, 256), (64, 32)])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_backward_within_twice_pytorch_error(dtype, E, Ev, causal):
    g = torch.Generator(device="cuda").manual_seed(E + Ev)
    B, H, H_kv, L, S = 2, 8, 2, 1000, 1000
    q = torch.randn(B, H, L, E, device="cuda", generator=g)
    k = torch.randn(B, H_kv, S, E, device="cuda", generator=g)
    v = torch.randn(B, H_kv, S, Ev, device="cuda", generator=g)
    grad = torch.randn(B, H, L, Ev, device="cuda", generator=g)
    ours = _run(lambda *t: flash_attention(*t, is_causal=causal, backend="triton"), (q, k, v), grad, dtype)
    _assert_within_twice_pytorch(ours, _sdpa_gqa(causal), (q, k, v), grad, dtype, f"E={E} Ev={Ev}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_inputs_in_the_hugging_face_layout(dtype):
    g = torch.Generator(device="cuda").manual_seed(1)
    B, L, H, E = 2, 777, 8, 64
    q, k, v = (torch.randn(B, L, H, E, device="cuda", generator=g).transpose(1, 2) for _ in range(3))
    grad = torch.randn(B, L, H, E, device="cuda", generator=g).transpose(1, 2)
    ours = _run(lambda *t: flash_attention(*t, is_causal=True, backend="triton"), (q, k, v), grad, dtype)
    _assert_within_twice_pytorch(ours, _sdpa_gqa(True), (q, k, v), grad, dtype, "strided")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", [16, 64, 128])
def test_block_sparse_forward_and_backward(dtype, block):
    g = torch.Generator(device="cuda").manual_seed(block)
    L = S = 900
    n = -(-L // block)
    block_mask = torch.rand(n, n, device="cuda", generator=g) < 0.4
    block_mask |= torch.eye(n, dtype=torch.bool, device="cuda")
    q, k, v = (torch.randn(1, 4, L, 64, device="cuda", generator=g) for _ in range(3))
    grad = torch.randn(1, 4, L, 64, device="cuda", generator=g)
    allowed = block_mask.repeat_interleave(block, 0).repeat_interleave(block, 1)[:L, :S]

    def reference(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)

    ours = _run(lambda *t: block_sparse_flash_attention(*t, block_mask, block, backend="triton"),
                (q, k, v), grad, dtype)
    _assert_within_twice_pytorch(ours, reference, (q, k, v), grad, dtype, f"block {block}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [40, 64, 128, 256])
def test_decode_kernel(dtype, d):
    g = torch.Generator(device="cuda").manual_seed(d)
    q = torch.randn(4, 8, 1, d, device="cuda", generator=g)
    k, v = (torch.randn(4, 2, 4096, d, device="cuda", generator=g) for _ in range(2))
    seqlens = torch.tensor([4096, 1, 1000, 3333], device="cuda")
    out = _split_kv_attention(q.to(dtype), k.to(dtype), v.to(dtype), seqlens).float()
    for b, n in enumerate(seqlens.tolist()):
        exact = _sdpa_gqa(False)(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n])
        same = _sdpa_gqa(False)(*(t.to(dtype) for t in (q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n])))
        err, err_pt = (out[b:b + 1] - exact).abs().max().item(), (same.float() - exact).abs().max().item()
        assert err <= 2 * err_pt + SLACK[dtype]


def test_the_autotuner_chose_among_configurations_that_fit():
    q = torch.randn(1, 4, 2048, 64, device="cuda", dtype=torch.float16)
    flash_attention(q, q, q, backend="triton")
    chosen = {key: config for key, config in tuning.tuned().items() if key[0] == "flash_fwd"}
    assert chosen
    fitting = {config for config, _ in tuning.candidates("flash_fwd", CAPABILITY, torch.float16, 64)}
    assert set(chosen.values()) <= fitting


def test_a_cpu_generator_samples_the_same_tokens_on_the_gpu():
    """The chapters seed a CPU generator and may run their model on the GPU: sampling there
    draws the CPU generator's numbers (attnbook._random), so the tokens are those of the
    same model on the CPU (the Transformer chapter stopped on this)."""
    from attnbook.models import TinyGPT, TransformerConfig

    torch.manual_seed(0)
    model = TinyGPT(TransformerConfig(vocab_size=32, d_model=32, n_heads=2, n_layers=2)).eval()
    idx = torch.tensor([[1, 2, 3]])
    on_cpu = model.generate(idx, 20, temperature=0.8, generator=torch.Generator().manual_seed(4))
    on_gpu = model.cuda().generate(idx.cuda(), 20, temperature=0.8,
                                   generator=torch.Generator().manual_seed(4))
    assert torch.equal(on_gpu.cpu(), on_cpu)
