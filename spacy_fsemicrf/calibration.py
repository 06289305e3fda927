"""Calibrated entity confidences: a map from a head's raw confidence to the probability that
the entity is correct, fitted on held-out documents.

Three kinds of map, and the fit picks one by cross-validation on the documents it is given
(:func:`fit_calibration`), because none suits every head and corpus: Platt scaling (a logistic
function of the logit of the raw confidence, two parameters) fits the semi-CRFs' marginals,
which pile up towards 1 with a roughly logistic relation to correctness; isotonic regression
fits any non-decreasing shape, such as the filtered head's local probabilities, which stop
short of 1 when the head is trained with boundary smoothing (its targets put ``eps`` on null)
and whose accuracy then rises steeply just below that ceiling; and one of those for entities
whose text was an entity's text in the training data and one for the others
(``by_novelty``): at the same raw confidence a name never seen in training is wrong more
often, and new text has more unseen names than the development set. No map reverses the order
of the raw confidences (within seen and within unseen entities for ``by_novelty``; an isotonic
map may give a range of them one value). The map is
stored in the component's ``cfg`` and the hashes of the training entities' texts next to the
weights (saved with the pipeline), so a loaded pipeline gives calibrated scores.

Fitting it:

* during ``spacy train``, with the ``spacy-fsemicrf.calibrate.v1`` callback in
  ``[training.before_to_disk]``: every saved pipeline (``model-last``, hence ``model-best``)
  carries a map fitted on the dev examples its evaluations score (``[training] dev_corpus``);
* for a trained pipeline: ``python -m spacy_fsemicrf calibrate MODEL DEV.spacy`` (with
  ``--train TRAIN.spacy`` for a pipeline that does not carry its training entities);
* from Python: :func:`calibrate_component`, on Examples (``spacy.training.Corpus(path)(nlp)``).

Only the documents given are read: fit on a development split, never on the test set. A few
hundred predicted entities make a usable map; a few thousand a good one. The fit counts the
predicted entities that spaCy's NER scorer counts: not those that cover a token without gold
entity annotation.
"""
import argparse
import logging
import math
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import numpy
import spacy
from spacy.language import Language
from spacy.strings import hash_string
from spacy.tokens import Doc, DocBin, Span
from spacy.training import Corpus, Example, validate_examples
from spacy.training.corpus import walk_corpus
from spacy.util import dot_to_object, minibatch, registry
from thinc.api import ConfigValidationError

from .structured.spans import is_real


logger = logging.getLogger("spacy_fsemicrf")

PREDICT_BATCH = 64
# Platt scaling reads the logit of raw confidences clipped this far from 0 and 1 (float32
# probabilities: 1 - 1e-7 is about the largest one below 1).
EPS = 1e-7
# Seen and unseen entities get a map each only when each kind has at least this many entities
# in the held-out documents: fewer, and the held-out comparison itself is noise.
MIN_GROUP = 20


def fit_calibration(
    raw: numpy.ndarray, correct: numpy.ndarray, seen: Optional[numpy.ndarray] = None
) -> Dict[str, Any]:
    """Fit the calibration map ``P(correct | raw)`` to held-out outcomes and return it as a
    JSON-serializable dict: Platt scaling, isotonic regression, or (given ``seen``, which
    entities' text is an entity's text in the training data, and at least ``MIN_GROUP`` of
    each kind) one map for seen and one for unseen entities; whichever predicts the outcomes
    better (log-loss) when fitted on every other entity and measured on the rest, both ways
    round; then refitted on all of them. ``selection`` records the losses."""
    raw = numpy.asarray(raw, dtype="float64").reshape(-1)
    correct = numpy.asarray(correct, dtype=bool).reshape(-1)
    names = ["platt", "isotonic"]  # simplest first: ties go to the simpler map
    if seen is not None:
        seen = numpy.asarray(seen, dtype=bool).reshape(-1)
        if min(int(seen.sum()), int((~seen).sum())) >= MIN_GROUP:
            names.append("by_novelty")
    losses = {name: _held_out_log_loss(FITS[name], raw, correct, seen) for name in names}
    best = min(names, key=lambda name: (losses[name], names.index(name)))
    out = FITS[best](raw, correct, seen)
    out.update({"n_entities": int(raw.size), "n_correct": int(correct.sum()),
                "selection": {name: round(value, 6) for name, value in losses.items()}})
    return out


