"""Registered Thinc architectures: a ``tok2vec`` layer followed by a PyTorch structured head.

Each architecture builds ``Model[ModelInput, ...]``:

* with ``gold`` (rows ``(doc, start, end_inclusive, label)``, labels ``1..M``; 0 is "no entity")
  the output is the summed loss (a float); ``backprop(1.0)`` sends the gradient through the head
  into the ``tok2vec`` layer;
* without, the output is ``(spans, confidences)``: numpy arrays ``int64[N, 4]`` (same row format)
  and ``float32[N]``, no entity crossing a sentence boundary of its document
  (:func:`sentence_flags`); a plain list of docs, as spaCy's tools give a pipe's model, is such
  an input.

The number of labels is the model's ``nO`` dimension, set by the component before
``initialize``; the PyTorch head is built at ``initialize`` (see :mod:`.head_model`). The builders
take every setting from the config: the defaults live in the component's default config
(:mod:`.component`).
"""
from typing import Any, Dict, List, NamedTuple, Optional, Union

import numpy
from spacy.attrs import LOWER
from spacy.tokens import Doc
from spacy.util import registry
from thinc.api import Model
from thinc.types import Floats2d, Ints1d, Ints2d

from .doc_constraints import sentence_start_flags
from .head_model import (
    HeadInput, build_head, eval_mode, grow_head, is_initialized, make_head_model,
    padded_torch_inputs, torch_head,
)
from .structured.heads import HEADS
from .structured.nbest import Segmentation
from .structured.prediction import DecodeOptions
from .structured.spans import check_integer

FILTERED_SEMICRF = "spacy-fsemicrf.FilteredSemiCRF.v1"
SEMICRF = "spacy-fsemicrf.SemiCRF.v1"
LINEAR_CRF = "spacy-fsemicrf.LinearCRF.v1"


class ModelInput(NamedTuple):
    """What a ``spacy-fsemicrf.*`` model takes.

    docs: the documents.
    gold: ``None`` to predict, else rows ``(doc, start, end_inclusive, label 1..M)``.
    mask: optional, one bool per document; ``False`` leaves the document out of the loss.
    filter_margin: prediction-time margin of the filtered head (log-odds; 0 for the others).
    options: what a prediction returns besides the entities (None: only ``(spans, scores)``;
        else a :class:`~.head_model.BatchPrediction`).
    known: training only: one bool array per document, False at the tokens without entity
        annotation (None for a document where every token has it), or None for all.
    incorrect: training only: rows as ``gold`` of entities known to be wrong, or None.
    """

    docs: List[Doc]
    gold: Optional[Ints2d] = None
    mask: Optional[numpy.ndarray] = None
    filter_margin: float = 0.0
    options: Optional[DecodeOptions] = None
    known: Optional[List[Optional[numpy.ndarray]]] = None
    incorrect: Optional[numpy.ndarray] = None


@registry.architectures(FILTERED_SEMICRF)
def build_filtered_semicrf(
    tok2vec: Model[List[Doc], List[Floats2d]],
    max_width: int,
    hidden_width: int,
    span_repr: str,
    transitions: bool,
    null_weight: float,
    dropout: float,
    hidden_depth: int,
    context_depth: int,
    span_norm: bool,
    boundary_smoothing: float,
    doc_vector: bool,
    word_pool: bool,
    null_tokens: bool = False,
    train_margin: float = 0.0,
    mean_field: int = 0,
    exact_loss: float = 0.0,
    focal_gamma: float = 0.0,
    mixed_precision: bool = False,
    grad_scaler: Optional[Dict[str, Any]] = None,
) -> Model[ModelInput, Any]:
    """Filtered Semi-Markov CRF (Zaratiana et al., 2023) over the vectors of ``tok2vec``.

    tok2vec (Model[List[Doc], List[Floats2d]]): the token vectors (a tok2vec of its own, a
        listener or a transformer listener).
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
    context_depth (int): BiLSTM layers between the tok2vec and the span featurizer; 0 for none.
    span_norm (bool): layer-normalise the span representation before its ReLU.
    boundary_smoothing (float): eps of boundary smoothing (Zhu and Li, 2022) in the local loss;
        0 for none. Training only.
    doc_vector (bool): add a projection of the document's mean token vector to every span.
    word_pool (bool): add to each token a projection of the mean vector of the tokens of its
        document with the same lower-case form, so that the mentions of a name share evidence.
    null_tokens (bool): let a path leave kept nodes out (a scored null for every covered
        token), so that the path CRF can overrule the filter; needs transitions = false.
        False, the paper's graph, by default.
    train_margin (float): the filter's margin (log-odds) when it picks the training nodes; 0,
        the paper's, by default.
    mean_field (int): mean-field layers refining the kept nodes' global scores from the nodes
        that overlap or touch them, before the path CRF; 0, the paper's graph, by default.
    exact_loss (float): weight of an exact semi-CRF loss of the global scores over every
        segmentation, added in training; 0 by default.
    focal_gamma (float): gamma of a focal local loss, each span's cross-entropy times
        ``(1 - p)^gamma``; 0, the plain cross-entropy, by default.
    mixed_precision (bool): run the head under CUDA autocast (GPU only); False by default.
    grad_scaler (Optional[dict]): keyword arguments for Thinc's PyTorchGradScaler (mixed
        precision); None by default.
    The settings with a default may be left out of a config, which then gets the default.
    """
    kwargs = dict(
        max_width=max_width, hidden_width=hidden_width, span_repr=span_repr,
        transitions=transitions, null_weight=null_weight, dropout=dropout,
        hidden_depth=hidden_depth, context_depth=context_depth, span_norm=span_norm,
        boundary_smoothing=boundary_smoothing, doc_vector=doc_vector, word_pool=word_pool,
        null_tokens=null_tokens, train_margin=train_margin, mean_field=mean_field,
        exact_loss=exact_loss, focal_gamma=focal_gamma,
    )
    return build_structured_model("FilteredSemiCRF", tok2vec, kwargs, span_head=True,
                                  mixed_precision=mixed_precision, grad_scaler=grad_scaler)


