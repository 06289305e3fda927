"""Shared fixtures for the pipeline-layer tests (component, architectures, training).

Everything runs on the CPU with one torch thread (the test machine is small and shared) and
on a tiny corpus written by the tests, so no data set or network is needed.
"""
import contextlib
import functools
import random
from pathlib import Path
from typing import Dict, List, Tuple

import numpy
import pytest
import torch

torch.set_num_threads(1)

import spacy  # noqa: E402
from spacy.tokens import DocBin  # noqa: E402
from spacy.training import Example  # noqa: E402

import spacy_fsemicrf  # noqa: E402,F401  (registrations)
from spacy_fsemicrf.component import DEFAULT_MODELS  # noqa: E402

TRAIN_DATA: List[Tuple[str, List[Tuple[int, int, str]]]] = [
    ("Apple is opening an office in London .", [(0, 5, "ORG"), (30, 36, "LOC")]),
    ("John Smith works for Google in Paris .", [(0, 10, "PER"), (21, 27, "ORG"), (31, 36, "LOC")]),
    ("Mary flew to Berlin on Monday .", [(0, 4, "PER"), (13, 19, "LOC")]),
    ("Microsoft hired Anna Lee last year .", [(0, 9, "ORG"), (16, 24, "PER")]),
    ("The mayor of Madrid met Peter .", [(13, 19, "LOC"), (24, 29, "PER")]),
    ("Sales at Tesla rose in Norway .", [(9, 14, "ORG"), (23, 29, "LOC")]),
    ("Nobody said anything about it .", []),
    ("Laura Palmer moved to Rome with Amazon .", [(0, 12, "PER"), (22, 26, "LOC"), (32, 38, "ORG")]),
]
LABELS = ["LOC", "ORG", "PER"]

# A small tok2vec for the tests that build models by hand (fast to train).
SMALL_TOK2VEC = {
    "@architectures": "spacy.HashEmbedCNN.v2",
    "pretrained_vectors": None,
    "width": 32,
    "depth": 2,
    "embed_size": 500,
    "window_size": 1,
    "maxout_pieces": 2,
    "subword_features": True,
}


def make_examples(nlp, data=TRAIN_DATA) -> List[Example]:
    return [Example.from_dict(nlp.make_doc(text), {"entities": ents}) for text, ents in data]


def gold_set(nlp, data=TRAIN_DATA):
    out = []
    for text, ents in data:
        out.append({(text[s:e], label) for s, e, label in ents})
    return out


def predicted_set(docs):
    return [{(ent.text, ent.label_) for ent in doc.ents} for doc in docs]


def model_config(arch: str = "spacy-fsemicrf.FilteredSemiCRF.v1", **kwargs) -> Dict:
    """The component's default model block of ``arch`` on the small tok2vec, with ``kwargs``."""
    name = arch.split(".")[1]  # "spacy-fsemicrf.SemiCRF.v1" -> "SemiCRF"
    cfg = {k: v for k, v in DEFAULT_MODELS[name].items() if k != "tok2vec"}
    assert cfg["@architectures"] == arch
    cfg["tok2vec"] = dict(SMALL_TOK2VEC)
    cfg.update(kwargs)
    return cfg


def train_pipeline(nlp, examples, n_iter: int = 40, seed: int = 0):
    """Train on ``examples`` for ``n_iter`` full-batch updates; returns the per-update losses."""
    spacy.util.fix_random_seed(seed)
    optimizer = nlp.initialize(lambda: examples)
    losses = []
    for _ in range(n_iter):
        result = nlp.update(examples, sgd=optimizer, drop=0.0, losses={})
        losses.append(sum(result.values()))
    return losses


@functools.lru_cache(maxsize=None)
def _trained_once():
    random.seed(0)
    numpy.random.seed(0)
    nlp = spacy.blank("en")
    nlp.add_pipe("fsemicrf_ner")
    examples = make_examples(nlp)
    losses = train_pipeline(nlp, examples, n_iter=40)
    return nlp, losses


@pytest.fixture(scope="module")  # module fixtures build on it; the training runs only once
def trained():
    """``(nlp, losses)``: a blank English pipeline with the default fsemicrf_ner (no config at
    all), trained on TRAIN_DATA, and its loss after each update. Trained once for the whole
    test run and shared: tests must not modify it."""
    return _trained_once()


@pytest.fixture(scope="module")
def trained_nlp(trained):
    """The trained pipeline of ``trained`` (tests must not modify it)."""
    return trained[0]


@contextlib.contextmanager
def one_group_per_document(ner):
    """The component's head predicts each document of a batch in a length group of its own
    (``max_padded_tokens`` 1) inside the block."""
    head = ner.model.get_ref("head")
    old = head.attrs["max_padded_tokens"]
    head.attrs["max_padded_tokens"] = 1
    try:
        yield
    finally:
        head.attrs["max_padded_tokens"] = old


def write_corpus(path: Path, nlp, data=TRAIN_DATA, repeat: int = 1) -> Path:
    db = DocBin()
    for _ in range(repeat):
        for eg in make_examples(nlp, data):
            db.add(eg.reference)
    db.to_disk(path)
    return path


@pytest.fixture
def corpus_paths(tmp_path):
    nlp = spacy.blank("en")
    train = write_corpus(tmp_path / "train.spacy", nlp, repeat=2)
    dev = write_corpus(tmp_path / "dev.spacy", nlp)
    return train, dev
