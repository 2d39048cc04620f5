"""Attention in recurrent encoder-decoders: Bahdanau, Luong (global and local),
coverage, location-aware attention, decoding.

Papers: Bahdanau, Cho & Bengio (2015) for additive attention over a bidirectional RNN
encoder; Luong, Pham & Manning (2015) for the dot / general / concat scores, input
feeding and local attention (local-m, local-p); Tu et al. (2016) and See, Liu & Manning
(2017) for coverage; Chorowski et al. (2015) for location-aware attention in speech
recognition.

Shapes in this module are per decoder step: a query is ``(B, Dq)`` (one decoder state
per example), the keys are the encoder states ``(B, S, Dk)``, and the keyword-only
``key_padding_mask`` is ``(B, S)`` bool, True where a source position is padding to
ignore (the convention of ``torch.nn.MultiheadAttention``). Every attention module
returns ``(context (B, Dk), weights (B, S))``; padded positions get exactly zero weight
(the scores go through :func:`attnbook.core.masked_softmax`). :class:`Seq2Seq` takes a
batch's ``src_mask`` (True = real token, as :meth:`attnbook.data.Task.encode` makes it)
and hands ``~src_mask`` to its attention.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .core import (
    additive_score,
    dot_score,
    general_score,
    hard_attention_weights,
    masked_softmax,
)
from .data import BOS, EOS, PAD, RepeatedSegments, Task
from .utils import single_thread

__all__ = [
    "BahdanauAttention",
    "LuongAttention",
    "LocalAttention",
    "coverage_loss",
    "accumulated_coverage",
    "repeated_attention",
    "LocationAwareAttention",
    "weight_on_target",
    "train_aligner",
    "Decoded",
    "Seq2Seq",
    "sequence_loss",
    "train_seq2seq",
    "exact_match",
    "input_gradient_norms",
    "gradient_vs_distance",
]


def _check_step_inputs(
    query: torch.Tensor,
    keys: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    dq: int,
    dk: int,
) -> None:
    if query.dim() != 2 or query.shape[1] != dq:
        raise ValueError(
            f"query must have shape (B, Dq={dq}), got {tuple(query.shape)}"
        )
    if keys.dim() != 3 or keys.shape[0] != query.shape[0] or keys.shape[2] != dk:
        raise ValueError(
            f"keys must have shape (B={query.shape[0]}, S, Dk={dk}), got "
            f"{tuple(keys.shape)}"
        )
    kpm = key_padding_mask
    if kpm is not None and (kpm.dtype != torch.bool or kpm.shape != keys.shape[:2]):
        raise ValueError(
            "key_padding_mask must be a bool tensor (True = padding) of shape (B, S) = "
            f"{tuple(keys.shape[:2])}, got {kpm.dtype} {tuple(kpm.shape)}"
        )


def _attend(
    scores: torch.Tensor, keys: torch.Tensor, key_padding_mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``weights = masked_softmax(scores)`` over ``S`` (padding left out), ``context =
    sum_j weights_j keys_j``."""
    keep = None if key_padding_mask is None else ~key_padding_mask.unsqueeze(1)
    weights = masked_softmax(scores.unsqueeze(1), attn_mask=keep).squeeze(1)
    return (weights.unsqueeze(1) @ keys).squeeze(1), weights


