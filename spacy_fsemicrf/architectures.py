"""Registered Thinc architectures: a ``tok2vec`` layer followed by a PyTorch structured head.

Each architecture builds ``Model[Tuple[List[Doc], Optional[Ints2d]], ...]``:

* input ``(docs, gold)`` (or ``(docs, gold, mask)``): ``gold`` is ``None`` or an int array of
  rows ``(doc, start, end_inclusive, label)`` with labels ``1..M`` (0 is reserved for "no
  entity"); ``mask`` optionally leaves documents out of the loss;
* with gold, the output is the summed loss (a float); ``backprop(1.0)`` sends the gradient
  through the head into the ``tok2vec`` layer;
* without gold, the output is ``(spans, confidences)``: numpy arrays ``int64[N, 4]`` (same row
  format) and ``float32[N]``, the confidence being the marginal probability of the labelled span.

The number of labels is the model's ``nO`` dimension, set by the component before
``initialize``; the PyTorch head is built at ``initialize`` (see :mod:`.torch_bridge`).
"""
import functools
import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy
from spacy.tokens import Doc
from spacy.util import registry
from thinc.api import Model
from thinc.types import Floats2d

from .torch_bridge import build_head, get_head_class, is_initialized, make_head_model

FILTERED_SEMICRF = "spacy-fsemicrf.FilteredSemiCRF.v1"
FILTERED_SEMICRF_V2 = "spacy-fsemicrf.FilteredSemiCRF.v2"
FILTERED_SEMICRF_V3 = "spacy-fsemicrf.FilteredSemiCRF.v3"
FILTERED_SEMICRF_V4 = "spacy-fsemicrf.FilteredSemiCRF.v4"
SEMICRF = "spacy-fsemicrf.SemiCRF.v1"
LINEAR_CRF = "spacy-fsemicrf.LinearCRF.v1"


@registry.architectures(FILTERED_SEMICRF)
def build_filtered_semicrf(
    tok2vec: Model[List[Doc], List[Floats2d]],
    max_width: int = 10,
    hidden_width: int = 128,
    span_repr: str = "sum_endpoints_neighbors",
    transitions: bool = False,
    null_weight: float = 0.75,
    dropout: float = 0.1,
    hidden_depth: int = 1,
    context_depth: int = 0,
    span_norm: bool = False,
    boundary_smoothing: float = 0.0,
    doc_vector: bool = False,
    word_pool: bool = False,
    mixed_precision: bool = False,
    grad_scaler: Optional[Dict[str, Any]] = None,
) -> Model:
    """Filtered Semi-Markov CRF (Zaratiana et al., 2023) over the vectors of ``tok2vec``.

    max_width (int): widest entity in tokens (K); wider gold entities are left out of training.
    hidden_width (int): width of the span representation.
    span_repr (str): span featurizer: "endpoints" ([h_i; h_j; width]), a pooling ("sum",
        "mean", "max"), "sum_endpoints" (sum pooling plus the boundary tokens),
        "sum_endpoints_neighbors" (also the token before and the token after the span) or
        "sum_endpoints_neighbors_max" (also max pooling over the span, as spancat's reducer).
    transitions (bool): add label-transition scores between consecutive nodes.
    null_weight (float): weight of the null spans in the local loss (beta).
    dropout (float): dropout inside the head.
    hidden_depth (int): hidden layers over each span (the featurizer is the first).
    context_depth (int): BiLSTM layers (half the token width per direction) between the
        tok2vec and the span featurizer, inside the head; 0 for none.
    span_norm (bool): layer-normalise the span representation before its ReLU, as the Maxout
        layer of spancat's reducer does.
    boundary_smoothing (float): eps of boundary smoothing (Zhu and Li, 2022) in the local loss:
        a gold span's target keeps 1 - eps, the spans one boundary step away share eps; 0 for
        none.
    doc_vector (bool): add a projection of the document's mean token vector to every span, so
        that what the document is about can weigh on the label.
    word_pool (bool): add to each token a projection of the mean vector of the tokens of its
        document with the same lower-case form, so that the mentions of a name share evidence.
    mixed_precision (bool): run the head under CUDA autocast.
    grad_scaler (Optional[dict]): arguments for Thinc's PyTorchGradScaler (mixed precision).
    """
    kwargs = dict(
        max_width=max_width,
        hidden_width=hidden_width,
        span_repr=span_repr,
        transitions=transitions,
        null_weight=null_weight,
        dropout=dropout,
        hidden_depth=hidden_depth,
        context_depth=context_depth,
        span_norm=span_norm,
        boundary_smoothing=boundary_smoothing,
        doc_vector=doc_vector,
        word_pool=word_pool,
    )
    return build_structured_model(
        "FilteredSemiCRF", tok2vec, kwargs, max_width=max_width, span_head=True,
        mixed_precision=mixed_precision, grad_scaler=grad_scaler,
    )


