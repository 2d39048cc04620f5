"""The chapter on the Transformer block: counts against the modules' own parameters and
PyTorch's FLOP counter, the training recipe, bits per character against a direct count,
the head patterns against hand-made texts and, on any text, their definitions, the
encoder-decoder's greedy decoding against its forward pass; the docstrings' other
claims as properties at the end (the counts over every config option live in
tests/unit/test_transformer_counts.py)."""

import contextlib
import functools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.flop_counter import FlopCounterMode

from attnbook import data, models, transformer
from attnbook.models import TransformerConfig

CONFIGS = [
    dict(),
    dict(norm="rmsnorm"),
    dict(mlp="swiglu"),
    dict(mlp="none"),
    dict(n_kv_heads=2),
    dict(n_kv_heads=1, mlp="swiglu", norm="rmsnorm"),
    dict(d_ff=100),
    dict(norm_position="post"),
    dict(attention="mla"),
    dict(attention="mla", kv_latent_dim=20, q_latent_dim=24, rope_dim=8, mlp="swiglu"),
]


def _numel(module) -> int:
    return sum(p.numel() for p in module.parameters())  # shared tensors counted once


@pytest.mark.parametrize("options", CONFIGS, ids=str)
def test_block_parameters_equal_the_blocks_own(options):
    config = TransformerConfig(d_model=48, n_heads=4, **options)
    counted = transformer.block_parameters(config)
    block = models.Block(config, is_causal=True)
    assert counted["total"] == _numel(block)
    assert counted["attention"] == _numel(block.attn)
    assert counted["mlp"] == (0 if block.mlp is None else _numel(block.mlp))


@pytest.mark.parametrize(
    "options",
    CONFIGS
    + [
        dict(tie_weights=True),
        dict(positional="learned", max_len=40),
        dict(positional="t5"),
        dict(norm_position="post", tie_weights=True, positional="alibi"),
    ],
    ids=str,
)
def test_model_parameters_equal_the_models_own(options):
    config = TransformerConfig(
        vocab_size=37, d_model=32, n_heads=4, n_layers=3, **options
    )
    assert transformer.model_parameters(config)["total"] == _numel(
        models.TinyGPT(config)
    )


def test_swiglu_holds_as_many_weights_as_gelu_without_biases():
    d = 96
    gelu = transformer.block_parameters(TransformerConfig(d_model=d, n_heads=4))["mlp"]
    swiglu = transformer.block_parameters(
        TransformerConfig(d_model=d, n_heads=4, mlp="swiglu")
    )["mlp"]
    assert swiglu == 8 * d * d and gelu == 8 * d * d + 5 * d


@pytest.mark.parametrize(
    "options",
    [
        dict(positional="none"),
        dict(positional="none", mlp="swiglu"),
        dict(positional="none", n_kv_heads=1),
        dict(positional="none", mlp="none"),
        dict(attention="mla"),
        dict(attention="mla", q_latent_dim=12, rope_dim=6, mlp="none"),
    ],
    ids=str,
)
def test_block_flops_equal_pytorchs_flop_counter(options):
    config = TransformerConfig(d_model=32, n_heads=4, **options)
    block = models.Block(config, is_causal=True)
    x = torch.randn(3, 11, 32)
    with FlopCounterMode(display=False) as counter:
        block(x)
    counted = transformer.block_flops(config, seq_len=11, batch=3)
    assert counted["total"] == counter.get_total_flops()
    assert counted["per_token"] == counted["total"] / 33


def test_latent_attention_is_counted_as_latent_attention_not_as_mha():
    # d = 16, h = 2, d_c = 4 d_h = 32, d_R = 4: the MHA formula gave 3,280 parameters
    # and 64,640 FLOPs (B = 2, n = 5); FlopCounterMode measures 89,760
    config = TransformerConfig(d_model=16, n_heads=2, attention="mla", rope_dim=4)
    assert transformer.block_parameters(config)["total"] == 4464
    assert transformer.block_flops(config, seq_len=5, batch=2)["total"] == 89760


