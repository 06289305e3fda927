"""Entity token replacement: a training-data augmenter for spaCy corpora.

Each token inside a gold entity is replaced, with probability ``level``, by a token drawn from
the entities of the same label seen so far in the training stream (label-wise token
replacement, Dai and Adel, 2020, restricted to entity tokens). The entities keep their label
and token positions, so the model sees names it has not seen, in the contexts where names of
that label occur. Use it in a config:

    [corpora.train.augmenter]
    @augmenters = "spacy-fsemicrf.entity_token_replacement.v1"
    level = 0.3

Tokens whose entity annotation is missing stay missing (and tokens annotated as outside any
entity stay O), as in spaCy's own augmenters. A replacing token brings its lemma (missing where
its own document had none); the tags, the parse and the sentence starts stay. An augmented
example's reference doc carries ``user_data[AUGMENTED] = True``, so that the component does not
count its made-up names among the entities seen in training, and
``user_data[ORIGINAL_ENTITIES]``, the texts of the entities of the example it was made from,
which the component counts instead: they are real training names.
"""
from __future__ import annotations

import numbers
import random
from typing import Any, Callable, Dict, Iterator, List, Tuple

from spacy.language import Language
from spacy.tokens import Doc
from spacy.training import Example
from spacy.training.iob_utils import doc_to_biluo_tags
from spacy.util import registry

AUGMENTED = "spacy_fsemicrf.augmented"
ORIGINAL_ENTITIES = "spacy_fsemicrf.original_entities"


@registry.augmenters("spacy-fsemicrf.entity_token_replacement.v1")
def create_entity_token_replacement(
    level: float = 0.3, pool_size: int = 5000
) -> Callable[[Language, Example], Iterator[Example]]:
    """An augmenter that replaces each entity token with probability ``level`` (in [0, 1]) by an
    entity token of the same label drawn from a pool of at most ``pool_size`` (at least 1) per
    label, filled from the examples as they stream by (this one's included) and
    reservoir-sampled. Tokens without entity annotation keep it missing in the augmented
    example."""
    if not 0.0 <= level <= 1.0:
        raise ValueError(f"level must be between 0 and 1, got {level!r}")
    # (NaN passed a plain `< 1` and left every pool empty: an IndexError at the first entity)
    if not isinstance(pool_size, numbers.Integral) or pool_size < 1:
        raise ValueError(f"pool_size must be a whole number of at least 1, got {pool_size!r}")
    pools: Dict[str, List[Tuple[str, str]]] = {}  # (text, lemma) of entity tokens, by label
    seen: Dict[str, int] = {}

    def remember(label: str, token: Tuple[str, str]) -> None:
        pool = pools.setdefault(label, [])
        seen[label] = seen.get(label, 0) + 1
        if len(pool) < pool_size:
            pool.append(token)
        else:  # reservoir sampling: every token seen so far is in the pool equally likely
            at = random.randrange(seen[label])
            if at < pool_size:
                pool[at] = token

    def augment(nlp: Language, example: Example) -> Iterator[Example]:
        if not level:  # a no-op, down to the random numbers it draws
            yield example
            return
        reference = example.reference
        entity_tokens = [(token.i, ent.label_) for ent in reference.ents for token in ent
                         if not token.is_space]
        for i, label in entity_tokens:
            remember(label, (reference[i].text, reference[i].lemma_))
        words = [token.text for token in reference]
        lemmas = [token.lemma_ for token in reference]
        changed = False
        for i, label in entity_tokens:
            if random.random() < level:
                word, lemma = random.choice(pools[label])
                if word != reference[i].text:
                    # the lemma of the token replaced would be a wrong lemma of the new one
                    words[i], lemmas[i] = word, lemma
                    changed = True
        if not changed:
            yield example
            return
        data = example.to_dict()
        # to_dict writes tokens without entity annotation as O: keep them missing
        data["doc_annotation"]["entities"] = _entity_tags(reference)
        spaces = data["token_annotation"]["SPACY"]
        data["token_annotation"]["ORTH"] = words
        data["token_annotation"]["LEMMA"] = lemmas
        _move_char_offsets(data["doc_annotation"], reference, words, spaces)
        text = "".join(w + (" " if space else "") for w, space in zip(words, spaces))
        augmented = Example.from_dict(nlp.make_doc(text), data)
        if not reference.has_annotation("DEP"):
            # from_dict takes the sentence starts from the heads, which to_dict writes even
            # without a parse (each token its own head): those of the reference were dropped
            for token, original in zip(augmented.reference, reference):
                token.is_sent_start = original.is_sent_start
        augmented.reference.user_data[AUGMENTED] = True
        # the example is replaced, not joined, by its variant: without these, the names of most
        # training documents would never count as seen (an example already augmented keeps
        # the names of the one it was made from)
        augmented.reference.user_data[ORIGINAL_ENTITIES] = reference.user_data.get(
            ORIGINAL_ENTITIES, [ent.text for ent in reference.ents])
        yield augmented

    return augment


def _entity_tags(doc: Doc) -> List[str]:
    """The BILUO tags of ``doc``'s entities, with ``"-"`` for tokens whose entity annotation is
    missing and ``"O"`` for those annotated as outside any entity, as spaCy's own augmenters
    write them."""
    tags = doc_to_biluo_tags(doc, missing="-")
    # ENT_IOB 2 is an annotated O; 0 (missing) keeps the "-" it got for lying outside doc.ents
    return ["O" if token.ent_iob == 2 else tag for token, tag in zip(doc, tags)]


def _move_char_offsets(
    doc_annotation: Dict[str, Any], reference: Doc, words: List[str], spaces: List[bool]
) -> None:
    """Span groups and entity links are given by character offsets, which the new token texts
    shift: map each to the same tokens of the new text."""
    starts, ends = {}, {}
    offset = 0
    for token, word, space in zip(reference, words, spaces):
        starts[token.idx] = offset
        ends[token.idx + len(token)] = offset + len(word)
        offset += len(word) + int(space)

    def moved(start: int, end: int) -> Tuple[int, int]:
        return starts[start], ends[end]

    for key, spans in doc_annotation.get("spans", {}).items():
        doc_annotation["spans"][key] = [(*moved(s, e), *rest) for s, e, *rest in spans]
    links = doc_annotation.get("links", {})
    doc_annotation["links"] = {moved(*span): kb for span, kb in links.items()}