def fit_by_novelty(raw: numpy.ndarray, correct: numpy.ndarray, seen: numpy.ndarray) -> Dict[str, Any]:
    """A map for the entities seen in training and one for the others, each fitted by
    :func:`fit_calibration` on its own entities (on all of them where a kind has none).
    Names never seen in training are wrong more often at the same raw confidence, and a test
    set usually has more of them than the development set the map is fitted on: a map per kind
    carries over to a share of new names that differs from the development set's."""
    seen = numpy.asarray(seen, dtype=bool).reshape(-1)
    maps = {}
    for name, part in (("seen", seen), ("unseen", ~seen)):
        part = part if part.any() else numpy.ones_like(part)
        maps[name] = fit_calibration(raw[part], correct[part])
    return {"method": "by_novelty", **maps}


def _held_out_log_loss(
    fit: Callable, raw: numpy.ndarray, correct: numpy.ndarray, seen: Optional[numpy.ndarray]
) -> float:
    fold = numpy.arange(raw.size) % 2 == 0
    if fold.all() or not fold.any():
        return 0.0
    total = 0.0
    for use in (fold, ~fold):
        fitted = fit(raw[~use], correct[~use], None if seen is None else seen[~use])
        p = apply_calibration(fitted, raw[use], None if seen is None else seen[use])
        p = numpy.clip(p, 1e-6, 1 - 1e-6)
        total -= float(numpy.sum(numpy.where(correct[use], numpy.log(p), numpy.log1p(-p))))
    return total / raw.size


