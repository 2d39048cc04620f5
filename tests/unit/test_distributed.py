"""Attention across ranks (attnbook.distributed) against one-process attention.

Spawning processes is the slow part (each imports torch), so one group of 4 ranks is
spawned for the whole file: it runs every case on the world group (W = 4), on two
pairs of ranks (W = 2) and on each rank alone (W = 1), through ``group=``, plus the bad
inputs, and hands the shards back. The parent compares them with PyTorch's
``scaled_dot_product_attention`` on the full sequence, forward and backward, in float64
(and bfloat16 at a loose tolerance), and the bytes and work counted with the formulas.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnbook.distributed import (
    attention_on_rank,
    context_memory_bytes,
    in_turn,
    largest_context,
    pairs_per_rank,
    ring_attention,
    ring_bytes_per_rank,
    run_on_ranks,
    shard,
    shard_positions,
    time_on_rank,
    ulysses_attention,
    ulysses_bytes_per_rank,
    unshard,
)

B, H, L, E, EV = 2, 4, 16, 3, 2  # L splits into 2 x 4 zigzag chunks of 2
# (method, layout, is_causal, kv_heads)
CASES = [
    ("ring", "contiguous", False, H),
    ("ring", "contiguous", True, H),
    ("ring", "zigzag", False, H),
    ("ring", "zigzag", True, H),
    ("ring", "contiguous", True, 2),  # grouped-query: 2 key/value heads travel
    ("ulysses", "contiguous", False, H),
    ("ulysses", "contiguous", True, H),
    ("ulysses", "contiguous", True, 2),  # W = 2 only: 2 heads over 4 ranks is an error
]
BF16_CASES = [("ring", "zigzag", True, H), ("ulysses", "contiguous", True, H)]
GROUPS = {4: [[0, 1, 2, 3]], 2: [[0, 1], [2, 3]], 1: [[0], [1], [2], [3]]}  # the rings


def _cases(world):
    return [c for c in CASES if c[0] == "ring" or c[3] % world == 0]


def _inputs():
    g = torch.Generator().manual_seed(0)
    full = {}
    for kv in (H, 2):
        q = torch.randn(B, H, L, E, generator=g, dtype=torch.float64)
        k = torch.randn(B, kv, L, E, generator=g, dtype=torch.float64)
        v = torch.randn(B, kv, L, EV, generator=g, dtype=torch.float64)
        full[kv] = (q, k, v, torch.randn(B, H, L, EV, generator=g, dtype=torch.float64))
    return full


def _caught(call) -> str:
    try:
        call()
    except (ValueError, TypeError, RuntimeError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def _bad_inputs(world, group) -> dict[str, str]:
    """Each bad call, on every rank of the group; all ranks must raise (none may hang)."""
    me = dist.get_rank(group)

    def x(heads, n, dim=3):
        return torch.zeros(1, heads, n, dim, dtype=torch.float64)

    def ring(q, k, v, **flags):
        return lambda: ring_attention(q, k, v, group=group, **flags)

    def ulysses(q, k, v):
        return lambda: ulysses_attention(q, k, v, group=group)

    uneven = x(2, 3 if me == 0 else 2)
    return {
        "heads": _caught(ulysses(x(world + 1, 2), x(world + 1, 2), x(world + 1, 2))),
        "kv_heads": _caught(ulysses(x(2 * world, 2), x(world // 2, 2), x(world // 2, 2))),
        "uneven ring": _caught(ring(uneven, uneven, uneven)),
        "uneven ulysses": _caught(ulysses(uneven, uneven, uneven)),
        "one bad rank": _caught(ring(x(2, 2), x(2, 2, 4 if me == 1 else 3), x(2, 2))),
        "zigzag odd": _caught(ring(x(2, 3), x(2, 3), x(2, 3), layout="zigzag")),
        "layout": _caught(ring(x(2, 2), x(2, 2), x(2, 2), layout="striped")),
    }


def _claims_inputs():
    """Shards with two batch dimensions, (2, 1, H, L, E): the docstrings' ``(...,``."""
    g = torch.Generator().manual_seed(3)
    return [torch.randn(2, 1, H, L, E, generator=g, dtype=torch.float64) for _ in range(3)]


