"""The entity token replacement augmenter: what it replaces, what it keeps, and that the
component does not count its made-up names as seen in training."""
import random

import numpy
import pytest
import spacy
from spacy.tokens import Doc, DocBin
from spacy.training import Corpus, Example

from spacy_fsemicrf.augment import (
    AUGMENTED, ORIGINAL_ENTITIES, create_entity_token_replacement)
from spacy_fsemicrf.calibration import entity_key

TEXTS = [
    ("John Smith met Mary Jones in Paris .", [(0, 10, "PER"), (15, 25, "PER"), (29, 34, "LOC")]),
    ("Anna Karenina lives in New York City now", [(0, 13, "PER"), (23, 36, "LOC")]),
    ("Nothing to see here", []),
]


def examples(nlp, spans=None):
    out = []
    for text, ents in TEXTS:
        data = {"entities": ents}
        if spans and text == TEXTS[0][0]:
            data["spans"] = spans
        out.append(Example.from_dict(nlp.make_doc(text), data))
    return out


def filled(nlp, egs, seed: int):
    """An augmenter that replaces every entity token, its pools filled first with the names of
    ``egs`` (the random module seeded with ``seed``)."""
    augment = create_entity_token_replacement(level=1.0)
    random.seed(seed)
    for eg in egs:
        list(augment(nlp, eg))
    return augment


def entity_tokens(example):
    return {t.i: ent.label_ for ent in example.reference.ents for t in ent}


def test_level_one_replaces_entity_tokens_with_tokens_of_the_same_label():
    nlp = spacy.blank("en")
    augment = create_entity_token_replacement(level=1.0)
    random.seed(3)
    pool = {"PER": set(), "LOC": set()}
    n_changed = 0
    for _ in range(3):
        for eg in examples(nlp):
            for t in eg.reference.ents:
                pool[t.label_].update(tok.text for tok in t)
            (out,) = list(augment(nlp, eg))
            before, after = eg.reference, out.reference
            assert len(after) == len(before)
            assert [(e.start, e.end, e.label_) for e in after.ents] == \
                [(e.start, e.end, e.label_) for e in before.ents]
            inside = entity_tokens(eg)
            for i, token in enumerate(after):
                if i in inside:
                    assert token.text in pool[inside[i]]
                    n_changed += token.text != before[i].text
                else:
                    assert token.text == before[i].text
                assert token.whitespace_ == before[i].whitespace_
            assert out.predicted.text == after.text
            if out is not eg:
                assert after.user_data[AUGMENTED] is True
    assert n_changed > 5


def test_level_zero_is_a_no_op_that_draws_no_random_numbers():
    nlp = spacy.blank("en")
    augment = create_entity_token_replacement(level=0.0, pool_size=1)
    random.seed(0)
    state = random.getstate()
    for eg in examples(nlp) * 3:
        (out,) = list(augment(nlp, eg))
        assert out is eg
    assert random.getstate() == state


def test_a_replacing_token_brings_its_lemma():
    nlp = spacy.blank("en")
    augment = create_entity_token_replacement(level=1.0)
    random.seed(0)
    n_changed = 0
    for eg in examples(nlp) * 3:
        ref = eg.reference
        ref_lemmas = Doc(nlp.vocab, words=[t.text for t in ref],
                         spaces=[bool(t.whitespace_) for t in ref],
                         lemmas=[t.text.lower() for t in ref],
                         ents=[t.ent_iob_ + "-" + t.ent_type_ if t.ent_type_ else "O" for t in ref])
        (out,) = list(augment(nlp, Example(eg.predicted, ref_lemmas)))
        n_changed += out.reference.text != ref.text
        assert [t.lemma_ for t in out.reference] == [t.text.lower() for t in out.reference]
    assert n_changed > 2
    # documents without lemmas give none to the tokens they lend
    augment = create_entity_token_replacement(level=1.0)
    out = [out for eg in examples(nlp) * 2 for out in augment(nlp, eg)]
    assert any(eg.reference.user_data.get(AUGMENTED) for eg in out)
    assert not any(eg.reference.has_annotation("LEMMA") for eg in out)


@pytest.mark.parametrize("parsed", [False, True])
def test_sentence_starts_are_kept(parsed):
    nlp = spacy.blank("en")
    augment = filled(nlp, examples(nlp), seed=0)
    words = ["John", "Smith", "left", ".", "Paris", "slept", "."]
    starts = [True, False, False, False, True, False, None]  # the last one unknown
    extra = {"heads": [2, 2, 2, 2, 5, 5, 5], "deps": ["dep"] * 7} if parsed else {}
    ref = Doc(nlp.vocab, words=words, ents=["B-PER", "I-PER", "O", "O", "B-LOC", "O", "O"],
              sent_starts=None if parsed else starts, **extra)
    (out,) = list(augment(nlp, Example(nlp.make_doc(ref.text), ref)))
    assert out.reference.text != ref.text
    assert [t.is_sent_start for t in out.reference] == [t.is_sent_start for t in ref]
    assert [t.head.i for t in out.reference] == [t.head.i for t in ref]


def test_span_groups_keep_their_tokens():
    nlp = spacy.blank("en")
    spans = {"sc": [(15, 25, "PER"), (29, 36, "X")]}  # "Mary Jones", "Paris ."
    augment = filled(nlp, examples(nlp, spans)[1:], seed=1)
    eg = examples(nlp, spans)[0]
    (out,) = list(augment(nlp, eg))
    assert out is not eg
    group = out.reference.spans["sc"]
    assert [(s.start, s.end, s.label_) for s in group] == [(3, 5, "PER"), (6, 8, "X")]
    assert group[1][-1].text == "."


