"""Compaction of a filtered node set, and the exact solution of its small clusters on the host.

Nodes come as a list: their flat indices into the ``[B, L, K]`` grid, in grid order; what the
compaction returns refers to positions in that list (*node positions*). Without transitions
they split into *clusters*: maximal runs of tokens chained by overlapping nodes. Clusters do
not overlap each other, so a maximal set of a document is a union of maximal sets of its
clusters: log Z adds up, Viterbi decodes each cluster alone, marginals are per cluster.

* A cluster whose nodes pairwise overlap (a *clique*: its latest start is at or before its
  earliest end, which for intervals is the same thing, by Helly's property) has its single
  nodes as maximal sets: log Z is a logsumexp, Viterbi an argmax, the marginals a softmax over
  its nodes. A one-node cluster is the simplest clique; trained models produce little else.
* Other clusters of up to ``ENUMERATE_MAX_NODES`` nodes are solved over their maximal
  non-overlapping node subsets, which are enumerated once per cluster *pattern* (node count
  and overlapping pairs) and then looked up.
* The rest go to the position scan of :mod:`.filtered`, in :class:`ScanBlock` rows: clusters,
  or whole documents when there are transitions, with uncovered tokens dropped.

The compaction is bookkeeping on a short list of integers (about one node per entity for a
trained model) and the cliques and small clusters are a few hundred scores, so both run in
NumPy on the host: a NumPy call costs about a microsecond where a PyTorch op costs several,
and decoding a batch is dominated by such fixed costs. Only the node list and those nodes'
scores cross to the host; the scan's scores stay on their device.
"""
import functools
import threading
from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy
import torch

# Clusters of at most this many nodes are solved over their 2^n node subsets, all clusters at
# once, instead of by the scan: a fixed number of batched ops instead of one Python step per
# position.
ENUMERATE_MAX_NODES = 8
# Small clusters are enumerated in groups by node count, so that one 8-node cluster does not
# make every 3-node cluster of the batch pay for 2^8 subsets.
ENUMERATE_GROUPS = ((2, 4), (5, ENUMERATE_MAX_NODES))
# ... unless (clusters x subsets of the widest) stays below this: then one group is cheaper.
ENUMERATE_ONE_GROUP_CELLS = 1 << 15
# A scan step costs about as much as this many rows of work inside a step (dispatch overhead
# against arithmetic, measured on CPU); it decides when two length blocks are cheaper merged.
STEP_COST_IN_ROWS = 256


class ScanBlock(NamedTuple):
    """Where some nodes go in one compact ``[N, Lc, K]`` scan grid.

    ``node`` are the node positions and ``scan_index`` their flat indices in the scan grid;
    ``row_doc`` maps the ``n_rows`` scan rows to documents.
    """

    node: torch.Tensor
    scan_index: torch.Tensor
    row_doc: torch.Tensor
    n_rows: int
    scan_length: int


class SmallClusters(NamedTuple):
    """Clusters of 2..ENUMERATE_MAX_NODES nodes as ``[R, n]`` slots, with their maximal sets
    (NumPy arrays).

    ``slot_node[r, a]`` is the position, among the host nodes, of slot ``a`` of cluster ``r``
    (0 for an empty slot, see ``present``); ``subsets[s, a]`` says whether subset ``s`` holds
    slot ``a``; ``maximal[r, s]`` whether subset ``s`` is a maximal non-overlapping set of
    cluster ``r``; ``row_doc[r]`` is the cluster's document.
    """

    slot_node: numpy.ndarray
    present: numpy.ndarray
    row_doc: numpy.ndarray
    subsets: numpy.ndarray
    maximal: numpy.ndarray


