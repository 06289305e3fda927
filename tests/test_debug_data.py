"""``python -m spacy_fsemicrf debug-data``: the entity checks of ``spacy debug data`` for the
``fsemicrf_ner`` components of a training config count what their training reads (the split of
:func:`spacy_fsemicrf.gold.example_entities`, which ``update`` uses too)."""
import logging
import re
from pathlib import Path

import pytest
import spacy
from spacy import util
from spacy.tokens import Doc, DocBin, Span
from spacy.training import Corpus, Example

from spacy_fsemicrf.__main__ import main as package_main
from spacy_fsemicrf.debug_data import main
from spacy_fsemicrf.gold import example_entities

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def doc(vocab, words, ents=None, spaces=None, sent_starts=None):
    return Doc(vocab, words=words, spaces=spaces, ents=ents, sent_starts=sent_starts)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """A training and a dev corpus with one of each thing the checks look for."""
    vocab = spacy.blank("en").vocab
    folder = tmp_path_factory.mktemp("corpora")
    train = [
        doc(vocab, ["Ann", "met", "the", "Bank", "of", "New", "York", "."],
            ["B-PER", "O", "O", "B-ORG", "I-ORG", "I-ORG", "I-ORG", "O"]),
        # "Mc" is no token of the pipeline's tokenization of "McDonald"
        doc(vocab, ["Mc", "Donald", "sells", "."], ["B-ORG", "O", "O", "O"],
            spaces=[False, True, False, False]),
        doc(vocab, ["no", "annotation", "here"]),  # ENT_IOB 0 everywhere: not read
        doc(vocab, ["Bob", "ran", "far", "away"], ["B-PER", "O", None, None]),  # partly
        doc(vocab, ["Hi", "\n", "Ann"], ["O", "B-PER", "B-PER"], spaces=[False, False, False]),
        doc(vocab, ["Eve", "Smith", "left"], ["B-PER", "I-PER", "O"],
            sent_starts=[True, True, False]),  # an entity across a sentence boundary
    ]
    dev = [doc(vocab, ["Paris", "and", "the", "Bank", "of", "New", "York"],
               ["B-LOC", "O", "O", "B-ORG", "I-ORG", "I-ORG", "I-ORG"])]
    DocBin(docs=train).to_disk(folder / "train.spacy")
    DocBin(docs=dev).to_disk(folder / "dev.spacy")
    DocBin(docs=[doc(vocab, ["a", "b"], ["O", "O"])]).to_disk(folder / "none.spacy")
    # binary annotation: one accepted entity, and rejected ones on a document of its own
    accepted = doc(vocab, ["Ann", "met", "Bob"], ["B-PER", "", ""])
    rejected = doc(vocab, ["Paris", "said", "hi"])
    rejected.spans["incorrect_spans"] = [Span(rejected, 0, 1, "PER"), Span(rejected, 0, 1, "FOO")]
    DocBin(docs=[accepted, rejected]).to_disk(folder / "rejected.spacy")
    # the rejected PER twice in one document's span group, and once in another document
    twice = doc(vocab, ["Paris", "said", "hi"])
    twice.spans["incorrect_spans"] = [Span(twice, 0, 1, "PER"), Span(twice, 0, 1, "PER"),
                                      Span(twice, 0, 1, "FOO")]
    once = doc(vocab, ["Paris", "said", "hi"])
    once.spans["incorrect_spans"] = [Span(once, 0, 1, "PER")]
    DocBin(docs=[accepted, twice, once]).to_disk(folder / "repeated.spacy")
    DocBin(docs=[doc(vocab, ["Paris", "met", "Bob"], ["B-LOC", "O", "B-FOO"])]).to_disk(
        folder / "foo_dev.spacy")
    unannotated_space = doc(vocab, ["Ann", "\n", "Bob"], ["B-PER", "", ""], spaces=[False] * 3)
    DocBin(docs=[unannotated_space]).to_disk(folder / "space.spacy")
    # at the edges of the checks: 50 PERs, one two tokens wide ending on whitespace, one two
    # tokens wide starting a sentence; a misaligned entity in the dev data only
    words = " and ".join(f"P{i}" for i in range(48)).split()
    DocBin(docs=[
        doc(vocab, words, ["B-PER" if i % 2 == 0 else "O" for i in range(len(words))]),
        doc(vocab, ["Bob", "\n"], ["B-PER", "I-PER"], spaces=[False, False]),
        doc(vocab, ["Hi", ".", "Eve", "Smith", "left"], ["O", "O", "B-PER", "I-PER", "O"],
            sent_starts=[True, False, True, False, False]),
    ]).to_disk(folder / "edges.spacy")
    DocBin(docs=[doc(vocab, ["Mc", "Donald", "sells"], ["B-ORG", "O", "O"],
                     spaces=[False, True, False])]).to_disk(folder / "edges_dev.spacy")
    # 51 PERs, enough; every ORG and FOO off the pipeline's tokens ("McDonald", "Foobar")
    words = " and ".join(f"P{i}" for i in range(51)).split()
    DocBin(docs=[
        doc(vocab, words, ["B-PER" if i % 2 == 0 else "O" for i in range(len(words))]),
        doc(vocab, ["Mc", "Donald", "sells"], ["B-ORG", "O", "O"], spaces=[False, True, False]),
        doc(vocab, ["Fo", "obar", "left"], ["B-FOO", "O", "O"], spaces=[False, True, False]),
    ]).to_disk(folder / "unlearned.spacy")
    return folder


