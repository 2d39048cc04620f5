"""Stateful paths under hypothesis state machines (issue 23, deliverable 5).

Every machine drives one stateful object of attnbook through random sequences of its
operations and, after every step, compares it with a plain Python model recomputed from
scratch:

* the KV caches of :mod:`attnbook.kvcache` and :mod:`attnbook.serving` (appending,
  the decode hot path's static slots, sliding window, attention sinks, quantized,
  latent, paged) against the list of every ``(k, v)`` appended so far, from which the
  visible positions are recomputed;
* the paged serving engine :class:`attnbook.serving.PagedModel` against the model run
  on each whole sequence without a cache;
* the recurrent state of linear attention and of the delta rule
  (:mod:`attnbook.linear`) against causal linear attention of the whole prefix;
* the decoders: :class:`attnbook.rnn.Seq2Seq` stepped token by token against teacher
  forcing on the whole prefix, and :class:`attnbook.models.TinyGPT` fed chunks with a
  cache against the whole prefix without one.

The modules under test are imported inside the machines (several are edited
concurrently), so a broken import fails only the machines that need it.

Settings are local to each machine's ``TestCase`` (nothing is registered globally):
``ATTNBOOK_HYPOTHESIS=ci`` (the default) is derandomized and small, the whole file a few
seconds on one core; ``ATTNBOOK_HYPOTHESIS=thorough`` runs many more and longer random
programs.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

F64 = torch.float64
PROFILE = os.environ.get("ATTNBOOK_HYPOTHESIS", "ci")
if PROFILE not in ("ci", "thorough"):
    raise ValueError(f"ATTNBOOK_HYPOTHESIS must be 'ci' or 'thorough', got {PROFILE!r}")


def machine_settings(max_examples: int, steps: int) -> settings:
    """The settings of one machine: ``ci`` as given, ``thorough`` 20 times the programs,
    3 times as long, not derandomized."""
    common = dict(deadline=None, suppress_health_check=list(HealthCheck))
    if PROFILE == "thorough":
        return settings(
            max_examples=20 * max_examples,
            stateful_step_count=3 * steps,
            derandomize=False,
            database=None,
            **common,
        )
    return settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        derandomize=True,
        database=None,
        **common,
    )


def randn(seed: int, *shape, dtype=F64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def close(actual, expected, *, atol=1e-10, rtol=1e-10, msg=None):
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, msg=msg)


# decode_attention's torch path runs its splits in fp32 (documented): compare with that
DECODE_TOL = dict(atol=2e-5, rtol=2e-5)


def stack_positions(entries: list[torch.Tensor], empty_shape) -> torch.Tensor:
    """Per-position tensors ``(..., D)`` stacked on the position axis ``-2``."""
    if not entries:
        return torch.zeros(*empty_shape, dtype=F64)
    return torch.stack(entries, dim=-2)


def dense_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query per sequence, softmax over every key, written out: ``q (B, H, D)``,
    ``k``, ``v`` ``(B, Hk, n, D)`` -> ``(B, H, D)``; zeros for ``n = 0``."""
    B, H, D = q.shape
    if k.shape[-2] == 0:
        return torch.zeros(B, H, v.shape[-1], dtype=q.dtype)
    group = H // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    p = torch.softmax(torch.einsum("bhd,bhnd->bhn", q, k) / math.sqrt(D), dim=-1)
    return torch.einsum("bhn,bhnd->bhd", p, v)


def run_decode(q, k_cache, v_cache, lengths):
    """:func:`attnbook.kvcache.decode_attention` for ``q (B, H, D)``."""
    from attnbook.kvcache import decode_attention

    seqlens = torch.tensor(lengths, dtype=torch.int32)
    return decode_attention(q[:, :, None], k_cache, v_cache, seqlens)[:, :, 0]


def bad_layers(n_layers: int):
    """Layer indices a cache of ``n_layers`` must refuse: negative (a list would read
    another layer), past the last, and not integers at all."""
    return st.one_of(
        st.integers(-4, -1),
        st.integers(n_layers, n_layers + 3),
        st.sampled_from([0.0, 1.5, True, False, "0", None]),
    )


def refuses_layer(call, layer) -> None:
    """``call(layer)`` raises ``ValueError`` or ``TypeError`` naming ``layer``."""
    with pytest.raises((ValueError, TypeError), match="layer"):
        call(layer)


# ======================================================================================
# 1. KV caches
# ======================================================================================
class AppendCacheMachine(RuleBasedStateMachine):
    """A cache that appends per layer up to ``max_len`` (:class:`KVCache`): what
    ``update`` returns and what the buffers hold equal, per layer, every position
    appended since the last reset or rollback; ``CacheFullError`` exactly when
    ``length + T > max_len``, leaving the cache as it was."""

    D = 3  # head_dim

    @initialize(
        n_layers=st.integers(1, 3),
        batch=st.integers(1, 2),
        kv_heads=st.sampled_from([1, 2]),
        max_len=st.integers(1, 10),
    )
    def make(self, n_layers, batch, kv_heads, max_len):
        self.n_layers, self.B, self.Hk, self.max_len = n_layers, batch, kv_heads, max_len
        self.cache = self.new_cache()
        self.model = [[] for _ in range(n_layers)]  # per layer: one (k, v) per position

    def new_cache(self):
        from attnbook.kvcache import KVCache

        return KVCache(self.n_layers, self.B, self.Hk, self.D, self.max_len, dtype=F64)

    def entries(self, seed, T):
        """``T`` new positions as the cache's ``update`` takes them."""
        return randn(seed, self.B, self.Hk, T, self.D), randn(seed + 1, self.B, self.Hk, T, self.D)

    def split(self, k, v):
        """The per-position model entries of an update's arguments."""
        return [(k[..., t, :], v[..., t, :]) for t in range(k.shape[-2])]

    def expected(self, layer):
        shape = (self.B, self.Hk, 0, self.D)
        held = self.model[layer]
        return (
            stack_positions([k for k, _ in held], shape),
            stack_positions([v for _, v in held], shape),
        )

    def stored(self, layer):
        n = self.cache.lengths[layer]
        return self.cache.k[layer, :, :, :n], self.cache.v[layer, :, :, :n]

    def _append(self, layer, T, seed):
        from attnbook.kvcache import CacheFullError

        k, v = self.entries(seed + 1000 * layer, T)
        if len(self.model[layer]) + T > self.max_len:
            with pytest.raises(CacheFullError, match="max_len"):
                self.cache.update(layer, k, v)
            return
        returned = self.cache.update(layer, k, v)
        self.model[layer] += self.split(k, v)
        for got, want in zip(returned, self.expected(layer)):
            assert torch.equal(got, want)

    @rule(T=st.integers(1, 5), seed=st.integers(0, 10**6))
    def append_every_layer(self, T, seed):
        """A forward pass: every layer in order appends the same number of positions."""
        for layer in range(self.n_layers):
            self._append(layer, T, seed)

    @rule(layer=st.integers(0, 2), T=st.integers(1, 5), seed=st.integers(0, 10**6))
    def append_one_layer(self, layer, T, seed):
        self._append(layer % self.n_layers, T, seed)

    @rule(layer=st.integers(0, 2), seed=st.integers(0, 10**6), group=st.sampled_from([1, 2]))
    def decode(self, layer, seed, group):
        """One query token per sequence attends to everything ``layer`` holds."""
        layer %= self.n_layers
        q = randn(seed, self.B, self.Hk * group, self.D)
        keys, values = self.expected(layer)
        out = run_decode(q, self.cache.k[layer], self.cache.v[layer], [keys.shape[-2]] * self.B)
        close(out, dense_decode(q, keys, values), **DECODE_TOL)

    @rule(bad=st.sampled_from(["T=0", "layer", "bool layer", "shape", "k != v"]))
    def reject_bad_update(self, bad):
        """A bad update is a ValueError and changes nothing (the invariants check)."""
        k, v = self.entries(0, 1)
        layer = 0
        if bad == "T=0":
            k, v = k[..., :0, :], v[..., :0, :]
        elif bad == "layer":
            layer = self.n_layers
        elif bad == "bool layer":
            layer = False
        elif bad == "shape":
            k, v = k[..., :-1], v[..., :-1]
        else:
            v = torch.cat((v, v), dim=-2)
        with pytest.raises(ValueError):
            self.cache.update(layer, k, v)

    @rule(data=st.data())
    def reject_bad_layer(self, data):
        """Any layer outside ``[0, n_layers)`` or not an int: refused, nothing changes."""
        k, v = self.entries(0, 1)
        layer = data.draw(bad_layers(self.n_layers), label="layer")
        refuses_layer(lambda bad: self.cache.update(bad, k, v), layer)

    @rule(seed=st.integers(0, 10**6))
    def rollback(self, seed):
        """``truncate_cache`` (a rejected draft): every layer back to ``length``
        positions, ``0 <= length <= cache.length``."""
        from attnbook.serving import truncate_cache

        length = seed % (self.cache.length + 1)
        truncate_cache(self.cache, length)
        self.model = [held[:length] for held in self.model]

    @rule()
    def reset(self):
        self.cache.reset()
        self.model = [[] for _ in range(self.n_layers)]

    @invariant()
    def holds_what_was_appended(self):
        lengths = [len(held) for held in self.model]
        assert list(self.cache.lengths) == lengths
        assert self.cache.length == min(lengths)
        for layer in range(self.n_layers):
            for got, want in zip(self.stored(layer), self.expected(layer)):
                assert torch.equal(got, want)


