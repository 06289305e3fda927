"""Candidate spans, gold grids and span featurizers."""
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spacy_fsemicrf.structured import spans as spans_module
from spacy_fsemicrf.structured.linear_crf import crf_span_marginals, tag_scheme
from spacy_fsemicrf.structured.semiring import NEG, logsumexp
from spacy_fsemicrf.structured.spans import (
    SPAN_REPRS,
    SpanFeaturizer,
    check_span_rows,
    document_mean,
    gold_label_grid,
    grid_chunks,
    overlap_mask,
    running_sum,
    same_word_mean,
    span_mask,
    token_coverage,
    window_max,
    window_view,
)


def test_span_mask_counts_the_candidates():
    lengths = torch.tensor([0, 1, 4, 7])
    mask = span_mask(lengths, 7, 3)
    for b, n in enumerate(lengths.tolist()):
        assert mask[b].sum() == sum(min(3, n - i) for i in range(n))
        for i, w in mask[b].nonzero().tolist():
            assert i + w < n


def test_masks_and_gold_grids_take_integer_lengths_only():
    """A length of 4.5 made the spans ending on token 4 candidates, and took a gold span
    there; a list raised an AttributeError."""
    gold = torch.tensor([[0, 4, 4, 1]])
    for call in (lambda x: span_mask(x, 5, 3), lambda x: gold_label_grid(gold, x, 5, 3)):
        with pytest.raises(ValueError, match="^lengths must be an integer tensor, got "
                                             "torch.float32$"):
            call(torch.tensor([4.5]))
        with pytest.raises(TypeError, match="^lengths must be an integer tensor, got list$"):
            call([5])


@pytest.mark.parametrize("lengths, message", [
    ([6, 2], r"^lengths must lie between 0 and the 5 token rows of the grid, got 6$"),
    ([2, -1], r"^lengths must lie between 0 and the 5 token rows of the grid, got -1$"),
    ([[2, 3]], r"^lengths must be \[B\], one per document of the grid \(2\), got \(1, 2\)$"),
])
def test_masks_and_gold_grids_take_lengths_inside_the_grid_only(lengths, message):
    """A length past the grid's L gave the candidates of a document cut at L, a negative one
    an empty document, and lengths of another shape were flattened into documents, all
    without an error (the heads and the filter refuse such lengths)."""
    for call in (lambda x: span_mask(x, 5, 3),
                 lambda x: gold_label_grid(torch.zeros((0, 4), dtype=torch.long), x, 5, 3)):
        with pytest.raises(ValueError, match=message):
            call(torch.tensor(lengths))


def test_gold_label_grid_places_labels_and_rejects_bad_spans():
    lengths = torch.tensor([5, 3])
    gold = torch.tensor([[0, 0, 1, 2], [0, 3, 3, 1], [1, 1, 2, 1]])
    grid = gold_label_grid(gold, lengths, 5, 3)
    assert grid[0, 0, 1] == 2 and grid[0, 3, 0] == 1 and grid[1, 1, 1] == 1
    assert grid.count_nonzero() == 3
    with pytest.raises(ValueError, match="^gold span of width 4 exceeds max_width=3$"):
        gold_label_grid(torch.tensor([[0, 0, 3, 1]]), lengths, 5, 3)
    with pytest.raises(ValueError, match="^gold spans overlap within a document$"):
        gold_label_grid(torch.tensor([[0, 0, 1, 1], [0, 1, 2, 1]]), lengths, 5, 3)
    with pytest.raises(ValueError, match="^gold span outside its document"):
        gold_label_grid(torch.tensor([[1, 2, 3, 1]]), lengths, 5, 3)
    with pytest.raises(ValueError, match="^gold span labels must be entity ids >= 1"):
        gold_label_grid(torch.tensor([[0, 2, 3, 0]]), lengths, 5, 3)
    empty = gold_label_grid(torch.zeros((0, 4), dtype=torch.long), lengths, 5, 3)
    assert empty.count_nonzero() == 0


@pytest.mark.parametrize("rows, lengths, message", [
    ([[0, 3, 2, 1]], [5], "^span outside its document \\(or end < start\\)$"),  # end < start
    # lengths past the grid (a plain function's caller may pass them): the grid ends first
    ([[0, 4, 5, 1]], [7], "^span outside its document"),
])
def test_span_rows_that_do_not_fit_are_refused(rows, lengths, message):
    with pytest.raises(ValueError, match=message):
        check_span_rows(torch.tensor(rows), torch.tensor(lengths), 5, what="span")


