"""Evaluate every trained pipeline on the CoNLL-2003 test set and time them side by side.

    python scripts/benchmark.py                         # all of training/<name>/model-best found
    python scripts/benchmark.py --models fsemicrf ner spancat --repeats 5
    python scripts/benchmark.py --models ner=training/ner/model-best --no-speed

Input: by default the pipelines get the gold tokens of the test corpus (Doc objects built from
its words), as spaCy's own Corpus reader does for these converted CoNLL docs (their whitespace is
unknown) in training and in `spacy evaluate`; tokenization is then not part of the timing.
--raw-text feeds the texts to each pipeline's tokenizer instead.

Accuracy: exact-match entity P/R/F1 (overall and per type) computed the same way for every
pipeline, on character offsets against the gold entities of the test corpus. Predicted spans are
`doc.ents`, or `doc.spans[key]` for spaCy's `spancat` (which may overlap).

Speed: every pipeline processes the same test documents with `nlp.pipe` (same batch size, 1 thread
unless --threads), the pipelines interleaved within each repeat (the order rotates between
repeats) after one warm-up pass; words/second is the median over the repeats. For the pipelines
named in --encoder-only, the encoder alone (`tok2vec` / `transformer` component) is timed too,
which bounds what any head on that encoder can reach.

Writes OUTPUT/results.json, OUTPUT/results.md and OUTPUT/results.png (OUTPUT defaults to
benchmarks/results). Training summaries written by scripts/train.py (OUTPUT/train/<name>.json or
training/<name>/train_summary.json) are merged in: time to the best dev score, its step, dev F1.
"""
from __future__ import annotations

import os
import sys

# thread limits must be set before numpy / torch are imported
_threads = "1"
for _i, _a in enumerate(sys.argv):
    if _a == "--threads" and _i + 1 < len(sys.argv):
        _threads = sys.argv[_i + 1]
for _k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_k] = _threads
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import spacy  # noqa: E402
from spacy.tokens import Doc, DocBin  # noqa: E402

from arguments import count  # noqa: E402

DEFAULT_MODELS = ["fsemicrf", "semicrf", "crf", "ner", "spancat",
                  "fsemicrf-trf", "semicrf-trf", "crf-trf", "ner-trf"]
SPAN_FACTORIES = {"spancat", "spancat_singlelabel"}
ENCODER_COMPONENTS = ("tok2vec", "transformer")


def set_threads(n: int) -> None:
    try:
        import torch

        torch.set_num_threads(n)
        torch.set_num_interop_threads(n)
    except (ImportError, RuntimeError):
        pass


def parse_models(specs, training_dir: Path):
    """['ner', 'x=path'] -> [(name, path)], skipping (and reporting) the ones not trained."""
    found, missing = [], []
    for spec in specs:
        name, _, path = spec.partition("=")
        path = Path(path) if path else training_dir / name / "model-best"
        (found if (path / "meta.json").exists() else missing).append((name, path))
    return found, missing


def load_docs(path: Path, limit: int | None):
    nlp = spacy.blank("en")
    docs = list(DocBin().from_disk(path).get_docs(nlp.vocab))
    return docs[:limit] if limit else docs


def predicted_spans(nlp, doc):
    for name, proc in nlp.pipeline:
        factory = nlp.get_pipe_meta(name).factory
        if factory in SPAN_FACTORIES:
            key = getattr(proc, "key", "sc")
            return list(doc.spans[key]) if key in doc.spans else []
    return list(doc.ents)


def prf(tp, n_pred, n_gold):
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_gold if n_gold else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"p": p, "r": r, "f": f, "tp": tp, "n_pred": n_pred, "n_gold": n_gold}


def score(gold_docs, pred_docs, pred_getter):
    tp, npred, ngold = Counter(), Counter(), Counter()
    for g, p in zip(gold_docs, pred_docs):
        assert g.text == p.text
        gold = {(e.start_char, e.end_char, e.label_) for e in g.ents}
        pred = {(s.start_char, s.end_char, s.label_) for s in pred_getter(p)}
        for s in gold:
            ngold[s[2]] += 1
        for s in pred:
            npred[s[2]] += 1
            if s in gold:
                tp[s[2]] += 1
    labels = sorted(set(ngold) | set(npred))
    out = prf(sum(tp.values()), sum(npred.values()), sum(ngold.values()))
    out["per_type"] = {lab: prf(tp[lab], npred[lab], ngold[lab]) for lab in labels}
    return out


