"""The linear-chain CRF and the BIO / BILUO tag schemes against brute-force enumeration."""

import math
import random
import re

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from spacy_fsemicrf.structured import linear_crf
from spacy_fsemicrf.structured.nbest import crf_nbest
from spacy_fsemicrf.structured.linear_crf import (
    crf_best_sequence_prob,
    crf_log_partition,
    crf_marginals,
    crf_score,
    crf_span_marginals,
    crf_viterbi,
    spans_to_tags,
    tag_scheme,
    tags_to_spans,
)
from spacy_fsemicrf.structured.semiring import NEG

from .bruteforce import (
    crf_enumerate,
    crf_span_probabilities,
    entities_by_definition,
    tag_sequence_score,
    tag_sequences,
)
from .test_semicrf import bad_lengths

DTYPE = torch.float64


def random_problem(seed: int, batch: int, length: int, n_labels: int, scheme: str):
    gen = torch.Generator().manual_seed(seed)
    ts = tag_scheme(n_labels, scheme)
    n = ts.n_tags
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    if batch > 1:  # one document fills the padded length (the realistic case)
        lengths[-1] = length
    emissions = torch.randn((batch, length, n), generator=gen, dtype=DTYPE)
    # Junk on the padding: a missing mask would show.
    pad = torch.arange(length).view(1, -1, 1) >= lengths.view(-1, 1, 1)
    emissions = torch.where(
        pad, 40 + torch.rand(emissions.shape, generator=gen, dtype=DTYPE), emissions
    )
    transitions = torch.randn((n + 1, n + 1), generator=gen, dtype=DTYPE)
    return ts, lengths, emissions, transitions


def max_length(scheme: str, n_labels: int, masked: bool) -> int:
    """Keep the enumeration small: n_tags ** L sequences without the mask."""
    n = tag_scheme(n_labels, scheme).n_tags
    return 6 if masked or n <= 5 else 4


@st.composite
def problems(draw):
    scheme = draw(st.sampled_from(["BIO", "BILUO"]))
    n_labels = draw(st.integers(1, 2))
    masked = draw(st.booleans())
    length = draw(st.integers(0, max_length(scheme, n_labels, masked)))
    return draw(st.integers(0, 100_000)), draw(st.integers(1, 3)), length, n_labels, scheme, masked


