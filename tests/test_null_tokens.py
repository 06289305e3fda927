"""The filtered graph with null tokens against enumeration of every set of non-overlapping
nodes (any set: a path may leave nodes out), scored by its nodes plus the nulls of the covered
tokens it leaves uncovered."""
import math

import pytest
import torch

from spacy_fsemicrf.structured import filtered
from spacy_fsemicrf.structured.heads import FilteredSemiCRFHead
from spacy_fsemicrf.structured.null_tokens import add_null_tokens, null_token_scores
from spacy_fsemicrf.structured.prediction import DecodeOptions

from .bruteforce import nonoverlapping_sets


def random_nodes(gen, B, L, K, p, n_labels=3):
    """A random NodeSet on ``[B, L, K]`` (nodes within the document) and null scores."""
    lengths = torch.randint(1, L + 1, (B,), generator=gen)
    lengths[0] = L
    starts = torch.arange(L).view(1, L, 1)
    widths = torch.arange(K).view(1, 1, K)
    inside = starts + widths < lengths.view(B, 1, 1)
    mask = inside & (torch.rand((B, L, K), generator=gen) < p)
    index = filtered.grid_index(mask)
    labels = torch.randint(1, n_labels + 1, (index.numel(),), generator=gen)
    scores = torch.randn(index.numel(), generator=gen, dtype=torch.float64) * 2
    null = torch.randn((B, L), generator=gen, dtype=torch.float64) * 2
    return filtered.NodeSet(index, labels, scores, (B, L, K)), null, lengths


def enumerate_sets(nodes, null):
    """Per document: log Z, the best set's score, the best set (node positions) and the node
    marginals, by listing every set of pairwise non-overlapping nodes."""
    B, L, K = nodes.shape
    n = nodes.index.numel()
    spans = []
    for i in range(n):
        row, width = divmod(int(nodes.index[i]), K)
        doc, start = divmod(row, L)
        spans.append((doc, start, start + width))
    out = []
    for b in range(B):
        mine = [i for i in range(n) if spans[i][0] == b]
        tokens_of = {i: set(range(spans[i][1], spans[i][2] + 1)) for i in mine}
        covered = set().union(*tokens_of.values())
        weights = []
        for chosen in nonoverlapping_sets([spans[i][1:] for i in mine]):
            subset = tuple(mine[j] for j in chosen)
            tokens = set().union(*(tokens_of[i] for i in subset))
            score = sum(float(nodes.scores[i]) for i in subset)
            score += sum(float(null[b, t]) for t in covered - tokens)
            weights.append((score, subset))
        log_z = math.log(sum(math.exp(s) for s, _ in weights))
        best_score, best = max(weights)
        marg = {i: sum(math.exp(s - log_z) for s, sub in weights if i in sub) for i in mine}
        out.append((log_z, best_score, set(best), marg))
    return out


def solve(nodes, null):
    graph = add_null_tokens(nodes, null)
    # log Z through the grid function: an independent way in to the same solver
    log_z = filtered.filtered_log_partition(
        graph.nodes.grid(graph.nodes.scores), graph.nodes.grid(), None, None, graph.nodes.index
    )
    best_cells, _ = filtered.decode_node_set(
        graph.nodes._replace(scores=graph.best_scores), None, marginals=False
    )
    _, cell_marginals = filtered.decode_node_set(graph.nodes, None)
    at = graph.node_at
    best = best_cells[at] & graph.pick[at]
    marginals = cell_marginals[at] * graph.share[at]
    B, L, K = nodes.shape
    docs = graph.nodes.index // (L * K)
    best_score = torch.zeros(B, dtype=torch.float64).index_add(
        0, docs, torch.where(best_cells, graph.best_scores, 0.0))
    return log_z, best_score, best, marginals


