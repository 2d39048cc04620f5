"""Diagrams of the first chapters: attention itself, the Transformer block, positions,
linear attention, and attention in recurrent, vision and graph models.

Where a picture shows numbers or a pattern the package computes (the masks, ALiBi's
slopes and biases, the soft lookup of the attention chapter), the drawing computes them
with the package or with the chapter's own formula, so the picture stays exact.
"""

from __future__ import annotations

import math
from fractions import Fraction

from attnbook import masks
from attnbook.positional import alibi_bias, alibi_slopes

from .catalog import diagram
from .svg import (
    BLUE,
    GREEN,
    GREY,
    HIGHLIGHT,
    INK,
    KEY,
    LARGE,
    MUTED,
    ORANGE,
    OUTPUT,
    PURPLE,
    QUERY,
    RULE,
    SKY,
    SMALL,
    STATE,
    VALUE,
    YELLOW,
    Box,
    Drawing,
    tint,
)

LIGHT = 0.3  # the tint of a filled box that carries text


def _towards(a: tuple[float, float], b: tuple[float, float], r: float):
    """The point ``r`` short of ``b`` on the segment from ``a`` to ``b``."""
    dx, dy = b[0] - a[0], b[1] - a[1]
    length = math.hypot(dx, dy)
    return b[0] - dx / length * r, b[1] - dy / length * r


def _sum_node(d: Drawing, cx: float, cy: float, r: float = 15) -> Box:
    box = d.circle(cx, cy, r, fill=tint(OUTPUT, LIGHT))
    d.text(cx, cy, "Σ", size=LARGE)
    return box


# --------------------------------------------------------------------------------------
# attention.ipynb
# --------------------------------------------------------------------------------------
@diagram(
    "seq2seq_attention",
    chapter="attention",
    after="## The sequence-to-sequence bottleneck",
    title="An encoder-decoder with attention",
    caption="""Bahdanau's decoder at output step $i$: the previous state $s_{i-1}$
    scores every encoder state $h_j$, the softmax turns the scores into weights
    $\\alpha_{ij}$ (the thickness of each line), and the context
    $c_i = \\sum_j \\alpha_{ij} h_j$ feeds the next state $s_i$. Look at how every
    encoder state reaches the decoder directly, instead of through one final
    vector.""",
    alt="""Four source tokens x1 to x4 enter four encoder boxes h1 to h4, joined by
    arrows in both directions. A line runs from each encoder box to a summation node;
    the lines are labelled with weights 0.10, 0.15, 0.60 and 0.15 and drawn thicker
    for larger weights. The summation node sends the context vector c_i up into the
    decoder state s_i, which follows the previous decoder state s_i-1, takes the
    previous output y_i-1 and emits y_i. A dashed arrow from s_i-1 to the lines marks
    it as the query that scores every h_j. Three formulas at the top left give the
    score, the softmax and the weighted sum.""",
)
def seq2seq_attention() -> Drawing:
    d = Drawing(720, 370)
    weights = [0.10, 0.15, 0.60, 0.15]
    xs = [150, 260, 370, 480]
    node = (610, 185)
    d.lines(20, 62, ["eᵢⱼ = score(sᵢ₋₁, hⱼ)", "αᵢⱼ = softmaxⱼ(eᵢⱼ)",
                     "cᵢ = Σⱼ αᵢⱼ hⱼ"], anchor="start", leading=1.6)
    # the encoder
    d.text(20, 287, "encoder", anchor="start", colour=MUTED)
    for j, (x, w) in enumerate(zip(xs, weights), start=1):
        h = d.box(x - 32, 270, 64, 34, f"h{'₁₂₃₄'[j - 1]}", fill=tint(STATE, LIGHT))
        d.text(x, 350, f"x{'₁₂₃₄'[j - 1]}")
        d.arrow((x, 338), h.bottom_mid)
        # the weighted line to the sum, thicker for a larger weight
        d.line(h.top_mid, _towards(h.top_mid, node, 16), colour=ORANGE,
               width=1 + 8 * w)
        t = 0.2
        px, py = x + t * (node[0] - x), 270 + t * (node[1] - 270)
        d.box(px - 22, py - 10, 44, 20, f"{w:.2f}", size=SMALL, rx=9,
              stroke=ORANGE)
    for a, b in zip(xs, xs[1:]):
        d.arrow((a + 34, 281), (b - 34, 281), head=7)
        d.arrow((b - 34, 293), (a + 34, 293), head=7)
    # the decoder
    _sum_node(d, *node)
    prev = d.box(432, 50, 76, 34, "sᵢ₋₁", fill=tint(QUERY, LIGHT))
    cur = d.box(572, 50, 76, 34, "sᵢ", fill=tint(QUERY, LIGHT))
    d.text(420, 67, "decoder", anchor="end", colour=MUTED)
    d.arrow(prev.right_mid, cur.left_mid)
    d.arrow((node[0], node[1] - 15), cur.bottom_mid)
    d.text(node[0] + 10, 128, "cᵢ", anchor="start")
    d.text(610, 12, "yᵢ₋₁", size=SMALL)
    d.arrow((610, 22), cur.top_mid, head=7)
    d.arrow(cur.right_mid, (690, 67))
    d.text(704, 67, "yᵢ")
    d.text(20, 252, "weights αᵢⱼ", anchor="start", colour=MUTED)
    d.arrow(prev.bottom_mid, (470, 228), dash="5 4", colour=MUTED)
    d.text(460, 150, "query sᵢ₋₁", anchor="end", size=SMALL, colour=MUTED)
    return d


