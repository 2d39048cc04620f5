"""Diagrams of sparsity and FlashAttention: block layouts, the online softmax, tiling,
recomputation and the tiles a masked kernel visits.

The block layouts and tile classes are computed with the package
(:func:`attnbook.sparse.bigbird_block_mask`, :func:`attnbook.masks.dense`,
:func:`attnbook.masks.active_tiles`) and the online-softmax numbers with
:func:`attnbook.primitives.online_softmax_step`, so the pictures match the code.
"""

from __future__ import annotations

import math

import torch

from attnbook import masks
from attnbook.primitives import online_softmax_step
from attnbook.sparse import bigbird_block_mask

from .catalog import diagram
from .svg import (
    BLUE,
    GREEN,
    GREY,
    HIGHLIGHT,
    INK,
    KEY,
    MUTED,
    ORANGE,
    OUTPUT,
    QUERY,
    RULE,
    SKY,
    SMALL,
    VALUE,
    Drawing,
    tint,
)

LIGHT = 0.3


def _legend(d: Drawing, x: float, y: float, entries, *, size: float = SMALL) -> None:
    """Colour swatches with their labels, one per line from ``y`` down."""
    for k, (fill, label) in enumerate(entries):
        d.rect(x, y + 22 * k - 7, 14, 14, fill=fill or "#ffffff", stroke=RULE,
               width=0.8)
        d.text(x + 22, y + 22 * k, label, anchor="start", size=size)


# --------------------------------------------------------------------------------------
# sparse.ipynb
# --------------------------------------------------------------------------------------
BIGBIRD = {"n_blocks": 10, "n_global": 1, "n_window": 3, "n_random": 2}


@diagram(
    "bigbird_blocks",
    chapter="sparse",
    after="## Global tokens, Longformer, ETC and BigBird",
    title="BigBird's block pattern",
    caption="""The block layout of `attnbook.sparse.bigbird_block_mask` for 10 blocks
    with 1 global block at each end, a window of 3 blocks and 2 random blocks per row
    (seed 0); each cell is a $b \\times b$ tile of scores. Look at a middle row: 3
    window + 2 global + 2 random = 7 tiles, however many blocks the sequence has.""",
    alt="""A 10 by 10 grid of blocks, query blocks as rows and key blocks as columns.
    The first and last rows and columns are filled blue: the global blocks. A band of
    three orange blocks runs along the diagonal: the window. Each of the eight middle
    rows has two more green blocks scattered off the band: the random blocks. The
    remaining cells are white and are not computed. A legend names the three colours
    and counts the computed tiles.""",
)
def bigbird_blocks() -> Drawing:
    n = BIGBIRD["n_blocks"]
    full = bigbird_block_mask(**BIGBIRD, generator=torch.Generator().manual_seed(0))
    glob = bigbird_block_mask(n, BIGBIRD["n_global"], 0, 0)
    window = bigbird_block_mask(n, 0, BIGBIRD["n_window"], 0)
    random = full & ~glob & ~window
    colour = {"global": BLUE, "window": ORANGE, "random": GREEN}

    def kind(i: int, j: int) -> str | None:
        for name, part in [("global", glob), ("window", window), ("random", random)]:
            if part[i, j]:
                return colour[name]
        return None

    d = Drawing(620, 390)
    cell, gx, gy = 30, 60, 60
    d.grid(gx, gy, [[kind(i, j) for j in range(n)] for i in range(n)], cell=cell,
           stroke="#ffffff", width=1.5)
    for k in range(n):
        d.text(gx + (k + 0.5) * cell, gy - 12, str(k), size=SMALL, colour=MUTED)
        d.text(gx - 12, gy + (k + 0.5) * cell, str(k), size=SMALL, colour=MUTED)
    d.text(gx + n * cell / 2, 22, "key block", colour=MUTED)
    d.text(gx - 12, gy - 12, "query", anchor="end", size=SMALL, colour=MUTED)
    counts = {name: int(part.sum()) for name, part in
              [("global", glob), ("window", window & ~glob), ("random", random)]}
    _legend(d, 400, 90, [
        (BLUE, f"global: {counts['global']} tiles"),
        (ORANGE, f"window: {counts['window']} tiles"),
        (GREEN, f"random: {counts['random']} tiles"),
        (None, f"skipped: {n * n - int(full.sum())} tiles"),
    ])
    d.lines(400, 230, [f"computed: {int(full.sum())} of {n * n}",
                       "a middle row: 3 + 2 + 2 = 7",
                       "(window, global, random)"], anchor="start", size=SMALL)
    return d