def with_defaults(fn: Callable[..., Model], **defaults: Any) -> Callable[..., Model]:
    """``fn`` with other defaults for some of its keyword arguments, in its signature too (the
    config system fills and validates from the signature)."""
    sig = inspect.signature(fn)
    new_sig = sig.replace(parameters=[
        p.replace(default=defaults[p.name]) if p.name in defaults else p
        for p in sig.parameters.values()
    ])

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Model:
        bound = new_sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return fn(*bound.args, **bound.kwargs)

    wrapper.__signature__ = new_sig  # type: ignore[attr-defined]
    return wrapper


# v2 is v1 with doc_vector on by default. A new version, not a new default for v1: spaCy fills a
# saved pipeline's config from its factory's defaults only when the architecture names match,
# so pipelines saved with v1 (whose configs predate doc_vector) keep loading as they were trained.
build_filtered_semicrf_v2 = registry.architectures(FILTERED_SEMICRF_V2)(
    with_defaults(build_filtered_semicrf, doc_vector=True)
)
build_filtered_semicrf_v2.__doc__ = (
    "Filtered Semi-Markov CRF, as ``FilteredSemiCRF.v1`` with ``doc_vector = True`` by default."
)

# v3 (the default in stops 19-21) also pools the mentions of a word (word_pool), for the same
# reason v2 is a new version: pipelines saved with v2 keep loading without it.
build_filtered_semicrf_v3 = registry.architectures(FILTERED_SEMICRF_V3)(
    with_defaults(build_filtered_semicrf, doc_vector=True, word_pool=True)
)
build_filtered_semicrf_v3.__doc__ = (
    "Filtered Semi-Markov CRF, as ``FilteredSemiCRF.v1`` with ``doc_vector = True`` and "
    "``word_pool = True`` by default."
)


# v4 (the default since stop 22) also smooths the local targets over the boundaries
# (boundary_smoothing = 0.2, benchmarks/sweeps/boundary_smoothing_s22.json). A training-only
# setting, but a new version all the same: a config that names v3 keeps training as it did.
build_filtered_semicrf_v4 = registry.architectures(FILTERED_SEMICRF_V4)(
    with_defaults(build_filtered_semicrf, doc_vector=True, word_pool=True, boundary_smoothing=0.2)
)
build_filtered_semicrf_v4.__doc__ = (
    "Filtered Semi-Markov CRF, as ``FilteredSemiCRF.v1`` with ``doc_vector = True``, "
    "``word_pool = True`` and ``boundary_smoothing = 0.2`` by default."
)


@registry.architectures(SEMICRF)
def build_semicrf(
    tok2vec: Model[List[Doc], List[Floats2d]],
    max_width: int = 10,
    hidden_width: int = 128,
    span_repr: str = "sum_endpoints_neighbors",
    transitions: bool = True,
    dropout: float = 0.1,
    hidden_depth: int = 1,
    context_depth: int = 0,
    span_norm: bool = False,
    doc_vector: bool = False,
    word_pool: bool = False,
    mixed_precision: bool = False,
    grad_scaler: Optional[Dict[str, Any]] = None,
) -> Model:
    """Exact Semi-Markov CRF baseline (every segmentation into segments of width 1..K); the
    span scorer takes the settings of ``FilteredSemiCRF.v1`` (``doc_vector`` and ``word_pool``
    are off by default here too; ``configs/semicrf_cnn.cfg`` turns them on, as
    ``FilteredSemiCRF.v3`` and v4 do)."""
    kwargs = dict(
        max_width=max_width,
        hidden_width=hidden_width,
        span_repr=span_repr,
        transitions=transitions,
        dropout=dropout,
        hidden_depth=hidden_depth,
        context_depth=context_depth,
        span_norm=span_norm,
        doc_vector=doc_vector,
        word_pool=word_pool,
    )
    return build_structured_model(
        "SemiCRF", tok2vec, kwargs, max_width=max_width, span_head=True,
        mixed_precision=mixed_precision, grad_scaler=grad_scaler,
    )


@registry.architectures(LINEAR_CRF)
def build_linear_crf(
    tok2vec: Model[List[Doc], List[Floats2d]],
    max_width: int = 10,
    hidden_width: int = 128,
    scheme: str = "BIO",
    dropout: float = 0.1,
    context_depth: int = 0,
    word_pool: bool = False,
    mixed_precision: bool = False,
    grad_scaler: Optional[Dict[str, Any]] = None,
) -> Model:
    """Linear-chain CRF baseline over BIO or BILUO token tags (emissions from a hidden layer
    of ``hidden_width``, over a BiLSTM of ``context_depth`` layers if that is above 0, and with
    ``word_pool`` the same-word pooling of the span heads). Trains on entities of any width;
    ``max_width`` is only passed on to the head."""
    kwargs = dict(max_width=max_width, hidden_width=hidden_width, scheme=scheme, dropout=dropout,
                  context_depth=context_depth, word_pool=word_pool)
    return build_structured_model(
        "LinearCRF", tok2vec, kwargs, max_width=max_width, span_head=False,
        mixed_precision=mixed_precision, grad_scaler=grad_scaler,
    )


