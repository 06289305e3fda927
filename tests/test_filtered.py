"""The filtered semi-CRF against brute-force enumeration of maximal non-overlapping node sets."""
import math
import re
from typing import List, Optional, Tuple
from unittest import mock

import numpy
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spacy_fsemicrf.structured import compaction as compaction_module
from spacy_fsemicrf.structured import filtered as filtered_module
from spacy_fsemicrf.structured.compaction import _length_blocks, _small_clusters
from spacy_fsemicrf.structured.compaction import compact as compact_list
from spacy_fsemicrf.structured.filtered import (
    NodeSet,
    _inside_documents,
    consistent_log_score,
    count_nodes,
    decode_node_set,
    filtered_decode,
    filtered_log_partition,
    filtered_marginals,
    filtered_viterbi,
    inference_node_set,
    inference_nodes,
    path_score,
    solve_node_set,
    start_bound,
    training_nodes,
)
from spacy_fsemicrf.structured.nbest import filtered_nbest
from spacy_fsemicrf.structured.semiring import NEG
from spacy_fsemicrf.structured.spans import gold_label_grid, span_mask

from .bruteforce import filtered_enumerate, liang_edges, maximal_nonoverlapping_sets

DTYPE = torch.float64


def compact(mask: torch.Tensor, by_cluster: bool):
    """The compaction of the nodes of a ``[B, L, K]`` mask."""
    return compact_list(mask.view(-1).nonzero().squeeze(1), tuple(mask.shape), by_cluster)


def random_nodes(seed: int, batch: int, length: int, max_width: int, n_classes: int, density: float):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    valid = span_mask(lengths, length, max_width)
    mask = (torch.rand((batch, length, max_width), generator=gen) < density) & valid
    scores = torch.randn((batch, length, max_width), generator=gen, dtype=DTYPE)
    labels = torch.randint(1, n_classes, (batch, length, max_width), generator=gen) * mask
    transitions = torch.randn((n_classes + 1, n_classes + 1), generator=gen, dtype=DTYPE)
    return lengths, mask, scores, labels, transitions


def doc_nodes(mask: torch.Tensor, b: int) -> List[Tuple[int, int]]:
    """Grid coordinates (start, width) of document b's nodes, in grid order."""
    return [(int(i), int(w)) for i, w in mask[b].nonzero().tolist()]


def enumerate_paths(scores, mask, labels, transitions: Optional[torch.Tensor], b: int):
    """Every maximal path of document b with its score, by brute force."""
    grid = doc_nodes(mask, b)
    intervals = [(i, i + w) for i, w in grid]
    C = None if transitions is None else transitions.shape[0] - 1
    paths = []
    for subset in maximal_nonoverlapping_sets(intervals):
        chosen = sorted(subset, key=lambda k: intervals[k][0])
        total = sum(float(scores[b, grid[k][0], grid[k][1]]) for k in chosen)
        if transitions is not None and chosen:
            labs = [int(labels[b, grid[k][0], grid[k][1]]) for k in chosen]
            total += float(transitions[C, labs[0]]) + float(transitions[labs[-1], C])
            total += sum(float(transitions[x, y]) for x, y in zip(labs, labs[1:]))
        paths.append((frozenset(grid[k] for k in chosen), total))
    return paths


problems = st.tuples(
    st.integers(0, 10_000),  # seed
    st.integers(1, 3),  # batch
    st.integers(1, 7),  # length
    st.integers(1, 4),  # max width
    st.integers(2, 4),  # classes incl. null
    st.floats(0.1, 0.9),  # node density
    st.booleans(),  # transitions
)


@settings(max_examples=60, deadline=None)
@given(problems)
def test_log_z_viterbi_marginals_match_brute_force(problem):
    seed, B, L, K, C, density, use_t = problem
    lengths, mask, scores, labels, T = random_nodes(seed, B, L, K, C, density)
    T = T if use_t else None
    log_z = filtered_log_partition(scores, mask, labels, T)
    chosen, best = filtered_viterbi(scores, mask, labels, T)
    marginals = filtered_marginals(scores, mask, labels, T)
    decoded, decoded_marginals = filtered_decode(scores, mask, labels, T)
    assert torch.equal(decoded, chosen)
    assert torch.allclose(decoded_marginals, marginals, atol=1e-10)
    for b in range(B):
        paths = enumerate_paths(scores, mask, labels, T, b)
        values = torch.tensor([v for _, v in paths], dtype=DTYPE)
        ref = torch.logsumexp(values, 0)
        assert log_z[b].item() == pytest.approx(ref.item(), abs=1e-8)
        top = max(v for _, v in paths)
        assert best[b].item() == pytest.approx(top, abs=1e-8)
        picked = frozenset((int(i), int(w)) for i, w in chosen[b].nonzero().tolist())
        assert picked in {p for p, _ in paths}
        assert dict(paths)[picked] == pytest.approx(top, abs=1e-8)
        for node in doc_nodes(mask, b):
            p = sum(math.exp(v - ref.item()) for path, v in paths if node in path)
            assert marginals[b, node[0], node[1]].item() == pytest.approx(p, abs=1e-8)
    assert not (marginals * ~mask).any()


@settings(max_examples=40, deadline=None)
@given(problems)
def test_gradient_of_log_z_is_the_marginals_and_batching_is_exact(problem):
    seed, B, L, K, C, density, use_t = problem
    lengths, mask, scores, labels, T = random_nodes(seed, B, L, K, C, density)
    T = T if use_t else None
    scores = scores.clone().requires_grad_(True)
    log_z = filtered_log_partition(scores, mask, labels, T)
    # a weight per document: each document's gradient must reach its own nodes only
    weight = torch.arange(1, B + 1, dtype=DTYPE)
    (grad,) = torch.autograd.grad((log_z * weight).sum(), scores)
    marginals = filtered_marginals(scores, mask, labels, T)
    assert torch.allclose(grad, marginals * weight.view(-1, 1, 1), atol=1e-10)
    for b in range(B):
        one = slice(b, b + 1)
        alone = filtered_log_partition(scores[one], mask[one], labels[one], T)
        assert alone.item() == pytest.approx(log_z[b].item(), abs=1e-9)
        chosen_alone, _ = filtered_viterbi(scores[one], mask[one], labels[one], T)
        chosen, _ = filtered_viterbi(scores, mask, labels, T)
        assert torch.equal(chosen_alone[0], chosen[b])


def test_second_derivatives_of_log_z_on_the_host_raise_rather_than_read_zero():
    """The gradient of log Z on cliques and small clusters (solved on the host) is the saved
    marginals, a constant to autograd: a Hessian through it came out 0 without a word. It now
    raises; the position scan (zero transitions, whole documents) still has its Hessian."""
    lengths, mask, scores, labels, _ = random_nodes(0, 3, 14, 3, 3, 0.35)
    host = compact(mask, by_cluster=True).host
    assert host.clique_first.size and host.small  # cliques and small clusters

    def hessian(T):
        return torch.autograd.functional.hessian(
            lambda x: filtered_log_partition(x, mask, labels, T).sum(), scores
        )

    assert hessian(torch.zeros((4, 4), dtype=DTYPE)).abs().max() > 0.05
    message = ("the filtered graph's log Z is differentiable once where it has cliques or small "
               "clusters (solved on the host); for second derivatives give the nodes' labels and "
               "transitions (zeros for none): the position scan is differentiable twice")
    with pytest.raises(RuntimeError, match=f"^{re.escape(message)}$"):
        hessian(None)


@st.composite
def bridge(draw, K: int, n: int):
    """Four nodes ``u, w1, w2, v`` (``(start, width)``) where ``u -> v`` is an edge whose gap,
    ``K`` to ``2K - 2`` tokens, is covered by ``w1`` (overlapping ``u``) and ``w2`` (overlapping
    ``v``): the predecessor ``u`` ends before the last ``K`` ends that ``v``'s step sees, but
    within the scan's window of ``2K - 1``. None when a document of ``n`` tokens is too short."""
    reach = draw(st.integers(1, K - 1))  # w1 reaches this far past u's end
    gap = draw(st.integers(K, reach + K - 1))
    if gap + 2 > n:
        return None
    e = draw(st.integers(0, n - gap - 2))  # u's end; v starts at e + gap + 1
    s = e + gap + 1
    u_width = draw(st.integers(0, min(e, K - 1)))
    w1_start = draw(st.integers(max(0, e + reach - K + 1), e))
    v_width = draw(st.integers(0, min(K - 1, n - 1 - s)))
    w2_start, w2_end = e + reach + 1, draw(st.integers(s, min(n - 1, e + reach + K)))
    return [(e - u_width, u_width), (w1_start, e + reach - w1_start), (w2_start, w2_end - w2_start), (s, v_width)]


@st.composite
def long_node_sets(draw):
    """Documents up to 18 tokens, longer than the scan's window of ``2K - 1`` ends for every
    width from 2 to 6: often a :func:`bridge`, and up to 8 more nodes, in chains (each
    starting with the previous one, at its end or right after it) or anywhere.
    Returns ``(seed, lengths, node lists, max width, classes)``."""
    K = draw(st.integers(2, 6))
    docs, lengths = [], []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 18))
        nodes = set(draw(bridge(K, n)) or []) if draw(st.booleans()) else set()
        start = draw(st.integers(0, n - 1))
        for _ in range(draw(st.integers(0, 8))):
            width = draw(st.integers(0, min(K - 1, n - 1 - start)))
            nodes.add((start, width))
            step = draw(st.sampled_from([0, width, width + 1, None]))
            start = draw(st.integers(0, n - 1)) if step is None else min(n - 1, start + step)
        docs.append(sorted(nodes))
        lengths.append(n)
    return draw(st.integers(0, 10_000)), lengths, docs, K, draw(st.integers(2, 4))


