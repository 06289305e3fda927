"""The bridge between Thinc and the PyTorch heads of `spacy_fsemicrf.structured.heads`.

A head is a ``torch.nn.Module`` whose ``forward(X [B, L, D], lengths [B], gold=None)`` returns the
training loss (``gold`` given) or the decoded ``(spans [N, 4], confidences [N])``. This module
wraps it in a Thinc ``Model`` that holds a :class:`thinc.api.PyTorchShim`:

* the input is ``(Xs, gold, mask)`` or ``(Xs, gold, mask, words)`` where ``Xs`` is the
  ``List[Floats2d]`` of token vectors from the ``tok2vec`` layer and ``words`` the word ids of
  the tokens (one ``Ints1d`` per document), for a head with ``word_pool``; the vectors are copied once into a zero-padded ``[B, L, D]`` array
  that is handed to PyTorch without another copy (``xp2torch``: DLPack on GPU, shared memory on
  CPU), and the gradient comes back as views of the padded gradient, one ``[n_i, D]`` block per
  document;
* the number of labels is only known when the pipeline is initialized, so the shim starts with an
  empty placeholder module and :func:`build_head` puts the real head in at initialization;
* with ``use_averages = true`` the optimizer's parameter averages are applied to the head too
  (:class:`HeadShim`), as Thinc applies them to its own layers;
* the shim's bytes describe the head (its class, keyword arguments, input width and number of
  labels) next to its weights, so loading rebuilds the head before loading the weights, and a
  model loaded into a config that builds a different head fails with a clear error.

Nothing here picks a device: tensors go to the shim's device, which follows Thinc's current ops
(``--gpu-id 0`` gives CUDA) or the parameters of the loaded head.
"""
import contextlib
import importlib
import inspect
import logging
from functools import partial
from io import BytesIO
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy
import srsly
import torch
from thinc.api import ArgsKwargs, Model, PyTorchShim, get_torch_default_device, torch2xp, xp2torch
from thinc.shims.pytorch_grad_scaler import PyTorchGradScaler
from thinc.types import Floats2d

logger = logging.getLogger("spacy_fsemicrf")

HEAD_CLASSES = {
    "FilteredSemiCRF": "FilteredSemiCRFHead",
    "SemiCRF": "SemiCRFHead",
    "LinearCRF": "LinearCRFHead",
}
"""Architecture name -> class name in ``spacy_fsemicrf.structured.heads``."""

SERIAL_FORMAT = 1
"""Version of the shim byte format written by :func:`serialize_head`."""

DEFAULT_MAX_PADDED_TOKENS = 2**15
"""Prediction splits a batch into groups of documents of similar length so that no group pads to
more than this many token rows (a single longer document forms a group of its own). Training
always runs the whole batch in one call."""


class UninitializedHead(torch.nn.Module):
    """Placeholder held by the shim until the labels are known. It has no parameters, so the
    shim's device falls back to Thinc's current ops."""

    def forward(self, *args, **kwargs):  # pragma: no cover - guarded before any call
        raise ValueError(
            "The fsemicrf_ner model has not been initialized: call nlp.initialize() "
            "(or train the pipeline) before using it."
        )


_THINC_USE_PARAMS = PyTorchShim.use_params


@contextlib.contextmanager
def use_averaged_params(shim: PyTorchShim, params):
    """``PyTorchShim.use_params`` that applies the optimizer's averages.

    Thinc's :class:`PyTorchShim` (8.3) hands its parameters to the optimizer under the keys
    ``(shim id, parameter name)`` but looks for keys ``"pytorch_<id>_<name>"`` in
    ``use_params``, so with ``use_averages = true`` the averages never reached a PyTorch model:
    the pipeline evaluated and saved during training paired the averaged ``tok2vec`` with the
    head's last weights. Keys of the other form still go to Thinc's implementation."""
    parameters = dict(shim._model.named_parameters())
    averages = {name: params[(shim.id, name)] for name in parameters if (shim.id, name) in params}
    if not averages:
        with _THINC_USE_PARAMS(shim, params):
            yield
        return
    backup = {name: parameters[name].data for name in averages}
    try:
        for name, value in averages.items():
            data = backup[name]
            parameters[name].data = xp2torch(value, device=data.device).to(data.dtype).clone()
        yield
    finally:
        for name, data in backup.items():
            parameters[name].data = data


class HeadShim(PyTorchShim):
    """The PyTorch shim of a head, whose ``use_params`` applies the optimizer's averages
    (:func:`use_averaged_params`)."""

    use_params = use_averaged_params


