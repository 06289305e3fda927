"""Entity confidences, their calibration, the path probability and the candidates.

The heads' raw confidences, candidates and path probabilities are checked against brute-force
enumeration on tiny random inputs; the calibration map against synthetic data with a known
map; the pipeline settings (threshold, candidates_key, the stored map) through config,
to_disk and spacy.load; the training callback on a tiny corpus.
"""
import functools
import importlib.util
import logging
import math
import re
import warnings
from collections import Counter
from pathlib import Path
from typing import Dict, List, Tuple

import numpy
import pytest
import spacy
import srsly
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from spacy.cli.train import train
from spacy.scorer import get_ner_prf
from spacy.tokens import Doc, DocBin, Span
from spacy.training import Corpus, Example

from spacy_fsemicrf import calibration
from spacy_fsemicrf.calibration import (
    FEW_ENTITIES,
    MIN_GROUP,
    apply_calibration,
    calibrate_component,
    check_calibration,
    entity_key,
    fit_by_novelty,
    fit_calibration,
    fit_isotonic,
    fit_platt,
    make_calibrate_callback,
    raw_outcomes,
    seen_flags,
    unannotated,
)
from spacy_fsemicrf.structured import heads
from spacy_fsemicrf.structured.confidences import CANDIDATE_FLOOR, span_candidates
from spacy_fsemicrf.structured.prediction import DecodeOptions, path_probability
from spacy_fsemicrf.structured.heads import FilteredSemiCRFHead, LinearCRFHead, SemiCRFHead

try:  # tests/ as a package (tests/__init__.py) or as a plain directory
    from . import bruteforce as bf
    from .conftest import TRAIN_DATA, make_examples, model_config, train_pipeline, write_corpus
    from .test_train import CONFIGS, _overrides
except ImportError:  # pragma: no cover
    import bruteforce as bf
    from conftest import TRAIN_DATA, make_examples, model_config, train_pipeline, write_corpus
    from test_train import CONFIGS, _overrides

Row = Tuple[int, int, int, int]
ALL_EXTRAS = DecodeOptions(path=True, candidates=True)


def _decoded(head, *inputs) -> Tuple[Dict[Row, float], Dict[Row, float], Dict[int, float]]:
    """``head``'s prediction with every extra: entities, candidates (both ``{row: value}``)
    and path probabilities ``{doc: p}``."""
    with torch.no_grad():
        if isinstance(head, FilteredSemiCRFHead):
            out = head.decode(*inputs, options=ALL_EXTRAS)
        else:
            out = head(*inputs, options=ALL_EXTRAS)
    ents = {tuple(r): float(v) for r, v in zip(out.spans.tolist(), out.scores.tolist())}
    rows, values = out.candidates
    for found in (out.spans, rows):  # both sorted by (doc, start), as Prediction says
        keys = [(doc, start) for doc, start, _, _ in found.tolist()]
        assert keys == sorted(keys)
        assert len({tuple(r) for r in found.tolist()}) == len(found)  # each span once
    cands = {tuple(r): float(v) for r, v in zip(rows.tolist(), values.tolist())}
    return ents, cands, dict(enumerate(out.path.tolist()))


def _assert_close(found: Dict, expected: Dict, tol: float = 2e-4) -> None:
    assert set(found) == set(expected)
    for key, value in expected.items():
        assert found[key] == pytest.approx(value, abs=tol), key


def _path_score(scores, nodes, chosen, transitions) -> float:
    total = sum(scores[nodes[k][0]][nodes[k][1] - nodes[k][0]][nodes[k][2]] for k in chosen)
    if transitions is not None and chosen:
        C = len(transitions) - 1
        labels = [C] + [nodes[k][2] for k in chosen] + [C]
        total += sum(transitions[p][q] for p, q in zip(labels, labels[1:]))
    return total


# ----------------------------------------------------------------------------- the heads


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), with_transitions=st.booleans())
def test_filtered_confidences_paths_and_candidates_match_enumeration(seed, with_transitions):
    gen = torch.Generator().manual_seed(seed)
    B, L, K, M = 2, 6, 3, 2
    C = M + 1
    head = FilteredSemiCRFHead(4, M, max_width=K, transitions=with_transitions)
    if with_transitions:
        head.transitions.data = torch.randn(C + 1, C + 1, generator=gen)
    local = 2 * torch.randn(B, L, K, C, generator=gen)
    glob = 2 * torch.randn(B, L, K, C, generator=gen)
    lengths = torch.tensor([L, int(torch.randint(1, L + 1, (1,), generator=gen))])
    ents, cands, paths = _decoded(head, local, glob, lengths)
    T = head.transitions.tolist() if with_transitions else None
    expected_ents, expected_cands = {}, {}
    for b in range(B):
        n = int(lengths[b])
        nodes = []
        for s in range(n):
            for w in range(min(K, n - s)):
                label = int(local[b, s, w].argmax())
                if label:  # the filter keeps the spans whose local argmax is not null
                    nodes.append((s, s + w, label))
        sets = bf.maximal_nonoverlapping_sets([(s, e) for s, e, _ in nodes])
        scores = [_path_score(glob[b].tolist(), nodes, chosen, T) for chosen in sets]
        log_z = bf._logsumexp(scores)
        best = max(range(len(sets)), key=lambda k: scores[k])
        assert paths[b] == pytest.approx(math.exp(scores[best] - log_z), rel=1e-4)
        for k, (s, e, label) in enumerate(nodes):
            marginal = sum(math.exp(v - log_z) for chosen, v in zip(sets, scores) if k in chosen)
            p_local = float(local[b, s, e - s].softmax(0)[label])
            expected_cands[(b, s, e, label)] = p_local * marginal
            if k in sets[best]:
                expected_ents[(b, s, e, label)] = p_local * marginal
    _assert_close(ents, expected_ents)
    _assert_close(cands, expected_cands)
    assert all(0 <= v <= 1 for v in cands.values())


def _scored_batch(seed: int, B: int = 2, L: int = 5, D: int = 6):
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(B, L, D, generator=gen)
    lengths = torch.tensor([L, int(torch.randint(1, L + 1, (1,), generator=gen))])
    return gen, X, lengths


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), with_transitions=st.booleans())
def test_semicrf_confidences_paths_and_candidates_match_enumeration(seed, with_transitions):
    gen, X, lengths = _scored_batch(seed)
    M, K = 2, 3
    torch.manual_seed(seed)
    head = SemiCRFHead(X.shape[-1], M, max_width=K, hidden_width=16, transitions=with_transitions)
    head.eval()
    with torch.no_grad():
        for p in head.parameters():  # scores spread widely enough to give varied marginals
            p.mul_(4)
        scores = head.span_scores(X, lengths)
    ents, cands, paths = _decoded(head, X, lengths)
    T = head.transitions.detach() if with_transitions else None
    expected_ents, expected_cands = {}, {}
    for b in range(X.shape[0]):
        enum = bf.semicrf_enumerate(scores[b], int(lengths[b]), T)
        assert len(enum.best_paths) == 1
        assert paths[b] == pytest.approx(math.exp(enum.best_score - enum.log_z), rel=1e-3)
        for s, e, label in enum.best_paths[0]:
            if label:
                expected_ents[(b, s, e, label)] = float(enum.marginals[s, e - s, label])
        above = (enum.marginals[..., 1:] > CANDIDATE_FLOOR).nonzero().tolist()
        for s, w, label in above:
            expected_cands[(b, s, s + w, label + 1)] = float(enum.marginals[s, w, label + 1])
    expected_cands.update(expected_ents)
    _assert_close(ents, expected_ents)
    _assert_close(cands, expected_cands)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), scheme=st.sampled_from(["BIO", "BILUO"]))
def test_crf_confidences_paths_and_candidates_match_enumeration(seed, scheme):
    gen, X, lengths = _scored_batch(seed, L=4)
    M, K = 2, 2
    torch.manual_seed(seed)
    head = LinearCRFHead(X.shape[-1], M, max_width=K, hidden_width=16, scheme=scheme).eval()
    with torch.no_grad():
        head.transitions.data = torch.randn(head.transitions.shape, generator=gen)
        for p in head.emitter.parameters():
            p.mul_(3)
        emissions = head.emissions(X, lengths)
    ents, cands, paths = _decoded(head, X, lengths)
    names = head.scheme.names
    expected_ents, expected_cands = {}, {}
    for b in range(X.shape[0]):
        n = int(lengths[b])
        enum = bf.crf_enumerate(emissions[b, :n], head.transitions, n, head.allowed)
        assert len(enum.best_paths) == 1
        assert paths[b] == pytest.approx(math.exp(enum.best_score - enum.log_z), rel=1e-3)
        probs = bf.crf_span_probabilities(enum, names, scheme)
        for s, e, label in bf.entities_by_definition(enum.best_paths[0], names, scheme):
            expected_ents[(b, s, e, label)] = probs[(s, e, label)]
        for (s, e, label), p in probs.items():
            if e - s < K and p > CANDIDATE_FLOOR:
                expected_cands[(b, s, e, label)] = p
    expected_cands.update(expected_ents)
    _assert_close(ents, expected_ents)
    _assert_close(cands, expected_cands)


def test_span_candidates_are_probabilities_above_the_floor_or_decoded():
    # a marginal is a gradient of log Z, which rounding can put a few ulps above 1 where one
    # segmentation dominates (semi-CRF marginals of random scores reach 1.0000002)
    above_one = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))
    marginals = torch.zeros((1, 3, 2, 3))
    marginals[0, 0, 0, 1] = above_one
    marginals[0, 1, 1, 2] = 0.5
    marginals[0, 2, 0, 2] = 0.005  # below the floor, but decoded
    marginals[0, 1, 0, 1] = CANDIDATE_FLOOR  # at the floor: not above it
    rows, values = span_candidates(marginals, torch.tensor([[0, 2, 2, 2]]))
    assert rows.tolist() == [[0, 0, 0, 1], [0, 1, 2, 2], [0, 2, 2, 2]]
    assert values.tolist() == [1.0, 0.5, marginals[0, 2, 0, 2].item()]


@pytest.mark.parametrize("seed", [57, 197, 249, 250])
def test_semicrf_confidences_are_at_most_one(seed):
    # the marginals of these problems round to 1.0000001 where one segmentation dominates
    torch.manual_seed(seed)
    head = SemiCRFHead(4, 2, max_width=3, hidden_width=6, dropout=0.0).eval()
    L = 1 + seed % 6
    out = head.decode(torch.randn((1, L, 3, 3)) * (1 + seed % 20), torch.tensor([L]))
    assert len(out.scores) and (out.scores <= 1).all() and (out.scores > 0.9).any()


def test_filtered_confidences_are_at_most_one():
    # a node's local label probability times its marginal: in this problem both round to 1 and
    # the float32 product to 1.0000001
    seed = 1483
    torch.manual_seed(seed)
    head = FilteredSemiCRFHead(6, 3, max_width=3, hidden_width=8).double().eval()
    gen = torch.Generator().manual_seed(seed)
    local, glob = (torch.randn((1, 4, 3, 4), generator=gen, dtype=torch.float64) * 14
                   for _ in range(2))
    out = head.decode(local, glob, torch.tensor([4]), 0.0, DecodeOptions(candidates=True))
    conf = out.candidates[1]
    assert len(conf) and (conf <= 1).all() and (conf > 0.9).any()


def _lone_node(null_tokens: bool, label_score: float, null_score: float = -20.0):
    """A filtered head's prediction (with candidates) of one node, tokens 1-2 with label 1,
    whose local scores are ``label_score`` for its label and ``null_score`` for null, and which
    the path takes (over its null tokens too): its marginal is 1."""
    torch.manual_seed(0)
    head = FilteredSemiCRFHead(6, 2, max_width=3, hidden_width=8, null_tokens=null_tokens).eval()
    local = torch.full((1, 4, 3, 3), -20.0)
    local[0, 1, 1, 0], local[0, 1, 1, 1] = null_score, label_score
    glob = torch.zeros((1, 4, 3, 3))
    glob[0, 1, 1, 1] = 20.0
    out = head.decode(local, glob, torch.tensor([4]), 0.0, DecodeOptions(candidates=True))
    assert out.spans.tolist() == [[0, 1, 2, 1]]
    return out, float(local[0, 1, 1].softmax(0)[1])


@pytest.mark.parametrize("null_tokens", [False, True])
def test_filtered_confidences_are_clamped_whatever_the_rounding(monkeypatch, null_tokens):
    # the problem above depends on how this CPU rounds exp and log; a local probability above 1
    # (as rounding can give) must come out as 1 on any machine, in the entities and candidates
    monkeypatch.setattr(heads, "local_label_probability",
                        lambda local, index, labels: torch.full(index.shape, 1.5))
    out, _ = _lone_node(null_tokens, 20.0)
    assert out.scores.tolist() == [1.0] and out.candidates[1].tolist() == [1.0]


def test_null_token_marginals_are_clamped_before_the_local_probability(monkeypatch):
    # a node's marginal above 1 (as rounding can give) is 1 before it multiplies the local
    # probability: the confidence is then that probability, not 1
    add = heads.add_null_tokens

    def larger_shares(nodes, null):
        graph = add(nodes, null)
        return graph._replace(share=graph.share * 1.5)

    monkeypatch.setattr(heads, "add_null_tokens", larger_shares)
    out, label_probability = _lone_node(True, 1.0, 0.0)  # label against null: 0.73
    assert out.scores.tolist() == [pytest.approx(label_probability, rel=1e-6)]