def train_summary(name, model_path: Path, out_dir: Path, training_dir: Path):
    """The training summary of a pipeline: the one next to its model directory (written by
    scripts/train.py), else OUT_DIR/train/NAME.json, else TRAINING_DIR/NAME/train_summary.json."""
    candidates = (Path(model_path).parent / "train_summary.json", out_dir / "train" / f"{name}.json",
                  training_dir / name / "train_summary.json")
    for path in candidates:
        if path.exists():
            s = json.loads(path.read_text())
            perf = s.get("dev_performance_model_best", {})
            dev_f = perf.get("ents_f")
            if dev_f is None:
                dev_f = next((v for k, v in perf.items() if k.endswith("_f") and isinstance(v, float)), None)
            return {
                "dev_f": dev_f,
                "best_step": s.get("best_step"),
                "steps_run": s.get("steps_run"),
                "time_to_best_s": s.get("time_to_best_s"),
                "wall_time_s": s.get("wall_time_s"),
                "command": s.get("command"),
                "source": str(path),
            }
    return None


def make_inputs(nlp, gold_docs, raw_text: bool):
    """Fresh inputs for one pass: texts, or unannotated Docs with the gold tokens (spaCy's
    Corpus reader does the same for docs whose whitespace is unknown, as here)."""
    if raw_text:
        return [d.text for d in gold_docs]
    return [Doc(nlp.vocab, words=[t.text for t in d], spaces=[bool(t.whitespace_) for t in d])
            for d in gold_docs]


def time_pipe(nlp, inputs, batch_size, enable=None):
    if enable is not None:
        with nlp.select_pipes(enable=enable):
            t0 = time.perf_counter()
            for _ in nlp.pipe(inputs, batch_size=batch_size):
                pass
            return time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in nlp.pipe(inputs, batch_size=batch_size):
        pass
    return time.perf_counter() - t0


def reset_gpu_peak(gpu_id: int) -> int:
    """Start a peak-memory measurement: the PyTorch GPU memory allocated now (0 on the CPU)."""
    if gpu_id < 0:
        return 0
    import torch

    torch.cuda.synchronize(gpu_id)
    torch.cuda.reset_peak_memory_stats(gpu_id)
    return torch.cuda.memory_allocated(gpu_id)


def gpu_peak_mb(gpu_id: int, start: int):
    """Peak PyTorch GPU memory (MB) above ``start`` since the reset; None on the CPU."""
    if gpu_id < 0:
        return None
    import torch

    return round((torch.cuda.max_memory_allocated(gpu_id) - start) / 2**20, 1)


def machine_info(threads, batch_size, repeats, gpu_id):
    info = {"python": platform.python_version(), "spacy": spacy.__version__,
            "platform": platform.platform(), "threads": threads, "batch_size": batch_size,
            "repeats": repeats, "gpu_id": gpu_id}
    try:
        import torch

        info["torch"] = torch.__version__
        if gpu_id >= 0 and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(gpu_id)
    except ImportError:
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        info["cpu_count"] = os.cpu_count()
    except OSError:
        pass
    return info


def fmt(x, spec=".2f", scale=1.0):
    return "–" if x is None else format(x * scale, spec)


def secs(x):
    if x is None:
        return "–"
    return f"{x:.0f} s" if x < 120 else f"{x / 60:.1f} min"


