"""spaCy pipeline component for named entity recognition with a Filtered Semi-Markov CRF
(Zaratiana et al., 2023), plus exact semi-CRF and linear-chain CRF baselines.

Importing the package registers the ``fsemicrf_ner`` factory, the ``spacy-fsemicrf.*``
architectures, the ``spacy-fsemicrf.ner_scorer.v1`` scorer and the
``spacy-fsemicrf.entity_token_replacement.v1`` augmenter (the entry points in setup.cfg
make spaCy find them without an import).

``spacy_fsemicrf.structured`` needs only PyTorch: without spaCy installed, the package imports
and the structured layer works; only the spaCy layer is missing.
"""
__version__ = "0.1.0"

from . import fork_safety  # noqa: E402,F401  (forked workers run PyTorch on one thread)

try:
    import spacy  # noqa: F401
except ImportError:  # the structured layer alone, for research use without spaCy
    pass
else:
    from .msgpack_lookups import remember_msgpack_lookups

    remember_msgpack_lookups()  # every process that may hold a pipeline, before it forks
    from .augment import create_entity_token_replacement
    from .architectures import ModelInput, build_filtered_semicrf, build_linear_crf, build_semicrf
    from .component import DEFAULT_MODELS, FSemiCRFEntityRecognizer, make_fsemicrf_ner
    from .scorer import make_ner_scorer, ner_score

__all__ = [
    "DEFAULT_MODELS",
    "ModelInput",
    "FSemiCRFEntityRecognizer",
    "make_fsemicrf_ner",
    "build_filtered_semicrf",
    "build_semicrf",
    "build_linear_crf",
    "create_entity_token_replacement",
    "make_ner_scorer",
    "ner_score",
    "__version__",
]
