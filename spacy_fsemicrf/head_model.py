"""The Thinc node that wraps a PyTorch head of :mod:`spacy_fsemicrf.structured.heads`.

A head is a ``torch.nn.Module`` whose ``forward(X [B, L, D], lengths [B], gold=None)`` returns the
training loss (``gold`` given) or the decoded ``(spans [N, 4], confidences [N])``. The Thinc node
holds it in a :class:`HeadShim` (a :class:`thinc.api.PyTorchShim`):

* its input is a :class:`HeadInput`; the token vectors are copied once into a zero-padded
  ``[B, L, D]`` array handed to PyTorch without another copy (``torch.from_numpy``), and the
  gradient comes back as views of the padded gradient, one ``[n_i, D]`` block per document;
* the number of labels is only known when the pipeline is initialized, so the shim starts with an
  empty placeholder module and :func:`build_head` puts the real head in at initialization;
* the shim's bytes describe the head next to its weights (:mod:`.serialize`).

Nothing here picks a device: tensors go to the shim's device, which follows Thinc's current ops
(``--gpu-id 0`` gives CUDA) or the parameters of the loaded head.
"""
import contextlib
import inspect
import logging
from functools import partial
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy
import torch
from thinc.api import ArgsKwargs, Model, PyTorchShim, get_torch_default_device, torch2xp, xp2torch
from thinc.shims.pytorch_grad_scaler import PyTorchGradScaler
from thinc.shims.shim import Shim
from thinc.types import Floats2d, Ints1d, Ints2d

from .averages import use_averaged_params
from .serialize import UninitializedHead, deserialize_head, instantiate_head, serialize_head
from .structured.compaction import to_device
from .structured.constrained import ConstraintReport, empty_document_report
from .structured.constraints import DocConstraints
from .structured.heads import HEADS
from .structured.prediction import DecodeOptions, Prediction

logger = logging.getLogger("spacy_fsemicrf")

Decoded = Tuple[numpy.ndarray, numpy.ndarray]

MAX_PADDED_TOKENS = 2**15
"""Prediction splits a batch into groups of documents of similar length so that no group pads to
more than this many token rows (a single longer document forms a group of its own). Training
always runs the whole batch in one call."""

# A prediction group also closes when the next document is shorter than this fraction of the
# group's longest: the span features cost per padded position, and padding a batch of CoNLL
# documents (50 to 400 tokens) to its longest wastes more time than a few extra head calls.
MIN_LENGTH_RATIO = 0.7


def eval_mode(head: torch.nn.Module) -> None:
    """Switch ``head`` to eval mode if it is in training mode, its own flag last. Predictions
    read only that flag, and one loaded pipeline may serve several threads: ``head.eval()``
    clears it first, so that a thread starting a prediction meanwhile would skip the switch
    and run with dropout still on in the submodules not yet switched."""
    if head.training:
        for child in head.children():
            child.eval()
        head.eval()