def long_grids(problem, use_t: bool, dtype: torch.dtype = DTYPE):
    """``(mask, scores, labels, transitions or None)``: the ``[B, L, K]`` grids of a
    :func:`long_node_sets` problem, with random scores, labels and transitions."""
    seed, lengths, docs, K, C = problem
    B, L = len(docs), max(lengths)
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros((B, L, K), dtype=torch.bool)
    for b, nodes in enumerate(docs):
        for i, w in nodes:
            mask[b, i, w] = True
    scores = torch.randn((B, L, K), generator=gen, dtype=dtype)
    labels = torch.randint(1, C, (B, L, K), generator=gen) * mask
    T = torch.randn((C + 1, C + 1), generator=gen, dtype=dtype) if use_t else None
    return mask, scores, labels, T


@settings(max_examples=60, deadline=None)
@given(long_node_sets(), st.booleans(), st.booleans())
def test_long_documents_match_brute_force_in_every_scan_layout(problem, use_t, split):
    """log Z, Viterbi and the marginals on documents longer than the scan's window, with the
    scan over whole documents (transitions), over clusters (none, with enumeration turned off),
    and with every row length in a scan block of its own (``split``) or merged blocks."""
    mask, scores, labels, T = long_grids(problem, use_t)
    B = mask.shape[0]
    with mock.patch.object(compaction_module, "STEP_COST_IN_ROWS", 0 if split else 256), \
            mock.patch.object(compaction_module, "ENUMERATE_MAX_NODES", 1):
        log_z = filtered_log_partition(scores, mask, labels, T)
        chosen, best = filtered_viterbi(scores, mask, labels, T)
        marginals = filtered_marginals(scores, mask, labels, T)
    for b in range(B):
        grid = doc_nodes(mask, b)
        nodes = [(i, i + w, int(labels[b, i, w]), float(scores[b, i, w])) for i, w in grid]
        enum = filtered_enumerate(nodes, T)
        assert log_z[b].item() == pytest.approx(enum.log_z, abs=1e-8)
        assert best[b].item() == pytest.approx(enum.best_score, abs=1e-8)
        picked = tuple(k for k, (i, w) in enumerate(grid) if chosen[b, i, w])
        assert picked in enum.best_paths
        got = [marginals[b, i, w].item() for i, w in grid]
        assert got == pytest.approx(enum.marginals.tolist(), abs=1e-8)


@settings(max_examples=60, deadline=None)
@given(problems)
def test_scan_predecessors_are_the_liang_edges(problem):
    seed, B, L, K, C, density, _ = problem
    _, mask, _, _, _ = random_nodes(seed, B, L, K, C, density)
    bound = start_bound(mask)
    for b in range(B):
        intervals = [(i, i + w) for i, w in doc_nodes(mask, b)]
        n = len(intervals)
        expected = set(liang_edges(intervals))
        START, END = "START", "END"
        scan = set()
        for v, (s, _) in enumerate(intervals):
            p = int(bound[b, s])
            if p == -1:
                scan.add((START, v))
            for u, (_, e) in enumerate(intervals):
                if p <= e <= s - 1:
                    scan.add((u, v))
        p_end = int(bound[b, L])
        for u, (_, e) in enumerate(intervals):
            if e >= p_end:
                scan.add((u, END))
        if n == 0:
            scan.add((START, END))
        assert scan == expected


@settings(max_examples=40, deadline=None)
@given(problems, st.integers(0, 10_000))
def test_gold_path_is_a_path_under_the_training_constraint(problem, gold_seed):
    seed, B, L, K, C, _, use_t = problem
    gen = torch.Generator().manual_seed(gold_seed)
    lengths = torch.randint(0, L + 1, (B,), generator=gen)
    local = torch.randn((B, L, K, C), generator=gen, dtype=DTYPE)
    rows = []
    for b in range(B):  # a random segmentation's entity spans
        i = 0
        while i < int(lengths[b]):
            w = int(torch.randint(0, K, (1,), generator=gen))
            w = min(w, int(lengths[b]) - 1 - i)
            if torch.rand((1,), generator=gen).item() < 0.5:
                rows.append((b, i, i + w, int(torch.randint(1, C, (1,), generator=gen))))
            i += w + 1
    gold = torch.tensor(rows, dtype=torch.long).view(-1, 4)
    grid = gold_label_grid(gold, lengths, L, K)
    mask, labels = training_nodes(local, lengths, grid)
    assert torch.equal(labels[grid > 0], grid[grid > 0])
    scores = torch.randn((B, L, K), generator=gen, dtype=DTYPE)
    T = torch.randn((C + 1, C + 1), generator=gen, dtype=DTYPE) if use_t else None
    log_z = filtered_log_partition(scores, mask, labels, T)
    gold_score = path_score(scores, grid > 0, labels, T)
    assert (log_z - gold_score >= -1e-9).all()
    for b in range(B):
        gold_path = frozenset((int(i), int(w)) for i, w in (grid[b] > 0).nonzero().tolist())
        paths = dict(enumerate_paths(scores, mask, labels, T, b))
        assert gold_path in paths
        assert paths[gold_path] == pytest.approx(gold_score[b].item(), abs=1e-8)
    # The node set, span by span, by the rule: the gold spans with their labels, and every other
    # candidate whose local argmax is an entity label and that overlaps a gold span, with that
    # label (both ways: no extra node missing, none too many).
    expected_mask = torch.zeros_like(mask)
    expected_labels = torch.zeros_like(labels)
    for b in range(B):
        gold_spans = {(s, e): label for d, s, e, label in rows if d == b}
        for i in range(int(lengths[b])):
            for w in range(min(K, int(lengths[b]) - i)):
                predicted = int(local[b, i, w].argmax())
                if (i, i + w) in gold_spans:
                    expected_mask[b, i, w], expected_labels[b, i, w] = True, gold_spans[i, i + w]
                elif predicted > 0 and any(s <= i + w and i <= e for s, e in gold_spans):
                    expected_mask[b, i, w], expected_labels[b, i, w] = True, predicted
    assert torch.equal(mask, expected_mask)
    assert torch.equal(labels, expected_labels)


def test_no_nan_for_empty_documents_single_tokens_and_empty_node_sets():
    # documents of length 0, 1, 5 (no node) and 3; nodes only inside their document
    B, L, K = 4, 5, 3
    scores = torch.randn((B, L, K), requires_grad=True)
    mask = torch.zeros((B, L, K), dtype=torch.bool)
    mask[1, 0, 0] = True
    mask[3, 0, 1] = mask[3, 1, 0] = mask[3, 1, 1] = True
    labels = mask.long()
    for T in (None, torch.randn(3, 3)):
        log_z = filtered_log_partition(scores, mask, labels, T)
        assert torch.isfinite(log_z).all()
        assert log_z[0] == 0 and log_z[2] == 0  # empty node set: the single empty path
        (grad,) = torch.autograd.grad(log_z.sum(), scores)
        assert torch.isfinite(grad).all()
        chosen, best = filtered_viterbi(scores, mask, labels, T)
        assert chosen[1, 0, 0] and not chosen[0].any() and not chosen[2].any()
    empty = torch.zeros((0, 0, K))
    assert filtered_log_partition(empty, empty.bool()).shape == (0,)


def test_transitions_of_zero_equal_no_transitions():
    """Per-document scan (transitions) and per-cluster scan (none) agree when T = 0."""
    lengths, mask, scores, labels, _ = random_nodes(3, 8, 40, 5, 5, 0.15)
    zero = torch.zeros((6, 6), dtype=DTYPE)
    assert torch.allclose(
        filtered_log_partition(scores, mask, labels, None),
        filtered_log_partition(scores, mask, labels, zero),
    )
    assert torch.equal(
        filtered_viterbi(scores, mask, labels, None)[0],
        filtered_viterbi(scores, mask, labels, zero)[0],
    )


@pytest.mark.parametrize("scores_dtype, t_dtype", [(torch.float32, torch.float64),
                                                   (torch.float64, torch.float32)])
def test_transitions_of_another_precision_are_read_in_the_scores_one(scores_dtype, t_dtype):
    """float32 scores with float64 transitions raised a RuntimeError in index_add_, where the
    semi-CRF and the linear CRF cast the transitions to the scores' dtype."""
    lengths, mask, scores, labels, _ = random_nodes(3, 8, 40, 5, 5, 0.15)
    scores = scores.to(scores_dtype)
    T = torch.randn((6, 6), dtype=t_dtype, generator=torch.Generator().manual_seed(0))
    same = T.to(scores_dtype)
    log_z = filtered_log_partition(scores, mask, labels, T)
    assert log_z.dtype == scores_dtype
    assert torch.equal(log_z, filtered_log_partition(scores, mask, labels, same))
    for solve in (filtered_viterbi, filtered_decode):
        for got, want in zip(solve(scores, mask, labels, T), solve(scores, mask, labels, same)):
            assert torch.equal(got, want)
    assert torch.equal(filtered_marginals(scores, mask, labels, T),
                       filtered_marginals(scores, mask, labels, same))
    leaf = T.clone().requires_grad_(True)
    filtered_log_partition(scores, mask, labels, leaf).sum().backward()
    assert leaf.grad.dtype == t_dtype and leaf.grad.abs().sum() > 0
    best, _ = filtered_viterbi(scores, mask, labels, same)
    score = path_score(scores, best, labels, T)
    assert score.dtype == scores_dtype
    assert torch.equal(score, path_score(scores, best, labels, same))


def test_compaction_cuts_clusters_and_solves_cliques_directly():
    mask = torch.zeros((1, 30, 4), dtype=torch.bool)
    mask[0, 2, 0] = True  # alone: a clique of one
    mask[0, 10, 2] = mask[0, 11, 0] = True  # 10..12 and 11..11 overlap: a clique of two
    mask[0, 20, 3] = mask[0, 22, 3] = mask[0, 24, 0] = True  # a chain 20..25: not a clique
    comp = compact(mask, by_cluster=True)
    host = comp.host
    assert host.node is None  # every node is solved on the host, in list order
    assert host.node_doc.tolist() == [0] * 6
    assert host.clique_first.tolist() == [0, 1] and host.clique_doc.tolist() == [0, 0]
    assert host.clique_node.tolist() == [0, 1, 2]
    # the chain is enumerated, not scanned
    assert comp.blocks == () and len(host.small) == 1
    assert host.small[0].slot_node.tolist() == [[3, 4, 5]]
    assert host.small[0].maximal.sum(1).tolist() == [2]  # {20..23, 24} or {22..25}
    whole = compact(mask, by_cluster=False)
    assert whole.host.node.size == 0
    assert [(b.n_rows, b.scan_length) for b in whole.blocks] == [(1, 1 + 3 + 6)]
    assert whole.blocks[0].node.tolist() == list(range(6))


