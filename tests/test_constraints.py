"""Constraints: parsing and validation, the automaton against direct counting, and exact
constrained decoding of the three heads against brute-force enumeration."""
import math
import random

import numpy
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from spacy_fsemicrf.structured import filtered, itemgraphs
from spacy_fsemicrf.structured.constrained import (
    NO_FILTERED_PATH,
    NO_SEGMENTATION,
    ConstrainedDecode,
    ConstraintReport,
    crf_constrained,
    empty_document_report,
    filtered_constrained,
    semicrf_constrained,
)
from spacy_fsemicrf.structured.constraints import (
    MAX_STATES,
    AtLeast,
    AtMost,
    DocConstraints,
    Exactly,
    Excludes,
    ForbidLabels,
    ForceSpan,
    Requires,
    compile_constraints,
    constraints_to_dicts,
    padded_sentence_index,
    parse_constraints,
    satisfies,
    sentence_index,
)
from spacy_fsemicrf.structured.lattice import lattice_search, topk
from spacy_fsemicrf.structured.linear_crf import crf_viterbi, tag_scheme, tags_to_spans
from spacy_fsemicrf.structured.pathsearch import ItemGraph, search
from spacy_fsemicrf.structured.semicrf import semicrf_viterbi
from spacy_fsemicrf.structured.spans import span_mask

from .bruteforce import nonoverlapping_sets, overlap
from .bruteforce_constraints import (
    crf_reference,
    droppable_labels,
    filtered_reference,
    plain_ok,
    maybe_transitions,
    random_constraints,
    random_doc_constraints,
    random_sentence_starts,
    semicrf_reference,
    written_ok,
)

LABELS = ["A", "B", "C"]
TOL = 1e-9

# ----------------------------------------------------------------------------- parsing


EXAMPLES = [
    {"kind": "at_most", "label": "A", "n": 1, "scope": "doc"},
    {"kind": "exactly", "label": "B", "n": 0, "scope": "sentence"},
    {"kind": "at_least", "label": "C", "n": 2, "scope": "doc"},
    {"kind": "excludes", "label": "A", "other": "B", "scope": "sentence"},
    {"kind": "requires", "label": "A", "other": "C", "scope": "doc"},
    {"kind": "forbid_labels", "labels": ["A", "C"], "start": 2, "end": 4},
    {"kind": "forbid_labels", "labels": None, "start": None, "end": None},
    {"kind": "force_span", "start": 0, "end": 2, "label": "B"},
]


def test_dicts_round_trip():
    parsed = parse_constraints(EXAMPLES)
    assert constraints_to_dicts(parsed) == EXAMPLES
    assert parse_constraints(constraints_to_dicts(parsed)) == parsed
    # defaults: doc scope, every label, the whole document
    short = parse_constraints(
        [{"kind": "at_most", "label": "A", "n": 1}, {"kind": "forbid_labels"}]
    )
    assert short == (AtMost("A", 1, "doc"), ForbidLabels(None, None, None))
    assert compile_constraints(parsed, LABELS).constraints == parsed


@pytest.mark.parametrize(
    "item, message",
    [
        ({"kind": "at_mots", "label": "A", "n": 1}, "unknown constraint kind"),
        ({"label": "A", "n": 1}, "unknown constraint kind"),
        ({"kind": "at_most", "label": "A"},
         r"^at_most: missing key\(s\) \['n'\]; expected \['label', 'n', 'scope'\]$"),
        ({"kind": "at_most", "label": "A", "n": 1, "count": 2}, "unknown key"),
        ({"kind": "at_most", "label": "A", "n": -1}, "non-negative"),
        ({"kind": "at_most", "label": "A", "n": 1.5}, "non-negative"),
        ({"kind": "at_most", "label": "A", "n": True}, "non-negative"),
        ({"kind": "exactly", "label": "", "n": 1}, "^label must be a non-empty label name"),
        ({"kind": "at_most", "label": "A", "n": 1, "scope": "paragraph"}, "scope"),
        ({"kind": "excludes", "label": "A", "other": "A"}, "two different labels"),
        ({"kind": "requires", "label": "A"}, r"^requires: missing key\(s\) \['other'\]"),
        ({"kind": "forbid_labels", "labels": "A"}, "list of label names"),
        ({"kind": "forbid_labels", "labels": []},
         r"^labels must name at least one label \(leave it out for all\)$"),
        ({"kind": "forbid_labels", "start": 3, "end": 3}, "end must be after start"),
        ({"kind": "forbid_labels", "start": -1}, "non-negative token offset"),
        ({"kind": "force_span", "start": 2, "end": 1, "label": "A"}, "end must be after start"),
        ({"kind": "force_span", "start": 0, "label": "A"},
         r"^force_span: missing key\(s\) \['end'\]; expected \['end', 'label', 'start'\]$"),
        # each message names the field at fault
        ({"kind": "forbid_labels", "labels": 5}, "labels must be a list of label names"),
        ({"kind": "forbid_labels", "labels": ["A", ""]}, "labels must be a non-empty label name"),
        ({"kind": "forbid_labels", "start": -1}, "start must be a non-negative token offset"),
        ({"kind": "forbid_labels", "end": -1}, "end must be a non-negative token offset"),
        ({"kind": "force_span", "start": None, "end": 2, "label": "A"},
         "start must be a non-negative token offset"),
        ({"kind": "force_span", "start": 0, "end": None, "label": "A"},
         "end must be a non-negative token offset"),
        ({"kind": "force_span", "start": 2, "end": 2, "label": "A"}, "end must be after start"),
        ({"kind": "force_span", "start": 0, "end": 2, "label": ""},
         "label must be a non-empty label name"),
        ({"kind": "excludes", "label": "", "other": "B"}, "^label must be a non-empty label name"),
        ({"kind": "requires", "label": "A", "other": 3}, "^other must be a non-empty label name"),
        ("at_most A 1", "a dict"),
        # malformed values that Python would not hash or order are named, not a TypeError
        ({"kind": ["at_most"], "label": "A", "n": 1}, r"^unknown constraint kind \['at_most'\]"),
        ({"kind": {"at_most": 1}}, "unknown constraint kind"),
        ({"kind": "at_most", "label": "A", "n": 1, 1: 2, "count": 3},
         r"^at_most: unknown key\(s\) \['count', 1\]"),
    ],
)
def test_invalid_constraints(item, message):
    with pytest.raises(ValueError, match=message):
        parse_constraints([item])


def test_integer_fields_take_numpy_integers_and_keep_plain_ints():
    """Offsets often come from arrays (``numpy.int64``): they were refused; they are kept as
    plain ints, which the config's JSON can hold. NumPy bools and floats stay refused."""
    items = [{"kind": "force_span", "start": numpy.int64(1), "end": numpy.int32(3), "label": "A"},
             {"kind": "forbid_labels", "start": numpy.uint8(4), "end": None},
             {"kind": "at_least", "label": "B", "n": numpy.int16(2)}]
    parsed = parse_constraints(items)
    dicts = constraints_to_dicts(parsed)
    assert dicts == [{"kind": "force_span", "start": 1, "end": 3, "label": "A"},
                     {"kind": "forbid_labels", "labels": None, "start": 4, "end": None},
                     {"kind": "at_least", "label": "B", "n": 2, "scope": "doc"}]
    assert all(type(d[k]) is int for d in dicts for k in ("start", "end", "n")
               if d.get(k) is not None)
    for bad in (numpy.True_, numpy.float64(2.0)):
        with pytest.raises(ValueError, match="non-negative"):
            parse_constraints([{"kind": "at_most", "label": "A", "n": bad}])
        with pytest.raises(ValueError, match="start must be a non-negative token offset"):
            parse_constraints([{"kind": "force_span", "start": bad, "end": 5, "label": "A"}])


def test_invalid_against_labels():
    with pytest.raises(ValueError, match="unknown label 'D'"):
        compile_constraints([{"kind": "requires", "label": "A", "other": "D"}], LABELS)
    with pytest.raises(ValueError, match="unknown label 'X'"):
        compile_constraints([{"kind": "forbid_labels", "labels": ["X"]}], LABELS)
    with pytest.raises(ValueError, match="unknown label 'D'"):
        compile_constraints([{"kind": "at_most", "label": "D", "n": 1}], LABELS)
    with pytest.raises(ValueError, match="^constraints must be a list of constraints$"):
        parse_constraints({"kind": "at_most", "label": "A", "n": 1})
    with pytest.raises(ValueError, match="^constraints must be a list of constraints$"):
        parse_constraints(5)
    many = [{"kind": "at_most", "label": x, "n": 9, "scope": "sentence"} for x in LABELS]
    too_many = (f"more than {MAX_STATES} search states; "
                "use fewer count constraints or smaller counts$")
    with pytest.raises(ValueError, match=too_many):
        compile_constraints(many, LABELS)
    # the limit is exact: "at most n" takes n + 1 states
    assert compile_constraints([AtMost("A", MAX_STATES - 1)], LABELS).automaton.n_states == MAX_STATES
    with pytest.raises(ValueError, match=too_many):
        compile_constraints([AtMost("A", MAX_STATES)], LABELS)


