"""Growing a trained head by new entity labels (the heads' ``add_labels``)."""
import re

import pytest
import torch

from spacy_fsemicrf.structured.growth import (
    UNTRAINED_BIAS, grow_linear, grow_parameter, label_positions, labels_to_wake, placed,
    untrained, wake_channels, wake_outputs,
)
from spacy_fsemicrf.structured.heads import FilteredSemiCRFHead, LinearCRFHead, SemiCRFHead
from spacy_fsemicrf.structured.prediction import DecodeOptions

D, M, K = 8, 3, 3

HEAD_SETTINGS = [
    (FilteredSemiCRFHead, {"transitions": True}),
    (FilteredSemiCRFHead, {"mean_field": 2, "doc_vector": True}),
    (SemiCRFHead, {"transitions": True}),
    (LinearCRFHead, {"scheme": "BIO"}),
    (LinearCRFHead, {"scheme": "BILUO"}),
]


def _head(cls, settings, seed: int):
    """A head with random weights, transitions and compatibilities included (all zero at
    construction, where a misplaced entry would go unseen)."""
    torch.manual_seed(seed)
    head = cls(D, M, max_width=K, hidden_width=12, dropout=0.0, **settings).eval()
    with torch.no_grad():
        for param in head.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    return head


def _scores(head, X, lengths):
    """Each label channel of the head's scores, the last axis label by label."""
    with torch.no_grad():
        if isinstance(head, LinearCRFHead):
            return [head.emissions(X, lengths)]
        found = head.span_scores(X, lengths)
    return list(found) if isinstance(found, tuple) else [found]


def _output_layer(head):
    return head.emitter[-1] if isinstance(head, LinearCRFHead) else head.scorer.output


def _silence_new_labels(head, n_old_outputs_per_block: int, blocks: int) -> None:
    """Make the new labels' outputs score far below everything (bias -1e4): the grown head
    must then decide as the head before it."""
    output = _output_layer(head)
    grown = output.out_features // blocks
    with torch.no_grad():
        for block in range(blocks):
            output.bias[block * grown + n_old_outputs_per_block: (block + 1) * grown] = -1e4


def test_placed_puts_each_entry_at_its_index():
    old = torch.arange(12.0).view(3, 4)
    new = placed(old, [0, 3, 4], 6)
    assert new.shape == (6, 4)
    assert torch.equal(new[[0, 3, 4]], old) and not new[[1, 2, 5]].any()
    square = torch.arange(9.0).view(3, 3)
    new = placed(square, [0, 1, 4], 5, dims=2)
    idx = torch.tensor([0, 1, 4])
    assert torch.equal(new[idx][:, idx], square)
    assert new.sum() == square.sum()  # zero elsewhere
    with pytest.raises(ValueError):
        placed(old, [0, 0, 1], 6)
    with pytest.raises(ValueError):
        placed(old, [0, 1, 6], 6)
    with pytest.raises(ValueError):  # (torch would count it from the end)
        placed(old, [-1, 0, 1], 6)
    with pytest.raises(ValueError):  # one position for each entry
        placed(old, [0, 1], 6)
    with pytest.raises(ValueError):
        placed(square, [0, 1, 4], 5, dims=3)


def test_grow_linear_puts_the_new_biases_in_order_and_counts_them():
    layer = torch.nn.Linear(2, 3)
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    grow_linear(layer, [0, 2, 4], 6, torch.tensor([7.0, 8.0, 9.0]))
    assert layer.out_features == 6 and layer(torch.zeros(1, 2)).shape == (1, 6)
    assert torch.equal(layer.bias.detach()[[0, 2, 4]], bias)
    assert torch.equal(layer.bias.detach()[[1, 3, 5]], torch.tensor([7.0, 8.0, 9.0]))
    assert torch.equal(layer.weight.detach()[[0, 2, 4]], weight)
    assert not layer.weight.detach()[[1, 3, 5]].any()
    with pytest.raises(ValueError, match="new_bias must give 2 values"):
        grow_linear(torch.nn.Linear(2, 3), [0, 1, 2], 5, torch.tensor([1.0]))


def test_grow_parameter_keeps_a_frozen_parameter_frozen():
    module = torch.nn.Module()
    module.table = torch.nn.Parameter(torch.ones(2, 2), requires_grad=False)
    grow_parameter(module, "table", [0, 1], 3, dims=2)
    assert module.table.shape == (3, 3) and not module.table.requires_grad


