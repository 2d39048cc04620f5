"""One contract for every attention entry point (attnbook.contract), held by one test.

Every public function of the package whose first arguments are ``q, k, v`` (or ``q,
k_cache, v_cache``) is collected from the modules' ``__all__``; a new one without a case
below fails ``test_every_entry_point_has_a_case``. Each case says how to call the function
and what it must equal: PyTorch's ``scaled_dot_product_attention`` (with ``enable_gqa`` and
the bottom-right causal mask, which torch builds with ``attn_bias.causal_lower_right``)
where the function computes softmax attention, or a dense formula written here where it
computes something else (linear attention, hard attention). All of them must refuse the
same battery of bad inputs with a ``ValueError`` or ``TypeError`` that names the argument.
"""

from __future__ import annotations

import importlib
import inspect
import math
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from attnbook import attend, core, flash, kvcache, linear, positional, sparse

MODULES = ["core", "complexity", "positional", "models", "sparse", "linear", "kvcache",
           "flash", "attend", "rnn", "vision", "graph", "connections", "kernels", "kernels.decode",
           "kernels.flash_triton", "flex"]


def _entry_points() -> set[str]:
    found = set()
    for name in MODULES:
        module = importlib.import_module(f"attnbook.{name}")
        # the public names, and the Triton launchers (private, behind attnbook.attend)
        for attr in [*getattr(module, "__all__", []), *getattr(module, "_LAUNCHERS", {})]:
            obj = getattr(module, attr)
            if inspect.isfunction(obj):
                params = list(inspect.signature(obj).parameters)[:3]
                if params in (["q", "k", "v"], ["q", "k_cache", "v_cache"]):
                    found.add(f"{name}.{attr}")
    return found


# --------------------------------------------------------------------------------------
# How to call each entry point, and what it must equal
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    call: Callable  # call(q, k, v, is_causal, scale, attn_mask, like) -> output; `like`
    # holds well-formed q, k, v for the shapes of extra arguments (block masks, tables)
    reference: str = "sdpa"  # "sdpa", "linear" or "hard"
    causal: bool = True
    scale: bool = True
    mask: bool = False
    self_only: bool = False  # needs L == S
    decode: bool = False  # one query token against a (B, H, S, E) cache
    always_causal: bool = False  # a recurrence: causal by construction


def _flags_only(fn):
    return lambda q, k, v, is_causal, scale, attn_mask, like: fn(q, k, v, is_causal=is_causal, scale=scale)


def _full_blocks(like, block=4):
    L, S = like[0].shape[-2], like[1].shape[-2]
    return torch.ones(math.ceil(L / block), math.ceil(S / block), dtype=torch.bool)


def _message_passing(q, k, v, is_causal, scale, attn_mask, like):
    from attnbook.graph import message_passing_attention

    n = like[0].shape[-2]  # the complete graph, with bottom-right causality as edges
    src, dst = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="xy")
    keep = (src <= dst) if is_causal else torch.ones(n, n, dtype=torch.bool)
    edge_index = torch.stack([src[keep], dst[keep]])
    return message_passing_attention(q, k, v, edge_index, scale=scale)


def _split_kv(fn):
    def call(q, k, v, is_causal, scale, attn_mask, like):  # the last query against the cache
        lengths = torch.full((like[0].shape[0],), like[1].shape[-2])
        last = q[..., -1:, :] if isinstance(q, torch.Tensor) and q.dim() == 4 else q
        return fn(last, k, v, lengths, scale=scale)
    return call


def _flex_reference(q, k, v, is_causal, scale, attn_mask, like):
    from attnbook.flex import causal_mask_mod, flex_reference

    L, S = like[0].shape[-2], like[1].shape[-2]
    return flex_reference(q, k, v, mask_mod=causal_mask_mod(L, S) if is_causal else None, scale=scale)