def sourced_config(config, folder: Path) -> Path:
    """A config whose tok2vec and fsemicrf_ner are sourced from a pipeline of ``config``
    initialized on one document (labels PER and FOO), both written into ``folder``."""
    nlp = util.load_model_from_config(config, auto_fill=True)
    nlp.initialize(lambda: [Example(nlp.make_doc("Ann met Bob"), doc(
        nlp.vocab, ["Ann", "met", "Bob"], ["B-PER", "O", "B-FOO"]))])
    nlp.to_disk(folder / "trained")
    sourced = config.copy()
    for name in ("tok2vec", "fsemicrf_ner"):
        sourced["components"][name] = {"source": str(folder / "trained")}
    sourced.to_disk(folder / "sourced.cfg")
    return folder / "sourced.cfg"


@pytest.fixture(scope="module")
def sourced(tmp_path_factory):
    """A config whose components are sourced from a pipeline trained with the labels FOO and
    PER (initialized only: spacy train reads its labels, not its weights)."""

    folder = tmp_path_factory.mktemp("sourced")
    config = util.load_config(CONFIGS / "fsemicrf_cnn.cfg")
    return sourced_config(config, folder)


def run(config, corpora, capsys, *extra, train="train.spacy", dev="dev.spacy"):
    argv = [str(CONFIGS / config), "--no-format", "--paths.train", str(corpora / train),
            "--paths.dev", str(corpora / dev), *extra]
    status = main(argv)
    return status, " ".join(capsys.readouterr().out.split())


def test_reports_what_training_reads(corpora, capsys):
    status, out = run("fsemicrf_cnn.cfg", corpora, capsys, "--verbose",
                      "--components.fsemicrf_ner.model.max_width", "3")
    assert status == 0
    assert "Head FilteredSemiCRF: entities of at most max_width=3 tokens" in out
    assert "6 training docs, 5 with entity annotation; 1 evaluation docs" in out
    assert "1 training docs have no entity annotation" in out
    # kept: Ann, Bob, the whitespace PER, Ann, Eve Smith; left out: the Bank (wide), Mc
    assert "5 entities to train on, 1 label(s)" in out
    assert "Labels in train data: 'PER' (5)" in out
    # unknown to the loss: Bob's "far away", the tokens of the Bank (wide) and of "McDonald"
    # (a misaligned entity's token), on the pipeline's tokens ("McDonald" is one)
    assert "7 of 21 tokens of the annotated training docs (33.3%) are unknown to the loss" in out
    assert "Low number of examples for label 'PER' (5)" in out
    assert ("1 training entities wider than max_width=3 tokens are left out of training (their "
            "tokens unknown): 'ORG' (1); max_width=4 would keep them all") in out
    assert "1 training entities do not start or end on a token edge" in out
    assert "E.g. 'Mc'" in out
    assert ("Labels in the evaluation data but not in the training data, which the component "
            "cannot predict: 'LOC' ") in out
    # every training ORG is left out: it is in the training data, and never learned
    assert ("Labels in the evaluation data that training does not learn (named above), which "
            "the component cannot predict: 'ORG' ") in out
    assert ("1 evaluation entities are wider than max_width=3 tokens, which the component "
            "cannot predict: 'ORG' (1); max_width=4 would let it predict them all") in out
    assert "1 training entities start or end on a whitespace token" in out
    assert "1 training entities cross a sentence boundary" in out
    assert "0 errors" in out