# --------------------------------------------------------------------------------------
# flash.ipynb
# --------------------------------------------------------------------------------------
ROW = [1.0, 3.0, 0.5, 2.0, 4.0, 1.5, 0.0, 2.5, 3.5, 4.5, 1.0, 2.0]
BLOCK = 4


def _online_states() -> list[tuple[float, float, float]]:
    """``(m, l, exp(m_old - m))`` after each block of :data:`ROW`, by the package's
    update, checked against the softmax of the whole row."""
    x = torch.tensor([ROW], dtype=torch.float64)
    m = torch.full((1,), -math.inf, dtype=torch.float64)
    l = torch.zeros(1, dtype=torch.float64)
    states = []
    for b in range(0, len(ROW), BLOCK):
        m_new, l, _ = online_softmax_step(m, l, x[:, b : b + BLOCK])
        states.append((m_new.item(), l.item(), math.exp(m.item() - m_new.item())))
        m = m_new
    assert torch.allclose(torch.exp(x - m[:, None]) / l, torch.softmax(x, -1))
    return states


@diagram(
    "online_softmax",
    chapter="flash",
    after="## The online softmax",
    title="The online softmax, block by block",
    caption="""The online softmax on a row of 12 scores in blocks of 4, with the
    numbers of `attnbook.primitives.online_softmax_step`. Each block may raise the
    running maximum $m$; the old sum $\\ell$ is then rescaled by $e^{m - m'}$ (the
    factor on each arrow) before the block's own terms are added. After the last block
    $e^{x_j - m} / \\ell$ is exactly the softmax of the whole row.""",
    alt="""A row of 12 scores in three blocks of four: 1.0, 3.0, 0.5, 2.0; then 4.0,
    1.5, 0.0, 2.5; then 3.5, 4.5, 1.0, 2.0, with each block's maximum highlighted.
    Under each block a box holds the running state after it: m = 3.00 and l = 1.59,
    then m = 4.00 and l = 1.91, then m = 4.50 and l = 2.64. A starting box holds m =
    minus infinity and l = 0. Arrows from one state to the next carry the rescaling
    factor exp(m - m'): times 0.37, then times 0.61. Formulas below give the update
    and the final softmax.""",
)
def online_softmax() -> Drawing:
    states = _online_states()
    d = Drawing(720, 310)
    cell = 36
    d.text(20, 70, "scores xⱼ", anchor="start", colour=MUTED)
    d.box(20, 130, 90, 56, ["m = −∞", "ℓ = 0"], fill=tint(SKY, LIGHT))
    previous = 110
    for b, (m, l, factor) in enumerate(states):
        x0 = 150 + b * (4 * cell + 50)
        block = ROW[b * BLOCK : (b + 1) * BLOCK]
        top = max(block)
        d.text(x0 + 2 * cell, 36, f"block {b + 1}", bold=True)
        d.grid(x0, 52, [[tint(HIGHLIGHT, 0.45) if v == top else tint(QUERY, 0.2)
                         for v in block]], cell=cell, stroke="#ffffff", width=2,
               labels=[[f"{v:.1f}" for v in block]], size=13)
        state = d.box(x0, 130, 4 * cell, 56, [f"m = {m:.2f}", f"ℓ = {l:.2f}"],
                      fill=tint(SKY, LIGHT))
        d.arrow((x0 + 2 * cell, 88), state.top_mid)
        d.arrow((previous, 158), state.left_mid)
        if b:
            d.text((previous + x0) / 2, 146, f"×{factor:.2f}", size=SMALL,
                   colour=HIGHLIGHT)
        previous = state.right
    d.lines(20, 238, ["m′ = max(m, max of the block)",
                      "ℓ′ = ℓ · exp(m − m′) + Σ over the block of exp(xⱼ − m′)"],
            anchor="start", leading=1.5)
    d.text(20, 290, "after the last block: softmax(x)ⱼ = exp(xⱼ − m) / ℓ, exactly",
           anchor="start", colour=MUTED)
    return d


