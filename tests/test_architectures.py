"""The registered architectures and the Thinc <-> PyTorch bridge."""
from importlib.metadata import entry_points

import numpy
import pytest
import spacy
import torch
from spacy.util import registry

from spacy_fsemicrf.architectures import FILTERED_SEMICRF, LINEAR_CRF, SEMICRF, ModelInput
from spacy_fsemicrf.head_model import length_groups

try:  # tests/ as a package (tests/__init__.py) or as a plain directory
    from .conftest import (
        TRAIN_DATA, gold_set, make_examples, model_config, one_group_per_document,
        predicted_set, train_pipeline,
    )
except ImportError:  # pragma: no cover
    from conftest import (
        TRAIN_DATA, gold_set, make_examples, model_config, one_group_per_document,
        predicted_set, train_pipeline,
    )

ARCHS = [FILTERED_SEMICRF, SEMICRF, LINEAR_CRF]


def _group(name):
    eps = entry_points()
    if hasattr(eps, "select"):
        return {ep.name: ep for ep in eps.select(group=name)}
    return {ep.name: ep for ep in eps.get(name, [])}  # pragma: no cover (Python < 3.10)


def test_registered_names_and_entry_points():
    versions = ARCHS
    assert {n for n in _group("spacy_architectures") if "FilteredSemiCRF" in n} == {FILTERED_SEMICRF}
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
    loss, backprop = model.begin_update(ModelInput(docs, gold, mask))
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
    for param in ner.torch_head.parameters():
        param.grad = None


def test_batching_does_not_change_predictions(trained_arch):
    arch, nlp, _ = trained_arch
    ner = nlp.get_pipe("fsemicrf_ner")
    ner.candidates_key = "candidates"
    texts = [text for text, _ in TRAIN_DATA] + ["", "Paris"]
    docs = [nlp.make_doc(t) for t in texts]
    try:
        together = ner.predict(docs)
        with one_group_per_document(ner):
            split = ner.predict(docs)
        one_by_one = [ner.predict([doc]) for doc in docs]
    finally:
        ner.candidates_key = None
    for other in (split, _concat(one_by_one)):
        assert together.spans.tolist() == other.spans.tolist()
        numpy.testing.assert_allclose(together.scores, other.scores, rtol=1e-4, atol=1e-5)
        numpy.testing.assert_allclose(together.path, other.path, rtol=1e-4, atol=1e-5)
        assert together.candidates[0].tolist() == other.candidates[0].tolist()
        numpy.testing.assert_allclose(together.candidates[1], other.candidates[1], rtol=1e-4, atol=1e-5)
    rows = together.spans.tolist()
    assert rows == sorted(rows, key=lambda r: (r[0], r[1]))
    assert together.path[texts.index("")] == 1.0  # the empty document's only path
    assert ((together.path > 0) & (together.path <= 1)).all()


def _concat(predictions):
    """One-document predictions as one of the whole batch (document numbers shifted)."""
    def rows(parts):
        out = [p.copy() for p in parts]
        for i, p in enumerate(out):
            p[:, 0] = i
        return numpy.concatenate(out)

    return predictions[0]._replace(
        spans=rows([p.spans for p in predictions]),
        scores=numpy.concatenate([p.scores for p in predictions]),
        path=numpy.concatenate([p.path for p in predictions]),
        candidates=(rows([p.candidates[0] for p in predictions]),
                    numpy.concatenate([p.candidates[1] for p in predictions])),
    )


def test_model_bytes_round_trip(trained_arch):
    arch, nlp, _ = trained_arch
    ner = nlp.get_pipe("fsemicrf_ner")
    docs = [nlp.make_doc(t) for t, _ in TRAIN_DATA]
    nlp2 = spacy.blank("en")
    ner2 = nlp2.add_pipe("fsemicrf_ner", config={"model": model_config(arch)})
    ner2.from_bytes(ner.to_bytes())
    a, b = ner.predict(docs), ner2.predict(docs)
    assert a.spans.tolist() == b.spans.tolist()
    numpy.testing.assert_allclose(a.scores, b.scores, rtol=1e-5)
    numpy.testing.assert_allclose(a.path, b.path, rtol=1e-5)


