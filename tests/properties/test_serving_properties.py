"""Properties of attnbook.serving that its docstrings promise, checked on shapes, dtypes and
values hypothesis draws: sampling in half precision against a float64 softmax (and the model's
own sampling in ``TinyGPT.generate``), speculative decoding with models left in training mode,
what a chunk sees through a sink cache, the quantization bound per dtype, the cache classes'
byte counts, and the documented results of empty inputs (issue 38)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbook import serving as S
from attnbook.models import TinyGPT, TransformerConfig

HALF = [torch.float16, torch.bfloat16]
INF = float("inf")


def finite_logits(dtype, rows, vocab, data):
    """``(rows, vocab)`` logits in ``dtype``: any finite values of the dtype's range (the
    largest included, where ``logits / temperature`` overflowed), some ``-inf`` (a
    token that cannot be drawn), at least one finite entry a row."""
    big = float(torch.finfo(dtype).max) if dtype != torch.float32 else 1e30
    value = st.one_of(
        st.floats(-8, 8), st.floats(-big, big), st.sampled_from([-big, big, 0.0, -INF])
    )
    x = torch.tensor(
        data.draw(st.lists(value, min_size=rows * vocab, max_size=rows * vocab)),
        dtype=torch.float64,
    ).view(rows, vocab)
    x[:, 0] = x[:, 0].nan_to_num(neginf=0.0)  # one finite logit a row
    x = x.to(dtype)
    assert torch.isfinite(x[:, 0]).all()
    return x


def reference_probs(logits, temperature, top_k=None):
    """The sampling distribution written in float64: top-k on the logits as given, then
    softmax(logits / temperature)."""
    x = logits.double()
    if top_k is not None:
        kth = x.topk(min(top_k, x.shape[-1]), dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, -INF)
    return torch.softmax(x / temperature, dim=-1)


temperatures = st.one_of(
    st.sampled_from([1e-4, 2e-4, 1e-3, 0.01]), st.floats(1e-4, 10.0)
)


@settings(max_examples=80)
@given(
    dtype=st.sampled_from(HALF + [torch.float32]),
    temperature=temperatures,
    top_k=st.none() | st.integers(1, 9),
    rows=st.integers(1, 3),
    vocab=st.integers(1, 9),
    data=st.data(),
)
def test_sampling_probs_in_every_dtype_equal_a_float64_softmax(dtype, temperature, top_k, rows, vocab, data):
    """No NaN, rows summing to 1, and each probability within one rounding of the dtype of
    the float64 reference, for temperatures down to 1e-4 and logits up to the dtype's
    largest (float16 logits / 1e-4 overflowed and gave NaN)."""
    logits = finite_logits(dtype, rows, vocab, data)
    probs = S.sampling_probs(logits, temperature, top_k)
    assert probs.dtype == dtype and probs.shape == logits.shape
    assert not probs.isnan().any()
    want = reference_probs(logits, temperature, top_k)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(probs.double(), want, atol=eps, rtol=0)
    torch.testing.assert_close(probs.double().sum(-1), torch.ones(rows, dtype=torch.float64),
                               atol=vocab * eps, rtol=0)


def test_sampling_probs_regression_float16_at_temperature_1e4():
    """The reported case: float16 logits at temperature 1e-4 gave NaN."""
    logits = torch.tensor([[3.0, 2.5, -1.0], [100.0, 100.0, 99.0]], dtype=torch.float16)
    probs = S.sampling_probs(logits, 1e-4)
    torch.testing.assert_close(probs.float(), torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0]]))
    top1 = S.sampling_probs(logits, 1e-4, top_k=1)
    torch.testing.assert_close(top1.float(), torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0]]))


def loud_gpt(dtype, seed=0, vocab=11):
    """A TinyGPT in ``dtype`` whose logits reach the hundreds (its head scaled up), so a
    low temperature divides them past float16's range."""
    torch.manual_seed(seed)
    model = TinyGPT(TransformerConfig(vocab_size=vocab, d_model=16, n_heads=2, n_layers=1))
    with torch.no_grad():
        model.head.weight.mul_(60.0)
    return model.to(dtype).eval()


@settings(max_examples=12)
@given(dtype=st.sampled_from(HALF), temperature=temperatures, top_k=st.none() | st.integers(1, 5),
       seed=st.integers(0, 10**6))