@diagram(
    "flash_tiling",
    chapter="flash",
    after="## Tiling the forward pass",
    title="FlashAttention's tiling of the forward pass",
    caption="""One query block $Q_i$ of the tiled forward pass. It is loaded into SRAM
    once; the key and value blocks stream through, one tile of scores at a time,
    while the running $m$, $\\ell$ and acc are updated; $O_i$ and its log-sum-exp are
    written to HBM once, after the last key block. The $n \\times n$ scores never
    reach HBM.""",
    alt="""Two panels. Left, HBM, large and slow, holds Q, K, V and O as bars cut
    into four blocks; block i of Q and O and block j of K and V are highlighted.
    Right, SRAM, small and fast, holds the tiles Q_i, K_j and V_j and the output O_i.
    Arrows go from HBM to SRAM: Q_i is loaded once per i, K_j and V_j are streamed
    for every j. Inside SRAM, Q_i and K_j give one tile of scores S = s Q_i K_j
    transposed, which updates the running maximum m, the sum l and the accumulator
    acc, together with V_j. After the last j, O_i = acc / l goes back to SRAM's
    output tile and is written to HBM once with its log-sum-exp.""",
)
def flash_tiling() -> Drawing:
    d = Drawing(720, 380)
    d.rect(20, 20, 240, 340, fill=tint(GREY, 0.12), stroke=RULE, rx=10)
    d.text(140, 42, "HBM: large, slow", bold=True)
    d.rect(390, 20, 310, 340, fill=tint(SKY, 0.12), stroke=RULE, rx=10)
    d.text(545, 42, "SRAM: on chip, small, fast", bold=True)
    rows = [("Q", QUERY, 1, "Qᵢ"), ("K", KEY, 2, "Kⱼ"), ("V", VALUE, 2, "Vⱼ"),
            ("O", OUTPUT, 1, "Oᵢ")]
    tiles = {}
    for r, (name, colour, hot, tile) in enumerate(rows):
        y = 80 + 70 * r
        d.text(46, y + 15, name, bold=True)
        fills = [[colour if k == hot else tint(colour, 0.25) for k in range(4)]]
        d.grid(60, y, fills, cell=45, cell_h=30, stroke="#ffffff", width=2)
        tiles[name] = d.box(410, y, 60, 30, tile, fill=tint(colour, 0.45))
    for name, label in [("Q", "load once per i"), ("K", "stream every j"),
                        ("V", "stream every j")]:
        y = tiles[name].cy
        d.arrow((240, y), (tiles[name].x, y))
        d.text(325, y - 12, label, size=SMALL)
    d.arrow((tiles["O"].x, tiles["O"].cy), (240, tiles["O"].cy))
    d.text(325, tiles["O"].cy - 12, "write once per i", size=SMALL)
    d.text(325, tiles["O"].cy + 14, "with lseᵢ", size=SMALL, colour=MUTED)
    scores = d.box(500, 66, 190, 56, ["S = s · Qᵢ Kⱼᵀ", "one tile of scores"],
                   fill="#ffffff")
    d.arrow(tiles["Q"].right_mid, (scores.x, tiles["Q"].cy))
    d.arrow(tiles["K"].right_mid, (485, tiles["K"].cy), (485, 108), (scores.x, 108))
    update = d.box(500, 150, 190, 100,
                   ["m′ = max(m, rowmax S)", "P = exp(S − m′)",
                    "ℓ, acc × exp(m − m′)", "ℓ += rowsum P; acc += P Vⱼ"],
                   fill=tint(SKY, LIGHT), size=SMALL)
    d.arrow(scores.bottom_mid, update.top_mid)
    d.arrow(tiles["V"].right_mid, (update.x, tiles["V"].cy))
    d.arrow(update.bottom_mid, (update.cx, tiles["O"].cy), tiles["O"].right_mid)
    d.text(update.cx + 6, 336, "after the last j: Oᵢ = acc / ℓ", size=SMALL,
           colour=MUTED)
    d.text(140, 336, "no n × n scores ever stored here", size=SMALL, colour=MUTED)
    return d


