"""Helpers shared by the benchmark scripts (run them as ``python benchmarks/bench_*.py``)."""

from __future__ import annotations

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
