"""Small sequence-to-sequence tasks generated locally, reproducibly, with no download.

* **Date normalization** (the classic attention demo): free-text dates such as ``"tue 5
  march 1987"``, ``"march 5, 1987"`` or ``"05.03.1987"`` must be rewritten as ISO
  ``"1987-03-05"``. The output characters come from different places of the input
  depending on the format, so the learned attention has something visible to align.
  Train and test use **disjoint calendar dates**: a test date never appears in training,
  in any format.
* **Copy / reverse**: a random string over a few symbols must be copied (monotonic
  alignment) or reversed (anti-diagonal alignment). Its length is a knob, which is what
  the bottleneck experiment of Chapter 8 turns.

Strings are character-level. :class:`Vocab` maps characters to ids with three reserved
ids (``PAD = 0``, ``BOS = 1``, ``EOS = 2``); :class:`Task` holds the split and turns it
into padded batches ``{"src": (B, S), "src_mask": (B, S) bool, "tgt": (B, T)}`` where
``tgt`` is ``BOS y_1 ... y_n EOS`` followed by padding.
"""

from __future__ import annotations

import datetime
import random
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

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
]

PAD, BOS, EOS = 0, 1, 2
_SPECIALS = ["<pad>", "<s>", "</s>"]


class Vocab:
    """Character vocabulary: ids 0-2 are ``<pad>``, ``<s>``, ``</s>``; the characters
    follow, sorted."""

    def __init__(self, chars: str | Sequence[str]):
        self.itos = _SPECIALS + sorted(set(chars))
        self.stoi = {ch: i for i, ch in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        """Ids of the characters of ``text``, optionally wrapped in ``BOS`` /
        ``EOS``."""
        unknown = sorted(set(text) - set(self.stoi))
        if unknown:
            raise ValueError(
                f"text {text!r} has characters outside the vocabulary: {unknown}"
            )
        return [BOS] * bos + [self.stoi[ch] for ch in text] + [EOS] * eos

    def decode(self, ids) -> str:
        """The text of ``ids``: skips ``PAD`` and ``BOS``, stops at the first
        ``EOS``."""
        out = []
        for i in ids.tolist() if isinstance(ids, torch.Tensor) else ids:
            if i == EOS:
                break
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
            raise ValueError("pairs is empty")
        src = _pad([self.src_vocab.encode(s) for s, _ in pairs])
        tgt = _pad([self.tgt_vocab.encode(t, bos=True, eos=True) for _, t in pairs])
        return {"src": src, "src_mask": src != PAD, "tgt": tgt}

    def batches(
        self, batch_size: int = 64, seed: int = 0
    ) -> Callable[[], list[dict[str, torch.Tensor]]]:
        """A callable for :func:`attnbook.train.fit`: each call reshuffles the training
        set.

        The shuffles come from one ``torch.Generator`` seeded with ``seed``, so a
        training run is
        reproducible: epoch ``k`` sees the same batches every time.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        gen = torch.Generator().manual_seed(seed)

        def epoch() -> list[dict[str, torch.Tensor]]:
            order = torch.randperm(len(self.train), generator=gen).tolist()
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
    if style not in DATE_FORMATS:
        raise ValueError(f"style must be one of {list(DATE_FORMATS)}, got {style!r}")
    return DATE_FORMATS[style](date)


def date_task(n_train: int = 4000, n_test: int = 1000, seed: int = 0) -> Task:
    """Free-text date -> ISO ``YYYY-MM-DD``, with ``n_train + n_test`` distinct dates in
    1950-2049.

    Each date is drawn once (without replacement) and written in one random style; the
    first ``n_test`` dates are the test set, so no test date is seen in training.
    Two-digit years (``"87"``) are read as 1950-2049, the range the dates come from.
    """
    n_days = (LAST_DAY - FIRST_DAY).days + 1
    if n_train < 1 or n_test < 1 or n_train + n_test > n_days:
        raise ValueError(
            f"need 1 <= n_train, n_test and n_train + n_test <= {n_days}, got "
            f"{n_train}, {n_test}"
        )
    rng = random.Random(seed)
    styles = list(DATE_FORMATS)
    pairs = []
    for offset in rng.sample(range(n_days), n_train + n_test):
        date = FIRST_DAY + datetime.timedelta(days=offset)
        pairs.append((format_date(date, rng.choice(styles)), date.isoformat()))
    src_chars = set("".join(s for s, _ in pairs)) | set("0123456789")
    return Task(pairs[n_test:], pairs[:n_test], Vocab(src_chars), Vocab("0123456789-"))


# --------------------------------------------------------------------------------------
# Copy and reverse
# --------------------------------------------------------------------------------------
def copy_pairs(
    n: int,
    lengths: Sequence[int],
    reverse: bool = False,
    n_symbols: int = 8,
    seed: int = 0,
) -> list[tuple[str, str]]:
    """``n`` random strings over the first ``n_symbols`` letters, with lengths drawn
    from ``lengths``.

    The target is the string itself (copy) or reversed (``reverse=True``).
    """
    if not 1 <= n_symbols <= 26:
        raise ValueError(f"n_symbols must be in 1..26, got {n_symbols}")
    if not lengths or min(lengths) < 1:
        raise ValueError(
            f"lengths must be a non-empty list of positive lengths, got {lengths}"
        )
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"[:n_symbols]
    out = []
    for _ in range(n):
        s = "".join(rng.choice(letters) for _ in range(rng.choice(list(lengths))))
        out.append((s, s[::-1] if reverse else s))
    return out


def copy_task(
    n_train: int = 3000,
    n_test: int = 500,
    min_len: int = 4,
    max_len: int = 16,
    reverse: bool = False,
    n_symbols: int = 8,
    seed: int = 0,
) -> Task:
    """Copy (or reverse) strings of length ``min_len..max_len``; test strings never
    occur in training."""
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got {min_len}, {max_len}")
    lengths = range(min_len, max_len + 1)
    test = copy_pairs(n_test, lengths, reverse, n_symbols, seed=seed)
    seen = {s for s, _ in test}
    train: list[tuple[str, str]] = []
    k = 1
    # draw in rounds with derived seeds, skipping any test string
    while len(train) < n_train:
        fresh = [
            p
            for p in copy_pairs(
                n_train, lengths, reverse, n_symbols, seed=seed + 1000 * k
            )
            if p[0] not in seen
        ]
        train += fresh[: n_train - len(train)]
        k += 1
        if k > 100:
            raise ValueError(
                "too few distinct strings for this split: raise max_len or n_symbols"
            )
    letters = "abcdefghijklmnopqrstuvwxyz"[:n_symbols]
    return Task(train, test, Vocab(letters), Vocab(letters))