@diagram(
    "flash_backward",
    chapter="flash",
    after="## The backward pass by recomputation",
    title="The backward pass by recomputation",
    caption="""What the forward pass keeps for the backward pass. Standard autograd
    saves the $n \\times n$ weights $P$; FlashAttention saves only $O$ and one
    log-sum-exp per row, and rebuilds each tile $P_{ij} = e^{S_{ij} - \\mathrm{lse}_i}$
    from $Q_i$ and $K_j$ when the backward pass reaches it: one more product, no
    $n^2$ memory.""",
    alt="""Top left, standard autograd saves Q, K, V and O, four tall thin
    rectangles, and a large n by n square P, highlighted: n squared plus 4 n d
    numbers. Top right, FlashAttention saves the same four thin rectangles and one
    very thin column, lse, with n numbers: 4 n d plus n numbers. Below, the backward
    pass for one tile (i, j) is a chain of boxes: Q_i and K_j give S = s Q_i K_j
    transposed; S and the saved lse_i, by an arrow from the top right panel, give P =
    exp(S - lse_i), marked recomputed and never stored; P then gives the gradients
    dV, dP, dS, dQ and dK of the tile.""",
)
def flash_backward() -> Drawing:
    d = Drawing(720, 376)
    saved = [("Q", QUERY), ("K", KEY), ("V", VALUE), ("O", OUTPUT)]
    for x0, title, extra in [(20, "standard autograd saves", "P"),
                             (370, "FlashAttention saves", "lse")]:
        d.text(x0 + 160, 22, title, bold=True)
        for k, (name, colour) in enumerate(saved):
            box = d.rect(x0 + 20 + 34 * k, 50, 22, 120, fill=tint(colour, 0.45),
                         width=1)
            d.text(box.cx, 186, name)
        if extra == "P":
            p = d.rect(x0 + 170, 50, 120, 120, fill=tint(HIGHLIGHT, 0.45), width=1)
            d.text(p.cx, p.cy, "P: n × n")
            d.text(x0 + 20, 214, "n² + 4nd numbers", anchor="start", colour=MUTED)
        else:
            lse = d.rect(x0 + 170, 50, 8, 120, fill=tint(SKY, 0.8), width=1)
            d.text(lse.right + 8, lse.cy, "lse: n numbers", anchor="start")
            d.text(x0 + 20, 214, "4nd + n numbers", anchor="start", colour=MUTED)
    d.line((355, 36), (355, 224), colour=RULE)
    d.text(20, 256, "backward pass, one tile (i, j)", anchor="start", bold=True)
    qk = d.box(20, 290, 90, 44, "Qᵢ, Kⱼ", fill=tint(QUERY, LIGHT))
    s = d.box(140, 290, 150, 44, "S = s · Qᵢ Kⱼᵀ")
    p = d.box(320, 290, 170, 44, "P = exp(S − lseᵢ)", fill=tint(HIGHLIGHT, LIGHT),
              width=2)
    grads = d.box(520, 268, 180, 90,
                  ["dVⱼ += Pᵀ dOᵢ", "dP = dOᵢ Vⱼᵀ", "dS = P ∘ (dP − δᵢ)",
                   "dQᵢ += s dS Kⱼ", "dKⱼ += s dSᵀ Qᵢ"], size=SMALL)
    d.arrow(qk.right_mid, s.left_mid)
    d.arrow(s.right_mid, p.left_mid)
    d.arrow(p.right_mid, (grads.x, p.cy))
    d.arrow((544, 172), (544, 250), (p.cx, 250), p.top_mid, colour=MUTED)
    d.text(p.cx, 354, "recomputed, never stored", size=SMALL, colour=HIGHLIGHT)
    return d


