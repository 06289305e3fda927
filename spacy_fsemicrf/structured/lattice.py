"""Exact k-best search over a batch of *lattices* (the exact semi-CRF's segmentations, the
linear CRF's tag sequences), times a constraint automaton.

A lattice path covers tokens ``0..n-1`` with consecutive items: an item is ``(start, w, c)``
(tokens ``start..start + w``, channel ``c``) scored ``scores[b, start, w, c]`` (``-inf``: no
such item), and a path also scores the transitions ``T[c_prev, c_next]`` (row C = START,
column C = END; ``-inf`` forbids). An item reads ``symbols[c]`` into the automaton
(:class:`~.constraints.Automaton`, 0: nothing), then crosses the sentence starts inside it.
The semi-CRF is this with its segment scores (``c`` the label); the linear CRF with ``w = 0``
only and one channel per tag (a tag reads its entity label when it opens an entity).

The scan runs over end positions, batched over documents: ``V[t, b, c, q, :]`` holds the k
best prefixes of ``t`` tokens whose last item has channel ``c`` and which leave the automaton in
state ``q``. Each step is a few top-k calls over ``[B, C, S, widths x k]`` arrays; the back
pointers are followed for every document and rank at once.
"""
from typing import List, Optional, Tuple

import numpy

from .constraints import Automaton, no_constraints
from .pathsearch import check_k

NEG_INF = -numpy.inf

Item = Tuple[int, int, int]  # (start, width index w, channel)


def topk(x: numpy.ndarray, k: int) -> Tuple[numpy.ndarray, numpy.ndarray]:
    """The ``k`` largest entries along the last axis, largest first (ties: first index first)
    and their indices. The axis holds at least ``k`` entries: every caller's is a multiple of
    ``k`` (the ``k`` best of each of several states, labels or widths)."""
    if x.shape[-1] < k:
        raise ValueError(f"topk needs at least k = {k} entries, got {x.shape[-1]}")
    if k == 1:
        idx = x.argmax(-1)[..., None]
        return numpy.take_along_axis(x, idx, -1), idx
    idx = numpy.argsort(-x, axis=-1, kind="stable")[..., :k]
    return numpy.take_along_axis(x, idx, -1), idx


def _transfer(values: numpy.ndarray, target: numpy.ndarray, k: int):
    """Move ``values [..., S, k]`` through the state map ``target [..., S]`` (-1: dead):
    ``out[..., q, :]`` = the k best of the entries whose state maps to ``q``. Returns
    ``(out, source state, source rank)``, each ``[..., S, k]``."""
    S = values.shape[-2]
    hit = target[..., None, :] == numpy.arange(S)[:, None]  # [..., q, q0]
    cand = numpy.where(hit[..., None], values[..., None, :, :], NEG_INF)
    out, idx = topk(cand.reshape(cand.shape[:-2] + (S * k,)), k)
    return out, idx // k, idx % k


