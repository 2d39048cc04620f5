"""Tests of attnbook.data: vocabularies, date formats checked against datetime, reproducibility,
disjoint train/test splits, padded batches, and the generated alignment, captioning and graph
datasets."""

from __future__ import annotations

import datetime
import math

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
    task = data.date_task(300, 100, generator=torch.Generator().manual_seed(3))
    for src, tgt in task.train + task.test:
        date = datetime.date.fromisoformat(tgt)
        assert data.FIRST_DAY <= date <= data.LAST_DAY
        assert src in {data.format_date(date, style) for style in data.DATE_FORMATS}


def test_date_task_is_reproducible_and_split_by_date():
    a, b, c = (data.date_task(500, 200, generator=torch.Generator().manual_seed(s)) for s in (7, 7, 8))
    assert a.train == b.train and a.test == b.test
    assert a.train != c.train
    assert len(a.train) == 500 and len(a.test) == 200
    train_dates, test_dates = {t for _, t in a.train}, {t for _, t in a.test}
    assert len(train_dates) == 500 and len(test_dates) == 200 and not train_dates & test_dates
    styles_used = {next(st for st in data.DATE_FORMATS if data.format_date(datetime.date.fromisoformat(t), st) == s)
                   for s, t in a.train}
    assert styles_used == set(data.DATE_FORMATS)


def test_copy_task_reverse_reproducible_and_disjoint():
    task = data.copy_task(400, 100, min_len=3, max_len=6, reverse=True, n_symbols=4, generator=torch.Generator().manual_seed(2))
    again = data.copy_task(400, 100, min_len=3, max_len=6, reverse=True, n_symbols=4, generator=torch.Generator().manual_seed(2))
    assert task.train == again.train and task.test == again.test
    assert all(t == s[::-1] and 3 <= len(s) <= 6 and set(s) <= set("abcd") for s, t in task.train + task.test)
    assert not {s for s, _ in task.train} & {s for s, _ in task.test}
    assert {len(s) for s, _ in task.train} == {3, 4, 5, 6}
    assert all(s == t for s, t in data.copy_pairs(20, [5], generator=torch.Generator().manual_seed(0)))


def test_encode_pads_and_batches_cover_the_training_set():
    task = data.copy_task(10, 3, min_len=2, max_len=4, generator=torch.Generator().manual_seed(0))
    batch = task.encode([("ab", "ab"), ("abcd", "abcd")])
    assert batch["src"].tolist() == [[3, 4, 0, 0], [3, 4, 5, 6]]
    assert batch["src_mask"].tolist() == [[True, True, False, False], [True] * 4]
    assert batch["tgt"].tolist() == [[data.BOS, 3, 4, data.EOS, 0, 0], [data.BOS, 3, 4, 5, 6, data.EOS]]
    epochs = task.batches(batch_size=4, generator=torch.Generator().manual_seed(5))
    first, second = epochs(), epochs()
    assert [len(b["src"]) for b in first] == [4, 4, 2]
    assert [b["src"].tolist() for b in first] != [b["src"].tolist() for b in second]  # reshuffled
    same = data.copy_task(10, 3, min_len=2, max_len=4, generator=torch.Generator().manual_seed(0)).batches(batch_size=4, generator=torch.Generator().manual_seed(5))()
    assert [b["src"].tolist() for b in first] == [b["src"].tolist() for b in same]  # reproducible
    decoded = sorted(task.src_vocab.decode(row) for b in first for row in b["src"])
    assert decoded == sorted(s for s, _ in task.train)


def test_repeated_segments_partition_the_frames_in_order(gen):
    task = data.repeated_segments(20, 3, word_len=3, n_symbols=4, generator=gen)
    B, T, S = task.alignment.shape
    assert T == 9 and task.queries.shape == (B, T, 4) and task.frames.shape[:2] == (B, S)
    symbols = task.queries.argmax(-1)
    assert (symbols[:, 1:] != symbols[:, :-1]).all()  # neighbours differ
    assert torch.equal(symbols[:, :3].repeat(1, 3), symbols)  # the word, repeated
    for b in range(B):
        frames = [torch.nonzero(task.alignment[b, t]).flatten().tolist() for t in range(T)]
        flat = [j for seg in frames for j in seg]
        assert flat == list(range(int(task.mask[b].sum())))  # contiguous, in order, all real frames
        assert all(2 <= len(seg) <= 4 for seg in frames)
    assert (task.frames[~task.mask] == 0).all()
    # the prototypes are the same in every call: frames of one symbol sit near each other
    other = data.repeated_segments(5, 2, n_symbols=4, noise=0.0, generator=gen)
    proto = {int(s): other.frames[0, other.alignment[0, t]][0] for t, s in enumerate(other.queries[0].argmax(-1))}
    for t, s in enumerate(symbols[0].tolist()):
        if s in proto:
            assert (task.frames[0, task.alignment[0, t]] - proto[s]).abs().max() < 2.0