def test_generate_in_half_precision_samples_the_float64_softmax(dtype, temperature, top_k, seed):
    """A half-precision model at temperatures down to 1e-4: no error (multinomial refused the
    NaN probabilities), and 3,000 first tokens drawn for one prompt follow softmax(logits /
    temperature) computed in float64 from the same logits (every cell within 5 standard
    errors). ``use_cache=False`` runs the very forward pass the reference reads; the cached
    path must sample too."""
    model, n = loud_gpt(dtype), 3000
    prompt = torch.randint(11, (1, 4), generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed)
    batch = prompt.expand(n, -1)
    out = model.generate(batch, 1, use_cache=False, temperature=temperature, top_k=top_k, generator=g)
    with torch.no_grad():
        logits = model(batch)[:, -1]
    assert logits.abs().max() > 6.6  # logits / 1e-4 is past float16's 65504
    p = reference_probs(logits[0], temperature, top_k)
    counts = torch.bincount(out[:, -1], minlength=11).double()
    sigma = (p * (1 - p) / n).sqrt()
    assert ((counts / n - p).abs() <= 5 * sigma + 1e-9).all(), (counts / n, p)
    cached = model.generate(prompt.expand(4, -1), 3, temperature=temperature, top_k=top_k, generator=g)
    assert cached.shape == (4, 7) and bool(((cached >= 0) & (cached < 11)).all())


def test_generate_regression_float16_at_temperature_1e4():
    """The reported case: a float16 model at temperature 1e-4 raised from multinomial; its
    tokens are now the greedy ones (the logits here have no ties)."""
    model = loud_gpt(torch.float16)
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]])
    sampled = model.generate(prompt, 5, temperature=1e-4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sampled, model.generate(prompt, 5))


# ------------------------------------------------------------------ eval mode, as generate
def dropout_gpt(seed, vocab=13, **kw):
    """A float64 model with dropout 0.3 everywhere, left in training mode, one submodule in
    eval mode (whose mode must come back too)."""
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=vocab, d_model=16, n_heads=2, n_layers=2, dropout=0.3, **kw)
    model = TinyGPT(cfg).double().train()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    model.blocks[1].eval()
    return model


def modes(model):
    return [m.training for m in model.modules()]


@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_speculative_generate_with_models_left_training_is_target_generate(attention):
    """Dropout 0.3, both models left in train(): greedy speculation gives target.generate's
    tokens (generate switches to eval itself); sampling gives the tokens the same call gives
    with both models in eval mode; every submodule's mode comes back."""
    target, draft = dropout_gpt(0, attention=attention), dropout_gpt(1)
    before_t, before_d = modes(target), modes(draft)
    prompt = torch.randint(13, (2, 4), generator=torch.Generator().manual_seed(0))
    out, _ = S.speculative_generate(target, draft, prompt, 9, k=3)
    assert modes(target) == before_t and modes(draft) == before_d
    assert torch.equal(out, target.generate(prompt, 9))

    def sample(t, d):
        g = torch.Generator().manual_seed(5)
        return S.speculative_generate(t, d, prompt, 9, k=3, temperature=1.0, generator=g)[0]

    training = sample(target, draft)
    assert modes(target) == before_t and modes(draft) == before_d
    assert torch.equal(training, sample(target.eval(), draft.eval()))


def test_streaming_losses_and_first_token_attention_run_in_eval_mode_and_restore_modes():
    model, ids = dropout_gpt(0), torch.randint(13, (12,), generator=torch.Generator().manual_seed(1))
    before = modes(model)
    losses, first = S.streaming_losses(model, ids), S.first_token_attention(model, ids)
    assert modes(model) == before  # train(was_training) used to reset blocks[1] to training
    model.eval()
    torch.testing.assert_close(losses, S.streaming_losses(model, ids))
    torch.testing.assert_close(first, S.first_token_attention(model, ids))


# ------------------------------------------------------------------ what a chunk sees through sinks
def sink_updates(n_sink, window, chunks):
    """Positions 0, 1, ... appended in ``chunks`` (keys = their position): per chunk ``(n,
    T, the positions update returned, in order)``."""
    cache, n, out = S.SinkKVCache(1, 1, 1, 1, n_sink, window, dtype=torch.float64), 0, []
    for T in chunks:
        k = torch.arange(n, n + T, dtype=torch.float64).view(1, 1, T, 1)
        out.append((n, T, cache.update(0, k, k)[0].flatten().long().tolist()))
        n += T
    return out


