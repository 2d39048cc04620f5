"""Checks for the exercises of the chapter on the Transformer block."""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

from ...data import ngram_bits_per_char
from ...models import Block, TransformerConfig, induction_scores
from . import register
from .common import call_student, assert_close, assert_int, generator, real_number
from .library import forbid


def _close(actual, expected, atol: float, rtol: float) -> bool:
    """``actual`` is a tensor of ``expected``'s shape and values (NaN never close)."""
    actual = torch.as_tensor(actual)
    return actual.shape == expected.shape and torch.allclose(
        actual.double(), expected.double(), atol=atol, rtol=rtol
    )


def _slip_note(got, expected, slips, atol: float, rtol: float) -> str:
    """The note of the first slip (a function giving a wrong answer, and a note) that
    ``got`` equals where the slip changes the answer at this tolerance, or ''."""
    for wrong, note in slips:
        try:
            value = torch.as_tensor(wrong())
        except Exception:  # the slip cannot happen at these shapes
            continue
        if _close(got, value, atol, rtol) and not _close(value, expected, atol, rtol):
            return " " + note
    return ""


# ---------------------------------------------------------------------------------
# transformer-rmsnorm
# ---------------------------------------------------------------------------------
_LAYER_NORM = (
    "You subtract the mean and divide by the standard deviation: that is LayerNorm. "
    "RMSNorm does not center x: it divides by its root mean square sqrt(mean(x^2) + "
    "eps)."
)
_STD = (
    "You divide by the standard deviation, which subtracts the mean inside (that is "
    "LayerNorm's denominator): RMSNorm divides by the root mean square sqrt(mean(x^2) "
    "+ eps) of x itself."
)


def _rms_slips(x, w, eps) -> list:
    """Plausible wrong RMSNorms of ``x`` (lazily: some need more than one dim)."""
    sq = x.pow(2)
    ms = sq.mean(-1, keepdim=True)
    centred = x - x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    unbiased = x.var(-1, keepdim=True)
    return [
        (lambda: centred / torch.sqrt(var + eps) * w, _LAYER_NORM),
        (lambda: centred / torch.sqrt(unbiased + eps) * w, _LAYER_NORM),
        (lambda: centred / (unbiased.sqrt() + eps) * w, _LAYER_NORM),
        (lambda: x / torch.sqrt(var + eps) * w, _STD),
        (lambda: x / torch.sqrt(unbiased + eps) * w, _STD),
        (lambda: x / (unbiased.sqrt() + eps) * w, _STD),
        (
            lambda: x / torch.sqrt(ms) * w,
            "You left out eps: x / sqrt(mean(x^2) + eps) * weight (eps matters when "
            "mean(x^2) is small, and keeps a row of zeros from 0 / 0).",
        ),
        (
            lambda: x / (torch.sqrt(ms) + eps) * w,
            "You add eps outside the square root: it goes inside, sqrt(mean(x^2) + "
            "eps).",
        ),
        (
            lambda: x / (ms + eps) * w,
            "You divide by the mean square: take its square root, sqrt(mean(x^2) + "
            "eps) (the ROOT mean square).",
        ),
        (
            lambda: x / torch.sqrt(sq.sum(-1, keepdim=True) + eps) * w,
            "You sum the squares: take their mean over the last dimension (divide by "
            "d); sqrt of the sum is the L2 norm, sqrt(d) times the RMS.",
        ),
        (
            lambda: x / (x.norm(dim=-1, keepdim=True) + eps) * w,
            "You divide by the L2 norm: the RMS is sqrt(mean(x^2) + eps), the norm "
            "divided by sqrt(d).",
        ),
        (
            lambda: x / torch.sqrt(sq.mean(0, keepdim=True) + eps) * w,
            "You take the mean over dim 0: RMSNorm normalizes each vector over the "
            "last dimension (mean(dim=-1, keepdim=True)).",
        ),
        (
            lambda: x / torch.sqrt(sq.mean(-1) + eps) * w,
            "The RMS of row i must divide row i: without keepdim=True, mean(dim=-1) "
            "drops the last dimension and the RMS vector broadcasts along the wrong "
            "axis; use mean(dim=-1, keepdim=True).",
        ),
        (
            lambda: x / torch.sqrt(sq.mean() + eps) * w,
            "You take the mean over every entry of x: each vector (over the last "
            "dimension) has its own RMS, mean(dim=-1, keepdim=True).",
        ),
        (
            lambda: x / torch.sqrt(ms + eps),
            "You left out the weight: multiply the normalized x by weight (d,).",
        ),
        (
            lambda: x / torch.sqrt(ms + eps) + w,
            "You add the weight: RMSNorm multiplies the normalized x by weight.",
        ),
        (
            lambda: x * torch.sqrt(ms + eps) * w,
            "You multiply by the RMS: divide x by it.",
        ),
    ]


