"""A small, readable training loop for the chapters that train a model, and a token
accuracy.

One step is the textbook recipe: ``loss = loss_fn(model, batch)``, ``loss.backward()``,
optionally clip the gradient norm, ``optimizer.step()``, ``optimizer.zero_grad()``.
Gradient-norm clipping (Pascanu et al., 2013) rescales the whole gradient ``g`` to ``g *
c / ||g||`` when ``||g|| > c``. A tqdm progress bar shows the running mean loss of the
epoch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping

import torch
from tqdm.auto import tqdm

from .contract import check_flag, check_float, check_int, check_real

__all__ = ["History", "fit", "warmup_cosine", "block_gradient_norms", "accuracy"]


@dataclass
class History:
    """What :func:`fit` records.

    ``losses``: the training loss of every optimizer step; ``grad_norms``: the
    gradient's L2 norm at every step, before clipping; ``metrics``: one dict per epoch
    from ``eval_fn`` (empty without it).
    """

    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    metrics: list[dict[str, float]] = field(default_factory=list)


def _to_device(batch, device: torch.device):
    """Move the tensors in a batch (a tensor, or tuples/lists/dicts of them) to
    ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {key: _to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to_device(value, device) for value in batch)
    return batch


def _check_fit(model, loss_fn, train_batches, epochs, lr, grad_clip, progress):
    fn = "fit"
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{fn}: model must be a torch.nn.Module, got {model!r:.60}")
    if not callable(loss_fn):
        raise TypeError(f"{fn}: loss_fn must be callable, got {loss_fn!r:.60}")
    check_int(fn, "epochs", epochs)
    check_real(fn, "lr", lr, above=0)
    if grad_clip is not None:
        check_real(fn, "grad_clip (positive or None)", grad_clip, above=0)
    check_flag(fn, "progress", progress)
    if not callable(train_batches) and not hasattr(train_batches, "__iter__"):
        raise TypeError(
            f"{fn}: train_batches must be an iterable of batches or a callable "
            f"returning one, got {train_batches!r:.60}"
        )
    if (
        not callable(train_batches)
        and epochs > 1
        and iter(train_batches) is train_batches
    ):
        raise ValueError(
            f"{fn}: train_batches is a one-shot iterator; pass a list or a callable "
            "returning batches per epoch"
        )


def fit(
    model: torch.nn.Module,
    loss_fn: Callable[[torch.nn.Module, object], torch.Tensor],
    train_batches: Iterable | Callable[[], Iterable],
    *,
    epochs: int = 1,
    lr: float = 1e-3,
    optimizer: torch.optim.Optimizer | None = None,
    eval_fn: Callable[[torch.nn.Module], Mapping[str, float] | float] | None = None,
    device: str | torch.device | None = None,
    progress: bool = True,
    grad_clip: float | None = None,
    lr_schedule: Callable[[int], float] | None = None,
) -> History:
    """Train ``model`` for ``epochs`` passes over ``train_batches`` and return the
    :class:`History`.

    - ``loss_fn(model, batch)`` returns a scalar loss tensor;
    - ``train_batches`` is a re-iterable (a list, a ``DataLoader``) or a callable
      returning a fresh iterable each epoch (e.g. a function that samples new random
      batches);
    - ``optimizer`` defaults to ``AdamW(model.parameters(), lr=lr)`` (``lr`` is ignored
      when one is given);
    - ``eval_fn(model)`` runs after each epoch in eval mode without gradients and
      returns a dict of metrics (or one number, recorded as ``{"eval": value}``);
    - ``device``: move the model there; ``None`` keeps the model where it is. Batches
      follow the model;
    - ``grad_clip``: the maximum gradient L2 norm (``None``: no clipping);
    - ``lr_schedule(step)``: the learning rate of optimizer step ``step`` (0, 1, ...),
      set on every parameter group before the step (e.g. :func:`warmup_cosine`);
    - ``progress=False`` prints nothing.
    """
    _check_fit(model, loss_fn, train_batches, epochs, lr, grad_clip, progress)
    if device is not None:
        model.to(device)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=lr)
    max_norm = float("inf") if grad_clip is None else float(grad_clip)
    history = History()

    for epoch in range(1, epochs + 1):
        batches = train_batches() if callable(train_batches) else train_batches
        total = len(batches) if hasattr(batches, "__len__") else None
        model.train()
        epoch_losses = []
        with tqdm(
            total=total, desc=f"epoch {epoch}/{epochs}", disable=not progress
        ) as bar:
            for batch in batches:
                loss = loss_fn(model, _to_device(batch, device))
                if loss.ndim != 0:
                    raise ValueError(
                        "fit: loss_fn must return a scalar, got shape "
                        f"{tuple(loss.shape)}"
                    )
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"loss is {loss.item()} at step {len(history.losses) + 1}; "
                        "try a smaller lr or grad_clip"
                    )
                loss.backward()
                # clip_grad_norm_ returns the norm before clipping; with max_norm=inf it
                # only measures it.
                history.grad_norms.append(
                    float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
                )
                if lr_schedule is not None:
                    for group in optimizer.param_groups:
                        group["lr"] = lr_schedule(len(history.losses))
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                history.losses.append(loss.item())
                epoch_losses.append(history.losses[-1])
                bar.set_postfix(
                    loss=f"{sum(epoch_losses) / len(epoch_losses):.4f}", refresh=False
                )
                bar.update()
            if not epoch_losses:
                raise ValueError(f"fit: train_batches gave no batches in epoch {epoch}")
            if eval_fn is not None:
                model.eval()
                with torch.no_grad():
                    result = eval_fn(model)
                model.train()
                metrics = (
                    dict(result) if isinstance(result, Mapping) else {"eval": result}
                )
                history.metrics.append(
                    {name: float(value) for name, value in metrics.items()}
                )
                bar.set_postfix(
                    loss=f"{sum(epoch_losses) / len(epoch_losses):.4f}",
                    **{
                        name: f"{value:.4f}"
                        for name, value in history.metrics[-1].items()
                    },
                )
    return history


