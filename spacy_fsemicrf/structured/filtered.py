"""The filtered semi-Markov CRF (Zaratiana et al., 2023): node sets, log Z, Viterbi, marginals.

The nodes are labelled spans on the grid ``[B, L, K]`` (see :mod:`.spans`): ``node_mask`` says
which spans are nodes, ``node_labels`` their label, ``node_scores`` their global score. A path
is a maximal set of pairwise non-overlapping nodes (the START-to-END paths of the graph of
Liang et al., 1991), scored by the sum of its nodes' scores plus, optionally, the transitions
``T[prev, next]`` between consecutive nodes (``T`` is ``[C + 1, C + 1]``, row C = START,
column C = END). The empty node set has the single empty path, of score 0.

Every algorithm goes through one solver, ``_solve``, over a *compacted* copy of the nodes
(:mod:`.compaction`): clusters of pairwise overlapping nodes (cliques) and other small
clusters are solved exactly on the host; log Z stays differentiable there through its
gradient, the node marginals. The remaining rows (larger clusters, or whole documents when
there are transitions) get the position scan of DESIGN.md §2, with the tokens that no node
covers dropped: the graph only depends on the order of node boundaries, which dropping
uncovered tokens preserves, and then the predecessors of a node starting at ``s`` all end in
``[s - 2K + 1, s - 1]``, so each step reads a window of ``2K - 1`` ends, not the prefix.
Marginals of scanned rows come from the scan of the rows and of the mirrored rows.

The scan loops over positions only and is batched tensor code on the scores' device. Each
solver takes an optional ``node_index``: the flat grid indices of the nodes in grid order
(:attr:`NodeSet.index`), which saves a pass over the grid.
"""
from typing import NamedTuple, Optional, Tuple

import torch

from .compaction import HostLogPartition, ScanBlock, to_device, compact, solve_host
from .semiring import NEG, lse, logaddexp, masked_fill_neg
from .spans import overlap_mask, span_mask


# ----------------------------------------------------------------------------- node sets


class NodeSet(NamedTuple):
    """A filtered node set on the ``[B, L, K]`` grid, with its nodes also listed.

    ``index`` holds the flat grid indices of the nodes in grid order (by document, start,
    width): the compaction starts from that list, so a solver handed it skips a pass over the
    grid. ``scores`` are the global scores read at each node's label (0 off the nodes).
    """

    mask: torch.Tensor
    labels: torch.Tensor
    scores: torch.Tensor
    index: torch.Tensor


def _label_planes(scores: torch.Tensor) -> torch.Tensor:
    """``[C, B * L * K]``: one plane per label (a view when, as the heads lay them out, the
    ``[B, L, K, C]`` scores are label-major in memory; a copy otherwise)."""
    return scores.permute(3, 0, 1, 2).reshape(scores.shape[-1], -1)