def test_semicrf_confidences_are_clamped_whatever_the_rounding(monkeypatch):
    # a marginal above 1 (as rounding can give) must come out as 1 on any machine
    exact = heads.semicrf_marginals_and_log_z

    def above_one(*args, **kwargs):
        marginals, log_z = exact(*args, **kwargs)
        return (marginals > 0) * 1.5, log_z  # every span of the documents: 1.5

    monkeypatch.setattr(heads, "semicrf_marginals_and_log_z", above_one)
    torch.manual_seed(0)
    head = SemiCRFHead(4, 2, max_width=3, hidden_width=6, dropout=0.0).eval()
    out = head.decode(torch.randn((1, 4, 3, 3)), torch.tensor([4]), DecodeOptions(candidates=True))
    assert len(out.scores) and out.scores.tolist() == [1.0] * len(out.scores)
    rows, values = out.candidates
    # 4 + 3 + 2 spans of 4 tokens up to 3 wide, two labels each
    assert len(values) == 18 and values.tolist() == [1.0] * len(values)


def test_a_path_scoring_above_log_z_by_rounding_has_probability_one():
    # the best path's score and log Z come from different sums: where one path holds nearly
    # all the mass, the score can round above log Z
    prob = path_probability(torch.tensor([2.0 + 1e-6, 1.0]), torch.tensor([2.0, 3.0]))
    assert prob.dtype == torch.float32
    assert prob.tolist() == [1.0, pytest.approx(math.exp(-2.0))]


def test_without_extras_the_heads_give_only_the_entities():
    gen, X, lengths = _scored_batch(0)
    for head in (SemiCRFHead(X.shape[-1], 2, max_width=3), LinearCRFHead(X.shape[-1], 2)):
        with torch.no_grad():
            plain = head.eval()(X, lengths)
            ents, _, _ = _decoded(head, X, lengths)
        assert [tuple(r) for r in plain[0].tolist()] == list(ents)
        assert plain[1].tolist() == pytest.approx(list(ents.values()), abs=1e-6)
        assert len(plain) == 2 and not (plain[0][:, 3] <= 0).any()


# ----------------------------------------------------------------------------- the map


def _outcomes(truth, n: int = 40_000, seed: int = 0):
    """Raw scores spread over (0, 1) and outcomes drawn with probability ``truth(raw)``."""
    rng = numpy.random.default_rng(seed)
    raw = 1 / (1 + numpy.exp(-rng.normal(1.0, 2.0, n)))
    return raw, rng.random(n) < truth(raw)


def logistic_truth(p):
    return 1 / (1 + numpy.exp(-(0.6 * numpy.log(p / (1 - p)) - 0.4)))


def capped_truth(p):
    """Accurate just below a ceiling at 0.8, as a head trained with boundary smoothing."""
    return numpy.where(p < 0.7, 0.6 * p, numpy.minimum(0.42 + 5.5 * (p - 0.7), 0.97))


def test_platt_recovers_a_logistic_map():
    raw, correct = _outcomes(logistic_truth)
    fitted = check_calibration(fit_platt(raw, correct))
    assert fitted["slope"] == pytest.approx(0.6, abs=0.03)
    assert fitted["intercept"] == pytest.approx(-0.4, abs=0.05)


def test_isotonic_recovers_a_non_logistic_map_and_keeps_the_order():
    raw, correct = _outcomes(capped_truth)
    fitted = check_calibration(fit_isotonic(raw, correct))
    grid = numpy.linspace(0.05, 0.95, 19)
    numpy.testing.assert_allclose(apply_calibration(fitted, grid), capped_truth(grid), atol=0.05)
    everywhere = numpy.linspace(0, 1, 10_001, dtype="float32")
    out = apply_calibration(fitted, everywhere)
    # no score of 0 or 1 but at a raw confidence of 0, where the map falls to 0
    assert numpy.all(numpy.diff(out) >= 0) and out[1:].min() > 0 and out.max() < 1
    assert out[0] == 0.0
    # between two knots of different scores the order of the raw scores is kept
    x, y = numpy.asarray(fitted["x"]), numpy.asarray(fitted["y"])
    rising = numpy.flatnonzero(numpy.diff(y) > 0)
    assert len(rising) > 10
    between = x[rising, None] + (x[rising + 1] - x[rising])[:, None] * numpy.array([0.25, 0.5, 0.75])
    assert numpy.all(numpy.diff(apply_calibration(fitted, between.astype("float32")), axis=1) > 0)


def test_an_isotonic_map_falls_to_zero_below_its_first_knot():
    """Fitted on decoded entities, a map also scores candidates of far lower raw confidence:
    below its first knot it falls linearly to 0 at a raw confidence of 0 (flat, it gave a
    candidate of marginal 0.02 the 0.65 of an entity of 0.38); flat above its last knot."""
    fitted = {"method": "isotonic", "x": [0.4, 0.8], "y": [0.6, 0.9]}
    out = apply_calibration(fitted, numpy.array([0.0, 0.02, 0.2, 0.4, 0.6, 0.8, 1.0]))
    assert out.tolist() == pytest.approx([0.0, 0.03, 0.3, 0.6, 0.75, 0.9, 0.9])
    starts_at_zero = {"method": "isotonic", "x": [0.0, 0.5], "y": [0.2, 0.6]}
    assert apply_calibration(starts_at_zero, numpy.array([0.0, 0.25])).tolist() == \
        pytest.approx([0.2, 0.4])


def test_an_isotonic_map_with_its_knots_in_numpy_arrays_scores_as_with_lists():
    """The check takes knots in NumPy arrays (a map built in Python); applying such a map
    failed at the first prediction: the truth value of an array is ambiguous."""
    listed = {"method": "isotonic", "x": [0.4, 0.8], "y": [0.6, 0.9]}
    arrays = {"method": "isotonic", "x": numpy.array([0.4, 0.8]), "y": numpy.array([0.6, 0.9])}
    raw = numpy.array([0.0, 0.2, 0.6, 1.0])
    assert apply_calibration(arrays, raw).tolist() == apply_calibration(listed, raw).tolist()


def test_the_check_gives_the_map_in_plain_numbers_which_a_saved_pipeline_can_hold():
    """A map of NumPy arrays and NumPy numbers (built in Python) passed the check, predicted,
    and failed at saving: srsly's JSON takes no NumPy values. The check returns the map in
    Python floats and lists, the same numbers."""
    arrays = {"method": "isotonic", "x": numpy.array([0.4, 0.8]), "y": numpy.array([0.6, 0.9])}
    platt = {"method": "platt", "slope": numpy.float32(1.5), "intercept": numpy.float64(-0.25)}
    plain = check_calibration({"method": "by_novelty", "seen": platt, "unseen": arrays})
    assert plain == {"method": "by_novelty",
                     "seen": {"method": "platt", "slope": 1.5, "intercept": -0.25},
                     "unseen": {"method": "isotonic", "x": [0.4, 0.8], "y": [0.6, 0.9]}}
    assert type(plain["seen"]["slope"]) is float and type(plain["unseen"]["x"][0]) is float
    nlp = spacy.blank("en")
    ner = nlp.add_pipe("fsemicrf_ner", config={"model": model_config()})
    ner.add_label("PER")
    nlp.initialize()
    ner.calibration = {"method": "by_novelty", "seen": platt, "unseen": arrays}
    nlp2 = spacy.blank("en")
    nlp2.add_pipe("fsemicrf_ner", config={"model": model_config()})
    nlp2.from_bytes(nlp.to_bytes())
    # through the saved cfg (srsly's JSON gives 0.6 back as 0.6000000000000001)
    assert nlp2.get_pipe("fsemicrf_ner").calibration == srsly.json_loads(srsly.json_dumps(plain))


@pytest.mark.parametrize("truth, method", [(logistic_truth, "platt"), (capped_truth, "isotonic")])
def test_the_fit_selects_the_map_that_predicts_held_out_outcomes_better(truth, method):
    raw, correct = _outcomes(truth, n=10_000)
    fitted = check_calibration(fit_calibration(raw, correct))
    assert fitted["method"] == method
    assert fitted["n_entities"] == raw.size and fitted["n_correct"] == int(correct.sum())
    assert fitted["selection"][method] == min(fitted["selection"].values())
    out = apply_calibration(fitted, numpy.linspace(0, 1, 1001, dtype="float32"))
    assert numpy.all(numpy.diff(out) >= 0) and out.min() >= 0 and out.max() <= 1
    assert numpy.array_equal(apply_calibration(None, raw), raw.astype("float32"))


def test_the_maps_on_small_or_odd_data():
    raw = numpy.array([0.2, 0.4, 0.6, 0.8])
    anti = fit_isotonic(raw, numpy.array([True, True, False, False]))
    assert len(anti["x"]) == 1 and anti["y"] == [pytest.approx(3 / 6)]  # one step, 2 of 4 right
    assert fit_platt(raw, numpy.array([True, True, False, False]))["slope"] == 0.0  # constant
    separable = fit_isotonic(raw, numpy.array([False, False, True, True]))
    assert separable["y"] == [pytest.approx(1 / 4), pytest.approx(3 / 4)]  # never 0 or 1
    assert separable["x"] == [pytest.approx(0.3), pytest.approx(0.7)]
    steep = fit_platt(raw, numpy.array([False, False, True, True]))
    assert math.isfinite(steep["slope"]) and steep["slope"] > 0
    saturated = fit_platt(numpy.array([1.0, 1.0, 0.0]), numpy.array([True, False, False]))
    assert all(math.isfinite(saturated[k]) for k in ("slope", "intercept"))
    tied = fit_isotonic(numpy.array([1.0, 1.0, 1.0, 0.5]), numpy.array([True, True, False, False]))
    assert tied["x"] == [0.5, 1.0] and tied["y"] == [pytest.approx(1 / 3), pytest.approx(3 / 5)]
    mostly_right = fit_isotonic(numpy.array([0.2, 0.4, 0.6, 0.8, 0.9, 0.95]),
                                numpy.array([False, True, True, True, True, True]))
    share = (5 + 1) / (6 + 2)  # each step shrinks towards the share of correct entities
    assert mostly_right["y"] == [pytest.approx(2 * share / 3), pytest.approx((5 + 2 * share) / 7)]
    assert fit_isotonic(numpy.zeros(0), numpy.zeros(0, bool)) == {"method": "isotonic", "x": [],
                                                                  "y": []}
    for raw_one in ([0.7], []):
        fitted = check_calibration(fit_calibration(numpy.array(raw_one), numpy.ones(len(raw_one), bool)))
        assert 0 <= apply_calibration(fitted, numpy.array([0.3]))[0] <= 1
    for bad in ({"method": "isotonic", "x": [0.5, 0.4], "y": [0.1, 0.2]},
                {"method": "isotonic", "x": [0.4, 0.5], "y": [0.3, 0.2]},
                {"method": "isotonic", "x": [0.4], "y": [1.5]},
                {"method": "platt", "slope": -1.0, "intercept": 0.0},
                {"method": "platt", "slope": float("nan"), "intercept": 0.0},
                {"method": "beta"}, {"x": []}, [0.1]):
        with pytest.raises(ValueError, match="calibration map"):
            check_calibration(bad)


def test_an_isotonic_map_reads_columns_and_float32_and_keeps_8_and_6_decimals():
    """Knots to 8 decimals and scores to 6 (what the saved cfg keeps), from confidences and
    outcomes of any shape and precision, as from flat float64 ones."""
    rng = numpy.random.default_rng(0)
    raw = rng.random(500).astype("float32")
    correct = rng.random(500) < raw
    fitted = fit_isotonic(raw.astype("float64"), correct)
    assert fit_isotonic(raw.reshape(-1, 1), correct.reshape(-1, 1)) == fitted
    assert len(fitted["x"]) > 3
    assert all(round(v, 8) == v for v in fitted["x"]) and all(round(v, 6) == v for v in fitted["y"])
    assert not all(round(v, 7) == v for v in fitted["x"])  # (the test's knots need 8)
    assert not all(round(v, 5) == v for v in fitted["y"])


@pytest.mark.parametrize("bad", [{"method": "platt", "slope": "0.5", "intercept": 0.1},
                                 {"method": "platt", "slope": 0.5, "intercept": "0.1"},
                                 {"method": "isotonic", "x": ["0.2", "0.8"], "y": [0.1, 0.9]},
                                 {"method": "isotonic", "x": [0.2, 0.8], "y": [0.1, "0.9"]}])
def test_a_map_with_numbers_written_as_text_is_refused(bad):
    """float() and numpy.asarray() read "0.5" as a number, so the check took such a map (edited
    by hand), and applying it failed at the first prediction with a TypeError."""
    with pytest.raises(TypeError):
        apply_calibration(bad, numpy.array([0.5, 0.9]))
    with pytest.raises(ValueError, match="calibration map"):
        check_calibration(bad)
    with pytest.raises(ValueError, match="calibration map"):
        check_calibration({"method": "by_novelty", "seen": bad, "unseen": bad})


