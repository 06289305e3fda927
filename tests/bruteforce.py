"""Brute-force references for the structured algorithms, by explicit enumeration.

Only for tiny inputs (a few tokens): every segmentation, tag sequence or node subset is listed
and scored in plain Python, independently of the tensor code under test.

* Semi-CRF: :func:`segmentations`, :func:`segmentation_score`, :func:`semicrf_enumerate`.
* Linear-chain CRF: :func:`tag_sequences`, :func:`tag_sequence_score`, :func:`crf_enumerate`,
  :func:`crf_span_probabilities`.
* Filtered semi-CRF graph: :func:`nonoverlapping_sets`, :func:`maximal_nonoverlapping_sets`,
  :func:`liang_edges`,
  :func:`filtered_enumerate`.
"""

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, Hashable, List, Sequence, Tuple, Union

import torch

Segment = Tuple[int, int, int]  # (start, end_inclusive, label); label 0 = null
Interval = Tuple[int, int]  # (start, end_inclusive)
Edge = Tuple[Union[int, str], Union[int, str]]


def _logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def _nested(x) -> list:
    return x.tolist() if isinstance(x, torch.Tensor) else x


@dataclass
class Enumeration:
    """What enumeration gives: every structure with its score, log Z, the best score and the
    structures reaching it (within ``1e-9``), and the marginals."""

    paths: List[Tuple[Hashable, float]]
    log_z: float
    best_score: float
    best_paths: List[Hashable]
    marginals: torch.Tensor


# ----------------------------------------------------------------------------- semi-CRF


@lru_cache(maxsize=None)
def segmentations(length: int, max_width: int, n_classes: int) -> Tuple[Tuple[Segment, ...], ...]:
    """Every segmentation of ``length`` tokens, as tuples of ``(start, end, label)`` in order.

    Null segments (label 0) are one token wide; entity segments (labels ``1..n_classes - 1``)
    are ``1..max_width`` wide. The empty document has one, empty, segmentation.
    """
    if length == 0:
        return ((),)
    out = []
    for width in range(1, min(max_width, length) + 1):
        start = length - width
        labels = range(n_classes) if width == 1 else range(1, n_classes)
        for prefix in segmentations(start, max_width, n_classes):
            for label in labels:
                out.append(prefix + ((start, length - 1, label),))
    return tuple(out)


def segmentation_score(scores, segments: Sequence[Segment], transitions=None) -> float:
    """Score of a segmentation: ``sum scores[start][end - start][label]`` plus, with
    ``transitions`` (``[C + 1][C + 1]``, row C = START, column C = END), the transitions
    START -> first, between consecutive segments, last -> END (none for an empty one)."""
    scores, transitions = _nested(scores), _nested(transitions)
    total = sum(scores[s][e - s][c] for s, e, c in segments)
    if transitions is not None and segments:
        C = len(transitions) - 1
        labels = [C] + [c for _, _, c in segments] + [C]
        total += sum(transitions[p][q] for p, q in zip(labels, labels[1:]))
    return total


def semicrf_enumerate(scores, length: int, transitions=None) -> Enumeration:
    """Enumerate one document's segmentations. ``scores`` is ``[L, K, C]`` (``L >= length``);
    ``marginals`` is ``float64 [L, K, C]``; paths are tuples of ``(start, end, label)``."""
    L, K, C = torch.as_tensor(scores).shape
    scores_l, trans_l = _nested(scores), _nested(transitions)
    paths = [
        (segs, segmentation_score(scores_l, segs, trans_l)) for segs in segmentations(length, K, C)
    ]
    return _summarise(paths, (L, K, C), lambda seg: (seg[0], seg[1] - seg[0], seg[2]))


def _summarise(paths, shape, index_of) -> Enumeration:
    values = [v for _, v in paths]
    log_z = _logsumexp(values)
    best = max(values)
    best_paths = [p for p, v in paths if v >= best - 1e-9]
    totals: Dict[Tuple[int, ...], float] = {}
    for path, v in paths:
        prob = math.exp(v - log_z)
        for item in path:
            key = index_of(item)
            totals[key] = totals.get(key, 0.0) + prob
    marginals = torch.zeros(shape, dtype=torch.float64)
    for key, prob in totals.items():
        marginals[key] = prob
    return Enumeration(paths, log_z, best, best_paths, marginals)


