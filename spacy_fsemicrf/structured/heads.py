"""The three structured NER heads, as PyTorch modules with one shared interface.

Each head maps token vectors ``X [B, L, D]`` and ``lengths [B]`` to

* ``forward(X, lengths, gold)`` with gold rows ``(doc, start, end, label)``: the training loss,
  summed over documents (a scalar tensor);
* ``forward(X, lengths)``: the decoded entities ``(spans [N, 4], confidences [N])``, where
  the confidence of a span is the probability that it is an entity: for the filtered head the
  local classifier's probability of its label times its marginal on the filtered graph, for
  the others its marginal (:mod:`.confidences`);
* ``forward(X, lengths, options=DecodeOptions(...))``: a :class:`~.prediction.Prediction`,
  which adds what the options ask for: the decoded path's probability, the candidates, and
  decoding under constraints (:mod:`.constrained`);
* ``nbest(X, lengths, k)``: the k best segmentations of each document, fewer where fewer have
  a probability above 0 (:mod:`.nbest`).

At prediction (``forward`` without gold, ``decode``, ``nbest``), ``sentence_starts`` (a
``BoolTensor[B, L]``, True at a token that starts a sentence) keeps every entity within its
sentence. The constructors refuse a setting of the wrong type or range (a width that is not a
positive integer, a dropout outside [0, 1], a NaN weight) with a ``ValueError`` naming it.

``FilteredSemiCRFHead`` is the product; ``SemiCRFHead`` and ``LinearCRFHead`` are the baselines
of the paper, on the same encoder. With ``context_depth > 0`` each head first runs a BiLSTM over
the token vectors (:class:`~.context.TokenContext`), as the paper's released code does. With
``word_pool`` each head then adds to each token a projection of the mean vector of its word's
tokens in the document (:class:`~.context.WordPool`); it takes the word ids as
``forward(..., words=LongTensor[B, L])``.
"""
import math
from typing import List, Optional, Tuple, Union

import torch
from torch import nn

from . import filtered
from .confidences import (
    crf_candidates,
    filtered_path_scores,
    local_label_probability,
    span_candidates,
)
from .constrained import crf_constrained, filtered_constrained, semicrf_constrained
from .context import TokenContext, WordPool
from .growth import grow_outputs, grow_parameter, grow_transitions, labels_to_wake, wake_channels
from .linear_crf import (
    consistent_emissions,
    crf_log_partition,
    crf_score,
    crf_span_marginals,
    crf_viterbi,
    sentence_emissions,
    spans_to_tags,
    tag_scheme,
    tags_to_spans,
)
from .mean_field import MeanFieldRefiner, node_features
from .nbest import Segmentation, crf_nbest, filtered_nbest, semicrf_nbest
from .null_tokens import add_null_tokens, null_token_scores
from .prediction import DecodeOptions, Prediction, path_probability
from .semicrf import (
    semicrf_gold_score,
    semicrf_log_partition,
    semicrf_marginals_and_log_z,
    semicrf_viterbi,
)
from .semiring import masked_fill_neg, wide
from .spans import (
    SpanFeaturizer,
    boundary_neighbors,
    check_flag,
    check_integer,
    check_lengths,
    check_number,
    check_probability,
    check_rows_type,
    check_sentence_starts,
    check_shape,
    consistent_segments,
    crossing_spans,
    document_mean,
    gold_label_grid,
    grid_chunks,
    incorrect_label_grid,
    partial_annotation,
    span_mask,
    token_mask,
    unknown_spans,
)

Decoded = Tuple[torch.Tensor, torch.Tensor]
HeadOutput = Union[torch.Tensor, Decoded, Prediction]

# Prediction computes span scores in blocks of this many positions, so that the [B, L, K, H]
# span representations of a 100k-token document never exist at once.
PREDICT_BLOCK = 2048
# ... and on a CPU builds the span representations in chunks of about this many floats (1 MiB),
# which fit a core's cache. No chunk is below half of it (a smaller batch is one chunk): matrix
# products that long give the same entries as one over the whole batch (very short ones may
# round differently).
PREDICT_CHUNK_ELEMENTS = 2**18


def check_batch(X: torch.Tensor, lengths: torch.Tensor, width: Optional[int] = None) -> None:
    """A ``ValueError`` unless ``X`` is ``[B, L, D]`` and ``lengths`` ``[B]`` integers, each
    length between 0 and ``L`` (:func:`~.spans.check_lengths`), and, with ``width`` (the
    head's ``input_width``), unless ``D`` is ``width``: vectors of another width failed in a
    matrix product with an error that did not name them."""
    check_lengths(lengths)
    if X.dim() != 3 or lengths.dim() != 1 or lengths.shape[0] != X.shape[0]:
        raise ValueError(
            f"token vectors must be [B, L, D] and lengths [B], one per document, got "
            f"{tuple(X.shape)} and {tuple(lengths.shape)}"
        )
    if width is not None:
        check_shape(X, "X", "[B, L, D]", (None, None, width), "the head's input_width")
    check_lengths(lengths, tuple(X.shape[:2]), "X")


def check_classes(scores: torch.Tensor, name: str, layout: str, n: int, what: str) -> None:
    """A ``ValueError`` unless ``scores`` are laid out as ``layout`` with ``n`` classes (its
    last axis), ``what`` the head's classes: scores of another label set decoded to labels
    the head does not have (or, with its transitions, failed inside PyTorch)."""
    shape = (None,) * layout.count(",") + (n,)
    check_shape(scores, name, layout, shape, what)


def check_scores(scores: torch.Tensor) -> None:
    """A ``ValueError`` if a score is NaN: decoding would quietly find no entities (NaN loses
    every comparison), where the cause is a model whose weights or input vectors are not
    finite."""
    # the maximum propagates NaN: one reduction, where isnan().any() over the heads'
    # label-major scores costs ten times as much
    if scores.numel() and math.isnan(float(scores.detach().amax())):
        raise ValueError(
            "the head's scores are NaN: the model's weights or the token vectors it was given "
            "are not finite (did its training diverge?)"
        )


def _check_head_settings(input_width: int, max_width: int, hidden_width: int,
                         dropout: float, **flags: bool) -> None:
    """A ``ValueError`` naming the setting, at construction, for a bad value of a setting
    every head has: a hidden width of 0 built a head that failed at its first batch, a
    max_width of 2.5 failed in PyTorch (the linear CRF took it), a dropout of NaN was taken;
    and for a yes/no setting among ``flags`` that is no bool (:func:`check_flag`)."""
    check_integer("input_width", input_width, 1)
    check_integer("max_width", max_width, 1)
    check_integer("hidden_width", hidden_width, 1)
    check_probability("dropout", dropout)
    for name, value in flags.items():
        check_flag(name, value)


def _empty_decoded(device: torch.device) -> Decoded:
    return (
        torch.zeros((0, 4), dtype=torch.long, device=device),
        torch.zeros((0,), device=device),
    )


