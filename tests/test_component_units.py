"""Component methods that need no trained model: the report of gold entities too wide to learn
or off the predicted tokens, the loss of a batch, the prediction for documents without tokens."""
import logging
import re
from pathlib import Path

import numpy
import pytest
import spacy
import srsly
import torch
from spacy.tokens import Doc
from spacy.training import Example
from spacy.util import fix_random_seed
from thinc.api import Model

from spacy_fsemicrf.architectures import model_torch_head
from spacy_fsemicrf.doc_constraints import USER_DATA_KEY

try:  # tests/ as a package (tests/__init__.py) or as a plain directory
    from .conftest import make_examples, model_config, one_group_per_document
except ImportError:  # pragma: no cover
    from conftest import make_examples, model_config, one_group_per_document


def _component(arch: str = "spacy-fsemicrf.FilteredSemiCRF.v1", **model):
    """``(nlp, ner)``: a blank English pipeline with fsemicrf_ner on the small tok2vec."""
    nlp = spacy.blank("en")
    return nlp, nlp.add_pipe("fsemicrf_ner", config={"model": model_config(arch, **model)})


def _initialized():
    """``(nlp, examples)``: the pipeline of :func:`_component` without dropout in the head (so
    that a training step and a prediction see the same model), initialized on TRAIN_DATA."""
    nlp, _ = _component(dropout=0.0)
    examples = make_examples(nlp)
    nlp.initialize(lambda: examples)
    return nlp, examples

def test_wide_entities_are_reported_at_each_new_power_of_ten(caplog):
    """One warning when the running count reaches 1, 10, 100, ... (a new digit), with the count
    and the widest entity so far: never silent, never one warning per batch."""
    ner = spacy.blank("en").add_pipe("fsemicrf_ner")
    batches = [(1, 12), (3, 11), (5, 15), (1, 12), (80, 13), (9, 20), (1, 12)]
    warned = []
    for n, widest in batches:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
            ner._report_wide(n, widest)
        warned.append([r.getMessage() for r in caplog.records])
    totals = [1, 4, 9, 10, 90, 99, 100]
    assert [len(w) for w in warned] == [1, 0, 0, 1, 0, 0, 1]
    for (n, total, widest) in [(0, 1, 12), (3, 10, 15), (6, 100, 20)]:
        assert totals[n] == total
        assert warned[n][0] == (
            f"fsemicrf_ner: gold entities wider than max_width={ner.max_width} tokens have been "
            f"left out of training {total} times so far (each update that reads one counts it; "
            f"the loss reads their tokens as unknown); max_width={widest} would keep them all.")
    assert ner.n_wide_dropped == 100 and ner.widest_dropped == 20


def test_initialize_measures_entity_widths_in_the_tokens_it_trains_on(caplog):
    """A corpus segmented into words, a tokenizer that splits characters (Chinese): the width
    that decides whether an entity is learnt is in the predicted document's tokens, and
    initialize's report counts it so (not nothing, from the corpus's two words)."""
    nlp = spacy.blank("zh")
    ner = nlp.add_pipe("fsemicrf_ner", config={"model": model_config(max_width=3)})
    ref = Doc(nlp.vocab, words=["北京", "大学", "在", "海淀", "。"], spaces=[False] * 5,
              ents=["B-ORG", "I-ORG", "O", "B-LOC", "O"])
    example = Example(nlp.make_doc(ref.text), ref)
    assert len(example.predicted) == 8  # a token a character
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        nlp.initialize(lambda: [example])
    assert [r.getMessage() for r in caplog.records] == [
        "fsemicrf_ner: 1 of 2 gold entities in the initialization examples are wider than "
        "max_width=3 tokens and cannot be learned (they are left out of training). "
        "max_width=4 would keep them all.",
        "fsemicrf_ner: every gold entity of the label 'ORG' in the initialization examples is "
        "wider than max_width=3 tokens, so the label is not learned and never predicted (until "
        "training reads one at most 3 tokens wide). max_width=4 would keep them."]
    ner.update([example])
    assert ner.n_wide_dropped == 1  # what training leaves out


def _wide_label_warnings(records) -> list:
    """The labels named by the warnings that a label's gold entities are all too wide."""
    found = (re.match(r"fsemicrf_ner: every gold entity of the label '(\w+)' in (.+) is wider "
                      r"than max_width=3 tokens, so the label is not learned and never "
                      r"predicted \(until training reads one at most 3 tokens wide\)\. "
                      r"max_width=\d+ would keep them\.$", r.getMessage()) for r in records)
    return [(m.group(1), m.group(2)) for m in found if m]


def test_a_label_whose_gold_entities_are_all_too_wide_is_named_once(caplog):
    """A label whose every gold entity is wider than max_width joined the labels, was never
    trained and never predicted, and the warnings only counted wide entities: the user was not
    told that a label could not be learned (at initialize, nor for a label added in training)."""
    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner", config={"model": model_config(max_width=3)})
    wide = [("The Royal Bank of Scotland Group said so .", [(0, 32, "CORP")])]
    examples = make_examples(nlp) + make_examples(nlp, wide)
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        nlp.initialize(lambda: examples)
        assert "CORP" in ner.labels
        assert _wide_label_warnings(caplog.records) == [("CORP", "the initialization examples")]
        caplog.clear()
        nlp.update(examples)  # said once, not at each update
        assert _wide_label_warnings(caplog.records) == []
        gov = make_examples(nlp, [("The United Nations Security Council met .",
                                   [(0, 35, "GOV")])])
        nlp.update(gov)  # a new label, added in training, with wide entities only
        assert "GOV" in ner.labels
        nlp.update(gov)
        assert _wide_label_warnings(caplog.records) == [("GOV", "training so far")]
        caplog.clear()
        narrow = make_examples(nlp, [("The UN met .", [(4, 6, "NGO")]),
                                     ("The United Nations Security Council and UN met .",
                                      [(0, 35, "NGO"), (40, 42, "NGO")])])
        nlp.update(narrow)  # a label with an entity narrow enough in the batch is learned
        assert "NGO" in ner.labels and _wide_label_warnings(caplog.records) == []


def test_the_labels_named_as_too_wide_are_those_without_one_narrow_gold_entity(caplog):
    """The warning gives the widest entity of the label (not the last one read); a label with
    a narrow entity besides wide ones is learned (no warning); a label listed at initialize
    without examples is named when training then meets only wide entities of it."""
    nlp, ner = _component(max_width=3)
    data = [("The Royal Bank of Scotland Group plc said so .", [(0, 36, "CORP")]),  # 7 tokens
            ("The Royal Bank of Scotland said so .", [(0, 26, "CORP")]),  # 5 tokens
            ("The Bank of New York Mellon and Apple met .", [(0, 27, "ORG"), (32, 37, "ORG")])]
    examples = make_examples(nlp, data)
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        ner.initialize(lambda: examples, nlp=nlp, labels=["CORP", "GOV", "ORG"])
        assert _wide_label_warnings(caplog.records) == [("CORP", "the initialization examples")]
        assert _keeping_width(caplog.records) == [7]
        caplog.clear()
        nlp.update(make_examples(nlp, [
            ("The United Nations Security Council of old met .", [(0, 42, "GOV")]),  # 7 tokens
            ("The United Nations Security Council met .", [(0, 35, "GOV")])]))  # 5 tokens
    assert _wide_label_warnings(caplog.records) == [("GOV", "training so far")]
    assert _keeping_width(caplog.records) == [7]


def _keeping_width(records) -> list:
    """The widths that the warnings of :func:`_wide_label_warnings` say would keep a label."""
    return [int(re.search(r"max_width=(\d+) would keep them\.$", r.getMessage()).group(1))
            for r in records if "every gold entity of the label" in r.getMessage()]


LINEAR = "spacy-fsemicrf.LinearCRF.v1"
FILTERED = "spacy-fsemicrf.FilteredSemiCRF.v1"
OFF_TOKENS = ("has an edge inside a token of the documents the pipeline predicts on (the "
              "pipeline's tokenizer splits the text otherwise than the corpus)")
RETOKENIZE = ("[corpora.train] gold_preproc = true (training on the corpus's tokens) or a "
              "tokenizer that splits as the corpus does")


def _off_tokens(nlp, label: str) -> Example:
    """'Paris Hilton won in Rome .' read from a corpus that splits 'Par' 'is': its gold entity
    'is Hilton' (``label``) starts inside the predicted token 'Paris'; 'Rome' (LOC) fits."""
    words = ["Par", "is", "Hilton", "won", "in", "Rome", "."]
    spaces = [False, True, True, True, True, True, False]
    tags = ["O", f"B-{label}", f"L-{label}", "O", "O", "U-LOC", "O"]
    return Example.from_dict(nlp.make_doc("Paris Hilton won in Rome ."),
                             {"words": words, "spaces": spaces, "entities": tags})


