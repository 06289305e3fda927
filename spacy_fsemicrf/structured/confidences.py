"""What a head reports at prediction besides its decoded entities: each entity's confidence,
the candidates it considered, and the probability of the decoded path.

A head predicts ``(rows LongTensor[N, 4], values Tensor[N])``. Rows ``(doc, start, end, label)``
with ``label`` in ``1..M`` are the decoded entities, valued by their confidence. With the
head's :class:`DecodeExtras` turned on (:func:`decode_extras`) two more kinds of rows follow,
in the same two tensors, so that they pass unchanged through the Thinc node that wraps the
head (which only renumbers the documents and sorts the rows by document and start):

* ``(doc, start, end, -label)``: a candidate span with its label, valued by its confidence;
* ``(doc, -1, -1, 0)``: one per document, valued by the probability of the decoded path
  (segmentation) under the head's distribution: for the filtered head its distribution over
  the paths of the kept nodes, so 1 when no two kept nodes overlap.

:func:`split_rows` takes them apart again (in NumPy, where the pipeline component reads them).

Confidences are probabilities that a labelled span is an entity, before any calibration:

* filtered semi-CRF: the local classifier's probability of the node's label (softmax over the
  labels and null) times the node's marginal on the filtered graph. The marginal alone is 1 for
  every node that overlaps no other, i.e. for nearly every node of a trained model;
* exact semi-CRF and linear-chain CRF: the span's marginal probability.
"""
from contextlib import contextmanager
from typing import Iterator, NamedTuple, Optional, Tuple

import numpy
import torch

from . import filtered
from .linear_crf import TagScheme, crf_marginals, crf_span_marginals
from .semicrf import semicrf_log_partition

Decoded = Tuple[torch.Tensor, torch.Tensor]

CANDIDATE_FLOOR = 0.01
"""The exact semi-CRF and the linear-chain CRF report as candidates the labelled spans whose
marginal probability exceeds this (every span has some probability under them), plus the
decoded entities. The filtered head reports its kept nodes."""


class DecodeExtras(NamedTuple):
    """Which extra rows a head's prediction adds (see the module docstring)."""

    path: bool = False
    candidates: bool = False


def extras_of(head: torch.nn.Module) -> DecodeExtras:
    """The extras ``head`` is asked for (none unless :func:`decode_extras` is active)."""
    return getattr(head, "decode_extras", None) or DecodeExtras()


@contextmanager
def decode_extras(head: torch.nn.Module, extras: DecodeExtras) -> Iterator[None]:
    """Ask ``head`` for ``extras`` for the duration of the block: the head's forward takes its
    inputs from the Thinc node, which has no argument for them."""
    before = getattr(head, "decode_extras", None)
    head.decode_extras = extras
    try:
        yield
    finally:
        head.decode_extras = before


def with_extras(
    decoded: Decoded,
    n_docs: int,
    path: Optional[torch.Tensor] = None,
    candidates: Optional[Decoded] = None,
) -> Decoded:
    """The decoded ``(rows, values)`` followed by the candidate rows and one path row per
    document (``path [n_docs]`` holds the probabilities), when given."""
    rows, values = [decoded[0].view(-1, 4)], [decoded[1].reshape(-1)]
    if candidates is not None:
        cand = candidates[0].view(-1, 4).clone()
        cand[:, 3].neg_()
        rows.append(cand)
        values.append(candidates[1].reshape(-1).to(values[0].dtype))
    if path is not None:
        path_rows = torch.zeros((n_docs, 4), dtype=torch.long, device=rows[0].device)
        path_rows[:, 0] = torch.arange(n_docs, device=path_rows.device)
        path_rows[:, 1:3] = -1
        rows.append(path_rows)
        values.append(path.reshape(-1).to(values[0].dtype))
    if len(rows) == 1:
        return decoded
    return torch.cat(rows, 0), torch.cat(values, 0)


class SplitRows(NamedTuple):
    """The rows of a prediction taken apart (NumPy arrays; rows keep their order)."""

    entities: numpy.ndarray  # [N, 4] (doc, start, end, label 1..M)
    confidences: numpy.ndarray  # [N]
    candidates: numpy.ndarray  # [N', 4] (doc, start, end, label 1..M)
    candidate_confidences: numpy.ndarray  # [N']
    path_docs: numpy.ndarray  # [D]: documents with a path row
    path_probabilities: numpy.ndarray  # [D]


def split_rows(rows: numpy.ndarray, values: numpy.ndarray) -> SplitRows:
    """Take a prediction's rows apart into entities, candidates and path probabilities."""
    rows = numpy.asarray(rows).reshape(-1, 4)
    values = numpy.asarray(values).reshape(-1)
    label = rows[:, 3]
    entity, candidate = label > 0, label < 0
    path = rows[:, 1] < 0
    candidates = rows[candidate]
    candidates[:, 3] = -candidates[:, 3]
    return SplitRows(rows[entity], values[entity], candidates, values[candidate],
                     rows[path, 0], values[path])


# ----------------------------------------------------------------------------- filtered head


def local_label_probability(
    local: torch.Tensor, index: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """``[n]``: the local classifier's probability (softmax over null and the labels) of each
    listed span (flat ``[B, L, K]`` grid ``index``) having its label."""
    C = local.shape[-1]
    # label planes: a view when the scores are label-major in memory, as the heads lay them out
    planes = local.permute(3, 0, 1, 2).reshape(C, -1).index_select(1, index).float()
    return planes.log_softmax(0).gather(0, labels.view(1, -1)).squeeze(0).exp()


def filtered_path_probability(
    nodes: filtered.NodeSet, best: torch.Tensor, transitions: Optional[torch.Tensor]
) -> torch.Tensor:
    """``[B]``: the probability of the best path (``best``, a ``BoolTensor[n]`` over the
    nodes) among the paths of the filtered graph: ``exp(score(best) - log Z)``."""
    mask, scores, labels = nodes.grid(), nodes.grid(nodes.scores), nodes.grid(nodes.labels)
    log_z = filtered.filtered_log_partition(scores, mask, labels, transitions, nodes.index)
    best_score = filtered.path_score(scores, nodes.grid(best), labels, transitions)
    return (best_score - log_z).clamp_max(0.0).exp()


# ----------------------------------------------------------------------------- semi-CRF


def semicrf_marginals_and_log_z(
    scores: torch.Tensor, lengths: torch.Tensor, transitions: Optional[torch.Tensor]
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(marginals [B, L, K, C], log Z [B])`` from one forward scan and its gradient (what
    :func:`~.semicrf.semicrf_marginals` computes, with the log Z it throws away)."""
    with torch.enable_grad():
        leaf = scores.detach().requires_grad_(True)
        T = None if transitions is None else transitions.detach()
        log_z = semicrf_log_partition(leaf, lengths, T)
        (grad,) = torch.autograd.grad(log_z.sum(), leaf)
    return grad, log_z.detach()


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
    probs = crf_marginals(emissions, transitions, lengths, allowed)  # [B, L, n_tags]
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
    marginals = crf_span_marginals(emissions, transitions, lengths, rows, scheme, allowed)
    above = marginals > CANDIDATE_FLOOR
    rows = torch.cat([spans.view(-1, 4), rows[above]])
    values = torch.cat([conf.reshape(-1), marginals[above].to(conf.dtype)])
    order = torch.argsort(rows[:, 0] * (L + 1) + rows[:, 1], stable=True)
    return rows[order], values[order]
