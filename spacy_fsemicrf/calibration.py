"""Calibrated entity confidences: a monotone map from a head's raw confidence to the
probability that the entity is correct, fitted on held-out documents.

The map is isotonic regression of the outcomes (correct or not) on the raw confidence,
interpolated between its steps (:func:`fit_calibration`). A head's raw confidences are
probabilities but not calibrated ones, and not in a shape a two-parameter map can fix: the
filtered head's local probabilities stop short of 1 when it is trained with boundary smoothing
(the targets put ``eps`` on null), while the semi-CRFs' marginals pile up at 1. Isotonic
regression fits any non-decreasing shape and keeps the order of the raw confidences, so
thresholding a calibrated score is thresholding the raw one. The map is stored in the
component's ``cfg`` (saved with the pipeline), so a loaded pipeline gives calibrated scores.

Fitting it:

* during ``spacy train``, with the ``spacy-fsemicrf.calibrate.v1`` callback in
  ``[training.before_to_disk]``: every saved pipeline (``model-last``, hence ``model-best``)
  carries a map fitted on the dev corpus;
* for a trained pipeline: ``python -m spacy_fsemicrf calibrate MODEL DEV.spacy``;
* from Python: :func:`calibrate_component`.

Only the documents given are read: fit on a development split, never on the test set. A few
hundred predicted entities make a usable map; a few thousand a good one.
"""
import argparse
import logging
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

import numpy
import spacy
from spacy.language import Language
from spacy.tokens import Doc, DocBin
from spacy.util import minibatch, registry

from .structured.confidences import split_rows

logger = logging.getLogger("spacy_fsemicrf")

PREDICT_BATCH = 64


def fit_calibration(raw: numpy.ndarray, correct: numpy.ndarray) -> Dict[str, Any]:
    """Fit the calibration map ``P(correct | raw)`` to held-out outcomes and return it as a
    JSON-serializable dict.

    Isotonic regression (pool adjacent violators): the non-decreasing step function of the raw
    confidence closest to the outcomes. Each step (block of entities) becomes a knot at its
    mean raw confidence, valued by its share of correct entities shrunk towards the share of
    all of them, ``(correct + 2 * share) / (entities + 2)`` (the mean under a Beta prior worth
    two entities), so that no score is 0 or 1 because a small block happened to be all right or
    all wrong; the map interpolates linearly between knots (and is flat beyond them), so it
    keeps the order of the raw confidences within a step too."""
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
    return {
        "method": "isotonic",
        "x": at[last].tolist(),
        "y": numpy.round(scores[last], 6).tolist(),
        "n_entities": int(x.size),
        "n_correct": int(y.sum()),
    }


def apply_calibration(calibration: Optional[Dict[str, Any]], raw: numpy.ndarray) -> numpy.ndarray:
    """The calibrated confidences (float32) of the ``raw`` ones; ``raw`` itself without a map."""
    raw = numpy.asarray(raw, dtype="float32")
    if not calibration or raw.size == 0 or not calibration["x"]:
        return raw
    return numpy.interp(raw, calibration["x"], calibration["y"]).astype("float32")


def check_calibration(calibration: Any) -> Optional[Dict[str, Any]]:
    """``calibration`` if it is None or a valid map, else a ``ValueError`` saying why."""
    if calibration is None:
        return None
    try:
        x = numpy.asarray(calibration["x"], dtype="float64")
        y = numpy.asarray(calibration["y"], dtype="float64")
        ok = (
            calibration["method"] == "isotonic"
            and x.ndim == 1 and x.shape == y.shape
            and bool(numpy.isfinite(x).all() and (numpy.diff(x) > 0).all())
            and bool(((y >= 0) & (y <= 1)).all() and (numpy.diff(y) >= 0).all())
        )
    except (TypeError, KeyError, ValueError):
        ok = False
    if not ok:
        raise ValueError(
            "A calibration map is a dict with method 'isotonic', knots 'x' (increasing) and "
            f"their scores 'y' (non-decreasing, in [0, 1]), got {calibration!r}"
        )
    return calibration


# ----------------------------------------------------------------------------- fitting


def read_docs(path: Union[str, Path], vocab) -> List[Doc]:
    """The documents of a ``.spacy`` file (DocBin)."""
    return list(DocBin().from_disk(path).get_docs(vocab))


def unannotated(doc: Doc) -> Doc:
    """A copy of ``doc`` with its tokens only (what a pipeline sees at prediction)."""
    return Doc(doc.vocab, words=[t.text for t in doc], spaces=[bool(t.whitespace_) for t in doc])


