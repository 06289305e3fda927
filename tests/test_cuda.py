"""The filtered semi-CRF and the three heads on a CUDA device give the CPU's results.

Skipped without a CUDA device (CI has none); run on a GPU machine with
``python -m pytest tests/test_cuda.py``.
"""
import pytest
import torch

from spacy_fsemicrf.structured.filtered import (
    filtered_decode,
    filtered_log_partition,
    filtered_viterbi,
)
from spacy_fsemicrf.structured.heads import HEADS

from .test_filtered import random_nodes

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("with_transitions", [False, True])
@pytest.mark.parametrize("density", [0.05, 0.4])  # mostly enumerated / mostly scanned clusters
def test_filtered_on_cuda_matches_cpu(with_transitions, density):
    lengths, mask, scores, labels, transitions = random_nodes(5, 8, 60, 5, 4, density)
    T = transitions if with_transitions else None
    cuda = lambda x: None if x is None else x.cuda()  # noqa: E731
    results = []
    for move in (lambda x: x, cuda):
        s = move(scores).clone().requires_grad_()
        log_z = filtered_log_partition(s, move(mask), move(labels), move(T))
        log_z.sum().backward()
        chosen, best = filtered_viterbi(move(scores), move(mask), move(labels), move(T))
        _, marginals = filtered_decode(move(scores), move(mask), move(labels), move(T))
        results.append([x.cpu() for x in (log_z.detach(), s.grad, chosen, best, marginals)])
    cpu, gpu = results
    assert torch.equal(cpu[2], gpu[2])
    for a, b in zip(cpu[:2] + cpu[3:], gpu[:2] + gpu[3:]):
        assert torch.allclose(a, b, atol=1e-8)


@pytest.mark.parametrize("density", [0.02, 0.4])  # no two nodes overlap / most do
def test_decode_node_set_on_cuda_matches_cpu(density):
    """The decode of a node set, with the solve and without it (no overlaps, no transitions),
    gives the CPU's results on the nodes' device."""
    from spacy_fsemicrf.structured.compaction import disjoint
    from spacy_fsemicrf.structured.filtered import NodeSet, decode_node_set

    lengths, mask, scores, labels, transitions = random_nodes(3, 4, 40, 1 if density < 0.1 else 4,
                                                              4, density)
    index = mask.view(-1).nonzero().squeeze(1)
    nodes = NodeSet(index, labels.view(-1)[index], scores.view(-1)[index].float(), mask.shape)
    assert disjoint(index, tuple(mask.shape)) == (density < 0.1)
    on_cuda = NodeSet(*(x.cuda() for x in nodes[:3]), nodes.shape)
    for T in (None, transitions.float()):
        best, marginals = decode_node_set(nodes, T)
        best_gpu, marginals_gpu = decode_node_set(on_cuda, None if T is None else T.cuda())
        assert best_gpu.device.type == marginals_gpu.device.type == "cuda"
        assert torch.equal(best, best_gpu.cpu())
        assert torch.allclose(marginals, marginals_gpu.cpu(), atol=1e-6)


def test_head_shim_device_follows_the_head_to_the_gpu():
    """The shim's cached place of the head's first parameter gives the device after a move."""
    from spacy_fsemicrf.head_model import build_head, make_head_model, torch_head

    model = make_head_model("FilteredSemiCRF", {"max_width": 3}, mixed_precision=False,
                            grad_scaler=None)
    build_head(model, 8, 2)
    shim = model.shims[0]
    assert shim.device.type == "cpu"
    torch_head(model).cuda()
    assert shim.device.type == "cuda"
    torch_head(model).cpu()
    assert shim.device.type == "cpu"


