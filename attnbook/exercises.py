"""Auto-checks for the chapters' exercises.

A chapter's coding exercise ends with ``attnbook.exercises.check("<label>", student_object)``. The
check compares the student's object with the tested implementation in ``attnbook`` (or with a
property) and prints a clear pass/fail line with a hint. Checks are registered by label with
:func:`register`; labels are ``chNN-short-name`` and equal the ``{exercise}`` label in the chapter.

When the environment variable ``ATTNBOOK_GRADE_LOG`` names a file, every check also appends one
JSON line ``{"label", "passed", "message"}`` to it: that is how ``python -m attnbook.course grade``
learns what passed without parsing printed text.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable

import torch

from .utils import largest_new_tensor

__all__ = ["CheckResult", "register", "check", "labels", "CHECKS"]


@dataclass(frozen=True)
class CheckResult:
    label: str
    passed: bool
    message: str

    def __bool__(self) -> bool:
        return self.passed

    def _ipython_display_(self) -> None:
        """Display nothing in a notebook: :func:`check` has already printed the verdict."""


@dataclass(frozen=True)
class _Check:
    fn: Callable[[object], None]
    hint: str


CHECKS: dict[str, _Check] = {}


def register(label: str, hint: str) -> Callable:
    """Register ``fn(student_object)`` as the check for ``label``; it raises ``AssertionError`` on a wrong answer."""

    def decorator(fn: Callable[[object], None]) -> Callable[[object], None]:
        if label in CHECKS:
            raise ValueError(f"exercise label {label!r} is registered twice")
        CHECKS[label] = _Check(fn, hint)
        return fn

    return decorator


def labels() -> list[str]:
    """All registered exercise labels, sorted."""
    return sorted(CHECKS)


def _log(result: CheckResult) -> None:
    path = os.environ.get("ATTNBOOK_GRADE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"label": result.label, "passed": result.passed, "message": result.message}) + "\n")


def check(label: str, student: object) -> CheckResult:
    """Run the check registered for ``label`` on the student's object and print the verdict."""
    if label not in CHECKS:
        raise ValueError(f"unknown exercise label {label!r}; known labels: {', '.join(labels())}")
    entry = CHECKS[label]
    try:
        entry.fn(student)
        result = CheckResult(label, True, "passed")
    except NotImplementedError:
        result = CheckResult(label, False, "not attempted yet: replace the `raise NotImplementedError` with your code")
    except AssertionError as err:
        result = CheckResult(label, False, f"{err} Hint: {entry.hint}".strip())
    except Exception as err:  # a crash in student code is a failed check, never a crashed notebook
        result = CheckResult(label, False, f"your code raised {type(err).__name__}: {err}. Hint: {entry.hint}")
    mark = "PASSED" if result.passed else "FAILED"
    print(f"[{mark}] {label}: {result.message}")
    _log(result)
    return result


