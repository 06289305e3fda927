"""The gold entities of a training example, as the component trains on them.

An entity of the reference is trained on as annotated when its edges are token edges of the
predicted document (the pipeline's tokenizer may split the text otherwise than the corpus) and,
for a span head, when it is at most ``max_width`` tokens wide; the others are left out and
their tokens read as unknown (:func:`~.partial.known_tokens`). ``debug-data`` reports the same
split, so that what it counts is what training does. With ``incorrect_spans_key``, the spans
of ``reference.spans[key]`` are entities known to be wrong (:func:`incorrect_entities`). A
label none of whose entities is trained on, or with none at all, is not learned
(:func:`unlearned_reason` says why).
"""
from typing import Container, List, NamedTuple, Optional

from spacy.tokens import Span
from spacy.training import Example


class ExampleEntities(NamedTuple):
    """The reference entities of one example, split as training reads them."""

    kept: List[Span]  # spans of the predicted document, trained on
    misaligned: List[Span]  # spans of the reference: no token edges of the predicted document
    wide: List[Span]  # spans of the predicted document wider than the limit


def example_entities(eg: Example, limit: Optional[int]) -> Optional[ExampleEntities]:
    """The entities of ``eg.reference`` split into kept, misaligned and wide ones (wider than
    ``limit`` tokens; no limit for None), or None when the reference has no entity annotation
    (training reads nothing from it)."""
    ref = eg.reference
    if not ref.has_annotation("ENT_IOB"):
        return None
    ents = ref.ents
    aligned = eg.get_aligned_spans_y2x(ents, allow_overlap=False)
    misaligned: List[Span] = []
    if len(aligned) < len(ents):  # which ones, one by one (rare: a tokenizer mismatch)
        misaligned = [e for e in ents if not eg.get_aligned_spans_y2x([e])]
    if limit is None:
        return ExampleEntities(list(aligned), misaligned, [])
    kept = [ent for ent in aligned if len(ent) <= limit]
    wide = [ent for ent in aligned if len(ent) > limit]
    return ExampleEntities(kept, misaligned, wide)


def incorrect_entities(
    eg: Example, key: Optional[str], labels: Container[str], limit: Optional[int]
) -> List[Span]:
    """The entities known to be wrong of ``eg`` (``eg.reference.spans[key]``, as spaCy's
    ``ner`` reads them for ``incorrect_spans_key``) as spans of the predicted document, but
    those a component with ``labels`` and the width limit ``limit`` could never predict, which
    say nothing to learn: a label it does not have, edges that are no token edges of the
    predicted document, a width beyond ``limit``."""
    if key is None or key not in eg.reference.spans or not len(eg.reference.spans[key]):
        return []
    aligned = eg.get_aligned_spans_y2x(eg.reference.spans[key], allow_overlap=True)
    return [span for span in aligned
            if span.label_ in labels and (limit is None or len(span) <= limit)]


def unlearned_reason(
    label: str, where: str, max_width: int, widest: Optional[int], misaligned: bool
) -> str:
    """Why the label ``label`` is not learned from ``where`` (the examples read, as "the
    initialization examples"): every gold entity of it there was left out, as wider than
    ``max_width`` (the widest ``widest`` tokens, None if none is) or with an edge off the
    predicted tokens (``misaligned``), or, with neither, it has none; what training must read
    to learn it, and what would mend it: the component's warnings and ``debug-data`` name such
    a label in these words."""
    if widest is None and not misaligned:
        return (f"the label {label!r} has no gold entity in {where}, so it is not "
                f"learned and never predicted (until training reads one). Remove it from the "
                f"labels the component is given, or add examples annotated with it.")
    why, need, keep = [], [], []
    if widest is not None:
        why.append(f"is wider than max_width={max_width} tokens")
        need.append(f"at most {max_width} tokens wide")
        keep.append(f"max_width={widest}")
    if misaligned:
        why.append("has an edge inside a token of the documents the pipeline predicts on "
                   "(the pipeline's tokenizer splits the text otherwise than the corpus)")
        need.append("on token edges")
        keep.append("[corpora.train] gold_preproc = true (training on the corpus's tokens) "
                    "or a tokenizer that splits as the corpus does")
    which = ["them"] if len(keep) == 1 else ["the wide ones", "the others"]
    return (f"every gold entity of the label {label!r} in {where} {' or '.join(why)}, so the "
            f"label is not learned and never predicted (until training reads one "
            f"{' '.join(need)}). "
            + "; ".join(f"{fix} would keep {them}" for fix, them in zip(keep, which)) + ".")
