"""Linear-chain CRF over BIO / BILUO token tags (the token-level baseline of the paper).

Tags: ``O`` is 0; for entity label ``l`` in ``1..M`` the BIO tags are ``B-l = 2l - 1``,
``I-l = 2l`` and the BILUO tags are ``B-l, I-l, L-l, U-l = 4l - 3 .. 4l``. Transitions are one
``[n_tags + 1, n_tags + 1]`` matrix ``T`` (row ``n_tags`` = START, column ``n_tags`` = END);
a sequence ``y`` of a document of ``n > 0`` tokens scores
``T[START, y_0] + sum_t emissions[t, y_t] + sum_t T[y_t-1, y_t] + T[y_n-1, END]``, the empty
document 0. ``allowed`` (from :class:`TagScheme`) masks invalid transitions with NEG, so the
invalid sequences get probability 0 (they still exist, with a score near NEG). An emission or
a transition of -inf counts as NEG: a sequence through it has probability 0, as a segment scored
-inf in the semi-CRF.

Forward, backward and Viterbi loop over positions, batched over documents; a document shorter
than the batch carries its state unchanged through the padding.
"""

import math
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch
from torch import nn

from .semiring import NEG, logsumexp, lse, masked_fill_neg, neg_value, raised_to_neg
from .spans import (
    check_gold_spans,
    check_integer,
    check_lengths,
    check_sentence_starts,
    check_span_rows,
    check_transitions,
    token_coverage,
    token_mask,
)

__all__ = [
    "TagScheme",
    "tag_scheme",
    "spans_to_tags",
    "tags_to_spans",
    "sentence_emissions",
    "crf_log_partition",
    "crf_score",
    "crf_viterbi",
    "crf_marginals",
    "crf_best_sequence_prob",
    "crf_span_marginals",
]

SCHEMES = ("BIO", "BILUO")
_KINDS = {"BIO": "BI", "BILUO": "BILU"}


@dataclass(eq=False)
class TagScheme:
    """A BIO or BILUO tag set for ``n_labels`` entity types.

    ``names[k]`` is tag ``k``'s name (``"O"``, ``"B-1"``, ``"I-1"``, ...; the number is the
    entity label id), ``labels[k]`` its entity label (0 for ``O``), ``kinds[k]`` its letter, and
    ``allowed[prev, next]`` (``[n_tags + 1, n_tags + 1]``, row ``n_tags`` = START, column
    ``n_tags`` = END) whether the transition is valid.
    """

    scheme: str
    n_labels: int
    n_tags: int
    names: Tuple[str, ...]
    kinds: Tuple[str, ...]
    labels: torch.Tensor
    allowed: torch.Tensor

    def tag(self, kind: str, label: Union[int, torch.Tensor]) -> Union[int, torch.Tensor]:
        """Id of tag ``kind-label`` (``kind`` one of the scheme's letters); ``label`` may be an
        int or a LongTensor of label ids (the ids come back alike)."""
        letters = _KINDS[self.scheme]
        if kind not in letters:
            raise ValueError(f"{self.scheme} has no {kind!r} tags")
        return (label - 1) * len(letters) + 1 + letters.index(kind)

    def continuing(self, device: Optional[torch.device] = None) -> torch.Tensor:
        """``BoolTensor[n_tags]``: the tags that continue an entity from the token before
        (``I``, and ``L`` in BILUO)."""
        return torch.tensor([kind in "IL" for kind in self.kinds], device=device)