@pytest.mark.parametrize("cls,settings", HEAD_SETTINGS)
def test_growth_keeps_the_gradient_accumulated_before(cls, settings):
    """spacy train's accumulate_gradient: the gradient of the updates before the one that
    meets a new label still counts in the step after them."""
    head = _head(cls, settings, 0).train()
    X, lengths = torch.randn(2, 6, D), torch.tensor([6, 5])
    head(X, lengths, torch.tensor([[0, 1, 2, 1], [1, 0, 0, 2]])).backward()
    grads = {name: param.grad.clone() for name, param in head.named_parameters()}
    head.add_labels(2)
    for name, param in head.named_parameters():
        assert param.grad is not None and param.grad.shape == param.shape, name
        assert torch.allclose(param.grad.sum(), grads[name].sum(), atol=1e-5), name
        assert torch.allclose(param.grad.abs().sum(), grads[name].abs().sum()), name


def test_label_positions_keep_start_and_end_last():
    assert label_positions(4, 2) == [0, 1, 2, 3]
    assert label_positions(5, 2, 1) == [0, 1, 2, 3, 6]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("cls,settings", HEAD_SETTINGS)
def test_grown_head_keeps_the_scores_of_its_labels(cls, settings, seed):
    head = _head(cls, settings, seed)
    X, lengths = torch.randn(3, 7, D), torch.tensor([7, 4, 1])
    before = _scores(head, X, lengths)
    head.add_labels(2)
    assert head.n_labels == M + 2
    after = _scores(head, X, lengths)
    for old, new in zip(before, after):
        width = old.shape[-1]
        assert new.shape[-1] > width
        mask = torch.isfinite(old)
        assert torch.allclose(new[..., :width][mask], old[mask], atol=1e-6)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("cls,settings", HEAD_SETTINGS)
def test_grown_head_whose_new_labels_never_score_decodes_as_before(cls, settings, seed):
    """Every weight of the old labels moved to the right place, transitions to and from
    START and END included: with the new labels out of reach the decoding is the same."""
    head = _head(cls, settings, seed)
    X, lengths = torch.randn(4, 9, D), torch.tensor([9, 6, 2, 1])
    options = DecodeOptions(path=True, candidates=True)
    with torch.no_grad():
        before = head(X, lengths, options=options)
    if isinstance(head, LinearCRFHead):
        old_tags = head.scheme.n_tags
        head.add_labels(2)
        _silence_new_labels(head, old_tags, 1)
    else:
        head.add_labels(2)
        blocks = 2 if isinstance(head, FilteredSemiCRFHead) else 1
        _silence_new_labels(head, M + 1, blocks)
        if isinstance(head, FilteredSemiCRFHead) and head.refiner is None:
            # without mean-field layers the global block of a label no node has is never read
            with torch.no_grad():
                head.scorer.output.bias[-2:] = 0.0
    with torch.no_grad():
        after = head(X, lengths, options=options)
    assert torch.equal(after.spans, before.spans)
    assert torch.allclose(after.scores, before.scores, atol=1e-5)
    assert torch.allclose(after.path, before.path, atol=1e-5)
    assert torch.equal(after.candidates[0], before.candidates[0])


@pytest.mark.parametrize("cls,settings", HEAD_SETTINGS)
def test_grown_head_learns_a_new_label(cls, settings):
    """Gold spans of a new label train the grown head until it decodes them."""
    head = _head(cls, settings, 0)
    head.add_labels(1)
    new_label = M + 1
    torch.manual_seed(1)
    X, lengths = torch.randn(2, 6, D), torch.tensor([6, 5])
    gold = torch.tensor([[0, 1, 2, new_label], [0, 4, 4, 1], [1, 0, 0, new_label]])
    optimizer = torch.optim.Adam(head.parameters(), lr=0.05)
    head.train()
    for _ in range(150):
        optimizer.zero_grad()
        loss = head(X, lengths, gold)
        loss.backward()
        optimizer.step()
    head.eval()
    with torch.no_grad():
        spans, _ = head(X, lengths)
    assert {tuple(row) for row in spans.tolist()} == {tuple(row) for row in gold.tolist()}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("cls,settings", HEAD_SETTINGS)
