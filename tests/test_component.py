"""The fsemicrf_ner component: labels, training, annotations, serialization, odd input."""
import logging
import math

import numpy
import pytest
import spacy
from spacy import displacy
from spacy.tokens import Doc, Span
from spacy.training import Example
from thinc.api import Adam

from spacy_fsemicrf.architectures import model_torch_head
from spacy_fsemicrf.component import DEFAULT_FILTER_MARGIN, FSemiCRFEntityRecognizer, set_entities

try:  # tests/ as a package (tests/__init__.py) or as a plain directory
    from .conftest import (
        LABELS, TRAIN_DATA, gold_set, make_examples, model_config, predicted_set, train_pipeline,
    )
except ImportError:  # pragma: no cover
    from conftest import (  # type: ignore[no-redef]
        LABELS, TRAIN_DATA, gold_set, make_examples, model_config, predicted_set, train_pipeline,
    )

# Labels ----------------------------------------------------------------------------------------


def test_add_pipe_with_defaults():
    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner")
    assert isinstance(ner, FSemiCRFEntityRecognizer)
    assert ner.spans_key == "fsemicrf"
    assert ner.max_width == 10
    cfg = nlp.config["components"]["fsemicrf_ner"]
    assert cfg["model"]["@architectures"] == "spacy-fsemicrf.FilteredSemiCRF.v1"
    assert cfg["model"]["doc_vector"] is True
    assert cfg["model"]["word_pool"] is True
    assert cfg["model"]["tok2vec"]["@architectures"] == "spacy.HashEmbedCNN.v2"
    assert cfg["scorer"]["@scorers"] == "spacy-fsemicrf.ner_scorer.v1"


def test_initialize_from_examples():
    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner")
    nlp.initialize(lambda: make_examples(nlp))
    assert ner.labels == tuple(LABELS)
    assert ner.model.get_dim("nO") == 3
    assert ner.model.get_ref("head").get_dim("nI") == 96


def test_initialize_from_labels_arg_and_config():
    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner")
    ner.initialize(lambda: make_examples(nlp), nlp=nlp, labels=["PER", "ORG", "LOC", "MISC"])
    assert ner.labels == ("PER", "ORG", "LOC", "MISC")

    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner")
    nlp.config["initialize"]["components"]["fsemicrf_ner"] = {"labels": ["B", "A"]}
    nlp.initialize()  # no examples at all
    assert ner.labels == ("B", "A")
    doc = nlp("some text here")
    assert doc.spans["fsemicrf"] is not None


def test_initialize_without_labels_fails():
    nlp = spacy.blank("en")
    nlp.add_pipe("fsemicrf_ner")
    with pytest.raises(ValueError):
        nlp.initialize()


NEW_LABEL_DATA = [
    ("I use WidgetPro every day .", [(6, 15, "GADGET")]),
    ("Peter sold his GizmoMax in Rome .", [(0, 5, "PER"), (15, 23, "GADGET"), (27, 31, "LOC")]),
    ("Tesla makes the Zapper now .", [(0, 5, "ORG"), (16, 22, "GADGET")]),
]


def _copy(nlp, path):
    nlp.to_disk(path)
    return spacy.load(path)


def test_add_label_to_a_trained_component_grows_its_head(trained_nlp, tmp_path, caplog):
    nlp = _copy(trained_nlp, tmp_path / "pipeline")
    ner = nlp.get_pipe("fsemicrf_ner")
    head = model_torch_head(ner.model)
    assert ner.add_label("PER") == 0
    with caplog.at_level(logging.INFO, logger="spacy_fsemicrf"):
        assert ner.add_label("GADGET") == 1 and ner.add_label("GADGET") == 0
    assert [r.getMessage() for r in caplog.records] == [
        "fsemicrf_ner: added the label 'GADGET' to the trained component (it is learned by "
        "training further)"]
    assert ner.labels == (*LABELS, "GADGET")
    assert ner.model.get_dim("nO") == head.n_labels == len(LABELS) + 1
    assert head.fsemicrf_spec["n_labels"] == len(LABELS) + 1
    # the grown pipeline saves and loads as it is
    texts = [text for text, _ in TRAIN_DATA]
    loaded = _copy(nlp, tmp_path / "grown")
    assert loaded.get_pipe("fsemicrf_ner").labels == ner.labels
    assert predicted_set(loaded.pipe(texts)) == predicted_set(nlp.pipe(texts))


def _entities_and_scores(docs):
    return [[(ent.start, ent.end, ent.label_, float(score)) for ent, score in
             zip(doc.spans["fsemicrf"], doc.spans["fsemicrf"].attrs["scores"])] for doc in docs]


def test_a_label_added_to_a_trained_component_is_not_predicted_before_training(
    trained_nlp, tmp_path
):
    """As spaCy's ner: add_label leaves the predictions and their confidences as they were,
    also saved and loaded, until training meets the label; then it is learned."""
    nlp = _copy(trained_nlp, tmp_path / "pipeline")
    data = TRAIN_DATA + NEW_LABEL_DATA
    texts = [text for text, _ in data]
    before = _entities_and_scores(nlp.pipe(texts))
    nlp.get_pipe("fsemicrf_ner").add_label("GADGET")
    nlp = _copy(nlp, tmp_path / "grown")
    after = _entities_and_scores(nlp.pipe(texts))
    assert [[row[:3] for row in doc] for doc in after] == [[row[:3] for row in doc]
                                                           for doc in before]
    assert numpy.allclose([row[3] for doc in after for row in doc],
                          [row[3] for doc in before for row in doc], atol=1e-6)
    optimizer = nlp.resume_training()  # the config's: weight decay moves every bias
    old = make_examples(nlp)
    nlp.update(old, sgd=optimizer, drop=0.0)  # no GADGET: still not predicted
    assert all(label != "GADGET" for doc in predicted_set(nlp.pipe(texts)) for _, label in doc)
    examples = old + make_examples(nlp, NEW_LABEL_DATA)
    spacy.util.fix_random_seed(0)
    for _ in range(40):
        nlp.update(examples, sgd=optimizer, drop=0.0)
    assert predicted_set(nlp.pipe(texts)) == gold_set(nlp, data)


