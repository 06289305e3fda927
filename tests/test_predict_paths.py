"""The shortcuts of the prediction path give what the general code gives: documents without
padding skip the padding masks and copies, fresh documents get their entities written
without building the spans of the uncovered tokens."""
import numpy
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
from spacy.tokens import Doc, Span
from spacy.vocab import Vocab
from thinc.api import Model, NumpyOps

from spacy_fsemicrf.component import _doc_bounds, set_entities
from spacy_fsemicrf.head_model import _in_batch_order, _merge_rows, _pad, _pad_rows
import pytest

from spacy_fsemicrf.structured import heads as heads_module
from spacy_fsemicrf.structured.heads import _SpanScorer
from spacy_fsemicrf.structured.spans import SPAN_REPRS, document_mean, same_word_mean


def _width_model(width: int) -> Model:
    return Model("pad", lambda model, X, is_train: (X, None), dims={"nI": width}, ops=NumpyOps())


def test_pad_without_padding_equals_the_row_by_row_copy():
    rng = numpy.random.default_rng(0)
    Xs = [rng.normal(size=(4, 3)).astype("float32") for _ in range(3)]
    lengths = numpy.array([4, 4, 4])
    got = _pad(_width_model(3), Xs, lengths)
    assert got.dtype == numpy.float32 and got.shape == (3, 4, 3)
    assert numpy.array_equal(got, numpy.stack(Xs))
    # one shorter document: the padded rows are zero
    mixed = _pad(_width_model(3), Xs[:2] + [Xs[2][:2]], numpy.array([4, 4, 2]))
    assert numpy.array_equal(mixed[2, :2], Xs[2][:2]) and not mixed[2, 2:].any()
    words = [numpy.arange(4) + i for i in range(3)]
    assert numpy.array_equal(_pad_rows(words, lengths, 4), numpy.stack(words))
    padded = _pad_rows(words[:2] + [words[2][:2]], numpy.array([4, 4, 2]), 4)
    assert padded[2].tolist() == [2, 3, 0, 0]


def test_document_mean_without_padding_is_the_masked_mean_bit_for_bit():
    x = torch.randn(3, 7, 5)
    lengths = torch.tensor([7, 7, 7])
    assert torch.equal(document_mean(x, lengths, padded=False), document_mean(x, lengths))


def test_span_scorer_of_unpadded_documents_matches_them_padded():
    """Scoring documents of one length (no masks) gives the scores that the same documents get
    in a batch padded by a longer one (masked), on every span inside them."""
    torch.manual_seed(0)
    scorer = _SpanScorer(6, 4, 3, 8, "sum_endpoints_neighbors", 0.0, doc_vector=True).eval()
    x = torch.randn(2, 5, 6)
    longer = torch.randn(1, 9, 6)
    padded = torch.cat([torch.nn.functional.pad(x, (0, 0, 0, 4)), longer])
    with torch.no_grad():
        alone = scorer(x, torch.tensor([5, 5]))
        together = scorer(padded, torch.tensor([5, 5, 9]))
    for w in range(3):  # spans that end inside the documents
        assert torch.equal(alone[:, : 5 - w, w], together[:2, : 5 - w, w])


@pytest.mark.parametrize("span_repr", SPAN_REPRS)
@pytest.mark.parametrize("doc_vector,span_norm,hidden_depth", [(False, False, 1), (True, True, 2)])
@pytest.mark.parametrize("batch,length", [(7, 5), (2, 45), (1, 3)])
def test_span_scorer_in_chunks_equals_one_piece_bit_for_bit(
    monkeypatch, span_repr, doc_vector, span_norm, hidden_depth, batch, length
):
    """Prediction on a CPU builds the span representations a chunk at a time (whole short
    documents, or part of a long one): every score is the one the whole batch in one piece
    (the training path) gives, bit for bit, in the same label-major layout."""
    torch.manual_seed(0)
    scorer = _SpanScorer(6, 5, 4, 16, span_repr, 0.0, hidden_depth, span_norm, doc_vector).eval()
    x = torch.randn(batch, length, 6)
    lengths = torch.randint(1, length + 1, (batch,))
    lengths[0] = length
    # 64 spans a chunk: 16 positions of 4 widths, with chunk columns well past the lengths
    # below which a matrix product may round differently
    monkeypatch.setattr(heads_module, "PREDICT_CHUNK_ELEMENTS", 64 * 16)
    with torch.enable_grad():
        whole = scorer(x, lengths).detach()
    with torch.inference_mode():
        chunked = scorer(x, lengths)
    assert torch.equal(chunked, whole)
    assert chunked.stride() == whole.stride()


# a bare vocab, shared: a blank pipeline per hypothesis example cost 50 ms each
_VOCAB = Vocab()