def test_the_linear_crf_has_no_width_limit(corpora, capsys):
    status, out = run("crf_cnn.cfg", corpora, capsys, "--components.fsemicrf_ner.model.max_width",
                      "3")
    assert status == 0
    assert "Head LinearCRF: no limit on an entity's width" in out
    assert "6 entities to train on, 2 label(s)" in out
    assert "wider than" not in out
    assert "cannot predict: 'LOC'" in out  # ORG is trained on now


def test_reports_the_entities_known_to_be_wrong(corpora, capsys):
    status, out = run("fsemicrf_cnn.cfg", corpora, capsys, train="rejected.spacy")
    assert "2 training docs, 1 with entity annotation" in out and "known to be wrong" not in out
    status, out = run("fsemicrf_cnn.cfg", corpora, capsys,
                      "--components.fsemicrf_ner.incorrect_spans_key", "incorrect_spans",
                      train="rejected.spacy")
    assert status == 0
    assert "2 training docs, 2 with entity annotation" in out
    assert "5 of 6 tokens of the annotated training docs (83.3%) are unknown to the loss" in out
    assert ("2 training spans in doc.spans['incorrect_spans'], entities known to be wrong: 1 "
            "read, 1 left out") in out


def test_a_span_known_to_be_wrong_repeated_in_its_doc_is_read_once(corpora, capsys):
    """Training reads the spans of a document's group as a set (the component's
    _incorrect_rows): a duplicate in one document is read once, the same span in another
    document is read again."""
    status, out = run("fsemicrf_cnn.cfg", corpora, capsys,
                      "--components.fsemicrf_ner.incorrect_spans_key", "incorrect_spans",
                      train="repeated.spacy")
    assert status == 0
    assert "3 training docs, 3 with entity annotation" in out
    assert ("4 training spans in doc.spans['incorrect_spans'], entities known to be wrong: 2 "
            "read, 1 duplicates of another span of their doc (read once), 1 left out") in out


def test_an_unannotated_whitespace_token_is_not_unknown_to_the_loss(corpora, capsys):
    """Training reads it as outside any entity (partial.known_tokens), as spaCy's ner does."""
    status, out = run("fsemicrf_cnn.cfg", corpora, capsys, train="space.spacy")
    assert status == 0
    assert "1 of 3 tokens of the annotated training docs (33.3%) are unknown to the loss" in out


def test_no_entity_to_train_on_fails(corpora, capsys):
    status, out = run("fsemicrf_cnn.cfg", corpora, capsys, train="none.spacy")
    assert status == 1
    assert "No entities to train on in the training data" in out
    assert "1 errors" in out


def test_unreadable_corpus_and_config(corpora, capsys, tmp_path):
    with pytest.raises(SystemExit) as err:
        run("fsemicrf_cnn.cfg", corpora, capsys, train="missing.spacy")
    assert err.value.code == 1
    assert "cannot read the corpus corpora.train" in capsys.readouterr().err

    config = util.load_config(CONFIGS / "fsemicrf_cnn.cfg")
    del config["corpora"]
    config.to_disk(tmp_path / "no_corpora.cfg")
    with pytest.raises(SystemExit) as err:
        main([str(tmp_path / "no_corpora.cfg")])
    assert err.value.code == 1
    assert ("error: the config has no section [corpora] for the corpora corpora.train and "
            "corpora.dev of [training]") in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        main([str(tmp_path / "none.cfg")])
    assert err.value.code == 2
    assert "no such config file" in capsys.readouterr().err


def test_runs_from_the_package_command(corpora, capsys):
    argv = ["debug-data", str(CONFIGS / "fsemicrf_cnn.cfg"), "-NF", "--paths.train",
            str(corpora / "train.spacy"), "--paths.dev", str(corpora / "dev.spacy")]
    assert package_main(argv) == 0
    assert "fsemicrf_ner: fsemicrf_ner" in capsys.readouterr().out