TestKVCacheMachine = AppendCacheMachine.TestCase
TestKVCacheMachine.settings = machine_settings(15, 12)


class LatentCacheMachine(AppendCacheMachine):
    """:class:`attnbook.serving.LatentKVCache`: the same rules, latents ``(B, T, d_c)``
    and rotary keys ``(B, T, d_R)`` instead of per-head keys and values."""

    D, R = 3, 2

    def new_cache(self):
        from attnbook.serving import LatentKVCache

        return LatentKVCache(self.n_layers, self.B, self.D, self.R, self.max_len, dtype=F64)

    def entries(self, seed, T):
        return randn(seed, self.B, T, self.D), randn(seed + 1, self.B, T, self.R)

    def split(self, c, r):
        return [(c[:, t], r[:, t]) for t in range(c.shape[1])]

    def expected(self, layer):
        held = self.model[layer]
        if not held:
            empty = torch.zeros(self.B, 0, self.D + self.R, dtype=F64)
            return empty[..., : self.D], empty[..., self.D :]
        return torch.stack([c for c, _ in held], 1), torch.stack([r for _, r in held], 1)

    def stored(self, layer):
        n = self.cache.lengths[layer]
        return self.cache.c_kv[layer, :, :n], self.cache.k_rope[layer, :, :n]

    @rule(bad=st.sampled_from(["T=0", "layer", "bool layer", "shape"]))
    def reject_bad_update(self, bad):
        c, r = self.entries(0, 1)
        layer = 0
        if bad == "T=0":
            c, r = c[:, :0], r[:, :0]
        elif bad == "layer":
            layer = self.n_layers
        elif bad == "bool layer":
            layer = False
        else:
            c = c[..., :-1]
        with pytest.raises(ValueError):
            self.cache.update(layer, c, r)

    @rule(data=st.data())
    def reject_bad_layer(self, data):
        """Any layer outside ``[0, n_layers)`` or not an int: refused, nothing changes."""
        c, r = self.entries(0, 1)
        layer = data.draw(bad_layers(self.n_layers), label="layer")
        refuses_layer(lambda bad: self.cache.update(bad, c, r), layer)

    # no per-head keys to decode against
    decode = None


TestLatentCacheMachine = LatentCacheMachine.TestCase
TestLatentCacheMachine.settings = machine_settings(10, 12)


