"""Would a coverage-aware filter at prediction recover the entities the filter misses? A
research probe, not a product setting: ``filtered._filter`` is wrapped so that, besides the
spans the local classifier keeps, every token whose coverage (the sum of the non-null
probabilities of the spans over it) exceeds ``tau`` and that no kept span covers gets the span
over it with the highest non-null probability, labelled with its best entity label. Dev
P/R/F1 of the corpora benchmark's filtered models at the default margin, without the extra
nodes and at each ``tau``.

    python research/scripts/coverage_filter.py --output research/results/coverage_filter.json
"""
import argparse
import json

import spacy
import torch
from spacy.tokens import Doc, DocBin

from spacy_fsemicrf.structured import filtered

torch.set_num_threads(1)
ORIGINAL = filtered._filter
TAU = [None]


def cov_filter(local_scores, lengths, margin=0.0):
    """The filter's spans plus, for each uncovered token of coverage above ``TAU[0]``, the
    span over it with the highest non-null probability."""
    index, labels = ORIGINAL(local_scores, lengths, margin)
    tau = TAU[0]
    if tau is None:
        return index, labels
    B, L, K, C = local_scores.shape
    p = local_scores.float().softmax(-1)
    nonnull = 1 - p[..., 0]
    s_ = torch.arange(L)[None, :, None]; k_ = torch.arange(K)[None, None, :]
    valid = (s_ + k_) < lengths[:, None, None]
    nonnull = nonnull * valid
    diff = torch.zeros(B, L + 1)
    for k in range(K):
        diff[:, :L] += nonnull[:, :, k]
        diff[:, k + 1:] -= nonnull[:, :L - k, k]
    cov = diff.cumsum(1)[:, :L]
    covered = torch.zeros(B, L, dtype=torch.bool)
    for f in index.tolist():
        b, rem = divmod(f, L * K); s, k = divmod(rem, K); covered[b, s:s + k + 1] = True
    need = (cov > tau) & ~covered
    extra = set()
    for b, i in need.nonzero().tolist():
        best, arg = -1, None
        for k in range(K):
            for s in range(max(0, i - k), i + 1):
                if s + k < L and nonnull[b, s, k] > best:
                    best, arg = float(nonnull[b, s, k]), (s, k)
        extra.add(b * L * K + arg[0] * K + arg[1])
    extra -= set(index.tolist())
    if not extra:
        return index, labels
    ex = torch.tensor(sorted(extra))
    ex_labels = filtered.label_planes(local_scores).index_select(1, ex)[1:].max(0).indices + 1
    allidx = torch.cat([index, ex]); alllab = torch.cat([labels, ex_labels])
    order = allidx.argsort()
    return allidx[order], alllab[order]


filtered._filter = cov_filter


def prf(nlp, golds):
    tp = npred = ngold = 0
    docs = [Doc(nlp.vocab, words=[t.text for t in g], spaces=[bool(t.whitespace_) for t in g]) for g in golds]
    for g, d in zip(golds, nlp.pipe(docs, batch_size=32)):
        G = {(e.start, e.end, e.label_) for e in g.ents}; P = {(e.start, e.end, e.label_) for e in d.ents}
        tp += len(G & P); npred += len(P); ngold += len(G)
    p = tp / max(npred, 1); r = tp / ngold
    return round(100 * p, 2), round(100 * r, 2), round(200 * p * r / (p + r), 2)


parser = argparse.ArgumentParser()
parser.add_argument("--output", required=True)
args = parser.parse_args()
results = []
for corpus, seeds in (("nemo", (2, 3)), ("msra", (2, 3)), ("conll", (2,))):
    for seed in seeds:
        nlp = spacy.load(f"training/corpora/{corpus}/fsemicrf@seed{seed}/model-best")
        golds = list(DocBin().from_disk(f"corpus/{corpus}/dev.spacy").get_docs(nlp.vocab))
        for tau in (None, 0.35, 0.5, 0.75):
            TAU[0] = tau
            p, r, f = prf(nlp, golds)
            results.append({"corpus": corpus, "seed": seed, "tau": tau, "p": p, "r": r, "f": f})
            print(results[-1], flush=True)
with open(args.output, "w") as out:
    json.dump(results, out, indent=1)
