"""Brute-force references for constrained decoding and n-best, by explicit enumeration.

Independent of the library's automaton and masks: constraints are checked by counting entities
per document and per sentence (:func:`plain_ok`), and every path / segmentation / tag sequence
of a tiny document is listed (with the enumerators of :mod:`tests.bruteforce`) and scored in
plain Python.
"""
import random
from typing import List, Optional, Sequence, Tuple

import torch

from spacy_fsemicrf.structured.constraints import (
    AtLeast,
    AtMost,
    Constraint,
    DocConstraints,
    Exactly,
    Excludes,
    ForbidLabels,
    ForceSpan,
    Requires,
    compile_constraints,
)

from .bruteforce import (
    entities_by_definition,
    nonoverlapping_sets,
    overlap,
    segmentation_score,
    segmentations,
    tag_sequence_score,
    tag_sequences,
)

Span = Tuple[int, int, int]  # (start, end inclusive, label id)


def sentence_groups(spans: Sequence[Span], length: int, starts: Sequence[int]) -> List[List[Span]]:
    """The entities of each sentence (by their first token); every sentence listed."""
    bounds = sorted({0} | {s for s in starts if 0 < s < length}) if length else []
    groups: List[List[Span]] = [[] for _ in bounds]
    for span in spans:
        index = max(i for i, b in enumerate(bounds) if b <= span[0])
        groups[index].append(span)
    return groups


def plain_ok(
    constraints: Sequence[Constraint],
    labels: Sequence[str],
    spans: Sequence[Span],
    length: int,
    sentence_starts: Sequence[int] = (),
    closed_starts: Sequence[int] = (),
) -> bool:
    """Whether ``spans`` obey every constraint, by direct counting, and none but a forced span
    starts on a token of ``closed_starts``."""
    name = {i + 1: n for i, n in enumerate(labels)}
    forced = {(c.start, c.end - 1, labels.index(c.label) + 1)
              for c in constraints if isinstance(c, ForceSpan)}
    if any(s in closed_starts and (s, e, lab) not in forced for s, e, lab in spans):
        return False
    for c in constraints:
        if isinstance(c, ForbidLabels):
            lo = c.start or 0
            hi = length if c.end is None else c.end
            for s, e, lab in spans:
                if s < hi and e >= lo and (c.labels is None or name[lab] in c.labels):
                    return False
            continue
        if isinstance(c, ForceSpan):
            if (c.start, c.end - 1, labels.index(c.label) + 1) not in set(spans):
                return False
            continue
        scopes = [list(spans)]
        if c.scope == "sentence":
            scopes = sentence_groups(spans, length, sentence_starts)
        for scope in scopes:
            count = lambda x: sum(name[lab] == x for _, _, lab in scope)  # noqa: E731
            if isinstance(c, AtMost) and count(c.label) > c.n:
                return False
            if isinstance(c, Exactly) and count(c.label) != c.n:
                return False
            if isinstance(c, AtLeast) and count(c.label) < c.n:
                return False
            if isinstance(c, Excludes) and count(c.label) and count(c.other):
                return False
            if isinstance(c, Requires) and count(c.label) and not count(c.other):
                return False
    return True


def written_ok(
    constraints: Sequence[Constraint],
    labels: Sequence[str],
    spans: Sequence[Span],
    length: int,
    sentence_starts: Sequence[int] = (),
    spaces: Sequence[int] = (),
) -> bool:
    """Whether ``spans`` obey every constraint once trimmed of the tokens ``spaces`` at their
    edges (those of them only dropped; forced spans as they are), by direct counting."""
    forced = {(c.start, c.end - 1, labels.index(c.label) + 1)
              for c in constraints if isinstance(c, ForceSpan)}
    written = [span for span in spans if span in forced]
    for s, e, lab in spans:
        words = [t for t in range(s, e + 1) if t not in spaces]  # its tokens but spaces
        if (s, e, lab) not in forced and words:
            written.append((words[0], words[-1], lab))
    return plain_ok(constraints, labels, written, length, sentence_starts)