def _filter(
    local_scores: torch.Tensor, lengths: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(mask [B, L, K], index [n], labels [n])``: the candidate spans whose local argmax is
    not null, as a grid, as flat grid indices (in grid order), and their local argmax labels."""
    B, L, K, C = local_scores.shape
    planes = _label_planes(local_scores)
    # amax + a comparison over whole planes is several times faster than argmax over the label
    # axis on CPU; argmax then runs on the kept spans only. Ties go to null, as with argmax.
    keep = (planes[1:].amax(0) > planes[0]) & span_mask(lengths, L, K).view(-1)
    index = keep.nonzero().squeeze(1)
    # rows of the transposed planes: a gather along the first axis is the fast one
    return keep.view(B, L, K), index, planes.T[index, 1:].argmax(1) + 1


def _on_grid(index: torch.Tensor, values: torch.Tensor, shape: Tuple[int, ...]) -> torch.Tensor:
    """A zero grid of ``shape`` holding ``values`` at the flat ``index``."""
    grid = values.new_zeros(shape)
    return grid.view(-1).index_put_((index,), values).view(shape)


def inference_nodes(
    local_scores: torch.Tensor, lengths: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Filtering at inference: the candidate spans whose local argmax label is not null.

    ``local_scores`` is ``[B, L, K, C]``; returns ``(node_mask [B, L, K], node_labels [B, L, K])``.
    """
    mask, index, labels = _filter(local_scores, lengths)
    return mask, _on_grid(index, labels, mask.shape)


def inference_node_set(
    local_scores: torch.Tensor, global_scores: torch.Tensor, lengths: torch.Tensor
) -> NodeSet:
    """The inference nodes of :func:`inference_nodes` with their global scores
    (``global_scores`` is ``[B, L, K, C]`` like ``local_scores``) and their list."""
    mask, index, labels = _filter(local_scores, lengths)
    scores = _label_planes(global_scores)[labels, index].float()
    return NodeSet(mask, _on_grid(index, labels, mask.shape), _on_grid(index, scores, mask.shape), index)


def training_nodes(
    local_scores: torch.Tensor, lengths: torch.Tensor, gold_grid: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Filtering under the gold-path constraint (DESIGN.md §2.5).

    Nodes are the gold spans with their gold labels, plus the spans with a non-null local label
    that are not gold and overlap some gold span. Each extra node overlaps a gold span, so the
    gold spans stay a maximal non-overlapping set, i.e. a path, and ``log Z >= gold score``.
    """
    pred_mask, pred_labels = inference_nodes(local_scores, lengths)
    gold_mask = gold_grid > 0
    extra = pred_mask & ~gold_mask & overlap_mask(gold_mask)
    mask = gold_mask | extra
    labels = torch.where(gold_mask, gold_grid, pred_labels) * mask
    return mask, labels


def start_bound(node_mask: torch.Tensor) -> torch.Tensor:
    """``P(s)`` of DESIGN.md §2 for ``s = 0..L``: ``LongTensor[B, L + 1]``.

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
    """Gather ``values`` (flattened ``[B, L, K]``) into the block's ``[N, Lc, K]`` scan grid."""
    out = values.new_full((block.n_rows * block.scan_length * K,), fill)
    out = out.index_put((block.scan_index,), values.reshape(-1)[block.grid_index])
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
    """Position scan of DESIGN.md §2 over compacted, right-aligned rows ``[N, Lc, K]``.

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
    neg = scores.new_full((), NEG)

    # unbind once: indexing scores[:, s] in the loop would give every step a full-size gradient
    # buffer in backward, making it quadratic in the length.
    score_steps = scores.unbind(1)
    alpha_hist = []  # alpha of the nodes starting at each position: [N, K]
    q_hist = []  # Q[e] = ⊕_l' A[e, l'] ⊗ T_in[l', :], per end e: [N, n_in]
    a_hist = []  # A[e]: [N, n_ch]
    pending = scores.new_full((N, K, n_ch), NEG)
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
    chosen: Optional[torch.Tensor]  # [B, L, K] bool: the best path
    marginals: Optional[torch.Tensor]  # [B, L, K]: node marginals


def _solve(
    node_scores: torch.Tensor,
    node_mask: torch.Tensor,
    node_labels: Optional[torch.Tensor],
    transitions: Optional[torch.Tensor],
    mode: str,
    node_index: Optional[torch.Tensor] = None,
) -> _Solution:
    """Solve every document; ``mode`` is "log_z", "viterbi", "marginals" or "decode" (Viterbi
    and marginals from one compaction).

    Only the scores of the nodes are read: the rest of ``node_scores`` may hold anything.
    One-node clusters are on every path (marginal 1); small clusters are solved by enumeration
    (their marginals are the softmax over their maximal sets); the rest are scanned (marginals
    from a forward and a mirrored scan). Only "log_z" is differentiable: training takes its
    gradient through the same code.
    """
    B, L, K = node_mask.shape
    want_best = mode in ("viterbi", "decode")
    want_marginals = mode in ("marginals", "decode")
    comp = compact(node_mask, by_cluster=transitions is None, node_index=node_index)
    flat_scores = node_scores.reshape(-1)
    host_scores = flat_scores[comp.host.grid_index]
    chosen = marginals = None
    if mode == "log_z":
        totals = HostLogPartition.apply(host_scores, comp.host, B)
    else:
        host = solve_host(comp.host, host_scores.detach().cpu().numpy(), B, want_best, want_marginals)
        totals = torch.from_numpy(host.totals).to(node_scores.device)
    if want_best:
        chosen = torch.zeros(B * L * K, dtype=torch.bool, device=node_mask.device)
        chosen[to_device(comp.host.flat[host.best], node_mask.device)] = True
    if want_marginals:
        marginals = node_scores.new_zeros(B * L * K)
        marginals[comp.host.grid_index] = to_device(host.marginals, node_mask.device)
    labels = node_labels if node_labels is not None else torch.zeros_like(node_mask, dtype=torch.long)
    for block in comp.blocks:
        scan_scores = _to_scan_grid(node_scores, block, K, NEG)
        scan_mask = _to_scan_grid(node_mask, block, K, False)
        scan_labels = _to_scan_grid(labels * node_mask, block, K, 0)
        if want_marginals:
            log_z, block_marginals = _scan_marginals(scan_scores, scan_mask, scan_labels, transitions)
            marginals[block.grid_index] = block_marginals.reshape(-1)[block.scan_index]
        if want_best:
            result = _scan(scan_scores, scan_mask, scan_labels, transitions, True)
            totals = totals.index_add(0, block.row_doc, result.total)
            chosen[block.grid_index[result.best_nodes.reshape(-1)[block.scan_index]]] = True
        elif want_marginals:
            totals = totals.index_add(0, block.row_doc, log_z)
        else:
            log_z = _scan(scan_scores, scan_mask, scan_labels, transitions, False).total
            totals = totals.index_add(0, block.row_doc, log_z)
    return _Solution(
        totals,
        None if chosen is None else chosen.view(B, L, K),
        None if marginals is None else marginals.view(B, L, K),
    )


def _solve_no_grad(
    node_scores, node_mask, node_labels, transitions, mode: str, node_index=None
) -> _Solution:
    with torch.no_grad():
        return _solve(node_scores, node_mask, node_labels, transitions, mode, node_index)


def filtered_log_partition(
    node_scores: torch.Tensor,
    node_mask: torch.Tensor,
    node_labels: Optional[torch.Tensor] = None,
    transitions: Optional[torch.Tensor] = None,
    node_index: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``log Z`` per document, ``[B]``: logsumexp of the scores of all maximal paths
    (differentiable: its gradient with respect to the node scores is the node marginals)."""
    return _solve(node_scores, node_mask, node_labels, transitions, "log_z", node_index).total


def filtered_viterbi(
    node_scores: torch.Tensor,
    node_mask: torch.Tensor,
    node_labels: Optional[torch.Tensor] = None,
    transitions: Optional[torch.Tensor] = None,
    node_index: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The best path: ``(chosen BoolTensor[B, L, K], best score [B])``."""
    solution = _solve_no_grad(node_scores, node_mask, node_labels, transitions, "viterbi", node_index)
    return solution.chosen, solution.total


def filtered_marginals(
    node_scores: torch.Tensor,
    node_mask: torch.Tensor,
    node_labels: Optional[torch.Tensor] = None,
    transitions: Optional[torch.Tensor] = None,
    node_index: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``[B, L, K]``: the probability that each node is on the path (0 for non-nodes)."""
    return _solve_no_grad(node_scores, node_mask, node_labels, transitions, "marginals", node_index).marginals


def filtered_decode(
    node_scores: torch.Tensor,
    node_mask: torch.Tensor,
    node_labels: Optional[torch.Tensor] = None,
    transitions: Optional[torch.Tensor] = None,
    node_index: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The best path and every node's marginal, ``(chosen [B, L, K], marginals [B, L, K])``,
    sharing one compaction (what a pipeline needs at prediction time)."""
    solution = _solve_no_grad(node_scores, node_mask, node_labels, transitions, "decode", node_index)
    return solution.chosen, solution.marginals


def path_score(
    node_scores: torch.Tensor,
    path_mask: torch.Tensor,
    node_labels: Optional[torch.Tensor] = None,
    transitions: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Score of a given path (e.g. the gold spans), ``[B]``: its node scores plus transitions
    between consecutive nodes, from START and to END. The empty path scores 0."""
    B, L, K = path_mask.shape
    total = (node_scores * path_mask).sum((1, 2))
    if transitions is None:
        return total
    doc, start, width = path_mask.nonzero(as_tuple=True)  # sorted by (doc, start)
    if doc.numel() == 0:
        return total
    C = transitions.shape[0] - 1
    label = node_labels[doc, start, width]
    first = torch.ones_like(doc, dtype=torch.bool)
    first[1:] = doc[1:] != doc[:-1]
    last = torch.ones_like(first)
    last[:-1] = first[1:]
    prev = torch.cat([label.new_full((1,), C), label[:-1]])
    prev = torch.where(first, C, prev)
    inner = transitions[prev, label]
    to_end = transitions[label, C] * last
    return total.index_add(0, doc, inner + to_end)


def count_nodes(node_mask: torch.Tensor) -> torch.Tensor:
    """``LongTensor[B]``: nodes kept per document (the filtered graph size)."""
    return node_mask.sum((1, 2))
