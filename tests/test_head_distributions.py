"""What each head decodes and the loss it trains on, against brute-force enumeration of the
head's own distribution.

On tiny random inputs, a randomly initialised head's prediction ``head(X, lengths)`` must be
the best structure of the distribution its scores define (the best path of the filtered graph,
the best segmentation, the best tag sequence), and each decoded entity's confidence must be
its value under that distribution, enumerated in plain Python (:mod:`.bruteforce`):

* filtered semi-CRF: the nodes are re-derived from the local scores (the spans whose best
  entity label beats null minus the margin), the paths are the maximal non-overlapping node
  sets, and the raw confidence (before the component's calibration) is the local classifier's
  probability of the node's label times the node's path marginal;
* exact semi-CRF: the marginal of the labelled segment over all segmentations;
* linear-chain CRF: the probability that the labelled span is an entity of the tag sequence.

The training loss ``head(X, lengths, gold)`` must be ``log Z - score(gold)`` summed over the
documents, with ``Z`` enumerated (for the filtered head over the training graph: the gold spans
and the predicted ones that overlap them), plus the filtered head's weighted local
cross-entropy.
"""
import math
from typing import List, Tuple

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spacy_fsemicrf.structured.heads import FilteredSemiCRFHead, LinearCRFHead, SemiCRFHead

from .bruteforce import (
    crf_enumerate,
    crf_span_probabilities,
    entities_by_definition,
    filtered_enumerate,
    segmentation_score,
    semicrf_enumerate,
    tag_sequence_score,
)

D, M = 6, 2
Row = Tuple[int, int, int, int]  # (doc, start, end inclusive, label)
# The heads compute in float32; the references enumerate those float32 scores in float64.
ATOL = 2e-5


