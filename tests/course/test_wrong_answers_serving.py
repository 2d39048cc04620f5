"""Plausible wrong answers to the exercises of the chapter on serving attention: each
fails its check with a message that points at the mistake."""

import pytest
import torch
from wrong_answers import Mistake, mistake_test, verdict

from attnbook.course.checks import common, serving
from attnbook.serving import (
    SinkKVCache,
    cache_bytes_per_token,
    dequantize,
    quantize,
    speculative_accept,
)


# serving-cache-bytes: the book's solution with one thing changed
def _cache_bytes(
    kind,
    n_layers,
    n_heads,
    head_dim,
    n_kv_heads=None,
    kv_latent_dim=None,
    rope_dim=None,
    bytes_per_elem=2,
    *,
    mla_factor=1,
    rope_heads=False,
    gqa_heads="kv",
    kv_factor=2,
    size=None,
    unit=1,
):
    if kind == "mla":
        rope = rope_dim * (n_heads if rope_heads else 1)
        per_layer = mla_factor * (kv_latent_dim + rope)
    else:
        gqa = n_kv_heads if gqa_heads == "kv" else n_heads
        kv_heads = {"mha": n_heads, "gqa": gqa, "mqa": 1}[kind]
        per_layer = kv_factor * kv_heads * head_dim
    return n_layers * per_layer * (bytes_per_elem if size is None else size) * unit


def _bytes_mla_twice(kind, n_layers, n_heads, head_dim, **kw):
    return _cache_bytes(kind, n_layers, n_heads, head_dim, **kw, mla_factor=2)


def _bytes_rope_per_head(kind, n_layers, n_heads, head_dim, **kw):
    return _cache_bytes(kind, n_layers, n_heads, head_dim, **kw, rope_heads=True)


def _bytes_gqa_with_n_heads(kind, n_layers, n_heads, head_dim, **kw):
    return _cache_bytes(kind, n_layers, n_heads, head_dim, **kw, gqa_heads="all")


def _bytes_keys_only(kind, n_layers, n_heads, head_dim, **kw):
    return _cache_bytes(kind, n_layers, n_heads, head_dim, **kw, kv_factor=1)


def _bytes_elements(kind, n_layers, n_heads, head_dim, **kw):
    return _cache_bytes(kind, n_layers, n_heads, head_dim, **kw, size=1)


def _bytes_always_two(kind, n_layers, n_heads, head_dim, **kw):
    return _cache_bytes(kind, n_layers, n_heads, head_dim, **kw, size=2)


def _bytes_in_bits(kind, n_layers, n_heads, head_dim, **kw):
    return _cache_bytes(kind, n_layers, n_heads, head_dim, **kw, unit=8)


def _bytes_mla_twice_and_per_head(kind, n_layers, n_heads, head_dim, **kw):
    return _cache_bytes(
        kind, n_layers, n_heads, head_dim, **kw, mla_factor=2, rope_heads=True
    )


def _bytes_as_a_float(kind, n_layers, n_heads, head_dim, **kw):
    return float(_cache_bytes(kind, n_layers, n_heads, head_dim, **kw))


# serving-speculative-accept: the book's solution with one thing changed
def _accept(
    p,
    q,
    draft_tokens,
    u,
    *,
    rule="ratio",
    stop=True,
    residual=lambda p, q: (p - q).clamp_min(0.0),
    normalize=True,
    bonus=True,
):
    k = q.shape[0]
    n, first_rejection = 0, None
    for i in range(k):
        x = draft_tokens[i]
        if rule == "ratio":
            ok = u[i] < min(1.0, (p[i, x] / q[i, x]).item())
        elif rule == "p>q":
            ok = bool(p[i, x] > q[i, x])
        else:  # the ratio upside down
            ok = u[i] < min(1.0, (q[i, x] / p[i, x]).item())
        if ok:
            n += 1
        elif first_rejection is None:
            first_rejection = i
            if stop:
                break
    at = first_rejection if first_rejection is not None else k
    if at == k:
        if bonus:
            return n, p[k]
        at = k - 1
    r = residual(p[at], q[at])
    return n, (r / r.sum() if normalize else r)


