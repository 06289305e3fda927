"""How much the entity scores of trained pipelines mean: calibration and precision-recall.

    python scripts/confidence.py --models fsemicrf=training/fsemicrf/model-best \\
        semicrf=training/semicrf/model-best crf=training/crf/model-best \\
        spancat=training/spancat/model-best \\
        --test corpus/test.spacy --dev corpus/dev.spacy --output benchmarks/results/confidence

For each pipeline (``fsemicrf_ner`` components: ``doc.spans[spans_key].attrs["scores"]``, as
loaded, so calibrated when the pipeline carries a map; ``spancat``: its
``doc.spans[key].attrs["scores"]``) on the test and the dev set, predicted from the gold tokens:

* ECE: expected calibration error over 10 equal-width score bins, ``sum_b n_b / n *
  |accuracy_b - mean score_b|``, an entity being correct when its span and label are gold;
* Brier score: mean ``(score - correct)^2``; the share of scores >= 0.999;
* the precision-recall curve from sweeping a threshold over the scores (recall relative to all
  gold entities, so it ends at the pipeline's recall) and the area under it (the sum of the
  precision at each threshold times the recall it adds);
* for the fsemicrf_ner pipelines, the same figures for the raw scores, and on the dev set the
  raw scores and the maps (Platt scaling, isotonic regression, a map each for entities seen
  and unseen in training, and the one the package selects among them) fitted on one half of the documents and measured on the other, both ways
  round, as a check of the calibration method.

spancat only reports the spans scoring above its own ``threshold`` (0.5 in the shipped
config), which truncates its curve there; ``--spancat-threshold T`` adds a row for each
spancat pipeline loaded with a lower threshold. Writes OUTPUT.json, OUTPUT.md and OUTPUT.png
(reliability diagrams, one panel per pipeline). The dev set is the one the maps were fitted on.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy
import spacy
from spacy.tokens import Doc

from spacy_fsemicrf.calibration import (
    FITS,
    CorpusError,
    apply_calibration,
    entity_key,
    fit_calibration,
    read_docs,
    unannotated,
)

N_BINS = 10
CURVE_POINTS = 101  # points of the stored precision-recall curve (thresholds 0, 0.01, ... 1)
BATCH_SIZE = 64


def scored_spans(nlp, doc: Doc) -> Tuple[List[Tuple[int, int, str]], numpy.ndarray]:
    """The scored entities of a predicted doc: ``fsemicrf_ner``'s, else spancat's."""
    for name, proc in nlp.pipeline:
        factory = nlp.get_pipe_meta(name).factory
        if factory == "fsemicrf_ner":
            key = proc.spans_key
        elif factory in ("spancat", "spancat_singlelabel"):
            key = proc.key
        else:
            continue
        group = doc.spans[key] if key in doc.spans else []
        scores = numpy.asarray(group.attrs["scores"] if len(group) else [], dtype="float64")
        return [(s.start, s.end, s.label_) for s in group], scores.reshape(-1)  # spancat: [n, 1]
    raise ValueError("the pipeline has no fsemicrf_ner or spancat component")


def outcomes(
    nlp, gold_docs: List[Doc], seen_keys: Optional[numpy.ndarray] = None
) -> Tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray, int, numpy.ndarray]:
    """``(scores, correct, doc index, n_gold, seen)`` of every scored entity of ``nlp`` on the
    tokens of ``gold_docs``; seen: its text is among ``seen_keys`` (the training entities'
    hashes; none seen without them)."""
    keys = set() if seen_keys is None else set(seen_keys.tolist())
    scores, correct, doc_ids, seen = [], [], [], []
    n_gold = 0
    inputs = (unannotated(doc) for doc in gold_docs)
    for i, (gold, doc) in enumerate(zip(gold_docs, nlp.pipe(inputs, batch_size=BATCH_SIZE))):
        truth = {(e.start, e.end, e.label_) for e in gold.ents}
        n_gold += len(truth)
        spans, values = scored_spans(nlp, doc)
        scores.append(values)
        correct.extend(span in truth for span in spans)
        seen.extend(entity_key(doc[start:end].text) in keys for start, end, _ in spans)
        doc_ids.extend([i] * len(spans))
    return (numpy.concatenate(scores) if scores else numpy.zeros(0), numpy.asarray(correct, bool),
            numpy.asarray(doc_ids, dtype="int64"), n_gold, numpy.asarray(seen, bool))


def reliability(scores: numpy.ndarray, correct: numpy.ndarray) -> List[Dict[str, float]]:
    """Per equal-width bin: entity count, mean score, accuracy."""
    bins = numpy.minimum((scores * N_BINS).astype(int), N_BINS - 1)
    out = []
    for b in range(N_BINS):
        inside = bins == b
        n = int(inside.sum())
        out.append({"lo": b / N_BINS, "hi": (b + 1) / N_BINS, "n": n,
                    "score": float(scores[inside].mean()) if n else None,
                    "accuracy": float(correct[inside].mean()) if n else None})
    return out


def ece(scores: numpy.ndarray, correct: numpy.ndarray) -> float:
    n = max(len(scores), 1)
    return float(sum(b["n"] / n * abs(b["accuracy"] - b["score"])
                     for b in reliability(scores, correct) if b["n"]))


def pr_curve(scores: numpy.ndarray, correct: numpy.ndarray, n_gold: int):
    """``(thresholds, precision, recall)`` at each distinct score (keeping the entities scoring
    at least it), highest first, and the area under the curve."""
    order = numpy.argsort(-scores, kind="stable")
    s, c = scores[order], correct[order].astype(float)
    tp = numpy.cumsum(c)
    last = numpy.r_[s[1:] != s[:-1], True]  # ties enter together
    kept = numpy.arange(1, len(s) + 1)[last]
    precision, recall = tp[last] / kept, tp[last] / max(n_gold, 1)
    area = float(numpy.sum(numpy.diff(numpy.r_[0.0, recall]) * precision))
    return s[last], precision, recall, area


def summary(scores: numpy.ndarray, correct: numpy.ndarray, n_gold: int) -> Dict:
    thresholds, precision, recall, area = pr_curve(scores, correct, n_gold)
    curve = []
    for t in numpy.linspace(0, 1, CURVE_POINTS):
        k = numpy.searchsorted(-thresholds, -t, side="right") - 1  # lowest threshold >= t
        if k >= 0:
            curve.append({"threshold": round(float(t), 2), "precision": float(precision[k]),
                          "recall": float(recall[k])})
    n, tp = len(scores), int(correct.sum())
    p, r = tp / max(n, 1), tp / max(n_gold, 1)
    return {
        "n_entities": n, "n_gold": n_gold, "n_correct": tp,
        "p": p, "r": r, "f": 2 * p * r / (p + r) if p + r else 0.0,
        "ece": ece(scores, correct),
        "brier": float(numpy.mean((scores - correct) ** 2)) if n else None,
        "share_ge_0999": float(numpy.mean(scores >= 0.999)) if n else None,
        "pr_auc": area,
        "reliability": reliability(scores, correct),
        "pr_curve": curve,
    }


# ----------------------------------------------------------------------------- methods


def cross_fitted(raw: numpy.ndarray, correct: numpy.ndarray, doc_ids: numpy.ndarray, n_gold: int,
                 seen: numpy.ndarray):
    """Figures of the raw scores and of the maps (Platt scaling, isotonic regression, a map
    each for seen and unseen entities, and the one :func:`fit_calibration` selects) fitted on
    the even documents and applied to the odd ones, and the reverse."""
    folds = doc_ids % 2
    fits = {**FITS, "selected": fit_calibration}
    if not seen.any():
        del fits["by_novelty"]
    out = {"raw": raw.copy(), **{name: numpy.zeros_like(raw) for name in fits}}
    for k in (0, 1):
        fit, use = folds != k, folds == k
        for name, fit_map in fits.items():
            fitted = fit_map(raw[fit], correct[fit], seen[fit] if seen.any() else None)
            out[name][use] = apply_calibration(fitted, raw[use], seen[use])
    return {name: {k: v for k, v in summary(s, correct, n_gold).items()
                   if k not in ("reliability", "pr_curve")} for name, s in out.items()}


# ----------------------------------------------------------------------------- runs


def training_of(path: Path) -> Optional[Dict]:
    """Steps run and best step from the train_summary.json next to the model directory
    (written by scripts/train.py), if there is one."""
    summary_path = Path(path).parent / "train_summary.json"
    if not summary_path.exists():
        return None
    info = json.loads(summary_path.read_text())
    return {k: info.get(k) for k in ("steps_run", "best_step", "config")}


def evaluate(name: str, path: Path, splits: Dict[str, List[Doc]], spancat_threshold: Optional[float]):
    nlp = spacy.load(path)
    training = training_of(path) or {}
    training["config_max_steps"] = nlp.config["training"].get("max_steps")
    factories = {nlp.get_pipe_meta(n).factory: n for n in nlp.pipe_names}
    results = {}
    if "fsemicrf_ner" in factories:
        ner = nlp.get_pipe(factories["fsemicrf_ner"])
        calibration = ner.calibration
        entry = {"kind": "fsemicrf_ner", "path": str(path), "calibration": calibration,
                 "head": ner.model.attrs.get("arch"), "training": training}
        for split, docs in splits.items():
            ner.calibration = calibration
            scores, correct, doc_ids, n_gold, _ = outcomes(nlp, docs)
            entry[split] = summary(scores, correct, n_gold)
            ner.calibration = None
            raw, raw_correct, doc_ids, _, seen = outcomes(nlp, docs, ner.seen_entities)
            entry[f"{split}_raw"] = {k: v for k, v in summary(raw, raw_correct, n_gold).items()
                                     if k not in ("reliability", "pr_curve")}
            if split == "dev":
                entry["dev_methods"] = cross_fitted(raw, raw_correct, doc_ids, n_gold, seen)
        ner.calibration = calibration
        results[name] = entry
    elif any(f.startswith("spancat") for f in factories):
        comp = next(n for f, n in factories.items() if f.startswith("spancat"))
        thresholds = [None] + ([spancat_threshold] if spancat_threshold is not None else [])
        own = nlp.get_pipe(comp).cfg["threshold"]
        for t in thresholds:
            # spancat keeps its threshold in cfg, which loading restores over a config override
            nlp.get_pipe(comp).cfg["threshold"] = own if t is None else t
            entry = {"kind": "spancat", "path": str(path), "threshold": own if t is None else t,
                     "training": training}
            for split, docs in splits.items():
                scores, correct, _, n_gold, _ = outcomes(nlp, docs)
                entry[split] = summary(scores, correct, n_gold)
            results[name if t is None else f"{name} (threshold {t:g})"] = entry
    else:
        raise ValueError(f"{path}: no fsemicrf_ner or spancat component")
    return results


def fmt(x, spec=".3f"):
    return "–" if x is None else format(x, spec)


def write_markdown(res: Dict, path: Path) -> None:
    lines = ["# Entity confidences: calibration and precision-recall", "",
             f"Command: `{res['command']}`", "",
             "| pipeline | model | training steps run | best step | max_steps in its config |",
             "|---|---|---:|---:|---:|"]
    for name, r in res["pipelines"].items():
        t = r.get("training") or {}
        lines.append(f"| {name} | `{r['path']}` | {t.get('steps_run', '–')} | "
                     f"{t.get('best_step', '–')} | {t.get('config_max_steps', '–')} |")
    lines.append("")
    for split in ("test", "dev"):
        info = res["corpora"][split]
        lines += [f"## {split} (`{info['path']}`: {info['docs']} docs, {info['entities']} gold "
                  f"entities)", "",
                  "| pipeline | scores | ECE | Brier | share >= 0.999 | PR-AUC | P | R | F1 |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for name, r in res["pipelines"].items():
            rows = [("as loaded" if r["kind"] == "fsemicrf_ner" and r["calibration"] else
                     "raw (no map)" if r["kind"] == "fsemicrf_ner" else
                     f"spancat, threshold {r['threshold']:g}", r[split])]
            if r["kind"] == "fsemicrf_ner" and r["calibration"]:
                rows.append(("raw", r[f"{split}_raw"]))
            for label, s in rows:
                lines.append(f"| {name} | {label} | {fmt(s['ece'])} | {fmt(s['brier'])} | "
                             f"{fmt(100 * s['share_ge_0999'], '.1f')}% | {fmt(s['pr_auc'])} | "
                             f"{fmt(100 * s['p'], '.2f')} | {fmt(100 * s['r'], '.2f')} | "
                             f"{fmt(100 * s['f'], '.2f')} |")
        lines.append("")
    lines += ["## Calibration methods, cross-fitted on dev", "",
              "Fitted on half of the dev documents, measured on the other half, both ways round.",
              "", "| pipeline | method | ECE | Brier | PR-AUC |", "|---|---|---:|---:|---:|"]
    for name, r in res["pipelines"].items():
        for method, s in r.get("dev_methods", {}).items():
            lines.append(f"| {name} | {method} | {fmt(s['ece'])} | {fmt(s['brier'])} | "
                         f"{fmt(s['pr_auc'])} |")
    lines += ["", "The maps as stored in the pipelines:", ""]
    for name, r in res["pipelines"].items():
        if r["kind"] == "fsemicrf_ner":
            lines.append(f"- {name}: `{json.dumps(r['calibration'])}`")
    lines += ["", "spancat's own threshold drops every span scoring below it, so its curve ends "
              "there; fsemicrf_ner's curves end at the recall of its decoded entities "
              "(threshold 0)."]
    path.write_text("\n".join(lines) + "\n")


def plot(res: Dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res["pipelines"])
    fig, axes = plt.subplots(2, len(names), figsize=(3.2 * len(names), 6.4), squeeze=False)
    for j, name in enumerate(names):
        r = res["pipelines"][name]
        ax = axes[0][j]
        ax.plot([0, 1], [0, 1], color="gray", lw=0.8, ls="--")
        for split, color in (("test", "tab:blue"), ("dev", "tab:orange")):
            bins = [b for b in r[split]["reliability"] if b["n"]]
            ax.plot([b["score"] for b in bins], [b["accuracy"] for b in bins], "o-", color=color,
                    ms=3, label=f"{split} (ECE {r[split]['ece']:.3f})")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("score")
        ax.set_xlim(0, 1), ax.set_ylim(0, 1)
        ax.legend(fontsize=7, loc="upper left")
        ax = axes[1][j]
        counts = [b["n"] for b in r["test"]["reliability"]]
        ax.bar([b["lo"] + 0.05 for b in r["test"]["reliability"]], counts, width=0.09,
               color="tab:blue")
        ax.set_xlabel("score (test entities per bin)")
        ax.set_xlim(0, 1)
    axes[0][0].set_ylabel("accuracy")
    axes[1][0].set_ylabel("entities")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", required=True, help="name=path of trained pipelines")
    p.add_argument("--test", type=Path, default=Path("corpus/test.spacy"))
    p.add_argument("--dev", type=Path, default=Path("corpus/dev.spacy"))
    p.add_argument("--output", type=Path, default=Path("benchmarks/results/confidence"))
    p.add_argument("--spancat-threshold", type=float, default=None)
    p.add_argument("--limit", type=int, default=None, help="first N documents of each set")
    args = p.parse_args(argv)
    logging.getLogger("spacy_fsemicrf").setLevel(logging.ERROR)  # raw scores on purpose here
    for spec in args.models:  # before any pipeline loads or any corpus is read
        name, _, path = spec.partition("=")
        if not name or not path or not Path(path).is_dir():
            p.error(f"--models takes NAME=PATH of pipeline directories, got {spec!r}")
    vocab = spacy.blank("en").vocab
    try:
        splits = {s: read_docs(getattr(args, s), vocab)[: args.limit] for s in ("test", "dev")}
    except CorpusError as err:  # a missing or unreadable --test or --dev
        p.error(str(err))
    res = {"command": "python scripts/confidence.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "corpora": {s: {"path": str(getattr(args, s)), "docs": len(d),
                           "entities": sum(len(doc.ents) for doc in d)} for s, d in splits.items()},
           "pipelines": {}}
    for spec in args.models:
        name, _, path = spec.partition("=")
        print(f"[confidence] {name}: {path}", flush=True)
        res["pipelines"].update(evaluate(name, Path(path), splits, args.spancat_threshold))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
    write_markdown(res, args.output.with_suffix(".md"))
    plot(res, args.output.with_suffix(".png"))
    print(args.output.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