def inputs(seed: int, B: int, L: int):
    """Random token vectors and lengths in 1..L (one document of length L)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, L + 1, (B,), generator=gen)
    lengths[0] = L
    return torch.randn((B, L, D), generator=gen), lengths


def randomise(head: torch.nn.Module, seed: int, scale: float = 1.0) -> torch.nn.Module:
    """Random transitions (zero at construction) and a larger output layer, so that the
    distribution is far from uniform; the head in eval mode (no dropout)."""
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        if getattr(head, "transitions", None) is not None:
            head.transitions.copy_(torch.randn(head.transitions.shape, generator=gen))
        for module in head.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.mul_(scale)
    return head.eval()


def check_decoded(decoded, expected_best: List[Row], confidence: dict, marginal: dict, tied: bool):
    """Check a head's ``(spans, confidences)`` against the enumerated best structure's entity
    rows and each row's expected confidence; returns the decoded rows' enumerated marginals."""
    spans, conf = decoded
    rows = [tuple(r) for r in spans.tolist()]
    assert rows == sorted(rows), "decoded spans come sorted by (doc, start)"
    if not tied:
        assert rows == expected_best
    for row, value in zip(rows, conf.tolist()):
        assert value == pytest.approx(confidence[row], abs=ATOL), row
    return [marginal[row] for row in rows]


# ----------------------------------------------------------------------------- filtered semi-CRF


def filtered_reference(head: FilteredSemiCRFHead, X, lengths, margin: float):
    """Per document: the nodes ``(start, end, label, score)`` re-derived from the head's local
    and global scores, each node's local probability of its label, and the enumeration of
    their paths."""
    with torch.no_grad():
        local, glob = head.span_scores(X, lengths)
    T = None if head.transitions is None else head.transitions.detach().double()
    K = head.max_width
    out = []
    for b in range(X.shape[0]):
        nodes, local_prob = [], []
        n = int(lengths[b])
        for i in range(n):
            for w in range(min(K, n - i)):
                scores = local[b, i, w].double()
                label = int(scores[1:].argmax()) + 1
                if scores[label] > scores[0] - margin:
                    nodes.append((i, i + w, label, float(glob[b, i, w, label])))
                    local_prob.append(float(scores.softmax(0)[label]))
        out.append((nodes, local_prob, filtered_enumerate(nodes, T)))
    return out


def check_filtered_head(seed: int, B: int, L: int, K: int, transitions: bool, margin: float):
    torch.manual_seed(seed)
    head = FilteredSemiCRFHead(D, M, max_width=K, hidden_width=16, transitions=transitions)
    head = randomise(head, seed, scale=3.0)
    X, lengths = inputs(seed, B, L)
    with torch.no_grad():
        decoded = head(X, lengths, filter_margin=margin)
    expected, confidence, marginal, tied = [], {}, {}, False
    for b, (nodes, local_prob, enum) in enumerate(filtered_reference(head, X, lengths, margin)):
        expected += [(b, nodes[k][0], nodes[k][1], nodes[k][2]) for k in enum.best_paths[0]]
        tied |= _near_tie(enum)
        for k, (s, e, label, _) in enumerate(nodes):
            marginal[(b, s, e, label)] = float(enum.marginals[k])
            confidence[(b, s, e, label)] = local_prob[k] * marginal[(b, s, e, label)]
    return check_decoded(decoded, expected, confidence, marginal, tied)


def _near_tie(enum) -> bool:
    """Whether float32 rounding could pick another best structure than float64."""
    values = sorted((v for _, v in enum.paths), reverse=True)
    return len(values) > 1 and values[0] - values[1] < 1e-3


# ----------------------------------------------------------------------------- exact semi-CRF


def check_semicrf_head(seed: int, B: int, L: int, K: int, transitions: bool):
    torch.manual_seed(seed)
    head = SemiCRFHead(D, M, max_width=K, hidden_width=16, transitions=transitions)
    head = randomise(head, seed, scale=3.0)
    X, lengths = inputs(seed, B, L)
    with torch.no_grad():
        decoded = head(X, lengths)
        scores = head.span_scores(X, lengths).double()
    T = None if head.transitions is None else head.transitions.detach().double()
    expected, confidence, tied = [], {}, False
    for b in range(B):
        enum = semicrf_enumerate(scores[b], int(lengths[b]), T)
        expected += [(b, s, e, c) for s, e, c in enum.best_paths[0] if c > 0]
        tied |= _near_tie(enum)
        for s in range(int(lengths[b])):
            for w in range(K):
                for c in range(1, M + 1):
                    confidence[(b, s, s + w, c)] = float(enum.marginals[s, w, c])
    return check_decoded(decoded, expected, confidence, confidence, tied)


# ----------------------------------------------------------------------------- linear-chain CRF


def check_linear_crf_head(seed: int, B: int, L: int, scheme: str):
    torch.manual_seed(seed)
    head = randomise(LinearCRFHead(D, M, hidden_width=16, scheme=scheme), seed, scale=3.0)
    X, lengths = inputs(seed, B, L)
    with torch.no_grad():
        decoded = head(X, lengths)
        emissions = head.emissions(X, lengths).double()
    T = head.transitions.detach().double()
    names = head.scheme.names
    expected, confidence, tied = [], {}, False
    for b in range(B):
        enum = crf_enumerate(emissions[b], T, int(lengths[b]), head.scheme.allowed)
        expected += [(b, *span) for span in entities_by_definition(enum.best_paths[0], names, scheme)]
        tied |= _near_tie(enum)
        probs = crf_span_probabilities(enum, names, scheme)
        n = int(lengths[b])
        for s in range(n):
            for e in range(s, n):
                for c in range(1, M + 1):
                    confidence[(b, s, e, c)] = probs.get((s, e, c), 0.0)
    return check_decoded(decoded, expected, confidence, confidence, tied)


# ----------------------------------------------------------------------------- the tests


def uncertain(values: List[float]) -> int:
    """How many decoded entities have a marginal far from 0 and 1 (where a wrong formula
    would show)."""
    return sum(0.05 < v < 0.95 for v in values)


@pytest.mark.parametrize("transitions", [False, True])
def test_filtered_head_decodes_the_best_path_with_its_node_marginals(transitions):
    values = []
    for seed in range(6):
        values += check_filtered_head(seed, B=3, L=7, K=3, transitions=transitions, margin=0.0)
    assert uncertain(values) >= 5


@pytest.mark.parametrize("transitions", [False, True])
def test_semicrf_head_decodes_the_best_segmentation_with_its_marginals(transitions):
    values = []
    for seed in range(4):
        values += check_semicrf_head(seed, B=3, L=6, K=3, transitions=transitions)
    assert uncertain(values) >= 5


@pytest.mark.parametrize("scheme", ["BIO", "BILUO"])
def test_linear_crf_head_decodes_the_best_tags_with_their_span_probabilities(scheme):
    values = []
    for seed in range(4):
        values += check_linear_crf_head(seed, B=3, L=5 if scheme == "BIO" else 4, scheme=scheme)
    assert uncertain(values) >= 5


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 10_000), st.integers(1, 3), st.integers(1, 8), st.integers(1, 4), st.booleans(),
    st.sampled_from([0.0, 0.0, 0.8, -0.8]),
)
def test_filtered_head_matches_enumeration(seed, B, L, K, transitions, margin):
    check_filtered_head(seed, B, L, K, transitions, margin)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 3), st.integers(1, 6), st.integers(1, 4), st.booleans())
def test_semicrf_head_matches_enumeration(seed, B, L, K, transitions):
    check_semicrf_head(seed, B, L, K, transitions)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 3), st.sampled_from(["BIO", "BILUO"]), st.data())
def test_linear_crf_head_matches_enumeration(seed, B, scheme, data):
    L = data.draw(st.integers(1, 5 if scheme == "BIO" else 4))
    check_linear_crf_head(seed, B, L, scheme)


def test_confidences_are_probabilities_of_exclusive_events():
    """Overlapping nodes are never on one path together: their marginals sum to at most 1, and
    the brute force's marginals sum, for each token, to the probability it is covered."""
    nodes = [(0, 1, 1, 0.3), (1, 2, 2, -0.2), (2, 2, 1, 0.5), (3, 3, 2, 1.0)]
    enum = filtered_enumerate(nodes)
    assert sorted(enum.paths) == sorted([((0, 2, 3), 1.8), ((1, 3), 0.8)])
    z = math.exp(1.8) + math.exp(0.8)
    assert enum.marginals.tolist() == pytest.approx(
        [math.exp(1.8) / z, math.exp(0.8) / z, math.exp(1.8) / z, 1.0]
    )


