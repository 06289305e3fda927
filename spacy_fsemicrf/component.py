"""The ``fsemicrf_ner`` pipeline component.

Training reads the gold entities from ``example.reference.ents`` (so gold entities never
overlap), tokens without entity annotation as unknown, and with ``incorrect_spans_key`` the
spans of ``example.reference.spans[incorrect_spans_key]`` as entities known to be wrong, as
spaCy's ``ner`` does. Prediction writes every decoded entity whose score reaches ``threshold`` to
``doc.spans[spans_key]``, with their scores (probabilities that the entities are correct,
calibrated when the pipeline has a calibration map: :mod:`.calibration`) in
``.attrs["scores"]`` and the probability of the document's decoded segmentation in
``.attrs["path_probability"]``; with ``candidates_key``, the candidates the head considered, with
their scores, go to ``doc.spans[candidates_key]``. It sets ``doc.ents`` the way spaCy's ``ner``
does: entities already on the doc (for example from an ``entity_ruler`` earlier in the pipeline)
and tokens blocked with ``Doc.set_ents(blocked=...)`` are kept, predicted entities that overlap
them are left out of ``doc.ents``, and every other token without entity information is set to
"outside" (O). No predicted entity crosses a sentence boundary of the document (those
``doc.sents`` gives, where it has any), as with ``ner``.
"""
import logging
import math
import multiprocessing.context
import numbers
from pathlib import Path
from typing import (
    AbstractSet, Any, Callable, Dict, Iterable, Iterator, List, NamedTuple, Optional, Set, Tuple)

import numpy
import srsly
import torch
from spacy.language import Language
from spacy.pipeline import TrainablePipe
from spacy.tokens import Doc, Span, SpanGroup
from spacy.training import Example, validate_examples, validate_get_examples
from spacy.util import SimpleFrozenList, minibatch
from spacy.vocab import Vocab
from thinc.api import Config, Model, Optimizer, set_dropout_rate

from . import architectures  # noqa: F401  (registers the architectures)
from . import fork_safety
from .architectures import (
    ModelInput, model_add_labels, model_is_initialized, model_nbest, model_torch_head,
)
from .augment import AUGMENTED, ORIGINAL_ENTITIES
from .calibration import apply_calibration, check_calibration, entity_key, needs_novelty, seen_flags
from .doc_constraints import (
    check_constraints, constraints_of_docs, doc_own_constraints, explain_unmet_forces,
    sentence_scope_unsegmented, true_runs)
from .scorer import ner_score
from .structured.constrained import ConstraintReport, empty_document_report
from .structured.constraints import (
    Constraint, DocConstraints, ForceSpan, constraints_to_dicts, satisfies, trim_span)
from .head_model import BatchPrediction
from .msgpack_lookups import remember_msgpack_lookups
from .gold import ExampleEntities, example_entities, incorrect_entities, unlearned_reason
from .partial import known_tokens
from .structured.heads import HEADS
from .structured.nbest import Segmentation
from .structured.prediction import DecodeOptions
from .structured.spans import is_real

logger = logging.getLogger("spacy_fsemicrf")

DEFAULT_SPANS_KEY = "fsemicrf"
MAX_NBEST = 1024
"""The most segmentations :meth:`FSemiCRFEntityRecognizer.nbest` searches: its memory grows
with ``k`` times the document's positions, widths and labels."""
SEEN_ENTITIES = "seen_entities"  # serialization key of FSemiCRFEntityRecognizer.seen_entities
# the warnings about gold entities off the predicted tokens, at initialize and in training
_OFF_TOKENS = ("do not start or end on a token edge of the documents the pipeline predicts on "
               "(the pipeline's tokenizer splits the text otherwise than the corpus)")
_RETOKENIZE = ("Train on the corpus's tokens ([corpora.train] gold_preproc = true) or adjust the "
               "tokenizer.")

# The pipeline's defaults, in one place: the model block of each head on spaCy's small CNN
# tok2vec. The factory uses the filtered head's; the others are for
# ``nlp.add_pipe("fsemicrf_ner", config={"model": DEFAULT_MODELS["SemiCRF"]})``.
_TOK2VEC = """
[model.tok2vec]
@architectures = "spacy.HashEmbedCNN.v2"
pretrained_vectors = null
width = 96
depth = 4
embed_size = 2000
window_size = 1
maxout_pieces = 3
subword_features = true
"""
_SPAN_SCORER = """
max_width = 10
hidden_width = 128
span_repr = "sum_endpoints_neighbors"
dropout = 0.1
hidden_depth = 1
context_depth = 0
span_norm = false
doc_vector = true
word_pool = true
mixed_precision = false
grad_scaler = null
"""
_MODEL_CONFIGS = {
    "FilteredSemiCRF": """
[model]
@architectures = "spacy-fsemicrf.FilteredSemiCRF.v1"
transitions = false
null_weight = 0.75
boundary_smoothing = 0.0
null_tokens = false
train_margin = 0.0
mean_field = 0
exact_loss = 0.0
focal_gamma = 0.0
""" + _SPAN_SCORER + _TOK2VEC,
    "SemiCRF": """
[model]
@architectures = "spacy-fsemicrf.SemiCRF.v1"
transitions = true
""" + _SPAN_SCORER + _TOK2VEC,
    "LinearCRF": """
[model]
@architectures = "spacy-fsemicrf.LinearCRF.v1"
max_width = 10
hidden_width = 128
scheme = "BIO"
dropout = 0.1
context_depth = 0
word_pool = true
mixed_precision = false
grad_scaler = null
""" + _TOK2VEC,
}
DEFAULT_MODELS: Dict[str, Config] = {
    arch: Config().from_str(text)["model"] for arch, text in _MODEL_CONFIGS.items()
}
"""The default model block of each head, by architecture name."""
DEFAULT_MODEL = DEFAULT_MODELS["FilteredSemiCRF"]
DEFAULT_FILTER_MARGIN = 0.0
"""The filtered head's ``filter_margin`` when the config leaves it ``null``: the paper's filter,
chosen with ``boundary_smoothing = 0`` on the mean dev F1 over three corpora
(docs/results.md, "Boundary smoothing on three corpora")."""


class TrainingGold(NamedTuple):
    """What a training batch's examples give the model besides their docs."""

    rows: numpy.ndarray  # gold entities (doc, start, end inclusive, label 1..M)
    mask: numpy.ndarray  # one bool per example: has entity annotation (else not read)
    known: Optional[List[Optional[numpy.ndarray]]]  # partial.known_tokens of each doc
    incorrect: Optional[numpy.ndarray]  # entities known to be wrong, rows as ``rows``

    def model_input(self, docs: List[Doc]) -> ModelInput:
        return ModelInput(docs, self.rows, self.mask, known=self.known, incorrect=self.incorrect)


