"""The exact semi-Markov CRF (Sarawagi & Cohen, 2004): log Z, gold score, Viterbi, marginals.

A *segmentation* of a document of ``n`` tokens covers every token exactly once with labelled
segments: null segments (label 0) are one token wide, entity segments (labels ``1..M``) are
``1..K`` tokens wide. Segment ``(i, w, c)`` (tokens ``i..i+w``, label ``c``) scores
``scores[b, i, w, c]``; with a transition matrix ``T`` (``[C + 1, C + 1]``, row C = START,
column C = END) a segmentation also scores ``T[START, c_1] + sum T[c_k, c_k+1] + T[c_last, END]``.
The empty document has the single empty segmentation, of score 0 (no transition).

All algorithms are one left-to-right scan over segment *end* positions, batched over
documents. Without transitions the per-position state is a scalar, and the labels can be
reduced before the scan, so the loop costs ``O(L * K)`` and the whole ``O(L * K * C)``; with
transitions the state is per label, and entering a segment costs ``O(C^2)`` per position.
"""

from typing import List, Optional, Tuple

import torch

from .semiring import lse, masked_fill_neg, neg_value, raised_to_neg
from .spans import (
    check_gold_spans,
    check_lengths,
    check_transitions,
    token_coverage,
    token_mask,
)

__all__ = [
    "semicrf_log_partition",
    "semicrf_gold_score",
    "semicrf_viterbi",
    "semicrf_marginals",
    "semicrf_marginals_and_log_z",
    "segment_mask",
]


def segment_mask(
    lengths: torch.Tensor, length: int, max_width: int, n_classes: int
) -> torch.Tensor:
    """``BoolTensor[B, L, K, C]``: which labelled segments can occur in a segmentation.

    Segment ``(b, i, w, c)`` is possible iff it lies inside its document (``i + w < lengths[b]``)
    and it is an entity or one token wide (null segments have width 1).
    """
    device = lengths.device
    ends = torch.arange(length, device=device).view(-1, 1) + torch.arange(max_width, device=device)
    inside = ends.unsqueeze(0) < lengths.view(-1, 1, 1)  # [B, L, K]
    width_ok = torch.ones((max_width, n_classes), dtype=torch.bool, device=device)
    width_ok[1:, 0] = False
    return inside.unsqueeze(-1) & width_ok  # [B, L, K, C]


def check_segment_scores(
    scores: torch.Tensor, lengths: torch.Tensor, transitions: Optional[torch.Tensor]
) -> None:
    """A ``ValueError`` unless ``scores`` are ``[B, L, K, C]`` (``K, C >= 1``), ``lengths``
    ``[B]`` integers between 0 and ``L`` (:func:`~.spans.check_lengths`) and ``transitions``
    None or ``[C + 1, C + 1]`` (:func:`~.spans.check_transitions`): a length past the rows
    failed on an index out of bounds, fewer lengths than documents gave log Z of fewer
    documents, and other transitions failed on a size mismatch, none of them naming the
    argument."""
    if not isinstance(scores, torch.Tensor) or scores.dim() != 4 or (
            min(scores.shape[2:]) < 1):
        raise ValueError(
            f"scores must be a tensor [B, L, K, C], K >= 1 widths and C >= 1 labels (null "
            f"included), got {type(scores).__name__} "
            f"{tuple(getattr(scores, 'shape', ()))}"
        )
    B, L, K, C = scores.shape
    check_lengths(lengths, (B, L), "the scores")
    if transitions is not None:
        check_transitions(transitions, C, "labels", "the scores")