def get_head_class(arch: str) -> type:
    """Return the head class for an architecture name such as ``"FilteredSemiCRF"``."""
    heads = importlib.import_module("spacy_fsemicrf.structured.heads")
    return getattr(heads, HEAD_CLASSES[arch])


def head_defaults(arch: str) -> Dict[str, Any]:
    """The keyword arguments of the head class of ``arch`` that have defaults."""
    params = inspect.signature(get_head_class(arch)).parameters.values()
    return {p.name: p.default for p in params
            if p.kind is p.KEYWORD_ONLY and p.default is not inspect.Parameter.empty}


def make_head_model(
    arch: str,
    head_kwargs: Dict[str, Any],
    *,
    mixed_precision: bool = False,
    grad_scaler: Optional[Dict[str, Any]] = None,
) -> Model:
    """Create the Thinc node that wraps the (not yet built) PyTorch head of ``arch``."""
    if arch not in HEAD_CLASSES:
        raise ValueError(f"Unknown head {arch!r}; expected one of {sorted(HEAD_CLASSES)}")
    spec = {"arch": arch, "kwargs": dict(head_kwargs)}
    if mixed_precision and get_torch_default_device().type != "cuda":
        # Autocast and Thinc's gradient scaler only work on CUDA: a config with
        # mixed_precision = true still trains and predicts on the CPU, in float32.
        logger.warning("mixed_precision needs a CUDA device (use --gpu-id): running in float32")
        mixed_precision = False
    if isinstance(grad_scaler, PyTorchGradScaler):
        scaler = grad_scaler
    else:
        scaler = PyTorchGradScaler(enabled=mixed_precision, **dict(grad_scaler or {}))
    shim = HeadShim(
        UninitializedHead(),
        mixed_precision=mixed_precision,
        grad_scaler=scaler,
        serialize_model=serialize_head,
        deserialize_model=partial(deserialize_head, spec),
    )
    return Model(
        f"fsemicrf_head_{arch}",
        head_forward,
        shims=[shim],
        attrs={
            "head_arch": arch,
            "head_kwargs": dict(head_kwargs),
            "max_padded_tokens": DEFAULT_MAX_PADDED_TOKENS,
            # prediction only; set by the component (FilteredSemiCRF heads take it)
            "filter_margin": 0.0,
        },
        dims={"nI": None, "nO": None},
    )


def is_initialized(head_model: Model) -> bool:
    return not isinstance(head_model.shims[0]._model, UninitializedHead)


def build_head(head_model: Model, input_width: int, n_labels: int) -> None:
    """Build the PyTorch head for ``n_labels`` entity types over ``input_width``-wide vectors
    and put it into the shim (on the shim's device)."""
    shim: PyTorchShim = head_model.shims[0]
    device = shim.device
    head = _instantiate(head_model.attrs["head_arch"], head_model.attrs["head_kwargs"],
                        int(input_width), int(n_labels))
    shim._model = head.to(device)
    head_model.set_dim("nI", int(input_width), force=True)
    head_model.set_dim("nO", int(n_labels), force=True)


def _instantiate(arch: str, kwargs: Dict[str, Any], input_width: int, n_labels: int):
    if n_labels < 1:
        raise ValueError("The fsemicrf_ner head needs at least one entity label.")
    head = get_head_class(arch)(input_width, n_labels, **kwargs)
    head.fsemicrf_spec = {
        "arch": arch,
        "kwargs": dict(kwargs),
        "input_width": input_width,
        "n_labels": n_labels,
    }
    return head


def serialize_head(module: torch.nn.Module) -> bytes:
    """Shim serializer: the head's description plus its ``state_dict``."""
    spec = getattr(module, "fsemicrf_spec", None)
    if isinstance(module, UninitializedHead) or spec is None:
        return srsly.msgpack_dumps({"format": SERIAL_FORMAT, "initialized": False})
    buf = BytesIO()
    torch.save(module.state_dict(), buf)
    msg = {"format": SERIAL_FORMAT, "initialized": True, "state": buf.getvalue()}
    msg.update(spec)
    return srsly.msgpack_dumps(msg)