@pytest.mark.parametrize(
    "constraint, states",
    [
        (AtMost("A", 2), 3),  # 0, 1, 2 As
        (Exactly("A", 2), 3),
        (AtLeast("A", 2), 3),  # 0, 1, 2 or more
        (Excludes("A", "B"), 3),  # neither, A seen, B seen
        (Requires("A", "B"), 3),  # nothing, an A waiting for a B, a B seen
    ],
)
def test_each_count_constraint_takes_its_fewest_states(constraint, states):
    """The search's cost grows with the automaton's states: each constraint takes no more
    than it needs."""
    assert compile_constraints([constraint], LABELS).automaton.n_states == states


def test_sentence_index():
    """Token 0 always starts a sentence; starts outside the document's inner tokens change
    nothing; the position after the last token counts as a sentence of its own."""
    assert sentence_index(5, (2, 4)).tolist() == [0, 0, 1, 1, 2, 3]
    assert sentence_index(5, (0, 2, 2, 5, 9, -1)).tolist() == [0, 0, 1, 1, 1, 2]
    assert sentence_index(0, (0,)).tolist() == [0]


def test_satisfies_checks_the_entities_trimmed_of_spaces():
    """With ``spaces`` (the whitespace tokens the component trims from its entities) the
    entities are checked as written: edges trimmed, one of spaces only none, forced spans as
    they are."""
    labels = ["A", "B"]
    # tokens 1 and 3 are spaces; "A over 0-1" is written as A over 0
    forbid_2 = compile_constraints([ForbidLabels(("A",), 2, 3)], labels)
    assert satisfies(forbid_2, [(0, 1, 1)], 5, (), (1, 3))
    assert not satisfies(forbid_2, [(0, 1, 1), (2, 2, 1)], 5, (), (1, 3))
    forbid_1 = compile_constraints([ForbidLabels(("A",), 1, 2)], labels)
    assert not satisfies(forbid_1, [(0, 1, 1)], 5)  # untrimmed it covers token 1
    assert satisfies(forbid_1, [(0, 1, 1)], 5, (), (1, 3))
    two = compile_constraints([AtLeast("A", 2, "doc")], labels)
    assert satisfies(two, [(0, 0, 1), (3, 3, 1)], 5)
    assert not satisfies(two, [(0, 0, 1), (3, 3, 1)], 5, (), (1, 3))  # an A of a space only
    assert satisfies(two, [(0, 0, 1), (3, 4, 1)], 5, (), (1, 3))  # written as A over 4
    forced = compile_constraints([AtLeast("A", 2, "doc"), ForceSpan(3, 4, "A")], labels)
    assert satisfies(forced, [(0, 0, 1), (3, 3, 1)], 5, (), (1, 3))  # a forced span stays


def test_satisfies_reads_an_open_forbidden_range_to_the_document_end():
    program = compile_constraints([ForbidLabels(["A"], 2, None)], LABELS)
    assert not satisfies(program, [(4, 4, 1)], 5)  # an A on the last token
    assert satisfies(program, [(4, 4, 2), (0, 1, 1)], 5)  # a B there, an A before the range


# ----------------------------------------------------------------------------- automaton


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 10**6))
def test_automaton_matches_counting(seed):
    """satisfies() (the automaton, the masks' checks) agrees with direct counting on random
    non-overlapping entity sets, for each constraint alone and for all together."""
    rng = random.Random(seed)
    labels = LABELS[: rng.randint(1, 3)]
    length = rng.randint(0, 9)
    constraints = random_constraints(rng, labels, length, rng.randint(1, 4), True)
    starts = random_sentence_starts(rng, length)
    spans, pos = [], 0
    while pos < length:
        if rng.random() < 0.4:
            end = rng.randint(pos, min(length - 1, pos + 2))
            spans.append((pos, end, rng.randint(1, len(labels))))
            pos = end + 1
        else:
            pos += 1
    for subset in [[c] for c in constraints] + [constraints]:
        program = compile_constraints(subset, labels)
        expected = plain_ok(subset, labels, spans, length, starts)
        assert satisfies(program, spans, length, starts) == expected


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10**6))
def test_automaton_droppable_labels_are_those_a_constraint_may_want_fewer_of(seed):
    """The labels whose nodes a filtered path may leave out: each "at most" and "exactly"
    label, both labels of an "excludes", the first of a "requires"; never null, nor a label
    only asked for "at least" (leaving its nodes out never helps)."""
    rng = random.Random(seed)
    labels = LABELS[: rng.randint(1, 3)]
    constraints = random_constraints(rng, labels, rng.randint(1, 9), rng.randint(1, 4), True)
    droppable = compile_constraints(constraints, labels).automaton.droppable
    assert set(numpy.flatnonzero(droppable).tolist()) == droppable_labels(constraints, labels)
    assert droppable.shape == (len(labels) + 1,)


def test_an_at_least_label_is_not_droppable():
    assert not compile_constraints([AtLeast("A", 2)], LABELS).automaton.droppable.any()
    program = compile_constraints([AtLeast("A", 1), AtMost("B", 1)], LABELS)
    assert program.automaton.droppable.tolist() == [False, False, True, False]


# ----------------------------------------------------------------------------- filtered


def _filtered_problem(rng: random.Random):
    B = rng.randint(1, 3)
    L, K = rng.randint(1, 7), rng.randint(1, 4)
    M = rng.randint(1, 3)
    gen = torch.Generator().manual_seed(rng.randrange(10**6))
    lengths = torch.randint(0, L + 1, (B,), generator=gen)
    density = rng.uniform(0.1, 0.8)
    mask = (torch.rand((B, L, K), generator=gen) < density) & span_mask(lengths, L, K)
    index = mask.view(-1).nonzero().squeeze(1)
    labels = torch.randint(1, M + 1, (index.numel(),), generator=gen)
    scores = torch.randn((index.numel(),), generator=gen, dtype=torch.float64)
    glob = torch.randn((B, L, K, M + 1), generator=gen, dtype=torch.float64)
    T = maybe_transitions(rng, gen, M + 2)
    return filtered.NodeSet(index, labels, scores, (B, L, K)), lengths, glob, T, LABELS[:M]


def doc_rows(spans: torch.Tensor, b: int):
    """Document b's rows of a ``(doc, start, end, label)`` tensor, as tuples."""
    return [tuple(r[1:]) for r in spans.tolist() if r[0] == b]


def _doc_nodes(nodes: filtered.NodeSet, b: int):
    rows = nodes.spans()
    mine = rows[:, 0] == b
    return [
        (int(s), int(e), int(c), float(x))
        for (_, s, e, c), x in zip(rows[mine].tolist(), nodes.scores[mine].tolist())
    ]


def _path_score(spans, nodes_b, glob_b, T):
    """Score of a path given by its spans (a forced span that is not a node reads glob)."""
    by_span = {(s, e, c): x for s, e, c, x in nodes_b}
    total = sum(by_span.get(sp, float(glob_b[sp[0], sp[1] - sp[0], sp[2]])) for sp in spans)
    if T is not None and spans:
        C = T.shape[0] - 1
        labs = [C] + [sp[2] for sp in spans] + [C]
        total += sum(float(T[a, b]) for a, b in zip(labs, labs[1:]))
    return total


@settings(max_examples=700, deadline=None)
@given(st.integers(0, 10**6))
def test_filtered_matches_enumeration(seed):
    rng = random.Random(seed)
    nodes, lengths, glob, T, labels = _filtered_problem(rng)
    B, L, K = nodes.shape
    docs, refs = [], []
    for b in range(B):
        length = int(lengths[b])
        constraints, starts, doc = random_doc_constraints(rng, labels, length, closed=True)
        docs.append(doc)
        force = lambda s, e, c, b=b: float(glob[b, s, e - s, c])  # noqa: E731
        T_list = None if T is None else T.tolist()
        closed = doc.closed_starts if doc else ()
        ref = filtered_reference(
            _doc_nodes(nodes, b), T_list, length, K, constraints, labels, starts, force, closed
        )
        refs.append((constraints, starts, ref))
    out = filtered_constrained(nodes, lengths, T, docs, global_scores=glob)
    best, _ = filtered.decode_node_set(nodes, T, marginals=False)
    viterbi = nodes.spans(best)
    for b in range(B):
        constraints, starts, ref = refs[b]
        mine, plain = doc_rows(out.spans, b), doc_rows(viterbi, b)
        report = out.reports[b]
        if docs[b] is None:
            assert report is None and mine == plain
            continue
        score = _path_score(mine, _doc_nodes(nodes, b), glob[b], T)
        assert math.isclose(report.score, score, abs_tol=1e-9)
        closed = docs[b].closed_starts
        if report.status == "satisfied":  # the unconstrained path, once trimmed, obeys them
            assert mine == plain and not report.searched
            assert written_ok(constraints, labels, mine, int(lengths[b]), starts, closed)
            continue
        if ref is None:
            assert report.status == "infeasible" and mine == plain
            continue
        drops, ref_score, _ = ref
        assert report.status == "optimal"
        assert plain_ok(constraints, labels, mine, int(lengths[b]), starts, closed)
        assert report.dropped == drops
        assert math.isclose(report.score, ref_score, abs_tol=TOL)