def test_empty_inputs():
    nlp, _ = _trained(FILTERED_SEMICRF, n_iter=1)
    model = nlp.get_pipe("fsemicrf_ner").model
    spans, conf = model.predict(ModelInput([]))
    assert spans.shape == (0, 4) and conf.shape == (0,)
    docs = [nlp.make_doc(""), nlp.make_doc("")]
    spans, conf = model.predict(ModelInput(docs))
    assert spans.shape == (0, 4) and conf.shape == (0,)
    loss, backprop = model.begin_update(ModelInput(docs, numpy.zeros((0, 4), dtype="int64")))
    assert loss == 0.0
    backprop(1.0)
    docs = [nlp.make_doc(""), nlp.make_doc("Paris")]
    gold = numpy.asarray([[1, 0, 0, 1]])
    loss, backprop = model.begin_update(ModelInput(docs, gold))
    assert numpy.isfinite(loss) and loss > 0
    backprop(1.0)
    with pytest.raises(TypeError, match="ModelInput"):
        model.predict((docs, None))


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
    # one document: its own group, unless it is empty
    assert [g.tolist() for g in length_groups(numpy.asarray([7]), 3)] == [[0]]
    assert length_groups(numpy.asarray([0]), 10) == []


def test_bad_settings_fail_when_the_config_is_resolved():
    nlp = spacy.blank("en")
    with pytest.raises(ValueError, match="span_repr"):
        nlp.add_pipe("fsemicrf_ner", config={"model": model_config(span_repr="bogus")})
    with pytest.raises(ValueError, match="scheme"):
        nlp.add_pipe("fsemicrf_ner", name="crf", config={"model": model_config(LINEAR_CRF, scheme="IOX")})
    with pytest.raises(ValueError, match="max_width"):
        nlp.add_pipe("fsemicrf_ner", name="k0", config={"model": model_config(max_width=0)})
    for arch in ARCHS:  # 0 would build, and fail (span heads) or learn nothing (linear CRF)
        for width in (0, -5):
            with pytest.raises(ValueError, match=rf"^hidden_width must be >= 1, got {width}$"):
                nlp.add_pipe("fsemicrf_ner", name=f"h{width}",
                             config={"model": model_config(arch, hidden_width=width)})


def test_a_max_width_that_is_no_integer_is_named_by_the_config_and_the_builders():
    """A builder called from Python (no config validation) took max_width = 2.5 for 2, which
    the linear CRF head then kept; a config says so through its own validation."""
    nlp = spacy.blank("en")
    for arch in ARCHS:
        with pytest.raises(ValueError, match="max_width"):
            nlp.add_pipe("fsemicrf_ner", name=f"k{arch}",
                         config={"model": model_config(arch, max_width=2.5)})
    tok2vec = registry.architectures.get("spacy.HashEmbedCNN.v2")(
        width=16, depth=1, embed_size=100, window_size=1, maxout_pieces=2,
        subword_features=False, pretrained_vectors=None,
    )
    build = registry.architectures.get(LINEAR_CRF)
    settings = dict(hidden_width=8, scheme="BIO", dropout=0.1, context_depth=0, word_pool=False)
    for bad in (2.5, True):
        with pytest.raises(ValueError, match=f"^max_width must be an integer, got {bad}$"):
            build(tok2vec, max_width=bad, **settings)
    assert build(tok2vec, max_width=3, **settings).attrs["max_width"] == 3


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