def fit_platt(raw: numpy.ndarray, correct: numpy.ndarray) -> Dict[str, Any]:
    """Platt scaling: ``sigmoid(slope * logit(raw) + intercept)``, ``slope >= 0``, by maximum
    likelihood with Platt's (1999) targets ``(n+ + 1) / (n+ + 2)`` and ``1 / (n- + 2)``
    instead of 1 and 0, which keep it finite when the outcomes are separable."""
    x = _logit(raw)
    y = numpy.asarray(correct, dtype=bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    targets = numpy.where(y, (n_pos + 1.0) / (n_pos + 2.0), 1.0 / (n_neg + 2.0))
    slope, intercept = _logistic(x, targets)
    # raw confidences that do not vary (one entity, or all equal after clipping) tell no slope:
    # every line through their one point fits as well, and Newton's steps from 0 took the one
    # of slope intercept / logit, which sent raw confidences never seen towards 0 or 1 by the
    # sign and size of that logit. Such data, like an anti-informative score, get a constant
    flat = not x.size or x.min() == x.max()
    if slope < 0 or flat:  # (the map stays monotone)
        slope, intercept = 0.0, _logistic(numpy.zeros_like(x), targets)[1]
    # to 9 decimals, which the saved cfg (srsly's JSON writes 10) gives back: cut there on
    # saving only, they moved 1 in 3,000 scores of the reloaded pipeline by a float32 step
    slope, intercept = round(slope, 9), round(intercept, 9)
    return {"method": "platt", "slope": slope, "intercept": intercept}


def _logit(raw: numpy.ndarray) -> numpy.ndarray:
    p = numpy.clip(numpy.asarray(raw, dtype="float64"), EPS, 1.0 - EPS)
    return numpy.log(p) - numpy.log1p(-p)


def _platt(slope: Any, intercept: Any, raw: numpy.ndarray) -> numpy.ndarray:
    """The Platt map ``sigmoid(slope * logit(raw) + intercept)`` in float32 (``slope`` and
    ``intercept``: numbers, or arrays like ``raw``)."""
    z = slope * _logit(raw) + intercept
    return (0.5 * (1.0 + numpy.tanh(0.5 * z))).astype("float32")  # sigmoid, overflow-free


def _logistic(x: numpy.ndarray, t: numpy.ndarray) -> Tuple[float, float]:
    """Logistic regression of the soft targets ``t`` on ``x``: Newton's method with step
    halving (the negative log-likelihood is convex)."""
    A = numpy.stack([x, numpy.ones_like(x)], 1)
    w = numpy.zeros(2)

    def loss(w: numpy.ndarray) -> float:
        z = A @ w
        return float(numpy.sum(numpy.logaddexp(0.0, z) - t * z))

    current = loss(w)
    for _ in range(100):
        q = 0.5 * (1.0 + numpy.tanh(0.5 * (A @ w)))
        hessian = (A * (q * (1.0 - q))[:, None]).T @ A + 1e-9 * numpy.eye(2)
        step = numpy.linalg.solve(hessian, A.T @ (q - t))
        scale = 1.0
        while scale > 1e-6 and loss(w - scale * step) > current:
            scale /= 2
        value = loss(w - scale * step)
        if value > current:
            break
        w, gain, current = w - scale * step, current - value, value
        if gain < 1e-12 * max(1.0, abs(current)):
            break
    return float(w[0]), float(w[1])


def fit_isotonic(raw: numpy.ndarray, correct: numpy.ndarray) -> Dict[str, Any]:
    """Isotonic regression (pool adjacent violators): the non-decreasing step function of the
    raw confidence closest to the outcomes. Each step (block of entities) becomes a knot at its
    mean raw confidence, valued by its share of correct entities shrunk towards the share of
    all of them, ``(correct + 2 * share) / (entities + 2)`` (the mean under a Beta prior worth
    two entities), so that no score is 0 or 1 because a small block happened to be all right or
    all wrong (steps that the prior brings level are merged into one value); the map
    interpolates linearly between knots, falls linearly to 0 at a raw confidence of 0 below the
    first and is flat above the last (:func:`apply_calibration`)."""
    x = numpy.asarray(raw, dtype="float64").reshape(-1)
    y = numpy.asarray(correct, dtype="float64").reshape(-1)
    values, first = numpy.unique(x, return_inverse=True)
    counts = numpy.bincount(first, minlength=values.size).astype("float64")
    hits = numpy.bincount(first, weights=y, minlength=values.size)
    blocks: List[List[float]] = []  # [correct, entities, sum of raw]: one per step
    for k, n, v in zip(hits, counts, values * counts):
        blocks.append([k, n, v])
        # pool while the step before is not lower: steps come out strictly increasing
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] >= blocks[-1][0] * blocks[-2][1]:
            last = blocks.pop()
            blocks[-1] = [a + b for a, b in zip(blocks[-1], last)]
    knots = numpy.asarray(blocks, dtype="float64").reshape(-1, 3)
    share = (y.sum() + 1) / (y.size + 2)
    scores = numpy.maximum.accumulate((knots[:, 0] + 2 * share) / (knots[:, 1] + 2))
    # knots to 8 decimals (they are saved as JSON); of knots that become equal keep the last
    at = numpy.round(knots[:, 2] / numpy.maximum(knots[:, 1], 1), 8)
    last = numpy.r_[at[1:] != at[:-1], True] if at.size else numpy.zeros(0, dtype=bool)
    return {"method": "isotonic", "x": at[last].tolist(), "y": numpy.round(scores[last], 6).tolist()}


Fit = Callable[[numpy.ndarray, numpy.ndarray, Optional[numpy.ndarray]], Dict[str, Any]]
FITS: Dict[str, Fit] = {
    "platt": lambda raw, correct, seen: fit_platt(raw, correct),
    "isotonic": lambda raw, correct, seen: fit_isotonic(raw, correct),
    "by_novelty": fit_by_novelty,
}
"""The maps :func:`fit_calibration` chooses among, as ``fit(raw, correct, seen)``."""