CASES: dict[str, Case] = {
    "core.scaled_dot_product_attention": Case(
        lambda q, k, v, is_causal, scale, attn_mask, like: core.scaled_dot_product_attention(
            q, k, v, attn_mask, is_causal=is_causal, scale=scale, enable_gqa=True), mask=True),
    "core.hard_attention": Case(
        lambda q, k, v, is_causal, scale, attn_mask, like: core.hard_attention(q, k, v, attn_mask, scale=scale),
        reference="hard", causal=False, mask=True),
    "attend.flash_attention": Case(_flags_only(attend.flash_attention)),
    "flex.flex_reference": Case(_flex_reference),
    "flash.flash_forward": Case(
        lambda q, k, v, is_causal, scale, attn_mask, like: flash.flash_forward(
            q, k, v, is_causal=is_causal, scale=scale, block_q=3, block_k=2)[0]),
    "attend.block_sparse_flash_attention": Case(
        lambda q, k, v, is_causal, scale, attn_mask, like: attend.block_sparse_flash_attention(
            q, k, v, _full_blocks(like), 4, is_causal=is_causal, scale=scale)),
    "sparse.block_sparse_attention": Case(
        lambda q, k, v, is_causal, scale, attn_mask, like: sparse.block_sparse_attention(
            q, k, v, _full_blocks(like), 4, is_causal=is_causal, scale=scale)),
    "sparse.sliding_window_attention": Case(  # a window wider than the sequence: dense
        lambda q, k, v, is_causal, scale, attn_mask, like: sparse.sliding_window_attention(
            q, k, v, like[0].shape[-2], is_causal=is_causal, scale=scale), self_only=True),
    "positional.shaw_relative_attention": Case(  # zero relative tables: plain attention
        lambda q, k, v, is_causal, scale, attn_mask, like: positional.shaw_relative_attention(
            q, k, v, like[0].new_zeros(3, like[0].shape[-1]), like[2].new_zeros(3, like[2].shape[-1]), 1,
            attn_mask,
            is_causal=is_causal, scale=scale), mask=True),
    "linear.linformer_attention": Case(  # identity projections (k = n): plain attention
        lambda q, k, v, is_causal, scale, attn_mask, like: linear.linformer_attention(
            q, k, v, torch.eye(like[1].shape[-2], dtype=like[0].dtype),
            torch.eye(like[1].shape[-2], dtype=like[0].dtype),
            scale=scale), causal=False),
    "linear.memory_compressed_attention": Case(  # stride-1 identity compression: plain attention
        lambda q, k, v, is_causal, scale, attn_mask, like: linear.memory_compressed_attention(
            q, k, v, torch.eye(like[1].shape[-1], dtype=like[0].dtype)[..., None],
            torch.eye(like[2].shape[-1], dtype=like[0].dtype)[..., None], is_causal=is_causal,
            scale=scale)),
    "linear.linear_attention": Case(
        lambda q, k, v, is_causal, scale, attn_mask, like: linear.linear_attention(q, k, v, is_causal=is_causal),
        reference="linear", scale=False),
    "linear.linear_attention_recurrent": Case(
        lambda q, k, v, is_causal, scale, attn_mask, like: linear.linear_attention_recurrent(q, k, v)[0],
        reference="linear", scale=False, self_only=True, causal=False, always_causal=True),
    "linear.performer_attention": Case(  # with an exact identity? no: checked in test_linear
        lambda q, k, v, is_causal, scale, attn_mask, like: linear.performer_attention(
            q, k, v, n_features=4096, is_causal=is_causal,
            generator=torch.Generator().manual_seed(0)),
        reference="performer", scale=False),
    "graph.message_passing_attention": Case(_message_passing, self_only=True),
    "kvcache.split_kv_attention": Case(_split_kv(kvcache.split_kv_attention), causal=False, decode=True),
    "attend.decode_attention": Case(_split_kv(attend.decode_attention), causal=False, decode=True),
}

