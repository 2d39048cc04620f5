"""Checks for the exercises of the chapter on serving attention."""

from __future__ import annotations


import torch

from ...serving import (
    DEEPSEEK_V2,
    SinkKVCache,
    cache_bytes_per_token,
    dequantize,
    quantize,
)
from . import register
from .common import explain_slips, call_student, assert_int, generator
from .library import forbid


def _pick(gen: torch.Generator, options):
    """One of ``options``, drawn with ``gen``."""
    return options[torch.randint(len(options), (1,), generator=gen).item()]


def _uniform(gen: torch.Generator, lo: float = 0.0, hi: float = 1.0) -> float:
    return lo + (hi - lo) * torch.rand(1, generator=gen, dtype=torch.float64).item()


def _fmt(values, digits: int = 4) -> str:
    """A short list of floats, rounded."""
    values = torch.as_tensor(values).tolist()
    return "[" + ", ".join(f"{v:.{digits}g}" for v in values) + "]"


# ---------------------------------------------------------------------------------
# serving-cache-bytes
# ---------------------------------------------------------------------------------
_KINDS = ("mha", "gqa", "mqa", "mla")
_OPTIONAL = {"gqa": ("n_kv_heads",), "mla": ("kv_latent_dim", "rope_dim")}

# a slip's name and note; the names within one group exclude each other
_BYTES_SLIPS = {
    "mla-factor-2": "You count MLA's latent twice: keys and values are both rebuilt "
    "from ONE cached latent c^KV (by W^UK and W^UV), so MLA stores L (d_c + d_R) "
    "numbers per token, no factor 2.",
    "rope-per-head": "You count the rotary key per head: k^R is one d_R-wide vector "
    "shared by all heads, so MLA stores L (d_c + d_R), not L (d_c + n_heads d_R).",
    "mla-no-rope": "You left out the rotary key: besides the latent (d_c) MLA caches "
    "the decoupled RoPE key k^R (d_R) of every token, L (d_c + d_R).",
    "gqa-n-heads": "For GQA you count n_heads key and value heads: the cache holds "
    "n_kv_heads of them (the query heads share them in groups), 2 L n_kv_heads d_h.",
    "mqa-n-heads": "For MQA you count n_heads key and value heads: MQA has ONE key "
    "head and one value head shared by every query head, 2 L d_h.",
    "no-factor-2": "You count the keys only: MHA, GQA and MQA cache keys AND values "
    "(the factor 2).",
    "elements": "You count elements: multiply by bytes_per_elem to get bytes.",
    "fixed-2-bytes": "You multiply by 2 bytes whatever bytes_per_elem is: use the "
    "bytes_per_elem you are given (1 for int8/fp8, 4 for fp32).",
    "bits": "You return bits: return the number of bytes.",
}
_BYTES_GROUPS = [
    {"mla-factor-2"},
    {"rope-per-head", "mla-no-rope"},
    {"gqa-n-heads"},
    {"mqa-n-heads"},
    {"no-factor-2"},
    {"elements", "fixed-2-bytes", "bits"},
]


def _cache_bytes(case: dict, slips=()) -> int:
    """Bytes per token of ``case`` as :func:`attnbook.serving.cache_bytes_per_token`
    counts them, or with the named ``slips``."""
    kind, L = case["kind"], case["n_layers"]
    h, d = case["n_heads"], case["head_dim"]
    if kind == "mla":
        rope = case["rope_dim"] * (h if "rope-per-head" in slips else 1)
        rope = 0 if "mla-no-rope" in slips else rope
        per_layer = (2 if "mla-factor-2" in slips else 1) * (
            case["kv_latent_dim"] + rope
        )
    else:
        kv_heads = {
            "mha": h,
            "gqa": h if "gqa-n-heads" in slips else case.get("n_kv_heads"),
            "mqa": h if "mqa-n-heads" in slips else 1,
        }[kind]
        per_layer = (1 if "no-factor-2" in slips else 2) * kv_heads * d
    size = case["bytes_per_elem"]
    size = 1 if "elements" in slips else 2 if "fixed-2-bytes" in slips else size
    return L * per_layer * size * (8 if "bits" in slips else 1)


def _bytes_slip(results, cases) -> str:
    """The explanation of the fewest slips (two at most) that give the answer's
    ``results`` (None where it crashed or returned no int) on every case, or ''."""
    return explain_slips(results, cases, _cache_bytes, _BYTES_GROUPS, _BYTES_SLIPS)


def _bytes_formula(case: dict) -> str:
    L, d, b = case["n_layers"], case["head_dim"], case["bytes_per_elem"]
    if case["kind"] == "mla":
        dc, dr = case["kv_latent_dim"], case["rope_dim"]
        return f"{L} layers x (d_c + d_R = {dc} + {dr}) x {b} bytes"
    heads = {
        "mha": f"{case['n_heads']} heads",
        "gqa": f"{case.get('n_kv_heads')} KV heads",
        "mqa": "1 KV head",
    }[case["kind"]]
    return f"2 x {L} layers x {heads} x head_dim {d} x {b} bytes"