@Language.factory(
    "fsemicrf_ner",
    assigns=["doc.ents", "token.ent_iob", "token.ent_type", "doc.spans"],
    default_config={
        "model": DEFAULT_MODEL,
        "spans_key": DEFAULT_SPANS_KEY,
        "filter_margin": None,
        "threshold": 0.0,
        "candidates_key": None,
        "constraints": [],
        "incorrect_spans_key": None,
        "scorer": {"@scorers": "spacy-fsemicrf.ner_scorer.v1"},
    },
    default_score_weights={
        "ents_f": 1.0,
        "ents_p": 0.0,
        "ents_r": 0.0,
        "ents_per_type": None,
    },
)
def make_fsemicrf_ner(
    nlp: Language,
    name: str,
    model: Model,
    spans_key: str,
    filter_margin: Optional[float],
    threshold: float,
    candidates_key: Optional[str],
    constraints: List[Dict[str, Any]],
    incorrect_spans_key: Optional[str],
    scorer: Optional[Callable],
) -> "FSemiCRFEntityRecognizer":
    """Create an ``fsemicrf_ner`` component.

    model (Model): one of the ``spacy-fsemicrf.*`` architectures (filtered semi-CRF, exact
        semi-CRF or linear-chain CRF over a tok2vec layer).
    spans_key (str): ``doc.spans`` key for the predicted entities with their confidences.
    filter_margin (Optional[float]): prediction-time threshold of the filtered head, in
        log-odds: keep the spans whose best entity label scores above null minus this margin.
        0 is the paper's filter; below 0 keeps fewer entities (precision), above 0 more, for
        recall at small margins (past about 1 or 2 on the corpora measured, overlapping kept
        spans push right ones off the best path and recall falls too).
        None (the default) is ``DEFAULT_FILTER_MARGIN`` for the filtered head and 0 for the
        others, which do not filter and accept no other value.
    threshold (float): predicted entities scoring below it are left out of doc.ents and
        doc.spans[spans_key]; 0 keeps every decoded entity. The scores are calibrated when
        the pipeline carries a calibration map (spacy_fsemicrf.calibration), raw otherwise.
        A document whose constraints hold keeps all its entities if they would not hold on
        those above the threshold (a forced span, a count that needs a low-scoring entity).
    candidates_key (Optional[str]): ``doc.spans`` key for the candidates the head considered
        (the filtered head's kept nodes; the other heads' spans of marginal above 0.01, and the
        decoded entities), with their scores; None (the default) leaves them out.
    constraints (List[dict]): rules every prediction obeys, decoded exactly (for example
        ``{"kind": "at_most", "label": "ORG", "n": 1, "scope": "sentence"}``; kinds: at_most,
        exactly, at_least, excludes, requires, forbid_labels, force_span). The outcome per
        document is in ``doc.spans[spans_key].attrs["constraints"]``.
    incorrect_spans_key (Optional[str]): as for spaCy's ``ner``: the spans of a training
        example's ``reference.spans[incorrect_spans_key]`` are entities known to be wrong
        (a rejected suggestion of binary annotation): training learns no path that holds one,
        and a document with such spans is trained on even without entity annotation (its
        tokens unknown). Span heads only; None (the default) reads none.
    scorer (Optional[Callable]): defaults to ``spacy-fsemicrf.ner_scorer.v1`` (ents_p/r/f).
    """
    return FSemiCRFEntityRecognizer(
        nlp.vocab, model, name, spans_key=spans_key, filter_margin=filter_margin,
        threshold=threshold, candidates_key=candidates_key, constraints=constraints,
        incorrect_spans_key=incorrect_spans_key, scorer=scorer,
    )


