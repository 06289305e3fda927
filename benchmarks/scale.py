"""Documents per second of four ways to annotate a corpus, side by side on one machine.

    python benchmarks/scale.py MODEL [--test corpus/test.spacy] [--output benchmarks/results/scale]
                               [--copies N]

The CoNLL-2003 test set (``scripts/prepare_conll.py``: documents of 10 sentences) is annotated,
as plain texts, by:

* ``nlp.pipe``: one process, PyTorch's default thread count (and, for reference, one thread);
* ``nlp.pipe(n_process=2)``: in the same process, after it has predicted (the way users hit the
  fork hang that ``spacy_fsemicrf.fork_safety`` fixes); and the same with spaCy's
  ``doc_cleaner`` last, dropping ``doc.tensor``: spaCy sends every document back from its worker
  processes as ``Doc.to_bytes()``, the tok2vec's vectors included, for the parent to decode;
* ``annotate`` on a Dask LocalCluster of 1 and of 2 worker processes (one thread each), warm:
  the cluster started and the pipeline loaded on every worker before the clock starts; the
  cold run (starting the cluster and loading the pipeline) is timed once apart.

The ways run in phases: first those without a cluster, then each cluster with ``nlp.pipe``
beside it (an idle cluster's event loops and heartbeats take CPU time from whatever else runs).
Within a phase every way runs ``--repeats`` times, interleaved, the median is reported, and the
speedups are against that phase's own ``nlp.pipe``; every way must produce the entities of
``nlp.pipe``. Each run's CPU time, this process's and its worker processes' together, says
how much work a parallel way adds to what one process does. Writes OUTPUT.json and OUTPUT.md.
"""
import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import dask
import spacy
import srsly
import torch
from spacy.tokens import DocBin

from spacy_fsemicrf.annotate import read_entities
from spacy_fsemicrf.annotate.engine import annotate, connect, load_pipeline

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from arguments import check_file, check_pipeline, count  # noqa: E402


def common_arguments(description: str, output: str, repeats: int) -> argparse.ArgumentParser:
    """The arguments of this benchmark and of those built on it (``worker_heap.py``)."""
    parser = argparse.ArgumentParser(description=description.split("\n\n")[0])
    parser.add_argument("model", help="a trained pipeline directory")
    parser.add_argument("--test", type=Path, default=Path("corpus/test.spacy"))
    parser.add_argument("--output", type=Path, default=Path(output))
    parser.add_argument("--batch-size", type=count, default=16, help="documents per nlp.pipe batch")
    parser.add_argument("--shard-size", type=count, default=32, help="documents per Dask task")
    parser.add_argument("--repeats", type=count, default=repeats)
    return parser