class HeadShim(PyTorchShim):
    """The PyTorch shim of a head: parameter averages reach the head (:mod:`.averages`), and
    prediction switches the head to eval mode only when it is in training mode
    (:func:`eval_mode`), without switching back (``begin_update`` sets training mode itself):
    Thinc's shim toggles every submodule twice per call, which costs a short document's
    prediction about a sixth of its time, and would switch dropout on under a prediction of
    another thread."""

    use_params = use_averaged_params
    _first_param: Optional[Tuple[torch.nn.Module, Optional[torch.nn.Module], str]] = None

    @property
    def device(self) -> torch.device:
        """The device of the head's parameters. Thinc's walks the module tree on every call,
        which cost a one-document prediction several percent: where the first parameter
        lives (its module and name) is looked up once per head, and read from there (moving
        the head may replace the parameter objects, not the modules that hold them)."""
        param = self._first_parameter()
        return get_torch_default_device() if param is None else param.device

    @property
    def dtype(self) -> torch.dtype:
        """The precision of the head's parameters: float32, unless the head was converted
        (``torch_head.double()``), in which case its token vectors are converted too."""
        param = self._first_parameter()
        return torch.float32 if param is None else param.dtype

    def _first_parameter(self) -> Optional[torch.Tensor]:
        """The head's first parameter (None for a head without any), found as :attr:`device`
        says."""
        cached = self._first_param
        if cached is None or cached[0] is not self._model:
            name = next((n for n, _ in self._model.named_parameters()), "")
            owner = self._model.get_submodule(name.rpartition(".")[0]) if name else None
            cached = self._first_param = (self._model, owner, name.rpartition(".")[2])
        _, owner, attr = cached
        return None if owner is None else getattr(owner, attr)

    def begin_update(self, inputs: ArgsKwargs):
        wakes = getattr(self._model, "label_wakes", 0)
        output, backprop = super().begin_update(inputs)
        if getattr(self._model, "label_wakes", 0) != wakes:
            # a label added to the trained head met its first gold entity: the averages of its
            # silent steps (its bias far below the others) would keep it silent for hundreds
            # of steps in an averaged model (spacy train's evaluation and model-best)
            fresh_optimizer_state(self)
        if not self._grad_scaler._enabled:
            return output, backprop

        def backprop_own_gradients(grads: ArgsKwargs) -> Any:
            # Thinc's backprop unscales every gradient the head holds, also those accumulated
            # by earlier calls (spaCy's accumulate_gradient), which were already unscaled: it
            # is given the head without them, and they are added back after it
            held = [(p, p.grad) for p in self._model.parameters() if p.grad is not None]
            for param, _ in held:
                param.grad = None
            d_inputs = backprop(grads)
            for param, grad in held:
                param.grad = grad if param.grad is None else param.grad.add_(grad)
            return d_inputs

        return output, backprop_own_gradients

    def predict(self, inputs: ArgsKwargs) -> Any:
        eval_mode(self._model)
        # a disabled autocast context still costs a few µs: none without mixed precision
        autocast = (torch.autocast(device_type="cuda") if self._mixed_precision
                    else contextlib.nullcontext())
        # inference mode, not no_grad: no version counters or view tracking on the head's
        # tensors (up to a tenth of its time on one short document at a time)
        with torch.inference_mode(), autocast:
            return self._model(*inputs.args, **inputs.kwargs)


class HeadInput(NamedTuple):
    """What the head node takes.

    Xs: the token vectors of each document (``[n_i, D]``).
    gold: ``None`` to predict, else rows ``(doc, start, end_inclusive, label 1..M)``.
    mask: optional, one bool per document; ``False`` leaves the document out of the loss.
    words: the tokens' word ids (one int array per document), for a head with ``word_pool``.
    filter_margin: prediction-time margin of the filtered head (log-odds).
    options: what a prediction returns besides the entities (None: only them).
    sentence_starts: prediction only: one bool array per document, True where a sentence
        starts (None for a document without sentence boundaries), or None for none: no entity
        crosses a sentence boundary.
    known: training only: one bool array per document, False at the tokens without entity
        annotation (None for a document where every token has it), or None for all: the loss
        learns every path consistent with the annotation.
    incorrect: training only: rows as ``gold`` of entities known to be wrong, or None: the
        loss learns no path that holds one (span heads).
    """

    Xs: List[Floats2d]
    gold: Optional[Ints2d] = None
    mask: Optional[numpy.ndarray] = None
    words: Optional[List[Ints1d]] = None
    filter_margin: float = 0.0
    options: Optional[DecodeOptions] = None
    sentence_starts: Optional[List[Optional[numpy.ndarray]]] = None
    known: Optional[List[Optional[numpy.ndarray]]] = None
    incorrect: Optional[numpy.ndarray] = None


class BatchPrediction(NamedTuple):
    """A head's :class:`~.structured.prediction.Prediction` for a whole batch, in NumPy: the
    entities ``spans int64[N, 4]`` (rows ``doc, start, end_inclusive, label 1..M`` sorted by
    doc and start) with their confidences ``scores float32[N]``; ``path float32[B]`` (1 for an
    empty document); ``candidates`` ``(rows, scores)``; ``reports`` one per document;
    ``constraints`` what each document was decoded under (None where nothing)."""

    spans: numpy.ndarray
    scores: numpy.ndarray
    path: Optional[numpy.ndarray] = None
    candidates: Optional[Decoded] = None
    reports: Optional[List[Optional[ConstraintReport]]] = None
    constraints: Optional[List[Optional[DocConstraints]]] = None


