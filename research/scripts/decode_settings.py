"""Score trained fsemicrf_ner pipelines at several prediction-time filter margins, paired by model.

    python research/scripts/decode_settings.py research/sweeps/filter_margin.json \
        --results research/results/sweeps/filter_margin --repeats 5

The settings file names the models (``"models"``: model directories) and the margins
(``"margins"``, the first being the reference, normally 0). No retraining: each model is loaded
once and scored on dev and test at every margin (``FSemiCRFEntityRecognizer.filter_margin``),
with the exact-match entity P/R/F1 of scripts/benchmark.py on the gold tokens. The differences to
the reference margin are paired by model, so they hold the model's own seed noise out.

With ``--repeats N`` the first model is also timed on the test set at every margin, interleaved
within each repeat as in scripts/benchmark.py (one thread, batch 64): words/s relative to the
reference margin. Writes RESULTS.json and RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any, Dict, List

from repo import ROOT  # first: it puts the product scripts on the path

import spacy  # noqa: E402

from benchmark import load_docs, make_inputs, score, set_threads, time_pipe  # noqa: E402
from kept_nodes import find_head  # noqa: E402


def component(nlp):
    """The pipeline's fsemicrf_ner component with a filtered head (the one that has margins)."""
    return nlp.get_pipe(find_head(nlp)[0])


def evaluate(nlp, docs, batch_size: int) -> Dict[str, float]:
    preds = list(nlp.pipe(make_inputs(nlp, docs, raw_text=False), batch_size=batch_size))
    s = score(docs, preds, lambda d: d.ents)
    return {"p": s["p"], "r": s["r"], "f": s["f"], "n_pred": s["n_pred"]}


def mean_se(values: List[float]) -> Dict[str, float]:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "se": sd / len(values) ** 0.5}


def paired(runs: List[Dict[str, Any]], margins: List[float]) -> List[Dict[str, Any]]:
    """Per nonzero margin: the mean (and standard error) of its F1 minus the reference's, same
    model, on dev and on test, in F1 points."""
    out = []
    for m in margins[1:]:
        row: Dict[str, Any] = {"margin": m}
        for split in ("dev", "test"):
            diffs = [100 * (r["scores"][str(m)][split]["f"] - r["scores"][str(margins[0])][split]["f"])
                     for r in runs]
            row[split] = {**mean_se(diffs), "diffs": diffs}
        out.append(row)
    return out


def time_margins(nlp, docs, margins, batch_size: int, repeats: int) -> Dict[str, float]:
    """Median words/s of the test set at each margin, the margins interleaved per repeat."""
    comp = component(nlp)
    n_words = sum(len(d) for d in docs)
    comp.filter_margin = margins[0]
    time_pipe(nlp, make_inputs(nlp, docs, False), batch_size)  # warm-up
    times: Dict[float, List[float]] = {m: [] for m in margins}
    for rep in range(repeats):
        order = margins[rep % len(margins):] + margins[: rep % len(margins)]
        for m in order:
            comp.filter_margin = m
            times[m].append(time_pipe(nlp, make_inputs(nlp, docs, False), batch_size))
    return {str(m): n_words / statistics.median(t) for m, t in times.items()}


def write_markdown(res: Dict[str, Any], path: Path) -> None:
    margins = res["margins"]
    lines = [f"Settings: `{res['settings']}`; exact-match entity F1 on the gold tokens, one thread.", "",
             "| model | margin | dev P | dev R | dev F1 | test P | test R | test F1 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for run in res["runs"]:
        for m in margins:
            d, t = run["scores"][str(m)]["dev"], run["scores"][str(m)]["test"]
            lines.append(f"| {run['name']} | {m:g} | " + " | ".join(
                f"{100 * x:.2f}" for x in (d["p"], d["r"], d["f"], t["p"], t["r"], t["f"])) + " |")
    lines += ["", f"Paired by model ({len(res['runs'])} models; F1 points, margin minus "
              f"{margins[0]:g}; se = sd / sqrt(models)):", "",
              "| margin | dev diff mean (se) | test diff mean (se) | dev diffs |", "|---:|---:|---:|---|"]
    for row in res["paired"]:
        lines.append(f"| {row['margin']:g} | {row['dev']['mean']:+.2f} ({row['dev']['se']:.2f}) | "
                     f"{row['test']['mean']:+.2f} ({row['test']['se']:.2f}) | "
                     + ", ".join(f"{x:+.2f}" for x in row["dev"]["diffs"]) + " |")
    if res.get("words_per_s"):
        ref = res["words_per_s"][str(margins[0])]
        lines += ["", f"Speed of `{res['runs'][0]['name']}` on the test set, margins interleaved, "
                  f"{res['repeats']} repeats (median words/s):", "",
                  "| margin | words/s | relative to margin " + f"{margins[0]:g} |", "|---:|---:|---:|"]
        for m in margins:
            wps = res["words_per_s"][str(m)]
            lines.append(f"| {m:g} | {wps:.0f} | {wps / ref:.2f} |")
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("settings", type=Path, help="JSON with 'models' and 'margins'")
    p.add_argument("--results", type=Path, required=True, help="path stem for .json and .md")
    p.add_argument("--dev", type=Path, default=ROOT / "corpus" / "dev.spacy")
    p.add_argument("--test", type=Path, default=ROOT / "corpus" / "test.spacy")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=0, help="time the first model (0: no timing)")
    args = p.parse_args(argv)
    set_threads(1)
    settings = json.loads(args.settings.read_text())
    margins = [float(m) for m in settings["margins"]]
    dev, test = load_docs(args.dev, None), load_docs(args.test, None)
    runs = []
    words_per_s = None
    for i, model in enumerate(settings["models"]):
        nlp = spacy.load(ROOT / model)  # settings files name models from the repository root
        comp = component(nlp)
        scores = {}
        for m in margins:
            comp.filter_margin = m
            scores[str(m)] = {"dev": evaluate(nlp, dev, args.batch_size),
                              "test": evaluate(nlp, test, args.batch_size)}
        name = Path(model).parent.name if Path(model).name == "model-best" else Path(model).name
        runs.append({"name": name, "model": str(model), "scores": scores})
        print(name, " ".join(f"{m:g}: dev {100 * scores[str(m)]['dev']['f']:.2f} "
                             f"test {100 * scores[str(m)]['test']['f']:.2f}" for m in margins), flush=True)
        if i == 0 and args.repeats:
            words_per_s = time_margins(nlp, test, margins, args.batch_size, args.repeats)
    res = {"settings": str(args.settings), "margins": margins, "runs": runs,
           "paired": paired(runs, margins), "repeats": args.repeats, "words_per_s": words_per_s}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    write_markdown(res, args.results.with_suffix(".md"))
    print(args.results.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
