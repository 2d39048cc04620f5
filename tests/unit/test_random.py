"""attnbook._random: draws from the caller's generator on its own device, moved to the tensors'.

On a GPU a chapter's CPU generator met CUDA logits (the Transformer chapter's samples stopped:
"Expected a 'cuda' device type for generator but found 'cpu'"). There is no second device here,
so the cross-device branch is driven with the meta device (uniform) and by treating the CPU as
another device (multinomial); the draws must be the ones the generator alone gives."""

from __future__ import annotations

import torch

from attnbook import _random


def test_the_same_device_draws_are_torchs():
    probs = torch.softmax(torch.randn(4, 7, generator=torch.Generator().manual_seed(1)), -1)
    a = _random.multinomial(probs, 3, generator=torch.Generator().manual_seed(0))
    b = torch.multinomial(probs, 3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a, b)
    u = _random.uniform((2, 5), generator=torch.Generator().manual_seed(0), device="cpu")
    assert torch.equal(u, torch.rand(2, 5, generator=torch.Generator().manual_seed(0)))
    assert _random.uniform((3,), generator=None, device="cpu").shape == (3,)


def test_a_generator_of_another_device_draws_there_and_moves_the_result():
    u = _random.uniform((2, 5), generator=torch.Generator().manual_seed(0), device="meta",
                        dtype=torch.float64)  # fmt: skip
    assert u.device.type == "meta" and u.shape == (2, 5) and u.dtype == torch.float64


def test_multinomial_across_devices_draws_the_generators_numbers(monkeypatch):
    monkeypatch.setattr(_random, "_elsewhere", lambda generator, device: True)
    probs = torch.softmax(torch.randn(4, 7, generator=torch.Generator().manual_seed(1)), -1)
    a = _random.multinomial(probs, 2, generator=torch.Generator().manual_seed(3))
    b = torch.multinomial(probs, 2, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.device == probs.device
