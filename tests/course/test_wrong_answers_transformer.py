"""Plausible wrong answers to the exercises of the chapter on the Transformer block:
each fails its check with a message that points at the mistake."""

import torch
from wrong_answers import Mistake, mistake_test


# transformer-rmsnorm: the book's solution with one thing changed
def _rms_norm(
    x,
    weight,
    eps,
    *,
    centre=False,
    std=False,
    eps_at="inside",
    root=True,
    dim=-1,
    keepdim=True,
    scale=True,
):
    if centre:
        x = x - x.mean(dim=-1, keepdim=True)
    square = (
        x.var(dim=-1, unbiased=False, keepdim=True)
        if std
        else x.pow(2).mean(dim=dim, keepdim=keepdim)
    )
    if eps_at == "inside":
        rms = torch.sqrt(square + eps) if root else square + eps
    elif eps_at == "outside":
        rms = torch.sqrt(square) + eps
    else:
        rms = torch.sqrt(square)
    return x / rms * weight if scale else x / rms


def _rms_layer_norm(x, weight, eps):  # LayerNorm without its bias
    return _rms_norm(x, weight, eps, centre=True, std=True)


def _rms_divides_by_std(x, weight, eps):
    return _rms_norm(x, weight, eps, std=True)


def _rms_without_eps(x, weight, eps):
    return _rms_norm(x, weight, eps, eps_at="none")


def _rms_eps_outside_the_root(x, weight, eps):
    return _rms_norm(x, weight, eps, eps_at="outside")


def _rms_without_the_root(x, weight, eps):
    return _rms_norm(x, weight, eps, root=False)


def _rms_mean_over_dim_0(x, weight, eps):
    return _rms_norm(x, weight, eps, dim=0)


def _rms_without_keepdim(x, weight, eps):
    return _rms_norm(x, weight, eps, keepdim=False)


def _rms_without_the_weight(x, weight, eps):
    return _rms_norm(x, weight, eps, scale=False)


def _rms_in_float32(x, weight, eps):
    return _rms_norm(x.float(), weight.float(), eps)