def test_clique_is_solved_like_a_softmax_over_its_nodes():
    """Pairwise overlapping nodes: every maximal set is one node."""
    mask = torch.zeros((1, 6, 4), dtype=torch.bool)
    mask[0, 0, 3] = mask[0, 1, 2] = mask[0, 2, 0] = True  # 0..3, 1..3, 2..2 share token 2
    scores = torch.randn((1, 6, 4), dtype=DTYPE)
    nodes = scores[mask]
    comp = compact(mask, True)
    assert comp.blocks == () and comp.host.small == () and comp.host.clique_first.tolist() == [0]
    assert torch.allclose(filtered_log_partition(scores, mask), torch.logsumexp(nodes, 0))
    assert torch.allclose(filtered_marginals(scores, mask)[mask], torch.softmax(nodes, 0))
    chosen, best = filtered_viterbi(scores, mask)
    assert chosen.sum() == 1 and scores[chosen].item() == nodes.max().item() == best.item()
    tied = torch.where(mask, 1.0, 0.0).to(DTYPE)  # ties: exactly one node all the same
    assert filtered_viterbi(tied, mask)[0].sum() == 1


def test_scanned_and_enumerated_clusters_agree(monkeypatch):
    """Force every cluster through the scan and compare with the default split."""
    lengths, mask, scores, labels, _ = random_nodes(5, 6, 30, 4, 4, 0.3)
    default = (
        filtered_log_partition(scores, mask),
        filtered_viterbi(scores, mask)[0],
        filtered_marginals(scores, mask),
        filtered_decode(scores, mask)[1],
    )
    assert compact(mask, True).host.small and compact(mask, True).blocks
    monkeypatch.setattr(compaction_module, "ENUMERATE_MAX_NODES", 1)
    assert compact(mask, True).host.small == ()
    assert torch.allclose(default[0], filtered_log_partition(scores, mask))
    assert torch.equal(default[1], filtered_viterbi(scores, mask)[0])
    assert torch.allclose(default[2], filtered_marginals(scores, mask))
    assert torch.allclose(default[3], filtered_decode(scores, mask)[1])
    assert torch.allclose(default[2], default[3])


def test_small_clusters_agree_enumerated_in_one_group_or_by_size(monkeypatch):
    """Small clusters of different sizes enumerated in one group (padded to the widest) or in
    groups by node count give the same results."""
    lengths, mask, scores, labels, _ = random_nodes(7, 8, 40, 4, 4, 0.25)
    sizes = {s.slot_node.shape[1] for s in compact(mask, True).host.small}
    assert len(compact(mask, True).host.small) == 1 and max(sizes) >= 5  # one group, padded
    default = (filtered_log_partition(scores, mask), filtered_decode(scores, mask))
    monkeypatch.setattr(compaction_module, "ENUMERATE_ONE_GROUP_CELLS", 0)
    assert len(compact(mask, True).host.small) == 2  # sizes 2-4 apart from 5-8
    assert torch.allclose(default[0], filtered_log_partition(scores, mask))
    chosen, marginals = filtered_decode(scores, mask)
    assert torch.equal(default[1][0], chosen) and torch.allclose(default[1][1], marginals)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3)), min_size=2, max_size=5), min_size=1, max_size=4))
def test_small_clusters_list_the_maximal_sets_of_each_cluster(clusters):
    """The maximal sets looked up by cluster pattern (some patterns met before, in other
    calls) are the brute-force maximal non-overlapping sets of each cluster's intervals."""
    intervals = [sorted((s, s + w) for s, w in nodes) for nodes in clusters]
    # one line for all clusters, far apart (only which nodes overlap matters)
    line = [(100 * r + s, 100 * r + e) for r, nodes in enumerate(intervals) for s, e in nodes]
    start, end = (numpy.array(x) for x in zip(*line))
    count = numpy.array([len(nodes) for nodes in intervals])
    small = _small_clusters(numpy.arange(len(line)), count, start, end, count * 0, count.max())
    for r, nodes in enumerate(intervals):
        found = [sorted(numpy.flatnonzero(small.subsets[s] & small.present[r]).tolist())
                 for s in numpy.flatnonzero(small.maximal[r])]
        assert sorted(found) == sorted(maximal_nonoverlapping_sets(nodes))
        assert small.maximal.dtype == bool  # a mask over the subsets
        first = count[:r].sum()
        assert small.slot_node[r][small.present[r]].tolist() == list(range(first, first + len(nodes)))


def test_inside_documents_is_the_same_for_tensors_and_arrays():
    """The candidate check after the filter runs in NumPy on the CPU and in PyTorch elsewhere."""
    L, K, lengths = 5, 3, [5, 0, 2, 4]
    ends = (torch.arange(L).view(-1, 1) + torch.arange(K)).view(-1)
    flat = torch.arange(len(lengths) * L * K)
    expected = span_mask(torch.tensor(lengths), L, K).view(-1).nonzero().squeeze(1)
    assert torch.equal(_inside_documents(flat, ends, torch.tensor(lengths), L * K), expected)
    arrays = _inside_documents(flat.numpy(), ends.numpy(), numpy.array(lengths), L * K)
    assert arrays.tolist() == expected.tolist()


def test_length_blocks_split_many_short_rows_from_a_long_one():
    row_len = numpy.array([2] * 2000 + [3] + [60])
    blocks = _length_blocks(row_len, numpy.ones(row_len.size, dtype=bool))
    assert blocks[0] != blocks[-1]  # 2000 rows * 58 padded steps cost more than 2 scan steps
    assert blocks[2000] == blocks[-1]  # one row * 57 padded steps is cheaper than 3 steps
    few = _length_blocks(numpy.array([2, 3, 60]), numpy.ones(3, dtype=bool))
    assert few[0] == few[1] == few[2]


def test_inference_nodes_are_the_non_null_local_argmax():
    local = torch.randn(2, 6, 3, 4)
    lengths = torch.tensor([6, 2])
    mask, labels = inference_nodes(local, lengths)
    expected = (local.argmax(-1) > 0) & span_mask(lengths, 6, 3)
    assert torch.equal(mask, expected)
    assert torch.equal(labels[mask], local.argmax(-1)[mask])


def test_inference_nodes_leave_out_ties_with_null():
    """A span whose best entity label scores exactly what null scores is not kept (as with an
    argmax, which takes the first maximum); with the margin, exactly null minus the margin."""
    local = torch.zeros(1, 2, 2, 3)
    local[..., 0] = 8.0  # null far ahead everywhere else
    local[0, 0, 0] = torch.tensor([0.5, 0.5, 0.25])  # tie with null: left out
    local[0, 1, 0] = torch.tensor([0.5, 0.25, 0.75])  # above null: kept, label 2
    lengths = torch.tensor([2])
    mask, labels = inference_nodes(local, lengths)
    assert mask.nonzero().tolist() == [[0, 1, 0]] and labels[0, 1, 0] == 2
    local[0, 0, 0] = torch.tensor([0.75, 0.5, 0.25])  # exactly null minus a margin of 0.25
    assert inference_nodes(local, lengths, 0.25)[0].nonzero().tolist() == [[0, 1, 0]]
    assert inference_nodes(local, lengths, 0.5)[0].sum() == 2


@pytest.mark.parametrize("margin", [-1.5, 0.0, 0.4, 2.0])
def test_inference_nodes_keep_the_spans_within_the_margin(margin):
    gen = torch.Generator().manual_seed(1)
    local, glob = torch.randn((2, 3, 8, 3, 5), generator=gen).unbind(0)
    lengths = torch.tensor([8, 3, 0])
    mask, labels = inference_nodes(local, lengths, margin)
    best, best_label = local[..., 1:].max(-1)
    expected = (best > local[..., 0] - margin) & span_mask(lengths, 8, 3)
    assert torch.equal(mask, expected)
    assert torch.equal(labels, (best_label + 1) * mask)
    nodes = inference_node_set(local, glob, lengths, margin)
    assert torch.equal(nodes.grid(), mask) and torch.equal(nodes.grid(nodes.labels), labels)
    # a larger margin keeps a superset of the nodes, with the same labels
    wider, wider_labels = inference_nodes(local, lengths, margin + 0.5)
    assert torch.equal(mask & wider, mask) and torch.equal(wider_labels * mask, labels)


@pytest.mark.parametrize("with_transitions", [False, True])
def test_scores_off_the_nodes_are_never_read(with_transitions):
    """NaN and inf off the nodes change nothing (empty enumeration slots and scan padding
    must not read them), for log Z and its gradient, Viterbi and the marginals."""
    lengths, mask, scores, labels, transitions = random_nodes(11, 6, 25, 4, 4, 0.3)
    T = transitions if with_transitions else None
    dirty = scores.clone()
    dirty[~mask] = float("nan")
    dirty[~mask & (torch.rand(mask.shape) < 0.5)] = float("inf")
    clean_s, dirty_s = scores.clone().requires_grad_(), dirty.clone().requires_grad_()
    log_z = filtered_log_partition(clean_s, mask, labels, T)
    log_z_dirty = filtered_log_partition(dirty_s, mask, labels, T)
    assert torch.allclose(log_z, log_z_dirty)
    log_z.sum().backward()
    log_z_dirty.sum().backward()
    assert torch.allclose(clean_s.grad, dirty_s.grad)
    assert torch.equal(filtered_viterbi(scores, mask, labels, T)[0], filtered_viterbi(dirty, mask, labels, T)[0])
    assert torch.allclose(filtered_decode(scores, mask, labels, T)[1], filtered_decode(dirty, mask, labels, T)[1])