def typical_problems(n: int, base: int):
    """Seeded problems of typical size (hypothesis favours degenerate ones)."""
    rng = random.Random(base)
    out = []
    for k in range(n):
        scheme = ("BIO", "BILUO")[k % 2]
        n_labels = rng.randint(1, 2)
        masked = (k // 2) % 2 == 0
        length = rng.randint(3, max_length(scheme, n_labels, masked))
        out.append((rng.randrange(100_000), 3, length, n_labels, scheme, masked))
    return out


def cases(n: int, base: int, with_pick: bool = False):
    """Add ``n`` typical problems as explicit hypothesis examples (``with_pick``: plus an int)."""

    def decorate(test):
        for problem in typical_problems(n, base):
            test = example(problem, problem[0])(test) if with_pick else example(problem)(test)
        return test

    return decorate


def all_spans(lengths, n_labels):
    rows = [
        (b, s, e, l)
        for b, n in enumerate(lengths.tolist())
        for s in range(n)
        for e in range(s, n)
        for l in range(1, n_labels + 1)
    ]
    return torch.tensor(rows, dtype=torch.long).view(-1, 4)


# ----------------------------------------------------------------------------- tag schemes


def test_bio_scheme():
    ts = tag_scheme(2, "BIO")
    assert ts.n_tags == 5
    assert ts.names == ("O", "B-1", "I-1", "B-2", "I-2")
    assert ts.labels.tolist() == [0, 1, 1, 2, 2]
    assert ts.tag("B", 2) == 3 and ts.tag("I", 1) == 2
    A, S, E = ts.allowed, 5, 5
    assert A.shape == (6, 6) and A.dtype == torch.bool
    assert not A[S, 2] and not A[S, 4] and A[S, 0] and A[S, 1] and A[S, 3]
    assert A[1, 2] and A[2, 2] and not A[3, 2] and not A[4, 2] and not A[0, 2]
    assert A[3, 4] and A[4, 4] and not A[1, 4] and not A[2, 4]
    assert A[:5, E].all()  # any tag may end a BIO sequence
    assert A[:5, [0, 1, 3]].all()  # O and B-x may follow anything
    with pytest.raises(ValueError, match="^BIO has no 'U' tags$"):
        ts.tag("U", 1)


def test_biluo_scheme():
    ts = tag_scheme(2, "biluo")
    assert ts.scheme == "BILUO" and ts.n_tags == 9
    assert ts.names == ("O", "B-1", "I-1", "L-1", "U-1", "B-2", "I-2", "L-2", "U-2")
    O, B1, I1, L1, U1, B2, I2, L2, U2 = range(9)
    S = E = 9
    A = ts.allowed
    outside = [O, L1, U1, L2, U2, S]
    for p in outside:
        assert A[p, [O, B1, U1, B2, U2]].all() and not A[p, [I1, L1, I2, L2]].any()
        if p != S:
            assert A[p, E]
    for p, ok in [(B1, [I1, L1]), (I1, [I1, L1]), (B2, [I2, L2]), (I2, [I2, L2])]:
        row = [q for q in range(10) if A[p, q]]
        assert row == ok  # inside an entity: continue or close it, never END
    assert ts.tag("U", 2) == U2 and ts.tag("L", 1) == L1
    with pytest.raises(ValueError):
        ts.tag("X", 1)


def test_unknown_scheme_raises():
    with pytest.raises(ValueError, match="scheme must be one of"):
        tag_scheme(3, "IOBES")
    with pytest.raises(ValueError, match="n_labels must be >= 0, got -1"):
        tag_scheme(-1)


@pytest.mark.parametrize("scheme", ["BIO", "bio", "BILUO"])
def test_a_scheme_without_labels_has_only_the_outside_tag(scheme):
    """No entity type: one tag, O, which may follow START, itself, and precede END."""
    ts = tag_scheme(0, scheme)
    assert ts.scheme == scheme.upper() and ts.n_tags == 1 and ts.names == ("O",)
    assert ts.allowed.tolist() == [[True, True], [True, True]]
    assert tag_scheme(0).scheme == "BIO"  # the default scheme


@pytest.mark.parametrize("scheme", ["BIO", "BILUO"])
def test_spans_to_tags_example(scheme):
    ts = tag_scheme(3, scheme)
    gold = torch.tensor([[0, 0, 2, 1], [0, 4, 4, 3], [2, 1, 2, 2]])
    lengths = torch.tensor([6, 0, 3])
    tags = spans_to_tags(gold, lengths, 6, ts)
    names = [[ts.names[t] for t in row[: int(n)]] for row, n in zip(tags.tolist(), lengths)]
    if scheme == "BIO":
        assert names[0] == ["B-1", "I-1", "I-1", "O", "B-3", "O"]
        assert names[2] == ["O", "B-2", "I-2"]
    else:
        assert names[0] == ["B-1", "I-1", "L-1", "O", "U-3", "O"]
        assert names[2] == ["O", "B-2", "L-2"]
    assert not tags[1].any() and not tags[2, 3:].any()
    assert torch.equal(tags_to_spans(tags, lengths, ts), gold)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["BIO", "BILUO"]),
    st.integers(1, 4),
    st.lists(
        st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4), st.booleans()), max_size=6),
        min_size=1,
        max_size=4,
    ),
)
def test_tags_spans_roundtrip(scheme, n_labels, docs):
    # Each doc: a list of (gap, width, is_entity) pieces laid left to right; entities of any
    # width, adjacent entities included (a B right after an entity must start a new one).
    ts = tag_scheme(n_labels, scheme)
    rng = random.Random(len(docs))
    rows, lengths = [], []
    for b, pieces in enumerate(docs):
        pos = 0
        for gap, width, ent in pieces:
            pos += gap
            if ent:
                rows.append((b, pos, pos + width - 1, rng.randint(1, n_labels)))
            pos += width
        lengths.append(pos + rng.randint(0, 2))
    gold = torch.tensor(rows, dtype=torch.long).view(-1, 4)
    lengths = torch.tensor(lengths)
    L = int(lengths.max()) + 1
    tags = spans_to_tags(gold, lengths, L, ts)
    assert torch.equal(tags_to_spans(tags, lengths, ts), gold)
    # The tags are a valid sequence, and read back by the definition give the same entities.
    for b in range(len(docs)):
        seq = tags[b, : int(lengths[b])].tolist()
        path = [ts.n_tags] + seq + [ts.n_tags]
        assert all(ts.allowed[p, q] for p, q in zip(path, path[1:]))
        assert entities_by_definition(seq, ts.names, scheme) == [
            tuple(r[1:]) for r in rows if r[0] == b
        ]


