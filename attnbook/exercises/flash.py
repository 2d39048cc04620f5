"""Checks for the exercises of the chapter on FlashAttention."""

from __future__ import annotations

import torch

from . import register
from .common import assert_close, generator, real_number


@register(
    "flash-merge-states",
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
        assert_close(
            m, both.amax(-1), f"merged maximum for blocks of {n_a} and {n_b} scores"
        )
        assert_close(
            m + torch.log(torch.as_tensor(l)),
            torch.logsumexp(both, -1),
            "merged normalizer (m + log l must be the log-sum-exp) for blocks of "
            f"{n_a} and {n_b}",
        )
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
    ), "merging two empty blocks must give l = 0, not NaN."


@register(
    "flash-causal-key-blocks",
    hint="with bottom-right alignment query i sees keys j <= i + S - L; the block's "
    "last row is "
    "min((q_block + 1) * block_q, L) - 1. Count the key blocks up to that row's last "
    "key (0 if it is "
    "negative), at most ceil(S / block_k).",
)
def _check_causal_key_blocks(student) -> None:
    """``student(q_block, block_q, block_k, L, S)`` must count the key blocks a causal
    query block needs, against :func:`attnbook.core.causal_mask`."""

    from ..core import causal_mask

    for L, S, bq, bk in [
        (8, 8, 2, 2),
        (7, 13, 3, 4),
        (13, 5, 4, 2),
        (1, 9, 16, 4),
        (5, 5, 8, 8),
        (40, 10, 16, 16),
    ]:
        mask = causal_mask(L, S)
        for qb in range(-(-L // bq)):
            rows = mask[qb * bq : (qb + 1) * bq]
            visible = rows.any(dim=0).nonzero()
            expected = 0 if len(visible) == 0 else int(visible.max()) // bk + 1
            got = student(qb, bq, bk, L, S)
            assert got == expected, (
                f"L={L}, S={S}, block_q={bq}, block_k={bk}: query block {qb} needs "
                f"{expected} key blocks, you said {got}."
            )


@register(
    "flash-attention-backward",
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
        dout = torch.randn_like(out)
        out.backward(dout)
        got = student(
            q.detach(),
            k.detach(),
            v.detach(),
            out.detach(),
            torch.logsumexp(scores, -1).detach(),
            dout,
            scale,
        )
        for name, g, t in zip(("dq", "dk", "dv"), got, (q, k, v)):
            assert_close(
                g, t.grad, f"{name} for L={L}, S={S}, d={E}", atol=1e-9, rtol=1e-7
            )


@register(
    "flash-io-head-dim",
    hint="for each d: M = sram_bytes // bytes_per_element, B = min(n, max(1, M // (4 "
    "d))), traffic = "
    "2 n d + 2 n d * ceil(n / B) (ceil with integers: -(-n // B)); return "
    "traffic(128) / traffic(64).",
)
def _check_io_head_dim(student) -> None:
    """``student(n, sram_bytes, bytes_per_element=2)`` must equal the ratio of
    :func:`attnbook.flash.hbm_accesses`'s flash counts for d = 128 and d = 64, on eight
    sizes."""
    from ..flash import hbm_accesses

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
        got = real_number(student(n, sram, bytes_per_element=bpe), what)
        assert abs(got - expected) <= 1e-9 * expected, (
            f"for {what} you return {got!r}; the flash traffic is {flash[128]} "
            "elements at d=128 and "
            f"{flash[64]} at d=64, a ratio of {expected:.6g}."
        )