def test_grown_head_predicts_as_before_until_it_trains_on_a_new_label(cls, settings, seed):
    """As spaCy's ner: a label added to a trained head is not predicted before training meets
    it (it took spans of the old labels: a quarter of a semi-CRF's entities on CoNLL), and the
    old labels keep their confidences, mean-field beliefs included."""
    head = _head(cls, settings, seed)
    X, lengths = torch.randn(4, 9, D), torch.tensor([9, 6, 2, 1])
    options = DecodeOptions(path=True, candidates=True)
    with torch.no_grad():
        before = head(X, lengths, options=options)
        best = head.nbest(X, lengths, 3)
    head.add_labels(2)
    with torch.no_grad():
        after = head(X, lengths, options=options)
        grown_best = head.nbest(X, lengths, 3)
    assert torch.equal(after.spans, before.spans)
    assert torch.allclose(after.scores, before.scores, atol=1e-5)
    assert torch.allclose(after.path, before.path, atol=1e-5)
    assert torch.equal(after.candidates[0], before.candidates[0])
    assert torch.allclose(after.candidates[1], before.candidates[1], atol=1e-5)
    assert [[s.spans for s in d] for d in grown_best] == [[s.spans for s in d] for d in best]


def _label_biases(head, label: int):
    """The biases of ``label``'s outputs: its local and global ones, its segment's, its tags'."""
    bias = _output_layer(head).bias.detach()
    if isinstance(head, LinearCRFHead):
        return bias[head.scheme.labels[: bias.shape[0]] == label]
    if isinstance(head, FilteredSemiCRFHead):
        return bias[[label, head.n_labels + 1 + label]]
    return bias[[label]]


def _lowest_trained_biases(head, n_trained: int):
    """The lowest bias of the trained labels' outputs, in each block of the output layer."""
    bias = _output_layer(head).bias.detach()
    if isinstance(head, LinearCRFHead):
        return bias[1: head.scheme.labels.tolist().index(n_trained + 1)].min().expand(1)
    if isinstance(head, FilteredSemiCRFHead):
        C = head.n_labels + 1
        return torch.stack([bias[1: n_trained + 1].min(), bias[C + 1: C + n_trained + 1].min()])
    return bias[1: n_trained + 1].min().expand(1)