@pytest.mark.parametrize("with_transitions", [False, True])
def test_path_score_reads_the_path_only(with_transitions):
    """NaN and inf off the path (a node scored -inf that the gold path leaves out, or scores
    off the nodes, which the solvers never read) change neither the path's score nor its
    gradient: the loss ``log Z - path score`` was NaN."""
    lengths, mask, scores, labels, transitions = random_nodes(11, 6, 25, 4, 4, 0.3)
    T = transitions if with_transitions else None
    path, _ = filtered_viterbi(scores, mask, labels, T)
    dirty = scores.clone()
    dirty[~mask] = float("nan")
    dirty[mask & ~path] = -math.inf
    clean_s, dirty_s = scores.clone().requires_grad_(), dirty.clone().requires_grad_()
    clean, got = path_score(clean_s, path, labels, T), path_score(dirty_s, path, labels, T)
    assert torch.isfinite(got).all() and torch.allclose(got, clean)
    got.sum().backward()
    clean.sum().backward()
    assert torch.equal(dirty_s.grad, clean_s.grad)
    assert torch.isfinite(filtered_log_partition(dirty, mask, labels, T) - got).all()


@pytest.mark.parametrize("label_major", [False, True])
def test_inference_node_set_lists_the_filtered_nodes(label_major):
    gen = torch.Generator().manual_seed(0)
    local, glob = torch.randn((2, 3, 7, 4, 5), generator=gen).unbind(0)
    local[..., 0] += 1.0  # some spans null, some not
    if label_major:  # the heads' memory layout
        local, glob = (x.permute(3, 0, 1, 2).contiguous().permute(1, 2, 3, 0) for x in (local, glob))
    lengths = torch.tensor([7, 0, 3])
    mask, labels = inference_nodes(local, lengths)
    assert torch.equal(mask, (local.argmax(-1) != 0) & span_mask(lengths, 7, 4))
    assert torch.equal(labels, local.argmax(-1) * mask)
    nodes = inference_node_set(local, glob, lengths)
    assert nodes.shape == (3, 7, 4)
    assert torch.equal(nodes.index, mask.view(-1).nonzero().squeeze(1))
    assert torch.equal(nodes.grid(), mask) and torch.equal(nodes.grid(nodes.labels), labels)
    node_scores = glob.gather(-1, labels.unsqueeze(-1)).squeeze(-1) * mask
    assert torch.equal(nodes.grid(nodes.scores), node_scores)
    doc, start, width = mask.nonzero(as_tuple=True)
    rows = torch.stack([doc, start, start + width, labels[mask]], 1)
    assert nodes.spans().tolist() == rows.tolist()
    some = torch.arange(len(rows)) % 2 == 0
    assert nodes.spans(some).tolist() == rows[some].tolist()
    assert nodes.counts().tolist() == mask.sum((1, 2)).tolist()
    assert nodes.grid().dtype == torch.bool and nodes.grid(nodes.labels).dtype == torch.long
    # a last document without nodes still has its count
    assert inference_node_set(local, glob, torch.tensor([7, 0, 0])).counts().tolist() == [
        int(mask[0].sum()), 0, 0]


@pytest.mark.parametrize("glob_shape", [(1, 3, 3, 3), (1, 3, 2, 4), (2, 3, 2, 3),
                                        (1, 3, 2, 2), (1, 2, 2, 3)])
def test_global_scores_of_another_grid_than_the_local_scores_are_a_clear_error(glob_shape):
    """The nodes' global scores were read at the local grid's flat indices: global scores of
    a wider grid (more widths, labels or documents) gave each node another span's score,
    silently, and a narrower one an IndexError."""
    local = torch.randn((1, 3, 2, 3), generator=torch.Generator().manual_seed(0))
    local[..., 1] += 2.0  # every span kept
    message = (r"^global scores must be \[B, L, K, C\] as the local scores, \(1, 3, 2, 3\), "
               rf"got {re.escape(str(glob_shape))}$")
    with pytest.raises(ValueError, match=message):
        inference_node_set(local, torch.randn(glob_shape), torch.tensor([3]))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 3), st.integers(1, 7), st.integers(1, 3),
       st.sampled_from([0.0, 0.1, 0.3, 1.0]))
def test_disjoint_matches_brute_force_and_decode_keeps_the_solve(seed, B, L, K, density):
    """``disjoint`` says whether two nodes of a document share a token; where none do,
    ``decode_node_set`` skips the solve and gives what it gives, bit for bit (every node on the
    best path, marginal 1); otherwise, and with transitions, it is the solve."""
    from spacy_fsemicrf.structured.compaction import disjoint
    from spacy_fsemicrf.structured.filtered import NodeSet, decode_node_set, solve_node_set

    lengths, mask, scores, labels, transitions = random_nodes(seed, B, L, K, 3, density)
    index = mask.view(-1).nonzero().squeeze(1)
    nodes = NodeSet(index, labels.view(-1)[index], scores.view(-1)[index].float(), (B, L, K))
    overlapping = any(
        a[1] + a[0] >= b[0]  # sorted by start: b starts within a
        for d in range(B) for a, b in zip(doc_nodes(mask, d), doc_nodes(mask, d)[1:])
    )
    assert disjoint(index, (B, L, K)) == (not overlapping)
    for T in (None, transitions.float()):
        best, marginals = decode_node_set(nodes, T)
        solved = solve_node_set(nodes, T, "decode")
        assert torch.equal(best, solved.best)
        assert marginals.dtype == solved.marginals.dtype
        assert marginals.numpy().tobytes() == solved.marginals.numpy().tobytes()
        assert decode_node_set(nodes, T, marginals=False)[1] is None


@settings(max_examples=60, deadline=None)
@given(long_node_sets(), st.booleans(), st.booleans(), st.booleans(),
       st.sampled_from([torch.float32, torch.float64]))
def test_decode_gives_the_log_partition_bit_for_bit(problem, use_t, split, enumerate_small,
                                                    dtype):
    """The log Z that ``decode_node_set_log_z`` gives beside the best path (no second solve
    for a path probability) is ``filtered_log_partition``'s, bit for bit, in every scan layout,
    with the small clusters enumerated or scanned, and for a document with no path (a node at
    ``-inf`` in a clique of its own); None only where no two nodes overlap."""
    from spacy_fsemicrf.structured.compaction import disjoint
    from spacy_fsemicrf.structured.filtered import NodeSet, decode_node_set_log_z

    mask, scores, labels, T = long_grids(problem, use_t, dtype)
    index = mask.view(-1).nonzero().squeeze(1)
    if index.numel():  # the first node at -inf: a document without a path, where it is alone
        scores.view(-1)[index[0]] = -math.inf
    nodes = NodeSet(index, labels.view(-1)[index], scores.view(-1)[index], tuple(mask.shape))
    with mock.patch.object(compaction_module, "STEP_COST_IN_ROWS", 0 if split else 256), \
            mock.patch.object(compaction_module, "ENUMERATE_MAX_NODES",
                              8 if enumerate_small else 1):
        want = filtered_log_partition(scores, mask, labels, T)
        best, marginals, log_z = decode_node_set_log_z(nodes, T)
        want_best, want_marginals = decode_node_set(nodes, T)
    assert torch.equal(best, want_best) and torch.equal(marginals, want_marginals)
    if log_z is None:
        assert T is None and disjoint(index, tuple(mask.shape))
        return
    assert log_z.dtype == want.dtype
    assert log_z.numpy().tobytes() == want.numpy().tobytes()


def test_count_nodes_counts_each_documents_nodes():
    mask = torch.rand(3, 5, 2) < 0.4
    assert count_nodes(mask).tolist() == [int(m.sum()) for m in mask]


def test_solving_a_node_set_needs_a_known_mode():
    nodes = inference_node_set(torch.randn(1, 3, 2, 3), torch.randn(1, 3, 2, 3), torch.tensor([3]))
    with pytest.raises(ValueError, match="mode must be one of"):
        solve_node_set(nodes, None, "LOG_Z")


def test_scanned_marginals_are_clamped_whatever_the_rounding(monkeypatch):
    """A node's log marginal above 0 (as rounding can give, where one path holds nearly all
    the mass) is a marginal of 1 on any machine: here the scans' log Z is lowered by 1, so
    every scanned node's marginal comes out e times too large before the clamp."""
    lengths, mask, scores, labels, _ = random_nodes(5, 6, 30, 4, 4, 0.3)
    monkeypatch.setattr(compaction_module, "ENUMERATE_MAX_NODES", 1)
    exact = filtered_marginals(scores, mask)
    scan = filtered_module._scan

    def lower_log_z(*args, **kwargs):
        found = scan(*args, **kwargs)
        return found._replace(total=found.total - 1)

    monkeypatch.setattr(filtered_module, "_scan", lower_log_z)
    shifted = filtered_marginals(scores, mask)
    scanned = shifted != exact  # the cliques are solved on the host, without the scan
    assert (shifted <= 1).all() and (shifted[scanned] == 1).any()
    assert torch.allclose(shifted[scanned], (exact[scanned] * math.e).clamp_max(1))