def _off_tokens_label_warnings(records) -> list:
    """The labels named by the warnings that a label's gold entities are all off the tokens."""
    found = (re.match(rf"fsemicrf_ner: every gold entity of the label '(\w+)' in (.+) "
                      rf"{re.escape(OFF_TOKENS)}, so the label is not learned and never "
                      rf"predicted \(until training reads one on token edges\)\. "
                      rf"{re.escape(RETOKENIZE)} would keep them\.$", r.getMessage())
             for r in records)
    return [(m.group(1), m.group(2)) for m in found if m]


@pytest.mark.parametrize("arch", [FILTERED, LINEAR])
def test_a_label_whose_gold_entities_are_all_off_the_predicted_tokens_is_named_once(
        arch, caplog):
    """A label whose every gold entity has an edge inside a predicted token joined the labels,
    was never trained and never predicted, and only the count of such entities said so (for
    any head): it is named once, at initialize or when training first meets it; a label with
    one entity on token edges besides is learned, and not named."""
    nlp, ner = _component(arch)
    examples = make_examples(nlp) + [_off_tokens(nlp, "CORP"), _off_tokens(nlp, "PER")]
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        nlp.initialize(lambda: examples)
        assert "CORP" in ner.labels
        assert _off_tokens_label_warnings(caplog.records) == [
            ("CORP", "the initialization examples")]
        caplog.clear()
        nlp.update(examples)  # said once, not at each update
        assert _off_tokens_label_warnings(caplog.records) == []
        gov = [_off_tokens(nlp, "GOV")]
        nlp.update(gov)  # a new label, added in training, with entities off the tokens only
        nlp.update(gov)
        assert "GOV" in ner.labels
        assert _off_tokens_label_warnings(caplog.records) == [("GOV", "training so far")]
        caplog.clear()
        nlp.update([_off_tokens(nlp, "NGO")] + make_examples(nlp, [("The UN met .",
                                                                      [(4, 6, "NGO")])]))
        assert "NGO" in ner.labels and _off_tokens_label_warnings(caplog.records) == []


def test_a_label_left_out_as_too_wide_and_off_the_tokens_is_named_once_with_both(caplog):
    """A label whose gold entities are each too wide or off the predicted tokens is named in
    one warning that gives both reasons and what would keep each kind."""
    nlp, ner = _component(max_width=3)
    wide = [("The Royal Bank of Scotland Group said so .", [(0, 32, "CORP")])]  # 6 tokens
    examples = make_examples(nlp) + make_examples(nlp, wide) + [_off_tokens(nlp, "CORP")]
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        nlp.initialize(lambda: examples)
        ner.update([_off_tokens(nlp, "GOV")] + make_examples(nlp, [
            ("The United Nations Security Council of old met .", [(0, 42, "GOV")])]))
    named = [r.getMessage() for r in caplog.records if "of the label" in r.getMessage()]
    assert named == [
        f"fsemicrf_ner: every gold entity of the label {label!r} in {where} is wider than "
        f"max_width=3 tokens or {OFF_TOKENS}, so the label is not learned and never predicted "
        f"(until training reads one at most 3 tokens wide on token edges). max_width={widest} "
        f"would keep the wide ones; {RETOKENIZE} would keep the others."
        for label, where, widest in [("CORP", "the initialization examples", 6),
                                     ("GOV", "training so far", 7)]]


@pytest.mark.parametrize("arch", [FILTERED, LINEAR])
def test_a_loaded_component_names_a_label_training_adds_with_entities_off_the_tokens(
        arch, tmp_path, caplog):
    """A loaded (or sourced) component of any head trained further on a new label whose every
    entity is off the predicted tokens says so, as one initialized in this process does."""
    nlp, _ = _component(arch)
    nlp.initialize(lambda: make_examples(nlp))
    nlp.to_disk(tmp_path / "pipeline")
    loaded = spacy.load(tmp_path / "pipeline")
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        loaded.update([_off_tokens(loaded, "GOV")])
    assert "GOV" in loaded.get_pipe("fsemicrf_ner").labels
    assert _off_tokens_label_warnings(caplog.records) == [("GOV", "training so far")]


@pytest.mark.parametrize("arch", [FILTERED, LINEAR])
def test_initialize_counts_the_gold_entities_off_the_predicted_tokens(arch, caplog):
    """As it counts those too wide: training's warnings count the updates that read one, which
    say nothing of how many of the corpus's entities are lost (and come only once it starts).
    The count is no training's: n_misaligned_dropped counts from the first update."""
    nlp, ner = _component(arch)
    examples = make_examples(nlp) + [_off_tokens(nlp, "PER")] * 3
    n_ents = sum(len(eg.reference.ents) for eg in examples)
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        nlp.initialize(lambda: examples)
    assert [r.getMessage() for r in caplog.records] == [
        f"fsemicrf_ner: 3 of {n_ents} gold entities in the initialization examples do not start "
        f"or end on a token edge of the documents the pipeline predicts on (the pipeline's "
        f"tokenizer splits the text otherwise than the corpus) and cannot be learned (they are "
        f"left out of training; the loss reads their tokens as unknown, as spaCy's ner does). "
        f"Train on the corpus's tokens ([corpora.train] gold_preproc = true) or adjust the "
        f"tokenizer."]
    assert ner.n_misaligned_dropped == 0
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        nlp.update(examples)
    assert ner.n_misaligned_dropped == 3
    assert ["left out of training 3 times so far" in r.getMessage() for r in caplog.records] == [
        True]


def test_misaligned_entities_are_reported_at_each_new_power_of_ten(caplog):
    ner = spacy.blank("en").add_pipe("fsemicrf_ner")
    warned = []
    for n in (2, 3, 5, 80, 10):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
            ner._report_misaligned(n)
        warned.append([r.getMessage().split("left out of training ")[1].split(" times")[0]
                       for r in caplog.records])
    assert warned == [["2"], [], ["10"], [], ["100"]]
    assert ner.n_misaligned_dropped == 100


@pytest.fixture(scope="module")
def initialized():
    """An initialized (untrained) filtered-head pipeline (:func:`_initialized`)."""
    return _initialized()


def test_get_loss_is_the_update_loss_and_leaves_out_unannotated_docs(initialized):
    """get_loss gives the loss update would backpropagate (no weights change without an
    optimizer) and a zero gradient (the loss is computed inside the model); a document whose
    reference has no entity annotation adds nothing to it."""
    nlp, examples = initialized
    ner = nlp.get_pipe("fsemicrf_ner")
    words = ["Nobody", "visited", "Paris", "."]
    unannotated = Example(Doc(nlp.vocab, words=words), Doc(nlp.vocab, words=words))
    loss, gradient = ner.get_loss(examples + [unannotated], None)
    assert gradient == 0.0 and loss > 0
    assert ner.get_loss(examples, None)[0] == pytest.approx(loss, rel=1e-5)
    assert ner.update(examples, drop=0.0)["fsemicrf_ner"] == pytest.approx(loss, rel=1e-5)
    assert ner.get_loss([unannotated, unannotated], None) == (0.0, 0.0)  # nothing to learn


def test_documents_without_tokens_predict_nothing_with_the_usual_types(initialized):
    nlp, _ = initialized
    ner = nlp.get_pipe("fsemicrf_ner")
    prediction = ner.predict([nlp.make_doc(""), nlp.make_doc("")])
    assert prediction.spans.shape == (0, 4) and prediction.spans.dtype == numpy.int64
    assert prediction.scores.shape == (0,) and prediction.scores.dtype == numpy.float32
    assert prediction.path.tolist() == [1.0, 1.0] and prediction.path.dtype == numpy.float32
    assert prediction.candidates is None and prediction.reports is None


def test_constraints_reach_every_length_group_of_a_batch():
    """A batch predicted in several groups of documents of similar length decodes each
    document under its own constraints (here the second forbids every entity, the others
    have none) and reports on it."""
    fix_random_seed(1)  # an untrained head that happens to find entities in all three
    nlp, _ = _initialized()
    ner = nlp.get_pipe("fsemicrf_ner")
    docs = [nlp.make_doc(t) for t in ["Paris", "John Smith went to London today", "Anna"]]
    free = ner.predict(docs)
    assert set(free.spans[:, 0].tolist()) == {0, 1, 2}  # the untrained head finds entities
    docs[1].user_data[USER_DATA_KEY] = [{"kind": "forbid_labels"}]
    with one_group_per_document(ner):
        prediction = ner.predict(docs)
    assert prediction.spans.tolist() == [row for row in free.spans.tolist() if row[0] != 1]
    assert prediction.reports[1] is not None


