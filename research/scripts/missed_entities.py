"""Why does a filtered semi-CRF miss an entity? The local classifier's view of each missed one.

    python research/scripts/missed_entities.py training/span_max/fsemicrf-wordpool@seed0/model-best

A gold entity is *missed* when no predicted entity overlaps it (``fn_missed`` of
research/scripts/error_types.py). For a filtered head that happens in one of two ways: the local filter
kept no span overlapping the entity (the global head never saw it), or it kept some and the
best path went elsewhere. For each missed entity this records its width, how many kept nodes
overlap it, and the local classifier's null probability on the gold span itself: near 0.5 the
filter's threshold was close (a margin or a smaller null weight could keep it), near 1 the local
classifier is sure the span is not an entity. Documents run one at a time on the gold tokens, the
head seen through a forward pre-hook as in scripts/kept_nodes.py. Prints a summary per model and
writes the per-entity rows with ``--output``.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any, Dict, List

from repo import ROOT  # first: it puts the product scripts on the path
from error_types import width_bucket  # noqa: E402
from kept_nodes import find_head  # noqa: E402  (sets one thread)

import spacy  # noqa: E402
import torch  # noqa: E402
from spacy.tokens import Doc, DocBin  # noqa: E402

from spacy_fsemicrf.structured import filtered  # noqa: E402


def count_overlapping(kept: torch.Tensor, start: int, end: int) -> int:
    """Kept nodes of ``kept`` (bool ``[L, K]``, span ``(s, s + k)`` inclusive at ``[s, k]``) that
    overlap the tokens ``start..end - 1``: ``s < end`` and ``s + k >= start``."""
    return sum(int(kept[max(0, start - k):end, k].sum()) for k in range(kept.shape[1]))


def missed_entities(model: Path, corpus: Path, filter_margin: float | None = None) -> List[Dict[str, Any]]:
    """One row per missed gold entity of ``corpus`` under the pipeline at ``model``."""
    torch.set_num_threads(1)
    nlp = spacy.load(model)
    name, head = find_head(nlp)
    component = nlp.get_pipe(name)
    if filter_margin is not None:
        component.filter_margin = filter_margin
    captured: List[Any] = []

    def hook(module, hargs, hkwargs):
        X, lengths = hargs[0], hargs[1]
        with torch.no_grad():
            local, _ = module.span_scores(X, lengths, hkwargs.get("words"))
            kept, _ = filtered.inference_nodes(local, lengths, hkwargs.get("filter_margin", 0.0))
        captured.append((local.float().softmax(-1)[0], kept[0]))

    handle = head.register_forward_pre_hook(hook, with_kwargs=True)
    rows = []
    try:
        for i, gold in enumerate(DocBin().from_disk(corpus).get_docs(nlp.vocab)):
            captured.clear()
            doc = nlp(Doc(nlp.vocab, words=[t.text for t in gold],
                          spaces=[bool(t.whitespace_) for t in gold]))
            predicted = [(e.start, e.end) for e in doc.ents]
            for ent in gold.ents:
                if any(a < ent.end and ent.start < b for a, b in predicted):
                    continue
                row = {"doc": i, "start": ent.start, "end": ent.end, "label": ent.label_,
                       "text": ent.text, "width": len(ent), "kept_overlapping": 0, "p_null": None}
                if captured:  # empty docs never reach the head
                    probs, kept = captured[0]
                    row["kept_overlapping"] = count_overlapping(kept, ent.start, ent.end)
                    if len(ent) <= kept.shape[1]:
                        row["p_null"] = float(probs[ent.start, len(ent) - 1, 0])
                rows.append(row)
    finally:
        handle.remove()
    return rows


def summary(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    p_null = [r["p_null"] for r in rows if r["p_null"] is not None]
    by_width: Dict[str, int] = {}
    for r in rows:
        key = width_bucket(r["width"])
        by_width[key] = by_width.get(key, 0) + 1
    return {
        "missed": len(rows),
        "by_width": dict(sorted(by_width.items())),
        "no_kept_node_overlapping": sum(r["kept_overlapping"] == 0 for r in rows),
        "median_p_null": statistics.median(p_null) if p_null else None,
        "p_null_above_0.9": sum(p > 0.9 for p in p_null),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", type=Path, nargs="+")
    p.add_argument("--corpus", type=Path, default=ROOT / "corpus" / "dev.spacy")
    p.add_argument("--filter-margin", type=float, default=None,
                   help="prediction-time filter margin (default: the pipeline's own)")
    p.add_argument("--output", type=Path, default=None, help="write the rows and summaries as JSON")
    args = p.parse_args(argv)
    out = {}
    for model in args.models:
        rows = missed_entities(model, args.corpus, args.filter_margin)
        out[str(model)] = {"summary": summary(rows), "rows": rows}
        print(model, json.dumps(out[str(model)]["summary"]), flush=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"corpus": str(args.corpus), "models": out}, indent=1) + "\n")


if __name__ == "__main__":
    main()