def _claims(me, world, group, full):
    """What the docstrings promise beyond equality with SDPA: any leading dimensions
    (two batch dimensions, none), ``return_stats=False`` giving the output alone, the
    backward bytes at 0 until backward runs, no gradients without ``grad_out``."""
    shards = [shard(t, me, world) for t in _claims_inputs()]
    found = {}
    for name, f in (("ring", ring_attention), ("ulysses", ulysses_attention)):
        q, k, v = (t.clone().requires_grad_() for t in shards)
        out, stats = f(q, k, v, is_causal=True, group=group, return_stats=True)
        before = dataclasses.replace(stats)  # a copy, before the backward pass
        alone = f(*shards, is_causal=True, group=group)
        out.backward(torch.ones_like(out))
        found[name] = {"out": out.detach(), "alone": alone, "before": before,
                       "after": stats, "dq": q.grad,
                       "3-D": f(*(t[0, 0] for t in shards), is_causal=True, group=group)}
        # full tensors that require grad themselves: the rank's shards are its own leaves
        leaves = [t.clone().requires_grad_() for t in full[H][:3]]
        without = attention_on_rank(me, world, *leaves, method=name, group=group)
        found[name]["no grad_out"] = [without[g] for g in ("dq", "dk", "dv")]
        found[name]["leaves"] = attention_on_rank(
            me, world, *leaves, full[H][3], method=name, is_causal=True, group=group)
    return found