def test_a_prediction_has_the_documented_types(initialized):
    """Documents with tokens and without, in one batch: int64 rows, float32 confidences and
    float32 path probabilities (1 for the empty document)."""
    nlp, _ = initialized
    ner = nlp.get_pipe("fsemicrf_ner")
    prediction = ner.predict([nlp.make_doc("John Smith went to London"), nlp.make_doc("")])
    assert prediction.spans.dtype == numpy.int64 and prediction.scores.dtype == numpy.float32
    assert prediction.path.dtype == numpy.float32 and prediction.path[1] == 1.0


def test_update_adds_its_loss_to_the_running_total(initialized):
    """Each update adds its batch's loss to ``losses`` (spaCy's convention), without an
    optimizer leaving the weights as they are."""
    nlp, examples = initialized
    ner = nlp.get_pipe("fsemicrf_ner")
    losses = {}
    first = ner.update(examples, drop=0.0, losses=losses)["fsemicrf_ner"]
    total = ner.update(examples, drop=0.0, losses=losses)["fsemicrf_ner"]
    assert total == pytest.approx(2 * first, rel=1e-5)


def test_initialize_reports_the_entities_wider_than_max_width(caplog):
    """An entity of max_width tokens is learnable; one token more is reported, with the count
    of such entities and the max_width that would keep them all."""
    nlp, _ = _component(max_width=2)
    data = [
        ("Bank of America rose .", [(0, 15, "ORG")]),  # 3 tokens
        ("John Smith left .", [(0, 10, "PER")]),  # 2 tokens: fits
        ("The United Nations Security Council met .", [(4, 35, "ORG")]),  # 4 tokens
    ]
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        nlp.initialize(lambda: make_examples(nlp, data))
    warnings = [r.getMessage() for r in caplog.records if "wider than" in r.getMessage()]
    assert warnings == [
        "fsemicrf_ner: 2 of 3 gold entities in the initialization examples are wider than "
        "max_width=2 tokens and cannot be learned (they are left out of training). "
        "max_width=4 would keep them all.",
        "fsemicrf_ner: every gold entity of the label 'ORG' in the initialization examples is "
        "wider than max_width=2 tokens, so the label is not learned and never predicted (until "
        "training reads one at most 2 tokens wide). max_width=4 would keep them."]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        nlp.initialize(lambda: make_examples(nlp, data[1:2]))  # nothing too wide: no warning
    assert not [r for r in caplog.records if "wider than" in r.getMessage()]


def test_the_class_alone_has_the_documented_defaults():
    """Constructed directly (not through the factory), the component has the defaults its
    signature documents, and rejects a spans_key that is not a non-empty string."""
    from spacy_fsemicrf.component import DEFAULT_SPANS_KEY, FSemiCRFEntityRecognizer
    from spacy_fsemicrf.scorer import ner_score

    nlp = spacy.blank("en")
    model = nlp.add_pipe("fsemicrf_ner").model
    ner = FSemiCRFEntityRecognizer(nlp.vocab, model)
    assert ner.name == "fsemicrf_ner" and ner.spans_key == DEFAULT_SPANS_KEY
    assert ner.threshold == 0.0 and ner.candidates_key is None and ner.constraints == []
    assert ner.scorer is ner_score
    assert ner.seen_entities.dtype == numpy.uint64 and ner.seen_entities.size == 0
    assert ner.n_wide_dropped == 0 and ner.widest_dropped == 0
    for bad in ("", 3, None):
        with pytest.raises(ValueError, match="spans_key must be a non-empty string"):
            FSemiCRFEntityRecognizer(nlp.vocab, model, spans_key=bad)


def test_add_label_records_each_new_label_once():
    nlp, ner = _component()
    assert ner.add_label("ZZFRESH") == 1
    assert ner.labels == ("ZZFRESH",) and "ZZFRESH" in nlp.vocab.strings
    assert ner.add_label("ZZFRESH") == 0 and ner.labels == ("ZZFRESH",)
    with pytest.raises(ValueError, match=r"^\[fsemicrf_ner\] every label must be a non-empty string"):
        ner.add_label("")


def test_a_whitespace_label_in_the_examples_is_refused_as_add_label_refuses_it():
    """Labels read from the examples follow the rule of those given: a component initialized
    with a label of whitespace only could not be initialized again from its own label_data."""
    from spacy.tokens import Span

    nlp, ner = _component()
    doc = nlp.make_doc("Ana lives in Lisbon .")
    ref = doc.copy()
    ref.ents = [Span(ref, 0, 1, label=" "), Span(ref, 3, 4, label="LOC")]
    examples = [Example(doc, ref)]
    with pytest.raises(ValueError, match=r"^\[fsemicrf_ner\] the initialization examples have "
                                         r"gold entities with the label ' ': every label"):
        ner.initialize(lambda: examples, nlp=nlp)
    with pytest.raises(ValueError, match="non-empty string"):
        ner.initialize(lambda: examples, nlp=nlp, labels=[" ", "LOC"])


def test_gold_entities_with_whitespace_at_an_edge_count_as_seen_as_they_are_written():
    """The component writes no entity that starts or ends on a whitespace token, so the name of
    a gold entity "\\n Mary" is written "Mary": it was recorded as the text "\\n Mary", and the
    written entity then counted as never seen in training (the by-novelty calibration)."""
    from spacy_fsemicrf.calibration import entity_key, seen_flags

    nlp, ner = _component()
    ref = Doc(nlp.vocab, words=["\n", "Mary", "met", "Ann", " ", "."],
              spaces=[False, True, True, False, False, False],
              ents=["B-PER", "I-PER", "O", "B-PER", "I-PER", "O"])
    ner.initialize(lambda: [Example(ref.copy(), ref)], nlp=nlp)
    assert set(ner.seen_entities.tolist()) == {entity_key("Mary"), entity_key("Ann")}
    doc = Doc(nlp.vocab, words=["Mary", "and", "Ann"])
    rows = numpy.array([[0, 0, 0, 1], [0, 2, 2, 1]])
    assert seen_flags([doc], rows, ner.seen_entities).tolist() == [True, True]


def test_training_further_adds_the_new_gold_names_to_the_seen_entities():
    """A sourced component is trained further without being initialized again: the names of
    that training were never recorded, and the by-novelty calibration fitted at its save took
    them for unseen. The names of an augmented example are those of its original."""
    from spacy_fsemicrf.augment import AUGMENTED, ORIGINAL_ENTITIES
    from spacy_fsemicrf.calibration import entity_key

    nlp, examples = _initialized()
    ner = nlp.get_pipe("fsemicrf_ner")
    before = set(ner.seen_entities.tolist())
    assert entity_key("Mary") in before
    eg = Example.from_dict(nlp.make_doc("Zoe Quill joined Acme ."),
                           {"entities": [(0, 9, "PER"), (17, 21, "ORG")]})
    made = Example.from_dict(nlp.make_doc("Vex Orlo left ."), {"entities": [(0, 8, "PER")]})
    made.reference.user_data[AUGMENTED] = True
    made.reference.user_data[ORIGINAL_ENTITIES] = ["Ida Brun"]
    nlp.update([eg, made], sgd=nlp.create_optimizer())
    new = {entity_key(name) for name in ("Zoe Quill", "Acme", "Ida Brun")}
    assert set(ner.seen_entities.tolist()) == before | new
    assert entity_key("Vex Orlo") not in set(ner.seen_entities.tolist())
    assert list(ner.seen_entities) == sorted(ner.seen_entities)  # (seen_flags searches it)


def test_labels_that_are_not_a_list_of_strings_are_refused_with_the_reason():
    from spacy_fsemicrf.component import check_labels

    assert check_labels(("A", "B"), "ner") == ["A", "B"]
    with pytest.raises(ValueError) as err:
        check_labels("PER", "ner")
    assert str(err.value) == "[ner] labels must be a list of strings, got 'PER' (did you mean ['PER']?)"
    with pytest.raises(ValueError) as err:
        check_labels({"PER": 1}, "ner")  # iterable, but not a list
    assert str(err.value) == "[ner] labels must be a list of strings, got {'PER': 1}"