@pytest.mark.parametrize("bad", [{"method": "platt", "slope": True, "intercept": 0.0},
                                 {"method": "platt", "slope": 1.0, "intercept": False},
                                 {"method": "isotonic", "x": [0.2, True], "y": [0.1, 0.9]},
                                 {"method": "isotonic", "x": [0.2, 0.8], "y": [False, True]}])
def test_a_map_with_bools_for_numbers_is_refused(bad):
    """Python takes True for 1: the check took a slope of True (a map edited by hand or built
    from a mask), as the heads' settings no longer do."""
    with pytest.raises(ValueError, match="calibration map"):
        check_calibration(bad)


@pytest.mark.parametrize("value", [0.0, 0.3, 0.7, 1.0])
def test_platt_on_raw_confidences_that_do_not_vary_is_constant(value):
    """All held-out entities at one raw confidence (one entity; a saturated head) tell no
    slope: the fit took one in proportion to the logit of that value, so 30 entities at 0.7,
    21 right, scored a raw 1.0 at 0.999 and at 1.0 scored a raw 0.05 at 0.46."""
    correct = numpy.arange(30) < 21
    targets = numpy.where(correct, 22 / 23, 1 / 11)  # Platt's targets: the constant is their mean
    grid = numpy.array([0.0, 0.05, 0.3, value, 0.99, 1.0])
    for raw in (numpy.full(30, value), numpy.full(30, value, dtype="float32")):
        fitted = fit_platt(raw, correct)
        assert fitted["slope"] == 0.0
        assert apply_calibration(fitted, grid).tolist() == pytest.approx([targets.mean()] * 6)
        assert fit_calibration(raw, correct)["slope"] == 0.0
    one = fit_platt(numpy.array([value]), numpy.array([True]))
    assert one["slope"] == 0.0 and one["intercept"] == pytest.approx(math.log(2))


def test_a_platt_map_scores_alike_before_and_after_saving():
    """The cfg is saved as srsly's JSON, which keeps 9 decimals: a map whose parameters had
    more gave the reloaded pipeline scores a float32 step away from the fitted one's."""
    grid = numpy.linspace(0, 1, 100_001, dtype="float32")
    for seed in range(5):
        rng = numpy.random.default_rng(seed)
        raw = rng.random(500)
        fitted = fit_platt(raw, rng.random(500) < raw ** rng.uniform(0.3, 3))
        saved = srsly.json_loads(srsly.json_dumps(fitted))
        assert numpy.array_equal(apply_calibration(saved, grid), apply_calibration(fitted, grid))


def test_a_platt_map_is_its_fit_to_the_9_decimals_its_json_keeps():
    """The parameters are the maximum-likelihood fit rounded to 9 decimals, which srsly's
    JSON keeps (so saving changes nothing), and no coarser."""
    for seed in range(5):
        rng = numpy.random.default_rng(seed)
        raw = rng.random(500)
        correct = rng.random(500) < raw ** rng.uniform(0.3, 3)
        fitted = fit_platt(raw, correct)
        saved = srsly.json_loads(srsly.json_dumps(fitted))
        for key in ("slope", "intercept"):  # (srsly's JSON reads a decimal back to an ulp)
            assert saved[key] == pytest.approx(fitted[key], rel=1e-15, abs=0)
        # the unrounded fit, with Platt's targets (n+ + 1) / (n+ + 2) and 1 / (n- + 2)
        n_pos, n_neg = int(correct.sum()), int((~correct).sum())
        targets = numpy.where(correct, (n_pos + 1) / (n_pos + 2), 1 / (n_neg + 2))
        p = numpy.clip(raw, calibration.EPS, 1 - calibration.EPS)
        slope, intercept = calibration._logistic(numpy.log(p / (1 - p)), targets)
        assert slope > 0
        for key, exact in (("slope", slope), ("intercept", intercept)):
            assert fitted[key] == round(fitted[key], 9)  # 9 decimals at most
            assert abs(fitted[key] - exact) <= 5e-10 + 1e-15  # the nearest such
        assert (fitted["slope"], fitted["intercept"]) != (slope, intercept)  # some digit cut


def test_platt_reads_its_outcomes_as_booleans():
    """0/1 integers (or any truthy values) are right and wrong as True and False are."""
    rng = numpy.random.default_rng(3)
    raw = rng.random(200)
    correct = rng.random(200) < raw
    expected = fit_platt(raw, correct)
    assert expected["slope"] > 0
    for other in (correct.astype("int64"), correct.astype("float32"), correct.tolist()):
        assert fit_platt(raw, other) == expected


def test_raw_outcomes_of_no_examples_are_empty_arrays_of_their_types():
    """As those of documents with entities: float32 confidences, boolean outcomes and flags."""
    nlp = spacy.blank("en")
    nlp.add_pipe("fsemicrf_ner")
    raw, correct, seen = raw_outcomes(nlp, "fsemicrf_ner", [])
    assert (raw.shape, correct.shape, seen.shape) == ((0,), (0,), (0,))
    assert (raw.dtype, correct.dtype, seen.dtype) == (numpy.float32, numpy.bool_, numpy.bool_)


def _novelty_outcomes(n: int = 20_000, seed: int = 0, same: bool = False):
    """Half the entities seen in training, right as often as their raw score says; the unseen
    ones right half as often (unless ``same``)."""
    rng = numpy.random.default_rng(seed)
    raw = 1 / (1 + numpy.exp(-rng.normal(1.0, 2.0, n)))
    seen = rng.random(n) < 0.5
    truth = numpy.where(seen | same, raw, 0.5 * raw)
    return raw, rng.random(n) < truth, seen


def test_a_map_each_for_seen_and_unseen_entities_when_they_differ():
    raw, correct, seen = _novelty_outcomes()
    fitted = check_calibration(fit_calibration(raw, correct, seen))
    assert fitted["method"] == "by_novelty"
    assert fitted["selection"]["by_novelty"] == min(fitted["selection"].values())
    grid = numpy.linspace(0.1, 0.9, 9)
    for flag, truth in ((True, grid), (False, 0.5 * grid)):
        out = apply_calibration(fitted, grid, numpy.full(grid.shape, flag))
        numpy.testing.assert_allclose(out, truth, atol=0.05)
        part = seen == flag  # each map is the fit of its own entities
        assert apply_calibration(fitted, grid, numpy.full(grid.shape, flag)).tolist() == \
            apply_calibration(fit_calibration(raw[part], correct[part]), grid).tolist()
    mixed = numpy.array([True, False, True, False])
    values = numpy.array([0.2, 0.2, 0.8, 0.8])
    by_hand = [apply_calibration(fitted["seen" if f else "unseen"], numpy.array([v]))[0]
               for f, v in zip(mixed, values)]
    assert apply_calibration(fitted, values, mixed).tolist() == by_hand
    with pytest.raises(ValueError, match="seen in training"):
        apply_calibration(fitted, values)
    assert fit_calibration(raw, correct)["method"] in ("platt", "isotonic")  # no flags: one map
    # with the same accuracy on both kinds the selection is a toss-up, and harmless: whichever
    # wins gives both kinds the same scores
    raw, correct, seen = _novelty_outcomes(same=True)
    fitted = fit_calibration(raw, correct, seen)
    assert max(fitted["selection"].values()) - min(fitted["selection"].values()) < 0.005
    both = [apply_calibration(fitted, grid, numpy.full(grid.shape, flag)) for flag in (True, False)]
    numpy.testing.assert_allclose(both[0], both[1], atol=0.03)
    numpy.testing.assert_allclose(both[0], grid, atol=0.03)


def test_a_map_per_kind_needs_enough_entities_of_each():
    raw, correct, seen = _novelty_outcomes(n=4_000)
    few = seen & (numpy.cumsum(seen) > MIN_GROUP - 1)  # all but MIN_GROUP - 1 of the seen
    seen_few = seen.copy()
    seen_few[few] = False
    assert seen_few.sum() == MIN_GROUP - 1
    fitted = fit_calibration(raw, correct, seen_few)
    assert "by_novelty" not in fitted["selection"]
    seen_enough = seen.copy()
    seen_enough[seen & (numpy.cumsum(seen) > MIN_GROUP)] = False
    assert "by_novelty" in fit_calibration(raw, correct, seen_enough)["selection"]
    # a kind with no entity at all (possible in one half of the held-out comparison) gets the
    # map of all of them
    lone = fit_by_novelty(raw, correct, numpy.zeros(raw.shape, bool))
    assert lone["seen"] == lone["unseen"] == fit_calibration(raw, correct)
    for bad in ({"method": "by_novelty", "seen": {"method": "platt", "slope": 1.0, "intercept": 0.0}},
                {"method": "by_novelty", "seen": lone, "unseen": lone},
                {"method": "by_novelty", "seen": {"method": "platt", "slope": -1.0, "intercept": 0.0},
                 "unseen": {"method": "platt", "slope": 1.0, "intercept": 0.0}}):
        with pytest.raises(ValueError, match="calibration map"):
            check_calibration(bad)


def test_a_map_per_kind_needs_enough_unseen_entities_too():
    raw, correct, seen = _novelty_outcomes(n=4_000)
    unseen = ~seen
    few = unseen.copy()
    few[unseen & (numpy.cumsum(unseen) > MIN_GROUP - 1)] = False
    assert few.sum() == MIN_GROUP - 1
    assert "by_novelty" not in fit_calibration(raw, correct, ~few)["selection"]
    enough = unseen & (numpy.cumsum(unseen) <= MIN_GROUP)
    assert "by_novelty" in fit_calibration(raw, correct, ~enough)["selection"]


def _constant_fit(raw, correct, seen):
    """A Platt map of slope 0 that scores 1 when every training entity was right, 0 when none
    was, else 0.5 (exactly, in float32)."""
    intercept = 1000.0 if correct.all() else -1000.0 if not correct.any() else 0.0
    return {"method": "platt", "slope": 0.0, "intercept": intercept}


def test_the_held_out_loss_fits_on_one_half_and_scores_the_other_both_ways_round():
    """Entities 0, 2, 4 are wrong and 1, 3, 5 right: fitted on either half, the map scores the
    other half 0 or 1 for the wrong outcome, which the loss clips to [1e-6, 1 - 1e-6] (in the
    map's float32: a log-loss of about 13.8 an entity, not infinity); one entity has no other
    half to fit on (loss 0)."""
    low, high = float(numpy.float32(1e-6)), float(numpy.float32(1 - 1e-6))
    raw = numpy.linspace(0.1, 0.6, 6)
    correct = numpy.arange(6) % 2 == 1
    expected = -(3 * math.log1p(-high) + 3 * math.log(low)) / 6
    got = calibration._held_out_log_loss(_constant_fit, raw, correct, None)
    assert got == pytest.approx(expected, rel=1e-5)
    # the odd half has one wrong entity: fitted on it, the map scores the even half 0.5; fitted
    # on the even half (all wrong), it scores the odd half's two right ones and one wrong 0
    mixed = numpy.array([False, True, False, False, False, True])
    expected = -(3 * math.log(0.5) + 2 * math.log(low) + math.log1p(-low)) / 6
    got = calibration._held_out_log_loss(_constant_fit, raw, mixed, None)
    assert got == pytest.approx(expected, rel=1e-5)
    for n in (0, 1):
        assert calibration._held_out_log_loss(_constant_fit, raw[:n], correct[:n], None) == 0.0


def test_the_selection_records_each_maps_held_out_loss_to_6_decimals():
    raw, correct, seen = _novelty_outcomes(n=2_000)
    fitted = fit_calibration(raw, correct, seen)
    assert fitted["selection"] == {
        name: round(calibration._held_out_log_loss(calibration.FITS[name], raw, correct, seen), 6)
        for name in ("platt", "isotonic", "by_novelty")}


def test_the_fit_reads_its_inputs_of_any_shape_and_dtype():
    """Columns, float32 confidences and 0/1 outcomes and flags give the map of flat float64
    confidences and booleans."""
    raw, correct, seen = _novelty_outcomes(n=1_000)
    raw = raw.astype("float32")  # as the component's confidences are
    expected = fit_calibration(raw.astype("float64"), correct, seen)
    assert fit_calibration(raw.reshape(-1, 1), correct.astype("int64").reshape(-1, 1),
                           seen.astype("int64").reshape(-1, 1)) == expected


def test_a_map_per_kind_scores_with_flags_of_any_shape_and_dtype_and_needs_them():
    """``apply_calibration`` of a map by novelty reads ``seen`` as booleans in the shape of
    ``raw`` (0/1 integers are flags, not indices), gives float32, and refuses to guess."""
    raw, correct, seen = _novelty_outcomes(n=400)
    fitted = fit_by_novelty(raw, correct, seen)
    expected = apply_calibration(fitted, raw, seen)
    assert expected.dtype == numpy.float32
    assert (expected[seen] == apply_calibration(fitted["seen"], raw[seen])).all()
    got = apply_calibration(fitted, raw, seen.astype("int64").reshape(-1, 1))
    assert got.dtype == numpy.float32 and numpy.array_equal(got, expected)
    with pytest.raises(ValueError, match=r"^A by_novelty calibration map needs to know which "
                                         r"entities were seen in training \(seen=\.\.\.\)\.$"):
        apply_calibration(fitted, raw)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 70), st.sampled_from(["platt", "isotonic"]))