def _accept_iff_p_above_q(p, q, draft_tokens, u):
    return _accept(p, q, draft_tokens, u, rule="p>q")


def _accept_ratio_upside_down(p, q, draft_tokens, u):
    return _accept(p, q, draft_tokens, u, rule="q/p")


def _accept_counts_past_a_rejection(p, q, draft_tokens, u):
    return _accept(p, q, draft_tokens, u, stop=False)


def _accept_residual_q_minus_p(p, q, draft_tokens, u):
    return _accept(p, q, draft_tokens, u, residual=lambda p, q: (q - p).clamp_min(0.0))


def _accept_residual_not_normalized(p, q, draft_tokens, u):
    return _accept(p, q, draft_tokens, u, normalize=False)


def _accept_resamples_from_p(p, q, draft_tokens, u):
    return _accept(p, q, draft_tokens, u, residual=lambda p, q: p)


def _accept_residual_without_the_max(p, q, draft_tokens, u):
    return _accept(p, q, draft_tokens, u, residual=lambda p, q: p - q)


def _accept_without_the_bonus_token(p, q, draft_tokens, u):
    return _accept(p, q, draft_tokens, u, bonus=False)


def _accept_last_row_of_p_as_bonus(p, q, draft_tokens, u):
    n, dist = _accept(p, q, draft_tokens, u)
    return n, (p[q.shape[0] - 1] if n == q.shape[0] else dist)


def _accept_with_a_tensor_count(p, q, draft_tokens, u):
    n, dist = _accept(p, q, draft_tokens, u)
    return torch.tensor(n), dist


# serving-quantize-int8: the book's solution with one thing changed
def _quantize(
    x,
    bits,
    dim,
    *,
    levels=lambda bits: 2**bits - 1,
    rnd=torch.round,
    stats_dim=None,
    zero_point=True,
    guard=True,
):
    over = dim if stats_dim is None else stats_dim(dim)
    lo = x.amin(over, keepdim=True)
    scale = (x.amax(over, keepdim=True) - lo) / levels(bits)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale)) if guard else scale
    codes = rnd((x - lo) / safe)
    return codes * scale + (lo if zero_point else 0)


def _quantize_symmetric(x, bits, dim):
    top = 2 ** (bits - 1) - 1
    scale = x.abs().amax(dim, keepdim=True) / top
    return torch.round(x / scale).clamp(-top - 1, top) * scale


def _quantize_truncated(x, bits, dim):
    return _quantize(x, bits, dim, rnd=torch.floor)


def _quantize_by_casting(x, bits, dim):  # the cast to uint8 truncates
    return _quantize(x, bits, dim, rnd=lambda t: t.to(torch.uint8).float())


def _quantize_2_pow_bits_levels(x, bits, dim):
    return _quantize(x, bits, dim, levels=lambda bits: 2**bits)


def _quantize_stats_over_the_last_dim(x, bits, dim):
    return _quantize(x, bits, dim, stats_dim=lambda dim: -1)


def _quantize_stats_over_the_other_dim(x, bits, dim):
    return _quantize(x, bits, dim, stats_dim=lambda dim: -1 if dim == -2 else -2)


def _quantize_without_the_zero_point(x, bits, dim):
    return _quantize(x, bits, dim, zero_point=False)


def _quantize_without_a_guard(x, bits, dim):
    return _quantize(x, bits, dim, guard=False)


def _quantize_without_keepdim(x, bits, dim):
    lo = x.amin(dim)
    scale = (x.amax(dim) - lo) / (2**bits - 1)
    return torch.round((x - lo) / scale.clamp_min(1e-12)) * scale + lo