@diagram(
    "qkv_lookup",
    chapter="attention",
    after="## Attention as a soft dictionary lookup",
    title="Attention as a soft dictionary lookup",
    caption="""The chapter's tiny lookup: the query $q = (1.0, 0.2)$ is scored against
    every key, the softmax turns the scores into weights, and the answer is the
    weighted average of all the values. Compare the soft answer with the hard lookup
    below it, which returns only the best key's value.""",
    alt="""A query box q = (1.0, 0.2) on the left sends arrows to four keys: apple
    (2.0, 0.0), pear (1.5, 1.0), plum (0.0, 2.0) and lemon (-1.0, 1.0). Beside each
    key are its score (2.00, 1.70, 0.40, -0.80), a bar for its softmax weight (0.50,
    0.37, 0.10, 0.03) and its value ((10, 0), (8, 2), (0, 10), (-5, 5)). An arrow
    from the values leads to the context vector c = (7.80, 1.90), beside the hard
    lookup's answer (10, 0).""",
)
def qkv_lookup() -> Drawing:
    names = ["apple", "pear", "plum", "lemon"]
    keys = [(2.0, 0.0), (1.5, 1.0), (0.0, 2.0), (-1.0, 1.0)]
    values = [(10, 0), (8, 2), (0, 10), (-5, 5)]
    q = (1.0, 0.2)
    scores = [q[0] * k[0] + q[1] * k[1] for k in keys]
    total = sum(math.exp(s) for s in scores)
    weights = [math.exp(s) / total for s in scores]
    context = [sum(w * v[i] for w, v in zip(weights, values)) for i in range(2)]

    d = Drawing(720, 300)
    for x, head in [(250, "key kⱼ"), (372, "q·kⱼ"), (470, "weight αⱼ"),
                    (615, "value vⱼ")]:
        d.text(x, 28, head, bold=True)
    query = d.box(20, 114, 110, 56, ["query q", "(1.0, 0.2)"], fill=tint(QUERY, LIGHT))
    for i, (name, k, s, w, v) in enumerate(zip(names, keys, scores, weights, values)):
        y = 70 + 48 * i
        key = d.box(170, y - 18, 160, 36, f"{name}  ({k[0]:.1f}, {k[1]:.1f})",
                    fill=tint(KEY, LIGHT))
        d.arrow(query.right_mid, key.left_mid, head=7)
        d.text(372, y, f"{s:.2f}")
        d.rect(415, y - 9, 120 * w, 18, fill=ORANGE, stroke=None)
        d.text(415 + 120 * w + 6, y, f"{w:.2f}", anchor="start")
        d.text(541, y, "×", colour=MUTED)
        d.box(560, y - 18, 110, 36, f"({v[0]}, {v[1]})", fill=tint(VALUE, LIGHT))
    out = d.box(440, 252, 260, 36, f"c = Σⱼ αⱼ vⱼ = ({context[0]:.2f}, "
                f"{context[1]:.2f})", fill=tint(OUTPUT, LIGHT))
    d.arrow((615, 232), (615, out.y))
    best = values[scores.index(max(scores))]
    d.text(20, 270, f"hard lookup (best key only): ({best[0]}, {best[1]})",
           anchor="start", colour=MUTED)
    return d


@diagram(
    "sdpa_dataflow",
    chapter="attention",
    after="## Why divide by $\\sqrt{d_k}$?",
    title="Scaled dot-product attention as a data flow",
    caption="""Scaled dot-product attention, one operation per box, with the shape of
    what flows between them: $L$ queries, $S$ keys, key width $d_k$ and value width
    $d_v$. Only the last product brings in $V$; everything before it works on the
    $L \\times S$ scores.""",
    alt="""A vertical flow chart. Q of shape L by d_k and K of shape S by d_k enter a
    box Q K transposed, which outputs L by S scores. They pass through a box that
    scales by one over the square root of d_k, a box that sets masked entries to minus
    infinity, and a softmax applied to each row, all of shape L by S. The weights P
    then meet V, of shape S by d_v, in the product P V, which gives the output O of
    shape L by d_v. Notes on the left say what each step does.""",
)
def sdpa_dataflow() -> Drawing:
    d = Drawing(520, 580)
    q = d.box(120, 20, 110, 48, ["Q", "L × dₖ"], fill=tint(QUERY, LIGHT))
    k = d.box(290, 20, 110, 48, ["K", "S × dₖ"], fill=tint(KEY, LIGHT))
    steps = [
        (100, 40, ["Q Kᵀ"], "one score per pair", None),
        (180, 40, ["scale by 1/√dₖ"], "variance ≈ 1 at init", None),
        (260, 52, ["mask (optional)", "not allowed → −∞"], "True = may attend",
         tint(GREY, LIGHT)),
        (352, 40, ["softmax per row"], "each row sums to 1", None),
        (432, 40, ["P V"], "weighted sum of values", None),
    ]
    flows = ["L × S  scores", "L × S", "L × S", "L × S  weights P", "L × dᵥ"]
    boxes = []
    for y, h, label, note, fill in steps:
        boxes.append(d.box(180, y, 160, h, label, fill=fill or "#ffffff"))
        d.text(168, y + h / 2, note, anchor="end", size=SMALL, colour=MUTED)
    d.arrow(q.bottom_mid, (235, 100))
    d.arrow(k.bottom_mid, (285, 100))
    out = d.box(205, 512, 110, 48, ["O", "L × dᵥ"], fill=tint(OUTPUT, LIGHT))
    for a, b, flow in zip(boxes, boxes[1:] + [out], flows):
        d.arrow(a.bottom_mid, b.top_mid)
        d.text(272, (a.bottom + b.y) / 2, flow, anchor="start", size=SMALL)
    v = d.box(395, 428, 110, 48, ["V", "S × dᵥ"], fill=tint(VALUE, LIGHT))
    d.arrow(v.left_mid, (340, 452))
    return d


