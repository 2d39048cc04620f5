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
(the scores go through :func:`attnbook.core.masked_softmax`), and a query with no real
key (``S = 0``, or every key padding) gets a zero context. :class:`Seq2Seq` takes a
batch's ``src_mask`` (True = real token, as :meth:`attnbook.data.Task.encode` makes it)
and hands ``~src_mask`` to its attention. Local attention, the first step of
location-aware attention and :class:`Seq2Seq` count positions from the start of a row,
so their masks must be right-padded (padding only at the end of a row); a left-padded
mask raises ``ValueError`` rather than silently reading padding.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import NamedTuple

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .contract import check_sizes as _check_sizes
from .contract import check_float, check_key_padding_mask
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


def _shape(t) -> str:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def _check_optional_size(fn: str, name: str, value) -> None:
    """``None`` (a default) or a positive integer; ``0`` is not taken for ``None``."""
    if value is not None:
        _check_sizes(fn, **{name: value})


def _check_count(fn: str, name: str, value) -> None:
    """An integer ``>= 0`` (``max_len``, ``steps``, a decoder ``step``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{fn}: {name} must be an integer >= 0, got {value!r}")


def _check_rate(fn: str, name: str, value, *, zero: bool = False) -> None:
    """A finite number ``> 0`` (``>= 0`` with ``zero=True``)."""
    ok = (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value >= 0 if zero else value > 0)
    )
    if not ok:
        bound = ">= 0" if zero else "> 0"
        raise ValueError(f"{fn}: {name} must be a finite number {bound}, got {value!r}")


def _check_right_padded(fn: str, name: str, real: torch.Tensor, convention: str):
    """Padding only at the end of each row: no real position after a padded one.

    ``real`` is True on real positions; ``convention`` says how ``name`` marks them.
    Positions are counted from the start of the row (a source length, local
    attention's window, the first frame), so a left-padded row would silently read
    padding.
    """
    late = real[:, 1:] & ~real[:, :-1]  # a real position right after a padded one
    if late.any():
        row = int(late.any(-1).nonzero()[0])
        raise ValueError(
            f"{fn}: {name} must be right-padded ({convention}, padding only at the "
            f"end of each row); row {row} is {real[row].int().tolist()} "
            "(1 = real)"
        )


def _check_step_inputs(
    fn: str,
    module: nn.Module,
    query: torch.Tensor,
    keys: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
) -> None:
    """The rules of every attention module's step: ``query`` ``(B, Dq)``, ``keys``
    ``(B, S, Dk)`` of the module's floating dtype, ``key_padding_mask`` bool ``(B, S)``
    (True = padding)."""
    check_float(fn, "query", query)
    check_float(fn, "keys", keys)
    dq, dk = module.query_dim, module.key_dim
    if query.dim() != 2 or query.shape[1] != dq:
        raise ValueError(
            f"{fn}: query must have shape (B, Dq={dq}), got {_shape(query)}"
        )
    if keys.dim() != 3 or keys.shape[0] != query.shape[0] or keys.shape[2] != dk:
        raise ValueError(
            f"{fn}: keys must have shape (B={query.shape[0]}, S, Dk={dk}), got "
            f"{_shape(keys)}"
        )
    param = next(module.parameters(), None)
    dtype = keys.dtype if param is None else param.dtype
    if not query.dtype == keys.dtype == dtype:
        raise TypeError(
            f"{fn}: query ({query.dtype}) and keys ({keys.dtype}) must have the "
            f"module's dtype {dtype}"
        )
    if key_padding_mask is not None:
        check_key_padding_mask(fn, key_padding_mask, *keys.shape[:2])


def _check_per_position(fn: str, name: str, t, keys: torch.Tensor) -> None:
    """``coverage`` / ``prev_weights``: one number per key, ``(B, S)``."""
    check_float(fn, name, t)
    if t.shape != keys.shape[:2]:
        raise ValueError(
            f"{fn}: {name} must have shape (B, S) = {tuple(keys.shape[:2])}, got "
            f"{_shape(t)}"
        )


def _check_same_shape(fn: str, **tensors) -> None:
    """Floating tensors of one shape ``(..., S)`` (at least one dimension)."""
    for name, t in tensors.items():
        check_float(fn, name, t)
    shapes = {tuple(t.shape) for t in tensors.values()}
    if len(shapes) > 1 or () in shapes:
        got = " and ".join(f"{name} {_shape(t)}" for name, t in tensors.items())
        raise ValueError(f"{fn}: {got} must have the same shape (..., S)")


def _check_keys_proj(fn: str, keys_proj, keys: torch.Tensor, hidden: int) -> None:
    check_float(fn, "keys_proj", keys_proj)
    if keys_proj.shape != (*keys.shape[:2], hidden):
        raise ValueError(
            f"{fn}: keys_proj must have shape (B, S, H) = "
            f"{(*keys.shape[:2], hidden)}, got {_shape(keys_proj)}"
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
        _check_sizes(
            "BahdanauAttention",
            query_dim=query_dim,
            key_dim=key_dim,
            hidden_dim=hidden_dim,
        )
        self.query_dim, self.key_dim, self.coverage = query_dim, key_dim, coverage
        self.hidden_dim = hidden_dim
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
                "BahdanauAttention: coverage was given to a module built with "
                "coverage=False"
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
        fn = "BahdanauAttention.forward"
        _check_step_inputs(fn, self, query, keys, key_padding_mask)
        if coverage is not None:
            _check_per_position(fn, "coverage", coverage, keys)
        if keys_proj is None:
            keys_proj = self.project_keys(keys)
        else:
            _check_keys_proj(fn, keys_proj, keys, self.hidden_dim)
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
        fn = "LuongAttention"
        _check_sizes(fn, query_dim=query_dim, key_dim=key_dim)
        _check_optional_size(fn, "hidden_dim", hidden_dim)
        if method not in self.METHODS:
            raise ValueError(
                f"{fn}: method must be one of {self.METHODS}, got {method!r}"
            )
        if method == "dot" and query_dim != key_dim:
            raise ValueError(
                f"{fn}: the dot score needs query_dim == key_dim, got {query_dim} and "
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
            hidden_dim = query_dim if hidden_dim is None else hidden_dim
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
        fn = "LuongAttention.forward"
        _check_step_inputs(fn, self, query, keys, key_padding_mask)
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

    Positions count from the start of each row, so ``key_padding_mask`` must be
    right-padded (True = padding, only at the end of a row); a left-padded mask raises
    ``ValueError`` instead of silently centring the window on padding.
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
        fn = "LocalAttention"
        if mode not in self.MODES:
            raise ValueError(f"{fn}: mode must be one of {self.MODES}, got {mode!r}")
        _check_sizes(fn, query_dim=query_dim, key_dim=key_dim, window=window)
        _check_optional_size(fn, "hidden_dim", hidden_dim)
        hidden_dim = query_dim if hidden_dim is None else hidden_dim
        self.query_dim, self.key_dim, self.window, self.mode = (
            query_dim,
            key_dim,
            window,
            mode,
        )
        self.score = LuongAttention(query_dim, key_dim, method="general")
        if mode == "local-p":
            self.W_p = nn.Linear(query_dim, hidden_dim, bias=False)
            self.v_p = nn.Linear(hidden_dim, 1, bias=False)

    def centre(
        self, query: torch.Tensor, lengths: torch.Tensor, *, step: int | None = None
    ) -> torch.Tensor:
        """The aligned source position :math:`p_t`, shape ``(B,)``; ``lengths`` ``(B,)``
        are the source lengths."""
        fn = "LocalAttention.centre"
        if not isinstance(lengths, torch.Tensor) or lengths.shape != query.shape[:1]:
            raise ValueError(
                f"{fn}: lengths must be a tensor of shape (B,) = "
                f"{tuple(query.shape[:1])}, got {_shape(lengths)}"
            )
        if self.mode == "local-m":
            if step is None:
                raise ValueError(
                    f"{fn}: local-m attention needs the decoder step (step=t)"
                )
            _check_count(fn, "step", step)
            return torch.full(
                (query.shape[0],), float(step), dtype=query.dtype, device=query.device
            )
        return lengths.to(query.dtype) * torch.sigmoid(
            self.v_p(torch.tanh(self.W_p(query)))
        ).squeeze(-1)

    def _check_inputs(self, query, keys, key_padding_mask, step) -> None:
        """The step rules, a right-padded mask, and ``step >= 0`` for local-m."""
        fn = "LocalAttention.forward"
        _check_step_inputs(fn, self, query, keys, key_padding_mask)
        if key_padding_mask is not None:
            _check_right_padded(
                fn, "key_padding_mask", ~key_padding_mask, "True = padding"
            )
        if self.mode == "local-m":
            if step is None:
                raise ValueError(
                    f"{fn}: local-m attention needs the decoder step (step=t)"
                )
            _check_count(fn, "step", step)

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
        self._check_inputs(query, keys, key_padding_mask, step)
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
    _check_same_shape("coverage_loss", weights=weights, coverage=coverage)
    return torch.minimum(weights, coverage).sum(-1)


def accumulated_coverage(weights: torch.Tensor) -> torch.Tensor:
    r"""Coverage before each step, :math:`c^t = \sum_{t' < t} a^{t'}`: ``(B, T, S)`` ->
    ``(B, T, S)``, zero at ``t = 0``."""
    check_float("accumulated_coverage", "weights", weights)
    if weights.dim() != 3:
        raise ValueError(
            "accumulated_coverage: weights must have shape (B, T, S), got "
            f"{_shape(weights)}"
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
    fn = "repeated_attention"
    check_float(fn, "weights", weights)
    if weights.dim() != 3:
        raise ValueError(
            f"{fn}: weights must have shape (B, T, S), got {_shape(weights)}"
        )
    if tgt_mask is not None:
        if not isinstance(tgt_mask, torch.Tensor) or tgt_mask.dtype != torch.bool:
            raise TypeError(
                f"{fn}: tgt_mask must be a bool tensor (True = count the step), got "
                f"{getattr(tgt_mask, 'dtype', type(tgt_mask).__name__)}"
            )
        if tgt_mask.shape != weights.shape[:2]:
            raise ValueError(
                f"{fn}: tgt_mask must have shape (B, T) = {tuple(weights.shape[:2])}, "
                f"got {_shape(tgt_mask)}"
            )
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
        fn = "LocationAwareAttention"
        _check_sizes(
            fn,
            query_dim=query_dim,
            key_dim=key_dim,
            hidden_dim=hidden_dim,
            n_filters=n_filters,
            kernel_size=kernel_size,
        )
        if kernel_size % 2 == 0:
            raise ValueError(
                f"{fn}: kernel_size must be odd and >= 1, got {kernel_size}"
            )
        self.query_dim, self.key_dim, self.location = query_dim, key_dim, location
        self.hidden_dim = hidden_dim
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
        ``None`` means the alignment starts on the first frame (a one-hot on frame 0),
        which needs a right-padded ``key_padding_mask`` (``ValueError`` otherwise).
        Returns ``(context (B, Dk), weights (B, S))``."""
        fn = "LocationAwareAttention.forward"
        _check_step_inputs(fn, self, query, keys, key_padding_mask)
        if prev_weights is None:
            if key_padding_mask is not None:
                _check_right_padded(
                    fn, "key_padding_mask", ~key_padding_mask, "True = padding"
                )
            prev_weights = torch.zeros_like(keys[..., 0])
            prev_weights[:, :1] = 1.0
        else:
            _check_per_position(fn, "prev_weights", prev_weights, keys)
        if keys_proj is None:
            keys_proj = self.V(keys)
        else:
            _check_keys_proj(fn, keys_proj, keys, self.hidden_dim)
        if keys.shape[1] == 0:  # no frame: zero context (the convolution needs one)
            return keys.new_zeros(keys.shape[0], self.key_dim), keys.new_zeros(
                keys.shape[0], 0
            )
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
        first frame; ``key_padding_mask`` ``(B, S)`` is True on padded frames (at the
        end of each row). ``T = 0`` gives ``(B, 0, S)``."""
        fn = "LocationAwareAttention.align"
        check_float(fn, "queries", queries)
        check_float(fn, "keys", keys)
        if (
            queries.dim() != 3
            or keys.dim() != 3
            or queries.shape[0] != keys.shape[0]
            or queries.shape[2] != self.query_dim
        ):
            raise ValueError(
                f"{fn}: queries must have shape (B, T, Dq={self.query_dim}) and keys "
                f"(B, S, Dk={self.key_dim}) with the same B, got {_shape(queries)} and "
                f"{_shape(keys)}"
            )
        first = queries.new_zeros(queries.shape[0], self.query_dim)
        _check_step_inputs(fn, self, first, keys, key_padding_mask)
        if key_padding_mask is not None:
            _check_right_padded(
                fn, "key_padding_mask", ~key_padding_mask, "True = padding"
            )
        if queries.shape[1] == 0:
            return keys.new_zeros(keys.shape[0], 0, keys.shape[1])
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
    S)`` -> scalar in ``[0, 1]`` (1 = every step reads only its own segment); ``B`` and
    ``T`` must be at least 1."""
    fn = "weight_on_target"
    check_float(fn, "weights", weights)
    if not isinstance(alignment, torch.Tensor):
        raise TypeError(
            f"{fn}: alignment must be a torch.Tensor, got {_shape(alignment)}"
        )
    if weights.dim() != 3 or weights.shape != alignment.shape:
        raise ValueError(
            f"{fn}: weights and alignment must have the same shape (B, T, S), got "
            f"{_shape(weights)} and {_shape(alignment)}"
        )
    if weights.shape[0] == 0 or weights.shape[1] == 0:
        raise ValueError(
            f"{fn}: the mean over no step is undefined: weights {_shape(weights)} "
            "needs B >= 1 and T >= 1"
        )
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
    fn = "train_aligner"
    if not isinstance(attention, LocationAwareAttention):
        raise TypeError(
            f"{fn}: attention must be a LocationAwareAttention, got "
            f"{type(attention).__name__}"
        )
    _check_count(fn, "steps", steps)
    _check_sizes(fn, batch_size=batch_size)
    _check_rate(fn, "lr", lr)
    if len(task.frames) == 0:
        raise ValueError(f"{fn}: task holds no example (frames {_shape(task.frames)})")
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

    Inputs: ``src`` ``(B, S)`` token ids in ``[0, src_vocab)``, ``src_mask`` ``(B, S)``
    bool, True on real tokens and right-padded (padding only at the end of a row, as
    :meth:`attnbook.data.Task.encode` makes it; every row has a real token), ``B >=
    1``. A mask that is not right-padded raises ``ValueError``: the packed encoder and
    local attention count positions from the start of each row. Both vocabularies
    include ``PAD``, ``BOS`` and ``EOS`` (ids 0, 1, 2), so they have at least 3 entries.
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
        fn = "Seq2Seq"
        if attention not in self.ATTENTIONS:
            raise ValueError(
                f"{fn}: attention must be one of {self.ATTENTIONS}, got {attention!r}"
            )
        if coverage and attention != "bahdanau":
            raise ValueError(
                f"{fn}: coverage is implemented for attention='bahdanau' only"
            )
        _check_sizes(fn, emb_dim=emb_dim, hidden=hidden, window=window)
        for name, size in (("src_vocab", src_vocab), ("tgt_vocab", tgt_vocab)):
            _check_sizes(fn, **{name: size})
            if size <= EOS:
                raise ValueError(
                    f"{fn}: {name} must be >= {EOS + 1} (PAD, BOS, EOS come first), "
                    f"got {size}"
                )
        _check_rate(fn, "coverage_weight", coverage_weight, zero=True)
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
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
        self._check_source("Seq2Seq.encode", src, src_mask, embedded)
        return self._encode(src, src_mask, embedded)

    def _check_ids(self, fn: str, name: str, ids, vocab: int) -> None:
        if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long:
            raise TypeError(
                f"{fn}: {name} must be an int64 tensor of token ids, got "
                f"{getattr(ids, 'dtype', type(ids).__name__)}"
            )
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise ValueError(
                f"{fn}: {name} holds token ids outside the vocabulary [0, {vocab}): "
                f"min {int(ids.min())}, max {int(ids.max())}"
            )

    def _check_source(
        self, fn, src, src_mask, embedded=None, *, batch: bool = False
    ) -> None:
        """The rules of the class docstring for ``src`` and ``src_mask`` (named
        ``batch['src']``... when they come in a batch dict)."""
        name, mask_name = (
            ("batch['src']", "batch['src_mask']") if batch else ("src", "src_mask")
        )
        self._check_ids(fn, name, src, self.src_vocab)
        if src.dim() != 2 or src.shape[0] == 0 or src.shape[1] == 0:
            raise ValueError(
                f"{fn}: {name} must have shape (B, S) with B >= 1 and S >= 1, got "
                f"{_shape(src)}"
            )
        if not isinstance(src_mask, torch.Tensor) or src_mask.dtype != torch.bool:
            raise TypeError(
                f"{fn}: {mask_name} must be a bool tensor (True = real token), got "
                f"{getattr(src_mask, 'dtype', type(src_mask).__name__)}"
            )
        if src_mask.shape != src.shape:
            raise ValueError(
                f"{fn}: {mask_name} must have {name}'s shape (B, S) = "
                f"{tuple(src.shape)}, got {_shape(src_mask)}"
            )
        _check_right_padded(fn, mask_name, src_mask, "True = real token")
        if not src_mask[:, 0].all():
            row = int((~src_mask[:, 0]).nonzero()[0])
            raise ValueError(
                f"{fn}: every source sequence needs at least one token; {mask_name} "
                f"row {row} is all False"
            )
        if embedded is not None:
            check_float(fn, "embedded", embedded)
            want = (*src.shape, self.src_emb.embedding_dim)
            if embedded.shape != want:
                raise ValueError(
                    f"{fn}: embedded must have shape (B, S, emb_dim) = {want}, got "
                    f"{_shape(embedded)}"
                )
            if embedded.dtype != self.src_emb.weight.dtype:
                raise TypeError(
                    f"{fn}: embedded must have the model's dtype "
                    f"{self.src_emb.weight.dtype}, got {embedded.dtype}"
                )

    def _encode(self, src, src_mask, embedded=None):
        x = self.src_emb(src) if embedded is None else embedded
        lengths = src_mask.sum(-1).cpu()
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
        """Teacher forcing: ``tgt_in`` ``(B, T)``, ``T >= 1``, starts with ``BOS``; step
        ``t`` is fed the true ``y_{t-1}``."""
        fn = "Seq2Seq.forward"
        self._check_source(fn, src, src_mask, embedded)
        self._check_ids(fn, "tgt_in", tgt_in, self.tgt_vocab)
        if tgt_in.dim() != 2 or tgt_in.shape[0] != src.shape[0] or tgt_in.shape[1] == 0:
            raise ValueError(
                f"{fn}: tgt_in must have shape (B={src.shape[0]}, T) with T >= 1 (it "
                f"starts with BOS), got {_shape(tgt_in)}"
            )
        memory, summary = self._encode(src, src_mask, embedded)
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
        early when every sequence has produced ``EOS``; ``max_len=0`` gives ``T' = 0``).
        """
        fn = "Seq2Seq.greedy_decode"
        self._check_source(fn, src, src_mask)
        _check_count(fn, "max_len", max_len)
        memory, summary = self._encode(src, src_mask)
        if max_len == 0:
            B, S = src.shape
            return src.new_zeros(B, 0), memory.new_zeros(B, 0, S)
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
        """Beam search, one source at a time: a high log-probability output of each
        source, token ids without ``EOS``.

        A hypothesis scores the sum of its token log-probabilities (no length
        normalization). Each step extends every live hypothesis by every token; an
        ``EOS`` among the ``beam_size`` best extensions finishes its hypothesis, and the
        ``beam_size`` best extensions by another token stay live. A sum of
        log-probabilities only falls as tokens are added, so the search stops once the
        best live hypothesis scores no more than the best finished one (none can still
        overtake it), or after ``max_len`` tokens; it returns the best finished
        hypothesis, or, when none finished, the best live one.

        With ``beam_size=1`` it is exactly :meth:`greedy_decode`. With a beam as wide
        as the number of extensions (``(V - 2) (V - 3)^(max_len - 1)`` for ``V``
        target tokens) nothing is ever pruned and it returns the most likely output of
        at most ``max_len`` tokens. In between it is a heuristic: a wider beam usually
        finds a more likely output than greedy decoding, but it can prune the prefix of
        greedy's output and end below it. (With length normalization a longer
        hypothesis could still overtake a finished one, and the early stop would not be
        sound.)
        """
        fn = "Seq2Seq.beam_search"
        self._check_source(fn, src, src_mask)
        _check_sizes(fn, beam_size=beam_size)
        _check_count(fn, "max_len", max_len)
        return [
            self._beam_search_one(
                src[b : b + 1], src_mask[b : b + 1], beam_size, max_len
            )
            for b in range(src.shape[0])
        ]

    def _beam_search_one(
        self, src: torch.Tensor, src_mask: torch.Tensor, beam_size: int, max_len: int
    ) -> list[int]:
        memory, summary = self._encode(src, src_mask)
        state = self._initial_state(memory, summary)
        # (tokens, log-probability) of the live hypotheses, best first, in `state` order
        beams: list[tuple[list[int], float]] = [([], 0.0)]
        finished: list[tuple[list[int], float]] = []
        for t in range(max_len):
            n = len(beams)
            y = torch.tensor(
                [toks[-1] if toks else BOS for toks, _ in beams], device=src.device
            )
            mem, mask = memory.expand(n, -1, -1), src_mask.expand(n, -1)
            logits, _, state = self.step(y, state, mem, mask, t)
            scores = torch.tensor([lp for _, lp in beams], device=src.device)
            total = scores[:, None] + _never_special(logits).log_softmax(-1)
            V = total.shape[1]
            # an EOS among the beam_size best extensions ends its hypothesis (so that
            # beam 1 is greedy); PAD and BOS are -inf and never taken
            for score, index in _finite_topk(total.flatten(), beam_size):
                parent, token = divmod(index, V)
                if token == EOS:
                    finished.append((beams[parent][0], score))
            # the beam_size best extensions by another token stay live
            total[:, EOS] = float("-inf")
            extend = _finite_topk(total.flatten(), beam_size)
            if not extend:
                break
            parents = torch.tensor(
                [index // V for _, index in extend], device=src.device
            )
            state = {k: v[parents] for k, v in state.items()}
            beams = [
                (beams[index // V][0] + [index % V], score) for score, index in extend
            ]
            # scores only fall as tokens are added: stop when no live one can still win
            if finished and beams[0][1] <= max(score for _, score in finished):
                break
        pool = finished or beams
        return max(pool, key=lambda h: h[1])[0]


def _finite_topk(scores: torch.Tensor, k: int) -> list[tuple[float, int]]:
    """The ``k`` largest finite entries of a 1-D tensor, best first, as ``(value,
    index)``."""
    top = scores.topk(min(k, scores.numel()))
    return [
        (value, index)
        for value, index in zip(top.values.tolist(), top.indices.tolist())
        if value != float("-inf")
    ]


# --------------------------------------------------------------------------------------
# Training and evaluation
# --------------------------------------------------------------------------------------
def _check_batch(fn: str, model, batch) -> None:
    """``model`` a :class:`Seq2Seq`; ``batch`` a mapping with ``src``, ``src_mask``
    (checked as :class:`Seq2Seq` checks them) and ``tgt`` ``(B, T)``, ``T >= 2``, with
    at least one real target token."""
    if not isinstance(model, Seq2Seq):
        raise TypeError(f"{fn}: model must be a Seq2Seq, got {type(model).__name__}")
    missing = (
        ["batch"]
        if not isinstance(batch, Mapping)
        else [key for key in ("src", "src_mask", "tgt") if key not in batch]
    )
    if missing:
        raise TypeError(
            f"{fn}: batch must be a mapping with keys 'src', 'src_mask', 'tgt' (as "
            f"Task.encode makes it); missing {missing}"
        )
    src, tgt = batch["src"], batch["tgt"]
    model._check_source(fn, src, batch["src_mask"], batch=True)
    model._check_ids(fn, "batch['tgt']", tgt, model.tgt_vocab)
    if tgt.dim() != 2 or tgt.shape[0] != src.shape[0] or tgt.shape[1] < 2:
        raise ValueError(
            f"{fn}: batch['tgt'] must have shape (B={src.shape[0]}, T) with T >= 2 "
            f"(BOS y_1 ... EOS), got {_shape(tgt)}"
        )
    if not (tgt[:, 1:] != PAD).any():
        raise ValueError(f"{fn}: batch['tgt'] has no target token: all PAD after BOS")


def sequence_loss(model: Seq2Seq, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Token cross-entropy with teacher forcing, plus ``model.coverage_weight`` x the
    coverage loss.

    ``batch["tgt"]`` is ``BOS y_1 ... y_n EOS PAD...``: the input is ``tgt[:, :-1]``,
    the target ``tgt[:, 1:]``; padding is ignored (at least one target must be real).
    """
    _check_batch("sequence_loss", model, batch)
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

    fn = "train_seq2seq"
    if not isinstance(model, Seq2Seq):
        raise TypeError(f"{fn}: model must be a Seq2Seq, got {type(model).__name__}")
    _check_sizes(fn, epochs=epochs, batch_size=batch_size)
    _check_rate(fn, "lr", lr)
    if grad_clip is not None:
        _check_rate(fn, "grad_clip", grad_clip)
    if not task.train:
        raise ValueError(f"{fn}: task.train is empty")

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
    fn = "exact_match"
    pairs = task.test if pairs is None else pairs
    if not isinstance(model, Seq2Seq):
        raise TypeError(f"{fn}: model must be a Seq2Seq, got {type(model).__name__}")
    _check_sizes(fn, batch_size=batch_size)
    if len(pairs) == 0:
        raise ValueError(f"{fn}: pairs is empty; the fraction of no pair is undefined")
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
    backward pass per output step gives every example's gradient at once. The sources
    must have equal lengths (a padded position would add a zero gradient to the mean:
    ``ValueError``).
    """
    fn = "input_gradient_norms"
    _check_batch(fn, model, batch)
    if not batch["src_mask"].all():
        raise ValueError(
            f"{fn}: batch['src_mask'] must be all True (equal-length sources, no "
            f"padding), got {int((~batch['src_mask']).sum())} padded positions"
        )
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
    check_float("gradient_vs_distance", "norms", norms)
    if norms.dim() != 2 or 0 in norms.shape:
        raise ValueError(
            "gradient_vs_distance: norms must have shape (T, S) with T, S >= 1, got "
            f"{_shape(norms)}"
        )
    S = norms.shape[1]
    per_position = norms.mean(0)
    dist = torch.minimum(torch.arange(S), S - 1 - torch.arange(S))
    distances = torch.unique(dist)
    return distances, torch.stack([per_position[dist == d].mean() for d in distances])
