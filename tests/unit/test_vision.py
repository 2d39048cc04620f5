"""attnbook.vision against references written out here: explicit patch extraction, formulas of SE and
CBAM, a loop-and-hand-computed attention rollout, and torch's conv2d for the attention-as-convolution."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnbook.vision import (
    CBAM,
    CaptionModel,
    ChannelAttention,
    PatchEmbedding,
    SpatialAttention,
    SqueezeExcitation,
    VisionTransformer,
    attention_rollout,
    conv_as_attention,
)
from attnbook.data import shapes_captions


# ---------------------------------------------------------------------------------------------
# Channel and spatial attention
# ---------------------------------------------------------------------------------------------
def test_squeeze_excitation_matches_its_formula(gen):
    se = SqueezeExcitation(32, reduction=8)
    x = torch.randn(3, 32, 5, 6, generator=gen)
    z = x.sum(dim=(2, 3)) / (5 * 6)  # squeeze: global average pool
    s = 1 / (1 + torch.exp(-(torch.clamp(z @ se.fc1.weight.T + se.fc1.bias, min=0) @ se.fc2.weight.T + se.fc2.bias)))
    expected = x * s[:, :, None, None]
    assert se.fc1.out_features == 4
    torch.testing.assert_close(se(x), expected)
    assert ((se.gate(x) > 0) & (se.gate(x) < 1)).all()


def test_squeeze_excitation_hidden_size_is_at_least_one():
    assert SqueezeExcitation(4, reduction=16).fc1.out_features == 1


def test_channel_attention_matches_its_formula(gen):
    ca = ChannelAttention(16, reduction=4)
    x = torch.randn(2, 16, 4, 4, generator=gen)
    lin1, lin2 = ca.mlp[0], ca.mlp[2]

    def mlp(z):
        return torch.clamp(z @ lin1.weight.T + lin1.bias, min=0) @ lin2.weight.T + lin2.bias

    avg = x.reshape(2, 16, -1).mean(-1)
    mx = x.reshape(2, 16, -1).max(-1).values
    expected = x * torch.sigmoid(mlp(avg) + mlp(mx))[:, :, None, None]
    torch.testing.assert_close(ca(x), expected)


def test_spatial_attention_matches_a_pixel_loop(gen):
    sa = SpatialAttention(kernel_size=3)
    x = torch.randn(2, 5, 4, 6, generator=gen)
    pooled = torch.stack([x.mean(1), x.max(1).values], dim=1)  # (B, 2, H, W)
    padded = F.pad(pooled, (1, 1, 1, 1))
    w = sa.conv.weight[0]  # (2, 3, 3)
    gate = torch.empty(2, 1, 4, 6)
    for i in range(4):
        for j in range(6):
            gate[:, 0, i, j] = torch.sigmoid((padded[:, :, i:i + 3, j:j + 3] * w).sum(dim=(1, 2, 3)))
    torch.testing.assert_close(sa.gate(x), gate)
    torch.testing.assert_close(sa(x), x * gate)


def test_spatial_attention_rejects_even_kernels():
    with pytest.raises(ValueError, match="kernel_size"):
        SpatialAttention(kernel_size=4)


def test_cbam_is_channel_then_spatial(gen):
    cbam = CBAM(8, reduction=2, kernel_size=5)
    x = torch.randn(2, 8, 7, 7, generator=gen)
    x1 = x * cbam.channel.gate(x)
    torch.testing.assert_close(cbam(x), x1 * cbam.spatial.gate(x1))


def test_gates_reject_wrong_channels(gen):
    with pytest.raises(ValueError, match="channels"):
        SqueezeExcitation(8)(torch.randn(1, 4, 3, 3, generator=gen))
    with pytest.raises(ValueError, match="4-D"):
        ChannelAttention(8)(torch.randn(8, 3, 3, generator=gen))


# ---------------------------------------------------------------------------------------------
# Patch embedding and the Vision Transformer
# ---------------------------------------------------------------------------------------------
def test_patch_embedding_equals_unfold_plus_linear(gen):
    pe = PatchEmbedding(img_size=12, patch_size=4, in_channels=3, dim=10)
    x = torch.randn(2, 3, 12, 12, generator=gen)
    patches = F.unfold(x, kernel_size=4, stride=4).transpose(1, 2)  # (B, 9, 3*4*4), row-major patches
    expected = patches @ pe.proj.weight.reshape(10, -1).T + pe.proj.bias
    out = pe(x)
    assert out.shape == (2, 9, 10) and pe.n_patches == 9
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_patch_embedding_is_row_major(gen):
    pe = PatchEmbedding(img_size=6, patch_size=2, in_channels=1, dim=4)
    x = torch.zeros(1, 1, 6, 6)
    x[0, 0, 2:4, 4:6] = torch.randn(2, 2, generator=gen)  # the patch in row 1, column 2
    out = pe(x)
    moved = (out - pe.proj.bias).abs().sum(-1)[0]
    assert moved.argmax().item() == 1 * 3 + 2 and (moved > 0).sum().item() == 1


def test_patch_embedding_rejects_bad_sizes(gen):
    with pytest.raises(ValueError, match="divisible"):
        PatchEmbedding(10, 4, 1, 8)
    with pytest.raises(ValueError, match="8 x 8"):
        PatchEmbedding(8, 2, 1, 8)(torch.randn(1, 1, 6, 6, generator=gen))


def test_vit_shapes_and_attention(gen):
    torch.manual_seed(0)
    vit = VisionTransformer(img_size=8, patch_size=2, in_channels=1, n_classes=10, dim=16, depth=3, n_heads=4).eval()
    x = torch.randn(5, 1, 8, 8, generator=gen)
    logits, attentions = vit(x, return_weights=True)
    assert logits.shape == (5, 10)
    assert len(attentions) == 3
    for a in attentions:
        assert a.shape == (5, 4, 17, 17)
        assert (a >= 0).all()
        torch.testing.assert_close(a.sum(-1), torch.ones(5, 4, 17))
    torch.testing.assert_close(vit(x), logits)


def test_vit_is_a_function_of_each_image_alone(gen):
    torch.manual_seed(0)
    vit = VisionTransformer(8, 4, 3, 5, dim=8, depth=2, n_heads=2).eval()
    x = torch.randn(4, 3, 8, 8, generator=gen)
    torch.testing.assert_close(vit(x)[1:2], vit(x[1:2]), atol=1e-5, rtol=1e-5)


def test_vit_learns_a_toy_task(gen):
    """Bright top half vs bright bottom half: a few steps of training separate the classes."""
    torch.manual_seed(0)
    vit = VisionTransformer(4, 2, 1, 2, dim=16, depth=1, n_heads=2)
    y = torch.randint(0, 2, (64,), generator=gen)
    x = 0.1 * torch.randn(64, 1, 4, 4, generator=gen)
    x[y == 0, :, :2] += 1.0
    x[y == 1, :, 2:] += 1.0
    opt = torch.optim.AdamW(vit.parameters(), lr=1e-2)
    for _ in range(40):
        loss = F.cross_entropy(vit(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert (vit(x).argmax(-1) == y).float().mean() == 1.0


# ---------------------------------------------------------------------------------------------
# Attention rollout
# ---------------------------------------------------------------------------------------------
def _random_attention(gen, *shape):
    return torch.softmax(torch.randn(*shape, generator=gen), dim=-1)


def test_rollout_by_hand_two_layers():
    a1 = torch.tensor([[0.5, 0.5], [0.0, 1.0]])[None, None]  # one head, two tokens
    a2 = torch.tensor([[1.0, 0.0], [0.5, 0.5]])[None, None]
    # 0.5 (A + I), rows already sum to 1
    r1 = torch.tensor([[0.75, 0.25], [0.0, 1.0]])
    r2 = torch.tensor([[1.0, 0.0], [0.25, 0.75]])
    expected = torch.tensor([[0.75, 0.25], [0.1875, 0.8125]])  # r2 @ r1 written out
    torch.testing.assert_close(r2 @ r1, expected)
    torch.testing.assert_close(attention_rollout([a1, a2])[0], expected)
    # without the residual: plain product a2 @ a1
    torch.testing.assert_close(attention_rollout([a1, a2], add_residual=False)[0],
                               torch.tensor([[0.5, 0.5], [0.25, 0.75]]))


def test_rollout_matches_a_loop_over_layers(gen):
    B, H, T, L = 2, 3, 5, 4
    layers = [_random_attention(gen, B, H, T, T) for _ in range(L)]
    expected = torch.empty(B, T, T)
    for b in range(B):
        r = torch.eye(T)
        for a in layers:
            m = sum(a[b, h] for h in range(H)) / H
            m = 0.5 * m + 0.5 * torch.eye(T)
            m = torch.stack([row / row.sum() for row in m])
            r = m @ r
        expected[b] = r
    out = attention_rollout(layers)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out.sum(-1), torch.ones(B, T))


def test_rollout_renormalizes_rows_that_do_not_sum_to_one(gen):
    a = _random_attention(gen, 1, 2, 4, 4) * 3.0  # rows sum to 3
    out = attention_rollout([a])
    m = 0.5 * (a.mean(1)[0] + torch.eye(4))
    torch.testing.assert_close(out[0], m / m.sum(-1, keepdim=True))


def test_rollout_rejects_mismatched_layers(gen):
    with pytest.raises(ValueError, match="layer 1"):
        attention_rollout([_random_attention(gen, 1, 2, 4, 4), _random_attention(gen, 1, 2, 5, 5)])
    with pytest.raises(ValueError, match="at least one"):
        attention_rollout([])


# ---------------------------------------------------------------------------------------------
# Self-attention with relative positions simulating a convolution
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("c_in, c_out, kh, kw, H, W", [(3, 4, 3, 3, 7, 6), (1, 2, 5, 3, 8, 8), (2, 1, 1, 1, 3, 4)])
def test_conv_as_attention_equals_conv2d(gen, c_in, c_out, kh, kw, H, W):
    weight = torch.randn(c_out, c_in, kh, kw, generator=gen)
    bias = torch.randn(c_out, generator=gen)
    x = torch.randn(2, c_in, H, W, generator=gen)
    layer = conv_as_attention(weight, bias)
    assert layer.n_heads == kh * kw
    out, weights = layer(x, return_weights=True)
    ph, pw = kh // 2, kw // 2
    interior = out[..., ph:H - ph, pw:W - pw]
    torch.testing.assert_close(interior, F.conv2d(x, weight, bias), atol=1e-5, rtol=1e-5)
    # zero padding = zero tokens around the image
    padded = layer(F.pad(x, (pw, pw, ph, ph)))[..., ph:H + ph, pw:W + pw]
    torch.testing.assert_close(padded, F.conv2d(x, weight, bias, padding=(ph, pw)), atol=1e-5, rtol=1e-5)
    # every head of an interior query puts (almost) all its weight on one pixel
    q = ph * W + pw  # the first interior pixel
    assert (weights[:, :, q].max(-1).values > 1 - 1e-6).all()


def test_conv_as_attention_in_double_precision_without_bias(gen):
    weight = torch.randn(2, 3, 3, 3, generator=gen, dtype=torch.float64)
    x = torch.randn(1, 3, 6, 6, generator=gen, dtype=torch.float64)
    layer = conv_as_attention(weight)
    assert layer.out_proj.weight.dtype == torch.float64
    torch.testing.assert_close(layer(x)[..., 1:-1, 1:-1], F.conv2d(x, weight), atol=1e-12, rtol=1e-12)


def test_conv_as_attention_heads_are_shifts(gen):
    """Head for tap (a, b) of a 3x3 kernel attends from pixel (i, j) to pixel (i + a - 1, j + b - 1)."""
    layer = conv_as_attention(torch.randn(1, 1, 3, 3, generator=gen))
    _, weights = layer(torch.randn(1, 1, 5, 5, generator=gen), return_weights=True)
    i, j = 2, 2
    for h in range(9):
        a, b = divmod(h, 3)
        assert weights[0, h, i * 5 + j].argmax().item() == (i + a - 1) * 5 + (j + b - 1)


def test_conv_as_attention_rejects_even_kernels(gen):
    with pytest.raises(ValueError, match="odd"):
        conv_as_attention(torch.randn(1, 1, 2, 3, generator=gen))


def test_relative_bias_depends_only_on_the_offset(gen):
    layer = conv_as_attention(torch.randn(1, 1, 3, 3, generator=gen))
    with torch.no_grad():
        layer.rel_bias.normal_(generator=gen)
    bias = layer.position_bias(4, 5)  # (heads, 20, 20)
    # pixel (1, 1) -> (2, 3) and pixel (2, 0) -> (3, 2) have the same offset (1, 2)
    torch.testing.assert_close(bias[:, 1 * 5 + 1, 2 * 5 + 3], bias[:, 2 * 5 + 0, 3 * 5 + 2])


# ---------------------------------------------------------------------------------------------
# Captioning model
# ---------------------------------------------------------------------------------------------
def test_caption_model_shapes_and_weights(gen):
    torch.manual_seed(0)
    images, captions, vocab, _ = shapes_captions(4, generator=gen)
    model = CaptionModel(len(vocab))
    logits, weights = model(images, captions[:, :-1])
    assert logits.shape == (4, captions.shape[1] - 1, len(vocab))
    assert weights.shape == (4, captions.shape[1] - 1, 36)
    torch.testing.assert_close(weights.sum(-1), torch.ones(4, captions.shape[1] - 1))
    tokens, gen_weights = model.generate(images, max_len=5)
    assert tokens.shape == (4, 5) and gen_weights.shape == (4, 5, 36)


def test_bad_sizes_and_inputs_raise_clear_errors():
    """Regression: reduction=0 and patch_size=0 used to raise ZeroDivisionError, and
    CaptionModel.encode took images of the wrong size until the position embedding
    failed to broadcast (RuntimeError)."""
    from attnbook import vision

    with pytest.raises(ValueError, match="SqueezeExcitation: reduction must be a positive integer, got 0"):
        vision.SqueezeExcitation(8, reduction=0)
    with pytest.raises(ValueError, match="CBAM: reduction must be a positive integer, got 0"):
        vision.CBAM(8, reduction=0)
    with pytest.raises(ValueError, match="PatchEmbedding: patch_size must be a positive integer, got 0"):
        vision.PatchEmbedding(8, 0, 3, 4)
    model = vision.CaptionModel(10, img_size=8, dim=8, attn_dim=4)
    with pytest.raises(ValueError, match=r"CaptionModel.encode: images must be 8 x 8 images, got shape \(2, 3, 12, 12\)"):
        model.encode(torch.randn(2, 3, 12, 12))
    with pytest.raises(ValueError, match=r"CaptionModel.forward: tokens holds token ids outside the vocabulary \[0, 10\)"):
        model(torch.randn(2, 3, 8, 8), torch.full((2, 3), 10))
    regions = model.encode(torch.randn(2, 3, 8, 8))
    with pytest.raises(ValueError, match="CaptionModel.step: token holds token ids outside"):
        model.step(regions, torch.tensor([0, 10]), torch.zeros(2, 8))
    tokens, weights = model.generate(torch.randn(2, 3, 8, 8), max_len=3)
    assert tokens.shape == (2, 3) and weights.shape == (2, 3, 4)
    assert vision._STEP_CHECKS == [True]  # generate turned the per-step checks back on
