"""n-best segmentations of the three heads against brute-force enumeration: the k best are
the top k of the enumeration, in order (ties in any order), distinct, each with its own score
and the probability ``exp(score - log Z)``."""
import math
import random

import numpy
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spacy_fsemicrf.structured import filtered
from spacy_fsemicrf.structured.linear_crf import tag_scheme
from spacy_fsemicrf.structured.nbest import crf_nbest, filtered_nbest, semicrf_nbest
from spacy_fsemicrf.structured.spans import span_mask

from .bruteforce import (
    _logsumexp,
    crf_enumerate,
    entities_by_definition,
    maximal_nonoverlapping_sets,
    semicrf_enumerate,
)

from .bruteforce_constraints import maybe_transitions

TOL = 1e-9


def check_ranking(found, paths, k):
    """``found``: the n-best of one document; ``paths``: every ``(spans, score)`` of it."""
    log_z = _logsumexp([v for _, v in paths])
    by_spans = {tuple(sp): v for sp, v in paths}
    assert len(by_spans) == len(paths)  # spans identify a path
    expected = sorted((v for _, v in paths), reverse=True)[:k]
    assert len(found) == len(expected)
    assert len({seg.spans for seg in found}) == len(found)  # distinct
    for seg, want in zip(found, expected):
        assert math.isclose(seg.score, want, abs_tol=TOL)
        assert math.isclose(by_spans[seg.spans], seg.score, abs_tol=TOL)
        assert math.isclose(seg.log_prob, seg.score - log_z, abs_tol=1e-6)
        assert 0.0 < seg.prob <= 1.0
    assert sum(seg.prob for seg in found) <= 1.0 + 1e-6


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 8))
def test_filtered_nbest(seed, k):
    rng = random.Random(seed)
    B, L, K, C = rng.randint(1, 3), rng.randint(1, 7), rng.randint(1, 4), rng.randint(2, 4)
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, L + 1, (B,), generator=gen)
    mask = (torch.rand((B, L, K), generator=gen) < rng.uniform(0.1, 0.9)) & span_mask(lengths, L, K)
    index = mask.view(-1).nonzero().squeeze(1)
    labels = torch.randint(1, C, (index.numel(),), generator=gen)
    scores = torch.randn((index.numel(),), generator=gen, dtype=torch.float64)
    T = maybe_transitions(rng, gen, C + 1)
    nodes = filtered.NodeSet(index, labels, scores, (B, L, K))
    out = filtered_nbest(nodes, lengths, T, k)
    rows = nodes.spans()
    for b in range(B):
        mine = rows[:, 0] == b
        spans = [tuple(r) for r in rows[mine, 1:].tolist()]
        values = scores[mine].tolist()
        paths = []
        for subset in maximal_nonoverlapping_sets([(s, e) for s, e, _ in spans]):
            chosen = sorted(subset, key=lambda i: spans[i][0])
            score = sum(values[i] for i in chosen)
            if T is not None and chosen:
                labs = [C] + [spans[i][2] for i in chosen] + [C]
                score += sum(float(T[x, y]) for x, y in zip(labs, labs[1:]))
            paths.append((tuple(spans[i] for i in chosen), score))
        check_ranking(out[b], paths, k)


@settings(max_examples=250, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 8))
def test_semicrf_nbest(seed, k):
    rng = random.Random(seed)
    B, L, K, C = rng.randint(1, 2), rng.randint(1, 5), rng.randint(1, 3), rng.randint(2, 3)
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, L + 1, (B,), generator=gen)
    scores = torch.randn((B, L, K, C), generator=gen, dtype=torch.float64)
    T = maybe_transitions(rng, gen, C + 1)
    out = semicrf_nbest(scores, lengths, T, k)
    for b in range(B):
        enum = semicrf_enumerate(scores[b], int(lengths[b]), T)
        paths = [(tuple(s for s in segs if s[2] > 0), v) for segs, v in enum.paths]
        check_ranking(out[b], paths, k)


@settings(max_examples=250, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 8), st.sampled_from(["BIO", "BILUO"]))
def test_crf_nbest(seed, k, scheme_name):
    rng = random.Random(seed)
    M = rng.randint(1, 2)
    scheme = tag_scheme(M, scheme_name)
    B, L = rng.randint(1, 2), rng.randint(1, 4 if M == 2 else 5)
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, L + 1, (B,), generator=gen)
    emissions = torch.randn((B, L, scheme.n_tags), generator=gen, dtype=torch.float64)
    T = torch.randn((scheme.n_tags + 1, scheme.n_tags + 1), generator=gen, dtype=torch.float64)
    out = crf_nbest(emissions, T, lengths, scheme, k, scheme.allowed)
    for b in range(B):
        enum = crf_enumerate(emissions[b], T, int(lengths[b]), scheme.allowed)
        paths = [
            (tuple(entities_by_definition(tags, scheme.names, scheme.scheme)), v)
            for tags, v in enum.paths
        ]
        check_ranking(out[b], paths, k)