def _rank_checks(rank, world, full):
    """Everything the ranks do: W = 4 on the world group, then W = 2 on two pairs and
    W = 1 on each rank alone."""
    groups = {w: [dist.new_group(m) for m in GROUPS[w]] for w in (2, 1)}  # all ranks
    found = {}
    for w, group in ((4, None), (2, groups[2][rank // 2]), (1, groups[1][rank])):
        for case in _cases(w):
            method, layout, is_causal, kv = case
            found[w, case] = attention_on_rank(
                rank, world, *full[kv], method=method, layout=layout,
                is_causal=is_causal, group=group,
            )  # fmt: skip
        for case in BF16_CASES:
            method, layout, is_causal, kv = case
            found[w, "bfloat16", case] = attention_on_rank(
                rank, world, *(t.to(torch.bfloat16) for t in full[kv]), method=method,
                layout=layout, is_causal=is_causal, group=group,
            )  # fmt: skip
        if w > 1:
            found[w, "errors"] = _bad_inputs(w, group)
        me = rank if group is None else dist.get_rank(group)
        found[w, "claims"] = _claims(me, w, group, full)
    q, k, v, _ = full[H]
    timed = [functools.partial(time_on_rank, q=q, k=k, v=v, method=method,
                               is_causal=True, layout=layout, repeat=1)
             for method, layout in (("ring", "zigzag"), ("ulysses", "contiguous"))]
    found["in turn"] = in_turn(rank, world, *timed)
    return found


@pytest.fixture(scope="module")
def ranks():
    return run_on_ranks(_rank_checks, 4, _inputs())


def _reference(case):
    _, _, is_causal, kv = case
    q, k, v, grad_out = (t.clone().requires_grad_() for t in _inputs()[kv])
    out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
    out.backward(grad_out.detach())
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


# --------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------
@given(
    world=st.integers(1, 5),
    chunk=st.integers(1, 3),
    layout=st.sampled_from(["contiguous", "zigzag"]),
    dim=st.sampled_from([-2, 0, 1]),
)
def test_unshard_inverts_shard_and_the_shards_partition_the_sequence(world, chunk, layout, dim):
    seq_len = 2 * world * chunk
    x = torch.randn(2, 3, seq_len, 2).movedim(-2, dim)
    shards = [shard(x, r, world, layout=layout, dim=dim) for r in range(world)]
    assert torch.equal(unshard(shards, layout=layout, dim=dim), x)
    positions = torch.cat([shard_positions(r, world, seq_len, layout=layout) for r in range(world)])
    assert sorted(positions.tolist()) == list(range(seq_len))


def test_zigzag_gives_rank_r_chunks_r_and_2w_minus_1_minus_r():
    assert shard_positions(0, 2, 8, layout="zigzag").tolist() == [0, 1, 6, 7]
    assert shard_positions(1, 2, 8, layout="zigzag").tolist() == [2, 3, 4, 5]
    assert shard_positions(1, 2, 8).tolist() == [4, 5, 6, 7]


def test_lengths_that_do_not_split_are_refused_with_the_advice_to_pad():
    with pytest.raises(ValueError, match=r"seq_len=6 does not split into 4 equal chunks.*pad"):
        shard(torch.zeros(1, 1, 6, 2), 0, 2, layout="zigzag")
    with pytest.raises(ValueError, match="layout must be 'contiguous' or 'zigzag'"):
        shard_positions(0, 2, 8, layout="striped")
    with pytest.raises(ValueError, match="equal-length shards"):
        unshard([torch.zeros(1, 2, 1), torch.zeros(1, 3, 1)])


# --------------------------------------------------------------------------------------
# Against one-process attention
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "world, case",
    [(w, c) for w in (1, 2, 4) for c in _cases(w)],
    ids=lambda x: "-".join(map(str, x)) if isinstance(x, tuple) else f"W{x}",
)
def test_shards_equal_full_attention_forward_and_backward(ranks, world, case):
    ref = _reference(case)
    layout = case[1]
    for members in GROUPS[world]:
        for i, rank in enumerate(members):
            got = ranks[rank][world, case]
            for name in ("out", "dq", "dk", "dv"):
                expected = shard(ref[name], i, world, layout=layout)
                torch.testing.assert_close(
                    got[name], expected, atol=1e-9, rtol=0, msg=f"{name} of rank {i}"
                )
        joined = unshard([ranks[r][world, case]["out"] for r in members], layout=layout)
        torch.testing.assert_close(joined, ref["out"], atol=1e-9, rtol=0)


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("case", BF16_CASES, ids=lambda c: c[0])
def test_bfloat16_shards_accumulate_in_float32(ranks, world, case):
    ref, layout = _reference(case), case[1]
    for members in GROUPS[world]:
        for i, rank in enumerate(members):
            got = ranks[rank][world, "bfloat16", case]
            for name in ("out", "dq", "dk", "dv"):
                assert got[name].dtype == torch.bfloat16
                expected = shard(ref[name], i, world, layout=layout)
                torch.testing.assert_close(got[name].double(), expected, atol=0.05, rtol=0.02)
            formula = ring_bytes_per_rank if case[0] == "ring" else ulysses_bytes_per_rank
            expected = formula(B, H, L, E, world, 2, value_dim=EV)  # dK, dV travel in float32
            stats = got["stats"]
            assert (stats.bytes_sent, stats.bytes_sent_backward) == (
                expected["forward"], expected["backward"])


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("method", ["ring", "ulysses"])
def test_leading_dimensions_return_stats_and_backward_stats(ranks, world, method):
    """The docstrings' claims beyond equality: ``(..., H, n, E)`` shards with two batch
    dimensions or none; ``return_stats=False`` returns the output alone;
    ``bytes_sent_backward`` is 0 until the backward pass runs, then the formula's;
    Ulysses computes one block and skips none; without ``grad_out`` no gradients; full
    tensors that require grad give the same shards and gradients as any."""
    q, k, v = (t.requires_grad_() for t in _claims_inputs())
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref.backward(torch.ones_like(ref))
    formula = ring_bytes_per_rank if method == "ring" else ulysses_bytes_per_rank
    expected = formula(2, H, L, E, world, 8)
    for members in GROUPS[world]:
        found = [ranks[r][world, "claims"][method] for r in members]
        joined = {name: unshard([f[name] for f in found]) for name in ("out", "dq", "3-D")}
        torch.testing.assert_close(joined["out"], ref.detach(), atol=1e-12, rtol=0)
        torch.testing.assert_close(joined["dq"], q.grad, atol=1e-12, rtol=0)
        torch.testing.assert_close(joined["3-D"], ref.detach()[0, 0], atol=1e-12, rtol=0)
        for f in found:
            assert torch.equal(f["alone"], f["out"])
            assert (f["before"].bytes_sent, f["before"].bytes_sent_backward) == (
                expected["forward"], 0)
            assert f["after"].bytes_sent_backward == expected["backward"]
            if method == "ulysses":
                assert (f["after"].blocks_computed, f["after"].blocks_skipped) == (1, 0)
            assert f["no grad_out"] == [None, None, None]
        case = (method, "contiguous", True, H)
        for r in members:
            leaves, plain = ranks[r][world, "claims"][method]["leaves"], ranks[r][world, case]
            for name in ("out", "dq", "dk", "dv"):
                torch.testing.assert_close(leaves[name], plain[name], atol=0, rtol=0)


# --------------------------------------------------------------------------------------
# Communication and work
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2, 4])
def test_bytes_counted_equal_the_formulas(ranks, world):
    for case in _cases(world):
        method, _, _, kv = case
        formula = ring_bytes_per_rank if method == "ring" else ulysses_bytes_per_rank
        expected = formula(B, H, L, E, world, 8, kv_heads=kv, value_dim=EV)
        for rank in range(4):
            stats = ranks[rank][world, case]["stats"]
            assert (stats.bytes_sent, stats.bytes_sent_backward) == (
                expected["forward"], expected["backward"]), (case, rank)


