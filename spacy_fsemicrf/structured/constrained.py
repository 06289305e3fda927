"""Exact decoding under constraints (:mod:`.constraints`) for the three heads.

Each function takes what the head computes for a batch and a list with one
:class:`~.constraints.DocConstraints` (or None) per document, and returns the entities and one
:class:`ConstraintReport` per constrained document. For each such document:

1. if the unconstrained best path satisfies every constraint (and, in the filtered head, the
   token-level constraints leave the node set as it was), it is the constrained optimum too:
   status ``"satisfied"``, no search;
2. otherwise an exact search over the product of the paths and the constraints' automaton
   (:mod:`.pathsearch` for the filtered graph, :mod:`.lattice` for the others) finds the best
   path that satisfies them: status ``"optimal"``;
3. if no path satisfies the constraints, the unconstrained result stands, with status
   ``"infeasible"`` (never an exception: the component warns).

In the filtered head a path is a maximal set of non-overlapping nodes; a constraint that wants
fewer entities of a label may leave nodes of that label off the path (the filter kept them,
the constraint overrules it), and the search uses as few such *drops* as possible: a path that
needs none always wins. The other heads' paths already include every segmentation.
"""
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy
import torch

from . import filtered, itemgraphs
from .compaction import to_host
from .constraints import DocConstraints, padded_sentence_index, satisfies, sentence_index
from .lattice import lattice_search
from .linear_crf import TagScheme, crf_viterbi, tags_to_spans
from .pathsearch import search
from .semicrf import semicrf_viterbi

Span = Tuple[int, int, int]  # (start, end inclusive, label)


class ConstraintReport(NamedTuple):
    """The solver's outcome on one document.

    ``status``: "satisfied" (the unconstrained best path obeys the constraints), "optimal"
    (the search found the best path that obeys them) or "infeasible" (none does: the
    unconstrained result is kept). ``score`` is the returned path's score, ``unconstrained``
    the unconstrained best score; ``searched`` whether the exact search ran, over ``states``
    automaton states; ``dropped``: nodes the filtered head left off its path for a
    constraint; ``reason``: why an infeasible document has no such path ("" otherwise)."""

    status: str
    score: float
    unconstrained: float
    searched: bool = False
    states: int = 1
    dropped: int = 0
    reason: str = ""


# why a search that ran found no path (the token-level conflicts have their own reasons)
NO_FILTERED_PATH = ("no path through the spans the filter kept obeys the count and pair "
                    "constraints (one may ask for an entity the filter did not keep)")
NO_SEGMENTATION = "no segmentation obeys the count and pair constraints together"


class ConstrainedDecode(NamedTuple):
    """``spans`` ``LongTensor[N, 4]`` rows ``(doc, start, end inclusive, label)`` sorted by
    ``(doc, start)``; ``reports`` one per document (None where it had no constraints);
    ``node`` (filtered head) each row's position in the input node list, -1 for a forced span
    that was not a node."""

    spans: torch.Tensor
    reports: List[Optional[ConstraintReport]]
    node: Optional[torch.Tensor] = None


def _active(doc: Optional[DocConstraints]) -> bool:
    return doc is not None and not doc.program.empty


def _check_count(constraints: Sequence[Optional[DocConstraints]], batch: int) -> None:
    """A ``ValueError`` unless there is one entry (constraints or None) per document: with
    fewer, the documents past the list were decoded without their constraints."""
    if len(constraints) != batch:
        raise ValueError(
            f"constraints must have one entry (or None) per document: {len(constraints)} "
            f"entries for {batch} documents"
        )


def empty_document_report(doc: Optional[DocConstraints]) -> Optional[ConstraintReport]:
    """The report of a document without tokens (None without constraints): its one
    segmentation, the empty one, obeys them or none does."""
    if not _active(doc):
        return None
    states = doc.program.automaton.n_states
    if satisfies(doc.program, [], 0, doc.sentence_starts):
        return ConstraintReport("satisfied", 0.0, 0.0, False, states)
    reason = itemgraphs.force_conflict(doc.program, 0, None) or NO_SEGMENTATION
    return ConstraintReport("infeasible", 0.0, 0.0, False, states, reason=reason)


