"""Compare two groups of models across corpora, paired by seed, from decode_settings.py results.

    python research/scripts/paired_settings.py \
        --scores conll=research/results/sweeps/null_tokens_scores_conll.json \
                 nemo=research/results/sweeps/null_tokens_scores_nemo.json \
                 msra=research/results/sweeps/null_tokens_scores_msra.json \
        --baseline fsemicrf --baseline-margin 0.25 --candidate fsemicrf-null \
        --margins 0.25 0.5 1 --output research/results/sweeps/null_tokens

Each results file holds models named ``GROUP@seedN`` scored at several filter margins. For each
candidate margin ``m``: per corpus, the mean and standard error over seeds of (candidate at
``m`` minus baseline at its margin, same seed) for dev and test F1, precision and recall; over
the corpora, ``D`` = the mean of the corpora's dev F1 means, with ``se(D)`` = sqrt(sum of their
squared standard errors) / number of corpora. Writes OUTPUT.json and OUTPUT.md.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple


def by_seed(results: Dict[str, Any], group: str, field: Optional[str] = "scores"
            ) -> Dict[str, Dict[str, Any]]:
    """The runs of ``group`` (named ``GROUP@seedN``) by seed, from a results file with a
    ``runs`` list: each run's ``field`` (a decode_settings.py run's ``scores``), or the whole
    run with ``field=None`` (a sweep.py run)."""
    out = {}
    for run in results["runs"]:
        name, _, seed = run["name"].partition("@")
        if name == group:
            out[seed] = run if field is None else run[field]
    return out


def mean_se(values: List[float]) -> Dict[str, float]:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "se": sd / math.sqrt(len(values)), "n": len(values)}


def pooled(dev_cells: List[Dict[str, float]]) -> Tuple[float, float]:
    """``(D, se(D))`` over corpora from each corpus's paired dev F1 ``mean_se`` cell: the mean of
    the means, and sqrt(sum of squared standard errors) / number of corpora."""
    d = statistics.fmean(c["mean"] for c in dev_cells)
    return d, math.sqrt(sum(c["se"] ** 2 for c in dev_cells)) / len(dev_cells)


def compare(scores: Dict[str, str], baseline: str, base_margin: float, candidate: str,
            margins: List[float]) -> Dict[str, Any]:
    rows: List[Dict[str, Any]] = []
    for m in margins:
        per_corpus = {}
        for corpus, path in scores.items():
            # a corpus's runs may come from several results files (comma-separated)
            runs = [run for part in str(path).split(",") for run in json.loads(Path(part).read_text())["runs"]]
            results = {"runs": runs}
            base, cand = by_seed(results, baseline), by_seed(results, candidate)
            seeds = sorted(set(base) & set(cand))
            if not seeds:
                raise ValueError(f"{path}: no seed has both {baseline} and {candidate}")
            cell = {"seeds": seeds}
            for split in ("dev", "test"):
                for metric in ("f", "p", "r"):
                    diffs = [100 * (cand[s][str(float(m))][split][metric]
                                    - base[s][str(float(base_margin))][split][metric]) for s in seeds]
                    cell[f"{split}_{metric}"] = {**mean_se(diffs), "diffs": diffs}
            per_corpus[corpus] = cell
        D, se = pooled([c["dev_f"] for c in per_corpus.values()])
        test = statistics.fmean(c["test_f"]["mean"] for c in per_corpus.values())
        rows.append({"margin": m, "corpora": per_corpus, "D": D, "se_D": se, "test_mean": test})
    return {"baseline": baseline, "baseline_margin": base_margin, "candidate": candidate,
            "scores": {k: str(v) for k, v in scores.items()}, "rows": rows}


def write_markdown(res: Dict[str, Any], path: Path) -> None:
    corpora = list(res["scores"])
    lines = [f"`{res['candidate']}` at each margin minus `{res['baseline']}` at margin "
             f"{res['baseline_margin']:g}, same seed; F1/P/R points, mean (se) over seeds.", ""]
    head = "| margin | " + " | ".join(f"{c} dev F1" for c in corpora) + " | D (se) | " + \
        " | ".join(f"{c} test F1" for c in corpora) + " | " + \
        " | ".join(f"{c} dev R / P" for c in corpora) + " |"
    lines += [head, "|" + "---:|" * (3 * len(corpora) + 2)]
    for row in res["rows"]:
        cells = [f"{row['margin']:g}"]
        cells += [f"{row['corpora'][c]['dev_f']['mean']:+.2f} ({row['corpora'][c]['dev_f']['se']:.2f})"
                  for c in corpora]
        cells.append(f"{row['D']:+.2f} ({row['se_D']:.2f})")
        cells += [f"{row['corpora'][c]['test_f']['mean']:+.2f} ({row['corpora'][c]['test_f']['se']:.2f})"
                  for c in corpora]
        cells += [f"{row['corpora'][c]['dev_r']['mean']:+.2f} / {row['corpora'][c]['dev_p']['mean']:+.2f}"
                  for c in corpora]
        lines.append("| " + " | ".join(cells) + " |")
    seeds = {c: res["rows"][0]["corpora"][c]["seeds"] for c in corpora}
    lines += ["", "Seeds: " + "; ".join(f"{c} {', '.join(s)}" for c, s in seeds.items()) + "."]
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scores", nargs="+", required=True,
                   help="corpus=decode_settings results .json (several: comma-separated)")
    p.add_argument("--baseline", required=True)
    p.add_argument("--baseline-margin", type=float, required=True)
    p.add_argument("--candidate", required=True)
    p.add_argument("--margins", type=float, nargs="+", required=True)
    p.add_argument("--output", type=Path, required=True)
    args = p.parse_args(argv)
    scores = dict(item.split("=", 1) for item in args.scores)
    res = compare(scores, args.baseline, args.baseline_margin,
                  args.candidate, args.margins)
    write_outputs(res, args.output, write_markdown)


def write_outputs(res: Dict[str, Any], output: Path, markdown) -> None:
    """OUTPUT.json and OUTPUT.md (by ``markdown(res, path)``), and the table on stdout. The
    suffixes are appended, not swapped: ``--output x_0.25`` must not lose its ``.25``."""
    output.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{output}.json").write_text(json.dumps(res, indent=1) + "\n")
    markdown(res, Path(f"{output}.md"))
    print(Path(f"{output}.md").read_text())


if __name__ == "__main__":
    main()
