"""Growing a trained head by new entity labels, numbered after the existing ones.

A head's label-shaped weights (output rows, transitions, mean-field compatibilities) are copied
to the positions their labels take in the larger head; what the new labels add starts at zero,
so every existing label keeps its scores. spaCy's ``ner`` grows its output layer the same way
when a resumed pipeline meets a new label.
"""
from typing import Optional, Sequence

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
    kept); a parameter that is None stays None."""
    old: Optional[nn.Parameter] = getattr(module, name)
    if old is None:
        return
    grown = placed(old.detach(), index, size, dims)
    setattr(module, name, nn.Parameter(grown, requires_grad=old.requires_grad))


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


def label_positions(n_old: int, n_new: int, n_after: int = 0) -> list:
    """Where ``n_old`` channels go when ``n_new`` are inserted after them, before the last
    ``n_after`` (a START/END channel stays last): ``[0, .., n_old - n_after - 1, then the last
    n_after shifted by n_new]``."""
    kept = n_old - n_after
    return list(range(kept)) + [kept + n_new + i for i in range(n_after)]