def test_residual_stream_rms_reads_the_stream_and_scaled_init_keeps_it_level():
    torch.manual_seed(0)
    idx = torch.randint(0, 50, (4, 32))
    growth = {}
    for init in ("normal", "scaled"):
        config = TransformerConfig(
            vocab_size=50, n_layers=24, init=init, positional="none"
        )
        model = models.TinyGPT(config)
        rms = transformer.residual_stream_rms(model, idx)
        assert rms.shape == (25,)
        emb = model.tok_emb(idx)
        assert rms[0] == pytest.approx(emb.pow(2).mean().sqrt().item(), rel=1e-5)
        x = emb
        for block in model.blocks:
            x = block(x)
        assert rms[-1] == pytest.approx(x.pow(2).mean().sqrt().item(), rel=1e-5)
        growth[init] = (rms[-1] / rms[0]).item()
    assert growth["scaled"] < growth["normal"] / 1.5


def test_init_options_draw_gpt2s_standard_deviations_and_default_is_unchanged():
    config = TransformerConfig(d_model=256, n_heads=4, n_layers=8, vocab_size=300)
    torch.manual_seed(1)
    default = models.TinyGPT(config)
    torch.manual_seed(1)
    again = models.TinyGPT(TransformerConfig(**{**config.__dict__, "init": "torch"}))
    for a, b in zip(default.parameters(), again.parameters()):
        assert torch.equal(a, b)
    scaled = models.TinyGPT(TransformerConfig(**{**config.__dict__, "init": "scaled"}))
    block = scaled.blocks[3]
    assert block.attn.q_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert block.attn.out_proj.weight.std().item() == pytest.approx(0.02 / 4, rel=0.05)
    assert block.mlp.proj.weight.std().item() == pytest.approx(0.02 / 4, rel=0.05)
    assert torch.all(block.attn.q_proj.bias == 0) and torch.all(block.ln1.weight == 1)
    with pytest.raises(ValueError, match="init must be one of"):
        TransformerConfig(init="xavier")


def test_lm_optimizer_decays_the_matrices_only():
    model = models.TinyGPT(TransformerConfig(vocab_size=20, tie_weights=True))
    opt = transformer.lm_optimizer(model, 1e-3, weight_decay=0.2)
    decay, plain = opt.param_groups
    assert decay["weight_decay"] == 0.2 and plain["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"])
    assert all(p.dim() == 1 for p in plain["params"])
    ids = {id(p) for g in opt.param_groups for p in g["params"]}
    assert ids == {id(p) for p in model.parameters()}  # every parameter once
    with pytest.raises(ValueError, match="lm_optimizer: lr must be a finite number > 0"):
        transformer.lm_optimizer(model, 0.0)