def _bytes_cases(gen: torch.Generator) -> list[dict]:
    """Published configurations, small odd ones, and one random one per kind."""
    ds = DEEPSEEK_V2
    big = dict(n_layers=ds["n_layers"], n_heads=ds["n_heads"], head_dim=ds["head_dim"])
    llama = dict(n_layers=32, n_heads=32, head_dim=128)
    cases = [
        dict(kind="mha", **llama, bytes_per_elem=2),  # Llama 2 7B
        dict(kind="gqa", **llama, n_kv_heads=8, bytes_per_elem=2),  # Llama 3 8B
        dict(
            kind="mla",
            **big,
            kv_latent_dim=ds["kv_latent_dim"],
            rope_dim=ds["rope_dim"],
            bytes_per_elem=2,
        ),  # DeepSeek-V2
        dict(kind="mha", **big, bytes_per_elem=2),  # DeepSeek-V2's heads, as MHA
        dict(kind="mqa", **llama, bytes_per_elem=2),
        dict(
            kind="gqa",
            n_layers=80,
            n_heads=64,
            head_dim=128,
            n_kv_heads=8,
            bytes_per_elem=1,
        ),  # Llama 2 70B in int8
        dict(kind="mha", n_layers=2, n_heads=3, head_dim=4, bytes_per_elem=4),
        dict(
            kind="gqa",
            n_layers=3,
            n_heads=6,
            head_dim=5,
            n_kv_heads=2,
            bytes_per_elem=4,
        ),
        dict(kind="mqa", n_layers=4, n_heads=8, head_dim=16, bytes_per_elem=1),
        dict(
            kind="mla",
            n_layers=3,
            n_heads=4,
            head_dim=8,
            kv_latent_dim=16,
            rope_dim=4,
            bytes_per_elem=4,
        ),
    ]
    for kind in _KINDS:  # configurations no answer can know
        h = _pick(gen, (4, 8, 16, 32))
        case = dict(
            kind=kind,
            n_layers=torch.randint(1, 41, (1,), generator=gen).item(),
            n_heads=h,
            head_dim=8 * torch.randint(1, 17, (1,), generator=gen).item(),
        )
        if kind == "gqa":
            case["n_kv_heads"] = _pick(gen, [g for g in range(1, h) if h % g == 0])
        if kind == "mla":
            case["kv_latent_dim"] = (
                16 * torch.randint(1, 33, (1,), generator=gen).item()
            )
            case["rope_dim"] = 8 * torch.randint(1, 9, (1,), generator=gen).item()
        case["bytes_per_elem"] = _pick(gen, (1, 2, 4))
        cases.append(case)
    return cases


@register(
    "serving-cache-bytes",
    library=forbid(
        "attnbook.serving.cache_bytes_per_token",
        "attnbook.kvcache.kv_cache_bytes",
        why="The exercise asks you to count each kind's cache per token, which "
            "cache_bytes_per_token, the check's reference, returns.",
    ),
    hint="per token and layer MHA caches 2 n_heads head_dim numbers (keys and "
    "values), GQA 2 n_kv_heads head_dim, MQA 2 head_dim, MLA its latent and shared "
    "rotary key, kv_latent_dim + rope_dim (once: keys and values come from the same "
    "latent); multiply by n_layers and by bytes_per_elem.",
)
def _check_cache_bytes(student) -> None:
    """``student(kind, n_layers, n_heads, head_dim, n_kv_heads=None,
    kv_latent_dim=None, rope_dim=None, bytes_per_elem=2)`` -> the KV-cache bytes (an
    int) one token of one sequence takes, ``kind`` one of ``"mha"``, ``"gqa"``,
    ``"mqa"``, ``"mla"``: equal to :func:`attnbook.serving.cache_bytes_per_token`.
    Called with ``kind, n_layers, n_heads, head_dim`` positional and the rest by
    keyword (``n_kv_heads`` for ``"gqa"`` only, ``kv_latent_dim`` and ``rope_dim`` for
    ``"mla"`` only, ``bytes_per_elem`` always)."""
    cases = _bytes_cases(generator(1001))

    def call(case):
        extra = {name: case[name] for name in _OPTIONAL.get(case["kind"], ())}
        extra["bytes_per_elem"] = case["bytes_per_elem"]
        args = (case["kind"], case["n_layers"], case["n_heads"], case["head_dim"])
        what = (
            f"cache_bytes({args[0]!r}, n_layers={args[1]}, n_heads={args[2]}, "
            f"head_dim={args[3]}, "
            + ", ".join(f"{name}={value}" for name, value in extra.items())
            + ")"
        )
        got = call_student(student, what, *args, **extra)
        assert_int(got, what, "a number of bytes as an int")
        return what, got

    for case in cases:
        what, got = call(case)
        expected = cache_bytes_per_token(
            **{name: value for name, value in case.items() if name != "kind"},
            kind=case["kind"],
        )
        if got != expected:
            results = []
            for other in cases:
                try:
                    results.append(call(other)[1])
                except AssertionError:
                    results.append(None)
            raise AssertionError(
                f"{what} should be {expected} ({_bytes_formula(case)}), got {got}."
                + _bytes_slip(results, cases)
            )


