"""The constraints each document is decoded under: the component's, those given for one call
(``nlp.pipe(..., component_cfg={"fsemicrf_ner": {"constraints": [...]}})``) and the document's
own (``doc.user_data["fsemicrf_constraints"]``), as lists of dicts such as
``{"kind": "at_most", "label": "ORG", "n": 1, "scope": "doc"}`` (see
:mod:`spacy_fsemicrf.structured.constraints` for every kind).

A document's own constraints that do not parse, name a label the component does not know, or
need too many search states together with the component's and the call's are left out with a
warning: one bad document never stops a pipe.

The sentence starts of each document (:func:`sentence_start_flags`) are read here too: the
heads decode no entity across them, and a span forced across one cannot be met.
"""
import logging
from typing import Any, Iterable, List, Optional, Sequence, Tuple

import numpy
from spacy.tokens import Doc

from .structured.constrained import ConstraintReport
from .structured.constraints import (
    Constraint,
    DocConstraints,
    ForbidLabels,
    compile_constraints,
    parse_constraints,
)

logger = logging.getLogger("spacy_fsemicrf")

USER_DATA_KEY = "fsemicrf_constraints"
"""The ``doc.user_data`` key of a document's own constraints."""


def sentence_start_flags(doc: Doc) -> Optional[numpy.ndarray]:
    """One bool per token: whether a sentence starts there (a ``senter``'s, ``parser``'s or
    ``sentencizer``'s boundaries, as ``doc.sents`` reads them); None for a document without
    sentence boundaries."""
    if not doc.has_annotation("SENT_START"):
        return None
    if "sents" in doc.user_hooks:  # a hook's sentences are not in SENT_START: doc.sents has them
        flags = numpy.zeros((len(doc),), dtype="bool")
        flags[[sent.start for sent in doc.sents]] = True
        return flags
    # SENT_START is 1 at a start, -1 (as uint64) inside a sentence, 0 where not set
    return doc.to_array("SENT_START").view("int64") == 1


def sentence_starts(doc: Doc) -> Tuple[int, ...]:
    """The token offsets where the document's sentences start (empty: one sentence)."""
    flags = sentence_start_flags(doc)
    if flags is None or not len(flags):
        return ()
    return (0, *(numpy.flatnonzero(flags[1:]) + 1).tolist())  # the first token starts one


def constraints_of_docs(
    docs: Sequence[Doc],
    shared: Tuple[Constraint, ...],
    labels: Tuple[str, ...],
    component: str,
    own: bool = True,
) -> Optional[List[Optional[DocConstraints]]]:
    """One entry per document (None where it has no constraints), or None when no document
    has any. ``shared`` are the component's and the call's constraints (already checked).
    ``own=False`` (a head without constrained decoding) leaves the documents' own constraints
    out, with a warning for each document that has some."""
    out: List[Optional[DocConstraints]] = []
    for doc in docs:
        if own:
            found = shared + doc_own_constraints(doc, labels, component)
        else:
            found = shared
            if doc.user_data.get(USER_DATA_KEY):
                logger.warning("%s: the constraints in doc.user_data[%r] are left out: the "
                               "filtered head with null_tokens = true has no constrained "
                               "decoding", component, USER_DATA_KEY)
        try:
            program = compile_constraints(found, labels) if found else None
        except ValueError as err:  # valid alone, too many search states together
            logger.warning("%s: the constraints in doc.user_data[%r] are left out: with the "
                           "component's and the call's: %s", component, USER_DATA_KEY, err)
            found = shared
            program = compile_constraints(found, labels) if found else None
        if not found:
            out.append(None)
            continue
        starts = sentence_starts(doc)
        # the entities already on the doc and the blocked tokens keep predicted entities off
        # their tokens (set_entities): the decoder must avoid them, or an entity the
        # constraints need (a forced span, a count) would be left out of doc.ents unsaid; and
        # a span forced across a sentence boundary, where no entity is decoded, cannot hold
        blocked = occupied_runs(doc) + [
            (f.start, f.end + 1) for f in program.forces if crosses_sentence(f, starts)]
        if blocked:
            found = found + tuple(ForbidLabels(start=a, end=b) for a, b in blocked)
            program = compile_constraints(found, labels)
        # entities are trimmed of whitespace after decoding: none may start on it, so that
        # the constraints count the entities written
        spaces = tuple(token.i for token in doc if token.is_space)
        out.append(DocConstraints(program, starts, spaces))
    return out if any(c is not None for c in out) else None