# serving-sink-positions: the book's solution with one thing changed
def _sinks(
    n_seen,
    n_sink,
    window,
    *,
    sinks=True,
    recent=lambda n_seen, n_sink, window: max(n_sink, n_seen - window),
    first=lambda n_seen, n_sink: min(n_sink, n_seen),
):
    kept = list(range(first(n_seen, n_sink))) if sinks else []
    return kept + list(range(recent(n_seen, n_sink, window), n_seen))


def _sinks_left_out(n_seen, n_sink, window):
    return _sinks(
        n_seen, n_sink, window, sinks=False, recent=lambda n, s, w: max(0, n - w)
    )


def _sinks_inside_the_window(n_seen, n_sink, window):
    return _sinks(n_seen, n_sink, window, recent=lambda n, s, w: max(s, n - (w - s)))


def _sinks_window_one_short(n_seen, n_sink, window):
    return _sinks(n_seen, n_sink, window, recent=lambda n, s, w: max(s, n - w + 1))


def _sinks_with_duplicates(n_seen, n_sink, window):
    return _sinks(n_seen, n_sink, window, recent=lambda n, s, w: max(0, n - w))


def _sinks_not_yet_seen(n_seen, n_sink, window):
    return _sinks(n_seen, n_sink, window, first=lambda n, s: s)


def _sinks_recent_first(n_seen, n_sink, window):
    sinks = list(range(min(n_sink, n_seen)))
    return list(range(max(n_sink, n_seen - window), n_seen)) + sinks


def _sinks_as_a_tensor(n_seen, n_sink, window):
    return torch.tensor(_sinks(n_seen, n_sink, window))