def test_update_learns_a_label_new_to_a_trained_component(trained_nlp, tmp_path):
    """As spaCy's ner: training a trained (or sourced) component on data with a new label
    adds it, with an optimizer that has already stepped the head at its old shape, and
    parameter averages that then cover the grown head."""
    nlp = _copy(trained_nlp, tmp_path / "pipeline")
    optimizer = nlp.resume_training(sgd=Adam(0.001, use_averages=True))
    old = make_examples(nlp)
    nlp.update(old, sgd=optimizer, drop=0.0)
    examples = old + make_examples(nlp, NEW_LABEL_DATA)
    spacy.util.fix_random_seed(0)
    for _ in range(40):
        nlp.update(examples, sgd=optimizer, drop=0.0)
    assert nlp.get_pipe("fsemicrf_ner").labels == (*LABELS, "GADGET")
    data = TRAIN_DATA + NEW_LABEL_DATA
    texts = [text for text, _ in data]
    assert predicted_set(nlp.pipe(texts)) == gold_set(nlp, data)
    with nlp.use_params(optimizer.averages):  # the averages of the grown head's shapes
        averaged = predicted_set(nlp.pipe(texts))
    assert {label for doc in averaged for _, label in doc} <= {*LABELS, "GADGET"}


def test_averages_of_a_label_added_long_before_its_first_entity_predict_it(trained_nlp, tmp_path):
    """add_label, then many steps whose gold has no entity of the label (its bias stays far
    below the others), then steps with it: the parameter averages start afresh when it wakes,
    so an averaged model (spacy train's evaluation and model-best) predicts it too (the
    averages of the silent steps kept it silent, and the wrong labels took its entities)."""
    nlp = _copy(trained_nlp, tmp_path / "pipeline")
    optimizer = nlp.resume_training(sgd=Adam(0.001, use_averages=True))
    nlp.get_pipe("fsemicrf_ner").add_label("GADGET")
    old = make_examples(nlp)
    for _ in range(120):
        nlp.update(old, sgd=optimizer, drop=0.0)
    examples = old + make_examples(nlp, NEW_LABEL_DATA)
    for _ in range(60):
        nlp.update(examples, sgd=optimizer, drop=0.0)
    texts = [text for text, _ in NEW_LABEL_DATA]
    assert predicted_set(nlp.pipe(texts)) == gold_set(nlp, NEW_LABEL_DATA)
    with nlp.use_params(optimizer.averages):
        assert predicted_set(nlp.pipe(texts)) == gold_set(nlp, NEW_LABEL_DATA)


def test_update_adds_the_new_labels_of_a_batch_in_sorted_order(trained_nlp, tmp_path):
    nlp = _copy(trained_nlp, tmp_path / "pipeline")
    data = [("I gave Bingo some Yummies .", [(7, 12, "PET"), (18, 25, "FOOD")])]
    nlp.update(make_examples(nlp, data))
    assert nlp.get_pipe("fsemicrf_ner").labels == (*LABELS, "FOOD", "PET")


def test_a_whitespace_label_met_in_update_is_named_as_the_training_datas(trained_nlp, tmp_path):
    nlp = _copy(trained_nlp, tmp_path / "pipeline")
    doc = nlp.make_doc("Ana lives in Lisbon .")
    ref = doc.copy()
    ref.ents = [Span(ref, 0, 1, label=" "), Span(ref, 3, 4, label="LOC")]
    with pytest.raises(ValueError, match=r"^\[fsemicrf_ner\] the training examples have gold "
                                         r"entities with the label ' ': every label"):
        nlp.update([Example(doc, ref)])
    assert nlp.get_pipe("fsemicrf_ner").labels == tuple(LABELS)


def test_a_label_left_out_of_initialize_is_added_by_update():
    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner")
    examples = make_examples(nlp)
    ner.initialize(lambda: examples, nlp=nlp, labels=["PER", "LOC"])
    nlp.update(examples)
    assert ner.labels == ("PER", "LOC", "ORG")
    # get_gold does not grow the component: it names the label it lacks
    with pytest.raises(ValueError, match="'GADGET'.*does not have.*add_label"):
        ner.get_gold(make_examples(nlp, NEW_LABEL_DATA))


def test_use_before_initialize_is_an_error():
    nlp = spacy.blank("en")
    nlp.add_pipe("fsemicrf_ner")
    with pytest.raises(ValueError, match="initialize"):
        nlp("Apple is in London .")


# Training and prediction -----------------------------------------------------------------------


def test_update_makes_the_loss_fall_and_finds_the_entities(trained):
    nlp, losses = trained
    assert losses[0] > 0
    assert losses[-1] < 0.05 * losses[0]
    docs = list(nlp.pipe([text for text, _ in TRAIN_DATA]))
    assert predicted_set(docs) == gold_set(nlp)
    for doc in docs:
        group = doc.spans["fsemicrf"]
        scores = group.attrs["scores"]
        assert len(scores) == len(group) == len(doc.ents)
        assert numpy.all((scores >= 0) & (scores <= 1))
        assert [(s.start, s.end, s.label_) for s in group] == [
            (e.start, e.end, e.label_) for e in doc.ents
        ]


def test_parameter_averages_reach_the_head():
    """With ``use_averages``, ``nlp.use_params(averages)`` (what spacy train does to evaluate
    and save) puts the averaged weights into the PyTorch head, as into the tok2vec, and the
    trained ones back afterwards."""
    nlp = spacy.blank("en")
    nlp.add_pipe("fsemicrf_ner")
    examples = make_examples(nlp)
    nlp.initialize(lambda: examples)
    optimizer = Adam(0.01, use_averages=True)
    for _ in range(5):
        nlp.update(examples, sgd=optimizer, drop=0.0)
    shim = nlp.get_pipe("fsemicrf_ner").model.get_ref("head").shims[0]
    trained = {name: p.detach().clone() for name, p in shim._model.named_parameters()}
    averages = {name: optimizer.averages[(shim.id, name)] for name in trained}
    assert any(not numpy.allclose(averages[n], trained[n].numpy()) for n in trained)
    with nlp.use_params(optimizer.averages):
        for name, p in shim._model.named_parameters():
            numpy.testing.assert_allclose(p.detach().numpy(), averages[name])
        assert len(list(nlp.pipe([text for text, _ in TRAIN_DATA]))) == len(TRAIN_DATA)
    for name, p in shim._model.named_parameters():
        assert numpy.array_equal(p.detach().numpy(), trained[name].numpy())