def _graph_with_a_node_at_minus_infinity(seed: int, use_t: bool):
    """``(mask, scores, labels, T)`` of a random graph of one 6-token document where node
    0..1 scores -inf and overlaps others (transitions of 3 labels with ``use_t``)."""
    gen = torch.Generator().manual_seed(seed)
    B, L, K, C = 1, 6, 3, 3
    mask = torch.rand((B, L, K), generator=gen) < 0.6
    mask &= span_mask(torch.tensor([L]), L, K)
    mask[0, 0, 1] = mask[0, 1, 0] = mask[0, 2, 0] = True
    scores = torch.randn((B, L, K), generator=gen, dtype=DTYPE)
    scores[0, 0, 1] = -math.inf
    labels = torch.randint(1, C, (B, L, K), generator=gen) * mask
    T = torch.randn((C + 1, C + 1), generator=gen, dtype=DTYPE) if use_t else None
    return mask, scores, labels, T


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("use_t", [False, True])
def test_a_node_scored_minus_infinity_is_on_no_path_with_any_probability(seed, use_t):
    """Against enumeration, where such a node's paths weigh exp(-inf) = 0: finite log Z, best
    score and marginals (0 for that node), and a gradient without NaN, on host clusters and on
    the scan (transitions)."""
    mask, scores, labels, T = _graph_with_a_node_at_minus_infinity(seed, use_t)
    x = scores.clone().requires_grad_()
    log_z = filtered_log_partition(x, mask, labels, T)
    log_z.sum().backward()
    _, best = filtered_viterbi(scores, mask, labels, T)
    marginals = filtered_marginals(scores, mask, labels, T)
    grid = [tuple(x) for x in mask[0].nonzero().tolist()]
    nodes = [(i, i + w, int(labels[0, i, w]), float(scores[0, i, w])) for i, w in grid]
    enum = filtered_enumerate(nodes, T)
    assert log_z.item() == pytest.approx(enum.log_z, abs=1e-9)
    assert best.item() == pytest.approx(enum.best_score, abs=1e-9)
    got = [marginals[0, i, w].item() for i, w in grid]
    assert got == pytest.approx(enum.marginals.tolist(), abs=1e-9)
    assert marginals[0, 0, 1].item() == 0.0 and not x.grad.isnan().any()
    assert [x.grad[0, i, w].item() for i, w in grid] == pytest.approx(got, abs=1e-9)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("use_t", [False, True])
def test_a_node_set_node_at_minus_infinity_is_on_no_path_with_any_probability(seed, use_t):
    """As on the grid: the node-set entry point gave NaN marginals (and a NaN log Z) for a node
    scored -inf, on host clusters and on the scan alike."""
    mask, scores, labels, T = _graph_with_a_node_at_minus_infinity(seed, use_t)
    index = mask.view(-1).nonzero().squeeze(1)
    nodes = NodeSet(index, labels.view(-1)[index], scores.view(-1)[index], tuple(mask.shape))
    best, marginals = decode_node_set(nodes, T)
    log_z = solve_node_set(nodes, T, "log_z").total
    grid = [tuple(x) for x in mask[0].nonzero().tolist()]
    enum = filtered_enumerate([(i, i + w, int(labels[0, i, w]), float(scores[0, i, w]))
                               for i, w in grid], T)
    assert marginals.tolist() == pytest.approx(enum.marginals.tolist(), abs=1e-9)
    assert log_z.item() == pytest.approx(enum.log_z, abs=1e-9)
    assert tuple(best.nonzero().squeeze(1).tolist()) in enum.best_paths


@pytest.mark.parametrize("low", [-math.inf, NEG, NEG / 2])
def test_a_graph_without_overlaps_with_a_node_at_minus_infinity_takes_the_solve(low):
    """No two nodes overlap, so decoding may skip the solve (every node on the one path,
    marginal 1), but not where a node scores -inf (or NEG / 2 and below, which the solve reads
    as -inf): that document has no path (no node chosen, every marginal 0), as the solve says;
    the other document keeps its one path."""
    from spacy_fsemicrf.structured.filtered import NodeSet, decode_node_set_log_z

    B, L, K = 2, 6, 2
    flat = [0 * L * K + 0 * K + 0, 0 * L * K + 2 * K + 1, 1 * L * K + 1 * K + 0]
    index = torch.tensor(flat)
    scores = torch.tensor([1.0, low, 0.5], dtype=DTYPE)
    nodes = NodeSet(index, torch.ones(3, dtype=torch.long), scores, (B, L, K))
    want = solve_node_set(nodes, None, "decode")
    for best, marginals, *_ in (decode_node_set(nodes), decode_node_set_log_z(nodes)):
        assert best.tolist() == want.best.tolist() == [False, False, True]
        assert marginals.tolist() == want.marginals.tolist() == [0.0, 0.0, 1.0]


@settings(max_examples=30, deadline=None)
@given(long_node_sets(), st.booleans())
def test_filtered_path_scores_are_the_best_paths_score_and_log_z(problem, use_t):
    """``filtered_path_scores``: the best path's score (``path_score`` of its nodes) and log Z
    of the graph, with or without transitions; a ``log_z`` given is taken as it is (the one the
    decoding solve gave, where it has one)."""
    from spacy_fsemicrf.structured.confidences import filtered_path_scores
    from spacy_fsemicrf.structured.filtered import NodeSet

    mask, scores, labels, T = long_grids(problem, use_t)
    index = mask.view(-1).nonzero().squeeze(1)
    nodes = NodeSet(index, labels.view(-1)[index], scores.view(-1)[index], tuple(mask.shape))
    chosen, _ = filtered_viterbi(scores, mask, labels, T)
    best = chosen.view(-1)[index]
    score, log_z = filtered_path_scores(nodes, best, T)
    assert torch.equal(score, path_score(scores * mask, chosen, labels, T))
    assert torch.equal(log_z, filtered_log_partition(scores, mask, labels, T))
    given_z = torch.arange(mask.shape[0], dtype=DTYPE)
    assert filtered_path_scores(nodes, best, T, given_z)[1] is given_z


def _graphs_without_a_path():
    """``(name, mask, scores, labels, T)``: two 6-token documents, the first with every path
    through a node or a transition of -inf (a node alone, a clique, a small cluster, a
    cluster for the scan, nodes that overlap none; a transition), the second a graph whose
    best path is one of several."""
    inf = math.inf
    B, L, K = 2, 6, 3
    labels = torch.ones((B, L, K), dtype=torch.long)
    second = [(0, 0, 0.5), (0, 1, 0.2), (1, 1, -0.3), (3, 0, 1.0), (4, 0, 0.1), (3, 2, 0.7)]
    graphs = {
        "alone": [(2, 0, -inf)],
        "clique": [(2, 0, -inf), (2, 1, -inf), (1, 2, -inf)],
        "small cluster": [(0, 1, -inf), (1, 1, -inf), (2, 1, -inf)],
        "scan": [(0, 1, -inf), (1, 1, -inf), (2, 1, -inf), (3, 1, -inf), (4, 1, -inf),
                 (0, 0, -inf), (2, 0, -inf), (4, 0, -inf), (5, 0, -inf)],
        "no overlap": [(0, 0, 1.0), (2, 1, -inf), (5, 0, 2.0)],
    }
    out = []
    for name, nodes in graphs.items():
        mask = torch.zeros((B, L, K), dtype=torch.bool)
        scores = torch.zeros((B, L, K), dtype=DTYPE)
        for b, doc in enumerate((nodes, second)):
            for i, w, v in doc:
                mask[b, i, w], scores[b, i, w] = True, v
        out.append((name, mask, scores, labels, None))
        out.append((name + ", transitions", mask, scores, labels, torch.zeros((3, 3), dtype=DTYPE)))
    mask, scores = out[-2][1].clone(), out[-2][2].clone()
    scores[0][mask[0]] = 0.0
    labels = labels.clone()
    labels[1] = 2
    T = torch.zeros((4, 4), dtype=DTYPE)
    T[3, 1] = -inf  # no path of the first document (label 1 only) may start
    out.append(("a transition", mask, scores, labels, T))
    return out


@pytest.mark.parametrize("case", range(11))
def test_a_document_whose_every_path_is_minus_infinity_has_no_best_path(case):
    """Where every path of a document scores -inf there is no distribution: Viterbi chose a
    path all the same, scored -1e30 or -2e30 (NEG, or a multiple), and the marginals were 1,
    1/n or 0 as the graph was solved (a node alone, a clique, a small cluster, the scan). Now
    no node is chosen, the best score is -inf, every marginal is 0, log Z stays finite at or
    below NEG / 2; the other document of the batch is as enumeration gives it, and the
    node-set entry points agree with the grid ones."""
    name, mask, scores, labels, T = _graphs_without_a_path()[case]
    chosen, best = filtered_viterbi(scores, mask, labels, T)
    marginals = filtered_marginals(scores, mask, labels, T)
    decoded, decoded_marginals = filtered_decode(scores, mask, labels, T)
    log_z = filtered_log_partition(scores, mask, labels, T)
    assert best[0].item() == -math.inf and not chosen[0].any(), name
    assert not marginals[0].any() and not decoded[0].any() and not decoded_marginals[0].any()
    assert -math.inf < log_z[0].item() <= NEG / 2
    grid = [tuple(x) for x in mask[1].nonzero().tolist()]
    enum = filtered_enumerate(
        [(i, i + w, int(labels[1, i, w]), float(scores[1, i, w])) for i, w in grid], T)
    assert best[1].item() == pytest.approx(enum.best_score, abs=1e-9)
    assert tuple(k for k, (i, w) in enumerate(grid) if chosen[1, i, w]) in enum.best_paths
    assert [marginals[1, i, w].item() for i, w in grid] == pytest.approx(
        enum.marginals.tolist(), abs=1e-9)
    assert torch.equal(decoded, chosen) and torch.equal(decoded_marginals, marginals)
    index = mask.view(-1).nonzero().squeeze(1)
    nodes = NodeSet(index, labels.view(-1)[index], scores.view(-1)[index], tuple(mask.shape))
    node_best, node_marginals = decode_node_set(nodes, T)
    assert torch.equal(node_best, chosen.view(-1)[index])
    assert torch.equal(node_marginals, marginals.view(-1)[index])
    assert torch.equal(solve_node_set(nodes, T, "viterbi").total, best)


