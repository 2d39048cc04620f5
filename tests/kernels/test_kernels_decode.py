"""The split-KV Triton decode kernel under Triton's CPU interpreter, against SDPA over each valid prefix.

No GPU here: TRITON_INTERPRET=1 runs the kernel program by program on CPU tensors (slow, so the
shapes are small and ragged). It must be set before triton is imported. The launcher
(``kernels.decode._split_kv_attention``) trusts its inputs; what it cannot take is refused by the
entry point that launches it, ``attnbook.attend.decode_attention(..., backend="triton")``.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from attnbook.attend import decode_attention as _decode_attention  # noqa: E402
from attnbook.kernels.decode import BLOCK_N, default_num_splits, _split_kv_attention  # noqa: E402
from attnbook.kvcache import split_kv_attention  # noqa: E402


def decode_attention(*args, **kwargs):
    """The entry point, told to run the kernel."""
    return _decode_attention(*args, **kwargs, backend="triton")


def make(B, H, H_kv, S, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, n, d, generator=g).to(dtype) for h, n in ((H, 1), (H_kv, S), (H_kv, S)))
    return q, k, v


def reference(q, k, v, seqlens):
    """fp32 SDPA over each sequence's valid prefix (zeros for an empty one)."""
    group = q.shape[1] // k.shape[1]
    outs = []
    for b, n in enumerate(seqlens.tolist()):
        kb, vb = (t[b:b + 1, :, :n].repeat_interleave(group, 1).float() for t in (k, v))
        outs.append(F.scaled_dot_product_attention(q[b:b + 1].float(), kb, vb) if n else torch.zeros_like(q[b:b + 1]).float())
    return torch.cat(outs)


