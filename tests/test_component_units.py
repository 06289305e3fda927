"""Component methods that need no trained model: the report of gold entities too wide to learn,
the loss of a batch, the prediction for documents without tokens."""
import logging

import numpy
import pytest
import spacy
from spacy.tokens import Doc
from spacy.training import Example

try:  # tests/ as a package (tests/__init__.py) or as a plain directory
    from .conftest import make_examples, model_config
except ImportError:  # pragma: no cover
    from conftest import make_examples, model_config


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
        assert f": {total} gold entities wider than max_width={ner.max_width} tokens" in warned[n][0]
        assert f"max_width={widest} would keep them all" in warned[n][0]
    assert ner.n_wide_dropped == 100 and ner.widest_dropped == 20


@pytest.fixture(scope="module")
def initialized():
    """An initialized (untrained) filtered-head pipeline on the small tok2vec, without dropout
    in the head (so that a training step and a prediction see the same model)."""
    nlp = spacy.blank("en")
    nlp.add_pipe("fsemicrf_ner", config={"model": model_config(dropout=0.0)})
    examples = make_examples(nlp)
    nlp.initialize(lambda: examples)
    return nlp, examples


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


def test_documents_without_tokens_predict_nothing_with_the_usual_types(initialized):
    nlp, _ = initialized
    ner = nlp.get_pipe("fsemicrf_ner")
    prediction = ner.predict([nlp.make_doc(""), nlp.make_doc("")])
    assert prediction.spans.shape == (0, 4) and prediction.spans.dtype == numpy.int64
    assert prediction.scores.shape == (0,) and prediction.scores.dtype == numpy.float32
    assert prediction.path.tolist() == [1.0, 1.0]


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
    nlp = spacy.blank("en")
    nlp.add_pipe("fsemicrf_ner", config={"model": model_config(max_width=2)})
    data = [
        ("Bank of America rose .", [(0, 15, "ORG")]),  # 3 tokens
        ("John Smith left .", [(0, 10, "PER")]),  # 2 tokens: fits
        ("The United Nations Security Council met .", [(4, 35, "ORG")]),  # 4 tokens
    ]
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        nlp.initialize(lambda: make_examples(nlp, data))
    warnings = [r.getMessage() for r in caplog.records if "wider than" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].startswith("fsemicrf_ner: 2 of 3 gold entities in the initialization examples")
    assert "max_width=2 tokens" in warnings[0] and "max_width=4 would keep them all" in warnings[0]


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
