"""Mean-field refinement of the filtered graph's node scores against direct summation: the
edges against the definition (overlap or touch), each layer against the mean-field update
written out node by node, and the head's use of the refined scores."""
import math

import pytest
import torch

from spacy_fsemicrf.structured import filtered
from spacy_fsemicrf.structured.heads import FilteredSemiCRFHead
from spacy_fsemicrf.structured.mean_field import (
    MeanFieldRefiner,
    attention_weights,
    node_edges,
    node_features,
)
from spacy_fsemicrf.structured.spans import gold_label_grid


def random_node_index(gen, B, L, K, p):
    lengths = torch.randint(1, L + 1, (B,), generator=gen)
    lengths[0] = L
    starts = torch.arange(L).view(1, L, 1)
    widths = torch.arange(K).view(1, 1, K)
    mask = (starts + widths < lengths.view(B, 1, 1)) & (torch.rand((B, L, K), generator=gen) < p)
    return filtered.grid_index(mask)


def spans_of(index, shape):
    B, L, K = shape
    out = []
    for flat in index.tolist():
        row, width = divmod(flat, K)
        doc, start = divmod(row, L)
        out.append((doc, start, start + width + 1))  # end exclusive
    return out


def brute_edges(index, shape):
    spans = spans_of(index, shape)
    return {
        (i, j)
        for i, (di, si, ei) in enumerate(spans)
        for j, (dj, sj, ej) in enumerate(spans)
        if i != j and di == dj and sj <= ei and ej >= si
    }


# documents longer than K and several widths, so that neighbours come from several starts
# (4, 2, 1): documents of two tokens and one width, where the keys of a document's last node
# and the next document's first are closest
SHAPES = [(1, 3, 2), (2, 7, 3), (3, 12, 4), (2, 40, 10), (1, 25, 1), (4, 9, 9), (4, 2, 1)]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shape", SHAPES)
def test_edges_join_exactly_the_nodes_that_overlap_or_touch(seed, shape):
    gen = torch.Generator().manual_seed(seed)
    for p in (0.1, 0.4, 1.0):
        index = random_node_index(gen, *shape, p)
        src, dst = node_edges(index, shape)
        found = list(zip(src.tolist(), dst.tolist()))
        assert len(found) == len(set(found))  # no pair twice
        assert set(found) == brute_edges(index, shape)


def brute_update(layer, unary, Q, features, index, shape):
    """One mean-field update written out node by node: the attention softmax over each node's
    neighbours (the definition of an edge, not node_edges) and the sum of their messages."""
    n, C = unary.shape
    edges = brute_edges(index, shape)
    mu = layer.compatibility.detach().double()
    q = features.double() @ layer.query.weight.detach().double().T
    k = features.double() @ layer.key.weight.detach().double().T
    out = unary.double().clone()
    for i in range(n):
        neighbours = [j for j in range(n) if (i, j) in edges]
        if not neighbours:
            continue
        logits = [float(q[i] @ k[j]) / math.sqrt(q.shape[1]) for j in neighbours]
        top = max(logits)
        weights = [math.exp(x - top) for x in logits]
        total = sum(weights)
        for j, w in zip(neighbours, weights):
            for label in range(C):
                out[i, label] += w / total * sum(
                    float(mu[label, other]) * float(Q[j, other]) for other in range(C)
                )
    return out


def random_refiner(gen, F, C, layers, tied):
    refiner = MeanFieldRefiner(F, C, layers, attention_width=5, tied=tied).double()
    with torch.no_grad():
        for p in refiner.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return refiner


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("shape", [(2, 7, 3), (1, 15, 4), (3, 5, 5)])
@pytest.mark.parametrize("layers,tied", [(1, True), (2, True), (3, False)])
def test_layers_are_mean_field_updates(seed, shape, layers, tied):
    gen = torch.Generator().manual_seed(100 + seed)
    C, F = 4, 6
    index = random_node_index(gen, *shape, 0.5)
    n = index.numel()
    unary = torch.randn((n, C), generator=gen, dtype=torch.float64) * 2
    features = torch.randn((n, F), generator=gen, dtype=torch.float64)
    refiner = random_refiner(gen, F, C, layers, tied)
    got = refiner(unary, features, index, shape)
    logits = unary
    for m in range(layers):
        layer = refiner.layers[0 if tied else m]
        logits = brute_update(layer, unary, logits.softmax(-1), features, index, shape)
    torch.testing.assert_close(got, logits, rtol=1e-9, atol=1e-9)


def test_layers_have_their_own_weights_unless_tied():
    untied = MeanFieldRefiner(6, 4, 3, attention_width=5)
    assert len(untied.layers) == 3 and untied.layers[0] is not untied.layers[1]
    assert all(layer.query.out_features == 5 == layer.key.out_features for layer in untied.layers)
    assert len(MeanFieldRefiner(6, 4, 3, tied=True).layers) == 1
    with pytest.raises(ValueError, match="at least one layer"):
        MeanFieldRefiner(6, 4, 0)


