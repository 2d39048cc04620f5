"""The checks of the projects "A FlashAttention variant of your choice"
(``book/projects/flash_variant.ipynb``) and "Long-context positional methods compared on a
retrieval task" (``book/projects/long_context.ipynb``): the model solution of each milestone
passes its public check and its hidden tests, and plausible wrong answers fail with a message
that points at the mistake; some of them pass the public check and fail only the hidden tests,
which is what the hidden tests are for."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from wrong_answers import Mistake, mistake_test, verdict


PROJECTS = Path(__file__).resolve().parents[2] / "book" / "projects"


def _solutions(name: str) -> dict:
    """The names the notebook's answer cells define, with the model solutions in."""
    nb = json.loads((PROJECTS / f"{name}.ipynb").read_text())
    namespace = {"torch": torch, "math": math, "F": F}
    for cell in nb["cells"]:
        if "solution" in cell["metadata"].get("tags", []):
            exec("".join(cell["source"]), namespace)
    return namespace


FLASH = _solutions("flash_variant")
CONTEXT = _solutions("long_context")
tiled_attention = FLASH["tiled_attention"]
visited_tiles = FLASH["visited_tiles"]
scaled_rope_inv_freq = CONTEXT["scaled_rope_inv_freq"]
passkey_batch = CONTEXT["passkey_batch"]

MODEL = [
    ("project-flash-tiled", tiled_attention),
    ("project-flash-plan", visited_tiles),
    ("project-context-inv-freq", scaled_rope_inv_freq),
    ("project-context-passkey", passkey_batch),
]


@pytest.mark.parametrize("label, answer", MODEL, ids=[label for label, _ in MODEL])
def test_the_model_solution_passes_the_public_and_the_hidden_check(label, answer):
    for which in (label, f"{label}-hidden"):
        result = verdict(which, answer)
        assert result.passed, f"{which}: {result.message}"


# ---- milestone 1 of the flash project: the model answer with one thing changed ----------
def _tiled(q, k, v, mask_mod, block_n, *, rescale=True, scale=True, lse_m=True,
           guard=True, ragged=True, dense=False, out_dtype=True, per_head=True):
    B, H, L, E = q.shape
    S = k.shape[2]
    b = torch.arange(B).view(B, 1, 1, 1) if per_head else torch.zeros(1, 1, 1, 1).long()
    h = torch.arange(H).view(1, H, 1, 1) if per_head else torch.zeros(1, 1, 1, 1).long()
    rows = torch.arange(L).view(1, 1, L, 1)
    qs = q.float() / (math.sqrt(E) if scale else 1.0)
    if dense:  # the whole L x S matrix at once
        s = qs @ k.float().transpose(-1, -2)
        s = s.masked_fill(~mask_mod(b, h, rows, torch.arange(S).view(1, 1, 1, S)),
                          -math.inf)  # fmt: skip
        lse = torch.logsumexp(s, -1)
        w = torch.softmax(s, -1).nan_to_num(0.0)
        return (w @ v.float()).to(q.dtype), lse
    m = torch.full((B, H, L), -math.inf)
    l, acc = torch.zeros(B, H, L), torch.zeros(B, H, L, v.shape[-1])
    stop = S if ragged else S - block_n + 1
    for j0 in range(0, stop, block_n):
        j1 = min(j0 + block_n, S)
        cols = torch.arange(j0, j1).view(1, 1, 1, j1 - j0)
        s = qs @ k[:, :, j0:j1].float().transpose(-1, -2)
        s = s.masked_fill(~mask_mod(b, h, rows, cols), -math.inf)
        m_new = torch.maximum(m, s.amax(-1))
        safe = torch.where(torch.isinf(m_new), 0.0, m_new) if guard else m_new
        p = torch.exp(s - safe[..., None])
        alpha = torch.exp(m - safe) if rescale else torch.ones_like(m)
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + p @ v[:, :, j0:j1].float()
        m = m_new
    if guard:
        out = acc / torch.where(l > 0, l, 1.0)[..., None]
        lse = torch.where(l > 0, (m if lse_m else 0) + torch.log(l), -math.inf)
    else:
        out, lse = acc / l[..., None], (m if lse_m else 0) + torch.log(l)
    return (out.to(q.dtype) if out_dtype else out), lse


def _wrong_tiled(**slip):
    return lambda q, k, v, mask_mod, block_n: _tiled(q, k, v, mask_mod, block_n, **slip)


