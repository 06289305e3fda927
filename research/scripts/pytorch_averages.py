"""Passed to ``spacy train --code`` by research/sweeps/bilstm.json.

PyTorch layers inside spaCy's own components (the BiLSTM of research/configs/ner_cnn_bilstm.cfg)
meet the Thinc bug the fsemicrf head works around: with ``use_averages = true`` their averages
are never applied. This patches Thinc's ``PyTorchShim`` for the training process with the
package's fix (``spacy_fsemicrf.averages``), so that such a baseline trains on the same terms
as the head; pipelines without PyTorch layers or without averaging are unaffected.
"""
from thinc.shims import PyTorchShim

from spacy_fsemicrf.averages import use_averaged_params

PyTorchShim.use_params = use_averaged_params
