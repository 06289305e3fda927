"""Constraints and n-best through the ``fsemicrf_ner`` component: the settings, their
round-trips, and what the predictions obey. The decoders themselves are checked against
enumeration in test_constraints.py and test_nbest.py."""
import logging

import numpy
import pytest
import spacy
from spacy.tokens import Span

from spacy_fsemicrf.doc_constraints import (
    USER_DATA_KEY, constraints_of_docs, explain_unmet_forces, occupied_runs)
from spacy_fsemicrf.structured.constrained import ConstraintReport
from spacy_fsemicrf.structured.constraints import (  # noqa: F401
    MAX_STATES, parse_constraints, satisfies)
from spacy_fsemicrf.structured.itemgraphs import force_conflict

try:  # tests/ as a package (tests/__init__.py) or as a plain directory
    from .conftest import TRAIN_DATA, make_examples, model_config, train_pipeline
except ImportError:  # pragma: no cover
    from conftest import TRAIN_DATA, make_examples, model_config, train_pipeline

ARCHS = ["spacy-fsemicrf.FilteredSemiCRF.v1", "spacy-fsemicrf.SemiCRF.v1",
         "spacy-fsemicrf.LinearCRF.v1"]
TWO_ORGS = "John Smith works for Google and Apple in Paris ."
AT_MOST_ONE_ORG = [{"kind": "at_most", "label": "ORG", "n": 1, "scope": "doc"}]


@pytest.fixture(scope="module", params=ARCHS)
def trained(request):
    nlp = spacy.blank("en")
    # boundary smoothing keeps the filter less sure next to entities, so that a wide margin
    # keeps nodes the best path leaves out (the n-best tests rank such paths)
    smoothing = {"boundary_smoothing": 0.2} if "Filtered" in request.param else {}
    nlp.add_pipe("fsemicrf_ner", config={"model": model_config(request.param, **smoothing)})
    data = TRAIN_DATA + [(TWO_ORGS, [(0, 10, "PER"), (21, 27, "ORG"), (32, 37, "ORG"), (41, 46, "LOC")])]
    train_pipeline(nlp, make_examples(nlp, data), n_iter=40)
    return nlp


def labels_of(doc, label):
    return [e.text for e in doc.ents if e.label_ == label]


def test_without_constraints_the_prediction_has_no_report(trained):
    doc = trained(TWO_ORGS)
    assert labels_of(doc, "ORG") == ["Google", "Apple"]
    assert "constraints" not in doc.spans["fsemicrf"].attrs


def test_a_constraint_set_on_the_component_is_obeyed_and_reported(trained):
    ner = trained.get_pipe("fsemicrf_ner")
    ner.constraints = AT_MOST_ONE_ORG
    try:
        doc = trained(TWO_ORGS)
    finally:
        ner.constraints = []
    assert len(labels_of(doc, "ORG")) == 1
    report = doc.spans["fsemicrf"].attrs["constraints"]
    assert report["status"] == "optimal" and report["score"] <= report["unconstrained"]
    # the constrained path is less probable than the unconstrained one
    free = trained(TWO_ORGS).spans["fsemicrf"].attrs["path_probability"]
    assert 0.0 <= doc.spans["fsemicrf"].attrs["path_probability"] < free


def test_constraints_in_the_config_round_trip_and_can_be_overridden_at_load(trained, tmp_path):
    trained.to_disk(tmp_path / "trained")
    nlp = spacy.load(tmp_path / "trained",
                     config={"components": {"fsemicrf_ner": {"constraints": AT_MOST_ONE_ORG}}})
    assert nlp.get_pipe("fsemicrf_ner").constraints == AT_MOST_ONE_ORG
    assert len(labels_of(nlp(TWO_ORGS), "ORG")) == 1
    nlp.to_disk(tmp_path / "constrained")
    loaded = spacy.load(tmp_path / "constrained")
    assert loaded.config["components"]["fsemicrf_ner"]["constraints"] == AT_MOST_ONE_ORG
    assert len(labels_of(loaded(TWO_ORGS), "ORG")) == 1
    again = spacy.load(tmp_path / "constrained",
                       config={"components": {"fsemicrf_ner": {"constraints": []}}})
    assert labels_of(again(TWO_ORGS), "ORG") == ["Google", "Apple"]


