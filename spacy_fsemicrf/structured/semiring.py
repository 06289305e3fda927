"""Log-space helpers shared by the structured algorithms.

Masked scores use the finite constant :data:`NEG` instead of ``-inf``: ``logsumexp`` over a row
that is entirely ``-inf`` has a NaN gradient, and padded rows, empty documents and empty node
sets produce exactly such rows. The scans compare masked entries with running sums of real
scores, which grow with a document's length, so :data:`NEG` lies far below any such sum
(a document's scores would have to add up to -1e29). Next to a real entry a masked one adds
at most ``exp(EXP_FLOOR)`` of it (below), under float64's precision, so the finite constant
changes no result.
"""
from typing import Dict, Optional

import torch

NEG = -1e30
"""Score of an impossible item (padding, masked transition, absent node)."""

# float16 cannot hold NEG (it would round to -inf): a quarter of its lowest value instead
_NARROW: Dict[torch.dtype, float] = {torch.float16: torch.finfo(torch.float16).min / 4}


def neg_value(dtype: torch.dtype) -> float:
    """:data:`NEG` as a tensor of ``dtype`` can hold it."""
    return _NARROW.get(dtype, NEG)


def wide(scores: torch.Tensor) -> torch.Tensor:
    """``scores`` in float32, or float64 in a double head: half-precision scores (CUDA
    autocast) are summed in float32, and a double head computes in double."""
    return scores if scores.dtype == torch.float64 else scores.float()


def raised_to_neg(scores: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """``scores`` (in ``dtype`` if given) with every entry below :data:`NEG` raised to it: a
    score or transition of -inf is on no path with any probability, as NEG, where -inf would
    make the log-sums of a label or position that only -inf reaches NaN."""
    scores = scores if dtype is None else scores.to(dtype)
    return scores.clamp_min(neg_value(scores.dtype))


def masked_fill_neg(scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Return ``scores`` with the entries where ``keep`` is False replaced by :data:`NEG`."""
    return torch.where(keep, scores, scores.new_full((), neg_value(scores.dtype)))


# Shifted scores are clamped here before ``exp``: PyTorch's CPU ``exp`` leaves its vectorised
# path for arguments below about -87, and NEG-masked entries land there all the time (about 40x
# slower). A clamped entry contributes at most exp(-80) ~ 2e-35 of the largest one, below float64
# precision, and gets a zero gradient.
EXP_FLOOR = -80.0


def lse(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``torch.logsumexp(x, dim)`` without the slow path for very negative entries."""
    top = x.detach().amax(dim, keepdim=True)
    return (x - top).clamp_min(EXP_FLOOR).exp().sum(dim).log() + top.squeeze(dim)


def logaddexp(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.logaddexp(a, b)`` without the slow path for very negative differences."""
    top = torch.maximum(a, b)
    return top + torch.log1p((torch.minimum(a, b) - top).clamp_min(EXP_FLOOR).exp())


def logsumexp(x: torch.Tensor, dim: int, keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    """:func:`lse` over ``dim`` that ignores the entries where ``keep`` is False.

    With every entry ignored the result is exactly :data:`NEG` (not ``-inf``, and not
    ``NEG + log(n)``, which would drift upwards over a long scan), with a zero gradient.
    """
    if keep is None:
        return lse(x, dim)
    out = lse(masked_fill_neg(x, keep), dim)
    return masked_fill_neg(out, keep.any(dim=dim))
