"""Diagrams of decoding and serving: the KV cache, its shapes and layouts, split-KV,
grouped and latent caches, attention sinks, speculative decoding and batching.

Patterns the package defines are computed with it: the causal and sliding masks with
:mod:`attnbook.masks`, the sharing of key/value heads with
:func:`attnbook.contract.expand_kv_heads`, and the cache sizes with
:func:`attnbook.serving.cache_bytes_per_token`.
"""

from __future__ import annotations

import torch

from attnbook import masks
from attnbook.contract import expand_kv_heads
from attnbook.serving import cache_bytes_per_token

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
    PURPLE,
    QUERY,
    RULE,
    SKY,
    SMALL,
    VALUE,
    VERMILLION,
    YELLOW,
    Drawing,
    tint,
)

LIGHT = 0.3
SUBSCRIPT = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")


def _legend(d: Drawing, x: float, y: float, entries, *, across: float = 0) -> None:
    """Colour swatches with labels: down from ``y``, or ``across`` pixels apart."""
    for k, (fill, label) in enumerate(entries):
        dx, dy = (across * k, 0) if across else (0, 22 * k)
        d.rect(x + dx, y + dy - 7, 14, 14, fill=fill or "#ffffff", stroke=RULE,
               width=0.8)
        d.text(x + dx + 22, y + dy, label, anchor="start", size=SMALL)


# --------------------------------------------------------------------------------------
# kv_cache.ipynb
# --------------------------------------------------------------------------------------
@diagram(
    "kv_cache_growth",
    chapter="kv_cache",
    after="## What decoding recomputes",
    title="The KV cache, step by step",
    caption="""One layer's cache over a generation: a buffer of $T_{\\max} = 8$ slots,
    allocated once. The prefill writes the prompt's keys (top half of a slot) and
    values (bottom half) at once; every decode step writes one more slot and its one
    query reads every slot written so far. Nothing already cached is ever
    recomputed.""",
    alt="""Five rows, one per step, each showing the same buffer of eight slots, a key
    cell above a value cell. Row 1, prefill of positions 0 to 2: slots 0 to 2 are
    written in full colour, and the three prompt queries attend causally. Rows 2 to 5,
    decode steps t = 3 to 6: the earlier slots are pale, the one new slot t is in full
    colour, and the note says query t reads t + 1 keys. The remaining slots are empty
    outlines.""",
)
def kv_cache_growth() -> Drawing:
    d = Drawing(620, 330)
    slots, cell, x0 = 8, 30, 160
    for s in range(slots):
        d.text(x0 + (s + 0.5) * cell, 30, str(s), size=SMALL, colour=MUTED)
    d.text(x0 - 10, 30, "slot", anchor="end", size=SMALL, colour=MUTED)
    steps = [("prefill 0–2", 0, 3, "3 prompt queries, causal"),
             ("decode t = 3", 3, 4, "q₃ reads 4 keys"),
             ("decode t = 4", 4, 5, "q₄ reads 5 keys"),
             ("decode t = 5", 5, 6, "q₅ reads 6 keys"),
             ("decode t = 6", 6, 7, "q₆ reads 7 keys")]
    for r, (label, new, filled, note) in enumerate(steps):
        y = 46 + 56 * r
        d.text(20, y + 18, label, anchor="start")

        def fill(s: int, colour: str) -> str | None:
            if s >= filled:
                return None
            return colour if s >= new else tint(colour, 0.35)

        labels = [[f"k{s}".translate(SUBSCRIPT) if s < filled else None
                   for s in range(slots)],
                  [f"v{s}".translate(SUBSCRIPT) if s < filled else None
                   for s in range(slots)]]
        d.grid(x0, y, [[fill(s, KEY) for s in range(slots)],
                       [fill(s, VALUE) for s in range(slots)]],
               cell=cell, cell_h=18, stroke="#ffffff", labels=labels, size=11.5)
        d.text(x0 + slots * cell + 16, y + 18, note, anchor="start", size=SMALL)
    _legend(d, x0, 322 - 8, [(ORANGE, "written this step"),
                             (tint(ORANGE, 0.35), "cached earlier")], across=170)
    return d


