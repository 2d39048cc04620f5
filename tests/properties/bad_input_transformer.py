"""Bad-input rows for attnbook.transformer (see tests/properties/test_bad_input.py)."""

import torch
from test_bad_input import Bad, Edge

from attnbook import data, transformer as T
from attnbook.models import TinyGPT, TinySeq2Seq, TransformerConfig

NAN = float("nan")
_CONFIG = TransformerConfig(vocab_size=9, d_model=16, n_heads=2, n_layers=1)
_VOCAB = data.Vocab("abc ")
_IDS = torch.randint(0, 9, (40,), generator=torch.Generator().manual_seed(0))
_REP = torch.randint(0, 9, (2, 8), generator=torch.Generator().manual_seed(1))  # period 4


def _gpt(vocab_size=9):
    torch.manual_seed(0)
    return TinyGPT(TransformerConfig(vocab_size=vocab_size, d_model=16, n_heads=2, n_layers=1))


def _changed(**fields):
    """_CONFIG's copy with fields set after construction, so the config never checked
    them: the counting functions must refuse what TransformerConfig would have."""
    config = TransformerConfig(**vars(_CONFIG))
    for name, value in fields.items():
        setattr(config, name, value)
    return config


def _task():
    return data.date_task(n_train=8, n_test=4, generator=torch.Generator().manual_seed(0))


def _seq2seq(task):
    torch.manual_seed(0)
    vocab = max(len(task.src_vocab), len(task.tgt_vocab))
    return TinySeq2Seq(TransformerConfig(vocab_size=vocab, d_model=16, n_heads=2, n_layers=1))


def _loss(**changes):
    task = _task()
    batch = {**task.encode(task.train[:2]), **changes}
    return T.seq2seq_loss(_seq2seq(task), batch)


def _batch_without_mask():
    task = _task()
    batch = task.encode(task.train[:2])
    del batch["src_mask"]
    return T.seq2seq_loss(_seq2seq(task), batch)


def _exact(pairs=None, **kw):
    task = _task()
    return T.exact_match(_seq2seq(task), task, pairs, **kw)


def _train(**kw):
    args = dict(steps=2, block_size=8, batch_size=2, lr=1e-3, progress=False)
    return T.train_language_model(_gpt(), _IDS, **{**args, **kw})


def _repeats(**kw):
    args = dict(steps=2, batch_size=2, periods=(2, 4), lr=1e-3, eval_every=1, eval_tokens=_REP, progress=False)
    return T.train_on_repeats(_gpt(), **{**args, **kw})


