"""The README's results table, computed from committed results files only.

    python benchmarks/conll_table.py            # benchmarks/results/conll.{json,md}

CoNLL-2003 English test F1 (and dev F1) of each pipeline as mean ± standard error over its
training seeds, read from benchmarks/results/conll_runs.json (one record per training run:
model-best by dev F1, test F1 from ``spacy evaluate``; exported from the research project's
multi-seed sweeps by research/scripts/export_conll_runs.py); the filtered head's paired
differences to every other pipeline on the same encoder, seed by seed; and inference words/s
relative to spaCy's ``ner`` on the same encoder, from the side-by-side speed tables
(benchmarks/results/speed_cnn.json, speed_trf.json; one thread, the same test documents). The
runs of one encoder were trained on one CPU type, so the pairs share their seed's batches.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
RUNS = RESULTS / "conll_runs.json"
"""The per-seed scores of the compared pipelines (exported from the research project's sweep
results by ``research/scripts/export_conll_runs.py``)."""

# the table's rows, in order
ROWS = [("CNN", "fsemicrf"), ("CNN", "fsemicrf-bs0.2"), ("CNN", "semicrf"), ("CNN", "crf"),
        ("CNN", "ner"), ("CNN", "spancat"),
        ("MiniLM", "fsemicrf"), ("MiniLM", "semicrf"), ("MiniLM", "crf"), ("MiniLM", "ner")]
SPEED_FILES = {"CNN": ("speed_cnn.json", ""), "MiniLM": ("speed_trf.json", "-trf")}


def f1_by_seed(runs: List[Dict[str, Any]], encoder: str, pipeline: str, split: str) -> Dict[str, float]:
    """``{seed: F1 points}`` of one pipeline's runs."""
    return {r["seed"]: r[f"{split}_f1"] for r in runs
            if r["encoder"] == encoder and r["pipeline"] == pipeline and r[f"{split}_f1"] is not None}


def mean_se(values: List[float]) -> Dict[str, Optional[float]]:
    """Mean, standard error (sd / sqrt(n); None for one value) and n."""
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else None
    return {"mean": statistics.fmean(values), "se": se, "n": len(values)}


def relative_speed(encoder: str, pipeline: str) -> Optional[Dict[str, Any]]:
    """Words/s of the pipeline over ``ner``'s on the same encoder, side by side in one run."""
    name, suffix = SPEED_FILES[encoder]
    data = json.loads((RESULTS / name).read_text())
    speed = data["speed"]
    own = speed.get(pipeline + suffix)
    ner = speed.get("ner" + suffix)
    if own is None or ner is None:
        return None
    return {"relative_to_ner": own["wps"] / ner["wps"], "words_per_s": own["wps"],
            "file": f"benchmarks/results/{name}",
            "cpu": data["machine"].get("cpu"), "threads": data["machine"]["threads"]}


def build(data: Dict[str, Any]) -> Dict[str, Any]:
    runs = data["runs"]
    rows, paired = [], []
    for encoder, pipeline in ROWS:
        test, dev = (f1_by_seed(runs, encoder, pipeline, split) for split in ("test", "dev"))
        if not test:
            continue
        trained = next(r["trained"] for r in runs if r["encoder"] == encoder and r["pipeline"] == pipeline)
        rows.append({"encoder": encoder, "pipeline": pipeline, "trained": trained,
                     "seeds": sorted(test), "test_f1": mean_se(list(test.values())),
                     "dev_f1": mean_se(list(dev.values())) if dev else None,
                     "speed": relative_speed(encoder, pipeline)})
    for row in rows:
        if row["pipeline"] == "fsemicrf":
            continue
        pair: Dict[str, Any] = {"encoder": row["encoder"], "minus": row["pipeline"]}
        for split in ("test", "dev"):
            a = f1_by_seed(runs, row["encoder"], "fsemicrf", split)
            b = f1_by_seed(runs, row["encoder"], row["pipeline"], split)
            seeds = sorted(set(a) & set(b))
            pair[f"{split}_seeds"] = seeds
            pair[split] = mean_se([a[s] - b[s] for s in seeds]) if seeds else None
        paired.append(pair)
    return {"sources": ["benchmarks/results/conll_runs.json"]
            + [f"benchmarks/results/{name}" for name, _ in SPEED_FILES.values()],
            "rows": rows, "paired": paired}


def cell(stat: Optional[Dict[str, Any]], signed: bool = False) -> str:
    if stat is None:
        return "–"
    text = f"{stat['mean']:+.2f}" if signed else f"{stat['mean']:.2f}"
    return text + (f" ± {stat['se']:.2f}" if stat["se"] is not None else "")


def markdown(table: Dict[str, Any]) -> str:
    lines = ["# CoNLL-2003 English: test F1 over seeds and speed relative to `ner`", "",
             "F1 in points, mean ± standard error over training seeds (sd / sqrt(n)); words/s "
             "relative to spaCy's `ner` on the same encoder, side by side in one run (seed-0 "
             "models, one thread). Computed by `python benchmarks/conll_table.py` from "
             + ", ".join(f"`{s}`" for s in table["sources"]) + " (the runs exported from the "
             "research project by `research/scripts/export_conll_runs.py`).", "",
             "| encoder | pipeline | seeds | test F1 | dev F1 | words/s vs `ner` | trained with |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in table["rows"]:
        speed = f"{r['speed']['relative_to_ner']:.2f}x" if r["speed"] else "–"
        lines.append(f"| {r['encoder']} | `{r['pipeline']}` | {len(r['seeds'])} | {cell(r['test_f1'])} "
                     f"| {cell(r['dev_f1'])} | {speed} | {r['trained']} |")
    machines = sorted({f"{r['speed']['file']}: {r['speed']['cpu']}, {r['speed']['threads']} thread(s)"
                       for r in table["rows"] if r["speed"]})
    lines += ["", "Speed measured on " + "; ".join(machines) + "."]
    lines += ["", "The filtered head (`fsemicrf`) minus each other pipeline on the same encoder, "
              "paired by seed:", "",
              "| encoder | fsemicrf minus | seeds | test F1 difference | dev F1 difference |",
              "|---|---|---:|---:|---:|"]
    for p in table["paired"]:
        lines.append(f"| {p['encoder']} | `{p['minus']}` | {len(p['test_seeds'])} | "
                     f"{cell(p['test'], signed=True)} | {cell(p['dev'], signed=True)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", type=Path, default=RESULTS / "conll",
                   help="path stem for .json and .md")
    args = p.parse_args(argv)
    table = build(json.loads(RUNS.read_text()))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.with_suffix(".json").write_text(json.dumps(table, indent=1) + "\n")
    text = markdown(table)
    args.output.with_suffix(".md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
