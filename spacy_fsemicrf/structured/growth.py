"""Growing a trained head by new entity labels, numbered after the existing ones.

A head's label-shaped weights (output rows, transitions, mean-field compatibilities) are copied
to the positions their labels take in the larger head; what the new labels add starts at zero,
so every existing label keeps its scores. spaCy's ``ner`` grows its output layer the same way
when a resumed pipeline meets a new label.

A new label's outputs hold the bias :data:`UNTRAINED_BIAS` until the head first trains on a gold
entity of it (:func:`wake_outputs`): until then the label scores far below every trained one and
the grown head predicts as before (spaCy's ``ner`` masks a new label's actions until it has seen
it in training). The bias is the state itself, so a grown pipeline saved before training keeps it.
"""
from typing import List, Optional, Sequence

import torch
from torch import nn


def placed(old: torch.Tensor, index: Sequence[int], size: int, dims: int = 1) -> torch.Tensor:
    """A zero tensor like ``old`` with ``size`` entries along each of its first ``dims`` axes,
    holding ``old`` at the positions ``index`` along them (``old``'s entry ``i`` at
    ``index[i]``)."""
    if len(index) != old.shape[0] or len(set(index)) != len(index):
        raise ValueError(f"index must give {old.shape[0]} distinct positions, got {list(index)}")
    if min(index, default=0) < 0 or max(index, default=0) >= size:
        raise ValueError(f"index must lie in [0, {size}), got {list(index)}")
    at = torch.as_tensor(list(index), dtype=torch.long, device=old.device)
    new = old.new_zeros((size,) * dims + tuple(old.shape[dims:]))
    if dims == 1:
        new[at] = old
    elif dims == 2:
        new[at.unsqueeze(1), at.unsqueeze(0)] = old
    else:
        raise ValueError(f"dims must be 1 or 2, got {dims}")
    return new


def grow_parameter(module: nn.Module, name: str, index: Sequence[int], size: int,
                   dims: int = 1) -> None:
    """Replace ``module``'s parameter ``name`` by :func:`placed` of it (its gradient flag
    kept, and the gradient accumulated so far placed alike: spaCy's ``accumulate_gradient``
    steps once after several updates); a parameter that is None stays None."""
    old: Optional[nn.Parameter] = getattr(module, name)
    if old is None:
        return
    grown = nn.Parameter(placed(old.detach(), index, size, dims), requires_grad=old.requires_grad)
    if old.grad is not None:
        grown.grad = placed(old.grad, index, size, dims)
    setattr(module, name, grown)


def grow_linear(layer: nn.Linear, index: Sequence[int], size: int,
                new_bias: Optional[torch.Tensor] = None) -> None:
    """Give ``layer`` ``size`` outputs, its output ``i`` at ``index[i]``; the new outputs get
    zero weights and a zero bias, or ``new_bias`` (one value for each new output, in order)."""
    grow_parameter(layer, "weight", index, size)
    grow_parameter(layer, "bias", index, size)
    layer.out_features = size
    if new_bias is not None and layer.bias is not None:
        fresh = sorted(set(range(size)) - set(index))
        if new_bias.numel() != len(fresh):
            raise ValueError(f"new_bias must give {len(fresh)} values, got {new_bias.numel()}")
        with torch.no_grad():
            layer.bias[fresh] = new_bias.to(layer.bias)


UNTRAINED_BIAS = -1e4
"""The bias of a new label's outputs until the head trains on it: far below any trained bias,
and within float16's range (mixed precision)."""


def untrained(bias: torch.Tensor) -> torch.Tensor:
    """Which entries of ``bias`` belong to a new label the head has not trained on yet."""
    return bias <= UNTRAINED_BIAS / 2


def labels_to_wake(layer: nn.Linear, gold: torch.Tensor, n_labels: int) -> List[int]:
    """The labels ``1..n_labels`` of the ``gold`` rows ``(doc, start, end, label)``, if
    ``layer`` has untrained outputs (else none, without reading ``gold``)."""
    if layer.bias is None or not bool(untrained(layer.bias.detach()).any()):
        return []
    if gold.dim() != 2 or gold.shape[-1] != 4:  # (the head's checks say what is wrong)
        return []
    return [int(label) for label in gold[:, 3].unique().tolist() if 1 <= label <= n_labels]


def wake_outputs(layer: nn.Linear, entity_outputs: Sequence[int], woken: Sequence[int]) -> int:
    """Give the untrained outputs among ``woken`` of ``layer`` (those of labels the head now
    trains on) the lowest bias of the trained outputs among ``entity_outputs`` (0 if there are
    none); their weights stay as they are. Returns how many outputs it woke."""
    if not len(woken):
        return 0
    with torch.no_grad():
        bias = layer.bias
        outputs = torch.as_tensor(list(entity_outputs), dtype=torch.long, device=bias.device)
        trained = bias[outputs][~untrained(bias[outputs])]
        start = trained.min() if trained.numel() else bias.new_zeros(())
        at = torch.as_tensor(list(woken), dtype=torch.long, device=bias.device)
        asleep = untrained(bias[at])
        bias[at] = torch.where(asleep, start, bias[at])
    return int(asleep.sum())


def label_positions(n_old: int, n_new: int, n_after: int = 0) -> list:
    """Where ``n_old`` channels go when ``n_new`` are inserted after them, before the last
    ``n_after`` (a START/END channel stays last): ``[0, .., n_old - n_after - 1, then the last
    n_after shifted by n_new]``."""
    kept = n_old - n_after
    return list(range(kept)) + [kept + n_new + i for i in range(n_after)]


def grow_outputs(layer: nn.Linear, width: int, n: int, blocks: int = 1) -> None:
    """Give ``layer``, whose outputs are ``blocks`` blocks of ``width`` label channels (channel
    0 of each the null label or the O tag), ``n`` more channels at the end of each block: zero
    weights and the bias :data:`UNTRAINED_BIAS`."""
    grown = width + n
    index = [block * grown + c for block in range(blocks) for c in range(width)]
    new_bias = layer.bias.detach().new_full((blocks * n,), UNTRAINED_BIAS)
    grow_linear(layer, index, blocks * grown, new_bias)


def grow_transitions(module: nn.Module, n_states: int, n: int) -> None:
    """Give ``module.transitions`` (``[n_states + 1, n_states + 1]``, START and END last, or
    None) ``n`` more states before START and END, with zero transitions."""
    grow_parameter(module, "transitions", label_positions(n_states + 1, n, 1),
                   n_states + n + 1, dims=2)


def wake_channels(layer: nn.Linear, width: int, channels: Sequence[int], blocks: int = 1) -> int:
    """:func:`wake_outputs` of ``channels`` in each of the ``blocks`` blocks of ``width``
    outputs of ``layer`` (laid out as :func:`grow_outputs` says), each at the lowest bias of its
    block's trained channels ``1..width - 1``; returns how many outputs it woke."""
    return sum(
        wake_outputs(layer, range(start + 1, start + width), [start + c for c in channels])
        for start in range(0, blocks * width, width)
    )