def apply_calibration(
    calibration: Optional[Dict[str, Any]], raw: numpy.ndarray, seen: Optional[numpy.ndarray] = None
) -> numpy.ndarray:
    """The calibrated confidences (float32) of the ``raw`` ones; ``raw`` itself without a map.
    A ``by_novelty`` map needs ``seen``: which entities' text is an entity's text in the
    training data (:func:`seen_flags`)."""
    raw = numpy.asarray(raw, dtype="float32")
    if not calibration or raw.size == 0:
        return raw
    if calibration["method"] == "by_novelty":
        if seen is None:
            raise ValueError("A by_novelty calibration map needs to know which entities were "
                             "seen in training (seen=...).")
        seen = numpy.asarray(seen, dtype=bool).reshape(raw.shape)
        parts = (calibration["seen"], calibration["unseen"])
        if all(part["method"] == "platt" for part in parts):
            # one pass with each entity's own slope and intercept (the same float64 operations
            # as a pass per kind): a dozen fewer NumPy calls on a few entities at a time
            return _platt(numpy.where(seen, parts[0]["slope"], parts[1]["slope"]),
                          numpy.where(seen, parts[0]["intercept"], parts[1]["intercept"]), raw)
        out = numpy.empty(raw.shape, dtype="float32")
        out[seen] = apply_calibration(calibration["seen"], raw[seen])
        out[~seen] = apply_calibration(calibration["unseen"], raw[~seen])
        return out
    if calibration["method"] == "platt":
        return _platt(calibration["slope"], calibration["intercept"], raw)
    x, y = calibration["x"], calibration["y"]
    if not len(x):  # (not `not x`: knots in a NumPy array, which the check takes, have no truth)
        return raw
    if x[0] > 0:
        # fitted on decoded entities, the map also scores candidates of far lower raw
        # confidence: flat below its first knot, it gave them that knot's probability
        x, y = [0.0] + list(x), [0.0] + list(y)
    return numpy.interp(raw, x, y).astype("float32")


def needs_novelty(calibration: Optional[Dict[str, Any]]) -> bool:
    """Whether applying ``calibration`` needs to know which entities were seen in training."""
    return bool(calibration) and calibration["method"] == "by_novelty"


def entity_key(text: str) -> int:
    """The 64-bit hash that stands for an entity's text in a set of seen entities."""
    return hash_string(text)


def seen_flags(docs: List[Doc], rows: numpy.ndarray, seen_keys: numpy.ndarray) -> numpy.ndarray:
    """For each entity row ``(doc, start, end inclusive, label)`` of ``docs``: whether its text
    is one of ``seen_keys`` (sorted :func:`entity_key` hashes)."""
    # Span(...) rather than doc[start:end]: no slice normalisation, about half the cost
    keys = numpy.fromiter(
        (entity_key(Span(docs[i], start, end + 1).text) for i, start, end, _ in rows.tolist()),
        dtype="uint64", count=len(rows),
    )
    if not seen_keys.size:
        return numpy.zeros(len(rows), dtype=bool)
    at = numpy.minimum(numpy.searchsorted(seen_keys, keys), seen_keys.size - 1)
    return seen_keys[at] == keys


def check_calibration(calibration: Any) -> Optional[Dict[str, Any]]:
    """``calibration`` if it is None, a copy of it in plain Python numbers and lists if it is a
    valid map (NumPy's, which a map built in Python may hold, are no JSON for the saved cfg),
    else a ``ValueError`` saying why."""
    if calibration is None:
        return None
    try:
        if calibration["method"] == "by_novelty":
            parts = [calibration["seen"], calibration["unseen"]]
            if any(part["method"] == "by_novelty" for part in parts):
                raise ValueError("nested")
            seen, unseen = (check_calibration(part) for part in parts)
            return {**calibration, "seen": seen, "unseen": unseen}
        # numbers, not their text, which float() and numpy.asarray() read but apply_calibration
        # cannot compute with (a map written or edited by hand)
        if calibration["method"] == "platt":
            slope, intercept = calibration["slope"], calibration["intercept"]
            ok = (is_real(slope) and is_real(intercept)
                  and math.isfinite(slope) and math.isfinite(intercept) and slope >= 0)
        else:
            x = numpy.asarray(calibration["x"], dtype="float64")
            y = numpy.asarray(calibration["y"], dtype="float64")
            ok = (
                calibration["method"] == "isotonic"
                and all(is_real(v) for v in [*calibration["x"], *calibration["y"]])
                and x.ndim == 1 and x.shape == y.shape
                and bool(numpy.isfinite(x).all() and (numpy.diff(x) > 0).all())
                and bool(((y >= 0) & (y <= 1)).all() and (numpy.diff(y) >= 0).all())
            )
    except (TypeError, KeyError, ValueError):
        ok = False
    if not ok:
        raise ValueError(
            "A calibration map is a dict with method 'platt' (a finite slope >= 0 and a finite "
            "intercept), 'isotonic' (knots 'x', increasing, and their scores 'y', "
            "non-decreasing, in [0, 1]) or 'by_novelty' (a 'platt' or 'isotonic' map under "
            f"'seen' and one under 'unseen'), got {calibration!r}"
        )
    if calibration["method"] == "platt":
        return {**calibration, "slope": float(slope), "intercept": float(intercept)}
    return {**calibration, "x": x.tolist(), "y": y.tolist()}


