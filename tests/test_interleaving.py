"""benchmarks/interleaving.py: the two ways of running a pipeline's components, and the table."""
import importlib.util
import sys
from pathlib import Path

import pytest

from .script_checks import refused, stand_in_files

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("interleaving",
                                              ROOT / "benchmarks" / "interleaving.py")
interleaving = importlib.util.module_from_spec(_spec)
_path = list(sys.path)
_spec.loader.exec_module(interleaving)
sys.path[:] = _path  # the script puts benchmarks/ first for its own imports


def _recorder(calls):
    return (lambda doc: calls.append(("tok2vec", doc)), lambda doc: calls.append(("head", doc)))


def test_apart_runs_the_tok2vec_on_every_document_before_the_head():
    calls = []
    spent = interleaving.time_apart(*_recorder(calls), [1, 2, 3])
    assert calls == [("tok2vec", 1), ("tok2vec", 2), ("tok2vec", 3),
                     ("head", 1), ("head", 2), ("head", 3)]
    assert set(spent) == {"tok2vec apart", "head apart"}


def test_in_turn_runs_both_on_each_document_before_the_next():
    calls = []
    spent = interleaving.time_in_turn(*_recorder(calls), [1, 2])
    assert calls == [("tok2vec", 1), ("head", 1), ("tok2vec", 2), ("head", 2)]
    assert set(spent) == {"tok2vec in turn", "head in turn"}


def test_the_head_after_traffic_runs_on_every_document_once():
    seen = []
    spent = interleaving.time_after_traffic(seen.append, ["a", "b"])
    assert seen == ["a", "b"] and set(spent) == {"head after traffic"}


def _repeat(tok_apart, head_apart, tok_turn, head_turn):
    return {"tok2vec apart": tok_apart, "head apart": head_apart, "tok2vec in turn": tok_turn,
            "head in turn": head_turn, "head after traffic": head_apart}


def test_summary_gives_medians_per_document_and_the_penalty_within_each_repeat():
    # the second repeat is slow throughout: its penalty (0.4) is taken from its own times,
    # not from the medians of each part (which would give 0.9 + 0.5 - 0.4 - 0.2 = 0.8)
    repeats = [_repeat(0.2, 0.1, 0.3, 0.2), _repeat(0.8, 0.6, 1.0, 0.8),
               _repeat(0.4, 0.2, 0.9, 0.5)]
    out = interleaving.summary(repeats, n_docs=100)
    assert out["tok2vec apart"] == pytest.approx(4000.0)  # 0.4 s / 100 documents, in µs
    assert out["head in turn"] == pytest.approx(5000.0)
    # penalties 0.2, 0.4, 0.8 -> median 0.4 s
    assert out["penalty"] == pytest.approx(4000.0)


def test_the_table_has_a_row_per_pipeline_and_the_ratio_of_each_stage():
    row = {"length": 10, "pipeline": "fsemicrf", "tok2vec apart": 800.4, "head apart": 500.0,
           "tok2vec in turn": 900.0, "head in turn": 750.0, "head after traffic": 600.0,
           "penalty": 349.6}
    stages = {10: {"fsemicrf": {"apart": {"word pooling": 0.002, "head": 0.05},
                                "in turn": {"word pooling": 0.003, "head": 0.075},
                                "docs": 100}}}
    text = interleaving.markdown([row], stages, 5, "test.spacy", "python ARGS")
    lines = text.splitlines()
    assert "| 10 | fsemicrf | 800 | 500 | 900 | 750 | 600 | 350 |" in lines
    assert "| word pooling | 20 | 30 | 1.50 |" in lines
    assert "| head | 500 | 750 | 1.50 |" in lines
    assert text.endswith("Made by `python ARGS`.\n")


@pytest.mark.parametrize("args, message", [
    (["--models", "{tmp}/model"], "--models takes NAME=PATH, got '{tmp}/model'"),
    (["--models", "a={tmp}/none"], "--models {tmp}/none is not a pipeline directory"),
    (["--test", "{tmp}/none.spacy"], "--test: no such file: {tmp}/none.spacy"),
    (["--repeats", "0"], "argument --repeats: must be at least 1, got 0"),
    (["--docs", "0"], "argument --docs: must be at least 1, got 0"),
    (["--lengths", "0"], "argument --lengths: must be at least 1, got 0"),
])
def test_bad_arguments_are_named_before_any_pipeline_loads(tmp_path, capsys, monkeypatch, args,
                                                           message):
    """Before: a traceback, for --repeats 0 after the warm-up repeat; --docs 0 timed one
    document."""
    stand_in_files(tmp_path, monkeypatch)
    argv = ["--models", f"a={tmp_path}/model", "--test", f"{tmp_path}/test.spacy",
            "--output", f"{tmp_path}/out/interleaving"]
    argv += [a.format(tmp=tmp_path) for a in args]
    assert message.format(tmp=tmp_path) in refused(interleaving.main, argv, capsys)
    assert not (tmp_path / "out").exists()


def test_the_dense_part_runs_each_projection_of_the_head_once(trained_nlp):
    """The --dense-part row times the head's own layers: each projection once per document
    (the output layer is one addmm on its weights), on the document's tok2vec vectors."""
    import numpy
    import torch

    from spacy_fsemicrf.head_model import torch_head

    ner = trained_nlp.get_pipe("fsemicrf_ner")
    head = torch_head(ner.model.get_ref("head"))
    calls = []
    hooks = [module.register_forward_hook(lambda *_, name=name: calls.append(name))
             for name, module in head.named_modules() if isinstance(module, torch.nn.Linear)]
    try:
        run = interleaving.dense_part(ner)
        doc = trained_nlp.make_doc("Anna met Bob in Rome today")
        width = head.word_pool.proj.in_features
        doc.tensor = numpy.random.default_rng(0).normal(size=(len(doc), width)).astype("float32")
        run(doc)
    finally:
        for hook in hooks:
            hook.remove()
    assert sorted(calls) == ["scorer.featurizer.doc_proj", "scorer.featurizer.neighbor_proj",
                             "scorer.featurizer.token_proj", "word_pool.proj"]


def test_the_dense_part_needs_the_default_span_scorer():
    import spacy

    from .conftest import make_examples, model_config

    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner", config={"model": model_config(span_repr="sum")})
    nlp.initialize(lambda: make_examples(nlp))
    with pytest.raises(ValueError, match="needs the default filtered head's span scorer"):
        interleaving.dense_part(ner)