def test_initialize_and_update_name_themselves_in_their_errors():
    nlp, ner = _component()
    with pytest.raises(TypeError, match=r"`FSemiCRFEntityRecognizer\.initialize`"):
        ner.initialize(None)
    examples = make_examples(nlp)
    with pytest.raises(ValueError, match=r"^\[fsemicrf_ner\] labels must be a list of strings"):
        ner.initialize(lambda: examples, nlp=nlp, labels="PER")
    with pytest.raises(TypeError, match=r"The FSemiCRFEntityRecognizer\.update method"):
        ner.update(["not an example"])


_NO_ENTITY = ("fsemicrf_ner: the label '{}' has no gold entity in the initialization examples, "
              "so it is not learned and never predicted (until training reads one). Remove it "
              "from the labels the component is given, or add examples annotated with it.")


def test_initialize_with_given_labels_warns_about_the_others(caplog):
    nlp, ner = _component()
    examples = make_examples(nlp)  # LOC, ORG and PER entities
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        ner.initialize(lambda: examples, nlp=nlp, labels=["PER", "ZZNEW"])
    assert ner.labels == ("PER", "ZZNEW") and "ZZNEW" in nlp.vocab.strings
    assert [r.getMessage() for r in caplog.records] == [
        "fsemicrf_ner: the examples contain entity labels that are not in the labels given to "
        "initialize: ['LOC', 'ORG']. Training on them adds them to the component.",
        _NO_ENTITY.format("ZZNEW")]


def test_a_given_label_without_a_gold_entity_is_named_once_at_initialize(caplog):
    """A label given to initialize (labels of another corpus, a typo) or added before it, with
    no gold entity in the examples, was never learned and nothing said so. Named at initialize
    only: a label added to the trained component, or met first in training, is learned there."""
    nlp, ner = _component()
    ner.add_label("NORP")
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        ner.initialize(lambda: make_examples(nlp), nlp=nlp, labels=["GPE", "LOC", "ORG", "PER"])
        assert [r.getMessage() for r in caplog.records] == [
            _NO_ENTITY.format("GPE"), _NO_ENTITY.format("NORP")]
        caplog.clear()
        nlp.update(make_examples(nlp))
        ner.add_label("FAC")  # training may bring its entities
        nlp.update(make_examples(nlp, [("The UN met .", [(4, 6, "NGO")])]))  # added, learned
        assert "FAC" in ner.labels and "NGO" in ner.labels and not caplog.records


def test_initialize_without_a_gold_entity_names_no_label_one_by_one(caplog):
    """Examples without any gold entity say the same of every label: one line, a warning where
    they have entity annotation, else an info line (nlp.initialize() without examples gives one
    document without annotation)."""
    nlp, ner = _component()
    for label in ("ORG", "PER"):
        ner.add_label(label)
    with caplog.at_level(logging.INFO, logger="spacy_fsemicrf"):
        nlp.initialize()
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(
        logging.INFO, "fsemicrf_ner: the 1 initialization examples have no entity annotation: "
        "the labels 'ORG', 'PER' are learned from the gold entities training reads")]
    caplog.clear()
    examples = make_examples(nlp, [("John lives in Paris .", [])]) + [
        Example(nlp.make_doc("Acme hired Mary ."), nlp.make_doc("Acme hired Mary ."))]
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        ner.initialize(lambda: examples, nlp=nlp)
    assert [r.getMessage() for r in caplog.records] == [
        "fsemicrf_ner: the 2 initialization examples (1 with entity annotation) have no gold "
        "entity, so no label is learned and none predicted (until training reads one): 'ORG', "
        "'PER'. Add examples annotated with them."]


def test_initialize_without_any_entity_says_where_the_labels_come_from():
    """Examples without a gold entity in doc.ents (here: annotated O, or spans in doc.spans
    only, as for spancat) and no labels: the error says what was read and where labels go."""
    nlp, ner = _component()
    examples = make_examples(nlp, [("John lives in Paris .", [])])
    spans_only = nlp.make_doc("Acme hired Mary .")
    spans_only.spans["sc"] = [spans_only.char_span(0, 4, label="ORG")]
    examples.append(Example(nlp.make_doc(spans_only.text), spans_only))
    with pytest.raises(ValueError) as err:
        ner.initialize(lambda: examples, nlp=nlp)
    assert str(err.value) == (
        "[fsemicrf_ner] no entity labels to learn: none were given and the 2 initialization "
        "examples (1 with entity annotation) have no gold entity in example.reference.ents "
        "(doc.spans is not read). Give the labels in [initialize.components.fsemicrf_ner.labels] "
        "or with add_label.")
    ner.initialize(lambda: examples, nlp=nlp, labels=["ORG"])
    assert ner.labels == ("ORG",)


def test_initialize_with_an_empty_label_list_does_not_blame_the_examples():
    """An empty list of labels (an empty labels file, ``labels = []``) over examples with gold
    entities: the error says the list is empty, not that the examples have no entity."""
    nlp, ner = _component()
    examples = make_examples(nlp, [("John lives in Paris .", [(0, 4, "PER"), (14, 19, "LOC")])])
    with pytest.raises(ValueError) as err:
        ner.initialize(lambda: examples, nlp=nlp, labels=[])
    assert str(err.value) == (
        "[fsemicrf_ner] no entity labels to learn: the labels given to initialize are an empty "
        "list (the 1 initialization examples have 2 gold entities, labels ['LOC', 'PER'], "
        "which are taken only when no labels are given). Give the labels in "
        "[initialize.components.fsemicrf_ner.labels], or leave them out.")
    ner.initialize(lambda: examples, nlp=nlp)
    assert ner.labels == ("LOC", "PER")


def test_initialize_keeps_earlier_labels_once_and_rebuilds_the_head_for_more():
    """Labels added before come first, each once; initializing again with one more label
    builds a head for the larger set."""
    nlp, ner = _component()
    ner.add_label("PER")
    examples = make_examples(nlp)
    nlp.initialize(lambda: examples)
    assert ner.labels == ("PER", "LOC", "ORG")
    ner.initialize(lambda: examples, nlp=nlp, labels=["ZZNEW"])
    assert ner.labels == ("PER", "LOC", "ORG", "ZZNEW")
    assert ner.model.get_dim("nO") == 4 and ner.model.get_ref("head").get_dim("nO") == 4


def test_initialize_keeps_the_configured_constraints():
    rule = {"kind": "at_most", "label": "PER", "n": 1, "scope": "doc"}
    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner", config={"model": model_config(), "constraints": [rule]})
    before = ner.constraints
    nlp.initialize(lambda: make_examples(nlp))
    assert len(before) == 1 and ner.constraints == before


def test_update_is_one_optimizer_step_on_the_gradient_of_the_loss():
    """update = the model's loss on the gold rows, its gradient (d_loss = 1) and a step of the
    optimizer given, at the default dropout of 0: the same weights as those steps by hand."""
    from spacy.util import fix_random_seed
    from thinc.api import SGD, set_dropout_rate

    from spacy_fsemicrf.architectures import ModelInput

    def fresh():
        fix_random_seed(0)
        nlp, examples = _initialized()
        return nlp.get_pipe("fsemicrf_ner"), examples

    ner, examples = fresh()
    # plain steps: no gradient clipping or weight decay, which could hide a scaled gradient
    losses = ner.update(examples, sgd=SGD(0.1, L2=0.0, grad_clip=0.0))
    by_hand, examples = fresh()
    before = [p.detach().clone() for p in by_hand.torch_head.parameters()]
    gold, mask = by_hand.get_gold(examples)
    set_dropout_rate(by_hand.model, 0.0)
    loss, backprop = by_hand.model.begin_update(
        ModelInput([eg.predicted for eg in examples], gold, mask))
    backprop(1.0)
    by_hand.finish_update(SGD(0.1, L2=0.0, grad_clip=0.0))
    assert losses["fsemicrf_ner"] == pytest.approx(loss, rel=1e-6)
    after = list(by_hand.torch_head.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(after, before))  # the step moved them
    for a, b in zip(ner.torch_head.parameters(), after):
        assert torch.equal(a, b)


