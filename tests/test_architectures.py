"""The registered architectures and the Thinc <-> PyTorch bridge."""
from importlib.metadata import entry_points

import numpy
import pytest
import spacy
from spacy.util import registry

from spacy_fsemicrf.architectures import (
    FILTERED_SEMICRF, FILTERED_SEMICRF_V2, FILTERED_SEMICRF_V3, FILTERED_SEMICRF_V4, LINEAR_CRF,
    SEMICRF,
)
from spacy_fsemicrf.torch_bridge import length_groups

try:  # tests/ as a package (tests/__init__.py) or as a plain directory
    from .conftest import (
        TRAIN_DATA, gold_set, make_examples, model_config, predicted_set, train_pipeline,
    )
except ImportError:  # pragma: no cover
    from conftest import (
        TRAIN_DATA, gold_set, make_examples, model_config, predicted_set, train_pipeline,
    )

ARCHS = [FILTERED_SEMICRF, SEMICRF, LINEAR_CRF]


def _group(name):
    eps = entry_points()
    if hasattr(eps, "select"):
        return {ep.name: ep for ep in eps.select(group=name)}
    return {ep.name: ep for ep in eps.get(name, [])}  # pragma: no cover (Python < 3.10)


def test_registered_names_and_entry_points():
    versions = ARCHS + [FILTERED_SEMICRF_V2, FILTERED_SEMICRF_V3, FILTERED_SEMICRF_V4]
    for name in versions:
        assert registry.architectures.get(name) is not None
    assert registry.scorers.get("spacy-fsemicrf.ner_scorer.v1") is not None
    assert set(versions) <= set(_group("spacy_architectures"))
    assert _group("spacy_factories")["fsemicrf_ner"].value == "spacy_fsemicrf.component:make_fsemicrf_ner"
    assert "spacy-fsemicrf.ner_scorer.v1" in _group("spacy_scorers")
    for ep in [_group("spacy_architectures")[n] for n in versions]:
        assert callable(ep.load())


def _trained(arch, n_iter=30, **kwargs):
    nlp = spacy.blank("en")
    nlp.add_pipe("fsemicrf_ner", config={"model": model_config(arch, **kwargs)})
    losses = train_pipeline(nlp, make_examples(nlp), n_iter=n_iter)
    return nlp, losses


@pytest.fixture(scope="module", params=ARCHS)
def trained_arch(request):
    return (request.param,) + _trained(request.param)


def test_each_architecture_trains(trained_arch):
    arch, nlp, losses = trained_arch
    assert losses[-1] < 0.1 * losses[0], (arch, losses)
    docs = list(nlp.pipe([text for text, _ in TRAIN_DATA]))
    assert predicted_set(docs) == gold_set(nlp), arch


def test_backprop_reaches_tok2vec(trained_arch):
    arch, nlp, _ = trained_arch
    ner = nlp.get_pipe("fsemicrf_ner")
    model = ner.model
    examples = make_examples(nlp)[:3]
    docs = [eg.predicted for eg in examples]
    gold, mask = ner.get_gold(examples)
    loss, backprop = model.begin_update((docs, gold, mask))
    assert numpy.isfinite(loss) and loss >= 0
    backprop(1.0)
    tok2vec = model.get_ref("tok2vec")
    total = 0.0
    for node in tok2vec.walk():
        for name in node.param_names:
            if node.has_grad(name):
                total += float(numpy.abs(node.get_grad(name)).sum())
    assert total > 0
    # clear the accumulated gradients so that other tests see an untouched model
    for node in tok2vec.walk():
        for name in node.param_names:
            if node.has_grad(name):
                node.set_grad(name, node.ops.alloc(node.get_grad(name).shape))
    for param in model.get_ref("head").shims[0]._model.parameters():
        param.grad = None


def test_batching_does_not_change_predictions(trained_arch):
    arch, nlp, _ = trained_arch
    ner = nlp.get_pipe("fsemicrf_ner")
    texts = [text for text, _ in TRAIN_DATA] + ["", "Paris"]
    docs = [nlp.make_doc(t) for t in texts]
    together_spans, together_conf = ner.predict(docs)
    head = ner.model.get_ref("head")
    old = head.attrs["max_padded_tokens"]
    head.attrs["max_padded_tokens"] = 1  # one group per document
    try:
        split_spans, split_conf = ner.predict(docs)
    finally:
        head.attrs["max_padded_tokens"] = old
    assert together_spans.tolist() == split_spans.tolist()
    numpy.testing.assert_allclose(together_conf, split_conf, rtol=1e-4, atol=1e-5)
    one_by_one = [ner.predict([doc])[0] for doc in docs]
    assert sum(len(s) for s in one_by_one) == len(together_spans)
    rows = together_spans.tolist()
    assert rows == sorted(rows, key=lambda r: (r[0], r[1]))