def random_constraints(
    rng: random.Random, labels: Sequence[str], length: int, n_count: int, token_level: bool
) -> List[Constraint]:
    """``n_count`` count-type constraints and, with ``token_level``, maybe a forbidden range
    and a forced span (which may be impossible: past the end, too wide, forbidden)."""
    out: List[Constraint] = []
    for _ in range(n_count):
        kind = rng.choice(["at_most", "exactly", "at_least", "excludes", "requires"])
        scope = rng.choice(["doc", "sentence"])
        if kind in ("excludes", "requires") and len(labels) > 1:
            a, b = rng.sample(list(labels), 2)
            out.append((Excludes if kind == "excludes" else Requires)(a, b, scope))
        else:
            cls = {"at_most": AtMost, "exactly": Exactly}.get(kind, AtLeast)
            out.append(cls(rng.choice(labels), rng.randint(0, 2), scope))
    if token_level and length:
        # a generator of its own for how the range is written, so that the draws of rng stay
        # those of the seeds that tests pin as examples
        written = random.Random(str(rng.getstate()))
        if rng.random() < 0.5:
            start = rng.randrange(length)
            end = rng.randint(start + 1, length)
            which = None if rng.random() < 0.3 else (rng.choice(labels),)
            # the same range with an open start or end (None: from the first token, to the last)
            start = None if start == 0 and written.random() < 0.5 else start
            end = None if end == length and written.random() < 0.5 else end
            out.append(ForbidLabels(which, start, end))
        if rng.random() < 0.5:
            start = rng.randrange(length)
            out.append(ForceSpan(start, rng.randint(start + 1, length + 1), rng.choice(labels)))
    return out


def random_sentence_starts(rng: random.Random, length: int) -> Tuple[int, ...]:
    if length < 2:
        return ()
    return tuple(sorted(rng.sample(range(1, length), rng.randint(0, length - 1))))


def random_doc_constraints(
    rng: random.Random, labels: Sequence[str], length: int, closed: bool = False
):
    """``(constraints, sentence starts, DocConstraints or None)`` for one document: up to 3
    count constraints, token-level ones half of the time; with ``closed``, tokens where no
    entity may start half of the time (``doc.closed_starts``)."""
    constraints = random_constraints(rng, labels, length, rng.randint(0, 3), rng.random() < 0.5)
    starts = random_sentence_starts(rng, length)
    if not constraints:
        return constraints, starts, None
    shut: Tuple[int, ...] = ()
    if closed:  # a generator of its own: the draws of rng stay those of the pinned examples
        own = random.Random(str(rng.getstate()))
        if own.random() < 0.5:
            shut = tuple(sorted(own.sample(range(length), own.randint(0, length))))
    doc = DocConstraints(compile_constraints(constraints, labels), starts, shut)
    return constraints, starts, doc


def maybe_transitions(rng: random.Random, gen: torch.Generator, size: int):
    """A random ``[size, size]`` transition matrix half of the time, else None."""
    if rng.random() < 0.5:
        return None
    return torch.randn((size, size), generator=gen, dtype=torch.float64)


def droppable_labels(constraints: Sequence[Constraint], labels: Sequence[str]) -> set:
    """Label ids a constraint may want fewer of (the filtered head may leave their nodes off)."""
    out = set()
    for c in constraints:
        if isinstance(c, (AtMost, Exactly)):
            out.add(c.label)
        elif isinstance(c, Excludes):
            out |= {c.label, c.other}
        elif isinstance(c, Requires):
            out.add(c.label)
    return {labels.index(x) + 1 for x in out}