@diagram(
    "self_cross_attention",
    chapter="attention",
    after="## Self-attention and cross-attention",
    title="Self-attention and cross-attention",
    caption="""Where $Q$, $K$ and $V$ come from. In self-attention all three are
    projections of the same sequence $X$; in cross-attention the queries come from the
    decoder's $X$ and the keys and values from the encoder's output $C$, so the
    weights are $L \\times S$.""",
    alt="""Two panels. Left, self-attention: one sequence X of L tokens feeds three
    arrows to Q, K and V, and the weights are L by L. Right, cross-attention: the
    decoder sequence X of L tokens feeds Q, and the encoder output C of S tokens feeds
    K and V; the weights are L by S.""",
)
def self_cross_attention() -> Drawing:
    d = Drawing(640, 220)
    for x0, title, sources, weights in [
        (20, "self-attention: C = X", [(["X", "L tokens"], 0, 3)], "weights L × L"),
        (340, "cross-attention",
         [(["decoder X", "L tokens"], 0, 1), (["encoder C", "S tokens"], 1, 3)],
         "weights L × S"),
    ]:
        d.text(x0 + 140, 20, title, bold=True)
        targets = [
            d.box(x0 + 8 + 100 * i, 140, 84, 36, name, fill=tint(colour, LIGHT))
            for i, (name, colour) in enumerate([("Q", QUERY), ("K", KEY),
                                                ("V", VALUE)])
        ]
        for name, first, stop in sources:
            group = targets[first:stop]
            left, right = group[0].x, group[-1].right
            src = d.box(left, 46, right - left, 44, name, fill=tint(STATE, LIGHT))
            for t in group:
                d.arrow((t.cx, src.bottom), t.top_mid)
        d.text(x0 + 140, 195, weights, colour=MUTED)
    d.line((320, 40), (320, 200), colour=RULE)
    return d


@diagram(
    "multi_head_attention",
    chapter="attention",
    after="## Multi-head attention",
    title="Multi-head attention",
    caption="""Multi-head attention with $h = 4$: one projection each for $Q$, $K$ and
    $V$, whose width $d$ is split into $h$ heads of $d_k = d / h$; each
    head attends on its own slice, and the heads' outputs are concatenated back to
    width $d$ and mixed by the output projection $W_o$. The colour of a slice follows
    it to its head.""",
    alt="""A flow from top to bottom. The input X of shape L by d feeds three linear
    projections to Q, K and V. Each result is drawn as a bar cut into four coloured
    slices, Q1 to Q4, K1 to K4 and V1 to V4. A note says the width d is split into
    h = 4 heads of d / h. Four head boxes, one per colour, each run attention on their
    own Q, K and V slices. Their outputs are concatenated into one bar of four slices
    of width d, which passes through the output projection W o to the result MHA(X),
    of shape L by d.""",
)
def multi_head_attention() -> Drawing:
    colours = [SKY, ORANGE, GREEN, PURPLE]
    d = Drawing(600, 510)
    x = d.box(200, 16, 200, 40, "X   (L × d)", fill=tint(STATE, LIGHT))
    for i, name in enumerate("QKV"):
        proj = d.box(40 + 180 * i, 90, 160, 34, f"linear → {name}")
        d.arrow(x.bottom_mid, proj.top_mid)
        d.grid(proj.x, 140, [[tint(c, 0.45) for c in colours]], cell=40, cell_h=28,
               labels=[[f"{name}{'₁₂₃₄'[h]}" for h in range(4)]], size=13)
    d.text(300, 192, "split the width d into h = 4 heads of d / h: (B, h, L, d / h)",
           size=SMALL, colour=MUTED)
    concat = d.grid(200, 330, [[tint(c, 0.45) for c in colours]], cell=50, cell_h=28,
                    labels=[[f"head {h + 1}" for h in range(4)]], size=SMALL)
    for h, colour in enumerate(colours):
        head = d.box(30 + 140 * h, 214, 120, 72,
                     [f"head {h + 1}", "attention on",
                      f"Q{'₁₂₃₄'[h]}, K{'₁₂₃₄'[h]}, V{'₁₂₃₄'[h]}"],
                     fill=tint(colour, LIGHT))
        d.arrow(head.bottom_mid, (concat.x + 50 * h + 25, concat.y), head=7)
    d.text(412, 344, "concatenate: L × d", anchor="start", size=SMALL, colour=MUTED)
    proj = d.box(210, 388, 180, 34, "output projection Wₒ")
    d.arrow((300, concat.bottom), proj.top_mid)
    out = d.box(230, 454, 140, 40, "MHA(X): L × d", fill=tint(OUTPUT, LIGHT))
    d.arrow(proj.bottom_mid, out.top_mid)
    return d


@diagram(
    "mask_shapes",
    chapter="attention",
    after="## Masks: padding and causality",
    title="Causal and sliding-window masks with fewer queries than keys",
    caption="""Masks for $L = 4$ queries and $S = 7$ keys, filled cell by cell from
    the predicates of `attnbook.masks` (dark = may attend). Bottom-right alignment puts
    query $i$ at key position $i + S - L$, so the last query sees every key; PyTorch's
    `is_causal` aligns the triangle top-left instead.""",
    alt="""Three grids of 4 rows (queries i = 0 to 3) by 7 columns (keys j = 0 to 6),
    with allowed cells filled. Left, the bottom-right causal mask j <= i + S - L:
    query 0 sees keys 0 to 3 and query 3 sees all seven. Middle, a causal sliding
    window of 2 aligned the same way: each query sees its own aligned key and the two
    before it, so query 0 sees keys 1 to 3 and query 3 keys 4 to 6. Right, the
    top-left triangle j <= i of PyTorch's is_causal: query 0 sees only key 0 and query
    3 keys 0 to 3.""",
)
def mask_shapes() -> Drawing:
    L, S, cell = 4, 7, 26
    panels = [
        ("causal, bottom-right", masks.causal(L, S), "j ≤ i + S − L"),
        ("sliding window 2, causal",
         masks.sliding_window(2, is_causal=True, L=L, S=S), "0 ≤ i + S − L − j ≤ 2"),
        # causal(L, L) has no shift: evaluated on S keys it is the top-left triangle
        ("top-left: SDPA's is_causal", masks.causal(L, L), "j ≤ i"),
    ]
    d = Drawing(720, 252)
    for p, (title, predicate, rule) in enumerate(panels):
        allowed = masks.dense(predicate, L, S)[0, 0].tolist()
        x0 = 24 + 240 * p
        gx, gy = x0 + 24, 70
        d.text(gx + S * cell / 2, 22, title, bold=True)
        fills = [[BLUE if a else None for a in row] for row in allowed]
        d.grid(gx, gy, fills, cell=cell, stroke="#ffffff")
        for j in range(S):
            d.text(gx + (j + 0.5) * cell, gy - 12, str(j), size=SMALL, colour=MUTED)
        for i in range(L):
            d.text(gx - 10, gy + (i + 0.5) * cell, str(i), size=SMALL, colour=MUTED)
        d.text(gx - 14, gy - 12, "i\\j", size=SMALL, colour=MUTED, anchor="end")
        d.text(gx + S * cell / 2, gy + L * cell + 22, rule)
    d.text(360, 236, "dark: query i may attend to key j", size=SMALL, colour=MUTED)
    return d