@registry.architectures(SEMICRF)
def build_semicrf(
    tok2vec: Model[List[Doc], List[Floats2d]],
    max_width: int,
    hidden_width: int,
    span_repr: str,
    transitions: bool,
    dropout: float,
    hidden_depth: int,
    context_depth: int,
    span_norm: bool,
    doc_vector: bool,
    word_pool: bool,
    mixed_precision: bool = False,
    grad_scaler: Optional[Dict[str, Any]] = None,
) -> Model[ModelInput, Any]:
    """Exact Semi-Markov CRF (every segmentation into segments of width 1..K) with the span
    scorer of ``FilteredSemiCRF.v1``: each of its settings means what the setting of that name
    means there (``max_width`` bounds the entity segments, ``transitions`` adds
    label-transition scores between consecutive segments)."""
    kwargs = dict(
        max_width=max_width, hidden_width=hidden_width, span_repr=span_repr,
        transitions=transitions, dropout=dropout, hidden_depth=hidden_depth,
        context_depth=context_depth, span_norm=span_norm, doc_vector=doc_vector,
        word_pool=word_pool,
    )
    return build_structured_model("SemiCRF", tok2vec, kwargs, span_head=True,
                                  mixed_precision=mixed_precision, grad_scaler=grad_scaler)


@registry.architectures(LINEAR_CRF)
def build_linear_crf(
    tok2vec: Model[List[Doc], List[Floats2d]],
    max_width: int,
    hidden_width: int,
    scheme: str,
    dropout: float,
    context_depth: int,
    word_pool: bool,
    mixed_precision: bool = False,
    grad_scaler: Optional[Dict[str, Any]] = None,
) -> Model[ModelInput, Any]:
    """Linear-chain CRF over BIO or BILUO token tags (``scheme``: "BIO" or "BILUO"), with
    label-transition scores always: emissions from a hidden layer of ``hidden_width``, over a
    BiLSTM of ``context_depth`` layers if above 0, and with ``word_pool`` the same-word pooling
    of the span heads; ``dropout``, ``mixed_precision`` and ``grad_scaler`` as in
    ``FilteredSemiCRF.v1``. Trains on and predicts entities of any width; ``max_width`` bounds
    only the spans its ``candidates_key`` group finds by marginal (the decoded entities are in
    it at any width)."""
    kwargs = dict(max_width=max_width, hidden_width=hidden_width, scheme=scheme, dropout=dropout,
                  context_depth=context_depth, word_pool=word_pool)
    return build_structured_model("LinearCRF", tok2vec, kwargs, span_head=False,
                                  mixed_precision=mixed_precision, grad_scaler=grad_scaler)


def build_structured_model(
    arch: str,
    tok2vec: Model[List[Doc], List[Floats2d]],
    head_kwargs: Dict[str, Any],
    *,
    span_head: bool,
    mixed_precision: bool,
    grad_scaler: Optional[Dict[str, Any]],
) -> Model[ModelInput, Any]:
    """Chain ``tok2vec`` and the PyTorch head of ``arch`` (built later, at initialize)."""
    # a head of hidden width 0 built (torch allows empty layers): the span heads failed at
    # their first update, the linear CRF trained emissions that read no token vector; and
    # int() took a max_width of 2.5 for 2, which the linear CRF then kept
    for name in ("max_width", "hidden_width"):
        check_integer(name, head_kwargs[name], 1)
    max_width = int(head_kwargs["max_width"])
    _check_head_kwargs(arch, head_kwargs)
    head = make_head_model(arch, head_kwargs, mixed_precision=mixed_precision,
                           grad_scaler=grad_scaler)
    return Model(
        f"fsemicrf_{arch}",
        forward,
        init=init,
        layers=[tok2vec, head],
        refs={"tok2vec": tok2vec, "head": head},
        dims={"nO": None},
        attrs={"arch": arch, "max_width": max_width, "span_head": span_head,
               "word_pool": bool(head_kwargs.get("word_pool", False))},
    )