def test_scorer_keys(trained_nlp):
    scores = trained_nlp.evaluate(make_examples(trained_nlp))
    for key in ("ents_p", "ents_r", "ents_f", "ents_per_type"):
        assert key in scores
    assert scores["ents_f"] == 1.0
    assert set(scores["ents_per_type"]) == set(LABELS)


def test_docs_without_entity_annotation_are_left_out_of_the_loss(trained_nlp):
    ner = trained_nlp.get_pipe("fsemicrf_ner")
    doc = trained_nlp.make_doc("Apple is in London .")
    missing = Example(doc, doc.copy())  # the reference has no entity annotation
    annotated = make_examples(trained_nlp)[0]
    gold, mask = ner.get_gold([missing, annotated])
    assert mask.tolist() == [False, True]
    assert set(gold[:, 0].tolist()) == {1}
    assert ner.update([missing], sgd=None)["fsemicrf_ner"] == 0.0
    # beside an annotated one, the unannotated document adds nothing to the loss (a head
    # without dropout, so that two updates see the same model)
    nlp = spacy.blank("en")
    plain = nlp.add_pipe("fsemicrf_ner", config={"model": {"dropout": 0.0}})
    annotated = make_examples(nlp)[0]
    nlp.initialize(lambda: [annotated])
    doc = nlp.make_doc("Apple is in London .")
    alone = plain.update([annotated], sgd=None)["fsemicrf_ner"]
    both = plain.update([Example(doc, doc.copy()), annotated], sgd=None)["fsemicrf_ner"]
    assert alone > 0 and both == pytest.approx(alone, rel=1e-5)


def test_gold_entities_wider_than_max_width_are_reported(caplog):
    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner", config={"model": {"max_width": 3}})
    text = "The University of California at Los Angeles is big ."
    data = [(text, [(0, 43, "ORG")]), ("Paris is nice .", [(0, 5, "LOC")])]
    examples = make_examples(nlp, data)
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        nlp.initialize(lambda: examples)
    assert "max_width=3" in caplog.text and "max_width=7" in caplog.text
    caplog.clear()
    gold, mask = ner.get_gold(examples)
    assert gold.tolist() == [[1, 0, 0, 1]]  # only Paris (LOC = 1); the 7-token ORG is dropped
    assert ner.n_wide_dropped == 1 and ner.widest_dropped == 7
    assert "max_width=7" in caplog.text
    losses = nlp.update(examples)
    assert numpy.isfinite(losses["fsemicrf_ner"])
    assert ner.n_wide_dropped == 2


def test_gold_entities_off_the_predicted_tokens_are_counted_and_reported(caplog):
    """A gold entity whose edges fall inside a token of the predicted document (the corpus
    split the text otherwise) cannot be trained on: it was left out without a word."""
    from spacy.tokens import Doc
    from spacy.training import Example

    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner")
    reference = Doc(nlp.vocab, words=["Par", "is", "Hilton", "won", "in", "Rome"],
                    spaces=[False, True, True, True, True, False],
                    ents=["O", "B-PER", "I-PER", "O", "O", "B-LOC"])
    predicted = nlp.make_doc(reference.text)  # "Paris" is one token here
    examples = [Example(predicted, reference)] * 2
    nlp.initialize(lambda: examples)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        gold, _ = ner.get_gold(examples)
    loc = ner.labels.index("LOC") + 1
    assert gold.tolist() == [[0, 4, 4, loc], [1, 4, 4, loc]]  # Rome; "is Hilton" is left out
    assert ner.n_misaligned_dropped == 2
    assert [r.getMessage() for r in caplog.records] == [
        "fsemicrf_ner: gold entities that do not start or end on a token edge of the documents "
        "the pipeline predicts on (the pipeline's tokenizer splits the text otherwise than the "
        "corpus) have been left out of training 2 times so far (each update that reads one "
        "counts it); the loss reads their tokens as unknown, as spaCy's ner does. Train on the "
        "corpus's tokens ([corpora.train] gold_preproc = true) or adjust the tokenizer."]
    # the loss reads the tokens of the entity left out as unknown, not as outside any entity
    known = ner._gold(examples).known
    assert [k.tolist() for k in known] == [[False, False, True, True, True]] * 2


def test_gold_entities_as_wide_as_max_width_are_kept_and_every_wider_one_is_counted():
    """An entity of exactly max_width tokens is trained on; two wider ones in one document are
    both counted, and the entity after them in that document is still trained on."""
    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner", config={"model": {"max_width": 3}})
    text = "The University of California at Los Angeles and Bank of New York Mellon met in Paris ."
    spans = [("The University of California at Los Angeles", "ORG"),
             ("Bank of New York Mellon", "ORG"), ("Paris", "LOC")]
    data = [(text, [(text.index(t), text.index(t) + len(t), label) for t, label in spans]),
            ("New York City is big .", [(0, 13, "LOC")])]
    examples = make_examples(nlp, data)
    nlp.initialize(lambda: examples)
    gold, _ = ner.get_gold(examples)
    assert gold.tolist() == [[0, 15, 15, 1], [1, 0, 2, 1]]  # LOC = 1; New York City is 3 wide
    assert ner.n_wide_dropped == 2 and ner.widest_dropped == 7