def make_head_model(
    arch: str,
    head_kwargs: Dict[str, Any],
    *,
    mixed_precision: bool,
    grad_scaler: Optional[Dict[str, Any]],
) -> Model[HeadInput, Any]:
    """Create the Thinc node that wraps the (not yet built) PyTorch head of ``arch``."""
    if arch not in HEADS:
        raise ValueError(f"Unknown head {arch!r}; expected one of {sorted(HEADS)}")
    if mixed_precision and get_torch_default_device().type != "cuda":
        # Autocast and Thinc's gradient scaler only work on CUDA: a config with
        # mixed_precision = true still trains and predicts on the CPU, in float32.
        logger.warning("mixed_precision needs a CUDA device (use --gpu-id): running in float32")
        mixed_precision = False
    if isinstance(grad_scaler, PyTorchGradScaler):
        scaler = grad_scaler
    else:
        settings = dict(grad_scaler or {})
        # a misspelt setting would be a TypeError deep in the config's resolution, naming
        # neither the setting's block nor the settings there are
        known = list(inspect.signature(PyTorchGradScaler).parameters)
        unknown = sorted(set(settings) - set(known))
        if unknown:
            raise ValueError(f"grad_scaler: unknown setting {', '.join(map(repr, unknown))}; "
                             f"Thinc's PyTorchGradScaler takes {', '.join(known)}")
        # "enabled" may switch the scaler off; it never scales without mixed precision
        enabled = bool(settings.pop("enabled", True)) and mixed_precision
        scaler = PyTorchGradScaler(enabled=enabled, **settings)
    shim = HeadShim(
        UninitializedHead(),
        mixed_precision=mixed_precision,
        grad_scaler=scaler,
        serialize_model=serialize_head,
        deserialize_model=partial(deserialize_head, {"arch": arch, "kwargs": dict(head_kwargs)}),
    )
    return Model(
        f"fsemicrf_head_{arch}",
        head_forward,
        shims=[shim],
        attrs={"head_arch": arch, "head_kwargs": dict(head_kwargs),
               "max_padded_tokens": MAX_PADDED_TOKENS},
        dims={"nI": None, "nO": None},
    )


def torch_head(head_model: Model) -> torch.nn.Module:
    """The PyTorch module inside the head node (a placeholder before initialization)."""
    return head_model.shims[0]._model


def is_initialized(head_model: Model) -> bool:
    return not isinstance(torch_head(head_model), UninitializedHead)


def build_head(head_model: Model, input_width: int, n_labels: int) -> None:
    """Build the PyTorch head for ``n_labels`` entity types over ``input_width``-wide vectors
    and put it into the shim (on the shim's device)."""
    shim = head_model.shims[0]
    device = shim.device
    head = instantiate_head(head_model.attrs["head_arch"], head_model.attrs["head_kwargs"],
                            int(input_width), int(n_labels))
    shim._model = head.to(device)
    head_model.set_dim("nI", int(input_width), force=True)
    head_model.set_dim("nO", int(n_labels), force=True)


def grow_head(head_model: Model, n: int) -> None:
    """Grow the built head by ``n`` entity labels, numbered after the existing ones (the
    heads' ``add_labels``). The shim takes a new id, under which the optimizer starts fresh
    state (moments, averages) for every parameter: Thinc's optimizer keys them by shim id and
    name, and the state of a parameter of the old shape cannot step the new one."""
    head = torch_head(head_model)
    head.add_labels(int(n))
    head.fsemicrf_spec["n_labels"] = head.n_labels
    head_model.set_dim("nO", head.n_labels, force=True)
    fresh_optimizer_state(head_model.shims[0])