@pytest.mark.parametrize("cls,settings", HEAD_SETTINGS)
def test_training_on_a_new_label_starts_it_at_the_lowest_bias_of_the_trained(cls, settings):
    head = _head(cls, settings, 0)
    with torch.no_grad():  # the lowest of all: the null outputs are no label's to start from
        _output_layer(head).bias[[0, M + 1] if cls is FilteredSemiCRFHead else [0]] = -50.0
    head.add_labels(2)
    lowest = _lowest_trained_biases(head, M)
    trained = [_label_biases(head, label) for label in range(M + 1)]
    assert (_label_biases(head, M + 1) == UNTRAINED_BIAS).all()
    X, lengths = torch.randn(2, 6, D), torch.tensor([6, 5])
    gold = torch.tensor([[0, 1, 2, M + 1], [0, 4, 4, 1], [1, 0, 0, 2]])
    head(X, lengths, gold)  # a loss in eval mode (no training) leaves the new label untrained
    assert (_label_biases(head, M + 1) == UNTRAINED_BIAS).all() and head.label_wakes == 0
    head.train()
    head(X, lengths, gold)
    new = _label_biases(head, M + 1)
    assert torch.equal(new, lowest.repeat_interleave(new.numel() // lowest.numel()))
    assert head.label_wakes == new.numel()  # each output woken counted once
    head(X, lengths, gold)
    assert head.label_wakes == new.numel()
    assert (_label_biases(head, M + 2) == UNTRAINED_BIAS).all()  # not in the gold: untrained
    for label in range(M + 1):  # the trained labels' biases stay, those in the gold too
        assert torch.equal(_label_biases(head, label), trained[label])


@pytest.mark.parametrize("cls,settings", HEAD_SETTINGS)
def test_a_new_label_whose_bias_weight_decay_moved_still_starts_training(cls, settings):
    """Training steps before the gold has the new label shrink its bias (weight decay): it is
    still the bias of a label not trained yet."""
    head = _head(cls, settings, 0)
    head.add_labels(1)
    lowest = _lowest_trained_biases(head, M)
    with torch.no_grad():
        _output_layer(head).bias.mul_(1 - 1e-3)
    head.train()
    head(torch.randn(1, 4, D), torch.tensor([4]), torch.tensor([[0, 1, 1, M + 1]]))
    new = _label_biases(head, M + 1)
    assert torch.allclose(new, lowest.repeat_interleave(new.numel() // lowest.numel()) * (1 - 1e-3))


def test_linear_crf_growth_adds_the_new_labels_tags_after_the_old_ones():
    head = _head(LinearCRFHead, {"scheme": "BILUO"}, 0)
    names, transitions = head.scheme.names, head.transitions.detach().clone()
    head.add_labels(1)
    assert head.scheme.names[: len(names)] == names
    assert head.scheme.names[len(names):] == ("B-4", "I-4", "L-4", "U-4")
    assert torch.equal(head.allowed, head.scheme.allowed)
    index = torch.tensor(label_positions(len(names) + 1, 4, 1))
    assert torch.equal(head.transitions.detach()[index][:, index], transitions)


@pytest.mark.parametrize("n", [0, -1, 1.5, True, "2"])
def test_add_labels_refuses_what_is_no_positive_count(n):
    head = FilteredSemiCRFHead(D, M, max_width=K, hidden_width=12)
    with pytest.raises(ValueError, match="n must be"):
        head.add_labels(n)
    assert head.n_labels == M


def test_placed_refuses_an_index_that_does_not_put_each_entry_once_inside_the_size():
    old = torch.arange(6.0).view(3, 2)
    with pytest.raises(ValueError, match=r"^index must give 3 distinct positions, got \[0, 0, 1\]$"):
        placed(old, [0, 0, 1], 4)
    for index in ([0, 1, 4], [-1, 1, 2]):
        with pytest.raises(ValueError, match=re.escape(f"index must lie in [0, 4), got {index}")):
            placed(old, index, 4)
    with pytest.raises(ValueError, match=r"^dims must be 1 or 2, got 3$"):
        placed(old, [0, 1, 2], 4, dims=3)
    # nothing to place (a head without labels of that kind): zeros of the new size
    assert placed(torch.zeros((0, 2)), [], 1).tolist() == [[0.0, 0.0]]


def test_label_positions_keep_the_last_channels_in_order_after_the_new_ones():
    assert label_positions(5, 2, 2) == [0, 1, 2, 5, 6]
    assert label_positions(4, 3) == [0, 1, 2, 3]


def test_an_output_is_untrained_from_half_the_untrained_bias_down():
    bias = torch.tensor([UNTRAINED_BIAS, UNTRAINED_BIAS / 2, 0.4 * UNTRAINED_BIAS, 0.0])
    assert untrained(bias).tolist() == [True, True, False, False]


def test_the_labels_to_wake_are_the_gold_labels_while_an_output_is_untrained():
    layer = torch.nn.Linear(2, 4)
    gold = torch.tensor([[0, 0, 0, 1], [0, 2, 3, 3], [1, 0, 0, 1]])
    assert labels_to_wake(layer, gold, 3) == []  # every output trained: gold is not read
    with torch.no_grad():
        layer.bias[3] = UNTRAINED_BIAS
    assert labels_to_wake(layer, gold, 3) == [1, 3]
    assert labels_to_wake(layer, gold[:, :3], 3) == []  # not (doc, start, end, label) rows
    assert labels_to_wake(layer, torch.zeros((0,), dtype=torch.long), 3) == []


def test_waking_gives_each_asleep_output_the_lowest_trained_bias_of_its_block():
    U = UNTRAINED_BIAS
    layer = torch.nn.Linear(2, 6)
    with torch.no_grad():
        layer.bias.copy_(torch.tensor([5.0, -2.0, U, 7.0, 1.0, U]))
    assert wake_outputs(layer, range(1, 3), []) == 0  # nothing to wake
    assert wake_channels(layer, 3, [2], blocks=2) == 2  # one per block, from its own labels
    assert layer.bias.tolist() == [5.0, -2.0, -2.0, 7.0, 1.0, 1.0]
    assert wake_channels(layer, 3, [2], blocks=2) == 0  # awake already: nothing changes
    lone = torch.nn.Linear(2, 3)  # no trained entity output: the bias starts at 0
    with torch.no_grad():
        lone.bias.copy_(torch.tensor([3.0, U, U]))
    assert wake_outputs(lone, range(1, 3), [1]) == 1
    assert lone.bias.tolist() == [3.0, 0.0, U]


def test_grow_linear_gives_new_outputs_zero_weights_and_a_zero_bias_by_default():
    torch.manual_seed(0)
    layer = torch.nn.Linear(2, 2)
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    grow_linear(layer, [0, 2], 3)
    assert layer.out_features == 3 and layer.weight.shape == (3, 2)
    assert torch.equal(layer.weight[[0, 2]], weight) and torch.equal(layer.bias[[0, 2]], bias)
    assert layer.weight[1].tolist() == [0.0, 0.0] and layer.bias[1].item() == 0.0