def test_entity_links_keep_their_tokens():
    """Links are given by character offsets, which the new token texts shift."""
    nlp = spacy.blank("en")
    augment = filled(nlp, examples(nlp)[1:], seed=1)
    text, ents = TEXTS[0]
    links = {(15, 25): {"Q1": 1.0}, (29, 34): {"Q90": 1.0}}  # "Mary Jones", "Paris"
    eg = Example.from_dict(nlp.make_doc(text), {"entities": ents, "links": links})
    (out,) = list(augment(nlp, eg))
    assert out is not eg and out.reference.text != text
    assert [(e.start, e.end, e.label_, e.kb_id_) for e in out.reference.ents] == \
        [(0, 2, "PER", ""), (3, 5, "PER", "Q1"), (6, 7, "LOC", "Q90")]


def test_the_component_does_not_count_made_up_names_as_seen():
    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner")
    augment = create_entity_token_replacement(level=1.0)
    random.seed(2)
    train = [out for _ in range(2) for eg in examples(nlp) for out in augment(nlp, eg)]
    assert any(eg.reference.user_data.get(AUGMENTED) for eg in train)
    nlp.initialize(lambda: train)
    # the names of the training data, those of the augmented examples' originals included
    real = {text[s:e] for text, ents in TEXTS for s, e, _ in ents}
    made_up = {ent.text for eg in train if eg.reference.user_data.get(AUGMENTED)
               for ent in eg.reference.ents} - real
    assert made_up
    seen = set(ner.seen_entities.tolist())
    assert {entity_key(t) for t in real} <= seen
    assert not {entity_key(t) for t in made_up} & seen
    assert set(ner.labels) == {"LOC", "PER"}


def test_the_names_of_augmented_training_documents_count_as_seen(tmp_path):
    """In spacy train the augmenter's variants take the place of their examples in the stream
    initialize reads: the real names of those examples are still seen in training."""
    nlp = spacy.blank("en")
    db = DocBin(docs=[eg.reference for eg in examples(nlp)])
    db.to_disk(tmp_path / "train.spacy")
    corpus = Corpus(tmp_path / "train.spacy", augmenter=create_entity_token_replacement(level=1.0))
    ner = nlp.add_pipe("fsemicrf_ner")
    random.seed(0)
    for _ in range(2):  # the second pass has a full pool: every document with entities changes
        train = list(corpus(nlp))
    assert all(eg.reference.user_data.get(AUGMENTED) for eg in train if eg.reference.ents)
    assert train[0].reference.user_data[ORIGINAL_ENTITIES] == ["John Smith", "Mary Jones", "Paris"]
    nlp.initialize(lambda: train)
    real = {text[s:e] for text, ents in TEXTS for s, e, _ in ents}
    made_up = {ent.text for eg in train for ent in eg.reference.ents} - real
    assert made_up
    seen = set(ner.seen_entities.tolist())
    assert {entity_key(t) for t in real} <= seen
    assert not {entity_key(t) for t in made_up} & seen


def test_it_runs_from_a_config_through_spacys_corpus(tmp_path):
    nlp = spacy.blank("en")
    db = DocBin(docs=[eg.reference for eg in examples(nlp)])
    db.to_disk(tmp_path / "train.spacy")
    make = spacy.registry.augmenters.get("spacy-fsemicrf.entity_token_replacement.v1")
    corpus = Corpus(tmp_path / "train.spacy", augmenter=make(level=1.0))
    random.seed(0)
    out = [list(corpus(nlp)) for _ in range(3)][-1]
    assert len(out) == len(TEXTS)
    assert any(eg.reference.user_data.get(AUGMENTED) for eg in out)
    assert [[(e.start, e.end, e.label_) for e in eg.reference.ents] for eg in out] == \
        [[(e.start, e.end, e.label_) for e in eg.reference.ents] for eg in examples(nlp)]


def test_missing_entity_annotation_stays_missing():
    nlp = spacy.blank("en")
    augment = filled(nlp, examples(nlp), seed=0)
    # "-": no annotation; "O": annotated as outside any entity
    tags = ["B-PER", "L-PER", "O", "-", "-", "U-LOC", "-"]
    eg = Example.from_dict(nlp.make_doc("John Smith lives near Lake Geneva ."),
                           {"entities": tags})
    (out,) = list(augment(nlp, eg))
    assert out is not eg
    after = out.reference
    assert [t.ent_iob_ for t in after] == ["B", "I", "O", "", "", "B", ""]
    assert [(e.start, e.end, e.label_) for e in after.ents] == [(0, 2, "PER"), (5, 6, "LOC")]
    assert after.has_annotation("ENT_IOB")


@pytest.mark.parametrize("kwargs", [{"level": -0.1}, {"level": 1.5}, {"level": float("nan")},
                                    {"pool_size": 0}, {"pool_size": float("nan")},
                                    {"pool_size": 2.5}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        create_entity_token_replacement(**kwargs)


def test_a_numpy_pool_size_is_taken():
    nlp = spacy.blank("en")
    augment = create_entity_token_replacement(level=1.0, pool_size=numpy.int64(2))
    assert [out for eg in examples(nlp) for out in augment(nlp, eg)]
