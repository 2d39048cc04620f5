"""Loop-level oracles of attnbook's attention mechanisms (issue 23): slow and obviously right.

Every mechanism is written here straight from its definition (the docstrings of the package,
``attnbook/contract.py`` and the papers they cite), never by calling the package's mask builders:

* a *predicate* says whether query ``i`` sees key ``j``, one plain Python expression per mechanism;
* an explicit Python loop over batch entries, heads and queries lists each query's visible keys,
  scores them (``scale * q_i . k_j``, then the mechanism's soft cap, additive bias or rotation),
  takes a softmax over those keys only and averages their values;
* everything runs in float64; a query with no visible key (or whose every score is ``-inf``) gets
  zeros, the contract's rule.

The loops use torch scalar and vector operations, so autograd flows through them: the differential
tests compare gradients with the oracle's too. Random patterns (``random_mask``, BigBird's random
blocks, LSH) are drawn from the same generator in the same order as the function draws them, as its
docstring and source say, and the choice from that draw is then written out here.

Grouped-query attention follows the contract: query head ``h`` reads key/value head
``h // (Hq // Hk)``; a head count of 1 broadcasts like any batch dimension.
"""

from __future__ import annotations

import itertools
import math

import torch

NEG_INF = -math.inf


# ==================================================================================================
# Visibility predicates: (query i, key j) -> may attend. One line each, from the definitions.
# ==================================================================================================
def causal(i: int, j: int, L: int, S: int) -> bool:
    """Bottom-right causal (contract): query ``i`` sees key ``j`` when ``j <= i + S - L``."""
    return j <= i + S - L


def window_size(i: int, j: int, L: int, S: int, left: int, right: int) -> bool:
    """FlashAttention-2's ``window_size=(left, right)``: ``j`` in ``[i + S - L - left, i + S - L + right]``,
    ``-1`` leaving a side unbounded."""
    offset = j - (i + S - L)
    return (left < 0 or offset >= -left) and (right < 0 or offset <= right)


def sliding_window(i: int, j: int, window: int, dilation: int = 1, is_causal: bool = False,
                   shift: int = 0) -> bool:
    """Longformer's (dilated) sliding window: ``t = i + shift - j``, ``|t| <= window * dilation``,
    ``t % dilation == 0``, and ``t >= 0`` if causal (``shift = S - L`` aligns bottom-right)."""
    t = i + shift - j
    return abs(t) <= window * dilation and t % dilation == 0 and (not is_causal or t >= 0)


def global_tokens(i: int, j: int, global_idx) -> bool:
    """Global tokens attend to and are attended by every token."""
    return i in global_idx or j in global_idx