def checked(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """The arguments, with argparse's error for a missing pipeline or test file (before the
    pipeline loads, the clusters start and the files are read)."""
    args = parser.parse_args(argv)
    check_pipeline(parser, "model", args.model)
    check_file(parser, "--test", args.test)
    return args


def parse_args() -> argparse.Namespace:
    parser = common_arguments(__doc__, "benchmarks/results/scale", repeats=3)
    parser.add_argument("--model-label", default=None,
                        help="what the model is, for the report (default: its path)")
    parser.add_argument("--copies", type=count, default=1,
                        help="annotate the corpus this many times over in each run: the fixed "
                             "costs of a run (starting worker processes, the last batch) weigh less")
    return checked(parser)


def entity_tuples(docs) -> List[tuple]:
    return [tuple((e.start_char, e.end_char, e.label_) for e in doc.ents) for doc in docs]


def output_tuples(out: Path, n_docs: int) -> List[tuple]:
    per_doc: Dict[int, list] = {i: [] for i in range(n_docs)}
    for r in read_entities(out):
        per_doc[int(r["id"])].append((r["start"], r["end"], r["label"]))
    return [tuple(per_doc[i]) for i in range(n_docs)]


def load_average() -> List[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    """User and system CPU seconds of this process (``RUSAGE_SELF``: all its threads, a
    LocalCluster's scheduler among them) or of its child processes that have ended and been
    waited for (``RUSAGE_CHILDREN``: ``nlp.pipe(n_process=N)``'s workers, once it returns)."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


class Dask:
    """A warm LocalCluster of ``n`` workers that annotates the corpus into fresh directories."""

    def __init__(self, n: int, model: str, corpus: Path, n_docs: int, scratch: Path, args,
                 name: str = "", on_workers: Optional[Callable[[], None]] = None) -> None:
        self.n, self.model, self.corpus, self.n_docs = n, model, corpus, n_docs
        self.scratch, self.args = scratch, args
        self.name = name or f"dask{n}"  # its output directories' prefix
        self.runs = 0
        # each run's seconds (annotating and reading the entities back) and its workers' CPU
        self.seconds: List[float] = []
        self.cpu: List[float] = []
        start = time.perf_counter()
        self.client, self.cluster = connect(None, n)  # as annotate makes its LocalCluster
        if on_workers is not None:  # run on every worker before it loads the pipeline
            self.client.run(on_workers)
        self.client.run(load_pipeline, model)
        self.startup_s = time.perf_counter() - start

    def __call__(self) -> List[tuple]:
        self.runs += 1
        out = self.scratch / f"{self.name}-{self.runs}"
        before = self.client.run(cpu_seconds)  # outside the timed part: a round trip each
        start = time.perf_counter()
        annotate(self.model, self.corpus, out, client=self.client, progress=False,
                 batch_size=self.args.batch_size, shard_size=self.args.shard_size)
        got = output_tuples(out, self.n_docs)
        self.seconds.append(time.perf_counter() - start)
        after = self.client.run(cpu_seconds)
        self.cpu.append(sum(after[w] - before[w] for w in after))
        return got

    def close(self) -> None:
        self.client.close()
        self.cluster.close()


def one_thread(run: Callable[[], List[tuple]]) -> List[tuple]:
    """``run()`` with PyTorch on one thread in this process."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run()
    finally:
        torch.set_num_threads(threads)


def cold_dask(n: int, model: str, corpus: Path, out: Path, args) -> float:
    """Seconds of one ``annotate`` that starts its own cluster and loads the pipeline."""
    start = time.perf_counter()
    annotate(model, corpus, out, workers=n, progress=False, batch_size=args.batch_size,
             shard_size=args.shard_size)
    return time.perf_counter() - start


Timings = Tuple[Dict[str, List[float]], Dict[str, bool], Dict[str, List[float]]]


def time_interleaved(ways: Dict[str, Callable[[], List[tuple]]], repeats: int,
                     reference: List[tuple]) -> Timings:
    """Run every way ``repeats`` times, interleaved: the seconds of each run (a way that times
    itself, e.g. in a fresh process without its start, gives them as ``.seconds[-1]``), whether
    every run gave the ``reference`` entities, and the CPU seconds of each run: this process's
    and its ended child processes', plus ``.cpu[-1]`` of a way whose workers are not children
    that end (a Dask cluster's)."""
    seconds: Dict[str, List[float]] = {name: [] for name in ways}
    same: Dict[str, bool] = {name: True for name in ways}
    cpu: Dict[str, List[float]] = {name: [] for name in ways}
    for _ in range(repeats):
        for name, run in ways.items():
            cpu_before = cpu_seconds() + cpu_seconds(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            got = run()
            elapsed = time.perf_counter() - start
            used = cpu_seconds() + cpu_seconds(resource.RUSAGE_CHILDREN) - cpu_before
            own = getattr(run, "seconds", None)
            seconds[name].append(own[-1] if isinstance(own, list) else elapsed)
            workers = getattr(run, "cpu", None)
            cpu[name].append(used + (workers[-1] if isinstance(workers, list) else 0.0))
            same[name] &= got == reference
    return seconds, same, cpu


def phase_rows(phase: str, ways: Dict[str, Callable[[], List[tuple]]], repeats: int,
               reference: List[tuple], n_docs: int, n_words: int) -> List[Dict]:
    """Time ``ways`` ``repeats`` times, interleaved; the first way is the phase's reference
    (``speedup``), and ``nlp.pipe, 1 thread``, where the phase has it, the second one."""
    seconds, same, cpu = time_interleaved(ways, repeats, reference)
    base = statistics.median(next(iter(seconds.values())))
    one = seconds.get("nlp.pipe, 1 thread")
    rows = []
    for name, values in seconds.items():
        median = statistics.median(values)
        rows.append({
            "way": name,
            "phase": phase,
            "seconds": [round(v, 3) for v in values],
            "median_s": round(median, 3),
            "docs_per_s": round(n_docs / median, 1),
            "words_per_s": round(n_words / median),
            "speedup": round(base / median, 2),
            "speedup_vs_one_thread": round(statistics.median(one) / median, 2) if one else None,
            "cpu_s": round(statistics.median(cpu[name]), 3),
            "same_entities_as_nlp_pipe": same[name],
            "warm_start_s": None,
        })
    return rows


def main() -> None:
    args = parse_args()
    model = str(Path(args.model).resolve())
    nlp = spacy.load(model)
    texts = [doc.text for doc in DocBin().from_disk(args.test).get_docs(nlp.vocab)] * args.copies
    n_words = sum(len(doc) for doc in nlp.tokenizer.pipe(texts))
    load_before = load_average()
    reference = entity_tuples(nlp.pipe(texts, batch_size=args.batch_size))  # also the warm-up
    cleaned = spacy.load(model)
    cleaned.add_pipe("doc_cleaner", config={"attrs": {"tensor": None}})
    entity_tuples(cleaned.pipe(texts, batch_size=args.batch_size))

    pipe = lambda: entity_tuples(nlp.pipe(texts, batch_size=args.batch_size))  # noqa: E731
    rows: List[Dict] = []
    startup: Dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        corpus = scratch / "test.jsonl"
        srsly.write_jsonl(corpus, [{"id": i, "text": t} for i, t in enumerate(texts)])
        # One phase per set of processes: an idle cluster takes CPU time (its event loops and
        # heartbeats) from whatever runs beside it, so each cluster is up only in its own
        # phase, and each phase times its own nlp.pipe runs, interleaved, as its reference.
        alone = {
            "nlp.pipe": pipe,
            "nlp.pipe, 1 thread": lambda: one_thread(pipe),
            "nlp.pipe(n_process=2)": lambda: entity_tuples(
                nlp.pipe(texts, batch_size=args.batch_size, n_process=2)),
            "nlp.pipe(n_process=2), doc_cleaner": lambda: entity_tuples(
                cleaned.pipe(texts, batch_size=args.batch_size, n_process=2)),
        }
        rows += phase_rows("alone", alone, args.repeats, reference, len(texts), n_words)
        for n in (1, 2):
            cluster = Dask(n, model, corpus, len(texts), scratch, args)
            startup[n] = cluster.startup_s
            try:
                ways = {f"nlp.pipe, beside the idle {n}-worker cluster": pipe,
                        f"Dask, {n} worker{'s' if n > 1 else ''}": cluster}
                rows += phase_rows(f"{n}-worker cluster", ways, args.repeats, reference,
                                   len(texts), n_words)
            finally:
                cluster.close()
            rows[-1]["warm_start_s"] = round(startup[n], 1)
        cold = {n: cold_dask(n, model, corpus, scratch / f"cold{n}", args) for n in (1, 2)}

    meta = srsly.read_json(Path(model) / "meta.json")
    result = {
        "corpus": {"file": str(args.test), "docs": len(texts), "words": n_words,
                   "copies": args.copies},
        "model": {"path": args.model, "label": args.model_label or f"`{args.model}`",
                  "pipeline": meta.get("pipeline"),
                  "ents_f": (meta.get("performance") or {}).get("ents_f")},
        "batch_size": args.batch_size,
        "shard_size": args.shard_size,
        "repeats": args.repeats,
        "rows": rows,
        "cold_dask_s": {str(n): round(s, 1) for n, s in cold.items()},
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "load_average_before": load_before, "load_average_after": load_average(),
                    "python": platform.python_version(), "torch": torch.__version__,
                    "spacy": spacy.__version__, "dask": dask.__version__},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.output.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


def markdown(result: Dict) -> str:
    c, m, mach = result["corpus"], result["model"], result["machine"]
    lines = [
        "# Annotation throughput: nlp.pipe, n_process=2 and Dask, side by side",
        "",
        f"Written by `benchmarks/scale.py`. Corpus: `{c['file']}` (CoNLL-2003 test"
        + (f", {c['copies']} times over" if c.get("copies", 1) > 1 else "")
        + f", {c['docs']} documents of 10 sentences, {c['words']} words), annotated as plain texts. "
        f"Model: {m['label']} (pipeline {', '.join(m['pipeline'] or [])}; dev ents_f "
        f"{m['ents_f']}). Batches of {result['batch_size']} documents; Dask tasks of "
        f"{result['shard_size']} documents. Median of {result['repeats']} interleaved runs per "
        "phase: the ways without a cluster, then each Dask cluster with its own `nlp.pipe` "
        "runs beside it.",
        "",
        f"Machine: {mach['cpus']} CPUs; PyTorch {mach['torch']} with {mach['torch_threads']} "
        f"threads in the single process (one per worker process otherwise); load average "
        f"{mach['load_average_before']} before and {mach['load_average_after']} after (1, 5, "
        f"15 min).",
        "",
        "| phase | way | runs (s) | median s | docs/s | words/s | speedup | vs 1 thread "
        "| CPU s | same entities | warm start s |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for r in result["rows"]:
        start = "" if r["warm_start_s"] is None else r["warm_start_s"]
        runs = ", ".join(f"{s:.2f}" for s in r["seconds"])
        one = "" if r.get("speedup_vs_one_thread") is None else f"{r['speedup_vs_one_thread']}x"
        lines.append(f"| {r.get('phase', '')} | {r['way']} | {runs} | {r['median_s']} | "
                     f"{r['docs_per_s']} | {r['words_per_s']} | {r['speedup']}x | {one} | "
                     f"{r.get('cpu_s', '')} | "
                     f"{'yes' if r['same_entities_as_nlp_pipe'] else 'NO'} | {start} |")
    cold = result["cold_dask_s"]
    lines += [
        "",
        "Speedup: against the first row of the same phase, `nlp.pipe` in one process with "
        "PyTorch's default threads; vs 1 thread: against the same with one thread. CPU s: "
        "median CPU time of a run, user and system, this process (with a LocalCluster's "
        "scheduler) and its worker processes together. Warm start: starting the LocalCluster and "
        "loading the pipeline on its workers, before the timed runs. A cold `annotate` (the "
        f"command as a user runs it: cluster start, pipeline load, annotation) took "
        f"{cold['1']} s with 1 worker and {cold['2']} s with 2.",
        "",
    ]
    if max(mach["load_average_before"][:2]) > mach["cpus"] - 0.5:
        lines += [
            "Other work was running on the machine (load average near or above its "
            f"{mach['cpus']} CPUs): every figure includes that contention. The multi-threaded "
            "single process suffers most (its OpenMP threads wait for each other), and no way "
            "gets more than its share of the CPUs, so the speedups of the parallel ways are "
            "not what an idle machine gives.",
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