@pytest.mark.parametrize("k", [0, -1, 1.5, 2.0, True])
def test_k_that_is_no_integer_from_one_is_the_same_clear_error_for_every_head(k):
    """A float k raised a TypeError from a slice deep in the searches."""
    scheme = tag_scheme(2, "BIO")
    lengths = torch.tensor([3])
    message = f"^k must be an integer >= 1, got {k!r}$"
    with pytest.raises(ValueError, match=message):
        semicrf_nbest(torch.zeros(1, 3, 2, 3), lengths, None, k)
    with pytest.raises(ValueError, match=message):
        crf_nbest(torch.zeros(1, 3, scheme.n_tags), torch.zeros(scheme.n_tags + 1,
                  scheme.n_tags + 1), lengths, scheme, k)
    local = torch.zeros(1, 3, 2, 3)
    local[..., 1] = 1.0  # a node on every span: one graph to search
    nodes = filtered.inference_node_set(local, local, lengths)
    with pytest.raises(ValueError, match=message):
        filtered_nbest(nodes, lengths, None, k)
    assert len(semicrf_nbest(torch.zeros(1, 3, 2, 3), lengths, None, numpy.int64(2))[0]) == 2


def test_an_empty_batch_has_no_segmentations_for_every_head():
    """The semi-CRF's and the linear CRF's searches raised an IndexError on a batch of no
    documents, where the filtered head's returned an empty list."""
    scheme = tag_scheme(2, "BIO")
    lengths = torch.zeros((0,), dtype=torch.long)
    assert semicrf_nbest(torch.zeros(0, 3, 2, 3), lengths, None, 2) == []
    T = torch.zeros(scheme.n_tags + 1, scheme.n_tags + 1)
    assert crf_nbest(torch.zeros(0, 3, scheme.n_tags), T, lengths, scheme, 2) == []
    nodes = filtered.inference_node_set(torch.zeros(0, 3, 2, 3), torch.zeros(0, 3, 2, 3), lengths)
    assert filtered_nbest(nodes, lengths, None, 2) == []
    with pytest.raises(ValueError, match="^k must be an integer >= 1, got 0$"):
        filtered_nbest(nodes, lengths, None, 0)


def test_paths_of_score_minus_infinity_are_left_out_by_every_head():
    """The filtered head listed the paths through a node scored -inf (log_prob -inf), where
    the searches of the other heads leave such paths out. Every head lists only the paths that
    have a probability; where every path of a document is -inf, none (an empty list), while
    the other documents of the batch keep theirs."""
    inf = float("inf")
    lengths = torch.tensor([3, 3])
    # nodes 0..0, 0..1, 1..1, 2..2 in each document: two maximal paths, {0..0, 1..1, 2..2}
    # and {0..1, 2..2}
    index = torch.tensor([0, 1, 2, 4, 6, 7, 8, 10])
    scores = torch.tensor([0.5, -inf, 0.2, 0.1] + [-inf] * 4, dtype=torch.float64)
    nodes = filtered.NodeSet(index, torch.ones(8, dtype=torch.long), scores, (2, 3, 2))
    found = filtered_nbest(nodes, lengths, None, 4)
    assert [seg.spans for seg in found[0]] == [((0, 0, 1), (1, 1, 1), (2, 2, 1))]
    assert math.isclose(found[0][0].prob, 1.0)
    assert found[1] == []
    # the semi-CRF: of the 12 segmentations of 3 tokens into segments of width 1 or 2 (null
    # or entity, null one token wide), the 2 that open with the entity 0..1 are -inf
    segments = torch.zeros(2, 3, 2, 2, dtype=torch.float64)
    segments[0, 0, 1, 1] = -inf
    segments[1] = -inf
    found = semicrf_nbest(segments, lengths, None, 16)
    assert len(found[0]) == 10 and all(seg.prob > 0 for seg in found[0])
    assert ((0, 1, 1),) not in {seg.spans for seg in found[0]}
    assert found[1] == []
    # the linear CRF (BIO, one label): B at token 0 is -inf, so token 0 is O (I cannot open
    # an entity), then O or B, then O or B (after O) or O, B or I (after B): 5 sequences
    scheme = tag_scheme(1, "BIO")
    emissions = torch.zeros(2, 3, scheme.n_tags, dtype=torch.float64)
    emissions[0, 0, scheme.names.index("B-1")] = -inf
    emissions[1] = -inf
    T = torch.zeros(scheme.n_tags + 1, scheme.n_tags + 1, dtype=torch.float64)
    found = crf_nbest(emissions, T, lengths, scheme, 16, scheme.allowed)
    assert len(found[0]) == 5 and all(seg.prob > 0 for seg in found[0])
    assert all(seg.spans[0][0] > 0 for seg in found[0] if seg.spans)
    assert found[1] == []
