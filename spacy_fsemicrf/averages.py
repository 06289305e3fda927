"""Parameter averaging for the PyTorch head: a workaround for a Thinc bug.

Thinc's :class:`~thinc.api.PyTorchShim` (8.2, 8.3) hands its parameters to the optimizer under
the keys ``(shim id, parameter name)`` but looks for keys ``"pytorch_<id>_<name>"`` in
``use_params``, so with ``use_averages = true`` the averages never reach a PyTorch model: a
pipeline evaluated and saved during training would pair an averaged ``tok2vec`` with the head's
last weights. :class:`HeadShim` reads the keys Thinc actually writes. The reproduction for the
upstream report is :mod:`spacy_fsemicrf.averages_upstream` (``python -m
spacy_fsemicrf.averages_upstream``), the report text ``docs/upstream/thinc_pytorch_shim_averages.md``.
The head's shim (:class:`~.head_model.HeadShim`) uses :func:`use_averaged_params`.
"""
import contextlib
from typing import Any, Dict, Iterator

from thinc.api import PyTorchShim, xp2torch

_THINC_USE_PARAMS = PyTorchShim.use_params


@contextlib.contextmanager
def use_averaged_params(shim: PyTorchShim, params: Dict[Any, Any]) -> Iterator[None]:
    """``PyTorchShim.use_params`` that applies the averages stored under ``(shim.id, name)``;
    keys of Thinc's own form still go to Thinc's implementation."""
    parameters = dict(shim._model.named_parameters())
    averages = {name: params[(shim.id, name)] for name in parameters if (shim.id, name) in params}
    if not averages:
        with _THINC_USE_PARAMS(shim, params):
            yield
        return
    backup = {name: parameters[name].data for name in averages}
    try:
        for name, value in averages.items():
            data = backup[name]
            parameters[name].data = xp2torch(value, device=data.device).to(data.dtype).clone()
        yield
    finally:
        for name, data in backup.items():
            parameters[name].data = data
