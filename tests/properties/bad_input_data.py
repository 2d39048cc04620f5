"""Bad-input rows of attnbook.data (see tests/properties/test_bad_input.py)."""

from __future__ import annotations

import datetime

import torch
from test_bad_input import Bad, Edge

from attnbook.data import (
    Task,
    Vocab,
    copy_pairs,
    copy_task,
    date_task,
    format_date,
    lm_windows,
    ngram_bits_per_char,
    python_docs,
    repeated_segments,
    repeated_tokens,
    shapes_captions,
)

_V = Vocab("abc")
_IDS = torch.tensor([3, 4, 5, 3, 4, 5, 3])


def _task():
    return Task([("ab", "ba")], [("ca", "ac")], Vocab("abc"), Vocab("abc"))


ROWS = [
    Bad("Vocab", "wrong-type", lambda: Vocab(5), ("Vocab", "chars")),
    Bad("Vocab", "wrong-type", lambda: Vocab(["ab", "c"]), ("Vocab", "chars")),
    Bad("Vocab", "out-of-range", lambda: _V.encode("abz"), ("Vocab.encode", "text")),
    Bad("Vocab", "wrong-type", lambda: _V.encode(["a"]), ("Vocab.encode", "text")),
    Bad("Vocab", "out-of-range", lambda: _V.decode([3, 9]), ("Vocab.decode", "ids")),
    Bad("Vocab", "negative", lambda: _V.decode(torch.tensor([3, -1])), ("Vocab.decode", "ids")),
    Bad("Vocab", "non-integer", lambda: _V.decode([3.0, 4.0]), ("Vocab.decode", "ids")),
    Bad("Vocab", "boolean", lambda: _V.decode(torch.tensor([True, False])), ("Vocab.decode", "ids")),
    Edge("Vocab", "empty", lambda: _V.decode([]), lambda text: text == ""),
    Bad("Task", "empty", lambda: _task().encode([]), ("Task.encode", "pairs")),
    Bad("Task", "zero", lambda: _task().batches(0), ("Task.batches", "batch_size")),
    Bad("Task", "non-integer", lambda: _task().batches(2.5), ("Task.batches", "batch_size")),
    Bad("format_date", "out-of-range", lambda: format_date(datetime.date(1987, 3, 5), "5/3"), ("format_date", "style")),
    Bad("format_date", "wrong-type", lambda: format_date("1987-03-05", "1987 march 5"), ("format_date", "date")),
    Bad("date_task", "zero", lambda: date_task(0, 10), ("date_task", "n_train")),
    Bad("date_task", "non-integer", lambda: date_task(10, 2.5), ("date_task", "n_test")),
    Bad("date_task", "out-of-range", lambda: date_task(40000, 10), ("date_task", "n_train")),
    Bad("copy_pairs", "non-integer", lambda: copy_pairs(3, [2.5]), ("copy_pairs", "lengths")),
    Bad("copy_pairs", "zero", lambda: copy_pairs(3, [0, 2]), ("copy_pairs", "lengths")),
    Bad("copy_pairs", "empty", lambda: copy_pairs(3, []), ("copy_pairs", "lengths")),
    Bad("copy_pairs", "out-of-range", lambda: copy_pairs(3, [2], n_symbols=27), ("copy_pairs", "n_symbols")),
    Bad("copy_pairs", "negative", lambda: copy_pairs(-1, [2]), ("copy_pairs", "n")),
    Bad("copy_pairs", "wrong-type", lambda: copy_pairs(3, [2], reverse="yes"), ("copy_pairs", "reverse")),
    Edge("copy_pairs", "zero", lambda: copy_pairs(0, [2]), lambda pairs: pairs == []),
    Bad("copy_task", "out-of-range", lambda: copy_task(10, 5, min_len=5, max_len=4), ("copy_task", "max_len")),
    Bad("copy_task", "non-integer", lambda: copy_task(10, 5, min_len=2.5), ("copy_task", "min_len")),
    Bad("copy_task", "zero", lambda: copy_task(0, 5), ("copy_task", "n_train")),
    Bad("copy_task", "out-of-range", lambda: copy_task(10, 5, n_symbols=0), ("copy_task", "n_symbols")),
    Bad("repeated_segments", "zero", lambda: repeated_segments(2, 0), ("repeated_segments", "repeats")),
    Bad("repeated_segments", "non-integer", lambda: repeated_segments(2.5, 2), ("repeated_segments", "n")),
    Bad("repeated_segments", "out-of-range", lambda: repeated_segments(2, 2, word_len=1), ("repeated_segments", "word_len")),
    Bad("repeated_segments", "nan", lambda: repeated_segments(2, 2, noise=float("nan")), ("repeated_segments", "noise")),
    Bad("repeated_segments", "wrong-shape", lambda: repeated_segments(2, 2, frames_per_symbol=(4, 2)),
        ("repeated_segments", "frames_per_symbol")),
    Bad("repeated_segments", "non-integer", lambda: repeated_segments(2, 2, frames_per_symbol=(1.5, 3)),
        ("repeated_segments", "frames_per_symbol")),
    Bad("shapes_captions", "zero", lambda: shapes_captions(0), ("shapes_captions", "n")),
    Bad("shapes_captions", "out-of-range", lambda: shapes_captions(2, grid=2, n_objects=5), ("shapes_captions", "n_objects")),
    Bad("shapes_captions", "non-integer", lambda: shapes_captions(2, cell=8.0), ("shapes_captions", "cell")),
    Bad("shapes_captions", "out-of-range", lambda: shapes_captions(2, cell=2), ("shapes_captions", "cell")),
    Bad("python_docs", "out-of-range", lambda: python_docs(1), ("python_docs", "valid_every")),
    Bad("python_docs", "non-integer", lambda: python_docs(2.5), ("python_docs", "valid_every")),
    Bad("ngram_bits_per_char", "integer-dtype", lambda: ngram_bits_per_char(_IDS.float(), _IDS, 1, 6),
        ("ngram_bits_per_char", "train")),
    Bad("ngram_bits_per_char", "out-of-range", lambda: ngram_bits_per_char(_IDS, _IDS, 2, 5),
        ("ngram_bits_per_char", "train")),
    Bad("ngram_bits_per_char", "nan", lambda: ngram_bits_per_char(_IDS, _IDS, 1, 6, alpha=float("nan")),
        ("ngram_bits_per_char", "alpha")),
    Bad("ngram_bits_per_char", "out-of-range", lambda: ngram_bits_per_char(_IDS, _IDS, 3, 6), ("ngram_bits_per_char", "n")),
    Bad("ngram_bits_per_char", "empty", lambda: ngram_bits_per_char(_IDS, _IDS[:0], 1, 6),
        ("ngram_bits_per_char", "valid")),
    Bad("lm_windows", "integer-dtype", lambda: lm_windows(_IDS.float(), 3, 2), ("lm_windows", "ids")),
    Bad("lm_windows", "out-of-range", lambda: lm_windows(_IDS, 7, 2), ("lm_windows", "block_size")),
    Bad("lm_windows", "zero", lambda: lm_windows(_IDS, 3, 0), ("lm_windows", "batch_size")),
    Bad("lm_windows", "non-integer", lambda: lm_windows(_IDS, 2.5, 2), ("lm_windows", "block_size")),
    Bad("repeated_tokens", "zero", lambda: repeated_tokens(2, 0, 50), ("repeated_tokens", "period")),
    Bad("repeated_tokens", "non-integer", lambda: repeated_tokens(2.5, 3, 50), ("repeated_tokens", "batch_size")),
    Bad("repeated_tokens", "out-of-range", lambda: repeated_tokens(2, 3, 1), ("repeated_tokens", "vocab_size")),
]
EXEMPT = {
    "PAD": "a constant (token id)",
    "BOS": "a constant (token id)",
    "EOS": "a constant (token id)",
    "RepeatedSegments": "a NamedTuple of results, built by repeated_segments",
    "SHAPES": "a constant (the shape names)",
    "COLOURS": "a constant (colour name -> RGB)",
    "karate_club": "takes no argument",
    "TextCorpus": "a NamedTuple of results, built by python_docs",
}