def test_a_fresh_refiner_returns_the_unaries_and_learns():
    """mu starts at zero (the refinement starts as the paper's graph), and its gradient is not
    zero where nodes have neighbours."""
    gen = torch.Generator().manual_seed(3)
    shape = (2, 9, 4)
    index = random_node_index(gen, *shape, 0.6)
    unary = torch.randn((index.numel(), 3), generator=gen)
    refiner = MeanFieldRefiner(4, 3, 2)
    out = refiner(unary, torch.randn((index.numel(), 4), generator=gen), index, shape)
    assert torch.equal(out, unary)
    out.logsumexp(-1).sum().backward()
    assert any(float(layer.compatibility.grad.abs().sum()) > 0 for layer in refiner.layers)


def test_node_features_are_the_boundary_tokens():
    X = torch.arange(2 * 5 * 3, dtype=torch.float32).view(2, 5, 3)
    shape = (2, 5, 4)
    index = torch.tensor([0 * 20 + 1 * 4 + 2, 1 * 20 + 4 * 4 + 0])  # (0, 1..3), (1, 4..4)
    got = node_features(X, index, shape)
    torch.testing.assert_close(got[0], torch.cat([X[0, 1], X[0, 3]]))
    torch.testing.assert_close(got[1], torch.cat([X[1, 4], X[1, 4]]))


def small_head(**kwargs):
    torch.manual_seed(0)
    head = FilteredSemiCRFHead(6, 3, max_width=4, hidden_width=8, dropout=0.0, **kwargs)
    return head.eval()


def randomise_compatibility(head, seed=7):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in head.refiner.layers:
            layer.compatibility.copy_(torch.randn(layer.compatibility.shape, generator=gen) * 3)


def batch(seed=0, B=3, L=12):
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn((B, L, 6), generator=gen)
    lengths = torch.tensor([L, L - 3, 5])
    gold = torch.tensor([[0, 1, 2, 1], [0, 5, 5, 2], [1, 0, 3, 3], [2, 2, 3, 1]])
    return X, lengths, gold


@pytest.mark.parametrize("null_tokens", [False, True])
def test_an_untrained_refinement_changes_nothing(null_tokens):
    X, lengths, gold = batch()
    plain = small_head(null_tokens=null_tokens)
    refined = small_head(null_tokens=null_tokens, mean_field=2)
    refined.load_state_dict(plain.state_dict(), strict=False)
    torch.testing.assert_close(refined(X, lengths, gold), plain(X, lengths, gold))
    for margin in (0.0, 2.0):
        for got, want in zip(refined(X, lengths, filter_margin=margin),
                             plain(X, lengths, filter_margin=margin)):
            torch.testing.assert_close(got, want)


def test_the_path_crf_reads_the_refined_scores():
    """Loss and decoding with a trained-looking refinement, against the plain filtered graph
    scored by hand with the refiner's scores."""
    X, lengths, gold = batch(1)
    head = small_head(mean_field=1)
    randomise_compatibility(head)
    tokens, local, glob = head._encode(X, lengths)
    # decoding: the best path of the inference graph with refined node scores
    nodes = filtered.inference_node_set(local, glob, lengths, 2.0)
    features = node_features(tokens, nodes.index, nodes.shape)
    unary = glob.contiguous().reshape(-1, 4)[nodes.index]
    logits = head.refiner(unary.float(), features, nodes.index, nodes.shape)
    scores = logits[torch.arange(nodes.index.numel()), nodes.labels]
    assert not torch.allclose(scores, nodes.scores)  # the test would not see a refinement
    best, _ = filtered.decode_node_set(nodes._replace(scores=scores), None)
    spans, _ = head(X, lengths, filter_margin=2.0)
    assert torch.equal(spans, nodes.spans(best))
    # training: local loss plus log Z - gold score on the training graph with refined scores
    gold_grid = gold_label_grid(gold, lengths, X.shape[1], 4)
    mask, labels = filtered.training_nodes(local.detach(), lengths, gold_grid)
    index = filtered.grid_index(mask)
    unary = glob.contiguous().reshape(-1, 4)[index].float()
    refined = head.refiner(unary, node_features(tokens, index, nodes.shape), index, nodes.shape)
    grid_scores = torch.zeros(mask.shape).view(-1).index_put(
        (index,), refined[torch.arange(index.numel()), labels.view(-1)[index]]).view(mask.shape)
    glob_loss = (filtered.filtered_log_partition(grid_scores, mask, labels, None)
                 - filtered.path_score(grid_scores, gold_grid > 0, labels, None)).sum()
    plain = small_head()
    plain.load_state_dict(head.state_dict(), strict=False)
    plain_tokens, plain_local, plain_glob = plain._encode(X, lengths)
    plain_scores = plain_glob.float().gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    plain_glob_loss = (filtered.filtered_log_partition(plain_scores, mask, labels, None)
                       - filtered.path_score(plain_scores, gold_grid > 0, labels, None)).sum()
    local_loss = plain(X, lengths, gold) - plain_glob_loss
    torch.testing.assert_close(head(X, lengths, gold), local_loss + glob_loss)


