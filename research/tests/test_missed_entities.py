"""research/scripts/missed_entities.py: the local classifier's view of the entities a filtered head misses."""
import missed_entities
import spacy

from tests.conftest import gold_set, write_corpus


def test_missed_entities_with_and_without_a_filter(trained_nlp, tmp_path):
    model = tmp_path / "model"
    trained_nlp.to_disk(model)
    corpus = write_corpus(tmp_path / "dev.spacy", spacy.blank("en"))
    n_gold = sum(len(ents) for ents in gold_set(trained_nlp))
    # the trained model finds every entity of its training data: nothing missed
    assert missed_entities.missed_entities(model, corpus) == []
    # a margin of -1e6 keeps no span: every entity is missed, with no kept node over it, while
    # the local classifier still gives each gold span more entity than null probability
    rows = missed_entities.missed_entities(model, corpus, filter_margin=-1e6)
    assert len(rows) == n_gold
    assert all(r["kept_overlapping"] == 0 and r["p_null"] < 0.5 for r in rows)
    s = missed_entities.summary(rows)
    assert s["missed"] == n_gold == sum(s["by_width"].values())
    assert s["no_kept_node_overlapping"] == n_gold and s["p_null_above_0.9"] == 0


def test_kept_nodes_overlapping_a_missed_entity_are_counted(trained_nlp, tmp_path, monkeypatch):
    model = tmp_path / "model"
    trained_nlp.to_disk(model)
    corpus = write_corpus(tmp_path / "dev.spacy", spacy.blank("en"))
    # predictions with no entities while the filter keeps its usual nodes: each missed entity
    # is overlapped by at least its own kept gold span
    from spacy_fsemicrf.component import FSemiCRFEntityRecognizer

    monkeypatch.setattr(FSemiCRFEntityRecognizer, "set_annotations", lambda self, docs, out: None)
    rows = missed_entities.missed_entities(model, corpus)
    assert rows and all(r["kept_overlapping"] >= 1 for r in rows)


def test_count_overlapping_matches_brute_force():
    import torch

    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        L, K = 9, 4
        kept = torch.rand(L, K, generator=gen) < 0.3
        start = int(torch.randint(0, L, (1,), generator=gen))
        end = int(torch.randint(start + 1, L + 1, (1,), generator=gen))
        brute = sum(1 for s in range(L) for k in range(K)
                    if kept[s, k] and s < end and s + k >= start)
        assert missed_entities.count_overlapping(kept, start, end) == brute
