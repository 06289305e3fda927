"""Exact k-best search over the paths of one document's node graph, times an automaton.

*Items* are labelled intervals of tokens (the filtered head's nodes, plus forced spans), and a
*path* is a set of pairwise non-overlapping items that is maximal among the non-droppable ones:
no non-droppable item lies in a gap of the path (Liang et al., 1991; docs/algorithm.md). A path
scores the sum of its items' scores plus the transitions ``T[leave(prev), enter(next)]`` (row H
= START, column H = END; ``-inf`` forbids a transition; the empty path scores 0).

Droppable items (nodes of a label some constraint may want fewer of) may also sit in a gap;
each one that does costs one *drop*, and paths are ranked by the fewest drops first, then by
score (a drop enters the value as ``-BIG``, with ``BIG`` more than any score difference). So a
path that needs no drop always wins, and with no droppable item this is the plain best path.

The search is the position scan of docs/algorithm.md with a *state* and a *rank* axis:
``A[e][(h, q)]`` holds the ``k`` best prefixes ending at ``e`` in channel ``h`` that leave the
automaton (:class:`~.constraints.Automaton`) in state ``q``. The items starting at ``s`` read
the ends in ``[P(s), s - 1]`` (``P`` over the non-droppable items), crossing the sentence starts
on the way, take the transition into their channel, step the automaton on their symbol and
cross the sentence starts inside them. It enumerates the product of the path graph and the
automaton, so it is exact, with no relaxation and no branching. A filtered graph has about one
node per entity, so the scan is plain Python over short lists (a NumPy call per step would cost
more than the step); the lattices of the other heads go to :mod:`.lattice`.
"""
from bisect import bisect_left, bisect_right, insort
from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy

from .constraints import Automaton, no_constraints

NEG_INF = -numpy.inf


class ItemGraph(NamedTuple):
    """One document's items, all ``[n]``: ``starts`` / ``ends`` (inclusive) in tokens,
    ``symbols`` the entity label the automaton reads (0: none), ``enter`` / ``leave`` the
    transition column into and the row out of each item, ``scores``; ``droppable`` (or None)
    marks the items that may lie in a gap at the cost of a drop. ``length`` is the document's.
    """

    starts: numpy.ndarray
    ends: numpy.ndarray
    symbols: numpy.ndarray
    enter: numpy.ndarray
    leave: numpy.ndarray
    scores: numpy.ndarray
    length: int
    droppable: Optional[numpy.ndarray] = None


class Path(NamedTuple):
    """A path found by :func:`search`: its items (indices into the graph, in order), its score
    and the number of droppable items it leaves in its gaps."""

    items: Tuple[int, ...]
    score: float
    drops: int


class SearchResult(NamedTuple):
    """The k best paths, best first (fewer than k when fewer exist; none when no path
    satisfies the automaton), and the number of states of the automaton."""

    paths: List[Path]
    states: int


def path_score(graph: ItemGraph, T: Optional[numpy.ndarray], items: Sequence[int]) -> float:
    """Score of the path through ``items`` (in order): item scores plus transitions."""
    if not len(items):
        return 0.0
    total = float(graph.scores[list(items)].sum())
    if T is None:
        return total
    H = T.shape[0] - 1
    rows = [H] + [int(graph.leave[i]) for i in items]
    cols = [int(graph.enter[i]) for i in items] + [H]
    return total + float(T[rows, cols].sum())


