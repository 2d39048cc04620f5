"""The tile configurations and the autotuner (attnbook.kernels.tuning), without a GPU.

`pick` is timed with a fake clock here; `candidates` is read from the compiled table, so these
tests pin the pruning rule: only configurations within the target's shared memory, and without
spills unless asked, are ever offered to the autotuner.
"""

import pytest
import torch

from attnbook.kernels import compile as kc
from attnbook.kernels import tuning
from attnbook.kernels.tuning import SPACE, Config


class OutOfResources(Exception):
    """Stands in for triton.runtime.errors.OutOfResources (matched by name)."""


@pytest.fixture(autouse=True)
def fresh_choices(monkeypatch):
    monkeypatch.setattr(tuning, "_CHOSEN", {})


def test_pick_launches_each_configuration_times_it_and_keeps_the_fastest():
    configs = [Config(64, 64), Config(32, 32), Config(16, 16)]
    cost = {Config(64, 64): 3.0, Config(32, 32): 1.0, Config(16, 16): 2.0}
    launched = []

    def timer(fn):
        fn()
        return cost[launched[-1]]

    best = tuning.pick(("k", 1), configs, launched.append, timer=timer)
    assert best == Config(32, 32) and launched == configs + configs  # compile, then time
    assert tuning.pick(("k", 1), configs, launched.append, timer=timer) == best and len(launched) == 6
    assert tuning.tuned() == {("k", 1): best}


class Compiled:
    """Stands in for Triton's compiled kernel: what a launch returns."""

    def __init__(self, n_spills):
        self.n_spills = n_spills


def test_pick_passes_over_a_configuration_whose_compiled_kernel_spills():
    spills = {Config(64, 64): 8, Config(32, 32): 0}
    fast_but_spilling = {Config(64, 64): 0.5, Config(32, 32): 1.0}
    current = []

    def run(config):
        current.append(config)
        return Compiled(spills[config])

    best = tuning.pick(("k", 7), list(spills), run, timer=lambda fn: fn() or fast_but_spilling[current[-1]])
    assert best == Config(32, 32)
    every_one_spills = {Config(64, 64): 8, Config(32, 32): 16}
    best = tuning.pick(("k", 8), list(every_one_spills), lambda c: Compiled(every_one_spills[c]),
                       timer=lambda fn: 1.0)
    assert best in every_one_spills  # all spill: the fastest of them still runs


def test_pick_skips_configurations_the_gpu_refuses_and_runs_a_single_one_untimed():
    def run(config):
        if config.block_m == 64:
            raise OutOfResources("shared memory")

    best = tuning.pick(("k", 2), [Config(64, 64), Config(32, 32)], run, timer=lambda fn: fn() or 1.0)
    assert best == Config(32, 32)
    assert tuning.pick(("k", 3), [Config(16, 16)], run, timer=None) == Config(16, 16)
    assert ("k", 3) not in tuning.tuned()
    with pytest.raises(RuntimeError, match="no configuration"):
        tuning.pick(("k", 4), [Config(64, 64), Config(64, 32)], run, timer=lambda fn: fn() or 1.0)
    with pytest.raises(ValueError, match="no configuration"):
        tuning.pick(("k", 5), [], run)


def test_a_launch_error_that_is_not_about_resources_is_not_hidden():
    def run(config):
        raise TypeError("a bug")

    with pytest.raises(TypeError, match="a bug"):
        tuning.pick(("k", 6), [Config(64, 64), Config(32, 32)], run, timer=lambda fn: fn())


@pytest.mark.parametrize("head_dim, padded", [(8, 16), (16, 16), (17, 32), (40, 64), (80, 128), (96, 128),
                                              (112, 128), (160, 256), (256, 256)])
def test_head_dims_are_padded_to_a_power_of_two_of_at_least_16(head_dim, padded):
    assert tuning.padded_head_dim(head_dim) == padded


@pytest.mark.parametrize("capability", [(7, 5), (8, 0), (8, 6), (8, 9), (9, 0)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("head_dim", [64, 256])
def test_candidates_fit_the_shared_memory_and_do_not_spill(capability, dtype, head_dim):
    cc = capability[0] * 10 + capability[1]
    for kernel in ("flash_fwd", "flash_bwd_dkdv", "flash_bwd_dq", "block_sparse_bwd_dq"):
        offered = tuning.candidates(kernel, capability, dtype, head_dim)
        if dtype == torch.float16 and cc >= 80 and head_dim == 64:
            assert len(offered) >= 2, f"{kernel} on sm{cc}: float16 at head dim 64 should have tiles that fit"
        family = "fwd" if kernel.endswith("fwd") else "bwd"
        assert {config for config, _ in offered} <= set(SPACE[family])
        for config, row in offered:
            assert row["shared"] <= kc.TARGETS[cc].shared and row["spill"] == 0, (kernel, config, row)
        with_spills = tuning.candidates(kernel, capability, dtype, head_dim, allow_spills=True)
        assert offered == [entry for entry in with_spills if entry[1]["spill"] == 0]
        assert all(row["shared"] <= kc.TARGETS[cc].shared for _, row in with_spills)


def test_an_unmeasured_newer_gpu_uses_the_nearest_older_measurement():
    assert tuning._measured_target((8, 7)) == 86
    assert tuning._measured_target((12, 0)) == 90
    assert tuning._measured_target((6, 1)) is None
    assert tuning.candidates("flash_fwd", (6, 1), torch.float16, 64) == []


def test_pick_without_autotuning_compiles_up_to_the_first_clean_configuration(monkeypatch):
    """``ATTNBOOK_AUTOTUNE=0`` (the GPU check's correctness runs): no timing, and no
    configuration compiled past the first that launches without spilling."""
    monkeypatch.setenv("ATTNBOOK_AUTOTUNE", "0")
    spills = {Config(128, 64): None, Config(64, 64): 8, Config(32, 32): 0, Config(16, 16): 0}
    launched = []

    def run(config):
        launched.append(config)
        if spills[config] is None:
            raise OutOfResources("shared memory")
        return Compiled(spills[config])

    def timer(fn):
        raise AssertionError("ATTNBOOK_AUTOTUNE=0 times nothing")

    best = tuning.pick(("k", 9), list(spills), run, timer=timer)
    assert best == Config(32, 32) and launched == [Config(128, 64), Config(64, 64), Config(32, 32)]
    assert tuning.tuned()[("k", 9)] == best
    every_one_spills = {Config(64, 64): 8, Config(32, 32): 16}
    best = tuning.pick(("k", 10), list(every_one_spills), lambda c: Compiled(every_one_spills[c]))
    assert best == Config(64, 64)  # all spill: the first still runs