# transformer-block-parameters: the book's solution with one thing changed
def _block_parameters(
    d_model,
    n_heads,
    n_kv_heads,
    mlp,
    *,
    kv_full=False,
    attention_bias=True,
    norm=2,
    fc_bias=True,
    swiglu_matrices=3,
    swiglu_hidden=lambda d: 8 * d // 3,
    head_dim=None,
):
    d = d_model
    kv = d if kv_full else n_kv_heads * (head_dim or (lambda d, h: d // h))(d, n_heads)
    b = 1 if attention_bias else 0
    attention = 2 * (d * d + b * d) + 2 * (d * kv + b * kv)
    norms = 2 * norm * d
    if mlp == "gelu":
        hidden = 4 * d
        feed_forward = (d * hidden + (hidden if fc_bias else 0)) + (hidden * d + d)
    else:
        feed_forward = swiglu_matrices * d * swiglu_hidden(d)
    return attention + norms + feed_forward


def _params_kv_at_full_width(d_model, n_heads, n_kv_heads, mlp):
    return _block_parameters(d_model, n_heads, n_kv_heads, mlp, kv_full=True)


def _params_attention_without_biases(d_model, n_heads, n_kv_heads, mlp):
    return _block_parameters(d_model, n_heads, n_kv_heads, mlp, attention_bias=False)


def _params_without_layernorms(d_model, n_heads, n_kv_heads, mlp):
    return _block_parameters(d_model, n_heads, n_kv_heads, mlp, norm=0)


def _params_layernorm_weight_only(d_model, n_heads, n_kv_heads, mlp):
    return _block_parameters(d_model, n_heads, n_kv_heads, mlp, norm=1)


def _params_swiglu_two_matrices(d_model, n_heads, n_kv_heads, mlp):
    return _block_parameters(d_model, n_heads, n_kv_heads, mlp, swiglu_matrices=2)


def _params_swiglu_hidden_4d(d_model, n_heads, n_kv_heads, mlp):
    return _block_parameters(
        d_model, n_heads, n_kv_heads, mlp, swiglu_hidden=lambda d: 4 * d
    )


def _params_swiglu_hidden_rounded(d_model, n_heads, n_kv_heads, mlp):
    return _block_parameters(
        d_model, n_heads, n_kv_heads, mlp, swiglu_hidden=lambda d: round(8 * d / 3)
    )


def _params_without_the_fc_bias(d_model, n_heads, n_kv_heads, mlp):
    return _block_parameters(d_model, n_heads, n_kv_heads, mlp, fc_bias=False)


def _params_float_head_dim(d_model, n_heads, n_kv_heads, mlp):
    return _block_parameters(
        d_model, n_heads, n_kv_heads, mlp, head_dim=lambda d, h: d / h
    )


def _params_kv_full_and_no_layernorms(d_model, n_heads, n_kv_heads, mlp):
    return _block_parameters(d_model, n_heads, n_kv_heads, mlp, kv_full=True, norm=0)


# transformer-bigram-bits: the book's solution with one thing changed
def _bigram(
    train,
    valid,
    vocab_size,
    alpha=1.0,
    *,
    log=torch.log2,
    total=lambda V, a: a * V,
    counted_on=None,
    normalize_dim=1,
    rows_from_chars=False,
    pairs=None,
):
    V = vocab_size
    ids = train if counted_on is None else counted_on(train, valid)
    pair_counts = (
        torch.bincount(ids[:-1] * V + ids[1:], minlength=V * V).view(V, V).double()
    )
    if rows_from_chars:
        rows = torch.bincount(ids, minlength=V).double()[:, None]
    else:
        rows = pair_counts.sum(dim=normalize_dim, keepdim=True)
    p = (pair_counts + alpha) / (rows + total(V, alpha))
    prev, nxt = (valid[:-1], valid[1:]) if pairs is None else pairs(valid)
    return -log(p[prev, nxt]).mean().item()


def _bigram_in_nats(train, valid, vocab_size, alpha=1.0):
    return _bigram(train, valid, vocab_size, alpha, log=torch.log)


def _bigram_without_alpha_v(train, valid, vocab_size, alpha=1.0):
    return _bigram(train, valid, vocab_size, alpha, total=lambda V, a: 0)


def _bigram_counted_on_valid(train, valid, vocab_size, alpha=1.0):
    return _bigram(
        train, valid, vocab_size, alpha, counted_on=lambda train, valid: valid
    )


def _bigram_p_prev_given_next(train, valid, vocab_size, alpha=1.0):
    return _bigram(train, valid, vocab_size, alpha, normalize_dim=0)


def _bigram_pairs_backwards(train, valid, vocab_size, alpha=1.0):
    return _bigram(
        train, valid, vocab_size, alpha, pairs=lambda valid: (valid[1:], valid[:-1])
    )


def _bigram_rows_from_every_character(train, valid, vocab_size, alpha=1.0):
    return _bigram(train, valid, vocab_size, alpha, rows_from_chars=True)


def _bigram_without_smoothing(train, valid, vocab_size, alpha=1.0):
    return _bigram(train, valid, vocab_size, 0.0)


def _bigram_as_a_tensor(train, valid, vocab_size, alpha=1.0):
    return torch.tensor(_bigram(train, valid, vocab_size, alpha))


def _unigram(train, valid, vocab_size, alpha=1.0):
    counts = torch.bincount(train, minlength=vocab_size).double() + alpha
    return -torch.log2((counts / counts.sum())[valid]).mean().item()


# transformer-prefix-matching: the book's solution with one thing changed
def _prefix(
    weights,
    period,
    *,
    first=lambda period: period,
    key=lambda t, period: t - period + 1,
    dims=(0, 2),
):
    T = weights.shape[-1]
    t = torch.arange(first(period), T)
    return weights[:, :, t, key(t, period)].mean(dim=dims)


def _prefix_earlier_occurrence(weights, period):
    return _prefix(weights, period, key=lambda t, period: t - period)


def _prefix_queries_from_0(weights, period):
    return _prefix(weights, period, first=lambda period: 0)


def _prefix_queries_from_1(weights, period):
    return _prefix(weights, period, first=lambda period: 1)


def _prefix_previous_token(weights, period):
    return _prefix(weights, period, first=lambda period: 1, key=lambda t, period: t - 1)


def _prefix_averaged_over_heads(weights, period):
    return _prefix(weights, period, dims=(0, 1, 2))


def _prefix_not_averaged_over_the_batch(weights, period):
    return _prefix(weights, period, dims=(2,))


def _prefix_diagonal(weights, period):  # starts at query period - 1
    return torch.diagonal(weights, offset=1 - period, dim1=-2, dim2=-1).mean(dim=(0, 2))


MISTAKES = [
    Mistake(
        "transformer-rmsnorm",
        "LayerNorm: mean subtracted, divided by the std",
        _rms_layer_norm,
        (
            "x of shape (8,), weight (8,), eps=1e-06: values differ",
            "that is LayerNorm",
            "does not center x",
        ),
    ),
    Mistake(
        "transformer-rmsnorm",
        "divides by the standard deviation",
        _rms_divides_by_std,
        ("x of shape (8,)", "You divide by the standard deviation", "root mean square"),
    ),
    Mistake(
        "transformer-rmsnorm",
        "eps left out",
        _rms_without_eps,
        (
            "x of shape (4, 10) with a large eps, weight (10,), eps=1.0",
            "You left out eps",
        ),
    ),
    Mistake(
        "transformer-rmsnorm",
        "eps added outside the root",
        _rms_eps_outside_the_root,
        (
            "with a large eps",
            "eps=1.0",
            "You add eps outside the square root",
            "it goes inside",
        ),
    ),
    Mistake(
        "transformer-rmsnorm",
        "no square root",
        _rms_without_the_root,
        ("x of shape (8,)", "You divide by the mean square", "ROOT mean square"),
    ),
    Mistake(
        "transformer-rmsnorm",
        "mean over dim 0",
        _rms_mean_over_dim_0,
        (
            "x of shape (2, 3, 16)",
            "You take the mean over dim 0",
            "mean(dim=-1, keepdim=True)",
        ),
    ),
    Mistake(
        "transformer-rmsnorm",
        "mean without keepdim",
        _rms_without_keepdim,
        ("x of shape (2, 3, 16)", "your code raised RuntimeError", "keepdim=True"),
    ),
    Mistake(
        "transformer-rmsnorm",
        "weight left out",
        _rms_without_the_weight,
        ("x of shape (8,)", "You left out the weight"),
    ),
    Mistake(
        "transformer-rmsnorm",
        "computed in float32",
        _rms_in_float32,
        (
            "x of shape (2, 5, 7) in float64",
            "return the input's dtype float64, got torch.float32",
        ),
    ),
    Mistake(
        "transformer-block-parameters",
        "K and V at full width under GQA",
        _params_kv_at_full_width,
        (
            "block_parameters(d_model=64, n_heads=4, n_kv_heads=2, mlp='gelu')",
            "should be 45824 (attention 12480, two LayerNorms 256, gelu MLP 33088)",
            "got 49984 (4160 too many)",
            "You count k_proj and v_proj at full width",
            "n_kv_heads * d_model / n_heads",
        ),
    ),
    Mistake(
        "transformer-block-parameters",
        "attention biases forgotten",
        _params_attention_without_biases,
        (
            "n_kv_heads=4, mlp='gelu') should be 49984",
            "got 49728 (256 too few)",
            "You left out the biases of the attention projections",
        ),
    ),
    Mistake(
        "transformer-block-parameters",
        "LayerNorms forgotten",
        _params_without_layernorms,
        ("should be 49984", "got 49728", "You left out the two LayerNorms"),
    ),
    Mistake(
        "transformer-block-parameters",
        "LayerNorms with weight only",
        _params_layernorm_weight_only,
        ("got 49856 (128 too few)", "each with a weight AND a bias"),
    ),
    Mistake(
        "transformer-block-parameters",
        "SwiGLU with two matrices",
        _params_swiglu_two_matrices,
        (
            "block_parameters(d_model=64, n_heads=8, n_kv_heads=2, mlp='swiglu')",
            "should be 43296",
            "swiglu MLP 32640",
            "SwiGLU has three matrices",
        ),
    ),
    Mistake(
        "transformer-block-parameters",
        "SwiGLU with hidden width 4d",
        _params_swiglu_hidden_4d,
        (
            "mlp='swiglu') should be 43296",
            "hidden width is 8 * d_model // 3, not 4 d_model",
        ),
    ),
    Mistake(
        "transformer-block-parameters",
        "SwiGLU hidden width rounded",
        _params_swiglu_hidden_rounded,
        ("mlp='swiglu') should be 43296", "got 43488", "rounded down"),
    ),
    Mistake(
        "transformer-block-parameters",
        "fc's bias forgotten",
        _params_without_the_fc_bias,
        ("mlp='gelu') should be 49984", "You left out the bias of fc"),
    ),
    Mistake(
        "transformer-block-parameters",
        "head_dim as a float",
        _params_float_head_dim,
        (
            "block_parameters(d_model=64, n_heads=4, n_kv_heads=4, mlp='gelu'): "
            "return an exact int",
            "got float 49984.0",
        ),
    ),
    Mistake(
        "transformer-block-parameters",
        "K/V full width and no LayerNorms: two readings",
        _params_kv_full_and_no_layernorms,
        (
            "You count k_proj and v_proj at full width",
            "Either: You left out the two LayerNorms",
            "Or (the same counts): You left out the biases of the attention",
        ),
    ),
    Mistake(
        "transformer-bigram-bits",
        "natural log: nats",
        _bigram_in_nats,
        (
            "bigram_bits_per_char(train=[0, 1, 0, 1, 2, 0], valid=[0, 1, 2, 2, 0], "
            "vocab_size=3, alpha=1.0) should be 1.26472 bits per character",
            "You return nats",
            "log2",
        ),
    ),
    Mistake(
        "transformer-bigram-bits",
        "no alpha * V in the denominator",
        _bigram_without_alpha_v,
        (
            "vocab_size=3, alpha=1.0) should be 1.26472",
            "Your denominator lacks alpha * V",
        ),
    ),
    Mistake(
        "transformer-bigram-bits",
        "counts taken from valid",
        _bigram_counted_on_valid,
        ("should be 1.26472", "You counted the pairs on valid"),
    ),
    Mistake(
        "transformer-bigram-bits",
        "p(prev | next)",
        _bigram_p_prev_given_next,
        (
            "bigram_bits_per_char(train of 30 ids, valid of 15 ids, vocab_size=8, "
            "alpha=1.0)",
            "You normalized over the previous character, p(prev | next)",
        ),
    ),
    Mistake(
        "transformer-bigram-bits",
        "pair looked up backwards",
        _bigram_pairs_backwards,
        ("should be 1.26472", "You look the pair up backwards"),
    ),
    Mistake(
        "transformer-bigram-bits",
        "the unigram",
        _unigram,
        ("should be 1.26472", "That is the unigram", "p(c | prev)"),
    ),
    Mistake(
        "transformer-bigram-bits",
        "count(prev) from every character of train",
        _bigram_rows_from_every_character,
        (
            "should be 1.26472",
            "count(prev) counts the pairs that start with prev, train[:-1]",
        ),
    ),
    Mistake(
        "transformer-bigram-bits",
        "no smoothing: an unseen pair gives inf",
        _bigram_without_smoothing,
        (
            "should be 1.26472 bits per character, got inf",
            "The pair (2, 2) of valid never occurs in train",
            "add alpha to every count",
        ),
    ),
    Mistake(
        "transformer-bigram-bits",
        "returns a tensor",
        _bigram_as_a_tensor,
        ("alpha=1.0): return a number (int or float), got Tensor",),
    ),
    Mistake(
        "transformer-prefix-matching",
        "key t - period: the earlier occurrence itself",
        _prefix_earlier_occurrence,
        (
            "weights of shape (2, 3, 8, 8), period=4: values differ",
            "You read key t - period",
            "the token AFTER it, key t - period + 1",
        ),
    ),
    Mistake(
        "transformer-prefix-matching",
        "queries from 0",
        _prefix_queries_from_0,
        ("period=4", "Your queries start at 0", "only t = period .. T - 1"),
    ),
    Mistake(
        "transformer-prefix-matching",
        "queries from 1",
        _prefix_queries_from_1,
        ("period=4", "Your queries start at 1"),
    ),
    Mistake(
        "transformer-prefix-matching",
        "the previous-token score",
        _prefix_previous_token,
        ("period=4", "That is the previous-token score (key t - 1)"),
    ),
    Mistake(
        "transformer-prefix-matching",
        "averaged over the heads too",
        _prefix_averaged_over_heads,
        ("expected shape (3,), got ()", "You averaged over the heads too"),
    ),
    Mistake(
        "transformer-prefix-matching",
        "not averaged over the batch",
        _prefix_not_averaged_over_the_batch,
        ("expected shape (3,), got (2, 3)", "You did not average over the batch"),
    ),
    Mistake(
        "transformer-prefix-matching",
        "a diagonal from query period - 1",
        _prefix_diagonal,
        ("period=4", "Your queries start at period - 1"),
    ),
]

test_wrong_answers = mistake_test(MISTAKES)