def test_shapes_captions_are_consistent(gen):
    images, captions, vocab, cells = data.shapes_captions(20, grid=3, cell=8, n_objects=3, generator=gen)
    assert images.shape == (20, 3, 24, 24) and captions.shape == (20, 8) and cells.shape == (20, 3)
    assert vocab[0] == "<bos>" and vocab[1] == "<eos>" and set(data.SHAPES) <= set(vocab)
    assert (captions[:, 0] == 0).all() and (captions[:, -1] == 1).all()
    assert (cells[:, 1:] > cells[:, :-1]).all(), "objects are named in reading order"
    for i in range(20):
        for c in range(9):  # a cell is drawn on (not white) exactly when the caption names it
            r, k = divmod(c, 3)
            drawn = (images[i, :, r * 8:(r + 1) * 8, k * 8:(k + 1) * 8] < 1).any().item()
            assert drawn == (c in cells[i].tolist())
        words = [vocab[t] for t in captions[i, 1:-1]]
        assert all(w in data.SHAPES for w in words[1::2]) and all(w not in data.SHAPES for w in words[::2])


def test_karate_club_matches_zacharys_graph():
    club = data.karate_club()
    assert club["x"].shape == (34, 34) and club["edge_index"].shape == (2, 156)
    assert club["y"].sum().item() == 17 and math.isclose(club["y"].float().mean().item(), 0.5)
    edges = {tuple(e) for e in club["edge_index"].T.tolist()}
    assert len(edges) == 156 and all((j, i) in edges for i, j in edges)  # both directions
    assert (0, 33) not in edges and (0, 1) in edges  # Mr. Hi and the Officer are not friends


# --------------------------------------------------------------------------------------
# The Python documentation as a character-level corpus
# --------------------------------------------------------------------------------------
def test_python_docs_is_the_shipped_help_text_split_by_topic_the_same_way_every_time():
    from pydoc_data.topics import topics

    from attnbook.data import python_docs

    corpus = python_docs()
    again = python_docs()
    assert torch.equal(corpus.train, again.train) and torch.equal(corpus.valid, again.valid)
    assert not set(corpus.train_names) & set(corpus.valid_names)
    assert sorted(corpus.train_names + corpus.valid_names) == sorted(topics)
    assert len(corpus.valid_names) == len(topics) // 10
    text = corpus.vocab.decode(corpus.valid)
    assert text == "\n\n".join(topics[n] for n in corpus.valid_names)
    assert len(corpus.train) + len(corpus.valid) > 450_000
    with pytest.raises(ValueError, match="valid_every"):
        python_docs(valid_every=1)


def test_ngram_baselines_equal_counting_by_hand():
    import math
    from collections import Counter

    from attnbook.data import ngram_bits_per_char

    train, valid, V = "abracadabra", "abcab", 5
    ids = {c: i for i, c in enumerate("abcdr")}
    t = torch.tensor([ids[c] for c in train])
    v = torch.tensor([ids[c] for c in valid])
    uni = Counter(train)
    expected = -sum(math.log2((uni[c] + 1) / (len(train) + V)) for c in valid) / len(valid)
    assert abs(ngram_bits_per_char(t, v, 1, V) - expected) < 1e-12
    pairs, firsts = Counter(zip(train, train[1:])), Counter(train[:-1])
    expected = -sum(math.log2((pairs[(a, b)] + 1) / (firsts[a] + V))
                    for a, b in zip(valid, valid[1:])) / (len(valid) - 1)
    assert abs(ngram_bits_per_char(t, v, 2, V) - expected) < 1e-12
    with pytest.raises(ValueError, match="n must be 1"):
        ngram_bits_per_char(t, v, 3, V)


def test_on_real_text_the_bigram_beats_the_unigram():
    from attnbook.data import ngram_bits_per_char, python_docs

    corpus = python_docs()
    V = len(corpus.vocab)
    unigram = ngram_bits_per_char(corpus.train, corpus.valid, 1, V)
    bigram = ngram_bits_per_char(corpus.train, corpus.valid, 2, V)
    assert 3.0 < bigram < unigram < math.log2(V)


def test_lm_windows_are_shifted_by_one_and_reproducible():
    from attnbook.data import lm_windows

    ids = torch.arange(100)
    x, y = lm_windows(ids, 16, 4, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 16)
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)
    x2, _ = lm_windows(ids, 16, 4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)
    with pytest.raises(ValueError, match="longer than block_size"):
        lm_windows(torch.arange(10), 10, 2)


def test_repeated_tokens_repeat_their_first_half():
    from attnbook.data import repeated_tokens

    x = repeated_tokens(4, 7, 50, generator=torch.Generator().manual_seed(0))
    assert x.shape == (4, 14) and torch.equal(x[:, :7], x[:, 7:])
    assert x.min() >= 0 and x.max() < 50
    assert torch.equal(x, repeated_tokens(4, 7, 50, generator=torch.Generator().manual_seed(0)))
    with pytest.raises(ValueError, match="repeated_tokens: period must be a positive integer"):
        repeated_tokens(2, 0, 50)