def test_scoring_nodes_without_the_token_vectors_is_a_clear_error():
    X, lengths, _ = batch()
    head = small_head(mean_field=1)
    local, glob = head.span_scores(X, lengths)
    with pytest.raises(ValueError, match=r"^a filtered head with mean_field > 0 needs the token "
                                         r"vectors \(tokens=\.\.\.\) to score its nodes$"):
        head.nodes(local, glob, lengths)
    with pytest.raises(ValueError, match="mean_field must be >= 0"):
        small_head(mean_field=-1)


def test_nbest_and_confidences_use_the_refined_graph():
    X, lengths, _ = batch(2)
    head = small_head(mean_field=2)
    randomise_compatibility(head, seed=11)
    spans, conf = head(X, lengths, filter_margin=2.0)
    best = head.nbest(X, lengths, 1, filter_margin=2.0)
    rows = sorted(tuple(r) for r in spans.tolist())
    from_nbest = sorted((b, s, e, label) for b, segs in enumerate(best)
                        for (s, e, label) in segs[0].spans)
    assert rows == from_nbest
    assert bool(((conf >= 0) & (conf <= 1)).all())


def test_a_pipeline_with_mean_field_learns_saves_and_loads(tmp_path):
    import spacy

    try:
        from .conftest import gold_set, make_examples, model_config, predicted_set, train_pipeline
    except ImportError:  # pragma: no cover - tests run as a plain directory
        from conftest import gold_set, make_examples, model_config, predicted_set, train_pipeline
    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner", config={"model": model_config(mean_field=2)})
    examples = make_examples(nlp)
    losses = train_pipeline(nlp, examples, n_iter=60)
    assert ner.torch_head.refiner is not None and losses[-1] < losses[0] / 5
    # the compatibilities moved away from zero: the refinement is in use
    assert any(float(layer.compatibility.detach().abs().sum()) > 0
               for layer in ner.torch_head.refiner.layers)
    texts = [eg.reference.text for eg in examples]
    docs = list(nlp.pipe(texts))
    assert predicted_set(docs) == gold_set(nlp)
    nlp.to_disk(tmp_path / "p")
    loaded = spacy.load(tmp_path / "p")
    assert loaded.get_pipe("fsemicrf_ner").torch_head.refiner.n_layers == 2
    assert predicted_set(loaded.pipe(texts)) == predicted_set(docs)
    scores = [s for d in loaded.pipe(texts) for s in d.spans["fsemicrf"].attrs["scores"]]
    assert scores == [s for d in docs for s in d.spans["fsemicrf"].attrs["scores"]]


def test_attention_weights_are_each_nodes_softmax_even_for_large_scores():
    # scaled dot products in the hundreds: the softmax subtracts each node's top score first
    gen = torch.Generator().manual_seed(0)
    query, key = 30 * torch.randn((4, 8), generator=gen), 30 * torch.randn((4, 8), generator=gen)
    src = torch.tensor([0, 0, 0, 1, 1, 3])
    dst = torch.tensor([1, 2, 3, 0, 2, 0])
    got = attention_weights(query, key, src, dst, 4)
    logits = (query[src] * key[dst]).sum(-1) / math.sqrt(8)
    assert logits.abs().max() > 100
    for node in (0, 1, 3):
        edges = src == node
        assert torch.allclose(got[edges], torch.softmax(logits[edges], 0))


def test_a_refined_head_runs_in_double_precision_as_in_single():
    """``head.double()`` moves the refiner too: its inputs follow its weights, and the
    refined graph gives the same entities and nearly the same loss as in float32."""
    X, lengths, gold = batch(3)
    head = small_head(mean_field=2)
    randomise_compatibility(head)
    spans, conf = head(X, lengths, filter_margin=2.0)
    loss = head.train()(X, lengths, gold)
    double = small_head(mean_field=2).double()
    double.load_state_dict(head.state_dict())
    spans64, conf64 = double.eval()(X.double(), lengths, filter_margin=2.0)
    assert torch.equal(spans64, spans) and conf64.dtype == torch.float64
    torch.testing.assert_close(conf64.float(), conf, atol=1e-5, rtol=1e-4)
    loss64 = double.train()(X.double(), lengths, gold)
    torch.testing.assert_close(loss64.float(), loss, atol=1e-4, rtol=1e-4)


def test_a_refined_head_takes_a_batch_of_empty_documents():
    head = small_head(mean_field=1)
    X, lengths = torch.zeros(2, 0, 6), torch.tensor([0, 0])
    spans, conf = head(X, lengths)
    assert spans.shape == (0, 4) and conf.shape == (0,)
    loss = head.train()(X, lengths, torch.zeros(0, 4, dtype=torch.long))
    loss.backward()
    assert float(loss.detach()) == 0.0
