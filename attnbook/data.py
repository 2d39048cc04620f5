"""Every dataset of the book, generated locally and reproducibly, with no download.

* **Date normalization** (the classic attention demo): free-text dates such as ``"tue 5
  march 1987"``, ``"march 5, 1987"`` or ``"05.03.1987"`` must be rewritten as ISO
  ``"1987-03-05"``. The output characters come from different places of the input
  depending on the format, so the learned attention has something visible to align.
  Train and test use **disjoint calendar dates**: a test date never appears in training,
  in any format.
* **Copy / reverse**: a random string over a few symbols must be copied (monotonic
  alignment) or reversed (anti-diagonal alignment). Its length is a knob, which is what
  the bottleneck experiment of the recurrent-attention chapter turns.

* **Repeated segments** (:func:`repeated_segments`): speech-like frames where a word
  is spoken several times, for location-aware alignment.
* **Shapes and captions** (:func:`shapes_captions`): coloured shapes on a grid with
  captions naming them, for attention in image captioning.
* **Zachary's karate club** (:func:`karate_club`): a 34-node social graph with two
  communities, for graph attention.
* **The Python documentation** (:func:`python_docs`): real English prose that ships with
  every Python installation, for a character-level language model, with its unigram and
  bigram baselines (:func:`ngram_bits_per_char`) and random training windows
  (:func:`lm_windows`).

Randomness comes from a ``generator=`` (a ``torch.Generator``; ``None`` uses PyTorch's
global generator), so the same seeded generator gives the same data.

Strings are character-level. :class:`Vocab` maps characters to ids with three reserved
ids (``PAD = 0``, ``BOS = 1``, ``EOS = 2``); :class:`Task` holds the split and turns it
into padded batches ``{"src": (B, S), "src_mask": (B, S) bool, "tgt": (B, T)}`` where
``tgt`` is ``BOS y_1 ... y_n EOS`` followed by padding.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import torch
from torch import nn

from .contract import check_flag, check_indices, check_int, check_real, check_sizes

__all__ = [
    "PAD",
    "BOS",
    "EOS",
    "Vocab",
    "Task",
    "format_date",
    "date_task",
    "copy_pairs",
    "copy_task",
    "RepeatedSegments",
    "repeated_segments",
    "SHAPES",
    "COLOURS",
    "shapes_captions",
    "karate_club",
    "TextCorpus",
    "python_docs",
    "ngram_bits_per_char",
    "lm_windows",
    "repeated_tokens",
]

PAD, BOS, EOS = 0, 1, 2
_SPECIALS = ["<pad>", "<s>", "</s>"]


def _iterable(fn: str, chars) -> list:
    try:
        return list(chars)
    except TypeError:
        raise TypeError(
            f"{fn}: chars must be a string or a sequence of characters, got "
            f"{chars!r:.60}"
        ) from None


def _ids_before_eos(ids, size: int) -> list[int]:
    """The integer ``ids`` up to the first ``EOS``, each in ``[0, size)``."""
    ids = check_indices("Vocab.decode", "ids", ids, minimum=-(2**63)).tolist()
    ids = ids[: ids.index(EOS)] if EOS in ids else ids
    wrong = [i for i in ids if not 0 <= i < size]
    if wrong:
        raise ValueError(
            f"Vocab.decode: ids must lie in [0, {size}) before the first EOS, got "
            f"{wrong[:5]}"
        )
    return ids


class Vocab:
    """Character vocabulary: ids 0-2 are ``<pad>``, ``<s>``, ``</s>``; the characters
    follow, sorted."""

    def __init__(self, chars: str | Sequence[str]):
        if isinstance(chars, (str, bytes)) is False and not all(
            isinstance(ch, str) and len(ch) == 1 for ch in _iterable("Vocab", chars)
        ):
            raise TypeError(
                f"Vocab: chars must be a string or a sequence of characters, got "
                f"{chars!r:.60}"
            )
        self.itos = _SPECIALS + sorted(set(chars))
        self.stoi = {ch: i for i, ch in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        """Ids of the characters of ``text``, optionally wrapped in ``BOS`` /
        ``EOS``."""
        if not isinstance(text, str):
            raise TypeError(f"Vocab.encode: text must be a str, got {text!r:.60}")
        unknown = sorted(set(text) - set(self.stoi))
        if unknown:
            raise ValueError(
                f"Vocab.encode: text {text!r} has characters outside the "
                f"vocabulary: {unknown}"
            )
        return [BOS] * bos + [self.stoi[ch] for ch in text] + [EOS] * eos

    def decode(self, ids) -> str:
        """The text of ``ids``: skips ``PAD`` and ``BOS``, stops at the first
        ``EOS``."""
        out = []
        for i in _ids_before_eos(ids, len(self.itos)):
            if i not in (PAD, BOS):
                out.append(self.itos[i])
        return "".join(out)


def _pad(rows: list[list[int]]) -> torch.Tensor:
    longest = max(len(r) for r in rows)
    return torch.tensor(
        [r + [PAD] * (longest - len(r)) for r in rows], dtype=torch.long
    )


@dataclass
class Task:
    """A train/test split of ``(source, target)`` string pairs with their
    vocabularies."""

    train: list[tuple[str, str]]
    test: list[tuple[str, str]]
    src_vocab: Vocab
    tgt_vocab: Vocab

    def encode(self, pairs: Sequence[tuple[str, str]]) -> dict[str, torch.Tensor]:
        """One padded batch: ``src`` ``(N, S)``, ``src_mask`` ``(N, S)`` (True = real
        token), ``tgt`` ``(N, T)``."""
        if not pairs:
            raise ValueError("Task.encode: pairs is empty")
        src = _pad([self.src_vocab.encode(s) for s, _ in pairs])
        tgt = _pad([self.tgt_vocab.encode(t, bos=True, eos=True) for _, t in pairs])
        return {"src": src, "src_mask": src != PAD, "tgt": tgt}

    def batches(
        self, batch_size: int = 64, *, generator: torch.Generator | None = None
    ) -> Callable[[], list[dict[str, torch.Tensor]]]:
        """A callable for :func:`attnbook.train.fit`: each call reshuffles the training
        set.

        The shuffles are drawn from ``generator``, so with a freshly seeded generator
        a training run is reproducible: epoch ``k`` sees the same batches every time.
        """
        check_sizes("Task.batches", batch_size=batch_size)

        def epoch() -> list[dict[str, torch.Tensor]]:
            order = torch.randperm(len(self.train), generator=generator).tolist()
            return [
                self.encode([self.train[i] for i in order[k : k + batch_size]])
                for k in range(0, len(order), batch_size)
            ]

        return epoch


# --------------------------------------------------------------------------------------
# Date normalization
# --------------------------------------------------------------------------------------
MONTHS = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]
DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
FIRST_DAY, LAST_DAY = datetime.date(1950, 1, 1), datetime.date(2049, 12, 31)

# Written out by hand (not strftime), so the text never depends on the machine's locale.
DATE_FORMATS: dict[str, Callable[[datetime.date], str]] = {
    "march 5, 1987": lambda d: f"{MONTHS[d.month - 1]} {d.day}, {d.year}",
    "5 march 1987": lambda d: f"{d.day} {MONTHS[d.month - 1]} {d.year}",
    "5 mar 87": lambda d: f"{d.day} {MONTHS[d.month - 1][:3]} {d.year % 100:02d}",
    "thursday, march 5, 1987": lambda d: (
        f"{DAYS[d.weekday()]}, {MONTHS[d.month - 1]} {d.day}, {d.year}"
    ),
    "thu 5 mar 1987": lambda d: (
        f"{DAYS[d.weekday()][:3]} {d.day} {MONTHS[d.month - 1][:3]} {d.year}"
    ),
    "03/05/1987 (us)": lambda d: f"{d.month:02d}/{d.day:02d}/{d.year}",
    "05.03.1987 (european)": lambda d: f"{d.day:02d}.{d.month:02d}.{d.year}",
    "1987 march 5": lambda d: f"{d.year} {MONTHS[d.month - 1]} {d.day}",
}


def format_date(date: datetime.date, style: str) -> str:
    """``date`` written in one of the ``DATE_FORMATS`` (keys name the style by
    example)."""
    if not isinstance(date, datetime.date):
        raise TypeError(f"format_date: date must be a datetime.date, got {date!r:.60}")
    if not isinstance(style, str) or style not in DATE_FORMATS:
        raise ValueError(
            f"format_date: style must be one of {list(DATE_FORMATS)}, got {style!r}"
        )
    return DATE_FORMATS[style](date)


def date_task(
    n_train: int = 4000,
    n_test: int = 1000,
    *,
    generator: torch.Generator | None = None,
) -> Task:
    """Free-text date -> ISO ``YYYY-MM-DD``, with ``n_train + n_test`` distinct dates in
    1950-2049.

    Each date is drawn once (without replacement) and written in one random style; the
    first ``n_test`` dates are the test set, so no test date is seen in training.
    Two-digit years (``"87"``) are read as 1950-2049, the range the dates come from.
    """
    n_days = (LAST_DAY - FIRST_DAY).days + 1
    check_sizes("date_task", n_train=n_train, n_test=n_test)
    if n_train + n_test > n_days:
        raise ValueError(
            f"date_task: need 1 <= n_train, n_test and n_train + n_test <= "
            f"{n_days}, got "
            f"{n_train}, {n_test}"
        )
    n = n_train + n_test
    offsets = torch.randperm(n_days, generator=generator)[:n].tolist()
    styles = list(DATE_FORMATS)
    picks = torch.randint(len(styles), (n,), generator=generator).tolist()
    pairs = []
    for offset, style in zip(offsets, picks):
        date = FIRST_DAY + datetime.timedelta(days=offset)
        pairs.append((format_date(date, styles[style]), date.isoformat()))
    src_chars = set("".join(s for s, _ in pairs)) | set("0123456789")
    return Task(pairs[n_test:], pairs[:n_test], Vocab(src_chars), Vocab("0123456789-"))


# --------------------------------------------------------------------------------------
# Copy and reverse
# --------------------------------------------------------------------------------------
def _check_copy_pairs(n, lengths, reverse, n_symbols, fn="copy_pairs") -> list[int]:
    check_int(fn, "n", n, minimum=0)
    check_flag(fn, "reverse", reverse)
    if not 1 <= check_int(fn, "n_symbols", n_symbols) <= 26:
        raise ValueError(f"{fn}: n_symbols must be in 1..26, got {n_symbols}")
    lengths = check_indices(fn, "lengths", lengths, minimum=1).tolist()
    if not lengths:
        raise ValueError(f"{fn}: lengths must be a non-empty list of positive lengths")
    return lengths


def copy_pairs(
    n: int,
    lengths: Sequence[int],
    *,
    reverse: bool = False,
    n_symbols: int = 8,
    generator: torch.Generator | None = None,
) -> list[tuple[str, str]]:
    """``n`` random strings over the first ``n_symbols`` letters, with lengths drawn
    from ``lengths``.

    The target is the string itself (copy) or reversed (``reverse=True``).
    """
    lengths = _check_copy_pairs(n, lengths, reverse, n_symbols)
    letters = "abcdefghijklmnopqrstuvwxyz"[:n_symbols]
    out = []
    for pick in torch.randint(len(lengths), (n,), generator=generator).tolist():
        ids = torch.randint(n_symbols, (lengths[pick],), generator=generator)
        s = "".join(letters[i] for i in ids.tolist())
        out.append((s, s[::-1] if reverse else s))
    return out


def _check_copy_task(n_train, n_test, min_len, max_len, reverse, n_symbols) -> None:
    fn = "copy_task"
    check_sizes(fn, n_train=n_train, n_test=n_test, min_len=min_len)
    if check_int(fn, "max_len", max_len) < min_len:
        raise ValueError(
            f"{fn}: need 1 <= min_len <= max_len, got min_len={min_len}, "
            f"max_len={max_len}"
        )
    _check_copy_pairs(0, [min_len], reverse, n_symbols, fn)


def copy_task(
    n_train: int = 3000,
    n_test: int = 500,
    *,
    min_len: int = 4,
    max_len: int = 16,
    reverse: bool = False,
    n_symbols: int = 8,
    generator: torch.Generator | None = None,
) -> Task:
    """Copy (or reverse) strings of length ``min_len..max_len``; test strings never
    occur in training."""
    _check_copy_task(n_train, n_test, min_len, max_len, reverse, n_symbols)
    lengths = range(min_len, max_len + 1)
    draw = dict(reverse=reverse, n_symbols=n_symbols, generator=generator)
    test = copy_pairs(n_test, lengths, **draw)
    seen = {s for s, _ in test}
    train: list[tuple[str, str]] = []
    k = 1
    # draw in rounds from the same generator, skipping any test string
    while len(train) < n_train:
        fresh = [p for p in copy_pairs(n_train, lengths, **draw) if p[0] not in seen]
        train += fresh[: n_train - len(train)]
        k += 1
        if k > 100:
            raise ValueError(
                "too few distinct strings for this split: raise max_len or n_symbols"
            )
    letters = "abcdefghijklmnopqrstuvwxyz"[:n_symbols]
    return Task(train, test, Vocab(letters), Vocab(letters))


# --------------------------------------------------------------------------------------
# Repeated segments: a speech-like alignment task
# --------------------------------------------------------------------------------------
class RepeatedSegments(NamedTuple):
    """A batch of :func:`repeated_segments`: ``frames`` ``(B, S, D)``, ``mask`` ``(B,
    S)`` bool (True = a real frame, False = padding at the end; pass
    ``key_padding_mask=~mask`` to an attention), ``queries`` ``(B, T, n_symbols)``
    one-hot, ``alignment`` ``(B, T, S)`` bool (the frames of the symbol spelled at step
    ``t``)."""

    frames: torch.Tensor
    mask: torch.Tensor
    queries: torch.Tensor
    alignment: torch.Tensor


def _check_segments(n, repeats, word_len, n_symbols, dim, frames, noise) -> None:
    fn = "repeated_segments"
    check_sizes(fn, n=n, repeats=repeats, dim=dim)
    check_int(fn, "word_len", word_len, minimum=2)
    check_int(fn, "n_symbols", n_symbols, minimum=3)
    check_real(fn, "noise", noise, minimum=0)
    if (
        not isinstance(frames, (tuple, list))
        or len(frames) != 2
        or check_indices(fn, "frames_per_symbol", frames, minimum=1).tolist()
        != sorted(frames)
    ):
        raise ValueError(
            f"{fn}: frames_per_symbol must be (lo, hi) with 1 <= lo <= hi, got "
            f"{frames!r}"
        )


def repeated_segments(
    n: int,
    repeats: int,
    *,
    word_len: int = 3,
    n_symbols: int = 5,
    dim: int = 8,
    frames_per_symbol: tuple[int, int] = (2, 4),
    noise: float = 0.3,
    generator: torch.Generator | None = None,
) -> RepeatedSegments:
    """A speech-like alignment task: a word of ``word_len`` symbols repeated ``repeats``
    times, each symbol held for a few noisy frames.

    Every symbol has a fixed random prototype in ``R^dim`` (the same in every call);
    a frame is its symbol's prototype plus Gaussian noise of standard deviation
    ``noise``. Neighbouring symbols differ, so segment boundaries are visible, but every
    symbol occurs ``repeats`` times: content alone cannot tell the copies apart. The
    ``T = word_len * repeats`` queries are the symbols to find, in order.
    """
    _check_segments(n, repeats, word_len, n_symbols, dim, frames_per_symbol, noise)
    prototypes = torch.randn(n_symbols, dim, generator=torch.Generator().manual_seed(0))
    lo, hi = frames_per_symbol
    T = word_len * repeats
    examples = []
    for _ in range(n):
        word = [int(torch.randint(n_symbols, (1,), generator=generator))]
        while len(word) < word_len:  # no symbol next to itself, also across copies
            s = int(torch.randint(n_symbols, (1,), generator=generator))
            if s != word[-1] and (len(word) < word_len - 1 or s != word[0]):
                word.append(s)
        spelled = torch.tensor(word * repeats)
        durations = torch.randint(lo, hi + 1, (T,), generator=generator)
        examples.append((spelled, durations))
    S = max(int(d.sum()) for _, d in examples)
    frames = torch.zeros(n, S, dim)
    alignment = torch.zeros(n, T, S, dtype=torch.bool)
    for i, (spelled, durations) in enumerate(examples):
        ends = durations.cumsum(0)
        for t, (start, end) in enumerate(
            zip((ends - durations).tolist(), ends.tolist())
        ):
            alignment[i, t, start:end] = True
        length = int(ends[-1])
        symbol_of_frame = spelled.repeat_interleave(durations)
        frames[i, :length] = prototypes[symbol_of_frame] + noise * torch.randn(
            length, dim, generator=generator
        )
    mask = alignment.any(1)
    queries = nn.functional.one_hot(
        torch.stack([s for s, _ in examples]), n_symbols
    ).float()
    return RepeatedSegments(frames, mask, queries, alignment)


# --------------------------------------------------------------------------------------
# Shapes and captions: a generated image-captioning task
# --------------------------------------------------------------------------------------
SHAPES = ("square", "circle", "triangle", "cross")
COLOURS = {"red": (0.9, 0.1, 0.1), "green": (0.1, 0.7, 0.2), "blue": (0.15, 0.3, 0.95)}


def _shape_mask(shape: str, size: int) -> torch.Tensor:
    """A ``size x size`` boolean stencil of one of :data:`SHAPES`."""
    r = torch.arange(size, dtype=torch.float32) - (size - 1) / 2
    y, x = r[:, None], r[None, :]
    half = size / 2
    if shape == "square":
        return (y.abs() < half * 0.8) & (x.abs() < half * 0.8)
    if shape == "circle":
        return y**2 + x**2 < (half * 0.9) ** 2
    if shape == "triangle":  # apex at the top, base at the bottom
        return (
            (y > -half * 0.9) & (y < half * 0.8) & (x.abs() < (y + half * 0.9) * 0.55)
        )
    if shape == "cross":
        return (
            ((y.abs() < half * 0.3) | (x.abs() < half * 0.3))
            & (y.abs() < half * 0.9)
            & (x.abs() < half * 0.9)
        )
    raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")


def _check_shapes_captions(n, grid, cell, n_objects) -> None:
    fn = "shapes_captions"
    check_sizes(fn, n=n, grid=grid)
    check_int(fn, "cell", cell, minimum=4)
    if not 1 <= check_int(fn, "n_objects", n_objects) <= grid * grid:
        raise ValueError(
            f"{fn}: n_objects must be in [1, grid*grid={grid * grid}], got {n_objects}"
        )


def shapes_captions(
    n: int,
    *,
    grid: int = 3,
    cell: int = 8,
    n_objects: int = 2,
    generator: torch.Generator | None = None,
):
    """A generated captioning task: coloured shapes in the cells of a ``grid x grid``
    board.

    Each image holds ``n_objects`` shapes in distinct cells; its caption names them in
    reading order (row-major), colour then shape: ``<bos> red circle blue cross <eos>``.
    Returns ``(images, captions, vocab, cells)``: images ``(n, 3, grid*cell,
    grid*cell)`` in ``[0, 1]`` on a white background, captions ``(n, 2 + 2*n_objects)``
    token ids into ``vocab`` (a list of words, ``vocab[0] = "<bos>"``, ``vocab[1] =
    "<eos>"``), and ``cells`` ``(n, n_objects)``: the cell index of each named object.
    """
    _check_shapes_captions(n, grid, cell, n_objects)
    colours = list(COLOURS)
    vocab = ["<bos>", "<eos>", *colours, *SHAPES]
    stencils = [_shape_mask(s, cell - 2) for s in SHAPES]
    palette = torch.tensor([COLOURS[c] for c in colours])
    size = grid * cell
    images = torch.ones(n, 3, size, size)
    captions = torch.empty(n, 2 + 2 * n_objects, dtype=torch.long)
    cells = torch.empty(n, n_objects, dtype=torch.long)
    captions[:, 0], captions[:, -1] = 0, 1
    for i in range(n):
        # reading order
        chosen = (
            torch.randperm(grid * grid, generator=generator)[:n_objects].sort().values
        )
        colour = torch.randint(len(colours), (n_objects,), generator=generator)
        shape = torch.randint(len(SHAPES), (n_objects,), generator=generator)
        cells[i] = chosen
        for t, (c, col, shp) in enumerate(
            zip(chosen.tolist(), colour.tolist(), shape.tolist())
        ):
            top, left = (c // grid) * cell + 1, (c % grid) * cell + 1
            patch = images[i, :, top : top + cell - 2, left : left + cell - 2]
            patch[:, stencils[shp]] = palette[col][:, None]
            captions[i, 1 + 2 * t] = 2 + col
            captions[i, 2 + 2 * t] = 2 + len(colours) + shp
    return images, captions, vocab, cells


# --------------------------------------------------------------------------------------
# Zachary's karate club
# --------------------------------------------------------------------------------------
def karate_club() -> dict[str, object]:
    """Zachary's karate club (34 members, 78 friendships) as tensors, via ``networkx``.

    Returns ``{"x": one-hot features (34, 34), "edge_index": (2, 156) both directions,
    "y": (34,) club after the split (0 = Mr. Hi, 1 = Officer), "graph": the networkx
    graph}``. The one-hot features say nothing but "which node": everything a model
    learns comes from the graph.
    """
    import networkx as nx  # only this dataset needs networkx

    graph = nx.karate_club_graph()
    edges = torch.tensor(list(graph.edges()), dtype=torch.long).T
    edge_index = torch.cat([edges, edges.flip(0)], dim=1)
    y = torch.tensor(
        [0 if graph.nodes[n]["club"] == "Mr. Hi" else 1 for n in graph.nodes()]
    )
    return {
        "x": torch.eye(graph.number_of_nodes()),
        "edge_index": edge_index,
        "y": y,
        "graph": graph,
    }


# --------------------------------------------------------------------------------------
# Real text on every machine: the Python documentation
# --------------------------------------------------------------------------------------
class TextCorpus(NamedTuple):
    """A character-level corpus: the :class:`Vocab`, the ``train`` and ``valid`` ids
    (1-D ``long`` tensors, documents joined by a blank line) and the names of the
    documents in each split."""

    vocab: Vocab
    train: torch.Tensor
    valid: torch.Tensor
    train_names: list[str]
    valid_names: list[str]


def python_docs(valid_every: int = 10) -> TextCorpus:
    """The English prose of the Python documentation that CPython ships with every
    installation (``pydoc_data.topics``: 79 help topics, about 465,000 characters, the
    same in Colab), split by topic: every ``valid_every``-th topic, in name order, is
    validation, the rest training. Deterministic: no download, no random split."""
    from pydoc_data.topics import topics

    check_int("python_docs", "valid_every", valid_every, minimum=2)
    names = sorted(topics)
    valid = [n for i, n in enumerate(names) if i % valid_every == valid_every - 1]
    train = [n for n in names if n not in set(valid)]
    vocab = Vocab("".join(topics.values()) + "\n")

    def ids(chosen: list[str]) -> torch.Tensor:
        return torch.tensor(vocab.encode("\n\n".join(topics[n] for n in chosen)))

    return TextCorpus(vocab, ids(train), ids(valid), train, valid)


def _check_ngram(train, valid, n, vocab_size, alpha):
    fn = "ngram_bits_per_char"
    if isinstance(n, bool) or n not in (1, 2):
        raise ValueError(f"{fn}: n must be 1 (unigram) or 2 (bigram), got {n!r}")
    check_real(fn, "alpha", alpha, above=0)
    check_sizes(fn, vocab_size=vocab_size)
    train = check_indices(fn, "train", train, size=vocab_size)
    valid = check_indices(fn, "valid", valid, size=vocab_size)
    if len(train) < n or len(valid) < n:
        raise ValueError(
            f"{fn}: train and valid need at least n={n} ids, got {len(train)} and "
            f"{len(valid)}"
        )
    return train, valid


def ngram_bits_per_char(
    train: torch.Tensor,
    valid: torch.Tensor,
    n: int,
    vocab_size: int,
    alpha: float = 1.0,
) -> float:
    """Bits per character on ``valid`` of an ``n``-gram model (``n = 1``: unigram,
    ``n = 2``: bigram) counted on ``train``, with add-``alpha`` smoothing:

        ``p(c | prev) = (count(prev, c) + alpha) / (count(prev) + alpha V)``.

    The baselines a character-level language model must beat: the unigram knows only
    how often each character occurs, the bigram also the one before it. ``train`` and
    ``valid`` are 1-D id tensors below ``vocab_size``."""
    train, valid = _check_ngram(train, valid, n, vocab_size, alpha)
    V = vocab_size
    if n == 1:
        counts = torch.bincount(train, minlength=V).double() + alpha
        logp = torch.log2(counts / counts.sum())[valid]
    else:
        pairs = torch.bincount(train[:-1] * V + train[1:], minlength=V * V)
        counts = pairs.double().view(V, V) + alpha
        logp = torch.log2(counts / counts.sum(dim=1, keepdim=True))[
            valid[:-1], valid[1:]
        ]
    return -logp.mean().item()


def _check_lm_windows(ids, block_size, batch_size) -> None:
    fn = "lm_windows"
    check_sizes(fn, block_size=block_size, batch_size=batch_size)
    if not isinstance(ids, torch.Tensor) or ids.dtype == torch.bool:
        raise TypeError(f"{fn}: ids must be an integer tensor, got {ids!r:.60}")
    if ids.is_floating_point() or ids.is_complex():
        raise TypeError(f"{fn}: ids must be an integer tensor, got {ids.dtype}")
    if ids.dim() != 1 or len(ids) <= block_size:
        raise ValueError(
            f"{fn}: ids must be 1-D and longer than block_size={block_size}, got "
            f"shape {tuple(ids.shape)}"
        )


def lm_windows(
    ids: torch.Tensor,
    block_size: int,
    batch_size: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of random windows of a 1-D id tensor for next-character prediction:
    ``x (batch_size, block_size)`` and ``y``, the same windows shifted by one
    (``y[:, t] = x[:, t + 1]``, and the character after the window last)."""
    _check_lm_windows(ids, block_size, batch_size)
    starts = torch.randint(0, len(ids) - block_size, (batch_size,), generator=generator)
    rows = starts[:, None] + torch.arange(block_size + 1)
    windows = ids[rows]
    return windows[:, :-1], windows[:, 1:]


def repeated_tokens(
    batch_size: int,
    period: int,
    vocab_size: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Sequences of ``period`` uniformly random tokens followed by the same tokens
    again, ``(batch_size, 2 period)``: the first half cannot be predicted, the second
    half can be by copying, the task on which induction heads form (Olsson et al.,
    2022)."""
    check_sizes("repeated_tokens", batch_size=batch_size, period=period)
    check_int("repeated_tokens", "vocab_size", vocab_size, minimum=2)
    first = torch.randint(0, vocab_size, (batch_size, period), generator=generator)
    return torch.cat([first, first], dim=1)