@given(n_sink=st.integers(0, 3), window=st.integers(1, 5),
       chunks=st.lists(st.integers(1, 9), min_size=1, max_size=6))
def test_a_chunk_through_a_sink_cache_sees_what_its_docstring_says(n_sink, window, chunks):
    """Against the same positions appended one at a time (one decode step each): with a
    causal mask aligned bottom-right, query n + i of a chunk sees the returned positions up
    to its own. T <= window: the last query sees exactly its decode step's positions (the
    same list, so the same indices: rotated alike), the others a subset of theirs. T >
    window: query n + i sees the sinks and n .. n + i, the last one T > window recent positions
    once the sinks are full (the old docstring said it saw what a decode step would)."""
    steps = sink_updates(n_sink, window, [1] * sum(chunks))
    for n, T, returned in sink_updates(n_sink, window, chunks):
        for i in range(T):
            seen = returned[: len(returned) - T + i + 1]
            assert seen == [p for p in returned if p <= n + i] and seen[-1] == n + i
            decode = steps[n + i][2]
            if T <= window:
                assert set(seen) <= set(decode)
                if i == T - 1:
                    assert seen == decode
            else:
                assert seen == sorted(set(range(min(n_sink, n + i + 1))) | set(range(n, n + i + 1)))
                recent = [p for p in seen if p >= n_sink]
                assert len(recent) == max(0, n + i + 1 - max(n, n_sink))  # i + 1 past the sinks


@settings(max_examples=10)
@given(n_sink=st.integers(0, 3), window=st.integers(2, 6), seed=st.integers(0, 100),
       chunks=st.lists(st.integers(1, 6), min_size=2, max_size=6))
def test_a_one_layer_model_reads_a_chunk_of_at_most_window_tokens_as_decoding(n_sink, window, seed, chunks):
    """A one-layer model (keys are projections of the embeddings, the same in both runs) fed
    a stream in chunks of T <= window through a sink cache: each chunk's last logits equal
    those of feeding the tokens one at a time."""
    chunks = [min(T, window) for T in chunks]
    torch.manual_seed(seed)
    model = TinyGPT(TransformerConfig(vocab_size=17, d_model=16, n_heads=2, n_layers=1)).double().eval()
    ids = torch.randint(17, (1, sum(chunks)), generator=torch.Generator().manual_seed(seed))

    def cache():
        return S.SinkKVCache(1, 1, 2, 8, n_sink, window, dtype=torch.float64)

    one, chunked, start = cache(), cache(), 0
    with torch.no_grad():
        steps = torch.cat([model(ids[:, t : t + 1], cache=one)[:, -1] for t in range(ids.shape[1])])
        for T in chunks:
            last = model(ids[:, start : start + T], cache=chunked)[0, -1]
            start += T
            torch.testing.assert_close(last, steps[start - 1], atol=1e-10, rtol=1e-10)


@settings(max_examples=8)
@given(dtype=st.sampled_from(HALF), temperature=temperatures, top_k=st.none() | st.integers(1, 5),
       k=st.integers(1, 4), seed=st.integers(0, 10**6))
def test_speculative_generate_in_half_precision_at_low_temperatures(dtype, temperature, top_k, k, seed):
    """Half-precision target and draft with logits in the hundreds: sampling_probs gives
    distributions speculative_accept takes (rows summing to 1 up to the dtype's rounding),
    every temperature down to 1e-4 runs and writes token ids of the vocabulary."""
    target, draft = loud_gpt(dtype, seed=0), loud_gpt(dtype, seed=1)
    prompt = torch.randint(11, (3, 4), generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed)
    out, stats = S.speculative_generate(target, draft, prompt, 6, k=k, temperature=temperature,
                                        top_k=top_k, generator=g)
    assert out.shape == (3, 10) and torch.equal(out[:, :4], prompt)
    assert bool(((out >= 0) & (out < 11)).all()) and stats.generated == 6