def test_a_map_per_kind_scores_each_entity_with_its_kinds_map_bit_for_bit(seed, n, unseen_kind):
    """Each entity gets, bit for bit, what its kind's map gives the entities of that kind alone
    (two Platt maps take one pass over all of them, at any position in the batch)."""
    rng = numpy.random.default_rng(seed)
    raw = rng.random(n).astype("float32")
    raw[rng.random(n) < 0.1] = rng.choice([0.0, 1.0, 1e-7])
    seen = rng.random(n) < 0.5
    platt = {"method": "platt", "slope": float(rng.uniform(0.1, 3)),
             "intercept": float(rng.uniform(-2, 2))}
    other = ({"method": "platt", "slope": float(rng.uniform(0.1, 3)),
              "intercept": float(rng.uniform(-2, 2))} if unseen_kind == "platt"
             else {"method": "isotonic", "x": [0.2, 0.7], "y": [0.3, 0.9]})
    got = apply_calibration({"method": "by_novelty", "seen": platt, "unseen": other}, raw, seen)
    assert got.dtype == numpy.float32 and got.shape == raw.shape
    assert got[seen].tobytes() == apply_calibration(platt, raw[seen]).tobytes()
    assert got[~seen].tobytes() == apply_calibration(other, raw[~seen]).tobytes()


def test_a_map_per_kind_reads_seen_flags_of_any_shape_and_dtype():
    """``fit_by_novelty`` called directly reads ``seen`` as booleans, flattened: 0/1 integers
    (not indices) and a column of flags give the map of a flat boolean array."""
    raw, correct, seen = _novelty_outcomes(n=400)
    expected = fit_by_novelty(raw, correct, seen)
    assert fit_by_novelty(raw, correct, seen.astype("int64")) == expected
    assert fit_by_novelty(raw, correct, seen.reshape(-1, 1)) == expected


@functools.lru_cache(maxsize=None)
def _tokenizer():
    """One English tokenizer for every example (a blank pipeline each cost 50 ms)."""
    return spacy.blank("en").tokenizer


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["Paris", "Rome", "New", "York", "New York", "x"]), min_size=1,
                max_size=8), st.sets(st.sampled_from(["Paris", "New York", "York", "Rome x"])),
       st.data())
def test_seen_flags_is_set_membership_of_the_entity_texts(words, known, data):
    doc = _tokenizer()(" ".join(words))
    n = len(doc)
    rows = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=6))
    rows = numpy.array([[0, min(a, b), max(a, b), 1] for a, b in rows], dtype="int64").reshape(-1, 4)
    keys = numpy.unique(numpy.array([entity_key(t) for t in known], dtype="uint64"))
    expected = [doc[s:e + 1].text in known for _, s, e, _ in rows.tolist()]
    flags = seen_flags([doc], rows, keys)
    assert flags.dtype == bool and flags.tolist() == expected
    none = seen_flags([doc], rows, numpy.zeros(0, dtype="uint64"))
    assert none.dtype == bool and not none.any() and none.shape == (len(rows),)


def test_an_unannotated_copy_keeps_the_text_and_tokens_only():
    """``unannotated`` gives what a pipeline sees at prediction: the same tokens and the same
    text (spaces as they were, none after the last token), no entities."""
    doc = _tokenizer()("Paris is in France.")
    doc.ents = [Span(doc, 0, 1, "LOC")]
    copy = unannotated(doc)
    assert [t.text for t in copy] == [t.text for t in doc] and copy.text == doc.text
    assert [t.whitespace_ for t in copy] == [t.whitespace_ for t in doc]
    assert not copy.has_annotation("ENT_IOB") and copy.vocab is doc.vocab


# ----------------------------------------------------------------------------- the pipeline


def small_model():
    """The filtered head of ``small_nlp``: boundary smoothing keeps its filter less sure next to
    entities, so that a wide margin keeps candidates the best path leaves out."""
    return model_config(boundary_smoothing=0.2)


@pytest.fixture(scope="module")
def small_nlp():
    nlp = spacy.blank("en")
    nlp.add_pipe("fsemicrf_ner", config={"model": small_model()})
    train_pipeline(nlp, make_examples(nlp), n_iter=25)
    return nlp


def _copy(nlp, tmp_path, name="copy", **config):
    nlp.to_disk(tmp_path / name)
    return spacy.load(tmp_path / name, config={"components": {"fsemicrf_ner": config}} if config else {})


def _ents(docs):
    return [[(e.start, e.end, e.label_) for e in doc.ents] for doc in docs]


def _read(nlp, gold):
    """Examples of the ``gold`` documents as ``spacy.Corpus.v1`` reads them (their text as the
    pipeline's tokenizer splits it)."""
    return [Example(nlp.make_doc(doc.text), doc) for doc in gold]


def test_scores_are_calibrated_and_the_map_is_saved(small_nlp, tmp_path):
    nlp = _copy(small_nlp, tmp_path)
    ner = nlp.get_pipe("fsemicrf_ner")
    texts = [t for t, _ in TRAIN_DATA]
    raw_docs = list(nlp.pipe(texts))
    fitted = calibrate_component(nlp, "fsemicrf_ner", make_examples(nlp))
    assert ner.calibration == fitted and fitted["n_entities"] > 0
    docs = list(nlp.pipe(texts))
    assert _ents(docs) == _ents(raw_docs)  # the map changes the scores, never the decisions
    for raw_doc, doc in zip(raw_docs, docs):
        raw = raw_doc.spans["fsemicrf"].attrs["scores"]
        scores = doc.spans["fsemicrf"].attrs["scores"]
        numpy.testing.assert_allclose(scores, apply_calibration(fitted, raw), rtol=1e-5)
        assert numpy.all((scores >= 0) & (scores <= 1))
        assert scores.dtype == raw.dtype == numpy.float32
        assert 0 < doc.spans["fsemicrf"].attrs["path_probability"] <= 1
    nlp.to_disk(tmp_path / "calibrated")
    loaded = spacy.load(tmp_path / "calibrated")
    stored = loaded.get_pipe("fsemicrf_ner").calibration
    assert stored["n_entities"] == fitted["n_entities"]
    for key in ("x", "y"):  # JSON keeps about 15 digits
        numpy.testing.assert_allclose(stored[key], fitted[key], rtol=1e-12)
    again = list(loaded.pipe(texts))
    for doc, other in zip(docs, again):
        numpy.testing.assert_allclose(
            doc.spans["fsemicrf"].attrs["scores"], other.spans["fsemicrf"].attrs["scores"], rtol=1e-5
        )


def test_the_fit_uses_only_the_documents_given(small_nlp, tmp_path):
    nlp = _copy(small_nlp, tmp_path)
    examples = make_examples(nlp)
    first, second = examples[:4], examples[4:]
    raw, correct, seen = raw_outcomes(nlp, "fsemicrf_ner", first)
    assert calibrate_component(nlp, "fsemicrf_ner", first) == fit_calibration(raw, correct, seen)
    raw2, correct2, seen2 = raw_outcomes(nlp, "fsemicrf_ner", second)
    assert calibrate_component(nlp, "fsemicrf_ner", second) == fit_calibration(raw2, correct2, seen2)
    # the outcomes are the gold entities' exact matches
    n_gold = sum(len(eg.reference.ents) for eg in first)
    assert correct.sum() <= min(n_gold, raw.size)