def _masked_scores(scores: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Impossible segments set to NEG, so callers need not mask (and they get zero gradient)."""
    B, L, K, C = scores.shape
    return masked_fill_neg(scores, segment_mask(lengths.to(scores.device), L, K, C))


def _by_end(scores: torch.Tensor) -> torch.Tensor:
    """Re-index ``[B, L, K, C]`` from (start, width) to (end, width): ``out[b, e, w] =
    scores[b, e - w, w]``, NEG where ``e - w < 0``. The scan adds the segments that *end* at
    each position, so this makes each step one contiguous slice."""
    B, L, K, C = scores.shape
    device = scores.device
    starts = torch.arange(L, device=device).view(-1, 1) - torch.arange(K, device=device)
    widths = torch.arange(K, device=device).view(1, -1).expand(L, K)
    out = scores[:, starts.clamp_min(0), widths]  # [B, L, K, C]
    return masked_fill_neg(out, (starts >= 0).view(1, L, K, 1))


def _end_transitions(transitions: torch.Tensor) -> torch.Tensor:
    """``T[:, END]`` over the ``C + 1`` scan states, with START -> END set to 0: the only path
    in the START state at the end is the empty one, which takes no transition."""
    C = transitions.shape[0] - 1
    return torch.cat([transitions[:C, C], transitions.new_zeros(1)])


def _start_state(batch: int, n_classes: int, like: torch.Tensor) -> torch.Tensor:
    """Scan state at position 0: all mass on START (index C)."""
    state = like.new_full((batch, n_classes + 1), neg_value(like.dtype))
    state[:, n_classes] = 0.0
    return state


def _window(items: List[torch.Tensor], t: int, K: int) -> torch.Tensor:
    """Stack ``items[t-1], items[t-2], ..., items[t-n]`` (n = min(K, t)) on dim 1, so that
    index ``w`` holds the value at position ``t - 1 - w`` (a segment of width ``w + 1`` ending at
    ``t - 1`` starts there)."""
    n = min(K, t)
    return torch.stack(items[t - n : t][::-1], dim=1)


def _zeros_connected(scores: torch.Tensor, transitions: Optional[torch.Tensor]) -> torch.Tensor:
    """Zeros ``[B]`` for a batch of empty documents that still depend on the inputs, so that
    ``backward()`` on a loss over such a batch works (and gives zero gradients)."""
    out = scores.sum((1, 2, 3)) * 0
    # (an empty slice of the transitions: times 0, a transition of -inf would give NaN)
    return out if transitions is None else out + transitions[:0].sum()


def semicrf_log_partition(
    scores: torch.Tensor, lengths: torch.Tensor, transitions: Optional[torch.Tensor] = None,
    check: bool = True,
) -> torch.Tensor:
    """``log Z`` per document, ``Tensor[B]``, by the forward scan.

    ``scores`` is ``[B, L, K, C]``; entries of impossible segments are ignored (masked here).
    A segment scored -inf is in no segmentation with any probability (it counts as NEG); where
    every segmentation is -inf, log Z is not -inf but at or below ``NEG / 2`` (finite, so that
    its gradient is no NaN). ``transitions`` is ``[C + 1, C + 1]`` or None. Empty documents get
    exactly 0. A ``ValueError`` for inputs of other shapes (:func:`check_segment_scores`),
    unless ``check`` is False (the heads check theirs).
    """
    if check:
        check_segment_scores(scores, lengths, transitions)
    B, L, K, C = scores.shape
    if L == 0:
        return _zeros_connected(scores, transitions)
    lengths = lengths.to(scores.device).long()
    # (logsumexp over a window of -inf alone, a label ending where it cannot, would be NaN)
    E = _by_end(_masked_scores(raised_to_neg(scores), lengths))
    if transitions is None:
        # The labels do not interact across segments: reduce them before the scan.
        E = lse(E, -1)  # [B, L, K]
        # unbind once: E[:, t - 1] in the loop would give every step a full-size gradient
        # buffer in backward, making it quadratic in L
        E_steps = E.unbind(1)
        alphas = [scores.new_zeros(B)]
        for t in range(1, L + 1):
            cand = E_steps[t - 1][:, : min(K, t)] + _window(alphas, t, K)
            alphas.append(lse(cand, 1))
        return torch.stack(alphas, 1).gather(1, lengths.view(-1, 1)).squeeze(1)
    # -inf raised to NEG, as the scores: a label that only -inf enters made the log-sums NaN
    T = raised_to_neg(transitions, scores.dtype)
    enter_T = T[:, :C].t().contiguous()  # [C (next), C + 1 (prev, START last)]
    states = [_start_state(B, C, scores)]
    enters: List[torch.Tensor] = []
    neg_col = scores.new_full((B, 1), neg_value(scores.dtype))
    E_steps = E.unbind(1)  # see above: no per-step indexing of a tensor that needs a gradient
    for t in range(1, L + 1):
        # Score of opening a segment of each label at position t - 1.
        enters.append(lse(states[-1].unsqueeze(1) + enter_T, -1))
        cand = E_steps[t - 1][:, : min(K, t)] + _window(enters, t, K)  # [B, n, C]
        states.append(torch.cat([lse(cand, 1), neg_col], dim=1))
    final = torch.stack(states, 1)[torch.arange(B, device=scores.device), lengths]
    return lse(final + _end_transitions(T), -1)


def semicrf_gold_score(
    scores: torch.Tensor,
    lengths: torch.Tensor,
    gold: torch.Tensor,
    transitions: Optional[torch.Tensor] = None,
    check_rows: bool = True,
    check: bool = True,
) -> torch.Tensor:
    """Score of the gold segmentation per document, ``Tensor[B]``.

    ``gold`` rows are ``(doc, start, end_inclusive, label 1..M)``, non-overlapping within a doc;
    the segmentation is these entities plus a width-1 null segment on every other token.
    Raises ``ValueError`` for gold spans that are not such a segmentation, or wider than ``K``
    (they have no score), unless ``check_rows`` is False: a path the head decoded needs no
    check; and for inputs of other shapes (:func:`check_segment_scores`), unless ``check`` is
    False (the heads check theirs).
    """
    if check:
        check_segment_scores(scores, lengths, transitions)
    B, L, K, C = scores.shape
    device = scores.device
    lengths = lengths.to(device).long()
    if check_rows:
        doc, start, end, label = check_gold_spans(gold, lengths, L, K, C - 1)
    else:
        doc, start, end, label = gold.to(device).long().view(-1, 4).unbind(1)
    S = _masked_scores(scores, lengths)
    width = end - start
    if L == 0:
        return _zeros_connected(scores, transitions)
    in_doc = token_mask(lengths, L)  # [B, L]
    covered = token_coverage(doc, start, end, B, L) > 0
    null_tok = in_doc & ~covered
    total = torch.where(null_tok, S[:, :, 0, 0], S.new_zeros(())).sum(1)
    total = total.index_add(0, doc, S[doc, start, width, label])
    if transitions is None:
        return total
    T = transitions.to(S.dtype)
    start_label = torch.zeros((B, L), dtype=torch.long, device=device)
    end_label = torch.zeros((B, L), dtype=torch.long, device=device)
    start_label[doc, start] = label
    end_label[doc, end] = label
    seg_start = null_tok.clone()
    seg_start[doc, start] = True
    # The segment before the one starting at t is the one ending at t - 1 (START at t = 0).
    prev = torch.cat([end_label.new_full((B, 1), C), end_label], 1)[:, :L]
    trans = torch.where(seg_start & in_doc, T[prev, start_label], S.new_zeros(()))
    last = end_label.gather(1, (lengths - 1).clamp_min(0).view(-1, 1)).squeeze(1)
    to_end = torch.where(lengths > 0, T[last, C], S.new_zeros(()))
    return total + trans.sum(1) + to_end


@torch.no_grad()
def semicrf_viterbi(
    scores: torch.Tensor, lengths: torch.Tensor, transitions: Optional[torch.Tensor] = None,
    check: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Best segmentation per document.

    Returns ``(spans LongTensor[N, 4], best Tensor[B])``: the entity segments (null ones left
    out) as rows ``(doc, start, end_inclusive, label)`` sorted by ``(doc, start)``, and each
    document's best score (0 for empty documents). A document whose every segmentation scores
    ``-inf`` has no best one: no rows, and a best score of ``-inf``. A ``ValueError`` for
    inputs of other shapes (:func:`check_segment_scores`), unless ``check`` is False (the heads
    check theirs).
    """
    if check:
        check_segment_scores(scores, lengths, transitions)
    B, L, K, C = scores.shape
    device = scores.device
    lengths = lengths.to(device).long()
    E = _by_end(_masked_scores(scores, lengths))
    batch = torch.arange(B, device=device)
    # back_w[t][b, c]: width index of the best last segment of prefix 0..t-1 (label c if
    # transitions, else the best label, stored in E_label).
    back_w = [torch.zeros((B, C), dtype=torch.long, device=device)]
    if transitions is None:
        E, E_label = E.max(dim=-1)  # [B, L, K]
        alphas = [scores.new_zeros(B)]
        for t in range(1, L + 1):
            best, w = (E[:, t - 1, : min(K, t)] + _window(alphas, t, K)).max(dim=1)
            alphas.append(best)
            back_w.append(w.view(B, 1).expand(B, C))
        best = torch.stack(alphas, 1).gather(1, lengths.view(-1, 1)).squeeze(1)
        label = torch.zeros(B, dtype=torch.long, device=device)
    else:
        T = transitions.to(scores.dtype)
        enter_T = T[:, :C].t().contiguous()
        states = [_start_state(B, C, scores)]
        enters: List[torch.Tensor] = []
        back_prev: List[torch.Tensor] = []  # back_prev[s][b, c]: best label before c at s
        neg_col = scores.new_full((B, 1), neg_value(scores.dtype))
        for t in range(1, L + 1):
            value, arg = (states[-1].unsqueeze(1) + enter_T).max(dim=-1)
            enters.append(value)
            back_prev.append(arg)
            best_t, w = (E[:, t - 1, : min(K, t)] + _window(enters, t, K)).max(dim=1)
            states.append(torch.cat([best_t, neg_col], dim=1))
            back_w.append(w)
        final = torch.stack(states, 1)[batch, lengths] + _end_transitions(T)
        best, label = final.max(dim=-1)
        bp_prev = torch.stack(back_prev, 1) if back_prev else None  # [B, L, C]
    bp_w = torch.stack(back_w, 1)  # [B, L + 1, C]

    # Backtrack from each document's end, one segment per step, all documents at once.
    t = lengths.clone()
    rows = []
    n_steps = int(lengths.max()) if B else 0
    for _ in range(n_steps):
        active = t > 0
        tt = t.clamp_min(1)
        cc = label.clamp_max(C - 1)
        w = bp_w[batch, tt, cc]
        s = tt - 1 - w
        if transitions is None:
            seg_label = E_label[batch, tt - 1, w]
            new_label = label
        else:
            seg_label = cc
            new_label = bp_prev[batch, s, cc]
        rows.append(torch.stack([batch, s, tt - 1, seg_label, active.long()], 1))
        label = torch.where(active, new_label, label)
        t = torch.where(active, s, t)
    # every segmentation -inf (NEG or below, as masked): no distribution, no best segmentation
    none = best <= neg_value(best.dtype) / 2
    best = best.masked_fill(none, -float("inf"))
    if not rows:
        return torch.zeros((0, 4), dtype=torch.long, device=device), best
    segs = torch.cat(rows, 0)
    segs = segs[(segs[:, 4] > 0) & (segs[:, 3] > 0) & ~none[segs[:, 0]], :4]
    order = torch.argsort(segs[:, 0] * (L + 1) + segs[:, 1])
    return segs[order], best


def semicrf_marginals(
    scores: torch.Tensor, lengths: torch.Tensor, transitions: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``Tensor[B, L, K, C]``: probability that labelled segment ``(i, w, c)`` is in the
    segmentation (0 for impossible segments, and for every segment of a document whose every
    segmentation scores ``-inf``: no distribution).

    The gradient of ``log Z`` with respect to the segment scores; computed with autograd, so
    it is safe to call under ``torch.no_grad()`` and ``torch.inference_mode()``. The result is
    detached.
    """
    return semicrf_marginals_and_log_z(scores, lengths, transitions)[0]


def semicrf_marginals_and_log_z(
    scores: torch.Tensor, lengths: torch.Tensor, transitions: Optional[torch.Tensor] = None,
    check: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(marginals [B, L, K, C], log Z [B])`` from one forward scan and its gradient (what
    :func:`semicrf_marginals` returns, with the log Z it throws away). A ``ValueError`` for
    inputs of other shapes (:func:`check_segment_scores`), unless ``check`` is False (the heads
    check theirs)."""
    if check:
        check_segment_scores(scores, lengths, transitions)
    # autograd cannot record inside inference mode, nor on tensors made there: leave the
    # mode for the scan, on copies of such tensors (clone leaves the values as they are)
    with torch.inference_mode(False), torch.enable_grad():
        leaf = _normal_tensor(scores).requires_grad_(True)
        T = None if transitions is None else _normal_tensor(transitions)
        log_z = semicrf_log_partition(leaf, _normal_tensor(lengths), T, check=False)
        (grad,) = torch.autograd.grad(log_z.sum(), leaf)
    # every segmentation -inf: log Z at NEG or below, and a gradient that is no distribution
    some = (log_z.detach() > neg_value(log_z.dtype) / 2).view(-1, 1, 1, 1)
    return torch.where(some, grad, grad.new_zeros(())), log_z.detach()


def _normal_tensor(x: torch.Tensor) -> torch.Tensor:
    """``x`` detached, copied if it was made in inference mode."""
    x = x.detach()
    return x.clone() if x.is_inference() else x
