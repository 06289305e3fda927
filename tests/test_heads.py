"""The three heads: the shared interface, learning a toy task, and long-document decoding."""
import functools
import inspect
import math
import re

import numpy
import pytest
import torch

from spacy_fsemicrf.structured import heads as heads_module
from spacy_fsemicrf.structured.context import TokenContext, WordPool
from spacy_fsemicrf.structured.confidences import local_label_probability
from spacy_fsemicrf.structured.filtered import (
    filtered_log_partition,
    filtered_marginals,
    inference_node_set,
    inference_nodes,
    path_score,
)
from spacy_fsemicrf.structured.heads import HEADS, FilteredSemiCRFHead, LinearCRFHead, SemiCRFHead
from spacy_fsemicrf.structured.linear_crf import (
    crf_log_partition,
    crf_score,
    crf_span_marginals,
    spans_to_tags,
    tag_scheme,
)
from spacy_fsemicrf.structured.mean_field import MeanFieldRefiner
from spacy_fsemicrf.structured.prediction import DecodeOptions
from spacy_fsemicrf.structured.semiring import NEG
from spacy_fsemicrf.structured.semicrf import (
    semicrf_gold_score,
    semicrf_log_partition,
    semicrf_marginals,
)
from spacy_fsemicrf.structured.spans import SpanFeaturizer, gold_label_grid, span_mask

D, M, K = 8, 3, 4


def toy_batch(seed: int = 0, B: int = 6, L: int = 12):
    """Token vectors that encode the gold labels (one-hot in the first dims, plus noise), so a
    head can fit the task quickly; entity spans of width 1..3."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, L + 1, (B,), generator=gen)
    lengths[0] = L
    X = 0.1 * torch.randn((B, L, D), generator=gen)
    rows = []
    for b in range(B):
        i = 0
        while i < int(lengths[b]):
            w = min(int(torch.randint(0, 3, (1,), generator=gen)), int(lengths[b]) - 1 - i)
            if torch.rand((1,), generator=gen).item() < 0.4:
                label = int(torch.randint(1, M + 1, (1,), generator=gen))
                rows.append((b, i, i + w, label))
                X[b, i, label] += 1.0  # begin marker with the label
                X[b, i : i + w + 1, 0] += 1.0  # inside marker
                X[b, i + w, M + 1] += 1.0  # end marker
            i += w + 1
    return X, lengths, torch.tensor(rows, dtype=torch.long).view(-1, 4)


@pytest.mark.parametrize("context_depth", [0, 1])
@pytest.mark.parametrize("name", sorted(HEADS))
def test_head_learns_the_toy_task_and_decodes_valid_spans(name, context_depth):
    torch.manual_seed(0)
    head = HEADS[name](D, M, max_width=K, hidden_width=32, dropout=0.0, context_depth=context_depth)
    X, lengths, gold = toy_batch()
    opt = torch.optim.Adam(head.parameters(), lr=0.02)
    losses = []
    for _ in range(150):
        opt.zero_grad()
        loss = head(X, lengths, gold)
        assert loss.dim() == 0 and torch.isfinite(loss)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0]
    head.eval()
    with torch.no_grad():
        spans, conf = head(X, lengths)
    assert spans.dtype == torch.long and spans.shape[1] == 4 and conf.shape == (spans.shape[0],)
    assert ((conf >= 0) & (conf <= 1)).all()
    found = {tuple(r) for r in spans.tolist()}
    expected = {tuple(r) for r in gold.tolist()}
    assert len(found & expected) >= 0.9 * len(expected)
    # decoded spans are inside their document and do not overlap
    for b in range(X.shape[0]):
        mine = sorted((s, e) for d, s, e, _ in spans.tolist() if d == b)
        assert all(0 <= s <= e < lengths[b] for s, e in mine)
        assert all(e1 < s2 for (_, e1), (s2, _) in zip(mine, mine[1:]))


@pytest.mark.parametrize("context_depth", [0, 1])
@pytest.mark.parametrize("name", sorted(HEADS))
def test_head_handles_empty_and_single_token_documents(name, context_depth):
    head = HEADS[name](D, M, max_width=K, hidden_width=16, context_depth=context_depth)
    X = torch.randn(3, 5, D)
    lengths = torch.tensor([0, 1, 5])
    gold = torch.tensor([[1, 0, 0, 2]])
    loss = head(X, lengths, gold)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in head.parameters() if p.grad is not None)
    with torch.no_grad():
        spans, conf = head(X, lengths)
    assert not (spans[:, 0] == 0).any()  # nothing in the empty document
    empty_spans, empty_conf = head(torch.zeros(2, 0, D), torch.tensor([0, 0]))
    assert empty_spans.shape == (0, 4) and empty_conf.shape == (0,)
    assert empty_spans.dtype == torch.long and empty_conf.dtype == torch.float32


# span scorer settings whose features read beyond a span: neighbours, the document, its words
SCORER_SETTINGS = [
    ("sum_endpoints", False, False, False),
    ("sum_endpoints", False, True, False),
    ("sum_endpoints_neighbors", False, False, False),
    ("sum_endpoints_neighbors", True, False, False),
    ("sum_endpoints_neighbors", False, True, False),
    ("sum_endpoints_neighbors", False, True, True),
    ("sum_endpoints_neighbors_max", False, False, False),
]


@pytest.mark.parametrize("span_repr,span_norm,doc_vector,word_pool", SCORER_SETTINGS)
def test_filtered_head_predicts_long_documents_in_blocks(
    monkeypatch, span_repr, span_norm, doc_vector, word_pool
):
    """Blocks give the scores of the whole document: with ``doc_vector`` every block still
    reads the mean of all the document's tokens, and with ``word_pool`` every mention pools
    the mentions of its word in the whole document."""
    torch.manual_seed(1)
    head = FilteredSemiCRFHead(
        D, M, max_width=K, hidden_width=16, span_repr=span_repr, span_norm=span_norm,
        doc_vector=doc_vector, word_pool=word_pool,
    ).eval()
    # Make the local classifier call many spans non-null so the graph is not trivial.
    with torch.no_grad():
        head.scorer.output.bias[: M + 1] = torch.tensor([0.0] + [0.3] * M)
    X = torch.randn(2, 300, D)
    lengths = torch.tensor([300, 171])
    words = torch.randint(0, 20, (2, 300))
    with torch.no_grad():
        whole = head(X, lengths, words=words)
        monkeypatch.setattr(heads_module, "PREDICT_BLOCK", 64)
        blocked = head(X, lengths, words=words)
    assert torch.equal(whole[0], blocked[0])
    # float32 prefix sums taken from different origins round differently
    assert torch.allclose(whole[1], blocked[1], atol=1e-4)


@pytest.mark.parametrize("span_repr,span_norm,doc_vector,word_pool", SCORER_SETTINGS)
@pytest.mark.parametrize("name", sorted(set(HEADS) - {"LinearCRF"}))
def test_span_scores_ignore_padding_when_spans_read_their_neighbours(
    name, span_repr, span_norm, doc_vector, word_pool
):
    """A short document's scores do not depend on what pads it in a batch or on the other
    documents: with ``sum_endpoints_neighbors`` its last spans read one token past the end,
    with ``doc_vector`` every span reads the document's mean token vector, and with
    ``word_pool`` each token pools the tokens of its word (the same ids occur in both
    documents and in the padding)."""
    torch.manual_seed(3)
    head = HEADS[name](
        D, M, max_width=K, hidden_width=16, span_repr=span_repr, span_norm=span_norm,
        doc_vector=doc_vector, word_pool=word_pool,
    ).eval()
    alone, batched = _alone_and_batched(head.span_scores)
    valid = span_mask(torch.tensor([9]), 9, K)[0]  # the candidates of the short document
    as_tuple = lambda t: t if isinstance(t, tuple) else (t,)  # noqa: E731
    for got, want in zip(as_tuple(batched), as_tuple(alone)):
        assert torch.allclose(got[1, :9][valid], want[0][valid], atol=1e-5)


def _alone_and_batched(fn):
    """``fn(X, lengths, words)`` on a 9-token document alone and batched with a 15-token one
    (random vectors; word ids 0-3, so both documents and the padding share ids)."""
    X = torch.randn(2, 15, D)
    lengths = torch.tensor([15, 9])
    words = torch.randint(0, 4, (2, 15))
    with torch.no_grad():
        return fn(X[1:, :9], lengths[1:], words[1:, :9]), fn(X, lengths, words)


def test_filtered_node_marginals_are_probabilities_of_kept_spans():
    torch.manual_seed(2)
    head = FilteredSemiCRFHead(D, M, max_width=K, hidden_width=16, transitions=True).eval()
    with torch.no_grad():
        head.scorer.output.bias[: M + 1] = torch.tensor([0.0] + [0.5] * M)
        head.transitions.normal_()
        spans, conf = head(torch.randn(2, 20, D), torch.tensor([20, 9]))
    assert spans.shape[0] > 0
    assert ((conf > 0) & (conf <= 1)).all()
    assert head.count_nodes(torch.randn(2, 20, D), torch.tensor([20, 9])).shape == (2,)


def token_scores(head, X, lengths, words=None):
    """The first scores a head computes per position: span scores starting there (the local
    ones for the filtered head), or tag scores for the linear CRF."""
    if isinstance(head, LinearCRFHead):
        return head.emissions(X, lengths, words)
    scores = head.span_scores(X, lengths, words)
    return scores[0] if isinstance(scores, tuple) else scores


@pytest.mark.parametrize("name", sorted(HEADS))
def test_word_pool_needs_word_ids_and_lets_mentions_share_evidence(name):
    """Without ``words`` a ``word_pool`` head fails clearly; with them, changing one mention's
    vector changes the scores on another mention of the same word, and not those on a mention
    of another word beyond the span features' reach."""
    torch.manual_seed(4)
    head = HEADS[name](D, M, max_width=2, hidden_width=16, word_pool=True).eval()
    X = torch.randn(1, 12, D)
    lengths = torch.tensor([12])
    with pytest.raises(ValueError, match=r"^A head with word_pool needs the word ids of the "
                                         r"tokens \(words=\.\.\.\)$"):
        token_scores(head, X, lengths)
    words = torch.tensor([[5, 1, 2, 3, 4, 6, 7, 8, 9, 10, 5, 11]])
    changed = X.clone()
    changed[0, 0] += 1.0
    with torch.no_grad():
        before = token_scores(head, X, lengths, words)
        after = token_scores(head, changed, lengths, words)
    assert not torch.allclose(before[0, 10], after[0, 10])  # the other "5"
    # a lone word far from token 0 (sums are differences of prefix sums: rounding differs)
    assert torch.allclose(before[0, 6], after[0, 6], atol=1e-5)