def test_span_rows_that_are_not_a_tensor_are_named_as_what_they_are():
    """The type error names the rows as the caller does: the linear CRF's span marginals take
    spans, not gold spans."""
    message = r"^spans must be a tensor of rows \(doc, start, end, label\), \[N, 4\], got list$"
    with pytest.raises(TypeError, match=message):
        check_span_rows([[0, 0, 1, 1]], torch.tensor([5]), 5, what="span")
    ts = tag_scheme(2, "BIO")
    emissions = torch.zeros((1, 5, ts.n_tags))
    T = torch.zeros((ts.n_tags + 1, ts.n_tags + 1))
    with pytest.raises(TypeError, match=message):
        crf_span_marginals(emissions, T, torch.tensor([5]), [[0, 0, 1, 1]], ts)


def test_no_span_rows_in_any_empty_shape_are_no_rows():
    for empty in (torch.zeros((0,), dtype=torch.long), torch.zeros((0, 4), dtype=torch.long)):
        columns = check_span_rows(empty, torch.tensor([3]), 3)
        assert [tuple(c.shape) for c in columns] == [(0,)] * 4


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 9), st.integers(1, 4))
def test_overlap_mask_matches_brute_force(seed, L, K):
    gen = torch.Generator().manual_seed(seed)
    spans = (torch.rand((2, L, K), generator=gen) < 0.1) & span_mask(torch.tensor([L, L]), L, K)
    got = overlap_mask(spans)
    for b in range(2):
        chosen = [(i, i + w) for i, w in spans[b].nonzero().tolist()]
        for i in range(L):
            for w in range(min(K, L - i)):
                want = any(a <= i + w and i <= e for a, e in chosen)
                assert bool(got[b, i, w]) == want


def test_token_coverage_counts_spans_or_sums_their_values():
    doc, start, end = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 2, 1, 2]), torch.tensor([1, 2, 3, 2])
    counts = token_coverage(doc, start, end, 2, 5)
    assert counts.tolist() == [[1, 1, 1, 0, 0], [0, 1, 2, 1, 0]]
    labels = token_coverage(doc[:3], start[:3], end[:3], 2, 5, values=torch.tensor([3, 1, 2]))
    assert labels.tolist() == [[3, 3, 1, 0, 0], [0, 2, 2, 2, 0]]


def test_window_view_reads_ahead_with_zero_padding():
    x = torch.arange(1.0, 6.0).view(1, 5, 1)
    view = window_view(x, 3)
    assert view.shape == (1, 5, 3, 1)
    assert view[0, :, :, 0].tolist() == [[1, 2, 3], [2, 3, 4], [3, 4, 5], [4, 5, 0], [5, 0, 0]]


@pytest.mark.parametrize("doc_vector", [False, True])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("span_repr", SPAN_REPRS)
def test_featurizer_equals_the_explicit_formula(span_repr, norm, doc_vector):
    torch.manual_seed(0)
    D, H, K, L = 5, 4, 3, 6
    feat = SpanFeaturizer(D, H, K, span_repr, norm=norm, doc_vector=doc_vector).double()
    if norm:  # trained values, not the identity the layer starts as
        torch.nn.init.normal_(feat.norm.weight)
        torch.nn.init.normal_(feat.norm.bias)
    x = torch.randn(2, L, D, dtype=torch.float64)
    doc = torch.randn(2, D, dtype=torch.float64) if doc_vector else None
    out = feat(x, doc)
    assert out.shape == (2, L, K, H)
    W, bias = feat.token_proj.weight, feat.token_proj.bias
    for b in range(2):
        for i in range(L):
            for w in range(K):
                j = i + w
                if j >= L:
                    continue
                if span_repr == "endpoints":
                    pre = (W[:H] @ x[b, i] + bias[:H]) + (W[H:] @ x[b, j] + bias[H:])
                elif span_repr.startswith("sum_endpoints"):  # start, end, pooled parts in order
                    proj = x[b, i : j + 1] @ W[2 * H : 3 * H].T + bias[2 * H : 3 * H]
                    start = W[:H] @ x[b, i] + bias[:H]
                    pre = start + (W[H : 2 * H] @ x[b, j] + bias[H : 2 * H]) + proj.sum(0)
                    if span_repr.startswith("sum_endpoints_neighbors"):  # the tokens just outside
                        U = feat.neighbor_proj.weight
                        pre = pre + (U[:H] @ x[b, i - 1] if i > 0 else 0)
                        pre = pre + (U[H:] @ x[b, j + 1] if j + 1 < L else 0)
                    if span_repr.endswith("_max"):  # elementwise max of a fourth projection
                        peak = x[b, i : j + 1] @ W[3 * H :].T + bias[3 * H :]
                        pre = pre + peak.max(0).values
                else:
                    proj = x[b, i : j + 1] @ W.T + bias
                    pre = {"sum": proj.sum(0), "mean": proj.mean(0), "max": proj.max(0).values}[span_repr]
                pre = pre + feat.width_emb[w]
                if doc_vector:  # the same document term on every span of document b
                    pre = pre + feat.doc_proj.weight @ doc[b]
                if norm:  # standardise over the H features, then scale and shift
                    var = pre.var(unbiased=False)
                    pre = (pre - pre.mean()) / torch.sqrt(var + feat.norm.eps)
                    pre = pre * feat.norm.weight + feat.norm.bias
                want = torch.relu(pre)
                assert torch.allclose(out[b, i, w], want, atol=1e-10)
    out.sum().backward()  # in-place ops keep autograd intact
    assert feat.token_proj.weight.grad is not None