def test_example_entities_splits_as_training_reads():
    nlp = spacy.blank("en")
    ref = doc(nlp.vocab, ["Mc", "Donald", "and", "the", "Bank", "of", "Rome"],
              ["B-ORG", "O", "O", "O", "B-ORG", "I-ORG", "I-ORG"],
              spaces=[False, True, True, True, True, True, False])
    eg = Example(nlp.make_doc(ref.text), ref)
    split = example_entities(eg, 2)
    assert [e.text for e in split.kept] == []
    assert [e.text for e in split.misaligned] == ["Mc"]
    assert [(e.text, e.start, e.end) for e in split.wide] == [("Bank of Rome", 3, 6)]
    assert split.wide[0].doc is eg.predicted
    split = example_entities(eg, None)
    assert [e.text for e in split.kept] == ["Bank of Rome"] and not split.wide
    assert example_entities(Example(nlp.make_doc("a b"), nlp.make_doc("a b")), 2) is None


def test_entities_known_to_be_wrong_are_read_with_the_labels_the_component_trains_with(
        corpora, capsys, tmp_path):
    """The rejected "Paris" is a FOO and a PER, and the training entities are PERs only: FOO is
    read where the component has it, from [initialize.components] or from the trained pipeline
    it is sourced from (spacy train does not initialize it again), as its training reads it."""

    config = util.load_config(CONFIGS / "fsemicrf_cnn.cfg")
    config["components"]["fsemicrf_ner"]["incorrect_spans_key"] = "incorrect_spans"
    config["initialize"]["components"]["fsemicrf_ner"] = {"labels": ["FOO", "PER"]}
    config.to_disk(tmp_path / "labels.cfg")
    status, out = run(tmp_path / "labels.cfg", corpora, capsys, train="rejected.spacy")
    assert status == 0
    assert ("2 training spans in doc.spans['incorrect_spans'], entities known to be wrong: 2 "
            "read, 0 left out") in out
    del config["initialize"]["components"]["fsemicrf_ner"]
    status, out = run(sourced_config(config, tmp_path), corpora, capsys, train="rejected.spacy")
    assert status == 0
    assert "entities known to be wrong: 2 read, 0 left out" in out


def test_dev_labels_a_sourced_component_has_are_labels_it_can_predict(corpora, sourced, capsys):
    """spacy train keeps a sourced component's labels: the dev FOO is one it can predict, though
    no training entity is a FOO; the dev LOC is none."""
    status, out = run(sourced, corpora, capsys, train="space.spacy", dev="foo_dev.spacy")
    assert status == 0
    assert ("Labels in the evaluation data but not in the component's labels or the training "
            "data, which the component cannot predict: 'LOC'") in out
    status, out = run("fsemicrf_cnn.cfg", corpora, capsys, train="space.spacy",
                      dev="foo_dev.spacy")
    assert ("Labels in the evaluation data but not in the training data, which the component "
            "cannot predict: 'FOO', 'LOC'") in out


def test_training_labels_the_component_does_not_have_are_added(corpora, sourced, capsys,
                                                                tmp_path):
    """Training adds a label new to the component (as spaCy's ner): to a sourced one (FOO, PER:
    the training ORG is new) and to one given [initialize.components] labels; a frozen
    component is not trained, so it predicts only its own labels."""

    status, out = run(sourced, corpora, capsys)
    assert status == 0
    assert ("Labels in the training data that the component does not have: 'ORG': training "
            "adds them to it (its head grows;") in out
    assert ("not in the component's labels or the training data, which the component cannot "
            "predict: 'LOC' ") in out  # the dev ORG is learned
    status, out = run(sourced, corpora, capsys, "--training.frozen_components",
                      '["fsemicrf_ner"]')
    assert status == 0 and "does not have" not in out
    assert ("Labels in the evaluation data but not in the component's labels, which the "
            "component cannot predict: 'LOC', 'ORG'") in out
    config = util.load_config(CONFIGS / "fsemicrf_cnn.cfg")
    config["initialize"]["components"]["fsemicrf_ner"] = {"labels": ["PER"]}
    config.to_disk(tmp_path / "labels.cfg")
    status, out = run(tmp_path / "labels.cfg", corpora, capsys)
    assert status == 0
    assert ("the component does not have: 'ORG': training adds them to it (they are not in "
            "[initialize.components.fsemicrf_ner.labels])") in out


