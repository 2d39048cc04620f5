"""Attention for images: channel and spatial gates, the Vision Transformer, rollout,
convolution as attention, and "show, attend and tell" captioning.

Papers: Hu, Shen & Sun (2018) for Squeeze-and-Excitation; Woo et al. (2018) for CBAM's
channel and spatial attention; Dosovitskiy et al. (2021) for the Vision Transformer
(ViT); Abnar & Zuidema (2020) for attention rollout; Cordonnier, Loukas & Jaggi (2020)
for multi-head self-attention with relative positions expressing any convolution; Xu et
al. (2015) for attention in image captioning.

Images are ``(batch, channels, height, width)``. Token sequences are ``(batch, tokens,
dim)`` and patches are numbered row-major (left to right, then top to bottom), like
reading a page.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from .contract import check_flag, check_float, check_int, check_real, check_sizes
from .core import (
    MultiHeadAttention,
    additive_score,
    masked_softmax,
    scaled_dot_product_attention,
)

__all__ = [
    "SqueezeExcitation",
    "ChannelAttention",
    "SpatialAttention",
    "CBAM",
    "PatchEmbedding",
    "VisionTransformer",
    "attention_rollout",
    "RelativeSelfAttention2d",
    "conv_as_attention",
    "CaptionModel",
]


def _check_image(
    fn: str, name: str, x: torch.Tensor, channels: int | None = None, size=None
) -> None:
    """``x`` a floating ``(B, channels, size, size)`` image batch (``channels`` and
    ``size`` fixed when given)."""
    check_float(fn, name, x)
    if x.dim() != 4:
        raise ValueError(
            f"{fn}: {name} must be a 4-D tensor (batch, channels, height, width), got "
            f"{tuple(x.shape)}"
        )
    if channels is not None and x.shape[1] != channels:
        raise ValueError(
            f"{fn}: {name} must have {channels} channels (dim 1), got shape "
            f"{tuple(x.shape)}"
        )
    if size is not None and x.shape[-2:] != (size, size):
        raise ValueError(
            f"{fn}: {name} must be {size} x {size} images, got shape {tuple(x.shape)}"
        )


def _check_gate_sizes(fn: str, channels=1, reduction=1, kernel_size=1) -> None:
    """The sizes of the channel and spatial gates: positive, ``kernel_size`` odd."""
    check_sizes(fn, channels=channels, reduction=reduction, kernel_size=kernel_size)
    if kernel_size % 2 != 1:
        raise ValueError(
            f"{fn}: kernel_size must be odd to keep the feature map's size, got "
            f"{kernel_size}"
        )


# --------------------------------------------------------------------------------------
# Channel attention: which feature maps matter ("what")
# --------------------------------------------------------------------------------------
class SqueezeExcitation(nn.Module):
    r"""Squeeze-and-Excitation block (Hu et al., 2018): one weight in (0, 1) per
    channel.

    .. math::

        z = \frac{1}{HW}\sum_{h,w} X_{:,h,w}, \quad s = \sigma(W_2\,\mathrm{ReLU}(W_1
        z)), \quad Y = s \odot X

    ``W_1``: ``(C/r, C)`` squeezes to ``C // reduction`` (at least 1) hidden units,
    ``W_2``: ``(C, C/r)``. Input and output ``(B, C, H, W)``; :meth:`gate` returns ``s``
    as ``(B, C, 1, 1)``.
    """

    def __init__(self, channels: int, reduction: int = 16):
        super().__init__()
        _check_gate_sizes("SqueezeExcitation", channels, reduction)
        hidden = max(1, channels // reduction)
        self.fc1 = nn.Linear(channels, hidden)
        self.fc2 = nn.Linear(hidden, channels)
        self.channels = channels

    def gate(self, x: torch.Tensor) -> torch.Tensor:
        """The channel weights ``s = sigmoid(W2 relu(W1 mean_hw(x)))``, shape ``(B, C,
        1, 1)``."""
        _check_image("SqueezeExcitation", "x", x, self.channels)
        z = x.mean(dim=(2, 3))  # squeeze: (B, C)
        return torch.sigmoid(self.fc2(F.relu(self.fc1(z))))[:, :, None, None]  # excite

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(x)


class ChannelAttention(nn.Module):
    r"""CBAM's channel attention (Woo et al., 2018): SE with average *and* max pooling
    through one MLP.

    .. math::

        M_c = \sigma(\mathrm{MLP}(\mathrm{AvgPool}(X)) +
        \mathrm{MLP}(\mathrm{MaxPool}(X))), \quad Y = M_c \odot X

    with ``MLP(z) = W_2 ReLU(W_1 z)`` shared by both pooled descriptors. Shapes as
    :class:`SqueezeExcitation`.
    """

    def __init__(self, channels: int, reduction: int = 16):
        super().__init__()
        _check_gate_sizes("ChannelAttention", channels, reduction)
        hidden = max(1, channels // reduction)
        self.mlp = nn.Sequential(
            nn.Linear(channels, hidden), nn.ReLU(), nn.Linear(hidden, channels)
        )
        self.channels = channels

    def gate(self, x: torch.Tensor) -> torch.Tensor:
        """The channel weights ``M_c``, shape ``(B, C, 1, 1)``."""
        _check_image("ChannelAttention", "x", x, self.channels)
        return torch.sigmoid(
            self.mlp(x.mean(dim=(2, 3))) + self.mlp(x.amax(dim=(2, 3)))
        )[:, :, None, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(x)


# --------------------------------------------------------------------------------------
# Spatial attention: which positions matter ("where")
# --------------------------------------------------------------------------------------
class SpatialAttention(nn.Module):
    r"""CBAM's spatial attention (Woo et al., 2018): one weight in (0, 1) per pixel.

    .. math::

        M_s = \sigma\big(f^{k\times k}([\mathrm{mean}_c X;\ \max_c X])\big), \quad Y =
        M_s \odot X

    ``f`` is a bias-free ``k x k`` convolution from the 2 pooled maps to 1, padded to
    keep ``H x W``. Input and output ``(B, C, H, W)``; :meth:`gate` returns ``M_s`` as
    ``(B, 1, H, W)``.
    """

    def __init__(self, kernel_size: int = 7):
        super().__init__()
        _check_gate_sizes("SpatialAttention", kernel_size=kernel_size)
        self.conv = nn.Conv2d(2, 1, kernel_size, padding=kernel_size // 2, bias=False)

    def gate(self, x: torch.Tensor) -> torch.Tensor:
        """The spatial weights ``M_s``, shape ``(B, 1, H, W)``."""
        _check_image("SpatialAttention", "x", x)
        # (B, 2, H, W)
        pooled = torch.cat(
            [x.mean(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)], dim=1
        )
        return torch.sigmoid(self.conv(pooled))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(x)


class CBAM(nn.Module):
    """Convolutional Block Attention Module (Woo et al., 2018): channel attention, then
    spatial attention.

    ``Y = M_s(X') * X'`` with ``X' = M_c(X) * X``. Input and output ``(B, C, H, W)``.
    """

    def __init__(self, channels: int, reduction: int = 16, kernel_size: int = 7):
        super().__init__()
        _check_gate_sizes("CBAM", channels, reduction, kernel_size)
        self.channel = ChannelAttention(channels, reduction)
        self.spatial = SpatialAttention(kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_image("CBAM", "x", x, self.channel.channels)
        return self.spatial(self.channel(x))


# --------------------------------------------------------------------------------------
# The Vision Transformer
# --------------------------------------------------------------------------------------
def _check_patches(fn: str, img_size, patch_size, in_channels, dim) -> None:
    check_sizes(fn, img_size=img_size, patch_size=patch_size, in_channels=in_channels)
    check_sizes(fn, dim=dim)
    if img_size % patch_size:
        raise ValueError(
            f"{fn}: img_size={img_size} must be divisible by patch_size={patch_size}"
        )


class PatchEmbedding(nn.Module):
    """Cut an image into non-overlapping ``p x p`` patches and project each to ``dim``
    (Dosovitskiy et al., 2021).

    A convolution with kernel = stride = ``p`` is exactly "flatten each patch
    (channel-major, ``C * p * p`` numbers) and apply one shared linear layer": its
    weight ``(dim, C, p, p)`` reshaped to ``(dim, C*p*p)`` is that layer's matrix. Input
    ``(B, C, H, W)`` with ``H = W = img_size``; output ``(B, N, dim)`` with ``N =
    (img_size // p) ** 2`` patches in row-major order.
    """

    def __init__(self, img_size: int, patch_size: int, in_channels: int, dim: int):
        super().__init__()
        _check_patches("PatchEmbedding", img_size, patch_size, in_channels, dim)
        self.img_size, self.patch_size, self.in_channels = (
            img_size,
            patch_size,
            in_channels,
        )
        self.grid = img_size // patch_size  # patches per side
        self.n_patches = self.grid**2
        self.proj = nn.Conv2d(
            in_channels, dim, kernel_size=patch_size, stride=patch_size
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_image("PatchEmbedding", "x", x, self.in_channels, self.img_size)
        # (B, dim, g, g) -> (B, g*g, dim), row-major
        return self.proj(x).flatten(2).transpose(1, 2)


class _EncoderBlock(nn.Module):
    """Pre-norm Transformer encoder block: ``x + MHA(LN(x))``, then ``x +
    MLP(LN(x))``."""

    def __init__(self, dim: int, n_heads: int, mlp_ratio: int, dropout: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = MultiHeadAttention(dim, n_heads, dropout=dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_ratio * dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_ratio * dim, dim),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        attended, weights = self.attn(self.norm1(x), return_weights=True)
        x = x + attended
        return x + self.mlp(self.norm2(x)), weights


def _check_vit_input(x, patch_embed, return_weights) -> None:
    fn = "VisionTransformer.forward"
    pe = patch_embed
    _check_image(fn, "x", x, pe.in_channels, pe.img_size)
    check_flag(fn, "return_weights", return_weights)


def _check_vit(img_size, patch_size, in_channels, n_classes, dim, depth, n_heads):
    fn = "VisionTransformer"
    _check_patches(fn, img_size, patch_size, in_channels, dim)
    check_sizes(fn, n_classes=n_classes, depth=depth, n_heads=n_heads)
    if dim % n_heads:
        raise ValueError(f"{fn}: dim={dim} must be divisible by n_heads={n_heads}")


def _check_vit_options(mlp_ratio, dropout) -> None:
    check_sizes("VisionTransformer", mlp_ratio=mlp_ratio)
    if check_real("VisionTransformer", "dropout", dropout, minimum=0) >= 1:
        raise ValueError(
            f"VisionTransformer: dropout must be in [0, 1), got {dropout!r}"
        )


class VisionTransformer(nn.Module):
    """ViT (Dosovitskiy et al., 2021): patch tokens plus a learned [CLS] token, learned
    positions, pre-norm encoder blocks, and a linear classifier on the final [CLS]
    token.

    ``tokens = [cls; PatchEmbedding(x)] + pos`` of shape ``(B, 1 + N, dim)``; token 0 is
    [CLS], token ``1 + r * grid + c`` is the patch in row ``r``, column ``c``.
    ``forward(x)`` returns logits ``(B, n_classes)``; with ``return_weights=True`` it
    returns ``(logits, attentions)``, a list of ``depth`` tensors ``(B, n_heads, 1 + N,
    1 + N)`` (each row sums to 1).
    """

    def __init__(
        self,
        img_size: int,
        patch_size: int,
        in_channels: int,
        n_classes: int,
        dim: int,
        depth: int,
        n_heads: int,
        *,
        mlp_ratio: int = 2,
        dropout: float = 0.0,
    ):
        super().__init__()
        _check_vit(img_size, patch_size, in_channels, n_classes, dim, depth, n_heads)
        _check_vit_options(mlp_ratio, dropout)
        self.patch_embed = PatchEmbedding(img_size, patch_size, in_channels, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(
            0.02 * torch.randn(1, 1 + self.patch_embed.n_patches, dim)
        )
        self.blocks = nn.ModuleList(
            _EncoderBlock(dim, n_heads, mlp_ratio, dropout) for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, n_classes)

    def forward(self, x: torch.Tensor, *, return_weights: bool = False):
        _check_vit_input(x, self.patch_embed, return_weights)
        patches = self.patch_embed(x)
        cls = self.cls_token.expand(patches.shape[0], -1, -1)
        tokens = torch.cat([cls, patches], dim=1) + self.pos_embed
        attentions = []
        for block in self.blocks:
            tokens, weights = block(tokens)
            attentions.append(weights)
        logits = self.head(self.norm(tokens[:, 0]))
        return (logits, attentions) if return_weights else logits


def _check_rollout(attentions: list, add_residual) -> torch.Size:
    fn = "attention_rollout"
    if not attentions:
        raise ValueError(f"{fn}: attentions must hold at least one layer's weights")
    for layer, a in enumerate(attentions):
        check_float(fn, f"attentions[{layer}]", a)
    shape = attentions[0].shape
    for layer, a in enumerate(attentions):
        if a.dim() != 4 or a.shape != shape or a.shape[-1] != a.shape[-2]:
            raise ValueError(
                f"{fn}: every layer's attentions must have the same shape (B, heads, "
                f"T, T); layer {layer} has {tuple(a.shape)}, layer 0 has "
                f"{tuple(shape)}"
            )
    check_flag(fn, "add_residual", add_residual)
    return shape


def attention_rollout(attentions, *, add_residual: bool = True) -> torch.Tensor:
    r"""Attention rollout (Abnar & Zuidema, 2020): how much each output token draws on
    each input token.

    Per layer, average the heads and (``add_residual``) account for the skip connection:

    .. math:: \hat A_\ell = \mathrm{rownorm}\big(\tfrac12 (\bar A_\ell + I)\big), \qquad
              \tilde A = \hat A_L \hat A_{L-1} \cdots \hat A_1 ,

    where ``rownorm`` divides each row by its sum. ``attentions``: a sequence of
    per-layer weights ``(B, heads, T, T)``, first layer first. Returns ``(B, T, T)``
    with rows summing to 1; row 0 of a ViT's rollout is what the [CLS] token sees of the
    input patches.
    """
    attentions = list(attentions)
    shape = _check_rollout(attentions, add_residual)
    eye = torch.eye(shape[-1], dtype=attentions[0].dtype, device=attentions[0].device)
    rollout = None
    for a in attentions:
        a = a.mean(dim=1)  # (B, T, T)
        if add_residual:
            a = 0.5 * (a + eye)
            a = a / a.sum(dim=-1, keepdim=True)
        rollout = a if rollout is None else a @ rollout
    return rollout


# --------------------------------------------------------------------------------------
# Self-attention with relative positions can be a convolution (Cordonnier et al., 2020)
# --------------------------------------------------------------------------------------
def _check_relative(in_channels, out_channels, n_heads, head_dim, max_offset):
    fn = "RelativeSelfAttention2d"
    check_sizes(fn, in_channels=in_channels, out_channels=out_channels)
    check_sizes(fn, n_heads=n_heads, head_dim=head_dim)
    check_int(fn, "max_offset", max_offset, minimum=0)


class RelativeSelfAttention2d(nn.Module):
    r"""Multi-head self-attention over the pixels of a feature map with a learned 2-D
    relative position bias.

    Every pixel is a token. Head ``h`` scores query pixel ``i`` against key pixel ``j``
    by content plus a bias that depends only on their offset ``(dy, dx) = pos_j -
    pos_i``:

    .. math::

        e^h_{ij} = \frac{(W^h_q x_i)\cdot(W^h_k x_j)}{\sqrt{d}} + b^h[\mathrm{clip}(dy),
        \mathrm{clip}(dx)],

    with offsets clipped to ``[-max_offset, max_offset]`` (farther pixels share the edge
    entry, as in Shaw et al., 2018). Heads are concatenated and mixed by ``out_proj``.
    Input ``(B, C_in, H, W)``, output ``(B, out_channels, H, W)``;
    ``return_weights=True`` also returns ``(B, heads, HW, HW)``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        n_heads: int,
        head_dim: int,
        max_offset: int,
    ):
        super().__init__()
        _check_relative(in_channels, out_channels, n_heads, head_dim, max_offset)
        self.in_channels, self.n_heads, self.head_dim, self.max_offset = (
            in_channels,
            n_heads,
            head_dim,
            max_offset,
        )
        self.q_proj = nn.Linear(in_channels, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(in_channels, n_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(in_channels, n_heads * head_dim, bias=False)
        self.out_proj = nn.Linear(n_heads * head_dim, out_channels)
        self.rel_bias = nn.Parameter(
            torch.zeros(n_heads, 2 * max_offset + 1, 2 * max_offset + 1)
        )

    def position_bias(self, height: int, width: int) -> torch.Tensor:
        """The additive bias ``b^h[dy_ij, dx_ij]`` of every head for an ``H x W`` map:
        ``(heads, HW, HW)``."""
        check_int("RelativeSelfAttention2d.position_bias", "height", height, minimum=0)
        check_int("RelativeSelfAttention2d.position_bias", "width", width, minimum=0)
        ys, xs = torch.meshgrid(
            torch.arange(height), torch.arange(width), indexing="ij"
        )
        ys, xs = ys.flatten(), xs.flatten()  # row-major pixel coordinates
        m = self.max_offset
        # key minus query, as a table index
        dy = (ys[None, :] - ys[:, None]).clamp(-m, m) + m
        dx = (xs[None, :] - xs[:, None]).clamp(-m, m) + m
        return self.rel_bias[
            :, dy.to(self.rel_bias.device), dx.to(self.rel_bias.device)
        ]

    def forward(self, x: torch.Tensor, *, return_weights: bool = False):
        _check_image("RelativeSelfAttention2d", "x", x, self.in_channels)
        check_flag("RelativeSelfAttention2d", "return_weights", return_weights)
        B, _, H, W = x.shape
        tokens = x.flatten(2).transpose(1, 2)  # (B, HW, C_in)

        def split(t: torch.Tensor) -> torch.Tensor:
            # (B, heads, HW, d)
            return t.view(B, H * W, self.n_heads, self.head_dim).transpose(1, 2)

        q, k, v = (
            split(self.q_proj(tokens)),
            split(self.k_proj(tokens)),
            split(self.v_proj(tokens)),
        )
        out, weights = scaled_dot_product_attention(
            q, k, v, attn_mask=self.position_bias(H, W).to(q.dtype), return_weights=True
        )
        out = self.out_proj(
            out.transpose(1, 2).reshape(B, H * W, self.n_heads * self.head_dim)
        )
        out = out.transpose(1, 2).reshape(B, -1, H, W)
        return (out, weights) if return_weights else out


def _check_conv_weight(weight, bias, peak) -> None:
    fn = "conv_as_attention"
    check_float(fn, "weight", weight)
    if weight.dim() != 4 or weight.shape[-2] % 2 != 1 or weight.shape[-1] % 2 != 1:
        raise ValueError(
            f"{fn}: weight must be (C_out, C_in, k_h, k_w) with odd k_h, k_w, got "
            f"{tuple(weight.shape)}"
        )
    if 0 in weight.shape:
        raise ValueError(f"{fn}: weight must not be empty, got {tuple(weight.shape)}")
    if bias is not None:
        check_float(fn, "bias", bias)
        if bias.shape != weight.shape[:1]:
            raise ValueError(
                f"{fn}: bias must have shape (C_out,) = ({weight.shape[0]},), got "
                f"{tuple(bias.shape)}"
            )
    check_real(fn, "peak", peak, above=0)


@torch.no_grad()
def conv_as_attention(
    weight: torch.Tensor, bias: torch.Tensor | None = None, *, peak: float = 50.0
) -> RelativeSelfAttention2d:
    r"""A :class:`RelativeSelfAttention2d` layer that computes the convolution
    ``F.conv2d(x, weight, bias)``.

    The construction (Cordonnier et al., 2020) uses one head per kernel offset ``(a,
    b)``, ``K = k_h k_w`` heads of size ``C_in``:

    * ``W_q = W_k = 0``: no content scores, only the position bias;
    * ``b^h[dy, dx] = peak`` at the head's offset ``(dy, dx) = (a - k_h//2, b -
      k_w//2)``, 0 elsewhere, so the softmax puts weight ``e^{peak} / (e^{peak} + n - 1)
      \approx 1`` on the pixel at that offset;
    * ``W_v^h = I``: the head returns that pixel's ``C_in`` channels unchanged;
    * ``out_proj`` maps head ``h``'s channel ``c`` to output ``o`` with ``weight[o, c,
      a, b]``, and adds ``bias``.

    Each head shifts the image by one offset and ``out_proj`` sums the shifted copies
    with the kernel's weights: exactly a (cross-correlation) convolution. ``weight``:
    ``(C_out, C_in, k_h, k_w)`` with odd ``k_h, k_w``. Pixels whose offset falls outside
    the image have nothing to attend to there, so the output equals ``F.conv2d(x,
    weight, bias)`` on the interior (``H - k_h + 1`` by ``W - k_w + 1``); to get
    ``padding="same"`` zero-pad the input first (the zeros become tokens). The
    off-peak weights are ``e^{-peak}`` each: a large ``peak`` makes the equality exact
    in floating point.
    """
    _check_conv_weight(weight, bias, peak)
    c_out, c_in, kh, kw = weight.shape
    n_heads = kh * kw
    # one beyond the kernel, so the clipped far pixels never share the peak
    max_offset = max(kh, kw) // 2 + 1
    layer = RelativeSelfAttention2d(c_in, c_out, n_heads, c_in, max_offset).to(
        device=weight.device, dtype=weight.dtype
    )
    layer.q_proj.weight.zero_()
    layer.k_proj.weight.zero_()
    layer.v_proj.weight.copy_(
        torch.eye(c_in, dtype=weight.dtype, device=weight.device).repeat(n_heads, 1)
    )
    layer.rel_bias.zero_()
    for h in range(n_heads):
        # head h handles kernel tap (a, b), row-major like the heads' order
        a, b = divmod(h, kw)
        layer.rel_bias[h, a - kh // 2 + max_offset, b - kw // 2 + max_offset] = peak
    # out_proj input feature h * C_in + c is head h's channel c: weight (C_out, C_in,
    # kh, kw) -> (C_out, kh*kw*C_in)
    layer.out_proj.weight.copy_(
        weight.permute(0, 2, 3, 1).reshape(c_out, n_heads * c_in)
    )
    layer.out_proj.bias.copy_(
        bias if bias is not None else torch.zeros_like(weight[:, 0, 0, 0])
    )
    return layer


# --------------------------------------------------------------------------------------
# Image captioning: where the decoder looks (Xu et al., 2015)
# --------------------------------------------------------------------------------------
def _check_caption_sizes(vocab_size, img_size, dim, attn_dim) -> None:
    fn = "CaptionModel"
    check_sizes(fn, vocab_size=vocab_size, img_size=img_size, dim=dim)
    check_sizes(fn, attn_dim=attn_dim)
    if img_size % 4:
        raise ValueError(f"{fn}: img_size must be divisible by 4, got {img_size}")


def _check_tokens(fn: str, name: str, tokens, shape: tuple, vocab_size: int) -> None:
    """``tokens`` int64 ids in ``[0, vocab_size)`` of shape ``shape`` (``None``
    entries free, a count of 0 refused)."""
    if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.long:
        raise TypeError(
            f"{fn}: {name} must be an int64 tensor of token ids, got "
            f"{getattr(tokens, 'dtype', type(tokens).__name__)}"
        )
    if tokens.dim() != len(shape) or any(
        (n == 0) if want is None else (n != want)
        for n, want in zip(tokens.shape, shape)
    ):
        want = tuple("T >= 1" if w is None else w for w in shape)
        raise ValueError(
            f"{fn}: {name} must have shape {want}, got {tuple(tokens.shape)}"
        )
    # one reduction and one read: step checks its token at every decoding step
    low, high = torch.stack(tokens.aminmax()).tolist() if tokens.numel() else (0, 0)
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"{fn}: {name} holds token ids outside the vocabulary [0, {vocab_size}): "
            f"min {int(low)}, max {int(high)}"
        )


_STEP_CHECKS = [True]  # False inside forward and generate, which check once


@contextlib.contextmanager
def _inputs_checked():
    _STEP_CHECKS.append(False)
    try:
        yield
    finally:
        _STEP_CHECKS.pop()


def _check_forward(model, images, tokens) -> None:
    fn = "CaptionModel.forward"
    _check_image(fn, "images", images, 3, model.img_size)
    vocab_size = model.embed.num_embeddings
    _check_tokens(fn, "tokens", tokens, (len(images), None), vocab_size)


def _check_step(model, regions, token, h) -> None:
    if not _STEP_CHECKS[-1]:
        return
    fn = "CaptionModel.step"
    dim = model.init_h.in_features
    for name, t in (("regions", regions), ("h", h)):
        check_float(fn, name, t)
    if regions.dim() != 3 or regions.shape[-1] != dim or h.shape != (len(regions), dim):
        raise ValueError(
            f"{fn}: regions must have shape (B, R, dim={dim}) and h (B, dim), got "
            f"regions {tuple(regions.shape)} and h {tuple(h.shape)}"
        )
    _check_tokens(fn, "token", token, (len(regions),), model.embed.num_embeddings)


def _check_generate(model, images, max_len, bos) -> None:
    fn = "CaptionModel.generate"
    vocab_size = model.embed.num_embeddings
    _check_image(fn, "images", images, 3, model.img_size)
    check_sizes(fn, max_len=max_len)
    if not 0 <= check_int(fn, "bos", bos, minimum=0) < vocab_size:
        raise ValueError(f"{fn}: bos must be in [0, {vocab_size}), got {bos}")


class CaptionModel(nn.Module):
    r"""A small "show, attend and tell" captioner (Xu et al., 2015): CNN encoder, GRU
    decoder with additive attention.

    The encoder turns an image ``(B, 3, H, W)`` into a grid of ``R = (H/4) (W/4)``
    region features ``a_r`` (two conv + pool stages, plus a learned position embedding
    so regions know where they are). At step ``t`` the decoder state ``h_{t-1}`` is the
    query of Bahdanau attention over the regions:

    .. math:: e_{tr} = v^\top \tanh(W_h h_{t-1} + W_a a_r), \quad \alpha_t =
              \mathrm{softmax}(e_t), \quad z_t = \textstyle\sum_r \alpha_{tr} a_r ,

    then ``h_t = GRU([E y_{t-1}; z_t], h_{t-1})`` and the next word's logits are ``W_o
    [h_t; z_t]``. ``forward(images, tokens)`` (teacher forcing) returns logits ``(B, T,
    vocab)`` and weights ``(B, T, R)``; :meth:`generate` decodes greedily.
    """

    def __init__(
        self, vocab_size: int, img_size: int = 24, dim: int = 64, attn_dim: int = 32
    ):
        super().__init__()
        _check_caption_sizes(vocab_size, img_size, dim, attn_dim)
        self.img_size = img_size
        self.grid = img_size // 4
        self.encoder = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, dim, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.region_pos = nn.Parameter(0.1 * torch.randn(1, self.grid * self.grid, dim))
        self.embed = nn.Embedding(vocab_size, dim)
        self.init_h = nn.Linear(dim, dim)
        self.W_h = nn.Linear(dim, attn_dim, bias=False)
        self.W_a = nn.Linear(dim, attn_dim, bias=False)
        self.v = nn.Parameter(torch.randn(attn_dim) / math.sqrt(attn_dim))
        self.cell = nn.GRUCell(2 * dim, dim)
        self.out = nn.Linear(2 * dim, vocab_size)

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Region features ``(B, R, dim)``, regions row-major over the ``grid x grid``
        feature map."""
        _check_image("CaptionModel.encode", "images", images, 3, self.img_size)
        return self.encoder(images).flatten(2).transpose(1, 2) + self.region_pos

    def step(self, regions: torch.Tensor, token: torch.Tensor, h: torch.Tensor):
        """One decoding step: ``(logits (B, vocab), new state (B, dim), weights (B,
        R))``."""
        _check_step(self, regions, token, h)
        # (B, 1, R)
        scores = additive_score(
            h[:, None, :], regions, self.W_h.weight, self.W_a.weight, self.v
        )
        alpha = masked_softmax(scores)
        context = (alpha @ regions)[:, 0]  # (B, dim)
        h = self.cell(torch.cat([self.embed(token), context], dim=-1), h)
        return self.out(torch.cat([h, context], dim=-1)), h, alpha[:, 0]

    def forward(self, images: torch.Tensor, tokens: torch.Tensor):
        """Teacher forcing: ``tokens`` ``(B, T)`` are the inputs; predict ``tokens``
        shifted by one outside."""
        _check_forward(self, images, tokens)
        regions = self.encode(images)
        h = torch.tanh(self.init_h(regions.mean(dim=1)))
        logits, weights = [], []
        with _inputs_checked():  # once above, not at every step
            for t in range(tokens.shape[1]):
                out, h, alpha = self.step(regions, tokens[:, t], h)
                logits.append(out)
                weights.append(alpha)
        return torch.stack(logits, dim=1), torch.stack(weights, dim=1)

    @torch.no_grad()
    def generate(self, images: torch.Tensor, *, max_len: int, bos: int = 0):
        """Greedy decoding from ``bos`` for ``max_len`` steps: tokens ``(B, max_len)``,
        weights ``(B, max_len, R)``."""
        _check_generate(self, images, max_len, bos)
        regions = self.encode(images)
        h = torch.tanh(self.init_h(regions.mean(dim=1)))
        token = torch.full(
            (images.shape[0],), bos, dtype=torch.long, device=images.device
        )
        tokens, weights = [], []
        with _inputs_checked():  # once above, not at every step
            for _ in range(max_len):
                out, h, alpha = self.step(regions, token, h)
                token = out.argmax(dim=-1)
                tokens.append(token)
                weights.append(alpha)
        return torch.stack(tokens, dim=1), torch.stack(weights, dim=1)