def fresh_optimizer_state(shim: PyTorchShim) -> None:
    """Give ``shim`` a new id: Thinc's optimizer keys its state (Adam's moments, the parameter
    averages) by shim id and parameter name, so every parameter of the head starts afresh."""
    with Shim.global_id_lock:  # (as Thinc numbers its shims)
        Shim.global_id += 1
        shim.id = Shim.global_id


# Forward pass -------------------------------------------------------------------------------


def head_forward(model: Model, inputs: HeadInput, is_train: bool) -> Tuple[Any, Callable]:
    """Without gold: ``(spans int64[N, 4], confidences float32[N])`` as numpy arrays (rows
    ``doc, start, end_inclusive, label 1..M`` sorted by doc and start). With gold: the summed
    loss as a float, whose backprop takes ``d_loss`` and returns the gradient of ``Xs``."""
    if not is_initialized(model):
        raise ValueError(
            "The fsemicrf_ner model has not been initialized: call nlp.initialize() "
            "(or train the pipeline) before using it."
        )
    lengths = numpy.asarray([x.shape[0] for x in inputs.Xs], dtype="int64")
    if inputs.gold is None:
        if is_train:
            raise ValueError("Training the fsemicrf_ner model needs gold spans.")
        return _predict(model, inputs, lengths), _no_backprop
    if inputs.mask is not None:
        lengths = numpy.where(numpy.asarray(inputs.mask, dtype=bool), lengths, 0)
    return _loss(model, inputs, lengths, is_train)


def _no_backprop(dY: Any) -> None:
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
    if len(Xs) and int(lengths.min()) == max_len:  # no padding: one copy of all the rows
        return model.ops.asarray3f(model.ops.xp.stack(Xs))
    padded = model.ops.alloc3f(len(Xs), max_len, width)
    for i, x in enumerate(Xs):
        if lengths[i]:
            padded[i, : lengths[i]] = x[: lengths[i]]
    return padded


def _pad_rows(
    rows: Sequence, lengths: numpy.ndarray, max_len: int, dtype: str = "int64", missing: Any = 0
) -> numpy.ndarray:
    """One value per token of each document (word ids, sentence starts, known tokens) in a
    ``[B, max_len]`` array (0 at padding, which no head reads; ``missing`` for the tokens of a
    row of None)."""
    if len(rows) and int(lengths.min()) == max_len and all(r is not None for r in rows):
        return numpy.stack([numpy.asarray(r[:max_len], dtype=dtype) for r in rows])
    padded = numpy.zeros((len(rows), max_len), dtype=dtype)
    for i, r in enumerate(rows):
        n = int(lengths[i])
        if n:
            padded[i, :n] = missing if r is None else numpy.asarray(r[:n], dtype=dtype)
    return padded


def _to_torch_args(
    model: Model, inputs: HeadInput, lengths: numpy.ndarray, is_train: bool
) -> ArgsKwargs:
    device, dtype = model.shims[0].device, model.shims[0].dtype
    padded = _pad(model, inputs.Xs, lengths)
    Xt = _as_tensor(padded, device)
    if Xt.dtype != dtype:  # a head converted to another precision (torch_head.double())
        Xt = Xt.to(dtype)
    if is_train:
        Xt.requires_grad_()
    lengths_t = _as_tensor(numpy.asarray(lengths, dtype="int64"), device)
    kwargs: Dict[str, Any] = {}
    if inputs.words is not None:
        kwargs["words"] = _as_tensor(_pad_rows(inputs.words, lengths, padded.shape[1]), device)
    if inputs.gold is not None:
        gold = inputs.gold
        gold_np = gold if isinstance(gold, numpy.ndarray) else model.ops.to_numpy(gold)
        gold_np = numpy.asarray(gold_np, dtype="int64").reshape(-1, 4)
        kwargs["gold"] = torch.as_tensor(gold_np, dtype=torch.long).to(device)
        if inputs.known is not None:  # (a document without flags is known everywhere)
            known = _pad_rows(inputs.known, lengths, padded.shape[1], "bool", missing=True)
            kwargs["known"] = _as_tensor(known, device)
        if inputs.incorrect is not None:
            rows = numpy.asarray(inputs.incorrect, dtype="int64").reshape(-1, 4)
            kwargs["incorrect"] = torch.as_tensor(rows).to(device)
    else:
        if inputs.filter_margin:
            kwargs["filter_margin"] = float(inputs.filter_margin)
        if inputs.options is not None:
            kwargs["options"] = inputs.options
        if inputs.sentence_starts is not None:
            starts = _pad_rows(inputs.sentence_starts, lengths, padded.shape[1], "bool")
            kwargs["sentence_starts"] = _as_tensor(starts, device)
    return ArgsKwargs(args=(Xt, lengths_t), kwargs=kwargs)