class FSemiCRFEntityRecognizer(TrainablePipe):
    """Named entity recognizer with a structured (semi-)CRF head.

    ``model`` is built by one of the ``spacy-fsemicrf.*`` architectures (a ``ValueError``
    otherwise); the keyword arguments are the factory's settings, with the same defaults
    (:func:`make_fsemicrf_ner` describes them)."""

    def __init__(
        self,
        vocab: Vocab,
        model: Model,
        name: str = "fsemicrf_ner",
        *,
        spans_key: str = DEFAULT_SPANS_KEY,
        filter_margin: Optional[float] = None,
        threshold: float = 0.0,
        candidates_key: Optional[str] = None,
        constraints: Optional[List[Dict[str, Any]]] = None,
        incorrect_spans_key: Optional[str] = None,
        scorer: Optional[Callable] = ner_score,
    ) -> None:
        if model.attrs.get("arch") not in HEADS:  # say, a `ner` model block left in a config
            raise ValueError(
                f"[{name}] the model must be built by one of the spacy-fsemicrf architectures "
                f"({', '.join(f'spacy-fsemicrf.{arch}.v1' for arch in HEADS)}), got the model "
                f"{model.name!r}; spacy_fsemicrf.DEFAULT_MODELS holds a default block of each"
            )
        self.vocab = vocab
        self.model = model
        self.name = name
        self.scorer = scorer
        self.cfg: Dict[str, Any] = {"labels": []}
        # Prediction-time settings are attributes, not cfg entries: cfg is saved with the
        # weights and would override on loading the values given in the config
        # (spacy.load(..., config=...)), which the factory passes here.
        if not isinstance(spans_key, str) or not spans_key:
            raise ValueError(f"spans_key must be a non-empty string, got {spans_key!r}")
        self._spans_key = spans_key
        self.filter_margin = filter_margin
        self.threshold = threshold
        self.candidates_key = candidates_key
        self.constraints = constraints or []
        self.incorrect_spans_key = incorrect_spans_key
        self._warned_uncalibrated = False  # (initialize and loading set it)
        self._warned_unsegmented = False  # (a sentence scope on a doc without sentences)
        _prepare_process()
        self.n_wide_dropped = 0
        """How often a gold entity wider than ``max_width`` was left out of training so far
        (span heads; once per update that reads it)."""
        self.n_misaligned_dropped = 0
        """How often a gold entity was left out of training so far (once per update that reads
        it) because its edges are not token edges of the document the pipeline predicts on."""
        self.seen_entities = numpy.zeros((0,), dtype="uint64")
        """Sorted hashes (:func:`.calibration.entity_key`) of the texts of the gold entities
        given to :meth:`initialize` and :meth:`update` (an augmenter's made-up names left
        out): a ``by_novelty`` calibration map scores the entities whose text is among them
        apart from the others."""
        self.widest_dropped = 0
        self._unlearned_labels: Set[str] = set()
        """The labels that no gold entity the head can learn from (on token edges of the
        predicted document and, for a span head, at most ``max_width`` wide) has been trained
        on yet (those of the initialization examples, and those added to a trained component):
        one whose gold entities are all left out is never predicted."""
        self._warned_unlearned_labels: Set[str] = set()  # (warned once per label)

    def __reduce__(self) -> Tuple[Any, ...]:
        """Pickle as spaCy's pipes do; pickled to start a process (``nlp.pipe(n_process=N)``
        under the ``spawn`` or ``forkserver`` start method), the process runs PyTorch on one
        thread as a forked worker does (:func:`.fork_safety.unpickled_in_child`)."""
        reduced = super().__reduce__()
        if multiprocessing.context.get_spawning_popen() is None:
            return reduced
        return (fork_safety.unpickled_in_child, tuple(reduced[:2])) + tuple(reduced[2:])

    # Labels -----------------------------------------------------------------------------------

    @property
    def labels(self) -> Tuple[str, ...]:
        return tuple(self.cfg["labels"])

    @property
    def label_data(self) -> List[str]:
        return list(self.labels)

    @property
    def spans_key(self) -> str:
        """The ``doc.spans`` key of the predicted entities (a prediction-time setting)."""
        return self._spans_key

    @property
    def torch_head(self) -> "torch.nn.Module":
        """The PyTorch head (a ``spacy_fsemicrf.structured.heads`` module), for diagnostics
        and research use; a placeholder module before the component is initialized."""
        return model_torch_head(self.model)

    @property
    def max_width(self) -> int:
        """Widest entity (in tokens) the model's head can represent."""
        return int(self.model.attrs["max_width"])

    @property
    def filter_margin(self) -> float:
        """The prediction-time margin of the filter (log-odds; see the factory)."""
        return self._filter_margin

    @filter_margin.setter
    def filter_margin(self, margin: Optional[float]) -> None:
        filters = self.model.attrs.get("arch") == "FilteredSemiCRF"
        if margin is None:  # the head's default
            margin = DEFAULT_FILTER_MARGIN if filters else 0.0
        if not is_real(margin) or not math.isfinite(margin):
            raise ValueError(f"filter_margin must be a finite number or None, got {margin!r}")
        if margin and not filters:
            raise ValueError(
                f"filter_margin={margin} needs the filtered semi-CRF head "
                f"(spacy-fsemicrf.FilteredSemiCRF.v1): the {self.model.attrs.get('arch')} head "
                f"does not filter spans. Leave it at 0 or None."
            )
        self._filter_margin = float(margin)

    @property
    def threshold(self) -> float:
        """Predicted entities scoring below this are left out (a prediction-time setting)."""
        return self._threshold

    @threshold.setter
    def threshold(self, value: float) -> None:
        if not is_real(value) or not 0 <= value <= 1:
            raise ValueError(f"threshold must be a number in [0, 1], got {value!r}")
        self._threshold = float(value)

    @property
    def candidates_key(self) -> Optional[str]:
        """The ``doc.spans`` key of the candidates, or None (a prediction-time setting)."""
        return self._candidates_key

    @candidates_key.setter
    def candidates_key(self, key: Optional[str]) -> None:
        if key is not None and (not isinstance(key, str) or not key or key == self.spans_key):
            raise ValueError(
                f"candidates_key must be None or a non-empty string other than spans_key "
                f"({self.spans_key!r}), got {key!r}"
            )
        self._candidates_key = key

    @property
    def incorrect_spans_key(self) -> Optional[str]:
        """The ``doc.spans`` key of the entities known to be wrong in the training data, or
        None (a training setting, as for spaCy's ``ner``)."""
        return self._incorrect_spans_key

    @incorrect_spans_key.setter
    def incorrect_spans_key(self, key: Optional[str]) -> None:
        if key is not None and (not isinstance(key, str) or not key):
            raise ValueError(f"incorrect_spans_key must be None or a non-empty string, got "
                             f"{key!r}")
        if key is not None and not self.span_head:
            raise ValueError(
                f"[{self.name}] incorrect_spans_key needs a span head (FilteredSemiCRF, "
                f"SemiCRF): the linear CRF cannot leave one entity's tags out of its paths")
        self._incorrect_spans_key = key

    @property
    def constraints(self) -> List[Dict[str, Any]]:
        """The constraints every prediction obeys, as dicts (a prediction-time setting)."""
        return constraints_to_dicts(self._constraints)

    @constraints.setter
    def constraints(self, items: Optional[Iterable[Any]]) -> None:
        self._constraints = self._decodable(check_constraints(items, self.labels))

    @property
    def _decodes_constraints(self) -> bool:
        """False for the filtered head with ``null_tokens = true``: it has no constrained or
        n-best decoding."""
        kwargs = self.model.get_ref("head").attrs.get("head_kwargs", {})
        return not kwargs.get("null_tokens", False)

    def _decodable(self, constraints: Tuple[Constraint, ...]) -> Tuple[Constraint, ...]:
        """``constraints``, or a ``ValueError`` if there are some and the head cannot obey them."""
        if constraints and not self._decodes_constraints:
            raise ValueError(
                f"[{self.name}] constraints need constrained decoding, which the filtered head "
                f"with null_tokens = true does not have: leave constraints empty or train with "
                f"null_tokens = false"
            )
        return constraints

    @property
    def calibration(self) -> Optional[Dict[str, Any]]:
        """The calibration map of the scores (saved with the pipeline in ``cfg``), or None:
        fit it with :func:`spacy_fsemicrf.calibration.calibrate_component`."""
        return self.cfg.get("calibration")

    @calibration.setter
    def calibration(self, calibration: Optional[Dict[str, Any]]) -> None:
        self.cfg["calibration"] = check_calibration(calibration)

    @property
    def span_head(self) -> bool:
        """True for the span-based heads, which cannot learn entities wider than max_width."""
        return bool(self.model.attrs.get("span_head", True))

    def add_label(self, label: str) -> int:
        """Add an entity label; 1 if it is new, 0 if the component has it. A trained component
        grows its head for it (as spaCy's ``ner``): the existing labels keep their scores, the
        new one is not predicted until training meets a gold entity of it, and then learned."""
        check_labels([label], self.name)
        if label in self.labels:
            return 0
        if model_is_initialized(self.model):
            # as spaCy's ner grows its output layer: the existing labels keep their scores,
            # the new one is learned by training further
            model_add_labels(self.model, 1)
            self._unlearned_labels.add(label)
            logger.info("%s: added the label %r to the trained component (it is learned by "
                        "training further)", self.name, label)
        self.cfg["labels"].append(label)
        self.vocab.strings.add(label)
        return 1

    # Initialization ---------------------------------------------------------------------------

    def initialize(
        self,
        get_examples: Callable[[], Iterable[Example]],
        *,
        nlp: Optional[Language] = None,
        labels: Optional[List[str]] = None,
    ) -> None:
        """Set the labels (``labels`` or every entity label in the examples, sorted), report
        gold entities wider than ``max_width`` or off the predicted tokens and the labels none
        of whose gold entities the head can learn from or with none in the examples, and build
        the model."""
        validate_get_examples(get_examples, "FSemiCRFEntityRecognizer.initialize")
        if labels is not None:
            labels = check_labels(labels, self.name)
        sample: List[Doc] = []
        found = set()
        n_ents = n_wide = n_misaligned = n_examples = n_annotated = 0
        seen = set()  # the texts of the gold entities
        limit = self.max_width if self.span_head else None
        learnable: Set[str] = set()  # the labels of a gold entity the head can learn from
        wide_labels: Dict[str, int] = {}  # the labels of the wider ones, and their widest
        misaligned_labels: Set[str] = set()  # those of the ones off the predicted tokens
        for eg in get_examples():
            n_examples += 1
            n_annotated += eg.reference.has_annotation("ENT_IOB")
            seen.update(_gold_names(eg))
            ents = eg.reference.ents
            for ent in ents:
                found.add(ent.label_)
                n_ents += 1
            # split as get_gold splits them: widths in the tokens of the predicted document,
            # which the tokenizer may split finer than the corpus (Chinese characters against a
            # corpus's words), or otherwise (an entity's edge inside a token)
            if ents:
                split = example_entities(eg, limit)
                learnable.update(ent.label_ for ent in split.kept)
                misaligned_labels.update(ent.label_ for ent in split.misaligned)
                n_misaligned += len(split.misaligned)
                n_wide += len(split.wide)
                for ent in split.wide:
                    wide_labels[ent.label_] = max(wide_labels.get(ent.label_, 0), len(ent))
            if len(sample) < 10:
                sample.append(eg.predicted)
        # Labels added before (add_label) come first, then `labels` or those of the examples.
        if labels is None:
            # the same rule as for labels given here or to add_label: a label of whitespace
            # only taken from the examples would be refused on initializing again from the
            # component's own label_data (spacy init labels)
            self._refuse_blank_labels(found, "initialization")
        extra = list(labels) if labels is not None else sorted(found)
        new_labels = list(dict.fromkeys(list(self.labels) + extra))
        # (Re-)initializing builds a fresh head, so the label set may change here.
        self.cfg["labels"] = []
        for label in new_labels:
            self.cfg["labels"].append(label)
            self.vocab.strings.add(label)
        if not self.labels and labels is not None:  # given, and empty: the examples' are unused
            raise ValueError(
                f"[{self.name}] no entity labels to learn: the labels given to initialize are an "
                f"empty list (the {n_examples} initialization examples have {n_ents} gold "
                f"entities, labels {sorted(found)}, which are taken only when no labels are "
                f"given). Give the labels in [initialize.components.{self.name}.labels], or "
                f"leave them out."
            )
        if not self.labels:  # (spaCy's own E143 asks for examples, which were given)
            raise ValueError(
                f"[{self.name}] no entity labels to learn: none were given and the {n_examples} "
                f"initialization examples ({n_annotated} with entity annotation) have no gold "
                f"entity in example.reference.ents (doc.spans is not read). Give the labels in "
                f"[initialize.components.{self.name}.labels] or with add_label."
            )
        if labels is not None:
            unknown = sorted(found - set(self.labels))
            if unknown:
                logger.warning(
                    "%s: the examples contain entity labels that are not in the labels given "
                    "to initialize: %s. Training on them adds them to the component.",
                    self.name,
                    unknown,
                )
        if n_wide and self.span_head:
            logger.warning(
                "%s: %d of %d gold entities in the initialization examples are wider than "
                "max_width=%d tokens and cannot be learned (they are left out of training). "
                "max_width=%d would keep them all.",
                self.name,
                n_wide,
                n_ents,
                self.max_width,
                max(wide_labels.values()),
            )
        if n_misaligned:  # (not counted in n_misaligned_dropped, which counts training's)
            logger.warning(
                "%s: %d of %d gold entities in the initialization examples %s and cannot be "
                "learned (they are left out of training; the loss reads their tokens as unknown, "
                "as spaCy's ner does). %s",
                self.name, n_misaligned, n_ents, _OFF_TOKENS, _RETOKENIZE,
            )
        self.n_wide_dropped = self.widest_dropped = self.n_misaligned_dropped = 0
        self._unlearned_labels = set(self.labels) - learnable
        self._warned_unlearned_labels = set()
        # the labels with no gold entity at all, named one by one where the examples have some
        missing = self._unlearned_labels - set(wide_labels) - misaligned_labels if n_ents else set()
        self._report_unlearned_labels(wide_labels, misaligned_labels, "the initialization examples",
                                      missing)
        if not n_ents:
            self._report_no_gold_entity(n_examples, n_annotated)
        self.calibration = None  # a new model: the scores need a new map
        # no warning while it is trained and evaluated: the map comes when it is saved
        # ([training.before_to_disk]) or from the calibrate command; loading arms it again
        self._warned_uncalibrated = True
        self._set_seen(seen)
        self.constraints = self.constraints  # now that the labels are known, check them
        self.model.set_dim("nO", len(self.labels), force=True)
        self.model.initialize(X=ModelInput(sample))

    def record_seen_entities(self, docs: Iterable[Doc]) -> None:
        """Remember the texts of the gold entities of ``docs`` (the training data) as
        :attr:`seen_entities`, replacing those recorded before."""
        self._set_seen(ent.text for doc in docs for ent in doc.ents)

    def _set_seen(self, texts: Iterable[str]) -> None:
        self.seen_entities = numpy.unique(_seen_keys(texts))

    def _add_seen(self, examples: List[Example]) -> None:
        """Add the gold names of ``examples`` to :attr:`seen_entities`: a sourced component
        trained further (never initialized again) learns names its first training lacked."""
        keys = _seen_keys(name for eg in examples for name in _gold_names(eg))
        known = self.seen_entities
        if known.size:
            at = numpy.minimum(numpy.searchsorted(known, keys), known.size - 1)
            keys = keys[known[at] != keys]
        if keys.size:
            self.seen_entities = numpy.union1d(known, keys)

    # Training ---------------------------------------------------------------------------------

    def update(
        self,
        examples: Iterable[Example],
        *,
        drop: float = 0.0,
        sgd: Optional[Optimizer] = None,
        losses: Optional[Dict[str, float]] = None,
    ) -> Dict[str, float]:
        """Learn from a batch of examples: the loss of the head on the gold entities of
        ``example.reference.ents``, backpropagated into the tok2vec layer. Their names join
        :attr:`seen_entities`. The calibration map is dropped: it was fitted on the weights
        this changes (the training callback fits a new one at each save)."""
        if losses is None:
            losses = {}
        losses.setdefault(self.name, 0.0)
        _prepare_process()  # (an unpickled component was never __init__-ed)
        examples = list(examples)
        validate_examples(examples, "FSemiCRFEntityRecognizer.update")
        if not examples:
            return losses
        docs = [eg.predicted for eg in examples]
        self._add_new_labels(examples)
        gold = self._gold(examples)
        self._add_seen(examples)
        if not any(len(doc) for doc, keep in zip(docs, gold.mask) if keep):
            return losses
        set_dropout_rate(self.model, drop)
        loss, backprop = self.model.begin_update(gold.model_input(docs))
        backprop(1.0)
        # a map of the old weights would misplace every score, and the threshold with them:
        # in spacy train each evaluation came after an update, with the last save's map.
        # No warning about it while training (a sourced component is never initialized)
        self.calibration = None
        self._warned_uncalibrated = True
        if sgd not in (None, False):  # False: no step, as spaCy's pipes take it
            self.finish_update(sgd)
        losses[self.name] += loss
        return losses

    def _add_new_labels(self, examples: List[Example]) -> None:
        """Add the labels of the examples' gold entities that the component lacks (as spaCy's
        ``ner`` does in training): a component sourced from a trained pipeline learns a new
        entity type from data that has it (:meth:`add_label`)."""
        found = {ent.label_ for eg in examples for ent in eg.reference.ents}
        self._refuse_blank_labels(found, "training")  # (add_label's would not say where from)
        for label in sorted(found - set(self.labels)):
            self.add_label(label)

    def _refuse_blank_labels(self, found: Set[str], examples: str) -> None:
        """A ``ValueError`` if a label ``found`` in the gold entities of the ``examples``
        ("training", "initialization") is whitespace only, as :meth:`add_label` refuses it."""
        blank = sorted(label for label in found if not label.strip())
        if blank:
            raise ValueError(
                f"[{self.name}] the {examples} examples have gold entities with the label "
                f"{blank[0]!r}: every label must be a non-empty string, not whitespace only. "
                f"Fix the labels in the training data."
            )

    def get_gold(self, examples: List[Example]) -> Tuple[numpy.ndarray, numpy.ndarray]:
        """Gold rows ``(doc, start, end_inclusive, label 1..M)`` aligned to the predicted docs,
        and a mask of the examples whose reference has entity annotation (the others are left
        out of the loss). Entities wider than ``max_width`` are dropped for span heads and
        counted in ``n_wide_dropped``, entities whose edges are not token edges of the
        predicted doc in ``n_misaligned_dropped`` (each with a warning); the loss reads their
        tokens as unknown, as it reads the tokens without entity annotation."""
        gold = self._gold(examples)
        return gold.rows, gold.mask

    def _gold(self, examples: List[Example]) -> TrainingGold:
        """:meth:`get_gold`, which tokens of each predicted doc have entity annotation
        (:func:`~.partial.known_tokens`; None for a doc, or for the batch, where all do), and
        the entities known to be wrong (:meth:`_incorrect_rows`)."""
        label_ids = {label: i + 1 for i, label in enumerate(self.labels)}
        limit = self.max_width if self.span_head else None
        rows: List[Tuple[int, int, int, int]] = []
        wrong: List[Tuple[int, int, int, int]] = []
        mask = numpy.zeros((len(examples),), dtype=bool)
        known: List[Optional[numpy.ndarray]] = [None] * len(examples)
        n_wide = n_misaligned = 0
        wide_labels: Dict[str, int] = {}  # the labels of the wide entities, and their widest
        misaligned_labels: Set[str] = set()  # those of the misaligned ones, of unlearned labels
        for i, eg in enumerate(examples):
            split = example_entities(eg, limit)
            negatives = self._incorrect_rows(eg, label_ids, limit)
            if split is None and not negatives:
                continue
            if split is None:  # spans known to be wrong are annotation too (as for ner)
                split = ExampleEntities([], [], [])
            mask[i] = True
            for ent in eg.reference.ents:
                if ent.label_ not in label_ids:
                    raise ValueError(
                        f"[{self.name}] The training data has an entity with the label "
                        f"{ent.label_!r}, which the component does not have (labels: "
                        f"{list(self.labels)}). Add it with add_label (update adds the labels "
                        f"of its examples), or include it in the initialization examples or "
                        f"in [initialize.components.{self.name}.labels]."
                    )
            kept = [(i, ent.start, ent.end - 1, label_ids[ent.label_]) for ent in split.kept]
            rows.extend(kept)
            if negatives:
                self._check_incorrect(eg, set(kept), negatives, i)
                wrong.extend((i, *row) for row in negatives)
            n_misaligned += len(split.misaligned)
            n_wide += len(split.wide)
            for ent in split.wide:
                wide_labels[ent.label_] = max(wide_labels.get(ent.label_, 0), len(ent))
            if self._unlearned_labels:  # (empty once every label has met a learnable entity)
                self._unlearned_labels.difference_update(ent.label_ for ent in split.kept)
                misaligned_labels.update(ent.label_ for ent in split.misaligned)
            known[i] = known_tokens(eg, split.misaligned, split.wide)
        if n_wide:
            self._report_wide(n_wide, max(wide_labels.values()))
        if n_misaligned:
            self._report_misaligned(n_misaligned)
        if self._unlearned_labels and (wide_labels or misaligned_labels):
            self._report_unlearned_labels(wide_labels, misaligned_labels, "training so far")
        return TrainingGold(
            numpy.asarray(rows, dtype="int64").reshape(-1, 4), mask,
            None if all(k is None for k in known) else known,
            numpy.asarray(wrong, dtype="int64").reshape(-1, 4) if wrong else None)

    def _incorrect_rows(
        self, eg: Example, label_ids: Dict[str, int], limit: Optional[int]
    ) -> List[Tuple[int, int, int]]:
        """The entities known to be wrong of ``eg`` (:func:`~.gold.incorrect_entities`) as
        rows ``(start, end inclusive, label 1..M)`` of the predicted doc."""
        spans = incorrect_entities(eg, self._incorrect_spans_key, label_ids, limit)
        return sorted({(span.start, span.end - 1, label_ids[span.label_]) for span in spans})

    def _check_incorrect(
        self, eg: Example, kept: Set[Tuple[int, int, int, int]],
        negatives: List[Tuple[int, int, int]], i: int,
    ) -> None:
        """A ``ValueError`` where an entity known to be wrong is a gold entity with its label
        (spaCy's ``ner`` refuses it too)."""
        for start, end, label in negatives:
            if (i, start, end, label) in kept:
                span = eg.predicted[start : end + 1]
                raise ValueError(
                    f"[{self.name}] The entity {span.text!r} ({self.labels[label - 1]}) is in "
                    f"a training example's doc.ents and in its "
                    f"doc.spans[{self._incorrect_spans_key!r}] of entities known to be wrong")

    def _report_wide(self, n_wide: int, widest: int) -> None:
        before = self.n_wide_dropped
        self.n_wide_dropped += n_wide
        self.widest_dropped = max(self.widest_dropped, widest)
        if _reached_a_power_of_ten(before, self.n_wide_dropped):
            logger.warning(
                "%s: gold entities wider than max_width=%d tokens have been left out of "
                "training %d times so far (each update that reads one counts it; the loss "
                "reads their tokens as unknown); max_width=%d would keep them all.",
                self.name,
                self.max_width,
                self.n_wide_dropped,
                self.widest_dropped,
            )

    def _report_unlearned_labels(
        self, wide_labels: Dict[str, int], misaligned_labels: Set[str], where: str,
        missing: AbstractSet[str] = frozenset(),
    ) -> None:
        """Warn, once per label, that a label not learned yet (:attr:`_unlearned_labels`) whose
        gold entities in ``where`` were left out, as wider than ``max_width`` (``wide_labels``:
        label: its widest) or off the predicted tokens (``misaligned_labels``), or that has none
        there (``missing``), is never predicted until training reads one the head can learn
        from."""
        met = (set(wide_labels) | misaligned_labels) & self._unlearned_labels
        for label in sorted((met - self._warned_unlearned_labels) | missing):
            # (a label without entities at initialize is named again if training then meets
            # only entities it leaves out: that says what would keep them)
            if label in met:
                self._warned_unlearned_labels.add(label)
            logger.warning("%s: %s", self.name, unlearned_reason(
                label, where, self.max_width, wide_labels.get(label), label in misaligned_labels))

    def _report_no_gold_entity(self, n_examples: int, n_annotated: int) -> None:
        """Say, in one line, that the initialization examples have no gold entity, so no label
        is learned from them: a warning where ``n_annotated`` of them have entity annotation,
        else an info line (``nlp.initialize()`` without examples gives one unannotated doc, and
        examples may be given for the model's shapes only, the labels besides)."""
        if n_annotated:
            logger.warning(
                "%s: the %d initialization examples (%d with entity annotation) have no gold "
                "entity, so no label is learned and none predicted (until training reads one): "
                "%s. Add examples annotated with them.",
                self.name, n_examples, n_annotated, ", ".join(map(repr, self.labels)))
        else:
            logger.info(
                "%s: the %d initialization examples have no entity annotation: the labels %s are "
                "learned from the gold entities training reads", self.name, n_examples,
                ", ".join(map(repr, self.labels)))

    def _report_misaligned(self, n_misaligned: int) -> None:
        before = self.n_misaligned_dropped
        self.n_misaligned_dropped += n_misaligned
        if _reached_a_power_of_ten(before, self.n_misaligned_dropped):
            logger.warning(
                "%s: gold entities that %s have been left out of training %d times so far (each "
                "update that reads one counts it); the loss reads their tokens as unknown, as "
                "spaCy's ner does. %s",
                self.name, _OFF_TOKENS, self.n_misaligned_dropped, _RETOKENIZE,
            )

    def get_loss(self, examples: Iterable[Example], scores) -> Tuple[float, float]:
        """The loss is computed inside the model (see ``update``)."""
        examples = list(examples)
        docs = [eg.predicted for eg in examples]
        loss = self.model.predict(self._gold(examples).model_input(docs))
        return float(loss), 0.0

    # Prediction -------------------------------------------------------------------------------

    def __call__(self, doc: Doc, *, constraints: Optional[List[Dict[str, Any]]] = None) -> Doc:
        """Annotate one document; ``constraints`` are added to the component's for this call."""
        for done in self.pipe([doc], constraints=constraints):
            return done
        return doc  # an error handler that does not raise leaves the doc unannotated

    def pipe(
        self,
        stream: Iterable[Doc],
        *,
        batch_size: int = 128,
        constraints: Optional[List[Dict[str, Any]]] = None,
    ) -> Iterator[Doc]:
        """Annotate a stream of documents; ``constraints`` (given e.g. through
        ``nlp.pipe(..., component_cfg={name: {"constraints": [...]}})``) are added to the
        component's for this call."""
        extra = self._decodable(check_constraints(constraints, self.labels))
        error_handler = self.get_error_handler()
        for docs in minibatch(stream, size=batch_size):
            # the call's constraints travel with its prediction, never on the component:
            # another call (another thread, or while this generator waits) must not see them
            try:
                self.set_annotations(docs, self._predict(docs, extra))
                yield from docs
            except Exception as e:
                error_handler(self.name, self, docs, e)

    def predict(self, docs: Iterable[Doc]) -> BatchPrediction:
        """Decode a batch: a :class:`~.head_model.BatchPrediction` of the decoded entities
        ``(doc index, start, end_inclusive, label 1..M)`` with their raw confidences, each
        document's path probability, the candidates (with ``candidates_key``) and the
        constraint reports (where there are constraints)."""
        return self._predict(docs, ())

    def _predict(self, docs: Iterable[Doc], extra: Tuple[Constraint, ...]) -> BatchPrediction:
        """:meth:`predict` with the constraints ``extra`` of a call added to the component's
        and each document's."""
        _prepare_process()  # (an unpickled component was never __init__-ed)
        docs = list(docs)
        constraints = constraints_of_docs(docs, self._constraints + extra, self.labels, self.name,
                                          own=self._decodes_constraints)
        if not getattr(self, "_warned_unsegmented", False) and sentence_scope_unsegmented(
                docs, constraints):
            self._warned_unsegmented = True
            logger.warning(
                "%s: a constraint with scope 'sentence' is applied to a document without "
                "sentence boundaries, which then counts as one sentence: add a sentencizer, "
                "senter or parser before the component, or use scope 'doc'", self.name)
        options = DecodeOptions(path=True, candidates=self._candidates_key is not None,
                                constraints=constraints)
        if not any(len(doc) for doc in docs):
            found = _empty_prediction(len(docs), options)
        else:
            found = self.model.predict(
                ModelInput(docs, filter_margin=self._filter_margin, options=options))
        if constraints is None:
            return found
        return found._replace(constraints=constraints,
                              reports=explain_unmet_forces(docs, found.reports, constraints))

    def set_annotations(self, docs: Iterable[Doc], prediction: BatchPrediction) -> None:
        """Write the output of :meth:`predict`: the entities scoring at least ``threshold``
        (calibrated scores with a calibration map, raw confidences without; every entity of a
        document whose constraints hold only with its entities below it) to
        ``doc.spans[spans_key]`` and ``doc.ents``, the path probability, the constraint
        reports, the candidates. No entity starts or ends on a whitespace token
        (:func:`trim_whitespace`)."""
        docs = list(docs)
        if self.calibration is None and not self._warned_uncalibrated and len(prediction.spans):
            self._warned_uncalibrated = True
            logger.warning(
                "%s: the pipeline has no calibration map, so doc.spans[%r].attrs['scores'] are "
                "the raw confidences of the head (not calibrated). Fit one on a development "
                "set: python -m spacy_fsemicrf calibrate MODEL DEV.spacy",
                self.name, self.spans_key,
            )
        entities, raw = self.written_entities(docs, prediction)
        scores = apply_calibration(self.calibration, raw, self._seen(docs, entities))
        reports = prediction.reports or [None] * len(docs)
        if self._threshold > 0:
            keep = scores >= self._threshold
            if prediction.constraints is not None and not keep.all():
                keep |= _held_by_constraints(docs, entities, keep, reports, prediction.constraints)
            entities, scores = entities[keep], scores[keep]
        labels = [self.vocab.strings.add(label) for label in self.labels]
        # a document another pipeline made has its own strings, which the spans' labels need
        others = {id(doc.vocab): doc.vocab for doc in docs if doc.vocab is not self.vocab}
        for vocab in others.values():
            for label in self.labels:
                vocab.strings.add(label)
        key = self.spans_key
        groups = _span_groups(docs, key, entities, scores, labels)
        paths = prediction.path.tolist()
        for doc, (ents, group), path, report in zip(docs, groups, paths, reports):
            group.attrs["path_probability"] = path
            if report is not None:
                group.attrs["constraints"] = report._asdict()
                if report.status == "infeasible":
                    excerpt = doc.text if len(doc.text) <= 60 else doc.text[:57] + "..."
                    logger.warning("%s: the constraints cannot all hold on the document %r: %s; "
                                   "it keeps the unconstrained prediction", self.name, excerpt,
                                   report.reason)
            doc.spans[key] = group
            set_entities(doc, ents)
        if self._candidates_key is not None:
            rows, raw = prediction.candidates
            cand_scores = apply_calibration(self.calibration, raw, self._seen(docs, rows))
            candidates = _span_groups(docs, self._candidates_key, rows, cand_scores, labels)
            for doc, (_, group) in zip(docs, candidates):
                doc.spans[self._candidates_key] = group

    def written_entities(
        self, docs: List[Doc], prediction: BatchPrediction
    ) -> Tuple[numpy.ndarray, numpy.ndarray]:
        """The entity rows ``(doc, start, end inclusive, label)`` of ``prediction`` as
        :meth:`set_annotations` writes them before its threshold, and their raw confidences:
        trimmed of whitespace (:func:`trim_whitespace`: those of whitespace only are left out).
        ``prediction`` stays as it is, so that it can be read again."""
        entities, keep = trim_whitespace(
            docs, prediction.spans, _decoded_forces(prediction.constraints, prediction.reports))
        return (entities, prediction.scores) if keep is None else (
            entities[keep], prediction.scores[keep])

    def _forced_spans(self, doc: Doc) -> Set[Tuple[int, int, int]]:
        """The entities ``(start, end inclusive, label 1..M)`` that a ``force_span`` constraint
        of the component or of ``doc`` makes an entity as they are (another label on the same
        tokens is the head's own entity, trimmed)."""
        # no warning about the document's invalid constraints: predict has given it
        if not self._decodes_constraints:  # (a document's own were left out)
            return set()
        found = self._constraints + doc_own_constraints(doc, self.labels, self.name, warn=False)
        ids = {label: i + 1 for i, label in enumerate(self.labels)}
        return {(c.start, c.end - 1, ids.get(c.label, 0))
                for c in found if isinstance(c, ForceSpan)}

    def _seen(self, docs: List[Doc], rows: numpy.ndarray) -> Optional[numpy.ndarray]:
        """Which entity ``rows`` were seen in training, where the calibration map asks (and
        there are rows: calibrating no score needs none)."""
        if not len(rows) or not needs_novelty(self.calibration):
            return None
        return seen_flags(docs, rows, self.seen_entities)

    def nbest(self, doc: Doc, k: int) -> List[SpanGroup]:
        """The ``k`` best segmentations of ``doc`` (a document the pipeline has run on, so
        that the tok2vec's vectors are there), best first: one span group each, named
        ``<spans_key>_nbest_<rank>`` (rank from 1), with the segmentation's probability in
        ``attrs["probability"]``. Constraints do not apply (the document's sentence boundaries
        do: no entity crosses one); ``k`` is at most :data:`MAX_NBEST` (the search keeps ``k``
        partial paths per position and label).

        The entities are trimmed of whitespace as in :meth:`set_annotations`, so segmentations
        that differ only in whitespace tokens at entity edges give the same entities: the list
        holds the most probable of them, with its own probability (the first one's is the
        prediction's ``path_probability``), and the search goes on, up to :data:`MAX_NBEST`
        segmentations, to find ``k`` distinct ones. Fewer than ``k`` where the document has
        fewer segmentations of probability above 0 (the filtered head ranks the paths of the
        graph its ``filter_margin`` keeps, often a single one) or the search limit is reached."""
        if not _integer(k) or not 1 <= k <= MAX_NBEST:
            raise ValueError(f"k must be a positive integer up to {MAX_NBEST}, got {k!r}")
        k = int(k)
        if not model_is_initialized(self.model):
            raise ValueError(f"[{self.name}] nbest needs a trained component: initialize and "
                             f"train the pipeline, or load a trained one")
        if len(doc) and _listener_output_missing(doc, self.model.get_ref("tok2vec")):
            raise ValueError(
                f"[{self.name}] nbest needs a document the pipeline has run on (its tok2vec "
                f"vectors come from the shared tok2vec component): nbest(nlp(text), k), with the "
                f"vectors still on it (a doc_cleaner drops them: clean after nbest)."
            )
        searched = k
        while True:
            found = model_nbest(self.model, [doc], searched, self._filter_margin)[0]
            best = self._distinct_trimmed(doc, found)
            if len(best) >= k or len(found) < searched or searched == MAX_NBEST:
                break
            searched = min(2 * searched, MAX_NBEST)  # whitespace variants took some ranks
        labels = self.labels
        groups = []
        for rank, (entities, prob) in enumerate(best[:k]):
            spans = [Span(doc, start, end + 1, label=labels[label - 1])
                     for start, end, label in entities]
            group = SpanGroup(doc, name=f"{self.spans_key}_nbest_{rank + 1}", spans=spans)
            group.attrs["probability"] = prob
            groups.append(group)
        return groups

    def _distinct_trimmed(
        self, doc: Doc, found: List[Segmentation]
    ) -> List[Tuple[Tuple[Tuple[int, int, int], ...], float]]:
        """``(entities, probability)`` of the segmentations ``found`` (best first), trimmed
        of whitespace, each entity set once: at its best rank."""
        out: Dict[Tuple[Tuple[int, int, int], ...], float] = {}
        for seg in found:
            rows = numpy.array([(0, *span) for span in seg.spans], dtype="int64").reshape(-1, 4)
            rows, keep = trim_whitespace([doc], rows, lambda _: self._forced_spans(doc))
            rows = rows if keep is None else rows[keep]
            out.setdefault(tuple(map(tuple, rows[:, 1:].tolist())), seg.prob)
        return list(out.items())

    # Serialization ----------------------------------------------------------------------------

    # The seen entities' hashes go next to cfg, vocab and model as raw little-endian uint64
    # (read back with numpy.frombuffer: no code runs). A pipeline saved without them loads
    # with none.

    def to_disk(self, path, *, exclude=SimpleFrozenList()):
        super().to_disk(path, exclude=exclude)
        if SEEN_ENTITIES not in exclude:
            (Path(path) / SEEN_ENTITIES).write_bytes(self._seen_bytes())

    def from_disk(self, path, *, exclude=SimpleFrozenList()):
        try:
            super().from_disk(path, exclude=exclude)
        except ValueError as err:
            damaged = _undecodable({name: (Path(path) / name).read_bytes()
                                    for name in ("cfg", "model") if (Path(path) / name).exists()})
            raise self._load_error(err, str(path), damaged) from err
        seen = Path(path) / SEEN_ENTITIES
        if SEEN_ENTITIES not in exclude:  # none saved: none, not those of the weights replaced
            self._load_seen(seen.read_bytes() if seen.exists() else b"", str(path))
        self._loaded()
        return self

    def to_bytes(self, *, exclude=SimpleFrozenList()):
        msg = srsly.msgpack_loads(super().to_bytes(exclude=exclude))
        if SEEN_ENTITIES not in exclude:
            msg[SEEN_ENTITIES] = self._seen_bytes()
        return srsly.msgpack_dumps(msg)

    def from_bytes(self, bytes_data, *, exclude=SimpleFrozenList()):
        try:
            super().from_bytes(bytes_data, exclude=exclude)
        except ValueError as err:
            raise self._load_error(err, "bytes", _undecodable_bytes(bytes_data)) from err
        msg = srsly.msgpack_loads(bytes_data)
        if SEEN_ENTITIES not in exclude:
            self._load_seen(msg.get(SEEN_ENTITIES, b""), "bytes")
        self._loaded()
        return self

    def _seen_bytes(self) -> bytes:
        return self.seen_entities.astype("<u8").tobytes()

    def _load_seen(self, data: bytes, source: str) -> None:
        """Set :attr:`seen_entities` from their saved ``data`` (read from ``source``, for the
        error of a damaged file: one cut off within a hash)."""
        if not isinstance(data, bytes) or len(data) % 8:
            size = f"{len(data)} bytes" if isinstance(data, bytes) else type(data).__name__
            raise self._load_error(ValueError(f"{size}, not a list of 64-bit hashes"), source,
                                   SEEN_ENTITIES)
        # sorted and unique, as the lookups (numpy.searchsorted) need: a file in another order
        # would calibrate seen entities as new without a word
        self.seen_entities = numpy.unique(numpy.frombuffer(data, dtype="<u8").astype("uint64"))

    def _load_error(self, err: Exception, source: str, damaged: Optional[str]) -> Exception:
        """The error of a failed load: a damaged file, or a config that builds another model
        (``damaged``: the part that cannot be decoded, if any)."""
        msg = str(err)
        if damaged is not None:
            return ValueError(
                f"Cannot load the '{self.name}' component from {source}: its {damaged} data is "
                f"damaged or incomplete ({msg}). Save the pipeline again, or reinstall its "
                f"package."
            )
        if "fsemicrf_ner" in msg:
            return ValueError(msg)
        return ValueError(
            f"Cannot load the '{self.name}' component from {source}: the model built from the "
            f"current config does not match the saved one ({msg}). Load the pipeline with the "
            f"config it was trained with."
        )

    def _loaded(self) -> None:
        """After loading: the saved labels and calibration map must be valid, a pipeline
        without a calibration map warns on its first entities, and the constraints and labels
        must agree with the loaded model."""
        # the saved cfg is read as it is: a string, a blank or a repeated label (cfg edited by
        # hand) would name the head's outputs wrongly, or with a string's characters, silently
        labels = self.cfg["labels"]
        try:  # the rules of labels given to the component, and no label twice
            valid = len(set(check_labels(labels, self.name))) == len(labels)
        except ValueError:
            valid = False
        if not valid:
            raise ValueError(
                f"Cannot load the '{self.name}' component: the labels of its saved cfg are not a "
                f"list of distinct non-empty strings ({labels!r}). Save the pipeline again, or "
                f"reinstall its package."
            )
        # spaCy fills cfg without the calibration setter's check: a map edited by hand would
        # score every entity 0, or fail at the first prediction as if not initialized
        try:
            check_calibration(self.calibration)
        except ValueError as err:
            raise ValueError(
                f"Cannot load the '{self.name}' component: the calibration map of its saved cfg "
                f"is not valid. {err}. Save the pipeline again (or fit a map again), or "
                f"reinstall its package."
            ) from None
        self._warned_uncalibrated = False
        self._unlearned_labels = set()  # (those of the weights replaced)
        if needs_novelty(self.calibration) and not len(self.seen_entities):
            logger.warning(
                "%s: the calibration map calibrates entities seen in training apart from new "
                "ones, but the pipeline has no %s (its file is missing or was excluded): every "
                "entity is calibrated as new. Save the pipeline with them, or fit a map again.",
                self.name, SEEN_ENTITIES,
            )
        if not model_is_initialized(self.model):
            return
        self.constraints = self.constraints  # they must name the loaded labels
        n_head = self.model.get_ref("head").get_dim("nO")
        if n_head != len(self.labels):
            raise ValueError(
                f"The saved '{self.name}' model predicts {n_head} labels but its cfg lists "
                f"{len(self.labels)} ({list(self.labels)}): the saved pipeline is inconsistent."
            )