MISTAKES = [
    Mistake(
        "serving-cache-bytes",
        "MLA's latent counted twice",
        _bytes_mla_twice,
        (
            "cache_bytes('mla', n_layers=60, n_heads=128, head_dim=128, "
            "kv_latent_dim=512, rope_dim=64, bytes_per_elem=2) should be 69120",
            "got 138240",
            "You count MLA's latent twice",
        ),
    ),
    Mistake(
        "serving-cache-bytes",
        "rotary key counted per head",
        _bytes_rope_per_head,
        ("should be 69120", "You count the rotary key per head"),
    ),
    Mistake(
        "serving-cache-bytes",
        "GQA with n_heads",
        _bytes_gqa_with_n_heads,
        (
            "cache_bytes('gqa', n_layers=32, n_heads=32, head_dim=128, n_kv_heads=8, "
            "bytes_per_elem=2) should be 131072 (2 x 32 layers x 8 KV heads x "
            "head_dim 128 x 2 bytes), got 524288.",
            "For GQA you count n_heads key and value heads",
        ),
    ),
    Mistake(
        "serving-cache-bytes",
        "no factor 2 for keys and values",
        _bytes_keys_only,
        (
            "cache_bytes('mha', n_layers=32",
            "should be 524288",
            "You count the keys only",
        ),
    ),
    Mistake(
        "serving-cache-bytes",
        "bytes_per_elem left out",
        _bytes_elements,
        ("should be 524288", "got 262144", "You count elements"),
    ),
    Mistake(
        "serving-cache-bytes",
        "2 bytes whatever bytes_per_elem",
        _bytes_always_two,
        (
            "n_kv_heads=8, bytes_per_elem=1) should be 163840",
            "You multiply by 2 bytes whatever bytes_per_elem is",
        ),
    ),
    Mistake(
        "serving-cache-bytes",
        "bits",
        _bytes_in_bits,
        ("should be 524288", "got 4194304", "You return bits"),
    ),
    Mistake(
        "serving-cache-bytes",
        "MLA twice and the rotary key per head: both named",
        _bytes_mla_twice_and_per_head,
        ("You count MLA's latent twice", "You count the rotary key per head"),
    ),
    Mistake(
        "serving-cache-bytes",
        "a float",
        _bytes_as_a_float,
        ("return a number of bytes as an int, got float 524288.0",),
    ),
    Mistake(
        "serving-speculative-accept",
        "accepts iff p > q",
        _accept_iff_p_above_q,
        (
            "(all 3 draft tokens accepted; min(1, p/q) at the draft tokens:",
            "n_accepted should be 3, got 1",
            "You accept a draft token only where p(x) > q(x)",
        ),
    ),
    Mistake(
        "serving-speculative-accept",
        "ratio q / p",
        _accept_ratio_upside_down,
        ("n_accepted should be", "Your ratio is upside down"),
    ),
    Mistake(
        "serving-speculative-accept",
        "counts past a rejection",
        _accept_counts_past_a_rejection,
        (
            "draft token 0 rejected",
            "n_accepted should be 0, got 2",
            "stop at the first rejection",
        ),
    ),
    Mistake(
        "serving-speculative-accept",
        "residual max(0, q - p)",
        _accept_residual_q_minus_p,
        (
            "draft token 0 rejected",
            "next_distribution should be max(0, p[0] - q[0]) normalized",
            "Your residual is max(0, q - p)",
        ),
    ),
    Mistake(
        "serving-speculative-accept",
        "residual not normalized",
        _accept_residual_not_normalized,
        ("draft token 0 rejected", "Normalize the residual"),
    ),
    Mistake(
        "serving-speculative-accept",
        "resamples from p",
        _accept_resamples_from_p,
        ("draft token 0 rejected", "you return the target's p[n]"),
    ),
    Mistake(
        "serving-speculative-accept",
        "residual without the max",
        _accept_residual_without_the_max,
        ("draft token 0 rejected", "has negative entries", "clamp it at 0 first"),
    ),
    Mistake(
        "serving-speculative-accept",
        "no bonus token: the residual at k - 1",
        _accept_without_the_bonus_token,
        (
            "all 3 draft tokens accepted",
            "should be p[3] (all 3 draft tokens accepted: the bonus token)",
            "the next token is the target's bonus token",
        ),
    ),
    Mistake(
        "serving-speculative-accept",
        "no bonus token: p[k - 1]",
        _accept_last_row_of_p_as_bonus,
        ("should be p[3]", "the target's bonus token"),
    ),
    Mistake(
        "serving-speculative-accept",
        "n_accepted as a tensor",
        _accept_with_a_tensor_count,
        ("n_accepted: return an int (int(n) for a tensor), got Tensor",),
    ),
    Mistake(
        "serving-quantize-int8",
        "symmetric",
        _quantize_symmetric,
        (
            "keys (16, 8) with outlier channels",
            "dim=-2: ",
            "You quantize symmetrically",
        ),
    ),
    Mistake(
        "serving-quantize-int8",
        "truncated",
        _quantize_truncated,
        ("bits=8, dim=-2: ", "values are off", "You truncate"),
    ),
    Mistake(
        "serving-quantize-int8",
        "truncated by a cast",
        _quantize_by_casting,
        ("bits=8, dim=-2: ", "You truncate"),
    ),
    Mistake(
        "serving-quantize-int8",
        "2**bits levels",
        _quantize_2_pow_bits_levels,
        ("bits=8, dim=-2: ", "You divide the range into 2**bits steps"),
    ),
    Mistake(
        "serving-quantize-int8",
        "statistics over the last dim",
        _quantize_stats_over_the_last_dim,
        ("bits=8, dim=-2: ", "Your min and max are over dim 1: take them over dim=-2"),
    ),
    Mistake(
        "serving-quantize-int8",
        "statistics over the other of the last two dims",
        _quantize_stats_over_the_other_dim,
        ("bits=8, dim=-2: ", "Your min and max are over dim 1"),
    ),
    Mistake(
        "serving-quantize-int8",
        "no zero point",
        _quantize_without_the_zero_point,
        ("bits=8, dim=-2: ", "You forgot the zero point"),
    ),
    Mistake(
        "serving-quantize-int8",
        "0 / 0 on a constant slice",
        _quantize_without_a_guard,
        (
            "x (6, 5) whose row 1 is constant and row 4 all zeros, bits=8, dim=-1",
            "your output has NaN or inf",
            "divide by 1 where s == 0",
        ),
    ),
    Mistake(
        "serving-quantize-int8",
        "statistics without keepdim",
        _quantize_without_keepdim,
        ("dim=-1: your code raised RuntimeError", "keepdim=True"),
    ),
    Mistake(
        "serving-sink-positions",
        "no sinks",
        _sinks_left_out,
        (
            "sink_positions(n_seen=12, n_sink=4, window=8) should be [0, 1, 2, 3, 4,",
            "got [4, 5, 6, 7, 8, 9, 10, 11]",
            "You keep only the last window positions",
        ),
    ),
    Mistake(
        "serving-sink-positions",
        "sinks inside the window",
        _sinks_inside_the_window,
        (
            "sink_positions(n_seen=12, n_sink=4, window=8)",
            "got [0, 1, 2, 3, 8, 9, 10, 11]",
            "You count the sinks inside the window",
        ),
    ),
    Mistake(
        "serving-sink-positions",
        "window one short",
        _sinks_window_one_short,
        ("n_seen=12, n_sink=4, window=8", "Off by one at the window's start"),
    ),
    Mistake(
        "serving-sink-positions",
        "duplicates",
        _sinks_with_duplicates,
        (
            "sink_positions(n_seen=2, n_sink=4, window=8) should be [0, 1], got "
            "[0, 1, 0, 1].",
            "list it once",
        ),
    ),
    Mistake(
        "serving-sink-positions",
        "sinks not yet seen",
        _sinks_not_yet_seen,
        (
            "sink_positions(n_seen=2, n_sink=4, window=8) should be [0, 1], got "
            "[0, 1, 2, 3]",
            "only min(n_sink, n_seen) sinks exist",
        ),
    ),
    Mistake(
        "serving-sink-positions",
        "recent positions first",
        _sinks_recent_first,
        ("n_seen=7", "got [4, 5, 6, 0, 1, 2, 3]", "in increasing order"),
    ),
    Mistake(
        "serving-sink-positions",
        "a tensor",
        _sinks_as_a_tensor,
        ("return a list of ints, got Tensor (use .tolist())",),
    ),
]