# ---------------------------------------------------------------------------------
# serving-speculative-accept
# ---------------------------------------------------------------------------------
def _accept(p, q, draft_tokens, u) -> tuple[int, torch.Tensor]:
    """The rule of speculative sampling (Leviathan et al., 2023, Algorithm 1) in
    float64: draft token ``i`` is accepted iff ``u[i] < min(1, p[i, x_i] / q[i,
    x_i])``, in order until the first rejection; then the next token's distribution
    is the normalized ``max(0, p[n] - q[n])`` after a rejection at ``n``, or ``p[k]``
    when all ``k`` are accepted."""
    p, q, u = p.double(), q.double(), u.double()
    k = q.shape[0]
    n = 0
    while n < k:
        x = draft_tokens[n]
        if not u[n] < min(1.0, (p[n, x] / q[n, x]).item()):
            break
        n += 1
    if n == k:
        return k, p[k]
    residual = (p[n] - q[n]).clamp_min(0.0)
    return n, residual / residual.sum()


def _ratios(p, q, draft_tokens) -> torch.Tensor:
    """``min(1, p[i, x_i] / q[i, x_i])`` for each draft token, float64."""
    i = torch.arange(len(draft_tokens))
    return (p.double()[i, draft_tokens] / q.double()[i, draft_tokens]).clamp(max=1.0)


def _count_while(flags) -> int:
    """The number of leading ``True`` in ``flags``."""
    n = 0
    while n < len(flags) and flags[n]:
        n += 1
    return n


def _n_slips(p, q, draft_tokens, u) -> list:
    """What plausible wrong rules return as ``n_accepted`` on this case, and notes."""
    k = len(draft_tokens)
    i = torch.arange(k)
    p_x = p.double()[i, draft_tokens]
    q_x = q.double()[i, draft_tokens]
    ratio = _ratios(p, q, draft_tokens)
    accepted = (u.double() < ratio).tolist()
    n = _count_while(accepted)
    return [
        (
            _count_while((p_x > q_x).tolist()),
            "You accept a draft token only where p(x) > q(x): the rule accepts it "
            "with probability min(1, p(x) / q(x)), i.e. when u < p(x) / q(x), so a "
            "token the draft over-proposes is still accepted sometimes.",
        ),
        (
            _count_while((p_x >= q_x).tolist()),
            "You accept a draft token only where p(x) >= q(x): the rule accepts it "
            "with probability min(1, p(x) / q(x)), i.e. when u < p(x) / q(x).",
        ),
        (
            sum(accepted),
            "You count every accepted draft token: stop at the first rejection (the "
            "tokens after it were drafted after a token the target replaces).",
        ),
        (
            min(n + 1, k),
            "You count the rejected token too: n_accepted is the number of draft "
            "tokens accepted before the first rejection.",
        ),
        (
            _count_while((u.double() > ratio).tolist()),
            "Your comparison is the wrong way round: accept when u < min(1, p(x) / "
            "q(x)), so a small u accepts.",
        ),
        (
            _count_while((u.double() < (q_x / p_x).clamp(max=1.0)).tolist()),
            "Your ratio is upside down: accept when u < p(x) / q(x), the target's "
            "probability over the draft's.",
        ),
    ]


def _n_slip(results, cases, failed: int) -> str:
    """The note of the first count slip that gives ``results`` (None where the answer
    crashed) on every case and changes one; else of the only one that gives the
    count of case ``failed``; else ''."""
    expected = [_accept(*case)[0] for case in cases]
    slips = [_n_slips(*case) for case in cases]
    for i, (_, note) in enumerate(slips[0]):
        wrong = [per_case[i][0] for per_case in slips]
        if wrong != expected and all(
            r is None or r == w for r, w in zip(results, wrong)
        ):
            return " " + note
    here = {
        note
        for wrong, note in slips[failed]
        if wrong == results[failed] != expected[failed]
    }
    return " " + here.pop() if len(here) == 1 else ""


def _normalized(t: torch.Tensor) -> torch.Tensor:
    return t / t.sum()


