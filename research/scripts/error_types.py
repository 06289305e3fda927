"""Sort the entity errors of trained pipelines by kind, on a .spacy corpus (dev by default).

    python research/scripts/error_types.py training/span_max/fsemicrf-docvec@seed{0,1,2,3,4,5}/model-best

Each predicted entity that is not a gold entity is a false positive of one kind: ``type`` (a
gold entity has the same span, another label), ``boundary`` (it overlaps a gold entity) or
``spurious`` (it overlaps none); each gold entity not predicted is a false negative: ``type``,
``boundary`` (a prediction overlaps it) or ``missed``; the missed ones are also counted by width
(``missed_w1`` .. ``missed_w4+``, in tokens). Prints the counts per model and their mean, which
say what a change to a model fixed (e.g. doc_vector: ``results/sweeps/doc_vector_errors.json``).
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, Tuple

from repo import ROOT  # first: it puts the product scripts on the path
from benchmark import load_docs, make_inputs  # noqa: E402  (scripts/benchmark.py)

KINDS = ("tp", "fp_type", "fp_boundary", "fp_spurious", "fn_type", "fn_boundary", "fn_missed",
         "missed_w1", "missed_w2", "missed_w3", "missed_w4+")
Entities = Dict[Tuple[int, int], str]


def width_bucket(width: int) -> str:
    """``"1"``, ``"2"``, ``"3"`` or ``"4+"``: the width classes the missed entities are counted in."""
    return str(width) if width < 4 else "4+"


def classify(gold: Entities, pred: Entities) -> Counter:
    """Counts of each kind for one document; ``gold`` and ``pred`` map ``(start, end)`` token
    offsets (end exclusive) to labels."""
    counts: Counter = Counter({kind: 0 for kind in KINDS})

    def overlaps(span: Tuple[int, int], others: Iterable[Tuple[int, int]]) -> bool:
        return any(a < span[1] and span[0] < b for a, b in others)

    for span, label in pred.items():
        if gold.get(span) == label:
            counts["tp"] += 1
        elif span in gold:
            counts["fp_type"] += 1
        elif overlaps(span, gold):
            counts["fp_boundary"] += 1
        else:
            counts["fp_spurious"] += 1
    for span, label in gold.items():
        if pred.get(span) == label:
            continue
        if span in pred:
            counts["fn_type"] += 1
        elif overlaps(span, pred):
            counts["fn_boundary"] += 1
        else:
            counts["fn_missed"] += 1
            counts["missed_w" + width_bucket(span[1] - span[0])] += 1
    return counts


def model_errors(model: Path, corpus: Path) -> Counter:
    """Error counts of the pipeline at ``model`` on the gold tokens of ``corpus``."""
    import spacy

    nlp = spacy.load(model)
    golds = load_docs(corpus, None)
    total: Counter = Counter({kind: 0 for kind in KINDS})
    for gold, pred in zip(golds, nlp.pipe(make_inputs(nlp, golds, raw_text=False))):
        total.update(classify({(e.start, e.end): e.label_ for e in gold.ents},
                              {(e.start, e.end): e.label_ for e in pred.ents}))
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", type=Path, nargs="+")
    p.add_argument("--corpus", type=Path, default=ROOT / "corpus" / "dev.spacy")
    p.add_argument("--output", type=Path, default=None, help="write the counts as JSON here")
    args = p.parse_args()
    rows = {}
    for model in args.models:
        rows[str(model)] = model_errors(model, args.corpus)
        print(str(model), " ".join(f"{k} {rows[str(model)][k]}" for k in KINDS), flush=True)
    mean = {k: round(statistics.mean(r[k] for r in rows.values()), 1) for k in KINDS}
    print("mean", " ".join(f"{k} {mean[k]}" for k in KINDS))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(
            {"corpus": str(args.corpus), "models": {m: dict(c) for m, c in rows.items()},
             "mean": mean}, indent=1) + "\n")


if __name__ == "__main__":
    main()
