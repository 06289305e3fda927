"""What the three heads search over, one document at a time, with the token-level constraints
(``forbid_labels``, ``force_span``) applied by removing items.

* Filtered semi-CRF: the kept nodes. A forbidden node is removed; a forced span removes every
  node that overlaps it and becomes a node itself (its global score read from the head's
  ``[L, K, C]`` global scores). Removing nodes changes the graph, so the paths are those of
  the reduced node set (what the filter would have kept without those nodes).
* Exact semi-CRF (a mask over its segments, for :mod:`.lattice`): forbidden entity segments
  and segments overlapping a forced span (other than it) are removed. Null segments stay, so
  the lattice's paths are exactly the segmentations that obey the constraints.
* Linear CRF (a mask over its tags): a forbidden label removes its tags on the range, a forced
  span keeps only its own tags on the span (and, in BIO, removes the tag that would continue
  it on the next token); the invalid transitions go to ``-inf``.

Each builder says why the constraints contradict each other on this document, if they do (a
forced span past the end or wider than the head allows, overlapping forced spans, a forced
span that is forbidden): then no path satisfies them. Each also removes the entities that
start on a token of ``closed_starts`` (a forced span excepted).
"""
from typing import Callable, NamedTuple, Optional, Sequence, Tuple

import numpy
import torch

from .constraints import ConstraintProgram, Forbid, Force
from .linear_crf import TagScheme
from .pathsearch import ItemGraph


class DocItems(NamedTuple):
    """One document's item graph; ``changed`` says whether the token-level constraints removed
    or added items (the closed starts aside: the entities are checked trimmed), ``conflict``
    why they cannot all hold ("" when they can); ``origin`` (filtered head) maps each item to
    its node in the input list, -1 for an added forced span."""

    graph: Optional[ItemGraph]
    changed: bool = False
    conflict: str = ""
    origin: Optional[numpy.ndarray] = None


def _forbidden(starts, ends, labels, forbid: Forbid, length: int) -> numpy.ndarray:
    """Items with an entity label of ``forbid`` that cover a token of its range (the
    arguments broadcast: item lists, or the axes of a grid)."""
    end = length - 1 if forbid.end is None else forbid.end
    hit = (starts <= end) & (ends >= forbid.start) & (labels > 0)
    if forbid.labels is not None:
        hit &= numpy.isin(labels, forbid.labels)
    return hit


def _is_forbidden(f: Force, forbids: Tuple[Forbid, ...], length: int) -> bool:
    """Whether a forbidden range covers the forced span ``f`` with its label."""
    one = [numpy.array([v]) for v in f]
    return any(bool(_forbidden(*one, x, length)[0]) for x in forbids)


def force_conflict(program: ConstraintProgram, length: int, max_width: Optional[int]) -> str:
    """Why the forced spans of ``program`` cannot all hold on a document of ``length`` tokens
    ("" when they can): one past the end, wider than ``max_width``, two overlapping, or one
    that a ``forbid_labels`` range forbids (offsets as the constraints give them)."""
    forces = program.forces
    for i, f in enumerate(forces):
        where = f"force_span {f.start}..{f.end + 1}"
        if f.end >= length:
            return f"{where} ends past the document's {length} tokens"
        if max_width is not None and f.end - f.start >= max_width:
            return f"{where} is wider than the head's max_width={max_width}"
        if i and forces[i - 1].end >= f.start:  # sorted by start
            return f"{where} overlaps force_span {forces[i - 1].start}..{forces[i - 1].end + 1}"
        if _is_forbidden(f, program.forbids, length):
            return f"{where} has a label that forbid_labels forbids there"
    return ""


def filtered_items(
    rows: numpy.ndarray,
    scores: numpy.ndarray,
    length: int,
    max_width: int,
    program: Optional[ConstraintProgram] = None,
    force_score: Optional[Callable[[int, int, int], float]] = None,
    closed_starts: Sequence[int] = (),
) -> DocItems:
    """The filtered graph of one document: ``rows [n, 3]`` its nodes ``(start, end, label)``,
    ``scores [n]``. ``force_score(start, end, label)`` scores forced spans that are not nodes
    (the head's global score; 0 without it). With a program, nodes of the labels a count constraint
    may want fewer of are droppable (:mod:`.pathsearch`), forced spans never; nodes starting on
    a token of ``closed_starts`` are removed."""
    starts, ends, labels = (rows[:, i].astype(numpy.int64) for i in range(3))
    scores = scores.astype(numpy.float64)
    origin = numpy.arange(len(scores))
    if program is None:
        graph = ItemGraph(starts, ends, labels, labels, labels, scores, length)
        return DocItems(graph, origin=origin)
    keep = numpy.ones(len(scores), dtype=bool)
    for f in program.forbids:
        keep &= ~_forbidden(starts, ends, labels, f, length)
    conflict = force_conflict(program, length, max_width)
    if conflict:
        return DocItems(None, True, conflict)
    sames = [(starts == f.start) & (ends == f.end) & (labels == f.label) for f in program.forces]
    forced = numpy.zeros(len(scores), dtype=bool)
    for same in sames:
        forced |= same
    added = []
    for f, same in zip(program.forces, sames):
        keep &= ~((starts <= f.end) & (ends >= f.start)) | same
        if not same.any():
            score = 0.0 if force_score is None else force_score(f.start, f.end, f.label)
            added.append((f.start, f.end, f.label, score))
    changed = bool(added) or not keep.all()
    keep &= ~numpy.isin(starts, closed_starts) | forced
    extra = numpy.array(added, dtype=numpy.float64).reshape(-1, 4)
    starts = numpy.concatenate([starts[keep], extra[:, 0].astype(numpy.int64)])
    ends = numpy.concatenate([ends[keep], extra[:, 1].astype(numpy.int64)])
    labels = numpy.concatenate([labels[keep], extra[:, 2].astype(numpy.int64)])
    scores = numpy.concatenate([scores[keep], extra[:, 3]])
    forced = numpy.concatenate([forced[keep], numpy.ones(len(added), dtype=bool)])
    origin = numpy.concatenate([origin[keep], numpy.full(len(added), -1)])
    droppable = program.automaton.droppable[labels] & ~forced
    graph = ItemGraph(starts, ends, labels, labels, labels, scores, length, droppable)
    return DocItems(graph, changed, "", origin)