@pytest.mark.parametrize("enabled", [False, True])
def test_grad_scaler_settings_may_name_enabled(enabled):
    """``enabled`` is one of PyTorchGradScaler's arguments: a config may give it (it can switch
    the scaler off; without mixed precision, here on the CPU, the scaler stays off)."""
    from spacy_fsemicrf.head_model import make_head_model

    model = make_head_model("FilteredSemiCRF", {"max_width": 3}, mixed_precision=False,
                            grad_scaler={"enabled": enabled, "init_scale": 1024.0})
    scaler = model.shims[0]._grad_scaler
    assert not scaler._enabled and float(scaler._scale) == 1024.0


def _cpu_scaler():
    """Thinc's gradient scaler (scale 1024) for CPU tensors, which it scales like CUDA ones."""
    from thinc.shims.pytorch_grad_scaler import PyTorchGradScaler

    class CPUScaler(PyTorchGradScaler):
        def _scale_tensor(self, tensor, scale_per_device, inplace):
            return tensor.mul_(self._scale) if inplace else tensor * self._scale

    return CPUScaler(enabled=True, init_scale=1024.0)


def test_scaled_gradients_accumulate_unscaled_once():
    """With a gradient scaler (mixed precision), Thinc's shim unscales every gradient the head
    holds at each backprop, also those accumulated by earlier sub-batches
    (``accumulate_gradient``): they were divided by the scale again and nearly vanished. The
    head's accumulated gradients are those without a scaler. Thinc's scaler is for CUDA
    tensors only; this one scales CPU tensors the same way."""
    import torch
    from thinc.shims.pytorch_grad_scaler import PyTorchGradScaler

    from spacy_fsemicrf.head_model import torch_head

    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner", config={"model": model_config(FILTERED_SEMICRF,
                                                                       dropout=0.0)})
    examples = make_examples(nlp)
    nlp.initialize(lambda: examples)
    model = ner.model
    shim = next(node for node in model.walk() if node.shims).shims[0]
    head = torch_head(next(node for node in model.walk() if node.shims))
    accumulated = {}
    for scaler in (PyTorchGradScaler(enabled=False), _cpu_scaler()):
        shim._grad_scaler = scaler
        for param in head.parameters():
            param.grad = None
        for part in (examples[:2], examples[2:4]):  # two sub-batches, one update
            gold, mask = ner.get_gold(part)
            _, backprop = model.begin_update(ModelInput([eg.predicted for eg in part], gold, mask))
            backprop(1.0)
        accumulated[scaler._enabled] = [p.grad.clone() for p in head.parameters()]
    for plain, scaled in zip(accumulated[False], accumulated[True]):
        assert torch.allclose(scaled, plain, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_float64_default_dtype_builds_and_loads_float32_heads(arch):
    """torch.set_default_dtype(torch.float64) in the user's process: the heads still take the
    tok2vec's float32 vectors, when initialized, trained, saved and loaded."""
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        nlp, losses = _trained(arch, n_iter=8)
        assert losses[-1] < losses[0]
        ner = nlp.get_pipe("fsemicrf_ner")
        assert {p.dtype for p in ner.torch_head.parameters()} == {torch.float32}
        texts = [text for text, _ in TRAIN_DATA]
        before = [[(e.start, e.end, e.label_) for e in doc.ents] for doc in nlp.pipe(texts)]
        loaded = spacy.blank("en")
        loaded.add_pipe("fsemicrf_ner", config={"model": model_config(arch)})
        loaded.from_bytes(nlp.to_bytes())
        head = loaded.get_pipe("fsemicrf_ner").torch_head
        assert {p.dtype for p in head.parameters()} == {torch.float32}
        after = [[(e.start, e.end, e.label_) for e in doc.ents] for doc in loaded.pipe(texts)]
        assert after == before
    finally:
        torch.set_default_dtype(previous)


@pytest.mark.parametrize("config_file", ["configs/fsemicrf_cnn.cfg", "configs/fsemicrf_trf.cfg"])
def test_shipped_configs_use_the_default_head_settings(config_file):
    """The shipped configs train the component's default head (only the tok2vec differs)."""
    from pathlib import Path

    from thinc.api import Config

    from spacy_fsemicrf.component import DEFAULT_MODEL

    root = Path(__file__).resolve().parents[1]
    shipped = Config().from_disk(root / config_file, interpolate=False)
    shipped = shipped["components"]["fsemicrf_ner"]["model"]
    assert {k: v for k, v in shipped.items() if k != "tok2vec"} == {
        k: v for k, v in DEFAULT_MODEL.items() if k != "tok2vec"
    }


@pytest.mark.parametrize("arch", ARCHS)
def test_builders_have_no_hidden_defaults(arch):
    """Every head setting comes from the config: the builders default only the mixed-precision
    settings, as spaCy's own builders do for optional machinery."""
    import inspect

    params = inspect.signature(registry.architectures.get(arch)).parameters
    defaulted = {k for k, p in params.items() if p.default is not inspect.Parameter.empty}
    # null_tokens came after pipelines were saved without it: they load as the paper's graph
    compat = ({"null_tokens", "train_margin", "mean_field", "exact_loss", "focal_gamma"} if arch == "spacy-fsemicrf.FilteredSemiCRF.v1"
              else set())
    assert defaulted == {"mixed_precision", "grad_scaler"} | compat


def test_a_saved_head_with_other_settings_fails_to_load_with_the_differences():
    import srsly
    import torch

    from spacy_fsemicrf.serialize import deserialize_head, instantiate_head, serialize_head

    kwargs = {"max_width": 3, "hidden_width": 8, "context_depth": 0}
    head = instantiate_head("FilteredSemiCRF", kwargs, 6, 2)
    data = serialize_head(head)
    spec = {"arch": "FilteredSemiCRF", "kwargs": kwargs}
    loaded = deserialize_head(spec, None, data, torch.device("cpu"))
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="context_depth = 0 \\(config: 1\\)"):
        deserialize_head({**spec, "kwargs": {**kwargs, "context_depth": 1}}, None, data,
                         torch.device("cpu"))
    with pytest.raises(ValueError, match="architecture 'FilteredSemiCRF'"):
        deserialize_head({**spec, "arch": "SemiCRF"}, None, data, torch.device("cpu"))
    # a head saved before a setting existed was built with the setting's default
    assert "null_tokens" not in kwargs
    deserialize_head({**spec, "kwargs": {**kwargs, "null_tokens": False}}, None, data,
                     torch.device("cpu"))
    with pytest.raises(ValueError, match="null_tokens = False \\(config: True\\)"):
        deserialize_head({**spec, "kwargs": {**kwargs, "null_tokens": True}}, None, data,
                         torch.device("cpu"))
    with pytest.raises(ValueError, match="not written by spacy-fsemicrf"):
        deserialize_head(spec, None, srsly.msgpack_dumps([1, 2]), torch.device("cpu"))


