"""The Triton kernels compiled for named GPUs, without one (attnbook.kernels.compile).

A representative subset is compiled here, in CI: every kernel the launch code lists
(``flash_triton.variants``, ``decode.variants``: the forward and the dK/dV and dQ backward kernels,
dense and block-sparse, each in every tile configuration of the autotuner's space
``tuning.SPACE``, the backward pre-pass, the decode split and merge kernels) for cases that cover
a T4 (7.5), an A100 (8.0), an L4 (8.9) and an H100 (9.0), float16, bfloat16 and float32 (where
plan() sends it to PyTorch and where to Triton), head dims 32, 64, 128 and 256, and head dim 96
(padded to 128 with masked columns). The full matrix is
``benchmarks/bench_kernel_compile.py``, whose table (``attnbook/kernels/compiled.json``) the
autotuner's pruning and ``plan()`` read. Each compiled kernel must agree with that table (else
the table is stale: rerun the benchmark with ``--write``), and every configuration the autotuner
may choose on a target must fit it: shared memory within the per-block limit and no register
spills, in every dtype. (On 7.5, the T4, Triton computes ``tl.dot`` without tensor cores and
every float16 tile of head dim 64 and up spills; there ``plan()`` still runs float16 on Triton,
with the tiles that spill least, and says so.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import attnbook.kernels
from attnbook.kernels import LAUNCHED, compiled_fit, plan, tuning
from attnbook.kernels import compile as kc

CASES = [
    (75, torch.float16, 64),
    (80, torch.bfloat16, 256),
    (80, torch.float16, 96),  # padded to 128: the masked columns compile and fit like 128's
    (89, torch.float16, 128),
    (89, torch.float32, 64),  # float32 that plan() sends to PyTorch (its dK/dV tiles spill)
    (80, torch.float32, 32),  # float32 that plan() sends to Triton: its tiles must fit
    (90, torch.float16, 64),
]
# A head dim that is not a power of two compiles with masked columns, which may cost a few more
# registers than the padded width the table measures: measured, 8 bytes of stack in the 128 x 64
# block-sparse forward at head dim 96 on sm80. The autotuner passes over such a tile on the GPU
# (tuning.pick reads the compiled kernel's n_spills).
PADDED_SPILL_BOUND = 8
TABLE = json.loads(Path(attnbook.kernels.__file__).with_name("compiled.json").read_text())


@pytest.fixture(scope="module")
def compiled():
    return kc.compile_variants(CASES, processes=2)


def test_every_kernel_in_every_configuration_of_the_space_compiles(compiled):
    names = {r.kernel for r in compiled}
    assert names == {name for launched in LAUNCHED.values() for name in launched}
    for kernel in names - {"flash_bwd_delta", "decode_split", "decode_merge"}:
        family = "fwd" if kernel.endswith("fwd") else "bwd"
        configs = {r.config for r in compiled if r.kernel == kernel and r.head_dim == 64}
        assert configs == {tuple(vars(c).values()) for c in tuning.SPACE[family]}, kernel
    assert {(r.capability, r.dtype, r.head_dim) for r in compiled} == {
        (cc, str(d).removeprefix("torch."), e) for cc, d, e in CASES}
    assert all(r.registers > 0 for r in compiled)


def test_the_table_matches_a_fresh_compile(compiled):
    """Same Triton as the table: the same numbers. Another Triton: at least the same verdicts
    (fits or not), which is what the pruning and plan() decide by."""
    import triton

    table = {(t["capability"], t["dtype"], t["head_dim"], t["label"]): t for t in TABLE["kernels"]}
    stale = []
    for r in compiled:
        if r.head_dim != tuning.padded_head_dim(r.head_dim):
            continue  # the table holds the padded widths
        row = table.get((r.capability, r.dtype, r.head_dim, r.label))
        assert row is not None, f"{r.label} on sm{r.capability} ({r.dtype}) is not in compiled.json"
        fresh = (r.shared, r.registers, r.local + r.stack)
        if triton.__version__ == TABLE["triton"]:
            same = (row["shared"], row["registers"], row["spill"]) == fresh
        else:
            limit = kc.TARGETS[r.capability].shared
            same = (row["shared"] > limit, row["spill"] > 0) == (r.shared > limit, fresh[2] > 0)
        if not same:
            stale.append((r.capability, r.dtype, r.head_dim, r.label, row, fresh))
    assert not stale, f"compiled.json is stale: run benchmarks/bench_kernel_compile.py --write: {stale[:3]}"


def test_what_the_autotuner_may_choose_fits_its_target(compiled):
    """For every case plan() sends to Triton, each launched kernel has candidates, and each
    candidate, compiled afresh (at head dim 96 too, not only the padded 128), fits: shared memory
    within the limit and no spills (at most PADDED_SPILL_BOUND bytes at head dim 96; on 7.5 the
    least-spilling tiles, as plan() says)."""
    fresh = {(r.capability, r.dtype, r.head_dim, r.kernel, r.config): r for r in compiled}
    checked = 0
    for cc, dtype, head_dim in CASES:
        capability = divmod(cc, 10)
        for kernel, launched in LAUNCHED.items():
            backend, why = plan(kernel, capability, dtype, head_dim, block_size=64)
            if backend != "triton":
                assert compiled_fit(kernel, capability, dtype, head_dim, 64) is not None, why
                continue
            for name in launched:
                offered = tuning.candidates(name, capability, dtype, head_dim)
                spills = not offered and cc < 80 and dtype != torch.float32
                if spills:
                    offered = tuning.candidates(name, capability, dtype, head_dim, allow_spills=True)
                if name.startswith("decode"):
                    assert offered == [], "decode kernels have one form: all of it must fit"
                    rows = [r for key, r in fresh.items() if key[:4] == (cc, str(dtype)[6:], head_dim, name)]
                    assert rows and all(kc.fits(r)[0] for r in rows), (name, cc, dtype)
                    continue
                assert offered, f"plan sends {kernel} to Triton on sm{cc} but {name} has no candidate"
                for config, _ in offered:
                    r = fresh[(cc, str(dtype)[6:], head_dim, name, tuple(vars(config).values()))]
                    assert r.shared <= kc.TARGETS[cc].shared, f"{r.label} on sm{cc}: {kc.fits(r)[1]}"
                    bound = 0 if head_dim == tuning.padded_head_dim(head_dim) else PADDED_SPILL_BOUND
                    assert spills or r.local + r.stack <= bound, f"{r.label} on sm{cc} spills"
                    checked += 1
    assert checked > 50


def test_plan_names_the_kernel_and_the_limit_when_it_falls_back():
    limits = {cc: t.shared for cc, t in kc.TARGETS.items()}
    over = [row for row in TABLE["kernels"] if row["dtype"] == "float32" and row["kernel"] == "flash_bwd_dq"
            and row["head_dim"] == 256 and row["shared"] > limits[row["capability"]]]
    assert over, "float32 at head dim 256 should overflow some target's shared memory"
    for row in over:
        misfit = compiled_fit("flash", divmod(row["capability"], 10), torch.float32, 256)
        assert misfit is not None
        backend, why = plan("flash", divmod(row["capability"], 10), torch.float32, 256)
        assert backend == "torch" and why == misfit[1] + (
            ": it would not launch" if misfit[0] == "shared" else ": slower than PyTorch")
        assert "flash_" in why and ("KiB" in why or "spills" in why)


def test_fits_names_shared_memory_and_spills():
    base = dict(kernel="k", label="k[]", capability=75, dtype="float32", head_dim=128, registers=255)
    assert kc.fits(kc.Resources(shared=1024, local=0, stack=0, **base)) == (True, "fits")
    ok, why = kc.fits(kc.Resources(shared=70 * 1024, local=0, stack=0, **base))
    assert not ok and "70 KiB" in why and "64 KiB" in why
    ok, why = kc.fits(kc.Resources(shared=1024, local=0, stack=504, **base))
    assert not ok and "spills 504 bytes" in why