class StaticCacheMachine(RuleBasedStateMachine):
    """The decode hot path's cache (:class:`StaticKVCache`): buffers of ``max_len``
    slots written in place at the slots ``seek`` or ``advance`` chose. After every step
    the buffers hold, per layer and slot, the last ``(k, v)`` written there (zeros
    where nothing was), ``mask(real)`` lets the query in slot ``s`` see exactly the
    earlier or own slots that are real (and always its own), and attention under that
    mask equals a softmax over those keys written out. ``CacheFullError`` exactly when
    the slots would pass ``max_len``, a wrong update a ``ValueError``, and neither
    changes anything."""

    D = 3

    @initialize(
        n_layers=st.integers(1, 3),
        batch=st.integers(1, 2),
        kv_heads=st.sampled_from([1, 2]),
        max_len=st.integers(1, 9),
    )
    def make(self, n_layers, batch, kv_heads, max_len):
        from attnbook.kvcache import StaticKVCache

        self.n_layers, self.B, self.Hk, self.max_len = n_layers, batch, kv_heads, max_len
        self.cache = StaticKVCache(n_layers, batch, kv_heads, self.D, max_len, dtype=F64)
        self.written = [{} for _ in range(n_layers)]  # per layer: slot -> (k, v)
        self.start, self.count = 0, 1  # the slots the next update writes

    def slots(self):
        return list(range(self.start, self.start + self.count))

    @rule(start=st.integers(0, 10), count=st.integers(1, 4))
    def seek(self, start, count):
        from attnbook.kvcache import CacheFullError

        if start + count > self.max_len:
            with pytest.raises(CacheFullError, match="max_len"):
                self.cache.seek(start, count)
            return
        self.cache.seek(start, count)
        self.start, self.count = start, count

    @rule()
    def advance(self):
        from attnbook.kvcache import CacheFullError

        if self.start + 2 * self.count > self.max_len:
            with pytest.raises(CacheFullError, match="max_len"):
                self.cache.advance()
            return
        self.cache.advance()
        self.start += self.count

    @rule(layer=st.integers(0, 2), seed=st.integers(0, 10**6))
    def update(self, layer, seed):
        layer %= self.n_layers
        shape = (self.B, self.Hk, self.count, self.D)
        k, v = randn(seed, *shape), randn(seed + 1, *shape)
        keys, values = self.cache.update(layer, k, v)
        assert keys is self.cache.k[layer] and values is self.cache.v[layer]  # in place
        for t, slot in enumerate(self.slots()):
            self.written[layer][slot] = (k[..., t, :], v[..., t, :])

    @rule(bad=st.sampled_from(["T", "layer", "shape", "dtype"]), seed=st.integers(0, 99))
    def reject_bad_update(self, bad, seed):
        T, layer, D, dtype = self.count, 0, self.D, F64
        if bad == "T":
            T += 1
        elif bad == "layer":
            layer = self.n_layers
        elif bad == "shape":
            D += 1
        else:
            dtype = torch.int64
        k = randn(seed, self.B, self.Hk, T, D).to(dtype)
        with pytest.raises((ValueError, TypeError)):
            self.cache.update(layer, k, k.clone())

    @rule(data=st.data())
    def reject_bad_layer(self, data):
        """Any layer outside ``[0, n_layers)`` or not an int: refused, nothing changes."""
        shape = (self.B, self.Hk, self.count, self.D)
        k = randn(0, *shape)
        layer = data.draw(bad_layers(self.n_layers), label="layer")
        refuses_layer(lambda bad: self.cache.update(bad, k, k), layer)

    def visible(self, real):
        """Bool ``(B, count, max_len)``, written out slot by slot."""
        out = torch.zeros(self.B, self.count, self.max_len, dtype=torch.bool)
        for b in range(self.B):
            for i, slot in enumerate(self.slots()):
                for key in range(self.max_len):
                    ok = real is None or bool(real[b, key]) or key == slot
                    out[b, i, key] = key <= slot and ok
        return out

    @rule(seed=st.integers(0, 10**6), padded=st.booleans(), layer=st.integers(0, 2))
    def attend(self, seed, padded, layer):
        """The mask, and attention under it over one layer's buffers."""
        layer %= self.n_layers
        real = None
        if padded:
            real = torch.rand(self.B, self.max_len, generator=torch.Generator().manual_seed(seed)) > 0.4
        mask = self.cache.mask(real)
        want = self.visible(real)
        assert mask.dtype == torch.bool and mask.shape[1:] == (1, self.count, self.max_len)
        assert torch.equal(mask[:, 0].expand(self.B, -1, -1), want)
        q = randn(seed + 2, self.B, self.Hk, self.count, self.D)
        got = torch.nn.functional.scaled_dot_product_attention(
            q, self.cache.k[layer], self.cache.v[layer], mask
        )
        for b in range(self.B):
            for i in range(self.count):
                keys = want[b, i].nonzero().flatten().tolist()
                zero = torch.zeros(self.Hk, self.D, dtype=F64)
                held = [self.written[layer].get(s) for s in keys]
                k = torch.stack([h[0][b] if h else zero for h in held], dim=-2)
                v = torch.stack([h[1][b] if h else zero for h in held], dim=-2)
                p = torch.softmax(k @ q[b, :, i, :, None] / math.sqrt(self.D), dim=-2)
                close(got[b, :, i], (p * v).sum(-2))

    @invariant()
    def holds_what_was_written(self):
        assert self.cache.slots.tolist() == self.slots() and self.cache.length == self.start
        for layer in range(self.n_layers):
            for slot in range(self.max_len):
                k, v = self.cache.k[layer][:, :, slot], self.cache.v[layer][:, :, slot]
                if slot in self.written[layer]:
                    assert torch.equal(k, self.written[layer][slot][0])
                    assert torch.equal(v, self.written[layer][slot][1])
                else:
                    assert not k.any() and not v.any()


TestStaticCacheMachine = StaticCacheMachine.TestCase
TestStaticCacheMachine.settings = machine_settings(15, 12)


class RingCacheMachine(RuleBasedStateMachine):
    """A cache that keeps a recent window and never overflows: ``length`` counts every
    position ever appended; what it holds and returns is recomputed from the list of all
    positions. This class: :class:`SlidingWindowKVCache`, holding the last ``window``
    positions; ``update`` returns the held ones followed by all ``T`` new ones."""

    D = 3

    @initialize(
        n_layers=st.integers(1, 2),
        batch=st.integers(1, 2),
        kv_heads=st.sampled_from([1, 2]),
        window=st.integers(1, 5),
        n_sink=st.integers(0, 3),
    )
    def make(self, n_layers, batch, kv_heads, window, n_sink):
        self.n_layers, self.B, self.Hk = n_layers, batch, kv_heads
        self.window, self.n_sink = window, n_sink
        self.cache = self.new_cache()
        self.model = [[] for _ in range(n_layers)]

    def new_cache(self):
        from attnbook.kvcache import SlidingWindowKVCache

        return SlidingWindowKVCache(self.n_layers, self.B, self.Hk, self.D, self.window, dtype=F64)

    def held_positions(self, n):
        return list(range(max(0, n - self.window), n))

    def returned_positions(self, n, T):
        """Positions ``update`` returns when ``n`` were held and ``T`` arrive."""
        return self.held_positions(n) + list(range(n, n + T))

    def select(self, layer, positions):
        shape = (self.B, self.Hk, 0, self.D)
        held = self.model[layer]
        return (
            stack_positions([held[p][0] for p in positions], shape),
            stack_positions([held[p][1] for p in positions], shape),
        )

    def _append(self, layer, T, seed):
        k = randn(seed + 1000 * layer, self.B, self.Hk, T, self.D)
        v = randn(seed + 1000 * layer + 1, self.B, self.Hk, T, self.D)
        n = len(self.model[layer])
        returned = self.cache.update(layer, k, v)
        self.model[layer] += [(k[..., t, :], v[..., t, :]) for t in range(T)]
        for got, want in zip(returned, self.select(layer, self.returned_positions(n, T))):
            assert torch.equal(got, want)

    @rule(T=st.integers(1, 8), seed=st.integers(0, 10**6))
    def append_every_layer(self, T, seed):
        for layer in range(self.n_layers):
            self._append(layer, T, seed)

    @rule(layer=st.integers(0, 1), T=st.integers(1, 8), seed=st.integers(0, 10**6))
    def append_one_layer(self, layer, T, seed):
        self._append(layer % self.n_layers, T, seed)

    @rule(layer=st.integers(0, 1), seed=st.integers(0, 10**6), group=st.sampled_from([1, 2]))
    def decode(self, layer, seed, group):
        """The newest position's query attends to what the cache holds: exactly the keys
        its window (and the sinks) let it see."""
        layer %= self.n_layers
        q = randn(seed, self.B, self.Hk * group, self.D)
        k_held, v_held = self.cache.retained(layer)
        keys, values = self.select(layer, self.held_positions(len(self.model[layer])))
        out = run_decode(q, k_held.contiguous(), v_held.contiguous(), [keys.shape[-2]] * self.B)
        close(out, dense_decode(q, keys, values), **DECODE_TOL)

    @rule(data=st.data())
    def reject_bad_layer(self, data):
        """Any layer outside ``[0, n_layers)`` or not an int: refused, nothing changes."""
        k = randn(0, self.B, self.Hk, 1, self.D)
        layer = data.draw(bad_layers(self.n_layers), label="layer")
        refuses_layer(lambda bad: self.cache.update(bad, k, k), layer)

    @rule()
    def rollback_is_refused(self):
        """A cache that overwrote old positions cannot roll back."""
        from attnbook.serving import truncate_cache

        with pytest.raises(TypeError):
            truncate_cache(self.cache, 0)

    @rule()
    def reset(self):
        self.cache.reset()
        self.model = [[] for _ in range(self.n_layers)]

    @invariant()
    def holds_the_recent_positions(self):
        assert list(self.cache.lengths) == [len(held) for held in self.model]
        for layer in range(self.n_layers):
            want = self.select(layer, self.held_positions(len(self.model[layer])))
            for got, expected in zip(self.cache.retained(layer), want):
                assert torch.equal(got, expected)