class HostClusters(NamedTuple):
    """The clusters solved on the host: cliques and small clusters.

    ``node`` are the node positions of their nodes, the *host nodes*, and ``node_t`` the same
    on the scores' device; both are None when the host nodes are all the nodes, in order (then
    the host solver reads the scores as they are). ``node_doc`` are the host nodes' documents.
    Cliques are runs of host nodes:
    ``clique_node`` lists their positions, clique by clique (None when the cliques are all the
    host nodes, in order), ``clique_first`` where each clique starts in that list,
    ``clique_of`` the clique of each entry and ``clique_doc`` each clique's document.
    """

    node: Optional[numpy.ndarray]
    node_t: Optional[torch.Tensor]
    node_doc: numpy.ndarray
    clique_node: Optional[numpy.ndarray]
    clique_first: numpy.ndarray
    clique_of: numpy.ndarray
    clique_doc: numpy.ndarray
    small: Tuple[SmallClusters, ...]


class Compaction(NamedTuple):
    """How the nodes of a node set are solved: on the host (cliques and small clusters) or by
    the scan, in blocks of rows of similar length (a block per power of two, so that the
    scan's work is proportional to the covered tokens and not to the number of rows times the
    longest row)."""

    blocks: Tuple[ScanBlock, ...]
    host: HostClusters


def compact(node_index: torch.Tensor, shape: Tuple[int, int, int], by_cluster: bool) -> Compaction:
    """Cut the nodes of a ``shape = (B, L, K)`` grid, listed by their flat grid indices in grid
    order (``node_index``), into cliques, small clusters and scan rows (clusters when
    ``by_cluster``, else whole documents with uncovered tokens dropped).

    Nodes in grid order are sorted by (doc, start). Their starts and ends are placed on one
    line for the whole batch, with a gap between documents (``doc * (L + 1) + start``): then a
    node opens a new cluster iff it starts after the furthest end of all earlier nodes, and
    the running maximum of the ends never reaches into the next document. A cluster covers a
    contiguous run of tokens, so node positions relative to the cluster start are already
    compact. Scan rows are right-aligned in their block's scan grid, so that every row ends at
    the last position, where the scan reads END.
    """
    device = node_index.device
    flat = node_index.cpu().numpy()
    doc, start, end = _on_line(flat, shape)
    check_grid_order(flat, doc, end, shape)
    if doc.size == 0:
        return Compaction((), _host_clusters(doc, doc, doc, doc, doc, (), device))
    reach = numpy.maximum.accumulate(end)
    opens = numpy.empty(doc.size, dtype=bool)
    opens[0] = True
    numpy.greater(start[1:], reach[:-1], out=opens[1:])
    cluster = opens.cumsum() - 1
    first_node = opens.nonzero()[0]
    cl_doc = doc[first_node]
    if by_cluster:
        host, host_clusters = _solved_on_host(
            doc, start, end, cluster, first_node, cl_doc, device
        )
        if host is None:  # the usual case for a trained model: nothing to scan
            return Compaction((), host_clusters)
    else:
        host = numpy.zeros(doc.size, dtype=bool)
        none = doc[:0]
        host_clusters = _host_clusters(none, none, none, none, none, (), device)
    cl_start = start[first_node]
    cl_len = numpy.maximum.reduceat(end, first_node) - cl_start + 1  # a cluster's nodes are contiguous
    rel_start = start - cl_start[cluster]
    if by_cluster:
        node_row, row_len, row_doc = cluster, cl_len, cl_doc
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
    scanned = ~host
    has_scan = numpy.bincount(node_row[scanned], minlength=row_len.size) > 0
    node_block = numpy.where(scanned, _length_blocks(row_len, has_scan)[node_row], -1)
    K, width = shape[2], end - start
    blocks = []
    for b in numpy.unique(node_block[scanned]).tolist():
        in_block = node_block == b
        rows = numpy.unique(node_row[in_block])  # sorted
        length = int(row_len[rows].max())
        new_row = numpy.searchsorted(rows, node_row[in_block])
        pad = length - row_len[node_row[in_block]]
        scan_index = (new_row * length + rel_start[in_block] + pad) * K + width[in_block]
        blocks.append(ScanBlock(
            *(to_device(x, device) for x in (in_block.nonzero()[0], scan_index, row_doc[rows])),
            rows.size, length,
        ))
    return Compaction(tuple(blocks), host_clusters)


