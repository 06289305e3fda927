"""Python side of benchmarks/gpu_check.sh (see there): peak GPU memory while training, CPU and
GPU predictions of the same weights side by side, and the report.

    python benchmarks/gpu_check.py agree --models NAME=PATH ... --test corpus/test.spacy --output X.json
    python benchmarks/gpu_check.py report --work WORK_DIR --output OUTPUT_DIR

Passed to ``spacy train --code`` it registers ``gpu-check.memory_logger.v1``: spaCy's console
logger that also writes the peak PyTorch GPU memory of the training process (allocated, MB)
after every evaluation to the file named by ``$GPU_CHECK_MEMORY_FILE``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from spacy.util import registry

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from arguments import check_file, count, named_pipelines  # noqa: E402

PIPELINES = ["fsemicrf", "semicrf", "crf", "ner"]


@registry.loggers("gpu-check.memory_logger.v1")
def memory_logger(progress_bar: bool = False):
    # the logger the configs name (spacy.ConsoleLogger.v1 is spacy-legacy's)
    console = registry.loggers.get("spacy-legacy.ConsoleLogger.v1")(progress_bar=progress_bar)

    def setup(nlp, stdout=None, stderr=None):
        log_step, finalize = console(nlp, stdout, stderr)
        path = os.environ.get("GPU_CHECK_MEMORY_FILE")

        def write_peak(step: Optional[int]) -> None:
            import torch

            if path and torch.cuda.is_available():
                peak = torch.cuda.max_memory_allocated() / 2**20
                Path(path).write_text(json.dumps({"step": step, "peak_mb": round(peak, 1)}) + "\n")

        def log_memory(info):
            log_step(info)
            if info is not None:
                write_peak(info.get("step"))

        return log_memory, finalize

    return setup


def entity_readings(nlp, docs) -> List[List[tuple]]:
    """Per document: (start, end, label, confidence) of every predicted entity; the confidence
    is the score the component stores on its span group, None for spaCy's ner."""
    out = []
    for doc in nlp.pipe(docs, batch_size=64):
        scores = {}
        for key, group in doc.spans.items():
            if "scores" in group.attrs:
                scores = {(s.start, s.end, s.label_): float(c) for s, c in zip(group, group.attrs["scores"])}
        out.append([(e.start, e.end, e.label_, scores.get((e.start, e.end, e.label_)))
                    for e in doc.ents])
    return out


def agree(models: List[str], test: Path, limit: int, devices=("cpu", "gpu")) -> Dict[str, Any]:
    """Entities and confidences of each pipeline on two devices (the CPU and GPU 0), same
    weights."""
    import spacy
    from spacy.tokens import Doc, DocBin

    blank = spacy.blank("en")
    gold = list(DocBin().from_disk(test).get_docs(blank.vocab))[:limit]
    words = [([t.text for t in d], [bool(t.whitespace_) for t in d]) for d in gold]
    result = {}
    for spec in models:
        name, path = spec.split("=", 1)
        readings = []
        for device in devices:
            if device == "cpu":
                spacy.require_cpu()
            else:
                spacy.require_gpu(0)
            nlp = spacy.load(path)
            docs = [Doc(nlp.vocab, words=w, spaces=s) for w, s in words]
            readings.append(entity_readings(nlp, docs))
        cpu, gpu = readings
        same_spans = sum([e[:3] for e in a] == [e[:3] for e in b] for a, b in zip(cpu, gpu))
        diffs = [abs(x[3] - y[3]) for a, b in zip(cpu, gpu) if [e[:3] for e in a] == [e[:3] for e in b]
                 for x, y in zip(a, b) if x[3] is not None and y[3] is not None]
        result[name] = {"devices": list(devices), "docs": len(gold),
                        "docs_with_the_same_entities": same_spans,
                        "entities_cpu": sum(map(len, cpu)), "entities_gpu": sum(map(len, gpu)),
                        "max_confidence_difference": max(diffs) if diffs else None}
    spacy.require_cpu()
    return result


def read_json(path: Path) -> Optional[Any]:
    return json.loads(path.read_text()) if path.exists() else None