class _Uniform(torch.nn.Module):
    """A language model that knows nothing: equal logits for every character."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab
        self.p = torch.nn.Parameter(torch.zeros(()))

    def forward(self, idx):
        return torch.zeros(*idx.shape, self.vocab) + self.p


def test_bits_per_char_is_log2_v_for_a_uniform_model_and_counts_every_character():
    ids = torch.randint(0, 13, (1000,))
    assert transformer.bits_per_char(_Uniform(13), ids, 64) == pytest.approx(
        math.log2(13)
    )


def test_bits_per_char_equals_a_direct_sum_over_windows():
    torch.manual_seed(0)
    model = models.TinyGPT(TransformerConfig(vocab_size=11, n_layers=1))
    ids = torch.randint(0, 11, (203,))  # 203 = 10 windows of 20 predictions + 2
    total, count = 0.0, 0
    for start in range(0, 202, 20):
        window = ids[start : start + 21]
        logits = model(window[None, :-1])[0]
        total += F.cross_entropy(logits, window[1:], reduction="sum").item()
        count += len(window) - 1
    assert count == 202
    got = transformer.bits_per_char(model, ids, 20, batch_size=3)
    assert got == pytest.approx(total / count / math.log(2), rel=1e-6)


def test_train_language_model_learns_a_periodic_text_with_the_recipe():
    torch.manual_seed(0)
    ids = torch.tensor([3, 4, 5, 6, 7] * 200)
    model = models.TinyGPT(TransformerConfig(vocab_size=8, d_model=32, n_layers=1))
    before = transformer.bits_per_char(model, ids, 32)
    history = transformer.train_language_model(
        model,
        ids,
        steps=60,
        block_size=32,
        batch_size=8,
        lr=1e-2,
        warmup=10,
        generator=torch.Generator().manual_seed(0),
        progress=False,
    )
    assert len(history.losses) == 60
    after = transformer.bits_per_char(model, ids, 32)
    assert before > 2.0 and after < 0.3
    with pytest.raises(ValueError, match="warmup"):
        transformer.train_language_model(
            model, ids, steps=5, block_size=8, batch_size=2, lr=1e-3, warmup=5
        )


def test_sample_text_starts_with_the_prompt_and_greedy_is_deterministic():
    vocab = data.Vocab("abc ")
    torch.manual_seed(0)
    model = models.TinyGPT(TransformerConfig(vocab_size=len(vocab), n_layers=1))
    a = transformer.sample_text(model, vocab, "ab", 10, temperature=0.0)
    b = transformer.sample_text(model, vocab, "ab", 10, temperature=0.0)
    ids = model.generate(torch.tensor([vocab.encode("ab")]), 10)[0]
    assert a == b == "".join(vocab.itos[i] for i in ids) and a.startswith("ab")
    s = transformer.sample_text(
        model, vocab, "a", 5, generator=torch.Generator().manual_seed(0)
    )
    assert s.startswith("a") and model.training


def test_text_patterns_point_where_the_definitions_say():
    text = "ab (cd ef) ab"
    p = transformer.text_patterns(text)
    q, k = p["previous character"]
    assert q.tolist() == list(range(1, len(text))) and (q - k).eq(1).all()
    q, k = p["start of word"]
    assert dict(zip(q.tolist(), k.tolist())) == {1: 0, 5: 4, 8: 7, 12: 11}
    q, k = p["open bracket"]
    assert dict(zip(q.tolist(), k.tolist())) == {t: 3 for t in (4, 5, 6, 7, 8)}
    q, k = p["induction"]  # "ab" at 11-12 repeats "ab" at 0-1: key 2, the " " after it
    assert dict(zip(q.tolist(), k.tolist())) == {12: 2}
    quoted = transformer.text_patterns('a "bc" d "e')["open quote"]
    assert dict(zip(*[t.tolist() for t in quoted])) == {3: 2, 4: 2, 10: 9}
    nested = transformer.text_patterns("f(a[b]c)")["open bracket"]
    assert dict(zip(*[t.tolist() for t in nested])) == {2: 1, 4: 3, 6: 1}


def test_pattern_scores_are_one_for_a_head_that_does_exactly_that():
    text = "one (two) three (four) one two"
    patterns = transformer.text_patterns(text)
    T = len(text)
    weights = torch.zeros(2, 3, T, T)
    weights[..., 0, 0] = 1.0
    q, k = patterns["previous character"]
    weights[0, 1, q, k] = 1.0
    for t in range(1, T):
        weights[1, 2, t, : t + 1] = 1.0 / (t + 1)  # uniform over the visible keys
    scores = transformer.pattern_scores(weights, patterns)
    prev, chance = scores["previous character"]
    assert prev.shape == (2, 3) and prev[0, 1] == 1.0 and prev[0, 0] == 0.0
    assert prev[1, 2].item() == pytest.approx(chance)
    assert chance == pytest.approx(sum(1 / (t + 1) for t in range(1, T)) / (T - 1))
    with pytest.raises(ValueError, match="n_layers, n_heads, T, T"):
        transformer.pattern_scores(weights[0, 0], patterns)


def test_repeat_losses_split_the_halves():
    tokens = data.repeated_tokens(4, 6, 9, generator=torch.Generator().manual_seed(0))
    first, second = transformer.repeat_losses(_UniformGPT(9), tokens, 6)
    assert first == pytest.approx(math.log(9)) and second == pytest.approx(math.log(9))


class _UniformGPT(_Uniform):
    def forward(self, idx, head_mask=None):
        return super().forward(idx)


def test_train_on_repeats_records_the_curves():
    torch.manual_seed(0)
    model = models.TinyGPT(TransformerConfig(vocab_size=16, n_layers=2, mlp="none"))
    held_out = data.repeated_tokens(
        8, 10, 16, generator=torch.Generator().manual_seed(1)
    )
    curves = transformer.train_on_repeats(
        model,
        steps=20,
        batch_size=4,
        periods=(4, 12),
        lr=1e-3,
        eval_every=10,
        eval_tokens=held_out,
        generator=torch.Generator().manual_seed(0),
        progress=False,
    )
    assert curves["step"] == [10, 20]
    assert len(curves["first_half"]) == len(curves["repeated_half"]) == 2
    with pytest.raises(ValueError, match="multiple of eval_every"):
        transformer.train_on_repeats(
            model,
            steps=15,
            batch_size=4,
            periods=(4, 8),
            lr=1e-3,
            eval_every=10,
            eval_tokens=held_out,
        )


def test_seq2seq_generate_is_the_argmax_of_the_forward_pass_and_stops_at_eos():
    torch.manual_seed(0)
    model = models.TinySeq2Seq(TransformerConfig(vocab_size=12, n_layers=2)).eval()
    src = torch.randint(3, 12, (5, 7))
    mask = torch.ones(5, 7, dtype=torch.bool)
    mask[1, 4:] = False
    tokens = model.generate(src, mask, max_len=6)
    prefix = torch.full((5, 1), data.BOS)
    for t in range(tokens.shape[1]):
        expected = model(src, prefix, mask)[:, -1].argmax(-1)
        alive = (prefix[:, 1:] != data.EOS).all(1) & (prefix[:, 1:] != data.PAD).all(1)
        assert torch.equal(tokens[alive, t], expected[alive])
        assert (tokens[~alive, t] == data.PAD).all()
        prefix = torch.cat([prefix, tokens[:, t : t + 1]], dim=1)
    with pytest.raises(ValueError, match="max_len"):
        model.generate(src, mask, max_len=0)


def test_seq2seq_trains_on_dates_and_exact_match_counts_strings():
    task = data.date_task(
        n_train=64, n_test=16, generator=torch.Generator().manual_seed(0)
    )
    vocab = max(len(task.src_vocab), len(task.tgt_vocab))
    torch.manual_seed(0)
    model = models.TinySeq2Seq(TransformerConfig(vocab_size=vocab, n_layers=1))
    batch = task.encode(task.train[:8])
    loss = transformer.seq2seq_loss(model, batch)
    logits = model(batch["src"], batch["tgt"][:, :-1], batch["src_mask"])
    real = batch["tgt"][:, 1:] != data.PAD
    manual = F.cross_entropy(logits[real], batch["tgt"][:, 1:][real])
    assert loss.item() == pytest.approx(manual.item(), rel=1e-6)
    assert transformer.exact_match(model, task) == 0.0  # untrained
    assert model.training


def test_head_ablation_equals_the_loss_with_that_head_masked():
    torch.manual_seed(0)
    model = models.TinyGPT(TransformerConfig(vocab_size=10, n_layers=2, mlp="none"))
    x = torch.randint(0, 10, (2, 9))

    def loss_fn(model, head_mask):
        return F.cross_entropy(
            model(x[:, :-1], head_mask=head_mask).flatten(0, 1), x[:, 1:].flatten()
        )

    losses = models.head_ablation(model, loss_fn)
    assert losses.shape == (2, 4)
    mask = torch.ones(2, 4)
    mask[1, 2] = 0
    assert losses[1, 2].item() == pytest.approx(loss_fn(model, mask).item())
    assert len(set(losses.flatten().tolist())) > 1


def test_bad_arguments_name_the_function_and_the_argument():
    """Regression: exact_match on no pair divided by zero; a prompt with a character not in
    the vocabulary, an out-of-range period or token id reached the model."""
    task = data.date_task(n_train=8, n_test=4, generator=torch.Generator().manual_seed(0))
    vocab = max(len(task.src_vocab), len(task.tgt_vocab))
    model = models.TinySeq2Seq(TransformerConfig(vocab_size=vocab, n_layers=1))
    with pytest.raises(ValueError, match="exact_match: pairs is empty"):
        transformer.exact_match(model, task, [])
    chars = data.Vocab("abc ")
    gpt = models.TinyGPT(TransformerConfig(vocab_size=len(chars), n_layers=1))
    with pytest.raises(ValueError, match=r"sample_text: prompt has characters not in vocab: \['z'\]"):
        transformer.sample_text(gpt, chars, "az", 3)
    with pytest.raises(ValueError, match="repeat_losses: period must be an integer >= 2, got 1"):
        transformer.repeat_losses(gpt, torch.zeros(2, 2, dtype=torch.long), 1)


# --------------------------------------------------------------------------------------
# The docstrings' claims, as properties
# --------------------------------------------------------------------------------------
PATTERN_NAMES = (
    "previous character",
    "start of word",
    "open bracket",
    "open quote",
    "induction",
)


def _patterns_by_definition(text: str) -> dict[str, dict[int, int]]:
    """``{name: {t: k(t)}}`` straight from ``text_patterns``' docstring, each position
    on its own by a scan of the text before it (the slow obvious way)."""
    out = {name: {} for name in PATTERN_NAMES}
    for t, ch in enumerate(text):
        if t >= 1:
            out["previous character"][t] = t - 1
        if ch.isalpha() and t >= 1 and text[t - 1].isalpha():
            start = t
            while start > 0 and text[start - 1].isalpha():
                start -= 1
            out["start of word"][t] = start
        if ch not in "([{)]}":
            depth = 0  # closing brackets between t and the key, each closes one
            for j in range(t - 1, -1, -1):
                if text[j] in ")]}":
                    depth += 1
                elif text[j] in "([{":
                    if depth == 0:
                        out["open bracket"][t] = j
                        break
                    depth -= 1
        if ch != '"' and text[:t].count('"') % 2 == 1:
            out["open quote"][t] = text.rindex('"', 0, t)
        pair = text[t - 1 : t + 1]
        ends = [j for j in range(1, t - 1) if text[j - 1 : j + 1] == pair]
        if t >= 1 and ends:
            out["induction"][t] = ends[-1] + 1
    return out


#: Texts of letters, runs of one letter, spaces, brackets of each kind (matched or
#: not) and quotes: every case the definitions distinguish.
TEXTS = st.lists(
    st.sampled_from(["a", "b", "aaa", "ab", " ", *"()[]{}", '"', "."]),
    max_size=24,
).map("".join)


@settings(max_examples=60, deadline=None)
@given(text=TEXTS)
def test_text_patterns_follow_their_definitions_on_any_text(text):
    patterns = transformer.text_patterns(text)
    assert tuple(patterns) == PATTERN_NAMES
    expected = _patterns_by_definition(text)
    for name, (queries, keys) in patterns.items():
        assert queries.dtype == keys.dtype == torch.long
        assert queries.tolist() == sorted(expected[name]), name  # each t once, in order
        assert dict(zip(queries.tolist(), keys.tolist())) == expected[name], name


def test_induction_points_past_the_latest_earlier_pair_in_a_run():
    """Regression: in a run of one character the pair at ``t`` also ends at ``t - 1``;
    the key is the latest occurrence ending before that, not none."""
    q, k = transformer.text_patterns("aaaa")["induction"]
    assert dict(zip(q.tolist(), k.tolist())) == {3: 2}
    q, k = transformer.text_patterns("ab aaa")["induction"]
    assert dict(zip(q.tolist(), k.tolist())) == {}


@settings(max_examples=30, deadline=None)
@given(text=TEXTS, T=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_pattern_scores_are_mean_weights_and_a_uniform_head_scores_chance(
    text, T, seed
):
    """``pattern_scores``' docstring: ``scores`` is the mean weight on ``k(t)`` over
    the pattern's queries (those among the ``T`` positions), ``chance`` the mean of
    ``1 / (t + 1)``, the score of a head spreading its weight over the visible keys."""
    patterns = transformer.text_patterns(text)
    weights = torch.rand(2, 3, T, T, generator=torch.Generator().manual_seed(seed))
    scores = transformer.pattern_scores(weights, patterns)
    for name, (queries, keys) in patterns.items():
        pairs = [(q, k) for q, k in zip(queries.tolist(), keys.tolist()) if q < T]
        if not pairs:
            assert name not in scores
            continue
        table, chance = scores[name]
        assert table.shape == (2, 3)
        for layer in range(2):
            for head in range(3):
                mean = sum(weights[layer, head, q, k].item() for q, k in pairs) / len(
                    pairs
                )
                assert table[layer, head].item() == pytest.approx(mean, rel=1e-5)
        assert chance == pytest.approx(sum(1 / (q + 1) for q, _ in pairs) / len(pairs))
    visible = torch.tril(torch.ones(T, T))
    uniform = (visible / visible.sum(-1, keepdim=True))[None, None]
    for table, chance in transformer.pattern_scores(uniform, patterns).values():
        assert table.item() == pytest.approx(chance, rel=1e-5)


def _small_gpt(vocab_size: int) -> models.TinyGPT:
    """A one-layer TinyGPT of width 16, the same weights on every call."""
    torch.manual_seed(0)
    return models.TinyGPT(
        TransformerConfig(vocab_size=vocab_size, d_model=16, n_heads=2, n_layers=1)
    )


_tiny_gpt = functools.lru_cache(maxsize=None)(_small_gpt)  # shared: never trained


@settings(max_examples=15, deadline=None)
@given(
    prompt=st.text(alphabet="abc ", min_size=1, max_size=5),
    n_chars=st.integers(0, 6),
    temperature=st.sampled_from([0.0, 0.8, 2.0]),
    top_k=st.none() | st.integers(1, 4),
)
def test_sample_text_is_the_prompt_then_the_n_chars_tokens_the_model_writes(
    prompt, n_chars, temperature, top_k
):
    """``sample_text``' docstring: ``generate`` with a KV cache, each of the
    ``n_chars`` tokens written as its character (a special id as its name)."""
    vocab = data.Vocab("abc ")
    model = _tiny_gpt(len(vocab))
    options = dict(temperature=temperature, top_k=top_k)
    seeded = torch.Generator().manual_seed(0)
    text = transformer.sample_text(
        model, vocab, prompt, n_chars, generator=seeded, **options
    )
    assert model.training
    model.eval()
    try:
        ids = model.generate(
            torch.tensor([vocab.encode(prompt)]), n_chars,
            generator=torch.Generator().manual_seed(0), **options,
        )[0]  # fmt: skip
    finally:
        model.train()
    assert len(ids) == len(prompt) + n_chars
    assert text == "".join(vocab.itos[i] for i in ids.tolist())
    assert text.startswith(prompt)


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(2, 40), block_size=st.integers(1, 9), batch_size=st.integers(1, 4)
)
def test_bits_per_char_counts_every_character_after_the_first_once(
    n, block_size, batch_size
):
    """Windows of ``block_size + 1`` overlapping by one, the last one shorter: every
    character from the second on is predicted once, from its window's earlier ones."""
    model = _tiny_gpt(7)
    ids = torch.randint(0, 7, (n,), generator=torch.Generator().manual_seed(n))
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, n - 1, block_size):
            window = ids[start : start + block_size + 1]
            logits = model(window[None, :-1])[0]
            total += F.cross_entropy(logits, window[1:], reduction="sum").item()
            count += len(window) - 1
    assert count == n - 1
    got = transformer.bits_per_char(model, ids, block_size, batch_size=batch_size)
    assert got == pytest.approx(total / count / math.log(2), rel=1e-5)


