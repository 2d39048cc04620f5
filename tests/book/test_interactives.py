"""The website's interactives compute what the package computes.

Each widget in ``_static/interactives/`` keeps its arithmetic in pure functions that
node can load (``module.exports``). These tests run them in node on many inputs and
compare the results with :mod:`attnbook`: the mask predicates with
:mod:`attnbook.masks`, the online softmax's running state with
:func:`attnbook.primitives.online_softmax_step`, the paged allocator with
:class:`attnbook.kvcache.PagedKVCache`, the ring schedule with
:mod:`attnbook.distributed`, and the speculative rule with
:func:`attnbook.serving.speculative_accept` given the same uniform draws. The browser
side (the widgets initialise, their controls work, they fit the page) is
``tests/book/test_interactives_browser.py``.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from attnbook import masks
from attnbook.distributed import _block_pairs, _Ring, pairs_per_rank
from attnbook.kvcache import CacheFullError, PagedKVCache
from attnbook.primitives import online_softmax, online_softmax_step

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "_static" / "interactives"
NODE = shutil.which("node")
WIDGETS = ["online-softmax", "masks", "paged-allocator", "ring", "speculative"]

pytestmark = pytest.mark.skipif(
    NODE is None, reason="node is not installed: the interactives' arithmetic is checked in node"
)


def _node(widget: str, body: str, data=None):
    """Run ``body`` in node with the widget's exports as ``W`` and the JSON ``data`` as
    ``D``; ``body`` ends by printing JSON (``out(value)``); returns it parsed."""
    path = json.dumps(str(STATIC / f"{widget}.js"))
    script = (
        f"const W = require({path});\n"
        f"const D = {json.dumps(data)};\n"
        "const out = (v) => process.stdout.write(JSON.stringify(v));\n" + body
    )
    done = subprocess.run([NODE, "-e", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_widget_file_exists_and_loads_in_node():
    names = {p.stem for p in STATIC.glob("*.js")}
    assert set(WIDGETS) <= names
    for widget in WIDGETS:
        assert _node(widget, "out(Object.keys(W).length)") > 0


# --------------------------------------------------------------------------------------
# Masks
# --------------------------------------------------------------------------------------
def _reference_mask(pattern: str, L: int, S: int, w: int, g: int) -> list[list[bool]]:
    if pattern == "full":
        return torch.ones(L, S, dtype=torch.bool).tolist()
    if pattern == "top-left":  # PyTorch's is_causal: the slow obvious rule
        return [[j <= i for j in range(S)] for i in range(L)]
    if pattern == "causal":
        predicate = masks.causal(L, S)
    elif pattern == "sliding":
        predicate = masks.sliding_window(w, L=L, S=S)
    elif pattern == "causal-sliding":
        predicate = masks.sliding_window(w, is_causal=True, L=L, S=S)
    elif g == 0:  # longformer without global tokens is its window
        predicate = masks.sliding_window(w)
    else:
        predicate = masks.longformer(L, w, list(range(g)))
    return masks.dense(predicate, L, S)[0, 0].tolist()


def test_masks_match_attnbook_masks_for_every_shape_and_window():
    cases = []
    for pattern in ("full", "causal", "sliding", "causal-sliding", "top-left"):
        for L in range(1, 8):
            for S in range(1, 8):
                for w in range(4):
                    cases.append((pattern, L, S, w, 0))
    for n in range(1, 9):
        for w in range(4):
            for g in range(3):
                if g <= n:
                    cases.append(("longformer", n, n, w, g))
    got = _node(
        "masks",
        "out(D.map(c => W.maskMatrix(c[0], c[1], c[2], c[3], c[4])))",
        cases,
    )
    wrong = [c for c, m in zip(cases, got) if m != _reference_mask(*c)]
    assert not wrong, f"{len(wrong)} of {len(cases)} masks differ, e.g. {wrong[:5]}"


def test_mask_rows_are_described_in_words():
    got = _node(
        "masks",
        "out([W.describeRow([false, true, true, false, true]), W.describeRow([false]),"
        " W.describeRow([true, false])])",
    )
    assert got == ["keys 1 to 2 and 4", "no key", "key 0"]


# --------------------------------------------------------------------------------------
# Online softmax
# --------------------------------------------------------------------------------------
def _rows():
    gen = torch.Generator().manual_seed(0)
    rows = [
        [1.0, 3.0, 0.5, 2.0, 4.0, 1.5, 0.0, 2.5, 3.5, 4.5, 1.0, 2.0],  # the figure's row
        [5.0, 4.0, 3.0, 2.0, 1.0],  # the maximum comes first: every rescale is 1
        [-30.0, 0.0, 30.0, 60.0],  # large scores: nothing overflows
    ]
    rows += [(6 * torch.rand(n, generator=gen, dtype=torch.float64) - 1).tolist()
             for n in (1, 7, 16)]  # fmt: skip
    return rows


def test_online_softmax_states_match_online_softmax_step_tile_by_tile():
    cases = []
    for x in _rows():
        v = [math.sin(3 * j + 1) for j in range(len(x))]
        for block in range(1, len(x) + 1):
            cases.append((x, v, block))
    got = _node(
        "online-softmax",
        "out(D.map(c => W.onlineSoftmaxStates(c[0], c[1], c[2]).slice(1)))",
        cases,
    )
    for (x, v, block), states in zip(cases, got):
        xt, vt = torch.tensor([x], dtype=torch.float64), torch.tensor(v, dtype=torch.float64)
        m = torch.full((1,), -math.inf, dtype=torch.float64)
        l, acc = torch.zeros(1, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64)
        starts = list(range(0, len(x), block))
        assert len(states) == len(starts)
        for j0, state in zip(starts, states):
            j1 = min(j0 + block, len(x))
            m_old = m
            m, l, acc = online_softmax_step(m, l, xt[:, j0:j1], acc, vt[j0:j1, None])
            assert (state["j0"], state["j1"]) == (j0, j1)
            assert state["m"] == pytest.approx(float(m))
            assert state["l"] == pytest.approx(float(l), rel=1e-12)
            assert state["acc"] == pytest.approx(float(acc), rel=1e-12, abs=1e-12)
            if torch.isfinite(m_old).all():
                assert state["alpha"] == pytest.approx(math.exp(float(m_old - m)), rel=1e-12)
        full = torch.softmax(xt[0], -1)
        assert states[-1]["out"] == pytest.approx(float(full @ vt), rel=1e-10, abs=1e-12)


def test_online_softmax_result_equals_the_full_softmax():
    cases = [(x, b) for x in _rows() for b in range(1, len(x) + 1)]
    got = _node(
        "online-softmax",
        "out(D.map(c => [W.onlineSoftmax(c[0], c[1]), W.softmax(c[0])]))",
        cases,
    )
    for (x, block), (online, full) in zip(cases, got):
        xt = torch.tensor(x, dtype=torch.float64)
        expected = torch.softmax(xt, -1).tolist()
        assert online == pytest.approx(online_softmax(xt, block).tolist(), rel=1e-12)
        assert online == pytest.approx(expected, rel=1e-12, abs=1e-300)
        assert full == pytest.approx(expected, rel=1e-12, abs=1e-300)


# --------------------------------------------------------------------------------------
# Paged allocator
# --------------------------------------------------------------------------------------
def _script(seed: int, n_ops: int = 80) -> list:
    """A random run of allocate / append T / free operations."""
    rnd, live, ops, next_id = random.Random(seed), [], [], 0
    for _ in range(n_ops):
        action = rnd.random()
        if not live or action < 0.15:
            ops.append(["allocate", f"s{next_id}"])
            live.append(f"s{next_id}")
            next_id += 1
        elif action < 0.3:
            ops.append(["free", live.pop(rnd.randrange(len(live)))])
        else:
            ops.append(["append", rnd.choice(live), rnd.choice([1, 1, 1, 2, 3, 7])])
    return ops


_REPLAY = """
out(D.cases.map(([nBlocks, blockSize, ops]) => {
  const st = W.pagedNew(nBlocks, blockSize);
  return ops.map(op => {
    let ok = true;
    if (op[0] === "allocate") W.pagedAllocate(st, op[1]);
    else if (op[0] === "free") W.pagedFree(st, op[1]);
    else ok = W.pagedAppend(st, op[1], op[2]);
    const tables = {};
    st.order.forEach(id => { tables[id] = st.tables[id].slice(); });
    return {ok, tables, lengths: Object.assign({}, st.lengths), free: st.free.slice(),
            waste: W.pagedWaste(st)};
  });
}));
"""


@pytest.mark.parametrize("block_size", [1, 2, 4, 5])
def test_paged_allocator_matches_paged_kv_cache_operation_by_operation(block_size):
    cases = [(n_blocks, block_size, _script(seed)) for seed in range(6) for n_blocks in (6, 24)]
    got = _node("paged-allocator", _REPLAY, {"cases": cases})
    one = torch.zeros(1, 1, 1)
    for (n_blocks, size, ops), states in zip(cases, got):
        cache = PagedKVCache(n_blocks, size, n_kv_heads=1, head_dim=1)
        for op, state in zip(ops, states):
            ok = True
            if op[0] == "allocate":
                cache.allocate(op[1])
            elif op[0] == "free":
                cache.free(op[1])
            else:
                try:
                    cache.append(op[1], one.expand(1, op[2], 1), one.expand(1, op[2], 1))
                except CacheFullError:
                    ok = False
            assert state["ok"] == ok, op
            assert state["tables"] == cache.block_tables, op
            assert state["lengths"] == cache.lengths, op
            assert state["free"] == cache.free_blocks, op
            assert state["waste"] == cache.wasted_slots(), op


_SERVE = """
const H = {rng: (seed) => { let a = seed >>> 0; return () => {
  a = (a + 0x6d2b79f5) >>> 0; let t = a; t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61); return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}; }};