@pytest.mark.parametrize("word_pool", [False, True])
@pytest.mark.parametrize("name", sorted(HEADS))
def test_loss_gradient_is_the_same_on_every_run_with_two_threads(name, word_pool):
    """Same seed, same model: the loss gradient of every head is bitwise repeatable on CPU
    with two threads. Float gradients accumulated by advanced indexing (``index_put_`` with
    ``accumulate``) add with parallel atomics in no fixed order; a long document whose
    300 word ids repeat made the word_pool gradient differ on nearly every run when
    ``same_word_mean`` gathered its group means that way."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        gen = torch.Generator().manual_seed(0)
        L, width = 3000, 32
        X = torch.randn((1, L, width), generator=gen)
        lengths = torch.tensor([L])
        words = torch.randint(0, 300, (1, L), generator=gen)
        gold = torch.tensor([[0, i, i + i % 3, 1 + i % M] for i in range(0, L - 3, 7)])
        torch.manual_seed(1)
        head = HEADS[name](width, M, max_width=K, hidden_width=16, word_pool=word_pool)

        def gradients():
            torch.manual_seed(2)  # the same dropout masks every run
            head.zero_grad()
            x = X.clone().requires_grad_()
            head(x, lengths, gold=gold, words=words if word_pool else None).backward()
            return [x.grad] + [p.grad for p in head.parameters() if p.grad is not None]

        first = gradients()
        for _ in range(3):
            assert all(torch.equal(a, b) for a, b in zip(first, gradients()))
    finally:
        torch.set_num_threads(threads)


def test_linear_crf_word_pool_reads_each_document_alone():
    """The CRF's emissions with ``word_pool`` do not depend on the padding or on the other
    documents of the batch, although the same word ids occur in both."""
    torch.manual_seed(5)
    head = LinearCRFHead(D, M, hidden_width=16, word_pool=True).eval()
    alone, batched = _alone_and_batched(head.emissions)
    assert torch.allclose(batched[1, :9], alone[0], atol=1e-5)


def test_context_reads_each_document_alone():
    """A document's BiLSTM states do not depend on the padding or the other documents of its
    batch, and depth 0 is the identity, with no parameters."""
    torch.manual_seed(3)
    context = TokenContext(D, depth=2).eval()
    X = torch.randn(3, 9, D)
    lengths = torch.tensor([5, 9, 0])
    with torch.no_grad():
        batch = context(X, lengths)
        alone = context(X[:1, :5], lengths[:1])
        X[0, 5:] = 100.0  # padding of document 0
        repadded = context(X, lengths)
    assert batch.shape == (3, 9, context.output_width)
    assert torch.allclose(batch[0, :5], alone[0], atol=1e-6)
    assert torch.equal(batch[0], repadded[0])
    assert (batch[0, 5:] == 0).all()
    # the backward direction of a document starts at its own last token
    assert not torch.allclose(batch[0, 4], context(X[:1], torch.tensor([9]))[0, 4])
    identity = TokenContext(D, depth=0)
    assert identity(X, lengths) is X and not list(identity.parameters())
    with pytest.raises(ValueError, match="context_depth"):
        TokenContext(D, depth=-1)


def test_context_of_an_empty_document_is_zeros_with_a_gradient_to_no_token():
    """Packing gives an empty document one padding step, whose BiLSTM output came out where
    every position past a document's length is documented as zeros."""
    torch.manual_seed(3)
    context = TokenContext(D, depth=1)
    X = torch.randn(2, 4, D, requires_grad=True)
    out = context(X, torch.tensor([0, 3]))
    assert (out[0] == 0).all() and (out[1, 3:] == 0).all()
    out.sum().backward()
    assert (X.grad[0] == 0).all()


def test_word_pool_adds_the_projected_mean_of_each_words_mentions():
    torch.manual_seed(0)
    pool = WordPool(4, enabled=True)
    X = torch.randn(2, 5, 4)
    X[1, 3:] = 0.0  # padding
    words = torch.tensor([[7, 3, 7, 7, 1], [3, 3, 2, 9, 9]])
    lengths = torch.tensor([5, 3])
    got = pool(X, lengths, words)
    P = pool.proj.weight
    for b in range(2):
        n = int(lengths[b])
        for i in range(n):
            same = [j for j in range(n) if words[b, j] == words[b, i]]
            want = X[b, i] + P @ X[b, same].mean(0)
            assert torch.allclose(got[b, i], want, atol=1e-6)
    assert (got[1, 3:] == 0).all()


@pytest.mark.parametrize("words, error, shown", [
    (torch.zeros((2, 4), dtype=torch.long), ValueError, r"got \(2, 4\) torch.int64$"),
    (torch.zeros((2, 6), dtype=torch.long), ValueError, r"got \(2, 6\) torch.int64$"),
    (torch.tensor([[1.2, 1.7, 3.0, 1.2, 0.0]] * 2), ValueError, r"got \(2, 5\) torch.float32$"),
    ([[7, 3, 7, 7, 1], [3, 3, 2, 9, 9]], TypeError, "got list$"),
])
def test_word_ids_that_are_not_one_integer_per_token_row_are_a_clear_error(words, error, shown):
    """Word ids of another shape pooled each token with the ids of other rows (the flat
    positions of a [2, 5] batch read into a [2, 4] array), float ids were truncated (1.2 and
    1.7 were one word) and a list raised an AttributeError."""
    pool = WordPool(4, enabled=True)
    X, lengths = torch.randn(2, 5, 4), torch.tensor([5, 3])
    with pytest.raises(error, match=r"^words must be an integer tensor \[B, L\]"):
        pool(X, lengths, words)
    with pytest.raises(error, match=shown):
        pool(X, lengths, words)


def test_context_widths_layers_and_edge_lengths():
    """D // 2 units per direction (at least one), one LSTM layer per unit of depth, the identity
    by default; an empty batch, a one-token document and a batch shorter than its padding keep
    their shapes and each document's own states."""
    assert TokenContext(D)(torch.ones(1, 2, D), torch.tensor([2])).shape == (1, 2, D)
    assert not list(TokenContext(D).parameters())
    assert [TokenContext(w, depth=1).output_width for w in (8, 7, 1)] == [8, 6, 2]
    # weights and biases, both directions, per layer
    assert len(list(TokenContext(D, depth=3).parameters())) == 3 * 2 * 4
    torch.manual_seed(4)
    context = TokenContext(D, depth=1).eval()
    with torch.no_grad():
        assert context(torch.randn(2, 0, D), torch.tensor([0, 0])).shape == (2, 0, D)
        X = torch.randn(2, 9, D)
        lengths = torch.tensor([1, 4])  # both shorter than the 9 positions
        batch = context(X, lengths)
        assert batch.shape == (2, 9, D)
        assert torch.allclose(batch[0, :1], context(X[:1, :1], lengths[:1])[0], atol=1e-6)
        assert torch.allclose(batch[1, :4], context(X[1:, :4], lengths[1:])[0], atol=1e-6)
        assert (batch[:, 4:] == 0).all() and (batch[0, 1:] == 0).all()


def test_filtered_head_validates_its_arguments():
    with pytest.raises(ValueError, match="null_weight"):
        FilteredSemiCRFHead(D, M, null_weight=0.0)
    with pytest.raises(ValueError, match="hidden_depth"):
        FilteredSemiCRFHead(D, M, hidden_depth=0)
    with pytest.raises(ValueError, match="null_weight"):
        FilteredSemiCRFHead(D, M, null_weight=1.5)
    FilteredSemiCRFHead(D, M, null_weight=1.0)  # the paper's unweighted loss is allowed
    with pytest.raises(ValueError, match="^a filtered head needs at least one entity label"):
        FilteredSemiCRFHead(D, 0)
    head = FilteredSemiCRFHead(D, M, max_width=2)
    with pytest.raises(ValueError, match="max_width"):
        head(torch.randn(1, 5, D), torch.tensor([5]), torch.tensor([[0, 0, 3, 1]]))


