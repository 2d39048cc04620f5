"""Bad-input rows for attnbook.serving (see tests/properties/test_bad_input.py)."""

import math

import torch
from test_bad_input import Bad, Edge

from attnbook import serving as S
from attnbook.kvcache import KVCache, SlidingWindowKVCache
from attnbook.models import TinyGPT, TransformerConfig

NAN = float("nan")
INF = float("inf")
_X = torch.randn(2, 3, 8)
_LOGITS = torch.randn(2, 5)
_P, _Q = torch.full((2, 3, 5), 0.2), torch.full((2, 2, 5), 0.2)
_DRAFT = torch.zeros(2, 2, dtype=torch.long)
_KV = torch.randn(1, 2, 3, 4)


def _mla(**kw):
    torch.manual_seed(0)
    return S.MultiHeadLatentAttention(8, 2, 5, 4, **kw)


def _gpt(vocab_size=11, **kw):
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=vocab_size, d_model=16, n_heads=2, n_layers=1, **kw)
    return TinyGPT(config).eval()


def _ids(n=6, vocab=11):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(0))


def _request(**kw):
    args = dict(id=0, prompt_len=2, output_len=2, arrival_step=0, prompt=(1, 2))
    return S.Request(**{**args, **kw})


def _paged(**kw):
    return S.PagedModel(_gpt(), **{**dict(n_blocks=8, block_size=4), **kw})


def _decode(tokens):
    engine = _paged()
    engine.prefill(_request())
    return engine.decode([0], tokens)


def _truncate(length):
    cache = KVCache(1, 1, 2, 4, 8)
    cache.update(0, _KV, _KV)
    S.truncate_cache(cache, length)


def _spec(**kw):
    args = dict(target=_gpt(), draft=_gpt(), idx=torch.zeros(1, 3, dtype=torch.long), max_new_tokens=2)
    return S.speculative_generate(**{**args, **kw})


def _quantized_update(k):
    return S.QuantizedKVCache(1, 1, 2, 4, 8, group_size=2).update(0, k, k)


