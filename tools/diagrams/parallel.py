"""Diagrams of attention across devices: ring attention's schedule, the zigzag layout
and Ulysses' all-to-all.

The layouts and the causal work per rank come from
:func:`attnbook.distributed.shard_positions` and
:func:`attnbook.distributed.pairs_per_rank`, so the pictures match the code.
"""

from __future__ import annotations

from attnbook.distributed import pairs_per_rank, shard_positions

from .catalog import diagram
from .svg import BLUE, GREEN, MUTED, ORANGE, PURPLE, RULE, SMALL, Drawing, tint

RANKS = [BLUE, ORANGE, GREEN, PURPLE]  # one colour per rank (or per block)
LIGHT = 0.45


def _legend(d: Drawing, x: float, y: float, across: float = 110) -> None:
    for r, colour in enumerate(RANKS):
        d.rect(x + across * r, y - 7, 14, 14, fill=tint(colour, LIGHT), stroke=RULE,
               width=0.8)
        d.text(x + across * r + 22, y, f"rank {r}", anchor="start", size=SMALL)


@diagram(
    "ring_schedule",
    chapter="distributed",
    after="## Ring attention",
    title="Ring attention's schedule",
    caption="""Ring attention on $W = 4$ ranks. Each rank keeps its queries and passes
    its key/value block to the next rank at every step, so at step $t$ rank $r$ holds
    block $(r - t) \\bmod W$ (the table, coloured by block). After $W$ steps every
    rank has attended to every block and merged the partial results with their
    log-sum-exp.""",
    alt="""Left, four rank boxes in a ring, each holding its own queries Q_r, with
    arrows from rank 0 to 1, 1 to 2, 2 to 3 and 3 back to 0: the direction in which
    key/value blocks travel. Right, a table with one row per rank and one column per
    step t = 0 to 3. Each cell names the key/value block the rank holds: rank 0 holds
    blocks 0, 3, 2, 1; rank 1 holds 1, 0, 3, 2; rank 2 holds 2, 1, 0, 3; rank 3 holds
    3, 2, 1, 0. Cells are coloured by block, so each block's colour runs down a
    diagonal.""",
)
def ring_schedule() -> Drawing:
    d = Drawing(720, 290)
    world = 4
    cx, cy, r = 155, 160, 92
    centres = [(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)]
    for rank, (x, y) in enumerate(centres):
        d.box(x - 42, y - 22, 84, 44, [f"rank {rank}", f"Q{'₀₁₂₃'[rank]}"],
              fill=tint(RANKS[rank], LIGHT), size=SMALL)
    # the ring: rank r sends its block to rank r + 1, corner to corner
    hops = [((cx + 42, cy - r + 8), (cx + r, cy - 24)),
            ((cx + r, cy + 24), (cx + 44, cy + r - 8)),
            ((cx - 42, cy + r - 8), (cx - r, cy + 24)),
            ((cx - r, cy - 24), (cx - 44, cy - r + 8))]
    for start, end in hops:
        d.arrow(start, end, colour=MUTED, width=1.6)
    d.lines(cx, cy, ["KV blocks", "move one hop", "per step"], size=SMALL,
            colour=MUTED)
    # the schedule
    x0, y0, w, h = 410, 70, 70, 40
    d.text(x0 + 2 * w, 24, "block held at step t", bold=True)
    for t in range(world):
        d.text(x0 + (t + 0.5) * w, 52, f"t = {t}", size=SMALL, colour=MUTED)
    for rank in range(world):
        d.text(x0 - 12, y0 + (rank + 0.5) * h, f"rank {rank}", anchor="end",
               size=SMALL)
        for t in range(world):
            block = (rank - t) % world
            d.box(x0 + t * w + 2, y0 + rank * h + 2, w - 4, h - 4, f"KV {block}",
                  fill=tint(RANKS[block], LIGHT), stroke=None, rx=3, size=SMALL)
    d.text(x0 + 2 * w, y0 + world * h + 24, "block = (r − t) mod W", size=SMALL,
           colour=MUTED)
    return d