def test_filtered_drops_only_when_needed():
    """One isolated node per label: "at most one A" keeps the better A and drops the other,
    and a constraint the best path already obeys changes nothing."""
    # nodes: A [0,0] 2.0, A [2,2] 1.0, B [4,4] -5.0 (on every maximal path)
    index = torch.tensor([0, 2 * 2, 4 * 2])  # grid [1, 5, 2]
    scores = torch.tensor([2.0, 1.0, -5.0])
    nodes = filtered.NodeSet(index, torch.tensor([1, 1, 2]), scores, (1, 5, 2))
    lengths = torch.tensor([5])
    program = compile_constraints([{"kind": "at_most", "label": "A", "n": 1}], ["A", "B"])
    out = filtered_constrained(nodes, lengths, None, [DocConstraints(program)])
    assert out.spans.tolist() == [[0, 0, 0, 1], [0, 4, 4, 2]]
    assert out.node.tolist() == [0, 2]
    assert out.reports[0].status == "optimal" and out.reports[0].dropped == 1
    assert out.reports[0].score == pytest.approx(-3.0)
    assert out.reports[0].unconstrained == pytest.approx(-2.0)
    loose = compile_constraints([{"kind": "at_most", "label": "A", "n": 2}], ["A", "B"])
    out = filtered_constrained(nodes, lengths, None, [DocConstraints(loose)])
    assert out.reports[0].status == "satisfied" and len(out.spans) == 3
    # exactly 3 As cannot be met: the unconstrained result stands
    never = compile_constraints([{"kind": "exactly", "label": "A", "n": 3}], ["A", "B"])
    out = filtered_constrained(nodes, lengths, None, [DocConstraints(never)])
    assert out.reports[0].status == "infeasible" and len(out.spans) == 3
    assert out.reports[0].reason == NO_FILTERED_PATH


def test_filtered_path_that_drops_every_node_is_the_empty_path_of_score_zero():
    """'No A' over a graph of A nodes leaves them all off: the empty path, which takes no
    transition (START -> END scores 0 whatever the matrix holds there)."""
    index = torch.tensor([0, 2 * 2])  # A [0,0] and A [2,2], grid [1, 4, 2]
    nodes = filtered.NodeSet(index, torch.tensor([1, 1]), torch.tensor([2.0, 1.0]), (1, 4, 2))
    T = torch.full((4, 4), 0.5, dtype=torch.float64)  # [C + 1, C + 1], C = 3 (null, A, B)
    program = compile_constraints([{"kind": "at_most", "label": "A", "n": 0}], ["A", "B"])
    out = filtered_constrained(nodes, torch.tensor([4]), T, [DocConstraints(program)])
    report = out.reports[0]
    assert out.spans.tolist() == [] and report.status == "optimal" and report.dropped == 2
    assert report.score == 0.0
    assert report.unconstrained == pytest.approx(2.0 + 1.0 + 3 * 0.5)  # START, A -> A, END


def test_filtered_force_span_adds_a_node():
    index = torch.tensor([0])  # A [0,0]
    nodes = filtered.NodeSet(index, torch.tensor([1]), torch.tensor([1.0]), (1, 4, 2))
    glob = torch.zeros((1, 4, 2, 3))
    glob[0, 0, 1, 2] = 0.5  # B over tokens 0-1
    program = compile_constraints([ForceSpan(0, 2, "B")], ["A", "B"])
    lengths = torch.tensor([4])
    out = filtered_constrained(nodes, lengths, None, [DocConstraints(program)], global_scores=glob)
    assert out.spans.tolist() == [[0, 0, 1, 2]] and out.node.tolist() == [-1]
    assert out.reports[0].status == "optimal" and out.reports[0].score == pytest.approx(0.5)
    # without the head's global scores a forced span that is not a node scores 0
    out = filtered_constrained(nodes, lengths, None, [DocConstraints(program)])
    assert out.spans.tolist() == [[0, 0, 1, 2]] and out.reports[0].score == 0.0
    wide = compile_constraints([ForceSpan(0, 3, "B")], ["A", "B"])  # wider than max_width
    out = filtered_constrained(nodes, lengths, None, [DocConstraints(wide)], global_scores=glob)
    assert out.reports[0].status == "infeasible" and out.spans.tolist() == [[0, 0, 0, 1]]
    assert out.reports[0].reason == "force_span 0..3 is wider than the head's max_width=2"


def test_filtered_removing_a_node_can_open_a_better_path_than_the_viterbi_one():
    """The paths of the filtered graph are its maximal sets of non-overlapping nodes, so a
    forbidden node, even off the best path, is searched without: here the best path obeys the
    constraint, but without B the lone A [1,1] becomes a path of its own and wins."""
    # grid [1, 2, 2]: B [0,0] -10 (index 0), A [0,1] 0 (index 1), A [1,1] 5 (index 2);
    # paths {A [0,1]} 0 and {B [0,0], A [1,1]} -5
    nodes = filtered.NodeSet(torch.tensor([0, 1, 2]), torch.tensor([2, 1, 1]),
                             torch.tensor([-10.0, 0.0, 5.0], dtype=torch.float64), (1, 2, 2))
    program = compile_constraints([ForbidLabels(("B",), 0, 1)], ["A", "B"])
    out = filtered_constrained(nodes, torch.tensor([2]), None, [DocConstraints(program)])
    assert out.spans.tolist() == [[0, 1, 1, 1]] and out.node.tolist() == [2]
    report = out.reports[0]
    assert (report.status, report.score, report.unconstrained) == ("optimal", 5.0, 0.0)


def test_filtered_forbids_each_remove_their_nodes_and_an_open_end_reaches_the_last_token():
    """Every forbidden range removes its own nodes (one range does not undo another), and a
    range without an end runs to the document's end, for nodes and for forced spans alike."""
    # grid [1, 3, 1]: A [0,0], B [1,1], A [2,2], each on every path
    nodes = filtered.NodeSet(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 1]),
                             torch.tensor([1.0, 2.0, 3.0]), (1, 3, 1))
    lengths = torch.tensor([3])
    program = compile_constraints(
        [ForbidLabels(("A",), 0, 1), ForbidLabels(("B",), 1, None)], ["A", "B"])
    out = filtered_constrained(nodes, lengths, None, [DocConstraints(program)])
    assert out.spans.tolist() == [[0, 2, 2, 1]] and out.reports[0].status == "optimal"
    forced = compile_constraints([ForceSpan(2, 3, "A"), ForbidLabels(("A",), 1, None)], ["A", "B"])
    out = filtered_constrained(nodes, lengths, None, [DocConstraints(forced)])
    assert (out.reports[0].status, out.reports[0].searched) == ("infeasible", False)
    assert out.reports[0].reason == "force_span 2..3 has a label that forbid_labels forbids there"
    assert len(out.spans) == 3


def test_filtered_nodes_removed_by_one_constraint_stay_removed_by_the_next():
    """Each forbidden range and each forced span removes nodes from what the others left: a
    forced span does not bring back a node that a forbid or an earlier forced span removed."""
    # grid [1, 6, 2]: A [0,0] 9, A [1,1] 9, B [2,3] 1, A [5,5] 1; every node on the best path
    index = torch.tensor([0 * 2, 1 * 2, 2 * 2 + 1, 5 * 2])
    nodes = filtered.NodeSet(index, torch.tensor([1, 1, 2, 1]),
                             torch.tensor([9.0, 9.0, 1.0, 1.0]), (1, 6, 2))
    glob = torch.zeros((1, 6, 2, 3))
    program = compile_constraints(
        [ForbidLabels(("A",), 0, 1), ForceSpan(1, 2, "B"), ForceSpan(4, 5, "B")], ["A", "B"])
    out = filtered_constrained(nodes, torch.tensor([6]), None, [DocConstraints(program)],
                               global_scores=glob)
    # A [0,0] forbidden, A [1,1] under the first forced span: neither comes back with the second
    assert out.spans[:, 1:].tolist() == [[1, 1, 2], [2, 3, 2], [4, 4, 2], [5, 5, 1]]
    assert out.reports[0].status == "optimal"