def write_markdown(res, path: Path):
    m = res["machine"]
    lines = [
        "# Accuracy and speed side by side",
        "",
        f"Test corpus: `{res['test']['path']}`: {res['test']['docs']} docs, "
        f"{res['test']['words']} words, {res['test']['entities']} entities; input: "
        f"{res['test']['input']}.",
        f"Machine: {m.get('cpu', '?')}, {m['threads']} thread(s)"
        + (f", GPU {m['gpu']}" if m.get("gpu") else "")
        + f"; spaCy {m['spacy']}, torch {m.get('torch', '–')}; batch size {m['batch_size']}, "
        f"{m['repeats']} interleaved repeats.",
        "",
        "## Accuracy (exact-match entities) and training",
        "",
        "| pipeline | test P | test R | test F1 | dev F1 (model-best) | best step / steps | time to best dev | train wall time |"
        + (" peak GPU memory (weights + prediction) |" if m.get("gpu") else ""),
        "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if m.get("gpu") else ""),
    ]
    for name, r in res["pipelines"].items():
        a, t = r["accuracy"], r.get("training") or {}
        steps = f"{t.get('best_step', '–')} / {t.get('steps_run', '–')}" if t else "–"
        lines.append(
            f"| {name} | {fmt(a['p'], scale=100)} | {fmt(a['r'], scale=100)} | **{fmt(a['f'], scale=100)}** "
            f"| {fmt(t.get('dev_f'), scale=100)} | {steps} | {secs(t.get('time_to_best_s'))} "
            f"| {secs(t.get('wall_time_s'))} |"
            + (f" {fmt(r.get('gpu_peak_mb'), '.0f')} MB |" if m.get("gpu") else ""))
    labels = sorted({lab for r in res["pipelines"].values() for lab in r["accuracy"]["per_type"]})
    lines += ["", "## Test F1 per entity type", "",
              "| pipeline | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for name, r in res["pipelines"].items():
        pt = r["accuracy"]["per_type"]
        lines.append(f"| {name} | " + " | ".join(fmt(pt[lab]["f"] if lab in pt else None, scale=100)
                                                 for lab in labels) + " |")
    if res.get("speed"):
        ref = res["speed_reference"]
        lines += ["", "## Inference speed (test set, side by side)", "",
                  f"| pipeline | words/s (median) | min – max | docs/s | relative to `{ref}` |",
                  "|---|---:|---:|---:|---:|"]
        for name, s in res["speed"].items():
            lines.append(f"| {name} | {s['wps']:.0f} | {s['wps_min']:.0f} – {s['wps_max']:.0f} "
                         f"| {s['dps']:.1f} | {fmt(s.get('relative'))} |")
    if res.get("missing"):
        lines += ["", "Not trained (skipped): " + ", ".join(f"`{n}`" for n in res["missing"]) + "."]
    path.write_text("\n".join(lines) + "\n")


def plot(res, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res["pipelines"])
    speed = res.get("speed") or {}
    ncols = 2 if speed else 1
    fig, axes = plt.subplots(1, ncols, figsize=(6 * ncols, 4))
    axes = axes if ncols > 1 else [axes]
    f1 = [100 * res["pipelines"][n]["accuracy"]["f"] for n in names]
    axes[0].barh(names, f1, color="tab:blue")
    for i, v in enumerate(f1):
        axes[0].text(v, i, f" {v:.1f}", va="center")
    axes[0].set_xlabel("test F1 (CoNLL-2003)")
    axes[0].set_xlim(0, 100)
    axes[0].invert_yaxis()
    if speed:
        sn = list(speed)
        wps = [speed[n]["wps"] for n in sn]
        colors = ["tab:gray" if ":" in n else "tab:orange" for n in sn]
        axes[1].barh(sn, wps, color=colors)
        for i, v in enumerate(wps):
            axes[1].text(v, i, f" {v:.0f}", va="center")
        axes[1].set_xlabel(f"words / second ({res['machine']['threads']} thread(s), "
                           f"batch {res['machine']['batch_size']})")
        axes[1].set_xlim(0, max(wps) * 1.25)
        axes[1].invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=DEFAULT_MODELS,
                   help="NAME (training/NAME/model-best) or NAME=PATH; untrained ones are skipped")
    p.add_argument("--training-dir", type=Path, default=Path("training"))
    p.add_argument("--test", type=Path, default=Path("corpus/test.spacy"))
    p.add_argument("--limit", type=count, default=None, help="only the first N test docs")
    p.add_argument("--output", type=Path, default=Path("benchmarks/results"))
    p.add_argument("--prefix", default="results", help="output file stem")
    p.add_argument("--batch-size", type=count, default=64)
    p.add_argument("--repeats", type=count, default=3)
    p.add_argument("--threads", type=count, default=1)
    p.add_argument("--gpu-id", type=int, default=-1)
    p.add_argument("--no-speed", action="store_true", help="accuracy only")
    p.add_argument("--encoder-only", nargs="*", default=["ner", "ner-trf"],
                   help="pipelines whose encoder component is also timed alone")
    p.add_argument("--reference", default="ner", help="speed reference for the relative column")
    p.add_argument("--raw-text", action="store_true",
                   help="feed raw texts (each pipeline's tokenizer) instead of the gold tokens")
    p.add_argument("--if-trained", action="store_true",
                   help="when none of the pipelines is trained, write nothing and succeed")
    args = p.parse_args(argv)

    set_threads(args.threads)
    if args.gpu_id >= 0:
        from thinc.api import set_gpu_allocator

        set_gpu_allocator("pytorch")  # one memory pool, so the peak memory counts all of it
        spacy.require_gpu(args.gpu_id)
    models, missing = parse_models(args.models, args.training_dir)
    for name, path in missing:
        print(f"[benchmark] skipping {name}: {path} not found", flush=True)
    if not models:
        if args.if_trained:
            print("[benchmark] none of the pipelines is trained: nothing to do", flush=True)
            return
        sys.exit("no trained pipeline found")
    if not args.test.is_file():
        p.error(f"no such test file: {args.test}")
    gold = load_docs(args.test, args.limit)
    n_words = sum(len(d) for d in gold)
    res = {
        "machine": machine_info(args.threads, args.batch_size, args.repeats, args.gpu_id),
        "test": {"path": str(args.test), "docs": len(gold), "words": n_words,
                 "entities": sum(len(d.ents) for d in gold),
                 "input": "raw text" if args.raw_text else "gold tokens"},
        "pipelines": {},
        "missing": [n for n, _ in missing],
    }
    nlps = {}
    for name, path in models:
        gpu_start = reset_gpu_peak(args.gpu_id)  # the pipeline's weights count too
        t0 = time.perf_counter()
        nlp = spacy.load(path)
        load_s = time.perf_counter() - t0
        nlps[name] = nlp
        t0 = time.perf_counter()  # this pass doubles as the warm-up for the timing below
        preds = list(nlp.pipe(make_inputs(nlp, gold, args.raw_text), batch_size=args.batch_size))
        first_pass = time.perf_counter() - t0
        acc = score(gold, preds, lambda d, nlp=nlp: predicted_spans(nlp, d))
        res["pipelines"][name] = {
            "path": str(path),
            "components": nlp.pipe_names,
            "accuracy": acc,
            "training": train_summary(name, path, args.output, args.training_dir),
            "load_s": round(load_s, 2),
            "first_pass_s": round(first_pass, 2),
            "gpu_peak_mb": gpu_peak_mb(args.gpu_id, gpu_start),
        }
        print(f"[benchmark] {name:14s} test P {100 * acc['p']:.2f} R {100 * acc['r']:.2f} "
              f"F1 {100 * acc['f']:.2f}  ({first_pass:.1f}s)", flush=True)

    if not args.no_speed:
        runs = []  # (label, nlp, enable)
        for name, nlp in nlps.items():
            runs.append((name, nlp, None))
            if name in args.encoder_only:
                enc = [c for c in ENCODER_COMPONENTS if c in nlp.pipe_names]
                if enc:
                    runs.append((f"{name}:{enc[0]} alone", nlp, enc[0]))
        for label, nlp, enable in runs:  # warm up the encoder-only configurations too
            if enable is not None:
                warm = make_inputs(nlp, gold[: max(1, len(gold) // 4)], args.raw_text)
                time_pipe(nlp, warm, args.batch_size, enable)
        times = {label: [] for label, _, _ in runs}
        for rep in range(args.repeats):
            k = rep % len(runs)
            for label, nlp, enable in runs[k:] + runs[:k]:
                inputs = make_inputs(nlp, gold, args.raw_text)  # built outside the timing
                times[label].append(time_pipe(nlp, inputs, args.batch_size, enable))
            print(f"[benchmark] repeat {rep + 1}/{args.repeats}: " + ", ".join(
                f"{lab} {n_words / times[lab][-1]:.0f} w/s" for lab, _, _ in runs), flush=True)
        speed = {}
        for label, ts in times.items():
            med = statistics.median(ts)
            speed[label] = {"wps": n_words / med, "wps_min": n_words / max(ts),
                            "wps_max": n_words / min(ts), "dps": len(gold) / med,
                            "seconds": [round(t, 3) for t in ts]}
        ref = args.reference if args.reference in speed else next(iter(speed))
        for s in speed.values():
            s["relative"] = s["wps"] / speed[ref]["wps"]
        res["speed"], res["speed_reference"] = speed, ref
        for name in nlps:
            res["pipelines"][name]["speed"] = speed[name]

    args.output.mkdir(parents=True, exist_ok=True)
    stem = args.output / args.prefix
    Path(f"{stem}.json").write_text(json.dumps(res, indent=2) + "\n")
    write_markdown(res, Path(f"{stem}.md"))
    plot(res, Path(f"{stem}.png"))
    print(f"[benchmark] wrote {stem}.json, {stem}.md, {stem}.png", flush=True)


if __name__ == "__main__":
    main()