def _dist_slips(p, q, n: int) -> list:
    """What plausible wrong rules return as the next distribution when ``n`` (the
    right number) draft tokens are accepted, and notes."""
    p, q = p.double(), q.double()
    k = q.shape[0]
    if n == k:
        no_bonus = (
            "When all k draft tokens are accepted, the next token is the target's "
            "bonus token: draw it from p[k], the last row of p (the target's "
            "distribution after the k accepted tokens)."
        )
        return [
            (p[k - 1], no_bonus),
            (_normalized((p[k - 1] - q[k - 1]).clamp_min(0)), no_bonus),
            (q[k - 1], no_bonus),
        ]
    residual = (p[n] - q[n]).clamp_min(0)
    return [
        (
            _normalized((q[n] - p[n]).clamp_min(0)),
            "Your residual is max(0, q - p): after a rejection the next token comes "
            "from where the target has MORE mass than the draft, max(0, p[n] - q[n]), "
            "normalized.",
        ),
        (
            residual,
            "Normalize the residual: max(0, p[n] - q[n]) divided by its sum, so it "
            "sums to 1.",
        ),
        (
            p[n],
            "After a rejection at n you return the target's p[n]: draw from the "
            "residual max(0, p[n] - q[n]), normalized. Sampling p[n] again would "
            "favour the tokens the draft already proposed (accepted ones took "
            "min(p, q) of the mass).",
        ),
        (
            q[n],
            "After a rejection at n draw from the target's residual, max(0, p[n] - "
            "q[n]) normalized, not from the draft's q[n].",
        ),
        (
            _normalized((p[n + 1] - q[n + 1] if n + 1 < k else p[k]).clamp_min(0)),
            "You take the residual one position late: after a rejection at n use "
            "row n, max(0, p[n] - q[n]).",
        ),
    ]


def _close(actual, expected, atol: float, rtol: float) -> bool:
    """``actual`` is a tensor of ``expected``'s shape and values (NaN never close)."""
    actual = torch.as_tensor(actual)
    return actual.shape == expected.shape and torch.allclose(
        actual.double(), expected.double(), atol=atol, rtol=rtol
    )


def _speculative_case(gen: torch.Generator, vocab: int, plan: list[str]):
    """``p (k+1, V)``, ``q (k, V)``, ``draft_tokens (k,)``, ``u (k,)`` with each
    draft token's fate set by ``plan``: ``"accept-low"`` (p(x) < q(x), u below the
    ratio), ``"accept-high"`` (p(x) >= q(x)), ``"reject"``, ``"zero"`` (the target
    gives the token probability 0), ``"random"`` (x drawn from q, u uniform) and
    ``"same"`` (q = p). Every u is at least 0.01 away from its ratio."""
    k = len(plan)
    p = torch.softmax(1.5 * torch.randn(k + 1, vocab, generator=gen), -1)
    q = torch.softmax(1.5 * torch.randn(k, vocab, generator=gen), -1)
    tokens, u = [], []
    for i, fate in enumerate(plan):
        for _ in range(1000):  # redraw q[i] until a token fits the fate
            ratio = p[i].double() / q[i].double()
            if fate == "same":
                q[i] = p[i]
                ratio = torch.ones(vocab, dtype=torch.float64)
            fits = {
                "accept-low": (ratio >= 0.05) & (ratio <= 0.95),
                "reject": (ratio >= 0.05) & (ratio <= 0.95),
                "accept-high": ratio >= 1.0,
                "zero": q[i] >= 0.05,
            }.get(fate, torch.ones(vocab, dtype=torch.bool))
            if fits.any():
                break
            q[i] = torch.softmax(1.5 * torch.randn(vocab, generator=gen), -1)
        if fate in ("random", "same"):
            x = torch.multinomial(q[i], 1, generator=gen).item()
        else:
            x = _pick(gen, fits.nonzero()[:, 0].tolist())
        if fate == "zero":
            p[i, x] = 0.0
            p[i] /= p[i].sum()
        r = min(1.0, (p[i, x].double() / q[i, x].double()).item())
        if fate == "accept-low":
            v = r * _uniform(gen, 0.2, 0.8)
        elif fate == "reject":
            v = r + (1.0 - r) * _uniform(gen, 0.2, 0.8)
        elif fate == "zero":
            v = _uniform(gen, 0.01, 0.05)
        elif fate == "same":
            v = _uniform(gen, 0.5, 0.99)
        else:
            v = _uniform(gen, 0.01, 0.99)
            while abs(v - r) < 0.01:
                v = _uniform(gen, 0.01, 0.99)
        tokens.append(x)
        u.append(v)
    return p, q, torch.tensor(tokens), torch.tensor(u, dtype=torch.float32)