_process_prepared = False


def _prepare_process() -> None:
    """Set this process up to fork workers that run the head (``nlp.pipe(n_process=N)``,
    :mod:`.fork_safety`) and serialise documents by the thousand (:mod:`.msgpack_lookups`):
    once, when it makes, trains or runs a component. A process without one (spaCy imports
    this module through its entry points for any pipeline) is left as it is."""
    global _process_prepared
    if not _process_prepared:
        fork_safety.register()
        remember_msgpack_lookups()
        _process_prepared = True


def _held_by_constraints(
    docs: List[Doc],
    entities: numpy.ndarray,
    keep: numpy.ndarray,
    reports: List[Optional[ConstraintReport]],
    constraints: List[Optional[DocConstraints]],
) -> numpy.ndarray:
    """The entity rows a threshold may not leave out: every row of a document whose
    constraints hold (its report is not infeasible) but would not hold on the rows ``keep``
    keeps (a forced span, a count or a ``requires`` that needs a low-scoring entity)."""
    held = numpy.zeros(len(keep), dtype=bool)
    bounds = _doc_bounds(entities, len(docs))
    for d, (doc, report, found) in enumerate(zip(docs, reports, constraints)):
        lo, hi = bounds[d], bounds[d + 1]
        if found is None or report is None or report.status == "infeasible" or keep[lo:hi].all():
            continue
        kept = [tuple(row) for row in entities[lo:hi, 1:][keep[lo:hi]].tolist()]
        if not satisfies(found.program, kept, len(doc), found.sentence_starts):
            held[lo:hi] = True
    return held