def test_model_bytes_round_trip(trained_arch):
    arch, nlp, _ = trained_arch
    ner = nlp.get_pipe("fsemicrf_ner")
    docs = [nlp.make_doc(t) for t, _ in TRAIN_DATA]
    nlp2 = spacy.blank("en")
    ner2 = nlp2.add_pipe("fsemicrf_ner", config={"model": model_config(arch)})
    ner2.from_bytes(ner.to_bytes())
    a, b = ner.predict(docs), ner2.predict(docs)
    assert a[0].tolist() == b[0].tolist()
    numpy.testing.assert_allclose(a[1], b[1], rtol=1e-5)


def test_empty_inputs():
    nlp, _ = _trained(FILTERED_SEMICRF, n_iter=1)
    model = nlp.get_pipe("fsemicrf_ner").model
    spans, conf = model.predict(([], None))
    assert spans.shape == (0, 4) and conf.shape == (0,)
    docs = [nlp.make_doc(""), nlp.make_doc("")]
    spans, conf = model.predict((docs, None))
    assert spans.shape == (0, 4) and conf.shape == (0,)
    loss, backprop = model.begin_update((docs, numpy.zeros((0, 4), dtype="int64")))
    assert loss == 0.0
    backprop(1.0)
    docs = [nlp.make_doc(""), nlp.make_doc("Paris")]
    gold = numpy.asarray([[1, 0, 0, 1]])
    loss, backprop = model.begin_update((docs, gold))
    assert numpy.isfinite(loss) and loss > 0
    backprop(1.0)


def test_length_groups():
    lengths = numpy.asarray([3, 0, 10, 4, 10, 1])
    groups = length_groups(lengths, max_padded=20)
    flat = [int(i) for g in groups for i in g]
    assert sorted(flat) == [0, 2, 3, 4, 5]  # the empty doc is left out
    for g in groups:
        assert len(g) == 1 or len(g) * lengths[g].max() <= 20
    assert [g.tolist() for g in length_groups(lengths, max_padded=10**6, min_ratio=0)] == [[2, 4, 3, 0, 5]]
    # documents much shorter than their group's longest start a new group
    assert [g.tolist() for g in length_groups(lengths, max_padded=10**6, min_ratio=0.7)] == [[2, 4], [3, 0], [5]]
    assert length_groups(numpy.asarray([0, 0]), 10) == []


def test_bad_settings_fail_when_the_config_is_resolved():
    nlp = spacy.blank("en")
    with pytest.raises(ValueError, match="span_repr"):
        nlp.add_pipe("fsemicrf_ner", config={"model": model_config(span_repr="bogus")})
    with pytest.raises(ValueError, match="scheme"):
        nlp.add_pipe("fsemicrf_ner", name="crf", config={"model": model_config(LINEAR_CRF, scheme="IOX")})
    with pytest.raises(ValueError, match="max_width"):
        nlp.add_pipe("fsemicrf_ner", name="k0", config={"model": model_config(max_width=0)})


def test_mixed_precision_config_runs_in_float32_on_cpu(caplog):
    import torch

    if torch.cuda.is_available():  # pragma: no cover - GPU machines run it under autocast
        pytest.skip("CPU-only check")
    nlp, losses = _trained(
        FILTERED_SEMICRF, n_iter=5, mixed_precision=True, grad_scaler={"init_scale": 1024.0}
    )
    assert losses[-1] < losses[0]
    ner = nlp.get_pipe("fsemicrf_ner")
    loss, _ = ner.get_loss(make_examples(nlp), None)
    assert loss > 0


