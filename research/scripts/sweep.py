"""Train several pipelines in parallel, one CPU thread each, and score each model-best on dev
and test: for hyperparameter sweeps and multi-seed comparisons.

    cd research && python -m spacy project run sweep . --vars.jobs sweeps/head_variants.json
    python research/scripts/sweep.py research/sweeps/head_variants.json --workers 2

The jobs file is a JSON list of ``{"name": ..., "config": ..., "overrides": {...}}`` or an
object ``{"defaults": {...}, "jobs": [...], "table": {...}}``. Paths inside a jobs file are
relative to the repository root, where the jobs run (configs, corpus, training output). The
overrides are spaCy config overrides (``"components.fsemicrf_ner.model.hidden_width": 256``)
added to ``--paths.train/--paths.dev`` and ``defaults``; ``"code"`` names a file passed to
``spacy train --code``. ``table`` holds the sweep's own options, the long forms of the flags
below without dashes (``output``, ``results``, ``reference``, ``add_runs``, ``add_groups``,
``paired``); a flag given on the command line wins.

Each job runs ``scripts/train.py`` (its log and summary land in OUTPUT/NAME), then ``spacy
evaluate`` on the test set. Writes RESULTS.json and RESULTS.md (by default
``research/results/sweeps/<jobs file name>``) with dev and test F1 per job, and the mean and
spread per job group (the name up to ``@``, so ``fsemicrf@seed1`` and ``fsemicrf@seed2`` form
the group ``fsemicrf``). ``--add-runs`` puts the runs of earlier results files in the same
table, e.g. a baseline's seeds.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List

from repo import ROOT  # first: it puts the product scripts on the path
from train import thread_env  # noqa: E402  (scripts/train.py)

TABLE_OPTIONS = ("output", "results", "reference", "add_runs", "add_groups", "paired")


def load_jobs(path: Path) -> List[Dict[str, Any]]:
    data = json.loads(path.read_text())
    defaults: Dict[str, Any] = {}
    code = None
    if isinstance(data, dict):
        defaults, code, data = data.get("defaults", {}), data.get("code"), data["jobs"]
    jobs = []
    for job in data:
        overrides = {**defaults, **job.get("overrides", {})}
        jobs.append({"name": job["name"], "config": job["config"], "overrides": overrides})
        if job.get("code", code):
            jobs[-1]["code"] = job.get("code", code)
    names = [job["name"] for job in jobs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate job names in {path}")
    return jobs


def table_options(path: Path) -> Dict[str, Any]:
    """The ``table`` block of a jobs file (empty for the list form)."""
    data = json.loads(path.read_text())
    table = data.get("table", {}) if isinstance(data, dict) else {}
    unknown = set(table) - set(TABLE_OPTIONS)
    if unknown:
        raise ValueError(f"unknown table options in {path}: {sorted(unknown)}")
    return table


def run_job(job: Dict[str, Any], args: argparse.Namespace) -> Dict[str, Any]:
    out = args.output / job["name"]
    flags = []
    for key, value in job["overrides"].items():
        flags += [f"--{key}", json.dumps(value) if not isinstance(value, str) else value]
    if job.get("code"):
        flags += ["--code", job["code"]]
    train = [sys.executable, str(ROOT / "scripts" / "train.py"), job["config"], str(out),
             "--name", job["name"], "--paths.train", str(args.train), "--paths.dev", str(args.dev),
             *flags]
    # a rerun that fails must not be reported with the figures of the run before it
    for stale in ("train_summary.json", "test_metrics.json"):
        (out / stale).unlink(missing_ok=True)
    with open(args.output / f"{job['name']}.stdout", "w") as log:
        rc = subprocess.call(train, stdout=log, stderr=subprocess.STDOUT, env=thread_env(), cwd=ROOT)
    model = out / "model-best"
    if rc == 0 and model.exists() and not args.no_test:
        subprocess.call(
            [sys.executable, "-m", "spacy", "evaluate", str(model), str(args.test), "--output",
             str(out / "test_metrics.json")],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=thread_env(), cwd=ROOT)
    result = collect(job, out)
    result["returncode"] = rc
    print(f"[sweep] {job['name']}: rc={rc} dev F1={result.get('dev', {}).get('ents_f')} "
          f"test F1={result.get('test', {}).get('ents_f')}", flush=True)
    return result


def entity_scores(scores: Dict[str, Any]) -> Dict[str, Any]:
    """``ents_p/r/f`` (and per type) of a spaCy score dict; spaCy's ``spancat`` reports the same
    figures as ``spans_<key>_p/r/f``."""
    prefix = "ents"
    if scores.get("ents_f") is None:
        keys = [k[: -len("_f")] for k in scores if k.startswith("spans_") and k.endswith("_f")]
        prefix = keys[0] if keys else "ents"
    return {f"ents_{k}": scores.get(f"{prefix}_{k}") for k in ("p", "r", "f", "per_type")}


def collect(job: Dict[str, Any], out: Path) -> Dict[str, Any]:
    """The record of one finished job, read from its training summary and test metrics."""
    result: Dict[str, Any] = dict(job)
    summary_path = out / "train_summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        result.update({k: summary.get(k) for k in ("wall_time_s", "steps_run", "best_step", "time_to_best_s")})
        dev = entity_scores(summary.get("dev_performance_model_best", {}))
        result["dev"] = {k: v for k, v in dev.items() if k != "ents_per_type"}
    metrics = out / "test_metrics.json"
    if metrics.exists():
        test = entity_scores(json.loads(metrics.read_text()))
        result["test_per_type"] = test.pop("ents_per_type")
        result["test"] = test
    return result


def earlier_runs(paths: List[Path], groups, skip) -> List[Dict[str, Any]]:
    """The runs recorded in earlier results files, less those named in ``skip`` and, when
    ``groups`` is given, those of other groups; a run named in several files is taken once,
    from the first."""
    runs, seen = [], set(skip)
    for path in paths:
        for run in json.loads(path.read_text())["runs"]:
            group = run["name"].split("@")[0]
            if run["name"] not in seen and (groups is None or group in groups):
                runs.append(run)
                seen.add(run["name"])
    return runs


def group_stats(results: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for r in results:
        groups.setdefault(r["name"].split("@")[0], []).append(r)
    rows = []
    for name, rs in groups.items():
        row: Dict[str, Any] = {"group": name, "runs": len(rs)}
        for split in ("dev", "test"):
            scores = [100 * r[split]["ents_f"] for r in rs if r.get(split, {}).get("ents_f") is not None]
            row[f"{split}_f1_mean"] = round(statistics.mean(scores), 2) if scores else None
            row[f"{split}_f1_sd"] = round(statistics.stdev(scores), 2) if len(scores) > 1 else None
            row[f"{split}_f1_runs"] = [round(s, 2) for s in scores]
        rows.append(row)
    return rows


def paired_stats(results: List[Dict[str, Any]], group: str, baseline: str) -> Dict[str, Any]:
    """Per-seed differences ``group - baseline`` (F1 points) over the seeds both groups ran
    (the name after ``@``): pairing by seed removes the part of the spread that a seed's data
    order and initialisation give to both groups alike. ``se`` is the standard error of the
    mean difference (sd / sqrt(n))."""
    runs = {r["name"]: r for r in results}
    seeds = sorted(
        name.split("@", 1)[1] for name in runs
        if name.startswith(group + "@") and baseline + "@" + name.split("@", 1)[1] in runs
    )
    row: Dict[str, Any] = {"group": group, "baseline": baseline, "seeds": seeds}
    for split in ("dev", "test"):
        diffs = [100 * (runs[f"{group}@{s}"][split]["ents_f"] - runs[f"{baseline}@{s}"][split]["ents_f"])
                 for s in seeds]
        row[f"{split}_diffs"] = [round(d, 2) for d in diffs]
        row[f"{split}_mean"] = round(statistics.mean(diffs), 3) if diffs else None
        row[f"{split}_se"] = (round(statistics.stdev(diffs) / len(diffs) ** 0.5, 3)
                              if len(diffs) > 1 else None)
    return row


def write_results(
    results, groups, path: Path, jobs_file: Path, reference: str = "", added: List[Path] = (),
    paired: List[Dict[str, Any]] = (),
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps({"jobs_file": shown(jobs_file), "runs": results,
                                                     "groups": groups, "paired": list(paired)},
                                                    indent=2) + "\n")
    ref = {g["group"]: g for g in groups}.get(reference, {}).get("test_f1_mean")
    source = f"Jobs: `{shown(jobs_file)}`" + "".join(f"; runs added from `{shown(p)}`" for p in added)
    lines = [f"{source}; one CPU thread per run; F1 of model-best (best dev step).", "",
             "| group | runs | dev F1 mean (sd) | test F1 mean (sd) | test F1 per run |"
             + (f" test F1 vs {reference} |" if ref is not None else ""),
             "|---|---|---|---|---|" + ("---|" if ref is not None else "")]
    for g in groups:
        def cell(split):
            m, sd = g[f"{split}_f1_mean"], g[f"{split}_f1_sd"]
            return "-" if m is None else (f"{m:.2f}" + (f" ({sd:.2f})" if sd is not None else ""))
        delta = ""
        if ref is not None:
            delta = " - |" if g["test_f1_mean"] is None else f" {g['test_f1_mean'] - ref:+.2f} |"
        lines.append(f"| {g['group']} | {g['runs']} | {cell('dev')} | {cell('test')} | "
                     f"{', '.join(f'{s:.2f}' for s in g['test_f1_runs'])} |" + delta)
    if paired:
        lines += ["", "Paired by seed (F1 points, group minus baseline; se = sd / sqrt(seeds)):", "",
                  "| group | baseline | seeds | dev diff mean (se) | test diff mean (se) | dev diffs |",
                  "|---|---|---|---|---|---|"]
        for row in paired:
            def diff(split):
                m, se = row[f"{split}_mean"], row[f"{split}_se"]
                return "-" if m is None else f"{m:+.2f}" + (f" ({se:.2f})" if se is not None else "")
            lines.append(f"| {row['group']} | {row['baseline']} | {len(row['seeds'])} | {diff('dev')} "
                         f"| {diff('test')} | {', '.join(f'{d:+.2f}' for d in row['dev_diffs'])} |")
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")


def resolve_options(args: argparse.Namespace) -> None:
    """Fill the options not given on the command line from the jobs file's ``table`` block,
    else the defaults. Paths from the jobs file are relative to the repository root, those of
    the command line to the working directory: every path ends up absolute."""
    table = table_options(args.jobs)
    defaults = {"output": f"training/sweeps/{args.jobs.stem}",
                "results": f"research/results/sweeps/{args.jobs.stem}",
                "reference": "", "add_runs": [], "add_groups": None, "paired": []}
    for key in TABLE_OPTIONS:
        from_file = getattr(args, key) is None
        value = table.get(key, defaults[key]) if from_file else getattr(args, key)
        base = ROOT if from_file else Path.cwd()
        if key in ("output", "results"):
            value = base / value
        elif key == "add_runs":
            value = [base / path for path in value]
        setattr(args, key, value)
    args.jobs = args.jobs.resolve()


def shown(path: Path) -> str:
    """``path`` as the tables show it: relative to the repository root when inside it."""
    path = Path(path)
    return str(path.relative_to(ROOT)) if path.is_absolute() and path.is_relative_to(ROOT) else str(path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("jobs", type=Path)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--output", type=Path, default=None,
                   help="training runs go to OUTPUT/NAME (default: training/sweeps/<jobs name>)")
    p.add_argument("--results", type=Path, default=None,
                   help="path stem for .json and .md (default: research/results/sweeps/<jobs name>)")
    p.add_argument("--train", type=Path, default=ROOT / "corpus" / "train.spacy")
    p.add_argument("--dev", type=Path, default=ROOT / "corpus" / "dev.spacy")
    p.add_argument("--test", type=Path, default=ROOT / "corpus" / "test.spacy")
    p.add_argument("--only", nargs="*", default=None, help="run only these job names")
    p.add_argument("--reference", default=None, help="group to compare the test F1 means with")
    p.add_argument("--no-test", action="store_true", help="skip the test-set evaluation")
    p.add_argument("--add-runs", type=Path, nargs="*", default=None,
                   help="also tabulate the runs of these earlier results files (e.g. a baseline's "
                        "seeds from another sweep); a run of this sweep replaces one of the same name")
    p.add_argument("--add-groups", nargs="*", default=None,
                   help="with --add-runs: only the runs of these groups")
    p.add_argument("--paired", nargs=2, action="append", default=None, metavar=("GROUP", "BASELINE"),
                   help="also tabulate GROUP minus BASELINE seed by seed (repeatable)")
    p.add_argument("--collect", action="store_true",
                   help="train nothing: tabulate the jobs already run under --output (e.g. on "
                        "several machines), skipping those without a training summary")
    args = p.parse_args(argv)
    resolve_options(args)
    jobs = load_jobs(args.jobs)
    if args.only:
        jobs = [j for j in jobs if j["name"] in set(args.only)]
    args.output.mkdir(parents=True, exist_ok=True)
    if args.collect:
        done = [j for j in jobs if (args.output / j["name"] / "train_summary.json").exists()]
        results = [collect(j, args.output / j["name"]) for j in done]
    else:
        with ThreadPoolExecutor(max_workers=args.workers) as pool:
            results = list(pool.map(lambda j: run_job(j, args), jobs))
    results = earlier_runs(args.add_runs, args.add_groups, {r["name"] for r in results}) + results
    groups = group_stats(results)
    paired = [paired_stats(results, group, baseline) for group, baseline in args.paired]
    write_results(results, groups, args.results, args.jobs, args.reference, args.add_runs, paired)
    print(args.results.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