def test_filtered_head_settings_reach_its_layers():
    """The documented defaults, and each setting where it acts: the span scorer's width,
    normalisation and document vector, the BiLSTM context, the transitions, the label count."""
    head = FilteredSemiCRFHead(D, M)
    assert (head.max_width, head.n_labels, head.transitions) == (10, M, None)
    featurizer = head.scorer.featurizer
    assert head.scorer.output.in_features == 128 and featurizer.width_emb.shape == (10, 128)
    assert featurizer.norm is None and featurizer.doc_proj is None and head.context.lstm is None
    assert head.scorer.output.out_features == 2 * (M + 1)
    other = FilteredSemiCRFHead(D, M, span_norm=True, doc_vector=True, context_depth=1,
                                transitions=True)
    featurizer = other.scorer.featurizer
    assert featurizer.norm is not None and featurizer.doc_proj is not None
    assert other.context.lstm is not None and other.transitions.shape == (M + 2, M + 2)


def test_semicrf_head_settings_reach_its_layers():
    """The documented defaults, and each setting where it acts."""
    head = SemiCRFHead(D, M)
    assert (head.max_width, head.n_labels) == (10, M) and head.transitions.shape == (M + 2, M + 2)
    featurizer = head.scorer.featurizer
    assert head.scorer.output.in_features == 128 and featurizer.width_emb.shape == (10, 128)
    assert featurizer.span_repr == "sum_endpoints_neighbors" and head.scorer.output.out_features == M + 1
    assert featurizer.norm is None and featurizer.doc_proj is None
    assert head.context.lstm is None and head.word_pool.proj is None
    other = SemiCRFHead(D, M, max_width=3, hidden_width=6, span_repr="sum", transitions=False,
                        span_norm=True, doc_vector=True, context_depth=1, word_pool=True)
    featurizer = other.scorer.featurizer
    assert other.max_width == 3 and featurizer.width_emb.shape == (3, 6) and featurizer.span_repr == "sum"
    assert other.transitions is None and featurizer.norm is not None and featurizer.doc_proj is not None
    assert other.context.lstm is not None and other.word_pool.proj is not None


def test_linear_crf_head_settings_reach_its_layers():
    head = LinearCRFHead(D, M)
    assert (head.max_width, head.n_labels, head.scheme.scheme) == (10, M, "BIO")
    n_tags = 2 * M + 1
    assert head.transitions.shape == (n_tags + 1, n_tags + 1)
    assert head.emitter[1].out_features == 128 and head.emitter[-1].out_features == n_tags
    assert head.context.lstm is None and head.word_pool.proj is None
    # the allowed transitions follow from the scheme: not saved with the weights
    assert "allowed" not in head.state_dict() and torch.equal(head.allowed, head.scheme.allowed)
    other = LinearCRFHead(D, M, max_width=3, hidden_width=6, scheme="BILUO", context_depth=1,
                          word_pool=True)
    assert other.max_width == 3 and other.scheme.scheme == "BILUO" and other.emitter[1].out_features == 6
    assert other.transitions.shape == (4 * M + 2, 4 * M + 2)
    assert other.context.lstm is not None and other.word_pool.proj is not None


def test_linear_crf_emissions_are_a_gelu_layer_with_dropout_while_training():
    torch.manual_seed(0)
    head = LinearCRFHead(D, M, hidden_width=16, dropout=0.5).eval()
    X, lengths = torch.randn(2, 5, D), torch.tensor([5, 3])
    hidden, out = head.emitter[1], head.emitter[3]
    want = out(torch.nn.functional.gelu(hidden(X)))
    assert torch.allclose(head.emissions(X, lengths), want, atol=1e-6)
    head.train()
    assert not torch.equal(head.emissions(X, lengths), head.emissions(X, lengths))


@pytest.mark.parametrize("head_class", [FilteredSemiCRFHead, SemiCRFHead])
def test_span_scorer_drops_token_vectors_only_while_training(head_class):
    torch.manual_seed(0)
    head = head_class(D, M, max_width=K, hidden_width=16, dropout=0.5)
    X, lengths = torch.randn(2, 5, D), torch.tensor([5, 3])
    head.train()
    assert not torch.equal(token_scores(head, X, lengths), token_scores(head, X, lengths))
    head.eval()
    assert torch.equal(token_scores(head, X, lengths), token_scores(head, X, lengths))


def test_semicrf_span_scores_hold_neg_exactly_where_no_segment_can_be():
    # past a document's end, and null segments wider than one token
    torch.manual_seed(0)
    head = SemiCRFHead(D, M, max_width=K).eval()
    X, lengths = torch.randn(2, 6, D), torch.tensor([6, 4])
    with torch.no_grad():
        scores = head.span_scores(X, lengths)
    possible = span_mask(lengths, 6, K).unsqueeze(-1).repeat(1, 1, 1, M + 1)
    possible[:, :, 1:, 0] = False
    assert (scores[~possible] == NEG).all() and (scores[possible] > NEG / 2).all()


@pytest.mark.parametrize("name", ["FilteredSemiCRF", "SemiCRF"])
def test_deeper_span_scorer_trains_every_layer(name):
    torch.manual_seed(0)
    head = HEADS[name](D, M, max_width=3, hidden_depth=3)
    assert len(head.scorer.hidden) == 2
    loss = head(torch.randn(2, 7, D), torch.tensor([7, 5]), torch.tensor([[0, 1, 2, 1], [1, 0, 0, 2]]))
    loss.backward()
    assert all(layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0
               for layer in head.scorer.hidden)


def run_python_printing_ok(code: str) -> None:
    """Run ``code`` in a fresh interpreter, which must print ``ok`` and nothing else."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_the_structured_layer_works_without_spacy():
    """The structured layer is plain PyTorch: it imports and runs with spaCy and Thinc hidden."""
    code = (
        "import sys\n"
        "sys.modules['spacy'] = None\n"
        "sys.modules['thinc'] = None\n"
        "import torch\n"
        "from spacy_fsemicrf.structured import FilteredSemiCRFHead\n"
        "head = FilteredSemiCRFHead(8, 3, max_width=4, hidden_width=16)\n"
        "X, lengths = torch.randn(2, 6, 8), torch.tensor([6, 3])\n"
        "head(X, lengths, torch.tensor([[0, 1, 2, 1]])).backward()\n"
        "spans, conf = head.eval()(X, lengths)\n"
        "assert 'spacy_fsemicrf.component' not in sys.modules\n"
        "print('ok')\n"
    )
    run_python_printing_ok(code)


def test_the_structured_layer_does_not_import_spacy():
    """With spaCy installed, importing the structured layer (and the package's public names
    of it) still loads neither spaCy nor Thinc; the package's spaCy names load on first use."""
    code = (
        "import sys\n"
        "import spacy_fsemicrf.structured\n"
        "from spacy_fsemicrf.structured import semicrf, linear_crf, filtered, constraints\n"
        "assert 'spacy' not in sys.modules and 'thinc' not in sys.modules, 'imported spaCy'\n"
        "import spacy_fsemicrf\n"
        "assert 'spacy' not in sys.modules\n"
        "from spacy_fsemicrf import DEFAULT_MODELS, FSemiCRFEntityRecognizer\n"
        "assert 'spacy' in sys.modules and 'spacy_fsemicrf.component' in sys.modules\n"
        "assert spacy_fsemicrf.make_fsemicrf_ner.__module__ == 'spacy_fsemicrf.component'\n"
        "try:\n"
        "    spacy_fsemicrf.no_such_name\n"
        "except AttributeError:\n"
        "    print('ok')\n"
    )
    run_python_printing_ok(code)


def test_making_the_component_remembers_the_msgpack_lookups():
    """The processes ``nlp.pipe(n_process=N)`` forks inherit srsly's remembered lookups, because
    any process with the component has made it; a process without it (spaCy imports the
    package through its entry points for any pipeline) keeps srsly as it is."""
    code = (
        "from srsly.msgpack import msgpack_encoders\n"
        "assert not getattr(msgpack_encoders.get_all, 'remembers', False)\n"
        "import spacy\n"
        "import spacy_fsemicrf.component\n"
        "nlp = spacy.blank('en')\n"
        "nlp.add_pipe('ner')\n"
        "assert not getattr(msgpack_encoders.get_all, 'remembers', False)\n"
        "nlp.add_pipe('fsemicrf_ner')  # found through the entry point\n"
        "assert msgpack_encoders.get_all.remembers and not msgpack_encoders.entry_points\n"
        "print('ok')\n"
    )
    run_python_printing_ok(code)


