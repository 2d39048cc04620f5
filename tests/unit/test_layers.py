"""Tests for attnbook.layers: the multi-head shell against the layout written out, RMSNorm
against PyTorch's, and the bad-input rows of the shared layers, the cache protocol and generation."""

from __future__ import annotations


import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnbook.core import MultiHeadAttention
from attnbook.layers import HeadShell, RMSNorm, merge_heads, scale_heads, split_heads


@given(B=st.integers(0, 3), T=st.integers(1, 5), heads=st.integers(1, 4), d=st.integers(1, 4))
def test_split_heads_is_the_view_written_out_and_merge_heads_its_inverse(B, T, heads, d):
    x = torch.randn(B, T, heads * d, generator=torch.Generator().manual_seed(0))
    split = split_heads(x, heads)
    assert split.shape == (B, heads, T, d)
    for h in range(heads):
        torch.testing.assert_close(split[:, h], x[..., h * d : (h + 1) * d], rtol=0, atol=0)
    torch.testing.assert_close(merge_heads(split), x, rtol=0, atol=0)


def test_scale_heads_scales_each_head_and_none_is_the_identity():
    x = torch.ones(2, 3, 4, 5)
    assert scale_heads(x, None) is x
    out = scale_heads(x, torch.tensor([1.0, 0.0, 2.0]))
    assert out[:, 1].abs().sum() == 0 and (out[:, 2] == 2).all() and (out[:, 0] == 1).all()
    per_row = scale_heads(x, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert per_row[1].abs().sum() == 0 and (per_row[0] == 1).all()


def test_the_shell_around_attention_is_torchs_multi_head_attention():
    """MultiHeadAttention is HeadShell.project, attention, HeadShell.merge: equal to
    torch.nn.MultiheadAttention with the same weights (an independent implementation)."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 4).double()
    assert isinstance(layer, HeadShell)
    ref = torch.nn.MultiheadAttention(16, 4, batch_first=True).double()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight]))
        ref.in_proj_bias.copy_(torch.cat([layer.q_proj.bias, layer.k_proj.bias, layer.v_proj.bias]))
        ref.out_proj.weight.copy_(layer.out_proj.weight)
        ref.out_proj.bias.copy_(layer.out_proj.bias)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    c = torch.randn(2, 3, 16, dtype=torch.float64)
    torch.testing.assert_close(layer(x, c), ref(x, c, c, need_weights=False)[0])


def test_the_shell_splits_grouped_heads_and_masks_heads_before_the_output_projection():
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 4, 2).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    c = torch.randn(2, 3, 16, dtype=torch.float64)
    q, k, v = layer.project(x, c)
    assert q.shape == (2, 4, 5, 4) and k.shape == v.shape == (2, 2, 3, 4)
    by_hand = (c @ layer.k_proj.weight.T + layer.k_proj.bias).view(2, 3, 2, 4).transpose(1, 2)
    torch.testing.assert_close(k, by_hand)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(layer.merge(out), layer(x, c))
    head_mask = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    no_head_1 = out.clone()
    no_head_1[:, 1] = 0
    torch.testing.assert_close(layer.merge(out, head_mask), layer.merge(no_head_1))
    concatenated = out.transpose(1, 2).reshape(2, 5, 16)  # heads side by side, then W^O
    torch.testing.assert_close(layer.merge(out), layer.out_proj(concatenated))


@pytest.mark.parametrize("eps", [None, 1e-5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rms_norm_equals_torchs(eps, dtype):
    x = torch.randn(3, 5, 8, dtype=dtype, generator=torch.Generator().manual_seed(0))
    ours, theirs = RMSNorm(8, eps).to(dtype), torch.nn.RMSNorm(8, eps).to(dtype)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        theirs.weight.copy_(ours.weight)
    torch.testing.assert_close(ours(x), theirs(x))


def test_models_rms_norm_is_the_same_class():
    from attnbook import models

    assert models.RMSNorm is RMSNorm and "RMSNorm" in models.__all__