def deserialize_head(
    spec: Dict[str, Any], module: torch.nn.Module, data: bytes, device: "torch.device"
) -> torch.nn.Module:
    """Shim deserializer: rebuild the head described in ``data`` and load its weights.

    ``spec`` is what the current config builds; a saved head of another architecture or with
    other hyper-parameters raises a ``ValueError`` naming the differences."""
    try:
        msg = srsly.msgpack_loads(data)
    except Exception:
        msg = None
    if not isinstance(msg, dict) or "initialized" not in msg:
        raise ValueError(
            "Cannot load the fsemicrf_ner head: the saved data was not written by "
            "spacy-fsemicrf (was the pipeline trained with another model architecture?)"
        )
    if not msg["initialized"]:
        return UninitializedHead().to(device)
    problems = []
    if msg["arch"] != spec["arch"]:
        problems.append(f"architecture {msg['arch']!r} (config: {spec['arch']!r})")
    # A head saved before an option existed was built with that option's default.
    saved_kwargs = {**head_defaults(msg["arch"]), **msg["kwargs"]}
    for key in sorted(set(saved_kwargs) | set(spec["kwargs"])):
        saved, current = saved_kwargs.get(key, "<unset>"), spec["kwargs"].get(key, "<unset>")
        if saved != current:
            problems.append(f"{key} = {saved!r} (config: {current!r})")
    if problems:
        raise ValueError(
            "Cannot load the fsemicrf_ner model: it was trained with a different head "
            "configuration than the one in the current config: " + "; ".join(problems)
            + ". Load the pipeline with the config it was trained with."
        )
    head = _instantiate(msg["arch"], saved_kwargs, int(msg["input_width"]), int(msg["n_labels"]))
    state = torch.load(BytesIO(msg["state"]), map_location=device)
    head.load_state_dict(state)
    return head.to(device)


# Forward pass -------------------------------------------------------------------------------


def head_forward(model: Model, inputs, is_train: bool):
    """``inputs = (Xs, gold, mask)`` or ``(Xs, gold, mask, words)``.

    gold ``None``: returns ``(spans int64[N, 4], confidences float32[N])`` as numpy arrays (rows
    ``doc, start, end_inclusive, label 1..M`` sorted by doc and start).
    gold an int array ``[G, 4]``: returns the summed loss as a float; its backprop takes
    ``d_loss`` and returns the ``List[Floats2d]`` gradient of ``Xs``.
    ``mask`` (optional bool ``[B]``): documents with ``False`` are left out of the loss.
    ``words`` (optional, one int array per document): word ids, passed on as ``words [B, L]``.
    """
    Xs, gold, mask = inputs[:3]
    words = inputs[3] if len(inputs) > 3 else None
    if not is_initialized(model):
        raise ValueError(
            "The fsemicrf_ner model has not been initialized: call nlp.initialize() "
            "(or train the pipeline) before using it."
        )
    lengths = numpy.asarray([x.shape[0] for x in Xs], dtype="int64")
    if gold is None:
        if is_train:
            raise ValueError("Training the fsemicrf_ner model needs gold spans.")
        return _predict(model, Xs, lengths, words), _no_backprop
    if mask is not None:
        lengths = numpy.where(numpy.asarray(mask, dtype=bool), lengths, 0)
    return _loss(model, Xs, lengths, gold, is_train, words)


def _no_backprop(dY):
    raise ValueError("Prediction output of the fsemicrf_ner model has no gradient.")


def _pad(model: Model, Xs: Sequence[Floats2d], lengths: numpy.ndarray):
    """One copy of the token vectors into a zero-padded ``[B, max(1, L), D]`` array."""
    width = model.get_dim("nI")
    for x in Xs:
        if x.shape[0] and x.shape[1] != width:
            raise ValueError(
                f"The tok2vec layer produced vectors of width {x.shape[1]} but the fsemicrf_ner "
                f"head was built for width {width}."
            )
    max_len = max(1, int(lengths.max()) if len(lengths) else 1)
    padded = model.ops.alloc3f(len(Xs), max_len, width)
    for i, x in enumerate(Xs):
        if lengths[i]:
            padded[i, : lengths[i]] = x[: lengths[i]]
    return padded


def _pad_words(words: Sequence, lengths: numpy.ndarray, max_len: int) -> numpy.ndarray:
    """The word ids in a ``[B, max_len]`` int64 array (0 at padding, which no head reads)."""
    padded = numpy.zeros((len(words), max_len), dtype="int64")
    for i, w in enumerate(words):
        n = int(lengths[i])
        if n:
            padded[i, :n] = numpy.asarray(w[:n], dtype="int64")
    return padded