class _SpanScorer(nn.Module):
    """Dropout, a :class:`SpanFeaturizer` (layer-normalised with ``span_norm``, with the
    document's mean vector with ``doc_vector``),
    ``hidden_depth - 1`` more hidden layers over each span, and a linear output layer:
    ``[B, L, D] -> [B, L, K, n_out]``."""

    def __init__(
        self,
        input_width: int,
        n_out: int,
        max_width: int,
        hidden_width: int,
        span_repr: str,
        dropout: float,
        hidden_depth: int = 1,
        span_norm: bool = False,
        doc_vector: bool = False,
    ) -> None:
        super().__init__()
        check_integer("hidden_depth", hidden_depth, 1)
        self.max_width = max_width
        self.dropout = nn.Dropout(dropout)
        self.featurizer = SpanFeaturizer(
            input_width, hidden_width, max_width, span_repr, norm=span_norm, doc_vector=doc_vector
        )
        self.hidden = nn.ModuleList(
            nn.Linear(hidden_width, hidden_width) for _ in range(hidden_depth - 1)
        )
        self.output = nn.Linear(hidden_width, n_out)

    def forward(self, X: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        reach = self.featurizer.reach
        # without padding (one document, or documents of one length) the masks are all ones;
        # checked on the host only, where it costs no device sync
        padded = lengths.device.type != "cpu" or bool((lengths < X.shape[1]).any())
        if reach and padded:  # spans read their neighbours: padding must add nothing
            X = X * token_mask(lengths.to(X.device), X.shape[1]).unsqueeze(-1).to(X.dtype)
        # the whole document's mean, before any blocking
        doc = None
        if self.featurizer.doc_proj is not None:
            doc = document_mean(X, lengths, padded)
        if torch.is_grad_enabled() or X.shape[1] <= PREDICT_BLOCK:
            return self._score(X, doc)
        # Spans starting in a block read at most K - 1 + reach tokens past it, and reach before.
        K, L = self.max_width, X.shape[1]
        blocks = []
        for a in range(0, L, PREDICT_BLOCK):
            b = min(a + PREDICT_BLOCK, L)
            lo = max(a - reach, 0)
            blocks.append(self._score(X[:, lo : b + K - 1 + reach], doc)[:, a - lo : b - lo])
        return torch.cat(blocks, dim=1)

    def _score(self, X: torch.Tensor, doc: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Scores laid out label-major in memory (a ``[B, L, K, n_out]`` view of an
        ``[n_out, B, L, K]`` tensor): reductions over the labels, such as the filter's argmax,
        then read contiguous planes, which is about ten times faster on CPU than reducing
        across a short innermost axis. The matmul costs the same either way."""
        # (an nn.Dropout call in eval mode returns X, after a module call's overhead)
        X = self.dropout(X) if self.training else X
        B, L, K = X.shape[0], X.shape[1], self.max_width
        if torch.is_grad_enabled() or X.device.type != "cpu":
            out = self._output(self.featurizer(X, doc)).view(self.output.out_features, B, L, K)
        else:
            # On a CPU, a chunk of span representations that stays in the cache makes the
            # passes over them up to twice as fast; every entry is computed as in one piece.
            out = X.new_empty((self.output.out_features, B, L, K))
            terms = self.featurizer.terms(X, doc)
            H = self.featurizer.width_emb.shape[1]
            chunks = grid_chunks(B, L, K, PREDICT_CHUNK_ELEMENTS // H)
            # several chunks write their representations into one buffer, which stays in the
            # cache (the largest chunk's size); a single chunk needs none
            buffer = None
            if len(chunks) > 1:
                size = max((d.stop - d.start) * (p.stop - p.start) for d, p in chunks)
                buffer = X.new_empty((size * K * H,))
            for docs, positions in chunks:
                hidden = self.featurizer.grid(terms, docs, positions, buffer)
                self._output(hidden, out[:, docs, positions].view(out.shape[0], -1))
        return out.permute(1, 2, 3, 0)

    def _output(self, hidden: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``[n_out, n]``: the hidden layers and the output layer of the ``n`` span
        representations ``[..., H]``, label-major (written into ``out`` if given)."""
        for layer in self.hidden:
            hidden = layer(hidden).relu_()
        H = hidden.shape[-1]
        return torch.addmm(self.output.bias.unsqueeze(1), self.output.weight,
                           hidden.reshape(-1, H).T, out=out)


class FilteredSemiCRFHead(nn.Module):
    """Filtered semi-Markov CRF (Zaratiana et al., 2023).

    A local classifier labels every candidate span; the spans it does not call null become the
    nodes of a graph whose paths are scored by a second, global head. Training minimises
    ``L_loc + L_glob``: the cross-entropy of the local classifier over all candidates (null
    spans weighted by ``null_weight``) plus the global CRF loss over the gold-constrained node
    set. Decoding is the best path; a node's confidence is the local probability of its label
    times its marginal on the filtered graph.

    With ``boundary_smoothing = eps > 0`` the local targets are smoothed as in Zhu and Li (2022):
    a gold span's target keeps ``1 - eps`` on its label and puts ``eps`` on null, and each of its
    ``n`` neighbours one boundary step away (:func:`~.spans.boundary_neighbors`), a null span,
    moves ``eps / n`` of its target from null to that label (weighted by ``null_weight``, like
    every null span). It only changes the local loss: no cost at prediction.

    ``filter_margin`` (prediction only, log-odds): keep the spans whose best entity label scores
    above null minus the margin. A node that overlaps no other is always on the best path, so
    the margin is the threshold of the prediction: above 0 it trades precision for recall at
    small margins; past about 1 or 2 (on the corpora measured) overlapping kept nodes push
    right ones off the best path and recall falls too.

    With ``null_tokens`` a path may leave kept nodes out (:mod:`.null_tokens`): every token a
    node covers also gets a null, scored by the global head's null output at that token, so the
    path CRF can overrule the filter. Training then keeps every predicted node, not only those
    that overlap a gold span: the gold spans and the nulls of the other covered tokens are a
    path whatever the other nodes are. Needs ``transitions = False``.

    ``train_margin``: the filter's margin when it picks the training nodes (0, as the paper). With
    null tokens, a training margin as large as the prediction's shows the path CRF the nodes a
    softer filter lets in, so that it learns to leave the wrong ones out.

    ``mean_field = M > 0`` refines the kept nodes' global scores by ``M`` mean-field layers
    between nodes that overlap or touch (:mod:`.mean_field`) before the path CRF, in training
    and prediction alike; their features are the token vectors at each node's boundaries, so
    the methods that score nodes take the token vectors too (``tokens=``).

    ``exact_loss = w > 0`` adds ``w`` times the exact semi-CRF loss of the global scores over
    every segmentation (:mod:`.semicrf`; the global null output scores the one-token null
    segments, as it scores the null tokens) to the training loss: the span representation the
    local classifier shares with the global scores then also learns from whole segmentations.
    Training only.

    ``focal_gamma = g > 0`` multiplies each span's local cross-entropy by ``(1 - p)^g``, ``p``
    the probability of its gold label (the focal loss of Lin et al., 2017): the many spans the
    classifier already calls null with confidence weigh little, so they do not teach it to call
    null the entities it is unsure of. Training only.
    """

    def __init__(
        self,
        input_width: int,
        n_labels: int,
        *,
        max_width: int = 10,
        hidden_width: int = 128,
        span_repr: str = "sum_endpoints_neighbors",
        transitions: bool = False,
        null_weight: float = 0.75,
        dropout: float = 0.1,
        hidden_depth: int = 1,
        context_depth: int = 0,
        span_norm: bool = False,
        boundary_smoothing: float = 0.0,
        doc_vector: bool = False,
        word_pool: bool = False,
        null_tokens: bool = False,
        train_margin: float = 0.0,
        mean_field: int = 0,
        exact_loss: float = 0.0,
        focal_gamma: float = 0.0,
    ) -> None:
        super().__init__()
        _check_head_settings(
            input_width, max_width, hidden_width, dropout, transitions=transitions,
            span_norm=span_norm, doc_vector=doc_vector, word_pool=word_pool,
            null_tokens=null_tokens,
        )
        check_integer("n_labels", n_labels)
        check_integer("mean_field", mean_field, 0)
        # (NaN passes the range checks below: a loss weight of NaN turned its loss off)
        settings = {"null_weight": null_weight, "boundary_smoothing": boundary_smoothing,
                    "train_margin": train_margin, "exact_loss": exact_loss,
                    "focal_gamma": focal_gamma}
        for name, value in settings.items():
            check_number(name, value)
        if focal_gamma < 0:
            raise ValueError(f"focal_gamma must be >= 0, got {focal_gamma}")
        if exact_loss < 0:
            raise ValueError(f"exact_loss must be >= 0, got {exact_loss}")
        if n_labels < 1:
            raise ValueError(f"a filtered head needs at least one entity label, got {n_labels}")
        if null_tokens and transitions:
            raise ValueError("null_tokens needs transitions = false: a cell that holds a node "
                             "and a null could not tell their labels apart")
        if not 0.0 < null_weight <= 1.0:
            raise ValueError(f"null_weight must be in (0, 1], got {null_weight}")
        if not 0.0 <= boundary_smoothing < 1.0:
            raise ValueError(f"boundary_smoothing must be in [0, 1), got {boundary_smoothing}")
        self.n_labels = n_labels
        # outputs of labels added by add_labels that training has woken so far (an optimizer
        # with state per parameter may start that state afresh when it grows)
        self.label_wakes = 0
        self.max_width = max_width
        self.null_weight = null_weight
        self.boundary_smoothing = boundary_smoothing
        self.null_tokens = null_tokens
        self.train_margin = train_margin
        self.exact_loss = exact_loss
        self.focal_gamma = focal_gamma
        C = n_labels + 1
        self.context = TokenContext(input_width, context_depth)
        self.word_pool = WordPool(self.context.output_width, word_pool)
        # One scorer with 2C outputs: the local scores and the global scores share the span
        # representation, as in the paper.
        self.scorer = _SpanScorer(
            self.context.output_width, 2 * C, max_width, hidden_width, span_repr, dropout,
            hidden_depth, span_norm, doc_vector,
        )
        self.transitions = nn.Parameter(torch.zeros(C + 1, C + 1)) if transitions else None
        self.refiner = (
            MeanFieldRefiner(2 * self.context.output_width, C, mean_field) if mean_field else None
        )

    def span_scores(
        self, X: torch.Tensor, lengths: torch.Tensor, words: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(local [B, L, K, C], global [B, L, K, C])`` span scores."""
        return self._encode(X, lengths, words)[1:]

    def _encode(
        self, X: torch.Tensor, lengths: torch.Tensor, words: Optional[torch.Tensor] = None,
        predicting: bool = False,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(tokens [B, L, D'], local, global)``: the token vectors the span scorer reads
        (which the mean-field layers read too) and the span scores, checked for NaN when
        ``predicting`` (in training, mixed precision may overflow a step: the scaler skips it)."""
        check_batch(X, lengths, self.context.input_width)
        tokens = self.word_pool(self.context(X, lengths), lengths, words)
        scores = self.scorer(tokens, lengths)
        if predicting:
            check_scores(scores)  # both halves at once
        local, glob = scores.chunk(2, dim=-1)
        return tokens, local, glob

    def _check_span_scores(self, local: torch.Tensor, glob: Optional[torch.Tensor]) -> None:
        """:func:`check_classes` of the ``local`` scores, and ``glob`` (if given) of their
        shape."""
        check_classes(local, "local", "[B, L, K, C]", self.n_labels + 1,
                      f"the head's {self.n_labels} labels and null")
        if glob is not None:
            check_shape(glob, "glob", "[B, L, K, C]", tuple(local.shape), "local")

    def refine(
        self, glob: torch.Tensor, index: torch.Tensor, labels: torch.Tensor,
        tokens: Optional[torch.Tensor],
    ) -> Optional[torch.Tensor]:
        """``[n]``: the global scores of the nodes at flat grid ``index`` with ``labels``,
        refined by the mean-field layers; None without them. Raises ``ValueError`` unless
        ``tokens`` are the ``[B, L, D']`` vectors the head's span scorer reads (``D'`` its
        context's output width), for the documents and tokens of ``glob``."""
        if self.refiner is None:
            return None
        if tokens is None:
            raise ValueError("a filtered head with mean_field > 0 needs the token vectors "
                             "(tokens=...) to score its nodes")
        shape = tuple(glob.shape[:3])
        # (another shape failed in a reshape or a matrix product, naming neither)
        check_shape(tokens, "tokens", "[B, L, D]", (*shape[:2], self.context.output_width),
                    "glob's documents and tokens and the head's token width")
        # the refiner's own precision: float32 under mixed precision, float64 in a double head
        dtype = self.refiner.dtype
        unary = filtered.label_planes(glob).index_select(1, index).T.to(dtype)
        features = node_features(tokens.to(dtype), index, shape)
        logits = self.refiner(unary, features, index, shape)
        return logits.gather(1, labels.unsqueeze(1)).squeeze(1)

    def forward(
        self,
        X: torch.Tensor,
        lengths: torch.Tensor,
        gold: Optional[torch.Tensor] = None,
        filter_margin: float = 0.0,
        words: Optional[torch.Tensor] = None,
        options: Optional[DecodeOptions] = None,
        sentence_starts: Optional[torch.Tensor] = None,
        known: Optional[torch.Tensor] = None,
        incorrect: Optional[torch.Tensor] = None,
    ) -> HeadOutput:
        """Training with ``gold`` (rows ``(doc, start, end inclusive, label 1..M)`` that segment
        each document): the summed loss, a scalar. Without: the decoded ``(spans [N, 4],
        confidences [N])``, or with ``options`` the whole :class:`Prediction` (path
        probabilities, candidates, constrained decoding). ``X [B, L, D]`` are the token vectors
        of documents of ``lengths``; ``words`` their word ids (with ``word_pool``);
        ``filter_margin`` as in the class docstring. With ``sentence_starts`` (``BoolTensor
        [B, L]``, True at a token that starts a sentence; prediction only) no entity crosses a
        sentence boundary: the spans that would are no candidates (as spaCy's ``ner``). With
        ``known`` (``BoolTensor [B, L]``, False at a token without entity annotation; training
        only) the annotation is partial: the loss learns every path consistent with it, and
        ``incorrect`` rows (as ``gold``; training only) are entities known to be wrong there
        (spaCy's ``incorrect_spans_key``): no consistent path holds one."""
        if gold is not None and self.training:
            self._wake_labels(gold)
        tokens, local, glob = self._encode(X, lengths, words, predicting=gold is None)
        if gold is not None:
            return self.loss(local, glob, lengths, gold, tokens, known, incorrect)
        prediction = self.decode(local, glob, lengths, filter_margin, options or DecodeOptions(),
                                 tokens, sentence_starts)
        return prediction if options is not None else prediction[:2]

    def loss(
        self, local: torch.Tensor, glob: torch.Tensor, lengths: torch.Tensor, gold: torch.Tensor,
        tokens: Optional[torch.Tensor] = None, known: Optional[torch.Tensor] = None,
        incorrect: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """``L_loc + L_glob`` summed over the batch, from the local and global span scores
        ``[B, L, K, C]`` and the ``gold`` rows (and the token vectors, for mean-field). With
        ``known`` (False at the tokens without annotation) a span of unknown tokens only has
        no local target, and ``L_glob``'s gold score is the log-sum over the paths that hold
        the gold spans and any nodes of unknown tokens only (docs/algorithm.md, §5, "Partial
        annotation"). An ``incorrect`` row there (an entity known to be wrong) gives its span
        the local target "any class but its label" and leaves the node out of the training
        graph; elsewhere the annotation already says more. Raises ``ValueError`` for ``local``
        scores that :meth:`nodes` refuses, and for ``glob`` of another shape than ``local``."""
        self._check_span_scores(local, glob)
        B, L, K, C = local.shape
        grid = gold_label_grid(gold, lengths, L, K, C - 1)
        valid = span_mask(lengths, L, K)
        wrong = incorrect_label_grid(incorrect, lengths, grid, C)
        known = partial_annotation(known, lengths, L, gold)
        unknown = None if known is None else unknown_spans(known, K) & valid
        wrong = None if wrong is None or unknown is None else wrong & unknown.unsqueeze(-1)
        ce = nn.functional.cross_entropy(
            wide(local.reshape(-1, C)), grid.reshape(-1), reduction="none"
        ).view(B, L, K)
        weight = torch.where(grid > 0, 1.0, self.null_weight) * valid
        if unknown is not None:
            weight = weight * ~unknown
        if self.focal_gamma > 0:
            # 1 - p = -expm1(-ce), exact near p = 1; the floor keeps the power's gradient finite
            weight = weight * torch.expm1(-ce).neg().clamp_min(1e-12).pow(self.focal_gamma)
        loss_local = (ce * weight).sum()
        if self.boundary_smoothing > 0:
            loss_local = loss_local + self._smoothing_correction(local, lengths, gold)
        if wrong is not None:
            loss_local = loss_local + incorrect_span_loss(local, wrong)
        if self.exact_loss > 0:
            exact = wide(glob)
            gold_exact = (semicrf_gold_score(exact, lengths, gold, None) if known is None
                          else _consistent_log_z(exact, lengths, grid, known, None, wrong))
            loss_local = loss_local + self.exact_loss * (
                semicrf_log_partition(exact, lengths, None) - gold_exact).sum()
        mask, labels = filtered.training_nodes(local.detach(), lengths, grid,
                                               overlapping_only=not self.null_tokens,
                                               margin=self.train_margin, unknown=unknown,
                                               incorrect=wrong)
        scores = wide(glob).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        if self.refiner is not None:
            index = filtered.grid_index(mask)
            refined = self.refine(glob, index, labels.view(-1)[index], tokens)
            refined = refined.to(scores.dtype)
            scores = scores.reshape(-1).index_copy(0, index, refined).view_as(scores)
        if self.null_tokens:
            return loss_local + self._null_tokens_loss(scores, mask, labels, glob, grid, unknown)
        T = None if self.transitions is None else wide(self.transitions)
        log_z = filtered.filtered_log_partition(scores, mask, labels, T)
        if unknown is None:
            gold_score = filtered.path_score(scores, grid > 0, labels, T)
        else:
            gold_score = filtered.consistent_log_score(scores, mask, grid > 0, unknown, labels, T)
        return loss_local + (log_z - gold_score).sum()

    def _null_tokens_loss(
        self, scores: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor,
        glob: torch.Tensor, grid: torch.Tensor, unknown: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """``log Z - gold score`` summed, on the graph of the training nodes with null tokens:
        the gold path is the gold spans plus the nulls of the tokens they leave uncovered. With
        ``unknown`` (the spans of tokens without annotation only) the gold score is the log-sum
        over the sets that hold the gold spans and otherwise only such nodes: the gold spans,
        the nulls of the tokens neither they nor those nodes cover, and the log Z of those
        nodes with their own null tokens."""
        index = filtered.grid_index(mask)
        nodes = filtered.NodeSet(index, labels.view(-1)[index], scores.view(-1)[index],
                                 tuple(mask.shape))
        null = self._null_scores(glob)
        graph = add_null_tokens(nodes, null)
        log_z = filtered.solve_node_set(graph.nodes, None, "log_z").total
        on_gold = (grid.view(-1)[index] > 0)
        gold_nodes = torch.zeros_like(log_z).index_add(
            0, index // (mask.shape[1] * mask.shape[2]), nodes.scores * on_gold
        )
        if unknown is None:
            return (log_z - gold_nodes - null_token_scores(nodes, null, on_gold)).sum()
        free = unknown.view(-1)[index]  # nodes of unknown tokens only: on a path or not
        free_nodes = filtered.NodeSet(index[free], nodes.labels[free], nodes.scores[free],
                                      nodes.shape)
        free_z = filtered.solve_node_set(add_null_tokens(free_nodes, null).nodes, None,
                                         "log_z").total
        rest = null_token_scores(nodes, null, on_gold | free)
        return (log_z - gold_nodes - rest - free_z).sum()

    @staticmethod
    def _null_scores(glob: torch.Tensor) -> torch.Tensor:
        """``[B, L]``: each token's null score, the global head's null output at its width-1
        span (an output the paper's graph leaves unused)."""
        return wide(glob[:, :, 0, 0])

    def _smoothing_correction(
        self, local: torch.Tensor, lengths: torch.Tensor, gold: torch.Tensor
    ) -> torch.Tensor:
        """Soft-target cross-entropy minus the hard one, summed: for a target that moves mass
        ``m`` from label ``a`` to label ``b`` the difference is ``m * (s_a - s_b)`` in the raw
        scores (the log-normaliser cancels), so only the moved entries are read."""
        eps = self.boundary_smoothing
        gold = gold.to(local.device).long().view(-1, 4)
        doc, start, end, label = gold.unbind(-1)
        at_gold = wide(local[doc, start, end - start])  # [G, C]
        rows, share = boundary_neighbors(gold, lengths, self.max_width)
        at_next = wide(local[rows[:, 0], rows[:, 1], rows[:, 2]])  # [N, C]
        to_null = (at_gold.gather(1, label.unsqueeze(1)) - at_gold[:, :1]).sum()
        to_label = share * (at_next[:, 0] - at_next.gather(1, rows[:, 3:]).squeeze(1))
        return eps * (to_null + self.null_weight * to_label.sum())

    def nodes(
        self, local: torch.Tensor, glob: torch.Tensor, lengths: torch.Tensor,
        filter_margin: float = 0.0, tokens: Optional[torch.Tensor] = None,
        sentence_starts: Optional[torch.Tensor] = None,
    ) -> filtered.NodeSet:
        """The inference node set (without the spans that cross a sentence boundary of
        ``sentence_starts``, if given), with each node's global score (refined by the
        mean-field layers, which read ``tokens``, if the head has them). Raises
        ``ValueError`` unless ``local`` and ``glob`` are ``[B, L, K, C]`` with ``C`` the head's
        labels and null."""
        self._check_span_scores(local, None)  # (inference_node_set checks glob against it)
        nodes = filtered.within_sentences(
            filtered.inference_node_set(local, glob, lengths, filter_margin), sentence_starts)
        refined = self.refine(glob, nodes.index, nodes.labels, tokens)
        return nodes if refined is None else nodes._replace(scores=refined)

    def decode(
        self,
        local: torch.Tensor,
        glob: torch.Tensor,
        lengths: torch.Tensor,
        filter_margin: float = 0.0,
        options: DecodeOptions = DecodeOptions(),
        tokens: Optional[torch.Tensor] = None,
        sentence_starts: Optional[torch.Tensor] = None,
    ) -> Prediction:
        """The best path of the filtered graph of ``filter_margin`` and what ``options`` asks
        for besides, from the local and global span scores ``[B, L, K, C]``; no entity
        crosses a sentence boundary of ``sentence_starts`` (as in :meth:`forward`)."""
        # (decode is public: the filter checks the lengths against the scores)
        if torch.is_grad_enabled():  # predictions carry no graph, as the other heads'
            local, glob = local.detach(), glob.detach()
            tokens = None if tokens is None else tokens.detach()
        nodes = self.nodes(local, glob, lengths, filter_margin, tokens, sentence_starts)
        T = self._transitions()
        if self.null_tokens:
            return self._decode_null_tokens(local, glob, nodes, options)
        # float64, as the exact semi-CRF: a scan over a long document (with transitions) or a
        # long cluster sums thousands in log space, where float32 lost marginals' second digit
        wide_nodes = nodes._replace(scores=nodes.scores.double())
        wide_T = None if T is None else T.double()
        best, marginals, log_z = filtered.decode_node_set_log_z(wide_nodes, wide_T,
                                                                check_scores=False)
        # The marginal alone is 1 for a node that overlaps no other: the local probability of
        # its label brings in the filter's own uncertainty.
        p_local = local_label_probability(local, nodes.index, nodes.labels)
        conf = (p_local * marginals.to(p_local.dtype)).clamp(0, 1)
        # the node list is in grid order, so the spans come sorted by (doc, start)
        spans, scores, reports, outside = nodes.spans(best), conf[best], None, None
        if options.constrained():
            found = filtered_constrained(
                nodes, lengths, T, options.constraints, best=best, global_scores=glob.detach()
            )
            spans, reports, node = found.spans, found.reports, found.node
            # a forced span that was no node has no probability under the model (index 0 of
            # the padded list; the filter may have kept no node at all)
            scores = torch.cat([conf.new_zeros((1,)), conf])[node + 1]
            # a path that leaves a node out (dropped for a count, or forbidden), or adds one,
            # is not a path of the filtered graph
            outside = filtered.off_graph(nodes, spans, node)
        path = None
        if options.path and reports is None and bool((marginals >= 1.0).all()):
            # every node on every path: the graph has one path, of probability 1 (most
            # documents of a trained model; no second solve of the graph)
            path = conf.new_ones((local.shape[0],))
        elif options.path:
            path = path_probability(*filtered_path_scores(wide_nodes, best, wide_T, log_z),
                                    reports, outside)
        candidates = (nodes.spans(), conf) if options.candidates else None
        return Prediction(spans, scores, path, candidates, reports)

    def _decode_null_tokens(
        self, local: torch.Tensor, glob: torch.Tensor, nodes: filtered.NodeSet,
        options: DecodeOptions,
    ) -> Prediction:
        """:meth:`decode` on the graph with null tokens (no transitions): the best path over
        the cells' best choices, and each node's marginal as its share of its cell's."""
        if options.constrained():
            raise ValueError("constrained decoding is not available for a filtered head with "
                             "null_tokens = true")
        # in float64, as decode: every covered token's null node makes long clusters
        null = self._null_scores(glob.detach()).double()
        graph = add_null_tokens(nodes._replace(scores=nodes.scores.double()), null)
        # the best path over the cells' best choices (its score: the total), and the cells'
        # marginals over the log-sum scores (with log Z: the total)
        best_path = filtered.solve_node_set(
            graph.nodes._replace(scores=graph.best_scores), None, "viterbi"
        )
        cells = filtered.solve_node_set(graph.nodes, None, "marginals")
        at = graph.node_at
        best = best_path.best[at] & graph.pick[at]
        marginals = (cells.marginals[at] * graph.share[at]).clamp(0, 1)
        p_local = local_label_probability(local, nodes.index, nodes.labels)
        conf = (p_local * marginals.to(p_local.dtype)).clamp(0, 1)
        path = path_probability(best_path.total, cells.total) if options.path else None
        candidates = (nodes.spans(), conf) if options.candidates else None
        return Prediction(nodes.spans(best), conf[best], path, candidates, None)

    def _transitions(self) -> Optional[torch.Tensor]:
        return None if self.transitions is None else wide(self.transitions.detach())

    @torch.no_grad()
    def nbest(
        self,
        X: torch.Tensor,
        lengths: torch.Tensor,
        k: int,
        filter_margin: float = 0.0,
        words: Optional[torch.Tensor] = None,
        sentence_starts: Optional[torch.Tensor] = None,
    ) -> List[List[Segmentation]]:
        """The ``k`` best paths of each document's filtered graph, with their probabilities
        (no entity crossing a sentence boundary of ``sentence_starts``, as in
        :meth:`forward`)."""
        if self.null_tokens:
            raise ValueError("n-best decoding is not available for a filtered head with "
                             "null_tokens = true")
        tokens, local, glob = self._encode(X, lengths, words, predicting=True)
        nodes = self.nodes(local, glob, lengths, filter_margin, tokens, sentence_starts)
        return filtered_nbest(nodes, lengths, self._transitions(), k)

    @torch.no_grad()
    def count_nodes(
        self,
        X: torch.Tensor,
        lengths: torch.Tensor,
        filter_margin: float = 0.0,
        words: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """``LongTensor[B]``: the size of the filtered graph (kept nodes) of each document."""
        local, glob = self.span_scores(X, lengths, words)
        return filtered.inference_node_set(local, glob, lengths, filter_margin).counts()

    def add_labels(self, n: int) -> None:
        """Grow the head by ``n`` entity labels, numbered after the existing ones
        (:mod:`.growth`): the existing labels keep their scores; a new label's weights start at
        zero and its local and global biases at :data:`~.growth.UNTRAINED_BIAS` (the head
        predicts as before), until training meets a gold entity of it: then at the lowest
        bias of the trained labels (:meth:`_wake_labels`)."""
        check_integer("n", n, 1)
        C = self.n_labels + 1
        grow_outputs(self.scorer.output, C, n, blocks=2)  # the local scores, then the global
        grow_transitions(self, C, n)
        for layer in [] if self.refiner is None else self.refiner.layers:
            grow_parameter(layer, "compatibility", list(range(C)), C + n, dims=2)
        self.n_labels += n

    def _wake_labels(self, gold: torch.Tensor) -> None:
        """The untrained labels of the ``gold`` rows start training: their local and global
        biases become the lowest of the trained labels' (:func:`~.growth.wake_outputs`)."""
        output = self.scorer.output
        labels = labels_to_wake(output, gold, self.n_labels)
        self.label_wakes += wake_channels(output, self.n_labels + 1, labels, blocks=2)


class SemiCRFHead(nn.Module):
    """Exact semi-Markov CRF over all segmentations with segments up to ``max_width`` (baseline).

    Entity segments take widths 1..K; null segments have width 1.
    """

    def __init__(
        self,
        input_width: int,
        n_labels: int,
        *,
        max_width: int = 10,
        hidden_width: int = 128,
        span_repr: str = "sum_endpoints_neighbors",
        transitions: bool = True,
        dropout: float = 0.1,
        hidden_depth: int = 1,
        context_depth: int = 0,
        span_norm: bool = False,
        doc_vector: bool = False,
        word_pool: bool = False,
    ) -> None:
        super().__init__()
        _check_head_settings(
            input_width, max_width, hidden_width, dropout, transitions=transitions,
            span_norm=span_norm, doc_vector=doc_vector, word_pool=word_pool,
        )
        # (0 is a head of null segments only, as the linear CRF's O tags)
        check_integer("n_labels", n_labels, 0)
        self.n_labels = n_labels
        # outputs of labels added by add_labels that training has woken so far (an optimizer
        # with state per parameter may start that state afresh when it grows)
        self.label_wakes = 0
        self.max_width = max_width
        C = n_labels + 1
        self.context = TokenContext(input_width, context_depth)
        self.word_pool = WordPool(self.context.output_width, word_pool)
        self.scorer = _SpanScorer(
            self.context.output_width, C, max_width, hidden_width, span_repr, dropout,
            hidden_depth, span_norm, doc_vector,
        )
        self.transitions = nn.Parameter(torch.zeros(C + 1, C + 1)) if transitions else None

    def span_scores(
        self, X: torch.Tensor, lengths: torch.Tensor, words: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """``[B, L, K, C]`` segment scores; impossible segments (past the end, null wider than
        one token) hold NEG."""
        check_batch(X, lengths, self.context.input_width)
        context = self.word_pool(self.context(X, lengths), lengths, words)
        scores = wide(self.scorer(context, lengths))
        B, L, K, C = scores.shape
        keep = span_mask(lengths, L, K).unsqueeze(-1).expand(B, L, K, C).clone()
        keep[:, :, 1:, 0] = False
        return masked_fill_neg(scores, keep)

    def forward(
        self,
        X: torch.Tensor,
        lengths: torch.Tensor,
        gold: Optional[torch.Tensor] = None,
        words: Optional[torch.Tensor] = None,
        options: Optional[DecodeOptions] = None,
        sentence_starts: Optional[torch.Tensor] = None,
        known: Optional[torch.Tensor] = None,
        incorrect: Optional[torch.Tensor] = None,
    ) -> HeadOutput:
        """As :meth:`FilteredSemiCRFHead.forward`, without a filter margin; with ``known``
        the gold score is the log-sum over the segmentations consistent with the annotation
        (:func:`semicrf_consistent_score`), none holding an ``incorrect`` entity."""
        if gold is not None and self.training:
            self._wake_labels(gold)
        scores = self.span_scores(X, lengths, words)
        T = None if self.transitions is None else wide(self.transitions)
        if gold is not None:
            log_z = semicrf_log_partition(scores, lengths, T)
            gold_score = semicrf_consistent_score(scores, lengths, gold, T, known, incorrect)
            return (log_z - gold_score).sum()
        prediction = self.decode(scores.detach(), lengths, options or DecodeOptions(),
                                 sentence_starts)
        return prediction if options is not None else prediction[:2]

    def decode(
        self,
        scores: torch.Tensor,
        lengths: torch.Tensor,
        options: DecodeOptions = DecodeOptions(),
        sentence_starts: Optional[torch.Tensor] = None,
    ) -> Prediction:
        """The best segmentation under the segment ``scores [B, L, K, C]`` and what
        ``options`` asks for besides; no entity crosses a sentence boundary of
        ``sentence_starts`` (as in :meth:`FilteredSemiCRFHead.forward`). Raises ``ValueError``
        unless ``scores`` are ``[B, L, K, C]`` with ``C`` the head's labels and null."""
        check_classes(scores, "scores", "[B, L, K, C]", self.n_labels + 1,
                      f"the head's {self.n_labels} labels and null")
        check_lengths(lengths, tuple(scores.shape[:2]), "the scores")
        check_scores(scores)
        scores = _within_sentences(scores, sentence_starts)
        T = None if self.transitions is None else wide(self.transitions.detach())
        spans, best = semicrf_viterbi(scores, lengths, T, check=False)
        reports = None
        if options.constrained():
            found = semicrf_constrained(scores, lengths, T, options.constraints, (spans, best))
            spans, reports = found.spans, found.reports
        if spans.shape[0] == 0 and not (options.path or options.candidates):
            return Prediction(*_empty_decoded(scores.device), reports=reports)
        # float64: in float32 the scan's running sums over a long document (thousands in log
        # space) lose whole units, and the marginals and the path probability with them
        scores64, T64 = scores.double(), None if T is None else T.double()
        marginals, log_z = semicrf_marginals_and_log_z(scores64, lengths, T64, check=False)
        marginals = marginals.to(scores.dtype)
        doc, start, end, label = spans.unbind(1)
        conf = marginals[doc, start, end - start, label].clamp(0.0, 1.0)
        path = None
        if options.path:  # the returned path's score, summed in float64 too
            score = semicrf_gold_score(scores64, lengths, spans, T64, check_rows=False, check=False)
            path = path_probability(score, log_z, reports)
        candidates = span_candidates(marginals, spans) if options.candidates else None
        return Prediction(spans, conf, path, candidates, reports)

    @torch.no_grad()
    def nbest(
        self, X: torch.Tensor, lengths: torch.Tensor, k: int, words: Optional[torch.Tensor] = None,
        sentence_starts: Optional[torch.Tensor] = None,
    ) -> List[List[Segmentation]]:
        """The ``k`` best segmentations of each document, with their probabilities (no entity
        crossing a sentence boundary of ``sentence_starts``)."""
        T = None if self.transitions is None else wide(self.transitions.detach())
        scores = self.span_scores(X, lengths, words)
        check_scores(scores)
        return semicrf_nbest(_within_sentences(scores, sentence_starts), lengths, T, k)

    def add_labels(self, n: int) -> None:
        """Grow the head by ``n`` entity labels, numbered after the existing ones
        (:mod:`.growth`): the existing labels keep their scores; a new label's weights start at
        zero and its bias at :data:`~.growth.UNTRAINED_BIAS` (the head predicts as before),
        until training meets a gold entity of it: then at the lowest bias of the trained
        labels (:meth:`_wake_labels`)."""
        check_integer("n", n, 1)
        grow_outputs(self.scorer.output, self.n_labels + 1, n)
        grow_transitions(self, self.n_labels + 1, n)
        self.n_labels += n

    def _wake_labels(self, gold: torch.Tensor) -> None:
        """The untrained labels of the ``gold`` rows start training: their biases become the
        lowest of the trained labels' (:func:`~.growth.wake_outputs`)."""
        output = self.scorer.output
        labels = labels_to_wake(output, gold, self.n_labels)
        self.label_wakes += wake_channels(output, self.n_labels + 1, labels)


def semicrf_consistent_score(
    scores: torch.Tensor, lengths: torch.Tensor, gold: torch.Tensor,
    transitions: Optional[torch.Tensor], known: Optional[torch.Tensor],
    incorrect: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``[B]``: the score of the gold segmentation under segment ``scores [B, L, K, C]``;
    with ``known`` (False at the tokens without entity annotation) the log-sum of the scores
    of every segmentation consistent with the annotation (:func:`~.spans.consistent_segments`),
    so that the loss claims nothing about the unknown tokens, and none holding an entity of
    the ``incorrect`` rows (as ``gold``: entities known to be wrong; on known tokens the
    annotation already excludes them)."""
    B, L, K, C = scores.shape
    # (the grid checks the gold rows, which partial_annotation reads, as semicrf_gold_score does)
    grid = (None if known is None and incorrect is None
            else gold_label_grid(gold, lengths, L, K, C - 1))
    wrong = incorrect_label_grid(incorrect, lengths, grid, C) if incorrect is not None else None
    known = partial_annotation(known, lengths, L, gold)
    if known is None:
        return semicrf_gold_score(scores, lengths, gold, transitions)
    return _consistent_log_z(scores, lengths, grid, known, transitions, wrong)


def incorrect_span_loss(local: torch.Tensor, incorrect: torch.Tensor) -> torch.Tensor:
    """The local loss of the spans with labels known to be wrong (``incorrect [B, L, K, C]``,
    :func:`~.spans.incorrect_label_grid`): ``-log`` of the probability of every other class
    (null included) under the local scores ``[B, L, K, C]``, summed: "not these labels" is the
    span's whole target (a partial label)."""
    flagged = incorrect.any(-1)
    log_p = torch.log_softmax(wide(local[flagged]), -1)
    return -log_p.masked_fill(incorrect[flagged], -math.inf).logsumexp(-1).sum()


def _consistent_log_z(
    scores: torch.Tensor, lengths: torch.Tensor, grid: torch.Tensor, known: torch.Tensor,
    transitions: Optional[torch.Tensor], incorrect: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """:func:`semicrf_consistent_score` for a checked ``known`` (:func:`partial_annotation`)
    with unknown tokens, from the gold ``grid`` (:func:`gold_label_grid`) and the
    :func:`incorrect_label_grid` (or None)."""
    allowed = consistent_segments(grid, known, scores.shape[-1], incorrect)
    return semicrf_log_partition(scores.masked_fill(~allowed, -math.inf), lengths, transitions)


def _within_sentences(
    scores: torch.Tensor, sentence_starts: Optional[torch.Tensor]
) -> torch.Tensor:
    """Segment ``scores [B, L, K, C]`` with the segments that cross a sentence boundary of
    ``sentence_starts`` at -inf: in no segmentation with any probability (the search and the
    n-best leave them out). Null segments have width 1 and cross nothing."""
    if sentence_starts is None:
        return scores
    check_sentence_starts(sentence_starts, tuple(scores.shape[:2]))
    crossing = crossing_spans(sentence_starts.to(scores.device), scores.shape[2])
    return scores.masked_fill(crossing.unsqueeze(-1), -math.inf)


class LinearCRFHead(nn.Module):
    """Linear-chain CRF over BIO or BILUO tags, invalid transitions masked (baseline).

    Emissions come from a hidden layer as wide as the span heads', so the three heads have
    comparable capacity on top of the same encoder. Entities may be wider than ``max_width``.
    """

    def __init__(
        self,
        input_width: int,
        n_labels: int,
        *,
        max_width: int = 10,
        hidden_width: int = 128,
        scheme: str = "BIO",
        dropout: float = 0.1,
        context_depth: int = 0,
        word_pool: bool = False,
    ) -> None:
        super().__init__()
        # (max_width as the span heads': it bounds the candidates)
        _check_head_settings(input_width, max_width, hidden_width, dropout,
                             word_pool=word_pool)
        self.n_labels = n_labels
        # outputs of labels added by add_labels that training has woken so far (an optimizer
        # with state per parameter may start that state afresh when it grows)
        self.label_wakes = 0
        self.max_width = max_width
        self.scheme = tag_scheme(n_labels, scheme)
        n_tags = self.scheme.n_tags
        self.context = TokenContext(input_width, context_depth)
        self.word_pool = WordPool(self.context.output_width, word_pool)
        self.emitter = nn.Sequential(
            nn.Dropout(dropout),
            nn.Linear(self.context.output_width, hidden_width),
            nn.GELU(),
            nn.Linear(hidden_width, n_tags),
        )
        self.transitions = nn.Parameter(torch.zeros(n_tags + 1, n_tags + 1))
        self.register_buffer("allowed", self.scheme.allowed.clone(), persistent=False)

    def emissions(
        self, X: torch.Tensor, lengths: torch.Tensor, words: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """``[B, L, n_tags]`` tag scores of every token."""
        check_batch(X, lengths, self.context.input_width)
        return wide(self.emitter(self.word_pool(self.context(X, lengths), lengths, words)))

    def forward(
        self,
        X: torch.Tensor,
        lengths: torch.Tensor,
        gold: Optional[torch.Tensor] = None,
        words: Optional[torch.Tensor] = None,
        options: Optional[DecodeOptions] = None,
        sentence_starts: Optional[torch.Tensor] = None,
        known: Optional[torch.Tensor] = None,
        incorrect: Optional[torch.Tensor] = None,
    ) -> HeadOutput:
        """As :meth:`FilteredSemiCRFHead.forward`, without a filter margin; with ``known``
        the gold score is the log-sum over the tag sequences consistent with the annotation
        (:func:`~.linear_crf.consistent_emissions`). No ``incorrect`` rows: excluding one
        entity's tags together is beyond a scan over single tags (a ``ValueError``)."""
        if incorrect is not None:
            check_rows_type(incorrect, "incorrect span")
        if incorrect is not None and incorrect.numel():
            raise ValueError("the linear CRF head cannot learn from incorrect spans (entities "
                             "known to be wrong): use a span head (FilteredSemiCRF, SemiCRF)")
        if gold is not None and self.training:
            self._wake_labels(gold)
        emissions = self.emissions(X, lengths, words)
        T = wide(self.transitions)
        allowed = self.allowed.to(emissions.device)
        if gold is not None:
            check_rows_type(gold)
            tags = spans_to_tags(gold.to(emissions.device), lengths, X.shape[1], self.scheme)
            log_z = crf_log_partition(emissions, T, lengths, allowed)
            known = partial_annotation(known, lengths, X.shape[1], gold)
            if known is None:
                return (log_z - crf_score(emissions, T, tags, lengths, allowed)).sum()
            consistent = consistent_emissions(emissions, tags, known, gold, self.scheme)
            return (log_z - crf_log_partition(consistent, T, lengths, allowed)).sum()
        prediction = self.decode(emissions.detach(), lengths, options or DecodeOptions(),
                                 sentence_starts)
        return prediction if options is not None else prediction[:2]

    def decode(
        self,
        emissions: torch.Tensor,
        lengths: torch.Tensor,
        options: DecodeOptions = DecodeOptions(),
        sentence_starts: Optional[torch.Tensor] = None,
    ) -> Prediction:
        """The best valid tag sequence under ``emissions [B, L, n_tags]``, as entities, and
        what ``options`` asks for besides; no entity crosses a sentence boundary of
        ``sentence_starts`` (as in :meth:`FilteredSemiCRFHead.forward`). Raises
        ``ValueError`` unless ``emissions`` are ``[B, L, T]`` with ``T`` the head's tags."""
        check_classes(emissions, "emissions", "[B, L, T]", self.scheme.n_tags,
                      f"the head's {self.scheme.n_tags} {self.scheme.scheme} tags")
        check_lengths(lengths, tuple(emissions.shape[:2]), "the emissions")
        check_scores(emissions)
        emissions = sentence_emissions(emissions, sentence_starts, self.scheme)
        T = wide(self.transitions.detach())
        allowed = self.allowed.to(emissions.device)
        tags, best = crf_viterbi(emissions, T, lengths, allowed, check=False)
        reports = None
        if options.constrained():
            found = crf_constrained(emissions, T, lengths, self.scheme, options.constraints,
                                    allowed, (tags, best))
            spans, reports = found.spans, found.reports
        else:
            spans = tags_to_spans(tags, lengths, self.scheme)
        if spans.shape[0] == 0 and not (options.path or options.candidates):
            return Prediction(*_empty_decoded(emissions.device), reports=reports)
        conf = crf_span_marginals(emissions, T, lengths, spans, self.scheme, allowed,
                                  check_rows=False, check=False).clamp(0, 1)
        path = None
        if options.path:  # in float64, as the span marginals: see SemiCRFHead.decode
            em64, T64 = emissions.double(), T.double()
            best = crf_score(em64, T64, tags, lengths, allowed, check=False)
            log_z = crf_log_partition(em64, T64, lengths, allowed, check=False)
            path = path_probability(best, log_z, reports)
        candidates = None
        if options.candidates:
            candidates = crf_candidates(
                emissions, T, lengths, self.scheme, allowed, self.max_width, (spans, conf)
            )
        return Prediction(spans, conf, path, candidates, reports)

    @torch.no_grad()
    def nbest(
        self, X: torch.Tensor, lengths: torch.Tensor, k: int, words: Optional[torch.Tensor] = None,
        sentence_starts: Optional[torch.Tensor] = None,
    ) -> List[List[Segmentation]]:
        """The ``k`` best tag sequences of each document, as entities, with their probabilities
        (no entity crossing a sentence boundary of ``sentence_starts``)."""
        allowed = self.allowed.to(X.device)
        T = wide(self.transitions.detach())
        emissions = self.emissions(X, lengths, words)
        check_scores(emissions)
        emissions = sentence_emissions(emissions, sentence_starts, self.scheme)
        return crf_nbest(emissions, T, lengths, self.scheme, k, allowed)

    def add_labels(self, n: int) -> None:
        """Grow the head by ``n`` entity labels, numbered after the existing ones
        (:mod:`.growth`; their tags come after the existing tags): the existing tags keep
        their scores and transitions; a new tag's weights and transitions start at zero and
        its emission bias at :data:`~.growth.UNTRAINED_BIAS` (the head predicts as before),
        until training meets a gold entity of its label: then at the lowest bias of the
        trained entity tags (:meth:`_wake_labels`)."""
        check_integer("n", n, 1)
        old, scheme = self.scheme.n_tags, tag_scheme(self.n_labels + n, self.scheme.scheme)
        grow_outputs(self.emitter[-1], old, scheme.n_tags - old)
        grow_transitions(self, old, scheme.n_tags - old)
        self.scheme = scheme
        self.allowed = scheme.allowed.to(self.allowed.device)
        self.n_labels += n

    def _wake_labels(self, gold: torch.Tensor) -> None:
        """The untrained labels of the ``gold`` rows start training: the biases of their tags
        become the lowest of the trained entity tags' (:func:`~.growth.wake_outputs`)."""
        output = self.emitter[-1]
        labels = labels_to_wake(output, gold, self.n_labels)
        if labels:
            tags = [t for t, label in enumerate(self.scheme.labels.tolist()) if label in labels]
            self.label_wakes += wake_channels(output, self.scheme.n_tags, tags)


HEADS = {
    "FilteredSemiCRF": FilteredSemiCRFHead,
    "SemiCRF": SemiCRFHead,
    "LinearCRF": LinearCRFHead,
}
"""Head classes by architecture name (``spacy-fsemicrf.<name>.v1`` in a spaCy config)."""