@pytest.mark.parametrize("seed", range(60))
def test_log_z_best_path_and_marginals_match_enumeration(seed):
    gen = torch.Generator().manual_seed(seed)
    B, L, K = 2, [4, 7, 12, 20][seed % 4], [2, 3, 4, 6][(seed // 4) % 4]
    p = min(0.9, 12.0 / (B * L * K) + 0.05 * (seed % 5))
    nodes, null, _ = random_nodes(gen, B, L, K, p)
    if nodes.index.numel() > 16:  # keep the enumeration small
        keep = torch.zeros(nodes.index.numel(), dtype=torch.bool)
        keep[torch.randperm(nodes.index.numel(), generator=gen)[:16]] = True
        nodes = filtered.NodeSet(nodes.index[keep], nodes.labels[keep], nodes.scores[keep], nodes.shape)
    log_z, best_score, best, marginals = solve(nodes, null)
    expected = enumerate_sets(nodes, null)
    B = nodes.shape[0]
    per_doc = nodes.index // (nodes.shape[1] * nodes.shape[2])
    for b in range(B):
        ref_log_z, ref_best_score, ref_best, ref_marg = expected[b]
        # the nulls of uncovered tokens are left out on both sides
        assert float(log_z[b]) == pytest.approx(ref_log_z, abs=1e-8)
        assert float(best_score[b]) == pytest.approx(ref_best_score, abs=1e-8)
        mine = (per_doc == b).nonzero().squeeze(1).tolist()
        assert {i for i in mine if best[i]} == ref_best
        for i in mine:
            assert float(marginals[i]) == pytest.approx(ref_marg[i], abs=1e-8)


def test_a_path_may_leave_an_isolated_node_out():
    """On the paper's graph an isolated node is on every path; with null tokens its marginal is
    the logistic of its score against the nulls of its tokens."""
    nodes = filtered.NodeSet(torch.tensor([1 * 3 + 1]), torch.tensor([2]),
                             torch.tensor([0.5], dtype=torch.float64), (1, 5, 3))
    null = torch.tensor([[0.0, 0.3, 0.4, 0.0, 0.0]], dtype=torch.float64)
    _, _, best, marginals = solve(nodes, null)
    assert float(marginals[0]) == pytest.approx(1 / (1 + math.exp(0.7 - 0.5)))
    assert not bool(best[0])  # the nulls score 0.7 > 0.5


def test_a_cell_whose_node_ties_with_its_null_picks_the_null():
    """A one-token node scoring exactly what the null of its token scores: the cell's best
    choice is the null (ties go to null, as in the filter); above it, the node."""
    for score, picked in ((0.5, False), (0.75, True)):
        nodes = filtered.NodeSet(torch.tensor([1 * 3 + 0]), torch.tensor([2]),
                                 torch.tensor([score], dtype=torch.float64), (1, 5, 3))
        null = torch.tensor([[0.0, 0.5, 0.0, 0.0, 0.0]], dtype=torch.float64)
        graph = add_null_tokens(nodes, null)
        assert graph.pick.tolist() == [picked]
        assert graph.best_scores.tolist() == [max(score, 0.5)]


def test_gold_path_nulls():
    nodes = filtered.NodeSet(torch.tensor([0, 2 * 2 + 1]), torch.tensor([1, 1]),
                             torch.zeros(2, dtype=torch.float64), (1, 4, 2))
    null = torch.tensor([[1.0, 10.0, 100.0, 1000.0]], dtype=torch.float64)
    on_path = torch.tensor([True, False])  # token 0 on the path; tokens 2-3 covered, left out
    assert float(null_token_scores(nodes, null, on_path)[0]) == 1100.0


def small_head(null_tokens=True, **kwargs):
    torch.manual_seed(0)
    return FilteredSemiCRFHead(6, 3, max_width=3, hidden_width=8, null_tokens=null_tokens,
                               boundary_smoothing=0.0, **kwargs).double().eval()


@pytest.mark.parametrize("seed", range(8))
def test_head_loss_is_log_z_minus_the_gold_path(seed):
    """The global part of the loss against enumeration over the training nodes (every predicted
    node, overlapping gold or not)."""
    gen = torch.Generator().manual_seed(seed)
    head = small_head()
    B, L, K = 2, 7, 3
    local = torch.randn((B, L, K, 4), generator=gen, dtype=torch.float64)
    local[..., 0] += 1.0  # a few nodes
    glob = torch.randn((B, L, K, 4), generator=gen, dtype=torch.float64)
    lengths = torch.tensor([7, 5])
    gold = torch.tensor([[0, 1, 2, 1], [0, 5, 5, 3], [1, 0, 0, 2]])
    from spacy_fsemicrf.structured.spans import gold_label_grid
    grid = gold_label_grid(gold, lengths, L, K)
    mask, labels = filtered.training_nodes(local, lengths, grid, overlapping_only=False)
    scores = glob.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    loss = head._null_tokens_loss(scores, mask, labels, glob, grid)
    index = filtered.grid_index(mask)
    nodes = filtered.NodeSet(index, labels.view(-1)[index], scores.view(-1)[index], (B, L, K))
    null = glob[:, :, 0, 0]
    expected = 0.0
    for b, (log_z, _, _, _) in enumerate(enumerate_sets(nodes, null)):
        on_gold = grid.view(-1)[index] > 0
        mine = (index // (L * K)) == b
        gold_score = float((nodes.scores * (on_gold & mine)).sum())
        gold_score += float(null_token_scores(nodes, null, on_gold)[b])
        expected += log_z - gold_score
    assert float(loss) == pytest.approx(expected, rel=1e-6)  # the head scores nulls in float32
    # and its gradient in the node scores is that of log Z minus the gold path: central
    # differences of the same loss
    leaf = scores.detach().requires_grad_()
    head._null_tokens_loss(leaf, mask, labels, glob, grid).backward()
    eps = 1e-6
    for flat in index.tolist():
        step = torch.zeros_like(scores)
        step.view(-1)[flat] = eps
        up, down = (float(head._null_tokens_loss(scores + sign * step, mask, labels, glob, grid))
                    for sign in (1, -1))
        assert float(leaf.grad.view(-1)[flat]) == pytest.approx((up - down) / (2 * eps),
                                                                abs=1e-5)
    # every predicted node is a training node, also far from gold
    pred, _ = filtered.inference_nodes(local, lengths)
    assert bool((mask >= pred).all())


def test_head_decodes_the_best_set_with_confidences_and_path_probability():
    gen = torch.Generator().manual_seed(3)
    head = small_head()
    B, L, K = 2, 8, 3
    local = torch.randn((B, L, K, 4), generator=gen, dtype=torch.float64)
    glob = torch.randn((B, L, K, 4), generator=gen, dtype=torch.float64)
    lengths = torch.tensor([8, 6])
    prediction = head.decode(local, glob, lengths, 0.5, DecodeOptions(path=True))
    nodes = head.nodes(local, glob, lengths, 0.5)
    null = glob[:, :, 0, 0]
    expected = enumerate_sets(nodes, null)
    rows = nodes.spans().tolist()
    want = sorted(tuple(rows[i]) for b in range(B) for i in expected[b][2])
    assert sorted(map(tuple, prediction.spans.tolist())) == want
    assert 0 < len(want) < len(rows)  # some nodes decoded, some left out
    local_prob = local.log_softmax(-1).exp()
    for (doc, start, end, label), conf in zip(prediction.spans.tolist(), prediction.scores.tolist()):
        i = rows.index([doc, start, end, label])
        marg = expected[doc][3][i]
        assert conf == pytest.approx(float(local_prob[doc, start, end - start, label]) * marg, abs=1e-6)  # float32
    for b in range(B):
        log_z, best_score, _, _ = expected[b]
        assert float(prediction.path[b]) == pytest.approx(math.exp(best_score - log_z), abs=1e-6)
    # candidates: every kept node with its confidence (local probability times marginal), only
    # when asked for, as is the path probability
    assert prediction.candidates is None and head.decode(local, glob, lengths, 0.5).path is None
    cand_rows, cand_conf = head.decode(local, glob, lengths, 0.5,
                                       DecodeOptions(candidates=True)).candidates
    assert cand_rows.tolist() == rows
    for i, (doc, start, end, label) in enumerate(rows):
        want_conf = float(local_prob[doc, start, end - start, label]) * expected[doc][3][i]
        assert float(cand_conf[i]) == pytest.approx(want_conf, abs=1e-6)


def test_null_tokens_refuse_what_they_do_not_support():
    with pytest.raises(ValueError, match="^null_tokens needs transitions = false: a cell that "
                                         "holds a node and a null could not tell their labels "
                                         "apart$"):
        FilteredSemiCRFHead(6, 3, null_tokens=True, transitions=True)
    head = small_head()
    local = torch.randn((1, 4, 3, 4), dtype=torch.float64)
    with pytest.raises(ValueError, match="n-best"):
        head.nbest(torch.randn((1, 4, 6), dtype=torch.float64), torch.tensor([4]), 2)
    options = DecodeOptions(constraints=[object()])  # any entry: the check comes first
    assert options.constrained()
    with pytest.raises(ValueError, match="^constrained decoding is not available for a filtered "
                       "head with null_tokens = true$"):
        head.decode(local, local, torch.tensor([4]), 0.0, options)


def test_a_pipeline_with_null_tokens_learns_saves_and_loads(tmp_path):
    import spacy

    try:
        from .conftest import gold_set, make_examples, model_config, predicted_set, train_pipeline
    except ImportError:  # pragma: no cover - tests run as a plain directory
        from conftest import gold_set, make_examples, model_config, predicted_set, train_pipeline
    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner", config={"model": model_config(null_tokens=True)})
    examples = make_examples(nlp)
    losses = train_pipeline(nlp, examples, n_iter=60)
    assert ner.torch_head.null_tokens and losses[-1] < losses[0] / 5
    texts = [eg.reference.text for eg in examples]
    docs = list(nlp.pipe(texts))
    assert predicted_set(docs) == gold_set(nlp)
    for doc in docs:
        scores = doc.spans[ner.spans_key].attrs["scores"]
        assert len(scores) == len(doc.ents) and all(0 < s <= 1 for s in scores)
    nlp.to_disk(tmp_path / "p")
    loaded = spacy.load(tmp_path / "p")
    assert loaded.get_pipe("fsemicrf_ner").torch_head.null_tokens
    assert predicted_set(loaded.pipe(texts)) == predicted_set(docs)


def test_a_pipeline_with_null_tokens_refuses_constraints_up_front(caplog):
    """The head has no constrained decoding: constraints in the config, on the component or
    for a call fail when given, not at each prediction, and a document's own are left out
    with a warning instead of stopping the pipe."""
    import logging

    import spacy

    from spacy_fsemicrf.doc_constraints import USER_DATA_KEY
    try:
        from .conftest import make_examples, model_config
    except ImportError:  # pragma: no cover - tests run as a plain directory
        from conftest import make_examples, model_config
    rule = [{"kind": "at_most", "label": "ORG", "n": 0}]
    message = "constraints need constrained decoding, which the filtered head with null_tokens"
    with pytest.raises(ValueError, match=message):
        spacy.blank("en").add_pipe("fsemicrf_ner", config={
            "model": model_config(null_tokens=True), "constraints": rule})
    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner", config={"model": model_config(null_tokens=True)})
    nlp.initialize(lambda: make_examples(nlp))
    with pytest.raises(ValueError, match=message):
        ner.constraints = rule
    with pytest.raises(ValueError, match=message):
        list(nlp.pipe(["Apple is in London ."],
                      component_cfg={"fsemicrf_ner": {"constraints": rule}}))
    docs = [nlp.make_doc("Apple is in London ."), nlp.make_doc("Google is in Paris .")]
    docs[1].user_data[USER_DATA_KEY] = rule
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        docs = list(nlp.pipe(docs))
    assert all(ner.spans_key in doc.spans for doc in docs)
    left_out = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert left_out == [f"fsemicrf_ner: the constraints in doc.user_data[{USER_DATA_KEY!r}] are "
                        "left out: the filtered head with null_tokens = true has no constrained "
                        "decoding"]


def test_training_nodes_at_a_margin_are_the_inference_nodes_at_that_margin_plus_gold():
    gen = torch.Generator().manual_seed(11)
    local = torch.randn((2, 9, 3, 4), generator=gen)
    lengths = torch.tensor([9, 6])
    from spacy_fsemicrf.structured.spans import gold_label_grid
    grid = gold_label_grid(torch.tensor([[0, 2, 3, 1], [1, 0, 0, 2]]), lengths, 9, 3)
    for margin in (0.0, 1.0, 3.0):
        mask, labels = filtered.training_nodes(local, lengths, grid, overlapping_only=False,
                                               margin=margin)
        pred, pred_labels = filtered.inference_nodes(local, lengths, margin)
        assert torch.equal(mask, pred | (grid > 0))
        assert torch.equal(labels, torch.where(grid > 0, grid, pred_labels) * mask)
    loose, _ = filtered.training_nodes(local, lengths, grid, overlapping_only=False, margin=3.0)
    tight, _ = filtered.training_nodes(local, lengths, grid, overlapping_only=False)
    assert int(loose.sum()) > int(tight.sum())


def test_the_head_trains_on_the_nodes_of_its_training_margin():
    gen = torch.Generator().manual_seed(5)
    B, L, K = 2, 7, 3
    local = torch.randn((B, L, K, 4), generator=gen, dtype=torch.float64)
    glob = torch.randn((B, L, K, 4), generator=gen, dtype=torch.float64)
    lengths = torch.tensor([7, 5])
    gold = torch.tensor([[0, 1, 2, 1], [1, 0, 0, 2]])
    from spacy_fsemicrf.structured.spans import gold_label_grid
    grid = gold_label_grid(gold, lengths, L, K)
    losses = {}
    for margin in (0.0, 2.0):
        head = small_head(train_margin=margin)
        mask, labels = filtered.training_nodes(local, lengths, grid, overlapping_only=False,
                                               margin=margin)
        scores = glob.float().gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        losses[margin] = float(head.loss(local, glob, lengths, gold))
        glob_part = float(head._null_tokens_loss(scores, mask, labels, glob, grid))
        local_part = float(small_head(train_margin=0.0).loss(local, glob, lengths, gold)) - (
            float(head._null_tokens_loss(*_nodes_at(local, glob, lengths, grid, 0.0), glob, grid)))
        assert losses[margin] == pytest.approx(local_part + glob_part, rel=1e-6)
    assert losses[2.0] != pytest.approx(losses[0.0])


def _nodes_at(local, glob, lengths, grid, margin):
    mask, labels = filtered.training_nodes(local, lengths, grid, overlapping_only=False, margin=margin)
    return glob.float().gather(-1, labels.unsqueeze(-1)).squeeze(-1), mask, labels
