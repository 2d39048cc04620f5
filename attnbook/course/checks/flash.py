"""Checks for the exercises of the chapter on FlashAttention."""

from __future__ import annotations

import torch

from ...core import causal_mask
from ...flash import hbm_accesses
from . import register
from .common import assert_close, generator, real_number
from .library import forbid


def _merge_note(l, m_a, l_a, m_b, l_b) -> str:
    """What a wrong merged normalizer did, or ''."""
    try:
        l = torch.as_tensor(l).double()
    except Exception:
        return ""
    m = torch.maximum(m_a, m_b)
    slips = [
        (
            l_a + l_b,
            "You added l_a + l_b: each l is relative to its own block's maximum; "
            "rescale it to the new maximum m first, l_x * exp(m_x - m).",
        ),
        (
            l_a * torch.exp(m - m_a) + l_b * torch.exp(m - m_b),
            "Your rescaling factor is exp(m - m_x): it is exp(m_x - m), at most 1.",
        ),
        (
            l_a * torch.exp(m_a - m) + l_b,
            "You rescaled only l_a: l_b is relative to m_b and needs exp(m_b - m) too.",
        ),
        (
            l_a + l_b * torch.exp(m_b - m),
            "You rescaled only l_b: l_a is relative to m_a and needs exp(m_a - m) too.",
        ),
    ]
    for wrong, note in slips:
        if wrong.shape == l.shape and torch.allclose(l, wrong, atol=1e-6, rtol=1e-5):
            return " " + note
    return ""


@register(
    "flash-merge-states",
    library=forbid(
        "attnbook.flash.merge_partials",
        "attnbook.flash.online_softmax_step",
        why="The exercise asks you to write the merge of two online-softmax states, "
            "which online_softmax_step and merge_partials implement.",
    ),
    hint="m = max(m_a, m_b), l = l_a * exp(m_a - m) + l_b * exp(m_b - m); when both "
    "maxima are -inf "
    "(two empty blocks) return m = -inf, l = 0 without computing -inf - (-inf).",
)
def _check_merge_states(student) -> None:
    """``student(m_a, l_a, m_b, l_b)`` must return the ``(m, l)`` of the concatenated
    scores, and ``(-inf, 0)`` for two empty blocks."""

    gen = generator(0)
    for n_a, n_b, spread in [(3, 5, 1.0), (1, 1, 10.0), (7, 2, 300.0)]:
        a = spread * torch.randn(4, n_a, generator=gen, dtype=torch.float64)
        b = spread * torch.randn(4, n_b, generator=gen, dtype=torch.float64)

        def state(x):
            return x.amax(-1), torch.exp(x - x.amax(-1, keepdim=True)).sum(-1)

        m, l = student(*state(a), *state(b))
        both = torch.cat([a, b], dim=-1)
        what = f"blocks of {n_a} and {n_b} scores"
        assert_close(m, both.amax(-1), f"merged maximum for {what}")
        try:
            assert_close(
                m + torch.log(torch.as_tensor(l)),
                torch.logsumexp(both, -1),
                f"merged normalizer (m + log l must be the log-sum-exp) for {what}",
            )
        except AssertionError as err:
            raise AssertionError(
                f"{err}{_merge_note(l, *state(a), *state(b))}"
            ) from None
    inf = torch.tensor([-float("inf")], dtype=torch.float64)
    m, l = student(
        inf,
        torch.zeros(1, dtype=torch.float64),
        torch.tensor([2.0], dtype=torch.float64),
        torch.tensor([3.0], dtype=torch.float64),
    )
    assert_close(
        torch.stack([torch.as_tensor(m), torch.as_tensor(l)]).flatten(),
        [2.0, 3.0],
        "merging an empty block (m = -inf, l = 0) must return the other block "
        "unchanged",
    )
    m, l = student(
        inf,
        torch.zeros(1, dtype=torch.float64),
        inf,
        torch.zeros(1, dtype=torch.float64),
    )
    assert (
        torch.as_tensor(l).item() == 0 and not torch.isnan(torch.as_tensor(l)).any()
    ), (
        "merging two empty blocks must give l = 0, not NaN: with m = -inf, exp(m_a - "
        "m) is exp(-inf - (-inf)) = exp(NaN); shift by a finite number (0) instead of "
        "an infinite m."
    )
    assert torch.as_tensor(m).item() == -float("inf"), (
        "merging two empty blocks must give m = -inf (the merged block is still "
        f"empty), got m = {torch.as_tensor(m).item()!r}: keep m = max(m_a, m_b) and "
        "use a finite shift only inside the exp (merged with m = 0, a later block "
        "whose scores are all far below 0 would underflow to l = 0)."
    )