def test_documents_without_entity_annotation_are_left_out_of_the_fit(small_nlp, tmp_path,
                                                                    caplog):
    """A document whose entities were never set counted every predicted entity as wrong: a dev
    set of such documents fitted a map that scored every entity near 0, without a word."""
    nlp = _copy(small_nlp, tmp_path)
    gold = make_examples(nlp)
    bare = _read(nlp, [nlp.make_doc(eg.reference.text) for eg in gold])
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        mixed = calibrate_component(nlp, "fsemicrf_ner", gold + bare)
    assert mixed == calibrate_component(nlp, "fsemicrf_ner", gold)
    assert [r.getMessage() for r in caplog.records if "annotation" in r.getMessage()] == [
        f"fsemicrf_ner: {len(bare)} of the {2 * len(bare)} calibration documents have no entity "
        "annotation and are left out"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        assert calibrate_component(nlp, "fsemicrf_ner", bare) is None
    assert nlp.get_pipe("fsemicrf_ner").calibration == mixed  # unchanged
    assert ("fsemicrf_ner: no predicted entities to calibrate on; the map is unchanged"
            in [r.getMessage() for r in caplog.records])


def test_the_fit_warns_about_few_entities_and_labels_without_gold(small_nlp, tmp_path, caplog):
    """A dev set of a few entities, or annotated with some labels only, fits a poor map: the
    fit says so (a dev set annotated with PER only, the other labels' tokens marked outside,
    counted every LOC and ORG prediction as wrong)."""
    nlp = _copy(small_nlp, tmp_path)
    gold = [eg.reference for eg in make_examples(nlp)]
    per_only = []
    for doc in gold:
        doc = doc.copy()
        doc.set_ents([e for e in doc.ents if e.label_ == "PER"], default="outside")
        per_only.append(doc)
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        calibrate_component(nlp, "fsemicrf_ner", _read(nlp, per_only))
    n = raw_outcomes(nlp, "fsemicrf_ner", _read(nlp, per_only))[0].size
    assert 0 < n < FEW_ENTITIES
    assert [r.getMessage() for r in caplog.records] == [
        "fsemicrf_ner: the calibration documents have no gold entity labelled LOC, ORG; if "
        "they are not annotated with these labels, mark those tokens as missing "
        "(Doc.set_ents(missing=...)), or each such prediction counts as wrong",
        f"fsemicrf_ner: the map is fitted on {n} predicted entities only; a few hundred make a "
        "usable one"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        calibrate_component(nlp, "fsemicrf_ner", _read(nlp, gold) * (FEW_ENTITIES // n + 1))
    assert not caplog.records


def test_the_fit_warns_about_gold_labels_the_component_does_not_know(small_nlp, tmp_path,
                                                                       caplog):
    """A label of the dev set only (not in the training data) was never reported: neither
    spacy train nor spacy debug data says that the component cannot predict it."""
    nlp = _copy(small_nlp, tmp_path)
    gold = []
    for i, doc in enumerate(eg.reference for eg in make_examples(nlp)):
        doc = doc.copy()
        free = next(t.i for t in doc if t.ent_iob_ == "O")
        label = "DRUG" if i % 2 else "DOSE"
        doc.set_ents(list(doc.ents) + [Span(doc, free, free + 1, label=label)])
        gold.append(doc)
    assert not {"DOSE", "DRUG"} & set(nlp.get_pipe("fsemicrf_ner").labels)
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        calibrate_component(nlp, "fsemicrf_ner", _read(nlp, gold) * 10)
    assert [r.getMessage() for r in caplog.records] == [
        "fsemicrf_ner: the calibration documents have gold entities labelled DOSE, DRUG, which the "
        "component was not trained on: it never predicts them, and its scores on these "
        "documents count them as missed"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        calibrate_component(nlp, "fsemicrf_ner", _read(nlp, gold) * 10, warn_poor_fit=False)
    assert not caplog.records


def test_the_fit_warns_below_few_entities_only(small_nlp, tmp_path, caplog, monkeypatch):
    """The warning about a map fitted on few entities starts below FEW_ENTITIES."""
    nlp = _copy(small_nlp, tmp_path)
    rng = numpy.random.default_rng(0)
    for n, warned in ((FEW_ENTITIES, False), (FEW_ENTITIES - 1, True)):
        outcomes = (rng.random(n), rng.random(n) < 0.5, numpy.zeros(n, dtype=bool))
        monkeypatch.setattr(calibration, "raw_outcomes", lambda *args, o=outcomes: o)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
            calibrate_component(nlp, "fsemicrf_ner", make_examples(nlp))
        few = [r.getMessage() for r in caplog.records if "fitted on" in r.getMessage()]
        assert few == ([f"fsemicrf_ner: the map is fitted on {n} predicted entities only; a few "
                        "hundred make a usable one"] if warned else [])


def test_the_fit_names_what_it_cannot_calibrate(small_nlp, tmp_path):
    nlp = _copy(small_nlp, tmp_path)
    nlp.add_pipe("sentencizer")
    with pytest.raises(ValueError, match="^'sentencizer' is not an fsemicrf_ner component$"):
        calibrate_component(nlp, "sentencizer", make_examples(nlp))
    docs = [eg.reference for eg in make_examples(nlp)]
    with pytest.raises(TypeError, match="The calibrate_component method takes a list of Example"):
        calibrate_component(nlp, "fsemicrf_ner", docs)


def test_entities_on_tokens_without_annotation_are_left_out_as_the_scorer_does(small_nlp,
                                                                             tmp_path):
    """A predicted entity that covers a token without gold entity annotation is neither right
    nor wrong for spaCy's NER scorer; calibration counted it as wrong, so that a partly
    annotated dev set fitted a map far below the scorer's precision."""
    nlp = _copy(small_nlp, tmp_path)
    gold = []
    for eg in make_examples(nlp):
        doc, half = eg.reference, len(eg.reference) // 2
        doc.set_ents([e for e in doc.ents if e.end <= half], missing=[doc[half:]],
                     default="outside")
        gold.append(doc)
    preds = list(nlp.pipe(unannotated(doc) for doc in gold))
    n_predicted = sum(len(doc.ents) for doc in preds)
    scored = [e for p, g in zip(preds, gold) for e in p.ents
              if all(t.ent_iob_ for t in g[e.start:e.end])]
    assert 0 < len(scored) < n_predicted  # some entities are on the unannotated halves
    raw, correct, seen = raw_outcomes(nlp, "fsemicrf_ner", _read(nlp, gold))
    assert raw.size == seen.size == correct.size == len(scored)
    precision = get_ner_prf([Example(p, g) for p, g in zip(preds, gold)])["ents_p"]
    assert correct.mean() == pytest.approx(precision)
    fitted = calibrate_component(nlp, "fsemicrf_ner", _read(nlp, gold))
    assert (fitted["n_entities"], fitted["n_correct"]) == (len(scored), int(correct.sum()))


def test_the_fit_predicts_on_the_tokens_of_the_pipeline_as_spacy_evaluate_does(small_nlp,
                                                                             tmp_path):
    """A corpus tokenized otherwise than the pipeline ("500mg" one token, spaCy's tokenizer
    makes "500", "mg"): the fit predicted on the corpus's tokens, which spacy evaluate and
    spacy train do not (spacy.Corpus.v1 tokenizes the text unless its spaces are unknown). It
    predicts on what they predict on and aligns to the gold tokens: its precision is theirs."""
    nlp = _copy(small_nlp, tmp_path)
    gold = []
    for eg in make_examples(nlp):
        words = [t.text for t in eg.reference]
        # glue each entity's tokens into one gold token, as a corpus of other conventions may
        glued, spaces, ents, i = [], [], [], 0
        for ent in list(eg.reference.ents) + [None]:
            stop = len(words) if ent is None else ent.start
            glued.extend(words[i:stop])
            spaces.extend([True] * (stop - i))
            if ent is not None:
                ents.append((len(glued), ent.label_))
                glued.append("-".join(words[ent.start:ent.end]))
                spaces.append(True)
                i = ent.end
        doc = Doc(nlp.vocab, words=glued, spaces=spaces)
        doc.set_ents([Span(doc, k, k + 1, label) for k, label in ents], default="outside")
        gold.append(doc)
    # spacy evaluate reads a corpus through spacy.Corpus.v1: the text as the tokenizer splits
    # it, or the corpus's own tokens where their spaces are unknown (words alone)
    words_only = [Doc(nlp.vocab, words=[t.text for t in g], ents=[f"{t.ent_iob_}-{t.ent_type_}"
                  if t.ent_type_ else "O" for t in g]) for g in gold]
    for docs in (gold, words_only):
        DocBin(docs=docs).to_disk(tmp_path / "dev.spacy")
        examples = list(Corpus(tmp_path / "dev.spacy")(nlp))
        preds = list(nlp.pipe(eg.predicted for eg in examples))
        assert [len(p) for p in preds] != [len(g) for g in gold] or docs is words_only
        raw, correct, seen = raw_outcomes(nlp, "fsemicrf_ner", examples)
        assert raw.size == seen.size == correct.size > 0
        # the confidences of what the pipeline writes there (no map: raw), right as scored
        written = numpy.concatenate([p.spans["fsemicrf"].attrs["scores"] for p in preds])
        assert raw.tolist() == pytest.approx(written.tolist())
        assert correct.mean() == pytest.approx(nlp.evaluate(examples)["ents_p"])


def test_the_fit_counts_the_entities_as_written_trimmed_of_whitespace(small_nlp, tmp_path,
                                                                     monkeypatch):
    """The component writes its entities trimmed of whitespace (one of whitespace only not at
    all): the fit counts those, not the decoded spans, which could be wrong where the written
    entity is right."""
    from spacy_fsemicrf.head_model import BatchPrediction

    nlp = _copy(small_nlp, tmp_path)
    ner = nlp.get_pipe("fsemicrf_ner")
    loc = ner.labels.index("LOC") + 1
    gold = nlp.make_doc("went to  Paris .")  # token 2 is a space
    gold.set_ents([Span(gold, 3, 4, "LOC")], default="outside")
    decoded = BatchPrediction(numpy.array([[0, 2, 3, loc], [0, 4, 4, loc]]),  # " Paris", "."
                              numpy.array([0.9, 0.2], "float32"), numpy.ones(1, "float32"))
    space = BatchPrediction(numpy.array([[0, 2, 2, loc]]), numpy.array([0.3], "float32"),
                            numpy.ones(1, "float32"))
    monkeypatch.setattr(ner, "predict", lambda docs: decoded)
    raw, correct, _ = raw_outcomes(nlp, "fsemicrf_ner", _read(nlp, [gold]))
    assert raw.tolist() == pytest.approx([0.9, 0.2]) and correct.tolist() == [True, False]
    monkeypatch.setattr(ner, "predict", lambda docs: space)
    raw, correct, seen = raw_outcomes(nlp, "fsemicrf_ner", _read(nlp, [gold]))
    assert raw.size == correct.size == seen.size == 0


def test_a_gold_entity_found_by_two_predicted_entities_counts_one_as_the_scorer_does(
        small_nlp, tmp_path, monkeypatch):
    """The pipeline splits "500mg", one gold token of a LOC, into "500" and "mg": a prediction
    of each aligns to the gold entity. spaCy's scorer counts the first right and the second
    wrong (precision 0.5); the fit counted both right."""
    from spacy_fsemicrf.head_model import BatchPrediction

    nlp = _copy(small_nlp, tmp_path)
    ner = nlp.get_pipe("fsemicrf_ner")
    loc = ner.labels.index("LOC") + 1
    gold = Doc(nlp.vocab, words=["took", "500mg", "daily"])
    gold.set_ents([Span(gold, 1, 2, "LOC")], default="outside")
    example = _read(nlp, [gold])[0]
    assert [t.text for t in example.predicted] == ["took", "500", "mg", "daily"]
    decoded = BatchPrediction(numpy.array([[0, 1, 1, loc], [0, 2, 2, loc]]),
                              numpy.array([0.9, 0.8], "float32"), numpy.ones(1, "float32"))
    monkeypatch.setattr(ner, "predict", lambda docs: decoded)
    raw, correct, _ = raw_outcomes(nlp, "fsemicrf_ner", [example])
    assert raw.tolist() == pytest.approx([0.9, 0.8]) and correct.tolist() == [True, False]
    predicted = example.predicted.copy()
    predicted.ents = [Span(predicted, 1, 2, "LOC"), Span(predicted, 2, 3, "LOC")]
    assert get_ner_prf([Example(predicted, gold)])["ents_p"] == correct.mean()


def test_the_command_saves_nothing_without_entities_to_fit(small_nlp, tmp_path, capsys):
    """It crashed on a pipeline without a map, and on one with a map reported the old map's
    counts as a new fit and saved the pipeline again."""
    small_nlp.to_disk(tmp_path / "model")
    bare = DocBin(docs=[small_nlp.make_doc(t) for t, _ in TRAIN_DATA])
    bare.to_disk(tmp_path / "bare.spacy")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "model").rglob("*"))
    assert calibration.main([str(tmp_path / "model"), str(tmp_path / "bare.spacy")]) == 1
    err = capsys.readouterr().err
    assert "no predicted entity in the annotated documents" in err
    assert err.splitlines()[-1] == "nothing saved"
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (tmp_path / "model").rglob("*")) == before


def test_threshold_drops_low_scores_and_zero_keeps_every_decision(small_nlp, tmp_path):
    texts = [t for t, _ in TRAIN_DATA]
    nlp = _copy(small_nlp, tmp_path)
    before = list(nlp.pipe(texts))
    assert _ents(list(_copy(small_nlp, tmp_path, "zero", threshold=0.0).pipe(texts))) == _ents(before)
    scores = numpy.concatenate([d.spans["fsemicrf"].attrs["scores"] for d in before])
    cut = float(numpy.sort(scores)[len(scores) // 2])  # a score itself: kept, as >= says
    thresholded = list(_copy(small_nlp, tmp_path, "cut", threshold=cut).pipe(texts))
    for doc, full in zip(thresholded, before):
        group, kept = doc.spans["fsemicrf"], full.spans["fsemicrf"]
        expected = [(s.start, s.end, s.label_) for s, v in zip(kept, kept.attrs["scores"]) if v >= cut]
        assert [(s.start, s.end, s.label_) for s in group] == expected
        assert [(e.start, e.end, e.label_) for e in doc.ents] == expected
        assert numpy.all(group.attrs["scores"] >= cut)
        assert group.attrs["path_probability"] == full.spans["fsemicrf"].attrs["path_probability"]


def test_candidates_hold_the_kept_nodes_with_their_scores(small_nlp, tmp_path):
    nlp = _copy(small_nlp, tmp_path, candidates_key="cands", filter_margin=2.0)
    docs = list(nlp.pipe([t for t, _ in TRAIN_DATA]))
    n_more = 0
    for doc in docs:
        ents, cands = doc.spans["fsemicrf"], doc.spans["cands"]
        assert (ents.name, cands.name) == ("fsemicrf", "cands")
        scores = dict(zip([(s.start, s.end, s.label_) for s in cands], cands.attrs["scores"]))
        for span, score in zip(ents, ents.attrs["scores"]):
            assert scores[(span.start, span.end, span.label_)] == pytest.approx(score, rel=1e-5)
        assert numpy.all((cands.attrs["scores"] >= 0) & (cands.attrs["scores"] <= 1))
        n_more += len(cands) - len(ents)
    assert n_more > 0  # a wider filter keeps nodes that the best paths leave out
    assert "cands" not in list(small_nlp.pipe(["Mary flew to Berlin ."]))[0].spans


@pytest.mark.parametrize("arch", ["SemiCRF", "LinearCRF"])
def test_candidates_and_path_probability_of_the_baseline_heads(arch, tmp_path):
    nlp = spacy.blank("en")
    nlp.add_pipe("fsemicrf_ner", config={"model": model_config(f"spacy-fsemicrf.{arch}.v1"),
                                         "candidates_key": "cands"})
    train_pipeline(nlp, make_examples(nlp), n_iter=10)
    for doc in nlp.pipe([t for t, _ in TRAIN_DATA] + [""]):
        ents, cands = doc.spans["fsemicrf"], doc.spans["cands"]
        assert {(s.start, s.end, s.label_) for s in ents} <= {(s.start, s.end, s.label_) for s in cands}
        assert numpy.all(cands.attrs["scores"] >= 0) and numpy.all(cands.attrs["scores"] <= 1)
        assert 0 < ents.attrs["path_probability"] <= 1
        if not len(doc):
            assert ents.attrs["path_probability"] == 1.0


def test_settings_round_trip_through_config_and_disk(small_nlp, tmp_path):
    nlp = _copy(small_nlp, tmp_path, threshold=0.25, candidates_key="cands")
    ner = nlp.get_pipe("fsemicrf_ner")
    assert (ner.threshold, ner.candidates_key) == (0.25, "cands")
    assert nlp.config["components"]["fsemicrf_ner"]["threshold"] == 0.25
    assert nlp.config["components"]["fsemicrf_ner"]["candidates_key"] == "cands"
    nlp.to_disk(tmp_path / "saved")
    loaded = spacy.load(tmp_path / "saved").get_pipe("fsemicrf_ner")
    assert (loaded.threshold, loaded.candidates_key) == (0.25, "cands")
    override = {"components": {"fsemicrf_ner": {"threshold": 0.5, "candidates_key": None}}}
    changed = spacy.load(tmp_path / "saved", config=override).get_pipe("fsemicrf_ner")
    assert (changed.threshold, changed.candidates_key) == (0.5, None)
    restored = spacy.blank("en").add_pipe("fsemicrf_ner", config={"model": small_model()})
    restored.from_bytes(ner.to_bytes())
    assert restored.threshold == 0.0  # bytes carry the model and the map, not the settings
    for bad in ({"threshold": 1.5}, {"candidates_key": "fsemicrf"}, {"candidates_key": ""}):
        with pytest.raises(ValueError):
            spacy.blank("en").add_pipe("fsemicrf_ner", config={"model": small_model(), **bad})
    # a string threshold is refused by the component; through a config, spaCy 3.7's validation
    # turns "0.5" into 0.5 before the component sees it
    with pytest.raises(ValueError, match="threshold must be a number"):
        restored.threshold = "0.5"
    string_config = {"model": small_model(), "threshold": "0.5"}
    if spacy.util.is_minor_version_match(spacy.__version__, "3.7"):
        assert spacy.blank("en").add_pipe("fsemicrf_ner", config=string_config).threshold == 0.5
    else:
        with pytest.raises(ValueError):
            spacy.blank("en").add_pipe("fsemicrf_ner", config=string_config)


def test_a_pipeline_without_a_map_gives_raw_scores_and_warns_once(small_nlp, tmp_path, caplog):
    nlp = _copy(small_nlp, tmp_path)
    assert nlp.get_pipe("fsemicrf_ner").calibration is None
    (tmp_path / "old").mkdir()
    nlp.to_disk(tmp_path / "old")
    cfg = tmp_path / "old" / "fsemicrf_ner" / "cfg"
    saved = srsly.read_json(cfg)
    del saved["calibration"]  # as saved before the maps existed
    srsly.write_json(cfg, saved)
    old = spacy.load(tmp_path / "old")
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        docs = list(old.pipe([t for t, _ in TRAIN_DATA])) + [old("Mary flew to Berlin .")]
    assert [r.getMessage() for r in caplog.records if "calibration" in r.getMessage()] == [
        "fsemicrf_ner: the pipeline has no calibration map, so doc.spans['fsemicrf'].attrs"
        "['scores'] are the raw confidences of the head (not calibrated). Fit one on a "
        "development set: python -m spacy_fsemicrf calibrate MODEL DEV.spacy"]
    assert any(len(doc.ents) for doc in docs)
    expected = list(small_nlp.pipe([t for t, _ in TRAIN_DATA]))
    assert _ents(docs[:-1]) == _ents(expected)


def test_no_warning_about_the_map_while_training_but_once_after_loading(small_nlp, caplog):
    """A pipeline being trained has no map until it is saved (the shipped configs fit one
    then), so its evaluations in `spacy train` do not warn; loaded without one, here from
    bytes into an initialized pipeline, it warns on its first entities."""
    texts = [t for t, _ in TRAIN_DATA]
    assert small_nlp.get_pipe("fsemicrf_ner").calibration is None
    loaded = spacy.blank("en")
    loaded.add_pipe("fsemicrf_ner", config={"model": small_model()})
    loaded.initialize(lambda: make_examples(loaded))
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        assert any(doc.ents for doc in small_nlp.pipe(texts))
        list(loaded.pipe(texts))  # initialized, not yet loaded
        assert not [r for r in caplog.records if "calibration map" in r.getMessage()]
        loaded.from_bytes(small_nlp.to_bytes())
        # a loaded pipeline trained on, as a sourced component in spacy train (which does not
        # initialize it): no warning at its evaluations either
        loaded.update(make_examples(loaded)[:1])
        list(loaded.pipe(texts))
        assert not [r for r in caplog.records if "calibration map" in r.getMessage()]
        loaded.from_bytes(small_nlp.to_bytes())
        list(loaded.pipe(texts))
        list(loaded.pipe(texts))
    assert len([r for r in caplog.records if "calibration map" in r.getMessage()]) == 1


NOVELTY_MAP = {"method": "by_novelty",  # seen entities score 0.9, unseen ones 0.2
               "seen": {"method": "isotonic", "x": [0.0], "y": [0.9]},
               "unseen": {"method": "isotonic", "x": [0.0], "y": [0.2]}}
NEW_NAMES = ["Laura Palmer met Zoe Quill in Berlin .", "Kevin Smythe flew to Oslo .",
             "Apple hired Anna Lee in Paris ."]


def test_the_training_entities_are_recorded_and_saved(small_nlp, tmp_path):
    ner = small_nlp.get_pipe("fsemicrf_ner")
    texts = {small_nlp.make_doc(t).char_span(a, b).text for t, ents in TRAIN_DATA for a, b, _ in ents}
    assert ner.seen_entities.tolist() == sorted({entity_key(t) for t in texts})
    small_nlp.to_disk(tmp_path / "saved")
    assert (tmp_path / "saved" / "fsemicrf_ner" / "seen_entities").stat().st_size == 8 * len(texts)
    for loaded in (spacy.load(tmp_path / "saved").get_pipe("fsemicrf_ner"),
                   spacy.blank("en").add_pipe("fsemicrf_ner", config={"model": small_model()})
                   .from_bytes(ner.to_bytes())):
        assert loaded.seen_entities.tolist() == ner.seen_entities.tolist()
    fresh = spacy.blank("en").add_pipe("fsemicrf_ner", config={"model": small_model()})
    fresh.from_bytes(ner.to_bytes(exclude=["seen_entities"]))
    assert fresh.seen_entities.size == 0
    (tmp_path / "saved" / "fsemicrf_ner" / "seen_entities").unlink()  # saved before they were
    assert spacy.load(tmp_path / "saved").get_pipe("fsemicrf_ner").seen_entities.size == 0
    (tmp_path / "saved" / "fsemicrf_ner" / "seen_entities").write_bytes(b"12345")
    with pytest.raises(ValueError, match="64-bit hashes"):
        spacy.load(tmp_path / "saved")
    ner2 = _copy(small_nlp, tmp_path).get_pipe("fsemicrf_ner")
    ner2.record_seen_entities([small_nlp.make_doc("Zoe Quill")])
    assert ner2.seen_entities.size == 0  # a doc without entities: nothing seen
    docs = [eg.reference for eg in make_examples(small_nlp)][:2]
    ner2.record_seen_entities(docs)
    assert ner2.seen_entities.tolist() == sorted({entity_key(e.text) for d in docs for e in d.ents})


def test_seen_entities_saved_in_another_order_load_sorted(small_nlp, tmp_path):
    """Seen entities are looked up by bisection: a file of them in another order (written by
    another tool, or edited) loaded as it was, and entities seen in training counted as new."""
    ner = small_nlp.get_pipe("fsemicrf_ner")
    small_nlp.to_disk(tmp_path / "saved")
    path = tmp_path / "saved" / "fsemicrf_ner" / "seen_entities"
    keys = numpy.frombuffer(path.read_bytes(), dtype="<u8")
    path.write_bytes(numpy.concatenate([keys[::-1], keys[:1]]).astype("<u8").tobytes())
    doc = make_examples(small_nlp)[0].reference
    rows = numpy.array([[0, e.start, e.end - 1, 1] for e in doc.ents])
    for loaded in (spacy.load(tmp_path / "saved").get_pipe("fsemicrf_ner"),
                   spacy.blank("en").add_pipe("fsemicrf_ner", config={"model": small_model()})
                   .from_disk(tmp_path / "saved" / "fsemicrf_ner", exclude=["vocab"])):
        assert loaded.seen_entities.tolist() == ner.seen_entities.tolist()
        assert seen_flags([doc], rows, loaded.seen_entities).all()


def test_a_map_by_novelty_scores_seen_and_unseen_entities_apart(small_nlp, tmp_path):
    nlp = _copy(small_nlp, tmp_path, candidates_key="cands", filter_margin=2.0)
    ner = nlp.get_pipe("fsemicrf_ner")
    seen_texts = {e.text for eg in make_examples(nlp) for e in eg.reference.ents}
    raw_docs = list(nlp.pipe(NEW_NAMES + [t for t, _ in TRAIN_DATA]))
    ner.calibration = NOVELTY_MAP
    docs = list(nlp.pipe(NEW_NAMES + [t for t, _ in TRAIN_DATA]))
    assert _ents(docs) == _ents(raw_docs)
    found = Counter()
    for doc in docs:
        for key in ("fsemicrf", "cands"):
            group = doc.spans[key]
            expected = [0.9 if span.text in seen_texts else 0.2 for span in group]
            found.update(expected)
            assert group.attrs["scores"].tolist() == pytest.approx(expected)
    assert found[0.9] and found[0.2]
    nlp.to_disk(tmp_path / "novelty")
    again = list(spacy.load(tmp_path / "novelty").pipe(NEW_NAMES))
    for doc, other in zip(docs, again):
        assert other.spans["fsemicrf"].attrs["scores"].tolist() == doc.spans["fsemicrf"].attrs["scores"].tolist()


def test_a_map_by_novelty_loaded_without_the_seen_entities_warns(small_nlp, tmp_path, caplog):
    """Without the seen entities every entity would be calibrated as new, silently: loading
    such a pipeline (the file missing, or excluded) says so; a whole one loads quietly."""
    nlp = _copy(small_nlp, tmp_path)
    nlp.get_pipe("fsemicrf_ner").calibration = NOVELTY_MAP
    nlp.to_disk(tmp_path / "novelty")
    warning = "every entity is calibrated as new"
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        spacy.load(tmp_path / "novelty")
        assert warning not in caplog.text
        (tmp_path / "novelty" / "fsemicrf_ner" / "seen_entities").unlink()
        spacy.load(tmp_path / "novelty")
    assert [r.getMessage() for r in caplog.records] == [
        "fsemicrf_ner: the calibration map calibrates entities seen in training apart from new "
        "ones, but the pipeline has no seen_entities (its file is missing or was excluded): "
        "every entity is calibrated as new. Save the pipeline with them, or fit a map again."]
    caplog.clear()
    fresh = spacy.blank("en").add_pipe("fsemicrf_ner", config={"model": small_model()})
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        fresh.from_bytes(nlp.get_pipe("fsemicrf_ner").to_bytes(exclude=["seen_entities"]))
    assert caplog.text.count(warning) == 1


def test_a_pipeline_without_seen_entities_loaded_over_a_trained_one_has_none(
        small_nlp, tmp_path, caplog):
    """Loading in place (``from_disk``, ``from_bytes``) over a component that has seen entities
    of its own, as a service reloading its pipeline does: one saved without them loads with
    none, and warns, not with those of the weights it replaced, which would flag its entities
    seen or unseen by another training set and calibrate them silently wrong."""
    saved = _copy(small_nlp, tmp_path, name="saved").get_pipe("fsemicrf_ner")
    saved.calibration = NOVELTY_MAP
    saved.to_disk(tmp_path / "without")
    (tmp_path / "without" / "seen_entities").unlink()
    data = srsly.msgpack_loads(saved.to_bytes())
    del data["seen_entities"]
    loads = [lambda ner: ner.from_disk(tmp_path / "without"),
             lambda ner: ner.from_bytes(srsly.msgpack_dumps(data))]
    for load in loads:
        ner = _copy(small_nlp, tmp_path).get_pipe("fsemicrf_ner")
        assert ner.seen_entities.size
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
            load(ner)
        assert ner.seen_entities.size == 0
        assert caplog.text.count("every entity is calibrated as new") == 1


def test_the_training_callback_fits_on_the_dev_path_only(tmp_path, monkeypatch):
    """The shipped config's callback fits a map at each save, from the dev file alone; the
    evaluations during training see no map (each follows an update, which drops the last
    save's map: with a threshold, a stale map scored the dev set wrongly and stopped training
    early)."""
    from spacy_fsemicrf.component import FSemiCRFEntityRecognizer

    nlp = spacy.blank("en")
    train_path = write_corpus(tmp_path / "train.spacy", nlp, repeat=2)
    dev_path = write_corpus(tmp_path / "dev.spacy", nlp)
    (tmp_path / "test.spacy").write_bytes(b"not a corpus: reading it fails")
    read = []
    from_disk = DocBin.from_disk
    monkeypatch.setattr(DocBin, "from_disk", lambda self, path: read.append(str(path)) or from_disk(self, path))
    maps_at_evaluation = []
    set_annotations = FSemiCRFEntityRecognizer.set_annotations
    monkeypatch.setattr(FSemiCRFEntityRecognizer, "set_annotations", lambda self, *args: (
        maps_at_evaluation.append(self.calibration), set_annotations(self, *args))[1])
    overrides = _overrides(train_path, dev_path, **{
        "training.max_steps": 20, "training.eval_frequency": 10,
        "components.fsemicrf_ner.threshold": 0.5,
    })
    train(CONFIGS / "fsemicrf_cnn.cfg", tmp_path / "out", overrides=overrides)
    assert str(tmp_path / "test.spacy") not in read
    assert read.count(str(dev_path)) >= 1
    assert len(maps_at_evaluation) >= 3 and all(m is None for m in maps_at_evaluation)
    train_texts = {e.text for d in DocBin().from_disk(train_path).get_docs(nlp.vocab) for e in d.ents}
    for name in ("model-last", "model-best"):
        ner = spacy.load(tmp_path / "out" / name).get_pipe("fsemicrf_ner")
        assert ner.calibration is not None and ner.calibration["n_entities"] > 0
        assert ner.seen_entities.tolist() == sorted({entity_key(t) for t in train_texts})


def test_an_update_drops_the_map_of_the_old_weights(small_nlp, tmp_path):
    nlp = _copy(small_nlp, tmp_path)
    examples = make_examples(nlp)
    calibrate_component(nlp, "fsemicrf_ner", examples)
    assert nlp.get_pipe("fsemicrf_ner").calibration is not None
    nlp.update(examples[:2])
    assert nlp.get_pipe("fsemicrf_ner").calibration is None


def test_the_callback_finds_the_component_by_its_factory(small_nlp, tmp_path):
    """Named otherwise (say ``ner``), the component was not found by the shipped config's
    callback, while the calibrate command found it."""
    nlp = _copy(small_nlp, tmp_path)
    nlp.rename_pipe("fsemicrf_ner", "ner")
    dev = write_corpus(tmp_path / "dev.spacy", nlp)
    make_calibrate_callback(str(dev))(nlp)
    assert nlp.get_pipe("ner").calibration["n_entities"] > 0
    with pytest.raises(ValueError, match="has no fsemicrf_ner component"):
        make_calibrate_callback(str(dev))(spacy.blank("en"))


def test_the_callback_calibrates_every_fsemicrf_ner_component_or_the_one_named(small_nlp,
                                                                               tmp_path):
    """With two components and no ``component`` the callback raised at the first save of
    ``spacy train``, which then saved nothing."""
    nlp = _copy(small_nlp, tmp_path)
    # sourced from another copy: a component sourced from nlp itself is the same object
    nlp.add_pipe("fsemicrf_ner", name="second", source=_copy(small_nlp, tmp_path, "other"))
    examples = make_examples(nlp)
    nlp.update(examples[:2], exclude=["fsemicrf_ner"])  # different weights: different maps
    dev = write_corpus(tmp_path / "dev.spacy", nlp)
    make_calibrate_callback(str(dev))(nlp)
    maps = {name: nlp.get_pipe(name).calibration for name in ("fsemicrf_ner", "second")}
    assert maps["fsemicrf_ner"] != maps["second"]
    for name, fitted in maps.items():
        assert fitted is not None and calibrate_component(nlp, name, examples) == fitted
    for name in maps:
        nlp.get_pipe(name).calibration = None
    make_calibrate_callback(str(dev), "second")(nlp)
    assert nlp.get_pipe("fsemicrf_ner").calibration is None
    assert nlp.get_pipe("second").calibration == maps["second"]


def _assert_same_map(saved, fitted) -> None:
    """A calibration map as saved (numbers to 9 decimals) is the fitted one, key by key, at
    any depth (a map per kind of entity holds two maps)."""
    assert type(saved) is type(fitted) or {type(saved), type(fitted)} <= {int, float}
    if isinstance(fitted, dict):
        assert saved.keys() == fitted.keys()
        for key in fitted:
            _assert_same_map(saved[key], fitted[key])
    elif isinstance(fitted, list):
        assert len(saved) == len(fitted)
        for a, b in zip(saved, fitted):
            _assert_same_map(a, b)
    elif isinstance(fitted, float):
        assert saved == pytest.approx(fitted, abs=1e-8)
    else:
        assert saved == fitted


def test_the_command_calibrates_every_fsemicrf_ner_component(small_nlp, tmp_path, capsys,
                                                              monkeypatch):
    """With two components the command asked for ``--component`` and fitted only that one."""
    nlp = _copy(small_nlp, tmp_path)
    nlp.add_pipe("fsemicrf_ner", name="second", source=_copy(small_nlp, tmp_path, "other"))
    nlp.update(make_examples(nlp)[:2], exclude=["fsemicrf_ner"])
    nlp.to_disk(tmp_path / "model")
    dev = write_corpus(tmp_path / "dev.spacy", nlp)
    assert calibration.main([str(tmp_path / "model"), str(dev)]) == 0
    loaded = spacy.load(tmp_path / "model")
    out = capsys.readouterr().out
    for name in ("fsemicrf_ner", "second"):
        expected = calibrate_component(nlp, name, Corpus(dev)(nlp))
        saved = loaded.get_pipe(name).calibration
        assert saved["n_entities"] == expected["n_entities"] > 0
        _assert_same_map(saved, expected)  # (whichever method the selection took)
        assert f"{name}: calibration map (" in out
    assert f"saved to {tmp_path / 'model'}" in out.splitlines()
    with pytest.raises(SystemExit):  # a KeyError's traceback before
        calibration.main([str(tmp_path / "model"), str(dev), "--component", "ner"])
    assert (f"error: {tmp_path / 'model'} has no fsemicrf_ner component named 'ner' (its "
            f"components: {nlp.pipe_names})") in capsys.readouterr().err
    with pytest.raises(SystemExit):  # no fsemicrf_ner component
        spacy.blank("en").to_disk(tmp_path / "blank")
        calibration.main([str(tmp_path / "blank"), str(dev)])
    assert (f"error: {tmp_path / 'blank'} has no fsemicrf_ner component at all (its "
            "components: [])") in capsys.readouterr().err
    # one component named: only it is fitted; one of two without entities: saved, exit status 1
    assert calibration.main([str(tmp_path / "model"), str(dev), "--component", "second"]) == 0
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()
            if "calibration map" in line] == ["second"]
    fit = calibration.calibrate_component
    monkeypatch.setattr(calibration, "calibrate_component",
                        lambda nlp, name, examples: None if name == "second" else fit(
                            nlp, name, examples))
    assert calibration.main([str(tmp_path / "model"), str(dev)]) == 1
    captured = capsys.readouterr()
    assert "second: no predicted entity in the annotated documents" in captured.err
    assert f"saved to {tmp_path / 'model'}" in captured.out.splitlines()


def test_the_callback_reads_its_file_once(small_nlp, tmp_path, monkeypatch):
    nlp = _copy(small_nlp, tmp_path)
    dev = write_corpus(tmp_path / "dev.spacy", nlp)
    callback = make_calibrate_callback(str(dev), "fsemicrf_ner")
    read = []
    from_disk = DocBin.from_disk
    monkeypatch.setattr(DocBin, "from_disk",
                        lambda self, path: read.append(str(path)) or from_disk(self, path))
    assert callback(nlp) is nlp and callback(nlp) is nlp
    assert read == [str(dev)]
    assert nlp.get_pipe("fsemicrf_ner").calibration["n_entities"] > 0


def test_the_command_calibrates_a_saved_pipeline(small_nlp, tmp_path, capsys):
    small_nlp.to_disk(tmp_path / "model")
    dev = write_corpus(tmp_path / "dev.spacy", small_nlp)
    calibration.main([str(tmp_path / "model"), str(dev), "--output", str(tmp_path / "calibrated")])
    fitted = spacy.load(tmp_path / "calibrated").get_pipe("fsemicrf_ner").calibration
    assert fitted["n_entities"] > 0 and "calibration map (" in capsys.readouterr().out
    assert spacy.load(tmp_path / "model").get_pipe("fsemicrf_ner").calibration is None
    calibration.main([str(tmp_path / "model"), str(dev)])  # in place
    assert spacy.load(tmp_path / "model").get_pipe("fsemicrf_ner").calibration is not None
    with pytest.raises(SystemExit):
        calibration.main(["no_such_package", str(dev)])
    assert ("error: no such pipeline: no_such_package (neither a directory nor an installed "
            "package)") in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a file, which cannot be saved to in place
        calibration.main([str(dev), str(dev)])
    assert f"error: {dev} is not a directory: give --output" in capsys.readouterr().err
    # --train records the training entities of a pipeline saved without them
    (tmp_path / "model" / "fsemicrf_ner" / "seen_entities").unlink()
    train_docs = write_corpus(tmp_path / "train.spacy", small_nlp)
    calibration.main([str(tmp_path / "model"), str(dev), "--train", str(train_docs)])
    expected = small_nlp.get_pipe("fsemicrf_ner").seen_entities.tolist()
    assert spacy.load(tmp_path / "model").get_pipe("fsemicrf_ner").seen_entities.tolist() == expected


def test_the_command_help_names_the_command_and_says_what_each_argument_is(capsys):
    """``--help`` shows the command as it is run, what it does and what each argument is."""
    with pytest.raises(SystemExit):
        calibration.main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert shown.startswith("usage: python -m spacy_fsemicrf calibrate [-h]")
    for text in (
        "Fit the score calibration map of a trained fsemicrf_ner pipeline on a development "
        "corpus (never the test set) and save the pipeline with it.",
        "model the trained pipeline (a directory or a package name)",
        "dev held-out documents with gold entities (a .spacy file or a directory of them)",
        "--output OUTPUT where to save (default: MODEL)",
        "--component COMPONENT the fsemicrf_ner component to calibrate (default: every one)",
        "--train TRAIN the training corpus (.spacy): record the entity texts seen in training, "
        "for a pipeline trained before the component recorded them",
    ):
        assert text in shown


def test_the_command_names_a_missing_corpus_before_loading_the_pipeline(capsys, monkeypatch):
    monkeypatch.setattr(calibration.spacy, "load", lambda *a, **k: pytest.fail("loaded"))
    for argv in (["model", "no_such_dev.spacy"],
                 ["model", __file__, "--train", "no_such_train.spacy"]):
        with pytest.raises(SystemExit) as exit_info:
            calibration.main(argv)
        assert exit_info.value.code == 2
        assert f"error: no such corpus file: {argv[-1]}" in capsys.readouterr().err


def _confidence_script():
    spec = importlib.util.spec_from_file_location(
        "confidence_script", Path(__file__).parent.parent / "scripts" / "confidence.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_measures():
    script = _confidence_script()
    scores = numpy.array([0.95, 0.95, 0.75, 0.35, 0.05])
    correct = numpy.array([True, False, True, True, False])
    # bins: 0.9-1.0 holds 2 (score 0.95, accuracy 0.5), 0.7-0.8: 1 (0.75, 1), 0.3-0.4: 1, 0.0-0.1: 1
    expected = (2 * 0.45 + 0.25 + 0.65 + 0.05) / 5
    assert script.ece(scores, correct) == pytest.approx(expected)
    thresholds, precision, recall, area = script.pr_curve(scores, correct, n_gold=4)
    assert thresholds.tolist() == [0.95, 0.75, 0.35, 0.05]  # ties enter together
    assert precision.tolist() == pytest.approx([1 / 2, 2 / 3, 3 / 4, 3 / 5])
    assert recall.tolist() == pytest.approx([1 / 4, 2 / 4, 3 / 4, 3 / 4])
    assert area == pytest.approx(0.25 * (1 / 2 + 2 / 3 + 3 / 4))
    out = script.summary(scores, correct, n_gold=4)
    assert out["brier"] == pytest.approx(numpy.mean((scores - correct) ** 2))
    assert out["share_ge_0999"] == 0.0 and out["n_correct"] == 3
    assert out["pr_curve"][0] == {"threshold": 0.0, "precision": 0.6, "recall": 0.75}


def test_the_callback_reports_a_poor_fit_at_its_first_save_only(small_nlp, tmp_path, caplog):
    """spacy train saves after every evaluation: the warnings about a small dev set came at
    each save."""
    nlp = _copy(small_nlp, tmp_path)
    dev_path = write_corpus(tmp_path / "dev.spacy", nlp)
    callback = make_calibrate_callback(dev_path)
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        for _ in range(3):
            callback(nlp)
    assert nlp.get_pipe("fsemicrf_ner").calibration is not None
    assert len([r for r in caplog.records if "predicted entities only" in r.getMessage()]) == 1


def test_the_callback_reports_documents_without_annotation_at_its_first_save_only(
        small_nlp, tmp_path, caplog):
    """Like the poor-fit warnings, the count of dev documents without entity annotation came
    at every save of ``spacy train`` (after every evaluation)."""
    nlp = _copy(small_nlp, tmp_path)
    gold = [eg.reference for eg in make_examples(nlp)]
    DocBin(docs=gold + [nlp.make_doc(doc.text) for doc in gold[:2]]).to_disk(tmp_path / "d.spacy")
    callback = make_calibrate_callback(str(tmp_path / "d.spacy"))
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        for _ in range(3):
            callback(nlp)
    assert nlp.get_pipe("fsemicrf_ner").calibration is not None
    assert len([r for r in caplog.records if "no entity annotation" in r.getMessage()]) == 1


def test_the_callback_names_itself_when_its_dev_path_cannot_be_read(small_nlp, tmp_path):
    """With a corpus reader of the user's own (say JSONL), ``${paths.dev}`` is no DocBin: the
    first save of ``spacy train`` failed with spaCy's bare E1014 and saved nothing."""
    nlp = _copy(small_nlp, tmp_path)
    (tmp_path / "dev.jsonl").write_text('{"text": "Apple is in London ."}\n')
    (tmp_path / "dev.spacy").write_text('{"text": "Apple is in London ."}\n')
    paths = [tmp_path / "dev.jsonl", tmp_path / "dev.spacy", tmp_path / "missing.spacy"]
    for path in paths:
        with pytest.raises(ValueError, match=r"^spacy-fsemicrf.calibrate.v1") as err:
            with warnings.catch_warnings():  # spaCy's W090: no .spacy file at dev.jsonl
                warnings.simplefilter("ignore")
                make_calibrate_callback(path)(nlp)
        assert f"(dev_path {path})" in str(err.value)


JSONL_READER = "spacy-fsemicrf.test_jsonl_reader.v1"


@spacy.registry.readers(JSONL_READER)
def jsonl_reader(path: str):
    """A corpus reader of a user's own: JSON lines of a text and its entities' offsets."""
    def read(nlp):
        for line in srsly.read_jsonl(path):
            yield Example.from_dict(nlp.make_doc(line["text"]), {"entities": line["entities"]})

    return read


def test_spacy_train_fits_the_map_on_the_dev_corpus_of_a_reader_of_its_own(tmp_path):
    """``[corpora.dev]`` a reader of the user's own (here JSONL): the callback read dev_path
    as .spacy files, and the first save of ``spacy train`` failed. It reads the examples that
    the evaluations score, from the reader that ``[training] dev_corpus`` names."""
    train_path = write_corpus(tmp_path / "train.spacy", spacy.blank("en"), repeat=2)
    dev_path = tmp_path / "dev.jsonl"
    srsly.write_jsonl(dev_path, [{"text": t, "entities": e} for t, e in TRAIN_DATA[2:]])
    config = (CONFIGS / "fsemicrf_cnn.cfg").read_text()
    corpus_v1 = re.search(r"\[corpora\.dev\]\n.*?\n\n", config, re.DOTALL).group()
    assert "spacy.Corpus.v1" in corpus_v1
    reader = f'[corpora.dev]\n@readers = "{JSONL_READER}"\npath = ${{paths.dev}}\n\n'
    (tmp_path / "config.cfg").write_text(config.replace(corpus_v1, reader))
    overrides = _overrides(train_path, dev_path, **{"training.max_steps": 20,
                                                    "training.eval_frequency": 10})
    train(tmp_path / "config.cfg", tmp_path / "out", overrides=overrides)
    nlp = spacy.load(tmp_path / "out" / "model-last")
    saved = nlp.get_pipe("fsemicrf_ner").calibration
    expected = calibrate_component(nlp, "fsemicrf_ner", jsonl_reader(str(dev_path))(nlp))
    assert saved["n_entities"] == expected["n_entities"] > 0
    assert (saved["n_correct"], saved["method"]) == (expected["n_correct"], expected["method"])


def test_the_callback_reads_the_dev_corpus_of_the_config_as_overridden(small_nlp, tmp_path):
    """Without dev_path the callback reads ``[training] dev_corpus`` of the pipeline's config,
    which ``spacy train`` leaves uninterpolated, its command-line overrides applied: the
    ``--paths.dev`` given, not the config's own."""
    nlp = _copy(small_nlp, tmp_path)
    examples = make_examples(nlp)
    DocBin(docs=[eg.reference for eg in examples[:3]]).to_disk(tmp_path / "own.spacy")
    DocBin(docs=[eg.reference for eg in examples[3:]]).to_disk(tmp_path / "given.spacy")
    nlp.config["paths"]["dev"] = str(tmp_path / "own.spacy")
    nlp.config.to_disk(tmp_path / "config.cfg")
    # as spacy train loads its config: raw, the overrides applied
    overrides = {"paths.dev": str(tmp_path / "given.spacy")}
    nlp.config = spacy.util.load_config(tmp_path / "config.cfg", overrides=overrides,
                                        interpolate=False)
    assert nlp.config["corpora"]["dev"]["path"] == "${paths.dev}"
    make_calibrate_callback()(nlp)
    fitted = nlp.get_pipe("fsemicrf_ner").calibration
    assert fitted == calibrate_component(nlp, "fsemicrf_ner", examples[3:])
    assert fitted["n_entities"] != calibrate_component(nlp, "fsemicrf_ner",
                                                       examples[:3])["n_entities"]


def test_the_callback_says_why_it_cannot_read_the_dev_corpus_of_the_config(small_nlp, tmp_path):
    """Without dev_path, a config whose dev corpus cannot be resolved or read, or yields no
    examples, fails with a message that names the callback and the way out."""
    nlp = _copy(small_nlp, tmp_path)
    (tmp_path / "empty").mkdir()
    callback = make_calibrate_callback()
    with pytest.raises(ValueError, match=r"cannot resolve it: \[E913\] Corpus path can't be None"):
        callback(nlp)  # a saved pipeline's config: paths.train and paths.dev are null
    nlp.config["paths"].update(train=str(tmp_path / "empty"), dev=str(tmp_path / "empty"))
    with pytest.raises(ValueError, match=r"corpus \(\[training\] dev_corpus corpora.dev\) "
                       r"yields no examples"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # spaCy's W090: no .spacy file there
        callback(nlp)
    nlp.config["training"]["dev_corpus"] = "corpora.held_out"
    with pytest.raises(ValueError, match=r"cannot resolve it: .*corpora.held_out"):
        callback(nlp)
    del nlp.config["training"]["dev_corpus"]
    with pytest.raises(ValueError, match=r"cannot resolve it: \[training\] dev_corpus is None"):
        callback(nlp)
    assert nlp.get_pipe("fsemicrf_ner").calibration is None


def test_a_reader_config_that_does_not_validate_is_named_without_the_whole_config():
    """A dev reader whose settings do not validate fails with thinc's message for that setting
    alone, not followed by the whole config it resolved."""
    nlp = spacy.blank("en")
    nlp.config["paths"]["dev"] = "dev.spacy"
    nlp.config["corpora"]["dev"]["limit"] = "many"
    why = "Config error for 'spacy.Corpus.v1' reader -> limit at root: 'many' is not <class 'int'>"
    with pytest.raises(ValueError, match=re.escape(f"cannot resolve it: {why}. Give the config")):
        calibration.configured_dev_corpus(nlp)


def _dev_directory(gold: List[Doc], tmp_path: Path) -> Path:
    folder = tmp_path / "dev"
    (folder / "part").mkdir(parents=True)
    DocBin(docs=gold[:3]).to_disk(folder / "a.spacy")
    DocBin(docs=gold[3:]).to_disk(folder / "part" / "b.spacy")
    return folder


def _dev_of_another_name(gold: List[Doc], tmp_path: Path) -> Path:
    DocBin(docs=gold).to_disk(tmp_path / "dev.docbin")
    return tmp_path / "dev.docbin"


@pytest.mark.parametrize("write_dev", [_dev_directory, _dev_of_another_name])
def test_the_callback_and_the_command_read_the_dev_data_as_spacy_reads_it(
    small_nlp, tmp_path, write_dev
):
    """The callback's ``dev_path`` and the command's DEV may be a directory of ``.spacy`` files,
    as ``spacy.Corpus.v1`` reads ``--paths.dev`` (``spacy convert`` writes one for a directory of
    inputs: the callback raised IsADirectoryError at the first save of ``spacy train``, which
    then saved no pipeline, and the command refused it), or a DocBin file whose name does not
    end in ``.spacy`` (``dev.docbin``), read as before they took Examples (``Corpus`` reads no
    such file, with a mere warning, and the command saved nothing). Both fit the map that
    :func:`calibrate_component` fits on the same documents."""
    nlp = _copy(small_nlp, tmp_path)
    gold = [eg.reference for eg in make_examples(nlp)]
    dev = write_dev(gold, tmp_path)
    expected = calibrate_component(nlp, "fsemicrf_ner", _read(nlp, gold))
    assert expected["n_entities"] > 0
    nlp.get_pipe("fsemicrf_ner").calibration = None
    make_calibrate_callback(str(dev))(nlp)
    assert nlp.get_pipe("fsemicrf_ner").calibration == expected
    nlp.get_pipe("fsemicrf_ner").calibration = None
    nlp.to_disk(tmp_path / "model")
    out = tmp_path / "calibrated"
    assert calibration.main([str(tmp_path / "model"), str(dev), "--output", str(out)]) == 0
    saved = spacy.load(out).get_pipe("fsemicrf_ner").calibration
    assert (saved["method"], saved["n_entities"]) == (expected["method"], expected["n_entities"])


def test_the_callback_resolves_only_the_dev_reader_of_the_config(small_nlp, tmp_path):
    """A pipeline built and trained in Python, its config's ``paths.dev`` set for the callback
    and ``paths.train`` left null: resolving the whole ``[corpora]`` section failed on the
    train reader (E913, "Corpus path can't be None"), and the message blamed the dev corpus."""
    nlp = _copy(small_nlp, tmp_path)
    examples = make_examples(nlp)
    dev = write_corpus(tmp_path / "dev.spacy", nlp)
    nlp.config["paths"].update(train=None, dev=str(dev))
    make_calibrate_callback()(nlp)
    fitted = nlp.get_pipe("fsemicrf_ner").calibration
    assert fitted is not None and fitted == calibrate_component(nlp, "fsemicrf_ner", examples)


def test_the_fit_gets_the_seen_flags_when_the_component_has_training_entities(
    small_nlp, tmp_path, monkeypatch
):
    """``calibrate_component`` hands the fit each entity's seen flag when the component
    recorded its training entities (so that the fit may choose a map per kind), and none when
    it did not (an older pipeline): the flags are those of :func:`raw_outcomes`."""
    nlp = _copy(small_nlp, tmp_path)
    gold = [eg.reference for eg in make_examples(nlp)]
    examples = _read(nlp, gold)
    ner = nlp.get_pipe("fsemicrf_ner")
    ner.record_seen_entities(gold[:2])  # the others' entities unseen
    raw, correct, seen = calibration.raw_outcomes(nlp, "fsemicrf_ner", examples)
    given = []
    fit = calibration.fit_calibration
    monkeypatch.setattr(calibration, "fit_calibration",
                        lambda *args: given.append(args) or fit(*args))
    assert ner.seen_entities.size and seen.any() and not seen.all()
    calibrate_component(nlp, "fsemicrf_ner", examples)
    ner.seen_entities = ner.seen_entities[:0]
    calibrate_component(nlp, "fsemicrf_ner", examples)
    (raw1, correct1, seen1), (raw2, correct2, seen2) = given
    assert numpy.array_equal(raw1, raw) and numpy.array_equal(correct1, correct)
    assert numpy.array_equal(seen1, seen) and seen2 is None
    assert numpy.array_equal(raw2, raw) and numpy.array_equal(correct2, correct)


def test_the_command_says_what_is_wrong_with_its_paths(small_nlp, tmp_path, capsys):
    """A missing pipeline, an empty corpus directory and a file DocBin cannot read each stop
    the command with a message (before: a misleading "give --output", "no predicted entity"
    in an empty directory, a traceback)."""
    small_nlp.to_disk(tmp_path / "model")
    dev = write_corpus(tmp_path / "dev.spacy", small_nlp)
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.spacy").write_bytes(b"not a DocBin")
    cases = [
        ([str(tmp_path / "no-model"), str(dev)], "no such pipeline"),
        ([str(tmp_path / "model"), str(tmp_path / "empty")], "no .spacy file in"),
        ([str(tmp_path / "model"), str(tmp_path / "bad.spacy")], "cannot read"),
        ([str(tmp_path / "model"), str(dev), "--train", str(tmp_path / "bad.spacy")],
         "cannot read"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info, warnings.catch_warnings():
            warnings.simplefilter("error")  # the message, not spaCy's W090 before it
            calibration.main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert spacy.load(tmp_path / "model").get_pipe("fsemicrf_ner").calibration is None


def test_the_command_says_why_a_pipeline_does_not_load(small_nlp, tmp_path, capsys):
    """A MODEL that is a file (with --output), a directory that holds no pipeline and a pipeline
    with a broken file each stop the command with a message, not a traceback."""
    dev = write_corpus(tmp_path / "dev.spacy", small_nlp)
    (tmp_path / "empty").mkdir()
    small_nlp.to_disk(tmp_path / "broken")
    (tmp_path / "broken" / "meta.json").write_text("{")
    out = str(tmp_path / "out")
    for model in (dev, tmp_path / "empty", tmp_path / "broken"):
        with pytest.raises(SystemExit) as exit_info:
            calibration.main([str(model), str(dev), "--output", out])
        assert exit_info.value.code == 2
        assert f"error: cannot load the pipeline {model}: " in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_command_says_why_it_cannot_save(small_nlp, tmp_path, capsys, monkeypatch):
    """An --output that is a file is refused before the pipeline loads; one that cannot be
    written (here: under a file) is named after the fit, exit status 1, not a traceback."""
    small_nlp.to_disk(tmp_path / "model")
    dev = write_corpus(tmp_path / "dev.spacy", small_nlp)
    (tmp_path / "file").write_text("")
    load = calibration.spacy.load
    monkeypatch.setattr(calibration.spacy, "load", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(SystemExit) as exit_info:
        calibration.main([str(tmp_path / "model"), str(dev), "--output", str(tmp_path / "file")])
    assert exit_info.value.code == 2
    assert f"error: --output {tmp_path / 'file'} is a file" in capsys.readouterr().err
    monkeypatch.setattr(calibration.spacy, "load", load)
    under = tmp_path / "file" / "model"
    assert calibration.main([str(tmp_path / "model"), str(dev), "--output", str(under)]) == 1
    assert f"error: cannot save the pipeline to {under}: " in capsys.readouterr().err


def test_the_confidence_script_names_its_bad_arguments(small_nlp, tmp_path, capsys):
    """A --models entry that is not NAME=PATH of a directory and a missing corpus stop
    scripts/confidence.py with argparse's message before any pipeline loads (before: spaCy's
    traceback, loading "." for a NAME alone)."""
    script = _confidence_script()
    dev = str(write_corpus(tmp_path / "dev.spacy", small_nlp))
    missing = str(tmp_path / "no_such_test.spacy")
    cases = [
        (["--models", "fsemicrf", "--test", dev, "--dev", dev], "--models takes NAME=PATH"),
        (["--models", f"x={tmp_path / 'none'}", "--test", dev, "--dev", dev],
         "--models takes NAME=PATH"),
        (["--models", f"x={tmp_path}", "--test", missing, "--dev", dev],
         f"cannot read {missing} as a .spacy"),
    ]
    package_logger = logging.getLogger("spacy_fsemicrf")
    level = package_logger.level  # main() quiets the package's warnings, for its own process
    try:
        for argv, message in cases:
            with pytest.raises(SystemExit) as exit_info:
                script.main(argv + ["--output", str(tmp_path / "out" / "confidence")])
            assert exit_info.value.code == 2 and message in capsys.readouterr().err
    finally:
        package_logger.setLevel(level)  # the later tests read those warnings
    assert not (tmp_path / "out").exists()