test_wrong_answers = mistake_test(MISTAKES)


# ---------------------------------------------------------------------------------
# The checks' references against attnbook.serving
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("salt", [0, 1, 2**40 + 7])
def test_the_cache_bytes_cases_and_slips_follow_cache_bytes_per_token(salt):
    with common.fresh_inputs(salt):
        cases = serving._bytes_cases(common.generator(1001))
    for case in cases:
        args = {k: v for k, v in case.items() if k != "kind"}
        assert serving._cache_bytes(case) == cache_bytes_per_token(case["kind"], **args)
        assert serving._cache_bytes(case) == _cache_bytes(**case)
    # every single slip changes some case, so each can be told apart from the answer
    for slip in serving._BYTES_SLIPS:
        assert any(
            serving._cache_bytes(c, (slip,)) != serving._cache_bytes(c) for c in cases
        )


def test_the_accept_rule_is_speculative_accepts_given_its_uniforms():
    """``speculative_accept`` draws its uniforms first, from the generator: drawn from
    a copy of the generator, they are the ``u`` of the check's rule, and the count
    agrees exactly; its next token is then drawn from the rule's distribution."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        k = 1 + trial % 5
        V = 3 + trial % 7
        p = torch.softmax(2 * torch.randn(1, k + 1, V, generator=gen), -1)
        q = torch.softmax(2 * torch.randn(1, k, V, generator=gen), -1)
        if trial % 4 == 0:
            q = p[:, :k].clone()
        x = torch.multinomial(q[0], 1, generator=gen).T
        seed = 1000 + trial
        u = torch.rand((1, k), generator=torch.Generator().manual_seed(seed))
        n, token = speculative_accept(
            p, q, x, generator=torch.Generator().manual_seed(seed)
        )
        n_rule, dist = serving._accept(p[0], q[0], x[0], u[0])
        assert int(n[0]) == n_rule
        assert dist[token[0]] > 0
        assert torch.isclose(dist.sum(), torch.tensor(1.0, dtype=dist.dtype))


def test_the_next_token_of_speculative_accept_is_drawn_from_the_rules_distribution():
    """Over many draws of one case: grouped by the count, the next tokens of
    ``speculative_accept`` have the frequencies of the rule's distribution."""
    gen = torch.Generator().manual_seed(1)
    k, V, draws, seed = 3, 6, 20000, 7
    p = torch.softmax(1.5 * torch.randn(1, k + 1, V, generator=gen), -1)
    q = torch.softmax(1.5 * torch.randn(1, k, V, generator=gen), -1)
    x = torch.multinomial(q[0], 1, generator=gen).T
    u = torch.rand((draws, k), generator=torch.Generator().manual_seed(seed))
    n, token = speculative_accept(
        p.expand(draws, -1, -1),
        q.expand(draws, -1, -1),
        x.expand(draws, -1),
        generator=torch.Generator().manual_seed(seed),
    )
    tested = 0
    for m in range(k + 1):
        rows = (n == m).nonzero()[:, 0]
        if len(rows) < 300:
            continue
        n_rule, dist = serving._accept(p[0], q[0], x[0], u[rows[0]])
        assert n_rule == m
        freq = torch.bincount(token[rows], minlength=V).double() / len(rows)
        sd = (dist * (1 - dist) / len(rows)).sqrt()
        assert ((freq - dist).abs() <= 5 * sd + 1e-3).all(), (m, freq, dist)
        tested += 1
    assert tested >= 2