# ----------------------------------------------------------------------------- linear CRF


def tag_sequences(length: int, n_tags: int, allowed=None) -> List[Tuple[int, ...]]:
    """Every tag sequence of ``length`` tokens; with ``allowed`` (``[n + 1, n + 1]``, row n =
    START, column n = END) only those whose transitions, START and END included, are allowed."""
    allowed = _nested(allowed)
    if length == 0:
        return [()]
    out: List[Tuple[int, ...]] = []

    def extend(prefix: Tuple[int, ...]) -> None:
        prev = prefix[-1] if prefix else n_tags
        if len(prefix) == length:
            if allowed is None or allowed[prev][n_tags]:
                out.append(prefix)
            return
        for tag in range(n_tags):
            if allowed is None or allowed[prev][tag]:
                extend(prefix + (tag,))

    extend(())
    return out


def tag_sequence_score(emissions, transitions, tags: Sequence[int]) -> float:
    """``T[START, y_0] + sum emissions[t][y_t] + sum T[y_t-1, y_t] + T[y_last, END]``, or 0
    for the empty sequence."""
    emissions, transitions = _nested(emissions), _nested(transitions)
    if not tags:
        return 0.0
    n = len(transitions) - 1
    path = [n] + list(tags) + [n]
    return sum(emissions[t][y] for t, y in enumerate(tags)) + sum(
        transitions[p][q] for p, q in zip(path, path[1:])
    )


def crf_enumerate(emissions, transitions, length: int, allowed=None) -> Enumeration:
    """Enumerate one document's tag sequences (only the allowed ones if ``allowed`` is given).
    ``emissions`` is ``[L, n]``; ``marginals`` is ``float64 [L, n]``; paths are tag tuples."""
    em, tr = _nested(emissions), _nested(transitions)
    n = len(tr) - 1
    L = len(em)
    paths = [(tags, tag_sequence_score(em, tr, tags)) for tags in tag_sequences(length, n, allowed)]
    enum = _summarise([(tuple(enumerate(p)), v) for p, v in paths], (L, n), lambda item: item)
    enum.paths = paths
    enum.best_paths = [tuple(y for _, y in p) for p in enum.best_paths]
    return enum


def parse_tag(name: str) -> Tuple[str, int]:
    """``"B-3" -> ("B", 3)``, ``"O" -> ("O", 0)``."""
    if name == "O":
        return "O", 0
    kind, label = name.split("-")
    return kind, int(label)


def entities_by_definition(
    tags: Sequence[int], names: Sequence[str], scheme: str
) -> List[Tuple[int, int, int]]:
    """The labelled spans ``(start, end, label)`` that are entities of ``tags`` by the
    definition of :func:`crf_span_marginals`: BIO ``B-l I-l ... I-l`` not followed by ``I-l``;
    BILUO ``U-l`` or ``B-l I-l ... I-l L-l``. Any sequence, valid or not."""
    parsed = [parse_tag(names[y]) for y in tags]
    n = len(parsed)
    out = []
    for s, (kind, label) in enumerate(parsed):
        if scheme == "BILUO" and kind == "U":
            out.append((s, s, label))
        elif kind == "B":
            e = s + 1
            while e < n and parsed[e] == ("I", label):
                e += 1
            if scheme == "BIO":
                out.append((s, e - 1, label))
            elif e < n and parsed[e] == ("L", label):
                out.append((s, e, label))
    return out


def crf_span_probabilities(
    enum: Enumeration, names: Sequence[str], scheme: str
) -> Dict[Tuple[int, int, int], float]:
    """Probability of every labelled span ``(start, end, label)`` being an entity, from an
    enumeration; spans that are never entities are absent (probability 0)."""
    probs: Dict[Tuple[int, int, int], float] = {}
    for tags, v in enum.paths:
        p = math.exp(v - enum.log_z)
        for span in entities_by_definition(tags, names, scheme):
            probs[span] = probs.get(span, 0.0) + p
    return probs


# ----------------------------------------------------------------------------- filtered graph


def overlap(a: Interval, b: Interval) -> bool:
    """Whether two ``(start, end inclusive, ...)`` intervals share a token."""
    return a[0] <= b[1] and b[0] <= a[1]


