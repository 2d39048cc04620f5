"""Checks for the project "Long-context positional methods compared on a retrieval
task" (``book/projects/long_context.ipynb``).

Each milestone has a public check, which the student runs in the notebook on a few
small cases it names, and a hidden one (label ``...-hidden``), which only the graders
run: many cases drawn from the grader's secret seed, with the edge cases the public
check leaves out (other bases, fractional and large factors, a head of one rotated
pair, settings that must be refused; the shortest sequence, the smallest vocabulary,
and the distribution of the passkey's position over many draws).
"""

from __future__ import annotations

import torch

from ...positional import RotaryEmbedding
from . import register
from .common import assert_close, call_student, generator
from .library import forbid

__all__ = ["reference_inv_freq", "KEY", "QUERY"]

#: The passkey task's two marker tokens.
KEY, QUERY = 0, 1


# --------------------------------------------------------------------------------------
# Milestone 1: the rotary frequencies of a stretched context
# --------------------------------------------------------------------------------------
def reference_inv_freq(dim, base, scaling) -> torch.Tensor:
    """The frequencies of :class:`attnbook.positional.RotaryEmbedding` with ``scaling``
    (float64, ``(dim / 2,)``)."""
    return RotaryEmbedding(dim, base, scaling=scaling)._inv_freq64