@pytest.mark.parametrize("head, max_width", [("filtered", 2), ("semicrf", 2)])
def test_a_forced_span_wider_than_the_span_heads_allow_says_their_width(head, max_width):
    report = _constrained_on_four_tokens(head, [ForceSpan(0, 3, "A")]).reports[0]
    assert (report.status, report.searched, report.reason) == (
        "infeasible", False, f"force_span 0..3 is wider than the head's max_width={max_width}")
    crf = _constrained_on_four_tokens("crf", [ForceSpan(0, 3, "A")]).reports[0]
    assert crf.status == "optimal"  # the linear CRF has no width limit


def test_a_document_without_tokens_is_reported_on_its_empty_segmentation():
    """Its one segmentation, the empty one: satisfied when it obeys the constraints (with the
    automaton's states), infeasible with the reason otherwise; no report without constraints."""
    labels = ["A", "B"]
    at_most = DocConstraints(compile_constraints([AtMost("A", 1, "doc")], labels))
    assert empty_document_report(at_most) == ConstraintReport(
        "satisfied", 0.0, 0.0, False, at_most.program.automaton.n_states)
    at_least = DocConstraints(compile_constraints([AtLeast("A", 1, "doc")], labels))
    report = empty_document_report(at_least)
    assert (report.status, report.score, report.unconstrained, report.searched) == (
        "infeasible", 0.0, 0.0, False)
    assert (report.states, report.reason) == (
        at_least.program.automaton.n_states, NO_SEGMENTATION)
    assert at_least.program.automaton.n_states > 1
    forced = DocConstraints(compile_constraints([ForceSpan(0, 1, "B")], labels))
    assert empty_document_report(forced).reason == (
        "force_span 0..1 ends past the document's 0 tokens")
    assert empty_document_report(None) is None
    # no sentence: a per-sentence count holds on none
    per_sentence = DocConstraints(compile_constraints([AtLeast("A", 1, "sentence")], labels))
    assert empty_document_report(per_sentence).status == "satisfied"
    assert empty_document_report(DocConstraints(compile_constraints([], labels))) is None


def test_filtered_head_forces_a_span_where_the_filter_keeps_no_node():
    """A batch whose filter keeps no node at all still gets its forced span, scored 0 (no
    probability under the model), and the other documents nothing."""
    from spacy_fsemicrf.structured.heads import FilteredSemiCRFHead
    from spacy_fsemicrf.structured.prediction import DecodeOptions

    head = FilteredSemiCRFHead(4, 2, max_width=2)
    local = torch.zeros((2, 4, 2, 3))
    local[..., 0] = 5.0  # null wins everywhere: no node
    glob = torch.randn((2, 4, 2, 3), generator=torch.Generator().manual_seed(0))
    program = compile_constraints([ForceSpan(1, 3, "B")], ["A", "B"])
    with torch.no_grad():
        out = head.decode(local, glob, torch.tensor([4, 4]), options=DecodeOptions(
            path=True, constraints=[DocConstraints(program), None]))
    assert out.spans.tolist() == [[0, 1, 2, 2]] and out.scores.tolist() == [0.0]
    assert out.reports[0].status == "optimal" and out.reports[1] is None
    assert out.path.tolist() == [0.0, 1.0]


def test_filtered_forced_nodes_are_never_dropped():
    """Two forced spans that are nodes, and at most one A: no path has both, and dropping
    either would break its force, so the document is infeasible and keeps its prediction."""
    # grid [1, 3, 1]: A [0,0], B [1,1], A [2,2]
    nodes = filtered.NodeSet(torch.tensor([0, 1, 2]), torch.tensor([1, 2, 1]),
                             torch.tensor([1.0, 0.0, 1.0]), (1, 3, 1))
    program = compile_constraints(
        [ForceSpan(0, 1, "A"), ForceSpan(2, 3, "A"), AtMost("A", 1, "doc")], ["A", "B"])
    out = filtered_constrained(nodes, torch.tensor([3]), None, [DocConstraints(program)])
    assert (out.reports[0].status, out.reports[0].searched) == ("infeasible", True)
    assert out.reports[0].reason == NO_FILTERED_PATH
    assert out.spans.tolist() == [[0, 0, 0, 1], [0, 1, 1, 2], [0, 2, 2, 1]]


# ----------------------------------------------------------------------------- semi-CRF


def _semicrf_problem(rng: random.Random):
    """``(lengths [B], scores [B, L, K, M + 1], transitions or None)``, small and random."""
    B, L, K, M = rng.randint(1, 2), rng.randint(1, 5), rng.randint(1, 3), rng.randint(1, 2)
    gen = torch.Generator().manual_seed(rng.randrange(10**6))
    lengths = torch.randint(0, L + 1, (B,), generator=gen)
    scores = torch.randn((B, L, K, M + 1), generator=gen, dtype=torch.float64)
    return lengths, scores, maybe_transitions(rng, gen, M + 2)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**6))
def test_semicrf_matches_enumeration(seed):
    rng = random.Random(seed)
    lengths, scores, T = _semicrf_problem(rng)
    B, labels = len(lengths), LABELS[: scores.shape[-1] - 1]
    docs, refs = [], []
    for b in range(B):
        length = int(lengths[b])
        constraints, starts, doc = random_doc_constraints(rng, labels, length, closed=True)
        docs.append(doc)
        T_list = None if T is None else T.tolist()
        ref = semicrf_reference(scores[b].tolist(), T_list, length, constraints, labels, starts,
                                closed_starts=doc.closed_starts if doc else ())
        refs.append((constraints, starts, ref))
    out = semicrf_constrained(scores, lengths, T, docs)
    plain_spans, plain_best = semicrf_viterbi(scores, lengths, T)
    for b in range(B):
        constraints, starts, ref = refs[b]
        mine, plain = doc_rows(out.spans, b), doc_rows(plain_spans, b)
        report = out.reports[b]
        if docs[b] is None:
            assert report is None and mine == plain
        elif report.status == "satisfied":  # the unconstrained path, once trimmed, obeys them
            assert mine == plain and written_ok(constraints, labels, mine, int(lengths[b]),
                                                starts, docs[b].closed_starts)
        elif not ref:
            assert report.status == "infeasible" and mine == plain
        else:
            assert report.status == "optimal"
            assert math.isclose(report.score, ref[0][0], abs_tol=TOL)
            assert math.isclose(report.unconstrained, float(plain_best[b]), abs_tol=1e-6)
            assert plain_ok(constraints, labels, mine, int(lengths[b]), starts,
                            docs[b].closed_starts)
            # the returned entities are those of a best constrained segmentation
            assert any(math.isclose(s, ref[0][0], abs_tol=TOL) and sp == mine for s, sp in ref)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 10**6))
def test_lattice_search_finds_the_k_best_segmentations_under_count_constraints(seed):
    """The k best semi-CRF segmentations that obey up to three count constraints (an
    automaton of several states, one set for the batch, sentence starts per document) against
    enumeration; one path unless k says more."""
    rng = random.Random(seed)
    lengths, scores, T = _semicrf_problem(rng)
    B, L, K, C = scores.shape
    labels, k = LABELS[: C - 1], rng.randint(1, 4)
    constraints = random_constraints(rng, labels, L, rng.randint(1, 3), token_level=False)
    starts = [random_sentence_starts(rng, int(n)) for n in lengths]
    valid = numpy.stack([itemgraphs.semicrf_valid(int(n), (L, K, C))[0] for n in lengths])
    sentence = numpy.stack([padded_sentence_index(int(n), L, s) for n, s in zip(lengths, starts)])
    masked = numpy.where(valid, scores.numpy(), -numpy.inf)
    T_np = None if T is None else T.numpy()
    automaton = compile_constraints(constraints, labels).automaton
    args = (masked, lengths.numpy(), T_np, numpy.arange(C), automaton, sentence)
    found, best = lattice_search(*args, k=k), lattice_search(*args)
    for b in range(B):
        T_list = None if T is None else T.tolist()
        ref = semicrf_reference(scores[b].tolist(), T_list, int(lengths[b]), constraints, labels,
                                starts[b])
        assert [x for x, _ in found[b]] == pytest.approx([x for x, _ in ref[:k]], abs=1e-9)
        assert [x for x, _ in best[b]] == pytest.approx([x for x, _ in ref[:1]], abs=1e-9)


# ----------------------------------------------------------------------------- linear CRF