class _CopiesFrom(torch.nn.Module):
    """Predicts ``tokens`` perfectly at logit positions ``start ..`` and knows nothing
    before: its loss is ``ln V`` on the targets ``1 .. start`` and 0 after."""

    def __init__(self, tokens, start, vocab):
        super().__init__()
        self.tokens, self.start, self.vocab = tokens, start, vocab

    def forward(self, idx, head_mask=None):
        logits = torch.zeros(*idx.shape, self.vocab)
        later = self.tokens[:, self.start + 1 :]
        logits[:, self.start :].scatter_(-1, later[..., None], 100.0)
        return logits


def test_repeat_losses_split_the_targets_at_period():
    """``repeat_losses``' docstring: targets ``1 .. period - 1`` are the first half,
    ``period .. 2 period - 1`` the second, so a model that predicts exactly the second
    half scores ``ln V`` and 0, and one that starts a target early or late does not."""
    period, vocab = 6, 9
    seeded = torch.Generator().manual_seed(0)
    tokens = data.repeated_tokens(4, period, vocab, generator=seeded)

    def losses(start):
        model = _CopiesFrom(tokens, start, vocab)
        return transformer.repeat_losses(model, tokens, period)

    first, second = losses(period - 1)
    assert first == pytest.approx(math.log(vocab))
    assert second == pytest.approx(0, abs=1e-9)
    (early, _), (_, late) = losses(period - 2), losses(period)
    assert early < math.log(vocab) - 0.1 and late > 0.1