@diagram(
    "prefill_decode",
    chapter="kv_cache",
    after="## Prefill is compute-bound, decode is memory-bound",
    title="Prefill and decode",
    caption="""Prefill (left) multiplies all $T_0$ prompt queries by all their keys at
    once, a matrix–matrix product with the causal triangle of scores; decode (right)
    brings one query per step against a cache that grows by one key per step, a
    matrix–vector product that reads the whole cache to do little arithmetic with
    it.""",
    alt="""Left, prefill with a prompt of 8 tokens: an 8 by 3 query matrix Q beside an
    8 by 8 grid of scores whose lower triangle is filled, under a 3 by 8 transposed key
    matrix; the note says matrix times matrix, compute-bound. Right, decode: three
    rows for steps t = 8, 9 and 10, each a single query cell followed by a row of
    t + 1 key cells, the last one new and highlighted, so the row grows by one cell
    per step; the note says matrix times vector, memory-bound.""",
)
def prefill_decode() -> Drawing:
    d = Drawing(720, 310)
    t0, width, cell = 8, 3, 16
    d.text(170, 22, f"prefill: T₀ = {t0} prompt tokens at once", bold=True)
    kx, ky = 110, 50
    d.grid(kx, ky, [[tint(KEY, 0.45)] * t0] * width, cell=cell, stroke="#ffffff")
    d.text(kx - 8, ky + width * cell / 2, "Kᵀ", anchor="end")
    qx, qy = kx - width * cell - 8, ky + width * cell + 8
    d.grid(qx, qy, [[tint(QUERY, 0.45)] * width] * t0, cell=cell, stroke="#ffffff")
    d.text(qx - 8, qy + t0 * cell / 2, "Q", anchor="end")
    allowed = masks.dense(masks.causal(t0), t0, t0)[0, 0].tolist()
    d.grid(kx, qy, [[BLUE if a else None for a in row] for row in allowed], cell=cell,
           stroke="#ffffff")
    d.text(kx + t0 * cell / 2, qy + t0 * cell + 18, "T₀ × T₀ scores", size=SMALL)
    d.text(170, 286, "matrix × matrix: compute-bound", colour=MUTED)
    d.line((345, 40), (345, 296), colour=RULE)
    # decode: one query row per step against a growing cache
    d.text(535, 22, "decode: one new query per step", bold=True)
    for r, t in enumerate([8, 9, 10]):
        y = 70 + 62 * r
        d.text(372, y + 8, f"t = {t}", anchor="start", size=SMALL)
        d.grid(372, y + 20, [[tint(QUERY, 0.45)]], cell=cell)
        d.text(372 + cell + 12, y + 28, "·", size=18)
        fills = [tint(KEY, 0.45)] * t + [ORANGE]
        d.grid(410, y + 20, [fills], cell=cell, stroke="#ffffff")
        d.text(410 + (t + 1) * cell + 10, y + 28, f"1 × {t + 1}", anchor="start",
               size=SMALL)
    d.text(372, 50, "q · Kᵀ over the cache; the newest key in orange",
           anchor="start", size=SMALL, colour=MUTED)
    d.text(535, 286, "matrix × vector: memory-bound", colour=MUTED)
    return d