def test_the_formulas_by_hand():
    # one head, 8 positions over 4 ranks, head_dim 1, 2-byte elements: blocks of 2 x 2
    assert ring_bytes_per_rank(1, 1, 8, 1, 4, 2) == {"forward": 3 * 4 * 2,
                                                     "backward": 3 * 4 * 2 + 4 * 4 * 4}
    assert ring_bytes_per_rank(1, 1, 8, 1, 1, 2) == {"forward": 0, "backward": 0}
    # q, k, v, out: 4 shards of 4 heads x 2 positions; 3 of their 4 pieces leave: 24
    # elements of 2 bytes
    assert ulysses_bytes_per_rank(1, 4, 8, 1, 4, 2) == {"forward": 48, "backward": 48}


@given(
    batch=st.integers(1, 3), kv_heads=st.integers(1, 4), group=st.integers(1, 3),
    n=st.integers(1, 6), head_dim=st.integers(1, 8), value_dim=st.integers(1, 8),
    world=st.integers(1, 8), bytes_per_elem=st.sampled_from([1, 2, 4, 8]),
)  # fmt: skip
def test_the_byte_formulas_keep_their_docstrings_promises(
    batch, kv_heads, group, n, head_dim, value_dim, world, bytes_per_elem
):
    heads, seq_len = kv_heads * group, world * n
    args = (batch, heads, seq_len, head_dim, world, bytes_per_elem)
    sizes = {"kv_heads": kv_heads, "value_dim": value_dim}
    ring = ring_bytes_per_rank(*args, **sizes)
    # the ring: the key/value blocks (only the key/value heads) make W - 1 hops, and the
    # backward pass adds the dK, dV accumulators' W hops in float32 or wider
    block = batch * kv_heads * n * (head_dim + value_dim)
    assert ring["forward"] == (world - 1) * block * bytes_per_elem
    assert ring["backward"] - ring["forward"] == (
        world * block * max(bytes_per_elem, 4) if world > 1 else 0)
    # about 2 L D per key/value head, however many ranks share the sequence
    per_head = ring["forward"] / (batch * kv_heads * bytes_per_elem)
    assert per_head <= seq_len * (head_dim + value_dim)
    assert world == 1 or per_head >= seq_len * (head_dim + value_dim) / 2
    if heads % world or kv_heads % world:
        return
    uly = ulysses_bytes_per_rank(*args, **sizes)
    assert uly["forward"] == uly["backward"]
    # Ulysses, multi-head: 4 (W - 1) / W^2 of a full tensor; at most the ring's
    full = batch * heads * seq_len * head_dim * bytes_per_elem
    mha = ulysses_bytes_per_rank(*args)
    assert mha["forward"] * world**2 == 4 * (world - 1) * full
    assert mha["forward"] <= ring_bytes_per_rank(*args)["forward"]