def tag_scheme(n_labels: int, scheme: str = "BIO") -> TagScheme:
    """Build the :class:`TagScheme` for ``n_labels`` entity types (``scheme`` "BIO"/"BILUO")."""
    name = scheme.upper() if isinstance(scheme, str) else scheme  # (3 had no .upper())
    if name not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    check_integer("n_labels", n_labels, 0)
    letters = _KINDS[name]
    names = ["O"] + [f"{k}-{l}" for l in range(1, n_labels + 1) for k in letters]
    kinds = tuple(n[0] for n in names)
    labels = torch.tensor([0] + [l for l in range(1, n_labels + 1) for _ in letters])
    n = len(names)
    allowed = torch.zeros((n + 1, n + 1), dtype=torch.bool)
    START = END = n
    for p in range(n + 1):
        p_kind = "S" if p == START else kinds[p]
        for q in range(n + 1):
            q_kind = "E" if q == END else kinds[q]
            same = p != START and q != END and int(labels[p]) == int(labels[q])
            if name == "BIO":
                # I-x only continues B-x or I-x; everything else is free.
                ok = q_kind != "I" or (p_kind in "BI" and same)
            else:
                if p_kind in "BI":  # inside an entity: continue it or close it
                    ok = q_kind in "IL" and same
                else:  # O, L, U, START: outside; open a new entity or stay outside
                    ok = q_kind in "OBUE"
            allowed[p, q] = ok
    return TagScheme(name, n_labels, n, tuple(names), kinds, labels, allowed)


def spans_to_tags(
    gold: torch.Tensor, lengths: torch.Tensor, length: int, scheme: TagScheme
) -> torch.Tensor:
    """Tag every token: ``LongTensor[B, L]`` (padding and non-entity tokens are ``O`` = 0).

    ``gold`` rows are ``(doc, start, end_inclusive, label)``, non-overlapping within a doc, of
    any width (else a ``ValueError``).
    """
    device = lengths.device
    B = lengths.shape[0]
    doc, start, end, label = check_gold_spans(gold, lengths, length, None, scheme.n_labels)
    tok_label = token_coverage(doc, start, end, B, length, values=label)  # spans do not overlap
    is_start = torch.zeros((B, length), dtype=torch.bool, device=device)
    is_end = torch.zeros((B, length), dtype=torch.bool, device=device)
    is_start[doc, start] = True
    is_end[doc, end] = True
    if scheme.scheme == "BIO":
        tags = torch.where(is_start, scheme.tag("B", tok_label), scheme.tag("I", tok_label))
    else:
        tags = torch.where(
            is_start,
            torch.where(is_end, scheme.tag("U", tok_label), scheme.tag("B", tok_label)),
            torch.where(is_end, scheme.tag("L", tok_label), scheme.tag("I", tok_label)),
        )
    in_doc = token_mask(lengths, length)
    return torch.where((tok_label > 0) & in_doc, tags, torch.zeros_like(tags))


def consistent_emissions(
    emissions: torch.Tensor, tags: torch.Tensor, known: torch.Tensor, gold: torch.Tensor,
    scheme: TagScheme,
) -> torch.Tensor:
    """``emissions [B, L, n_tags]`` with -inf at the tags no sequence consistent with a
    partial annotation gives a token: a known token (``known [B, L]``) takes its gold tag
    (``tags``, from :func:`spans_to_tags`) only, and a token right after an annotated entity
    (rows ``gold``) takes no tag that continues an entity: the entity ends where it is
    annotated. Unknown tokens are free otherwise."""
    B, L, n_tags = emissions.shape
    device = emissions.device
    allowed = nn.functional.one_hot(tags.to(device), n_tags).bool()
    allowed |= ~known.to(device).unsqueeze(-1)
    doc, _, end, _ = gold.to(device).long().view(-1, 4).unbind(-1)
    after = torch.zeros((B, L + 1), dtype=torch.bool, device=device)
    after[doc, end + 1] = True
    allowed &= ~(after[:, :L].unsqueeze(-1) & scheme.continuing(device))
    return emissions.masked_fill(~allowed, -math.inf)