TestSlidingWindowMachine = RingCacheMachine.TestCase
TestSlidingWindowMachine.settings = machine_settings(12, 12)


class SinkCacheMachine(RingCacheMachine):
    """:class:`attnbook.serving.SinkKVCache`: holds the first ``n_sink`` positions and
    the last ``window``; ``update`` returns the sinks and the last ``max(window, T)``
    positions including the new ones."""

    def new_cache(self):
        from attnbook.serving import SinkKVCache

        return SinkKVCache(
            self.n_layers, self.B, self.Hk, self.D, self.n_sink, self.window, dtype=F64
        )

    def held_positions(self, n):
        sinks = list(range(min(self.n_sink, n)))
        return sinks + [p for p in range(max(0, n - self.window), n) if p >= self.n_sink]

    def returned_positions(self, n, T):
        N = n + T
        sinks = list(range(min(self.n_sink, N)))
        return sinks + [p for p in range(max(0, N - max(self.window, T)), N) if p >= self.n_sink]

    @rule(data=st.data())
    def reject_bad_layer(self, data):
        """``update``, ``positions`` and ``retained`` refuse a layer outside ``[0,
        n_layers)`` or not an int (``-1`` read the last layer's data, a layer past the
        end raised IndexError); nothing changes."""
        k = randn(0, self.B, self.Hk, 1, self.D)
        layer = data.draw(bad_layers(self.n_layers), label="layer")
        refuses_layer(lambda bad: self.cache.update(bad, k, k), layer)
        refuses_layer(self.cache.positions, layer)
        refuses_layer(self.cache.retained, layer)

    @rule(bad=st.sampled_from(["int k", "int v", "T=0", "shape"]))
    def reject_bad_update(self, bad):
        """What ``KVCache.update`` refuses (integer tensors were cast silently)."""
        k, v = randn(0, self.B, self.Hk, 1, self.D), randn(1, self.B, self.Hk, 1, self.D)
        if bad == "int k":
            k = k.long()
        elif bad == "int v":
            v = v.to(torch.int32)
        elif bad == "T=0":
            k, v = k[..., :0, :], v[..., :0, :]
        else:
            k, v = k[..., :-1], v[..., :-1]
        with pytest.raises((ValueError, TypeError), match="k_new|v_new"):
            self.cache.update(0, k, v)

    @invariant()
    def positions_are_the_sinks_and_the_window(self):
        for layer in range(self.n_layers):
            want = self.held_positions(len(self.model[layer]))
            assert self.cache.positions(layer).tolist() == want
            assert len(want) <= self.n_sink + self.window


TestSinkCacheMachine = SinkCacheMachine.TestCase
TestSinkCacheMachine.settings = machine_settings(12, 12)