def test_speculative_accept_refuses_what_is_not_a_distribution():
    """Regression: a negative or NaN probability reached multinomial's RuntimeError (or a
    negative q was accepted silently); an unnormalized row gave a wrong acceptance rate."""
    p, q, x = torch.full((1, 2, 4), 0.25), torch.full((1, 1, 4), 0.25), torch.zeros(1, 1, dtype=torch.long)
    for bad_p, bad_q, words in [
        (p.index_fill(2, torch.tensor([3]), -0.25), q, "p must hold probabilities"),
        (p, q.index_fill(2, torch.tensor([3]), float("nan")), "q must hold probabilities .* NaN"),
        (p, q * 0.5, "every row of q must sum to 1"),
    ]:
        with pytest.raises(ValueError, match=f"speculative_accept: {words}"):
            S.speculative_accept(bad_p, bad_q, x)
    half = S.sampling_probs(torch.randn(1, 2, 50, dtype=torch.float16) * 4, 0.7)
    S.speculative_accept(half, half[:, :1], x)  # half-precision rounding is accepted


# ------------------------------------------------------------------ serving: summary and empty steps
def test_serve_summary_equals_its_statistics_written_out_and_empty_inputs_are_documented():
    """ServeResult.summary against the statistics computed here by hand (the p95 with linear
    interpolation between the two nearest order statistics); an empty request list gives
    counts 0 and nan per-request statistics (it raised from torch.quantile), and
    PagedModel.decode([], []) is [] (it failed inside the embedding)."""
    torch.manual_seed(0)
    model = TinyGPT(TransformerConfig(vocab_size=32, d_model=16, n_heads=2, n_layers=1)).eval()
    trace = S.synthetic_trace(9, generator=torch.Generator().manual_seed(3), output_len=(1, 12))
    for policy in (S.continuous_batching, S.static_batching):
        engine = S.PagedModel(model, n_blocks=24, block_size=4, max_len=64)
        result = policy(trace, engine, max_batch=3)
        s, timings = result.summary(), list(result.timings.values())
        latencies = sorted(t.latency for t in timings)
        at = 0.95 * (len(latencies) - 1)
        lo, frac = int(at), at - int(at)
        p95 = latencies[lo] + frac * (latencies[min(lo + 1, len(latencies) - 1)] - latencies[lo])
        assert s["p95_latency"] == pytest.approx(p95)
        assert s["mean_latency"] == pytest.approx(sum(latencies) / len(latencies))
        assert s["mean_ttft"] == pytest.approx(sum(t.time_to_first_token for t in timings) / len(timings))
        assert s["tokens"] == sum(r.output_len for r in trace) and s["steps"] == len(result.running)
        assert s["tokens_per_step"] == s["tokens"] / s["steps"]
        assert s["peak_blocks"] == max(result.blocks_in_use)
        assert engine.decode([], []) == []
    empty = S.continuous_batching([], S.PagedModel(model, n_blocks=2, block_size=4), max_batch=1).summary()
    assert (empty["steps"], empty["tokens"], empty["tokens_per_step"], empty["peak_blocks"]) == (0, 0, 0, 0)
    assert all(math.isnan(empty[k]) for k in ("mean_latency", "p95_latency", "mean_ttft"))


# ------------------------------------------------------------------ streaming an MLA model
def mla_gpt(seed=0):
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=32, d_model=16, n_heads=2, n_layers=2, attention="mla")
    return TinyGPT(cfg).double().eval()