def test_constraints_per_call_and_per_document(trained, caplog):
    docs = list(trained.pipe([TWO_ORGS, TWO_ORGS],
                             component_cfg={"fsemicrf_ner": {"constraints": AT_MOST_ONE_ORG}}))
    assert [len(labels_of(d, "ORG")) for d in docs] == [1, 1]
    assert labels_of(trained(TWO_ORGS), "ORG") == ["Google", "Apple"]  # only for that call
    doc = trained.make_doc(TWO_ORGS)
    doc.user_data[USER_DATA_KEY] = [{"kind": "forbid_labels", "start": 4, "end": 5, "labels": ["ORG"]}]
    doc = trained(doc)
    assert "Google" not in labels_of(doc, "ORG")
    bad = trained.make_doc(TWO_ORGS)
    bad.user_data[USER_DATA_KEY] = [{"kind": "at_most", "label": "DRUG", "n": 1}]
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        bad = trained(bad)
    assert labels_of(bad, "ORG") == ["Google", "Apple"]
    left_out = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(left_out) == 1 and left_out[0].startswith(
        f"fsemicrf_ner: the constraints in doc.user_data[{USER_DATA_KEY!r}] are left out: ")


def test_a_sentence_scope_on_a_document_without_sentences_warns_once(trained, caplog):
    """Without sentence boundaries (no sentencizer, senter or parser before the component) a
    document is one sentence, so a per-sentence count acts on the whole document: say so."""
    ner = trained.get_pipe("fsemicrf_ner")
    ner._warned_unsegmented = False  # whatever ran before on the shared pipeline
    two = TWO_ORGS + " " + TWO_ORGS
    per_sentence = [{"kind": "at_most", "label": "ORG", "n": 1, "scope": "sentence"}]
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        docs = list(ner.pipe([trained.make_doc(two), trained.make_doc(two)],
                             constraints=per_sentence))
    assert [len(labels_of(d, "ORG")) for d in docs] == [1, 1]  # one sentence
    warned = [r.getMessage() for r in caplog.records if "sentence boundaries" in r.getMessage()]
    assert warned == [
        "fsemicrf_ner: a constraint with scope 'sentence' is applied to a document without "
        "sentence boundaries, which then counts as one sentence: add a sentencizer, senter or "
        "parser before the component, or use scope 'doc'"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):  # once: not at each call
        ner(trained.make_doc(two), constraints=per_sentence)
    assert not [r for r in caplog.records if "sentence boundaries" in r.getMessage()]
    caplog.clear()
    ner._warned_unsegmented = False
    split = trained.make_doc(two)
    for token in split:
        token.is_sent_start = token.i in (0, len(split) // 2)
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        doc = ner(split, constraints=per_sentence)
    assert len(labels_of(doc, "ORG")) == 2  # one per sentence
    assert not [r for r in caplog.records if "sentence boundaries" in r.getMessage()]


def test_the_sentence_scope_warning_reads_every_document_of_two_tokens_or_more(trained, caplog):
    """A document without constraints before the one with a per-sentence constraint is passed
    over; two tokens may be two sentences, one token cannot."""
    ner = trained.get_pipe("fsemicrf_ner")
    per_sentence = [{"kind": "at_most", "label": "ORG", "n": 1, "scope": "sentence"}]

    def warnings_for(*texts):
        docs = [trained.make_doc(text) for text in texts]
        docs[-1].user_data[USER_DATA_KEY] = per_sentence
        ner._warned_unsegmented = False
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
            list(ner.pipe(docs))
        return [r for r in caplog.records if "sentence boundaries" in r.getMessage()]

    assert len(warnings_for(TWO_ORGS, TWO_ORGS)) == 1
    assert len(warnings_for("Google Apple")) == 1
    assert not warnings_for("Google")


def test_document_constraints_too_many_with_the_components_are_left_out(trained, caplog):
    """Each set alone fits the search (31 states); together they need 961, more than
    MAX_STATES. The combined set was compiled outside the check and stopped the whole pipe."""
    ner = trained.get_pipe("fsemicrf_ner")
    first, second = ner.labels[:2]
    doc = trained.make_doc(TWO_ORGS)
    doc.user_data[USER_DATA_KEY] = [{"kind": "at_most", "label": second, "n": 30}]
    fine = trained.make_doc(TWO_ORGS)
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        docs = list(ner.pipe([doc, fine],
                             constraints=[{"kind": "at_most", "label": first, "n": 30}]))
    assert all(d.spans["fsemicrf"].attrs["constraints"]["status"] == "satisfied" for d in docs)
    left_out = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(left_out) == 1 and left_out[0].startswith(
        f"fsemicrf_ner: the constraints in doc.user_data[{USER_DATA_KEY!r}] are left out: with "
        f"the component's and the call's: these constraints need more than {MAX_STATES} search "
        "states")


def test_an_infeasible_document_keeps_its_prediction_with_a_warning(trained, caplog):
    force = [{"kind": "force_span", "start": 0, "end": 2, "label": "ORG"},
             {"kind": "forbid_labels", "start": 0, "end": 1, "labels": ["ORG"]}]
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        doc = trained.get_pipe("fsemicrf_ner")(trained.make_doc(TWO_ORGS), constraints=force)
    assert doc.spans["fsemicrf"].attrs["constraints"]["status"] == "infeasible"
    assert labels_of(doc, "ORG") == ["Google", "Apple"]
    assert doc.spans["fsemicrf"].attrs["constraints"]["reason"] == (
        "force_span 0..2 has a label that forbid_labels forbids there")
    assert [r.getMessage() for r in caplog.records if "cannot" in r.getMessage()] == [
        f"fsemicrf_ner: the constraints cannot all hold on the document {TWO_ORGS!r}: "
        "force_span 0..2 has a label that forbid_labels forbids there; it keeps the "
        "unconstrained prediction"]
    for size, quoted in ((60, None), (61, 57)):  # a text of 60 characters is quoted whole
        text = (TWO_ORGS + " x" * 40)[:size - 2] + " ."
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
            trained.get_pipe("fsemicrf_ner")(trained.make_doc(text), constraints=force)
        shown = text if quoted is None else text[:quoted] + "..."
        assert any(f"on the document {shown!r}: " in r.getMessage() for r in caplog.records)
    caplog.clear()
    long_text = " ".join([TWO_ORGS] * 2)  # quoted up to 57 characters and "..."
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        trained.get_pipe("fsemicrf_ner")(trained.make_doc(long_text), constraints=force)
    [message] = [r.getMessage() for r in caplog.records if "cannot" in r.getMessage()]
    quoted = repr(long_text[:57] + "...")
    assert message.startswith(
        f"fsemicrf_ner: the constraints cannot all hold on the document {quoted}: force_span 0..2")


def test_the_constrained_search_avoids_the_entities_already_on_the_doc(trained):
    """Entities already on the doc (an entity_ruler's) and blocked tokens keep predicted ones
    off their tokens: the constrained search avoids those tokens, so that doc.ents holds what
    the constraints ask for, and a span forced on them is infeasible, with a reason."""
    def preset(constraints):
        doc = trained.make_doc(TWO_ORGS)
        # "Apple" already an entity, "Google" blocked: neither can hold a predicted ORG
        doc.set_ents([Span(doc, 6, 7, "PRODUCT")], blocked=[doc[4:5]])
        doc.user_data[USER_DATA_KEY] = constraints
        return trained(doc)

    forced = preset([{"kind": "force_span", "start": 4, "end": 5, "label": "ORG"}])
    report = forced.spans["fsemicrf"].attrs["constraints"]
    assert report["status"] == "infeasible" and report["reason"] == (
        "force_span 4..5 overlaps an entity already on the document or a blocked token")
    assert ("Apple", "PRODUCT") in [(e.text, e.label_) for e in forced.ents]
    # named even where the decoder finds an earlier span forbidden by the user's forbid_labels
    both = preset([{"kind": "force_span", "start": 0, "end": 2, "label": "PER"},
                   {"kind": "forbid_labels", "labels": ["PER"], "start": 0, "end": 1},
                   {"kind": "force_span", "start": 4, "end": 5, "label": "ORG"}])
    assert both.spans["fsemicrf"].attrs["constraints"]["reason"] == (
        "force_span 4..5 overlaps an entity already on the document or a blocked token")
    counted = preset([{"kind": "at_least", "label": "ORG", "n": 1, "scope": "doc"}])
    report = counted.spans["fsemicrf"].attrs["constraints"]
    predicted = [(e.start, e.end, e.label_) for e in counted.ents if e.label_ != "PRODUCT"]
    if report["status"] != "infeasible":  # (the filtered head may keep no other ORG node)
        assert "ORG" in [label for _, _, label in predicted]
        assert [(s.start, s.end, s.label_) for s in counted.spans["fsemicrf"]] == predicted


def test_bad_constraints_fail_when_set():
    nlp = spacy.blank("en")
    with pytest.raises(ValueError):
        nlp.add_pipe("fsemicrf_ner", config={"constraints": [{"kind": "at_most", "label": "ORG", "n": -1}]})
    ner = nlp.add_pipe("fsemicrf_ner", name="ok")
    nlp.initialize(lambda: make_examples(nlp))
    with pytest.raises(ValueError, match="DRUG"):
        ner.constraints = [{"kind": "at_most", "label": "DRUG", "n": 1}]


def test_nbest_is_ranked_with_probabilities_and_starts_with_the_prediction(trained):
    ner = trained.get_pipe("fsemicrf_ner")
    doc = trained(TWO_ORGS)
    best = ner.nbest(doc, 5)
    assert 1 <= len(best) <= 5
    probs = [g.attrs["probability"] for g in best]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
    assert [(s.start, s.end, s.label_) for s in best[0]] == [(e.start, e.end, e.label_) for e in doc.ents]
    assert len({tuple((s.start, s.end, s.label_) for s in g) for g in best}) == len(best)
    numpy.testing.assert_allclose(probs[0], doc.spans["fsemicrf"].attrs["path_probability"], rtol=1e-3)
    assert len(ner.nbest(doc, 1)) == 1  # k = 1 is the prediction alone
    assert [g.name for g in best] == [f"fsemicrf_nbest_{r}" for r in range(1, len(best) + 1)]
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="positive integer"):
            ner.nbest(doc, bad)
    if ner.model.attrs["arch"] == "FilteredSemiCRF":
        # the filtered head ranks the paths of the graph its filter margin keeps
        margin = ner.filter_margin
        try:
            ner.filter_margin = 6.0
            wide = trained(TWO_ORGS)
            first = ner.nbest(wide, 3)[0]
            assert [(s.start, s.end, s.label_) for s in first] == [
                (e.start, e.end, e.label_) for e in wide.ents]
            assert [(s.start, s.end, s.label_) for s in first] != [
                (s.start, s.end, s.label_) for s in best[0]]
        finally:
            ner.filter_margin = margin