def _keepdim_note(err: Exception) -> str:
    if "size of tensor" in str(err):
        return (
            " Keep the last dimension of the mean, mean(dim=-1, keepdim=True): the "
            "RMS of shape (..., 1) then broadcasts against x (..., d)."
        )
    return ""


@register(
    "transformer-rmsnorm",
    library=forbid(
        "attnbook.models.RMSNorm",
        why="The exercise asks you to write RMSNorm, which attnbook.models.RMSNorm "
            "implements.",
    ),
    hint="rms = sqrt(mean of x**2 over the last dimension (keepdim=True) + eps), "
    "with eps inside the root; return x / rms * weight. No mean subtraction and no "
    "bias: that is the difference from LayerNorm.",
)
def _check_rmsnorm(student) -> None:
    """``student(x (..., d), weight (d,), eps)`` -> ``x / sqrt(mean(x^2 over the last
    dim) + eps) * weight`` ``(..., d)``, equal to ``torch.nn.functional.rms_norm``; a
    row of zeros gives zeros, float64 stays float64."""
    gen = generator(901)

    def draw(*shape, scale=2.0, dtype=torch.float32):
        x = torch.randn(*shape, generator=gen, dtype=torch.float64) * scale + 1.0
        return x.to(dtype)

    zeros = draw(3, 12)
    zeros[1] = 0.0
    cases = [
        ("x of shape (8,)", draw(8), 1e-6),
        ("x of shape (2, 3, 16)", draw(2, 3, 16), 1e-5),
        ("x of shape (6, 6)", draw(6, 6), 1e-6),
        ("x of shape (4, 10) with a large eps", draw(4, 10, scale=1.0), 1.0),
        ("x of shape (3, 12) whose row 1 is all zeros", zeros, 1e-6),
        (
            "x of shape (2, 5, 7) in float64",
            draw(2, 5, 7, dtype=torch.float64),
            1e-8,
        ),
    ]
    for what, x, eps in cases:
        d = x.shape[-1]
        weight = 1.0 + 0.5 * torch.randn(d, generator=gen, dtype=torch.float64)
        weight = weight.to(x.dtype)
        what = f"{what}, weight ({d},), eps={eps}"
        got = call_student(
            student, what, x.clone(), weight.clone(), eps, note=_keepdim_note
        )
        assert isinstance(got, torch.Tensor), (
            f"{what}: return a torch.Tensor, got {type(got).__name__}."
        )
        expected = F.rms_norm(x, (d,), weight, eps)
        if got.shape == expected.shape and not torch.isfinite(got).all():
            bad = "NaN" if torch.isnan(got).any() else "inf"
            zero_row = bool((x == 0).all(-1).any())
            raise AssertionError(
                f"{what}: your output has {bad}."
                + (
                    " A row of zeros must give zeros: with eps inside the square "
                    "root, 0 / sqrt(0 + eps) = 0, where 0 / sqrt(0) is 0 / 0."
                    if zero_row
                    else ""
                )
            )
        if x.dtype == torch.float64:
            assert got.dtype == torch.float64, (
                f"{what}: return the input's dtype float64, got {got.dtype}: compute "
                "in x's dtype (no .float())."
            )
        atol, rtol = (1e-10, 1e-9) if x.dtype == torch.float64 else (1e-5, 1e-4)
        try:
            assert_close(got, expected, what, atol=atol, rtol=rtol)
        except AssertionError as err:
            x64, w64 = x.double(), weight.double()
            note = _slip_note(
                got, expected, _rms_slips(x64, w64, eps), atol=atol, rtol=rtol
            )
            if (
                not note
                and x.dtype == torch.float64
                and _close(got, expected, 1e-5, 1e-4)
            ):
                note = (
                    " Your values are right to float32 precision only: compute in "
                    "float64, the input's dtype."
                )
            raise AssertionError(f"{err}{note}") from None