@pytest.mark.parametrize("seed", range(5))
def test_window_max_matches_brute_force(seed):
    torch.manual_seed(seed)
    L, K, H = int(torch.randint(1, 7, ())), int(torch.randint(1, 5, ())), 3
    x = torch.randn(2, L, H)
    got = window_max(x, K)
    assert got.shape == (2, L, K, H)
    padded = torch.cat([x, torch.zeros(2, K, H)], dim=1)  # zero past the end, as window_view
    for i in range(L):
        for w in range(K):
            assert torch.equal(got[:, i, w], padded[:, i : i + w + 1].max(1).values)


def test_featurizer_needs_the_document_mean_exactly_when_it_has_doc_vector():
    x = torch.randn(1, 4, 5)
    message = "^doc must be given exactly when the featurizer has doc_vector$"
    with pytest.raises(ValueError, match=message):
        SpanFeaturizer(5, 4, 3, "sum", doc_vector=True)(x)
    with pytest.raises(ValueError, match=message):
        SpanFeaturizer(5, 4, 3, "sum")(x, torch.zeros(1, 5))


@pytest.mark.parametrize("span_repr", SPAN_REPRS)
@pytest.mark.parametrize("shape", [(4, 5), (2, 4, 6), (2, 4, 5, 1)],
                         ids=["one-document", "width", "4-d"])
@pytest.mark.parametrize("call", ["forward", "terms"])
def test_featurizer_takes_batched_vectors_of_its_input_width_only(span_repr, shape, call):
    """Vectors of another width failed in a matrix product ("mat1 and mat2 shapes cannot be
    multiplied"), and one document without its batch axis failed elsewhere in each
    representation ("not enough values to unpack", a size mismatch), or gave the terms of a
    grid of 4 documents of 5 tokens (endpoints, max) without an error."""
    featurizer = SpanFeaturizer(5, 4, 3, span_repr)
    message = (r"^x must be \[B, L, D\] as the featurizer's input_width, \(B, L, 5\), got "
               + re.escape(str(shape)) + "$")
    with pytest.raises(ValueError, match=message):
        getattr(featurizer, call)(torch.randn(shape))


@pytest.mark.parametrize("shape", [(1, 5), (3, 5), (5,), (2, 4)],
                         ids=["one-row", "more-rows", "1-d", "width"])
def test_featurizer_takes_one_document_vector_per_document(shape):
    """A document term of one row was added to every document of the batch without an error;
    the other shapes failed inside PyTorch."""
    featurizer = SpanFeaturizer(5, 4, 3, "sum", doc_vector=True)
    message = (r"^doc must be \[B, D\] as x's documents and the featurizer's input_width, "
               r"\(2, 5\), got " + re.escape(str(shape)) + "$")
    with pytest.raises(ValueError, match=message):
        featurizer(torch.randn(2, 4, 5), torch.randn(shape))