def test_invalid_document_constraints_are_warned_about_once(trained, caplog):
    """Trimming reads a document's forced spans again; its invalid constraints were then
    reported a second time."""
    ner = trained.get_pipe("fsemicrf_ner")
    doc = trained.make_doc(TWO_ORGS)
    doc.user_data[USER_DATA_KEY] = [{"kind": "at_most", "label": "DRUG", "n": 1}]
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        assert ner._forced_spans(doc) == set()
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        ner(doc)
    assert len([r for r in caplog.records if "left out" in r.getMessage()]) == 1


def test_one_unknown_label_leaves_out_all_the_documents_constraints(trained, caplog):
    """The document's forced span goes with its constraint that names an unknown label, and
    the warning names that label (not the search states of the constraints together)."""
    ner = trained.get_pipe("fsemicrf_ner")
    doc = trained.make_doc(TWO_ORGS)
    doc.user_data[USER_DATA_KEY] = [{"kind": "force_span", "start": 0, "end": 2, "label": "ORG"},
                                    {"kind": "at_most", "label": "DRUG", "n": 1}]
    assert ner._forced_spans(doc) == set()
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        doc = ner(doc)
    assert labels_of(doc, "ORG") == ["Google", "Apple"]
    assert "constraints" not in doc.spans["fsemicrf"].attrs
    [message] = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert message == (f"fsemicrf_ner: the constraints in doc.user_data[{USER_DATA_KEY!r}] are "
                       f"left out: at_most: unknown label 'DRUG'; the labels are "
                       f"{list(ner.labels)}")