def test_a_saved_head_s_record_and_what_loading_says_about_it():
    """The record names its format; a setting only one side has is shown as unset; data that
    this package did not write (another model's, or no record at all) is named as such."""
    import srsly
    import torch

    from spacy_fsemicrf.serialize import (
        SERIAL_FORMAT, UninitializedHead, deserialize_head, instantiate_head, serialize_head)

    cpu = torch.device("cpu")
    kwargs = {"max_width": 3, "hidden_width": 8, "context_depth": 0}
    spec = {"arch": "FilteredSemiCRF", "kwargs": kwargs}
    data = serialize_head(instantiate_head("FilteredSemiCRF", kwargs, 6, 2))
    record = srsly.msgpack_loads(data)
    assert {k: v for k, v in record.items() if k != "state"} == {
        "format": SERIAL_FORMAT, "initialized": True, "arch": "FilteredSemiCRF",
        "kwargs": kwargs, "input_width": 6, "n_labels": 2}
    placeholder = serialize_head(UninitializedHead())
    assert srsly.msgpack_loads(placeholder) == {"format": SERIAL_FORMAT, "initialized": False}
    assert isinstance(deserialize_head(spec, None, placeholder, cpu), UninitializedHead)
    # "bogus" only in the config (as None), context_depth only in the saved head
    other = {"max_width": 3, "hidden_width": 8, "bogus": None}
    with pytest.raises(ValueError) as err:
        deserialize_head({**spec, "kwargs": other}, None, data, cpu)
    assert str(err.value) == (
        "Cannot load the fsemicrf_ner model: it was trained with a different head configuration "
        "than the one in the current config: bogus = '<unset>' (config: None); "
        "context_depth = 0 (config: '<unset>'). Load the pipeline with the config it was "
        "trained with.")
    # Thinc's own PyTorch shim writes a dict of its config and state; b"\xc1" is no msgpack
    for foreign in (srsly.msgpack_dumps({"config": {}, "state": b""}), b"\xc1"):
        with pytest.raises(ValueError) as err:
            deserialize_head(spec, None, foreign, cpu)
        assert str(err.value) == (
            "Cannot load the fsemicrf_ner head: the saved data was not written by "
            "spacy-fsemicrf (was the pipeline trained with another model architecture?)")
    with pytest.raises(ValueError) as err:
        instantiate_head("FilteredSemiCRF", kwargs, 6, 0)
    assert str(err.value) == "The fsemicrf_ner head needs at least one entity label."
    with pytest.raises(ValueError) as err:
        instantiate_head("Filtered", kwargs, 6, 2)
    assert str(err.value) == (
        "Unknown head 'Filtered'; expected one of ['FilteredSemiCRF', 'LinearCRF', 'SemiCRF']")


