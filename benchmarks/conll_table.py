"""The README's results table, computed from committed results files only.

    python benchmarks/conll_table.py            # benchmarks/results/conll.{json,md}

CoNLL-2003 English test F1 (and dev F1) of each pipeline as mean ± standard error over its
training seeds, read from the per-run records of the multi-seed sweeps in research/results/
sweeps/ (model-best by dev F1, test F1 from ``spacy evaluate``); the filtered head's paired
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
SWEEPS = ROOT / "research" / "results" / "sweeps"
RESULTS = ROOT / "benchmarks" / "results"

# The sweep results holding the runs below (a run named in several files is read once).
RUN_FILES = ["boundary_smoothing_s22.json", "boundary_smoothing_s22_seeds67.json",
             "baselines_word_pool.json", "baselines_word_pool_seeds67.json",
             "same_machine_s18.json", "one_machine_table_s18.json", "trf_heads.json"]

# (encoder, pipeline, sweep group, how the group was trained)
ROWS = [
    ("CNN", "fsemicrf", "fsemicrf-bs0.2-s22", "configs/fsemicrf_cnn.cfg"),
    ("CNN", "semicrf", "semicrf-wordpool", "configs/semicrf_cnn.cfg"),
    ("CNN", "crf", "crf-wordpool", "configs/crf_cnn.cfg"),
    ("CNN", "ner", "ner-avg-4k-s18", "configs/baselines/ner_cnn.cfg, use_averages = true"),
    ("CNN", "spancat", "spancat-avg-4k-s18", "configs/baselines/spancat_cnn.cfg, use_averages = true"),
    ("MiniLM", "fsemicrf", "fsemicrf-trf",
     "configs/fsemicrf_trf.cfg without boundary_smoothing, 500 steps"),
    ("MiniLM", "semicrf", "semicrf-trf", "configs/semicrf_trf.cfg, 500 steps"),
    ("MiniLM", "crf", "crf-trf", "configs/crf_trf.cfg, 500 steps"),
    ("MiniLM", "ner", "ner-trf", "configs/baselines/ner_trf.cfg, 500 steps"),
]
SPEED_FILES = {"CNN": ("speed_cnn.json", ""), "MiniLM": ("speed_trf.json", "-trf")}


def load_runs(paths: List[Path]) -> Dict[str, Dict[str, Any]]:
    """Every run of the results files by name, the first record of a name kept."""
    runs: Dict[str, Dict[str, Any]] = {}
    for path in paths:
        for run in json.loads(path.read_text())["runs"]:
            runs.setdefault(run["name"], run)
    return runs


def f1_by_seed(runs: Dict[str, Dict[str, Any]], group: str, split: str) -> Dict[str, float]:
    """``{seed: F1 points}`` of the group's finished runs."""
    out = {}
    for name, run in runs.items():
        base, _, seed = name.partition("@")
        if base == group and run.get(split, {}).get("ents_f") is not None:
            out[seed] = 100 * run[split]["ents_f"]
    return out


def mean_se(values: List[float]) -> Dict[str, Optional[float]]:
    """Mean, standard error (sd / sqrt(n); None for one value) and n."""
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else None
    return {"mean": statistics.fmean(values), "se": se, "n": len(values)}


def relative_speed(encoder: str, pipeline: str) -> Optional[Dict[str, Any]]:
    """Words/s of the pipeline over ``ner``'s on the same encoder, side by side in one run."""
    name, suffix = SPEED_FILES[encoder]
    data = json.loads((RESULTS / name).read_text())
    speed = data["speed"]
    own, ner = speed.get(pipeline + suffix), speed.get("ner" + suffix)
    if own is None or ner is None:
        return None
    return {"relative_to_ner": own["wps"] / ner["wps"], "words_per_s": own["wps"],
            "file": f"benchmarks/results/{name}", "model": data["pipelines"][pipeline + suffix]["path"],
            "cpu": data["machine"].get("cpu"), "threads": data["machine"]["threads"]}


def build(runs: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    rows, paired = [], []
    for encoder, pipeline, group, trained in ROWS:
        test, dev = f1_by_seed(runs, group, "test"), f1_by_seed(runs, group, "dev")
        if not test:
            continue
        rows.append({"encoder": encoder, "pipeline": pipeline, "group": group, "trained": trained,
                     "seeds": sorted(test), "test_f1": mean_se(list(test.values())),
                     "dev_f1": mean_se(list(dev.values())) if dev else None,
                     "speed": relative_speed(encoder, pipeline)})
    for row in rows:
        filtered = next(r for r in rows if r["encoder"] == row["encoder"] and r["pipeline"] == "fsemicrf")
        if row is filtered:
            continue
        pair: Dict[str, Any] = {"encoder": row["encoder"], "minus": row["pipeline"]}
        for split in ("test", "dev"):
            a = f1_by_seed(runs, filtered["group"], split)
            b = f1_by_seed(runs, row["group"], split)
            seeds = sorted(set(a) & set(b))
            pair[f"{split}_seeds"] = seeds
            pair[split] = mean_se([a[s] - b[s] for s in seeds]) if seeds else None
        paired.append(pair)
    return {"sources": [f"research/results/sweeps/{name}" for name in RUN_FILES]
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
             + ", ".join(f"`{s}`" for s in table["sources"]) + ".", "",
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
    table = build(load_runs([SWEEPS / name for name in RUN_FILES]))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.with_suffix(".json").write_text(json.dumps(table, indent=1) + "\n")
    text = markdown(table)
    args.output.with_suffix(".md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