def test_existing_entities_are_kept(trained_nlp):
    doc = trained_nlp.make_doc("Apple is opening an office in London .")
    doc.ents = [Span(doc, 0, 2, label="CUSTOM")]  # "Apple is", overlaps the predicted ORG
    doc = trained_nlp(doc)
    ents = [(e.text, e.label_) for e in doc.ents]
    assert ents == [("Apple is", "CUSTOM"), ("London", "LOC")]
    # doc.spans keeps every prediction of the model
    assert [(s.text, s.label_) for s in doc.spans["fsemicrf"]] == [("Apple", "ORG"), ("London", "LOC")]
    assert all(t.ent_iob_ in ("B", "I", "O") for t in doc)


def test_blocked_tokens_stay_blocked():
    nlp = spacy.blank("en")
    doc = nlp.make_doc("a b c d e")
    doc.set_ents([], blocked=[doc[1:2]], default="missing")
    preds = [Span(doc, 0, 2, label="X"), Span(doc, 3, 4, label="Y")]
    set_entities(doc, preds)
    assert [(e.start, e.end, e.label_) for e in doc.ents] == [(3, 4, "Y")]
    assert [t.ent_iob for t in doc] == [2, 3, 2, 3, 2]  # token 1: still blocked (B, no type)
    assert doc[1].ent_type == 0


def test_empty_one_token_and_whitespace_docs(trained_nlp):
    assert trained_nlp("").ents == ()
    doc = trained_nlp("London")
    assert len(doc) == 1
    words = ["John", " ", "Smith", "\n\n", "works", "\t", "in", "Paris", "  "]
    doc = trained_nlp(Doc(trained_nlp.vocab, words=words))
    assert all(t.ent_iob_ in ("B", "I", "O") for t in doc)
    docs = list(trained_nlp.pipe(["", "Paris", "", "Mary flew to Berlin on Monday ."]))
    assert [len(d) for d in docs] == [0, 1, 0, 7]
    assert ("Berlin", "LOC") in {(e.text, e.label_) for e in docs[3].ents}


def test_docs_of_another_vocab_get_their_entities(trained_nlp):
    """A document made by another pipeline (its own vocab, without the labels' strings) gets
    the same entities as one of the pipeline's own, and can be serialized with them."""
    text = "John Smith works for Google in Paris ."
    own = trained_nlp(text)
    assert own.ents
    for other in (spacy.blank("de")(text), Doc(spacy.blank("en").vocab, words=text.split())):
        doc = trained_nlp(other)
        assert predicted_set([doc]) == predicted_set([own])
        labels = [span.label_ for span in doc.spans["fsemicrf"]]
        assert labels == [span.label_ for span in own.spans["fsemicrf"]]
        assert predicted_set([Doc(doc.vocab).from_bytes(doc.to_bytes())]) == predicted_set([own])
    # one batch of documents of two other vocabs: each vocab gets the labels' strings
    batch = [Doc(spacy.blank("en").vocab, words=text.split()) for _ in range(2)]
    found = [predicted_set([doc]) for doc in trained_nlp.pipe(batch)]
    assert found == [predicted_set([own])] * 2