def nonoverlapping_sets(nodes: Sequence[Sequence[int]]) -> List[List[int]]:
    """Every set of pairwise non-overlapping intervals (a node's first two entries are its
    ``(start, end_inclusive)``), the empty set first, as lists of indices into ``nodes`` in start
    order. Grown one interval at a time in start order: each set is listed once, and a set with
    an overlap is never built (so the cost follows the answer, not ``2^n``)."""
    order = sorted(range(len(nodes)), key=lambda k: tuple(nodes[k][:2]))
    found: List[List[int]] = []

    def grow(chosen: List[int], after: int, last_end: int) -> None:
        # Disjoint intervals have distinct starts, so listing them by start visits each set once.
        found.append(chosen)
        for pos in range(after, len(order)):
            k = order[pos]
            if nodes[k][0] > last_end:
                grow(chosen + [k], pos + 1, nodes[k][1])

    grow([], 0, -1)
    return found


def maximal_nonoverlapping_sets(nodes: List[Interval]) -> List[List[int]]:
    """Every maximal set of pairwise non-overlapping intervals ``(start, end_inclusive)``, as
    sorted lists of indices into ``nodes``. No nodes: the single empty set."""
    return [
        sorted(chosen) for chosen in nonoverlapping_sets(nodes)
        if all(any(overlap(nodes[k], nodes[c]) for c in chosen)
               for k in range(len(nodes)) if k not in chosen)
    ]


def liang_edges(nodes: List[Interval]) -> List[Edge]:
    """The graph of Liang et al. (1991), naively: ``u -> v`` iff ``end_u < start_v`` and no node
    ``w`` lies strictly inside the gap (``end_u < start_w`` and ``end_w < start_v``);
    ``("START", v)`` for nodes without incoming edges, ``(u, "END")`` for nodes without outgoing
    ones, and ``("START", "END")`` when there are no nodes."""
    n = len(nodes)
    edges: List[Edge] = []
    for u in range(n):
        for v in range(n):
            gap = (nodes[u][1], nodes[v][0])
            if gap[0] < gap[1] and not any(gap[0] < w[0] and w[1] < gap[1] for w in nodes):
                edges.append((u, v))
    has_in = {v for _, v in edges}
    has_out = {u for u, _ in edges}
    edges += [("START", v) for v in range(n) if v not in has_in]
    edges += [(u, "END") for u in range(n) if u not in has_out]
    if n == 0:
        edges.append(("START", "END"))
    return edges


def graph_paths(edges: List[Edge]) -> List[List[int]]:
    """Every START-to-END path of a graph from :func:`liang_edges`, as sorted node lists."""
    succ: Dict[Union[int, str], List[Union[int, str]]] = {}
    for u, v in edges:
        succ.setdefault(u, []).append(v)
    out: List[List[int]] = []

    def walk(node, path: List[int]) -> None:
        if node == "END":
            out.append(sorted(path))
            return
        for nxt in succ.get(node, []):
            walk(nxt, path + ([nxt] if nxt != "END" else []))

    walk("START", [])
    return out


def filtered_enumerate(nodes: Sequence[Tuple[int, int, int, float]], transitions=None) -> Enumeration:
    """Enumerate the paths of a filtered graph: ``nodes`` are ``(start, end_inclusive, label,
    score)``; a path is a maximal set of pairwise non-overlapping nodes, scored by its nodes'
    scores plus, with ``transitions`` (``[C + 1][C + 1]``, row C = START, column C = END), the
    transitions START -> first, between consecutive nodes and last -> END (none for the empty
    path). Paths are tuples of node indices in start order; ``marginals`` is ``float64 [n]``."""
    trans = _nested(transitions)
    paths = []
    for subset in maximal_nonoverlapping_sets([(s, e) for s, e, _, _ in nodes]):
        chosen = tuple(sorted(subset, key=lambda k: nodes[k][0]))
        total = sum(nodes[k][3] for k in chosen)
        if trans is not None and chosen:
            C = len(trans) - 1
            labels = [C] + [nodes[k][2] for k in chosen] + [C]
            total += sum(trans[p][q] for p, q in zip(labels, labels[1:]))
        paths.append((chosen, total))
    return _summarise(paths, (len(nodes),), lambda k: (k,))