@settings(max_examples=40, deadline=None)
@given(problems, st.floats(0.1, 0.9))
def test_transitions_of_minus_infinity_forbid_paths_without_nan(problem, forbidden):
    """A label that only transitions of -inf enter (a column of -inf, END's included) made
    the scan's log-sums NaN: log Z and every marginal of the document were NaN, even where a
    path of finite score remained. Against enumeration: log Z, best score and marginals of
    the paths left, a gradient without NaN, and no distribution where no path is left."""
    seed, B, L, K, C, density, _ = problem
    lengths, mask, scores, labels, T = random_nodes(seed, B, L, K, C, density)
    gen = torch.Generator().manual_seed(seed)
    T = T.masked_fill(torch.rand(T.shape, generator=gen) < forbidden, -math.inf)
    x = scores.clone().requires_grad_()
    log_z = filtered_log_partition(x, mask, labels, T)
    (grad,) = torch.autograd.grad(log_z.sum(), x)
    chosen, best = filtered_viterbi(scores, mask, labels, T)
    marginals = filtered_marginals(scores, mask, labels, T)
    for b in range(B):
        grid = doc_nodes(mask, b)
        enum = filtered_enumerate(
            [(i, i + w, int(labels[b, i, w]), float(scores[b, i, w])) for i, w in grid], T)
        got = [marginals[b, i, w].item() for i, w in grid]
        assert grad[b].isfinite().all()
        if enum.best_score == -math.inf:
            assert log_z[b].item() <= NEG / 2 and best[b].item() == -math.inf
            assert not any(got) and not chosen[b].any()
            continue
        assert [grad[b, i, w].item() for i, w in grid] == pytest.approx(got, abs=1e-9)
        assert log_z[b].item() == pytest.approx(enum.log_z, abs=1e-9)
        assert best[b].item() == pytest.approx(enum.best_score, abs=1e-9)
        assert got == pytest.approx(enum.marginals.tolist(), abs=1e-9)
        picked = tuple(k for k, (i, w) in enumerate(grid) if chosen[b, i, w])
        assert picked in enum.best_paths


def test_grids_that_do_not_fit_are_clear_errors():
    mask = torch.zeros((2, 4, 3), dtype=torch.bool)
    mask[0, 3, 1] = True  # tokens 3..4 of a 4-token grid: it would run into document 1
    scores = torch.zeros((2, 4, 3))
    labels = torch.ones((2, 4, 3), dtype=torch.long)
    for solve in (filtered_log_partition, filtered_viterbi, filtered_marginals, filtered_decode):
        for T in (None, torch.zeros((3, 3))):
            with pytest.raises(ValueError,
                               match=r"^a node \(i, w\) must end inside the grid: i \+ w < L$"):
                solve(scores, mask, labels, T)
    with pytest.raises(ValueError, match=r"^node_scores must be \[B, L, K\] as node_mask, "
                                         r"\(2, 4, 3\), got \(2, 5, 3\)$"):
        filtered_viterbi(torch.zeros((2, 5, 3)), mask)