def batch_line(node_index: torch.Tensor, shape: Tuple[int, int, int]) -> Tuple[numpy.ndarray, ...]:
    """``(doc, start, end)`` of the nodes at the flat grid ``node_index`` (in grid order) on one
    line for the whole batch, with a gap between documents (``doc * (L + 1) + start``), as NumPy
    arrays: sorted by start, and a node's end never reaches the next document's first start."""
    return _on_line(node_index.cpu().numpy(), shape)


def _on_line(flat: numpy.ndarray, shape: Tuple[int, int, int]) -> Tuple[numpy.ndarray, ...]:
    """:func:`batch_line` of the flat grid indices ``flat``, a NumPy array."""
    _, L, K = shape
    # max(.., 1): an empty grid has no nodes to divide
    row, width = numpy.divmod(flat, max(K, 1))  # row = doc * L + start
    doc = row // max(L, 1)
    start = row + doc
    return doc, start, start + width


def check_grid_order(
    flat: numpy.ndarray, doc: numpy.ndarray, end: numpy.ndarray, shape: Tuple[int, int, int]
) -> None:
    """A ``ValueError`` unless the flat ``[B, L, K]`` grid indices ``flat`` (their ``doc`` and
    ``end`` on the batch's line, :func:`batch_line`) are in grid order, each once, and each on
    the grid with its span ending inside it (``i + w < L``): what the compaction takes for
    granted (a node list out of order, such as a hand-built :class:`~.filtered.NodeSet`, was
    solved wrongly without an error). A few NumPy calls on the node list."""
    if flat.size == 0:
        return
    B, L, K = shape
    if numpy.count_nonzero(flat[1:] <= flat[:-1]):
        raise ValueError(
            "the nodes must be listed in grid order (by document, start, width), each once: "
            "a NodeSet's index, or node_index, must be strictly increasing flat [B, L, K] "
            "indices (sort the index, and the labels and scores alike)"
        )
    if flat[0] < 0 or flat[-1] >= B * L * K:
        raise ValueError(
            f"node indices must lie in 0..{B * L * K - 1} on a {tuple(shape)} grid, got "
            f"{int(flat[0]) if flat[0] < 0 else int(flat[-1])}"
        )
    if numpy.count_nonzero(end - doc * (L + 1) >= L):  # past its document's last token
        raise ValueError("a node (i, w) must end inside the grid: i + w < L")


def check_node_index(node_index: torch.Tensor, shape: Tuple[int, int, int]) -> None:
    """:func:`check_grid_order` of the flat ``[B, L, K]`` grid indices ``node_index``, a
    tensor (for a caller that indexes with them before the compaction checks them)."""
    flat = node_index.cpu().numpy()
    doc, _, end = _on_line(flat, shape)
    check_grid_order(flat, doc, end, shape)


def disjoint(node_index: torch.Tensor, shape: Tuple[int, int, int]) -> bool:
    """Whether no two of the nodes overlap: sorted by start on the batch's line, each starts
    after the one before it ends."""
    _, start, end = batch_line(node_index, shape)
    return bool(numpy.count_nonzero(start[1:] <= end[:-1]) == 0)