def _doc_ranges(doc_column: numpy.ndarray, batch: int) -> numpy.ndarray:
    """``[B + 1]``: where each document's rows start in a list sorted by document."""
    return numpy.searchsorted(doc_column, numpy.arange(batch + 1))


def _spans_by_doc(spans: torch.Tensor, batch: int) -> List[List[Span]]:
    rows = spans.cpu().numpy()
    ranges = _doc_ranges(rows[:, 0], batch)
    return [[tuple(r) for r in rows[ranges[b] : ranges[b + 1], 1:].tolist()] for b in range(batch)]


def _as_tensor(per_doc: Sequence[Sequence[Span]], device) -> torch.Tensor:
    rows = [(b, s, e, c) for b, spans in enumerate(per_doc) for s, e, c in sorted(spans)]
    return torch.tensor(rows, dtype=torch.long).view(-1, 4).to(device)


# ----------------------------------------------------------------------------- filtered


@torch.no_grad()
def filtered_constrained(
    nodes: filtered.NodeSet,
    lengths: torch.Tensor,
    transitions: Optional[torch.Tensor],
    constraints: Sequence[Optional[DocConstraints]],
    best: Optional[torch.Tensor] = None,
    global_scores: Optional[torch.Tensor] = None,
) -> ConstrainedDecode:
    """Constrained decoding of a filtered head's :class:`~.filtered.NodeSet`.

    ``best`` (``BoolTensor[n]``, from :func:`~.filtered.decode_node_set`) saves the
    unconstrained decode; ``global_scores`` (``[B, L, K, C]``) scores forced spans that are
    not nodes (without it they score 0)."""
    B, L, K = nodes.shape
    _check_count(constraints, B)
    if best is None:
        T = None if transitions is None else transitions.detach().to(nodes.scores.dtype)
        best, _ = filtered.decode_node_set(nodes, T, marginals=False)
    rows = nodes.spans().cpu().numpy()
    scores = to_host(nodes.scores)
    keep = best.cpu().numpy().copy()
    T = to_host(transitions)
    ranges = _doc_ranges(rows[:, 0], B)
    doc_lengths = lengths.tolist()
    extra: List[Tuple[int, int, int, int]] = []
    reports: List[Optional[ConstraintReport]] = [None] * B
    for b, doc in enumerate(constraints):
        if not _active(doc):
            continue
        lo, hi, length, program = ranges[b], ranges[b + 1], doc_lengths[b], doc.program
        on_path = numpy.flatnonzero(keep[lo:hi])
        viterbi = [tuple(r) for r in rows[lo:hi][on_path, 1:].tolist()]
        viterbi_score = _chain_score(scores[lo:hi][on_path], [r[2] for r in viterbi], T)
        items = None
        if program.forbids or program.forces or doc.closed_starts:  # may change the node set
            force_score = None
            if global_scores is not None:
                force_score = lambda s, e, c, b=b: float(global_scores[b, s, e - s, c])  # noqa
            items = itemgraphs.filtered_items(
                rows[lo:hi, 1:], scores[lo:hi], length, K, program, force_score,
                doc.closed_starts)
        if (items is None or not items.changed) and satisfies(
            program, viterbi, length, doc.sentence_starts, doc.closed_starts
        ):
            states = program.automaton.n_states
            reports[b] = ConstraintReport("satisfied", viterbi_score, viterbi_score, False, states)
            continue
        if items is None:
            items = itemgraphs.filtered_items(rows[lo:hi, 1:], scores[lo:hi], length, K, program)
        path, reports[b] = _search_filtered(items, T, doc, length, viterbi_score)
        if path is None:
            continue
        keep[lo:hi] = False
        for i in path:
            j = int(items.origin[i])
            if j >= 0:
                keep[lo + j] = True
            else:
                g = items.graph
                extra.append((b, int(g.starts[i]), int(g.ends[i]), int(g.symbols[i])))
    chosen = numpy.flatnonzero(keep)
    added = numpy.array(extra, dtype=numpy.int64).reshape(-1, 4)
    all_rows = numpy.concatenate([rows[chosen], added])
    node = numpy.concatenate([chosen, numpy.full(len(extra), -1)])
    order = numpy.lexsort((all_rows[:, 1], all_rows[:, 0]))
    device = nodes.index.device
    spans = torch.from_numpy(all_rows[order]).to(device)
    return ConstrainedDecode(spans, reports, torch.from_numpy(node[order]).to(device))


