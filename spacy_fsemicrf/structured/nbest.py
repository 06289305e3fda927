"""The k best segmentations of each document, with their probabilities, for the three heads.

Each is exact: the searches (:mod:`.pathsearch` for the filtered graph, :mod:`.lattice` for the
others) keep the k best prefixes per position and channel, so the k paths come out best first,
each distinct (for the linear CRF, distinct valid tag sequences, which are distinct
segmentations). A segmentation's probability is ``exp(score - log Z)`` with the head's own
log Z: the filtered head's over the maximal paths of its node set, the semi-CRF's over all
segmentations, the CRF's over all tag sequences.

A path of score ``-inf`` (through a node, segment or tag scored ``-inf``, or a transition
``-inf`` forbids) has probability 0: it is no path of the distribution, and none of the three
lists it. A document lists fewer than k where fewer paths have a probability, and none (an
empty list) where no path has one: every path ``-inf`` leaves no distribution to rank.
"""
import math
from typing import List, NamedTuple, Optional, Tuple

import numpy
import torch

from . import filtered, itemgraphs
from .compaction import to_host
from .constraints import padded_sentence_index, sentence_index
from .lattice import lattice_search
from .linear_crf import TagScheme, crf_log_partition
from .pathsearch import check_k, search
from .semicrf import semicrf_log_partition

Span = Tuple[int, int, int]  # (start, end inclusive, label)


class Segmentation(NamedTuple):
    """One of a document's k best: its entities ``(start, end inclusive, label)`` in order,
    its score and ``log_prob = score - log Z``."""

    spans: Tuple[Span, ...]
    score: float
    log_prob: float

    @property
    def prob(self) -> float:
        return math.exp(min(self.log_prob, 0.0))


def _double(x: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if x is None else x.detach().double()


@torch.no_grad()
def filtered_nbest(
    nodes: filtered.NodeSet,
    lengths: torch.Tensor,
    transitions: Optional[torch.Tensor],
    k: int,
) -> List[List[Segmentation]]:
    """The k best paths of each document's filtered graph (its kept nodes), leaving out
    those of score ``-inf`` (none where every path is ``-inf``), as the other heads' do."""
    check_k(k)  # (also where there is no document to search)
    B, L, K = nodes.shape
    log_z = filtered.filtered_log_partition(
        nodes.grid(nodes.scores.double()), nodes.grid(), nodes.grid(nodes.labels),
        _double(transitions), nodes.index,
    ).cpu().numpy()
    rows = nodes.spans().cpu().numpy()
    scores = to_host(nodes.scores)
    ranges = numpy.searchsorted(rows[:, 0], numpy.arange(B + 1))
    T = to_host(transitions)
    out = []
    for b in range(B):
        mine = rows[ranges[b] : ranges[b + 1], 1:]
        length = int(lengths[b])
        graph = itemgraphs.filtered_items(mine, scores[ranges[b] : ranges[b + 1]], length, K).graph
        found = search(graph, T, None, sentence_index(length), k)
        # the paths come best first, so those of probability 0 are the last (the lattice
        # searches of the other heads never return them)
        out.append([
            Segmentation(tuple(tuple(mine[i].tolist()) for i in p.items), p.score,
                         p.score - float(log_z[b]))
            for p in found.paths if p.score != -math.inf
        ])
    return out


def _one_sentence(lengths: numpy.ndarray, L: int) -> numpy.ndarray:
    """``[B, L + 1]`` sentence indices of documents taken as one sentence each (sentences only
    matter to constraints)."""
    return numpy.array([padded_sentence_index(int(n), L) for n in lengths]).reshape(-1, L + 1)


def _ranked(found, log_z: numpy.ndarray, to_spans) -> List[List[Segmentation]]:
    return [
        [Segmentation(tuple(to_spans(items)), score, score - float(log_z[b]))
         for score, items in paths]
        for b, paths in enumerate(found)
    ]


@torch.no_grad()
def semicrf_nbest(
    scores: torch.Tensor, lengths: torch.Tensor, transitions: Optional[torch.Tensor], k: int
) -> List[List[Segmentation]]:
    """The k best segmentations of each document under the exact semi-CRF's segment scores
    ``[B, L, K, C]`` (impossible segments are ignored, as in the head), leaving out those of
    score ``-inf`` (none where every segmentation is ``-inf``)."""
    B, L, K, C = scores.shape
    log_z = semicrf_log_partition(scores.detach().double(), lengths, _double(transitions))
    lengths_np = lengths.cpu().numpy()
    inside = itemgraphs.segments_inside(lengths_np, (L, K, C))
    masked = numpy.where(inside, to_host(scores), -numpy.inf)
    T, sentence = to_host(transitions), _one_sentence(lengths_np, L)
    found = lattice_search(masked, lengths_np, T, numpy.arange(C), None, sentence, k)
    return _ranked(found, log_z, lambda items: [(s, s + w, c) for s, w, c in items if c > 0])


@torch.no_grad()
def crf_nbest(
    emissions: torch.Tensor,
    transitions: torch.Tensor,
    lengths: torch.Tensor,
    scheme: TagScheme,
    k: int,
    allowed: Optional[torch.Tensor] = None,
) -> List[List[Segmentation]]:
    """The k best valid tag sequences of each document under a linear CRF, as entities,
    leaving out those of score ``-inf`` (none where every sequence is ``-inf``)."""
    B, L, n_tags = emissions.shape
    log_z = crf_log_partition(emissions.detach().double(), _double(transitions), lengths, allowed)
    lengths_np = lengths.cpu().numpy()
    inside = numpy.arange(L)[None, :, None, None] < lengths_np[:, None, None, None]
    masked = numpy.where(inside, to_host(emissions)[:, :, None, :], -numpy.inf)
    T = itemgraphs.crf_transitions(transitions, allowed)
    sentence = _one_sentence(lengths_np, L)
    found = lattice_search(masked, lengths_np, T, itemgraphs.crf_symbols(scheme), None, sentence, k)
    return _ranked(
        found, log_z, lambda items: itemgraphs.crf_tags_to_spans([c for _, _, c in items], scheme)
    )