# ----------------------------------------------------------------------------- fitting


def corpus_files(path: Union[str, Path]) -> List[Union[str, Path]]:
    """The DocBin files of a corpus path as ``spacy.Corpus.v1`` reads it: ``path`` itself, or
    the ``.spacy`` files of a directory and its subdirectories (what ``spacy convert`` writes
    for a directory of input files), sorted."""
    return list(walk_corpus(path, ".spacy")) if Path(path).is_dir() else [path]


class CorpusError(ValueError):
    """A corpus path that holds no readable ``.spacy`` file."""


def read_docs(path: Union[str, Path], vocab) -> List[Doc]:
    """The documents of a ``.spacy`` file (DocBin) or of a directory of them. Raises
    :class:`CorpusError` for a directory without ``.spacy`` files or a file DocBin cannot read
    (rather than finding no entities in it)."""
    with warnings.catch_warnings():  # spaCy's W090 for a directory without files: said below
        warnings.simplefilter("ignore", UserWarning)
        files = corpus_files(path)
    if not files:
        raise CorpusError(f"no .spacy file in {path}")
    docs: List[Doc] = []
    for file in files:
        try:
            docs.extend(DocBin().from_disk(file).get_docs(vocab))
        except Exception as err:  # zlib, msgpack and OS errors alike mean an unreadable file
            raise CorpusError(f"cannot read {file} as a .spacy (DocBin) file: {err}") from err
    return docs


def read_examples(path: Union[str, Path], nlp: Language) -> List[Example]:
    """The examples of a ``.spacy`` file (whatever its name ends with) or of a directory of them
    (:func:`read_docs`), made as ``spacy.Corpus.v1`` makes them for ``spacy evaluate``: the
    text as the tokenizer splits it (a document's own tokens when its spaces are unknown), and
    documents without tokens left out. ``Corpus`` itself reads a file only if its name ends in
    ``.spacy``: from another, no examples, with a mere warning."""
    docs = read_docs(path, nlp.vocab)  # first: its error, not Corpus's warning, for no file
    return list(Corpus(path).make_examples(nlp, docs))


def unannotated(doc: Doc) -> Doc:
    """A copy of ``doc`` with its tokens only (what a pipeline sees at prediction)."""
    return Doc(doc.vocab, words=[t.text for t in doc], spaces=[bool(t.whitespace_) for t in doc])


def raw_outcomes(
    nlp: Language, component: str, examples: Iterable[Example]
) -> Tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]:
    """``(raw confidences, correct, seen)`` of the entities ``component`` writes (trimmed of
    whitespace, before any threshold) on copies of the ``examples``' predicted documents, as
    their reader made them (what ``nlp.evaluate`` predicts on: for ``spacy.Corpus.v1`` the text
    as the tokenizer splits it), scored as spaCy's NER scorer scores them against the reference
    documents: each entity is aligned to the gold tokens; one that aligns to none, or covers a
    gold token without entity annotation, is neither right nor wrong and is left out (so is
    every entity of a document without entity annotation). Correct when its aligned span and
    label are a gold entity not found by an entity before it, seen when its text is an entity's
    text in the component's training data."""
    pipe = nlp.get_pipe(component)
    before = nlp.pipe_names[: nlp.pipe_names.index(component)]
    labels = pipe.labels
    raws: List[numpy.ndarray] = []
    seen: List[numpy.ndarray] = []
    correct: List[bool] = []
    for batch in minibatch(list(examples), PREDICT_BATCH):
        # copies, as nlp.evaluate makes: the examples stay as read (the callback keeps them)
        with nlp.select_pipes(enable=before):
            docs = list(nlp.pipe(eg.predicted.copy() for eg in batch))
        gold = [eg.reference for eg in batch]
        # the entities as the component writes them (trimmed of whitespace), not as decoded
        entities, raw = pipe.written_entities(docs, pipe.predict(docs))
        x2y = [Example(doc, ref).alignment.x2y for doc, ref in zip(docs, gold)]
        # as in spacy.scorer.get_ner_prf: ENT_IOB 0 is a token whose annotation is missing
        missing = [ref.to_array("ENT_IOB") == 0 for ref in gold]
        truth = [{(e.start, e.end - 1, e.label_) for e in ref.ents} for ref in gold]
        scored = numpy.zeros(len(entities), dtype=bool)
        for row, (i, start, end, label) in enumerate(entities.tolist()):
            indices = x2y[i][start:end + 1]
            if len(indices) and not missing[i][indices[0]:indices[-1] + 1].any():
                scored[row] = True
                key = (int(indices[0]), int(indices[-1]), labels[label - 1])
                correct.append(key in truth[i])
                # as the scorer: a gold entity is found once, and another predicted entity
                # that aligns to it too (the pipeline splits a token the corpus keeps whole:
                # "500" and "mg" of "500mg") is wrong
                truth[i].discard(key)
        raws.append(raw[scored])
        seen.append(seen_flags(docs, entities[scored], pipe.seen_entities))
    if not raws:
        return numpy.zeros((0,), dtype="float32"), numpy.zeros((0,), dtype=bool), numpy.zeros((0,), dtype=bool)
    return numpy.concatenate(raws), numpy.asarray(correct, dtype=bool), numpy.concatenate(seen)