@pytest.mark.parametrize("kind", ["at_least", "exactly"])
def test_the_written_entities_obey_the_constraints_on_text_with_whitespace_tokens(trained, kind):
    """Entities are trimmed of whitespace after decoding (one of whitespace only is left out),
    so the decoders may not start one on a whitespace token: the entities written obey the
    constraints whenever the report says they do."""
    text = "John  \n  Smith  \n  works for Google ."
    constraints = [{"kind": kind, "label": "PER", "n": 3, "scope": "doc"}]
    doc = trained(text, component_cfg={"fsemicrf_ner": {"constraints": constraints}})
    report = doc.spans["fsemicrf"].attrs["constraints"]
    assert not any(token.is_space for ent in doc.ents for token in (ent[0], ent[-1]))
    if report["status"] != "infeasible":
        assert len(labels_of(doc, "PER")) == 3


def test_the_threshold_leaves_the_entities_of_a_document_whose_constraints_hold(trained):
    """A threshold would break a constraint by leaving out what it asked for (here a forced
    span the model gives a low score): then the document keeps all its entities. A constraint
    that leaving entities out cannot break (an at_most) leaves the threshold as it is, and an
    infeasible document is thresholded as usual."""
    ner = trained.get_pipe("fsemicrf_ner")
    force = [{"kind": "force_span", "start": 2, "end": 4, "label": "LOC"}]  # "works for"
    cfg = {"fsemicrf_ner": {"constraints": force}}
    free = trained(TWO_ORGS, component_cfg=cfg)
    loose = {"fsemicrf_ner": {"constraints": [
        {"kind": "at_most", "label": "ORG", "n": 100, "scope": "doc"}]}}
    ner.threshold = 1.0
    try:
        doc = trained(TWO_ORGS, component_cfg=cfg)
        impossible = [{"kind": "at_least", "label": "PER", "n": 5, "scope": "doc"}]
        infeasible = trained("John Smith .", component_cfg={"fsemicrf_ner": {
            "constraints": impossible}})
        unbound = trained(TWO_ORGS, component_cfg=loose)
    finally:
        ner.threshold = 0.0
    assert unbound.spans["fsemicrf"].attrs["constraints"]["status"] == "satisfied"
    scores = trained(TWO_ORGS, component_cfg=loose).spans["fsemicrf"].attrs["scores"]
    assert (scores < 1.0).any()
    assert len(unbound.ents) == int((scores >= 1.0).sum())
    top = float(scores.max())  # a threshold that keeps some of a constrained doc's entities
    ner.threshold = top
    try:
        thresholded = trained(TWO_ORGS, component_cfg=loose)
    finally:
        ner.threshold = 0.0
    assert len(thresholded.ents) == int((scores >= top).sum()) >= 1
    assert doc.spans["fsemicrf"].attrs["constraints"]["status"] != "infeasible"
    assert ("works for", "LOC") in [(e.text, e.label_) for e in doc.ents]
    assert [(e.start, e.end, e.label_) for e in doc.ents] == [
        (e.start, e.end, e.label_) for e in free.ents]
    assert infeasible.spans["fsemicrf"].attrs["constraints"]["status"] == "infeasible"
    assert all(s >= 1.0 for s in infeasible.spans["fsemicrf"].attrs["scores"])