def fake_quantize(x: torch.Tensor, bits: int, dim: int, group: int):
    """Round-to-nearest asymmetric quantization written out: each group of ``group``
    consecutive entries along ``dim`` -> ``(dequantized x, the group's scale broadcast
    back to x's shape)``."""
    levels = 2**bits - 1
    moved = x.movedim(dim, -1)
    g = moved.unflatten(-1, (moved.shape[-1] // group, group))
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = (hi - lo) / levels
    codes = torch.round((g - lo) / torch.where(scale > 0, scale, torch.ones_like(scale)))
    codes = codes.clamp(0, levels)
    back = (codes * scale + lo).flatten(-2).movedim(-1, dim)
    scale = scale.expand_as(g).flatten(-2).movedim(-1, dim)
    return back, scale


class QuantizedCacheMachine(RuleBasedStateMachine):
    """:class:`attnbook.serving.QuantizedKVCache` against a model that keeps every
    position in full precision and quantizes the way the docstring says: per-channel
    groups of ``group_size`` whole tokens (aligned on multiples of ``group_size``,
    the partial last group kept exact), per-token groups of ``group_size`` channels
    at once. The dequantized contents equal the model's and lie within half a
    quantization step of the true values; ``nbytes`` counts codes, scales, zeros and
    residual."""

    @initialize(
        n_layers=st.integers(1, 2),
        kv_heads=st.sampled_from([1, 2]),
        head_dim=st.sampled_from([5, 6]),
        bits=st.sampled_from([4, 8]),
        key_axis=st.sampled_from(["channel", "token"]),
        value_axis=st.sampled_from(["channel", "token"]),
        max_len=st.integers(1, 14),
        data=st.data(),
    )
    def make(self, n_layers, kv_heads, head_dim, bits, key_axis, value_axis, max_len, data):
        from attnbook.serving import QuantizedKVCache

        if "token" in (key_axis, value_axis):
            groups = [g for g in range(1, head_dim + 1) if head_dim % g == 0]
        else:
            groups = list(range(1, 5))
        self.G = data.draw(st.sampled_from(groups), label="group_size")
        self.n_layers, self.Hk, self.D, self.bits = n_layers, kv_heads, head_dim, bits
        self.axes = {"k": key_axis, "v": value_axis}
        self.max_len = max_len
        self.cache = QuantizedKVCache(
            n_layers, 1, kv_heads, head_dim, max_len, bits=bits, group_size=self.G,
            key_axis=key_axis, value_axis=value_axis, dtype=F64,
        )
        self.model = [{"k": [], "v": []} for _ in range(n_layers)]

    def exact(self, layer, name):
        held = self.model[layer][name]
        return stack_positions(held, (1, self.Hk, 0, self.D))

    def expected(self, layer, name):
        """``(dequantized contents, bound on the error of each entry)``."""
        x = self.exact(layer, name)
        n = x.shape[-2]
        if self.axes[name] == "token":
            if n == 0:
                return x, torch.zeros_like(x)
            return fake_quantize(x, self.bits, -1, self.G)
        full = n // self.G * self.G
        if full == 0:
            return x, torch.zeros_like(x)
        back, scale = fake_quantize(x[..., :full, :], self.bits, -2, self.G)
        rest = x[..., full:, :]
        return torch.cat((back, rest), -2), torch.cat((scale, torch.zeros_like(rest)), -2)

    def check(self, returned, layer):
        for got, name in zip(returned, ("k", "v")):
            want, scale = self.expected(layer, name)
            close(got, want, atol=1e-12, rtol=1e-12, msg=f"{name} of layer {layer}")
            error = (got - self.exact(layer, name)).abs()
            assert (error <= scale / 2 + 1e-12).all()

    def _append(self, layer, T, seed):
        from attnbook.kvcache import CacheFullError

        k = randn(seed + 1000 * layer, 1, self.Hk, T, self.D)
        v = randn(seed + 1000 * layer + 1, 1, self.Hk, T, self.D) * 3
        if len(self.model[layer]["k"]) + T > self.max_len:
            with pytest.raises(CacheFullError, match="max_len"):
                self.cache.update(layer, k, v)
            return
        returned = self.cache.update(layer, k, v)
        self.model[layer]["k"] += [k[..., t, :] for t in range(T)]
        self.model[layer]["v"] += [v[..., t, :] for t in range(T)]
        self.check(returned, layer)

    @rule(T=st.integers(1, 7), seed=st.integers(0, 10**6))
    def append_every_layer(self, T, seed):
        for layer in range(self.n_layers):
            self._append(layer, T, seed)

    @rule(layer=st.integers(0, 1), T=st.integers(1, 7), seed=st.integers(0, 10**6))
    def append_one_layer(self, layer, T, seed):
        self._append(layer % self.n_layers, T, seed)

    @rule(layer=st.integers(0, 1), seed=st.integers(0, 10**6))
    def decode(self, layer, seed):
        """A decode step reads the dequantized cache: attention over the model's
        dequantized keys and values (appending one token, when there is room)."""
        layer %= self.n_layers
        if len(self.model[layer]["k"]) + 1 > self.max_len:
            return
        k_new, v_new = randn(seed, 1, self.Hk, 1, self.D), randn(seed + 1, 1, self.Hk, 1, self.D)
        keys, values = self.cache.update(layer, k_new, v_new)
        self.model[layer]["k"].append(k_new[..., 0, :])
        self.model[layer]["v"].append(v_new[..., 0, :])
        q = randn(seed + 2, 1, self.Hk, self.D)
        want = dense_decode(q, self.expected(layer, "k")[0], self.expected(layer, "v")[0])
        close(dense_decode(q, keys, values), want, atol=1e-12, rtol=1e-12)

    @rule()
    def rollback_is_refused(self):
        from attnbook.serving import truncate_cache

        with pytest.raises(TypeError):
            truncate_cache(self.cache, 0)

    @rule(data=st.data())
    def reject_bad_layer(self, data):
        k = randn(0, 1, self.Hk, 1, self.D)
        layer = data.draw(bad_layers(self.n_layers), label="layer")
        refuses_layer(lambda bad: self.cache.update(bad, k, k), layer)

    @rule(bad=st.sampled_from(["int k", "int v", "nan", "inf", "T=0"]))
    def reject_bad_update(self, bad):
        """What ``KVCache.update`` refuses, and a NaN or inf (it would poison its whole
        group): refused before anything changes."""
        k, v = randn(0, 1, self.Hk, 1, self.D), randn(1, 1, self.Hk, 1, self.D)
        if bad == "int k":
            k = k.long()
        elif bad == "int v":
            v = v.to(torch.uint8)
        elif bad == "nan":
            k = k.index_fill(-1, torch.tensor([0]), float("nan"))
        elif bad == "inf":
            v = v.index_fill(-1, torch.tensor([0]), float("inf"))
        else:
            k, v = k[..., :0, :], v[..., :0, :]
        with pytest.raises((ValueError, TypeError), match="k_new|v_new"):
            self.cache.update(0, k, v)

    @rule()
    def reset(self):
        self.cache.reset()
        self.model = [{"k": [], "v": []} for _ in range(self.n_layers)]

    @invariant()
    def lengths_residual_and_bytes(self):
        n = [len(m["k"]) for m in self.model]
        assert list(self.cache.lengths) == n
        assert self.cache.length == min(n)
        item, total = F64.itemsize, 0
        code_bytes = math.ceil(self.D * self.bits / 8)
        for layer in range(self.n_layers):
            for name in ("k", "v"):
                rows = self.Hk  # batch 1
                if self.axes[name] == "token":
                    total += rows * n[layer] * (code_bytes + 2 * self.D // self.G * item)
                else:
                    full = n[layer] // self.G * self.G
                    residual = n[layer] - full
                    assert self.cache.residual[name][layer].shape[-2] == residual
                    total += rows * (
                        full * code_bytes + 2 * (full // self.G) * self.D * item
                        + residual * self.D * item
                    )
        assert self.cache.nbytes() == total


TestQuantizedCacheMachine = QuantizedCacheMachine.TestCase
TestQuantizedCacheMachine.settings = machine_settings(15, 12)


class PagedCacheMachine(RuleBasedStateMachine):
    """:class:`attnbook.kvcache.PagedKVCache`: several sequences allocated, appended to,
    decoded and freed in any interleaving. Each sequence gathers its own positions in
    order; block tables are disjoint, hold ``ceil(length / block_size)`` blocks each
    and, with the free list, partition the pool; ``CacheFullError`` exactly when the
    free blocks cannot hold an append (which then changes nothing); freed blocks are
    reused."""

    Hk, D = 2, 3

    @initialize(n_blocks=st.integers(1, 6), block_size=st.integers(1, 4))
    def make(self, n_blocks, block_size):
        from attnbook.kvcache import PagedKVCache

        self.n_blocks, self.bs = n_blocks, block_size
        self.cache = PagedKVCache(n_blocks, block_size, self.Hk, self.D, dtype=F64)
        self.model: dict[int, list] = {}
        self.next_id = 0

    def blocks_held(self):
        return sum(-(-len(held) // self.bs) for held in self.model.values())

    def expected(self, seq):
        held = self.model[seq]
        shape = (self.Hk, 0, self.D)
        return (
            stack_positions([k for k, _ in held], shape),
            stack_positions([v for _, v in held], shape),
        )

    @rule()
    def allocate(self):
        self.cache.allocate(self.next_id)
        self.model[self.next_id] = []
        self.next_id += 1

    @precondition(lambda self: self.model)
    @rule(data=st.data(), T=st.integers(1, 6), seed=st.integers(0, 10**6))
    def append(self, data, T, seed):
        from attnbook.kvcache import CacheFullError

        seq = data.draw(st.sampled_from(sorted(self.model)), label="seq")
        k, v = randn(seed, self.Hk, T, self.D), randn(seed + 1, self.Hk, T, self.D)
        n = len(self.model[seq])
        needed = -(-(n + T) // self.bs) - -(-n // self.bs)
        if needed > self.n_blocks - self.blocks_held():
            with pytest.raises(CacheFullError):
                self.cache.append(seq, k, v)
            return
        self.cache.append(seq, k, v)
        self.model[seq] += [(k[:, t], v[:, t]) for t in range(T)]

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.model)), label="seq")
        self.cache.free(seq)
        del self.model[seq]

    @precondition(lambda self: self.model)
    @rule(data=st.data(), seed=st.integers(0, 10**6), group=st.sampled_from([1, 2]))
    def decode(self, data, seed, group):
        """A ragged batch of live sequences, each gathered and padded to the longest,
        decoded with ``cache_seqlens``."""
        seqs = data.draw(
            st.lists(st.sampled_from(sorted(self.model)), min_size=1, max_size=3), label="batch"
        )
        lengths = [len(self.model[s]) for s in seqs]
        longest = max(lengths)
        k_pad = torch.zeros(len(seqs), self.Hk, longest, self.D, dtype=F64)
        v_pad = torch.zeros_like(k_pad)
        for b, s in enumerate(seqs):
            k_pad[b, :, : lengths[b]], v_pad[b, :, : lengths[b]] = self.cache.gather(s)
        q = randn(seed, len(seqs), self.Hk * group, self.D)
        out = run_decode(q, k_pad, v_pad, lengths)
        for b, s in enumerate(seqs):
            keys, values = self.expected(s)
            want = dense_decode(q[b : b + 1], keys[None], values[None])
            close(out[b : b + 1], want, **DECODE_TOL)

    @rule(bad=st.sampled_from(["allocate twice", "append", "free", "gather", "T=0"]))
    def reject_bad_calls(self, bad):
        """Unknown or repeated sequence ids and empty appends are ValueErrors that
        change nothing."""
        unknown = -1
        k = randn(0, self.Hk, 1, self.D)
        with pytest.raises(ValueError):
            if bad == "allocate twice":
                if not self.model:
                    raise ValueError("nothing to allocate twice")
                self.cache.allocate(next(iter(self.model)))
            elif bad == "append":
                self.cache.append(unknown, k, k)
            elif bad == "free":
                self.cache.free(unknown)
            elif bad == "gather":
                self.cache.gather(unknown)
            else:
                if not self.model:
                    raise ValueError("no sequence")
                self.cache.append(next(iter(self.model)), k[:, :0], k[:, :0])

    @invariant()
    def tables_partition_the_pool(self):
        tables = self.cache.block_tables
        assert set(tables) == set(self.model)
        taken = [b for t in tables.values() for b in t]
        assert len(taken) == len(set(taken))
        assert sorted(taken + list(self.cache.free_blocks)) == list(range(self.n_blocks))
        for seq, held in self.model.items():
            assert self.cache.lengths[seq] == len(held)
            assert len(tables[seq]) == -(-len(held) // self.bs)
        assert self.cache.wasted_slots() == sum(
            len(tables[s]) * self.bs - len(h) for s, h in self.model.items()
        )

    @invariant()
    def each_sequence_gathers_its_own_positions(self):
        for seq in self.model:
            for got, want in zip(self.cache.gather(seq), self.expected(seq)):
                assert torch.equal(got, want)


TestPagedCacheMachine = PagedCacheMachine.TestCase
TestPagedCacheMachine.settings = machine_settings(15, 15)


_GPTS: dict = {}


def tiny_gpt(name: str):
    """A float64 TinyGPT per configuration name, built once."""
    from attnbook.models import TinyGPT, TransformerConfig

    if name not in _GPTS:
        options = dict(GPT_CONFIGS[name])
        torch.manual_seed(sorted(GPT_CONFIGS).index(name))
        cfg = TransformerConfig(vocab_size=16, d_model=16, n_heads=2, n_layers=2, **options)
        _GPTS[name] = TinyGPT(cfg).double().eval()
    return _GPTS[name]


GPT_CONFIGS = {
    "rope": dict(positional="rope"),
    "rope-gqa": dict(positional="rope", n_kv_heads=1),
    "none": dict(positional="none"),
    "sinusoidal": dict(positional="sinusoidal"),
    "learned": dict(positional="learned", max_len=12),
    "t5": dict(positional="t5", t5_num_buckets=8, t5_max_distance=16),
    "alibi": dict(positional="alibi"),
    "post-rmsnorm-swiglu": dict(norm="rmsnorm", norm_position="post", mlp="swiglu"),
    "mla": dict(attention="mla", rope_dim=4, kv_latent_dim=8, q_latent_dim=8),
}


class PagedModelMachine(RuleBasedStateMachine):
    """:class:`attnbook.serving.PagedModel`: prefill requests, decode ragged batches of
    them, release them, in any order. Each sequence's pages hold the keys and values a
    full forward pass of its tokens caches, the tokens returned are the model's greedy
    tokens on the whole sequence, and a prefill or decode the pool cannot hold raises
    ``CacheFullError`` and changes nothing."""

    @initialize(
        name=st.sampled_from(["rope", "rope-gqa", "none"]),
        n_blocks=st.integers(1, 6),
        block_size=st.integers(1, 4),
    )
    def make(self, name, n_blocks, block_size):
        from attnbook.serving import PagedModel

        self.model = tiny_gpt(name)
        self.bs, self.n_blocks = block_size, n_blocks
        self.engine = PagedModel(self.model, n_blocks=n_blocks, block_size=block_size)
        self.tokens: dict[int, list[int]] = {}
        self.next_id = 0

    def blocks_held(self):
        return sum(-(-len(t) // self.bs) for t in self.tokens.values())

    def is_greedy(self, token, ids):
        """``token`` is the argmax of the model's last logits on ``ids`` (up to the fp32
        of split-KV decoding)."""
        with torch.no_grad():
            logits = self.model(torch.tensor([ids]))[0, -1]
        assert logits[token] >= logits.max() - 1e-4, (token, logits)

    @rule(p=st.integers(1, 6), seed=st.integers(0, 10**6))
    def prefill(self, p, seed):
        from attnbook.kvcache import CacheFullError
        from attnbook.serving import Request

        prompt = torch.randint(16, (p,), generator=torch.Generator().manual_seed(seed)).tolist()
        request = Request(self.next_id, p, 1, 0, tuple(prompt))
        self.next_id += 1
        if -(-p // self.bs) > self.n_blocks - self.blocks_held():
            with pytest.raises(CacheFullError):
                self.engine.prefill(request)
            return
        token = self.engine.prefill(request)
        self.tokens[request.id] = prompt
        self.is_greedy(token, prompt)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def decode(self, data):
        from attnbook.kvcache import CacheFullError

        seqs = data.draw(
            st.lists(st.sampled_from(sorted(self.tokens)), min_size=1, max_size=3, unique=True),
            label="batch",
        )
        new = data.draw(
            st.lists(st.integers(0, 15), min_size=len(seqs), max_size=len(seqs)), label="tokens"
        )
        needed = sum(len(self.tokens[s]) % self.bs == 0 for s in seqs)
        if needed > self.n_blocks - self.blocks_held():
            with pytest.raises(CacheFullError):
                self.engine.decode(seqs, new)
            return
        out = self.engine.decode(seqs, new)
        for s, t, token in zip(seqs, new, out):
            self.tokens[s].append(t)
            self.is_greedy(token, self.tokens[s])

    @precondition(lambda self: self.tokens)
    @rule(bad=st.sampled_from(["repeated id", "unknown id", "token count", "prefill running"]))
    def reject_bad_calls(self, bad):
        """A sequence twice in one decode batch (two tokens at one position), an id
        that is not running, a token count that is not the batch's, a prefill of a
        running id: ValueError, nothing changed (the invariant checks)."""
        from attnbook.serving import Request

        seq = min(self.tokens)
        with pytest.raises(ValueError):
            if bad == "repeated id":
                self.engine.decode([seq, seq], [1, 2])
            elif bad == "unknown id":
                self.engine.decode([seq, -1], [1, 2])
            elif bad == "token count":
                self.engine.decode([seq], [1, 2])
            else:
                self.engine.prefill(Request(seq, 1, 1, 0, (3,)))

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def release(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tokens)), label="seq")
        self.engine.release(seq)
        del self.tokens[seq]

    @invariant()
    def pages_hold_what_a_full_forward_caches(self):
        from attnbook.kvcache import KVCache

        cfg = self.model.config
        assert self.engine.blocks_in_use == self.blocks_held()
        assert self.engine.stored_positions == sum(len(t) for t in self.tokens.values())
        for cache in self.engine.caches:
            assert set(cache.block_tables) == set(self.tokens)
        for seq, ids in self.tokens.items():
            n = len(ids)
            kv_heads, head_dim = cfg.n_kv_heads or cfg.n_heads, cfg.d_model // cfg.n_heads
            kv = KVCache(cfg.n_layers, 1, kv_heads, head_dim, n, dtype=F64)
            with torch.no_grad():
                self.model(torch.tensor([ids]), cache=kv)
            for layer, cache in enumerate(self.engine.caches):
                assert cache.lengths[seq] == n
                k, v = cache.gather(seq)
                close(k, kv.k[layer, 0], **DECODE_TOL)
                close(v, kv.v[layer, 0], **DECODE_TOL)


TestPagedModelMachine = PagedModelMachine.TestCase
TestPagedModelMachine.settings = machine_settings(10, 10)


# ======================================================================================
# 2. The recurrent state of linear attention
# ======================================================================================
def relu_features(x: torch.Tensor) -> torch.Tensor:
    """A feature map with zeros: a query or key can have no similarity at all."""
    return torch.relu(x)


class LinearStateMachine(RuleBasedStateMachine):
    """Causal linear attention as an RNN: ``linear_attention_step`` (one token) and
    ``linear_attention_recurrent`` (a chunk) carry ``(S, z)`` across calls; the delta
    rule carries its memory. After any sequence of steps, chunks and resets, each
    output equals causal linear attention of the whole prefix recomputed from scratch
    (``linear_attention(..., is_causal=True)`` and the dense weights of
    ``linear_attention_weights``; ``delta_rule_attention`` from the empty state), and
    the state equals ``(sum_j phi(k_j) v_j^T, sum_j phi(k_j))``."""

    B, H, E, Ev = 2, 2, 3, 2

    @initialize(
        eps=st.sampled_from([0.0, 1e-6, 0.5]),
        features=st.sampled_from(["elu", "relu"]),
        kv_heads=st.sampled_from([1, 2]),
        zero_state=st.booleans(),
    )
    def make(self, eps, features, kv_heads, zero_state):
        from attnbook import linear

        self.linear = linear
        self.eps, self.Hk, self.zero_state = eps, kv_heads, zero_state
        self.phi = linear.elu_feature_map if features == "elu" else relu_features
        self.clear()

    def clear(self):
        self.q, self.k, self.v, self.beta = [], [], [], []
        if self.zero_state:  # an explicit empty state instead of None
            M = self.E
            self.state = (
                torch.zeros(self.B, self.Hk, M, self.Ev, dtype=F64),
                torch.zeros(self.B, self.Hk, M, dtype=F64),
            )
            self.delta = torch.zeros(self.B, self.H, M, self.Ev, dtype=F64)
        else:
            self.state, self.delta = None, None

    def tokens(self, seed, T):
        q = randn(seed, self.B, self.H, T, self.E)
        k = randn(seed + 1, self.B, self.Hk, T, self.E)
        v = randn(seed + 2, self.B, self.Hk, T, self.Ev)
        gen = torch.Generator().manual_seed(seed)
        beta = torch.rand(self.B, self.H, T, generator=gen, dtype=F64)
        self.q += list(q.unbind(-2))
        self.k += list(k.unbind(-2))
        self.v += list(v.unbind(-2))
        self.beta += list(beta.unbind(-1))
        return q, k, v, beta

    def prefix(self):
        return (
            torch.stack(self.q, -2),
            torch.stack(self.k, -2),
            torch.stack(self.v, -2),
            torch.stack(self.beta, -1),
        )

    def check_outputs(self, out, T):
        """The last ``T`` rows of causal linear attention over the whole prefix."""
        Q, K, V, _ = self.prefix()
        options = dict(feature_map=self.phi, is_causal=True, eps=self.eps)
        full = self.linear.linear_attention(Q, K, V, **options)
        close(out, full[..., -T:, :], msg="recurrent vs linear_attention(is_causal=True)")
        weights = self.linear.linear_attention_weights(Q, K, **options)
        dense = weights @ V  # V's single head broadcasts
        close(out, dense[..., -T:, :], msg="recurrent vs linear_attention_weights @ v")
        assert torch.isfinite(out).all()

    def advance_delta(self, q, k, v, beta, T):
        out, self.delta = self.linear.delta_rule_attention(
            q, k, v, beta, feature_map=self.phi, state=self.delta
        )
        Q, K, V, Beta = self.prefix()
        full, memory = self.linear.delta_rule_attention(Q, K, V, Beta, feature_map=self.phi)
        close(out, full[..., -T:, :], msg="delta rule: carried state vs from scratch")
        close(self.delta, memory)

    @rule(seed=st.integers(0, 10**6))
    def step(self, seed):
        q, k, v, beta = self.tokens(seed, 1)
        out, self.state = self.linear.linear_attention_step(
            q[..., 0, :], k[..., 0, :], v[..., 0, :], self.state, feature_map=self.phi, eps=self.eps
        )
        self.check_outputs(out[..., None, :], 1)
        self.advance_delta(q, k, v, beta, 1)

    @rule(T=st.integers(1, 4), seed=st.integers(0, 10**6))
    def chunk(self, T, seed):
        q, k, v, beta = self.tokens(seed, T)
        out, self.state = self.linear.linear_attention_recurrent(
            q, k, v, self.state, feature_map=self.phi, eps=self.eps
        )
        self.check_outputs(out, T)
        self.advance_delta(q, k, v, beta, T)

    @rule()
    def reset(self):
        self.clear()

    @invariant()
    def state_is_the_prefix_sums(self):
        if not self.q:
            return
        _, K, V, _ = self.prefix()
        phi_k = self.phi(K)
        S, z = self.state
        close(S, torch.broadcast_to(phi_k.transpose(-2, -1) @ V, S.shape))
        close(z, torch.broadcast_to(phi_k.sum(-2), z.shape))


TestLinearStateMachine = LinearStateMachine.TestCase
TestLinearStateMachine.settings = machine_settings(15, 10)


# ======================================================================================
# 3. Decoders
# ======================================================================================
_SEQ2SEQ: dict = {}

SEQ2SEQ_CONFIGS = {
    "none": dict(attention="none"),
    "bahdanau": dict(attention="bahdanau"),
    "bahdanau-coverage": dict(attention="bahdanau", coverage=True),
    "dot": dict(attention="dot"),
    "general": dict(attention="general"),
    "concat-no-feeding": dict(attention="concat", input_feeding=False),
    "local-m": dict(attention="local-m", window=1),
    "local-p": dict(attention="local-p", window=1),
}


def seq2seq(name: str):
    from attnbook.rnn import Seq2Seq

    if name not in _SEQ2SEQ:
        torch.manual_seed(sorted(SEQ2SEQ_CONFIGS).index(name))
        model = Seq2Seq(8, 8, emb_dim=6, hidden=6, **SEQ2SEQ_CONFIGS[name])
        _SEQ2SEQ[name] = model.double().eval()
    return _SEQ2SEQ[name]


class Seq2SeqStepMachine(RuleBasedStateMachine):
    """:meth:`attnbook.rnn.Seq2Seq.step` driven token by token, with the state's rows
    reordered (and duplicated) as beam search does: after every step the logits,
    weights and coverage equal teacher forcing on the whole prefix from scratch
    (``forward``), for sources of several lengths (right-padded)."""

    B = 3

    @initialize(name=st.sampled_from(sorted(SEQ2SEQ_CONFIGS)), hard=st.booleans())
    def make(self, name, hard):
        self.model = seq2seq(name)
        self.hard = hard
        self.new_source(0, [3, 1, 2])

    @rule(seed=st.integers(0, 10**6), lengths=st.lists(st.integers(1, 4), min_size=3, max_size=3))
    def new_source(self, seed, lengths):
        S = max(lengths)
        gen = torch.Generator().manual_seed(seed)
        self.src = torch.randint(3, 8, (self.B, S), generator=gen)
        self.mask = torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]
        self.src = self.src.masked_fill(~self.mask, 0)
        with torch.no_grad():
            self.memory, summary = self.model.encode(self.src, self.mask)
            self.state = self.model._initial_state(self.memory, summary)
        self.prefix = torch.zeros(self.B, 0, dtype=torch.long)

    @rule(data=st.data())
    def step(self, data):
        ids = st.lists(st.integers(0, 7), min_size=self.B, max_size=self.B)
        y = torch.tensor(data.draw(ids, label="y"))
        t = self.prefix.shape[1]
        self.model.hard = self.hard
        try:
            with torch.no_grad():
                logits, w, self.state = self.model.step(y, self.state, self.memory, self.mask, t)
                self.prefix = torch.cat((self.prefix, y[:, None]), 1)
                full = self.model(self.src, self.mask, self.prefix)
        finally:
            self.model.hard = False
        close(logits, full.logits[:, -1], msg="step vs teacher forcing")
        close(w, full.weights[:, -1])
        close(self.state["coverage"], full.coverage[:, -1] + full.weights[:, -1])

    @rule(parents=st.lists(st.integers(0, 2), min_size=3, max_size=3))
    def reorder(self, parents):
        """Beam search's bookkeeping: rows of the state follow their parents."""
        index = torch.tensor(parents)
        self.state = {k: v[index] for k, v in self.state.items()}
        self.memory, self.mask, self.src = self.memory[index], self.mask[index], self.src[index]
        self.prefix = self.prefix[index]


TestSeq2SeqStepMachine = Seq2SeqStepMachine.TestCase
TestSeq2SeqStepMachine.settings = machine_settings(12, 10)


class GPTCacheMachine(RuleBasedStateMachine):
    """:class:`attnbook.models.TinyGPT` fed chunks of tokens with a cache, rolled back
    (speculative decoding) and reset, for every positional scheme, grouped-query and
    latent attention, and a sink cache while nothing is evicted: the logits of each
    chunk equal the model run on the whole prefix without a cache (1e-10 in float64);
    a chunk past the cache's ``max_len`` raises ``CacheFullError`` and changes nothing;
    ``generate`` gives the same tokens with and without the cache."""

    B = 2

    @initialize(
        name=st.sampled_from(sorted(GPT_CONFIGS)),
        max_len=st.integers(1, 12),
        sink=st.booleans(),
    )
    def make(self, name, max_len, sink):
        self.name = name
        self.model = tiny_gpt(name)
        self.sink = sink and name != "mla"
        self.max_len = max_len
        self.cache = self.new_cache()
        self.ids = torch.zeros(self.B, 0, dtype=torch.long)

    def new_cache(self):
        from attnbook.serving import SinkKVCache

        if not self.sink:
            return self.model.make_cache(self.B, self.max_len)
        cfg = self.model.config
        n_sink = min(2, self.max_len - 1)
        # nothing is evicted while the text fits n_sink + window positions
        return SinkKVCache(
            cfg.n_layers, self.B, cfg.n_kv_heads or cfg.n_heads, cfg.d_model // cfg.n_heads,
            n_sink, self.max_len - n_sink, dtype=F64,
        )

    @rule(T=st.integers(1, 5), seed=st.integers(0, 10**6))
    def feed(self, T, seed):
        from attnbook.kvcache import CacheFullError

        new = torch.randint(16, (self.B, T), generator=torch.Generator().manual_seed(seed))
        if self.ids.shape[1] + T > self.max_len:
            if self.sink:  # a sink cache never overflows, but would evict: not compared
                return
            with pytest.raises(CacheFullError):
                with torch.no_grad():
                    self.model(new, cache=self.cache)
            return
        with torch.no_grad():
            logits = self.model(new, cache=self.cache)
            self.ids = torch.cat((self.ids, new), 1)
            full = self.model(self.ids)
        close(logits, full[:, -T:], msg=f"{self.name}: cached chunk vs whole prefix")

    @precondition(lambda self: not self.sink)
    @rule(seed=st.integers(0, 10**6))
    def rollback(self, seed):
        from attnbook.serving import truncate_cache

        length = seed % (self.ids.shape[1] + 1)
        truncate_cache(self.cache, length)
        self.ids = self.ids[:, :length]

    @rule()
    def reset(self):
        self.cache.reset()
        self.ids = self.ids[:, :0]

    @precondition(lambda self: self.ids.shape[1] > 0)
    @rule(n=st.integers(1, 3))
    def generate_with_and_without_cache(self, n):
        if self.name == "learned" and self.ids.shape[1] + n - 1 > self.model.config.max_len:
            return
        cached = self.model.generate(self.ids, n, use_cache=True)
        uncached = self.model.generate(self.ids, n, use_cache=False)
        assert torch.equal(cached, uncached)

    @invariant()
    def cache_length_is_the_prefix(self):
        assert self.cache.length == self.ids.shape[1]
        assert list(self.cache.lengths) == [self.ids.shape[1]] * len(self.cache.lengths)


TestGPTCacheMachine = GPTCacheMachine.TestCase
TestGPTCacheMachine.settings = machine_settings(20, 10)