# Entry points that take q, k, v but are not a forward attention: they keep their own
# reference tests, and still face the bad-input battery.
NOT_FORWARD = {
    "flash.flash_backward": "a backward pass; tests/unit/test_flash.py checks it against autograd",
    "kernels.flash_triton._flash_backward": "the Triton backward pass; tests/kernels/test_kernels_flash.py",
    "kernels.flash_triton._block_sparse_attention_backward": "the Triton block-sparse backward pass; "
                                                  "tests/kernels/test_kernels_flash.py",
    "linear.linear_attention_step": "one recurrent step; tests/unit/test_linear.py runs it step by step",
    "attend.flash_attention_varlen": "packed (total, H, E) sequences with cu_seqlens; tests/unit/test_flash.py "
                                    "checks it against each sequence alone and its bad inputs",
    "kernels.flash_triton._varlen_forward": "the Triton kernels of flash_attention_varlen; "
                                           "tests/kernels/test_kernels_flash.py",
    "kernels.flash_triton._varlen_backward": "the Triton backward of flash_attention_varlen; "
                                            "tests/kernels/test_kernels_flash.py",
    "linear.delta_rule_attention": "not an average of values (it overwrites); tests/unit/test_linear.py",
}
KERNELS = {  # Triton under the CPU interpreter: slow, so one small 4-D case each
    "kernels.flash_triton._flash_forward", "kernels.flash_triton._block_sparse_attention_forward",
    "kernels.decode._split_kv_attention",
}


def test_every_entry_point_has_a_case():
    found = _entry_points()
    covered = set(CASES) | set(NOT_FORWARD) | KERNELS
    assert found - covered == set(), f"attention entry points without a case in tests/properties/test_api.py: {found - covered}"
    assert covered - found == set(), f"cases for functions that are gone: {covered - found}"


# --------------------------------------------------------------------------------------
# Shared cases against PyTorch
# --------------------------------------------------------------------------------------
SHAPES = [  # (batch dims, Hq, Hk, L, S, E, Ev)
    ((2,), 2, 2, 5, 5, 8, 8),
    ((1,), 4, 2, 3, 7, 8, 6),  # grouped-query attention, L != S, value width != key width
    ((2, 3), 2, 1, 4, 4, 4, 4),  # multi-query attention, two batch dims
    ((), 3, 3, 6, 6, 8, 8),  # rank 3: (H, L, E)
    ((), None, None, 1, 5, 8, 8),  # rank 2: (L, E), a single query
]


def _tensors(shape, gen, dtype=torch.float64):
    batch, hq, hk, L, S, E, Ev = shape
    heads_q = () if hq is None else (hq,)
    heads_k = () if hk is None else (hk,)
    q = torch.randn(*batch, *heads_q, L, E, generator=gen, dtype=dtype)
    k = torch.randn(*batch, *heads_k, S, E, generator=gen, dtype=dtype)
    v = torch.randn(*batch, *heads_k, S, Ev, generator=gen, dtype=dtype)
    return q, k, v


def _bottom_right(L, S):
    mask = torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)
    assert torch.equal(mask, causal_lower_right(L, S)._materialize())  # torch's own rule
    return mask


def _sdpa(q, k, v, is_causal, scale, attn_mask):
    L, S = q.shape[-2], k.shape[-2]
    if is_causal:
        attn_mask = _bottom_right(L, S)
    gqa = q.dim() >= 3 and q.shape[-3] != k.shape[-3] and k.shape[-3] > 1
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale, enable_gqa=gqa)
    if is_causal and S < L:  # queries that see no key: zeros (torch gives NaN there)
        out = torch.nan_to_num(out, nan=0.0)
    return out


def _dense_linear(q, k, v, is_causal):
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    if q.dim() >= 3 and q.shape[-3] != k.shape[-3] and k.shape[-3] > 1:
        group = q.shape[-3] // k.shape[-3]
        phi_k, v = phi_k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)
    w = phi_q @ phi_k.transpose(-2, -1)
    if is_causal:
        L, S = q.shape[-2], k.shape[-2]
        w = w * (torch.arange(S)[None, :] <= torch.arange(L)[:, None] + S - L)
    return (w @ v) / (w.sum(-1, keepdim=True) + 1e-6)


def _hard(q, k, v, scale, attn_mask):
    if q.dim() >= 3 and q.shape[-3] != k.shape[-3] and k.shape[-3] > 1:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)
    scores = (q @ k.transpose(-2, -1)) * (scale or 1 / math.sqrt(q.shape[-1]))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, -math.inf)
    return F.one_hot(scores.argmax(-1), k.shape[-2]).to(q.dtype) @ v


def _applicable(name, shape):
    """Decoding takes (batch, heads, 1, head_dim) and a (batch, heads, S, E) cache: only the
    4-D shapes apply to it."""
    return not CASES[name].decode or (len(shape[0]) == 1 and shape[1] is not None)


