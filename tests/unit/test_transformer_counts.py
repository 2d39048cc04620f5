"""The counting functions of :mod:`attnbook.transformer` against the models they count,
over every option of :class:`attnbook.models.TransformerConfig`.

``block_parameters`` and ``model_parameters`` must equal ``sum(p.numel())`` of the
:class:`~attnbook.models.Block` and :class:`~attnbook.models.TinyGPT` built from the
config, part by part; ``block_flops`` must equal what PyTorch's ``FlopCounterMode``
counts on a forward pass of that block (attention and MLP separately), and a whole
``TinyGPT``'s forward must count ``n_layers`` blocks plus the output head.

The strategy draws every field of the dataclass, and every value an enumerated field
allows (read from the config's own error message, so a value added to the config is
drawn without editing this file). A field added to the dataclass fails
``test_the_strategy_draws_every_field`` until the strategy draws it: that is how
``attention="mla"`` went uncounted (the counts applied the MHA formula to it).
"""

from __future__ import annotations

import ast
import dataclasses
import re

import pytest
import torch
from hypothesis import find, given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from attnbook import models, transformer
from attnbook.models import TransformerConfig

FIELDS = tuple(f.name for f in dataclasses.fields(TransformerConfig))


def _allowed(name: str) -> tuple[str, ...]:
    """The values ``TransformerConfig`` accepts for the enumerated field ``name``, read
    from the ``ValueError`` it raises for one it does not."""
    with pytest.raises(ValueError) as error:
        TransformerConfig(**{name: "not one of them"})
    found = re.search(rf"{name} must be one of (\(.*?\)), got", str(error.value))
    assert found, f"TransformerConfig's error on {name} lists no choices: {error.value}"
    return ast.literal_eval(found.group(1))


#: The enumerated fields (a ``str`` default) and every value each allows.
CHOICES = {
    f.name: _allowed(f.name)
    for f in dataclasses.fields(TransformerConfig)
    if isinstance(f.default, str)
}
OPTIONAL = st.none() | st.integers(1, 12)


