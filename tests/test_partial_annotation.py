"""Training on partly annotated documents: the heads' gold scores with ``known`` (False at the
tokens without entity annotation) against enumeration of the paths consistent with the
annotation, on small random inputs."""
import math
import random
import re

import pytest
import torch

from spacy_fsemicrf.structured import FilteredSemiCRFHead, LinearCRFHead, SemiCRFHead
from spacy_fsemicrf.structured.filtered import consistent_log_score, training_nodes
from spacy_fsemicrf.structured.heads import semicrf_consistent_score
from spacy_fsemicrf.structured.linear_crf import (
    consistent_emissions,
    crf_log_partition,
    spans_to_tags,
    tag_scheme,
)
from spacy_fsemicrf.structured.spans import (
    gold_label_grid,
    incorrect_label_grid,
    span_mask,
    unknown_spans,
)

from .bruteforce import (
    entities_by_definition,
    filtered_enumerate,
    nonoverlapping_sets,
    segmentation_score,
    segmentations,
    tag_sequence_score,
    tag_sequences,
)

N_LABELS = 2


def _logsumexp(values):
    best = max(values)
    return best + math.log(sum(math.exp(v - best) for v in values))


def _case(rng: random.Random, max_length: int, max_width: int):
    """A document length, gold entities ``(start, end, label)`` (those of a random
    segmentation, wider ones allowed for the linear CRF's sake) and a known mask that is True
    on every gold token."""
    length = rng.randint(1, max_length)
    segments = rng.choice(segmentations(length, max_width, N_LABELS + 1))
    gold = [(s, e, c) for s, e, c in segments if c > 0 and rng.random() < 0.7]
    on_gold = {t for s, e, _ in gold for t in range(s, e + 1)}
    known = [t in on_gold or rng.random() < 0.5 for t in range(length)]
    return length, gold, known


def _consistent(entities, gold, known) -> bool:
    """Whether a path with ``entities`` agrees with the annotation: it holds every gold entity,
    and each of its other entities lies on unknown tokens only."""
    gold = set(gold)
    return gold <= set(entities) and all(
        not any(known[s:e + 1]) for s, e, c in entities if (s, e, c) not in gold)


def _tensors(length, gold, known, pad):
    """Batch of one document padded by ``pad`` tokens (padding counts for nothing)."""
    rows = torch.tensor([[0, s, e, c] for s, e, c in gold], dtype=torch.long).view(-1, 4)
    flags = torch.tensor([known + [False] * pad])
    return rows, flags, torch.tensor([length])


