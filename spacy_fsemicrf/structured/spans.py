"""Candidate spans on a padded batch, gold span grids, and span featurizers.

Every span-level tensor uses the grid layout ``[B, L, K, ...]``: entry ``(b, i, w)`` is the span
of tokens ``i .. i + w`` (inclusive, width ``w + 1``) of document ``b``. It is a candidate iff
``i + w < lengths[b]``, so a document of length ``n`` has ``sum(min(K, n - i))`` candidates, at
most ``n * K``.
"""
import functools
import math
import numbers
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import numpy
import torch
from torch import nn

# Where :func:`running_sum` leaves PyTorch's kernel (timed on one CPU thread): from this many
# positions and this many entries per position (documents times features)
RUNNING_SUM_MIN_LENGTH = 100
RUNNING_SUM_MIN_ROW = 2048
# From this many entries the sum featurizers' terms take one pass per sum (see _prefix_terms)
ONE_PASS_MIN_ENTRIES = 2**20

SPAN_REPRS = (
    "endpoints",
    "sum",
    "mean",
    "max",
    "sum_endpoints",
    "sum_endpoints_neighbors",
    "sum_endpoints_neighbors_max",
)


def check_integer(name: str, value: Any, minimum: Optional[int] = None) -> None:
    """A ``ValueError`` unless the setting ``name`` is an integer (NumPy's too, not a bool), at
    least ``minimum`` if given: a float or a bool (an int to Python) built layers of another
    size, or failed later in PyTorch with an error that did not name the setting."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def is_real(value: Any) -> bool:
    """Whether ``value`` is a real number (NumPy's too), not a bool, which Python takes for an
    integer."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, numpy.bool_))


def check_number(name: str, value: Any) -> None:
    """A ``ValueError`` unless the setting ``name`` is a finite real number, not a bool: NaN
    passes every ``<`` check, so a weight of NaN was taken, and turned off what it weighs;
    an infinite weight made the loss infinite or NaN at the first step."""
    if not is_real(value) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def check_flag(name: str, value: Any) -> None:
    """A ``ValueError`` unless the yes/no setting ``name`` is a bool (NumPy's too): any other
    value was read by its truth, so ``transitions="no"`` built a head with transitions."""
    if not isinstance(value, (bool, numpy.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def check_probability(name: str, value: Any) -> None:
    """:func:`check_number`, and a ``ValueError`` unless ``value`` is in ``[0, 1]`` (a dropout
    rate of NaN was taken, and failed at the first training step)."""
    check_number(name, value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


def check_integer_dtype(values: torch.Tensor, name: str) -> None:
    """A ``ValueError`` unless the tensor ``values`` holds integers (not bools, which
    indexing reads as a mask): a fractional length or label was truncated to another."""
    if values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor, got {values.dtype}")


def check_shape(
    value: Any, name: str, layout: str, shape: Optional[Sequence[Optional[int]]] = None,
    source: str = "",
) -> None:
    """A ``ValueError`` unless ``value`` is a tensor laid out as ``layout`` (such as ``"[B, L,
    K]"``, one size per letter) and, where ``shape`` is given, of its sizes (None: any), those
    of ``source``: another rank or size failed deep inside PyTorch with an error that did not
    name the argument, or broadcast into a wrong answer. Python comparisons only (no tensor
    operation), so that the prediction path can afford it."""
    got = value.shape if isinstance(value, torch.Tensor) else None  # (a tuple)
    # (the fast path without a generator: a one-document prediction makes about ten calls)
    if got is not None and len(got) == layout.count(",") + 1:
        if shape is None or got == shape:
            return
        for want, size in zip(shape, got):
            if want is not None and want != size:
                break
        else:
            return
    got_text = type(value).__name__ if got is None else tuple(got)
    if shape is None:
        raise ValueError(f"{name} must be {layout}, got {got_text}")
    letters = layout.strip("[]").split(", ")
    want = ", ".join(letter if w is None else str(w) for letter, w in zip(letters, shape))
    want += "," if len(letters) == 1 else ""  # (as Python writes a tuple of one, like got)
    raise ValueError(f"{name} must be {layout} as {source}, ({want}), got {got_text}")


def check_lengths(
    lengths: torch.Tensor, shape: Optional[Tuple[int, int]] = None, what: str = "X"
) -> None:
    """A ``TypeError`` unless ``lengths`` is a tensor and a ``ValueError`` unless it holds
    integers: a fractional length would end a document at a different token in each mask (the
    filtered head's candidates took the token past a length of 4.5). With ``shape`` ``(B, L)``,
    the batch and token rows of ``what``, also a ``ValueError`` unless ``lengths`` is ``[B]``
    with each length between 0 and ``L``: a longer one let a decoder put an entity past the
    rows, a negative one read its document as empty."""
    if not isinstance(lengths, torch.Tensor):
        raise TypeError(f"lengths must be an integer tensor, got {type(lengths).__name__}")
    check_integer_dtype(lengths, "lengths")
    if shape is None:
        return
    batch, rows = shape
    if tuple(lengths.shape) != (batch,):
        raise ValueError(
            f"lengths must be [B], one per document of {what} ({batch}), got "
            f"{tuple(lengths.shape)}"
        )
    if batch:
        values = lengths.tolist()  # a microsecond for one document, where aminmax takes four
        low, high = min(values), max(values)
        if low < 0 or high > rows:
            raise ValueError(
                f"lengths must lie between 0 and the {rows} token rows of {what}, got "
                f"{low if low < 0 else high}"
            )


def check_transitions(
    transitions: torch.Tensor, n_states: Optional[int] = None, states: str = "labels",
    what: str = "the scores",
) -> None:
    """A ``ValueError`` unless ``transitions`` is a tensor ``[n + 1, n + 1]``, ``n >= 1`` (the
    last row from START, the last column to END), with ``n`` the ``n_states`` ``states`` of
    ``what`` if given: another shape read the START row and END column of other states, or
    failed deep inside a dynamic program with an error that did not name the argument."""
    shape = tuple(getattr(transitions, "shape", ()))
    if (isinstance(transitions, torch.Tensor) and len(shape) == 2 and shape[0] == shape[1]
            and shape[0] >= 2 and (n_states is None or shape[0] == n_states + 1)):
        return
    got = shape if isinstance(transitions, torch.Tensor) else type(transitions).__name__
    if n_states is None:
        want = "[C + 1, C + 1] for C labels, null included"
    else:
        want = f"[{n_states + 1}, {n_states + 1}] for the {n_states} {states} of {what}"
    raise ValueError(
        f"transitions must be {want} (the last row from START, the last column to END), "
        f"got {got}"
    )


def span_mask(lengths: torch.Tensor, length: int, max_width: int) -> torch.Tensor:
    """``BoolTensor[B, L, K]``: which grid entries are candidate spans of their document, for
    documents of ``lengths [B]`` (an integer tensor, :func:`check_lengths`) padded to
    ``L = length`` tokens and spans of up to ``K = max_width`` tokens (entry ``[b, i, w]``:
    tokens ``i..i + w``). A ``ValueError`` unless ``lengths`` is ``[B]``, each between 0 and
    ``L``: a longer document's spans were cut at ``L``, a negative length read as 0."""
    check_lengths(lengths)  # (a tensor, before its size is read)
    check_lengths(lengths, (lengths.numel(), length), "the grid")
    ends = span_ends(length, max_width, lengths.device)
    return ends.unsqueeze(0) < lengths.view(-1, 1, 1)


def crossing_spans(sentence_starts: torch.Tensor, max_width: int) -> torch.Tensor:
    """``BoolTensor[B, L, K]``: which grid entries cross a sentence boundary, for the
    ``sentence_starts [B, L]`` of a padded batch (True at a token that starts a sentence):
    span ``i..i + w`` when a sentence starts at one of its tokens after the first. A start at
    a span's first token crosses nothing, so the first token of a document may be True or
    not. Entries past the grid's end read as ending at its last token (they are no candidates
    anyway)."""
    check_sentence_starts(sentence_starts)
    # the starts among a span's tokens, but a start at its first token
    return span_token_counts(sentence_starts, max_width) > sentence_starts.unsqueeze(-1)


def span_token_counts(flags: torch.Tensor, max_width: int) -> torch.Tensor:
    """``LongTensor[B, L, K]``: how many tokens of each grid span are flagged, for ``flags
    [B, L]`` (bool), from one prefix sum. Entries past the grid's end read as ending at its
    last token (they are no candidates anyway)."""
    B, L = flags.shape
    if L == 0:
        return torch.zeros((B, 0, max_width), dtype=torch.long, device=flags.device)
    prefix = torch.nn.functional.pad(flags.long().cumsum(1), (1, 0))  # [B, L + 1]
    ends = span_ends(L, max_width, flags.device).clamp(max=L - 1)
    return prefix[:, ends + 1] - prefix[:, :L].unsqueeze(-1)


def check_sentence_starts(
    sentence_starts: torch.Tensor, shape: Optional[Tuple[int, int]] = None
) -> None:
    """A ``ValueError`` unless ``sentence_starts`` is a 2-d ``BoolTensor``, of the batch's
    ``shape`` ``(B, L)`` if given: another shape would read the boundaries of other tokens."""
    check_token_flags(sentence_starts, "sentence_starts", "start a sentence", shape)


def check_token_flags(
    flags: Any, name: str, meaning: str, shape: Optional[Tuple[int, int]] = None
) -> None:
    """A ``ValueError`` unless ``flags``, one bool per token (True at the tokens that
    ``meaning``), is a 2-d ``BoolTensor``, of the batch's ``shape`` ``(B, L)`` if given."""
    if (not isinstance(flags, torch.Tensor) or flags.dtype != torch.bool or flags.dim() != 2
            or (shape is not None and tuple(flags.shape) != tuple(shape))):
        want = "[B, L]" if shape is None else list(shape)
        raise ValueError(
            f"{name} must be a BoolTensor {want}, True at the tokens that {meaning}, got "
            f"{type(flags).__name__} {getattr(flags, 'dtype', '')} "
            f"{tuple(getattr(flags, 'shape', ()))}"
        )


def unknown_spans(known: torch.Tensor, max_width: int) -> torch.Tensor:
    """``BoolTensor[B, L, K]``: which grid entries hold only tokens whose annotation is
    unknown, for ``known [B, L]`` (False at a token without entity annotation): a span there
    may be an entity of any label or none. Entries past the grid's end read as ending at its
    last token (they are no candidates anyway)."""
    check_token_flags(known, "known", "have entity annotation")
    return span_token_counts(known, max_width) == 0


def partial_annotation(
    known: Optional[torch.Tensor], lengths: torch.Tensor, length: int, gold: torch.Tensor
) -> Optional[torch.Tensor]:
    """``known [B, L]`` (False at the tokens without entity annotation) with the padding past
    each document of ``lengths`` counted as known, or None when every token is known (a
    batch fully annotated trains as before, bit for bit). A ``ValueError`` where a ``gold``
    row covers an unknown token: an annotated entity is annotation."""
    if known is None:
        return None
    check_token_flags(known, "known", "have entity annotation", (lengths.shape[0], length))
    known = known.to(lengths.device) | ~token_mask(lengths, length)
    if bool(known.all()):
        return None
    doc, start, end, _ = gold.to(lengths.device).long().view(-1, 4).unbind(-1)
    if bool((token_coverage(doc, start, end, known.shape[0], length) > 0)[~known].any()):
        raise ValueError("known is False at a token of a gold span: the tokens of an annotated "
                         "entity are known")
    return known


def consistent_segments(
    gold_grid: torch.Tensor, known: torch.Tensor, n_classes: int,
    incorrect: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``BoolTensor[B, L, K, C]``: the segments of a semi-CRF that a segmentation consistent
    with a partial annotation may hold, for the ``gold_grid [B, L, K]`` of the annotated
    entities (:func:`gold_label_grid`) and ``known [B, L]``: a null (width 1) on a token of no
    annotated entity, an annotated entity with its label, and an entity of any label on
    unknown tokens only but those of ``incorrect`` (:func:`incorrect_label_grid`: entities
    known to be wrong). Every other segment would give a known token another annotation."""
    B, L, K = gold_grid.shape
    unknown = unknown_spans(known.to(gold_grid.device), K)
    labels = torch.arange(n_classes, device=gold_grid.device)
    allowed = (gold_grid.unsqueeze(-1) == labels) | unknown.unsqueeze(-1)
    doc, start, width = (gold_grid > 0).nonzero(as_tuple=True)
    in_entity = token_coverage(doc, start, start + width, B, L) > 0
    allowed[:, :, 0, 0] = ~in_entity
    allowed[:, :, 1:, 0] = True  # (wider nulls are no segments: the scan never reads them)
    return allowed if incorrect is None else allowed & ~incorrect


def incorrect_label_grid(
    incorrect: Optional[torch.Tensor], lengths: torch.Tensor, gold_grid: torch.Tensor,
    n_classes: int,
) -> Optional[torch.Tensor]:
    """``BoolTensor[B, L, K, C]``, True at the labelled spans of ``incorrect`` rows ``(doc,
    start, end inclusive, label 1..M)``, entities known to be wrong (spaCy's
    ``incorrect_spans_key``), for the ``gold_grid [B, L, K]`` of a batch; None without rows.
    A ``ValueError`` for rows :func:`check_span_rows` refuses and for one that is also a gold
    span with the same label."""
    if incorrect is None:
        return None
    B, L, K = gold_grid.shape
    doc, start, end, label = check_span_rows(incorrect, lengths, L, K, n_classes - 1,
                                             what="incorrect span")
    if not doc.shape[0]:
        return None
    if bool((gold_grid[doc, start, end - start] == label).any()):
        raise ValueError("an incorrect span is also a gold span with the same label: an entity "
                         "cannot be annotated as right and as wrong")
    grid = torch.zeros((B, L, K, n_classes), dtype=torch.bool, device=gold_grid.device)
    grid[doc, start, end - start, label] = True
    return grid


def token_mask(lengths: torch.Tensor, length: int) -> torch.Tensor:
    """``BoolTensor[B, L]``: which positions of the padded batch are tokens of their document."""
    return torch.arange(length, device=lengths.device).view(1, -1) < lengths.view(-1, 1)


def span_ends(length: int, max_width: int, device: Optional[torch.device] = None) -> torch.Tensor:
    """``LongTensor[L, K]``: the inclusive end ``i + w`` of every grid entry (shared between
    calls: do not modify it in place)."""
    return _span_ends(length, max_width, torch.device("cpu") if device is None else torch.device(device))


@functools.lru_cache(maxsize=64)
def _span_ends(length: int, max_width: int, device: torch.device) -> torch.Tensor:
    # cached: decoding a batch is dominated by fixed per-call costs, and this grid only
    # depends on the padded shape; made outside inference mode, so that training can still
    # index with it after a prediction filled the cache
    with torch.inference_mode(False):
        starts = torch.arange(length, device=device).view(-1, 1)
        return starts + torch.arange(max_width, device=device).view(1, -1)


def gold_label_grid(
    gold: torch.Tensor, lengths: torch.Tensor, length: int, max_width: int,
    n_labels: Optional[int] = None,
) -> torch.Tensor:
    """Scatter gold rows ``(doc, start, end inclusive, label)`` into a ``LongTensor[B, L, K]``
    of labels, for documents of ``lengths [B]`` padded to ``L = length`` and ``K = max_width``.

    Entries that are not gold spans hold 0 (null). Raises ``ValueError`` for a span outside its
    document, wider than ``max_width``, with a label below 1 (or above ``n_labels``), or
    overlapping another gold span (:func:`check_gold_spans`): the structured heads assume a
    valid segmentation, and a silent drop would hide a data bug; and for ``lengths`` that are
    not ``[B]`` integers between 0 and ``L``, as in :func:`span_mask`.
    """
    check_lengths(lengths)  # (a length of 4.5 would take a gold span ending on token 4)
    check_lengths(lengths, (lengths.numel(), length), "the grid")
    check_rows_type(gold)
    grid = torch.zeros(
        (lengths.shape[0], length, max_width), dtype=torch.long, device=lengths.device
    )
    if gold.numel() == 0:
        return grid
    doc, start, end, label = check_gold_spans(gold, lengths, length, max_width, n_labels)
    grid[doc, start, end - start] = label
    return grid


def check_rows_type(rows: torch.Tensor, what: str = "gold span") -> None:
    """A ``TypeError`` unless span ``rows`` are a tensor, as for lengths: a list of rows
    failed later on a missing tensor method."""
    if not isinstance(rows, torch.Tensor):
        raise TypeError(
            f"{what}s must be a tensor of rows (doc, start, end, label), [N, 4], got "
            f"{type(rows).__name__}"
        )


def check_span_rows(
    rows: torch.Tensor,
    lengths: torch.Tensor,
    length: int,
    max_width: Optional[int] = None,
    n_labels: Optional[int] = None,
    what: str = "gold span",
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The columns ``(doc, start, end, label)`` of span rows ``[N, 4]`` (on the device of
    ``lengths``), once checked: a ``ValueError`` (naming the rows ``what``) for a row that does
    not fit the batch's shape, a span outside its document, wider than ``max_width`` (if
    given), or with a label below 1 or above ``n_labels`` (if given), and for a floating-point
    entry that is not a whole number (it would be truncated to another token or label)."""
    check_rows_type(rows, what)
    if rows.is_floating_point() and not bool((rows == rows.trunc()).all()):
        raise ValueError(f"{what}s must be whole numbers (doc, start, end, label)")
    rows = rows.to(lengths.device).long()
    if rows.numel() == 0:
        rows = rows.reshape(0, 4)
    if rows.dim() != 2 or rows.shape[1] != 4:
        raise ValueError(
            f"{what}s must be rows (doc, start, end, label), [N, 4], got {tuple(rows.shape)}"
        )
    doc, start, end, label = rows.unbind(-1)
    if not rows.shape[0]:
        return doc, start, end, label
    if bool((doc < 0).any() or (doc >= lengths.shape[0]).any()):
        raise ValueError(f"{what} of a document outside the batch of {lengths.shape[0]}")
    width = end - start
    if bool((start < 0).any() or (end >= lengths[doc]).any() or (width < 0).any()
            or (end >= length).any()):
        raise ValueError(f"{what} outside its document (or end < start)")
    if max_width is not None and bool((width >= max_width).any()):
        raise ValueError(
            f"{what} of width {int(width.max()) + 1} exceeds max_width={max_width}"
        )
    if bool((label < 1).any()):
        raise ValueError(f"{what} labels must be entity ids >= 1 (0 is null)")
    if n_labels is not None and bool((label > n_labels).any()):
        raise ValueError(f"{what} label {int(label.max())} is not one of the {n_labels} labels")
    return doc, start, end, label


def check_gold_spans(
    gold: torch.Tensor,
    lengths: torch.Tensor,
    length: int,
    max_width: Optional[int] = None,
    n_labels: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`check_span_rows` for gold rows, which also must not overlap within a
    document."""
    doc, start, end, label = check_span_rows(gold, lengths, length, max_width, n_labels)
    if doc.shape[0]:
        cover = token_coverage(doc, start, end, lengths.shape[0], length)
        if bool((cover > 1).any()):
            raise ValueError("gold spans overlap within a document")
    return doc, start, end, label


def boundary_neighbors(
    gold: torch.Tensor, lengths: torch.Tensor, max_width: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The candidate spans one boundary step away from each gold span (Zhu and Li, 2022,
    "Boundary Smoothing for Named Entity Recognition", distance 1): ``i - 1 .. j``,
    ``i + 1 .. j``, ``i .. j - 1`` and ``i .. j + 1``, those that are candidates (inside the
    document, not empty, at most ``max_width`` wide).

    Returns ``(rows LongTensor[N, 4], share FloatTensor[N])``: rows ``(doc, start, width,
    label)`` in the grid layout, with the gold span's label, and ``share = 1 / n`` for a gold
    span with ``n`` such neighbours. Every neighbour overlaps its gold span, so none of them is
    gold (gold spans do not overlap); a span next to two gold spans appears twice.
    """
    gold = gold.to(lengths.device).long().view(-1, 4)
    doc, start, end, label = gold.unbind(-1)
    steps = torch.tensor([[-1, 0], [1, 0], [0, -1], [0, 1]], device=gold.device)
    n_start = start.unsqueeze(1) + steps[:, 0]  # [G, 4]
    n_end = end.unsqueeze(1) + steps[:, 1]
    ok = (n_start >= 0) & (n_end >= n_start) & (n_end - n_start < max_width)
    ok &= n_end < lengths[doc].unsqueeze(1)
    share = (1.0 / ok.sum(1).clamp_min(1).float()).unsqueeze(1).expand_as(n_start)
    rows = torch.stack(
        [doc.unsqueeze(1).expand_as(n_start), n_start, n_end - n_start,
         label.unsqueeze(1).expand_as(n_start)], dim=-1,
    )
    return rows[ok], share[ok]


def token_coverage(
    doc: torch.Tensor,
    start: torch.Tensor,
    end: torch.Tensor,
    batch: int,
    length: int,
    values: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``LongTensor[B, L]``: how many of the given spans cover each token, or with ``values``
    (one integer per span) the sum of the values of the spans covering it; for spans that do
    not overlap, that is the value of the one span on each covered token (difference array)."""
    diff = torch.zeros((batch, length + 1), dtype=torch.long, device=doc.device)
    values = torch.ones_like(start) if values is None else values.long()
    diff.index_put_((doc, start), values, accumulate=True)
    diff.index_put_((doc, end + 1), -values, accumulate=True)
    return diff.cumsum(1)[:, :length]


def overlap_mask(span_set: torch.Tensor) -> torch.Tensor:
    """``BoolTensor[B, L, K]``: grid spans that share a token with some span of ``span_set``.

    ``span_set`` is a boolean grid. A span ``i..j`` overlaps the set iff one of its tokens is
    covered (:func:`span_token_counts` of the coverage). Entries past the grid's end read as
    ending at its last token.
    """
    batch, length, max_width = span_set.shape
    doc, start, width = span_set.nonzero(as_tuple=True)
    covered = token_coverage(doc, start, start + width, batch, length) > 0
    return span_token_counts(covered, max_width) > 0


def document_mean(x: torch.Tensor, lengths: torch.Tensor, padded: bool = True) -> torch.Tensor:
    """``[B, L, D] -> [B, D]``: the mean of each document's token vectors (padding left out;
    zero for an empty document). ``padded=False`` says that every document fills the ``L``
    positions: the mask, all ones, is then skipped (multiplying by one changes nothing)."""
    if padded:
        x = x * token_mask(lengths.to(x.device), x.shape[1]).unsqueeze(-1).to(x.dtype)
    return x.sum(1) / lengths.to(x.device).clamp_min(1).unsqueeze(-1).to(x.dtype)


def same_word_mean(x: torch.Tensor, words: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``[B, L, D] -> [B, L, D]``: for each token, the mean of the vectors of the tokens of its
    document that carry the same word id (itself included); zero past each document's length.

    ``words`` is a ``LongTensor[B, L]`` of word ids (any int64 values, such as string hashes;
    any value at padding). One scatter-add over the tokens: linear in the document length, so
    a 100k-token document costs no more per token than a short one."""
    B, L, D = x.shape
    token, group, counts = _word_groups(words, lengths, L)
    if not torch.is_grad_enabled() and token.numel() == B * L and counts.numel() == B * L:
        # no padding and no word twice in a document (a short one, at prediction): each
        # mean is its token's vector, and the scatter below would compute 0 + x / 1 (an
        # add of 0.0 is kept, for the sign of a zero); no need for a dozen small ops
        return x + 0.0
    group = group.to(x.device)
    # without padding the tokens are the rows of x, in order: no gather, no scatter back
    unpadded = token.numel() == B * L
    if not unpadded:
        token = token.to(x.device)
    flat = x.reshape(B * L, D)
    tokens = flat if unpadded else flat.index_select(0, token)
    sums = tokens.new_zeros((counts.shape[0], D)).index_add_(0, group, tokens)
    means = sums / counts.to(x.device, x.dtype).unsqueeze(-1)
    # index_select, not advanced indexing (means[group]): the gradient of the latter is an
    # index_put_ with accumulation, which on CPU with several threads adds with parallel
    # atomics in no fixed order, so the same seed would not train the same model twice;
    # index_select's gradient is a serial index_add_
    out = means.index_select(0, group)
    if not unpadded:
        out = x.new_zeros((B * L, D)).index_copy(0, token, out)
    return out.view(B, L, D)


def _word_groups(
    words: torch.Tensor, lengths: torch.Tensor, length: int
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(token, group, counts)``: the flat positions of the tokens in the ``[B, L]`` grid, the
    group of each (one per (document, word) pair, numbered in (document, word id) order) and
    the size of each group. Integer bookkeeping with no gradient: on the host in NumPy, where a
    short document's dozen small calls cost a fraction of the same calls in PyTorch."""
    words_np = words.detach().cpu().numpy().astype("int64", copy=False)
    lengths_np = lengths.detach().cpu().numpy()
    if int(lengths_np.min(initial=length)) == length:  # no padding: the tokens fill the grid
        token = numpy.arange(words_np.size)
        ids = words_np.reshape(-1)
    else:
        token = numpy.flatnonzero(numpy.arange(length)[None, :] < lengths_np[:, None])
        ids = words_np.reshape(-1)[token]
    # sorted by (document, id): any int64 ids (such as string hashes) without forming a key
    # of both that could overflow; a group starts where either changes. By id first, then
    # stably by document (a radix sort of small integers), which lexsort's merge sorts of
    # both keys do at several times the cost
    order = numpy.argsort(ids)
    docs = None
    if lengths_np.size > 1:
        small = numpy.uint16 if lengths_np.size <= 1 << 16 else numpy.int64
        docs = (token // max(length, 1)).astype(small)[order]
        by_doc = numpy.argsort(docs, kind="stable")
        order, docs = order[by_doc], docs[by_doc]
    first = numpy.ones(ids.size, dtype=bool)
    sorted_ids = ids[order]
    numpy.not_equal(sorted_ids[1:], sorted_ids[:-1], out=first[1:])
    if docs is not None:
        first[1:] |= docs[1:] != docs[:-1]
    group = numpy.empty(ids.size, dtype=numpy.int64)
    group[order] = numpy.cumsum(first) - 1
    counts = numpy.diff(numpy.append(numpy.flatnonzero(first), ids.size))
    as_tensor = torch.from_numpy
    return as_tensor(token), as_tensor(group), as_tensor(counts)


def window_view(x: torch.Tensor, max_width: int) -> torch.Tensor:
    """``[B, L, D] -> [B, L, K, D]`` where entry ``(b, i, w)`` is ``x[b, i + w]`` (zero past L).

    A strided view of the zero-padded input: no copy, whatever K is.
    """
    return _windows(_pad_windows(x, max_width), max_width, slice(None), slice(0, x.shape[1]))


def _pad_windows(x: torch.Tensor, max_width: int) -> torch.Tensor:
    # One pad position more than needed, so that an empty document still has a window.
    return torch.nn.functional.pad(x, (0, 0, 0, max_width))


def _windows(padded: torch.Tensor, max_width: int, docs: slice, positions: slice) -> torch.Tensor:
    """The windows of :func:`window_view` of the documents ``docs`` starting at ``positions``,
    read from the zero-padded ``[B, L + K, D]`` input (a view)."""
    return padded[docs].unfold(1, max_width, 1)[:, positions].transpose(-1, -2)


def _prefix_terms(
    cumsum: torch.Tensor,
    start: Optional[torch.Tensor],
    end: Optional[torch.Tensor],
    before: Optional[torch.Tensor],
    after: Optional[torch.Tensor],
    max_width: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(ends [B, L + K, H], starts [B, L, H])`` of the sum featurizers, from the running sum
    ``cumsum[t] = proj[0] + ... + proj[t]``: span ``i .. j`` is ``ends[j] - starts[i]``, with

    ``ends[j] = cumsum[j] + end[j] + after[j + 1]`` (zero for ``j >= L``, the window padding),
    ``starts[i] = cumsum[i - 1] - (start[i] + before[i - 1])`` (terms past the edges are 0).

    Each term is written into one buffer: the shifted neighbour terms, the prefix sums and the
    window padding need no zero-padded copies, and in prediction on large tensors each sum is
    one pass over these ``[B, L, H]`` tensors (same values as adding the terms one by one, up
    to the sign of a zero)."""
    B, L, H = cumsum.shape
    # in the running sum's precision: under CUDA autocast the projections are float16 and their
    # running sum float32, which a float16 copy would round to ~2^-11 of its size (and the
    # one-pass neg below takes no output of another dtype); a no-op without autocast
    if any(t is not None and t.dtype != cumsum.dtype for t in (start, end, before, after)):
        start, end, before, after = (
            None if t is None else t.to(cumsum.dtype) for t in (start, end, before, after))
    # one pass per sum (out=, which autograd cannot record: prediction only), where the tensors
    # are large enough that a pass costs more than the extra operator calls
    fused = not torch.is_grad_enabled() and cumsum.numel() >= ONE_PASS_MIN_ENTRIES
    padded = cumsum.new_empty((B, L + max_width, H))
    padded[:, L:].zero_()
    ends = padded[:, :L]
    if end is None:
        ends.copy_(cumsum)
    elif not fused:
        ends.copy_(end)
        if after is not None:
            ends[:, :-1].add_(after[:, 1:])
        ends += cumsum
    elif after is None:
        torch.add(end, cumsum, out=ends)
    else:
        torch.add(end[:, :-1], after[:, 1:], out=ends[:, :-1])
        ends[:, -1:].copy_(end[:, -1:])
        ends += cumsum
    if start is None:
        starts = cumsum.new_empty((B, L, H))
        starts[:, :1].zero_()
        starts[:, 1:].copy_(cumsum[:, :-1])
    elif not fused:
        # -(start + before) = -start - before exactly (rounding is symmetric in the sign)
        starts = torch.neg(start)
        if before is not None:
            starts[:, 1:].sub_(before[:, :-1])
        starts[:, 1:].add_(cumsum[:, :-1])
    else:
        # cumsum - (start + before) in two passes: the same bits as the three above, as a
        # running sum from +0 is never -0
        starts = cumsum.new_empty((B, L, H))
        torch.neg(start[:, :1], out=starts[:, :1])
        body = start[:, 1:]
        if before is not None:
            body = torch.add(body, before[:, :-1], out=starts[:, 1:])
        torch.sub(cumsum[:, :-1], body, out=starts[:, 1:])
    return padded, starts


def running_sum(x: torch.Tensor) -> torch.Tensor:
    """``x.cumsum(1)`` of a ``[B, L, H]`` tensor, bit for bit.

    PyTorch's CPU kernel adds one entry at a time into a float64 sum, which costs about 2 ns
    an entry on long documents; without autograd, a float32 batch of long documents takes the
    same float64 sums a whole ``[B, H]`` row of positions at a time in NumPy, 1.5 to 2 times
    as fast there (slower on short or few documents, which keep the kernel)."""
    B, L, H = x.shape
    if (torch.is_grad_enabled() or x.device.type != "cpu" or x.dtype != torch.float32
            or L < RUNNING_SUM_MIN_LENGTH or B * H < RUNNING_SUM_MIN_ROW):
        return x.cumsum(1)
    src = x.detach().numpy()
    out = numpy.empty((B, L, H), dtype=numpy.float32)
    total = numpy.zeros((B, H), dtype=numpy.float64)  # +0 first, as the kernel's sum
    for t in range(L):
        numpy.add(total, src[:, t], out=total)
        out[:, t] = total
    return torch.from_numpy(out)


def window_max(x: torch.Tensor, max_width: int) -> torch.Tensor:
    """``[B, L, H] -> [B, L, K, H]`` where entry ``(b, i, w)`` is the elementwise maximum of
    ``x[b, i .. i + w]`` (zero padding past L).

    A running maximum over the widths, one ``[B, L, H]`` step per width, stacked once. Against
    ``cummax`` over the window view, which also writes an int64 index tensor of the full size,
    it was about 10x faster forward and 1.5x forward+backward (CPU, one thread, B 32, L 150,
    K 10, H 128); its backward is a mask per step.
    """
    return _window_max(x, _pad_windows(x, max_width), max_width, slice(None), slice(0, x.shape[1]))


def _window_max(
    x: torch.Tensor, padded: torch.Tensor, max_width: int, docs: slice, positions: slice
) -> torch.Tensor:
    """:func:`window_max` of the documents ``docs`` at ``positions``, from ``x`` and its
    zero-padded ``[B, L + K, H]`` copy."""
    first, stop = positions.start, positions.stop
    running = x[docs, first:stop]
    steps = [running]
    for w in range(1, max_width):
        running = torch.maximum(running, padded[docs, first + w : stop + w])
        steps.append(running)
    return torch.stack(steps, dim=2)


def grid_chunks(batch: int, length: int, max_width: int, spans: int) -> List[Tuple[slice, slice]]:
    """``(docs, positions)`` slices that cover the ``[B, L]`` positions in order, each holding
    about ``spans`` grid entries (``positions * K``) and at least half as many (the last chunk
    takes in a smaller rest), so that prediction can build the ``[B, L, K, H]`` span
    representations a cache-sized chunk at a time. A chunk is either whole documents or part
    of one, so its rows of a ``[..., B, L, K]`` tensor are contiguous."""
    if batch * length == 0:
        return []
    per_chunk = max(1, spans // max_width)  # positions
    if length <= per_chunk:
        step, total = max(1, per_chunk // length), batch
    else:
        step, total = per_chunk, length
    bounds = list(range(0, total, step)) + [total]
    if len(bounds) > 2 and (bounds[-1] - bounds[-2]) * 2 < step:
        del bounds[-2]
    pieces = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    if length <= per_chunk:
        return [(docs, slice(0, length)) for docs in pieces]
    return [(slice(b, b + 1), positions) for b in range(batch) for positions in pieces]


class SpanTerms(NamedTuple):
    """The per-token parts of a batch's span representations, from which
    :meth:`SpanFeaturizer.grid` builds the ``[B, L, K, H]`` grid (or a chunk of it).

    ``ends``: ``[B, L + K, H]``, zero-padded, the term of each span's last token (read
    through its windows), or None; ``starts``: ``[B, L, H]``, the term of each span's first
    token, added (``endpoints``) or subtracted (sums), or None; ``peak``: the tokens
    max-pooled over each span, ``[B, L, H]`` with its zero-padded copy, or None; ``bias``: ``[K, H]`` or, with the
    document term, ``[B, 1, K, H]``.
    """

    ends: Optional[torch.Tensor]
    starts: Optional[torch.Tensor]
    peak: Optional[Tuple[torch.Tensor, torch.Tensor]]
    bias: torch.Tensor


class SpanFeaturizer(nn.Module):
    """Span representations ``r(i, j)`` on the grid: ``[B, L, D] -> [B, L, K, H]``.

    ``endpoints``: ``relu(W [h_i; h_j; width_emb(j - i)] + b)``. The affine map splits into a
    start part and an end part computed once per token and a width part computed once per
    width, so the per-span cost is two adds and the nonlinearity.
    ``sum`` / ``mean`` / ``max``: pooling of ``W h_t`` over ``t = i..j`` plus a width embedding,
    then the nonlinearity. Projecting before pooling is exact for sum and mean (linearity) and
    keeps the pooled tensor H wide instead of D wide; sums are differences of prefix sums over
    the tokens, one subtraction per span.
    ``sum_endpoints``: both, ``relu(W_s h_i + W_e h_j + sum_t W_p h_t + width_emb(j - i))``: the
    boundary tokens get their own weights on top of the pooled content.
    ``sum_endpoints_neighbors``: ``sum_endpoints`` plus ``U_b h_{i-1} + U_a h_{j+1}``, the
    tokens just outside the span (zero at a document's edge): what precedes and follows a
    mention ("Mr.", "said", "Inc.") is often the best clue to its type. ``U`` has no bias, so
    a zero vector adds nothing; callers must pass ``x`` zeroed past each document's length
    (``reach`` is 1: spans read one token beyond their own).
    ``sum_endpoints_neighbors_max``: that plus ``max_t W_m h_t`` over the span's tokens
    (elementwise), the max pooling that spaCy's ``spancat`` reducer also uses: a sum cannot tell
    one strongly typed token from several weak ones.

    With ``doc_vector``, ``V mean_t h_t``, a projection of the mean of the document's token
    vectors (:func:`document_mean`), is added to every span of that document: what a document
    is about (a football results table, a market report) often decides whether a city name is
    a LOC or an ORG, and lies beyond the few tokens a CNN tok2vec sees. Callers pass the mean
    (``forward(x, doc=...)``), so that a document featurized in blocks still gets the mean of
    all its tokens. It folds into the width embedding's add: no extra pass over the grid.

    With ``norm``, a layer normalisation over the ``H`` features comes before the ReLU, as in the
    Maxout layer of ``spancat``'s reducer: a sum over a span grows with its width, and the
    normalisation puts spans of every width on one scale.

    The ``[B, L, K, H]`` tensor is the largest in the model, so it is built with as few passes
    as possible (one out-of-place op, then in-place ones) and with ReLU, which costs a fraction
    of GELU's ``erf`` at this size.
    """

    def __init__(
        self,
        input_width: int,
        hidden_width: int,
        max_width: int,
        span_repr: str = "sum",
        norm: bool = False,
        doc_vector: bool = False,
    ) -> None:
        super().__init__()
        if span_repr not in SPAN_REPRS:
            raise ValueError(f"span_repr must be one of {SPAN_REPRS}, got {span_repr!r}")
        check_integer("input_width", input_width, 1)
        check_integer("hidden_width", hidden_width, 1)
        check_integer("max_width", max_width, 1)
        check_flag("norm", norm)
        check_flag("doc_vector", doc_vector)
        self.span_repr = span_repr
        self.max_width = max_width
        # max pooling of a further projection on top of the sums
        self.pool_max = span_repr.endswith("_max")
        n_proj = 2 if span_repr == "endpoints" else 3 if span_repr.startswith("sum_endpoints") else 1
        self.token_proj = nn.Linear(input_width, (n_proj + self.pool_max) * hidden_width)
        # how many tokens past each end of a span its representation reads
        self.reach = 1 if span_repr.startswith("sum_endpoints_neighbors") else 0
        if self.reach:
            self.neighbor_proj = nn.Linear(input_width, 2 * hidden_width, bias=False)
        self.width_emb = nn.Parameter(torch.zeros(max_width, hidden_width))
        nn.init.normal_(self.width_emb, std=0.02)
        self.norm = nn.LayerNorm(hidden_width) if norm else None
        self.doc_proj = nn.Linear(input_width, hidden_width, bias=False) if doc_vector else None

    def forward(self, x: torch.Tensor, doc: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x [B, L, D]`` (zeroed past each document's length if ``reach``) and, with
        ``doc_vector``, ``doc [B, D]``, the mean token vector of each document; ``D`` is
        ``input_width``.

        Raises ``ValueError`` for ``x`` or ``doc`` of another shape: one document without its
        batch axis, or vectors of another width, failed inside PyTorch (or, for some
        ``span_repr``, gave the terms of a wrong grid), and a ``doc`` of one row was added to
        every document of a batch."""
        return self.grid(self.terms(x, doc), slice(None), slice(0, x.shape[1]))

    def terms(self, x: torch.Tensor, doc: Optional[torch.Tensor] = None) -> SpanTerms:
        """The per-token terms of :meth:`forward` (same arguments, same errors)."""
        if (doc is None) != (self.doc_proj is None):
            raise ValueError("doc must be given exactly when the featurizer has doc_vector")
        width = self.token_proj.in_features
        check_shape(x, "x", "[B, L, D]", (None, None, width), "the featurizer's input_width")
        if doc is not None:
            check_shape(doc, "doc", "[B, D]", (x.shape[0], width),
                        "x's documents and the featurizer's input_width")
        proj = self.token_proj(x)
        K = self.max_width
        ends = starts = peak = None
        if self.span_repr == "endpoints":
            starts, ends = proj.chunk(2, dim=-1)
        elif self.span_repr != "max":  # sums of the projected tokens, and the boundary terms
            start = end = None
            if self.pool_max:
                hidden_width = self.width_emb.shape[1]
                proj, peak = proj.split([proj.shape[-1] - hidden_width, hidden_width], dim=-1)
            if self.span_repr.startswith("sum_endpoints"):
                start, end, proj = proj.chunk(3, dim=-1)
            before = after = None
            if self.reach:  # U_b h_t and U_a h_t: span i..j reads them at i - 1 and j + 1
                before, after = self.neighbor_proj(x).chunk(2, dim=-1)
            ends, starts = _prefix_terms(running_sum(proj), start, end, before, after, K)
        else:
            peak = proj
        bias = self.width_emb  # [K, H], or [B, 1, K, H] with the document term
        if self.doc_proj is not None:
            bias = bias + self.doc_proj(doc)[:, None, None, :]
        if self.span_repr == "endpoints":
            ends = _pad_windows(ends, K)
        return SpanTerms(
            ends, starts,
            None if peak is None else (peak, _pad_windows(peak, K)), bias,
        )

    def grid(
        self, terms: SpanTerms, docs: slice, positions: slice, buffer: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """``[b, p, K, H]``: the representations of the spans of documents ``docs`` that start
        at ``positions`` (slices of the ``[B, L]`` positions :meth:`terms` was given), written
        into the start of ``buffer`` (a flat tensor of at least ``b * p * K * H`` entries)
        if given: chunks that reuse one buffer find it in the cache."""
        K = self.max_width
        if terms.ends is not None:
            ends = _windows(terms.ends, K, docs, positions)
            starts = terms.starts[docs, positions].unsqueeze(2)
            out = None if buffer is None else buffer[: ends.numel()].view(ends.shape)
            if self.span_repr == "endpoints":
                pooled = torch.add(ends, starts, out=out)
            else:
                pooled = torch.sub(ends, starts, out=out)
            if self.span_repr == "mean":
                widths = torch.arange(1, K + 1, device=pooled.device, dtype=pooled.dtype)
                pooled.div_(widths.view(1, 1, -1, 1))
            if terms.peak is not None:
                pooled.add_(_window_max(*terms.peak, K, docs, positions))
        else:
            pooled = _window_max(*terms.peak, K, docs, positions)
        pooled.add_(terms.bias if terms.bias.dim() == 2 else terms.bias[docs])
        if self.norm is not None:
            pooled = self.norm(pooled)
        return pooled.relu_()