def test_weights_that_do_not_fit_their_record_are_named_in_one_line():
    """torch's reason is kept on one line, in the parentheses, without its own full stop: its
    message spans lines and tabs, which a log line of the error would break up."""
    import io

    import srsly
    import torch

    from spacy_fsemicrf.serialize import deserialize_head, instantiate_head, serialize_head

    kwargs = {"max_width": 3, "hidden_width": 8, "context_depth": 0}
    spec = {"arch": "FilteredSemiCRF", "kwargs": kwargs}
    record = srsly.msgpack_loads(serialize_head(instantiate_head("FilteredSemiCRF", kwargs, 6, 2)))
    state = torch.load(io.BytesIO(record["state"]), weights_only=True)
    extra = {**state, "extra.weight": torch.zeros(2)}
    for weights, reason in (
        (extra, 'Error(s) in loading state_dict for FilteredSemiCRFHead: Unexpected key(s) in '
                'state_dict: "extra.weight"'),
        (list(state.values()), "Expected state_dict to be dict-like, got <class 'list'>"),
    ):
        buf = io.BytesIO()
        torch.save(weights, buf)
        with pytest.raises(ValueError) as err:
            deserialize_head(spec, None, srsly.msgpack_dumps({**record, "state": buf.getvalue()}),
                             torch.device("cpu"))
        assert str(err.value) == (
            "Cannot load the fsemicrf_ner head: its weights do not fit the head its record "
            f"describes ({reason}). Save the pipeline again, or reinstall its package.")


def test_a_head_saved_on_a_gpu_loads_on_the_device_it_is_loaded_for(monkeypatch):
    """Weights whose record says ``cuda:0`` (saved from a GPU) load onto the CPU asked for, as
    on a machine without a GPU, where torch.load alone refuses them."""
    import torch

    from spacy_fsemicrf.serialize import deserialize_head, instantiate_head, serialize_head

    kwargs = {"max_width": 3, "hidden_width": 8, "context_depth": 0}
    head = instantiate_head("FilteredSemiCRF", kwargs, 6, 2)
    with monkeypatch.context() as patch:
        patch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        data = serialize_head(head)
    spec = {"arch": "FilteredSemiCRF", "kwargs": kwargs}
    loaded = deserialize_head(spec, None, data, torch.device("cpu"))
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert b.device.type == "cpu" and torch.equal(a, b), name