@contextlib.contextmanager
def _optimizer_steps():
    """Every optimizer step's learning rates, weight decays, betas and gradient norm
    (after clipping), read by a global step pre-hook."""
    steps = []

    def record(optimizer, args, kwargs):
        grads = [p.grad for g in optimizer.param_groups for p in g["params"]]
        norm = torch.linalg.vector_norm(
            torch.stack([g.norm() for g in grads if g is not None])
        )
        steps.append(
            dict(
                lr=[g["lr"] for g in optimizer.param_groups],
                weight_decay=[g["weight_decay"] for g in optimizer.param_groups],
                betas=[tuple(g["betas"]) for g in optimizer.param_groups],
                norm=norm.item(),
            )
        )

    handle = register_optimizer_step_pre_hook(record)
    try:
        yield steps
    finally:
        handle.remove()


def _cosine(t, warmup, total, lr, min_lr):
    """The schedule ``train_language_model`` describes, written out."""
    if t < warmup:
        return lr * (t + 1) / warmup
    progress = (t - warmup) / (total - warmup)
    return min_lr + (lr - min_lr) * (1 + math.cos(math.pi * progress)) / 2


@pytest.mark.parametrize("warmup, grad_clip", [(3, 0.05), (0, None)])
def test_train_language_model_runs_the_recipe_its_docstring_names(warmup, grad_clip):
    """AdamW with betas (0.9, 0.95) and decay on the matrices only; ``warmup`` linear
    steps to ``lr`` (``warmup=0`` starts at ``lr``), then a cosine decay towards
    ``min_lr = lr / 10``; the gradient clipped to ``grad_clip``; batches from
    ``generator`` (the same seed, the same run)."""
    ids = torch.randint(0, 8, (300,), generator=torch.Generator().manual_seed(0))
    lr, steps = 0.01, 8
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = _small_gpt(8)
        with _optimizer_steps() as recorded:
            history = transformer.train_language_model(
                model, ids, steps=steps, block_size=8, batch_size=4, lr=lr,
                warmup=warmup, weight_decay=0.2, grad_clip=grad_clip,
                generator=torch.Generator().manual_seed(1), progress=False,
            )  # fmt: skip
        runs.append(history.losses)
    assert runs[0] == runs[1] and len(recorded) == steps
    for t, step in enumerate(recorded):
        expected = _cosine(t, warmup, steps, lr, lr / 10)
        assert step["lr"] == pytest.approx([expected, expected])
        assert step["weight_decay"] == [0.2, 0.0] and step["betas"] == [(0.9, 0.95)] * 2
        before = history.grad_norms[t]
        after = before if grad_clip is None else min(before, grad_clip)
        assert step["norm"] == pytest.approx(after, rel=1e-4)
    if grad_clip is not None:
        assert max(history.grad_norms) > grad_clip  # the clipping was exercised
    else:
        assert recorded[0]["lr"] == pytest.approx([lr, lr])