def _check_head_kwargs(arch: str, kwargs: Dict[str, Any]) -> None:
    """Fail at config time, not at initialize: build a tiny head with these settings."""
    try:
        HEADS[arch](4, 1, **kwargs)
    except (TypeError, ValueError, KeyError, AssertionError) as err:
        raise ValueError(f"Invalid settings for the {arch} head {kwargs}: {err}") from err


def forward(model: Model[ModelInput, Any], X: Union[ModelInput, List[Doc]], is_train: bool):
    X = as_model_input(X)
    docs = list(X.docs)
    if not any(len(doc) for doc in docs):
        # No tokens at all: nothing to predict or learn (and Thinc layers dislike empty batches).
        if X.gold is None:
            empty = (numpy.zeros((0, 4), dtype="int64"), numpy.zeros((0,), dtype="float32"))
            return empty, lambda dY: []
        return 0.0, lambda dY: []
    Xs, backprop_tok2vec = model.get_ref("tok2vec")(docs, is_train)
    words = word_ids(docs) if model.attrs["word_pool"] else None
    # prediction only: training learns the gold entities as they are
    starts = sentence_flags(docs) if X.gold is None else None
    train = X.gold is not None
    head_input = HeadInput(Xs, X.gold, X.mask, words, X.filter_margin, X.options, starts,
                           X.known if train else None, X.incorrect if train else None)
    Y, backprop_head = model.get_ref("head")(head_input, is_train)

    def backprop(dY):
        return backprop_tok2vec(backprop_head(dY))

    return Y, backprop


def as_model_input(X: Any) -> ModelInput:
    """``X`` as a :class:`ModelInput`: a plain list of docs, what spaCy's tools (``spacy debug
    model``) give every pipe's model, is a prediction without gold."""
    if isinstance(X, ModelInput):
        return X
    if isinstance(X, list) and all(isinstance(doc, Doc) for doc in X):
        return ModelInput(X)
    raise TypeError(
        f"The fsemicrf_ner model takes a ModelInput or a list of Docs, got {type(X).__name__}")


def word_ids(docs: List[Doc]) -> List[Ints1d]:
    """The tokens' lower-case forms as int64 ids (one array per doc: the 64-bit hashes of the
    forms, read as signed integers, so equal ids are equal forms), for the heads'
    ``word_pool``, which groups them per document itself."""
    return [doc.to_array(LOWER).reshape(-1).view("int64") for doc in docs]


def sentence_flags(docs: List[Doc]) -> Optional[List[Optional[numpy.ndarray]]]:
    """Each document's sentence starts (:func:`~.doc_constraints.sentence_start_flags`), for
    the heads' ``sentence_starts``; None when no document has sentence boundaries, so that a
    batch without them costs nothing more."""
    flags = [sentence_start_flags(doc) for doc in docs]
    # a start at the first token bounds nothing: a document of one sentence (or of 0 or 1
    # token, which spaCy says have sentence boundaries) has none
    return None if all(f is None or not f[1:].any() for f in flags) else flags


def init(model: Model, X: Union[ModelInput, List[Doc], None] = None, Y: Any = None) -> None:
    """Initialize ``tok2vec``, then build the head for ``nO`` labels over the tok2vec width."""
    tok2vec = model.get_ref("tok2vec")
    docs = list(as_model_input(X).docs) if X is not None else []
    if docs:
        tok2vec.initialize(X=docs)
    else:
        tok2vec.initialize()
    if not model.has_dim("nO"):
        raise ValueError(
            "The fsemicrf_ner model needs its number of labels (dimension nO) before "
            "initialize: add labels to the component first."
        )
    build_head(model.get_ref("head"), infer_width(tok2vec, docs), model.get_dim("nO"))


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


def model_add_labels(model: Model, n: int) -> None:
    """Grow the built head of a ``spacy-fsemicrf.*`` model by ``n`` entity labels, numbered
    after the existing ones (:func:`~.head_model.grow_head`)."""
    head_model = model.get_ref("head")
    grow_head(head_model, n)
    model.set_dim("nO", head_model.get_dim("nO"), force=True)


def model_torch_head(model: Model):
    """The PyTorch head module of a ``spacy-fsemicrf.*`` model."""
    return torch_head(model.get_ref("head"))


def model_nbest(
    model: Model, docs: List[Doc], k: int, filter_margin: float = 0.0
) -> List[List[Segmentation]]:
    """The ``k`` best segmentations of each of ``docs`` (run through the pipeline's components
    before this one, so that a tok2vec listener finds their vectors), best first: none with an
    entity across a sentence boundary, and fewer where fewer have a probability above 0."""
    docs = list(docs)
    if not any(len(doc) for doc in docs):
        return [[Segmentation((), 0.0, 0.0)] for _ in docs]
    Xs = model.get_ref("tok2vec").predict(docs)
    words = word_ids(docs) if model.attrs["word_pool"] else None
    head_model = model.get_ref("head")
    inputs = HeadInput(Xs, words=words, sentence_starts=sentence_flags(docs))
    X, lengths, kwargs = padded_torch_inputs(head_model, inputs)
    if filter_margin:
        kwargs["filter_margin"] = float(filter_margin)
    head = torch_head(head_model)
    eval_mode(head)
    return head.nbest(X, lengths, k, **kwargs)