def test_the_head_of_a_component_not_initialized_tells_to_initialize():
    """``torch_head`` is a placeholder until the labels are known: calling it says what to do."""
    import spacy
    import torch

    ner = spacy.blank("en").add_pipe("fsemicrf_ner")
    message = ("The fsemicrf_ner model has not been initialized: call nlp.initialize() (or train "
               "the pipeline) before using it.")
    with pytest.raises(ValueError) as err:
        ner.torch_head(torch.zeros((1, 2, 4)))
    assert str(err.value) == message


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
    assert all(i.dtype == numpy.int64 for i in ids)
    assert word_ids([]) == []
    # the forms' string hashes, read as signed: the same ids whatever the batch
    for doc, got in zip(docs, ids):
        hashes = [vocab.strings[t.lower_] for t in doc]
        assert got.view("uint64").tolist() == hashes
        assert numpy.array_equal(word_ids([doc])[0], got)


def test_head_shim_device_follows_its_head():
    """The shim looks the head's first parameter up once per module: a head put in later, or
    moved to another device, gives the device its parameters are on."""
    import torch

    from spacy_fsemicrf.head_model import build_head, make_head_model, torch_head

    model = make_head_model("FilteredSemiCRF", {"max_width": 3}, mixed_precision=False,
                            grad_scaler=None)
    shim = model.shims[0]
    assert shim.device == torch.device("cpu")  # the placeholder has no parameters
    build_head(model, 8, 2)
    assert shim.device == torch.device("cpu")
    torch_head(model).to("meta")  # moving keeps the parameter objects
    assert shim.device == torch.device("meta")
    shim._model = torch.nn.Linear(2, 2)  # another head in its place
    assert shim.device == torch.device("cpu")


def test_a_list_of_docs_is_a_prediction_without_gold():
    """spaCy's tools (`spacy debug model`) give every pipe's model a plain list of docs."""
    nlp, _ = _trained(FILTERED_SEMICRF, n_iter=1)
    model = nlp.get_pipe("fsemicrf_ner").model
    docs = [nlp.make_doc(text) for text, _ in TRAIN_DATA]
    spans, conf = model.predict(docs)
    expected_spans, expected_conf = model.predict(ModelInput(docs))
    assert spans.tolist() == expected_spans.tolist()
    numpy.testing.assert_allclose(conf, expected_conf, rtol=1e-6)
    with pytest.raises(TypeError, match="ModelInput or a list of Docs"):
        model.predict(docs + ["not a doc"])


def _untrained(arch=FILTERED_SEMICRF, n_labels=2, **kwargs):
    """The model of ``arch`` on the small tok2vec, initialized for ``n_labels`` labels without
    example documents (untrained: its predictions only have to be consistent), with the same
    weights every time."""
    spacy.util.fix_random_seed(0)
    model = registry.resolve({"m": model_config(arch, dropout=0.0, **kwargs)})["m"]
    model.set_dim("nO", n_labels)
    model.initialize()
    return model


def test_initialize_without_examples_builds_the_head_on_the_declared_width():
    """A tok2vec that declares its width (nO) needs no example documents: the head is built
    on that width. Without nO on the model, initialize names what is missing."""
    model = _untrained(n_labels=3)
    head = model.get_ref("head")
    assert (head.get_dim("nI"), head.get_dim("nO")) == (32, 3)
    unlabelled = registry.resolve({"m": model_config()})["m"]
    with pytest.raises(ValueError, match=(
            r"^The fsemicrf_ner model needs its number of labels \(dimension nO\) before "
            r"initialize: add labels to the component first\.$")):
        unlabelled.initialize()


