"""Which backend runs where: the rule `attnbook.kernels.plan` and the report `attnbook.kernels.support`.

No GPU is needed: the rule is a pure function of the compute capability, dtype, head dim and
whether Triton is installed, and the report on a CPU says the PyTorch path runs.
"""

import pytest
import torch

from attnbook import kernels
from attnbook.flash import flash_attention, select_backend
from attnbook.kvcache import decode_attention

# (GPU, compute capability) as NVIDIA lists them
T4, V100, P100, A100, A10, L4, H100 = (7, 5), (7, 0), (6, 0), (8, 0), (8, 6), (8, 9), (9, 0)


@pytest.mark.parametrize("kernel", ["flash", "block_sparse", "decode"])
@pytest.mark.parametrize("capability", [T4, A100, A10, L4, H100])  # the tiers page's targets
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim", [16, 32, 40, 64, 96, 128, 256])
def test_plan_runs_triton_exactly_where_the_compiled_kernels_fit(kernel, capability, dtype, head_dim):
    block = 64 if kernel == "block_sparse" else None
    backend, why = kernels.plan(kernel, capability, dtype, head_dim, block_size=block)
    misfit = kernels.compiled_fit(kernel, capability, dtype, head_dim, block)
    if dtype == torch.bfloat16 and capability < (8, 0):
        assert backend == "torch" and "bfloat16" in why
    elif misfit is None:
        assert backend == "triton"
        assert ("fully supported" if capability >= (8, 0) else "without tensor cores") in why
    elif misfit[0] == "spill" and capability < (8, 0) and dtype != torch.float32:
        assert backend == "triton" and misfit[1] in why  # correct but slow, and said so
    else:  # no tile within the shared memory, or every tile that fits spills
        assert backend == "torch" and why.startswith(misfit[1])


@pytest.mark.parametrize("capability", [A100, L4, H100])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [16, 32, 64, 128])
def test_half_precision_fits_every_ampere_or_newer_gpu_up_to_head_dim_128(capability, dtype, head_dim):
    for kernel in ("flash", "block_sparse", "decode"):
        assert kernels.plan(kernel, capability, dtype, head_dim, block_size=32)[0] == "triton"


@pytest.mark.parametrize("capability", [T4, V100])
def test_volta_and_turing_run_fp16_without_tensor_cores_and_fall_back_for_bf16(capability):
    backend, why = kernels.plan("flash", capability, torch.float16, 64)
    assert backend == "triton" and "without tensor cores" in why
    backend, why = kernels.plan("flash", capability, torch.float32, 64)
    misfit = kernels.compiled_fit("flash", capability, torch.float32, 64)
    assert (backend, misfit is None) in {("triton", True), ("torch", False)}
    backend, why = kernels.plan("flash", capability, torch.bfloat16, 64)
    assert backend == "torch" and "bfloat16 needs compute capability >= 8.0" in why


def test_pascal_and_no_triton_and_cpu_fall_back_to_torch_with_the_reason():
    assert kernels.plan("decode", P100, torch.float16) == (
        "torch", "Triton does not compile for compute capability 6.0 (< 7.0)")
    backend, why = kernels.plan("flash", A100, torch.float16, 64, triton_version=None)
    assert backend == "torch" and "pip install triton" in why
    backend, why = kernels.plan("flash", None, torch.float16, 64)
    assert backend == "torch" and "no CUDA" in why


def test_any_head_dim_up_to_256_and_clear_reasons_beyond_it_or_for_bad_block_sizes():
    for d in (8, 40, 80, 96, 112, 160, 192, 256):
        assert kernels.plan("flash", A100, torch.float16, d)[0] == "triton", d
        assert kernels.plan("decode", A100, torch.float16, d)[0] == "triton", d
    backend, why = kernels.plan("flash", A100, torch.float16, 320)
    assert backend == "torch" and "head_dim 320 is over the kernels' 256" in why
    backend, why = kernels.plan("block_sparse", A100, torch.float16, 64, block_size=24)
    assert backend == "torch" and "block_size 24" in why


def test_plan_rejects_unknown_kernels_and_dtypes():
    with pytest.raises(ValueError, match="kernel must be one of"):
        kernels.plan("conv", A100)
    assert kernels.plan("flash", A100, torch.float64, 64)[0] == "torch"


def test_support_on_this_cpu_reports_the_pytorch_path():
    report = kernels.support("cpu")
    assert report.device == "cpu" and report.capability is None
    assert len(report.plans) == 6 and all(backend == "torch" for backend, _ in report.plans.values())
    text = str(report)
    assert text.startswith("device: cpu (compute capability -)") and "flash float16:    torch" in text
    assert "decode bfloat16:  torch" in text


def test_dispatchers_follow_the_plan_on_cpu(monkeypatch):
    q = torch.randn(1, 2, 5, 16)
    assert select_backend(q, "auto") == kernels.plan_for("flash", q)[0] == "torch"
    assert flash_attention(q, q, q, return_backend=True)[1] == "torch"
    k = torch.randn(1, 2, 7, 16)
    assert decode_attention(q[:, :, :1], k, k, torch.tensor([7]), return_backend=True)[1] == "torch"
    # values wider than the keys: the wider width is the one plan() checks
    wide = torch.randn(1, 2, 7, 300)
    assert kernels.plan_for("flash", q, wide)[1].startswith("no CUDA tensor")
    asked = []
    monkeypatch.setattr(kernels, "plan", lambda *args: asked.append(args) or ("torch", ""))
    kernels.plan_for("block_sparse", q, wide, 32)
    assert asked == [("block_sparse", None, torch.float32, 300, kernels._triton_version(), 32)]