CASES = [  # (B, H, H_kv, S, d, seqlens, num_splits): lengths 1, 17, 100, 130 are not multiples of BLOCK_N
    (3, 2, 2, 130, 32, [1, 17, 130], None),
    (2, 4, 2, 100, 24, [100, 33], 3),  # GQA, head_dim not a power of two
    (4, 4, 1, 70, 16, [70, 0, 32, 5], 5),  # MQA, an empty cache, splits beyond the valid length
    (1, 2, 2, 64, 64, [64], 1),  # one split: plain FlashAttention-style decoding
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("B, H, H_kv, S, d, seqlens, num_splits", CASES)
def test_decode_kernel_equals_sdpa_over_each_valid_prefix(B, H, H_kv, S, d, seqlens, num_splits, dtype):
    q, k, v = make(B, H, H_kv, S, d, dtype, seed=S + d)
    seqlens = torch.tensor(seqlens)
    out = _split_kv_attention(q, k, v, seqlens, num_splits=num_splits)
    assert out.shape == q.shape and out.dtype == dtype
    expected = reference(q, k, v, seqlens)
    if dtype == torch.float32:
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    else:  # FlashAttention-2's rule: no worse than twice the error of a PyTorch computation in fp16
        torch_fp16 = split_kv_attention(q, k, v, seqlens, num_splits=num_splits or 4).float()
        bound = 2 * (torch_fp16 - expected).abs().max() + 1e-3
        assert (out.float() - expected).abs().max() <= bound


def test_kernel_equals_the_pytorch_split_reference_and_does_not_depend_on_num_splits():
    q, k, v = make(2, 2, 1, 90, 16, torch.float32, seed=1)
    seqlens = torch.tensor([90, 41])
    outs = [_split_kv_attention(q, k, v, seqlens, num_splits=n) for n in (1, 2, 3)]
    for n, out in zip((1, 2, 3), outs):
        torch.testing.assert_close(out, split_kv_attention(q, k, v, seqlens, num_splits=n), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(out, outs[0], atol=1e-6, rtol=1e-5)


def test_kernel_reads_a_strided_cache_view_and_validates_arguments():
    """A view into a larger preallocated cache buffer (what KVCache hands out) needs no copy."""
    q, k, v = make(2, 2, 2, 40, 16, torch.float32, seed=2)
    big_k, big_v = torch.zeros(2, 2, 96, 16), torch.zeros(2, 2, 96, 16)
    big_k[:, :, :40], big_v[:, :, :40] = k, v
    seqlens = torch.tensor([40, 23])
    torch.testing.assert_close(_split_kv_attention(q, big_k[:, :, :40], big_v[:, :, :40], seqlens, num_splits=2),
                               reference(q, k, v, seqlens), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="cache_seqlens"):
        decode_attention(q, k, v, torch.tensor([41, 1]))
    with pytest.raises(ValueError, match="kv_heads"):
        decode_attention(q, k[:, :1].expand(2, 3, 40, 16), v[:, :1].expand(2, 3, 40, 16), seqlens)


def test_default_num_splits_fills_the_machine_but_keeps_whole_tiles():
    assert default_num_splits(batch_heads=1, max_len=65536) == 128
    assert default_num_splits(batch_heads=256, max_len=65536) == 1  # a big batch already fills the GPU
    assert default_num_splits(batch_heads=1, max_len=3 * BLOCK_N) == 3


def test_num_splits_is_bounded_by_the_merge_kernels_tile():
    """The merge kernel reads every split in one tile; the compile test covers tiles up to MAX_SPLITS."""
    from attnbook.kernels.decode import MAX_SPLITS, MERGE_BLOCKS, default_num_splits
    assert default_num_splits(1, 10**6) == MAX_SPLITS == MERGE_BLOCKS[-1]
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 40, 16)
    with pytest.raises(ValueError, match=f"num_splits must be between 1 and {MAX_SPLITS}"):
        decode_attention(q, k, k, torch.tensor([40]), num_splits=MAX_SPLITS + 1)


@pytest.mark.parametrize("d, dv", [(8, 8), (40, 40), (256, 256), (24, 72), (64, 16)])
def test_any_head_dim_up_to_256_and_values_of_another_width(d, dv):
    g = torch.Generator().manual_seed(d + dv)
    q = torch.randn(2, 4, 1, d, generator=g)
    k = torch.randn(2, 2, 70, d, generator=g)
    v = torch.randn(2, 2, 70, dv, generator=g)
    seqlens = torch.tensor([70, 33])
    out = _split_kv_attention(q, k, v, seqlens, num_splits=3)
    assert out.shape == (2, 4, 1, dv)
    torch.testing.assert_close(out, reference(q, k, v, seqlens), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="head_dim of q .* at most 256"):
        decode_attention(torch.randn(1, 1, 1, 264), torch.randn(1, 1, 4, 264), torch.randn(1, 1, 4, 264),
                         torch.tensor([4]))


def test_cache_offsets_past_two_to_the_31_elements():
    """Sequence 2 of a cache whose batch stride is 2^30 + 64 starts past 2^31 elements: 32-bit
    offsets would wrap. The 4 GiB float16 storage is reserved; only the used slices are written."""
    stride_b, S, d = 2**30 + 64, 40, 16
    storage = torch.empty(2 * stride_b + S * d, dtype=torch.float16)
    k = storage.as_strided((3, 1, S, d), (stride_b, S * d, d, 1))
    g = torch.Generator().manual_seed(3)
    for b in range(3):
        k[b] = torch.randn(1, S, d, generator=g).half()
    q, v = torch.randn(3, 1, 1, d, generator=g).half(), torch.randn(3, 1, S, d, generator=g).half()
    seqlens = torch.tensor([40, 17, 33])
    out = _split_kv_attention(q, k, v, seqlens, num_splits=2)
    torch.testing.assert_close(out.float(), reference(q, k, v, seqlens), atol=2e-3, rtol=2e-3)


def test_num_splits_zero_is_refused_before_launch():
    """Regression: num_splits=0 was silently replaced by default_num_splits."""
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 40, 16)
    with pytest.raises(ValueError, match="decode_attention: num_splits must be an integer >= 1, got 0"):
        decode_attention(q, k, k, torch.tensor([40]), num_splits=0)
    with pytest.raises(ValueError, match="decode_attention: scale must be a finite number"):
        decode_attention(q, k, k, torch.tensor([40]), scale=float("nan"))


def test_the_kernel_without_a_gpu_or_the_interpreter_says_how_to_get_one(monkeypatch):
    """Asked for the kernel on CPU tensors with TRITON_INTERPRET unset, the entry point says what
    is missing and how to get it (attnbook.kernels.triton_missing), before Triton's '0 active
    drivers'."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 40, 16)
    with pytest.raises(RuntimeError) as info:
        decode_attention(q, k, k, torch.tensor([40]))
    message = str(info.value)
    assert message.startswith("decode_attention: backend='triton' needs a CUDA tensor or Triton's CPU interpreter")
    assert "TRITON_INTERPRET" in message and "backend='torch'" in message and "0 active drivers" not in message


def test_the_launchers_old_name_warns_for_one_release():
    """kernels.decode.decode_attention was the launcher's name, beside the entry point of the same
    name; it is _split_kv_attention now, the Triton twin of kvcache.split_kv_attention."""
    import attnbook.kernels.decode as decode

    with pytest.warns(DeprecationWarning, match="_split_kv_attention"):
        old = decode.decode_attention
    assert old is _split_kv_attention
    with pytest.warns(DeprecationWarning):
        from attnbook.kernels.decode import decode_attention as imported  # noqa: F401
    assert "decode_attention" not in decode.__all__
