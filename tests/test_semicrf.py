"""The exact semi-CRF against brute-force enumeration of every segmentation."""

import math
import random
import re

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from spacy_fsemicrf.structured.semicrf import (
    segment_mask,
    semicrf_gold_score,
    semicrf_log_partition,
    semicrf_marginals,
    semicrf_viterbi,
)
from spacy_fsemicrf.structured.semiring import NEG

from .bruteforce import (
    graph_paths,
    liang_edges,
    maximal_nonoverlapping_sets,
    segmentation_score,
    segmentations,
    semicrf_enumerate,
)

DTYPE = torch.float64


def random_problem(seed: int, batch: int, length: int, max_width: int, n_classes: int):
    """Random scores (impossible segments included: the functions must ignore them),
    lengths in 0..length, and transitions."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    if batch > 1:  # one document fills the padded length (the realistic case)
        lengths[-1] = length
    scores = torch.randn((batch, length, max_width, n_classes), generator=gen, dtype=DTYPE)
    # Large junk on the impossible entries: a missing mask would show.
    junk = ~segment_mask(lengths, length, max_width, n_classes)
    scores = torch.where(
        junk, 50 + 10 * torch.rand(scores.shape, generator=gen, dtype=DTYPE), scores
    )
    transitions = torch.randn((n_classes + 1, n_classes + 1), generator=gen, dtype=DTYPE)
    return lengths, scores, transitions


problems = st.tuples(
    st.integers(0, 100_000),  # seed
    st.integers(1, 3),  # batch
    st.integers(0, 6),  # padded length
    st.integers(1, 4),  # max width
    st.integers(1, 4),  # classes incl. null
    st.booleans(),  # transitions
).filter(
    lambda p: p[2] < 6 or p[4] <= 3
)  # keep the enumeration small


def typical_problems(n: int, base: int = 0):
    """``n`` seeded problems of typical size (hypothesis favours degenerate ones): 3 documents,
    padded length 4..6, width 2..4, 2..4 classes, with and without transitions."""
    rng = random.Random(base)
    out = []
    for k in range(n):
        L = rng.randint(4, 6)
        C = rng.randint(2, 4 if L < 6 else 3)
        out.append((rng.randrange(100_000), 3, L, rng.randint(2, 4), C, k % 2 == 0))
    return out


def cases(n: int, base: int = 0, with_pick: bool = False):
    """Add ``n`` typical problems as explicit hypothesis examples (run before the random
    ones); ``with_pick`` adds a second, integer argument."""

    def decorate(test):
        for problem in typical_problems(n, base):
            test = example(problem, problem[0])(test) if with_pick else example(problem)(test)
        return test

    return decorate


def entity_rows(b: int, segs):
    return [(b, s, e, c) for s, e, c in segs if c > 0]


@settings(max_examples=40, deadline=None)
@given(problems)
@cases(20, base=1)
def test_log_z_viterbi_and_marginals_match_brute_force(problem):
    seed, B, L, K, C, use_t = problem
    lengths, scores, T = random_problem(seed, B, L, K, C)
    T = T if use_t else None
    log_z = semicrf_log_partition(scores, lengths, T)
    spans, best = semicrf_viterbi(scores, lengths, T)
    marginals = semicrf_marginals(scores, lengths, T)
    assert log_z.shape == best.shape == (B,)
    assert marginals.shape == scores.shape
    for b in range(B):
        enum = semicrf_enumerate(scores[b], int(lengths[b]), T)
        assert log_z[b].item() == pytest.approx(enum.log_z, abs=1e-9)
        assert best[b].item() == pytest.approx(enum.best_score, abs=1e-9)
        mine = [tuple(r) for r in spans[spans[:, 0] == b].tolist()]
        # The decoded entities belong to an optimal segmentation (unique unless tied).
        optimal = {tuple(entity_rows(b, p)) for p in enum.best_paths}
        assert tuple(mine) in optimal
        assert torch.allclose(marginals[b], enum.marginals, atol=1e-9)
    # Impossible segments have probability 0; every token is covered exactly once.
    assert not marginals[~segment_mask(lengths, L, K, C)].any()
    for b in range(B):
        cover = torch.zeros(L, dtype=DTYPE)
        for i in range(L):
            for w in range(K):
                if i + w < L:
                    cover[i : i + w + 1] += marginals[b, i, w].sum()
        expected = (torch.arange(L) < lengths[b]).to(DTYPE)
        assert torch.allclose(cover, expected, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(problems)
@cases(10, base=2)
def test_gradient_of_log_z_is_the_marginals(problem):
    seed, B, L, K, C, use_t = problem
    lengths, scores, T = random_problem(seed, B, L, K, C)
    scores = scores.clone().requires_grad_(True)
    T = T.clone().requires_grad_(True) if use_t else None
    log_z = semicrf_log_partition(scores, lengths, T)
    grads = torch.autograd.grad(log_z.sum(), [scores] + ([T] if use_t else []))
    with torch.no_grad():  # marginals must work under no_grad too
        marginals = semicrf_marginals(scores, lengths, T)
    assert not marginals.requires_grad
    assert torch.allclose(grads[0], marginals, atol=1e-10)
    if use_t:
        # d log Z / d T[p, q] = expected number of p -> q transitions.
        assert torch.isfinite(grads[1]).all()
        n_nonempty = int((lengths > 0).sum())
        assert grads[1][C, :C].sum().item() == pytest.approx(n_nonempty, abs=1e-9)
        assert grads[1][:C, C].sum().item() == pytest.approx(n_nonempty, abs=1e-9)
        assert grads[1][C, C].item() == 0.0


@settings(max_examples=40, deadline=None)
@given(problems, st.integers(0, 100_000))
@cases(30, base=3, with_pick=True)
def test_gold_score_is_the_enumerated_path_score(problem, pick):
    seed, B, L, K, C, use_t = problem
    lengths, scores, T = random_problem(seed, B, L, K, C)
    T = T if use_t else None
    rng = random.Random(pick)
    rows, expected = [], []
    for b in range(B):
        segs = rng.choice(segmentations(int(lengths[b]), K, C))
        rows += entity_rows(b, segs)
        expected.append(segmentation_score(scores[b], segs, T))
    gold = torch.tensor(rows, dtype=torch.long).view(-1, 4)
    # Row order must not matter.
    gold = gold[torch.randperm(gold.shape[0], generator=torch.Generator().manual_seed(pick))]
    got = semicrf_gold_score(scores, lengths, gold, T)
    assert torch.allclose(got, torch.tensor(expected, dtype=DTYPE), atol=1e-9)
    assert (semicrf_log_partition(scores, lengths, T) - got >= -1e-9).all()


@settings(max_examples=30, deadline=None)
@given(problems)
@cases(15, base=4)
def test_batched_equals_one_document_at_a_time(problem):
    seed, B, L, K, C, use_t = problem
    lengths, scores, T = random_problem(seed, B, L, K, C)
    T = T if use_t else None
    log_z = semicrf_log_partition(scores, lengths, T)
    spans, best = semicrf_viterbi(scores, lengths, T)
    marginals = semicrf_marginals(scores, lengths, T)
    for b in range(B):
        n = int(lengths[b])
        one = scores[b : b + 1, :n]  # unpadded
        alone = torch.tensor([n])
        assert semicrf_log_partition(one, alone, T).item() == pytest.approx(
            log_z[b].item(), abs=1e-10
        )
        spans_1, best_1 = semicrf_viterbi(one, alone, T)
        assert best_1.item() == pytest.approx(best[b].item(), abs=1e-10)
        mine = spans[spans[:, 0] == b]
        if spans_1.shape[0] == mine.shape[0]:
            assert torch.equal(spans_1[:, 1:], mine[:, 1:])
        else:  # only possible with a tie
            gold_1 = semicrf_gold_score(one, alone, spans_1 * torch.tensor([0, 1, 1, 1]), T)
            assert gold_1.item() == pytest.approx(best[b].item(), abs=1e-10)
        assert torch.allclose(semicrf_marginals(one, alone, T)[0], marginals[b, :n], atol=1e-10)
        assert not marginals[b, n:].any()


@settings(max_examples=30, deadline=None)
@given(problems)
@cases(20, base=5)
def test_viterbi_output_format_and_gold_score_of_decoded_path(problem):
    seed, B, L, K, C, use_t = problem
    lengths, scores, T = random_problem(seed, B, L, K, C)
    T = T if use_t else None
    spans, best = semicrf_viterbi(scores, lengths, T)
    assert spans.dtype == torch.long and spans.shape[1] == 4
    doc, start, end, label = spans.unbind(1)
    assert ((label >= 1) & (label < C)).all()
    assert ((start >= 0) & (end >= start) & (end - start < K) & (end < lengths[doc])).all()
    key = (doc * (L + 1) + start).tolist()
    assert key == sorted(key)
    # The decoded entities, with nulls elsewhere, are a segmentation scoring exactly `best`.
    assert torch.allclose(semicrf_gold_score(scores, lengths, spans, T), best, atol=1e-10)


def test_segment_mask_is_its_definition():
    # inside the document, and a null segment one token wide; the random problems above are
    # built with this mask, so it is checked against the definition itself
    lengths = torch.tensor([5, 2, 0, 4])
    L, K, C = 5, 3, 4
    mask = segment_mask(lengths, L, K, C)
    assert mask.shape == (4, L, K, C) and mask.dtype == torch.bool
    for b, n in enumerate(lengths.tolist()):
        for i in range(L):
            for w in range(K):
                for c in range(C):
                    assert bool(mask[b, i, w, c]) == (i + w < n and (c > 0 or w == 0))


def test_zero_transitions_equal_no_transitions():
    lengths, scores, _ = random_problem(7, 3, 6, 3, 4)
    zeros = torch.zeros((5, 5), dtype=DTYPE)
    assert torch.allclose(
        semicrf_log_partition(scores, lengths, zeros), semicrf_log_partition(scores, lengths)
    )
    assert torch.allclose(
        semicrf_marginals(scores, lengths, zeros), semicrf_marginals(scores, lengths)
    )
    s0, b0 = semicrf_viterbi(scores, lengths, zeros)
    s1, b1 = semicrf_viterbi(scores, lengths)
    assert torch.allclose(b0, b1) and torch.equal(s0, s1)


def test_single_class_and_width_one_is_a_single_path():
    # Only null segments: exactly one segmentation, probability 1 for every token.
    lengths = torch.tensor([4, 2, 0])
    scores = torch.randn((3, 4, 1, 1), dtype=DTYPE)
    log_z = semicrf_log_partition(scores, lengths)
    expected = torch.stack([scores[b, : int(n), 0, 0].sum() for b, n in enumerate(lengths)])
    assert torch.allclose(log_z, expected)
    spans, best = semicrf_viterbi(scores, lengths)
    assert spans.shape == (0, 4) and torch.allclose(best, expected)
    m = semicrf_marginals(scores, lengths)
    assert torch.equal(m[..., 0, 0], (torch.arange(4) < lengths.view(-1, 1)).to(DTYPE))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("use_t", [False, True])
def test_no_nan_for_empty_and_single_token_documents(dtype, use_t):
    B, L, K, C = 4, 5, 3, 3
    lengths = torch.tensor([0, 1, 5, 0])
    scores = torch.randn((B, L, K, C), dtype=dtype, requires_grad=True)
    T = torch.randn((C + 1, C + 1), dtype=dtype, requires_grad=True) if use_t else None
    log_z = semicrf_log_partition(scores, lengths, T)
    assert torch.isfinite(log_z).all()
    assert log_z[0] == 0 and log_z[3] == 0  # the empty segmentation scores 0, no transition
    params = [scores] + ([T] if use_t else [])
    for g in torch.autograd.grad(log_z.sum(), params):
        assert torch.isfinite(g).all()
    gold = torch.tensor([[1, 0, 0, 2], [2, 1, 3, 1]])
    log_z = semicrf_log_partition(scores, lengths, T)
    loss = (log_z - semicrf_gold_score(scores, lengths, gold, T)).sum()
    assert torch.isfinite(loss) and loss.item() >= -1e-4
    for g in torch.autograd.grad(loss, params):
        assert torch.isfinite(g).all()
    spans, best = semicrf_viterbi(scores, lengths, T)
    assert torch.isfinite(best).all() and best[0] == 0 and best[3] == 0
    assert set(spans[:, 0].tolist()) <= {1, 2}
    m = semicrf_marginals(scores, lengths, T)
    assert torch.isfinite(m).all() and not m[[0, 3]].any()
    # Single token: the probabilities of its width-1 segments sum to 1.
    assert m[1, 0, 0].sum().item() == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("use_t", [False, True])
def test_a_segment_scored_minus_infinity_is_in_no_segmentation(seed, use_t):
    """Against enumeration, where such a segment's segmentations weigh exp(-inf) = 0: log Z,
    the best score and the marginals (0 for that segment), and a gradient without NaN. With
    transitions, a label none of whose segments could end on a token made log Z NaN."""
    gen = torch.Generator().manual_seed(seed)
    B, L, K, C = 2, 5, 3, 3
    lengths = torch.tensor([5, 3])
    scores = torch.randn((B, L, K, C), generator=gen, dtype=DTYPE)
    forbid = torch.rand(scores.shape, generator=gen) < 0.2
    forbid[:, 0, 0, 2] = True  # label 2 cannot end on the first token
    forbid[:, :, 0, 0] = False  # (the one-token nulls keep every document a segmentation)
    scores[forbid] = -math.inf
    T = torch.randn((C + 1, C + 1), generator=gen, dtype=DTYPE) if use_t else None
    x = scores.clone().requires_grad_()
    log_z = semicrf_log_partition(x, lengths, T)
    (grad,) = torch.autograd.grad(log_z.sum(), x)
    _, best = semicrf_viterbi(scores, lengths, T)
    marginals = semicrf_marginals(scores, lengths, T)
    for b in range(B):
        enum = semicrf_enumerate(scores[b], int(lengths[b]), T)
        assert log_z[b].item() == pytest.approx(enum.log_z, abs=1e-9)
        assert best[b].item() == pytest.approx(enum.best_score, abs=1e-9)
        assert torch.allclose(marginals[b], enum.marginals, atol=1e-9)
    assert torch.allclose(grad, marginals, atol=1e-9) and not marginals[forbid].any()


@settings(max_examples=40, deadline=None)
@given(problems, st.floats(0.1, 0.9))
def test_transitions_of_minus_infinity_forbid_segmentations_without_nan(problem, forbidden):
    """A label that only transitions of -inf enter (a column of -inf, END's included) made
    log Z NaN, and the marginals (its gradient) with it, even where a segmentation of finite
    score remained. Against enumeration: log Z, best score and marginals of the
    segmentations left, and no distribution where none is left."""
    seed, B, L, K, C, _ = problem
    lengths, scores, T = random_problem(seed, B, L, K, C)
    gen = torch.Generator().manual_seed(seed)
    T = T.masked_fill(torch.rand(T.shape, generator=gen) < forbidden, -math.inf)
    x = scores.clone().requires_grad_()
    log_z = semicrf_log_partition(x, lengths, T)
    (grad,) = torch.autograd.grad(log_z.sum(), x)
    _, best = semicrf_viterbi(scores, lengths, T)
    marginals = semicrf_marginals(scores, lengths, T)
    assert grad.isfinite().all()
    for b in range(B):
        enum = semicrf_enumerate(scores[b], int(lengths[b]), T)
        if enum.best_score == -math.inf:
            assert log_z[b].item() <= NEG / 2 and best[b].item() == -math.inf
            assert not marginals[b].any()
            continue
        assert log_z[b].item() == pytest.approx(enum.log_z, abs=1e-9)
        assert best[b].item() == pytest.approx(enum.best_score, abs=1e-9)
        assert torch.allclose(marginals[b], enum.marginals, atol=1e-9)
        assert torch.allclose(grad[b], enum.marginals, atol=1e-9)


@pytest.mark.parametrize("use_t", [False, True])
@pytest.mark.parametrize("how", ["every segment", "one token", "a transition"])
def test_a_document_whose_every_segmentation_is_minus_infinity_has_none(use_t, how):
    """Where every segmentation of a document scores -inf there is no distribution: Viterbi
    returned entities all the same (here, with every segment over token 1 at -inf, the
    entities of a segmentation through it), scored NEG, and the marginals summed to anything
    (1.9 over a document). Now no entity, a best score of -inf and marginals 0, as the
    filtered semi-CRF's; log Z stays finite at or below NEG / 2, and the other document is
    as enumeration gives it."""
    gen = torch.Generator().manual_seed(3)
    B, L, K, C = 2, 4, 2, 3
    lengths = torch.tensor([4, 3])
    scores = torch.randn((B, L, K, C), generator=gen, dtype=DTYPE)
    T = torch.randn((C + 1, C + 1), generator=gen, dtype=DTYPE) if use_t else None
    if how == "every segment":
        scores[0] = -math.inf
    elif how == "one token":
        scores[0, 1] = -math.inf
        scores[0, 0, 1] = -math.inf
    elif use_t:
        T[C, :] = -math.inf  # no segmentation may start: in either document
    else:
        scores[0, 2] = -math.inf
        scores[0, 1, 1] = -math.inf
    spans, best = semicrf_viterbi(scores, lengths, T)
    marginals = semicrf_marginals(scores, lengths, T)
    log_z = semicrf_log_partition(scores, lengths, T)
    assert best[0].item() == -math.inf and not (spans[:, 0] == 0).any()
    assert not marginals[0].any() and -math.inf < log_z[0].item() <= NEG / 2
    enum = semicrf_enumerate(scores[1], 3, T)
    if enum.best_score == -math.inf:  # (the transitions from START forbid both documents)
        assert best[1].item() == -math.inf and not marginals[1].any()
        return
    assert best[1].item() == pytest.approx(enum.best_score, abs=1e-9)
    mine = tuple(tuple(r[1:]) for r in spans.tolist() if r[0] == 1)
    assert any(tuple(seg for seg in path if seg[2] > 0) == mine for path in enum.best_paths)
    assert torch.allclose(marginals[1], enum.marginals, atol=1e-9)


def test_empty_batch_and_zero_length_batch():
    for shape in [(0, 4, 2, 3), (2, 0, 2, 3)]:
        scores = torch.randn(shape)
        lengths = torch.zeros(shape[0], dtype=torch.long)
        T = torch.randn(4, 4)
        for t in (None, T):
            assert torch.equal(semicrf_log_partition(scores, lengths, t), torch.zeros(shape[0]))
            spans, best = semicrf_viterbi(scores, lengths, t)
            assert spans.shape == (0, 4) and torch.equal(best, torch.zeros(shape[0]))
            assert semicrf_marginals(scores, lengths, t).shape == shape
            gold = torch.zeros((0, 4), dtype=torch.long)
            assert torch.equal(semicrf_gold_score(scores, lengths, gold, t), torch.zeros(shape[0]))
        # log Z and the gold score stay connected to both inputs: backward gives zero gradients
        for f in (semicrf_log_partition, lambda s, n, t: semicrf_gold_score(s, n, gold, t)):
            s, t = scores.clone().requires_grad_(), T.clone().requires_grad_()
            f(s, lengths, t).sum().backward()
            assert torch.equal(s.grad, torch.zeros(shape))
            assert torch.equal(t.grad, torch.zeros(4, 4))


def test_gold_wider_than_max_width_is_rejected():
    scores = torch.randn((1, 5, 2, 3))
    with pytest.raises(ValueError, match=r"^gold span of width 3 exceeds max_width=2$"):
        semicrf_gold_score(scores, torch.tensor([5]), torch.tensor([[0, 0, 2, 1]]))


SEMICRF_FUNCTIONS = {
    "log_partition": semicrf_log_partition,
    "viterbi": semicrf_viterbi,
    "marginals": semicrf_marginals,
    "gold_score": lambda s, n, t: semicrf_gold_score(s, n, torch.tensor([[0, 0, 1, 1]]), t),
}


def bad_lengths(what: str):
    """Parametrizes ``lengths, message``: lengths that do not fit a batch of 2 documents of 3
    token rows of ``what`` (the tensor they describe), and the error that names them."""
    return pytest.mark.parametrize("lengths, message", [
        ([3], rf"^lengths must be \[B\], one per document of {what} \(2\), got \(1,\)$"),
        ([5, 3], rf"^lengths must lie between 0 and the 3 token rows of {what}, got 5$"),
        ([3, -1], rf"^lengths must lie between 0 and the 3 token rows of {what}, got -1$"),
        ([3.0, 2.0], r"^lengths must be an integer tensor, got torch.float32$"),
    ], ids=["fewer-than-documents", "past-the-rows", "negative", "float"])


@pytest.mark.parametrize("name", SEMICRF_FUNCTIONS)
@bad_lengths("the scores")
def test_lengths_that_do_not_fit_the_scores_are_a_clear_error(name, lengths, message):
    """One length for two documents gave log Z of one document, a length past the rows an
    index error that did not name the lengths."""
    scores = torch.randn((2, 3, 2, 2), dtype=DTYPE)
    for t in (None, torch.zeros((3, 3), dtype=DTYPE)):
        with pytest.raises(ValueError, match=message):
            SEMICRF_FUNCTIONS[name](scores, torch.tensor(lengths), t)


@pytest.mark.parametrize("name", SEMICRF_FUNCTIONS)
@pytest.mark.parametrize("shape", [(4, 4), (2, 2), (3, 2), (3,)])
def test_transitions_of_another_shape_are_a_clear_error(name, shape):
    """Transitions for another number of labels failed deep inside the scan (a size mismatch
    or an index out of bounds)."""
    scores = torch.randn((2, 3, 2, 2), dtype=DTYPE)
    message = (r"^transitions must be \[3, 3\] for the 2 labels of the scores \(the last row "
               rf"from START, the last column to END\), got {re.escape(str(shape))}$")
    with pytest.raises(ValueError, match=message):
        SEMICRF_FUNCTIONS[name](scores, torch.tensor([3, 2]), torch.zeros(shape, dtype=DTYPE))


@pytest.mark.parametrize("name", SEMICRF_FUNCTIONS)
@pytest.mark.parametrize("shape", [(2, 3, 2), (2, 3, 0, 2), (2, 3, 2, 0)])
def test_scores_of_another_shape_are_a_clear_error(name, shape):
    """Scores without widths or labels failed on an empty stack or an index out of bounds."""
    message = (r"^scores must be a tensor \[B, L, K, C\], K >= 1 widths and C >= 1 labels "
               rf"\(null included\), got Tensor {re.escape(str(shape))}$")
    with pytest.raises(ValueError, match=message):
        SEMICRF_FUNCTIONS[name](torch.randn(shape, dtype=DTYPE), torch.tensor([3, 2]), None)


def test_long_document_float32_is_stable():
    # Long padded batch in float32: log Z matches float64, marginals stay probabilities.
    gen = torch.Generator().manual_seed(3)
    B, L, K, C = 3, 300, 6, 5
    lengths = torch.tensor([300, 17, 0])
    scores = torch.randn((B, L, K, C), generator=gen, dtype=DTYPE) * 3
    T = torch.randn((C + 1, C + 1), generator=gen, dtype=DTYPE)
    ref = semicrf_log_partition(scores, lengths, T)
    got = semicrf_log_partition(scores.float(), lengths, T.float())
    assert torch.allclose(got.double(), ref, rtol=1e-5, atol=1e-3)
    m = semicrf_marginals(scores.float(), lengths, T.float())
    assert torch.isfinite(m).all() and m.min() >= 0 and m.max() <= 1 + 1e-4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    lengths, scores, T = random_problem(11, 4, 6, 3, 4)
    for t in (None, T):
        cpu = (
            semicrf_log_partition(scores, lengths, t),
            semicrf_viterbi(scores, lengths, t),
            semicrf_marginals(scores, lengths, t),
        )
        tc = None if t is None else t.cuda()
        log_z = semicrf_log_partition(scores.cuda(), lengths.cuda(), tc)
        spans, best = semicrf_viterbi(scores.cuda(), lengths.cuda(), tc)
        m = semicrf_marginals(scores.cuda(), lengths.cuda(), tc)
        assert log_z.device.type == "cuda" and spans.device.type == "cuda"
        assert torch.allclose(log_z.cpu(), cpu[0])
        assert torch.equal(spans.cpu(), cpu[1][0]) and torch.allclose(best.cpu(), cpu[1][1])
        assert torch.allclose(m.cpu(), cpu[2])


# ------------------------------------------------------------------------ brute-force self-checks


def test_segmentation_counts():
    # f(n) = f(n-1) * C + sum_{w=2..K} f(n-w) * (C - 1)
    for K in range(1, 4):
        for C in range(1, 4):
            f = [1]
            for n in range(1, 7):
                f.append(
                    f[n - 1] * C + sum(f[n - w] * (C - 1) for w in range(2, K + 1) if n - w >= 0)
                )
                segs = segmentations(n, K, C)
                assert len(segs) == f[n] == len(set(segs))
                for seg in segs:  # each covers 0..n-1 exactly once, nulls one wide
                    assert [t for s, e, _ in seg for t in range(s, e + 1)] == list(range(n))
                    assert all(e - s < K and (c > 0 or s == e) for s, e, c in seg)


def _subsets_reference(nodes):
    def overlap(a, b):
        return a[0] <= b[1] and b[0] <= a[1]

    out = []
    n = len(nodes)
    for mask in range(1 << n):
        chosen = [k for k in range(n) if mask >> k & 1]
        if any(overlap(nodes[a], nodes[b]) for a in chosen for b in chosen if a < b):
            continue
        if all(
            any(overlap(nodes[k], nodes[c]) for c in chosen) for k in range(n) if k not in chosen
        ):
            out.append(chosen)
    return sorted(out)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 3)), max_size=10, unique=True))
def test_maximal_sets_and_liang_graph_paths_agree(raw):
    nodes = [(s, s + w) for s, w in raw]
    sets = sorted(maximal_nonoverlapping_sets(nodes))
    assert sets == _subsets_reference(nodes)
    # Liang et al.: the START-to-END paths are exactly the maximal non-overlapping sets.
    assert sorted(graph_paths(liang_edges(nodes))) == sets


def test_liang_edges_small_example():
    nodes = [(0, 1), (1, 2), (3, 3), (2, 4)]
    edges = set(liang_edges(nodes))
    assert edges == {
        (0, 2),
        (0, 3),
        (1, 2),
        ("START", 0),
        ("START", 1),
        (2, "END"),
        (3, "END"),
    }
    assert liang_edges([]) == [("START", "END")]
    assert maximal_nonoverlapping_sets([]) == [[]]
