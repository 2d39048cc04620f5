"""Plausible wrong answers to the exercises of the chapter that looks inside attention: each
fails its check with a message that points at the mistake."""

import torch
from wrong_answers import Mistake, mistake_test


# inside-attention-future-mass: the book's solution with one thing changed
def _mass(diagonal=1, past=False, reduce="mean"):
    def future_mass(weights):
        n = weights.shape[-1]
        ones = torch.ones(n, n, dtype=torch.bool)
        keys = ones.tril(-1) if past else ones.triu(diagonal)
        per_row = (weights * keys).sum(-1)
        return per_row.mean(dim=(0, 2)) if reduce == "mean" else per_row.sum(dim=(0, 2))
    return future_mass


def _mass_averaged_over_heads_too(weights):
    n = weights.shape[-1]
    return (weights * torch.ones(n, n).triu(1)).sum(-1).mean()


# inside-attention-entropy
def _entropy(normalize="allowed", guard_zero=True, base_e=True):
    def normalized_entropy(weights, mask):
        mask = mask.expand(weights.shape)
        if guard_zero:
            plogp = torch.where(weights > 0, weights * weights.clamp_min(1e-30).log(), 0.0)
        else:
            plogp = weights * weights.log()
        entropy = -(plogp * mask).sum(-1)
        if not base_e:
            entropy = entropy / torch.log(torch.tensor(2.0))
        if normalize is None:
            return entropy
        n = mask.sum(-1).to(weights.dtype) if normalize == "allowed" else torch.full_like(
            entropy, weights.shape[-1])
        return torch.where(n > 1, entropy / n.clamp_min(2).log(), 0.0)
    return normalized_entropy


MISTAKES = [
    Mistake("inside-attention-future-mass", "the diagonal counted as future", _mass(diagonal=0),
            ("values differ", "you counted the diagonal")),
    Mistake("inside-attention-future-mass", "the past instead of the future", _mass(past=True),
            ("values differ", "keys before the query")),
    Mistake("inside-attention-future-mass", "summed, not averaged", _mass(reduce="sum"),
            ("values differ", "instead of averaging")),
    Mistake("inside-attention-future-mass", "one number for all heads", _mass_averaged_over_heads_too,
            ("expected shape", "one number per head")),
    Mistake("inside-attention-entropy", "not normalized", _entropy(normalize=None),
            ("values differ", "did not divide by ln of the number of allowed keys")),
    Mistake("inside-attention-entropy", "divided by ln S for every row", _entropy(normalize="all"),
            ("a causal mask, float32", "divided by ln S for every row")),
    Mistake("inside-attention-entropy", "0 * log(0) gives NaN", _entropy(guard_zero=False),
            ("NaN in your result", "0 ln 0")),
    Mistake("inside-attention-entropy", "entropy in bits", _entropy(normalize=None, base_e=False),
            ("values differ", "in bits")),
]

test_wrong_answers = mistake_test(MISTAKES)
