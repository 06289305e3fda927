"""The dynamic programs on scores far below zero. A masked entry (an impossible segment, tag,
transition or node, or the START state after the first token) must never outrank a real
path, however negative the real paths' running sums get: a long document's sums grow with its
length, and a model's scores have no fixed level. Against brute-force enumeration on small
problems whose scores lie around -30,000, and against exact shifts on long documents."""
import pytest
import torch

from spacy_fsemicrf.structured import filtered_log_partition, filtered_marginals, filtered_viterbi
from spacy_fsemicrf.structured.linear_crf import (
    crf_log_partition,
    crf_marginals,
    crf_viterbi,
    tag_scheme,
)
from spacy_fsemicrf.structured.semicrf import (
    semicrf_log_partition,
    semicrf_marginals,
    semicrf_viterbi,
)

from .bruteforce import crf_enumerate, filtered_enumerate, semicrf_enumerate

DTYPE = torch.float64
LOW = -3e4  # below any fixed mask value a scan could compare sums with, and far below zero


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("use_t", [False, True])
def test_semicrf_matches_brute_force_far_below_zero(seed, use_t):
    gen = torch.Generator().manual_seed(seed)
    B, L, K, C = 3, 5, 3, 3
    lengths = torch.tensor([5, 3, 1])
    scores = torch.randn((B, L, K, C), generator=gen, dtype=DTYPE) + LOW
    T = torch.randn((C + 1, C + 1), generator=gen, dtype=DTYPE) + LOW if use_t else None
    log_z = semicrf_log_partition(scores, lengths, T)
    spans, best = semicrf_viterbi(scores, lengths, T)
    marginals = semicrf_marginals(scores, lengths, T)
    for b in range(B):
        enum = semicrf_enumerate(scores[b], int(lengths[b]), T)
        assert log_z[b].item() == pytest.approx(enum.log_z, abs=1e-6)
        assert best[b].item() == pytest.approx(enum.best_score, abs=1e-6)
        mine = tuple((s, e, c) for d, s, e, c in spans.tolist() if d == b)
        assert any(tuple(seg for seg in path if seg[2] > 0) == mine for path in enum.best_paths)
        assert torch.allclose(marginals[b], enum.marginals, atol=1e-9)


@pytest.mark.parametrize("use_t", [False, True])
def test_a_long_semicrf_document_shifts_exactly_with_its_scores(use_t):
    """Adding ``c`` per token covered to every segment adds ``L c`` to every segmentation: log Z
    and the best score shift by ``L c``, the best segmentation and the marginals stay. With
    ``c = -20`` the sums pass -24,000."""
    gen = torch.Generator().manual_seed(0)
    L, K, C, c = 1200, 3, 3, -20.0
    lengths = torch.tensor([L])
    scores = torch.randn((1, L, K, C), generator=gen, dtype=DTYPE)
    shifted = scores + c * torch.arange(1, K + 1, dtype=DTYPE).view(1, 1, K, 1)
    T = torch.randn((C + 1, C + 1), generator=gen, dtype=DTYPE) if use_t else None
    assert semicrf_log_partition(shifted, lengths, T).item() == pytest.approx(
        semicrf_log_partition(scores, lengths, T).item() + L * c, abs=1e-6)
    spans, best = semicrf_viterbi(scores, lengths, T)
    spans_low, best_low = semicrf_viterbi(shifted, lengths, T)
    assert torch.equal(spans_low, spans)
    assert best_low.item() == pytest.approx(best.item() + L * c, abs=1e-6)
    assert torch.allclose(semicrf_marginals(shifted, lengths, T),
                          semicrf_marginals(scores, lengths, T), atol=1e-9)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("use_t", [False, True])
def test_filtered_graph_matches_brute_force_far_below_zero(seed, use_t):
    gen = torch.Generator().manual_seed(seed)
    B, L, K, C = 2, 7, 3, 3
    mask = torch.rand((B, L, K), generator=gen) < 0.5
    mask[:, :, 1:] &= torch.arange(L).view(1, L, 1) + torch.arange(1, K).view(1, 1, -1) < L
    scores = torch.randn((B, L, K), generator=gen, dtype=DTYPE) + LOW
    labels = torch.randint(1, C, (B, L, K), generator=gen) * mask
    T = torch.randn((C + 1, C + 1), generator=gen, dtype=DTYPE) if use_t else None
    log_z = filtered_log_partition(scores, mask, labels, T)
    chosen, best = filtered_viterbi(scores, mask, labels, T)
    marginals = filtered_marginals(scores, mask, labels, T)
    for b in range(B):
        grid = [tuple(x) for x in mask[b].nonzero().tolist()]
        nodes = [(i, i + w, int(labels[b, i, w]), float(scores[b, i, w])) for i, w in grid]
        enum = filtered_enumerate(nodes, T)
        assert log_z[b].item() == pytest.approx(enum.log_z, abs=1e-6)
        assert best[b].item() == pytest.approx(enum.best_score, abs=1e-6)
        assert tuple(k for k, (i, w) in enumerate(grid) if chosen[b, i, w]) in enum.best_paths
        got = [marginals[b, i, w].item() for i, w in grid]
        assert got == pytest.approx(enum.marginals.tolist(), abs=1e-9)


def test_a_long_chain_of_nodes_far_below_zero_is_one_path():
    """2,100 one-token nodes that overlap none: the only path holds them all, whatever their
    scores (-5 each, -10,500 in all), with transitions (one scan over the document)."""
    n = 2100
    mask = torch.ones((1, n, 1), dtype=torch.bool)
    labels = mask.long()
    scores = torch.full((1, n, 1), -5.0, dtype=DTYPE)
    T = torch.zeros((3, 3), dtype=DTYPE)
    assert filtered_log_partition(scores, mask, labels, T).item() == pytest.approx(-5.0 * n)
    chosen, best = filtered_viterbi(scores, mask, labels, T)
    assert bool(chosen.all()) and best.item() == pytest.approx(-5.0 * n)
    assert torch.allclose(filtered_marginals(scores, mask, labels, T),
                          torch.ones((1, n, 1), dtype=DTYPE))


@pytest.mark.parametrize("scheme", ["BIO", "BILUO"])
def test_crf_never_prefers_an_invalid_tag_sequence(scheme):
    """An invalid sequence with emissions 20,000 above the valid ones still has probability 0,
    and valid sequences with transitions at -20,000 still beat it."""
    ts = tag_scheme(2, scheme)
    n = ts.n_tags
    em = torch.zeros((1, 3, n), dtype=DTYPE)
    em[0, 0, ts.tag("I", 1)] = 2e4  # I-1 cannot open a sequence
    T = torch.full((n + 1, n + 1), -2e4, dtype=DTYPE)
    lengths = torch.tensor([3])
    enum = crf_enumerate(em[0], T, 3, ts.allowed)
    assert crf_log_partition(em, T, lengths, ts.allowed).item() == pytest.approx(
        enum.log_z, abs=1e-6)
    tags, best = crf_viterbi(em, T, lengths, ts.allowed)
    assert tuple(tags[0].tolist()) in enum.best_paths
    assert best.item() == pytest.approx(enum.best_score, abs=1e-6)
    marginals = crf_marginals(em, T, lengths, ts.allowed)
    assert torch.allclose(marginals[0], enum.marginals, atol=1e-9)
    assert marginals[0, 0, ts.tag("I", 1)].item() == 0.0