def _chain_score(scores: numpy.ndarray, labels: List[int], T: Optional[numpy.ndarray]) -> float:
    """Score of a path of nodes (``scores``, ``labels`` in order): the nodes' scores plus the
    transitions from START, between them and to END (none for the empty path)."""
    total = float(scores.sum())
    if T is None or not labels:
        return total
    C = T.shape[0] - 1
    return total + float(T[[C] + labels, labels + [C]].sum())


def _search_filtered(
    items: itemgraphs.DocItems,
    T: Optional[numpy.ndarray],
    doc: DocConstraints,
    length: int,
    viterbi_score: float,
) -> Tuple[Optional[Tuple[int, ...]], ConstraintReport]:
    """The best path obeying the constraints (its items, or None when there is none) and the
    report."""
    states = doc.program.automaton.n_states
    if items.conflict:
        return None, ConstraintReport("infeasible", viterbi_score, viterbi_score, False, states,
                                      reason=items.conflict)
    sentence = sentence_index(length, doc.sentence_starts)
    graph, automaton = items.graph, doc.program.automaton
    # A path without drops always wins, and its search only reads the few ends after the
    # last firm node: try those paths first, and allow drops only when none obeys.
    found = search(graph._replace(droppable=None), T, automaton, sentence, k=1)
    if not found.paths and graph.droppable is not None and graph.droppable.any():
        found = search(graph, T, automaton, sentence, k=1)
    if not found.paths:
        return None, ConstraintReport("infeasible", viterbi_score, viterbi_score, True, states,
                                      reason=NO_FILTERED_PATH)
    path = found.paths[0]
    report = ConstraintReport("optimal", path.score, viterbi_score, True, states, path.drops)
    return path.items, report


# ----------------------------------------------------------------------------- lattices


def _lattice_constrained(
    scores: numpy.ndarray,
    lengths: numpy.ndarray,
    T: Optional[numpy.ndarray],
    symbols: numpy.ndarray,
    constraints: Sequence[Optional[DocConstraints]],
    viterbi: List[List[Span]],
    viterbi_scores: numpy.ndarray,
    valid,
    to_spans,
) -> Tuple[List[List[Span]], List[Optional[ConstraintReport]]]:
    """The semi-CRF / CRF recipe: the documents whose unconstrained best path breaks a
    constraint are searched in batches that share a program. ``scores [B, L, W, C]``;
    ``valid(b, doc)`` gives ``(mask [L, W, C], conflict)``; ``to_spans(items)`` the
    entities of a lattice path."""
    B, L = scores.shape[:2]
    out = list(viterbi)
    reports: List[Optional[ConstraintReport]] = [None] * B
    batches: Dict[int, List[Tuple[int, numpy.ndarray]]] = {}
    for b, doc in enumerate(constraints):
        if not _active(doc):
            continue
        length, unconstrained = int(lengths[b]), float(viterbi_scores[b])
        states = doc.program.automaton.n_states
        if satisfies(doc.program, viterbi[b], length, doc.sentence_starts, doc.closed_starts):
            reports[b] = ConstraintReport("satisfied", unconstrained, unconstrained, False, states)
            continue
        mask, conflict = valid(b, doc)
        if conflict:
            reports[b] = ConstraintReport("infeasible", unconstrained, unconstrained, False, states,
                                          reason=conflict)
            continue
        batches.setdefault(id(doc.program), []).append((b, mask))
    for batch in batches.values():
        docs = [b for b, _ in batch]
        program = constraints[docs[0]].program
        masked = numpy.where(numpy.stack([m for _, m in batch]), scores[docs], -numpy.inf)
        sentence = numpy.stack([
            padded_sentence_index(int(lengths[b]), L, constraints[b].sentence_starts) for b in docs
        ])
        found = lattice_search(
            masked, lengths[docs], T, symbols, program.automaton, sentence, k=1
        )
        states = program.automaton.n_states
        for b, paths in zip(docs, found):
            plain = float(viterbi_scores[b])
            if not paths:
                reports[b] = ConstraintReport("infeasible", plain, plain, True, states,
                                              reason=NO_SEGMENTATION)
                continue
            score, items = paths[0]
            out[b] = to_spans(items)
            reports[b] = ConstraintReport("optimal", score, plain, True, states)
    return out, reports