@settings(max_examples=250, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from(["BIO", "BILUO"]))
def test_crf_matches_enumeration(seed, scheme_name):
    rng = random.Random(seed)
    M = 1 if scheme_name == "BILUO" else rng.randint(1, 2)
    scheme = tag_scheme(M, scheme_name)
    B, L = rng.randint(1, 2), rng.randint(1, 5 if M == 1 else 4)
    gen = torch.Generator().manual_seed(rng.randrange(10**6))
    lengths = torch.randint(0, L + 1, (B,), generator=gen)
    emissions = torch.randn((B, L, scheme.n_tags), generator=gen, dtype=torch.float64)
    T = torch.randn((scheme.n_tags + 1, scheme.n_tags + 1), generator=gen, dtype=torch.float64)
    labels = LABELS[:M]
    docs, refs = [], []
    for b in range(B):
        length = int(lengths[b])
        constraints, starts, doc = random_doc_constraints(rng, labels, length, closed=True)
        docs.append(doc)
        ref = crf_reference(emissions[b].tolist(), T.tolist(), scheme.allowed.tolist(), scheme,
                            length, constraints, labels, starts, doc.closed_starts if doc else ())
        refs.append((constraints, starts, ref))
    out = crf_constrained(emissions, T, lengths, scheme, docs, scheme.allowed)
    plain_tags, plain_best = crf_viterbi(emissions, T, lengths, scheme.allowed)
    plain_spans = tags_to_spans(plain_tags, lengths, scheme)
    for b in range(B):
        constraints, starts, ref = refs[b]
        mine = doc_rows(out.spans, b)
        report = out.reports[b]
        if docs[b] is None:
            assert report is None
        elif report.status == "satisfied":  # the unconstrained path, once trimmed, obeys them
            assert mine == doc_rows(plain_spans, b) and written_ok(
                constraints, labels, mine, int(lengths[b]), starts, docs[b].closed_starts)
        elif not ref:
            assert report.status == "infeasible"
        else:
            assert report.status == "optimal"
            assert math.isclose(report.score, ref[0][0], abs_tol=TOL)
            assert math.isclose(report.unconstrained, float(plain_best[b]), abs_tol=1e-6)
            assert plain_ok(constraints, labels, mine, int(lengths[b]), starts,
                            docs[b].closed_starts)
            best = [list(sp) for s, sp, _ in ref if math.isclose(s, ref[0][0], abs_tol=TOL)]
            assert mine in best


def _flat_crf(scheme):
    """``(emissions [1, 4, n_tags], transitions)`` of one 4-token document, all zero."""
    n = scheme.n_tags
    return (torch.zeros((1, 4, n), dtype=torch.float64),
            torch.zeros((n + 1, n + 1), dtype=torch.float64))


@pytest.mark.parametrize("scheme_name", ["BIO", "BILUO"])
def test_crf_force_span_is_one_entity(scheme_name):
    """A forced span is exactly one entity: strong I tags around it neither extend it nor
    merge it with a neighbour."""
    scheme = tag_scheme(1, scheme_name)
    emissions, T = _flat_crf(scheme)
    emissions[0, :, scheme.tag("I", 1)] = 5.0
    program = compile_constraints([ForceSpan(1, 3, "A")], ["A"])
    docs = [DocConstraints(program)]
    out = crf_constrained(emissions, T, torch.tensor([4]), scheme, docs, scheme.allowed)
    assert out.reports[0].status == "optimal"
    assert [1, 2, 1] in out.spans[:, 1:].tolist()
    program = compile_constraints([ForceSpan(0, 3, "A")], ["A"])  # B I L in BILUO, B I I in BIO
    out = crf_constrained(emissions, T, torch.tensor([4]), scheme, [DocConstraints(program)],
                          scheme.allowed)
    assert out.reports[0].status == "optimal" and [0, 2, 1] in out.spans[:, 1:].tolist()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_constrained_semicrf_and_crf_take_half_precision_scores(dtype):
    """The unconstrained best scores went to NumPy as they were: bfloat16 ones, which NumPy
    has not, raised a TypeError (float16 ones passed)."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([4, 3])
    program = compile_constraints([AtMost("A", 0)], ["A", "B"])
    docs = [DocConstraints(program)] * 2
    scores = torch.randn((2, 4, 2, 3), generator=gen).masked_fill(
        ~span_mask(lengths, 4, 2).unsqueeze(-1), -1e4)
    scores[:, :, :, 1] += 2.0  # label A everywhere: the constraint changes the prediction
    scheme = tag_scheme(2, "BIO")
    emissions = torch.randn((2, 4, scheme.n_tags), generator=gen)
    emissions[..., scheme.tag("B", 1)] += 3.0
    T = torch.zeros((scheme.n_tags + 1, scheme.n_tags + 1))
    for run, x in ((lambda x: semicrf_constrained(x, lengths, None, docs), scores),
                   (lambda x: crf_constrained(x, T, lengths, scheme, docs, scheme.allowed),
                    emissions)):
        want, got = run(x.to(dtype).double()), run(x.to(dtype))
        assert [r.status for r in got.reports] == ["optimal", "optimal"]
        assert torch.equal(got.spans, want.spans)
        assert all(label != 1 for label in got.spans[:, 3].tolist())


def _constrained_on_four_tokens(head: str, constraints) -> ConstrainedDecode:
    """The constrained decode of one flat 4-token document (labels A and B, width 2)."""
    program = compile_constraints(constraints, ["A", "B"])
    docs, lengths = [DocConstraints(program)], torch.tensor([4])
    if head == "filtered":
        nodes = filtered.NodeSet(torch.tensor([0]), torch.tensor([1]), torch.tensor([1.0]),
                                 (1, 4, 2))
        out = filtered_constrained(nodes, lengths, None, docs, global_scores=torch.zeros(1, 4, 2, 3))
    elif head == "semicrf":
        out = semicrf_constrained(torch.zeros((1, 4, 2, 3), dtype=torch.float64), lengths, None, docs)
    else:
        scheme = tag_scheme(2, "BIO")
        emissions, T = _flat_crf(scheme)
        out = crf_constrained(emissions, T, lengths, scheme, docs, scheme.allowed)
    return out


@pytest.mark.parametrize("head", ["filtered", "semicrf", "crf"])
@pytest.mark.parametrize("constraints, reason", [
    ([ForceSpan(0, 2, "A"), ForceSpan(1, 3, "B")], "force_span 1..3 overlaps force_span 0..2"),
    ([ForceSpan(3, 6, "A")], "force_span 3..6 ends past the document's 4 tokens"),
    ([ForceSpan(0, 2, "A"), ForbidLabels(["A"], 1, 2)],
     "force_span 0..2 has a label that forbid_labels forbids there"),
])
def test_forced_spans_that_cannot_hold_are_infeasible_with_their_reason(head, constraints, reason):
    """Forced spans that overlap, leave the document or are forbidden cannot all be entities:
    every head reports the set infeasible, says why, and keeps its unconstrained prediction
    without a search."""
    report = _constrained_on_four_tokens(head, constraints).reports[0]
    assert (report.status, report.searched, report.reason) == ("infeasible", False, reason)


@pytest.mark.parametrize("head", ["filtered", "semicrf", "crf"])
def test_counts_no_path_meets_are_infeasible_after_a_search(head):
    """Five entities of A in four tokens: the search runs and finds no path."""
    report = _constrained_on_four_tokens(head, [Exactly("A", 5, "doc")]).reports[0]
    want = NO_FILTERED_PATH if head == "filtered" else NO_SEGMENTATION
    assert (report.status, report.searched, report.reason) == ("infeasible", True, want)
    satisfied = _constrained_on_four_tokens(head, [AtMost("A", 5, "doc")]).reports[0]
    assert satisfied.reason == ""


def test_semicrf_obeys_a_forbidden_range_beside_a_forced_span():
    """A forced span must not lift the forbidden ranges: A scores best on every token, B is
    forced on token 0 and A is forbidden on tokens 2-3, which take B."""
    scores = torch.zeros((1, 4, 1, 3), dtype=torch.float64)  # [B, L, K, null + A + B]
    scores[0, :, 0, 1], scores[0, :, 0, 2] = 5.0, 1.0
    program = compile_constraints([ForceSpan(0, 1, "B"), ForbidLabels(["A"], 2, None)],
                                  ["A", "B"])
    out = semicrf_constrained(scores, torch.tensor([4]), None, [DocConstraints(program)])
    assert out.spans[:, 1:].tolist() == [[0, 0, 2], [1, 1, 1], [2, 2, 2], [3, 3, 2]]


def test_crf_obeys_every_forbidden_range_and_needs_no_mask_of_allowed_transitions():
    """Two forbidden ranges both hold (A strong everywhere, B next to it); the decode without
    the scheme's mask of allowed transitions is the one with a mask that allows everything."""
    scheme = tag_scheme(2, "BIO")
    emissions, T = _flat_crf(scheme)
    emissions[0, :, scheme.tag("B", 1)] = 5.0
    emissions[0, :, scheme.tag("B", 2)] = 4.0
    program = compile_constraints([ForbidLabels(["A"], 0, 2), ForbidLabels(["B"], 2, None)],
                                  ["A", "B"])
    docs, lengths = [DocConstraints(program)], torch.tensor([4])
    out = crf_constrained(emissions, T, lengths, scheme, docs, scheme.allowed)
    assert out.spans[:, 1:].tolist() == [[0, 0, 2], [1, 1, 2], [2, 2, 1], [3, 3, 1]]
    unmasked = crf_constrained(emissions, T, lengths, scheme, docs)
    everything = torch.ones_like(scheme.allowed)
    assert torch.equal(unmasked.spans, crf_constrained(emissions, T, lengths, scheme, docs,
                                                       everything).spans)


