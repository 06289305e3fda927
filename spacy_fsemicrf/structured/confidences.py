"""What a head reports at prediction besides its decoded entities: each entity's confidence,
the candidates it considered, and what the probability of the decoded path needs.

The probability of a path (segmentation) is under the head's distribution: for the filtered
head its distribution over the paths of the kept nodes, so 1 when no two kept nodes overlap.

Confidences are probabilities that a labelled span is an entity, before any calibration:

* filtered semi-CRF: the local classifier's probability of the node's label (softmax over the
  labels and null) times the node's marginal on the filtered graph. The marginal alone is 1 for
  every node that overlaps no other, i.e. for nearly every node of a trained model;
* exact semi-CRF and linear-chain CRF: the span's marginal probability.
"""
from typing import Optional, Tuple

import torch

from . import filtered
from .linear_crf import TagScheme, crf_marginals, crf_span_marginals
from .semiring import wide

Decoded = Tuple[torch.Tensor, torch.Tensor]

CANDIDATE_FLOOR = 0.01
"""The exact semi-CRF and the linear-chain CRF report as candidates the labelled spans whose
marginal probability exceeds this (every span has some probability under them), plus the
decoded entities. The filtered head reports its kept nodes."""


# ----------------------------------------------------------------------------- filtered head


def local_label_probability(
    local: torch.Tensor, index: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """``[n]``: the local classifier's probability (softmax over null and the labels) of each
    listed span (flat ``[B, L, K]`` grid ``index``) having its label, in float32, or float64
    if ``local`` is."""
    planes = wide(filtered.label_planes(local).index_select(1, index))
    return planes.log_softmax(0).gather(0, labels.view(1, -1)).squeeze(0).exp()


def filtered_path_scores(
    nodes: filtered.NodeSet, best: torch.Tensor, transitions: Optional[torch.Tensor],
    log_z: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(score [B], log Z [B])``: the score of the best path (``best``, a ``BoolTensor[n]``
    over the nodes) and the log partition of the paths of the filtered graph (``log_z``
    if given, as :func:`~.filtered.decode_node_set_log_z` gives it: no second solve)."""
    scores, labels = nodes.grid(nodes.scores), nodes.grid(nodes.labels)
    if log_z is None:
        log_z = filtered.filtered_log_partition(scores, nodes.grid(), labels, transitions,
                                                nodes.index)
    return filtered.path_score(scores, nodes.grid(best), labels, transitions), log_z


# ----------------------------------------------------------------------------- semi-CRF


def span_candidates(marginals: torch.Tensor, decoded: torch.Tensor) -> Decoded:
    """The labelled spans of a ``[B, L, K, C]`` marginal grid above :data:`CANDIDATE_FLOOR`
    and the ``decoded`` rows, as rows ``(doc, start, end, label)`` with their marginals."""
    keep = marginals[..., 1:] > CANDIDATE_FLOOR
    doc, start, end, label = decoded.unbind(1)
    keep[doc, start, end - start, label - 1] = True
    doc, start, width, label = keep.nonzero(as_tuple=True)
    rows = torch.stack([doc, start, start + width, label + 1], 1)
    return rows, marginals[doc, start, width, label + 1].clamp(0.0, 1.0)


# ----------------------------------------------------------------------------- linear CRF


def crf_candidates(
    emissions: torch.Tensor,
    transitions: torch.Tensor,
    lengths: torch.Tensor,
    scheme: TagScheme,
    allowed: torch.Tensor,
    max_width: int,
    decoded: Decoded,
) -> Decoded:
    """The entities up to ``max_width`` tokens wide whose marginal probability exceeds
    :data:`CANDIDATE_FLOOR`, and the ``decoded`` ones (any width), with their marginals.

    A span's marginal is at most the tag marginal of each of its tokens, so only the spans
    whose first tag (B, or U for one token) and following tags (I, or L) all have a marginal
    above the floor are scored exactly."""
    B, L, _ = emissions.shape
    M = scheme.n_labels
    labels = torch.arange(1, M + 1, device=emissions.device)
    probs = crf_marginals(emissions, transitions, lengths, allowed, check=False)  # [B, L, n_tags]
    first = probs[:, :, scheme.tag("B", labels)]
    rest = probs[:, :, scheme.tag("I", labels)]
    if scheme.scheme == "BILUO":
        first = first + probs[:, :, scheme.tag("U", labels)]
        rest = rest + probs[:, :, scheme.tag("L", labels)]
    ok = first > CANDIDATE_FLOOR  # [B, L, M]: spans of width 1 starting there
    cont = rest > CANDIDATE_FLOOR
    found = [ok.nonzero()]
    widths = [0]
    for w in range(1, min(max_width, L)):
        ok = ok[:, :-1] & cont[:, w:]  # starts 0..L-1-w, the token w further on continues
        found.append(ok.nonzero())
        widths.append(w)
    rows = torch.cat(
        [torch.stack([f[:, 0], f[:, 1], f[:, 1] + w, f[:, 2] + 1], 1) for f, w in zip(found, widths)]
    )
    rows = rows[rows[:, 2] < lengths.to(rows.device)[rows[:, 0]]]
    spans, conf = decoded
    key = lambda r: ((r[:, 0] * L + r[:, 1]) * L + r[:, 2]) * (M + 1) + r[:, 3]  # noqa: E731
    rows = rows[~torch.isin(key(rows), key(spans))]
    marginals = crf_span_marginals(emissions, transitions, lengths, rows, scheme, allowed,
                                   check_rows=False, check=False)
    above = marginals > CANDIDATE_FLOOR
    rows = torch.cat([spans.view(-1, 4), rows[above]])
    values = torch.cat([conf.reshape(-1), marginals[above].to(conf.dtype)])
    order = torch.argsort(rows[:, 0] * (L + 1) + rows[:, 1], stable=True)
    return rows[order], values[order]
