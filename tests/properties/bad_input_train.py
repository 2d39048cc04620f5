"""Bad-input rows of attnbook.train (see tests/properties/test_bad_input.py)."""

from __future__ import annotations

import torch
from test_bad_input import Bad

from attnbook.train import accuracy, block_gradient_norms, fit, warmup_cosine

_NAN = float("nan")
_BATCHES = [torch.ones(2, 3)]


def _model():
    return torch.nn.Linear(3, 1)


def _loss(model, batch):
    return model(batch).pow(2).mean()


def _fit(**kw):
    return fit(_model(), kw.pop("loss_fn", _loss), kw.pop("batches", _BATCHES), progress=False, **kw)


class _Blocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _norms(loss_of):
    model = _Blocks()
    return block_gradient_norms(model, loss_of(model(torch.ones(1, 2))))


_LOGITS = torch.randn(2, 4, 5)
_TARGETS = torch.tensor([[0, 1, 2, 3], [4, 0, 1, 2]])

ROWS = [
    Bad("fit", "zero", lambda: _fit(epochs=0), ("fit", "epochs")),
    Bad("fit", "non-integer", lambda: _fit(epochs=1.5), ("fit", "epochs")),
    Bad("fit", "nan", lambda: _fit(lr=_NAN), ("fit", "lr")),
    Bad("fit", "negative", lambda: _fit(grad_clip=-1.0), ("fit", "grad_clip")),
    Bad("fit", "nan", lambda: _fit(grad_clip=_NAN), ("fit", "grad_clip")),
    Bad("fit", "empty", lambda: _fit(batches=[]), ("fit", "train_batches")),
    Bad("fit", "wrong-type", lambda: _fit(batches=iter(_BATCHES), epochs=2), ("fit", "train_batches")),
    Bad("fit", "wrong-type", lambda: _fit(loss_fn="mse"), ("fit", "loss_fn")),
    Bad("fit", "wrong-shape", lambda: _fit(loss_fn=lambda m, b: m(b)), ("fit", "loss_fn")),
    Bad("fit", "wrong-type", lambda: fit(None, _loss, _BATCHES), ("fit", "model")),
    Bad("warmup_cosine", "out-of-range", lambda: warmup_cosine(0, warmup=10, total=10, lr=1.0), ("warmup_cosine", "warmup")),
    Bad("warmup_cosine", "negative", lambda: warmup_cosine(-1, warmup=2, total=10, lr=1.0), ("warmup_cosine", "step")),
    Bad("warmup_cosine", "non-integer", lambda: warmup_cosine(1, warmup=2.5, total=10, lr=1.0),
        ("warmup_cosine", "warmup")),
    Bad("warmup_cosine", "nan", lambda: warmup_cosine(1, warmup=2, total=10, lr=_NAN), ("warmup_cosine", "lr")),
    Bad("warmup_cosine", "zero", lambda: warmup_cosine(1, warmup=0, total=0, lr=1.0), ("warmup_cosine", "total")),
    Bad("block_gradient_norms", "wrong-type", lambda: block_gradient_norms(_model(), torch.ones((), requires_grad=True)),
        ("block_gradient_norms", "model")),
    Bad("block_gradient_norms", "wrong-shape", lambda: _norms(lambda out: out), ("block_gradient_norms", "loss")),
    Bad("accuracy", "wrong-shape", lambda: accuracy(_LOGITS, _TARGETS[:, :3]), ("accuracy", "logits")),
    Bad("accuracy", "integer-dtype", lambda: accuracy(_LOGITS.long(), _TARGETS), ("accuracy", "logits")),
    Bad("accuracy", "wrong-dtype", lambda: accuracy(_LOGITS, _TARGETS.float()), ("accuracy", "targets")),
    Bad("accuracy", "boolean", lambda: accuracy(_LOGITS[..., :2], _TARGETS > 1), ("accuracy", "targets")),
    Bad("accuracy", "non-integer", lambda: accuracy(_LOGITS, _TARGETS, ignore_index=0.5), ("accuracy", "ignore_index")),
    Bad("accuracy", "empty", lambda: accuracy(_LOGITS[:0], _TARGETS[:0]), ("accuracy", "targets")),
]
EXEMPT = {"History": "a dataclass of results, filled in by fit"}
