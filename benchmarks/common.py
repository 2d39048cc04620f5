"""Helpers shared by the benchmark scripts (run them as ``python benchmarks/bench_*.py``)."""

from __future__ import annotations

import warnings

import torch

from attnbook.complexity import loglog_slope


def slope_text(x: list[float], y: list[float]) -> str:
    """Fitted log-log slope over the points with a positive reading, as text, or ``n/a``."""
    pairs = [(a, b) for a, b in zip(x, y) if b > 0]
    if len(pairs) < 2:
        return "n/a"
    return f"{loglog_slope(*zip(*pairs)):.2f}"


def record(series: dict, n: int, measurement: dict) -> None:
    """Append one ``attnbook.complexity.measure`` result to ``series = {"n", "time_s", "peak_bytes"}``.

    Time is the best of the runs: robust to other load on the machine. Memory 0 means unreadable.
    """
    series["n"].append(n)
    series["time_s"].append(measurement["min_s"])
    series["peak_bytes"].append(measurement["peak_bytes"] or 0)


#: The flex_attention warning that says it runs unfused: eager, or dynamo gave up compiling.
UNFUSED = "flex_attention called without torch.compile"


def raise_recompile_limit(shapes: int) -> None:
    """Let dynamo compile one FlexAttention graph per shape the benchmark times: past its
    recompile limit (8 by default) it silently runs flex_attention eagerly, unfused. Past
    the raised limit it raises instead, where this torch has the switch."""
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 4 * shapes))
    if hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
        torch._dynamo.config.fail_on_recompile_limit_hit = True


def fused_only(fn):
    """``fn`` that raises instead of running FlexAttention unfused: flex_attention warns
    when it runs without torch.compile (eager, or after dynamo gave up on a shape), and a
    benchmark must never print that path's time as FlexAttention's."""
    def call(*args, **kwargs):
        from torch.nn.attention import flex_attention as module

        # torch warns once per process: forget that it did, so every unfused call warns
        getattr(module, "_WARNINGS_SHOWN", set()).discard("flex_attention_performance")
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=UNFUSED)
            try:
                return fn(*args, **kwargs)
            except UserWarning as err:
                raise RuntimeError(f"FlexAttention ran unfused, not compiled: {err}") from None
    return call


def flex_kernel_options(block_mask, device) -> dict | None:
    """FlexAttention's GPU kernel needs its tiles to divide the ``BlockMask``'s blocks: on
    an H200 (torch 2.11) it chose 128-row tiles for 64-row blocks and refused to compile
    ("Q and KV block size must be divisible by BLOCK_M and BLOCK_N"). Tiles of the mask's
    own block size where it is below 128 on ``device``, a GPU; ``None``, torch's choice,
    elsewhere."""
    q_block, kv_block = block_mask.BLOCK_SIZE
    if torch.device(device).type != "cuda" or min(q_block, kv_block) >= 128:
        return None
    return {"BLOCK_M": q_block, "BLOCK_N": kv_block}