@pytest.mark.parametrize("seed", range(4))
def test_a_node_set_out_of_grid_order_is_a_clear_error(seed):
    """The solvers take a node list in grid order: a hand-built NodeSet out of order (or with
    a node twice) was solved as another graph, without an error (its clusters cut where the
    listed order, not the tokens, said). Out of order, each entry point that solves a node set
    refuses it; sorted, it is the in-order node set, which agrees with enumeration."""
    B, L, K = 2, 5, 3
    index = torch.tensor([1, 3, 7, 12, 15, 16, 19, 27])  # in grid order
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(index.shape, generator=gen, dtype=DTYPE)
    labels = torch.randint(1, 3, index.shape, generator=gen)
    nodes = NodeSet(index, labels, scores, (B, L, K))
    T = torch.randn((4, 4), generator=gen, dtype=DTYPE)
    shuffled = torch.randperm(index.numel(), generator=gen)
    if torch.equal(shuffled, torch.arange(index.numel())):
        shuffled = shuffled.flip(0)
    twice = torch.cat([torch.arange(index.numel()), torch.tensor([2])]).sort().values
    order = "^the nodes must be listed in grid order"
    for bad in (shuffled, twice):
        wrong = NodeSet(index[bad], labels[bad], scores[bad], (B, L, K))
        for t in (None, T):
            for call in (lambda: decode_node_set(wrong, t),
                         lambda: decode_node_set(wrong, t, marginals=False),
                         lambda: solve_node_set(wrong, t, "log_z"),
                         lambda: filtered_nbest(wrong, torch.tensor([L, L]), t, 3),
                         lambda: filtered_log_partition(nodes.grid(nodes.scores), nodes.grid(),
                                                        nodes.grid(labels), t, index[bad])):
                with pytest.raises(ValueError, match=order):
                    call()
    # sorted again, the node set is the in-order one, and that one is the brute-force result
    again, back = index[shuffled].sort()
    fixed = NodeSet(again, labels[shuffled][back], scores[shuffled][back], (B, L, K))
    for t in (None, T):
        best, marginals = decode_node_set(fixed, t)
        assert torch.equal(best, decode_node_set(nodes, t)[0])
        for b in range(B):
            mine = (index // (L * K) == b).nonzero().squeeze(1).tolist()
            enum = filtered_enumerate(
                [(int(index[k] // K % L), int(index[k] // K % L + index[k] % K), int(labels[k]),
                  float(scores[k])) for k in mine], t)
            assert tuple(k - mine[0] for k in best.nonzero().squeeze(1).tolist()
                         if k in mine) in enum.best_paths
            assert marginals[mine].tolist() == pytest.approx(enum.marginals.tolist(), abs=1e-9)


def test_a_node_set_node_off_the_grid_is_a_clear_error():
    """A node of a hand-built NodeSet past its document's last grid position ran into the next
    document's cluster (its log Z and marginals were another graph's), and one past the last
    document indexed out of range."""
    B, L, K = 2, 3, 3
    ones = torch.ones(4, dtype=torch.long)
    # document 0: tokens 1..3 and 2..4 of a 3-token grid; document 1: 0..0 and 0..1
    nodes = NodeSet(torch.tensor([1 * K + 2, 2 * K + 2, L * K, L * K + 1]), ones,
                    torch.tensor([1.0, 2.0, 3.0, 4.0]), (B, L, K))
    with pytest.raises(ValueError, match=r"^a node \(i, w\) must end inside the grid: i \+ w < L$"):
        decode_node_set(nodes)
    beyond = NodeSet(torch.tensor([L * K, 2 * L * K, 2 * L * K + 1]), ones[:3],
                     torch.zeros(3), (B, L, K))
    with pytest.raises(ValueError, match=r"^node indices must lie in 0..17 on a \(2, 3, 3\) "
                                         r"grid, got 19$"):
        solve_node_set(beyond, None, "log_z")


def test_transitions_without_labels_are_a_clear_error():
    """Without labels, log Z read every node as the null label's row of the transitions, and
    path_score raised a TypeError."""
    mask = torch.zeros(1, 4, 2, dtype=torch.bool)
    mask[0, 0, 1] = mask[0, 1, 0] = mask[0, 2, 1] = True
    scores, T = torch.randn(1, 4, 2), torch.randn(3, 3)
    for solve in (filtered_log_partition, filtered_viterbi, filtered_marginals, filtered_decode):
        with pytest.raises(ValueError, match="^transitions need the nodes' labels$"):
            solve(scores, mask, None, T)
    with pytest.raises(ValueError, match="^transitions need the nodes' labels$"):
        path_score(scores, mask, None, T)


def test_int32_labels_are_read_as_long_ones_on_the_scan_too():
    """A chain of 11 overlapping nodes is scanned (not solved on the host), where int32 labels
    failed deep in the scan, with or without transitions, while smaller clusters took them."""
    mask = torch.zeros(1, 12, 2, dtype=torch.bool)
    mask[0, :11, 1] = True
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn((1, 12, 2), generator=gen, dtype=DTYPE)
    labels = torch.randint(1, 3, (1, 12, 2), generator=gen) * mask
    for T in (None, torch.randn((4, 4), generator=gen, dtype=DTYPE)):
        for function in (filtered_log_partition, filtered_marginals):
            assert torch.equal(function(scores, mask, labels.int(), T),
                               function(scores, mask, labels, T))
        assert torch.equal(filtered_viterbi(scores, mask, labels.int(), T)[0],
                           filtered_viterbi(scores, mask, labels, T)[0])
        index = mask.view(-1).nonzero().squeeze(1)
        nodes = NodeSet(index, labels.view(-1)[index], scores.view(-1)[index], (1, 12, 2))
        want = decode_node_set(nodes, T)
        got = decode_node_set(nodes._replace(labels=nodes.labels.int()), T)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("labels, transitions, message", [
    (3, (4, 4), r"^node labels must lie in 0\.\.2 for \(4, 4\) transitions, got 3$"),
    (-1, (4, 4), r"^node labels must lie in 0\.\.2 for \(4, 4\) transitions, got -1$"),
    (2, (3, 3), r"^node labels must lie in 0\.\.1 for \(3, 3\) transitions, got 2$"),
    (1.0, (4, 4), r"^node labels must be an integer tensor, got torch.float64$"),
    (True, (4, 4), r"^node labels must be an integer tensor, got torch.bool$"),
    (1j, (4, 4), r"^node labels must be an integer tensor, got torch.complex64$"),
    (1, (4, 3), r"^transitions must be \[C \+ 1, C \+ 1\] for C labels, null included "
                r"\(the last row from START, the last column to END\), got \(4, 3\)$"),
], ids=["START", "negative", "too-small", "float", "bool", "complex", "not-square"])
def test_labels_that_the_transitions_do_not_have_are_a_clear_error(labels, transitions, message):
    """Label C (or -1, wrapping around) read the START row and END column: path_score gave a
    wrong score without an error, and the solvers failed deep inside (those of a node set,
    decode_node_set's, too)."""
    mask = torch.zeros(1, 4, 2, dtype=torch.bool)
    mask[0, 0, 1] = mask[0, 1, 0] = mask[0, 2, 1] = True
    scores = torch.zeros((1, 4, 2), dtype=DTYPE)
    grid = torch.full((1, 4, 2), labels, dtype=DTYPE if isinstance(labels, float) else None)
    T = torch.zeros(transitions, dtype=DTYPE)
    path = mask.clone()
    path[0, 1, 0] = False
    index = mask.view(-1).nonzero().squeeze(1)
    nodes = NodeSet(index, grid.view(-1)[index], scores.view(-1)[index], tuple(mask.shape))
    for call in (lambda: path_score(scores, path, grid, T),
                 lambda: filtered_log_partition(scores, mask, grid, T),
                 lambda: filtered_viterbi(scores, mask, grid, T),
                 lambda: decode_node_set(nodes, T),
                 lambda: solve_node_set(nodes, T, "log_z")):
        with pytest.raises(ValueError, match=message):
            call()


@pytest.mark.parametrize("low, high, shown", [(-1, 3, -1), (0, 3, 3), (-2, 0, -2)])
def test_the_label_error_names_a_negative_label_first_else_the_highest(low, high, shown):
    """The label named is one the grid holds outside 0..C - 1: the lowest when it is negative,
    else the highest (a grid of labels 0 and 3 is wrong for its 3, not for its 0)."""
    mask = torch.zeros(1, 4, 2, dtype=torch.bool)
    mask[0, 0, 1] = mask[0, 1, 0] = mask[0, 2, 1] = True
    scores = torch.zeros((1, 4, 2), dtype=DTYPE)
    grid = torch.full((1, 4, 2), low)
    grid[0, 2, 1] = high
    T = torch.zeros((4, 4), dtype=DTYPE)
    path = mask.clone()
    path[0, 1, 0] = False
    message = rf"^node labels must lie in 0\.\.2 for \(4, 4\) transitions, got {shown}$"
    for call in (lambda: path_score(scores, path, grid, T),
                 lambda: filtered_log_partition(scores, mask, grid, T),
                 lambda: filtered_viterbi(scores, mask, grid, T)):
        with pytest.raises(ValueError, match=message):
            call()


@pytest.mark.parametrize("C", [1, 3])
def test_label_zero_and_a_transition_matrix_of_one_label_are_taken(C):
    """Labels lie in 0..C - 1, null (0) included, and C may be 1 (the null label alone): the
    check refused neither before, and scores them as the enumeration does."""
    gen = torch.Generator().manual_seed(C)
    mask = torch.zeros(1, 5, 2, dtype=torch.bool)
    mask[0, 0, 1] = mask[0, 1, 0] = mask[0, 2, 0] = mask[0, 3, 1] = True
    scores = torch.randn((1, 5, 2), generator=gen, dtype=DTYPE)
    labels = torch.randint(0, C, (1, 5, 2), generator=gen) * mask
    labels[0, 0, 1] = 0
    T = torch.randn((C + 1, C + 1), generator=gen, dtype=DTYPE)
    grid = doc_nodes(mask, 0)
    enum = filtered_enumerate([(i, i + w, int(labels[0, i, w]), float(scores[0, i, w]))
                               for i, w in grid], T)
    assert filtered_log_partition(scores, mask, labels, T).item() == pytest.approx(
        enum.log_z, abs=1e-9)
    best, _ = filtered_viterbi(scores, mask, labels, T)
    assert tuple(i for i, (s, w) in enumerate(grid) if best[0, s, w]) in enum.best_paths
    path = torch.zeros_like(mask)
    path[0, 0, 1] = path[0, 2, 0] = path[0, 3, 1] = True  # 0..1, 2, 3..4
    chosen = [grid.index((0, 1)), grid.index((2, 0)), grid.index((3, 1))]
    [total] = [t for p, t in enum.paths if list(p) == chosen]
    assert path_score(scores, path, labels, T).item() == pytest.approx(total, abs=1e-9)


def test_a_half_precision_node_set_node_at_minus_infinity_is_on_no_path():
    """float16 cannot hold the float32 bound for -inf scores: a node set in half precision (a
    head converted with .half()) is bounded at its own, and solves as in float64."""
    mask = torch.zeros(1, 6, 2, dtype=torch.bool)
    mask[0, 0, 1] = mask[0, 1, 0] = mask[0, 1, 1] = mask[0, 3, 0] = mask[0, 4, 0] = True
    index = mask.view(-1).nonzero().squeeze(1)
    scores = torch.tensor([0.5, -math.inf, 0.25, -0.5, 1.0], dtype=DTYPE)
    labels = torch.tensor([1, 2, 1, 1, 2])
    nodes = NodeSet(index, labels, scores, (1, 6, 2))
    half = nodes._replace(scores=scores.half())
    for mode in ("log_z", "marginals"):
        want, got = solve_node_set(nodes, None, mode), solve_node_set(half, None, mode)
        assert got.total.dtype == torch.float16
        assert got.total.tolist() == pytest.approx(want.total.tolist(), abs=1e-2)
        if mode == "marginals":
            assert got.marginals[1].item() == 0.0
            assert got.marginals.tolist() == pytest.approx(want.marginals.tolist(), abs=1e-2)


def test_grids_of_other_shapes_are_a_clear_error_naming_them():
    mask = torch.zeros(1, 4, 2, dtype=torch.bool)
    mask[0, 1, 0] = True
    labels = torch.ones(1, 4, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^node_labels must be \[B, L, K\] as node_mask, "
                                         r"\(1, 4, 2\), got \(1, 4, 3\)$"):
        filtered_log_partition(torch.zeros(1, 4, 2), mask, labels)


def test_a_half_precision_node_at_minus_infinity_is_on_no_path():
    """float16 cannot hold NEG (-1e30 rounds to -inf): such a node is clamped to a quarter of
    float16's lowest value instead, and log Z and the marginals stay finite."""
    mask = torch.zeros(1, 4, 2, dtype=torch.bool)
    mask[0, 0, 1] = mask[0, 1, 0] = mask[0, 2, 1] = True
    scores = torch.tensor([[[0.0, -math.inf], [0.5, 0.0], [0.0, -0.25], [0.0, 0.0]]])
    want = filtered_log_partition(scores, mask)
    got = filtered_log_partition(scores.half(), mask)
    assert got.dtype == torch.float16 and torch.isfinite(got).all()
    assert got.float().item() == pytest.approx(want.item(), abs=1e-2)
    marginals = filtered_marginals(scores.half(), mask)
    assert not marginals.isnan().any() and marginals[0, 0, 1].item() == 0.0


@pytest.mark.parametrize("lengths, error, message", [
    ([5, 9], ValueError, "^lengths must lie between 0 and the 5 token rows of the local "
                         "scores, got 9$"),
    ([5, -1], ValueError, "^lengths must lie between 0 and the 5 token rows of the local "
                          "scores, got -1$"),
    ([5], ValueError, r"^lengths must be \[B\], one per document of the local scores \(2\), "
                      r"got \(1,\)$"),
    ([4.5, 3.0], ValueError, "^lengths must be an integer tensor, got torch.float32$"),
])
def test_filtering_takes_lengths_inside_the_local_scores_only(lengths, error, message):
    """A length past the scores' rows kept spans past the grid as nodes (decoded as entities
    on tokens the document does not have), a negative one read the document as empty, and a
    length of 4.5 kept the spans ending on token 4."""
    local = torch.zeros((2, 5, 3, 3))
    local[..., 1] = 1.0  # every candidate span is kept
    gold = torch.zeros((2, 5, 3), dtype=torch.long)
    for call in (lambda x: inference_nodes(local, x),
                 lambda x: inference_node_set(local, local, x),
                 lambda x: training_nodes(local, x, gold)):
        with pytest.raises(error, match=message):
            call(torch.tensor(lengths))
        with pytest.raises(TypeError, match="^lengths must be an integer tensor, got list$"):
            call([5, 3])
        mask, _ = inference_nodes(local, torch.tensor([5, 3]))
        assert int(mask.sum()) == 12 + 6  # the valid lengths' candidates


def test_filtering_needs_a_null_and_a_label_column():
    """Scores with the null column only raised an IndexError from amax."""
    with pytest.raises(ValueError, match=r"^local scores must be \[B, L, K, C\], C >= 2 \(null "
                                         r"and at least one label\), got \(1, 4, 2, 1\)$"):
        inference_nodes(torch.zeros((1, 4, 2, 1)), torch.tensor([4]))


@pytest.mark.parametrize("use_t", [False, True])
def test_bfloat16_scores_are_solved_in_their_precision(use_t):
    """NumPy has no bfloat16: the host solver of cliques and small clusters raised a
    TypeError on bfloat16 scores, which float16 ones pass."""
    lengths, mask, scores, labels, T = random_nodes(1, 3, 6, 3, 3, 0.5)
    T = T.float() if use_t else None
    low = scores.bfloat16()
    want_log_z = filtered_log_partition(low.double(), mask, labels, T)
    x = low.clone().requires_grad_(True)
    log_z = filtered_log_partition(x, mask, labels, T)
    log_z.sum().backward()
    assert log_z.dtype == x.grad.dtype == torch.bfloat16
    torch.testing.assert_close(log_z.double(), want_log_z, atol=0.05, rtol=0.02)
    want = filtered_marginals(low.double(), mask, labels, T)
    marginals = filtered_marginals(low, mask, labels, T)
    assert marginals.dtype == torch.bfloat16
    torch.testing.assert_close(marginals.double(), want, atol=0.05, rtol=0.0)
    torch.testing.assert_close(x.grad.double(), want, atol=0.05, rtol=0.0)
    best, _ = filtered_viterbi(low, mask, labels, T)
    assert torch.equal(best, filtered_viterbi(low.double(), mask, labels, T)[0])


def test_a_nan_margin_is_a_clear_error():
    """A NaN margin kept no span (every comparison with NaN is false): a head given
    filter_margin=nan decoded no entity, and one built with train_margin=nan trained on the
    gold spans alone, without a word."""
    local, lengths = torch.randn((1, 4, 2, 3)), torch.tensor([4])
    gold = torch.zeros((1, 4, 2), dtype=torch.long)
    for call in (lambda m: inference_nodes(local, lengths, m),
                 lambda m: inference_node_set(local, local, lengths, m),
                 lambda m: training_nodes(local, lengths, gold, margin=m)):
        with pytest.raises(ValueError, match="^the filter's margin must be a number, got nan$"):
            call(float("nan"))
        call(float("inf"))  # keeps every span


def _path_grids():
    """``(scores, path, labels, T)``: a batch of two documents of 4 tokens, K = 3, with a path
    of one node in each and transitions of 2 labels."""
    gen = torch.Generator().manual_seed(0)
    path = torch.zeros((2, 4, 3), dtype=torch.bool)
    path[0, 0, 1] = path[1, 2, 0] = True
    labels = torch.ones((2, 4, 3), dtype=torch.long)
    T = torch.randn((3, 3), generator=gen, dtype=DTYPE)
    return torch.randn((2, 4, 3), generator=gen, dtype=DTYPE), path, labels, T


@pytest.mark.parametrize("argument, bad, got", [
    ("scores", lambda x: x[0], (4, 3)),
    ("scores", lambda x: x[:1], (1, 4, 3)),
    ("scores", lambda x: torch.cat([x, x[:, :, :1]], 2), (2, 4, 4)),
    ("scores", lambda x: x.unsqueeze(-1), (2, 4, 3, 1)),
    ("path", lambda x: x[0], (4, 3)),
    ("path", lambda x: x.unsqueeze(-1), (2, 4, 3, 1)),
    ("labels", lambda x: x[0], (4, 3)),
    ("labels", lambda x: torch.cat([x, x[:, :, :1]], 2), (2, 4, 4)),
], ids=["one-document", "one-document-batched", "wider", "4-d", "path-2-d", "path-4-d",
        "labels-2-d", "labels-wider"])
def test_path_score_grids_of_another_shape_are_a_clear_error(argument, bad, got):
    """path_score read its grids without a look at their shapes: one document's scores
    broadcast to the whole batch (each document's gold score read at the first one's spans)
    and labels of a wider grid were read at other spans, both without an error; the other
    shapes failed with PyTorch's own errors (an IndexError, "not enough values to
    unpack")."""
    scores, path, labels, T = _path_grids()
    grids = {"scores": scores, "path": path, "labels": labels}
    grids[argument] = bad(grids[argument])
    name = {"scores": "node_scores", "path": "path_mask", "labels": "node_labels"}[argument]
    like = "" if argument == "path" else r" as path_mask, \(2, 4, 3\)"
    message = rf"^{name} must be \[B, L, K\]{like}, got {re.escape(str(got))}$"
    with pytest.raises(ValueError, match=message):
        path_score(grids["scores"], grids["path"], grids["labels"], T)


@pytest.mark.parametrize("call", [
    lambda s, m, l, t: filtered_log_partition(s, m, l, t),
    lambda s, m, l, t: filtered_viterbi(s, m, l, t),
    lambda s, m, l, t: filtered_marginals(s, m, l, t),
    lambda s, m, l, t: filtered_decode(s, m, l, t),
    lambda s, m, l, t: consistent_log_score(s, m, m, m, l, t),
], ids=["log_partition", "viterbi", "marginals", "decode", "consistent_log_score"])
@pytest.mark.parametrize("use_t", [False, True])
def test_grids_without_the_batch_axis_are_a_clear_error(call, use_t):
    """One document's grids without the batch axis raised "not enough values to unpack"
    from inside the solver."""
    scores, mask, labels, T = _path_grids()
    with pytest.raises(ValueError, match=r"^node_mask must be \[B, L, K\], got \(4, 3\)$"):
        call(scores[0], mask[0], labels[0], T if use_t else None)


@pytest.mark.parametrize("argument, shape", [("gold_mask", (4, 3)), ("gold_mask", (1, 4, 3)),
                                             ("unknown", (4, 3)), ("unknown", (2, 4, 4))])
def test_consistent_log_score_masks_of_another_shape_are_a_clear_error(argument, shape):
    """The gold and unknown masks were combined with the node mask before any check: one
    document's (or one without the batch axis) broadcast to the whole batch, and the log
    partition of another graph came back without an error."""
    scores, mask, labels, T = _path_grids()
    masks = {"gold_mask": mask, "unknown": mask}
    masks[argument] = torch.zeros(shape, dtype=torch.bool)
    message = (rf"^{argument} must be \[B, L, K\] as node_mask, \(2, 4, 3\), got "
               rf"{re.escape(str(shape))}$")
    with pytest.raises(ValueError, match=message):
        consistent_log_score(scores, mask, masks["gold_mask"], masks["unknown"], labels, T)


@pytest.mark.parametrize("argument, shape, message", [
    ("gold_grid", (1, 4, 3), r"^gold_grid must be \[B, L, K\] as the local scores, \(2, 4, 3\), "
                             r"got \(1, 4, 3\)$"),
    ("gold_grid", (4, 3), r"^gold_grid must be \[B, L, K\] as the local scores, \(2, 4, 3\), "
                          r"got \(4, 3\)$"),
    ("gold_grid", (2, 4, 4), r"^gold_grid must be \[B, L, K\] as the local scores, \(2, 4, 3\), "
                             r"got \(2, 4, 4\)$"),
    ("unknown", (4, 3), r"^unknown must be \[B, L, K\] as the local scores, \(2, 4, 3\), got "
                        r"\(4, 3\)$"),
    ("unknown", (2, 4, 4), r"^unknown must be \[B, L, K\] as the local scores, \(2, 4, 3\), got "
                           r"\(2, 4, 4\)$"),
    ("incorrect", (2, 4, 3, 4), r"^incorrect must be \[B, L, K, C\] as the local scores, "
                                r"\(2, 4, 3, 3\), got \(2, 4, 3, 4\)$"),
    ("incorrect", (1, 4, 3, 3), r"^incorrect must be \[B, L, K, C\] as the local scores, "
                                r"\(2, 4, 3, 3\), got \(1, 4, 3, 3\)$"),
    ("incorrect", (2, 4, 3), r"^incorrect must be \[B, L, K, C\] as the local scores, "
                             r"\(2, 4, 3, 3\), got \(2, 4, 3\)$"),
])
def test_training_node_grids_of_another_shape_are_a_clear_error(argument, shape, message):
    """training_nodes combined its grids with the filter's by broadcasting: one document's gold
    grid (or unknown spans) was taken for every document, and incorrect labels of a wider
    grid were read as this one's, without an error; the other shapes failed inside PyTorch
    ("The size of tensor a (3) must match ...", "Index tensor must have the same number of
    dimensions ...")."""
    gen = torch.Generator().manual_seed(0)
    local, lengths = torch.randn((2, 4, 3, 3), generator=gen), torch.tensor([4, 3])
    grids = {"gold_grid": torch.zeros((2, 4, 3), dtype=torch.long), "unknown": None,
             "incorrect": None}
    grids[argument] = torch.zeros(shape, dtype=torch.long if argument == "gold_grid" else
                                  torch.bool)
    with pytest.raises(ValueError, match=message):
        training_nodes(local, lengths, grids["gold_grid"], unknown=grids["unknown"],
                       incorrect=grids["incorrect"])


@pytest.mark.parametrize("index, message", [
    ([24], r"^node indices must lie in 0\.\.23 on a \(2, 4, 3\) grid, got 24$"),
    ([1, 100], r"^node indices must lie in 0\.\.23 on a \(2, 4, 3\) grid, got 100$"),
    ([-1], r"^node indices must lie in 0\.\.23 on a \(2, 4, 3\) grid, got -1$"),
    ([[1]], r"^node_index must be \[n\], got \(1, 1\)$"),
    ([1.0], r"^node_index must be an integer tensor, got torch.float32$"),
    ([True] + [False] * 23, r"^node_index must be an integer tensor, got torch.bool$"),
], ids=["past-the-batch", "far-past", "negative", "2-d", "float", "bool-mask"])
@pytest.mark.parametrize("use_t", [False, True])
def test_a_node_index_off_the_grid_is_a_clear_error(index, message, use_t):
    """node_index indexed the grids before the compaction checked it: an index past the batch
    raised an IndexError, -1 was called a node that does not end inside the grid, one of
    another rank failed in an output's broadcast, and a bool mask was read as the node scores
    it selects and then called out of grid order."""
    scores, mask, labels, T = _path_grids()
    with pytest.raises(ValueError, match=message):
        filtered_log_partition(scores, mask, labels, T if use_t else None, torch.tensor(index))


@pytest.mark.parametrize("part, value, message", [
    ("scores", torch.tensor([0.5, 1.0]), r"^nodes\.scores must be \[n\] as nodes\.index, \(3,\), "
                                         r"got \(2,\)$"),
    ("scores", torch.tensor([0.5, 1.0, 0.25, 2.0]), r"^nodes\.scores must be \[n\] as "
                                                    r"nodes\.index, \(3,\), got \(4,\)$"),
    ("scores", torch.tensor([[0.5], [1.0], [0.25]]), r"^nodes\.scores must be \[n\] as "
                                                     r"nodes\.index, \(3,\), got \(3, 1\)$"),
    ("labels", torch.tensor([1, 1]), r"^nodes\.labels must be \[n\] as nodes\.index, \(3,\), "
                                     r"got \(2,\)$"),
    ("index", torch.tensor([[1, 2, 4]]), r"^nodes\.index must be \[n\], got \(1, 3\)$"),
    ("shape", (4, 3), r"^nodes\.shape must be the grid's \(B, L, K\), got \(4, 3\)$"),
], ids=["scores-short", "scores-long", "scores-2-d", "labels-short", "index-2-d", "shape"])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("solve", ["decode", "viterbi", "solve"])
def test_a_node_set_of_parts_that_do_not_fit_is_a_clear_error(part, value, message, overlap,
                                                               solve):
    """A NodeSet is built by hand too: scores of another length failed deep inside NumPy
    ("operands could not be broadcast") or an IndexError, or, where no two nodes overlap,
    were not looked at (a list one too long decoded without an error); a 2-d index was read
    flat, and a shape of two sizes failed unpacking it."""
    index = torch.tensor([1, 2, 4] if overlap else [1, 4, 7])  # (0..1, 0..2, 1..2) or apart
    parts = {"index": index, "labels": torch.tensor([1, 1, 2]),
             "scores": torch.tensor([0.5, 1.0, 0.25]), "shape": (1, 4, 3)}
    parts[part] = value
    nodes = NodeSet(parts["index"], parts["labels"], parts["scores"], parts["shape"])
    T = torch.zeros((3, 3)) if part == "labels" else None  # (labels matter with transitions)
    run = {"decode": lambda: decode_node_set(nodes, T),
           "viterbi": lambda: decode_node_set(nodes, T, marginals=False),
           "solve": lambda: solve_node_set(nodes, T, "log_z")}[solve]
    with pytest.raises(ValueError, match=message):
        run()