@pytest.mark.parametrize("with_wrong", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_semicrf_consistent_score_is_the_log_sum_over_consistent_segmentations(seed, with_wrong):
    """With entities known to be wrong too: the consistent segmentations hold none of them."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    K, C = rng.randint(1, 3), N_LABELS + 1
    length, gold, known = _case(rng, 5, K)
    wrong = _incorrect(rng, length, K, gold, known) if with_wrong else []
    pad = rng.randint(0, 2)
    scores = torch.randn(1, length + pad, K, C, dtype=torch.float64)
    T = torch.randn(C + 1, C + 1, dtype=torch.float64) if seed % 2 else None
    rows, flags, lengths = _tensors(length, gold, known, pad)
    got = semicrf_consistent_score(scores, lengths, rows, T, flags,
                                   _rows(wrong) if with_wrong else None)
    values = [segmentation_score(scores[0], segs, T) for segs in segmentations(length, K, C)
              if _consistent([s for s in segs if s[2] > 0], gold, known)
              and not set(segs) & set(wrong)]
    assert float(got) == pytest.approx(_logsumexp(values), abs=1e-9)


@pytest.mark.parametrize("scheme", ["BIO", "BILUO"])
@pytest.mark.parametrize("seed", range(25))
def test_crf_consistent_emissions_give_the_log_sum_over_consistent_tag_sequences(scheme, seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    tags_of = tag_scheme(N_LABELS, scheme)
    length, gold, known = _case(rng, 5, 5)
    pad = rng.randint(0, 2)
    emissions = torch.randn(1, length + pad, tags_of.n_tags, dtype=torch.float64)
    T = torch.randn(tags_of.n_tags + 1, tags_of.n_tags + 1, dtype=torch.float64)
    rows, flags, lengths = _tensors(length, gold, known, pad)
    tags = spans_to_tags(rows, lengths, length + pad, tags_of)
    masked = consistent_emissions(emissions, tags, flags, rows, tags_of)
    got = crf_log_partition(masked, T, lengths, tags_of.allowed)
    values = [
        tag_sequence_score(emissions[0, :length], T, seq)
        for seq in tag_sequences(length, tags_of.n_tags, tags_of.allowed)
        if _consistent(entities_by_definition(seq, tags_of.names, scheme), gold, known)
    ]
    assert float(got) == pytest.approx(_logsumexp(values), abs=1e-9)


def _grid_case(seed: int, max_pad: int):
    """A random case of :func:`_case` as a batch of one for the filtered graph:
    ``(K, C, gold, known, lengths, grid, unknown, local)`` with random local scores whose
    filter keeps a fair share of the spans."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    K, C = rng.randint(1, 3), N_LABELS + 1
    length, gold, known = _case(rng, 6, K)
    pad = rng.randint(0, max_pad)
    L = length + pad
    rows, flags, lengths = _tensors(length, gold, known, pad)
    grid = gold_label_grid(rows, lengths, L, K, N_LABELS)
    unknown = unknown_spans(flags | (torch.arange(L) >= length), K) & span_mask(lengths, L, K)
    local = torch.randn(1, L, K, C, dtype=torch.float64)
    local[..., 0] -= 0.5
    return K, C, gold, known, lengths, grid, unknown, local


@pytest.mark.parametrize("seed", range(40))
def test_filtered_consistent_score_is_the_log_sum_over_consistent_maximal_paths(seed):
    """On the training graph (gold nodes, the filter's nodes that overlap them, and its nodes
    of unknown tokens only): the maximal paths that hold the gold nodes and otherwise only
    nodes of unknown tokens."""
    K, C, gold, known, lengths, grid, unknown, local = _grid_case(seed, 2)
    mask, labels = training_nodes(local, lengths, grid, unknown=unknown)
    scores = torch.randn(1, *grid.shape[1:], dtype=torch.float64)
    T = torch.randn(C + 1, C + 1, dtype=torch.float64) if seed % 2 else None
    got = consistent_log_score(scores, mask, grid > 0, unknown, labels, T)
    start, width = mask[0].nonzero(as_tuple=True)
    nodes = [(s, s + w, int(labels[0, s, w]), float(scores[0, s, w]))
             for s, w in zip(start.tolist(), width.tolist())]
    # the filter's nodes of unknown tokens only are all in the graph
    assert bool((mask | ~(unknown & (local.argmax(-1) > 0))).all())
    enum = filtered_enumerate(nodes, T)
    values = [v for path, v in enum.paths
              if _consistent([nodes[k][:3] for k in path], gold, known)]
    assert float(got) == pytest.approx(_logsumexp(values), abs=1e-9)


@pytest.mark.parametrize("seed", range(30))
def test_the_filtered_heads_loss_with_unknown_tokens_by_enumeration(seed):
    """The head's loss from given local and global scores: the local cross-entropy without the
    spans of unknown tokens only, plus log Z of the training graph (the gold nodes and the
    filter's nodes that overlap them or lie on unknown tokens only) minus the log-sum over its
    maximal paths consistent with the annotation, with transitions."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    K, C = rng.randint(1, 3), N_LABELS + 1
    length, gold, known = _case(rng, 6, K)
    pad = rng.randint(0, 1)
    L = length + pad
    head = FilteredSemiCRFHead(8, N_LABELS, max_width=K, dropout=0.0, transitions=True).double()
    with torch.no_grad():
        head.transitions.normal_()
    rows, flags, lengths = _tensors(length, gold, known, pad)
    local = torch.randn(1, L, K, C, dtype=torch.float64)
    local[..., 0] -= 0.5
    glob = torch.randn(1, L, K, C, dtype=torch.float64)
    with torch.no_grad():
        got = float(head.loss(local, glob, lengths, rows, known=flags))
    expected = _expected_loss(head, local, glob, length, K, gold, known, (),
                              head.transitions.detach())
    assert got == pytest.approx(expected, abs=1e-9)


def _expected_loss(head, local, glob, length, K, gold, known, wrong, T):
    """The filtered head's loss by enumeration, for a batch of one: the local cross-entropy of
    the spans with a known token, and of the spans of unknown tokens only with labels known to
    be ``wrong`` ("any class but those"); plus log Z of the training graph (the gold nodes and
    the filter's nodes that overlap them or lie on unknown tokens only, none with a wrong
    label) minus the log-sum over its maximal paths consistent with the annotation."""
    gold_label = {(s, e): c for s, e, c in gold}
    expected, nodes = 0.0, []
    for s in range(length):
        for e in range(s, min(s + K, length)):
            w = e - s
            on_unknown = not any(known[s:e + 1])
            label = gold_label.get((s, e), 0)
            log_p = torch.log_softmax(local[0, s, w], -1)
            ruled_out = {c for ws, we, c in wrong if (ws, we) == (s, e)} if on_unknown else set()
            if not on_unknown:
                expected -= (1.0 if label else head.null_weight) * float(log_p[label])
            elif ruled_out:
                expected -= _logsumexp([float(log_p[c]) for c in range(local.shape[-1])
                                        if c not in ruled_out])
            best = int(local[0, s, w].argmax())
            overlaps = any(s <= ge and gs <= e for gs, ge, _ in gold)
            if label or (best > 0 and (overlaps or on_unknown) and best not in ruled_out):
                label = label or best
                nodes.append((s, e, label, float(glob[0, s, w, label])))
    enum = filtered_enumerate(nodes, T)
    consistent = [v for path, v in enum.paths
                  if _consistent([nodes[k][:3] for k in path], gold, known)]
    return expected + _logsumexp([v for _, v in enum.paths]) - _logsumexp(consistent)


def test_unknown_spans_marks_the_spans_of_unknown_tokens_only():
    known = torch.tensor([[True, False, False, True], [False, False, True, True]])
    got = unknown_spans(known, 2)
    # (entries past the end read as ending at the last token)
    assert got.tolist() == [[[False, False], [True, True], [True, False], [False, False]],
                            [[True, True], [True, False], [False, False], [False, False]]]
    assert unknown_spans(torch.zeros(3, 0, dtype=torch.bool), 2).shape == (3, 0, 2)
    with pytest.raises(ValueError, match=r"^known must be a BoolTensor \[B, L\], True at the "
                       r"tokens that have entity annotation, got Tensor torch.float32 \(2, 4\)$"):
        unknown_spans(known.float(), 2)


def test_a_gold_label_beyond_the_heads_labels_is_refused_with_unknown_tokens():
    """As without ``known``: the exact semi-CRF's consistent score checks the gold labels."""
    scores, lengths = torch.randn(1, 4, 2, N_LABELS + 1), torch.tensor([4])
    known = torch.tensor([[True, True, False, False]])
    for label in (N_LABELS + 1, N_LABELS + 2):
        gold = torch.tensor([[0, 0, 1, label]])
        for flags in (known, None):
            with pytest.raises(ValueError, match=f"^gold span label {label} is not one of the "
                               f"{N_LABELS} labels$"):
                semicrf_consistent_score(scores, lengths, gold, None, flags)


HEADS = {"Filtered": FilteredSemiCRFHead, "SemiCRF": SemiCRFHead, "LinearCRF": LinearCRFHead}


@pytest.mark.parametrize("name, settings", [(name, {}) for name in sorted(HEADS)]
                         + [("Filtered", {"exact_loss": 1.0})])
def test_a_document_without_annotation_costs_nothing(name, settings):
    """No known token and no gold entity: every path is consistent, the gold score is log Z,
    and a span head's local loss has no target: the loss is 0 and teaches nothing (the exact
    semi-CRF term of a filtered head too)."""
    torch.manual_seed(0)
    head = HEADS[name](8, N_LABELS, max_width=3, dropout=0.0, **settings)
    X = torch.randn(2, 6, 8, requires_grad=True)
    lengths = torch.tensor([6, 4])
    loss = head(X, lengths, torch.zeros((0, 4), dtype=torch.long),
                known=torch.zeros(2, 6, dtype=torch.bool))
    assert float(loss.detach()) == pytest.approx(0.0, abs=1e-4)
    loss.backward()
    assert float(X.grad.abs().max()) < 1e-4


def _batch(name):
    """A head without dropout, a batch of two documents of 6 and 4 tokens with a gold entity
    each, and ``known`` all True."""
    torch.manual_seed(0)
    head = HEADS[name](8, N_LABELS, max_width=3, dropout=0.0)
    X, lengths = torch.randn(2, 6, 8), torch.tensor([6, 4])
    gold = torch.tensor([[0, 1, 2, 1], [1, 0, 0, 2]])
    return head, X, lengths, gold, torch.ones(2, 6, dtype=torch.bool)


@pytest.mark.parametrize("name", sorted(HEADS))
def test_known_everywhere_is_the_full_annotation_bit_for_bit(name):
    head, X, lengths, gold, known = _batch(name)
    known[1, 4:] = False  # padding: not read
    assert torch.equal(head(X, lengths, gold, known=known), head(X, lengths, gold))


@pytest.mark.parametrize("name", sorted(HEADS))
def test_unknown_tokens_lower_the_loss_and_a_contradiction_is_refused(name):
    head, X, lengths, gold, known = _batch(name)
    known[0, 4:] = False
    with torch.no_grad():
        assert float(head(X, lengths, gold, known=known)) < float(head(X, lengths, gold))
    known[0, 2] = False  # a token of the gold span (0, 1, 2)
    with pytest.raises(ValueError, match="^known is False at a token of a gold span: the "
                       "tokens of an annotated entity are known$"):
        head(X, lengths, gold, known=known)
    with pytest.raises(ValueError, match=r"^known must be a BoolTensor \[2, 6\], True at the "
                       r"tokens that have entity annotation, got Tensor torch.int64 \(2, 6\)$"):
        head(X, lengths, gold, known=known.long())


@pytest.mark.parametrize("name", sorted(HEADS))
def test_bad_gold_rows_are_refused_with_unknown_tokens_as_without(name):
    """The gold rows are checked before ``known`` is read at them: a row of a document outside
    the batch, past its document's end, or a list of rows, is the error it is without."""
    head, X, lengths, _, known = _batch(name)
    known[0, 4:] = False
    for gold in (torch.tensor([[2, 0, 0, 1]]), torch.tensor([[1, 3, 5, 1]]), [[0, 1, 2, 1]]):
        with pytest.raises((ValueError, TypeError)) as without:
            head(X, lengths, gold)
        with pytest.raises(without.type, match=f"^{re.escape(str(without.value))}$"):
            head(X, lengths, gold, known=known)


@pytest.mark.parametrize("seed", range(12))
def test_null_tokens_consistent_score_is_the_log_sum_over_consistent_sets(seed):
    """With null tokens a path is any set of non-overlapping training nodes (every node the
    filter keeps, near gold or not), the covered tokens it leaves free scoring their nulls:
    the loss's global part is log Z minus the log-sum over the sets that hold the gold nodes
    and otherwise only nodes of unknown tokens."""
    K, C, gold, known, lengths, grid, unknown, local = _grid_case(seed, 1)
    head = FilteredSemiCRFHead(8, N_LABELS, max_width=K, null_tokens=True).double()
    glob = torch.randn(*local.shape, dtype=torch.float64)
    mask, labels = training_nodes(local, lengths, grid, overlapping_only=False)
    scores = glob.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    got = head._null_tokens_loss(scores, mask, labels, glob, grid, unknown)
    start, width = mask[0].nonzero(as_tuple=True)
    nodes = [(s, s + w, int(labels[0, s, w]), float(scores[0, s, w]))
             for s, w in zip(start.tolist(), width.tolist())]
    expected = _null_tokens_global_loss(nodes, glob[0, :, 0, 0].tolist(), gold, known)
    assert float(got) == pytest.approx(expected, abs=1e-9)


def _null_tokens_global_loss(nodes, null, gold, known) -> float:
    """By enumeration: log Z over the sets of non-overlapping ``nodes`` ``(start, end, label,
    score)``, the covered tokens a set leaves free scoring their ``null``, minus the log-sum over
    the sets consistent with the annotation."""
    covered = {t for s, e, _, _ in nodes for t in range(s, e + 1)}
    values, consistent = [], []
    for chosen in nonoverlapping_sets([(s, e) for s, e, _, _ in nodes]):
        on = {t for k in chosen for t in range(nodes[k][0], nodes[k][1] + 1)}
        value = sum(nodes[k][3] for k in chosen) + sum(null[t] for t in covered - on)
        values.append(value)
        if _consistent([nodes[k][:3] for k in chosen], gold, known):
            consistent.append(value)
    return _logsumexp(values) - _logsumexp(consistent)


@pytest.mark.parametrize("seed", range(20))
def test_the_null_tokens_heads_loss_with_unknown_tokens_by_enumeration(seed):
    """The whole loss of a head with null tokens from given scores: the local cross-entropy
    without the spans of unknown tokens only, plus log Z over the sets of non-overlapping
    training nodes (the gold nodes and every node the filter keeps), the covered tokens a set
    leaves free scoring their nulls, minus the log-sum over the sets consistent with the
    annotation (which a loss reading every token as annotated would not take)."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    K, C = rng.randint(1, 3), N_LABELS + 1
    length, gold, known = _case(rng, 6, K)
    head = FilteredSemiCRFHead(8, N_LABELS, max_width=K, dropout=0.0, null_tokens=True).double()
    rows, flags, lengths = _tensors(length, gold, known, 0)
    local = torch.randn(1, length, K, C, dtype=torch.float64)
    local[..., 0] -= 0.5
    glob = torch.randn(1, length, K, C, dtype=torch.float64)
    with torch.no_grad():
        got = float(head.loss(local, glob, lengths, rows, known=flags))
    gold_label = {(s, e): c for s, e, c in gold}
    expected, nodes = 0.0, []
    for s in range(length):
        for e in range(s, min(s + K, length)):
            label = gold_label.get((s, e), 0)
            if any(known[s:e + 1]):
                log_p = torch.log_softmax(local[0, s, e - s], -1)
                expected -= (1.0 if label else head.null_weight) * float(log_p[label])
            label = label or int(local[0, s, e - s].argmax())
            if label:
                nodes.append((s, e, label, float(glob[0, s, e - s, label])))
    expected += _null_tokens_global_loss(nodes, glob[0, :, 0, 0].tolist(), gold, known)
    assert got == pytest.approx(expected, abs=1e-9)


# ---------------------------------------------------------- entities known to be wrong

def _incorrect(rng: random.Random, length: int, max_width: int, gold, known):
    """Random rows ``(start, end, label)`` of entities known to be wrong (spaCy's
    ``incorrect_spans_key``), none a gold entity with its label: mostly on unknown tokens only,
    where they rule paths out, and one on any tokens."""
    spans = [(s, e) for s in range(length) for e in range(s, min(length, s + max_width))]
    free = [(s, e) for s, e in spans if not any(known[s:e + 1])]
    picked = rng.sample(free, min(len(free), rng.randint(1, 3))) + [rng.choice(spans)]
    rows = {(s, e, rng.randint(1, N_LABELS)) for s, e in picked}
    return sorted(rows - set(gold))


def _favour(local, wrong, rng):
    """Raise the local score of about half the ``wrong`` entities' labels, so that the filter
    keeps some of them as nodes with the wrong label."""
    for s, e, c in wrong:
        if rng.random() < 0.5:
            local[0, s, e - s, c] += 3.0


def _rows(spans):
    return torch.tensor([[0, s, e, c] for s, e, c in spans], dtype=torch.long).view(-1, 4)


@pytest.mark.parametrize("seed", range(30))
def test_the_filtered_heads_loss_with_incorrect_entities_by_enumeration(seed):
    """An entity known to be wrong on unknown tokens: its span's local target is "any class
    but that label", the filter's node there with that label leaves the training graph, and
    the exact semi-CRF term's consistent segmentations leave it out; on known tokens the
    annotation already says more, and it changes nothing."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    K, C = rng.randint(1, 3), N_LABELS + 1
    length, gold, known = _case(rng, 6, K)
    wrong = _incorrect(rng, length, K, gold, known)
    pad = rng.randint(0, 1)
    L = length + pad
    exact = 0.5 if seed % 3 == 0 else 0.0
    head = FilteredSemiCRFHead(8, N_LABELS, max_width=K, dropout=0.0, transitions=not exact,
                               exact_loss=exact).double()
    T = None if exact else head.transitions.detach().normal_()
    rows, flags, lengths = _tensors(length, gold, known, pad)
    local = torch.randn(1, L, K, C, dtype=torch.float64)
    local[..., 0] -= 0.5
    _favour(local, wrong, rng)
    glob = torch.randn(1, L, K, C, dtype=torch.float64)
    with torch.no_grad():
        got = float(head.loss(local, glob, lengths, rows, known=flags, incorrect=_rows(wrong)))
    expected = _expected_loss(head, local, glob, length, K, gold, known, wrong, T)
    if exact:
        segs = segmentations(length, K, C)
        everything = [segmentation_score(glob[0], seg) for seg in segs]
        allowed = [segmentation_score(glob[0], seg) for seg in segs
                   if _consistent([x for x in seg if x[2] > 0], gold, known)
                   and not set(seg) & set(wrong)]
        expected += exact * (_logsumexp(everything) - _logsumexp(allowed))
    assert got == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("seed", range(12))
def test_null_tokens_training_nodes_leave_the_incorrect_entities_out(seed):
    """With null tokens every node the filter keeps is a training node, but one whose label is
    known to be wrong at its span; the loss is the enumeration's over the other nodes."""
    K, C, gold, known, lengths, grid, unknown, local = _grid_case(seed, 1)
    rng = random.Random(seed + 100)
    wrong_rows = _incorrect(rng, int(lengths[0]), K, gold, known)
    _favour(local, wrong_rows, rng)
    wrong = incorrect_label_grid(_rows(wrong_rows), lengths, grid, C) & unknown.unsqueeze(-1)
    mask, labels = training_nodes(local, lengths, grid, overlapping_only=False, incorrect=wrong)
    plain, plain_labels = training_nodes(local, lengths, grid, overlapping_only=False)
    dropped = {(s, s + w, int(plain_labels[0, s, w]))
               for s, w in (plain & ~mask)[0].nonzero().tolist()}
    ruled_out = {(s, e, c) for s, e, c in wrong_rows if not any(known[s:e + 1])}
    kept_wrong = {(s, e, c) for s, e, c in ruled_out
                  if bool(plain[0, s, e - s]) and int(plain_labels[0, s, e - s]) == c}
    assert dropped == kept_wrong
    assert torch.equal(labels, plain_labels * mask)


def test_incorrect_entities_are_checked_and_refused_by_the_linear_crf():
    head, X, lengths, gold, known = _batch("SemiCRF")
    known[0, 3:] = False
    with pytest.raises(ValueError, match="^an incorrect span is also a gold span with the same "
                       "label: an entity cannot be annotated as right and as wrong$"):
        head(X, lengths, gold, known=known, incorrect=torch.tensor([[0, 1, 2, 1]]))
    with pytest.raises(ValueError, match="^incorrect span of width 4 exceeds max_width=3$"):
        head(X, lengths, gold, known=known, incorrect=torch.tensor([[0, 2, 5, 1]]))
    with pytest.raises(TypeError, match="^incorrect spans must be a tensor"):
        head(X, lengths, gold, known=known, incorrect=[[0, 3, 4, 1]])
    for arch in ("SemiCRF", "Filtered"):  # (a label past the head's: no IndexError)
        other, *_ = _batch(arch)
        with pytest.raises(ValueError, match=f"^incorrect span label {N_LABELS + 1} is not "
                           f"one of the {N_LABELS} labels$"):
            other(X, lengths, gold, known=known, incorrect=torch.tensor([[0, 3, 4, N_LABELS + 1]]))
    with torch.no_grad():  # a wrong entity on unknown tokens rules paths out: a higher loss
        plain = float(head(X, lengths, gold, known=known))
        ruled = float(head(X, lengths, gold, known=known, incorrect=torch.tensor([[0, 3, 4, 1]])))
        assert ruled > plain
        # on known tokens the annotation already rules it out
        assert float(head(X, lengths, gold, known=known,
                          incorrect=torch.tensor([[1, 1, 2, 1]]))) == plain
        for arch in ("SemiCRF", "Filtered"):  # and so on a fully annotated batch
            other, *_ = _batch(arch)
            assert torch.equal(other(X, lengths, gold, incorrect=torch.tensor([[0, 3, 4, 1]])),
                               other(X, lengths, gold))
    crf, X, lengths, gold, known = _batch("LinearCRF")
    with pytest.raises(ValueError, match="^the linear CRF head cannot learn from incorrect "
                       "spans"):
        crf(X, lengths, gold, known=known, incorrect=torch.tensor([[0, 3, 4, 1]]))
    empty = torch.zeros((0, 4), dtype=torch.long)
    assert torch.equal(crf(X, lengths, gold, known=known, incorrect=empty),
                       crf(X, lengths, gold, known=known))


# ----------------------------------------------------------------------------- the component

def _pipeline(arch: str = "spacy-fsemicrf.FilteredSemiCRF.v1", incorrect_spans_key=None,
              **settings):
    import spacy

    from .conftest import LABELS, model_config

    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner", config={"model": model_config(arch, **settings),
                                               "incorrect_spans_key": incorrect_spans_key})
    for label in LABELS:
        ner.add_label(label)
    return nlp, ner


