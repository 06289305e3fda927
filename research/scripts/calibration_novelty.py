"""Does calibrating entities seen in training apart from unseen ones carry better from dev to
test? For each model: raw confidences of its predicted entities on dev and test, each entity
marked seen when its text is the text of a gold entity of the training corpus; one map fitted
on all dev entities (the shipped method) against one map per group; ECE, Brier and PR-AUC on
test (and on dev, cross-fitted on halves of its documents).

    python research/scripts/calibration_novelty.py \
        conll=training/fsemicrf/model-best:corpus \
        nemo=training/corpora/nemo/fsemicrf@seed2/model-best:corpus/nemo \
        msra=training/corpora/msra/fsemicrf@seed2/model-best:corpus/msra \
        --output research/results/calibration_novelty.json
"""
import argparse
import json
import sys
from pathlib import Path

import numpy
import spacy
from spacy.util import minibatch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from confidence import ece, pr_curve  # noqa: E402

from spacy_fsemicrf.calibration import apply_calibration, fit_calibration, read_docs, unannotated


def entity_texts(docs):
    return {e.text for doc in docs for e in doc.ents}


def outcomes(nlp, docs, seen_texts):
    """raw, correct, seen, doc index of each predicted entity, and the gold count."""
    pipe = nlp.get_pipe("fsemicrf_ner")
    raw, correct, seen, ids = [], [], [], []
    for b, batch in enumerate(minibatch(docs, 64)):
        preds = list(nlp.pipe(unannotated(d) for d in batch))
        out = pipe.predict(preds)
        raw.append(out.scores)
        for i, start, end, label in out.spans.tolist():
            gold = batch[i]
            text = gold[start:end + 1].text
            correct.append(any(e.start == start and e.end == end + 1 and e.label_ == pipe.labels[label - 1]
                               for e in gold.ents))
            seen.append(text in seen_texts)
            ids.append(b * 64 + i)
    n_gold = sum(len(d.ents) for d in docs)
    return (numpy.concatenate(raw).astype("float64"), numpy.asarray(correct, bool),
            numpy.asarray(seen, bool), numpy.asarray(ids), n_gold)


def fit_pooled(raw, correct, seen):
    cal = fit_calibration(raw, correct)
    return lambda r, s: apply_calibration(cal, r).astype("float64")


def fit_grouped(raw, correct, seen):
    cals = {g: fit_calibration(raw[seen == g], correct[seen == g]) for g in (False, True)}

    def apply(r, s):
        out = numpy.zeros(r.shape)
        for g, cal in cals.items():
            out[s == g] = apply_calibration(cal, r[s == g])
        return out
    return apply


def measures(p, correct, n_gold):
    return {"ece": round(ece(p, correct), 4), "brier": round(float(numpy.mean((p - correct) ** 2)), 4),
            "pr_auc": round(pr_curve(p, correct, n_gold)[3], 4)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="+", help="name=MODEL:CORPUS_DIR (train/dev/test.spacy)")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    results = {}
    for item in args.models:
        name, rest = item.split("=", 1)
        model, corpus = rest.rsplit(":", 1)
        nlp = spacy.load(model)
        train = read_docs(Path(corpus) / "train.spacy", nlp.vocab)
        seen_texts = entity_texts(train)
        dev = outcomes(nlp, read_docs(Path(corpus) / "dev.spacy", nlp.vocab), seen_texts)
        test = outcomes(nlp, read_docs(Path(corpus) / "test.spacy", nlp.vocab), seen_texts)
        row = {"dev_entities": int(dev[0].size), "test_entities": int(test[0].size),
               "dev_seen_share": round(float(dev[2].mean()), 3),
               "test_seen_share": round(float(test[2].mean()), 3),
               "dev_precision_seen_unseen": [round(float(dev[1][dev[2] == g].mean()), 3) for g in (True, False)],
               "test_precision_seen_unseen": [round(float(test[1][test[2] == g].mean()), 3) for g in (True, False)]}
        for method, fit in (("pooled", fit_pooled), ("by_novelty", fit_grouped)):
            apply = fit(dev[0], dev[1], dev[2])
            row[method] = {"test": measures(apply(test[0], test[2]), test[1], test[4])}
            # dev, cross-fitted on halves of its documents
            half = dev[3] % 2 == 0
            p = numpy.zeros(dev[0].shape)
            for use in (half, ~half):
                p[use] = fit(dev[0][~use], dev[1][~use], dev[2][~use])(dev[0][use], dev[2][use])
            row[method]["dev_cross_fitted"] = measures(p, dev[1], dev[4])
        results[name] = row
        print(name, json.dumps(row), flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