def test_a_document_without_tokens_is_reported_like_any_other(trained, caplog):
    """The empty segmentation of a document without tokens obeys an at_most (satisfied) and
    not an at_least (infeasible, with a warning), alone or in a batch with other documents."""
    at_least = {"fsemicrf_ner": {"constraints": [
        {"kind": "at_least", "label": "PER", "n": 1, "scope": "doc"}]}}
    at_most = {"fsemicrf_ner": {"constraints": AT_MOST_ONE_ORG}}
    with caplog.at_level(logging.WARNING, logger="spacy_fsemicrf"):
        alone = trained("", component_cfg=at_least)
        mixed = list(trained.pipe(["", TWO_ORGS], component_cfg=at_least))
    for doc in (alone, mixed[0]):
        report = doc.spans["fsemicrf"].attrs["constraints"]
        assert (report["status"], report["reason"]) == (
            "infeasible", "no segmentation obeys the count and pair constraints together")
    assert "the constraints cannot all hold on the document ''" in caplog.text
    assert trained("", component_cfg=at_most).spans["fsemicrf"].attrs["constraints"][
        "status"] == "satisfied"
    assert "constraints" not in trained("").spans["fsemicrf"].attrs


def test_the_constraints_of_a_pipe_call_stay_with_its_batches(trained):
    """While an nlp.pipe generator with constraints waits between its documents, another call
    of the component does not see them."""
    ner = trained.get_pipe("fsemicrf_ner")
    none = [{"kind": "at_most", "label": "ORG", "n": 0, "scope": "doc"}]
    paused = ner.pipe(iter([trained.make_doc(TWO_ORGS)] * 2), batch_size=1, constraints=none)
    first = next(paused)
    tok2vec_docs = [trained.make_doc(TWO_ORGS)]
    for name, proc in trained.pipeline:
        if name != "fsemicrf_ner":
            tok2vec_docs = list(proc.pipe(tok2vec_docs))
    ner.set_annotations(tok2vec_docs, ner.predict(tok2vec_docs))
    assert labels_of(first, "ORG") == [] and labels_of(tok2vec_docs[0], "ORG") == [
        "Google", "Apple"]
    assert labels_of(next(paused), "ORG") == []