def test_build_head_again_replaces_the_head_also_for_another_width():
    """A head node built before takes a new head, of the new input width and labels."""
    import torch

    from spacy_fsemicrf.head_model import build_head, make_head_model, torch_head

    model = make_head_model("FilteredSemiCRF", {"max_width": 3}, mixed_precision=False,
                            grad_scaler=None)
    build_head(model, 8, 2)
    first = torch_head(model)
    build_head(model, 16, 3)
    assert torch_head(model) is not first
    assert (model.get_dim("nI"), model.get_dim("nO")) == (16, 3)
    spans, _ = torch_head(model).eval()(torch.zeros(1, 2, 16), torch.tensor([2]))
    assert spans.shape[1] == 4  # it reads 16-wide vectors


def test_the_gradient_of_a_prediction_is_refused():
    model = _untrained()
    docs = [spacy.blank("en").make_doc("Paris")]
    _, backprop = model(ModelInput(docs), is_train=False)
    with pytest.raises(ValueError, match=(
            r"^Prediction output of the fsemicrf_ner model has no gradient\.$")):
        backprop(None)


def test_trailing_empty_documents_and_length_groups_without_word_pool():
    """A batch whose documents with tokens come first (one length group, then empty ones),
    and a batch of several length groups of a head without word_pool (no word ids to split
    among the groups), predict what each document predicts alone."""
    nlp = spacy.blank("en")
    for word_pool in (True, False):
        model = _untrained(word_pool=word_pool)
        head = model.get_ref("head")
        head.attrs["max_padded_tokens"] = 8  # several groups of these short documents
        for texts in (["Paris is big", ""], ["Paris", "John Smith went to London today", ""]):
            docs = [nlp.make_doc(t) for t in texts]
            spans, scores = model.predict(ModelInput(docs))
            alone = [model.predict(ModelInput([doc])) for doc in docs]
            expected = [[i, *row[1:]] for i, (rows, _) in enumerate(alone) for row in rows.tolist()]
            assert spans.tolist() == expected, (word_pool, texts)
            numpy.testing.assert_allclose(scores, numpy.concatenate([s for _, s in alone]),
                                          rtol=1e-4, atol=1e-5)


def test_a_parameter_a_later_sub_batch_leaves_without_gradient_keeps_the_accumulated_one():
    """With a gradient scaler, a head part that a sub-batch does not reach (no gradient from
    it) keeps the gradient the earlier sub-batches accumulated."""
    import torch
    from thinc.api import ArgsKwargs

    from spacy_fsemicrf.head_model import HeadShim

    class TwoParts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.ones(2))
            self.b = torch.nn.Parameter(torch.ones(2))

        def forward(self, X, use_b):
            loss = (self.a * X).sum() + ((self.b * X).sum() if use_b else 0.0)
            return loss.reshape(1)

    module = TwoParts()
    shim = HeadShim(module, grad_scaler=_cpu_scaler())
    X = torch.tensor([1.0, 2.0])
    for use_b in (True, False):  # two sub-batches, one update
        loss, backprop = shim.begin_update(ArgsKwargs(args=(X, use_b), kwargs={}))
        backprop(ArgsKwargs(args=((loss,),), kwargs={"grad_tensors": (torch.ones(1),)}))
    assert module.a.grad.tolist() == [2.0, 4.0]
    assert module.b.grad.tolist() == [1.0, 2.0]


