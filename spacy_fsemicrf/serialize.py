"""Bytes of a PyTorch head: its description (architecture, settings, input width, number of
labels) next to its ``state_dict``, so that loading rebuilds the head before loading the weights
and a saved head that the current config would not build fails with a clear error.

Loading reads the weights with ``torch.load(..., weights_only=True)``: a pipeline's files never
run code.
"""
import inspect
import pickle
from io import BytesIO
from typing import Any, Dict

import srsly
import torch

from .structured.heads import HEADS

SERIAL_FORMAT = 1
"""Version of the byte format written by :func:`serialize_head`."""


class UninitializedHead(torch.nn.Module):
    """Placeholder held by the shim until the labels are known. It has no parameters, so the
    shim's device falls back to Thinc's current ops."""

    def forward(self, *args: Any, **kwargs: Any) -> None:  # pragma: no cover - guarded earlier
        raise ValueError(
            "The fsemicrf_ner model has not been initialized: call nlp.initialize() "
            "(or train the pipeline) before using it."
        )


def instantiate_head(
    arch: str, kwargs: Dict[str, Any], input_width: int, n_labels: int
) -> torch.nn.Module:
    """Build the head of ``arch`` and remember its description for :func:`serialize_head`."""
    if n_labels < 1:
        raise ValueError("The fsemicrf_ner head needs at least one entity label.")
    if arch not in HEADS:
        raise ValueError(f"Unknown head {arch!r}; expected one of {sorted(HEADS)}")
    # float32 whatever torch's default dtype (torch.set_default_dtype): the head is handed the
    # float32 vectors of the tok2vec and is trained by Thinc's float32 optimizer
    head = HEADS[arch](input_width, n_labels, **kwargs).float()
    head.fsemicrf_spec = {
        "arch": arch,
        "kwargs": dict(kwargs),
        "input_width": input_width,
        "n_labels": n_labels,
    }
    return head


def serialize_head(module: torch.nn.Module) -> bytes:
    """Shim serializer: the head's description plus its ``state_dict``."""
    spec = getattr(module, "fsemicrf_spec", None)
    if isinstance(module, UninitializedHead) or spec is None:
        return srsly.msgpack_dumps({"format": SERIAL_FORMAT, "initialized": False})
    buf = BytesIO()
    torch.save(module.state_dict(), buf)
    msg = {"format": SERIAL_FORMAT, "initialized": True, "state": buf.getvalue()}
    msg.update(spec)
    return srsly.msgpack_dumps(msg)


# Head settings that shape neither the weights nor the prediction, only further training: a
# config may change them for a loaded pipeline (say, another dropout to fine-tune it).
TRAINING_ONLY = frozenset(
    {"dropout", "null_weight", "boundary_smoothing", "train_margin", "exact_loss", "focal_gamma"}
)


def _head_defaults(arch: str) -> Dict[str, Any]:
    """The keyword defaults of a head class: a saved head whose record lacks a setting was
    built with its default, so it loads under a config that gives that value."""
    if arch not in HEADS:
        return {}
    params = inspect.signature(HEADS[arch].__init__).parameters.values()
    return {p.name: p.default for p in params
            if p.kind is p.KEYWORD_ONLY and p.default is not inspect.Parameter.empty}


def deserialize_head(
    spec: Dict[str, Any], module: torch.nn.Module, data: bytes, device: "torch.device"
) -> torch.nn.Module:
    """Shim deserializer: rebuild the head described in ``data`` and load its weights.

    ``spec`` (``{"arch", "kwargs"}``) is what the current config builds; a saved head of another
    architecture or with other settings raises a ``ValueError`` naming the differences; weights
    that do not fit the head its record describes raise one saying so."""
    try:
        msg = srsly.msgpack_loads(data)
    except Exception:
        msg = None
    if not isinstance(msg, dict) or "initialized" not in msg:
        raise ValueError(
            "Cannot load the fsemicrf_ner head: the saved data was not written by "
            "spacy-fsemicrf (was the pipeline trained with another model architecture?)"
        )
    if not msg["initialized"]:
        return UninitializedHead().to(device)
    problems = []
    if msg["arch"] != spec["arch"]:
        problems.append(f"architecture {msg['arch']!r} (config: {spec['arch']!r})")
    saved_kwargs = {**_head_defaults(msg["arch"]), **msg["kwargs"]}
    for key in sorted(set(msg["kwargs"]) | set(spec["kwargs"])):
        saved, current = saved_kwargs.get(key, "<unset>"), spec["kwargs"].get(key, "<unset>")
        if saved != current and not (key in TRAINING_ONLY and key in spec["kwargs"]):
            problems.append(f"{key} = {saved!r} (config: {current!r})")
    if problems:
        raise ValueError(
            "Cannot load the fsemicrf_ner model: it was trained with a different head "
            "configuration than the one in the current config: " + "; ".join(problems)
            + ". Load the pipeline with the config it was trained with."
        )
    # the config's training settings apply from now on (same architecture, same weights)
    saved_kwargs.update({k: v for k, v in spec["kwargs"].items() if k in TRAINING_ONLY})
    head = instantiate_head(msg["arch"], saved_kwargs, int(msg["input_width"]), int(msg["n_labels"]))
    try:
        state = torch.load(BytesIO(msg["state"]), map_location=device, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as err:
        raise ValueError(
            "Cannot load the fsemicrf_ner head: its weights are damaged, or hold more than "
            "tensors, which are refused (loading a pipeline never runs code from its files). "
            f"Save the pipeline again, or reinstall its package ({type(err).__name__})."
        ) from err
    try:
        head.load_state_dict(state)
    except (RuntimeError, TypeError) as err:  # missing, unexpected or other-shaped tensors
        raise ValueError(
            "Cannot load the fsemicrf_ner head: its weights do not fit the head its record "
            f"describes ({' '.join(str(err).split()).rstrip('.')}). Save the pipeline again, "
            "or reinstall its package."
        ) from err
    # in eval mode, as predictions need it: a loaded pipeline that serves several threads
    # then never switches modes under one of them (training switches to training mode itself)
    return head.to(device).eval()
