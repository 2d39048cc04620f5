"""benchmarks/bench_block_sparse.py at small sizes: the numbers the sparse chapter quotes come from it, so its
arithmetic is checked here (the kernel floor's problems hold exactly the ordinary rows' scores, the report's ratios
are the timed ones), not only that it runs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from attnbook.sparse import bigbird_block_mask
from scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    return load_script(ROOT / "benchmarks" / "bench_block_sparse.py")


def test_row_problems_hold_the_scores_of_the_rows_with_the_most_common_block_count(bench):
    blocks = bigbird_block_mask(12, generator=torch.Generator().manual_seed(0))
    q = torch.randn(1, 3, 12 * 8, 4)
    (qr, kr, vr), share = bench.row_problems(blocks, 8, q, torch.Generator().manual_seed(1))
    counts = blocks.sum(dim=-1)
    c = int(counts.mode().values)
    rows = int((counts == c).sum())
    assert c == 7 and qr.shape == (1, 3 * rows, 8, 4) and kr.shape == vr.shape == (1, 3 * rows, c * 8, 4)
    scores = int(blocks[counts == c].sum()) * 3 * 8 * 8  # the kept tiles of those rows, every head
    assert 3 * rows * 8 * c * 8 == scores and math.isclose(share, scores / (3 * 96 * 96))


def test_the_benchmark_runs_small_and_reports_its_own_timings(bench, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # the report's header only
    args = bench.parse_args(["--min-log2-n", "8", "--max-log2-n", "10", "--no-flex", "--repeat", "1",
                             "--device", "cpu"])
    with torch.no_grad():
        results = bench.run(args)
    assert results["n"] == [256, 512, 1024] and max(results["max_err"]) < 1e-5
    text = bench.report(results, args)
    i = -1
    floor = results["rows_s"][i] / results["unmasked_s"][i] / results["row_share"][i]
    assert math.isclose(bench.kernel_floor(results, i), floor)
    to_limit = results["sparse_s"][i] / (results["density"][i] * results["unmasked_s"][i])
    assert f"sparse/limit = {to_limit:.2f}" in text
    assert f"takes {floor:.2f}x unmasked SDPA's time per score" in text.splitlines()[-1]


def test_the_sweep_reports_one_rate_per_query_count(bench):
    args = bench.parse_args(["--max-log2-n", "10", "--min-log2-n", "8", "--repeat", "1", "--device", "cpu"])
    with torch.no_grad():
        text = bench.sweep(args, queries=(32, 64))
    lines = text.splitlines()
    assert "against 448 keys" in lines[0] and len(lines) == 3
    assert all(float(line.split(":")[1]) > 0 for line in lines[1:])