ROWS = [
    # multi-head latent attention
    Bad("MultiHeadLatentAttention", "zero", lambda: _mla(head_dim=0), ("MultiHeadLatentAttention", "head_dim")),
    Bad("MultiHeadLatentAttention", "non-integer", lambda: S.MultiHeadLatentAttention(8, 2, 2.5, 4),
        ("MultiHeadLatentAttention", "kv_latent_dim")),
    Bad("MultiHeadLatentAttention", "boolean", lambda: S.MultiHeadLatentAttention(8, True, 5, 4),
        ("MultiHeadLatentAttention", "n_heads")),
    Bad("MultiHeadLatentAttention", "negative", lambda: _mla(q_latent_dim=-1), ("MultiHeadLatentAttention", "q_latent_dim")),
    Bad("MultiHeadLatentAttention", "out-of-range", lambda: S.MultiHeadLatentAttention(8, 2, 5, 3),
        ("MultiHeadLatentAttention", "rope_dim", "even")),
    Bad("MultiHeadLatentAttention", "nan", lambda: _mla(dropout=NAN), ("MultiHeadLatentAttention", "dropout")),
    Bad("MultiHeadLatentAttention", "nan", lambda: _mla(rope_base=NAN), ("MultiHeadLatentAttention", "rope_base")),
    Bad("MultiHeadLatentAttention", "negative", lambda: _mla(layer=-1), ("MultiHeadLatentAttention", "layer")),
    Bad("MultiHeadLatentAttention", "integer-dtype", lambda: _mla()(_X.long()),
        ("MultiHeadLatentAttention.forward", "x")),
    Bad("MultiHeadLatentAttention", "wrong-shape", lambda: _mla()(_X[..., :7]),
        ("MultiHeadLatentAttention.forward", "x", "d_model=8")),
    Bad("MultiHeadLatentAttention", "wrong-shape", lambda: _mla()(_X, torch.ones(3, 4, dtype=torch.bool)),
        ("MultiHeadLatentAttention.forward", "attn_mask", "(2, 2, 3, 3)")),
    Bad("MultiHeadLatentAttention", "wrong-dtype", lambda: _mla()(_X, torch.ones(3, 3, dtype=torch.long)),
        ("MultiHeadLatentAttention.forward", "attn_mask")),
    Bad("MultiHeadLatentAttention", "wrong-shape", lambda: _mla()(_X, head_mask=torch.ones(3)),
        ("MultiHeadLatentAttention.forward", "head_mask")),
    Bad("MultiHeadLatentAttention", "wrong-type", lambda: _mla()(_X, is_causal="yes"),
        ("MultiHeadLatentAttention.forward", "is_causal")),
    Bad("MultiHeadLatentAttention", "wrong-type", lambda: _mla()(_X, cache=KVCache(1, 2, 2, 4, 8)),
        ("MultiHeadLatentAttention.forward", "cache", "LatentKVCache")),
    Edge("MultiHeadLatentAttention", "empty", lambda: _mla()(_X[:0]), lambda y: y.shape == (0, 3, 8)),
    Edge("MultiHeadLatentAttention", "empty", lambda: _mla()(_X[:, :0]), lambda y: y.shape == (2, 0, 8)),
    # its cache
    Bad("LatentKVCache", "zero", lambda: S.LatentKVCache(1, 0, 5, 4, 8), ("LatentKVCache", "batch")),
    Bad("LatentKVCache", "non-integer", lambda: S.LatentKVCache(1, 2, 5, 4, 8.5), ("LatentKVCache", "max_len")),
    Bad("LatentKVCache", "boolean", lambda: S.LatentKVCache(True, 2, 5, 4, 8), ("LatentKVCache", "n_layers")),
    Bad("LatentKVCache", "wrong-dtype", lambda: S.LatentKVCache(1, 2, 5, 4, 8, dtype=torch.long),
        ("LatentKVCache", "dtype")),
    Bad("LatentKVCache", "wrong-shape",
        lambda: S.LatentKVCache(1, 2, 5, 4, 8).update(0, torch.zeros(2, 1, 6), torch.zeros(2, 1, 4)),
        ("LatentKVCache.update", "c_kv_new")),
    Bad("LatentKVCache", "integer-dtype",
        lambda: S.LatentKVCache(1, 2, 5, 4, 8).update(0, torch.zeros(2, 1, 5, dtype=torch.long), torch.zeros(2, 1, 4)),
        ("LatentKVCache.update", "c_kv_new")),
    Bad("LatentKVCache", "out-of-range",
        lambda: S.LatentKVCache(1, 2, 5, 4, 8).update(1, torch.zeros(2, 1, 5), torch.zeros(2, 1, 4)),
        ("LatentKVCache.update", "layer")),
    Bad("LatentKVCache", "empty",
        lambda: S.LatentKVCache(1, 2, 5, 4, 8).update(0, torch.zeros(2, 0, 5), torch.zeros(2, 0, 4)),
        ("LatentKVCache.update", "c_kv_new", "T >= 1")),
    # sizes
    Bad("cache_bytes_per_token", "zero", lambda: S.cache_bytes_per_token("mha", n_layers=0, n_heads=2, head_dim=4),
        ("cache_bytes_per_token", "n_layers")),
    Bad("cache_bytes_per_token", "non-integer",
        lambda: S.cache_bytes_per_token("mha", n_layers=2, n_heads=2.5, head_dim=4), ("cache_bytes_per_token", "n_heads")),
    Bad("cache_bytes_per_token", "wrong-type",
        lambda: S.cache_bytes_per_token("mqa4", n_layers=2, n_heads=2, head_dim=4), ("cache_bytes_per_token", "kind")),
    Bad("cache_bytes_per_token", "negative",
        lambda: S.cache_bytes_per_token("mla", n_layers=2, n_heads=2, head_dim=4, kv_latent_dim=-1, rope_dim=2),
        ("cache_bytes_per_token", "kv_latent_dim")),
    Bad("cache_bytes_per_token", "out-of-range",
        lambda: S.cache_bytes_per_token("gqa", n_layers=2, n_heads=4, head_dim=4, n_kv_heads=3),
        ("cache_bytes_per_token", "n_kv_heads")),
    # speculative decoding
    Bad("truncate_cache", "negative", lambda: _truncate(-1), ("truncate_cache", "length")),
    Bad("truncate_cache", "out-of-range", lambda: _truncate(4), ("truncate_cache", "length")),
    Bad("truncate_cache", "non-integer", lambda: _truncate(1.5), ("truncate_cache", "length")),
    Bad("truncate_cache", "wrong-type", lambda: S.truncate_cache(SlidingWindowKVCache(1, 1, 2, 4, 8), 0),
        ("truncate_cache", "cache")),
    Bad("sampling_probs", "zero", lambda: S.sampling_probs(_LOGITS, 1.0, top_k=0), ("sampling_probs", "top_k")),
    Bad("sampling_probs", "non-integer", lambda: S.sampling_probs(_LOGITS, 1.0, top_k=2.5), ("sampling_probs", "top_k")),
    Bad("sampling_probs", "nan", lambda: S.sampling_probs(_LOGITS, NAN), ("sampling_probs", "temperature")),
    Bad("sampling_probs", "negative", lambda: S.sampling_probs(_LOGITS, -1.0), ("sampling_probs", "temperature")),
    Bad("sampling_probs", "integer-dtype", lambda: S.sampling_probs(_LOGITS.long(), 1.0), ("sampling_probs", "logits")),
    Bad("sampling_probs", "empty", lambda: S.sampling_probs(_LOGITS[:, :0], 0.0), ("sampling_probs", "logits")),
    Edge("sampling_probs", "empty", lambda: S.sampling_probs(_LOGITS[:0], 1.0), lambda p: p.shape == (0, 5)),
    Bad("sampling_probs", "nan", lambda: S.sampling_probs(_LOGITS.index_fill(1, torch.tensor([2]), NAN), 1.0),
        ("sampling_probs", "logits", "NaN")),
    Bad("sampling_probs", "out-of-range", lambda: S.sampling_probs(_LOGITS.index_fill(1, torch.tensor([2]), INF), 0.0),
        ("sampling_probs", "logits", "+inf")),
    Bad("sampling_probs", "out-of-range", lambda: S.sampling_probs(torch.full((2, 3), -INF), 1.0),
        ("sampling_probs", "logits", "all -inf")),
    Edge("sampling_probs", "out-of-range",
         lambda: S.sampling_probs(torch.tensor([[100.0, 99.0, -INF]], dtype=torch.float16), 1e-4),
         lambda p: p.tolist() == [[1.0, 0.0, 0.0]]),
    Bad("acceptance_probability", "wrong-shape", lambda: S.acceptance_probability(_P, _Q),
        ("acceptance_probability", "p", "q")),
    Bad("acceptance_probability", "integer-dtype", lambda: S.acceptance_probability(_P.long(), _P),
        ("acceptance_probability", "p")),
    Bad("speculative_accept", "wrong-shape", lambda: S.speculative_accept(_P[:, :2], _Q, _DRAFT),
        ("speculative_accept", "p")),
    Bad("speculative_accept", "out-of-range", lambda: S.speculative_accept(_P, _Q, _DRAFT + 5),
        ("speculative_accept", "draft_tokens", "[0, 5)")),
    Bad("speculative_accept", "wrong-dtype", lambda: S.speculative_accept(_P, _Q, _DRAFT.float()),
        ("speculative_accept", "draft_tokens", "int64")),
    Bad("speculative_accept", "wrong-shape", lambda: S.speculative_accept(_P, _Q, _DRAFT[:, :1]),
        ("speculative_accept", "draft_tokens")),
    Bad("speculative_accept", "integer-dtype", lambda: S.speculative_accept(_P.long(), _Q, _DRAFT),
        ("speculative_accept", "p")),
    Bad("speculative_accept", "negative", lambda: S.speculative_accept(_P.index_fill(2, torch.tensor([0]), -0.1), _Q, _DRAFT),
        ("speculative_accept", "p", "probabilities")),
    Bad("speculative_accept", "negative", lambda: S.speculative_accept(_P, _Q.index_fill(2, torch.tensor([1]), -0.2), _DRAFT),
        ("speculative_accept", "q", "probabilities")),
    Bad("speculative_accept", "nan", lambda: S.speculative_accept(_P.index_fill(2, torch.tensor([0]), NAN), _Q, _DRAFT),
        ("speculative_accept", "p", "NaN")),
    Bad("speculative_accept", "nan", lambda: S.speculative_accept(_P, torch.full_like(_Q, NAN), _DRAFT),
        ("speculative_accept", "q", "NaN")),
    Bad("speculative_accept", "out-of-range", lambda: S.speculative_accept(_P * 2, _Q, _DRAFT),
        ("speculative_accept", "p", "sum to 1")),
    Bad("speculative_accept", "zero", lambda: S.speculative_accept(_P, _Q * 0, _DRAFT),
        ("speculative_accept", "q", "sum to 1")),
    Edge("speculative_accept", "empty", lambda: S.speculative_accept(_P[:0], _Q[:0], _DRAFT[:0]),
         lambda r: r[0].shape == r[1].shape == (0,)),
    Edge("speculative_accept", "zero", lambda: S.speculative_accept(_P[:, :1], _Q[:, :0], _DRAFT[:, :0]),
         lambda r: r[0].tolist() == [0, 0] and r[1].shape == (2,)),
    Bad("speculative_generate", "zero", lambda: _spec(k=0), ("speculative_generate", "k")),
    Bad("speculative_generate", "non-integer", lambda: _spec(max_new_tokens=2.5), ("speculative_generate", "max_new_tokens")),
    Bad("speculative_generate", "negative", lambda: _spec(max_new_tokens=-1), ("speculative_generate", "max_new_tokens")),
    Bad("speculative_generate", "nan", lambda: _spec(temperature=NAN), ("speculative_generate", "temperature")),
    Bad("speculative_generate", "zero", lambda: _spec(temperature=1.0, top_k=0), ("speculative_generate", "top_k")),
    Bad("speculative_generate", "out-of-range", lambda: _spec(idx=torch.full((1, 3), 11)),
        ("speculative_generate", "idx", "[0, 11)")),
    Bad("speculative_generate", "wrong-dtype", lambda: _spec(idx=torch.zeros(1, 3)), ("speculative_generate", "idx")),
    Bad("speculative_generate", "empty", lambda: _spec(idx=torch.zeros(0, 3, dtype=torch.long)),
        ("speculative_generate", "idx")),
    Bad("speculative_generate", "wrong-shape", lambda: _spec(draft=_gpt(7)), ("speculative_generate", "draft", "vocab_size")),
    Bad("expected_tokens_per_call", "nan", lambda: S.expected_tokens_per_call(NAN, 3),
        ("expected_tokens_per_call", "alpha")),
    Bad("expected_tokens_per_call", "non-integer", lambda: S.expected_tokens_per_call(0.5, 2.5),
        ("expected_tokens_per_call", "k")),
    Bad("expected_tokens_per_call", "out-of-range", lambda: S.expected_tokens_per_call(1.5, 3),
        ("expected_tokens_per_call", "alpha")),
    Bad("expected_speedup", "nan", lambda: S.expected_speedup(0.5, 3, NAN), ("expected_speedup", "cost_ratio")),
    Bad("expected_speedup", "negative", lambda: S.expected_speedup(0.5, -1, 0.1), ("expected_speedup", "k")),
    Bad("expected_speedup", "boolean", lambda: S.expected_speedup(0.5, True, 0.1), ("expected_speedup", "k")),
    # attention sinks
    Bad("SinkKVCache", "negative", lambda: S.SinkKVCache(1, 1, 2, 4, -1, 4), ("SinkKVCache", "n_sink")),
    Bad("SinkKVCache", "zero", lambda: S.SinkKVCache(1, 1, 2, 4, 2, 0), ("SinkKVCache", "window")),
    Bad("SinkKVCache", "non-integer", lambda: S.SinkKVCache(1, 1, 2, 4, 2.5, 4), ("SinkKVCache", "n_sink")),
    Bad("SinkKVCache", "zero", lambda: S.SinkKVCache(0, 1, 2, 4, 2, 4), ("SinkKVCache", "n_layers")),
    Bad("SinkKVCache", "wrong-shape", lambda: S.SinkKVCache(1, 1, 2, 4, 2, 4).update(0, _KV[..., :3], _KV[..., :3]),
        ("SinkKVCache.update", "k_new")),
    Bad("SinkKVCache", "wrong-dtype", lambda: S.SinkKVCache(1, 1, 2, 4, 2, 4, dtype=torch.int64),
        ("SinkKVCache", "dtype")),
    Bad("SinkKVCache", "integer-dtype", lambda: S.SinkKVCache(1, 1, 2, 4, 2, 4).update(0, _KV.long(), _KV),
        ("SinkKVCache.update", "k_new")),
    Bad("SinkKVCache", "integer-dtype", lambda: S.SinkKVCache(1, 1, 2, 4, 2, 4).update(0, _KV, _KV.int()),
        ("SinkKVCache.update", "v_new")),
    Bad("SinkKVCache", "negative", lambda: S.SinkKVCache(2, 1, 2, 4, 2, 4).retained(-1), ("SinkKVCache.retained", "layer")),
    Bad("SinkKVCache", "negative", lambda: S.SinkKVCache(2, 1, 2, 4, 2, 4).positions(-1),
        ("SinkKVCache.positions", "layer")),
    Bad("SinkKVCache", "out-of-range", lambda: S.SinkKVCache(2, 1, 2, 4, 2, 4).positions(5),
        ("SinkKVCache.positions", "layer", "[0, 2)")),
    Bad("SinkKVCache", "out-of-range", lambda: S.SinkKVCache(2, 1, 2, 4, 2, 4).retained(2),
        ("SinkKVCache.retained", "layer", "[0, 2)")),
    Bad("SinkKVCache", "non-integer", lambda: S.SinkKVCache(2, 1, 2, 4, 2, 4).positions(0.0),
        ("SinkKVCache.positions", "layer")),
    Bad("SinkKVCache", "boolean", lambda: S.SinkKVCache(2, 1, 2, 4, 2, 4).retained(True),
        ("SinkKVCache.retained", "layer")),
    Bad("SinkKVCache", "negative", lambda: S.SinkKVCache(2, 1, 2, 4, 2, 4).update(-1, _KV, _KV),
        ("SinkKVCache.update", "layer")),
    Bad("streaming_losses", "wrong-type", lambda: S.streaming_losses(_gpt(), _ids(), cache="ring"),
        ("streaming_losses", "cache")),
    Bad("streaming_losses", "empty", lambda: S.streaming_losses(_gpt(), _ids(1)), ("streaming_losses", "ids")),
    Bad("streaming_losses", "out-of-range", lambda: S.streaming_losses(_gpt(), _ids() + 11),
        ("streaming_losses", "ids", "[0, 11)")),
    Bad("streaming_losses", "wrong-dtype", lambda: S.streaming_losses(_gpt(), _ids().float()),
        ("streaming_losses", "ids", "int64")),
    Bad("streaming_losses", "negative", lambda: S.streaming_losses(_gpt(), _ids(), cache="sinks", n_sink=-1),
        ("streaming_losses", "n_sink")),
    Bad("streaming_losses", "zero", lambda: S.streaming_losses(_gpt(), _ids(), cache="sinks", window=0),
        ("streaming_losses", "window")),
    Bad("streaming_losses", "non-integer", lambda: S.streaming_losses(_gpt(), _ids(), cache="window", window=2.5),
        ("streaming_losses", "window")),
    Bad("streaming_losses", "wrong-type", lambda: S.streaming_losses(_gpt(attention="mla"), _ids(), cache="sinks"),
        ("streaming_losses", "cache", "mla")),
    Bad("streaming_losses", "wrong-type",
        lambda: S.streaming_losses(_gpt(attention="mla"), _ids(), cache=KVCache(1, 1, 2, 8, 6)),
        ("streaming_losses", "cache", "LatentKVCache")),
    Edge("streaming_losses", "wrong-type", lambda: S.streaming_losses(_gpt(attention="mla"), _ids()),
         lambda losses: losses.shape == (5,) and bool(losses.isfinite().all())),
    Bad("first_token_attention", "empty", lambda: S.first_token_attention(_gpt(), _ids(1)),
        ("first_token_attention", "ids")),
    Bad("first_token_attention", "out-of-range", lambda: S.first_token_attention(_gpt(), _ids() - 1 - _ids()),
        ("first_token_attention", "ids")),
    Bad("first_token_attention", "wrong-dtype", lambda: S.first_token_attention(_gpt(), _ids().float()),
        ("first_token_attention", "ids", "int64")),
    Bad("first_token_attention", "wrong-shape", lambda: S.first_token_attention(_gpt(), _ids().view(1, 2, 3)),
        ("first_token_attention", "ids")),
    # quantization
    Bad("quantize", "out-of-range", lambda: S.quantize(_KV, 3, dim=-1), ("quantize", "bits")),
    Bad("quantize", "out-of-range", lambda: S.quantize(_KV, 8, dim=4), ("quantize", "dim")),
    Bad("quantize", "non-integer", lambda: S.quantize(_KV, 8, dim=1.5), ("quantize", "dim")),
    Bad("quantize", "zero", lambda: S.quantize(_KV, 8, dim=-1, group_size=0), ("quantize", "group_size")),
    Bad("quantize", "integer-dtype", lambda: S.quantize(_KV.long(), 8, dim=-1), ("quantize", "x")),
    Bad("quantize", "nan", lambda: S.quantize(_KV.index_fill(-1, torch.tensor([1]), NAN), 8, dim=-1), ("quantize", "x", "finite")),
    Bad("quantize", "out-of-range", lambda: S.quantize(_KV.index_fill(-1, torch.tensor([1]), INF), 8, dim=-1),
        ("quantize", "x", "finite")),
    Edge("quantize", "wrong-dtype", lambda: S.dequantize(S.quantize(_KV.bfloat16(), 8, dim=-1)),
         lambda x: x.dtype == torch.float32 and bool(((x - _KV.bfloat16().float()).abs() < 0.02).all())),
    Bad("dequantize", "wrong-type", lambda: S.dequantize(_KV), ("dequantize", "q")),
    Bad("QuantizedKVCache", "out-of-range", lambda: S.QuantizedKVCache(1, 1, 2, 4, 8, bits=2), ("QuantizedKVCache", "bits")),
    Bad("QuantizedKVCache", "zero", lambda: S.QuantizedKVCache(1, 1, 2, 4, 0), ("QuantizedKVCache", "max_len")),
    Bad("QuantizedKVCache", "non-integer", lambda: S.QuantizedKVCache(1, 1, 2.5, 4, 8), ("QuantizedKVCache", "n_kv_heads")),
    Bad("QuantizedKVCache", "wrong-type", lambda: S.QuantizedKVCache(1, 1, 2, 4, 8, key_axis="head"),
        ("QuantizedKVCache", "key_axis")),
    Bad("QuantizedKVCache", "wrong-dtype", lambda: S.QuantizedKVCache(1, 1, 2, 4, 8, dtype=torch.int8),
        ("QuantizedKVCache", "dtype")),
    Bad("QuantizedKVCache", "wrong-shape", lambda: _quantized_update(_KV[..., :3]), ("QuantizedKVCache.update", "k_new")),
    Bad("QuantizedKVCache", "integer-dtype", lambda: _quantized_update(_KV.long()), ("QuantizedKVCache.update", "k_new")),
    Bad("QuantizedKVCache", "integer-dtype",
        lambda: S.QuantizedKVCache(1, 1, 2, 4, 8, group_size=2).update(0, _KV, _KV.to(torch.uint8)),
        ("QuantizedKVCache.update", "v_new")),
    Bad("QuantizedKVCache", "nan", lambda: _quantized_update(_KV.index_fill(-1, torch.tensor([1]), NAN)),
        ("QuantizedKVCache.update", "k_new", "finite")),
    Bad("QuantizedKVCache", "out-of-range",
        lambda: S.QuantizedKVCache(1, 1, 2, 4, 8, group_size=2, dtype=torch.float16).update(0, _KV, _KV * 1e5),
        ("QuantizedKVCache.update", "v_new", "float16", "finite")),
    Bad("QuantizedKVCache", "negative", lambda: S.QuantizedKVCache(2, 1, 2, 4, 8, group_size=2).update(-1, _KV, _KV),
        ("QuantizedKVCache.update", "layer")),
    Bad("outlier_channel_ratio", "wrong-shape", lambda: S.outlier_channel_ratio(torch.randn(4)),
        ("outlier_channel_ratio", "k")),
    Bad("outlier_channel_ratio", "empty", lambda: S.outlier_channel_ratio(torch.randn(2, 0, 4)),
        ("outlier_channel_ratio", "k")),
    Edge("outlier_channel_ratio", "zero", lambda: S.outlier_channel_ratio(torch.zeros(2, 3, 4)),
         lambda r: r.shape == (2,) and bool(r.isnan().all())),
    Bad("outlier_channel_ratio", "integer-dtype", lambda: S.outlier_channel_ratio(_KV.long()),
        ("outlier_channel_ratio", "k")),
    # continuous batching
    Bad("Request", "zero", lambda: _request(output_len=0), ("Request", "output_len")),
    Bad("Request", "non-integer", lambda: _request(prompt_len=2.0), ("Request", "prompt_len")),
    Bad("Request", "negative", lambda: _request(arrival_step=-1), ("Request", "arrival_step")),
    Bad("Request", "wrong-shape", lambda: _request(prompt=(1,)), ("Request", "prompt")),
    Bad("Request", "out-of-range", lambda: _request(prompt=(1, -2)), ("Request", "prompt")),
    Bad("synthetic_trace", "zero", lambda: S.synthetic_trace(0, generator=torch.Generator()),
        ("synthetic_trace", "n_requests")),
    Bad("synthetic_trace", "nan", lambda: S.synthetic_trace(3, generator=torch.Generator(), arrival_rate=NAN),
        ("synthetic_trace", "arrival_rate")),
    Bad("synthetic_trace", "out-of-range", lambda: S.synthetic_trace(3, generator=torch.Generator(), prompt_len=(5, 2)),
        ("synthetic_trace", "prompt_len")),
    Bad("synthetic_trace", "non-integer", lambda: S.synthetic_trace(3, generator=torch.Generator(), output_len=(1, 2.5)),
        ("synthetic_trace", "output_len")),
    Bad("synthetic_trace", "wrong-type", lambda: S.synthetic_trace(3, generator=0), ("synthetic_trace", "generator")),
    Bad("PagedModel", "zero", lambda: _paged(n_blocks=0), ("PagedModel", "n_blocks")),
    Bad("PagedModel", "non-integer", lambda: _paged(block_size=2.5), ("PagedModel", "block_size")),
    Bad("PagedModel", "wrong-type", lambda: S.PagedModel(torch.nn.Linear(2, 2), n_blocks=2, block_size=2),
        ("PagedModel", "model")),
    Bad("PagedModel", "out-of-range", lambda: _paged().prefill(_request(prompt=(1, 11))),
        ("PagedModel.prefill", "prompt", "[0, 11)")),
    Bad("PagedModel", "out-of-range", lambda: _decode([11]), ("PagedModel.decode", "tokens", "[0, 11)")),
    Bad("PagedModel", "wrong-type", lambda: _paged().prefill((1, 2)), ("PagedModel.prefill", "request")),
    Bad("continuous_batching", "zero", lambda: S.continuous_batching([_request()], _paged(), max_batch=0),
        ("continuous_batching", "max_batch")),
    Bad("continuous_batching", "wrong-type", lambda: S.continuous_batching([(1, 2)], _paged(), max_batch=2),
        ("continuous_batching", "requests")),
    Bad("continuous_batching", "out-of-range",
        lambda: S.continuous_batching([_request(output_len=40)], _paged(n_blocks=2), max_batch=2),
        ("continuous_batching", "requests", "needs")),
    Edge("continuous_batching", "empty", lambda: S.continuous_batching([], _paged(), max_batch=2),
         lambda r: r.steps == 0 and r.tokens == 0),
    Edge("ServeResult", "empty", lambda: S.continuous_batching([], _paged(), max_batch=2).summary(),
         lambda s: s["steps"] == s["tokens"] == s["peak_blocks"] == 0 and s["tokens_per_step"] == 0
         and all(math.isnan(s[k]) for k in ("mean_latency", "p95_latency", "mean_ttft"))),
    Edge("PagedModel", "empty", lambda: _paged().decode([], []), lambda r: r == []),
    Bad("PagedModel", "wrong-shape", lambda: _paged().decode([0], []), ("PagedModel.decode", "seq_ids", "tokens")),
    Bad("static_batching", "non-integer", lambda: S.static_batching([_request()], _paged(), max_batch=1.5),
        ("static_batching", "max_batch")),
    Bad("static_batching", "wrong-type", lambda: S.static_batching([_request()], "engine", max_batch=1),
        ("static_batching", "engine")),
]  # fmt: skip

EXEMPT = {
    "DEEPSEEK_V2": "a constant: the published sizes of DeepSeek-V2's attention",
    "SpeculativeStats": "a dataclass of counts that speculative_generate returns",
    "QuantizedTensor": "a frozen dataclass of results that quantize returns (checked by dequantize's row)",
    "RequestTiming": "a dataclass of step counts that the schedulers fill in",
}