out(D.map(([seed, nBlocks, blockSize]) => {
  const requests = W.makeRequests(seed, 6, 14, H.rng);
  const st = W.pagedNew(nBlocks, blockSize), done = {}, log = [];
  for (let t = 0; t < 60; t++) {
    W.serverStep(st, requests, t, done);
    const tables = {};
    st.order.forEach(id => { tables[id] = st.tables[id].slice(); });
    log.push({tables, lengths: Object.assign({}, st.lengths), free: st.free.slice(),
              waste: W.pagedWaste(st)});
  }
  return {requests, log};
}));
"""


def test_the_server_trace_replayed_on_paged_kv_cache_gives_the_same_pool():
    """The widget's server (finished sequences free their blocks, arrivals allocate,
    every running sequence appends a token or waits), written again plainly in Python on
    PagedKVCache."""
    cases = [(seed, n_blocks, size) for seed in range(4) for n_blocks, size in
             ((16, 4), (6, 2), (32, 1), (5, 8))]  # fmt: skip
    got = _node("paged-allocator", _SERVE, cases)
    one = torch.zeros(1, 1, 1)
    for (seed, n_blocks, size), run in zip(cases, got):
        requests, cache, status = run["requests"], PagedKVCache(n_blocks, size, 1, 1), {}
        for t, state in enumerate(run["log"]):
            for seq in list(cache.block_tables):
                if status[seq] == "finished":
                    cache.free(seq)
                    status[seq] = "gone"
            for req in requests:
                if req["arrive"] == t:
                    cache.allocate(req["id"])
                    status[req["id"]] = "running"
            for req in requests:
                if status.get(req["id"]) != "running":
                    continue
                try:
                    cache.append(req["id"], one, one)
                except CacheFullError:
                    continue
                if cache.lengths[req["id"]] == req["length"]:
                    status[req["id"]] = "finished"
            assert state["tables"] == cache.block_tables, (seed, t)
            assert state["free"] == cache.free_blocks, (seed, t)
            assert state["lengths"] == cache.lengths, (seed, t)
            assert state["waste"] == cache.wasted_slots() < size * max(1, len(cache.lengths))


# --------------------------------------------------------------------------------------
# Ring attention
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_ring_schedule_matches_the_block_pairs_of_ring_attention(layout, is_causal):
    worlds = list(range(1, 9))
    got = _node(
        "ring",
        f"out(D.map(W_ => W.ringSchedule(W_, {json.dumps(layout)}, {json.dumps(is_causal)})))",
        worlds,
    )
    n = 4  # positions per rank: 1 chunk of 4, or 2 chunks of 2 (zigzag)
    c = n // 2 if layout == "zigzag" else n
    for world, steps in zip(worlds, got):
        assert len(steps) == world
        for step, row in enumerate(steps):
            for rank, entry in enumerate(row):
                src = (rank - step) % world
                assert entry["src"] == src
                ring = _Ring(world, rank, (rank + 1) % world, (rank - 1) % world, None)
                pairs, skipped = _block_pairs(ring, src, n, layout, is_causal)
                mine_q = [rank, 2 * world - 1 - rank] if layout == "zigzag" else [rank]
                theirs_k = [src, 2 * world - 1 - src] if layout == "zigzag" else [src]
                expected = [
                    {"q": mine_q[rows.start // c], "k": theirs_k[cols.start // c],
                     "kind": "diagonal" if diagonal else "full"}
                    for rows, cols, diagonal in pairs
                ]  # fmt: skip
                computed = [p for p in entry["pairs"] if p["kind"] != "skipped"]
                assert computed == expected, (world, step, rank)
                assert len(entry["pairs"]) - len(computed) == skipped


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_ring_work_per_rank_matches_pairs_per_rank(layout, is_causal):
    cases = [(world, 2 * world * m) for world in range(1, 9) for m in (1, 2, 5)]
    got = _node(
        "ring",
        f"out(D.map(c => W.pairsPerRank(c[1], c[0], {json.dumps(layout)}, "
        f"{json.dumps(is_causal)})))",
        cases,
    )
    for (world, seq_len), work in zip(cases, got):
        expected = pairs_per_rank(seq_len, world, layout=layout, is_causal=is_causal)
        assert work == expected, (world, seq_len)


def test_ring_visits_every_block_once():
    got = _node(
        "ring",
        "out([2, 3, 4, 5, 8].map(w => ['contiguous', 'zigzag'].map(l => "
        "W.ringSchedule(w, l, true).flat().flatMap(e => e.pairs)"
        ".map(p => p.q * 100 + p.k))))",
    )
    for world, layouts in zip([2, 3, 4, 5, 8], got):
        for chunks, blocks in zip((world, 2 * world), layouts):
            assert sorted(blocks) == sorted(q * 100 + k for q in range(chunks)
                                            for k in range(chunks))  # fmt: skip


# --------------------------------------------------------------------------------------
# Speculative decoding
# --------------------------------------------------------------------------------------
def _rounds():
    gen = torch.Generator().manual_seed(1)
    rounds = []
    for k, V, sharp in [(1, 2, 1.0), (3, 5, 1.0), (4, 8, 0.5), (6, 8, 3.0), (2, 3, 8.0)]:
        for _ in range(12):
            p = torch.softmax(sharp * torch.randn(k + 1, V, generator=gen, dtype=torch.float64), -1)
            q = torch.softmax(sharp * torch.randn(k, V, generator=gen, dtype=torch.float64), -1)
            mix = torch.rand(1, generator=gen, dtype=torch.float64)
            q = mix * p[:k] + (1 - mix) * q  # a draft somewhat like the target
            draft = torch.multinomial(q, 1, generator=gen)[:, 0]
            r = torch.rand(k, generator=gen, dtype=torch.float64)
            u = float(torch.rand(1, generator=gen, dtype=torch.float64))
            rounds.append((p, q, draft, r, u))
    # edge cases: the draft equals the target (no residual mass: sample p), one-hot
    # (greedy) distributions, and every draft token certainly accepted (the bonus)
    p = torch.full((3, 4), 0.25, dtype=torch.float64)
    rounds.append((p, p[:2].clone(), torch.tensor([1, 2]), torch.tensor([0.99, 0.5]), 0.6))
    eye = torch.eye(4, dtype=torch.float64)
    rounds.append((eye[[1, 2, 3]], eye[[1, 0]], torch.tensor([1, 0]),
                   torch.tensor([0.5, 0.5], dtype=torch.float64), 0.3))  # fmt: skip
    rounds.append((eye[[1, 2, 3]], eye[[1, 2]], torch.tensor([1, 2]),
                   torch.tensor([0.9, 0.9], dtype=torch.float64), 0.3))  # fmt: skip
    # a draw of exactly 0 against a token the target rules out: still rejected (r q < p)
    rounds.append((eye[[1, 2, 3]], torch.full((2, 4), 0.25, dtype=torch.float64),
                   torch.tensor([0, 0]), torch.zeros(2, dtype=torch.float64), 0.1))  # fmt: skip
    return rounds


def _inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """The slow obvious sample: the first token whose cumulative mass exceeds u."""
    total, c = float(probs.sum()), 0.0
    for x, p in enumerate(probs.tolist()):
        c += p
        if u * total < c:
            return x
    return max(x for x, p in enumerate(probs.tolist()) if p > 0)


def test_speculative_rule_matches_speculative_accept_on_the_same_draws(monkeypatch):
    from attnbook import serving

    rounds = _rounds()
    data = [(p.tolist(), q.tolist(), d.tolist(), r.tolist(), u) for p, q, d, r, u in rounds]
    got = _node("speculative", "out(D.map(c => W.verify(...c)))", data)
    seen = set()
    for (p, q, draft, r, u), mine in zip(rounds, got):
        captured = {}

        def fake_uniform(shape, *, generator, dtype=None, device=None, r=r):
            return r.to(dtype).reshape(shape)

        def fake_multinomial(probs, n, *, generator, u=u):
            captured["residual"] = probs[0] / probs[0].sum()
            return torch.tensor([[_inverse_cdf(probs[0], u)]])

        monkeypatch.setattr(serving, "uniform", fake_uniform)
        monkeypatch.setattr(serving, "multinomial", fake_multinomial)
        n, token = serving.speculative_accept(p[None], q[None], draft[None].long())
        assert mine["accepted"] == int(n[0])
        assert mine["token"] == int(token[0])
        assert mine["residual"] == pytest.approx(captured["residual"].tolist(), abs=1e-12)
        seen.add("bonus" if int(n[0]) == q.shape[0] else "residual")
    assert seen == {"bonus", "residual"}  # both endings are exercised


def test_a_round_is_reproducible_and_made_of_distributions():
    body = """
    const rng = (seed) => { let a = seed >>> 0; return () => {
      a = (a + 0x6d2b79f5) >>> 0; let t = a; t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61); return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    }; };
    out([1, 2, 3].map(s => [W.makeRound(s, 4, 1.0, rng), W.makeRound(s, 4, 1.0, rng)]));
    """
    for first, again in _node("speculative", body):
        assert first == again
        assert len(first["p"]) == 5 and len(first["q"]) == len(first["draft"]) == 4
        for row in first["p"] + first["q"]:
            assert len(row) == 8 and sum(row) == pytest.approx(1.0)
            assert all(0 <= x <= 1 for x in row)
        assert all(0 <= r < 1 for r in first["r"]) and 0 <= first["u"] < 1
