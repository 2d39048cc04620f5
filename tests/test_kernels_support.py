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
T4, V100, P100, A100, L4, H100 = (7, 5), (7, 0), (6, 0), (8, 0), (8, 9), (9, 0)


@pytest.mark.parametrize("kernel", ["flash", "decode"])
@pytest.mark.parametrize("capability", [A100, L4, H100])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_ampere_and_newer_run_triton_unless_the_compiled_kernels_do_not_fit(kernel, capability, dtype):
    backend, why = kernels.plan(kernel, capability, dtype, 64)
    misfit = kernels.compiled_fit(kernel, capability, dtype, 64)
    if misfit is None or (misfit[0] == "spill" and dtype != torch.float32):
        assert backend == "triton" and "fully supported" in why
    else:  # float32 tiles that spill, or anything over the shared-memory limit
        assert backend == "torch" and why.startswith(misfit[1])


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


def test_head_dims_outside_the_compiled_ones_fall_back_for_flash_only():
    assert kernels.plan("flash", A100, torch.float16, 80)[0] == "torch"
    assert "head_dim 80" in kernels.plan("flash", A100, torch.float16, 80)[1]
    assert kernels.plan("decode", A100, torch.float16, 80)[0] == "triton"  # decode pads head_dim to a power of 2
    for d in kernels.FLASH_HEAD_DIMS:
        assert kernels.plan("flash", A100, torch.float16, d)[0] == "triton"


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


def test_dispatchers_follow_the_plan_on_cpu():
    q = torch.randn(1, 2, 5, 16)
    assert select_backend(q, "auto") == kernels.plan_for("flash", q)[0] == "torch"
    assert flash_attention(q, q, q, return_backend=True)[1] == "torch"
    k = torch.randn(1, 2, 7, 16)
    assert decode_attention(q[:, :, :1], k, k, torch.tensor([7]), return_backend=True)[1] == "torch"
    # values narrower than the keys: the Triton kernels cannot run them, auto says why
    backend, why = kernels.plan_for("flash", q, q[..., :8])
    assert backend == "torch" and "value width 8" in why