def test_streaming_losses_of_an_mla_model_read_a_latent_cache():
    """cache='full' on an MLA model raised a TypeError from inside the MLA layer (a KV cache
    was built for it): it now builds a latent cache, and the losses equal the full forward's
    cross-entropy, as a given LatentKVCache does. Caches of keys and values are refused for
    MLA, a latent cache for MHA, by a ValueError naming cache."""
    model, ids = mla_gpt(), torch.randint(32, (18,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        logits = model(ids[None])[0, :-1].float()  # streaming_losses takes the loss in float32
    expected = torch.nn.functional.cross_entropy(logits, ids[1:], reduction="none")
    torch.testing.assert_close(S.streaming_losses(model, ids), expected, atol=1e-6, rtol=1e-6)
    given = S.streaming_losses(model, ids, cache=model.make_cache(1, 18))
    torch.testing.assert_close(given, expected, atol=1e-6, rtol=1e-6)
    for cache in ("window", "sinks"):
        with pytest.raises(ValueError, match=f"streaming_losses: cache='{cache}' .* attention='mla'"):
            S.streaming_losses(model, ids, cache=cache)
    from attnbook.kvcache import KVCache

    with pytest.raises(ValueError, match="streaming_losses: cache must be a LatentKVCache"):
        S.streaming_losses(model, ids, cache=KVCache(2, 1, 2, 8, 18, dtype=torch.float64))
    mha = TinyGPT(TransformerConfig(vocab_size=32, d_model=16, n_heads=2, n_layers=2)).double()
    with pytest.raises(ValueError, match="streaming_losses: cache must be a cache of keys and values"):
        S.streaming_losses(mha, ids, cache=model.make_cache(1, 18))


# ------------------------------------------------------------------ the quantization bound per dtype
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def drawn_tensor(data, dtype, shape):
    """Gaussian values times a drawn magnitude plus a drawn offset (a group whose range is
    small next to its values is where rounding hurts most), cast to ``dtype``: at most
    about 32,000, inside float16's range."""
    seed = data.draw(st.integers(0, 10**6), label="seed")
    magnitude = data.draw(st.sampled_from([1e-3, 0.1, 1.0, 30.0, 300.0]), label="magnitude")
    offset = data.draw(st.sampled_from([0.0, 1.0, -5.0, 100.0]), label="offset")
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return ((x + offset) * magnitude).to(dtype)


@settings(max_examples=60)
@given(dtype=st.sampled_from(DTYPES), bits=st.sampled_from([4, 8]), group_size=st.integers(1, 8),
       groups=st.integers(1, 3), rows=st.integers(1, 4), data=st.data())
def test_quantize_is_within_half_a_step_in_every_dtype(dtype, bits, group_size, groups, rows, data):
    """float32, float16 and bfloat16 inputs: float32 scales and zeros, dequantize in float32,
    and |x - x_hat| <= s / 2 up to float32 arithmetic (bfloat16 arithmetic reached 2 steps,
    float16 0.8, before the scales went to float32)."""
    x = drawn_tensor(data, dtype, (rows, group_size * groups))
    dim = data.draw(st.sampled_from([-1, 1]), label="dim")
    q = S.quantize(x, bits, dim=dim, group_size=group_size)
    assert q.scale.dtype == q.zero.dtype == torch.float32
    back = S.dequantize(q)
    assert back.dtype == torch.float32 and back.shape == x.shape
    s = q.scale.double().repeat_interleave(group_size, dim=1)
    err = (back.double() - x.double()).abs()
    slack = 4 * torch.finfo(torch.float32).eps * x.double().abs().amax()
    assert bool((err <= s / 2 * (1 + 1e-6) + slack).all()), float((err / s).max())


@settings(max_examples=30)
@given(dtype=st.sampled_from(DTYPES), bits=st.sampled_from([4, 8]),
       key_axis=st.sampled_from(["channel", "token"]), chunks=st.lists(st.integers(1, 6), min_size=1, max_size=4),
       data=st.data())
def test_a_quantized_cache_returns_entries_within_half_a_step_and_one_rounding(dtype, bits, key_axis, chunks, data):
    """Each entry a QuantizedKVCache returns, in its dtype, is within s / 2 of the entry
    appended plus half a unit in the last place of the dtype (the final rounding), s the
    scale of its group; bytes_per_token counts float32 scales whatever the dtype."""
    cache = S.QuantizedKVCache(1, 1, 2, 4, 32, bits=bits, group_size=2, key_axis=key_axis, dtype=dtype)
    ks, vs = [], []
    for T in chunks:
        k, v = drawn_tensor(data, dtype, (1, 2, T, 4)), drawn_tensor(data, dtype, (1, 2, T, 4))
        k_out, v_out = cache.update(0, k, v)
        ks.append(k), vs.append(v)
    half_ulp = torch.finfo(dtype).eps / 2
    for name, out, exact in (("k", k_out, torch.cat(ks, -2)), ("v", v_out, torch.cat(vs, -2))):
        assert out.dtype == dtype and out.shape == exact.shape
        q, n = cache.quantized[name][0], exact.shape[-2]
        s = torch.zeros(exact.shape, dtype=torch.float64)  # the residual is exact
        if q is not None and cache.axes[name] == "token":
            s = q.scale.double().repeat_interleave(2, dim=-1)
        elif q is not None:
            full = q.shape[-2]
            s[..., :full, :] = q.scale.double().repeat_interleave(2, dim=-2)
        err = (out.double() - exact.double()).abs()
        bound = s / 2 * (1 + 1e-6) + half_ulp * (exact.double().abs() + s) + 1e-30
        assert bool((err <= bound).all()), (name, float((err - bound).max()))
        assert n == sum(chunks)
    assert cache.bytes_per_token == 2 * 2 * (math.ceil(4 * bits / 8) + 2 * 4 / 2 * 4)


# ------------------------------------------------------------------ docstring claims, one by one
def distributions(data, shape, label):
    """Random distributions over the last dimension, some entries exactly 0."""
    w = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0, 7.0]),
                                        min_size=math.prod(shape), max_size=math.prod(shape)),
                               label=label), dtype=torch.float64).view(shape)
    w[..., 0] += 0.25  # no empty row
    return w / w.sum(-1, keepdim=True)


