"""The filtered semi-Markov CRF (Zaratiana et al., 2023): node sets, log Z, Viterbi, marginals.

The nodes are labelled spans on the grid ``[B, L, K]`` (see :mod:`.spans`): ``node_mask`` says
which spans are nodes, ``node_labels`` their label, ``node_scores`` their global score. A path
is a maximal set of pairwise non-overlapping nodes (the START-to-END paths of the graph of
Liang et al., 1991), scored by the sum of its nodes' scores plus, optionally, the transitions
``T[prev, next]`` between consecutive nodes (``T`` is ``[C + 1, C + 1]``, row C = START,
column C = END). The empty node set has the single empty path, of score 0.

Every algorithm goes through one solver, ``_solve``, over a *compacted* copy of the nodes:

1. Without transitions, the nodes split into clusters: maximal runs of tokens chained by
   overlapping nodes. Clusters do not overlap each other, so a maximal set of the document is
   a union of maximal sets of its clusters: log Z adds up and Viterbi decodes each cluster
   alone. With transitions, a whole document is one row.
2. A cluster whose nodes all overlap each other (a *clique*: its latest start is at or before
   its earliest end, which for intervals is the same thing, by Helly's property) has its
   single nodes as maximal sets: log Z is a logsumexp, Viterbi an argmax and the marginals a
   softmax over its nodes, all clusters at once. A one-node cluster is the simplest clique;
   trained models produce almost nothing else. Other clusters of up to
   ``ENUMERATE_MAX_NODES`` nodes are solved exactly by enumerating their node subsets, all
   clusters at once.
3. The other rows get the position scan of DESIGN.md §2, with the tokens that no node covers
   dropped: the graph only depends on the order of node boundaries, which dropping uncovered
   tokens preserves, and then the predecessors of a node starting at ``s`` all end in
   ``[s - 2K + 1, s - 1]``, so each step reads a window of ``2K - 1`` ends, not the prefix.
   Marginals come from the scan of the rows and of the mirrored rows.

The scan loops over positions only; everything else is batched tensor code, except the
compaction itself: NumPy bookkeeping on the host over the list of nodes (integers only; the
scores stay on their device).
"""
import functools
from typing import NamedTuple, Optional, Tuple

import numpy
import torch

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