def raw_outcomes(
    nlp: Language, component: str, gold_docs: Iterable[Doc]
) -> Tuple[numpy.ndarray, numpy.ndarray]:
    """``(raw confidences, correct)`` of every entity ``component`` predicts on the tokens of
    ``gold_docs`` (before any threshold), correct when its span and label are a gold entity."""
    pipe = nlp.get_pipe(component)
    before = nlp.pipe_names[: nlp.pipe_names.index(component)]
    raws: List[numpy.ndarray] = []
    correct: List[bool] = []
    for batch in minibatch(list(gold_docs), PREDICT_BATCH):
        with nlp.select_pipes(enable=before):
            docs = list(nlp.pipe(unannotated(doc) for doc in batch))
        out = split_rows(*pipe.predict(docs))
        raws.append(out.confidences)
        labels = pipe.labels
        gold = [{(e.start, e.end - 1, e.label_) for e in doc.ents} for doc in batch]
        correct.extend(
            (start, end, labels[label - 1]) in gold[i] for i, start, end, label in out.entities.tolist()
        )
    raw = numpy.concatenate(raws) if raws else numpy.zeros((0,), dtype="float32")
    return raw, numpy.asarray(correct, dtype=bool)


def calibrate_component(nlp: Language, component: str, gold_docs: Iterable[Doc]) -> Dict[str, Any]:
    """Fit the calibration map of ``nlp``'s ``component`` on the held-out ``gold_docs`` (with
    their gold entities), store it in the component and return it."""
    pipe = nlp.get_pipe(component)
    if not hasattr(pipe, "calibration"):
        raise ValueError(f"'{component}' is not an fsemicrf_ner component")
    raw, correct = raw_outcomes(nlp, component, gold_docs)
    if raw.size == 0:
        logger.warning("%s: no predicted entities to calibrate on; the map is unchanged", component)
        return pipe.calibration
    pipe.calibration = fit_calibration(raw, correct)
    return pipe.calibration


@registry.callbacks("spacy-fsemicrf.calibrate.v1")
def make_calibrate_callback(
    dev_path: Union[str, Path], component: str = "fsemicrf_ner"
) -> Callable[[Language], Language]:
    """A ``[training.before_to_disk]`` callback: before each save, fit ``component``'s
    calibration map on the documents of ``dev_path`` (give it ``${paths.dev}``; it reads only
    that file, once)."""
    docbin: List[DocBin] = []

    def calibrate_before_to_disk(nlp: Language) -> Language:
        if not docbin:
            docbin.append(DocBin().from_disk(dev_path))
        calibrate_component(nlp, component, docbin[0].get_docs(nlp.vocab))
        return nlp

    return calibrate_before_to_disk


# ----------------------------------------------------------------------------- command line


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m spacy_fsemicrf calibrate MODEL DEV.spacy [--output DIR] [--component NAME]``:
    fit the calibration map of a trained pipeline on a development corpus and save the
    pipeline (in place unless ``--output`` is given)."""
    parser = argparse.ArgumentParser(
        prog="python -m spacy_fsemicrf calibrate",
        description="Fit the score calibration map of a trained fsemicrf_ner pipeline on a "
        "development corpus (never the test set) and save the pipeline with it.",
    )
    parser.add_argument("model", help="the trained pipeline (a directory or a package name)")
    parser.add_argument("dev", type=Path, help="held-out documents with gold entities (.spacy)")
    parser.add_argument("--output", type=Path, default=None, help="where to save (default: MODEL)")
    parser.add_argument("--component", default=None, help="the fsemicrf_ner component's name")
    args = parser.parse_args(argv)
    output = args.output if args.output is not None else Path(args.model)
    if args.output is None and not output.is_dir():
        parser.error(f"{args.model} is not a directory: give --output")
    nlp = spacy.load(args.model)
    names = [n for n in nlp.pipe_names if nlp.get_pipe_meta(n).factory == "fsemicrf_ner"]
    if args.component is not None:
        names = [args.component]
    if len(names) != 1:
        parser.error(f"name the component to calibrate with --component (found {names})")
    fitted = calibrate_component(nlp, names[0], read_docs(args.dev, nlp.vocab))
    nlp.to_disk(output)
    print(f"{names[0]}: calibration map fitted on {fitted['n_entities']} entities of {args.dev} "
          f"({fitted['n_correct']} correct, {len(fitted['x'])} knots), saved to {output}")
    return 0