@pytest.mark.parametrize("config_file", ["configs/fsemicrf_cnn.cfg", "configs/fsemicrf_trf.cfg"])
def test_head_defaults_agree_everywhere(config_file):
    """The head settings of the shipped configs, the component's default model, the registered
    architecture and the PyTorch head have the same defaults (changing one means all), except
    ``doc_vector``, ``word_pool`` (on in ``FilteredSemiCRF.v4``, off in the head, as in v1) and
    ``boundary_smoothing`` (0.2 in v4, 0 in the head and v1)."""
    import inspect
    from pathlib import Path

    from thinc.api import Config

    from spacy_fsemicrf.architectures import build_filtered_semicrf_v4
    from spacy_fsemicrf.component import DEFAULT_MODEL
    from spacy_fsemicrf.structured import FilteredSemiCRFHead

    root = Path(__file__).resolve().parents[1]
    shipped = Config().from_disk(root / config_file, interpolate=False)
    shipped = shipped["components"]["fsemicrf_ner"]["model"]

    def head_settings(params):
        return {k: v for k, v in params.items() if k not in ("@architectures", "tok2vec")}

    def signature_defaults(fn):
        return {k: p.default for k, p in inspect.signature(fn).parameters.items()
                if p.default is not inspect.Parameter.empty}

    component = head_settings(DEFAULT_MODEL)
    assert head_settings(shipped) == component
    assert shipped["@architectures"] == DEFAULT_MODEL["@architectures"] == FILTERED_SEMICRF_V4
    assert {k: v for k, v in signature_defaults(build_filtered_semicrf_v4).items() if k in component} == component
    head = {**signature_defaults(FilteredSemiCRFHead.__init__), "doc_vector": True, "word_pool": True,
            "boundary_smoothing": 0.2}
    assert {k: component[k] for k in head if k in component} == {k: v for k, v in head.items() if k in component}


ON = {"doc_vector": True, "word_pool": True}
V1_OFF = {"doc_vector": False, "word_pool": False, "boundary_smoothing": 0.0}


def typed(values):
    """``{key: (type, value)}``: so that ``True`` and ``1``, or ``0.0`` and ``False``, differ."""
    return {k: (type(v), v) for k, v in values.items()}


@pytest.mark.parametrize("name,options", [
    (FILTERED_SEMICRF_V2, {"doc_vector": True}),
    (FILTERED_SEMICRF_V3, ON),
    (FILTERED_SEMICRF_V4, {**ON, "boundary_smoothing": 0.2}),
])
def test_later_filtered_semicrf_versions_are_v1_with_options_on(name, options):
    import inspect

    v1 = registry.architectures.get(FILTERED_SEMICRF)
    v2 = registry.architectures.get(name)
    p1, p2 = inspect.signature(v1).parameters, inspect.signature(v2).parameters
    assert list(p1) == list(p2)
    assert {k for k in p1 if p1[k].default != p2[k].default} == set(options)
    assert typed({k: p2[k].default for k in options}) == typed(options)
    assert typed({k: p1[k].default for k in options}) == typed({k: V1_OFF[k] for k in options})
    # and it builds what it says, positional or keyword
    from spacy.ml.models import build_hash_embed_cnn_tok2vec

    tok2vec = build_hash_embed_cnn_tok2vec(
        width=8, depth=1, embed_size=50, window_size=1, maxout_pieces=2, subword_features=False,
        pretrained_vectors=None,
    )
    model = v2(tok2vec, 3, hidden_width=16)
    assert typed({k: model.get_ref("head").attrs["head_kwargs"][k] for k in options}) == typed(options)
    assert model.get_ref("head").attrs["head_kwargs"]["max_width"] == 3


def test_a_head_saved_before_an_option_existed_loads_with_its_default():
    """Heads saved without a newer keyword (e.g. ``context_depth``) were built with its default."""
    import srsly
    import torch

    from spacy_fsemicrf.torch_bridge import _instantiate, deserialize_head, head_defaults, serialize_head

    kwargs = {**head_defaults("FilteredSemiCRF"), "max_width": 3, "hidden_width": 8}
    head = _instantiate("FilteredSemiCRF", kwargs, 6, 2)
    msg = srsly.msgpack_loads(serialize_head(head))
    for key in ("context_depth", "doc_vector"):
        del msg["kwargs"][key]
    spec = {"arch": "FilteredSemiCRF", "kwargs": kwargs}
    loaded = deserialize_head(spec, None, srsly.msgpack_dumps(msg), torch.device("cpu"))
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="context_depth = 0"):
        deserialize_head({**spec, "kwargs": {**kwargs, "context_depth": 1}}, None,
                         srsly.msgpack_dumps(msg), torch.device("cpu"))


def test_word_ids_match_lower_case_forms_across_the_batch():
    import spacy
    from spacy.tokens import Doc

    from spacy_fsemicrf.architectures import word_ids

    vocab = spacy.blank("en").vocab
    docs = [Doc(vocab, words=["Leeds", "beat", "LEEDS"]), Doc(vocab, words=[]),
            Doc(vocab, words=["leeds", "lost"])]
    ids = word_ids(docs)
    assert [len(i) for i in ids] == [3, 0, 2]
    assert ids[0][0] == ids[0][2] == ids[2][0]
    assert len({int(ids[0][0]), int(ids[0][1]), int(ids[2][1])}) == 3
    assert word_ids([]) == []