def test_tags_to_spans_is_lenient_on_invalid_sequences():
    ts = tag_scheme(2, "BIO")
    O, B1, I1, B2, I2 = range(5)
    tags = torch.tensor([[I1, I1, B1, I2, O, B1, B1]])
    spans = tags_to_spans(tags, torch.tensor([7]), ts)
    assert spans.tolist() == [[0, 0, 1, 1], [0, 2, 2, 1], [0, 3, 3, 2], [0, 5, 5, 1], [0, 6, 6, 1]]
    ts = tag_scheme(1, "BILUO")
    O, B, I, L, U = range(5)
    tags = torch.tensor([[B, U, I, L, L, B, I]])
    spans = tags_to_spans(tags, torch.tensor([7]), ts)
    assert spans.tolist() == [[0, 0, 0, 1], [0, 1, 1, 1], [0, 2, 3, 1], [0, 4, 4, 1], [0, 5, 6, 1]]


# ----------------------------------------------------------------------------- CRF vs brute force


@settings(max_examples=40, deadline=None)
@given(problems())
@cases(16, base=1)
def test_crf_matches_brute_force(problem):
    seed, B, L, M, scheme, masked = problem
    ts, lengths, em, T = random_problem(seed, B, L, M, scheme)
    allowed = ts.allowed if masked else None
    log_z = crf_log_partition(em, T, lengths, allowed)
    tags, best = crf_viterbi(em, T, lengths, allowed)
    marginals = crf_marginals(em, T, lengths, allowed)
    best_prob = crf_best_sequence_prob(em, T, lengths, allowed)
    spans = all_spans(lengths, M)
    span_probs = crf_span_marginals(em, T, lengths, spans, ts, allowed)
    assert (
        tags.shape == (B, L) and marginals.shape == em.shape and span_probs.shape == (len(spans),)
    )
    for b in range(B):
        n = int(lengths[b])
        enum = crf_enumerate(em[b], T, n, allowed)
        assert log_z[b].item() == pytest.approx(enum.log_z, abs=1e-9)
        assert best[b].item() == pytest.approx(enum.best_score, abs=1e-9)
        assert tuple(tags[b, :n].tolist()) in enum.best_paths
        assert not tags[b, n:].any()
        assert best_prob[b].item() == pytest.approx(
            math.exp(enum.best_score - enum.log_z), abs=1e-9
        )
        assert torch.allclose(marginals[b], enum.marginals, atol=1e-9)
        probs = crf_span_probabilities(enum, ts.names, scheme)
        for k in (spans[:, 0] == b).nonzero().flatten().tolist():
            span = tuple(spans[k, 1:].tolist())
            assert span_probs[k].item() == pytest.approx(probs.get(span, 0.0), abs=1e-9), span
        if masked:
            # Decoded tags are valid, and their entities are those by definition.
            seq = tags[b, :n].tolist()
            got = tags_to_spans(tags[b : b + 1], lengths[b : b + 1], ts)
            assert [tuple(r[1:]) for r in got.tolist()] == entities_by_definition(
                seq, ts.names, scheme
            )


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("scheme", ["BIO", "BILUO"])
@pytest.mark.parametrize("masked", [False, True])
def test_a_tag_scored_minus_infinity_is_in_no_sequence(seed, scheme, masked):
    """Against enumeration, where a sequence through an emission or a transition of -inf
    weighs exp(-inf) = 0: log Z, the best score and sequence, the tag and span marginals, the
    best sequence's probability, and a gradient without NaN (as the semi-CRF treats a segment
    of -inf). A token whose entity tags were all -inf, or a tag no other could move to, made
    every result NaN."""
    gen = torch.Generator().manual_seed(seed)
    ts = tag_scheme(2, scheme)
    n = ts.n_tags
    B, L = 2, 4 if scheme == "BILUO" else 5
    lengths = torch.tensor([L, 3])
    em = torch.randn((B, L, n), generator=gen, dtype=DTYPE)
    em[torch.rand(em.shape, generator=gen) < 0.3] = -math.inf
    em[:, 1, 1:] = -math.inf  # no entity tag on the second token
    em[:, :, 0] = em[:, :, 0].clamp_min(-1.0)  # O stays possible: every document has a sequence
    T = torch.randn((n + 1, n + 1), generator=gen, dtype=DTYPE)
    T[torch.rand(T.shape, generator=gen) < 0.3] = -math.inf
    T[:, 2] = -math.inf  # nothing moves to the tag I-1
    T[0, 0] = T[n, 0] = T[0, n] = 0.0
    allowed = ts.allowed if masked else None
    x = em.clone().requires_grad_()
    log_z = crf_log_partition(x, T, lengths, allowed)
    (grad,) = torch.autograd.grad(log_z.sum(), x)
    tags, best = crf_viterbi(em, T, lengths, allowed)
    marginals = crf_marginals(em, T, lengths, allowed)
    best_prob = crf_best_sequence_prob(em, T, lengths, allowed)
    spans = all_spans(lengths, 2)
    span_probs = crf_span_marginals(em, T, lengths, spans, ts, allowed)
    for b in range(B):
        k = int(lengths[b])
        enum = crf_enumerate(em[b], T, k, allowed)
        assert log_z[b].item() == pytest.approx(enum.log_z, abs=1e-9)
        assert best[b].item() == pytest.approx(enum.best_score, abs=1e-9)
        assert tuple(tags[b, :k].tolist()) in enum.best_paths
        assert best_prob[b].item() == pytest.approx(
            math.exp(enum.best_score - enum.log_z), abs=1e-9
        )
        assert torch.allclose(marginals[b], enum.marginals, atol=1e-9)
        probs = crf_span_probabilities(enum, ts.names, scheme)
        for row in (spans[:, 0] == b).nonzero().flatten().tolist():
            span = tuple(spans[row, 1:].tolist())
            assert span_probs[row].item() == pytest.approx(probs.get(span, 0.0), abs=1e-9)
        ranked = sorted((v for _, v in enum.paths), reverse=True)[:4]
        found = crf_nbest(em[b : b + 1, :k], T, lengths[b : b + 1], ts, 4, allowed)[0]
        expected = [math.exp(v - enum.log_z) for v in ranked if v > -math.inf]
        assert [s.prob for s in found] == pytest.approx(expected, abs=1e-9)
    assert torch.allclose(grad, marginals, atol=1e-9)
    assert not marginals[em == -math.inf].any()


