"""spaCy pipeline component for named entity recognition with a Filtered Semi-Markov CRF
(Zaratiana et al., 2023), plus exact semi-CRF and linear-chain CRF baselines.

spaCy finds the ``fsemicrf_ner`` factory, the ``spacy-fsemicrf.*`` architectures, the
``spacy-fsemicrf.ner_scorer.v1`` scorer, the ``spacy-fsemicrf.calibrate.v1`` callback and the
``spacy-fsemicrf.entity_token_replacement.v1`` augmenter through the entry points in setup.cfg;
importing the module that defines one registers it as well.

The names below are imported on first use, so that ``spacy_fsemicrf.structured``, which needs
only PyTorch, imports neither spaCy nor Thinc: a researcher can use the structured layer alone,
with or without spaCy installed.
"""
import importlib
from typing import Any, Dict, List

__version__ = "0.1.0"

# public name -> the module that defines it
_LAZY: Dict[str, str] = {
    "DEFAULT_MODELS": "component",
    "FSemiCRFEntityRecognizer": "component",
    "make_fsemicrf_ner": "component",
    "ModelInput": "architectures",
    "build_filtered_semicrf": "architectures",
    "build_semicrf": "architectures",
    "build_linear_crf": "architectures",
    "create_entity_token_replacement": "augment",
    "make_ner_scorer": "scorer",
    "ner_score": "scorer",
}

__all__ = [*_LAZY, "__version__"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_LAZY))
