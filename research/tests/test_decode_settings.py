"""research/scripts/decode_settings.py: scores at several filter margins, paired by model."""
import json

import decode_settings
import pytest
import spacy

from tests.conftest import write_corpus


def test_margins_are_scored_and_paired_by_model(trained_nlp, tmp_path):
    model = tmp_path / "model"
    trained_nlp.to_disk(model)
    corpus = write_corpus(tmp_path / "corpus.spacy", spacy.blank("en"))
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"models": [str(model), str(model)], "margins": [0, -1e6]}))
    stem = tmp_path / "out" / "margins"
    decode_settings.main([str(settings), "--results", str(stem), "--dev", str(corpus),
                          "--test", str(corpus), "--repeats", "1"])
    res = json.loads(stem.with_suffix(".json").read_text())
    assert len(res["runs"]) == 2
    for run in res["runs"]:
        at0, none = run["scores"]["0.0"], run["scores"]["-1000000.0"]
        assert at0["dev"]["f"] > 0.9 and at0["dev"] == at0["test"]
        assert none["dev"]["n_pred"] == 0 and none["dev"]["f"] == 0.0
    (row,) = res["paired"]
    assert row["margin"] == -1e6
    assert row["dev"]["mean"] == pytest.approx(-100 * res["runs"][0]["scores"]["0.0"]["dev"]["f"])
    assert row["dev"]["se"] == pytest.approx(0.0)
    assert set(res["words_per_s"]) == {"0.0", "-1000000.0"}
    assert all(wps > 0 for wps in res["words_per_s"].values())
    assert "| -1e+06 |" in stem.with_suffix(".md").read_text()