# --------------------------------------------------------------------------------------
# transformer.ipynb
# --------------------------------------------------------------------------------------
def _block(d: Drawing, x0: float, pre: bool) -> None:
    """One Transformer block, post-LN or pre-LN, drawn from its input at the bottom:
    the residual stream on the left, the two branches on the right."""
    sx, bx = x0 + 70, x0 + 210
    stream = {"colour": BLUE, "width": 3}
    norm_fill = tint(YELLOW, 0.5)
    d.text(sx, 502, "x")
    y = 490  # where the stream has got to
    for sub, split in [("attention", 455), ("MLP", 270)]:
        d.circle(sx, split, 3.5, fill=INK, stroke=None)
        if pre:
            norm = d.box(bx - 60, split - 55, 120, 30, "LayerNorm", fill=norm_fill)
            d.arrow((sx, split), (bx, split), norm.bottom_mid)
            box = d.box(bx - 60, norm.y - 66, 120, 36, sub, fill=tint(KEY, LIGHT))
            d.arrow(norm.top_mid, box.bottom_mid)
        else:
            box = d.box(bx - 60, split - 66, 120, 36, sub, fill=tint(KEY, LIGHT))
            d.arrow((sx, split), (bx, split), box.bottom_mid)
        plus = box.y - 30
        d.arrow(box.top_mid, (bx, plus), (sx + 11, plus))
        d.arrow((sx, y), (sx, plus + 11), **stream)
        d.circle(sx, plus, 11, fill="#ffffff")
        d.text(sx, plus, "+", size=LARGE)
        y = plus - 11
        if not pre:
            norm = d.box(sx - 48, plus - 66, 96, 30, "LayerNorm", fill=norm_fill)
            d.arrow((sx, y), norm.bottom_mid, **stream)
            y = norm.y
    d.arrow((sx, y), (sx, 56), **stream)


@diagram(
    "pre_post_ln",
    chapter="transformer",
    after="## Pre-LN or post-LN: where the norm goes",
    title="Post-LN and pre-LN Transformer blocks",
    caption="""The same block with the norm in two places. In post-LN (left) the
    residual stream, the thick line, passes through a LayerNorm after every addition;
    in pre-LN (right) the norms sit inside the branches and the stream is a clean
    identity path from the input to the output, with one final norm before the output
    head.""",
    alt="""Two block diagrams drawn from the input x at the bottom to the output at
    the top, each with a thick vertical residual stream on the left and two branches
    on the right. Left, post-LN, x becomes N(x + f(x)): the attention branch leaves
    the stream and is added back, then a LayerNorm sits on the stream itself; the MLP
    branch follows the same way with a second LayerNorm on the stream. Right, pre-LN,
    x becomes x + f(N(x)): each branch starts with its own LayerNorm, then attention
    or the MLP, and is added back to a stream that passes through no norm.""",
)
def pre_post_ln() -> Drawing:
    d = Drawing(640, 520)
    d.text(160, 22, "post-LN: x ← N(x + f(x))", bold=True)
    d.text(480, 22, "pre-LN: x ← x + f(N(x))", bold=True)
    _block(d, 20, pre=False)
    _block(d, 340, pre=True)
    d.line((320, 40), (320, 510), colour=RULE)
    return d


# --------------------------------------------------------------------------------------
# positional.ipynb
# --------------------------------------------------------------------------------------
def _polar(cx: float, cy: float, r: float, degrees: float) -> tuple[float, float]:
    a = math.radians(degrees)
    return cx + r * math.cos(a), cy - r * math.sin(a)


def _arc(cx: float, cy: float, r: float, a0: float, a1: float) -> str:
    """An SVG path of the arc from ``a0`` to ``a1`` degrees, counter-clockwise."""
    (x0, y0), (x1, y1) = _polar(cx, cy, r, a0), _polar(cx, cy, r, a1)
    large = 1 if a1 - a0 > 180 else 0
    return f"M {x0:.2f} {y0:.2f} A {r} {r} 0 {large} 0 {x1:.2f} {y1:.2f}"


