"""Tests of attnbook.data: vocabularies, date formats checked against datetime, reproducibility,
disjoint train/test splits, and padded batches."""

from __future__ import annotations

import datetime

import pytest
import torch

from attnbook import data


def test_vocab_round_trip_and_specials():
    vocab = data.Vocab("cab")
    assert vocab.itos[:3] == ["<pad>", "<s>", "</s>"] and vocab.itos[3:] == ["a", "b", "c"]
    ids = vocab.encode("cab", bos=True, eos=True)
    assert ids == [data.BOS, 5, 3, 4, data.EOS]
    assert vocab.decode(ids + [7, 7]) == "cab"  # stops at EOS
    assert vocab.decode(torch.tensor([3, data.PAD, 4])) == "ab"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        vocab.encode("abz")


def test_date_formats_hand_checked():
    d = datetime.date(1987, 3, 5)  # a Thursday
    written = {style: data.format_date(d, style) for style in data.DATE_FORMATS}
    assert written == {
        "march 5, 1987": "march 5, 1987",
        "5 march 1987": "5 march 1987",
        "5 mar 87": "5 mar 87",
        "thursday, march 5, 1987": "thursday, march 5, 1987",
        "thu 5 mar 1987": "thu 5 mar 1987",
        "03/05/1987 (us)": "03/05/1987",
        "05.03.1987 (european)": "05.03.1987",
        "1987 march 5": "1987 march 5",
    }
    with pytest.raises(ValueError, match="style"):
        data.format_date(d, "5/3/87")


def test_date_targets_are_iso_and_agree_with_sources():
    task = data.date_task(300, 100, seed=3)
    for src, tgt in task.train + task.test:
        date = datetime.date.fromisoformat(tgt)
        assert data.FIRST_DAY <= date <= data.LAST_DAY
        assert src in {data.format_date(date, style) for style in data.DATE_FORMATS}


def test_date_task_is_reproducible_and_split_by_date():
    a, b, c = data.date_task(500, 200, seed=7), data.date_task(500, 200, seed=7), data.date_task(500, 200, seed=8)
    assert a.train == b.train and a.test == b.test
    assert a.train != c.train
    assert len(a.train) == 500 and len(a.test) == 200
    train_dates, test_dates = {t for _, t in a.train}, {t for _, t in a.test}
    assert len(train_dates) == 500 and len(test_dates) == 200 and not train_dates & test_dates
    styles_used = {next(st for st in data.DATE_FORMATS if data.format_date(datetime.date.fromisoformat(t), st) == s)
                   for s, t in a.train}
    assert styles_used == set(data.DATE_FORMATS)


def test_copy_task_reverse_reproducible_and_disjoint():
    task = data.copy_task(400, 100, min_len=3, max_len=6, reverse=True, n_symbols=4, seed=2)
    again = data.copy_task(400, 100, min_len=3, max_len=6, reverse=True, n_symbols=4, seed=2)
    assert task.train == again.train and task.test == again.test
    assert all(t == s[::-1] and 3 <= len(s) <= 6 and set(s) <= set("abcd") for s, t in task.train + task.test)
    assert not {s for s, _ in task.train} & {s for s, _ in task.test}
    assert {len(s) for s, _ in task.train} == {3, 4, 5, 6}
    assert all(s == t for s, t in data.copy_pairs(20, [5], seed=0))


def test_encode_pads_and_batches_cover_the_training_set():
    task = data.copy_task(10, 3, min_len=2, max_len=4, seed=0)
    batch = task.encode([("ab", "ab"), ("abcd", "abcd")])
    assert batch["src"].tolist() == [[3, 4, 0, 0], [3, 4, 5, 6]]
    assert batch["src_mask"].tolist() == [[True, True, False, False], [True] * 4]
    assert batch["tgt"].tolist() == [[data.BOS, 3, 4, data.EOS, 0, 0], [data.BOS, 3, 4, 5, 6, data.EOS]]
    epochs = task.batches(batch_size=4, seed=5)
    first, second = epochs(), epochs()
    assert [len(b["src"]) for b in first] == [4, 4, 2]
    assert [b["src"].tolist() for b in first] != [b["src"].tolist() for b in second]  # reshuffled
    same = data.copy_task(10, 3, min_len=2, max_len=4, seed=0).batches(batch_size=4, seed=5)()
    assert [b["src"].tolist() for b in first] == [b["src"].tolist() for b in same]  # reproducible
    decoded = sorted(task.src_vocab.decode(row) for b in first for row in b["src"])
    assert decoded == sorted(s for s, _ in task.train)
