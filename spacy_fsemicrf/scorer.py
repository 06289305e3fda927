"""Registered scorer: entity precision, recall and F-score over ``doc.ents``."""
from typing import Any, Callable, Dict, Iterable

from spacy.scorer import get_ner_prf
from spacy.training import Example
from spacy.util import registry

NER_SCORER = "spacy-fsemicrf.ner_scorer.v1"


def ner_score(examples: Iterable[Example], **kwargs) -> Dict[str, Any]:
    """``ents_p``, ``ents_r``, ``ents_f`` and ``ents_per_type``, exactly as spaCy's ``ner``
    scores them (documents without entity annotation in the reference are skipped). Extra keyword
    arguments (the component's cfg) are ignored."""
    return get_ner_prf(examples)


@registry.scorers(NER_SCORER)
def make_ner_scorer() -> Callable[..., Dict[str, Any]]:
    """The ``spacy-fsemicrf.ner_scorer.v1`` scorer, the component's default: :func:`ner_score`."""
    return ner_score