def test_crf_token_left_without_a_tag_is_infeasible_without_a_search():
    """A forced entity over a token where its label is forbidden leaves that token no tag:
    the set is contradictory before any search (the other tokens still have tags)."""
    scheme = tag_scheme(1, "BIO")
    emissions, T = _flat_crf(scheme)
    program = compile_constraints([ForceSpan(0, 3, "A"), ForbidLabels(["A"], 1, 2)], ["A"])
    out = crf_constrained(emissions, T, torch.tensor([4]), scheme, [DocConstraints(program)],
                          scheme.allowed)
    assert (out.reports[0].status, out.reports[0].searched) == ("infeasible", False)
    assert out.reports[0].reason == "force_span 0..3 has a label that forbid_labels forbids there"


# ----------------------------------------------------------------------------- no constraints


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 10**6))
def test_search_without_constraints_is_viterbi(seed):
    """With constraints every path obeys (or none at all), the search returns the plain
    Viterbi score for each head (forcing the search, not the shortcut)."""
    rng = random.Random(seed)
    nodes, lengths, glob, T, labels = _filtered_problem(rng)
    B, L, K = nodes.shape
    grids = nodes.grid(nodes.scores), nodes.grid(), nodes.grid(nodes.labels)
    _, total = filtered.filtered_viterbi(*grids, T)
    vacuous = compile_constraints([AtMost(labels[0], 99)], labels).automaton
    for b in range(B):
        length = int(lengths[b])
        rows = nodes.spans()
        mine = (rows[:, 0] == b).numpy()
        g = itemgraphs.filtered_items(
            rows[mine, 1:].numpy(), nodes.scores[mine].numpy(), length, K
        ).graph
        T_np = None if T is None else T.numpy()
        for automaton in (None, vacuous):
            found = search(g, T_np, automaton, sentence_index(length), k=1)
            assert math.isclose(found.paths[0].score, float(total[b]), abs_tol=1e-9)
    scores = glob
    spans, semi_best = semicrf_viterbi(scores, lengths, T)
    C = scores.shape[-1]
    valid = numpy.stack([itemgraphs.semicrf_valid(int(n), (L, K, C))[0] for n in lengths])
    sentence = numpy.stack([padded_sentence_index(int(n), L) for n in lengths])
    masked = numpy.where(valid, scores.numpy(), -numpy.inf)
    T_np = None if T is None else T.numpy()
    for automaton in (None, vacuous):
        found = lattice_search(masked, lengths.numpy(), T_np, numpy.arange(C), automaton, sentence)
        for b in range(B):
            assert math.isclose(found[b][0][0], float(semi_best[b]), abs_tol=1e-9)
    program = compile_constraints([], labels)
    assert program.empty and program.automaton.trivial
    out = semicrf_constrained(scores, lengths, T, [DocConstraints(program)] * B)
    assert torch.equal(out.spans, spans) and out.reports == [None] * B


def _random_item_graph(rng: random.Random):
    """Items for :func:`search` on a document of up to 7 tokens: intervals in 1-3 channels,
    some droppable, scores and transitions (some forbidden) each at a scale of 0, 1 or 30. All
    zero, a drop must still cost; transitions far above the scores, the value of a drop must
    still outweigh them; scores above the item count tell a score from an item index."""
    length = rng.randint(0, 7)
    n = rng.randint(0, 6) if length else 0
    starts = numpy.array([rng.randrange(length) for _ in range(n)], dtype=numpy.int64)
    widths = numpy.array([rng.randint(0, 2) for _ in range(n)], dtype=numpy.int64)
    ends = numpy.minimum(starts + widths, length - 1)
    H = rng.randint(1, 3)
    channels = lambda: numpy.array([rng.randrange(H) for _ in range(n)], dtype=numpy.int64)  # noqa: E731
    scale = rng.choice([0.0, 1.0, 30.0])
    scores = numpy.array([scale * rng.gauss(0, 1) for _ in range(n)])
    droppable = numpy.array([rng.random() < 0.5 for _ in range(n)], dtype=bool)
    graph = ItemGraph(starts, ends, numpy.zeros(n, dtype=numpy.int64),
                      channels(), channels(), scores, length,
                      droppable if rng.random() < 0.8 else None)
    if rng.random() < 0.3:
        return graph, None
    t_scale = rng.choice([0.0, 1.0, 30.0])
    T = numpy.array([[t_scale * rng.gauss(0, 1) for _ in range(H + 1)] for _ in range(H + 1)])
    T[numpy.array([[rng.random() < 0.15 for _ in range(H + 1)] for _ in range(H + 1)])] = -numpy.inf
    return graph, T


def _ranked_paths(graph: ItemGraph, T) -> list:
    """Every path of ``graph`` (non-overlapping items leaving no firm item in a gap) as
    ``(drops, score)``, fewest drops first, then best score; forbidden ones left out."""
    items = list(zip(graph.starts.tolist(), graph.ends.tolist()))
    droppable = graph.droppable if graph.droppable is not None else [False] * len(items)
    ranked = []
    for chosen in nonoverlapping_sets(items):
        gaps = [i for i in range(len(items))
                if i not in chosen and not any(overlap(items[i], items[j]) for j in chosen)]
        if any(not droppable[i] for i in gaps):
            continue
        score = float(sum(graph.scores[i] for i in chosen))
        if T is not None and chosen:
            H = T.shape[0] - 1
            rows = [H] + [int(graph.leave[i]) for i in chosen]
            cols = [int(graph.enter[i]) for i in chosen] + [H]
            score += float(sum(T[r, c] for r, c in zip(rows, cols)))
        if score > -numpy.inf:
            ranked.append((len(gaps), score))
    return sorted(ranked, key=lambda p: (p[0], -p[1]))


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 10**6))
@example(55)  # one droppable item: its path's transitions cost more than its score bounds
def test_search_finds_the_k_best_paths_of_an_item_graph(seed):
    """The k best paths of random item graphs against enumeration: fewest drops first, then
    score, and fewer than k only where the graph has fewer."""
    rng = random.Random(seed)
    graph, T = _random_item_graph(rng)
    k = rng.randint(1, 4)
    want = _ranked_paths(graph, T)[:k]
    found = search(graph, T, None, sentence_index(graph.length), k=k).paths
    assert [p.drops for p in found] == [d for d, _ in want]
    assert [p.score for p in found] == pytest.approx([s for _, s in want], abs=1e-9)


def test_search_gives_one_best_path_by_default_and_the_automaton_states():
    """Two overlapping items: one path unless k says more; the result counts the automaton's
    states (1 without constraints); k below 1 is an error that says so."""
    graph = ItemGraph(numpy.array([0, 0]), numpy.array([0, 1]), numpy.array([1, 1]),
                      numpy.zeros(2, dtype=numpy.int64), numpy.zeros(2, dtype=numpy.int64),
                      numpy.array([1.0, 2.0]), 2)
    sentence = sentence_index(2)
    found = search(graph, None, None, sentence)
    assert [p.items for p in found.paths] == [(1,)] and found.states == 1
    assert [p.items for p in search(graph, None, None, sentence, k=2).paths] == [(1,), (0,)]
    automaton = compile_constraints([AtMost("A", 1)], ["A"]).automaton
    found = search(graph, None, automaton, sentence)
    assert [p.items for p in found.paths] == [(1,)] and found.states == automaton.n_states > 1
    with pytest.raises(ValueError, match="k must be an integer >= 1, got 0"):
        search(graph, None, None, sentence, k=0)


def test_requires_in_sentence_scope():
    """A requires B within each sentence, with sentence boundaries: the solver adds a B in the
    sentence of the A or removes the A, whichever scores better."""
    scores = torch.full((1, 4, 1, 3), -1.0, dtype=torch.float64)
    scores[0, :, 0, 0] = 0.0  # null
    scores[0, 0, 0, 1] = 2.0  # A at token 0 (sentence 0)
    scores[0, 2, 0, 2] = 1.5  # B at token 2 (sentence 1)
    program = compile_constraints([Requires("A", "B", "sentence")], ["A", "B"])
    out = semicrf_constrained(scores, torch.tensor([4]), None, [DocConstraints(program, (2,))])
    # A alone in sentence 0 is not allowed: A + B at token 1 (2 - 1 + 1.5) = 2.5 beats
    # dropping A (0 + 1.5) = 1.5
    assert out.spans.tolist() == [[0, 0, 0, 1], [0, 1, 1, 2], [0, 2, 2, 2]]
    assert out.reports[0].status == "optimal" and out.reports[0].score == pytest.approx(2.5)
    out = semicrf_constrained(scores, torch.tensor([4]), None, [DocConstraints(program, ())])
    assert out.reports[0].status == "satisfied"  # one sentence: the B at token 2 counts


# ----------------------------------------------------------------------------- heads