@pytest.mark.parametrize("salt", [0, 3])
def test_the_quantize_cases_are_dequantize_of_quantize_and_the_slips_differ(salt):
    with common.fresh_inputs(salt):
        cases = serving._quant_cases(common.generator(1003))
    for _, x, bits, dim in cases:
        expected = dequantize(quantize(x, bits, dim=dim))
        lo = x.amin(dim, keepdim=True)
        scale = (x.amax(dim, keepdim=True) - lo) / (2**bits - 1)
        assert ((expected - x).abs() <= scale / 2 + 1e-5).all()
        assert torch.isfinite(expected).all()
    # the first case (keys, per channel, 8 bits) tells every slip from the answer
    _, x, bits, dim = cases[0]
    expected = dequantize(quantize(x, bits, dim=dim))
    for slip, note in serving._quant_slips(x, bits, dim):
        assert serving._quant_wrong(slip(), x, bits, dim, expected).any(), note


def test_the_sink_positions_follow_sinkkvcache_and_its_docstring():
    for n_sink in range(5):
        for window in range(1, 6):
            cache = SinkKVCache(1, 1, 1, 1, n_sink, window)
            one = torch.zeros(1, 1, 1, 1)
            for n in range(1, 20):
                k, _ = cache.update(0, one, one)
                held = cache.positions(0).tolist()
                first = min(n_sink, n)
                assert held == list(range(first)) + list(
                    range(max(first, n - window), n)
                )
                assert k.shape[-2] == len(held)  # the step attended to what it holds
                assert serving._sink_positions(n, n_sink, window) == held


def test_the_book_solutions_with_nothing_changed_pass():
    for label, answer in [
        ("serving-cache-bytes", _cache_bytes),
        ("serving-speculative-accept", _accept),
        ("serving-quantize-int8", _quantize),
        ("serving-sink-positions", _sinks),
    ]:
        result = verdict(label, answer)
        assert result.passed, result.message