@diagram(
    "zigzag_layout",
    chapter="distributed",
    after="## Splitting the sequence",
    title="Contiguous and zigzag shards under a causal mask",
    caption="""Which positions each of 4 ranks holds, from
    `attnbook.distributed.shard_positions`, and the causal work that gives each rank,
    from `pairs_per_rank` (16 positions). Contiguous shards give the last rank almost
    six times the work of the first; zigzag gives rank $r$ chunks $r$ and $2W - 1 - r$,
    one early and one late, and every rank the same work.""",
    alt="""Two rows of 16 positions coloured by the rank that holds them. Contiguous:
    rank 0 holds 0 to 3, rank 1 4 to 7, rank 2 8 to 11, rank 3 12 to 15. Zigzag, in
    8 chunks of 2: rank 0 holds chunks 0 and 7 (positions 0, 1, 14, 15), rank 1
    chunks 1 and 6, rank 2 chunks 2 and 5, rank 3 chunks 3 and 4. Below, two bar
    charts of causal query-key pairs per rank: contiguous 10, 26, 42 and 58; zigzag 34
    for every rank.""",
)
def zigzag_layout() -> Drawing:
    world, seq_len, cell = 4, 16, 36
    d = Drawing(720, 330)
    layouts = ["contiguous", "zigzag"]
    for k, layout in enumerate(layouts):
        owner = {}
        for rank in range(world):
            for p in shard_positions(rank, world, seq_len, layout=layout).tolist():
                owner[p] = rank
        y = 40 + 50 * k
        d.text(20, y + 15, layout, anchor="start", bold=True)
        d.grid(128, y, [[tint(RANKS[owner[p]], LIGHT) for p in range(seq_len)]],
               cell=cell, cell_h=30, stroke="#ffffff", width=2,
               labels=[[str(p) for p in range(seq_len)]])
    d.text(128, 22, "position →", anchor="start", size=SMALL, colour=MUTED)
    d.text(128 + 8 * cell, 140, "zigzag: 8 chunks of 2, rank r holds chunks r and "
           "7 − r", size=SMALL, colour=MUTED)
    # the causal work per rank
    work = {layout: pairs_per_rank(seq_len, world, layout=layout)
            for layout in layouts}
    top = max(max(w) for w in work.values())
    d.text(360, 176, f"causal (query, key) pairs per rank, {seq_len} positions",
           bold=True)
    for k, layout in enumerate(layouts):
        x0 = 90 + 330 * k
        d.text(x0, 204, layout, anchor="start", size=SMALL, colour=MUTED)
        for rank, pairs in enumerate(work[layout]):
            y = 226 + 24 * rank
            d.text(x0 - 8, y, f"rank {rank}", anchor="end", size=SMALL)
            length = 200 * pairs / top
            d.rect(x0, y - 8, length, 16, fill=tint(RANKS[rank], 0.7), stroke=None)
            d.text(x0 + length + 6, y, str(pairs), anchor="start", size=SMALL)
    return d


@diagram(
    "ulysses_all_to_all",
    chapter="distributed",
    after="## DeepSpeed-Ulysses: from sequence shards to head shards",
    title="Ulysses' all-to-all: sequence shards to head shards",
    caption="""DeepSpeed-Ulysses on $W = 4$ ranks with $h = 8$ heads and $n = 16$
    positions; each cell is a slice of $q$, $k$ and $v$ coloured by the rank that
    holds it. Before, rank $r$ holds every head of its quarter of the sequence; one
    all-to-all gives it 2 heads over the whole sequence, an ordinary attention
    problem, and a second all-to-all returns the output to sequence shards.""",
    alt="""Two 4 by 4 grids, rows for position ranges 0-3, 4-7, 8-11 and 12-15 and
    columns for head pairs 0-1, 2-3, 4-5 and 6-7. Left grid, sequence shards (B, H,
    L/W, D): each row has one colour, the rank that holds those positions for all
    heads. Right grid, head shards (B, H/W, L, D): each column has one colour, the
    rank that holds those heads for all positions. An arrow to the right labelled
    all-to-all of q, k and v joins the grids, and an arrow back labelled all-to-all of
    the output returns. Under the right grid: each rank attends on its 2 heads over
    all 16 positions.""",
)
def ulysses_all_to_all() -> Drawing:
    world, cell = 4, 44
    d = Drawing(720, 330)
    grids = [(100, "sequence shards", "(B, H, L/W, D)", lambda i, j: i),
             (510, "head shards", "(B, H/W, L, D)", lambda i, j: j)]
    for x0, title, shape, rank_of in grids:
        d.text(x0 + 2 * cell, 22, title, bold=True)
        d.text(x0 + 2 * cell, 42, shape, size=SMALL, colour=MUTED)
        d.grid(x0, 80, [[tint(RANKS[rank_of(i, j)], LIGHT) for j in range(world)]
                        for i in range(world)], cell=cell, stroke="#ffffff", width=2,
               labels=[[str(rank_of(i, j)) for j in range(world)]
                       for i in range(world)], size=13)
        for j in range(world):
            d.text(x0 + (j + 0.5) * cell, 66, f"h {2 * j}–{2 * j + 1}", size=SMALL,
                   colour=MUTED)
        for i in range(world):
            d.text(x0 - 8, 80 + (i + 0.5) * cell, f"{4 * i}–{4 * i + 3}",
                   anchor="end", size=SMALL, colour=MUTED)
    d.text(92, 66, "positions", anchor="end", size=SMALL, colour=MUTED)
    d.arrow((300, 130), (450, 130), width=2)
    d.text(375, 114, "all-to-all: q, k, v", size=SMALL)
    d.arrow((450, 190), (300, 190), width=2)
    d.text(375, 208, "all-to-all: output", size=SMALL)
    d.lines(598, 286, ["each rank: attention on its 2 heads", "over all 16 positions"],
            size=SMALL, colour=MUTED)
    d.text(188, 276, "cell = the rank that holds it", size=SMALL, colour=MUTED)
    _legend(d, 100, 312)
    return d