def test_long_document(trained_nlp):
    sentence = "Mary flew to Berlin on Monday .".split()
    words = (sentence * (10_000 // len(sentence) + 1))[:10_000]
    doc = trained_nlp(Doc(trained_nlp.vocab, words=words))
    assert len(doc) == 10_000
    found = {(e.text, e.label_) for e in doc.ents}
    assert ("Berlin", "LOC") in found
    assert len(doc.spans["fsemicrf"].attrs["scores"]) == len(doc.spans["fsemicrf"])


def test_pipe_with_two_processes(trained_nlp):
    """Same entities from two processes as from one. This process runs PyTorch on one thread
    (conftest.py), so the fork hang is not reproduced here: tests/test_multiprocess.py checks
    that, in a fresh interpreter with PyTorch's default threads."""
    texts = [text for text, _ in TRAIN_DATA] * 2
    single = predicted_set(trained_nlp.pipe(texts))
    multi = predicted_set(trained_nlp.pipe(texts, n_process=2, batch_size=4))
    assert multi == single


def test_displacy(trained_nlp):
    doc = trained_nlp("John Smith works for Google in Paris .")
    html = displacy.render(doc, style="ent")
    assert "Google" in html and "ORG" in html
    # the span style reads spancat's key "sc" unless given ours (README, "spaCy's tools")
    html = displacy.render(doc, style="span", options={"spans_key": "fsemicrf"})
    assert "ORG" in html


def test_filter_margin_from_the_config_and_at_run_time(trained_nlp, tmp_path):
    texts = [text for text, _ in TRAIN_DATA]
    trained_nlp.to_disk(tmp_path / "pipeline")
    # a margin given at loading time is not overridden by the saved component
    nlp = spacy.load(tmp_path / "pipeline",
                     config={"components": {"fsemicrf_ner": {"filter_margin": -1e6}}})
    ner = nlp.get_pipe("fsemicrf_ner")
    assert ner.filter_margin == -1e6
    assert all(len(doc.ents) == 0 for doc in nlp.pipe(texts))  # no span beats null by 1e6
    ner.filter_margin = None  # the head's default, as trained_nlp has it
    assert ner.filter_margin == trained_nlp.get_pipe("fsemicrf_ner").filter_margin
    assert predicted_set(nlp.pipe(texts)) == predicted_set(trained_nlp.pipe(texts))
    # every candidate span a node: a maximal path covers every token
    ner.filter_margin = 1e6
    for doc in nlp.pipe(texts):
        assert sum(len(ent) for ent in doc.ents) == len(doc)
        assert max(len(ent) for ent in doc.ents) <= ner.max_width


def test_filter_margin_errors():
    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner")
    assert ner.filter_margin == DEFAULT_FILTER_MARGIN == 0.0  # null in the config: the default
    for bad in (float("nan"), float("inf"), "0.5", True):
        with pytest.raises(ValueError, match="finite number"):
            ner.filter_margin = bad
    assert ner.filter_margin == DEFAULT_FILTER_MARGIN
    ner.filter_margin = 0
    assert ner.filter_margin == 0.0
    exact = nlp.add_pipe("fsemicrf_ner", name="exact",
                         config={"model": model_config("spacy-fsemicrf.SemiCRF.v1")})
    assert exact.filter_margin == 0.0  # the heads that do not filter default to 0
    exact.filter_margin = 0.0
    with pytest.raises(ValueError, match="does not filter"):
        exact.filter_margin = 0.5
    with pytest.raises(ValueError, match="does not filter"):
        nlp.add_pipe("fsemicrf_ner", name="crf", config={
            "model": model_config("spacy-fsemicrf.LinearCRF.v1"), "filter_margin": -1.0})


def test_numpy_numbers_are_taken_as_threshold_and_filter_margin():
    ner = spacy.blank("en").add_pipe("fsemicrf_ner")
    # a score of attrs["scores"] is a NumPy float32; NumPy's bool is no number, as bool is not
    for value in (numpy.float32(0.5), numpy.int64(1)):
        ner.threshold = value
        assert ner.threshold == float(value) and type(ner.threshold) is float
        ner.filter_margin = value
        assert ner.filter_margin == float(value) and type(ner.filter_margin) is float
    for bad in (numpy.bool_(True), numpy.float32("nan"), numpy.float32(1.5)):
        with pytest.raises(ValueError, match="threshold must be a number"):
            ner.threshold = bad
    for bad in (numpy.bool_(True), numpy.float32("nan"), numpy.float64("inf")):
        with pytest.raises(ValueError, match="finite number"):
            ner.filter_margin = bad


# Serialization ---------------------------------------------------------------------------------


def test_to_disk_and_spacy_load_give_identical_predictions(trained_nlp, tmp_path):
    texts = [text for text, _ in TRAIN_DATA]
    before = list(trained_nlp.pipe(texts))
    trained_nlp.to_disk(tmp_path / "pipeline")
    nlp2 = spacy.load(tmp_path / "pipeline")
    assert nlp2.get_pipe("fsemicrf_ner").labels == tuple(LABELS)
    after = list(nlp2.pipe(texts))
    for a, b in zip(before, after):
        assert [(e.start, e.end, e.label_) for e in a.ents] == [
            (e.start, e.end, e.label_) for e in b.ents
        ]
        numpy.testing.assert_allclose(
            a.spans["fsemicrf"].attrs["scores"], b.spans["fsemicrf"].attrs["scores"], rtol=1e-5
        )
    # to_bytes / from_bytes of the component alone
    ner = trained_nlp.get_pipe("fsemicrf_ner")
    nlp3 = spacy.blank("en")
    ner3 = nlp3.add_pipe("fsemicrf_ner")
    ner3.from_bytes(ner.to_bytes())
    assert predicted_set(nlp3.pipe(texts)) == predicted_set(before)


@pytest.mark.parametrize("arch", ["spacy-fsemicrf.FilteredSemiCRF.v1", "spacy-fsemicrf.SemiCRF.v1",
                                  "spacy-fsemicrf.LinearCRF.v1"])
def test_word_pool_trains_saves_and_predicts_each_doc_as_alone(arch, tmp_path):
    """With ``word_pool`` the word ids are made per batch; a document's entities do not depend
    on the batch it comes in, and survive a save and load."""
    nlp = spacy.blank("en")
    nlp.add_pipe("fsemicrf_ner", config={"model": model_config(arch, word_pool=True)})
    examples = make_examples(nlp)
    losses = train_pipeline(nlp, examples, n_iter=40)
    assert losses[-1] < 0.1 * losses[0]
    texts = [text for text, _ in TRAIN_DATA]
    batched = list(nlp.pipe(texts, batch_size=len(texts)))
    assert predicted_set(batched) == gold_set(nlp)
    for text, doc in zip(texts, batched):
        alone = nlp(text)
        assert [(e.start, e.end, e.label_) for e in alone.ents] == [
            (e.start, e.end, e.label_) for e in doc.ents
        ]
        numpy.testing.assert_allclose(
            alone.spans["fsemicrf"].attrs["scores"], doc.spans["fsemicrf"].attrs["scores"],
            rtol=1e-4,
        )
    nlp.to_disk(tmp_path / "pipeline")
    assert predicted_set(spacy.load(tmp_path / "pipeline").pipe(texts)) == predicted_set(batched)


def test_prediction_settings_given_at_load_are_honoured(trained_nlp, tmp_path):
    """``spans_key`` and ``filter_margin`` given to ``spacy.load(..., config=...)`` win over
    the saved ones (they are prediction-time settings, not weights)."""
    trained_nlp.to_disk(tmp_path / "pipeline")
    nlp = spacy.load(tmp_path / "pipeline",
                     config={"components": {"fsemicrf_ner": {"spans_key": "people"}}})
    assert nlp.get_pipe("fsemicrf_ner").spans_key == "people"
    doc = nlp(TRAIN_DATA[1][0])
    assert "people" in doc.spans and "fsemicrf" not in doc.spans
    assert [(s.start, s.end, s.label_) for s in doc.spans["people"]] == [
        (e.start, e.end, e.label_) for e in doc.ents
    ]
    assert spacy.load(tmp_path / "pipeline").get_pipe("fsemicrf_ner").spans_key == "fsemicrf"


@pytest.mark.parametrize("labels,message", [
    ("PER", "list of strings.*did you mean \\['PER'\\]"),
    (["LOC", ""], "non-empty string"),
    (["LOC", 3], "non-empty string"),
])
def test_bad_labels_are_refused(labels, message):
    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner")
    with pytest.raises(ValueError, match=message):
        ner.initialize(lambda: make_examples(nlp), nlp=nlp, labels=labels)
    with pytest.raises(ValueError, match="non-empty string"):
        ner.add_label(" ")


def test_torch_head_is_the_module_that_predicts(trained_nlp):
    import torch

    ner = trained_nlp.get_pipe("fsemicrf_ner")
    head = ner.torch_head
    assert isinstance(head, torch.nn.Module) and type(head).__name__ == "FilteredSemiCRFHead"
    assert head is ner.model.get_ref("head").shims[0]._model


def test_a_head_converted_to_double_predicts_and_trains(trained_nlp):
    import copy

    import torch

    nlp = copy.deepcopy(trained_nlp)
    texts = [text for text, _ in TRAIN_DATA]
    expected = predicted_set(trained_nlp.pipe(texts))
    nlp.get_pipe("fsemicrf_ner").torch_head.double()
    assert predicted_set(nlp.pipe(texts)) == expected
    # the loss and its gradient, back to the float32 tok2vec (Thinc's optimizers update
    # float32 weights only)
    losses = nlp.update(make_examples(nlp), sgd=False, losses={})
    assert math.isfinite(losses["fsemicrf_ner"]) and losses["fsemicrf_ner"] > 0
    head = nlp.get_pipe("fsemicrf_ner").torch_head
    assert all(p.dtype == torch.float64 for p in head.parameters())


def test_uninitialized_pipeline_round_trip(tmp_path):
    nlp = spacy.blank("en")
    nlp.add_pipe("fsemicrf_ner")
    nlp.to_disk(tmp_path / "blank")
    nlp2 = spacy.load(tmp_path / "blank")
    assert nlp2.get_pipe("fsemicrf_ner").labels == ()


@pytest.mark.parametrize(
    "change,match",
    [
        ({"hidden_width": 64}, "hidden_width = 128"),
        ({"context_depth": 1}, "context_depth = 0"),
        ({"doc_vector": False}, "doc_vector = True"),
        # the exact head has no local loss: its options go (None removes a key)
        (
            {"@architectures": "spacy-fsemicrf.SemiCRF.v1", "null_weight": None,
             "boundary_smoothing": None, "null_tokens": None, "train_margin": None,
             "mean_field": None, "exact_loss": None, "focal_gamma": None},
            "FilteredSemiCRF",
        ),
        ({"tok2vec": {"depth": 2}}, "config"),
    ],
)
def test_loading_with_an_incompatible_config_is_a_clear_error(trained_nlp, tmp_path, change, match):
    path = tmp_path / "pipeline"
    trained_nlp.to_disk(path)
    config = spacy.util.load_config(path / "config.cfg")
    model_cfg = config["components"]["fsemicrf_ner"]["model"]
    for key, value in change.items():
        if value is None:
            model_cfg.pop(key)
        elif isinstance(value, dict):
            model_cfg[key].update(value)
        else:
            model_cfg[key] = value
    config.to_disk(path / "config.cfg")
    with pytest.raises(ValueError, match=match):
        spacy.load(path)


def test_entities_never_start_or_end_on_whitespace(trained_nlp, monkeypatch):
    """A head trained on text without whitespace tokens may put an entity edge on one (a double
    space before a name): the entity is trimmed, in doc.ents, its span group and the n-best, and
    one of whitespace only is left out, as spaCy's ner never starts an entity on whitespace."""
    from spacy_fsemicrf import component
    from spacy_fsemicrf.head_model import BatchPrediction
    from spacy_fsemicrf.structured.nbest import Segmentation

    ner = trained_nlp.get_pipe("fsemicrf_ner")
    doc = trained_nlp.make_doc("\nJohn Smith  went to  Paris .  ")
    assert [t.is_space for t in doc] == [True, False, False, True, False, False, True, False,
                                         False, True]
    per, loc = ner.labels.index("PER") + 1, ner.labels.index("LOC") + 1
    rows = numpy.array([[0, 0, 2, per], [0, 3, 3, loc], [0, 6, 7, loc], [0, 9, 9, loc]])
    scores = numpy.array([0.9, 0.8, 0.7, 0.6], dtype="float32")
    ner.set_annotations([doc], BatchPrediction(rows, scores, numpy.ones(1, dtype="float32")))
    assert [(e.text, e.label_) for e in doc.ents] == [("John Smith", "PER"), ("Paris", "LOC")]
    group = doc.spans[ner.spans_key]
    assert list(group) == list(doc.ents)
    assert group.attrs["scores"].tolist() == pytest.approx([0.9, 0.7])
    # segmentations that differ only in an edge's whitespace are one, at the best one's rank
    found = [Segmentation(((6, 7, loc),), 2.0, math.log(0.5)),
             Segmentation(((7, 7, loc),), 1.9, math.log(0.3)),
             Segmentation(((1, 2, per),), 1.8, math.log(0.2))]
    monkeypatch.setattr(component, "model_nbest", lambda *args: [found])
    best = ner.nbest(doc, 3)
    assert [[(s.text, s.label_) for s in g] for g in best] == [[("Paris", "LOC")],
                                                               [("John Smith", "PER")]]
    assert [g.attrs["probability"] for g in best] == pytest.approx([0.5, 0.2])
    assert [g.name for g in best] == [f"{ner.spans_key}_nbest_1", f"{ner.spans_key}_nbest_2"]


def test_loading_with_other_training_settings_applies_them(trained_nlp, tmp_path):
    """Settings that shape neither the weights nor the prediction (dropout, the local loss's)
    may differ at loading, say to fine-tune a pipeline: the head takes the config's values and
    predicts as before."""
    path = tmp_path / "pipeline"
    trained_nlp.to_disk(path)
    # values exact in binary: spaCy 3.7 reads override floats through srsly's JSON reader,
    # which turns 0.3 into 0.30000000000000004
    overrides = {"components.fsemicrf_ner.model.dropout": 0.25,
                 "components.fsemicrf_ner.model.null_weight": 0.5}
    nlp = spacy.load(path, config=overrides)
    head = nlp.get_pipe("fsemicrf_ner").torch_head
    assert head.scorer.dropout.p == 0.25 and head.null_weight == 0.5
    text = "John Smith works for Google in Paris ."
    assert [(e.text, e.label_) for e in nlp(text).ents] == [
        (e.text, e.label_) for e in trained_nlp(text).ents]
    nlp.to_disk(tmp_path / "again")  # and it saves with them
    assert spacy.load(tmp_path / "again").get_pipe("fsemicrf_ner").torch_head.null_weight == 0.5


def test_a_forced_span_keeps_its_whitespace_edges(trained_nlp):
    """A span a force_span constraint asks for is the user's, whitespace and all: only the
    head's own entities are trimmed. The forced spans are those the prediction was decoded
    under."""
    from spacy_fsemicrf.doc_constraints import constraints_of_docs
    from spacy_fsemicrf.head_model import BatchPrediction

    ner = trained_nlp.get_pipe("fsemicrf_ner")
    loc = ner.labels.index("LOC") + 1
    doc = trained_nlp.make_doc("went to  Paris .")
    assert doc[2].is_space and doc[3].text == "Paris"
    doc.user_data["fsemicrf_constraints"] = [
        {"kind": "force_span", "start": 2, "end": 4, "label": "LOC"}]
    decoded = trained_nlp(doc.copy())
    assert [(e.start, e.end) for e in decoded.ents] == [(2, 4)]
    assert decoded.spans["fsemicrf"].attrs["constraints"]["status"] != "infeasible"
    under = constraints_of_docs([doc], (), ner.labels, ner.name)
    prediction = BatchPrediction(numpy.array([[0, 2, 3, loc]]), numpy.array([0.9], "float32"),
                                 numpy.ones(1, dtype="float32"), constraints=under)
    ner.set_annotations([doc], prediction)
    assert [(e.start, e.end) for e in doc.ents] == [(2, 4)]
    doc = trained_nlp.make_doc("went to  Paris .")  # without the constraint: trimmed
    prediction = BatchPrediction(numpy.array([[0, 2, 3, loc]]), numpy.array([0.9], "float32"),
                                 numpy.ones(1, dtype="float32"))
    ner.set_annotations([doc], prediction)
    assert [(e.start, e.end) for e in doc.ents] == [(3, 4)]


def test_an_infeasible_forced_span_keeps_no_entity_from_being_trimmed(trained_nlp):
    """An infeasible document keeps its unconstrained prediction, which holds no forced span:
    an entity of it on the forced span's tokens is the head's own, trimmed of whitespace."""
    from spacy_fsemicrf.doc_constraints import constraints_of_docs
    from spacy_fsemicrf.head_model import BatchPrediction
    from spacy_fsemicrf.structured.constrained import ConstraintReport

    ner = trained_nlp.get_pipe("fsemicrf_ner")
    per = ner.labels.index("PER") + 1
    doc = trained_nlp.make_doc("went to  Paris .")
    doc.user_data["fsemicrf_constraints"] = [  # forced and forbidden: infeasible
        {"kind": "force_span", "start": 2, "end": 4, "label": "LOC"},
        {"kind": "forbid_labels", "labels": ["LOC"], "start": 3, "end": 4}]
    under = constraints_of_docs([doc], (), ner.labels, ner.name)
    report = ConstraintReport("infeasible", 1.0, 1.0, reason="force_span 2..4 has a label "
                              "that forbid_labels forbids there")
    prediction = BatchPrediction(numpy.array([[0, 2, 3, per]]), numpy.array([0.9], "float32"),
                                 numpy.ones(1, dtype="float32"), reports=[report],
                                 constraints=under)
    ner.set_annotations([doc], prediction)
    assert [(e.start, e.end, e.label_) for e in doc.ents] == [(3, 4, "PER")]
    # with the forced label too: the entity is the head's own, not the forced span
    loc = ner.labels.index("LOC") + 1
    doc = trained_nlp.make_doc("went to  Paris .")
    ner.set_annotations([doc], prediction._replace(spans=numpy.array([[0, 2, 3, loc]])))
    assert [(e.start, e.end, e.label_) for e in doc.ents] == [(3, 4, "LOC")]


def test_trim_whitespace_trims_each_edge_and_drops_whitespace_only_rows():
    """Every row is looked at (an untouched row before others does not end the pass), starts
    and ends are trimmed to the nearest token that is not whitespace, a row of whitespace only
    is left out, and a forced span is left as it is."""
    from spacy_fsemicrf.component import trim_whitespace

    vocab = spacy.blank("en").vocab  # (a bare Vocab has no lexical attributes: no is_space)
    words = ["Paris", " ", "is", "in", " ", "France", "\n"]
    docs = [Doc(vocab, words=words, spaces=[False] * 7) for _ in range(2)]
    rows = numpy.array([[0, 0, 0, 1],   # Paris: as it is
                        [0, 1, 2, 1],   # " is" -> is
                        [0, 4, 4, 2],   # " " -> left out
                        [0, 5, 6, 1],   # "France\n" -> France
                        [1, 1, 2, 1],   # forced as it is
                        [1, 4, 6, 2]])  # " France\n" -> France
    before = rows.tolist()
    trimmed, keep = trim_whitespace(docs, rows, lambda d: {(1, 2, 1)} if d == 1 else set())
    assert keep.tolist() == [0, 1, 3, 4, 5]
    assert trimmed[keep].tolist() == [[0, 0, 0, 1], [0, 2, 2, 1], [0, 5, 5, 1], [1, 1, 2, 1],
                                      [1, 5, 5, 2]]
    assert rows.tolist() == before  # a copy is trimmed, not the rows given
    clean = numpy.array([[0, 0, 0, 1], [0, 2, 3, 1]])
    same, keep = trim_whitespace(docs, clean)
    assert keep is None and same is clean and clean.tolist() == [[0, 0, 0, 1], [0, 2, 3, 1]]


def test_nbest_trims_keeps_the_best_of_each_entity_set_and_keeps_forced_spans(
        trained_nlp, monkeypatch):
    """In the n-best, whitespace-only entities go, segmentations that become one are listed
    once, at their best rank and with their own probability, and a forced span keeps its
    edges."""
    from spacy_fsemicrf import component
    from spacy_fsemicrf.structured.nbest import Segmentation

    ner = trained_nlp.get_pipe("fsemicrf_ner")
    loc = ner.labels.index("LOC") + 1
    doc = trained_nlp.make_doc("went to  Paris .")  # token 2 is a space
    found = [Segmentation(((2, 3, loc),), 2.0, math.log(0.5)),
             Segmentation(((2, 2, loc), (3, 3, loc)), 1.9, math.log(0.2)),
             Segmentation(((3, 3, loc),), 1.8, math.log(0.15)),
             Segmentation((), 1.7, math.log(0.1))]
    monkeypatch.setattr(component, "model_nbest", lambda model, docs, k, margin: [found[:k]])
    best = ner.nbest(doc, 2)
    assert [[(s.start, s.end) for s in g] for g in best] == [[(3, 4)], []]
    assert [g.attrs["probability"] for g in best] == pytest.approx([0.5, 0.1])
    assert [g.name for g in best] == ["fsemicrf_nbest_1", "fsemicrf_nbest_2"]
    assert len(ner.nbest(doc, 1)) == 1 and ner.nbest(doc, 1)[0].attrs["probability"] == 0.5
    assert len(ner.nbest(doc, 3)) == 2  # every segmentation found: two entity sets
    doc.user_data["fsemicrf_constraints"] = [
        {"kind": "force_span", "start": 2, "end": 4, "label": "LOC"}]
    best = ner.nbest(doc, 3)
    assert [[(s.start, s.end) for s in g] for g in best] == [[(2, 4)], [(3, 4)], []]
    assert [g.attrs["probability"] for g in best] == pytest.approx([0.5, 0.2, 0.1])


def test_nbest_trims_another_label_on_a_forced_spans_tokens(trained_nlp, monkeypatch):
    """Only the forced entity keeps its whitespace edges: an entity of another label on the
    same tokens is the head's own, and is trimmed like any other."""
    from spacy_fsemicrf import component
    from spacy_fsemicrf.structured.nbest import Segmentation

    ner = trained_nlp.get_pipe("fsemicrf_ner")
    loc, per = ner.labels.index("LOC") + 1, ner.labels.index("PER") + 1
    doc = trained_nlp.make_doc("went to  Paris .")  # token 2 is a space
    doc.user_data["fsemicrf_constraints"] = [
        {"kind": "force_span", "start": 2, "end": 4, "label": "LOC"}]
    found = [Segmentation(((2, 3, per),), 2.0, math.log(0.5)),
             Segmentation(((2, 3, loc),), 1.9, math.log(0.3))]
    monkeypatch.setattr(component, "model_nbest", lambda model, docs, k, margin: [found[:k]])
    best = ner.nbest(doc, 2)
    assert [[(s.start, s.end, s.label_) for s in g] for g in best] == [
        [(3, 4, "PER")], [(2, 4, "LOC")]]


def test_nbest_searches_on_for_k_distinct_entity_sets_up_to_its_limit(trained_nlp, monkeypatch):
    """Whitespace variants of one entity set can fill the first ranks: the search doubles
    until it finds ``k`` distinct sets, runs out of segmentations, or reaches MAX_NBEST."""
    from spacy_fsemicrf import component
    from spacy_fsemicrf.structured.nbest import Segmentation

    ner = trained_nlp.get_pipe("fsemicrf_ner")
    doc = trained_nlp.make_doc("a  b  c  d")  # tokens 1, 3, 5 are spaces
    variants = [Segmentation(((i, i, 1),), 0.0, -0.1 * i) for i in (1, 3, 5)]  # all trim away
    others = [Segmentation(((j, j, 1),), 0.0, -1.0 - j) for j in (0, 2, 4, 6)]
    calls = []

    def fake(model, docs, k, margin):
        calls.append(k)
        return [(variants + others)[:k]]

    monkeypatch.setattr(component, "model_nbest", fake)
    best = ner.nbest(doc, 3)
    assert [[(s.start, s.end) for s in g] for g in best] == [[], [(0, 1)], [(2, 3)]]
    assert calls == [3, 6]
    calls.clear()
    assert len(ner.nbest(doc, 6)) == 5 and calls == [6, 12]  # 7 segmentations: 5 sets
    monkeypatch.setattr(component, "model_nbest", lambda model, docs, k, margin: (
        calls.append(k), [others[:k]])[1])
    calls.clear()
    assert len(ner.nbest(doc, 2)) == 2 and calls == [2]  # k distinct at once: no more search
    monkeypatch.setattr(component, "model_nbest", fake)
    monkeypatch.setattr(component, "MAX_NBEST", 4)
    calls.clear()
    assert len(ner.nbest(doc, 3)) == 2 and calls == [3, 4]
    calls.clear()
    assert len(ner.nbest(doc, 4)) == 2 and calls == [4]  # k may be MAX_NBEST itself
    calls.clear()
    assert len(ner.nbest(doc, numpy.int64(3))) == 2 and calls == [3, 4]  # a NumPy integer too
    assert all(type(k) is int for k in calls)
    for bad in (0, 5, True, 2.0, numpy.bool_(True), numpy.float64(2)):
        with pytest.raises(ValueError, match="^k must be a positive integer up to 4, got"):
            ner.nbest(doc, bad)


def test_written_entities_leave_the_prediction_as_it_is(trained_nlp):
    """Calibration and set_annotations both read a prediction's written entities: the first
    reading trimmed the rows in place, and a row of whitespace only at a document's end then
    pointed past it."""
    from spacy_fsemicrf.head_model import BatchPrediction

    ner = trained_nlp.get_pipe("fsemicrf_ner")
    doc = trained_nlp.make_doc("went to \n")  # token 2 is a space
    prediction = BatchPrediction(numpy.array([[0, 0, 0, 1], [0, 2, 2, 1]]),
                                 numpy.array([0.9, 0.5], "float32"), numpy.ones(1, "float32"))
    rows, raw = ner.written_entities([doc], prediction)
    assert rows.tolist() == [[0, 0, 0, 1]] and raw.tolist() == pytest.approx([0.9])
    assert prediction.spans.tolist() == [[0, 0, 0, 1], [0, 2, 2, 1]]
    ner.set_annotations([doc], prediction)
    assert [(e.start, e.end) for e in doc.ents] == [(0, 1)]
