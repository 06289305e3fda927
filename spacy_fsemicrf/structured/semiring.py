"""Log-space helpers shared by the structured algorithms.

Masked scores use the finite constant :data:`NEG` instead of ``-inf``: ``logsumexp`` over a row
that is entirely ``-inf`` has a NaN gradient, and padded rows, empty documents and empty node
sets produce exactly such rows. ``exp(NEG)`` underflows to zero in float16, float32 and float64,
so the finite constant changes no result.
"""
from typing import Optional

import torch

NEG = -1e4
"""Score of an impossible item (padding, masked transition, absent node)."""


def masked_fill_neg(scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Return ``scores`` with the entries where ``keep`` is False replaced by :data:`NEG`."""
    return torch.where(keep, scores, scores.new_full((), NEG))


def logsumexp(x: torch.Tensor, dim: int, keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``torch.logsumexp`` over ``dim`` that ignores the entries where ``keep`` is False.

    With every entry ignored the result is exactly :data:`NEG` (not ``-inf``, and not
    ``NEG + log(n)``, which would drift upwards over a long scan), with a zero gradient.
    """
    if keep is None:
        return torch.logsumexp(x, dim=dim)
    out = torch.logsumexp(masked_fill_neg(x, keep), dim=dim)
    return masked_fill_neg(out, keep.any(dim=dim))