def sentence_emissions(
    emissions: torch.Tensor, sentence_starts: Optional[torch.Tensor], scheme: TagScheme
) -> torch.Tensor:
    """``emissions [B, L, n_tags]`` with the tags that continue an entity (``I``, and ``L`` in
    BILUO) at -inf on the tokens that start a sentence (``sentence_starts [B, L]``): no entity
    crosses a sentence boundary, and a tag that needs the next token to continue it has no
    way on there either. ``emissions`` itself without ``sentence_starts``."""
    if sentence_starts is None:
        return emissions
    check_sentence_starts(sentence_starts, tuple(emissions.shape[:2]))
    starts = sentence_starts.to(emissions.device).unsqueeze(-1)
    return emissions.masked_fill(starts & scheme.continuing(emissions.device), -math.inf)


def tags_to_spans(tags: torch.Tensor, lengths: torch.Tensor, scheme: TagScheme) -> torch.Tensor:
    """Entities of tag sequences: ``LongTensor[N, 4]`` rows ``(doc, start, end, label)``
    sorted by ``(doc, start)``.

    Exact for valid sequences. Invalid ones are read leniently (an ``I``/``L`` that does not
    continue an entity opens one, a ``B``/``I`` that is not continued closes one), so every
    input gives non-overlapping spans.
    """
    device = tags.device
    B, L = tags.shape
    lengths = lengths.to(device).long()
    labels = scheme.labels.to(device)[tags]
    kind_ids = {k: i for i, k in enumerate("OBILU")}
    kinds = torch.tensor([kind_ids[k] for k in scheme.kinds], device=device)[tags]
    in_doc = token_mask(lengths, L)
    entity = in_doc & (labels > 0)
    # cont[t]: the tag at t + 1 continues the entity at t.
    same = entity[:, 1:] & (labels[:, 1:] == labels[:, :-1]) & entity[:, :-1]
    nxt, cur = kinds[:, 1:], kinds[:, :-1]
    if scheme.scheme == "BIO":
        cont = same & (nxt == kind_ids["I"])
    else:
        inside = (cur == kind_ids["B"]) | (cur == kind_ids["I"])
        cont = same & inside & ((nxt == kind_ids["I"]) | (nxt == kind_ids["L"]))
    no = torch.zeros((B, 1), dtype=torch.bool, device=device)
    begin = entity & ~torch.cat([no, cont], 1)
    finish = entity & ~torch.cat([cont, no], 1)
    # Each maximal chain has one begin and one finish, chains are disjoint: pair in order.
    doc, start = begin.nonzero(as_tuple=True)
    _, end = finish.nonzero(as_tuple=True)
    return torch.stack([doc, start, end, labels[doc, start]], 1)


def check_emissions(
    emissions: torch.Tensor,
    transitions: torch.Tensor,
    lengths: torch.Tensor,
    allowed: Optional[torch.Tensor] = None,
) -> None:
    """A ``ValueError`` unless ``emissions`` are ``[B, L, n_tags]`` (``n_tags >= 1``),
    ``lengths`` ``[B]`` integers between 0 and ``L`` (:func:`~.spans.check_lengths`),
    ``transitions`` ``[n_tags + 1, n_tags + 1]`` (:func:`~.spans.check_transitions`) and
    ``allowed`` None or a ``BoolTensor`` of their shape: a length past the rows was decoded as
    if the document ended at ``L``, and other transitions failed on an index out of bounds."""
    if not isinstance(emissions, torch.Tensor) or emissions.dim() != 3 or (
            emissions.shape[2] < 1):
        raise ValueError(
            f"emissions must be a tensor [B, L, n_tags], n_tags >= 1, got "
            f"{type(emissions).__name__} {tuple(getattr(emissions, 'shape', ()))}"
        )
    B, L, n = emissions.shape
    check_lengths(lengths, (B, L), "the emissions")
    check_transitions(transitions, n, "tags", "the emissions")
    if allowed is not None and (
            not isinstance(allowed, torch.Tensor) or allowed.dtype != torch.bool
            or allowed.shape != transitions.shape):
        raise ValueError(
            f"allowed must be a BoolTensor of the transitions' shape {tuple(transitions.shape)}, "
            f"got {type(allowed).__name__} {getattr(allowed, 'dtype', '')} "
            f"{tuple(getattr(allowed, 'shape', ()))}"
        )