def _integer(value: Any) -> bool:
    """Whether ``value`` is an integer, not a bool: a NumPy one too."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, numpy.bool_))


def _reached_a_power_of_ten(before: int, after: int) -> bool:
    """Whether a count went from ``before`` to ``after`` past 1, 10, 100, ...: when to warn
    about a growing count, never silent and never a flood."""
    return before == 0 or len(str(before)) != len(str(after))


def _listener_output_missing(doc: Doc, tok2vec: Model) -> bool:
    """Whether a listener in ``tok2vec`` would read zeros for ``doc``: in prediction it reads
    what the upstream component left on the doc (``doc.tensor`` for spaCy's tok2vec,
    ``doc._.trf_data`` for spacy-transformers'), which a doc straight from the tokenizer lacks
    and ``doc_cleaner`` drops (it sets ``doc.tensor`` to None).
    False for a tok2vec of the component's own. The listener node itself is looked for, not
    the name of ``tok2vec``: ``TransformerListener.v1`` wraps its listener in a chain, whose
    name (saved and restored with the weights) stays the same after ``replace_listeners``."""
    listeners = {node.name for node in tok2vec.walk() if node.name.endswith("listener")}
    if "transformer-listener" in listeners:
        return getattr(doc._, "trf_data", None) is None
    return bool(listeners) and (doc.tensor is None or doc.tensor.size == 0)


def _span_groups(
    docs: List[Doc], key: str, rows: numpy.ndarray, scores: numpy.ndarray, labels: List[int]
) -> List[Tuple[List[Span], SpanGroup]]:
    """Each document's spans among ``rows`` ``(doc, start, end inclusive, label 1..M)``
    (sorted by document; ``labels`` are the label hashes), and a span group named ``key`` of
    them with their ``scores`` in ``attrs["scores"]``."""
    bounds = _doc_bounds(rows, len(docs))
    rows_list = rows[:, 1:].tolist()  # one conversion for the batch, not one per document
    out = []
    for doc, a, b in zip(docs, bounds[:-1], bounds[1:]):
        spans = [Span(doc, start, end + 1, label=labels[label - 1])
                 for start, end, label in rows_list[a:b]]
        group = SpanGroup(doc, name=key, spans=spans)
        group.attrs["scores"] = numpy.array(scores[a:b], dtype="float32")
        out.append((spans, group))
    return out


def _gold_names(eg: Example) -> List[str]:
    """The texts of the gold entities of ``eg`` that are real training names: those of the
    example an augmenter made ``eg`` from, not the made-up ones it holds."""
    if eg.reference.user_data.get(AUGMENTED, False):
        return list(eg.reference.user_data.get(ORIGINAL_ENTITIES, ()))
    return [ent.text for ent in eg.reference.ents]


def _seen_keys(texts: Iterable[str]) -> numpy.ndarray:
    """The :func:`entity_key` hashes of ``texts``, stripped as the entities written are (no
    whitespace token at either end): a gold entity "\n\nMary" is the name "Mary" the component
    writes, not an unseen one."""
    keys = (entity_key(text.strip()) for text in texts if not text.isspace())
    return numpy.fromiter(keys, dtype="uint64")


def _undecodable(parts: Dict[str, bytes]) -> Optional[str]:
    """The name of the first of a component's saved ``parts`` that does not decode (``cfg``
    is JSON, the others msgpack), or None."""
    for name, data in parts.items():
        try:
            srsly.json_loads(data) if name == "cfg" else srsly.msgpack_loads(data)
        except ValueError:
            return name
    return None


def _undecodable_bytes(data: bytes) -> Optional[str]:
    """The part of a component's saved ``data`` (:meth:`~FSemiCRFEntityRecognizer.to_bytes`)
    that does not decode: ``"bytes"`` for the whole, else its ``cfg`` or ``model`` (as
    :func:`_undecodable` reads the files of a saved directory), or None."""
    damaged = _undecodable({"bytes": data})
    if damaged is not None:
        return damaged
    parts = srsly.msgpack_loads(data)
    return _undecodable({name: parts[name] for name in ("cfg", "model") if name in parts})


def _decoded_forces(
    constraints: Optional[List[Optional[DocConstraints]]],
    reports: Optional[List[Optional[ConstraintReport]]] = None,
) -> Optional[Callable[[int], Set[Tuple[int, int, int]]]]:
    """The forced spans ``(start, end inclusive, label)`` of the document of each index, from
    the constraints it was decoded under; none for an infeasible document, whose unconstrained
    prediction holds no forced span (an entity there on the same tokens is the head's own, to
    be trimmed)."""
    if constraints is None:
        return None
    infeasible = {d for d, report in enumerate(reports or ())
                  if report is not None and report.status == "infeasible"}
    return lambda d: set() if constraints[d] is None or d in infeasible else {
        tuple(f) for f in constraints[d].program.forces}


def trim_whitespace(
    docs: List[Doc],
    rows: numpy.ndarray,
    forced: Optional[Callable[[int], Set[Tuple[int, int, int]]]] = None,
) -> Tuple[numpy.ndarray, Optional[numpy.ndarray]]:
    """Entity ``rows`` ``(doc, start, end inclusive, label)`` without whitespace tokens at
    their edges, as spaCy's ``ner`` never starts an entity on one: a head that learnt from text
    without such tokens may put one there (a double space before a name). Returns the rows (a
    trimmed copy where one changes, else ``rows`` itself) and None when every row stays, else
    the indices of the rows to keep (those of whitespace only are left out). ``forced(d)``
    gives the spans ``(start, end, label)`` a constraint asked for in document ``d``, which
    stay as they are (read only where a row would change); another label there is trimmed."""
    keep = None
    for i, (d, start, end, label) in enumerate(rows.tolist()):
        doc = docs[d]
        if not (doc[start].is_space or doc[end].is_space):
            continue
        if forced is not None and (start, end, label) in forced(d):
            continue
        edges = trim_span(start, end, lambda t: doc[t].is_space)
        if keep is None:
            rows, keep = rows.copy(), numpy.ones(len(rows), dtype=bool)
        keep[i] = edges is not None
        if edges is not None:
            rows[i, 1], rows[i, 2] = edges
    return rows, None if keep is None else numpy.flatnonzero(keep)


def _doc_bounds(rows: numpy.ndarray, n_docs: int) -> List[int]:
    """Where each document's rows start among ``rows`` (sorted by document, the first column),
    and the end of the last: ``n_docs + 1`` offsets from one search for the whole batch."""
    return numpy.searchsorted(rows[:, 0], numpy.arange(n_docs + 1), side="left").tolist()


def _empty_prediction(n_docs: int, options: DecodeOptions) -> BatchPrediction:
    """The prediction for documents without tokens: no entity, the empty path (probability
    1), and whether it obeys each document's constraints."""
    empty = (numpy.zeros((0, 4), dtype="int64"), numpy.zeros((0,), dtype="float32"))
    reports = None
    if options.constrained():
        reports = [empty_document_report(doc) for doc in options.constraints]
    return BatchPrediction(*empty, numpy.ones((n_docs,), dtype="float32"),
                           empty if options.candidates else None, reports)


