"""Tests for attnbook.generation: generation is its own module, TinyGPT.generate hands its call
to it, the fused projections follow the model, and the mode of a call is restored."""

from __future__ import annotations

import pytest
import torch

from attnbook import generation
from attnbook.generation import _fused_projections, generate, generating
from attnbook.models import Attention, TinyGPT, TransformerConfig


def _gpt(**kw):
    torch.manual_seed(0)
    model = TinyGPT(TransformerConfig(vocab_size=16, d_model=16, n_heads=2, n_layers=2, **kw))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)  # sharper logits: greedy ties are impossible
    return model


@pytest.mark.parametrize("positional", ["rope", "learned", "alibi"])
def test_generate_is_tinygpts_generate_and_cached_equals_uncached(positional):
    model, idx = _gpt(positional=positional), torch.tensor([[1, 2, 3], [4, 5, 6]])
    cached = generate(model, idx, 6)
    assert torch.equal(cached, model.generate(idx, 6))
    assert torch.equal(cached, generate(model, idx, 6, use_cache=False))
    assert torch.equal(cached[:, :3], idx) and cached.shape == (2, 9)


def test_generate_samples_with_the_callers_generator():
    model, idx = _gpt(), torch.tensor([[1, 2, 3]])
    draws = [generate(model, idx, 8, temperature=1.0, top_k=4, generator=torch.Generator().manual_seed(0))
             for _ in range(2)]
    assert torch.equal(*draws)
    assert torch.equal(generate(model, idx, 8, temperature=1.0, top_k=4, generator=torch.Generator().manual_seed(0)),
                       generate(model, idx, 8, use_cache=False, temperature=1.0, top_k=4,
                                generator=torch.Generator().manual_seed(0)))


def test_generation_never_imports_the_models():
    """The models hand generate to this module; it reads the model's attributes instead."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(generation))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "models" not in imported and "serving" not in imported


def test_generating_sets_eval_mode_and_restores_every_submodules_mode():
    model = _gpt(dropout=0.1).train()
    model.blocks[0].eval()
    with generating(model):
        assert not any(m.training for m in model.modules()) and model._ids_trusted
    assert model.training and not model.blocks[0].training and model.blocks[1].training
    assert not model._ids_trusted


def test_the_fused_projections_follow_the_model_to_another_device():
    """generate keeps its stacked q/k/v weights between calls; after the model moved (a
    generate on the CPU, then model.cuda(): the GPU check's failure) they must be rebuilt
    on the new device, not copied into the old one. The meta device stands in for a GPU."""
    model = TinyGPT(TransformerConfig(vocab_size=16, d_model=16, n_heads=2, n_layers=1))
    attn = next(m for m in model.modules() if isinstance(m, Attention))
    with _fused_projections(model):
        assert attn._qkv[0].device.type == "cpu"
    model.to("meta")
    with _fused_projections(model):
        assert attn._qkv[0].device.type == "meta"
    assert attn._qkv is None  # removed at the end of the call: the class default again