def _to_torch_args(model, Xs, lengths, gold, is_train, words=None):
    shim: PyTorchShim = model.shims[0]
    device = shim.device
    padded = _pad(model, Xs, lengths)
    Xt = xp2torch(padded, requires_grad=is_train, device=device)
    lengths_t = torch.as_tensor(lengths, dtype=torch.long).to(device)
    kwargs = {}
    if words is not None:
        kwargs["words"] = torch.as_tensor(_pad_words(words, lengths, padded.shape[1])).to(device)
    if gold is not None:
        gold_np = gold if isinstance(gold, numpy.ndarray) else model.ops.to_numpy(gold)
        gold_np = numpy.asarray(gold_np, dtype="int64").reshape(-1, 4)
        kwargs["gold"] = torch.as_tensor(gold_np, dtype=torch.long).to(device)
    elif model.attrs.get("filter_margin", 0.0):
        kwargs["filter_margin"] = float(model.attrs["filter_margin"])
    return ArgsKwargs(args=(Xt, lengths_t), kwargs=kwargs)


def _loss(model: Model, Xs, lengths, gold, is_train: bool, words=None):
    ops = model.ops
    if len(Xs) == 0 or int(lengths.sum()) == 0:
        # Nothing to score (empty batch, empty documents): zero loss, zero gradient.
        def backprop_empty(d_loss):
            return [ops.alloc2f(*x.shape) for x in Xs]

        return 0.0, backprop_empty
    args = _to_torch_args(model, Xs, lengths, gold, is_train, words)
    shim: PyTorchShim = model.shims[0]
    loss_t, torch_backprop = shim(args, is_train)
    # Shape [1], not []: Thinc's gradient scaler (mixed precision) multiplies the gradient in
    # place by its [1]-shaped scale, which a 0-d tensor cannot hold.
    loss_t = loss_t.reshape(1)
    loss = float(loss_t.detach().float().cpu())

    def backprop(d_loss) -> List[Floats2d]:
        d_loss_t = loss_t.detach().new_full((1,), float(d_loss))
        grads = ArgsKwargs(args=((loss_t,),), kwargs={"grad_tensors": (d_loss_t,)})
        d_args = torch_backprop(grads)
        dXt = d_args.args[0]
        if dXt is None:
            return [ops.alloc2f(*x.shape) for x in Xs]
        dX = torch2xp(dXt)
        out = []
        for i, x in enumerate(Xs):
            n = int(lengths[i])
            out.append(dX[i, :n] if n == x.shape[0] and n else ops.alloc2f(*x.shape))
        return out

    return loss, backprop


# A prediction group also closes when the next document is shorter than this fraction of the
# group's longest: the span features cost per padded position, and padding a batch of CoNLL
# documents (50 to 400 tokens) to its longest wastes more time than a few extra head calls.
MIN_LENGTH_RATIO = 0.7


def length_groups(
    lengths: numpy.ndarray, max_padded: int, min_ratio: float = MIN_LENGTH_RATIO
) -> List[numpy.ndarray]:
    """Split document indices into groups of similar length, longest first, so that each
    group's padded size ``len(group) * max_length`` stays within ``max_padded`` (a longer
    document forms its own group) and no document is shorter than ``min_ratio`` times its
    group's longest. Empty documents are left out."""
    order = numpy.argsort(-lengths, kind="stable")
    groups: List[List[int]] = []
    current: List[int] = []
    current_max = 0
    for i in order:
        n = int(lengths[i])
        if n == 0:
            break
        if current and ((len(current) + 1) * current_max > max_padded or n < min_ratio * current_max):
            groups.append(current)
            current = []
        if not current:
            current_max = n
        current.append(int(i))
    if current:
        groups.append(current)
    return [numpy.asarray(g, dtype="int64") for g in groups]


def _predict(model: Model, Xs, lengths, words=None) -> Tuple[numpy.ndarray, numpy.ndarray]:
    shim: PyTorchShim = model.shims[0]
    all_spans = []
    all_confs = []
    for group in length_groups(lengths, int(model.attrs["max_padded_tokens"])):
        group_words = None if words is None else [words[i] for i in group]
        args = _to_torch_args(model, [Xs[i] for i in group], lengths[group], None, False,
                              group_words)
        spans_t, confs_t = shim.predict(args)
        spans = spans_t.detach().to("cpu", torch.long).numpy()
        confs = confs_t.detach().to("cpu", torch.float32).numpy()
        if spans.shape[0]:
            spans = spans.copy()
            spans[:, 0] = group[spans[:, 0]]
        all_spans.append(spans.reshape(-1, 4))
        all_confs.append(confs.reshape(-1))
    if not all_spans:
        return numpy.zeros((0, 4), dtype="int64"), numpy.zeros((0,), dtype="float32")
    spans = numpy.concatenate(all_spans, axis=0)
    confs = numpy.concatenate(all_confs, axis=0)
    if spans.shape[0]:
        # The groups run longest documents first: restore (doc, start) order.
        order = numpy.lexsort((spans[:, 1], spans[:, 0]))
        spans, confs = spans[order], confs[order]
    return spans, confs
