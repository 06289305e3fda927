"""The filtered semi-Markov CRF (Zaratiana et al., 2023): node sets, log Z, Viterbi, marginals.

The nodes are labelled spans on the grid ``[B, L, K]`` (see :mod:`.spans`): ``node_mask`` says
which spans are nodes, ``node_labels`` their label, ``node_scores`` their global score. A path
is a maximal set of pairwise non-overlapping nodes (the START-to-END paths of the graph of
Liang et al., 1991), scored by the sum of its nodes' scores plus, optionally, the transitions
``T[prev, next]`` between consecutive nodes (``T`` is ``[C + 1, C + 1]``, row C = START,
column C = END). The empty node set has the single empty path, of score 0.

Every algorithm goes through one solver, ``_solve``, over the *list* of nodes (their flat grid
indices in grid order, with their scores and labels) and a *compacted* copy of it
(:mod:`.compaction`): clusters of pairwise overlapping nodes (cliques) and other small
clusters are solved exactly on the host; log Z stays differentiable there through its
gradient, the node marginals. The remaining rows (larger clusters, or whole documents when
there are transitions) get the position scan of docs/algorithm.md, with the tokens that no node
covers dropped: the graph only depends on the order of node boundaries, which dropping
uncovered tokens preserves, and then the predecessors of a node starting at ``s`` all end in
``[s - 2K + 1, s - 1]``, so each step reads a window of ``2K - 1`` ends, not the prefix.
Marginals of scanned rows come from the scan of the rows and of the mirrored rows.

The scan loops over positions only and is batched tensor code on the scores' device.

Two ways in: the grid functions (``filtered_log_partition``, ``filtered_viterbi``, ...) take
``[B, L, K]`` grids and list their nodes first (an optional ``node_index`` saves that pass);
prediction goes through :func:`inference_node_set` and :func:`decode_node_set`, which never
build a grid: a trained model keeps about one node per entity, and at that size decoding a batch
costs a fixed number of small calls, so every grid pass saved shows.
"""
import math
from typing import NamedTuple, Optional, Tuple

import numpy
import torch

from .compaction import (
    HostClusters, HostLogPartition, ScanBlock, check_node_index, compact, disjoint, host_array,
    solve_host, to_device,
)
from .semiring import lse, logaddexp, masked_fill_neg, neg_value, raised_to_neg, wide
from .spans import (
    check_integer_dtype,
    check_lengths,
    check_sentence_starts,
    check_shape,
    check_transitions,
    crossing_spans,
    overlap_mask,
    span_ends,
)


# ----------------------------------------------------------------------------- node sets