FEW_ENTITIES = 100
"""Below this many predicted entities, :func:`calibrate_component` warns that its map is
fitted on few."""


def calibrate_component(
    nlp: Language, component: str, examples: Iterable[Example], warn_poor_fit: bool = True
) -> Optional[Dict[str, Any]]:
    """Fit the calibration map of ``nlp``'s ``component`` on held-out ``examples`` (as a corpus
    reader yields them, say ``spacy.training.Corpus(path)(nlp)``: the pipeline predicts on
    their predicted documents, as ``nlp.evaluate`` does, and is scored against their reference
    entities), store it in the component and return it; None, with a warning and the map
    unchanged, when the component predicts no entity on them. Examples whose reference has no
    entity annotation are left out (with a warning under ``warn_poor_fit``), as from the
    training loss: their predicted entities would all count as wrong. In partly annotated
    documents, predicted entities that cover a token without annotation are left out, as
    spaCy's NER scorer leaves them out (:func:`raw_outcomes`). With ``warn_poor_fit``, it warns
    when the documents have no gold entity of one of the component's labels (not annotated
    with it?), when they have gold entities of a label the component does not know (a label of
    the dev set only) and when it fits on fewer than :data:`FEW_ENTITIES` predicted
    entities."""
    pipe = nlp.get_pipe(component)
    if not hasattr(pipe, "calibration"):
        raise ValueError(f"'{component}' is not an fsemicrf_ner component")
    examples = list(examples)
    validate_examples(examples, "calibrate_component")
    annotated = [eg for eg in examples if eg.reference.has_annotation("ENT_IOB")]
    if warn_poor_fit and len(annotated) < len(examples):
        logger.warning("%s: %d of the %d calibration documents have no entity annotation and "
                       "are left out", component, len(examples) - len(annotated), len(examples))
    gold_labels = {e.label_ for eg in annotated for e in eg.reference.ents}
    absent = sorted(set(pipe.labels) - gold_labels)
    if warn_poor_fit and annotated and absent:
        logger.warning("%s: the calibration documents have no gold entity labelled %s; if they "
                       "are not annotated with these labels, mark those tokens as missing "
                       "(Doc.set_ents(missing=...)), or each such prediction counts as wrong",
                       component, ", ".join(absent))
    unknown = sorted(gold_labels - set(pipe.labels))
    if warn_poor_fit and unknown:
        logger.warning("%s: the calibration documents have gold entities labelled %s, which the "
                       "component was not trained on: it never predicts them, and its scores "
                       "on these documents count them as missed", component, ", ".join(unknown))
    raw, correct, seen = raw_outcomes(nlp, component, annotated)
    if raw.size == 0:
        logger.warning("%s: no predicted entities to calibrate on; the map is unchanged", component)
        return None
    if warn_poor_fit and raw.size < FEW_ENTITIES:
        logger.warning("%s: the map is fitted on %d predicted entities only; a few hundred make "
                       "a usable one", component, raw.size)
    pipe.calibration = fit_calibration(raw, correct, seen if pipe.seen_entities.size else None)
    return pipe.calibration