def test_the_checks_at_their_edges(corpora, capsys):
    """An entity as wide as max_width is kept, 50 examples of a label are few (as spacy debug
    data counts), an entity that ends on whitespace is one, one that starts a sentence crosses
    none, and a misaligned dev entity is no training entity."""
    status, out = run("fsemicrf_cnn.cfg", corpora, capsys, "--components.fsemicrf_ner.model."
                      "max_width", "2", train="edges.spacy", dev="edges_dev.spacy")
    assert status == 0
    assert "50 entities to train on, 1 label(s)" in out
    assert "No training entity wider than max_width=2" in out
    assert "Low number of examples for label 'PER' (50)" in out
    assert "1 training entities start or end on a whitespace token" in out
    assert "cross a sentence boundary" not in out
    assert "1 evaluation entities do not start or end on a token edge" in out
    assert "All entities start and end on token edges" not in out


def test_evaluation_docs_with_entities_known_to_be_wrong_only_are_not_annotated(corpora, capsys):
    """Evaluation reads doc.ents only: a dev document with rejected entities and no entity
    annotation is no annotated evaluation doc."""
    status, out = run("fsemicrf_cnn.cfg", corpora, capsys,
                      "--components.fsemicrf_ner.incorrect_spans_key", "incorrect_spans",
                      train="rejected.spacy", dev="rejected.spacy")
    assert "2 training docs, 2 with entity annotation; 2 evaluation docs, 1 with entity " in out


def test_a_pipeline_without_the_component_fails(corpora, capsys, tmp_path):

    config = util.load_config(CONFIGS / "fsemicrf_cnn.cfg")
    config["nlp"]["pipeline"] = ["tok2vec"]
    del config["components"]["fsemicrf_ner"]
    config.to_disk(tmp_path / "tok2vec.cfg")
    status, out = run(tmp_path / "tok2vec.cfg", corpora, capsys)
    assert status == 1
    assert "The config's pipeline has no fsemicrf_ner component (its components: tok2vec)" in out


def test_code_registers_the_configs_functions(corpora, capsys, tmp_path):

    code = tmp_path / "functions.py"
    code.write_text(
        "import spacy\n\n\n"
        "@spacy.registry.tokenizers('test_debug_data.plain_tokenizer.v1')\n"
        "def plain_tokenizer():\n"
        "    return lambda nlp: spacy.tokenizer.Tokenizer(nlp.vocab)\n"
    )
    config = util.load_config(CONFIGS / "fsemicrf_cnn.cfg")
    config["nlp"]["tokenizer"] = {"@tokenizers": "test_debug_data.plain_tokenizer.v1"}
    config.to_disk(tmp_path / "code.cfg")
    with pytest.raises(SystemExit) as err:
        run(tmp_path / "code.cfg", corpora, capsys)
    assert err.value.code == 1
    assert "'test_debug_data.plain_tokenizer.v1' in function registry" in capsys.readouterr().err
    status, out = run(tmp_path / "code.cfg", corpora, capsys, "--code", str(code))
    assert status == 0 and "6 training docs, 5 with entity annotation" in out


OFF_TOKENS = ("has an edge inside a token of the documents the pipeline predicts on (the "
              "pipeline's tokenizer splits the text otherwise than the corpus)")
RETOKENIZE = ("[corpora.train] gold_preproc = true (training on the corpus's tokens) or a "
              "tokenizer that splits as the corpus does")


def test_a_label_with_no_entity_to_learn_from_is_named(corpora, capsys):
    """Every training ORG is too wide (the Bank of New York, 4 tokens) or off the pipeline's
    tokens ("Mc"): the counts of such entities did not say that the label is never learned,
    which the component says only once training meets it. Named in the component's words."""
    status, out = run("fsemicrf_cnn.cfg", corpora, capsys,
                      "--components.fsemicrf_ner.model.max_width", "3")
    assert status == 0
    assert (f"Every gold entity of the label 'ORG' in the training data is wider than "
            f"max_width=3 tokens or {OFF_TOKENS}, so the label is not learned and never "
            f"predicted (until training reads one at most 3 tokens wide on token edges). "
            f"max_width=4 would keep the wide ones; {RETOKENIZE} would keep the others.") in out
    for config in ("fsemicrf_cnn.cfg", "crf_cnn.cfg"):  # the Bank of New York is learned
        status, out = run(config, corpora, capsys)
        assert status == 0 and "of the label" not in out