class NodeSet(NamedTuple):
    """The nodes of a filtered graph on the ``[B, L, K]`` grid ``shape``, as a list in grid
    order (by document, start, width).

    ``index`` holds their flat grid indices, ``labels`` their labels and ``scores`` their global
    scores (read at their labels); all three are ``[n]``. The index must be strictly increasing
    (each node once, in grid order) and each node ``(i, w)`` end inside the grid (``i + w <
    L``): solving a node set built otherwise raises a ``ValueError`` (sort the index, and the
    labels and scores alike). :func:`decode_node_set` needs no solve where no two nodes
    overlap, which a node list out of order never is.
    """

    index: torch.Tensor
    labels: torch.Tensor
    scores: torch.Tensor
    shape: Tuple[int, int, int]

    def grid(self, values: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``values [n]`` on the ``[B, L, K]`` grid (0 elsewhere); the node mask without them."""
        if values is None:
            values = torch.ones_like(self.index, dtype=torch.bool)
        return _on_grid(self.index, values, self.shape)

    def spans(self, select: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``LongTensor[n, 4]``: the nodes as rows ``(doc, start, end inclusive, label)``; with
        ``select`` (``BoolTensor[n]``) only the rows of the selected nodes."""
        # on the host, like the compaction: a few NumPy calls on a short list
        B, L, K = self.shape
        index, labels = self.index.cpu().numpy(), self.labels.cpu().numpy()
        if select is not None:
            keep = select.cpu().numpy()
            index, labels = index[keep], labels[keep]
        row, width = numpy.divmod(index, K)
        doc, start = numpy.divmod(row, L)
        rows = numpy.empty((doc.size, 4), dtype=numpy.int64)  # (numpy.stack is slower)
        rows[:, 0], rows[:, 1], rows[:, 3] = doc, start, labels
        numpy.add(start, width, out=rows[:, 2])
        return to_device(rows, self.index.device)

    def counts(self) -> torch.Tensor:
        """``LongTensor[B]``: nodes per document (the filtered graph size)."""
        B, L, K = self.shape
        return torch.bincount(self.index // (L * K), minlength=B)


def _flat_nonzero(mask: torch.Tensor) -> torch.Tensor:
    """``LongTensor[n]``: the flat positions of the True entries of ``mask``, in order.

    On the CPU, NumPy's ``flatnonzero`` (on a view of the same memory) is 3-4x faster than
    ``torch.nonzero``: 7 against 26 us for the 20k candidate spans of 32 x 64 tokens."""
    if mask.device.type == "cpu":
        return torch.from_numpy(numpy.flatnonzero(mask.numpy()))
    return mask.reshape(-1).nonzero().squeeze(1)


def grid_index(mask: torch.Tensor) -> torch.Tensor:
    """``LongTensor[n]``: the flat indices of the True entries of a ``[B, L, K]`` grid, in
    grid order (how a :class:`NodeSet` lists its nodes)."""
    return _flat_nonzero(mask)


def _candidates_only(index: torch.Tensor, lengths: torch.Tensor, L: int, K: int) -> torch.Tensor:
    """The flat ``[B, L, K]`` grid ``index`` without the entries past their document's end.

    Checked on the short list of kept spans rather than by a ``[B, L, K]`` candidate mask over
    the grid, which costs more on CPU."""
    ends = span_ends(L, K, index.device).view(-1)  # cached: the end of each span of a row
    if index.device.type == "cpu":  # in NumPy, where a call costs about a microsecond
        inside = _inside_documents(index.numpy(), ends.numpy(), lengths.cpu().numpy(), L * K)
        return torch.from_numpy(inside)
    return _inside_documents(index, ends, lengths.to(index.device), L * K)


def _inside_documents(flat, ends, lengths, row_size: int):
    """The entries of ``flat`` (grid indices, ``row_size = L * K`` per document) whose span ends
    (``ends [L * K]``) before their document's length; NumPy arrays and tensors alike."""
    row_size = max(row_size, 1)  # an empty grid has no index to divide
    return flat[ends[flat % row_size] < lengths[flat // row_size]]


def label_planes(scores: torch.Tensor) -> torch.Tensor:
    """``[C, B * L * K]``: one plane per label (a view when, as the heads lay them out, the
    ``[B, L, K, C]`` scores are label-major in memory; a copy otherwise)."""
    return scores.permute(3, 0, 1, 2).reshape(scores.shape[-1], -1)


def _filter(
    local_scores: torch.Tensor, lengths: torch.Tensor, margin: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(index [n], labels [n])``: the candidate spans whose best entity label scores above
    null minus ``margin`` (with 0, those whose local argmax is not null), as flat grid indices
    (in grid order), and that best entity label."""
    if local_scores.dim() != 4 or local_scores.shape[-1] < 2:
        raise ValueError(
            f"local scores must be [B, L, K, C], C >= 2 (null and at least one label), got "
            f"{tuple(local_scores.shape)}"
        )
    if bool(margin != margin):  # NaN: every comparison false, no span kept
        raise ValueError(f"the filter's margin must be a number, got {margin}")
    B, L, K, C = local_scores.shape
    check_lengths(lengths, (B, L), "the local scores")
    planes = label_planes(local_scores)
    # amax + a comparison over whole planes is several times faster than argmax over the label
    # axis on CPU; argmax then runs on the kept spans only. Ties go to null, as with argmax.
    null = planes[0] if not margin else planes[0] - margin
    index = _candidates_only(_flat_nonzero(planes[1:].amax(0) > null), lengths, L, K)
    # The kept spans' label columns: index_select is the cheap gather here (5 us where advanced
    # indexing of the transposed planes takes 50, at 32 x 64 tokens), and max(0).indices the
    # cheap argmax over them (21 us against 81 for argmax(0); both give the first maximum).
    return index, planes.index_select(1, index)[1:].max(0).indices.add_(1)


def _on_grid(index: torch.Tensor, values: torch.Tensor, shape: Tuple[int, ...]) -> torch.Tensor:
    """A zero grid of ``shape`` holding ``values`` at the flat ``index``."""
    grid = values.new_zeros(shape)
    return grid.view(-1).index_put_((index,), values).view(shape)


def inference_nodes(
    local_scores: torch.Tensor, lengths: torch.Tensor, margin: float = 0.0
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Filtering at inference: the candidate spans whose local argmax label is not null, each
    labelled with that argmax.

    ``local_scores`` is ``[B, L, K, C]``; returns ``(node_mask [B, L, K], node_labels [B, L, K])``.
    ``margin`` (log-odds) moves the filter's threshold: a span is kept when its best entity
    label scores above ``null - margin``, so a positive margin keeps more spans (recall), a
    negative one fewer (precision). Training filters at the head's ``train_margin`` (0, as the
    paper, by default).
    """
    index, labels = _filter(local_scores, lengths, margin)
    shape = tuple(local_scores.shape[:3])
    mask = _on_grid(index, torch.ones_like(index, dtype=torch.bool), shape)
    return mask, _on_grid(index, labels, shape)


def inference_node_set(
    local_scores: torch.Tensor,
    global_scores: torch.Tensor,
    lengths: torch.Tensor,
    margin: float = 0.0,
) -> NodeSet:
    """The nodes of :func:`inference_nodes` as a :class:`NodeSet`, with their global scores
    (``global_scores`` is ``[B, L, K, C]`` like ``local_scores``), in float32, or float64 if
    they are. A ``ValueError`` unless both have one shape: the nodes' global scores are read
    at the local grid's flat indices, where another grid held other spans' scores (or none,
    an ``IndexError``)."""
    index, labels = _filter(local_scores, lengths, margin)  # (which checks the local scores)
    check_shape(global_scores, "global scores", "[B, L, K, C]", tuple(local_scores.shape),
                "the local scores")
    scores = wide(label_planes(global_scores)[labels, index])
    return NodeSet(index, labels, scores, tuple(local_scores.shape[:3]))


def within_sentences(nodes: NodeSet, sentence_starts: Optional[torch.Tensor]) -> NodeSet:
    """``nodes`` without those that cross a sentence boundary (``sentence_starts [B, L]``,
    :func:`~.spans.crossing_spans`): no entity of the graph's paths then does. ``nodes``
    itself without ``sentence_starts`` or where no node crosses one."""
    if sentence_starts is None:
        return nodes
    B, L, K = nodes.shape
    check_sentence_starts(sentence_starts, (B, L))
    crossing = crossing_spans(sentence_starts.to(nodes.index.device), K).view(-1)
    keep = ~crossing[nodes.index]
    if bool(keep.all()):
        return nodes
    return NodeSet(nodes.index[keep], nodes.labels[keep], nodes.scores[keep], nodes.shape)


def training_nodes(
    local_scores: torch.Tensor,
    lengths: torch.Tensor,
    gold_grid: torch.Tensor,
    overlapping_only: bool = True,
    margin: float = 0.0,
    unknown: Optional[torch.Tensor] = None,
    incorrect: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Filtering under the gold-path constraint (docs/algorithm.md, "Training").

    Nodes are the gold spans with their gold labels, plus the spans with a non-null local label
    that are not gold and overlap some gold span. Each extra node overlaps a gold span, so the
    gold spans stay a maximal non-overlapping set, i.e. a path, and ``log Z >= gold score``.
    With ``overlapping_only=False`` every span with a non-null local label is kept (for a graph
    with null tokens, where the gold spans and nulls are a path whatever the other nodes).
    ``margin`` is the filter's, as at inference (the paper trains at 0). ``unknown [B, L, K]``
    marks the spans of tokens without annotation only (:func:`~.spans.unknown_spans`): those
    with a non-null local label are kept too, as the nodes a path consistent with a partial
    annotation may add to the gold spans. A span whose label is one of ``incorrect [B, L, K,
    C]`` (:func:`~.spans.incorrect_label_grid`: entities known to be wrong) is no node: no path
    to learn from holds it, and the graph has no path without it where it overlaps no other.

    Raises ``ValueError`` unless ``gold_grid`` and ``unknown`` are ``[B, L, K]`` and
    ``incorrect`` ``[B, L, K, C]`` as the local scores: another shape broadcast into the nodes
    of other spans, or failed inside PyTorch.
    """
    pred_mask, pred_labels = inference_nodes(local_scores, lengths, margin)
    grid = tuple(local_scores.shape[:3])
    check_shape(gold_grid, "gold_grid", "[B, L, K]", grid, "the local scores")
    if unknown is not None:
        check_shape(unknown, "unknown", "[B, L, K]", grid, "the local scores")
    if incorrect is not None:
        check_shape(incorrect, "incorrect", "[B, L, K, C]", tuple(local_scores.shape),
                    "the local scores")
    gold_mask = gold_grid > 0
    extra = pred_mask & ~gold_mask
    if incorrect is not None:
        extra &= ~incorrect.gather(-1, pred_labels.unsqueeze(-1)).squeeze(-1)
    if overlapping_only:
        extra &= overlap_mask(gold_mask) if unknown is None else (
            overlap_mask(gold_mask) | unknown)
    mask = gold_mask | extra
    labels = torch.where(gold_mask, gold_grid, pred_labels) * mask
    return mask, labels


def start_bound(node_mask: torch.Tensor) -> torch.Tensor:
    """``P(s)`` of docs/algorithm.md for ``s = 0..L``: ``LongTensor[B, L + 1]``.

    ``P(s)`` is the largest start of a node ending before ``s`` (-1 if none). The predecessors
    of a node starting at ``s`` are the nodes ending in ``[P(s), s - 1]`` (and START when
    ``P(s) = -1``); END's predecessors are the nodes ending at or after ``P(L)``.
    """
    B, L, K = node_mask.shape
    starts = torch.arange(L, device=node_mask.device).view(1, L, 1).expand(B, L, K)
    ends = (starts + torch.arange(K, device=node_mask.device).view(1, 1, K)).clamp_max(L - 1)
    src = torch.where(node_mask, starts, torch.full_like(starts, -1))
    last_start = torch.full((B, L), -1, dtype=torch.long, device=node_mask.device)
    last_start = last_start.scatter_reduce(1, ends.reshape(B, -1), src.reshape(B, -1), "amax")
    bound = last_start.cummax(1).values
    return torch.cat([bound.new_full((B, 1), -1), bound], dim=1)


def _to_scan_grid(values: torch.Tensor, block: ScanBlock, K: int, fill: float) -> torch.Tensor:
    """Gather the node list's ``values [n]`` into the block's ``[N, Lc, K]`` scan grid."""
    out = values.new_full((block.n_rows * block.scan_length * K,), fill)
    out = out.index_put((block.scan_index,), values[block.node])
    return out.view(block.n_rows, block.scan_length, K)


# ----------------------------------------------------------------------------- the scan


def _split_transitions(
    transitions: Optional[torch.Tensor], dtype: torch.dtype, device: torch.device
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(T_in [C + 1, C], T_end [C + 1])``: into each label, and into END, from each label or
    START (the last row). Without transitions: a single zero channel."""
    if transitions is None:
        zero = torch.zeros((1, 1), dtype=dtype, device=device)
        return zero, zero[:, 0]
    C = transitions.shape[0] - 1
    return transitions[:, :C], transitions[:, C]


class _ScanResult(NamedTuple):
    total: torch.Tensor  # [N]: log Z (log semiring) or best score (max semiring)
    best_nodes: Optional[torch.Tensor]  # [N, Lc, K] bool, Viterbi only
    alpha: Optional[torch.Tensor] = None  # [N, Lc, K] forward scores, with keep_alpha


def _scan(
    scores: torch.Tensor,
    mask: torch.Tensor,
    labels: torch.Tensor,
    transitions: Optional[torch.Tensor],
    viterbi: bool,
    keep_alpha: bool = False,
) -> _ScanResult:
    """Position scan of docs/algorithm.md over compacted, right-aligned rows ``[N, Lc, K]``.

    ``A[e, l]`` (⊕ of the alphas of nodes ending at ``e`` with label ``l``) is built by pushing
    each new alpha into a ``pending`` buffer indexed by end offset, so no tensor is written in
    place and autograd sees a plain chain of ops. START is handled apart, as the predecessor of
    the nodes with ``P(s) = -1``.
    """
    N, Lc, K = scores.shape
    device, dtype = scores.device, scores.dtype
    t_in, t_end = _split_transitions(transitions, dtype, device)
    n_in = t_in.shape[1]  # label channels a node can take (1 without transitions)
    n_ch = t_in.shape[0]  # channels of A: labels, plus START (== n_in without transitions)
    window = 2 * K - 1
    if transitions is None:
        labels = torch.zeros_like(labels)
    bound = start_bound(mask)
    onehot = torch.nn.functional.one_hot(labels, n_ch).bool() & mask.unsqueeze(-1)
    # ends_onehot[n, e, l]: some node ending at e has label l (A[e, l] is a real sum).
    ends_onehot = torch.zeros((N, Lc + K, n_ch), dtype=torch.bool, device=device)
    for w in range(K):
        ends_onehot[:, w : w + Lc] |= onehot[:, :, w]
    start_in = t_in[-1]  # START -> label (row C)
    reduce = (lambda x, d: x.max(d).values) if viterbi else lse
    plus = torch.maximum if viterbi else logaddexp
    neg = scores.new_full((), neg_value(dtype))

    # unbind once: indexing scores[:, s] in the loop would give every step a full-size gradient
    # buffer in backward, making it quadratic in the length.
    score_steps = scores.unbind(1)
    alpha_hist = []  # alpha of the nodes starting at each position: [N, K]
    q_hist = []  # Q[e] = ⊕_l' A[e, l'] ⊗ T_in[l', :], per end e: [N, n_in]
    a_hist = []  # A[e]: [N, n_ch]
    pending = scores.new_full((N, K, n_ch), neg_value(dtype))
    pend_start = torch.zeros((N, K, n_ch), dtype=torch.long, device=device)
    back_end, back_label, best_start = [], [], []
    for s in range(Lc):
        lo = bound[:, s]  # [N]
        incoming = masked_fill_neg(start_in.expand(N, n_in), (lo < 0).unsqueeze(-1))
        if q_hist:
            hist = torch.stack(q_hist[-window:], dim=1)  # [N, w', n_in]
            first = s - hist.shape[1]
            ends = torch.arange(first, s, device=device)
            ok = (ends.view(1, -1) >= lo.view(-1, 1)).unsqueeze(-1)
            hist = masked_fill_neg(hist, ok)
            if viterbi:
                best, arg = hist.max(1)
                take = best > incoming
                back_end.append(torch.where(take, arg + first, -1))
                incoming = torch.maximum(incoming, best)
            else:
                incoming = logaddexp(incoming, lse(hist, 1))
        elif viterbi:
            back_end.append(torch.full((N, n_in), -1, dtype=torch.long, device=device))
        alpha = score_steps[s] + incoming.gather(1, labels[:, s])  # [N, K]
        alpha = masked_fill_neg(alpha, mask[:, s])
        if keep_alpha:
            alpha_hist.append(alpha)
        contrib = masked_fill_neg(alpha.unsqueeze(-1), onehot[:, s])  # [N, K, n_ch]
        if viterbi:
            better = contrib > pending
            pend_start = torch.where(better, s, pend_start)
        pending = plus(pending, contrib)
        a_end = masked_fill_neg(pending[:, 0], ends_onehot[:, s])  # A[s]
        if viterbi:
            best_start.append(pend_start[:, 0])
            pend_start = torch.cat([pend_start[:, 1:], torch.zeros_like(pend_start[:, :1])], 1)
        pending = torch.cat([pending[:, 1:], neg.expand(N, 1, n_ch)], dim=1)
        a_hist.append(a_end)
        if transitions is None:
            q_hist.append(a_end)
        else:
            q = reduce(a_end.unsqueeze(-1) + t_in, 1)  # [N, n_in]
            if viterbi:
                back_label.append((a_end.unsqueeze(-1) + t_in).argmax(1))
            q_hist.append(q)

    # END: nodes ending at or after P(Lc), within the last `window` ends.
    lo = bound[:, Lc]
    hist = torch.stack(a_hist[-window:], dim=1) + t_end  # [N, w', n_ch]
    first = Lc - hist.shape[1]
    ends = torch.arange(first, Lc, device=device)
    hist = masked_fill_neg(hist, (ends.view(1, -1) >= lo.view(-1, 1)).unsqueeze(-1))
    flat = hist.reshape(N, -1)
    if not viterbi:
        alpha = torch.stack(alpha_hist, 1) if keep_alpha else None
        return _ScanResult(lse(flat, 1), None, alpha)
    total, arg = flat.max(1)
    return _ScanResult(
        total,
        _backtrack(
            arg // n_ch + first, arg % n_ch, back_end, back_label, best_start, labels, (N, Lc, K)
        ),
    )


def _backtrack(end, label, back_end, back_label, best_start, labels, shape) -> torch.Tensor:
    """Follow the Viterbi back-pointers from END to START; one step per node on the path."""
    N, Lc, K = shape
    device = end.device
    back_end = torch.stack(back_end, 1)  # [N, Lc, n_in]: best predecessor end, -1 = START
    best_start = torch.stack(best_start, 1)  # [N, Lc, n_ch]: start of best node ending at e
    back_label = torch.stack(back_label, 1) if back_label else None  # [N, Lc, n_in]
    rows = torch.arange(N, device=device)
    chosen = torch.zeros((N, Lc, K), dtype=torch.bool, device=device)
    active = end >= 0
    while bool(active.any()):
        e = end.clamp_min(0)
        s = best_start[rows, e, label]
        w = (e - s).clamp(0, K - 1)
        chosen[rows[active], s[active], w[active]] = True
        # The best predecessor of node (s, w) is stored at its start s, per node label; without
        # transitions there is one channel and every label is 0.
        node_label = labels[rows, s, w]
        new_end = back_end[rows, s, node_label]
        prev_label = node_label
        if back_label is not None:
            prev_label = back_label[rows, new_end.clamp_min(0), node_label]
        end = torch.where(active, new_end, end)
        label = torch.where(active, prev_label, label)
        active = active & (new_end >= 0)
    return chosen


# ----------------------------------------------------------------------------- public API


def _reverse_rows(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mirror each right-aligned row of a ``[N, Lc, K]`` grid: the node starting at ``s`` with
    width ``w`` in a row occupying ``[o, Lc)`` moves to start ``o + Lc - 1 - (s + w)``, so the
    mirrored rows are right-aligned too. Applying it twice gives ``x`` back."""
    N, Lc, K = mask.shape
    device = mask.device
    covered_from = mask.any(2).long().argmax(1)  # first position with a node: the row start
    s = torch.arange(Lc, device=device).view(1, Lc, 1)
    w = torch.arange(K, device=device).view(1, 1, K)
    mirrored = covered_from.view(N, 1, 1) + Lc - 1 - (s + w)
    inside = (mirrored >= covered_from.view(N, 1, 1)) & (mirrored < Lc)  # else: no node there
    out = x.gather(1, mirrored.clamp(0, Lc - 1).expand(N, Lc, K))
    return torch.where(inside, out, torch.zeros((), dtype=x.dtype, device=x.device))


def _scan_marginals(
    scores: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor, transitions: Optional[torch.Tensor]
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(log Z [N], node marginals [N, Lc, K])`` of scanned rows, without autograd:
    a marginal is ``exp(alpha + alpha' - phi - log Z)``.

    ``alpha'`` is the forward scan of the mirrored rows (the reversed graph has the same paths),
    i.e. the outside score of each node including its own score. Two scans and no autograd
    graph: memory stays a few ``[N, Lc, K]`` tensors however long the rows are.
    """
    forward = _scan(scores, mask, labels, transitions, False, keep_alpha=True)
    flip = lambda x: _reverse_rows(x, mask)  # noqa: E731
    t_rev = None if transitions is None else transitions.T
    backward = _scan(flip(scores), flip(mask), flip(labels), t_rev, False, keep_alpha=True)
    log_marginal = forward.alpha + flip(backward.alpha) - scores - forward.total.view(-1, 1, 1)
    return forward.total, torch.where(mask, log_marginal.clamp_max(0).exp(), 0.0)


class _Solution(NamedTuple):
    total: torch.Tensor  # [B]: log Z, or the best path's score when the best path is asked for
    best: Optional[torch.Tensor]  # [n] bool: the nodes on the best path
    marginals: Optional[torch.Tensor]  # [n]: node marginals
    log_z: Optional[torch.Tensor] = None  # [B]: log Z beside the best path's score ("decode")


def _from_host(
    values: numpy.ndarray, host: HostClusters, n: int, device: torch.device
) -> torch.Tensor:
    """Per-node results of the host solver (over the host nodes) as an ``[n]`` tensor over the
    node list, 0 at the scanned nodes (the scan fills them in)."""
    if host.node is not None:
        values, host_values = numpy.zeros(n, dtype=values.dtype), values
        values[host.node] = host_values
    return to_device(values, device)


SOLVE_MODES = ("log_z", "viterbi", "marginals", "decode")


def _solve(
    index: torch.Tensor,
    scores: torch.Tensor,
    labels: Optional[torch.Tensor],
    shape: Tuple[int, int, int],
    transitions: Optional[torch.Tensor],
    mode: str,
) -> _Solution:
    """Solve every document of a node list (flat grid ``index`` in grid order, ``scores`` and
    ``labels``, all ``[n]``, on the grid ``shape``); ``mode`` is "log_z", "viterbi",
    "marginals" or "decode" (Viterbi and marginals from one compaction).

    Cliques and small clusters are solved on the host; the rest are scanned (marginals from a
    forward and a mirrored scan). Only "log_z" is differentiable: training takes its gradient
    through the same code.
    """
    if mode not in SOLVE_MODES:
        raise ValueError(f"mode must be one of {SOLVE_MODES}, got {mode!r}")
    B, L, K = shape
    n, device = index.numel(), scores.device
    # a node scored -inf is on no path: as NEG, since -inf would make the solvers' differences
    # of scores NaN (what the grid functions and the node sets share)
    scores = raised_to_neg(scores)
    if transitions is not None:  # in the scores' precision, as the other structured heads
        if labels is None:  # (without them every node would read the null label's row)
            raise ValueError("transitions need the nodes' labels")
        # and -inf raised to NEG, as the scores: a label that only -inf enters made the scan's
        # log-sums NaN (log Z and every marginal), where a path of finite score remained
        transitions = raised_to_neg(transitions, scores.dtype)
    want_best = mode in ("viterbi", "decode")
    want_marginals = mode in ("marginals", "decode")
    comp = compact(index, shape, by_cluster=transitions is None)
    host = comp.host
    host_scores = scores if host.node is None else scores[host.node_t]
    best = marginals = None
    log_z = None
    if mode == "log_z":
        totals = HostLogPartition.apply(host_scores, host, B)
    else:
        solved = solve_host(host, host_array(host_scores), B, want_best, want_marginals)
        totals = torch.from_numpy(solved.totals).to(device, scores.dtype)
        if solved.log_z is not None and want_best:
            log_z = torch.from_numpy(solved.log_z).to(device, scores.dtype)
        if want_best:
            best = _from_host(solved.best, host, n, device)
        if want_marginals:
            marginals = _from_host(solved.marginals, host, n, device).to(scores.dtype)
    if comp.blocks:
        # long: the scan's one_hot takes no int32 labels, which the host solvers accept
        labels = torch.zeros_like(index) if labels is None else labels.long()
        present = torch.ones_like(index, dtype=torch.bool)
    for block in comp.blocks:
        scan_scores = _to_scan_grid(scores, block, K, neg_value(scores.dtype))
        scan_mask = _to_scan_grid(present, block, K, False)
        scan_labels = _to_scan_grid(labels, block, K, 0)
        if want_marginals:
            block_log_z, block_marginals = _scan_marginals(
                scan_scores, scan_mask, scan_labels, transitions)
            marginals[block.node] = block_marginals.reshape(-1)[block.scan_index]
        if want_best:
            result = _scan(scan_scores, scan_mask, scan_labels, transitions, True)
            totals = totals.index_add(0, block.row_doc, result.total)
            best[block.node] = result.best_nodes.reshape(-1)[block.scan_index]
            if log_z is not None:
                log_z = log_z.index_add(0, block.row_doc, block_log_z)
        elif want_marginals:
            totals = totals.index_add(0, block.row_doc, block_log_z)
        else:
            block_log_z = _scan(scan_scores, scan_mask, scan_labels, transitions, False).total
            totals = totals.index_add(0, block.row_doc, block_log_z)
    if mode != "log_z":
        # where every path is -inf (NEG or below once clamped), no path has a probability
        host_totals = solved.totals if not comp.blocks else host_array(totals)
        none = host_totals <= neg_value(scores.dtype) / 2
        if numpy.count_nonzero(none):
            return _without_paths(_Solution(totals, best, marginals, log_z),
                                  to_device(none, device), index // (L * K))
    return _Solution(totals, best, marginals, log_z)


def _without_paths(solution: _Solution, none: torch.Tensor, doc: torch.Tensor) -> _Solution:
    """``solution`` with the documents ``none`` (``BoolTensor[B]``), whose every path is
    ``-inf``, given no distribution: no node on the best path, whose score is ``-inf``, and
    every node's marginal 0 (the nodes' documents are ``doc [n]``); their log Z is left as it
    is, at or below ``NEG / 2`` (finite, so that a gradient is no NaN)."""
    total, best, marginals, log_z = solution
    on_none = none[doc]
    if best is not None:
        best = best & ~on_none
        total = total.masked_fill(none, -math.inf)
    if marginals is not None:
        marginals = marginals.masked_fill(on_none, 0.0)
    return _Solution(total, best, marginals, log_z)


def check_node_labels(labels: torch.Tensor, transitions: torch.Tensor) -> torch.Tensor:
    """``labels`` (the nodes' labels, any shape) as a ``LongTensor``, once checked against
    ``transitions``: a ``ValueError`` unless these are ``[C + 1, C + 1]`` and each label an
    integer in ``0..C - 1``. Label ``C`` read the START row and END column, and a negative one
    wrapped around to them: a wrong path score, not an error."""
    check_transitions(transitions)
    check_integer_dtype(labels, "node labels")
    C = transitions.shape[0] - 1
    if labels.numel():
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= C:
            raise ValueError(
                f"node labels must lie in 0..{C - 1} for {tuple(transitions.shape)} "
                f"transitions, got {low if low < 0 else high}"
            )
    return labels.long()


def check_node_grids(
    node_scores: torch.Tensor, node_mask: torch.Tensor, node_labels: Optional[torch.Tensor],
    mask_name: str = "node_mask",
) -> None:
    """A ``ValueError`` unless the mask ``mask_name`` is a ``[B, L, K]`` grid and the node
    scores and labels (if given) are grids of its shape: a grid without the batch axis failed
    unpacking its shape, and one that broadcast against the mask read other spans' scores or
    labels (or a document's for the whole batch) without an error."""
    check_shape(node_mask, mask_name, "[B, L, K]")
    shape = tuple(node_mask.shape)
    check_shape(node_scores, "node_scores", "[B, L, K]", shape, mask_name)
    if node_labels is not None:
        check_shape(node_labels, "node_labels", "[B, L, K]", shape, mask_name)


def _solve_grid(
    node_scores: torch.Tensor,
    node_mask: torch.Tensor,
    node_labels: Optional[torch.Tensor],
    transitions: Optional[torch.Tensor],
    mode: str,
    node_index: Optional[torch.Tensor] = None,
) -> _Solution:
    """:func:`_solve` for nodes given as ``[B, L, K]`` grids (only the nodes' entries are read;
    the rest of ``node_scores`` may hold anything), its per-node results back on the grid.
    A node scored ``-inf`` is one no path can take with any probability (NaN-free: its score
    becomes :data:`~.semiring.NEG`); a NaN score is not checked for (the heads check theirs)."""
    check_node_grids(node_scores, node_mask, node_labels)
    shape = tuple(node_mask.shape)
    if node_index is None:  # (the compaction refuses a node of the mask past the grid's end)
        node_index = _flat_nonzero(node_mask)
    else:  # before it indexes the grids: past their end it raised an IndexError
        check_shape(node_index, "node_index", "[n]")
        check_integer_dtype(node_index, "node_index")  # (a bool one indexed as a mask)
        check_node_index(node_index, shape)  # (which checks the ends too)
    labels = None if node_labels is None else node_labels.reshape(-1)[node_index]
    if labels is not None and transitions is not None:
        labels = check_node_labels(labels, transitions)
    scores = node_scores.reshape(-1)[node_index]
    solution = _solve(node_index, scores, labels, shape, transitions, mode)
    return _Solution(
        solution.total,
        None if solution.best is None else _on_grid(node_index, solution.best, shape),
        None if solution.marginals is None else _on_grid(node_index, solution.marginals, shape),
    )


def filtered_log_partition(
    node_scores: torch.Tensor,
    node_mask: torch.Tensor,
    node_labels: Optional[torch.Tensor] = None,
    transitions: Optional[torch.Tensor] = None,
    node_index: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``log Z`` per document, ``[B]``: logsumexp of the scores of all maximal paths
    (differentiable: its gradient with respect to the node scores is the node marginals; once
    only where the graph has cliques or small clusters, which are solved on the host: a
    gradient with ``create_graph=True`` raises an error there unless ``node_labels`` and
    ``transitions`` are given, zeros for none, which run the position scan on every document).

    ``node_scores``, ``node_mask`` and ``node_labels`` are ``[B, L, K]`` grids (labels only
    matter with ``transitions``); ``node_index``, the flat indices of the nodes in grid order,
    saves the pass over the mask when the caller has it. Where every path of a document scores
    ``-inf`` its log Z is not ``-inf`` but at or below ``NEG / 2`` (finite, so that its
    gradient is no NaN).

    Raises ``ValueError`` unless ``node_mask`` is ``[B, L, K]`` and the scores and labels
    grids of its shape (:func:`check_node_grids`), and unless ``node_index`` is an ``[n]``
    integer tensor of grid indices in grid order (:func:`~.compaction.check_grid_order`); the
    other grid functions alike."""
    return _solve_grid(node_scores, node_mask, node_labels, transitions, "log_z", node_index).total


@torch.no_grad()
def filtered_viterbi(
    node_scores: torch.Tensor,
    node_mask: torch.Tensor,
    node_labels: Optional[torch.Tensor] = None,
    transitions: Optional[torch.Tensor] = None,
    node_index: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The best path: ``(chosen BoolTensor[B, L, K], best score [B])``. A document whose every
    path scores ``-inf`` (through nodes or transitions of ``-inf``) has no best path: no node
    chosen, and a best score of ``-inf`` (as :func:`~.semicrf.semicrf_viterbi` and
    :func:`~.linear_crf.crf_viterbi` answer)."""
    solution = _solve_grid(node_scores, node_mask, node_labels, transitions, "viterbi", node_index)
    return solution.best, solution.total


@torch.no_grad()
def filtered_marginals(
    node_scores: torch.Tensor,
    node_mask: torch.Tensor,
    node_labels: Optional[torch.Tensor] = None,
    transitions: Optional[torch.Tensor] = None,
    node_index: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``[B, L, K]``: the probability that each node is on the path (0 for non-nodes, and for
    every node of a document whose every path scores ``-inf``: no distribution)."""
    mode = "marginals"
    return _solve_grid(node_scores, node_mask, node_labels, transitions, mode, node_index).marginals


@torch.no_grad()
def filtered_decode(
    node_scores: torch.Tensor,
    node_mask: torch.Tensor,
    node_labels: Optional[torch.Tensor] = None,
    transitions: Optional[torch.Tensor] = None,
    node_index: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The best path and every node's marginal, ``(chosen [B, L, K], marginals [B, L, K])``,
    sharing one compaction (a document whose every path is ``-inf``: none chosen, marginals 0,
    as in :func:`filtered_viterbi` and :func:`filtered_marginals`)."""
    solution = _solve_grid(node_scores, node_mask, node_labels, transitions, "decode", node_index)
    return solution.best, solution.marginals


def check_node_set(nodes: NodeSet) -> None:
    """A ``ValueError`` unless ``nodes`` lists ``[n]`` indices, labels and scores on a grid
    shape ``(B, L, K)``: a shape of two sizes failed unpacking it, a score list of another
    length failed deep inside NumPy or was cut to the index's without an error, and an index
    of another rank was read flat."""
    if len(nodes.shape) != 3:
        raise ValueError(f"nodes.shape must be the grid's (B, L, K), got {tuple(nodes.shape)}")
    check_shape(nodes.index, "nodes.index", "[n]")
    n = tuple(nodes.index.shape)
    check_shape(nodes.labels, "nodes.labels", "[n]", n, "nodes.index")
    check_shape(nodes.scores, "nodes.scores", "[n]", n, "nodes.index")


def solve_node_set(
    nodes: NodeSet, transitions: Optional[torch.Tensor], mode: str
) -> "_Solution":
    """Solve a :class:`NodeSet` without a grid: ``mode`` "log_z" (differentiable), "viterbi",
    "marginals" or "decode" (both). Returns ``(total [B], best [n], marginals [n])``, the total
    being the best path's score when the best path is asked for, else log Z. A node scored
    ``-inf`` is on no path with any probability, as in :func:`filtered_log_partition`; a
    document whose every path is ``-inf`` has none, as in :func:`filtered_decode`. With
    ``transitions``, a ``ValueError`` unless they and the labels fit (:func:`check_node_labels`),
    as on the grid; and a ``ValueError`` for a node set :func:`check_node_set` refuses."""
    check_node_set(nodes)
    labels = nodes.labels
    if transitions is not None:
        labels = check_node_labels(labels, transitions)
    return _solve(nodes.index, nodes.scores, labels, nodes.shape, transitions, mode)


@torch.no_grad()
def decode_node_set(
    nodes: NodeSet,
    transitions: Optional[torch.Tensor] = None,
    marginals: bool = True,
    check_scores: bool = True,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Decode a :class:`NodeSet` without a grid (what a pipeline does at prediction time):
    ``(best BoolTensor[n], marginals [n])``, whether each listed node is on the best path and
    its marginal probability (None when ``marginals`` is False: Viterbi only). A node scored
    ``-inf`` is on no path with any probability (marginal 0), as on the grid; a document whose
    every path is ``-inf`` has no node on the best path and every marginal 0, as in
    :func:`filtered_decode`. Where no two nodes overlap, that takes a look at the scores on
    the host, which ``check_scores=False`` saves a caller whose scores are finite. Raises
    ``ValueError`` for a node set :func:`check_node_set` refuses, or one out of grid order
    (:class:`NodeSet`)."""
    return _decode_node_set(nodes, transitions, marginals, check_scores)[:2]


@torch.no_grad()
def decode_node_set_log_z(
    nodes: NodeSet, transitions: Optional[torch.Tensor] = None, check_scores: bool = True
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """:func:`decode_node_set` with marginals, and the log partition ``[B]`` the solve gives
    beside them (bit for bit :func:`filtered_log_partition`'s), which a path probability
    needs; None where the solve is skipped (no two nodes overlap: every marginal is 1)."""
    return _decode_node_set(nodes, transitions, True, check_scores)  # type: ignore[return-value]


def _decode_node_set(
    nodes: NodeSet, transitions: Optional[torch.Tensor], marginals: bool, check_scores: bool
) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(best, marginals, log Z)`` of :func:`decode_node_set_log_z`, marginals and log Z
    None without ``marginals``."""
    check_node_set(nodes)
    if transitions is None and disjoint(nodes.index, nodes.shape) and not (
            check_scores and numpy.count_nonzero(
                host_array(nodes.scores) <= neg_value(nodes.scores.dtype) / 2)):
        # the graph's one path holds every node, each a clique of its own: what the solve
        # gives (exactly 1.0), without it (most documents of a trained model, one at a time)
        return torch.ones_like(nodes.index, dtype=torch.bool), (
            torch.ones_like(nodes.scores) if marginals else None), None
    solution = solve_node_set(nodes, transitions, "decode" if marginals else "viterbi")
    return solution.best, solution.marginals, solution.log_z


def consistent_log_score(
    node_scores: torch.Tensor,
    node_mask: torch.Tensor,
    gold_mask: torch.Tensor,
    unknown: torch.Tensor,
    node_labels: Optional[torch.Tensor] = None,
    transitions: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``[B]``: the log-sum of the scores of the maximal paths of the graph of ``node_mask``
    that are consistent with a partial annotation: they hold every gold node (``gold_mask``)
    and otherwise only nodes of unknown tokens (``unknown``, :func:`~.spans.unknown_spans`).
    Those nodes overlap no gold node, and every other node overlaps a gold one (as
    :func:`training_nodes` keeps them), so these paths are the maximal paths of the graph of
    the gold nodes and the unknown ones: a log partition of that graph (grids ``[B, L, K]``,
    labels and ``transitions`` as in :func:`path_score`). Raises ``ValueError`` unless every
    grid has the shape of ``node_mask``, ``[B, L, K]`` (:func:`check_node_grids`)."""
    check_node_grids(node_scores, node_mask, node_labels)
    shape = tuple(node_mask.shape)
    check_shape(gold_mask, "gold_mask", "[B, L, K]", shape, "node_mask")
    check_shape(unknown, "unknown", "[B, L, K]", shape, "node_mask")
    return filtered_log_partition(node_scores, gold_mask | (node_mask & unknown), node_labels,
                                  transitions)


def path_score(
    node_scores: torch.Tensor,
    path_mask: torch.Tensor,
    node_labels: Optional[torch.Tensor] = None,
    transitions: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Score of a given path (e.g. the gold spans), ``[B]``: its node scores plus transitions
    between consecutive nodes, from START and to END. The empty path scores 0.

    ``node_scores``, ``path_mask`` (the path's nodes) and ``node_labels`` are ``[B, L, K]``
    grids (labels only matter with ``transitions``; only the path's entries of
    ``node_scores`` are read, so a node at -inf that the path leaves out is no NaN);
    ``transitions`` is ``[C + 1, C + 1]`` for ``C`` labels, null included, its last row from
    START and its last column to END.

    Raises ``ValueError`` unless ``path_mask`` is ``[B, L, K]`` and ``node_scores`` and
    ``node_labels`` grids of its shape (:func:`check_node_grids`): scores of one document
    broadcast to the batch, and labels of another grid were read at other spans."""
    check_node_grids(node_scores, path_mask, node_labels, "path_mask")
    total = torch.where(path_mask.bool(), node_scores, node_scores.new_zeros(())).sum((1, 2))
    if transitions is None:
        return total
    if node_labels is None:
        raise ValueError("transitions need the nodes' labels")
    transitions = transitions.to(node_scores.dtype)  # as in _solve (a no-op where they agree)
    doc, start, width = path_mask.nonzero(as_tuple=True)  # sorted by (doc, start)
    if doc.numel() == 0:
        return total
    C = transitions.shape[0] - 1
    label = check_node_labels(node_labels[doc, start, width], transitions)
    first = torch.ones_like(doc, dtype=torch.bool)
    first[1:] = doc[1:] != doc[:-1]
    last = torch.ones_like(first)
    last[:-1] = first[1:]
    prev = torch.cat([label.new_full((1,), C), label[:-1]])
    prev = torch.where(first, C, prev)
    inner = transitions[prev, label]
    to_end = transitions[label, C] * last
    return total.index_add(0, doc, inner + to_end)


def off_graph(nodes: NodeSet, spans: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
    """``BoolTensor[B]``: the documents whose path ``spans`` (rows ``(doc, start, end, label)``,
    ``node`` the node each one is, -1 for none) is not a path of the filtered graph, which has
    probability 0 under the graph's distribution: it holds a span that is no node, or it leaves
    out a node that overlaps none of its spans (a path's nodes are a maximal non-overlapping
    set), as a constrained path may."""
    B, L, K = nodes.shape
    on_path = torch.zeros((B, L, K), dtype=torch.bool, device=nodes.index.device)
    doc, start, end = spans[:, 0], spans[:, 1], spans[:, 2]
    on_path[doc, start, end - start] = True
    reached = overlap_mask(on_path).view(-1)[nodes.index]
    off = torch.zeros((B,), dtype=torch.bool, device=nodes.index.device)
    off.index_fill_(0, nodes.index[~reached] // (L * K), True)
    return off.index_fill_(0, doc[node < 0], True)


def count_nodes(node_mask: torch.Tensor) -> torch.Tensor:
    """``LongTensor[B]``: nodes kept per document (the filtered graph size)."""
    return node_mask.sum((1, 2))