def fsemicrf_components(nlp: Language) -> List[str]:
    """The names of ``nlp``'s components made by the ``fsemicrf_ner`` factory."""
    return [name for name in nlp.pipe_names if nlp.get_pipe_meta(name).factory == "fsemicrf_ner"]


CALLBACK = "spacy-fsemicrf.calibrate.v1"


def configured_dev_corpus(nlp: Language) -> Tuple[str, Callable[[Language], Iterable[Example]]]:
    """``(name, reader)`` of the ``[training] dev_corpus`` of ``nlp.config``, resolved as
    ``spacy train`` resolves it for its evaluations: on the interpolated config (during
    training ``nlp.config`` is the raw one, command-line overrides applied: ``${paths.dev}``
    is the path given). A ``ValueError`` that says why when it cannot be resolved."""
    try:
        config = nlp.config.interpolate()
        name = config.get("training", {}).get("dev_corpus")
        if not isinstance(name, str):
            raise ValueError(f"[training] dev_corpus is {name!r}, not the dot name of a reader")
        # only that reader: resolve_dot_names would resolve its whole section, and fail on
        # a [corpora.train] without a path
        reader = registry.resolve({"reader": dot_to_object(config, name)})["reader"]
    except (KeyError, ValueError) as err:  # (a ConfigValidationError is a ValueError)
        short = isinstance(err, ConfigValidationError)  # its message, not the whole config
        why = ConfigValidationError.from_error(err, show_config=False) if short else err
        raise ValueError(
            f"{CALLBACK} reads the dev corpus that spacy train evaluates on, [training] "
            f"dev_corpus of the pipeline's config, and cannot resolve it: "
            f"{' '.join(str(why).split())}. Give the config a [training] dev_corpus naming a "
            f"reader (such as corpora.dev), or the callback a dev_path (.spacy files)") from err
    return name, reader


def read_dev_examples(nlp: Language, dev_path: Optional[Union[str, Path]] = None) -> List[Example]:
    """The dev examples as ``spacy train`` reads them for its evaluations: from the reader of
    ``[training] dev_corpus`` (:func:`configured_dev_corpus`), or the ``.spacy`` files of
    ``dev_path`` when it is given, as ``spacy evaluate`` reads them (:func:`read_examples`). A
    ``ValueError`` naming the callback when they cannot be read or there are none."""
    if dev_path is not None:
        where, reader = f"dev_path {dev_path}", lambda nlp: read_examples(dev_path, nlp)
    else:
        name, reader = configured_dev_corpus(nlp)
        where = f"[training] dev_corpus {name}"
    try:
        examples = list(reader(nlp))
    except (OSError, ValueError, TypeError) as err:  # (spaCy's E1014 is a ValueError)
        raise ValueError(f"{CALLBACK} cannot read its dev corpus ({where}): {err}") from err
    if not examples:
        raise ValueError(f"{CALLBACK}: its dev corpus ({where}) yields no examples")
    return examples


@registry.callbacks(CALLBACK)
def make_calibrate_callback(
    dev_path: Optional[Union[str, Path]] = None, component: Optional[str] = None
) -> Callable[[Language], Language]:
    """A ``[training.before_to_disk]`` callback: before each save, fit ``component``'s
    calibration map on the dev examples ``spacy train`` evaluates on, read by the reader of
    the config's ``[training] dev_corpus`` (whatever ``[corpora.dev]`` is: a reader of the
    user's own, ``spacy.Corpus.v1`` with ``gold_preproc``, ``limit``...), or, given
    ``dev_path``, the ``.spacy`` files there (:func:`read_dev_examples`); read once, at the
    first save. Without ``component``, every component made by the ``fsemicrf_ner`` factory,
    whatever its name, each its own map; a ``ValueError`` when there is none."""
    examples: List[List[Example]] = []  # the dev examples, read at the first save

    def calibrate_before_to_disk(nlp: Language) -> Language:
        names = [component] if component is not None else fsemicrf_components(nlp)
        if not names:
            raise ValueError(f"{CALLBACK}: the pipeline has no fsemicrf_ner component to "
                             f"calibrate (its components: {nlp.pipe_names})")
        first = not examples
        if first:
            examples.append(read_dev_examples(nlp, dev_path))
        for name in names:
            # a poor fit is reported at the first save only, not at every one
            calibrate_component(nlp, name, examples[0], warn_poor_fit=first)
        return nlp

    return calibrate_before_to_disk