def _solved_on_host(doc, start, end, cluster, first_node, cl_doc, device):
    """``(host, HostClusters)``: which nodes (NumPy arrays in node order) are in cliques or
    small clusters, and those clusters; ``host`` is None when every node is."""
    next_first = numpy.empty_like(first_node)  # (numpy.append is a slow Python-level call)
    next_first[:-1] = first_node[1:]
    next_first[-1] = doc.size
    cl_nodes = next_first - first_node
    # nodes are sorted by start within a cluster: its last node starts latest
    cl_clique = start[next_first - 1] <= numpy.minimum.reduceat(end, first_node)
    # (count_nonzero: ndarray.all and .any are slower Python-level calls)
    if numpy.count_nonzero(cl_clique) == cl_clique.size:  # cliques only: the host nodes are
        cliques = (first_node, cluster, cl_doc)  # all nodes, in the same order
        return None, HostClusters(None, None, doc, None, *cliques, ())
    cl_small = ~cl_clique & (cl_nodes <= ENUMERATE_MAX_NODES)
    host = (cl_clique | cl_small)[cluster]
    host_pos = host.cumsum() - 1  # position of each host node among the host nodes
    groups = []
    n_small = numpy.count_nonzero(cl_small)
    if n_small:
        widest = int(cl_nodes[cl_small].max())
        # one group while the padding to the widest cluster is cheaper than another group's
        # fixed cost
        one_group = n_small << widest <= ENUMERATE_ONE_GROUP_CELLS
        for low, high in ((2, ENUMERATE_MAX_NODES),) if one_group else ENUMERATE_GROUPS:
            cl_group = cl_small if one_group else cl_small & (cl_nodes >= low) & (cl_nodes <= high)
            if numpy.count_nonzero(cl_group):
                count = cl_nodes[cl_group]
                group = cl_group[cluster]
                groups.append(_small_clusters(
                    host_pos[group], count, start[group], end[group], cl_doc[cl_group],
                    widest if one_group else int(count.max()),
                ))
    in_clique = cl_clique[cluster]
    every = numpy.count_nonzero(host) == host.size
    hosted = _host_clusters(
        None if every else host.nonzero()[0], doc[host], in_clique[host], cluster[host], cl_doc,
        tuple(groups), device,
    )
    return (None if every else host), hosted


def to_device(x: numpy.ndarray, device: torch.device) -> torch.Tensor:
    """A NumPy array as a tensor on ``device``: on the CPU, the same memory (no copy of a
    contiguous array)."""
    out = torch.from_numpy(numpy.ascontiguousarray(x))
    return out if device.type == "cpu" else out.to(device)


def host_array(x: torch.Tensor) -> numpy.ndarray:
    """Scores as a NumPy array of their own precision, for the host solver; bfloat16, which
    NumPy has not, in float32."""
    x = x.detach().cpu()
    return (x.float() if x.dtype == torch.bfloat16 else x).numpy()


def to_host(x: Optional[torch.Tensor]) -> Optional[numpy.ndarray]:
    """A tensor as a float64 NumPy array (None stays None), for the searches run on the host."""
    return None if x is None else x.detach().double().cpu().numpy()


def _host_clusters(node, doc, in_clique, cluster, cl_doc, small, device) -> HostClusters:
    """:class:`HostClusters` of the host nodes (their node positions ``node``, None for all
    nodes, ``doc``, whether each is in a clique and its cluster id, an index into ``cl_doc``;
    NumPy arrays in node order)."""
    clique_node = in_clique.nonzero()[0]
    ids = cluster[clique_node]
    opens = numpy.empty(ids.size, dtype=bool)
    opens[:1] = True
    numpy.not_equal(ids[1:], ids[:-1], out=opens[1:])
    clique_first = opens.nonzero()[0]
    node_t = None if node is None else to_device(node, device)
    return HostClusters(
        node, node_t, doc, clique_node, clique_first, opens.cumsum() - 1, cl_doc[ids[clique_first]],
        small,
    )


@functools.lru_cache(maxsize=None)
def _subset_tables(n: int) -> Tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]:
    """``subsets [2^n, n]``: the bits of every subset of n slots; ``pairs [2, n(n-1)/2]``: the
    slot pairs ``a < b``; ``pair_bits``: the bit of each pair in a cluster's pattern code."""
    subsets = (numpy.arange(2**n)[:, None] >> numpy.arange(n)) & 1 == 1
    pairs = numpy.stack(numpy.triu_indices(n, 1))
    return subsets, pairs, numpy.left_shift(1, numpy.arange(pairs.shape[1]), dtype=numpy.int64)