def in_block(i: int, j: int, block_mask, block_size: int) -> bool:
    """Block-sparse layouts: the tile ``(i // b, j // b)`` is active."""
    return bool(block_mask[i // block_size][j // block_size])


def compressed_block(i: int, block: int, stride: int, L: int, S: int) -> bool:
    """Memory-compressed attention, causal: block ``b`` is visible when its last REAL key,
    ``min((b + 1) s, S) - 1``, is."""
    return min((block + 1) * stride, S) - 1 <= i + S - L


def same_document(i: int, j: int, q_docs, kv_docs, is_causal: bool) -> bool:
    """Packed sequences: the same document, and with ``is_causal`` the key's index within its
    document at most the query's plus ``S_d - L_d`` (bottom-right per document)."""
    d = q_docs[i]
    if kv_docs[j] != d:
        return False
    if not is_causal:
        return True
    i_d, j_d = i - q_docs.index(d), j - kv_docs.index(d)
    return j_d <= i_d + kv_docs.count(d) - q_docs.count(d)


def sliding_cache(p: int, j: int, window: int) -> bool:
    """A decode step at position ``p`` with a sliding-window cache sees positions ``p - w < j <= p``."""
    return p - window < j <= p


# ==================================================================================================
# Random patterns, from the function's own draw
# ==================================================================================================
def random_keys(seq_len: int, n_random: int, generator: torch.Generator) -> list[set[int]]:
    """``sparse.random_mask``: one ``torch.rand(seq_len, seq_len)`` draw; query ``i`` keeps the
    ``n_random`` keys with the smallest draws in its row."""
    draw = torch.rand(seq_len, seq_len, generator=generator).tolist()
    return [set(sorted(range(seq_len), key=lambda j: draw[i][j])[:n_random]) for i in range(seq_len)]


def bigbird_blocks(n_blocks: int, n_global: int, n_window: int, n_random: int,
                   generator: torch.Generator | None) -> list[list[bool]]:
    """BigBird-ITC (Zaheer et al., 2020) as ``sparse.bigbird_block_mask`` documents it: the first and
    last ``n_global`` blocks are global (full rows and columns); row ``i`` sees offsets
    ``-(w // 2) .. w - 1 - w // 2``; each non-global row adds the ``n_random`` blocks not already chosen
    with the smallest values of one ``torch.rand(n_blocks, n_blocks)`` draw (made only when
    ``n_random > 0``)."""
    def is_global(b):
        return b < n_global or b >= n_blocks - n_global

    mask = [[(-(n_window // 2) <= j - i < n_window - n_window // 2) or is_global(i) or is_global(j)
             for j in range(n_blocks)] for i in range(n_blocks)]
    if n_random:
        draw = torch.rand(n_blocks, n_blocks, generator=generator).tolist()
        for i in range(n_blocks):
            if is_global(i):
                continue
            free = [j for j in range(n_blocks) if not mask[i][j]]
            for j in sorted(free, key=lambda j: draw[i][j])[:n_random]:
                mask[i][j] = True
    return mask


def lsh_buckets(x: torch.Tensor, n_buckets: int, generator: torch.Generator) -> list:
    """Angular LSH (Kitaev et al., 2020): ``R = randn(E, n_buckets / 2)`` from the generator, bucket
    ``argmax([x R; -x R])`` (the first of equal maxima). Returns nested lists of ints like ``x[..., 0]``."""
    R = torch.randn(x.shape[-1], n_buckets // 2, generator=generator).double().tolist()
    flat = x.double().reshape(math.prod(x.shape[:-1]), x.shape[-1]).tolist()
    out = []
    for row in flat:
        proj = [sum(row[e] * R[e][c] for e in range(len(row))) for c in range(n_buckets // 2)]
        both = proj + [-p for p in proj]
        out.append(max(range(n_buckets), key=lambda c: (both[c], -c)))
    return torch.tensor(out, dtype=torch.long).reshape(x.shape[:-1]).tolist()


# ==================================================================================================
# Additive biases and relative positions
# ==================================================================================================
def alibi_slopes(n_heads: int) -> list[float]:
    """ALiBi's slopes (Press et al., 2022): for ``n`` a power of two the geometric sequence starting at
    ``2^(-8/n)`` with that ratio; otherwise the ``p`` slopes of the largest power of two ``p < n`` then
    every other slope of the ``2p`` sequence."""
    def geometric(n):
        start = 2 ** (-8 / n)
        return [start ** h for h in range(1, n + 1)]

    p = 2 ** math.floor(math.log2(n_heads))
    return geometric(p) + geometric(2 * p)[0::2][: n_heads - p]


def alibi(h: int, i: int, j: int, L: int, S: int, slopes) -> float:
    """ALiBi's bias ``-m_h |i + S - L - j|`` (bottom-right aligned)."""
    return -slopes[h] * abs(i + S - L - j)


def t5_bucket(relative_position: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """T5's bucket of ``key - query`` (Raffel et al., 2020): per direction ``B`` buckets; distances
    below ``B/2`` exact, then ``B/2 + floor(log(n / (B/2)) / log(max_distance / (B/2)) * (B/2))`` capped
    at ``B - 1``; bidirectional puts keys after the query ``B`` buckets up, causal sends them to 0."""
    if bidirectional:
        B = num_buckets // 2
        offset = B if relative_position > 0 else 0
        n = abs(relative_position)
    else:
        B, offset, n = num_buckets, 0, max(-relative_position, 0)
    exact = B // 2
    if n < exact:
        return offset + n
    # floor(log(n / exact) / log(max_distance / exact) * K), K = B - exact, in exact integer arithmetic: the
    # largest t with (n / exact)^K >= (max_distance / exact)^t (floating point can miss an exact boundary)
    K, t = B - exact, 0
    while t < B and n ** K * exact ** (t + 1) >= max_distance ** (t + 1) * exact ** K:
        t += 1
    return offset + min(exact + t, B - 1)


def t5_on_a_boundary(relative_position: int, bidirectional: bool, num_buckets: int, max_distance: int) -> bool:
    """Whether the log-spaced formula of :func:`t5_bucket` is an exact integer at this distance (where a
    floating-point evaluation may fall one bucket low)."""
    B = num_buckets // 2 if bidirectional else num_buckets
    n = abs(relative_position) if bidirectional else max(-relative_position, 0)
    exact, K = B // 2, B - B // 2
    return n >= exact and any(n ** K * exact ** t == max_distance ** t * exact ** K for t in range(B + 1))


def clipped_offset(i: int, j: int, L: int, S: int, k: int) -> int:
    """Shaw et al. (2018): the table row of ``clip(j - (i + S - L), -k, k) + k``."""
    return max(-k, min(k, j - (i + S - L))) + k


def deberta_delta(i: int, j: int, k: int) -> int:
    """DeBERTa's relative distance (He et al., 2021): 0 for ``i - j <= -k``, ``2k - 1`` for
    ``i - j >= k``, else ``i - j + k``."""
    if i - j <= -k:
        return 0
    if i - j >= k:
        return 2 * k - 1
    return i - j + k


def deberta_p2c_row(i: int, j: int, k: int, convention: str) -> int:
    """The table row DeBERTa's position-to-content term reads for query ``i``, key ``j``: the
    paper writes delta(j, i); the released code (and Hugging Face's port) gathers
    ``clamp(-(j - i) + k, 0, 2k - 1)`` on the key's row and transposes, which is delta(i, j)."""
    if convention == "paper":
        return deberta_delta(j, i, k)
    relative = j - i  # build_relative_position on the key's row a = j, column b = i
    return max(0, min(2 * k - 1, -relative + k))


# ==================================================================================================
# Rotary embeddings (Su et al.), with position interpolation, NTK-aware scaling and YaRN
# ==================================================================================================
def rope_frequencies(dim: int, base: float = 10000.0, scaling: dict | None = None) -> tuple[list[float], float]:
    """``(theta_f for f < dim/2, attention_scaling)`` of RoPE, from the definitions in
    ``positional.RotaryEmbedding``'s and ``yarn_inv_freq``'s docstrings."""
    theta = [base ** (-2 * f / dim) for f in range(dim // 2)]
    if scaling is None:
        return theta, 1.0
    s = scaling["factor"]
    if scaling["type"] == "linear":  # position interpolation: theta / s
        return [t / s for t in theta], 1.0
    if scaling["type"] == "ntk":  # base * s^(dim / (dim - 2))
        new_base = base * s ** (dim / (dim - 2))
        return [new_base ** (-2 * f / dim) for f in range(dim // 2)], 1.0
    L0 = scaling["original_max_position_embeddings"]
    beta_fast, beta_slow = scaling.get("beta_fast", 32.0), scaling.get("beta_slow", 1.0)
    if scaling.get("ramp", "released") == "paper":  # gamma linear in the number of turns
        gamma = [min(1.0, max(0.0, (L0 * t / (2 * math.pi) - beta_slow) / (beta_fast - beta_slow)))
                 for t in theta]
    else:  # released: linear in the pair index between whole-numbered ends
        def pair_turning(n):
            return dim * math.log(L0 / (n * 2 * math.pi)) / (2 * math.log(base))

        low = max(math.floor(pair_turning(beta_fast)), 0)
        high = min(math.ceil(pair_turning(beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        gamma = [1 - min(1.0, max(0.0, (f - low) / (high - low))) for f in range(dim // 2)]
    new = [(1 - g) * t / s + g * t for g, t in zip(gamma, theta)]
    return new, (0.1 * math.log(s) + 1.0 if s > 1 else 1.0)


def rope(x: torch.Tensor, positions, theta, *, interleaved: bool = False, attention_scaling: float = 1.0):
    """Rotate each pair of ``x (..., n, dim)`` (``(f, f + dim/2)``, or ``(2f, 2f + 1)`` interleaved) at
    position ``positions[..., t]`` by ``position * theta_f``, times ``attention_scaling``; float64."""
    x = x.double()
    dim = x.shape[-1]
    flat = x.reshape(math.prod(x.shape[:-1]), dim)
    pos = torch.as_tensor(positions, dtype=torch.float64).expand(x.shape[:-1]).reshape(-1).tolist()
    rows = []
    for r, p in enumerate(pos):
        row = [None] * dim
        for f in range(dim // 2):
            a, b = (2 * f, 2 * f + 1) if interleaved else (f, f + dim // 2)
            c, s = math.cos(p * theta[f]), math.sin(p * theta[f])
            row[a] = (flat[r, a] * c - flat[r, b] * s) * attention_scaling
            row[b] = (flat[r, a] * s + flat[r, b] * c) * attention_scaling
        rows.append(torch.stack(row) if row else flat.new_zeros(0))
    return (torch.stack(rows) if rows else flat.new_zeros(0, dim)).reshape(x.shape)


# ==================================================================================================
# The loops
# ==================================================================================================
def _layout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """The contract's shapes as ``(Hq|1, L, E)`` per batch index: returns ``q, k, v`` expanded to a common
    batch (rank >= 3), the batch shape, the number of output heads, the query head and the key/value
    head each output head reads, and the rank of the output."""
    rank = max(q.dim(), k.dim(), v.dim())
    r = max(rank, 3)
    q, k, v = (t.reshape((1,) * (r - t.dim()) + tuple(t.shape)) for t in (q, k, v))
    batch = tuple(torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3]))
    hq, hk = q.shape[-3], k.shape[-3]
    assert hq == hk or hq == 1 or hk == 1 or hq % hk == 0, (hq, hk)
    heads = max(hq, hk)

    def q_head(h):
        return 0 if hq == 1 else h

    def kv_head(h):
        if hk == 1:
            return 0
        return h if hq in (1, hk) else h // (hq // hk)

    q, k, v = (t.expand(*batch, *t.shape[-3:]) for t in (q, k, v))
    return q, k, v, batch, heads, q_head, kv_head, rank


def _assemble(rows: list, shape: tuple, like: torch.Tensor) -> torch.Tensor:
    """Stack per-query rows into ``shape`` (zeros of that shape when there is no row)."""
    if not rows:
        return like.new_zeros(shape)
    return torch.stack(rows).reshape(shape)


def _mask_lookup(mask, batch, heads, L, S, rank):
    """A function ``(b, h, i, j) -> entry`` of an ``attn_mask`` broadcast to the scores."""
    if mask is None:
        return None
    scores = (L, S) if rank == 2 else (*batch, heads, L, S)
    full = mask.expand(scores).reshape(*batch, heads, L, S)
    table = full.tolist()  # plain Python: bools or floats

    def entry(b, h, i, j):
        t = table
        for n in b:
            t = t[n]
        return t[h][i][j]

    return entry


def _neg_inf(x) -> bool:
    return float(x.detach() if isinstance(x, torch.Tensor) else x) == NEG_INF


def softmax_rows(scores: list, values: list, zero: torch.Tensor):
    """The softmax of one query's visible scores, written out: ``w_j = exp(s_j - m) / sum exp(s - m)``,
    ``out = sum_j w_j v_j``; scores of ``-inf`` are dropped first, and nothing left gives zeros.
    Returns ``(out, weights (or None), lse)``."""
    kept = [(s, val) for s, val in zip(scores, values) if not _neg_inf(s)]
    if not kept:
        return zero, None, NEG_INF
    s = torch.stack([torch.as_tensor(x, dtype=torch.float64) for x, _ in kept])
    m = s.max()
    e = torch.exp(s - m)
    z = e.sum()
    w = e / z
    out = (w[:, None] * torch.stack([val for _, val in kept])).sum(0)
    return out, w, m + torch.log(z)


def attention(q, k, v, visible=None, *, attn_mask=None, scale=None, softcap=0.0, bias=None, score_mod=None,
              key=None, value=None, return_weights=False, return_lse=False):
    """Softmax attention, one query at a time.

    ``visible(b, h, i, j) -> bool`` (``b`` the tuple of batch indices, ``h`` the output head);
    ``attn_mask`` as the contract's (bool: True = may attend; float: added); each visible score is
    ``scale * q_i . key_j`` (default ``1 / sqrt(E)``), then ``softcap * tanh(score / softcap)``, then
    ``+ bias(b, h, i, j)``, then ``score_mod(score, b, h, i, j)``. ``key(b, h, i, j, k_j)`` and
    ``value(b, h, i, j, v_j)`` replace the key and value seen by query ``i`` (Shaw's relative terms).
    Returns ``out`` (the contract's output shape), with the ``(..., L, S)`` weights and/or the
    log-sum-exp ``(..., L)`` on request."""
    q, k, v = (t.double() for t in (q, k, v))
    E, L, S, Ev = q.shape[-1], q.shape[-2], k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    q4, k4, v4, batch, heads, q_head, kv_head, rank = _layout(q, k, v)
    mask = _mask_lookup(attn_mask, batch, heads, L, S, rank)
    outs, lses, weights = [], [], []
    zero_out = v.new_zeros(Ev)
    for b in itertools.product(*(range(n) for n in batch)):
        for h in range(heads):
            qm, km, vm = q4[b][q_head(h)], k4[b][kv_head(h)], v4[b][kv_head(h)]
            for i in range(L):
                keys, scores, values = [], [], []
                for j in range(S):
                    if visible is not None and not visible(b, h, i, j):
                        continue
                    s = 0.0
                    if mask is not None:
                        entry = mask(b, h, i, j)
                        if entry is False:
                            continue
                        s = 0.0 if entry is True else entry
                    kj = km[j] if key is None else key(b, h, i, j, km[j])
                    x = scale * torch.dot(qm[i], kj)
                    if softcap:
                        x = softcap * torch.tanh(x / softcap)
                    x = x + s
                    if bias is not None:
                        x = x + bias(b, h, i, j)
                    if score_mod is not None:
                        x = score_mod(x, b, h, i, j)
                    keys.append(j)
                    scores.append(x)
                    values.append(vm[j] if value is None else value(b, h, i, j, vm[j]))
                out, w, lse = softmax_rows(scores, values, zero_out)
                outs.append(out)
                lses.append(torch.as_tensor(lse, dtype=torch.float64))
                if return_weights:
                    kept = [j for j, x in zip(keys, scores) if not _neg_inf(x)]
                    row = [w[kept.index(j)] if j in kept else q.new_zeros(()) for j in range(S)]
                    weights.append(torch.stack(row) if row else q.new_zeros(0))
    lead = () if rank == 2 else (*batch, heads)
    result = [_assemble(outs, (*lead, L, Ev), q)]
    if return_weights:
        result.append(_assemble(weights, (*lead, L, S), q))
    if return_lse:
        result.append(_assemble(lses, (*lead, L), q))
    return result[0] if len(result) == 1 else tuple(result)


def hard_attention(q, k, v, *, attn_mask=None, scale=None):
    """Hard attention (Xu et al., 2015), argmax mode: each query copies the value of its best-scoring
    visible key (the first of equal maxima); no visible key gives zeros."""
    q, k, v = (t.double() for t in (q, k, v))
    E, L, S, Ev = q.shape[-1], q.shape[-2], k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    q4, k4, v4, batch, heads, q_head, kv_head, rank = _layout(q, k, v)
    mask = _mask_lookup(attn_mask, batch, heads, L, S, rank)
    outs = []
    for b in itertools.product(*(range(n) for n in batch)):
        for h in range(heads):
            qm, km, vm = q4[b][q_head(h)], k4[b][kv_head(h)], v4[b][kv_head(h)]
            for i in range(L):
                best, best_j = NEG_INF, None
                for j in range(S):
                    if mask is not None and mask(b, h, i, j) is False:
                        continue
                    s = float(scale * torch.dot(qm[i], km[j]).detach())
                    if best_j is None or s > best:
                        best, best_j = s, j
                outs.append(v.new_zeros(Ev) if best_j is None else vm[best_j])
    lead = () if rank == 2 else (*batch, heads)
    return _assemble(outs, (*lead, L, Ev), q)


def _per_head(q, k, v, head_fn):
    """Run ``head_fn(b, h, qm (L, E), km (S, E), vm (S, Ev)) -> L rows`` for every batch index and head
    and assemble the contract's output shape."""
    q, k, v = (t.double() for t in (q, k, v))
    L, Ev = q.shape[-2], v.shape[-1]
    q4, k4, v4, batch, heads, q_head, kv_head, rank = _layout(q, k, v)
    rows = []
    for b in itertools.product(*(range(n) for n in batch)):
        for h in range(heads):
            rows += head_fn(b, h, q4[b][q_head(h)], k4[b][kv_head(h)], v4[b][kv_head(h)])
    lead = () if rank == 2 else (*batch, heads)
    return _assemble(rows, (*lead, L, Ev), q)


def elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    """``phi(x) = elu(x) + 1``, elementwise: ``x + 1`` for ``x > 0``, ``exp(x)`` otherwise."""
    return torch.stack([xe + 1 if xe > 0 else torch.exp(xe) for xe in x]) if len(x) else x


def linear_attention(q, k, v, *, is_causal=False, eps=1e-6):
    """Linear attention (Katharopoulos et al., 2020): ``out_i = sum_j phi(q_i).phi(k_j) v_j /
    (sum_j phi(q_i).phi(k_j) + eps)`` over the visible keys; zeros when none is visible."""
    L, S = q.shape[-2], k.shape[-2]

    def head(b, h, qm, km, vm):
        rows = []
        phi_k = [elu_plus_one(km[j]) for j in range(S)]
        for i in range(L):
            keys = [j for j in range(S) if not is_causal or causal(i, j, L, S)]
            if not keys:
                rows.append(vm.new_zeros(vm.shape[-1]))
                continue
            phi_q = elu_plus_one(qm[i])
            sims = [torch.dot(phi_q, phi_k[j]) for j in keys]
            num = sum(s * vm[j] for s, j in zip(sims, keys))
            rows.append(num / (sum(sims) + eps))
        return rows

    return _per_head(q, k, v, head)


def linear_attention_weights(q, k, *, is_causal=False, eps=1e-6):
    """The ``(..., L, S)`` weights of :func:`linear_attention` (zeros off the visible keys)."""
    S = k.shape[-2]
    eye = torch.eye(S, dtype=torch.float64)
    lead = k.shape[:-2]
    return linear_attention(q, k, eye.expand(*lead, S, S), is_causal=is_causal, eps=eps)


def performer_features(x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """FAVOR+ (Choromanski et al., 2021): ``phi(x) = exp(W x~ - |x~|^2 / 2) / sqrt(m)``, ``x~ = x d^-1/4``."""
    d = x.shape[-1]
    xt = x * d ** -0.25
    return torch.stack([torch.exp(torch.dot(W[r], xt) - torch.dot(xt, xt) / 2) for r in range(W.shape[0])]) / \
        math.sqrt(W.shape[0])


def performer_attention(q, k, v, projection, *, is_causal=False, eps=1e-6):
    """The Performer's estimate as ``performer_attention`` defines it: with ``z_i = sum_j phi(k_j)`` over
    the visible keys, ``out_i = sum_j phi(q_i).phi(k_j) v_j / (phi(q_i).z_i + eps max_r phi(q_i)_r z_ir)``;
    zeros when no key is visible."""
    W = projection.double()
    L, S = q.shape[-2], k.shape[-2]

    def head(b, h, qm, km, vm):
        rows = []
        phi_k = [performer_features(km[j], W) for j in range(S)]
        for i in range(L):
            keys = [j for j in range(S) if not is_causal or causal(i, j, L, S)]
            if not keys:
                rows.append(vm.new_zeros(vm.shape[-1]))
                continue
            phi_q = performer_features(qm[i], W)
            z = sum(phi_k[j] for j in keys)
            sims = [torch.dot(phi_q, phi_k[j]) for j in keys]
            num = sum(s * vm[j] for s, j in zip(sims, keys))
            rows.append(num / (torch.dot(phi_q, z) + eps * (phi_q * z).max()))
        return rows

    return _per_head(q, k, v, head)


def compress(x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """A strided convolution with stride = kernel = ``s`` along the sequence: row ``b`` is
    ``sum_t weight[:, :, t] x[b s + t]`` over the rows that exist (the ragged last block sums fewer),
    ``+ bias``. ``x (..., S, E)`` -> ``(..., ceil(S / s), E_out)``."""
    x, weight = x.double(), weight.double()
    S, s, E_out = x.shape[-2], weight.shape[-1], weight.shape[0]
    n = -(-S // s)
    flat = x.reshape(math.prod(x.shape[:-2]), S, x.shape[-1])
    rows = []
    for seq in flat:
        for blk in range(n):
            acc = x.new_zeros(E_out)
            for t in range(s):
                if blk * s + t < S:
                    acc = acc + weight[:, :, t] @ seq[blk * s + t]
            rows.append(acc if bias is None else acc + bias.double())
    return _assemble(rows, (*x.shape[:-2], n, E_out), x)


def memory_compressed_attention(q, k, v, weight_k, weight_v, bias_k=None, bias_v=None, *, is_causal=False,
                                scale=None):
    """Memory-compressed attention (Liu et al., 2018): softmax attention over the compressed keys and
    values; causally block ``b`` is visible iff :func:`compressed_block`."""
    L, S, s = q.shape[-2], k.shape[-2], weight_k.shape[-1]
    if q.dim() >= 3 and k.dim() >= 3 and q.shape[-3] != k.shape[-3] and min(q.shape[-3], k.shape[-3]) > 1:
        group = q.shape[-3] // k.shape[-3]  # compress per key/value head, then share it
        k, v = k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)
    kc, vc = compress(k, weight_k, bias_k), compress(v, weight_v, bias_v)
    visible = (lambda b, h, i, j: compressed_block(i, j, s, L, S)) if is_causal else None
    return attention(q, kc, vc, visible, scale=scale)


def linformer_attention(q, k, v, E, F, *, scale=None):
    """The Linformer (Wang et al., 2020): keys ``sum_n E[r, n] k_n`` and values ``sum_n F[r, n] v_n``,
    ``r < k``, then softmax attention over the ``k`` projected rows."""
    E, F = E.double(), F.double()

    def project(x, P):
        x = x.double()
        S = x.shape[-2]
        flat = x.reshape(math.prod(x.shape[:-2]), S, x.shape[-1])
        rows = [sum((P[r, n] * seq[n] for n in range(S)), x.new_zeros(x.shape[-1]))
                for seq in flat for r in range(P.shape[0])]
        return _assemble(rows, (*x.shape[:-2], P.shape[0], x.shape[-1]), x)

    return attention(q, project(k, E), project(v, F), scale=scale)


def delta_rule(q, k, v, beta):
    """The delta rule (Schlag et al., 2021), step by step: unit features ``f_t = phi(k_t) / |phi(k_t)|``,
    ``g_t`` likewise; ``S_t = S_{t-1} + beta_t f_t (v_t - S_{t-1}^T f_t)^T``; ``out_t = S_t^T g_t``."""
    n = q.shape[-2]
    beta = torch.as_tensor(beta, dtype=torch.float64)

    def head(b, h, qm, km, vm):
        bt = beta.expand(n) if beta.dim() <= 1 else beta
        state, rows = None, []
        for t in range(n):
            f = elu_plus_one(km[t])
            f = f / torch.sqrt((f * f).sum())
            g = elu_plus_one(qm[t])
            g = g / torch.sqrt((g * g).sum())
            if state is None:
                state = vm.new_zeros(f.shape[0], vm.shape[-1])
            stored = state.T @ f
            state = state + bt[t] * f[:, None] * (vm[t] - stored)[None, :]
            rows.append(state.T @ g)
        return rows

    return _per_head(q, k, v, head)


def shaw_attention(q, k, v, rel_k, rel_v, max_distance, *, attn_mask=None, is_causal=False, scale=None,
                   return_weights=False):
    """Shaw et al. (2018): ``e_ij = scale q_i . (k_j + a^K_ij)``, ``z_i = sum_j w_ij (v_j + a^V_ij)``,
    ``a_ij = table[clip(j - (i + S - L), -k, k) + k]``."""
    L, S = q.shape[-2], k.shape[-2]
    rel_k, rel_v = rel_k.double(), rel_v.double()
    return attention(
        q, k, v, (lambda b, h, i, j: causal(i, j, L, S)) if is_causal else None, attn_mask=attn_mask,
        scale=scale, key=lambda b, h, i, j, kj: kj + rel_k[clipped_offset(i, j, L, S, max_distance)],
        value=lambda b, h, i, j, vj: vj + rel_v[clipped_offset(i, j, L, S, max_distance)],
        return_weights=return_weights)


def message_passing(q, k, v, edges, *, scale=None):
    """Dot-product attention over each node's incoming edges ``j -> i`` (a multiset: a repeated edge
    carries two messages); a node with no incoming edge gets zeros."""
    edges = [tuple(e) for e in edges]
    N = q.shape[-2]
    incoming = [[j for j, i in edges if i == t] for t in range(N)]
    E = q.shape[-1]
    scale = 1.0 / math.sqrt(E) if scale is None else scale

    def head(b, h, qm, km, vm):
        rows = []
        for i in range(N):
            out, _, _ = softmax_rows([scale * torch.dot(qm[i], km[j]) for j in incoming[i]],
                                     [vm[j] for j in incoming[i]], vm.new_zeros(vm.shape[-1]))
            rows.append(out)
        return rows

    return _per_head(q, k, v, head)


def edge_softmax(scores: torch.Tensor, target, num_nodes: int) -> torch.Tensor:
    """Softmax of edge scores ``(E, ...)`` over the edges into each target node."""
    scores = scores.double()
    target = list(target)
    out = [None] * len(target)
    flat = scores.reshape(len(target), math.prod(scores.shape[1:]))
    for node in range(num_nodes):
        idx = [e for e, t in enumerate(target) if t == node]
        for c in range(flat.shape[1]):
            s = torch.stack([flat[e, c] for e in idx]) if idx else None
            if s is None:
                continue
            w = torch.exp(s - s.max())
            w = w / w.sum()
            for n, e in enumerate(idx):
                out[e] = (out[e] or []) + [w[n]]
    rows = [torch.stack(r) for r in out]
    return _assemble(rows, tuple(scores.shape), scores)


def _with_self_loops(edges, N):
    """Existing self-loops removed, then one per node."""
    return [(j, i) for j, i in edges if j != i] + [(n, n) for n in range(N)]


def gat(x, edges, W, att_src, att_dst, bias, *, heads, concat, negative_slope, self_loops=True):
    """GAT (Velickovic et al., 2018): ``z = W x``; ``e_ij = LeakyReLU(a_dst . z_i + a_src . z_j)`` over the
    edges ``j -> i`` (self-loops replaced by one per node); softmax per target; ``h'_i = sum alpha z_j``;
    heads concatenated or averaged, then ``+ bias``."""
    x, W = x.double(), W.double()
    N = x.shape[0]
    out_dim = W.shape[0] // heads
    z = [(W @ x[n]).reshape(heads, out_dim) for n in range(N)]
    edges = _with_self_loops(edges, N) if self_loops else list(edges)
    rows = []
    for i in range(N):
        per_head = []
        for h in range(heads):
            srcs = [j for j, t in edges if t == i]
            scores = []
            for j in srcs:
                e = torch.dot(att_dst.double()[0, h], z[i][h]) + torch.dot(att_src.double()[0, h], z[j][h])
                scores.append(torch.where(e > 0, e, negative_slope * e))
            out, _, _ = softmax_rows(scores, [z[j][h] for j in srcs], x.new_zeros(out_dim))
            per_head.append(out)
        row = torch.cat(per_head) if concat else torch.stack(per_head).mean(0)
        rows.append(row if bias is None else row + bias.double())
    return _assemble(rows, (N, heads * out_dim if concat else out_dim), x)


def gcn(x, edges, W, bias, *, self_loops=True):
    """GCN (Kipf & Welling, 2017): ``out_i = sum_{j -> i} W x_j / sqrt(deg_i deg_j) + b``, degrees counted
    on incoming edges after the self-loop step; ``D^-1/2`` is 0 for a degree of 0 (PyTorch Geometric's
    convention: without self-loops, an edge from a node with no incoming edge carries nothing)."""
    x, W = x.double(), W.double()
    N = x.shape[0]
    edges = _with_self_loops(edges, N) if self_loops else list(edges)
    deg = [sum(1 for _, t in edges if t == n) for n in range(N)]
    rows = []
    for i in range(N):
        acc = x.new_zeros(W.shape[0])
        for j, t in edges:
            if t == i and deg[j] > 0:
                acc = acc + (W @ x[j]) / math.sqrt(deg[i] * deg[j])
        rows.append(acc if bias is None else acc + bias.double())
    return _assemble(rows, (N, W.shape[0]), x)


def local_attention(query, keys, W_a, *, window, centre, real_lengths):
    """Luong et al.'s local attention for one decoder step: for row ``b`` with centre ``p`` and ``n``
    real source positions, ``align`` is the softmax of the general score ``h . W_a hbar_s`` over the real
    ``s`` with ``|s - p| <= D``; ``a(s) = align(s) exp(-(s - p)^2 / (2 (D/2)^2))``; context ``sum a(s) hbar_s``.
    Returns ``(context (B, Dk), weights (B, S))``."""
    query, keys, W_a = query.double(), keys.double(), W_a.double()
    B, S, Dk = keys.shape
    sigma = window / 2
    contexts, weights = [], []
    for b in range(B):
        p = centre[b]
        visible = [s for s in range(S) if s < real_lengths[b] and abs(s - float(torch.as_tensor(p).detach())) <= window]
        scores = [query[b] @ W_a @ keys[b, s] for s in visible]
        kept = list(zip(visible, scores))
        row = [query.new_zeros(())] * S
        if kept:
            st_ = torch.stack([sc for _, sc in kept])
            e = torch.exp(st_ - st_.max())
            align = e / e.sum()
            for n, (s, _) in enumerate(kept):
                row[s] = align[n] * torch.exp(torch.as_tensor(-((s - p) ** 2) / (2 * sigma ** 2), dtype=torch.float64))
        w = torch.stack(row) if row else query.new_zeros(0)
        weights.append(w)
        contexts.append(sum((w[s] * keys[b, s] for s in range(S)), keys.new_zeros(Dk)))
    return _assemble(contexts, (B, Dk), keys), _assemble(weights, (B, S), keys)


def relative_attention_2d(x, Wq, Wk, Wv, Wo, bo, rel_bias, *, n_heads, head_dim, max_offset):
    """Cordonnier et al.'s 2-D relative self-attention: pixel ``i`` scores pixel ``j`` by
    ``(Wq x_i).(Wk x_j) / sqrt(d) + b_h[clip(dy), clip(dx)]``, ``(dy, dx) = pos_j - pos_i``; heads
    concatenated, then ``out_proj``."""
    x = x.double()
    B, _, H, W = x.shape
    pixels = [(y, xx) for y in range(H) for xx in range(W)]

    def clip(t):
        return max(-max_offset, min(max_offset, t)) + max_offset

    outs = []
    for b in range(B):
        tokens = [x[b, :, y, xx] for y, xx in pixels]
        q = [(Wq.double() @ t).reshape(n_heads, head_dim) for t in tokens]
        k = [(Wk.double() @ t).reshape(n_heads, head_dim) for t in tokens]
        v = [(Wv.double() @ t).reshape(n_heads, head_dim) for t in tokens]
        rows = []
        for i, (yi, xi) in enumerate(pixels):
            heads = []
            for h in range(n_heads):
                scores = [torch.dot(q[i][h], k[j][h]) / math.sqrt(head_dim)
                          + rel_bias.double()[h, clip(yj - yi), clip(xj - xi)] for j, (yj, xj) in enumerate(pixels)]
                out, _, _ = softmax_rows(scores, [v[j][h] for j in range(len(pixels))], x.new_zeros(head_dim))
                heads.append(out)
            rows.append(Wo.double() @ torch.cat(heads) + bo.double())
        outs.append(torch.stack(rows).T.reshape(-1, H, W))
    return torch.stack(outs)


def masked_softmax(scores, attn_mask=None, temperature=1.0):
    """Softmax of each row of ``scores / temperature`` over its unmasked entries (bool: True keeps;
    float: added), zeros for a row with none."""
    scores = scores.double() / temperature
    shape = scores.shape
    if attn_mask is None:
        mask = None
    else:
        mask = attn_mask.expand(shape).reshape(math.prod(shape[:-1]), shape[-1]).tolist()
    flat = scores.reshape(math.prod(shape[:-1]), shape[-1])
    rows = []
    for r in range(flat.shape[0]):
        vals = []
        for j in range(shape[-1]):
            s = flat[r, j]
            if mask is not None:
                if mask[r][j] is False:
                    s = torch.as_tensor(NEG_INF, dtype=torch.float64)
                elif mask[r][j] is not True:
                    s = s + mask[r][j]
            vals.append(s)
        kept = [n for n, s in enumerate(vals) if not _neg_inf(s)]
        row = [scores.new_zeros(())] * shape[-1]
        if kept:
            s = torch.stack([vals[n] for n in kept])
            e = torch.exp(s - s.max())
            w = e / e.sum()
            for m, n in enumerate(kept):
                row[n] = w[m]
        rows.append(torch.stack(row) if row else scores.new_zeros(0))
    return _assemble(rows, tuple(shape), scores)