def lattice_search(
    scores: numpy.ndarray,
    lengths: numpy.ndarray,
    transitions: Optional[numpy.ndarray],
    symbols: numpy.ndarray,
    automaton: Optional[Automaton],
    sentence: numpy.ndarray,
    k: int = 1,
) -> List[List[Tuple[float, List[Item]]]]:
    """The ``k`` best paths of each document, best first: ``(score, items)``; an empty list
    where no path is accepted. ``scores [B, L, W, C]``, ``lengths [B]``, ``transitions
    [C + 1, C + 1]`` or None, ``symbols [C]``, ``sentence [B, L + 1]`` (the sentence index of
    each position, see :func:`~.constraints.sentence_index`; only up to each length is read)."""
    check_k(k)
    auto = automaton if automaton is not None else no_constraints()
    if automaton is None:
        symbols = numpy.zeros_like(symbols)
    B, L, W, C = scores.shape
    if B == 0:  # (an empty batch's arrays would lose their integer types on the way)
        return []
    S = auto.n_states
    T = numpy.zeros((C + 1, C + 1))
    if transitions is not None:
        T = numpy.array(transitions, dtype=numpy.float64)
    T[C, C] = 0.0  # START -> END: the empty document's path
    into = T[:, :C][None, :, :, None, None]  # [1, C+1, C, 1, 1]: from a channel into an item
    V = numpy.full((L + 1, B, C + 1, S, k), NEG_INF)
    V[0, :, C, 0, 0] = 0.0
    # back_v[t, b, c, q, r] = (w, state, rank) of the enter entry at t - 1 - w it extends;
    # back_e[s, b, c, q, r] = (channel, rank) of the V[s] entry an enter entry extends
    back_v = numpy.zeros((L + 1, B, C, S, k, 3), dtype=numpy.int64)
    back_e = numpy.zeros((L, B, C, S, k, 2), dtype=numpy.int64)
    enter = numpy.full((L, B, C, S, k), NEG_INF)
    # by end: the item of width index w ending at t - 1 starts at t - 1 - w; its score, and
    # the automaton map of its symbol and of the sentence starts it crosses
    start = numpy.arange(L)[:, None] - numpy.arange(W)  # [L, W]
    inside = start >= 0
    by_end = scores[:, start.clip(min=0), numpy.arange(W)].transpose(1, 2, 0, 3)  # [L, W, B, C]
    by_end = numpy.where(inside[:, :, None, None], by_end, NEG_INF)
    cross = numpy.minimum(2, sentence[:, 1:, None] - sentence[:, start.clip(min=0)])  # [B, L, W]
    targets = auto.combined[symbols, cross.transpose(1, 2, 0)[..., None]]  # [L, W, B, C, S]
    rows = numpy.arange(B)
    for t in range(1, L + 1):
        s = t - 1  # the items starting at s can first be entered now
        cand = V[s][:, :, None] + into  # [B, C+1, C, S, k]
        cand = cand.transpose(0, 2, 3, 1, 4).reshape(B, C, S, (C + 1) * k)
        enter[s], pick = topk(cand, k)
        back_e[s] = numpy.stack(numpy.divmod(pick, k), -1)
        n_w = min(W, t)
        # [n_w, B, C, S, k]: the items of each width ending at s, entered at their start
        vals = enter[s - n_w + 1 : s + 1][::-1] + by_end[s, :n_w, :, :, None, None]
        target = targets[s, :n_w]
        if S == 1:  # no constraint, or one that only kills
            vals = numpy.where(target[..., None] >= 0, vals, NEG_INF)
            q0 = numpy.zeros(vals.shape, dtype=numpy.int64)
            r0 = numpy.broadcast_to(numpy.arange(k), vals.shape)
        else:
            vals, q0, r0 = _transfer(vals, target, k)
        # the best over the widths
        if k == 1:
            w = vals.argmax(0)  # [B, C, S, 1]
            V[t, :, :C] = numpy.take_along_axis(vals, w[None], 0)[0]
            back_v[t] = numpy.stack(
                [w, numpy.take_along_axis(q0, w[None], 0)[0], numpy.zeros_like(w)], -1
            )
            continue
        flat = vals.transpose(1, 2, 3, 0, 4).reshape(B, C, S, n_w * k)
        V[t, :, :C], pick = topk(flat, k)
        w = pick // k
        q0 = q0.transpose(1, 2, 3, 0, 4).reshape(B, C, S, n_w * k)
        r0 = numpy.broadcast_to(r0, vals.shape).transpose(1, 2, 3, 0, 4).reshape(B, C, S, n_w * k)
        back_v[t] = numpy.stack(
            [w, numpy.take_along_axis(q0, pick, -1), numpy.take_along_axis(r0, pick, -1)], -1
        )
    final = V[lengths, rows] + T[:, C][None, :, None, None]  # [B, C+1, S, k]
    final = numpy.where(auto.final[None, None, :, None], final, NEG_INF)
    best, pick = topk(final.reshape(B, -1), k)
    return _backtrack(best, pick, (C + 1, S, k), lengths, back_v, back_e, C)


def _backtrack(best, pick, shape, lengths, back_v, back_e, C) -> List[List[Tuple[float, list]]]:
    """Follow the back pointers of every (document, rank) at once, one item per step."""
    B, k = best.shape
    c, q, r = numpy.unravel_index(pick, shape)  # [B, k] each
    t = numpy.broadcast_to(lengths[:, None], (B, k)).copy()
    doc = numpy.broadcast_to(numpy.arange(B)[:, None], (B, k))
    live = numpy.isfinite(best) & (t > 0)
    steps = []
    while live.any():
        tt, cc = t.clip(min=1), c.clip(max=C - 1)
        w, q_in, r_in = numpy.moveaxis(back_v[tt, doc, cc, q, r], -1, 0)
        s = (tt - 1 - w).clip(min=0)
        steps.append((numpy.where(live, s, -1), w, cc))
        c_prev, r_prev = numpy.moveaxis(back_e[s, doc, cc, q_in, r_in], -1, 0)
        c, q, r = (numpy.where(live, a, b) for a, b in ((c_prev, c), (q_in, q), (r_prev, r)))
        t = numpy.where(live, s, t)
        live = live & (t > 0)
    if not steps:
        return [[(float(v), []) for v in row if numpy.isfinite(v)] for row in best]
    starts, widths, channels = (numpy.stack(x)[::-1] for x in zip(*steps))  # [n_steps, B, k]
    out = []
    for b in range(B):
        paths = []
        for j in range(k):
            if not numpy.isfinite(best[b, j]):
                break
            on = starts[:, b, j] >= 0
            items = zip(*(x[on, b, j].tolist() for x in (starts, widths, channels)))
            paths.append((float(best[b, j]), list(items)))
        out.append(paths)
    return out
