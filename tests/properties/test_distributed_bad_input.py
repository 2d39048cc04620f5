"""Bad input to attnbook.distributed's collective entry points, on every rank at once.

A wrong argument on one rank of a process group is the dangerous kind: if that rank
raises and the others go on into a collective, they wait for it forever; if shards of
different sizes or dtypes meet in a transfer, gloo aborts the process. So every case
here is a call that every rank of a group makes, each with its own arguments (some
differ from rank to rank: a dtype, a length, an option, an error on one rank only),
and every rank records what its call raised. The parent asserts that every rank raised
the same ``ValueError`` or ``TypeError`` with the same message, naming the function
and the argument: none returned, none raised a raw error, none hung (the launcher's
timeout turns a hang into a failure) and none aborted (the launcher reports a rank
that died without a result).

Spawning is the slow part, so one group of 3 processes runs the whole sweep, on the
world (W = 3, the default group), on a pair of ranks (W = 2) and on each rank alone
(W = 1), through ``group=``. Edge inputs with a documented result (a batch, a local
length, a head count or a value width of 0: an empty output with zero gradients, as
PyTorch's SDPA gives) run there too, and after the sweep one good call of each method,
which must still equal one-process attention: no bad call left a message in flight.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from attnbook.distributed import (
    CommStats,
    attention_on_rank,
    in_turn,
    ring_attention,
    run_on_ranks,
    shard,
    time_on_rank,
    ulysses_attention,
    unshard,
)

WORLDS = (1, 2, 3)
GROUPS = {3: [[0, 1, 2]], 2: [[0, 1]], 1: [[0], [1], [2]]}  # rank 2 sits out W = 2
H, L = 6, 12  # 6 heads split over 1, 2 and 3 ranks; 12 positions over 2 x 3 chunks
RING, ULYSSES = "ring_attention", "ulysses_attention"


def _x(batch=1, heads=H, n=2, dim=3, dtype=torch.float64, **kw) -> torch.Tensor:
    return torch.zeros(batch, heads, n, dim, dtype=dtype, **kw)


def _method(name):
    return {RING: ring_attention, ULYSSES: ulysses_attention}[name]


@dataclass(frozen=True)
class Case:
    """``call(me, world, group)``, made on every rank of a group of ``world`` ranks
    (``me``: the rank within it), must raise on every rank one error of type
    ``error`` whose message contains every needle, the same message everywhere unless
    ``same_message`` is False (the ranks call different functions, whose names begin
    their messages)."""

    name: str
    call: Callable
    needles: tuple[str, ...]
    worlds: tuple[int, ...] = WORLDS
    error: type = ValueError
    same_message: bool = True


def _attention_cases(fn: str) -> list[Case]:
    """The cases of ``ring_attention`` or ``ulysses_attention`` (``fn``)."""
    f = _method(fn)

    def qkv(me=0, **kw):
        return _x(**kw), _x(**kw), _x(**kw)

    def last(me, world):  # the last rank of the group: differs when world > 1
        return me == world - 1

    many = (2, 3)
    cases = [
        # the same mistake on every rank
        Case("q not a tensor", lambda me, w, g: f("q", _x(), _x(), group=g), (fn, "q"),
             error=TypeError),
        Case("integer dtype", lambda me, w, g: f(*qkv(dtype=torch.int64), group=g),
             (fn, "q", "floating"), error=TypeError),
        Case("dtypes differ within a rank", lambda me, w, g: f(
            _x(dtype=torch.float32), _x(), _x(), group=g), (fn, "dtype"), error=TypeError),
        Case("head_dim of q and k", lambda me, w, g: f(_x(), _x(dim=4), _x(), group=g),
             (fn, "head_dim")),
        Case("lengths of k and v", lambda me, w, g: f(_x(), _x(), _x(n=3), group=g),
             (fn, "k and v")),
        Case("lengths of q and k", lambda me, w, g: f(_x(n=4), _x(), _x(), group=g),
             (fn, "q and k", "local length")),
        Case("rank-2 shards", lambda me, w, g: f(*(t[0, 0] for t in qkv()), group=g),
             (fn, "(..., heads, seq, head_dim)")),
        Case("leading dimensions", lambda me, w, g: f(_x(batch=2), _x(), _x(), group=g),
             (fn, "leading dimensions")),
        Case("1 query head, 2 key/value heads", lambda me, w, g: f(
            _x(heads=1), _x(heads=2), _x(heads=2), group=g), (fn, "heads")),
        Case("3 query heads, 2 key/value heads", lambda me, w, g: f(
            _x(heads=3), _x(heads=2), _x(heads=2), group=g), (fn, "heads")),
        Case("head_dim 0", lambda me, w, g: f(*qkv(dim=0), scale=1.0, group=g),
             (fn, "head_dim")),
        Case("NaN scale", lambda me, w, g: f(*qkv(), scale=float("nan"), group=g),
             (fn, "scale")),
        Case("scale a string", lambda me, w, g: f(*qkv(), scale="1", group=g),
             (fn, "scale"), error=TypeError),
        Case("is_causal a string", lambda me, w, g: f(*qkv(), is_causal="yes", group=g),
             (fn, "is_causal"), error=TypeError),
        Case("return_stats 2", lambda me, w, g: f(*qkv(), return_stats=2, group=g),
             (fn, "return_stats"), error=TypeError),
        Case("group a string", lambda me, w, g: f(*qkv(), group="world"), (fn, "group"),
             error=TypeError),
        # the ranks differ
        Case("dtype across ranks", lambda me, w, g: f(*qkv(
            dtype=torch.float32 if last(me, w) else torch.float64), group=g),
            (fn, "dtype", "torch.float32", "torch.float64"), worlds=many),
        Case("length across ranks", lambda me, w, g: f(*qkv(n=4 if last(me, w) else 2),
             group=g), (fn, "L_local", "pad"), worlds=many),
        Case("head_dim across ranks", lambda me, w, g: f(*qkv(dim=4 if last(me, w) else 3),
             group=g), (fn, "shape", "E=4", "E=3"), worlds=many),
        Case("value width across ranks", lambda me, w, g: f(_x(), _x(), _x(
            dim=4 if last(me, w) else 3), group=g), (fn, "shape", "Ev=4"), worlds=many),
        Case("batch across ranks", lambda me, w, g: f(*qkv(batch=2 if last(me, w) else 1),
             group=g), (fn, "shape", "B=2"), worlds=many),
        Case("heads across ranks", lambda me, w, g: f(*qkv(heads=12 if last(me, w) else 6),
             group=g), (fn, "shape", "H=12"), worlds=many),
        Case("device across ranks", lambda me, w, g: f(*qkv(
            device="meta" if last(me, w) else "cpu"), group=g), (fn, "device", "meta"),
            worlds=many),
        Case("requires_grad across ranks", lambda me, w, g: f(*(
            t.requires_grad_(last(me, w)) for t in qkv()), group=g),
            (fn, "requires_grad", "backward"), worlds=many),
        Case("grad mode across ranks", lambda me, w, g: _grad_mode(
            not last(me, w), f, *(t.requires_grad_() for t in qkv()), group=g),
            (fn, "requires_grad"), worlds=many),
        Case("is_causal across ranks", lambda me, w, g: f(*qkv(), is_causal=last(me, w),
             group=g), (fn, "is_causal"), worlds=many),
        Case("scale across ranks", lambda me, w, g: f(*qkv(), scale=1.0 + last(me, w),
             group=g), (fn, "scale"), worlds=many),
        Case("one rank's shards wrong", lambda me, w, g: f(_x(), _x(dim=4 if last(me, w)
             else 3), _x(), group=g), (fn, f"the inputs of rank(s) [", "head_dim"),
             worlds=many),
        Case("one rank's option wrong", lambda me, w, g: f(*qkv(), is_causal="yes" if
             last(me, w) else False, group=g), (fn, "rank(s) [", "is_causal"),
             worlds=many, error=TypeError),
        Case("one rank without q", lambda me, w, g: f(None if last(me, w) else _x(), _x(),
             _x(), group=g), (fn, "rank(s) [", "q must be a torch.Tensor"), worlds=many,
             error=TypeError),
    ]  # fmt: skip
    if fn == RING:
        cases += [
            Case("layout 'striped'", lambda me, w, g: f(*qkv(), layout="striped", group=g),
                 (fn, "layout")),
            Case("zigzag, odd local length", lambda me, w, g: f(*qkv(n=3), layout="zigzag",
                 group=g), (fn, "zigzag", "even")),
            Case("layout across ranks", lambda me, w, g: f(*qkv(), layout="zigzag" if
                 last(me, w) else "contiguous", group=g), (fn, "layout"), worlds=many),
            Case("one rank's layout wrong", lambda me, w, g: f(*qkv(), layout="striped" if
                 last(me, w) else "contiguous", group=g), (fn, "rank(s) [", "layout"),
                 worlds=many),
        ]  # fmt: skip
    else:
        cases += [
            Case("heads the world does not divide", lambda me, w, g: f(*qkv(heads=w + 1),
                 group=g), (fn, "n_heads=", "world size"), worlds=many),
            Case("key/value heads the world does not divide", lambda me, w, g: f(
                _x(), _x(heads=1), _x(heads=1), group=g), (fn, "n_kv_heads=1"),
                worlds=many),
        ]  # fmt: skip
    return cases


def _grad_mode(enabled, f, *args, **kwargs):
    with torch.set_grad_enabled(enabled):
        return f(*args, **kwargs)


def _full(n=L, heads=H, dtype=torch.float64):
    return _x(heads=heads, n=n, dtype=dtype)


def _on_rank(me, w, g, *args, **kwargs):
    """attention_on_rank for rank ``me`` of ``w``: through ``group`` when the group
    is not the world, as the W = 1 and 2 sweeps are."""
    return attention_on_rank(me, w, *args, group=g, **kwargs)


def _other_cases() -> list[Case]:
    """attention_on_rank, time_on_rank (the world only: it takes no group), in_turn,
    shard and unshard."""
    aor, tor = "attention_on_rank", "time_on_rank"
    full = (_full(), _full(), _full())
    grad = _full()
    many = (2, 3)
    timed = functools.partial(time_on_rank, repeat=1)
    return [
        Case("attention_on_rank: method 'tree'", lambda me, w, g: _on_rank(
            me, w, g, *full, method="tree"), (aor, "method")),
        Case("attention_on_rank: ulysses in zigzag", lambda me, w, g: _on_rank(
            me, w, g, *full, method="ulysses", layout="zigzag"), (aor, "contiguous")),
        Case("attention_on_rank: length that does not split", lambda me, w, g: _on_rank(
            me, w, g, *(_full(n=13),) * 3), (aor, "seq_len=13"), worlds=many),
        Case("attention_on_rank: q not a tensor", lambda me, w, g: _on_rank(
            me, w, g, "q", _full(), _full()), (aor, "q"), error=TypeError),
        Case("attention_on_rank: integer tensors with grad_out", lambda me, w, g: _on_rank(
            me, w, g, *(t.long() for t in full), grad), (aor, "q", "floating"),
            error=TypeError),
        Case("attention_on_rank: grad_out of the wrong shape", lambda me, w, g: _on_rank(
            me, w, g, *full, _full(n=6)), (aor, "grad_out")),
        Case("attention_on_rank: group a string", lambda me, w, g: attention_on_rank(
            me, w, *full, group="world"), (aor, "group"), error=TypeError),
        Case("attention_on_rank: methods across ranks", lambda me, w, g: _on_rank(
            me, w, g, *full, method="ring" if me == 0 else "ulysses"),
            ("function", RING, ULYSSES), worlds=many, same_message=False),
        Case("attention_on_rank: one rank's length does not split", lambda me, w, g:
             _on_rank(me, w, g, *(_full(n=13 if me == 0 else L),) * 3),
             (aor, "rank(s) [0]", "seq_len=13"), worlds=many),
        Case("attention_on_rank: lengths across ranks", lambda me, w, g: _on_rank(
            me, w, g, *(_full(n=2 * L if me == 0 else L),) * 3), (RING, "L_local"),
            worlds=many),
        Case("attention_on_rank: grad_out on one rank only", lambda me, w, g: _on_rank(
            me, w, g, *full, grad if me == 0 else None), (RING, "requires_grad"),
            worlds=many),
        Case("attention_on_rank: world_size not the group's", lambda me, w, g:
             attention_on_rank(me, 2, *full), (aor, "rank"), worlds=(3,)),
        Case("time_on_rank: method 'tree'", lambda me, w, g: timed(
            me, w, *full, method="tree"), (tor, "method"), worlds=(3,)),
        Case("time_on_rank: ulysses in zigzag", lambda me, w, g: timed(
            me, w, *full, method="ulysses", layout="zigzag"), (tor, "contiguous"),
            worlds=(3,)),
        Case("time_on_rank: repeat 0", lambda me, w, g: time_on_rank(
            me, w, *full, repeat=0), (tor, "repeat"), worlds=(3,)),
        Case("time_on_rank: world_size not the group's", lambda me, w, g: timed(
            me, 2, *full), (tor, "rank"), worlds=(3,)),
        Case("time_on_rank: one rank's length does not split", lambda me, w, g: timed(
            me, w, *(_full(n=13 if me == 0 else L),) * 3), (tor, "rank(s) [0]", "seq_len"),
            worlds=(3,)),
        Case("time_on_rank: lengths across ranks", lambda me, w, g: timed(
            me, w, *(_full(n=2 * L if me == 0 else L),) * 3), (RING, "L_local"),
            worlds=(3,)),
        Case("time_on_rank: q not a tensor", lambda me, w, g: timed(
            me, w, None, _full(), _full()), (tor, "q"), worlds=(3,), error=TypeError),
        Case("in_turn: rank out of range", lambda me, w, g: in_turn(w, w), ("in_turn", "rank")),
        Case("in_turn: a function that is not one", lambda me, w, g: in_turn(me, w, "f"),
             ("in_turn", "fns"), error=TypeError),
        Case("shard: rank out of range", lambda me, w, g: shard(_full(), w, w),
             ("shard_positions", "rank")),
        Case("unshard: shards of two shapes", lambda me, w, g: unshard(
            [_full(), _full(heads=2)]), ("unshard", "one shape")),
    ]  # fmt: skip


CASES = {f"{fn}: {c.name}": c for fn in (RING, ULYSSES) for c in _attention_cases(fn)}
CASES |= {c.name: c for c in _other_cases()}

# Edge inputs with a documented result: an empty output (..., H, n, Ev), as SDPA gives,
# zero gradients and no communication. (q heads, k/v heads, batch, n, E, Ev)
EDGES = {
    "batch 0": (H, H, 0, 2, 3, 2),
    "local length 0": (H, H, 1, 0, 3, 2),
    "value width 0": (H, H, 1, 2, 3, 0),
    "no heads": (0, 0, 1, 2, 3, 2),
    "no query heads, one key/value head": (0, 1, 1, 2, 3, 2),
}


def _edge_runs():
    """(W, method, edge) for every edge each method takes on W ranks: Ulysses splits
    the key/value heads, so it refuses one key/value head on 2 or 3 ranks (a case of
    the sweep)."""
    return [(w, method, key) for w in WORLDS for key, shapes in EDGES.items()
            for method in (RING, ULYSSES) if method == RING or shapes[1] % w == 0]  # fmt: skip


def _edge_inputs(shapes):
    hq, hk, batch, n, e, ev = shapes
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(batch, h, n, d, generator=gen, dtype=torch.float64).requires_grad_()
            for h, d in ((hq, e), (hk, e), (hk, ev))]  # fmt: skip


def _edge(method, shapes, group) -> dict:
    q, k, v = _edge_inputs(shapes)
    out, stats = _method(method)(q, k, v, is_causal=True, group=group, return_stats=True)
    out.backward(torch.ones_like(out))
    return {
        "shape": tuple(out.shape),
        "dtype": out.dtype,
        "grads": [(tuple(t.grad.shape), bool((t.grad == 0).all())) for t in (q, k, v)],
        "stats": stats,
    }


def _good(me, w, group) -> dict:
    """One good call of each method after the sweep: its shards of the output and of
    dq."""
    gen = torch.Generator().manual_seed(1)
    q, k, v, grad = (torch.randn(1, H, L, 3, generator=gen, dtype=torch.float64)
                     for _ in range(4))  # fmt: skip
    found = {}
    for method in ("ring", "ulysses"):
        r = attention_on_rank(me, w, q, k, v, grad, method=method, is_causal=True,
                              group=group)  # fmt: skip
        found[method] = (r["out"], r["dq"])
    return found


def _outcome(call) -> tuple[str, str]:
    try:
        result = call()
    except Exception as e:  # every kind is recorded: the parent judges
        return type(e).__name__, str(e)
    return "returned", type(result).__name__


def _sweep(rank, world_size) -> dict:
    """Every case on W = 3 (the default group), 2 (ranks 0 and 1) and 1 (each rank
    alone), then the edges and the good calls."""
    pairs = [dist.new_group(m) for m in GROUPS[2]]  # every rank creates every group
    alone = [dist.new_group(m) for m in GROUPS[1]]
    groups = {3: None, 2: pairs[0], 1: alone[rank]}
    found = {}
    for w, group in groups.items():
        if group is dist.GroupMember.NON_GROUP_MEMBER:  # rank 2 sits out W = 2
            q = _x()
            found["not a member"] = _outcome(lambda: ring_attention(q, q, q, group=group))
            continue
        me = dist.get_rank(group)
        for key, case in CASES.items():
            if w in case.worlds:
                found[w, key] = _outcome(lambda: case.call(me, w, group))
        for w_edge, method, key in _edge_runs():
            if w_edge == w:
                found[w, method, key] = _edge(method, EDGES[key], group)
        found[w, "good"] = _good(me, w, group)
    return found


@pytest.fixture(scope="module")
def sweep():
    # a hang fails the run after 60 s (the launcher and gloo both time out)
    return run_on_ranks(_sweep, 3, timeout=60)


@pytest.mark.parametrize(
    "w, key", [(w, key) for key, case in CASES.items() for w in case.worlds],
    ids=lambda x: f"W{x}" if isinstance(x, int) else x,
)  # fmt: skip
def test_every_rank_raises_the_same_clear_error(sweep, w, key):
    case = CASES[key]
    for members in GROUPS[w]:
        outcomes = [sweep[r][w, key] for r in members]
        for r, (kind, message) in zip(members, outcomes):
            assert kind == case.error.__name__, f"rank {r}: {kind}: {message}"
            missing = [n for n in case.needles if n not in message]
            assert not missing, f"rank {r}: {message!r} does not name {missing}"
        if case.same_message:
            assert len({m for _, m in outcomes}) == 1, outcomes


def test_a_rank_outside_the_group_is_told_so(sweep):
    """Rank 2 passes the group of ranks 0 and 1: it raises alone, as it must (the pair
    has its own call to make)."""
    kind, message = sweep[2]["not a member"]
    assert kind == "ValueError"
    assert message.startswith("ring_attention: this process is not a member of group")


@pytest.mark.parametrize("w, method, key", _edge_runs())
def test_empty_inputs_give_an_empty_output_and_zero_gradients(sweep, w, method, key):
    q, k, v = _edge_inputs(EDGES[key])  # PyTorch's answer on the shards: empty, grads 0
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    expected.backward(torch.ones_like(expected))
    for members in GROUPS[w]:
        for r in members:
            found = sweep[r][w, method, key]
            assert found["shape"] == tuple(expected.shape) == (*q.shape[:-1], v.shape[-1])
            assert found["dtype"] == expected.dtype
            assert found["grads"] == [
                (tuple(t.grad.shape), bool((t.grad == 0).all())) for t in (q, k, v)]
            assert all(zero for _, zero in found["grads"])
            assert found["stats"] == CommStats()  # no block, no byte


@pytest.mark.parametrize("w", WORLDS)
def test_the_groups_still_work_after_the_sweep(sweep, w):
    gen = torch.Generator().manual_seed(1)
    q, k, v, grad = (torch.randn(1, H, L, 3, generator=gen, dtype=torch.float64)
                     for _ in range(4))  # fmt: skip
    q.requires_grad_()
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref.backward(grad)
    for members in GROUPS[w]:
        for method in ("ring", "ulysses"):
            out = unshard([sweep[r][w, "good"][method][0] for r in members])
            dq = unshard([sweep[r][w, "good"][method][1] for r in members])
            torch.testing.assert_close(out, ref.detach(), atol=1e-12, rtol=0)
            torch.testing.assert_close(dq, q.grad, atol=1e-12, rtol=0)