# ----------------------------------------------------------------------------- command line


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m spacy_fsemicrf calibrate MODEL DEV.spacy [--output DIR] [--component NAME]
    [--train TRAIN.spacy]``:
    fit the calibration map of a trained pipeline's ``fsemicrf_ner`` components (each its own;
    or only ``--component``) on a development corpus and save the pipeline (in place unless
    ``--output`` is given). Exit status 1 when a component predicts no entity to fit on: its
    map is unchanged, and the pipeline is saved only if another component got one."""
    parser = argparse.ArgumentParser(
        prog="python -m spacy_fsemicrf calibrate",
        description="Fit the score calibration map of a trained fsemicrf_ner pipeline on a "
        "development corpus (never the test set) and save the pipeline with it.",
    )
    parser.add_argument("model", help="the trained pipeline (a directory or a package name)")
    parser.add_argument("dev", type=Path, help="held-out documents with gold entities (a .spacy "
                        "file or a directory of them)")
    parser.add_argument("--output", type=Path, default=None, help="where to save (default: MODEL)")
    parser.add_argument("--component", default=None,
                        help="the fsemicrf_ner component to calibrate (default: every one)")
    parser.add_argument("--train", type=Path, default=None,
                        help="the training corpus (.spacy): record the entity texts seen in "
                        "training, for a pipeline trained before the component recorded them")
    args = parser.parse_args(argv)
    for corpus in (args.dev, args.train):  # before the pipeline loads: that takes a while
        if corpus is not None and not corpus.exists():
            parser.error(f"no such corpus file: {corpus}")
    if not Path(args.model).exists() and not spacy.util.is_package(args.model):
        parser.error(f"no such pipeline: {args.model} (neither a directory nor an installed "
                     "package)")
    output = args.output if args.output is not None else Path(args.model)
    if args.output is None and not output.is_dir():
        parser.error(f"{args.model} is not a directory: give --output")
    if output.exists() and not output.is_dir():  # said before the fit, not when saving after it
        parser.error(f"--output {output} is a file, not a directory")
    try:
        nlp = spacy.load(args.model)
    except Exception as err:  # a directory that is no pipeline is an OSError, a broken one anything
        parser.error(f"cannot load the pipeline {args.model}: {err}")
    names = fsemicrf_components(nlp)
    if not names or (args.component is not None and args.component not in names):
        wanted = f"named {args.component!r}" if args.component is not None else "at all"
        parser.error(f"{args.model} has no fsemicrf_ner component {wanted} (its components: "
                     f"{nlp.pipe_names})")
    if args.component is not None:
        names = [args.component]
    try:
        dev_examples = read_examples(args.dev, nlp)
        train_docs = read_docs(args.train, nlp.vocab) if args.train is not None else None
    except CorpusError as err:
        parser.error(str(err))
    fitted = {}
    for name in names:
        if train_docs is not None:
            nlp.get_pipe(name).record_seen_entities(train_docs)
        fitted[name] = calibrate_component(nlp, name, dev_examples)
    failed = [name for name, value in fitted.items() if value is None]
    for name in failed:
        print(f"{name}: no predicted entity in the annotated documents of {args.dev}; its map "
              f"is unchanged", file=sys.stderr)
    if len(failed) == len(names):
        print("nothing saved", file=sys.stderr)
        return 1
    try:
        nlp.to_disk(output)
    except OSError as err:  # no permission, a parent that is a file, a read-only file system
        print(f"error: cannot save the pipeline to {output}: {err}", file=sys.stderr)
        return 1
    for name, value in fitted.items():
        if value is not None:
            print(f"{name}: calibration map ({value['method']}) fitted on "
                  f"{value['n_entities']} entities of {args.dev} ({value['n_correct']} "
                  f"correct)")
    print(f"saved to {output}")
    return 1 if failed else 0
