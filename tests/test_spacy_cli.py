"""spaCy's own command-line tools on a pipeline with ``fsemicrf_ner``: ``debug model``,
``find-threshold``, ``init labels`` read back at initialization, ``apply``."""
from pathlib import Path
from typing import List

import pytest
import spacy
import srsly
from spacy.cli._util import app
from spacy.tokens import DocBin
from spacy.training.initialize import init_nlp
from typer.testing import CliRunner

try:  # tests/ as a package (tests/__init__.py) or as a plain directory
    from .conftest import LABELS, TRAIN_DATA, write_corpus
except ImportError:  # pragma: no cover
    from conftest import LABELS, TRAIN_DATA, write_corpus

CONFIGS = Path(__file__).parent.parent / "configs"
# the CNN configs' tok2vec made small, so that each command takes a second or two
SMALL = ["--components.tok2vec.model.width", "32", "--components.tok2vec.model.depth", "1",
         "--components.tok2vec.model.embed_size", "300"]


def _spacy(*args: str) -> str:
    """Run ``python -m spacy ARGS`` in this process; its output, or the error it raised."""
    result = CliRunner().invoke(app, [str(arg) for arg in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == 0, result.output
    return result.output


def _corpus_args(corpus_paths) -> List[str]:
    train, dev = corpus_paths
    return ["--paths.train", str(train), "--paths.dev", str(dev)]


@pytest.mark.parametrize("name", ["fsemicrf_cnn.cfg", "crf_cnn.cfg"])
def test_debug_model(name, corpus_paths):
    """`spacy debug model` initializes, updates and then predicts with a plain list of docs,
    as it does for every pipe's model."""
    out = _spacy("debug", "model", CONFIGS / name, "fsemicrf_ner", "-P3",
                 *_corpus_args(corpus_paths), *SMALL)
    assert "model looks good" in out


def test_find_threshold_tunes_the_threshold(trained_nlp, tmp_path):
    """`spacy find-threshold` reloads the pipeline with each threshold, which the component
    applies: 0 keeps every entity, 1 only those of confidence 1."""
    from spacy.cli.find_threshold import find_threshold

    trained_nlp.to_disk(tmp_path / "model")
    dev = write_corpus(tmp_path / "dev.spacy", spacy.blank("en"))
    best, score, scores = find_threshold(tmp_path / "model", dev, "fsemicrf_ner", "threshold",
                                         "ents_f", n_trials=3)
    assert scores[0.0] > 0.9 and scores[1.0] < scores[0.0]
    assert best < 1.0 and score == scores[best]


def test_init_labels_are_read_at_initialize(corpus_paths, tmp_path):
    """The labels file `spacy init labels` writes initializes the component through
    spacy.read_labels.v1, in its order, with labels the data lack."""
    _spacy("init", "labels", CONFIGS / "fsemicrf_cnn.cfg", tmp_path / "labels",
           *_corpus_args(corpus_paths), *SMALL)
    path = tmp_path / "labels" / "fsemicrf_ner.json"
    assert srsly.read_json(path) == sorted(LABELS)
    srsly.write_json(path, ["PER", "LOC", "ORG", "EXTRA"])
    train, dev = corpus_paths
    config = spacy.util.load_config(CONFIGS / "fsemicrf_cnn.cfg", overrides={
        "paths.train": str(train), "paths.dev": str(dev),
        "components.tok2vec.model.width": 32, "components.tok2vec.model.depth": 1,
        "initialize.components": {"fsemicrf_ner": {"labels": {
            "@readers": "spacy.read_labels.v1", "path": str(path)}}},
    })
    nlp = init_nlp(config)
    assert nlp.get_pipe("fsemicrf_ner").labels == ("PER", "LOC", "ORG", "EXTRA")


def test_apply_writes_the_entities_and_their_scores(trained_nlp, tmp_path):
    """`spacy apply` on JSONL input: the docs keep their entities and the spans group with
    its scores, through a DocBin."""
    trained_nlp.to_disk(tmp_path / "model")
    lines = [{"text": text} for text, _ in TRAIN_DATA[:3]] + [{"text": ""}]
    srsly.write_jsonl(tmp_path / "in.jsonl", lines)
    _spacy("apply", tmp_path / "model", tmp_path / "in.jsonl", tmp_path / "out.spacy")
    docs = list(DocBin().from_disk(tmp_path / "out.spacy").get_docs(spacy.blank("en").vocab))
    expected = [trained_nlp(line["text"]) for line in lines]
    assert [[(e.text, e.label_) for e in d.ents] for d in docs] == [
        [(e.text, e.label_) for e in d.ents] for d in expected]
    for doc in docs:
        assert len(doc.spans["fsemicrf"].attrs["scores"]) == len(doc.spans["fsemicrf"])