def test_document_mean_leaves_out_padding_and_empty_documents():
    x = torch.arange(12, dtype=torch.float32).view(3, 2, 2)
    got = document_mean(x, torch.tensor([2, 1, 0]))
    assert got.tolist() == [[1.0, 2.0], [4.0, 5.0], [0.0, 0.0]]


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10_000), st.lists(st.integers(0, 9), min_size=1, max_size=4),
       st.integers(1, 4), st.sampled_from([0, -3, 2**40, 2**62, -2**63]),
       st.sampled_from([1, 2**61]), st.integers(0, 1))
def test_same_word_mean_matches_brute_force(seed, lengths, vocab, offset, spacing, pad):
    """Each token gets the mean over the tokens of its own document with its word id (ids may
    be negative, too large for a float64 to tell apart or spread over the whole int64 range,
    as string hashes are, and shared by up to four documents); padding (whatever ids it holds)
    and the other documents change nothing and come out zero. Without padding (``pad`` 0), a
    single document takes a shorter path."""
    gen = torch.Generator().manual_seed(seed)
    B, L = len(lengths), max(lengths + [1]) + pad
    x = torch.randn(B, L, 3, generator=gen, dtype=torch.float64)
    words = torch.randint(0, vocab, (B, L), generator=gen) * spacing + offset
    got = same_word_mean(x, words, torch.tensor(lengths))
    for b, n in enumerate(lengths):
        for i in range(L):
            if i >= n:
                assert (got[b, i] == 0).all()
                continue
            same = [t for t in range(n) if words[b, t] == words[b, i]]
            assert torch.allclose(got[b, i], x[b, same].mean(0))


def test_same_word_mean_keeps_documents_apart_with_ids_of_any_size():
    """Ids at both ends of the int64 range (string hashes read as signed) group by equality
    within each document: a key of (document, id) formed as one integer would overflow."""
    lo, hi = -2**63, 2**63 - 1
    x = torch.arange(12, dtype=torch.float64).view(2, 3, 2)
    words = torch.tensor([[hi, lo, lo], [lo, hi, hi]])
    for lengths in ([3, 3], [3, 2]):
        got = same_word_mean(x, words, torch.tensor(lengths))
        expected = x.clone()
        expected[0, 1:] = x[0, 1:].mean(0)
        if lengths[1] == 3:
            expected[1, 1:] = x[1, 1:].mean(0)
        else:
            expected[1, 2] = 0.0
        assert torch.equal(got, expected)