@diagram(
    "gqa_heads",
    chapter="kv_cache",
    after="## Multi-query and grouped-query attention",
    title="Multi-head, grouped-query and multi-query attention",
    caption="""Eight query heads and the key/value heads they read, grouped as
    `attnbook.contract.expand_kv_heads` repeats them: one each (MHA), one per group of
    $h / h_{kv} = 4$ (GQA), or one for all (MQA). The cache holds only the key/value
    heads, so it shrinks by $h / h_{kv}$.""",
    alt="""Three panels, each with a row of eight query heads above a row of
    key/value heads and lines from each query head to the key/value head it reads.
    MHA: eight key/value heads, one under each query head; the cache is full size.
    GQA with 2 key/value heads: query heads 1 to 4 share the first and 5 to 8 the
    second; the cache is divided by 4. MQA: all eight query heads share a single
    key/value head; the cache is divided by 8.""",
)
def gqa_heads() -> Drawing:
    h = 8
    d = Drawing(720, 240)
    d.text(20, 72, "query heads", anchor="start", size=SMALL, colour=MUTED)
    d.text(20, 162, "key/value heads", anchor="start", size=SMALL, colour=MUTED)
    for p, (title, kv) in enumerate([("MHA", 8), ("GQA, 2 groups", 2), ("MQA", 1)]):
        x0 = 130 + 200 * p
        d.text(x0 + 90, 26, title, bold=True)
        # which key/value head each query head reads, as the package repeats them
        heads = torch.arange(kv).view(kv, 1, 1)
        group = expand_kv_heads(heads, h).flatten().tolist()
        qs = [x0 + 23 * i + 9 for i in range(h)]
        centres = [sum(qs[i] for i in range(h) if group[i] == g) / (h // kv)
                   for g in range(kv)]
        for i, x in enumerate(qs):
            d.line((x, 84), (centres[group[i]], 150), colour=MUTED, width=1.2)
            d.rect(x - 9, 60, 18, 24, fill=tint(QUERY, 0.45), width=1, rx=2)
        for x in centres:
            d.rect(x - 9, 150, 18, 24, fill=tint(KEY, 0.6), width=1, rx=2)
        d.text(x0 + 90, 200, f"{kv} key/value head{'s' if kv > 1 else ''}",
               size=SMALL)
        shrink = "full size" if kv == h else f"÷ {h // kv}"
        d.text(x0 + 90, 220, f"cache: {shrink}", size=SMALL, colour=MUTED)
    return d


@diagram(
    "sliding_window_cache",
    chapter="kv_cache",
    after="## Sliding-window caches",
    title="A sliding-window cache as a ring buffer",
    caption="""A sliding-window cache of $w = 4$ slots: position $p$ goes to slot
    $p \\bmod w$, overwriting position $p - w$, which no later query needs. The memory
    stays at $w$ slots however long the generation; reading the slots in position
    order gives the window oldest first.""",
    alt="""Top, a row of ten positions, 0 to 9, each coloured by its slot p mod 4,
    so the four colours repeat. Below, the buffer of four slots after 4, 7 and 10
    positions: after 4 it holds 0, 1, 2, 3; after 7 it holds 4, 5, 6, 3, positions 4
    to 6 having overwritten 0 to 2; after 10 it holds 8, 9, 6, 7. The newest writes
    are outlined, and a note says the window is read in the order 6, 7, 8, 9.""",
)
def sliding_window_cache() -> Drawing:
    window, total = 4, 10
    colours = [tint(c, 0.45) for c in (BLUE, ORANGE, GREEN, PURPLE)]
    d = Drawing(600, 300)
    d.text(20, 40, "position p", anchor="start", size=SMALL, colour=MUTED)
    d.grid(130, 26, [[colours[p % window] for p in range(total)]], cell=40, cell_h=28,
           stroke="#ffffff", labels=[[str(p) for p in range(total)]], size=13)
    d.text(330, 74, "slot = p mod 4", size=SMALL, colour=MUTED)
    for s in range(window):
        d.text(230 + 48 * s + 24, 110, f"slot {s}", size=SMALL, colour=MUTED)
    for r, n in enumerate([4, 7, 10]):
        y = 124 + 46 * r
        held = {p % window: p for p in range(max(0, n - window), n)}
        d.text(20, y + 16, f"after {n} positions", anchor="start", size=SMALL)
        d.grid(230, y, [[colours[s] for s in range(window)]], cell=48, cell_h=32,
               stroke="#ffffff", labels=[[str(held[s]) for s in range(window)]],
               size=13)
        written = range(max(0, n - 3), n) if r else range(n)
        for p in written:
            d.rect(230 + 48 * (p % window) + 1.5, y + 1.5, 45, 29, stroke=INK,
                   width=2)
    d.text(430, 140, "outlined: written", anchor="start", size=SMALL, colour=MUTED)
    d.text(430, 158, "since the row above", anchor="start", size=SMALL, colour=MUTED)
    d.text(300, 280, "read in position order: 6, 7, 8, 9 (slots 2, 3, 0, 1)",
           size=SMALL)
    return d


@diagram(
    "paged_block_table",
    chapter="kv_cache",
    after="## Paged attention",
    title="A paged KV cache and its block tables",
    caption="""Paged attention with blocks of 4 positions: each sequence's block table
    maps its logical blocks to physical blocks anywhere in the pool, and only a
    sequence's last block can have empty slots. Here two sequences share the block of
    a common prompt, as vLLM does with copy-on-write; the book's `PagedKVCache` gives
    every sequence its own blocks.""",
    alt="""Top, two sequences of words in logical blocks of four. Sequence A: the cat
    sat on, then a mat and then, then slept. Sequence B: the cat sat on, then the
    sofa. Their first block, the shared prompt, is purple. Middle, block tables: A
    maps to physical blocks 5, 1 and 6, B to 5 and 3. Arrows lead from the table
    entries to a pool of eight physical blocks of four slots: block 5 is full and
    shared, block 1 is full with A's words, block 6 holds one of A's words and three
    empty slots, block 3 holds two of B's words and two empty slots, and blocks 0, 2,
    4 and 7 are free.""",
)
def paged_block_table() -> Drawing:
    size = 4
    shared = ["the", "cat", "sat", "on"]
    seqs = {"A": shared + ["a", "mat", "and", "then", "slept"],
            "B": shared + ["the", "sofa"]}
    tables = {"A": [5, 1, 6], "B": [5, 3]}
    colour = {"A": tint(BLUE, 0.4), "B": tint(ORANGE, 0.45), "both": tint(PURPLE, 0.5)}
    d = Drawing(720, 400)
    cell = 44
    owner = {}  # physical block -> (who, used slots)
    for r, (name, words) in enumerate(seqs.items()):
        y = 40 + 46 * r
        d.text(20, y + 13, f"sequence {name}", anchor="start")
        for b, phys in enumerate(tables[name]):
            chunk = words[b * size : (b + 1) * size]
            who = "both" if phys == tables["A"][0] else name
            owner[phys] = (who, len(chunk))
            x = 130 + b * (size * cell + 12)
            fills = [colour[who]] * len(chunk) + [None] * (size - len(chunk))
            d.grid(x, y, [fills], cell=cell, cell_h=26, stroke="#ffffff",
                   labels=[chunk + [None] * (size - len(chunk))])
            if r == 0:
                d.text(x + size * cell / 2, 24, f"logical block {b}", size=SMALL,
                       colour=MUTED)
    # the block tables
    pool_x, pool_y, slot = 40, 290, 18
    for k, (name, table) in enumerate(tables.items()):
        x = 130 + 300 * k
        d.text(x - 10, 180, f"table {name}", anchor="end", size=SMALL)
        d.grid(x, 166, [[colour[owner[p][0]] for p in table]], cell=32, cell_h=28,
               stroke="#ffffff", labels=[[str(p) for p in table]], size=13)
        for b, phys in enumerate(table):
            d.arrow((x + 32 * b + 16, 194),
                    (pool_x + 84 * phys + 2 * slot, pool_y - 4), colour=MUTED,
                    width=1.2, head=7)
    # the pool of physical blocks
    for phys in range(8):
        x = pool_x + 84 * phys
        who, used = owner.get(phys, (None, 0))
        fills = [colour[who] if s < used else None for s in range(size)]
        d.grid(x, pool_y, [fills], cell=slot, cell_h=26, stroke="#ffffff")
        d.rect(x, pool_y, size * slot, 26, stroke=INK, width=1.2)
        d.text(x + 2 * slot, pool_y + 42, str(phys), size=SMALL)
    d.text(20, pool_y + 42, "block", anchor="start", size=SMALL, colour=MUTED)
    _legend(d, 130, 378, [(colour["A"], "A only"), (colour["B"], "B only"),
                          (colour["both"], "shared prompt"), (None, "free")],
            across=140)
    return d


@diagram(
    "split_kv",
    chapter="kv_cache",
    after="## Split-KV decoding",
    title="Split-KV decoding merges partial results",
    caption="""Flash-decoding for one query over a cache of 16 slots in 4 splits, with
    `cache_seqlens = 11`: each split is a separate program that writes its own
    normalized output $o_s$ and log-sum-exp $\\mathrm{lse}_s$, and the merge weights
    them by their share of the softmax denominator. A split past the sequence's length
    is empty, $\\mathrm{lse} = -\\infty$, and gets weight 0.""",
    alt="""Top, a query box q beside a cache of 16 slots cut into four splits of four.
    Slots 0 to 10 hold valid keys; slots 11 to 15, past cache_seqlens = 11, are grey
    and masked, so split 3 is entirely masked. Under each of splits 0 to 2 an arrow
    leads to a box with its partial output o_s and log-sum-exp lse_s, computed by its
    own program; split 3's box says empty, lse = minus infinity. All four boxes feed a
    merge box: M is the largest lse, each split is weighted by exp(lse_s - M) over the
    sum of those, and o is the weighted sum of the o_s. An arrow leads to the output
    o.""",
)
def split_kv() -> Drawing:
    slots, splits, length, cell = 16, 4, 11, 26
    per = slots // splits
    d = Drawing(720, 330)
    q = d.box(20, 46, 60, 30, "q", fill=tint(QUERY, 0.45))
    d.text(50, 100, "one query", size=SMALL, colour=MUTED)
    partials = []
    for s in range(splits):
        x = 120 + s * (per * cell + 40)
        d.text(x + per * cell / 2, 28, f"split {s}", bold=True)
        positions = range(s * per, (s + 1) * per)
        fills = [[tint(KEY, 0.45) if p < length else tint(GREY, 0.35)
                  for p in positions]]
        d.grid(x, 48, fills, cell=cell, stroke="#ffffff",
               labels=[[str(p) for p in positions]])
        empty = s * per >= length
        label = ["empty", "lse₃ = −∞"] if empty else [
            f"o{s}, lse{s}".translate(SUBSCRIPT), f"program {s}"]
        box = d.box(x, 120, per * cell, 50, label,
                    fill=tint(GREY, 0.3) if empty else tint(OUTPUT, LIGHT),
                    size=SMALL)
        d.arrow((box.cx, 74), box.top_mid)
        partials.append(box)
    d.arrow(q.right_mid, (120, 61))
    merge = d.box(120, 220, 524, 62,
                  ["M = maxₛ lseₛ,  wₛ = exp(lseₛ − M) / Σₛ′ exp(lseₛ′ − M)",
                   "o = Σₛ wₛ oₛ   (the empty split: weight 0)"],
                  fill=tint(SKY, LIGHT))
    for box in partials:
        d.arrow(box.bottom_mid, (box.cx, merge.y))
    out = d.box(664, 232, 40, 38, "o", fill=tint(OUTPUT, 0.5))
    d.arrow(merge.right_mid, out.left_mid, head=7)
    d.text(382, 306, f"slots ≥ cache_seqlens = {length} are masked (grey)",
           size=SMALL, colour=MUTED)
    return d


# --------------------------------------------------------------------------------------
# serving.ipynb
# --------------------------------------------------------------------------------------
@diagram(
    "mla_latent_cache",
    chapter="serving",
    after="## Multi-head latent attention",
    title="Multi-head latent attention caches a small latent",
    caption="""Multi-head latent attention with DeepSeek-V2's sizes (128 heads of 128,
    $d_c = 512$, $d_R = 64$): each token caches one latent $c^{KV}$ and one shared
    rotated key $k^R$. Every head's keys and values are up-projections of the latent,
    never cached: at decode time the up-projections are absorbed into the query and
    the output projection. The bars compare the cache per token and layer, from
    `attnbook.serving.cache_bytes_per_token`.""",
    alt="""A token x feeds two paths. Upper path: the down-projection W DKV gives the
    latent c KV of 512 numbers. Lower path: W KR and RoPE give the rotated key k R of
    64 numbers, shared by all heads. Both sit inside a dashed box labelled the cache:
    576 numbers per token and layer. Dashed arrows lead from the latent to stacks of
    per-head keys k C_h = W UK_h c KV and values v_h = W UV_h c KV for 128 heads,
    marked never cached and absorbed at decode. At the bottom two bars compare the
    cache per token and layer: multi-head attention 32,768 numbers, a long bar, and
    MLA 576 numbers, a bar 57 times shorter.""",
)
def mla_latent_cache() -> Drawing:
    heads, head_dim, latent, rope = 128, 128, 512, 64
    per = {"mha": cache_bytes_per_token("mha", n_layers=1, n_heads=heads,
                                        head_dim=head_dim, bytes_per_elem=1),
           "mla": cache_bytes_per_token("mla", n_layers=1, n_heads=heads,
                                        head_dim=head_dim, kv_latent_dim=latent,
                                        rope_dim=rope, bytes_per_elem=1)}
    d = Drawing(720, 350)
    x = d.box(20, 110, 46, 40, "x", fill=tint(SKY, LIGHT))
    down = d.box(104, 52, 92, 36, "Wᴰᴷⱽ")
    rot = d.box(104, 172, 92, 36, "Wᴷᴿ, RoPE")
    d.arrow(x.right_mid, (84, 130), (84, down.cy), down.left_mid)
    d.arrow((84, 130), (84, rot.cy), rot.left_mid)
    d.rect(222, 30, 156, 196, stroke=HIGHLIGHT, width=2, dash="6 4", rx=8)
    c = d.box(236, 46, 128, 48, ["cᴷⱽ", f"{latent} numbers"], fill=tint(YELLOW, 0.6))
    k = d.box(236, 166, 128, 48, ["kᴿ, all heads", f"{rope} numbers"],
              fill=tint(YELLOW, 0.6))
    d.arrow(down.right_mid, c.left_mid)
    d.arrow(rot.right_mid, k.left_mid)
    d.text(300, 244, f"the cache: {per['mla']} per token", bold=True,
           colour=HIGHLIGHT)
    # the per-head keys and values, rebuilt from the latent and never cached
    for y, label in [(34, "keys kᶜₕ = Wᵁᴷₕ cᴷⱽ"), (104, "values vₕ = Wᵁⱽₕ cᴷⱽ")]:
        for shadow in (2, 1):
            d.rect(470 + 5 * shadow, y + 5 * shadow, 210, 40, fill="#ffffff",
                   stroke=MUTED, width=1, rx=5)
        box = d.box(470, y, 210, 40, label, fill=tint(KEY if y < 100 else VALUE,
                                                       LIGHT))
        d.arrow(c.right_mid, box.left_mid, dash="5 4", colour=MUTED)
    d.lines(580, 186, [f"{heads} heads of {head_dim}: never cached,",
                       "absorbed into the query and the",
                       "output projection at decode"], size=SMALL, colour=MUTED)
    # the cache per token and layer, to scale
    full = 560
    for r, (name, key) in enumerate([("MHA", "mha"), ("MLA", "mla")]):
        y = 284 + 30 * r
        d.text(20, y, name, anchor="start", bold=True)
        length = full * per[key] / per["mha"]
        d.rect(70, y - 9, length, 18, fill=BLUE if key == "mha" else HIGHLIGHT,
               stroke=None)
        label = f"{per[key]:,} numbers per token and layer"
        if key == "mha":  # inside its long bar
            d.text(70 + length - 8, y, label, anchor="end", size=SMALL,
                   colour="#ffffff")
        else:
            d.text(70 + length + 8, y, label, anchor="start", size=SMALL)
    return d


@diagram(
    "sinks_window",
    chapter="serving",
    after="## Attention sinks: reading past the training length",
    title="A sliding window with attention sinks",
    caption="""Which keys each query sees with a window of the last 4 positions
    (left) and with StreamingLLM's 4 sinks plus that window (right), from the
    predicates of `attnbook.masks`. The sinks keep the first tokens, where trained
    models park attention, in the cache forever; positions are numbered by place in
    the cache, so RoPE never meets a distance longer than the cache.""",
    alt="""Two 16 by 16 grids of queries by keys. Left, a causal window of 4: a blue
    band along the diagonal, four keys wide. Right, the same band plus the first four
    key columns filled purple under the diagonal: every query also sees the four sink
    tokens. To the right, the cache of the last query: eight slots holding positions
    0, 1, 2, 3 (the sinks) and 12, 13, 14, 15 (the window), and under them the
    positions RoPE uses, 0 to 7, their places in the cache.""",
)
def sinks_window() -> Drawing:
    n, sinks, window, cell = 16, 4, 4, 12
    recent = masks.sliding_window(window - 1, is_causal=True)
    causal = masks.causal(n)

    def sink(b, h, q_idx, kv_idx):
        return (kv_idx < sinks) & causal(b, h, q_idx, kv_idx)

    d = Drawing(720, 300)
    near = masks.dense(recent, n, n)[0, 0].tolist()
    early = masks.dense(sink, n, n)[0, 0].tolist()
    for p, (title, with_sinks) in enumerate([("window of 4", False),
                                             ("4 sinks + window of 4", True)]):
        x0 = 40 + 240 * p
        d.text(x0 + n * cell / 2, 22, title, bold=True)
        fills = [[BLUE if near[i][j] else
                  PURPLE if with_sinks and early[i][j] else None for j in range(n)]
                 for i in range(n)]
        d.grid(x0, 42, fills, cell=cell, stroke="#ffffff", width=0.8)
        d.text(x0 + n * cell / 2, 42 + n * cell + 16, "keys →", size=SMALL,
               colour=MUTED)
        d.text(x0 - 8, 42 + 6, "q", anchor="end", size=SMALL, colour=MUTED)
    _legend(d, 40, 282, [(BLUE, "recent window"), (PURPLE, "sinks")], across=150)
    # the cache of the last query, and the positions RoPE sees
    held = list(range(sinks)) + list(range(n - window, n))
    x0 = 508
    d.text(x0 + 4 * 25, 60, "the cache, last step", bold=True)
    colours = [PURPLE] * sinks + [BLUE] * window
    d.grid(x0, 96, [[tint(c, 0.35) for c in colours]], cell=25, cell_h=28,
           stroke="#ffffff", labels=[[str(p) for p in held]], size=SMALL)
    d.grid(x0, 148, [[tint(GREY, 0.25)] * len(held)], cell=25, cell_h=28,
           stroke="#ffffff", labels=[[str(s) for s in range(len(held))]],
           size=SMALL)
    d.text(x0 + 100, 84, "position in the text", size=SMALL, colour=MUTED)
    d.text(x0 + 100, 136, "position RoPE uses", size=SMALL, colour=MUTED)
    d.lines(x0 + 100, 212, ["memory: 8 slots,", "however long the stream"],
            size=SMALL, colour=MUTED)
    return d


@diagram(
    "speculative_round",
    chapter="serving",
    after="## Speculative decoding",
    title="One round of speculative decoding",
    caption="""One round with $k = 4$: the small draft proposes four tokens one by
    one, the target scores all of them in one pass, and each draft token is accepted
    with probability $\\min(1, p(x_i) / q(x_i))$. At the first rejection the target
    draws its own token from the residual $\\max(0, p - q)$ and the rest is discarded:
    three tokens for one target pass here, and five if all four had been accepted.""",
    alt="""Three rows. Draft: after the prefix the cat sat, the draft model proposes
    on, the, mat, and, one step at a time. Target: one box spans the four drafts and
    a fifth position, with verdicts below: on accepted, the accepted, mat rejected,
    and dropped, and the fifth position a bonus used only if all four are accepted.
    Emitted: the cat sat, then on and the, accepted, and sofa, the target's
    correction drawn from max(0, p - q).""",
)
def speculative_round() -> Drawing:
    prefix, draft = ["the", "cat", "sat"], ["on", "the", "mat", "and"]
    d = Drawing(720, 330)
    cell, x0 = 60, 150
    xs = [x0 + cell * i for i in range(len(prefix) + len(draft) + 1)]
    grey, drafted = tint(GREY, 0.3), tint(ORANGE, 0.45)
    rows = [(50, "draft model", "proposes k = 4"),
            (150, "target model", "one pass, all 4"),
            (262, "emitted", "this round")]
    for y, name, note in rows:
        d.lines(20, y + 14, [name, note], anchor="start", size=SMALL)
    d.grid(x0, 50, [[grey] * 3 + [drafted] * 4], cell=cell, cell_h=28,
           stroke="#ffffff", labels=[prefix + draft], size=13)
    for i in range(len(draft)):
        d.text(xs[3 + i] + cell / 2, 36, f"step {i + 1}", size=SMALL, colour=MUTED)
    target = d.box(xs[3], 112, 5 * cell, 28, "target scores 4 drafts + 1",
                   fill=tint(BLUE, LIGHT), size=SMALL, rx=3)
    d.arrow((target.cx, 80), (target.cx, target.y), head=7)
    verdicts = [("✓ on", GREEN), ("✓ the", GREEN), ("✗ mat", VERMILLION),
                ("dropped", MUTED), ("(bonus)", MUTED)]
    for i, (text, colour) in enumerate(verdicts):
        x = xs[3 + i]
        d.rect(x + 2, 150, cell - 4, 28, fill="#ffffff", stroke=colour, width=1.5,
               dash="4 3" if i >= 3 else None, rx=3)
        d.text(x + cell / 2, 164, text, size=SMALL, colour=INK if i < 3 else MUTED)
    d.text(x0, 206, "accept xᵢ with probability min(1, p(xᵢ) / q(xᵢ))",
           anchor="start", size=SMALL)
    accepted, correction = tint(GREEN, 0.4), tint(SKY, 0.6)
    d.grid(x0, 262, [[grey] * 3 + [accepted] * 2 + [correction]], cell=cell,
           cell_h=28, stroke="#ffffff", labels=[prefix + ["on", "the", "sofa"]],
           size=13)
    d.lines(xs[5] + cell / 2, 310, ["correction, drawn", "from max(0, p − q)"],
            size=SMALL, colour=MUTED)
    d.arrow((xs[5] + cell / 2, 180), (xs[5] + cell / 2, 262), colour=MUTED, head=7)
    return d


def _schedule(lengths: list[int], slots: int, static: bool) -> list[tuple]:
    """``(request, slot, start, length)`` for requests served in order, ``slots`` at
    a time: static batches wait for their longest member; continuous batching gives a
    freed slot to the next request at the next step."""
    placed, free_at = [], [0] * slots
    for start in range(0, len(lengths), slots if static else 1):
        batch = range(start, min(start + slots, len(lengths))) if static else [start]
        if static:
            begin = max(free_at)
            for s, r in enumerate(batch):
                placed.append((r, s, begin, lengths[r]))
            free_at = [begin + max(lengths[r] for r in batch)] * slots
        else:
            s = min(range(slots), key=lambda k: (free_at[k], k))
            placed.append((start, s, free_at[s], lengths[start]))
            free_at[s] += lengths[start]
    return placed


@diagram(
    "continuous_batching",
    chapter="serving",
    after="## Continuous batching over the paged cache",
    title="Static and continuous batching as timelines",
    caption="""Eight waiting requests with answers of 3, 7, 2, 5, 4, 6, 3 and 2 tokens
    on a server with 4 slots, one column per decode step. Static batching (top) holds
    a finished request's slot idle (dashed) until the longest member of its batch is
    done; continuous batching (bottom) gives the slot to the next request at the next
    step, and the same work takes 9 steps instead of 13.""",
    alt="""Two timelines of four slots by decode steps. Top, static batching:
    requests R1 to R4 start together at step 0 and the batch runs 7 steps, until R2,
    the longest, finishes; the slots of R1, R3 and R4 stand idle, dashed, after they
    finish. Then R5 to R8 run for 6 steps, with the same idle tails: 13 steps, 32 of
    52 slot-steps busy. Bottom, continuous batching: as soon as a request finishes, the
    next one starts in its slot at the following step, R5 after R3, R6 after R1, R7
    after R4 and R8 after R5: 9 steps, 32 of 36 slot-steps busy.""",
)
def continuous_batching() -> Drawing:
    lengths, slots = [3, 7, 2, 5, 4, 6, 3, 2], 4
    palette = [BLUE, ORANGE, GREEN, PURPLE, SKY, VERMILLION, YELLOW, GREY]
    d = Drawing(720, 330)
    cell, row, x0 = 26, 24, 130
    steps = max(s + n for _, _, s, n in _schedule(lengths, slots, True))
    for t in range(steps):
        d.text(x0 + (t + 0.5) * cell, 50, str(t), size=SMALL, colour=MUTED)
    d.text(x0 - 10, 50, "step", anchor="end", size=SMALL, colour=MUTED)
    for p, (title, static) in enumerate([("static batching", True),
                                         ("continuous batching", False)]):
        y0 = 66 + 134 * p
        d.text(x0, y0 - 40 if p == 0 else y0 - 16, title, anchor="start", bold=True)
        placed = _schedule(lengths, slots, static)
        end = max(s + n for _, _, s, n in placed)
        for s in range(slots):
            d.text(x0 - 10, y0 + (s + 0.5) * row, f"slot {s + 1}", anchor="end",
                   size=SMALL, colour=MUTED)
            d.rect(x0 + 1, y0 + s * row + 1, end * cell - 2, row - 2,
                   fill="#ffffff", stroke=GREY, width=1, dash="3 3")
        for r, s, start, n in placed:
            d.box(x0 + start * cell + 1, y0 + s * row + 1, n * cell - 2, row - 2,
                  f"R{r + 1}", fill=tint(palette[r], 0.45), stroke=None, rx=3,
                  size=SMALL)
        busy = sum(lengths)
        d.lines(x0 + steps * cell + 24, y0 + 2 * row,
                [f"{end} steps", f"{busy} of {end * slots} slot-steps busy"],
                anchor="start", size=SMALL)
    d.rect(x0, 307, 14, 14, fill="#ffffff", stroke=GREY, width=1, dash="3 3")
    d.text(x0 + 22, 314, "slot idle", anchor="start", size=SMALL)
    return d