def _prepared(
    emissions: torch.Tensor, transitions: torch.Tensor, allowed: Optional[torch.Tensor]
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``emissions`` and ``transitions`` (in the emissions' dtype, masked where ``allowed`` is
    False) with -inf raised to NEG: a position or a tag that only -inf reaches would make
    :func:`lse` NaN (as the semi-CRF, a -inf score is in no sequence with any probability)."""
    T = raised_to_neg(transitions, emissions.dtype)
    if allowed is not None:
        T = masked_fill_neg(T, allowed.to(T.device))
    return raised_to_neg(emissions), T


def _forward(
    emissions: torch.Tensor, T: torch.Tensor, lengths: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Forward log-alphas ``[B, L, n]`` (prefix ``0..t`` ending in tag ``y``, emission at ``t``
    included) and ``log Z [B]``."""
    B, L, n = emissions.shape
    if L == 0:  # every document is empty; stay connected to the inputs for autograd
        return emissions.new_zeros((B, 0, n)), emissions.sum((1, 2)) * 0 + T.sum() * 0
    trans_t = T[:n, :n].t().contiguous()  # [next, prev]: reduce over the contiguous dim
    # unbind once: emissions[:, t] in the loop would give every step a full-size gradient
    # buffer in backward, making it quadratic in L
    steps = emissions.unbind(1)
    alpha = T[n, :n] + steps[0]
    alphas = [alpha]
    for t in range(1, L):
        new = lse(alpha.unsqueeze(1) + trans_t, -1) + steps[t]
        alpha = torch.where((t < lengths).view(-1, 1), new, alpha)
        alphas.append(alpha)
    log_z = lse(alpha + T[:n, n], -1)
    return torch.stack(alphas, 1), torch.where(lengths > 0, log_z, log_z.new_zeros(()))


def _backward(emissions: torch.Tensor, T: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Backward log-betas ``[B, L, n]``: suffix ``t+1..`` given tag ``y`` at ``t``, END
    included, emission at ``t`` excluded. Padding positions hold ``T[:, END]``."""
    B, L, n = emissions.shape
    trans = T[:n, :n]
    to_end = T[:n, n].expand(B, n)
    beta = to_end
    betas = [beta]
    for t in range(L - 2, -1, -1):
        new = lse(trans + (emissions[:, t + 1] + beta).unsqueeze(1), -1)
        beta = torch.where((t + 1 < lengths).view(-1, 1), new, to_end)
        betas.append(beta)
    return torch.stack(betas[::-1], 1) if L else emissions.new_zeros((B, 0, n))


def crf_log_partition(
    emissions: torch.Tensor,
    transitions: torch.Tensor,
    lengths: torch.Tensor,
    allowed: Optional[torch.Tensor] = None,
    check: bool = True,
) -> torch.Tensor:
    """``log Z`` per document, ``Tensor[B]`` (0 for empty documents).

    ``emissions`` is ``[B, L, n_tags]``, ``transitions`` ``[n_tags + 1, n_tags + 1]``;
    transitions where ``allowed`` is False are masked with NEG. Where every valid sequence
    scores -inf, log Z is not -inf but at or below ``NEG / 2`` (finite: a gradient without NaN).
    A ``ValueError`` for inputs of other shapes (:func:`check_emissions`), unless ``check`` is
    False (the heads check theirs).
    """
    if check:
        check_emissions(emissions, transitions, lengths, allowed)
    lengths = lengths.to(emissions.device).long()
    return _forward(*_prepared(emissions, transitions, allowed), lengths)[1]


def _check_tags(
    emissions: torch.Tensor,
    transitions: torch.Tensor,
    tags: torch.Tensor,
    lengths: torch.Tensor,
    allowed: Optional[torch.Tensor],
) -> None:
    """:func:`check_emissions`, and ``tags`` one per token of the emissions."""
    check_emissions(emissions, transitions, lengths, allowed)
    if not isinstance(tags, torch.Tensor) or tags.shape != emissions.shape[:2]:
        raise ValueError(
            f"tags must be a tensor [B, L], one tag per token of the emissions "
            f"{tuple(emissions.shape)}, got {type(tags).__name__} "
            f"{tuple(getattr(tags, 'shape', ()))}"
        )


def crf_score(
    emissions: torch.Tensor,
    transitions: torch.Tensor,
    tags: torch.Tensor,
    lengths: torch.Tensor,
    allowed: Optional[torch.Tensor] = None,
    check: bool = True,
) -> torch.Tensor:
    """Score of the tag sequences ``tags [B, L]`` (padding ignored), ``Tensor[B]``. A
    ``ValueError`` for inputs of other shapes (:func:`check_emissions`, and ``tags``), unless
    ``check`` is False (the heads check theirs)."""
    if check:
        _check_tags(emissions, transitions, tags, lengths, allowed)
    B, L, n = emissions.shape
    device = emissions.device
    lengths = lengths.to(device).long()
    tags = tags.to(device).long()
    emissions, T = _prepared(emissions, transitions, allowed)
    if L == 0:
        return emissions.new_zeros(B)
    in_doc = token_mask(lengths, L)
    zero = emissions.new_zeros(())
    emit = torch.where(in_doc, emissions.gather(2, tags.unsqueeze(-1)).squeeze(-1), zero)
    prev = torch.cat([tags.new_full((B, 1), n), tags[:, :-1]], 1)
    trans = torch.where(in_doc, T[prev, tags], zero)
    last = tags.gather(1, (lengths - 1).clamp_min(0).view(-1, 1)).squeeze(1)
    to_end = torch.where(lengths > 0, T[last, n], zero)
    return emit.sum(1) + trans.sum(1) + to_end


def crf_viterbi(
    emissions: torch.Tensor,
    transitions: torch.Tensor,
    lengths: torch.Tensor,
    allowed: Optional[torch.Tensor] = None,
    check: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Best tag sequence per document: ``(tags LongTensor[B, L] padded with 0, best [B])``. A
    document whose every valid sequence scores ``-inf`` has no best one: tags 0 (``O``, no
    entity) and a best score of ``-inf``. A ``ValueError`` for inputs of other shapes
    (:func:`check_emissions`), unless ``check`` is False (the heads check theirs)."""
    if check:
        check_emissions(emissions, transitions, lengths, allowed)
    with torch.no_grad():
        B, L, n = emissions.shape
        device = emissions.device
        lengths = lengths.to(device).long()
        emissions, T = _prepared(emissions, transitions, allowed)
        if L == 0:
            return torch.zeros((B, 0), dtype=torch.long, device=device), emissions.new_zeros(B)
        trans_t = T[:n, :n].t().contiguous()  # [next, prev]
        score = T[n, :n] + emissions[:, 0]
        identity = torch.arange(n, device=device).expand(B, n)
        back = []
        for t in range(1, L):
            best, arg = (score.unsqueeze(1) + trans_t).max(dim=-1)
            live = (t < lengths).view(-1, 1)
            # Padding steps copy the state and point back to the same tag, so every document
            # can be backtracked from position L - 1.
            score = torch.where(live, best + emissions[:, t], score)
            back.append(torch.where(live, arg, identity))
        best, tag = (score + T[:n, n]).max(dim=-1)
        path = [tag]
        for arg in reversed(back):
            tag = arg.gather(1, tag.view(-1, 1)).squeeze(1)
            path.append(tag)
        tags = torch.stack(path[::-1], 1)
        in_doc = token_mask(lengths, L)
        # every sequence -inf (NEG or below, as masked): no distribution, no best sequence
        none = (best <= neg_value(best.dtype) / 2) & (lengths > 0)
        tags = torch.where(in_doc & ~none.view(-1, 1), tags, torch.zeros_like(tags))
        best = best.masked_fill(none, -math.inf)
        return tags, torch.where(lengths > 0, best, best.new_zeros(()))


def crf_marginals(
    emissions: torch.Tensor,
    transitions: torch.Tensor,
    lengths: torch.Tensor,
    allowed: Optional[torch.Tensor] = None,
    check: bool = True,
) -> torch.Tensor:
    """``Tensor[B, L, n_tags]``: probability of each tag at each token (0 on padding, and
    everywhere in a document whose every valid sequence scores ``-inf``: no distribution).

    Forward-backward: ``exp(alpha[t, y] + beta[t, y] - log Z)`` (equal to the gradient of
    ``log Z`` with respect to the emissions), in float64 whatever the emissions' precision (the
    result takes theirs). Not differentiated; safe under ``no_grad``. A ``ValueError`` for
    inputs of other shapes (:func:`check_emissions`), unless ``check`` is False (the heads
    check theirs).
    """
    if check:
        check_emissions(emissions, transitions, lengths, allowed)
    with torch.no_grad():
        B, L, n = emissions.shape
        lengths = lengths.to(emissions.device).long()
        # float64, as crf_span_marginals: in float32, alpha + beta - log Z of a long document
        # (|log Z| in the ten thousands) is off by a few hundredths
        em, T = _prepared(emissions.double(), transitions, allowed)
        alphas, log_z = _forward(em, T, lengths)
        betas = _backward(em, T, lengths)
        probs = (alphas + betas - log_z.view(-1, 1, 1)).exp().clamp_max(1.0)
        in_doc = token_mask(lengths, L) & (log_z > NEG / 2).view(-1, 1)
        probs = torch.where(in_doc.unsqueeze(-1), probs, probs.new_zeros(()))
        return probs.to(emissions.dtype)


def crf_best_sequence_prob(
    emissions: torch.Tensor,
    transitions: torch.Tensor,
    lengths: torch.Tensor,
    allowed: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Probability of each document's Viterbi sequence, ``exp(best - log Z)``, ``Tensor[B]``. A
    ``ValueError`` for inputs of other shapes (:func:`check_emissions`)."""
    check_emissions(emissions, transitions, lengths, allowed)
    with torch.no_grad():
        _, best = crf_viterbi(emissions, transitions, lengths, allowed, check=False)
        log_z = crf_log_partition(emissions, transitions, lengths, allowed, check=False)
        return (best - log_z).exp().clamp_max(1.0)


def crf_span_marginals(
    emissions: torch.Tensor,
    transitions: torch.Tensor,
    lengths: torch.Tensor,
    spans: torch.Tensor,
    scheme: TagScheme,
    allowed: Optional[torch.Tensor] = None,
    check_rows: bool = True,
    check: bool = True,
) -> torch.Tensor:
    """Exact probability that each labelled span ``(doc, start, end, label)`` is an entity of
    the tag sequence, ``Tensor[N]``.

    BIO: ``y_start = B-l``, ``y_start+1..end = I-l`` and ``y_end+1 != I-l`` (or ``end`` is the
    last token). BILUO: ``U-l`` for one token, else ``B-l, I-l, ..., I-l, L-l``.
    ``alpha[start] + (the span's own tags) + beta[end]``, with the run of ``I-l`` tags read
    from a prefix sum, so the cost is ``O(N * n_tags)`` after one forward-backward pass.
    A ``ValueError`` for a span outside its document or a label outside ``1..M``, unless
    ``check_rows`` is False: decoded rows need no check (about 50 us a call); and for inputs of
    other shapes (:func:`check_emissions`, and a ``scheme`` of another number of tags), unless
    ``check`` is False (the heads check theirs).
    """
    if check:
        check_emissions(emissions, transitions, lengths, allowed)
        if scheme.n_tags != emissions.shape[2]:
            raise ValueError(
                f"scheme has {scheme.n_tags} tags, the emissions {emissions.shape[2]}"
            )
    device = emissions.device
    B, L, n = emissions.shape
    lengths = lengths.to(device).long()
    if check_rows:
        doc, s, e, lab = check_span_rows(spans, lengths, L, None, scheme.n_labels, "span")
    else:
        doc, s, e, lab = spans.to(device).long().view(-1, 4).unbind(1)
    if doc.shape[0] == 0:
        return emissions.new_zeros(0)
    with torch.no_grad():
        # float64 throughout: in float32, alpha + beta - log Z of a long document (|log Z| in
        # the thousands) and the prefix-sum differences of a long I run lose ~1e-3 in log space.
        em, T = _prepared(emissions.double(), transitions, allowed)
        alphas, log_z = _forward(em, T, lengths)
        betas = _backward(em, T, lengths)
        M = scheme.n_labels
        i_tags = scheme.tag("I", torch.arange(1, M + 1, device=device))
        g = T[i_tags, i_tags] + em[:, :, i_tags]  # one I-l -> I-l step at each position
        # Impossible steps (NEG) are counted apart: in the prefix sum, a NEG before the run
        # would cancel out of the difference and leave the run's own steps rounded away.
        blocked = g < NEG / 2
        g = torch.where(blocked, g.new_zeros(()), g)
        G = torch.nn.functional.pad(g.cumsum(1), (0, 0, 1, 0))  # G[:, k] = sum_{u < k}
        N = torch.nn.functional.pad(blocked.long().cumsum(1), (0, 0, 1, 0))

        def i_run(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            """Sum of the I-l steps at positions a..b (0 when b < a; NEG if one is NEG)."""
            b1 = (b + 1).clamp(0, L)
            a1 = a.clamp(0, L).minimum(b1)
            run = G[doc, b1, lab - 1] - G[doc, a1, lab - 1]
            return masked_fill_neg(run, N[doc, b1, lab - 1] == N[doc, a1, lab - 1])

        def em_at(pos: torch.Tensor, tag: torch.Tensor) -> torch.Tensor:
            return em[doc, pos.clamp(0, L - 1), tag]

        tag_b, tag_i = scheme.tag("B", lab), scheme.tag("I", lab)
        wide = e > s
        # Opening tag and the I run up to `run_end`.
        run_end = e if scheme.scheme == "BIO" else e - 1
        has_run = run_end > s
        run = T[tag_b, tag_i] + em_at(s + 1, tag_i) + i_run(s + 2, run_end)
        if scheme.scheme == "BIO":
            head = alphas[doc, s, tag_b] + torch.where(has_run, run, run.new_zeros(()))
            last = torch.where(has_run, tag_i, tag_b)
            # The next tag must not continue the entity: sum over y != I-l.
            nxt = (e + 1).clamp_max(L - 1)
            cand = T[last, :n] + em[doc, nxt] + betas[doc, nxt]  # [N, n]
            keep = torch.arange(n, device=device).view(1, -1) != tag_i.view(-1, 1)
            closed = logsumexp(cand, dim=1, keep=keep)
            tail = torch.where(e + 1 < lengths[doc], closed, betas[doc, e, last])
            total = head + tail
        else:
            tag_l, tag_u = scheme.tag("L", lab), scheme.tag("U", lab)
            before_l = torch.where(has_run, tag_i, tag_b)
            multi = (
                alphas[doc, s, tag_b]
                + torch.where(has_run, run, run.new_zeros(()))
                + T[before_l, tag_l]
                + em_at(e, tag_l)
                + betas[doc, e, tag_l]
            )
            single = alphas[doc, s, tag_u] + betas[doc, s, tag_u]
            total = torch.where(wide, multi, single)
        prob = (total - log_z[doc]).exp().clamp_max(1.0)
        # every sequence -inf: no distribution, every span's probability 0
        prob = torch.where(log_z[doc] > NEG / 2, prob, prob.new_zeros(()))
    return prob.to(emissions.dtype)