def test_padded_torch_inputs_hold_only_what_every_head_call_takes():
    """The tensors for a call outside the Thinc node (a head's nbest): the zero-padded vectors
    (no gradient), the int64 lengths and the padded word ids; gold, margin and options are
    left to the caller."""
    import torch

    from spacy_fsemicrf.head_model import (
        HeadInput, build_head, make_head_model, padded_torch_inputs,
    )
    from spacy_fsemicrf.structured.prediction import DecodeOptions

    model = make_head_model("FilteredSemiCRF", {"max_width": 3}, mixed_precision=False,
                            grad_scaler=None)
    build_head(model, 4, 2)
    Xs = [numpy.ones((3, 4), dtype="float32"), numpy.ones((1, 4), dtype="float32")]
    inputs = HeadInput(Xs, gold=numpy.asarray([[0, 0, 0, 1]]), words=[[5, 6, 5], [7]],
                       filter_margin=0.5, options=DecodeOptions(path=True))
    X, lengths, kwargs = padded_torch_inputs(model, inputs)
    assert X.shape == (2, 3, 4) and not X.requires_grad
    assert X[0].sum() == 12 and X[1, 0].sum() == 4 and X[1, 1:].abs().sum() == 0
    assert lengths.dtype == torch.long and lengths.tolist() == [3, 1]
    assert list(kwargs) == ["words"] and kwargs["words"].tolist() == [[5, 6, 5], [7, 0, 0]]


def test_model_nbest_of_documents_without_tokens_and_its_default_margin():
    """A document without tokens has one segmentation, without entities, of score and
    log-probability 0: the same whether the batch has a document with tokens (the head's
    answer) or none (no head call). The filter margin is 0 unless given."""
    from spacy_fsemicrf.architectures import model_nbest
    from spacy_fsemicrf.structured.nbest import Segmentation

    nlp = spacy.blank("en")
    empty, doc = nlp.make_doc(""), nlp.make_doc("John Smith went to London today")
    nothing = Segmentation((), 0.0, 0.0)
    for arch in ARCHS:
        model = _untrained(arch)
        assert model_nbest(model, [empty, doc], 2)[0] == [nothing], arch
        assert model_nbest(model, [empty, empty], 2) == [[nothing], [nothing]], arch
    model = _untrained()
    best = model_nbest(model, [doc], 3)
    assert best == model_nbest(model, [doc], 3, 0.0) != model_nbest(model, [doc], 3, 1.0)


def test_a_batch_left_out_of_the_loss_gives_no_gradient():
    """Documents with tokens, all masked out of the loss: zero loss, zero gradients for the
    tok2vec and none for the head, whose weights an optimizer step then leaves alone."""
    from spacy_fsemicrf.architectures import model_torch_head

    nlp = spacy.blank("en")
    docs = [nlp.make_doc("Paris is big"), nlp.make_doc("John went")]
    model = _untrained()
    none = numpy.zeros((0, 4), dtype="int64")
    loss, backprop = model.begin_update(ModelInput(docs, none, numpy.asarray([False, False])))
    assert loss == 0.0
    backprop(1.0)
    assert all(p.grad is None for p in model_torch_head(model).parameters())


class _Waker(torch.nn.Module):
    """A module that wakes a label (counts it in ``label_wakes``) when asked to."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.label_wakes = 0

    def forward(self, x, wake: bool):
        self.label_wakes += int(wake)
        return self.layer(x)


def test_the_shim_starts_the_optimizer_state_afresh_only_when_a_label_wakes():
    """A training step that wakes a label gives the head a new id (Thinc's optimizer keys its
    moments and averages by it), one after every id so far; other steps keep it."""
    from thinc.api import ArgsKwargs
    from thinc.shims.shim import Shim

    from spacy_fsemicrf.head_model import HeadShim

    plain = HeadShim(torch.nn.Linear(1, 1))  # no label_wakes at all
    first = plain.id
    plain.begin_update(ArgsKwargs(args=(torch.ones(1, 1),), kwargs={}))
    assert plain.id == first
    shim = HeadShim(_Waker())
    first = shim.id
    shim.begin_update(ArgsKwargs(args=(torch.ones(1, 1), False), kwargs={}))
    assert shim.id == first
    newest = Shim.global_id
    shim.begin_update(ArgsKwargs(args=(torch.ones(1, 1), True), kwargs={}))
    assert shim.id == newest + 1 == Shim.global_id
    shim.begin_update(ArgsKwargs(args=(torch.ones(1, 1), False), kwargs={}))
    assert shim.id == newest + 1  # woken once: the steps after it keep the new state