def pipeline_report(work: Path, name: str, speeds: Dict[str, Any]) -> Dict[str, Any]:
    """Training curve, test accuracy, speed and memory of one pipeline."""
    summary = read_json(work / "training" / name / "train_summary.json") or {}
    score_key = "ENTS_F" if any("ENTS_F" in row for row in summary.get("evals", [])) else "SCORE"
    curve = [{"step": int(row["#"]), "dev_f1": row.get(score_key), "elapsed_s": row["elapsed_s"]}
             for row in summary.get("evals", [])]
    rc_file = work / "training" / name / "returncode"
    out: Dict[str, Any] = {
        # 124: stopped by the run's time limit (model-best is the best evaluation until then)
        "returncode": int(rc_file.read_text()) if rc_file.exists() else None,
        "steps_run": summary.get("steps_run"),
        "best_step": summary.get("best_step"),
        "best_dev_f1": next((row["dev_f1"] for row in curve if row["step"] == summary.get("best_step")), None),
        "wall_time_s": summary.get("wall_time_s"), "dev_f1_curve": curve,
        "train_peak_gpu_mb": (read_json(work / "training" / name / "gpu_memory.json") or {}).get("peak_mb"),
    }
    for batch, res in speeds.items():
        pipe = (res or {}).get("pipelines", {}).get(f"{name}-trf")
        if pipe is None:
            continue
        out["test_f1"] = 100 * pipe["accuracy"]["f"]
        out[f"words_per_s_batch{batch}"] = pipe["speed"]["wps"]
        out[f"predict_peak_gpu_mb_batch{batch}"] = pipe.get("gpu_peak_mb")
        encoder = res["speed"].get("ner-trf:transformer alone")
        ner = res["speed"].get("ner-trf")
        out[f"vs_ner_batch{batch}"] = pipe["speed"]["wps"] / ner["wps"] if ner else None
        out[f"vs_transformer_alone_batch{batch}"] = pipe["speed"]["wps"] / encoder["wps"] if encoder else None
    return out