# ---------------------------------------------------------------------------------
# transformer-block-parameters
# ---------------------------------------------------------------------------------
def _attention_parameters(d, n_heads, n_kv_heads, kv_full=False, bias=True, out=True):
    """q, k, v, out projections: (in * out) weights plus out biases each."""
    kv = d if kv_full else n_kv_heads * (d // n_heads)
    b = 1 if bias else 0
    return (d * d + b * d) * (2 if out else 1) + 2 * (d * kv + b * kv)


def _mlp_parameters(d, mlp, slip=None):
    """The MLP as :class:`attnbook.models.MLP` builds it, or with one slip."""
    if mlp == "gelu" or slip == "gelu-for-swiglu":
        h = 4 * d
        fc_bias = 0 if slip in ("no-bias", "no-fc-bias") else h
        proj_bias = {"no-bias": 0, "proj-bias-4d": h}.get(slip, d)
        return 2 * d * h + fc_bias + proj_bias
    h = {"hidden-4d": 4 * d, "round": round(8 * d / 3)}.get(slip, 8 * d // 3)
    matrices = 2 if slip == "two-matrices" else 3
    biases = 2 * h + d if slip == "with-biases" else 0
    return matrices * d * h + biases


# each alone or together with the others
_ATTENTION_SLIPS = [
    (
        {"kv_full": True},
        "You count k_proj and v_proj at full width d_model x d_model: with "
        "grouped-query attention they map d_model to n_kv_heads * head_dim = "
        "n_kv_heads * d_model / n_heads (weights and biases).",
    ),
    (
        {"bias": False},
        "You left out the biases of the attention projections: q_proj, k_proj, "
        "v_proj and out_proj each have one, as wide as their output.",
    ),
    (
        {"out": False},
        "You left out out_proj, the d_model x d_model output projection (and its "
        "bias) after the heads are concatenated.",
    ),
]
_NORM_SLIPS = [
    (4, ""),
    (
        0,
        "You left out the two LayerNorms: ln1 (before attention) and ln2 (before the "
        "MLP) each have a weight and a bias of d_model entries.",
    ),
    (
        2,
        "You count 2 d_model for the norms: there are two LayerNorms (ln1 before "
        "attention, ln2 before the MLP), each with a weight AND a bias of d_model "
        "entries, 4 d_model in all.",
    ),
]
_MLP_SLIPS = [
    (None, ""),
    (
        "no-bias",
        "You left out the GELU MLP's biases: fc has 4 d_model, proj d_model.",
    ),
    (
        "no-fc-bias",
        "You left out the bias of fc: one per hidden unit, 4 d_model entries.",
    ),
    (
        "proj-bias-4d",
        "proj's bias has d_model entries (its output width), not 4 d_model.",
    ),
    (
        "two-matrices",
        "SwiGLU has three matrices: fc and gate (d_model -> hidden) and proj (hidden "
        "-> d_model).",
    ),
    (
        "hidden-4d",
        "SwiGLU's hidden width is 8 * d_model // 3, not 4 d_model: its three "
        "matrices then hold about as many weights as GELU's two.",
    ),
    (
        "round",
        "The SwiGLU hidden width is 8 * d_model // 3, rounded down (170 for d_model "
        "= 64), not to the nearest integer.",
    ),
    ("with-biases", "The SwiGLU MLP has no biases: 3 * d_model * hidden weights."),
    (
        "gelu-for-swiglu",
        "For mlp='swiglu' you count the GELU MLP: SwiGLU has three bias-free "
        "matrices of hidden width 8 * d_model // 3.",
    ),
]


def _block_slip(results, cases) -> str:
    """The messages of the fewest slips (one variant of each part: attention, norms,
    MLP) that give the answer's ``results`` (None where it crashed) on every case, or
    ''; where other slips give the same counts, those too."""
    attention = [
        (
            {k: v for flags, _ in chosen for k, v in flags.items()},
            [note for _, note in chosen],
        )
        for n in range(len(_ATTENTION_SLIPS) + 1)
        for chosen in itertools.combinations(_ATTENTION_SLIPS, n)
    ]
    found, right = [], [_block_parameters(*case) for case in cases]
    for (att, att_notes), (norm, norm_note), (mlp, mlp_note) in itertools.product(
        attention, _NORM_SLIPS, _MLP_SLIPS
    ):
        notes = att_notes + [n for n in (norm_note, mlp_note) if n]
        wrong = [
            _attention_parameters(d, h, kv, **att)
            + norm * d
            + _mlp_parameters(d, m, mlp)
            for d, h, kv, m in cases
        ]
        if wrong != right and all(r is None or r == w for r, w in zip(results, wrong)):
            found.append(notes)
    if not found:
        return ""
    fewest = [notes for notes in found if len(notes) == min(map(len, found))][:2]
    common = [note for note in fewest[0] if all(note in f for f in fewest)]
    if len(fewest) == 1:
        return " " + " ".join(common)
    first, second = ([n for n in f if n not in common] for f in fewest)
    return " ".join(["", *common, "Either:", *first, "Or (the same counts):", *second])


def _block_parameters(d, n_heads, n_kv_heads, mlp) -> int:
    """The parameters of :class:`attnbook.models.Block`, counted on the meta device
    (no memory, whatever the size)."""
    config = TransformerConfig(
        d_model=d, n_heads=n_heads, n_kv_heads=n_kv_heads, mlp=mlp
    )
    with torch.device("meta"):
        block = Block(config, is_causal=True)
    return sum(p.numel() for p in block.parameters())


@register(
    "transformer-block-parameters",
    library=forbid(
        "attnbook.transformer.block_parameters",
        "attnbook.transformer.model_parameters",
        "attnbook.models.Block",
        "attnbook.models.TinyGPT",
        "attnbook.models.Attention",
        "attnbook.models.MLP",
        why="The exercise asks you to count a block's parameters from its shapes, "
            "which block_parameters returns and a built Block holds.",
    ),
    hint="each nn.Linear has in * out weights and out biases: q_proj and out_proj "
    "are d x d, k_proj and v_proj d x (n_kv_heads * d // n_heads); two LayerNorms "
    "have a weight and a bias of d each; the GELU MLP is d -> 4d -> d with biases, "
    "SwiGLU three bias-free matrices of hidden width 8 * d // 3.",
)
def _check_block_parameters(student) -> None:
    """``student(d_model, n_heads, n_kv_heads, mlp)`` -> the number of parameters (an
    int) of one pre-norm :class:`attnbook.models.Block` with LayerNorm, ``mlp``
    ``"gelu"`` or ``"swiglu"``."""
    gen = generator(902)
    cases = [
        (64, 4, 4, "gelu"),
        (64, 4, 2, "gelu"),
        (48, 6, 1, "gelu"),
        (64, 8, 2, "swiglu"),
        (96, 4, 4, "swiglu"),
        (128, 8, 1, "swiglu"),
        (768, 12, 12, "gelu"),
        (4096, 32, 8, "swiglu"),
    ]
    for mlp in ("gelu", "swiglu"):  # two configurations no answer can know
        n_heads = (2, 4, 8)[torch.randint(3, (1,), generator=gen).item()]
        head_dim = 2 * torch.randint(2, 17, (1,), generator=gen).item()  # RoPE: even
        kv = [k for k in range(1, n_heads + 1) if n_heads % k == 0]
        n_kv = kv[torch.randint(len(kv), (1,), generator=gen).item()]
        cases.append((n_heads * head_dim, n_heads, n_kv, mlp))

    def call(case):
        d, h, kv, mlp = case
        what = (
            f"block_parameters(d_model={d}, n_heads={h}, n_kv_heads={kv}, mlp={mlp!r})"
        )
        got = call_student(student, what, d, h, kv, mlp)
        assert_int(
            got, what, "an exact int (use // for d_model // n_heads and 8 * d // 3)"
        )
        return what, got

    for case in cases:
        what, got = call(case)
        expected = _block_parameters(*case)
        if got != expected:
            d, h, kv, mlp = case
            parts = (
                f"attention {_attention_parameters(d, h, kv)}, two LayerNorms "
                f"{4 * d}, {mlp} MLP {_mlp_parameters(d, mlp)}"
            )
            results = []
            for other in cases:
                try:
                    results.append(call(other)[1])
                except AssertionError:
                    results.append(None)
            off = f"{abs(got - expected)} too {'many' if got > expected else 'few'}"
            raise AssertionError(
                f"{what} should be {expected} ({parts}), got {got} ({off})."
                + _block_slip(results, cases)
            )


# ---------------------------------------------------------------------------------
# transformer-bigram-bits
# ---------------------------------------------------------------------------------
def _bigram_slips(train, valid, V, alpha) -> list:
    """What plausible wrong answers return for this case (functions of no argument
    giving a float), with notes."""

    def table(ids):
        pairs = torch.bincount(ids[:-1] * V + ids[1:], minlength=V * V)
        return pairs.double().view(V, V)

    C = table(train)
    prev, nxt = valid[:-1], valid[1:]
    rows, cols = C.sum(1), C.sum(0)
    chars = torch.bincount(train, minlength=V).double()
    a = alpha

    def bits(p, log=torch.log2, reduce="mean"):
        nll = -log(p)
        if reduce == "sum":
            return nll.sum().item()
        if reduce == "all":
            return (nll.sum() / len(valid)).item()
        return nll.mean().item()

    def right(C=C, a=a):
        return bits((C[prev, nxt] + a) / (C.sum(1)[prev] + a * V))

    def unigram_after_first():
        counts = torch.bincount(train, minlength=V).double() + a
        return bits((counts / counts.sum())[nxt])

    return [
        (
            lambda: bits((C[prev, nxt] + a) / (rows[prev] + a * V), log=torch.log),
            "You return nats: use log2 (or divide the natural log by ln 2) for bits.",
        ),
        (
            lambda: bits((C[prev, nxt] + a) / (rows[prev] + a * V), log=torch.log10),
            "You use log10: bits are log2.",
        ),
        (
            lambda: bits((C[prev, nxt] + a) / rows[prev]),
            "Your denominator lacks alpha * V: adding alpha to each of the V counts "
            "of a row adds alpha * V to its total, count(prev) + alpha * V, so the "
            "row sums to 1.",
        ),
        (
            lambda: bits((C[prev, nxt] + a) / (rows[prev] + a)),
            "Your denominator adds alpha once: alpha is added to each of the V counts "
            "of the row, so the total is count(prev) + alpha * V.",
        ),
        (
            lambda: right(table(valid)),
            "You counted the pairs on valid: count them on train, score valid.",
        ),
        (
            lambda: bits((C[prev, nxt] + a) / (cols[nxt] + a * V)),
            "You normalized over the previous character, p(prev | next): divide by "
            "count(prev) + alpha * V, the row of the previous character.",
        ),
        (
            lambda: bits((C[nxt, prev] + a) / (rows[nxt] + a * V)),
            "You look the pair up backwards, count(next, prev): the table is indexed "
            "[previous character, next character].",
        ),
        (
            lambda: ngram_bits_per_char(train, valid, 1, V, a),
            "That is the unigram, p(c) from how often c occurs: the bigram conditions "
            "on the previous character, p(c | prev).",
        ),
        (
            unigram_after_first,
            "That is the unigram, p(c) from how often c occurs: the bigram conditions "
            "on the previous character, p(c | prev).",
        ),
        (
            lambda: bits((C[prev, nxt] + a) / (chars[prev] + a * V)),
            "count(prev) counts the pairs that start with prev, train[:-1]: the last "
            "character of train starts no pair (each row of p must sum to 1).",
        ),
        (
            lambda: bits((C[prev, nxt] + a) / (rows[prev] + a * V), reduce="all"),
            "You divide by len(valid): there are len(valid) - 1 pairs (t = 1 .. "
            "len(valid) - 1).",
        ),
        (
            lambda: bits((C[prev, nxt] + a) / (rows[prev] + a * V), reduce="sum"),
            "You return the total: average over the pairs.",
        ),
        (lambda: right(a=1.0), "You ignore alpha: use the alpha you are given."),
        (
            lambda: ngram_bits_per_char(valid, train, 2, V, a),
            "You swapped train and valid: count on train, score valid.",
        ),
    ]


def _same(a: float | None, b: float) -> bool:
    if a is None:
        return True
    if math.isinf(b) or math.isnan(b):
        return a == b or (math.isnan(a) and math.isnan(b))
    return math.isfinite(a) and abs(a - b) <= 1e-6 * max(1.0, abs(b))


def _bigram_slip(results, slips_per_case, expected) -> str:
    """The note of the first slip that gives ``results`` (None where the answer
    crashed) on every case and changes the answer on one of them, or ''."""
    for i, (_, note) in enumerate(slips_per_case[0]):
        try:
            wrong = [slips[i][0]() for slips in slips_per_case]
        except Exception:
            continue
        if all(_same(r, w) for r, w in zip(results, wrong)) and not all(
            _same(w, e) for w, e in zip(wrong, expected)
        ):
            return " " + note
    return ""


@register(
    "transformer-bigram-bits",
    library=forbid(
        "attnbook.data.ngram_bits_per_char",
        why="The exercise asks you to count the bigram and score it, which "
            "ngram_bits_per_char, the check's reference, does.",
    ),
    hint="count the pairs (train[t-1], train[t]) in a V x V table (rows: previous "
    "character), add alpha to every entry and divide each row by its sum, count(prev) "
    "+ alpha V; then average -log2 p(valid[t] | valid[t-1]) over t = 1 .. "
    "len(valid) - 1.",
)
def _check_bigram_bits(student) -> None:
    """``student(train, valid, vocab_size, alpha=1.0)`` -> bits per character (a
    float) on ``valid`` of the add-``alpha`` bigram counted on ``train`` (1-D id
    tensors), equal to :func:`attnbook.data.ngram_bits_per_char` with ``n=2``."""
    gen = generator(903)
    cases = [(torch.tensor([0, 1, 0, 1, 2, 0]), torch.tensor([0, 1, 2, 2, 0]), 3, 1.0)]
    for V, n_train, n_valid, alpha in [
        (8, 30, 15, 1.0),
        (6, 30, 20, 0.5),
        (4, 12, 10, 2.0),
        (10, 80, 40, 0.1),
    ]:
        train = torch.randint(V, (n_train,), generator=gen)
        valid = torch.randint(V, (n_valid,), generator=gen)
        seen = torch.zeros(V, V, dtype=torch.bool)
        seen[train[:-1], train[1:]] = True
        unseen = (~seen).nonzero()  # not empty: fewer pairs than V * V
        pick = torch.randint(len(unseen), (1,), generator=gen).item()
        valid[:2] = unseen[pick]  # valid starts with a pair train never shows
        cases.append((train, valid, V, alpha))

    def describe(train, valid, V, alpha):
        ids = (
            f"train={train.tolist()}, valid={valid.tolist()}"
            if len(train) <= 12
            else f"train of {len(train)} ids, valid of {len(valid)} ids"
        )
        return f"bigram_bits_per_char({ids}, vocab_size={V}, alpha={alpha})"

    def call(case):
        train, valid, V, alpha = case
        what = describe(*case)
        got = call_student(student, what, train.clone(), valid.clone(), V, alpha=alpha)
        return what, real_number(got, what)

    expected = [ngram_bits_per_char(t, v, 2, V, a) for t, v, V, a in cases]
    for case, right in zip(cases, expected):
        what, got = call(case)
        if abs(got - right) <= 1e-6 * max(1.0, abs(right)):
            continue
        train, valid, V, alpha = case
        note = ""
        if not math.isfinite(got):
            seen = torch.zeros(V, V, dtype=torch.bool)
            seen[train[:-1], train[1:]] = True
            pairs = zip(valid[:-1].tolist(), valid[1:].tolist())
            never = next((pair for pair in pairs if not seen[pair]), None)
            if never is not None:
                note = (
                    f" The pair {never} of valid never occurs in train: without "
                    "add-alpha smoothing it has probability 0 and -log2 0 = inf; "
                    "add alpha to every count, (count(prev, c) + alpha) / (count(prev) "
                    "+ alpha V)."
                )
        if not note:
            results = []
            for other in cases:
                try:
                    results.append(call(other)[1])
                except AssertionError:
                    results.append(None)
            slips = [_bigram_slips(*c) for c in cases]
            note = _bigram_slip(results, slips, expected)
        raise AssertionError(
            f"{what} should be {right:.6g} bits per character, got {got!r}.{note}"
        )


# ---------------------------------------------------------------------------------
# transformer-prefix-matching
# ---------------------------------------------------------------------------------
def _prefix_slips(w, period) -> list:
    T = w.shape[-1]
    t = torch.arange(period, T)

    def mean_at(queries, keys):  # negative keys wrap around, as indexing does
        return w[:, :, queries, keys].mean((0, 2))

    every, later = torch.arange(T), torch.arange(1, T)
    diagonal = torch.arange(period - 1, T)  # torch.diagonal(offset=1 - period)
    return [
        (
            lambda: mean_at(t, t - period),
            "You read key t - period, the earlier occurrence of token t itself: an "
            "induction head attends to the token AFTER it, key t - period + 1, the "
            "one it copies.",
        ),
        (
            lambda: mean_at(every, every - period + 1),
            "Your queries start at 0: only t = period .. T - 1 have an earlier "
            "occurrence; key t - period + 1 is negative (wraps around) before that.",
        ),
        (
            lambda: mean_at(later, later - period + 1),
            "Your queries start at 1: only t = period .. T - 1 have an earlier "
            "occurrence; key t - period + 1 is negative (wraps around) before that.",
        ),
        (
            lambda: mean_at(diagonal, diagonal - period + 1),
            "Your queries start at period - 1 (a diagonal with offset -(period - 1) "
            "starts there): start at t = period, the first token of the repeat.",
        ),
        (
            lambda: mean_at(later, later - 1),
            "That is the previous-token score (key t - 1): the prefix-matching score "
            "reads key t - period + 1.",
        ),
        (
            lambda: mean_at(t, t - 1),
            "You read key t - 1, the previous token: the prefix-matching score reads "
            "key t - period + 1.",
        ),
        (
            lambda: w[:, :, t, t - period + 1].sum(2).mean(0),
            "You sum over the queries: average over them.",
        ),
        (
            lambda: w[:, :, t, t - period + 1].sum(0).mean(1),
            "You sum over the batch: average over it.",
        ),
        (
            lambda: w[:, :, t, t - period + 1].sum(2).mean(0) / T,
            "You divide by T: average over the T - period queries t = period .. T - 1.",
        ),
        (
            lambda: w[:, :, t - period + 1, t].mean((0, 2)),
            "You read weights[..., t - period + 1, t]: the rows (dim -2) are the "
            "queries and the columns the keys, weights[b, h, t, t - period + 1].",
        ),
    ]


@register(
    "transformer-prefix-matching",
    library=forbid(
        "attnbook.models.induction_scores",
        "attnbook.transformer.pattern_scores",
        why="The exercise asks you to compute the prefix-matching score, which "
            "induction_scores, the check's reference, returns.",
    ),
    hint="with t = torch.arange(period, T), weights[:, :, t, t - period + 1] is the "
    "weight each query puts on the token after its previous occurrence; average it "
    "over the batch (dim 0) and the queries: one score per head.",
)
def _check_prefix_matching(student) -> None:
    """``student(weights (B, n_heads, T, T), period)`` -> ``(n_heads,)``: the mean over
    the batch and the queries ``t = period .. T - 1`` of ``weights[b, h, t, t - period
    + 1]``, equal to :func:`attnbook.models.induction_scores`' ``prefix_matching``."""
    gen = generator(904)
    # B, n_heads and T - period differ within a case, so a shape names its mistake
    for B, H, period, T in [
        (2, 3, 4, 8),
        (3, 2, 5, 10),
        (1, 4, 3, 5),
        (2, 1, 6, 7),
        (4, 2, 2, 3),
        (2, 5, 1, 2),
    ]:
        scores = 2 * torch.randn(B, H, T, T, generator=gen)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        w = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
        what = f"weights of shape {(B, H, T, T)}, period={period}"
        got = call_student(student, what, w.clone(), period)
        assert isinstance(got, torch.Tensor), (
            f"{what}: return a torch.Tensor of shape (n_heads,) = ({H},), got "
            f"{type(got).__name__}."
        )
        expected = induction_scores(w[None], period)["prefix_matching"][0]
        shapes = {
            (): "You averaged over the heads too: return one score per head, "
            "(n_heads,).",
            (B, H): "You did not average over the batch: mean over dim 0 (the "
            "batch) and over the queries.",
            (B,): "You averaged over the heads instead of the batch: return one score "
            "per head, the mean over dim 0 (the batch) and the queries.",
            (H, T - period): "You did not average over the queries t = period .. "
            "T - 1.",
            (B, H, T - period): "Average over the batch (dim 0) and the queries: one "
            "score per head.",
        }
        try:
            assert_close(got, expected, what)
        except AssertionError as err:
            if got.shape != expected.shape:
                note = shapes.get(tuple(got.shape), "")
                note = " " + note if note else ""
            else:
                note = _slip_note(
                    got, expected, _prefix_slips(w.double(), period), 1e-5, 1e-4
                )
            raise AssertionError(f"{err}{note}") from None