@pytest.mark.parametrize("seed", range(4))
def test_boundary_smoothing_is_the_soft_target_cross_entropy(seed):
    """The smoothed local loss equals the cross-entropy against explicit soft targets: each gold
    span keeps 1 - eps of its label (eps to null), and the candidates at boundary distance
    exactly 1 from it (one end moved by one token) share eps of that label. The widest gold
    spans are as wide as max_width: their neighbours one token wider are no candidates."""
    eps, beta, K = 0.3, 0.75, 3
    torch.manual_seed(seed)
    plain = FilteredSemiCRFHead(D, M, max_width=K, hidden_width=16, null_weight=beta).eval()
    smooth = FilteredSemiCRFHead(
        D, M, max_width=K, hidden_width=16, null_weight=beta, boundary_smoothing=eps
    ).eval()
    smooth.load_state_dict(plain.state_dict())
    X, lengths, gold = toy_batch(seed, B=4, L=9)
    with torch.no_grad():
        difference = smooth(X, lengths, gold) - plain(X, lengths, gold)
        local, _ = plain.span_scores(X, lengths)
    logp = local.double().log_softmax(-1)
    B, L, _, C = local.shape
    golds = {(b, i, j): lab for b, i, j, lab in gold.tolist()}
    want = 0.0
    for b in range(B):
        n = int(lengths[b])
        spans = [(i, j) for i in range(n) for j in range(i, min(i + K, n))]
        for i, j in spans:
            hard = torch.zeros(C, dtype=torch.float64)
            hard[golds.get((b, i, j), 0)] = 1.0
            soft = hard.clone()
            if (b, i, j) in golds:
                soft[golds[(b, i, j)]] -= eps
                soft[0] += eps
            for (gb, gi, gj), lab in golds.items():
                near = [(a, c) for a, c in spans if abs(a - gi) + abs(c - gj) == 1]
                if gb == b and (i, j) in near:
                    soft[lab] += eps / len(near)
                    soft[0] -= eps / len(near)
            weight = 1.0 if (b, i, j) in golds else beta
            want += weight * float(-(soft - hard) @ logp[b, i, j - i])
    assert torch.allclose(difference.double(), torch.tensor(want, dtype=torch.float64), atol=1e-4)


def test_boundary_smoothing_must_leave_the_gold_span_some_mass():
    with pytest.raises(ValueError, match="boundary_smoothing"):
        FilteredSemiCRFHead(D, M, boundary_smoothing=1.0)


@pytest.mark.parametrize("null_tokens", [False, True])
def test_exact_loss_adds_the_semicrf_loss_of_the_global_scores(null_tokens):
    """With exact_loss = w the filtered head's loss is its own plus w times log Z minus the gold
    segmentation's score, both by enumerating every segmentation of the global scores."""
    import math

    from .bruteforce import segmentation_score, semicrf_enumerate

    torch.manual_seed(0)
    X = torch.randn((2, 6, 5))
    lengths = torch.tensor([6, 4])
    gold = torch.tensor([[0, 1, 2, 1], [0, 4, 4, 2], [1, 0, 0, 1]])
    plain = FilteredSemiCRFHead(5, 2, max_width=3, hidden_width=8, dropout=0.0,
                                null_tokens=null_tokens).eval()
    weighted = FilteredSemiCRFHead(5, 2, max_width=3, hidden_width=8, dropout=0.0,
                                   null_tokens=null_tokens, exact_loss=0.5).eval()
    weighted.load_state_dict(plain.state_dict())
    _, glob = plain.span_scores(X, lengths)
    want = 0.0
    for b in range(2):
        n = int(lengths[b])
        scores = glob[b].double().tolist()
        entities = {(s, e): c for d, s, e, c in gold.tolist() if d == b}
        segments, t = [], 0
        while t < n:  # the gold segmentation: its entities and one-token nulls between them
            end = next((e for (s, e) in entities if s == t), None)
            segments.append((t, end, entities[(t, end)]) if end is not None else (t, t, 0))
            t = (end if end is not None else t) + 1
        want += semicrf_enumerate(scores, n).log_z - segmentation_score(scores, segments)
    got = float((weighted(X, lengths, gold) - plain(X, lengths, gold)).detach())
    assert math.isclose(got, 0.5 * want, rel_tol=1e-4, abs_tol=1e-4)
    with pytest.raises(ValueError, match="exact_loss"):
        FilteredSemiCRFHead(5, 2, exact_loss=-1.0)


@pytest.mark.parametrize("gamma", [2.0, 0.5])
def test_focal_gamma_weighs_each_local_term_by_one_minus_its_gold_probability(gamma):
    """With focal_gamma = g the loss changes by the sum over candidate spans of
    weight * ((1 - p)^g - 1) * (-log p), p the local probability of the span's gold label,
    weight 1 for gold spans and null_weight for the others; the global loss is unchanged."""
    torch.manual_seed(1)
    X = torch.randn((2, 6, 5))
    lengths = torch.tensor([6, 4])
    gold = torch.tensor([[0, 1, 2, 1], [0, 4, 4, 2], [1, 0, 0, 1]])
    plain = FilteredSemiCRFHead(5, 2, max_width=3, hidden_width=8, dropout=0.0,
                                null_weight=0.6).eval()
    focal = FilteredSemiCRFHead(5, 2, max_width=3, hidden_width=8, dropout=0.0,
                                null_weight=0.6, focal_gamma=gamma).eval()
    focal.load_state_dict(plain.state_dict())
    local, _ = plain.span_scores(X, lengths)
    logp = local.detach().double().log_softmax(-1)
    golds = {(d, s, e): c for d, s, e, c in gold.tolist()}
    want = 0.0
    for b in range(2):
        for i in range(int(lengths[b])):
            for j in range(i, min(i + 3, int(lengths[b]))):
                label = golds.get((b, i, j), 0)
                lp = float(logp[b, i, j - i, label])
                weight = 1.0 if label else 0.6
                want += weight * ((1 - math.exp(lp)) ** gamma - 1) * -lp
    got = float((focal(X, lengths, gold) - plain(X, lengths, gold)).detach())
    assert math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-4)
    loss = focal(X, lengths, gold)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in focal.parameters() if p.grad is not None)
    with pytest.raises(ValueError, match="focal_gamma"):
        FilteredSemiCRFHead(5, 2, focal_gamma=-1.0)


@pytest.mark.parametrize("name", sorted(HEADS))
def test_a_prediction_holds_only_what_its_options_ask_for(name):
    torch.manual_seed(0)
    head = HEADS[name](D, M, max_width=K, hidden_width=16).eval()
    X, lengths, _ = toy_batch(seed=2, B=3, L=8)
    with torch.no_grad():
        bare = head(X, lengths, options=DecodeOptions())
        path = head(X, lengths, options=DecodeOptions(path=True))
        candidates = head(X, lengths, options=DecodeOptions(candidates=True))
    assert (bare.path, bare.candidates, bare.reports) == (None, None, None)
    assert path.path.shape == (3,) and (path.candidates, path.reports) == (None, None)
    assert candidates.candidates is not None and (candidates.path, candidates.reports) == (None, None)


@pytest.mark.parametrize("options", [None, "candidates"])
@pytest.mark.parametrize("name", sorted(HEADS))
def test_inference_mode_predicts_as_no_grad_and_training_goes_on_after_it(name, options):
    """Pipelines predict under torch.inference_mode: the same entities, confidences, path
    probabilities and candidates as under no_grad, and a later training step on a batch of
    the same shape (whose cached grids prediction made) still has gradients."""
    torch.manual_seed(1)
    # a shape of its own, so that inference mode is the first to fill the shape's caches
    X, lengths, gold = toy_batch(seed=3, B=5, L=17)
    head = HEADS[name](D, M, max_width=K + 1, hidden_width=16, dropout=0.0)
    head.eval()
    opts = DecodeOptions(path=True, candidates=options is not None)
    with torch.inference_mode():
        fast = head(X, lengths, options=opts)
    with torch.no_grad():
        slow = head(X, lengths, options=opts)
    assert torch.equal(fast.spans, slow.spans) and torch.equal(fast.scores, slow.scores)
    assert torch.equal(fast.path, slow.path)
    if options is not None:
        assert all(torch.equal(a, b) for a, b in zip(fast.candidates, slow.candidates))
    head.train()
    loss = head(X, lengths, gold)
    loss.backward()
    grads = [p.grad for p in head.parameters() if p.requires_grad]
    assert any(g is not None and bool(g.abs().sum() > 0) for g in grads)


def test_filtered_head_filters_at_margin_zero_unless_told():
    """Without ``filter_margin`` a filtered head keeps the spans whose local argmax is not
    null, in ``nodes`` and in ``forward`` alike; a margin keeps more (checked to matter here)."""
    from spacy_fsemicrf.structured.filtered import inference_node_set

    torch.manual_seed(3)
    head = FilteredSemiCRFHead(D, M, max_width=K, hidden_width=16, transitions=True).eval()
    X, lengths = torch.randn(2, 12, D), torch.tensor([12, 7])
    with torch.no_grad():
        head.transitions.normal_()
        local, glob = head.span_scores(X, lengths)
        nodes = head.nodes(local, glob, lengths)
        at_zero = inference_node_set(local, glob, lengths, 0.0)
        assert torch.equal(nodes.index, at_zero.index)
        assert torch.equal(nodes.labels, at_zero.labels)
        assert len(inference_node_set(local, glob, lengths, 1.0).index) > len(at_zero.index)
        default, zero, wide = (head(X, lengths, **kw) for kw in
                               ({}, {"filter_margin": 0.0}, {"filter_margin": 1.0}))
    assert torch.equal(default[0], zero[0]) and torch.equal(default[1], zero[1])
    assert not torch.equal(default[0], wide[0])