@pytest.mark.parametrize("name", sorted(HEADS))
@pytest.mark.parametrize("word_pool", [False, True])
def test_heads_on_cuda_match_cpu(name, word_pool):
    """Also with same-word pooling on a padded batch whose words repeat, where the token
    positions of the pooling's gather and scatter must reach the device."""
    torch.manual_seed(0)
    head = HEADS[name](8, 3, max_width=4, hidden_width=16, word_pool=word_pool).eval()
    X, lengths = torch.randn(3, 20, 8), torch.tensor([20, 7, 0])
    gold = torch.tensor([[0, 1, 2, 1], [0, 5, 5, 3], [1, 0, 3, 2]])
    words = torch.randint(0, 6, (3, 20)) if word_pool else None
    if name == "FilteredSemiCRF":  # let the local classifier keep spans, so that there is a graph
        with torch.no_grad():
            head.scorer.output.bias[:4] = torch.tensor([0.0, 0.3, 0.3, 0.3])
    loss_cpu = head(X, lengths, gold, words=words)
    spans_cpu, conf_cpu = head(X, lengths, words=words)
    head_gpu = head.cuda()
    words_gpu = None if words is None else words.cuda()
    loss_gpu = head_gpu(X.cuda(), lengths.cuda(), gold.cuda(), words=words_gpu)
    spans_gpu, conf_gpu = head_gpu(X.cuda(), lengths.cuda(), words=words_gpu)
    assert loss_gpu.device.type == "cuda"
    assert torch.allclose(loss_cpu, loss_gpu.cpu(), rtol=1e-4, atol=1e-4)
    loss_gpu.backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in head_gpu.parameters())
    assert torch.equal(spans_cpu, spans_gpu.cpu())
    assert torch.allclose(conf_cpu, conf_gpu.cpu(), atol=1e-4)
    if word_pool:  # a batch without padding takes the pooling's other path
        one_cpu = head.cpu()(X[:1], lengths[:1], words=words[:1])
        one_gpu = head.cuda()(X[:1].cuda(), lengths[:1].cuda(), words=words[:1].cuda())
        assert torch.equal(one_cpu[0], one_gpu[0].cpu())
        assert torch.allclose(one_cpu[1], one_gpu[1].cpu(), atol=1e-4)


def _head_and_batch(name: str):
    """``(head, X, lengths)``: a small head of ``name`` on the CPU, in eval mode, and a batch of
    three documents (one padded, one empty); the filtered head's local classifier keeps spans,
    so that there is a graph."""
    torch.manual_seed(0)
    head = HEADS[name](8, 3, max_width=4, hidden_width=16).eval()
    if name == "FilteredSemiCRF":
        with torch.no_grad():
            head.scorer.output.bias[:4] = torch.tensor([0.0, 0.3, 0.3, 0.3])
    return head, torch.randn(3, 20, 8), torch.tensor([20, 7, 0])


@pytest.mark.parametrize("name", sorted(HEADS))
def test_constrained_decode_and_nbest_on_cuda_match_cpu(name):
    """Constraints and n-best take the head's scores to the host: a head on the GPU gives the
    CPU's entities, path probabilities, constraint reports and k best segmentations."""
    from spacy_fsemicrf.structured.constraints import (
        AtMost,
        DocConstraints,
        ForbidLabels,
        ForceSpan,
        compile_constraints,
    )
    from spacy_fsemicrf.structured.prediction import DecodeOptions

    head, X, lengths = _head_and_batch(name)
    labels = ["A", "B", "C"]
    docs = [DocConstraints(compile_constraints([AtMost("A", 1, "sentence"),
                                                ForbidLabels(["B"], 0, 5)], labels), (10,)),
            DocConstraints(compile_constraints([ForceSpan(2, 5, "C")], labels)),
            None]
    options = DecodeOptions(path=True, constraints=docs)
    with torch.no_grad():
        cpu, nbest_cpu = head(X, lengths, options=options), head.nbest(X, lengths, 3)
        head.cuda()
        X, lengths = X.cuda(), lengths.cuda()
        gpu, nbest_gpu = head(X, lengths, options=options), head.nbest(X, lengths, 3)
    assert torch.equal(cpu.spans, gpu.spans.cpu())
    assert torch.allclose(cpu.scores, gpu.scores.cpu(), atol=1e-4)
    assert torch.allclose(cpu.path, gpu.path.cpu(), atol=1e-4)
    assert [r and (r.status, r.searched, r.states, r.dropped) for r in cpu.reports] == \
        [r and (r.status, r.searched, r.states, r.dropped) for r in gpu.reports]
    assert cpu.reports[0].searched and cpu.reports[1].searched  # the searches ran
    for a, b in zip(cpu.reports[:2], gpu.reports[:2]):
        assert a.score == pytest.approx(b.score, abs=1e-3)
    assert [[s.spans for s in doc] for doc in nbest_cpu] == [[s.spans for s in doc] for doc in nbest_gpu]
    assert [s.log_prob for doc in nbest_cpu for s in doc] == pytest.approx(
        [s.log_prob for doc in nbest_gpu for s in doc], abs=1e-3)