@given(rows=st.integers(1, 3), vocab=st.integers(1, 6), data=st.data())
def test_one_minus_acceptance_probability_is_the_total_variation_distance(rows, vocab, data):
    p, q = distributions(data, (rows, vocab), "p"), distributions(data, (rows, vocab), "q")
    beta = S.acceptance_probability(p, q)
    torch.testing.assert_close(1 - beta, 0.5 * (p - q).abs().sum(-1))
    assert bool(((beta >= 0) & (beta <= 1 + 1e-12)).all())
    torch.testing.assert_close(beta, S.acceptance_probability(q, p))


@given(B=st.integers(1, 3), k=st.integers(0, 4), vocab=st.integers(1, 5), data=st.data())
def test_with_one_hot_p_and_q_the_acceptance_rule_is_deterministic(B, k, vocab, data):
    """Temperature 0: accept while the draft's argmax is the target's, then the target's
    argmax, whatever the generator draws."""
    ids = st.integers(0, vocab - 1)
    target = torch.tensor(data.draw(st.lists(ids, min_size=B * (k + 1), max_size=B * (k + 1)))).view(B, k + 1)
    draft = torch.tensor(data.draw(st.lists(ids, min_size=B * k, max_size=B * k)), dtype=torch.long).view(B, k)
    p = torch.nn.functional.one_hot(target, vocab).double()
    q = torch.nn.functional.one_hot(draft, vocab).double()
    for seed in range(3):
        n, token = S.speculative_accept(p, q, draft, generator=torch.Generator().manual_seed(seed))
        for b in range(B):
            agree = 0
            while agree < k and draft[b, agree] == target[b, agree]:
                agree += 1
            assert int(n[b]) == agree and int(token[b]) == int(target[b, agree])


@given(alpha=st.floats(0, 1), k=st.integers(0, 8), cost=st.floats(0, 2))
def test_expected_tokens_per_call_is_the_sum_of_powers_and_the_speedup_divides_it(alpha, k, cost):
    tokens = S.expected_tokens_per_call(alpha, k)
    assert tokens == pytest.approx(sum(alpha**i for i in range(k + 1)), rel=1e-9, abs=1e-12)
    assert 1 <= tokens <= k + 1 + 1e-12
    assert S.expected_speedup(alpha, k, cost) == pytest.approx(tokens / (k * cost + 1), rel=1e-12)


def test_speculative_stats_properties_and_counts():
    """acceptance_rate is accepted / proposed (nan with none proposed); tokens per target
    call is generated / target_calls (0 with no call); a draft equal to the target gives
    k + 1 tokens a call."""
    assert math.isnan(S.SpeculativeStats().acceptance_rate)
    assert S.SpeculativeStats().tokens_per_target_call == 0.0
    assert S.SpeculativeStats(proposed=8, accepted=6).acceptance_rate == 0.75
    target = loud_gpt(torch.float64)
    prompt = torch.tensor([[1, 2, 3]])
    _, stats = S.speculative_generate(target, target, prompt, 0)
    assert (stats.target_calls, stats.tokens_per_target_call) == (0, 0.0)
    _, stats = S.speculative_generate(target, target, prompt, 12, k=3)
    assert stats.tokens_per_target_call == 4 and stats.acceptance_rate == 1.0
    assert stats.draft_calls == stats.proposed == 9  # the last round drafts none past 12


@given(dtype=st.sampled_from(DTYPES + [torch.float64]), bits=st.sampled_from([4, 8]),
       group_size=st.integers(2, 8), data=st.data())
def test_quantize_gives_back_each_groups_minimum_exactly_and_its_maximum_up_to_rounding(dtype, bits, group_size, data):
    x = drawn_tensor(data, dtype, (3, group_size))
    back = S.dequantize(S.quantize(x, bits, dim=-1))
    wide = x.to(back.dtype)
    lo, hi = wide.argmin(-1, keepdim=True), wide.argmax(-1, keepdim=True)
    assert torch.equal(back.gather(-1, lo), wide.gather(-1, lo))
    eps = torch.finfo(back.dtype).eps
    err = (back.gather(-1, hi) - wide.gather(-1, hi)).abs()
    assert bool((err <= 4 * eps * wide.abs().amax(-1, keepdim=True)).all())