@pytest.mark.parametrize("name", ["FilteredSemiCRF", "SemiCRF", "LinearCRF"])
@pytest.mark.parametrize("gold, message", [
    ([[0, 0, 1, 1], [0, 1, 2, 2]], "^gold spans overlap within a document$"),
    ([[1, 3, 4, 1]], "^gold span outside its document"),  # document 1 has 4 tokens
    ([[0, 2, 3, 0]], "^gold span labels must be entity ids >= 1"),
    ([[0, 2, 3, M + 1]], f"^gold span label {M + 1} is not one of the {M} labels$"),
    ([[2, 0, 0, 1]], "^gold span of a document outside the batch of 2$"),
    ([[0, 0, 1]], r"^gold spans must be rows \(doc, start, end, label\), \[N, 4\], got \(1, 3\)$"),
])
def test_every_head_rejects_gold_that_is_no_segmentation(name, gold, message):
    """The heads' losses assume the gold spans segment each document; anything else is a data
    bug that a loss would hide, so each head says what is wrong."""
    torch.manual_seed(0)
    head = HEADS[name](D, M, max_width=K)
    X, lengths = torch.randn(2, 6, D), torch.tensor([6, 4])
    with pytest.raises(ValueError, match=message):
        head(X, lengths, torch.tensor(gold))


@pytest.mark.parametrize("name", sorted(HEADS))
def test_predictions_carry_no_autograd_graph(name):
    """With autograd on, as in a plain ``head.eval()(X, lengths)``, the decoded confidences of
    every head are plain tensors."""
    torch.manual_seed(0)
    head = HEADS[name](D, M, max_width=K).eval()
    X = torch.randn(2, 6, D, requires_grad=True)
    spans, conf = head(X, torch.tensor([6, 4]))
    assert not conf.requires_grad and conf.grad_fn is None


def _float64_reference(head, X, lengths, spans):
    """``(log Z, score of spans, confidences of spans)`` of ``head`` on ``X``, from its own
    (float32) scores, computed in float64."""
    L, T = X.shape[1], head.transitions.double()
    if isinstance(head, SemiCRFHead):
        scores = head.span_scores(X, lengths).double()
        marginals = semicrf_marginals(scores, lengths, T)
        doc, start, end, label = spans.unbind(1)
        return (semicrf_log_partition(scores, lengths, T),
                semicrf_gold_score(scores, lengths, spans, T),
                marginals[doc, start, end - start, label])
    em, allowed = head.emissions(X, lengths).double(), head.allowed
    tags = spans_to_tags(spans, lengths, L, head.scheme)
    return (crf_log_partition(em, T, lengths, allowed), crf_score(em, T, tags, lengths, allowed),
            crf_span_marginals(em, T, lengths, spans, head.scheme, allowed))