def _tiles(d: Drawing, x0: float, y0: float, predicate, L: int, S: int, tile: int,
           cell: float) -> dict[str, int]:
    """The token grid of ``predicate`` cut into ``tile x tile`` tiles, each drawn as
    full, masked inside or skipped; returns how many of each."""
    allowed = masks.dense(predicate, L, S)[0, 0]
    active = masks.active_tiles(predicate, L, S, tile)
    counts = {"full": 0, "masked": 0, "skipped": 0}
    for ti in range(active.shape[0]):
        for tj in range(active.shape[1]):
            block = allowed[ti * tile : (ti + 1) * tile, tj * tile : (tj + 1) * tile]
            x, y = x0 + tj * tile * cell, y0 + ti * tile * cell
            size = tile * cell
            if not active[ti, tj]:
                counts["skipped"] += 1
                d.rect(x, y, size, size, fill=tint(GREY, 0.3), stroke=None)
            elif bool(block.all()):
                counts["full"] += 1
                d.rect(x, y, size, size, fill=BLUE, stroke=None)
            else:
                counts["masked"] += 1
                fills = [[ORANGE if a else "#ffffff" for a in row]
                         for row in block.tolist()]
                d.grid(x, y, fills, cell=cell, stroke="#ffffff", width=0.5)
    for ti in range(active.shape[0] + 1):
        d.line((x0, y0 + ti * tile * cell), (x0 + S * cell, y0 + ti * tile * cell),
               colour=INK, width=1.2)
    for tj in range(active.shape[1] + 1):
        d.line((x0 + tj * tile * cell, y0), (x0 + tj * tile * cell, y0 + L * cell),
               colour=INK, width=1.2)
    return counts


@diagram(
    "causal_tiles",
    chapter="flash",
    after="## Masks and biases inside the tiles",
    title="Which tiles a masked kernel computes",
    caption="""Tiles of $4 \\times 4$ scores under three masks, classified with
    `attnbook.masks.active_tiles`: a full tile needs no mask, a tile that the mask
    cuts is masked inside, and a tile with nothing allowed is never loaded. Compare the
    causal count, which grows as $n^2$, with the window's: at most three tiles per
    query tile whatever the length; with $L < S$ the triangle sits bottom-right.""",
    alt="""Three token grids cut into 4 by 4 tiles. Left, causal with 16 queries and
    16 keys: the lower-left tiles are solid blue (full), the four diagonal tiles show
    an orange triangle of allowed entries (masked inside), and the six tiles above the
    diagonal are grey (skipped). Middle, a causal sliding window of 7 on the same
    sizes: each row of tiles has its masked diagonal tile, one full tile to its left
    and one more masked tile beyond that, and everything else is skipped. Right,
    causal with 8 queries and 16 keys aligned bottom-right: the first two tile
    columns are full, the third holds a masked and a full tile, and the fourth a
    skipped and a masked one. Counts of full, masked and skipped tiles sit
    under each grid, and a legend names the three kinds.""",
)
def causal_tiles() -> Drawing:
    d = Drawing(720, 290)
    cell, tile = 11, 4
    panels = [
        ("causal, L = S = 16", masks.causal(16), 16, 16),
        ("causal window of 7", masks.sliding_window(7, is_causal=True), 16, 16),
        ("causal, L = 8, S = 16", masks.causal(8, 16), 8, 16),
    ]
    for p, (title, predicate, L, S) in enumerate(panels):
        x0 = 28 + 240 * p
        d.text(x0 + S * cell / 2, 22, title, bold=True)
        counts = _tiles(d, x0, 42, predicate, L, S, tile, cell)
        d.text(x0 + S * cell / 2, 42 + L * cell + 18,
               f"{counts['full']} full · {counts['masked']} masked · "
               f"{counts['skipped']} skipped", size=SMALL)
    _legend(d, 520, 170, [(BLUE, "full: no mask needed"),
                          (ORANGE, "masked inside the tile"),
                          (tint(GREY, 0.3), "skipped: never loaded")])
    d.lines(520, 256, ["one cell = one (query, key)", "one square = one tile"],
            anchor="start", size=SMALL, colour=MUTED)
    return d
