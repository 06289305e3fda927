"""Reproduction for an upstream Thinc report: PyTorchShim never applies parameter averages.

``PyTorchShim.finish_update`` hands each parameter to the optimizer under the key
``(shim.id, name)``, so ``optimizer.averages`` holds the running averages under those tuple
keys; ``PyTorchShim.use_params`` only reads keys of the form ``"pytorch_<id>_<name>"``, finds
none, and leaves the live weights in place. A spaCy pipeline trained with
``use_averages = true`` therefore evaluates and saves a PyTorch component with its last
weights (next to an averaged tok2vec). Needs only thinc and torch:

    python -m spacy_fsemicrf.averages_upstream

Prints the largest difference between the weights seen inside ``use_params(averages)`` and the
averages themselves: 0 if the averages are applied.
"""
import numpy
import thinc
import torch
from thinc.api import Adam, PyTorchWrapper

torch.manual_seed(0)
model = PyTorchWrapper(torch.nn.Linear(4, 3))
optimizer = Adam(0.1, use_averages=True)
X = numpy.random.default_rng(0).normal(size=(8, 4)).astype("float32")
for _ in range(5):
    Y, backprop = model.begin_update(X)
    backprop(Y - 1.0)  # gradient of 0.5 * ||Y - 1||^2
    model.finish_update(optimizer)

shim = model.shims[0]
averaged = {key[1]: value for key, value in optimizer.averages.items()
            if isinstance(key, tuple) and key[0] == shim.id}
print(f"thinc {thinc.__version__}, torch {torch.__version__}")
print("average keys:", sorted(map(str, optimizer.averages)))
with model.use_params(optimizer.averages):
    inside = {name: p.detach().numpy().copy() for name, p in shim._model.named_parameters()}
gap = max(float(numpy.abs(inside[name] - averaged[name]).max()) for name in averaged)
print(f"max |weight inside use_params - average| = {gap:.4f}",
      "(averages applied)" if gap == 0 else "(averages NOT applied)")