@st.composite
def configs(draw, fixed: dict | None = None):
    """``(fields, seq_len, batch, is_causal)``: keyword arguments for every field of
    ``TransformerConfig`` (small sizes), drawn so that the config is valid, with the
    fields in ``fixed`` set to the given values."""
    fixed = fixed or {}

    def pick(name, strategy):
        return fixed[name] if name in fixed else draw(strategy)

    seq_len, batch = draw(st.integers(1, 6)), draw(st.integers(1, 3))
    if fixed.get("positional", "rope") != "rope":
        attention = pick("attention", st.just("mha"))  # MLA's positions are RoPE
    else:
        attention = pick("attention", st.sampled_from(CHOICES["attention"]))
    latent = attention == "mla"
    positional = "rope" if latent else pick(
        "positional", st.sampled_from(CHOICES["positional"])
    )
    n_heads = pick("n_heads", st.integers(1, 3))
    even = (positional == "rope" and not latent) or positional == "sinusoidal"
    head_dim = draw(st.sampled_from((2, 4) if even else (1, 2, 3, 4)))
    buckets = pick("t5_num_buckets", st.integers(2, 8))
    divisors = [k for k in range(1, n_heads + 1) if n_heads % k == 0]
    fields = dict(
        vocab_size=pick("vocab_size", st.integers(1, 12)),
        d_model=n_heads * head_dim,
        n_heads=n_heads,
        n_layers=pick("n_layers", st.integers(1, 3)),
        n_kv_heads=None if latent else pick(
            "n_kv_heads", st.none() | st.sampled_from(divisors)
        ),
        d_ff=pick("d_ff", OPTIONAL),
        max_len=pick("max_len", st.integers(seq_len, seq_len + 3)),
        positional=positional,
        dropout=pick("dropout", st.sampled_from((0.0, 0.25))),
        rope_base=pick("rope_base", st.floats(2.0, 1e5)),
        t5_num_buckets=buckets,
        t5_max_distance=pick("t5_max_distance", st.integers(buckets // 2 + 1, 20)),
        norm=pick("norm", st.sampled_from(CHOICES["norm"])),
        norm_position=pick("norm_position", st.sampled_from(CHOICES["norm_position"])),
        mlp=pick("mlp", st.sampled_from(CHOICES["mlp"])),
        tie_weights=pick("tie_weights", st.booleans()),
        init=pick("init", st.sampled_from(CHOICES["init"])),
        attention=attention,
        kv_latent_dim=pick("kv_latent_dim", OPTIONAL),
        q_latent_dim=pick("q_latent_dim", OPTIONAL),
        rope_dim=pick("rope_dim", st.sampled_from((2, 4, 6) if latent else (1, 2, 3))),
    )
    return fields, seq_len, batch, pick("is_causal", st.booleans())


def _numel(module: torch.nn.Module | None) -> int:
    if module is None:
        return 0
    return sum(p.numel() for p in module.parameters())  # a shared tensor counts once


def _flops(counter: FlopCounterMode, module: str) -> int:
    return sum(counter.get_flop_counts().get(module, {}).values())


def _check_counts(fields: dict, seq_len: int, batch: int, is_causal: bool) -> None:
    assert set(fields) == set(FIELDS), "the strategy must draw every field"
    config = TransformerConfig(**fields)
    torch.manual_seed(0)

    # one block: parameters and forward FLOPs, part by part
    block = models.Block(config, is_causal=is_causal)
    params = transformer.block_parameters(config)
    assert params["attention"] == _numel(block.attn)
    assert params["mlp"] == _numel(block.mlp)
    assert params["norms"] == _numel(block.ln1) + _numel(block.ln2)
    assert params["total"] == _numel(block) == params["attention"] + params["mlp"] + (
        params["norms"]
    )
    x = torch.randn(batch, seq_len, config.d_model)
    with FlopCounterMode(display=False) as counter:
        block(x)
    flops = transformer.block_flops(config, seq_len, batch)
    assert flops["attention"] == _flops(counter, "Block.attn")
    assert flops["mlp"] == _flops(counter, "Block.mlp")
    assert flops["total"] == counter.get_total_flops()
    assert flops["per_token"] == flops["total"] / (batch * seq_len)

    # the whole model: parameters part by part, and n_layers blocks plus the head
    model = models.TinyGPT(config)
    counted = transformer.model_parameters(config)
    positions = getattr(model, "pos_emb", None) or getattr(model, "rel_bias", None)
    assert counted["embedding"] == _numel(model.tok_emb) + _numel(positions)
    assert counted["blocks"] == _numel(model.blocks)
    assert counted["final_norm"] == _numel(model.ln_f)
    assert counted["head"] == (0 if config.tie_weights else model.head.weight.numel())
    assert counted["total"] == _numel(model)
    idx = torch.randint(0, config.vocab_size, (batch, seq_len))
    with FlopCounterMode(display=False) as counter:
        model(idx)
    for layer in range(config.n_layers):
        assert _flops(counter, f"TinyGPT.blocks.{layer}") == flops["total"]
    head = 2 * batch * seq_len * config.d_model * config.vocab_size
    assert counter.get_total_flops() == config.n_layers * flops["total"] + head


@settings(max_examples=50, deadline=None)
@given(drawn=configs())
def test_counts_equal_the_built_models_for_every_config(drawn):
    _check_counts(*drawn)


#: Every value of every enumerated field, each drawn at least once on every run.
EVERY_VALUE = [(name, value) for name, values in CHOICES.items() for value in values]


@pytest.mark.parametrize("name, value", EVERY_VALUE, ids=lambda v: str(v))
@settings(max_examples=2, deadline=None)
@given(data=st.data())
def test_counts_equal_the_built_models_for_every_value_of_every_option(
    name, value, data
):
    _check_counts(*data.draw(configs(fixed={name: value})))


def test_the_strategy_draws_every_field():
    """A field added to ``TransformerConfig`` fails here until ``configs`` draws it
    (and ``_check_counts`` then checks the counts under it); an enumerated field draws
    every value the config accepts."""
    fields, *_ = find(configs(), lambda drawn: True)
    assert set(fields) == set(FIELDS)
    assert {"positional", "norm", "norm_position", "mlp", "init", "attention"} <= set(
        CHOICES
    )
    assert set(CHOICES["attention"]) == set(models.ATTENTION_KINDS)
    assert set(CHOICES["positional"]) == set(models.POSITIONAL_SCHEMES)


@settings(max_examples=20, deadline=None)
@given(
    n_heads=st.integers(1, 8),
    head_dim=st.integers(1, 16),
    norm=st.sampled_from(CHOICES["norm"]),
)
def test_a_gelu_block_holds_about_12_d_squared(n_heads, head_dim, norm):
    """``block_parameters``' docstring: about ``12 d^2`` for the GELU block: ``4 d^2``
    in attention, ``8 d^2`` in the MLP, and ``O(d)`` biases and norm gains."""
    d = n_heads * head_dim
    config = TransformerConfig(
        d_model=d, n_heads=n_heads, norm=norm, positional="none"
    )
    counted = transformer.block_parameters(config)
    per_norm = 2 if norm == "layernorm" else 1
    assert counted["attention"] == 4 * d * d + 4 * d
    assert counted["mlp"] == 8 * d * d + 5 * d
    assert counted["total"] == 12 * d * d + (9 + 2 * per_norm) * d


@settings(max_examples=15, deadline=None)
@given(drawn=configs())
def test_a_training_step_costs_three_forwards(drawn):
    """``block_flops``' docstring: the backward computes two products per forward one
    (the gradients of both factors), so forward and backward cost ``3 total``."""
    fields, seq_len, batch, is_causal = drawn
    config = TransformerConfig(**fields)
    block = models.Block(config, is_causal=is_causal)
    x = torch.randn(batch, seq_len, config.d_model, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        block(x).sum().backward()
    assert counter.get_total_flops() == 3 * transformer.block_flops(
        config, seq_len, batch
    )["total"]


@pytest.mark.parametrize("attention", CHOICES["attention"])
def test_a_causal_mask_still_computes_every_score(attention):
    """``block_flops``' docstring: the count holds for a causal block and a
    bidirectional one alike."""
    config = TransformerConfig(d_model=16, n_heads=2, attention=attention)
    x = torch.randn(2, 7, 16)
    counts = []
    for is_causal in (True, False):
        with FlopCounterMode(display=False) as counter:
            models.Block(config, is_causal=is_causal)(x)
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1] == transformer.block_flops(config, 7, 2)["total"]
