"""Passed to `spacy train --code`: makes the in-repo `spacy_fsemicrf` registrations available
even when the package is not pip-installed (installed entry points work as well)."""
import sys
from pathlib import Path

_root = str(Path(__file__).resolve().parent.parent)
if _root not in sys.path:
    sys.path.insert(0, _root)
try:  # the baselines (ner, spancat) do not need it
    import spacy_fsemicrf  # noqa: F401
except ImportError as err:  # pragma: no cover
    if "spacy_fsemicrf" not in str(err):
        raise