@given(shape=st.lists(st.integers(1, 3), min_size=0, max_size=2), seq=st.integers(1, 6),
       head_dim=st.integers(1, 7), seed=st.integers(0, 1000))
def test_outlier_channel_ratio_is_the_largest_channel_over_the_median_written_out(shape, seq, head_dim, seed):
    k = torch.randn(*shape, seq, head_dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    got = S.outlier_channel_ratio(k)
    assert got.shape == tuple(shape)
    for index in (torch.cartesian_prod(*[torch.arange(n) for n in shape]).view(-1, len(shape)).tolist()
                  if shape else [[]]):
        m = sorted(float(k[tuple(index)][:, c].abs().mean()) for c in range(head_dim))
        assert float(got[tuple(index)]) == pytest.approx(m[-1] / m[(head_dim - 1) // 2], rel=1e-12)
    assert S.outlier_channel_ratio(torch.zeros(1, 3, 4)).isnan().all()


def test_mla_projections_have_no_bias_and_the_sink_cache_holds_n_sink_plus_window_slots():
    m = S.MultiHeadLatentAttention(8, 2, 5, 4, q_latent_dim=3)
    assert all(layer.bias is None for layer in m.modules() if isinstance(layer, torch.nn.Linear))
    cache = S.SinkKVCache(2, 1, 1, 1, n_sink=3, window=4)
    for _ in range(5):
        cache.update(0, torch.zeros(1, 1, 6, 1), torch.zeros(1, 1, 6, 1))
    assert cache.k.shape[3] == cache.v.shape[3] == 3 + 4 and cache.length == 0 and cache.lengths[0] == 30


@settings(max_examples=6)
@given(n_requests=st.integers(1, 10), rate=st.sampled_from([0.2, 1.0, 4.0]), max_batch=st.integers(1, 4),
       block_size=st.sampled_from([2, 4]), seed=st.integers(0, 100))
def test_schedulers_admit_first_come_first_served_and_static_batches_start_when_full(
        n_requests, rate, max_batch, block_size, seed):
    """Continuous batching: first tokens in arrival order (first come, first served), at most
    max_batch running and the pool never exceeded. Static batching, with a pool that never
    binds: consecutive groups of max_batch in arrival order (the last one smaller), each
    starting the step after its last member arrived and the previous group returned, every
    member finishing with its longest; every layer of the paged cache takes the same blocks."""
    torch.manual_seed(0)
    model = TinyGPT(TransformerConfig(vocab_size=32, d_model=16, n_heads=2, n_layers=2)).eval()
    trace = S.synthetic_trace(n_requests, generator=torch.Generator().manual_seed(seed), prompt_len=(1, 6),
                              output_len=(1, 9), arrival_rate=rate)
    order = sorted(trace, key=lambda r: (r.arrival_step, r.id))
    need = max(-(-(r.prompt_len + r.output_len - 1) // block_size) for r in trace)
    small = S.PagedModel(model, n_blocks=need + 1, block_size=block_size, max_len=64)
    result = S.continuous_batching(trace, small, max_batch=max_batch)
    firsts = [result.timings[r.id].first_token for r in order]
    assert firsts == sorted(firsts) and max(result.running) <= max_batch
    assert max(result.blocks_in_use) <= need + 1
    engine = S.PagedModel(model, n_blocks=need * max_batch, block_size=block_size, max_len=64)
    result = S.static_batching(trace, engine, max_batch=max_batch)
    previous_finish = 0
    for start in range(0, n_requests, max_batch):
        batch = order[start : start + max_batch]
        first = {result.timings[r.id].first_token for r in batch}
        assert first == {max(previous_finish, batch[-1].arrival_step) + 1}
        finish = {result.timings[r.id].finish for r in batch}
        assert finish == {first.pop() + max(r.output_len for r in batch) - 1}
        previous_finish = finish.pop()
    engine = S.PagedModel(model, n_blocks=8, block_size=block_size)
    engine.prefill(S.Request(99, 5, 1, 0, (1, 2, 3, 4, 5)))
    engine.decode([99], [7])
    assert engine.caches[0].block_tables == engine.caches[1].block_tables != {}