def occupied_runs(doc: Doc) -> List[Tuple[int, int]]:
    """``(start, end)`` of the runs of tokens that an entity already on ``doc`` or a blocked
    token takes (``Doc.set_ents(blocked=...)``), where no predicted entity is written."""
    if not len(doc) or not doc.has_annotation("ENT_IOB"):
        return []
    iob = doc.to_array("ENT_IOB").astype("int64").reshape(-1)
    return true_runs((iob == 1) | (iob == 3))  # inside a preset entity, or blocked


def true_runs(mask: numpy.ndarray) -> List[Tuple[int, int]]:
    """``(start, end)`` of the runs of True in a boolean vector."""
    if not mask.any():
        return []
    padded = numpy.concatenate([[False], mask, [False]]).astype("int8")
    edges = numpy.flatnonzero(numpy.diff(padded))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist()))


def crosses_sentence(force: Any, starts: Sequence[int]) -> bool:
    """Whether a forced span (``start``, ``end`` inclusive) holds a sentence start after its
    first token (``starts``: the document's, :func:`sentence_starts`)."""
    return any(force.start < s <= force.end for s in starts)


def explain_unmet_forces(
    docs: Sequence[Doc],
    reports: Optional[List[Optional[ConstraintReport]]],
    constraints: Optional[List[Optional[DocConstraints]]],
) -> Optional[List[Optional[ConstraintReport]]]:
    """``reports`` where an infeasible document has a forced span on the tokens of an entity
    already on it (or blocked ones) or across a sentence boundary: its reason names that span
    (the first by start, end and label) and why, whatever reason the decoder gave. Such a span
    can never hold, and these are the causes the user's constraints do not show: the decoder
    sees them as the ``forbid_labels`` :func:`constraints_of_docs` added, and may name another
    cause first (another forced span, one past the end, the user's own ``forbid_labels``)."""
    if reports is None or constraints is None:
        return reports
    out = list(reports)
    for d, (doc, report, found) in enumerate(zip(docs, reports, constraints)):
        if report is None or found is None or report.status != "infeasible":
            continue
        runs = occupied_runs(doc)
        occupied = [f for f in found.program.forces
                    if any(f.start < b and f.end >= a for a, b in runs)]
        crossing = [f for f in found.program.forces
                    if crosses_sentence(f, found.sentence_starts)]
        if occupied or crossing:
            f = min(occupied + crossing)  # (start, end, label): whatever order they came in
            why = ("overlaps an entity already on the document or a blocked token"
                   if f in occupied else "crosses a sentence boundary")
            out[d] = report._replace(reason=f"force_span {f.start}..{f.end + 1} {why}")
    return out


def sentence_scope_unsegmented(
    docs: Sequence[Doc], constraints: Optional[List[Optional[DocConstraints]]]
) -> bool:
    """Whether a document of several tokens without sentence boundaries is decoded under a
    constraint of scope ``"sentence"``: the whole document then counts as one sentence."""
    if constraints is None:
        return False
    for doc, found in zip(docs, constraints):
        if found is None or len(doc) < 2 or doc.has_annotation("SENT_START"):
            continue
        if any(getattr(c, "scope", "doc") == "sentence" for c in found.program.constraints):
            return True
    return False


def doc_own_constraints(
    doc: Doc, labels: Tuple[str, ...], component: str, warn: bool = True
) -> Tuple[Constraint, ...]:
    """The constraints in ``doc.user_data``, left out when they are not valid for the
    component's ``labels`` (with a warning, unless ``warn`` is False: a second reading of the
    same document)."""
    items: Any = doc.user_data.get(USER_DATA_KEY)
    if not items:
        return ()
    try:
        own = parse_constraints(items)
        compile_constraints(own, labels)  # names only known labels
    except (TypeError, ValueError) as err:
        if warn:
            logger.warning("%s: the constraints in doc.user_data[%r] are left out: %s",
                           component, USER_DATA_KEY, err)
        return ()
    return own


def check_constraints(items: Optional[Iterable[Any]], labels: Tuple[str, ...]) -> Tuple[Constraint, ...]:
    """Parse constraints given to the component (raise ``ValueError`` on a bad one); with
    ``labels`` (an initialized component), also check that they name known labels."""
    parsed = parse_constraints(items or ())
    if labels:
        compile_constraints(parsed, labels)
    return parsed