@register(
    "serving-speculative-accept",
    library=forbid(
        "attnbook.serving.speculative_accept",
        "attnbook.serving.speculative_generate",
        why="The exercise asks you to write speculative sampling's acceptance rule, "
            "which speculative_accept implements.",
    ),
    hint="walk the draft tokens in order: accept token i while u[i] < min(1, p[i, "
    "x_i] / q[i, x_i]) and stop at the first rejection n; return (n, the residual "
    "max(0, p[n] - q[n]) divided by its sum), or (k, p[k]) when all k are accepted.",
)
def _check_speculative_accept(student) -> None:
    """``student(p (k+1, V), q (k, V), draft_tokens (k,), u (k,))`` -> ``(n_accepted,
    next_distribution)``: ``n_accepted`` an int, the number of draft tokens accepted
    before the first rejection (token ``x_i = draft_tokens[i]`` is accepted iff ``u[i]
    < min(1, p[i, x_i] / q[i, x_i])``), and ``next_distribution`` ``(V,)``, the
    normalized residual ``max(0, p[n] - q[n])`` after a rejection at ``n``, or ``p[k]``
    (the bonus token) when all ``k`` are accepted: the rule of
    :func:`attnbook.serving.speculative_accept` with the uniform draws given. ``p``,
    ``q`` and ``u`` are float32, ``draft_tokens`` int64; no ``u`` is within 0.01 of
    its ratio."""
    gen = generator(1002)
    plans = [
        ("all 3 draft tokens accepted", 6, ["accept-high", "accept-low", "accept-low"]),
        ("draft token 0 rejected", 6, ["reject", "accept-high", "accept-low"]),
        (
            "draft token 2 rejected",
            8,
            ["accept-low", "accept-high", "reject", "accept-low"],
        ),
        ("q = p: every draft token accepted", 5, ["same"] * 4),
        (
            "the target gives draft token 1 probability 0",
            6,
            ["accept-low", "zero", "accept-high"],
        ),
        ("k = 1, rejected", 4, ["reject"]),
        ("k = 1, accepted", 4, ["accept-low"]),
    ]
    for _ in range(4):  # cases no answer can know
        k = torch.randint(1, 6, (1,), generator=gen).item()
        vocab = torch.randint(5, 13, (1,), generator=gen).item()
        plans.append(("random", vocab, ["random"] * k))
    cases = []
    for name, vocab, plan in plans:
        p, q, x, u = _speculative_case(gen, vocab, plan)
        what = (
            f"accept(p, q, draft_tokens={x.tolist()}, u={_fmt(u)}) with V={vocab} "
            f"({name}; min(1, p/q) at the draft tokens: {_fmt(_ratios(p, q, x))})"
        )
        cases.append((what, p, q, x, u))

    def call(case):
        what, p, q, x, u = case
        got = call_student(student, what, p.clone(), q.clone(), x.clone(), u.clone())
        assert isinstance(got, (tuple, list)) and len(got) == 2, (
            f"{what}: return the pair (n_accepted, next_distribution), got "
            f"{type(got).__name__} {got!r}."
        )
        assert_int(got[0], f"{what}: n_accepted", "an int (int(n) for a tensor)")
        return got

    for case in cases:
        what, p, q, x, u = case
        vocab = p.shape[-1]
        n_got, dist = call(case)
        n, expected = _accept(p, q, x, u)
        if n_got != n:
            results = []
            for other in cases:
                try:
                    results.append(call(other)[0])
                except AssertionError:
                    results.append(None)
            raise AssertionError(
                f"{what}: n_accepted should be {n}, got {n_got}."
                + _n_slip(results, [c[1:] for c in cases], cases.index(case))
            )
        assert isinstance(dist, torch.Tensor), (
            f"{what}: return next_distribution as a torch.Tensor of shape ({vocab},), "
            f"got {type(dist).__name__}."
        )
        assert dist.shape == expected.shape, (
            f"{what}: next_distribution should have shape ({vocab},), got "
            f"{tuple(dist.shape)}."
        )
        bad = (
            "NaN or inf"
            if not torch.isfinite(dist).all()
            else "negative entries"
            if (dist < -1e-6).any()
            else ""
        )
        if bad:
            raise AssertionError(
                f"{what}: your next_distribution has {bad}."
                + (
                    " After a rejection p[n] - q[n] sums to 0 (both rows sum to 1) and "
                    "has negative entries: clamp it at 0 first, max(0, p[n] - q[n]), "
                    "then divide by the sum."
                    if n < len(x)
                    else ""
                )
            )
        if not _close(dist, expected, 1e-5, 1e-4):
            notes = [
                note
                for wrong, note in _dist_slips(p, q, n)
                if _close(dist, wrong, 1e-5, 1e-4)
                and not _close(wrong, expected, 1e-5, 1e-4)
            ]
            where = (
                f"p[{n}] (all {n} draft tokens accepted: the bonus token)"
                if n == len(x)
                else f"max(0, p[{n}] - q[{n}]) normalized (rejected at {n})"
            )
            raise AssertionError(
                f"{what}: next_distribution should be {where}, {_fmt(expected)}, got "
                f"{_fmt(dist)}." + (" " + notes[0] if notes else "")
            )