def _small_clusters(node, count, start, end, cl_doc, n: int) -> SmallClusters:
    """Slot tables and maximal sets of some whole clusters (``node``, ``start`` and ``end`` are
    NumPy arrays over their nodes, in cluster order, ``node`` each node's host position;
    ``count`` and ``cl_doc`` arrays over the clusters, their node counts and documents; ``n``
    nodes in the largest cluster).

    Which subsets are maximal non-overlapping sets depends only on the cluster's *pattern*:
    its node count and which of its node pairs overlap. A batch holds few patterns, and the
    same ones batch after batch, so their maximal sets are enumerated once and looked up."""
    subsets, pairs, pair_bits = _subset_tables(n)
    first = count.cumsum() - count
    slots = numpy.arange(n)
    present = slots < count[:, None]
    # slot a of cluster r is its node first[r] + a (a cluster's nodes are contiguous); an empty
    # slot points at the cluster's first node, so that every slot indexes a real node
    slot = first[:, None] + numpy.where(present, slots, 0)
    # nodes are sorted by start within a cluster: a < b overlap iff b starts by a's end
    overlaps = (start[slot[:, pairs[1]]] <= end[slot[:, pairs[0]]]) & present[:, pairs[1]]
    code = (overlaps @ pair_bits) | (count << pair_bits.size)
    maximal = _pattern_table(n).maximal_sets(code.tolist())
    return SmallClusters(node[slot], present, cl_doc, subsets, maximal)


class _PatternTable:
    """The maximal sets of every cluster pattern of up to ``n`` slots met so far, a row each.

    Looked up with a dict and one fancy index: ``numpy.unique`` and ``numpy.stack`` would cost
    more than the rest of the small-cluster bookkeeping. Rows are only ever added (under a
    lock), so a lookup never sees a row number without its row. The table stays small: the
    later nodes that a node overlaps are a run, so there are at most n! patterns of n nodes
    (10 MB of rows for all of n = 8), and batches meet a few dozen."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.row_of: Dict[int, int] = {}
        self.table = numpy.zeros((0, 1 << n), dtype=bool)
        self.lock = threading.Lock()

    def maximal_sets(self, codes: List[int]) -> numpy.ndarray:
        """``bool [len(codes), 2^n]``: the maximal sets of clusters of pattern ``codes``."""
        try:
            rows = [self.row_of[c] for c in codes]
        except KeyError:
            with self.lock:
                new = [c for c in dict.fromkeys(codes) if c not in self.row_of]
                self.table = numpy.concatenate([self.table, [_maximal_sets(c, self.n) for c in new]])
                self.row_of.update({c: i for i, c in enumerate(new, len(self.row_of))})
            rows = [self.row_of[c] for c in codes]
        return self.table[rows]


@functools.lru_cache(maxsize=None)
def _pattern_table(n: int) -> _PatternTable:
    return _PatternTable(n)


def _maximal_sets(code: int, n: int) -> numpy.ndarray:
    """``bool [2^n]``: which subsets of the slots are the maximal non-overlapping sets of
    a cluster of pattern ``code`` (see :func:`_small_clusters`): they hold only real nodes, no
    overlapping pair, and every real node is in them or overlaps one of theirs."""
    subsets, pairs, pair_bits = _subset_tables(n)
    present = numpy.arange(n) < code >> pair_bits.size
    pair_overlaps = code & pair_bits != 0
    overlap = numpy.eye(n, dtype=bool)
    overlap[tuple(pairs[:, pair_overlaps])] = True
    overlap |= overlap.T
    conflict = (subsets[:, pairs[0]] & subsets[:, pairs[1]] & pair_overlaps).any(1)
    absent = (subsets & ~present).any(1)
    covered = (subsets.astype(numpy.int64) @ overlap[present].T > 0).all(1)
    return ~conflict & ~absent & covered


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


# ----------------------------------------------------------------------------- host solver


class HostSolution(NamedTuple):
    """``totals [B]``: per document, the sum over its host clusters of log Z, or of the best
    score when the best nodes are asked for; ``best [m]``: whether each host node is on the
    best path; ``marginals [m]``: each host node's marginal; ``log_z [B]``: the sum of log Z
    (``totals`` itself unless the best nodes are asked for, None when only they are)."""

    totals: numpy.ndarray
    best: Optional[numpy.ndarray]
    marginals: Optional[numpy.ndarray]
    log_z: Optional[numpy.ndarray] = None


def solve_host(
    host: HostClusters, scores: numpy.ndarray, n_docs: int, want_best: bool, want_marginals: bool
) -> HostSolution:
    """Solve the cliques and small clusters exactly, from the host nodes' ``scores [m]``."""
    totals = numpy.zeros(n_docs, dtype=scores.dtype)
    best = numpy.zeros(scores.size, dtype=bool) if want_best else None
    marginals = numpy.zeros(scores.size, dtype=scores.dtype) if want_marginals else None
    # the exponentials are only needed for log Z and the marginals, not for Viterbi alone
    want_weights = want_marginals or not want_best
    # log Z beside the best scores where the weights are there anyway: the path probability
    # then needs no second solve (the same sums as without the best nodes, bit for bit)
    log_z = totals if not want_best else (
        numpy.zeros(n_docs, dtype=scores.dtype) if want_weights else None)
    if host.clique_first.size:
        node = slice(None) if host.clique_node is None else host.clique_node
        s = scores[node]
        top = numpy.maximum.reduceat(s, host.clique_first)
        top_of = top[host.clique_of]
        if want_best:
            # the first node of each clique reaching its maximum
            at_top = numpy.where(s == top_of, numpy.arange(s.size), s.size)
            first_top = numpy.minimum.reduceat(at_top, host.clique_first)
            best[first_top if host.clique_node is None else host.clique_node[first_top]] = True
        if want_weights:
            weights = numpy.exp(s - top_of)
            norm = numpy.add.reduceat(weights, host.clique_first)
        if want_marginals:
            marginals[node] = weights / norm[host.clique_of]
        if want_best:
            numpy.add.at(totals, host.clique_doc, top)
        if log_z is not None:
            numpy.add.at(log_z, host.clique_doc, top + numpy.log(norm))
    for small in host.small:
        subsets = small.subsets.astype(scores.dtype)
        slot_scores = numpy.where(small.present, scores[small.slot_node], 0.0)
        subset_scores = numpy.where(small.maximal, slot_scores @ subsets.T, -numpy.inf)
        if want_best:
            argmax = subset_scores.argmax(1)
            top = subset_scores[numpy.arange(argmax.size), argmax]
            chosen = small.subsets[argmax] & small.present
            best[small.slot_node[chosen]] = True
        else:
            top = subset_scores.max(1)
        if want_weights:
            weights = numpy.exp(subset_scores - top[:, None])
        if want_marginals:
            slot_marginals = (weights / weights.sum(1, keepdims=True)) @ subsets
            marginals[small.slot_node[small.present]] = slot_marginals[small.present]
        if want_best:
            numpy.add.at(totals, small.row_doc, top)
        if log_z is not None:
            numpy.add.at(log_z, small.row_doc, top + numpy.log(weights.sum(1)))
    return HostSolution(totals, best, marginals, log_z)