def _example(nlp, words, ents, predicted_words=None):
    from spacy.tokens import Doc
    from spacy.training import Example

    reference = Doc(nlp.vocab, words=words, ents=ents)
    predicted = Doc(nlp.vocab, words=predicted_words or words)
    return Example(predicted, reference)


def test_the_component_reads_tokens_without_annotation_as_unknown():
    nlp, ner = _pipeline()
    words = ["John", "flew", "to", "Paris", "with", "Mary", "Lee", "."]
    full = _example(nlp, words, ["B-PER", "O", "O", "B-LOC", "O", "B-PER", "I-PER", "O"])
    partial = _example(nlp, words, ["B-PER", "O", "O", "B-LOC", "", "", "", ""])
    nlp.initialize(lambda: [full])
    gold, mask, known, _ = ner._gold([full, partial])
    assert mask.tolist() == [True, True]
    assert known[0] is None
    assert known[1].tolist() == [True] * 4 + [False] * 4
    assert ner._gold([full, full]).known is None  # fully annotated: the loss is as before
    # the corpus splits "Mary-Lee" in three, the pipeline's tokenizer not: the predicted
    # token is unknown where one of its corpus tokens is
    split = _example(nlp, ["Mary", "-", "Lee", "left"], ["", "O", "O", "O"],
                     predicted_words=["Mary-Lee", "left"])
    assert [k.tolist() for k in ner._gold([split]).known] == [[False, True]]


