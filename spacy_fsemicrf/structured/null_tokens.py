"""Null tokens: a filtered graph whose paths may leave kept nodes out.

On the paper's graph a path is a *maximal* set of non-overlapping nodes, so a kept node that
overlaps no other is on every path: the filter alone decides it. With null tokens every token
covered by some node also gets a null node of width 1 (label 0, scored by the head). The
maximal sets of the nodes and these nulls are in one-to-one correspondence with the sets of
non-overlapping nodes, *any* of them: the set ``S`` corresponds to ``S`` plus the nulls of the
covered tokens ``S`` leaves uncovered. So the same solver (:mod:`.filtered`) scores every way
of keeping or dropping the kept nodes, and the path CRF can overrule the filter.

A null and a width-1 node of the same token share a grid cell. The cell is then one node whose
score is ``logaddexp(node, null)`` for log Z and marginals, and ``max(node, null)`` for the
best path, the better of the two being the cell's choice; the node's own marginal is the
cell's times its share ``exp(node - logaddexp(node, null))``. Only without transitions, whose
labels a merged cell could not tell apart.

Tokens that no node covers get no null: such a null is on every path, and its score cancels
from every quantity (log Z minus a path's score, marginals, the best path).
"""
from typing import NamedTuple

import torch

from .filtered import NodeSet
from .spans import token_coverage


class NullTokens(NamedTuple):
    """The nodes of a :class:`NodeSet` with the null tokens added (grid order).

    ``nodes`` scores each cell for log Z and marginals (``logaddexp`` where a node and a null
    share it) and labels it with the node's label, 0 for a null alone; ``best_scores`` scores it
    for the best path (``max``); ``pick`` says whether the cell's best choice is the node (False
    for a null alone); ``share`` is the node's share of the cell's marginal (0 for a null
    alone); ``node_at [m]`` is the position of each of the ``m`` original nodes in the list.
    """

    nodes: NodeSet
    best_scores: torch.Tensor
    pick: torch.Tensor
    share: torch.Tensor
    node_at: torch.Tensor


def add_null_tokens(nodes: NodeSet, null_scores: torch.Tensor) -> NullTokens:
    """``nodes`` plus a null of score ``null_scores[doc, token]`` (``[B, L]``) at every token
    some node covers. Differentiable in both scores."""
    B, L, K = nodes.shape
    index, scores = nodes.index, nodes.scores
    row, width = index // K, index % K
    doc, start = row // L, row % L
    covered = token_coverage(doc, start, start + width, B, L) > 0
    null_doc, null_token = covered.nonzero(as_tuple=True)
    null_index = (null_doc * L + null_token) * K  # width 0: the cell of a width-1 span
    null_score = null_scores[null_doc, null_token].to(scores.dtype)
    # every cell once, in grid order; a width-1 node's cell is also a null's cell
    merged_index, where = torch.unique(torch.cat([index, null_index]), return_inverse=True)
    node_at, null_at = where[: index.numel()], where[index.numel():]
    n = merged_index.numel()
    node_score = scores.new_full((n,), float("-inf")).index_put((node_at,), scores)
    null_cell = scores.new_full((n,), float("-inf")).index_put((null_at,), null_score)
    cell_score = torch.logaddexp(node_score, null_cell)
    labels = nodes.labels.new_zeros(n).index_put((node_at,), nodes.labels)
    has_node = torch.zeros(n, dtype=torch.bool, device=index.device).index_fill(0, node_at, True)
    # a cell holds a node, a null or both, so its log-sum is finite
    share = torch.where(has_node, (node_score - cell_score).exp(), torch.zeros_like(cell_score))
    return NullTokens(
        nodes=NodeSet(merged_index, labels, cell_score, nodes.shape),
        best_scores=torch.maximum(node_score, null_cell),
        pick=has_node & (node_score > null_cell),  # ties go to null, as in the filter
        share=share,
        node_at=node_at,
    )


def null_token_scores(nodes: NodeSet, null_scores: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
    """``[B]``: the nulls' part of the score of the path ``path`` (``BoolTensor[m]`` over
    ``nodes``) in the graph with null tokens: the null scores of the tokens some node covers and
    the path does not."""
    B, L, K = nodes.shape
    row, width = nodes.index // K, nodes.index % K
    doc, start = row // L, row % L
    end = start + width
    covered = token_coverage(doc, start, end, B, L) > 0
    on_path = token_coverage(doc[path], start[path], end[path], B, L) > 0
    return (null_scores * (covered & ~on_path)).sum(1)
