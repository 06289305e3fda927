"""The README's Python examples run as written.

The README has three ``python`` blocks: the quickstart, which trains a pipeline on two
sentences; the choice of another head, which continues the quickstart's namespace (``spacy``
comes from there); and the constraints and n-best example, which needs a trained pipeline bound
to ``nlp``. That one runs on the small pipeline the suite trains once (tests/conftest.py), so
only what holds whatever the model predicts is checked: the constraint holds, its report is
there, and ``nbest`` gives at most 5 segmentations, best first, with probabilities.
"""
import contextlib
import io
import re
from pathlib import Path
from typing import Any, Dict, List

import pytest

ROOT = Path(__file__).resolve().parent.parent


def python_blocks(text: str) -> List[str]:
    """The code of the ```python blocks of a Markdown text, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)


BLOCKS = python_blocks((ROOT / "README.md").read_text(encoding="utf8"))


def run(code: str, namespace: Dict[str, Any], name: str) -> str:
    """Run ``code`` in ``namespace``; returns what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"README.md:{name}", "exec"), namespace)
    return out.getvalue()


def test_the_readme_has_the_three_examples():
    assert len(BLOCKS) == 3, "update tests/test_readme_snippets.py to the README's examples"
    assert "nlp.update" in BLOCKS[0]
    assert "DEFAULT_MODELS" in BLOCKS[1]
    assert "nbest" in BLOCKS[2]


def test_quickstart_and_another_head():
    namespace: Dict[str, Any] = {}
    printed = run(BLOCKS[0], namespace, "quickstart").splitlines()
    doc = namespace["doc"]
    assert printed == [str([(ent.text, ent.label_) for ent in doc.ents]),
                       str(doc.spans["fsemicrf"].attrs["scores"])]
    assert len(doc.spans["fsemicrf"].attrs["scores"]) == len(doc.spans["fsemicrf"])
    assert namespace["ner"].labels == ("LOC", "ORG", "PER")  # read from the examples

    run(BLOCKS[1], namespace, "another head")
    ner = namespace["nlp"].get_pipe("fsemicrf_ner")
    assert ner.model.attrs["arch"] == "SemiCRF"
    # the other name the comment offers
    linear = BLOCKS[1].replace('DEFAULT_MODELS["SemiCRF"]', 'DEFAULT_MODELS["LinearCRF"]')
    assert linear != BLOCKS[1]
    run(linear, namespace, "another head")
    assert namespace["nlp"].get_pipe("fsemicrf_ner").model.attrs["arch"] == "LinearCRF"


@pytest.fixture
def constrainable(trained_nlp):
    """The suite's trained pipeline, its component's constraints put back afterwards."""
    ner = trained_nlp.get_pipe("fsemicrf_ner")
    before = ner.constraints
    yield trained_nlp
    ner.constraints = before


def test_constraints_and_nbest(constrainable):
    namespace: Dict[str, Any] = {"nlp": constrainable}
    printed = run(BLOCKS[2], namespace, "constraints and n-best").splitlines()
    assert len(printed) == 4
    doc, best = namespace["doc"], namespace["best"]
    assert sum(ent.label_ == "ORG" for ent in doc.ents) <= 1
    report = doc.spans["fsemicrf"].attrs["constraints"]
    assert report["status"] in ("satisfied", "optimal", "infeasible")
    assert printed[2] == str(report)
    assert 1 <= len(best) <= 5
    probabilities = [group.attrs["probability"] for group in best]
    assert all(0.0 <= p <= 1.0 for p in probabilities)
    assert probabilities == sorted(probabilities, reverse=True)
    assert printed[3] == str([(g.attrs["probability"], [(s.text, s.label_) for s in g])
                              for g in best])
