"""Bad-input rows for attnbook.models (see tests/properties/test_bad_input.py): the cases of
``test_models.BAD_MODEL_INPUTS``, each with its public name and class of wrong input,
plus rows for the layers and ``head_ablation``."""

import torch
from test_bad_input import Bad, Edge
from test_models import BAD_MODEL_INPUTS

from attnbook import models as M
from attnbook.models import TransformerConfig

NAN = float("nan")
_CFG = TransformerConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1)
_MLA = TransformerConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, attention="mla")
_X = torch.randn(2, 5, 16)
_IDS = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(0))
_PAD = torch.tensor([[True, True, False, False, False], [False] * 5])

# (public name, class of wrong input, needles to add) for each BAD_MODEL_INPUTS entry, in order;
# None leaves the entry out (entry 37: a too-long input to learned positions is refused by
# LearnedPositionalEmbedding, whose message names max_len but not TinyGPT.forward).
_TABLE = [
    ("TransformerConfig", "zero", ()), ("TransformerConfig", "negative", ()),
    ("TransformerConfig", "out-of-range", ()), ("TransformerConfig", "non-integer", ()),
    ("TransformerConfig", "negative", ()), ("TransformerConfig", "zero", ()), ("TransformerConfig", "zero", ()),
    ("TransformerConfig", "zero", ()), ("TransformerConfig", "zero", ()), ("TransformerConfig", "out-of-range", ()),
    ("TransformerConfig", "zero", ()), ("TransformerConfig", "nan", ()), ("TransformerConfig", "negative", ()),
    ("TransformerConfig", "out-of-range", ()), ("TransformerConfig", "nan", ()), ("TransformerConfig", "zero", ()),
    ("TransformerConfig", "out-of-range", ("d_model",)), ("TransformerConfig", "out-of-range", ("d_model",)),
    ("TransformerConfig", "out-of-range", ()), ("TinyEncoder", "out-of-range", ()),
    ("TransformerConfig", "wrong-type", ()), ("TransformerConfig", "out-of-range", ()),
    ("TinyGPT", "wrong-type", ()), ("RMSNorm", "zero", ()), ("RMSNorm", "negative", ()),
    ("TinyGPT", "out-of-range", ()), ("TinyGPT", "out-of-range", ()), ("TinyEncoder", "out-of-range", ()),
    ("TinyGPT", "wrong-dtype", ()), ("TinyGPT", "wrong-shape", ()), ("TinyGPT", "empty", ()),
    ("TinyGPT", "wrong-shape", ()), ("TinyGPT", "wrong-dtype", ()), ("TinyGPT", "wrong-shape", ()),
    ("TinyGPT", "wrong-shape", ()), ("TinyGPT", "wrong-dtype", ()), ("TinyGPT", "wrong-shape", ()),
    None,
    ("TinyGPT", "negative", ()), ("TinyGPT", "non-integer", ()), ("TinyGPT", "nan", ()),
    ("TinyGPT", "negative", ()), ("TinyGPT", "nan", ()), ("TinyGPT", "zero", ()), ("TinyGPT", "non-integer", ()),
    ("TinyGPT", "out-of-range", ()), ("TinyGPT", "empty", ()), ("TinyGPT", "zero", ()),
    ("TinySeq2Seq", "zero", ()), ("TinySeq2Seq", "out-of-range", ()), ("TinySeq2Seq", "out-of-range", ()),
    ("TinySeq2Seq", "wrong-shape", ("tgt",)), ("TinySeq2Seq", "out-of-range", ()),
    ("TinySeq2Seq", "wrong-type", ()),
    ("drophead_mask", "nan", ()), ("drophead_mask", "zero", ()), ("drophead_mask", "negative", ()),
    ("head_importance", "empty", ()), ("induction_scores", "zero", ()), ("induction_scores", "wrong-shape", ()),
]  # fmt: skip
assert len(_TABLE) == len(BAD_MODEL_INPUTS), "test_models.BAD_MODEL_INPUTS changed: update _TABLE"


def _loss(model, head_mask):
    return torch.tensor(0.0)