def build_structured_model(
    arch: str,
    tok2vec: Model[List[Doc], List[Floats2d]],
    head_kwargs: Dict[str, Any],
    *,
    max_width: int,
    span_head: bool,
    mixed_precision: bool = False,
    grad_scaler: Optional[Dict[str, Any]] = None,
) -> Model:
    """Chain ``tok2vec`` and the PyTorch head of ``arch`` (built later, at initialize)."""
    if int(max_width) < 1:
        raise ValueError(f"max_width must be at least 1, got {max_width}")
    _check_head_kwargs(arch, head_kwargs)
    head = make_head_model(
        arch, head_kwargs, mixed_precision=mixed_precision, grad_scaler=grad_scaler
    )
    return Model(
        f"fsemicrf_{arch}",
        forward,
        init=init,
        layers=[tok2vec, head],
        refs={"tok2vec": tok2vec, "head": head},
        dims={"nO": None},
        attrs={"arch": arch, "max_width": int(max_width), "span_head": bool(span_head),
               "word_pool": bool(head_kwargs.get("word_pool", False))},
    )


def _check_head_kwargs(arch: str, kwargs: Dict[str, Any]) -> None:
    """Fail at config time, not at initialize: build a tiny head with these settings."""
    try:
        get_head_class(arch)(4, 1, **kwargs)
    except (TypeError, ValueError, KeyError, AssertionError) as err:
        raise ValueError(f"Invalid settings for the {arch} head {kwargs}: {err}") from err


def _unpack(X) -> Tuple[List[Doc], Any, Any]:
    if isinstance(X, tuple):
        if len(X) == 2:
            return list(X[0]), X[1], None
        if len(X) == 3:
            return list(X[0]), X[1], X[2]
    if isinstance(X, list) and (not X or isinstance(X[0], Doc)):
        return X, None, None
    raise ValueError("Expected (docs, gold) or (docs, gold, mask) as input")


def forward(model: Model, X, is_train: bool):
    docs, gold, mask = _unpack(X)
    tok2vec = model.get_ref("tok2vec")
    head = model.get_ref("head")
    if not any(len(doc) for doc in docs):
        # No tokens at all: nothing to predict or learn (and Thinc layers dislike empty batches).
        if gold is None:
            empty = (numpy.zeros((0, 4), dtype="int64"), numpy.zeros((0,), dtype="float32"))
            return empty, lambda dY: []
        return 0.0, lambda dY: []
    Xs, backprop_tok2vec = tok2vec(docs, is_train)
    words = word_ids(docs) if model.attrs.get("word_pool") else None
    Y, backprop_head = head((Xs, gold, mask, words), is_train)

    def backprop(dY):
        return backprop_tok2vec(backprop_head(dY))

    return Y, backprop


def word_ids(docs: List[Doc]) -> List[numpy.ndarray]:
    """The tokens' lower-case forms as small int ids (one int64 array per doc; equal ids are
    equal forms within the batch), for the heads' ``word_pool``."""
    hashes = [doc.to_array("LOWER").astype("uint64").reshape(-1) for doc in docs]
    if not hashes:
        return []
    _, ids = numpy.unique(numpy.concatenate(hashes), return_inverse=True)
    ids = ids.astype("int64").reshape(-1)
    return numpy.split(ids, numpy.cumsum([len(h) for h in hashes])[:-1])


def init(model: Model, X=None, Y=None) -> None:
    """Initialize ``tok2vec``, then build the head for ``nO`` labels over the tok2vec width."""
    tok2vec = model.get_ref("tok2vec")
    head = model.get_ref("head")
    docs = _unpack(X)[0] if X is not None else []
    if docs:
        tok2vec.initialize(X=docs)
    else:
        tok2vec.initialize()
    if not model.has_dim("nO"):
        raise ValueError(
            "The fsemicrf_ner model needs its number of labels (dimension nO) before "
            "initialize: add labels to the component first."
        )
    build_head(head, infer_width(tok2vec, docs), model.get_dim("nO"))


def infer_width(tok2vec: Model, docs: List[Doc]) -> int:
    """Width of the token vectors: the layer's ``nO`` if set, else measured on sample docs."""
    if tok2vec.has_dim("nO") is True:
        return int(tok2vec.get_dim("nO"))
    sample = [doc for doc in docs if len(doc)][:8]
    if sample:
        widths = [y.shape[1] for y in tok2vec.predict(sample) if y.shape[0]]
        if widths:
            return int(max(widths))
    raise ValueError(
        "Cannot tell the width of the token vectors: the tok2vec layer has no nO "
        "dimension and no non-empty example docs were given to initialize."
    )


def model_is_initialized(model: Model) -> bool:
    return is_initialized(model.get_ref("head"))