def test_train_on_repeats_draws_a_period_per_batch_at_a_constant_lr(monkeypatch):
    """``train_on_repeats``' docstring: a period drawn for every batch from ``periods``,
    AdamW at a constant ``lr``, and every ``eval_every`` steps the losses of
    :func:`repeat_losses` on ``eval_tokens`` (the last ones those of the final
    model)."""
    seeded = torch.Generator().manual_seed(1)
    held_out = data.repeated_tokens(4, 5, 12, generator=seeded)
    drawn = []

    def recording(batch_size, period, vocab, generator=None):
        drawn.append(period)
        return data.repeated_tokens(batch_size, period, vocab, generator=generator)

    monkeypatch.setattr(transformer, "repeated_tokens", recording)
    torch.manual_seed(0)
    model = _small_gpt(12)
    with _optimizer_steps() as recorded:
        curves = transformer.train_on_repeats(
            model, steps=12, batch_size=2, periods=(2, 4), lr=3e-3, eval_every=4,
            eval_tokens=held_out, generator=torch.Generator().manual_seed(0),
            progress=False,
        )  # fmt: skip
    assert len(drawn) == len(recorded) == 12 and set(drawn) == {2, 3, 4}
    assert all(step["lr"] == [3e-3] for step in recorded)
    assert curves["step"] == [4, 8, 12]
    first, second = transformer.repeat_losses(model, held_out, 5)
    assert curves["first_half"][-1] == pytest.approx(first, rel=1e-5)
    assert curves["repeated_half"][-1] == pytest.approx(second, rel=1e-5)
