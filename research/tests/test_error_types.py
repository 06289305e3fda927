"""research/scripts/error_types.py: entity errors sorted by kind."""
import error_types

from tests.conftest import TRAIN_DATA, gold_set, predicted_set, write_corpus


def test_each_error_is_counted_once_as_its_kind():
    gold = {(0, 2): "PER", (3, 4): "LOC", (5, 7): "ORG", (9, 10): "MISC",
            (13, 15): "PER", (16, 21): "ORG"}
    pred = {(0, 2): "PER", (3, 4): "ORG", (5, 6): "ORG", (11, 12): "LOC"}
    got = error_types.classify(gold, pred)
    assert dict(got) == {
        "tp": 1, "fp_type": 1, "fp_boundary": 1, "fp_spurious": 1,
        "fn_type": 1, "fn_boundary": 1, "fn_missed": 3,
        # the missed entities again, by width in tokens
        "missed_w1": 1, "missed_w2": 1, "missed_w3": 0, "missed_w4+": 1,
    }
    # every prediction and every gold entity lands in exactly one kind
    assert got["tp"] + got["fp_type"] + got["fp_boundary"] + got["fp_spurious"] == len(pred)
    assert got["tp"] + got["fn_type"] + got["fn_boundary"] + got["fn_missed"] == len(gold)


def test_a_model_that_finds_every_entity_has_no_errors(trained_nlp, tmp_path):
    texts = [text for text, _ in TRAIN_DATA]
    assert predicted_set(trained_nlp.pipe(texts)) == gold_set(trained_nlp)
    trained_nlp.to_disk(tmp_path / "model")
    corpus = write_corpus(tmp_path / "dev.spacy", trained_nlp)
    counts = error_types.model_errors(tmp_path / "model", corpus)
    assert counts["tp"] == sum(len(ents) for ents in gold_set(trained_nlp))
    assert sum(counts.values()) == counts["tp"]