class HostLogPartition(torch.autograd.Function):
    """log Z of the host clusters per document, ``[B]``, differentiable in the host nodes'
    scores: the gradient of log Z is the node marginals, which the same solve gives. Once
    only: the marginals are constants to autograd, so a gradient with ``create_graph=True``
    (for a Hessian) raises an error rather than giving zeros."""

    @staticmethod
    def forward(ctx, scores: torch.Tensor, host: HostClusters, n_docs: int) -> torch.Tensor:
        solution = solve_host(host, host_array(scores), n_docs, False, True)
        ctx.save_for_backward(torch.from_numpy(solution.marginals).to(scores.device, scores.dtype))
        ctx.node_doc = host.node_doc
        return torch.from_numpy(solution.totals).to(scores.device, scores.dtype)

    @staticmethod
    def backward(ctx, grad_totals: torch.Tensor):
        (marginals,) = ctx.saved_tensors
        # create_graph=True: the marginals as a gradient would be constants, wrong to the Hessian
        if torch.is_grad_enabled() and marginals.numel():
            raise RuntimeError(
                "the filtered graph's log Z is differentiable once where it has cliques or "
                "small clusters (solved on the host); for second derivatives give the nodes' "
                "labels and transitions (zeros for none): the position scan is differentiable "
                "twice"
            )
        node_doc = torch.from_numpy(ctx.node_doc).to(grad_totals.device)
        return grad_totals[node_doc] * marginals, None, None