def _as_tensor(array: Any, device: torch.device) -> torch.Tensor:
    """``array`` (NumPy or CuPy) as a tensor on ``device``, without a copy where it already is
    there. A NumPy array goes through ``torch.from_numpy`` (:func:`to_device`): Thinc's
    ``xp2torch`` takes the DLPack route, a few times slower for a short document's arrays."""
    if isinstance(array, numpy.ndarray):
        return to_device(array, device)
    return xp2torch(array, device=device)


def padded_torch_inputs(model: Model, inputs: HeadInput) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, Any]]:
    """``(X [B, L, D], lengths [B], {"words": ..., "sentence_starts": ...})``: the head's
    tensors for ``inputs`` (each keyword where ``inputs`` has it), for calls outside the Thinc
    node (such as a head's ``nbest``)."""
    lengths = numpy.asarray([x.shape[0] for x in inputs.Xs], dtype="int64")
    args = _to_torch_args(model, inputs._replace(gold=None, filter_margin=0.0, options=None),
                          lengths, False)
    return args.args[0], args.args[1], dict(args.kwargs)


def _loss(model: Model, inputs: HeadInput, lengths: numpy.ndarray, is_train: bool):
    ops = model.ops
    Xs = inputs.Xs
    if len(Xs) == 0 or int(lengths.sum()) == 0:
        # Nothing to score (empty batch, empty documents): zero loss, zero gradient.
        def backprop_empty(d_loss: float) -> List[Floats2d]:
            return [ops.alloc2f(*x.shape) for x in Xs]

        return 0.0, backprop_empty
    args = _to_torch_args(model, inputs, lengths, is_train)
    loss_t, torch_backprop = model.shims[0](args, is_train)
    # Shape [1], not []: Thinc's gradient scaler (mixed precision) multiplies the gradient in
    # place by its [1]-shaped scale, which a 0-d tensor cannot hold.
    loss_t = loss_t.reshape(1)
    loss = float(loss_t.detach().float().cpu())

    def backprop(d_loss: float) -> List[Floats2d]:
        d_loss_t = loss_t.detach().new_full((1,), float(d_loss))
        grads = ArgsKwargs(args=((loss_t,),), kwargs={"grad_tensors": (d_loss_t,)})
        dXt = torch_backprop(grads).args[0]
        if dXt is None:
            return [ops.alloc2f(*x.shape) for x in Xs]
        if dXt.dtype != torch.float32:  # a converted head's: the tok2vec's are float32
            dXt = dXt.float()
        dX = torch2xp(dXt)
        out = []
        for i, x in enumerate(Xs):
            n = int(lengths[i])
            out.append(dX[i, :n] if n == x.shape[0] and n else ops.alloc2f(*x.shape))
        return out

    return loss, backprop


def length_groups(
    lengths: numpy.ndarray, max_padded: int, min_ratio: float = MIN_LENGTH_RATIO
) -> List[numpy.ndarray]:
    """Split document indices into groups of similar length, longest first, so that each
    group's padded size ``len(group) * max_length`` stays within ``max_padded`` (a longer
    document forms its own group) and no document is shorter than ``min_ratio`` times its
    group's longest. Empty documents are left out."""
    if lengths.size == 1:  # one request at a time: no sort
        return [numpy.zeros((1,), dtype="int64")] if lengths[0] else []
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