# ---------------------------------------------------------------------------------
# serving-quantize-int8
# ---------------------------------------------------------------------------------
_SYMMETRIC = (
    "You quantize symmetrically (a scale from max |x| and no zero point): this "
    "quantizer is asymmetric, s = (max - min) / (2**bits - 1) with max and min over "
    "dim, codes round((x - min) / s), back as codes * s + min."
)
_ZERO_POINT = (
    "You forgot the zero point: subtract min before dividing by s, codes = "
    "round((x - min) / s), and add it back, x_hat = codes * s + min."
)
_LEVELS = (
    "You divide the range into 2**bits steps: the 2**bits codes 0 .. 2**bits - 1 "
    "have 2**bits - 1 steps between them, s = (max - min) / (2**bits - 1), which "
    "brings min and max back exactly."
)


def _quant_slips(x: torch.Tensor, bits: int, dim: int) -> list:
    """Plausible wrong quantize-dequantize round trips of ``x`` (lazily, in float64),
    and notes."""
    x = x.double()
    levels = 2**bits - 1
    half = 2 ** (bits - 1)

    def asym(lo, hi, steps=levels, top=levels, rnd=torch.round, into=True, back=True):
        s = (hi - lo) / steps
        safe = torch.where(s > 0, s, torch.ones_like(s))
        codes = rnd(((x - lo) if into else x) / safe).clamp(0, top)
        return codes * s + (lo if back else 0)

    def sym(scale, lo, hi):
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        return torch.round(x / safe).clamp(lo, hi) * scale

    def over(d):
        return x.amin(d, keepdim=True), x.amax(d, keepdim=True)

    lo, hi = over(dim)
    m = x.abs().amax(dim, keepdim=True)
    slips = [
        (lambda: sym(m / (half - 1), -half, half - 1), _SYMMETRIC),
        (lambda: sym(m / half, -half, half - 1), _SYMMETRIC),
        (lambda: sym(2 * m / levels, -half, half - 1), _SYMMETRIC),
        (
            lambda: asym(lo, hi, rnd=torch.floor),
            "You truncate (floor, or a cast to an integer type): round to the nearest "
            "code, torch.round((x - min) / s), so the error is at most s / 2.",
        ),
        (lambda: asym(lo, hi, steps=levels + 1), _LEVELS),
        (lambda: asym(lo, hi, steps=levels + 1, top=levels + 1), _LEVELS),
        (lambda: asym(lo, hi, back=False), _ZERO_POINT),
        (lambda: asym(lo, hi, into=False, back=False), _ZERO_POINT),
        (lambda: asym(lo, hi, into=False), _ZERO_POINT),
        (
            lambda: torch.round((x - lo) / torch.where(hi > lo, (hi - lo) / levels, 1)),
            "You return the codes: return the dequantized tensor, codes * s + min.",
        ),
    ]
    for other in range(x.dim()):
        if other != dim % x.dim():
            slips.append(
                (
                    lambda other=other: asym(*over(other)),
                    f"Your min and max are over dim {other}: take them over dim="
                    f"{dim} (amin(dim, keepdim=True)), one scale and zero point per "
                    f"slice along dim {dim}.",
                )
            )
    slips.append(
        (
            lambda: asym(x.amin(), x.amax()),
            "You use one min and max for the whole tensor: take them over dim "
            "(amin(dim, keepdim=True)), one scale and zero point per slice.",
        )
    )
    return slips


def _quant_wrong(got, x, bits, dim, expected) -> torch.Tensor:
    """Where ``got`` differs from ``expected`` (bool, ``x``'s shape), allowing one
    step ``s`` of difference where ``(x - min) / s`` is within 0.001 of a tie (the
    float arithmetic of an equally right answer may round it the other way)."""
    x64 = x.double()
    lo = x64.amin(dim, keepdim=True)
    s = (x64.amax(dim, keepdim=True) - lo) / (2**bits - 1)
    t = (x64 - lo) / torch.where(s > 0, s, torch.ones_like(s))
    tie = ((t - t.floor()) - 0.5).abs() < 1e-3
    atol = 2e-5 * max(1.0, x64.abs().max().item())
    diff = (got.double() - expected.double()).abs()
    right = (diff <= atol) | (tie & ((diff - s).abs() <= atol))
    return ~right


def _keepdim_note(err: Exception) -> str:
    if "size of tensor" in str(err):
        return (
            " Keep the reduced dimension, x.amin(dim, keepdim=True): the statistics "
            "then broadcast against x."
        )
    return ""


