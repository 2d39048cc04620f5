"""The training loop and accuracy: a linear regression is learnt, clipping bounds the step's gradient."""

import pytest
import torch

from attnbook.train import History, accuracy, fit


def regression_data(n_batches=20, batch=32, seed=0):
    """Batches of ``(x, y)`` with ``y = x @ w + b`` plus a little noise, and the true ``w, b``."""
    g = torch.Generator().manual_seed(seed)
    w, b = torch.randn(3, 1, generator=g), torch.randn(1, generator=g)
    batches = []
    for _ in range(n_batches):
        x = torch.randn(batch, 3, generator=g)
        batches.append((x, x @ w + b + 0.01 * torch.randn(batch, 1, generator=g)))
    return batches, w, b


def mse(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


def test_fit_learns_linear_regression():
    torch.manual_seed(0)
    batches, w, b = regression_data()
    model = torch.nn.Linear(3, 1)
    history = fit(model, mse, batches, epochs=8, lr=0.05, progress=False)
    assert isinstance(history, History)
    assert len(history.losses) == len(history.grad_norms) == 8 * len(batches)
    first, last = sum(history.losses[:5]) / 5, sum(history.losses[-5:]) / 5
    assert last < first / 10
    torch.testing.assert_close(model.weight.detach(), w.T, atol=0.05, rtol=0)
    torch.testing.assert_close(model.bias.detach(), b, atol=0.05, rtol=0)


def test_callable_batches_are_drawn_fresh_each_epoch_and_eval_fn_records_metrics():
    calls = []

    def batches():
        calls.append(1)
        return regression_data(n_batches=3, seed=len(calls))[0]

    model = torch.nn.Linear(3, 1)
    history = fit(model, mse, batches, epochs=3, progress=False,
                  eval_fn=lambda m: {"weight_norm": m.weight.norm(), "training": m.training})
    assert len(calls) == 3 and len(history.losses) == 9
    assert [set(m) for m in history.metrics] == [{"weight_norm", "training"}] * 3
    assert all(m["training"] == 0.0 for m in history.metrics)  # eval_fn runs in eval mode
    assert model.training  # and training mode is restored afterwards
    plain = fit(model, mse, batches, progress=False, eval_fn=lambda m: 0.5)
    assert plain.metrics == [{"eval": 0.5}]


class RecordingSGD(torch.optim.SGD):
    """SGD that records the gradient norm it is asked to apply."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.norms = []

    def step(self, closure=None):
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        self.norms.append(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item())
        return super().step(closure)


@pytest.mark.parametrize("clip", [0.1, 1.0])
def test_grad_clip_bounds_the_applied_gradient_norm(clip):
    batches = [(x * 100, y * 100) for x, y in regression_data(n_batches=5)[0]]  # large gradients
    model = torch.nn.Linear(3, 1)
    optimizer = RecordingSGD(model.parameters(), lr=1e-6)
    history = fit(model, mse, batches, optimizer=optimizer, grad_clip=clip, progress=False)
    assert len(optimizer.norms) == 5
    assert max(optimizer.norms) <= clip * (1 + 1e-4)
    assert min(history.grad_norms) > clip  # the norms before clipping were larger: clipping was active
    for before, applied in zip(history.grad_norms, optimizer.norms):
        assert applied == pytest.approx(clip, rel=1e-4) if before > clip else applied == pytest.approx(before)


def test_without_clipping_the_recorded_norm_is_the_applied_norm():
    model = torch.nn.Linear(3, 1)
    optimizer = RecordingSGD(model.parameters(), lr=0.01)
    history = fit(model, mse, regression_data(n_batches=4)[0], optimizer=optimizer, progress=False)
    assert history.grad_norms == pytest.approx(optimizer.norms, rel=1e-5)


def test_progress_false_prints_nothing_and_true_shows_the_loss(capfd):
    batches = regression_data(n_batches=3)[0]
    fit(torch.nn.Linear(3, 1), mse, batches, progress=False)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    fit(torch.nn.Linear(3, 1), mse, batches, progress=True)
    out, err = capfd.readouterr()
    assert "epoch 1/1" in out + err and "loss=" in out + err


def test_invalid_arguments_raise_value_error():
    model, batches = torch.nn.Linear(3, 1), regression_data(n_batches=2)[0]
    with pytest.raises(ValueError, match="epochs"):
        fit(model, mse, batches, epochs=0, progress=False)
    with pytest.raises(ValueError, match="grad_clip"):
        fit(model, mse, batches, grad_clip=0.0, progress=False)
    with pytest.raises(ValueError, match="one-shot"):
        fit(model, mse, iter(batches), epochs=2, progress=False)
    with pytest.raises(ValueError, match="no batches"):
        fit(model, mse, [], progress=False)
    with pytest.raises(ValueError, match="scalar"):
        fit(model, lambda m, b: (m(b[0]) - b[1]) ** 2, batches, progress=False)


def test_non_finite_loss_stops_with_the_step_number():
    model, batches = torch.nn.Linear(3, 1), regression_data(n_batches=2)[0]
    with pytest.raises(FloatingPointError, match="step 1"):
        fit(model, lambda m, b: mse(m, b) * float("nan"), batches, progress=False)


def test_batches_follow_the_model_device():
    seen = []

    def loss_fn(model, batch):
        seen.append({t.device.type for t in batch["pair"]})
        return mse(model, batch["pair"])

    batches = [{"pair": pair} for pair in regression_data(n_batches=2)[0]]
    fit(torch.nn.Linear(3, 1), loss_fn, batches, device="cpu", progress=False)
    assert seen == [{"cpu"}, {"cpu"}]


def test_accuracy_matches_a_python_count():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 7, 5, generator=g)
    targets = torch.randint(0, 5, (4, 7), generator=g)
    targets[0, :3] = -100
    pred, flat = logits.argmax(-1).flatten().tolist(), targets.flatten().tolist()
    correct = sum(p == t for p, t in zip(pred, flat))
    assert accuracy(logits, targets) == pytest.approx(correct / len(flat))
    kept = [(p, t) for p, t in zip(pred, flat) if t != -100]
    assert accuracy(logits, targets, ignore_index=-100) == pytest.approx(sum(p == t for p, t in kept) / len(kept))
    assert accuracy(torch.eye(3), torch.arange(3)) == 1.0


def test_accuracy_rejects_mismatched_shapes_and_nothing_to_score():
    with pytest.raises(ValueError, match="logits"):
        accuracy(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="ignore_index"):
        accuracy(torch.zeros(2, 4), torch.full((2,), -1), ignore_index=-1)


def test_warmup_cosine_rises_linearly_then_decays_to_the_floor():
    import math

    from attnbook.train import warmup_cosine

    lrs = [warmup_cosine(t, warmup=10, total=110, lr=1.0, min_lr=0.1) for t in range(120)]
    assert lrs[:10] == pytest.approx([(t + 1) / 10 for t in range(10)])
    assert lrs[10] == pytest.approx(1.0) and lrs[60] == pytest.approx(0.55)
    assert lrs[110:] == pytest.approx([0.1] * 10)
    decay = lrs[10:111]
    assert all(a >= b for a, b in zip(decay, decay[1:]))
    assert lrs[35] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.25)))
    with pytest.raises(ValueError, match="warmup < total"):
        warmup_cosine(0, warmup=5, total=5, lr=1.0)


def test_fit_sets_the_scheduled_learning_rate_before_every_step():
    from attnbook.train import warmup_cosine

    model = torch.nn.Linear(2, 1)
    seen = []

    class Spy(torch.optim.SGD):
        def step(self, closure=None):
            seen.append(self.param_groups[0]["lr"])
            return super().step(closure)

    schedule = lambda t: warmup_cosine(t, warmup=2, total=6, lr=0.1)  # noqa: E731
    batches = [(torch.randn(4, 2), torch.randn(4, 1)) for _ in range(6)]
    fit(model, lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]), batches,
        optimizer=Spy(model.parameters(), lr=0.5), lr_schedule=schedule, progress=False)
    assert seen == pytest.approx([schedule(t) for t in range(6)])


def test_block_gradient_norms_equal_the_norms_of_each_blocks_gradient():
    from attnbook.models import TinyGPT, TransformerConfig
    from attnbook.train import block_gradient_norms

    model = TinyGPT(TransformerConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=3))
    idx = torch.randint(0, 11, (2, 7), generator=torch.Generator().manual_seed(0))
    loss = torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
    norms = block_gradient_norms(model, loss)
    loss.backward()
    for norm, block in zip(norms, model.blocks, strict=True):
        expected = torch.sqrt(sum(p.grad.pow(2).sum() for p in block.parameters()))
        assert norm == pytest.approx(expected.item(), rel=1e-6)
