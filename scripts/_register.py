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
else:
    # PyTorch layers inside spaCy's own components (the BiLSTM of configs/baselines/
    # ner_cnn_bilstm.cfg) meet the Thinc bug the fsemicrf head works around: with
    # use_averages = true their averages are never applied. Training runs of this repository
    # apply them everywhere, so that such a baseline trains on the same terms as the head;
    # pipelines without PyTorch layers or without averaging are unaffected.
    from thinc.shims import PyTorchShim

    from spacy_fsemicrf.torch_bridge import use_averaged_params

    PyTorchShim.use_params = use_averaged_params