@pytest.mark.parametrize("scheme", ["BIO", "BILUO"])
@pytest.mark.parametrize("masked", [False, True])
def test_a_document_whose_every_sequence_is_minus_infinity_has_none(scheme, masked):
    """Where every tag sequence of a document scores -inf there is no distribution: Viterbi
    returned a sequence all the same (here with an entity), scored NEG, and every tag marginal
    came out 1 (several tags of probability 1 on one token). Now tags O (no entity), a best score
    of -inf, tag and span marginals 0 and a best-sequence probability 0, as the semi-CRFs';
    log Z stays finite at or below NEG / 2, and the other document is as enumeration gives
    it."""
    gen = torch.Generator().manual_seed(1)
    ts = tag_scheme(1, scheme)
    n = ts.n_tags
    lengths = torch.tensor([4, 3])
    em = torch.randn((2, 4, n), generator=gen, dtype=DTYPE)
    em[0, 1] = -math.inf  # every sequence of the first document goes through token 1
    T = torch.randn((n + 1, n + 1), generator=gen, dtype=DTYPE)
    allowed = ts.allowed if masked else None
    tags, best = crf_viterbi(em, T, lengths, allowed)
    marginals = crf_marginals(em, T, lengths, allowed)
    log_z = crf_log_partition(em, T, lengths, allowed)
    spans = all_spans(lengths, 1)
    span_probs = crf_span_marginals(em, T, lengths, spans, ts, allowed)
    assert best[0].item() == -math.inf and not tags[0].any() and not marginals[0].any()
    assert not span_probs[spans[:, 0] == 0].any()
    assert crf_best_sequence_prob(em, T, lengths, allowed)[0].item() == 0.0
    assert -math.inf < log_z[0].item() <= NEG / 2
    enum = crf_enumerate(em[1], T, 3, allowed)
    assert best[1].item() == pytest.approx(enum.best_score, abs=1e-9)
    assert tuple(tags[1, :3].tolist()) in enum.best_paths
    assert torch.allclose(marginals[1], enum.marginals, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(problems(), st.integers(0, 100_000))
@cases(10, base=2, with_pick=True)
def test_score_gradient_and_batching(problem, pick):
    seed, B, L, M, scheme, masked = problem
    ts, lengths, em, T = random_problem(seed, B, L, M, scheme)
    allowed = ts.allowed if masked else None
    n_tags = ts.n_tags
    # Score of random sequences (random tags on the padding too) = the enumerated score.
    gen = torch.Generator().manual_seed(pick)
    tags = torch.randint(0, n_tags, (B, L), generator=gen)
    got = crf_score(em, T, tags, lengths, allowed)
    for b in range(B):
        n = int(lengths[b])
        seq = tags[b, :n].tolist()
        if masked and tuple(seq) not in tag_sequences(n, n_tags, ts.allowed):
            # an invalid sequence: a score so low that its probability is 0 in float64
            enum = crf_enumerate(em[b], T, n, ts.allowed)
            assert got[b].item() < enum.log_z - 800
        else:
            assert got[b].item() == pytest.approx(tag_sequence_score(em[b], T, seq), abs=1e-8)
    # Gradient of log Z w.r.t. emissions = marginals; w.r.t. transitions = expected counts.
    em_ = em.clone().requires_grad_(True)
    T_ = T.clone().requires_grad_(True)
    log_z = crf_log_partition(em_, T_, lengths, allowed)
    g_em, g_T = torch.autograd.grad(log_z.sum(), [em_, T_])
    with torch.no_grad():
        marginals = crf_marginals(em, T, lengths, allowed)
    assert torch.allclose(g_em, marginals, atol=1e-10)
    assert torch.isfinite(g_T).all()
    nonempty = int((lengths > 0).sum())
    assert g_T[n_tags, :n_tags].sum().item() == pytest.approx(nonempty, abs=1e-9)
    assert g_T[:n_tags, n_tags].sum().item() == pytest.approx(nonempty, abs=1e-9)
    if masked:
        assert g_T[~ts.allowed].abs().max() < 1e-12
    # Batched = one document at a time, unpadded.
    vt, vb = crf_viterbi(em, T, lengths, allowed)
    for b in range(B):
        n = int(lengths[b])
        one, alone = em[b : b + 1, :n], lengths[b : b + 1]
        assert crf_log_partition(one, T, alone, allowed).item() == pytest.approx(
            log_z[b].item(), abs=1e-10
        )
        t1, b1 = crf_viterbi(one, T, alone, allowed)
        assert b1.item() == pytest.approx(vb[b].item(), abs=1e-10)
        assert torch.equal(t1[0], vt[b, :n])
        assert torch.allclose(
            crf_marginals(one, T, alone, allowed)[0], marginals[b, :n], atol=1e-10
        )
        spans = all_spans(alone, M)
        batch_spans = spans.clone()
        batch_spans[:, 0] = b
        assert torch.allclose(
            crf_span_marginals(one, T, alone, spans, ts, allowed),
            crf_span_marginals(em, T, lengths, batch_spans, ts, allowed),
            atol=1e-10,
        )


@pytest.mark.parametrize("scheme", ["BIO", "BILUO"])
def test_gold_tags_loss_is_non_negative_and_finite(scheme):
    ts, lengths, em, T = random_problem(5, 4, 7, 3, scheme)
    lengths = torch.tensor([7, 0, 1, 4])
    gold = torch.tensor([[0, 0, 2, 1], [0, 3, 3, 2], [2, 0, 0, 3], [3, 1, 3, 2]])
    tags = spans_to_tags(gold, lengths, 7, ts)
    em = em.clone().requires_grad_(True)
    T = T.clone().requires_grad_(True)
    loss = crf_log_partition(em, T, lengths, ts.allowed) - crf_score(
        em, T, tags, lengths, ts.allowed
    )
    assert (loss >= -1e-9).all() and loss[1] == 0
    for g in torch.autograd.grad(loss.sum(), [em, T]):
        assert torch.isfinite(g).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scheme", ["BIO", "BILUO"])
def test_no_nan_for_empty_single_token_and_zero_length_batches(dtype, scheme):
    ts = tag_scheme(2, scheme)
    n = ts.n_tags
    for B, L, lengths in [(3, 4, [0, 1, 4]), (2, 0, [0, 0]), (0, 3, [])]:
        lengths = torch.tensor(lengths, dtype=torch.long)
        em = torch.randn((B, L, n), dtype=dtype, requires_grad=True)
        T = torch.randn((n + 1, n + 1), dtype=dtype, requires_grad=True)
        log_z = crf_log_partition(em, T, lengths, ts.allowed)
        assert log_z.shape == (B,) and torch.isfinite(log_z).all()
        assert not log_z[lengths == 0].any()
        for g in torch.autograd.grad(log_z.sum(), [em, T]):
            assert torch.isfinite(g).all()
        tags, best = crf_viterbi(em, T, lengths, ts.allowed)
        assert tags.shape == (B, L) and torch.isfinite(best).all() and not best[lengths == 0].any()
        m = crf_marginals(em, T, lengths, ts.allowed)
        assert torch.isfinite(m).all()
        p = crf_best_sequence_prob(em, T, lengths, ts.allowed)
        assert ((p >= 0) & (p <= 1)).all() and (p[lengths == 0] == 1).all()
        spans = tags_to_spans(tags, lengths, ts)
        conf = crf_span_marginals(em, T, lengths, spans, ts, ts.allowed)
        assert conf.shape == (spans.shape[0],) and torch.isfinite(conf).all()
        assert crf_span_marginals(
            em, T, lengths, torch.zeros((0, 4), dtype=torch.long), ts
        ).shape == (0,)
        if B and L:
            assert m[1, 0].sum().item() == pytest.approx(1.0, abs=1e-5)  # single token


def test_transitions_take_the_emissions_dtype():
    """float32 emissions with float64 transitions (say a model's weights against a float64
    matrix) compute in float32: every result has the emissions' dtype and the same values."""
    ts = tag_scheme(2, "BIO")
    gen = torch.Generator().manual_seed(0)
    em = torch.randn((2, 5, ts.n_tags), generator=gen)
    T = torch.randn((ts.n_tags + 1, ts.n_tags + 1), generator=gen, dtype=torch.float64)
    lengths = torch.tensor([5, 3])
    tags = torch.randint(0, ts.n_tags, (2, 5), generator=gen)
    outputs = {
        "log_z": (crf_log_partition(em, T, lengths, ts.allowed),
                  crf_log_partition(em, T.float(), lengths, ts.allowed)),
        "score": (crf_score(em, T, tags, lengths), crf_score(em, T.float(), tags, lengths)),
        "viterbi": (crf_viterbi(em, T, lengths)[1], crf_viterbi(em, T.float(), lengths)[1]),
        "marginals": (crf_marginals(em, T, lengths), crf_marginals(em, T.float(), lengths)),
        "best_prob": (crf_best_sequence_prob(em, T, lengths),
                      crf_best_sequence_prob(em, T.float(), lengths)),
    }
    for name, (mixed, single) in outputs.items():
        assert mixed.dtype == torch.float32, name
        assert torch.allclose(mixed, single, atol=1e-5), name


CRF_SCHEME = tag_scheme(1, "BIO")  # 3 tags
CRF_FUNCTIONS = {
    "log_partition": crf_log_partition,
    "viterbi": crf_viterbi,
    "marginals": crf_marginals,
    "best_sequence_prob": crf_best_sequence_prob,
    "score": lambda e, t, n, a: crf_score(e, t, torch.zeros((2, 3), dtype=torch.long), n, a),
    "span_marginals": lambda e, t, n, a: crf_span_marginals(
        e, t, n, torch.tensor([[0, 0, 0, 1]]), CRF_SCHEME, a),
    "span_marginals_unchecked_rows": lambda e, t, n, a: crf_span_marginals(
        e, t, n, torch.tensor([[0, 0, 0, 1]]), CRF_SCHEME, a, check_rows=False),
}


@pytest.mark.parametrize("name", CRF_FUNCTIONS)
@bad_lengths("the emissions")
def test_lengths_that_do_not_fit_the_emissions_are_a_clear_error(name, lengths, message):
    """A length past the rows was decoded as if the document ended at the last row, without
    an error; one length for two documents was broadcast to both."""
    em = torch.randn((2, 3, CRF_SCHEME.n_tags), dtype=DTYPE)
    T = torch.zeros((4, 4), dtype=DTYPE)
    for allowed in (None, CRF_SCHEME.allowed):
        with pytest.raises(ValueError, match=message):
            CRF_FUNCTIONS[name](em, T, torch.tensor(lengths), allowed)


@pytest.mark.parametrize("name", CRF_FUNCTIONS)
@pytest.mark.parametrize("shape", [(3, 3), (5, 5), (4, 3), (4,)])
def test_transitions_of_another_shape_are_a_clear_error(name, shape):
    """Transitions for another number of tags failed on an index out of bounds."""
    em = torch.randn((2, 3, CRF_SCHEME.n_tags), dtype=DTYPE)
    message = (r"^transitions must be \[4, 4\] for the 3 tags of the emissions \(the last row "
               rf"from START, the last column to END\), got {re.escape(str(shape))}$")
    with pytest.raises(ValueError, match=message):
        CRF_FUNCTIONS[name](em, torch.zeros(shape, dtype=DTYPE), torch.tensor([3, 2]), None)


@pytest.mark.parametrize("name", CRF_FUNCTIONS)
def test_emissions_and_allowed_of_another_shape_are_a_clear_error(name):
    """Allowed transitions of another shape failed on a size mismatch, emissions without
    tags on an index out of bounds."""
    em = torch.randn((2, 3, CRF_SCHEME.n_tags), dtype=DTYPE)
    T, lengths = torch.zeros((4, 4), dtype=DTYPE), torch.tensor([3, 2])
    with pytest.raises(ValueError, match=r"^allowed must be a BoolTensor of the transitions' "
                                         r"shape \(4, 4\), got Tensor torch.bool \(3, 3\)$"):
        CRF_FUNCTIONS[name](em, T, lengths, torch.ones((3, 3), dtype=torch.bool))
    with pytest.raises(ValueError, match=r"^allowed must be a BoolTensor of the transitions' "
                                         r"shape \(4, 4\), got Tensor torch.int64 \(4, 4\)$"):
        CRF_FUNCTIONS[name](em, T, lengths, torch.ones((4, 4), dtype=torch.long))
    with pytest.raises(ValueError, match=r"^emissions must be a tensor \[B, L, n_tags\], "
                                         r"n_tags >= 1, got Tensor \(2, 3, 0\)$"):
        CRF_FUNCTIONS[name](em[:, :, :0], torch.zeros((1, 1)), lengths, None)


def test_tags_and_scheme_of_another_shape_are_a_clear_error():
    """Tags of another shape failed on a size mismatch; a scheme of another number of tags
    read other tags' marginals."""
    em = torch.randn((2, 3, CRF_SCHEME.n_tags), dtype=DTYPE)
    T, lengths = torch.zeros((4, 4), dtype=DTYPE), torch.tensor([3, 2])
    with pytest.raises(ValueError, match=r"^tags must be a tensor \[B, L\], one tag per token "
                                         r"of the emissions \(2, 3, 3\), got Tensor \(2, 2\)$"):
        crf_score(em, T, torch.zeros((2, 2), dtype=torch.long), lengths)
    with pytest.raises(ValueError, match="^scheme has 5 tags, the emissions 3$"):
        crf_span_marginals(em, T, lengths, torch.tensor([[0, 0, 0, 1]]), tag_scheme(2, "BIO"))


@pytest.mark.parametrize("scheme", ["BIO", "BILUO"])
def test_long_document_span_marginals_in_float32(scheme):
    # A 400-token document with a 200-token entity: float32 span marginals (prefix sums over
    # the I run) agree with float64 ones; one-token BILUO spans are the U-l token marginals.
    gen = torch.Generator().manual_seed(0)
    ts = tag_scheme(3, scheme)
    n = ts.n_tags
    lengths = torch.tensor([400, 250])
    em = torch.randn((2, 400, n), generator=gen, dtype=DTYPE) * 2
    T = torch.randn((n + 1, n + 1), generator=gen, dtype=DTYPE)
    # Make a long entity likely: strong I-1 emissions over a stretch.
    em[0, 100:300, ts.tag("I", 1)] += 12
    T[ts.tag("I", 1), ts.tag("I", 1)] = 0.5
    em[0, 100, ts.tag("B", 1)] += 8
    if scheme == "BILUO":
        em[0, 299, ts.tag("L", 1)] += 12
    tags, _ = crf_viterbi(em, T, lengths, ts.allowed)
    spans = tags_to_spans(tags, lengths, ts)
    assert ((spans[:, 2] - spans[:, 1]) > 100).any()
    p64 = crf_span_marginals(em, T, lengths, spans, ts, ts.allowed)
    p32 = crf_span_marginals(em.float(), T.float(), lengths, spans, ts, ts.allowed)
    assert p32.dtype == torch.float32
    assert torch.allclose(p32.double(), p64, atol=2e-3)
    marg = crf_marginals(em, T, lengths, ts.allowed)
    if scheme == "BILUO":
        single = spans[spans[:, 1] == spans[:, 2]]
        if len(single):
            d, s, _, l = single.unbind(1)
            assert torch.allclose(
                crf_span_marginals(em, T, lengths, single, ts, ts.allowed),
                marg[d, s, ts.tag("U", l)],
                atol=1e-9,
            )


def test_long_document_tag_marginals_in_float32():
    """A 2,000-token document (|log Z| about 20,000): float32 tag marginals agree with float64
    ones and stay probabilities; computed in float32 they were off by 0.017, up to 1.014."""
    gen = torch.Generator().manual_seed(0)
    ts = tag_scheme(4, "BIO")
    n = ts.n_tags
    lengths = torch.tensor([2000, 700])
    em = torch.randn((2, 2000, n), generator=gen, dtype=DTYPE) * 8
    T = torch.randn((n + 1, n + 1), generator=gen, dtype=DTYPE)
    p64 = crf_marginals(em, T, lengths, ts.allowed)
    p32 = crf_marginals(em.float(), T.float(), lengths, ts.allowed)
    assert p32.dtype == torch.float32
    assert torch.allclose(p32.double(), p64, atol=1e-5)
    assert (p32 <= 1).all()
    in_doc = torch.arange(2000).view(1, -1) < lengths.view(-1, 1)
    assert torch.allclose(p32.sum(-1).double(), in_doc.double(), atol=1e-5)


@pytest.mark.parametrize("seed", [155, 239, 557, 1517])
def test_span_marginals_are_at_most_one(seed):
    # exp(span score - log Z): the two sums take the same terms in other orders, so where one
    # tag sequence holds nearly all the mass rounding can put a marginal above 1 (in float64
    # these problems reach 1 + 3e-14 before the clamp)
    gen = torch.Generator().manual_seed(seed)
    ts = tag_scheme(2, "BILUO")
    L = 1 + seed % 6
    em = (torch.randn((1, L, ts.n_tags), generator=gen) * (1 + seed % 20)).double()
    T = torch.randn((ts.n_tags + 1, ts.n_tags + 1), generator=gen) * 3
    lengths = torch.tensor([L])
    spans = tags_to_spans(crf_viterbi(em, T, lengths, ts.allowed)[0], lengths, ts)
    p = crf_span_marginals(em, T, lengths, spans, ts, ts.allowed)
    assert p.dtype == torch.float64 and len(p) and (p <= 1).all() and (p > 0.9).any()


def test_span_marginals_are_clamped_whatever_the_rounding(monkeypatch):
    # the problems above depend on how this CPU rounds exp and log; a log Z that comes out
    # below a span's score (here by 1, so every marginal is e times too large) must still give
    # probabilities of at most 1 on any machine
    forward = linear_crf._forward

    def lower_log_z(*args):
        alphas, log_z = forward(*args)
        return alphas, log_z - 1.0

    monkeypatch.setattr(linear_crf, "_forward", lower_log_z)
    ts, lengths, em, T = random_problem(0, 2, 5, 2, "BIO")
    spans = all_spans(lengths, 2)
    p = crf_span_marginals(em, T, lengths, spans, ts, ts.allowed)
    monkeypatch.undo()
    q = crf_span_marginals(em, T, lengths, spans, ts, ts.allowed)
    assert (p == 1).any() and (p <= 1).all()
    assert torch.allclose(p, (q * math.e).clamp_max(1.0), rtol=1e-5, atol=0)


@pytest.mark.parametrize("scheme", ["BIO", "BILUO"])
@pytest.mark.parametrize("masked", [False, True])
def test_an_impossible_inside_step_at_either_end_of_a_run(scheme, masked):
    """One I-l emission of -inf, at each position in turn (the first or the last step of a
    span's run of I tags, or one outside it): a span through it has probability 0, one next to
    it the probability enumeration gives."""
    gen = torch.Generator().manual_seed(7)
    ts = tag_scheme(1, scheme)
    L = 5 if masked or scheme == "BIO" else 4
    lengths = torch.tensor([L])
    base = torch.randn((1, L, ts.n_tags), generator=gen, dtype=DTYPE)
    T = torch.randn((ts.n_tags + 1, ts.n_tags + 1), generator=gen, dtype=DTYPE)
    allowed = ts.allowed if masked else None
    spans = all_spans(lengths, 1)
    i_tag = ts.names.index("I-1")
    for t in range(L):
        em = base.clone()
        em[0, t, i_tag] = -math.inf
        got = crf_span_marginals(em, T, lengths, spans, ts, allowed)
        enum = crf_enumerate(em[0], T, L, allowed)
        probs = crf_span_probabilities(enum, ts.names, scheme)
        for k, row in enumerate(spans[:, 1:].tolist()):
            assert got[k].item() == pytest.approx(probs.get(tuple(row), 0.0), abs=1e-9), (t, row)


def test_tag_marginals_are_clamped_whatever_the_rounding(monkeypatch):
    # as the span marginals: a log Z that comes out below the paths' scores (here by 1, so
    # every marginal is e times too large) must still give probabilities of at most 1
    forward = linear_crf._forward

    def lower_log_z(*args):
        alphas, log_z = forward(*args)
        return alphas, log_z - 1.0

    ts, lengths, em, T = random_problem(0, 2, 5, 2, "BIO")
    q = crf_marginals(em, T, lengths, ts.allowed)
    monkeypatch.setattr(linear_crf, "_forward", lower_log_z)
    p = crf_marginals(em, T, lengths, ts.allowed)
    assert (p == 1).any() and (p <= 1).all()
    assert torch.allclose(p, (q * math.e).clamp_max(1.0), rtol=1e-9, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    ts, lengths, em, T = random_problem(3, 4, 6, 2, "BIO")
    spans = all_spans(lengths, 2)
    cpu = (
        crf_log_partition(em, T, lengths, ts.allowed),
        crf_viterbi(em, T, lengths, ts.allowed)[0],
        crf_marginals(em, T, lengths, ts.allowed),
        crf_span_marginals(em, T, lengths, spans, ts, ts.allowed),
    )
    em_c, T_c, len_c, al_c = em.cuda(), T.cuda(), lengths.cuda(), ts.allowed.cuda()
    gpu = (
        crf_log_partition(em_c, T_c, len_c, al_c),
        crf_viterbi(em_c, T_c, len_c, al_c)[0],
        crf_marginals(em_c, T_c, len_c, al_c),
        crf_span_marginals(em_c, T_c, len_c, spans.cuda(), ts, al_c),
    )
    for a, b in zip(cpu, gpu):
        assert b.device.type == "cuda"
        assert torch.allclose(a.double(), b.cpu().double())
    assert torch.equal(tags_to_spans(gpu[1], len_c, ts).cpu(), tags_to_spans(cpu[1], lengths, ts))
