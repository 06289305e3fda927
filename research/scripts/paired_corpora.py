"""Paired differences of two sweep groups on several corpora, from sweep.py results files.

    python research/scripts/paired_corpora.py \
        --results conll=research/results/sweeps/augment_conll_training.json \
                  nemo=research/results/sweeps/augment_nemo_training.json \
                  msra=research/results/sweeps/augment_msra_training.json \
        --pairs semicrf-etr:semicrf fsemicrf:semicrf fsemicrf-etr:semicrf-etr \
        --output research/results/sweeps/augment_paired_training

For each pair ``GROUP:BASELINE`` and corpus: the mean and standard error over seeds of (group
minus baseline, same seed) for dev and test F1, precision and recall of the runs' model-best
(the evaluations sweep.py records); over the corpora, ``D`` = the mean of the corpora's dev F1
means and ``se(D)`` = sqrt(sum of their squared standard errors) / number of corpora, as in
paired_settings.py. Writes OUTPUT.json and OUTPUT.md.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Dict, List

from paired_settings import by_seed, mean_se, pooled

METRICS = ("f", "p", "r")


def compare(results: Dict[str, Dict[str, Any]], group: str, baseline: str) -> Dict[str, Any]:
    corpora = {}
    for corpus, data in results.items():
        cand, base = by_seed(data, group, None), by_seed(data, baseline, None)
        seeds = sorted(set(cand) & set(base))
        if not seeds:
            raise ValueError(f"{corpus}: no seed that both {group} and {baseline} ran")
        row: Dict[str, Any] = {"seeds": seeds}
        for split in ("dev", "test"):
            for m in METRICS:
                diffs = [100 * (cand[s][split][f"ents_{m}"] - base[s][split][f"ents_{m}"])
                         for s in seeds]
                row[f"{split}_{m}"] = mean_se(diffs)
        corpora[corpus] = row
    d, se = pooled([row["dev_f"] for row in corpora.values()])
    return {"group": group, "baseline": baseline, "D": d, "se_D": se, "corpora": corpora}


def markdown(rows: List[Dict[str, Any]]) -> str:
    lines = ["# Paired differences by corpus (sweep runs, model-best)", "",
             "Group minus baseline, same seed: mean (se) over seeds, F1/P/R points. D = mean over "
             "the corpora of the dev F1 means; se(D) = sqrt(sum of squared se) / corpora.", "",
             "| group - baseline | corpus | dev F1 | dev P | dev R | test F1 | test P | test R |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]

    def cell(x):
        return f"{x['mean']:+.2f} ({x['se']:.2f})"

    for row in rows:
        name = f"{row['group']} - {row['baseline']}"
        for corpus, c in row["corpora"].items():
            lines.append(f"| {name} | {corpus} | " + " | ".join(
                cell(c[f"{split}_{m}"]) for split in ("dev", "test") for m in METRICS) + " |")
        lines.append(f"| {name} | **D** | **{row['D']:+.2f} ({row['se_D']:.2f})** | | | | | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", nargs="+", required=True, help="CORPUS=sweep results .json")
    p.add_argument("--pairs", nargs="+", required=True, help="GROUP:BASELINE")
    p.add_argument("--output", type=Path, required=True, help="path prefix of .json/.md")
    args = p.parse_args()
    results = {k: json.loads(Path(v).read_text())
               for k, v in (spec.split("=", 1) for spec in args.results)}
    rows = [compare(results, *pair.split(":", 1)) for pair in args.pairs]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    args.output.with_suffix(".md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