# ------------------------------------------------- entities already on the doc, unit by unit

LABELS = ("ORG", "PER")
_BLANK = spacy.blank("en")


def _preset_doc(ents=(), blocked=(), n=8):
    """A doc of ``n`` tokens with the entities ``(start, end, label)`` already on it and the
    ``blocked`` token ranges ``(start, end)``; every other token annotated O."""
    doc = _BLANK.make_doc(" ".join(f"w{i}" for i in range(n)))
    doc.set_ents([Span(doc, s, e, label) for s, e, label in ents],
                 blocked=[doc[s:e] for s, e in blocked], default="outside")
    return doc


def _decoded(doc, user):
    """The constraints of ``doc`` with ``user``'s own, and the report of a decoder that finds
    them infeasible, with its reason (the first forced span that cannot hold, and why)."""
    doc.user_data[USER_DATA_KEY] = user
    [found] = constraints_of_docs([doc], (), LABELS, "ner")
    reason = force_conflict(found.program, len(doc), None)
    return found, ConstraintReport("infeasible", 0.0, 0.0, reason=reason)


@pytest.mark.parametrize("ents, blocked, runs", [
    ((), (), []),
    (((2, 4, "ORG"),), (), [(2, 4)]),
    (((0, 1, "PER"), (1, 3, "ORG")), (), [(0, 3)]),  # touching entities: one run
    (((6, 8, "ORG"),), ((3, 4),), [(3, 4), (6, 8)]),
    ((), ((0, 2), (5, 6)), [(0, 2), (5, 6)]),
])
def test_the_tokens_of_preset_entities_and_blocked_tokens_are_forbidden(ents, blocked, runs):
    """The runs of tokens an entity already on the doc or a blocked token takes; with
    constraints, a span of any label forced on one of those tokens, and only there, is one
    that forbid_labels forbids."""
    assert occupied_runs(_preset_doc(ents, blocked)) == runs
    taken = {t for a, b in runs for t in range(a, b)}
    for t in range(8):
        for label in LABELS:
            force = [{"kind": "force_span", "start": t, "end": t + 1, "label": label}]
            _, report = _decoded(_preset_doc(ents, blocked), force)
            assert ("forbid_labels" in report.reason) == (t in taken), (t, label)
    doc = _preset_doc(ents, blocked)
    assert constraints_of_docs([doc], (), LABELS, "ner") is None  # no constraints: none added


def test_occupied_runs_of_a_doc_without_entity_annotation():
    nlp = spacy.blank("en")
    assert occupied_runs(nlp.make_doc("a b c")) == []
    assert occupied_runs(nlp.make_doc("")) == []