@pytest.mark.parametrize("span_repr", ["sum", "sum_endpoints_neighbors"])
@pytest.mark.parametrize("shape", [(1, 3000), (64, 128)])  # a long document; a large batch
def test_span_sums_under_autocast_stay_float32(span_repr, shape):
    """Under autocast the projections are float16 and their running sum float32: the span sums
    are differences of the running sum, so its terms stay float32 (a float16 copy of a long
    document's running sum is off by units), in training and in the one-pass sums that
    prediction takes on a large batch."""
    from spacy_fsemicrf.structured.spans import SpanFeaturizer

    torch.manual_seed(0)
    featurizer = SpanFeaturizer(16, 128, 4, span_repr).cuda()
    x = (torch.randn(*shape, 16) + 1.0).cuda()
    with torch.no_grad():
        want = featurizer(x)  # float32 throughout
    with torch.autocast("cuda"):
        terms = featurizer.terms(x)
        trained = featurizer(x)
        with torch.inference_mode():
            predicted = featurizer(x)
    assert terms.ends.dtype == terms.starts.dtype == torch.float32
    # float16 rounding of each projected token, not of the running sum (thousands here)
    for out in (trained.detach(), predicted):
        assert (out.float() - want).abs().max() < 0.5


@pytest.mark.parametrize("mixed_precision", [False, True])
def test_component_trains_and_predicts_on_the_gpu(mixed_precision):
    """The spaCy component through Thinc's GPU ops (needs CuPy): the shim puts the head on the
    GPU, the loss falls, and the entities come out as on the CPU."""
    pytest.importorskip("cupy")
    spacy = pytest.importorskip("spacy")
    from thinc.api import get_current_ops, require_gpu, use_ops

    from .conftest import TRAIN_DATA, gold_set, make_examples, model_config, predicted_set, train_pipeline

    require_gpu()
    try:
        nlp = spacy.blank("en")
        nlp.add_pipe("fsemicrf_ner", config={"model": model_config(mixed_precision=mixed_precision)})
        losses = train_pipeline(nlp, make_examples(nlp), n_iter=30)
        assert type(get_current_ops()).__name__ == "CupyOps"
        ner = nlp.get_pipe("fsemicrf_ner")
        assert next(ner.torch_head.parameters()).device.type == "cuda"
        assert losses[-1] < 0.1 * losses[0], losses
        docs = list(nlp.pipe([text for text, _ in TRAIN_DATA]))
        assert predicted_set(docs) == gold_set(nlp)
    finally:
        use_ops("numpy")


@pytest.mark.parametrize("name", sorted(HEADS))
def test_sentence_boundaries_on_cuda_match_cpu(name):
    """The sentence starts reach the head's device (given on the host or on the device): the
    CPU's entities, confidences, path probabilities, candidates and n-best, none crossing."""
    from spacy_fsemicrf.structured.prediction import DecodeOptions
    from spacy_fsemicrf.structured.spans import crossing_spans

    head, X, lengths = _head_and_batch(name)
    starts = torch.zeros((3, 20), dtype=torch.bool)
    starts[0, [0, 3, 9, 10, 15]] = starts[1, [0, 2, 5]] = True
    options = DecodeOptions(path=True, candidates=True)
    kwargs = {"filter_margin": 1.0} if name == "FilteredSemiCRF" else {}
    with torch.no_grad():
        cpu = head(X, lengths, options=options, sentence_starts=starts, **kwargs)
        nbest_cpu = head.nbest(X, lengths, 3, sentence_starts=starts, **kwargs)
        head.cuda()
        X, lengths = X.cuda(), lengths.cuda()
        for given in (starts, starts.cuda()):
            gpu = head(X, lengths, options=options, sentence_starts=given, **kwargs)
            nbest_gpu = head.nbest(X, lengths, 3, sentence_starts=given, **kwargs)
            assert torch.equal(cpu.spans, gpu.spans.cpu())
            assert torch.allclose(cpu.scores, gpu.scores.cpu(), atol=1e-4)
            assert torch.allclose(cpu.path, gpu.path.cpu(), atol=1e-4)
            assert torch.equal(cpu.candidates[0], gpu.candidates[0].cpu())
            assert [[s.spans for s in doc] for doc in nbest_cpu] == [
                [s.spans for s in doc] for doc in nbest_gpu]
    crossing = crossing_spans(starts, 20)
    for doc, start, end, _ in cpu.spans.tolist() + cpu.candidates[0].tolist():
        assert not crossing[doc, start, end - start]


def _partial_head(name, settings):
    """A small head on the CPU, seeded; a filtered one keeps spans, so that there is a graph."""
    torch.manual_seed(0)
    head = HEADS[name](8, 3, max_width=4, hidden_width=16, dropout=0.0, **settings)
    if name == "FilteredSemiCRF":
        with torch.no_grad():
            head.scorer.output.bias[:4] = torch.tensor([0.0, 0.3, 0.3, 0.3])
    return head


@pytest.mark.parametrize("name, settings", [("FilteredSemiCRF", {}),
                                            ("FilteredSemiCRF", {"null_tokens": True}),
                                            ("SemiCRF", {}), ("LinearCRF", {})])