def _grid(shape: Tuple[int, int, int]):
    L, K, C = shape
    return numpy.ogrid[:L, :K, :C]


def segments_inside(lengths: numpy.ndarray, shape: Tuple[int, int, int]) -> numpy.ndarray:
    """``[B, L, K, C]``: the segments that can occur in documents of ``lengths`` (inside them,
    null ones one token wide)."""
    s, w, c = _grid(shape)
    return (s + w < lengths[:, None, None, None]) & ((w == 0) | (c > 0))


def semicrf_valid(
    length: int,
    shape: Tuple[int, int, int],
    program: Optional[ConstraintProgram] = None,
    closed_starts: Sequence[int] = (),
) -> Tuple[numpy.ndarray, str]:
    """``(valid [L, K, C], conflict)``: the segments of a document of ``length`` tokens
    that may occur (inside it, null ones one token wide, obeying the token-level constraints,
    no entity starting on a token of ``closed_starts``) on the head's ``[L, K, C]`` grid."""
    s, w, c = _grid(shape)
    K = shape[1]
    valid = segments_inside(numpy.array([length]), shape)[0]
    if program is None:
        return valid, ""
    e = s + w
    for f in program.forbids:
        valid &= ~_forbidden(s, e, c, f, length)
    conflict = force_conflict(program, length, K)
    if conflict:
        return valid, conflict
    valid &= ~(numpy.isin(s, closed_starts) & (c > 0))
    for f in program.forces:
        own = (s == f.start) & (w == f.end - f.start) & (c == f.label)
        valid = valid & ~((s <= f.end) & (e >= f.start)) | own  # (own even on a closed start)
    return valid, ""


def crf_valid(
    length: int,
    L: int,
    scheme: TagScheme,
    program: Optional[ConstraintProgram] = None,
    closed_starts: Sequence[int] = (),
) -> Tuple[numpy.ndarray, str]:
    """``(valid [L, n_tags], conflict)``: the tags each token of a document of
    ``length`` tokens may take under the token-level constraints (none past the end), no
    tag opening an entity (B, U) on a token of ``closed_starts``."""
    labels = scheme.labels.numpy()
    t = numpy.arange(L)[:, None]
    valid = numpy.broadcast_to(t < length, (L, scheme.n_tags)).copy()
    if program is None:
        return valid, ""
    for f in program.forbids:
        valid &= ~_forbidden(t, t, labels, f, length)
    conflict = force_conflict(program, length, None)
    if conflict:
        return valid, conflict
    valid &= ~(numpy.isin(t, closed_starts) & (crf_symbols(scheme) > 0))
    for f in program.forces:
        own = numpy.zeros_like(valid)
        for pos, kind in _force_tags(f, scheme.scheme):
            own[pos, scheme.tag(kind, f.label)] = True
        valid = valid & ~((t >= f.start) & (t <= f.end)) | own  # (own even on a closed start)
        if f.end + 1 < length and scheme.scheme == "BIO":  # the entity ends at f.end
            valid[f.end + 1, scheme.tag("I", f.label)] = False
    return valid, ""  # O stays open outside the forced spans: every token keeps a tag


def crf_symbols(scheme: TagScheme) -> numpy.ndarray:
    """``[n_tags]``: the entity label a tag opens (B, or U in BILUO), 0 for the others."""
    opens = numpy.isin(numpy.array(scheme.kinds), ["B", "U"])
    return numpy.where(opens, scheme.labels.numpy(), 0)


def _force_tags(f: Force, scheme: str):
    """``(position, tag kind)`` of a forced entity's tags."""
    if scheme == "BILUO" and f.start == f.end:
        return [(f.start, "U")]
    tags = [(f.start, "B")] + [(p, "I") for p in range(f.start + 1, f.end + 1)]
    if scheme == "BILUO":
        tags[-1] = (f.end, "L")
    return tags


def crf_transitions(transitions: torch.Tensor, allowed: Optional[torch.Tensor]) -> numpy.ndarray:
    """The CRF's transitions on the host, with the invalid ones at ``-inf`` (not merely very
    unlikely): every path the search returns is then a valid tag sequence."""
    T = transitions.detach().double().cpu().numpy()
    return T if allowed is None else numpy.where(allowed.cpu().numpy(), T, -numpy.inf)


def crf_tags_to_spans(tags, scheme: TagScheme) -> Tuple[Tuple[int, int, int], ...]:
    """The entities ``(start, end, label)`` of a valid tag sequence."""
    kinds, labels = scheme.kinds, scheme.labels.tolist()
    out, open_at = [], None
    for t, y in enumerate(tags):
        kind = kinds[y]
        if open_at is not None and kind not in "IL":
            out.append((open_at, t - 1, labels[tags[open_at]]))
            open_at = None
        if kind in "BU":
            open_at = t
        if kind in "LU":
            out.append((open_at, t, labels[y]))
            open_at = None
    if open_at is not None:
        out.append((open_at, len(tags) - 1, labels[tags[open_at]]))
    return tuple(out)