def test_only_the_tokens_of_an_entity_off_the_predicted_tokens_are_unknown():
    """"Par is" is one predicted token, and the predicted text has a double space after
    "Hilton" (a whitespace token, aligned to no corpus token): the entity "is Hilton" is left
    out and its tokens are unknown, the entities after the double space are kept."""
    from spacy.tokens import Doc
    from spacy.training import Example

    nlp, ner = _pipeline()
    reference = Doc(nlp.vocab, words=["Par", "is", "Hilton", "met", "Anna", "in", "Rome"],
                    spaces=[False, True, True, True, True, True, False],
                    ents=["O", "B-PER", "I-PER", "O", "B-PER", "O", "B-LOC"])
    eg = Example(nlp.make_doc("Paris Hilton  met Anna in Rome"), reference)
    nlp.initialize(lambda: [eg])
    gold, _, known, _ = ner._gold([eg])
    per, loc = ner.labels.index("PER") + 1, ner.labels.index("LOC") + 1
    assert gold.tolist() == [[0, 4, 4, per], [0, 6, 6, loc]] and ner.n_misaligned_dropped == 1
    assert known[0].tolist() == [False, False, True, True, True, True, True]


def test_a_whitespace_token_without_annotation_is_outside_any_entity_as_for_spacy():
    """spaCy's ner reads an unannotated whitespace token as O (get_aligned_ner), the
    component too; the tokens around it stay unknown."""
    nlp, ner = _pipeline()
    eg = _example(nlp, ["Anna", "met", "\n", "Bob", "there"], ["B-PER", "O", "", "", ""])
    nlp.initialize(lambda: [eg])
    assert eg.get_aligned_ner() == ["U-PER", "O", "O", None, None]
    assert ner._gold([eg]).known[0].tolist() == [True, True, True, False, False]


