"""No entity across a sentence boundary: the heads' ``sentence_starts`` against enumeration of
the segmentations (tag sequences) that keep every entity inside one sentence."""
import math
import re
from pathlib import Path

import pytest
import spacy
import torch
from spacy.tokens import Doc, DocBin, Span

from spacy_fsemicrf.doc_constraints import sentence_start_flags, sentence_starts
from spacy_fsemicrf.structured.heads import FilteredSemiCRFHead, LinearCRFHead, SemiCRFHead
from spacy_fsemicrf.structured.prediction import DecodeOptions
from spacy_fsemicrf.structured.spans import crossing_spans

from .bruteforce import (
    _logsumexp,
    entities_by_definition,
    segmentation_score,
    segmentations,
    tag_sequence_score,
    tag_sequences,
)
from .conftest import make_examples, model_config, train_pipeline

ALL = DecodeOptions(path=True, candidates=True)
D, M, K = 5, 2, 3


def _batch(seed: int):
    """Token vectors of two documents (one padded), sentence starts at random tokens."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 4])
    X = torch.randn((2, 6, D), generator=gen, dtype=torch.float64)
    starts = torch.rand((2, 6), generator=gen) < 0.4
    starts[1, 4:] = False  # (padding)
    return X, lengths, starts


def _crosses(start: int, end: int, starts) -> bool:
    return any(bool(starts[t]) for t in range(start + 1, end + 1))


def _scaled(head: torch.nn.Module, seed: int) -> torch.nn.Module:
    """``head`` in float64 with large random weights, so that entities of every width win."""
    torch.manual_seed(seed)
    head = head.double().eval()
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn_like(p) * 2)
    return head


@pytest.mark.parametrize("seed", range(5))
def test_crossing_spans_are_those_with_a_sentence_start_after_their_first_token(seed):
    gen = torch.Generator().manual_seed(seed)
    starts = torch.rand((3, 7), generator=gen) < 0.3
    crossing = crossing_spans(starts, 4)
    for b in range(3):
        for i in range(7):
            for w in range(4):
                assert bool(crossing[b, i, w]) == _crosses(i, min(i + w, 6), starts[b])


def test_documents_of_no_token_or_one_cross_nothing():
    assert crossing_spans(torch.ones((2, 0), dtype=torch.bool), 3).shape == (2, 0, 3)
    one = crossing_spans(torch.ones((2, 1), dtype=torch.bool), 3)
    assert one.shape == (2, 1, 3) and not one.any()


@pytest.mark.parametrize("bad, got", [
    (torch.zeros((2, 6)), "Tensor torch.float32 (2, 6)"),
    (torch.zeros((2, 5), dtype=torch.bool), "Tensor torch.bool (2, 5)"),
    ([[True] * 6] * 2, "list  ()"),
])
def test_sentence_starts_that_are_not_a_bool_tensor_of_the_batch_are_refused(bad, got):
    """The error says what the batch needs and what it was given."""
    X, lengths, _ = _batch(0)
    message = (r"^sentence_starts must be a BoolTensor \[2, 6\], True at the tokens that start "
               rf"a sentence, got {re.escape(got)}$")
    for head in (FilteredSemiCRFHead(D, M, max_width=K), SemiCRFHead(D, M, max_width=K),
                 LinearCRFHead(D, M, max_width=K)):
        with pytest.raises(ValueError, match=message):
            head.double().eval()(X, lengths, sentence_starts=bad)
    with pytest.raises(ValueError, match=r"^sentence_starts must be a BoolTensor \[B, L\], "):
        crossing_spans(torch.zeros((2, 6)), K)


def _agrees_with_enumeration(found, ranked, b: int, paths, starts) -> None:
    """Document ``b``'s prediction (``found``, n-best ``ranked``) against ``paths``, its
    structures that keep every entity in one sentence as ``(entities, score)``: the best
    one's entities and probability, each entity's confidence (the probability of the
    structures holding it), the n-best scores, and candidates that cross nothing."""
    log_z = _logsumexp([v for _, v in paths])
    best, best_score = max(paths, key=lambda p: p[1])
    rows = [row for row in found.spans.tolist() if row[0] == b]
    assert [tuple(r[1:]) for r in rows] == sorted(best)
    assert float(found.path[b]) == pytest.approx(math.exp(best_score - log_z), abs=1e-6)
    for row, conf in zip(found.spans.tolist(), found.scores.tolist()):
        if row[0] == b:
            want = sum(math.exp(v - log_z) for ents, v in paths if tuple(row[1:]) in ents)
            assert conf == pytest.approx(want, abs=1e-6)
    for row in found.candidates[0].tolist():
        assert row[0] != b or not _crosses(row[1], row[2], starts[b])
    top = sorted((v for _, v in paths), reverse=True)[:4]
    assert [seg.score for seg in ranked[b]] == pytest.approx(top, abs=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_the_semicrf_decodes_and_ranks_the_segmentations_within_sentences(seed):
    X, lengths, starts = _batch(seed)
    head = _scaled(SemiCRFHead(D, M, max_width=K, transitions=True), seed)
    T = head.transitions.detach()
    with torch.no_grad():
        scores = head.span_scores(X, lengths)
        found = head.decode(scores, lengths, ALL, starts)
        ranked = head.nbest(X, lengths, 4, sentence_starts=starts)
    for b in range(2):
        paths = [([seg for seg in segs if seg[2]], segmentation_score(scores[b], segs, T))
                 for segs in segmentations(int(lengths[b]), K, M + 1)
                 if not any(c and _crosses(s, e, starts[b]) for s, e, c in segs)]
        _agrees_with_enumeration(found, ranked, b, paths, starts)


@pytest.mark.parametrize("scheme", ["BIO", "BILUO"])
@pytest.mark.parametrize("seed", range(4))
def test_the_linear_crf_decodes_and_ranks_the_tag_sequences_within_sentences(scheme, seed):
    X, lengths, starts = _batch(seed)
    head = _scaled(LinearCRFHead(D, M, max_width=K, scheme=scheme), seed)
    sch, T = head.scheme, head.transitions.detach()
    with torch.no_grad():
        emissions = head.emissions(X, lengths)
        found = head.decode(emissions, lengths, ALL, starts)
        ranked = head.nbest(X, lengths, 4, sentence_starts=starts)
    for b in range(2):
        paths = []
        for tags in tag_sequences(int(lengths[b]), sch.n_tags, sch.allowed):
            spans = entities_by_definition(tags, sch.names, scheme)
            if not any(_crosses(s, e, starts[b]) for s, e, _ in spans):
                paths.append((spans, tag_sequence_score(emissions[b], T, tags)))
        _agrees_with_enumeration(found, ranked, b, paths, starts)


@pytest.mark.parametrize("transitions", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_the_filtered_head_treats_a_crossing_span_as_one_its_filter_left_out(transitions, seed):
    """The same graph, entities, confidences, path probabilities, candidates and n-best as
    when the local classifier calls every crossing span null."""
    X, lengths, starts = _batch(seed)
    head = _scaled(FilteredSemiCRFHead(D, M, max_width=K, transitions=transitions), seed)
    with torch.no_grad():
        tokens, local, glob = head._encode(X, lengths)
        crossing = crossing_spans(starts, K).unsqueeze(-1)
        nulled = local.clone()
        nulled[..., 1:] = local[..., 1:].masked_fill(crossing, -1e6)
        found = head.decode(local, glob, lengths, 2.0, ALL, tokens, starts)
        want = head.decode(nulled, glob, lengths, 2.0, ALL, tokens)
    assert torch.equal(found.spans, want.spans) and torch.equal(found.path, want.path)
    assert torch.equal(found.candidates[0], want.candidates[0])
    # the confidences' local probability reads the kept nodes' own scores, which are the same
    assert torch.allclose(found.scores, want.scores, atol=1e-12)
    for doc, start, end, _ in found.candidates[0].tolist():
        assert not _crosses(start, end, starts[doc])
    ranked = head.nbest(X, lengths, 5, 2.0, sentence_starts=starts)
    for b, segs in enumerate(ranked):
        for seg in segs:
            assert not any(_crosses(s, e, starts[b]) for s, e, _ in seg.spans)


def test_the_filtered_head_gives_the_graph_without_the_crossing_node_not_a_restriction():
    """Node ``0..0`` and node ``1..2`` make the graph's one path; with a sentence starting at
    token 2 the path of ``0..0`` alone, which the whole graph gave no probability, has
    probability 1 (docs/algorithm.md §5)."""
    head = FilteredSemiCRFHead(D, M, max_width=K).double().eval()
    local = torch.zeros((1, 3, K, M + 1), dtype=torch.float64)
    local[..., 0] = 10.0  # every span null but the two nodes
    local[0, 0, 0, 1] = local[0, 1, 1, 1] = 20.0
    glob = torch.zeros_like(local)
    lengths, starts = torch.tensor([3]), torch.tensor([[False, False, True]])
    with torch.no_grad():
        whole = head.decode(local, glob, lengths, 0.0, ALL)
        split = head.decode(local, glob, lengths, 0.0, ALL, sentence_starts=starts)
    assert whole.spans.tolist() == [[0, 0, 0, 1], [0, 1, 2, 1]] and float(whole.path[0]) == 1.0
    assert split.spans.tolist() == [[0, 0, 0, 1]] and float(split.path[0]) == 1.0


# ----------------------------------------------------------------------------- the component

ARCHS = ["spacy-fsemicrf.FilteredSemiCRF.v1", "spacy-fsemicrf.SemiCRF.v1",
         "spacy-fsemicrf.LinearCRF.v1"]
TEXT = "John Smith works for Google in Paris ."


@pytest.fixture(scope="module", params=ARCHS)
def trained(request):
    nlp = spacy.blank("en")
    nlp.add_pipe("fsemicrf_ner", config={"model": model_config(request.param),
                                         "candidates_key": "cands"})
    train_pipeline(nlp, make_examples(nlp), n_iter=40)
    return nlp


def _with_starts(nlp, text: str, starts) -> Doc:
    doc = nlp.make_doc(text)
    for i, token in enumerate(doc):
        token.is_sent_start = i in starts
    return doc


def _crossing(doc: Doc, spans) -> list:
    return [s.text for s in spans if any(doc[i].is_sent_start for i in range(s.start + 1, s.end))]


def test_no_entity_crosses_a_sentence_boundary_of_the_document(trained):
    """As spaCy's ``ner``: a sentence boundary inside "John Smith" leaves it no entity, in
    ``doc.ents``, the spans group, the candidates and the n-best alike."""
    assert "John Smith" in [e.text for e in trained(TEXT).ents]
    doc = trained(_with_starts(trained, TEXT, {0, 1}))
    assert not _crossing(doc, doc.ents) and "John Smith" not in [e.text for e in doc.ents]
    assert not _crossing(doc, doc.spans["fsemicrf"]) and not _crossing(doc, doc.spans["cands"])
    for group in trained.get_pipe("fsemicrf_ner").nbest(doc, 5):
        assert not _crossing(doc, group)
    # a boundary before the name changes nothing it holds
    doc = trained(_with_starts(trained, TEXT, {0, 2}))
    assert "John Smith" in [e.text for e in doc.ents]


def test_the_sentences_of_a_user_hook_are_read_as_doc_sents_gives_them(trained):
    """A ``doc.user_hooks["sents"]`` hook sets no SENT_START: its sentences are read from
    ``doc.sents``, for the entities and for the constraints of scope "sentence" alike."""
    doc = trained.make_doc(TEXT)
    doc.user_hooks["sents"] = lambda d: iter([d[0:1], d[1:]])
    assert sentence_starts(doc) == (0, 1)
    assert "John Smith" not in [e.text for e in trained(doc).ents]
    empty = trained.make_doc("")
    empty.user_hooks["sents"] = lambda d: iter([])
    assert sentence_starts(empty) == () and not sentence_start_flags(empty).size


def test_documents_with_and_without_sentences_in_one_batch_predict_as_alone(trained):
    texts = [TEXT, "Mary flew to Berlin on Monday .", TEXT + " " + TEXT, "Laura Palmer left ."]
    starts = [{0, 1}, None, {0, 4, 9}, {0, 1, 2}]

    def docs():
        return [trained.make_doc(t) if s is None else _with_starts(trained, t, s)
                for t, s in zip(texts, starts)]

    alone = [trained(doc) for doc in docs()]
    together = list(trained.pipe(docs(), batch_size=4))
    for a, b in zip(alone, together):
        assert [(e.start, e.end, e.label_) for e in a.ents] == [
            (e.start, e.end, e.label_) for e in b.ents]
        assert not _crossing(b, b.ents)


def test_a_span_forced_across_a_sentence_boundary_cannot_be_met(trained):
    """The same report for the three heads: infeasible, naming the span and the boundary
    (the filtered head decoded it as an entity, the others said no segmentation obeyed)."""
    ner = trained.get_pipe("fsemicrf_ner")
    ner.constraints = [{"kind": "force_span", "start": 0, "end": 2, "label": "PER"}]
    try:
        doc = trained(_with_starts(trained, TEXT, {0, 1}))
        unconstrained = trained(TEXT)
    finally:
        ner.constraints = []
    report = doc.spans["fsemicrf"].attrs["constraints"]
    assert report["status"] == "infeasible"
    assert report["reason"] == "force_span 0..2 crosses a sentence boundary"
    assert not _crossing(doc, doc.ents)
    assert unconstrained.spans["fsemicrf"].attrs["constraints"]["status"] in (
        "satisfied", "optimal")


def test_the_benchmark_counts_no_crossing_entity_with_the_boundaries_given(
        trained, tmp_path, capsys):
    """``benchmarks/sentence_boundaries.py`` on two sentences run together, the second
    starting inside the name "John Smith" of a corpus that puts a boundary there."""
    import importlib.util

    trained.to_disk(tmp_path / "model")
    gold = _with_starts(trained, TEXT, {0, 1})
    gold.ents = [Span(gold, 0, 1, "PER"), Span(gold, 1, 2, "PER")]
    DocBin(docs=[gold]).to_disk(tmp_path / "test.spacy")
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "sentence_boundaries.py"
    spec = importlib.util.spec_from_file_location("sentence_boundaries", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--models", f"m={tmp_path / 'model'}", "--test", str(tmp_path / "test.spacy")])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("m, sentence boundaries not given: 1 of ")  # "John Smith"
    assert lines[1].startswith("m, sentence boundaries given: 0 of ")


def test_spans_forced_from_a_sentence_start_are_met(trained):
    """A boundary at a forced span's first token is no crossing: "John Smith" and "Google"
    each open a sentence, and both are written."""
    ner = trained.get_pipe("fsemicrf_ner")
    ner.constraints = [{"kind": "force_span", "start": 0, "end": 2, "label": "PER"},
                       {"kind": "force_span", "start": 4, "end": 5, "label": "ORG"}]
    try:
        doc = trained(_with_starts(trained, TEXT, {0, 4}))
    finally:
        ner.constraints = []
    assert doc.spans["fsemicrf"].attrs["constraints"]["status"] != "infeasible"
    ents = [(e.text, e.label_) for e in doc.ents]
    assert ("John Smith", "PER") in ents and ("Google", "ORG") in ents


def test_a_batch_of_documents_of_one_sentence_gives_the_heads_no_sentence_starts():
    """spaCy says a document of 0 or 1 token has sentence boundaries, and a sentencizer marks
    the first token of a one-sentence text: none of them has a boundary to keep an entity
    from, so such a batch is decoded as one without sentences, at no extra cost."""
    from spacy_fsemicrf.architectures import sentence_flags

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    single = [nlp.make_doc(""), nlp.make_doc("Paris"), nlp("John Smith works for Google .")]
    assert all(doc.has_annotation("SENT_START") for doc in single)
    assert sentence_flags(single) is None
    two = nlp("John Smith left . Mary stayed .")
    flags = sentence_flags(single + [two])
    assert flags[-1].tolist() == [True, False, False, False, True, False, False]
