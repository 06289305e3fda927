"""How much entity mass does the local classifier put over the entities the filtered head
misses? For each gold dev entity: its coverage, the largest over its tokens of the sum of the
non-null probabilities of the spans over the token, and (missed ones) the largest non-null
probability of a span overlapping it. Quantiles for missed and found entities.

    python research/scripts/missed_coverage.py --output research/results/missed_coverage.json
"""
import argparse
import json
import sys
from pathlib import Path

import numpy
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from repo import ROOT  # noqa: E402,F401  (puts the product scripts on the path)
from kept_nodes import find_head  # noqa: E402

import spacy  # noqa: E402
from spacy.tokens import Doc, DocBin  # noqa: E402

QUANTILES = (0.25, 0.5, 0.75, 0.9)


def coverage(nonnull: torch.Tensor) -> torch.Tensor:
    """``[L]``: for each token, the sum of the non-null probabilities (``[L, K]``) of the spans
    over it."""
    L, K = nonnull.shape
    cov = torch.zeros(L)
    for k in range(K):
        for s in range(L - k):
            cov[s:s + k + 1] += nonnull[s, k]
    return cov


def best_overlapping(nonnull: torch.Tensor, start: int, end: int) -> float:
    """The largest non-null probability of a span overlapping tokens ``start..end - 1``."""
    L, K = nonnull.shape
    return max(float(nonnull[s, k]) for s in range(max(0, start - K), end) for k in range(K)
               if s + k >= start and s + k < L)


def analyse(model: str, corpus: str) -> dict:
    torch.set_num_threads(1)
    nlp = spacy.load(model)
    _, head = find_head(nlp)
    captured = []

    def hook(module, hargs, hkwargs):
        X, lengths = hargs[0], hargs[1]
        with torch.no_grad():
            local, _ = module.span_scores(X, lengths, hkwargs.get("words"))
        captured.append(local.float().softmax(-1)[0])

    handle = head.register_forward_pre_hook(hook, with_kwargs=True)
    cov_missed, best_missed, cov_found = [], [], []
    for gold in DocBin().from_disk(corpus).get_docs(nlp.vocab):
        captured.clear()
        doc = nlp(Doc(nlp.vocab, words=[t.text for t in gold],
                      spaces=[bool(t.whitespace_) for t in gold]))
        if not captured:  # empty documents never reach the head
            continue
        nonnull = 1 - captured[0][..., 0]
        cov = coverage(nonnull)
        predicted = [(e.start, e.end) for e in doc.ents]
        for ent in gold.ents:
            c = float(cov[ent.start:ent.end].max())
            if any(a < ent.end and ent.start < b for a, b in predicted):
                cov_found.append(c)
            else:
                cov_missed.append(c)
                best_missed.append(best_overlapping(nonnull, ent.start, ent.end))
    handle.remove()

    def q(xs):
        return {p: round(float(numpy.quantile(xs, p)), 3) for p in QUANTILES}

    return {"model": model, "missed": len(cov_missed), "missed_coverage_quantiles": q(cov_missed),
            "missed_share_coverage_above_0.5": round(float(numpy.mean(numpy.array(cov_missed) > 0.5)), 3),
            "missed_best_overlapping_non_null_quantiles": q(best_missed),
            "found": len(cov_found), "found_coverage_quantiles": q(cov_found)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    out = [analyse(f"training/corpora/{c}/fsemicrf@seed2/model-best", f"corpus/{c}/dev.spacy")
           for c in ("nemo", "msra")]
    print(json.dumps(out, indent=1))
    Path(args.output).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