def test_a_reference_token_no_predicted_token_covers_leaves_every_token_known():
    """An unannotated whitespace token of the corpus that the pipeline's tokenizer leaves out
    is no predicted token: every predicted token is known, which reads as None."""
    import spacy
    from spacy.tokens import Doc
    from spacy.training import Example

    from spacy_fsemicrf.partial import known_tokens

    vocab = spacy.blank("en").vocab
    reference = Doc(vocab, words=["Hello", " ", "Mary"], spaces=[True, False, False],
                    ents=["O", "", "B-PER"])
    predicted = Doc(vocab, words=["Hello", "Mary"])
    assert known_tokens(Example(predicted, reference)) is None


def test_an_aligned_entity_after_a_whitespace_token_stays_known_beside_a_misaligned_one():
    """The corpus has a whitespace token the pipeline's tokenizer leaves out, so "John" starts
    at another character in each doc: it is aligned all the same, trains as annotated and is
    no misaligned entity, while "Mary-" (no token edge of the predicted doc) is one."""
    from spacy.tokens import Doc
    from spacy.training import Example

    nlp, ner = _pipeline()
    reference = Doc(nlp.vocab, words=["Mary", "-", "Lee", "met", " ", "John"],
                    spaces=[False, False, True, True, False, False],
                    ents=["B-PER", "I-PER", "O", "O", "O", "B-PER"])
    eg = Example(Doc(nlp.vocab, words=["Mary-Lee", "met", "John"]), reference)
    nlp.initialize(lambda: [eg])
    gold, _, known, _ = ner._gold([eg])
    assert gold.tolist() == [[0, 2, 2, ner.labels.index("PER") + 1]]
    assert known[0].tolist() == [False, True, True] and ner.n_misaligned_dropped == 1
    nlp.update([eg])  # (a gold entity on an unknown token is refused)