def test_fresh_doc_gets_its_entities_and_o_elsewhere():
    doc = Doc(_VOCAB, words=["a", "b", "c", "d", "e"])
    set_entities(doc, [Span(doc, 1, 3, label="PER"), Span(doc, 4, 5, label="LOC")])
    assert [t.ent_iob_ for t in doc] == ["O", "B", "I", "O", "B"]
    assert [t.ent_type_ for t in doc] == ["", "PER", "PER", "", "LOC"]
    empty = Doc(_VOCAB, words=["a", "b"])
    set_entities(empty, [])
    assert [t.ent_iob_ for t in empty] == ["O", "O"]


def test_doc_bounds_are_each_documents_rows():
    rows = numpy.array([[0, 1, 1, 1], [0, 3, 3, 1], [2, 0, 0, 2]])
    assert _doc_bounds(rows, 4) == [0, 2, 2, 3, 3]
    assert _doc_bounds(numpy.zeros((0, 4), dtype="int64"), 2) == [0, 0, 0]


def test_merge_rows_of_one_group_in_batch_order_keeps_them_as_they_are():
    rows = torch.tensor([[0, 1, 2, 1], [0, 4, 4, 2], [1, 0, 0, 1]])
    values = torch.tensor([0.5, 0.25, 1.0])
    for groups in ([numpy.arange(2)], [numpy.arange(1)], [numpy.arange(3)]):
        assert _in_batch_order(groups)
        got_rows, got_values = _merge_rows([(groups[0], rows, values)], True)
        assert got_rows.tolist() == rows.tolist() and got_values.tolist() == values.tolist()
    # the same group in another order is mapped back to the batch and sorted
    assert not _in_batch_order([numpy.array([1, 0])])
    got_rows, got_values = _merge_rows([(numpy.array([1, 0]), rows, values)], False)
    assert got_rows.tolist() == [[0, 0, 0, 1], [1, 1, 2, 1], [1, 4, 4, 2]]
    assert got_values.tolist() == [1.0, 0.5, 0.25]
    # a single document that is not the batch's first, and two groups, are not in order
    assert not _in_batch_order([numpy.array([1])])
    assert not _in_batch_order([numpy.array([0]), numpy.array([1])])


def test_same_word_mean_of_distinct_words_is_each_token_bit_for_bit():
    """At prediction, documents without padding whose words all differ take a shortcut: the
    same values as the scatter of the general case (which training always runs)."""
    x = torch.randn(2, 4, 3)
    x[0, 0, 0] = -0.0
    words = torch.tensor([[5, 6, 7, 8], [5, 9, 6, 1]])
    lengths = torch.tensor([4, 4])
    with torch.no_grad():
        fast = same_word_mean(x, words, lengths)
    general = same_word_mean(x, words, lengths)  # with autograd on: the scatter
    assert torch.equal(fast, general)
    assert torch.equal(torch.signbit(fast), torch.signbit(general))
    repeated = torch.tensor([[5, 6, 5, 8], [5, 9, 6, 1]])
    with torch.no_grad():
        got = same_word_mean(x, repeated, lengths)
    assert torch.allclose(got[0, 0], (x[0, 0] + x[0, 2]) / 2)


@st.composite
def _annotated_docs(draw):
    """A doc whose tokens are missing, O, in a preset entity or blocked, and predicted spans
    that do not overlap each other."""
    n = draw(st.integers(1, 9))
    state, i = [], 0
    while i < n:
        kind = draw(st.sampled_from(["missing", "O", "entity", "blocked"]))
        width = draw(st.integers(1, min(3, n - i))) if kind == "entity" else 1
        state.append((kind, i, i + width))
        i += width
    predicted, i = [], 0
    while i < n:
        width = draw(st.integers(1, min(3, n - i)))
        if draw(st.booleans()):
            predicted.append((i, i + width, draw(st.sampled_from(["X", "Y"]))))
        i += width
    return n, state, predicted


@given(_annotated_docs())
@settings(max_examples=150, deadline=None)
def test_predicted_entities_fill_what_the_doc_leaves_open(case):
    """set_entities against its rule written out token by token: preset entities and blocked
    tokens stay, a predicted entity over any of their tokens is dropped, the others are
    written, and every token still without entity information becomes O."""
    n, state, predicted = case
    doc = Doc(_VOCAB, words=[f"w{i}" for i in range(n)])
    ents = [Span(doc, a, b, label="PRESET") for kind, a, b in state if kind == "entity"]
    blocked = [doc[a:b] for kind, a, b in state if kind == "blocked"]
    outside = [doc[a:b] for kind, a, b in state if kind == "O"]
    doc.set_ents(ents, blocked=blocked, outside=outside, default="missing")
    expected = [(t.ent_iob_, t.ent_type_) for t in doc]
    occupied = {t for kind, a, b in state if kind in ("entity", "blocked") for t in range(a, b)}
    for a, b, label in predicted:
        if not occupied.intersection(range(a, b)):
            expected[a:b] = [("B", label)] + [("I", label)] * (b - a - 1)
    expected = [("O", "") if iob == "" else (iob, typ) for iob, typ in expected]
    set_entities(doc, [Span(doc, a, b, label=label) for a, b, label in predicted])
    assert [(t.ent_iob_, t.ent_type_) for t in doc] == expected
