"""Plausible wrong answers to the exercises of the chapter on the KV cache: each fails its check with a
message that points at the mistake."""

import torch
from wrong_answers import Mistake, mistake_test


# kvcache-bytes: the book's solution with one thing changed
def _bytes_keys_only(n_layers, n_kv_heads, head_dim, seq_len, batch=1, bytes_per_elem=2):
    return n_layers * n_kv_heads * head_dim * seq_len * batch * bytes_per_elem


def _bytes_batch_left_out(n_layers, n_kv_heads, head_dim, seq_len, batch=1, bytes_per_elem=2):
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * bytes_per_elem


def _bytes_in_gib(n_layers, n_kv_heads, head_dim, seq_len, batch=1, bytes_per_elem=2):
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch * bytes_per_elem / 2**30


def _bytes_counts_elements(n_layers, n_kv_heads, head_dim, seq_len, batch=1, bytes_per_elem=2):
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch


# kvcache-paged-gather: the book's solution with one thing changed
def _gather_contiguous_blocks(pool, block_table, length):
    blocks = pool[: len(block_table)]  # blocks 0, 1, ... instead of the table's
    return blocks.transpose(0, 1).flatten(1, 2)[:, :length]


def _gather_without_transpose(pool, block_table, length):
    blocks = pool[block_table]
    return blocks.reshape(pool.shape[1], -1, pool.shape[3])[:, :length]  # heads and blocks mixed


def _gather_whole_blocks(pool, block_table, length):
    return pool[block_table].transpose(0, 1).flatten(1, 2)  # the last block's empty slots too


def _gather_heads_last(pool, block_table, length):
    return pool[block_table].permute(0, 2, 1, 3).flatten(0, 1)[:length]  # (length, h, d)


# kvcache-merge-splits: the book's solution with one thing changed
def _merge(o, lse, *, subtract_max=True, guard=True, normalize=True):
    top = lse.amax(-1, keepdim=True) if subtract_max else torch.zeros_like(lse[..., :1])
    if guard:
        top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    weights = torch.exp(lse - top)
    merged = (weights[..., None] * o).sum(-2)
    return merged / weights.sum(-1, keepdim=True).clamp_min(1e-30) if normalize else merged


def _merge_plain_mean(o, lse):
    return o.mean(-2)


def _merge_without_the_max(o, lse):
    return _merge(o, lse, subtract_max=False)


def _merge_nan_when_every_split_is_empty(o, lse):
    return _merge(o, lse, guard=False)


def _merge_not_normalized(o, lse):
    return _merge(o, lse, normalize=False)


# kvcache-decode-bytes: the book's solution with one thing changed
def _decode(n_params, n_layers, n_kv_heads, head_dim, seq_len, batch=1, bytes_per_elem=4, *,
            weight_reads=1, kv=2, size=None):
    cache = kv * n_layers * n_kv_heads * head_dim * seq_len * batch
    return (n_params * weight_reads + cache) * (bytes_per_elem if size is None else size)


def _decode_weights_per_sequence(n_params, n_layers, n_kv_heads, head_dim, seq_len, batch=1, bytes_per_elem=4):
    return _decode(n_params, n_layers, n_kv_heads, head_dim, seq_len, batch, bytes_per_elem, weight_reads=batch)


def _decode_no_cache(n_params, n_layers, n_kv_heads, head_dim, seq_len, batch=1, bytes_per_elem=4):
    return _decode(n_params, n_layers, n_kv_heads, head_dim, seq_len, batch, bytes_per_elem, kv=0)


def _decode_keys_only(n_params, n_layers, n_kv_heads, head_dim, seq_len, batch=1, bytes_per_elem=4):
    return _decode(n_params, n_layers, n_kv_heads, head_dim, seq_len, batch, bytes_per_elem, kv=1)


def _decode_elements(n_params, n_layers, n_kv_heads, head_dim, seq_len, batch=1, bytes_per_elem=4):
    return _decode(n_params, n_layers, n_kv_heads, head_dim, seq_len, batch, bytes_per_elem, size=1)


MISTAKES = [
    Mistake("kvcache-bytes", "keys only: no factor 2", _bytes_keys_only,
            ("kv_cache_bytes(n_layers=32, n_kv_heads=32, head_dim=128, seq_len=4096, batch=1, "
             "bytes_per_elem=2) should be 2147483648", "got 1073741824", "keys only", "the factor 2")),
    Mistake("kvcache-bytes", "batch left out", _bytes_batch_left_out,
            ("kv_cache_bytes(n_layers=12, n_kv_heads=12, head_dim=64, seq_len=1024, batch=8, "
             "bytes_per_elem=4)", "You left out batch")),
    Mistake("kvcache-bytes", "returns GiB", _bytes_in_gib,
            ("seq_len=4096", "got 2.0", "You return GiB", "number of bytes")),
    Mistake("kvcache-bytes", "counts elements, not bytes", _bytes_counts_elements,
            ("bytes_per_elem=2) should be 2147483648, got 1073741824", "You count elements",
             "multiply by bytes_per_elem")),
    Mistake("kvcache-decode-bytes", "weights read once per sequence", _decode_weights_per_sequence,
            ("decode_bytes(n_params=3300000", "batch=8", "should be 46,754,432", "once per sequence")),
    Mistake("kvcache-decode-bytes", "the KV cache left out", _decode_no_cache,
            ("decode_bytes(n_params=3300000", "should be 17,394,304, got 13200000", "You left out the KV cache")),
    Mistake("kvcache-decode-bytes", "keys only", _decode_keys_only,
            ("should be 17,394,304, got 15297152", "keys only", "the factor 2")),
    Mistake("kvcache-decode-bytes", "elements, not bytes", _decode_elements,
            ("should be 17,394,304, got 4348576", "You count elements")),
    Mistake("kvcache-paged-gather", "reads blocks 0, 1, ... of the pool", _gather_contiguous_blocks,
            ("length 7 with block_size=4, block_table=", "You read blocks 0, 1, 2", "pool[block_table]")),
    Mistake("kvcache-paged-gather", "heads not moved first before flattening", _gather_without_transpose,
            ("length 7 with block_size=4", "without moving the heads first", "transpose(0, 1)")),
    Mistake("kvcache-paged-gather", "every slot of the blocks kept", _gather_whole_blocks,
            ("length 7 with block_size=4", "expected shape (2, 7, 3), got (2, 8, 3)",
             "keep the first `length` positions")),
    Mistake("kvcache-paged-gather", "result (length, heads, head_dim)", _gather_heads_last,
            ("length 7 with block_size=4", "got (7, 2, 3)", "Put the heads first")),
    Mistake("kvcache-merge-splits", "plain mean of the splits", _merge_plain_mean,
            ("merging 4 splits of shape (2, 3, 4, 5)", "You averaged the splits", "exp(lse_s - M)")),
    Mistake("kvcache-merge-splits", "exp(lse) without the maximum overflows", _merge_without_the_max,
            ("merging 4 splits of shape (2, 3, 4, 5), every score + 1000", "inf or NaN", "exp(lse) overflows",
             "subtract the largest lse")),
    Mistake("kvcache-merge-splits", "NaN when every split is empty", _merge_nan_when_every_split_is_empty,
            ("every split is empty", "zeros, not NaN", "lse - (-inf) is NaN")),
    Mistake("kvcache-merge-splits", "weighted sum not divided by the weights' sum", _merge_not_normalized,
            ("merging 4 splits of shape (2, 3, 4, 5)", "did not divide by the sum of the weights")),
]

test_wrong_answers = mistake_test(MISTAKES)