# ---------------------------------------------------------------------------------------------
# Helpers shared by the checks
# ---------------------------------------------------------------------------------------------
def _assert_close(actual, expected, what: str, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    actual = torch.as_tensor(actual)
    expected = torch.as_tensor(expected)
    assert actual.shape == expected.shape, f"{what}: expected shape {tuple(expected.shape)}, got {tuple(actual.shape)}."
    assert torch.allclose(actual.double(), expected.double(), atol=atol, rtol=rtol), (
        f"{what}: values differ (max abs error {(actual.double() - expected.double()).abs().max().item():.3g})."
    )


def _is_number(x) -> bool:
    """A real Python or NumPy scalar, not a bool and not a tensor."""
    import numbers

    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _real_number(value, what: str) -> float:
    """``value`` as a float if it is a real number (int, float, NumPy scalar; not a bool or a tensor)."""
    assert _is_number(value), f"{what}: return a number (int or float), got {type(value).__name__} {value!r}."
    return float(value)


def _assert_int(value, what: str, noun: str = "an int") -> None:
    """Fail unless ``value`` is a Python int (not a bool, a float or a tensor): exact counts are ints."""
    assert isinstance(value, int) and not isinstance(value, bool), (
        f"{what}: return {noun}, got {type(value).__name__} {value!r}.")


# ---------------------------------------------------------------------------------------------
# Chapter 1: attention fundamentals
# ---------------------------------------------------------------------------------------------
@register(
    "ch01-masked-softmax",
    hint="divide by the temperature, fill masked scores with -inf, subtract the row maximum before exp, "
    "and set rows with no allowed key to zero (their maximum is -inf).",
)
def _check_ch01_masked_softmax(student) -> None:
    """``student(scores, mask=None, temperature=1.0)`` must equal :func:`attnbook.core.masked_softmax`."""
    from .core import masked_softmax

    gen = torch.Generator().manual_seed(101)
    scores = torch.randn(2, 3, 5, 7, generator=gen) * 3
    mask = torch.rand(2, 1, 5, 7, generator=gen) > 0.3
    mask[0, 0, 2] = False  # a query with nothing to attend to
    cases = [
        ("no mask, T = 1", (scores,), {}, masked_softmax(scores)),
        ("temperature 0.5", (scores,), {"temperature": 0.5}, masked_softmax(scores, temperature=0.5)),
        ("boolean mask, T = 2", (scores, mask), {"temperature": 2.0}, masked_softmax(scores, mask, 2.0)),
        ("scores around 1000 (overflow test)", (scores + 1000.0, mask), {}, masked_softmax(scores + 1000.0, mask)),
    ]
    for what, args, kwargs, expected in cases:
        actual = student(*args, **kwargs)
        assert isinstance(actual, torch.Tensor), f"{what}: return a torch.Tensor, got {type(actual).__name__}."
        assert not torch.isnan(actual).any(), f"{what}: your weights contain NaN."
        _assert_close(actual, expected, what)


@register(
    "ch01-multi-head",
    hint="project with mha.q_proj / k_proj / v_proj, reshape (B, T, d_model) -> (B, T, h, d_model // h) and "
    "transpose to (B, h, T, head_dim), attend per head, transpose back, reshape to (B, L, d_model), apply out_proj.",
)
def _check_ch01_multi_head(student) -> None:
    """``student(mha, x, context=None)`` must equal ``mha(x, context)`` for self- and cross-attention."""
    from .core import MultiHeadAttention

    gen = torch.Generator().manual_seed(102)
    for d_model, n_heads, L, S in [(8, 1, 3, 3), (12, 3, 5, 5), (16, 4, 4, 6)]:
        with torch.random.fork_rng(devices=[]):  # seed the layer's initial weights, leave the caller's RNG alone
            torch.manual_seed(d_model)
            mha = MultiHeadAttention(d_model, n_heads).eval()
        x = torch.randn(2, L, d_model, generator=gen)
        context = torch.randn(2, S, d_model, generator=gen)
        with torch.no_grad():
            if L == S:
                _assert_close(student(mha, x), mha(x), f"self-attention, d_model={d_model}, n_heads={n_heads}")
            _assert_close(student(mha, x, context), mha(x, context),
                          f"cross-attention, d_model={d_model}, n_heads={n_heads}, L={L}, S={S}")




@register(
    "ch01-sqrt-dk",
    hint="q . k is a sum of d_k independent products q_i k_i, each of mean 0 and variance sigma_q^2 sigma_k^2, "
    "and Var[s X] = s^2 Var[X]: solve s^2 Var[q . k] = 1 and return the positive root as a float.",
)
def _check_ch01_sqrt_dk(student) -> None:
    """``student(d_k, sigma_q, sigma_k)`` must give Var[s q.k] = 1: exactly for components +-sigma (every outcome enumerated), and within 4% in a Monte Carlo estimate for Gaussian ones."""
    import itertools

    gen = torch.Generator().manual_seed(1)
    exact = [(1, 1.0, 1.0), (2, 2.0, 1.0), (3, 0.5, 3.0), (5, 1.5, 0.2)]
    sampled = [(64, 1.0, 1.0), (128, 0.5, 3.0), (16, 2.0, 0.25)]
    for d_k, sq, sk in exact + sampled:
        what = f"for d_k={d_k}, sigma_q={sq}, sigma_k={sk}"
        s = student(d_k, sq, sk)
        assert _is_number(s), f"{what} return a float, got {type(s).__name__} {s!r}."
        assert s > 0, f"{what} return the positive scale factor, got {s!r}."
        if (d_k, sq, sk) in exact:  # components +-sigma with probability 1/2 each: 4^d_k equally likely outcomes
            signs = torch.tensor(list(itertools.product((-1.0, 1.0), repeat=2 * d_k)), dtype=torch.float64)
            dots = (sq * signs[:, :d_k] * sk * signs[:, d_k:]).sum(-1)
            var = ((dots - dots.mean()) ** 2).mean().item()
            how, tol, needed = f"exact, over all {4 ** d_k} outcomes", 1e-9, f"= {var ** -0.5:.6g}"
        else:  # Gaussian components, 20,000 draws of (q, k)
            q, k = sq * torch.randn(20_000, d_k, generator=gen), sk * torch.randn(20_000, d_k, generator=gen)
            var = (q * k).sum(-1).double().var().item()
            how, tol, needed = "Monte Carlo, 20,000 draws", 0.04, f"~ {var ** -0.5:.3g}"
        scaled = float(s) ** 2 * var
        assert abs(scaled - 1) < tol, (
            f"{what} your s = {s!r} gives Var[s q.k] = {scaled:.6g} ({how}); it should be 1, which needs s {needed}.")


# ---------------------------------------------------------------------------------------------
# Chapter 2: the quadratic cost
# ---------------------------------------------------------------------------------------------
from .complexity import attention_flops, attention_memory_bytes  # noqa: E402  (only Chapter 2's checks use them)


@register(
    "ch02-attention-flops",
    hint="Count 2 FLOPs per multiply-add in the four matrix products: Q, K, V projections (3 of n x d times d x d), "
    "scores (h heads of (n, d/h) x (d/h, n)), weighted sum, output projection. The head count cancels out.",
)
def _check_attention_matmul_flops(student) -> None:
    """``student(n, d_model, n_heads=..., batch=...)`` must equal the matrix-product FLOPs of :func:`attnbook.complexity.attention_flops`, exactly, on six sizes."""

    cases = [(1, 1, 1, 1), (4, 8, 2, 1), (7, 12, 3, 5), (128, 64, 1, 2), (1000, 512, 8, 1), (4096, 4096, 32, 3)]
    for n, d, h, batch in cases:
        got = student(n, d, n_heads=h, batch=batch)
        expected = attention_flops(n, d, n_heads=h, batch=batch)["matmul"]
        assert got == expected, (
            f"for n={n}, d_model={d}, n_heads={h}, batch={batch} you return {got!r}; "
            f"the matrix products cost {expected} FLOPs."
        )


@register(
    "ch02-max-seq-len",
    hint="The weights take batch * n_heads * n^2 * bytes_per_elem * n_layers bytes: solve for n and round down "
    "with integer arithmetic (math.isqrt), returning 0 when not even n = 1 fits.",
)
def _check_max_seq_len(student) -> None:
    """``student(budget_bytes, ...)`` must return the longest ``n`` whose attention weights fit the budget (:func:`attnbook.complexity.attention_memory_bytes`), exactly at the boundary."""

    cases = [
        dict(budget_bytes=2**34),  # 16 GiB, one fp32 matrix: exactly 65,536
        dict(budget_bytes=2**34 - 1),  # one byte less: 65,535
        dict(budget_bytes=16 * 10**9),  # 16 GB (decimal)
        dict(budget_bytes=80 * 10**9, n_heads=32, batch=8, bytes_per_elem=2),
        dict(budget_bytes=24 * 2**30, n_heads=12, batch=4, bytes_per_elem=2, n_layers=12),
        dict(budget_bytes=3),  # less than one fp32 element: nothing fits
        dict(budget_bytes=4),  # exactly one element
    ]
    for case in cases:
        kwargs = {k: v for k, v in case.items() if k != "budget_bytes"}
        budget = case["budget_bytes"]
        n = student(**case)
        assert isinstance(n, int), f"for {case} return an int, got {type(n).__name__} {n!r}."
        assert n >= 0, f"for {case} you return a negative length {n}."
        if n > 0:
            need = attention_memory_bytes(n, **kwargs)
            assert need <= budget, f"for {case} you return n={n}, but its weights need {need} bytes > the budget."
        longer = attention_memory_bytes(n + 1, **kwargs)
        assert longer > budget, (
            f"for {case} you return n={n}, but n={n + 1} still fits ({longer} bytes <= {budget}): return the largest n."
        )


@register(
    "ch02-projection-crossover",
    hint="the n^2 terms are the scores and the weighted sum, 2 n^2 d FLOPs each; the four projections cost "
    "2 n d^2 each. Solve 4 n^2 d = 8 n d^2 for n > 0 and return an int.",
)
def _check_projection_crossover(student) -> None:
    """``student(d_model)`` must return the ``n`` at which the scores and weighted sum of :func:`attnbook.complexity.attention_flops` first cost as much as its four projections, found by trying ``n = 1, 2, 3, ...``."""

    for d in (1, 2, 3, 64, 512, 768, 4096):
        n = 0
        while True:  # brute force: the first length whose n^2 terms reach the projections' FLOPs
            n += 1
            flops = attention_flops(n, d)
            quadratic = flops["scores"] + flops["weighted_sum"]
            projections = flops["qkv_projections"] + flops["output_projection"]
            if quadratic >= projections:
                break
        got = student(d)
        _assert_int(got, f"for d_model={d}", "the length as an int")
        assert got == n, (
            f"for d_model={d} you return n={got}; the n^2 terms (scores + weighted sum) first cost as much as the "
            f"four projections at n = {n}, {quadratic} FLOPs against {projections}.")


@register(
    "ch02-kv-decoding-cost",
    hint="without a cache step t costs a whole layer on t tokens, 8 t d^2 + 4 t^2 d; with one it costs 8 d^2 "
    "(four projections of one token) + 4 t d (one query against t keys and t values). Sum over t = 1..T exactly "
    "(sum t = T(T+1)/2, sum t^2 = T(T+1)(2T+1)/6) with integers. The cache holds K and V: 2 x layers x "
    "n_kv_heads x (d_model / n_heads) x seq_len x batch x bytes.",
)
def _check_kv_decoding_cost(student) -> None:
    """``(decoding_flops, kv_cache_size)``: the first must equal :func:`attnbook.complexity.attention_flops` summed over the decoding steps without and with a cache, the second the bytes of an :class:`attnbook.kvcache.KVCache` of that shape."""
    from .kvcache import KVCache

    assert isinstance(student, tuple) and len(student) == 2 and all(map(callable, student)), (
        "pass the pair of functions (decoding_flops, kv_cache_size) to the check.")
    decoding_flops, kv_cache_size = student
    for T, d in [(1, 1), (1, 8), (2, 4), (5, 3), (100, 64), (1000, 768)]:
        for kv_cache in (False, True):
            expected = 0
            for t in range(1, T + 1):  # step t: the t-th token is new, t tokens in all
                if kv_cache:  # project the new token only, attend to t cached keys and values
                    new_token = attention_flops(1, d)
                    attend = attention_flops(1, d, kv_len=t)
                    expected += (new_token["qkv_projections"] + new_token["output_projection"]
                                 + attend["scores"] + attend["weighted_sum"])
                else:  # the whole layer again on the t tokens so far
                    expected += attention_flops(t, d)["matmul"]
            got = decoding_flops(T, d, kv_cache=kv_cache)
            what = f"decoding_flops({T}, {d}, kv_cache={kv_cache})"
            _assert_int(got, what, "an exact int")
            assert got == expected, (
                f"{what} should be {expected} (the layer's matmul FLOPs summed over steps t = 1..{T}), got {got}.")
    dtypes = {1: torch.uint8, 2: torch.float16, 4: torch.float32, 8: torch.float64}
    for n_layers, d, h, h_kv, seq_len, nbytes, batch in [
        (32, 4096, 32, 32, 4096, 2, 1), (32, 4096, 32, 8, 4096, 2, 1), (1, 1, 1, 1, 1, 1, 1),
        (12, 768, 12, 12, 1024, 4, 8), (80, 8192, 64, 8, 4096, 2, 3), (2, 64, 8, 1, 10, 8, 2),
    ]:
        cache = KVCache(n_layers, batch, h_kv, d // h, seq_len, dtype=dtypes[nbytes], device="meta")  # no memory used
        expected = sum(t.numel() * t.element_size() for t in (cache.k, cache.v))
        got = kv_cache_size(n_layers, d, h, h_kv, seq_len, bytes_per_elem=nbytes, batch=batch)
        what = f"kv_cache_size({n_layers}, {d}, {h}, {h_kv}, {seq_len}, bytes_per_elem={nbytes}, batch={batch})"
        _assert_int(got, what, "the bytes as an int")
        assert got == expected, f"{what} should be {expected} bytes (the K and V buffers of a KVCache), got {got}."


# ---------------------------------------------------------------------------------------------
# Chapter 3: positional encodings
# ---------------------------------------------------------------------------------------------
@register(
    "ch03-sinusoidal",
    hint="omega_f = base ** (-2f / dim) for f = 0 .. dim/2 - 1; even columns 0, 2, 4, ... hold sin(i * omega_f), "
    "odd columns hold cos(i * omega_f). Build a (n, 1) column of positions times a (1, dim/2) row of frequencies.",
)
def _check_ch03_sinusoidal(student) -> None:
    """``student(n_positions, dim, base=10000.0)`` must equal :func:`attnbook.positional.sinusoidal_encoding`."""
    from .positional import sinusoidal_encoding

    for n, dim, base in [(1, 2, 10000.0), (7, 4, 10000.0), (50, 16, 10000.0), (33, 10, 100.0)]:
        got = student(n, dim, base=base)
        assert isinstance(got, torch.Tensor), f"return a torch.Tensor, got {type(got).__name__}."
        _assert_close(got, sinusoidal_encoding(n, dim, base), f"n_positions={n}, dim={dim}, base={base}", atol=1e-4)


@register(
    "ch03-alibi-slopes",
    hint="for a power of two n: 2 ** (-8 * h / n) for h = 1..n. Otherwise take p = the largest power of two below n, "
    "the p slopes of p heads, then slopes [0::2] of the 2p-head list until you have n.",
)
def _check_ch03_alibi_slopes(student) -> None:
    """``student(n_heads)`` must return ALiBi's slopes (a list or tensor) for powers of two and other counts."""
    from .positional import alibi_slopes

    for n in (1, 2, 4, 8, 16, 3, 6, 12, 20, 24):
        got = torch.as_tensor(student(n), dtype=torch.float64)
        _assert_close(got, alibi_slopes(n).double(), f"n_heads={n}", atol=1e-7, rtol=1e-6)


@register(
    "ch03-t5-bucket",
    hint="bidirectional: halve num_buckets and add it when the key is after the query (offset > 0); distance = |offset|. "
    "Causal: distance = max(-offset, 0). Distances below half the (per-direction) buckets are their own bucket; "
    "larger ones get max_exact + int(log(n / max_exact) / log(max_distance / max_exact) * (buckets - max_exact)), "
    "clamped to buckets - 1.",
)
def _check_ch03_t5_bucket(student) -> None:
    """``student(offset, bidirectional=True, num_buckets=32, max_distance=128)`` on a Python int offset."""
    from .positional import t5_relative_position_bucket

    offsets = list(range(-40, 41)) + [-1000, -200, -129, -128, -127, -64, 64, 127, 128, 500]
    for bidirectional, num_buckets, max_distance in [(True, 32, 128), (False, 32, 128), (True, 8, 32)]:
        for offset in offsets:
            expected = t5_relative_position_bucket(torch.tensor(offset), bidirectional, num_buckets, max_distance).item()
            got = student(offset, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
            assert int(got) == expected, (
                f"offset {offset} (bidirectional={bidirectional}, num_buckets={num_buckets}, "
                f"max_distance={max_distance}): expected bucket {expected}, got {got}."
            )


@register(
    "ch03-rope",
    hint="angles = positions[:, None] * inv_freq[None, :] with inv_freq = base ** (-2f / dim); for each pair "
    "(x[..., 2f], x[..., 2f+1]) return (x1 cos - x2 sin, x1 sin + x2 cos), interleaved back in the same order.",
)
def _check_ch03_rope(student) -> None:
    """``student(x, positions, base=10000.0)`` must equal ``RotaryEmbedding(dim, base, interleaved=True)``."""
    from .positional import RotaryEmbedding

    gen = torch.Generator().manual_seed(303)
    for shape, base, start in [((5, 2), 10000.0, 0), ((2, 3, 7, 8), 10000.0, 0), ((4, 16), 500.0, 100)]:
        x = torch.randn(*shape, generator=gen)
        positions = torch.arange(start, start + shape[-2])
        expected = RotaryEmbedding(shape[-1], base, interleaved=True)(x, positions=positions)
        got = student(x, positions, base=base)
        _assert_close(got, expected, f"x of shape {shape}, positions {start}..{start + shape[-2] - 1}, base={base}",
                      atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Chapter 4: sparse attention
# ---------------------------------------------------------------------------------------------
@register(
    "ch04-dilated-window",
    hint="with offset = i - j (an (n, n) tensor from two aranges), allow |offset| <= window * dilation and "
    "offset % dilation == 0, and with causal also offset >= 0; return a bool tensor.",
)
def _check_ch04_dilated_window(student) -> None:
    """``student(seq_len, window, causal=False, dilation=1)`` must equal :func:`attnbook.sparse.sliding_window_mask`."""
    from .sparse import sliding_window_mask

    for n, window, causal, dilation in [(1, 0, False, 1), (8, 1, False, 1), (9, 2, False, 2), (12, 2, True, 3),
                                        (10, 0, True, 2), (16, 3, False, 4), (7, 10, True, 1)]:
        got = student(n, window, causal=causal, dilation=dilation)
        what = f"seq_len={n}, window={window}, causal={causal}, dilation={dilation}"
        assert isinstance(got, torch.Tensor) and got.dtype == torch.bool, f"{what}: return a bool tensor."
        expected = sliding_window_mask(n, window, causal=causal, dilation=dilation)
        assert got.shape == expected.shape, f"{what}: expected shape {tuple(expected.shape)}, got {tuple(got.shape)}."
        wrong = (got != expected).nonzero()
        assert not len(wrong), f"{what}: entry (i, j) = {tuple(wrong[0].tolist())} should be {bool(expected[tuple(wrong[0])])}."


@register(
    "ch04-local-attention",
    hint="reshape q, k, v from (..., n, d) to (..., n // block_size, block_size, d), run ordinary scaled "
    "dot-product attention on the last two dimensions (every block is a batch entry), and reshape back.",
)
def _check_ch04_local_attention(student) -> None:
    """``student(q, k, v, block_size)`` must equal dense attention with a block-diagonal mask, in O(n b) memory."""
    from .core import scaled_dot_product_attention
    from .sparse import expand_block_mask

    gen = torch.Generator().manual_seed(105)
    for shape, block in [((1, 4, 3), 1), ((2, 8, 4), 4), ((2, 3, 12, 8), 3), ((1, 6, 5), 6)]:
        q, k, v = (torch.randn(*shape, generator=gen, dtype=torch.float64) for _ in range(3))
        mask = expand_block_mask(torch.eye(shape[-2] // block, dtype=torch.bool), block)
        _assert_close(student(q, k, v, block), scaled_dot_product_attention(q, k, v, mask),
                      f"q of shape {shape}, block_size={block}")
    n, block, dim = 2048, 16, 8
    q, k, v = (torch.randn(n, dim, generator=gen) for _ in range(3))
    largest = largest_new_tensor(student, q, k, v, block)
    assert largest <= n * block * dim, (
        f"for n={n}, block_size={block} your code made a tensor of {largest} elements: "
        f"local attention needs only n * block_size scores, not n^2 = {n * n}."
    )


@register(
    "ch04-sliding-window-attention",
    hint="zero-pad k and v by `window` positions at both ends (torch.nn.functional.pad), take windows with "
    ".unfold(-2, 2 * window + 1, 1), score q against its window only, and mask the padded positions before the softmax.",
)
def _check_ch04_sliding_window_attention(student) -> None:
    """``student(q, k, v, window)`` must equal dense attention with the window mask and never form an ``n x n`` tensor."""
    from .core import scaled_dot_product_attention
    from .sparse import sliding_window_mask

    gen = torch.Generator().manual_seed(104)
    for shape, window in [((1, 1, 4), 0), ((2, 5, 4), 1), ((2, 3, 17, 8), 3), ((1, 6, 2), 10)]:
        q, k, v = (torch.randn(*shape, generator=gen, dtype=torch.float64) for _ in range(3))
        expected = scaled_dot_product_attention(q, k, v, sliding_window_mask(shape[-2], window))
        _assert_close(student(q, k, v, window), expected, f"q of shape {shape}, window={window}")
    n, window, dim = 2048, 4, 8
    q, k, v = (torch.randn(n, dim, generator=gen) for _ in range(3))
    largest = largest_new_tensor(student, q, k, v, window)
    assert largest <= n * (2 * window + 1) * dim, (
        f"for n={n}, window={window} your code made a tensor of {largest} elements: "
        f"memory must be O(n * window), not O(n^2) = {n * n}."
    )


def _layers_until_connected(n: int, w: int, dilated: bool) -> int:
    """Stack sliding-window layers (dilation 1, or (w + 1) ** l for layer l = 0, 1, ...) until every token reaches every other."""
    from .sparse import sliding_window_mask

    reach = torch.eye(n, dtype=torch.bool)  # reach[i, j]: the input of token j can influence the output of token i
    layers = 0
    while not reach.all():
        mask = sliding_window_mask(n, w, dilation=(w + 1) ** layers if dilated else 1)
        reach = (mask.float() @ reach.float()) > 0  # one more layer on top: i sees j if some key of i sees j
        layers += 1
    return layers


@register(
    "ch04-graph-depth",
    hint="plain window: each layer moves information at most w positions, and one token needs no layer at all. "
    "Dilations 1, w+1, (w+1)^2, ...: k layers reach every offset up to (w+1)^k - 1 (digits 0..w in base w+1). "
    "Use integers (a loop, or -(-a // b) for a ceiling): math.log(125, 5) is 3.0000000000000004.",
)
def _check_ch04_graph_depth(student) -> None:
    """``student(n, w, dilated)`` must equal the number of stacked :func:`attnbook.sparse.sliding_window_mask` layers after which a breadth-first search (boolean matrix products) finds every token connected to every other."""

    cases = [(1, 1), (2, 1), (3, 1), (5, 1), (7, 3), (64, 4), (256, 2), (100, 99), (10, 50)]
    cases = [(n, w, False) for n, w in cases] + [
        (n, w, True) for n, w in [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (64, 1), (65, 1), (243, 2), (244, 2),
                                  (256, 2), (125, 4), (126, 4), (100, 3), (9, 10)]]
    for n, w, dilated in cases:
        got = student(n, w, dilated=dilated)
        what = f"layers_to_connect({n}, {w}, dilated={dilated})"
        _assert_int(got, what, "a number of layers as an int")
        expected = _layers_until_connected(n, w, dilated)
        assert got == expected, (
            f"{what} should be {expected} (a breadth-first search over the stacked window masks), got {got}.")


# ---------------------------------------------------------------------------------------------
# Chapter 5: linear and low-rank attention
# ---------------------------------------------------------------------------------------------
def _ch05_inputs(seed: int, L: int, S: int, E: int = 4, Ev: int = 3, batch: tuple[int, ...] = (2,)):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*batch, n, e, generator=gen, dtype=torch.float64) for n, e in ((L, E), (S, E), (S, Ev)))


@register(
    "ch05-linear-attention",
    hint="compute kv = phi(K)^T V (shape M x Ev) and z = the sum of phi(K) over the keys first, then "
    "divide phi(Q) kv by phi(Q) z + eps row by row; phi is elu(x) + 1 and there is no 1/sqrt(d).",
)
def _check_linear_attention(student) -> None:
    """``student(q, k, v)`` must equal :func:`attnbook.linear.linear_attention` (elu + 1 features) for ``L != S`` and batched heads."""

    from .linear import linear_attention

    for seed, (L, S) in enumerate([(5, 5), (3, 8), (1, 1), (7, 2)]):
        q, k, v = _ch05_inputs(seed, L, S)
        _assert_close(student(q, k, v), linear_attention(q, k, v), f"linear attention for L={L}, S={S}")
    q, k, v = _ch05_inputs(9, 4, 6, batch=(2, 3))
    _assert_close(student(q, k, v), linear_attention(q, k, v), "linear attention with (batch, heads, n, d) inputs")


@register(
    "ch05-causal-prefix-sums",
    hint="torch.cumsum over the sequence of the outer products phi(k_j) v_j^T (shape n x M x Ev) and of "
    "phi(k_j) gives S_i and z_i; out_i = phi(q_i) S_i / (phi(q_i) z_i + eps). Query i sees keys 0..i.",
)
def _check_causal_prefix_sums(student) -> None:
    """``student(q, k, v)`` must equal :func:`attnbook.linear.linear_attention` with ``is_causal=True``, and later keys must not change earlier outputs."""

    from .linear import linear_attention

    for seed, n in enumerate([1, 2, 6, 11]):
        q, k, v = _ch05_inputs(seed, n, n)
        expected = linear_attention(q, k, v, is_causal=True)
        _assert_close(student(q, k, v), expected, f"causal linear attention for n={n}")
    q, k, v = _ch05_inputs(5, 6, 6)
    q2 = q.clone()
    k2, v2 = k.clone(), v.clone()
    k2[..., 4:, :] += 5.0
    v2[..., 4:, :] -= 5.0
    _assert_close(student(q2, k2, v2)[..., :4, :], student(q, k, v)[..., :4, :],
                  "changing keys/values 4 and 5 must not change outputs 0..3 (causality)")


@register(
    "ch05-performer-features",
    hint="scale x by d**-0.25 first, then exp(x~ W^T - |x~|^2 / 2) / sqrt(m) with m = W.shape[0] "
    "(one exp of a difference: a quotient of two exps overflows sooner).",
)
def _check_performer_features(student) -> None:
    """``student(x, W)`` must equal :func:`attnbook.linear.performer_features`, and stay finite for inputs with a large norm."""

    from .linear import performer_features

    gen = torch.Generator().manual_seed(0)
    for d, m, scale in [(4, 7, 1.0), (16, 32, 0.5), (8, 3, 1.0)]:
        x = scale * torch.randn(2, 5, d, generator=gen, dtype=torch.float64)
        W = torch.randn(m, d, generator=gen, dtype=torch.float64)
        _assert_close(student(x, W), performer_features(x, W), f"features for d={d}, m={m}")
    x = 40.0 * torch.randn(1, 4, 16, generator=gen, dtype=torch.float64)  # |x~|^2 / 2 ~ 3000
    W = torch.randn(8, 16, generator=gen, dtype=torch.float64)
    got = torch.as_tensor(student(x, W))
    assert torch.isfinite(got).all(), "features of inputs with a large norm must stay finite (no inf / nan)."
    _assert_close(got, performer_features(x, W), "features of inputs with a large norm", atol=1e-12, rtol=1e-6)


def _ch05_products(n: int, M: int, d: int, random_features: bool) -> tuple[list, list]:
    """The (rows, inner, cols) shapes of the matrix products of one head: linear attention's, then softmax attention's."""
    linear = [(M, n, d), (n, M, d), (n, M, 1)]  # phi(K)^T V, phi(Q) S, phi(Q) z
    if random_features:
        linear += [(n, d, M), (n, d, M)]  # W x~ for the queries and for the keys
    return linear, [(n, d, n), (n, n, d)]  # Q K^T, A V


def _ch05_flops(products: list) -> int:
    """FLOPs of a list of (rows, inner, cols) matrix products, 2 per multiply-add."""
    return sum(2 * rows * inner * cols for rows, inner, cols in products)


@register(
    "ch05-crossover",
    hint="linear attention: phi(K)^T V and phi(Q) S cost 2 n M d each, phi(Q) z costs 2 n M (plus 2 n M d for the "
    "features of Q and again of K with random_features); softmax: Q K^T and A V cost 2 n^2 d each. Find the smallest "
    "integer n with linear <= softmax (equality counts), with integer arithmetic.",
)
def _check_ch05_crossover(student) -> None:
    """``student(M, d, random_features)`` must return the first of ``n = 1, 2, 3, ...`` at which linear attention's matmul FLOPs, summed product by product from the shapes, are at most softmax attention's."""

    cases = [(64, 64, False), (266, 64, False), (266, 64, True), (1, 1, False), (1, 1, True), (128, 64, False),
             (64, 32, False), (32, 64, False), (100, 8, True), (256, 128, True), (3, 1, False)]
    for M, d, random_features in cases:
        n = 1
        while True:  # brute force: the first length at which linear attention is no more expensive
            linear, softmax = (_ch05_flops(products) for products in _ch05_products(n, M, d, random_features))
            if linear <= softmax:
                break
            n += 1
        got = student(M, d, random_features=random_features)
        what = f"flop_crossover({M}, {d}, random_features={random_features})"
        _assert_int(got, what, "a length as an int")
        assert got == n, (
            f"{what} should be {n}: at n = {n} linear attention costs {linear} matmul FLOPs against softmax "
            f"attention's {softmax}, and at every shorter length it costs more; you return {got}.")


# ---------------------------------------------------------------------------------------------
# Chapter 6: the KV cache
# ---------------------------------------------------------------------------------------------
@register(
    "ch06-kv-cache-bytes",
    hint="keys AND values (the factor 2), one entry per layer, KV head, head dimension, position and "
    "sequence in the batch, times the bytes of one element.",
)
def _check_ch06_kv_cache_bytes(student) -> None:
    """``student(n_layers, n_kv_heads, head_dim, seq_len, batch, bytes_per_elem)`` must equal :func:`attnbook.kvcache.kv_cache_bytes`."""

    from .kvcache import kv_cache_bytes

    for args in [(32, 32, 128, 4096, 1, 2), (80, 8, 128, 4096, 1, 2), (12, 12, 64, 1024, 8, 4), (1, 1, 1, 1, 1, 1),
                 (4, 2, 32, 0, 3, 2)]:
        got, expected = student(*args), kv_cache_bytes(*args)
        assert got == expected, f"kv_cache_bytes{args} should be {expected}, got {got}"


@register(
    "ch06-paged-gather",
    hint="position p lives in block block_table[p // block_size] at offset p % block_size: index the pool "
    "with the table (pool[block_table]), put the heads first, flatten blocks and offsets, keep `length` positions.",
)
def _check_ch06_paged_gather(student) -> None:
    """``student(pool, block_table, length)`` must equal :meth:`attnbook.kvcache.PagedKVCache.gather` on interleaved sequences."""

    from .kvcache import PagedKVCache

    gen = torch.Generator().manual_seed(6)
    for block, n_blocks, lengths in [(4, 10, [7, 1, 8]), (1, 6, [2, 3]), (16, 3, [0, 16, 17])]:
        paged = PagedKVCache(n_blocks, block, 2, 3)
        for i, n in enumerate(lengths):
            paged.allocate(i)
        for step in range(max(lengths)):  # interleaved appends scatter each sequence over the pool
            for i, n in enumerate(lengths):
                if step < n:
                    paged.append(i, torch.randn(2, 1, 3, generator=gen), torch.randn(2, 1, 3, generator=gen))
        for i, n in enumerate(lengths):
            got = student(paged.k_pool, paged.block_tables[i], n)
            _assert_close(got, paged.gather(i)[0], f"gather of a sequence of length {n} with block_size={block}")


@register(
    "ch06-merge-splits",
    hint="with M = the max of lse over the splits, weight each split by exp(lse_s - M), divide by the sum of "
    "the weights; a split with lse = -inf has weight 0, and if every split is empty return zeros (not NaN).",
)
def _check_ch06_merge_splits(student) -> None:
    """``student(o, lse)`` must merge per-split outputs into full softmax attention; all-empty splits give zeros, not NaN."""

    gen = torch.Generator().manual_seed(60)
    for shape, n, d in [((2, 3), 4, 5), ((1,), 1, 2), ((2,), 6, 3)]:
        scores = 3 * torch.randn(*shape, n * 4, generator=gen, dtype=torch.float64)
        values = torch.randn(*shape, n * 4, d, generator=gen, dtype=torch.float64)
        scores[..., :4] = float("-inf")  # the first split is empty
        if n == 1:
            scores[..., 0] = 0.0
        s = scores.view(*shape, n, 4)
        lse = torch.logsumexp(s, -1)
        w = torch.where(torch.isinf(lse)[..., None], torch.zeros_like(s), torch.softmax(s, -1))
        o = (w[..., None] * values.view(*shape, n, 4, d)).sum(-2)
        expected = (torch.softmax(scores, -1)[..., None] * values).sum(-2)
        _assert_close(student(o, lse), expected, f"merging {n} splits of shape {tuple(o.shape)}")
    o, lse = torch.zeros(2, 3, 4, dtype=torch.float64), torch.full((2, 3), float("-inf"), dtype=torch.float64)
    got = torch.as_tensor(student(o, lse))
    assert torch.isfinite(got).all() and torch.equal(got, torch.zeros(2, 4, dtype=torch.float64)), (
        "when every split is empty (lse = -inf everywhere) the merged output must be zeros, not NaN")


# ---------------------------------------------------------------------------------------------
# Chapter 7: FlashAttention
# ---------------------------------------------------------------------------------------------
@register(
    "ch07-merge-states",
    hint="m = max(m_a, m_b), l = l_a * exp(m_a - m) + l_b * exp(m_b - m); when both maxima are -inf "
    "(two empty blocks) return m = -inf, l = 0 without computing -inf - (-inf).",
)
def _check_merge_states(student) -> None:
    """``student(m_a, l_a, m_b, l_b)`` must return the ``(m, l)`` of the concatenated scores, and ``(-inf, 0)`` for two empty blocks."""

    gen = torch.Generator().manual_seed(0)
    for n_a, n_b, spread in [(3, 5, 1.0), (1, 1, 10.0), (7, 2, 300.0)]:
        a = spread * torch.randn(4, n_a, generator=gen, dtype=torch.float64)
        b = spread * torch.randn(4, n_b, generator=gen, dtype=torch.float64)
        state = lambda x: (x.amax(-1), torch.exp(x - x.amax(-1, keepdim=True)).sum(-1))  # noqa: E731
        m, l = student(*state(a), *state(b))
        both = torch.cat([a, b], dim=-1)
        _assert_close(m, both.amax(-1), f"merged maximum for blocks of {n_a} and {n_b} scores")
        _assert_close(m + torch.log(torch.as_tensor(l)), torch.logsumexp(both, -1),
                      f"merged normalizer (m + log l must be the log-sum-exp) for blocks of {n_a} and {n_b}")
    inf = torch.tensor([-float("inf")], dtype=torch.float64)
    m, l = student(inf, torch.zeros(1, dtype=torch.float64), torch.tensor([2.0], dtype=torch.float64),
                   torch.tensor([3.0], dtype=torch.float64))
    _assert_close(torch.stack([torch.as_tensor(m), torch.as_tensor(l)]).flatten(), [2.0, 3.0],
                  "merging an empty block (m = -inf, l = 0) must return the other block unchanged")
    m, l = student(inf, torch.zeros(1, dtype=torch.float64), inf, torch.zeros(1, dtype=torch.float64))
    assert torch.as_tensor(l).item() == 0 and not torch.isnan(torch.as_tensor(l)).any(), (
        "merging two empty blocks must give l = 0, not NaN."
    )


@register(
    "ch07-causal-key-blocks",
    hint="with bottom-right alignment query i sees keys j <= i + S - L; the block's last row is "
    "min((q_block + 1) * block_q, L) - 1. Count the key blocks up to that row's last key (0 if it is "
    "negative), at most ceil(S / block_k).",
)
def _check_causal_key_blocks(student) -> None:
    """``student(q_block, block_q, block_k, L, S)`` must count the key blocks a causal query block needs, against :func:`attnbook.core.causal_mask`."""

    from .core import causal_mask

    for L, S, bq, bk in [(8, 8, 2, 2), (7, 13, 3, 4), (13, 5, 4, 2), (1, 9, 16, 4), (5, 5, 8, 8), (40, 10, 16, 16)]:
        mask = causal_mask(L, S)
        for qb in range(-(-L // bq)):
            rows = mask[qb * bq : (qb + 1) * bq]
            visible = rows.any(dim=0).nonzero()
            expected = 0 if len(visible) == 0 else int(visible.max()) // bk + 1
            got = student(qb, bq, bk, L, S)
            assert got == expected, (
                f"L={L}, S={S}, block_q={bq}, block_k={bk}: query block {qb} needs {expected} key blocks, you said {got}."
            )


@register(
    "ch07-attention-backward",
    hint="P = exp(q k^T * scale - lse[..., None]); dv = P^T dout; dP = dout v^T; delta = rowsum(dout * out); "
    "dS = P * (dP - delta[..., None]); dq = dS k * scale; dk = dS^T q * scale.",
)
def _check_attention_backward(student) -> None:
    """``student(q, k, v, out, lse, dout, scale)`` must return ``(dq, dk, dv)`` equal to autograd's in float64."""

    gen = torch.Generator().manual_seed(0)
    for L, S, E, scale in [(4, 6, 3, 0.5), (1, 1, 2, 1.0), (7, 3, 5, 0.3)]:
        q, k, v = (torch.randn(2, n, E, generator=gen, dtype=torch.float64, requires_grad=True) for n in (L, S, S))
        scores = q @ k.transpose(-1, -2) * scale
        out = torch.softmax(scores, -1) @ v
        dout = torch.randn_like(out)
        out.backward(dout)
        got = student(q.detach(), k.detach(), v.detach(), out.detach(), torch.logsumexp(scores, -1).detach(), dout, scale)
        for name, g, t in zip(("dq", "dk", "dv"), got, (q, k, v)):
            _assert_close(g, t.grad, f"{name} for L={L}, S={S}, d={E}", atol=1e-9, rtol=1e-7)


@register(
    "ch07-io-head-dim",
    hint="for each d: M = sram_bytes // bytes_per_element, B = min(n, max(1, M // (4 d))), traffic = "
    "2 n d + 2 n d * ceil(n / B) (ceil with integers: -(-n // B)); return traffic(128) / traffic(64).",
)
def _check_io_head_dim(student) -> None:
    """``student(n, sram_bytes, bytes_per_element=2)`` must equal the ratio of :func:`attnbook.flash.hbm_accesses`'s flash counts for d = 128 and d = 64, on eight sizes."""
    from .flash import hbm_accesses

    cases = [
        (16384, 192 * 1024, 2),  # the chapter's A100 example: 3.95, not 4
        (16384, 192 * 1024, 4),  # fp32: tiles half as tall
        (1000, 192 * 1024, 2),  # n / B is not a whole number: the last tile is ragged
        (300, 192 * 1024, 2),  # d = 64 fits in one tile (B = n), d = 128 needs two
        (64, 2**30, 2),  # everything fits: one pass, the traffic is linear in d
        (100, 1000, 2),  # a tiny SRAM: M // (4 d) is 0, tiles of one row
        (1, 2**20, 2),
        (2**16, 256 * 1024, 2),  # an H100 SM
    ]
    for n, sram, bpe in cases:
        flash = {d: hbm_accesses(n, d, sram, bpe)["flash"] for d in (64, 128)}
        expected = flash[128] / flash[64]
        what = f"n={n}, sram_bytes={sram}, bytes_per_element={bpe}"
        got = _real_number(student(n, sram, bytes_per_element=bpe), what)
        assert abs(got - expected) <= 1e-9 * expected, (
            f"for {what} you return {got!r}; the flash traffic is {flash[128]} elements at d=128 and "
            f"{flash[64]} at d=64, a ratio of {expected:.6g}."
        )


# ---------------------------------------------------------------------------------------------
# Chapter 8: attention in recurrent models
# ---------------------------------------------------------------------------------------------
@register(
    "ch08-luong-general",
    hint="scores e_s = h_t^T W_a h_s for every s: (query @ W)[:, None, :] times keys, summed over the last "
    "dimension (or a batched matmul); then a softmax over s with masked positions set to -inf before it.",
)
def _check_ch08_luong_general(student) -> None:
    """``student(query (B, Dq), keys (B, S, Dk), W (Dq, Dk), mask (B, S) or None)`` -> weights ``(B, S)``."""
    from .rnn import LuongAttention

    gen = torch.Generator().manual_seed(801)
    for B, S, dq, dk in [(1, 2, 1, 1), (3, 5, 4, 6), (2, 7, 8, 8)]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(S)
            attn = LuongAttention(dq, dk, "general")
        q, k = torch.randn(B, dq, generator=gen), torch.randn(B, S, dk, generator=gen)
        mask = torch.ones(B, S, dtype=torch.bool)
        mask[0, S // 2 + 1:] = False  # the first sentence is shorter
        with torch.no_grad():
            for m, what in [(None, "no mask"), (mask, "with a padding mask")]:
                _assert_close(student(q, k, attn.W_a.detach(), m), attn(q, k, m)[1], f"B={B}, S={S}, {what}")


@register(
    "ch08-coverage-loss",
    hint="the coverage before step t is the sum of the weights of steps 0..t-1 (zero at t = 0: an exclusive "
    "cumulative sum over T); the loss of step t is sum_s min(a_ts, c_ts); add the steps up.",
)
def _check_ch08_coverage_loss(student) -> None:
    """``student(weights (B, T, S))`` -> total coverage loss per example ``(B,)``."""
    from .rnn import accumulated_coverage, coverage_loss

    gen = torch.Generator().manual_seed(802)
    one_hot = torch.eye(3)[[0, 0, 1, 2]].unsqueeze(0)  # re-reads position 0 once: loss 1
    cases = [("hand example (position 0 read twice)", one_hot)]
    for B, T, S in [(2, 1, 4), (3, 5, 4), (1, 6, 9)]:
        cases.append((f"random weights B={B}, T={T}, S={S}", torch.softmax(torch.randn(B, T, S, generator=gen) * 2, -1)))
    for what, w in cases:
        expected = coverage_loss(w, accumulated_coverage(w)).sum(-1)
        _assert_close(student(w), expected, what)


@register(
    "ch08-local-p",
    hint="keep positions s with |s - p| <= D that are not masked; softmax the scores over those only; "
    "multiply by exp(-(s - p)^2 / (2 sigma^2)) with sigma = D / 2; everything else is exactly 0.",
)
def _check_ch08_local_p(student) -> None:
    """``student(scores (B, S), p (B,), mask (B, S), window D)`` -> local-p weights ``(B, S)``."""
    from .rnn import LocalAttention

    gen = torch.Generator().manual_seed(803)
    for B, S, D in [(1, 3, 1), (3, 9, 2), (2, 12, 3)]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(S)
            attn = LocalAttention(4, 5, window=D, mode="local-p")
        q, k = torch.randn(B, 4, generator=gen) * 3, torch.randn(B, S, 5, generator=gen)
        mask = torch.ones(B, S, dtype=torch.bool)
        mask[-1, max(1, S - 2):] = False
        with torch.no_grad():
            p = attn.centre(q, mask.sum(-1))
            expected = attn(q, k, mask)[1]
            actual = student(attn.score.scores(q, k), p, mask, D)
        assert not torch.isnan(torch.as_tensor(actual)).any(), f"B={B}, S={S}, D={D}: your weights contain NaN."
        _assert_close(actual, expected, f"B={B}, S={S}, D={D}")


def _recurrent_decoder_macs(d: int, n: int, m: int, window: int) -> tuple[int, int]:
    """(recurrence, attention) multiply-adds from the tested FLOP counters: vanilla RNN encoder over ``n``
    steps and decoder over ``m``, plus, at each of the ``m`` output steps, the scores and weighted sum
    of one query over ``window`` annotations."""
    from .complexity import attention_flops, rnn_flops

    recurrence = rnn_flops(n, d)["total"] + rnn_flops(m, d)["total"]
    step = attention_flops(1, d, kv_len=window)  # one decoder query against the annotations
    attention = m * (step["scores"] + step["weighted_sum"])  # the same cost at each of the m output steps
    return recurrence // 2, attention // 2  # 2 FLOPs per multiply-add


@register(
    "ch08-attention-cost",
    hint="the recurrences cost (n + m) * 2 d^2 multiply-adds, the attention m steps of 2 d multiply-adds per "
    "annotation it reads (n of them, or min(2 D + 1, n) with local attention); set n = m and solve for part 1.",
)
def _check_ch08_attention_cost(student) -> None:
    """``(equal_cost_length(d), recurrence_over_attention(d, n, m, D=None))`` against a search over ``n`` and a count with :func:`attnbook.complexity.rnn_flops` and :func:`attnbook.complexity.attention_flops`."""
    assert isinstance(student, (tuple, list)) and len(student) == 2, (
        "pass the pair (equal_cost_length, recurrence_over_attention), got "
        f"{type(student).__name__}."
    )
    equal_cost_length, recurrence_over_attention = student
    for d in (1, 2, 3, 64, 512):
        equal = [n for n in range(1, 4 * d + 2) if len(set(_recurrent_decoder_macs(d, n, n, n))) == 1]
        got = equal_cost_length(d)
        _assert_int(got, f"equal_cost_length({d})")
        if got != equal[0]:
            costs = "" if got < 1 else ", where the recurrences cost {} and the attention {} multiply-adds".format(
                *_recurrent_decoder_macs(d, got, got, got))
            raise AssertionError(f"equal_cost_length({d}) returns {got}{costs}; they are equal at n = m = {equal[0]}.")
    cases = [(512, 5000, 200, None), (512, 5000, 200, 10), (1, 1, 1, None), (64, 128, 128, None),
             (16, 5, 7, 10), (32, 100, 50, 0), (1000, 30, 30, None)]
    for d, n, m, D in cases:
        rec, att = _recurrent_decoder_macs(d, n, m, n if D is None else min(2 * D + 1, n))
        what = f"recurrence_over_attention(d={d}, n={n}, m={m}" + ("" if D is None else f", D={D}") + ")"
        got = recurrence_over_attention(d, n, m) if D is None else recurrence_over_attention(d, n, m, D=D)
        got = _real_number(got, what)
        assert abs(got - rec / att) <= 1e-9 * (rec / att), (
            f"{what} returns {got!r}; the recurrences cost {rec} multiply-adds and the attention {att}: "
            f"a ratio of {rec / att:.6g}."
        )



# ---------------------------------------------------------------------------------------------
# Chapter 9: vision attention
# ---------------------------------------------------------------------------------------------
@register(
    "ch09-patchify",
    hint="cut (B, C, H, W) into (H/p) x (W/p) patches with reshape(B, C, H/p, p, W/p, p), move the two patch-grid "
    "axes to the front of each image (permute to B, H/p, W/p, C, p, p) and flatten: rows of patches first, "
    "each patch channel-major.",
)
def _check_ch09_patchify(student) -> None:
    """``student(images, patch_size)`` must equal unfold's row-major, channel-major patches ``(B, N, C*p*p)``."""
    import torch.nn.functional as F

    from .vision import PatchEmbedding

    gen = torch.Generator().manual_seed(109)
    for B, C, size, p in [(1, 1, 4, 2), (2, 3, 8, 4), (3, 2, 6, 3), (1, 1, 5, 5)]:
        x = torch.randn(B, C, size, size, generator=gen)
        expected = F.unfold(x, kernel_size=p, stride=p).transpose(1, 2)
        actual = student(x, p)
        assert isinstance(actual, torch.Tensor), f"return a torch.Tensor, got {type(actual).__name__}."
        _assert_close(actual, expected, f"patches of a {tuple(x.shape)} batch with patch_size={p}")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(p)
            embed = PatchEmbedding(size, p, C, 5)
        with torch.no_grad():
            _assert_close(actual @ embed.proj.weight.reshape(5, -1).T + embed.proj.bias, embed(x),
                          f"a linear layer on your patches vs PatchEmbedding (patch_size={p})")


@register(
    "ch09-rollout",
    hint="for each layer: average over heads (dim 1), add the identity, halve, divide each row by its sum; then "
    "multiply the layers together with the LATER layer on the left: rollout = A_l @ rollout.",
)
def _check_ch09_rollout(student) -> None:
    """``student(attentions)`` must equal :func:`attnbook.vision.attention_rollout` (with the residual)."""
    from .vision import attention_rollout

    gen = torch.Generator().manual_seed(209)
    cases = [(1, 1, 2, 1), (2, 4, 5, 3), (1, 2, 7, 6)]
    for B, H, T, L in cases:
        layers = [torch.softmax(2 * torch.randn(B, H, T, T, generator=gen), dim=-1) for _ in range(L)]
        if L > 1:  # an asymmetric case: the order of the product matters
            layers[0][..., 0] += 1.0
            layers[0] /= layers[0].sum(-1, keepdim=True)
        _assert_close(student(layers), attention_rollout(layers), f"rollout of {L} layers of shape {(B, H, T, T)}")


@register(
    "ch09-spatial-gate",
    hint="stack the channel mean and the channel maximum (in that order, keepdim=True) into (B, 2, H, W), "
    "apply F.conv2d(pooled, weight, padding=k // 2) and a sigmoid.",
)
def _check_ch09_spatial_gate(student) -> None:
    """``student(x, weight)`` must equal :meth:`attnbook.vision.SpatialAttention.gate` with that conv weight."""
    from .vision import SpatialAttention

    gen = torch.Generator().manual_seed(309)
    cases = [
        ("one channel (mean = max), k = 1", (1, 1, 4, 4), 1),
        ("8 channels, a 7 x 5 map, k = 3", (2, 8, 7, 5), 3),
        ("a 7 x 7 kernel on a 4 x 6 map (larger than the image)", (3, 16, 4, 6), 7),
    ]
    for what, shape, k in cases:
        x = torch.randn(*shape, generator=gen)
        gate = SpatialAttention(k)
        with torch.no_grad():
            gate.conv.weight.copy_(torch.randn(1, 2, k, k, generator=gen))
            expected = gate.gate(x)
        actual = student(x.clone(), gate.conv.weight.detach().clone())
        assert isinstance(actual, torch.Tensor), f"return a torch.Tensor, got {type(actual).__name__}."
        _assert_close(actual, expected, what)


@register(
    "ch09-conv-heads",
    hint="the bound 2 (n - 1) / (e^pi + n - 1) * max_abs_x * w_norm decreases in pi; set it equal to tol and solve "
    "for e^pi (keep the n - 1 in the denominator), and return 0.0 when pi = 0 already meets the tolerance.",
)
def _check_ch09_conv_heads(student) -> None:
    """``student(n, tol, max_abs_x=1.0, w_norm=1.0)`` must return the smallest peak ``pi >= 0`` with ``2 (n-1) / (e^pi + n-1) * max_abs_x * w_norm <= tol``, found by bisection."""
    import math

    def bound(pi, n, x, w):
        return 0.0 if n == 1 else 2 * (n - 1) / (math.exp(min(pi, 700.0)) + (n - 1)) * x * w

    def bisect(n, tol, x, w):
        if bound(0.0, n, x, w) <= tol:
            return 0.0
        lo, hi = 0.0, 1.0
        while bound(hi, n, x, w) > tol:
            lo, hi = hi, 2 * hi
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if bound(mid, n, x, w) <= tol else (mid, hi)
        return hi

    cases = [
        (1024, 1e-6, 1.0, 1.0),  # the exercise's numbers
        (2, 0.5, 1.0, 1.0),  # few pixels: the n - 1 in the denominator matters
        (16, 1.0, 1.0, 1.0),
        (4096, 1e-3, 10.0, 9.0),
        (10**6, 1e-12, 1.0, 1.0),
        (1, 1e-9, 1.0, 1.0),  # one pixel: no other pixel to leak weight to
        (64, 2.0, 1.0, 1.0),  # a tolerance so loose that pi = 0 is enough
    ]
    for n, tol, x, w in cases:
        expected = bisect(n, tol, x, w)
        what = f"n={n}, tol={tol}, max_abs_x={x}, w_norm={w}"
        got = _real_number(student(n, tol, max_abs_x=x, w_norm=w), what)
        assert abs(got - expected) <= 1e-6 * max(1.0, expected), (
            f"for {what} you return pi = {got!r}, where the bound is {bound(got, n, x, w):.4g}; the smallest "
            f"pi >= 0 with the bound <= tol is {expected:.8g}."
        )


# ---------------------------------------------------------------------------------------------
# Chapter 10: graph attention
# ---------------------------------------------------------------------------------------------
def _random_edge_index(gen: torch.Generator, n: int, e: int) -> torch.Tensor:
    return torch.randint(0, n, (2, e), generator=gen)


@register(
    "ch10-gcn-propagation",
    hint="drop the existing self-loops, set A[i, j] = 1 for every edge j -> i (row = target), add the identity, "
    "take deg = row sums of A + I and return (A + I) / sqrt(deg_i deg_j).",
)
def _check_ch10_gcn_propagation(student) -> None:
    """``student(edge_index, num_nodes)`` must be the dense ``D^-1/2 (A + I) D^-1/2`` that GCNLayer applies."""
    from .graph import GCNLayer

    gen = torch.Generator().manual_seed(1001)
    cases = [
        ("a path 0 - 1 - 2 (both directions)", torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), 3),
        ("a graph with an isolated node 4", torch.tensor([[0, 1, 2, 3], [1, 0, 3, 2]]), 5),
        ("existing self-loops (to be replaced)", torch.tensor([[0, 0, 1, 2, 2], [0, 1, 0, 2, 1]]), 3),
        ("a random directed graph", torch.unique(_random_edge_index(gen, 8, 20), dim=1), 8),
    ]
    for what, edge_index, n in cases:
        used, weight = GCNLayer(1, 1).edge_weights(edge_index, n)
        expected = torch.zeros(n, n).index_put_((used[1], used[0]), weight, accumulate=True)
        _assert_close(student(edge_index, n), expected, what)


@register(
    "ch10-edge-softmax",
    hint="for each target node take the maximum of its edges' scores (scatter_reduce with 'amax'), subtract it, "
    "exponentiate, sum per target with index_add_, and divide each edge by its target's sum.",
)
def _check_ch10_edge_softmax(student) -> None:
    """``student(scores, target, num_nodes)`` must equal :func:`attnbook.graph.edge_softmax`."""
    from .graph import edge_softmax

    gen = torch.Generator().manual_seed(1002)
    target = torch.randint(0, 6, (15,), generator=gen)
    cases = [
        ("scores of shape (E,)", torch.randn(15, generator=gen)),
        ("scores of shape (E, heads=3)", torch.randn(15, 3, generator=gen)),
        ("scores around 1000 (overflow test)", torch.randn(15, 2, generator=gen) + 1000.0),
    ]
    for what, scores in cases:
        actual = student(scores, target, 7)  # node 6 (and maybe others) has no incoming edge
        assert not torch.isnan(actual).any(), f"{what}: your weights contain NaN."
        _assert_close(actual, edge_softmax(scores, target, 7), what)


@register(
    "ch10-gat-coefficients",
    hint="z = (x @ weight.T).view(N, heads, out_dim); s_src = (z * att_src).sum(-1) and s_dst likewise, "
    "both (N, heads); e[h, i, j] = leaky_relu(s_dst[i, h] + s_src[j, h], negative_slope); add the identity to "
    "adj, fill the non-edges with -inf and softmax over j (the last dim).",
)
def _check_ch10_gat_coefficients(student) -> None:
    """``student(x, adj, weight, att_src, att_dst, negative_slope)`` must equal ``GATLayer.forward_dense``'s weights."""
    from .graph import GATLayer, to_dense_adjacency

    gen = torch.Generator().manual_seed(1003)
    cases = [
        ("one head on a path 0 - 1 - 2 plus an isolated node 3", torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), 4, 1, 0.2),
        ("3 heads on a graph that already has self-loops", torch.tensor([[0, 0, 1, 2, 2, 3], [0, 1, 0, 2, 3, 3]]), 4, 3, 0.2),
        ("2 heads on a random directed graph, negative_slope = 0.01", _random_edge_index(gen, 7, 15), 7, 2, 0.01),
    ]
    for what, edge_index, n, heads, slope in cases:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(heads)
            layer = GATLayer(5, 4, heads=heads, negative_slope=slope).eval()
        x = torch.randn(n, 5, generator=gen)
        adj = to_dense_adjacency(edge_index, n)
        with torch.no_grad():
            _, expected = layer.forward_dense(x, adj, return_attention=True)
        actual = student(x, adj.clone(), layer.lin.weight.detach().clone(), layer.att_src.detach().clone(),
                         layer.att_dst.detach().clone(), slope)
        assert isinstance(actual, torch.Tensor), f"return a torch.Tensor, got {type(actual).__name__}."
        assert not torch.isnan(actual).any(), f"{what}: your weights contain NaN."
        _assert_close(actual, expected, what)



# ---------------------------------------------------------------------------------------------
# Chapter 11: attention's relatives
# ---------------------------------------------------------------------------------------------
@register(
    "ch11-hopfield-step",
    hint="scores = beta * query @ patterns^T (one row per query), softmax over the patterns (last dim), "
    "then multiply by the patterns: one attention step with keys = values = patterns.",
)
def _check_ch11_hopfield_step(student) -> None:
    """``student(query, patterns, beta)`` must equal :func:`attnbook.connections.hopfield_update`."""
    from .connections import hopfield_update

    gen = torch.Generator().manual_seed(1101)
    patterns = torch.randn(10, 6, generator=gen)
    cases = [
        ("one query, beta = 1", torch.randn(1, 6, generator=gen), patterns, 1.0),
        ("three queries, beta = 0.1 (soft: an average)", torch.randn(3, 6, generator=gen), patterns, 0.1),
        ("beta = 50 (sharp, overflow test)", 10 * torch.randn(2, 6, generator=gen), patterns, 50.0),
        ("a batch of pattern sets (2, N, d)", torch.randn(2, 3, 6, generator=gen), torch.randn(2, 5, 6, generator=gen), 2.0),
    ]
    for what, query, pats, beta in cases:
        actual = student(query, pats, beta)
        assert not torch.isnan(actual).any(), f"{what}: your update contains NaN."
        _assert_close(actual, hopfield_update(query, pats, beta), what)


@register(
    "ch11-ssm-matrix",
    hint="the kernel is K[d, k] = sum_n c[d, n] * a[d, n]**k * b[d, n]; the matrix is T[d, t, s] = K[d, t - s] "
    "for s <= t and 0 above the diagonal (index K with t - s and mask with a lower triangle).",
)
def _check_ch11_ssm_matrix(student) -> None:
    """``student(a, b, c, length)`` -> ``(D, L, L)`` with ``y[:, :, d] = x[:, :, d] @ T[d].T`` = the SSM's output."""
    from .connections import ssm_convolution

    gen = torch.Generator().manual_seed(1102)
    for D, N, L in [(1, 1, 4), (3, 4, 9), (2, 8, 16)]:
        a = torch.rand(D, N, generator=gen, dtype=torch.float64) * 0.95
        b = torch.randn(D, N, generator=gen, dtype=torch.float64)
        c = torch.randn(D, N, generator=gen, dtype=torch.float64)
        T = torch.as_tensor(student(a, b, c, L))
        assert T.shape == (D, L, L), f"D={D}, L={L}: expected shape ({D}, {L}, {L}), got {tuple(T.shape)}."
        assert (T.triu(1) == 0).all(), f"D={D}, L={L}: T must be lower-triangular (an SSM is causal)."
        x = torch.randn(2, L, D, generator=gen, dtype=torch.float64)
        y = torch.einsum("dts,bsd->btd", T.to(x.dtype), x)
        _assert_close(y, ssm_convolution(x, a, b, c), f"the output of your matrix, D={D}, N={N}, L={L}", atol=1e-8)


@register(
    "ch11-ssm-step",
    hint="broadcast the input over the state with x_t.unsqueeze(-1): h_new = a * h + b * x_t[..., None] is "
    "(B, D, N); the output sums c * h_new over the last (state) dimension. Return a new tensor, not h modified.",
)
def _check_ch11_ssm_step(student) -> None:
    """Scanning ``student(x_t, h, a, b, c)`` over a sequence must equal :func:`attnbook.connections.ssm_recurrent`."""
    from .connections import ssm_recurrent

    gen = torch.Generator().manual_seed(1103)
    cases = [  # (what, B, D, N, L, a = 0?, non-zero initial state?)
        ("a = 0 (no memory: y_t = sum_n c b x_t)", 1, 2, 3, 3, True, False),
        ("B=2, D=3, N=4 from a zero state", 2, 3, 4, 6, False, False),
        ("B=3, D=2, N=8 from a non-zero state", 3, 2, 8, 5, False, True),
    ]
    for what, B, D, N, L, no_memory, warm in cases:
        a = torch.zeros(D, N, dtype=torch.float64) if no_memory else torch.rand(D, N, generator=gen, dtype=torch.float64)
        b, c = (torch.randn(D, N, generator=gen, dtype=torch.float64) for _ in range(2))
        x = torch.randn(B, L, D, generator=gen, dtype=torch.float64)
        h0 = torch.randn(B, D, N, generator=gen, dtype=torch.float64) if warm else torch.zeros(B, D, N, dtype=torch.float64)
        y_expected, h_expected = ssm_recurrent(x, a, b, c, state=h0.clone())
        h, ys = h0.clone(), []
        for t in range(L):
            h_before = h.clone()
            out = student(x[:, t].clone(), h, a, b, c)
            assert isinstance(out, tuple) and len(out) == 2, f"{what}: return a pair (y_t, h_new), got {type(out).__name__}."
            assert torch.equal(h, h_before), f"{what}: your step changed the state h in place; return a new tensor."
            y_t, h = (torch.as_tensor(o) for o in out)
            assert y_t.shape == (B, D) and h.shape == (B, D, N), (
                f"{what}: expected y_t {(B, D)} and h_new {(B, D, N)}, got {tuple(y_t.shape)} and {tuple(h.shape)}."
            )
            ys.append(y_t)
        _assert_close(torch.stack(ys, dim=1), y_expected, f"{what}: the outputs y_1..y_{L}", atol=1e-8)
        _assert_close(h, h_expected, f"{what}: the final state", atol=1e-8)


def _retention_recurrence(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, gamma: float) -> torch.Tensor:
    """Outputs ``y_t = phi(q_t)^T S_t`` of ``S_t = gamma S_{t-1} + phi(k_t) v_t^T`` from ``S_0 = 0``, one step at a time."""
    state = torch.zeros(phi_k.shape[-1], v.shape[-1], dtype=v.dtype)
    ys = []
    for t in range(v.shape[0]):
        state = gamma * state + torch.outer(phi_k[t], v[t])
        ys.append(phi_q[t] @ state)
    return torch.stack(ys)


@register(
    "ch11-linear-attention-ssm",
    hint="unroll S_t = gamma S_{t-1} + phi(k_t) v_t^T: how many times is key s's write multiplied by gamma before "
    "output t reads it (none when s = t), and what does output t see of keys s > t? Rows are queries t, columns keys s.",
)
def _check_ch11_linear_attention_ssm(student) -> None:
    """``student(n, gamma)`` -> ``M`` (n, n) such that ``(M * phi(Q) phi(K)^T) V`` equals the decayed recurrence run step by step."""
    from .linear import elu_feature_map

    gen = torch.Generator().manual_seed(1104)
    for n, gamma in [(1, 0.9), (2, 0.5), (5, 0.9), (8, 0.3), (9, 0.99), (6, 1.0)]:
        what = f"n={n}, gamma={gamma}"
        M = student(n, gamma)
        assert isinstance(M, torch.Tensor) and M.is_floating_point(), (
            f"{what}: return a float torch.Tensor, got {type(M).__name__}"
            + (f" of dtype {M.dtype}." if isinstance(M, torch.Tensor) else ".")
        )
        assert M.shape == (n, n), f"{what}: expected shape ({n}, {n}), got {tuple(M.shape)}."
        M = M.double()
        # phi = 1 (one feature) and V = I make the recurrence's output y_t[s] the mask entry M[t, s] itself
        ones = torch.ones(n, 1, dtype=torch.float64)
        impulse = _retention_recurrence(ones, ones, torch.eye(n, dtype=torch.float64), gamma)
        wrong = (~torch.isclose(M, impulse, atol=1e-6, rtol=1e-5)).nonzero()
        assert not len(wrong), (
            f"{what}: M[t, s] for (t, s) = {tuple(wrong[0].tolist())} should be {impulse[tuple(wrong[0])].item():.6g} "
            f"(the recurrence's output y_t[s] with phi = 1 and V = I), got {M[tuple(wrong[0])].item():.6g}."
        )
        phi_q, phi_k = (elu_feature_map(torch.randn(n, 4, generator=gen, dtype=torch.float64)) for _ in range(2))
        v = torch.randn(n, n + 2, generator=gen, dtype=torch.float64)
        _assert_close((M * (phi_q @ phi_k.T)) @ v, _retention_recurrence(phi_q, phi_k, v, gamma),
                      f"{what}: (M * phi(Q) phi(K)^T) V against the recurrence on random inputs", atol=1e-6)