class _Problem:
    """What the scan reads: the items sorted by (start, end), the transitions (a zero
    ``[2, 2]`` matrix without them), the automaton, the sentence index of each position, the
    bound ``P(s)`` over the non-droppable items and the value ``big`` of a drop."""

    def __init__(self, graph: ItemGraph, transitions, automaton, sentence) -> None:
        n = len(graph.scores)
        self.auto = automaton if automaton is not None else no_constraints()
        self.order = order = numpy.lexsort((graph.ends, graph.starts))
        self.starts, self.ends = graph.starts[order], graph.ends[order]
        self.scores = graph.scores[order].astype(numpy.float64)
        zeros = numpy.zeros(n, dtype=numpy.int64)
        self.symbols = graph.symbols[order] if automaton is not None else zeros
        if transitions is None:
            self.T = numpy.zeros((2, 2))
            self.enter = self.leave = zeros
        else:
            self.T = numpy.array(transitions, dtype=numpy.float64)
            self.enter, self.leave = graph.enter[order], graph.leave[order]
        self.H = self.T.shape[0] - 1
        self.T[self.H, self.H] = 0.0  # START -> END: the empty path, which takes no transition
        self.sentence = sentence
        self.length = graph.length
        droppable = None if graph.droppable is None else graph.droppable[order]
        self.droppable = droppable if droppable is not None and droppable.any() else None
        firm = numpy.ones(n, dtype=bool) if self.droppable is None else ~self.droppable
        by_end = numpy.argsort(self.ends[firm], kind="stable")
        self.firm_ends = self.ends[firm][by_end].tolist()
        self.firm_best_start = numpy.maximum.accumulate(self.starts[firm][by_end]).tolist()
        self.big = 0.0
        if self.droppable is not None:
            finite = self.T[numpy.isfinite(self.T)]
            bound = numpy.abs(self.scores).sum() + (n + 1) * numpy.abs(finite).max(initial=0.0)
            self.big = 2.0 * float(bound) + 1.0  # more than any two paths' score difference

    def dropped(self) -> List[Tuple[int, int]]:
        """``(end, start)`` of the droppable items, sorted."""
        if self.droppable is None:
            return []
        ends, starts = self.ends[self.droppable], self.starts[self.droppable]
        return sorted(zip(ends.tolist(), starts.tolist()))

    def bound(self, s: int) -> int:
        """``P(s)``: the largest start of a non-droppable item ending before ``s`` (-1: none)."""
        i = bisect_left(self.firm_ends, s)
        return self.firm_best_start[i - 1] if i else -1

    def groups(self):
        """``(start, lo, hi)``: the items starting at each position are ``lo..hi - 1``."""
        n = len(self.starts)
        first = numpy.flatnonzero(numpy.diff(self.starts, prepend=-1)) if n else []
        bounds = numpy.r_[first, n].astype(numpy.int64)
        return zip(self.starts[bounds[:-1]].tolist(), bounds[:-1].tolist(), bounds[1:].tolist())


def check_k(k: int) -> None:
    """A ``ValueError`` unless ``k``, the number of paths a search keeps, is an integer >= 1
    (NumPy's included): a float raised a ``TypeError`` from a slice deep in the search."""
    if isinstance(k, bool) or not isinstance(k, (int, numpy.integer)) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")


def search(
    graph: ItemGraph,
    transitions: Optional[numpy.ndarray],
    automaton: Optional[Automaton],
    sentence: numpy.ndarray,
    k: int = 1,
) -> SearchResult:
    """The ``k`` best paths of ``graph`` accepted by ``automaton`` (None: no constraint).

    ``transitions`` is ``[H + 1, H + 1]`` (None: no transition scores); ``sentence`` is the
    sentence index of each position ``0..length`` (:func:`~.constraints.sentence_index`).
    """
    check_k(k)
    problem = _Problem(graph, transitions, automaton, sentence)
    found = _scan(problem, k)
    T = None if transitions is None else problem.T
    paths = []
    for value, items in found:
        original = tuple(int(problem.order[i]) for i in items)
        score = path_score(graph, T, original)
        drops = int(round((score - value) / problem.big)) if problem.big else 0
        paths.append(Path(original, score, drops))
    return SearchResult(paths, problem.auto.n_states)