def test_the_reason_names_the_preset_entity_only_for_a_span_forced_on_it():
    """A forced span that overlaps an entity already on the doc (or a blocked token) is
    infeasible because of that entity, not of a forbid_labels the user gave; a span forced
    next to it, forbidden by the user's own forbid_labels, keeps the user's reason."""
    occupied = "overlaps an entity already on the document or a blocked token"
    doc = _preset_doc([(2, 3, "PER")])  # token 2 taken
    for start, end, overlaps in [(1, 3, True), (2, 4, True), (2, 3, True), (0, 5, True),
                                 (0, 2, False), (3, 5, False)]:
        user = [{"kind": "force_span", "start": start, "end": end, "label": "ORG"},
                {"kind": "forbid_labels", "labels": ["ORG"], "start": 0, "end": 8}]
        found, report = _decoded(doc, user)
        assert "forbid_labels" in report.reason
        [out] = explain_unmet_forces([doc], [report], [found])
        expected = f"force_span {start}..{end} {occupied}" if overlaps else report.reason
        assert out.reason == expected, (start, end)
        assert out._replace(reason="") == report._replace(reason="")
    # reasons of another kind stay where no forced span overlaps a preset entity, and so do
    # the reports of documents that are not infeasible
    first = _preset_doc([(0, 1, "PER")])
    found, report = _decoded(first, [{"kind": "force_span", "start": 7, "end": 9, "label": "ORG"}])
    assert report.reason == "force_span 7..9 ends past the document's 8 tokens"
    assert explain_unmet_forces([first], [report], [found]) == [report]
    user = [{"kind": "force_span", "start": 2, "end": 3, "label": "ORG"}]
    found, report = _decoded(doc, user)
    for other in (report._replace(status="optimal"), report._replace(status="satisfied"), None):
        assert explain_unmet_forces([doc], [other], [found]) == [other]
    assert explain_unmet_forces([doc], [report], [None]) == [report]
    assert explain_unmet_forces([doc], None, [found]) is None
    assert explain_unmet_forces([doc], [report], None) == [report]
    # each document by its own entities
    free = _preset_doc()
    user = [{"kind": "force_span", "start": 2, "end": 3, "label": "ORG"},
            {"kind": "forbid_labels", "labels": ["ORG"], "start": 2, "end": 3}]
    found_free, report_free = _decoded(free, user)
    found, report = _decoded(_preset_doc([(2, 3, "PER")]), user)
    out = explain_unmet_forces([free, doc], [report_free, report], [found_free, found])
    assert out[0] == report_free and out[1].reason == f"force_span 2..3 {occupied}"
    out = explain_unmet_forces([free, doc], [None, report], [None, found])  # one without any
    assert out[0] is None and out[1].reason == f"force_span 2..3 {occupied}"


@pytest.mark.parametrize("user, decoder, named", [
    # the decoder names a span forced before it, forbidden by the user's own forbid_labels
    ([{"kind": "force_span", "start": 0, "end": 1, "label": "ORG"},
      {"kind": "forbid_labels", "labels": ["ORG"], "start": 0, "end": 1},
      {"kind": "force_span", "start": 2, "end": 3, "label": "ORG"}], "0..1 has a label", "2..3"),
    # ... or its overlap with another forced span
    ([{"kind": "force_span", "start": 0, "end": 2, "label": "ORG"},
      {"kind": "force_span", "start": 1, "end": 3, "label": "PER"}], "1..3 overlaps", "1..3"),
    # ... or that it ends past the document
    ([{"kind": "force_span", "start": 2, "end": 9, "label": "ORG"}], "2..9 ends past", "2..9"),
    # ... or the user's own forbid_labels, which forbids it on the same tokens too
    ([{"kind": "force_span", "start": 2, "end": 3, "label": "ORG"},
      {"kind": "forbid_labels", "labels": ["ORG"], "start": 2, "end": 3}], "2..3 has a label",
     "2..3"),
])
def test_a_span_forced_on_a_preset_entity_is_named_whatever_else_fails(user, decoder, named):
    """A span forced on a preset entity's tokens never holds, and those tokens are not in the
    user's constraints: the reason names it, whichever cause the decoder found first."""
    doc = _preset_doc([(2, 3, "PER")])  # token 2 taken
    found, report = _decoded(doc, user)
    assert report.reason.startswith(f"force_span {decoder}")
    [out] = explain_unmet_forces([doc], [report], [found])
    assert out == report._replace(
        reason=f"force_span {named} overlaps an entity already on the document or a blocked token")


def test_the_reason_names_the_first_span_forced_on_a_preset_entity_from_the_data():
    """Which forced span the reason names depends on the spans and the preset entities only:
    the first by start (then end, label) that overlaps one, whatever the decoder's text and
    the order the constraints were given in."""
    doc = _preset_doc([(2, 3, "PER")], blocked=[(5, 6)])
    user = [{"kind": "force_span", "start": 5, "end": 7, "label": "ORG"},
            {"kind": "force_span", "start": 0, "end": 1, "label": "PER"},
            {"kind": "force_span", "start": 1, "end": 3, "label": "ORG"}]
    found, report = _decoded(doc, user)
    expected = "force_span 1..3 overlaps an entity already on the document or a blocked token"
    for reason in (report.reason, "no segmentation obeys the count and pair constraints", ""):
        [out] = explain_unmet_forces([doc], [report._replace(reason=reason)], [found])
        assert out.reason == expected, reason