def test_pipe_hands_batch_errors_to_the_error_handler(initialized, monkeypatch):
    """An error while a batch is annotated goes to the component's error handler with the
    component's name, the component, the batch and the error; the call's constraints are
    checked before any batch, so a bad one raises whatever the handler does."""
    from spacy.util import raise_error

    nlp, _ = initialized
    ner = nlp.get_pipe("fsemicrf_ner")
    seen = []
    ner.set_error_handler(lambda name, proc, docs, e: seen.append((name, proc, docs, e)))
    boom = RuntimeError("boom")

    def fail(docs, extra):
        raise boom

    try:
        docs = [nlp.make_doc("Paris"), nlp.make_doc("Rome")]
        with monkeypatch.context() as patched:
            patched.setattr(ner, "_predict", fail)
            assert list(ner.pipe(docs)) == []
        assert len(seen) == 1
        name, proc, batch, err = seen[0]
        assert name == "fsemicrf_ner" and proc is ner and err is boom
        assert len(batch) == 2 and all(a is b for a, b in zip(batch, docs))
        with pytest.raises(ValueError, match="NOPE"):
            list(ner.pipe(docs, constraints=[{"kind": "at_most", "label": "NOPE", "n": 1}]))
    finally:
        ner.set_error_handler(raise_error)


def test_get_gold_rows_are_int64_and_the_linear_crf_keeps_wide_entities():
    """The linear-chain CRF learns entities of any width: none is left out of its gold rows.
    A reference with entity annotation but no entity gives an empty int64 table and counts."""
    nlp, ner = _component("spacy-fsemicrf.LinearCRF.v1", max_width=2)
    examples = make_examples(nlp, [("Bank of America rose .", [(0, 15, "ORG")])])
    nlp.initialize(lambda: examples)
    gold, mask = ner.get_gold(examples)
    assert gold.tolist() == [[0, 0, 2, 1]] and mask.dtype == bool and mask.tolist() == [True]
    words = ["Nobody", "came", "."]
    empty = Example(Doc(nlp.vocab, words=words), Doc(nlp.vocab, words=words, ents=["O"] * 3))
    gold, mask = ner.get_gold([empty])
    assert gold.shape == (0, 4) and gold.dtype == numpy.int64 and mask.tolist() == [True]


def test_load_errors_name_the_component_and_where_it_was_loaded_from(initialized, tmp_path):
    nlp, _ = initialized
    saved = nlp.get_pipe("fsemicrf_ner")
    ner = spacy.blank("en").add_pipe("fsemicrf_ner")
    own = ner._load_error(ValueError("fsemicrf_ner: a message of its own"), "bytes", None)
    assert isinstance(own, ValueError) and str(own) == "fsemicrf_ner: a message of its own"
    assert str(ner._load_error(KeyError("W"), "/a/path", None)) == (
        "Cannot load the 'fsemicrf_ner' component from /a/path: the model built from the current "
        "config does not match the saved one ('W'). Load the pipeline with the config it was "
        "trained with.")
    _, other = _component(tok2vec={**model_config()["tok2vec"], "width": 24})
    bytes_error = r"^Cannot load the 'fsemicrf_ner' component from bytes: "
    with pytest.raises(ValueError, match=bytes_error) as err:
        other.from_bytes(saved.to_bytes())
    assert f"({err.value.__cause__})" in str(err.value)  # what did not match
    path = tmp_path / "ner"
    saved.to_disk(path, exclude=["vocab"])
    assert (path / "model").exists() and not (path / "vocab").exists()
    with pytest.raises(ValueError, match="^Cannot load the 'fsemicrf_ner' component from "
                       + re.escape(str(path)) + ": "):
        other.from_disk(path, exclude=["vocab"])
    cfg = srsly.read_json(path / "cfg")
    srsly.write_json(path / "cfg", {**cfg, "labels": cfg["labels"] + ["ZZX"]})
    _, fresh = _component(dropout=0.0)
    with pytest.raises(ValueError) as err:
        fresh.from_disk(path, exclude=["vocab"])
    assert str(err.value) == (
        "The saved 'fsemicrf_ner' model predicts 3 labels but its cfg lists 4 "
        "(['LOC', 'ORG', 'PER', 'ZZX']): the saved pipeline is inconsistent.")


@pytest.mark.parametrize("labels", ["LOP", ["LOC", "ORG", ""], ["LOC", "LOC", "PER"],
                                    ["LOC", "ORG", 5], ["LOC", "ORG", ["PER"]]])
def test_saved_labels_that_are_not_distinct_strings_are_refused_on_loading(
    initialized, tmp_path, labels
):
    """A cfg edited by hand loaded as it was: a string's characters, a blank or a repeated
    label named the head's outputs wrongly without an error."""
    error = (r"^Cannot load the 'fsemicrf_ner' component: the labels of its saved cfg are not a "
             r"list of distinct non-empty strings \(.+\)\. Save the pipeline again, or reinstall "
             r"its package\.$")
    _refused_with_cfg(initialized[0], tmp_path, {"labels": labels}, error)


def _refused_with_cfg(nlp, tmp_path, edit, error: str) -> None:
    """The component of ``nlp`` saved with its cfg edited by ``edit`` is refused with
    ``error`` (a pattern) on loading, from disk and from bytes."""
    path = tmp_path / "ner"
    nlp.get_pipe("fsemicrf_ner").to_disk(path, exclude=["vocab"])
    srsly.write_json(path / "cfg", {**srsly.read_json(path / "cfg"), **edit})
    _, fresh = _component(dropout=0.0)
    with pytest.raises(ValueError, match=error):
        fresh.from_disk(path, exclude=["vocab"])
    data = {name: (path / name).read_bytes() for name in ("cfg", "model", "seen_entities")}
    _, fresh = _component(dropout=0.0)
    with pytest.raises(ValueError, match=error):
        fresh.from_bytes(srsly.msgpack_dumps(data))


@pytest.mark.parametrize("calibration", [
    {"method": "platt", "slope": -2.0, "intercept": 0.5},
    {"method": "platt", "slope": "1", "intercept": 0.5},
    {"method": "isotonc", "x": [0.2, 0.8], "y": [0.1, 0.9]},
    {"method": "by_novelty", "seen": {"method": "platt", "slope": 1.0, "intercept": 0.0}},
])
def test_a_saved_calibration_map_that_is_not_valid_is_refused_on_loading(
    initialized, tmp_path, calibration
):
    """spaCy fills cfg without the calibration setter's check: a map edited by hand loaded,
    then scored every entity 0 (a negative slope) or failed at the first prediction, whose
    error asked to initialize the component."""
    error = (r"^Cannot load the 'fsemicrf_ner' component: the calibration map of its saved cfg "
             r"is not valid\. A calibration map is .+, got .+\. Save the pipeline again \(or fit "
             r"a map again\), or reinstall its package\.$")
    _refused_with_cfg(initialized[0], tmp_path, {"calibration": calibration}, error)