def test_a_gold_entity_wider_than_the_span_heads_reach_is_unknown_there():
    words = ["The", "United", "Nations", "Security", "Council", "met", "."]
    ents = ["O", "B-ORG", "I-ORG", "I-ORG", "I-ORG", "O", "O"]
    nlp, ner = _pipeline(max_width=2)
    eg = _example(nlp, words, ents)
    nlp.initialize(lambda: [eg])
    gold, _, known, _ = ner._gold([eg])
    assert gold.tolist() == [] and known[0].tolist() == [True] + [False] * 4 + [True] * 2
    nlp, ner = _pipeline("spacy-fsemicrf.LinearCRF.v1", max_width=2)  # tags: no width limit
    nlp.initialize(lambda: [eg])
    gold, _, known, _ = ner._gold([eg])
    assert gold.tolist() == [[0, 1, 4, ner.labels.index("ORG") + 1]] and known is None


@pytest.mark.parametrize("arch, settings", [("FilteredSemiCRF", {}), ("SemiCRF", {}),
                                            ("LinearCRF", {}),
                                            ("FilteredSemiCRF", {"null_tokens": True})])
def test_a_pipeline_learns_from_partly_annotated_documents(arch, settings):
    """Each training text twice, once with its second half unannotated: training runs, its
    loss falls, and the pipeline finds the training entities."""
    from .conftest import TRAIN_DATA, gold_set, make_examples, predicted_set, train_pipeline

    nlp, _ = _pipeline(f"spacy-fsemicrf.{arch}.v1", **settings)
    examples = make_examples(nlp)
    for eg in make_examples(nlp):
        tokens = list(eg.reference)
        half = len(tokens) // 2
        while half < len(tokens) and tokens[half].ent_iob_ == "I":  # (no entity cut in two)
            half += 1
        ents = [f"{t.ent_iob_}-{t.ent_type_}" if t.ent_type_ else "O" for t in tokens[:half]]
        examples.append(_example(nlp, [t.text for t in tokens], ents + [""] * (len(tokens) - half)))
    losses = train_pipeline(nlp, examples, n_iter=40)
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0] / 4
    docs = list(nlp.pipe([text for text, _ in TRAIN_DATA]))
    assert predicted_set(docs) == gold_set(nlp)