@pytest.mark.parametrize(
    "name, shape",
    [(name, shape) for name in sorted(CASES) for shape in SHAPES if _applicable(name, shape)],
    ids=lambda x: x if isinstance(x, str) else "x".join(map(str, x[1:])),
)
def test_entry_point_equals_its_reference(name, shape):
    case = CASES[name]
    gen = torch.Generator().manual_seed(len(name))
    if case.self_only and shape[3] != shape[4]:
        shape = (*shape[:4], shape[3], *shape[5:])
    q, k, v = _tensors(shape, gen)
    variants = [(False, None, None)]
    if case.causal:
        variants.append((True, None, None))
    if case.scale:
        variants.append((False, 0.3, None))
    if case.mask:
        variants.append((False, None, torch.rand(q.shape[-2], k.shape[-2], generator=gen) < 0.7))
    for is_causal, scale, mask in variants:
        got = case.call(q, k, v, is_causal, scale, mask, (q, k, v))
        if case.decode:
            expected = _sdpa(q[..., -1:, :], k, v, False, scale, None)
        elif case.reference == "sdpa":
            expected = _sdpa(q, k, v, is_causal, scale, mask)
        elif case.reference == "linear":
            expected = _dense_linear(q, k, v, is_causal or case.always_causal)
        elif case.reference == "hard":
            expected = _hard(q, k, v, scale, mask)
        else:  # performer: an unbiased estimate of softmax attention, 4096 features
            expected = _sdpa(q, k, v, is_causal, None, None)
            assert got.shape == expected.shape and torch.isfinite(got).all()
            assert (got - expected).abs().mean() < 0.25, f"{name}: far from softmax attention"
            continue
        what = f"{name} shape={shape} is_causal={is_causal} scale={scale} mask={mask is not None}"
        assert got.shape == expected.shape, f"{what}: shape {tuple(got.shape)} != {tuple(expected.shape)}"
        tol = 1e-5 if case.decode else 1e-9  # split-KV runs its splits in fp32
        torch.testing.assert_close(got, expected, atol=tol, rtol=tol, msg=lambda m: f"{what}: {m}")


# --------------------------------------------------------------------------------------
# The bad-input battery
# --------------------------------------------------------------------------------------
def _good(gen):
    return _tensors(((2,), 4, 2, 5, 5, 8, 8), gen, dtype=torch.float32)


BAD_INPUTS = {  # what to break -> (error types, a word the message must contain)
    "integer q": (lambda q, k, v: (q.long(), k, v), TypeError, "q"),
    "mixed dtypes": (lambda q, k, v: (q, k.double(), v), TypeError, "dtype"),
    "q of rank 1": (lambda q, k, v: (q[0, 0, 0], k, v), ValueError, "q"),
    "head dim of q != k": (lambda q, k, v: (q[..., :4], k, v), ValueError, "q and k"),
    "k and v lengths differ": (lambda q, k, v: (q, k, v[..., :3, :]), ValueError, "k and v"),
    "batch sizes differ": (lambda q, k, v: (q, k[:1].expand(3, -1, -1, -1), v[:1].expand(3, -1, -1, -1)),
                           ValueError, "batch"),
    "heads not a multiple": (lambda q, k, v: (q[:, :3], k, v), ValueError, "heads"),
    "q is a list": (lambda q, k, v: (q.tolist(), k, v), TypeError, "q"),
}


def _bad_call(name, like):
    if name in CASES:
        return lambda q, k, v: CASES[name].call(q, k, v, False, None, None, like)
    if name == "flash.flash_backward":
        return lambda q, k, v: flash.flash_backward(q, k, v, q, q, q)
    if name == "linear.delta_rule_attention":
        return lambda q, k, v: linear.delta_rule_attention(q, k, v, 1.0)
    return None


# the Triton backward runs only where its forward did; a recurrent step takes one token
BATTERY = sorted(set(CASES) | set(NOT_FORWARD) - {"kernels.flash_triton._flash_backward",
                                                   "kernels.flash_triton._block_sparse_attention_backward",
                                                   "linear.linear_attention_step",
                                                   # packed layouts: their own bad-input tests
                                                   "attend.flash_attention_varlen",
                                                   "kernels.flash_triton._varlen_forward",
                                                   "kernels.flash_triton._varlen_backward"})


