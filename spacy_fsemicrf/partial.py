"""Which tokens of a training example have entity annotation.

spaCy's ``ner`` reads a token without entity annotation (``ENT_IOB`` 0, ``-`` in BILUO) as
unknown: the loss claims nothing about it. So do the heads given ``known`` (False at such a
token), and the component marks unknown too the tokens of a gold entity it cannot train on as
annotated: one whose edges are no token edges of the predicted document, or one wider than a
span head's ``max_width``.
"""
from typing import Iterable, Optional

import numpy
from spacy.tokens import Span
from spacy.training import Example


def known_tokens(
    eg: Example, misaligned: Iterable[Span] = (), wide: Iterable[Span] = ()
) -> Optional[numpy.ndarray]:
    """One bool per token of ``eg.predicted``: True where the reference annotates it, False
    on a token aligned to a reference token without entity annotation or to one of the
    ``misaligned`` entities (spans of the reference), and on the tokens of the ``wide`` ones
    (spans of the predicted document). A whitespace token is known but in a wide entity: as
    spaCy's ``ner``, which reads it as outside any entity. None when every token is known,
    which costs a fully annotated example one pass over its reference's ``ENT_IOB``."""
    known_y = eg.reference.to_array("ENT_IOB").reshape(-1) != 0
    for span in misaligned:
        known_y[span.start : span.end] = False
    wide = list(wide)
    if known_y.all() and not wide:
        return None
    x2y = eg.alignment.x2y
    lengths, targets = numpy.asarray(x2y.lengths), numpy.asarray(x2y.data).reshape(-1)
    # unknown reference tokens per predicted token, from prefix sums over the alignment
    cum = numpy.concatenate([[0], numpy.cumsum(~known_y[targets])])
    starts = numpy.concatenate([[0], numpy.cumsum(lengths)[:-1]]).astype("int64")
    known = cum[starts + lengths] == cum[starts]
    known |= eg.predicted.to_array("IS_SPACE").reshape(-1).astype(bool)
    for span in wide:
        known[span.start : span.end] = False
    return None if known.all() else known