def _freq_slip(got, dim, base, scaling) -> str:
    """What a wrong set of frequencies did, where it tells, or ''."""
    if got.shape != (dim // 2,):
        return ""
    s = 1.0 if scaling is None else float(scaling["factor"])
    exponent = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    plain = base**-exponent
    slips = [
        ((base * s) ** -exponent,
         "You multiplied the base by the factor: linear interpolation divides every "
         "frequency by s, and NTK-aware scaling raises the base by s^(dim/(dim-2))."),
        (plain * s, "You multiplied the frequencies by s: divide them, positions are "
         "squeezed into the trained range."),
        (plain / s, "You divided every frequency by s: that is linear interpolation; "
         "NTK-aware scaling changes the base, base * s^(dim/(dim-2))."),
        (base ** -(torch.arange(dim // 2, dtype=torch.float64) / dim) / s,
         "Your exponents are f / dim: they are 2f / dim, f = 0 .. dim/2 - 1."),
        (plain, "You returned the unscaled frequencies."),
    ]  # fmt: skip
    for wrong, note in slips:
        if torch.allclose(got.double(), wrong, rtol=1e-6, atol=0):
            return " " + note
    return ""


def _run_freq_case(student, dim, base, scaling) -> None:
    what = f"scaled_rope_inv_freq(dim={dim}, base={base}, scaling={scaling})"
    got = call_student(student, what, dim, base, scaling)
    want = reference_inv_freq(dim, base, scaling)
    assert isinstance(got, torch.Tensor), (
        f"{what}: return a tensor, got {type(got).__name__}."
    )
    assert got.dtype == torch.float64, (
        f"{what}: return float64 frequencies (float32 loses the slow ones' digits), "
        f"got {got.dtype}."
    )
    try:
        assert_close(got, want, what, atol=0.0, rtol=1e-9)
    except AssertionError as err:
        note = _freq_slip(got, dim, base, scaling)
        raise AssertionError(f"{err}{note}") from None


def _refused(student, dim, base, scaling, why) -> None:
    what = f"scaled_rope_inv_freq(dim={dim}, base={base}, scaling={scaling})"
    try:
        got = student(dim, base, scaling)
    except NotImplementedError:
        raise
    except Exception as err:  # by name: the grader rebuilds the kernel's exception
        if type(err).__name__ == "ValueError":
            return
        raise AssertionError(
            f"{what}: raise ValueError ({why}), got {type(err).__name__}: {err}."
        ) from None
    raise AssertionError(f"{what}: raise ValueError ({why}), got {got!r:.80}.")


_FREQ_POLICY = forbid(
    "attnbook.positional.RotaryEmbedding",
    "attnbook.positional.yarn_inv_freq",
    "attnbook.positional.rope_complex",
    why="The milestone asks you to compute RoPE's scaled frequencies, which "
    "RotaryEmbedding's scaling option computes.",
)
_FREQ_HINT = (
    "theta_f = base^(-2f/dim) for f = 0 .. dim/2 - 1 in float64; linear: theta_f / s; "
    "NTK-aware: the same formula with the base base * s^(dim/(dim-2)) (dim = 2: "
    "theta_0 / s); ValueError for an odd dim, a factor below 1 or an unknown type."
)


@register("project-context-inv-freq", library=_FREQ_POLICY, hint=_FREQ_HINT)
def _check_inv_freq(student) -> None:
    """Public: no scaling, linear and NTK-aware at dim 8 and base 10000."""
    for scaling in (None, {"type": "linear", "factor": 4.0},
                    {"type": "ntk", "factor": 4.0}):  # fmt: skip
        _run_freq_case(student, 8, 10000.0, scaling)
    _run_freq_case(student, 16, 10000.0, {"type": "ntk", "factor": 2.0})


@register("project-context-inv-freq-hidden", library=_FREQ_POLICY, hint=_FREQ_HINT)
def _check_inv_freq_hidden(student) -> None:
    """Hidden: other bases and widths, fractional, unit and large factors, one rotated
    pair (NTK-aware falls back to interpolation), and settings to refuse."""
    gen = generator(81)
    for dim, base, scaling in [
        (2, 10000.0, {"type": "ntk", "factor": 4.0}),
        (2, 10000.0, {"type": "linear", "factor": 3.0}),
        (64, 500000.0, {"type": "ntk", "factor": 1.0}),
        (128, 10000.0, {"type": "ntk", "factor": 64.0}),
        (4, 100.0, {"type": "linear", "factor": 2.5}),
    ]:
        _run_freq_case(student, dim, base, scaling)
    for _ in range(10):
        dim = 2 * int(torch.randint(1, 129, (), generator=gen))
        base = [100.0, 10000.0, 1e6][int(torch.randint(0, 3, (), generator=gen))]
        factor = round(1 + 31 * float(torch.rand((), generator=gen)), 3)
        kind = ["linear", "ntk"][int(torch.randint(0, 2, (), generator=gen))]
        _run_freq_case(student, dim, base, {"type": kind, "factor": factor})
    _refused(student, 8, 10000.0, {"type": "linear", "factor": 0.5},
             "a factor below 1 would shrink the context")  # fmt: skip
    _refused(student, 8, 10000.0, {"type": "dynamic", "factor": 2.0},
             "an unknown type")  # fmt: skip
    _refused(student, 7, 10000.0, None, "RoPE rotates pairs: dim must be even")


# --------------------------------------------------------------------------------------
# Milestone 2: the passkey task
# --------------------------------------------------------------------------------------
def _call_passkey(student, batch, length, vocab, seed):
    what = (
        f"passkey_batch(batch={batch}, length={length}, vocab_size={vocab}, "
        f"generator=torch.Generator().manual_seed({seed}))"
    )
    got = call_student(
        student, what, batch, length, vocab, torch.Generator().manual_seed(seed)
    )
    assert isinstance(got, (tuple, list)) and len(got) == 3, (
        f"{what}: return (tokens, targets, key_pos), got {type(got).__name__}."
    )
    tokens, targets, key_pos = got
    for name, t, shape in (("tokens", tokens, (batch, length)),
                           ("targets", targets, (batch,)),
                           ("key_pos", key_pos, (batch,))):  # fmt: skip
        assert isinstance(t, torch.Tensor) and t.dtype == torch.int64, (
            f"{what}: {name} must be an int64 tensor, got "
            f"{getattr(t, 'dtype', type(t).__name__)}."
        )
        assert tuple(t.shape) == shape, (
            f"{what}: {name} must have shape {shape}, got {tuple(t.shape)}."
        )
    return what, tokens, targets, key_pos


def _check_layout(what, tokens, targets, key_pos, length, vocab) -> None:
    """The properties every batch must have."""
    batch = tokens.shape[0]
    bad = ((key_pos < 0) | (key_pos > length - 3)).nonzero().flatten().tolist()
    assert not bad, (
        f"{what}: key_pos[{bad[0]}] = {int(key_pos[bad[0]])} is outside 0 .. length - "
        f"3 = {length - 3} (the key and its value come before the query at the end)."
    )
    rows = torch.arange(batch)
    assert (tokens[:, -1] == QUERY).all(), (
        f"{what}: the last token of every row must be the query marker {QUERY}."
    )
    assert (tokens[rows, key_pos] == KEY).all(), (
        f"{what}: tokens[b, key_pos[b]] must be the key marker {KEY}."
    )
    assert torch.equal(tokens[rows, key_pos + 1], targets), (
        f"{what}: the token after the key marker must be the passkey, targets[b]."
    )
    assert ((targets >= 2) & (targets < vocab)).all(), (
        f"{what}: the passkey must be an ordinary token, 2 .. vocab_size - 1, got "
        f"{targets.tolist()[:8]}."
    )
    keys = (tokens == KEY).sum(1)
    queries = (tokens == QUERY).sum(1)
    assert (keys == 1).all() and (queries == 1).all(), (
        f"{what}: each row must hold the key marker exactly once and the query marker "
        f"exactly once, got key counts {keys.tolist()[:8]} and query counts "
        f"{queries.tolist()[:8]}: draw the filler from 2 .. vocab_size - 1."
    )
    assert ((tokens >= 0) & (tokens < vocab)).all(), (
        f"{what}: every token must be in 0 .. vocab_size - 1."
    )


def _check_determinism(student, batch, length, vocab, seed) -> None:
    what, *first = _call_passkey(student, batch, length, vocab, seed)
    _, *again = _call_passkey(student, batch, length, vocab, seed)
    assert all(torch.equal(a, b) for a, b in zip(first, again)), (
        f"{what}: two calls with generators in the same state gave different "
        "batches: draw every random number from `generator` (generator=generator), "
        "never from PyTorch's global generator."
    )


_PASSKEY_POLICY = forbid(
    "attnbook.data",
    why="The milestone asks you to write the task's generator yourself.",
)
_PASSKEY_HINT = (
    f"fill with tokens drawn uniformly from 2 .. vocab_size - 1, put the key marker "
    f"{KEY} at a position drawn uniformly from 0 .. length - 3, the passkey (uniform "
    f"in 2 .. vocab_size - 1) after it, the query marker {QUERY} last; every draw with "
    "generator=generator."
)


@register("project-context-passkey", library=_PASSKEY_POLICY, hint=_PASSKEY_HINT)
def _check_passkey(student) -> None:
    """Public: the layout of two small batches, and the same batch from the same
    seed."""
    for batch, length, vocab, seed in [(4, 10, 8, 0), (3, 16, 20, 1)]:
        what, tokens, targets, key_pos = _call_passkey(
            student, batch, length, vocab, seed
        )
        _check_layout(what, tokens, targets, key_pos, length, vocab)
    _check_determinism(student, 4, 10, 8, 2)


@register("project-context-passkey-hidden", library=_PASSKEY_POLICY,
          hint=_PASSKEY_HINT)  # fmt: skip
def _check_passkey_hidden(student) -> None:
    """Hidden: random sizes, the shortest sequence (length 3) and the smallest
    vocabulary (3), every key position reachable and drawn uniformly, the passkey and
    the filler covering the vocabulary, and sizes to refuse."""
    gen = generator(82)
    for _ in range(6):
        batch = int(torch.randint(1, 9, (), generator=gen))
        length = int(torch.randint(3, 40, (), generator=gen))
        vocab = int(torch.randint(3, 50, (), generator=gen))
        seed = int(torch.randint(0, 2**31, (), generator=gen))
        what, *batch_ = _call_passkey(student, batch, length, vocab, seed)
        _check_layout(what, *batch_, length, vocab)
        _check_determinism(student, batch, length, vocab, seed)
    for batch, length, vocab in [(5, 3, 10), (4, 6, 3), (1, 4, 4)]:
        seed = int(torch.randint(0, 2**31, (), generator=gen))
        what, *batch_ = _call_passkey(student, batch, length, vocab, seed)
        _check_layout(what, *batch_, length, vocab)
    # the distribution: many draws at a short length
    n, length, vocab = 3000, 7, 6
    seed = int(torch.randint(0, 2**31, (), generator=gen))
    what, tokens, targets, key_pos = _call_passkey(student, n, length, vocab, seed)
    _check_layout(what, tokens, targets, key_pos, length, vocab)
    counts = torch.bincount(key_pos, minlength=length - 2)[: length - 2]
    expected = n / (length - 2)
    assert counts.min() > 0.8 * expected and counts.max() < 1.2 * expected, (
        f"{what}: the key's positions 0 .. {length - 3} came {counts.tolist()} times: "
        "draw key_pos uniformly from 0 .. length - 3, both ends included."
    )
    values = torch.bincount(targets, minlength=vocab)[2:]
    assert values.min() > 0.8 * n / (vocab - 2), (
        f"{what}: the passkeys 2 .. {vocab - 1} came {values.tolist()} times: draw "
        "them uniformly from 2 .. vocab_size - 1."
    )
    rows = torch.arange(n)
    filler = torch.ones_like(tokens, dtype=torch.bool)
    filler[rows, key_pos] = filler[rows, key_pos + 1] = False
    filler[:, -1] = False
    spread = torch.bincount(tokens[filler], minlength=vocab)[2:].float()
    assert spread.min() > 0.8 * spread.mean(), (
        f"{what}: the filler tokens 2 .. {vocab - 1} came {spread.long().tolist()} "
        "times: draw them uniformly from 2 .. vocab_size - 1."
    )
    for length, vocab, why in [(2, 10, "length 2 leaves no room for the key"),
                               (8, 2, "vocab_size 2 leaves no passkey value")]:
        what = f"passkey_batch(batch=2, length={length}, vocab_size={vocab}, ...)"
        try:
            got = student(2, length, vocab, torch.Generator().manual_seed(0))
        except NotImplementedError:
            raise
        except Exception as err:
            if type(err).__name__ == "ValueError":
                continue
            raise AssertionError(
                f"{what}: raise ValueError ({why}), got {type(err).__name__}."
            ) from None
        raise AssertionError(
            f"{what}: raise ValueError ({why}), got {type(got).__name__}."
        )