def _quant_cases(gen: torch.Generator) -> list:
    """``(description, x, bits, dim)``: keys with outlier channels, values, constant
    slices."""
    channels = torch.randperm(8, generator=gen)[:2].sort().values.tolist()
    keys = torch.randn(16, 8, generator=gen)
    keys[:, channels] = 4 * keys[:, channels] + 12  # large in every token
    outlier = torch.randint(6, (1,), generator=gen).item()
    k4 = torch.randn(2, 3, 10, 6, generator=gen)
    k4[..., outlier] = 5 * k4[..., outlier] - 10
    v4 = torch.randn(2, 3, 10, 16, generator=gen)
    rows = torch.randn(6, 5, generator=gen)
    rows[1] = 2 * torch.randn(1, generator=gen)  # a constant row
    rows[4] = 0.0
    columns = torch.randn(7, 4, generator=gen)
    columns[:, 2] = -1.5
    x3 = 3 * torch.randn(3, 9, 5, generator=gen)
    a, b = channels
    return [
        (f"keys (16, 8) with outlier channels {a} and {b}", keys, 8, -2),
        (f"keys (16, 8) with outlier channels {a} and {b}", keys, 8, -1),
        (f"keys (2, 3, 10, 6) with outlier channel {outlier}", k4, 4, -2),
        ("values (2, 3, 10, 16)", v4, 4, -1),
        ("x (6, 5) whose row 1 is constant and row 4 all zeros", rows, 8, -1),
        ("x (7, 4) whose column 2 is constant", columns, 4, -2),
        ("x (3, 9, 5)", x3, 8, 1),
    ]


@register(
    "serving-quantize-int8",
    library=forbid(
        "attnbook.serving.quantize",
        "attnbook.serving.dequantize",
        "attnbook.serving.QuantizedTensor",
        "attnbook.serving.QuantizedKVCache",
        why="The exercise asks you to write asymmetric quantization, which quantize "
            "and dequantize implement.",
    ),
    hint="lo = x.amin(dim, keepdim=True), hi = x.amax(dim, keepdim=True), s = (hi - "
    "lo) / (2**bits - 1); codes = round((x - lo) / s) (divide by 1 where s == 0); "
    "return codes * s + lo.",
)
def _check_quantize(student) -> None:
    """``student(x, bits, dim)`` -> ``x_hat`` of ``x``'s shape: asymmetric
    round-to-nearest quantization with one scale ``s = (max - min) / (2**bits - 1)``
    and zero point ``min`` per slice along ``dim`` (``min`` and ``max`` taken over
    ``dim``: ``x.amin(dim, keepdim=True)``), codes ``round((x - min) / s)``, returned
    dequantized, ``codes * s + min``; a constant slice comes back exactly. Equal to
    ``dequantize(quantize(x, bits, dim=dim))`` of :mod:`attnbook.serving` (up to a
    step where ``(x - min) / s`` is within 0.001 of a tie). ``x`` is float32, ``bits``
    8 or 4."""
    for what, x, bits, dim in _quant_cases(generator(1003)):
        what = f"{what}, bits={bits}, dim={dim}"
        got = call_student(student, what, x.clone(), bits, dim, note=_keepdim_note)
        assert isinstance(got, torch.Tensor), (
            f"{what}: return a torch.Tensor of x's shape {tuple(x.shape)}, got "
            f"{type(got).__name__}."
        )
        assert got.shape == x.shape, (
            f"{what}: return x's shape {tuple(x.shape)}, got {tuple(got.shape)}."
        )
        if not torch.isfinite(got).all():
            constant = (x.amax(dim) == x.amin(dim)).any()
            raise AssertionError(
                f"{what}: your output has NaN or inf."
                + (
                    " A constant slice has max == min, so s = 0 and (x - min) / s is "
                    "0 / 0: divide by 1 where s == 0 (its codes are then 0 and it "
                    "comes back as min, the constant)."
                    if constant
                    else ""
                )
            )
        expected = dequantize(quantize(x, bits, dim=dim))
        wrong = _quant_wrong(got, x, bits, dim, expected)
        if wrong.any():
            at = tuple(wrong.nonzero()[0].tolist())
            levels = 2**bits - 1
            steps = (x.amax(dim) - x.amin(dim)) / levels
            note = ""
            for slip, text in _quant_slips(x, bits, dim):
                value = slip()
                if not _quant_wrong(value, x, bits, dim, expected).any():
                    continue  # the slip changes nothing here
                # float rounding may move a few codes (a floor at an integer)
                close = ~_quant_wrong(got, x, bits, dim, value)
                if close.double().mean() >= 0.9:
                    note = " " + text
                    break
            raise AssertionError(
                f"{what}: {int(wrong.sum())} of {x.numel()} values are off (at index "
                f"{at}: x = {x[at].item():.6g} should come back as "
                f"{expected[at].item():.6g}, got {got[at].item():.6g}; the step s is "
                f"at most {steps.max().item():.3g} here)." + note
            )


# ---------------------------------------------------------------------------------
# serving-sink-positions
# ---------------------------------------------------------------------------------
def _sink_positions(n_seen: int, n_sink: int, window: int) -> list[int]:
    """What :class:`attnbook.serving.SinkKVCache` holds after ``n_seen`` one-token
    updates: its ``positions(layer)``."""
    cache = SinkKVCache(1, 1, 1, 1, n_sink, window)
    one = torch.zeros(1, 1, 1, 1)
    for _ in range(n_seen):
        cache.update(0, one, one)
    return cache.positions(0).tolist()