def check_labels(labels: Any, component: str) -> List[str]:
    """``labels`` as a list of non-empty strings, or a ``ValueError`` saying what is wrong (a
    single string would otherwise be read as its characters)."""
    if isinstance(labels, str) or not isinstance(labels, (list, tuple)):
        raise ValueError(
            f"[{component}] labels must be a list of strings, got {labels!r}"
            + (f" (did you mean [{labels!r}]?)" if isinstance(labels, str) else "")
        )
    for label in labels:
        if not isinstance(label, str) or not label.strip():
            raise ValueError(f"[{component}] every label must be a non-empty string, got {label!r}")
    return list(labels)


def set_entities(doc: Doc, predicted: List[Span]) -> None:
    """Write ``predicted`` into ``doc.ents`` like spaCy's ``ner``: keep the entities already on
    the doc and the blocked tokens, drop predicted entities overlapping them, set the remaining
    tokens without entity information to O."""
    n = len(doc)
    if n == 0:
        return
    # a fresh doc (no entity information yet: one C loop tells) has nothing to keep or avoid
    fresh = not doc.has_annotation("ENT_IOB")
    iob = None if fresh else doc.to_array("ENT_IOB").astype("int64").reshape(-1)
    occupied = None if fresh else (iob == 1) | (iob == 3)  # inside a preset entity, or blocked
    if fresh or not occupied.any():
        # every token outside the predicted entities becomes O, which "outside" does without
        # building a Span per uncovered run
        doc.set_ents(predicted, default="outside")
        return
    if predicted:
        starts = numpy.fromiter((s.start for s in predicted), dtype="int64", count=len(predicted))
        ends = numpy.fromiter((s.end for s in predicted), dtype="int64", count=len(predicted))
        cum = numpy.concatenate([[0], numpy.cumsum(occupied)])
        keep = (cum[ends] - cum[starts]) == 0
        predicted = [span for span, k in zip(predicted, keep.tolist()) if k]
        starts, ends = starts[keep], ends[keep]
        delta = numpy.zeros((n + 1,), dtype="int64")
        numpy.add.at(delta, starts, 1)
        numpy.add.at(delta, ends, -1)
        covered = numpy.cumsum(delta[:n]) > 0
    else:
        covered = numpy.zeros((n,), dtype=bool)
    missing = (iob == 0) & ~covered
    outside = [doc[int(a) : int(b)] for a, b in true_runs(missing)]
    doc.set_ents(predicted, outside=outside, default="unmodified")