@pytest.mark.parametrize(
    "name, bad",
    # a cache's K and V lengths are checked together: see test_decode_rejects_bad_caches
    [(name, bad) for name in BATTERY for bad in sorted(BAD_INPUTS)
     if not (name in CASES and CASES[name].decode and bad == "k and v lengths differ")],
)
def test_bad_inputs_raise_a_clear_error(name, bad):
    breaker, error, word = BAD_INPUTS[bad]
    good = _good(torch.Generator().manual_seed(0))
    call = _bad_call(name, good)
    q, k, v = breaker(*good)
    with pytest.raises((ValueError, TypeError)) as info:
        call(q, k, v)
    assert isinstance(info.value, error), f"{name}, {bad}: raised {type(info.value).__name__}: {info.value}"
    message = str(info.value)
    assert word in message, f"{name}, {bad}: the message does not name {word!r}: {message}"


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.mask))
def test_bad_masks_raise_a_clear_error(name):
    q, k, v = _good(torch.Generator().manual_seed(1))
    for mask, error in [(torch.ones(3, 2, dtype=torch.bool), ValueError),
                        (torch.ones(5, 5, dtype=torch.int64), TypeError)]:
        with pytest.raises(error, match="attn_mask"):
            CASES[name].call(q, k, v, False, None, mask, (q, k, v))


@pytest.mark.parametrize("name", ["kvcache.split_kv_attention", "attend.decode_attention"])
def test_decode_rejects_bad_caches(name):
    fn = kvcache.split_kv_attention if name.endswith("split_kv_attention") else attend.decode_attention
    q, k, v = _good(torch.Generator().manual_seed(2))
    one = q[..., -1:, :]
    lengths = torch.tensor([5, 5])
    for args, error, word in [
        ((q, k, v, lengths), ValueError, "q must have shape"),  # 5 query tokens
        ((one, k, v[..., :4, :], lengths), ValueError, "k_cache"),
        ((one, k, v, torch.tensor([5.0, 5.0])), TypeError, "cache_seqlens"),
        ((one, k, v, torch.tensor([6, 5])), ValueError, "cache_seqlens"),
        ((one.long(), k, v, lengths), TypeError, "q"),
    ]:
        with pytest.raises(error, match=word):
            fn(*args)


def test_flags_are_keyword_only():
    for name in sorted(CASES | dict.fromkeys(NOT_FORWARD)):
        module, attr = name.rsplit(".", 1)
        fn = getattr(importlib.import_module(f"attnbook.{module}"), attr)
        for param in inspect.signature(fn).parameters.values():
            if param.name in {"is_causal", "scale", "dropout_p", "return_weights", "enable_gqa",
                              "backend", "return_backend", "generator", "feature_map", "eps"}:
                assert param.kind is param.KEYWORD_ONLY, f"{name}: {param.name} must be keyword-only"


def test_gqa_needs_enable_gqa_in_core_as_in_torch():
    q, k, v = _good(torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match="enable_gqa=True"):
        core.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(core.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                               F.scaled_dot_product_attention(q, k, v, enable_gqa=True))


def test_tiled_forward_makes_no_temporary_larger_than_its_docstring_says():
    """One block_q x block_k tile, the output, and the GQA-expanded K/V (B H S E)."""
    from attnbook.utils import largest_new_tensor

    B, H, Hk, L, S, E = 1, 4, 2, 64, 96, 8
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(B, H, L, E, generator=gen)
    k, v = (torch.randn(B, Hk, S, E, generator=gen) for _ in range(2))
    largest = largest_new_tensor(flash.flash_forward, q, k, v, block_q=16, block_k=16)
    assert largest <= max(B * H * S * E, B * H * L * E, B * H * 16 * 16)
    assert largest < B * H * L * S  # never the L x S scores


def test_a_query_that_sees_no_key_gets_zeros_here_and_in_torch():
    q, k, v = _good(torch.Generator().manual_seed(5))
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    mask = torch.ones(5, 5, dtype=torch.bool)
    mask[2] = False  # query 2 may attend to nothing
    ours = core.scaled_dot_product_attention(q, k, v, mask)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (ours[..., 2, :] == 0).all() and (theirs[..., 2, :] == 0).all()
    torch.testing.assert_close(ours, theirs)