def flattened(curve: List[Dict[str, Any]]) -> Optional[float]:
    """Dev F1 gained over the last third of the evaluations (small: the curve has flattened)."""
    scores = [row["dev_f1"] for row in curve if row["dev_f1"] is not None]
    if len(scores) < 3:
        return None
    tail = scores[-max(2, len(scores) // 3):]
    return max(tail) - tail[0]


def report(work: Path, output: Path) -> Dict[str, Any]:
    status = read_json(work / "status.json") or {}
    # batch sizes as strings, as the JSON file gives them back: the table renders the same
    # from the data and from gpu_check.json
    speeds = {str(batch): read_json(work / f"speed_b{batch}.json") for batch in (64, 512)}
    pipelines = {name: pipeline_report(work, name, speeds) for name in PIPELINES}
    for rep in pipelines.values():
        rep["dev_f1_gain_last_third"] = flattened(rep["dev_f1_curve"])
    machine = next((res["machine"] for res in speeds.values() if res), {})
    encoder = {batch: (res or {}).get("speed", {}).get("ner-trf:transformer alone", {}).get("wps")
               for batch, res in speeds.items()}
    data = {"machine": machine, "settings": status.get("settings", {}), "stages": status.get("stages", {}),
            "cuda_tests": (work / "cuda_tests.txt").read_text().strip().splitlines()[-1:]
            if (work / "cuda_tests.txt").exists() else None,
            "pipelines": pipelines, "transformer_alone_words_per_s": encoder,
            "cpu_gpu_agreement": read_json(work / "agree.json"),
            "structured_cuda": read_json(work / "structured_cuda.json")}
    output.mkdir(parents=True, exist_ok=True)
    (output / "gpu_check.json").write_text(json.dumps(data, indent=1) + "\n")
    (output / "gpu_check.md").write_text(markdown(data))
    return data


def fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else format(value, spec) + suffix


def markdown(data: Dict[str, Any]) -> str:
    m, s = data["machine"], data["settings"]
    lines = ["# GPU check: MiniLM pipelines trained and timed on the GPU", "",
             f"GPU: {m.get('gpu', 'none')}; torch {m.get('torch', '?')}, spaCy {m.get('spacy', '?')}; "
             f"{s.get('steps', '?')} steps at most, dev every {s.get('eval_frequency', '?')}, "
             f"training stopped after {s.get('train_seconds', '?')} s at most; mixed precision "
             f"{'on' if s.get('mixed_precision') else 'off'}{'; DRY RUN on the CPU' if s.get('dry_run') else ''}.",
             "", "Stages: " + ", ".join(f"{k} {v}" for k, v in data["stages"].items()) + ".",
             f"CUDA tests: {' '.join(data['cuda_tests'] or ['not run'])}.", "",
             "| pipeline | steps | best step | best dev F1 | dev F1 gain, last third | test F1 "
             "| words/s b64 | vs ner | vs transformer | words/s b512 | vs ner | vs transformer "
             "| peak GPU MB train | predict b64 | predict b512 |",
             "|---|" + "---:|" * 14]
    for name, r in data["pipelines"].items():
        lines.append(
            f"| {name} | {fmt(r['steps_run'], 'd')} | {fmt(r['best_step'], 'd')} | {fmt(r['best_dev_f1'])} "
            f"| {fmt(r['dev_f1_gain_last_third'], '+.2f')} | {fmt(r.get('test_f1'))} "
            f"| {fmt(r.get('words_per_s_batch64'), '.0f')} | {fmt(r.get('vs_ner_batch64'), '.2f', 'x')} "
            f"| {fmt(r.get('vs_transformer_alone_batch64'), '.2f', 'x')} "
            f"| {fmt(r.get('words_per_s_batch512'), '.0f')} | {fmt(r.get('vs_ner_batch512'), '.2f', 'x')} "
            f"| {fmt(r.get('vs_transformer_alone_batch512'), '.2f', 'x')} "
            f"| {fmt(r['train_peak_gpu_mb'], '.0f')} | {fmt(r.get('predict_peak_gpu_mb_batch64'), '.0f')} "
            f"| {fmt(r.get('predict_peak_gpu_mb_batch512'), '.0f')} |")
    enc = data["transformer_alone_words_per_s"]
    lines += ["", f"Transformer alone: {fmt(enc.get('64'), '.0f')} words/s at batch 64, "
              f"{fmt(enc.get('512'), '.0f')} at batch 512.", "", "Dev F1 by step:", ""]
    for name, r in data["pipelines"].items():
        lines.append(f"* {name}: " + ", ".join(f"{row['step']}: {fmt(row['dev_f1'])}" for row in r["dev_f1_curve"]))
    if data["cpu_gpu_agreement"]:
        lines += ["", "| same weights on two devices | docs | docs with the same entities | entities CPU | GPU "
                  "| max confidence difference |", "|---|---:|---:|---:|---:|---:|"]  # CPU first
        for name, a in data["cpu_gpu_agreement"].items():
            lines.append(f"| {name}, {' and '.join(a['devices'])} | {a['docs']} | {a['docs_with_the_same_entities']} | {a['entities_cpu']} "
                         f"| {a['entities_gpu']} | {fmt(a['max_confidence_difference'], '.2e')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("agree", help="CPU and GPU predictions of the same weights")
    a.add_argument("--models", nargs="+", required=True, help="NAME=PATH")
    a.add_argument("--test", type=Path, required=True)
    a.add_argument("--limit", type=count, default=100, help="test documents compared")
    a.add_argument("--devices", nargs=2, default=["cpu", "gpu"], choices=["cpu", "gpu"])
    a.add_argument("--output", type=Path, required=True)
    r = sub.add_parser("report", help="gpu_check.{json,md} from the work folder")
    r.add_argument("--work", type=Path, required=True)
    r.add_argument("--output", type=Path, required=True)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    if args.command == "agree":
        named_pipelines(a, "--models", args.models)
        check_file(a, "--test", args.test)
        res = agree(args.models, args.test, args.limit, args.devices)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(res, indent=1) + "\n")
        print(json.dumps(res), f"({time.perf_counter() - t0:.0f} s)")
    else:
        print(markdown(report(args.work, args.output)))


if __name__ == "__main__":
    main()