def _scan(p: _Problem, k: int):
    """``A[end][(channel, state)]`` is a best-first list of up to k ``(value, item, item
    rank)``; ``back[item][state]`` one of up to k ``(value, end, channel, state, rank)``, the
    A entries the item's entries extend. Returns the k best ``(value, items)``."""
    starts, ends = p.starts.tolist(), p.ends.tolist()
    symbols, scores = p.symbols.tolist(), p.scores.tolist()
    enter, leave = p.enter.tolist(), p.leave.tolist()
    sent = p.sentence.tolist()
    T, H = p.T.tolist(), p.H
    move, combined, final = p.auto.move.tolist(), p.auto.combined.tolist(), p.auto.final.tolist()
    end_values = sorted(set(ends))
    A: dict = {-1: {(H, 0): [(0.0, -1, 0)]}}
    back: list = [None] * len(starts)
    # the starts of the droppable items ending before the current position, sorted: those
    # after an end e lie in the gap from e to the current position
    dropped, next_drop = p.dropped(), 0
    gap_starts: list = []

    def gather(s: int, to: int, lo_end: int) -> dict:
        """The A entries ending in ``[lo_end, s - 1]`` (START too when ``lo_end`` is -1),
        moved across the sentence starts up to ``to``, with their gap's drop penalty: the k
        best ``(value, end, state in A, rank)`` per (channel, state after the move)."""
        nonlocal next_drop
        while next_drop < len(dropped) and dropped[next_drop][0] < s:
            insort(gap_starts, dropped[next_drop][1])
            next_drop += 1
        window = end_values[bisect_left(end_values, lo_end) : bisect_left(end_values, s)]
        if lo_end < 0:
            window = [-1] + window
        out: dict = {}
        for e in window:
            entries = A.get(e)
            if not entries:
                continue
            mv = move[min(2, sent[to] - sent[e + 1])]
            pen = -p.big * (len(gap_starts) - bisect_right(gap_starts, e)) if p.big else 0.0
            for (h, q), lst in entries.items():
                q2 = mv[q]
                if q2 >= 0:
                    for r, (val, _, _) in enumerate(lst):
                        _push(out, (h, q2), (val + pen, e, q, r), k)
        return out

    for s, lo, hi in p.groups():
        cands = gather(s, s, p.bound(s)).items()
        for v in range(lo, hi):
            col, sc = enter[v], scores[v]
            step = combined[symbols[v]][min(2, sent[ends[v] + 1] - sent[s])]
            best: dict = {}
            for (h, q2), lst in cands:
                q3 = step[q2]
                t = T[h][col]
                if q3 < 0 or t == NEG_INF:
                    continue
                for val, e, q, r in lst:
                    _push(best, q3, (val + t + sc, e, h, q, r), k)
            back[v] = best
            slot = A.setdefault(ends[v], {})
            for q3, lst in best.items():
                for r, entry in enumerate(lst):
                    _push(slot, (leave[v], q3), (entry[0], v, r), k)
    found = []
    for (h, q2), lst in gather(p.length, p.length, p.bound(p.length)).items():
        t = T[h][H]
        if final[q2] and t != NEG_INF:
            found += [(val + t, e, h, q, r) for val, e, q, r in lst]
    found.sort(key=lambda x: -x[0])
    out = []
    for value, e, h, q, r in found[:k]:
        items = []
        while e >= 0:
            _, v, rv = A[e][(h, q)][r]
            items.append(v)
            _, e, h, q, r = back[v][q][rv]
        out.append((value, items[::-1]))
    return out


def _push(table: dict, key, entry: tuple, k: int) -> None:
    """Insert ``entry`` into the best-first list ``table[key]`` of at most k (after equals)."""
    lst = table.get(key)
    if lst is None:
        table[key] = [entry]
    elif len(lst) < k or entry[0] > lst[-1][0]:
        i = len(lst)
        while i and lst[i - 1][0] < entry[0]:
            i -= 1
        lst.insert(i, entry)
        del lst[k:]