# ----------------------------------------------------------------------------- training losses


def random_gold(seed: int, lengths: torch.Tensor, K: int) -> List[Row]:
    """The entities of a random segmentation of each document (widths 1..K, labels 1..M)."""
    gen = torch.Generator().manual_seed(seed + 2)
    rows = []
    for b, n in enumerate(lengths.tolist()):
        i = 0
        while i < n:
            w = min(int(torch.randint(0, K, (1,), generator=gen)), n - 1 - i)
            if torch.rand((1,), generator=gen).item() < 0.5:
                rows.append((b, i, i + w, int(torch.randint(1, M + 1, (1,), generator=gen))))
            i += w + 1
    return rows


def head_loss(head, X, lengths, rows: List[Row]) -> float:
    return float(head(X, lengths, torch.tensor(rows, dtype=torch.long).view(-1, 4)).detach())


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("transitions", [False, True])
def test_filtered_head_loss_is_local_cross_entropy_plus_the_training_graph_crf(seed, transitions):
    K, null_weight = 3, 0.6
    torch.manual_seed(seed)
    head = FilteredSemiCRFHead(
        D, M, max_width=K, hidden_width=16, transitions=transitions, null_weight=null_weight
    )
    head = randomise(head, seed, scale=3.0)
    X, lengths = inputs(seed, B=3, L=7)
    rows = random_gold(seed, lengths, K)
    with torch.no_grad():
        local, glob = (s.double() for s in head.span_scores(X, lengths))
    T = None if head.transitions is None else head.transitions.detach().double()
    expected, n_extra = 0.0, 0
    for b in range(X.shape[0]):
        gold = {(s, e): label for d, s, e, label in rows if d == b}
        nodes = [(s, e, label, float(glob[b, s, e - s, label])) for (s, e), label in gold.items()]
        n = int(lengths[b])
        for i in range(n):
            for w in range(min(K, n - i)):
                target = gold.get((i, i + w), 0)
                weight = 1.0 if target else null_weight
                expected -= weight * float(local[b, i, w].log_softmax(0)[target])
                predicted = int(local[b, i, w].argmax())
                overlaps = any(s <= i + w and i <= e for s, e in gold)
                if not target and predicted and overlaps:
                    nodes.append((i, i + w, predicted, float(glob[b, i, w, predicted])))
                    n_extra += 1
        enum = filtered_enumerate(nodes, T)
        gold_path = tuple(sorted(range(len(gold)), key=lambda k: nodes[k][0]))
        expected += enum.log_z - dict(enum.paths)[gold_path]
    assert n_extra > 0  # the training graph is more than the gold path
    assert head_loss(head, X, lengths, rows) == pytest.approx(expected, rel=1e-5, abs=1e-4)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("transitions", [False, True])