def _head_case(kind: str, seed: int):
    """A small random head, its scores on a random batch, and one document's constraints."""
    from spacy_fsemicrf.structured.heads import LinearCRFHead, SemiCRFHead

    torch.manual_seed(seed)
    rng = random.Random(seed)
    M, L, B = 2, 5, 3
    X = torch.randn((B, L, 4))
    lengths = torch.tensor([L, 3, 0])
    if kind == "semicrf":
        head = SemiCRFHead(4, M, max_width=3, hidden_width=6, dropout=0.0).eval()
        with torch.no_grad():
            head.transitions.normal_()
        scores = head.span_scores(X, lengths).detach()
    else:
        head = LinearCRFHead(4, M, max_width=3, hidden_width=6, dropout=0.0).eval()
        with torch.no_grad():
            head.transitions.normal_()
        scores = head.emissions(X, lengths).detach()
    docs, refs = [], []
    for b in range(B):
        constraints, starts, doc = random_doc_constraints(rng, LABELS[:M], int(lengths[b]))
        if b == 1:
            constraints, starts, doc = [], (0,), None  # one document without constraints
        docs.append(doc)
        refs.append((constraints, starts))
    return head, scores, lengths, docs, refs


def _one_sentence_doc(items):
    """The constraints ``items`` of a one-sentence document over the labels A and B."""
    return DocConstraints(compile_constraints(items, LABELS[:2]), (0,))


@pytest.mark.parametrize("kind", ["semicrf", "crf"])
@pytest.mark.parametrize("seed", range(12))
def test_heads_report_and_score_the_constrained_path(kind, seed):
    """A head's decode under constraints returns a report per constrained document, and the
    path probability of the path it returns: exp(score - log Z) by enumeration."""
    from spacy_fsemicrf.structured.prediction import DecodeOptions

    from .bruteforce import crf_enumerate, semicrf_enumerate

    head, scores, lengths, docs, refs = _head_case(kind, seed)
    T = head.transitions.detach().double()
    out = head.decode(scores, lengths, DecodeOptions(path=True, constraints=docs))
    assert len(out.reports) == len(docs)
    for b, (doc, (constraints, starts)) in enumerate(zip(docs, refs)):
        length = int(lengths[b])
        assert (out.reports[b] is None) == (doc is None)
        if kind == "semicrf":
            enum = semicrf_enumerate(scores[b].double().tolist(), length, T.tolist())
            ref = semicrf_reference(scores[b].double().tolist(), T.tolist(), length,
                                    constraints, LABELS[:2], starts)
        else:
            allowed = head.allowed.tolist()
            enum = crf_enumerate(scores[b].double(), T, length, allowed)
            ref = crf_reference(scores[b].double().tolist(), T.tolist(), allowed, head.scheme,
                                length, constraints, LABELS[:2], starts)
        # an infeasible document keeps its unconstrained path
        best = ref[0][0] if ref else enum.best_score
        want = math.exp(min(best - enum.log_z, 0.0))
        assert math.isclose(float(out.path[b]), want, rel_tol=1e-4, abs_tol=1e-6), (b, want)
        report = out.reports[b]
        if report is None:
            continue
        # the report's fields by their definitions: the returned and the unconstrained best
        # score, whether the search ran, over how many automaton states
        assert report.unconstrained == pytest.approx(enum.best_score, abs=1e-4)
        assert report.states == doc.program.automaton.n_states
        if not ref:
            assert report.status == "infeasible"
            assert report.score == pytest.approx(enum.best_score, abs=1e-4)
        elif math.isclose(ref[0][0], enum.best_score, abs_tol=1e-6):
            assert report.status == "satisfied" and report.searched is False
            assert report.score == pytest.approx(enum.best_score, abs=1e-4)
        else:
            assert report.status == "optimal" and report.searched is True
            assert report.score == pytest.approx(ref[0][0], abs=1e-4)


@pytest.mark.parametrize("kind", ["semicrf", "crf"])
def test_heads_report_whether_the_search_ran(kind):
    """Constraints that contradict each other are not searched, constraints no path meets
    are searched in vain, and a best path that obeys them needs no search."""
    from spacy_fsemicrf.structured.prediction import DecodeOptions

    head, scores, lengths, _, _ = _head_case(kind, 0)  # lengths 5, 3, 0

    docs = [_one_sentence_doc([ForceSpan(4, 6, "A")]),  # past the end of the document
            # 4 entities in 3 tokens
            _one_sentence_doc([{"kind": "exactly", "label": "A", "n": 4}]),
            _one_sentence_doc([{"kind": "at_most", "label": "A", "n": 1}])]
    out = head.decode(scores, lengths, DecodeOptions(constraints=docs))
    assert [(r.status, r.searched) for r in out.reports] == [
        ("infeasible", False), ("infeasible", True), ("satisfied", False)]


@pytest.mark.parametrize("kind", ["semicrf", "crf"])
def test_heads_report_constraints_on_a_batch_without_tokens(kind):
    from spacy_fsemicrf.structured.prediction import DecodeOptions

    head, scores, _, _, _ = _head_case(kind, 0)
    lengths = torch.zeros(2, dtype=torch.long)
    doc = _one_sentence_doc([{"kind": "at_most", "label": "A", "n": 0, "scope": "doc"}])
    out = head.decode(scores[:2, :0], lengths, DecodeOptions(constraints=[doc, None]))
    assert out.spans.shape == (0, 4)
    assert out.reports is not None and out.reports[0] is not None and out.reports[1] is None


@pytest.mark.parametrize("kind", ["filtered", "semicrf", "crf"])
@pytest.mark.parametrize("entries", [1, 2, 4])
def test_heads_want_one_constraint_entry_per_document(kind, entries):
    """A list shorter than the batch left the documents past it unconstrained, silently; a
    longer one raised an IndexError."""
    from spacy_fsemicrf.structured.heads import HEADS
    from spacy_fsemicrf.structured.prediction import DecodeOptions

    name = {"filtered": "FilteredSemiCRF", "semicrf": "SemiCRF", "crf": "LinearCRF"}[kind]
    torch.manual_seed(0)
    head = HEADS[name](4, 2, max_width=3, hidden_width=8).eval()
    X, lengths = torch.randn(3, 5, 4), torch.tensor([5, 4, 3])
    doc = _one_sentence_doc([{"kind": "at_most", "label": "A", "n": 0, "scope": "doc"}])
    with pytest.raises(ValueError, match=f"^constraints must have one entry \\(or None\\) per "
                                         f"document: {entries} entries for 3 documents$"):
        head(X, lengths, options=DecodeOptions(constraints=[doc] * entries))
    out = head(X, lengths, options=DecodeOptions(constraints=[doc] * 3))
    assert all(r is not None for r in out.reports)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6))
@example(247375)  # a path that leaves out a forbidden node, once reported with probability 1
def test_filtered_head_decodes_under_constraints_by_definition(seed):
    """The filtered head's decode with constraints, against enumeration: the constrained
    optimum of its node set (fewest dropped nodes, then best score), each entity's confidence
    (local probability of its label times its marginal on the graph; 0 for a forced span that
    is no node) and the path probability (exp(score - log Z) if the path is one of the graph's,
    else 0); a document without constraints gets the plain best path and no report."""
    from spacy_fsemicrf.structured.heads import FilteredSemiCRFHead
    from spacy_fsemicrf.structured.prediction import DecodeOptions

    from .bruteforce import filtered_enumerate

    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    B, L, K, M = 3, 6, 3, 2
    C = M + 1
    transitions = rng.random() < 0.5
    head = FilteredSemiCRFHead(4, M, max_width=K, transitions=transitions)
    if transitions:
        head.transitions.data = torch.randn(C + 1, C + 1, generator=gen)
    T = head.transitions.detach().double() if transitions else None
    local = 2 * torch.randn(B, L, K, C, generator=gen)
    glob = 2 * torch.randn(B, L, K, C, generator=gen)
    lengths = torch.tensor([L, rng.randint(1, L), rng.randint(0, L)])
    docs, refs = [], []
    for b in range(B):
        constraints, starts, doc = random_doc_constraints(rng, LABELS[:M], int(lengths[b]))
        if b == 1:
            constraints, starts, doc = [], (), None
        docs.append(doc)
        refs.append((constraints, starts))
    with torch.no_grad():
        out = head.decode(local, glob, lengths, options=DecodeOptions(path=True, constraints=docs))
    for b in range(B):
        n, (constraints, starts) = int(lengths[b]), refs[b]
        # the filter keeps the spans whose local argmax is not null
        nodes = [(s, s + w, int(local[b, s, w].argmax())) for s in range(n)
                 for w in range(min(K, n - s)) if int(local[b, s, w].argmax())]
        glob_b = glob[b].double()
        scored = [node + (float(glob_b[node[0], node[1] - node[0], node[2]]),) for node in nodes]
        enum = filtered_enumerate(scored, T)
        paths = [[nodes[k] for k in path] for path, _ in enum.paths]
        conf = {node: float(local[b, node[0], node[1] - node[0]].softmax(0)[node[2]])
                * float(enum.marginals[k]) for k, node in enumerate(nodes)}
        best_path = [nodes[k] for k in enum.best_paths[0]]
        mine = doc_rows(out.spans, b)
        report = out.reports[b] if out.reports is not None else None  # None: no constraints
        assert (report is None) == (docs[b] is None)
        if report is not None:
            assert report.unconstrained == pytest.approx(enum.best_score, abs=1e-5)
            assert report.states == docs[b].program.automaton.n_states
            if report.status == "satisfied":  # the unconstrained best path obeys them
                assert plain_ok(constraints, LABELS[:M], best_path, n, starts)
            if report.status != "infeasible":  # (found infeasible with or without a search)
                assert report.searched == (report.status == "optimal")
        if report is None or report.status == "infeasible":
            assert mine == best_path
        else:
            force = lambda s, e, c, b=b: float(glob[b, s, e - s, c])  # noqa: E731
            ref = filtered_reference(scored, None if T is None else T.tolist(), n, K,
                                     constraints, LABELS[:M], starts, force)
            assert ref is not None and plain_ok(constraints, LABELS[:M], mine, n, starts)
            assert math.isclose(_path_score(mine, [], glob_b, T), ref[1], abs_tol=1e-5)
        scores = [float(x) for r, x in zip(out.spans.tolist(), out.scores.tolist()) if r[0] == b]
        assert scores == pytest.approx([conf.get(span, 0.0) for span in mine], abs=1e-5)
        in_graph = mine in paths
        want = math.exp(_path_score(mine, [], glob_b, T) - enum.log_z) if in_graph else 0.0
        assert float(out.path[b]) == pytest.approx(want, rel=1e-4, abs=1e-6)


