"""scripts/kept_nodes.py: the filtered graph of every test document, with and without word_pool."""
import importlib.util
import json
from pathlib import Path

import pytest
import spacy
import torch

from spacy_fsemicrf.architectures import word_ids

try:  # tests/ as a package (tests/__init__.py) or as a plain directory
    from .conftest import make_examples, model_config, train_pipeline, write_corpus
except ImportError:  # pragma: no cover
    from conftest import make_examples, model_config, train_pipeline, write_corpus

_spec = importlib.util.spec_from_file_location(
    "kept_nodes", Path(__file__).resolve().parents[1] / "scripts" / "kept_nodes.py")
kept_nodes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kept_nodes)


@pytest.mark.parametrize("word_pool", [False, True])
def test_kept_nodes_count_the_graph_of_each_document(tmp_path, word_pool):
    """Per document, the count is the head's own ``count_nodes`` on the pipeline's inputs
    (word ids included when the head pools words), and never more than the candidates."""
    nlp = spacy.blank("en")
    nlp.add_pipe("fsemicrf_ner", config={"model": model_config(word_pool=word_pool)})
    train_pipeline(nlp, make_examples(nlp), n_iter=15)
    model = tmp_path / "model"
    nlp.to_disk(model)
    corpus = write_corpus(tmp_path / "test.spacy", nlp)
    kept_nodes.main(["--model", str(model), "--test", str(corpus), "--output", str(tmp_path)])
    res = json.loads((tmp_path / "kept_nodes.json").read_text())
    rows = res["docs"]
    assert len(rows) == len(make_examples(nlp)) and res["summary"]["docs"] == len(rows)
    # the report names the corpus it counted, whichever it is
    assert res["summary"]["test"] == str(corpus)
    assert f"test corpus `{corpus}`" in (tmp_path / "kept_nodes.md").read_text()

    loaded = spacy.load(model)
    _, head = kept_nodes.find_head(loaded)
    component = loaded.get_pipe("fsemicrf_ner")
    for row, eg in zip(rows, make_examples(loaded)):
        doc = loaded.make_doc(eg.reference.text)
        assert len(doc) == row["L"]
        X = torch.as_tensor(component.model.get_ref("tok2vec").predict([doc])[0]).unsqueeze(0)
        words = torch.as_tensor(word_ids([doc])[0]).unsqueeze(0) if word_pool else None
        expected = int(head.count_nodes(X, torch.tensor([len(doc)]), words=words)[0])
        assert row["kept_nodes"] == expected
        assert 0 <= row["kept_nodes"] <= row["candidates"] <= row["LK"]


def test_a_missing_model_or_test_file_is_named(tmp_path, capsys):
    """Before: spaCy's traceback for the model, a FileNotFoundError for the test file."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.cfg").write_text("")
    missing = tmp_path / "no_such_test.spacy"
    cases = [
        (["--model", str(tmp_path / "none")], f"--model {tmp_path / 'none'} is not a pipeline"),
        (["--model", str(tmp_path / "model"), "--test", str(missing)],
         f"no such test file: {missing}"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            kept_nodes.main(argv + ["--output", str(tmp_path / "out")])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