@diagram(
    "rope_rotation",
    chapter="positional",
    after="## RoPE: rotate queries and keys",
    title="RoPE rotates pairs of coordinates by position",
    caption="""RoPE on one pair of coordinates (left): the query at position $m = 1$ is
    turned by $m\\theta$, the key at $n = 3$ by $n\\theta$, so the angle between them,
    and with it their score, depends on $n - m$ only. Right: the pairs of a
    $d_k = 8$ head turn at the frequencies $\\theta_f = 10000^{-2f/d_k}$, shown at
    position $m = 6$; look at how little the last pairs move.""",
    alt="""Left: a circle with a dashed grey vector for q and k before rotation, both
    pointing at 10 degrees. The rotated query R_m q, in blue, points at 35 degrees and
    the rotated key R_n k, in orange, at 85 degrees; an arc between them is labelled
    (n - m) theta. Right: four small dials for the pairs f = 0 to 3 of a head of width
    8 at position 6, with arrows turned by 344, 34, 3.4 and 0.34 degrees from a
    dashed reference line.""",
)
def rope_rotation() -> Drawing:
    d = Drawing(720, 300)
    cx, cy, r = 160, 170, 115
    theta, m, n, start = 25, 1, 3, 10  # degrees
    d.circle(cx, cy, r, fill="#ffffff", stroke=RULE)
    d.line((cx - r - 10, cy), (cx + r + 10, cy), colour=RULE, width=1)
    d.line((cx, cy + r + 10), (cx, cy - r - 10), colour=RULE, width=1)
    d.line((cx, cy), _polar(cx, cy, 100, start), colour=GREY, width=2, dash="5 4")
    d.text(*_polar(cx, cy, 126, start - 4), "q, k", size=SMALL, colour=MUTED)
    d.arrow((cx, cy), _polar(cx, cy, 100, start + m * theta), colour=BLUE, width=2.2)
    d.arrow((cx, cy), _polar(cx, cy, 80, start + n * theta), colour=ORANGE, width=2.2)
    d.text(*_polar(cx, cy, 122, start + m * theta + 2), "Rₘ q", colour=BLUE)
    kx, ky = _polar(cx, cy, 80, start + n * theta)
    d.text(kx - 8, ky - 2, "Rₙ k", colour=ORANGE, anchor="end")
    d.path(_arc(cx, cy, 42, start + m * theta, start + n * theta), stroke=HIGHLIGHT,
           width=2)
    d.text(*_polar(cx, cy, 76, start + (m + n) / 2 * theta - 5), "(n − m)θ",
           size=SMALL, colour=HIGHLIGHT)
    d.text(cx, 24, f"one pair, θ = {theta}°, m = {m}, n = {n}", bold=True)
    # the pairs of one head, each at its own frequency
    dim, pos = 8, 6
    d.text(525, 24, f"the {dim // 2} pairs of a head, d = {dim}, at m = {pos}",
           bold=True)
    for f in range(dim // 2):
        freq = 10000 ** (-2 * f / dim)
        angle = math.degrees(pos * freq)
        x = 385 + 95 * f
        d.circle(x, cy, 36, fill="#ffffff", stroke=RULE)
        d.line((x, cy), (x + 36, cy), colour=GREY, width=1.2, dash="4 3")
        d.arrow((x, cy), _polar(x, cy, 34, angle), colour=BLUE, width=2, head=7)
        d.text(x, cy - 52, f"f = {f}")
        d.text(x, cy + 56, f"θ = {freq:g}", size=SMALL)
        shown = f"{angle:.0f}" if angle >= 10 else f"{angle:.2g}"
        d.text(x, cy + 76, f"mθ = {shown}°", size=SMALL, colour=MUTED)
    d.text(525, 280, "θ = 10000^(−2f/d): each pair turns at its own speed",
           size=SMALL, colour=MUTED)
    return d


@diagram(
    "alibi_bias",
    chapter="positional",
    after="## ALiBi: a linear penalty on distance",
    title="ALiBi's bias: distance times a slope per head",
    caption="""ALiBi's bias for a causal model with 4 heads and 6 positions, from
    `attnbook.positional.alibi_bias`: one matrix of distances, multiplied by each
    head's fixed slope $m_r$ (`alibi_slopes`). Look at how fast the colour darkens
    away from the diagonal in head 1 and how pale head 4 stays: the steep head is
    local, the shallow one nearly ignores distance.""",
    alt="""Left, a 6 by 6 lower-triangular grid of the negative distances -(i - j): 0
    on the diagonal, -1 below it, down to -5 in the bottom-left corner; the upper
    triangle is blank, masked. A multiplication sign leads to four smaller grids, one
    per head, with slopes 1/4, 1/16, 1/64 and 1/256, shaded on one colour scale from
    white for 0 to dark blue for the largest penalty, 1.25. Head 1 darkens quickly
    away from the diagonal; head 4 stays almost white.""",
)
def alibi_bias_diagram() -> Drawing:
    heads, n = 4, 6
    bias = alibi_bias(heads, n)[0]  # (heads, n, n), -inf above the diagonal
    slopes = alibi_slopes(heads).tolist()
    deepest = -float(bias[bias.isfinite()].min())
    d = Drawing(720, 260)
    cell = 26
    d.text(20 + n * cell / 2, 24, "−(i − j), j ≤ i", bold=True)
    fills = [[tint(GREY, 0.25) if j <= i else "none" for j in range(n)]
             for i in range(n)]
    labels = [[f"{j - i}".replace("-", "−") if j <= i else None for j in range(n)]
              for i in range(n)]
    d.grid(20, 50, fills, cell=cell, labels=labels)
    d.text(200, 50 + n * cell / 2, "× mₕ", size=LARGE)
    small = 18
    for h in range(heads):
        x = 240 + 122 * h
        slope = Fraction(slopes[h]).limit_denominator(1024)
        d.text(x + n * small / 2, 40, f"head {h + 1}: m = {slope}", size=SMALL)
        values = bias[h].tolist()
        fills = [
            [tint(BLUE, -v / deepest) if j <= i else "none" for j, v in enumerate(row)]
            for i, row in enumerate(values)
        ]
        d.grid(x, 75, fills, cell=small, stroke=RULE, width=0.5)
    # the colour scale
    for k in range(11):
        d.rect(240 + 20 * k, 214, 20, 14, fill=tint(BLUE, k / 10), stroke=None)
    d.rect(240, 214, 220, 14, stroke=RULE, width=0.8)
    d.text(234, 221, "0", anchor="end", size=SMALL)
    d.text(466, 221, f"−{deepest:g}", anchor="start", size=SMALL)
    d.text(350, 244, "bias −mₕ (i − j) added to the scores", size=SMALL, colour=MUTED)
    return d


# --------------------------------------------------------------------------------------
# linear.ipynb
# --------------------------------------------------------------------------------------
def _matrix(d: Drawing, x: float, cy: float, rows: int, cols: int, name: str,
            shape: str, fill: str, unit: float = 14, label_y: float | None = None):
    box = d.rect(x, cy - rows * unit / 2, cols * unit, rows * unit, fill=fill, width=1)
    below = label_y if label_y is not None else box.bottom + 16
    d.text(box.cx, below, name)
    d.text(box.cx, below + 17, shape, size=SMALL, colour=MUTED)
    return box


@diagram(
    "linear_reorder",
    chapter="linear",
    after="## The kernel view of attention",
    title="Linear attention: the same product in two orders",
    caption="""Without the softmax, the product of three matrices can be taken in
    either order, drawn to scale for $n = 8$ tokens and $M = d_k = d_v = 3$. Multiplying
    $\\phi(Q)\\phi(K)^\\top$ first builds the $n \\times n$ matrix; multiplying
    $\\phi(K)^\\top V$ first builds only the $M \\times d_v$ summary $S$, so the cost
    grows linearly with $n$. (The normalizer $\\phi(q_i)^\\top z$ is left out.)""",
    alt="""Two rows of matrices drawn to scale. Top, order 1: phi(Q), n by M, times
    phi(K) transposed, M by n, gives a large n by n square, which times V, n by d,
    gives O, n by d; its cost is O(n squared M) time and an n by n matrix in memory.
    Bottom, order 2: phi(K) transposed times V gives the small M by d matrix S, and
    phi(Q) times S gives O; its cost is O(n M d) time and an M by d matrix in
    memory.""",
)
def linear_reorder() -> Drawing:
    n, m = 8, 3
    d = Drawing(720, 440)
    q, k, v = tint(QUERY, LIGHT), tint(KEY, LIGHT), tint(VALUE, LIGHT)
    big, summary, out = tint(HIGHLIGHT, LIGHT), tint(PURPLE, 0.45), tint(OUTPUT, LIGHT)
    # order 1: (phi(Q) phi(K)^T) V
    cy = 112
    d.text(20, 22, "order 1:  (φ(Q) φ(K)ᵀ) V", anchor="start", bold=True)
    row = 185
    _matrix(d, 30, cy, n, m, "φ(Q)", "n × M", q, label_y=row)
    d.text(90, cy, "·", size=22)
    _matrix(d, 104, cy, m, n, "φ(K)ᵀ", "M × n", k, label_y=row)
    d.text(232, cy, "=", size=18)
    _matrix(d, 250, cy, n, n, "A", "n × n", big, label_y=row)
    d.text(378, cy, "·", size=22)
    _matrix(d, 392, cy, n, m, "V", "n × d", v, label_y=row)
    d.text(450, cy, "=", size=18)
    _matrix(d, 468, cy, n, m, "O", "n × d", out, label_y=row)
    d.lines(540, cy, ["time O(n² M)", "memory n × n"], anchor="start")
    # order 2: phi(Q) (phi(K)^T V)
    cy = 322
    d.text(20, 244, "order 2:  φ(Q) (φ(K)ᵀ V)", anchor="start", bold=True)
    row = 395
    _matrix(d, 30, cy, m, n, "φ(K)ᵀ", "M × n", k, label_y=row)
    d.text(158, cy, "·", size=22)
    _matrix(d, 172, cy, n, m, "V", "n × d", v, label_y=row)
    d.text(230, cy, "=", size=18)
    _matrix(d, 248, cy, m, m, "S", "M × d", summary, label_y=row)
    d.text(316, cy, "then", size=SMALL, colour=MUTED)
    _matrix(d, 342, cy, n, m, "φ(Q)", "n × M", q, label_y=row)
    d.text(400, cy, "·", size=22)
    _matrix(d, 414, cy, m, m, "S", "M × d", summary, label_y=row)
    d.text(472, cy, "=", size=18)
    _matrix(d, 490, cy, n, m, "O", "n × d", out, label_y=row)
    d.lines(560, cy, ["time O(n M d)", "memory M × d"], anchor="start")
    return d


# --------------------------------------------------------------------------------------
# rnn_attention.ipynb
# --------------------------------------------------------------------------------------
@diagram(
    "attentive_gru",
    chapter="rnn_attention",
    after="## The model: a bidirectional encoder and an attentive decoder",
    title="The attentive GRU decoder on a date",
    caption="""One decoding step of the chapter's `Seq2Seq` on the source "05.03.1987",
    writing the first character of 1987-03-05. A forward and a backward GRU give each
    character its annotation $h_j$; the additive score turns $s_{t-1}$ and every $h_j$
    into weights $\\alpha_{tj}$ (line thickness, illustrative values), whose weighted
    sum $c_t$ enters the decoder's GRU beside the previous character, and a read-out
    predicts $y_t$.""",
    alt="""Along the bottom, the ten source characters 0 5 . 0 3 . 1 9 8 7, each
    below a column of two boxes, a backward GRU state and a forward GRU state, which
    together form the annotation h_j. Lines run from every annotation to a summation
    node on the right; the line from the character 1 of 1987 is much thicker, with
    weight 0.80, the others thin. A formula at the left gives the additive score and
    softmax. The summation node sends the context c_t up into a GRU box, which also
    takes the embedded previous character E y_t-1 and the previous state s_t-1; its
    new state s_t goes to a read-out box of s_t, c_t and E y_t-1, which emits y_t = 1,
    the first character of 1987-03-05.""",
)
def attentive_gru() -> Drawing:
    source = "05.03.1987"
    weights = [0.01, 0.01, 0.02, 0.02, 0.03, 0.04, 0.80, 0.04, 0.02, 0.01]
    d = Drawing(720, 420)
    node = (635, 240)
    d.text(20, 312, "forward GRU →", anchor="start", size=SMALL, colour=MUTED)
    d.text(20, 348, "backward GRU ←", anchor="start", size=SMALL, colour=MUTED)
    d.text(20, 392, "source", anchor="start", size=SMALL, colour=MUTED)
    for j, (ch, w) in enumerate(zip(source, weights)):
        x = 148 + 40 * j
        d.box(x - 16, 300, 32, 24, fill=tint(STATE, 0.5), rx=3)
        d.box(x - 16, 336, 32, 24, fill=tint(STATE, 0.25), rx=3)
        d.rect(x - 18, 298, 36, 64, stroke=MUTED, width=0.8, rx=4)
        d.text(x, 392, ch)
        d.arrow((x, 380), (x, 362), head=6, width=1)
        d.line((x, 298), _towards((x, 298), node, 15), colour=ORANGE,
               width=0.8 + 8 * w)
    peak = weights.index(max(weights))
    x, t = 148 + 40 * peak, 0.15
    d.box(x + t * (node[0] - x) - 22, 298 + t * (node[1] - 298) - 10, 44, 20,
          f"{weights[peak]:.2f}", size=SMALL, rx=9, stroke=ORANGE)
    d.text(20, 200, "αₜⱼ = softmaxⱼ(vᵀ tanh(W sₜ₋₁ + U hⱼ))", anchor="start",
           size=SMALL)
    d.text(20, 222, "cₜ = Σⱼ αₜⱼ hⱼ", anchor="start", size=SMALL)
    _sum_node(d, *node)
    gru = d.box(575, 130, 120, 44, "GRU", fill=tint(QUERY, LIGHT))
    d.arrow((node[0], node[1] - 15), (node[0], gru.bottom))
    d.text(node[0] + 8, 200, "cₜ", anchor="start")
    d.arrow((520, 142), (gru.x, 142), head=7)
    d.text(514, 142, "E yₜ₋₁", anchor="end", size=SMALL)
    d.arrow((520, 162), (gru.x, 162), head=7)
    d.text(514, 162, "sₜ₋₁", anchor="end", size=SMALL)
    read = d.box(555, 52, 160, 44, ["read-out of", "[sₜ; cₜ; E yₜ₋₁]"])
    d.arrow(gru.top_mid, (gru.cx, read.bottom))
    d.text(gru.cx + 8, 113, "sₜ", anchor="start")
    d.arrow(read.top_mid, (read.cx, 28), head=7)
    d.text(read.cx, 14, "yₜ = 1  (of 1987-03-05)", size=SMALL)
    return d


# --------------------------------------------------------------------------------------
# vision_attention.ipynb
# --------------------------------------------------------------------------------------
DIGIT = [  # an 8 x 8 three, drawn for the picture
    "..####..",
    ".#....#.",
    "......#.",
    "..####..",
    "......#.",
    "......#.",
    ".#....#.",
    "..####..",
]


@diagram(
    "vit_patches",
    chapter="vision_attention",
    after="## The Vision Transformer",
    title="A Vision Transformer turns patches into tokens",
    caption="""The chapter's ViT on an $8 \\times 8$ digit: $2 \\times 2$ patches,
    numbered row by row, each flattened and projected to width $d$, become 16 tokens
    after a learned [CLS] token; position embeddings are added, the encoder attends
    over all 17, and only the [CLS] output reaches the classifier. Each token shows
    the patch it came from.""",
    alt="""At the bottom, an 8 by 8 pixel image of the digit 3, cut by blue lines
    into 16 patches of 2 by 2 pixels. An arrow, flatten each patch and project to
    width d, leads up to a row of 17 tokens: a learned CLS token, then 16 tokens
    numbered 0 to 15, each showing its 2 by 2 patch. Above the tokens is a row of
    position embeddings p0 to p16 that are added to them. Arrows lead up from every
    token to a wide Transformer encoder box. From the encoder, only the output above
    the CLS token goes on, through a final norm and a linear head that predicts the
    class 3.""",
)
def vit_patches() -> Drawing:
    d = Drawing(720, 470)
    ink = "#404040"
    # the encoder, its [CLS] output and the head, from the top
    d.text(201, 18, "class: 3")
    head = d.box(126, 44, 150, 34, "norm + linear head", fill=tint(OUTPUT, LIGHT))
    d.arrow(head.top_mid, (head.cx, 30), head=7)
    enc = d.box(180, 110, 524, 50, "Transformer encoder: self-attention over all 17 "
                "tokens", fill=tint(KEY, LIGHT))
    d.arrow((head.cx, enc.y), head.bottom_mid)
    d.text(head.cx + 12, 94, "the [CLS] output only", anchor="start", size=SMALL,
           colour=MUTED)
    # the tokens: [CLS] then the patches in row-major order, position embeddings added
    y = 226
    cls = d.box(180, y, 42, 52, "CLS", fill=tint(OUTPUT, LIGHT), size=SMALL, rx=3)
    d.text(cls.cx, y + 66, "learned", size=SMALL, colour=MUTED)
    tops = [cls.cx]
    for t in range(16):
        x = 226 + 30 * t
        d.box(x, y, 28, 52, fill=tint(STATE, LIGHT), rx=3)
        r, c = divmod(t, 4)
        patch = [[ink if DIGIT[2 * r + a][2 * c + b] == "#" else None for b in (0, 1)]
                 for a in (0, 1)]
        d.grid(x + 5, y + 5, patch, cell=9, stroke="#ffffff", width=0.5)
        d.text(x + 14, y + 38, str(t), size=SMALL)
        tops.append(x + 14)
    subscript = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")
    d.grid(180, 196, [[tint(YELLOW, 0.6)]], cell=42, cell_h=24, labels=[["p₀"]])
    d.grid(226, 196, [[tint(YELLOW, 0.6)] * 16], cell=30, cell_h=24,
           labels=[[f"p{t + 1}".translate(subscript) for t in range(16)]])
    for x in tops:
        d.arrow((x, 196), (x, enc.bottom), head=6, width=1)
    d.text(172, 208, "+ position", anchor="end", size=SMALL, colour=MUTED)
    d.text(172, 252, "tokens", anchor="end", size=SMALL, colour=MUTED)
    # the image, cut into 2 x 2 patches
    px, py, pixel = 190, 326, 16
    fills = [[ink if c == "#" else None for c in row] for row in DIGIT]
    d.grid(px, py, fills, cell=pixel, stroke="#ffffff", width=0.5)
    for k in range(5):
        d.line((px + 32 * k, py), (px + 32 * k, py + 128), colour=BLUE, width=2)
        d.line((px, py + 32 * k), (px + 128, py + 32 * k), colour=BLUE, width=2)
    d.arrow((px + 64, py - 2), (px + 64, y + 54))
    d.text(px + 76, 306, "flatten each patch, project to width d", anchor="start",
           size=SMALL, colour=MUTED)
    d.lines(px + 144, 390, ["8 × 8 image,", "2 × 2 patches", "numbered row by row"],
            anchor="start", size=SMALL, colour=MUTED)
    return d


# --------------------------------------------------------------------------------------
# graph_attention.ipynb
# --------------------------------------------------------------------------------------
@diagram(
    "gat_neighbours",
    chapter="graph_attention",
    after="## GAT: attention, masked by the graph",
    title="Graph attention over a node's neighbours",
    caption="""A GAT layer updating node 2: it attends to its neighbours and to itself,
    $N(i) \\cup \\{i\\}$, with weights $\\alpha_{ij}$ (line thickness, illustrative
    values), and never to the other nodes. On the right the same thing as a mask: row
    2 of the $n \\times n$ adjacency matrix with self-loops, exactly like a causal
    mask's row.""",
    alt="""Left, a small graph of eight nodes numbered 0 to 7. Node 2, in the middle,
    receives arrows from its neighbours 0, 3, 5 and 6, with weights 0.35, 0.10, 0.20
    and 0.10, and a self-loop with weight 0.25; the arrows are thicker for larger
    weights. Nodes 1, 4 and 7 are grey and only connected to other nodes, not to node
    2. Right, three formulas give the score LeakyReLU of a transposed times the
    concatenation of z_i and z_j, the softmax over N(i) and i, and the weighted sum of
    z_j. Below them a row of eight cells for the columns 0 to 7 marks columns 0, 2, 3,
    5 and 6 as allowed, and the row under it holds their weights.""",
)
def gat_neighbours() -> Drawing:
    d = Drawing(720, 310)
    centre, r = (190, 165), 18
    # neighbour: (position, weight, where its weight is written)
    neighbours = {0: ((75, 115), 0.35, (118, 160)), 3: ((300, 75), 0.10, (266, 130)),
                  5: ((305, 215), 0.20, (252, 171)), 6: ((135, 270), 0.10, (184, 232))}
    others = {1: (35, 220), 4: (365, 140), 7: (255, 290)}
    nodes = {j: spec[0] for j, spec in neighbours.items()} | others
    self_weight = 0.25
    for a, b in [(1, 0), (1, 6), (4, 3), (4, 5), (7, 5), (7, 6)]:
        d.line(_towards(nodes[b], nodes[a], r), _towards(nodes[a], nodes[b], r),
               colour=RULE, width=1.5)
    for j, (at, w, label) in neighbours.items():
        d.arrow(_towards(centre, at, r), _towards(at, centre, r + 1), colour=ORANGE,
                width=1 + 8 * w, head=10)
        d.text(*label, f"{w:.2f}", size=SMALL)
    # the self-loop, above the node
    cx, cy = centre
    d.path(f"M {cx - 9} {cy - 16} C {cx - 30} {cy - 80}, {cx + 30} {cy - 80}, "
           f"{cx + 9} {cy - 16}", stroke=ORANGE, width=1 + 8 * self_weight)
    d.text(cx, cy - 78, f"{self_weight:.2f}", size=SMALL)
    for j, (x, y) in nodes.items():
        neighbour = j in neighbours
        d.circle(x, y, r, fill=tint(KEY, LIGHT) if neighbour else "#f2f2f2",
                 stroke=INK if neighbour else GREY, dash=None if neighbour else "3 3")
        d.text(x, y, str(j), colour=INK if neighbour else MUTED)
    d.circle(cx, cy, r + 2, fill=tint(QUERY, 0.45), width=2)
    d.text(cx, cy, "2", bold=True)
    # the formulas and the mask row
    d.lines(400, 70, ["eᵢⱼ = LeakyReLU(aᵀ [zᵢ ‖ zⱼ])",
                      "αᵢⱼ = softmax over j ∈ N(i) ∪ {i}",
                      "h′ᵢ = Σⱼ αᵢⱼ zⱼ"], anchor="start", leading=1.6)
    cell, gx = 34, 440
    alpha = {j: spec[1] for j, spec in neighbours.items()} | {2: self_weight}
    d.text(gx + 4 * cell, 160, "row i = 2 of the mask", bold=True)
    d.grid(gx, 200, [[BLUE if j in alpha else None for j in range(8)],
                     [tint(BLUE, 0.2) if j in alpha else None for j in range(8)]],
           cell=cell, cell_h=28,
           labels=[[None] * 8, [f"{alpha[j]:.2f}" if j in alpha else None
                                for j in range(8)]])
    for j in range(8):
        d.text(gx + (j + 0.5) * cell, 186, str(j), size=SMALL, colour=MUTED)
    d.text(gx - 8, 186, "j", anchor="end", size=SMALL, colour=MUTED)
    d.text(gx - 8, 214, "mask", anchor="end", size=SMALL, colour=MUTED)
    d.text(gx - 8, 242, "αᵢⱼ", anchor="end", size=SMALL, colour=MUTED)
    d.text(gx + 4 * cell, 272, "non-neighbours 1, 4, 7: masked, weight 0",
           size=SMALL, colour=MUTED)
    return d