def _check_warmup_cosine(step, warmup, total, lr, min_lr) -> None:
    fn = "warmup_cosine"
    check_int(fn, "step", step, minimum=0)
    check_real(fn, "lr", lr, minimum=0)
    check_real(fn, "min_lr", min_lr, minimum=0)
    if (
        not 0
        <= check_int(fn, "warmup", warmup, minimum=0)
        < check_int(fn, "total", total)
    ):
        raise ValueError(
            f"{fn}: need 0 <= warmup < total, got warmup={warmup}, total={total}"
        )


def warmup_cosine(
    step: int, *, warmup: int, total: int, lr: float, min_lr: float = 0.0
) -> float:
    """The learning rate of step ``step`` (from 0) under the usual transformer
    recipe: linear warm-up from ``lr / warmup`` to ``lr`` over the first ``warmup``
    steps, then a cosine decay to ``min_lr`` at step ``total`` (and ``min_lr`` after):

        ``lr_t = min_lr + (lr - min_lr) (1 + cos(pi p)) / 2``, ``p = (t - warmup) /
        (total - warmup)``.
    """
    _check_warmup_cosine(step, warmup, total, lr, min_lr)
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / (total - warmup))
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _check_block_gradient_norms(model, loss) -> list:
    fn = "block_gradient_norms"
    blocks = getattr(model, "blocks", None)
    if not isinstance(model, torch.nn.Module) or blocks is None:
        raise TypeError(
            f"{fn}: model must be a torch.nn.Module with a .blocks list, got "
            f"{type(model).__name__}"
        )
    if not isinstance(loss, torch.Tensor) or loss.ndim != 0 or not loss.requires_grad:
        raise ValueError(
            f"{fn}: loss must be a scalar tensor that requires grad, got {loss!r:.60}"
        )
    return list(blocks)


def block_gradient_norms(model: torch.nn.Module, loss: torch.Tensor) -> list[float]:
    """The L2 norm of the gradient of ``loss`` with respect to the parameters of each of
    ``model.blocks``, in order: where in the depth the gradient is large (Xiong et al.,
    2020, compare them at initialization for pre- and post-norm blocks). Leaves the
    parameters' ``.grad`` untouched."""
    blocks = _check_block_gradient_norms(model, loss)
    params = [[p for p in block.parameters() if p.requires_grad] for block in blocks]
    grads = torch.autograd.grad(
        loss, [p for group in params for p in group], retain_graph=True
    )
    norms, start = [], 0
    for group in params:
        chunk = grads[start : start + len(group)]
        norms.append(float(torch.sqrt(sum(g.pow(2).sum() for g in chunk))))
        start += len(group)
    return norms


def _check_accuracy(logits, targets, ignore_index) -> None:
    fn = "accuracy"
    check_float(fn, "logits", logits)
    if not isinstance(targets, torch.Tensor) or targets.dtype == torch.bool:
        raise TypeError(f"{fn}: targets must be an integer tensor, got {targets!r:.60}")
    if targets.is_floating_point() or targets.is_complex():
        raise TypeError(f"{fn}: targets must be an integer tensor, got {targets.dtype}")
    if logits.ndim < 1 or logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"{fn}: logits (..., classes) and targets (...) disagree: logits "
            f"{tuple(logits.shape)}, targets {tuple(targets.shape)}"
        )
    if ignore_index is not None:
        check_int(fn, "ignore_index", ignore_index, minimum=-(2**63))


def accuracy(
    logits: torch.Tensor, targets: torch.Tensor, *, ignore_index: int | None = None
) -> float:
    """Fraction of positions where ``argmax(logits, -1) == targets``.

    ``logits``: ``(..., classes)``; ``targets``: ``(...)`` class indices. Positions
    whose target equals ``ignore_index`` (e.g. padding) are left out of both the count
    and the total.
    """
    _check_accuracy(logits, targets, ignore_index)
    keep = (
        torch.ones_like(targets, dtype=torch.bool)
        if ignore_index is None
        else targets != ignore_index
    )
    if not keep.any():
        raise ValueError(
            "accuracy: targets has no position left to score (all equal "
            "ignore_index, or empty)"
        )
    correct = (logits.argmax(-1) == targets) & keep
    return correct.sum().item() / keep.sum().item()