@pytest.mark.parametrize("part", ["model", "cfg", "seen_entities"])
def test_a_damaged_file_is_named_as_damaged_not_as_another_config(initialized, tmp_path, part):
    """A truncated file is not a config that builds another model: the error says which part
    is damaged and what to do, on disk and from bytes (seen entities cut within a hash were
    refused without saying where from nor what to do)."""
    nlp, _ = initialized
    saved = nlp.get_pipe("fsemicrf_ner")
    path = tmp_path / "ner"
    saved.to_disk(path, exclude=["vocab"])
    data = (path / part).read_bytes()
    (path / part).write_bytes(data[: len(data) // 16 * 8 + 3])  # about half, within a hash
    damaged = (r"its {} data is damaged or incomplete \(.+\)\. Save the pipeline again, or "
               r"reinstall its package\.$")
    _, fresh = _component(dropout=0.0)
    with pytest.raises(ValueError, match=re.escape(f"from {path}: ") + damaged.format(part)):
        fresh.from_disk(path, exclude=["vocab"])
    if part == "model":
        with pytest.raises(ValueError, match="from bytes: " + damaged.format("bytes")):
            fresh.from_bytes(saved.to_bytes()[:-100])


@pytest.mark.parametrize("part", ["model", "cfg", "seen_entities"])
def test_a_damaged_part_of_the_bytes_is_named_as_damaged_not_as_another_config(initialized, part):
    """A part inside the component's bytes cut short (the whole still decodes) is named as
    damaged, as the same file on disk is, not as a config that builds another model."""
    parts = srsly.msgpack_loads(initialized[0].get_pipe("fsemicrf_ner").to_bytes())
    parts[part] = parts[part][: len(parts[part]) // 16 * 8 + 3]  # about half, within a hash
    _, fresh = _component(dropout=0.0)
    with pytest.raises(ValueError, match=r"from bytes: its {} data is damaged or incomplete "
                                         r"\(.+\)\. Save the pipeline again".format(part)):
        fresh.from_bytes(srsly.msgpack_dumps(parts))


@pytest.mark.parametrize("forced", [False, True])
def test_head_weights_holding_code_are_refused_with_the_plugins_message(
    initialized, tmp_path, monkeypatch, forced
):
    """A pickle that would run code in the head's weights is refused (torch.load with
    weights_only) and reported as the plugin's error, not as torch's advice to load it anyway;
    also where the environment lets torch.load run code when a call does not refuse it."""
    import io

    if forced:
        monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    nlp, _ = initialized
    head = _head_record(nlp.get_pipe("fsemicrf_ner"))
    buf = io.BytesIO()
    torch.save({"w": _RunsCode()}, buf)
    head["state"] = buf.getvalue()
    msg = head.model_bytes()
    _, fresh = _component(dropout=0.0)
    with pytest.raises(ValueError, match=r"^Cannot load the fsemicrf_ner head: its weights are "
                                         r"damaged, or hold more than tensors, which are refused"
                                         r".* \(UnpicklingError\)\.$"):
        fresh.model.from_bytes(msg)
    assert not _RunsCode.ran


@pytest.mark.parametrize("edit", ["drop a tensor", "add a tensor", "more labels", "a list"])
def test_head_weights_that_do_not_fit_their_record_are_a_value_error(initialized, edit):
    """Weights without a tensor the head has, with one it lacks, of other shapes, or not a
    mapping, raised torch's RuntimeError or TypeError, not the loading error of a damaged
    pipeline."""
    import io

    nlp, _ = initialized
    saved = nlp.get_pipe("fsemicrf_ner")
    head = _head_record(saved)
    state = torch.load(io.BytesIO(head["state"]), weights_only=True)
    if edit == "drop a tensor":
        state.pop(next(iter(state)))
    elif edit == "add a tensor":
        state["extra.weight"] = torch.zeros(2)
    elif edit == "more labels":
        head["n_labels"] += 1
    else:
        state = list(state.values())
    buf = io.BytesIO()
    torch.save(state, buf)
    head["state"] = buf.getvalue()
    msg = head.model_bytes()
    error = (r"^Cannot load the fsemicrf_ner head: its weights do not fit the head its record "
             r"describes \(.+\)\. Save the pipeline again, or reinstall its package\.$")
    _, fresh = _component(dropout=0.0)
    with pytest.raises(ValueError, match=error):
        fresh.model.from_bytes(msg)
    data = srsly.msgpack_loads(saved.to_bytes())
    data["model"] = msg
    _, fresh = _component(dropout=0.0)
    with pytest.raises(ValueError, match=error):
        fresh.from_bytes(srsly.msgpack_dumps(data))


class _HeadRecord(dict):
    """The head's record inside a component's model bytes (its description and ``state``, the
    bytes of its weights), to edit; :meth:`model_bytes` packs the model bytes again."""

    def __init__(self, msg: dict, shim_at: int, shim: dict) -> None:
        super().__init__(srsly.msgpack_loads(shim["state"]))
        self.msg, self.shim_at, self.shim = msg, shim_at, shim

    def model_bytes(self) -> bytes:
        self.shim["state"] = srsly.msgpack_dumps(dict(self))
        self.msg["shims"][self.shim_at][0] = srsly.msgpack_dumps(self.shim)
        return srsly.msgpack_dumps(self.msg)


def _head_record(component) -> _HeadRecord:
    msg = srsly.msgpack_loads(component.model.to_bytes())
    shim_at = next(i for i, s in enumerate(msg["shims"]) if s)
    return _HeadRecord(msg, shim_at, srsly.msgpack_loads(msg["shims"][shim_at][0]))


class _RunsCode:
    ran = False

    def __reduce__(self):
        return (setattr, (_RunsCode, "ran", True))


def test_loading_from_bytes_leaves_out_what_exclude_names(initialized):
    """``from_bytes(exclude=...)`` passes ``exclude`` on: the saved vocab's strings are not
    loaded when ``"vocab"`` is excluded, and are without it."""
    nlp, _ = initialized
    saved = nlp.get_pipe("fsemicrf_ner")
    saved.vocab.strings.add("zz-only-in-the-saved-vocab")
    data = saved.to_bytes()
    _, excluded = _component(dropout=0.0)
    excluded.from_bytes(data, exclude=["vocab"])
    assert "zz-only-in-the-saved-vocab" not in excluded.vocab.strings
    assert excluded.labels == saved.labels  # the rest was loaded
    _, loaded = _component(dropout=0.0)
    loaded.from_bytes(data)
    assert "zz-only-in-the-saved-vocab" in loaded.vocab.strings


@spacy.registry.architectures("test.Tok2VecOfUnknownWidth.v1")
def _tok2vec_of_unknown_width(width: int):
    """The small tok2vec inside a layer that declares no width, as a custom encoder whose
    width shows only when it runs."""
    inner = spacy.registry.resolve({"t": {**model_config()["tok2vec"], "width": width}})["t"]

    def forward(model, docs, is_train):
        return model.layers[0](docs, is_train)

    def init(model, X=None, Y=None):
        model.layers[0].initialize(X=X)

    return Model("unknown_width", forward, init=init, layers=[inner])


def test_initialize_measures_the_width_of_a_tok2vec_that_does_not_declare_it():
    """A tok2vec without ``nO`` gets a head as wide as the vectors it gives on the
    initialization examples (the head is built from them), and trains."""
    tok2vec = {"@architectures": "test.Tok2VecOfUnknownWidth.v1", "width": 24}
    nlp, ner = _component(dropout=0.0, tok2vec=tok2vec)
    examples = make_examples(nlp)
    nlp.initialize(lambda: examples)
    assert not ner.model.get_ref("tok2vec").has_dim("nO")
    assert model_torch_head(ner.model).word_pool.proj.in_features == 24
    assert numpy.isfinite(ner.update(examples)["fsemicrf_ner"])


def test_a_tok2vec_of_unknown_width_needs_documents_with_tokens_to_initialize():
    """Without example documents with tokens the width of its vectors cannot be measured:
    initialize says so instead of building a head of some width."""
    tok2vec = {"@architectures": "test.Tok2VecOfUnknownWidth.v1", "width": 24}
    model = spacy.registry.resolve({"m": model_config(tok2vec=tok2vec)})["m"]
    model.set_dim("nO", 2)
    with pytest.raises(ValueError, match=(
            r"^Cannot tell the width of the token vectors: the tok2vec layer has no nO "
            r"dimension and no non-empty example docs were given to initialize\.$")):
        model.initialize()


@spacy.registry.architectures("test.Tok2VecWithAProjection.v1")
def _tok2vec_with_a_projection(width: int):
    """The small tok2vec with a linear projection to ``width`` on top, whose input width the
    projection learns from the documents it is initialized on (a Thinc layer without nI)."""
    from thinc.api import Linear, chain, with_array

    inner = spacy.registry.resolve({"t": model_config()["tok2vec"]})["t"]
    return chain(inner, with_array(Linear(nO=width)))


def test_the_tok2vec_is_initialized_on_the_example_documents():
    """Layers that infer their input width from data get the examples' documents."""
    tok2vec = {"@architectures": "test.Tok2VecWithAProjection.v1", "width": 20}
    nlp, ner = _component(dropout=0.0, tok2vec=tok2vec)
    examples = make_examples(nlp)
    nlp.initialize(lambda: examples)
    assert model_torch_head(ner.model).word_pool.proj.in_features == 20
    assert numpy.isfinite(ner.update(examples)["fsemicrf_ner"])


def test_training_dropout_reaches_the_tok2vec_inside_the_component():
    """``update(drop=...)`` sets the dropout of the thinc layers inside the component (here its
    own CNN tok2vec; the head's PyTorch dropout is the architecture's ``dropout``): the same
    step with dropout gives another loss, and without it the same loss twice."""
    from spacy.util import fix_random_seed

    def loss_of_one_step(drop):
        fix_random_seed(0)
        nlp, examples = _initialized()
        fix_random_seed(1)
        return nlp.get_pipe("fsemicrf_ner").update(examples, drop=drop)["fsemicrf_ner"]

    assert loss_of_one_step(0.0) == loss_of_one_step(0.0)
    assert loss_of_one_step(0.5) != loss_of_one_step(0.0)


def test_nbest_with_a_shared_tok2vec_needs_a_document_the_pipeline_has_run_on():
    """With a listener the tok2vec vectors come from the pipeline's tok2vec component, so a
    document straight from the tokenizer is refused with how to call it; a document of the
    pipeline, or one without tokens (its one empty segmentation), is ranked. A component with
    its own tok2vec takes either."""
    config = spacy.util.load_config(
        Path(__file__).parent.parent / "configs" / "fsemicrf_cnn.cfg", interpolate=True)
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    nlp.initialize(lambda: make_examples(nlp))
    ner = nlp.get_pipe("fsemicrf_ner")
    text = "John Smith works for Google in Paris ."
    with pytest.raises(ValueError, match=re.escape(
            "[fsemicrf_ner] nbest needs a document the pipeline has run on (its tok2vec vectors "
            "come from the shared tok2vec component): nbest(nlp(text), k), with the vectors "
            "still on it (a doc_cleaner drops them: clean after nbest).")):
        ner.nbest(nlp.make_doc(text), 2)
    cleaned = nlp(text)
    cleaned.tensor = None  # as doc_cleaner leaves it (docs/scaling.md: clean after nbest)
    with pytest.raises(ValueError, match=re.escape("a doc_cleaner drops them: clean after")):
        ner.nbest(cleaned, 2)
    assert 1 <= len(ner.nbest(nlp(text), 2)) <= 2
    empty = ner.nbest(nlp.make_doc(""), 2)  # its one segmentation: no entity, probability 1
    assert [(list(g), g.attrs["probability"]) for g in empty] == [([], 1.0)]
    own, _ = _initialized()
    assert 1 <= len(own.get_pipe("fsemicrf_ner").nbest(own.make_doc(text), 2)) <= 2
    fresh = spacy.blank("en").add_pipe("fsemicrf_ner")  # before initialize: no weights yet
    with pytest.raises(ValueError, match=re.escape("[fsemicrf_ner] nbest needs a trained "
                                                   "component")):
        fresh.nbest(own.make_doc(text), 2)


def test_nbest_takes_a_document_after_the_transformer_listener_was_replaced():
    """spacy-transformers' listener tok2vec is a chain around the listener, whose name stays
    ``transformer-listener>>trfs2arrays`` after ``nlp.replace_listeners`` (and is restored so
    on loading): the component then runs a transformer of its own, and nbest must not refuse
    a document without ``doc._.trf_data`` (the transformer component removed)."""
    pytest.importorskip("spacy_transformers")
    from spacy.util import registry
    from spacy_transformers.layers._util import replace_listener
    from spacy_transformers.pipeline_component import install_extensions
    from thinc.api import reduce_mean

    install_extensions()
    tok2vec = registry.architectures.get("spacy-transformers.TransformerListener.v1")(
        grad_factor=1.0, pooling=reduce_mean())
    listener = next(node for node in tok2vec.walk() if node.name == "transformer-listener")
    own = replace_listener(Model("transformer", lambda model, X, is_train: (X, lambda dY: dY)))
    tok2vec.replace_node(listener, own)
    assert tok2vec.name == "transformer-listener>>trfs2arrays"  # no listener left inside
    # a component with a tok2vec of its own that carries that name, as such a pipeline does
    nlp, _ = _initialized()
    ner = nlp.get_pipe("fsemicrf_ner")
    ner.model.get_ref("tok2vec").name = tok2vec.name
    doc = nlp.make_doc("John Smith works for Google in Paris .")
    assert doc._.trf_data is None
    assert 1 <= len(ner.nbest(doc, 2)) <= 2


def test_a_model_of_another_architecture_is_refused_when_the_component_is_made():
    """A config turned from ``spacy init config -p ner`` keeps the parser's model block: it
    passed ``spacy debug config`` and failed at initialization with a bare KeyError."""
    from spacy.pipeline.ner import DEFAULT_NER_MODEL

    nlp = spacy.blank("en")
    with pytest.raises(ValueError, match=(
            r"^\[fsemicrf_ner\] the model must be built by one of the spacy-fsemicrf "
            r"architectures \(spacy-fsemicrf.FilteredSemiCRF.v1, spacy-fsemicrf.SemiCRF.v1, "
            r"spacy-fsemicrf.LinearCRF.v1\), got the model 'parser_model'")):
        nlp.add_pipe("fsemicrf_ner", config={"model": DEFAULT_NER_MODEL})
    assert nlp.pipe_names == []


def test_update_with_sgd_false_takes_no_step():
    """``sgd=False`` (as spaCy's pipes take it): the loss is computed, the weights stay."""
    nlp, examples = _initialized()
    ner = nlp.get_pipe("fsemicrf_ner")
    before = [p.detach().clone() for p in model_torch_head(ner.model).parameters()]
    losses = ner.update(examples, sgd=False)
    assert losses["fsemicrf_ner"] > 0
    after = list(model_torch_head(ner.model).parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, after))


@pytest.mark.parametrize("arch", ["spacy-fsemicrf.FilteredSemiCRF.v1", "spacy-fsemicrf.LinearCRF.v1"])
def test_a_misspelt_grad_scaler_setting_is_named(arch):
    """A setting of the model's ``grad_scaler`` block that Thinc's PyTorchGradScaler does not
    take is a ValueError naming it and the settings there are (it was a bare TypeError from
    inside the config's resolution); the known ones still build the component."""
    with pytest.raises(ValueError, match=(
            r"^grad_scaler: unknown setting 'init_scal'; Thinc's PyTorchGradScaler takes "
            r"enabled, init_scale, backoff_factor, growth_factor, growth_interval$")):
        _component(arch, grad_scaler={"init_scal": 256.0})
    _, ner = _component(arch, grad_scaler={"init_scale": 256.0, "growth_interval": 10})
    assert float(ner.model.get_ref("head").shims[0]._grad_scaler._scale) == 256.0


def _example_of(nlp, words, ents, augmented_from=None):
    """An example of ``words`` (no spaces) with the gold entities ``(start, end, label)``;
    ``augmented_from``: marked as an augmenter's variant of an example with those names."""
    from spacy_fsemicrf.augment import AUGMENTED, ORIGINAL_ENTITIES

    tags = ["O"] * len(words)
    for s, e, label in ents:
        tags[s:e] = [f"B-{label}"] + [f"I-{label}"] * (e - s - 1)
    ref = Doc(nlp.vocab, words=words, spaces=[False] * len(words), ents=tags)
    if augmented_from is not None:
        ref.user_data[AUGMENTED] = True
        ref.user_data[ORIGINAL_ENTITIES] = augmented_from
    return Example(Doc(nlp.vocab, words=words, spaces=[False] * len(words)), ref)


def test_the_names_of_each_update_join_the_seen_entities():
    """A component trained further after its initialization (a sourced one) counts the gold
    names of its updates as seen, stripped of whitespace as the entities it writes are, and
    an augmenter's made-up names never: those of the example it was made from instead."""
    from spacy_fsemicrf.calibration import entity_key

    nlp, ner = _component(dropout=0.0)
    ner.add_label("PER")
    nlp.initialize(lambda: [_example_of(nlp, ["a", "b"], [])])  # no entity: none seen yet
    assert ner.seen_entities.size == 0

    def seen():
        return sorted(ner.seen_entities.tolist())

    def expect(*names):
        return sorted({entity_key(n) for n in names})

    ner.update([_example_of(nlp, ["Ann", "met", "Bob"], [(0, 1, "PER"), (2, 3, "PER")])],
               sgd=False)
    assert seen() == expect("Ann", "Bob")
    assert ner.seen_entities.tolist() == seen()  # kept sorted: the calibration searches it
    names = sorted((f"N{i}" for i in range(50)), key=entity_key)
    first, last = names[0], names[-1]
    assert entity_key(first) < min(seen()) and entity_key(last) > max(seen())
    ner.update([
        # an entity starting on whitespace is the name the component writes; one of
        # whitespace only is none
        _example_of(nlp, ["\n\n", "Cy", "and", "\n"], [(0, 2, "PER"), (3, 4, "PER")]),
        _example_of(nlp, ["Xq", "Zz", "ran"], [(0, 2, "PER")], augmented_from=["Dee Eve"]),
        _example_of(nlp, [first], [(0, 1, "PER")]),  # its key before every one seen so far
        _example_of(nlp, [last], [(0, 1, "PER")]),  # after them
    ], sgd=False)
    assert seen() == expect("Ann", "Bob", "Cy", "Dee Eve", first, last)
    assert ner.seen_entities.tolist() == seen()
    before = ner.seen_entities.copy()
    ner.update([_example_of(nlp, ["Bob", "and", "Ann"], [(0, 1, "PER"), (2, 3, "PER")])],
               sgd=False)  # nothing new
    assert numpy.array_equal(ner.seen_entities, before)


def test_an_infeasible_document_has_no_forced_spans_to_keep():
    """The forced spans that trimming keeps whole are those of the documents decoded under
    their constraints; an infeasible document's prediction is the unconstrained one, whose
    entities on the forced tokens are the head's own."""
    from spacy_fsemicrf.component import _decoded_forces
    from spacy_fsemicrf.doc_constraints import constraints_of_docs
    from spacy_fsemicrf.structured.constrained import ConstraintReport

    nlp = spacy.blank("en")
    docs = [nlp.make_doc("a b c d") for _ in range(4)]
    force = [{"kind": "force_span", "start": 1, "end": 3, "label": "ORG"}]
    for doc in docs[:3]:
        doc.user_data[USER_DATA_KEY] = force
    constraints = constraints_of_docs(docs, (), ("ORG",), "ner")
    reports = [ConstraintReport("infeasible", 0.0, 0.0, reason="why"),
               ConstraintReport("optimal", 0.0, 0.0), None, None]
    forces = _decoded_forces(constraints, reports)
    assert [forces(d) for d in range(4)] == [set(), {(1, 2, 1)}, {(1, 2, 1)}, set()]
    without = _decoded_forces(constraints)  # no reports: every constrained document's
    assert [without(d) for d in range(4)] == [{(1, 2, 1)}, {(1, 2, 1)}, {(1, 2, 1)}, set()]
    assert _decoded_forces(None, reports) is None


def test_a_threshold_keeps_every_entity_of_each_document_whose_constraints_need_them():
    """Over a batch, the rows a threshold may not drop are those of each document whose
    constraints hold on all its entities (not infeasible) but not on those above the threshold,
    read in that document's sentences; documents without constraints, with every entity kept
    or infeasible are thresholded as usual, wherever they stand in the batch."""
    from spacy_fsemicrf.component import _held_by_constraints
    from spacy_fsemicrf.structured.constrained import ConstraintReport
    from spacy_fsemicrf.structured.constraints import DocConstraints, compile_constraints

    labels = ["PER", "ORG"]
    two_per = DocConstraints(compile_constraints(
        [{"kind": "at_least", "label": "PER", "n": 2, "scope": "doc"}], labels))
    per_sentence = DocConstraints(compile_constraints(
        [{"kind": "at_least", "label": "PER", "n": 1, "scope": "sentence"}], labels), (3,))
    docs = [Doc(spacy.blank("en").vocab, words="a b . c d .".split()) for _ in range(6)]
    optimal = ConstraintReport("optimal", 0.0, 0.0)
    cases = [  # (constraints, report, rows (start, end, label), kept, held)
        (None, None, [(0, 0, 1)], [False], False),  # no constraints
        (two_per, optimal, [(0, 0, 1), (3, 3, 1)], [True, True], False),  # all kept
        (two_per, optimal, [(0, 0, 1), (3, 4, 1), (1, 1, 2)], [True, False, True], True),
        (two_per, ConstraintReport("infeasible", 0.0, 0.0), [(0, 0, 1)], [False], False),
        # one PER kept in each sentence, or in one sentence only
        (per_sentence, optimal, [(0, 0, 1), (3, 3, 1), (4, 4, 1)], [True, True, False], False),
        (per_sentence, optimal, [(0, 0, 1), (3, 3, 1)], [True, False], True),
    ]
    entities = numpy.array([(d, *row) for d, case in enumerate(cases) for row in case[2]])
    keep = numpy.array([k for case in cases for k in case[3]])
    held = _held_by_constraints(docs, entities, keep, [case[1] for case in cases],
                                [case[0] for case in cases])
    assert held.tolist() == [case[4] for case in cases for _ in case[2]]


def test_the_component_pickles_to_prepare_the_process_only_while_one_is_started(monkeypatch):
    """Pickled to start a process (spawn, forkserver), the component unpickles through
    fork_safety.unpickled_in_child, which puts PyTorch on one thread first; pickled otherwise
    (a cache, joblib), it unpickles as any spaCy pipe, leaving the process as it is."""
    import multiprocessing.context
    import pickle

    from spacy_fsemicrf import fork_safety

    nlp, examples = _initialized()
    ner = nlp.get_pipe("fsemicrf_ner")
    prepared = []
    monkeypatch.setattr(fork_safety, "one_thread_in_child", lambda: prepared.append(True))
    plain = pickle.loads(pickle.dumps(ner))
    assert prepared == []
    monkeypatch.setattr(multiprocessing.context, "get_spawning_popen", lambda: object())
    spawned = pickle.loads(pickle.dumps(ner))
    assert prepared == [True]
    doc = nlp.make_doc(examples[1].reference.text)
    for clone in (plain, spawned):
        assert type(clone) is type(ner) and clone.labels == ner.labels
        assert clone.cfg == ner.cfg and clone.to_bytes() == ner.to_bytes()
        assert [(e.start, e.end, e.label_) for e in clone(doc.copy()).ents] == [
            (e.start, e.end, e.label_) for e in ner(doc.copy()).ents]


def test_a_transformer_listener_reads_the_transformer_output_of_the_document():
    """A component on spacy-transformers' listener needs ``doc._.trf_data``, which a document
    straight from the tokenizer lacks: it is missing exactly when that is None."""
    pytest.importorskip("spacy_transformers")
    from spacy.util import registry
    from spacy_transformers.pipeline_component import install_extensions
    from thinc.api import reduce_mean

    from spacy_fsemicrf.component import _listener_output_missing

    tok2vec = registry.architectures.get("spacy-transformers.TransformerListener.v1")(
        grad_factor=1.0, pooling=reduce_mean())
    doc = spacy.blank("en")("John Smith works for Google .")
    # in a process where no transformer component was made, doc._.trf_data is no extension yet
    if Doc.has_extension("trf_data"):
        Doc.remove_extension("trf_data")
    try:
        assert _listener_output_missing(doc, tok2vec)
    finally:
        install_extensions()
    assert doc._.trf_data is None and _listener_output_missing(doc, tok2vec)
    doc._.trf_data = object()  # what a transformer component leaves (any value but None)
    doc.tensor = numpy.zeros((0, 0), dtype="float32")  # a transformer does not fill it
    assert not _listener_output_missing(doc, tok2vec)


@pytest.mark.parametrize("value,described", [(b"\x00" * 13, "13 bytes"), (7, "int")])
def test_seen_entities_that_are_no_list_of_hashes_are_named_with_what_was_read(
        initialized, value, described):
    """Seen entities cut within a hash, or not bytes at all, are refused with what was read."""
    parts = srsly.msgpack_loads(initialized[0].get_pipe("fsemicrf_ner").to_bytes())
    parts["seen_entities"] = value
    _, fresh = _component(dropout=0.0)
    with pytest.raises(ValueError, match=re.escape(
            f"from bytes: its seen_entities data is damaged or incomplete ({described}, not a "
            f"list of 64-bit hashes). Save the pipeline again")):
        fresh.from_bytes(srsly.msgpack_dumps(parts))


def test_a_fresh_component_warns_of_a_sentence_scope_on_a_document_without_sentences(caplog):
    """The warning that a sentence-scoped constraint reads an unsegmented document as one
    sentence comes at the first such document of a component made in this process."""
    nlp, _ = _initialized()
    scope = [{"kind": "at_most", "label": "ORG", "n": 1, "scope": "sentence"}]
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        nlp.get_pipe("fsemicrf_ner")(nlp.make_doc("Apple and Google met ."), constraints=scope)
    assert sum("without sentence boundaries" in r.getMessage() for r in caplog.records) == 1


def test_a_loaded_component_names_a_label_training_adds_with_only_wide_entities(
        tmp_path, caplog):
    """A loaded (or sourced) component trained further on a new label whose every entity is
    wider than max_width says so, as one initialized in this process does."""
    nlp, _ = _component(max_width=3)
    nlp.initialize(lambda: make_examples(nlp))
    nlp.to_disk(tmp_path / "pipeline")
    loaded = spacy.load(tmp_path / "pipeline")
    wide = [("The United Nations Security Council of old met .", [(0, 42, "GOV")])]
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        loaded.update(make_examples(loaded, wide))
    assert "GOV" in loaded.get_pipe("fsemicrf_ner").labels
    assert [label for label, _ in _wide_label_warnings(caplog.records)] == ["GOV"]


def test_a_process_is_prepared_once_by_its_first_component(monkeypatch):
    """The first component made in a process registers the fork handler and the msgpack
    lookups (so that forked workers run PyTorch on one thread); later ones do not again."""
    from spacy_fsemicrf import component as component_module

    calls = []
    monkeypatch.setattr(component_module, "_process_prepared", False)
    monkeypatch.setattr(component_module.fork_safety, "register", lambda: calls.append("fork"))
    monkeypatch.setattr(component_module, "remember_msgpack_lookups",
                        lambda: calls.append("msgpack"))
    _component()
    _component()
    assert calls == ["fork", "msgpack"]