def _named(out: str) -> list:
    """The labels that debug-data names as off the pipeline's tokens only."""
    return re.findall(rf"Every gold entity of the label '(\w+)' in the training data "
                      rf"{re.escape(OFF_TOKENS)}, so the label is not learned and never "
                      rf"predicted \(until training reads one on token edges\)\. "
                      rf"{re.escape(RETOKENIZE)} would keep them\.", out)


def test_the_labels_named_are_those_the_component_names_in_training(corpora, sourced, capsys,
                                                                     caplog):
    """The labels it has not learned when training starts: all of a component spacy train
    initializes (FOO and ORG, as its initialize says), only those training adds to a sourced one
    (ORG: it has learned FOO), none of a frozen one (not trained). PER has examples enough, and
    that is all labels only where no label is named."""
    status, out = run("fsemicrf_cnn.cfg", corpora, capsys, train="unlearned.spacy")
    assert status == 0 and _named(out) == ["FOO", "ORG"]
    assert "Good amount of examples" not in out
    nlp = util.load_model_from_config(util.load_config(CONFIGS / "fsemicrf_cnn.cfg"),
                                      auto_fill=True)
    examples = list(Corpus(corpora / "unlearned.spacy")(nlp))
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        nlp.initialize(lambda: examples)
    assert re.findall(r"every gold entity of the label '(\w+)'", caplog.text) == ["FOO", "ORG"]
    status, out = run(sourced, corpora, capsys, train="unlearned.spacy")
    assert status == 0 and _named(out) == ["ORG"]
    status, out = run(sourced, corpora, capsys, "--training.frozen_components",
                      '["fsemicrf_ner"]', train="unlearned.spacy")
    assert status == 0 and _named(out) == []
    assert "Good amount of examples for all labels" in out


def _no_entity(out: str) -> list:
    """The labels that debug-data names as having no training entity at all."""
    return re.findall(r"The label '(\w+)' has no gold entity in the training data, so it is "
                      r"not learned and never predicted \(until training reads one\)\. Remove "
                      r"it from the labels the component is given, or add examples annotated "
                      r"with it\.", out)


def test_a_given_label_without_a_training_entity_is_named(corpora, sourced, capsys, caplog,
                                                          tmp_path):
    """Labels of [initialize.components] with no training entity (labels of another corpus, a
    typo: GPE, LOC) are never learned: named as the component names them at initialize, and a
    dev label of them is one training does not learn (not one absent from the training data,
    as FOO is). A sourced component's own labels are learned (FOO); training data without
    entities names no label (nothing is to train on)."""
    config = util.load_config(CONFIGS / "fsemicrf_cnn.cfg")
    config["initialize"]["components"]["fsemicrf_ner"] = {"labels": ["GPE", "LOC", "PER"]}
    config.to_disk(tmp_path / "labels.cfg")
    status, out = run(tmp_path / "labels.cfg", corpora, capsys, train="space.spacy",
                      dev="foo_dev.spacy")
    assert status == 0 and _no_entity(out) == ["GPE", "LOC"]
    assert ("Labels in the evaluation data but not in the training data, which the component "
            "cannot predict: 'FOO' ") in out
    assert ("Labels in the evaluation data that training does not learn (named above), which "
            "the component cannot predict: 'LOC' ") in out
    nlp = util.load_model_from_config(config, auto_fill=True)
    examples = list(Corpus(corpora / "space.spacy")(nlp))
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        nlp.initialize(lambda: examples)
    assert re.findall(r"the label '(\w+)' has no gold entity", caplog.text) == ["GPE", "LOC"]
    status, out = run(tmp_path / "labels.cfg", corpora, capsys, train="none.spacy")
    assert status == 1 and "No entities to train on" in out and "has no gold entity" not in out
    status, out = run(sourced, corpora, capsys, train="space.spacy", dev="foo_dev.spacy")
    assert status == 0 and "has no gold entity" not in out and "named above" not in out