def test_a_document_without_flags_is_known_on_every_token_in_the_padded_batch():
    """The component gives None for a fully annotated document beside a partly annotated one:
    its row of the head's ``known`` is True on its tokens (0 at padding, which is not read)."""
    import numpy

    from spacy_fsemicrf.head_model import _pad_rows

    rows = [None, numpy.array([True, False]), None]
    padded = _pad_rows(rows, numpy.array([3, 2, 0]), 3, "bool", missing=True)
    assert padded.tolist() == [[True, True, True], [True, False, False], [False] * 3]


# ------------------------------------------------ the component's entities known to be wrong

def _rejected(nlp, words, ents, wrong, key="incorrect_spans"):
    """An example whose reference has ``ents`` (IOB, "" unannotated; None: no annotation at
    all) and the spans ``wrong`` ``(start, end exclusive, label)`` known to be wrong."""
    from spacy.tokens import Doc, Span
    from spacy.training import Example

    reference = Doc(nlp.vocab, words=words, ents=ents)
    reference.spans[key] = [Span(reference, s, e, label=c) for s, e, c in wrong]
    return Example(Doc(nlp.vocab, words=words), reference)


def test_the_component_reads_entities_known_to_be_wrong():
    """A rejected suggestion of binary annotation: a document without entity annotation but
    with a span known to be wrong is annotated (unknown tokens but whitespace) and gives an
    incorrect row; those the component could never predict (a label it does not have, wider
    than max_width, edges off the predicted tokens) are left out."""
    nlp, ner = _pipeline(max_width=2, incorrect_spans_key="incorrect_spans")
    words = ["Paris", "Hilton", "stayed", "in", "\n", "New", "York", "City"]
    eg = _rejected(nlp, words, None, [(0, 2, "LOC"), (0, 1, "MISC"), (5, 8, "ORG")])
    nlp.initialize(lambda: [eg])
    gold = ner._gold([eg])
    assert gold.rows.tolist() == [] and gold.mask.tolist() == [True]
    assert gold.known[0].tolist() == [False] * 4 + [True] + [False] * 3
    assert gold.incorrect.tolist() == [[0, 0, 1, ner.labels.index("LOC") + 1]]
    plain = _example(nlp, words[:3], ["B-PER", "O", "O"])
    assert ner._gold([plain]).incorrect is None  # none: as without the setting
    without = _rejected(nlp, words, None, [(0, 2, "LOC")], key="other")
    assert ner._gold([without]).mask.tolist() == [False]