def _predict(model: Model, inputs: HeadInput, lengths: numpy.ndarray):
    """Predict in groups of documents of similar length; the entities ``(spans, scores)``, or
    a :class:`BatchPrediction` when ``inputs.options`` asks for more."""
    shim = model.shims[0]
    options = inputs.options
    parts: List[Tuple[numpy.ndarray, Prediction]] = []
    groups = length_groups(lengths, int(model.attrs["max_padded_tokens"]))
    in_order = _in_batch_order(groups)
    for group in groups:
        if in_order and group.size == lengths.size:
            sub = inputs  # the whole batch in one group
        else:
            words = None if inputs.words is None else [inputs.words[i] for i in group]
            starts = (None if inputs.sentence_starts is None
                      else [inputs.sentence_starts[i] for i in group])
            sub_options = None
            if options is not None:
                constraints = options.constraints
                sub_options = options._replace(
                    constraints=None if constraints is None else [constraints[i] for i in group])
            sub = HeadInput([inputs.Xs[i] for i in group], words=words,
                            filter_margin=inputs.filter_margin, options=sub_options,
                            sentence_starts=starts)
        out = shim.predict(_to_torch_args(model, sub, lengths[group], False))
        parts.append((group, Prediction(*out) if options is None else out))
    spans, scores = _merge_rows([(g, p.spans, p.scores) for g, p in parts], in_order)
    if options is None:
        return spans, scores
    n_docs = len(lengths)
    path = numpy.ones((n_docs,), dtype="float32")  # an empty document's only path is empty
    reports: List[Optional[ConstraintReport]] = [None] * n_docs
    for group, p in parts:
        if p.path is not None:
            path[group] = _host(p.path, torch.float32)
        for i, report in zip(group.tolist(), p.reports or ()):
            reports[i] = report
    if options.constrained():  # the documents without tokens, which no group holds
        for i in numpy.flatnonzero(lengths == 0).tolist():
            reports[i] = empty_document_report(options.constraints[i])
    candidates = None
    if options.candidates:
        candidates = _merge_rows([(g, *p.candidates) for g, p in parts], in_order)
    return BatchPrediction(spans, scores, path if options.path else None, candidates,
                           reports if options.constrained() else None)


def _host(x: torch.Tensor, dtype: torch.dtype) -> numpy.ndarray:
    return x.detach().to("cpu", dtype).numpy()


def _in_batch_order(groups: List[numpy.ndarray]) -> bool:
    """Whether ``groups`` is one group of the batch's first documents in order (one document,
    or documents of one length), whose rows then hold the batch's document numbers."""
    if len(groups) != 1:
        return False
    group = groups[0]
    return (group.size == 1 and int(group[0]) == 0) or numpy.array_equal(
        group, numpy.arange(group.size))


def _merge_rows(
    parts: Sequence[Tuple[numpy.ndarray, torch.Tensor, torch.Tensor]], in_order: bool
) -> Decoded:
    """Rows ``(doc, start, end, label)`` and their values from the length groups, with the
    group's document numbers mapped back to the batch's and sorted by ``(doc, start)``;
    ``in_order``: the groups are one group in batch order (:func:`_in_batch_order`)."""
    if in_order:  # the rows already hold the batch's document numbers, in (doc, start) order
        _, rows_t, values_t = parts[0]
        return _host(rows_t, torch.long).reshape(-1, 4), _host(values_t, torch.float32).reshape(-1)
    all_rows = [numpy.zeros((0, 4), dtype="int64")]
    all_values = [numpy.zeros((0,), dtype="float32")]
    for group, rows_t, values_t in parts:
        rows = _host(rows_t, torch.long).reshape(-1, 4)
        if rows.shape[0]:
            rows = rows.copy()
            rows[:, 0] = group[rows[:, 0]]
        all_rows.append(rows)
        all_values.append(_host(values_t, torch.float32).reshape(-1))
    rows = numpy.concatenate(all_rows, axis=0)
    values = numpy.concatenate(all_values, axis=0)
    if rows.shape[0]:
        # The groups run longest documents first: restore (doc, start) order.
        order = numpy.lexsort((rows[:, 1], rows[:, 0]))
        rows, values = rows[order], values[order]
    return rows, values
