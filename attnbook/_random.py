"""Random draws from the caller's generator, wherever the tensors live.

Every random function of the package takes ``generator=``. A chapter seeds one on the
CPU (``torch.Generator().manual_seed(0)``) and may run its model on a GPU, where
``torch.multinomial`` and ``torch.rand`` refuse a generator of another device. Here
the numbers are drawn on the generator's device and moved to the tensors': a CPU
generator gives the same draws on every machine, and a CUDA generator costs no copy.
"""

from __future__ import annotations

import torch


def _elsewhere(generator: torch.Generator | None, device) -> bool:
    if generator is None or device is None:  # torch's own default device
        return False
    return generator.device.type != torch.device(device).type


def uniform(shape, *, generator, device, dtype=None) -> torch.Tensor:
    """``torch.rand(shape)`` on ``device``, drawn from ``generator``."""
    if _elsewhere(generator, device):
        at = generator.device
        return torch.rand(shape, generator=generator, dtype=dtype, device=at).to(device)
    return torch.rand(shape, generator=generator, dtype=dtype, device=device)


def multinomial(probs: torch.Tensor, num_samples: int, *, generator) -> torch.Tensor:
    """``torch.multinomial(probs, num_samples)`` drawn from ``generator``, on
    ``probs``' device."""
    if _elsewhere(generator, probs.device):
        here = probs.to(generator.device)
        draw = torch.multinomial(here, num_samples, generator=generator)
        return draw.to(probs.device)
    return torch.multinomial(probs, num_samples, generator=generator)