def test_a_partly_annotated_document_keeps_its_entities_beside_the_wrong_ones():
    nlp, ner = _pipeline(incorrect_spans_key="incorrect_spans")
    words = ["Ann", "met", "Paris", "Hilton", "today"]
    eg = _rejected(nlp, words, ["B-PER", "O", "", "", ""], [(2, 4, "PER"), (2, 3, "LOC")])
    nlp.initialize(lambda: [eg])
    gold = ner._gold([_rejected(nlp, words, ["O"] * 5, []), eg])
    per, loc = ner.labels.index("PER") + 1, ner.labels.index("LOC") + 1
    assert gold.rows.tolist() == [[1, 0, 0, per]]
    assert gold.incorrect.tolist() == [[1, 2, 2, loc], [1, 2, 3, per]]
    assert gold.known[1].tolist() == [True, True, False, False, False]
    with pytest.raises(ValueError, match=r"^\[fsemicrf_ner\] The entity 'Ann' \(PER\) is in a "
                       r"training example's doc.ents and in its doc.spans\['incorrect_spans'\]"):
        ner._gold([_rejected(nlp, words, ["B-PER", "O", "", "", ""], [(0, 1, "PER")])])


def test_the_linear_crf_and_a_bad_key_are_refused():
    with pytest.raises(ValueError, match=r"^\[fsemicrf_ner\] incorrect_spans_key needs a span "
                       r"head \(FilteredSemiCRF, SemiCRF\)"):
        _pipeline("spacy-fsemicrf.LinearCRF.v1", incorrect_spans_key="incorrect_spans")
    message = "^incorrect_spans_key must be None or a non-empty string, got "
    with pytest.raises(ValueError, match=message + "''$"):
        _pipeline(incorrect_spans_key="")
    _, ner = _pipeline()  # (spaCy's config refuses a number there)
    with pytest.raises(ValueError, match=message + "3$"):
        ner.incorrect_spans_key = 3


@pytest.mark.parametrize("arch, settings", [("FilteredSemiCRF", {}), ("SemiCRF", {}),
                                            ("FilteredSemiCRF", {"null_tokens": True}),
                                            ("FilteredSemiCRF", {"exact_loss": 0.5})])
def test_a_pipeline_learns_that_a_rejected_entity_is_wrong(arch, settings):
    """The training texts with their entities, and texts in which "Paris" (a LOC elsewhere) is
    rejected as LOC with nothing else annotated: the loss stays finite and the pipeline learns
    not to call that "Paris" a LOC, which it does without the rejections."""
    from .conftest import make_examples, train_pipeline

    def paris(with_rejections):
        nlp, ner = _pipeline(f"spacy-fsemicrf.{arch}.v1", incorrect_spans_key="incorrect_spans",
                             **settings)
        examples = make_examples(nlp)
        for text in ("She flew to Paris .", "Paris is big .", "We love Paris ."):
            words = text.split()
            examples.append(_example(nlp, words, ["B-LOC" if w == "Paris" else "O"
                                                  for w in words]))
        words = ["Paris", "said", "hello", "."]
        if with_rejections:
            examples += [_rejected(nlp, words, None, [(0, 1, "LOC")])] * 3
        losses = train_pipeline(nlp, examples, n_iter=30)
        assert all(math.isfinite(v) for v in losses)
        return [(e.text, e.label_) for e in nlp(" ".join(words)).ents]

    assert ("Paris", "LOC") in paris(False)
    assert ("Paris", "LOC") not in paris(True)