@given(world=st.integers(1, 6), chunk=st.integers(0, 5))
def test_pairs_per_rank_closed_forms_for_any_size(world, chunk):
    """pairs_per_rank's docstring: contiguous ``n^2 (r + 1/2) + n / 2``, zigzag
    ``c^2 (2 W - 1) + c (c + 1)`` on every rank, ``n * seq_len`` without the mask;
    together, every causal pair once."""
    c = chunk
    n, seq_len = 2 * c, 2 * c * world
    contiguous = pairs_per_rank(seq_len, world)
    assert [2 * p for p in contiguous] == [n * n * (2 * r + 1) + n for r in range(world)]
    zigzag = pairs_per_rank(seq_len, world, layout="zigzag")
    assert zigzag == [c * c * (2 * world - 1) + c * (c + 1)] * world
    assert sum(contiguous) == sum(zigzag) == seq_len * (seq_len + 1) // 2
    assert pairs_per_rank(seq_len, world, is_causal=False) == [n * seq_len] * world


@given(
    world=st.integers(1, 5), chunk=st.integers(0, 3),
    layout=st.sampled_from(["contiguous", "zigzag"]),
)  # fmt: skip
def test_shard_is_index_select_of_shard_positions(world, chunk, layout):
    seq_len = 2 * world * chunk
    x = torch.randn(2, seq_len, 3)
    for r in range(world):
        positions = shard_positions(r, world, seq_len, layout=layout)
        assert positions.dtype == torch.int64 and positions.shape == (seq_len // world,)
        assert torch.equal(shard(x, r, world, layout=layout), x.index_select(-2, positions))
        if layout == "contiguous":
            assert positions.tolist() == list(range(r * 2 * chunk, (r + 1) * 2 * chunk))


@pytest.mark.parametrize("world", [1, 2, 4])
def test_work_counted_equals_pairs_per_rank(ranks, world):
    for case in _cases(world):
        method, layout, is_causal, _ = case
        for members in GROUPS[world]:
            counted = [ranks[r][world, case]["stats"].pairs_attended for r in members]
            if method == "ring":
                expected = pairs_per_rank(L, world, layout=layout, is_causal=is_causal)
                assert counted == [B * H * p for p in expected], case
            else:  # every rank: its H / W heads over the whole sequence
                full = L * (L + 1) // 2 if is_causal else L * L
                assert counted == [B * H // world * full] * world, case


@pytest.mark.parametrize("world", [2, 4])
def test_zigzag_balances_the_causal_work_that_contiguous_shards_skew(ranks, world):
    def stats(layout):
        case = ("ring", layout, True, H)
        return [ranks[r][world, case]["stats"] for r in GROUPS[world][0]]

    contiguous, zigzag = stats("contiguous"), stats("zigzag")
    assert max(s.pairs_attended for s in zigzag) < max(s.pairs_attended for s in contiguous)
    assert len({s.pairs_attended for s in zigzag}) == 1
    assert sum(s.pairs_attended for s in zigzag) == B * H * L * (L + 1) // 2
    assert [(s.blocks_computed, s.blocks_skipped) for s in contiguous] == [
        (r + 1, world - 1 - r) for r in range(world)]
    assert [(s.blocks_computed, s.blocks_skipped) for s in zigzag] == [
        (2 * world + 1, 2 * world - 1)] * world


def test_pairs_per_rank_in_closed_form():
    n, world = 6, 3
    contiguous = pairs_per_rank(n * world, world)
    assert contiguous == [n * n * r + n * (n + 1) // 2 for r in range(world)]
    c = n // 2
    balanced = c * c * (2 * world - 1) + c * (c + 1)
    assert pairs_per_rank(n * world, world, layout="zigzag") == [balanced] * world
    assert pairs_per_rank(8, 2, is_causal=False) == [32, 32]


def test_time_on_rank_times_a_training_step_and_in_turn_runs_each_experiment(ranks):
    for method, result in zip(("ring", "ulysses"), ranks[0]["in turn"]):
        assert 0 < result["seconds"] < 60
        formula = ring_bytes_per_rank if method == "ring" else ulysses_bytes_per_rank
        expected = formula(B, H, L, E, 4, 8, value_dim=EV)
        stats = result["stats"]
        assert (stats.bytes_sent, stats.bytes_sent_backward) == (
            expected["forward"], expected["backward"])
    # every rank waits for the slowest at the closing barrier: about the same time
    ring_times = [ranks[r]["in turn"][0]["seconds"] for r in range(4)]
    assert max(ring_times) < 10 * min(ring_times) + 0.05


# --------------------------------------------------------------------------------------
# Memory per GPU and the longest context
# --------------------------------------------------------------------------------------
LLAMA_3_8B = dict(n_params=8_030_261_248, n_layers=32, d_model=4096, d_ff=14336,
                  n_heads=32, n_kv_heads=8, head_dim=128)


def test_context_memory_by_hand():
    m = context_memory_bytes(8192, 4, **LLAMA_3_8B)
    n = 2048  # tokens per GPU
    assert m["weights"] == 2 * 8_030_261_248
    assert m["kv_cache"] == n * 32 * 2 * 8 * 128 * 2  # 128 KiB per token
    assert m["activations"] == n * (2 * 4096 + 2 * (32 + 8) * 128 + 3 * 14336) * 2
    assert m["in_flight"] == n * 4 * 8 * 128 * 2
    assert m["total"] == sum(m[t] for t in ("weights", "kv_cache", "activations",
                                            "in_flight"))
    assert m["scores"] == 32 * n * 8192 * 2  # not in the total: FlashAttention
    u = context_memory_bytes(8192, 4, method="ulysses", **LLAMA_3_8B)
    assert u["in_flight"] == n * (32 + 2 * 8) * 128 * 2
    assert {t: u[t] for t in ("weights", "kv_cache", "activations")} == {
        t: m[t] for t in ("weights", "kv_cache", "activations")}


def test_context_memory_refuses_what_cannot_be_split():
    with pytest.raises(ValueError, match="n_kv_heads=8 is not divisible by world=16"):
        context_memory_bytes(16 * 1024, 16, method="ulysses", **LLAMA_3_8B)
    with pytest.raises(ValueError, match="seq_len=1000 must split evenly over world=3"):
        context_memory_bytes(1000, 3, **LLAMA_3_8B)
    with pytest.raises(ValueError, match="method must be 'ring' or 'ulysses'"):
        context_memory_bytes(1024, 1, method="tree", **LLAMA_3_8B)


@pytest.mark.parametrize("world", [1, 2, 3, 8, 64])
def test_largest_context_fits_and_one_more_step_does_not(world):
    gpu = 80 * 10**9
    longest = largest_context(gpu, world, **LLAMA_3_8B)
    step = 1024 * world
    assert longest % step == 0 and longest > 0
    assert context_memory_bytes(longest, world, **LLAMA_3_8B)["total"] <= gpu
    assert context_memory_bytes(longest + step, world, **LLAMA_3_8B)["total"] > gpu
    # linear in the number of GPUs: world times what one GPU holds, up to rounding
    one = largest_context(gpu, 1, multiple=1, **LLAMA_3_8B)
    assert math.isclose(longest, world * one, rel_tol=0.02)


def test_largest_context_is_zero_when_the_weights_do_not_fit():
    assert largest_context(10 * 10**9, 8, **LLAMA_3_8B) == 0


@given(
    gpu_gb=st.integers(17, 200), world=st.sampled_from([1, 2, 4, 8]),
    multiple=st.integers(1, 4096), method=st.sampled_from(["ring", "ulysses"]),
)  # fmt: skip
def test_largest_context_for_any_memory_and_rounding(gpu_gb, world, multiple, method):
    """The longest multiple of ``multiple * world`` tokens that fits, and the total
    the weights plus a fixed cost per local token (linear in seq_len)."""
    gpu, step = gpu_gb * 10**9, multiple * world
    longest = largest_context(gpu, world, multiple=multiple, method=method, **LLAMA_3_8B)
    assert longest % step == 0

    def total(seq_len):
        return context_memory_bytes(seq_len, world, method=method, **LLAMA_3_8B)["total"]

    assert longest == 0 or total(longest) <= gpu
    assert total(longest + step) > gpu
    weights = 2 * LLAMA_3_8B["n_params"]
    assert total(3 * step) - weights == 3 * (total(step) - weights)


# --------------------------------------------------------------------------------------
# Bad input: every rank raises, none hangs
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [2, 4])
def test_bad_inputs_raise_clear_errors_on_every_rank(ranks, world):
    for members in GROUPS[world]:
        for i, rank in enumerate(members):
            errors = ranks[rank][world, "errors"]
            assert errors["heads"].startswith(
                f"ValueError: ulysses_attention: n_heads={world + 1} is not divisible by the "
                f"world size {world}")
            assert f"n_kv_heads={world // 2} is not divisible" in errors["kv_heads"]
            for name in ("uneven ring", "uneven ulysses"):
                assert errors[name].startswith("ValueError:") and (
                    "the shards differ in length across ranks: L_local = "
                    f"{[3] + [2] * (world - 1)}") in errors[name] and "pad" in errors[name]
            # one message on every rank: the failing rank and what is wrong there
            assert errors["one bad rank"] == ranks[members[0]][world, "errors"]["one bad rank"]
            assert "the inputs of rank(s) [1] of" in errors["one bad rank"]
            assert "rank 1: ring_attention: q and k must have the same last dimension" in (
                errors["one bad rank"])
            assert "local length must be even" in errors["zigzag odd"]
            assert "layout must be 'contiguous' or 'zigzag'" in errors["layout"]


def test_without_a_process_group_both_raise():
    assert not dist.is_initialized()
    x = torch.zeros(1, 2, 4, 3)
    for fn in (ring_attention, ulysses_attention):
        with pytest.raises(RuntimeError, match="needs an initialized process group"):
            fn(x, x, x)


def _fail_on_rank_1(rank, world):
    if rank == 1:
        raise KeyError("boom on rank 1")
    dist.barrier()  # waits for rank 1 forever: the launcher must stop it


def test_run_on_ranks_reports_a_failing_rank_and_stops_the_others():
    with pytest.raises(RuntimeError, match=r"rank 1 raised:(.|\n)*boom on rank 1"):
        run_on_ranks(_fail_on_rank_1, 2, timeout=60)
    with pytest.raises(ValueError, match="run_on_ranks: world_size must be an integer >= 1"):
        run_on_ranks(_fail_on_rank_1, 0)


def _die(rank, world):
    os._exit(3)


def _sleep(rank, world):
    time.sleep(60)


def test_run_on_ranks_gives_up_after_its_timeout():
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"no result from ranks \[0\] in 2 s"):
        run_on_ranks(_sleep, 1, timeout=2)
    assert time.monotonic() - start < 30  # the sleeping rank was stopped, not awaited


def test_run_on_ranks_reports_a_rank_that_dies_without_a_result():
    with pytest.raises(RuntimeError, match="rank 0 exited with code 3 without a result"):
        run_on_ranks(_die, 1, timeout=60)



def test_the_pure_functions_refuse_bad_sizes():
    """Regression: a fractional rank or world was used as is (float positions), world=0
    divided by zero in the closed forms."""
    import pytest

    from attnbook import distributed

    with pytest.raises(TypeError, match="shard_positions: rank must be an integer >= 0, got 1.5"):
        distributed.shard_positions(1.5, 4, 8)
    with pytest.raises(ValueError, match="pairs_per_rank: world must be a positive integer, got 0"):
        distributed.pairs_per_rank(8, 0)
    with pytest.raises(ValueError, match="ring_bytes_per_rank: world must be a positive integer, got 0"):
        distributed.ring_bytes_per_rank(1, 8, 1024, 64, 0, 2)
    with pytest.raises(ValueError, match="time_on_rank: method must be 'ring' or 'ulysses'"):
        distributed.time_on_rank(0, 1, *[torch.randn(1, 2, 4, 4)] * 3, method="tree")
