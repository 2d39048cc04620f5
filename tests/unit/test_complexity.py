"""Tests of attnbook.complexity: FLOP formulas against torch's FlopCounterMode on real forwards,
memory against worked examples and real tensors, Table 1 of Vaswani et al. (2017), measure(),
saved_activation_bytes against hand counts, and reversible blocks against plain autograd."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnbook.complexity import (
    SOFTMAX_FLOPS_PER_ELEMENT,
    ReversibleBlock,
    attention_flops,
    attention_memory_bytes,
    crossover_length,
    loglog_slope,
    measure,
    reversible_stack,
    rnn_flops,
    saved_activation_bytes,
    vaswani_table1,
)
from attnbook.core import MultiHeadAttention, scaled_dot_product_attention
from attnbook.flash import flash_attention
from attnbook.models import Block, TransformerConfig


def counted_flops(fn, *args, **kwargs) -> int:
    with FlopCounterMode(display=False) as counter:
        fn(*args, **kwargs)
    return counter.get_total_flops()


# ---------------------------------------------------------------------------------------------
# attention_flops vs FlopCounterMode
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    "n, d, h, batch, n_kv_heads",
    [
        (8, 16, 1, 1, None),
        (10, 24, 4, 2, None),
        (5, 32, 8, 3, None),
        (12, 24, 6, 2, 3),
        (7, 16, 4, 1, 1),
        (9, 32, 8, 2, 2),
    ],
)
def test_attention_flops_matmul_equals_flop_counter(n, d, h, batch, n_kv_heads, bias):
    torch.manual_seed(0)
    mha = MultiHeadAttention(d, h, n_kv_heads, bias=bias)
    x = torch.randn(batch, n, d)
    with torch.no_grad():
        assert (
            counted_flops(mha, x)
            == attention_flops(n, d, h, batch, n_kv_heads=n_kv_heads)["matmul"]
        )


@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_attention_flops_cross_attention_equals_flop_counter(n_kv_heads):
    torch.manual_seed(0)
    n, m, d, h, batch = 6, 11, 16, 4, 2
    mha = MultiHeadAttention(d, h, n_kv_heads)
    x, ctx = torch.randn(batch, n, d), torch.randn(batch, m, d)
    with torch.no_grad():
        expected = attention_flops(n, d, h, batch, kv_len=m, n_kv_heads=n_kv_heads)[
            "matmul"
        ]
        assert counted_flops(mha, x, ctx) == expected


def test_attention_flops_core_steps_equal_flop_counter():
    # scores + weighted sum alone: the two matmuls inside scaled_dot_product_attention
    B, h, n, m, d = 2, 4, 9, 13, 32
    q, k, v = (
        torch.randn(B, h, n, d // h),
        torch.randn(B, h, m, d // h),
        torch.randn(B, h, m, d // h),
    )
    steps = attention_flops(n, d, h, B, kv_len=m)
    assert (
        counted_flops(scaled_dot_product_attention, q, k, v)
        == steps["scores"] + steps["weighted_sum"]
    )


def test_attention_flops_bookkeeping():
    n, d, h, B, m = 10, 24, 4, 3, 7
    steps = attention_flops(n, d, h, B, kv_len=m)
    assert set(steps) == {
        "qkv_projections",
        "scores",
        "softmax",
        "weighted_sum",
        "output_projection",
        "matmul",
        "total",
    }
    assert steps["softmax"] == SOFTMAX_FLOPS_PER_ELEMENT * B * h * n * m
    assert steps["matmul"] == steps["total"] - steps["softmax"]
    assert steps["total"] == sum(
        v for key, v in steps.items() if key not in ("matmul", "total")
    )
    # grouped-query attention shrinks only the K and V projections
    gqa = attention_flops(n, d, h, B, kv_len=m, n_kv_heads=1)
    assert steps["qkv_projections"] - gqa["qkv_projections"] == 2 * 2 * B * m * d * (
        d - d // h
    )
    assert all(
        gqa[key] == steps[key]
        for key in ("scores", "softmax", "weighted_sum", "output_projection")
    )
    # quadratic in n for the attention core, linear in n for the projections
    double = attention_flops(2 * n, d, h, B)
    single = attention_flops(n, d, h, B)
    assert (
        double["scores"] == 4 * single["scores"]
        and double["output_projection"] == 2 * single["output_projection"]
    )


# ---------------------------------------------------------------------------------------------
# rnn_flops vs FlopCounterMode
# ---------------------------------------------------------------------------------------------
def _rnn_loop(x, W, U):
    """h_t = tanh(h_{t-1} W^T + x_t U^T), no bias: matmuls are all the counter sees."""
    h = torch.zeros(x.shape[0], W.shape[0])
    for t in range(x.shape[1]):
        h = torch.tanh(h @ W.T + x[:, t] @ U.T)
    return h


@pytest.mark.parametrize(
    "n, d, d_in, batch", [(5, 8, 8, 1), (7, 16, 4, 3), (3, 4, 10, 2)]
)
def test_rnn_flops_equal_flop_counter(n, d, d_in, batch):
    x, W, U = torch.randn(batch, n, d_in), torch.randn(d, d), torch.randn(d, d_in)
    flops = rnn_flops(n, d, d_in, batch)
    assert counted_flops(_rnn_loop, x, W, U) == flops["total"]
    assert flops["total"] == n * flops["per_step"]
    assert flops["sequential_steps"] == n
    assert rnn_flops(n, d) == rnn_flops(n, d, d)


# ---------------------------------------------------------------------------------------------
# attention_memory_bytes
# ---------------------------------------------------------------------------------------------
def test_attention_memory_worked_examples():
    one = attention_memory_bytes(65536)  # one fp32 65,536 x 65,536 matrix
    assert one == 17_179_869_184 == 2**32 * 4
    assert f"{one / 1e9:.1f} GB" == "17.2 GB"
    assert attention_memory_bytes(10_000) == 100 * attention_memory_bytes(1_000)
    assert attention_memory_bytes(1024, bytes_per_elem=2) == 2 * 1024**2
    assert (
        attention_memory_bytes(128, n_heads=8, batch=4, n_layers=12)
        == 8 * 4 * 12 * 128**2 * 4
    )
    assert attention_memory_bytes(10, kv_len=30) == 3 * attention_memory_bytes(10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_attention_memory_matches_the_weight_tensor(dtype):
    B, h, n, m = 2, 3, 5, 7
    q, k, v = (
        torch.randn(B, h, n, 4, dtype=dtype),
        torch.randn(B, h, m, 4, dtype=dtype),
        torch.randn(B, h, m, 4, dtype=dtype),
    )
    _, w = scaled_dot_product_attention(q, k, v, return_weights=True)
    size = w.numel() * w.element_size()
    assert (
        attention_memory_bytes(n, h, B, bytes_per_elem=w.element_size(), kv_len=m)
        == size
    )


# ---------------------------------------------------------------------------------------------
# Crossover with a recurrent layer
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("d", [16, 64, 512])
def test_crossover_attention_core_equals_rnn_at_n_equals_d(d):
    assert crossover_length(d) == d

    def core(n):
        steps = attention_flops(n, d)
        return steps["scores"] + steps["weighted_sum"]  # 4 n^2 d

    rnn = lambda n: rnn_flops(n, d)["total"]  # 4 n d^2  # noqa: E731
    assert core(d) == rnn(d)
    for n in (1, d // 2, d - 1):
        assert core(n) < rnn(n)
    for n in (d + 1, 2 * d, 10 * d):
        assert core(n) > rnn(n)
    # the constant-free statement: n^2 d == n d^2 exactly when n == d
    assert [n for n in range(1, 3 * d) if n * n * d == n * d * d] == [d]


# ---------------------------------------------------------------------------------------------
# Table 1 of Vaswani et al. (2017)
# ---------------------------------------------------------------------------------------------
def test_vaswani_table1_rows_and_strings():
    rows = vaswani_table1()
    table = {r.layer: (r.complexity, r.sequential, r.path_length) for r in rows}
    assert list(table) == [
        "Self-Attention",
        "Recurrent",
        "Convolutional",
        "Self-Attention (restricted)",
    ]
    assert table["Self-Attention"] == ("O(n^2 d)", "O(1)", "O(1)")
    assert table["Recurrent"] == ("O(n d^2)", "O(n)", "O(n)")
    assert table["Convolutional"] == ("O(k n d^2)", "O(1)", "O(log_k(n))")
    assert table["Self-Attention (restricted)"] == ("O(r n d)", "O(1)", "O(n/r)")


def test_vaswani_table1_evaluate():
    n, d, k, r = 100, 512, 3, 16
    got = {row.layer: row.evaluate(n, d, k, r) for row in vaswani_table1()}
    assert got["Self-Attention"] == {
        "layer": "Self-Attention",
        "complexity": n * n * d,
        "sequential": 1,
        "path_length": 1,
    }
    assert got["Recurrent"] == {
        "layer": "Recurrent",
        "complexity": n * d * d,
        "sequential": n,
        "path_length": n,
    }
    conv = got["Convolutional"]
    assert conv["complexity"] == k * n * d * d and conv["sequential"] == 1
    assert conv["path_length"] == pytest.approx(math.log(n) / math.log(k))
    assert got["Self-Attention (restricted)"]["complexity"] == r * n * d
    assert got["Self-Attention (restricted)"]["path_length"] == pytest.approx(n / r)
    # defaults k=3, r=16, and the table's point: self-attention is cheaper than recurrence when n < d
    assert vaswani_table1()[2].evaluate(n, d) == conv
    sa, rec = vaswani_table1()[:2]
    assert sa.evaluate(100, 512)["complexity"] < rec.evaluate(100, 512)["complexity"]
    assert sa.evaluate(1024, 512)["complexity"] > rec.evaluate(1024, 512)["complexity"]


def _layers_to_connect(n: int, offsets) -> int:
    """The fewest layers after which position n - 1 has read position 0, when in layer ``l``
    position ``i`` reads positions ``i - o`` for ``o`` in ``offsets(l)``: a breadth-first walk."""
    reached, layers = {0}, 0
    while n - 1 not in reached:
        reached = {p + o for p in reached for o in offsets(layers) if p + o < n}
        layers += 1
    return layers


@pytest.mark.parametrize("n", [1, 2, 7, 64, 100, 243])
def test_vaswani_table1_path_lengths_are_the_layers_that_connect_the_ends(n):
    """The path-length column against the layered graphs it describes: self-attention
    connects any two positions in one layer, a recurrence in n - 1 steps, dilated
    convolutions of width k (dilation k^l in layer l) in ceil(log_k n) layers, while
    contiguous kernels need O(n / k) layers (the docstring's remark) and a neighbourhood
    of r positions O(n / r)."""
    rows = {row.layer: row for row in vaswani_table1()}
    assert _layers_to_connect(n, lambda l: range(n)) == min(n - 1, 1)
    assert rows["Self-Attention"].evaluate(n, 8)["path_length"] == 1
    recurrent = rows["Recurrent"].evaluate(n, 8)
    assert _layers_to_connect(n, lambda l: (0, 1)) == n - 1 == recurrent["path_length"] - 1
    assert recurrent["sequential"] == rnn_flops(n, 8)["sequential_steps"] == n
    for k in (2, 3, 5):
        dilated = _layers_to_connect(n, lambda l: [j * k**l for j in range(k)])
        path = rows["Convolutional"].evaluate(n, 8, k=k)["path_length"]
        assert dilated == math.ceil(path - 1e-9)
        contiguous = _layers_to_connect(n, lambda l: range(k))
        assert n / k - 1 <= contiguous <= 2 * n / k + 1
    for r in (3, 5, 9):  # r positions centred on the query: it reads (r - 1) / 2 back
        restricted = _layers_to_connect(n, lambda l: range((r + 1) // 2))
        path = rows["Self-Attention (restricted)"].evaluate(n, 8, r=r)["path_length"]
        assert path - 1 <= restricted <= 3 * path + 1


@pytest.mark.parametrize("n, d, k, r", [(6, 8, 3, 3), (16, 4, 5, 5), (9, 12, 3, 7)])
def test_vaswani_table1_complexities_are_flop_counts_without_their_constants(n, d, k, r):
    """Each complexity column is the FLOP count of its layer (FlopCounterMode, 2 per
    multiply-add) divided by a constant: 4 for attention's two matmuls and the recurrence's
    two matrix-vector products per step, 2 for a convolution. So the table's crossover of
    self-attention and recurrence lies where crossover_length says."""
    sa, rec, conv, restricted = vaswani_table1()
    steps = attention_flops(n, d)
    assert 4 * sa.evaluate(n, d)["complexity"] == steps["scores"] + steps["weighted_sum"]
    assert 4 * rec.evaluate(n, d)["complexity"] == rnn_flops(n, d)["total"]
    x, w = torch.randn(1, d, n), torch.randn(d, d, k)
    assert 2 * conv.evaluate(n, d, k=k)["complexity"] == counted_flops(
        torch.nn.functional.conv1d, x, w, padding=(k - 1) // 2
    )
    q, keys = torch.randn(n, 1, d), torch.randn(n, r, d)  # r neighbours per query

    def banded(q, keys):
        weights = torch.softmax(q @ keys.transpose(-2, -1), -1)  # (n, 1, r)
        return weights @ keys

    assert 4 * restricted.evaluate(n, d, r=r)["complexity"] == counted_flops(banded, q, keys)
    assert sa.evaluate(crossover_length(d), d)["complexity"] == rec.evaluate(crossover_length(d), d)["complexity"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(n=0, d=8), "n must be a positive integer, got 0"),
        (dict(n=8, d=0), "d must be a positive integer, got 0"),
        (dict(n=8, d=8, k=0), "k must be a positive integer, got 0"),
        (dict(n=8, d=8, k=1), r"k must be a kernel width >= 2 \(the path length is log_k n\), got 1"),
        (dict(n=8, d=8, r=0), "r must be a positive integer, got 0"),
        (dict(n=8.5, d=8), "n must be a positive integer, got 8.5"),
        (dict(n=True, d=8), "n must be a positive integer, got True"),
    ],
)
def test_vaswani_table1_evaluate_refuses_sizes_it_cannot_evaluate(kwargs, match):
    """Regression: sizes of 0 divided by zero (log base 1, n / 0) or took log 0; every row
    refuses them, naming the argument."""
    for row in vaswani_table1():
        with pytest.raises(ValueError, match=f"LayerComplexity.evaluate: {match}"):
            row.evaluate(**kwargs)


# ---------------------------------------------------------------------------------------------
# loglog_slope and measure
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [0.5, 1.0, 2.0, 3.0, -1.0])
@pytest.mark.parametrize("c", [1.0, 7.5e-9])
def test_loglog_slope_recovers_power_law_exponents(p, c):
    x = [2**i for i in range(4, 12)]
    y = [c * xi**p for xi in x]
    assert loglog_slope(x, y) == pytest.approx(p, abs=1e-9)
    assert loglog_slope(
        torch.tensor(x, dtype=torch.float64), torch.tensor(y)
    ) == pytest.approx(p, abs=1e-6)


@pytest.mark.parametrize("x, y", [([1, 2, 3], [1, 2]), ([1], [1]), ([], [])])
def test_loglog_slope_errors(x, y):
    with pytest.raises(ValueError, match="x and y"):
        loglog_slope(x, y)


def _square(n):
    return torch.ones(
        n, n
    )  # ones, not empty: the pages are touched, so resident memory grows


def test_measure_times_and_keys():
    result = measure(torch.ones, 64, 64, repeat=3, warmup=2)
    assert set(result) == {"time_s", "min_s", "times_s", "peak_bytes", "memory"}
    assert result["min_s"] == min(result["times_s"])
    assert len(result["times_s"]) == 3 and all(t > 0 for t in result["times_s"])
    assert result["time_s"] > 0 and min(result["times_s"]) <= result["time_s"] <= max(
        result["times_s"]
    )
    calls = []
    measure(lambda: calls.append(1), repeat=4, warmup=1)
    assert len(calls) == 5


def test_measure_peak_memory_grows_quadratically():
    small = measure(_square, 4096, repeat=2)  # 64 MiB of float32
    big = measure(_square, 8192, repeat=2)  # 256 MiB
    if not sys.platform.startswith(
        "linux"
    ):  # peak RSS is read from /proc: documented as None elsewhere on CPU
        assert small["peak_bytes"] is None and small["memory"] == "unavailable"
        return
    assert small["peak_bytes"] is not None and big["peak_bytes"] is not None
    assert small["memory"] == big["memory"] == "peak RSS (VmHWM)"
    assert small["peak_bytes"] >= 0.8 * 4096**2 * 4
    assert 2.5 <= big["peak_bytes"] / small["peak_bytes"] <= 6


@pytest.mark.parametrize("kwargs", [dict(repeat=0), dict(warmup=-1)])
def test_measure_validation(kwargs):
    with pytest.raises(ValueError, match="repeat must be >= 1 and warmup >= 0"):
        measure(torch.ones, 2, **kwargs)


# ---------------------------------------------------------------------------------------------
# Validation errors name the argument
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: attention_flops(0, 16), "seq_len"),
        (lambda: attention_flops(8, -16), "d_model"),
        (lambda: attention_flops(8, 16, n_heads=0), "n_heads"),
        (lambda: attention_flops(8, 16, batch=0), "batch"),
        (lambda: attention_flops(8, 16, kv_len=0), "kv_len"),
        (lambda: attention_flops(8, 16, n_heads=4, n_kv_heads=0), "n_kv_heads"),
        (lambda: attention_flops(8.0, 16), "seq_len"),
        (lambda: attention_flops(8, 16, n_heads=3), "divisible by n_heads=3"),
        (lambda: attention_flops(8, 16, n_heads=4, n_kv_heads=3), "n_kv_heads=3"),
        (lambda: rnn_flops(0, 8), "seq_len"),
        (lambda: rnn_flops(4, 0), "hidden"),
        (lambda: rnn_flops(4, 8, input_dim=0), "input_dim"),
        (lambda: rnn_flops(4, 8, batch=-2), "batch"),
        (lambda: attention_memory_bytes(0), "seq_len"),
        (lambda: attention_memory_bytes(8, n_heads=0), "n_heads"),
        (lambda: attention_memory_bytes(8, bytes_per_elem=0), "bytes_per_elem"),
        (lambda: attention_memory_bytes(8, n_layers=0), "n_layers"),
        (lambda: attention_memory_bytes(8, kv_len=-1), "kv_len"),
        (lambda: crossover_length(0), "d_model"),
    ],
)
def test_validation_errors_name_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_sizes_accept_numpy_integers_and_reject_bools():
    import numpy as np

    assert attention_flops(np.int64(8), 16) == attention_flops(8, 16)
    with pytest.raises(ValueError, match="seq_len"):
        attention_flops(True, 16)


@pytest.mark.parametrize(
    "x, y", [([1, 2], [0, 1]), ([1, -2], [1, 2]), ([3, 3], [1, 2])]
)
def test_loglog_slope_rejects_what_has_no_log_log_slope(x, y):
    with pytest.raises(ValueError):
        loglog_slope(x, y)


# ---------------------------------------------------------------------------------------------
# saved_activation_bytes: against tensors counted by hand
# ---------------------------------------------------------------------------------------------
def test_saved_activation_bytes_hand_counted():
    x = torch.randn(
        3, 4, dtype=torch.float64, requires_grad=True
    )  # 12 doubles: 96 bytes
    assert (
        saved_activation_bytes(lambda t: t.exp().sum(), x) == 96
    )  # exp keeps its output
    assert (
        saved_activation_bytes(lambda t: (t * t).sum(), x) == 96
    )  # x twice: one buffer
    assert (
        saved_activation_bytes(lambda t: t.sin().sin().sum(), x) == 192
    )  # x and sin x
    assert saved_activation_bytes(lambda t: (t + 1).sum(), x) == 0  # add keeps nothing
    assert saved_activation_bytes(lambda t: (t * t).sum(), x, exclude=[x]) == 0
    with torch.no_grad():
        assert saved_activation_bytes(lambda t: t.exp().sum(), x) == 0


def test_saved_activation_bytes_counts_a_views_whole_buffer_and_skips_parameters():
    x = torch.randn(
        3, 4, dtype=torch.float64
    )  # no grad: only the weight's side is saved
    w = nn.Parameter(torch.randn(1, 4, dtype=torch.float64))
    # mul keeps x[:1] (a view of all 12 doubles) for w's gradient, and nothing for x
    assert saved_activation_bytes(lambda t: (t[:1] * w).sum(), x) == 96
    linear = nn.Linear(4, 5).double()
    x.requires_grad_()
    # the input for the weight's gradient, weight.t() (a parameter's view) for x's: 96
    assert saved_activation_bytes(linear, x) == 96


def test_saved_activation_bytes_of_attention_counts_the_weights_flash_does_not():
    B, H, n, E = 1, 2, 32, 8
    q, k, v = (
        torch.randn(B, H, n, E, dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    )
    # a custom Function's save_for_backward: q, k, v, out and the log-sum-exp per row
    assert (
        saved_activation_bytes(flash_attention, q, k, v)
        == (4 * B * H * n * E + B * H * n) * 8
    )
    standard = saved_activation_bytes(scaled_dot_product_attention, q, k, v)
    assert standard >= attention_memory_bytes(n, n_heads=H, bytes_per_elem=8)


# ---------------------------------------------------------------------------------------------
# Reversible blocks: against the plain (stored-activation) computation of the same F and G
# ---------------------------------------------------------------------------------------------
def _mlp_blocks(n_blocks, d, seed=0):
    torch.manual_seed(seed)
    return [
        ReversibleBlock(
            nn.Sequential(nn.Linear(d, d), nn.Tanh()),
            nn.Sequential(nn.Linear(d, d), nn.GELU()),
        ).double()
        for _ in range(n_blocks)
    ]


def _attention_blocks(n_blocks, d=16, heads=4, seed=0):
    torch.manual_seed(seed)
    config = TransformerConfig(d_model=d, n_heads=heads, positional="none")
    plain = [Block(config, is_causal=True).double() for _ in range(n_blocks)]
    return [
        ReversibleBlock(nn.Sequential(b.ln1, b.attn), nn.Sequential(b.ln2, b.mlp))
        for b in plain
    ]


def _plain_stack(blocks, x1, x2):
    for block in blocks:
        x1, x2 = block(x1, x2)
    return x1, x2


def _grads(stack, blocks, x1, x2):
    params = list(dict.fromkeys(p for b in blocks for p in b.parameters()))
    y1, y2 = stack(blocks, x1, x2)
    loss = (y1 * torch.linspace(-1, 1, y1.shape[-1], dtype=y1.dtype)).sum() + (
        y2**2
    ).sum()
    return (y1, y2), torch.autograd.grad(loss, [x1, x2, *params])


@settings(max_examples=20, deadline=None)
@given(
    n_blocks=st.integers(1, 4),
    batch=st.integers(1, 2),
    n=st.integers(1, 6),
    d=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_reversible_stack_values_and_gradients_equal_the_plain_computation(
    n_blocks, batch, n, d, seed
):
    blocks = _mlp_blocks(n_blocks, d, seed)
    gen = torch.Generator().manual_seed(seed)
    x1, x2 = (
        torch.randn(batch, n, d, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(2)
    )
    out, grads = _grads(reversible_stack, blocks, x1, x2)
    ref_out, ref_grads = _grads(_plain_stack, blocks, x1, x2)
    for a, b in zip(out + grads, ref_out + ref_grads):
        assert (a - b).abs().max().item() < 1e-6


def test_reversible_attention_blocks_gradients_and_shared_parameters():
    blocks = _attention_blocks(3)
    blocks.append(blocks[0])  # a block used twice: its parameter gradients add up
    gen = torch.Generator().manual_seed(1)
    x1, x2 = (
        torch.randn(2, 7, 16, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(2)
    )
    out, grads = _grads(reversible_stack, blocks, x1, x2)
    ref_out, ref_grads = _grads(_plain_stack, blocks, x1, x2)
    assert len(grads) == 2 + len(list(nn.ModuleList(blocks[:3]).parameters()))
    for a, b in zip(out + grads, ref_out + ref_grads):
        assert (a - b).abs().max().item() < 1e-6
    assert torch.autograd.gradcheck(
        lambda a, b: reversible_stack(blocks[:2], a, b), (x1[:1, :3], x2[:1, :3])
    )


@pytest.mark.parametrize(
    "blocks", [_mlp_blocks(3, 5), _attention_blocks(3)], ids=["mlp", "attention"]
)
def test_reversible_inverse_reconstructs_the_inputs(blocks):
    gen = torch.Generator().manual_seed(2)
    d = 5 if isinstance(blocks[0].f[0], nn.Linear) else 16
    x1, x2 = (
        torch.randn(2, 6, d, generator=gen, dtype=torch.float64) for _ in range(2)
    )
    with torch.no_grad():
        y1, y2 = _plain_stack(blocks, x1, x2)
        for block in reversed(blocks):
            y1, y2 = block.inverse(y1, y2)
    assert torch.allclose(y1, x1, rtol=0, atol=1e-12) and torch.allclose(
        y2, x2, rtol=0, atol=1e-12
    )


def test_reversible_stack_saves_only_its_output_whatever_the_depth():
    blocks = _attention_blocks(4)
    x = torch.randn(1, 12, 16, dtype=torch.float64, requires_grad=True)
    output_bytes = 2 * x.numel() * 8  # y1 and y2
    for n_blocks in (1, 2, 4):
        assert (
            saved_activation_bytes(
                lambda t: reversible_stack(blocks[:n_blocks], t, t), x
            )
            == output_bytes
        )
    plain = [
        saved_activation_bytes(lambda t: _plain_stack(blocks[:k], t, t), x)
        for k in (1, 2, 4)
    ]
    assert (
        plain[0] > output_bytes
        and plain[1] > 1.9 * plain[0]
        and plain[2] > 3.8 * plain[0]
    )


def test_reversible_stack_backward_recomputes_every_f_and_g_once():
    """The docstring's cost: the backward pass runs each block's F and G once more (about one
    extra forward pass); the plain stack never reruns them."""
    calls = []

    class Counted(nn.Module):
        def __init__(self, name):
            super().__init__()
            self.name, self.linear = name, nn.Linear(3, 3).double()

        def forward(self, x):
            calls.append(self.name)
            return torch.tanh(self.linear(x))

    blocks = [ReversibleBlock(Counted(f"f{i}"), Counted(f"g{i}")) for i in range(3)]
    x1, x2 = (torch.randn(2, 3, dtype=torch.float64, requires_grad=True) for _ in range(2))
    y1, y2 = reversible_stack(blocks, x1, x2)
    assert sorted(calls) == sorted(f"{fg}{i}" for i in range(3) for fg in "fg")  # forward: once each
    calls.clear()
    (y1.sum() + y2.sum()).backward()
    assert sorted(calls) == sorted(f"{fg}{i}" for i in range(3) for fg in "fg")  # backward: once more
    calls.clear()
    y1, y2 = _plain_stack(blocks, x1, x2)
    (y1.sum() + y2.sum()).backward()
    assert len(calls) == 6


def test_reversible_stack_validation():
    with pytest.raises(ValueError, match="ReversibleBlock"):
        reversible_stack([], torch.zeros(1, 2), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="ReversibleBlock"):
        reversible_stack([nn.Linear(2, 2)], torch.zeros(1, 2), torch.zeros(1, 2))