def _filter(local_scores: torch.Tensor, lengths: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(index [n], labels [n])``: the flat grid indices (in grid order) and local argmax
    labels of the candidate spans whose local argmax is not null."""
    B, L, K, C = local_scores.shape
    planes = _label_planes(local_scores)
    # amax + a comparison over whole planes is several times faster than argmax over the label
    # axis on CPU; argmax then runs on the kept spans only. Ties go to null, as with argmax.
    keep = (planes[1:].amax(0) > planes[0]) & span_mask(lengths, L, K).view(-1)
    index = keep.nonzero().squeeze(1)
    return index, planes[1:, index].argmax(0) + 1


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
    index, labels = _filter(local_scores, lengths)
    grid = local_scores.shape[:3]
    return _on_grid(index, torch.ones_like(labels, dtype=torch.bool), grid), _on_grid(index, labels, grid)


def inference_node_set(
    local_scores: torch.Tensor, global_scores: torch.Tensor, lengths: torch.Tensor
) -> NodeSet:
    """The inference nodes of :func:`inference_nodes` with their global scores
    (``global_scores`` is ``[B, L, K, C]`` like ``local_scores``) and their list."""
    index, labels = _filter(local_scores, lengths)
    grid = local_scores.shape[:3]
    scores = _label_planes(global_scores)[labels, index].float()
    return NodeSet(
        _on_grid(index, torch.ones_like(labels, dtype=torch.bool), grid),
        _on_grid(index, labels, grid),
        _on_grid(index, scores, grid),
        index,
    )


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


# ----------------------------------------------------------------------------- compaction


class ScanBlock(NamedTuple):
    """Where some nodes of the ``[B, L, K]`` grid go in one compact ``[N, Lc, K]`` scan grid.

    ``grid_index`` are the flat grid indices of the nodes and ``scan_index`` their flat indices
    in the scan grid; ``row_doc`` maps the ``n_rows`` scan rows to documents.
    """

    grid_index: torch.Tensor
    scan_index: torch.Tensor
    row_doc: torch.Tensor
    n_rows: int
    scan_length: int


class Cliques(NamedTuple):
    """Clusters whose nodes pairwise overlap: ``grid_index`` are the flat grid indices of their
    nodes, ``cluster`` the clique (``0 .. n_cliques - 1``) of each node, ``row_doc`` the
    document of each clique."""

    grid_index: torch.Tensor
    cluster: torch.Tensor
    row_doc: torch.Tensor
    n_cliques: int


class Compaction(NamedTuple):
    """How each node of a node set is solved: in a clique, a small enumerated cluster or a
    scan block.

    Rows (clusters or documents) are grouped into blocks of similar length, a block per power
    of two, so that the scan's work is proportional to the covered tokens and not to the number
    of rows times the longest row.
    """

    blocks: Tuple[ScanBlock, ...]
    cliques: Cliques
    small: Tuple["SmallClusters", ...]


def compact(
    node_mask: torch.Tensor, by_cluster: bool, node_index: Optional[torch.Tensor] = None
) -> Compaction:
    """Cut the nodes into scan rows (clusters, or whole documents with uncovered tokens
    dropped), working on the list of nodes only.

    Nodes come out of ``nonzero`` sorted by (doc, start); a node opens a new cluster iff it
    starts after the furthest end of all earlier nodes of its document. A cluster covers a
    contiguous run of tokens, so node positions relative to the cluster start are already
    compact. Rows are right-aligned in their block's scan grid, so that every row ends at the
    last position, where the scan reads END.

    This is bookkeeping on a short list of integers (about one node per entity for a trained
    model), so it runs in NumPy on the host: a NumPy call costs about a microsecond where a
    PyTorch op costs several, and decoding a batch is dominated by such fixed costs. The
    scores never leave their device; only the node list and the index tensors cross.
    """
    B, L, K = node_mask.shape
    device = node_mask.device
    if node_index is None:
        node_index = node_mask.view(-1).nonzero().squeeze(1)
    flat = node_index.cpu().numpy()
    # max(.., 1): an empty grid has no nodes to divide
    doc, start, width = flat // max(L * K, 1), flat // max(K, 1) % max(L, 1), flat % max(K, 1)
    end = start + width
    if doc.size == 0:
        return Compaction((), _cliques(flat, flat, flat, device), ())
    offset = doc * (L + 1)  # keeps documents apart in the running maximum
    reach = numpy.maximum.accumulate(offset + end)
    opens = numpy.empty(doc.size, dtype=bool)
    opens[0] = True
    opens[1:] = offset[1:] + start[1:] > reach[:-1]
    cluster = opens.cumsum() - 1
    first_node = opens.nonzero()[0]
    cl_start, cl_doc = start[first_node], doc[first_node]
    cl_end = numpy.maximum.reduceat(end, first_node)  # a cluster's nodes are contiguous
    cl_len = cl_end - cl_start + 1
    rel_start = start - cl_start[cluster]
    clique = small = numpy.zeros(opens.size, dtype=bool)
    small_clusters = ()
    if by_cluster:
        node_row, row_len, row_doc = cluster, cl_len, cl_doc
        row_nodes = numpy.bincount(cluster)[cluster]
        # nodes are sorted by start within a cluster: its last node starts latest
        last_start = start[numpy.append(first_node[1:], doc.size) - 1]
        clique = (last_start <= numpy.minimum.reduceat(end, first_node))[cluster]
        small = ~clique & (row_nodes <= ENUMERATE_MAX_NODES)
        groups = []
        n_small = int(numpy.count_nonzero(small & opens))
        widest = int(row_nodes[small].max()) if n_small else 0
        # one group while the padding to the widest cluster is cheaper than another group's
        # fixed cost of a few dozen calls
        one_group = n_small << widest <= ENUMERATE_ONE_GROUP_CELLS
        for low, high in ((2, ENUMERATE_MAX_NODES),) if one_group else ENUMERATE_GROUPS:
            group = small & (row_nodes >= low) & (row_nodes <= high)
            if group.any():
                n = int(row_nodes[group].max())
                groups.append(_small_clusters(
                    flat[group], opens[group], cluster[group], start[group], end[group], cl_doc,
                    n, device,
                ))
        small_clusters = tuple(groups)
    else:
        # one row per document: a cluster starts after the covered tokens of the earlier
        # clusters of its document
        first_of_doc = numpy.ones(cl_doc.size, dtype=bool)
        first_of_doc[1:] = cl_doc[1:] != cl_doc[:-1]
        before = cl_len.cumsum() - cl_len
        doc_base = numpy.maximum.accumulate(numpy.where(first_of_doc, before, -1))
        rel_start = rel_start + (before - doc_base)[cluster]
        cl_row = first_of_doc.cumsum() - 1
        node_row = cl_row[cluster]
        row_doc = cl_doc[first_of_doc]
        row_len = numpy.bincount(cl_row, weights=cl_len).astype(numpy.int64)
    scanned = ~clique & ~small
    cliques = _cliques(flat[clique], cluster[clique], cl_doc, device)
    if not scanned.any():  # the usual case for a trained model: nothing to scan
        return Compaction((), cliques, small_clusters)
    has_scan = numpy.bincount(node_row[scanned], minlength=row_len.size) > 0
    node_block = numpy.where(scanned, _length_blocks(row_len, has_scan)[node_row], -1)
    blocks = []
    for b in numpy.unique(node_block[scanned]).tolist():
        in_block = node_block == b
        rows = numpy.unique(node_row[in_block])  # sorted
        length = int(row_len[rows].max())
        new_row = numpy.searchsorted(rows, node_row[in_block])
        pad = length - row_len[node_row[in_block]]
        scan_index = (new_row * length + rel_start[in_block] + pad) * K + width[in_block]
        blocks.append(ScanBlock(
            *(_to_device(x, device) for x in (flat[in_block], scan_index, row_doc[rows])),
            rows.size, length,
        ))
    return Compaction(tuple(blocks), cliques, small_clusters)


def _cliques(flat, cluster, cl_doc, device: torch.device) -> Cliques:
    """The :class:`Cliques` of the nodes at ``flat`` (NumPy, in cluster order), whose clusters
    are ``cluster`` (ids into ``cl_doc``, not necessarily dense)."""
    opens = numpy.ones(cluster.size, dtype=bool)
    opens[1:] = cluster[1:] != cluster[:-1]
    dense = opens.cumsum() - 1
    row_doc = cl_doc[cluster[opens]]
    return Cliques(*(_to_device(x, device) for x in (flat, dense, row_doc)), int(row_doc.size))


def _to_device(x: numpy.ndarray, device: torch.device) -> torch.Tensor:
    out = torch.from_numpy(numpy.ascontiguousarray(x))
    return out if device.type == "cpu" else out.to(device)


# Clusters of at most this many nodes are solved by enumerating their 2^n node subsets, all
# clusters at once, instead of by the scan: a fixed number of batched ops instead of one
# Python step per position. Trained models produce mostly such clusters.
ENUMERATE_MAX_NODES = 8
# Small clusters are enumerated in groups by node count, so that one 8-node cluster does not
# make every 2-node cluster of the batch pay for 2^8 subsets.
ENUMERATE_GROUPS = ((2, 4), (5, ENUMERATE_MAX_NODES))
# ... unless (clusters x subsets of the widest) stays below this: then one group is cheaper.
ENUMERATE_ONE_GROUP_CELLS = 1 << 15


@functools.lru_cache(maxsize=None)
def _subset_tables(n: int) -> Tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray, numpy.ndarray]:
    """``subsets [2^n, n]``: the bits of every subset of n slots, as booleans and as floats (for
    matmuls); ``pairs [2, n(n-1)/2]``: the slot pairs ``a < b``; ``pairs_in [2^n, n(n-1)/2]``:
    whether the subset holds both slots of each pair (as floats)."""
    subsets = (numpy.arange(2**n)[:, None] >> numpy.arange(n)) & 1 == 1
    pairs = numpy.stack(numpy.triu_indices(n, 1))
    pairs_in = (subsets[:, pairs[0]] & subsets[:, pairs[1]]).astype(numpy.float32)
    return subsets, subsets.astype(numpy.float32), pairs, pairs_in


class SmallClusters(NamedTuple):
    """Clusters of 2..ENUMERATE_MAX_NODES nodes as ``[R, n]`` slots, with their maximal sets.

    ``grid_index[r, a]`` is the flat grid index of slot ``a`` of cluster ``r`` (0 for an empty
    slot, see ``present``); ``subsets[s, a]`` says whether subset ``s`` holds slot ``a``;
    ``maximal[r, s]`` whether subset ``s`` is a maximal non-overlapping set of cluster ``r``.
    """

    grid_index: torch.Tensor
    present: torch.Tensor
    row_doc: torch.Tensor
    subsets: torch.Tensor
    maximal: torch.Tensor


def _small_clusters(
    flat, opens, node_row, start, end, row_doc, n: int, device: torch.device
) -> SmallClusters:
    """Slot tables and maximal sets of some whole clusters (NumPy arrays over their nodes, in
    cluster order: ``opens`` marks each cluster's first node, ``node_row`` is the cluster id;
    ``n`` nodes in the largest)."""
    first = opens.nonzero()[0]
    rows, node_cluster = node_row[first], opens.cumsum() - 1
    slot = numpy.arange(flat.size) - first[node_cluster]
    R = rows.size
    grid_index = numpy.zeros((R, n), dtype=flat.dtype)
    grid_index[node_cluster, slot] = flat
    present = numpy.zeros((R, n), dtype=bool)
    present[node_cluster, slot] = True
    starts = numpy.zeros((R, n), dtype=start.dtype)
    starts[node_cluster, slot] = start
    ends = numpy.empty((R, n), dtype=end.dtype)
    ends.fill(-1)
    ends[node_cluster, slot] = end
    overlap = (starts[:, :, None] <= ends[:, None, :]) & (starts[:, None, :] <= ends[:, :, None])
    subsets, subsets_f, pairs, pairs_in = _subset_tables(n)
    # subset s holds two overlapping nodes of cluster r (a node overlaps itself, so only
    # the pairs a < b are read; empty slots start at 0 and end at -1: they overlap nothing)
    conflict = (overlap[:, pairs[0], pairs[1]].astype(numpy.float32) @ pairs_in.T) > 0
    # covered[r, a, s]: slot a is in subset s or overlaps one of its nodes; an empty slot
    # counts as covered by any non-empty subset, so that only real nodes can be left free
    overlap[~present] = True
    covered = (overlap.reshape(R * n, n).astype(numpy.float32) @ subsets_f.T) > 0
    absent = (subsets_f @ (~present).astype(numpy.float32).T).T > 0  # uses an empty slot
    maximal = ~conflict & ~absent & covered.reshape(R, n, -1).all(1)
    return SmallClusters(
        *(_to_device(x, device) for x in (grid_index, present, row_doc[rows], subsets, maximal))
    )


# A scan step costs about as much as this many rows of work inside a step (dispatch overhead
# against arithmetic, measured on CPU); it decides when two length blocks are cheaper merged.
STEP_COST_IN_ROWS = 256


def _length_blocks(row_len, scanned) -> numpy.ndarray:
    """Block id of each row (``row_len`` and ``scanned`` are arrays over the rows): rows of
    length in (2^(b-1), 2^b] start in block b; a shorter block is then merged into the next
    longer one while that saves more padded row-steps than the scan steps it adds."""
    block = numpy.ceil(numpy.log2(numpy.maximum(row_len, 1))).astype(numpy.int64)
    ids = numpy.unique(block[scanned]).tolist()
    if len(ids) < 2:
        return block
    counts = {b: int(((block == b) & scanned).sum()) for b in ids}
    longest = {b: int(row_len[(block == b) & scanned].max()) for b in ids}
    merged_into = {ids[-1]: ids[-1]}
    for small, larger in zip(ids[-2::-1], ids[:0:-1]):  # from the longest pair down
        target = merged_into[larger]
        extra_row_steps = counts[small] * (longest[target] - longest[small])
        if extra_row_steps < STEP_COST_IN_ROWS * longest[small]:
            merged_into[small] = target
            counts[target] += counts[small]
        else:
            merged_into[small] = small
    lookup = block.copy()
    for small, target in merged_into.items():
        lookup[block == small] = target
    return lookup


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
    chosen = marginals = None
    if want_best:
        chosen = torch.zeros(B * L * K, dtype=torch.bool, device=node_mask.device)
    if want_marginals:
        marginals = node_scores.new_zeros(B * L * K)
    totals = _solve_cliques(comp.cliques, flat_scores, B, chosen, marginals)
    for small in comp.small:
        subsets = small.subsets.to(node_scores.dtype)
        slot_scores = torch.where(small.present, flat_scores[small.grid_index], 0.0)
        subset_scores = masked_fill_neg(slot_scores @ subsets.T, small.maximal)
        if want_best:
            best_score, best = subset_scores.max(1)
            totals = totals.index_add(0, small.row_doc, best_score)
            chosen[small.grid_index[small.subsets[best] & small.present]] = True
        else:
            totals = totals.index_add(0, small.row_doc, lse(subset_scores, 1))
        if want_marginals:
            slot_marginals = torch.softmax(subset_scores, 1) @ subsets
            marginals[small.grid_index[small.present]] = slot_marginals[small.present]
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


def _solve_cliques(
    cliques: Cliques,
    flat_scores: torch.Tensor,
    n_docs: int,
    chosen: Optional[torch.Tensor],
    marginals: Optional[torch.Tensor],
) -> torch.Tensor:
    """Solve the cliques, whose maximal sets are their single nodes: returns the documents'
    totals so far, ``[n_docs]`` (the best node's score per clique for Viterbi, else the
    logsumexp of its nodes), and fills ``chosen`` (the best node of each clique) and
    ``marginals`` (a softmax per clique) in place where given."""
    totals = flat_scores.new_zeros(n_docs)
    scores = flat_scores[cliques.grid_index]
    if cliques.n_cliques == 0:  # still joined to the scores, for a caller's backward
        return totals.index_add(0, cliques.row_doc, scores)
    where = cliques.cluster
    # the shift is a constant of the logsumexp: no gradient needs to flow through it
    top = scores.detach().new_full((cliques.n_cliques,), NEG).scatter_reduce(
        0, where, scores.detach(), "amax"
    )
    if chosen is not None:
        # the first node reaching its clique's maximum
        order = torch.arange(scores.shape[0], device=scores.device)
        first = torch.where(scores >= top[where], order, scores.shape[0])
        best = torch.full_like(top, scores.shape[0], dtype=torch.long).scatter_reduce(
            0, where, first, "amin"
        )
        chosen[cliques.grid_index[best]] = True
        if marginals is None:
            return totals.index_add(0, cliques.row_doc, top)
    weights = (scores - top[where]).exp()
    norm = weights.new_zeros(cliques.n_cliques).index_add(0, where, weights)
    if marginals is not None:
        marginals[cliques.grid_index] = weights / norm[where]
    return totals.index_add(0, cliques.row_doc, top if chosen is not None else top + norm.log())


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