# ---- milestone 2 of the flash project --------------------------------------------------------
def _plan(L, S, block_m, block_n, mask_mod, *, full=True, ragged=True, pad_masked=False,
          visit_all=False):
    zero = torch.zeros((), dtype=torch.int32)
    n_m = -(-L // block_m) if ragged else L // block_m
    n_n = -(-S // block_n) if ragged else S // block_n
    plan = torch.zeros(n_m, n_n, dtype=torch.long)
    for i in range(n_m):
        for j in range(n_n):
            if visit_all:
                plan[i, j] = 1
                continue
            rows = torch.arange(i * block_m, min((i + 1) * block_m, L)).view(-1, 1)
            cols = torch.arange(j * block_n, min((j + 1) * block_n, S)).view(1, -1)
            allowed = mask_mod(zero, zero, rows, cols).expand(len(rows), cols.shape[1])
            ragged_tile = len(rows) < block_m or cols.shape[1] < block_n
            if allowed.all() and full and not (pad_masked and ragged_tile):
                plan[i, j] = 2
            elif allowed.any():
                plan[i, j] = 1
    return plan


def _wrong_plan(**slip):
    return lambda L, S, bm, bn, mask_mod: _plan(L, S, bm, bn, mask_mod, **slip)


# ---- milestone 1 of the long-context project --------------------------------------------
def _freq(dim, base, scaling=None, *, slip=None, validate=True, dtype=torch.float64):
    if validate and (dim <= 0 or dim % 2):
        raise ValueError("odd dim")
    exponent = torch.arange(0, dim, 2, dtype=dtype) / dim
    if slip == "half exponent":
        exponent = torch.arange(dim // 2, dtype=dtype) / dim
    if scaling is None:
        return base**-exponent
    kind, s = scaling["type"], float(scaling["factor"])
    if validate and (kind not in ("linear", "ntk") or s < 1):
        raise ValueError("bad scaling")
    if kind == "linear":
        return (base * s) ** -exponent if slip == "linear on base" else base**-exponent / s
    if slip == "ntk on base":
        return (base * s) ** -exponent
    if slip == "ntk is linear":
        return base**-exponent / s
    if slip == "no dim 2":
        return (base * s ** (dim / (dim - 2))) ** -exponent
    if dim == 2:
        return base**-exponent / s
    return (base * s ** (dim / (dim - 2))) ** -exponent


def _wrong_freq(**slip):
    return lambda dim, base, scaling=None: _freq(dim, base, scaling, **slip)


# ---- milestone 2 of the long-context project --------------------------------------------
def _passkey(batch, length, vocab_size, generator, *, filler_low=2, global_rng=False,
             last_pos=True, validate=True, query=True, value_high=True):
    if validate and (length < 3 or vocab_size < 3):
        raise ValueError("too short")
    gen = None if global_rng else generator
    tokens = torch.randint(filler_low, vocab_size, (batch, length), generator=gen)
    high = length - 2 if last_pos else length - 3
    key_pos = torch.randint(0, high, (batch,), generator=gen)
    high = vocab_size if value_high else vocab_size - 1
    targets = torch.randint(2, high, (batch,), generator=gen)
    rows = torch.arange(batch)
    tokens[rows, key_pos] = 0
    tokens[rows, key_pos + 1] = targets
    if query:
        tokens[:, -1] = 1
    return tokens, targets, key_pos


def _wrong_passkey(**slip):
    return lambda batch, length, vocab, gen: _passkey(batch, length, vocab, gen, **slip)


TILED, TILED_HIDDEN = "project-flash-tiled", "project-flash-tiled-hidden"
PLAN, PLAN_HIDDEN = "project-flash-plan", "project-flash-plan-hidden"
FREQ, FREQ_HIDDEN = "project-context-inv-freq", "project-context-inv-freq-hidden"
PASSKEY, PASSKEY_HIDDEN = "project-context-passkey", "project-context-passkey-hidden"
MISTAKES = [
    Mistake(TILED, "the running sum and output not rescaled", _wrong_tiled(rescale=False),
            ("values differ", "You did not rescale")),
    Mistake(TILED, "no 1/sqrt(d_k)", _wrong_tiled(scale=False), ("1/sqrt(d_k)",)),
    Mistake(TILED, "lse is log(l)", _wrong_tiled(lse_m=False), ("lse is log(l) alone",)),
    Mistake(TILED_HIDDEN, "NaN for a row with no key (passes the public check)",
            _wrong_tiled(guard=False), ("rows that see no key",)),
    Mistake(TILED_HIDDEN, "the ragged last tile dropped (passes the public check)",
            _wrong_tiled(ragged=False), ("values differ", "left out the last key tile")),
    Mistake(TILED_HIDDEN, "the whole L x S matrix at once (passes the public check)",
            _wrong_tiled(dense=True), ("one key tile", "never for all S keys")),
    Mistake(TILED_HIDDEN, "float32 out for float16 inputs (passes the public check)",
            _wrong_tiled(out_dtype=False), ("q's dtype",)),
    Mistake(TILED_HIDDEN, "the rule called for head 0 and batch entry 0 only "
            "(passes the public check)", _wrong_tiled(per_head=False),
            ("for batch entry 0 and head 0",)),
    Mistake(PLAN, "no full tiles", _wrong_plan(full=False), ("are full",)),
    Mistake(PLAN, "every tile visited", _wrong_plan(visit_all=True), ("not tight",)),
    Mistake(PLAN_HIDDEN, "the ragged tiles left out (passes the public check)",
            _wrong_plan(ragged=False), ("ragged tile",)),
    Mistake(PLAN_HIDDEN, "a ragged tile's missing entries counted as masked "
            "(passes the public check)", _wrong_plan(pad_masked=True),
            ("positions past L or S",)),
    Mistake(FREQ, "linear scaling applied to the base", _wrong_freq(slip="linear on base"),
            ("multiplied the base",)),
    Mistake(FREQ, "NTK-aware scaling as base * s", _wrong_freq(slip="ntk on base"),
            ("multiplied the base", "s^(dim/(dim-2))")),
    Mistake(FREQ, "NTK-aware scaling as linear", _wrong_freq(slip="ntk is linear"),
            ("that is linear interpolation",)),
    Mistake(FREQ, "exponents f / dim", _wrong_freq(slip="half exponent"), ("2f / dim",)),
    Mistake(FREQ, "float32 frequencies", _wrong_freq(dtype=torch.float32), ("float64",)),
    Mistake(FREQ_HIDDEN, "no ValueError for bad settings (passes the public check)",
            _wrong_freq(validate=False), ("raise ValueError",)),
    Mistake(FREQ_HIDDEN, "dim 2 divides by zero (passes the public check)",
            _wrong_freq(slip="no dim 2"), ("ZeroDivisionError", "dim = 2")),
    Mistake(PASSKEY, "filler drawn from the whole vocabulary", _wrong_passkey(filler_low=0),
            ("exactly once",)),
    Mistake(PASSKEY, "PyTorch's global generator", _wrong_passkey(global_rng=True),
            ("never from PyTorch's global generator",)),
    Mistake(PASSKEY, "no query marker", _wrong_passkey(query=False), ("query marker",)),
    Mistake(PASSKEY_HIDDEN, "the last key position never drawn (passes the public check)",
            _wrong_passkey(last_pos=False), ("passkey_batch(",)),
    Mistake(PASSKEY_HIDDEN, "the last passkey value never drawn (passes the public check)",
            _wrong_passkey(value_high=False), ("passkey_batch(",)),
    Mistake(PASSKEY_HIDDEN, "no ValueError for a length of 2 (passes the public check)",
            _wrong_passkey(validate=False), ("raise ValueError",)),
]

test_mistake = mistake_test(MISTAKES)


def test_the_hidden_mistakes_pass_the_public_checks():
    """The point of the hidden tests: each mistake that only they catch passes its public
    check."""
    for mistake in MISTAKES:
        if mistake.label.endswith("-hidden"):
            public = mistake.label.removesuffix("-hidden")
            result = verdict(public, mistake.answer)
            assert result.passed, f"{mistake.what}: {result.message}"


def test_a_stub_is_not_attempted_and_the_stubs_fail_every_check():
    def stub(*args):
        raise NotImplementedError

    for label, _ in MODEL:
        for which in (label, f"{label}-hidden"):
            result = verdict(which, stub)
            assert not result.passed and "not attempted" in result.message, which


def test_the_project_notebooks_name_their_labels_and_points():
    for name, prefix in (("flash_variant", "project-flash"), ("long_context", "project-context")):
        nb = json.loads((PROJECTS / f"{name}.ipynb").read_text())
        text = "".join("".join(c["source"]) for c in nb["cells"])
        points = nb["metadata"]["attnbook"]["points"]
        assert all(label.startswith(prefix) for label in points), name
        for label in points:
            if not label.endswith("-report"):
                assert f'check("{label}",' in text, label
            else:
                assert f":label: {label}" in text and "**Rubric**" in text, label
