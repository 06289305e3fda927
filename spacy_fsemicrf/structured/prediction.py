"""What a head is asked for at prediction, and what it returns.

``head(X, lengths)`` returns the decoded entities ``(spans [N, 4], confidences [N])``;
``head(X, lengths, options=DecodeOptions(...))`` returns a :class:`Prediction` with whatever
the options ask for besides them: the probability of each document's decoded path, the
candidates the head considered, and decoding under constraints (:mod:`.constraints`).
"""
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch

from .constrained import ConstraintReport
from .constraints import DocConstraints
from .semiring import neg_value

Decoded = Tuple[torch.Tensor, torch.Tensor]


class DecodeOptions(NamedTuple):
    """path: compute each document's path probability. candidates: list the labelled spans
    the head considered, with their confidences. constraints: one entry per document (None
    where it has none)."""

    path: bool = False
    candidates: bool = False
    constraints: Optional[Sequence[Optional[DocConstraints]]] = None

    def constrained(self) -> bool:
        return self.constraints is not None and any(c is not None for c in self.constraints)


class Prediction(NamedTuple):
    """spans ``LongTensor[N, 4]`` rows ``(doc, start, end inclusive, label 1..M)`` sorted by
    ``(doc, start)`` and their confidences ``[N]``; ``path [B]`` the probability of each
    document's returned path under the head's distribution (0 for a constrained path that
    distribution does not contain); ``candidates`` ``(rows, confidences)`` in the same row
    format; ``reports`` one :class:`~.constrained.ConstraintReport` per document (None where it
    had no constraints)."""

    spans: torch.Tensor
    scores: torch.Tensor
    path: Optional[torch.Tensor] = None
    candidates: Optional[Decoded] = None
    reports: Optional[List[Optional[ConstraintReport]]] = None


def path_probability(
    best_score: torch.Tensor,
    log_z: torch.Tensor,
    reports: Optional[List[Optional[ConstraintReport]]] = None,
    outside: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``[B]``: ``exp(score - log Z)`` of each document's returned path: the constrained
    path's score where a report says the constraints changed it, and 0 where ``outside``
    (``BoolTensor[B]``) says the returned path is not one of the distribution's, or where
    ``log_z`` is at or below ``NEG / 2`` (as its dtype holds NEG): every path is ``-inf``,
    there is no distribution (the path returned, of no entity, scored about as low as log Z,
    which gave it 1)."""
    score = best_score.detach().double().clone()
    for i, report in enumerate(reports or ()):
        if report is not None and report.status == "optimal":
            score[i] = report.score
    none = log_z.detach() <= neg_value(log_z.dtype) / 2  # (as the solvers say it)
    prob = (score - log_z.detach().double()).clamp_max(0.0).exp()
    if outside is not None:
        none = none | outside.to(prob.device)
    prob = torch.where(none, torch.zeros_like(prob), prob)
    return prob.float()
