"""Export the per-seed CoNLL-2003 scores behind the product's results table.

    python research/scripts/export_conll_runs.py      # writes benchmarks/results/conll_runs.json

Reads the sweep results that hold the compared pipelines' runs (a run named in several files is
read once, the first record kept) and writes one record per run: encoder, pipeline, how it was
trained, seed, dev and test F1 (points). ``benchmarks/conll_table.py`` builds the table from it.
"""
import json
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = ROOT / "research" / "results" / "sweeps"
OUTPUT = ROOT / "benchmarks" / "results" / "conll_runs.json"

RUN_FILES = ["conll_defaults.json",
             "boundary_smoothing_word_pool.json", "boundary_smoothing_word_pool_seeds67.json",
             "baselines_word_pool.json", "baselines_word_pool_seeds67.json",
             "same_machine_word_pool.json", "one_machine_table_word_pool.json", "trf_heads.json"]

# (encoder, pipeline, sweep group, how the group was trained)
GROUPS = [
    ("CNN", "fsemicrf", "fsemicrf-default", "configs/fsemicrf_cnn.cfg"),
    ("CNN", "fsemicrf-bs0.2", "fsemicrf-bs0.2-s22",
     "configs/fsemicrf_cnn.cfg with boundary_smoothing = 0.2 (the former default)"),
    ("CNN", "semicrf", "semicrf-wordpool", "configs/semicrf_cnn.cfg"),
    ("CNN", "crf", "crf-wordpool", "configs/crf_cnn.cfg"),
    ("CNN", "ner", "ner-avg-4k-s18", "configs/baselines/ner_cnn.cfg, use_averages = true"),
    ("CNN", "spancat", "spancat-avg-4k-s18", "configs/baselines/spancat_cnn.cfg, use_averages = true"),
    ("MiniLM", "fsemicrf", "fsemicrf-trf",
     "configs/fsemicrf_trf.cfg, 500 steps"),
    ("MiniLM", "semicrf", "semicrf-trf", "configs/semicrf_trf.cfg, 500 steps"),
    ("MiniLM", "crf", "crf-trf", "configs/crf_trf.cfg, 500 steps"),
    ("MiniLM", "ner", "ner-trf", "configs/baselines/ner_trf.cfg, 500 steps"),
]


def load_runs(paths: List[Path]) -> Dict[str, Dict[str, Any]]:
    """Every run of the results files by name, the first record of a name kept."""
    runs: Dict[str, Dict[str, Any]] = {}
    for path in paths:
        for run in json.loads(path.read_text())["runs"]:
            runs.setdefault(run["name"], run)
    return runs


def export(runs: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    out = []
    for encoder, pipeline, group, trained in GROUPS:
        for name, run in sorted(runs.items()):
            base, _, seed = name.partition("@")
            test = run.get("test", {}).get("ents_f")
            if base != group or test is None:
                continue
            dev = run.get("dev", {}).get("ents_f")
            out.append({"encoder": encoder, "pipeline": pipeline, "trained": trained, "seed": seed,
                        "test_f1": 100 * test, "dev_f1": None if dev is None else 100 * dev})
    return out


def main() -> None:
    runs = load_runs([SWEEPS / name for name in RUN_FILES])
    # the sweep files' names are history; the record says only where the runs come from
    data = {"source": "research/results/sweeps (research/scripts/export_conll_runs.py)",
            "runs": export(runs)}
    OUTPUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(data['runs'])} runs written to {OUTPUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