@torch.no_grad()
def semicrf_constrained(
    scores: torch.Tensor,
    lengths: torch.Tensor,
    transitions: Optional[torch.Tensor],
    constraints: Sequence[Optional[DocConstraints]],
    viterbi: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
) -> ConstrainedDecode:
    """Constrained decoding of the exact semi-CRF's segment scores ``[B, L, K, C]``;
    ``viterbi`` (the ``(spans, best)`` of :func:`~.semicrf.semicrf_viterbi`) saves the
    unconstrained decode."""
    B, L, K, C = scores.shape
    _check_count(constraints, B)
    if viterbi is None:
        viterbi = semicrf_viterbi(scores, lengths, transitions)
    lengths_np = lengths.cpu().numpy()
    host = to_host(scores)

    def valid(b, doc):
        return itemgraphs.semicrf_valid(
            int(lengths_np[b]), (L, K, C), doc.program, doc.closed_starts)

    def to_spans(items):
        return [(s, s + w, c) for s, w, c in items if c > 0]

    spans, reports = _lattice_constrained(
        host, lengths_np, to_host(transitions), numpy.arange(C), constraints,
        _spans_by_doc(viterbi[0], B), to_host(viterbi[1]), valid, to_spans,
    )
    return ConstrainedDecode(_as_tensor(spans, scores.device), reports)


@torch.no_grad()
def crf_constrained(
    emissions: torch.Tensor,
    transitions: torch.Tensor,
    lengths: torch.Tensor,
    scheme: TagScheme,
    constraints: Sequence[Optional[DocConstraints]],
    allowed: Optional[torch.Tensor] = None,
    viterbi: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
) -> ConstrainedDecode:
    """Constrained decoding of a linear CRF (``emissions [B, L, n_tags]``); ``viterbi`` (the
    ``(tags, best)`` of :func:`~.linear_crf.crf_viterbi`) saves the unconstrained decode. The
    constraints count the entities of the tag sequence (an entity opens at a B tag, or U in
    BILUO)."""
    B, L, n_tags = emissions.shape
    _check_count(constraints, B)
    if viterbi is None:
        viterbi = crf_viterbi(emissions, transitions, lengths, allowed)
    lengths_np = lengths.cpu().numpy()
    host = to_host(emissions)[:, :, None, :]
    T = itemgraphs.crf_transitions(transitions, allowed)

    def valid(b, doc):
        mask, conflict = itemgraphs.crf_valid(
            int(lengths_np[b]), L, scheme, doc.program, doc.closed_starts)
        return mask[:, None, :], conflict

    def to_spans(items):
        return list(itemgraphs.crf_tags_to_spans([c for _, _, c in items], scheme))

    plain = _spans_by_doc(tags_to_spans(viterbi[0], lengths, scheme), B)
    spans, reports = _lattice_constrained(
        host, lengths_np, T, itemgraphs.crf_symbols(scheme), constraints, plain,
        to_host(viterbi[1]), valid, to_spans,
    )
    return ConstrainedDecode(_as_tensor(spans, emissions.device), reports)