ROWS = [
    # counting
    Bad("block_parameters", "wrong-type", lambda: T.block_parameters({"d_model": 16}), ("block_parameters", "config")),
    Bad("model_parameters", "wrong-type", lambda: T.model_parameters(None), ("model_parameters", "config")),
    Bad("block_flops", "zero", lambda: T.block_flops(_CONFIG, 0), ("block_flops", "seq_len")),
    Bad("block_flops", "non-integer", lambda: T.block_flops(_CONFIG, 2.5), ("block_flops", "seq_len")),
    Bad("block_flops", "negative", lambda: T.block_flops(_CONFIG, 4, batch=-1), ("block_flops", "batch")),
    Bad("block_flops", "boolean", lambda: T.block_flops(_CONFIG, True), ("block_flops", "seq_len")),
    Bad("block_flops", "wrong-type", lambda: T.block_flops("gpt", 4), ("block_flops", "config")),
    Bad("block_parameters", "out-of-range", lambda: T.block_parameters(_changed(attention="gqa")),
        ("block_parameters", "config", "attention")),
    Bad("model_parameters", "out-of-range", lambda: T.model_parameters(_changed(mlp="relu")),
        ("model_parameters", "config", "mlp")),
    Bad("block_flops", "out-of-range", lambda: T.block_flops(_changed(attention="mla", positional="none"), 4),
        ("block_flops", "config", "positional='rope'")),
    # the residual stream
    Bad("residual_stream_rms", "out-of-range", lambda: T.residual_stream_rms(_gpt(), torch.full((1, 4), 9)),
        ("residual_stream_rms", "idx", "[0, 9)")),
    Bad("residual_stream_rms", "integer-dtype", lambda: T.residual_stream_rms(_gpt(), torch.zeros(1, 4)),
        ("residual_stream_rms", "idx", "int64")),
    Bad("residual_stream_rms", "empty", lambda: T.residual_stream_rms(_gpt(), torch.zeros(1, 0, dtype=torch.long)),
        ("residual_stream_rms", "idx")),
    Bad("residual_stream_rms", "wrong-type", lambda: T.residual_stream_rms(torch.nn.Linear(2, 2), _REP),
        ("residual_stream_rms", "model")),
    # training
    Bad("lm_optimizer", "zero", lambda: T.lm_optimizer(_gpt(), 0.0), ("lm_optimizer", "lr")),
    Bad("lm_optimizer", "nan", lambda: T.lm_optimizer(_gpt(), NAN), ("lm_optimizer", "lr")),
    Bad("lm_optimizer", "negative", lambda: T.lm_optimizer(_gpt(), 1e-3, weight_decay=-0.1),
        ("lm_optimizer", "weight_decay")),
    Bad("lm_optimizer", "out-of-range", lambda: T.lm_optimizer(_gpt(), 1e-3, betas=(0.9, 1.0)),
        ("lm_optimizer", "betas")),
    Bad("lm_optimizer", "wrong-type", lambda: T.lm_optimizer("model", 1e-3), ("lm_optimizer", "model")),
    Bad("train_language_model", "zero", lambda: _train(steps=0), ("train_language_model", "steps")),
    Bad("train_language_model", "non-integer", lambda: _train(block_size=2.5), ("train_language_model", "block_size")),
    Bad("train_language_model", "negative", lambda: _train(warmup=-1), ("train_language_model", "warmup")),
    Bad("train_language_model", "out-of-range", lambda: _train(warmup=2), ("train_language_model", "warmup")),
    Bad("train_language_model", "zero", lambda: _train(batch_size=0), ("train_language_model", "batch_size")),
    Bad("train_language_model", "nan", lambda: _train(lr=NAN), ("train_language_model", "lr")),
    Bad("train_language_model", "nan", lambda: _train(min_lr=NAN), ("train_language_model", "min_lr")),
    Bad("train_language_model", "zero", lambda: _train(grad_clip=0.0), ("train_language_model", "grad_clip")),
    Bad("train_language_model", "out-of-range", lambda: _train(block_size=40), ("train_language_model", "block_size")),
    Bad("train_language_model", "wrong-type", lambda: _train(mixed_precision="no"),
        ("train_language_model", "mixed_precision")),
    Bad("train_language_model", "integer-dtype",
        lambda: T.train_language_model(_gpt(), _IDS.float(), steps=1, block_size=4, batch_size=2, lr=1e-3),
        ("train_language_model", "ids", "int64")),
    Bad("train_language_model", "out-of-range",
        lambda: T.train_language_model(_gpt(5), _IDS, steps=1, block_size=4, batch_size=2, lr=1e-3),
        ("train_language_model", "ids", "[0, 5)")),
    Bad("bits_per_char", "zero", lambda: T.bits_per_char(_gpt(), _IDS, 0), ("bits_per_char", "block_size")),
    Bad("bits_per_char", "non-integer", lambda: T.bits_per_char(_gpt(), _IDS, 2.5), ("bits_per_char", "block_size")),
    Bad("bits_per_char", "zero", lambda: T.bits_per_char(_gpt(), _IDS, 4, batch_size=0),
        ("bits_per_char", "batch_size")),
    Bad("bits_per_char", "empty", lambda: T.bits_per_char(_gpt(), _IDS[:1], 4), ("bits_per_char", "ids")),
    Bad("bits_per_char", "wrong-shape", lambda: T.bits_per_char(_gpt(), _REP, 4), ("bits_per_char", "ids")),
    Bad("bits_per_char", "out-of-range", lambda: T.bits_per_char(_gpt(5), _IDS, 4), ("bits_per_char", "ids")),
    Bad("sample_text", "out-of-range", lambda: T.sample_text(_gpt(len(_VOCAB)), _VOCAB, "abz", 3), ("sample_text", "prompt")),
    Bad("sample_text", "empty", lambda: T.sample_text(_gpt(len(_VOCAB)), _VOCAB, "", 3), ("sample_text", "prompt")),
    Bad("sample_text", "negative", lambda: T.sample_text(_gpt(len(_VOCAB)), _VOCAB, "ab", -1), ("sample_text", "n_chars")),
    Bad("sample_text", "non-integer", lambda: T.sample_text(_gpt(len(_VOCAB)), _VOCAB, "ab", 2.5), ("sample_text", "n_chars")),
    Bad("sample_text", "nan", lambda: T.sample_text(_gpt(len(_VOCAB)), _VOCAB, "ab", 3, temperature=NAN),
        ("sample_text", "temperature")),
    Bad("sample_text", "zero", lambda: T.sample_text(_gpt(len(_VOCAB)), _VOCAB, "ab", 3, top_k=0), ("sample_text", "top_k")),
    Bad("sample_text", "wrong-type", lambda: T.sample_text(_gpt(len(_VOCAB)), "abc ", "ab", 3), ("sample_text", "vocab")),
    Edge("sample_text", "zero", lambda: T.sample_text(_gpt(len(_VOCAB)), _VOCAB, "ab", 0), lambda s: s == "ab"),
    # head patterns
    Bad("text_patterns", "wrong-type", lambda: T.text_patterns(["a", "b"]), ("text_patterns", "text")),
    Edge("text_patterns", "empty", lambda: T.text_patterns(""),
         lambda p: len(p) == 5 and all(len(q) == 0 and len(k) == 0 for q, k in p.values())),
    Bad("pattern_scores", "wrong-shape", lambda: T.pattern_scores(torch.rand(2, 3, 4), {}),
        ("pattern_scores", "weights")),
    Bad("pattern_scores", "integer-dtype", lambda: T.pattern_scores(torch.ones(1, 2, 4, 4, dtype=torch.long), {}),
        ("pattern_scores", "weights")),
    Bad("pattern_scores", "wrong-dtype",
        lambda: T.pattern_scores(torch.rand(1, 2, 4, 4), {"x": (torch.tensor([1.0]), torch.tensor([0.0]))}),
        ("pattern_scores", "patterns")),
    Bad("pattern_scores", "out-of-range",
        lambda: T.pattern_scores(torch.rand(1, 2, 4, 4), {"x": (torch.tensor([1]), torch.tensor([-1]))}),
        ("pattern_scores", "patterns")),
    Edge("pattern_scores", "empty", lambda: T.pattern_scores(torch.rand(1, 2, 4, 4), T.text_patterns("")),
         lambda out: out == {}),
    # the encoder-decoder
    Bad("seq2seq_loss", "wrong-type", lambda: _batch_without_mask(), ("seq2seq_loss", "batch", "src_mask")),
    Bad("seq2seq_loss", "wrong-shape", lambda: _loss(tgt=torch.ones(2, 1, dtype=torch.long)),
        ("seq2seq_loss", "batch['tgt']", "T >= 2")),
    Bad("seq2seq_loss", "out-of-range", lambda: _loss(tgt=torch.full((2, 4), 999)), ("seq2seq_loss", "batch['tgt']")),
    Bad("seq2seq_loss", "wrong-type", lambda: T.seq2seq_loss(_gpt(), {}), ("seq2seq_loss", "model")),
    Bad("exact_match", "empty", lambda: _exact([]), ("exact_match", "pairs")),
    Bad("exact_match", "zero", lambda: _exact(batch_size=0), ("exact_match", "batch_size")),
    Bad("exact_match", "non-integer", lambda: _exact(batch_size=2.5), ("exact_match", "batch_size")),
    # induction
    Bad("repeat_losses", "out-of-range", lambda: T.repeat_losses(_gpt(), _REP, 1), ("repeat_losses", "period")),
    Bad("repeat_losses", "wrong-shape", lambda: T.repeat_losses(_gpt(), _REP, 3), ("repeat_losses", "tokens", "(B, 6)")),
    Bad("repeat_losses", "integer-dtype", lambda: T.repeat_losses(_gpt(), _REP.float(), 4),
        ("repeat_losses", "tokens", "int64")),
    Bad("repeat_losses", "non-integer", lambda: T.repeat_losses(_gpt(), _REP, 4.0), ("repeat_losses", "period")),
    Bad("train_on_repeats", "out-of-range", lambda: _repeats(eval_every=3), ("train_on_repeats", "eval_every")),
    Bad("train_on_repeats", "zero", lambda: _repeats(steps=0), ("train_on_repeats", "steps")),
    Bad("train_on_repeats", "out-of-range", lambda: _repeats(periods=(4, 2)), ("train_on_repeats", "periods")),
    Bad("train_on_repeats", "nan", lambda: _repeats(lr=NAN), ("train_on_repeats", "lr")),
    Bad("train_on_repeats", "out-of-range", lambda: _repeats(eval_tokens=_REP + 9),
        ("train_on_repeats", "eval_tokens")),
]  # fmt: skip

EXEMPT: dict[str, str] = {}