def test_partial_annotation_on_cuda_matches_cpu(name, settings):
    """The known flags reach the head's device (given on the host or on the device): the loss
    of a partly annotated batch and its gradient as on the CPU."""
    head = _partial_head(name, settings)
    X, lengths = torch.randn(3, 20, 8), torch.tensor([20, 7, 0])
    gold = torch.tensor([[0, 1, 2, 1], [0, 5, 5, 3], [1, 0, 3, 2]])
    known = torch.ones((3, 20), dtype=torch.bool)
    known[0, 8:16] = known[1, 4:7] = False
    X_cpu = X.clone().requires_grad_()
    loss_cpu = head(X_cpu, lengths, gold, known=known)
    loss_cpu.backward()
    head.cuda()
    for given in (known, known.cuda()):
        X_gpu = X.cuda().requires_grad_()
        loss_gpu = head(X_gpu, lengths.cuda(), gold.cuda(), known=given)
        loss_gpu.backward()
        assert loss_gpu.device.type == "cuda"
        assert torch.allclose(loss_cpu, loss_gpu.cpu(), rtol=1e-4, atol=1e-4)
        assert torch.allclose(X_cpu.grad, X_gpu.grad.cpu(), atol=1e-4)


@pytest.mark.parametrize("name, settings", [("FilteredSemiCRF", {}),
                                            ("FilteredSemiCRF", {"null_tokens": True}),
                                            ("FilteredSemiCRF", {"exact_loss": 0.5}),
                                            ("SemiCRF", {})])
def test_incorrect_spans_on_cuda_match_cpu(name, settings):
    """Entities known to be wrong (given on the host or on the device) on unknown tokens: the
    loss and its gradient as on the CPU."""
    head = _partial_head(name, settings)
    X, lengths = torch.randn(3, 20, 8), torch.tensor([20, 7, 0])
    gold = torch.tensor([[0, 1, 2, 1], [0, 5, 5, 3]])
    known = torch.ones((3, 20), dtype=torch.bool)
    known[0, 8:16] = known[1, :] = False
    incorrect = torch.tensor([[0, 8, 9, 1], [0, 10, 10, 2], [0, 10, 10, 3], [1, 0, 3, 2]])
    X_cpu = X.clone().requires_grad_()
    loss_cpu = head(X_cpu, lengths, gold, known=known, incorrect=incorrect)
    loss_cpu.backward()
    head.cuda()
    for rows in (incorrect, incorrect.cuda()):
        X_gpu = X.cuda().requires_grad_()
        loss_gpu = head(X_gpu, lengths.cuda(), gold.cuda(), known=known.cuda(), incorrect=rows)
        loss_gpu.backward()
        assert loss_gpu.device.type == "cuda"
        assert torch.allclose(loss_cpu, loss_gpu.cpu(), rtol=1e-4, atol=1e-4)
        assert torch.allclose(X_cpu.grad, X_gpu.grad.cpu(), atol=1e-4)


@pytest.mark.parametrize("name, settings", [("FilteredSemiCRF", {"transitions": True}),
                                            ("SemiCRF", {}), ("LinearCRF", {})])
def test_growing_a_head_on_cuda_matches_cpu(name, settings):
    """A head grown on the device: its new weights stay there, it decodes as the CPU's grown
    head, and a training step with a gold entity of the new label wakes it as on the CPU."""
    torch.manual_seed(0)
    cpu = HEADS[name](8, 3, max_width=3, hidden_width=16, dropout=0.0, **settings)
    gpu = HEADS[name](8, 3, max_width=3, hidden_width=16, dropout=0.0, **settings)
    gpu.load_state_dict(cpu.state_dict())
    gpu.cuda()
    for head in (cpu, gpu):
        head.add_labels(2)
    assert all(p.device.type == "cuda" for p in gpu.parameters())
    X, lengths = torch.randn(2, 9, 8), torch.tensor([9, 5])
    gold = torch.tensor([[0, 1, 2, 4], [1, 0, 0, 1]])
    for head in (cpu, gpu):
        head.eval()
    with torch.no_grad():
        spans, scores = cpu(X, lengths)
        spans_gpu, scores_gpu = gpu(X.cuda(), lengths.cuda())
    assert torch.equal(spans, spans_gpu.cpu())
    assert torch.allclose(scores, scores_gpu.cpu(), atol=1e-5)
    for head in (cpu, gpu):
        head.train()
    loss = cpu(X, lengths, gold)
    loss_gpu = gpu(X.cuda(), lengths.cuda(), gold.cuda())
    assert torch.allclose(loss, loss_gpu.cpu(), rtol=1e-4, atol=1e-4)
    for a, b in zip(cpu.state_dict().values(), gpu.state_dict().values()):
        assert torch.allclose(a, b.cpu(), atol=1e-6)
