"""Bad-input rows for attnbook.vision (see tests/properties/test_bad_input.py)."""

import torch
from test_bad_input import Bad, Edge

from attnbook import vision as V

NAN = float("nan")
_IMG = torch.randn(2, 8, 5, 5)
_RGB = torch.randn(2, 3, 8, 8)
_ATT = torch.softmax(torch.randn(2, 2, 5, 5), dim=-1)


def _vit():
    torch.manual_seed(0)
    return V.VisionTransformer(8, 4, 3, 5, 8, 1, 2).eval()


def _cap():
    torch.manual_seed(0)
    return V.CaptionModel(10, img_size=8, dim=8, attn_dim=4).eval()


def _step(token=None, h=None, regions=None):
    model = _cap()
    regions = model.encode(_RGB) if regions is None else regions
    h = torch.zeros(2, 8) if h is None else h
    token = torch.zeros(2, dtype=torch.long) if token is None else token
    return model.step(regions, token, h)


ROWS = [
    # channel and spatial gates
    Bad("SqueezeExcitation", "zero", lambda: V.SqueezeExcitation(8, reduction=0), ("SqueezeExcitation", "reduction")),
    Bad("SqueezeExcitation", "negative", lambda: V.SqueezeExcitation(-8), ("SqueezeExcitation", "channels")),
    Bad("SqueezeExcitation", "non-integer", lambda: V.SqueezeExcitation(8, 2.5), ("SqueezeExcitation", "reduction")),
    Bad("SqueezeExcitation", "boolean", lambda: V.SqueezeExcitation(True), ("SqueezeExcitation", "channels")),
    Bad("SqueezeExcitation", "integer-dtype", lambda: V.SqueezeExcitation(8)(_IMG.long()),
        ("SqueezeExcitation", "x", "floating")),
    Bad("SqueezeExcitation", "wrong-shape", lambda: V.SqueezeExcitation(8)(_IMG[:, :4]),
        ("SqueezeExcitation", "x", "8 channels")),
    Edge("SqueezeExcitation", "empty", lambda: V.SqueezeExcitation(8)(_IMG[:0]), lambda y: y.shape == (0, 8, 5, 5)),
    Bad("ChannelAttention", "zero", lambda: V.ChannelAttention(8, reduction=0), ("ChannelAttention", "reduction")),
    Bad("ChannelAttention", "non-integer", lambda: V.ChannelAttention(8.0), ("ChannelAttention", "channels")),
    Bad("ChannelAttention", "wrong-shape", lambda: V.ChannelAttention(8)(_IMG[0]), ("ChannelAttention", "x", "4-D")),
    Bad("SpatialAttention", "zero", lambda: V.SpatialAttention(0), ("SpatialAttention", "kernel_size")),
    Bad("SpatialAttention", "out-of-range", lambda: V.SpatialAttention(4), ("SpatialAttention", "kernel_size", "odd")),
    Bad("SpatialAttention", "non-integer", lambda: V.SpatialAttention(2.5), ("SpatialAttention", "kernel_size")),
    Bad("SpatialAttention", "integer-dtype", lambda: V.SpatialAttention()(_IMG.int()), ("SpatialAttention", "x")),
    Bad("CBAM", "zero", lambda: V.CBAM(8, reduction=0), ("CBAM", "reduction")),
    Bad("CBAM", "negative", lambda: V.CBAM(8, kernel_size=-3), ("CBAM", "kernel_size")),
    Bad("CBAM", "out-of-range", lambda: V.CBAM(8, kernel_size=4), ("CBAM", "kernel_size", "odd")),
    Bad("CBAM", "wrong-shape", lambda: V.CBAM(8, 2)(_IMG[:, :3]), ("CBAM", "x", "8 channels")),
    # the Vision Transformer
    Bad("PatchEmbedding", "zero", lambda: V.PatchEmbedding(8, 0, 3, 4), ("PatchEmbedding", "patch_size")),
    Bad("PatchEmbedding", "negative", lambda: V.PatchEmbedding(8, -2, 3, 4), ("PatchEmbedding", "patch_size")),
    Bad("PatchEmbedding", "non-integer", lambda: V.PatchEmbedding(8, 2.5, 3, 4), ("PatchEmbedding", "patch_size")),
    Bad("PatchEmbedding", "out-of-range", lambda: V.PatchEmbedding(8, 3, 3, 4),
        ("PatchEmbedding", "patch_size", "divisible")),
    Bad("PatchEmbedding", "zero", lambda: V.PatchEmbedding(8, 4, 3, 0), ("PatchEmbedding", "dim")),
    Bad("PatchEmbedding", "wrong-shape", lambda: V.PatchEmbedding(8, 4, 3, 4)(_RGB[..., :4]),
        ("PatchEmbedding", "x", "8 x 8")),
    Bad("PatchEmbedding", "integer-dtype", lambda: V.PatchEmbedding(8, 4, 3, 4)(_RGB.long()), ("PatchEmbedding", "x")),
    Bad("VisionTransformer", "zero", lambda: V.VisionTransformer(8, 0, 3, 5, 8, 1, 2), ("VisionTransformer", "patch_size")),
    Bad("VisionTransformer", "zero", lambda: V.VisionTransformer(8, 4, 3, 5, 8, 0, 2), ("VisionTransformer", "depth")),
    Bad("VisionTransformer", "out-of-range", lambda: V.VisionTransformer(8, 4, 3, 5, 8, 1, 3),
        ("VisionTransformer", "n_heads", "divisible")),
    Bad("VisionTransformer", "nan", lambda: V.VisionTransformer(8, 4, 3, 5, 8, 1, 2, dropout=NAN),
        ("VisionTransformer", "dropout")),
    Bad("VisionTransformer", "out-of-range", lambda: V.VisionTransformer(8, 4, 3, 5, 8, 1, 2, dropout=1.0),
        ("VisionTransformer", "dropout")),
    Bad("VisionTransformer", "non-integer", lambda: V.VisionTransformer(8, 4, 3, 5, 8, 1, 2, mlp_ratio=1.5),
        ("VisionTransformer", "mlp_ratio")),
    Bad("VisionTransformer", "wrong-shape", lambda: _vit()(_RGB[:, :2]), ("VisionTransformer.forward", "x")),
    Bad("VisionTransformer", "integer-dtype", lambda: _vit()(_RGB.long()), ("VisionTransformer.forward", "x")),
    Bad("VisionTransformer", "wrong-type", lambda: _vit()(_RGB, return_weights="yes"),
        ("VisionTransformer.forward", "return_weights")),
    Edge("VisionTransformer", "empty", lambda: _vit()(_RGB[:0]), lambda y: y.shape == (0, 5)),
    # rollout
    Bad("attention_rollout", "empty", lambda: V.attention_rollout([]), ("attention_rollout", "attentions")),
    Bad("attention_rollout", "wrong-shape", lambda: V.attention_rollout([_ATT, _ATT[..., :4]]),
        ("attention_rollout", "attentions", "layer 1")),
    Bad("attention_rollout", "integer-dtype", lambda: V.attention_rollout([_ATT.long()]),
        ("attention_rollout", "attentions")),
    Bad("attention_rollout", "wrong-type", lambda: V.attention_rollout([_ATT], add_residual="no"),
        ("attention_rollout", "add_residual")),
    # relative self-attention and convolution
    Bad("RelativeSelfAttention2d", "zero", lambda: V.RelativeSelfAttention2d(3, 4, 0, 2, 1),
        ("RelativeSelfAttention2d", "n_heads")),
    Bad("RelativeSelfAttention2d", "negative", lambda: V.RelativeSelfAttention2d(3, 4, 2, 2, -1),
        ("RelativeSelfAttention2d", "max_offset")),
    Bad("RelativeSelfAttention2d", "non-integer", lambda: V.RelativeSelfAttention2d(3, 4, 2, 2.5, 1),
        ("RelativeSelfAttention2d", "head_dim")),
    Bad("RelativeSelfAttention2d", "wrong-shape", lambda: V.RelativeSelfAttention2d(3, 4, 2, 2, 1)(_IMG),
        ("RelativeSelfAttention2d", "x", "3 channels")),
    Bad("RelativeSelfAttention2d", "integer-dtype", lambda: V.RelativeSelfAttention2d(3, 4, 2, 2, 1)(_RGB.long()),
        ("RelativeSelfAttention2d", "x")),
    Bad("RelativeSelfAttention2d", "negative", lambda: V.RelativeSelfAttention2d(3, 4, 2, 2, 1).position_bias(-1, 2),
        ("RelativeSelfAttention2d.position_bias", "height")),
    Bad("RelativeSelfAttention2d", "non-integer",
        lambda: V.RelativeSelfAttention2d(3, 4, 2, 2, 1).position_bias(2, 2.5),
        ("RelativeSelfAttention2d.position_bias", "width")),
    Bad("conv_as_attention", "wrong-shape", lambda: V.conv_as_attention(torch.randn(4, 3, 2, 3)),
        ("conv_as_attention", "weight", "odd")),
    Bad("conv_as_attention", "integer-dtype", lambda: V.conv_as_attention(torch.ones(4, 3, 3, 3, dtype=torch.long)),
        ("conv_as_attention", "weight")),
    Bad("conv_as_attention", "wrong-shape", lambda: V.conv_as_attention(torch.randn(4, 3, 3, 3), torch.randn(3)),
        ("conv_as_attention", "bias", "(4,)")),
    Bad("conv_as_attention", "nan", lambda: V.conv_as_attention(torch.randn(4, 3, 3, 3), peak=NAN),
        ("conv_as_attention", "peak")),
    Bad("conv_as_attention", "empty", lambda: V.conv_as_attention(torch.randn(0, 3, 3, 3)),
        ("conv_as_attention", "weight")),
    # captioning
    Bad("CaptionModel", "zero", lambda: V.CaptionModel(0), ("CaptionModel", "vocab_size")),
    Bad("CaptionModel", "out-of-range", lambda: V.CaptionModel(10, img_size=10), ("CaptionModel", "img_size")),
    Bad("CaptionModel", "non-integer", lambda: V.CaptionModel(10, dim=2.5), ("CaptionModel", "dim")),
    Bad("CaptionModel", "wrong-shape", lambda: _cap().encode(torch.randn(2, 3, 12, 12)),
        ("CaptionModel.encode", "images", "8 x 8")),
    Bad("CaptionModel", "wrong-shape", lambda: _cap().encode(torch.randn(2, 1, 8, 8)),
        ("CaptionModel.encode", "images", "3 channels")),
    Bad("CaptionModel", "integer-dtype", lambda: _cap().encode(_RGB.long()), ("CaptionModel.encode", "images")),
    Bad("CaptionModel", "out-of-range", lambda: _cap()(_RGB, torch.full((2, 3), 10)),
        ("CaptionModel.forward", "tokens", "[0, 10)")),
    Bad("CaptionModel", "out-of-range", lambda: _cap()(_RGB, torch.full((2, 3), -1)),
        ("CaptionModel.forward", "tokens", "[0, 10)")),
    Bad("CaptionModel", "wrong-dtype", lambda: _cap()(_RGB, torch.ones(2, 3)), ("CaptionModel.forward", "tokens", "int64")),
    Bad("CaptionModel", "wrong-shape", lambda: _cap()(_RGB, torch.ones(3, 3, dtype=torch.long)),
        ("CaptionModel.forward", "tokens")),
    Bad("CaptionModel", "empty", lambda: _cap()(_RGB, torch.ones(2, 0, dtype=torch.long)),
        ("CaptionModel.forward", "tokens", "T >= 1")),
    Bad("CaptionModel", "out-of-range", lambda: _step(token=torch.tensor([0, 10])), ("CaptionModel.step", "token")),
    Bad("CaptionModel", "wrong-shape", lambda: _step(h=torch.zeros(2, 5)), ("CaptionModel.step", "h")),
    Bad("CaptionModel", "wrong-shape", lambda: _step(regions=torch.zeros(2, 4, 5)), ("CaptionModel.step", "regions")),
    Bad("CaptionModel", "zero", lambda: _cap().generate(_RGB, max_len=0), ("CaptionModel.generate", "max_len")),
    Bad("CaptionModel", "non-integer", lambda: _cap().generate(_RGB, max_len=2.5), ("CaptionModel.generate", "max_len")),
    Bad("CaptionModel", "out-of-range", lambda: _cap().generate(_RGB, max_len=2, bos=10),
        ("CaptionModel.generate", "bos")),
    Bad("CaptionModel", "wrong-shape", lambda: _cap().generate(_RGB[:, :, :4], max_len=2),
        ("CaptionModel.generate", "images")),
    Edge("CaptionModel", "empty", lambda: _cap().generate(_RGB[:0], max_len=2),
         lambda r: r[0].shape == (0, 2) and r[1].shape == (0, 2, 4)),
]  # fmt: skip

EXEMPT: dict[str, str] = {}
