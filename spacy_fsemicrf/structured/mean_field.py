"""Mean-field refinement of a filtered graph's node scores (a CRF read as graph attention).

Give each kept node ``i`` a distribution ``Q_i`` over the ``C`` labels (0 is null), unary
scores ``u_i`` (the global head's scores of its span) and, for two nodes joined by an edge, a
pairwise score ``k_ij * mu(l, l')``. One mean-field update of that pairwise CRF is

    Q_i  <-  softmax( u_i + sum_{j in N(i)} k_ij * mu @ Q_j ).

Following the CRF-as-graph-attention reading (one update is one attention layer: ``k`` the
attention weights over the neighbours, ``mu`` the value transform, softmax the activation),
``k_ij`` is a softmax over ``N(i)`` of ``q_i . k_j / sqrt(d)``, with ``q`` and ``k``
projections of each node's features (here: the vectors of its first and last token). Edges
join the nodes of a document whose spans overlap or touch. ``M`` layers unroll ``M`` updates,
each with its own weights unless ``tied``; the last layer's logits are the refined scores,
read at each node's label by the path CRF. ``mu`` starts at zero, so an untrained refiner
returns the unaries unchanged.
"""
import math
from typing import Tuple

import torch
from torch import nn

from .spans import check_integer


def node_edges(index: torch.Tensor, shape: Tuple[int, int, int]) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(src, dst)``, two ``LongTensor[E]``: every ordered pair of distinct nodes of one
    document whose spans overlap or touch (``start_j <= end_i`` and ``end_j >= start_i``, ends
    exclusive). ``index`` holds the nodes' flat indices on the ``[B, L, K]`` grid, sorted.

    A neighbour of ``i`` starts at most ``K`` tokens before ``i`` and at most at ``i``'s end, so
    it lies in a window of the sorted list found by binary search: no ``n x n`` matrix."""
    B, L, K = shape
    row, width = index // K, index % K
    doc, start = row // L, row % L
    end = start + width + 1
    stride = L + K + 1  # keys of different documents never meet
    key = doc * stride + start
    lo = torch.searchsorted(key, doc * stride + (start - K).clamp_min(0))
    hi = torch.searchsorted(key, doc * stride + end, right=True)
    counts = hi - lo
    src = torch.repeat_interleave(torch.arange(index.numel(), device=index.device), counts)
    offsets = torch.cumsum(counts, 0) - counts
    dst = lo[src] + torch.arange(src.numel(), device=index.device) - offsets[src]
    keep = (dst != src) & (start[dst] <= end[src]) & (end[dst] >= start[src])
    return src[keep], dst[keep]


def node_features(X: torch.Tensor, index: torch.Tensor, shape: Tuple[int, int, int]) -> torch.Tensor:
    """``[n, 2D]``: the token vectors ``X [B, L, D]`` at each node's first and last token."""
    B, L, K = shape
    row, width = index // K, index % K
    flat = X.reshape(B * L, X.shape[-1])  # (not -1: a batch of empty documents has B * L = 0)
    return torch.cat([flat[row], flat[row + width]], dim=-1)


def attention_weights(
    query: torch.Tensor, key: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, n: int
) -> torch.Tensor:
    """``[E]``: for each edge ``(i, j)``, the softmax over ``i``'s neighbours of
    ``q_i . k_j / sqrt(d)``."""
    logits = (query[src] * key[dst]).sum(-1) / math.sqrt(query.shape[-1])
    top = logits.new_full((n,), float("-inf")).scatter_reduce(0, src, logits, "amax")
    weights = torch.exp(logits - top[src])
    total = weights.new_zeros((n,)).index_add(0, src, weights)
    return weights / total[src]


class MeanFieldLayer(nn.Module):
    """One mean-field update: ``(unary [n, C], Q [n, C]) -> logits [n, C]``."""

    def __init__(self, feature_width: int, n_classes: int, attention_width: int = 32) -> None:
        super().__init__()
        # (an attention width of 0 divided by sqrt(0): NaN weights)
        check_integer("feature_width", feature_width, 1)
        check_integer("n_classes", n_classes, 1)
        check_integer("attention_width", attention_width, 1)
        self.query = nn.Linear(feature_width, attention_width, bias=False)
        self.key = nn.Linear(feature_width, attention_width, bias=False)
        self.compatibility = nn.Parameter(torch.zeros(n_classes, n_classes))  # mu

    def forward(
        self, unary: torch.Tensor, Q: torch.Tensor, features: torch.Tensor,
        src: torch.Tensor, dst: torch.Tensor,
    ) -> torch.Tensor:
        """The logits after one update: ``unary`` plus the messages of each node's neighbours
        (edges ``src -> dst``) under the current beliefs ``Q``."""
        n = unary.shape[0]
        if src.numel() == 0:
            return unary
        k = attention_weights(self.query(features), self.key(features), src, dst, n)
        values = Q @ self.compatibility.T  # row j: mu @ Q_j
        messages = unary.new_zeros(unary.shape).index_add(0, src, k.unsqueeze(-1) * values[dst])
        return unary + messages


class MeanFieldRefiner(nn.Module):
    """``layers`` mean-field updates over the nodes of a filtered graph (untied weights unless
    ``tied``): ``(unary [n, C], features [n, F], index [n], shape) -> refined logits [n, C]``."""

    def __init__(
        self, feature_width: int, n_classes: int, layers: int, attention_width: int = 32,
        tied: bool = False,
    ) -> None:
        super().__init__()
        check_integer("layers", layers)
        if layers < 1:
            raise ValueError(f"a mean-field refiner needs at least one layer, got {layers}")
        self.n_layers = layers
        self.tied = tied
        n_modules = 1 if tied else layers
        self.layers = nn.ModuleList(
            MeanFieldLayer(feature_width, n_classes, attention_width) for _ in range(n_modules)
        )

    @property
    def dtype(self) -> torch.dtype:
        """The precision of the refiner's weights, which its inputs must have."""
        return self.layers[0].compatibility.dtype

    def forward(
        self, unary: torch.Tensor, features: torch.Tensor, index: torch.Tensor,
        shape: Tuple[int, int, int],
    ) -> torch.Tensor:
        """The refined logits ``[n, C]`` of the nodes at flat ``[B, L, K]`` grid ``index``
        (``shape``), from their ``unary`` scores and boundary ``features``."""
        src, dst = node_edges(index, shape)
        logits = unary
        for m in range(self.n_layers):
            layer = self.layers[0 if self.tied else m]
            logits = layer(unary, logits.softmax(-1), features, src, dst)
        return logits
