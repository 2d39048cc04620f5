"""Plausible wrong answers to the exercises of the chapter on attention for images: each fails its
check with a message that points at the mistake."""

import math

import torch
import torch.nn.functional as F
from wrong_answers import Mistake, mistake_test


def _patchify_pixel_major(images, patch_size):  # each patch flattened (p, p, C) instead of (C, p, p)
    B, C, H, W = images.shape
    p = patch_size
    grid = images.reshape(B, C, H // p, p, W // p, p)
    return grid.permute(0, 2, 4, 3, 5, 1).reshape(B, (H // p) * (W // p), C * p * p)


def _patchify_column_major(images, patch_size):  # patches in column-major order
    B, C, H, W = images.shape
    p = patch_size
    grid = images.reshape(B, C, H // p, p, W // p, p)
    return grid.permute(0, 4, 2, 1, 3, 5).reshape(B, (H // p) * (W // p), C * p * p)


def _patchify_plain_reshape(images, patch_size):  # a reshape without the permute: not patches at all
    B, C, H, W = images.shape
    return images.reshape(B, (H // patch_size) * (W // patch_size), C * patch_size * patch_size)


def _rollout(attentions, residual=True, later_left=True, renormalize=True, average=True):
    result = None
    for a in attentions:
        a = a.mean(dim=1) if average else a.amax(dim=1)
        if residual:
            a = 0.5 * (a + torch.eye(a.shape[-1], dtype=a.dtype))
        if renormalize:
            a = a / a.sum(dim=-1, keepdim=True)
        result = a if result is None else (a @ result if later_left else result @ a)
    return result


def _gate(pooling="mean-max", padding=True, sigmoid=True):
    def spatial_gate(x, weight):
        mean, peak = x.mean(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)
        pooled = torch.cat([mean, peak] if pooling == "mean-max" else [peak, mean], dim=1)
        out = F.conv2d(pooled, weight, padding=weight.shape[-1] // 2 if padding else 0)
        return torch.sigmoid(out) if sigmoid else out
    return spatial_gate


def _peak(formula):
    def peak_for_error(n, tol, max_abs_x=1.0, w_norm=1.0):
        scale = 2 * max_abs_x * w_norm
        if formula == "no-zero-case":
            return math.log((n - 1) * (scale / tol - 1)) if n > 1 else 0.0
        if n == 1 or scale * (n - 1) / n <= tol:
            return 0.0
        if formula == "loose":  # drops the n - 1 in the denominator: e^pi >= scale (n - 1) / tol
            return math.log(scale * (n - 1) / tol)
        if formula == "no-factor-two":
            return math.log((n - 1) * (max_abs_x * w_norm / tol - 1))
        return math.log((n - 1) * (scale / tol - 1))
    return peak_for_error


MISTAKES = [
    Mistake("vision-patchify", "each patch flattened pixel-major (p, p, C)", _patchify_pixel_major,
            ("patches of a (2, 3, 8, 8) batch with patch_size=4", "flattened pixel-major", "channel-major (C, p, p)")),
    Mistake("vision-patchify", "patches in column-major order", _patchify_column_major,
            ("patch_size=2", "your patches run down the columns first", "row-major")),
    Mistake("vision-patchify", "a reshape without the permute", _patchify_plain_reshape,
            ("patch_size=2", "permute to B, H/p, W/p, C, p, p")),
    Mistake("vision-rollout", "no residual identity", lambda layers: _rollout(layers, residual=False),
            ("rollout of 1 layers of shape (1, 1, 2, 2)", "add the identity, halve")),
    Mistake("vision-rollout", "layers multiplied in the wrong order", lambda layers: _rollout(layers, later_left=False),
            ("rollout of 3 layers", "LATER layer on the left")),
    Mistake("vision-rollout", "heads fused by their maximum", lambda layers: _rollout(layers, average=False),
            ("rollout of", "average over heads")),
    Mistake("vision-spatial-gate", "max and mean stacked in the wrong order", _gate(pooling="max-mean"),
            ("8 channels, a 7 x 5 map, k = 3", "mean and the channel maximum (in that order")),
    Mistake("vision-spatial-gate", "no padding: the map shrinks", _gate(padding=False),
            ("k = 3", "padding=k // 2")),
    Mistake("vision-spatial-gate", "no sigmoid", _gate(sigmoid=False),
            ("one channel (mean = max), k = 1", "a sigmoid")),
    Mistake("vision-conv-heads", "the loose bound without n - 1 in the denominator", _peak("loose"),
            ("for n=2, tol=0.5", "keep the n - 1 in the denominator")),
    Mistake("vision-conv-heads", "the factor two forgotten", _peak("no-factor-two"),
            ("for n=1024, tol=1e-06", "the smallest pi >= 0 with the bound <= tol is")),
    Mistake("vision-conv-heads", "pi = 0 never returned", _peak("no-zero-case"),
            ("for n=64, tol=2.0", "raised ValueError", "pi = 0 already meets it")),
]

test_wrong_answers = mistake_test(MISTAKES)