def test_semicrf_head_loss_is_log_z_minus_the_gold_segmentation(seed, transitions):
    K = 3
    torch.manual_seed(seed)
    head = SemiCRFHead(D, M, max_width=K, hidden_width=16, transitions=transitions)
    head = randomise(head, seed, scale=3.0)
    X, lengths = inputs(seed, B=3, L=6)
    rows = random_gold(seed, lengths, K)
    with torch.no_grad():
        scores = head.span_scores(X, lengths).double()
    T = None if head.transitions is None else head.transitions.detach().double()
    expected = 0.0
    for b in range(X.shape[0]):
        entities = {s: (s, e, label) for d, s, e, label in rows if d == b}
        segments, i = [], 0
        while i < int(lengths[b]):
            segments.append(entities.get(i, (i, i, 0)))
            i = segments[-1][1] + 1
        expected += semicrf_enumerate(scores[b], int(lengths[b]), T).log_z
        expected -= segmentation_score(scores[b], segments, T)
    assert head_loss(head, X, lengths, rows) == pytest.approx(expected, rel=1e-5, abs=1e-4)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("scheme", ["BIO", "BILUO"])
def test_linear_crf_head_loss_is_log_z_minus_the_gold_tags(seed, scheme):
    torch.manual_seed(seed)
    head = randomise(LinearCRFHead(D, M, hidden_width=16, scheme=scheme), seed, scale=3.0)
    X, lengths = inputs(seed, B=3, L=5 if scheme == "BIO" else 4)
    rows = random_gold(seed, lengths, K=3)
    with torch.no_grad():
        emissions = head.emissions(X, lengths).double()
    T = head.transitions.detach().double()
    names = list(head.scheme.names)
    expected = 0.0
    for b in range(X.shape[0]):
        tags = ["O"] * int(lengths[b])
        for _, s, e, label in (r for r in rows if r[0] == b):
            for t in range(s, e + 1):
                kind = "B" if t == s else "L" if t == e and scheme == "BILUO" else "I"
                tags[t] = f"{'U' if s == e and scheme == 'BILUO' else kind}-{label}"
        ids = [names.index(tag) for tag in tags]
        expected += crf_enumerate(emissions[b], T, len(ids), head.scheme.allowed).log_z
        expected -= tag_sequence_score(emissions[b], T, ids)
    assert head_loss(head, X, lengths, rows) == pytest.approx(expected, rel=1e-5, abs=1e-4)