# --------------------------------------------------------------------------------------
# Bahdanau (additive) attention, optionally with coverage
# --------------------------------------------------------------------------------------
class BahdanauAttention(nn.Module):
    r"""Additive attention :math:`e_j = v^\top \tanh(W s_{t-1} + U h_j + w_c c_j)`.

    ``W``: ``(H, Dq)``, ``U``: ``(H, Dk)``, ``v``: ``(H,)``; with ``coverage=True`` a
    vector ``w_c`` of shape ``(H,)`` feeds the coverage :math:`c_j = \sum_{t' < t}
    \alpha_{t' j}` (how much attention source position ``j`` has received so far) into
    the score (Tu et al., 2016; See et al., 2017). Without coverage this is
    :func:`attnbook.core.additive_score` (the tests check it); it is written out here so
    that ``U h_j`` is computed once per sentence, not once per output step.
    """

    def __init__(
        self, query_dim: int, key_dim: int, hidden_dim: int, *, coverage: bool = False
    ):
        super().__init__()
        self.query_dim, self.key_dim, self.coverage = query_dim, key_dim, coverage
        self.W = nn.Linear(query_dim, hidden_dim, bias=False)
        self.U = nn.Linear(key_dim, hidden_dim, bias=False)
        self.v = nn.Parameter(
            torch.empty(hidden_dim).uniform_(
                -1 / math.sqrt(hidden_dim), 1 / math.sqrt(hidden_dim)
            )
        )
        self.w_c = nn.Parameter(torch.zeros(hidden_dim)) if coverage else None

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """``U h_j`` for every source position, ``(B, S, H)``: it does not depend on the
        decoder step, so a decoder computes it once per sentence instead of once per
        output step."""
        return self.U(keys)

    def scores(
        self,
        query: torch.Tensor,
        keys_proj: torch.Tensor,
        coverage: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Alignment scores ``(B, S)`` before the softmax, from ``keys_proj =
        project_keys(keys)``."""
        hidden = self.W(query).unsqueeze(1) + keys_proj  # (B, S, H)
        if self.coverage:
            if coverage is not None:
                hidden = hidden + coverage.unsqueeze(-1) * self.w_c
        elif coverage is not None:
            raise ValueError(
                "coverage was given to a BahdanauAttention built with coverage=False"
            )
        return torch.tanh(hidden) @ self.v

    def forward(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        *,
        key_padding_mask: torch.Tensor | None = None,
        coverage: torch.Tensor | None = None,
        keys_proj: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``query`` ``(B, Dq)`` (the previous decoder state), ``keys`` ``(B, S, Dk)``,
        ``key_padding_mask`` ``(B, S)`` bool (True = padding, gets zero weight),
        ``coverage`` ``(B, S)``.

        ``keys_proj``: ``project_keys(keys)`` when the caller has it already. Returns
        ``(context (B, Dk), weights (B, S))``.
        """
        _check_step_inputs(query, keys, key_padding_mask, self.query_dim, self.key_dim)
        if coverage is not None and coverage.shape != keys.shape[:2]:
            raise ValueError(
                f"coverage must have shape (B, S) = {tuple(keys.shape[:2])}, got "
                f"{tuple(coverage.shape)}"
            )
        keys_proj = self.project_keys(keys) if keys_proj is None else keys_proj
        return _attend(self.scores(query, keys_proj, coverage), keys, key_padding_mask)


# --------------------------------------------------------------------------------------
# Luong (global) attention: dot, general, concat
# --------------------------------------------------------------------------------------
class LuongAttention(nn.Module):
    r"""Luong's global attention on the *current* decoder state :math:`h_t`.

    * ``"dot"``: :math:`e_s = h_t^\top \bar h_s` (needs ``Dq == Dk``; no parameters);
    * ``"general"``: :math:`e_s = h_t^\top W_a \bar h_s`, ``W_a`` of shape ``(Dq, Dk)``;
    * ``"concat"``: :math:`e_s = v_a^\top \tanh(W_a [h_t; \bar h_s])`, ``W_a`` of shape
      ``(H, Dq + Dk)``, which is Bahdanau's additive score with ``W_a = [W, U]`` split
      by columns.
    """

    METHODS = ("dot", "general", "concat")

    def __init__(
        self,
        query_dim: int,
        key_dim: int,
        *,
        method: str = "general",
        hidden_dim: int | None = None,
    ):
        super().__init__()
        if method not in self.METHODS:
            raise ValueError(f"method must be one of {self.METHODS}, got {method!r}")
        if method == "dot" and query_dim != key_dim:
            raise ValueError(
                f"the dot score needs query_dim == key_dim, got {query_dim} and "
                f"{key_dim}"
            )
        self.query_dim, self.key_dim, self.method = query_dim, key_dim, method
        if method == "general":
            self.W_a = nn.Parameter(
                torch.empty(query_dim, key_dim).uniform_(
                    -1 / math.sqrt(key_dim), 1 / math.sqrt(key_dim)
                )
            )
        elif method == "concat":
            hidden_dim = hidden_dim or query_dim
            self.W_a = nn.Linear(query_dim + key_dim, hidden_dim, bias=False)
            self.v_a = nn.Parameter(
                torch.empty(hidden_dim).uniform_(
                    -1 / math.sqrt(hidden_dim), 1 / math.sqrt(hidden_dim)
                )
            )

    def scores(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Alignment scores ``(B, S)`` before the softmax."""
        q = query.unsqueeze(1)
        if self.method == "dot":
            return dot_score(q, keys).squeeze(1)
        if self.method == "general":
            return general_score(q, keys, self.W_a).squeeze(1)
        W_q, W_k = self.W_a.weight.split([self.query_dim, self.key_dim], dim=1)
        return additive_score(q, keys, W_q, W_k, self.v_a).squeeze(1)

    def forward(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        *,
        key_padding_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``query`` ``(B, Dq)``, ``keys`` ``(B, S, Dk)``, ``key_padding_mask`` ``(B,
        S)`` bool (True = padding) -> ``(context (B, Dk), weights (B, S))``."""
        _check_step_inputs(query, keys, key_padding_mask, self.query_dim, self.key_dim)
        return _attend(self.scores(query, keys), keys, key_padding_mask)


# --------------------------------------------------------------------------------------
# Luong's local attention: local-m and local-p
# --------------------------------------------------------------------------------------
class LocalAttention(nn.Module):
    r"""Local attention (Luong et al., 2015): attend to a window ``[p_t - D, p_t + D]``
    only.

    * ``"local-m"`` (monotonic): the centre is the decoder step, :math:`p_t = t`;
    * ``"local-p"`` (predictive): :math:`p_t = S \cdot \sigma(v_p^\top \tanh(W_p h_t))`,
      where ``S`` is the true length of each source sentence, so :math:`p_t \in [0, S]`.

    Inside the window the weights are the softmax of the ``general`` score, multiplied
    by a Gaussian centred at the real-valued :math:`p_t` with :math:`\sigma = D / 2`:
    :math:`a_t(s) = \mathrm{align}(h_t, \bar h_s) \exp\!\big(-(s - p_t)^2 /
    (2\sigma^2)\big)`. The window cut is not differentiable in :math:`p_t`, the Gaussian
    is: that is how local-p learns where to look. Like in the paper, the weights then
    sum to less than 1.
    """

    MODES = ("local-m", "local-p")

    def __init__(
        self,
        query_dim: int,
        key_dim: int,
        *,
        window: int = 2,
        mode: str = "local-p",
        hidden_dim: int | None = None,
    ):
        super().__init__()
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}, got {mode!r}")
        if window < 1:
            raise ValueError(f"window D must be >= 1, got {window}")
        self.query_dim, self.key_dim, self.window, self.mode = (
            query_dim,
            key_dim,
            window,
            mode,
        )
        self.score = LuongAttention(query_dim, key_dim, method="general")
        if mode == "local-p":
            self.W_p = nn.Linear(query_dim, hidden_dim or query_dim, bias=False)
            self.v_p = nn.Linear(hidden_dim or query_dim, 1, bias=False)

    def centre(
        self, query: torch.Tensor, lengths: torch.Tensor, *, step: int | None = None
    ) -> torch.Tensor:
        """The aligned source position :math:`p_t`, shape ``(B,)``; ``lengths`` ``(B,)``
        are the source lengths."""
        if self.mode == "local-m":
            if step is None:
                raise ValueError("local-m attention needs the decoder step (step=t)")
            return torch.full(
                (query.shape[0],), float(step), dtype=query.dtype, device=query.device
            )
        return lengths.to(query.dtype) * torch.sigmoid(
            self.v_p(torch.tanh(self.W_p(query)))
        ).squeeze(-1)

    def forward(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        *,
        key_padding_mask: torch.Tensor | None = None,
        step: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``query`` ``(B, Dq)``, ``keys`` ``(B, S, Dk)``, ``key_padding_mask`` ``(B,
        S)`` bool (True = padding), ``step``: decoder step ``t`` (local-m).

        Returns ``(context (B, Dk), weights (B, S))``; weights are zero outside the
        window and on padding.
        """
        _check_step_inputs(query, keys, key_padding_mask, self.query_dim, self.key_dim)
        B, S = keys.shape[:2]
        real = (
            torch.ones(B, S, dtype=torch.bool, device=keys.device)
            if key_padding_mask is None
            else ~key_padding_mask
        )
        p = self.centre(query, real.sum(-1), step=step).unsqueeze(1)  # (B, 1)
        # (1, S)
        positions = torch.arange(S, device=keys.device, dtype=query.dtype).unsqueeze(0)
        in_window = (positions - p).abs() <= self.window
        sigma = self.window / 2
        align = masked_softmax(
            self.score.scores(query, keys).unsqueeze(1),
            attn_mask=(real & in_window).unsqueeze(1),
        ).squeeze(1)
        weights = align * torch.exp(-((positions - p) ** 2) / (2 * sigma**2))
        return (weights.unsqueeze(1) @ keys).squeeze(1), weights


# --------------------------------------------------------------------------------------
# Coverage
# --------------------------------------------------------------------------------------
def coverage_loss(weights: torch.Tensor, coverage: torch.Tensor) -> torch.Tensor:
    r"""See et al. (2017): :math:`\mathrm{covloss}_t = \sum_i \min(a_i^t, c_i^t)`,
    summed over the last dim.

    ``weights`` and ``coverage`` have the same shape ``(..., S)``; returns ``(...)``. It
    is zero when the step attends only to positions nobody attended before, and at most
    1 (the weights sum to 1).
    """
    if weights.shape != coverage.shape:
        raise ValueError(
            f"weights {tuple(weights.shape)} and coverage {tuple(coverage.shape)} "
            "must have the same shape"
        )
    return torch.minimum(weights, coverage).sum(-1)


def accumulated_coverage(weights: torch.Tensor) -> torch.Tensor:
    r"""Coverage before each step, :math:`c^t = \sum_{t' < t} a^{t'}`: ``(B, T, S)`` ->
    ``(B, T, S)``, zero at ``t = 0``."""
    if weights.dim() != 3:
        raise ValueError(
            f"weights must have shape (B, T, S), got {tuple(weights.shape)}"
        )
    return weights.cumsum(1) - weights


def repeated_attention(
    weights: torch.Tensor, tgt_mask: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Attention given to a source position beyond one unit, :math:`\sum_s \max(0,
    \sum_t a_{ts} - 1)`, per example.

    ``weights``: ``(B, T, S)``; ``tgt_mask``: ``(B, T)`` bool, the output steps to
    count. A model that attends to each source token once scores 0; one that keeps
    re-reading the same token scores high.
    """
    if tgt_mask is not None:
        weights = weights * tgt_mask.unsqueeze(-1)
    return torch.relu(weights.sum(1) - 1).sum(-1)


# --------------------------------------------------------------------------------------
# Location-aware attention (speech)
# --------------------------------------------------------------------------------------
class LocationAwareAttention(nn.Module):
    r"""Location-aware attention (Chorowski et al., 2015): the score also sees where the
    previous step attended.

    .. math::

        f_i = F * \alpha_{i-1}, \qquad
        e_{ij} = w^\top \tanh(W s_{i-1} + V h_j + U f_{ij} + b), \qquad
        \alpha_i = \operatorname{softmax}_j(e_{ij})

    ``F`` is a 1-D convolution with ``n_filters`` filters of odd width ``kernel_size``
    (zero padding, so ``f_i`` has one ``n_filters``-vector per frame ``j``): ``f_{ij}``
    describes the previous alignment around frame ``j``. ``W``: ``(H, Dq)``, ``V``:
    ``(H, Dk)``, ``U``: ``(H, n_filters)``, ``w`` and ``b``: ``(H,)``. With ``U = 0``
    (or ``location=False``, which has no ``U`` and no ``F``) it is the content-only
    additive score of :class:`BahdanauAttention` plus a bias ``b``. Identical frames get
    identical content scores whatever the parameters; ``U f_{ij}`` differs between them,
    which is what lets the alignment pick the copy just after the previous one.
    """

    def __init__(
        self,
        query_dim: int,
        key_dim: int,
        hidden_dim: int,
        *,
        n_filters: int = 4,
        kernel_size: int = 15,
        location: bool = True,
    ):
        super().__init__()
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd and >= 1, got {kernel_size}")
        self.query_dim, self.key_dim, self.location = query_dim, key_dim, location
        self.W = nn.Linear(query_dim, hidden_dim, bias=False)
        self.V = nn.Linear(key_dim, hidden_dim, bias=False)
        if location:
            self.F = nn.Conv1d(
                1, n_filters, kernel_size, padding=kernel_size // 2, bias=False
            )
            self.U = nn.Linear(n_filters, hidden_dim, bias=False)
        self.b = nn.Parameter(torch.zeros(hidden_dim))
        bound = 1 / math.sqrt(hidden_dim)
        self.w = nn.Parameter(torch.empty(hidden_dim).uniform_(-bound, bound))

    def scores(
        self,
        query: torch.Tensor,
        keys_proj: torch.Tensor,
        prev_weights: torch.Tensor,
    ) -> torch.Tensor:
        """Scores ``(B, S)`` from ``query`` ``(B, Dq)``, ``keys_proj = V(keys)`` ``(B,
        S, H)`` and the previous alignment ``(B, S)``."""
        hidden = self.W(query).unsqueeze(1) + keys_proj + self.b  # (B, S, H)
        if self.location:
            f = self.F(prev_weights.unsqueeze(1)).transpose(1, 2)  # (B, S, n_filters)
            hidden = hidden + self.U(f)
        return torch.tanh(hidden) @ self.w

    def forward(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        *,
        key_padding_mask: torch.Tensor | None = None,
        prev_weights: torch.Tensor | None = None,
        keys_proj: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""``query`` ``(B, Dq)``, ``keys`` ``(B, S, Dk)``, ``key_padding_mask`` ``(B,
        S)`` bool (True = padding), ``prev_weights`` :math:`\alpha_{i-1}` ``(B, S)``;
        ``None`` means the alignment starts on the first frame (a one-hot on frame 0).
        Returns ``(context (B, Dk), weights (B, S))``."""
        _check_step_inputs(query, keys, key_padding_mask, self.query_dim, self.key_dim)
        if prev_weights is None:
            prev_weights = torch.zeros_like(keys[..., 0])
            prev_weights[:, 0] = 1.0
        elif prev_weights.shape != keys.shape[:2]:
            raise ValueError(
                f"prev_weights must have shape (B, S) = {tuple(keys.shape[:2])}, got "
                f"{tuple(prev_weights.shape)}"
            )
        keys_proj = self.V(keys) if keys_proj is None else keys_proj
        scores = self.scores(query, keys_proj, prev_weights)
        return _attend(scores, keys, key_padding_mask)

    def align(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        *,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the alignment through ``T`` steps, each fed its own previous weights:
        ``queries`` ``(B, T, Dq)`` -> weights ``(B, T, S)``. Step 0 starts from the
        first frame; ``key_padding_mask`` ``(B, S)`` is True on padded frames."""
        keys_proj, prev, steps = self.V(keys), None, []
        for t in range(queries.shape[1]):
            _, prev = self(
                queries[:, t],
                keys,
                key_padding_mask=key_padding_mask,
                prev_weights=prev,
                keys_proj=keys_proj,
            )
            steps.append(prev)
        return torch.stack(steps, 1)


def weight_on_target(weights: torch.Tensor, alignment: torch.Tensor) -> torch.Tensor:
    """Mean attention weight on the right frames: ``weights`` and ``alignment`` ``(B, T,
    S)`` -> scalar in ``[0, 1]`` (1 = every step reads only its own segment)."""
    return (weights * alignment).sum(-1).mean()


def train_aligner(
    attention: LocationAwareAttention,
    task: RepeatedSegments,
    *,
    steps: int = 100,
    batch_size: int = 32,
    lr: float = 1e-2,
    generator: torch.Generator | None = None,
) -> list[float]:
    """Train an alignment with Adam. As in a speech recognizer, every step is fed the
    model's *own* previous weights (:meth:`LocationAwareAttention.align`); the loss is
    ``-log`` of the weight step ``t`` puts on the frames of segment ``t``, averaged
    over the steps. The order of the examples is drawn from ``generator``. Returns the
    loss of every update."""
    order = torch.randperm(len(task.frames), generator=generator)
    optimizer = torch.optim.Adam(attention.parameters(), lr=lr)
    losses = []
    with single_thread():
        for step in range(steps):
            i = order[(step * batch_size + torch.arange(batch_size)) % len(order)]
            w = attention.align(
                task.queries[i], task.frames[i], key_padding_mask=~task.mask[i]
            )
            on_target = (w * task.alignment[i]).sum(-1)
            loss = -on_target.clamp_min(1e-9).log().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses


# --------------------------------------------------------------------------------------
# The encoder-decoder
# --------------------------------------------------------------------------------------
class Decoded(NamedTuple):
    """``logits`` ``(B, T, V)``; ``weights`` and ``coverage`` ``(B, T, S)`` (zeros
    without attention)."""

    logits: torch.Tensor
    weights: torch.Tensor
    coverage: torch.Tensor


def _never_special(logits: torch.Tensor) -> torch.Tensor:
    """At inference a decoder may emit any token but ``PAD`` and ``BOS``."""
    return logits.index_fill(
        -1, torch.tensor([PAD, BOS], device=logits.device), float("-inf")
    )


class Seq2Seq(nn.Module):
    """A GRU encoder-decoder with attention, in the style of Bahdanau et al. and Luong
    et al.

    * Encoder: embedding + bidirectional GRU; the annotation of token ``j`` is
      ``h_j = [h_j^fwd; h_j^bwd]`` of size ``2 * hidden``. The decoder starts from
      ``s_0 = tanh(W_init [h_S^fwd; h_1^bwd])``.
    * ``attention="bahdanau"``: the query is the *previous* state ``s_{t-1}``; the
      context ``c_t`` enters the GRU, ``s_t = GRU([E y_{t-1}; c_t], s_{t-1})``, and the
      readout ``tanh(W_o [s_t; c_t; E y_{t-1}])`` predicts ``y_t``. ``coverage=True``
      adds coverage.
    * ``attention in {"dot", "general", "concat", "local-m", "local-p"}`` (Luong): first
      ``s_t = GRU([E y_{t-1}; ~h_{t-1}], s_{t-1})`` (input feeding; without it the GRU
      sees ``E y_{t-1}`` only), then ``c_t`` from the *current* ``s_t``, ``~h_t =
      tanh(W_c [c_t; s_t])`` predicts ``y_t``. ``"dot"`` projects ``s_t`` to ``2 *
      hidden`` first.
    * ``attention="none"``: the baseline with the same encoder and decoder sizes, where
      the context is the fixed vector ``[h_S^fwd; h_1^bwd]`` at every step: the
      bottleneck.
    """

    ATTENTIONS = ("none", "bahdanau", "dot", "general", "concat", "local-m", "local-p")

    def __init__(
        self,
        src_vocab: int,
        tgt_vocab: int,
        *,
        attention: str = "bahdanau",
        emb_dim: int = 32,
        hidden: int = 64,
        input_feeding: bool = True,
        coverage: bool = False,
        coverage_weight: float = 1.0,
        window: int = 2,
    ):
        super().__init__()
        if attention not in self.ATTENTIONS:
            raise ValueError(
                f"attention must be one of {self.ATTENTIONS}, got {attention!r}"
            )
        if coverage and attention != "bahdanau":
            raise ValueError("coverage is implemented for attention='bahdanau' only")
        self.attention, self.hidden, self.input_feeding = (
            attention,
            hidden,
            input_feeding,
        )
        self.coverage, self.coverage_weight = coverage, coverage_weight
        self.luong = attention not in ("none", "bahdanau")
        # decode with one-hot (argmax) attention instead of the soft weights
        self.hard = False
        d_ctx = 2 * hidden
        self.src_emb = nn.Embedding(src_vocab, emb_dim, padding_idx=PAD)
        self.tgt_emb = nn.Embedding(tgt_vocab, emb_dim, padding_idx=PAD)
        self.encoder = nn.GRU(emb_dim, hidden, batch_first=True, bidirectional=True)
        self.init = nn.Linear(d_ctx, hidden)
        if self.luong:
            self.cell = nn.GRUCell(emb_dim + (hidden if input_feeding else 0), hidden)
            self.query_proj = (
                nn.Linear(hidden, d_ctx, bias=False) if attention == "dot" else None
            )
            q_dim = d_ctx if attention == "dot" else hidden
            if attention.startswith("local"):
                self.attn = LocalAttention(q_dim, d_ctx, window=window, mode=attention)
            else:
                self.attn = LuongAttention(
                    q_dim, d_ctx, method=attention, hidden_dim=hidden
                )
            self.combine = nn.Linear(d_ctx + hidden, hidden)
        else:
            self.cell = nn.GRUCell(emb_dim + d_ctx, hidden)
            self.attn = (
                BahdanauAttention(hidden, d_ctx, hidden, coverage=coverage)
                if attention == "bahdanau"
                else None
            )
            self.combine = nn.Linear(hidden + d_ctx + emb_dim, hidden)
        self.out = nn.Linear(hidden, tgt_vocab)

    # -- encoder
    # ---------------------------------------------------------------------------
    def encode(
        self,
        src: torch.Tensor,
        src_mask: torch.Tensor,
        *,
        embedded: torch.Tensor | None = None,
    ):
        """``src`` ``(B, S)``, ``src_mask`` ``(B, S)`` (True = real token) ->
        annotations ``(B, S, 2 * hidden)``, fixed summary ``(B, 2 * hidden)``.

        ``embedded`` replaces ``src_emb(src)`` (used to take gradients with respect to
        the inputs).
        """
        x = self.src_emb(src) if embedded is None else embedded
        lengths = src_mask.sum(-1).cpu()
        if (lengths == 0).any():
            raise ValueError("every source sequence needs at least one token")
        packed = pack_padded_sequence(
            x, lengths, batch_first=True, enforce_sorted=False
        )
        out, last = self.encoder(packed)
        memory, _ = pad_packed_sequence(
            out, batch_first=True, total_length=src.shape[1]
        )
        # last: (2 directions, B, hidden)
        return memory, torch.cat([last[0], last[1]], dim=-1)

    # -- one decoder step
    # ------------------------------------------------------------------
    def _initial_state(
        self, memory: torch.Tensor, summary: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """The decoder state: everything per example that a step reads or updates (beam
        search reorders its rows). ``keys_proj`` and ``summary`` are per-sentence
        constants."""
        B, S = memory.shape[:2]
        state = {
            "s": torch.tanh(self.init(summary)),
            "feed": memory.new_zeros(B, self.hidden),
            "coverage": memory.new_zeros(B, S),
            "summary": summary,
        }
        if self.attention == "bahdanau":
            state["keys_proj"] = self.attn.project_keys(memory)
        return state

    def _attend(self, query, memory, src_mask, state, t):
        padding = ~src_mask  # the attention modules take True = padding
        if self.attention == "bahdanau":
            ctx, w = self.attn(
                query,
                memory,
                key_padding_mask=padding,
                coverage=state["coverage"] if self.coverage else None,
                keys_proj=state["keys_proj"],
            )
        elif self.attention.startswith("local"):
            ctx, w = self.attn(query, memory, key_padding_mask=padding, step=t)
        else:
            ctx, w = self.attn(query, memory, key_padding_mask=padding)
        # Xu et al.'s hard attention at inference: copy the single best annotation
        if self.hard:
            w = hard_attention_weights(w, attn_mask=w > 0)
            ctx = (w.unsqueeze(1) @ memory).squeeze(1)
        return ctx, w

    def step(
        self,
        y_prev: torch.Tensor,
        state: dict[str, torch.Tensor],
        memory: torch.Tensor,
        src_mask: torch.Tensor,
        t: int,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """One output step: previous tokens ``(B,)`` -> ``(logits (B, V), weights (B,
        S), new state)``."""
        e = self.tgt_emb(y_prev)
        if self.luong:
            s = self.cell(
                torch.cat([e, state["feed"]], -1) if self.input_feeding else e,
                state["s"],
            )
            query = self.query_proj(s) if self.query_proj is not None else s
            ctx, w = self._attend(query, memory, src_mask, state, t)
            h = torch.tanh(self.combine(torch.cat([ctx, s], -1)))
        else:
            if self.attention == "bahdanau":
                ctx, w = self._attend(state["s"], memory, src_mask, state, t)
            else:
                ctx, w = state["summary"], memory.new_zeros(memory.shape[:2])
            s = self.cell(torch.cat([e, ctx], -1), state["s"])
            h = torch.tanh(self.combine(torch.cat([s, ctx, e], -1)))
        new = {**state, "s": s, "feed": h, "coverage": state["coverage"] + w}
        return self.out(h), w, new

    # -- teacher forcing
    # -------------------------------------------------------------------
    def forward(
        self,
        src: torch.Tensor,
        src_mask: torch.Tensor,
        tgt_in: torch.Tensor,
        *,
        embedded: torch.Tensor | None = None,
    ) -> Decoded:
        """Teacher forcing: ``tgt_in`` ``(B, T)`` starts with ``BOS``; step ``t`` is fed
        the true ``y_{t-1}``."""
        memory, summary = self.encode(src, src_mask, embedded=embedded)
        state = self._initial_state(memory, summary)
        logits, weights, coverage = [], [], []
        for t in range(tgt_in.shape[1]):
            coverage.append(state["coverage"])
            out, w, state = self.step(tgt_in[:, t], state, memory, src_mask, t)
            logits.append(out)
            weights.append(w)
        return Decoded(
            torch.stack(logits, 1), torch.stack(weights, 1), torch.stack(coverage, 1)
        )

    # -- inference
    # ---------------------------------------------------------------------------
    @torch.no_grad()
    def greedy_decode(
        self, src: torch.Tensor, src_mask: torch.Tensor, *, max_len: int = 20
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pick the most likely token at every step: ``(tokens (B, T'), weights (B, T',
        S))``.

        ``tokens`` holds ``y_1 ... EOS`` and then ``PAD``; ``T' <= max_len`` (it stops
        early when every sequence has produced ``EOS``).
        """
        memory, summary = self.encode(src, src_mask)
        state = self._initial_state(memory, summary)
        y = torch.full((src.shape[0],), BOS, dtype=torch.long, device=src.device)
        done = torch.zeros_like(y, dtype=torch.bool)
        tokens, weights = [], []
        for t in range(max_len):
            logits, w, state = self.step(y, state, memory, src_mask, t)
            y = _never_special(logits).argmax(-1).masked_fill(done, PAD)
            tokens.append(y)
            weights.append(w)
            done |= y == EOS
            if done.all():
                break
        return torch.stack(tokens, 1), torch.stack(weights, 1)

    @torch.no_grad()
    def beam_search(
        self,
        src: torch.Tensor,
        src_mask: torch.Tensor,
        *,
        beam_size: int = 4,
        max_len: int = 20,
    ) -> list[list[int]]:
        """Beam search, one source at a time: the highest log-probability output of each
        source.

        Keeps the ``beam_size`` best partial outputs (sum of token log-probabilities);
        an output that emits ``EOS`` is finished. Returns token ids without ``EOS``.
        With ``beam_size=1`` it is exactly :meth:`greedy_decode`. (No length
        normalization: the sums compare like with like here.)
        """
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        results = []
        for b in range(src.shape[0]):
            memory, summary = self.encode(src[b : b + 1], src_mask[b : b + 1])
            state = self._initial_state(memory, summary)
            # (tokens, log-probability) of the live hypotheses, in `state` order
            beams = [([], 0.0)]
            finished: list[tuple[list[int], float]] = []
            for t in range(max_len):
                n = len(beams)
                y = torch.tensor(
                    [toks[-1] if toks else BOS for toks, _ in beams], device=src.device
                )
                mem, mask = memory.expand(n, -1, -1), src_mask[b : b + 1].expand(n, -1)
                logits, _, state = self.step(y, state, mem, mask, t)
                total = torch.tensor([lp for _, lp in beams], device=src.device)[
                    :, None
                ] + _never_special(logits).log_softmax(-1)
                top = total.flatten().topk(min(beam_size, total.numel()))
                keep, live = [], []
                for score, index in zip(top.values.tolist(), top.indices.tolist()):
                    parent, token = divmod(index, total.shape[1])
                    hyp = (beams[parent][0] + [token], score)
                    if token == EOS:
                        finished.append((hyp[0][:-1], score))
                    else:
                        keep.append(parent)
                        live.append(hyp)
                if len(finished) >= beam_size or not live:
                    break
                index = torch.tensor(keep, device=src.device)
                state = {k: v[index] for k, v in state.items()}
                beams = live
            pool = finished or beams
            results.append(max(pool, key=lambda h: h[1])[0])
        return results


# --------------------------------------------------------------------------------------
# Training and evaluation
# --------------------------------------------------------------------------------------
def sequence_loss(model: Seq2Seq, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Token cross-entropy with teacher forcing, plus ``model.coverage_weight`` x the
    coverage loss.

    ``batch["tgt"]`` is ``BOS y_1 ... y_n EOS PAD...``: the input is ``tgt[:, :-1]``,
    the target ``tgt[:, 1:]``; padding is ignored.
    """
    tgt_in, tgt_out = batch["tgt"][:, :-1], batch["tgt"][:, 1:]
    out = model(batch["src"], batch["src_mask"], tgt_in)
    loss = nn.functional.cross_entropy(
        out.logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD
    )
    if model.coverage:
        real = (tgt_out != PAD).to(loss.dtype)
        loss = (
            loss
            + model.coverage_weight
            * (coverage_loss(out.weights, out.coverage) * real).sum()
            / real.sum()
        )
    return loss


def train_seq2seq(
    model: Seq2Seq,
    task: Task,
    *,
    epochs: int = 10,
    batch_size: int = 64,
    lr: float = 3e-3,
    generator: torch.Generator | None = None,
    progress: bool = True,
    grad_clip: float | None = 1.0,
):
    """Train ``model`` on ``task.train`` with :func:`attnbook.train.fit` (AdamW, tqdm
    bar), the batches shuffled with ``generator``; returns its History."""
    from .train import fit

    with single_thread():
        return fit(
            model,
            sequence_loss,
            task.batches(batch_size, generator=generator),
            epochs=epochs,
            lr=lr,
            progress=progress,
            grad_clip=grad_clip,
        )


@torch.no_grad()
def exact_match(
    model: Seq2Seq, task: Task, pairs=None, *, batch_size: int = 500
) -> float:
    """Fraction of ``pairs`` (default: ``task.test``) whose greedy output equals the
    target exactly."""
    pairs = task.test if pairs is None else pairs
    model.eval()
    correct = 0
    with single_thread():
        for k in range(0, len(pairs), batch_size):
            chunk = pairs[k : k + batch_size]
            batch = task.encode(chunk)
            tokens, _ = model.greedy_decode(
                batch["src"], batch["src_mask"], max_len=batch["tgt"].shape[1]
            )
            correct += sum(
                task.tgt_vocab.decode(row) == target
                for row, (_, target) in zip(tokens, chunk)
            )
    return correct / len(pairs)


def input_gradient_norms(
    model: Seq2Seq, batch: dict[str, torch.Tensor]
) -> torch.Tensor:
    r"""Mean over the batch of :math:`\lVert \partial \ell_t / \partial x_s \rVert_2`:
    shape ``(T, S)``.

    :math:`\ell_t` is the cross-entropy of output step ``t`` (teacher forcing) and
    :math:`x_s` the embedding of source token ``s``. Examples do not interact, so one
    backward pass per output step gives every example's gradient at once. Use
    equal-length sources (no padding).
    """
    model.eval()
    tgt_in, tgt_out = batch["tgt"][:, :-1], batch["tgt"][:, 1:]
    x = model.src_emb(batch["src"]).detach().requires_grad_(True)
    logits = model(batch["src"], batch["src_mask"], tgt_in, embedded=x).logits
    losses = nn.functional.cross_entropy(
        logits.transpose(1, 2), tgt_out, ignore_index=PAD, reduction="none"
    )
    rows = []
    for t in range(tgt_out.shape[1]):
        (g,) = torch.autograd.grad(
            losses[:, t].sum(), x, retain_graph=t < tgt_out.shape[1] - 1
        )
        rows.append(g.norm(dim=-1).mean(0))
    return torch.stack(rows)


def gradient_vs_distance(norms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Average a ``(T, S)`` gradient-norm matrix over output steps and group source
    positions ``s`` by their distance ``min(s, S - 1 - s)`` to the nearer end of the
    bidirectional encoder, the number of recurrent steps between ``x_s`` and the
    encoder's final states. Without attention those final states are all the decoder
    sees. Returns ``(distances, mean norms)``."""
    S = norms.shape[1]
    per_position = norms.mean(0)
    dist = torch.minimum(torch.arange(S), S - 1 - torch.arange(S))
    distances = torch.unique(dist)
    return distances, torch.stack([per_position[dist == d].mean() for d in distances])