def _sink_slips(n: int, s: int, w: int) -> list:
    """What plausible wrong answers return for ``(n_seen, n_sink, window)``, with
    notes."""
    sinks = list(range(min(s, n)))
    return [
        (
            list(range(max(0, n - w), n)),
            "You keep only the last window positions: StreamingLLM also keeps the "
            "first n_sink positions (the attention sinks) for ever.",
        ),
        (
            sinks + list(range(max(s, n - max(w - s, 0)), n)),
            "You count the sinks inside the window: the cache holds the n_sink sinks "
            "PLUS the last window positions, n_sink + window in all.",
        ),
        (
            sinks + list(range(max(min(s, n), n - w + 1), n)),
            "Off by one at the window's start: the last window positions are "
            "n_seen - window .. n_seen - 1.",
        ),
        (
            sinks + list(range(max(min(s, n), n - w - 1), n)),
            "Off by one at the window's start: the last window positions are "
            "n_seen - window .. n_seen - 1.",
        ),
        (
            sinks + list(range(max(0, n - w), n)),
            "A position can be both a sink and recent while n_seen < n_sink + window: "
            "list it once (start the window at max(n_sink, n_seen - window)).",
        ),
        (
            sorted(sinks + list(range(max(0, n - w), n))),
            "A position can be both a sink and recent while n_seen < n_sink + window: "
            "list it once (start the window at max(n_sink, n_seen - window)).",
        ),
        (
            list(range(s)) + list(range(max(s, n - w), n)),
            "Before n_sink tokens have been seen only min(n_sink, n_seen) sinks "
            "exist: return positions below n_seen only.",
        ),
        (
            list(range(max(min(s, n), n - w), n)) + sinks,
            "Return the positions in increasing order: the sinks first.",
        ),
        (
            sinks + list(range(min(s, n), min(n, s + w))),
            "You keep the first window positions after the sinks: keep the LAST "
            "window positions, n_seen - window .. n_seen - 1.",
        ),
    ]


def _sink_slip(results, cases) -> str:
    """The note of the first slip that gives ``results`` (None where the answer
    crashed) on every case and changes the answer on one of them, or ''."""
    expected = [_sink_positions(*case) for case in cases]
    slips = [_sink_slips(*case) for case in cases]
    for i, (_, note) in enumerate(slips[0]):
        wrong = [per_case[i][0] for per_case in slips]
        if wrong != expected and all(
            r is None or r == w for r, w in zip(results, wrong)
        ):
            return " " + note
    return ""


@register(
    "serving-sink-positions",
    library=forbid(
        "attnbook.serving.SinkKVCache",
        why="The exercise asks you to work out what a sink cache holds, which "
            "SinkKVCache reports.",
    ),
    hint="the sinks are range(min(n_sink, n_seen)); the recent positions are "
    "range(max(n_sink, n_seen - window), n_seen), which starts after the sinks so no "
    "position comes twice; return the sinks followed by the recent ones.",
)
def _check_sink_positions(student) -> None:
    """``student(n_seen, n_sink, window)`` -> the list of ints (a tuple is fine)
    :class:`attnbook.serving.SinkKVCache` holds after ``n_seen`` one-token updates
    (its ``positions(layer)``, the keys the last of those tokens attended to): the
    first ``min(n_sink, n_seen)`` positions and the last ``window`` positions
    ``max(n_sink, n_seen - window) .. n_seen - 1``, each once, in increasing order;
    ``n_seen >= 1``, ``n_sink >= 0``, ``window >= 1``."""
    gen = generator(1004)
    cases = [
        (2, 4, 8),
        (4, 4, 8),
        (7, 4, 8),
        (12, 4, 8),
        (13, 4, 8),
        (100, 4, 8),
        (10, 0, 3),
        (10, 2, 1),
        (1, 1, 1),
        (3, 1, 1),
    ]
    for _ in range(3):  # cases no answer can know
        n_sink = torch.randint(0, 6, (1,), generator=gen).item()
        window = torch.randint(1, 11, (1,), generator=gen).item()
        n_seen = torch.randint(1, 61, (1,), generator=gen).item()
        cases.append((n_seen, n_sink, window))

    def call(case):
        n, s, w = case
        what = f"sink_positions(n_seen={n}, n_sink={s}, window={w})"
        got = call_student(student, what, n, s, w)
        assert isinstance(got, (list, tuple)), (
            f"{what}: return a list of ints, got {type(got).__name__}"
            + (" (use .tolist())." if isinstance(got, torch.Tensor) else ".")
        )
        for value in got:
            assert_int(value, f"{what}: every position", "an int")
        return what, list(got)

    for case in cases:
        what, got = call(case)
        expected = _sink_positions(*case)
        if got != expected:
            results = []
            for other in cases:
                try:
                    results.append(call(other)[1])
                except AssertionError:
                    results.append(None)
            raise AssertionError(
                f"{what} should be {expected}, got {got}." + _sink_slip(results, cases)
            )