def filtered_reference(
    nodes: List[Tuple[int, int, int, float]],
    transitions: Optional[List[List[float]]],
    length: int,
    max_width: int,
    constraints: Sequence[Constraint],
    labels: Sequence[str],
    sentence_starts: Sequence[int],
    force_score,
    closed_starts: Sequence[int] = (),
) -> Optional[Tuple[int, float, List[Span]]]:
    """The filtered head's constrained optimum ``(drops, score, spans)``, None if infeasible.

    Nodes ``(start, end, label, score)``; forbidden nodes, and those starting on a token of
    ``closed_starts`` that are no forced span, are removed; a forced span removes
    the nodes overlapping it and is a node (scored ``force_score(start, end, label)`` unless it
    already was one). Paths: non-overlapping node sets that leave no non-droppable node in a
    gap; drops: droppable nodes in the gaps. Best: fewest drops, then highest score."""
    ids = {n: i + 1 for i, n in enumerate(labels)}
    forbids = [c for c in constraints if isinstance(c, ForbidLabels)]
    forced = set()
    forces = sorted(
        {(c.start, c.end - 1, ids[c.label]) for c in constraints if isinstance(c, ForceSpan)}
    )
    V = [v for v in nodes if plain_ok(forbids, labels, [v[:3]], length)
         and (v[0] not in closed_starts or v[:3] in forces)]
    for i, f in enumerate(forces):
        if f[1] >= length or f[1] - f[0] >= max_width or (i and overlap(forces[i - 1], f)):
            return None
        if not plain_ok(forbids, labels, [f], length):
            return None
        same = [v for v in V if v[:3] == f]
        V = [v for v in V if not overlap(v, f) or v[:3] == f]
        if not same:
            V.append(f + (force_score(*f),))
        forced.add(f)
    drop = droppable_labels(constraints, labels)
    droppable = [v[2] in drop and v[:3] not in forced for v in V]
    best = None
    for chosen in nonoverlapping_sets(V):
        path = [V[i] for i in chosen]
        outside = [
            i for i in range(len(V)) if i not in chosen and not any(overlap(V[i], p) for p in path)
        ]
        if any(not droppable[i] for i in outside):
            continue
        spans = [v[:3] for v in path]
        if not plain_ok(constraints, labels, spans, length, sentence_starts, closed_starts):
            continue
        score = sum(v[3] for v in path)
        if transitions is not None and path:
            C = len(transitions) - 1
            labs = [C] + [v[2] for v in path] + [C]
            score += sum(transitions[a][b] for a, b in zip(labs, labs[1:]))
        key = (-len(outside), score)
        if best is None or key > best[0]:
            best = (key, spans)
    return None if best is None else (-best[0][0], best[0][1], best[1])


def semicrf_reference(
    scores, transitions, length, constraints, labels, sentence_starts, k=None, closed_starts=()
):
    """Every segmentation obeying the constraints (no entity but a forced one starting on a
    token of ``closed_starts``), as ``(score, entity spans)``, best first."""
    L, K, C = len(scores), len(scores[0]), len(scores[0][0])
    out = []
    for segs in segmentations(length, K, C):
        spans = [s for s in segs if s[2] > 0]
        if plain_ok(constraints, labels, spans, length, sentence_starts, closed_starts):
            out.append((segmentation_score(scores, segs, transitions), spans))
    return sorted(out, key=lambda x: -x[0])


def crf_reference(
    emissions, transitions, allowed, scheme, length, constraints, labels, sentence_starts,
    closed_starts=(),
):
    """Every valid tag sequence obeying the constraints (no entity but a forced one starting
    on a token of ``closed_starts``), as ``(score, entity spans, tags)``, best first."""
    out = []
    for tags in tag_sequences(length, scheme.n_tags, allowed):
        spans = entities_by_definition(tags, scheme.names, scheme.scheme)
        if plain_ok(constraints, labels, spans, length, sentence_starts, closed_starts):
            out.append((tag_sequence_score(emissions, transitions, tags), spans, tags))
    return sorted(out, key=lambda x: -x[0])
