"""Recall on entities seen and unseen in training: where does a head's recall go?

    python research/scripts/recall_by_novelty.py MODEL [MODEL ...] --train corpus/nemo/train.spacy \
        --corpus corpus/nemo/dev.spacy --output research/results/recall_by_novelty_nemo.json

A gold entity of ``--corpus`` is *seen* when its text (lower-cased) is the text of some gold
entity of ``--train``, whatever the label, else *unseen*. Each model predicts on the gold
tokens; an entity is found when a predicted entity has its exact boundaries and label. Prints
and writes, per model, the recall over seen and unseen entities and their counts.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Dict, List

from repo import ROOT

import spacy
from spacy.tokens import Doc, DocBin


def entity_texts(path: Path, vocab) -> set:
    return {e.text.lower() for doc in DocBin().from_disk(path).get_docs(vocab) for e in doc.ents}


def recall_by_novelty(model: Path, train: Path, corpus: Path) -> Dict[str, Any]:
    nlp = spacy.load(model)
    seen_texts = entity_texts(train, nlp.vocab)
    gold_docs = list(DocBin().from_disk(corpus).get_docs(nlp.vocab))
    inputs = [Doc(nlp.vocab, words=[t.text for t in d], spaces=[bool(t.whitespace_) for t in d])
              for d in gold_docs]
    counts = {"seen": [0, 0], "unseen": [0, 0]}  # [found, total]
    for gold, pred in zip(gold_docs, nlp.pipe(inputs, batch_size=32)):
        predicted = {(e.start, e.end, e.label_) for e in pred.ents}
        for e in gold.ents:
            kind = "seen" if e.text.lower() in seen_texts else "unseen"
            counts[kind][1] += 1
            counts[kind][0] += (e.start, e.end, e.label_) in predicted
    return {kind: {"recall": found / total if total else None, "entities": total}
            for kind, (found, total) in counts.items()}


def main(argv: List[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", type=Path, nargs="+")
    p.add_argument("--train", type=Path, default=ROOT / "corpus" / "train.spacy")
    p.add_argument("--corpus", type=Path, default=ROOT / "corpus" / "dev.spacy")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    out = {}
    for model in args.models:
        out[str(model)] = recall_by_novelty(model, args.train, args.corpus)
        print(model, json.dumps(out[str(model)]))
    if args.output:
        args.output.write_text(json.dumps({"corpus": str(args.corpus), "train": str(args.train),
                                           "models": out}, indent=1) + "\n")


if __name__ == "__main__":
    main()