def _last_key(q_block, block_q, L, S, offset=None, first_row=False) -> int:
    """The last key that query block ``q_block`` sees (negative: none); ``offset``
    ``S - L`` by default (bottom-right), 0 for top-left alignment."""
    row = q_block * block_q if first_row else min((q_block + 1) * block_q, L) - 1
    return min(row + (S - L if offset is None else offset), S - 1)


def _count(last_key, block_k) -> int:
    return 0 if last_key < 0 else last_key // block_k + 1


# causal_key_blocks's slips: (q_block, block_q, block_k, L, S) -> the answer, and a note
_KEY_BLOCK_SLIPS = [
    (
        lambda qb, bq, bk, L, S: _count(_last_key(qb, bq, L, S, offset=0), bk),
        "That is the count for top-left alignment (query i sees keys j <= i); with "
        "bottom-right alignment query i sees keys j <= i + S - L.",
    ),
    (
        lambda qb, bq, bk, L, S: _count(_last_key(qb, bq, L, S, first_row=True), bk),
        "You count the keys of the block's first query: its last query, row "
        "min((q_block + 1) * block_q, L) - 1, sees the most keys.",
    ),
    (
        lambda qb, bq, bk, L, S: _last_key(qb, bq, L, S) // bk + 1,
        "A query block whose queries see no key (L > S) needs 0 key blocks: "
        "last_key // block_k + 1 is negative or wrong when last_key < 0.",
    ),
    (
        lambda qb, bq, bk, L, S: max(0, _last_key(qb, bq, L, S) // bk),
        "Off by one: key block j holds keys j * block_k .. (j + 1) * block_k - 1, so "
        "reaching key k takes k // block_k + 1 blocks.",
    ),
    (
        lambda qb, bq, bk, L, S: max(0, (_last_key(qb, bq, L, S) + 1) // bk),
        "You round down: keys 0..k fill ceil((k + 1) / block_k) blocks, the last one "
        "possibly partly.",
    ),
    (
        lambda qb, bq, bk, L, S: qb + 1,
        "q_block + 1 is the count only when L == S and block_q == block_k.",
    ),
]


def _key_block_slip(student, calls) -> str:
    """The note of the slip the answer makes on every call, or ''."""
    try:
        got = [student(*args) for args in calls]
    except Exception:
        return ""
    for slip, note in _KEY_BLOCK_SLIPS:
        if all(g == slip(*args) for g, args in zip(got, calls)):
            return " " + note
    return ""


@register(
    "flash-causal-key-blocks",
    library=forbid(
        "attnbook.flash.key_range",
        why="The exercise asks you to work out the keys a causal query block needs, "
            "which key_range returns.",
    ),
    hint="with bottom-right alignment query i sees keys j <= i + S - L; the block's "
    "last row is "
    "min((q_block + 1) * block_q, L) - 1. Count the key blocks up to that row's last "
    "key (0 if it is "
    "negative), at most ceil(S / block_k).",
)
def _check_causal_key_blocks(student) -> None:
    """``student(q_block, block_q, block_k, L, S)`` must count the key blocks a causal
    query block needs, against :func:`attnbook.core.causal_mask`."""

    configs = [
        (8, 8, 2, 2),
        (7, 13, 3, 4),
        (13, 5, 4, 2),
        (1, 9, 16, 4),
        (5, 5, 8, 8),
        (40, 10, 16, 16),
    ]
    calls = [
        (qb, bq, bk, L, S) for L, S, bq, bk in configs for qb in range(-(-L // bq))
    ]
    for L, S, bq, bk in configs:
        mask = causal_mask(L, S)
        for qb in range(-(-L // bq)):
            rows = mask[qb * bq : (qb + 1) * bq]
            visible = rows.any(dim=0).nonzero()
            expected = 0 if len(visible) == 0 else int(visible.max()) // bk + 1
            got = student(qb, bq, bk, L, S)
            if got != expected:
                last = min((qb + 1) * bq, L) - 1
                sees = (
                    f"sees keys 0..{int(visible.max())}"
                    if len(visible)
                    else "sees no key"
                )
                raise AssertionError(
                    f"L={L}, S={S}, block_q={bq}, block_k={bk}: query block {qb} "
                    f"needs {expected} key block{'' if expected == 1 else 's'}, you "
                    f"said {got} (its last query, "
                    f"row {last}, {sees})." + _key_block_slip(student, calls)
                )


def _backward_slips(q, k, v, out, lse, dout, scale) -> dict:
    """For dq, dk and dv: what plausible wrong backward passes return, and notes."""
    kt = k.transpose(-1, -2)
    dp = dout @ v.transpose(-1, -2)
    delta = (dout * out).sum(-1, keepdim=True)
    jacobian = (
        "Your dS is P * dP: subtract delta_i = rowsum(dout * out) from dP before "
        "multiplying by P (the softmax's Jacobian)."
    )
    wrong_delta = (
        "Your delta_i is the plain rowsum of dP: it is sum_j P_ij dP_ij = "
        "rowsum(dout * out)."
    )
    p_notes = [
        (
            torch.exp(q @ kt - lse[..., None]),
            "Your P is exp(q k^T - lse), without the scale: rebuild it as exp(scale * "
            "q k^T - lse), the scores the forward pass used.",
        ),
        (
            torch.exp(q @ kt * scale),
            "Your P is exp(scale * q k^T) without subtracting lse: the saved "
            "log-sum-exp normalizes it.",
        ),
    ]
    p = torch.exp(q @ kt * scale - lse[..., None])
    slips = {"dq": [], "dk": [], "dv": []}
    for ds, s, note in [
        (
            p * (dp - delta),
            1.0,
            "Your {} lacks the scale: the scores are scale * q "
            "k^T, so dq = dS k * scale and dk = dS^T q * scale.",
        ),
        (p * dp, scale, jacobian),
        (p * (dp - dp.sum(-1, keepdim=True)), scale, wrong_delta),
    ] + [(pw * (dp - delta), scale, note) for pw, note in p_notes]:
        slips["dq"].append((ds @ k * s, note.format("dq")))
        slips["dk"].append((ds.transpose(-1, -2) @ q * s, note.format("dk")))
    slips["dv"] = [(pw.transpose(-1, -2) @ dout, note) for pw, note in p_notes]
    return slips


@register(
    "flash-attention-backward",
    library=forbid(
        "attnbook.flash.flash_backward",
        "attnbook.attend.flash_attention",
        why="The exercise asks you to write attention's backward pass from the "
            "log-sum-exp, which flash_backward implements and "
            "flash_attention differentiates.",
    ),
    hint="P = exp(q k^T * scale - lse[..., None]); dv = P^T dout; dP = dout v^T; "
    "delta = rowsum(dout * out); "
    "dS = P * (dP - delta[..., None]); dq = dS k * scale; dk = dS^T q * scale.",
)
def _check_attention_backward(student) -> None:
    """``student(q, k, v, out, lse, dout, scale)`` must return ``(dq, dk, dv)`` equal to
    autograd's in float64."""

    gen = generator(0)
    for L, S, E, scale in [(4, 6, 3, 0.5), (1, 1, 2, 1.0), (7, 3, 5, 0.3)]:
        q, k, v = (
            torch.randn(2, n, E, generator=gen, dtype=torch.float64, requires_grad=True)
            for n in (L, S, S)
        )
        scores = q @ k.transpose(-1, -2) * scale
        out = torch.softmax(scores, -1) @ v
        # from the check's generator: the caller's global RNG is left alone
        dout = torch.randn(out.shape, generator=gen, dtype=torch.float64)
        out.backward(dout)
        args = (
            q.detach(),
            k.detach(),
            v.detach(),
            out.detach(),
            torch.logsumexp(scores, -1).detach(),
            dout,
        )
        got = student(*(a.clone() for a in args), scale)
        assert isinstance(got, (tuple, list)) and len(got) == 3, (
            f"return the three gradients (dq, dk, dv), got {type(got).__name__}."
        )
        shapes = {"dq": q.shape, "dk": k.shape, "dv": v.shape}
        for name, g, t in zip(("dq", "dk", "dv"), got, (q, k, v)):
            what = f"{name} for L={L}, S={S}, d={E}"
            g = torch.as_tensor(g)
            if g.shape != t.shape:
                same = [n for n, shape in shapes.items() if shape == g.shape]
                order = (
                    f" Your {name} has the shape of {same[0][1:]}: return (dq, dk, "
                    "dv), each with the shape of its input."
                    if same
                    else ""
                )
                raise AssertionError(
                    f"{what}: expected shape {tuple(t.shape)}, got {tuple(g.shape)}."
                    + order
                )
            try:
                assert_close(g, t.grad, what, atol=1e-9, rtol=1e-7)
            except AssertionError as err:
                slips = _backward_slips(*args, scale)[name]
                note = next(
                    (
                        " " + note
                        for wrong, note in slips
                        if torch.allclose(g.double(), wrong, atol=1e-9, rtol=1e-7)
                    ),
                    "",
                )
                raise AssertionError(f"{err}{note}") from None


def _traffic_ratio(n, sram, bpe, bytes_as_elements=False, tiles="ceil", qo=True):
    """The ratio of flash traffic at d = 128 and d = 64, right or with one slip: SRAM
    bytes taken for elements, the number of tiles as ``"real"`` n / B, ``"floor"`` n //
    B or ``"plus1"`` n // B + 1, or the reading of Q and writing of O left out."""

    def traffic(d):
        m = sram if bytes_as_elements else sram // bpe
        block = min(n, max(1, m // (4 * d)))
        count = {
            "ceil": -(-n // block),
            "real": n / block,
            "floor": n // block,
            "plus1": n // block + 1,
        }[tiles]
        return 2 * n * d * qo + 2 * n * d * count

    return traffic(128) / traffic(64)


# flash_traffic_ratio's slips: (n, sram_bytes, bytes_per_element) -> the answer, note
_IO_SLIPS = [
    (
        lambda *case: 4.0,
        "4 is the asymptotic d^2 scaling: count the traffic of both head dimensions "
        "from the formula and divide.",
    ),
    (
        lambda *case: 1 / _traffic_ratio(*case),
        "That is traffic(64) / traffic(128): the ratio is d = 128's traffic over d = "
        "64's.",
    ),
    (
        lambda *case: _traffic_ratio(*case, bytes_as_elements=True),
        "Your M is sram_bytes: the SRAM holds sram_bytes // bytes_per_element "
        "elements.",
    ),
    (
        lambda *case: _traffic_ratio(*case, tiles="real"),
        "Your number of query tiles is n / B: a ragged last tile still costs a full "
        "pass over K and V, ceil(n / B) = -(-n // B).",
    ),
    (
        lambda *case: _traffic_ratio(*case, tiles="floor"),
        "Your number of query tiles is n // B, which drops the ragged last tile: "
        "ceil(n / B) = -(-n // B).",
    ),
    (
        lambda *case: _traffic_ratio(*case, tiles="plus1"),
        "Your number of query tiles is n // B + 1, one too many when B divides n: "
        "ceil(n / B) = -(-n // B).",
    ),
    (
        lambda *case: _traffic_ratio(*case, qo=False),
        "You count only the streaming of K and V: add the 2 N d for reading Q and "
        "writing O once.",
    ),
]


def _io_slip(student, cases) -> str:
    """The note of the slip the answer makes on every case, or ''."""
    try:
        got = [float(student(n, s, bytes_per_element=b)) for n, s, b in cases]
    except Exception:
        return ""
    for slip, note in _IO_SLIPS:
        if all(abs(g - slip(*case)) <= 1e-9 * g for g, case in zip(got, cases)):
            return " " + note
    return ""


@register(
    "flash-io-head-dim",
    library=forbid(
        "attnbook.flash.hbm_accesses",
        why="The exercise asks you to count the traffic yourself, then compare with "
            "hbm_accesses.",
    ),
    hint="for each d: M = sram_bytes // bytes_per_element, B = min(n, max(1, M // (4 "
    "d))), traffic = "
    "2 n d + 2 n d * ceil(n / B) (ceil with integers: -(-n // B)); return "
    "traffic(128) / traffic(64).",
)
def _check_io_head_dim(student) -> None:
    """``student(n, sram_bytes, bytes_per_element=2)`` must equal the ratio of
    :func:`attnbook.flash.hbm_accesses`'s flash counts for d = 128 and d = 64, on eight
    sizes."""

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
        try:
            got = student(n, sram, bytes_per_element=bpe)
        except Exception as err:  # the grader's stand-in raises a look-alike class
            if type(err).__name__ != "ZeroDivisionError":
                raise
            raise AssertionError(
                f"for {what} your code divides by zero: M = {sram // bpe} elements of "
                f"SRAM give M // (4 d) = {sram // bpe // 256} at d = 64 and "
                f"{sram // bpe // 512} at d = 128; a tile holds at least one row, B = "
                "max(1, M // (4 d))."
            ) from None
        got = real_number(got, what)
        assert abs(got - expected) <= 1e-9 * expected, (
            f"for {what} you return {got!r}; the flash traffic is {flash[128]} "
            "elements at d=128 and "
            f"{flash[64]} at d=64, a ratio of {expected:.6g}."
            + _io_slip(student, cases)
        )


def _window_slip(student, calls) -> str:
    """What a plausible wrong window range did, or ''."""

    def top_left(i0, i1, L, S, left, right):
        return _tight(i0, i1, L, S, S, left, right)

    def no_plus_one(i0, i1, L, S, left, right):
        lo, _ = _tight(i0, i1, L, L, S, left, right)
        return lo, S if right < 0 else min(S, i1 - 1 + S - L + right)

    slips = [
        (
            top_left,
            "Your range is top-left aligned: with L != S query i sits at position "
            "i + S - L among the keys, and the window is centred there.",
        ),
        (
            no_plus_one,
            "Your hi is the last visible key: a half-open range [lo, hi) needs hi = "
            "last + 1.",
        ),
    ]
    visible = [c for c in calls if _tight(c[0], c[1], c[2], c[2], *c[3:])[1] > 0]
    for slip, note in slips:
        try:
            if all(_same_range(student(*c), slip(*c), c) for c in visible[:40]):
                return " " + note
        except Exception:
            continue
    return ""


def _tight(i0, i1, L, aligned_to, S, left, right):
    """The keys rows ``i0 .. i1 - 1`` may see, from a dense mask: row ``i`` sits at key
    position ``i + S - aligned_to`` (``aligned_to = L``: bottom-right; ``S``:
    top-left)."""
    rows = torch.arange(i0, i1)[:, None] + (S - aligned_to)
    cols = torch.arange(S)[None, :]
    allowed = torch.ones(i1 - i0, S, dtype=torch.bool)
    if left >= 0:
        allowed &= cols >= rows - left
    if right >= 0:
        allowed &= cols <= rows + right
    seen = allowed.any(dim=0).nonzero()
    if len(seen) == 0:
        return 0, 0
    return int(seen.min()), int(seen.max()) + 1


def _same_range(got, expected, call) -> bool:
    lo, hi = (int(x) for x in got)
    if expected[1] <= expected[0]:  # nothing visible: any empty range will do
        return hi <= lo
    return (lo, hi) == expected


@register(
    "flash-window-key-range",
    library=forbid(
        "attnbook.flash.key_range",
        why="The exercise asks you to work out the keys a sliding window lets a "
            "query tile see, which key_range returns.",
    ),
    hint="query i sits at position i + S - L among the keys and sees keys j in "
    "[i + S - L - left, i + S - L + right]; take the first row's lower end and the "
    "last row's upper end + 1, clamped to [0, S]; -1 means no bound on that side.",
)
def _check_window_key_range(student) -> None:
    """``student(i0, i1, L, S, left, right)`` must return the half-open range of keys
    ``[lo, hi)`` that queries ``i0 .. i1 - 1`` see under a sliding window, against a
    dense mask; any empty range is accepted when no key is visible."""
    gen = generator(17)
    calls = [
        (0, 4, 8, 8, 2, 2),
        (4, 8, 8, 8, 2, 0),
        (0, 5, 5, 12, 3, -1),  # L < S: the window sits at the end of the keys
        (6, 12, 12, 7, -1, 1),  # L > S: the first rows see few keys or none
        (0, 4, 12, 7, 1, 1),
    ]
    for _ in range(60):
        L, S = (int(x) for x in torch.randint(1, 40, (2,), generator=gen))
        i0 = int(torch.randint(0, L, (1,), generator=gen))
        i1 = int(torch.randint(i0 + 1, L + 1, (1,), generator=gen))
        left, right = (int(x) for x in torch.randint(-1, 12, (2,), generator=gen))
        calls.append((i0, i1, L, S, left, right))
    for call in calls:
        i0, i1, L, S, left, right = call
        expected = _tight(i0, i1, L, L, S, left, right)
        got = student(*call)
        try:
            ok = _same_range(got, expected, call)
        except (TypeError, ValueError):
            raise AssertionError(
                f"window_key_range{call} must return two integers (lo, hi), got "
                f"{got!r}."
            ) from None
        if not ok:
            seen = (
                f"they see keys {expected[0]}..{expected[1] - 1}"
                if expected[1] > expected[0]
                else "they see no key"
            )
            raise AssertionError(
                f"queries {i0}..{i1 - 1} of L={L} against S={S} keys, window "
                f"(left={left}, right={right}): {seen}, so [lo, hi) = {expected}; "
                f"you returned {tuple(got)}." + _window_slip(student, calls)
            )


@register(
    "flash-packed-positions",
    library=forbid(
        "attnbook.flex.document_ids",
        why="The exercise asks you to compute each packed token's document and "
            "position, which document_ids gives in part.",
    ),
    hint="token t belongs to the document b with cu_seqlens[b] <= t < "
    "cu_seqlens[b + 1] (counted from 0), and its position restarts at 0 where its "
    "document starts: t - cu_seqlens[b].",
)
def _check_packed_positions(student) -> None:
    """``student(cu_seqlens)`` must return ``(document ids, positions)`` of every packed
    token, both ``(total,)`` integer tensors, against a loop over the documents."""
    gen = generator(23)
    cases = [[0, 3, 5, 9], [0, 1], [0, 4, 4, 7]]  # an empty document in the last
    for _ in range(5):
        lengths = torch.randint(0, 9, (int(torch.randint(1, 6, (1,), generator=gen)),),
                                generator=gen)  # fmt: skip
        cases.append([0, *lengths.cumsum(0).tolist()])
    for offsets in cases:
        cu = torch.tensor(offsets, dtype=torch.int32)
        ids = [
            b
            for b in range(len(offsets) - 1)
            for _ in range(offsets[b + 1] - offsets[b])
        ]
        pos = [
            t
            for b in range(len(offsets) - 1)
            for t in range(offsets[b + 1] - offsets[b])
        ]
        got = student(cu)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise AssertionError(
                f"packed_positions must return (document_ids, positions), got {got!r}."
            )
        doc, position = (torch.as_tensor(x) for x in got)
        what = f"cu_seqlens={offsets}"
        if doc.tolist() != ids:
            note = ""
            if doc.numel() == len(ids) and (doc - 1).tolist() == ids:
                note = " Your ids count from 1: the first document is 0."
            raise AssertionError(
                f"document ids for {what}: expected {ids}, got {doc.tolist()}." + note
            )
        if position.tolist() != pos:
            note = ""
            if position.tolist() == list(range(len(pos))):
                note = (
                    " Your positions run on across documents: each document starts "
                    "again at 0 (else the second one is encoded as if it continued "
                    "the first)."
                )
            raise AssertionError(
                f"positions for {what}: expected {pos}, got {position.tolist()}." + note
            )