@pytest.mark.parametrize("name", ["SemiCRF", "LinearCRF"])
@pytest.mark.parametrize("null_bias", [0.0, 12.0])
def test_long_documents_keep_exact_confidences_and_path_probabilities(name, null_bias):
    """On a document of 4,000 tokens the scans' sums reach thousands in log space,
    where float32 loses whole units: the heads compute the marginals and the path probability
    in float64, so they match the float64 computation from the head's own scores. With the
    null (or O) output raised by 12 the best path has a probability near 0.9 (float32 gave
    it 6% or 16% too high); without, the semi-CRF's confidences of its many entities were off."""
    torch.manual_seed(0)
    head = HEADS[name](D, M, max_width=K).eval()
    L = 4000
    X, lengths = torch.randn(1, L, D) * 3, torch.tensor([L])
    with torch.no_grad():
        (head.scorer.output if name == "SemiCRF" else head.emitter[-1]).bias[0] += null_bias
        pred = head(X, lengths, options=DecodeOptions(path=True))
        log_z, best, want = _float64_reference(head, X, lengths, pred.spans)
    assert log_z.item() > 5000
    assert pred.path.item() == pytest.approx(math.exp(best.item() - log_z.item()), rel=1e-6)
    if null_bias:
        assert pred.path.item() > 0.5
    else:
        assert len(pred.spans) > 100
    torch.testing.assert_close(pred.scores.double(), want.clamp(0, 1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("transitions", [True, False])
def test_filtered_head_keeps_exact_confidences_and_path_probabilities_on_long_documents(
        transitions):
    """With transitions the filtered head scans whole documents, without them its long
    clusters; on 4,000 tokens of random scores the scans sum thousands in log space, where
    float32 put confidences off by up to 0.19 with transitions (2e-4 without) and the path
    probability 8% and 7% too high: the head solves its graph in float64, so both match the
    float64 solve of its own scores (the marginals as the gradient of log Z). The global
    scores are scaled up so that the best path has a probability worth comparing."""
    torch.manual_seed(0)
    head = FilteredSemiCRFHead(D, M, max_width=K, transitions=transitions).eval()
    L = 4000
    X, lengths = torch.randn(1, L, D) * 3, torch.tensor([L])
    with torch.no_grad():
        if transitions:
            head.transitions.normal_()
        for param in (head.scorer.output.weight, head.scorer.output.bias):
            param[M + 1:] *= 100  # the global half of the scorer's outputs
        pred = head(X, lengths, options=DecodeOptions(path=True, candidates=True))
        local, glob = head.span_scores(X, lengths)
    nodes = inference_node_set(local, glob, lengths)
    scores = nodes.grid(nodes.scores.double()).requires_grad_()
    mask, labels = nodes.grid(), nodes.grid(nodes.labels)
    T = head.transitions.detach().double() if transitions else None
    log_z = filtered_log_partition(scores, mask, labels, T)
    (marginals,) = torch.autograd.grad(log_z.sum(), scores)
    p_local = local_label_probability(local, nodes.index, nodes.labels).double()
    want = (p_local * marginals.reshape(-1)[nodes.index]).clamp(0, 1)
    rows, conf = pred.candidates
    assert torch.equal(rows, nodes.spans()) and nodes.index.numel() > 5000
    assert (want - want.round()).abs().max() > 0.4  # some confidences are far from 0 and 1
    torch.testing.assert_close(conf.double(), want, atol=1e-6, rtol=0)
    best = torch.zeros_like(mask)
    doc, start, end, _ = pred.spans.unbind(1)
    best[doc, start, end - start] = True
    with torch.no_grad():
        score = path_score(scores, best, labels, T)
    want_path = math.exp(score.item() - log_z.item())
    assert 1e-4 < want_path < 1 and log_z.item() > 1e5
    assert pred.path.item() == pytest.approx(want_path, rel=1e-5)


def test_filtered_head_with_null_tokens_keeps_exact_confidences_on_long_documents():
    """Every covered token's null node makes long clusters: on 4,000 tokens float32 put the
    confidences off by 4e-4 and the path probability 3% too low; the head solves that graph
    in float64 too, so its decode of its own float32 scores matches the decode of the same
    scores given in float64."""
    torch.manual_seed(0)
    head = FilteredSemiCRFHead(D, M, max_width=K, null_tokens=True).eval()
    L = 4000
    X, lengths = torch.randn(1, L, D) * 3, torch.tensor([L])
    options = DecodeOptions(path=True, candidates=True)
    with torch.no_grad():
        for param in (head.scorer.output.weight, head.scorer.output.bias):
            param[M + 1:] *= 100  # the global half: a best path worth comparing
        pred = head(X, lengths, options=options)
        local, glob = head.span_scores(X, lengths)
        want = head.decode(local.double(), glob.double(), lengths, options=options)
    assert torch.equal(pred.spans, want.spans) and len(want.candidates[1]) > 5000
    torch.testing.assert_close(pred.candidates[1].double(), want.candidates[1], atol=1e-6, rtol=0)
    assert 1e-4 < want.path.item() < 1
    assert pred.path.item() == pytest.approx(want.path.item(), rel=1e-5)


@pytest.mark.parametrize("name", sorted(HEADS))
@pytest.mark.parametrize("x_shape, lengths", [((2, 5, D), [5]), ((2, 5, D), [[5, 3]]),
                                              ((5, D), [5])])
def test_lengths_that_do_not_match_the_batch_are_a_clear_error(name, x_shape, lengths):
    """One length per document: a single length for two documents was broadcast before."""
    head = HEADS[name](D, M, max_width=K).eval()
    with pytest.raises(ValueError, match=r"^token vectors must be \[B, L, D\] and lengths \[B\]"):
        head(torch.randn(x_shape), torch.tensor(lengths))


@pytest.mark.parametrize("name", sorted(HEADS))
@pytest.mark.parametrize("call", ["decode", "loss", "nbest"])
@pytest.mark.parametrize("context_depth", [0, 1])
def test_token_vectors_of_another_width_are_a_clear_error(name, call, context_depth):
    """Vectors of another width than the head's input_width failed in a matrix product
    ("mat1 and mat2 shapes cannot be multiplied") or in the BiLSTM, naming neither."""
    torch.manual_seed(0)
    head = HEADS[name](D, M, max_width=K, context_depth=context_depth).eval()
    X, lengths = torch.randn(2, 5, D + 1), torch.tensor([5, 3])
    run = {"decode": lambda: head(X, lengths),
           "loss": lambda: head.train()(X, lengths, torch.tensor([[0, 1, 2, 1]])),
           "nbest": lambda: head.nbest(X, lengths, 2)}[call]
    with pytest.raises(ValueError, match=rf"^X must be \[B, L, D\] as the head's input_width, "
                                         rf"\(B, L, {D}\), got \(2, 5, {D + 1}\)$"):
        run()


def _decode_on_classes(name, n_classes):
    """A head of ``name`` with M labels and a function that decodes its scores for a batch of
    two documents of 5 tokens, cut or padded to ``n_classes`` classes (labels and null, or
    tags), and their shape."""
    torch.manual_seed(0)
    head = HEADS[name](D, M, max_width=K).eval()
    X, lengths = torch.randn(2, 5, D), torch.tensor([5, 3])

    def resized(scores):
        extra = n_classes - scores.shape[-1]
        if extra <= 0:
            return scores[..., :n_classes]
        return torch.cat([scores, scores[..., 1:].amax(-1, keepdim=True).expand(
            *scores.shape[:-1], extra) + 10.0], -1)  # labels the head lacks score best

    with torch.no_grad():
        if name == "FilteredSemiCRF":
            local, glob = (resized(x) for x in head.span_scores(X, lengths))
            return (lambda: head.decode(local, glob, lengths)), tuple(local.shape)
        if name == "SemiCRF":
            scores = resized(head.span_scores(X, lengths))
            return (lambda: head.decode(scores, lengths)), tuple(scores.shape)
        emissions = resized(head.emissions(X, lengths))
        return (lambda: head.decode(emissions, lengths)), tuple(emissions.shape)


@pytest.mark.parametrize("name", sorted(HEADS))
@pytest.mark.parametrize("change", [-1, 1])
def test_decoding_scores_of_another_label_set_is_a_clear_error(name, change):
    """decode is public and took scores of any number of classes: the span heads decoded
    entities of labels they do not have (or, for fewer classes, as if they had fewer), or
    failed inside PyTorch with transitions (a size mismatch); the linear CRF raised an
    IndexError."""
    want = M + 1 if name != "LinearCRF" else tag_scheme(M, "BIO").n_tags
    decode, shape = _decode_on_classes(name, want + change)
    argument, layout, classes = {
        "FilteredSemiCRF": ("local", r"\[B, L, K, C\]", f"{M} labels and null"),
        "SemiCRF": ("scores", r"\[B, L, K, C\]", f"{M} labels and null"),
        "LinearCRF": ("emissions", r"\[B, L, T\]", f"{want} BIO tags"),
    }[name]
    free = "B, L, K" if name != "LinearCRF" else "B, L"
    message = (rf"^{argument} must be {layout} as the head's {classes}, \({free}, {want}\), got "
               + re.escape(str(shape)) + "$")
    with pytest.raises(ValueError, match=message):
        decode()


@pytest.mark.parametrize("local_change, glob_change, message", [
    (-1, -1, rf"^local must be \[B, L, K, C\] as the head's {M} labels and null, "
             rf"\(B, L, K, {M + 1}\), got \(2, 5, {K}, {M}\)$"),
    (0, -1, rf"^glob must be \[B, L, K, C\] as local, \(2, 5, {K}, {M + 1}\), got "
            rf"\(2, 5, {K}, {M}\)$"),
], ids=["fewer-labels", "glob-of-fewer-labels"])
def test_the_filtered_loss_of_scores_of_another_label_set_is_a_clear_error(
        local_change, glob_change, message):
    """The filtered head's loss took local scores of fewer classes for a loss over fewer
    labels, without an error, and global scores of another shape than the local ones failed
    inside PyTorch (an IndexError or "Size does not match")."""
    torch.manual_seed(0)
    head = FilteredSemiCRFHead(D, M, max_width=K)
    X, lengths = torch.randn(2, 5, D), torch.tensor([5, 3])
    local, glob = head.span_scores(X, lengths)
    local, glob = local[..., :M + 1 + local_change], glob[..., :M + 1 + glob_change]
    with pytest.raises(ValueError, match=message):
        head.loss(local, glob, lengths, torch.tensor([[0, 1, 2, 1]]))


@pytest.mark.parametrize("shape", [(5, D), (1, 5, D), (2, 4, D), (2, 5, D - 1)],
                         ids=["one-document", "fewer-documents", "fewer-tokens", "width"])
def test_mean_field_token_vectors_of_another_shape_are_a_clear_error(shape):
    """decode (and refine) take the token vectors of a head with mean-field layers: another
    shape failed in a reshape ("shape '[10, 8]' is invalid for input of size 40") or a
    matrix product, naming neither."""
    torch.manual_seed(0)
    head = FilteredSemiCRFHead(D, M, max_width=K, mean_field=1).eval()
    X, lengths = torch.randn(2, 5, D), torch.tensor([5, 3])
    with torch.no_grad():
        local, glob = head.span_scores(X, lengths)
        local[..., 1] += 5.0  # every candidate a node
        head.decode(local, glob, lengths, tokens=X)  # (the vectors of these scores decode)
        message = (rf"^tokens must be \[B, L, D\] as glob's documents and tokens and the "
                   rf"head's token width, \(2, 5, {D}\), got {re.escape(str(shape))}$")
        with pytest.raises(ValueError, match=message):
            head.decode(local, glob, lengths, tokens=torch.randn(shape))


@pytest.mark.parametrize("name", sorted(HEADS))
@pytest.mark.parametrize("lengths, bad", [([5, 7], 7), ([5, -1], -1), ([-2, 9], -2)])
@pytest.mark.parametrize("call", ["decode", "loss", "nbest"])
def test_lengths_outside_the_rows_of_x_are_a_clear_error(name, lengths, bad, call):
    """A length past the rows of ``X`` made the filtered head decode spans past them and the
    semi-CRF raise an IndexError; a negative one was read as an empty document."""
    head, X, lengths, run = _call_on_lengths(name, lengths, call)
    with pytest.raises(ValueError, match=f"^lengths must lie between 0 and the 5 token rows of "
                                         f"X, got {bad}$"):
        run()
    head(X, lengths.clamp(0, 5))  # the same batch with valid lengths decodes


def _call_on_lengths(name, lengths, call):
    """A head of ``name``, a batch of two documents of 5 token rows with ``lengths``, and a
    function that runs ``call`` ("decode", "loss" or "nbest") on them."""
    torch.manual_seed(0)
    head = HEADS[name](D, M, max_width=K).eval()
    X, lengths = torch.randn(2, 5, D), torch.tensor(lengths)
    run = {"decode": lambda: head(X, lengths),
           "loss": lambda: head(X, lengths, torch.tensor([[0, 1, 2, 1]])),
           "nbest": lambda: head.nbest(X, lengths, 2)}[call]
    return head, X, lengths, run


@pytest.mark.parametrize("name", sorted(HEADS))
@pytest.mark.parametrize("lengths", [[4.5, 3.0], [4.0, 3.0], [True, True]])
@pytest.mark.parametrize("call", ["decode", "loss", "nbest"])
def test_lengths_that_are_not_integers_are_a_clear_error(name, lengths, call):
    """A length of 4.5 ended the document after token 4 in the filtered head's candidate
    mask (4 < 4.5), so it decoded an entity on a token the document does not have, and after
    token 3 in the semi-CRF's scan (``long()``)."""
    _, _, lengths, run = _call_on_lengths(name, lengths, call)
    with pytest.raises(ValueError, match=f"^lengths must be an integer tensor, got "
                                         f"{lengths.dtype}$"):
        run()


@pytest.mark.parametrize("name", sorted(HEADS))
def test_decode_takes_integer_lengths_only(name):
    """``decode`` is public, and takes the lengths as they come: a length of 4.5 made the
    filtered head decode an entity on token 4, past the document."""
    torch.manual_seed(0)
    head = HEADS[name](D, M, max_width=K).eval()
    X, lengths = torch.randn(1, 5, D), torch.tensor([5])
    with torch.no_grad():
        if name == "FilteredSemiCRF":
            local, glob = head.span_scores(X, lengths)
            local[..., 1] += 100.0  # every candidate span an entity: the filter keeps them all
            decode = functools.partial(head.decode, local, glob)
        elif name == "SemiCRF":
            decode = functools.partial(head.decode, head.span_scores(X, lengths))
        else:
            decode = functools.partial(head.decode, head.emissions(X, lengths))
        assert decode(torch.tensor([4])).spans[:, 2].max() <= 3
        with pytest.raises(ValueError, match="^lengths must be an integer tensor, got "
                                             "torch.float32$"):
            decode(torch.tensor([4.5]))


@pytest.mark.parametrize("name", sorted(HEADS))
def test_max_width_below_one_is_refused_by_every_head(name):
    """The linear CRF took max_width = 0 (or -1), which bounds its candidates, and listed
    one-token candidates all the same; the span heads refused it."""
    for bad in (0, -1):
        with pytest.raises(ValueError, match=f"^max_width must be >= 1, got {bad}$"):
            HEADS[name](D, M, max_width=bad)


@pytest.mark.parametrize("name", ["SemiCRF", "LinearCRF"])
def test_a_negative_label_count_is_refused_by_the_baseline_heads(name):
    """The semi-CRF head took n_labels = -1 (no label columns at all, not even null) and
    failed on its first batch with an IndexError; the linear CRF refused it."""
    with pytest.raises(ValueError, match="^n_labels must be >= 0, got -1$"):
        HEADS[name](D, -1)


NAN = float("nan")
INF = float("inf")
# bad values of each head's settings, by setting: non-integers (a bool is an int to Python)
# where sizes go, sizes of 0, NaN or inf where numbers go, unknown strings, yes/no settings
# that are no bool (read by their truth, "no" was yes)
BAD_SETTINGS = {
    "max_width": [2.5, True, "3"],
    "hidden_width": [0, -1, 2.5, True],
    "dropout": [NAN, -0.1, 1.5, True, "0.1"],
    "hidden_depth": [1.5, True],
    "context_depth": [1.5, True, -1],
    "span_repr": ["bogus", 3],
    "scheme": ["IOX", 3],
    "mean_field": [1.5, True, -1],
    "null_weight": [NAN, "0.5"],
    "boundary_smoothing": [NAN],
    "train_margin": [NAN, "0", INF],
    "exact_loss": [NAN, INF],
    "focal_gamma": [NAN, True, INF],
    "transitions": ["no", 0, None],
    "span_norm": ["no", 1],
    "doc_vector": ["false", 0],
    "word_pool": ["no", 1],
    "null_tokens": ["no", 1],
}


@pytest.mark.parametrize("name", sorted(HEADS))
def test_bad_settings_are_a_value_error_that_names_them_at_construction(name):
    """hidden_width = 0 built a span head that failed at its first batch, max_width = 2.5
    failed in PyTorch with an error that named no setting (the linear CRF took it), and True,
    NaN or 1.5 were taken for several settings (a NaN loss weight turned its loss off)."""
    cls = HEADS[name]
    settings = inspect.signature(cls).parameters
    for setting, values in BAD_SETTINGS.items():
        if setting not in settings:
            continue
        for value in values:
            message = rf"^{setting} must .*, got {re.escape(repr(value))}$"
            with pytest.raises(ValueError, match=message):
                cls(D, M, **{setting: value})
    for width in (0, 2.5, True):
        with pytest.raises(ValueError, match=f"^input_width must .*, got {width}$"):
            cls(width, M)
    for labels in (2.5, True, "2"):
        with pytest.raises(ValueError, match=f"^n_labels must be an integer, got {labels!r}$"):
            cls(D, labels)
    # the values the settings allow, NumPy's integers too, still build
    cls(D, numpy.int64(M), max_width=numpy.int64(2), hidden_width=4, dropout=0)
    cls(D, M, dropout=1)
    flags = [flag for flag in ("transitions", "span_norm", "word_pool") if flag in settings]
    cls(D, M, **{flag: numpy.bool_(True) for flag in flags})


def test_the_heads_parts_refuse_bad_sizes_at_construction():
    """The parts a head is built of, public for use on their own, name a bad size too: a
    mean-field attention width of 0 divided by sqrt(0), a context depth of True built an LSTM
    that failed to run, a scheme of 3 raised an AttributeError."""
    cases = [
        (lambda: SpanFeaturizer(D, 0, K), "^hidden_width must be >= 1, got 0$"),
        (lambda: SpanFeaturizer(D, 4, 2.5), "^max_width must be an integer, got 2.5$"),
        (lambda: SpanFeaturizer(0, 4, K), "^input_width must be >= 1, got 0$"),
        (lambda: SpanFeaturizer(D, 4, K, norm=1), "^norm must be True or False, got 1$"),
        (lambda: SpanFeaturizer(D, 4, K, doc_vector="no"),
         "^doc_vector must be True or False, got 'no'$"),
        (lambda: TokenContext(D, True), "^context_depth must be an integer, got True$"),
        (lambda: TokenContext(D, 1.5), "^context_depth must be an integer, got 1.5$"),
        (lambda: WordPool(0, True), "^input_width must be >= 1, got 0$"),
        (lambda: MeanFieldRefiner(2 * D, M, 1, attention_width=0),
         "^attention_width must be >= 1, got 0$"),
        (lambda: MeanFieldRefiner(2 * D, M, 1.5), "^layers must be an integer, got 1.5$"),
        (lambda: MeanFieldRefiner(2 * D, True, 1), "^n_classes must be an integer, got True$"),
        (lambda: tag_scheme(M, 3), r"^scheme must be one of \('BIO', 'BILUO'\), got 3$"),
        (lambda: tag_scheme(2.5), "^n_labels must be an integer, got 2.5$"),
    ]
    for build, message in cases:
        with pytest.raises(ValueError, match=message):
            build()


@pytest.mark.parametrize("name", ["SemiCRF", "LinearCRF"])
def test_a_baseline_head_of_no_entity_label_has_one_path(name):
    """n_labels = 0 is allowed, as the refusal of a negative count says: a head of null
    segments (O tags) only, whose one path costs no loss and decodes no entity."""
    torch.manual_seed(0)
    head = HEADS[name](D, 0, max_width=K)
    X, lengths = torch.randn(2, 5, D), torch.tensor([5, 3])
    assert head(X, lengths, torch.zeros((0, 4), dtype=torch.long)).item() == pytest.approx(0.0)
    with torch.no_grad():
        head.eval()
        scores = head.span_scores(X, lengths) if name == "SemiCRF" else head.emissions(X, lengths)
        assert head.decode(scores, lengths).spans.shape == (0, 4)


@pytest.mark.parametrize("kwargs", [{}, {"null_tokens": True}, {"mean_field": 1}])
def test_filtered_decode_of_scores_with_a_graph_returns_no_graph(kwargs):
    """``decode`` is public: given span scores that carry a graph (say the training step's),
    the filtered head returned confidences and candidates holding it, where ``forward`` and
    the other heads' ``decode`` return plain tensors."""
    torch.manual_seed(0)
    head = FilteredSemiCRFHead(D, M, max_width=K, **kwargs).eval()
    X, lengths = torch.randn(2, 5, D), torch.tensor([5, 3])
    tokens, local, glob = head._encode(X, lengths)
    assert local.requires_grad
    local = local.detach().clone()
    local[..., 1] += 100.0  # a node on every span, overlapping: marginals below 1
    local.requires_grad_(True)
    found = head.decode(local, glob, lengths, options=DecodeOptions(path=True, candidates=True),
                        tokens=tokens)
    assert len(found.spans) and len(found.candidates[0])
    for out in (found.scores, found.path, found.candidates[1]):
        assert not out.requires_grad and out.grad_fn is None


@pytest.mark.parametrize("name", sorted(HEADS))
def test_decode_takes_lengths_inside_the_scores_only(name):
    """``decode`` is public: a length past the rows of the scores made the filtered head and
    the linear CRF decode entities past them and the semi-CRF raise an IndexError, and a
    negative one was read as an empty document."""
    torch.manual_seed(0)
    head = HEADS[name](D, M, max_width=K).eval()
    X, lengths = torch.randn(2, 5, D), torch.tensor([5, 5])
    with torch.no_grad():
        if name == "FilteredSemiCRF":
            local, glob = head.span_scores(X, lengths)
            local[..., 1] += 100.0  # every candidate span an entity: the filter keeps them all
            decode, what = functools.partial(head.decode, local, glob), "the local scores"
        elif name == "SemiCRF":
            decode = functools.partial(head.decode, head.span_scores(X, lengths))
            what = "the scores"
        else:
            decode = functools.partial(head.decode, head.emissions(X, lengths))
            what = "the emissions"
        for bad, shown in (([5, 9], 9), ([-1, 5], -1)):
            with pytest.raises(ValueError, match=f"^lengths must lie between 0 and the 5 token "
                                                 f"rows of {what}, got {shown}$"):
                decode(torch.tensor(bad))
        with pytest.raises(ValueError, match=rf"^lengths must be \[B\], one per document of "
                                             rf"{what} \(2\), got \(1,\)$"):
            decode(torch.tensor([5]))
        with pytest.raises(TypeError, match="^lengths must be an integer tensor, got list$"):
            decode([5, 5])
        assert decode(torch.tensor([5, 3])).spans[:, 2].max() <= 4


@pytest.mark.parametrize("name", sorted(HEADS))
def test_gold_rows_that_are_not_a_tensor_are_a_clear_error(name):
    """As lengths in a list: gold rows in a list failed on a missing tensor method."""
    head = HEADS[name](D, M, max_width=K)
    X, lengths = torch.randn(2, 5, D), torch.tensor([5, 3])
    with pytest.raises(TypeError, match=r"^gold spans must be a tensor of rows \(doc, start, "
                                        r"end, label\), \[N, 4\], got list$"):
        head(X, lengths, [[0, 0, 1, 1]])
    with pytest.raises(TypeError, match="got list$"):
        gold_label_grid([[0, 0, 1, 1]], lengths, 5, K)


@pytest.mark.parametrize("name", sorted(HEADS))
def test_gold_rows_that_are_not_whole_numbers_are_a_clear_error(name):
    """Float gold rows were truncated: (0, 0.5, 1, 1) trained on the span 0..1."""
    torch.manual_seed(0)
    head = HEADS[name](D, M, max_width=K)
    X, lengths = torch.randn(2, 5, D), torch.tensor([5, 3])
    for bad in ([[0.0, 0.5, 1.0, 1.0]], [[0.0, 0.0, 1.0, float("nan")]]):
        with pytest.raises(ValueError, match=r"^gold spans must be whole numbers"):
            head(X, lengths, torch.tensor(bad))
    # whole numbers in a float tensor read as before, and so does an empty float tensor
    whole = head(X, lengths, torch.tensor([[0.0, 0.0, 1.0, 1.0]]))
    assert torch.isfinite(whole)
    assert torch.isfinite(head(X, lengths, torch.zeros((0, 4))))


@pytest.mark.parametrize("rows, message", [
    ([[0, 1, 2, 0]], "^span labels must be entity ids >= 1"),
    ([[0, 1, 2, M + 1]], f"^span label {M + 1} is not one of the {M} labels$"),
    ([[1, 3, 4, 1]], "^span outside its document"),  # document 1 has 4 tokens
    ([[2, 0, 0, 1]], "^span of a document outside the batch of 2$"),
])
def test_crf_span_marginals_rejects_spans_it_cannot_score(rows, message):
    """Label 0 was read as the last label (``label - 1`` indexing), a span past its document
    read the padding."""
    torch.manual_seed(0)
    head = LinearCRFHead(D, M, max_width=K).eval()
    X, lengths = torch.randn(2, 6, D), torch.tensor([6, 4])
    with torch.no_grad():
        em = head.emissions(X, lengths)
    with pytest.raises(ValueError, match=message):
        crf_span_marginals(em, head.transitions, lengths, torch.tensor(rows), head.scheme,
                           head.allowed)
    overlapping = torch.tensor([[0, 1, 2, 1], [0, 2, 3, 2]])  # queries may overlap
    assert crf_span_marginals(em, head.transitions, lengths, overlapping, head.scheme,
                              head.allowed).shape == (2,)


@pytest.mark.parametrize("name", sorted(HEADS))
@pytest.mark.parametrize("where", ["input", "weights"])
@pytest.mark.parametrize("call", ["decode", "nbest"])
def test_nan_scores_are_an_error_not_an_empty_prediction(name, where, call):
    """NaN loses every comparison, so a diverged model (or NaN token vectors) decoded to no
    entities at all, which looks like a confident prediction."""
    torch.manual_seed(0)
    head = HEADS[name](D, M, max_width=K).eval()
    X, lengths = torch.randn(2, 6, D), torch.tensor([6, 4])
    run = (lambda: head(X, lengths)) if call == "decode" else (lambda: head.nbest(X, lengths, 2))
    run()
    if where == "input":
        X[1, 2, 0] = float("nan")
    else:
        with torch.no_grad():
            next(p for p in reversed(list(head.parameters())) if p.dim() == 2)[0, 0] = float("nan")
    with pytest.raises(ValueError, match="^the head's scores are NaN"):
        run()


def test_unchecked_rows_give_the_checked_values():
    """The heads skip the row checks for their own decoded rows: the values are the same."""
    torch.manual_seed(0)
    X, lengths = torch.randn(2, 6, D), torch.tensor([6, 4])
    rows = torch.tensor([[0, 0, 1, 1], [0, 3, 3, 2], [1, 2, 3, 1]])
    crf = LinearCRFHead(D, M, max_width=K).eval()
    semi = SemiCRFHead(D, M, max_width=K, transitions=True).eval()
    with torch.no_grad():
        em = crf.emissions(X, lengths)
        scores = semi.span_scores(X, lengths)
        for check in (True, False):
            crf_conf = crf_span_marginals(em, crf.transitions, lengths, rows, crf.scheme,
                                          crf.allowed, check_rows=check)
            gold = semicrf_gold_score(scores, lengths, rows, semi.transitions, check_rows=check)
            if check:
                want = crf_conf, gold
            else:
                assert torch.equal(crf_conf, want[0]) and torch.equal(gold, want[1])
    with pytest.raises(ValueError):
        semicrf_gold_score(scores, lengths, torch.tensor([[0, 0, 1, 0]]), semi.transitions)


@pytest.mark.parametrize("name", sorted(HEADS))
def test_a_double_head_computes_its_loss_in_double(name):
    """``head.double()`` trains in float64 (gradcheck holds): the heads sum half-precision
    scores in float32 (they cast a double head's to float32 as well, so gradcheck failed)."""
    torch.manual_seed(0)
    head = HEADS[name](3, 2, max_width=2, hidden_width=4, dropout=0.0).double()
    X = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    lengths, gold = torch.tensor([4, 3]), torch.tensor([[0, 0, 1, 1], [1, 2, 2, 2]])
    assert head(X, lengths, gold).dtype == torch.float64
    assert torch.autograd.gradcheck(lambda x: head(x, lengths, gold), (X,))


@pytest.mark.parametrize("name", sorted(HEADS))
def test_a_double_head_with_transitions_decodes_with_path_probabilities(name):
    """The filtered head's path score read its float64 transitions with float32 node scores."""
    torch.manual_seed(0)
    kwargs = {} if name == "LinearCRF" else {"transitions": True}
    head = HEADS[name](3, 2, max_width=2, hidden_width=4, **kwargs).double().eval()
    X, lengths = torch.randn(2, 4, 3, dtype=torch.float64), torch.tensor([4, 3])
    out = head(X, lengths, options=DecodeOptions(path=True, candidates=True))
    assert out.path.shape == (2,) and bool(((out.path > 0) & (out.path <= 1 + 1e-6)).all())


@pytest.mark.parametrize("name", sorted(HEADS))
def test_a_double_head_reports_its_confidences_in_double(name):
    """The filtered head read a double head's node scores and local probabilities in float32,
    so its confidences (and the marginals under them) were rounded, where the other heads'
    are float64; they are the local probability times the marginal, both in float64."""
    torch.manual_seed(0)
    kwargs = {} if name == "LinearCRF" else {"transitions": True}
    head = HEADS[name](3, 2, max_width=3, hidden_width=4, **kwargs).double().eval()
    X, lengths = torch.randn(2, 6, 3, dtype=torch.float64), torch.tensor([6, 4])
    if name == "FilteredSemiCRF":
        with torch.no_grad():  # keep most spans, so that nodes overlap
            head.scorer.output.bias[1:3] += 3.0
    with torch.no_grad():
        out = head(X, lengths, options=DecodeOptions(candidates=True))
    assert out.scores.dtype == out.candidates[1].dtype == torch.float64
    if name != "FilteredSemiCRF":
        return
    local, glob = head.span_scores(X, lengths)
    mask, labels = inference_nodes(local, lengths)
    node_scores = glob.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    marginals = filtered_marginals(node_scores, mask, labels, head.transitions.detach())
    p_local = local.log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1).exp()
    doc, start, end = out.candidates[0][:, :3].unbind(1)
    want = (p_local * marginals)[doc, start, end - start]
    assert ((marginals > 0) & (marginals < 1)).any()
    assert torch.allclose(out.candidates[1], want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("how", ["scores", "transitions"])
@pytest.mark.parametrize("name", sorted(HEADS))
def test_a_document_without_a_distribution_has_a_path_probability_of_zero(name, how):
    """Where every path of a document scores -inf (its scores, or the transitions from START,
    at -inf) there is no distribution and no entity is decoded: the linear CRF and the
    filtered head gave that empty path a probability of 1 (its score, raised to NEG as log Z
    is, cancelled log Z), the semi-CRF 0. Now 0 for each; a document with a distribution
    keeps the probability of its best path."""
    torch.manual_seed(0)
    kwargs = {} if name == "LinearCRF" else {"transitions": True}
    head = HEADS[name](3, 1, max_width=2, hidden_width=4, **kwargs).eval()
    lengths = torch.tensor([3, 2])
    if how == "transitions":
        with torch.no_grad():
            head.transitions[-1, :] = -math.inf  # no path may start: none in either document
    gen = torch.Generator().manual_seed(1)
    if name == "LinearCRF":
        scores = torch.randn((2, 3, head.scheme.n_tags), generator=gen)
    else:
        scores = torch.randn((2, 3, 2, 2), generator=gen)
    if how == "scores":
        scores[0] = -math.inf
    options = DecodeOptions(path=True)
    if name == "FilteredSemiCRF":
        local = torch.zeros((2, 3, 2, 2))
        local[..., 1] = 1.0  # every span a node
        out = head.decode(local, scores, lengths, options=options)
    else:
        out = head.decode(scores, lengths, options=options)
    assert not (out.spans[:, 0] == 0).any()
    if how == "transitions":
        assert out.path.tolist() == [0.0, 0.0] and out.spans.shape[0] == 0
    else:
        assert out.path[0].item() == 0.0 and 0.0 < out.path[1].item() <= 1.0


def test_a_log_partition_at_or_below_half_the_impossible_score_is_no_distribution():
    """The solvers give a document without a path of finite score a log Z at or below NEG / 2
    (finite, for its gradient): from there down its path has probability 0, above it the
    path's probability is exp(score - log Z)."""
    from spacy_fsemicrf.structured.prediction import path_probability
    from spacy_fsemicrf.structured.semiring import NEG

    log_z = torch.tensor([NEG, NEG / 2, 0.4 * NEG, 0.0], dtype=torch.float64)
    best = torch.tensor([NEG, NEG / 2, 0.4 * NEG, math.log(0.25)], dtype=torch.float64)
    assert path_probability(best, log_z).tolist() == [0.0, 0.0, 1.0, 0.25]
