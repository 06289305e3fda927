"""Compare a group of decode_settings.py models with a pipeline of the corpora benchmark, by seed.

    python research/scripts/versus_corpora.py \
        --scores nemo=research/results/sweeps/wide_margin_scores_nemo.json \
                 msra=research/results/sweeps/wide_margin_scores_msra.json \
        --candidate fsemicrf-null-tm1-exact --margin 2 --pipeline semicrf \
        --output research/results/sweeps/wide_margin_vs_semicrf

For each corpus: the mean and standard error over seeds of (candidate at the filter margin minus
the benchmark's ``--pipeline`` run of the same seed, ``--benchmark``, by default the
1000-step report ``benchmarks/results/corpora_steps1000.json``) for
dev and test F1, precision and recall. The benchmark's runs and the candidate's must have been
trained on the same corpus files with the same budget. Writes OUTPUT.json and OUTPUT.md.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Dict

from paired_settings import by_seed, mean_se, write_outputs


def compare(scores: Dict[str, str], candidate: str, margin: float, pipeline: str,
            benchmark: Dict[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for corpus, path in scores.items():
        cand = by_seed(json.loads(Path(path).read_text()), candidate)
        ref = {f"seed{r['seed']}": r for r in benchmark["runs"]  # named as by_seed names them
               if r["corpus"] == corpus and r["pipeline"] == pipeline}
        seeds = sorted(set(cand) & set(ref), key=lambda s: int(s[4:]))
        if not seeds:
            raise ValueError(f"{path}: no seed has both {candidate} and {corpus}/{pipeline}")
        cell: Dict[str, Any] = {"seeds": seeds}
        for split in ("dev", "test"):
            for metric in ("f", "p", "r"):
                diffs = [100 * (cand[s][str(float(margin))][split][metric]
                                - ref[s][split][f"ents_{metric}"]) for s in seeds]
                cell[f"{split}_{metric}"] = {**mean_se(diffs), "diffs": diffs}
        out[corpus] = cell
    return out


def write_markdown(res: Dict[str, Any], path: Path) -> None:
    def cell(c: Dict[str, float]) -> str:
        return f"{c['mean']:+.2f} ({c['se']:.2f})"

    lines = [
        f"`{res['candidate']}` at margin {res['margin']} minus the corpora benchmark's "
        f"`{res['pipeline']}` (`{res['benchmark']}`), same seed; points, mean (se) over seeds.", "",
        "| corpus | seeds | dev F1 | dev R | dev P | test F1 | test R | test P |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for corpus, c in res["corpora"].items():
        lines.append(f"| {corpus} | {len(c['seeds'])} | " + " | ".join(
            cell(c[f"{split}_{m}"]) for split in ("dev", "test") for m in ("f", "r", "p")) + " |")
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scores", nargs="+", required=True, help="corpus=decode_settings results .json")
    p.add_argument("--candidate", required=True)
    p.add_argument("--margin", type=float, required=True)
    p.add_argument("--pipeline", default="semicrf")
    p.add_argument("--benchmark", type=Path,
                   default=Path("benchmarks/results/corpora_steps1000.json"))
    p.add_argument("--output", type=Path, required=True)
    args = p.parse_args()
    scores = dict(item.split("=", 1) for item in args.scores)
    res = {"candidate": args.candidate, "margin": args.margin, "pipeline": args.pipeline,
           "benchmark": str(args.benchmark),
           "corpora": compare(scores, args.candidate, args.margin, args.pipeline,
                              json.loads(args.benchmark.read_text()))}
    write_outputs(res, args.output, write_markdown)


if __name__ == "__main__":
    main()