ROWS = [
    Bad(entry[0], entry[1], call, tuple(fragments) + entry[2], error)
    for entry, (call, error, fragments) in zip(_TABLE, BAD_MODEL_INPUTS)
    if entry is not None
] + [
    Bad("TransformerConfig", "boolean", lambda: TransformerConfig(n_heads=True), ("TransformerConfig", "n_heads")),
    Bad("Attention", "wrong-type", lambda: M.Attention({}, is_causal=True), ("Attention", "config")),
    Bad("Attention", "wrong-shape", lambda: M.Attention(_CFG, is_causal=True)(_X[..., :7]), ("Attention", "x")),
    Bad("Attention", "integer-dtype", lambda: M.Attention(_CFG, is_causal=True)(_X.long()), ("Attention", "x")),
    Bad("Attention", "wrong-shape", lambda: M.Attention(_CFG, is_causal=True)(_X, head_mask=torch.ones(3)),
        ("Attention", "head_mask")),
    Edge("Attention", "empty", lambda: M.Attention(_CFG, is_causal=True)(_X[:0]), lambda y: y.shape == (0, 5, 16)),
    Bad("LatentAttention", "wrong-type", lambda: M.LatentAttention(None, is_causal=True),
        ("LatentAttention", "config")),
    Bad("LatentAttention", "wrong-shape", lambda: M.LatentAttention(_MLA, is_causal=True)(_X[..., :7]),
        ("MultiHeadLatentAttention.forward", "x")),
    Bad("LatentAttention", "integer-dtype", lambda: M.LatentAttention(_MLA, is_causal=True)(_X.long()),
        ("MultiHeadLatentAttention.forward", "x")),
    Bad("RMSNorm", "wrong-shape", lambda: M.RMSNorm(16)(_X[..., :7]), ("RMSNorm.forward", "x", "dim=16")),
    Bad("RMSNorm", "integer-dtype", lambda: M.RMSNorm(16)(_X.long()), ("RMSNorm.forward", "x")),
    Bad("MLP", "wrong-type", lambda: M.MLP("gelu"), ("MLP", "config")),
    Bad("MLP", "wrong-shape", lambda: M.MLP(_CFG)(_X[..., :7]), ("MLP.forward", "x", "d_model=16")),
    Bad("MLP", "integer-dtype", lambda: M.MLP(_CFG)(_X.long()), ("MLP.forward", "x")),
    Bad("Block", "wrong-type", lambda: M.Block({}, is_causal=True), ("Block", "config")),
    Bad("Block", "wrong-shape", lambda: M.Block(_CFG, is_causal=True)(_X[..., :7]), ("Block.forward", "x")),
    Bad("Block", "integer-dtype", lambda: M.Block(_CFG, is_causal=True)(_X.long()), ("Block.forward", "x")),
    Bad("DecoderBlock", "wrong-type", lambda: M.DecoderBlock([]), ("DecoderBlock", "config")),
    Bad("DecoderBlock", "wrong-shape",
        lambda: M.DecoderBlock(_CFG)(_X, _X, torch.ones(2, 1, 1, 4, dtype=torch.bool)),
        ("DecoderBlock.forward", "memory_mask")),
    Bad("head_ablation", "wrong-type", lambda: M.head_ablation(torch.nn.Linear(2, 2), _loss), ("head_ablation", "model")),
    Bad("head_ablation", "wrong-type", lambda: M.head_ablation(M.TinyGPT(_CFG), "loss"), ("head_ablation", "loss_fn")),
    Bad("drophead_mask", "boolean", lambda: M.drophead_mask(True, 4, 0.1, 3), ("drophead_mask", "n_layers")),
    Bad("induction_scores", "non-integer", lambda: M.induction_scores(torch.rand(1, 1, 2, 6, 6), 2.5),
        ("induction_scores", "period")),
    # generate's key_padding_mask (left padding only) and compile, make_cache's static
    Bad("TinyGPT", "wrong-dtype", lambda: M.TinyGPT(_CFG).generate(_IDS, 2, key_padding_mask=_PAD.int()),
        ("TinyGPT.generate", "key_padding_mask", "bool")),
    Bad("TinyGPT", "wrong-shape", lambda: M.TinyGPT(_CFG).generate(_IDS, 2, key_padding_mask=_PAD[:, 1:]),
        ("TinyGPT.generate", "key_padding_mask", "(2, 5)")),
    Bad("TinyGPT", "out-of-range", lambda: M.TinyGPT(_CFG).generate(_IDS, 2, key_padding_mask=_PAD.flip(-1)),
        ("TinyGPT.generate", "key_padding_mask", "left padding")),
    Bad("TinyGPT", "out-of-range", lambda: M.TinyGPT(_CFG).generate(_IDS, 2, key_padding_mask=_PAD | True),
        ("TinyGPT.generate", "key_padding_mask", "real last token")),
    Bad("TinyGPT", "wrong-type", lambda: M.TinyGPT(_CFG).generate(_IDS, 2, compile="yes"),
        ("TinyGPT.generate", "compile")),
    Bad("TinyGPT", "out-of-range", lambda: M.TinyGPT(_CFG).generate(_IDS, 2, use_cache=False, compile=True),
        ("TinyGPT.generate", "compile=True", "use_cache=False")),
    Bad("TinyGPT", "out-of-range", lambda: M.TinyGPT(_MLA).generate(_IDS, 2, compile=True),
        ("TinyGPT.generate", "compile=True", "'mla'")),
    Bad("TinyGPT", "wrong-type", lambda: M.TinyGPT(_CFG).make_cache(2, 4, static="yes"),
        ("TinyGPT.make_cache", "static")),
]  # fmt: skip

EXEMPT = {"POSITIONAL_SCHEMES": "a constant: the names of the positional schemes"}