def test_same_word_mean_of_long_documents_with_few_words():
    """Hundreds of tokens over a handful of words (ids spread over the int64 range) in each of
    several documents, with padding: each token pools exactly its document's tokens of its word,
    however the sort that groups them orders equal keys."""
    gen = torch.Generator().manual_seed(3)
    lengths = [300, 257, 300]
    x = torch.randn(3, 300, 2, generator=gen, dtype=torch.float64)
    vocab = torch.tensor([-2**63, -7, 0, 2**40, 2**63 - 1])
    words = vocab[torch.randint(0, 5, (3, 300), generator=gen)]
    got = same_word_mean(x, words, torch.tensor(lengths))
    expected = torch.zeros_like(x)
    for b, n in enumerate(lengths):
        for word in vocab:
            at = torch.nonzero(words[b, :n] == word).squeeze(1)
            if at.numel():
                expected[b, at] = x[b, at].mean(0)
    assert torch.allclose(got, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("grad", [False, True])
def test_same_word_mean_of_an_empty_batch(grad):
    with torch.set_grad_enabled(grad):
        got = same_word_mean(torch.zeros(0, 3, 2), torch.zeros(0, 3, dtype=torch.long),
                             torch.zeros(0, dtype=torch.long))
    assert got.shape == (0, 3, 2)


def test_same_word_mean_passes_gradient_to_every_mention():
    x = torch.randn(1, 4, 2, requires_grad=True)
    words = torch.tensor([[7, 3, 7, 7]])
    same_word_mean(x, words, torch.tensor([3]))[0, 0].sum().backward()
    # token 0 pools tokens 0 and 2 (token 3 is padding)
    assert x.grad[0, :, 0].tolist() == [0.5, 0.0, 0.5, 0.0]


def test_featurizer_rejects_unknown_repr():
    with pytest.raises(ValueError, match="span_repr"):
        SpanFeaturizer(4, 4, 3, "attention")
    with pytest.raises(ValueError, match="max_width must be >= 1"):
        SpanFeaturizer(4, 4, 0)


def test_featurizer_defaults_and_initial_width_embedding():
    """The documented defaults (a sum over the span, no normalisation, no document vector,
    reading no token outside the span) and width embeddings that start small (std 0.02), so
    that at first a span is scored by its tokens."""
    torch.manual_seed(0)
    feat = SpanFeaturizer(6, 64, 10)
    assert (feat.span_repr, feat.norm, feat.doc_proj, feat.reach) == ("sum", None, None, 0)
    assert 0.015 < float(feat.width_emb.detach().std()) < 0.025


def test_masked_logsumexp_is_neg_with_zero_gradient_when_everything_is_masked():
    x = torch.randn(2, 3, requires_grad=True)
    keep = torch.tensor([[False, False, False], [True, False, True]])
    out = logsumexp(x, 1, keep)
    assert out[0] == NEG
    assert out[1].item() == pytest.approx(torch.logsumexp(x[1, [0, 2]], 0).item())
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and (x.grad[0] == 0).all()
    # without a mask, the log-sum-exp of every entry along the dimension
    y = torch.randn(3, 4, dtype=torch.float64)
    for dim in (0, 1):
        assert torch.allclose(logsumexp(y, dim), torch.logsumexp(y, dim))


def test_span_ends_cached_under_inference_mode_serve_training():
    """The span-end grid is cached by shape; a prediction under inference mode may be the
    first to ask for a shape, and training then indexes with the same cached tensor."""
    from spacy_fsemicrf.structured.spans import span_ends

    shape = (13, 5)  # a shape no other test asks for
    with torch.inference_mode():
        first = span_ends(*shape)
    assert span_ends(*shape) is first and not first.is_inference()
    x = torch.randn(20, requires_grad=True)
    x[span_ends(*shape).clamp_max(19)].sum().backward()  # saves the index for backward
    assert x.grad is not None and float(x.grad.sum()) == 13 * 5


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 9), st.integers(0, 60), st.integers(1, 6), st.integers(1, 80))
def test_grid_chunks_cover_every_position_once_in_order(batch, length, max_width, spans):
    """Every (document, position) once, in row order; a chunk is whole documents or part of
    one (contiguous rows of a [B, L, K] tensor); none smaller than half the asked size unless
    it is the only one, none larger than one and a half times it (plus one document)."""
    chunks = grid_chunks(batch, length, max_width, spans)
    rows = []
    for docs, positions in chunks:
        assert positions == slice(0, length) or docs.stop - docs.start == 1
        rows += [(b, i) for b in range(docs.start, docs.stop)
                 for i in range(positions.start, positions.stop)]
    assert rows == [(b, i) for b in range(batch) for i in range(length)]
    per_chunk = max(1, spans // max_width)
    if length and len(chunks) > 1:
        sizes = [(d.stop - d.start) * (p.stop - p.start) for d, p in chunks]
        unit = max(per_chunk // length, 1) * length if length <= per_chunk else per_chunk
        assert all(2 * n >= unit for n in sizes)
        assert all(2 * n <= 3 * unit for n in sizes)


@pytest.mark.parametrize("span_repr", SPAN_REPRS)
def test_featurizer_gradient_matches_finite_differences(span_repr):
    # the sum terms are built in place in one buffer: autograd must still see every term
    torch.manual_seed(0)
    feat = SpanFeaturizer(3, 2, 3, span_repr, doc_vector=True).double()
    x = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    doc = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    # a fixed positive offset keeps every entry away from the ReLU's kink
    with torch.no_grad():
        feat.width_emb.add_(10.0)
    assert torch.autograd.gradcheck(lambda x, doc: feat(x, doc), (x, doc))


def _every_batch_large(monkeypatch):
    """Thresholds lowered so that small test batches take prediction's large-batch paths (the
    NumPy running sum and the one-pass sums)."""
    for name in ("RUNNING_SUM_MIN_LENGTH", "RUNNING_SUM_MIN_ROW", "ONE_PASS_MIN_ENTRIES"):
        monkeypatch.setattr(spans_module, name, 1)


def _numpy_adds(monkeypatch):
    """A list that grows by one for each ``numpy.add`` the running sum calls."""
    calls = []
    add = spans_module.numpy.add
    monkeypatch.setattr(spans_module.numpy, "add", lambda *a, **k: calls.append(1) or add(*a, **k))
    return calls


@pytest.mark.parametrize("shape", [(3, 7, 5), (1, 40, 2), (4, 1, 3), (2, 0, 3)])
@pytest.mark.parametrize("seed", range(3))
def test_running_sum_is_cumsum_bit_for_bit(monkeypatch, shape, seed):
    # float64 sums of float32 entries from +0, rounded at each position, as PyTorch's kernel;
    # the thresholds are lowered so that these small batches take the NumPy loop
    _every_batch_large(monkeypatch)
    gen = torch.Generator().manual_seed(seed)
    wide = torch.randn(shape[:2] + (2 * shape[2],), generator=gen)
    wide = wide * torch.rand(wide.shape, generator=gen).pow(8) * 1e4  # magnitudes far apart
    x = wide[..., shape[2]:]  # a strided view, as the featurizer passes
    if x.numel():
        x[0, 0, 0] = -0.0  # the kernel's sum starts at +0: -0 comes out +0
        x[-1, :, -1] = 0.0
        x[0, -1, -1] = float("inf")
    with torch.inference_mode():
        got = running_sum(x)
        want = x.cumsum(1)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_running_sum_keeps_the_kernel_under_autograd_and_for_short_documents(monkeypatch):
    x = torch.randn(40, 120, 64, requires_grad=True)
    out = running_sum(x)
    out.sum().backward()
    assert torch.equal(x.grad, torch.arange(120, 0, -1.0).view(1, -1, 1).expand_as(x))
    calls = _numpy_adds(monkeypatch)
    with torch.inference_mode():
        running_sum(torch.randn(40, spans_module.RUNNING_SUM_MIN_LENGTH - 1, 64))
        running_sum(torch.randn(1, 500, spans_module.RUNNING_SUM_MIN_ROW - 1))
    assert calls == []


def test_running_sum_takes_numpy_rows_from_its_thresholds_on(monkeypatch):
    # the bounds themselves take the NumPy loop; float64 keeps the kernel (and its dtype)
    calls = _numpy_adds(monkeypatch)
    length, row = spans_module.RUNNING_SUM_MIN_LENGTH, spans_module.RUNNING_SUM_MIN_ROW
    x = torch.randn(2, length, row // 2)
    with torch.inference_mode():
        assert torch.equal(running_sum(x), x.cumsum(1)) and len(calls) == length
        wide = x.double()
        out = running_sum(wide)
    assert out.dtype == torch.float64 and torch.equal(out, wide.cumsum(1)) and len(calls) == length


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("span_repr", SPAN_REPRS)
def test_featurizer_predicts_what_it_trains_on_bit_for_bit(monkeypatch, span_repr, padded, large):
    # prediction on large tensors (the thresholds lowered to this small batch) builds the sum
    # terms with out= ops and the NumPy running sum, training with ops autograd records: the
    # same float32 representations either way
    if large:
        _every_batch_large(monkeypatch)
    torch.manual_seed(0)
    feat = SpanFeaturizer(6, 5, 4, span_repr, doc_vector=True)
    x = torch.randn(3, 9, 6)
    if padded:
        x[1, 6:] = 0.0
    doc = torch.randn(3, 6)
    trained = feat(x.clone().requires_grad_(), doc)
    with torch.inference_mode():
        predicted = feat(x, doc)
    assert torch.equal(predicted, trained.detach())


@pytest.mark.parametrize("grad", [True, False])
def test_prefix_terms_keep_the_running_sum_precision(grad):
    """Under CUDA autocast the projections come in float16 and their running sum in float32
    (cumsum autocasts to float32): the span terms stay float32, not rounded to float16 at the
    size of the running sum. With autograd (training) and without it on a large batch (the
    one-pass sums of prediction)."""
    gen = torch.Generator().manual_seed(0)
    B, L, H, K = 1, 8192, 128, 4
    terms = [(torch.randn((B, L, H), generator=gen) + 1.0).half() for _ in range(4)]
    proj = (torch.randn((B, L, H), generator=gen) + 1.0).half()
    cumsum = proj.float().cumsum(1)  # as autocast gives it: |cumsum| reaches about L
    with torch.set_grad_enabled(grad):
        ends, starts = spans_module._prefix_terms(cumsum, *terms, K)
        want_ends, want_starts = spans_module._prefix_terms(
            cumsum, *(t.float() for t in terms), K)
    assert ends.dtype == starts.dtype == torch.float32
    assert torch.equal(ends, want_ends) and torch.equal(starts, want_starts)
