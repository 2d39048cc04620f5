"""The Triton kernels compiled for named GPUs, without one (attnbook.kernels.compile).

A representative subset is compiled here, in CI: every kernel the launch code lists
(``flash_triton.variants``, ``decode.variants``: forward, the three backward kernels, the block-sparse
forward at every block size, the decode split and merge kernels) for seven (target, dtype, head dim)
cases that cover a T4 (7.5), an A100 (8.0), an L4 (8.9) and an H100 (9.0), float16, bfloat16 and
float32 (the dtype whose tiles spill and overflow shared memory), head dims 64 and 128: 96 kernels,
about two minutes on two cores. The full matrix is ``benchmarks/bench_kernel_compile.py``, whose
table (``attnbook/kernels/compiled.json``) ``plan()`` reads. Each compiled kernel must agree with
that table (else the table is stale: rerun the benchmark with ``--write``), and every configuration
``plan()`` sends to Triton must fit: shared memory within the target's per-block limit; no spills in
float32; in float16/bfloat16 on 8.0+ at most ``HALF_SPILL_BOUND`` bytes per thread (measured: 8 bytes,
the dK/dV backward at head dim 64 on 8.6/8.9; zero everywhere else). On 7.5 (T4) float16 spills
(up to 7 KB: Triton computes ``tl.dot`` without tensor cores there); ``plan()`` says so.
"""

from __future__ import annotations

import pytest
import torch

from attnbook.kernels import _compiled, compiled_fit, plan
from attnbook.kernels import compile as kc

CASES = [
    (75, torch.float16, 64),
    (75, torch.float32, 128),
    (80, torch.float16, 128),
    (80, torch.bfloat16, 64),
    (89, torch.float16, 64),
    (89, torch.float32, 64),
    (90, torch.float16, 64),
    (90, torch.float32, 128),
]
HALF_SPILL_BOUND = 8  # bytes per thread, float16/bfloat16 on 8.0+ (see the module docstring)
DENSE = {"flash_fwd", "flash_bwd_delta", "flash_bwd_dkdv", "flash_bwd_dq", "decode_split", "decode_merge"}


@pytest.fixture(scope="module")
def compiled():
    return kc.compile_variants(CASES, processes=2)


def test_every_listed_kernel_compiles_for_every_target(compiled):
    kernels = {r.kernel for r in compiled}
    assert DENSE | {"block_sparse_fwd"} == kernels
    assert {(r.capability, r.dtype, r.head_dim) for r in compiled} == {
        (cc, str(d).removeprefix("torch."), e) for cc, d, e in CASES}
    assert all(r.registers > 0 for r in compiled)


def test_the_table_plan_reads_matches_a_fresh_compile(compiled):
    """Same Triton as the table: the same numbers. Another Triton: at least the same verdicts
    (fits or not), which is what plan() decides by."""
    import json
    from pathlib import Path

    import triton

    import attnbook.kernels

    table_version = json.loads((Path(attnbook.kernels.__file__).with_name("compiled.json")).read_text())["triton"]
    table = {(t["capability"], t["dtype"], t["head_dim"], t["label"]): t for t in _compiled()}
    stale = []
    for r in compiled:
        row = table.get((r.capability, r.dtype, r.head_dim, r.label))
        assert row is not None, f"{r.label} on sm{r.capability} ({r.dtype}) is not in compiled.json"
        fresh = (r.shared, r.registers, r.local + r.stack)
        if triton.__version__ == table_version:
            same = (row["shared"], row["registers"], row["spill"]) == fresh
        else:
            limit = kc.TARGETS[r.capability].shared
            same = (row["shared"] > limit, row["spill"] > 0) == (r.shared > limit, fresh[2] > 0)
        if not same:
            stale.append((r.capability, r.dtype, r.head_dim, r.label, row, fresh))
    assert not stale, f"compiled.json is stale: run benchmarks/bench_kernel_compile.py --write: {stale[:3]}"


def test_what_plan_sends_to_triton_fits_its_target(compiled):
    for r in compiled:
        if r.kernel not in DENSE:
            continue
        kernel = "flash" if r.kernel.startswith("flash") else "decode"
        capability = divmod(r.capability, 10)
        dtype = getattr(torch, r.dtype)
        backend, why = plan(kernel, capability, dtype, r.head_dim)
        ok, reason = kc.fits(r)
        if backend == "triton":
            shared_ok = r.shared <= kc.TARGETS[r.capability].shared
            assert shared_ok, f"plan sends {r.label} to Triton on sm{r.capability}: {reason}"
            spill = r.local + r.stack
            if r.dtype == "float32":
                assert ok, f"plan sends {r.label} to Triton on sm{r.capability}: {reason}"
            elif r.capability >= 80:
                assert spill <= HALF_SPILL_BOUND, f"{r.label} on sm{r.capability} spills {spill} bytes"
        else:
            assert compiled_fit(kernel, capability, dtype, r.head_dim) is not None or "head_dim" in why


def test_plan_names_the_kernel_and_the_limit_when_it_falls_back():
    misfits = [row for row in _compiled() if row["kernel"] in DENSE and row["dtype"] == "float32"
               and row["shared"] > kc.TARGETS[row["capability"]].shared]
    assert misfits, "the table should record float32 tiles that overflow shared memory"
    row = misfits[0]
    kernel = "flash" if row["kernel"].startswith("flash") else "decode"
    backend, why = plan(kernel, divmod(row["capability"], 10), torch.float32, row["head_dim"])
    assert backend == "torch" and row["kernel"] in why and "KiB" in why and "would not launch" in why


def test_fits_names_shared_memory_and_spills():
    base = dict(kernel="k", label="k[]", capability=75, dtype="float32", head_dim=128, registers=255)
    assert kc.fits(kc.Resources(shared=1024, local=0, stack=0, **base)) == (True, "fits")
    ok, why = kc.fits(kc.Resources(shared=70 * 1024, local=0, stack=0, **base))
    assert not ok and "70 KiB" in why and "64 KiB" in why
    ok, why = kc.fits(kc.Resources(shared=1024, local=0, stack=504, **base))
    assert not ok and "spills 504 bytes" in why