def test_filtered_head_on_a_graph_of_one_path():
    """Two A nodes that overlap nothing: the graph's one path has probability 1 (and none is
    computed unless asked for); dropping both for "no A" leaves the graph (probability 0); a
    forced B between them that is no node scores its global score and has confidence 0."""
    from spacy_fsemicrf.structured.heads import FilteredSemiCRFHead
    from spacy_fsemicrf.structured.prediction import DecodeOptions

    head = FilteredSemiCRFHead(4, 2, max_width=2, transitions=False)
    local = torch.zeros((1, 5, 2, 3))  # [B, L, K, null + A + B]
    local[..., 0] = 10.0  # null everywhere...
    local[0, 0, 0, 1] = local[0, 3, 0, 1] = 20.0  # ...but A [0,0] and A [3,3]
    glob = torch.zeros((1, 5, 2, 3))
    glob[0, 0, 0, 1], glob[0, 3, 0, 1], glob[0, 1, 1, 2] = 1.0, 2.0, 0.75  # B [1,2] is no node
    lengths = torch.tensor([5])

    def decode(path, *items):
        docs = [DocConstraints(compile_constraints(list(items), ["A", "B"]))] if items else None
        with torch.no_grad():
            return head.decode(local, glob, lengths, options=DecodeOptions(path=path, constraints=docs))

    out = decode(True)
    assert out.spans.tolist() == [[0, 0, 0, 1], [0, 3, 3, 1]] and out.path.tolist() == [1.0]
    assert out.candidates is None and out.reports is None
    assert decode(False).path is None
    out = decode(True, AtMost("A", 0, "doc"))
    assert out.spans.tolist() == [] and out.path.tolist() == [0.0]
    assert (out.reports[0].status, out.reports[0].dropped) == ("optimal", 2)
    out = decode(True, ForceSpan(1, 3, "B"))
    assert out.spans.tolist() == [[0, 0, 0, 1], [0, 1, 2, 2], [0, 3, 3, 1]]
    assert out.reports[0].score == pytest.approx(1.0 + 0.75 + 2.0)
    assert out.scores[1] == 0.0 and out.path.tolist() == [0.0]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10**6))
def test_topk_is_the_k_largest_by_value_then_index(seed):
    """Against a sort of (value, index) pairs, on rows with ties; fewer than k entries is an
    error, not a silently short answer."""
    rng = numpy.random.default_rng(seed)
    n = int(rng.integers(1, 7))
    k = int(rng.integers(1, n + 1))
    x = rng.integers(-2, 3, size=(3, n)).astype(float)
    x[rng.random(x.shape) < 0.2] = float("-inf")
    values, idx = topk(x, k)
    for row in range(3):
        want = sorted(range(n), key=lambda i: (-x[row, i], i))[:k]
        assert idx[row].tolist() == want
        assert values[row].tolist() == x[row, want].tolist()
    with pytest.raises(ValueError, match=f"^topk needs at least k = {n + 1} entries, got {n}$"):
        topk(x, n + 1)
    with pytest.raises(ValueError, match=f"at least k = {n + 1} entries, got {n}$"):
        topk(numpy.zeros((2, n + 2, n)), n + 1)  # the last axis counts


@pytest.mark.parametrize("kind", ["semicrf", "crf"])
@pytest.mark.parametrize("first", ["none", "satisfied", "contradictory"])
def test_heads_search_a_document_whatever_the_documents_before_it(kind, first):
    """A document's constrained decode is the same in a batch as alone, after a document
    without constraints, one whose best path obeys them and one whose constraints contradict
    each other (each of which the batch loop passes over without a search)."""
    from spacy_fsemicrf.structured.prediction import DecodeOptions

    head, scores, lengths, _, _ = _head_case(kind, 0)  # lengths 5, 3, 0

    searched = _one_sentence_doc([ForceSpan(0, 3, "B")])  # the whole of document 1 as one entity
    before = {"none": None,
              "satisfied": _one_sentence_doc([{"kind": "at_most", "label": "A", "n": 5}]),
              "contradictory": _one_sentence_doc([ForceSpan(4, 6, "A")])}[first]
    alone = head.decode(scores[1:2], lengths[1:2], DecodeOptions(constraints=[searched]))
    assert (alone.reports[0].status, alone.reports[0].searched) == ("optimal", True)
    out = head.decode(scores[:2], lengths[:2], DecodeOptions(constraints=[before, searched]))
    assert out.reports[1] == alone.reports[0]
    rows = out.spans[out.spans[:, 0] == 1]
    assert rows[:, 1:].tolist() == alone.spans[:, 1:].tolist() == [[0, 2, 2]]


@pytest.mark.parametrize("kind", ["semicrf", "crf"])
def test_heads_search_the_documents_of_a_program_after_an_infeasible_one(kind):
    """Documents with one program are searched together: one for which the search finds no
    path (four entities in three tokens) is reported infeasible and keeps its prediction, and
    the document after it is still searched."""
    from spacy_fsemicrf.structured.prediction import DecodeOptions

    head, scores, lengths, _, _ = _head_case(kind, 0)  # lengths 5, 3, 0
    shared = _one_sentence_doc([{"kind": "at_least", "label": "B", "n": 4}])
    alone = head.decode(scores[:1], lengths[:1], DecodeOptions(constraints=[shared]))
    assert (alone.reports[0].status, alone.reports[0].searched) == ("optimal", True)
    plain = head.decode(scores[1:2], lengths[1:2], DecodeOptions())
    order = [1, 0]
    out = head.decode(scores[order], lengths[order], DecodeOptions(constraints=[shared] * 2))
    assert (out.reports[0].status, out.reports[0].searched) == ("infeasible", True)
    assert out.reports[1] == alone.reports[0]
    assert out.spans[out.spans[:, 0] == 0].tolist() == plain.spans.tolist()
    found = out.spans[out.spans[:, 0] == 1]
    assert found[:, 1:].tolist() == alone.spans[:, 1:].tolist()
    assert (found[:, 3] == 2).sum() >= 4  # label ids count from 1: B is 2


@pytest.mark.parametrize("length", [0, 1, 4, 6])
def test_without_constraints_the_valid_items_are_those_inside_the_document(length):
    """semicrf_valid: the segments that end inside the document, null ones one token wide;
    crf_valid: every tag of the tokens inside it; neither is contradictory."""
    L, K, C = 6, 3, 3

    def inside(n):
        return numpy.array([[[s + w < n and (w == 0 or c > 0) for c in range(C)]
                             for w in range(K)] for s in range(L)])

    valid, contradictory = itemgraphs.semicrf_valid(length, (L, K, C))
    assert not contradictory
    assert numpy.array_equal(valid, inside(length))
    assert numpy.array_equal(itemgraphs.segments_inside(numpy.array([length, L]), (L, K, C)),
                             numpy.stack([inside(length), inside(L)]))
    scheme = tag_scheme(2, "BILUO")
    tags, contradictory = itemgraphs.crf_valid(length, L, scheme)
    assert not contradictory
    assert numpy.array_equal(tags, numpy.arange(L)[:, None].repeat(scheme.n_tags, 1) < length)
