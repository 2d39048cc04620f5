"""benchmarks/bench_flash.py's GPU table, run here on the CPU at tiny sizes: the numbers the GPU
report commits come from it, so its arithmetic (ratios, geometric means, the error column of both
passes) and its refusal to time FlexAttention unfused are checked without a GPU."""

from __future__ import annotations

import math
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    return load_script(ROOT / "benchmarks" / "bench_flash.py")


def test_flexattention_is_never_timed_unfused(bench):
    """flex_attention called eagerly, or by dynamo after it gave up on a shape, warns that
    it runs unfused: the benchmark's wrapper turns that into an error."""
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.randn(1, 1, 16, 8)
    for _ in range(2):  # torch warns once per process: every unfused call must still raise
        with pytest.raises(RuntimeError, match="unfused"):
            bench.fused_only(flex_attention)(q, q, q)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the wrapper lets other calls through untouched
        out = bench.fused_only(F.scaled_dot_product_attention)(q, q, q)
    assert torch.equal(out, F.scaled_dot_product_attention(q, q, q))


def test_the_recompile_limit_covers_every_shape(bench, monkeypatch):
    import torch._dynamo

    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 8)
    monkeypatch.setattr(torch._dynamo.config, "fail_on_recompile_limit_hit", False)
    bench.raise_recompile_limit(40)
    assert torch._dynamo.config.recompile_limit >= 40
    bench.raise_recompile_limit(1)  # never lowered
    assert torch._dynamo.config.recompile_limit >= 40
    assert torch._dynamo.config.fail_on_recompile_limit_hit  # past it: an error, not eager


def test_the_matrix_is_the_one_the_issue_names(bench):
    full = bench.matrix(bench.parse_args(["--device", "cuda"]))
    assert {p["dtype"] for p in full} == {"float16", "bfloat16"}
    assert {p["head_dim"] for p in full} == {64, 128}
    assert {p["n"] for p in full} == {1024, 2048, 4096, 8192, 16384}
    assert {p["causal"] for p in full} == {False, True}
    filled = [p for p in full if p["batch"] > 1]
    assert all(p["batch"] * p["heads"] * p["n"] >= 65536 for p in filled)
    assert len(full) == 2 * 2 * 2 * (5 + 2)  # from n = 4096 on, batch 1 fills it already
    quick = bench.matrix(bench.parse_args(["--device", "cuda", "--quick"]))
    assert [(p["n"], p["causal"]) for p in quick] == [(1024, False), (4096, False), (1024, True),
                                                       (4096, True)]  # fmt: skip


def test_the_table_reports_its_own_timings_and_both_errors(bench, monkeypatch):
    """On the CPU at tiny sizes (the Triton kernels in the interpreter, float16), with
    SDPA standing in for compiled FlexAttention: every ratio is the timed one, the
    geometric means are those of the rows, and the forward + backward rows carry the
    gradients' error (it printed nan)."""
    points = [dict(dtype="float16", head_dim=16, causal=c, batch=1, heads=2, n=n)
              for c in (False, True) for n in (16, 40)]  # fmt: skip
    monkeypatch.setattr(bench, "matrix", lambda args: points)
    monkeypatch.setattr(bench, "flex_attention_fn", lambda causal, n, device: bench.fused_only(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)))

    def timer(fn, backward, repeat):
        start = time.perf_counter()
        out = fn()
        if backward:
            out.backward(torch.ones_like(out))
        return time.perf_counter() - start

    args = bench.parse_args(["--device", "cpu", "--repeat", "1"])
    result = bench.gpu_table(args, timer=timer)
    rows = result["rows"]
    assert len(rows) == 2 * len(points)
    for row in rows:
        t = row["tflops"]
        assert math.isclose(row["speed_vs_sdpa"], t["triton"] / t["sdpa"])
        assert math.isclose(row["speed_vs_flex"], t["triton"] / t["flex"])
        assert 0 <= row["max_err"] < 0.05  # a number in both passes, within the rule
    for name in ("fwd", "fwd+bwd"):
        mine = [r["speed_vs_sdpa"] for r in rows if r["pass"] == name]
        s = result["summary"][name]["speed_vs_sdpa"]
        assert math.isclose(s["geomean"], math.prod(mine) ** (1 / len(mine)))
        assert s["min"] == min(mine)


def test_flexattention_tiles_divide_the_block_masks_blocks():
    """FlexAttention on a GPU refused 64-row BlockMask blocks with its own 128-row tiles
    (the GPU check's bench_block_sparse); the benchmarks ask for the mask's block size
    there, and leave torch's choice alone on the CPU and for blocks of 128."""
    from torch.nn.attention.flex_attention import create_block_mask

    from common import flex_kernel_options

    def causal(b, h, i, j):
        return j <= i

    small = create_block_mask(causal, None, None, 256, 256, device="cpu", BLOCK_SIZE=64)
    assert flex_kernel_options(small, "cuda") == {"BLOCK_M": 64, "BLOCK_N": 64}
    assert flex_kernel_options(small, "cpu") is None
    large = create_block_mask(causal, None, None, 256, 256, device="cpu")
    assert flex_kernel_options(large, torch.device("cuda", 0)) is None


def test_the_triton_tutorial_is_a_third_column_where_it_applies(bench, monkeypatch, tmp_path):
    """--tutorial loads attention(q, k, v, causal, sm_scale) from a file (here a stand-in with
    the tutorial's signature) and times it beside the rest on the points it takes; the summary
    counts the points where the book's kernels are slower."""
    stand_in = tmp_path / "fused_attention.py"
    stand_in.write_text(
        "import torch.nn.functional as F\n"
        "def attention(q, k, v, causal, sm_scale):\n"
        "    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale)\n"
    )
    points = [dict(dtype="float16", head_dim=16, causal=True, batch=1, heads=2, n=n) for n in (40, 128)]
    monkeypatch.setattr(bench, "matrix", lambda args: points)
    monkeypatch.setattr(bench, "flex_attention_fn", lambda causal, n, device: None)

    def timer(fn, backward, repeat):
        start = time.perf_counter()
        out = fn()
        if backward:
            out.backward(torch.ones_like(out))
        return time.perf_counter() - start

    args = bench.parse_args(["--device", "cpu", "--repeat", "1", "--tutorial", str(stand_in)])
    result = bench.gpu_table(args, timer=timer)
    by_n = {(r["n"], r["pass"]): r for r in result["rows"]}
    assert math.isnan(by_n[40, "fwd"]["tflops"]["tutorial"])  # not a multiple of 128: not timed
    timed = by_n[128, "fwd"]
    assert math.isclose(timed["speed_vs_tutorial"], timed["tflops"]["triton"] / timed["tflops"]["tutorial"])
    s = result["summary"]["fwd"]["speed_vs_tutorial"]
    assert s["points"] == 1 and s["slower_at"] == int(timed["speed_vs_tutorial"] < 1)
    with pytest.raises(FileNotFoundError, match="--tutorial"):
        bench.load_tutorial(str(tmp_path / "missing.py"))
